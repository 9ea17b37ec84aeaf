//! Per-timer bookkeeping that checks the invariants as callbacks run: never early,
//! exactly once, never after a successful cancel.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use crate::report::NOT_FIRED;

/// Marks a slot whose timer was cancelled (`cancel` returned `true`).
pub(crate) const CANCELLED: u32 = u32::MAX - 1;

/// One slot per timer: its lateness in µs once fired, or a marker. There is no shared
/// "fired" counter: workloads wait on the service's `stats().fired` and then on
/// `shutdown()`, which returns after every handed-over callback has finished, so a
/// contended counter does not slow the callbacks being measured.
///
/// Shared by every callback of a workload as a `&'static`: the driver is a one-shot
/// process, and leaking one tracker per workload keeps a contended reference count
/// (an `Arc` clone per callback) out of the measurement.
#[derive(Debug)]
pub(crate) struct Tracker {
    /// Lateness in µs, [`NOT_FIRED`] or [`CANCELLED`].
    pub(crate) slots: Vec<AtomicU32>,
    /// Callbacks that started before their deadline.
    pub(crate) early: AtomicU64,
    /// Callbacks that ran twice, or after a cancel that returned `true`.
    pub(crate) duplicated: AtomicU64,
    /// A common reference instant (workloads that compute deadlines from it).
    pub(crate) base: Instant,
    /// A common span (the `delayed` horizon, the `keepalive` idle timeout), so
    /// callbacks need not capture it.
    pub(crate) span: std::time::Duration,
    /// `keepalive` only: ns after `base` of each connection's last successful re-arm
    /// (stored after it succeeded, so never later than the real one).
    pub(crate) rearmed_ns: Vec<AtomicU64>,
}

