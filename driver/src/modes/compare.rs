//! `--compare`: the same workloads, in one process run, on sharded-timer and its
//! peers (`benches/peers/`), with ratios: `rpc` and `burst` against each peer, with lateness
//! percentiles (p50/p99/p999/max, µs), early fires, and exact bytes per pending timer
//! (a counting global allocator, not RSS).
//!
//! Producer threads are pinned one per core, for every peer alike, in these classic
//! rows; the users' rows ([`UsersRows`]) run rpc, burst and firehose again each in a
//! fresh process, producers unpinned, callbacks boxed, quiet and beside busy loops.
//!
//! - rpc: 2 producers, 1 M requests with a 300 ms timeout on top of 1 M pending
//!   timers; each request is answered (cancelled) 1024 requests later, 97 % of the time.
//! - burst: 1 M timers due at the same instant; drain rate = timers / time from the
//!   deadline to the last callback.
//! - schedule, schedule+cancel: 1 M timers (delays 1 s..60 s) from 1, 2 and 8
//!   producer threads, each keeping its handles; with cancel, each timer is cancelled
//!   right after it is scheduled.
//! - memory: allocated bytes per pending timer for 1 M pending timers due in
//!   61-120 s (spread over slots and levels), the caller
//!   keeping its handle (each peer's own handle type), minus the 16-byte closure each
//!   captures.
//!
//! tokio runs as its users write timeouts: `tokio` is one `tokio::time::sleep` per
//! timer and `tokio-timeout` one `tokio::time::timeout` around a request, each
//! registered where it is created and dropped to cancel (`peers/tokio_timer.rs`).
//!
//! Each workload runs 3 rounds over all peers, interleaved, and reports each peer's
//! median round with the range (the shared machine's speed drifts within a run).
//!
//! Run: `cargo run --release -- --compare` (`--peers a,b`, `--rounds n`).
//! Tick: 1 ms for every peer.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::modes::conditions::{self, ConditionsReport};
use crate::peers::{self, fill, Handle, Kind};
use crate::report::median_by;
use crate::tracker::Tracker;

const REQUESTS: usize = 1_000_000;
const BACKGROUND: usize = 1_000_000;
const BURST: usize = 1_000_000;
const FIREHOSE: usize = 1_000_000;
const WINDOW: usize = 1024;
const TIMEOUT: Duration = Duration::from_millis(300);

/// Every round's rate and CPU ns per operation, in round order.
pub(crate) type Rounds = Vec<(f64, f64)>;

/// One peer's figures in one workload. A fresh process's cell (`--cold-cell`) prints
/// it as JSON; the parent names the peer.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Row {
    /// The peer.
    #[serde(skip_deserializing)]
    pub(crate) peer: &'static str,
    /// Operations per second (the workload says which).
    pub(crate) rate: f64,
    /// Lateness p50, p99, p999 and max, µs.
    pub(crate) lateness: [u64; 4],
    /// Early fires (must be 0).
    pub(crate) early: u64,
    /// Lowest..highest rate over the rounds, in millions.
    pub(crate) spread: String,
    /// Process CPU time (every thread, `CLOCK_PROCESS_CPUTIME_ID`) per operation, ns.
    pub(crate) cpu_ns_per_op: f64,
    /// Timers that should have fired and had not when the wait for them ended (must
    /// be 0), summed over the rounds.
    pub(crate) lost: u64,
    /// Every round's rate and CPU ns per operation, in round order.
    pub(crate) rounds: Rounds,
    /// Why a round's measurement gave no figures (its process failed), if one did.
    #[serde(default)]
    pub(crate) failure: Option<String>,
}

impl Row {
    /// A peer's row: its rate, and lateness percentiles and early fires from its
    /// tracker.
    fn new(
        kind: Kind,
        (rate, cpu_ns_per_op): (f64, f64),
        histogram: &Histogram<u64>,
        tracker: &Tracker,
    ) -> Row {
        Row {
            peer: kind.name(),
            rate,
            cpu_ns_per_op,
            lateness: [
                histogram.value_at_quantile(0.5),
                histogram.value_at_quantile(0.99),
                histogram.value_at_quantile(0.999),
                histogram.max(),
            ],
            early: tracker.violations().0,
            spread: String::new(),
            lost: 0,
            rounds: Vec::new(),
            failure: None,
        }
    }

    /// The row of a round whose measurement gave no figures: NaN rates, and why.
    pub(crate) fn failed_round(kind: Kind, failure: String) -> Row {
        Row {
            peer: kind.name(),
            rate: f64::NAN,
            lateness: [0; 4],
            early: 0,
            spread: String::new(),
            cpu_ns_per_op: f64::NAN,
            lost: 0,
            rounds: Vec::new(),
            failure: Some(failure),
        }
    }
}

