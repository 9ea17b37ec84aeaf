//! Model 3: a cancel racing the shard's drain of its insert ring and its expiry, on
//! the real `ShardCore` (`src/shard/core.rs`; entry ground rules 1 and 4).
//!
//! Explores: a producer that pushes a timer due at tick 1 into a shard's insert ring
//! and cancels it at once, against the shard taking turns (drain inserts, drain
//! messages, expire) at tick 0 and then tick 1. The cancel may reach the entry before
//! it is filed, while it is filed and still in the wheel (tick 0: not due), or after
//! it came due and was set aside.
//! Asserts: the callback runs iff `cancel` lost; a cancel that wins before filing
//! sends no message and the shard discards the entry; one that wins after filing is
//! processed whether the entry is still in the wheel or aside; the core awaits
//! nothing at the end and its message ring is empty; the entry is freed exactly once
//! (loom's `Track`).
//! Seeded bug that makes it fail: `StateWord::mark_filed`'s `fetch_or` replaced by a
//! load and a store (the shard can then overwrite a won cancel, file the cancelled
//! entry as live and then wait for a message that was never sent): "Model exceeded
//! maximum number of branches".
//! Command: as in `ring.rs`, with `--test cancel_vs_drain`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, shard, trace};
use sharded_timer::__loom::{next_id, EntryRef, Nanos, Tick};

#[test]
fn cancel_before_in_wheel_or_after_expiry_is_honoured_exactly_once() {
    model(|| {
        let (shared, mut core) = shard::new(2);
        let ran = Arc::new(AtomicUsize::new(0));
        let won = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let producer = {
            let (shared, ran, won, done) = (shared.clone(), ran.clone(), won.clone(), done.clone());
            thread::spawn(move || {
                let (handle, service) = EntryRef::new(next_id(), Nanos::new(1), move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                });
                assert!(shared.push_insert(service, Tick::new(1)).is_ok());
                let cancelled = handle.cancel(&shared.port()).is_some();
                trace(format!("cancel returned {cancelled}"));
                won.store(cancelled, Ordering::SeqCst);
                done.store(true, Ordering::SeqCst);
            })
        };
        // Tick 0 (filed, not due), then tick 1, until the producer is done and the
        // core has everything it waits for.
        let mut now = 0;
        loop {
            shard::turn(&mut core, now);
            now = 1;
            if done.load(Ordering::SeqCst) && core.awaiting() == 0 {
                shard::turn(&mut core, now);
                break;
            }
            thread::yield_now();
        }
        producer.join().unwrap();
        let cancelled = won.load(Ordering::SeqCst);
        assert_eq!(
            ran.load(Ordering::SeqCst),
            usize::from(!cancelled),
            "the callback ran iff cancel lost"
        );
        assert_eq!(core.awaiting(), 0, "the core awaits nothing");
        assert!(core.shut_down().is_empty(), "nothing left pending");
    });
}