impl Tracker {
    /// A tracker for `timers` timers, leaked for the rest of the run.
    pub(crate) fn leak(
        timers: usize,
        base: Instant,
        span: std::time::Duration,
    ) -> &'static Tracker {
        Self::build(timers, base, span, 0)
    }

    /// A tracker that also keeps each timer's last re-arm time (`keepalive`).
    pub(crate) fn leak_with_rearms(
        timers: usize,
        base: Instant,
        span: std::time::Duration,
    ) -> &'static Tracker {
        Self::build(timers, base, span, timers)
    }

    /// A leaked tracker with `rearms` re-arm slots.
    fn build(
        timers: usize,
        base: Instant,
        span: std::time::Duration,
        rearms: usize,
    ) -> &'static Tracker {
        Box::leak(Box::new(Tracker {
            slots: (0..timers).map(|_| AtomicU32::new(NOT_FIRED)).collect(),
            early: AtomicU64::new(0),
            duplicated: AtomicU64::new(0),
            base,
            span,
            rearmed_ns: (0..rearms).map(|_| AtomicU64::new(0)).collect(),
        }))
    }

    /// Records that timer `index` was re-armed successfully; `before` was taken just
    /// before the re-arm, so its deadline is at least `before + span`.
    pub(crate) fn rearmed(&self, index: usize, before: Instant) {
        let ns = before.saturating_duration_since(self.base).as_nanos() as u64;
        // ORDERING: Release pairs with the Acquire load in `record_rearmed`.
        self.rearmed_ns[index].store(ns, Ordering::Release);
    }

    /// Called by timer `index`'s callback: due `span` after its last recorded re-arm.
    pub(crate) fn record_rearmed(&self, index: usize) {
        // ORDERING: Acquire pairs with the Release store in `rearmed`. A re-arm stored
        // after this load only makes the deadline used here earlier, never later.
        let ns = self.rearmed_ns[index].load(Ordering::Acquire);
        let deadline = self.base + std::time::Duration::from_nanos(ns) + self.span;
        self.record(index, deadline);
    }

    /// Called by timer `index`'s callback, due at `deadline`.
    pub(crate) fn record(&self, index: usize, deadline: Instant) {
        let (late, early) = crate::report::lateness(deadline, Instant::now());
        if early {
            // ORDERING: Relaxed: counters read after the workload is quiet.
            self.early.fetch_add(1, Ordering::Relaxed);
        }
        // ORDERING: AcqRel: the swap both reads a producer's CANCELLED mark (written
        // Release after `cancel` returned true) and publishes this run.
        let previous = self.slots[index].swap(late, Ordering::AcqRel);
        if previous != NOT_FIRED {
            // ORDERING: Relaxed, as above.
            self.duplicated.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Called by a producer after `cancel` returned `true` for timer `index`.
    pub(crate) fn mark_cancelled(&self, index: usize) {
        // ORDERING: AcqRel: pairs with the callback's swap in `record`.
        let previous = self.slots[index].swap(CANCELLED, Ordering::AcqRel);
        if previous != NOT_FIRED {
            // The callback ran although cancel returned true.
            // ORDERING: Relaxed, as above.
            self.duplicated.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Early and duplicated counts.
    pub(crate) fn violations(&self) -> (u64, u64) {
        // ORDERING: Relaxed: read after the workload is quiet.
        (
            self.early.load(Ordering::Relaxed),
            self.duplicated.load(Ordering::Relaxed),
        )
    }

    /// Lateness histogram and fired count, from slots that hold a lateness.
    pub(crate) fn lateness(&self) -> (hdrhistogram::Histogram<u64>, u64) {
        self.lateness_of(|_| true)
    }

    /// [`lateness`](Self::lateness) of the timers whose index `which` picks.
    pub(crate) fn lateness_of(
        &self,
        which: impl Fn(usize) -> bool,
    ) -> (hdrhistogram::Histogram<u64>, u64) {
        let mut histogram = crate::report::histogram();
        let mut fired = 0;
        for (_, slot) in self
            .slots
            .iter()
            .enumerate()
            .filter(|(index, _)| which(*index))
        {
            // ORDERING: Relaxed: read after the workload is quiet.
            let value = slot.load(Ordering::Relaxed);
            if value != NOT_FIRED && value != CANCELLED {
                histogram.saturating_record(u64::from(value).max(1));
                fired += 1;
            }
        }
        (histogram, fired)
    }

    /// Callbacks that have recorded themselves so far.
    pub(crate) fn fired(&self) -> u64 {
        self.slots
            .iter()
            // ORDERING: Relaxed: a progress count; `lateness` reads again after.
            .map(|slot| slot.load(Ordering::Relaxed))
            .filter(|&value| value != NOT_FIRED && value != CANCELLED)
            .count() as u64
    }

    /// Waits (up to 30 s) until at least `expected` callbacks have recorded
    /// themselves. With the pool or inline, `shutdown` already waited for them; with
    /// `--callbacks rayon` it returns once they are handed to rayon, not run.
    pub(crate) fn settle(&self, expected: u64) {
        crate::report::wait_until(std::time::Duration::from_secs(30), || {
            self.fired() >= expected
        });
    }

    /// Waits, up to `timeout`, until no slot is [`NOT_FIRED`] (each timer fired or was
    /// cancelled); returns whether that happened. Cheap while the peer is measured: a
    /// cursor moves past settled slots, which never become unsettled again, so the
    /// whole wait reads each slot about once, where polling [`fired`](Self::fired)
    /// read all of them every 2 ms. On 2 cores that scan took a fifth of a core from
    /// the timer being measured, and pulled each line of slots away from the thread
    /// about to write it.
    pub(crate) fn wait_settled(&self, timeout: std::time::Duration) -> bool {
        self.wait_settled_at(&self.slots, timeout)
    }

    /// As [`wait_settled`](Self::wait_settled), for the timers at `indices` only.
    pub(crate) fn wait_fired_at(&self, indices: &[usize], timeout: std::time::Duration) -> bool {
        let slots: Vec<&AtomicU32> = indices.iter().map(|&index| &self.slots[index]).collect();
        self.wait_settled_at(&slots, timeout)
    }

    /// Waits, up to `timeout`, until none of `slots` is [`NOT_FIRED`].
    fn wait_settled_at<S: std::borrow::Borrow<AtomicU32>>(
        &self,
        slots: &[S],
        timeout: std::time::Duration,
    ) -> bool {
        let mut cursor = 0;
        crate::report::wait_until(timeout, || {
            cursor += slots[cursor..]
                .iter()
                // ORDERING: Relaxed: a progress check; `lateness` reads again after.
                .take_while(|slot| slot.borrow().load(Ordering::Relaxed) != NOT_FIRED)
                .count();
            cursor == slots.len()
        })
    }

    /// Timers in `range` that never fired and were not cancelled.
    pub(crate) fn unfired_in(&self, range: std::ops::Range<usize>) -> u64 {
        self.slots[range]
            .iter()
            // ORDERING: Relaxed: read after the workload is quiet.
            .filter(|slot| slot.load(Ordering::Relaxed) == NOT_FIRED)
            .count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::Tracker;
    use std::time::{Duration, Instant};

    #[test]
    fn wait_settled_returns_once_every_slot_fired_or_was_cancelled_in_any_order() {
        let tracker = Tracker::leak(64, Instant::now(), Duration::ZERO);
        let past = Instant::now();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                // Out of order, and one cancelled: the cursor waits at the first
                // unsettled slot and moves on once it settles.
                for index in (0..64).rev() {
                    if index == 7 {
                        tracker.mark_cancelled(index);
                    } else {
                        tracker.record(index, past);
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
            });
            assert!(tracker.wait_settled(Duration::from_secs(30)));
        });
        assert_eq!(tracker.fired(), 63);
        assert_eq!(tracker.violations(), (0, 0));
    }

    #[test]
    fn wait_fired_at_gives_up_after_its_timeout_on_a_timer_that_never_fires() {
        let tracker = Tracker::leak(8, Instant::now(), Duration::ZERO);
        tracker.record(2, Instant::now());
        assert!(tracker.wait_fired_at(&[2], Duration::from_secs(5)));
        let start = Instant::now();
        assert!(!tracker.wait_fired_at(&[2, 5], Duration::from_millis(50)));
        assert!(
            start.elapsed() >= Duration::from_millis(50),
            "waited its timeout"
        );
        assert!(
            !tracker.wait_settled(Duration::from_millis(10)),
            "slot 0 never fired"
        );
    }
}