impl Row {
    /// Whether the peer's own run failed: a timer fired early, one due had not
    /// fired when the wait for it ended, or a round's process failed.
    pub(crate) fn failed(&self) -> bool {
        self.early > 0 || self.lost > 0 || self.failure.is_some()
    }
}

/// The timer workloads that have lateness: rpc, burst and firehose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimerWorkload {
    /// Request timeouts on top of 1 M pending ([`rpc`]).
    Rpc,
    /// 1 M timers due at one instant ([`burst`]).
    Burst,
    /// 1 M timers from 2 producers without pause ([`firehose`]).
    Firehose,
}

impl TimerWorkload {
    /// Every one, in the report's order.
    pub(crate) const ALL: [TimerWorkload; 3] = [
        TimerWorkload::Rpc,
        TimerWorkload::Burst,
        TimerWorkload::Firehose,
    ];

    /// Its name (in `--cold-cell` and the report).
    pub(crate) fn name(self) -> &'static str {
        match self {
            TimerWorkload::Rpc => "rpc",
            TimerWorkload::Burst => "burst",
            TimerWorkload::Firehose => "firehose",
        }
    }

    /// What one operation of its rate is.
    pub(crate) fn unit(self) -> &'static str {
        match self {
            TimerWorkload::Rpc => "pairs/s",
            TimerWorkload::Burst => "fired/s",
            TimerWorkload::Firehose => "timers/s",
        }
    }

    /// The one named `name`, if any.
    pub(crate) fn named(name: &str) -> Option<TimerWorkload> {
        TimerWorkload::ALL.into_iter().find(|w| w.name() == name)
    }

    /// Measures it once on a fresh `kind`: producers pinned and callbacks plain
    /// closures (the classic rows), or unpinned with boxed callbacks (`users`).
    /// firehose's producers are always unpinned and its callbacks boxed.
    pub(crate) fn measure(self, kind: Kind, users: bool) -> Row {
        let shape = if users {
            Shape::USERS
        } else {
            Shape::PINNED_EMPTY
        };
        match self {
            TimerWorkload::Rpc => rpc(kind, shape),
            TimerWorkload::Burst => burst(kind, shape),
            TimerWorkload::Firehose => firehose(kind),
        }
    }
}

/// Schedules `callback` on `peer`, boxed as a `Box<dyn FnOnce() + Send>` where
/// `shape` says so (the common shape in users' code).
fn schedule_shaped(
    peer: &peers::Peer,
    delay: Duration,
    shape: Shape,
    callback: impl FnOnce() + Send + 'static,
) -> Handle {
    if shape.boxed {
        let boxed: Box<dyn FnOnce() + Send> = Box::new(callback);
        peer.schedule(delay, boxed)
    } else {
        peer.schedule(delay, callback)
    }
}

fn rpc(kind: Kind, shape: Shape) -> Row {
    let peer = kind.start();
    let background = fill(&peer, BACKGROUND, 2);
    let tracker = Tracker::leak(REQUESTS, Instant::now(), Duration::ZERO);
    let abandoned = AtomicU64::new(0);
    let cpu = CpuMeter::start();
    let start = Instant::now();
    // Handles of requests left to time out, kept until they fired: dropping a tokio
    // future cancels it, so every peer keeps them alike.
    let kept: Vec<Vec<(usize, Handle)>> = on_producers(2, shape.pinned, |producer| {
        let mut kept = Vec::new();
        let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ (producer as u64 + 1);
        let mut window: std::collections::VecDeque<(usize, Handle)> = Default::default();
        let per = REQUESTS / 2;
        for index in producer * per..(producer + 1) * per {
            let deadline = Instant::now() + TIMEOUT;
            let handle = schedule_shaped(&peer, TIMEOUT, shape, move || {
                tracker.record(index, deadline)
            });
            window.push_back((index, handle));
            if window.len() > WINDOW {
                let (index, handle) = window.pop_front().unwrap();
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                if rng % 100 < 97 {
                    peer.cancel(&handle);
                } else {
                    abandoned.fetch_add(1, Ordering::Relaxed);
                    kept.push((index, handle));
                }
            }
        }
        for (_, handle) in window {
            peer.cancel(&handle);
        }
        kept
    });
    let elapsed = start.elapsed();
    let expected = abandoned.load(Ordering::Relaxed);
    // Wait for the abandoned requests' timeouts, without a scan of every request's
    // slot that would compete with the peer for the cores while they fire.
    let abandoned_at: Vec<usize> = kept.iter().flatten().map(|&(index, _)| index).collect();
    tracker.wait_fired_at(&abandoned_at, TIMEOUT + Duration::from_secs(20));
    // The requests' CPU, the timeouts that fired included.
    let cpu_ns = cpu.ns_per(REQUESTS);
    let (histogram, fired) = tracker.lateness();
    drop(kept);
    drop(background);
    drop(peer);
    let mut row = Row::new(
        kind,
        (REQUESTS as f64 / elapsed.as_secs_f64(), cpu_ns),
        &histogram,
        tracker,
    );
    row.lost = expected.saturating_sub(fired);
    row
}

