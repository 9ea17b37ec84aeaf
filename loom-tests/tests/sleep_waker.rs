//! Model 11: the `Sleep` waker handshake (`src/entry/sleep.rs`, `SleepShared`, which
//! a sleep's entry holds in place of a callback).
//!
//! Explores: a task polls a pending sleep (`Shared::poll_finished`, the body of
//! `Sleep::poll`) under loom's `block_on`, whose waker is a loom notification, while
//! the timer's callback — or its drop at shutdown — finishes the sleep
//! (`Shared::finish`). Also: two finishers racing (the callback and the drop of a
//! cancelled callback), where the first outcome must win.
//! Asserts: the task always completes — loom reports a deadlock if a wake-up is lost
//! (the task parked with no wake to come) — and it sees the outcome that won.
//! Seeded bug that makes it fail: the poll ignoring the outcome its clear of `POLLING`
//! reads back (`SleepShared::end_poll` answering "no finish" always: a finish that won
//! while the poll stored its waker left the waker to the poll, which then parks for
//! ever):
//! "deadlock; threads = [(Id(0), Blocked(Location(None))), (Id(1), Terminated)]", in
//! models 1, 2 and 5 (checked at issue 41; before it, with the waker under a mutex,
//! dropping the re-check of `outcome` after the store did the same). The finish
//! taking the waker while `POLLING` is set fails models 1, 2 and 5 with loom's
//! "Causality violation: Concurrent write accesses to `UnsafeCell`".
//! Third model (issue 19, defect 8): a sleep dropped while its timer fires; see its
//! doc comment. Fourth model (issue 29, defect 3): a dropped sleep's waker is never
//! dropped inside the shard's turn; see its doc comment. Fifth model (issue 41): a
//! waker stored with the timer by the poll that arms it, then the handshake of a
//! second poll racing the shard's fire; see its doc comment. (Since issue 41 the
//! waker sits in a cell that one state word hands over, with a `POLLING` bit, where
//! a mutex guarded it: loom's cell tracking checks every access to it.)
//! Command: as in `ring.rs`, with `--test sleep_waker`.
#![cfg(loom)]

use std::future::poll_fn;

use loom::sync::Arc;
use loom::thread;
use loom_tests::model;
use sharded_timer::__loom::{SleepShared, ABANDONED, DISARMED, ELAPSED};

#[test]
fn a_pending_sleep_is_woken_when_its_timer_fires() {
    model(|| {
        let shared = Arc::new(SleepShared::new());
        let timer = {
            let shared = shared.clone();
            thread::spawn(move || shared.finish(ELAPSED))
        };
        loom::future::block_on(poll_fn(|cx| shared.poll_finished(cx)));
        timer.join().unwrap();
        assert!(
            shared.poll_finished(&mut noop_context()).is_ready(),
            "finished for good"
        );
    });
}

#[test]
fn the_first_outcome_wins_and_wakes_the_task() {
    model(|| {
        let shared = Arc::new(SleepShared::new());
        let fire = {
            let shared = shared.clone();
            thread::spawn(move || shared.finish(ELAPSED))
        };
        let abandon = {
            let shared = shared.clone();
            thread::spawn(move || shared.finish(ABANDONED))
        };
        loom::future::block_on(poll_fn(|cx| shared.poll_finished(cx)));
        let fired = fire.join().unwrap();
        let abandoned = abandon.join().unwrap();
        assert!(fired != abandoned, "exactly one finisher wins");
        let expected = if fired { ELAPSED } else { ABANDONED };
        assert_eq!(shared.outcome(), expected, "the winner's outcome stands");
    });
}

/// A context whose waker does nothing, for a final check of a finished sleep.
fn noop_context() -> std::task::Context<'static> {
    std::task::Context::from_waker(std::task::Waker::noop())
}

/// Counts the wakes of a task's waker.
struct CountWakes(loom::sync::atomic::AtomicUsize);

impl std::task::Wake for CountWakes {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, loom::sync::atomic::Ordering::SeqCst);
    }
}

