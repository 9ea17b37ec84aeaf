//! The [`Builder`]: a [`ShardedTimer`]'s configuration, its defaults, and `build`,
//! which checks the settings, starts the shard threads (linked in a ring for rescue)
//! and the callback pool, and assembles the service.

use std::time::Duration;

use super::shutdown::Threads;
use super::{Inner, ShardedTimer};
use crate::clock::{Clock, ManualClock, ManualTime, TimeSource};
use crate::dispatch::{Callbacks, Dispatch, Mode, ShardTask};
use crate::entry::HandleOptions;
use crate::error::BuildError;
use crate::executor::{thread_name, Executor};
use crate::home::{CoreHome, Users};
use crate::limit::PendingLimit;
use crate::routing::Routing;
use crate::shard::{ShardShared, ShardThread};
use crate::sync::{thread, Arc, AtomicBool, AtomicU64, Mutex};

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
    /// Which shard a new timer goes to.
    routing: Routing,
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
            routing: Routing::default(),
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

    /// Which shard a new timer goes to: [`Routing::ByCore`] (the calling thread's
    /// core's, the default) or [`Routing::ById`] (the hash of its id). Either way the
    /// caller files it into that shard's wheel itself when the shard's token is free.
    /// Sleeps and timeouts go to their core's shard under both (see [`Routing`]).
    pub fn routing(mut self, routing: Routing) -> Self {
        self.routing = routing;
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
    /// gets [`ScheduleError::TooManyPending`]. Firing and cancelling free room: a
    /// winning [`cancel`](crate::TimerHandle::cancel) before it returns, a fire just
    /// after the timer turns [`Fired`](crate::TimerState::Fired) and before its
    /// callback is handed out. So a callback, or code that learnt of the fire from
    /// it, always finds the room free, while a thread that only polls
    /// [`state`](crate::TimerHandle::state) may see `Fired` a moment before the room
    /// is. A repeating timer holds its room until cancelled.
    /// Default: unbounded (and no shared counter). `0` makes
    /// [`build`](Self::build) fail.
    ///
    /// [`ScheduleError::TooManyPending`]: crate::ScheduleError::TooManyPending
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
                match manual.grid_ns() {
                    // Paused time that follows tokio's: tokio's grid (`time/paused.rs`).
                    Some(grid_ns) => Clock::on_grid(manual.start(), grid_ns, self.tick),
                    None => Clock::manual(manual.start(), self.tick),
                },
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
        let rescue_after = match self.rescue_after {
            None => Some(self.tick.checked_mul(4).unwrap_or(Duration::MAX)),
            Some(after) => after,
        }
        .filter(|_| shards > 1 && manual.is_none());
        // Futures are woken on their shard's thread where a shard stuck in a waker is
        // rescued (`ShardLink::wakes_here`).
        let wakes_here = rescue_after.is_some();
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
                    wakes_here,
                );
                (shard, shard_thread)
            })
            .collect();
        // Every shard thread may push onto every shard: it needs their links to
        // never wait for a full ring of one (`shard::own::make_room`).
        let peers: Vec<_> = threads.iter().map(|(_, thread)| thread.link()).collect();
        // Producers file into a shard's wheel directly when its token is free.
        let direct_ports: Vec<_> = threads
            .iter()
            .map(|(_, thread)| thread.direct_port())
            .collect();
        for (_, thread) in &mut threads {
            thread.set_peers(peers.clone());
        }
        if let Some(after) = rescue_after {
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
                ))
            })
            .collect();
        let inner = Arc::new(Inner {
            #[cfg(feature = "metrics")]
            exported: std::sync::Mutex::default(),
            shards: shared.into_boxed_slice(),
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
            routing: self.routing,
        });
        // The homes are held by the service's users, not by the service (`home.rs`).
        let users = Arc::new(Users::new(homes, inner.clone()));
        Ok(ShardedTimer { inner, users })
    }
}
