//! Runtime-agnostic futures on a [`ShardedTimer`]: [`Sleep`] and [`Timeout`].
//!
//! A `Sleep` schedules one timer whose callback, instead of user code, marks the
//! sleep elapsed and wakes the task that last polled it. It needs no runtime: any
//! executor that polls futures and honours wakers works (tokio, smol,
//! `futures::executor::block_on`, a hand-written one).

#![forbid(unsafe_code)]

use crate::entry::{SleepShared, ABANDONED, ELAPSED, WAITING};
use crate::sync::Arc;
use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::clock::TimeInstant;
use crate::error::Refusal;
use crate::handle::EntryHandle;
use crate::home::CoreHome;
use crate::timer::{Inner, SleepHome};
use crate::{ScheduleError, ShardedTimer};

/// A future that completes at or after a deadline; made by [`ShardedTimer::sleep`]
/// and [`ShardedTimer::sleep_until`].
///
/// `Send + Unpin`; needs no particular runtime. Dropping it cancels its timer and
/// wakes nobody (so a dropped `Sleep` leaves nothing pending, and a task dropping it
/// while holding a lock its waker takes cannot deadlock). Only a timer already firing
/// when the drop begins (its deadline passed) can still wake the dropped sleep's task,
/// once, just after the drop returns, as tokio's driver can: it wakes outside its
/// lock. It keeps its service
/// running (dropping the last `ShardedTimer` does not shut down a service a sleep
/// waits on), so that it fires and [`reset`](Sleep::reset) can re-arm it after it
/// completed; it does so without touching the service's shared reference count: it
/// registers with the core it is made on, whose shard also gets its timer. A
/// deadline at or before the service's now needs no timer: the sleep completes at its
/// first poll.
///
/// A sleep always gets its timer: [`Builder::max_pending`](crate::Builder::max_pending)
/// bounds `schedule*` and the `try_*` constructors, not the infallible ones, whose
/// number the tasks holding them already bound. Only a shutdown completes a sleep
/// before its deadline: if the service shuts down while the sleep is pending (or had
/// shut down when it was made), it completes at once rather than hang;
/// [`Sleep::is_elapsed`] then says `false` and [`Sleep::refused`] says
/// [`ScheduleError::Shutdown`]. A sleep's timer is never handed back by `shutdown` as
/// an `Unfired`. [`ShardedTimer::try_sleep`] reports a refusal up front instead,
/// `max_pending`'s included. `poll` never panics.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// let timer = sharded_timer::ShardedTimer::new();
/// // Any executor: here tokio's.
/// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
/// runtime.block_on(async {
///     let start = Instant::now();
///     timer.sleep(Duration::from_millis(5)).await;
///     assert!(start.elapsed() >= Duration::from_millis(5));
/// });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Which thread wakes the task
///
/// The shard thread that fires the timer, whatever the
/// [`Callbacks`](crate::Callbacks) (as tokio's timer driver wakes tasks on its own
/// thread): a wake only schedules the task on its own executor, so a hand-off to a
/// pool or a spawner would only add a second thread's wake-up. If that shard is stuck
/// (a waker that blocks, an inline callback), the shard that watches it wakes the
/// tasks instead, after [`Builder::rescue_after`](crate::Builder::rescue_after).
/// Where no shard watches another (one shard, `rescue_after(None)`, a
/// [`ManualClock`](crate::ManualClock)), the wake leaves as the mode says instead (a
/// pool worker, your spawner), so that a waker that blocks holds no shard.
#[must_use = "a Sleep does nothing unless polled, and dropping it cancels its timer"]
pub struct Sleep {
    /// The home of the core the sleep was made on: keeps the service alive and
    /// (re-)arms the timer on that core's shard.
    home: SleepHome,
    /// The deadline asked for; while `unfixed` is `Some`, the latest it can be.
    deadline: Instant,
    /// For a `timeout(d, f)`'s sleep until its first poll, `d` in nanoseconds: its
    /// deadline is then fixed at the earlier of `deadline` (an upper bound on the time
    /// it was made, plus `d`) and the precise now plus `d`. Both are at or after the
    /// time it was made plus `d`, so never early; and the precise clock is read only by
    /// a timeout whose future was pending at its first poll. [`FIXED`] otherwise (a
    /// `u64`, not an `Option<Duration>`: 8 bytes less in every future that holds one).
    unfixed: u64,
    /// The timer, once armed: at creation, or on the first poll for a `Timeout`'s
    /// (until then `Done(Done::Unarmed)`).
    armed: Armed,
}

