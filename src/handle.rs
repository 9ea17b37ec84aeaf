//! [`TimerHandle`], [`TimerId`], [`TimerState`] and [`Unfired`]: what a caller holds
//! of a scheduled timer.

#![forbid(unsafe_code)]

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::clock::Clock;
use crate::entry::{CancelPort, EntryRef};
use crate::shard::{PendingLimit, ShardShared};
use crate::sync::Arc;

/// Bits of a [`TimerId`] that count timers within one thread's prefix.
const SEQUENCE_BITS: u32 = 40;
/// Mask of the sequence bits.
const SEQUENCE_MASK: u64 = (1 << SEQUENCE_BITS) - 1;

/// The next unused thread prefix. Touched once per thread per 2^40 timers, never on the
/// hot path.
static NEXT_PREFIX: AtomicU64 = AtomicU64::new(1);

#[cfg(not(loom))]
std::thread_local! {
    /// The last id this thread handed out (0: none yet).
    static LAST_ID: Cell<u64> = const { Cell::new(0) };
}

#[cfg(loom)]
loom::thread_local! {
    /// The last id this model thread handed out (0: none yet).
    static LAST_ID: Cell<u64> = Cell::new(0);
}

/// The state of a timer. See the crate docs for the transitions.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum TimerState {
    /// Neither fired nor cancelled yet.
    Pending,
    /// Its deadline passed and its callback was handed to the executor (it may still
    /// be running, or have finished).
    Fired,
    /// A [`TimerHandle::cancel`] won: the callback never runs and has been dropped.
    Cancelled,
}

/// A timer's unique id: a per-thread prefix and a per-thread sequence number, so that
/// making one touches no shared counter.
///
/// Ids are unique within the process (until one thread alone makes 2^40 timers 2^24
/// times over). They are displayed as `prefix.sequence`.
///
/// # Examples
///
/// ```
/// let timer = sharded_timer::ShardedTimer::new();
/// let a = timer.schedule(std::time::Duration::from_secs(60), || {}).unwrap();
/// let b = timer.schedule(std::time::Duration::from_secs(60), || {}).unwrap();
/// assert_ne!(a.id(), b.id());
/// println!("{}", a.id()); // e.g. "1.1"
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct TimerId(u64);

impl TimerId {
    /// A fresh id from the calling thread's prefix and sequence.
    pub(crate) fn next() -> TimerId {
        LAST_ID.with(|last| {
            let mut id = last.get();
            if id & SEQUENCE_MASK == SEQUENCE_MASK || id == 0 {
                // ORDERING: Relaxed: uniqueness comes from the RMW alone.
                id = NEXT_PREFIX.fetch_add(1, Ordering::Relaxed) << SEQUENCE_BITS;
            }
            id += 1;
            last.set(id);
            TimerId(id)
        })
    }

    /// An id with the given bits (tests).
    #[cfg(test)]
    pub(crate) fn from_raw(bits: u64) -> TimerId {
        TimerId(bits)
    }

    /// The shard this id routes to, among `shards`: Fibonacci hashing of the id
    /// without its low 6 bits, so each run of 64 consecutive timers of one thread goes
    /// to one shard (that ring's tail stays in the thread's cache for the run) and
    /// successive runs spread over all shards.
    pub(crate) fn shard_index(self, shards: usize) -> usize {
        let hash = (self.0 >> 6).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
        (hash % shards as u64) as usize
    }
}

impl fmt::Display for TimerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0 >> SEQUENCE_BITS, self.0 & SEQUENCE_MASK)
    }
}

/// A handle to one scheduled timer: cancel it, ask its state.
///
/// Cloning a handle is cheap (a reference count on the timer's own allocation).
/// **Dropping a handle does not cancel the timer**: fire-and-forget is the common case.
/// A handle may outlive the service; its calls then keep working on what is left.
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
    /// The timer's entry (one counted reference).
    entry: EntryRef,
    /// Where a winning cancel sends its message when the entry is filed.
    port: CancelPort<ShardShared>,
    /// The service's pending bound, freed by a winning cancel.
    limit: Option<Arc<PendingLimit>>,
    /// The service's clock, to convert deadlines between ticks and instants.
    clock: Clock,
}

impl TimerHandle {
    /// Wraps a new timer's handle reference.
    pub(crate) fn new(
        entry: EntryRef,
        shard: &ShardShared,
        limit: Option<Arc<PendingLimit>>,
        clock: Clock,
    ) -> Self {
        TimerHandle {
            entry,
            port: CancelPort::new(shard),
            limit,
            clock,
        }
    }

    /// Cancels the timer. Returns `true` iff this call moved it from Pending to
    /// Cancelled: the callback will then never run and has already been dropped (its
    /// captures are freed before `cancel` returns). Returns `false` if it had already
    /// fired, been cancelled, or been handed back by
    /// [`shutdown`](crate::ShardedTimer::shutdown) (it then belongs to its
    /// [`Unfired`]). One atomic
    /// compare-and-swap; if the timer is in a shard's wheel, one push to that shard's
    /// cancel ring so its memory is freed promptly.
    ///
    /// # Panics
    ///
    /// Never; the callback's destructor runs on this thread and may panic itself.
    pub fn cancel(&self) -> bool {
        let won = self.entry.cancel(&self.port);
        if won {
            if let Some(limit) = &self.limit {
                limit.release();
            }
        }
        won
    }

    /// The timer's state now. [`TimerState::Fired`] means the callback was handed to
    /// the executor, not necessarily that it has finished.
    pub fn state(&self) -> TimerState {
        self.entry.state()
    }

    /// The timer's id.
    pub fn id(&self) -> TimerId {
        self.entry.id()
    }

    /// When the timer is due: the requested deadline (or the last successful
    /// [`reset`](Self::reset)'s) rounded up to the service's tick, so at most one tick
    /// later than asked. For a delay too large to represent, a far-future instant; such
    /// a timer never fires.
    pub fn deadline(&self) -> Instant {
        self.clock.tick_to_instant(self.entry.deadline())
    }

    /// Moves the timer's deadline to `delay` from now. Returns `true` iff the timer was
    /// still pending: it then fires no earlier than the new deadline (rounded up to
    /// the tick), however the old and new deadlines compare. Returns `false`, changing
    /// nothing, if it had fired, been cancelled or been handed back by `shutdown`.
    ///
    /// Moving the deadline later (the keepalive case) is one atomic update: the shard
    /// re-files the timer when its old slot comes due, so a connection reset a million
    /// times costs a million stores, not a million allocations. Moving it earlier
    /// also sends the timer's shard one message. `Duration::MAX` saturates, as in
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
        let tick = match Instant::now().checked_add(delay) {
            Some(deadline) => self.clock.instant_to_tick(deadline),
            None => u64::MAX,
        };
        self.entry.reset(tick, &self.port)
    }

    /// Moves the timer's deadline to `deadline`; as [`reset`](Self::reset). A past
    /// deadline makes the timer due on the next tick.
    ///
    /// # Panics
    ///
    /// Never.
    pub fn reset_at(&self, deadline: Instant) -> bool {
        self.entry
            .reset(self.clock.instant_to_tick(deadline), &self.port)
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
    /// The deadline, rounded up to the service's tick.
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

    /// When the timer was due, rounded up to the service's tick.
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
            let _ = entry.cancel_detached();
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
