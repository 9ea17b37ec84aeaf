//! [`ManualClock`]: time that tests control. A service built with
//! [`Builder::clock`](crate::Builder::clock) reads time only from it, and
//! [`advance`](ManualClock::advance) moves it forward and returns once everything it
//! made due has fired (and, with the pool or inline callbacks, run).
//!
//! # Ground rules
//!
//! - **One lock.** The clock's time, the rounds asked for, the shards' answers and the
//!   pool batches in flight all live in one `Progress` under one mutex, with one
//!   condition variable the advancer waits on. Every shard turn of a manual-clock
//!   service takes it twice (to begin and to end the turn): cheap next to a test's
//!   callbacks, and simple to reason about.
//! - **Rounds.** `advance` sets the new time, then asks for a *round*: it bumps
//!   `round` and unparks every shard; a shard reads `round` and the time together when
//!   it begins a turn and reports that round done when the turn has dispatched what it
//!   fired (inline callbacks have returned; pool batches are counted in `in_flight`
//!   before the report). The round is over when every live shard has reported it and
//!   `in_flight` is zero.
//! - **Fixed point.** A callback may schedule a timer that is also due; it reaches a
//!   shard's ring before the callback returns. So `advance` repeats rounds until one in
//!   which nothing was in flight when it began and no turn fired anything
//!   (`activity` unchanged): then every callback that ran has returned, every timer
//!   they scheduled has been taken in by a turn that began after they returned, and
//!   none of those turns found anything due.
//! - **No waiting on oneself.** On a thread that runs this clock's callbacks (a shard
//!   thread, or a pool worker inside a batch), `advance` moves the time and wakes the
//!   shards but does not wait: the round could not finish before that callback returns.
//! - Shards register at build time (so a shard whose thread has not started yet is
//!   still waited for: its first turn reads the round) and leave when their loop ends
//!   or their thread never starts (`TurnSlot`'s drop), so a shut-down service never
//!   holds an `advance` up.

#![forbid(unsafe_code)]

use std::cell::Cell;
use std::fmt;
use std::time::{Duration, Instant};

use super::{instant_after, Nanos};
use crate::sync::{thread, Arc, Condvar, Mutex, MutexGuard};

/// A clock that moves only when told to, for tests: code with 30-second timeouts is
/// tested in microseconds, deterministically (as `tokio::time::pause` and `advance`).
///
/// `ManualClock::new()` starts frozen at the current `Instant`. Give it to
/// [`Builder::clock`](crate::Builder::clock): the service then reads time only from
/// it — `schedule(delay)`, `sleep`, `timeout`, `interval`, repeating timers, resets
/// and the shards' expiry — and its wheel's tick grid starts at the clock's starting
/// instant, so a deadline a whole number of ticks away is due exactly then. Its shards
/// never park on a wall-clock deadline: nothing is due until `advance`. One clock may
/// drive several services; clones share the time.
///
/// Every guarantee keeps its meaning against the manual now: never early, exactly
/// once, `shutdown` returns what has not fired.
///
/// # Examples
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use sharded_timer::{ManualClock, ShardedTimer};
///
/// let clock = ManualClock::new();
/// let timer = ShardedTimer::builder().clock(clock.clone()).build()?;
/// let fired = Arc::new(AtomicUsize::new(0));
/// let counter = fired.clone();
/// timer.schedule(Duration::from_secs(30), move || {
///     counter.fetch_add(1, Ordering::SeqCst);
/// })?;
/// clock.advance(Duration::from_secs(29));
/// assert_eq!(fired.load(Ordering::SeqCst), 0, "never early");
/// clock.advance(Duration::from_secs(1));
/// assert_eq!(fired.load(Ordering::SeqCst), 1, "fired, and its callback returned");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct ManualClock {
    /// Shared by the clones and the services it drives.
    time: Arc<ManualTime>,
}

impl ManualClock {
    /// A clock frozen at `Instant::now()`.
    pub fn new() -> ManualClock {
        ManualClock::on_grid(Instant::now(), 0)
    }