/// An armed sleep: its timer, or why it needs none. 16 bytes, a pair of words, which
/// arming writes and the first poll reads whole (a 24-byte `Armed`, its tag a byte
/// apart from its timer, was copied through the stack in pieces the poll then read
/// as one, a stalled load each first poll: issue 30).
enum Armed {
    /// The timer; its entry holds the outcome and the waker (`entry/sleep.rs`).
    Timer(EntryHandle),
    /// No timer: not armed yet, or completed without one.
    Done(Done),
}

/// Why a sleep has no timer: not armed yet, or completed without one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Done {
    /// Not armed yet: armed by its first poll.
    Unarmed,
    /// Not armed yet, made by the [`time`](crate::time) namespace on the system clock:
    /// armed by its first poll, which, if the deadline passed less than a tick (1 ms)
    /// before, yields once ([`Yielded`](Done::Yielded)), as tokio's does (tokio rounds
    /// the deadline up to its next 1 ms tick, which its driver has not turned yet, so
    /// `sleep(Duration::ZERO).await` lets the tasks already woken run first).
    UnarmedYielding,
    /// Yielded at its first poll (its task woken): completes at the next poll, not
    /// elapsed before it.
    Yielded,
    /// The deadline had passed when the sleep was armed: elapsed.
    Elapsed,
    /// The service refused the timer: completed, not elapsed.
    Refused(Refusal),
}

impl Armed {
    /// Not armed yet.
    const UNARMED: Armed = Armed::Done(Done::Unarmed);

    /// `None` if not armed yet.
    fn get(&self) -> Option<&Armed> {
        match self {
            Armed::Done(Done::Unarmed | Done::UnarmedYielding) => None,
            armed => Some(armed),
        }
    }

    /// Schedules a sleep's timer on `home` for `deadline`; it holds room under
    /// `max_pending` only if `holds_room` (a `try_*` future's). A deadline at or before
    /// the service's now needs no timer: the sleep is elapsed at once (guarantee 8;
    /// docs/architecture.md). A refusal completes it at once, with the reason.
    fn new(
        home: &CoreHome<Arc<Inner>>,
        deadline: Instant,
        holds_room: bool,
        waker: Option<&Waker>,
    ) -> Armed {
        // A paused thread's clock follows tokio's paused one, which may have moved on
        // since this thread last looked: caught up first, a deadline tokio's clock has
        // passed is past here too (as tokio's own timers judge it at a first poll).
        #[cfg(not(loom))]
        if home.is_manual() {
            crate::clock::catch_up_before_arming();
        }
        if home.is_past(deadline) {
            return Armed::Done(Done::Elapsed);
        }
        Armed::ahead(home, deadline, holds_room, waker)
    }

    /// As [`new`](Self::new), for a `deadline` known to be after the service's now.
    fn ahead(
        home: &CoreHome<Arc<Inner>>,
        deadline: Instant,
        holds_room: bool,
        waker: Option<&Waker>,
    ) -> Armed {
        let mut armed = Armed::UNARMED;
        armed.arm_ahead(home, deadline, holds_room, waker);
        armed
    }

