//! [`ShardedTimer`], the service façade that routes each timer to a shard by its
//! [`Routing`] (the calling thread's core's, by default), and
//! [`Inner`], the state its clones share. Beside it: its [`Builder`] (`builder.rs`),
//! its shutdown and the joining of its threads (`shutdown.rs`), and its counters,
//! `stats` and `record_metrics` (`counters.rs`).

#![forbid(unsafe_code)]

mod builder;
mod counters;
mod shutdown;

use std::fmt;
use std::time::{Duration, Instant};

pub use builder::Builder;
use shutdown::Threads;

use crate::clock::{Clock, Nanos, TimeSource};
use crate::dispatch::ShardTask;
use crate::entry::{EntryRef, HandleOptions};
use crate::error::ScheduleError;
use crate::executor::Executor;
use crate::handle::TimerHandle;
use crate::home::{home_index, CoreHome, Users};
use crate::id::TimerId;
use crate::limit::PendingLimit;
use crate::routing::Routing;
use crate::shard::ShardShared;
#[cfg(feature = "metrics")]
use crate::stats::LatenessHistogram;
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering};

/// State shared by every clone of a [`ShardedTimer`].
pub(crate) struct Inner {
    /// The shards; shard `k` is pinned to core `k` (`routing.rs`).
    shards: Box<[Arc<ShardShared>]>,
    /// Ticks ↔ instants.
    clock: Clock,
    /// Where the service reads the time.
    time: TimeSource,
    /// The pending bound, if configured.
    limit: Option<Arc<PendingLimit>>,
    /// Set when shutdown starts; `schedule` then fails. Written Release, read Acquire.
    stopped: AtomicBool,
    /// The callback pool (no threads with inline or spawned callbacks).
    executor: Executor<ShardTask>,
    /// Callbacks that panicked inline or in a `Callback` (the pool counts its own).
    callback_panics: Arc<AtomicU64>,
    /// The threads, taken by the first shutdown.
    threads: Mutex<Option<Threads>>,
    /// The configured tick, for `Debug`.
    tick: Duration,
    /// Which shard a new timer goes to.
    routing: Routing,
    /// The lateness histogram as last exported, so the next export records only what
    /// came since (`std`'s mutex: taken only by `record_metrics`, never under loom).
    #[cfg(feature = "metrics")]
    exported: std::sync::Mutex<LatenessHistogram>,
}

/// The home of the core a `Sleep` was made on (`home.rs`): its `Arc` keeps the
/// service alive.
pub(crate) type SleepHome = Arc<CoreHome<Arc<Inner>>>;

/// What a service's `ShardedTimer` clones share (`home.rs`): each shard with what
/// scheduling onto it needs, and the home of the sleeps made on its core; `homes[k]`
/// schedules onto `shards[k]`.
pub(crate) type ServiceUsers = Users<CoreHome<Arc<Inner>>, Arc<Inner>>;

/// A sharded hierarchical timing-wheel timer service.
///
/// Cloning is cheap and every clone drives the same service. Dropping the last clone
/// shuts it down as [`shutdown`](Self::shutdown) does, except that the timers still
/// pending are not handed back: their callbacks are dropped without running. See the
/// crate docs for the guarantees.
///
/// # Examples
///
/// ```
/// use std::sync::mpsc;
/// use std::time::Duration;
/// use sharded_timer::ShardedTimer;
///
/// let timer = ShardedTimer::new();
/// let (tx, rx) = mpsc::channel();
/// timer.schedule(Duration::from_millis(5), move || tx.send("fired").unwrap()).unwrap();
/// assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok("fired"));
/// ```
pub struct ShardedTimer {
    /// The shared service.
    inner: Arc<Inner>,
    /// The homes, shared by the service's users: the last user's drop hands the
    /// service to the homes that still have sleeps (`home.rs`).
    users: Arc<ServiceUsers>,
}

impl Clone for ShardedTimer {
    fn clone(&self) -> Self {
        ShardedTimer {
            inner: self.inner.clone(),
            users: self.users.clone(),
        }
    }
}

impl ShardedTimer {
    /// A service with the default configuration (see [`Builder`]).
    ///
    /// # Panics
    ///
    /// Only if the operating system cannot start its threads; use
    /// [`builder`](Self::builder) to handle that as an error.
    pub fn new() -> ShardedTimer {
        match Builder::default().build() {
            Ok(timer) => timer,
            Err(error) => panic!("sharded-timer could not start: {error}"),
        }
    }

