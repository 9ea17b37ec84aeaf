//! A drop-in for `tokio::time`: the same names, on the *current* service (this
//! thread's, else the process-wide one), with tokio's paused time for tests.
//! Switching is an import change (`tokio::time` → `sharded_timer::time`); tests keep
//! their attributes, `#[tokio::test(start_paused = true)]` included (feature `tokio`).
//! Every item has tokio's signature: every instant in or out is a [`time::Instant`](Instant).
//!
//! | item | as tokio's |
//! | --- | --- |
//! | [`sleep`], [`sleep_until`], [`timeout`], [`timeout_at`], [`interval`], [`interval_at`] | the same signatures and defaults ([`MissedTickBehavior::Burst`]); instants are [`Instant`]s, as tokio's (`std_instant.into()` infers as with tokio) |
//! | [`Sleep`], [`Timeout`], [`Interval`], [`MissedTickBehavior`], [`error::Elapsed`], [`Duration`] | the types (`Elapsed` converts into `std::io::Error`, kind `TimedOut`) |
//! | [`Instant`] | a newtype: `now()` reads the current service's clock, so code that reads it sees paused time in tests; it also compares with a `std::time::Instant` |
//! | [`pause`], [`resume`], [`advance`] | paused time, per thread, auto-advancing (feature `tokio`) |
//!
//! **Which service.** [`ShardedTimer::enter`] makes a service the current one on this
//! thread until its guard drops; a thread whose time is paused uses its paused
//! service; any other thread uses [`global`]. Paused time is the paused thread's
//! alone, not its runtime's (tokio's): a `spawn_blocking` closure of a paused runtime
//! runs on another thread, so it reads [`global`]'s clock, the system clock (tokio's
//! reads the paused one). A runtime's worker threads are given a service with tokio's
//! `Builder::on_thread_start`:
//!
//! ```
//! use sharded_timer::ShardedTimer;
//!
//! let timer = ShardedTimer::builder().shards(1).build()?;
//! let for_workers = timer.clone();
//! let runtime = tokio::runtime::Builder::new_multi_thread()
//!     .worker_threads(2)
//!     // The guard lives as long as the worker thread: leak it there.
//!     .on_thread_start(move || std::mem::forget(for_workers.enter()))
//!     .enable_all()
//!     .build()?;
//! runtime.block_on(async {
//!     // On a worker thread: `timer`'s clock and shards.
//!     let ticked = tokio::spawn(async {
//!         sharded_timer::time::sleep(std::time::Duration::from_millis(1)).await;
//!     });
//!     ticked.await.unwrap();
//! });
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **One service per process, cloned.** Each [`ShardedTimer`] runs its own shard
//! threads (as Netty warns of `HashedWheelTimer`), so a program builds one and clones
//! it, or uses the process-wide one. [`global`] builds it with the defaults on first
//! use; [`Builder::build_global`] configures it, before that first use. It is never
//! shut down (it lives as long as the process): calling `shutdown` on it stops it for
//! every user of the process, after which these functions' futures complete at once.
//!
//! # Paused time
//!
//! [`pause`] gives the calling thread a service of its own on a fresh
//! [`ManualClock`](crate::ManualClock) (one shard, callbacks inline, no pool): every
//! test thread of a binary pauses its own clock, so tests running in parallel never
//! share one. Inside a tokio runtime (feature `tokio`) it also pauses tokio's clock,
//! and from then on, inside that runtime, ours **is** tokio's paused clock:
//!
//! - every read of ours (a poll of a [`Sleep`], [`Interval`] or [`Timeout`],
//!   [`Instant::now`], arming a timer, a reset) first catches up with tokio's;
//! - every change of the earliest deadline (arming, a [`Sleep::reset`] earlier in
//!   place, an interval re-armed) reaches what drives auto-advance: a task of the
//!   crate (the *mirror*) sleeps on tokio's clock until our earliest timer
//!   ([`ManualClock::next_deadline`](crate::ManualClock::next_deadline)) and moves
//!   ours to tokio's when it wakes, so tokio **auto-advances** to our timers as to
//!   its own (when the runtime has no task to run, no `spawn_blocking` task is
//!   running, and no wake-up came in);
//! - deadlines fall on tokio's 1 ms grid, as tokio's own timers do: a timer fires
//!   once the clock reaches the 1 ms tick at or after its deadline. (Tokio does not
//!   say where its grid lies; a runtime built paused starts on it, and a clock we
//!   paused ourselves inside a running runtime is taken to lie a nanosecond past a
//!   tick, so deadlines a whole number of milliseconds from where it stood fire a
//!   tick later, as tokio's do.)
//!
//! With feature `tokio`, each call of this module inside a runtime looks up the
//! runtime and reads tokio's clock twice (to see whether it is paused): a cost beside a
//! timer's, and none without the feature.
//!
//! A runtime whose tokio clock is paused without our [`pause`] (built with
//! `start_paused` by `#[tokio::test(start_paused = true)]`, `#[tokio::main(..)]` or
//! `#[sharded_timer::test(..)]`, or paused by tokio's own `pause()`) is followed the
//! same way from the first read of our time there.
//!
//! Paused time belongs to the runtime it began in, as tokio's paused clock does:
//! another runtime on the same thread runs on real time (or its own paused clock);
//! between `block_on`s, outside every runtime, the paused clock stands still (it moves
//! only with [`advance`]); once the runtime is dropped, its paused service is shut
//! down and the thread uses the entered service or [`global`] again, so one thread
//! may run paused runtimes in turn (a runtime per test case). Paused time begun
//! outside any runtime (or without the feature) moves only with [`advance`], fires
//! each deadline to the nanosecond, and lasts until the thread ends.
//!
//! ```
//! # #[cfg(feature = "tokio")]
//! # fn main() {
//! use sharded_timer::time::{self, Duration, Instant};
//!
//! #[sharded_timer::main(flavor = "current_thread", start_paused = true)]
//! async fn main() {
//!     let start = Instant::now();
//!     time::sleep(Duration::from_secs(3600)).await; // returns at once
//!     assert_eq!(start.elapsed(), Duration::from_secs(3600));
//! }
//! # main()
//! # }
//! # #[cfg(not(feature = "tokio"))]
//! # fn main() {}
//! ```

