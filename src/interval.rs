//! [`Interval`]: a stream of ticks on a fixed grid, for async code, with a choice of
//! what to do about ticks missed while the task was busy ([`MissedTickBehavior`]).
//!
//! One [`Sleep`] is re-armed for each tick (in place while it is pending, a new timer
//! once it has completed), so an interval holds at most one timer at a time, and none
//! before its first poll.

#![forbid(unsafe_code)]

use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::clock::TimeInstant;
use crate::clock::{instant_after, Nanos};
use crate::{ShardedTimer, Sleep};

/// What an [`Interval`] does when a tick completes late — the task did not poll it
/// for a while, or the clock jumped (a [`ManualClock`](crate::ManualClock) advanced
/// several periods at once). Default: [`Burst`](MissedTickBehavior::Burst), as
/// tokio's (a repeating callback, [`ShardedTimer::schedule_repeating`], skips
/// instead).
///
/// A tick counts as missed, as tokio's, only when it completes more than
/// 5 ms after it was due — or more than one of the service's ticks,
/// if those are longer (finer lateness is the wheel's resolution, not a miss). A tick
/// less late than that is not a miss: whatever the behaviour, the next is due one
/// period after it, on the grid.
///
/// Every behaviour yields the `Instant` each tick was *due*, not when it completed. The
/// timelines below are for `interval(10ms)` made at 0, polled again only at 35 ms
/// (ticks due at 10, 20 and 30 ms were missed):
///
/// | behaviour | ticks yielded at 35 ms | later ticks due at |
/// | --- | --- | --- |
/// | `Burst` | 10, 20, 30 (at once) | 40, 50, 60 … |
/// | `Skip` | 10 | 40, 50, 60 … (the grid is kept) |
/// | `Delay` | 10 | 45, 55, 65 … (the grid restarts from 35) |
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MissedTickBehavior {
    /// Yield every missed tick, back to back, until caught up; then keep the grid.
    /// For counting or rate-limiting where each period must be accounted for. The
    /// default (tokio's).
    #[default]
    Burst,
    /// Yield the earliest missed tick once, then restart the grid from the time it was
    /// yielded: the next tick is one period after that. Keeps at least a period between
    /// a missed tick and the next. A tick up to 5 ms late keeps the
    /// grid (as tokio's).
    Delay,
    /// Yield the earliest missed tick once, then go on with the first grid point after
    /// now: the grid is kept, the missed points are dropped. For heartbeats and polls,
    /// where catching up is pointless.
    Skip,
}

/// How late a tick may complete before it counts as missed (tokio's
/// `Interval::poll_tick`: `now > timeout + 5ms`); a service whose tick is longer uses
/// its tick instead.
const MISSED_AFTER: Duration = Duration::from_millis(5);

impl MissedTickBehavior {
    /// When the tick after one `due` at `due` comes, observed at `now` (`now ≥ due`),
    /// for a period of `period` on a service of tick `resolution`.
    fn next_after(
        self,
        due: Instant,
        now: Instant,
        period: Duration,
        resolution: Duration,
    ) -> Instant {
        let late = now.saturating_duration_since(due);
        if late <= MISSED_AFTER.max(resolution) {
            // Not a miss: on the grid, whatever the behaviour (as tokio's).
            return add_saturating(due, period);
        }
        match self {
            MissedTickBehavior::Burst => add_saturating(due, period),
            MissedTickBehavior::Delay => add_saturating(now, period),
            MissedTickBehavior::Skip => {
                // The first grid point strictly after now.
                let periods = late.as_nanos() / period.as_nanos().max(1) + 1;
                let ahead = u64::try_from(period.as_nanos().saturating_mul(periods))
                    .map_or(Duration::MAX, Duration::from_nanos);
                add_saturating(due, ahead)
            }
        }
    }
}

/// `at + by`, saturating about 292 years on (a sleep saturates a deadline past its
/// clock's far future there).
fn add_saturating(at: Instant, by: Duration) -> Instant {
    instant_after(
        at,
        u64::try_from(by.as_nanos()).map_or(Nanos::FAR_FUTURE, Nanos::new),
    )
}

/// Ticks every `period` on a fixed grid; made by [`ShardedTimer::interval`] and
/// [`ShardedTimer::interval_at`].
///
/// [`tick`](Self::tick)`.await` completes at or after each grid point (never early,
/// against the service's clock) and yields the `Instant` the tick was due. A period
/// shorter than the service's tick (including zero) is raised to the tick. Missed
/// ticks are handled as [`set_missed_tick_behavior`](Self::set_missed_tick_behavior)
/// says (default [`MissedTickBehavior::Burst`], as tokio's).
///
/// If the service shuts down, ticks complete at once from then on, as a [`Sleep`]
/// does (they do not hang a task); [`is_shut_down`](Self::is_shut_down) says so.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sharded_timer::{ManualClock, MissedTickBehavior, ShardedTimer};
///
/// let clock = ManualClock::new();
/// let timer = ShardedTimer::builder().clock(clock.clone()).build()?;
/// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
/// let start = clock.now();
/// let mut every_10ms = timer.interval(Duration::from_millis(10));
/// every_10ms.set_missed_tick_behavior(MissedTickBehavior::Burst);
/// runtime.block_on(async {
///     assert_eq!(every_10ms.tick().await, start); // the first tick completes at once
///     clock.advance(Duration::from_millis(25));
///     assert_eq!(every_10ms.tick().await, start + Duration::from_millis(10));
///     assert_eq!(every_10ms.tick().await, start + Duration::from_millis(20));
/// });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "an Interval does nothing unless its ticks are awaited"]
pub struct Interval {
    /// The timer of the next tick, re-armed for each.
    sleep: Sleep,
    /// When the next tick is due.
    next: Instant,
    /// The grid's spacing.
    period: Duration,
    /// What to do about missed ticks.
    behavior: MissedTickBehavior,
}