    /// A [`Builder`] with the defaults.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Runs `f` once, on an executor thread, at or after `delay` from now.
    ///
    /// `delay` is a `Duration` measured with `Instant`; the deadline rounds up to the
    /// service's tick. `Duration::ZERO` fires on the next tick. A delay too large to
    /// add to `Instant::now()`, or beyond the wheel's range, saturates: the timer is
    /// kept at the clock's far future, never fires early, never panics (on the system
    /// clock, never fires; a [`ManualClock`]'s `advance(Duration::MAX)` reaches it).
    /// Everything `schedule` did before returning happens-before `f` starts.
    ///
    /// # Errors
    ///
    /// - [`ScheduleError::Shutdown`] after [`shutdown`](Self::shutdown) has started;
    /// - [`ScheduleError::TooManyPending`] when [`Builder::max_pending`] timers are
    ///   pending.
    ///
    /// `f` is dropped, not run, on error.
    ///
    /// # Panics
    ///
    /// Never.
    ///
    /// [`ManualClock`]: crate::ManualClock
    pub fn schedule<F>(&self, delay: Duration, f: F) -> Result<TimerHandle, ScheduleError>
    where
        F: FnOnce() + Send + 'static,
    {
        self.schedule_ns(self.ns_after(self.now(), delay), f)
    }

    /// Runs `f` once, on an executor thread, at or after `deadline`.
    ///
    /// A `deadline` in the past fires on the next tick. Otherwise as
    /// [`schedule`](Self::schedule).
    ///
    /// # Errors
    ///
    /// As [`schedule`](Self::schedule).
    ///
    /// # Panics
    ///
    /// Never.
    pub fn schedule_at<F>(&self, deadline: Instant, f: F) -> Result<TimerHandle, ScheduleError>
    where
        F: FnOnce() + Send + 'static,
    {
        self.schedule_ns(self.inner.clock.instant_to_ns(deadline), f)
    }

    /// Schedules `f` at `deadline` (nanoseconds from tick 0): allocate the entry, route
    /// it to a shard by the service's [`Routing`], file it there.
    fn schedule_ns<F>(&self, deadline: Nanos, f: F) -> Result<TimerHandle, ScheduleError>
    where
        F: FnOnce() + Send + 'static,
    {
        self.enqueue(deadline, true, |id, options| {
            EntryRef::with_options(id, deadline, options, f)
        })
    }

    /// The home of the calling thread's core, for a `Sleep`: its `Arc` keeps the
    /// service alive and it schedules onto that core's shard (`home.rs`).
    pub(crate) fn sleep_home(&self) -> SleepHome {
        let homes = self.users.homes();
        homes[home_index(homes.len())].clone()
    }

    /// Runs `f` every `period`, on an executor thread, at a fixed rate: the n-th run
    /// is due at `now + n × period` (n = 1, 2, …), so delays do not accumulate.
    ///
    /// Runs never overlap: the next run is filed only after the previous one returns.
    /// A run that ends a whole period or more behind skips the runs whose slots have
    /// passed (counted in [`Stats::skipped`]) rather than run them back to back. The
    /// handle stays [`Pending`](crate::TimerState::Pending) until cancelled;
    /// [`cancel`](TimerHandle::cancel) stops every later run (a run already under way
    /// finishes, and its runner drops the callback when it returns). A panic in one run
    /// is counted in [`Stats::panicked`] and the timer keeps going.
    /// [`TimerHandle::reset`] returns `false` for a repeating timer: it keeps its rate.
    /// A `period` shorter than the tick (including zero) runs once per tick;
    /// `Duration::MAX` saturates at the clock's far future (on the system clock it never
    /// runs; a [`ManualClock`] saturated there runs it once; no run comes after the far
    /// future). At shutdown a repeating timer comes
    /// back as an [`Unfired`] whose `run` makes one last run — except one whose own
    /// callback called `shutdown`: its run is under way on the calling thread, so it is
    /// not handed back; when that run returns the timer is cancelled (its handle reads
    /// [`Cancelled`](crate::TimerState::Cancelled)) and its callback dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// let timer = sharded_timer::ShardedTimer::new();
    /// let beats = Arc::new(AtomicUsize::new(0));
    /// let counter = beats.clone();
    /// let heartbeat = timer
    ///     .schedule_repeating(Duration::from_millis(2), move || {
    ///         counter.fetch_add(1, Ordering::SeqCst);
    ///     })
    ///     .unwrap();
    /// while beats.load(Ordering::SeqCst) < 3 {
    ///     std::thread::sleep(Duration::from_millis(1));
    /// }
    /// assert!(heartbeat.cancel());
    /// ```
    ///
    /// # Errors
    ///
    /// As [`schedule`](Self::schedule).
    ///
    /// # Panics
    ///
    /// Never.
    ///
    /// [`Stats::skipped`]: crate::Stats::skipped
    /// [`Stats::panicked`]: crate::Stats::panicked
    /// [`ManualClock`]: crate::ManualClock
    /// [`Unfired`]: crate::Unfired
    pub fn schedule_repeating<F>(
        &self,
        period: Duration,
        f: F,
    ) -> Result<TimerHandle, ScheduleError>
    where
        F: FnMut() + Send + 'static,
    {
        let period = period.max(self.inner.tick);
        let start = self.now();
        let deadline = self.ns_after(start, period);
        self.enqueue(deadline, true, |id, options| {
            EntryRef::new_repeating(id, deadline, start, period, options, f)
        })
    }

