//! What criterion does not measure, side by side with the peers in one process: the
//! driver's `rpc` and `burst` workloads run against each peer, with lateness
//! percentiles (p50/p99/p999/max, µs), early fires, and exact bytes per pending timer
//! (a counting global allocator, not RSS).
//!
//! Producer threads are pinned one per core, for every peer alike.
//!
//! - rpc: 2 producers, 1 M requests with a 300 ms timeout on top of 1 M pending
//!   timers; each request is answered (cancelled) 1024 requests later, 97 % of the time.
//! - burst: 1 M timers due at the same instant; drain rate = timers / time from the
//!   deadline to the last callback.
//! - memory: allocated bytes per pending timer for 1 M pending timers, minus the
//!   16-byte closure each captures.
//!
//! Each workload runs 3 rounds over all peers, interleaved, and reports each peer's
//! median round with the range (the shared machine's speed drifts within a run).
//!
//! Run: `cargo bench --bench compare` (`COMPARE_PEERS=a,b`, `COMPARE_ROUNDS=n`).
//! Tick: 1 ms for every peer.

#![allow(missing_docs, reason = "a bench binary")]

#[path = "../src/bin/sharded-timer/alloc.rs"]
#[allow(dead_code, reason = "shared with the driver, which uses all of it")]
mod alloc;
mod peers;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use peers::{fill, Handle, Kind};

#[global_allocator]
static GLOBAL: alloc::CountingAllocator = alloc::CountingAllocator;

const NOT_FIRED: u32 = u32::MAX;
const REQUESTS: usize = 1_000_000;
const BACKGROUND: usize = 1_000_000;
const BURST: usize = 1_000_000;
const WINDOW: usize = 1024;
const TIMEOUT: Duration = Duration::from_millis(300);

/// Per-timer lateness slots plus an early-fire count; leaked per run so callbacks
/// capture a plain reference, not a contended `Arc`.
struct Slots {
    lateness_us: Vec<AtomicU32>,
    early: AtomicU64,
}

impl Slots {
    fn leak(n: usize) -> &'static Slots {
        Box::leak(Box::new(Slots {
            lateness_us: (0..n).map(|_| AtomicU32::new(NOT_FIRED)).collect(),
            early: AtomicU64::new(0),
        }))
    }

    fn record(&self, index: usize, deadline: Instant) {
        let now = Instant::now();
        if now < deadline {
            self.early.fetch_add(1, Ordering::Relaxed);
        }
        let late = now
            .saturating_duration_since(deadline)
            .as_micros()
            .min(u32::MAX as u128 - 1) as u32;
        self.lateness_us[index].store(late, Ordering::Relaxed);
    }

    fn histogram(&self) -> (Histogram<u64>, u64) {
        let mut histogram = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        let mut fired = 0;
        for slot in &self.lateness_us {
            let value = slot.load(Ordering::Relaxed);
            if value != NOT_FIRED {
                histogram.saturating_record(u64::from(value).max(1));
                fired += 1;
            }
        }
        (histogram, fired)
    }
}

struct Row {
    peer: &'static str,
    rate: f64,
    lateness: [u64; 4],
    early: u64,
    /// Lowest..highest rate over the rounds, in millions.
    spread: String,
}

impl Row {
    /// A peer's row: its rate, and lateness percentiles and early fires from its slots.
    fn new(kind: Kind, rate: f64, histogram: &Histogram<u64>, slots: &Slots) -> Row {
        Row {
            peer: kind.name(),
            rate,
            lateness: [
                histogram.value_at_quantile(0.5),
                histogram.value_at_quantile(0.99),
                histogram.value_at_quantile(0.999),
                histogram.max(),
            ],
            early: slots.early.load(Ordering::Relaxed),
            spread: String::new(),
        }
    }
}

