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
//! - **Rescue** (`Builder::rescue_after`). Each shard thread watches one other shard
//!   (the previous, in a ring). A watched shard is *stuck* when, awake, its owner has
//!   made no progress for `rescue_after` ticks — begun no turn and popped no fired
//!   task (`progress`, counted where the work is: a shard dispatching a long inline
//!   queue is busy, not stuck) — or has overslept its own next expiry by as much. The
//!   watcher then takes its token (never waiting: if the owner holds it, the owner is
//!   back) and does what the owner would: a bounded turn, fired tasks handed to the
//!   pool, or (inline, spawn) popped one at a time and dispatched on the watcher's
//!   thread, each only while the owner's progress stays where it was judged stuck.
//!   The token orders pops, not runs: the queue itself (`fired.rs`) refuses a pop
//!   while another thread's run is in progress, unless that run is stuck, so the
//!   callbacks of one shard run one at a time in deadline order but for a stuck one.
//!   Every timer still fires once, from whichever thread holds the token when its
//!   turn claims it, never early (the same turn, the same clock). The owner, when its
//!   callback returns, takes the token back for its next turn and carries on once
//!   the rescuer's run in progress ends (the rescuer unparks it).
//! - **No shard thread waits for another shard.** A push from a shard thread (an
//!   inline callback, a rescued one, a spawner) that finds another shard's ring full
//!   takes that shard's token without waiting and drains the ring into its wheel, or
//!   else defers the push to a list of its own thread's, retried each turn and
//!   delivered before it shuts down (`make_room`, `retry_deferred`).
//! - **Watching costs no wake-up while both sleep.** A watcher parks no later than
//!   `rescue_after` after the watched shard's own next expiry, published as `due`
//!   when it parks (or than its last progress while it is awake: `next_wake` is
//!   [`AWAKE`]); a shard that parks with timers due earlier than its watcher's wake-up
//!   allows for unparks the watcher. Each stores before its park fence and reads the
//!   other after it, as producers do, so one of them sees the other. `due`, not the
//!   published wake-up, because a wake-up may be the shard's own watch horizon: two
//!   shards watching each other would chase each other's horizons.

#![deny(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::time::Instant;

use super::core::{Expired, ShardCore, TURN_BUDGET};
use super::custody::Custody;
use super::direct::DirectPort;
use super::fired::{Claim, FiredQueue};
use super::{Cursors, ShardShared, Wake, AWAKE, FIRE_BATCH};
use crate::clock::{Clock, Nanos, Tick, TurnSlot};
use crate::dispatch::{Dispatch, RunHome, RunTask, ShardTask};
use crate::entry::{EntryRef, Message};
use crate::limit::PendingLimit;
use crate::sync::{fence, spin_loop, thread, Arc, Backoff, Ordering};

/// What a shard's token guards (ground rules).
#[derive(Debug)]
pub(crate) struct InCustody {
    /// The core; `None` once shutdown took it.
    core: Option<ShardCore>,
    /// Fired by a turn, not yet dispatched (inline and spawn), in deadline order, and
    /// the run in progress (`fired.rs`).
    fired: FiredQueue<ShardTask>,
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
    unsafe fn new(core: ShardCore, dispatch: Dispatch, clock: Clock) -> ShardLink {
        let shared = core.shared().clone();
        let home: RunHome = std::sync::Arc::new(shared.clone());
        let custody = Arc::new(Custody::new(InCustody {
            core: Some(core),
            fired: FiredQueue::new(),
        }));
        // SAFETY: the caller's two points are `Custody::set`'s: the custody outlives
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
        }
    }

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
    /// Every shard of the service (its own included), for a push that finds one's
    /// ring full (`make_room`). Set once, read only.
    static PEERS: RefCell<Vec<ShardLink>> = const { RefCell::new(Vec::new()) };
    /// Pushes this shard thread could not make room for, retried each turn (`defer`).
    static DEFERRED: RefCell<Vec<(ShardLink, Deferred)>> = const { RefCell::new(Vec::new()) };
}

