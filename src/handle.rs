//! [`TimerHandle`] and [`Unfired`]: what a caller holds of a scheduled timer.

#![forbid(unsafe_code)]

use std::fmt;
use std::time::Instant;

use crate::clock::{instant_after, ns_since, ManualTime, Nanos};
use crate::entry::{CancelPort, EntryRef, SleepShared};
use crate::id::{TimerId, TimerState};
use crate::limit::PendingLimit;
use crate::shard::ShardShared;
use crate::sync::Arc;

/// A handle to one scheduled timer: cancel it, ask its state.
///
/// A handle is 16 bytes: the timer's entry and its shard's port (a service built with
/// `max_pending` or a [`ManualClock`](crate::ManualClock) keeps the options a handle
/// honours in the entry itself). Cloning it is cheap: a reference count on the timer's
/// own allocation. **Dropping a handle does not cancel the timer**: fire-and-forget is the common case.
/// A handle may outlive the service; its calls then keep working on what is left.
///
/// **Clones saturate, never abort.** The timer's reference count has 24 bits: past
/// 2^23 live references to one timer (handles and the service's own), the count
/// saturates, as Linux's `refcount_t` does, and the timer's allocation is then kept
/// for the life of the process instead of freed: a leak of one entry, never a
/// use-after-free, never an abort.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sharded_timer::{ShardedTimer, TimerState};
///
/// let timer = ShardedTimer::new();
/// let handle = timer.schedule(Duration::from_secs(30), || println!("timed out")).unwrap();
/// assert_eq!(handle.state(), TimerState::Pending);
/// assert!(handle.cancel());   // this call won: the callback will never run
/// assert!(!handle.cancel());  // already cancelled
/// assert_eq!(handle.state(), TimerState::Cancelled);
/// ```
#[derive(Clone)]
pub struct TimerHandle {
    /// The timer's entry (which keeps the service's options, if it has any) and its
    /// shard's port.
    timer: EntryHandle,
}

/// What every handle of a timer holds: its entry (one counted reference) and where a
/// winning cancel or an earlier reset sends its message. 16 bytes, so that arming
/// returns it in two registers (a 24-byte handle came back through memory, and a
/// sleep's first poll stalled copying it: about 10 % of a pending timeout's samples,
/// issue 30). A `Sleep` holds this alone and reaches the service's options through
/// its home; a [`TimerHandle`] through the entry, which keeps them.
#[derive(Clone)]
pub(crate) struct EntryHandle {
    /// The timer's entry (one counted reference).
    entry: EntryRef,
    /// Where a winning cancel sends its message when the entry is filed.
    port: CancelPort<ShardShared>,
}

impl EntryHandle {
    /// Wraps a new timer's handle reference, on `shard`.
    pub(crate) fn new(entry: EntryRef, shard: &ShardShared) -> Self {
        EntryHandle {
            entry,
            port: shard.port(),
        }
    }

    /// As [`TimerHandle::cancel`], with the service's pending bound `limit`, if any.
    pub(crate) fn cancel(&self, limit: Option<&PendingLimit>) -> bool {
        let Some(callback) = self.entry.cancel(&self.port) else {
            return false;
        };
        if let Some(limit) = limit.filter(|_| self.entry.holds_room()) {
            limit.release();
        }
        drop(callback);
        true
    }

    /// The outcome and waker of a `Sleep`'s timer (`None` for any other timer).
    pub(crate) fn sleep_shared(&self) -> Option<&SleepShared> {
        self.entry.sleep_shared()
    }

    /// As [`TimerHandle::reset_at`], to `deadline` in nanoseconds from tick 0.
    pub(crate) fn reset_to(&self, deadline: Nanos) -> bool {
        self.entry.reset(deadline, &self.port)
    }
}

impl TimerHandle {
    /// Tick 0 of the service's clock, from which the entry counts its deadline in
    /// nanoseconds: the process's origin, or the manual clock's start.
    fn start(&self) -> Instant {
        self.manual_time()
            .map_or_else(crate::clock::origin, |time| time.start())
    }

    /// The service's manual clock, if it has one.
    fn manual_time(&self) -> Option<&Arc<ManualTime>> {
        self.timer
            .entry
            .options()
            .and_then(|options| options.time.as_ref())
    }

    /// The service's now.
    fn now(&self) -> Instant {
        self.manual_time()
            .map_or_else(Instant::now, |time| time.now())
    }

    /// Wraps a new timer's handle reference.
    pub(crate) fn new(timer: EntryHandle) -> Self {
        TimerHandle { timer }
    }

    /// Cancels the timer. Returns `true` iff this call moved it from Pending to
    /// Cancelled: the callback will then never run (again). Returns `false` if it had
    /// already fired, been cancelled, or been handed back by
    /// [`shutdown`](crate::ShardedTimer::shutdown) (it then belongs to its
    /// [`Unfired`]).
    ///
    /// One atomic compare-and-swap; if the timer is in a shard's wheel, one push to
    /// that shard's message ring so its memory is freed promptly. A winning call drops
    /// the callback on this thread, **last**: after the shard has been told and the
    /// [`max_pending`](crate::Builder::max_pending) room is freed, so a capture whose
    /// destructor panics, calls `shutdown`, or drops the last clone of the service
    /// finds the service whole. Its captures are freed before `cancel` returns, except
    /// for a repeating timer whose run is under way: that run finishes, and its runner
    /// drops the callback when it returns (no later run starts). A run is under way
    /// from the moment its runner begins it, which can be just before the callback's
    /// first instruction: a body may be entered after a winning `cancel` returned, but
    /// only while the captures have not been dropped, and only that one.
    ///
    /// # Panics
    ///
    /// Only if the callback's destructor panics (the panic propagates, after the
    /// cancel has fully taken effect).
    pub fn cancel(&self) -> bool {
        let limit = self
            .timer
            .entry
            .options()
            .and_then(|options| options.limit.as_deref());
        self.timer.cancel(limit)
    }

