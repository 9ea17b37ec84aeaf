//! Where callbacks run, as the user configures it: [`Callbacks`] chooses, per service,
//! between the built-in work-stealing pool, the shard thread that fired them (Netty's
//! model), an executor of the user's own, which receives each fired timer as a
//! [`Callback`], and rayon. Pure configuration: [`Dispatch`](super::Dispatch) is what a
//! shard builds from it.

#![forbid(unsafe_code)]

use std::fmt;

use super::{Callback, Spawner};

/// Where a service runs its callbacks; give it to
/// [`Builder::callbacks`](crate::Builder::callbacks).
///
/// - [`pool(n)`](Self::pool) (the default, with one thread per available core): a
///   built-in work-stealing pool of `n` threads. A slow callback delays only the
///   callbacks queued behind it on that worker; the shards keep time.
/// - [`inline()`](Self::inline): on the shard thread that fired the timer, in deadline
///   order, with no hand-off — the fastest way to fire many short callbacks (Netty's
///   HashedWheelTimer runs its callbacks this way). A slow callback delays that
///   shard's later timers until [`Builder::rescue_after`](crate::Builder::rescue_after)
///   (default 4 ticks): then the shard that watches it fires them on its own thread.
/// - [`spawn(f)`](Self::spawn): each fired timer is handed to `f` as a [`Callback`]
///   on the shard thread; `f` sends it to an executor of your own (rayon, tokio's
///   `spawn_blocking`, a queue) and returns. `f` should be quick: it runs on the shard.
///
/// **Futures.** A [`Sleep`](crate::Sleep), [`Timeout`](crate::Timeout) or
/// [`Interval`](crate::Interval) tick is woken on the shard thread that fired its
/// timer in every mode (its shard's rescuer if that shard is stuck), as tokio's timer
/// driver wakes tasks on its own thread: the wake only schedules the task on its own
/// executor, and a hand-off would add a second thread's wake-up per timer. So these
/// modes decide where `schedule*` callbacks run. Where no shard watches another (one
/// shard, [`Builder::rescue_after`](crate::Builder::rescue_after)`(None)`, a
/// [`ManualClock`](crate::ManualClock)), a wake leaves as the mode says, as a callback
/// does: nothing would rescue a shard stuck in a waker. A program that uses the timer
/// only through futures may pick `inline()` all the same: it starts no pool threads.
///
/// What [`shutdown`](crate::ShardedTimer::shutdown) waits for: with the pool, every
/// callback already handed to it; inline, every callback already fired (a callback
/// that calls `shutdown` itself does not wait for itself, and the callbacks fired with
/// it run before its `shutdown` returns); with a spawner, every fired timer has been
/// handed to the spawner — but not run: shutdown cannot wait for your executor, and a
/// `Callback` stays runnable after shutdown and after the service is dropped.
///
/// # Examples
///
/// ```
/// use std::sync::mpsc;
/// use std::time::Duration;
/// use sharded_timer::{Callbacks, ShardedTimer};
///
/// // Inline: callbacks run on the shard thread.
/// let timer = ShardedTimer::builder().callbacks(Callbacks::inline()).build()?;
/// let (tx, rx) = mpsc::channel();
/// timer.schedule(Duration::from_millis(1), move || tx.send(()).unwrap())?;
/// rx.recv_timeout(Duration::from_secs(5))?;
///
/// // Your own executor: here a plain channel that a thread of yours drains.
/// let (queue, callbacks) = mpsc::channel::<sharded_timer::Callback>();
/// let queue = std::sync::Mutex::new(queue);
/// let timer = ShardedTimer::builder()
///     .callbacks(Callbacks::spawn(move |callback| {
///         let _ = queue.lock().unwrap().send(callback);
///     }))
///     .build()?;
/// timer.schedule(Duration::from_millis(1), || println!("fired"))?;
/// callbacks.recv_timeout(Duration::from_secs(5))?.run();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Callbacks(pub(crate) Mode);

/// The choice inside [`Callbacks`].
#[derive(Clone)]
pub(crate) enum Mode {
    /// The built-in pool, with this many threads.
    Pool(usize),
    /// On the shard thread.
    Inline,
    /// Handed to the user's spawner.
    Spawn(Spawner),
    /// Spawned on a rayon pool, in batches.
    #[cfg(feature = "rayon")]
    Rayon(std::sync::Arc<rayon::ThreadPool>),
}

