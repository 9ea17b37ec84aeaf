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

#![forbid(unsafe_code)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use clap::Parser;
use sharded_timer::{
    Callback, Callbacks, ScheduleError, ShardedTimer, Sleep, Stats, TimerHandle, TimerId,
    TimerState,
};

use crate::modes::soak::parse_duration;

/// No progress for this long is a hang.
const HANG: Duration = Duration::from_secs(10);
/// Memory bound: live bytes after a phase at most this much above those after the
/// first phase.
pub(crate) const MEMORY_SLACK: usize = 8 << 20;
/// A timer due at least this far ahead counts as far: it is never waited for.
const FAR: Duration = Duration::from_secs(1800);
/// Payloads of the panics the chaos makes on purpose start with this.
const DELIBERATE: &str = "chaos: deliberate";

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

// ---------------------------------------------------------------------------------
// Counters, violations, progress

/// The kinds of operation counted.
#[derive(Clone, Copy, Debug)]
enum Op {
    Schedule,
    ScheduleAt,
    BurstTimer,
    Repeating,
    FixedDelay,
    CancelTrue,
    CancelFalse,
    ResetTrue,
    ResetFalse,
    DropHandle,
    Refused,
    Callback,
    CallbackPanic,
    CallbackBlock,
    CallbackSchedule,
    PanickingCapture,
    SchedulingCapture,
    CancellingCapture,
    ServiceCapture,
    StatsRead,
    TokioFuture,
    HandFuture,
    OrphanTask,
    AnchorDropped,
    Unfired,
    UnfiredRun,
}

/// Names of [`Op`]s, in order.
const OP_NAMES: [&str; 26] = [
    "schedule",
    "schedule_at",
    "burst timers",
    "repeating",
    "fixed-delay",
    "cancel true",
    "cancel false",
    "reset true",
    "reset false",
    "handles dropped",
    "refused",
    "callbacks run",
    "callbacks panicked",
    "callbacks blocked",
    "callbacks scheduled",
    "panicking captures",
    "scheduling captures",
    "cancelling captures",
    "service captures",
    "stats reads",
    "tokio futures",
    "hand-executor futures",
    "orphan tasks",
    "anchors dropped",
    "unfired returned",
    "unfired run",
];

/// Operations done, per kind.
static OPS: [AtomicU64; 26] = [const { AtomicU64::new(0) }; 26];
/// Bumped by every operation, callback and finished future: the hang guard's pulse.
static PROGRESS: AtomicU64 = AtomicU64::new(0);
/// Violations found.
static VIOLATIONS: AtomicU64 = AtomicU64::new(0);
/// The first violations' messages.
static VIOLATION_LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Times a `Stats` counter read lower than an earlier read (under load).
static REGRESSIONS: AtomicU64 = AtomicU64::new(0);
/// Where the run is, for the hang report.
static STAGE: Mutex<String> = Mutex::new(String::new());

/// Counts one `op`.
fn bump(op: Op) {
    // ORDERING: Relaxed: statistics and a pulse; nothing is published through them.
    OPS[op as usize].fetch_add(1, Ordering::Relaxed);
    PROGRESS.fetch_add(1, Ordering::Relaxed);
}

/// Records and prints a violation.
fn violation(message: String) {
    // ORDERING: Relaxed: a count read at the end, after the joins.
    let n = VIOLATIONS.fetch_add(1, Ordering::Relaxed);
    if n < 50 {
        eprintln!("VIOLATION: {message}");
    }
    let mut log = VIOLATION_LOG.lock().unwrap_or_else(|e| e.into_inner());
    if log.len() < 50 {
        log.push(message);
    }
}

/// Violations so far.
fn violations() -> u64 {
    // ORDERING: Relaxed: as in `violation`.
    VIOLATIONS.load(Ordering::Relaxed)
}

/// Says where the run is (for the hang report).
fn stage(text: String) {
    PROGRESS.fetch_add(1, Ordering::Relaxed);
    *STAGE.lock().unwrap_or_else(|e| e.into_inner()) = text;
}

/// A deliberate panic (silenced by the hook).
fn deliberate(what: &str) -> ! {
    std::panic::panic_any(format!("{DELIBERATE} {what}"))
}

/// The text of a panic payload.
fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else {
        "(not a string)".to_owned()
    }
}

/// Silences deliberate panics; any other panic, on any thread, is a violation.
fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if payload_text(info.payload()).starts_with(DELIBERATE) {
            return;
        }
        let thread = std::thread::current();
        violation(format!(
            "unexpected panic on thread {}: {info}",
            thread.name().unwrap_or("?")
        ));
        default(info);
    }));
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

// ---------------------------------------------------------------------------------
// The ledger: one record per timer

/// What kind of timer a record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    OneShot,
    Repeating,
    FixedDelay,
}

/// One timer's bookkeeping, shared by its callback and whoever holds its handle.
#[derive(Debug)]
struct Record {
    /// What it is.
    kind: Kind,
    /// No run may start before this (ns after the phase's base); for a repeating
    /// timer, its first grid point. At or before the real deadline.
    not_before: AtomicU64,
    /// Period or delay of a repeating or fixed-delay timer, ns.
    period_ns: u64,
    /// Runs started.
    runs: AtomicU32,
    /// A run is under way.
    running: AtomicBool,
    /// When the last run ended (ns after the base).
    last_end: AtomicU64,
    /// A `cancel` returned `true`.
    cancelled: AtomicBool,
    /// `shutdown` returned it.
    unfired: AtomicBool,
    /// `schedule` refused it.
    refused: AtomicBool,
    /// The driver ran it through `Unfired::run` (no deadline applies).
    released: AtomicBool,
    /// A run started once `shutdown` had begun (a spawner's: a repeating timer whose
    /// run is out at shutdown is neither handed back nor run again).
    late_run: AtomicBool,
    /// Its id, once `schedule` returned.
    id: OnceLock<TimerId>,
}

impl Record {
    /// A record due no earlier than `not_before`.
    fn new(kind: Kind, not_before: u64, period_ns: u64) -> Arc<Record> {
        Arc::new(Record {
            kind,
            not_before: AtomicU64::new(not_before),
            period_ns,
            runs: AtomicU32::new(0),
            running: AtomicBool::new(false),
            last_end: AtomicU64::new(0),
            cancelled: AtomicBool::new(false),
            unfired: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            released: AtomicBool::new(false),
            late_run: AtomicBool::new(false),
            id: OnceLock::new(),
        })
    }

    /// Reads a flag.
    fn get(flag: &AtomicBool) -> bool {
        // ORDERING: Acquire pairs with the Release stores in `set`.
        flag.load(Ordering::Acquire)
    }

    /// Sets a flag.
    fn set(flag: &AtomicBool) {
        // ORDERING: Release pairs with the Acquire loads in `get`.
        flag.store(true, Ordering::Release);
    }

    /// Runs started.
    fn runs(&self) -> u32 {
        // ORDERING: Acquire pairs with the AcqRel increment in `start_run`.
        self.runs.load(Ordering::Acquire)
    }

    /// Whether nothing about it can change any more (one-shot), so the ledger may
    /// forget it: duplicates are still caught by the callback, which holds it.
    fn settled(&self) -> bool {
        self.kind == Kind::OneShot
            && (self.runs() > 0 || Self::get(&self.cancelled) || Self::get(&self.refused))
    }