fn wait_for(fired: impl Fn() -> u64, target: u64, limit: Duration) {
    let start = Instant::now();
    while fired() < target && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn fired_count(slots: &Slots) -> u64 {
    slots
        .lateness_us
        .iter()
        .filter(|s| s.load(Ordering::Relaxed) != NOT_FIRED)
        .count() as u64
}

fn rpc(kind: Kind) -> Row {
    let peer = kind.start();
    let background = fill(&peer, BACKGROUND, 2);
    let slots = Slots::leak(REQUESTS);
    let abandoned = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for producer in 0..2 {
            let (peer, abandoned) = (&peer, &abandoned);
            scope.spawn(move || {
                peers::pin_producer(producer);
                let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ (producer as u64 + 1);
                let mut window: std::collections::VecDeque<Handle> = Default::default();
                let per = REQUESTS / 2;
                for index in producer * per..(producer + 1) * per {
                    let deadline = Instant::now() + TIMEOUT;
                    window.push_back(peer.schedule(TIMEOUT, move || slots.record(index, deadline)));
                    if window.len() > WINDOW {
                        let handle = window.pop_front().unwrap();
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        if rng % 100 < 97 {
                            peer.cancel(&handle);
                        } else {
                            abandoned.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                for handle in window {
                    peer.cancel(&handle);
                }
            });
        }
    });
    let elapsed = start.elapsed();
    let expected = abandoned.load(Ordering::Relaxed);
    wait_for(
        || fired_count(slots),
        expected,
        TIMEOUT + Duration::from_secs(20),
    );
    let (histogram, _) = slots.histogram();
    drop(background);
    drop(peer);
    Row::new(
        kind,
        REQUESTS as f64 / elapsed.as_secs_f64(),
        &histogram,
        slots,
    )
}

fn burst(kind: Kind) -> Row {
    let peer = kind.start();
    let slots = Slots::leak(BURST);
    let deadline = Instant::now() + Duration::from_millis(1_500);
    std::thread::scope(|scope| {
        for producer in 0..2 {
            let peer = &peer;
            scope.spawn(move || {
                peers::pin_producer(producer);
                for index in (producer..BURST).step_by(2) {
                    let delay = deadline.saturating_duration_since(Instant::now());
                    drop(peer.schedule(delay, move || slots.record(index, deadline)));
                }
            });
        }
    });
    wait_for(|| fired_count(slots), BURST as u64, Duration::from_secs(60));
    let (histogram, fired) = slots.histogram();
    drop(peer);
    let drain = Duration::from_micros(histogram.max().max(1));
    Row::new(kind, fired as f64 / drain.as_secs_f64(), &histogram, slots)
}

fn bytes_per_pending(kind: Kind) -> f64 {
    let peer = kind.start();
    let slots = Slots::leak(0);
    let before = alloc::allocated();
    for index in 0..BACKGROUND {
        // A 16-byte closure (a reference and an index, as in the driver). The handle
        // is dropped: no peer cancels on drop, and handles are the caller's memory.
        drop(peer.schedule(Duration::from_secs(3600), move || {
            let _ = (slots, index);
        }));
    }
    // Let the peers' own threads take the timers in (tokio registers on a worker).
    std::thread::sleep(Duration::from_millis(500));
    let bytes = alloc::allocated().saturating_sub(before) as f64 / BACKGROUND as f64;
    drop(peer);
    bytes - 16.0
}

/// Runs `workload` for every peer `rounds` times, interleaved, and keeps for each
/// peer the round with the median rate (the early count is summed over all rounds).
fn median_rows(kinds: &[Kind], rounds: usize, workload: fn(Kind) -> Row) -> Vec<Row> {
    let mut runs: Vec<Vec<Row>> = kinds.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds.max(1) {
        for (i, &kind) in kinds.iter().enumerate() {
            runs[i].push(workload(kind));
        }
    }
    runs.into_iter()
        .map(|mut rows| {
            let early = rows.iter().map(|r| r.early).sum();
            rows.sort_by(|a, b| a.rate.total_cmp(&b.rate));
            let spread = format!(
                "{:.2}..{:.2}",
                rows[0].rate / 1e6,
                rows[rows.len() - 1].rate / 1e6
            );
            let mut median = rows.swap_remove(rows.len() / 2);
            median.early = early;
            median.spread = spread;
            median
        })
        .collect()
}

fn print(title: &str, unit: &str, rows: &[Row]) {
    let ours = rows[0].rate;
    println!("\n{title}");
    println!(
        "{:<18} {:>12} {:>8} {:>13} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "peer", unit, "ratio", "rounds (M)", "p50 µs", "p99 µs", "p999 µs", "max µs", "early"
    );
    for row in rows {
        println!(
            "{:<18} {:>10.2} M {:>7.2}x {:>13} {:>9} {:>9} {:>9} {:>9} {:>6}",
            row.peer,
            row.rate / 1e6,
            ours / row.rate,
            row.spread,
            row.lateness[0],
            row.lateness[1],
            row.lateness[2],
            row.lateness[3],
            row.early
        );
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        // `cargo test --benches` and `--list` probes: nothing to list or test here.
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!("sharded-timer compare: {cores} cores; ratio = sharded-timer's figure / the peer's");
    // COMPARE_PEERS=name,name limits the run (names as printed).
    let only = std::env::var("COMPARE_PEERS").ok();
    let kinds: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|n| n == k.name()))
        })
        .collect();
    // Rounds interleave the peers, so a change in the shared machine's speed during
    // the run hits every peer alike; each figure is the median of the rounds.
    let rounds: usize = std::env::var("COMPARE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let rpc_rows = median_rows(&kinds, rounds, rpc);
    print("rpc: schedule+cancel pairs/s (2 producers, 1 M pending), lateness of the 3 % that time out", "pairs/s", &rpc_rows);
    let burst_rows = median_rows(&kinds, rounds, burst);
    print(
        "burst: 1 M timers due together, drain rate",
        "fired/s",
        &burst_rows,
    );
    println!("\nbytes per pending timer (1 M pending, excluding the 16-byte closure)");
    for &kind in &kinds {
        println!("{:<18} {:>8.1}", kind.name(), bytes_per_pending(kind));
    }
    let early: u64 = rpc_rows.iter().chain(&burst_rows).map(|r| r.early).sum();
    println!("\nearly fires across all peers: {early}");
}
