//! Runs a program on a real service and checks it against the model after every step.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use sharded_timer::{
    Callback, Callbacks, ManualClock, ScheduleError, ShardedTimer, TimerHandle, TimerId,
    TimerState, Unfired,
};

use crate::model::{
    rate_deadline, since, Fate, Fut, Gate, Kind, Model, ModelFuture, ModelTimer, Plan,
};
use crate::program::{Action, Advance, At, Delay, Mode, Op, Setup};

/// Locks, taking over a lock poisoned by a panic elsewhere (the check that panicked
/// reports it).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// What callbacks record, in the order they record it.
#[derive(Debug)]
pub(crate) enum Event {
    /// Timer `timer` ran, reading `now`, as the `seq`-th recorded moment.
    Ran {
        timer: usize,
        now: Instant,
        seq: u64,
    },
    /// A callback did not act: it ran outside an `advance` (its action would race
    /// with the harness), or its target had no handle yet.
    Idle,
    /// Timer `parent`'s callback scheduled timer `child`; the instant asked for lies
    /// between `low` and `high` (equal unless the clock moved meanwhile).
    Child {
        child: usize,
        low: Instant,
        high: Instant,
        plan: Plan,
        outcome: Result<TimerHandle, ScheduleError>,
    },
    /// Timer `by`'s callback cancelled `target`.
    Cancelled {
        by: usize,
        target: usize,
        won: bool,
        seq: u64,
    },
    /// Timer `by`'s callback reset `target`, asking for an instant between `low` and
    /// `high`.
    Reset {
        target: usize,
        moved: bool,
        low: Instant,
        high: Instant,
    },
    /// A callback is about to call `shutdown`: from here on, a pending timer may
    /// have been handed back (its cancel and reset then return `false`).
    ShutdownBegan,
    /// A callback's `shutdown` handed these back.
    ShutDown { unfired: Vec<(TimerId, Instant)> },
}

/// What the harness and the callbacks share.
pub(crate) struct Shared {
    /// The clock.
    clock: ManualClock,
    /// The clock's far future.
    far: Instant,
    /// The service, for callbacks that schedule or shut down.
    timer: Mutex<Option<ShardedTimer>>,
    /// What callbacks recorded.
    log: Mutex<Vec<Event>>,
    /// Handles by timer index, for callbacks that act on other timers.
    handles: Mutex<HashMap<usize, TimerHandle>>,
    /// The next timer index.
    next_index: AtomicUsize,
    /// Orders recorded moments (runs, cancels).
    seq: AtomicU64,
    /// Callbacks may act: set while the harness is inside `advance`, or runs spawned
    /// callbacks or `Unfired`s.
    acting: AtomicBool,
    /// `Callbacks::spawn`'s collected callbacks.
    spawned: Mutex<Vec<Callback>>,
    /// What a callback's `shutdown` handed back.
    unfired: Mutex<Vec<Unfired>>,
}

impl Shared {
    /// A moment's sequence number.
    fn tick(&self) -> u64 {
        // ORDERING: SeqCst: a total order of recorded moments across threads.
        self.seq.fetch_add(1, Ordering::SeqCst)
    }

    /// Records `event`.
    fn record(&self, event: Event) {
        lock(&self.log).push(event);
    }

    /// The service, if the harness still holds it.
    fn service(&self) -> Option<ShardedTimer> {
        lock(&self.timer).clone()
    }

    /// A handle by index.
    fn handle(&self, index: usize) -> Option<TimerHandle> {
        lock(&self.handles).get(&index).cloned()
    }
}

/// The callback of timer `index`, acting as `plan` says.
fn callback(shared: &Arc<Shared>, index: usize, plan: Plan) -> Box<dyn FnMut() + Send> {
    let shared = shared.clone();
    Box::new(move || {
        let seq = shared.tick();
        let now = shared.clock.now();
        shared.record(Event::Ran {
            timer: index,
            now,
            seq,
        });
        // ORDERING: SeqCst: set and cleared by the harness around `advance`.
        if !shared.acting.load(Ordering::SeqCst) && !matches!(plan, Plan::Record) {
            shared.record(Event::Idle);
            return;
        }
        match plan {
            Plan::Record => {}
            Plan::Child { delay, then } => {
                let Some(timer) = shared.service() else {
                    return shared.record(Event::Idle);
                };
                let child = shared.next_index.fetch_add(1, Ordering::SeqCst);
                let plan = match then {
                    Some(delay) => Plan::Child { delay, then: None },
                    None => Plan::Record,
                };
                let low = shared.clock.now().checked_add(delay).unwrap_or(shared.far);
                let outcome = timer.schedule(delay, callback(&shared, child, plan.clone()));
                let high = shared.clock.now().checked_add(delay).unwrap_or(shared.far);
                if let Ok(handle) = &outcome {
                    lock(&shared.handles).insert(child, handle.clone());
                }
                shared.record(Event::Child {
                    child,
                    low,
                    high,
                    plan,
                    outcome,
                });
            }
            Plan::Cancel { target } => {
                let Some(handle) = shared.handle(target) else {
                    return shared.record(Event::Idle);
                };
                let won = handle.cancel();
                let seq = shared.tick();
                shared.record(Event::Cancelled {
                    by: index,
                    target,
                    won,
                    seq,
                });
            }
            Plan::Reset { target, delay } => {
                let Some(handle) = shared.handle(target) else {
                    return shared.record(Event::Idle);
                };
                let low = shared.clock.now().checked_add(delay).unwrap_or(shared.far);
                let moved = handle.reset(delay);
                let high = shared.clock.now().checked_add(delay).unwrap_or(shared.far);
                shared.record(Event::Reset {
                    target,
                    moved,
                    low,
                    high,
                });
            }
            Plan::Shutdown => {
                let Some(timer) = shared.service() else {
                    return shared.record(Event::Idle);
                };
                shared.record(Event::ShutdownBegan);
                let unfired = timer.shutdown();
                let listed = unfired.iter().map(|u| (u.id(), u.deadline())).collect();
                lock(&shared.unfired).extend(unfired);
                shared.record(Event::ShutDown { unfired: listed });
            }
        }
    })
}

/// One case under way.
pub(crate) struct Sim {
    setup: Setup,
    shared: Arc<Shared>,
    /// The harness's clone of the service; `None` once `Op::DropService` dropped it.
    timer: Option<ShardedTimer>,
    model: Model,
    /// Timer-made-so-far order, for picking targets.
    order: Vec<usize>,
    /// `shutdown` lists handed back by callbacks, not yet reconciled.
    shutdowns: Vec<Vec<(TimerId, Instant)>>,
    /// Repeating timers whose run may be under way when the harness shuts down.
    in_flight: BTreeSet<usize>,
    /// Timers not yet made that a callback will act on: index, and that callback.
    claims: BTreeMap<usize, usize>,
}