    /// Whether the service should still hold it.
    fn pending(&self) -> bool {
        if Self::get(&self.refused) || Self::get(&self.cancelled) || Self::get(&self.unfired) {
            return false;
        }
        self.kind != Kind::OneShot || self.runs() == 0
    }

    /// The id, for messages.
    fn name(&self) -> String {
        match self.id.get() {
            Some(id) => format!("{:?} timer {id}", self.kind),
            None => format!("{:?} timer (id not yet known)", self.kind),
        }
    }
}

/// What one phase's callbacks and loads share (never a service clone).
#[derive(Debug)]
struct Shared {
    /// Deadlines are kept as ns after this.
    base: Instant,
    /// Every timer of the phase not yet settled.
    ledger: Mutex<Vec<Arc<Record>>>,
    /// `shutdown` has been called.
    shutting_down: AtomicBool,
    /// `shutdown` has returned.
    shut_down: AtomicBool,
    /// Callbacks go to a spawner (they may run after `shutdown` returned).
    spawned: bool,
    /// Callback bodies that panicked.
    body_panics: AtomicU64,
    /// Panicking captures dropped (anywhere).
    drop_panics: AtomicU64,
    /// Panics of captures that the driver caught on its own threads.
    caught: AtomicU64,
    /// Runs of repeating and fixed-delay timers started.
    repeating_runs: AtomicU64,
    /// Repeating and fixed-delay timers cancelled (`true`).
    repeating_cancelled: AtomicU64,
    /// Anchor sleeps of orphan tasks, for any thread to drop.
    anchors: Mutex<Vec<Anchor>>,
    /// Tasks of the hand-written executor alive.
    hand_tasks: AtomicUsize,
}

impl Shared {
    /// `instant` as ns after the base (0 before it).
    fn ns(&self, instant: Instant) -> u64 {
        instant.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// ns after the base of `instant + delay`, saturating.
    fn ns_after(&self, instant: Instant, delay: Duration) -> u64 {
        match instant.checked_add(delay) {
            Some(deadline) => self.ns(deadline),
            None => u64::MAX,
        }
    }

    /// Files a record in the ledger.
    fn file(&self, record: &Arc<Record>) {
        self.ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(record.clone());
    }

    /// Forgets settled records.
    fn prune(&self) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        ledger.retain(|record| !record.settled());
    }

    /// A copy of the ledger.
    fn records(&self) -> Vec<Arc<Record>> {
        self.ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Increments a counter.
    fn count(counter: &AtomicU64) {
        // ORDERING: Relaxed: read at quiescent points, after joins.
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads a counter.
    fn read(counter: &AtomicU64) -> u64 {
        // ORDERING: Relaxed: as in `count`.
        counter.load(Ordering::Relaxed)
    }
}

/// The checks at the start of a run of `record`; returns the run's number (1-based).
fn start_run(shared: &Shared, record: &Record) -> u32 {
    let now = shared.ns(Instant::now());
    bump(Op::Callback);
    // ORDERING: AcqRel: orders this run after the previous one's end (fixed delay)
    // and publishes it to the checks at the end.
    let run = record.runs.fetch_add(1, Ordering::AcqRel) + 1;
    let released = Record::get(&record.released);
    if Record::get(&shared.shutting_down) {
        Record::set(&record.late_run);
    }
    if record.kind == Kind::OneShot && run > 1 {
        violation(format!("{} ran {run} times", record.name()));
    }
    if Record::get(&record.cancelled) {
        violation(format!(
            "{}: run {run} started after cancel() returned true",
            record.name()
        ));
    }
    if Record::get(&record.unfired) && !released {
        violation(format!(
            "{}: run {run} started after shutdown handed it back",
            record.name()
        ));
    }
    if Record::get(&shared.shut_down) && !shared.spawned && !released {
        violation(format!(
            "{}: run {run} started after shutdown returned",
            record.name()
        ));
    }
    if record.kind != Kind::OneShot && record.running.swap(true, Ordering::AcqRel) {
        // ORDERING: AcqRel above: pairs with the Release store at the run's end.
        violation(format!("{}: runs overlap (run {run})", record.name()));
    }
    // ORDERING: Acquire pairs with the Release stores of resets and run ends.
    let first = record.not_before.load(Ordering::Acquire);
    let due = match record.kind {
        Kind::OneShot => first,
        Kind::Repeating => {
            first.saturating_add(u64::from(run - 1).saturating_mul(record.period_ns))
        }
        Kind::FixedDelay if run == 1 => first,
        Kind::FixedDelay => record
            .last_end
            .load(Ordering::Acquire)
            .saturating_add(record.period_ns),
    };
    if now < due && !released {
        violation(format!(
            "{}: run {run} started {} µs early",
            record.name(),
            (due - now) / 1_000
        ));
    }
    run
}

/// The end of a run of a repeating or fixed-delay timer.
fn end_run(shared: &Shared, record: &Record) {
    // ORDERING: Release pairs with the Acquire load in `start_run`.
    record
        .last_end
        .store(shared.ns(Instant::now()), Ordering::Release);
    // ORDERING: Release pairs with the AcqRel swap in `start_run`.
    record.running.store(false, Ordering::Release);
}

// ---------------------------------------------------------------------------------
// Callbacks and hostile captures

/// What a one-shot callback does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behaviour {
    /// Checks itself and returns.
    Plain,
    /// Blocks this many µs.
    Block(u64),
    /// Panics.
    Panic,
    /// Schedules a near timer on the service it captured.
    Schedule,
}

/// A capture whose `Drop` panics.
#[derive(Debug)]
struct PanicOnDrop(Arc<Shared>);

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A second panic would abort: the capture is being dropped by an unwind.
            return;
        }
        Shared::count(&self.0.drop_panics);
        deliberate("panic in a capture's Drop");
    }
}

/// A capture whose `Drop` schedules a near timer on the service.
#[derive(Debug)]
struct ScheduleOnDrop(ShardedTimer, Arc<Shared>);

impl Drop for ScheduleOnDrop {
    fn drop(&mut self) {
        let delay = Duration::from_micros(500);
        drop(schedule_plain(&self.0, &self.1, delay));
    }
}

/// A capture whose `Drop` cancels another (plain) timer.
#[derive(Debug)]
struct CancelOnDrop(TimerHandle, Arc<Record>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.0.cancel() {
            Record::set(&self.1.cancelled);
            if self.1.runs() > 0 {
                violation(format!(
                    "{}: cancel() returned true (from a capture's Drop) after it ran",
                    self.1.name()
                ));
            }
        }
    }
}

/// A hostile capture.
#[derive(Debug)]
#[allow(dead_code, reason = "each capture is held for its Drop, never read")]
enum Hostile {
    /// None.
    None,
    /// `Drop` panics.
    Panics(PanicOnDrop),
    /// `Drop` schedules.
    Schedules(ScheduleOnDrop),
    /// `Drop` cancels another timer.
    Cancels(CancelOnDrop),
    /// A clone of the service.
    Service(ShardedTimer),
}

/// How to schedule: a delay or an instant.
#[derive(Clone, Copy, Debug)]
enum When {
    /// `schedule(delay)`.
    After(Duration),
    /// `schedule_at(instant)`.
    At(Instant),
}