/// Runs `work(producer)` on `count` producer threads at once, each pinned
/// ([`peers::pin_producer`]) if `pinned`, and returns what each returned, in
/// producer order.
fn on_producers<T: Send>(count: usize, pinned: bool, work: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|scope| {
        let producers: Vec<_> = (0..count)
            .map(|producer| {
                let work = &work;
                scope.spawn(move || {
                    if pinned {
                        peers::pin_producer(producer);
                    }
                    work(producer)
                })
            })
            .collect();
        producers
            .into_iter()
            .map(|p| p.join().expect("producer"))
            .collect()
    })
}

fn burst(kind: Kind, shape: Shape) -> Row {
    let peer = kind.start();
    let tracker = Tracker::leak(BURST, Instant::now(), Duration::ZERO);
    let cpu = CpuMeter::start();
    let deadline = Instant::now() + Duration::from_millis(1_500);
    // Handles are kept until the timers fired (dropping a tokio future cancels it).
    // Each producer takes one contiguous half of the tracker's slots: a peer that
    // fires on several threads (one per producer's core) then writes disjoint cache
    // lines of the tracker, as the single-threaded peers do, instead of sharing each
    // line of eight slots between its threads (interleaved halves cost every fire a
    // line transfer between cores: measured in the drain, not in the timer).
    let kept: Vec<Vec<Handle>> = on_producers(2, shape.pinned, |producer| {
        let mut kept = Vec::with_capacity(BURST / 2 + 1);
        for index in producer * BURST / 2..(producer + 1) * BURST / 2 {
            let delay = deadline.saturating_duration_since(Instant::now());
            kept.push(schedule_shaped(&peer, delay, shape, move || {
                tracker.record(index, deadline)
            }));
        }
        kept
    });
    tracker.wait_settled(Duration::from_secs(60));
    // Per timer: scheduling it and firing it (and the idle wait for the deadline).
    let cpu_ns = cpu.ns_per(BURST);
    let (histogram, fired) = tracker.lateness();
    drop(kept);
    drop(peer);
    let drain = Duration::from_micros(histogram.max().max(1));
    let mut row = Row::new(
        kind,
        (fired as f64 / drain.as_secs_f64(), cpu_ns),
        &histogram,
        tracker,
    );
    row.lost = (BURST as u64).saturating_sub(fired);
    row
}

/// firehose: 2 producer threads, not pinned, schedule `FIREHOSE` timers due uniformly
/// 10-1000 ms ahead as fast as they can (no pause), each callback a boxed closure
/// with a 16-byte capture and more; lateness of every timer, those that come due while
/// the producers still file among them (issue 41: expiry must not wait for the
/// firehose to end). Rate: timers scheduled per second.
fn firehose(kind: Kind) -> Row {
    let peer = kind.start();
    let tracker = Tracker::leak(FIREHOSE, Instant::now(), Duration::ZERO);
    let cpu = CpuMeter::start();
    let start = Instant::now();
    let kept: Vec<Vec<Handle>> = std::thread::scope(|scope| {
        let peer = &peer;
        let producers: Vec<_> = (0..2)
            .map(|producer| {
                scope.spawn(move || {
                    let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ (producer as u64 + 1);
                    let mut kept = Vec::with_capacity(FIREHOSE / 2);
                    for index in producer * FIREHOSE / 2..(producer + 1) * FIREHOSE / 2 {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let delay = Duration::from_micros(10_000 + rng % 990_000);
                        let deadline = Instant::now() + delay;
                        let callback: Box<dyn FnOnce() + Send> =
                            Box::new(move || tracker.record(index, deadline));
                        kept.push(peer.schedule(delay, callback));
                    }
                    kept
                })
            })
            .collect();
        producers
            .into_iter()
            .map(|p| p.join().expect("producer"))
            .collect()
    });
    let filing = start.elapsed();
    tracker.wait_settled(Duration::from_secs(60));
    let cpu_ns = cpu.ns_per(FIREHOSE);
    let (histogram, fired) = tracker.lateness();
    drop(kept);
    drop(peer);
    let mut row = Row::new(
        kind,
        (FIREHOSE as f64 / filing.as_secs_f64(), cpu_ns),
        &histogram,
        tracker,
    );
    row.lost = (FIREHOSE as u64).saturating_sub(fired);
    row
}

