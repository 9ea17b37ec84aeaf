//! `backpressure`: a service bounded by `max_pending` is driven past its bound. The
//! n+1-th pending timer must be refused with `TooManyPending`, firing and cancelling
//! must free room again, and every accepted timer must fire exactly once, on time.
//!
//! The timers are offered at a fixed [`OFFERS_PER_SEC`] (all producers together,
//! through a [`Pacer`]): fast enough that the bound is reached before the first ones
//! come due (the rate × the delay is above the default `max_pending`), slow enough
//! that they come due at that rate rather than `max_pending` in one tick, on a
//! machine with CPU to spare. The schedule rate in the report is that pace.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use sharded_timer::{ScheduleError, ShardedTimer};

use crate::report::{Lateness, Meter, Rates, WorkloadReport};
use crate::tracker::Tracker;
use crate::Common;

use super::Pacer;

/// Timers offered per second, all producers together (a refused one is retried
/// every 200 µs until room is freed; retries do not count).
pub(crate) const OFFERS_PER_SEC: f64 = 1_000_000.0;

/// Fills a service bounded at `limit` with `producers` threads offering `offered`
/// timers due `delay_s` (before the time scale) later, retrying refused ones once
/// room is freed.
pub(crate) fn run(common: &Common, limit: usize, offered: usize, delay_s: f64) -> WorkloadReport {
    let mut builder = ShardedTimer::builder()
        .tick(common.tick)
        .pin_cores(common.pin)
        .thread_name("backpressure")
        .max_pending(limit);
    if let Some(shards) = common.shards {
        builder = builder.shards(shards);
    }
    let timer = builder.build().expect("the service starts");
    let delay = common.scaled(delay_s);
    let tracker = Tracker::leak(offered, Instant::now(), delay);
    let meter = Meter::start();
    let start = Instant::now();
    // Phase 1: offer `limit` far-away timers, then one more: it must be refused.
    let blockers: Vec<_> = (0..limit)
        .map(|_| {
            timer
                .schedule(Duration::from_secs(3600), || {})
                .expect("room")
        })
        .collect();
    let refused_at_limit = matches!(
        timer.schedule(Duration::from_secs(3600), || {}),
        Err(ScheduleError::TooManyPending { limit: l }) if l == limit
    );
    // Cancelling frees room: now the offered timers go in, refused ones retried as
    // firing frees more.
    for handle in &blockers {
        handle.cancel();
    }
    let refusals: u64 = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..common.producers)
            .map(|producer| {
                let timer = &timer;
                scope.spawn(move || {
                    common.pin_producer(producer);
                    let mut refusals = 0u64;
                    let mut pacer = Pacer::new(OFFERS_PER_SEC / common.producers as f64);
                    for index in common.share(producer, offered) {
                        loop {
                            let deadline = Instant::now() + delay;
                            match timer.schedule(delay, move || tracker.record(index, deadline)) {
                                Ok(_) => {
                                    pacer.pace();
                                    break;
                                }
                                Err(ScheduleError::TooManyPending { .. }) => {
                                    refusals += 1;
                                    std::thread::sleep(Duration::from_micros(200));
                                }
                                Err(error) => panic!("unexpected refusal: {error}"),
                            }
                        }
                    }
                    refusals
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("producer"))
            .sum()
    });
    let scheduled = start.elapsed();
    crate::report::wait_until(delay + Duration::from_secs(30), || {
        timer.stats().fired >= offered as u64
    });
    let unfired = timer.shutdown();
    tracker.settle(offered as u64);
    let (histogram, fired) = tracker.lateness();
    let (early, duplicated) = tracker.violations();
    let process = meter.stop();
    let lost = tracker.unfired_in(0..offered) + u64::from(!refused_at_limit);
    WorkloadReport {
        name: "backpressure",
        rates: Rates {
            schedule: Some(offered as f64 / scheduled.as_secs_f64()),
            ..Rates::default()
        },
        fired,
        lateness_us: Lateness::of(&histogram),
        early,
        lost,
        duplicated,
        bytes_per_pending: None,
        capture_bytes: 16,
        process,
        notes: vec![format!(
            "max_pending {limit}: the {}-th pending timer {}; {offered} offered at {:.1} M/s (paced, all producers), {refusals} refusals retried as room freed, {fired} fired, {} left at shutdown",
            limit + 1,
            if refused_at_limit { "was refused with TooManyPending" } else { "was NOT refused (counted as lost)" },
            OFFERS_PER_SEC / 1e6,
            unfired.len()
        )],
    }
}