/// Schedules a plain near one-shot timer (from a capture's drop or a callback).
fn schedule_plain(
    timer: &ShardedTimer,
    shared: &Arc<Shared>,
    delay: Duration,
) -> Option<(TimerHandle, Arc<Record>)> {
    schedule_one(
        timer,
        shared,
        When::After(delay),
        Behaviour::Plain,
        Hostile::None,
    )
}

/// Schedules one one-shot timer; `None` if refused. Checks `deadline()`.
fn schedule_one(
    timer: &ShardedTimer,
    shared: &Arc<Shared>,
    when: When,
    behaviour: Behaviour,
    hostile: Hostile,
) -> Option<(TimerHandle, Arc<Record>)> {
    let before = Instant::now();
    let not_before = match when {
        When::After(delay) => shared.ns_after(before, delay),
        When::At(at) => shared.ns(at),
    };
    let record = Record::new(Kind::OneShot, not_before, 0);
    let (run_record, run_shared) = (record.clone(), shared.clone());
    let service = match behaviour {
        Behaviour::Schedule => Some(timer.clone()),
        _ => None,
    };
    let callback = move || {
        let _hostile = hostile;
        start_run(&run_shared, &run_record);
        match behaviour {
            Behaviour::Plain => {}
            Behaviour::Block(us) => {
                bump(Op::CallbackBlock);
                std::thread::sleep(Duration::from_micros(us));
            }
            Behaviour::Panic => {
                bump(Op::CallbackPanic);
                Shared::count(&run_shared.body_panics);
                deliberate("panic in a callback");
            }
            Behaviour::Schedule => {
                bump(Op::CallbackSchedule);
                if let Some(service) = &service {
                    let delay = Duration::from_micros(200);
                    drop(schedule_plain(service, &run_shared, delay));
                }
            }
        }
    };
    // The closure is dropped here on refusal: a panicking capture's panic is ours.
    let result = catch_unwind(AssertUnwindSafe(|| match when {
        When::After(delay) => timer.schedule(delay, callback),
        When::At(at) => timer.schedule_at(at, callback),
    }));
    let after = Instant::now();
    let result = match result {
        Ok(result) => result,
        Err(_) => {
            Shared::count(&shared.caught);
            Err(ScheduleError::Shutdown)
        }
    };
    shared.file(&record);
    match result {
        Ok(handle) => {
            let _ = record.id.set(handle.id());
            check_deadline(&handle, when, before, after);
            Some((handle, record))
        }
        Err(error) => {
            refused(&record, error);
            None
        }
    }
}

/// Marks a refused timer.
fn refused(record: &Record, error: ScheduleError) {
    bump(Op::Refused);
    Record::set(&record.refused);
    if record.runs() > 0 {
        violation(format!(
            "{} ran although schedule returned {error:?}",
            record.name()
        ));
    }
}

/// `deadline()` is the instant asked for.
fn check_deadline(handle: &TimerHandle, when: When, before: Instant, after: Instant) {
    let deadline = handle.deadline();
    match when {
        When::At(at) if deadline != at => violation(format!(
            "timer {}: schedule_at({at:?}) but deadline() = {deadline:?}",
            handle.id()
        )),
        When::After(delay) => {
            if let (Some(low), Some(high)) = (before.checked_add(delay), after.checked_add(delay)) {
                if delay < Duration::from_secs(365 * 86_400) && !(low..=high).contains(&deadline) {
                    violation(format!(
                        "timer {}: schedule({delay:?}) between {low:?} and {high:?}, but deadline() = {deadline:?}",
                        handle.id()
                    ));
                }
            }
        }
        When::At(_) => {}
    }
}

/// Schedules a repeating (`fixed_delay == false`) or fixed-delay timer of `period`.
fn schedule_repeating(
    timer: &ShardedTimer,
    shared: &Arc<Shared>,
    period: Duration,
    fixed_delay: bool,
    rng: &mut Rng,
) -> Option<(TimerHandle, Arc<Record>)> {
    let period = period.max(Duration::from_millis(1));
    let before = Instant::now();
    let kind = if fixed_delay {
        Kind::FixedDelay
    } else {
        Kind::Repeating
    };
    let record = Record::new(
        kind,
        shared.ns_after(before, period),
        period.as_nanos() as u64,
    );
    let (run_record, run_shared) = (record.clone(), shared.clone());
    let block = rng.chance(10).then(|| rng.range(100..=2_000));
    let panics = rng.chance(10);
    let hostile = if !panics && rng.chance(10) {
        bump(Op::PanickingCapture);
        Hostile::Panics(PanicOnDrop(shared.clone()))
    } else {
        Hostile::None
    };
    let callback = move || {
        let _hostile = &hostile;
        let run = start_run(&run_shared, &run_record);
        Shared::count(&run_shared.repeating_runs);
        if let Some(us) = block {
            bump(Op::CallbackBlock);
            std::thread::sleep(Duration::from_micros(us));
        }
        end_run(&run_shared, &run_record);
        if panics && run.is_multiple_of(3) {
            bump(Op::CallbackPanic);
            Shared::count(&run_shared.body_panics);
            deliberate("panic in a repeating callback");
        }
    };
    let result = catch_unwind(AssertUnwindSafe(|| {
        if fixed_delay {
            timer.schedule_with_fixed_delay(period, callback)
        } else {
            timer.schedule_repeating(period, callback)
        }
    }));
    let result = result.unwrap_or_else(|_| {
        Shared::count(&shared.caught);
        Err(ScheduleError::Shutdown)
    });
    shared.file(&record);
    match result {
        Ok(handle) => {
            let _ = record.id.set(handle.id());
            bump(if fixed_delay {
                Op::FixedDelay
            } else {
                Op::Repeating
            });
            Some((handle, record))
        }
        Err(error) => {
            refused(&record, error);
            None
        }
    }
}

/// Cancels `handle` (of `record`), catching a panicking capture's panic; checks the
/// answer. Returns whether it won.
fn cancel(shared: &Shared, handle: &TimerHandle, record: &Record) -> bool {
    let won = match catch_unwind(AssertUnwindSafe(|| handle.cancel())) {
        Ok(won) => won,
        Err(_) => {
            // Only a winning cancel drops the callback.
            Shared::count(&shared.caught);
            true
        }
    };
    if won {
        bump(Op::CancelTrue);
        Record::set(&record.cancelled);
        if record.kind == Kind::OneShot && record.runs() > 0 {
            violation(format!(
                "{}: cancel() returned true after it ran",
                record.name()
            ));
        }
        if record.kind != Kind::OneShot {
            Shared::count(&shared.repeating_cancelled);
        }
        if Record::get(&record.unfired) {
            violation(format!(
                "{}: cancel() returned true after shutdown handed it back",
                record.name()
            ));
        }
    } else {
        bump(Op::CancelFalse);
        if handle.state() == TimerState::Pending && !Record::get(&shared.shutting_down) {
            violation(format!(
                "{}: cancel() returned false but state() is Pending",
                record.name()
            ));
        }
    }
    won
}

// ---------------------------------------------------------------------------------
// The threads that issue operations

/// A handle a load thread holds.
#[derive(Debug)]
struct Held {
    handle: TimerHandle,
    record: Arc<Record>,
    /// No hostile capture, one-shot: may be a `CancelOnDrop`'s victim.
    plain: bool,
}