/// Allocated bytes per pending timer, **the caller keeping its handle**, for each of
/// `kinds`: see [`bytes_per_pending`]. Measured first thing in a run, on a fresh
/// thread, with every peer's timers kept until all are measured: sharded-timer's
/// entry pool keeps freed memory for reuse, so a peer measured after other timers
/// of the process were freed would be counted only for what it could not reuse.
fn memory_of(kinds: &[Kind]) -> Vec<(&'static str, f64, usize)> {
    std::thread::spawn({
        let kinds = kinds.to_vec();
        move || {
            let mut kept = Vec::new();
            let memory = kinds
                .iter()
                .map(|&kind| {
                    let (bytes, peer) = bytes_per_pending(kind);
                    kept.push(peer);
                    (kind.name(), bytes, kind.handle_size())
                })
                .collect();
            drop(kept);
            memory
        }
    })
    .join()
    .expect("the memory measurement")
}

/// Allocated bytes per pending timer, **the caller keeping its handle**: the peer's
/// allocations for 1 M pending timers plus the size of the handle each caller keeps
/// (the handles' own vector is allocated before the count starts), minus the
/// 16-byte closure each captures. Returns the peer and its handles, to be dropped
/// when the caller is done measuring.
fn bytes_per_pending(kind: Kind) -> (f64, (peers::Peer, Vec<Handle>)) {
    let peer = kind.start();
    let tracker = Tracker::leak(0, Instant::now(), Duration::ZERO);
    let mut handles: Vec<Handle> = Vec::with_capacity(BACKGROUND);
    let before = crate::alloc::allocated();
    for index in 0..BACKGROUND {
        // Deadlines spread over 61-120 s, so that timers sit in many slots and in
        // more than one wheel level, as a service's do; a 16-byte closure (a
        // reference and an index, as in the driver).
        let delay = Duration::from_secs(60) + peers::spread_delay(index as u64);
        handles.push(peer.schedule(delay, move || {
            let _ = (tracker, index);
        }));
    }
    // Let the peers' own threads take the timers in.
    std::thread::sleep(Duration::from_millis(500));
    let bytes = crate::alloc::allocated().saturating_sub(before) as f64 / BACKGROUND as f64;
    (bytes + kind.handle_size() as f64 - 16.0, (peer, handles))
}

/// Schedules `TIMERS` timers (delays spread over 1 s..60 s) from `threads` producer
/// threads, each keeping its handles, and, with `cancel`, cancels each right after
/// scheduling it. Returns timers (pairs) per second, and the process's CPU time per
/// timer (pair) in ns over the same window (every thread: the peer's own included).
pub(crate) fn schedule_rate(kind: Kind, threads: usize, cancel: bool) -> (f64, f64) {
    schedule_rate_on(&kind.start(), threads, cancel)
}

/// [`schedule_rate`] on a running peer, which it drops at the end.
pub(crate) fn schedule_rate_on(peer: &peers::Peer, threads: usize, cancel: bool) -> (f64, f64) {
    schedule_rate_shaped(peer, threads, cancel, Shape::PINNED_EMPTY)
}

/// How [`schedule_rate_shaped`]'s producers run and what they schedule.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// Each producer pinned to its own core ([`peers::pin_producer`]); else where the
    /// OS puts it, as a runtime's workers are.
    pub(crate) pinned: bool,
    /// Each callback a `Box<dyn FnOnce() + Send>` with a 16-byte capture, made per
    /// timer by the producer (the common shape in users' code); else an empty closure.
    pub(crate) boxed: bool,
    /// The window closes when every timer is in the peer's wheel
    /// ([`peers::Peer::wait_taken_in`]), not when the last producer returns.
    pub(crate) taken_in: bool,
}

impl Shape {
    /// The classic columns: pinned producers, empty closures.
    pub(crate) const PINNED_EMPTY: Shape = Shape {
        pinned: true,
        boxed: false,
        taken_in: false,
    };
    /// The users' conditions: unpinned producers, boxed closures, the window closed
    /// when the peer has every timer in its wheel.
    pub(crate) const USERS: Shape = Shape {
        pinned: false,
        boxed: true,
        taken_in: true,
    };
}

