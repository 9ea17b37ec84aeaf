//! `heartbeat`: many repeating timers (keepalive pings, lease renewals) at a fixed
//! rate. Each run must come at or after its grid point, none may be missing beyond
//! the runs the service says it skipped, and cancel must stop them all.
//!
//! The timers start evenly over one period (as heartbeats of connections made at
//! different times), so that their runs come due spread over the period rather than
//! all in one tick; lateness is every run's, from its grid point.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::report::{Lateness, Meter, Rates, WorkloadReport};
use crate::Common;

use super::Pacer;

/// Width of a lateness bucket, µs.
const BUCKET_US: u64 = 10;
/// Lateness buckets: up to 100 ms, then one for everything later.
const BUCKETS: usize = 10_001;

/// Counters every run updates.
#[derive(Debug)]
struct Beats {
    /// Runs, all timers.
    runs: AtomicU64,
    /// Runs that came before their grid point.
    early: AtomicU64,
    /// Runs by lateness after their grid point, [`BUCKET_US`] wide (the last: later).
    late: Vec<AtomicU64>,
}

impl Beats {
    /// Counters with empty buckets.
    fn new() -> Self {
        Beats {
            runs: AtomicU64::new(0),
            early: AtomicU64::new(0),
            late: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Counts a run `late_us` after its grid point.
    fn record(&self, late_us: u64) {
        let bucket = ((late_us / BUCKET_US) as usize).min(BUCKETS - 1);
        // ORDERING: Relaxed: counters read after shutdown has joined every worker.
        self.late[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// The runs' lateness, each at its bucket's upper edge (the last bucket at its
    /// lower one).
    fn histogram(&self) -> hdrhistogram::Histogram<u64> {
        let mut histogram = crate::report::histogram();
        for (bucket, count) in self.late.iter().enumerate() {
            // ORDERING: Relaxed: read after shutdown has joined every worker.
            let count = count.load(Ordering::Relaxed);
            if count > 0 {
                let edge = (bucket as u64 + u64::from(bucket < BUCKETS - 1)) * BUCKET_US;
                histogram.saturating_record_n(edge.max(1), count);
            }
        }
        histogram
    }
}

/// Runs `timers` repeating timers with period `period_s` (before the time scale) for
/// `periods` periods.
pub(crate) fn run(common: &Common, timers: usize, period_s: f64, periods: u32) -> WorkloadReport {
    let timer = common.service("heartbeat");
    let period = common.scaled(period_s).max(Duration::from_millis(1));
    let beats: &'static Beats = Box::leak(Box::new(Beats::new()));
    let meter = Meter::start();
    let start = Instant::now();
    let mut starts = Pacer::new(timers as f64 / period.as_secs_f64());
    let handles: Vec<_> = (0..timers)
        .map(|_| {
            starts.pace();
            // A run's grid point is `created + n × period` for its n-th run: the
            // service skips runs but never runs one ahead of its slot.
            let created = Instant::now();
            let mut n = 0u32;
            timer
                .schedule_repeating(period, move || {
                    n += 1;
                    let now = Instant::now();
                    let due = created + period * n;
                    if now < due {
                        beats.early.fetch_add(1, Ordering::Relaxed);
                    }
                    beats.runs.fetch_add(1, Ordering::Relaxed);
                    // The latest grid point at or before now is this run's slot.
                    let behind = now.saturating_duration_since(created).as_nanos()
                        % period.as_nanos().max(1);
                    beats.record((behind / 1_000) as u64);
                })
                .expect("the service accepts timers")
        })
        .collect();
    let scheduled = start.elapsed();
    let run_for = period * periods;
    std::thread::sleep(run_for.saturating_sub(start.elapsed()));
    let elapsed = start.elapsed();
    let stopped = handles.iter().filter(|h| h.cancel()).count();
    // A run under way when cancel won may still finish; after shutdown none can.
    drop(timer.shutdown());
    let after_cancel = beats.runs.load(Ordering::Relaxed);
    std::thread::sleep(period * 3);
    let late_runs = beats.runs.load(Ordering::Relaxed) - after_cancel;
    let process = meter.stop();
    let runs = beats.runs.load(Ordering::Relaxed);
    let skipped = timer.stats().skipped;
    // Each timer owes one run per whole period after its first, give or take the one
    // under way at each end.
    let whole = (elapsed.as_nanos() / period.as_nanos()) as u64;
    let owed = (timers as u64) * whole.saturating_sub(2);
    let lost = owed.saturating_sub(runs + skipped);
    let duplicated = late_runs + runs.saturating_sub(timers as u64 * (whole + 1));
    let histogram = beats.histogram();
    WorkloadReport {
        name: "heartbeat",
        rates: Rates {
            schedule: Some(timers as f64 / scheduled.as_secs_f64()),
            fired: Some(runs as f64 / elapsed.as_secs_f64()),
            ..Rates::default()
        },
        fired: runs,
        lateness_us: Lateness::of(&histogram),
        early: beats.early.load(Ordering::Relaxed),
        lost,
        duplicated,
        bytes_per_pending: None,
        capture_bytes: 24,
        process,
        notes: vec![format!(
            "{timers} repeating timers every {period:?}, started evenly over one period, for {periods} periods: {runs} runs, {skipped} skipped (a whole period behind), {stopped} stopped by cancel, {late_runs} runs after shutdown; lateness columns: every run's, in {BUCKET_US} µs buckets (each at its upper edge)"
        )],
    }
}
