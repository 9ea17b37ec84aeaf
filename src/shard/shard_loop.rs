//! The shard thread: the loop around the core (drain, advance, expire, dispatch,
//! park); what code running on the shard thread itself — an inline callback, a
//! spawner — may do to its own shard: drain its full rings (a callback that schedules
//! or cancels on its own shard must not wait for itself) and shut it down from inside;
//! and the rescue of the shard it watches, when that shard's thread is stuck.
//!
//! # Ground rules
//!
//! - The core and what its turns fired (inline, spawn) are in the shard's
//!   [`Custody`]: whoever holds its token may turn the core. The shard's own thread
//!   takes the token for each turn and for each pop of a fired task, and holds it
//!   under a thread-local borrow (`OWN`); neither is held while user code runs:
//!   callbacks are dispatched one at a time, each after the borrow and the token that
//!   popped it are given back. So user code on this thread can reach the core: to
//!   drain its rings when a push finds a ring full, its own or another shard's
//!   (`drain_own_rings`), or to take it and shut the shard down (`take_own_core`),
//!   after which the loop finds no core and returns. Code reached from inside a hold
//!   finds the borrow taken, never waits on the token it holds.
//! - What a turn fired is dispatched before the next turn, in deadline order. A
//!   shutdown from a callback on this thread dispatches the rest of the queue before it
//!   returns (`dispatch_rest_here`): fired timers run (inline) or reach the spawner
//!   before `shutdown` returns, as in the pool.
//! - The core never runs user code, so a hold of it is never re-entered.
//! - **Rescue** (DESIGN.md, `Builder::rescue_after`). Each shard thread watches one
//!   other shard (the previous, in a ring). A watched shard is *stuck* when it has not
//!   begun a turn for `rescue_after` ticks while awake (its heartbeat), or has
//!   overslept its published wake-up by as much. The watcher then takes its token
//!   (never waiting: if the owner holds it, the owner is back) and does what the owner
//!   would: a bounded turn, fired tasks handed to the pool, or (inline, spawn) popped
//!   one at a time and dispatched on the watcher's thread. Every timer still fires
//!   once, from whichever thread holds the token when its turn claims it, never early
//!   (the same turn, the same clock). The owner, when its callback returns, takes the
//!   token back for its next turn and carries on.
//! - **Watching costs no wake-up while both sleep.** A watcher parks no later than
//!   `rescue_after` after the watched shard's own next expiry, published as `due`
//!   when it parks (or than its heartbeat while it is awake: `next_wake` is
//!   [`AWAKE`]); a shard that parks with timers due earlier than its watcher's wake-up
//!   allows for unparks the watcher. Each stores before its park fence and reads the
//!   other after it, as producers do, so one of them sees the other. `due`, not the
//!   published wake-up, because a wake-up may be the shard's own watch horizon: two
//!   shards watching each other would chase each other's horizons.

#![deny(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::time::Instant;

use super::core::{Expired, ShardCore, TURN_BUDGET};
use super::custody::Custody;
use super::{Cursors, ShardShared, AWAKE, FIRE_BATCH};
use crate::clock::{Clock, Nanos, Tick, TurnSlot};
use crate::dispatch::{Dispatch, RunHome, RunTask, ShardTask};
use crate::entry::EntryRef;
use crate::limit::PendingLimit;
use crate::sync::{spin_loop, thread, Arc, Backoff};

/// What a shard's token guards (ground rules).
#[derive(Debug)]
pub(crate) struct InCustody {
    /// The core; `None` once shutdown took it.
    core: Option<ShardCore>,
    /// Fired by a turn, not yet dispatched (inline and spawn), in deadline order.
    fired: VecDeque<ShardTask>,
}

