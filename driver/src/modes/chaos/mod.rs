//! `chaos 10m`: random operations from several threads on one service at a time, on
//! real threads and the system clock, checked as they run.
//!
//! The run is a sequence of *phases*, one service each, in turn with callbacks on the
//! pool, inline on the shards, and on a spawner (two threads of the driver's that run
//! each [`Callback`](sharded_timer::Callback) handed to them); each phase draws 1 to
//! 3 shards, a ring of 2 to 64 slots, sometimes a `max_pending`, and keeps
//! `rescue_after` at its default. During a phase:
//!
//! - `--threads` threads schedule (`schedule`, and `schedule_at` in the past, now,
//!   near and far), cancel, reset earlier and later, make repeating and fixed-delay
//!   timers, bursts due in one tick, and drop handles. Callbacks block (up to 4 ms),
//!   panic, or schedule from inside; captures are hostile: one whose `Drop` panics,
//!   one whose `Drop` schedules, one whose `Drop` cancels another timer, and closures
//!   holding a clone of the service.
//! - A multi-thread tokio runtime and a hand-written executor (one thread polling
//!   tasks with wakers of its own) run sleeps, `sleep_until` in the past, timeouts,
//!   re-armed sleeps, dropped sleeps and intervals. On the hand-written executor,
//!   some tasks live only behind one waker: the one stored in an *anchor* sleep that
//!   another thread drops, so dropping that waker drops the task and its other sleeps.
//!
//! A phase ends at a quiescent point (everything stopped, every due timer run, the
//! `Stats` identities checked, then `shutdown`) or, one phase in three, with
//! `shutdown` while the load runs.
//!
//! Checked as it runs, a violation each:
//!
//! - *exactly once*: a one-shot callback runs at most once; no run starts after a
//!   `cancel` that returned `true`, after `shutdown` handed the timer back, or (pool,
//!   inline) after `shutdown` returned; runs of one repeating timer never overlap;
//! - *never early*: a callback starts (`Instant::now()`) at or after its deadline (the
//!   last successful reset's; for a repeating timer, its n-th grid point; for a
//!   fixed-delay timer, `delay` after the previous run ended); a future completes
//!   only after its deadline unless the service refused it (shutdown); a future whose
//!   deadline has passed completes at its first poll; `deadline()` is the instant
//!   asked for;
//! - *nothing lost*: after shutdown every timer scheduled is accounted for: it ran,
//!   a `cancel` returned `true`, `shutdown` returned it as `Unfired`, or `schedule`
//!   refused it (a repeating timer: all but the first, or a spawner's run of it was
//!   under way at shutdown); every task of the hand-written executor has been freed;
//! - *Stats identities*: at the quiescent point `in_rings == 0`, `pending` equals the timers that neither ran nor were cancelled,
//!   runs of repeating timers `R` (started) bound `fired + cancelled + pending -
//!   scheduled` between `R` and `R +` repeating timers cancelled, and `panicked` lies
//!   between the callbacks that panicked and those plus the panicking captures the
//!   service dropped; after `shutdown`, `pending == 0`, `in_rings == 0`, and (at the
//!   quiescent point) it returned exactly the pending timers;
//! - *memory flat*: after each phase's shutdown, with the service and everything the
//!   phase made dropped, live bytes (the driver's counting allocator) are at most
//!   [`MEMORY_SLACK`] above those after the first phase;
//! - *no hang*: no progress (operations, callbacks, futures) for [`HANG`] is a
//!   violation: the driver prints where it was and what was pending, and exits.
//!
//! `Stats` counters that read lower than an earlier read under load are counted and
//! reported, not judged: `Stats` is exact at quiescence only.
//!
//! A line of progress every 2 s, a summary at the end (operations per kind and
//! `violations 0`); the exit status is 1 after any violation, each printed as it is
//! found.
//!
//! # Files
//!
//! `operations.rs`: the load threads' operations, their callbacks and hostile
//! captures; `futures.rs`: the future operations and the tokio load;
//! `hand_executor.rs`: the hand-written executor and its orphan tasks; `checker.rs`:
//! the ledger and the checks at the start of each run; `phases.rs`: one phase, its
//! shutdown and its accounting; `report.rs`: the counters, violations, panic hook and
//! summary; this file: the arguments, the hang guard and the run.

#![forbid(unsafe_code)]

