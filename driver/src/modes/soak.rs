//! `--soak 10m`: the rpc and keepalive loads on one long-lived service for the given
//! time, sampling allocated bytes and RSS every second. Fails on memory growth beyond
//! [`GROWTH_BOUND`] or on any early, lost or duplicated timer.
//!
//! - rpc: `producers` threads send requests with a timeout; each is answered
//!   (cancelled) 1024 requests later, 97 % of the time, or abandoned to time out.
//! - keepalive: one thread keeps 10,000 connections alive with `reset`; every 100 ms
//!   ten of them fall silent, must expire once, and are replaced by new connections.
//!
//! Accounting: every callback counts itself; every timer the driver let go (abandoned,
//! silent, or whose cancel or reset came too late because it had fired) counts as
//! expected. At the end, with every load stopped and every remaining timer
//! cancelled, the two must be equal: fewer is a lost timer, more a duplicated one.

#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use sharded_timer::{ShardedTimer, TimerHandle};

use crate::Common;

/// The memory bound: allocated bytes over the last tenth of the run may exceed those
/// over the second tenth (after warm-up) by at most 10 % plus 8 MiB.
pub(crate) const GROWTH_BOUND: &str =
    "allocated bytes in the last tenth of the run ≤ 1.10 × those in the second tenth + 8 MiB";
/// Requests in flight per rpc producer.
const WINDOW: usize = 1024;
/// rpc: request timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(300);
/// keepalive: connections and their idle timeout.
const CONNECTIONS: usize = 10_000;
const IDLE_TIMEOUT: Duration = Duration::from_millis(200);
/// keepalive: connections that fall silent every 100 ms.
const SILENT_PER_ROUND: usize = 10;

/// Counters the loads and callbacks share.
#[derive(Debug, Default)]
struct Counts {
    /// Callbacks run.
    fired: AtomicU64,
    /// Callbacks that ran before their deadline.
    early: AtomicU64,
    /// Timers the driver let go: each must fire exactly once.
    expected: AtomicU64,
    /// rpc requests sent.
    requests: AtomicU64,
    /// keepalive resets done.
    resets: AtomicU64,
}

/// One second's sample.
#[derive(Debug, Serialize, Clone, Copy)]
pub(crate) struct Sample {
    /// Seconds since the start.
    pub(crate) second: u64,
    /// Bytes allocated by the process.
    pub(crate) allocated: usize,
    /// Resident set, bytes (Linux).
    pub(crate) rss: Option<u64>,
    /// Requests per second over the last second.
    pub(crate) requests_per_sec: f64,
    /// Resets per second over the last second.
    pub(crate) resets_per_sec: f64,
}

/// The soak's verdict.
#[derive(Debug, Serialize)]
pub(crate) struct SoakReport {
    /// Seconds run.
    pub(crate) seconds: f64,
    /// rpc requests and keepalive resets done.
    pub(crate) requests: u64,
    pub(crate) resets: u64,
    /// Timers that fired, and that were expected to.
    pub(crate) fired: u64,
    pub(crate) expected: u64,
    /// Early fires (must be 0).
    pub(crate) early: u64,
    /// Allocated bytes, max over the second tenth and over the last tenth of the run.
    pub(crate) allocated_warm: usize,
    pub(crate) allocated_end: usize,
    /// RSS at the same points (max), bytes.
    pub(crate) rss_warm: Option<u64>,
    pub(crate) rss_end: Option<u64>,
    /// The bound applied.
    pub(crate) bound: &'static str,
    /// Every sample.
    pub(crate) samples: Vec<Sample>,
}

impl SoakReport {
    /// Whether memory grew beyond the bound.
    pub(crate) fn grew(&self) -> bool {
        self.allocated_end as f64 > self.allocated_warm as f64 * 1.10 + 8.0 * 1024.0 * 1024.0
    }

    /// Whether any timer fired early, was lost or ran twice.
    pub(crate) fn violated(&self) -> bool {
        self.early > 0 || self.fired != self.expected
    }

