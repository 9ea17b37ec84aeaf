//! Model 9: a handle's messages against its shard's shutdown — the sink's lifetime
//! (`src/shard.rs` ground rule "publish last", `src/shard/core.rs` shutdown, entry
//! ground rule 4). Drives the real `ShardCore::shut_down`, the real handle-side
//! `EntryRef::cancel` / `EntryRef::reset` and the real `CancelPort`.
//!
//! Explores: a timer filed in the shard's wheel; one thread cancels it (or moves it
//! earlier) through the shard's port while the shard shuts down (closes its insert
//! ring, detaches its wheel, waits for the messages it knows of, retires).
//! Asserts: the sender's every access to the shard happens-before the shard's
//! retirement (the `Canary` in `src/sync.rs`: a read of the shard after its last
//! message would race with the retirement, which loom reports — on the real service,
//! a use-after-free once the last `ShardedTimer` is dropped); exactly one of "cancel
//! won" and "handed back" holds; nothing leaks (`loom::alloc::Track` in each entry).
//! Seeded bug that makes it fail: in `ShardShared::push_and_wake`, touch the shard
//! after publishing (unpark through its thread slot rather than the handle taken
//! before, as 157dca7 read `next_wake` and unparked after its push): "Causality
//! violation: Concurrent read and write accesses to `UnsafeCell`" (the canary), in
//! both tests.
//! Command: as in `ring.rs`, with `--test sink_lifetime`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, shard, trace};
use sharded_timer::__loom::{next_id, EntryRef, Nanos, Tick};

#[test]
fn cancel_racing_shutdown_touches_nothing_after_its_message() {
    model(|| {
        let (shared, mut core) = shard::new(2);
        let (handle, service) = EntryRef::new(next_id(), Nanos::new(5), || {});
        assert!(shared.push_insert(service, Tick::new(5)).is_ok());
        assert_eq!(shard::turn(&mut core, 0), 0, "filed, not due");
        let won = Arc::new(AtomicBool::new(false));
        let canceller = {
            let (shared, won) = (shared.clone(), won.clone());
            thread::spawn(move || {
                let port = shared.port();
                drop(shared);
                let cancelled = handle.cancel(&port).is_some();
                trace(format!("cancel won: {cancelled}"));
                won.store(cancelled, Ordering::SeqCst);
            })
        };
        let unfired = core.shut_down();
        trace(format!("shut down, {} handed back", unfired.len()));
        canceller.join().unwrap();
        let cancelled = won.load(Ordering::SeqCst);
        assert_eq!(
            usize::from(!cancelled),
            unfired.len(),
            "cancelled, or handed back: exactly one"
        );
    });
}

#[test]
fn an_earlier_reset_racing_shutdown_touches_nothing_after_its_message() {
    model(|| {
        let (shared, mut core) = shard::new(2);
        let (handle, service) = EntryRef::new(next_id(), Nanos::new(5), || {});
        assert!(shared.push_insert(service, Tick::new(5)).is_ok());
        assert_eq!(shard::turn(&mut core, 0), 0, "filed, not due");
        let resetter = {
            let shared = shared.clone();
            thread::spawn(move || {
                let port = shared.port();
                drop(shared);
                let moved = handle.reset(Nanos::new(1), &port);
                trace(format!("reset took effect: {moved}"));
            })
        };
        let unfired = core.shut_down();
        assert_eq!(unfired.len(), 1, "a pending timer is handed back");
        assert_eq!(core.awaiting(), 0, "every awaited message arrived");
        resetter.join().unwrap();
    });
}