#[cfg(loom)]
loom::thread_local! {
    /// As above, per model thread.
    static OWN_SHARD: Cell<usize> = Cell::new(0);
    /// As above, per model thread.
    static OWN: RefCell<Option<Own>> = RefCell::new(None);
    /// As above, per model thread.
    static PEERS: RefCell<Vec<ShardLink>> = RefCell::new(Vec::new());
    /// As above, per model thread.
    static DEFERRED: RefCell<Vec<(ShardLink, Deferred)>> = RefCell::new(Vec::new());
}

/// A push a shard thread deferred (ground rules: no shard thread waits for another).
#[derive(Debug)]
pub(crate) enum Deferred {
    /// A new timer (`refile`: a repeating timer's next run).
    Insert {
        /// The service's reference.
        entry: EntryRef,
        /// Its deadline's tick.
        deadline: Tick,
        /// Whether it is a repeating timer's next run.
        refile: bool,
    },
    /// A cancel or move message.
    Message {
        /// The message.
        message: Message,
        /// How its push wakes the shard.
        wake: Wake,
    },
}

/// What a push that found `shard`'s ring full should do (`make_room`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Room {
    /// Room was made (the ring drained into its shard's wheel): try again at once.
    Made,
    /// Defer the push: this is a shard thread, and it may not wait.
    Defer,
    /// Back off and try again, as any producer (not a shard thread, or a shard of
    /// another service); `drained_own`: this shard thread took its own rings in.
    Wait {
        /// Whether the calling shard thread drained its own rings.
        drained_own: bool,
    },
}

/// Called by a push that found `shard`'s ring full. On a shard thread whose loop runs,
/// never waits for another shard (docs/architecture.md, rescue: the shard it waits for may be
/// stuck, or waiting for it): it first takes its own rings in (making room for whoever
/// waits on them); then, for its own ring, that is all it needs (`Wait`); for
/// another shard's, it takes that shard's token without waiting and drains the ring
/// into that shard's wheel, as a rescuer runs a stuck shard's core (`Made`), or, if
/// the token is busy or the drain found nothing to take (a slot reserved and not
/// yet written), says to defer the push (`Defer`). Code holding its own shard's token
/// (nothing should push there, but nothing may hang there either) defers too.
pub(crate) fn make_room(shard: &ShardShared) -> Room {
    if OWN_SHARD.with(Cell::get) == 0 {
        return Room::Wait { drained_own: false };
    }
    let drained_own = drain_own_rings();
    let own = is_own_thread(shard);
    if own {
        return if drained_own {
            Room::Wait { drained_own }
        } else {
            Room::Defer // its token is held on this very thread
        };
    }
    let Some(link) = peer(shard) else {
        return Room::Wait { drained_own };
    };
    let drained = link.custody.try_with(|held| {
        held.core
            .as_mut()
            .map_or(0, |core| core.drain_inserts() + core.drain_messages())
    });
    match drained {
        Some(drained) if drained > 0 => Room::Made,
        _ => Room::Defer,
    }
}

/// The link of `shard` among this thread's peers.
fn peer(shard: &ShardShared) -> Option<ShardLink> {
    PEERS.with(|peers| {
        peers
            .borrow()
            .iter()
            .find(|link| address(&link.shared) == address(shard))
            .cloned()
    })
}

/// Keeps a push to `shard` that `make_room` said to defer, for this thread's next turn
/// (`retry_deferred`).
///
/// # Panics
///
/// If `shard` is not among this thread's peers: `make_room` says `Defer` only for one
/// that is.
pub(crate) fn defer(shard: &ShardShared, push: Deferred) {
    let link = peer(shard).expect("deferral invariant: only a peer's push is deferred");
    DEFERRED.with(|deferred| deferred.borrow_mut().push((link, push)));
}

/// Whether this thread holds deferred pushes.
fn has_deferred() -> bool {
    DEFERRED.with(|deferred| !deferred.borrow().is_empty())
}

