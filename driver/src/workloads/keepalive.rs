//! `keepalive`: many connections, each with an idle timeout re-armed by every packet.
//! Half the connections are busy, half silent. Silent connections must expire once,
//! on time; busy ones only after they fall silent at the end. A re-arm is either
//! `TimerHandle::reset` (one atomic update) or the cancel + schedule a timer without
//! reset needs; the driver runs both and reports them side by side.
//!
//! The load is a server's, not a benchmark's. The connections open evenly over the
//! first [`OPEN_TIMEOUTS`] of an idle timeout; the producers then deliver packets to
//! the busy ones at a fixed [`REARMS_PER_SEC`] (all producers together, each an equal
//! share, through a [`Pacer`]) while the silent ones come due; over the busy phase's
//! last idle timeout the busy connections fall silent one after another, and come due
//! one after another. The pace leaves a 2-core machine CPU to spare, so lateness
//! judges the timer, not the wait for a CPU; the spread keeps one hiccup of a shared
//! machine (a core taken away for a few ms) from landing on a whole group of expiries.
//! The re-arm rate in the report is that pace, not a throughput: `--compare`
//! measures how fast re-arms can go.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sharded_timer::{ShardedTimer, TimerHandle};

use crate::report::{Lateness, Meter, Rates, WorkloadReport};
use crate::tracker::Tracker;
use crate::Common;

use super::Pacer;

/// Timeouts the busy phase lasts.
const BUSY_TIMEOUTS: f64 = 3.0;

/// Packets delivered per second to the busy connections, all producers together
/// (each re-arms one idle timer).
pub(crate) const REARMS_PER_SEC: f64 = 4_000_000.0;

/// The share of an idle timeout over which the connections open (the silent ones
/// come due as spread, one timeout later).
const OPEN_TIMEOUTS: f64 = 0.5;

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
                    let opening = timeout.mul_f64(OPEN_TIMEOUTS).as_secs_f64();
                    let mut opens = Pacer::new(mine.len() as f64 / opening);
                    let mut handles: Vec<Option<TimerHandle>> = mine
                        .iter()
                        .map(|&index| {
                            let handle = arm(timer, tracker, index);
                            opens.pace();
                            Some(handle)
                        })
                        .collect();
                    // Busy connection `index` falls silent at its place in the last
                    // idle timeout of the busy phase.
                    let silent_from = |index: usize| {
                        busy_until - timeout.mul_f64(1.0 - index as f64 / connections as f64)
                    };
                    let mut pacer = Pacer::new(REARMS_PER_SEC / common.producers as f64);
                    let mut rearms = 0u64;
                    // The busy connections still sending (even ones; odd ones are
                    // silent from the start), by their slot in `mine`.
                    let mut sending: Vec<usize> = (0..mine.len())
                        .filter(|&slot| mine[slot].is_multiple_of(2))
                        .collect();
                    while !sending.is_empty() {
                        let mut next = 0;
                        while next < sending.len() {
                            let slot = sending[next];
                            let index = mine[slot];
                            let before = Instant::now();
                            let handle = match &handles[slot] {
                                Some(handle) if before < silent_from(index) => handle,
                                // Fallen silent: no more packets.
                                _ => {
                                    sending.swap_remove(next);
                                    continue;
                                }
                            };
                            // A packet arrived: re-arm the idle timer.
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
                            pacer.pace();
                            if rearmed {
                                rearms += 1;
                                next += 1;
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
        "{connections} connections ({} busy, {} silent) opened over {:.0} ms, idle timeout {:.0} ms: {rearms} re-arms ({}) until {:.2} s, paced at {:.1} M/s (all producers; a load, not a throughput: --compare measures that), the busy connections falling silent one by one over the last timeout; {fired} expiries",
        connections.div_ceil(2),
        connections / 2,
        timeout.as_secs_f64() * 1e3 * OPEN_TIMEOUTS,
        timeout.as_secs_f64() * 1e3,
        match rearm {
            Rearm::Reset => "reset",
            Rearm::CancelSchedule => "cancel + schedule",
        },
        busy_elapsed.as_secs_f64(),
        REARMS_PER_SEC / 1e6
    )];
    let (silent, _) = tracker.lateness_of(|index| !index.is_multiple_of(2));
    let (busy, _) = tracker.lateness_of(|index| index.is_multiple_of(2));
    let (silent, busy) = (Lateness::of(&silent), Lateness::of(&busy));
    notes.push(format!(
        "expiries' lateness: silent connections (due during the load) p50 {} / p99 {} / max {} µs, {:.1} % on time; busy ones (due after it) p50 {} / p99 {} / max {} µs, {:.1} % on time",
        silent.p50, silent.p99, silent.max, silent.on_time * 100.0,
        busy.p50, busy.p99, busy.max, busy.on_time * 100.0
    ));
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
            // Over the re-arming, after the connections opened.
            let rearming = busy_elapsed.saturating_sub(timeout.mul_f64(OPEN_TIMEOUTS));
            let per_sec = Some(rearms as f64 / rearming.as_secs_f64().max(1e-9));
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
