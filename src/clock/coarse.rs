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
//! **Never behind by more than the calibration's width plus the margin.** The other
//! way round, `t₃ − m = (t − ib) − L + L₃ ≤ w + L₃`, where `w` is the width of the
//! chosen pair (`t − ib ≤ w`: the coarse read came at most `w` after `ib`) and
//! `L₃ < J` (`4J` allows a coarse clock up to three ticks stale). So `m + w + 4J` is
//! at or after the true now: [`latest_now`], an upper bound
//! on now that costs one coarse read, which a `Timeout` takes when it is made, so
//! that one whose future is ready at its first poll never reads the precise clock.
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
    /// `instant_base` plus how far from it the true time of the coarse reading may be
    /// (the chosen pair's width, module docs, plus `margin`): what [`latest_now`]
    /// adds to the coarse clock's advance, summed once here (`Instant` arithmetic is
    /// exact, so the sum is the same in either order).
    latest_base: Instant,
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
        let (width, coarse_base, instant_base) = tightest?;
        let margin = resolution.checked_mul(MARGIN_TICKS)?;
        Some(Coarse {
            coarse_base,
            instant_base,
            margin,
            latest_base: instant_base.checked_add(width.checked_add(margin)?)?,
        })
    }

    /// How far the coarse clock has moved since the calibration, or `None` if it
    /// cannot be read or went back.
    fn since_base(&self) -> Option<Duration> {
        coarse_monotonic(false)?.checked_sub(self.coarse_base)
    }

    /// The coarse estimate of now (module docs: `m`), or `None` if it does not fit.
    fn estimate(&self) -> Option<Instant> {
        self.instant_base.checked_add(self.since_base()?)
    }

    /// An instant at or after now (module docs: `m + w + 4J`), from the coarse clock
    /// alone.
    fn latest_now(&self) -> Option<Instant> {
        self.latest_base.checked_add(self.since_base()?)
    }

    /// Whether `deadline` is at or before now: from the coarse clock when it is
    /// plainly so or plainly not, from `Instant::now()` otherwise.
    fn is_past(&self, deadline: Instant) -> bool {
        if let Some(estimate) = self.estimate() {
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

/// An instant at or after the system clock's now (`Instant::now()` read at any point
/// during the call is not after it), read from the coarse clock alone: at most the
/// calibration's width, plus the coarse clock's lag at calibration `L` (below a kernel
/// tick or two unless the machine is overloaded), plus four kernel ticks after the true
/// now (`m − t₃ ≤ L`: 16–25 ms on a 250 Hz kernel), and never before it, whatever happened during the calibration, as
/// long as the kernel's coarse clock is at most three ticks stale (module docs).
/// `None` where there is no coarse clock: read `Instant::now()` instead.
pub(crate) fn latest_now() -> Option<Instant> {
    Coarse::get()?.latest_now()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{is_past, latest_now, Coarse, CALIBRATION_READS, MARGIN_TICKS};
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

    /// The upper bound on now is never before now, from a calibration stalled in
    /// every pair as from a calm one, and never more than its width plus the margin
    /// (and this test's own reads) after it.
    #[test]
    fn the_latest_now_is_never_before_now_even_after_a_stalled_calibration() {
        let Some(resolution) = coarse_monotonic(true) else {
            assert!(latest_now().is_none(), "no coarse clock: no coarse bound");
            return;
        };
        let margin = resolution * MARGIN_TICKS;
        let stall = margin + Duration::from_millis(20);
        let stalled = Coarse::calibrate(|_| std::thread::sleep(stall)).expect("calibrates");
        let calm = Coarse::calibrate(|_| {}).expect("calibrates");
        assert!(
            stalled.latest_base.duration_since(stalled.instant_base) >= stall,
            "a stalled pair's width is counted"
        );
        for coarse in [&stalled, &calm] {
            for _ in 0..2_000 {
                let before = Instant::now();
                let latest = coarse.latest_now().expect("fits");
                let after = Instant::now();
                assert!(latest >= after, "{:?} before now", after - latest);
                // Lag below one resolution, plus this test's two reads.
                let behind = coarse.latest_base.duration_since(coarse.instant_base);
                let bound = behind + resolution + (after - before);
                assert!(latest - before <= bound, "{:?} ahead", latest - before);
            }
        }
        let before = Instant::now();
        assert!(latest_now().expect("a coarse clock") >= before);
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
