//! `rpc`: request timeouts from several threads, almost all cancelled before they fire
//! (the pattern of Kafka's purgatory and Netty's I/O timeouts), on top of a million
//! timers already pending. Shows that allocated memory stays flat (cancelled timers
//! are freed at once, not at their deadline) and that the requests left to time out
//! fire on time while new ones keep coming.
//!
//! The requests come at a fixed [`REQUESTS_PER_SEC`] (all producers together, each an
//! equal share, through a [`Pacer`]), as to a server with CPU to spare: at this pace
//! the first timeouts come due while requests still arrive, and a 2-core machine has
//! CPU left for them. The schedule+cancel rate in the report is that pace, not a
//! throughput: `--compare` measures how fast requests can go.

#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::report::{Lateness, Meter, Rates, WorkloadReport};
use crate::tracker::Tracker;
use crate::Common;

use super::Pacer;

/// Requests in flight per producer: each is answered (cancelled) or abandoned (left to
/// time out) once this many newer requests have been sent.
const WINDOW: usize = 1024;

/// Requests sent per second, all producers together (each schedules a timeout, and
/// answers or abandons a request sent [`WINDOW`] requests earlier).
pub(crate) const REQUESTS_PER_SEC: f64 = 4_000_000.0;

/// Runs `requests` requests, `cancel_ratio` of them answered in time.
pub(crate) fn run(
    common: &Common,
    requests: usize,
    cancel_ratio: f64,
    timeout_s: f64,
    background: usize,
) -> WorkloadReport {
    let timer = common.service("rpc");
    let timeout = common.scaled(timeout_s);
    let tracker = Tracker::leak(requests, Instant::now(), timeout);
    let meter = Meter::start();

    // A million timers pending throughout, an hour away: the service is not empty.
    let bar = common.progress("rpc bg", background as u64);
    std::thread::scope(|scope| {
        for producer in 0..common.producers {
            let (timer, bar) = (&timer, &bar);
            scope.spawn(move || {
                common.pin_producer(producer);
                for n in common.share(producer, background) {
                    drop(
                        timer
                            .schedule(Duration::from_secs(3600), || {})
                            .expect("accepted"),
                    );
                    if n % 4096 == 0 {
                        bar.inc(4096);
                    }
                }
            });
        }
    });
    bar.finish_and_clear();

    let allocated_start = crate::alloc::allocated();
    let peak_allocated = AtomicUsize::new(allocated_start);
    let done = AtomicBool::new(false);
    let bar = common.progress("rpc", requests as u64);
    let threshold = (cancel_ratio * u32::MAX as f64) as u64;
    let start = Instant::now();
    let abandoned: usize = std::thread::scope(|scope| {
        // Sample allocated memory while requests run: it must stay flat.
        scope.spawn(|| {
            // ORDERING: Relaxed: a stop flag for a sampler; nothing else rides on it.
            while !done.load(Ordering::Relaxed) {
                peak_allocated.fetch_max(crate::alloc::allocated(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let producers: Vec<_> = (0..common.producers)
            .map(|producer| {
                let (timer, bar) = (&timer, &bar);
                scope.spawn(move || {
                    common.pin_producer(producer);
                    let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ (producer as u64 + 1);
                    let mut window = VecDeque::with_capacity(WINDOW + 1);
                    let mut abandoned = 0usize;
                    let mut pacer = Pacer::new(REQUESTS_PER_SEC / common.producers as f64);
                    let mut settle = |entry: Option<(usize, sharded_timer::TimerHandle)>| {
                        let Some((index, handle)) = entry else { return };
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        if (rng & 0xffff_ffff) < threshold {
                            if handle.cancel() {
                                tracker.mark_cancelled(index);
                            }
                        } else {
                            abandoned += 1;
                        }
                    };
                    for (n, index) in common.share(producer, requests).enumerate() {
                        let deadline = Instant::now() + timeout;
                        let handle = timer
                            .schedule_at(deadline, move || tracker.record(index, deadline))
                            .expect("the service accepts timers");
                        window.push_back((index, handle));
                        if window.len() > WINDOW {
                            settle(window.pop_front());
                        }
                        if n % 4096 == 4095 {
                            bar.inc(4096);
                        }
                        pacer.pace();
                    }
                    while let Some(entry) = window.pop_front() {
                        settle(Some(entry));
                    }
                    abandoned
                })
            })
            .collect();
        let abandoned = producers
            .into_iter()
            .map(|p| p.join().expect("producer"))
            .sum();
        // ORDERING: Relaxed: see the sampler.
        done.store(true, Ordering::Relaxed);
        abandoned
    });
    let elapsed = start.elapsed();
    let allocated_end = crate::alloc::allocated();
    bar.finish_and_clear();

    // Abandoned requests time out: every one must fire, once, not early.
    let expected = abandoned as u64;
    crate::report::wait_until(timeout + Duration::from_secs(30), || {
        timer.stats().fired >= expected
    });
    // Shutdown returns once every callback has finished: a cancelled request that
    // wrongly fired shows up below as a duplicate, a missing timeout as lost.
    let unfired = timer.shutdown();
    tracker.settle(expected);
    let (histogram, fired) = tracker.lateness();
    let (early, duplicated) = tracker.violations();
    let lost = expected.saturating_sub(fired);
    let background_back = unfired.len();
    drop(unfired);
    let lost = lost + (background as u64).saturating_sub(background_back as u64);
    let process = meter.stop();
    let peak = peak_allocated.load(Ordering::Relaxed);
    let mb = |bytes: usize| bytes as f64 / 1e6;
    let notes = vec![
        format!(
            "{requests} requests on top of {background} pending timers, paced at {:.1} M/s (all producers; a load, not a throughput: --compare measures that), {:.1} % cancelled in time, {abandoned} timed out",
            REQUESTS_PER_SEC / 1e6,
            100.0 * (requests - abandoned) as f64 / requests as f64
        ),
        format!(
            "allocated memory while requests ran: {:.1} MB at start, {:.1} MB peak, {:.1} MB at end (flat: cancelled timers are freed at once)",
            mb(allocated_start),
            mb(peak),
            mb(allocated_end)
        ),
        format!("shutdown handed back all {background_back} background timers"),
    ];
    WorkloadReport {
        name: "rpc",
        rates: Rates {
            schedule_cancel: Some(requests as f64 / elapsed.as_secs_f64()),
            ..Rates::default()
        },
        fired,
        lateness_us: Lateness::of(&histogram),
        early,
        lost,
        duplicated,
        bytes_per_pending: None,
        capture_bytes: 32,
        process,
        notes,
    }
}