#![forbid(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::IntoFuture;
use std::marker::PhantomData;
use std::sync::OnceLock;

pub use crate::clock::TimeInstant as Instant;
pub use crate::future::{Sleep, Timeout};
pub use crate::interval::{Interval, MissedTickBehavior};
pub use paused::{advance, pause, resume};
pub use std::time::Duration;

mod paused;

#[cfg(feature = "tokio")]
#[doc(hidden)]
pub use paused::__pause_if;

use crate::{BuildError, Builder, ShardedTimer};

/// tokio's `time::error`: the error of a [`Timeout`].
pub mod error {
    pub use crate::future::Elapsed;
}

/// The process-wide service, once built.
static GLOBAL: OnceLock<ShardedTimer> = OnceLock::new();

/// The process-wide service: built with the defaults ([`ShardedTimer::new`]) on first
/// use, unless [`Builder::build_global`] built it first; never shut down. It starts
/// its shard threads then, and its callback pool's workers only when the first
/// fired timer is handed to the pool (a process that never fires a timer, its
/// sleeps and timeouts included, starts none).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// let handle = sharded_timer::global()
///     .schedule(Duration::from_secs(30), || println!("timed out"))?;
/// assert!(handle.cancel());
/// # Ok::<(), sharded_timer::ScheduleError>(())
/// ```
///
/// # Panics
///
/// Only if the operating system cannot start the service's threads on first use (as
/// [`ShardedTimer::new`]); call [`Builder::build_global`] first to handle that as an
/// error.
pub fn global() -> &'static ShardedTimer {
    GLOBAL.get_or_init(|| match Builder::default().pool_on_demand().build() {
        Ok(timer) => timer,
        Err(error) => panic!("sharded-timer could not start: {error}"),
    })
}

