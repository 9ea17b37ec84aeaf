//! `delayed`: jobs spread over a long horizon, fire-and-forget. Every one must fire
//! exactly once and never early; this is also where bytes per pending timer are
//! measured, since every timer is pending at once.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::report::{Lateness, Meter, Rates, WorkloadReport};
use crate::tracker::Tracker;
use crate::Common;

/// The deadline of job `index`: spread deterministically over the last 90 % of the
/// horizon (the first 10 % leaves time to schedule everything).
fn deadline_of(base: Instant, horizon: Duration, index: usize) -> Instant {
    let hash = (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let fraction = 0.1 + 0.9 * (hash >> 11) as f64 / (1u64 << 53) as f64;
    base + horizon.mul_f64(fraction)
}

/// Schedules `jobs` jobs over `horizon_s` (scaled) and waits for all of them.
pub(crate) fn run(common: &Common, jobs: usize, horizon_s: f64) -> WorkloadReport {
    let timer = common.service("delayed");
    let horizon = common.scaled(horizon_s);
    let tracker = Tracker::leak(jobs, Instant::now(), horizon);
    let meter = Meter::start();
    let fresh = super::memory_is_fresh();
    let allocated_before = crate::alloc::allocated();
    let bar = common.progress("delayed", jobs as u64);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for producer in 0..common.producers {
            let (timer, bar) = (&timer, &bar);
            scope.spawn(move || {
                common.pin_producer(producer);
                for (n, index) in common.share(producer, jobs).enumerate() {
                    let deadline = deadline_of(tracker.base, horizon, index);
                    // The captures: a `&'static Tracker` and a u32 index (16 bytes).
                    let slot = index as u32;
                    let job = move || {
                        let index = slot as usize;
                        tracker.record(index, deadline_of(tracker.base, tracker.span, index));
                    };
                    drop(
                        timer
                            .schedule_at(deadline, job)
                            .expect("the service accepts timers"),
                    );
                    if n % 4096 == 4095 {
                        bar.inc(4096);
                    }
                }
            });
        }
    });
    let schedule_time = start.elapsed();
    // Every job is pending now unless scheduling outlasted the first 10 % of the horizon.
    let fired_meanwhile = timer.stats().fired;
    let pending = jobs as u64 - fired_meanwhile;
    let allocated = crate::alloc::allocated().saturating_sub(allocated_before);
    bar.set_position(0);
    bar.set_length(jobs as u64);
    bar.set_message("firing");
    let all_fired = crate::report::wait_until(horizon + Duration::from_secs(60), || {
        let fired = timer.stats().fired;
        bar.set_position(fired);
        fired == jobs as u64
    });
    drop(timer.shutdown()); // returns once every callback has finished
    tracker.settle(jobs as u64);
    bar.finish_and_clear();
    let (histogram, fired) = tracker.lateness();
    let (early, duplicated) = tracker.violations();
    let lost = if all_fired {
        0
    } else {
        tracker.unfired_in(0..jobs)
    };
    let process = meter.stop();
    let bytes_per_pending = fresh.then(|| allocated as f64 / pending.max(1) as f64);
    let mut notes = vec![format!(
        "{jobs} jobs over {:.1} s: scheduled in {:.0} ms, {pending} pending at once{}",
        horizon.as_secs_f64(),
        schedule_time.as_secs_f64() * 1e3,
        bytes_per_pending.map_or_else(String::new, |bytes| format!(
            ", {bytes:.0} bytes allocated per pending job including its 16-byte closure"
        ))
    )];
    if !fresh {
        notes.push(super::NOT_FRESH.to_owned());
    }
    if fired_meanwhile > 0 {
        notes.push(format!(
            "{fired_meanwhile} jobs fired while scheduling was still going on"
        ));
    }
    WorkloadReport {
        name: "delayed",
        rates: Rates {
            schedule: Some(jobs as f64 / schedule_time.as_secs_f64()),
            ..Rates::default()
        },
        fired,
        lateness_us: Lateness::of(&histogram),
        early,
        lost,
        duplicated,
        bytes_per_pending,
        capture_bytes: 16,
        process,
        notes,
    }
}