/// [`schedule_rate_on`] with producers and callbacks as `shape` says.
pub(crate) fn schedule_rate_shaped(
    peer: &peers::Peer,
    threads: usize,
    cancel: bool,
    shape: Shape,
) -> (f64, f64) {
    const TIMERS: usize = 1_000_000;
    let per = TIMERS / threads;
    let barrier = std::sync::Barrier::new(threads + 1);
    let elapsed = std::thread::scope(|scope| {
        let producers: Vec<_> = (0..threads)
            .map(|producer| {
                let barrier = &barrier;
                scope.spawn(move || {
                    if shape.pinned {
                        peers::pin_producer(producer);
                    }
                    let mut kept = Vec::with_capacity(if cancel { 0 } else { per });
                    barrier.wait();
                    for i in 0..per {
                        let index = producer * per + i;
                        let delay = peers::spread_delay(index as u64);
                        let handle = if shape.boxed {
                            let capture = (index as u64, producer as u64);
                            let callback: Box<dyn FnOnce() + Send> = Box::new(move || {
                                std::hint::black_box(capture);
                            });
                            peer.schedule(delay, callback)
                        } else {
                            peer.schedule(delay, || {})
                        };
                        if cancel {
                            peer.cancel(&handle);
                        } else {
                            kept.push(handle);
                        }
                    }
                    barrier.wait();
                    kept
                })
            })
            .collect();
        barrier.wait();
        let cpu = CpuMeter::start();
        let start = Instant::now();
        barrier.wait();
        if shape.taken_in {
            assert!(
                peer.wait_taken_in((per * threads) as u64, Duration::from_secs(60)),
                "the peer had not taken its timers in 60 s after the producers ended"
            );
        }
        let elapsed = start.elapsed();
        let cpu_ns = cpu.ns_per(per * threads);
        for producer in producers {
            drop(producer.join().expect("producer"));
        }
        (elapsed, cpu_ns)
    });
    let (elapsed, cpu_ns) = elapsed;
    ((per * threads) as f64 / elapsed.as_secs_f64(), cpu_ns)
}

/// The process's CPU time (every thread) since `start`, per operation.
struct CpuMeter(Option<f64>);

impl CpuMeter {
    fn start() -> CpuMeter {
        CpuMeter(crate::report::cpu_seconds())
    }

    /// CPU ns per operation for `ops` operations since `start`; NaN where the
    /// platform gives no process CPU time.
    fn ns_per(&self, ops: usize) -> f64 {
        match (self.0, crate::report::cpu_seconds()) {
            (Some(start), Some(now)) => (now - start) * 1e9 / ops as f64,
            _ => f64::NAN,
        }
    }
}

/// Runs `workload` for every peer `rounds` times, interleaved, and keeps for each
/// peer the round with the median rate (the early count is summed over all rounds).
fn median_rows(kinds: &[Kind], rounds: usize, workload: impl Fn(Kind) -> Row) -> Vec<Row> {
    let mut runs: Vec<Vec<Row>> = kinds.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds.max(1) {
        for (i, &kind) in kinds.iter().enumerate() {
            runs[i].push(workload(kind));
        }
    }
    runs.into_iter()
        .map(|rows| {
            let early = rows.iter().map(|r| r.early).sum();
            let lost = rows.iter().map(|r| r.lost).sum();
            let failures: Vec<&str> = rows.iter().filter_map(|r| r.failure.as_deref()).collect();
            let failure = (!failures.is_empty()).then(|| failures.join("; "));
            let rounds = rows.iter().map(|r| (r.rate, r.cpu_ns_per_op)).collect();
            let (low, high) = rows
                .iter()
                .fold((f64::INFINITY, 0.0f64), |(low, high), row| {
                    (low.min(row.rate), high.max(row.rate))
                });
            let spread = format!("{:.2}..{:.2}", low / 1e6, high / 1e6);
            let mut median = median_by(rows, |row| row.rate);
            median.early = early;
            median.lost = lost;
            median.failure = failure;
            median.rounds = rounds;
            median.spread = spread;
            median
        })
        .collect()
}

fn print(title: &str, unit: &str, rows: &[Row]) {
    let ours = rows[0].rate;
    println!("\n{title}");
    println!(
        "{:<18} {:>12} {:>8} {:>13} {:>10} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "peer",
        unit,
        "ratio",
        "rounds (M)",
        "CPU ns/op",
        "p50 µs",
        "p99 µs",
        "p999 µs",
        "max µs",
        "early"
    );
    for row in rows {
        println!(
            "{:<18} {:>10.2} M {:>7.2}x {:>13} {:>10.0} {:>9} {:>9} {:>9} {:>9} {:>6}",
            row.peer,
            row.rate / 1e6,
            ours / row.rate,
            row.spread,
            row.cpu_ns_per_op,
            row.lateness[0],
            row.lateness[1],
            row.lateness[2],
            row.lateness[3],
            row.early
        );
    }
    println!(
        "{}",
        verdict(title.split(':').next().unwrap_or(title), rows)
    );
}

