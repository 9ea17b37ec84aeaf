//! The rescue of a stuck shard: the shard a shard thread watches ([`Watch`]), when it
//! counts as stuck, and what its watcher then does in its owner's place; and the
//! watching handshake, by which a watcher sleeps no longer than the shard it watches
//! allows.
//!
//! # Ground rules
//!
//! - **Rescue** (`Builder::rescue_after`). Each shard thread watches one other shard
//!   (the previous, in a ring). A watched shard is *stuck* when, awake, its owner has
//!   made no progress for `rescue_after` ticks — begun no turn and popped no fired
//!   task (`progress`, counted where the work is: a shard dispatching a long inline
//!   queue is busy, not stuck) — or has overslept its own next expiry by as much. The
//!   watcher then takes its token (never waiting: if the owner holds it, the owner is
//!   back) and does what the owner would: a bounded turn, fired tasks handed to the
//!   pool, or (inline, spawn; and futures' wakes in every mode) popped one at a time
//!   and dispatched on the watcher's thread, each only while the owner's progress
//!   stays where it was judged stuck. A shard whose pool is backed up waits for it on
//!   purpose and is left alone, unless it is inside a popped task (a wake that
//!   blocks, say).
//!   The token orders pops, not runs: the queue itself (`fired.rs`) refuses a pop
//!   while another thread's run is in progress, unless that run is stuck, so the
//!   callbacks of one shard run one at a time in deadline order but for a stuck one.
//!   Every timer still fires once, from whichever thread holds the token when its
//!   turn claims it, never early (the same turn, the same clock). The owner, when its
//!   callback returns, takes the token back for its next turn and carries on once
//!   the rescuer's run in progress ends (the rescuer unparks it).
//! - **Watching costs no wake-up while both sleep.** A watcher parks no later than
//!   `rescue_after` after the watched shard's own next expiry, published as `due`
//!   when it parks (or than its last progress while it is awake: `next_wake` is
//!   [`AWAKE`]); a shard that parks with timers due earlier than its watcher's wake-up
//!   allows for unparks the watcher. Each stores before its park fence and reads the
//!   other after it, as producers do, so one of them sees the other. `due`, not the
//!   published wake-up, because a wake-up may be the shard's own watch horizon: two
//!   shards watching each other would chase each other's horizons. (The parking side
//!   is `park.rs`: `plan_park` and `tell_watcher`.)

#![deny(unsafe_code)]

use std::time::Instant;

use super::core::{ShardCore, TURN_BUDGET};
use super::fired::Claim;
use super::turn::{Reading, ShardLink};
use super::{ShardShared, AWAKE};
use crate::clock::Tick;
use crate::dispatch::ShardTask;
use crate::sync::{fence, Arc, Ordering};

/// The shard a shard thread watches, and what it learnt of it (ground rules: rescue).
#[derive(Debug)]
pub(super) struct Watch {
    /// The watched shard.
    link: ShardLink,
    /// Ticks its due timers may wait for its own thread.
    rescue_after: u64,
    /// The watched shard's progress count as last seen, and the tick at which the
    /// watcher first saw it: the owner has made no progress since (at most) then.
    seen: Option<(u64, Tick)>,
    /// Set by a rescue: the watched shard's progress then, and the tick its core next
    /// had work. While its progress stays there, the shard is still stuck, and the
    /// watcher comes back at that tick rather than `rescue_after` later.
    stuck: Option<(u64, Tick)>,
    /// The watched shard's core is gone (it shut down): nothing more to watch.
    gone: bool,
}

impl Watch {
    /// Watches `link`'s shard, rescuing it after `rescue_after` ticks (at least 1).
    pub(super) fn new(link: ShardLink, rescue_after: u64) -> Self {
        Watch {
            link,
            rescue_after: rescue_after.max(1),
            seen: None,
            stuck: None,
            gone: false,
        }
    }