    /// The timer's state now. [`TimerState::Fired`] means the callback was handed to
    /// the executor, not necessarily that it has finished.
    pub fn state(&self) -> TimerState {
        self.timer.entry.state()
    }

    /// The timer's id.
    pub fn id(&self) -> TimerId {
        self.timer.entry.id()
    }

    /// When the timer is due: the requested deadline (or the last successful
    /// [`reset`](Self::reset)'s), to the nanosecond; it fires at the first tick
    /// boundary at or after it (under a [`ManualClock`](crate::ManualClock), at it).
    /// An instant before the clock's start (its manual clock's, or the first
    /// service's) reads back exactly. A delay or instant too far ahead saturates at
    /// the clock's far future, about 292 years after its start: on the system clock
    /// it never comes; a manual clock's `advance(Duration::MAX)` reaches it.
    pub fn deadline(&self) -> Instant {
        instant_after(self.start(), self.timer.entry.deadline())
    }

    /// Moves the timer's deadline to `delay` from now. Returns `true` iff the timer was
    /// still pending: it then fires no earlier than the new deadline (rounded up to
    /// the tick), and within a tick (plus wake-up latency) of it, however the old and
    /// new deadlines compare and however many resets came before. Returns `false`,
    /// changing nothing, if it had fired, been cancelled or been handed back by
    /// `shutdown`, and always for a repeating timer (made by
    /// [`schedule_repeating`](crate::ShardedTimer::schedule_repeating)), which keeps
    /// its fixed rate.
    ///
    /// Moving the deadline later (the keepalive case) is one atomic update: the shard
    /// re-files the timer when its old slot comes due, so a connection reset a million
    /// times costs a million stores, not a million allocations. Moving it earlier
    /// also sends the timer's shard one message, which wakes it (unless a message of
    /// an earlier reset is still on its way: the shard then reads this deadline when
    /// that one arrives). `Duration::MAX` saturates, as in
    /// `schedule`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let timer = sharded_timer::ShardedTimer::new();
    /// let idle = timer.schedule(Duration::from_secs(30), || println!("idle: closing")).unwrap();
    /// // A packet arrived: 30 s more.
    /// assert!(idle.reset(Duration::from_secs(30)));
    /// assert!(idle.cancel());
    /// assert!(!idle.reset(Duration::from_secs(30)), "a cancelled timer stays cancelled");
    /// ```
    ///
    /// # Panics
    ///
    /// Never.
    pub fn reset(&self, delay: std::time::Duration) -> bool {
        let deadline = match self.now().checked_add(delay) {
            Some(deadline) => ns_since(self.start(), deadline),
            None => Nanos::FAR_FUTURE,
        };
        self.timer.reset_to(deadline)
    }

    /// Moves the timer's deadline to `deadline`; as [`reset`](Self::reset), including
    /// `false` for a repeating timer. A past deadline makes the timer due on the next
    /// tick.
    ///
    /// # Panics
    ///
    /// Never.
    pub fn reset_at(&self, deadline: Instant) -> bool {
        self.timer.reset_to(ns_since(self.start(), deadline))
    }
}

impl fmt::Debug for TimerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimerHandle")
            .field("id", &self.id())
            .field("state", &self.state())
            .field("deadline", &self.deadline())
            .finish()
    }
}

/// A timer that was still pending when the service shut down, handed back by
/// [`ShardedTimer::shutdown`](crate::ShardedTimer::shutdown) so nothing is silently
/// lost.
///
/// [`run`](Unfired::run) it on the calling thread, or drop it to drop the callback
/// (its handles then report [`TimerState::Cancelled`]). Once handed back, the timer
/// belongs to its `Unfired`: [`TimerHandle::cancel`] returns `false`.
#[must_use = "dropping an Unfired drops its callback without running it"]
pub struct Unfired {
    /// The timer's entry (the service's reference); `None` once run.
    entry: Option<EntryRef>,
    /// The timer's id.
    id: TimerId,
    /// The deadline asked for (as [`TimerHandle::deadline`]).
    deadline: Instant,
}

impl Unfired {
    /// Wraps the service reference of a pending timer.
    pub(crate) fn new(entry: EntryRef, deadline: Instant) -> Self {
        Unfired {
            id: entry.id(),
            entry: Some(entry),
            deadline,
        }
    }

    /// The timer's id.
    pub fn id(&self) -> TimerId {
        self.id
    }

    /// When the timer was due: the deadline asked for (or the last successful reset's),
    /// the same instant its handles' [`deadline`](TimerHandle::deadline) gives.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Runs the callback now, on this thread, regardless of the deadline. The timer's
    /// handles then report [`TimerState::Fired`].
    ///
    /// # Panics
    ///
    /// If the callback panics (the panic propagates to the caller).
    pub fn run(mut self) {
        if let Some(entry) = self.entry.take() {
            if let Ok(task) = entry.try_fire() {
                task.run();
            }
        }
    }
}

impl Drop for Unfired {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take() {
            // Dropped without running: cancel, which drops the callback now.
            drop(entry.cancel_detached());
        }
    }
}

impl fmt::Debug for Unfired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Unfired")
            .field("id", &self.id())
            .field("deadline", &self.deadline)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    #[test]
    fn a_handle_is_16_bytes() {
        // The entry and the port: no tick length, since the entry keeps its deadline
        // in nanoseconds, and no options, which the entry keeps.
        assert_eq!(core::mem::size_of::<super::TimerHandle>(), 16);
    }
}
