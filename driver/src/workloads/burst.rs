//! `burst`: a million timers due in the same tick. How soon after the deadline does
//! the last callback run?

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sharded_timer::{ShardedTimer, TimerHandle};

use crate::report::{Lateness, Meter, Rates, WorkloadReport};
use crate::tracker::Tracker;
use crate::Common;

/// Timers scheduled last, due with the burst, whose handles are kept to cancel them
/// once the drain has begun.
const PROBES: usize = 1_000;

/// What the probes found in the middle of the drain.
struct MidDrain {
    /// Callbacks of the burst that had run when the probes went in.
    fired_before: u64,
    /// Cancels of the probe timers that won (each a timer not yet fired).
    cancels_won: usize,
    /// How late the timer scheduled then, due one tick later, ran (µs; `u64::MAX`
    /// if it had not run by the end).
    late_comer_us: Arc<AtomicU64>,
}

/// Once the drain has begun (the first callback ran, after `due`): cancels every
/// probe and schedules one timer due one tick later, recording how late it runs.
fn probe_mid_drain(
    timer: &ShardedTimer,
    due: Instant,
    probes: Vec<TimerHandle>,
    tick: Duration,
) -> MidDrain {
    let now = Instant::now();
    if due > now {
        std::thread::sleep(due - now);
    }
    let started = crate::report::wait_until(Duration::from_secs(10), || timer.stats().fired > 0);
    let fired_before = if started { timer.stats().fired } else { 0 };
    let late_comer_us = Arc::new(AtomicU64::new(u64::MAX));
    let deadline = Instant::now() + tick;
    let out = late_comer_us.clone();
    drop(
        timer
            .schedule_at(deadline, move || {
                out.store(deadline.elapsed().as_micros() as u64, Ordering::SeqCst);
            })
            .expect("the service accepts timers"),
    );
    let cancels_won = probes.iter().filter(|probe| probe.cancel()).count();
    MidDrain {
        fired_before,
        cancels_won,
        late_comer_us,
    }
}

/// Schedules `timers` timers due together, waits for them all, reports the drain rate;
/// and, in the middle of the drain, whether a cancel still wins and how late a timer
/// due one tick later runs (bounded turns: issue 22).
pub(crate) fn run(common: &Common, timers: usize) -> WorkloadReport {
    let timer = common.service("burst");
    // Lead time for scheduling everything before the deadline (not time-scaled: the
    // question is the drain rate, not the horizon).
    let lead = Duration::from_millis(500) + Duration::from_nanos(timers as u64 * 200);
    let tracker = Tracker::leak(timers, Instant::now() + lead, Duration::ZERO);
    let due = tracker.base;
    let meter = Meter::start();
    let start = Instant::now();
    let fresh = super::memory_is_fresh();
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
    let probes: Vec<TimerHandle> = (0..PROBES)
        .map(|_| {
            timer
                .schedule_at(due, || {})
                .expect("the service accepts timers")
        })
        .collect();
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
    let mid = probe_mid_drain(&timer, due, probes, common.tick);
    // The burst, the probes whose cancel lost, and the late-comer.
    let expected = (timers + PROBES - mid.cancels_won + 1) as u64;
    let all_fired = crate::report::wait_until(lead + Duration::from_secs(60), || {
        timer.stats().fired == expected
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
    if !fresh {
        notes.push(super::NOT_FRESH.to_owned());
    }
    let late_comer = mid.late_comer_us.load(Ordering::SeqCst);
    let tick_us = common.tick.as_micros().max(1) as u64;
    notes.push(format!(
        "mid-drain, after {} callbacks: cancels of {PROBES} timers due with the burst won for {} (each not yet fired); a timer due one tick later ran {} after its deadline",
        mid.fired_before,
        mid.cancels_won,
        if late_comer == u64::MAX {
            "never".to_owned()
        } else {
            format!("{late_comer} µs ({:.1} ticks)", late_comer as f64 / tick_us as f64)
        }
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
        bytes_per_pending: fresh.then(|| allocated as f64 / timers as f64),
        capture_bytes: 16,
        process,
        notes,
    }
}