    /// A clock frozen at `start` whose services fire on a grid of `grid_ns`
    /// nanoseconds from its start (0: none), as tokio's paused clock fires on its
    /// 1 ms ticks: a deadline is due once the clock reaches the grid point at or after
    /// it, and "now" for that rounds down to a grid point. Paused time that follows
    /// tokio's (`time/paused.rs`) uses it; a user's `ManualClock` has no grid.
    pub(crate) fn on_grid(start: Instant, grid_ns: u64) -> ManualClock {
        ManualClock {
            time: Arc::new(ManualTime {
                start,
                grid_ns,
                progress: Mutex::new(Progress::default()),
                settled: Condvar::new(),
            }),
        }
    }

    /// The clock's current instant: its start plus every `advance` so far.
    pub fn now(&self) -> Instant {
        self.time.now()
    }

    /// Moves the clock forward by `by` at once (as `tokio::time::advance`), then
    /// returns once every timer of the services it drives that is due at or before the
    /// new now has fired and, with [`Callbacks::pool`](crate::Callbacks::pool) or
    /// [`Callbacks::inline`](crate::Callbacks::inline), its callback has returned —
    /// including timers those callbacks scheduled that are due by then (a deadline
    /// not after `now()` is due at once), to a fixed point. Callbacks see the new
    /// `now()`. With [`Callbacks::spawn`](crate::Callbacks::spawn), it returns once
    /// every due timer has been handed to the spawner.
    ///
    /// No wall-clock sleep anywhere: a 30-second timeout fires in microseconds.
    /// `Duration::ZERO` moves nothing and still runs what is due, a deadline inside
    /// the current tick included: what is due is decided on the nanosecond, the tick
    /// only groups timers. A time beyond `2⁶³ − 2` nanoseconds (about 292 years) from
    /// the start saturates there, at the clock's far future: time never goes
    /// backwards, and every deadline a timer or a future can have is due there (a
    /// `Duration::MAX` delay or a deadline beyond the far future saturates to it), so
    /// `advance(Duration::MAX)` fires everything still pending. There every delay is
    /// zero: a callback that schedules itself again runs again at once, as with
    /// `Duration::ZERO` (and this call returns only when that stops); a repeating
    /// timer's runs stop there (it stays pending, and runs no more).
    ///
    /// Called from a callback of a service this clock drives (on its shard thread or
    /// its pool), it moves the time and wakes the shards but returns without waiting:
    /// the timers it made due fire once the callback has returned.
    ///
    /// # Panics
    ///
    /// Never (a shard thread that panicked is not waited for).
    pub fn advance(&self, by: Duration) {
        self.time.advance(by);
    }

    /// The deadline of the earliest timer pending on the services this clock drives,
    /// or `None` if none has one: what an auto-advancing test moves the clock to next
    /// (`sharded_timer::time::pause`).
    ///
    /// It first runs what is due at the current `now()`, as `advance(Duration::ZERO)`
    /// does, to a fixed point, so that every timer scheduled before the call has been
    /// taken in by its shard and is counted. The instant returned is never later than
    /// that timer's deadline; it may be earlier (then moving the clock there fires
    /// nothing and a later call answers again, closer): a wheel reports the start of
    /// a higher level's slot until its timers cascade. Called from a callback of a
    /// service this clock drives, it cannot wait for the shards: it answers from the
    /// shards' last turns.
    ///
    /// # Panics
    ///
    /// Never.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.time.advance(Duration::ZERO);
        let progress = self.time.lock();
        let due = progress.shards.iter().filter_map(|shard| shard.due).min()?;
        let now = progress.now;
        drop(progress);
        // A tick of a gridded clock's services is a grid step; of any other, a
        // nanosecond. Overdue work (a wheel left mid-burst) is due now.
        let due = Nanos::new(due.saturating_mul(self.time.grid_ns.max(1))).max(now);
        Some(self.time.instant_at(due))
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let progress = self.time.lock();
        f.debug_struct("ManualClock")
            .field("elapsed", &Duration::from_nanos(progress.now.after_zero()))
            .field("shards", &progress.shards.len())
            .finish()
    }
}

/// What a manual clock's clones and services share (ground rules).
pub(crate) struct ManualTime {
    /// Time zero of the clock, and tick 0 of the services it drives.
    start: Instant,
    /// The grid its services fire on, in nanoseconds from `start`; 0 for none (every
    /// deadline due at its own nanosecond). See [`ManualClock::on_grid`].
    grid_ns: u64,
    /// Everything that moves.
    progress: Mutex<Progress>,
    /// Notified when a shard reports a round, leaves, or a pool batch finishes.
    settled: Condvar,
}

