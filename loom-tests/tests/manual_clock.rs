//! Model 8: the manual clock's rounds (`src/clock/manual.rs`) on the whole service:
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
//! with the old time): "both timers ran by the time advance returned: left: 0,
//! right: 2".
//!
//! Second model, the pool: a chain of three timers, each scheduled by the previous
//! one's callback, due at once, on a service with one worker; the main thread advances
//! by 1 ms.
//! Asserts: all three ran, once each, when `advance` returns.
//! Seeded bug that makes it fail: `advance` ending on a quiet round that began with a
//! batch in flight (dropping the `busy` check): a callback still running when the
//! round began schedules its successor after the round's turn drained the ring:
//! "the chain ran to its end within the advance: left: 2, right: 3".
//! Bound: `LOOM_MAX_PREEMPTIONS=2` for the pool model (three threads and a lock per
//! turn: bound 3 takes minutes), 3 for the inline one.
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
fn advance_waits_for_a_chain_of_pool_callbacks() {
    // At most 2 preemptions, whatever LOOM_MAX_PREEMPTIONS says (see the bound above).
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(builder.preemption_bound.unwrap_or(2).min(2));
    builder.check(|| {
        let clock = ManualClock::new();
        let timer = service(&clock, Callbacks::pool(1));
        let ran = Arc::new(AtomicUsize::new(0));
        timer.schedule(MS, link(&timer, &ran, 2)).unwrap();
        clock.advance(MS);
        assert_eq!(
            ran.load(Ordering::SeqCst),
            3,
            "the chain ran to its end within the advance"
        );
        drop(timer);
    });
}
