//! A drop-in for `tokio::time`: the same names, on the *current* service (this
//! thread's, else the process-wide one), with tokio's paused time for tests.
//! Switching is an import change (`tokio::time` → `sharded_timer::time`), and, for a
//! test that passes `start_paused`, an attribute change (`#[tokio::test]` →
//! `#[sharded_timer::test]`, feature `tokio`).
//!
//! | item | as tokio's |
//! | --- | --- |
//! | [`sleep`], [`sleep_until`], [`timeout`], [`timeout_at`], [`interval`], [`interval_at`] | the same arguments and defaults ([`MissedTickBehavior::Burst`]); instants as [`Instant`] or `std::time::Instant` |
//! | [`Sleep`], [`Timeout`], [`Interval`], [`MissedTickBehavior`], [`error::Elapsed`], [`Duration`] | the types (`Elapsed` converts into `std::io::Error`, kind `TimedOut`) |
//! | [`Instant`] | a newtype: `now()` reads the current service's clock, so code that reads it sees paused time in tests |
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
//! [`ManualClock`] (one shard, callbacks inline, no pool): every test thread of a
//! binary pauses its own clock, so tests running in parallel never share one. Inside
//! a tokio runtime (feature `tokio`) it also pauses tokio's clock, and the two then
//! move together: ours follows tokio's, which tokio **auto-advances** when the runtime
//! has no task to run; a task of the crate (the *mirror*) sleeps on tokio's clock
//! until our earliest timer ([`ManualClock::next_deadline`]) and moves our clock to
//! tokio's when it wakes. So auto-advance relies on exactly what tokio's relies on
//! (tokio's driver advances only when its scheduler has nothing to run, no
//! `spawn_blocking` task is running, and no wake-up came in meanwhile), and on one
//! thing of ours: every timer of the paused service is armed on the paused thread
//! (the free functions' futures are made there, and a `sleep`'s timer is armed where
//! it is made; a `timeout`'s is armed at its first pending poll, which a task on the
//! paused thread's runtime makes there too), since arming one is what tells the
//! mirror to look again. Arming one on the paused thread first brings our clock up to
//! tokio's, so a timeout first polled after tokio's clock passed its deadline elapses
//! at that poll, as tokio's does. A sleep made on the paused thread and re-armed
//! ([`Sleep::reset`]) on another thread is seen only at the mirror's next look.
//! Without a tokio runtime (or without the feature), paused time moves only with
//! [`advance`].
//!
//! Paused time begun inside a tokio runtime belongs to that runtime, as tokio's
//! paused clock does: once the runtime is dropped, the thread's paused service is
//! shut down and the thread uses the entered service or [`global`] again, so one
//! thread may run paused runtimes in turn (a runtime per test case), each pausing
//! afresh, or a plain runtime after a paused one. Paused time begun outside any
//! runtime lasts until the thread ends.
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
use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::ops::{Add, AddAssign, Sub, SubAssign};
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};

pub use crate::future::{Sleep, Timeout};
pub use crate::interval::{Interval, MissedTickBehavior};
pub use std::time::Duration;

use crate::sync::{thread, Arc, Mutex};
use crate::{BuildError, Builder, Callbacks, ManualClock, ShardedTimer};

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
    /// This thread's paused time, once [`pause`] was called on it (until its runtime,
    /// if it paused inside one, is dropped).
    static PAUSED: RefCell<Option<Paused>> = const { RefCell::new(None) };
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