/// Fails the case with a message.
macro_rules! check {
    ($cond:expr, $($arg:tt)+) => {
        prop_assert!($cond, $($arg)+)
    };
}

type Checked = Result<(), TestCaseError>;

impl Sim {
    /// Builds the service `setup` describes on a fresh clock.
    pub(crate) fn new(setup: &Setup) -> Sim {
        let clock = ManualClock::new();
        let start = clock.now();
        // Where the clock saturates: ask a clock of the same start that drives nothing.
        let far = {
            let probe = ManualClock::new();
            let probe_start = probe.now();
            probe.advance(Duration::MAX);
            start + probe.now().duration_since(probe_start)
        };
        let shared = Arc::new(Shared {
            clock: clock.clone(),
            far,
            timer: Mutex::new(None),
            log: Mutex::new(Vec::new()),
            handles: Mutex::new(HashMap::new()),
            next_index: AtomicUsize::new(0),
            seq: AtomicU64::new(0),
            acting: AtomicBool::new(false),
            spawned: Mutex::new(Vec::new()),
            unfired: Mutex::new(Vec::new()),
        });
        let callbacks = match setup.mode {
            Mode::Pool(threads) => Callbacks::pool(threads),
            Mode::Inline => Callbacks::inline(),
            Mode::Spawn => {
                let collected = Arc::downgrade(&shared);
                Callbacks::spawn(move |callback| match collected.upgrade() {
                    Some(shared) => lock(&shared.spawned).push(callback),
                    None => drop(callback),
                })
            }
        };
        let mut builder = ShardedTimer::builder()
            .shards(setup.shards)
            .callbacks(callbacks)
            .ring_capacity(setup.ring)
            .tick(setup.tick())
            .pin_cores(false)
            .thread_name("sim")
            .clock(clock.clone());
        if let Some(limit) = setup.max_pending {
            builder = builder.max_pending(limit);
        }
        let timer = builder.build().expect("the simulated service builds");
        *lock(&shared.timer) = Some(timer.clone());
        Sim {
            setup: setup.clone(),
            model: Model::new(start, far),
            shared,
            timer: Some(timer),
            order: Vec::new(),
            shutdowns: Vec::new(),
            in_flight: BTreeSet::new(),
            claims: BTreeMap::new(),
        }
    }

    /// Runs one step and checks what can be checked after it.
    pub(crate) fn step(&mut self, op: &Op) -> Checked {
        self.absorb()?;
        let tick = self.setup.tick_ns;
        if self.timer.is_none() && op.needs_service() {
            // Every clone is gone: nothing can call the service any more.
            return Ok(());
        }
        match op {
            Op::Schedule { delay, action } => {
                let delay = delay.duration(tick);
                let requested = self.model.after(delay);
                let plan = self.resolve(action);
                self.schedule(Kind::Once, requested, plan, |timer, f| {
                    timer.schedule(delay, f)
                })?;
            }
            Op::ScheduleAt { at, action } => {
                let instant = self.instant(*at);
                let plan = self.resolve(action);
                self.schedule(Kind::Once, instant, plan, |timer, f| {
                    timer.schedule_at(instant, f)
                })?;
            }
            Op::Repeating {
                period,
                fixed_delay,
                action,
            } => {
                let period = period.duration(tick).max(self.setup.tick());
                // The first run's deadline saturates at the far future, as a
                // one-shot's does; a later run beyond it never comes.
                let requested = self.model.effective(self.model.after(period));
                let plan = self.resolve(action);
                let (kind, fixed) = if *fixed_delay {
                    (Kind::FixedDelay { delay: period }, true)
                } else {
                    let start = self.model.now;
                    (
                        Kind::Rate {
                            start,
                            period,
                            slot: 1,
                        },
                        false,
                    )
                };
                self.schedule(kind, requested, plan, |timer, f| {
                    if fixed {
                        timer.schedule_with_fixed_delay(period, f)
                    } else {
                        timer.schedule_repeating(period, f)
                    }
                })?;
            }
            Op::Cancel { target } => self.cancel(*target)?,
            Op::Reset { target, delay } => {
                let delay = delay.duration(tick);
                let requested = self.model.after(delay);
                self.reset(*target, requested, |handle| handle.reset(delay))?;
            }
            Op::ResetAt { target, at } => {
                let instant = self.instant(*at);
                self.reset(*target, instant, |handle| handle.reset_at(instant))?;
            }
            Op::Sleep { delay, until } => self.sleep(*delay, *until)?,
            Op::PollSleep { target } => {
                if !self.model.sleeps.is_empty() {
                    let k = target % self.model.sleeps.len();
                    self.poll_future(false, k)?;
                }
            }
            Op::DropSleep { target } => {
                if !self.model.sleeps.is_empty() {
                    let k = target % self.model.sleeps.len();
                    self.drop_future(false, k);
                    self.if_last_user_gone()?;
                }
            }
            Op::ResetSleep { target, at } => {
                if !self.model.sleeps.is_empty() {
                    let k = target % self.model.sleeps.len();
                    let instant = self.instant(*at);
                    self.reset_sleep(k, instant)?;
                }
            }
            Op::Timeout { delay, ready } => self.timeout(*delay, *ready)?,
            Op::PollTimeout { target } => {
                if !self.model.timeouts.is_empty() {
                    let k = target % self.model.timeouts.len();
                    self.poll_future(true, k)?;
                }
            }
            Op::DropTimeout { target } => {
                if !self.model.timeouts.is_empty() {
                    let k = target % self.model.timeouts.len();
                    self.drop_future(true, k);
                    self.if_last_user_gone()?;
                }
            }
            Op::Burst {
                count,
                base,
                spread,
                extra,
            } => {
                let tick = self.setup.tick();
                for i in 0..=u32::from(*count) {
                    let ticks = if i == u32::from(*count) {
                        u32::from(*base) + u32::from(*spread) + u32::from(*extra)
                    } else {
                        u32::from(*base) + i % (u32::from(*spread) + 1)
                    };
                    let delay = tick * ticks;
                    let requested = self.model.after(delay);
                    self.schedule(Kind::Once, requested, Plan::Record, |timer, f| {
                        timer.schedule(delay, f)
                    })?;
                }
            }
            Op::AlignedBurst {
                count,
                level,
                extra,
            } => {
                let slot = 1u128 << (6 * u32::from(*level));
                let since = (self.model.now - self.model.start).as_nanos();
                let boundary = (since / slot + 1) * slot;
                let at = u64::try_from(boundary)
                    .ok()
                    .and_then(|ns| self.model.start.checked_add(Duration::from_nanos(ns)));
                if let Some(at) = at.filter(|&at| at < self.model.far) {
                    for i in 0..=u32::from(*count) {
                        let requested = if i == u32::from(*count) {
                            at + Duration::from_nanos(u64::from(*extra))
                        } else {
                            at
                        };
                        self.schedule(Kind::Once, requested, Plan::Record, |timer, f| {
                            timer.schedule_at(requested, f)
                        })?;
                    }
                }
            }
            Op::Advance(by) => self.advance(*by)?,
            Op::Shutdown { run } => self.shutdown(*run)?,
            Op::DropService => self.drop_service()?,
        }
        self.absorb()
    }

