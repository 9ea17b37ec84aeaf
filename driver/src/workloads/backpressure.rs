//! `backpressure`: a service bounded by `max_pending` is driven past its bound. The
//! n+1-th pending timer must be refused with `TooManyPending`, firing and cancelling
//! must free room again, and every accepted timer must fire exactly once.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use sharded_timer::{ScheduleError, ShardedTimer};

use crate::report::{Lateness, Meter, Rates, WorkloadReport};
use crate::tracker::Tracker;
use crate::Common;

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
                    for index in common.share(producer, offered) {
                        loop {
                            let deadline = Instant::now() + delay;
                            match timer.schedule(delay, move || tracker.record(index, deadline)) {
                                Ok(_) => break,
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
            "max_pending {limit}: the {}-th pending timer {}; {offered} offered, {refusals} refusals retried as room freed, {fired} fired, {} left at shutdown",
            limit + 1,
            if refused_at_limit { "was refused with TooManyPending" } else { "was NOT refused (counted as lost)" },
            unfired.len()
        )],
    }
}