    /// As [`ahead`](Self::ahead), into `self`: each outcome stored where it stays (a
    /// 16-byte outcome merged from the branches went through the stack as two 8-byte
    /// stores read back as one 16-byte load, which stalls: issue 30). `waker`: the
    /// waker of the task whose poll arms the sleep, stored with the timer before it is
    /// filed (that poll then returns `Pending` with no handshake); `None` where no poll
    /// arms it (a sleep armed when made, or re-armed by a reset).
    fn arm_ahead(
        &mut self,
        home: &CoreHome<Arc<Inner>>,
        deadline: Instant,
        holds_room: bool,
        waker: Option<&Waker>,
    ) {
        match home.schedule_sleep(deadline, holds_room, waker) {
            Ok(handle) => {
                // A paused thread's mirror looks for the earliest timer again.
                #[cfg(not(loom))]
                crate::clock::note_armed(deadline);
                *self = Armed::Timer(handle);
            }
            Err(refusal) => *self = Armed::Done(Done::Refused(refusal)),
        }
    }

    /// As [`new`](Self::new), but unarmed for a deadline already past: the sleep is
    /// then armed, and completed, by its next poll (not elapsed before it).
    fn unless_past(home: &CoreHome<Arc<Inner>>, deadline: Instant, holds_room: bool) -> Armed {
        match Armed::new(home, deadline, holds_room, None) {
            Armed::Done(Done::Elapsed) => Armed::UNARMED,
            armed => armed,
        }
    }

    /// The timer's shared outcome and waker, if it has a timer.
    fn shared(&self) -> Option<&SleepShared> {
        match self {
            Armed::Timer(handle) => handle.sleep_shared(),
            Armed::Done(_) => None,
        }
    }

    /// `WAITING`, `ELAPSED`, `ABANDONED` or `DISARMED`.
    fn outcome(&self) -> u8 {
        match self {
            Armed::Timer(_) => self.shared().map_or(ABANDONED, SleepShared::outcome),
            Armed::Done(Done::Elapsed) => ELAPSED,
            Armed::Done(Done::Refused(_)) => ABANDONED,
            Armed::Done(Done::Unarmed | Done::UnarmedYielding | Done::Yielded) => WAITING,
        }
    }

    /// `Ready` once the sleep has an outcome; otherwise registers `cx`'s waker.
    fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        match self.shared() {
            Some(shared) => shared.poll_finished(cx),
            None => Poll::Ready(()),
        }
    }

    /// Cancels the timer, waking nobody (the future gives it up): frees it at once;
    /// a no-op if it already fired. Either way the stored waker is taken out and
    /// dropped here, on the caller's thread, last: the entry's last reference may go
    /// on a shard thread, which must never drop user code (`entry/sleep.rs`).
    fn disarm(&self, home: &CoreHome<Arc<Inner>>) {
        drop(self.give_up(home));
    }

    /// As [`disarm`](Self::disarm), but the stored waker, if any, comes back to the
    /// caller instead of being dropped: a re-armed sleep whose task waits on it must
    /// wake that task, or nothing would (its old timer will not fire). If the timer
    /// finished the sleep first, that finish owns the waker and wakes the task: `None`.
    fn give_up(&self, home: &CoreHome<Arc<Inner>>) -> Option<Waker> {
        let Armed::Timer(handle) = self else {
            return None;
        };
        let shared = handle.sleep_shared()?;
        let (disarmed, waker) = shared.give_up();
        if disarmed {
            let _ = handle.cancel(home.limit());
        }
        waker
    }
}

impl Sleep {
    /// A sleep until `deadline` on `timer`, its timer scheduled now; bounded by
    /// `max_pending` only if `holds_room` (the `try_*` constructors).
    ///
    /// A deadline already past needs no timer and is left to the first poll, which
    /// completes the sleep: until then it is not elapsed (as tokio's), since no poll
    /// has seen it complete.
    pub(crate) fn new(timer: &ShardedTimer, deadline: Instant, holds_room: bool) -> Sleep {
        let home = timer.sleep_home();
        let deadline = saturated(&home, deadline);
        let armed = Armed::unless_past(&home, deadline, holds_room);
        Sleep {
            armed,
            home,
            deadline,
            unfixed: FIXED,
        }
    }