    /// The instant `at` names now.
    fn instant(&self, at: At) -> Instant {
        let model = &self.model;
        match at {
            At::Now => model.now,
            At::Ahead(delay) => model
                .now
                .checked_add(delay.duration(self.setup.tick_ns))
                // Beyond `Instant`: the farthest instant the clock's start has.
                .unwrap_or(model.far),
            At::Behind(permille) => {
                let back = Delay::SubTick(permille).duration(self.setup.tick_ns);
                model
                    .now
                    .checked_sub(back)
                    .unwrap_or(model.start)
                    .max(model.start)
            }
            At::BeforeOrigin(secs) => model
                .start
                .checked_sub(Duration::from_secs(u64::from(secs)))
                .unwrap_or(model.start),
            At::Last(back) => model.far - Duration::from_nanos(u64::from(back)),
        }
    }

    /// Resolves an action's targets (by index among the timers made so far; one past
    /// the last is the new timer itself). A target some other callback already acts
    /// on makes the action a plain record, so that every timer's cancels and resets
    /// come from one thread at a time.
    fn resolve(&mut self, action: &Action) -> Plan {
        let tick = self.setup.tick_ns;
        let own = self.shared.next_index.load(Ordering::SeqCst);
        // Three times in four one of the last three timers (or itself), which are
        // often due with it; otherwise any.
        let pick = |target: usize, order: &[usize]| {
            if target % 8 == 7 {
                // The next timer made: it can share this one's deadline and then
                // comes after it in its slot (a run queued behind this callback).
                return own + 1;
            }
            let k = if target.is_multiple_of(4) {
                target / 4 % (order.len() + 1)
            } else {
                order.len() - (target / 4 % (order.len() + 1).min(4))
            };
            order.get(k).copied().unwrap_or(own)
        };
        let claim = |model: &Model, target: usize| {
            target == own
                || target == own + 1
                || model.timers.get(&target).is_some_and(|t| t.owner.is_none())
        };
        match action {
            Action::Record => Plan::Record,
            Action::Child { delay, then } => Plan::Child {
                delay: delay.duration(tick),
                then: then.map(|d| d.duration(tick)),
            },
            Action::Cancel { target } => {
                let target = pick(*target, &self.order);
                if claim(&self.model, target) {
                    Plan::Cancel { target }
                } else {
                    Plan::Record
                }
            }
            Action::Reset { target, delay } => {
                let target = pick(*target, &self.order);
                if claim(&self.model, target) {
                    Plan::Reset {
                        target,
                        delay: delay.duration(tick),
                    }
                } else {
                    Plan::Record
                }
            }
            Action::Shutdown => Plan::Shutdown,
        }
    }

    /// Schedules a timer from the harness and checks the answer against the model's
    /// pending count and `max_pending`.
    fn schedule(
        &mut self,
        kind: Kind,
        requested: Instant,
        plan: Plan,
        call: impl FnOnce(&ShardedTimer, Box<dyn FnMut() + Send>) -> Result<TimerHandle, ScheduleError>,
    ) -> Checked {
        let index = self.shared.next_index.fetch_add(1, Ordering::SeqCst);
        let taken = self.model.room_taken();
        let maybe = self.model.maybe_fired();
        let outcome = call(self.service(), callback(&self.shared, index, plan.clone()));
        match outcome {
            Ok(handle) => {
                check!(!self.model.shut, "schedule succeeded after shutdown");
                if let Some(limit) = self.setup.max_pending {
                    check!(
                        taken - maybe < limit,
                        "schedule accepted with {} of {} pending (none could have fired)",
                        taken,
                        limit
                    );
                }
                lock(&self.shared.handles).insert(index, handle.clone());
                self.add_timer(index, handle, kind, requested, plan);
            }
            Err(ScheduleError::Shutdown) => {
                check!(
                    self.model.shut,
                    "schedule refused with Shutdown while running"
                );
            }
            Err(ScheduleError::TooManyPending { limit }) => {
                check!(!self.model.shut, "TooManyPending after shutdown");
                check!(
                    Some(limit) == self.setup.max_pending,
                    "TooManyPending {{ limit: {} }} without that max_pending",
                    limit
                );
                check!(
                    taken >= limit,
                    "schedule refused with {} of {} pending",
                    taken,
                    limit
                );
            }
            Err(other) => check!(false, "unexpected schedule error {:?}", other),
        }
        Ok(())
    }

    /// Enters a scheduled timer in the model.
    fn add_timer(
        &mut self,
        index: usize,
        handle: TimerHandle,
        kind: Kind,
        requested: Instant,
        plan: Plan,
    ) {
        match plan {
            Plan::Cancel { target } | Plan::Reset { target, .. } => {
                match self.model.timers.get_mut(&target) {
                    Some(t) => t.owner = Some(index),
                    None if target != index => {
                        self.claims.insert(target, index);
                    }
                    None => {}
                }
            }
            _ => {}
        }
        let owner = match plan {
            Plan::Cancel { target } | Plan::Reset { target, .. } if target == index => Some(index),
            _ => self.claims.remove(&index),
        };
        self.model.scheduled += 1;
        self.order.push(index);
        self.model.timers.insert(
            index,
            ModelTimer {
                handle,
                kind,
                requested,
                fate: Fate::Pending,
                owner,
                fired_unlogged: false,
                cancelled_at: None,
                plan,
            },
        );
    }

    /// Picks a target for the harness: one no callback acts on.
    fn pick(&self, target: usize) -> Option<usize> {
        if self.order.is_empty() {
            return None;
        }
        let index = self.order[target % self.order.len()];
        self.model.timers[&index].owner.is_none().then_some(index)
    }

    /// `cancel()` from the harness.
    fn cancel(&mut self, target: usize) -> Checked {
        let Some(index) = self.pick(target) else {
            return Ok(());
        };
        let won = self.model.timers[&index].handle.cancel();
        let seq = self.shared.tick();
        self.apply_cancel(index, won, Some((usize::MAX, seq)), &BTreeMap::new())
    }

    /// `reset` / `reset_at` from the harness, asking for `requested`.
    fn reset(
        &mut self,
        target: usize,
        requested: Instant,
        call: impl FnOnce(&TimerHandle) -> bool,
    ) -> Checked {
        let Some(index) = self.pick(target) else {
            return Ok(());
        };
        let moved = call(&self.model.timers[&index].handle);
        self.apply_reset(index, moved, requested, requested, &BTreeMap::new())
    }

