//! "Is this deadline past?" without reading the precise clock when the answer is
//! plain: a deadline a second away needs no 28 ns `Instant::now()` to tell (issue 21:
//! the second clock read of a `Timeout` armed at its first poll was 12 % of its
//! cost).
//!
//! The coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`) has `Instant`'s time base
//! and lags it by less than its resolution `J` (the kernel tick: 4 ms here): a coarse
//! reading is never ahead of the precise clock. A calibration maps coarse readings to
//! `Instant`s: an `Instant` `ib` read just *before* a coarse reading `cb`; a later
//! coarse reading `c` then maps to `m = ib + (c − cb)`.
//!
//! **Never ahead by more than the lag at calibration, whatever happens during it.**
//! With `cb` read at true time `t` (so `ib ≤ t`) lagging it by `L` (`cb = t − L`), and
//! `c` read at `t₃ ≤ now` lagging by `L₃ ≥ 0`: `m − t₃ = (ib − t) + L − L₃ ≤ L < J`.
//! A thread preempted between the reads (a VM's steal time is milliseconds) only makes
//! `ib − t` more negative: the estimate runs *behind*, never ahead. (Read the other
//! way round, an `Instant` after the coarse reading, one such preemption made every
//! later estimate run ahead by the stall, for the life of the process.) The
//! calibration takes [`CALIBRATION_READS`] such pairs, each bracketed by a second
//! `Instant`, and keeps the tightest, so that a preempted pair does not leave the
//! estimate needlessly far behind.
//!
//! [`Coarse::is_past`] answers from `m` only outside a margin of [`MARGIN_TICKS`] × `J`
//! on either side (four times what the bound needs, for a kernel that updates its
//! coarse time a tick or more late) and reads `Instant` inside it. So "past" is said
//! only of a deadline at least `4J − L > 0` before now: never early. A wrong "not
//! past" (an estimate behind: a stalled calibration, or a coarse clock far more stale
//! than that) only files a timer that fires at the next tick instead of completing at
//! once: late, never early.

#![forbid(unsafe_code)]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::sync::coarse_monotonic;

/// The margin around the coarse estimate, in coarse resolutions.
const MARGIN_TICKS: u32 = 4;

/// Paired reads the calibration takes, keeping the tightest.
const CALIBRATION_READS: usize = 5;

/// The calibration: a coarse reading, the `Instant` just before it, and the margin.
#[derive(Debug)]
struct Coarse {
    /// The coarse clock at calibration, since boot.
    coarse_base: Duration,
    /// `Instant::now()` read right before `coarse_base` (module docs: never after).
    instant_base: Instant,
    /// `MARGIN_TICKS` × the coarse resolution.
    margin: Duration,
}

impl Coarse {
    /// The process's calibration, or `None` where there is no coarse clock.
    fn get() -> Option<&'static Coarse> {
        static COARSE: OnceLock<Option<Coarse>> = OnceLock::new();
        COARSE.get_or_init(|| Coarse::calibrate(|_| {})).as_ref()
    }

    /// Calibrates from [`CALIBRATION_READS`] pairs of an `Instant` and the coarse
    /// reading after it, keeping the pair whose bracketing `Instant`s are closest;
    /// `None` where there is no coarse clock. `stall(k)` runs in pair `k` between the
    /// coarse reading and the `Instant` after it: the tests' injected preemption.
    fn calibrate(mut stall: impl FnMut(usize)) -> Option<Coarse> {
        let resolution = coarse_monotonic(true)?;
        let mut tightest: Option<(Duration, Duration, Instant)> = None;
        for k in 0..CALIBRATION_READS {
            let before = Instant::now();
            let coarse = coarse_monotonic(false)?;
            stall(k);
            let width = before.elapsed();
            if tightest.is_none_or(|(narrowest, ..)| width < narrowest) {
                tightest = Some((width, coarse, before));
            }
        }
        let (_, coarse_base, instant_base) = tightest?;
        Some(Coarse {
            coarse_base,
            instant_base,
            margin: resolution.checked_mul(MARGIN_TICKS)?,
        })
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
/// now. Never `true` for a deadline still ahead, whatever happened during the
/// calibration; `false` for one past only if the calibration was stalled or the
/// kernel's coarse clock is several ticks stale (module docs).
pub(crate) fn is_past(deadline: Instant) -> bool {
    match Coarse::get() {
        Some(coarse) => coarse.is_past(deadline),
        None => deadline <= Instant::now(),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{is_past, Coarse, CALIBRATION_READS, MARGIN_TICKS};
    use crate::sync::coarse_monotonic;
    use std::time::{Duration, Instant};

    /// A calibration whose thread is stalled between its reads in every pair (a
    /// preemption of the margin plus 20 ms) never judges a deadline still ahead past:
    /// "past" comes only from an estimate that cannot run ahead. (With the `Instant`
    /// read after the coarse reading, such a stall put every estimate 20 ms and more
    /// ahead, and deadlines up to about 15 ms ahead were judged past.) Then, with no
    /// stall, the coarse answers are still the exact ones.
    #[test]
    fn a_calibration_stalled_between_its_reads_never_judges_a_deadline_ahead_past() {
        let Some(resolution) = coarse_monotonic(true) else {
            return; // no coarse clock here: nothing is calibrated
        };
        let margin = resolution * MARGIN_TICKS;
        let stall = margin + Duration::from_millis(20);
        let mut stalls = 0;
        let coarse = Coarse::calibrate(|_| {
            stalls += 1;
            // The injected fault: this thread is descheduled for `stall`.
            std::thread::sleep(stall);
        })
        .expect("a coarse clock calibrates");
        assert_eq!(stalls, CALIBRATION_READS, "every pair stalled");
        let aheads = [
            Duration::from_nanos(1),
            Duration::from_micros(100),
            Duration::from_millis(1),
            resolution,
            margin,
            stall / 2,
            stall,
        ];
        for _ in 0..2_000 {
            let now = Instant::now();
            for ahead in aheads {
                let deadline = now + ahead;
                assert!(
                    !coarse.is_past(deadline) || Instant::now() >= deadline,
                    "a deadline {ahead:?} ahead judged past"
                );
            }
            assert!(coarse.is_past(now), "read before the call: past");
            assert!(!coarse.is_past(now + Duration::from_secs(1)));
        }
        let calm = Coarse::calibrate(|_| {}).expect("a coarse clock calibrates");
        for _ in 0..1_000 {
            let now = Instant::now();
            assert!(calm.is_past(now - Duration::from_secs(1)));
            assert!(calm.is_past(now));
            for ahead in aheads {
                assert!(!calm.is_past(now + ahead) || Instant::now() >= now + ahead);
            }
        }
    }

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