    /// A sleep until `deadline` on `timer` whose timer is scheduled on its first poll
    /// (a `Timeout`'s, an `Interval`'s), so that one never polled costs no timer.
    pub(crate) fn unarmed(timer: &ShardedTimer, deadline: Instant) -> Sleep {
        let home = timer.sleep_home();
        Sleep {
            deadline: saturated(&home, deadline),
            home,
            unfixed: FIXED,
            armed: Armed::UNARMED,
        }
    }

    /// A sleep of `delay` whose timer is scheduled on its first poll, counted from
    /// then or from when it was made, whichever is earlier (see the field `unfixed`):
    /// `timeout(delay, f)`'s. Reads no precise clock where the service's clock has a
    /// cheaper upper bound on now (the system clock's coarse one); a manual clock's
    /// deadline is exact at once.
    pub(crate) fn unarmed_after(timer: &ShardedTimer, delay: std::time::Duration) -> Sleep {
        let home = timer.sleep_home();
        let (latest, unfixed) = match home.latest_now() {
            // A delay beyond `FIXED - 1` ns (584 years) saturates at the far future
            // (292 years) from either bound, as the whole delay would.
            Some(latest) => (
                latest,
                u64::try_from(delay.as_nanos()).map_or(FIXED - 1, |ns| ns.min(FIXED - 1)),
            ),
            None => (home.now(), FIXED),
        };
        let deadline = latest
            .checked_add(delay)
            .unwrap_or_else(|| home.clock().far_future());
        Sleep {
            deadline: saturated(&home, deadline),
            home,
            unfixed,
            armed: Armed::UNARMED,
        }
    }

    /// Arms the sleep (its first poll, or a `Timeout`'s first poll at which its future
    /// was pending): fixes an unfixed deadline from the precise now, then schedules
    /// the timer unless the deadline has passed, with the polling task's `waker` in
    /// it (so a timer armed here needs no registration: the poll is `Pending`).
    fn arm(&mut self, waker: &Waker) -> &Armed {
        let unfixed = std::mem::replace(&mut self.unfixed, FIXED);
        match unfixed {
            FIXED => self.armed = Armed::new(&self.home, self.deadline, false, Some(waker)),
            delay => {
                let now = self.home.now();
                if let Some(from_now) = now.checked_add(std::time::Duration::from_nanos(delay)) {
                    self.deadline = self.deadline.min(from_now);
                }
                if self.deadline <= now {
                    self.armed = Armed::Done(Done::Elapsed);
                } else {
                    self.armed
                        .arm_ahead(&self.home, self.deadline, false, Some(waker));
                }
            }
        }
        &self.armed
    }

    /// The service's now.
    pub(crate) fn now(&self) -> Instant {
        self.home.now()
    }

    /// On a paused thread, brings the paused clock up to tokio's paused one first (it
    /// may have moved since this thread last looked), firing what that made due, so a
    /// poll or a read of now sees the clock the task sees; a no-op elsewhere.
    pub(crate) fn catch_up(&self) {
        #[cfg(not(loom))]
        if self.home.is_manual() {
            crate::clock::catch_up_before_arming();
        }
    }

    /// Makes a sleep not armed yet (its deadline had passed when it was made, or a
    /// timeout's) yield once at its first poll if its deadline then passed less than
    /// a tick before, as tokio's ([`Done::UnarmedYielding`]): the
    /// [`time`](crate::time) namespace's futures, on the system clock. (Under paused
    /// time, tokio's complete at once, and so do ours.)
    pub(crate) fn yielding_as_tokio(mut self) -> Sleep {
        if self.armed.get().is_none() && !self.home.is_manual() {
            self.armed = Armed::Done(Done::UnarmedYielding);
        }
        self
    }

