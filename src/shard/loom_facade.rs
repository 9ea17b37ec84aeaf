//! The loom models' façade of the shard thread: a shard whose core is in custody as
//! its thread keeps it ([`ModelShard`]), and the models' ways into the code that
//! thread runs: its own borrow (`run_as_shard_thread`, `ModelShard::run_as_thread`),
//! its turn, its park (`park_for_model`) and its watch. Compiled only under
//! `--cfg loom` (`#[cfg(loom)] mod loom_facade;` in `shard.rs`); re-exported to the models
//! through `crate::__loom`.
//!
//! # Ground rules
//!
//! - A model calls the code that ships: each function here installs or reaches the
//!   real core, custody, thread-locals, plan and park, and replaces only what loom
//!   cannot run (a timed park is a plain park under loom, so a model says by a
//!   bound which sleeps it counts as correct).
//! - A model keeps a [`ModelShard`] (or a clone) until its core's `shut_down` has
//!   returned, as the shard thread keeps its link.

#![deny(unsafe_code)]

use std::time::Instant;

use super::core::ShardCore;
use super::custody::Custody;
use super::direct::DirectPort;
use super::fired::FiredQueue;
use super::own::{address, drain_own_rings, retry_deferred, Own, OWN, OWN_SHARD, PEERS};
use super::park::{park, plan_park, tell_watcher, Park, Stall};
use super::rescue::{alert_watcher, Watch};
use super::turn::{InCustody, Reading, ShardLink};
use super::ShardShared;
use crate::clock::{Clock, Nanos, Tick};
use crate::dispatch::{Dispatch, RunHome};
use crate::entry::EntryRef;
use crate::sync::{spin_loop, Arc};

/// The models' way to run `f` as code on `core`'s shard thread (an inline callback):
/// installs `core` where `drain_own_rings` and `take_own_core` find it, as
/// `ShardThread::run` does, runs `f`, and returns the core. Loom only.
///
/// # Panics
///
/// If `f` took the core (a shutdown from it): the models do not.
pub fn run_as_shard_thread(core: ShardCore, f: impl FnOnce()) -> ShardCore {
    let clock = Clock::at(Instant::now(), 1);
    let shared = core.shared().clone();
    let home: RunHome = std::sync::Arc::new(shared.clone());
    let custody = Arc::new(Custody::new(InCustody {
        core: Some(core),
        fired: FiredQueue::new(),
    }));
    OWN_SHARD.with(|own| own.set(address(&shared)));
    OWN.with(|own| {
        *own.borrow_mut() = Some(Own {
            link: ShardLink {
                custody: custody.clone(),
                shared,
                dispatch: Dispatch::Inline(Arc::new(crate::sync::AtomicU64::new(0))),
                clock,
                home,
                wakes_here: false,
            },
        });
    });
    f();
    OWN_SHARD.with(|own| own.set(0));
    OWN.with(|own| own.borrow_mut().take());
    custody
        .with(|held| held.core.take())
        .expect("model invariant: f does not shut its shard down")
}

/// A shard as the models see it: its core in custody, as `ShardThread` keeps it, so
/// that another model thread running as a shard thread (`run_as_thread`) reaches it
/// as a peer (`make_room`). Loom only.
#[derive(Clone, Debug)]
pub struct ModelShard {
    /// The shard's link, inline dispatch.
    link: ShardLink,
}

impl ModelShard {
    /// `core`'s shard, its core in custody, where its messages' senders find it
    /// (direct unlinking, `direct.rs`): the model keeps the `ModelShard` (a clone)
    /// until the core's `shut_down` has returned.
    pub fn new(core: ShardCore) -> Self {
        let dispatch = Dispatch::Inline(Arc::new(crate::sync::AtomicU64::new(0)));
        // SAFETY: the models keep a `ModelShard` until the core has shut down (above);
        // the shard is not shared with a sender yet.
        #[allow(unsafe_code, reason = "the model keeps the custody alive")]
        let link = unsafe { ShardLink::new(core, dispatch, Clock::at(Instant::now(), 1), false) };
        ModelShard { link }
    }