    /// Records the watched shard's progress count at tick `now` (ground rules).
    fn observe(&mut self, now: Tick) {
        let progress = self.link.shared.progress();
        if self.seen.is_none_or(|(seen, _)| seen != progress) {
            // The next tick boundary, not `now` (the tick the sighting falls in, rounded
            // down): the progress may have come just before the sighting, late in that
            // tick, and a shard counts as stuck only `rescue_after` after it (counted
            // from `now`, a rescue began up to a tick early: a 10 ms rescue beside a
            // callback that had run 4.9 ms, with 10 ms ticks, in an outside audit).
            self.seen = Some((progress, Tick::new(now.get().saturating_add(1))));
        }
    }

    /// The tick from which the watched shard counts as stuck if it has not moved:
    /// `rescue_after` after its owner last made progress as far as the watcher knows
    /// (awake; a progress not yet observed counts from `now`) or after its own next
    /// expiry (asleep); [`Tick::NEVER`] if it sleeps with nothing due or is gone.
    fn stuck_from(&self, now: Tick) -> Tick {
        if self.gone {
            return Tick::NEVER;
        }
        // Awake: since its last progress (a turn begun, a park, a fired task popped: a shard
        // dispatching a long inline queue is busy, not stuck). Asleep: since its own
        // next expiry (not its wake-up, which may be its own watch horizon: watchers
        // watching each other would otherwise chase each other's horizons).
        let since = if self.link.shared.sleeps_until() == AWAKE {
            let progress = self.link.shared.progress();
            match self.seen {
                Some((seen, at)) if seen == progress => at,
                _ => now,
            }
        } else {
            self.link.shared.due()
        };
        if since == Tick::NEVER {
            return Tick::NEVER;
        }
        Tick::new(
            since
                .get()
                .saturating_add(self.rescue_after)
                .min(Tick::NEVER.get() - 1),
        )
    }

    /// The tick by which the watcher should look again.
    pub(super) fn horizon(&self, now: Tick) -> Tick {
        if let Some((progress, next)) = self.stuck {
            if self.link.shared.progress() == progress {
                // Still stuck. What it had due is rescued up to `next`; a timer filed
                // into it since (directly, or through its ring) wakes nobody, since
                // its owner counts as awake: look again every `rescue_after` while it
                // stays stuck (a stuck shard is not idle; an idle service still makes
                // no wake-ups).
                return next.min(Tick::new(
                    now.get()
                        .saturating_add(self.rescue_after)
                        .min(Tick::NEVER.get() - 1),
                ));
            }
        }
        let from = self.stuck_from(now);
        if from <= now {
            // Stuck, but its token was busy (its owner is back, or mid-turn): soon.
            Tick::new(now.get() + 1)
        } else {
            from
        }
    }

