//! The future operations, shared by tokio and the hand-written executor: sleeps,
//! `sleep_until` in the past, timeouts, re-armed and dropped sleeps, intervals; each
//! checked as it completes (never early unless refused, at once if already due); and
//! the tokio load that runs them.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use sharded_timer::{ShardedTimer, Sleep};

use super::checker::{Record, Shared};
use super::report::{bump, violation, Op};
use super::Rng;

/// Polls `future` once, as part of the current task.
async fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *future).poll(cx))).await
}

/// A future completed: early unless refused.
fn check_complete(what: &str, deadline: Option<Instant>, refused: bool) {
    if let Some(deadline) = deadline {
        let now = Instant::now();
        if !refused && now < deadline {
            violation(format!(
                "{what} completed {} µs before its deadline",
                (deadline - now).as_micros()
            ));
        }
    }
}

/// One random future operation on `timer`.
pub(super) async fn future_op(timer: ShardedTimer, shared: Arc<Shared>, seed: u64) {
    let mut rng = Rng::new(seed);
    let shutting = || Record::get(&shared.shutting_down);
    match rng.below(8) {
        0 | 1 => {
            let delay = Duration::from_micros(rng.range(0..=10_000));
            let before = Instant::now();
            let mut sleep = timer.sleep(delay);
            (&mut sleep).await;
            check_complete(
                "sleep",
                before.checked_add(delay),
                sleep.refused().is_some(),
            );
        }
        2 => {
            let now = Instant::now();
            let at = now
                .checked_sub(Duration::from_micros(rng.range(1_000..=50_000)))
                .unwrap_or(now);
            let mut sleep = timer.sleep_until(at);
            if poll_once(&mut sleep).await.is_pending() && !shutting() {
                violation(format!(
                    "sleep_until(now - {:?}) was pending at its first poll",
                    now - at
                ));
                (&mut sleep).await;
            }
        }
        3 => {
            let (outer, inner) = (
                Duration::from_micros(rng.range(0..=10_000)),
                Duration::from_micros(rng.range(0..=10_000)),
            );
            let before = Instant::now();
            match timer.timeout(outer, timer.sleep(inner)).await {
                Ok(()) => check_complete(
                    "timeout's inner sleep",
                    before.checked_add(inner),
                    shutting(),
                ),
                Err(elapsed) => check_complete(
                    "timeout",
                    before.checked_add(outer),
                    elapsed.refused().is_some(),
                ),
            }
        }
        4 => {
            // Armed, then re-armed earlier or later.
            let mut sleep = timer.sleep(Duration::from_micros(rng.range(0..=20_000)));
            let _ = poll_once(&mut sleep).await;
            let at = Instant::now() + Duration::from_micros(rng.range(0..=20_000));
            Pin::new(&mut sleep).reset(at.into());
            if sleep.deadline() != at {
                violation(format!(
                    "Sleep::reset({at:?}) but deadline() = {:?}",
                    sleep.deadline()
                ));
            }
            (&mut sleep).await;
            check_complete("re-armed sleep", Some(at), sleep.refused().is_some());
        }
        5 => {
            // Armed and dropped while pending.
            let mut sleep = timer.sleep(Duration::from_micros(rng.range(100..=50_000)));
            let _ = poll_once(&mut sleep).await;
            drop(sleep);
        }
        6 => {
            let period = Duration::from_micros(rng.range(1_000..=5_000));
            let mut interval = timer.interval(period);
            let mut last: Option<Instant> = None;
            for _ in 0..rng.range(2..=4) {
                let due = interval.tick().await;
                if !interval.is_shut_down() && Instant::now() < due {
                    violation(format!(
                        "an interval tick due at {due:?} completed {} µs early",
                        (due - Instant::now()).as_micros()
                    ));
                }
                if last.is_some_and(|last| due <= last) {
                    violation(format!(
                        "interval ticks not increasing: {last:?} then {due:?}"
                    ));
                }
                last = Some(due.into_std());
            }
        }
        _ => {
            // Several sleeps at once, each checked.
            let before = Instant::now();
            let mut sleeps: Vec<(Duration, Sleep)> = (0..rng.range(2..=8))
                .map(|_| {
                    let delay = Duration::from_micros(rng.range(0..=8_000));
                    (delay, timer.sleep(delay))
                })
                .collect();
            std::future::poll_fn(|cx| {
                sleeps.retain_mut(|(delay, sleep)| {
                    if Pin::new(&mut *sleep).poll(cx).is_ready() {
                        check_complete(
                            "one of several sleeps",
                            before.checked_add(*delay),
                            sleep.refused().is_some(),
                        );
                        false
                    } else {
                        true
                    }
                });
                if sleeps.is_empty() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
        }
    }
}

/// The tokio load: up to 32 tasks of [`future_op`] at a time on a 2-worker runtime.
pub(super) fn tokio_load(
    timer: ShardedTimer,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    seed: u64,
) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("chaos-tokio")
        .enable_time()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        let mut k = 0u64;
        // ORDERING: Relaxed: a stop flag.
        while !stop.load(Ordering::Relaxed) {
            while tasks.len() < 32 {
                k += 1;
                tasks.spawn(future_op(timer.clone(), shared.clone(), seed ^ (k << 20)));
            }
            if let Some(Err(error)) = tasks.join_next().await {
                violation(format!("a tokio task failed: {error}"));
            }
            bump(Op::TokioFuture);
        }
        while let Some(result) = tasks.join_next().await {
            if let Err(error) = result {
                violation(format!("a tokio task failed: {error}"));
            }
            bump(Op::TokioFuture);
        }
    });
}
