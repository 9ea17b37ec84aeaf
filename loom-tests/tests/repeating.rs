//! Model 8: a repeating timer's run racing a cancel (`RUNNING` in
//! `src/entry/state.rs`, `RunningEntry`, the shard's re-filing).
//!
//! Explores: the shard starting a run of a filed repeating timer, the runner calling
//! it, scheduling the next run, ending the run and filing it again, against a handle's
//! `cancel` landing before the run, during it, between its end and the re-filing, or
//! after.
//! Asserts: the callback is dropped exactly once — by the canceller when no run is
//! under way, by the runner when the cancel lands during the run — and never while
//! it runs (loom checks the cell); a cancel message is sent iff the entry was filed
//! when the cancel won, and the shard receives it; a cancelled timer is not filed
//! again; the entry is freed exactly once (`Track`).
//! Seeded bug that makes it fail: `EntryRef::try_cancel` dropping the callback even
//! when `RUNNING` is set (the canceller then drops it under the running callback:
//! loom reports the concurrent cell access).
//! Command: as in `ring.rs`, with `--test repeating`.
#![cfg(loom)]

use std::time::{Duration, Instant};

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, trace};
use sharded_timer::__loom::{
    next_id, shard_store, CancelPort, Due, EntryRef, File, Message, ShardShared,
};

/// Counts drops of the callback's captures.
struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_cancel_racing_a_run_drops_the_callback_once_and_stops_later_runs() {
    model(|| {
        let (shard, mut cursors) = ShardShared::new(4);
        let runs = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let captures = DropCount(dropped.clone());
        let runs_in_callback = runs.clone();
        let (handle, service) = EntryRef::new_repeating(
            next_id(),
            10,
            Instant::now(),
            Duration::from_millis(1),
            move || {
                let _captures = &captures;
                runs_in_callback.fetch_add(1, Ordering::SeqCst);
            },
        );
        let mut store = shard_store();
        assert_eq!(service.mark_filed(), File::Filed);
        let canceller = {
            let shard = shard.clone();
            thread::spawn(move || {
                let won = handle.cancel(&CancelPort::new(&*shard));
                trace(format!("cancel returned {won}"));
                won
            })
        };
        // The shard and the runner (one thread here: the race is with the canceller).
        let mut in_wheel = None;
        match service.try_fire_due(10) {
            Due::Run(mut running) => {
                trace("run started");
                running.call();
                let _ = running.schedule_next(Instant::now(), |_| 20);
                match running.finish() {
                    Some(entry) => {
                        trace("run ended, pending: file again");
                        match entry.mark_filed() {
                            File::Filed => in_wheel = Some(store.release(entry)),
                            File::AlreadyCancelled => trace("cancelled before re-filing"),
                        }
                    }
                    None => trace("run ended, cancelled meanwhile: runner dropped it"),
                }
            }
            Due::Cancelled(entry) => {
                trace("cancelled before the run: awaiting its message");
                in_wheel = Some(store.release(entry));
            }
            Due::Later(_) | Due::Fired(_) => panic!("a due repeating timer starts a run"),
        }
        let cancelled = canceller.join().unwrap();
        // A filed entry that was cancelled gets exactly one message.
        let message = shard.pop_cancel(&mut cursors);
        match (in_wheel, message) {
            (Some(raw), Some(Message::Cancel(sent))) => {
                assert!(cancelled);
                assert_eq!(raw, sent);
                drop(store.claim(raw));
            }
            (Some(raw), None) => {
                assert!(!cancelled, "a cancel of a filed entry sent no message");
                drop(store.claim(raw)); // pending: the last reference drops the callback
            }
            (None, None) => assert!(cancelled),
            (None, Some(_)) => panic!("a message for an entry the shard does not hold"),
            (Some(_), Some(Message::Move(_))) => panic!("nobody resets here"),
        }
        assert!(shard.pop_cancel(&mut cursors).is_none());
        assert!(runs.load(Ordering::SeqCst) <= 1);
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "the callback is dropped exactly once"
        );
    });
}