/// One load thread, until `stop` (or the service refuses with `Shutdown`).
fn load(timer: ShardedTimer, shared: Arc<Shared>, stop: Arc<AtomicBool>, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut held: Vec<Held> = Vec::new();
    let mut last_stats: Option<Stats> = None;
    let mut ops = 0u64;
    // ORDERING: Relaxed: a stop flag; the join orders the rest.
    while !stop.load(Ordering::Relaxed) {
        ops += 1;
        if ops.is_multiple_of(4) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let pick = rng.below(100);
        match pick {
            0..=44 => {
                let when = if pick < 30 {
                    bump(Op::Schedule);
                    When::After(rng.delay())
                } else {
                    bump(Op::ScheduleAt);
                    let now = Instant::now();
                    When::At(match rng.below(6) {
                        0 => now,
                        1 => now
                            .checked_sub(Duration::from_micros(rng.range(1..=20_000)))
                            .unwrap_or(now),
                        2 => now.checked_sub(Duration::from_secs(3_600)).unwrap_or(now),
                        3 => now + FAR + Duration::from_secs(rng.range(0..=3_600)),
                        _ => now + Duration::from_micros(rng.range(0..=40_000)),
                    })
                };
                let behaviour = match rng.below(20) {
                    0 => Behaviour::Block(rng.range(100..=2_000)),
                    1..=2 => Behaviour::Panic,
                    3..=4 => Behaviour::Schedule,
                    _ => Behaviour::Plain,
                };
                let hostile = match rng.below(20) {
                    0..=1 if behaviour != Behaviour::Panic => {
                        bump(Op::PanickingCapture);
                        Hostile::Panics(PanicOnDrop(shared.clone()))
                    }
                    2..=3 => {
                        bump(Op::SchedulingCapture);
                        Hostile::Schedules(ScheduleOnDrop(timer.clone(), shared.clone()))
                    }
                    4..=5 => match held.iter().rev().find(|h| h.plain) {
                        Some(victim) => {
                            bump(Op::CancellingCapture);
                            Hostile::Cancels(CancelOnDrop(
                                victim.handle.clone(),
                                victim.record.clone(),
                            ))
                        }
                        None => Hostile::None,
                    },
                    6 => {
                        bump(Op::ServiceCapture);
                        Hostile::Service(timer.clone())
                    }
                    _ => Hostile::None,
                };
                let plain = behaviour == Behaviour::Plain && matches!(hostile, Hostile::None);
                match schedule_one(&timer, &shared, when, behaviour, hostile) {
                    Some((handle, record)) => held.push(Held {
                        handle,
                        record,
                        plain,
                    }),
                    None if Record::get(&shared.shutting_down) => break,
                    None => {}
                }
            }
            45..=59 if !held.is_empty() => {
                let k = rng.below(held.len() as u64) as usize;
                let Held { handle, record, .. } = &held[k];
                cancel(&shared, handle, record);
            }
            60..=74 if !held.is_empty() => {
                let k = rng.below(held.len() as u64) as usize;
                let Held { handle, record, .. } = &held[k];
                reset(&shared, handle, record, &mut rng);
            }
            75..=80 => {
                let live = held
                    .iter()
                    .filter(|h| h.record.kind != Kind::OneShot && h.record.pending())
                    .count();
                if live < 6 {
                    let period = if rng.chance(15) {
                        FAR
                    } else {
                        Duration::from_micros(rng.range(500..=20_000))
                    };
                    if let Some((handle, record)) =
                        schedule_repeating(&timer, &shared, period, pick >= 78, &mut rng)
                    {
                        held.push(Held {
                            handle,
                            record,
                            plain: false,
                        });
                    }
                }
            }
            81 => {
                let at = Instant::now() + Duration::from_micros(rng.range(500..=5_000));
                for _ in 0..rng.range(16..=128) {
                    bump(Op::BurstTimer);
                    if schedule_one(
                        &timer,
                        &shared,
                        When::At(at),
                        Behaviour::Plain,
                        Hostile::None,
                    )
                    .is_none()
                    {
                        break;
                    }
                }
            }
            82..=89 if !held.is_empty() => {
                // Fire and forget; repeating timers are kept, to be cancelled.
                let k = rng.below(held.len() as u64) as usize;
                if held[k].record.kind == Kind::OneShot || !held[k].record.pending() {
                    bump(Op::DropHandle);
                    held.swap_remove(k);
                }
            }
            90..=92 => drop_anchor(&shared),
            93 => {
                bump(Op::StatsRead);
                let stats = timer.stats();
                if let Some(last) = &last_stats {
                    check_monotonic(last, &stats);
                }
                last_stats = Some(stats);
            }
            _ => {
                bump(Op::Schedule);
                let delay = Duration::from_micros(rng.range(0..=3_000));
                if let Some((handle, record)) = schedule_plain(&timer, &shared, delay) {
                    held.push(Held {
                        handle,
                        record,
                        plain: true,
                    });
                }
            }
        }
        if held.len() > 512 {
            // Keep the newest, and every live repeating timer.
            let mut k = 0;
            held.retain(|h| {
                k += 1;
                k > 256 || (h.record.kind != Kind::OneShot && h.record.pending())
            });
        }
    }
    // Cancel the repeating timers that would run for ever (far ones come back from
    // shutdown).
    for Held { handle, record, .. } in &held {
        if record.kind != Kind::OneShot && record.period_ns < FAR.as_nanos() as u64 {
            cancel(&shared, handle, record);
        }
    }
}

/// Resets `handle` earlier or later, keeping `not_before` at or before the deadline.
fn reset(shared: &Shared, handle: &TimerHandle, record: &Record, rng: &mut Rng) {
    let before = Instant::now();
    let at = rng.chance(30);
    let (new, want) = if at {
        let instant = before + Duration::from_micros(rng.range(0..=30_000));
        (shared.ns(instant), When::At(instant))
    } else {
        let delay = rng.delay();
        (shared.ns_after(before, delay), When::After(delay))
    };
    // ORDERING: Acquire/Release pair with the callback's Acquire load in `start_run`.
    let old = record.not_before.load(Ordering::Acquire);
    if record.kind == Kind::OneShot {
        record.not_before.store(old.min(new), Ordering::Release);
    }
    let won = match want {
        When::At(instant) => handle.reset_at(instant),
        When::After(delay) => handle.reset(delay),
    };
    let after = Instant::now();
    if !won {
        bump(Op::ResetFalse);
        return;
    }
    bump(Op::ResetTrue);
    if record.kind != Kind::OneShot {
        violation(format!(
            "{}: reset() returned true for a repeating timer",
            record.name()
        ));
        return;
    }
    // ORDERING: as above.
    record.not_before.store(new, Ordering::Release);
    if Record::get(&record.cancelled) || Record::get(&record.unfired) {
        violation(format!(
            "{}: reset() returned true after it was cancelled or handed back",
            record.name()
        ));
    }
    check_deadline(handle, want, before, after);
}

