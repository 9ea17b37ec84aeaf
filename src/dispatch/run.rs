//! One run of a repeating timer ([`RunTask`]), and the way it hands its entry back to
//! its shard ([`RunSink`]), as a cancel does through `CancelSink`.

#![forbid(unsafe_code)]

use std::time::Instant;

use crate::clock::{Clock, Tick};
use crate::entry::{EntryRef, RunningEntry};

/// Where a run of a repeating timer ends: its shard, seen only through what a run
/// needs. `ShardShared` implements it; the dispatch code never names the shard, so the
/// shard can name the dispatch code without an import cycle.
pub trait RunSink: Send + Sync + std::fmt::Debug {
    /// The service's now (its manual clock's, or the system's).
    fn now(&self) -> Instant;
    /// Counts `runs` runs skipped because they fell a whole period behind.
    fn count_skipped(&self, runs: u64);
    /// Files the next run, due at tick `next`; if the shard has shut down, hands the
    /// entry to its late list instead.
    fn refile_run(&self, entry: EntryRef, next: Tick);
    /// Counts a repeating timer cancelled while out of the wheel for a run.
    fn count_run_cancelled(&self);
    /// Counts a run that was handed over but never started (a cancel won before it
    /// began, or it was given up unrun): not a fire (`Stats::fired`).
    fn count_run_unstarted(&self);
    /// Frees the room a cancelled repeating timer held under `max_pending` (if the
    /// service has that bound).
    fn release_room(&self);
}

/// A shard as its runs reach it: `std`'s `Arc`, also under loom (whose `Arc` cannot
/// hold a `dyn` value); one per shard, cloned into each run. What it points to holds the
/// shard's own (loom-tracked) `Arc`.
pub type RunHome = std::sync::Arc<dyn RunSink>;

/// One run of a repeating timer, on an executor thread: run the callback, schedule the
/// next run at the fixed rate (skipping runs whose slots passed), end the run, and
/// hand the entry back to its shard. A panic is re-raised after that, so the executor
/// counts it and the timer keeps going.
#[derive(Debug)]
pub struct RunTask {
    /// The entry, holding `RUNNING`.
    pub(super) running: RunningEntry,
    /// Its shard, to file the next run.
    home: RunHome,
    /// Ticks ↔ instants.
    clock: Clock,
}

impl RunTask {
    /// The run `running`, ending at `home`, whose ticks `clock` converts.
    pub(crate) fn new(running: RunningEntry, home: RunHome, clock: Clock) -> RunTask {
        RunTask {
            running,
            home,
            clock,
        }
    }

    /// A run for the loom models: ending at `home`, with a clock of 1-ns ticks from
    /// now (the models' cores use 1-ns ticks too).
    #[cfg(loom)]
    pub fn for_model(running: RunningEntry, home: RunHome) -> RunTask {
        RunTask::new(running, home, Clock::at(Instant::now(), 1))
    }

    /// Runs the callback once and ends the run (see the type's docs); the executor's
    /// and the inline dispatch's way in. If a handle's cancel won while the run
    /// waited for a worker, the run does not start: a `true` cancel is final (the
    /// timer's state word decides which came first, `entry/state.rs`); it only ends,
    /// counting the cancel and dropping the callback.
    pub fn run(mut self) {
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.running.call()));
        match outcome {
            Ok(true) => self.end(None),
            Ok(false) => self.end_unstarted(),
            Err(panic) => self.end(Some(panic)),
        }
    }

    /// Ends a run that a cancel stopped before it started: no next run is scheduled
    /// (the timer is cancelled), the cancel is counted, and the callback is dropped.
    fn end_unstarted(self) {
        let RunTask { running, home, .. } = self;
        // Counted first: the cancel is final, and the callback (user code) is dropped
        // last, after the service's bookkeeping.
        home.count_run_unstarted();
        home.count_run_cancelled();
        if let Some(entry) = running.finish() {
            unreachable!("run invariant: a run that lost its start was cancelled ({entry:?})");
        }
    }

    /// Ends the run: schedules the next at the fixed rate, counting the runs skipped,
    /// and hands the entry back to its shard (or, if it was cancelled meanwhile, counts
    /// the cancel); then re-raises the callback's panic, if any, for the executor to
    /// count.
    fn end(self, panic: Option<Box<dyn std::any::Any + Send>>) {
        let RunTask {
            mut running,
            home,
            clock,
        } = self;
        let (next, skipped) = running.schedule_next(home.now(), |at| clock.instant_to_ns(at));
        if skipped > 0 {
            home.count_skipped(skipped);
        }
        let cancelled = match running.finish_deferred() {
            Ok(entry) => {
                home.refile_run(entry, clock.due_tick(next));
                None
            }
            Err(cancelled) => {
                home.count_run_cancelled();
                Some(cancelled)
            }
        };
        // The bookkeeping is done: only now the callback of a cancelled timer is
        // dropped (user code: a capture's `Drop` may panic). A panic of the callback
        // itself wins over one of its drop, whose payload is then forgotten, not
        // dropped (a payload may panic on drop too).
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(cancelled)));
        match (panic, dropped) {
            (Some(panic), Err(drop_panic)) => {
                core::mem::forget(drop_panic);
                std::panic::resume_unwind(panic);
            }
            (Some(panic), Ok(())) | (None, Err(panic)) => std::panic::resume_unwind(panic),
            (None, Ok(())) => {}
        }
    }

    /// The run is given up unrun: cancels the timer (unless a handle's cancel won
    /// first), frees its room, counts the cancel, and only then drops the callback.
    pub(super) fn cancel(self) {
        let RunTask { running, home, .. } = self;
        if running.try_cancel() {
            home.release_room();
        }
        home.count_run_unstarted();
        home.count_run_cancelled();
        if let Some(entry) = running.finish() {
            unreachable!("run invariant: a cancelled run hands no entry back ({entry:?})");
        }
    }
}