impl Builder {
    /// Builds this configuration as the process-wide service that [`global`] and the
    /// [`time`](crate::time) functions use. Call it before their first use.
    ///
    /// # Errors
    ///
    /// [`BuildError::GlobalExists`] if the process-wide service exists already (an
    /// earlier call, or a first use of [`global`]); otherwise as
    /// [`build`](Self::build). A service built by a call that lost a race to another
    /// is shut down again.
    pub fn build_global(self) -> Result<&'static ShardedTimer, BuildError> {
        if GLOBAL.get().is_some() {
            return Err(BuildError::GlobalExists);
        }
        match GLOBAL.set(self.pool_on_demand().build()?) {
            // Set by this call, so `get` finds it.
            Ok(()) => GLOBAL.get().ok_or(BuildError::GlobalExists),
            Err(lost) => {
                drop(lost.shutdown());
                Err(BuildError::GlobalExists)
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// The current service.

std::thread_local! {
    /// The services [`ShardedTimer::enter`] made current on this thread, each with
    /// its guard's number, oldest first: the last is the current one.
    static ENTERED: RefCell<Vec<(u64, ShardedTimer)>> = const { RefCell::new(Vec::new()) };
    /// The number of this thread's next [`EnterGuard`].
    static NEXT_GUARD: Cell<u64> = const { Cell::new(0) };
}

/// Makes a service the current one on this thread until dropped; made by
/// [`ShardedTimer::enter`]. While guards nest, the service of the most recent guard
/// still alive is current; dropping a guard removes its own service wherever it
/// stands, so guards may drop in any order (tokio's panics when they drop out of
/// order). Not `Send`: it belongs to the thread it was made on.
#[must_use = "the service is current only until the guard drops"]
pub struct EnterGuard {
    /// This guard's number among the thread's guards.
    number: u64,
    /// `!Send`, `!Sync`.
    _thread: PhantomData<*const ()>,
}

impl Drop for EnterGuard {
    fn drop(&mut self) {
        // The entered clone is dropped here, after the borrow: dropping a service's
        // last clone shuts it down, which must not run under the borrow.
        let entered = ENTERED.with(|entered| {
            let mut entered = entered.try_borrow_mut().ok()?;
            let at = entered
                .iter()
                .rposition(|(number, _)| *number == self.number)?;
            Some(entered.remove(at))
        });
        drop(entered);
    }
}

impl fmt::Debug for EnterGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnterGuard")
            .field("number", &self.number)
            .finish()
    }
}

impl ShardedTimer {
    /// Makes this service the current one on this thread until the guard drops (as
    /// tokio's `Runtime::enter`): the [`time`](crate::time) functions and
    /// [`time::Instant::now`](Instant::now) use it instead of [`global`]. Guards nest:
    /// the service of the most recent guard still alive is current, so dropping
    /// guards in the reverse order restores each service current before; dropping
    /// them in another order is allowed too (tokio's panics), and once every guard is
    /// gone no service is entered. A thread whose time is paused ([`pause`]) keeps
    /// using its paused service. See the [module](crate::time) docs for giving a
    /// runtime's worker threads a service.
    ///
    /// # Panics
    ///
    /// Never.
    pub fn enter(&self) -> EnterGuard {
        let number = NEXT_GUARD.with(|next| {
            let number = next.get();
            next.set(number.wrapping_add(1));
            number
        });
        ENTERED.with(|entered| {
            if let Ok(mut entered) = entered.try_borrow_mut() {
                entered.push((number, self.clone()));
            }
        });
        EnterGuard {
            number,
            _thread: PhantomData,
        }
    }
}

/// Runs `f` on the current service: this thread's current pause's (its clock first
/// brought up to tokio's, when it follows tokio's: `paused.rs`), else the entered
/// one, else [`global`].
fn with_current<R>(f: impl FnOnce(&ShardedTimer) -> R) -> R {
    if let Some(paused) = paused::current() {
        paused.catch_up();
        return f(&paused.timer);
    }
    let mut f = Some(f);
    let entered = ENTERED.with(|entered| {
        let entered = entered.try_borrow().ok()?;
        let (_, entered) = entered.last()?;
        f.take().map(|f| f(entered))
    });
    match (entered, f) {
        (Some(result), _) => result,
        (None, Some(f)) => f(global()),
        (None, None) => unreachable!("`f` is taken only by an entered service, which returned"),
    }
}

// ---------------------------------------------------------------------------------
// Instant's reads of the current service (the type is `clock/instant.rs`).

impl Instant {
    /// The current service's now: this thread's paused time, the entered service's
    /// clock, or the system clock (the process-wide service's).
    ///
    /// # Panics
    ///
    /// As [`global`], if it is the first use of the process-wide service.
    pub fn now() -> Instant {
        Instant::from_std(with_current(ShardedTimer::now))
    }