/// Runs `f` on the current service: this thread's paused one (its clock first
/// brought up to tokio's, when it mirrors it), else the entered one, else [`global`].
fn with_current<R>(f: impl FnOnce(&ShardedTimer) -> R) -> R {
    discard_ended_pause();
    let mut f = Some(f);
    let paused = PAUSED.with(|paused| {
        let paused = paused.try_borrow().ok()?;
        let paused = paused.as_ref()?;
        paused.shared.sync();
        f.take().map(|f| f(&paused.timer))
    });
    if let Some(result) = paused {
        return result;
    }
    let Some(f) = f.take() else {
        unreachable!("`f` is taken only by a paused service, which returned");
    };
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
// Instant.

/// A measurement of the current service's clock (tokio's `time::Instant`): opaque,
/// monotonic, and, on a paused thread, paused time.
///
/// A newtype of `std::time::Instant`, into which it converts both ways
/// ([`from_std`](Self::from_std), [`into_std`](Self::into_std), `From`), with which
/// it compares (`==`, `<`) and from which it subtracts (a `Duration`), in either
/// order. The futures' methods return `std::time::Instant` ([`Sleep::deadline`],
/// [`Interval::tick`]; tokio's return its `Instant`), so that code written for them
/// keeps compiling, and accept either: tokio-style code that compares, subtracts or
/// passes them back compiles unchanged; code that stores one where a
/// `time::Instant` is declared, or calls `duration_since(time_instant)` on one, adds
/// `.into()`. (Comparing a `Vec` of `std::time::Instant`s with an untyped `vec![]`
/// needs its type written, since two comparisons now fit.)
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(std::time::Instant);

impl Instant {
    /// The current service's now: this thread's paused time, the entered service's
    /// clock, or the system clock (the process-wide service's).
    ///
    /// # Panics
    ///
    /// As [`global`], if it is the first use of the process-wide service.
    pub fn now() -> Instant {
        Instant(with_current(ShardedTimer::now))
    }

    /// Wraps a `std::time::Instant`.
    pub fn from_std(std: std::time::Instant) -> Instant {
        Instant(std)
    }

    /// The `std::time::Instant` inside.
    pub fn into_std(self) -> std::time::Instant {
        self.0
    }

    /// The time from `earlier` to this instant; zero if `earlier` is later (as
    /// tokio's).
    pub fn duration_since(&self, earlier: Instant) -> Duration {
        self.0.saturating_duration_since(earlier.0)
    }

    /// The time from `earlier` to this instant, or `None` if `earlier` is later.
    pub fn checked_duration_since(&self, earlier: Instant) -> Option<Duration> {
        self.0.checked_duration_since(earlier.0)
    }

    /// The time from `earlier` to this instant; zero if `earlier` is later.
    pub fn saturating_duration_since(&self, earlier: Instant) -> Duration {
        self.0.saturating_duration_since(earlier.0)
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

    /// `self + duration`, or `None` if it does not fit.
    pub fn checked_add(&self, duration: Duration) -> Option<Instant> {
        self.0.checked_add(duration).map(Instant)
    }

    /// `self - duration`, or `None` if it does not fit.
    pub fn checked_sub(&self, duration: Duration) -> Option<Instant> {
        self.0.checked_sub(duration).map(Instant)
    }
}

impl From<std::time::Instant> for Instant {
    fn from(std: std::time::Instant) -> Instant {
        Instant(std)
    }
}

impl From<Instant> for std::time::Instant {
    fn from(instant: Instant) -> std::time::Instant {
        instant.0
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;

    /// # Panics
    ///
    /// If the result does not fit (as `std::time::Instant`'s).
    fn add(self, other: Duration) -> Instant {
        Instant(self.0 + other)
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, other: Duration) {
        *self = *self + other;
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;

    /// # Panics
    ///
    /// If the result does not fit (as `std::time::Instant`'s).
    fn sub(self, other: Duration) -> Instant {
        Instant(self.0 - other)
    }
}

impl SubAssign<Duration> for Instant {
    fn sub_assign(&mut self, other: Duration) {
        *self = *self - other;
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;

    /// Saturating, as tokio's: zero if `other` is later.
    fn sub(self, other: Instant) -> Duration {
        self.0.saturating_duration_since(other.0)
    }
}

impl Sub<std::time::Instant> for Instant {
    type Output = Duration;

    /// Saturating: zero if `other` is later.
    fn sub(self, other: std::time::Instant) -> Duration {
        self.0.saturating_duration_since(other)
    }
}

impl Sub<Instant> for std::time::Instant {
    type Output = Duration;

    /// Saturating: zero if `other` is later.
    fn sub(self, other: Instant) -> Duration {
        self.saturating_duration_since(other.0)
    }
}

impl PartialEq<std::time::Instant> for Instant {
    fn eq(&self, other: &std::time::Instant) -> bool {
        self.0 == *other
    }
}

impl PartialEq<Instant> for std::time::Instant {
    fn eq(&self, other: &Instant) -> bool {
        *self == other.0
    }
}

impl PartialOrd<Instant> for std::time::Instant {
    fn partial_cmp(&self, other: &Instant) -> Option<std::cmp::Ordering> {
        self.partial_cmp(&other.0)
    }
}

impl PartialOrd<std::time::Instant> for Instant {
    fn partial_cmp(&self, other: &std::time::Instant) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(other)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

// ---------------------------------------------------------------------------------
// The free functions.

/// [`ShardedTimer::sleep`] on the current service: tokio's `time::sleep`.
///
/// # Panics
///
/// As [`global`], if it is the first use of the process-wide service.
pub fn sleep(duration: Duration) -> Sleep {
    with_current(|timer| timer.sleep(duration))
}

/// [`ShardedTimer::sleep_until`] on the current service: tokio's `time::sleep_until`
/// (an [`Instant`] or a `std::time::Instant`).
///
/// # Panics
///
/// As [`global`], if it is the first use of the process-wide service.
pub fn sleep_until(deadline: impl Into<Instant>) -> Sleep {
    let deadline = deadline.into();
    with_current(|timer| timer.sleep_until(deadline))
}

/// [`ShardedTimer::timeout`] on the current service: tokio's `time::timeout`.
///
/// # Panics
///
/// As [`global`], if it is the first use of the process-wide service.
pub fn timeout<F: IntoFuture>(duration: Duration, future: F) -> Timeout<F::IntoFuture> {
    with_current(|timer| timer.timeout(duration, future))
}

/// [`ShardedTimer::timeout_at`] on the current service: tokio's `time::timeout_at`.
///
/// # Panics
///
/// As [`global`], if it is the first use of the process-wide service.
pub fn timeout_at<F: IntoFuture>(
    deadline: impl Into<Instant>,
    future: F,
) -> Timeout<F::IntoFuture> {
    let deadline = deadline.into();
    with_current(|timer| timer.timeout_at(deadline, future))
}

/// [`ShardedTimer::interval`] on the current service: tokio's `time::interval`
/// (missed ticks default to [`MissedTickBehavior::Burst`], as tokio's; a zero `period`
/// is raised to the service's tick instead of panicking).
///
/// # Panics
///
/// As [`global`], if it is the first use of the process-wide service.
pub fn interval(period: Duration) -> Interval {
    with_current(|timer| timer.interval(period))
}

/// [`ShardedTimer::interval_at`] on the current service: tokio's
/// `time::interval_at`.
///
/// # Panics
///
/// As [`global`], if it is the first use of the process-wide service.
pub fn interval_at(start: impl Into<Instant>, period: Duration) -> Interval {
    let start = start.into();
    with_current(|timer| timer.interval_at(start, period))
}

// ---------------------------------------------------------------------------------
// Paused time.

/// A thread's paused time: its service and what the mirror shares.
struct Paused {
    /// The thread's service, on `shared.clock`.
    timer: ShardedTimer,
    /// The clock and its state.
    shared: Arc<PauseShared>,
}

/// What a paused thread, its mirror task and its pacer share.
struct PauseShared {
    /// The paused service's clock.
    clock: ManualClock,
    /// Everything that changes.
    state: Mutex<PauseState>,
}

/// How a paused clock moves.
#[derive(Clone, Copy, Debug)]
enum Pace {
    /// Only with `advance` (no tokio runtime to follow).
    Frozen,
    /// Following real time from `real` on (after [`resume`] without a runtime): the
    /// clock reads `at` plus the real time since `real`.
    Real {
        /// The real instant of the resume.
        real: std::time::Instant,
        /// The clock's instant then.
        at: std::time::Instant,
    },
    /// Following tokio's clock, paused or not: our now is `at` plus the time tokio's
    /// clock has moved since it read `tokio_at`.
    #[cfg(feature = "tokio")]
    Tokio {
        /// Tokio's instant when the pause began.
        tokio_at: tokio::time::Instant,
        /// Our clock's instant then.
        at: std::time::Instant,
    },
}

/// The state under [`PauseShared`]'s lock.
#[derive(Debug)]
struct PauseState {
    /// How the clock moves.
    pace: Pace,
    /// Whether time is paused now (between `pause` and `resume`).
    frozen: bool,
    /// The instant the mirror sleeps until (`None`: no timer to wait for).
    target: Option<std::time::Instant>,
    /// The mirror's waker, to make it look again.
    mirror: Option<Waker>,
    /// Set when the mirror must look again.
    look_again: bool,
    /// Set when the tokio runtime the pause began in was dropped: the paused time
    /// is over, and the thread's next lookup discards it.
    ended: bool,
}

impl PauseShared {
    /// The lock (a poisoned one is taken over: every update is an assignment).
    fn lock(&self) -> crate::sync::MutexGuard<'_, PauseState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where the clock should be now, by its pace; `None` while frozen.
    fn due_now(&self) -> Option<std::time::Instant> {
        let state = self.lock();
        match state.pace {
            Pace::Frozen => None,
            Pace::Real { real, at } => Some(at + real.elapsed()),
            #[cfg(feature = "tokio")]
            Pace::Tokio { tokio_at, at } => {
                Some(at + tokio::time::Instant::now().saturating_duration_since(tokio_at))
            }
        }
    }

    /// Moves the clock up to where its pace says it is (never back).
    fn sync(&self) {
        let Some(due) = self.due_now() else { return };
        let behind = due.saturating_duration_since(self.clock.now());
        if !behind.is_zero() {
            self.clock.advance(behind);
        }
    }

    /// A timer due at `deadline` was armed: the mirror looks again if it waits for a
    /// later one (or none).
    fn armed(&self, deadline: std::time::Instant) {
        let mut state = self.lock();
        if state.target.is_some_and(|target| target <= deadline) {
            return;
        }
        state.look_again = true;
        let mirror = state.mirror.take();
        drop(state);
        if let Some(mirror) = mirror {
            mirror.wake();
        }
    }
}

/// A paused thread's listener for timers armed on it (`clock::ArmedListener`).
struct PausedListener(Arc<PauseShared>);

impl crate::clock::ArmedListener for PausedListener {
    fn catch_up(&self) {
        self.0.sync();
    }

    fn armed(&self, deadline: std::time::Instant) {
        self.0.armed(deadline);
    }
}

/// Ends a thread's paused time when dropped: owned by a task on the tokio runtime
/// the pause began in, which the runtime drops as it shuts down.
#[cfg(feature = "tokio")]
struct EndsWithRuntime(Arc<PauseShared>);

#[cfg(feature = "tokio")]
impl Drop for EndsWithRuntime {
    fn drop(&mut self) {
        self.0.lock().ended = true;
    }
}

/// Discards this thread's paused time if it has ended (its runtime was dropped):
/// shuts its service down and stops listening for armed timers, so that the thread
/// uses the entered service or [`global`] again, and a new [`pause`] starts afresh.
fn discard_ended_pause() {
    let ended = PAUSED.with(|paused| {
        let mut paused = paused.try_borrow_mut().ok()?;
        if !paused.as_ref()?.shared.lock().ended {
            return None;
        }
        paused.take()
    });
    // Outside the borrow: shutting the service down drops its pending timers' wakers
    // (users' values), and dropping the listener drops a clone of the shared state.
    if let Some(ended) = ended {
        drop(crate::clock::set_armed_hook(None));
        drop(ended.timer.shutdown());
        drop(ended);
    }
}

/// Pauses time on this thread (tokio's `time::pause`): from now on the
/// [`time`](crate::time) functions and [`Instant::now`] on this thread use a service of
/// its own, on a [`ManualClock`] of its own, that moves only when told to: by
/// [`advance`], and, inside a current-thread tokio runtime (feature `tokio`), by
/// auto-advance: when the runtime has no task to run, the clock jumps to the next
/// timer (see the [module](crate::time) docs for what that relies on). Each thread
/// pauses its own clock, so tests running in parallel in one binary never share one.
/// Inside a tokio runtime, it pauses tokio's clock too (tokio's own timers then stop
/// with ours).
///
/// The paused service (one shard, callbacks inline, so no pool thread) stays this
/// thread's, [`resume`]d or not, until the tokio runtime the pause began in is
/// dropped (as tokio's paused clock belongs to its runtime): it is then shut down
/// (futures still made on it complete at once), and the thread goes back to the
/// entered service or [`global`]; a later `pause` starts a new paused service.
/// Paused outside any runtime (or without the feature), it stays until the thread
/// ends. [`resume`] lets its clock follow real time again. Futures made before the
/// pause keep the service they were made on.
///
/// # Panics
///
/// If time is already paused on this thread (as tokio's); inside a tokio runtime
/// that is not current-thread (as tokio's) or has no timers (`enable_time`; feature
/// `tokio`); if the paused service's thread cannot start.
pub fn pause() {
    pause_with(false);
}

/// [`pause`]; `tokio_paused`: tokio's clock is paused already (`start_paused`'s
/// expansion builds the runtime paused).
fn pause_with(tokio_paused: bool) {
    discard_ended_pause();
    let resumed = PAUSED.with(|paused| {
        let paused = paused.borrow();
        let paused = paused.as_ref()?;
        let mut state = paused.shared.lock();
        assert!(!state.frozen, "time is already frozen");
        state.frozen = true;
        Some(paused.shared.clone())
    });
    if let Some(shared) = resumed {
        // Paused again: the clock stops where it stands (a real pace stops; tokio's
        // clock stops with tokio's pause).
        shared.sync();
        #[cfg(feature = "tokio")]
        if matches!(shared.lock().pace, Pace::Tokio { .. }) {
            tokio::time::pause();
            return;
        }
        shared.lock().pace = Pace::Frozen;
        return;
    }
    let clock = ManualClock::new();
    let timer = match ShardedTimer::builder()
        .clock(clock.clone())
        .shards(1)
        .pin_cores(false)
        .callbacks(Callbacks::inline())
        .thread_name("paused")
        .build()
    {
        Ok(timer) => timer,
        Err(error) => panic!("sharded-timer could not start a paused service: {error}"),
    };
    let shared = Arc::new(PauseShared {
        state: Mutex::new(PauseState {
            pace: Pace::Frozen,
            frozen: true,
            target: None,
            mirror: None,
            look_again: false,
            ended: false,
        }),
        clock,
    });
    #[cfg(feature = "tokio")]
    follow_tokio(&shared, tokio_paused);
    #[cfg(not(feature = "tokio"))]
    let _ = tokio_paused;
    // A sleep armed on this thread tells the paused time (through `clock`, which
    // `future.rs` may import): the mirror then looks for the earliest timer again.
    drop(crate::clock::set_armed_hook(Some(std::rc::Rc::new(
        PausedListener(Arc::clone(&shared)),
    ))));
    let previous = PAUSED.with(|paused| paused.replace(Some(Paused { timer, shared })));
    drop(previous);
}

/// Inside a tokio runtime with timers enabled: pauses tokio's clock (unless it is
/// paused already: `start_paused`, or tokio's own `pause`), makes ours follow it, and
/// spawns the mirror. Elsewhere, ours stays frozen (it moves with `advance` only).
#[cfg(feature = "tokio")]
fn follow_tokio(shared: &Arc<PauseShared>, tokio_paused: bool) {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    // Tokio's `pause` panics if its clock is paused already (then ours follows it as
    // it stands: `start_paused`'s expansion pauses it when the runtime is built, so
    // that its clock and ours start on its tick grid, and says so, sparing the
    // panic's message), or if the runtime is not current-thread (then so do we, as
    // tokio's).
    let paused = if tokio_paused {
        Ok(())
    } else {
        catch_unwind(AssertUnwindSafe(tokio::time::pause))
    };
    if let Err(panic) = paused {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if !message.contains("already frozen") {
            std::panic::resume_unwind(panic);
        }
    }
    // A runtime without timers (no `enable_time`) cannot host the mirror, and a
    // paused test on it would hang at its first sleep: say so at once instead.
    let timers = catch_unwind(|| drop(tokio::time::sleep(Duration::ZERO))).is_ok();
    assert!(
        timers,
        "paused time needs a tokio runtime with timers enabled (`enable_time`)"
    );
    shared.lock().pace = Pace::Tokio {
        tokio_at: tokio::time::Instant::now(),
        at: shared.clock.now(),
    };
    drop(tokio::spawn(mirror(shared.clone())));
    // The paused time belongs to this runtime, as tokio's paused clock does: a task
    // that never completes holds the guard, and the runtime drops it as it shuts
    // down.
    let ends = EndsWithRuntime(shared.clone());
    drop(tokio::spawn(async move {
        let _ends = ends;
        std::future::pending::<()>().await;
    }));
}

/// Resumes time on this thread (tokio's `time::resume`): the paused service stays
/// this thread's, and its clock follows real time again from where it stands (never
/// back): inside a tokio runtime, tokio's resumed clock, which ours follows; without
/// one, the system clock, followed by a thread of the crate that moves ours about
/// every millisecond (a timer due then fires within about a millisecond).
///
/// # Panics
///
/// If time is not paused on this thread (as tokio's).
pub fn resume() {
    let shared = frozen_pause();
    let mut state = shared.lock();
    state.frozen = false;
    match state.pace {
        #[cfg(feature = "tokio")]
        Pace::Tokio { .. } => {
            drop(state);
            tokio::time::resume();
        }
        _ => {
            state.pace = Pace::Real {
                real: std::time::Instant::now(),
                at: shared.clock.now(),
            };
            drop(state);
            start_pacer(&shared);
        }
    }
}

/// Starts a thread that moves a resumed clock along with real time, about every
/// millisecond, until time is paused again or the paused thread is gone.
fn start_pacer(shared: &Arc<PauseShared>) {
    let shared = Arc::downgrade(shared);
    let started = thread::Builder::new()
        .name("paused-pacer".to_owned())
        .spawn(move || loop {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            if shared.lock().frozen {
                return;
            }
            shared.sync();
            drop(shared);
            thread::park_timeout(Duration::from_millis(1));
        });
    if let Err(error) = started {
        panic!("sharded-timer could not start the resumed clock's thread: {error}");
    }
}

/// Moves this thread's paused time forward by `duration`, fires what that made due,
/// and yields, so that the tasks it woke run before this returns (tokio's
/// `time::advance`). Inside a tokio runtime, tokio's clock moves by as much.
///
/// A timer fires once the clock reaches its deadline, to the nanosecond: a 1.5 ms
/// sleep completes when `advance` reaches 1.5 ms (tokio's timers fire on their 1 ms
/// tick, so tokio's completes only when it reaches 2 ms). Auto-advance moves the
/// clock as tokio's, to 2 ms there.
///
/// # Panics
///
/// If time is not paused on this thread (as tokio's).
pub async fn advance(duration: Duration) {
    let shared = frozen_pause();
    #[cfg(feature = "tokio")]
    if matches!(shared.lock().pace, Pace::Tokio { .. }) {
        tokio::time::advance(duration).await;
        shared.sync();
        YieldNow(false).await;
        return;
    }
    shared.clock.advance(duration);
    YieldNow(false).await;
}

/// This thread's paused time, frozen (`resume` and `advance` need it so).
///
/// # Panics
///
/// If time is not paused on this thread (as tokio's).
fn frozen_pause() -> Arc<PauseShared> {
    discard_ended_pause();
    PAUSED.with(|paused| {
        let paused = paused.borrow();
        let paused = paused.as_ref().filter(|paused| paused.shared.lock().frozen);
        let Some(paused) = paused else {
            panic!("time is not frozen");
        };
        paused.shared.clone()
    })
}

/// Completes at its second poll, waking its task at the first: the task goes to the
/// back of its executor's queue.
struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The mirror: a task on the paused thread's runtime that sleeps on tokio's clock
/// until our clock's earliest timer, then moves ours to tokio's, for ever (it ends
/// with the runtime). Tokio's auto-advance moves tokio's clock to the mirror's sleep
/// only when no task is runnable; arming an earlier timer wakes the mirror, which
/// then sleeps until that one.
#[cfg(feature = "tokio")]
async fn mirror(shared: Arc<PauseShared>) {
    loop {
        shared.sync();
        let next = shared.clock.next_deadline();
        let mut sleep = {
            let mut state = shared.lock();
            state.look_again = false;
            state.target = next;
            let Pace::Tokio { tokio_at, at } = state.pace else {
                return;
            };
            // Tokio's instant of our `next`; none past tokio's range (never due).
            next.and_then(|next| {
                tokio_at
                    .checked_add(next.saturating_duration_since(at))
                    .map(tokio::time::sleep_until)
            })
            .map(Box::pin)
        };
        std::future::poll_fn(|cx| {
            let mut state = shared.lock();
            if state.look_again {
                return Poll::Ready(());
            }
            state.mirror = Some(cx.waker().clone());
            drop(state);
            match sleep.as_mut() {
                Some(sleep) => sleep.as_mut().poll(cx),
                None => Poll::Pending,
            }
        })
        .await;
    }
}

/// The attribute macros' runtime hook (feature `tokio`): not for users.
#[cfg(feature = "tokio")]
#[doc(hidden)]
pub fn __pause_if(start_paused: bool) {
    if start_paused {
        pause_with(true);
    }
}