/// One line that says how sharded-timer (the first row) stood against each peer in a
/// workload: its rate and its CPU per operation as multiples of the peer's (rate > 1
/// and CPU < 1 are better), and a word for each: ahead, behind, or mixed.
fn verdict(workload: &str, rows: &[Row]) -> String {
    let ours = &rows[0];
    let against: Vec<String> = rows[1..]
        .iter()
        .map(|peer| {
            if peer.failed() {
                return format!(
                    "no ratio against {}: its run failed ({} early, {} lost)",
                    peer.peer, peer.early, peer.lost
                );
            }
            let rate = ours.rate / peer.rate;
            let cpu = ours.cpu_ns_per_op / peer.cpu_ns_per_op;
            let standing = match (rate >= 1.0, cpu <= 1.0) {
                (true, true) => "ahead of",
                (false, false) => "behind",
                _ => "mixed against",
            };
            format!(
                "{standing} {} ({rate:.2}x the rate, {cpu:.2}x the CPU per op)",
                peer.peer
            )
        })
        .collect();
    if ours.failed() {
        return format!(
            "verdict, {workload}: none: {}'s own run failed ({} early, {} lost)",
            ours.peer, ours.early, ours.lost
        );
    }
    format!(
        "verdict, {workload}: {} is {}",
        ours.peer,
        against.join("; ")
    )
}

