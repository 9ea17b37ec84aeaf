//! The turn, and the link between a thread and a shard's core that takes it: what the
//! shard's token guards
//! ([`InCustody`]: the core and the fired queue), and what a thread needs to turn the
//! shard and dispatch what it fires ([`ShardLink`]), whichever thread holds the token:
//! the shard's own (`shard_loop.rs`, `own.rs`), the one rescuing it (`rescue.rs`), or
//! a producer filing directly (`direct.rs`, which keeps only the custody).
//!
//! # Ground rules
//!
//! - The core and what its turns fired (inline, spawn) are in the shard's
//!   [`Custody`]: whoever holds its token may turn the core.
//! - The core never runs user code, so a hold of it is never re-entered.

#![deny(unsafe_code)]

use std::cell::Cell;

use super::core::{Expired, ShardCore};
use super::custody::Custody;
use super::fired::FiredQueue;
use super::{ShardShared, FIRE_BATCH};
use crate::clock::{Clock, Nanos, Tick};
use crate::dispatch::{Dispatch, RunHome, RunTask, ShardTask};
use crate::sync::Arc;

/// What a shard's token guards (ground rules).
#[derive(Debug)]
pub(super) struct InCustody {
    /// The core; `None` once shutdown took it.
    pub(super) core: Option<ShardCore>,
    /// Fired by a turn, not yet dispatched (inline and spawn), in deadline order, and
    /// the run in progress (`fired.rs`).
    pub(super) fired: FiredQueue<ShardTask>,
}

impl InCustody {
    /// `core`, with an empty fired queue (unit tests).
    #[cfg(test)]
    pub(super) fn new(core: ShardCore) -> Self {
        InCustody {
            core: Some(core),
            fired: FiredQueue::new(),
        }
    }

    /// The core, unless shutdown took it (for direct filing and unlinking,
    /// `direct.rs`).
    pub(super) fn core_mut(&mut self) -> Option<&mut ShardCore> {
        self.core.as_mut()
    }
}

/// Everything a thread needs to turn a shard and dispatch what it fires: the shard's
/// own thread, or the one rescuing it.
#[derive(Clone, Debug)]
pub(crate) struct ShardLink {
    /// The core and its fired queue, behind the token.
    pub(super) custody: Arc<Custody<InCustody>>,
    /// The shard's shared half.
    pub(super) shared: Arc<ShardShared>,
    /// How fired timers leave the shard.
    pub(super) dispatch: Dispatch,
    /// Ticks ↔ instants.
    pub(super) clock: Clock,
    /// Where the shard's repeating runs end.
    pub(super) home: RunHome,
    /// Whether a future's wake runs on the shard thread (a [`ShardTask::Wake`]) in
    /// every mode rather than leaving as the mode says: where a shard stuck in a
    /// waker that blocks is rescued (more than one shard, rescue on, the system
    /// clock). Without a rescuer, a pool or a spawner keeps the shard clear of it.
    pub(super) wakes_here: bool,
}

/// A turn's clock reading: the tick, and (for the lateness histogram) the instant in
/// nanoseconds.
#[derive(Clone, Copy)]
pub(super) struct Reading {
    /// The tick it falls in.
    pub(super) tick: Tick,
    /// Nanoseconds since tick 0.
    pub(super) ns: Nanos,
}

impl ShardLink {
    /// The link of a new shard whose core is `core`: puts the core and an empty fired
    /// queue in a custody and gives the shard's shared half that custody's address.
    ///
    /// # Safety
    ///
    /// - The caller keeps this link (its custody) alive until the core has shut down
    ///   (`ShardCore::shut_down`), since senders reach the custody through the shared
    ///   half's pointer; and
    /// - the shard is not shared with any sender yet.
    #[allow(unsafe_code, reason = "gives the shared half the custody's address")]
    pub(super) unsafe fn new(
        core: ShardCore,
        dispatch: Dispatch,
        clock: Clock,
        wakes_here: bool,
    ) -> ShardLink {
        let shared = core.shared().clone();
        let home: RunHome = std::sync::Arc::new(shared.clone());
        let custody = Arc::new(Custody::new(InCustody {
            core: Some(core),
            fired: FiredQueue::new(),
        }));
        // SAFETY: the caller's two points are `CustodySlot::set`'s: the custody outlives
        // the core's shutdown, and no sender reads the pointer yet.
        unsafe {
            shared.custody.set(&custody);
        }
        ShardLink {
            custody,
            shared,
            dispatch,
            clock,
            home,
            wakes_here,
        }
    }

    /// Whether fired tasks leave in batches (pool, rayon) rather than through the
    /// fired queue (inline, spawn).
    pub(super) fn batches(&self) -> bool {
        self.dispatch.batches()
    }

    /// One bounded turn of the shard by the holder of its token: files new timers,
    /// takes the messages, reads the time (`now`) and expires at most
    /// [`TURN_BUDGET`] entries: into batches for `hand_over` (pool, rayon; the last,
    /// partial one too) or onto the fired queue (inline, spawn; and a future's wake
    /// in every mode where `wakes_here`). Lateness is recorded
    /// in the shard's histogram. Returns `(finished, fired_any)`, or `None` if
    /// shutdown took the core.
    ///
    /// [`TURN_BUDGET`]: super::core::TURN_BUDGET
    pub(super) fn turn(
        &self,
        held: &mut InCustody,
        now: impl FnOnce() -> Reading,
        hand_over: &dyn Fn(Vec<ShardTask>),
    ) -> Option<(bool, bool)> {
        let InCustody { core, fired } = held;
        let core = core.as_mut()?;
        let batches = self.batches();
        let lateness = &self.shared.stats.lateness;
        let reading: Cell<Option<Reading>> = Cell::new(None);
        let mut fired_any = false;
        let mut batch: Vec<ShardTask> = Vec::new();
        let finished = core.turn(
            || {
                // Read after the rings are drained, as the turn does.
                let read = now();
                reading.set(Some(read));
                read.tick
            },
            &mut |expired| {
                fired_any = true;
                let now_ns = reading
                    .get()
                    .map_or(Nanos::default(), |read: Reading| read.ns);
                let due_ns = self
                    .clock
                    .ticks()
                    .due_by(self.clock.due_tick(expired.deadline()));
                lateness.record(now_ns.since(due_ns));
                let task = match expired {
                    Expired::Fired(task) if self.wakes_here && task.only_wakes() => {
                        ShardTask::Wake(task)
                    }
                    Expired::Fired(task) => ShardTask::Fired(task),
                    Expired::Run(running) => {
                        ShardTask::Run(RunTask::new(running, self.home.clone(), self.clock))
                    }
                };
                // A future's wake leaves by the fired queue in every mode, to run on
                // this thread after the turn.
                if batches && !matches!(task, ShardTask::Wake(_)) {
                    if batch.capacity() == 0 {
                        batch.reserve_exact(FIRE_BATCH);
                    }
                    batch.push(task);
                    if batch.len() == FIRE_BATCH {
                        hand_over(::core::mem::take(&mut batch));
                    }
                } else {
                    fired.push_back(task);
                }
            },
        );
        if !batch.is_empty() {
            hand_over(batch);
        }
        Some((finished, fired_any))
    }
}
