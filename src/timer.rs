//! [`ShardedTimer`], the service façade that routes each timer to the shard of the
//! calling thread's core (by the hash of its id where the core is unknown), and its
//! [`Builder`].

#![forbid(unsafe_code)]

use std::fmt;
use std::time::{Duration, Instant};

use crate::clock::{Clock, ManualClock, ManualTime, Nanos, TimeSource};
use crate::dispatch::{Callbacks, Dispatch, Mode, ShardTask};
use crate::entry::EntryRef;
use crate::error::{BuildError, ScheduleError};
use crate::executor::{thread_name, Executor};
use crate::handle::{HandleOptions, TimerHandle, Unfired};
use crate::home::{home_index, route, user_gone, CoreHome, Registration};
use crate::id::{TimerId, TimerState};
use crate::limit::PendingLimit;
use crate::shard::{dispatch_rest_here, is_own_thread, take_own_core, ShardShared, ShardThread};
use crate::stats::{LatenessHistogram, ShardLoad, Stats};
use crate::sync::{thread, Arc, AtomicBool, AtomicU64, AtomicUsize, CachePadded, Mutex, Ordering};

/// Default slots per ring.
const DEFAULT_RING_CAPACITY: usize = 4096;

/// Configuration of a [`ShardedTimer`]; see each method for its default.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// let timer = sharded_timer::ShardedTimer::builder()
///     .shards(2)
///     .tick(Duration::from_millis(1))
///     .executor_threads(2)
///     .max_pending(1_000_000)
///     .thread_name("timeouts")
///     .build()?;
/// # Ok::<(), sharded_timer::BuildError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Builder {
    /// Number of shards (threads with a wheel each).
    shards: Option<usize>,
    /// Length of one tick.
    tick: Duration,
    /// Where callbacks run (`None`: the pool, one thread per core).
    callbacks: Option<Callbacks>,
    /// Pin shard `k` to core `k`.
    pin_cores: bool,
    /// Bound on pending timers.
    max_pending: Option<usize>,
    /// Slots per ring.
    ring_capacity: usize,
    /// Prefix of every thread's name.
    thread_name: String,
    /// The manual clock to read time from, if any.
    clock: Option<ManualClock>,
    /// How long a shard's due timers may wait for its own thread (`None`: for ever);
    /// unset: four ticks.
    rescue_after: Option<Option<Duration>>,
    /// Start the pool's workers with the first batch handed to it, not at build
    /// (the process-wide service's, `time.rs`).
    pool_on_demand: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            shards: None,
            tick: Duration::from_millis(1),
            callbacks: None,
            pin_cores: true,
            max_pending: None,
            ring_capacity: DEFAULT_RING_CAPACITY,
            thread_name: "timer".to_owned(),
            clock: None,
            rescue_after: None,
            pool_on_demand: false,
        }
    }
}

/// The number of cores the process may use.
fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

impl Builder {
    /// This configuration with the callback pool's workers started by the first
    /// batch handed to the pool instead of at build: for the process-wide service,
    /// which costs no pool thread until a callback needs one.
    pub(crate) fn pool_on_demand(mut self) -> Self {
        self.pool_on_demand = true;
        self
    }

    /// Number of shards, each a thread with its own wheel and rings. Default: the
    /// number of available cores. `0` makes [`build`](Self::build) fail.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// The resolution of the wheels. Deadlines round up to a tick, so a timer fires
    /// at most one tick (plus wake-up latency) after its deadline. Default: 1 ms.
    /// Zero makes [`build`](Self::build) fail.
    pub fn tick(mut self, tick: Duration) -> Self {
        self.tick = tick;
        self
    }

    /// Number of threads that run callbacks: the short form of
    /// [`callbacks`](Self::callbacks)`(`[`Callbacks::pool`]`(threads))`. Default: the
    /// number of available cores. `0` makes [`build`](Self::build) fail.
    pub fn executor_threads(mut self, threads: usize) -> Self {
        self.callbacks = Some(Callbacks::pool(threads));
        self
    }