/// Everything a thread needs to turn a shard and dispatch what it fires: the shard's
/// own thread, or the one rescuing it.
#[derive(Clone, Debug)]
pub(crate) struct ShardLink {
    /// The core and its fired queue, behind the token.
    custody: Arc<Custody<InCustody>>,
    /// The shard's shared half.
    shared: Arc<ShardShared>,
    /// How fired timers leave the shard.
    dispatch: Dispatch,
    /// Ticks ↔ instants.
    clock: Clock,
    /// Where the shard's repeating runs end.
    home: RunHome,
}

/// A turn's clock reading: the tick, and (for the lateness histogram) the instant in
/// nanoseconds.
#[derive(Clone, Copy)]
struct Reading {
    /// The tick it falls in.
    tick: Tick,
    /// Nanoseconds since tick 0.
    ns: Nanos,
}

impl ShardLink {
    /// Whether fired tasks leave in batches (pool, rayon) rather than through the
    /// fired queue (inline, spawn).
    fn batches(&self) -> bool {
        self.dispatch.batches()
    }

    /// One bounded turn of the shard by the holder of its token: files new timers,
    /// takes the messages, reads the time (`now`) and expires at most
    /// [`TURN_BUDGET`] entries: into batches for `hand_over` (pool, rayon; the last,
    /// partial one too) or onto the fired queue (inline, spawn). Lateness is recorded
    /// in the shard's histogram. Returns `(finished, fired_any)`, or `None` if
    /// shutdown took the core.
    fn turn(
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
                    Expired::Fired(task) => ShardTask::Fired(task),
                    Expired::Run(running) => {
                        ShardTask::Run(RunTask::new(running, self.home.clone(), self.clock))
                    }
                };
                if batches {
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

/// What the shard thread keeps where code on its own thread can reach it.
struct Own {
    /// Its own shard.
    link: ShardLink,
}

#[cfg(not(loom))]
std::thread_local! {
    /// The address of the `ShardShared` whose thread this is (0 if none).
    static OWN_SHARD: Cell<usize> = const { Cell::new(0) };
    /// That shard's link, borrowed while its token is held (ground rules).
    static OWN: RefCell<Option<Own>> = const { RefCell::new(None) };
}

#[cfg(loom)]
loom::thread_local! {
    /// As above, per model thread.
    static OWN_SHARD: Cell<usize> = Cell::new(0);
    /// As above, per model thread.
    static OWN: RefCell<Option<Own>> = RefCell::new(None);
}

/// The address that identifies a shard.
fn address(shard: &ShardShared) -> usize {
    shard as *const ShardShared as usize
}

/// Runs `f` on this thread's own shard, holding its token (waiting, at most a rescuer's
/// bounded turn, if a rescuer holds it), if this is a shard thread whose loop runs and
/// nothing on this thread holds it now.
fn with_own<R>(f: impl FnOnce(&ShardLink, &mut InCustody) -> R) -> Option<R> {
    OWN.with(|own| {
        let own = own.try_borrow_mut().ok()?;
        let link = &own.as_ref()?.link;
        Some(link.custody.with(|held| f(link, held)))
    })
}

/// Whether the calling thread is `shard`'s own thread.
pub(crate) fn is_own_thread(shard: &ShardShared) -> bool {
    OWN_SHARD.with(|own| own.get() == address(shard))
}

/// Called by a push that found a shard's ring full: if this is a shard thread whose
/// loop runs (a callback on it, inline or in a spawner), takes in everything waiting
/// in its own two rings, making room there, and returns `true`; otherwise `false`.
/// Whatever shard the push waits for, this keeps the calling shard from holding up a
/// shard that waits for it in turn (two inline callbacks scheduling onto each other's
/// full rings).
pub(crate) fn drain_own_rings() -> bool {
    with_own(|_, held| {
        held.core.as_mut().is_some_and(|core| {
            core.drain_inserts();
            core.drain_messages();
            true
        })
    })
    .unwrap_or(false)
}

/// Takes the calling shard thread's core, for a shutdown started by a callback on it;
/// the shard loop then returns once that callback does. `None` elsewhere, or if taken.
pub(crate) fn take_own_core() -> Option<ShardCore> {
    with_own(|_, held| held.core.take()).flatten()
}

/// Dispatches, on the calling shard thread, what its turns fired and has not yet been
/// dispatched: for a shutdown started by a callback on it (ground rules).
pub(crate) fn dispatch_rest_here() {
    while let Some((task, link)) =
        with_own(|link, held| held.fired.pop_front().map(|task| (task, link.clone()))).flatten()
    {
        link.dispatch.one(task, link.clock);
    }
}

/// The shard a shard thread watches, and what it learnt of it (ground rules: rescue).
#[derive(Debug)]
pub(crate) struct Watch {
    /// The watched shard.
    link: ShardLink,
    /// Ticks its due timers may wait for its own thread.
    rescue_after: u64,
    /// Set by a rescue: the watched shard's heartbeat then, and the tick its core next
    /// had work. While the heartbeat stays there, the shard is still stuck, and the
    /// watcher comes back at that tick rather than `rescue_after` later.
    stuck: Option<(Tick, Tick)>,
    /// The watched shard's core is gone (it shut down): nothing more to watch.
    gone: bool,
}

impl Watch {
    /// Watches `link`'s shard, rescuing it after `rescue_after` ticks (at least 1).
    pub(crate) fn new(link: ShardLink, rescue_after: u64) -> Self {
        Watch {
            link,
            rescue_after: rescue_after.max(1),
            stuck: None,
            gone: false,
        }
    }

    /// The tick from which the watched shard counts as stuck if it has not moved:
    /// `rescue_after` after its heartbeat (awake) or its own next expiry (asleep);
    /// [`Tick::NEVER`] if it sleeps with nothing due or is gone.
    fn stuck_from(&self) -> Tick {
        if self.gone {
            return Tick::NEVER;
        }
        // Awake: since its last turn began. Asleep: since its own next expiry (not its
        // wake-up, which may be its own watch horizon: watchers watching each other
        // would otherwise chase each other's horizons).
        let since = if self.link.shared.sleeps_until() == AWAKE {
            self.link.shared.heartbeat()
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
    fn horizon(&self, now: Tick) -> Tick {
        if let Some((beat, next)) = self.stuck {
            if self.link.shared.heartbeat() == beat {
                return next;
            }
        }
        let from = self.stuck_from();
        if from <= now {
            // Stuck, but its token was busy (its owner is back, or mid-turn): soon.
            Tick::new(now.get() + 1)
        } else {
            from
        }
    }

    /// Rescues the watched shard if it is stuck at `now` (ground rules): up to one
    /// turn's budget of its fired tasks dispatched here, or one bounded turn handed to
    /// the pool.
    fn check(&mut self, now: Instant) {
        let tick = self.link.clock.tick_of(now);
        if let Some((beat, _)) = self.stuck {
            if self.link.shared.heartbeat() != beat {
                self.stuck = None; // its owner turned since: back
            }
        }
        if self.stuck.is_none() && self.stuck_from() > tick {
            return;
        }
        if self.link.dispatch.is_backed_up() {
            // Its pool has more than it can start (the owner waits for it on purpose,
            // mid-burst): the pool is the bottleneck, not the shard.
            return;
        }
        let beat = self.link.shared.heartbeat();
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
                if held.fired.is_empty() {
                    link.turn(held, || reading, &hand_over);
                }
                let next = held.core.as_ref().and_then(ShardCore::next_expiry);
                match held.fired.pop_front() {
                    Some(task) => Rescue::Run(task),
                    None => Rescue::Done(next.unwrap_or(Tick::NEVER)),
                }
            });
            match step {
                // Its owner holds the token: it is back.
                None => return,
                Some(Rescue::Gone) => {
                    self.gone = true;
                    self.stuck = None;
                    return;
                }
                Some(Rescue::Done(next)) => {
                    self.stuck = Some((beat, next));
                    return;
                }
                Some(Rescue::Run(task)) => {
                    // Counted in the rescued shard's stats, not the watcher's: the
                    // task carries its own shard's accounting.
                    link.dispatch.one(task, link.clock);
                }
            }
        }
        // More fired tasks wait: come back at once.
        self.stuck = Some((beat, tick));
    }
}

/// One step of a rescue.
enum Rescue {
    /// The watched shard shut down.
    Gone,
    /// A fired task to dispatch here.
    Run(ShardTask),
    /// Nothing more due; its core next has work at this tick.
    Done(Tick),
}

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
    ) -> Self {
        let now = clock.tick_of(shared.time.now());
        let core = ShardCore::new(shared.clone(), cursors, now, clock.ticks().tick_ns(), limit);
        let home: RunHome = std::sync::Arc::new(shared.clone());
        ShardThread {
            link: ShardLink {
                custody: Arc::new(Custody::new(InCustody {
                    core: Some(core),
                    fired: VecDeque::new(),
                })),
                shared,
                dispatch,
                clock,
                home,
            },
            turns,
            watch: None,
            watcher: None,
        }
    }

    /// This shard, as the shard that watches it reaches it.
    pub(crate) fn link(&self) -> ShardLink {
        self.link.clone()
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
        crate::sync::precise_timed_waits();
        #[cfg(loom)]
        let _ = pin_to;
        let ShardThread {
            link,
            turns,
            mut watch,
            watcher,
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
        let batches = link.batches();
        // The last round of the manual clock a turn of this shard began in.
        let mut answered = 0;
        let pending = loop {
            #[cfg(test)]
            if shared.fail_turn.load(std::sync::atomic::Ordering::Relaxed) {
                unreachable!("injected by a test: an internal invariant fails on the shard thread");
            }
            let turn = turns.as_ref().map(TurnSlot::begin_turn);
            let now = || {
                let now = turn.map_or_else(Instant::now, |turn| turn.now);
                let reading = Reading {
                    tick: clock.tick_of(now),
                    ns: clock.instant_to_ns(now),
                };
                shared.beat(reading.tick);
                reading
            };
            let Some((finished, fired_any)) =
                with_own(|link, held| link.turn(held, now, &hand_over)).flatten()
            else {
                break Vec::new(); // a callback on this thread took the core
            };
            if !batches {
                // One at a time, neither the borrow nor the token held while user code
                // runs.
                while let Some(task) = with_own(|_, held| held.fired.pop_front()).flatten() {
                    dispatch.one(task, clock);
                }
            }
            if let (Some(turns), Some(turn)) = (&turns, turn) {
                turns.end_turn(turn, fired_any);
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
            let plan = with_own(|_, held| {
                held.core
                    .as_ref()
                    .map(|core| plan_park(core, clock, turns.as_ref(), answered, watch.as_ref()))
            });
            match plan.flatten() {
                None => break Vec::new(), // a callback on this thread took the core
                Some(plan) => park(plan, &shared, watcher.as_ref()),
            }
        };
        OWN.with(|own| own.borrow_mut().take());
        OWN_SHARD.with(|own| own.set(0));
        pending
    }
}

/// The models' way to run `f` as code on `core`'s shard thread (an inline callback):
/// installs `core` where `drain_own_rings` and `take_own_core` find it, as
/// `ShardThread::run` does, runs `f`, and returns the core. Loom only.
///
/// # Panics
///
/// If `f` took the core (a shutdown from it): the models do not.
#[cfg(loom)]
pub fn run_as_shard_thread(core: ShardCore, f: impl FnOnce()) -> ShardCore {
    let clock = Clock::at(Instant::now(), 1);
    let shared = core.shared().clone();
    let home: RunHome = std::sync::Arc::new(shared.clone());
    let custody = Arc::new(Custody::new(InCustody {
        core: Some(core),
        fired: VecDeque::new(),
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

/// The models' way into the shard thread's real park (`plan_park`, `park`), on the
/// system clock, with ticks of an hour (so the wall time a model takes stays in tick
/// 0). Loom only.
#[cfg(loom)]
pub fn park_for_model(core: &ShardCore) {
    let clock = Clock::at(Instant::now(), 3_600_000_000_000);
    let plan = plan_park(core, clock, None, 0, None);
    park(plan, core.shared(), None);
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

/// What the shard thread does instead of another turn.
#[derive(Clone, Copy, Debug)]
enum Park {
    /// Work is due or arrived: turn again.
    No,
    /// Sleep until unparked (nothing due; or a manual clock, which unparks); the
    /// core's next expiry.
    Indefinitely(Tick),
    /// Sleep until this instant (the next expiry, or the watch horizon, if earlier);
    /// the core's next expiry.
    Until(Instant, Tick),
}

/// Plans the sleep after a turn, holding the token: until the core's next expiry (or
/// the watched shard's horizon, if earlier), unless work arrived meanwhile. Under a
/// manual clock (`turns`), indefinitely, and not at all if a round later than
/// `answered` is asked for: nothing comes due until an `advance`, which unparks the
/// shard. Publishes the tick it will sleep until (the park handshake's store half).
fn plan_park(
    core: &ShardCore,
    clock: Clock,
    turns: Option<&TurnSlot>,
    answered: u64,
    watch: Option<&Watch>,
) -> Park {
    let due = core.next_expiry().unwrap_or(Tick::NEVER);
    let mut wake = due;
    let (now, manual) = match turns {
        Some(turns) => {
            let (now, round_asked) = turns.before_park(answered);
            if round_asked {
                return Park::No;
            }
            (now, true)
        }
        None => (Instant::now(), false),
    };
    let now = clock.tick_of(now);
    if let Some(watch) = watch {
        wake = wake.min(watch.horizon(now));
    }
    if wake <= now {
        return Park::No;
    }
    // Stored before the fence in `prepare_park`, for the watcher (ground rules).
    core.shared().set_due(due);
    if !core.prepare_park(wake) {
        // Work arrived; it may be a slot reserved and not yet written, which the next
        // turn cannot pop until its producer writes it: let the producer run.
        spin_loop();
        return Park::No;
    }
    // After our fence (in `prepare_park`): the watched shard's state again, in case it
    // went to sleep with an earlier wake-up than we planned for, while its read of our
    // `next_wake` came before our store (ground rules: watching).
    if watch.is_some_and(|watch| watch.horizon(now) < wake) {
        core.shared().wake_up();
        return Park::No;
    }
    if wake == Tick::NEVER || manual {
        Park::Indefinitely(due)
    } else {
        Park::Until(clock.tick_to_instant(wake), due)
    }
}

/// Sleeps as `plan` says, without the token; first unparks the watcher if this shard
/// has timers due before the watcher's own wake-up allows for (ground rules: watching).
fn park(plan: Park, shared: &ShardShared, watcher: Option<&(Arc<ShardShared>, u64)>) {
    let due = match plan {
        Park::No => return,
        Park::Indefinitely(due) | Park::Until(_, due) => due,
    };
    if let Some((watcher, rescue_after)) = watcher {
        // The watcher must look by `due + rescue_after`; if it sleeps past that, its
        // horizon predates our `due`: it recomputes.
        let horizon = due.get().saturating_add(*rescue_after);
        let watcher_wakes = watcher.sleeps_until();
        if due != Tick::NEVER && watcher_wakes != AWAKE && watcher_wakes.get() > horizon {
            watcher.nudge();
        }
    }
    match plan {
        Park::No => {}
        Park::Indefinitely(_) => thread::park(),
        Park::Until(until, _) => {
            let now = Instant::now();
            if until > now {
                thread::park_timeout(until - now);
            }
        }
    }
    shared.wake_up();
}