/// The state under [`ManualTime`]'s lock.
#[derive(Debug, Default)]
struct Progress {
    /// Nanoseconds since `start`.
    now: Nanos,
    /// Rounds asked for so far.
    round: u64,
    /// Turns that fired something, so far.
    activity: u64,
    /// Pool batches handed over and not yet finished.
    in_flight: usize,
    /// The shards of every live service this clock drives.
    shards: Vec<TurnRecord>,
    /// The key of the next shard to register.
    next_key: u64,
}

/// One shard's answers.
#[derive(Debug)]
struct TurnRecord {
    /// The shard's key.
    key: u64,
    /// The last round whose turn this shard has finished.
    done: u64,
    /// The earliest tick with work in the shard's wheel when that turn ended (ticks
    /// of a manual-clock service are nanoseconds from the clock's start); `None`:
    /// an empty wheel.
    due: Option<u64>,
    /// The shard thread, once its loop has started.
    thread: Option<thread::Thread>,
}

impl fmt::Debug for ManualTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualTime")
            .field("start", &self.start)
            .finish_non_exhaustive()
    }
}

#[cfg(not(loom))]
std::thread_local! {
    /// The address of the `ManualTime` whose callbacks this thread is running now (0
    /// if none), and how deeply: a shard thread of a manual-clock service for its whole
    /// loop, a pool worker between a batch's `Begin` and `End` marks (a callback that
    /// shuts its service down runs the batches still queued inside its own).
    static RUNNING_FOR: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

#[cfg(loom)]
loom::thread_local! {
    /// As above, per model thread.
    static RUNNING_FOR: Cell<(usize, usize)> = Cell::new((0, 0));
}

impl ManualTime {
    /// The lock; a poisoned lock is taken over (nothing under it is left half-done by
    /// a panic: every update is a single assignment).
    ///
    /// Under loom it is taken by spinning on `try_lock`: shard threads take it and are
    /// unparked by other threads, and loom turns an unpark that finds a thread blocked
    /// on a mutex into a wake-up from that mutex (which it then reports as a lock it
    /// "expected to be able to acquire"). A thread spinning is merely runnable. What
    /// the unpark was for is not lost either way (see `TurnSlot::before_park`).
    fn lock(&self) -> MutexGuard<'_, Progress> {
        #[cfg(loom)]
        loop {
            match self.progress.try_lock() {
                Ok(progress) => return progress,
                Err(std::sync::TryLockError::Poisoned(e)) => return e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => loom::thread::yield_now(),
            }
        }
        #[cfg(not(loom))]
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This clock's identity, for `RUNNING_FOR`.
    fn address(&self) -> usize {
        self as *const ManualTime as usize
    }

    /// The instant of tick 0 of the services this clock drives.
    pub(crate) fn start(&self) -> Instant {
        self.start
    }

    /// The grid its services fire on, in nanoseconds; `None` for none.
    pub(crate) fn grid_ns(&self) -> Option<u64> {
        (self.grid_ns > 0).then_some(self.grid_ns)
    }

    /// Whether `deadline` is due now: at or before now, or, on a grid, at or before
    /// the last grid point at or before now.
    fn is_past(&self, deadline: Instant) -> bool {
        let now = self.lock().now;
        match self.grid_ns() {
            None => deadline <= self.instant_at(now),
            Some(grid_ns) => {
                let ticks = super::Ticks::new(grid_ns);
                let due = ticks.due_tick(super::ns_since(self.start, deadline));
                // Every deadline is due at the far future, on or off the grid.
                now == Nanos::FAR_FUTURE || due.get() <= now.after_zero() / grid_ns
            }
        }
    }

    /// The current instant.
    pub(crate) fn now(&self) -> Instant {
        let now = self.lock().now;
        self.instant_at(now)
    }

    /// `start` plus `ns` (see [`instant_after`]).
    fn instant_at(&self, ns: Nanos) -> Instant {
        instant_after(self.start, ns)
    }

    /// See [`ManualClock::advance`] and the ground rules.
    fn advance(&self, by: Duration) {
        let by_ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let mut progress = self.lock();
        // Saturates at the far future, forward: every deadline is due there, a
        // `Duration::MAX` one's included.
        progress.now = progress.now.advanced(by_ns);
        let waits = RUNNING_FOR.with(Cell::get).0 != self.address();
        loop {
            let activity = progress.activity;
            let busy = progress.in_flight > 0;
            progress.round += 1;
            let round = progress.round;
            let threads: Vec<thread::Thread> = progress
                .shards
                .iter()
                .filter_map(|shard| shard.thread.clone())
                .collect();
            drop(progress);
            for thread in threads {
                thread.unpark();
            }
            if !waits {
                return;
            }
            progress = self.lock();
            while progress.in_flight > 0 || progress.shards.iter().any(|shard| shard.done < round) {
                progress = self
                    .settled
                    .wait(progress)
                    .unwrap_or_else(|e| e.into_inner());
            }
            if !busy && progress.activity == activity {
                return;
            }
        }
    }

    /// Registers a shard of a service `time` drives; it leaves when the returned slot
    /// is dropped.
    pub(crate) fn register(time: &Arc<ManualTime>) -> TurnSlot {
        let mut progress = time.lock();
        let key = progress.next_key;
        progress.next_key += 1;
        progress.shards.push(TurnRecord {
            key,
            done: 0,
            due: None,
            thread: None,
        });
        TurnSlot {
            time: time.clone(),
            key,
        }
    }

    /// Counts a pool batch handed over to `time`'s service; the returned marks go at
    /// its two ends.
    fn batch_handed_over(time: &Arc<ManualTime>) -> (BatchMark, BatchMark) {
        time.lock().in_flight += 1;
        (BatchMark::Begin(time.clone()), BatchMark::End(time.clone()))
    }
}

/// A shard's place in its clock's rounds, owned by its shard thread; dropping it (the
/// loop ended, or the thread never started) takes the shard out of every later round.
#[derive(Debug)]
pub(crate) struct TurnSlot {
    /// The clock.
    time: Arc<ManualTime>,
    /// This shard's key in `Progress::shards`.
    key: u64,
}

/// A turn under way: the round it answers and the time it reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Turn {
    /// The round asked for when the turn began.
    pub(crate) round: u64,
    /// The clock's now when the turn began.
    pub(crate) now: Instant,
}