    /// Prints the verdict.
    pub(crate) fn print(&self) {
        let mb = |b: usize| b as f64 / 1e6;
        let rss = |r: Option<u64>| r.map_or("n/a".into(), |r| format!("{:.0} MB", r as f64 / 1e6));
        println!(
            "\nsoak: {:.0} s, rpc and keepalive on one service",
            self.seconds
        );
        println!(
            "  {} requests ({:.0} k/s), {} resets ({:.0} k/s)",
            self.requests,
            self.requests as f64 / self.seconds / 1e3,
            self.resets,
            self.resets as f64 / self.seconds / 1e3
        );
        println!(
            "  timers fired {} of {} expected; early {}",
            self.fired, self.expected, self.early
        );
        println!(
            "  allocated: {:.1} MB after warm-up, {:.1} MB at the end; RSS {} → {}",
            mb(self.allocated_warm),
            mb(self.allocated_end),
            rss(self.rss_warm),
            rss(self.rss_end)
        );
        println!("  bound: {}", self.bound);
        match (self.grew(), self.violated()) {
            (false, false) => println!("  PASS: memory flat, nothing early, lost or duplicated"),
            (grew, violated) => println!(
                "  FAIL:{}{}",
                if grew {
                    " memory grew beyond the bound"
                } else {
                    ""
                },
                if violated {
                    " a timer was early, lost or duplicated"
                } else {
                    ""
                }
            ),
        }
    }
}

/// The longest soak `--soak` accepts: a longer one is taken for a typo.
const LONGEST: Duration = Duration::from_secs(24 * 3600);

/// Parses `10m`, `90s`, `1h 30m` (humantime's format), up to [`LONGEST`].
///
/// # Errors
///
/// A message saying what did not parse, or that the duration is out of range.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text)
        .map_err(|error| format!("`{text}` is not a duration like 10m, 90s or 1h: {error}"))?;
    if duration.is_zero() || duration > LONGEST {
        return Err(format!(
            "`{text}`: a soak runs for more than 0 s and at most 24h"
        ));
    }
    Ok(duration)
}

/// A timer whose callback counts itself and checks it is not early.
fn counted(timer: &ShardedTimer, delay: Duration, counts: &'static Counts) -> TimerHandle {
    // The timer's own deadline is at or after this one (it reads the clock later).
    let deadline = Instant::now() + delay;
    timer
        .schedule(delay, move || {
            if Instant::now() < deadline {
                counts.early.fetch_add(1, Ordering::Relaxed);
            }
            counts.fired.fetch_add(1, Ordering::Relaxed);
        })
        .expect("the service accepts timers")
}

/// Cancels a timer the driver holds; one that already fired is expected.
fn cancel_or_expect(handle: &TimerHandle, counts: &Counts) {
    if !handle.cancel() {
        counts.expected.fetch_add(1, Ordering::Relaxed);
    }
}

