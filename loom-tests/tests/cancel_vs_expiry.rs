//! Model 2: cancel racing expiry on one entry (`src/entry.rs`, `src/entry/state.rs`).
//!
//! Explores: a shard thread's `try_fire` (then running the callback) against a handle's
//! `cancel`, on an unfiled and on a filed entry.
//! Asserts: exactly one of them wins; the callback runs iff `cancel` returned
//! `false`; the callback's captures are dropped exactly once; the entry is freed
//! exactly once (a `loom::alloc::Track` in the entry reports a leak; a double free
//! would fail loom's object checks).
//! Seeded bug that makes it fail: `StateWord::try_cancel`'s compare-exchange replaced
//! by a load and a store (both sides then win: the callback runs although `cancel`
//! returned `true`).
//! Command: as in `ring.rs`, with `--test cancel_vs_expiry`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use loom_tests::{model, trace};
use sharded_timer::__loom::{next_id, CancelPort, CancelSink, EntryRef, File, RawEntry};

/// Counts drops of a callback's captures.
struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Collects cancel messages.
#[derive(Default)]
struct Messages(Mutex<Vec<RawEntry>>);

impl CancelSink for Messages {
    fn send_cancel(&self, entry: RawEntry) {
        self.0.lock().unwrap().push(entry);
    }
    fn send_move(&self, _entry: EntryRef, _deadline: u64) {
        panic!("no reset in this model");
    }
}

fn race(filed: bool) {
    model(move || {
        let ran = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let captures = DropCount(dropped.clone());
        let ran_in_callback = ran.clone();
        let (handle, service) = EntryRef::new(next_id(), 0, move || {
            let _captures = &captures;
            ran_in_callback.fetch_add(1, Ordering::SeqCst);
        });
        if filed {
            assert_eq!(service.mark_filed(), File::Filed);
        }
        let shard = thread::spawn(move || match service.try_fire() {
            Ok(task) => {
                trace("shard won: fired");
                task.run();
                None
            }
            Err(entry) => {
                trace("shard lost: cancelled");
                // A filed entry waits for its cancel message; hand it back.
                Some(entry)
            }
        });
        let messages = Messages::default();
        let cancelled = handle.cancel(&CancelPort::new(&messages));
        trace(format!("cancel returned {cancelled}"));
        let kept = shard.join().unwrap();
        assert_eq!(
            ran.load(Ordering::SeqCst),
            usize::from(!cancelled),
            "runs iff not cancelled"
        );
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "captures dropped exactly once"
        );
        let sent = messages.0.lock().unwrap().len();
        assert_eq!(
            sent,
            usize::from(cancelled && filed),
            "a message iff a filed entry was cancelled"
        );
        assert_eq!(kept.is_some(), cancelled, "the shard lost iff cancel won");
        drop(kept);
        drop(handle);
    });
}

#[test]
fn cancel_racing_expiry_unfiled() {
    race(false);
}

#[test]
fn cancel_racing_expiry_filed() {
    race(true);
}