impl TurnSlot {
    /// Called on the shard thread when its loop starts: records the thread for
    /// `advance` to unpark, and marks the thread as running this clock's callbacks.
    pub(crate) fn start_on_this_thread(&self) {
        RUNNING_FOR.with(|running| running.set((self.time.address(), 1)));
        let mut progress = self.time.lock();
        if let Some(record) = progress.shards.iter_mut().find(|r| r.key == self.key) {
            record.thread = Some(thread::current());
        }
    }

    /// Begins a turn: reads the round asked for and the time together, so a turn that
    /// answers a round sees the time that round was asked for.
    pub(crate) fn begin_turn(&self) -> Turn {
        let progress = self.time.lock();
        Turn {
            round: progress.round,
            now: self.time.instant_at(progress.now),
        }
    }

    /// Before parking: the clock's now, and whether a round later than `answered` (the
    /// last round a turn of this shard began in) has been asked for — then the shard
    /// must not park but turn again. One lock, taken last before the park: `advance`
    /// bumps the round before it unparks, so either this read sees the new round, or
    /// the unpark comes after it and makes the park return. (Nothing else is locked in
    /// between: an unpark that finds a thread blocked on a lock does not outlive that
    /// block under loom, and the shard's own rings' handshake covers the producers.)
    pub(crate) fn before_park(&self, answered: u64) -> (Instant, bool) {
        let progress = self.time.lock();
        (
            self.time.instant_at(progress.now),
            progress.round > answered,
        )
    }

    /// Ends a turn whose fired timers have all been dispatched (pool batches counted
    /// in flight): reports its round done, whether it fired anything, and the
    /// earliest tick with work left in its wheel (`due`, for
    /// [`ManualClock::next_deadline`]).
    pub(crate) fn end_turn(&self, turn: Turn, fired: bool, due: Option<u64>) {
        let mut progress = self.time.lock();
        progress.activity += u64::from(fired);
        if let Some(record) = progress.shards.iter_mut().find(|r| r.key == self.key) {
            record.done = record.done.max(turn.round);
            record.due = due;
        }
        drop(progress);
        self.time.settled.notify_all();
    }