impl Callbacks {
    /// The built-in work-stealing pool of `threads` threads (the default, with one
    /// per available core). [`Builder::executor_threads(n)`](crate::Builder::executor_threads)
    /// is the short form. Zero threads makes [`build`](crate::Builder::build) fail.
    pub fn pool(threads: usize) -> Callbacks {
        Callbacks(Mode::Pool(threads))
    }

    /// Callbacks run on the shard thread that fired them, in deadline order (Netty's
    /// model): no hand-off, no pool threads. A slow callback delays that shard's later
    /// timers, for at most [`Builder::rescue_after`](crate::Builder::rescue_after) while
    /// rescue is on: then the shard that watches it runs them on its own thread, one
    /// at a time in deadline order among themselves, beside the slow one. So a shard's
    /// callbacks never overlap, except beside one that has itself run longer than
    /// `rescue_after`. Panics are caught and counted in
    /// [`Stats::panicked`](crate::Stats::panicked). `schedule`, `cancel`, `reset` and
    /// `shutdown` work from inside; `shutdown` there returns every pending timer, the
    /// calling shard's included, as [`Unfired`](crate::Unfired).
    pub fn inline() -> Callbacks {
        Callbacks(Mode::Inline)
    }

    /// Each fired timer is handed to `spawner` as a [`Callback`], on the shard thread
    /// that fired it, in deadline order; the spawner sends it where it should run and
    /// returns. A spawner that panics drops the callback unrun; the panic is caught and
    /// counted in [`Stats::panicked`](crate::Stats::panicked). A future's wake dropped
    /// unrun (by a spawner that panics, or drops it) still completes its
    /// [`Sleep`](crate::Sleep) elapsed, waking its task on the dropping thread: the
    /// timer fired, so the deadline has passed.
    ///
    /// `shutdown` waits for the hand-over, not for the runs: a [`Callback`] stays
    /// runnable after it. So a repeating timer whose run is handed over (or under way)
    /// when `shutdown` starts is not among the [`Unfired`](crate::Unfired) it returns;
    /// that run is its last (its next run, due after the service stopped, is never
    /// filed; the callback is dropped with the service).
    pub fn spawn<S>(spawner: S) -> Callbacks
    where
        S: Fn(Callback) + Send + Sync + 'static,
    {
        Callbacks(Mode::Spawn(std::sync::Arc::new(spawner)))
    }

    /// Callbacks run on a rayon pool: what a shard fires in one pass is
    /// [`spawn`](rayon::ThreadPool::spawn)ed on `pool` in batches of up to 256, each
    /// batch run in deadline order by one rayon job (one job per timer costs a heap
    /// job and a wake-up each, which made a burst 25× slower on 16 cores). Otherwise as
    /// [`spawn`](Self::spawn): panics are caught and counted, and `shutdown` waits for
    /// the hand-over to rayon, not for the runs. Feature `rayon`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use sharded_timer::{Callbacks, ShardedTimer};
    ///
    /// let pool = Arc::new(rayon::ThreadPoolBuilder::new().num_threads(2).build()?);
    /// let timer = ShardedTimer::builder().callbacks(Callbacks::rayon(pool)).build()?;
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// timer.schedule(Duration::from_millis(1), move || tx.send(()).unwrap())?;
    /// rx.recv_timeout(Duration::from_secs(5))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "rayon")]
    #[cfg_attr(docsrs, doc(cfg(feature = "rayon")))]
    pub fn rayon(pool: std::sync::Arc<rayon::ThreadPool>) -> Callbacks {
        Callbacks(Mode::Rayon(pool))
    }
}

impl Default for Callbacks {
    /// [`Callbacks::pool`] with one thread per available core.
    fn default() -> Self {
        Callbacks::pool(std::thread::available_parallelism().map_or(1, usize::from))
    }
}

impl fmt::Debug for Callbacks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Mode::Pool(threads) => f.debug_tuple("Callbacks::pool").field(threads).finish(),
            Mode::Inline => f.write_str("Callbacks::inline"),
            Mode::Spawn(_) => f.write_str("Callbacks::spawn(..)"),
            #[cfg(feature = "rayon")]
            Mode::Rayon(_) => f.write_str("Callbacks::rayon(..)"),
        }
    }
}