    /// Whether the deadline passed less than tokio's tick (1 ms) ago.
    fn passed_within_a_tick(&self) -> bool {
        self.home.now().saturating_duration_since(self.deadline)
            < std::time::Duration::from_millis(1)
    }

    /// Whether `deadline` is due on the service's clock: at or before now (on a
    /// paused clock that follows tokio's, at or before its last 1 ms tick).
    pub(crate) fn is_due(&self, deadline: Instant) -> bool {
        self.home.is_past(deadline)
    }

    /// The service's tick.
    pub(crate) fn tick(&self) -> std::time::Duration {
        self.home.clock().resolution()
    }

    /// Why the service could not keep this sleep's deadline: `Some` once the sleep has
    /// completed without elapsing (the service refused its timer, or shut down while
    /// it was pending: [`ScheduleError::Shutdown`]); `None` while pending and after it
    /// elapsed.
    pub fn refused(&self) -> Option<ScheduleError> {
        match self.armed.get()? {
            Armed::Done(Done::Refused(refusal)) => Some(self.home.refusal_error(*refusal)),
            armed if armed.outcome() == ABANDONED => Some(ScheduleError::Shutdown),
            _ => None,
        }
    }

    /// The deadline asked for (not rounded to the tick): the last
    /// [`reset`](Self::reset)'s, if any. (A [`Timeout`]'s, made with a delay, is fixed
    /// at its first poll: see [`Timeout::deadline`].) A
    /// [`time::Instant`](crate::time::Instant), as tokio's (`.into_std()` gives the
    /// `std::time::Instant`; it also compares with one as it stands). A deadline beyond the
    /// service clock's far future (about 292 years after its start; `Duration::MAX`
    /// from now) saturates there, where a [`ManualClock`](crate::ManualClock)
    /// advanced by `Duration::MAX` reaches it.
    pub fn deadline(&self) -> TimeInstant {
        TimeInstant::from_std(self.deadline)
    }

    /// Whether the deadline has passed (the timer fired, or a poll found it past).
    /// `false` while pending, before the first poll of a sleep whose deadline had
    /// already passed when it was made or reset (as tokio's: its first poll completes
    /// it), and for a sleep that completed because its service shut down.
    pub fn is_elapsed(&self) -> bool {
        // On a paused thread, tokio's clock may have moved (its `advance`, another
        // task's sleep): as a poll would, catch up first.
        self.catch_up();
        self.armed
            .get()
            .as_ref()
            .is_some_and(|armed| armed.outcome() == ELAPSED)
    }

