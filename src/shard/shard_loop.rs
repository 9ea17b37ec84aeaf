//! The shard thread: the loop around the core (drain, advance, expire, dispatch,
//! park), and what code running on the shard thread itself — an inline callback, a
//! spawner — may do to its own shard: drain its full rings (a callback that schedules
//! or cancels on its own shard must not wait for itself) and shut it down from inside.
//!
//! # Ground rules
//!
//! - The core lives in a thread-local (`OWN`) while the loop runs, and the loop holds
//!   no borrow of it while user code runs: callbacks are dispatched one at a time from
//!   the `fired` queue, each after the borrow that popped it has ended. So user code on
//!   this thread can borrow the core: to drain its rings when a push finds a ring
//!   full, its own or another shard's (`drain_own_rings`), or to take it and shut the shard down (`take_own_core`),
//!   after which the loop finds no core and returns.
//! - What a turn fired is dispatched before the next turn, in deadline order. A
//!   shutdown from a callback on this thread dispatches the rest of the queue before it
//!   returns (`dispatch_rest_here`): fired timers run (inline) or reach the spawner
//!   before `shutdown` returns, as in the pool.
//! - The core never runs user code, so a borrow of it is never re-entered.

#![deny(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::time::Instant;

use super::core::{Expired, ShardCore};
use super::{Cursors, ShardShared, FIRE_BATCH};
use crate::clock::{Clock, Nanos, Tick, TurnSlot};
use crate::dispatch::{Dispatch, RunHome, RunTask, ShardTask};
use crate::entry::EntryRef;
use crate::limit::PendingLimit;
use crate::sync::{spin_loop, thread, Arc};

/// What the shard thread keeps where code on its own thread can reach it.
struct Own {
    /// The core; `None` once a shutdown from this thread took it.
    core: Option<ShardCore>,
    /// How fired timers leave the shard.
    dispatch: Dispatch,
    /// Ticks ↔ instants.
    clock: Clock,
    /// Fired this turn, not yet dispatched (inline and spawn).
    fired: VecDeque<ShardTask>,
}