impl Interval {
    /// An interval on `timer` whose first tick is due at `start`.
    fn new(timer: &ShardedTimer, start: Instant, period: Duration) -> Interval {
        Interval {
            sleep: Sleep::unarmed(timer, start),
            next: start,
            period: period.max(timer.tick()),
            behavior: MissedTickBehavior::default(),
        }
    }

    /// The `time` namespace's interval: `period` as asked (non-zero), not raised to
    /// the service's tick, as tokio's keeps a period shorter than its 1 ms tick (its
    /// ticks are due 300 µs apart, and complete together, a burst, on each 1 ms tick).
    pub(crate) fn with_exact_period(mut self, period: Duration) -> Interval {
        self.period = period;
        self
    }

    /// Completes at or after the next grid point and yields the instant it was due, a
    /// [`time::Instant`](crate::time::Instant) (as tokio's; `.into_std()` gives the
    /// `std::time::Instant`). Cancel-safe: dropping the future before it completes
    /// loses no tick.
    pub fn tick(&mut self) -> impl Future<Output = TimeInstant> + '_ {
        poll_fn(move |cx| self.poll_tick(cx))
    }

    /// The poll form of [`tick`](Self::tick), for hand-written futures and streams:
    /// `Ready(due)` once the next tick is due, otherwise `Pending` with `cx`'s waker
    /// registered.
    pub fn poll_tick(&mut self, cx: &mut Context<'_>) -> Poll<TimeInstant> {
        // A paused thread's clock first catches up with tokio's paused one: missed
        // ticks are judged by the clock the task sees (`Delay`, `Skip`).
        self.sleep.catch_up();
        // Due as the sleep would judge it: on a paused clock that follows tokio's, on
        // tokio's 1 ms grid (a first tick at a now off the grid waits for the next
        // tick, as tokio's does).
        if !self.sleep.is_due(self.next) {
            if self.sleep.deadline() != self.next || self.sleep.is_elapsed() {
                Pin::new(&mut self.sleep).reset(TimeInstant::from_std(self.next));
                // A grid point past the clock's far future saturates there, as the
                // sleep's deadline does: the tick yields the instant it completes at.
                self.next = self.sleep.deadline().into_std();
            }
            if Pin::new(&mut self.sleep).poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Elapsed: now ≥ next. Or the service shut down: complete at once.
        }
        let due = self.next;
        self.next = self
            .behavior
            .next_after(due, self.sleep.now(), self.period, self.sleep.tick());
        Poll::Ready(TimeInstant::from_std(due))
    }

    /// How missed ticks are handled from now on.
    pub fn set_missed_tick_behavior(&mut self, behavior: MissedTickBehavior) {
        self.behavior = behavior;
    }

    /// How missed ticks are handled.
    pub fn missed_tick_behavior(&self) -> MissedTickBehavior {
        self.behavior
    }

    /// The grid's spacing (at least the service's tick).
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Moves the next tick to one period from now, keeping the period.
    pub fn reset(&mut self) {
        self.reset_after(self.period);
    }

    /// Moves the next tick to now: it completes at the next poll; later ticks follow
    /// one period apart from it.
    pub fn reset_immediately(&mut self) {
        self.sleep.catch_up();
        self.next = self.sleep.now();
    }

    /// Moves the next tick to `after` from now (saturating), keeping the period.
    pub fn reset_after(&mut self, after: Duration) {
        self.sleep.catch_up();
        self.next = add_saturating(self.sleep.now(), after);
    }

    /// Moves the next tick to `deadline` (at once if it has passed), keeping the
    /// period.
    pub fn reset_at(&mut self, deadline: TimeInstant) {
        self.next = deadline.into_std();
    }

    /// Whether the service refused the last tick's timer (it shut down): ticks then
    /// complete at once.
    pub fn is_shut_down(&self) -> bool {
        self.sleep.refused().is_some()
    }
}

/// Feature `stream`: the ticks as a stream that never ends, each item the `Instant`
/// the tick was due (as [`Interval::tick`]).
#[cfg(feature = "stream")]
#[cfg_attr(docsrs, doc(cfg(feature = "stream")))]
impl futures_core::Stream for Interval {
    type Item = TimeInstant;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<TimeInstant>> {
        self.get_mut().poll_tick(cx).map(Some)
    }
}

impl fmt::Debug for Interval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Interval")
            .field("next", &self.next)
            .field("period", &self.period)
            .field("behavior", &self.behavior)
            .finish()
    }
}

impl ShardedTimer {
    /// Ticks every `period`, the first tick completing at once (see [`Interval`]).
    ///
    /// # Panics
    ///
    /// Never: a zero `period` is raised to the service's tick.
    pub fn interval(&self, period: Duration) -> Interval {
        Interval::new(self, self.now(), period)
    }

    /// Ticks every `period`, the first tick due at `start` (at once if it has passed).
    ///
    /// # Panics
    ///
    /// Never.
    pub fn interval_at(&self, start: impl Into<Instant>, period: Duration) -> Interval {
        Interval::new(self, start.into(), period)
    }
}
