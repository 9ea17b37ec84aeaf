//! `heartbeat`: many repeating timers (keepalive pings, lease renewals) at a fixed
//! rate. Each run must come at or after its grid point, none may be missing beyond
//! the runs the service says it skipped, and cancel must stop them all.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::report::{Lateness, Meter, Rates, WorkloadReport};
use crate::Common;

/// Counters every run updates.
#[derive(Debug, Default)]
struct Beats {
    /// Runs, all timers.
    runs: AtomicU64,
    /// Runs that came before their grid point.
    early: AtomicU64,
}

/// Runs `timers` repeating timers with period `period_s` (before the time scale) for
/// `periods` periods.
pub(crate) fn run(common: &Common, timers: usize, period_s: f64, periods: u32) -> WorkloadReport {
    let timer = common.service("heartbeat");
    let period = common.scaled(period_s).max(Duration::from_millis(1));
    let beats: &'static Beats = Box::leak(Box::default());
    // Each timer keeps the lateness of its worst run (µs) in its own slot: its runs
    // never overlap, so no two threads write one slot at once, and no lock is shared.
    let worst_us: &'static [AtomicU64] =
        Box::leak((0..timers).map(|_| AtomicU64::new(0)).collect());
    let meter = Meter::start();
    let start = Instant::now();
    let handles: Vec<_> = (0..timers)
        .map(|index| {
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
                    let late_us = (behind / 1_000) as u64;
                    // ORDERING: Relaxed: read after shutdown has joined every worker.
                    worst_us[index].fetch_max(late_us, Ordering::Relaxed);
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
    let mut histogram = crate::report::histogram();
    for slot in worst_us {
        histogram.saturating_record(slot.load(Ordering::Relaxed).max(1));
    }
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
            "{timers} repeating timers every {period:?} for {periods} periods: {runs} runs, {skipped} skipped (a whole period behind), {stopped} stopped by cancel, {late_runs} runs after shutdown; lateness columns: each timer's worst run"
        )],
    }
}
