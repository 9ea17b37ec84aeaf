//! Model 5: shutdown racing schedule, on the whole service (`src/timer.rs`,
//! `src/shard.rs`, `src/executor.rs`): one shard, one worker, rings of 2.
//!
//! Explores: a producer scheduling a due timer while the main thread shuts the
//! service down, with the shard thread and the executor worker running.
//! Asserts: none is lost: the timer either ran on the executor before `shutdown`
//! returned, or came back from `shutdown` as `Unfired`, or its `schedule` returned
//! `Err(Shutdown)`; exactly one of these; nothing leaks.
//! Seeded bug that makes it fail: `ShardCore::shut_down` skipping the drain of the
//! closed insert ring (a timer accepted into the ring is then neither run nor handed
//! back: loom reports the leaked entry, and the count assertion fails).
//! Bound: this model runs the whole service (four threads, each with many atomic
//! operations per loop), so it is explored with `LOOM_MAX_PREEMPTIONS=1`, under a
//! second; a bound of 2 takes longer than the CI budget allows. The push-versus-close
//! race at its heart is also modelled at bound 3 in `ring.rs`
//! (`close_racing_a_push_loses_nothing`).
//! Command: `RUSTFLAGS="--cfg loom -C debug-assertions=on" CARGO_TARGET_DIR=target/loom
//! LOOM_MAX_PREEMPTIONS=1 cargo test --release -p loom-tests --test shutdown`.
#![cfg(loom)]

use std::time::{Duration, Instant};

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, trace};
use sharded_timer::{ScheduleError, ShardedTimer};

#[test]
fn every_timer_runs_comes_back_or_is_refused() {
    model(|| {
        let timer = ShardedTimer::builder()
            .shards(1)
            .executor_threads(1)
            .ring_capacity(2)
            .pin_cores(false)
            .build()
            .unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let producer = {
            let (timer, ran) = (timer.clone(), ran.clone());
            thread::spawn(move || {
                // A past deadline: due at tick 0, whatever the real clock says, so the
                // model does not depend on time.
                let past = Instant::now()
                    .checked_sub(Duration::from_secs(1))
                    .unwrap_or_else(Instant::now);
                match timer.schedule_at(past, move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                }) {
                    Ok(_) => true,
                    Err(ScheduleError::Shutdown) => false,
                    Err(other) => panic!("unexpected {other}"),
                }
            })
        };
        let unfired = timer.shutdown();
        trace(format!("shutdown returned {} unfired", unfired.len()));
        let accepted = producer.join().unwrap();
        let ran_before = ran.load(Ordering::SeqCst);
        let returned = unfired.len();
        for timer in unfired {
            timer.run();
        }
        trace(format!(
            "accepted {accepted}, ran {ran_before}, returned {returned}"
        ));
        assert_eq!(
            ran_before + returned,
            usize::from(accepted),
            "ran, came back, or refused: exactly one"
        );
        assert_eq!(ran.load(Ordering::SeqCst), usize::from(accepted));
        drop(timer);
    });
}
