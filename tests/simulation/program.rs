//! What the simulation generates: a service's configuration ([`Setup`]) and a program of
//! operations on it ([`Op`]), with proptest strategies that shrink towards the simplest
//! variant of each (the first arm of every `prop_oneof!`).

use std::time::Duration;

use proptest::prelude::*;

/// Where callbacks run.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Mode {
    /// `Callbacks::pool(n)`.
    Pool(usize),
    /// `Callbacks::inline()`.
    Inline,
    /// `Callbacks::spawn(..)`: the harness runs the collected `Callback`s, in deadline
    /// order, right after each `advance` returns.
    Spawn,
}

/// One service's configuration.
#[derive(Clone, Debug)]
pub(crate) struct Setup {
    /// `Builder::shards`.
    pub shards: usize,
    /// `Builder::callbacks`.
    pub mode: Mode,
    /// `Builder::ring_capacity`.
    pub ring: usize,
    /// `Builder::max_pending`.
    pub max_pending: Option<usize>,
    /// `Builder::tick`, in nanoseconds.
    pub tick_ns: u64,
    /// Spawn: the harness runs what was handed over latest deadline first (any order
    /// is an executor's right), instead of earliest first.
    pub latest_first: bool,
}

impl Setup {
    /// Whether at most one thread ever runs this service's callbacks (then a
    /// callback's `cancel` that returned `true` is strictly ordered before any run
    /// that had not started on that same thread).
    pub(crate) fn one_callback_thread(&self) -> bool {
        match self.mode {
            Mode::Pool(threads) => threads == 1,
            Mode::Inline => self.shards == 1,
            Mode::Spawn => true,
        }
    }

    /// The tick.
    pub(crate) fn tick(&self) -> Duration {
        Duration::from_nanos(self.tick_ns)
    }
}

/// A delay, in the service's ticks (so that shrinking keeps its meaning across ticks).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Delay {
    /// `Duration::ZERO`.
    Zero,
    /// `permille / 1000` of a tick (1..=999): inside the next tick.
    SubTick(u32),
    /// `ticks` ticks plus `permille / 1000` of one.
    Ticks(u32, u32),
    /// Ten years: finite, beyond every level but the last.
    Huge,
    /// 2^40 s: an instant that exists but is beyond `u64::MAX` ns from the clock's
    /// start, so it never comes due.
    Beyond,
    /// `Duration::MAX`.
    Max,
}

impl Delay {
    /// As a `Duration` on a service whose tick is `tick_ns`.
    pub(crate) fn duration(self, tick_ns: u64) -> Duration {
        let tick = u128::from(tick_ns);
        let nanos = |n: u128| Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX));
        match self {
            Delay::Zero => Duration::ZERO,
            Delay::SubTick(permille) => nanos((tick * u128::from(permille) / 1000).max(1)),
            Delay::Ticks(ticks, permille) => {
                nanos(tick * u128::from(ticks) + tick * u128::from(permille) / 1000)
            }
            Delay::Huge => Duration::from_secs(10 * 365 * 24 * 3600),
            Delay::Beyond => Duration::from_secs(1 << 40),
            Delay::Max => Duration::MAX,
        }
    }
}

/// An instant for `schedule_at` and its kin, relative to the clock.
#[derive(Clone, Copy, Debug)]
pub(crate) enum At {
    /// The clock's now.
    Now,
    /// `delay` after now.
    Ahead(Delay),
    /// `permille / 1000` of a tick before now (clamped at the clock's start).
    Behind(u32),
    /// `secs` seconds before the clock's start (before the service's origin).
    BeforeOrigin(u32),
    /// `u64::MAX - 1 - back` ns after the clock's start: the last instants that a
    /// saturated `advance(Duration::MAX)` still reaches (and, at `back == 0`, exactly
    /// where it stops).
    Last(u8),
}

/// What a callback does when it runs (besides recording its run).
#[derive(Clone, Debug)]
pub(crate) enum Action {
    /// Nothing more.
    Record,
    /// Schedules a child timer `delay` from the callback's now; the child's callback
    /// schedules a grandchild `then` later, if given.
    Child { delay: Delay, then: Option<Delay> },
    /// Cancels another timer (picked by index at schedule time; the last index is the
    /// timer itself).
    Cancel { target: usize },
    /// Resets another timer to `delay` from now (same picking).
    Reset { target: usize, delay: Delay },
    /// Shuts the service down.
    Shutdown,
}

