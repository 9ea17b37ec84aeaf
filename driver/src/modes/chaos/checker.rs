//! The ledger: one record per timer, shared by its callback and whoever holds its
//! handle, and the checks made at the start of each run (*exactly once*, *never
//! early*, runs of one repeating timer never overlapping); the `Stats` counters that
//! must never go backwards.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sharded_timer::{Sleep, Stats, TimerId};

use super::report::{bump, violation, Op, REGRESSIONS};

/// What kind of timer a record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    OneShot,
    Repeating,
    FixedDelay,
}

/// One timer's bookkeeping, shared by its callback and whoever holds its handle.
#[derive(Debug)]
pub(super) struct Record {
    /// What it is.
    pub(super) kind: Kind,
    /// No run may start before this (ns after the phase's base); for a repeating
    /// timer, its first grid point. At or before the real deadline.
    pub(super) not_before: AtomicU64,
    /// Period or delay of a repeating or fixed-delay timer, ns.
    pub(super) period_ns: u64,
    /// Runs started.
    pub(super) runs: AtomicU32,
    /// A run is under way.
    pub(super) running: AtomicBool,
    /// When the last run ended (ns after the base).
    last_end: AtomicU64,
    /// A `cancel` returned `true`.
    pub(super) cancelled: AtomicBool,
    /// A repeating timer's callback has been dropped (its [`DropFlag`] capture).
    pub(super) callback_dropped: AtomicBool,
    /// When a `cancel` won: whether the callback was still held (not yet dropped) as
    /// it returned, i.e. a run was under way, and how many runs had started then
    /// (both stored before `cancelled`, which publishes them).
    under_way_at_cancel: AtomicBool,
    /// See `under_way_at_cancel`.
    runs_at_cancel: AtomicU32,
    /// `shutdown` returned it.
    pub(super) unfired: AtomicBool,
    /// `schedule` refused it.
    pub(super) refused: AtomicBool,
    /// The driver ran it through `Unfired::run` (no deadline applies).
    pub(super) released: AtomicBool,
    /// A run started once `shutdown` had begun (a spawner's: a repeating timer whose
    /// run is out at shutdown is neither handed back nor run again).
    pub(super) late_run: AtomicBool,
    /// Its id, once `schedule` returned.
    pub(super) id: OnceLock<TimerId>,
}

impl Record {
    /// A record due no earlier than `not_before`.
    pub(super) fn new(kind: Kind, not_before: u64, period_ns: u64) -> Arc<Record> {
        Arc::new(Record {
            kind,
            not_before: AtomicU64::new(not_before),
            period_ns,
            runs: AtomicU32::new(0),
            running: AtomicBool::new(false),
            last_end: AtomicU64::new(0),
            cancelled: AtomicBool::new(false),
            callback_dropped: AtomicBool::new(false),
            under_way_at_cancel: AtomicBool::new(false),
            runs_at_cancel: AtomicU32::new(0),
            unfired: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            released: AtomicBool::new(false),
            late_run: AtomicBool::new(false),
            id: OnceLock::new(),
        })
    }

    /// Records a `cancel` that returned `true`, last `cancelled`.
    ///
    /// A repeating timer's run is begun by the library (`begin_call`) before its
    /// callback's first instruction, so a run begun just before a winning cancel may
    /// enter `start_run` after it returned. The docs of `TimerHandle::cancel` tell the
    /// two cases apart: with no run under way the callback's captures are dropped
    /// before `cancel` returns; with one under way, that run finishes and its runner
    /// drops them. So a callback still held here allows exactly one more run to start
    /// (the next one), and a callback already dropped allows none; a one-shot, none.
    pub(super) fn note_cancel_won(&self) {
        // ORDERING: Relaxed: published by the Release store of `cancelled` below.
        let under_way = self.kind != Kind::OneShot && !Record::get(&self.callback_dropped);
        self.under_way_at_cancel.store(under_way, Ordering::Relaxed);
        self.runs_at_cancel.store(self.runs(), Ordering::Relaxed);
        Record::set(&self.cancelled);
    }

    /// Reads a flag.
    pub(super) fn get(flag: &AtomicBool) -> bool {
        // ORDERING: Acquire pairs with the Release stores in `set`.
        flag.load(Ordering::Acquire)
    }

    /// Sets a flag.
    pub(super) fn set(flag: &AtomicBool) {
        // ORDERING: Release pairs with the Acquire loads in `get`.
        flag.store(true, Ordering::Release);
    }