mod checker;
mod futures;
mod hand_executor;
mod operations;
mod phases;
mod report;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;

use self::checker::{Kind, Record};
use self::phases::{config, phase, CURRENT};
use self::report::{
    install_panic_hook, print_summary, total_ops, violation, violations, Op, OPS, PROGRESS, STAGE,
};
use crate::modes::soak::parse_duration;

/// No progress for this long is a hang.
const HANG: Duration = Duration::from_secs(10);
/// Memory bound: live bytes after a phase at most this much above those after the
/// first phase.
pub(crate) const MEMORY_SLACK: usize = 8 << 20;
/// A timer due at least this far ahead counts as far: it is never waited for.
const FAR: Duration = Duration::from_secs(1800);

/// `sharded-timer chaos DURATION`: the arguments.
#[derive(Debug, Parser)]
#[command(
    name = "sharded-timer chaos",
    about = "Random operations from several threads on one service at a time, checked: \
             exactly once, never early, nothing lost, Stats identities, flat memory"
)]
struct ChaosArgs {
    /// How long to run (e.g. 20s, 10m, 1h 30m; at most 24h)
    #[arg(value_parser = parse_duration)]
    duration: Duration,
    /// Seed of the random operations [default: from the clock]
    #[arg(long)]
    seed: Option<u64>,
    /// Threads issuing operations on the service
    #[arg(long, default_value_t = 3)]
    threads: usize,
    /// How long each service (phase) lives before it is shut down (e.g. 5s)
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    phase: Duration,
    /// Go on after a phase that found a violation (the exit status is still 1)
    #[arg(long)]
    keep_going: bool,
}

/// xorshift64*: a small seeded generator.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value).
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    /// The next value.
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Uniform in `range`.
    fn range(&mut self, range: std::ops::RangeInclusive<u64>) -> u64 {
        range.start() + self.below(range.end() - range.start() + 1)
    }
    /// True with probability `percent` %.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    /// A delay: zero, near (under 5 ms), mid (5-60 ms) or far (at least [`FAR`]).
    fn delay(&mut self) -> Duration {
        match self.below(20) {
            0..=1 => Duration::ZERO,
            2..=9 => Duration::from_micros(self.range(1..=5_000)),
            10..=16 => Duration::from_micros(self.range(5_000..=60_000)),
            17..=18 => FAR + Duration::from_secs(self.range(0..=7200)),
            _ => Duration::MAX,
        }
    }
}

/// The hang guard: no progress for [`HANG`] prints what was pending and exits 1.
fn guard(done: Arc<AtomicBool>) {
    let mut last = PROGRESS.load(Ordering::Relaxed);
    let mut since = Instant::now();
    // ORDERING: Relaxed: a stop flag.
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(250));
        // ORDERING: Relaxed: a pulse.
        let now = PROGRESS.load(Ordering::Relaxed);
        if now != last {
            (last, since) = (now, Instant::now());
            continue;
        }
        if since.elapsed() < HANG {
            continue;
        }
        let stage = STAGE.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut report = format!("hang: no progress for {HANG:?} in {stage}");
        if let Some((timer, shared)) = CURRENT.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            let stats = timer.stats();
            let records = shared.records();
            let now = shared.ns(Instant::now());
            let overdue: Vec<String> = records
                .iter()
                .filter(|r| {
                    r.kind == Kind::OneShot
                        && r.pending()
                        && r.not_before.load(Ordering::Acquire) < now
                })
                .take(5)
                .map(|r| r.name())
                .collect();
            report += &format!(
                "\n  Stats: pending {}, in_rings {}, scheduled {}, fired {}, cancelled {}, ring_full_waits {}\n  driver: {} timers pending, {} overdue (e.g. {}), {} repeating runs under way, {} hand-written tasks alive",
                stats.pending,
                stats.in_rings,
                stats.scheduled,
                stats.fired,
                stats.cancelled,
                stats.ring_full_waits,
                records.iter().filter(|r| r.pending()).count(),
                records
                    .iter()
                    .filter(|r| r.kind == Kind::OneShot && r.pending() && r.not_before.load(Ordering::Acquire) < now)
                    .count(),
                overdue.join(", "),
                records.iter().filter(|r| Record::get(&r.running)).count(),
                shared.hand_tasks.load(Ordering::Relaxed),
            );
            for (k, shard) in stats.shards.iter().enumerate() {
                report += &format!(
                    "\n  shard {k}: pending {}, in_ring {}, fired {}",
                    shard.pending, shard.in_ring, shard.fired
                );
            }
        }
        violation(report);
        print_summary(None);
        std::process::exit(1);
    }
}

