//! `stall`: inline callbacks, one of which blocks for 200 ms every second, beside
//! timers due throughout. Netty's best-known weakness: a blocking callback makes every
//! other timer of its wheel late by the whole block. With rescue (docs/architecture.md,
//! `Builder::rescue_after`) the shard that watches a stuck shard fires its due timers;
//! the report gives the others' lateness with rescue on (the table's row), with it
//! off, and on the netty-style wheel, from the same load.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use sharded_timer::{Callbacks, ShardedTimer};

use crate::peers::NettyTimer;
use crate::report::{Lateness, Meter, Rates, WorkloadReport};
use crate::tracker::Tracker;
use crate::Common;

/// How long each blocking callback blocks.
const BLOCK: Duration = Duration::from_millis(200);
/// One blocking callback per this period.
const PERIOD: Duration = Duration::from_secs(1);
/// Each timer is due this long after it is scheduled.
const DELAY: Duration = Duration::from_millis(20);
/// Timers due per second beside the blockers.
const RATE: f64 = 20_000.0;
/// Timers a producer schedules between looks at the clock.
const BATCH: usize = 20;

/// Where the load runs.
enum Target<'a> {
    /// sharded-timer, inline callbacks.
    Ours(&'a ShardedTimer),
    /// The netty-style wheel (inline callbacks on its one worker).
    Netty(&'a NettyTimer),
}

impl Target<'_> {
    /// Schedules `f` due at `deadline`.
    fn schedule_at(&self, deadline: Instant, f: impl FnOnce() + Send + 'static) {
        match self {
            Target::Ours(timer) => drop(timer.schedule_at(deadline, f).expect("accepted")),
            Target::Netty(wheel) => {
                // Its deadline is computed from a later `now`: never earlier than ours.
                drop(wheel.schedule(deadline.saturating_duration_since(Instant::now()), f));
            }
        }
    }
}

/// The others' lateness and how many there were, for one target, over `seconds`.
fn load(target: &Target<'_>, seconds: f64) -> (&'static Tracker, usize) {
    let timers = (RATE * seconds) as usize;
    let tracker = Tracker::leak(timers, Instant::now(), DELAY);
    let start = Instant::now();
    let mut next_block = start + PERIOD / 2;
    for index in 0..timers {
        if index % BATCH == 0 {
            let due = start + Duration::from_secs_f64(index as f64 / RATE);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        let now = Instant::now();
        if now + DELAY >= next_block {
            // The blocker, due at `next_block`: on whichever shard its id maps to.
            target.schedule_at(next_block, || std::thread::sleep(BLOCK));
            next_block += PERIOD;
        }
        let deadline = now + DELAY;
        target.schedule_at(deadline, move || tracker.record(index, deadline));
    }
    (tracker, timers)
}

/// Waits for `tracker`'s `timers` to fire (at most a block and a second more).
fn settle(tracker: &Tracker, timers: usize) {
    let deadline = Instant::now() + DELAY + BLOCK + Duration::from_secs(1);
    while tracker.unfired_in(0..timers) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A service as `common` says, but with inline callbacks and rescue as given.
fn service(common: &Common, rescue_after: Option<Duration>) -> ShardedTimer {
    let mut builder = ShardedTimer::builder()
        .tick(common.tick)
        .pin_cores(common.pin)
        .thread_name("stall")
        .callbacks(Callbacks::inline())
        .rescue_after(rescue_after);
    if let Some(shards) = common.shards {
        builder = builder.shards(shards);
    }
    builder.build().unwrap_or_else(|error| {
        eprintln!("error: could not start the timer service: {error}");
        std::process::exit(2);
    })
}

/// One line of the comparison.
fn line(label: &str, histogram: &Histogram<u64>) -> String {
    let lateness = Lateness::of(histogram);
    format!(
        "{label:<32} lateness of the others p50 {:>6} µs  p99 {:>7} µs  max {:>7} µs",
        lateness.p50, lateness.p99, lateness.max
    )
}

/// Runs the load for `seconds` on ours with rescue on (reported), off, and on the
/// netty-style wheel.
pub(crate) fn run(common: &Common, seconds: f64) -> WorkloadReport {
    let rescue_after = common.tick * 4;
    let bar = common.progress("stall", 3);

    let meter = Meter::start();
    let timer = service(common, Some(rescue_after));
    let start = Instant::now();
    let (tracker, timers) = load(&Target::Ours(&timer), seconds);
    settle(tracker, timers);
    let elapsed = start.elapsed();
    drop(timer.shutdown());
    let process = meter.stop();
    let (rescued, fired) = tracker.lateness();
    let (early, duplicated) = tracker.violations();
    let lost = tracker.unfired_in(0..timers);
    bar.inc(1);

    let timer = service(common, None);
    let (off, off_timers) = load(&Target::Ours(&timer), seconds);
    settle(off, off_timers);
    drop(timer.shutdown());
    let (unrescued, _) = off.lateness();
    let (off_early, off_duplicated) = off.violations();
    bar.inc(1);

    let wheel = NettyTimer::new();
    let (netty, netty_timers) = load(&Target::Netty(&wheel), seconds);
    settle(netty, netty_timers);
    drop(wheel);
    let (netty_lateness, _) = netty.lateness();
    bar.finish_and_clear();

    WorkloadReport {
        name: "stall",
        rates: Rates {
            schedule: Some(timers as f64 / elapsed.as_secs_f64()),
            fired: Some(fired as f64 / elapsed.as_secs_f64()),
            ..Rates::default()
        },
        fired,
        lateness_us: Lateness::of(&rescued),
        // Rescue off must not be early or duplicate either.
        early: early + off_early,
        lost,
        duplicated: duplicated + off_duplicated,
        bytes_per_pending: None,
        capture_bytes: 24,
        process,
        notes: vec![
            format!(
                "inline callbacks; one blocks {BLOCK:?} every {PERIOD:?}; {RATE:.0} others/s due {DELAY:?} after scheduling, for {seconds} s; rescue: once a shard has been stuck in a callback for rescue_after, the shard that watches it fires its due timers (Builder::rescue_after)",
            ),
            line(&format!("ours, rescue after {rescue_after:?}:"), &rescued),
            line("ours, rescue off:", &unrescued),
            line("netty-style wheel:", &netty_lateness),
        ],
    }
}