    /// The shard's shared half.
    pub fn shared(&self) -> &Arc<ShardShared> {
        &self.link.shared
    }

    /// Schedules a new timer as `ShardedTimer::schedule` does (`CoreHome::enqueue`):
    /// directly if the token is free, else through the insert ring.
    ///
    /// # Errors
    ///
    /// The entry comes back if the shard has shut down.
    pub fn schedule(&self, entry: EntryRef, deadline: Tick) -> Result<(), EntryRef> {
        DirectPort::new(self.link.custody.clone()).schedule(&self.link.shared, entry, deadline)
    }

    /// How many threads wait for this shard's token now (`Custody::waiters`: the owner
    /// in `with_core` or `turn_and_run`, once its first try failed).
    pub fn waiters(&self) -> u32 {
        self.link.custody.waiters()
    }

    /// One turn at tick `now` holding the token, as the shard loop takes it (its
    /// `ShardLink::turn`, inline: what fired goes on the fired queue); then pops and
    /// runs what fired, one per hold. Returns how many ran.
    pub fn turn_and_run(&self, now: u64) -> usize {
        let reading = Reading {
            tick: Tick::new(now),
            ns: Nanos::default(),
        };
        self.link
            .custody
            .with(|held| self.link.turn(held, || reading, &|_| {}));
        let mut ran = 0;
        while let Some(task) = self.link.custody.with(|held| held.fired.pop_at_shutdown()) {
            ran += 1;
            crate::executor::Task::run(task);
        }
        ran
    }

    /// A rescuer's turn at tick `now`, as `Watch::check` takes it: only if the token
    /// is free (`None` if not); what fired waits on the fired queue for the owner's
    /// `turn_and_run`. Returns whether everything due was expired.
    pub fn try_turn(&self, now: u64) -> Option<bool> {
        let reading = Reading {
            tick: Tick::new(now),
            ns: Nanos::default(),
        };
        self.link
            .custody
            .try_with(|held| self.link.turn(held, || reading, &|_| {}))
            .flatten()
            .map(|(finished, _)| finished)
    }

    /// Runs `f` on the core, holding the token (as the shard's owner does).
    ///
    /// # Panics
    ///
    /// If the core was taken (the models do not take it).
    pub fn with_core<R>(&self, f: impl FnOnce(&mut ShardCore) -> R) -> R {
        self.link.custody.with(|held| {
            f(held
                .core
                .as_mut()
                .expect("model invariant: the core is there"))
        })
    }

    /// Runs `f` as code on this shard's thread (an inline callback) whose service has
    /// `peers` (this shard among them), then retries what `f` deferred until none is
    /// left, as the shard loop's next turns do (`retry_deferred`), taking its own
    /// rings in between. Returns how many retry rounds that took.
    pub fn run_as_thread(&self, peers: &[&ModelShard], f: impl FnOnce()) -> usize {
        OWN_SHARD.with(|own| own.set(address(&self.link.shared)));
        OWN.with(|own| {
            *own.borrow_mut() = Some(Own {
                link: self.link.clone(),
            });
        });
        PEERS.with(|own_peers| {
            *own_peers.borrow_mut() = peers.iter().map(|peer| peer.link.clone()).collect();
        });
        f();
        let mut rounds = 0;
        while retry_deferred() {
            rounds += 1;
            drain_own_rings();
            spin_loop();
        }
        OWN_SHARD.with(|own| own.set(0));
        OWN.with(|own| own.borrow_mut().take());
        PEERS.with(|own_peers| own_peers.borrow_mut().clear());
        rounds
    }

    /// The shard loop's `plan_park`, holding the token, on the models' clock (the
    /// system clock, ticks of an hour, as `park_for_model`: the model runs in tick 0),
    /// with `watch` if this shard watches another; `None` if the core was taken.
    fn model_plan(&self, watch: Option<&Watch>) -> (Clock, Option<Park>) {
        let clock = Clock::at(Instant::now(), 3_600_000_000_000);
        let plan = self.link.custody.with(|held| {
            held.core
                .as_ref()
                .map(|core| plan_park(core, clock, None, 0, watch, None))
        });
        (clock, plan)
    }