    /// Where callbacks run: the built-in pool ([`Callbacks::pool`], the default, one
    /// thread per available core), the shard thread that fired them
    /// ([`Callbacks::inline`]), or an executor of yours ([`Callbacks::spawn`]). The
    /// last call of this and [`executor_threads`](Self::executor_threads) wins.
    pub fn callbacks(mut self, callbacks: Callbacks) -> Self {
        self.callbacks = Some(callbacks);
        self
    }

    /// Pin shard `k` to core `k` (with `core_affinity`). Default: `true`. Ignored
    /// where pinning is unsupported or there are fewer cores than shards.
    pub fn pin_cores(mut self, pin: bool) -> Self {
        self.pin_cores = pin;
        self
    }

    /// How long a shard's due timers may wait for their own shard's thread before
    /// another shard fires them: the *rescue* of a shard whose thread is stuck inside a
    /// long inline callback (or a slow spawner), or descheduled. Rounded up to whole
    /// ticks (at least one). Default: `Some(4 ticks)`. `None` turns rescue off: a
    /// shard's due timers then wait for its own thread, as in Netty.
    ///
    /// Each shard thread watches one other shard. When that shard has made no
    /// progress (begun no turn and taken no inline callback off its queue) for
    /// `rescue_after` while awake, or has overslept its wake-up by as much (so a
    /// stuck shard is noticed between 1 and 2 × `rescue_after` after it stopped),
    /// the watcher takes the shard's wheel for a turn (an atomic ownership token,
    /// never waiting for it) and fires what is due: inline callbacks then run on the
    /// watcher's thread, one at a time in deadline order among themselves, beside
    /// the stuck callback (which is what rescue is for: a callback that has run longer
    /// than `rescue_after` no longer holds its shard's others back), and a pool gets
    /// them as usual. Every timer still fires once and never early; the stuck
    /// thread carries on when it returns. So with inline callbacks, one callback that
    /// blocks for 200 ms makes its shard's other timers late by about `rescue_after`,
    /// not 200 ms. A callback that blocks still holds its own thread, and a timer
    /// already fired onto that thread's queue at that moment waits for it.
    ///
    /// What it costs: the owner takes and gives back its token once per turn (and once
    /// per inline callback): a CAS and a store. A shard whose watched shard has timers
    /// and which has none of its own due sooner wakes about `rescue_after` after each
    /// of the watched shard's wake-ups; a service with nothing pending makes no
    /// wake-ups. Off with one shard (nobody to rescue it), and under a
    /// [`ManualClock`] (time moves only in `advance`, which already waits for
    /// callbacks).
    pub fn rescue_after(mut self, after: Option<Duration>) -> Self {
        self.rescue_after = Some(after);
        self
    }

    /// Bound the number of pending timers: the `limit + 1`-th concurrent schedule
    /// gets [`ScheduleError::TooManyPending`]. Firing and cancelling free room.
    /// Default: unbounded (and no shared counter). `0` makes
    /// [`build`](Self::build) fail.
    pub fn max_pending(mut self, limit: usize) -> Self {
        self.max_pending = Some(limit);
        self
    }

    /// Slots of each shard's insert ring and message ring: a power of two, at least 2.
    /// A full ring never drops a timer; the scheduling thread waits for room.
    /// Default: 4096. Other values make [`build`](Self::build) fail.
    pub fn ring_capacity(mut self, capacity: usize) -> Self {
        self.ring_capacity = capacity;
        self
    }

    /// Prefix of the service's thread names: shard `k` is `{name}-s{k}` and executor
    /// worker `k` is `{name}-w{k}`. Linux keeps 15 bytes of a thread's name (what `top`,
    /// `perf` and `/proc/*/task/*/comm` show), so the prefix is cut (at a character
    /// boundary) to make each whole name fit in 15 bytes: `-s{k}` always survives.
    /// Default: `timer`.
    pub fn thread_name(mut self, name: impl Into<String>) -> Self {
        self.thread_name = name.into();
        self
    }