    /// The time since this instant on the current service's clock
    /// ([`now`](Self::now)); zero if it is in the future.
    ///
    /// # Panics
    ///
    /// As [`now`](Self::now).
    pub fn elapsed(&self) -> Duration {
        Instant::now().saturating_duration_since(*self)
    }
}

// ---------------------------------------------------------------------------------
// The free functions.

/// [`ShardedTimer::sleep`] on the current service: tokio's `time::sleep`. As tokio's
/// on the system clock, a sleep whose deadline passed less than 1 ms before its first
/// poll (`sleep(Duration::ZERO)`) yields once there, waking its task, and completes at
/// the next poll (tasks already woken run first); one further in the past completes
/// at its first poll. The same holds for [`sleep_until`], [`timeout`] and
/// [`timeout_at`]. ([`ShardedTimer::sleep`] itself completes at once.)
///
/// # Panics
///
/// As [`global`], if it is the first use of the process-wide service.
pub fn sleep(duration: Duration) -> Sleep {
    with_current(|timer| timer.sleep(duration)).yielding_as_tokio()
}

/// [`ShardedTimer::sleep_until`] on the current service: tokio's `time::sleep_until`,
/// with its signature (an [`Instant`]; a `std::time::Instant` converts with
/// `.into()`, which infers as with tokio).
///
/// # Panics
///
/// As [`global`], if it is the first use of the process-wide service.
pub fn sleep_until(deadline: Instant) -> Sleep {
    with_current(|timer| timer.sleep_until(deadline)).yielding_as_tokio()
}

/// [`ShardedTimer::timeout`] on the current service: tokio's `time::timeout`.
///
/// # Panics
///
/// As [`global`], if it is the first use of the process-wide service.
pub fn timeout<F: IntoFuture>(duration: Duration, future: F) -> Timeout<F::IntoFuture> {
    with_current(|timer| timer.timeout(duration, future)).yielding_as_tokio()
}

/// [`ShardedTimer::timeout_at`] on the current service: tokio's `time::timeout_at`.
///
/// # Panics
///
/// As [`global`], if it is the first use of the process-wide service.
pub fn timeout_at<F: IntoFuture>(deadline: Instant, future: F) -> Timeout<F::IntoFuture> {
    with_current(|timer| timer.timeout_at(deadline, future)).yielding_as_tokio()
}

/// [`ShardedTimer::interval`] on the current service: tokio's `time::interval`
/// (missed ticks default to [`MissedTickBehavior::Burst`], as tokio's).
///
/// # Panics
///
/// If `period` is zero, as tokio's (at the caller: `#[track_caller]`;
/// [`ShardedTimer::interval`] raises it to the tick instead); as [`global`], if it is
/// the first use of the process-wide service.
#[track_caller]
pub fn interval(period: Duration) -> Interval {
    assert!(period > Duration::ZERO, "`period` must be non-zero.");
    with_current(|timer| timer.interval(period)).with_exact_period(period)
}

/// [`ShardedTimer::interval_at`] on the current service: tokio's
/// `time::interval_at`.
///
/// # Panics
///
/// As [`interval`].
#[track_caller]
pub fn interval_at(start: Instant, period: Duration) -> Interval {
    assert!(period > Duration::ZERO, "`period` must be non-zero.");
    with_current(|timer| timer.interval_at(start, period)).with_exact_period(period)
}
