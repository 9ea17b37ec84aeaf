//! Runtime-agnostic futures on a [`ShardedTimer`]: [`Sleep`] and [`Timeout`].
//!
//! A `Sleep` schedules one timer whose callback, instead of user code, marks the
//! sleep elapsed and wakes the task that last polled it. It needs no runtime: any
//! executor that polls futures and honours wakers works (tokio, smol,
//! `futures::executor::block_on`, a hand-written one).

#![forbid(unsafe_code)]

use crate::sync::{Arc, AtomicU8, Mutex, Ordering};
use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::{ScheduleError, ShardedTimer, TimerHandle};

/// The sleep's timer has not fired.
const WAITING: u8 = 0;
/// The sleep's timer fired: the deadline has passed.
pub const ELAPSED: u8 = 1;
/// The service shut down before the deadline, or refused the timer.
pub const ABANDONED: u8 = 2;

/// What a sleep's timer callback and its future share: the outcome and the waker.
///
/// The handshake (a loom model, `loom-tests/tests/sleep_waker.rs`, drives these very
/// methods): the poller stores its waker under the mutex and then re-reads the
/// outcome; `finish` CASes the outcome and then takes the waker under the same mutex.
/// Either the poller's re-read sees the outcome, or `finish`'s take comes after the
/// store and wakes the stored waker — a wake-up cannot be lost.
#[derive(Debug, Default)]
pub struct Shared {
    /// `WAITING`, `ELAPSED` or `ABANDONED`; written once by the callback or its drop.
    outcome: AtomicU8,
    /// The waker of the task that last polled the sleep.
    waker: Mutex<Option<Waker>>,
}

impl Shared {
    /// A sleep not yet finished, with no waker.
    pub fn new() -> Shared {
        Shared {
            outcome: AtomicU8::new(WAITING),
            waker: Mutex::new(None),
        }
    }