    /// The model's side of a cancel of `index` that returned `won`; `by` is the
    /// cancelling callback and its sequence number, `runs` the runs recorded in the
    /// same batch of events.
    fn apply_cancel(
        &mut self,
        index: usize,
        won: bool,
        by: Option<(usize, u64)>,
        runs: &BTreeMap<usize, Vec<(Instant, u64)>>,
    ) -> Checked {
        let due = self.model.timer_due(&self.model.timers[&index]);
        let ran_now = runs.contains_key(&index);
        let shut = self.model.shut;
        let timer = self.model.timers.get_mut(&index).expect("a known timer");
        match (timer.kind, timer.fate) {
            (Kind::Once, Fate::Pending) if won => {
                check!(
                    !timer.fired_unlogged,
                    "timer {} cancelled after it fired",
                    index
                );
                timer.fate = Fate::Cancelled;
                self.model.cancelled += 1;
            }
            (Kind::Once, Fate::Pending) => {
                check!(
                    due || ran_now || timer.fired_unlogged || shut,
                    "cancel of pending timer {} (not due) returned false",
                    index
                );
                if !ran_now && !shut {
                    timer.fired_unlogged = true;
                }
            }
            (Kind::Rate { .. } | Kind::FixedDelay { .. }, Fate::Pending) => {
                check!(
                    won || shut,
                    "cancel of pending repeating timer {} returned false",
                    index
                );
                if !won {
                    return Ok(()); // handed back by the shutdown under way
                }
                if due && !ran_now {
                    // Its run may have been handed over (counted in `fired`) before
                    // this cancel won, and then not started.
                    self.model.fired_slack += 1;
                }
                timer.fate = Fate::Cancelled;
                timer.cancelled_at = Some((by.map_or(u64::MAX, |(_, seq)| seq), 0));
                self.model.cancelled += 1;
            }
            (_, fate) => {
                check!(!won, "cancel of timer {} ({:?}) returned true", index, fate);
            }
        }
        Ok(())
    }

    /// The model's side of a reset of `index` that returned `moved`, asking for an
    /// instant between `low` and `high`.
    fn apply_reset(
        &mut self,
        index: usize,
        moved: bool,
        low: Instant,
        high: Instant,
        runs: &BTreeMap<usize, Vec<(Instant, u64)>>,
    ) -> Checked {
        let due = self.model.timer_due(&self.model.timers[&index]);
        let ran_now = runs.contains_key(&index);
        let shut = self.model.shut;
        let far = self.model.far;
        let timer = self.model.timers.get_mut(&index).expect("a known timer");
        match (timer.kind, timer.fate) {
            (Kind::Once, Fate::Pending) if moved => {
                check!(
                    !timer.fired_unlogged,
                    "timer {} reset after it fired",
                    index
                );
                timer.requested = if low == high {
                    low
                } else {
                    // The clock moved while the callback reset it: learn which instant.
                    let reported = timer.handle.deadline();
                    check!(
                        reported >= low.min(far) && reported <= high.min(far),
                        "reset deadline {:?} outside {:?}..={:?}",
                        reported,
                        low,
                        high
                    );
                    reported
                };
            }
            (Kind::Once, Fate::Pending) => {
                check!(
                    due || ran_now || timer.fired_unlogged || shut,
                    "reset of pending timer {} (not due) returned false",
                    index
                );
                if !ran_now && !shut {
                    timer.fired_unlogged = true;
                }
            }
            (_, fate) => {
                check!(
                    !moved,
                    "reset of timer {} ({:?} {:?}) returned true",
                    index,
                    timer.kind,
                    fate
                );
            }
        }
        Ok(())
    }

    /// Takes in what the callbacks recorded: children, cancels and resets, runs.
    fn absorb(&mut self) -> Checked {
        let events = std::mem::take(&mut *lock(&self.shared.log));
        if events.is_empty() {
            return Ok(());
        }
        let mut runs: BTreeMap<usize, Vec<(Instant, u64)>> = BTreeMap::new();
        for event in &events {
            if let Event::Ran { timer, now, seq } = event {
                runs.entry(*timer).or_default().push((*now, *seq));
            }
        }
        let mut actions = Vec::new();
        for event in events {
            match event {
                Event::Child {
                    child,
                    low,
                    high,
                    plan,
                    outcome,
                } => match outcome {
                    Ok(handle) => {
                        let requested = if low == high { low } else { handle.deadline() };
                        self.add_timer(child, handle, Kind::Once, requested, plan);
                    }
                    Err(ScheduleError::TooManyPending { limit }) => check!(
                        Some(limit) == self.setup.max_pending,
                        "a callback's schedule: TooManyPending {{ limit: {} }} without it",
                        limit
                    ),
                    Err(ScheduleError::Shutdown) => {}
                    Err(other) => check!(false, "unexpected schedule error {:?}", other),
                },
                Event::Ran { .. } | Event::Idle => {}
                other => actions.push(other),
            }
        }
        for action in actions {
            match action {
                Event::Cancelled {
                    by,
                    target,
                    won,
                    seq,
                } => self.apply_cancel(target, won, Some((by, seq)), &runs)?,
                Event::Reset {
                    target,
                    moved,
                    low,
                    high,
                } => self.apply_reset(target, moved, low, high, &runs)?,
                Event::ShutdownBegan => self.model.shut = true,
                Event::ShutDown { unfired } => {
                    self.model.shut = true;
                    self.shutdowns.push(unfired);
                }
                _ => unreachable!("sorted above"),
            }
        }
        for (index, mut seen) in runs {
            seen.sort_by_key(|&(_, seq)| seq);
            self.absorb_runs(index, &seen)?;
        }
        Ok(())
    }

