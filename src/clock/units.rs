//! The two units a deadline takes inside the service, as newtypes so that the
//! compiler keeps them apart: [`Nanos`], signed nanoseconds from a clock's tick 0
//! (what an entry keeps, and a handle reads back without knowing the tick), and
//! [`Tick`], a tick number (what a shard files by and wakes at). `Instant` is the
//! third form, at the public API; `Clock` converts between the three.
//!
//! A deadline before tick 0 (an `Instant` older than the clock's start) is kept as it
//! is, a negative count, so that it reads back as the instant asked for; it is due at
//! tick 0, at once. A deadline too far ahead for the count (a delay such as
//! `Duration::MAX`) saturates at [`Nanos::FAR_FUTURE`], about 292 years after tick 0:
//! on the system clock that never comes, and a [`ManualClock`](crate::ManualClock)
//! saturates there too, so that `advance(Duration::MAX)` reaches every deadline asked
//! for. Past it lies only [`Nanos::NEVER`], which no clock reaches: the next run of a
//! repeating timer that would come after the far future (at the far future every
//! period would otherwise be due at once, and `advance` would never return).
//! [`Tick::NEVER`] is its tick, and the shard's "no work".

#![forbid(unsafe_code)]

/// The bits of tick 0: a count is held offset by 2⁶³, so that the order of the bits
/// (as `u64`) is the order of time, negative counts included.
const ZERO_BITS: u64 = 1 << 63;

/// A point in time as signed nanoseconds from a clock's tick 0, from 2⁶³ ns (292
/// years) before it to [`FAR_FUTURE`](Self::FAR_FUTURE) after it, then
/// [`NEVER`](Self::NEVER). Deadlines round *up* to a tick
/// ([`Ticks::due_tick`](super::Ticks::due_tick)). Ordered as time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(u64);

impl Nanos {
    /// Tick 0.
    pub const ZERO: Nanos = Nanos(ZERO_BITS);
    /// The latest point a count holds, `2⁶³ − 2` nanoseconds (about 292 years) after
    /// tick 0: where every later deadline asked for saturates (`Duration::MAX` among
    /// them), and where a manual clock's time saturates, so that it is due there.
    pub const FAR_FUTURE: Nanos = Nanos(u64::MAX - 1);
    /// After the far future: never due, since no clock goes past the far future. A
    /// repeating timer's next run that would come after it.
    pub const NEVER: Nanos = Nanos(u64::MAX);
    /// The earliest point a count holds: 2⁶³ nanoseconds before tick 0.
    pub const EARLIEST: Nanos = Nanos(0);

    /// `ns` nanoseconds after tick 0, saturating at [`FAR_FUTURE`](Self::FAR_FUTURE).
    pub const fn new(ns: u64) -> Nanos {
        if ns >= Self::FAR_FUTURE.0 - ZERO_BITS {
            Self::FAR_FUTURE
        } else {
            Nanos(ZERO_BITS + ns)
        }
    }

    /// `ns` nanoseconds before tick 0, saturating at [`EARLIEST`](Self::EARLIEST).
    pub const fn before(ns: u64) -> Nanos {
        if ns >= ZERO_BITS {
            Self::EARLIEST
        } else {
            Nanos(ZERO_BITS - ns)
        }
    }

    /// The nanoseconds from tick 0 to `self` if it is at or after tick 0, or from
    /// `self` to tick 0 if it is before: `Ok(after)` or `Err(before)`.
    ///
    /// # Errors
    ///
    /// `Err` is not a failure: it carries the distance of an instant before tick 0.
    pub const fn offset_from_zero(self) -> Result<u64, u64> {
        if self.0 >= ZERO_BITS {
            Ok(self.0 - ZERO_BITS)
        } else {
            Err(ZERO_BITS - self.0)
        }
    }

    /// The nanoseconds from tick 0 to `self`, 0 if `self` is before tick 0.
    pub const fn after_zero(self) -> u64 {
        self.0.saturating_sub(ZERO_BITS)
    }

    /// The bits, for an atomic word: ordered as time (see [`from_bits`](Self::from_bits)).
    pub const fn to_bits(self) -> u64 {
        self.0
    }

    /// The point whose [`to_bits`](Self::to_bits) is `bits`.
    pub const fn from_bits(bits: u64) -> Nanos {
        Nanos(bits)
    }

    /// The nanoseconds from `earlier` to `self`, 0 if `earlier` is later: a duration,
    /// not a point in time.
    pub fn since(self, earlier: Nanos) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// `by` nanoseconds later, saturating at [`FAR_FUTURE`](Self::FAR_FUTURE): how a
    /// clock moves.
    pub fn advanced(self, by: u64) -> Nanos {
        Nanos(self.0.saturating_add(by).min(Self::FAR_FUTURE.0))
    }
}

impl Default for Nanos {
    /// Tick 0.
    fn default() -> Nanos {
        Nanos::ZERO
    }
}

/// A tick number: [`Builder::tick`](crate::Builder::tick) periods since a clock's
/// tick 0. "Now" rounds *down* to its tick; [`Tick::NEVER`] is later than every tick a
/// clock reaches and never comes due.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tick(u64);

impl Tick {
    /// The tick that never comes due: [`Nanos::NEVER`]'s, later than
    /// [`Nanos::FAR_FUTURE`]'s at every tick length (and the shard's "no work").
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