    /// Moves the deadline to `deadline` (a [`time::Instant`](crate::time::Instant), as
    /// tokio's; `std_instant.into()` converts one) and re-arms the sleep, whether or not
    /// it has completed: it completes again at or after the new deadline (one at or
    /// before the service's now: at the next poll, with no timer). A pending timer is moved in
    /// place, in O(1), through its handle's [`reset_at`](crate::TimerHandle::reset_at),
    /// earlier or later; a completed one is replaced by a new timer. Poll the sleep
    /// again afterwards (as after tokio's `Sleep::reset`). The timer given up never
    /// fires; if a task was waiting on it (it polled the sleep and got `Pending`),
    /// the reset wakes that task once, on the resetting thread, so that its next poll
    /// completes the sleep (a deadline at or before now, as tokio's reset to the
    /// past) or registers with the new timer.
    ///
    /// If the service has shut down, the sleep completes at once as when it is created
    /// then ([`refused`](Self::refused) says so).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::pin::pin;
    /// use std::time::Duration;
    ///
    /// let timer = sharded_timer::ShardedTimer::new();
    /// let mut idle = pin!(timer.sleep(Duration::from_secs(30)));
    /// // A packet arrived: 30 s more from now.
    /// idle.as_mut().reset((std::time::Instant::now() + Duration::from_secs(30)).into());
    /// assert!(!idle.is_elapsed());
    /// ```
    ///
    /// # Panics
    ///
    /// Never.
    pub fn reset(self: Pin<&mut Self>, deadline: TimeInstant) {
        let deadline = deadline.into_std();
        let this = self.get_mut();
        // A paused thread's clock first catches up with tokio's, so a deadline its
        // clock has passed is judged past, as tokio's reset judges it.
        this.catch_up();
        let deadline = saturated(&this.home, deadline);
        this.deadline = deadline;
        this.unfixed = FIXED;
        let Some(armed) = this.armed.get() else {
            return; // armed on the first poll, for the new deadline
        };
        let moved = !this.home.is_past(deadline)
            && armed.outcome() == WAITING
            && matches!(armed, Armed::Timer(handle)
                if handle.reset_to(this.home.clock().instant_to_ns(deadline)));
        if moved {
            // Moved in place, maybe earlier: a paused thread's mirror looks for the
            // earliest timer again, as for a timer armed anew.
            #[cfg(not(loom))]
            if this.home.is_manual() {
                crate::clock::note_armed(deadline);
            }
            return;
        }
        let waiting = armed.give_up(&this.home);
        // A deadline at or before now: no timer; the next poll completes the sleep.
        this.armed = Armed::unless_past(&this.home, deadline, false);
        // A task that polled the old timer waits on it, which will never fire now:
        // wake it, so its next poll completes the sleep (a past deadline, as tokio's
        // reset to the past) or registers with the new timer. On the resetting
        // thread, after the service's bookkeeping (ground rules: user code last).
        if let Some(waker) = waiting {
            waker.wake();
        }
    }
}

/// [`Sleep`]'s `unfixed` when its deadline is fixed.
const FIXED: u64 = u64::MAX;

/// `deadline`, or the service clock's far future if it is later: where every later
/// deadline saturates, so that a deadline a sleep reports is one its clock can reach
/// (a [`ManualClock`](crate::ManualClock)'s `advance(Duration::MAX)` does).
fn saturated(home: &CoreHome<Arc<Inner>>, deadline: Instant) -> Instant {
    deadline.min(home.clock().far_future())
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        // A paused thread's clock catches up with tokio's before the timer is judged:
        // a sleep whose deadline tokio's clock has reached completes at this poll, as
        // tokio's own does (arming catches up by itself).
        if matches!(this.armed, Armed::Timer(_)) {
            this.catch_up();
        }
        let armed = match this.armed {
            Armed::Done(Done::Unarmed) => match this.arm(cx.waker()) {
                // Its waker went in with the timer, before anyone could finish it.
                Armed::Timer(_) => return Poll::Pending,
                armed => armed,
            },
            Armed::Done(Done::UnarmedYielding) => {
                let armed = this.arm(cx.waker());
                if matches!(armed, Armed::Timer(_)) {
                    return Poll::Pending;
                }
                let elapsed = matches!(armed, Armed::Done(Done::Elapsed));
                if elapsed && this.passed_within_a_tick() {
                    this.armed = Armed::Done(Done::Yielded);
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                &this.armed
            }
            Armed::Done(Done::Yielded) => {
                this.armed = Armed::Done(Done::Elapsed);
                return Poll::Ready(());
            }
            ref armed => armed,
        };
        armed.poll(cx)
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(armed) = self.armed.get() {
            armed.disarm(&self.home);
        }
    }
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sleep")
            .field("deadline", &self.deadline)
            .field("armed", &self.armed.get().is_some())
            .field("elapsed", &self.is_elapsed())
            .finish()
    }
}

/// The error of a [`Timeout`] that gave up before its future completed: its deadline
/// passed ([`refused`](Elapsed::refused) is `None`), or the service could not keep the
/// deadline at all ([`refused`](Elapsed::refused) says why: it shut down, or, for
/// [`ShardedTimer::try_timeout`] only, refused the timer under `max_pending`) — then
/// the deadline has *not* passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Elapsed {
    /// Why the service could not keep the deadline, if that is why.
    refused: Option<ScheduleError>,
}