    /// Checks and applies the runs of timer `index`.
    fn absorb_runs(&mut self, index: usize, seen: &[(Instant, u64)]) -> Checked {
        let now = self.model.now;
        let one_thread = self.setup.one_callback_thread();
        let (origin, far) = (self.model.start, self.model.far);
        let Some(timer) = self.model.timers.get_mut(&index) else {
            return Err(TestCaseError::fail(format!("unknown timer {index} ran")));
        };
        for &(seen_now, seq) in seen {
            check!(
                seen_now <= now,
                "timer {} saw {:?}, after the clock's now",
                index,
                seen_now
            );
            if timer.fate == Fate::Cancelled && matches!(timer.kind, Kind::Once) {
                // Handed back and dropped, or cancelled: never runs.
                return Err(TestCaseError::fail(format!(
                    "one-shot timer {index} ran after a cancel returned true"
                )));
            }
            match timer.kind {
                Kind::Once => {
                    check!(timer.fate != Fate::Ran, "timer {} ran twice", index);
                    if timer.fate == Fate::Pending {
                        check!(
                            timer.requested.min(far) <= seen_now,
                            "timer {} ran early: at {:?}, due {:?} (clock start {:?})",
                            index,
                            seen_now.duration_since(self.model.start),
                            since(origin, timer.requested),
                            self.model.start
                        );
                        self.model.fired += 1;
                    }
                    timer.fate = Fate::Ran;
                    timer.fired_unlogged = false;
                }
                Kind::Rate {
                    start,
                    period,
                    ref mut slot,
                } => {
                    if let Some((cancel_seq, after)) = &mut timer.cancelled_at {
                        if seq > *cancel_seq {
                            *after += 1;
                            check!(
                                !one_thread,
                                "repeating timer {} began a run after a cancel returned true \
                                 (one thread runs callbacks, so no run was under way)",
                                index
                            );
                            check!(
                                *after <= 1,
                                "repeating timer {} ran twice after its cancel",
                                index
                            );
                        }
                    } else {
                        check!(
                            timer.fate == Fate::Pending,
                            "repeating timer {} ran while {:?}",
                            index,
                            timer.fate
                        );
                    }
                    let deadline = rate_deadline(start, period, *slot).unwrap_or(far);
                    check!(
                        deadline.min(far) <= seen_now,
                        "repeating timer {} ran early: slot {} due {:?}, ran at {:?}",
                        index,
                        slot,
                        deadline,
                        seen_now
                    );
                    let passed = seen_now.saturating_duration_since(start).as_nanos()
                        / period.as_nanos().max(1);
                    let passed = u64::try_from(passed).unwrap_or(u64::MAX);
                    let next = (*slot + 1).max(passed.saturating_add(1));
                    self.model.skipped += next - *slot - 1;
                    *slot = next;
                    timer.requested =
                        rate_deadline(start, period, next).unwrap_or(far + Duration::from_nanos(1));
                    self.model.fired += 1;
                }
                Kind::FixedDelay { delay } => {
                    if let Some((cancel_seq, after)) = &mut timer.cancelled_at {
                        if seq > *cancel_seq {
                            *after += 1;
                            check!(
                                !one_thread,
                                "fixed-delay timer {} began a run after a cancel returned true",
                                index
                            );
                            check!(
                                *after <= 1,
                                "fixed-delay timer {} ran twice after its cancel",
                                index
                            );
                        }
                    } else {
                        check!(
                            timer.fate == Fate::Pending,
                            "fixed-delay timer {} ran while {:?}",
                            index,
                            timer.fate
                        );
                    }
                    check!(
                        timer.requested.min(far) <= seen_now,
                        "fixed-delay timer {} ran early: due {:?}, ran at {:?}",
                        index,
                        timer.requested,
                        seen_now
                    );
                    timer.requested = seen_now
                        .checked_add(delay)
                        .unwrap_or(far + Duration::from_nanos(1));
                    self.model.fired += 1;
                }
            }
        }
        Ok(())
    }

    /// `sleep` / `sleep_until`.
    fn sleep(&mut self, delay: Delay, until: Option<At>) -> Checked {
        let (sleep, requested) = match until {
            Some(at) => {
                let instant = self.instant(at);
                (self.service().sleep_until(instant), instant)
            }
            None => {
                let d = delay.duration(self.setup.tick_ns);
                (self.service().sleep(d), self.model.after(d))
            }
        };
        let reported = sleep.deadline().into_std();
        check!(
            reported == self.model.effective(requested),
            "Sleep::deadline {} is not the {} asked for (saturated at the far future)",
            self.model.since(reported),
            self.model.since(requested)
        );
        // A deadline not after now needs no timer: the sleep is armed, and elapsed, by
        // its first poll (not before). Otherwise a timer, or a refusal after shutdown.
        let past = self.model.is_due(requested);
        let timer = !self.model.shut && !past;
        self.model.scheduled += u64::from(timer);
        self.model.sleeps.push(ModelFuture {
            fut: Some(Fut::Sleep(Box::pin(sleep))),
            requested,
            timer,
            armed: !past,
            elapsed: false,
            refused: self.model.shut && !past,
            registered: false,
            wakes: Arc::default(),
            expected_wakes: 0,
            ready: false,
        });
        Ok(())
    }

    /// `timeout(delay, Gate(ready))`.
    fn timeout(&mut self, delay: Delay, ready: bool) -> Checked {
        let d = delay.duration(self.setup.tick_ns);
        let timeout = self.service().timeout(d, Gate(ready));
        let requested = self.model.after(d);
        let reported = timeout.deadline();
        check!(
            reported == self.model.effective(requested),
            "Timeout::deadline {} is not the {} asked for (saturated at the far future)",
            self.model.since(reported),
            self.model.since(requested)
        );
        self.model.timeouts.push(ModelFuture {
            fut: Some(Fut::Timeout(Box::pin(timeout))),
            requested,
            timer: false,
            armed: false,
            elapsed: false,
            refused: false,
            registered: false,
            wakes: Arc::default(),
            expected_wakes: 0,
            ready,
        });
        Ok(())
    }

    /// Polls sleep or timeout `k` and checks the answer.
    fn poll_future(&mut self, timeout: bool, k: usize) -> Checked {
        let model = &mut self.model;
        let shut = model.shut;
        let now = model.now;
        let future = if timeout {
            &mut model.timeouts[k]
        } else {
            &mut model.sleeps[k]
        };
        let waker = future.waker();
        let mut cx = Context::from_waker(&waker);
        let Some(fut) = &mut future.fut else {
            return Ok(());
        };
        if !future.armed && !future.ready {
            // The first poll arms the timer, unless the deadline has passed.
            future.armed = true;
            if future.requested.min(model.far) <= now {
                future.elapsed = true;
            } else if shut {
                future.refused = true;
            } else {
                future.timer = true;
                model.scheduled += 1;
            }
        }
        match fut {
            Fut::Sleep(sleep) => {
                let poll = sleep.as_mut().poll(&mut cx);
                let done = future.elapsed || future.refused;
                check!(
                    poll.is_ready() == done,
                    "sleep {} polled {:?}; model: elapsed {} refused {} (deadline {:?}, now {:?})",
                    k,
                    poll,
                    future.elapsed,
                    future.refused,
                    since(model.start, future.requested),
                    now.duration_since(model.start)
                );
                if future.elapsed && future.refused {
                    future.elapsed = sleep.is_elapsed();
                    future.refused = !future.elapsed;
                }
                check!(
                    sleep.is_elapsed() == future.elapsed,
                    "sleep {}: is_elapsed {} after a poll; model {}",
                    k,
                    sleep.is_elapsed(),
                    future.elapsed
                );
                let refused = sleep.refused();
                check!(
                    refused.is_some() == future.refused,
                    "sleep {}: refused {:?}; model {}",
                    k,
                    refused,
                    future.refused
                );
                if poll.is_pending() {
                    future.registered = true;
                }
            }
            Fut::Timeout(timeout) => {
                let poll = timeout.as_mut().poll(&mut cx);
                match poll {
                    Poll::Ready(Ok(())) => {
                        check!(future.ready, "timeout {} gave Ok of a pending future", k)
                    }
                    Poll::Ready(Err(elapsed)) => {
                        check!(!future.ready, "timeout {} gave Err with a ready future", k);
                        if future.elapsed && future.refused {
                            future.refused = elapsed.refused().is_some();
                            future.elapsed = !future.refused;
                        }
                        check!(
                            future.elapsed || future.refused,
                            "timeout {} elapsed early (deadline {:?}, now {:?})",
                            k,
                            future.requested,
                            now
                        );
                        check!(
                            elapsed.refused().is_some() == (future.refused && !future.elapsed),
                            "timeout {}: refused {:?}; model elapsed {} refused {}",
                            k,
                            elapsed.refused(),
                            future.elapsed,
                            future.refused
                        );
                    }
                    Poll::Pending => {
                        check!(
                            !future.ready && !future.elapsed && !future.refused,
                            "timeout {} pending; model elapsed {} refused {}",
                            k,
                            future.elapsed,
                            future.refused
                        );
                        future.registered = true;
                    }
                }
            }
        }
        Ok(())
    }

