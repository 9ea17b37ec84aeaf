//! The shard thread: its start-up and the loop around the core (drain, advance,
//! expire, dispatch, park). What it shares with code on its own thread is in
//! `own.rs`, its turn in `turn.rs`, its sleep in `park.rs`, and the shard it watches
//! in `rescue.rs`.
//!
//! # Ground rules
//!
//! - The loop takes the shard's token for each turn and for each pop of a fired task,
//!   through this thread's own borrow (`own.rs`), and holds neither while user code
//!   runs.
//! - What a turn fired is dispatched before the next turn, in deadline order.
//! - A shard thread never unwinds past its loop: an internal invariant that fails
//!   aborts the process (`AbortOnUnwind`), since handles keep a plain pointer to their
//!   shard (see [`ShardThread::run`]).

#![deny(unsafe_code)]

use std::time::Instant;

use super::core::ShardCore;
use super::direct::DirectPort;
use super::fired::Claim;
use super::own::{
    address, dispatch_rest_here, drain_own_rings, flush_deferred, retry_deferred, take_own_core,
    with_own, Own, OWN, OWN_SHARD, PEERS,
};
use super::park::{park, plan_park, Park, Stall};
use super::rescue::{alert_watcher, Watch};
use super::turn::{Reading, ShardLink};
use super::{Cursors, ShardShared};
use crate::clock::{Clock, Tick, TurnSlot};
use crate::dispatch::{Dispatch, ShardTask};
use crate::entry::EntryRef;
use crate::limit::PendingLimit;
use crate::sync::{Arc, Backoff};

/// The shard thread's own state.
#[derive(Debug)]
pub(crate) struct ShardThread {
    /// Its shard: the core in custody, and how fired timers leave it.
    link: ShardLink,
    /// The shard's place in its manual clock's rounds; `None` on the system clock.
    turns: Option<TurnSlot>,
    /// The shard this thread watches, if rescue is on.
    watch: Option<Watch>,
    /// The shard that watches this one, if rescue is on.
    watcher: Option<(Arc<ShardShared>, u64)>,
    /// Every shard of the service, this one included (`make_room`).
    peers: Vec<ShardLink>,
}

impl ShardThread {
    /// The thread half of a shard.
    pub(crate) fn new(
        shared: Arc<ShardShared>,
        cursors: Cursors,
        clock: Clock,
        dispatch: Dispatch,
        limit: Option<Arc<PendingLimit>>,
        turns: Option<TurnSlot>,
        wakes_here: bool,
    ) -> Self {
        let now = clock.tick_of(shared.time.now());
        let core = ShardCore::new(shared, cursors, now, clock.ticks().tick_ns(), limit);
        // SAFETY: this thread's link keeps the custody until its loop ends, after the
        // core's `shut_down` (run on this thread: by the loop, or by a callback on it
        // that took the core), and the shard is not shared with any sender yet.
        #[allow(unsafe_code, reason = "the shard loop keeps the custody alive")]
        let link = unsafe { ShardLink::new(core, dispatch, clock, wakes_here) };
        ShardThread {
            link,
            turns,
            watch: None,
            watcher: None,
            peers: Vec::new(),
        }
    }

    /// Gives the thread every shard of its service (this one included), so that a
    /// push from it that finds one's ring full never waits for that shard
    /// (`make_room`).
    pub(crate) fn set_peers(&mut self, peers: Vec<ShardLink>) {
        self.peers = peers;
    }

    /// This shard, as the shard that watches it reaches it.
    pub(crate) fn link(&self) -> ShardLink {
        self.link.clone()
    }

    /// What a producer keeps to file onto this shard directly (`direct.rs`).
    pub(crate) fn direct_port(&self) -> DirectPort {
        DirectPort::new(self.link.custody.clone())
    }

    /// Turns rescue on: this thread watches `watched`, and `watcher` watches this
    /// shard, each rescuing after `rescue_after` ticks.
    pub(crate) fn set_rescue(
        &mut self,
        watched: ShardLink,
        watcher: Arc<ShardShared>,
        rescue_after: u64,
    ) {
        self.watch = Some(Watch::new(watched, rescue_after));
        self.watcher = Some((watcher, rescue_after.max(1)));
    }

    /// The shard loop. Returns the timers still pending at shutdown (none if a
    /// callback on this thread shut the service down: that shutdown took them).
    ///
    /// # Panics
    ///
    /// Never unwinds: if an internal invariant fails (an `unreachable!` in the core),
    /// the process aborts. Handles keep a plain pointer to their shard
    /// (`ShardShared::port`), sound only because the shard outlives every message it
    /// waits for; a shard that unwound would be freed by the join that propagates its
    /// panic, and a later `cancel` would write through a dangling pointer.
    pub(crate) fn run(self, pin_to: Option<core_affinity::CoreId>) -> Vec<EntryRef> {
        #[cfg(not(loom))]
        let _abort = AbortOnUnwind;
        self.run_loop(pin_to)
    }

