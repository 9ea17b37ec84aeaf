//! What a shard's turns fired and has not yet dispatched (inline, spawn), and who runs
//! one of them now: the queue behind the shard's token (`turn.rs`), so that its
//! callbacks run one at a time, in deadline order, though two threads may pop them.
//!
//! # Ground rules
//!
//! - The token orders *pops*, not *runs*: a callback runs after the token that popped
//!   it is given back. So the queue remembers the run in progress ([`Running`]), and
//!   a pop by another thread is refused while it lasts, unless that run is stuck.
//!   The runner ends its run ([`FiredQueue::finish`]) under the token, after its
//!   callback returned.
//! - **The owner** (the shard's own thread) pops if no run is in progress, or if the
//!   one in progress is a rescuer's that has lasted `rescue_after` ticks (stuck: the
//!   owner rescues its own queue back). Each of its pops counts as *progress*.
//! - **The rescuer** (the shard that watches this one) pops only while the owner has
//!   made no progress since the rescuer judged it stuck (`judged`, read before, from
//!   the same counter): the owner is inside a callback that has lasted `rescue_after`
//!   ticks, or descheduled. That callback runs on; the rescuer's run alongside it is
//!   the rescue. An owner that came back (turned, popped) has made progress, and the
//!   rescuer stops.
//! - So, but for a stuck run, one callback of the shard runs at a time, and runs start
//!   in the order they were fired (deadline order).
//!
//! `loom-tests/tests/rescue.rs` (model 3) drives this type.

use std::collections::VecDeque;

use crate::clock::Tick;

/// Who runs a popped callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Runner {
    /// The shard's own thread.
    Owner,
    /// The shard that watches it.
    Rescuer,
}

/// The run in progress.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Running {
    /// Who runs it.
    by: Runner,
    /// Its number (runs are numbered from 1, in pop order).
    number: u64,
    /// The tick at which the rescuer began it (for the owner's staleness check); the
    /// owner's runs record none.
    since: Tick,
}

/// A popped callback's claim to the run in progress, given back by
/// [`FiredQueue::finish`].
#[derive(Debug)]
#[must_use = "a run in progress blocks other pops until it is finished"]
pub struct Claim {
    /// The run's number.
    number: u64,
}

/// The queue and the run in progress (ground rules).
#[derive(Debug)]
pub struct FiredQueue<T> {
    /// Fired, not yet popped, in deadline order.
    queue: VecDeque<T>,
    /// The run in progress, if any.
    running: Option<Running>,
    /// Runs popped so far (the last run's number).
    runs: u64,
    /// The owner's progress: its turns begun, its parks and its pops.
    progress: u64,
    /// The number of the owner's run in progress, if any: kept apart from `running`,
    /// which a rescuer's run replaces while the owner's goes on.
    owner_run: Option<u64>,
}

impl<T> Default for FiredQueue<T> {
    fn default() -> Self {
        FiredQueue {
            queue: VecDeque::new(),
            running: None,
            runs: 0,
            progress: 0,
            owner_run: None,
        }
    }
}

impl<T> FiredQueue<T> {
    /// An empty queue, no run in progress.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues a fired task behind the others.
    pub fn push_back(&mut self, task: T) {
        self.queue.push_back(task);
    }

    /// Whether nothing waits to be popped.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The owner's progress so far (ground rules).
    pub fn progress(&self) -> u64 {
        self.progress
    }

    /// Counts a turn the owner begins (or a park) as progress; returns the new count.
    pub fn owner_turned(&mut self) -> u64 {
        self.progress += 1;
        self.progress
    }

    /// The tick at which a rescuer's run in progress began, if one is in progress.
    pub fn rescuer_since(&self) -> Option<Tick> {
        self.running
            .filter(|running| running.by == Runner::Rescuer)
            .map(|running| running.since)
    }

    /// Whether the owner is running a task it popped (an inline callback, a spawner's
    /// call, a future's wake) and has not finished it.
    pub fn owner_running(&self) -> bool {
        self.owner_run.is_some()
    }

