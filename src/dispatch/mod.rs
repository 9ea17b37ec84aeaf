//! How fired work leaves a shard: the one home of dispatch.
//!
//! - [`Callbacks`] is the user's configuration (pool, inline, a spawner, rayon);
//!   [`Dispatch`] is what a shard builds from it, and hands each fired task to.
//! - [`ShardTask`] is what a shard fires: a one-shot timer's callback, one run of a
//!   repeating timer ([`RunTask`], which hands its entry back through a [`RunSink`],
//!   as a cancel does through `CancelSink`), or a manual clock's batch mark.
//! - [`Callback`] is a fired timer as a user's spawner receives it.
//!
//! This module names neither the shard nor the service: the shard loop imports it,
//! never the other way round (`tests/layout.rs` fails on any import cycle in `src/`).

#![forbid(unsafe_code)]

mod callback;
mod callbacks;
mod run;

pub use callback::Callback;
pub use callbacks::Callbacks;
pub(crate) use callbacks::Mode;
#[cfg(loom)]
pub use run::{RunHome, RunSink, RunTask};
#[cfg(not(loom))]
pub(crate) use run::{RunHome, RunSink, RunTask};

use crate::clock::{BatchMark, Clock, Nanos};
use crate::entry::FiredEntry;
use crate::executor::{run_caught, Executor, Task};
use crate::sync::{Arc, AtomicU64, Ordering};

/// What a shard hands the executor.
#[derive(Debug)]
pub(crate) enum ShardTask {
    /// A one-shot timer that fired.
    Fired(FiredEntry),
    /// A future's timer that fired (its run only wakes a task), to run on the shard
    /// thread in every mode (`ShardLink`'s `wakes_here`).
    Wake(FiredEntry),
    /// One run of a repeating timer.
    Run(RunTask),
    /// One end of a pool batch under a manual clock (`src/clock/manual.rs`).
    Mark(BatchMark),
}

impl Task for ShardTask {
    fn run(self) {
        match self {
            ShardTask::Fired(task) | ShardTask::Wake(task) => task.run(),
            ShardTask::Run(task) => task.run(),
            ShardTask::Mark(mark) => mark.run(),
        }
    }

    fn after_its_batch(&self) -> bool {
        matches!(self, ShardTask::Mark(BatchMark::End(_)))
    }
}

impl ShardTask {
    /// The timer's id and its (or this run's) deadline in nanoseconds from tick 0;
    /// `None` for a mark.
    pub(crate) fn timer(&self) -> Option<(crate::id::TimerId, Nanos)> {
        match self {
            ShardTask::Fired(task) | ShardTask::Wake(task) => Some((task.id(), task.deadline())),
            ShardTask::Run(task) => Some((task.running.id(), task.running.deadline())),
            ShardTask::Mark(_) => None,
        }
    }

    /// Gives the task up unrun (a spawner dropped its `Callback`): a one-shot timer's
    /// callback is dropped; a repeating timer is cancelled, so that no later run is
    /// handed over again.
    pub(crate) fn cancel_unrun(self) {
        match self {
            ShardTask::Fired(task) | ShardTask::Wake(task) => drop(task),
            ShardTask::Run(task) => task.cancel(),
            ShardTask::Mark(mark) => drop(mark),
        }
    }
}

/// A user's spawner.
/// `std`'s `Arc`, also under loom (whose `Arc` cannot hold a `dyn Fn`); it is only
/// cloned and dropped, never part of a protocol.
pub(crate) type Spawner = std::sync::Arc<dyn Fn(Callback) + Send + Sync>;

/// Where a shard sends what fired.
#[derive(Clone)]
pub(crate) enum Dispatch {
    /// Batches to the built-in pool.
    Pool(Executor<ShardTask>),
    /// Run here, in order; panics counted in the service's counter.
    Inline(Arc<AtomicU64>),
    /// Handed to the spawner here, in order, as `Callback`s counting their panics in
    /// the service's counter.
    Spawn(Spawner, Arc<AtomicU64>),
    /// Batches spawned as rayon jobs; panics counted in the service's counter.
    #[cfg(feature = "rayon")]
    Rayon(std::sync::Arc<rayon::ThreadPool>, Arc<AtomicU64>),
}

impl core::fmt::Debug for Dispatch {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Dispatch::Pool(_) => "Pool",
            Dispatch::Inline(_) => "Inline",
            Dispatch::Spawn(..) => "Spawn",
            #[cfg(feature = "rayon")]
            Dispatch::Rayon(..) => "Rayon",
        })
    }
}