    /// The shard thread's park, as its loop takes it: `plan_park` holding the token,
    /// then `park` without it (system clock, ticks of an hour, as `park_for_model`):
    /// a timed park is a plain park under loom, so the model says by `bound` which
    /// sleeps it counts as correct: a plan that sleeps until the core's next expiry,
    /// at or before tick `bound`, is not slept (the shard publishes it is awake
    /// again) and the call returns `true`; any other sleep is slept, until an unpark,
    /// and the call returns `false`.
    pub fn park_unless_due_by(&self, bound: Tick) -> bool {
        let (_, plan) = self.model_plan(None);
        match plan {
            Some(Park::Until(_, due) | Park::Indefinitely(due)) if due <= bound => {
                self.link.shared.wake_up();
                true
            }
            Some(Park::Retry { popped, cap }) => {
                // The shard loop's wait before it turns again.
                Stall::default().wait(popped, cap);
                false
            }
            Some(plan) => {
                park(plan, &self.link.shared, None, false);
                false
            }
            None => false,
        }
    }
}

impl ModelShard {
    /// A watcher's park, as its loop takes it: `plan_park` holding the token, with a
    /// fresh [`Watch`] of `watched` (`rescue_after` ticks), then `park` without it
    /// (ticks of an hour: the model runs in tick 0). A timed park is a plain park
    /// under loom, so the model says by `bound` which sleeps it counts as correct: a
    /// plan that turns again at once, or sleeps until a tick at or before `bound`, is
    /// not slept (the shard publishes it is awake again) and the call returns `true`;
    /// any other sleep is slept until an unpark, and the call returns `false`.
    pub fn watch_park_unless_looking_by(
        &self,
        watched: &ModelShard,
        rescue_after: u64,
        bound: Tick,
    ) -> bool {
        let watch = Watch::new(watched.link.clone(), rescue_after);
        let (clock, plan) = self.model_plan(Some(&watch));
        match plan {
            Some(Park::No) => true,
            Some(Park::Retry { popped, cap }) => {
                // The shard loop's wait before it turns again.
                Stall::default().wait(popped, cap);
                true
            }
            Some(Park::Until(until, _)) if clock.tick_of(until) <= bound => {
                self.link.shared.wake_up();
                true
            }
            Some(plan) => {
                park(plan, &self.link.shared, None, false);
                false
            }
            None => false,
        }
    }

    /// This shard parks with `watcher` watching it (`rescue_after` ticks), and is
    /// woken at once: `plan_park` and `park`'s `tell_watcher`, as its loop takes
    /// them, but the thread's sleep itself left out, as if a producer's unpark had
    /// come first; then it publishes it is awake, as `park` does on return.
    pub fn park_woken_at_once(&self, watcher: &ModelShard, rescue_after: u64) {
        if let (_, Some(plan)) = self.model_plan(None) {
            tell_watcher(plan, Some(&(watcher.link.shared.clone(), rescue_after)));
        }
        self.link.shared.wake_up();
    }

    /// What the shard loop does at tick `now` before this shard runs its first inline
    /// callback of a dispatch phase (`alert_watcher`), with `watcher` watching it.
    pub fn alert_watcher(&self, watcher: &ModelShard, rescue_after: u64, now: Tick) {
        alert_watcher(Some(&(watcher.link.shared.clone(), rescue_after)), now);
    }
}

/// The models' way into the shard thread's real park (`plan_park`, `park`), on the
/// system clock, with ticks of an hour (so the wall time a model takes stays in tick
/// 0). Loom only.
pub fn park_for_model(core: &ShardCore) {
    let clock = Clock::at(Instant::now(), 3_600_000_000_000);
    match plan_park(core, clock, None, 0, None, None) {
        // The shard loop's wait before it turns again.
        Park::Retry { popped, cap } => Stall::default().wait(popped, cap),
        plan => park(plan, core.shared(), None, false),
    }
}