    /// Drops sleep or timeout `k`: cancels a pending timer and wakes nobody.
    fn drop_future(&mut self, timeout: bool, k: usize) {
        let model = &mut self.model;
        let future = if timeout {
            &mut model.timeouts[k]
        } else {
            &mut model.sleeps[k]
        };
        if future.fut.take().is_some() && future.timer {
            future.timer = false;
            model.cancelled += 1;
        }
    }

    /// `Sleep::reset(instant)`.
    fn reset_sleep(&mut self, k: usize, instant: Instant) -> Checked {
        let model = &mut self.model;
        let now = model.now;
        let shut = model.shut;
        let future = &mut model.sleeps[k];
        let Some(Fut::Sleep(sleep)) = &mut future.fut else {
            return Ok(());
        };
        sleep.as_mut().reset(instant.into());
        if !future.armed {
            // Armed by its first poll, for the new deadline.
            future.requested = instant;
            return Ok(());
        }
        check!(
            sleep.deadline() == instant.min(model.far),
            "Sleep::deadline after reset is not the instant asked for"
        );
        future.requested = instant;
        let past = instant.min(model.far) <= now;
        if future.timer && !past && !shut {
            // Moved in place: the stored waker stays.
            return Ok(());
        }
        if future.timer {
            future.timer = false;
            model.cancelled += 1;
        }
        if future.registered {
            // A task waiting on the timer given up is woken once, by the reset itself
            // (`Sleep::reset`): its next poll completes the sleep or registers anew.
            future.expected_wakes += 1;
        }
        future.registered = false;
        future.elapsed = false;
        future.refused = false;
        if past {
            // No timer: unarmed, and completed (elapsed) by the next poll.
            future.armed = false;
        } else if shut {
            future.refused = true;
        } else {
            future.timer = true;
            model.scheduled += 1;
        }
        Ok(())
    }

    /// `advance(by)`, then (spawn) runs what was handed over, and checks everything.
    fn advance(&mut self, by: Advance) -> Checked {
        let by = by.duration(self.setup.tick_ns);
        let target = self
            .model
            .now
            .checked_add(by)
            .map_or(self.model.far, |at| at.min(self.model.far));
        // ORDERING: SeqCst: callbacks read it.
        self.shared.acting.store(true, Ordering::SeqCst);
        self.shared.clock.advance(by);
        self.model.now = target;
        check!(
            self.shared.clock.now() == target,
            "the clock reads {:?} after advance, the model {:?}",
            self.shared.clock.now(),
            target
        );
        if matches!(self.setup.mode, Mode::Spawn) {
            self.run_spawned(true)?;
        }
        self.shared.acting.store(false, Ordering::SeqCst);
        self.absorb()?;
        self.futures_fire();
        self.reconcile_shutdowns()?;
        self.quiescent()
    }

    /// Spawn mode: runs the collected callbacks in deadline order, then `advance(0)`
    /// for what they made due, until nothing more is handed over. With `first`, checks
    /// that what was handed over is exactly the due set.
    fn run_spawned(&mut self, first: bool) -> Checked {
        for round in 0..16 {
            let mut collected = std::mem::take(&mut *lock(&self.shared.spawned));
            if round == 0 && first && !self.model.shut {
                let handed: BTreeSet<TimerId> = collected.iter().map(Callback::id).collect();
                for (index, timer) in &self.model.timers {
                    if timer.fate == Fate::Pending && self.model.timer_due(timer) {
                        check!(
                            handed.contains(&timer.handle.id()),
                            "timer {} due at {:?} was not handed to the spawner by advance (now {:?})",
                            index,
                            self.model.since(timer.requested),
                            self.model.now.duration_since(self.model.start)
                        );
                    }
                }
                for callback in &collected {
                    let id = callback.id();
                    if let Some((index, timer)) =
                        self.model.timers.iter().find(|(_, t)| t.handle.id() == id)
                    {
                        check!(
                            self.model.effective(timer.requested) == callback.deadline(),
                            "Callback::deadline {:?} of timer {} is not its deadline {:?}",
                            callback.deadline(),
                            index,
                            timer.requested
                        );
                    }
                }
            }
            if collected.is_empty() {
                return Ok(());
            }
            collected.sort_by_key(|callback| (callback.deadline(), callback.id()));
            if self.setup.latest_first {
                collected.reverse();
            }
            for callback in collected {
                callback.run();
            }
            self.absorb()?;
            self.shared.clock.advance(Duration::ZERO);
        }
        Err(TestCaseError::fail(
            "spawned callbacks kept coming for 16 rounds",
        ))
    }

    /// Sleeps and timeouts whose timer came due have fired: elapsed, and woken if a
    /// poll left a waker.
    fn futures_fire(&mut self) {
        let model = &mut self.model;
        let now = model.now;
        for future in model.sleeps.iter_mut().chain(model.timeouts.iter_mut()) {
            if future.timer && future.requested.min(model.far) <= now {
                future.timer = false;
                future.elapsed = true;
                // A callback's shutdown in this advance may have completed it first
                // (refused): both flags say "either", until a poll tells.
                future.refused = model.shut;
                model.fired += 1;
                if future.registered {
                    future.expected_wakes += 1;
                    future.registered = false;
                }
            }
        }
    }