/// One step of a program.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    /// `schedule(delay, ..)`.
    Schedule { delay: Delay, action: Action },
    /// `schedule_at(at, ..)`.
    ScheduleAt { at: At, action: Action },
    /// `schedule_repeating` or, if `fixed_delay`, `schedule_with_fixed_delay`.
    Repeating {
        period: Delay,
        fixed_delay: bool,
        action: Action,
    },
    /// `cancel()` on a timer (index modulo the timers made so far).
    Cancel { target: usize },
    /// `reset(delay)` on a timer.
    Reset { target: usize, delay: Delay },
    /// `reset_at(at)` on a timer.
    ResetAt { target: usize, at: At },
    /// `sleep(delay)`, or `sleep_until(at)`.
    Sleep { delay: Delay, until: Option<At> },
    /// Polls a sleep with a counting waker.
    PollSleep { target: usize },
    /// Drops a sleep.
    DropSleep { target: usize },
    /// `Sleep::reset(at)`.
    ResetSleep { target: usize, at: At },
    /// `timeout(delay, f)`, `f` never ready (or ready at once, if `ready`).
    Timeout { delay: Delay, ready: bool },
    /// Polls a timeout with a counting waker.
    PollTimeout { target: usize },
    /// Drops a timeout.
    DropTimeout { target: usize },
    /// `count` timers (more than a shard's turn budget of 1,024) due in `base` ticks
    /// plus `i % (spread + 1)` ticks, and one more `extra` ticks after the last of
    /// them: a burst that cascades from a higher level of the wheel.
    Burst {
        count: u16,
        base: u16,
        spread: u8,
        extra: u8,
    },
    /// `count` timers (more than a turn's budget) due exactly at the next boundary of
    /// a slot of wheel level `level` (64^level ns from the clock's start: a manual
    /// clock's service files by the nanosecond), and one `extra` ns after it: the
    /// burst is due at the higher slot's very start, so it drains as a backlog out of
    /// a slot that also cascades the straggler, which must still fire within the
    /// advance that passes it.
    AlignedBurst { count: u16, level: u8, extra: u8 },
    /// `ManualClock::advance`.
    Advance(Advance),
    /// `shutdown()`: the `Unfired` whose bit is set in `run` are run, the rest dropped.
    Shutdown { run: u64 },
    /// Drops every clone of the service (the harness's and the one callbacks use),
    /// keeping the handles and futures: the service lives on while a future does,
    /// and shuts down, dropping what is pending unrun, when the last one is dropped.
    /// The steps after it that need a clone (schedule, sleep, timeout, shutdown) are
    /// skipped.
    DropService,
}

impl Op {
    /// Whether the step calls the service itself (not a handle or a future).
    pub(crate) fn needs_service(&self) -> bool {
        matches!(
            self,
            Op::Schedule { .. }
                | Op::ScheduleAt { .. }
                | Op::Repeating { .. }
                | Op::Sleep { .. }
                | Op::Timeout { .. }
                | Op::Burst { .. }
                | Op::AlignedBurst { .. }
                | Op::Shutdown { .. }
        )
    }
}

/// How far `advance` moves the clock.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Advance {
    /// `Duration::ZERO`.
    Zero,
    /// `permille / 1000` of a tick.
    SubTick(u32),
    /// One tick.
    OneTick,
    /// `n` ticks plus `permille / 1000` of one.
    Ticks(u32, u32),
    /// Ten years.
    Huge,
    /// `Duration::MAX`.
    Max,
}

impl Advance {
    /// As a `Duration` on a service whose tick is `tick_ns`.
    pub(crate) fn duration(self, tick_ns: u64) -> Duration {
        match self {
            Advance::Zero => Duration::ZERO,
            Advance::SubTick(permille) => Delay::SubTick(permille).duration(tick_ns),
            Advance::OneTick => Duration::from_nanos(tick_ns),
            Advance::Ticks(n, permille) => Delay::Ticks(n, permille).duration(tick_ns),
            Advance::Huge => Delay::Huge.duration(tick_ns),
            Advance::Max => Duration::MAX,
        }
    }
}

/// A configuration.
pub(crate) fn setup() -> impl Strategy<Value = Setup> {
    let mode = prop_oneof![
        Just(Mode::Inline),
        (1usize..=2).prop_map(Mode::Pool),
        Just(Mode::Spawn),
    ];
    let tick_ns = prop_oneof![
        4 => Just(1_000_000u64),
        1 => Just(1_000u64),
        1 => Just(250_000u64),
        1 => Just(7_000_000u64),
        1 => Just(1_000_000_000u64),
    ];
    let max_pending = prop_oneof![
        3 => Just(None),
        1 => (1usize..=40).prop_map(Some),
        1 => (1_000usize..=1_500).prop_map(Some),
    ];
    (
        1usize..=4,
        mode,
        1u32..=12,
        max_pending,
        tick_ns,
        any::<bool>(),
    )
        .prop_map(
            |(shards, mode, ring_log2, max_pending, tick_ns, latest_first)| Setup {
                shards,
                mode,
                ring: 1 << ring_log2,
                max_pending,
                tick_ns,
                latest_first,
            },
        )
}