    /// Runs started.
    pub(super) fn runs(&self) -> u32 {
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
    pub(super) fn pending(&self) -> bool {
        if Self::get(&self.refused) || Self::get(&self.cancelled) || Self::get(&self.unfired) {
            return false;
        }
        self.kind != Kind::OneShot || self.runs() == 0
    }

    /// The id, for messages.
    pub(super) fn name(&self) -> String {
        match self.id.get() {
            Some(id) => format!("{:?} timer {id}", self.kind),
            None => format!("{:?} timer (id not yet known)", self.kind),
        }
    }
}

/// What one phase's callbacks and loads share (never a service clone).
#[derive(Debug)]
pub(super) struct Shared {
    /// Deadlines are kept as ns after this.
    pub(super) base: Instant,
    /// Every timer of the phase not yet settled.
    pub(super) ledger: Mutex<Vec<Arc<Record>>>,
    /// `shutdown` has been called.
    pub(super) shutting_down: AtomicBool,
    /// `shutdown` has returned.
    pub(super) shut_down: AtomicBool,
    /// Callbacks go to a spawner (they may run after `shutdown` returned).
    pub(super) spawned: bool,
    /// Callback bodies that panicked.
    pub(super) body_panics: AtomicU64,
    /// Panicking captures dropped (anywhere).
    pub(super) drop_panics: AtomicU64,
    /// Panics of captures that the driver caught on its own threads.
    pub(super) caught: AtomicU64,
    /// Runs of repeating and fixed-delay timers started.
    pub(super) repeating_runs: AtomicU64,
    /// Repeating and fixed-delay timers cancelled (`true`).
    pub(super) repeating_cancelled: AtomicU64,
    /// Anchor sleeps of orphan tasks, for any thread to drop.
    pub(super) anchors: Mutex<Vec<Anchor>>,
    /// Tasks of the hand-written executor alive.
    pub(super) hand_tasks: AtomicUsize,
    /// One-shot callbacks whose body (and the drop of its captures, which may schedule)
    /// is under way: quiescence waits for them, since a started one-shot is no longer
    /// pending but may still schedule a timer ([`InCallback`]).
    pub(super) in_callbacks: AtomicUsize,
}

/// A one-shot callback's body under way, counted in [`Shared::in_callbacks`] from
/// before its run is recorded until after its captures are dropped (declared first in
/// the body, it is dropped last). Without it, a 10-minute chaos run once counted the
/// pending timers while a started callback was still to schedule one, and shutdown
/// then returned one more than counted.
pub(super) struct InCallback<'a>(&'a Shared);

impl<'a> InCallback<'a> {
    /// Counts a callback body in.
    pub(super) fn enter(shared: &'a Shared) -> Self {
        // ORDERING: SeqCst: read by `quiesce` beside the ledger's run counts; a
        // count, not a hot path.
        shared.in_callbacks.fetch_add(1, Ordering::SeqCst);
        InCallback(shared)
    }
}

impl Drop for InCallback<'_> {
    fn drop(&mut self) {
        // ORDERING: SeqCst: as in `enter`.
        self.0.in_callbacks.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    /// `instant` as ns after the base (0 before it).
    pub(super) fn ns(&self, instant: Instant) -> u64 {
        instant.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// ns after the base of `instant + delay`, saturating.
    pub(super) fn ns_after(&self, instant: Instant, delay: Duration) -> u64 {
        match instant.checked_add(delay) {
            Some(deadline) => self.ns(deadline),
            None => u64::MAX,
        }
    }

    /// Files a record in the ledger.
    pub(super) fn file(&self, record: &Arc<Record>) {
        self.ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(record.clone());
    }

    /// Forgets settled records.
    pub(super) fn prune(&self) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        ledger.retain(|record| !record.settled());
    }

    /// A copy of the ledger.
    pub(super) fn records(&self) -> Vec<Arc<Record>> {
        self.ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Increments a counter.
    pub(super) fn count(counter: &AtomicU64) {
        // ORDERING: Relaxed: read at quiescent points, after joins.
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads a counter.
    pub(super) fn read(counter: &AtomicU64) -> u64 {
        // ORDERING: Relaxed: as in `count`.
        counter.load(Ordering::Relaxed)
    }
}

/// The checks at the start of a run of `record`; returns the run's number (1-based).
pub(super) fn start_run(shared: &Shared, record: &Record) -> u32 {
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
        // ORDERING: Relaxed: published by `cancelled`'s Release store, read above
        // with Acquire (`Record::note_cancel_won`).
        let under_way = record.under_way_at_cancel.load(Ordering::Relaxed);
        let runs_then = record.runs_at_cancel.load(Ordering::Relaxed);
        if !(under_way && run == runs_then + 1) {
            violation(format!(
                "{}: run {run} started after cancel() returned true ({} runs then, {})",
                record.name(),
                runs_then,
                if under_way {
                    "a run under way"
                } else {
                    "none under way: its callback was already dropped"
                }
            ));
        }
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

/// A repeating timer's callback capture that records its drop
/// ([`Record::note_cancel_won`]).
pub(super) struct DropFlag(pub(super) Arc<Record>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        Record::set(&self.0.callback_dropped);
    }
}

/// The end of a run of a repeating or fixed-delay timer.
pub(super) fn end_run(shared: &Shared, record: &Record) {
    // ORDERING: Release pairs with the Acquire load in `start_run`.
    record
        .last_end
        .store(shared.ns(Instant::now()), Ordering::Release);
    // ORDERING: Release pairs with the AcqRel swap in `start_run`.
    record.running.store(false, Ordering::Release);
}

/// An orphan task's anchor: a sleep whose stored waker is the task's only strong
/// reference once the executor has polled it.
pub(super) type Anchor = Arc<Mutex<Option<Sleep>>>;

/// Counters that must never go backwards.
pub(super) fn check_monotonic(last: &Stats, now: &Stats) {
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
