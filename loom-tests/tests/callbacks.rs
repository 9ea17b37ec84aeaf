//! Model 12: where callbacks run, on the whole service (`src/shard/shard_loop.rs`,
//! `src/shard/own.rs`, `src/timer.rs`, `src/dispatch/`): one shard, rings of 2, no
//! pool.
//!
//! First model, inline: a due timer's callback runs on the shard thread, cancels a
//! far timer (a message into its own shard), schedules a timer from there and shuts
//! the service down from there, while the main thread schedules a due timer and then
//! shuts down too.
//! Asserts: no deadlock (the shard never waits for itself: the shutdown from its own
//! thread takes its core instead of joining it); every accepted timer ran exactly
//! once or came back from exactly one of the two shutdowns; nothing leaks.
//! Seeded bug that makes it fail: `Inner::shut_down` not recognising the calling
//! shard thread (`caller_shard` always `None`): the callback's shutdown joins the
//! thread it runs on: "deadlock; threads = [(Id(0), Blocked(..)), (Id(1),
//! Blocked(..))]".
//!
//! Second model, spawn: the spawner queues each `Callback`; a consumer thread runs
//! what it finds while the main thread shuts down.
//! Asserts: the timer ran exactly once (by the consumer, or by the main thread after
//! shutdown: a `Callback` stays runnable), or came back from shutdown, or was refused;
//! never twice, never lost.
//! Seeded bug that makes it fail: the shard loop checking for a stop before
//! dispatching what its turn fired (the queued tasks are then dropped unrun when the
//! loop ends): "assertion `left == right` failed, left: 0, right: 1".
//! Bound: `LOOM_MAX_PREEMPTIONS=3`, about a second for both (no pool threads, so far
//! fewer interleavings than `shutdown.rs`). At 3, the first model found the canary
//! touched by a producer of a new timer that found the ring full as the shard closed
//! it and retired: a false alarm (the producer holds the service, whose `Arc` keeps the
//! shard alive), so the canary now watches message senders only, as its doc says.
//! Command: `RUSTFLAGS="--cfg loom -C debug-assertions=on" CARGO_TARGET_DIR=target/loom
//! LOOM_MAX_PREEMPTIONS=3 cargo test --release -p loom-tests --test callbacks`.
#![cfg(loom)]

use std::time::{Duration, Instant};

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use loom_tests::{model, trace};
use sharded_timer::{Callback, Callbacks, ScheduleError, ShardedTimer};

/// An instant a second ago: due at tick 0, whatever the real clock says.
fn past() -> Instant {
    Instant::now()
        .checked_sub(Duration::from_secs(1))
        .unwrap_or_else(Instant::now)
}

/// A one-shard service of rings of 2 whose callbacks run as `callbacks` says.
fn service(callbacks: Callbacks) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(1)
        .ring_capacity(2)
        .callbacks(callbacks)
        .pin_cores(false)
        .build()
        .unwrap()
}

/// Schedules a due timer counting into `ran`; whether it was accepted.
fn schedule_counted(timer: &ShardedTimer, ran: &Arc<AtomicUsize>) -> bool {
    let ran = ran.clone();
    match timer.schedule_at(past(), move || {
        ran.fetch_add(1, Ordering::SeqCst);
    }) {
        Ok(_) => true,
        Err(ScheduleError::Shutdown) => false,
        Err(other) => panic!("unexpected {other}"),
    }
}

#[test]
fn an_inline_callback_schedules_and_shuts_down_from_its_own_shard() {
    model(|| {
        let timer = service(Callbacks::inline());
        let ran = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::new(AtomicUsize::new(0));
        let came_back = Arc::new(AtomicUsize::new(0));
        // Far away: the callback cancels it (a message into its own shard's ring).
        let victim_ran = Arc::new(AtomicUsize::new(0));
        let victim = {
            let victim_ran = victim_ran.clone();
            timer
                .schedule(Duration::from_secs(3600), move || {
                    victim_ran.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap()
        };
        let victim_cancelled = Arc::new(AtomicUsize::new(0));
        {
            let (victim, victim_cancelled) = (victim.clone(), victim_cancelled.clone());
            let (inner, ran, accepted, came_back) = (
                timer.clone(),
                ran.clone(),
                accepted.clone(),
                came_back.clone(),
            );
            let first = timer.schedule_at(past(), move || {
                trace("callback on the shard thread");
                if victim.cancel() {
                    victim_cancelled.fetch_add(1, Ordering::SeqCst);
                }
                if schedule_counted(&inner, &ran) {
                    accepted.fetch_add(1, Ordering::SeqCst);
                }
                let unfired = inner.shutdown();
                trace(format!("callback's shutdown: {} unfired", unfired.len()));
                came_back.fetch_add(unfired.len(), Ordering::SeqCst);
                for timer in unfired {
                    timer.run();
                }
            });
            assert!(first.is_ok());
        }
        if schedule_counted(&timer, &ran) {
            accepted.fetch_add(1, Ordering::SeqCst);
        }
        let unfired = timer.shutdown();
        trace(format!("main's shutdown: {} unfired", unfired.len()));
        came_back.fetch_add(unfired.len(), Ordering::SeqCst);
        for timer in unfired {
            timer.run();
        }
        // The callback may still be finishing on the (detached) shard thread: its
        // shutdown returned before the main one could take the threads, or after.
        while accepted.load(Ordering::SeqCst) > ran.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        while victim_cancelled.load(Ordering::SeqCst) + victim_ran.load(Ordering::SeqCst) == 0 {
            thread::yield_now();
        }
        drop(timer);
        assert_eq!(
            ran.load(Ordering::SeqCst),
            accepted.load(Ordering::SeqCst),
            "every accepted timer ran (inline, or after coming back) exactly once"
        );
        assert_eq!(
            victim_cancelled.load(Ordering::SeqCst) + victim_ran.load(Ordering::SeqCst),
            1,
            "the far timer was cancelled from the callback, or came back and ran: once"
        );
    });
}

#[test]
fn a_spawned_callback_runs_exactly_once_across_shutdown() {
    model(|| {
        let queue: Arc<Mutex<Vec<Callback>>> = Arc::default();
        let spawned = queue.clone();
        let timer = service(Callbacks::spawn(move |callback| {
            spawned.lock().unwrap().push(callback);
        }));
        let ran = Arc::new(AtomicUsize::new(0));
        let accepted = schedule_counted(&timer, &ran);
        let consumer = {
            let queue = queue.clone();
            thread::spawn(move || {
                let taken: Vec<Callback> = queue.lock().unwrap().drain(..).collect();
                for callback in taken {
                    callback.run();
                }
            })
        };
        let unfired = timer.shutdown();
        let returned = unfired.len();
        consumer.join().unwrap();
        // Handed over but not yet taken: still runnable after shutdown.
        let left: Vec<Callback> = queue.lock().unwrap().drain(..).collect();
        drop(timer);
        for callback in left {
            callback.run();
        }
        for timer in unfired {
            timer.run();
        }
        trace(format!("accepted {accepted}, returned {returned}"));
        assert_eq!(ran.load(Ordering::SeqCst), usize::from(accepted));
    });
}
