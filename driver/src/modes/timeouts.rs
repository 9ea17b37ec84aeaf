//! `--compare`'s async section (issue 21): timeouts as async servers use them. On a
//! tokio multi-thread runtime (one worker per core), 1,000 tasks each await 1,000
//! `timeout(1 s, f)` in turn — no task per timer, each timeout created, polled and
//! dropped as its users write it — in two shapes:
//!
//! - **pending once**: `f` is pending at the first poll and ready at the second (the
//!   response arrived in time): the timer is armed, then cancelled by the drop;
//! - **ready**: `f` is ready at the first poll: no timer is needed at all.
//!
//! Peers: `tokio::time::timeout`; Cloudflare's `pingora-timeout` (`fast_timeout`:
//! lazy registration, deadlines rounded up to 10 ms and shared); sharded-timer's
//! `timer.timeout` on a service with inline callbacks (what the docs tell an
//! async-only program to pick). Rate is timeouts per wall second; CPU ns per timeout
//! is the process's CPU time (every thread) over the run, per timeout.

#![forbid(unsafe_code)]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use serde::Serialize;
use sharded_timer::{Callbacks, ShardedTimer};

use crate::report::{cpu_seconds, median_by};

/// Tasks on the runtime.
const TASKS: usize = 1_000;
/// Timeouts each task awaits, one after the other.
const PER_TASK: usize = 1_000;
/// Every timeout's duration: none elapses.
const TIMEOUT: Duration = Duration::from_secs(1);

/// The timeouts compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peer {
    /// `timer.timeout` on sharded-timer, inline callbacks.
    Ours,
    /// `tokio::time::timeout`.
    Tokio,
    /// `pingora_timeout::fast_timeout::fast_timeout`.
    Pingora,
}

impl Peer {
    /// Every peer, ours first.
    pub(crate) const ALL: [Peer; 3] = [Peer::Ours, Peer::Tokio, Peer::Pingora];

    /// Its name in the report (and in `--peers`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Peer::Ours => "sharded-timer",
            Peer::Tokio => "tokio-timeout",
            Peer::Pingora => "pingora",
        }
    }

    /// The peer named `name`, if any.
    pub(crate) fn named(name: &str) -> Option<Peer> {
        Peer::ALL.into_iter().find(|peer| peer.name() == name)
    }
}

/// The inner future's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Pending at the first poll (waking itself), ready at the second.
    PendingOnce,
    /// Ready at the first poll.
    Ready,
}

/// The inner future: a reply that arrives one scheduling round later, or at once.
#[derive(Debug)]
struct Reply {
    /// Polls left before it is ready.
    pending_polls: u8,
}

impl Future for Reply {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.pending_polls == 0 {
            return Poll::Ready(());
        }
        self.pending_polls -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Shape {
    /// Both shapes, in the report's order.
    pub(crate) const ALL: [Shape; 2] = [Shape::PendingOnce, Shape::Ready];

    /// Its name in `--cold-cell` (after `async-`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Shape::PendingOnce => "pending",
            Shape::Ready => "ready",
        }
    }

    /// The shape named `name`, if any.
    pub(crate) fn named(name: &str) -> Option<Shape> {
        Shape::ALL.into_iter().find(|shape| shape.name() == name)
    }

    /// A fresh inner future of this shape.
    fn reply(self) -> Reply {
        Reply {
            pending_polls: match self {
                Shape::PendingOnce => 1,
                Shape::Ready => 0,
            },
        }
    }
}

/// One peer's figures: timeouts per second and CPU ns per timeout, per shape.
#[derive(Debug, Serialize)]
pub(crate) struct TimeoutRow {
    /// The peer.
    pub(crate) peer: &'static str,
    /// Pending once, then ready: timeouts/s, CPU ns per timeout (the median round).
    pub(crate) pending_once: (f64, f64),
    /// Ready at the first poll: timeouts/s, CPU ns per timeout (the median round).
    pub(crate) ready: (f64, f64),
    /// Every round of `pending_once`, in round order.
    pub(crate) pending_once_rounds: Vec<(f64, f64)>,
    /// Every round of `ready`, in round order.
    pub(crate) ready_rounds: Vec<(f64, f64)>,
    /// Timeouts that elapsed (none should: every reply is ready within two polls),
    /// over every round: pending once, then ready.
    pub(crate) timed_out: (u64, u64),
    /// Why a round gave no figures (its fresh process failed), pending once then
    /// ready, if one did.
    pub(crate) failure: (Option<String>, Option<String>),
}

