//! A fired timer as a spawner receives it: [`Callback`].

#![forbid(unsafe_code)]

use std::fmt;
use std::time::Instant;

use super::ShardTask;
use crate::executor::run_caught;
use crate::id::TimerId;
use crate::sync::{Arc, AtomicU64, Ordering};

/// A fired timer, handed to a [`Callbacks::spawn`](crate::Callbacks::spawn) spawner: run it where it should run.
///
/// [`run`](Self::run) runs the timer's callback on the calling thread, catching a
/// panic and counting it in its service's [`Stats::panicked`](crate::Stats::panicked).
/// A `Callback` dropped unrun drops the callback; a repeating timer's run dropped
/// unrun cancels that timer (no later run is handed over, and its handle reads
/// [`Cancelled`](crate::TimerState::Cancelled)), so a spawner whose executor has
/// shut down is not handed runs for ever. It stays runnable after the service shut down or was
/// dropped; a repeating timer whose run ends then is cancelled (after `shutdown` has
/// returned) or handed back by that `shutdown` (if it is still collecting).
pub struct Callback {
    /// What runs; taken by `run`.
    task: Option<ShardTask>,
    /// The timer.
    id: TimerId,
    /// The deadline asked for (not rounded to the tick).
    deadline: Instant,
    /// The service's count of panicked callbacks.
    panicked: Arc<AtomicU64>,
}

impl Callback {
    /// A fired timer's task.
    pub(crate) fn new(
        id: TimerId,
        deadline: Instant,
        task: ShardTask,
        panicked: Arc<AtomicU64>,
    ) -> Self {
        Callback {
            task: Some(task),
            id,
            deadline,
            panicked,
        }
    }

    /// Runs the callback here. A panic is caught and counted, never propagated.
    pub fn run(mut self) {
        if let Some(task) = self.task.take() {
            if run_caught(task) {
                // ORDERING: Relaxed: a statistic.
                self.panicked.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The timer's id.
    pub fn id(&self) -> TimerId {
        self.id
    }

    /// When the timer was due: the deadline asked for (not rounded to the tick), the
    /// same instant its [`TimerHandle::deadline`](crate::TimerHandle::deadline)
    /// reports; for a repeating timer, this run's.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl Drop for Callback {
    fn drop(&mut self) {
        // Dropped unrun: a one-shot timer's callback is dropped with its task; a
        // repeating timer's run is ended and the timer cancelled, so it neither
        // stays pending forever nor runs again.
        if let Some(task) = self.task.take() {
            task.cancel_unrun();
        }
    }
}

impl fmt::Debug for Callback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Callback")
            .field("id", &self.id)
            .field("deadline", &self.deadline)
            .finish()
    }
}
