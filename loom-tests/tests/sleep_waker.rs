//! Model 11: the `Sleep` waker handshake (`src/future.rs`, `Shared`).
//!
//! Explores: a task polls a pending sleep (`Shared::poll_finished`, the body of
//! `Sleep::poll`) under loom's `block_on`, whose waker is a loom notification, while
//! the timer's callback — or its drop at shutdown — finishes the sleep
//! (`Shared::finish`). Also: two finishers racing (the callback and the drop of a
//! cancelled callback), where the first outcome must win.
//! Asserts: the task always completes — loom reports a deadlock if a wake-up is lost
//! (the task parked with no wake to come) — and it sees the outcome that won.
//! Seeded bug that makes it fail: drop the re-check of `outcome` after storing the
//! waker in `poll_finished` (finish runs between the first check and the store, takes
//! no waker, and the task parks for ever): "deadlock; threads = [(Id(0),
//! Blocked(Location(None))), (Id(1), Terminated)]".
//! Command: as in `ring.rs`, with `--test sleep_waker`.
#![cfg(loom)]

use std::future::poll_fn;

use loom::sync::Arc;
use loom::thread;
use loom_tests::model;
use sharded_timer::__loom::{SleepShared, ABANDONED, ELAPSED};

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
