//! `burst`: a million timers due in the same tick. How soon after the deadline does
//! the last callback run?

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::report::{Lateness, Meter, Rates, WorkloadReport};
use crate::tracker::Tracker;
use crate::Common;

/// Schedules `timers` timers due together, waits for them all, reports the drain rate.
pub(crate) fn run(common: &Common, timers: usize) -> WorkloadReport {
    let timer = common.service("burst");
    // Lead time for scheduling everything before the deadline (not time-scaled: the
    // question is the drain rate, not the horizon).
    let lead = Duration::from_millis(500) + Duration::from_nanos(timers as u64 * 200);
    let tracker = Tracker::leak(timers, Instant::now() + lead, Duration::ZERO);
    let due = tracker.base;
    let meter = Meter::start();
    let start = Instant::now();
    let allocated_before = crate::alloc::allocated();
    let bar = common.progress("burst", timers as u64);
    std::thread::scope(|scope| {
        for producer in 0..common.producers {
            let (timer, bar) = (&timer, &bar);
            scope.spawn(move || {
                common.pin_producer(producer);
                let range = common.share(producer, timers);
                for (n, index) in range.enumerate() {
                    timer
                        .schedule_at(due, move || tracker.record(index, tracker.base))
                        .expect("the service accepts timers");
                    if n % 4096 == 4095 {
                        bar.inc(4096);
                    }
                }
            });
        }
    });
    let scheduled_at = Instant::now();
    let allocated = crate::alloc::allocated().saturating_sub(allocated_before);
    let mut notes = Vec::new();
    if scheduled_at > due {
        notes.push(format!(
            "scheduling overran the {lead:?} lead by {:?}: the drain overlapped scheduling",
            scheduled_at - due
        ));
    }
    bar.set_position(timers as u64);
    bar.set_message("draining");
    let all_fired = crate::report::wait_until(lead + Duration::from_secs(60), || {
        timer.stats().fired == timers as u64
    });
    drop(timer.shutdown()); // returns once every callback has finished
    tracker.settle(timers as u64);
    bar.finish_and_clear();
    let (histogram, fired) = tracker.lateness();
    let (early, duplicated) = tracker.violations();
    let lateness = Lateness::of(&histogram);
    // The last callback ran `max` µs after the common deadline: the drain time.
    let drain = Duration::from_micros(lateness.max.max(1));
    let rate = fired as f64 / drain.as_secs_f64();
    let lost = if all_fired { 0 } else { timers as u64 - fired };
    let process = meter.stop();
    notes.push(format!(
        "{timers} timers due in one tick: all ran within {:.1} ms of the deadline ({:.2} M timers/s)",
        drain.as_secs_f64() * 1e3,
        rate / 1e6
    ));
    WorkloadReport {
        name: "burst",
        rates: Rates {
            schedule: Some(timers as f64 / (scheduled_at - start).as_secs_f64()),
            fired: Some(rate),
            drain_ms: Some(drain.as_secs_f64() * 1e3),
            ..Rates::default()
        },
        fired,
        lateness_us: lateness,
        early,
        lost,
        duplicated,
        bytes_per_pending: Some(allocated as f64 / timers as f64),
        capture_bytes: 16,
        process,
        notes,
    }
}