    /// Records the outcome (first writer wins) and wakes the waiting task. Returns
    /// whether this call's outcome won.
    pub fn finish(&self, outcome: u8) -> bool {
        // ORDERING: AcqRel: the poller's Acquire load of `outcome` sees it; nothing
        // else is published through it. Failure Relaxed: already finished.
        let won = self
            .outcome
            .compare_exchange(WAITING, outcome, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if won {
            let waker = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
        won
    }

    /// `WAITING`, `ELAPSED` or `ABANDONED`.
    pub fn outcome(&self) -> u8 {
        // ORDERING: Acquire pairs with the AcqRel CAS in `finish`.
        self.outcome.load(Ordering::Acquire)
    }
}

impl Shared {
    /// `Ready` once the sleep has an outcome; otherwise stores `cx`'s waker for
    /// `finish` to wake and returns `Pending`.
    pub fn poll_finished(&self, cx: &mut Context<'_>) -> Poll<()> {
        // ORDERING: Acquire pairs with the AcqRel CAS in `Shared::finish`.
        if self.outcome.load(Ordering::Acquire) != WAITING {
            return Poll::Ready(());
        }
        {
            let mut waker = self.waker.lock().unwrap_or_else(|e| e.into_inner());
            match waker.as_ref() {
                Some(current) if current.will_wake(cx.waker()) => {}
                _ => *waker = Some(cx.waker().clone()),
            }
        }
        // Finished between the first check and storing the waker: `finish` may have
        // taken the old waker (or none), so check again rather than miss the wake.
        // ORDERING: Acquire, as above. The waker mutex orders this load after our
        // store, and `finish`'s CAS before its take: if `finish`'s take saw no waker
        // of ours, its CAS precedes our unlock, so this load sees the outcome.
        if self.outcome.load(Ordering::Acquire) != WAITING {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// Finishes the sleep when the timer's callback is dropped without running (the
/// service shut down), so a pending `Sleep` never hangs.
struct FinishOnDrop(Arc<Shared>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        self.0.finish(ABANDONED);
    }
}

/// A future that completes at or after a deadline; made by [`ShardedTimer::sleep`]
/// and [`ShardedTimer::sleep_until`].
///
/// `Send + Unpin`; needs no particular runtime. Dropping it cancels its timer (so a
/// dropped `Sleep` leaves nothing pending).
///
/// When the service cannot keep the deadline — it shuts down while the sleep is
/// pending, or refused the timer ([`ScheduleError::Shutdown`], or
/// [`ScheduleError::TooManyPending`] under `max_pending`) — the sleep completes at once
/// rather than hang, *before* its deadline: [`Sleep::is_elapsed`] then says `false`
/// and [`Sleep::refused`] says why. A sleep's timer is never handed back by
/// `shutdown` as an `Unfired`. Use [`ShardedTimer::try_sleep`] to be told of a
/// refusal up front. `poll` never panics.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     struct Unpark(std::thread::Thread);
/// #     impl std::task::Wake for Unpark { fn wake(self: std::sync::Arc<Self>) { self.0.unpark() } }
/// #     let waker = std::sync::Arc::new(Unpark(std::thread::current())).into();
/// #     let mut cx = std::task::Context::from_waker(&waker);
/// #     let mut f = std::pin::pin!(f);
/// #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } std::thread::park(); }
/// # }
/// let timer = sharded_timer::ShardedTimer::new();
/// let start = Instant::now();
/// block_on(timer.sleep(Duration::from_millis(5)));
/// assert!(start.elapsed() >= Duration::from_millis(5));
/// ```
#[must_use = "a Sleep does nothing unless polled, and dropping it cancels its timer"]
pub struct Sleep {
    /// Shared with the timer's callback.
    shared: Arc<Shared>,
    /// The timer, while it may still fire; `None` if the service refused it.
    handle: Option<TimerHandle>,
    /// Why the service refused the timer, if it did.
    refused: Option<ScheduleError>,
    /// The deadline asked for.
    deadline: Instant,
}

impl Sleep {
    /// Schedules the sleep's timer on `timer` for `deadline`. A refusal completes the
    /// sleep at once, with the reason in `refused`.
    pub(crate) fn new(timer: &ShardedTimer, deadline: Instant) -> Sleep {
        let shared = Arc::new(Shared::new());
        let guard = FinishOnDrop(shared.clone());
        // If the service refuses the timer, the callback and its guard are dropped,
        // which finishes the sleep as abandoned.
        let scheduled = timer.schedule_sleep(deadline, move || {
            guard.0.finish(ELAPSED);
        });
        let (handle, refused) = match scheduled {
            Ok(handle) => (Some(handle), None),
            Err(error) => (None, Some(error)),
        };
        Sleep {
            shared,
            handle,
            refused,
            deadline,
        }
    }

    /// Why the service could not keep this sleep's deadline: `Some` once the sleep has
    /// completed without elapsing (the service refused its timer, or shut down while
    /// it was pending: [`ScheduleError::Shutdown`]); `None` while pending and after it
    /// elapsed.
    pub fn refused(&self) -> Option<ScheduleError> {
        if self.shared.outcome() != ABANDONED {
            return None;
        }
        Some(self.refused.unwrap_or(ScheduleError::Shutdown))
    }

    /// The deadline asked for.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the deadline has passed (the timer fired). `false` while pending, and
    /// for a sleep that completed because its service shut down.
    pub fn is_elapsed(&self) -> bool {
        self.shared.outcome() == ELAPSED
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.shared.poll_finished(cx)
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(handle) = &self.handle {
            // Frees the timer at once; a no-op if it already fired.
            let _ = handle.cancel();
        }
    }
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sleep")
            .field("deadline", &self.deadline)
            .field("elapsed", &self.is_elapsed())
            .finish()
    }
}

/// The error of a [`Timeout`] that gave up before its future completed: its deadline
/// passed ([`refused`](Elapsed::refused) is `None`), or the service could not keep the
/// deadline at all ([`refused`](Elapsed::refused) says why: it shut down, or refused the
/// timer under `max_pending`) — then the deadline has *not* passed.
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

/// A future that runs `F` with a deadline; made by [`ShardedTimer::timeout`].
///
/// Resolves to `Ok(output)` if `F` completes first (a future that is ready at its
/// first poll passes straight through, even if the deadline is already past), or
/// `Err(Elapsed)` once the deadline passes. The inner future is boxed, so `Timeout` is
/// `Unpin` whatever `F` is; it is `Send` when `F` is. Dropping it drops `F` and cancels
/// the timer. If the service shuts down first, or refused the timer, it resolves to
/// `Err` at once rather than hang, with [`Elapsed::refused`] saying why (the deadline
/// has not passed); [`ShardedTimer::try_timeout`] reports a refusal up front instead.
#[must_use = "a Timeout does nothing unless polled"]
pub struct Timeout<F> {
    /// The future under the deadline.
    future: Pin<Box<F>>,
    /// The deadline.
    sleep: Sleep,
}

impl<F> Timeout<F> {
    /// Wraps `future` with `sleep` as its deadline.
    pub(crate) fn new(future: F, sleep: Sleep) -> Self {
        Timeout {
            future: Box::pin(future),
            sleep,
        }
    }

    /// The deadline.
    pub fn deadline(&self) -> Instant {
        self.sleep.deadline()
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(output) = self.future.as_mut().poll(cx) {
            return Poll::Ready(Ok(output));
        }
        match Pin::new(&mut self.sleep).poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed {
                refused: self.sleep.refused(),
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
        Sleep::new(self, self.deadline_after(d))
    }

    /// A future that completes at or after `deadline`. A past deadline completes on
    /// the next tick.
    ///
    /// # Panics
    ///
    /// Never.
    pub fn sleep_until(&self, deadline: Instant) -> Sleep {
        Sleep::new(self, deadline)
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
    pub fn try_sleep_until(&self, deadline: Instant) -> Result<Sleep, ScheduleError> {
        let sleep = Sleep::new(self, deadline);
        match sleep.refused {
            None => Ok(sleep),
            Some(error) => Err(error),
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
        Timeout::new(f.into_future(), self.sleep(d))
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