/// Counters that must never go backwards.
fn check_monotonic(last: &Stats, now: &Stats) {
    for (name, a, b) in [
        ("scheduled", last.scheduled, now.scheduled),
        ("fired", last.fired, now.fired),
        ("cancelled", last.cancelled, now.cancelled),
        ("panicked", last.panicked, now.panicked),
        ("skipped", last.skipped, now.skipped),
        ("ring_full_waits", last.ring_full_waits, now.ring_full_waits),
    ] {
        if b < a {
            // Not a violation: `Stats` is exact at quiescence only. Reported, since
            // `record_metrics` exports these as counters, which must not go back.
            // ORDERING: Relaxed: a count read at the end.
            if REGRESSIONS.fetch_add(1, Ordering::Relaxed) < 5 {
                eprintln!("warning: Stats::{name} went backwards under load: {a} then {b}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Futures: shared by tokio and the hand-written executor

/// Polls `future` once, as part of the current task.
async fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *future).poll(cx))).await
}

/// A future completed: early unless refused.
fn check_complete(what: &str, deadline: Option<Instant>, refused: bool) {
    if let Some(deadline) = deadline {
        let now = Instant::now();
        if !refused && now < deadline {
            violation(format!(
                "{what} completed {} µs before its deadline",
                (deadline - now).as_micros()
            ));
        }
    }
}

/// One random future operation on `timer`.
async fn future_op(timer: ShardedTimer, shared: Arc<Shared>, seed: u64) {
    let mut rng = Rng::new(seed);
    let shutting = || Record::get(&shared.shutting_down);
    match rng.below(8) {
        0 | 1 => {
            let delay = Duration::from_micros(rng.range(0..=10_000));
            let before = Instant::now();
            let mut sleep = timer.sleep(delay);
            (&mut sleep).await;
            check_complete(
                "sleep",
                before.checked_add(delay),
                sleep.refused().is_some(),
            );
        }
        2 => {
            let now = Instant::now();
            let at = now
                .checked_sub(Duration::from_micros(rng.range(1_000..=50_000)))
                .unwrap_or(now);
            let mut sleep = timer.sleep_until(at);
            if poll_once(&mut sleep).await.is_pending() && !shutting() {
                violation(format!(
                    "sleep_until(now - {:?}) was pending at its first poll",
                    now - at
                ));
                (&mut sleep).await;
            }
        }
        3 => {
            let (outer, inner) = (
                Duration::from_micros(rng.range(0..=10_000)),
                Duration::from_micros(rng.range(0..=10_000)),
            );
            let before = Instant::now();
            match timer.timeout(outer, timer.sleep(inner)).await {
                Ok(()) => check_complete(
                    "timeout's inner sleep",
                    before.checked_add(inner),
                    shutting(),
                ),
                Err(elapsed) => check_complete(
                    "timeout",
                    before.checked_add(outer),
                    elapsed.refused().is_some(),
                ),
            }
        }
        4 => {
            // Armed, then re-armed earlier or later.
            let mut sleep = timer.sleep(Duration::from_micros(rng.range(0..=20_000)));
            let _ = poll_once(&mut sleep).await;
            let at = Instant::now() + Duration::from_micros(rng.range(0..=20_000));
            Pin::new(&mut sleep).reset(at.into());
            if sleep.deadline() != at {
                violation(format!(
                    "Sleep::reset({at:?}) but deadline() = {:?}",
                    sleep.deadline()
                ));
            }
            (&mut sleep).await;
            check_complete("re-armed sleep", Some(at), sleep.refused().is_some());
        }
        5 => {
            // Armed and dropped while pending.
            let mut sleep = timer.sleep(Duration::from_micros(rng.range(100..=50_000)));
            let _ = poll_once(&mut sleep).await;
            drop(sleep);
        }
        6 => {
            let period = Duration::from_micros(rng.range(1_000..=5_000));
            let mut interval = timer.interval(period);
            let mut last: Option<Instant> = None;
            for _ in 0..rng.range(2..=4) {
                let due = interval.tick().await;
                if !interval.is_shut_down() && Instant::now() < due {
                    violation(format!(
                        "an interval tick due at {due:?} completed {} µs early",
                        (due - Instant::now()).as_micros()
                    ));
                }
                if last.is_some_and(|last| due <= last) {
                    violation(format!(
                        "interval ticks not increasing: {last:?} then {due:?}"
                    ));
                }
                last = Some(due.into_std());
            }
        }
        _ => {
            // Several sleeps at once, each checked.
            let before = Instant::now();
            let mut sleeps: Vec<(Duration, Sleep)> = (0..rng.range(2..=8))
                .map(|_| {
                    let delay = Duration::from_micros(rng.range(0..=8_000));
                    (delay, timer.sleep(delay))
                })
                .collect();
            std::future::poll_fn(|cx| {
                sleeps.retain_mut(|(delay, sleep)| {
                    if Pin::new(&mut *sleep).poll(cx).is_ready() {
                        check_complete(
                            "one of several sleeps",
                            before.checked_add(*delay),
                            sleep.refused().is_some(),
                        );
                        false
                    } else {
                        true
                    }
                });
                if sleeps.is_empty() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
        }
    }
}

/// The tokio load: up to 32 tasks of [`future_op`] at a time on a 2-worker runtime.
fn tokio_load(timer: ShardedTimer, shared: Arc<Shared>, stop: Arc<AtomicBool>, seed: u64) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("chaos-tokio")
        .enable_time()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        let mut k = 0u64;
        // ORDERING: Relaxed: a stop flag.
        while !stop.load(Ordering::Relaxed) {
            while tasks.len() < 32 {
                k += 1;
                tasks.spawn(future_op(timer.clone(), shared.clone(), seed ^ (k << 20)));
            }
            if let Some(Err(error)) = tasks.join_next().await {
                violation(format!("a tokio task failed: {error}"));
            }
            bump(Op::TokioFuture);
        }
        while let Some(result) = tasks.join_next().await {
            if let Err(error) = result {
                violation(format!("a tokio task failed: {error}"));
            }
            bump(Op::TokioFuture);
        }
    });
}

// ---------------------------------------------------------------------------------
// The hand-written executor

/// A boxed task future.
type TaskFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The executor's run queue.
#[derive(Debug)]
struct RunQueue {
    /// Woken tasks.
    woken: Mutex<VecDeque<Arc<Task>>>,
    /// The executor thread.
    thread: std::thread::Thread,
}

/// A task: its future lives here, and the task lives only in the run queue and in
/// its wakers (the executor keeps no list of tasks), so dropping its last waker drops
/// it.
struct Task {
    /// The future, `None` once complete.
    future: Mutex<Option<TaskFuture>>,
    /// Where waking queues it.
    queue: Arc<RunQueue>,
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task").finish_non_exhaustive()
    }
}

impl Wake for Task {
    fn wake(self: Arc<Self>) {
        let queue = self.queue.clone();
        queue
            .woken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(self);
        queue.thread.unpark();
    }
}

/// A waker that wakes nobody (an orphan task's other sleeps).
#[derive(Debug)]
struct Nobody;

impl Wake for Nobody {
    fn wake(self: Arc<Self>) {}
}

/// Counts a hand-written task alive until dropped.
#[derive(Debug)]
struct Alive(Arc<Shared>);

