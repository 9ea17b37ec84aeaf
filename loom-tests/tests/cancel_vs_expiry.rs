//! Model 2: cancel racing expiry on a filed, due entry, on the real `ShardCore`
//! (`src/entry/state.rs`: the claim, `try_cancel`; `src/entry/winner.rs`).
//!
//! Explores: a handle cancelling a timer that is in the shard's wheel and due, while
//! the shard expires it (claim, re-read the deadline, fire) and processes messages.
//! Asserts: exactly one of cancel and expiry wins; the callback runs iff cancel lost;
//! a winning cancel drops the callback exactly once, after its message is published
//! (the capture's drop counter is 0 until `cancel` lets go of the callback); no data
//! race on the callback cell (loom checks the `UnsafeCell`); nothing leaks.
//! Seeded bug that makes it fail: `StateWord::try_cancel`'s CAS replaced by a plain
//! store (both sides then believe they won): "assertion `left == right` failed:
//! dropped by the winner" (the shard ran and dropped the callback the canceller
//! thought it owned).
//! Command: as in `ring.rs`, with `--test cancel_vs_expiry`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, shard, trace};
use sharded_timer::__loom::{next_id, EntryRef, Nanos, Tick};

/// Counts drops of a callback's captures.
struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn exactly_one_of_cancel_and_expiry_wins() {
    model(|| {
        let (shared, mut core) = shard::new(2);
        let ran = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let capture = DropCount(dropped.clone());
        let ran_in = ran.clone();
        let (handle, service) = EntryRef::new(next_id(), Nanos::new(0), move || {
            let _capture = &capture;
            ran_in.fetch_add(1, Ordering::SeqCst);
        });
        assert!(shared.push_insert(service, Tick::new(0)).is_ok());
        core.drain_inserts();
        let won = Arc::new(AtomicBool::new(false));
        let canceller = {
            let (shared, won, dropped) = (shared.clone(), won.clone(), dropped.clone());
            thread::spawn(move || {
                if let Some(callback) = handle.cancel(&shared.port()) {
                    trace("cancel won");
                    won.store(true, Ordering::SeqCst);
                    drop(callback);
                    assert_eq!(dropped.load(Ordering::SeqCst), 1, "dropped by the winner");
                }
            })
        };
        let fired = shard::turn(&mut core, 0);
        trace(format!("expiry fired {fired}"));
        canceller.join().unwrap();
        while core.awaiting() > 0 {
            core.drain_messages();
        }
        core.drain_messages();
        let cancelled = won.load(Ordering::SeqCst);
        assert_eq!(fired + usize::from(cancelled), 1, "exactly one wins");
        assert_eq!(ran.load(Ordering::SeqCst), fired);
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "the callback is dropped once"
        );
    });
}