/// The async section in the users' conditions: every round of every peer in a fresh
/// process (`--cold-cell`), quiet, then beside busy loops.
#[derive(Debug, Serialize)]
pub(crate) struct UsersTimeouts {
    /// Busy-loop threads beside the busy rows.
    pub(crate) loops: usize,
    /// Quiet.
    pub(crate) quiet: Vec<TimeoutRow>,
    /// Beside the busy loops.
    pub(crate) busy: Vec<TimeoutRow>,
}

/// One run's figures: (timeouts/s, CPU ns per timeout) and the timeouts that
/// elapsed, or why the run gave none.
type Sample = Result<((f64, f64), u64), String>;

/// Runs `TASKS × PER_TASK` timeouts of `shape` on `peer`; returns (timeouts/s, CPU ns
/// per timeout) and the timeouts that elapsed.
pub(crate) fn run_once(peer: Peer, shape: Shape) -> ((f64, f64), u64) {
    let workers = std::thread::available_parallelism().map_or(2, usize::from);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_time()
        .thread_name("timeouts-rt")
        .build()
        .expect("a tokio runtime");
    let timer = ShardedTimer::builder()
        .callbacks(Callbacks::inline())
        .thread_name("timeouts")
        .build()
        .expect("sharded-timer starts");
    let total = TASKS * PER_TASK;
    let elapsed_timeouts = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let cpu_before = cpu_seconds();
    let start = Instant::now();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let timer = timer.clone();
                let elapsed_timeouts = elapsed_timeouts.clone();
                tokio::spawn(async move {
                    for _ in 0..PER_TASK {
                        let in_time = match peer {
                            Peer::Ours => timer.timeout(TIMEOUT, shape.reply()).await.is_ok(),
                            Peer::Tokio => {
                                tokio::time::timeout(TIMEOUT, shape.reply()).await.is_ok()
                            }
                            Peer::Pingora => {
                                pingora_timeout::fast_timeout::fast_timeout(TIMEOUT, shape.reply())
                                    .await
                                    .is_ok()
                            }
                        };
                        if !in_time {
                            // ORDERING: Relaxed: a count read after every task joined.
                            elapsed_timeouts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("a task");
        }
    });
    let elapsed = start.elapsed();
    let cpu_ns = match (cpu_before, cpu_seconds()) {
        (Some(before), Some(after)) => (after - before) * 1e9 / total as f64,
        _ => f64::NAN,
    };
    drop(runtime);
    drop(timer.shutdown());
    // ORDERING: Relaxed: every task has been joined (block_on returned).
    let timed_out = elapsed_timeouts.load(std::sync::atomic::Ordering::Relaxed);
    ((total as f64 / elapsed.as_secs_f64(), cpu_ns), timed_out)
}

/// Runs every peer named in `only` (all if empty), `rounds` interleaved rounds per
/// shape, in this process, and keeps each figure's median round.
pub(crate) fn run(rounds: usize, only: &[String], quiet: bool) -> Vec<TimeoutRow> {
    let rows = rows(rounds, only, |peer, shape| Ok(run_once(peer, shape)));
    if !quiet {
        print(&rows, rounds, "warm, in this process");
    }
    rows
}

/// [`run`] in the users' conditions: each run in a fresh process, quiet, then beside
/// busy loops.
pub(crate) fn run_users(rounds: usize, only: &[String], quiet: bool) -> UsersTimeouts {
    let cold = || rows(rounds, only, crate::modes::conditions::cold_timeout);
    let quiet_rows = cold();
    let (loops, busy_rows) = crate::modes::conditions::beside_busy_loops(cold);
    if !quiet {
        print(&quiet_rows, rounds, "a fresh process per run, quiet");
        print(
            &busy_rows,
            rounds,
            &format!("a fresh process per run, beside {loops} busy loops"),
        );
    }
    UsersTimeouts {
        loops,
        quiet: quiet_rows,
        busy: busy_rows,
    }
}

/// Every peer named in `only` (all if empty), `rounds` interleaved rounds per shape,
/// each measured by `sample`; each figure's median round.
fn rows(rounds: usize, only: &[String], sample: impl Fn(Peer, Shape) -> Sample) -> Vec<TimeoutRow> {
    // pingora's fast_timeout hands durations above a threshold (15 min by default) to
    // tokio: 1 s stays on its own timer, as in the proxies it was written for.
    debug_assert!(TIMEOUT < pingora_timeout::fast_timeout::DEFAULT_FAST_TIMEOUT_TO_TOKIO_THRESHOLD);
    let peers: Vec<Peer> = Peer::ALL
        .into_iter()
        .filter(|peer| only.is_empty() || only.iter().any(|name| name == peer.name()))
        .collect();
    let mut samples: Vec<[Vec<(f64, f64)>; 2]> =
        peers.iter().map(|_| [Vec::new(), Vec::new()]).collect();
    let mut timed_out: Vec<[u64; 2]> = peers.iter().map(|_| [0, 0]).collect();
    let mut failures: Vec<[Vec<String>; 2]> =
        peers.iter().map(|_| [Vec::new(), Vec::new()]).collect();
    for _ in 0..rounds.max(1) {
        for (index, &peer) in peers.iter().enumerate() {
            for (column, shape) in Shape::ALL.into_iter().enumerate() {
                match sample(peer, shape) {
                    Ok((figures, elapsed)) => {
                        samples[index][column].push(figures);
                        timed_out[index][column] += elapsed;
                    }
                    Err(failure) => {
                        samples[index][column].push((f64::NAN, f64::NAN));
                        failures[index][column].push(failure);
                    }
                }
            }
        }
    }
    let joined = |failures: &[String]| (!failures.is_empty()).then(|| failures.join("; "));
    peers
        .iter()
        .zip(samples)
        .zip(timed_out)
        .zip(failures)
        .map(
            |(
                ((peer, [pending_once, ready]), [late_once, late_ready]),
                [fail_once, fail_ready],
            )| {
                TimeoutRow {
                    peer: peer.name(),
                    pending_once: median_by(pending_once.clone(), |sample| sample.0),
                    ready: median_by(ready.clone(), |sample| sample.0),
                    pending_once_rounds: pending_once,
                    ready_rounds: ready,
                    timed_out: (late_once, late_ready),
                    failure: (joined(&fail_once), joined(&fail_ready)),
                }
            },
        )
        .collect()
}

/// Prints the section's table and a verdict line.
fn print(rows: &[TimeoutRow], rounds: usize, condition: &str) {
    println!(
        "\nasync timeouts ({condition}): {TASKS} tokio tasks × {PER_TASK} timeout(1 s, f) each, {} workers; M timeouts/s and CPU ns per timeout (median of {rounds} interleaved rounds); ratio = sharded-timer / peer",
        std::thread::available_parallelism().map_or(2, usize::from)
    );
    println!(
        "{:<16} {:>12} {:>8} {:>10}   {:>12} {:>8} {:>10}",
        "peer", "pending once", "ratio", "CPU ns", "ready", "ratio", "CPU ns"
    );
    let Some(ours) = rows.first() else { return };
    for row in rows {
        println!(
            "{:<16} {:>10.2} M {:>7.2}x {:>10.0}   {:>10.2} M {:>7.2}x {:>10.0}",
            row.peer,
            row.pending_once.0 / 1e6,
            ours.pending_once.0 / row.pending_once.0,
            row.pending_once.1,
            row.ready.0 / 1e6,
            ours.ready.0 / row.ready.0,
            row.ready.1,
        );
    }
    for row in rows {
        if row.timed_out != (0, 0) {
            println!(
                "{}: FAILED RUN: {} + {} timeouts elapsed around replies ready within two polls",
                row.peer, row.timed_out.0, row.timed_out.1
            );
        }
        for failure in [&row.failure.0, &row.failure.1].into_iter().flatten() {
            println!("{}: FAILED RUN: {failure}", row.peer);
        }
    }
}