/// `sharded-timer chaos DURATION [--seed N] [--threads N] [--phase 5s]`: returns the
/// exit status.
pub(crate) fn main(args: impl Iterator<Item = String>) -> i32 {
    let args = match ChaosArgs::try_parse_from(args) {
        Ok(args) => args,
        Err(error) => {
            let code = if error.use_stderr() { 2 } else { 0 };
            let _ = error.print();
            return code;
        }
    };
    if args.threads == 0 {
        eprintln!("error: --threads must be at least 1");
        return 2;
    }
    install_panic_hook();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    println!(
        "sharded-timer chaos {} (seed {seed}, {} load threads, phases of {})",
        humantime::format_duration(args.duration),
        args.threads,
        humantime::format_duration(args.phase)
    );
    println!(
        "memory bound: live bytes after each phase ≤ those after the first phase + {} MiB",
        MEMORY_SLACK >> 20
    );
    let done = Arc::new(AtomicBool::new(false));
    let guard_thread = {
        let done = done.clone();
        std::thread::Builder::new()
            .name("chaos-guard".into())
            .spawn(move || guard(done))
            .expect("the guard thread")
    };
    let start = Instant::now();
    let mut rng = Rng::new(seed);
    let mut number = 0;
    let mut baseline: Option<usize> = None;
    let mut peak_over = 0usize;
    // Progress lines come from a thread of their own, every 2 s.
    let printer = {
        let done = done.clone();
        std::thread::Builder::new()
            .name("chaos-progress".into())
            .spawn(move || {
                let begun = Instant::now();
                let mut next = begun + Duration::from_secs(2);
                // ORDERING: Relaxed: a stop flag.
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                    if Instant::now() < next {
                        continue;
                    }
                    next += Duration::from_secs(2);
                    let stage = STAGE.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    println!(
                        "chaos {:>5.0} s  ops {:>10}  callbacks {:>9}  futures {:>8}  violations {}  allocated {:.1} MB  RSS {}  | {stage}",
                        begun.elapsed().as_secs_f64(),
                        total_ops(),
                        OPS[Op::Callback as usize].load(Ordering::Relaxed),
                        OPS[Op::TokioFuture as usize].load(Ordering::Relaxed)
                            + OPS[Op::HandFuture as usize].load(Ordering::Relaxed),
                        violations(),
                        crate::alloc::allocated() as f64 / 1e6,
                        crate::system::rss_bytes()
                            .map_or("n/a".to_owned(), |b| format!("{:.0} MB", b as f64 / 1e6)),
                    );
                }
            })
            .expect("the progress thread")
    };
    while start.elapsed() < args.duration && (args.keep_going || violations() == 0) {
        let config = config(number, &mut rng);
        let left = args.duration.saturating_sub(start.elapsed());
        let length = args.phase.min(left).max(Duration::from_millis(500));
        let outcome = phase(number, config, length, args.threads, rng.next());
        number += 1;
        match baseline {
            None => baseline = Some(outcome.allocated_after),
            Some(base) => {
                let over = outcome.allocated_after.saturating_sub(base);
                peak_over = peak_over.max(over);
                if over > MEMORY_SLACK {
                    violation(format!(
                        "memory: {:.1} MB live after phase {} ({config}), {:.1} MB above the {:.1} MB after the first phase (bound {} MiB)",
                        outcome.allocated_after as f64 / 1e6,
                        number - 1,
                        over as f64 / 1e6,
                        base as f64 / 1e6,
                        MEMORY_SLACK >> 20
                    ));
                }
            }
        }
    }
    // ORDERING: Relaxed: a stop flag; joined below.
    done.store(true, Ordering::Relaxed);
    let _ = guard_thread.join();
    let _ = printer.join();
    println!(
        "memory: live bytes after the first phase {:.1} MB; at most {:.2} MB above it after later phases (bound {} MiB)",
        baseline.unwrap_or(0) as f64 / 1e6,
        peak_over as f64 / 1e6,
        MEMORY_SLACK >> 20
    );
    print_summary(Some((start.elapsed().as_secs_f64(), number)));
    if violations() == 0 {
        0
    } else {
        1
    }
}