    /// Runs `f` repeatedly with a fixed delay (Java's `scheduleWithFixedDelay`): the
    /// first run is due `delay` from now, and each later run `delay` after the previous
    /// run *returned*, so a slow run pushes the next one back and no run is ever
    /// skipped or run back to back. Compare [`schedule_repeating`](Self::schedule_repeating),
    /// whose runs keep a fixed rate.
    ///
    /// Everything else is as for `schedule_repeating`: runs never overlap, a panic is
    /// counted and the timer goes on, [`cancel`](TimerHandle::cancel) stops every later
    /// run, `reset` returns `false`, a `delay` below the tick runs once per tick, and a
    /// pending one comes back from [`shutdown`](Self::shutdown) for one last run.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// let timer = sharded_timer::ShardedTimer::new();
    /// let polls = Arc::new(AtomicUsize::new(0));
    /// let counter = polls.clone();
    /// // Poll a backend 2 ms after the previous poll finished, however long it took.
    /// let poller = timer
    ///     .schedule_with_fixed_delay(Duration::from_millis(2), move || {
    ///         counter.fetch_add(1, Ordering::SeqCst);
    ///     })
    ///     .unwrap();
    /// while polls.load(Ordering::SeqCst) < 3 {
    ///     std::thread::sleep(Duration::from_millis(1));
    /// }
    /// assert!(poller.cancel());
    /// ```
    ///
    /// # Errors
    ///
    /// As [`schedule`](Self::schedule).
    ///
    /// # Panics
    ///
    /// Never.
    pub fn schedule_with_fixed_delay<F>(
        &self,
        delay: Duration,
        f: F,
    ) -> Result<TimerHandle, ScheduleError>
    where
        F: FnMut() + Send + 'static,
    {
        let delay = delay.max(self.inner.tick);
        let start = self.now();
        let deadline = self.ns_after(start, delay);
        self.enqueue(deadline, true, |id, options| {
            EntryRef::new_fixed_delay(id, deadline, start, delay, options, f)
        })
    }

    /// Checks the service is up and (if the timer `holds_room`) has room, makes the
    /// entry due at `deadline` (nanoseconds from tick 0; `make` gets its id and the
    /// options its handles honour, to keep in the entry), routes it
    /// to a shard by the service's [`Routing`] and files it there.
    fn enqueue(
        &self,
        deadline: Nanos,
        holds_room: bool,
        make: impl FnOnce(TimerId, Option<Arc<HandleOptions>>) -> (EntryRef, EntryRef),
    ) -> Result<TimerHandle, ScheduleError> {
        let inner = &*self.inner;
        // ORDERING: Acquire pairs with the Release store in `shut_down`; a stale
        // `false` is caught by the closed ring.
        if inner.stopped.load(Ordering::Acquire) {
            return Err(ScheduleError::Shutdown);
        }
        let id = TimerId::next();
        // The shard the service's routing picks (`routing.rs`).
        let homes = self.users.homes();
        let home = &homes[inner.routing.shard(homes.len(), id)];
        home.enqueue(id, deadline, holds_room, make)
    }

    /// The deadline `delay` after `start`, in nanoseconds from tick 0;
    /// [`Nanos::FAR_FUTURE`] when it does not fit in an `Instant` (a delay such as
    /// `Duration::MAX`).
    fn ns_after(&self, start: Instant, delay: Duration) -> Nanos {
        start
            .checked_add(delay)
            .map_or(Nanos::FAR_FUTURE, |deadline| {
                self.inner.clock.instant_to_ns(deadline)
            })
    }

