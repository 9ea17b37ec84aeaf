//! "Is this deadline past?" without reading the precise clock when the answer is
//! plain: a deadline a second away needs no 28 ns `Instant::now()` to tell (issue 21:
//! the second clock read of a `Timeout` armed at its first poll was 12 % of its
//! cost).
//!
//! The coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`) has `Instant`'s time base
//! and lags it by less than its resolution `J` (the kernel tick: 4 ms here). One
//! calibration pairs a coarse reading `cb` with an `Instant` `ib` read just after it;
//! a later coarse reading `c` then maps to `m = ib + (c − cb)`. Since both `ib − cb`
//! and `now − c` lie in `[0, J)` (plus the nanoseconds between two reads), `m` lies
//! within `J` of the true now, either side. [`Coarse::is_past`] answers from `m` only
//! outside a margin of [`MARGIN_TICKS`] × `J` on either side (twice what the bound
//! needs, for a kernel that updates its coarse time a tick late) and reads `Instant`
//! inside it. A wrong "not past" (a coarse clock far more stale than that) would only
//! file a timer that fires at the next tick instead of completing at once: never
//! early either way.

#![forbid(unsafe_code)]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::sync::coarse_monotonic;

/// The margin around the coarse estimate, in coarse resolutions.
const MARGIN_TICKS: u32 = 4;

/// The calibration: a coarse reading, the `Instant` just after it, and the margin.
#[derive(Debug)]
struct Coarse {
    /// The coarse clock at calibration, since boot.
    coarse_base: Duration,
    /// `Instant::now()` read right after `coarse_base`.
    instant_base: Instant,
    /// `MARGIN_TICKS` × the coarse resolution.
    margin: Duration,
}

impl Coarse {
    /// The process's calibration, or `None` where there is no coarse clock.
    fn get() -> Option<&'static Coarse> {
        static COARSE: OnceLock<Option<Coarse>> = OnceLock::new();
        COARSE
            .get_or_init(|| {
                let resolution = coarse_monotonic(true)?;
                let coarse_base = coarse_monotonic(false)?;
                let instant_base = Instant::now();
                Some(Coarse {
                    coarse_base,
                    instant_base,
                    margin: resolution.checked_mul(MARGIN_TICKS)?,
                })
            })
            .as_ref()
    }

    /// Whether `deadline` is at or before now: from the coarse clock when it is
    /// plainly so or plainly not, from `Instant::now()` otherwise.
    fn is_past(&self, deadline: Instant) -> bool {
        let estimate = coarse_monotonic(false)
            .and_then(|coarse| coarse.checked_sub(self.coarse_base))
            .and_then(|since| self.instant_base.checked_add(since));
        if let Some(estimate) = estimate {
            if deadline
                .checked_add(self.margin)
                .is_some_and(|d| d <= estimate)
            {
                return true;
            }
            if estimate
                .checked_add(self.margin)
                .is_some_and(|e| deadline > e)
            {
                return false;
            }
        }
        deadline <= Instant::now()
    }
}

/// Whether `deadline` is at or before the system clock's now (`Instant::now()`),
/// reading the precise clock only when the deadline is within a few kernel ticks of
/// now. Exact for deadlines that close; for others, the same answer as
/// `deadline <= Instant::now()` unless the kernel's coarse clock is several ticks
/// stale (module docs).
pub(crate) fn is_past(deadline: Instant) -> bool {
    match Coarse::get() {
        Some(coarse) => coarse.is_past(deadline),
        None => deadline <= Instant::now(),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::is_past;
    use std::time::{Duration, Instant};

    #[test]
    fn far_deadlines_are_told_by_the_coarse_clock_and_near_ones_exactly() {
        for _ in 0..1_000 {
            let now = Instant::now();
            assert!(is_past(now), "a deadline read before the call has passed");
            assert!(is_past(now - Duration::from_secs(1)));
            assert!(!is_past(now + Duration::from_secs(1)));
            assert!(
                !is_past(now + Duration::from_micros(200))
                    || now.elapsed() >= Duration::from_micros(200)
            );
        }
    }
}