impl Elapsed {
    /// `None` if the deadline really passed; otherwise why the service could not keep
    /// it (and the deadline has not passed).
    pub fn refused(&self) -> Option<ScheduleError> {
        self.refused
    }
}

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.refused {
            None => f.write_str("deadline has elapsed"),
            Some(error) => write!(f, "no deadline could be kept: {error}"),
        }
    }
}

impl std::error::Error for Elapsed {}

impl From<Elapsed> for std::io::Error {
    /// An error of kind [`TimedOut`](std::io::ErrorKind::TimedOut) (as tokio's).
    fn from(elapsed: Elapsed) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::TimedOut, elapsed)
    }
}

pin_project_lite::pin_project! {
    /// A future that runs `F` with a deadline; made by [`ShardedTimer::timeout`].
    ///
    /// Resolves to `Ok(output)` if `F` completes first (a future that is ready at its
    /// first poll passes straight through, even if the deadline is already past), or
    /// `Err(Elapsed)` once the deadline passes. Its timer is scheduled lazily, on the
    /// first poll at which `F` is not ready (as tokio's), so a future that completes on
    /// its first poll costs no timer and no read of the precise clock. A deadline
    /// given as an instant (`timeout_at`) is that instant; one given as a delay `d`
    /// (`timeout`) is fixed at that first pending poll: `d` after the time the
    /// `Timeout` was made, never earlier, and at most a few kernel ticks later (see
    /// [`deadline`](Timeout::deadline)). `F` is stored inline, not boxed: `Timeout<F>` is `Unpin` exactly
    /// when `F` is, and `Send` when `F` is. Dropping it drops `F` and cancels the
    /// timer. If the service shuts down first, or refused the timer, it resolves to
    /// `Err` at once rather than hang, with [`Elapsed::refused`] saying why (the
    /// deadline has not passed); [`ShardedTimer::try_timeout`] schedules the timer up
    /// front and reports a refusal then.
    #[must_use = "a Timeout does nothing unless polled"]
    pub struct Timeout<F> {
        // The future under the deadline.
        #[pin]
        future: F,
        // The deadline; armed on the first poll that needs it.
        sleep: Sleep,
    }
}

impl<F> Timeout<F> {
    /// Wraps `future` with `sleep` as its deadline.
    pub(crate) fn new(future: F, sleep: Sleep) -> Self {
        Timeout { future, sleep }
    }

    /// As [`Sleep::yielding_as_tokio`], for the `time` namespace's timeouts.
    pub(crate) fn yielding_as_tokio(self) -> Self {
        Timeout {
            future: self.future,
            sleep: self.sleep.yielding_as_tokio(),
        }
    }

    /// The deadline: for `timeout_at`, the instant asked for. For `timeout(d, f)` on
    /// the system clock it is fixed at the first poll at which `f` is pending, as the
    /// earlier of the precise now plus `d` and an upper bound on the time the
    /// `Timeout` was made (the coarse clock's: at most its calibration's width, plus
    /// the coarse clock's lag when it was calibrated (below a kernel tick or two on a
    /// machine that is not overloaded), plus four kernel ticks late; 16–25 ms on a
    /// 250 Hz kernel) plus `d`; so it is
    /// never before the time it was made plus `d`. Until then this returns the latest
    /// it can be (the second of the two), which that poll may move earlier. On a
    /// [`ManualClock`](crate::ManualClock) (and under paused time) it is exactly the
    /// time it was made plus `d`, saturating at the clock's far future as
    /// [`Sleep::deadline`] says.
    ///
    /// A `std::time::Instant`, as the service API's instants (tokio's `Timeout` has no
    /// such method; [`Sleep::deadline`] returns a [`time::Instant`](crate::time::Instant)
    /// as tokio's does).
    pub fn deadline(&self) -> Instant {
        self.sleep.deadline
    }

    /// The future under the deadline.
    pub fn get_ref(&self) -> &F {
        &self.future
    }