/// Issue 19, defect 8: a pending sleep dropped while its timer fires. The task has
/// polled (its waker is stored); then `Sleep::drop` disarms the sleep
/// (`Shared::disarm`) and, if that won, cancels the timer, whose dropped callback
/// finishes the sleep as abandoned (`SleepEntry::abandon`: `finish`), racing the
/// timer's own `finish(ELAPSED)` on the shard.
/// Asserts: a sleep the drop disarmed is never woken (tokio's contract: dropping only
/// cancels); one whose timer fired first was woken exactly once, by the timer.
/// Seeded bug that makes it fail: `Shared::disarm` deciding to cancel without setting
/// `DISARMED` (as before the fix, when the drop's `finish(ABANDONED)` won and woke
/// the task): "the disarm already decided" (the drop's finish won, and woke the task).
#[test]
fn a_sleep_dropped_while_its_timer_fires_is_never_woken_by_the_drop() {
    model(|| {
        let shared = Arc::new(SleepShared::new());
        let wakes = std::sync::Arc::new(CountWakes(loom::sync::atomic::AtomicUsize::new(0)));
        let waker = std::task::Waker::from(wakes.clone());
        assert!(shared
            .poll_finished(&mut std::task::Context::from_waker(&waker))
            .is_pending());
        let timer = {
            let shared = shared.clone();
            thread::spawn(move || shared.finish(ELAPSED))
        };
        // `Sleep::drop`: disarm, then cancel; the cancelled callback's drop finishes
        // the sleep as abandoned.
        let disarmed = shared.disarm();
        if disarmed {
            assert!(!shared.finish(ABANDONED), "the disarm already decided");
        }
        let fired = timer.join().unwrap();
        let woken = wakes.0.load(loom::sync::atomic::Ordering::SeqCst);
        assert!(
            fired != disarmed,
            "exactly one of the fire and the drop decides"
        );
        if disarmed {
            assert_eq!(woken, 0, "a dropped sleep wakes nobody");
            assert_eq!(shared.outcome(), DISARMED);
        } else {
            assert_eq!(woken, 1, "the timer that fired first woke the task, once");
            assert_eq!(shared.outcome(), ELAPSED);
        }
    });
}

/// Issue 21: the sleep's shared state now lives in its timer's entry
/// (`EntryRef::new_sleep`, `SleepEntry`), reached through the handle's reference; the
/// entry is filed in the real `ShardCore`, which fires it (the vtable's `fire`) while
/// the future drops it (`Sleep::drop`: disarm, then the handle's `cancel`, whose
/// callback drop is the vtable's `abandon`).
/// Asserts: as the model above, through the real entry: exactly one of the fire and
/// the drop decides, a dropped sleep wakes nobody, a fired one wakes once; the entry
/// and its stored waker are freed (loom's leak check on the entry's `Track`).
/// Seeded bug that makes it fail: `SleepShared::disarm` answering from a load instead
/// of setting `DISARMED` (the cancel's `abandon` then wins and wakes the task): "a
/// dropped sleep wakes nobody".
#[test]
fn a_sleep_entry_fired_by_the_shard_while_its_future_drops_it() {
    use loom_tests::shard;
    use sharded_timer::__loom::{next_id, EntryRef, Nanos, Tick};
    model(|| {
        let (shard_shared, mut core) = shard::new(2);
        let (handle, service) = EntryRef::new_sleep(next_id(), Nanos::new(0), false, None);
        assert!(shard_shared.push_insert(service, Tick::new(0)).is_ok());
        core.drain_inserts();
        let wakes = std::sync::Arc::new(CountWakes(loom::sync::atomic::AtomicUsize::new(0)));
        let waker = std::task::Waker::from(wakes.clone());
        let shared = handle.sleep_shared().expect("a sleep's entry");
        assert!(shared
            .poll_finished(&mut std::task::Context::from_waker(&waker))
            .is_pending());
        drop(waker);
        let dropper = {
            let port_of = shard_shared.clone();
            thread::spawn(move || {
                // `Sleep::drop` → `Armed::disarm`.
                let shared = handle.sleep_shared().expect("a sleep's entry");
                let disarmed = shared.disarm();
                if disarmed {
                    drop(handle.cancel(&port_of.port()));
                }
                (disarmed, handle)
            })
        };
        let fired = shard::turn(&mut core, 0);
        let (disarmed, handle) = dropper.join().unwrap();
        let outcome = handle.sleep_shared().expect("a sleep's entry").outcome();
        drop(handle);
        while core.awaiting() > 0 {
            core.drain_messages();
        }
        core.drain_messages();
        let woken = wakes.0.load(loom::sync::atomic::Ordering::SeqCst);
        if disarmed {
            // The shard may still fire it between the disarm and the cancel: its
            // finish then loses to DISARMED.
            assert_eq!(woken, 0, "a dropped sleep wakes nobody");
            assert_eq!(outcome, DISARMED);
        } else {
            assert_eq!(outcome, ELAPSED);
            assert_eq!(fired, 1, "the disarm lost: the timer had fired");
            assert_eq!(woken, 1, "the timer that fired first woke the task, once");
        }
    });
}

/// A waker that fails the model if it is dropped while the shard takes its messages
/// (`draining`): user code inside the shard's turn, under its token.
struct FailsInTurn(std::sync::Arc<loom::sync::atomic::AtomicBool>);

impl std::task::Wake for FailsInTurn {
    fn wake(self: std::sync::Arc<Self>) {}
}

impl Drop for FailsInTurn {
    fn drop(&mut self) {
        assert!(
            !self.0.load(loom::sync::atomic::Ordering::SeqCst),
            "a sleep's waker dropped inside the shard's turn"
        );
    }
}

