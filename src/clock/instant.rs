//! [`Instant`], the `time` namespace's instant (tokio's `time::Instant`): a newtype of
//! `std::time::Instant` with tokio's methods and operators. It lives here, at the bottom of the import graph, so the
//! futures (`future.rs`, `interval.rs`) can take and return it without importing the
//! namespace that re-exports them; [`Instant::now`] and [`Instant::elapsed`], which read
//! the current service's clock, are defined in `time.rs`.

#![forbid(unsafe_code)]

use std::fmt;
use std::ops::{Add, AddAssign, Sub, SubAssign};
use std::time::Duration;

/// A measurement of the current service's clock (tokio's `time::Instant`): opaque,
/// monotonic, and, on a paused thread, paused time.
///
/// A newtype of `std::time::Instant`, with tokio's conversions
/// ([`from_std`](Self::from_std), [`into_std`](Self::into_std), `From` both ways) and
/// operators (`+`/`-` a `Duration`, `-` another `Instant`, saturating). Beyond tokio's,
/// it compares with (`==`, `<`) and subtracts a `std::time::Instant` in either order,
/// so that code mixing it with the service API's instants ([`ManualClock::now`],
/// [`TimerHandle::deadline`]) compiles without conversions; the one cost is that a
/// comparison whose right side is an untyped `.into()` needs its type written
/// (`a == Instant::from(b)`), where tokio's infers it.
///
/// [`ManualClock::now`]: crate::ManualClock::now
/// [`TimerHandle::deadline`]: crate::TimerHandle::deadline
///
/// Every instant that goes in or out of the [`time`](crate::time) namespace's
/// functions and futures is one ([`Sleep::deadline`](crate::time::Sleep::deadline),
/// [`Interval::tick`](crate::time::Interval::tick), ...).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(std::time::Instant);

impl Instant {
    /// Wraps a `std::time::Instant`.
    pub fn from_std(std: std::time::Instant) -> Instant {
        Instant(std)
    }

    /// The `std::time::Instant` inside.
    pub fn into_std(self) -> std::time::Instant {
        self.0
    }

    /// The time from `earlier` to this instant; zero if `earlier` is later (as
    /// tokio's).
    pub fn duration_since(&self, earlier: Instant) -> Duration {
        self.0.saturating_duration_since(earlier.0)
    }

    /// The time from `earlier` to this instant, or `None` if `earlier` is later.
    pub fn checked_duration_since(&self, earlier: Instant) -> Option<Duration> {
        self.0.checked_duration_since(earlier.0)
    }

    /// The time from `earlier` to this instant; zero if `earlier` is later.
    pub fn saturating_duration_since(&self, earlier: Instant) -> Duration {
        self.0.saturating_duration_since(earlier.0)
    }

    /// `self + duration`, or `None` if it does not fit.
    pub fn checked_add(&self, duration: Duration) -> Option<Instant> {
        self.0.checked_add(duration).map(Instant)
    }

    /// `self - duration`, or `None` if it does not fit.
    pub fn checked_sub(&self, duration: Duration) -> Option<Instant> {
        self.0.checked_sub(duration).map(Instant)
    }
}

impl From<std::time::Instant> for Instant {
    fn from(std: std::time::Instant) -> Instant {
        Instant(std)
    }
}

impl From<Instant> for std::time::Instant {
    fn from(instant: Instant) -> std::time::Instant {
        instant.0
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;

    /// # Panics
    ///
    /// If the result does not fit (as `std::time::Instant`'s).
    fn add(self, other: Duration) -> Instant {
        Instant(self.0 + other)
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, other: Duration) {
        *self = *self + other;
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;

    /// # Panics
    ///
    /// If the result does not fit (as `std::time::Instant`'s).
    fn sub(self, other: Duration) -> Instant {
        Instant(self.0 - other)
    }
}

impl SubAssign<Duration> for Instant {
    fn sub_assign(&mut self, other: Duration) {
        *self = *self - other;
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;

    /// Saturating, as tokio's: zero if `other` is later.
    fn sub(self, other: Instant) -> Duration {
        self.0.saturating_duration_since(other.0)
    }
}

impl Sub<std::time::Instant> for Instant {
    type Output = Duration;

    /// Saturating: zero if `other` is later.
    fn sub(self, other: std::time::Instant) -> Duration {
        self.0.saturating_duration_since(other)
    }
}

impl Sub<Instant> for std::time::Instant {
    type Output = Duration;

    /// Saturating: zero if `other` is later.
    fn sub(self, other: Instant) -> Duration {
        self.saturating_duration_since(other.0)
    }
}

impl PartialEq<std::time::Instant> for Instant {
    fn eq(&self, other: &std::time::Instant) -> bool {
        self.0 == *other
    }
}

impl PartialEq<Instant> for std::time::Instant {
    fn eq(&self, other: &Instant) -> bool {
        *self == other.0
    }
}

impl PartialOrd<Instant> for std::time::Instant {
    fn partial_cmp(&self, other: &Instant) -> Option<std::cmp::Ordering> {
        self.partial_cmp(&other.0)
    }
}

impl PartialOrd<std::time::Instant> for Instant {
    fn partial_cmp(&self, other: &std::time::Instant) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(other)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