impl Dispatch {
    /// Whether fired tasks leave in batches (the pool, rayon) rather than one at a
    /// time on this thread (inline, a spawner).
    pub(crate) fn batches(&self) -> bool {
        match self {
            Dispatch::Pool(_) => true,
            #[cfg(feature = "rayon")]
            Dispatch::Rayon(..) => true,
            Dispatch::Inline(_) | Dispatch::Spawn(..) => false,
        }
    }

    /// Whether the pool has more batches waiting than its workers can start at once,
    /// twice over (`Executor::is_backed_up`); rayon, inline and a spawner: never
    /// (rayon has no queue to look at; the others run on the shard thread).
    pub(crate) fn is_backed_up(&self) -> bool {
        match self {
            Dispatch::Pool(executor) => executor.is_backed_up(),
            _ => false,
        }
    }

    /// Hands over a batch of fired tasks (the pool, rayon).
    pub(crate) fn submit(&self, batch: Vec<ShardTask>, clock: Clock) {
        match self {
            Dispatch::Pool(executor) => executor.submit(batch),
            #[cfg(feature = "rayon")]
            Dispatch::Rayon(pool, panicked) => {
                let panicked = panicked.clone();
                pool.spawn(move || {
                    for task in batch {
                        if run_caught(task) {
                            // ORDERING: Relaxed: a statistic.
                            panicked.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
            Dispatch::Inline(_) | Dispatch::Spawn(..) => {
                for task in batch {
                    self.one(task, clock);
                }
            }
        }
    }

    /// Runs or hands over one fired task on this (the shard's) thread. A panic, of
    /// the callback or of the spawner, is caught and counted.
    pub(crate) fn one(&self, task: ShardTask, clock: Clock) {
        if let ShardTask::Wake(_) = task {
            // A future's wake, in any mode: here.
            if run_caught(task) {
                self.count_panicked();
            }
            return;
        }
        match self {
            Dispatch::Pool(_) => self.submit(vec![task], clock),
            #[cfg(feature = "rayon")]
            Dispatch::Rayon(..) => self.submit(vec![task], clock),
            Dispatch::Inline(_) => {
                if run_caught(task) {
                    self.count_panicked();
                }
            }
            Dispatch::Spawn(spawner, panicked) => {
                let Some((id, deadline)) = task.timer() else {
                    task.run(); // a batch mark: never handed to a spawner
                    return;
                };
                // The deadline asked for, as the handle reports it (guarantee 11).
                let callback =
                    Callback::new(id, clock.ns_to_instant(deadline), task, panicked.clone());
                if run_caught(SpawnCall(spawner.clone(), callback)) {
                    self.count_panicked();
                }
            }
        }
    }

    /// Counts a task that panicked on this (the shard's) thread in the counter of
    /// the service's callbacks.
    fn count_panicked(&self) {
        match self {
            Dispatch::Pool(executor) => executor.count_panicked(),
            #[cfg(feature = "rayon")]
            Dispatch::Rayon(_, panicked) => {
                // ORDERING: Relaxed: a statistic.
                panicked.fetch_add(1, Ordering::Relaxed);
            }
            Dispatch::Inline(panicked) | Dispatch::Spawn(_, panicked) => {
                // ORDERING: Relaxed: a statistic.
                panicked.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// One call of a spawner, as a task so that `run_caught` catches its panic (and its
/// payload's).
struct SpawnCall(Spawner, Callback);

impl Task for SpawnCall {
    fn run(self) {
        let SpawnCall(spawner, callback) = self;
        spawner(callback);
    }
}

impl Dispatch {
    /// What a shard builds from the user's `mode`: batches to `executor` (the pool),
    /// or the mode's own way; panics are counted in `panicked`.
    pub(crate) fn new(
        mode: Mode,
        executor: &Executor<ShardTask>,
        panicked: &Arc<AtomicU64>,
    ) -> Self {
        match mode {
            Mode::Pool(_) => Dispatch::Pool(executor.clone()),
            Mode::Inline => Dispatch::Inline(panicked.clone()),
            Mode::Spawn(spawner) => Dispatch::Spawn(spawner, panicked.clone()),
            #[cfg(feature = "rayon")]
            Mode::Rayon(pool) => Dispatch::Rayon(pool, panicked.clone()),
        }
    }
}