    /// The checks that hold once `advance` returned: the due set has run, states,
    /// deadlines, wakes and the `Stats` identities.
    fn quiescent(&mut self) -> Checked {
        let model = &self.model;
        for (index, timer) in &model.timers {
            check!(
                !timer.fired_unlogged || model.shut,
                "timer {} fired but its callback never ran",
                index
            );
            if !model.shut && timer.fate == Fate::Pending {
                check!(
                    !model.timer_due(timer),
                    "timer {} ({:?}, {:?}) due at {:?} is still pending at {:?} after advance",
                    index,
                    timer.kind,
                    timer.plan,
                    model.since(timer.requested),
                    model.now.duration_since(model.start)
                );
            }
            self.check_handle(*index, timer)?;
        }
        for (k, future) in model.sleeps.iter().chain(&model.timeouts).enumerate() {
            // ORDERING: SeqCst: the wake happened before `advance` returned.
            let wakes = future.wakes.0.load(Ordering::SeqCst);
            check!(
                wakes == future.expected_wakes,
                "future {} woken {} times, expected {}",
                k,
                wakes,
                future.expected_wakes
            );
        }
        // Counters need a clone of the service: none after `Op::DropService`.
        let Some(timer) = self.timer.as_ref().filter(|_| !model.shut) else {
            return Ok(());
        };
        let stats = timer.stats();
        let fired = if (model.fired..=model.fired + model.fired_slack).contains(&stats.fired) {
            stats.fired
        } else {
            model.fired
        };
        let expected = (
            model.scheduled,
            fired,
            model.cancelled,
            model.pending(),
            model.skipped,
        );
        let actual = (
            stats.scheduled,
            stats.fired,
            stats.cancelled,
            stats.pending,
            stats.skipped,
        );
        check!(
            actual == expected,
            "Stats (scheduled, fired, cancelled, pending, skipped) = {:?}, model {:?}",
            actual,
            expected
        );
        check!(
            stats.in_rings == 0,
            "{} timers still in rings after advance",
            stats.in_rings
        );
        check!(stats.panicked == 0, "{} callbacks panicked", stats.panicked);
        Ok(())
    }

    /// A handle's state and deadline against the model.
    fn check_handle(&self, index: usize, timer: &ModelTimer) -> Checked {
        let state = timer.handle.state();
        let expected = match (timer.kind, timer.fate) {
            (_, Fate::Pending) => TimerState::Pending,
            (_, Fate::Ran | Fate::ReturnedRun) => TimerState::Fired,
            (_, Fate::Cancelled) => TimerState::Cancelled,
        };
        check!(
            state == expected,
            "timer {} ({:?}, {:?}) reads {:?}",
            index,
            timer.kind,
            timer.fate,
            state
        );
        if timer.fate == Fate::Pending || matches!(timer.kind, Kind::Once) {
            let deadline = timer.handle.deadline();
            let expected = self.model.effective(timer.requested);
            // A repeating timer's run beyond the far future never comes; its handle
            // may say so with an instant past the far future.
            let stalled = !matches!(timer.kind, Kind::Once) && timer.requested > self.model.far;
            check!(
                deadline == expected || (stalled && deadline >= expected),
                "timer {} ({:?}) deadline() is {}, asked for {}",
                index,
                timer.kind,
                self.model.since(deadline),
                self.model.since(timer.requested)
            );
        }
        Ok(())
    }

    /// `shutdown()` from the harness: what comes back is exactly what is pending.
    fn shutdown(&mut self, run: u64) -> Checked {
        // With a spawner, a due repeating timer's run may sit handed over and unrun
        // when shutdown starts: it then ends cancelled when run, not handed back.
        self.in_flight = self
            .model
            .timers
            .iter()
            .filter(|(_, t)| {
                matches!(self.setup.mode, Mode::Spawn)
                    && !matches!(t.kind, Kind::Once)
                    && t.fate == Fate::Pending
                    && self.model.timer_due(t)
            })
            .map(|(index, _)| *index)
            .collect();
        // From here on a callback's cancel or reset may find its target handed back.
        let was_shut = std::mem::replace(&mut self.model.shut, true);
        // ORDERING: SeqCst: callbacks read it.
        self.shared.acting.store(true, Ordering::SeqCst);
        let unfired = self.service().shutdown();
        if matches!(self.setup.mode, Mode::Spawn) {
            self.run_spawned(false)?;
        }
        self.shared.acting.store(false, Ordering::SeqCst);
        self.absorb()?;
        let listed: Vec<_> = unfired.iter().map(|u| (u.id(), u.deadline())).collect();
        lock(&self.shared.unfired).extend(unfired);
        if !was_shut {
            self.shutdowns.push(listed);
        } else {
            check!(
                listed.is_empty(),
                "a second shutdown handed back {} timers",
                listed.len()
            );
        }
        self.reconcile_shutdowns_strict(!was_shut, run)?;
        self.quiescent()?;
        let stats = self.service().stats();
        check!(
            stats.pending == 0,
            "Stats::pending is {} after shutdown",
            stats.pending
        );
        Ok(())
    }

    /// Reconciles the shutdowns callbacks made.
    fn reconcile_shutdowns(&mut self) -> Checked {
        if self.shutdowns.is_empty() {
            return Ok(());
        }
        self.reconcile_shutdowns_strict(false, 0x5555_5555_5555_5555)
    }

