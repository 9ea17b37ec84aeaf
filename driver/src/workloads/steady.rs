//! `steady`: timers come due at a steady rate (default 1 M/s), as in a server whose
//! requests time out at a constant pace. Producers pace themselves; each timer is due
//! a fixed delay after it is scheduled, so in steady state the shards fire as many
//! per second as are scheduled. Lateness here is what a user's timeout SLO sees:
//! from the requested deadline to the callback, tick rounding included.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::report::{Lateness, Meter, Rates, WorkloadReport};
use crate::tracker::Tracker;
use crate::Common;

/// The delay of every timer (not time-scaled: the rate is the question).
const DELAY: Duration = Duration::from_millis(50);
/// Timers a producer schedules between looks at the clock.
const BATCH: usize = 100;

/// Schedules timers at `rate` per second (all producers together) for `seconds`.
pub(crate) fn run(common: &Common, rate: f64, seconds: f64) -> WorkloadReport {
    let timer = common.service("steady");
    let timers = (rate * seconds) as usize;
    let tracker = Tracker::leak(timers, Instant::now(), DELAY);
    let meter = Meter::start();
    let start = Instant::now();
    let per_producer = rate / common.producers as f64;
    std::thread::scope(|scope| {
        for producer in 0..common.producers {
            let timer = &timer;
            scope.spawn(move || {
                common.pin_producer(producer);
                for (n, index) in common.share(producer, timers).enumerate() {
                    if n % BATCH == 0 {
                        // Pace: timer n of this producer is sent at n / per_producer s.
                        let due = start + Duration::from_secs_f64(n as f64 / per_producer);
                        let now = Instant::now();
                        if due > now {
                            std::thread::sleep(due - now);
                        }
                    }
                    let deadline = Instant::now() + DELAY;
                    drop(
                        timer
                            .schedule_at(deadline, move || tracker.record(index, deadline))
                            .expect("the service accepts timers"),
                    );
                }
            });
        }
    });
    let elapsed = start.elapsed();
    crate::report::wait_until(DELAY + Duration::from_secs(30), || {
        timer.stats().fired >= timers as u64
    });
    drop(timer.shutdown());
    tracker.settle(timers as u64);
    let (histogram, fired) = tracker.lateness();
    let (early, duplicated) = tracker.violations();
    let process = meter.stop();
    WorkloadReport {
        name: "steady",
        rates: Rates {
            schedule: Some(timers as f64 / elapsed.as_secs_f64()),
            fired: Some(fired as f64 / elapsed.as_secs_f64()),
            ..Rates::default()
        },
        fired,
        lateness_us: Lateness::of(&histogram),
        early,
        lost: tracker.unfired_in(0..timers),
        duplicated,
        bytes_per_pending: None,
        capture_bytes: 24,
        process,
        notes: vec![format!(
            "{timers} timers due {DELAY:?} after scheduling, paced at {:.2} M/s for {seconds} s: lateness from the requested deadline, tick ({:?}) rounding included",
            rate / 1e6,
            common.tick
        )],
    }
}