    /// The loop of [`run`](Self::run).
    fn run_loop(self, pin_to: Option<core_affinity::CoreId>) -> Vec<EntryRef> {
        #[cfg(not(loom))]
        if let Some(core) = pin_to {
            let _ = core_affinity::set_for_current(core);
        }
        crate::sync::prompt_wake_ups();
        settle_allocator();
        #[cfg(loom)]
        let _ = pin_to;
        let ShardThread {
            link,
            turns,
            mut watch,
            watcher,
            peers,
        } = self;
        if let Some(turns) = &turns {
            turns.start_on_this_thread();
        }
        let shared = link.shared.clone();
        let clock = link.clock;
        let dispatch = link.dispatch.clone();
        // Under a manual clock, a pool batch is wrapped in the marks that let
        // `advance` wait for it to run.
        let hand_over = |batch: Vec<ShardTask>| {
            let batch = match &turns {
                Some(turns) => turns.mark_batch(batch, ShardTask::Mark),
                None => batch,
            };
            dispatch.submit(batch, clock);
        };
        OWN_SHARD.with(|own| own.set(address(&shared)));
        OWN.with(|own| *own.borrow_mut() = Some(Own { link: link.clone() }));
        PEERS.with(|own_peers| *own_peers.borrow_mut() = peers);
        // The wheel's lowest lists get their memory from this thread's arena
        // (`ShardCore::anchor_lists`). Not under loom: it is about the allocator, and
        // one more hold of the token at start would only multiply the models'
        // interleavings.
        #[cfg(not(loom))]
        with_own(|_, held| {
            if let Some(core) = held.core.as_mut() {
                core.anchor_lists();
            }
        });
        // A rescuer's run of ours that has lasted this long is stuck: we take our
        // queue back (`fired.rs`). Without a watcher nobody else runs it.
        let rescue_after = watcher.as_ref().map_or(u64::MAX, |(_, after)| *after);
        let is_stuck = |since: Tick| {
            clock.tick_of(Instant::now()).get() >= since.get().saturating_add(rescue_after)
        };
        // The last round of the manual clock a turn of this shard began in.
        let mut answered = 0;
        // The wait for a producer between its reservation and its write (`park.rs`).
        let mut stall = Stall::default();
        let pending = loop {
            #[cfg(test)]
            if shared.fail_turn.load(std::sync::atomic::Ordering::Relaxed) {
                unreachable!("injected by a test: an internal invariant fails on the shard thread");
            }
            // Pushes deferred by callbacks on this thread (ground rules of `own.rs`:
            // a shard thread never waits for another shard).
            let deferred = retry_deferred();
            let turn = turns.as_ref().map(TurnSlot::begin_turn);
            let now = || {
                let now = turn.map_or_else(Instant::now, |turn| turn.now);
                Reading {
                    tick: clock.tick_of(now),
                    ns: clock.instant_to_ns(now),
                }
            };
            let Some((finished, fired_any)) = with_own(|link, held| {
                link.shared.set_progress(held.fired.owner_turned());
                if held.fired.is_empty() {
                    return link.turn(held, now, &hand_over);
                }
                // A rescuer's run blocks ours (`fired.rs`): take the rings in, and no
                // more out of the wheel until the queue is dispatched.
                let core = held.core.as_mut()?;
                core.drain_inserts();
                core.drain_messages();
                Some((true, false))
            })
            .flatten() else {
                break Vec::new(); // a callback on this thread took the core
            };
            // Whether the queue waits for a rescuer's run: then, the tick it began.
            let mut blocked = None;
            // The fired queue: every callback (inline, spawn), or the futures' wakes
            // only (pool, rayon: `ShardTask::Wake`).
            {
                // One at a time, neither the borrow nor the token held while user code
                // runs; each pop ends the previous run in the same hold.
                let mut claim: Option<Claim> = None;
                let mut watcher_alerted = false;
                loop {
                    let popped = with_own(|link, held| {
                        if let Some(claim) = claim.take() {
                            held.fired.finish(claim);
                        }
                        let popped = held.fired.pop_for_owner(is_stuck);
                        if popped.is_some() {
                            link.shared.set_progress(held.fired.progress());
                        } else if !held.fired.is_empty() {
                            blocked = held.fired.rescuer_since();
                        }
                        popped
                    })
                    .flatten();
                    let Some((task, next_claim)) = popped else {
                        break;
                    };
                    claim = Some(next_claim);
                    if !watcher_alerted {
                        watcher_alerted = true;
                        alert_watcher(watcher.as_ref(), now().tick);
                    }
                    dispatch.one(task, clock);
                }
            }
            if let (Some(turns), Some(turn)) = (&turns, turn) {
                let due = with_own(|_, held| held.core.as_ref().and_then(ShardCore::next_expiry))
                    .flatten();
                turns.end_turn(turn, fired_any, due.map(Tick::get));
                answered = turn.round;
            }
            if shared.is_stopping() {
                let core = take_own_core();
                // A rescuer's turn may have fired onto our queue since we emptied it;
                // with the core taken nothing more comes: dispatch it, then shut down.
                dispatch_rest_here();
                break core.map(|mut core| core.shut_down()).unwrap_or_default();
            }
            if let Some(watch) = &mut watch {
                watch.check(Instant::now());
            }
            if !finished {
                // The turn's budget ran out with more due: no park, the next turn
                // drains the rings and goes on with the burst; but not further ahead of
                // the pool than it can start at once, twice over, so that a timer
                // coming due meanwhile (filed first by the next turn) is not queued
                // behind the whole burst. Meanwhile the rings are drained.
                let backoff = Backoff::new();
                while dispatch.is_backed_up() && !shared.is_stopping() {
                    drain_own_rings();
                    backoff.snooze();
                }
                continue;
            }
            // Wake by the time a rescuer's run that blocks our queue counts as stuck.
            let blocked_until =
                blocked.map(|since| Tick::new(since.get().saturating_add(rescue_after)));
            let plan = with_own(|link, held| {
                let plan = held.core.as_ref().map(|core| {
                    plan_park(
                        core,
                        clock,
                        turns.as_ref(),
                        answered,
                        watch.as_ref(),
                        blocked_until,
                    )
                });
                if plan
                    .as_ref()
                    .is_some_and(|plan| !matches!(plan, Park::No | Park::Retry { .. }))
                {
                    // A park is progress too: a watcher's sighting from before it is
                    // stale once the shard wakes (else, seeing it awake before its
                    // first turn with the progress it last saw, the watcher counted
                    // it stuck since that old sighting and rescued a timer 1.4 ms
                    // past its deadline with rescue_after 4 ms, in an outside audit).
                    link.shared.set_progress(held.fired.owner_turned());
                }
                plan
            });
            match plan.flatten() {
                None => break Vec::new(), // a callback on this thread took the core
                Some(Park::Retry { popped, cap }) => stall.wait(popped, cap),
                Some(plan) => {
                    stall.clear();
                    park(plan, &shared, watcher.as_ref(), deferred);
                }
            }
        };
        flush_deferred();
        OWN.with(|own| own.borrow_mut().take());
        OWN_SHARD.with(|own| own.set(0));
        PEERS.with(|own_peers| own_peers.borrow_mut().clear());
        pending
    }
}

