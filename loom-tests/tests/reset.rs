//! Model 7: reset racing expiry and cancel (`EntryRef::reset`, `try_fire_due`, the
//! shard's move messages; `src/entry/state.rs` RESETTING, MOVING and the sequence).
//!
//! Explores: (A) a reset to a later deadline against the shard's expiry at the old
//! deadline; (B) on a filed entry, a reset to an earlier deadline (which sends a move
//! message) racing a cancel and the shard's expiry and message processing.
//! Asserts: a reset that returned `true` is never overtaken by a stale expiry (the
//! timer fires no earlier than the reset's deadline); exactly one of fire and cancel
//! wins; the callback runs iff `cancel` returned `false`; every message that was sent
//! is processed before the shard lets the entry go (after all threads finish, the
//! message ring is empty), so the ring a resetter sends through is live; the entry is
//! freed exactly once (`Track`).
//! Seeded bug that makes it fail: `StateWord::try_fire_seen` expecting a freshly
//! loaded word instead of the one it read before the deadline. Scenario B then fails
//! ("Causality violation: Concurrent read and write accesses": a stale fire and the
//! cancel both won, trace "move message / fired at 10"). Scenario A did not catch
//! this seed in our runs, although the interleaving it needs is within the bound; it
//! stays as a plain check of the later-reset path.
//! Command: as in `ring.rs`, with `--test reset`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, trace};
use sharded_timer::__loom::{
    next_id, shard_store, CancelPort, EntryRef, File, Message, ShardShared,
};

/// The shard's view of one entry in this model: in its wheel, aside, or gone.
#[derive(Debug, PartialEq)]
enum Where {
    Wheel,
    AsideForCancel,
    AsideForMove,
    Gone,
}

#[test]
fn a_later_reset_is_never_overtaken_by_expiry_at_the_old_deadline() {
    model(|| {
        let (shard, _cursors) = ShardShared::new(4);
        let fired_at = Arc::new(AtomicU64::new(0));
        let fired_in_callback = fired_at.clone();
        let now = Arc::new(AtomicU64::new(10));
        let now_in_callback = now.clone();
        let (handle, service) = EntryRef::new(next_id(), 10, move || {
            fired_in_callback.store(now_in_callback.load(Ordering::SeqCst), Ordering::SeqCst);
        });
        assert_eq!(service.mark_filed(), File::Filed);
        let resetter = {
            let shard = shard.clone();
            thread::spawn(move || {
                let ok = handle.reset(20, &CancelPort::new(&*shard));
                trace(format!("reset to 20 returned {ok}"));
                ok
            })
        };
        // The shard: expire at tick 10, then at 20 until it fires.
        let mut entry = service;
        loop {
            let tick = now.load(Ordering::SeqCst);
            match entry.try_fire_due(tick) {
                sharded_timer::__loom::Due::Fired(task) => {
                    trace(format!("fired at {tick}"));
                    task.run();
                    break;
                }
                sharded_timer::__loom::Due::Later(back) => {
                    trace(format!("not due at {tick}"));
                    entry = back;
                    if tick < 20 {
                        now.store(20, Ordering::SeqCst);
                    } else {
                        thread::yield_now();
                    }
                }
                sharded_timer::__loom::Due::Cancelled(_) => panic!("nobody cancels here"),
                sharded_timer::__loom::Due::Run(_) => unreachable!("a one-shot timer"),
            }
        }
        let reset_won = resetter.join().unwrap();
        let at = fired_at.load(Ordering::SeqCst);
        assert_eq!(
            at,
            if reset_won { 20 } else { 10 },
            "fired at {at}, reset returned {reset_won}"
        );
    });
}

#[test]
fn an_earlier_reset_racing_cancel_and_expiry_resolves_once_and_leaves_no_message() {
    model(|| {
        let (shard, mut cursors) = ShardShared::new(4);
        let ran = Arc::new(AtomicBool::new(false));
        let ran_in_callback = ran.clone();
        let (handle, service) = EntryRef::new(next_id(), 30, move || {
            ran_in_callback.store(true, Ordering::SeqCst);
        });
        let mut store = shard_store();
        assert_eq!(service.mark_filed(), File::Filed);
        let raw = store.release(service);
        let handle = Arc::new(handle);
        let resetter = {
            let (shard, handle) = (shard.clone(), handle.clone());
            thread::spawn(move || handle.reset(5, &CancelPort::new(&*shard)))
        };
        let canceller = {
            let (shard, handle) = (shard.clone(), handle.clone());
            thread::spawn(move || handle.cancel(&CancelPort::new(&*shard)))
        };
        // The shard at tick 10: process messages, try to expire, until it lets go.
        let mut place = Where::Wheel;
        while place != Where::Gone {
            let mut progressed = false;
            if let Some(message) = shard.pop_cancel(&mut cursors) {
                progressed = true;
                match message {
                    Message::Cancel(message_raw) => {
                        trace("cancel message");
                        assert_eq!(message_raw, raw);
                        let entry = store.claim(raw);
                        if entry.snapshot().is_moving() {
                            store.release(entry);
                            place = Where::AsideForMove;
                        } else {
                            drop(entry);
                            place = Where::Gone;
                        }
                    }
                    Message::Move(entry) => {
                        trace("move message");
                        let _before = entry.clear_moving();
                        if place == Where::AsideForMove {
                            drop(store.claim(raw));
                            place = Where::Gone;
                        }
                        drop(entry);
                    }
                }
            }
            if place == Where::Wheel {
                let entry = store.claim(raw);
                match entry.try_fire_due(10) {
                    sharded_timer::__loom::Due::Fired(task) => {
                        trace("fired at 10");
                        task.run();
                        place = Where::Gone;
                        progressed = true;
                    }
                    sharded_timer::__loom::Due::Later(back) => {
                        store.release(back);
                    }
                    sharded_timer::__loom::Due::Cancelled(back) => {
                        trace("expired while cancelled: aside");
                        store.release(back);
                        place = Where::AsideForCancel;
                        progressed = true;
                    }
                    sharded_timer::__loom::Due::Run(_) => unreachable!("a one-shot timer"),
                }
            }
            if place == Where::AsideForCancel {
                // Waiting for the cancel message (handled above).
            }
            if !progressed {
                thread::yield_now();
            }
        }
        let reset_won = resetter.join().unwrap();
        let cancelled = canceller.join().unwrap();
        trace(format!("reset {reset_won}, cancel {cancelled}"));
        assert_eq!(
            ran.load(Ordering::SeqCst),
            !cancelled,
            "runs iff not cancelled"
        );
        if ran.load(Ordering::SeqCst) {
            assert!(
                reset_won,
                "only the earlier deadline (5) can be due at tick 10"
            );
        }
        assert!(
            shard.pop_cancel(&mut cursors).is_none(),
            "a message outlived the entry's release"
        );
    });
}