/// Tries each deferred push once more (each may be deferred again); returns whether
/// any is still deferred. Called by the shard loop outside every hold.
pub(crate) fn retry_deferred() -> bool {
    let pushes = DEFERRED.with(|deferred| ::core::mem::take(&mut *deferred.borrow_mut()));
    for (link, push) in pushes {
        let shard = &link.shared;
        match push {
            Deferred::Insert {
                entry,
                deadline,
                refile,
            } => {
                if let Err(entry) = shard.push_insert_as(entry, deadline, refile) {
                    shard.insert_closed(entry, refile);
                }
            }
            Deferred::Message { message, wake } => shard.send_message(message, wake),
        }
    }
    has_deferred()
}

/// Retries the deferred pushes until none is left, taking this shard's own rings in
/// between: before this shard shuts down, so that every message another shard waits
/// for at its own shutdown arrives, and no timer is lost. (The shards they go to are
/// shutting down too, and drain what they wait for.)
fn flush_deferred() {
    let backoff = Backoff::new();
    while retry_deferred() {
        drain_own_rings();
        backoff.snooze();
    }
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

/// Takes the calling shard thread's core, for a shutdown started by a callback on it
/// (or by its own loop); the shard loop then returns once that callback does. `None`
/// elsewhere, or if taken. First delivers what this thread deferred.
pub(crate) fn take_own_core() -> Option<ShardCore> {
    if OWN_SHARD.with(Cell::get) != 0 {
        flush_deferred();
    }
    with_own(|_, held| held.core.take()).flatten()
}

/// Dispatches, on the calling shard thread, what its turns fired and has not yet been
/// dispatched: for a shutdown started by a callback on it (ground rules).
pub(crate) fn dispatch_rest_here() {
    while let Some((task, link)) = with_own(|link, held| {
        held.fired
            .pop_at_shutdown()
            .map(|task| (task, link.clone()))
    })
    .flatten()
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
    pub(crate) fn new(link: ShardLink, rescue_after: u64) -> Self {
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
    fn horizon(&self, now: Tick) -> Tick {
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
    fn check(&mut self, now: Instant) {
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
        if self.link.dispatch.is_backed_up() {
            // Its pool has more than it can start (the owner waits for it on purpose,
            // mid-burst): the pool is the bottleneck, not the shard.
            return;
        }
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
    /// A fired task to dispatch here, and its claim to the run.
    Run(ShardTask, Claim),
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
    ) -> Self {
        let now = clock.tick_of(shared.time.now());
        let core = ShardCore::new(shared, cursors, now, clock.ticks().tick_ns(), limit);
        // SAFETY: this thread's link keeps the custody until its loop ends, after the
        // core's `shut_down` (run on this thread: by the loop, or by a callback on it
        // that took the core), and the shard is not shared with any sender yet.
        #[allow(unsafe_code, reason = "the shard loop keeps the custody alive")]
        let link = unsafe { ShardLink::new(core, dispatch, clock) };
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
        // A rescuer's run of ours that has lasted this long is stuck: we take our
        // queue back (`fired.rs`). Without a watcher nobody else runs it.
        let rescue_after = watcher.as_ref().map_or(u64::MAX, |(_, after)| *after);
        let is_stuck = |since: Tick| {
            clock.tick_of(Instant::now()).get() >= since.get().saturating_add(rescue_after)
        };
        let batches = link.batches();
        // The last round of the manual clock a turn of this shard began in.
        let mut answered = 0;
        let pending = loop {
            #[cfg(test)]
            if shared.fail_turn.load(std::sync::atomic::Ordering::Relaxed) {
                unreachable!("injected by a test: an internal invariant fails on the shard thread");
            }
            // Pushes deferred by callbacks on this thread (ground rules of `shard.rs`:
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
            if !batches {
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
                if plan.as_ref().is_some_and(|plan| !matches!(plan, Park::No)) {
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
                Some(plan) => park(plan, &shared, watcher.as_ref(), deferred),
            }
        };
        flush_deferred();
        OWN.with(|own| own.borrow_mut().take());
        OWN_SHARD.with(|own| own.set(0));
        PEERS.with(|own_peers| own_peers.borrow_mut().clear());
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
#[cfg(loom)]
#[derive(Clone, Debug)]
pub struct ModelShard {
    /// The shard's link, inline dispatch.
    link: ShardLink,
}

#[cfg(loom)]
impl ModelShard {
    /// `core`'s shard, its core in custody, where its messages' senders find it
    /// (direct unlinking, `direct.rs`): the model keeps the `ModelShard` (a clone)
    /// until the core's `shut_down` has returned.
    pub fn new(core: ShardCore) -> Self {
        let dispatch = Dispatch::Inline(Arc::new(crate::sync::AtomicU64::new(0)));
        // SAFETY: the models keep a `ModelShard` until the core has shut down (above);
        // the shard is not shared with a sender yet.
        #[allow(unsafe_code, reason = "the model keeps the custody alive")]
        let link = unsafe { ShardLink::new(core, dispatch, Clock::at(Instant::now(), 1)) };
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
            Some(plan) => {
                park(plan, &self.link.shared, None, false);
                false
            }
            None => false,
        }
    }
}

#[cfg(loom)]
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
#[cfg(loom)]
pub fn park_for_model(core: &ShardCore) {
    let clock = Clock::at(Instant::now(), 3_600_000_000_000);
    let plan = plan_park(core, clock, None, 0, None, None);
    park(plan, core.shared(), None, false);
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
    blocked_until: Option<Tick>,
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
    if let Some(blocked_until) = blocked_until {
        wake = wake.min(blocked_until);
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

/// Before this shard runs user code inline, which may block it: makes sure its
/// watcher looks within `rescue_after` of `now` (ground rules: watching). A shard
/// tells its watcher when to look as it parks; one woken from a park (by a producer
/// filing an earlier timer, or its own timeout) that fires and runs a callback in the
/// turn it wakes to has not parked since, and its watcher may sleep on a horizon it
/// planned from the `due` published then (indefinitely, if that shard had nothing
/// due). Found under load: a stall beginning so was never rescued.
fn alert_watcher(watcher: Option<&(Arc<ShardShared>, u64)>, now: Tick) {
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
fn nudge_unless_looking_by(watcher: &ShardShared, by: u64) {
    let wakes = watcher.sleeps_until();
    if wakes != AWAKE && wakes.get() > by {
        watcher.nudge();
    }
}

/// Before this shard sleeps as `plan` says: unparks its watcher if the watcher sleeps
/// past `rescue_after` after this shard's next expiry, the latest it must look
/// (ground rules: watching; after `prepare_park`'s fence).
fn tell_watcher(plan: Park, watcher: Option<&(Arc<ShardShared>, u64)>) {
    let (Park::Indefinitely(due) | Park::Until(_, due)) = plan else {
        return;
    };
    if let Some((watcher, rescue_after)) = watcher {
        if due != Tick::NEVER {
            nudge_unless_looking_by(watcher, due.get().saturating_add(*rescue_after));
        }
    }
}

/// Sleeps as `plan` says, without the token; first unparks the watcher if this shard
/// has timers due before the watcher's own wake-up allows for (ground rules: watching).
/// With pushes `deferred`, sleeps a millisecond at most, to retry them.
fn park(
    plan: Park,
    shared: &ShardShared,
    watcher: Option<&(Arc<ShardShared>, u64)>,
    deferred: bool,
) {
    if matches!(plan, Park::No) {
        return;
    }
    tell_watcher(plan, watcher);
    let retry = std::time::Duration::from_millis(1);
    match plan {
        Park::No => {}
        Park::Indefinitely(_) if deferred => thread::park_timeout(retry),
        Park::Indefinitely(_) => thread::park(),
        Park::Until(until, _) => {
            let now = Instant::now();
            if until > now {
                let sleep = until - now;
                thread::park_timeout(if deferred { sleep.min(retry) } else { sleep });
            }
        }
    }
    shared.wake_up();
}