/// Everything `--compare` measured.
#[derive(Debug, Serialize)]
pub(crate) struct CompareReport {
    /// Rounds per figure (each the median).
    pub(crate) rounds: usize,
    /// rpc: schedule+cancel pairs/s with 1 M pending; lateness of the timeouts.
    pub(crate) rpc: Vec<Row>,
    /// burst: 1 M timers due together; fired/s over the drain, lateness.
    pub(crate) burst: Vec<Row>,
    /// firehose: 1 M timers due in 10-1000 ms from 2 unpinned producers without
    /// pause; timers scheduled/s, lateness of every timer.
    pub(crate) firehose: Vec<Row>,
    /// Producer threads of the schedule columns.
    pub(crate) producers: Vec<usize>,
    /// Per peer: schedule M/s at each producer count, then schedule+cancel.
    pub(crate) schedule: Vec<(&'static str, Vec<f64>, Vec<f64>)>,
    /// Per peer: CPU ns per timer (pair) in the median round of each column above.
    pub(crate) schedule_cpu_ns: Vec<(&'static str, Vec<f64>, Vec<f64>)>,
    /// Per peer: allocated bytes per pending timer, handle kept, and handle bytes.
    pub(crate) memory: Vec<(&'static str, f64, usize)>,
    /// Per peer, per column (schedule at each producer count, then schedule+cancel):
    /// every round's timers (pairs) per second and CPU ns per timer, in round order.
    pub(crate) schedule_rounds: Vec<(&'static str, Vec<Rounds>)>,
    /// schedule and schedule+cancel in the users' conditions: a fresh process per
    /// cell, unpinned producers, boxed callbacks; quiet, then beside busy loops.
    pub(crate) conditions: ConditionsReport,
    /// rpc, burst and firehose again in the users' conditions, quiet and busy.
    pub(crate) users: UsersRows,
}

/// rpc, burst and firehose in the users' conditions, on sharded-timer and the
/// outside peers: each round of each peer in a fresh process of the driver
/// (`--cold-cell`), producers unpinned, callbacks boxed; quiet, then beside busy
/// loops (`conditions::beside_busy_loops`).
#[derive(Debug, Serialize)]
pub(crate) struct UsersRows {
    /// Busy-loop threads that ran beside the busy rows.
    pub(crate) loops: usize,
    /// Quiet.
    pub(crate) quiet: TimerRows,
    /// Beside the busy loops.
    pub(crate) busy: TimerRows,
}

/// rpc, burst and firehose rows, sharded-timer first in each.
#[derive(Debug, Serialize)]
pub(crate) struct TimerRows {
    /// As [`CompareReport::rpc`].
    pub(crate) rpc: Vec<Row>,
    /// As [`CompareReport::burst`].
    pub(crate) burst: Vec<Row>,
    /// As [`CompareReport::firehose`].
    pub(crate) firehose: Vec<Row>,
}

impl TimerRows {
    /// Every workload's rows, each on `kinds`, `rounds` interleaved, each round of
    /// each peer in a fresh process.
    fn cold(kinds: &[Kind], rounds: usize) -> TimerRows {
        let mut rows = TimerWorkload::ALL.into_iter().map(|workload| {
            median_rows(kinds, rounds, |kind| conditions::cold_row(workload, kind))
        });
        TimerRows {
            rpc: rows.next().expect("three workloads"),
            burst: rows.next().expect("three workloads"),
            firehose: rows.next().expect("three workloads"),
        }
    }

    /// Each workload's name and rows.
    pub(crate) fn each(&self) -> [(TimerWorkload, &Vec<Row>); 3] {
        [
            (TimerWorkload::Rpc, &self.rpc),
            (TimerWorkload::Burst, &self.burst),
            (TimerWorkload::Firehose, &self.firehose),
        ]
    }
}

/// Runs every workload on each peer named in `only` (all when empty), `rounds` times
/// interleaved, printing as it goes unless `quiet`.
pub(crate) fn run(rounds: usize, only: &[String], quiet: bool) -> CompareReport {
    let rounds = rounds.max(1);
    let kinds: Vec<Kind> = Kind::ALL
        .into_iter()
        .chain([Kind::TokioTimeout, Kind::ShardedInline, Kind::ShardedSpawn])
        .filter(|k| only.is_empty() || only.iter().any(|name| name == k.name()))
        .collect();
    let memory = memory_of(&kinds);
    let classic =
        |workload: TimerWorkload| median_rows(&kinds, rounds, |kind| workload.measure(kind, false));
    let rpc_rows = classic(TimerWorkload::Rpc);
    if !quiet {
        print(
            "rpc: schedule+cancel pairs/s (2 producers, 1 M pending), lateness of the 3 % that time out",
            "pairs/s",
            &rpc_rows,
        );
    }
    let burst_rows = classic(TimerWorkload::Burst);
    if !quiet {
        print(
            "burst: 1 M timers due together, drain rate",
            "fired/s",
            &burst_rows,
        );
    }
    let firehose_rows = classic(TimerWorkload::Firehose);
    if !quiet {
        print(
            "firehose: 1 M timers due in 10-1000 ms from 2 unpinned producers without pause, schedule rate; lateness of every timer",
            "timers/s",
            &firehose_rows,
        );
    }
    // The same three in the users' conditions: sharded-timer and the outside peers,
    // each round in a fresh process, quiet and then beside busy loops.
    let users_kinds: Vec<Kind> = [Kind::Sharded, Kind::Tokio, Kind::NettyStyle, Kind::Heap]
        .into_iter()
        .filter(|k| kinds.contains(k))
        .collect();
    let users_quiet = TimerRows::cold(&users_kinds, rounds);
    let (loops, users_busy) =
        conditions::beside_busy_loops(|| TimerRows::cold(&users_kinds, rounds));
    if !quiet {
        for (condition, rows) in ["quiet".to_owned(), format!("beside {loops} busy loops")]
            .iter()
            .zip([&users_quiet, &users_busy])
        {
            for (workload, rows) in rows.each() {
                print(
                    &format!(
                        "{}, cold, unpinned, boxed callbacks, {condition}",
                        workload.name()
                    ),
                    workload.unit(),
                    rows,
                );
            }
        }
    }
    let users = UsersRows {
        loops,
        quiet: users_quiet,
        busy: users_busy,
    };
    let producers = vec![1, 2, 8];
    let mut samples = vec![vec![Vec::new(); 2 * producers.len()]; kinds.len()];
    for _ in 0..rounds {
        for (k, &kind) in kinds.iter().enumerate() {
            for (c, cancel) in [false, true].into_iter().enumerate() {
                for (t, &threads) in producers.iter().enumerate() {
                    samples[k][c * producers.len() + t].push(schedule_rate(kind, threads, cancel));
                }
            }
        }
    }
    let mut schedule = Vec::new();
    let mut schedule_cpu_ns = Vec::new();
    let schedule_rounds = kinds
        .iter()
        .zip(&samples)
        .map(|(kind, columns)| (kind.name(), columns.clone()))
        .collect();
    for (kind, mut columns) in kinds.iter().zip(samples) {
        // Each column's median round: its rate (M/s) and its CPU ns per timer.
        let medians: Vec<(f64, f64)> = columns
            .iter_mut()
            .map(|column| {
                let (rate, cpu_ns) = median_by(std::mem::take(column), |round| round.0);
                (rate / 1e6, cpu_ns)
            })
            .collect();
        let (rates, cpu): (Vec<f64>, Vec<f64>) = medians.into_iter().unzip();
        let (plain, cancel) = rates.split_at(producers.len());
        schedule.push((kind.name(), plain.to_vec(), cancel.to_vec()));
        let (plain, cancel) = cpu.split_at(producers.len());
        schedule_cpu_ns.push((kind.name(), plain.to_vec(), cancel.to_vec()));
    }
    // The users' conditions: the outside peers, both sharded-timer placements, and
    // sharded-timer routing by id (issue 41: the routing's default is chosen here).
    let condition_kinds: Vec<Kind> = Kind::ALL
        .into_iter()
        .chain([Kind::ShardedById])
        .filter(|k| only.is_empty() || only.iter().any(|name| name == k.name()))
        .collect();
    let conditions = conditions::run(&condition_kinds, rounds, quiet);
    let report = CompareReport {
        conditions,
        users,
        rounds,
        rpc: rpc_rows,
        burst: burst_rows,
        firehose: firehose_rows,
        producers,
        schedule,
        schedule_cpu_ns,
        memory,
        schedule_rounds,
    };
    if !quiet {
        print_rest(&report);
    }
    report
}

/// Prints the schedule and memory tables and the early-fire total.
fn print_rest(report: &CompareReport) {
    let ours = &report.schedule[0];
    println!(
        "\nschedule and schedule+cancel, 1 M timers, M/s at {:?} producers (median of {} interleaved rounds); ratio = sharded-timer / peer; CPU ns/op = process CPU time (every thread) per timer (pair) in that median round",
        report.producers, report.rounds
    );
    for ((name, plain, cancel), (_, plain_cpu, cancel_cpu)) in
        report.schedule.iter().zip(&report.schedule_cpu_ns)
    {
        let cells = |mine: &[f64], theirs: &[f64]| -> String {
            mine.iter()
                .zip(theirs)
                .map(|(m, t)| format!("{m:>6.2} ({:>4.2}x)", t / m))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let cpu = |ns: &[f64]| -> String {
            ns.iter()
                .map(|ns| format!("{ns:>5.0}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "{name:<18} schedule: {}   schedule+cancel: {}   CPU ns/op: {} | {}",
            cells(plain, &ours.1),
            cells(cancel, &ours.2),
            cpu(plain_cpu),
            cpu(cancel_cpu)
        );
    }
    // One verdict line for each of the two workloads: rate and CPU as multiples of
    // each peer's, at each producer count.
    let ours_cpu = &report.schedule_cpu_ns[0];
    for (workload, column) in [("schedule", 1), ("schedule+cancel", 2)] {
        let mine = |(name, plain, cancel): &(&'static str, Vec<f64>, Vec<f64>)| {
            (
                *name,
                if column == 1 {
                    plain.clone()
                } else {
                    cancel.clone()
                },
            )
        };
        let (_, our_rates) = mine(ours);
        let (_, our_cpu) = mine(ours_cpu);
        let against: Vec<String> = report.schedule[1..]
            .iter()
            .zip(&report.schedule_cpu_ns[1..])
            .map(|(rates, cpu)| {
                let (name, rates) = mine(rates);
                let (_, cpu) = mine(cpu);
                let ratios = |ours: &[f64], theirs: &[f64]| -> String {
                    ours.iter()
                        .zip(theirs)
                        .map(|(o, t)| format!("{:.2}", o / t))
                        .collect::<Vec<_>>()
                        .join("/")
                };
                format!(
                    "vs {name}: {}x the rate, {}x the CPU per op",
                    ratios(&our_rates, &rates),
                    ratios(&our_cpu, &cpu)
                )
            })
            .collect();
        println!(
            "verdict, {workload} at {:?} producers: sharded-timer {}",
            report.producers,
            against.join("; ")
        );
    }
    println!("\nbytes per pending timer (1 M pending, the caller keeping its handle, excluding the 16-byte closure)");
    let our_bytes = report.memory[0].1;
    for (name, bytes, handle) in &report.memory {
        println!(
            "{name:<18} {bytes:>8.1}   (handle {handle} B; sharded-timer uses {:.2}x)",
            our_bytes / bytes
        );
    }
    let early = report.early();
    println!("\nearly fires across all peers: {early}");
}

impl CompareReport {
    /// Early fires in every workload and peer (must be 0).
    pub(crate) fn early(&self) -> u64 {
        let users = [&self.users.quiet, &self.users.busy]
            .into_iter()
            .flat_map(|rows| rows.each().into_iter().flat_map(|(_, rows)| rows.iter()));
        self.rpc
            .iter()
            .chain(&self.burst)
            .chain(&self.firehose)
            .chain(users)
            .map(|r| r.early)
            .sum()
    }
}
