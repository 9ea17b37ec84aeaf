//! `keepalive`: many connections, each with an idle timeout re-armed by every packet.
//! Half the connections are busy (each producer delivers packets to its busy
//! connections as fast as it can), half silent. Silent connections must expire once,
//! on time; busy ones only after they fall silent at the end. A re-arm is either
//! `TimerHandle::reset` (one atomic update) or the cancel + schedule a timer without
//! reset needs; the driver runs both and reports them side by side.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sharded_timer::{ShardedTimer, TimerHandle};

use crate::report::{Lateness, Meter, Rates, WorkloadReport};
use crate::tracker::Tracker;
use crate::Common;

/// Timeouts the busy phase lasts.
const BUSY_TIMEOUTS: f64 = 3.0;

/// How a packet re-arms a connection's idle timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rearm {
    /// `TimerHandle::reset`.
    Reset,
    /// Cancel the timer and schedule a new one.
    CancelSchedule,
}

/// Arms connection `index`'s idle timer: it expires `timeout` from now.
fn arm(timer: &ShardedTimer, tracker: &'static Tracker, index: usize) -> TimerHandle {
    let now = Instant::now();
    tracker.rearmed(index, now);
    timer
        .schedule_at(now + tracker.span, move || tracker.record_rearmed(index))
        .expect("the service accepts timers")
}

/// Runs `connections` connections with an idle timeout of `timeout_s` (scaled).
pub(crate) fn run(
    common: &Common,
    connections: usize,
    timeout_s: f64,
    rearm: Rearm,
) -> WorkloadReport {
    let timer = common.service("keepalive");
    let timeout = common.scaled(timeout_s);
    let tracker = Tracker::leak_with_rearms(connections, Instant::now(), timeout);
    let meter = Meter::start();
    let busy_expired = AtomicU64::new(0);
    let bar = common.progress("keepalive", (BUSY_TIMEOUTS * 1000.0) as u64);
    let start = Instant::now();
    let busy_until = start + timeout.mul_f64(BUSY_TIMEOUTS);
    let rearms: u64 = std::thread::scope(|scope| {
        let producers: Vec<_> = (0..common.producers)
            .map(|producer| {
                let (timer, bar, busy_expired) = (&timer, &bar, &busy_expired);
                scope.spawn(move || {
                    common.pin_producer(producer);
                    // Even connections are busy, odd ones silent.
                    let mine: Vec<usize> = common.share(producer, connections).collect();
                    let mut handles: Vec<Option<TimerHandle>> = mine
                        .iter()
                        .map(|&index| Some(arm(timer, tracker, index)))
                        .collect();
                    let mut rearms = 0u64;
                    while Instant::now() < busy_until {
                        for (slot, &index) in mine.iter().enumerate() {
                            if index % 2 == 1 {
                                continue;
                            }
                            let Some(handle) = &handles[slot] else {
                                continue;
                            };
                            // A packet arrived: re-arm the idle timer.
                            let before = Instant::now();
                            let rearmed = match rearm {
                                Rearm::Reset => {
                                    let reset = handle.reset(tracker.span);
                                    if reset {
                                        tracker.rearmed(index, before);
                                    }
                                    reset
                                }
                                Rearm::CancelSchedule => {
                                    let cancelled = handle.cancel();
                                    if cancelled {
                                        handles[slot] = Some(arm(timer, tracker, index));
                                    }
                                    cancelled
                                }
                            };
                            if rearmed {
                                rearms += 1;
                            } else {
                                // Expired while we still considered it busy: the
                                // driver fell behind (not early: the tracker checks).
                                busy_expired.fetch_add(1, Ordering::Relaxed);
                                handles[slot] = None;
                            }
                        }
                        if producer == 0 {
                            let done = start.elapsed().as_secs_f64()
                                / (timeout.as_secs_f64() * BUSY_TIMEOUTS);
                            bar.set_position((done * 1000.0) as u64);
                        }
                    }
                    rearms
                })
            })
            .collect();
        producers
            .into_iter()
            .map(|p| p.join().expect("producer"))
            .sum()
    });
    let busy_elapsed = start.elapsed();
    bar.finish_and_clear();
    // Everyone is silent now: every connection must expire exactly once.
    crate::report::wait_until(timeout + Duration::from_secs(30), || {
        timer.stats().fired >= connections as u64
    });
    drop(timer.shutdown()); // returns once every callback has finished
    tracker.settle(connections as u64);
    let (histogram, fired) = tracker.lateness();
    let (early, duplicated) = tracker.violations();
    let lost = tracker.unfired_in(0..connections);
    let process = meter.stop();
    let busy_expired = busy_expired.load(Ordering::Relaxed);
    let mut notes = vec![format!(
        "{connections} connections ({} busy, {} silent), idle timeout {:.0} ms: {rearms} re-arms ({}) in {:.2} s; {fired} expiries",
        connections.div_ceil(2),
        connections / 2,
        timeout.as_secs_f64() * 1e3,
        match rearm {
            Rearm::Reset => "reset",
            Rearm::CancelSchedule => "cancel + schedule",
        },
        busy_elapsed.as_secs_f64()
    )];
    if busy_expired > 0 {
        notes.push(format!(
            "{busy_expired} busy connections expired because the driver fell behind its packet schedule (not early: checked)"
        ));
    }
    WorkloadReport {
        name: match rearm {
            Rearm::Reset => "keepalive",
            Rearm::CancelSchedule => "keepalive-cs",
        },
        rates: {
            let per_sec = Some(rearms as f64 / busy_elapsed.as_secs_f64());
            match rearm {
                Rearm::Reset => Rates {
                    reset: per_sec,
                    ..Rates::default()
                },
                Rearm::CancelSchedule => Rates {
                    cancel_schedule: per_sec,
                    ..Rates::default()
                },
            }
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