    /// Every timer still pending came back from the shutdown, with its deadline, and
    /// nothing else did; `strict` (a shutdown from the harness, with nothing running):
    /// repeating timers too. Then runs the `Unfired` whose bit is set in `run` and
    /// drops the rest.
    fn reconcile_shutdowns_strict(&mut self, strict: bool, run: u64) -> Checked {
        let returned: Vec<(TimerId, Instant)> = self.shutdowns.drain(..).flatten().collect();
        let mut by_id: HashMap<TimerId, Instant> = HashMap::new();
        for (id, deadline) in &returned {
            check!(
                by_id.insert(*id, *deadline).is_none(),
                "timer {:?} handed back twice",
                id
            );
        }
        let start = self.model.start;
        let far = self.model.far;
        let in_flight = std::mem::take(&mut self.in_flight);
        for (index, timer) in self.model.timers.iter_mut() {
            let id = timer.handle.id();
            match by_id.remove(&id) {
                Some(deadline) => {
                    check!(
                        timer.fate == Fate::Pending,
                        "timer {} handed back by shutdown but {:?}",
                        index,
                        timer.fate
                    );
                    let expected = timer.requested.min(far);
                    let stalled = !matches!(timer.kind, Kind::Once) && timer.requested > far;
                    check!(
                        deadline == expected || (stalled && deadline >= expected),
                        "Unfired of timer {} says due {}, asked {}",
                        index,
                        since(start, deadline),
                        since(start, timer.requested)
                    );
                    timer.fate = Fate::Cancelled; // until run below
                }
                None if timer.fate == Fate::Pending => match timer.kind {
                    Kind::Once => {
                        return Err(TestCaseError::fail(format!(
                            "one-shot timer {index} was pending (due {:?} after start) and is neither run nor handed back by shutdown",
                            since(start, timer.requested)
                        )))
                    }
                    _ => {
                        check!(
                            !strict || in_flight.contains(index),
                            "repeating timer {} not handed back by shutdown",
                            index
                        );
                        timer.fate = Fate::Cancelled;
                    }
                },
                None => {}
            }
        }
        check!(
            by_id.is_empty(),
            "shutdown handed back timers the model does not know: {:?}",
            by_id
        );
        // Run some, drop the rest.
        let unfired = std::mem::take(&mut *lock(&self.shared.unfired));
        let mut to_run = Vec::new();
        for (k, unfired) in unfired.into_iter().enumerate() {
            let id = unfired.id();
            let Some((&index, _)) = self.model.timers.iter().find(|(_, t)| t.handle.id() == id)
            else {
                continue;
            };
            if run >> (k % 64) & 1 == 1 {
                to_run.push((index, unfired));
            } else {
                drop(unfired);
            }
        }
        self.shared.acting.store(true, Ordering::SeqCst);
        for (index, unfired) in to_run {
            unfired.run();
            if let Some(timer) = self.model.timers.get_mut(&index) {
                timer.fate = Fate::ReturnedRun;
            }
        }
        self.shared.acting.store(false, Ordering::SeqCst);
        // Their runs: recorded, not checked against deadlines (an Unfired runs when
        // asked); cancels and resets they make find nothing pending.
        let events = std::mem::take(&mut *lock(&self.shared.log));
        for event in events {
            match event {
                Event::Cancelled { won, target, .. } => {
                    check!(
                        !won,
                        "a cancel of timer {} after shutdown returned true",
                        target
                    )
                }
                Event::Reset { moved, target, .. } => {
                    check!(
                        !moved,
                        "a reset of timer {} after shutdown returned true",
                        target
                    )
                }
                Event::Child { outcome, .. } => {
                    check!(
                        matches!(outcome, Err(ScheduleError::Shutdown)),
                        "a schedule after shutdown gave {:?}",
                        outcome.map(|h| h.id())
                    )
                }
                _ => {}
            }
        }
        // Pending futures completed, refused, and woke their task.
        for future in self
            .model
            .sleeps
            .iter_mut()
            .chain(self.model.timeouts.iter_mut())
        {
            if future.timer {
                future.timer = false;
                future.refused = true;
                if future.registered {
                    future.expected_wakes += 1;
                    future.registered = false;
                }
            } else if future.armed && !future.elapsed {
                future.refused = true;
            }
        }
        Ok(())
    }

    /// The harness's clone of the service; only for steps that need one (`step`
    /// skips them once `Op::DropService` dropped it).
    fn service(&self) -> &ShardedTimer {
        self.timer
            .as_ref()
            .expect("a step that needs the service runs only while the harness holds it")
    }

    /// `Op::DropService`: drops the harness's clone and the callbacks' one. With no
    /// future alive, that was the service's last user: it has shut down (checked by
    /// [`if_last_user_gone`](Self::if_last_user_gone)); otherwise it lives on for its
    /// futures, firing what comes due, until the last one is dropped.
    fn drop_service(&mut self) -> Checked {
        let Some(timer) = self.timer.take() else {
            return Ok(());
        };
        let callbacks_clone = lock(&self.shared.timer).take();
        drop(callbacks_clone);
        self.last_user_goes(move || drop(timer))
    }

    /// After a future's drop: if every clone was gone already, that future was the
    /// service's last user, and the service has shut down; checks it.
    fn if_last_user_gone(&mut self) -> Checked {
        if self.timer.is_some() || self.model.shut || self.futures_alive() {
            return Ok(());
        }
        self.last_user_goes(|| {})
    }

    /// Whether the harness still holds a sleep or a timeout.
    fn futures_alive(&self) -> bool {
        self.model
            .sleeps
            .iter()
            .chain(&self.model.timeouts)
            .any(|future| future.fut.is_some())
    }

    /// Runs `drop_last` (the drop of a user of the service) and, if no user is left
    /// (no clone, no future), checks that the service has shut down as `shutdown`
    /// does, on this thread and before the drop returned, with every pending timer's
    /// callback dropped unrun: its handles read `Cancelled`, with their deadlines.
    fn last_user_goes(&mut self, drop_last: impl FnOnce()) -> Checked {
        if self.model.shut || self.futures_alive() {
            drop_last();
            return Ok(());
        }
        // As in `shutdown`: a repeating timer's run handed to a spawner may end
        // cancelled when run.
        let spawn = matches!(self.setup.mode, Mode::Spawn);
        self.model.shut = true;
        // ORDERING: SeqCst: callbacks read it.
        self.shared.acting.store(true, Ordering::SeqCst);
        drop_last();
        if spawn {
            self.run_spawned(false)?;
        }
        self.shared.acting.store(false, Ordering::SeqCst);
        self.absorb()?;
        check!(
            lock(&self.shared.unfired).is_empty() && self.shutdowns.is_empty(),
            "the last user's drop handed timers back"
        );
        for timer in self.model.timers.values_mut() {
            if timer.fate == Fate::Pending {
                timer.fate = Fate::Cancelled;
            }
        }
        self.quiescent()
    }

    /// Ends the case: a last shutdown (checked), or, once every clone is gone, the
    /// drop of every future (the last one shuts the service down; checked), then
    /// frees everything.
    pub(crate) fn finish(mut self) -> Checked {
        let result = if self.model.shut {
            self.absorb()
        } else if self.timer.is_none() {
            self.absorb().and_then(|()| {
                for k in 0..self.model.sleeps.len() {
                    self.drop_future(false, k);
                }
                for k in 0..self.model.timeouts.len() {
                    self.drop_future(true, k);
                }
                self.if_last_user_gone()
            })
        } else {
            self.shutdown(0xAAAA_AAAA_AAAA_AAAA)
        };
        self.teardown();
        result
    }

    /// Drops what ties the callbacks and the service together.
    fn teardown(&mut self) {
        if let Some(timer) = &self.timer {
            drop(timer.shutdown());
        }
        for future in self
            .model
            .sleeps
            .iter_mut()
            .chain(self.model.timeouts.iter_mut())
        {
            future.fut = None;
        }
        drop(std::mem::take(&mut *lock(&self.shared.spawned)));
        drop(std::mem::take(&mut *lock(&self.shared.unfired)));
        lock(&self.shared.handles).clear();
        drop(lock(&self.shared.timer).take());
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.teardown();
    }
}