    /// The owner's pop: `None` if the queue is empty, or while a rescuer's run is in
    /// progress that `is_stuck` (given the tick it began) does not call stuck. Counts
    /// as progress when it pops.
    pub fn pop_for_owner(&mut self, is_stuck: impl FnOnce(Tick) -> bool) -> Option<(T, Claim)> {
        if self.queue.is_empty() {
            return None;
        }
        if let Some(since) = self.rescuer_since() {
            if !is_stuck(since) {
                return None;
            }
        }
        let task = self.queue.pop_front()?;
        self.progress += 1;
        let claim = self.claim(Runner::Owner, Tick::new(0));
        self.owner_run = Some(claim.number);
        Some((task, claim))
    }

    /// The rescuer's pop, at tick `now`, of a shard it judged stuck when the owner's
    /// progress was `judged`: `None` if the queue is empty, if the owner has made
    /// progress since, or while another rescuer's run is in progress.
    pub fn pop_for_rescuer(&mut self, judged: u64, now: Tick) -> Option<(T, Claim)> {
        if self.progress != judged || self.rescuer_since().is_some() {
            return None;
        }
        let task = self.queue.pop_front()?;
        Some((task, self.claim(Runner::Rescuer, now)))
    }

    /// Pops regardless of the run in progress: for a shutdown from a callback on the
    /// owner's thread, after which nothing else pops (the core is gone).
    pub fn pop_at_shutdown(&mut self) -> Option<T> {
        self.queue.pop_front()
    }

    /// Ends the run `claim` names, if it is still the one in progress (an owner that
    /// took a stuck rescuer's place replaced it).
    pub fn finish(&mut self, claim: Claim) {
        if self.owner_run == Some(claim.number) {
            self.owner_run = None;
        }
        if self
            .running
            .is_some_and(|running| running.number == claim.number)
        {
            self.running = None;
        }
    }

    /// Records a run by `by`, begun at tick `since`.
    fn claim(&mut self, by: Runner, since: Tick) -> Claim {
        self.runs += 1;
        self.running = Some(Running {
            by,
            number: self.runs,
            since,
        });
        Claim { number: self.runs }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::FiredQueue;
    use crate::clock::Tick;

    #[test]
    fn the_owner_waits_for_a_rescuers_run_unless_it_is_stuck() {
        let mut queue = FiredQueue::new();
        for task in 0..4 {
            queue.push_back(task);
        }
        let judged = queue.progress();
        let (first, rescued) = queue.pop_for_rescuer(judged, Tick::new(7)).unwrap();
        assert_eq!(first, 0);
        assert!(
            queue.pop_for_owner(|_| false).is_none(),
            "one run at a time"
        );
        assert!(
            queue.pop_for_rescuer(judged, Tick::new(7)).is_none(),
            "one rescuer run at a time"
        );
        let (second, owned) = queue
            .pop_for_owner(|since| since == Tick::new(7))
            .expect("a stuck rescuer's run lets the owner take over");
        assert_eq!(second, 1);
        queue.finish(rescued); // the stuck run ends: no effect on the owner's
        assert!(
            queue.pop_for_rescuer(judged, Tick::new(8)).is_none(),
            "owner progressed"
        );
        queue.finish(owned);
        assert_eq!(
            queue.pop_for_owner(|_| false).map(|(task, _)| task),
            Some(2)
        );
    }

    #[test]
    fn the_owners_run_stays_in_progress_while_a_rescuer_runs_beside_it() {
        let mut queue = FiredQueue::new();
        for task in 0..3 {
            queue.push_back(task);
        }
        assert!(!queue.owner_running());
        let (_, owned) = queue.pop_for_owner(|_| false).unwrap();
        assert!(queue.owner_running());
        // The owner is stuck in it: a rescuer pops and runs the next beside it.
        let judged = queue.progress();
        let (_, rescued) = queue.pop_for_rescuer(judged, Tick::new(3)).unwrap();
        queue.finish(rescued);
        assert!(
            queue.owner_running(),
            "the rescuer's run ended, not the owner's"
        );
        let (_, rescued) = queue.pop_for_rescuer(judged, Tick::new(4)).unwrap();
        queue.finish(rescued);
        queue.finish(owned);
        assert!(!queue.owner_running());
    }
}