impl Alive {
    /// One more task alive.
    fn new(shared: &Arc<Shared>) -> Alive {
        // ORDERING: Relaxed: a count polled until it reaches 0; no data rides on it.
        shared.hand_tasks.fetch_add(1, Ordering::Relaxed);
        Alive(shared.clone())
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        PROGRESS.fetch_add(1, Ordering::Relaxed);
        // ORDERING: Relaxed: as in `new`.
        self.0.hand_tasks.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An orphan task's anchor: a sleep whose stored waker is the task's only strong
/// reference once the executor has polled it.
type Anchor = Arc<Mutex<Option<Sleep>>>;

/// Drops one anchor sleep (from any thread): its waker, and with it the orphan task
/// and that task's other sleeps, are dropped when the service lets the waker go.
fn drop_anchor(shared: &Shared) {
    let anchor = shared
        .anchors
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .pop();
    if let Some(anchor) = anchor {
        let sleep = anchor.lock().unwrap_or_else(|e| e.into_inner()).take();
        bump(Op::AnchorDropped);
        drop(sleep);
    }
}

/// An orphan task: polls its anchor with the task's waker and its other sleeps with
/// a waker that wakes nobody, then waits for ever.
struct Orphan {
    /// The anchor (shared with whoever drops it).
    anchor: Anchor,
    /// Far sleeps dropped with the task.
    others: Vec<Sleep>,
    /// Polled once.
    polled: bool,
    /// Counts the task alive.
    _alive: Alive,
}

impl Future for Orphan {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.polled {
            return Poll::Pending;
        }
        self.polled = true;
        if let Some(sleep) = self
            .anchor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            let _ = Pin::new(sleep).poll(cx);
        }
        let nobody = Waker::from(Arc::new(Nobody));
        let mut quiet = Context::from_waker(&nobody);
        for sleep in &mut self.others {
            let _ = Pin::new(sleep).poll(&mut quiet);
        }
        Poll::Pending
    }
}

/// The hand-written executor's thread: tasks of [`future_op`] and orphans, up to 24
/// alive at a time, until `stop`; then drops every anchor and runs until no task is
/// alive.
fn hand_load(timer: ShardedTimer, shared: Arc<Shared>, stop: Arc<AtomicBool>, seed: u64) {
    let mut rng = Rng::new(seed);
    let queue = Arc::new(RunQueue {
        woken: Mutex::new(VecDeque::new()),
        thread: std::thread::current(),
    });
    let spawn = |future: TaskFuture| {
        let task = Arc::new(Task {
            future: Mutex::new(Some(future)),
            queue: queue.clone(),
        });
        Waker::from(task).wake();
    };
    let alive = || {
        // ORDERING: Relaxed: as in `Alive`.
        shared.hand_tasks.load(Ordering::Relaxed)
    };
    let mut stopping = false;
    loop {
        // ORDERING: Relaxed: a stop flag.
        if !stopping && stop.load(Ordering::Relaxed) {
            stopping = true;
            while !shared
                .anchors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
            {
                drop_anchor(&shared);
            }
        }
        if !stopping && alive() < 24 {
            let guard = Alive::new(&shared);
            if rng.chance(15) {
                bump(Op::OrphanTask);
                let far = if rng.chance(80) {
                    FAR
                } else {
                    Duration::from_millis(rng.range(1..=20))
                };
                let anchor: Anchor = Arc::new(Mutex::new(Some(timer.sleep(far))));
                let others = (0..rng.range(2..=20))
                    .map(|_| timer.sleep(FAR + Duration::from_secs(rng.range(0..=60))))
                    .collect();
                shared
                    .anchors
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(anchor.clone());
                spawn(Box::pin(Orphan {
                    anchor,
                    others,
                    polled: false,
                    _alive: guard,
                }));
            } else {
                let op = future_op(timer.clone(), shared.clone(), rng.next());
                spawn(Box::pin(async move {
                    let _guard = guard;
                    op.await;
                    bump(Op::HandFuture);
                }));
            }
            if rng.chance(5) {
                drop_anchor(&shared);
            }
        }
        let next = queue
            .woken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        match next {
            Some(task) => {
                let waker = Waker::from(task.clone());
                let mut cx = Context::from_waker(&waker);
                let mut slot = task.future.lock().unwrap_or_else(|e| e.into_inner());
                let done = slot
                    .as_mut()
                    .is_some_and(|future| future.as_mut().poll(&mut cx).is_ready());
                let finished = if done { slot.take() } else { None };
                drop(slot);
                drop(finished);
                // This thread's references go: the task lives on in its wakers only.
            }
            None if stopping && alive() == 0 => break,
            None => std::thread::park_timeout(Duration::from_millis(1)),
        }
    }
}

// ---------------------------------------------------------------------------------
// Phases

/// Where a phase's callbacks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    Pool,
    Inline,
    Spawner,
}

/// A phase's configuration.
#[derive(Clone, Copy, Debug)]
struct Config {
    callbacks: Where,
    pool_threads: usize,
    shards: usize,
    ring: usize,
    max_pending: Option<usize>,
    tick: Duration,
    /// Shut down while the load runs, instead of at a quiescent point.
    abrupt: bool,
}

impl std::fmt::Display for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.callbacks {
            Where::Pool => write!(f, "pool of {}", self.pool_threads)?,
            Where::Inline => f.write_str("inline")?,
            Where::Spawner => f.write_str("spawner")?,
        }
        write!(
            f,
            ", {} shards, ring {}, tick {:?}, max_pending {}, {}",
            self.shards,
            self.ring,
            self.tick,
            self.max_pending
                .map_or("none".to_owned(), |n| n.to_string()),
            if self.abrupt {
                "shutdown under load"
            } else {
                "shutdown at quiescence"
            }
        )
    }
}

/// A random configuration for phase `phase`.
fn config(phase: u64, rng: &mut Rng) -> Config {
    Config {
        callbacks: [Where::Pool, Where::Inline, Where::Spawner][(phase % 3) as usize],
        pool_threads: rng.range(1..=2) as usize,
        shards: rng.range(1..=3) as usize,
        ring: [2, 4, 8, 16, 32, 64][rng.below(6) as usize],
        max_pending: rng.chance(30).then(|| rng.range(200..=3_000) as usize),
        tick: [Duration::from_micros(500), Duration::from_millis(1)][rng.below(2) as usize],
        abrupt: rng.chance(33),
    }
}

/// The spawner's threads: run each callback handed over until `stop` and the queue is
/// empty.
fn spawner_thread(
    queue: Arc<Mutex<mpsc::Receiver<Callback>>>,
    stop: Arc<AtomicBool>,
    with_spawner: Arc<Mutex<HashSet<TimerId>>>,
) {
    loop {
        let next = queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .recv_timeout(Duration::from_millis(2));
        match next {
            Ok(callback) => {
                let deadline = callback.deadline();
                if Instant::now() < deadline {
                    violation(format!(
                        "callback {} handed to the spawner before its deadline",
                        callback.id()
                    ));
                }
                let id = callback.id();
                callback.run();
                with_spawner
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
            }
            // ORDERING: Relaxed: a stop flag; set after shutdown returned.
            Err(mpsc::RecvTimeoutError::Timeout) if !stop.load(Ordering::Relaxed) => {}
            Err(_) => break,
        }
    }
}

/// What a phase measured.
#[derive(Debug, Default)]
struct PhaseOutcome {
    /// Live bytes after the phase and everything it made were dropped.
    allocated_after: usize,
}

/// Waits, printing nothing, until `condition` holds or `timeout` passes.
fn wait(timeout: Duration, condition: impl FnMut() -> bool) -> bool {
    crate::report::wait_until(timeout, condition)
}

/// The service the hang guard may read while a phase runs.
static CURRENT: Mutex<Option<(ShardedTimer, Arc<Shared>)>> = Mutex::new(None);