/// rpc producer `producer` until `stop`.
fn rpc_load(timer: &ShardedTimer, producer: usize, counts: &'static Counts, stop: &AtomicBool) {
    let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ (producer as u64 + 1);
    let mut window: VecDeque<TimerHandle> = VecDeque::with_capacity(WINDOW + 1);
    // ORDERING: Relaxed: a stop flag; the join after it orders everything else.
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..1024 {
            window.push_back(counted(timer, REQUEST_TIMEOUT, counts));
            if window.len() > WINDOW {
                let handle = window.pop_front().expect("a full window");
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                if rng % 100 < 97 {
                    cancel_or_expect(&handle, counts);
                } else {
                    counts.expected.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        counts.requests.fetch_add(1024, Ordering::Relaxed);
    }
    for handle in window {
        cancel_or_expect(&handle, counts);
    }
}

/// The keepalive thread until `stop`.
fn keepalive_load(timer: &ShardedTimer, counts: &'static Counts, stop: &AtomicBool) {
    let mut connections: Vec<TimerHandle> = (0..CONNECTIONS)
        .map(|_| counted(timer, IDLE_TIMEOUT, counts))
        .collect();
    // Silent connections, and when they fell silent.
    let mut silent: VecDeque<(usize, Instant)> = VecDeque::new();
    let mut is_silent = vec![false; CONNECTIONS];
    let mut next_silence = Instant::now();
    let mut victim = 0;
    // ORDERING: Relaxed: a stop flag, as above.
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        // Silent connections whose timeout has surely passed: replace them.
        while silent
            .front()
            .is_some_and(|&(_, since)| now > since + IDLE_TIMEOUT * 5)
        {
            let (index, _) = silent.pop_front().expect("checked");
            is_silent[index] = false;
            // The old handle is dropped, not cancelled: its timer fired (or will).
            connections[index] = counted(timer, IDLE_TIMEOUT, counts);
        }
        if now >= next_silence {
            next_silence = now + Duration::from_millis(100);
            for _ in 0..SILENT_PER_ROUND {
                victim = (victim + 7_919) % CONNECTIONS;
                if !is_silent[victim] {
                    // Let go: it must expire once.
                    counts.expected.fetch_add(1, Ordering::Relaxed);
                    is_silent[victim] = true;
                    silent.push_back((victim, now));
                }
            }
        }
        let mut resets = 0;
        for (index, handle) in connections.iter_mut().enumerate() {
            if is_silent[index] {
                continue;
            }
            resets += 1;
            if !handle.reset(IDLE_TIMEOUT) {
                // The driver fell a whole timeout behind: it expired, as it should.
                counts.expected.fetch_add(1, Ordering::Relaxed);
                *handle = counted(timer, IDLE_TIMEOUT, counts);
            }
        }
        counts.resets.fetch_add(resets, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(10));
    }
    for (index, handle) in connections.iter().enumerate() {
        if !is_silent[index] {
            cancel_or_expect(handle, counts);
        }
    }
}

/// Runs the soak for `duration`.
pub(crate) fn run(common: &Common, duration: Duration) -> SoakReport {
    let timer = common.service("soak");
    let counts: &'static Counts = Box::leak(Box::default());
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let bar = if common.progress {
        let bar =
            ProgressBar::with_draw_target(Some(duration.as_secs()), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("soak {bar:30} {elapsed}/{duration} {msg}")
                .expect("valid template"),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut samples = Vec::new();
    std::thread::scope(|scope| {
        for producer in 0..common.producers {
            let (timer, stop) = (&timer, &stop);
            scope.spawn(move || {
                common.pin_producer(producer);
                rpc_load(timer, producer, counts, stop);
            });
        }
        let (timer, stop) = (&timer, &stop);
        scope.spawn(move || keepalive_load(timer, counts, stop));
        let (mut requests, mut resets) = (0, 0);
        let mut second = 0;
        while start.elapsed() < duration {
            second += 1;
            let next = start + Duration::from_secs(second);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            let (now_requests, now_resets) = (
                counts.requests.load(Ordering::Relaxed),
                counts.resets.load(Ordering::Relaxed),
            );
            let sample = Sample {
                second,
                allocated: crate::alloc::allocated(),
                rss: crate::system::rss_bytes(),
                requests_per_sec: (now_requests - requests) as f64,
                resets_per_sec: (now_resets - resets) as f64,
            };
            (requests, resets) = (now_requests, now_resets);
            bar.set_position(second);
            bar.set_message(format!(
                "rpc {:.0} k/s, resets {:.0} k/s, allocated {:.1} MB, RSS {:.0} MB",
                sample.requests_per_sec / 1e3,
                sample.resets_per_sec / 1e3,
                sample.allocated as f64 / 1e6,
                sample.rss.unwrap_or(0) as f64 / 1e6
            ));
            samples.push(sample);
        }
        // ORDERING: Relaxed: the scope's joins order the loads' last writes.
        stop.store(true, Ordering::Relaxed);
    });
    bar.finish_and_clear();
    // Everything let go fires within its timeout; wait for the count, with a bound.
    let expected = counts.expected.load(Ordering::Relaxed);
    crate::report::wait_until(Duration::from_secs(30), || {
        counts.fired.load(Ordering::Relaxed) >= expected
    });
    drop(timer.shutdown()); // every callback has returned
    let seconds = start.elapsed().as_secs_f64();
    let tenth = samples.len().div_ceil(10).max(1);
    let warm = &samples[tenth.min(samples.len() - 1)..(2 * tenth).min(samples.len())];
    let end = &samples[samples.len().saturating_sub(tenth)..];
    let max_allocated = |s: &[Sample]| s.iter().map(|s| s.allocated).max().unwrap_or(0);
    let max_rss = |s: &[Sample]| s.iter().filter_map(|s| s.rss).max();
    SoakReport {
        seconds,
        requests: counts.requests.load(Ordering::Relaxed),
        resets: counts.resets.load(Ordering::Relaxed),
        fired: counts.fired.load(Ordering::Relaxed),
        expected,
        early: counts.early.load(Ordering::Relaxed),
        allocated_warm: max_allocated(warm),
        allocated_end: max_allocated(end),
        rss_warm: max_rss(warm),
        rss_end: max_rss(end),
        bound: GROWTH_BOUND,
        samples,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse_as_humantime_up_to_a_day() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2500ms"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        for bad in ["", "m", "10d", "-1m", "0s", "ten", "infs", "2.5"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
