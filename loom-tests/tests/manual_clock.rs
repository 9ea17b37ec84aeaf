//! Model 13: the manual clock's rounds (`src/clock/manual.rs`) on the whole service:
//! the real `ManualClock`, shard loop, core, rings and pool; one shard, rings of 2.
//!
//! First model, inline callbacks: a second thread schedules a timer due at 1 ms from
//! the clock's start (whose callback schedules a second timer, due at once) while the main thread
//! advances the clock by 1 ms.
//! Asserts: if the schedule returned before `advance` began, both timers have run when
//! `advance` returns (the round the advance asks for is answered by a turn that sees
//! the new time, and the fixed point takes in what the callback scheduled); whatever
//! the order, a later `advance(0)` finds both run, each exactly once; no deadlock.
//! Seeded bug that makes it fail: `TurnSlot::begin_turn` reading the time and the
//! round under two separate locks, time first (a turn can then answer the new round
//! with the old time): "both timers ran by the time advance returned: left: 1,
//! right: 2" (the turn that answered the round saw only the first one due).
//!
//! Second model, the pool (one worker): a timer due at once, whose callback schedules
//! a second one due at once, while the main thread calls `advance(0)`: the shard may
//! fire the first by itself before or during the advance.
//! Asserts: both ran when `advance` returns.
//! Seeded bug that makes it fail: `advance` ending on a quiet round that began with a
//! batch in flight (dropping the `busy` check): the callback, still running when the
//! round began, schedules its successor after the round's turn drained the ring:
//! "the timer and the one its callback scheduled ran within the advance: left: 1,
//! right: 2".
//! Third model, a repeating timer on the whole service (which needs a clock the model
//! moves): an inline repeating timer of period 1 ms; a second thread cancels it while
//! the main thread advances 1 ms, then 3 ms more.
//! Asserts: the cancel wins; a run under way when it landed may finish, none starts
//! after it; at most one run in the one period; the callback has been dropped, once,
//! by the time the cancel and that run are done.
//! Seeded bug that makes it fail: `EntryRef::cancel` never taking the callback (as if
//! a run were always under way): "the callback dropped once the cancel and the run
//! under way are done: left: 0, right: 1".
//! Bound: 3 for the inline models (about 5 s and 30 s) (about 5 s); 2 for the pool model, whatever
//! `LOOM_MAX_PREEMPTIONS` says (about 10 s; at 3 its worker's spinning exceeds loom's
//! branch limit).
//! Under loom the clock's lock is taken by spinning on `try_lock` (see
//! `ManualTime::lock`): loom turns an unpark that finds a thread blocked on a mutex
//! into a wake-up from that mutex and then panics that the lock was not free (found
//! by this model's first version). With it, a shard re-checks for an asked-for round
//! before it parks (`TurnSlot::before_park`), so no request rests on a park token
//! alone (std keeps a token across a blocked lock; loom does not).
//! Command: `RUSTFLAGS="--cfg loom -C debug-assertions=on" CARGO_TARGET_DIR=target/loom
//! LOOM_MAX_PREEMPTIONS=3 cargo test --release -p loom-tests --test manual_clock`.
#![cfg(loom)]

use std::time::Duration;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, trace};
use sharded_timer::{Callbacks, ManualClock, ShardedTimer};

const MS: Duration = Duration::from_millis(1);

/// A one-shard service of rings of 2 on `clock`, callbacks as `callbacks` says.
fn service(clock: &ManualClock, callbacks: Callbacks) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(1)
        .ring_capacity(2)
        .callbacks(callbacks)
        .pin_cores(false)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// A callback that counts into `ran`, then (if `then` is given) schedules the next
/// link of a chain, due at once.
fn link(
    timer: &ShardedTimer,
    ran: &Arc<AtomicUsize>,
    left: usize,
) -> impl FnOnce() + Send + 'static {
    let (timer, ran) = (timer.clone(), ran.clone());
    move || {
        trace(format!("link {left} runs"));
        ran.fetch_add(1, Ordering::SeqCst);
        if left > 0 {
            let next = link(&timer, &ran, left - 1);
            timer.schedule(Duration::ZERO, next).unwrap();
        }
    }
}

#[test]
fn advance_racing_a_schedule_from_another_thread() {
    model(|| {
        let clock = ManualClock::new();
        let timer = service(&clock, Callbacks::inline());
        let ran = Arc::new(AtomicUsize::new(0));
        let scheduled = Arc::new(AtomicBool::new(false));
        let due = clock.now() + MS;
        let producer = {
            let (timer, ran, scheduled) = (timer.clone(), ran.clone(), scheduled.clone());
            thread::spawn(move || {
                timer.schedule_at(due, link(&timer, &ran, 1)).unwrap();
                scheduled.store(true, Ordering::SeqCst);
                trace("scheduled");
            })
        };
        let before = scheduled.load(Ordering::SeqCst);
        trace(format!("advance; scheduled before: {before}"));
        clock.advance(MS);
        if before {
            assert_eq!(
                ran.load(Ordering::SeqCst),
                2,
                "both timers ran by the time advance returned"
            );
        }
        producer.join().unwrap();
        clock.advance(Duration::ZERO);
        assert_eq!(ran.load(Ordering::SeqCst), 2, "each ran exactly once");
        drop(timer);
    });
}

#[test]
fn advance_waits_for_a_pool_callback_already_under_way() {
    // At most 2 preemptions, whatever LOOM_MAX_PREEMPTIONS says (see the bound above).
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(builder.preemption_bound.unwrap_or(2).min(2));
    builder.check(|| {
        let clock = ManualClock::new();
        let timer = service(&clock, Callbacks::pool(1));
        let ran = Arc::new(AtomicUsize::new(0));
        // Due at once: the shard fires it by itself, maybe before the advance begins.
        timer
            .schedule(Duration::ZERO, link(&timer, &ran, 1))
            .unwrap();
        clock.advance(Duration::ZERO);
        assert_eq!(
            ran.load(Ordering::SeqCst),
            2,
            "the timer and the one its callback scheduled ran within the advance"
        );
        drop(timer);
    });
}

/// Counts its drops: the repeating timer's capture.
struct Dropped(Arc<AtomicUsize>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_repeating_timer_on_the_whole_service_racing_its_cancel() {
    model(|| {
        let clock = ManualClock::new();
        let timer = service(&clock, Callbacks::inline());
        let runs = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let capture = Dropped(dropped.clone());
        let counter = runs.clone();
        let handle = timer
            .schedule_repeating(MS, move || {
                let _keep = &capture;
                counter.fetch_add(1, Ordering::SeqCst);
                trace("run");
            })
            .unwrap();
        let canceller = {
            let (handle, runs) = (handle.clone(), runs.clone());
            thread::spawn(move || {
                let won = handle.cancel();
                let seen = runs.load(Ordering::SeqCst);
                trace(format!("cancel won {won} after {seen} runs"));
                (won, seen)
            })
        };
        clock.advance(MS);
        let (won, seen) = canceller.join().unwrap();
        assert!(won, "nothing else cancels it");
        let after_cancel = runs.load(Ordering::SeqCst);
        // A run under way when the cancel landed may finish; none starts after.
        assert!(
            after_cancel <= seen + 1,
            "{after_cancel} runs, {seen} when cancelled"
        );
        clock.advance(MS * 3);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            after_cancel,
            "no run after the cancel"
        );
        assert!(after_cancel <= 1, "one period advanced: at most one run");
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "the callback dropped once the cancel and the run under way are done"
        );
        drop(timer);
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "and only once");
    });
}