/// A delay.
pub(crate) fn delay() -> impl Strategy<Value = Delay> {
    prop_oneof![
        2 => Just(Delay::Zero),
        8 => (0u32..8, 0u32..1000).prop_map(|(n, p)| Delay::Ticks(n, p)),
        3 => (1u32..1000).prop_map(Delay::SubTick),
        3 => (8u32..5_000, 0u32..1000).prop_map(|(n, p)| Delay::Ticks(n, p)),
        1 => (5_000u32..20_000_000, 0u32..1000).prop_map(|(n, p)| Delay::Ticks(n, p)),
        1 => Just(Delay::Huge),
        1 => Just(Delay::Beyond),
        1 => Just(Delay::Max),
    ]
}

/// An instant.
pub(crate) fn at() -> impl Strategy<Value = At> {
    prop_oneof![
        2 => Just(At::Now),
        6 => delay().prop_map(At::Ahead),
        2 => (1u32..3000).prop_map(At::Behind),
        1 => (1u32..7200).prop_map(At::BeforeOrigin),
        1 => (0u8..3).prop_map(At::Last),
    ]
}

/// A callback's action.
pub(crate) fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        5 => Just(Action::Record),
        2 => (delay(), proptest::option::of(delay()))
            .prop_map(|(delay, then)| Action::Child { delay, then }),
        3 => any::<usize>().prop_map(|target| Action::Cancel { target }),
        2 => (any::<usize>(), delay()).prop_map(|(target, delay)| Action::Reset { target, delay }),
        1 => Just(Action::Shutdown),
    ]
}

/// An advance.
pub(crate) fn advance() -> impl Strategy<Value = Advance> {
    prop_oneof![
        2 => Just(Advance::Zero),
        3 => Just(Advance::OneTick),
        6 => (0u32..8, 0u32..1000).prop_map(|(n, p)| Advance::Ticks(n, p)),
        2 => (1u32..1000).prop_map(Advance::SubTick),
        2 => (8u32..5_000, 0u32..1000).prop_map(|(n, p)| Advance::Ticks(n, p)),
        1 => Just(Advance::Huge),
        1 => Just(Advance::Max),
    ]
}

/// One operation.
pub(crate) fn op() -> impl Strategy<Value = Op> {
    let target = any::<usize>;
    prop_oneof![
        10 => advance().prop_map(Op::Advance),
        8 => (delay(), action()).prop_map(|(delay, action)| Op::Schedule { delay, action }),
        4 => (at(), action()).prop_map(|(at, action)| Op::ScheduleAt { at, action }),
        4 => (delay(), any::<bool>(), action()).prop_map(|(period, fixed_delay, action)| {
            Op::Repeating { period, fixed_delay, action }
        }),
        4 => target().prop_map(|target| Op::Cancel { target }),
        2 => (target(), delay()).prop_map(|(target, delay)| Op::Reset { target, delay }),
        1 => (target(), at()).prop_map(|(target, at)| Op::ResetAt { target, at }),
        2 => (delay(), proptest::option::of(at())).prop_map(|(delay, until)| Op::Sleep { delay, until }),
        2 => target().prop_map(|target| Op::PollSleep { target }),
        1 => target().prop_map(|target| Op::DropSleep { target }),
        1 => (target(), at()).prop_map(|(target, at)| Op::ResetSleep { target, at }),
        1 => (delay(), any::<bool>()).prop_map(|(delay, ready)| Op::Timeout { delay, ready }),
        1 => target().prop_map(|target| Op::PollTimeout { target }),
        1 => target().prop_map(|target| Op::DropTimeout { target }),
        1 => (1_025u16..1_400, 64u16..4_200, 0u8..4, 1u8..8).prop_map(
            |(count, base, spread, extra)| Op::Burst { count, base, spread, extra }
        ),
        1 => (1_025u16..1_800, 1u8..4, 1u8..64).prop_map(
            |(count, level, extra)| Op::AlignedBurst { count, level, extra }
        ),
        1 => any::<u64>().prop_map(|run| Op::Shutdown { run }),
        1 => Just(Op::DropService),
    ]
}

/// A configuration and a program; the program ends with a shutdown whose result is
/// checked too.
pub(crate) fn case() -> impl Strategy<Value = (Setup, Vec<Op>)> {
    (setup(), proptest::collection::vec(op(), 1..48))
}
