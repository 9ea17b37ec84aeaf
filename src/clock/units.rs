//! The two units a deadline takes inside the service, as newtypes so that the
//! compiler keeps them apart: [`Nanos`], nanoseconds since a clock's tick 0 (what an
//! entry keeps, and a handle reads back without knowing the tick), and [`Tick`], a
//! tick number (what a shard files by and wakes at). `Instant` is the third form, at
//! the public API; `Clock` converts between the three. Each unit has one `NEVER`,
//! the deadline that never comes due (`Duration::MAX`, or a delay past what 64 bits
//! of nanoseconds hold), and nothing else means "never".

#![forbid(unsafe_code)]

/// A point in time as nanoseconds since a clock's tick 0. Deadlines round *up* to a
/// tick ([`Ticks::due_tick`](super::Ticks::due_tick)); [`Nanos::NEVER`] is later
/// than every other value and never comes due.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(u64);

impl Nanos {
    /// The deadline that never comes due: `u64::MAX` nanoseconds (584 years) on.
    pub const NEVER: Nanos = Nanos(u64::MAX);
    /// The latest "now" a clock reaches: a manual clock saturates here, where every
    /// deadline but [`NEVER`](Self::NEVER) is due. One below it, so that time
    /// saturates forward and "never" stays never.
    pub const LAST: Nanos = Nanos(u64::MAX - 1);

    /// `ns` nanoseconds after tick 0.
    pub const fn new(ns: u64) -> Nanos {
        Nanos(ns)
    }

    /// The count of nanoseconds.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The nanoseconds from `earlier` to `self`, 0 if `earlier` is later: a duration,
    /// not a point in time.
    pub fn since(self, earlier: Nanos) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// `by` nanoseconds later, saturating at [`LAST`](Self::LAST): how a clock moves.
    pub fn advanced(self, by: u64) -> Nanos {
        Nanos(self.0.saturating_add(by).min(Self::LAST.0))
    }
}

/// A tick number: [`Builder::tick`](crate::Builder::tick) periods since a clock's
/// tick 0. "Now" rounds *down* to its tick; [`Tick::NEVER`] is later than every other
/// tick and never comes due.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tick(u64);

impl Tick {
    /// The tick that never comes due (a [`Nanos::NEVER`] deadline's).
    pub const NEVER: Tick = Tick(u64::MAX);

    /// Tick number `tick`.
    pub const fn new(tick: u64) -> Tick {
        Tick(tick)
    }

    /// The tick number (the pure wheel's unit: `wheel::TimingWheel` is in `u64` ticks).
    pub const fn get(self) -> u64 {
        self.0
    }
}