/// Runs one phase of `length`.
fn phase(number: u64, config: Config, length: Duration, threads: usize, seed: u64) -> PhaseOutcome {
    let mut builder = ShardedTimer::builder()
        .shards(config.shards)
        .tick(config.tick)
        .ring_capacity(config.ring)
        .pin_cores(false)
        .thread_name(format!("chaos{}", number % 100));
    if let Some(limit) = config.max_pending {
        builder = builder.max_pending(limit);
    }
    let spawned = config.callbacks == Where::Spawner;
    let (sender, receiver) = mpsc::channel::<Callback>();
    let spawner_stop = Arc::new(AtomicBool::new(false));
    // The timers whose run is with the spawner (handed over, its `run()` not yet
    // returned): at shutdown such a run of a repeating timer is its last (documented
    // on `Callbacks::spawn`), which `account_records` accepts.
    let with_spawner: Arc<Mutex<HashSet<TimerId>>> = Arc::default();
    let mut spawners = Vec::new();
    builder = match config.callbacks {
        Where::Pool => builder.callbacks(Callbacks::pool(config.pool_threads)),
        Where::Inline => builder.callbacks(Callbacks::inline()),
        Where::Spawner => {
            let receiver = Arc::new(Mutex::new(receiver));
            for k in 0..2 {
                let (receiver, stop, with) =
                    (receiver.clone(), spawner_stop.clone(), with_spawner.clone());
                spawners.push(
                    std::thread::Builder::new()
                        .name(format!("chaos-spawn{k}"))
                        .spawn(move || spawner_thread(receiver, stop, with))
                        .expect("a spawner thread"),
                );
            }
            let sender = Mutex::new(sender);
            let with = with_spawner.clone();
            builder.callbacks(Callbacks::spawn(move |callback| {
                with.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(callback.id());
                let sent = sender
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .send(callback);
                if let Err(mpsc::SendError(callback)) = sent {
                    violation(format!(
                        "callback {} handed to the spawner after its threads stopped",
                        callback.id()
                    ));
                }
            }))
        }
    };
    let timer = match builder.build() {
        Ok(timer) => timer,
        Err(error) => {
            violation(format!("phase {number}: build failed: {error}"));
            return PhaseOutcome::default();
        }
    };
    let shared = Arc::new(Shared {
        base: Instant::now(),
        ledger: Mutex::new(Vec::new()),
        shutting_down: AtomicBool::new(false),
        shut_down: AtomicBool::new(false),
        spawned,
        body_panics: AtomicU64::new(0),
        drop_panics: AtomicU64::new(0),
        caught: AtomicU64::new(0),
        repeating_runs: AtomicU64::new(0),
        repeating_cancelled: AtomicU64::new(0),
        anchors: Mutex::new(Vec::new()),
        hand_tasks: AtomicUsize::new(0),
    });
    *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) = Some((timer.clone(), shared.clone()));
    stage(format!("phase {number} ({config}): load running"));
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = Vec::new();
    for k in 0..threads {
        let (timer, shared, stop) = (timer.clone(), shared.clone(), stop.clone());
        let seed = seed ^ ((k as u64 + 1) << 40);
        loads.push(
            std::thread::Builder::new()
                .name(format!("chaos-load{k}"))
                .spawn(move || load(timer, shared, stop, seed))
                .expect("a load thread"),
        );
    }
    {
        let (timer, shared, stop) = (timer.clone(), shared.clone(), stop.clone());
        loads.push(
            std::thread::Builder::new()
                .name("chaos-tokio-main".into())
                .spawn(move || tokio_load(timer, shared, stop, seed ^ 0x70c10))
                .expect("a tokio thread"),
        );
    }
    {
        let (timer, shared, stop) = (timer.clone(), shared.clone(), stop.clone());
        loads.push(
            std::thread::Builder::new()
                .name("chaos-hand".into())
                .spawn(move || hand_load(timer, shared, stop, seed ^ 0x4a4d))
                .expect("an executor thread"),
        );
    }
    let start = Instant::now();
    let mut last_stats: Option<Stats> = None;
    while start.elapsed() < length {
        std::thread::sleep(Duration::from_millis(200).min(length.saturating_sub(start.elapsed())));
        shared.prune();
        let stats = timer.stats();
        if let Some(last) = &last_stats {
            check_monotonic(last, &stats);
        }
        last_stats = Some(stats);
    }
    let unfired;
    let mut expected_unfired = None;
    if config.abrupt {
        stage(format!("phase {number} ({config}): shutdown under load"));
        Record::set(&shared.shutting_down);
        mark_runs_with_the_spawner(&shared, &with_spawner);
        unfired = timer.shutdown();
        Record::set(&shared.shut_down);
        // ORDERING: Relaxed: a stop flag; the joins order the rest.
        stop.store(true, Ordering::Relaxed);
        stage(format!(
            "phase {number} ({config}): joining the loads after shutdown"
        ));
        for thread in loads {
            if thread.join().is_err() {
                violation(format!("phase {number}: a load thread panicked"));
            }
        }
    } else {
        // ORDERING: Relaxed: as above.
        stop.store(true, Ordering::Relaxed);
        stage(format!("phase {number} ({config}): joining the loads"));
        for thread in loads {
            if thread.join().is_err() {
                violation(format!("phase {number}: a load thread panicked"));
            }
        }
        expected_unfired = Some(quiesce(number, &config, &timer, &shared));
        stage(format!("phase {number} ({config}): shutdown at quiescence"));
        Record::set(&shared.shutting_down);
        mark_runs_with_the_spawner(&shared, &with_spawner);
        unfired = timer.shutdown();
        Record::set(&shared.shut_down);
    }
    stage(format!("phase {number} ({config}): accounting"));
    let returned = unfired.len();
    account_unfired(&shared, unfired, seed);
    if let Some(expected) = expected_unfired {
        if returned != expected {
            violation(format!(
                "phase {number} ({config}): shutdown at quiescence returned {returned} timers, {expected} were pending"
            ));
        }
    }
    // ORDERING: Relaxed: a stop flag, set after shutdown returned.
    spawner_stop.store(true, Ordering::Relaxed);
    for thread in spawners {
        if thread.join().is_err() {
            violation(format!("phase {number}: a spawner thread panicked"));
        }
    }
    let after = timer.stats();
    if after.pending != 0 || after.in_rings != 0 {
        violation(format!(
            "phase {number} ({config}): after shutdown Stats::pending = {}, in_rings = {} (both must be 0)",
            after.pending, after.in_rings
        ));
    }
    // Orphan tasks are freed once their anchors' wakers are.
    if !wait(Duration::from_secs(5), || {
        // ORDERING: Relaxed: as in `Alive`.
        shared.hand_tasks.load(Ordering::Relaxed) == 0
    }) {
        violation(format!(
            "phase {number} ({config}): {} tasks of the hand-written executor never freed after shutdown (a waker kept)",
            shared.hand_tasks.load(Ordering::Relaxed)
        ));
    }
    account_records(number, &config, &shared);
    *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) = None;
    drop(timer);
    drop(shared);
    stage(format!("phase {number} ({config}): memory settling"));
    PhaseOutcome {
        allocated_after: settled_allocation(),
    }
}