    /// The service's now: `Instant::now()`, or, for a service built with
    /// [`Builder::clock`], its [`ManualClock`]'s now. Code that computes deadlines
    /// (`timer.now() + IDLE`) reads the time here, so that the same code runs on the
    /// system clock in production and on a `ManualClock` in tests (tokio's paused
    /// `Instant::now()`).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sharded_timer::{ManualClock, ShardedTimer};
    ///
    /// let clock = ManualClock::new();
    /// let timer = ShardedTimer::builder().clock(clock.clone()).build()?;
    /// let before = timer.now();
    /// clock.advance(Duration::from_secs(30));
    /// assert_eq!(timer.now(), before + Duration::from_secs(30));
    /// # Ok::<(), sharded_timer::BuildError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// Never.
    ///
    /// [`ManualClock`]: crate::ManualClock
    pub fn now(&self) -> Instant {
        self.inner.time.now()
    }

    /// The service's tick.
    pub(crate) fn tick(&self) -> Duration {
        self.inner.tick
    }

    /// The instant `delay` from now, saturating (like `schedule`) to the service's
    /// far-future instant when it does not fit.
    pub(crate) fn deadline_after(&self, delay: Duration) -> Instant {
        self.now()
            .checked_add(delay)
            .unwrap_or_else(|| self.inner.clock.far_future())
    }
}

impl Default for ShardedTimer {
    fn default() -> Self {
        ShardedTimer::new()
    }
}

impl fmt::Debug for ShardedTimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedTimer")
            .field("shards", &self.inner.shards.len())
            .field("tick", &self.inner.tick)
            .field(
                "max_pending",
                &self.inner.limit.as_ref().map(|limit| limit.limit()),
            )
            // ORDERING: Relaxed: a diagnostic.
            .field("stopped", &self.inner.stopped.load(Ordering::Relaxed))
            .field("stats", &self.counters())
            .finish()
    }
}

#[cfg(all(test, target_os = "linux"))]
mod stall_tests {
    use std::sync::atomic::{fence, Ordering};
    use std::time::{Duration, Instant};

    use super::ShardedTimer;
    use crate::clock::Nanos;
    use crate::entry::EntryRef;
    use crate::id::TimerId;

    /// The CPU time, ns, of this process's thread named `name`
    /// (`/proc/self/task/*/schedstat`'s first field), if there is one.
    fn cpu_ns_of(name: &str) -> Option<u64> {
        std::fs::read_dir("/proc/self/task")
            .ok()?
            .flatten()
            .find(|task| {
                std::fs::read_to_string(task.path().join("comm"))
                    .is_ok_and(|comm| comm.trim() == name)
            })
            .and_then(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
            .and_then(|stat| stat.split_whitespace().next()?.parse().ok())
    }

    /// A producer that reserved a slot of the insert ring and has not written it (a
    /// thread preempted between the two, here one that sleeps) holds the shard in
    /// `Park::Retry`: the shard must not spin for it, since the producer may be
    /// waiting for the shard's own core (`shard/park.rs`'s ground rules). Over a 300 ms hold the shard
    /// used its whole core before `Stall` (it spun, the main job's heartbeats then 2–10
    /// ms late); with it, a few percent (naps up to `LONGEST_NAP`). Asserted: under
    /// a third, and the value taken once it is written.
    #[test]
    fn a_shard_waiting_for_a_reserved_slot_naps_instead_of_spinning() {
        let timer = ShardedTimer::builder()
            .shards(1)
            .executor_threads(1)
            .pin_cores(false)
            .thread_name("stall-probe")
            .build()
            .unwrap();
        let shard = &timer.inner.shards[0];
        let name = "stall-probe-s0";
        // The thread names itself as it starts.
        let deadline = Instant::now() + Duration::from_secs(10);
        while cpu_ns_of(name).is_none() {
            assert!(
                Instant::now() < deadline,
                "the shard thread's schedstat is readable"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let reservation = shard.insert_ring().reserve().unwrap();
        // As a producer's push does after its reservation (the park handshake).
        fence(Ordering::SeqCst);
        shard.nudge();
        // Let it wake and find the slot reserved.
        std::thread::sleep(Duration::from_millis(20));
        let (window, before) = (Instant::now(), cpu_ns_of(name).unwrap());
        std::thread::sleep(Duration::from_millis(300));
        let used = cpu_ns_of(name).unwrap() - before;
        let elapsed = window.elapsed().as_nanos() as u64;
        let (handle, service) = EntryRef::new(TimerId::next(), Nanos::new(u64::MAX / 2), || {});
        reservation.publish(service);
        assert!(
            used < elapsed / 3,
            "the shard used {used} ns of CPU in {elapsed} ns waiting for a reserved slot"
        );
        // The value is taken once written: the shard turns after each nap.
        let deadline = Instant::now() + Duration::from_secs(10);
        while shard.load().scheduled == 0 {
            assert!(
                Instant::now() < deadline,
                "the written slot is taken within 10 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(timer.shutdown().len(), 1, "the timer comes back unfired");
        drop(handle);
    }
}