/// Aborts the process if dropped while its thread unwinds: a shard thread must never
/// unwind past its loop (see [`ShardThread::run`]). Not under loom, whose models report
/// a failing iteration by unwinding.
#[cfg(not(loom))]
struct AbortOnUnwind;

#[cfg(not(loom))]
impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "sharded-timer: a shard thread panicked (an internal invariant failed); \
                 aborting, since handles hold pointers into its shard"
            );
            std::process::abort();
        }
    }
}

/// Makes the allocator do, as the shard thread starts, the work it would otherwise do
/// at the thread's first large allocation, mid-load: one allocation of a few KiB,
/// freed at once.
///
/// glibc hands a new thread the arena of a thread that has exited. If that thread
/// freed many small blocks (a heap-based timer, a `Mutex<BinaryHeap>` of `Arc`s), the
/// arena holds them in its fast bins, and glibc walks them all (`malloc_consolidate`)
/// at the arena's next request of 1 KiB or more. Found by `--compare`: an inline
/// service built after such a peer's round missed its deadlines by 20–80 ms at p99
/// under the rpc load, with `malloc_consolidate` on both shard threads in the profile.
/// `GLIBC_TUNABLES=glibc.malloc.mxfast=0` removed the outliers, and so does this, with
/// no setting (0 outliers in 7 driver runs, against 4 in 10 before). Elsewhere it
/// costs one allocation per shard thread.
fn settle_allocator() {
    drop(std::hint::black_box(Vec::<u8>::with_capacity(4096)));
}