    /// The future under the deadline, mutably.
    pub fn get_mut(&mut self) -> &mut F {
        &mut self.future
    }

    /// Gives up the deadline (cancelling its timer) and returns the future.
    pub fn into_inner(self) -> F {
        self.future
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.future.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        match Pin::new(&mut *this.sleep).poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed {
                refused: this.sleep.refused(),
            })),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<F> fmt::Debug for Timeout<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timeout")
            .field("sleep", &self.sleep)
            .finish()
    }
}

impl ShardedTimer {
    /// A future that completes `d` after now (rounded up to the tick, like
    /// [`schedule`](Self::schedule)). See [`Sleep`] for what happens when the service
    /// cannot keep the deadline.
    ///
    /// # Panics
    ///
    /// Never.
    pub fn sleep(&self, d: std::time::Duration) -> Sleep {
        Sleep::new(self, self.deadline_after(d), false)
    }

    /// A future that completes at or after `deadline` (a `std::time::Instant` or a
    /// [`time::Instant`](crate::time::Instant)). A deadline at or before the
    /// service's now completes at the first poll, with no timer.
    ///
    /// # Panics
    ///
    /// Never.
    pub fn sleep_until(&self, deadline: impl Into<Instant>) -> Sleep {
        Sleep::new(self, deadline.into(), false)
    }

    /// As [`sleep`](Self::sleep), but a refused timer is an error instead of a sleep
    /// that completes at once.
    ///
    /// # Errors
    ///
    /// As [`schedule`](Self::schedule): [`ScheduleError::Shutdown`],
    /// [`ScheduleError::TooManyPending`].
    pub fn try_sleep(&self, d: std::time::Duration) -> Result<Sleep, ScheduleError> {
        self.try_sleep_until(self.deadline_after(d))
    }

    /// As [`sleep_until`](Self::sleep_until), but a refused timer is an error.
    ///
    /// # Errors
    ///
    /// As [`try_sleep`](Self::try_sleep).
    pub fn try_sleep_until(&self, deadline: impl Into<Instant>) -> Result<Sleep, ScheduleError> {
        let sleep = Sleep::new(self, deadline.into(), true);
        match sleep.armed {
            Armed::Done(Done::Refused(refusal)) => Err(sleep.home.refusal_error(refusal)),
            _ => Ok(sleep),
        }
    }

    /// Runs `f` with a deadline `d` from now: `Ok(output)` if it completes first,
    /// `Err(Elapsed)` otherwise. See [`Timeout`] for what happens when the service
    /// cannot keep the deadline.
    ///
    /// # Panics
    ///
    /// Never.
    pub fn timeout<F: IntoFuture>(&self, d: std::time::Duration, f: F) -> Timeout<F::IntoFuture> {
        Timeout::new(f.into_future(), Sleep::unarmed_after(self, d))
    }

    /// Runs `f` with the deadline `deadline`: as [`timeout`](Self::timeout), with an
    /// instant instead of a delay (tokio's `timeout_at`). A deadline at or before the
    /// service's now gives `Err(Elapsed)` at the first poll at which `f` is not ready.
    ///
    /// # Panics
    ///
    /// Never.
    pub fn timeout_at<F: IntoFuture>(
        &self,
        deadline: impl Into<Instant>,
        f: F,
    ) -> Timeout<F::IntoFuture> {
        Timeout::new(f.into_future(), Sleep::unarmed(self, deadline.into()))
    }

    /// As [`timeout`](Self::timeout), but a refused timer is an error up front.
    ///
    /// # Errors
    ///
    /// As [`try_sleep`](Self::try_sleep); `f` is dropped.
    pub fn try_timeout<F: IntoFuture>(
        &self,
        d: std::time::Duration,
        f: F,
    ) -> Result<Timeout<F::IntoFuture>, ScheduleError> {
        Ok(Timeout::new(f.into_future(), self.try_sleep(d)?))
    }
}