/// Live bytes once they stop falling (threads of the phase finish exiting and free
/// what they held): sampled every 50 ms until two samples are within 64 KiB, for at
/// most 3 s.
fn settled_allocation() -> usize {
    let mut last = crate::alloc::allocated();
    for _ in 0..60 {
        std::thread::sleep(Duration::from_millis(50));
        let now = crate::alloc::allocated();
        if now.abs_diff(last) < 64 << 10 {
            return now.min(last);
        }
        last = now;
    }
    last
}

/// At a quiescent point (loads joined): waits until every due timer has run and the
/// counters have caught up, checks the `Stats` identities, and returns how many
/// timers are pending (which `shutdown` must return).
fn quiesce(number: u64, config: &Config, timer: &ShardedTimer, shared: &Shared) -> usize {
    stage(format!(
        "phase {number} ({config}): waiting for every due timer to run"
    ));
    let far = |record: &Record| {
        // ORDERING: Acquire: pairs with the resets' Release stores (all joined).
        let due = record.not_before.load(Ordering::Acquire);
        due >= shared.ns(Instant::now() + FAR / 2)
    };
    // The hang guard ends this if a due timer never runs.
    loop {
        let records = shared.records();
        let waiting = records.iter().any(|record| {
            Record::get(&record.running)
                || (record.kind == Kind::OneShot && record.pending() && !far(record))
        });
        if !waiting {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let records = shared.records();
    let pending = records.iter().filter(|r| r.pending()).count() as u64;
    stage(format!(
        "phase {number} ({config}): waiting for Stats to catch up"
    ));
    let mut stats = timer.stats();
    let caught_up = wait(Duration::from_secs(5), || {
        stats = timer.stats();
        stats.in_rings == 0 && stats.pending == pending
    });
    if !caught_up {
        violation(format!(
            "phase {number} ({config}): at quiescence Stats::pending = {} and in_rings = {}, but {pending} timers are pending",
            stats.pending, stats.in_rings
        ));
    }
    let runs = Shared::read(&shared.repeating_runs);
    let cancelled_repeating = Shared::read(&shared.repeating_cancelled);
    let surplus = (stats.fired + stats.cancelled + stats.pending) as i128 - stats.scheduled as i128;
    if surplus < runs as i128 || surplus > (runs + cancelled_repeating) as i128 {
        violation(format!(
            "phase {number} ({config}): at quiescence fired {} + cancelled {} + pending {} - scheduled {} = {surplus}, but repeating timers started {runs} runs ({cancelled_repeating} of them cancelled)",
            stats.fired, stats.cancelled, stats.pending, stats.scheduled
        ));
    }
    let body = Shared::read(&shared.body_panics);
    let most = body + Shared::read(&shared.drop_panics) - Shared::read(&shared.caught);
    if stats.panicked < body || stats.panicked > most {
        violation(format!(
            "phase {number} ({config}): Stats::panicked = {} at quiescence, expected {body} to {most}",
            stats.panicked
        ));
    }
    pending as usize
}

/// Matches what `shutdown` returned against the ledger, then drops them (running
/// one in four).
fn account_unfired(shared: &Arc<Shared>, unfired: Vec<sharded_timer::Unfired>, seed: u64) {
    let by_id: HashMap<TimerId, Arc<Record>> = shared
        .records()
        .into_iter()
        .filter_map(|record| record.id.get().copied().map(|id| (id, record)))
        .collect();
    let mut rng = Rng::new(seed ^ 0xdead);
    for timer in unfired {
        bump(Op::Unfired);
        let Some(record) = by_id.get(&timer.id()) else {
            violation(format!(
                "shutdown returned timer {}, which had run, been cancelled, or was never scheduled",
                timer.id()
            ));
            continue;
        };
        if Record::get(&record.unfired) {
            violation(format!("{}: returned twice by shutdown", record.name()));
        }
        Record::set(&record.unfired);
        if Record::get(&record.cancelled) || (record.kind == Kind::OneShot && record.runs() > 0) {
            violation(format!(
                "{}: returned by shutdown after it ran or a cancel returned true",
                record.name()
            ));
        }
        let run = rng.chance(25);
        if run {
            Record::set(&record.released);
            bump(Op::UnfiredRun);
        }
        let outcome = catch_unwind(AssertUnwindSafe(move || {
            if run {
                timer.run();
            } else {
                drop(timer);
            }
        }));
        if let Err(payload) = outcome {
            if !payload_text(payload.as_ref()).starts_with(DELIBERATE) {
                violation("an Unfired panicked with a panic not ours".to_owned());
            }
            if !run {
                Shared::count(&shared.caught);
            }
        }
    }
}

/// Marks the timers whose run is with the spawner as shutdown begins (after
/// `shutting_down` is set: a run handed over later starts late and marks itself).
fn mark_runs_with_the_spawner(shared: &Shared, with_spawner: &Mutex<HashSet<TimerId>>) {
    let with = with_spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if with.is_empty() {
        return;
    }
    for record in shared.records() {
        if record.id.get().is_some_and(|id| with.contains(id)) {
            Record::set(&record.late_run);
        }
    }
}

/// Every timer accounted for: ran (one-shot), cancelled, handed back or refused.
fn account_records(number: u64, config: &Config, shared: &Shared) {
    let mut lost = 0;
    for record in shared.records() {
        let ran = record.runs() > 0;
        let cancelled = Record::get(&record.cancelled);
        let unfired = Record::get(&record.unfired);
        let refused = Record::get(&record.refused);
        let accounted = match record.kind {
            Kind::OneShot => ran || cancelled || unfired || refused,
            // A spawner's run under way at shutdown ends a repeating timer: shutdown
            // cannot hand it back, and no later run is filed.
            _ => {
                cancelled
                    || unfired
                    || refused
                    || (shared.spawned && ran && Record::get(&record.late_run))
            }
        };
        if !accounted {
            lost += 1;
            if lost <= 5 {
                // ORDERING: Acquire: as in `quiesce`.
                let due = record.not_before.load(Ordering::Acquire);
                violation(format!(
                    "phase {number} ({config}): {} lost: {} runs, no cancel returned true, not returned by shutdown (first due {} ms into the phase)",
                    record.name(),
                    record.runs(),
                    due / 1_000_000
                ));
            }
        }
    }
    if lost > 5 {
        violation(format!("phase {number}: {lost} timers lost in all"));
    }
}

// ---------------------------------------------------------------------------------
// The run

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

/// Total operations so far.
fn total_ops() -> u64 {
    OPS.iter().map(|n| n.load(Ordering::Relaxed)).sum()
}

/// Prints the per-kind counts and the verdict.
fn print_summary(seconds: Option<(f64, u64)>) {
    println!("\nchaos: operations by kind");
    for (name, count) in OP_NAMES.iter().zip(OPS.iter()) {
        println!("  {name:<24} {:>12}", count.load(Ordering::Relaxed));
    }
    let log = VIOLATION_LOG
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    for message in log.iter().take(10) {
        println!("  violation: {message}");
    }
    println!(
        "  Stats counters read lower than an earlier read, under load (not a violation): {}",
        REGRESSIONS.load(Ordering::Relaxed)
    );
    let (secs, phases) = seconds.unwrap_or((0.0, 0));
    println!(
        "chaos: {secs:.0} s, {phases} phases, {} operations, violations {}: {}",
        total_ops(),
        violations(),
        if violations() == 0 { "PASS" } else { "FAIL" }
    );
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