    /// Wraps a pool batch in the marks that count it in flight until it has run.
    pub(crate) fn mark_batch<T>(&self, batch: Vec<T>, wrap: impl Fn(BatchMark) -> T) -> Vec<T> {
        let (begin, end) = ManualTime::batch_handed_over(&self.time);
        let mut marked = Vec::with_capacity(batch.len() + 2);
        marked.push(wrap(begin));
        marked.extend(batch);
        marked.push(wrap(end));
        marked
    }
}

impl Drop for TurnSlot {
    fn drop(&mut self) {
        let mut progress = self.time.lock();
        progress.shards.retain(|record| record.key != self.key);
        drop(progress);
        self.time.settled.notify_all();
        RUNNING_FOR.with(|running| {
            if running.get().0 == self.time.address() {
                running.set((0, 0));
            }
        });
    }
}

/// The two ends of a pool batch under a manual clock. `Begin`, run first, marks the
/// worker as running this clock's callbacks; `End`, run last, unmarks it; dropping
/// `End` (run or not: a pool that stopped drops it unrun) counts the batch finished.
/// A callback that shuts its service down from the pool runs the rest of its batch
/// itself, but not its `End` (`Task::after_its_batch`): that runs once the callback
/// has returned.
#[derive(Debug)]
pub(crate) enum BatchMark {
    /// The first task of a batch.
    Begin(Arc<ManualTime>),
    /// The last task of a batch.
    End(Arc<ManualTime>),
}

impl BatchMark {
    /// Runs the mark: `Begin` marks this thread as running the clock's callbacks (one
    /// level deeper), `End` one level less, then counts the batch finished.
    pub(crate) fn run(self) {
        RUNNING_FOR.with(|running| {
            let (address, depth) = running.get();
            match &self {
                BatchMark::Begin(time) if address == time.address() => {
                    running.set((address, depth + 1));
                }
                BatchMark::Begin(time) => running.set((time.address(), 1)),
                BatchMark::End(time) if address == time.address() && depth > 1 => {
                    running.set((address, depth - 1));
                }
                BatchMark::End(time) if address == time.address() => running.set((0, 0)),
                BatchMark::End(_) => {}
            }
        });
    }
}

impl Drop for BatchMark {
    fn drop(&mut self) {
        if let BatchMark::End(time) = self {
            let mut progress = time.lock();
            progress.in_flight -= 1;
            drop(progress);
            time.settled.notify_all();
        }
    }
}

/// Where a service reads the time: the system's `Instant::now()` or a [`ManualClock`].
#[derive(Clone, Debug)]
pub(crate) enum TimeSource {
    /// `Instant::now()`.
    System,
    /// A manual clock.
    Manual(Arc<ManualTime>),
}

impl TimeSource {
    /// The current instant.
    pub(crate) fn now(&self) -> Instant {
        match self {
            TimeSource::System => Instant::now(),
            TimeSource::Manual(time) => time.now(),
        }
    }

    /// An instant at or after now, cheaper to read than [`now`](Self::now): the
    /// system clock's coarse upper bound (`coarse.rs`: at most a few kernel ticks
    /// late); `None` where that is no cheaper (a manual clock, or no coarse clock):
    /// read `now` instead.
    pub(crate) fn latest_now(&self) -> Option<Instant> {
        match self {
            TimeSource::System => super::coarse::latest_now(),
            TimeSource::Manual(_) => None,
        }
    }

    /// Whether `deadline` is at or before now: `deadline <= self.now()`, sparing the
    /// system clock's precise read when the coarse clock tells (`coarse.rs`).
    pub(crate) fn is_past(&self, deadline: Instant) -> bool {
        match self {
            TimeSource::System => super::coarse::is_past(deadline),
            TimeSource::Manual(time) => time.is_past(deadline),
        }
    }
}

impl ManualClock {
    /// The shared time, for the builder.
    pub(crate) fn time(&self) -> &Arc<ManualTime> {
        &self.time
    }
}