/// Model 4 (issue 29, defect 3): a sleep's waker is never dropped inside the shard's
/// turn. As model 3, but the future's thread does what `Sleep::drop` does now
/// (`SleepShared::give_up`: disarm and take the waker; cancel if it disarmed; drop the
/// waker, then its handle), so that the cancel message the shard takes holds the
/// entry's last reference.
/// Asserts: the waker (user code: it may own its task, or panic) is never dropped
/// while the shard drains its messages; a dropped sleep wakes nobody.
/// Seeded bug that makes it fail: `give_up` leaving the waker in the entry (as
/// `disarm` alone did before): "a sleep's waker dropped inside the shard's turn".
#[test]
fn a_dropped_sleeps_waker_is_never_dropped_inside_the_shards_turn() {
    use loom_tests::shard;
    use sharded_timer::__loom::{next_id, EntryRef, Nanos, Tick};
    model(|| {
        let (shard_shared, mut core) = shard::new(2);
        let (handle, service) = EntryRef::new_sleep(next_id(), Nanos::new(0), false, None);
        assert!(shard_shared.push_insert(service, Tick::new(0)).is_ok());
        core.drain_inserts();
        let draining = std::sync::Arc::new(loom::sync::atomic::AtomicBool::new(false));
        let waker = std::task::Waker::from(std::sync::Arc::new(FailsInTurn(draining.clone())));
        let shared = handle.sleep_shared().expect("a sleep's entry");
        assert!(shared
            .poll_finished(&mut std::task::Context::from_waker(&waker))
            .is_pending());
        drop(waker);
        let dropper = {
            let port_of = shard_shared.clone();
            thread::spawn(move || {
                // `Sleep::drop` → `Armed::disarm`, then the handle goes.
                let shared = handle.sleep_shared().expect("a sleep's entry");
                let (disarmed, waker) = shared.give_up();
                if disarmed {
                    drop(handle.cancel(&port_of.port()));
                }
                drop(waker);
                drop(handle);
                disarmed
            })
        };
        let fired = shard::turn(&mut core, 0);
        let disarmed = dropper.join().unwrap();
        draining.store(true, loom::sync::atomic::Ordering::SeqCst);
        while core.awaiting() > 0 {
            core.drain_messages();
        }
        core.drain_messages();
        draining.store(false, loom::sync::atomic::Ordering::SeqCst);
        assert!(disarmed || fired == 1, "the disarm lost only to the fire");
    });
}

/// Model 5 (issue 41): a first poll arms the sleep's timer with its waker already in
/// the entry (`EntryRef::new_sleep(.., Some(waker))`, `SleepShared::polled`: what
/// `Sleep::poll` does when it arms), files it through the real insert ring and
/// returns `Pending` with no handshake; the real `ShardCore` takes it and fires it on
/// its own thread while the task polls again (`poll_finished`, the handshake with
/// `POLLING`), however the two interleave.
/// Asserts: the task always completes (a lost wake-up is loom's deadlock) and sees
/// `ELAPSED`; the entry and its waker are freed (loom's leak check).
/// Seeded bug that makes it fail: the finish taking the waker even while a poll has
/// set `POLLING` (`if state & POLLING == 0` made always true): loom reports the two
/// accesses to the waker's cell as a race ("Causality violation: Concurrent mutable
/// access and mutable access").
#[test]
fn a_sleep_armed_with_its_waker_at_its_first_poll_is_woken_when_it_fires() {
    use loom_tests::shard;
    use sharded_timer::__loom::{next_id, EntryRef, Nanos, Tick};
    model(|| {
        let (shard_shared, mut core) = shard::new(2);
        let shard_thread = thread::spawn(move || {
            // The shard's loop: take the insert, fire it (tick 0 is due at once).
            loop {
                core.drain_inserts();
                if shard::turn(&mut core, 0) == 1 {
                    break;
                }
                thread::yield_now();
            }
            core
        });
        let mut armed: Option<EntryRef> = None;
        loom::future::block_on(poll_fn(|cx| match &armed {
            None => {
                let (handle, service) =
                    EntryRef::new_sleep(next_id(), Nanos::new(0), false, Some(cx.waker().clone()));
                assert!(shard_shared.push_insert(service, Tick::new(0)).is_ok());
                armed = Some(handle);
                std::task::Poll::Pending
            }
            Some(handle) => handle
                .sleep_shared()
                .expect("a sleep's entry")
                .poll_finished(cx),
        }));
        let mut core = shard_thread.join().unwrap();
        let handle = armed.expect("armed at the first poll");
        assert_eq!(
            handle.sleep_shared().expect("a sleep's entry").outcome(),
            ELAPSED
        );
        drop(handle);
        core.drain_messages();
    });
}