#[cfg(not(loom))]
std::thread_local! {
    /// The address of the `ShardShared` whose thread this is (0 if none).
    static OWN_SHARD: Cell<usize> = const { Cell::new(0) };
    /// That shard's core and queue (ground rules).
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

/// Runs `f` on this thread's `Own`, if this is a shard thread whose loop runs and
/// nothing on this thread borrows it now.
fn with_own<R>(f: impl FnOnce(&mut Own) -> R) -> Option<R> {
    OWN.with(|own| {
        let mut own = own.try_borrow_mut().ok()?;
        own.as_mut().map(f)
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
    with_own(|own| {
        own.core.as_mut().is_some_and(|core| {
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
    with_own(|own| own.core.take()).flatten()
}

/// Dispatches, on the calling shard thread, what its turn fired and has not yet been
/// dispatched: for a shutdown started by a callback on it (ground rules).
pub(crate) fn dispatch_rest_here() {
    while let Some((task, dispatch, clock)) = with_own(|own| {
        own.fired
            .pop_front()
            .map(|task| (task, own.dispatch.clone(), own.clock))
    })
    .flatten()
    {
        dispatch.one(task, clock);
    }
}

/// The shard thread's own state.
#[derive(Debug)]
pub(crate) struct ShardThread {
    /// The deterministic core.
    core: ShardCore,
    /// Ticks ↔ instants.
    clock: Clock,
    /// Where fired timers go.
    dispatch: Dispatch,
    /// The shard's place in its manual clock's rounds; `None` on the system clock.
    turns: Option<TurnSlot>,
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
        ShardThread {
            core: ShardCore::new(shared, cursors, now, clock.ticks().tick_ns(), limit),
            clock,
            dispatch,
            turns,
        }
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
        #[cfg(loom)]
        let _ = pin_to;
        let ShardThread {
            core,
            clock,
            dispatch,
            turns,
        } = self;
        if let Some(turns) = &turns {
            turns.start_on_this_thread();
        }
        let shared = core.shared().clone();
        let home: RunHome = std::sync::Arc::new(shared.clone());
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
        OWN.with(|own| {
            *own.borrow_mut() = Some(Own {
                core: Some(core),
                dispatch: dispatch.clone(),
                clock,
                fired: VecDeque::new(),
            });
        });
        let batches = dispatch.batches();
        // The last round of the manual clock a turn of this shard began in.
        let mut answered = 0;
        let mut batch: Vec<ShardTask> = Vec::with_capacity(FIRE_BATCH);
        let pending = loop {
            #[cfg(test)]
            if shared.fail_turn.load(std::sync::atomic::Ordering::Relaxed) {
                unreachable!("injected by a test: an internal invariant fails on the shard thread");
            }
            let turn = turns.as_ref().map(TurnSlot::begin_turn);
            let mut fired_any = false;
            let turned = with_own(|own| {
                let Own { core, fired, .. } = own;
                let core = core.as_mut()?;
                // Lateness: this pass's clock reading less the start of each tick.
                // (Read after the rings are drained, as the turn does.)
                let now_ns = Cell::new(Nanos::default());
                let lateness = &shared.stats.lateness;
                let now = || {
                    let now_instant = turn.map_or_else(Instant::now, |turn| turn.now);
                    now_ns.set(clock.instant_to_ns(now_instant));
                    clock.tick_of(now_instant)
                };
                let finished = core.turn(now, &mut |expired| {
                    fired_any = true;
                    let due_tick = clock.due_tick(expired.deadline());
                    let due_ns = clock.ticks().due_by(due_tick);
                    lateness.record(now_ns.get().since(due_ns));
                    let task = match expired {
                        Expired::Fired(task) => ShardTask::Fired(task),
                        Expired::Run(running) => {
                            ShardTask::Run(RunTask::new(running, home.clone(), clock))
                        }
                    };
                    if batches {
                        batch.push(task);
                        if batch.len() == FIRE_BATCH {
                            hand_over(::core::mem::replace(
                                &mut batch,
                                Vec::with_capacity(FIRE_BATCH),
                            ));
                        }
                    } else {
                        fired.push_back(task);
                    }
                });
                Some(finished)
            })
            .flatten();
            let Some(finished) = turned else {
                break Vec::new(); // a callback on this thread took the core
            };
            if batches {
                if !batch.is_empty() {
                    hand_over(::core::mem::replace(
                        &mut batch,
                        Vec::with_capacity(FIRE_BATCH),
                    ));
                }
            } else {
                // One at a time, no borrow held while user code runs.
                while let Some(task) = with_own(|own| own.fired.pop_front()).flatten() {
                    dispatch.one(task, clock);
                }
            }
            if let (Some(turns), Some(turn)) = (&turns, turn) {
                turns.end_turn(turn, fired_any);
                answered = turn.round;
            }
            if shared.is_stopping() {
                break take_own_core()
                    .map(|mut core| core.shut_down())
                    .unwrap_or_default();
            }
            if !finished {
                // The turn's budget ran out with more due: no park, the next turn
                // drains the rings and goes on with the burst.
                continue;
            }
            let parked = with_own(|own| {
                own.core
                    .as_ref()
                    .map(|core| park_until(core, clock, turns.as_ref(), answered))
            });
            if parked.flatten().is_none() {
                break Vec::new(); // a callback on this thread took the core
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
    OWN_SHARD.with(|own| own.set(address(core.shared())));
    OWN.with(|own| {
        *own.borrow_mut() = Some(Own {
            core: Some(core),
            dispatch: Dispatch::Inline(Arc::new(crate::sync::AtomicU64::new(0))),
            clock,
            fired: VecDeque::new(),
        });
    });
    f();
    OWN_SHARD.with(|own| own.set(0));
    OWN.with(|own| own.borrow_mut().take())
        .and_then(|own| own.core)
        .expect("model invariant: f does not shut its shard down")
}

/// The models' way into [`park_until`]: the shard thread's real park, on the system
/// clock, with ticks of an hour (so the wall time a model takes stays in tick 0).
/// Loom only.
#[cfg(loom)]
pub fn park_for_model(core: &ShardCore) {
    park_until(core, Clock::at(Instant::now(), 3_600_000_000_000), None, 0);
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

/// Sleeps until tick `next` (the core's next expiry; or indefinitely), unless work
/// arrived meanwhile. Under a manual clock (`turns`), indefinitely, and not at all if
/// a round later than `answered` is asked for: nothing comes due until an `advance`,
/// which unparks the shard.
fn park_until(core: &ShardCore, clock: Clock, turns: Option<&TurnSlot>, answered: u64) {
    let wake = core.next_expiry().unwrap_or(Tick::NEVER);
    let (now, manual) = match turns {
        Some(turns) => {
            let (now, round_asked) = turns.before_park(answered);
            if round_asked {
                return;
            }
            (now, true)
        }
        None => (Instant::now(), false),
    };
    let now = clock.tick_of(now);
    if wake <= now {
        return;
    }
    if !core.prepare_park(wake) {
        // Work arrived; it may be a slot reserved and not yet written, which the next
        // turn cannot pop until its producer writes it: let the producer run.
        spin_loop();
        return;
    }
    if wake == Tick::NEVER || manual {
        thread::park();
    } else {
        let until = clock.tick_to_instant(wake);
        let now = Instant::now();
        if until > now {
            thread::park_timeout(until - now);
        }
    }
    core.shared().wake_up();
}