    /// Read the time only from `clock` instead of the system's `Instant::now()`: for
    /// tests, which then move time with [`ManualClock::advance`] instead of sleeping.
    /// The wheel's tick grid starts at the clock's starting instant. One clock may
    /// drive several services. Default: the system clock.
    pub fn clock(mut self, clock: ManualClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Starts the service: one thread per shard and the executor's workers.
    ///
    /// # Errors
    ///
    /// - [`BuildError::ZeroShards`], [`BuildError::ZeroExecutorThreads`],
    ///   [`BuildError::InvalidTick`], [`BuildError::InvalidRingCapacity`],
    ///   [`BuildError::ZeroMaxPending`] for invalid settings;
    /// - [`BuildError::Spawn`] if a thread cannot be started (the threads already
    ///   started are stopped and joined first).
    pub fn build(self) -> Result<ShardedTimer, BuildError> {
        let shards = self.shards.unwrap_or_else(available_cores);
        let mode = self.callbacks.clone().unwrap_or_default().0;
        let workers = match mode {
            Mode::Pool(threads) => threads,
            Mode::Inline | Mode::Spawn(_) => 0,
            #[cfg(feature = "rayon")]
            Mode::Rayon(_) => 0,
        };
        if shards == 0 {
            return Err(BuildError::ZeroShards);
        }
        if workers == 0 && matches!(mode, Mode::Pool(_)) {
            return Err(BuildError::ZeroExecutorThreads);
        }
        if self.tick.is_zero() || u64::try_from(self.tick.as_nanos()).is_err() {
            return Err(BuildError::InvalidTick { tick: self.tick });
        }
        if self.ring_capacity < 2 || !self.ring_capacity.is_power_of_two() {
            return Err(BuildError::InvalidRingCapacity {
                capacity: self.ring_capacity,
            });
        }
        if self.max_pending == Some(0) {
            return Err(BuildError::ZeroMaxPending);
        }
        let manual = self.clock.as_ref().map(|clock| clock.time().clone());
        let (clock, time) = match &manual {
            Some(manual) => (
                Clock::manual(manual.start(), self.tick),
                TimeSource::Manual(manual.clone()),
            ),
            None => (
                Clock::new(crate::clock::origin(), self.tick),
                TimeSource::System,
            ),
        };
        let limit = self
            .max_pending
            .map(|limit| Arc::new(PendingLimit::new(limit)));
        let handle_options = HandleOptions::of(limit.clone(), manual.clone());
        // Inline and spawn run no pool: an executor of no threads, never submitted to.
        let (executor, worker_threads) = if self.pool_on_demand {
            (
                Executor::<ShardTask>::on_demand(workers, &self.thread_name),
                Vec::new(),
            )
        } else {
            Executor::<ShardTask>::start(workers, &self.thread_name)
                .map_err(|(thread, source)| BuildError::Spawn { thread, source })?
        };
        let callback_panics = Arc::new(AtomicU64::new(0));
        let dispatch = Dispatch::new(mode, &executor, &callback_panics);
        let cores = if self.pin_cores && !cfg!(loom) {
            core_affinity::get_core_ids().unwrap_or_default()
        } else {
            Vec::new()
        };
        // Each shard thread is built first, so that rescue can link them in a ring.
        let mut threads: Vec<(Arc<ShardShared>, ShardThread)> = (0..shards)
            .map(|_| {
                let (shard, cursors) =
                    ShardShared::with_time(self.ring_capacity, time.clone(), limit.clone());
                let shard_thread = ShardThread::new(
                    shard.clone(),
                    cursors,
                    clock,
                    dispatch.clone(),
                    limit.clone(),
                    manual.as_ref().map(ManualTime::register),
                );
                (shard, shard_thread)
            })
            .collect();
        // Every shard thread may push onto every shard: it needs their links to
        // never wait for a full ring of one (`shard_loop::make_room`).
        let peers: Vec<_> = threads.iter().map(|(_, thread)| thread.link()).collect();
        // Producers file into a shard's wheel directly when its token is free.
        let direct_ports: Vec<_> = threads
            .iter()
            .map(|(_, thread)| thread.direct_port())
            .collect();
        for (_, thread) in &mut threads {
            thread.set_peers(peers.clone());
        }
        let rescue_after = match self.rescue_after {
            None => Some(self.tick.checked_mul(4).unwrap_or(Duration::MAX)),
            Some(after) => after,
        };
        if let Some(after) = rescue_after.filter(|_| shards > 1 && manual.is_none()) {
            let ticks = u64::try_from(after.as_nanos().div_ceil(self.tick.as_nanos()))
                .unwrap_or(u64::MAX)
                .max(1);
            let links: Vec<_> = threads.iter().map(|(_, thread)| thread.link()).collect();
            let shared_halves: Vec<_> = threads.iter().map(|(shard, _)| shard.clone()).collect();
            for (index, (_, thread)) in threads.iter_mut().enumerate() {
                // Shard k watches shard k − 1 and is watched by shard k + 1.
                let watched = links[(index + shards - 1) % shards].clone();
                let watcher = shared_halves[(index + 1) % shards].clone();
                thread.set_rescue(watched, watcher, ticks);
            }
        }
        let mut shared = Vec::with_capacity(shards);
        let mut shard_threads = Vec::with_capacity(shards);
        let mut unstarted = threads.into_iter().enumerate();
        while let Some((index, (shard, shard_thread))) = unstarted.next() {
            let pin_to = (cores.len() >= shards).then(|| cores[index]);
            let name = thread_name(&self.thread_name, 's', index);
            match thread::Builder::new()
                .name(name.clone())
                .spawn(move || shard_thread.run(pin_to))
            {
                Ok(handle) => {
                    shard.set_thread(handle.thread().clone());
                    shared.push(shard);
                    shard_threads.push(handle);
                }
                Err(source) => {
                    drop(unstarted);
                    let partial = Threads {
                        shards: shard_threads,
                        workers: worker_threads,
                    };
                    for shard in &shared {
                        shard.request_stop();
                    }
                    drop(partial.join(&executor, false, None));
                    return Err(BuildError::Spawn {
                        thread: name,
                        source,
                    });
                }
            }
        }
        let users = Arc::new(CachePadded::new(AtomicUsize::new(1)));
        let homes = shared
            .iter()
            .zip(direct_ports)
            .map(|(shard, direct)| {
                Arc::new(CoreHome::new(
                    shard.clone(),
                    direct,
                    clock,
                    time.clone(),
                    limit.clone(),
                    handle_options.clone(),
                    users.clone(),
                ))
            })
            .collect();
        Ok(ShardedTimer {
            inner: Arc::new(Inner {
                #[cfg(feature = "metrics")]
                exported: std::sync::Mutex::default(),
                shards: shared.into_boxed_slice(),
                homes,
                users,
                clock,
                time,
                limit,
                stopped: AtomicBool::new(false),
                executor,
                callback_panics,
                threads: Mutex::new(Some(Threads {
                    shards: shard_threads,
                    workers: worker_threads,
                })),
                tick: self.tick,
            }),
        })
    }
}

/// The service's threads, until shutdown joins them.
struct Threads {
    /// Shard threads; each returns its pending timers.
    shards: Vec<thread::JoinHandle<Vec<EntryRef>>>,
    /// Executor workers.
    workers: Vec<thread::JoinHandle<()>>,
}

impl Threads {
    /// Joins the shards (already asked to stop) but the calling thread's own, if it is
    /// shard `caller_shard`'s (a callback on it: its loop ends once the callback
    /// returns), then stops and joins the executor, skipping the calling thread if it
    /// is one of the workers; that one then runs, here, what was handed to the executor
    /// and has not run yet (the rest of its own batch included). Returns the pending
    /// timers.
    fn join(
        self,
        executor: &Executor<ShardTask>,
        caller_is_worker: bool,
        caller_shard: Option<usize>,
    ) -> Vec<EntryRef> {
        let mut pending = Vec::new();
        for (index, shard) in self.shards.into_iter().enumerate() {
            if caller_shard == Some(index) {
                continue; // detached: it exits by itself once this callback returns
            }
            match shard.join() {
                Ok(unfired) => pending.extend(unfired),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        executor.stop();
        let me = thread::current().id();
        for worker in self.workers.into_iter().chain(executor.take_started()) {
            if caller_is_worker && worker.thread().id() == me {
                continue; // exits by itself once this callback returns
            }
            let _ = worker.join();
        }
        if caller_is_worker {
            executor.run_queued_here();
        } else {
            // A pool started on demand none of whose workers could start.
            executor.run_if_never_started();
        }
        pending
    }
}

/// State shared by every clone of a [`ShardedTimer`].
pub(crate) struct Inner {
    /// The shards; shard `k` is pinned to core `k` (`home::route`).
    shards: Box<[Arc<ShardShared>]>,
    /// Each shard with what scheduling onto it needs, and the home of the sleeps made
    /// on its core (`home.rs`); `homes[k]` schedules onto `shards[k]`.
    homes: Box<[Arc<CoreHome<Arc<Inner>>>]>,
    /// The `ShardedTimer` clones alive (the homes' references are not counted): when
    /// the last goes, the homes without sleeps give up theirs (`home.rs`).
    users: Arc<CachePadded<AtomicUsize>>,
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
    /// The lateness histogram as last exported, so the next export records only what
    /// came since (`std`'s mutex: taken only by `record_metrics`, never under loom).
    #[cfg(feature = "metrics")]
    exported: std::sync::Mutex<LatenessHistogram>,
}

impl Inner {
    /// Shuts down (idempotent); returns the pending timers.
    fn shut_down(&self) -> Vec<Unfired> {
        // ORDERING: Release pairs with `schedule`'s Acquire load; a schedule that
        // misses it is caught by the closed insert ring instead.
        self.stopped.store(true, Ordering::Release);
        let caller_is_worker = self.executor.is_current_worker();
        // A callback on one of this service's shard threads (inline, or a spawner).
        let caller_shard = self.shards.iter().position(|shard| is_own_thread(shard));
        let mut guard = if caller_is_worker || caller_shard.is_some() {
            // A callback calling shutdown while another shutdown waits for that very
            // callback must not block: that shutdown will do the work.
            match self.threads.try_lock() {
                Ok(guard) => guard,
                Err(_) => return Vec::new(),
            }
        } else {
            self.threads.lock().unwrap_or_else(|e| e.into_inner())
        };
        let Some(threads) = guard.take() else {
            return Vec::new();
        };
        for shard in self.shards.iter() {
            shard.request_stop();
        }
        // The calling shard cannot be joined: shut its core down here, first, so that
        // no other shard waits on a ring of it while we join them.
        let mut pending = match caller_shard {
            Some(_) => take_own_core()
                .map(|mut core| core.shut_down())
                .unwrap_or_default(),
            None => Vec::new(),
        };
        pending.extend(threads.join(&self.executor, caller_is_worker, caller_shard));
        drop(guard);
        // What the calling shard fired with this callback runs (or reaches the
        // spawner) before `shutdown` returns, as with the pool; and before the late
        // lists are sealed, so that a repeating timer queued behind this callback
        // comes back below, as from the pool, instead of being cancelled.
        if caller_shard.is_some() {
            dispatch_rest_here();
        }
        // Repeating timers whose run ended after their shard stopped come back too;
        // taking them seals each list (a run ending later cancels its timer).
        for shard in self.shards.iter() {
            let mut returned = 0;
            for entry in shard.take_late() {
                match entry.detach().state() {
                    TimerState::Pending => {
                        pending.push(entry);
                        returned += 1;
                    }
                    // A handle cancelled it on the late list: out of the wheel and not
                    // running, so it sent no message and no runner saw it; it is
                    // counted here, once (only this loop takes it off the list).
                    TimerState::Cancelled => {
                        crate::dispatch::RunSink::count_run_cancelled(shard);
                    }
                    // Never: a repeating timer's runs leave it pending, and nothing
                    // fires an entry before this loop detaches it; nothing to count.
                    TimerState::Fired => {}
                }
            }
            // ORDERING: Relaxed: a statistic.
            shard.returned.fetch_add(returned, Ordering::Relaxed);
        }
        let mut unfired = Vec::with_capacity(pending.len());
        let mut sleeps = Vec::new();
        for entry in pending {
            if entry.hands_back() {
                let deadline = self.clock.ns_to_instant(entry.deadline());
                unfired.push(Unfired::new(entry, deadline));
            } else {
                sleeps.push(entry);
            }
        }
        // A sleep's timer is not handed back: cancelling it drops its callback, which
        // completes the sleep (not elapsed) and wakes its task. Last, since a waker is
        // user code: the service's own bookkeeping is done by now.
        for entry in sleeps {
            drop(entry.cancel_detached());
        }
        unfired
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Dropping the last clone shuts down as `shutdown` does, then drops the
        // unfired timers (their callbacks are dropped unrun).
        drop(self.shut_down());
    }
}

/// A `Sleep`'s registration with the home of the core it was made on (`home.rs`).
pub(crate) type SleepHome = Registration<Arc<Inner>>;

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
}

impl Clone for ShardedTimer {
    fn clone(&self) -> Self {
        // ORDERING: Relaxed: a new user is made from a live one, so the count is not
        // 0 and cannot reach 0 before this returns; only its fall to 0 is raced.
        self.inner.users.fetch_add(1, Ordering::Relaxed);
        ShardedTimer {
            inner: self.inner.clone(),
        }
    }
}

impl Drop for ShardedTimer {
    fn drop(&mut self) {
        // The last user: each home without sleeps gives up its reference. Our own
        // `inner` keeps the service alive until this returns, so dropping them here
        // never runs the shutdown; dropping `inner` afterwards may.
        let homes = self.inner.homes.iter().map(|home| home.home());
        drop(user_gone(&self.inner.users, homes));
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
    /// it to the calling thread's core's shard, file it there.
    fn schedule_ns<F>(&self, deadline: Nanos, f: F) -> Result<TimerHandle, ScheduleError>
    where
        F: FnOnce() + Send + 'static,
    {
        self.enqueue(deadline, true, |id| EntryRef::new(id, deadline, f))
    }

    /// A registration with the home of the calling thread's core, for a `Sleep`: it
    /// keeps the service alive and schedules onto that core's shard (`home.rs`).
    pub(crate) fn sleep_home(&self) -> SleepHome {
        let homes = &self.inner.homes;
        Registration::enter(&homes[home_index(homes.len())], &self.inner)
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
        self.enqueue(deadline, true, |id| {
            EntryRef::new_repeating(id, deadline, start, period, f)
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
        self.enqueue(deadline, true, |id| {
            EntryRef::new_fixed_delay(id, deadline, start, delay, f)
        })
    }

    /// Checks the service is up and (if the timer `holds_room`) has room, makes the
    /// entry due at `deadline` (nanoseconds from tick 0; `make` gets its id), routes it
    /// to the shard of the calling thread's core (`home::route`) and files it there.
    fn enqueue(
        &self,
        deadline: Nanos,
        holds_room: bool,
        make: impl FnOnce(TimerId) -> (EntryRef, EntryRef),
    ) -> Result<TimerHandle, ScheduleError> {
        let inner = &*self.inner;
        // ORDERING: Acquire pairs with the Release store in `shut_down`; a stale
        // `false` is caught by the closed ring.
        if inner.stopped.load(Ordering::Acquire) {
            return Err(ScheduleError::Shutdown);
        }
        let id = TimerId::next();
        // The calling thread's core's shard (`home::route`).
        let home = &inner.homes[route(inner.homes.len(), id)];
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

    /// A snapshot of the counters, summed over the shards and workers, with each
    /// shard's load and the lateness of fired timers. Cheap: no lock, nothing on the
    /// hot path; it also wakes each shard so that timers waiting in its rings are
    /// counted by the next call (see [`Stats`]).
    pub fn stats(&self) -> Stats {
        for shard in self.inner.shards.iter() {
            shard.nudge();
        }
        self.counters()
    }

    /// Publishes [`stats`](Self::stats) through the [`metrics`](https://docs.rs/metrics)
    /// facade, to whatever recorder the application installed (Prometheus, StatsD…);
    /// call it periodically, e.g. once a second. Feature `metrics`.
    ///
    /// - counters (absolute, named as Prometheus expects counters: `_total`):
    ///   `sharded_timer_scheduled_total`, `sharded_timer_fired_total`,
    ///   `sharded_timer_cancelled_total`, `sharded_timer_panicked_total`,
    ///   `sharded_timer_skipped_total`, `sharded_timer_ring_full_waits_total`;
    /// - gauges: `sharded_timer_pending`, `sharded_timer_in_rings`, and
    ///   `sharded_timer_shard_pending` with label `shard` = its index;
    /// - histogram `sharded_timer_lateness_seconds`: the timers fired since the
    ///   previous call, each recorded at the upper bound of its
    ///   [`LatenessHistogram`] bucket.
    ///
    /// Every series is described (`describe_counter!` and its kin) with its unit and a
    /// help text, on every call, so that a recorder installed later still gets them.
    /// Services in one process are told apart by the recorder's global labels, or by
    /// calling this from a scope with a recorder of their own.
    ///
    /// # Examples
    ///
    /// ```
    /// # let timer = sharded_timer::ShardedTimer::builder().shards(1).build()?;
    /// // With a recorder installed (metrics_exporter_prometheus, …), once a second:
    /// timer.record_metrics();
    /// # Ok::<(), sharded_timer::BuildError>(())
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn record_metrics(&self) {
        use metrics::Unit;
        let stats = self.stats();
        let counters = [
            (
                "sharded_timer_scheduled_total",
                stats.scheduled,
                "Timers the shards have taken in (a repeating timer once)",
            ),
            (
                "sharded_timer_fired_total",
                stats.fired,
                "Timers fired, and runs of repeating timers",
            ),
            (
                "sharded_timer_cancelled_total",
                stats.cancelled,
                "Timers cancelled and processed by their shard",
            ),
            (
                "sharded_timer_panicked_total",
                stats.panicked,
                "Callbacks that panicked (caught and counted)",
            ),
            (
                "sharded_timer_skipped_total",
                stats.skipped,
                "Runs of repeating timers skipped, a whole period behind",
            ),
            (
                "sharded_timer_ring_full_waits_total",
                stats.ring_full_waits,
                "Pushes that found a shard's ring full and waited",
            ),
        ];
        for (name, value, help) in counters {
            metrics::describe_counter!(name, Unit::Count, help);
            metrics::counter!(name).absolute(value);
        }
        metrics::describe_gauge!(
            "sharded_timer_pending",
            Unit::Count,
            "Timers pending: neither fired, cancelled nor handed back"
        );
        metrics::describe_gauge!(
            "sharded_timer_in_rings",
            Unit::Count,
            "Timers in the shards' insert rings, not yet taken in"
        );
        metrics::describe_gauge!(
            "sharded_timer_shard_pending",
            Unit::Count,
            "Timers pending on one shard (label shard)"
        );
        metrics::describe_histogram!(
            "sharded_timer_lateness_seconds",
            Unit::Seconds,
            "How long after its deadline each timer fired (the upper bound of its bucket)"
        );
        metrics::gauge!("sharded_timer_pending").set(stats.pending as f64);
        metrics::gauge!("sharded_timer_in_rings").set(stats.in_rings as f64);
        for (index, shard) in stats.shards.iter().enumerate() {
            metrics::gauge!("sharded_timer_shard_pending", "shard" => index.to_string())
                .set(shard.pending as f64);
        }
        let mut exported = self
            .inner
            .exported
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let lateness = metrics::histogram!("sharded_timer_lateness_seconds");
        for (upper, count) in stats.lateness.buckets_since(&exported) {
            lateness.record_many(upper.as_secs_f64(), count as usize);
        }
        *exported = stats.lateness;
    }

    /// The counters as they stand, waking nothing (for `Debug`).
    fn counters(&self) -> Stats {
        let mut stats = Stats::default();
        let mut lateness = LatenessHistogram::default();
        for shard in self.inner.shards.iter() {
            let load = shard.load();
            // A repeating timer counts once in `scheduled`, and leaves `pending` only
            // when it is cancelled or handed back: its runs count in `fired` alone.
            let scheduled = load.scheduled.saturating_sub(load.refiled);
            let pending = scheduled.saturating_sub(
                load.fired.saturating_sub(load.runs) + load.cancelled + load.returned,
            );
            stats.scheduled += scheduled;
            stats.pending += pending;
            stats.fired += load.fired;
            stats.cancelled += load.cancelled;
            stats.in_rings += load.in_ring;
            stats.ring_full_waits += load.ring_full_waits;
            stats.skipped += load.skipped;
            lateness.merge(&load.lateness);
            stats.shards.push(ShardLoad {
                pending,
                in_ring: load.in_ring,
                fired: load.fired,
                ring_full_waits: load.ring_full_waits,
                lateness: load.lateness,
            });
        }
        // ORDERING: Relaxed: a statistic.
        stats.panicked =
            self.inner.executor.panicked() + self.inner.callback_panics.load(Ordering::Relaxed);
        stats.lateness = lateness;
        stats
    }

    /// Stops the service and returns every timer still pending, in wheels or rings.
    ///
    /// After `shutdown` starts, [`schedule`](Self::schedule) returns
    /// [`ScheduleError::Shutdown`]. Callbacks already handed to the executor finish
    /// before `shutdown` returns, and all threads are joined. Idempotent: later calls
    /// return an empty vector. Called from a callback, it does not wait for that
    /// callback itself; the callbacks queued behind it run on the calling thread before
    /// `shutdown` returns. The timers of [`sleep`](Self::sleep)s and
    /// [`timeout`](Self::timeout)s are not handed back: those futures complete (not
    /// elapsed) instead.
    ///
    /// # Panics
    ///
    /// Only if a shard thread panicked (an internal invariant failed); the panic is
    /// propagated.
    pub fn shutdown(&self) -> Vec<Unfired> {
        self.inner.shut_down()
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

#[cfg(test)]
mod tests {
    use super::thread_name;
    use std::time::Duration;

    /// Set in the child process of the test below.
    const UNWIND_CHILD: &str = "SHARDED_TIMER_SHARD_UNWIND_CHILD";

    /// A shard thread whose internal invariant fails aborts the process instead of
    /// unwinding: its shard would be freed by the join and the handle's `cancel`
    /// below would write through a dangling pointer (`ShardShared::port`). The child
    /// process makes its shard fail; the parent sees it abort, before the cancel.
    #[test]
    fn a_shard_thread_that_fails_aborts_the_process_so_no_handle_dangles() {
        if std::env::var_os(UNWIND_CHILD).is_some() {
            let timer = super::ShardedTimer::builder()
                .shards(1)
                .executor_threads(1)
                .pin_cores(false)
                .build()
                .unwrap();
            let handle = timer.schedule(Duration::from_secs(60), || {}).unwrap();
            let shard = &timer.inner.shards[0];
            shard
                .fail_turn
                .store(true, std::sync::atomic::Ordering::Relaxed);
            shard.nudge();
            std::thread::sleep(Duration::from_secs(20));
            // Not reached: the abort comes first. Were it reached, the shard would be
            // gone and this cancel would use it.
            drop(timer.shutdown());
            let _ = handle.cancel();
            std::process::exit(0);
        }
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "timer::tests::a_shard_thread_that_fails_aborts_the_process_so_no_handle_dangles",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(UNWIND_CHILD, "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            output.status.signal(),
            Some(6),
            "the child aborted (SIGABRT): {:?}\n{stderr}",
            output.status
        );
        assert!(stderr.contains("a shard thread panicked"), "{stderr}");
    }

    #[test]
    fn thread_names_fit_in_fifteen_bytes_and_keep_their_role_and_index() {
        assert_eq!(thread_name("timer", 's', 0), "timer-s0");
        assert_eq!(thread_name("timer", 'w', 15), "timer-w15");
        // The prefix is cut, never the role and index.
        assert_eq!(thread_name("request-timeouts", 's', 3), "request-time-s3");
        assert_eq!(thread_name("request-timeouts", 'w', 127), "request-ti-w127");
        // At a character boundary: "é" is two bytes and would straddle byte 12.
        assert_eq!(thread_name("aaaaaaaaaaaé", 's', 1), "aaaaaaaaaaa-s1");
        assert_eq!(thread_name("", 's', 1), "-s1");
        for index in [0, 9, 10, 99, 100, 9_999, usize::MAX] {
            for prefix in ["", "t", "sharded-timer", "ééééééééééééééé"] {
                let name = thread_name(prefix, 'w', index);
                assert!(name.len() <= 15 || index == usize::MAX, "{name}");
                assert!(name.ends_with(&format!("-w{index}")), "{name}");
            }
        }
    }
}