    /// Rescues the watched shard if it is stuck at `now` (ground rules): up to one
    /// turn's budget of its fired tasks dispatched here, one at a time and only while
    /// its owner makes no progress (`fired.rs`), or one bounded turn handed to the
    /// pool.
    pub(super) fn check(&mut self, now: Instant) {
        let tick = self.link.clock.tick_of(now);
        self.observe(tick);
        if let Some((progress, _)) = self.stuck {
            if self.link.shared.progress() != progress {
                self.stuck = None; // its owner made progress since: back
            }
        }
        if self.stuck.is_none() && self.stuck_from(tick) > tick {
            return;
        }
        // Its pool has more than it can start: the owner may be waiting for it on
        // purpose, mid-burst (then the pool is the bottleneck, not the shard), unless
        // it is inside a task it popped off its fired queue (a future's wake, run on
        // the shard in every mode), which the pool's backlog says nothing about.
        let backed_up = self.link.dispatch.is_backed_up();
        // The owner's progress, unchanged since `rescue_after` ago: every pop below
        // re-checks it under the token, and stops once the owner is back.
        let Some((judged, _)) = self.seen else {
            return;
        };
        let link = self.link.clone();
        let reading = Reading {
            tick,
            ns: link.clock.instant_to_ns(now),
        };
        let hand_over = |batch: Vec<ShardTask>| link.dispatch.submit(batch, link.clock);
        for _ in 0..TURN_BUDGET {
            let step = link.custody.try_with(|held| {
                if held.core.is_none() {
                    return Rescue::Gone;
                }
                if held.fired.progress() != judged {
                    return Rescue::Back;
                }
                if backed_up && !held.fired.owner_running() {
                    return Rescue::PoolBound;
                }
                if held.fired.is_empty() {
                    link.turn(held, || reading, &hand_over);
                }
                let next = held.core.as_ref().and_then(ShardCore::next_expiry);
                // Rounded up, as a sighting is (`observe`): the owner may take its
                // queue back only once this run has lasted `rescue_after` in full.
                let started = Tick::new(link.clock.tick_of(Instant::now()).get().saturating_add(1));
                match held.fired.pop_for_rescuer(judged, started) {
                    Some((task, claim)) => Rescue::Run(task, claim),
                    None if held.fired.is_empty() => Rescue::Done(next.unwrap_or(Tick::NEVER)),
                    None => Rescue::Back,
                }
            });
            match step {
                // Its owner holds the token: it is back.
                None => return,
                Some(Rescue::Back) => {
                    self.stuck = None;
                    return;
                }
                // Judged again at the next check, as before the pool backed up.
                Some(Rescue::PoolBound) => return,
                Some(Rescue::Gone) => {
                    self.gone = true;
                    self.stuck = None;
                    return;
                }
                Some(Rescue::Done(next)) => {
                    self.stuck = Some((judged, next));
                    return;
                }
                Some(Rescue::Run(task, claim)) => {
                    // Counted in the rescued shard's stats, not the watcher's: the
                    // task carries its own shard's accounting.
                    link.dispatch.one(task, link.clock);
                    // The run ends under the token (a bounded hold, never user code);
                    // an owner that came back meanwhile may be parked, waiting for it.
                    let back = link.custody.with(|held| {
                        held.fired.finish(claim);
                        held.fired.progress() != judged
                    });
                    if back {
                        link.shared.nudge();
                        self.stuck = None;
                        return;
                    }
                }
            }
        }
        // More fired tasks wait: come back at once.
        self.stuck = Some((judged, tick));
    }
}

/// One step of a rescue.
enum Rescue {
    /// The watched shard shut down.
    Gone,
    /// Its owner made progress since it was judged stuck: it is back.
    Back,
    /// Its pool is backed up and its owner runs no popped task: it waits for the
    /// pool on purpose.
    PoolBound,
    /// A fired task to dispatch here, and its claim to the run.
    Run(ShardTask, Claim),
    /// Nothing more due; its core next has work at this tick.
    Done(Tick),
}

/// Before this shard runs user code inline, which may block it: makes sure its
/// watcher looks within `rescue_after` of `now` (ground rules: watching). A shard
/// tells its watcher when to look as it parks; one woken from a park (by a producer
/// filing an earlier timer, or its own timeout) that fires and runs a callback in the
/// turn it wakes to has not parked since, and its watcher may sleep on a horizon it
/// planned from the `due` published then (indefinitely, if that shard had nothing
/// due). Found under load: a stall beginning so was never rescued.
pub(super) fn alert_watcher(watcher: Option<&(Arc<ShardShared>, u64)>, now: Tick) {
    let Some((watcher, rescue_after)) = watcher else {
        return;
    };
    // ORDERING: the SeqCst fence orders this shard's `AWAKE` (stored when its park
    // ended) and its progress before the read of the watcher's wake-up; it pairs with
    // the fence in the watcher's `prepare_park`, after which the watcher reads this
    // shard's state again (`plan_park`). So either this read sees the watcher's planned
    // sleep and unparks it, or the watcher sees this shard awake and does not sleep
    // past its horizon.
    fence(Ordering::SeqCst);
    nudge_unless_looking_by(watcher, now.get().saturating_add(*rescue_after));
}

/// Unparks `watcher` if it sleeps past tick `by`, the latest it must look: its horizon
/// predates what this shard has due, and it recomputes it.
pub(super) fn nudge_unless_looking_by(watcher: &ShardShared, by: u64) {
    let wakes = watcher.sleeps_until();
    if wakes != AWAKE && wakes.get() > by {
        watcher.nudge();
    }
}
