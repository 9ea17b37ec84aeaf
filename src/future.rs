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

use crate::{ShardedTimer, TimerHandle};

/// The sleep's timer has not fired.
const WAITING: u8 = 0;
/// The sleep's timer fired: the deadline has passed.
const ELAPSED: u8 = 1;
/// The service shut down before the deadline (or refused the timer).
const ABANDONED: u8 = 2;

/// What a sleep's timer callback and its future share.
#[derive(Debug)]
struct Shared {
    /// `WAITING`, `ELAPSED` or `ABANDONED`; written once by the callback or its drop.
    outcome: AtomicU8,
    /// The waker of the task that last polled the sleep.
    waker: Mutex<Option<Waker>>,
}

impl Shared {
    /// Records the outcome (first writer wins) and wakes the waiting task.
    fn finish(&self, outcome: u8) {
        // ORDERING: AcqRel: the poller's Acquire load of `outcome` sees it; nothing
        // else is published through it. Failure Relaxed: already finished.
        if self
            .outcome
            .compare_exchange(WAITING, outcome, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            let waker = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
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
/// dropped `Sleep` leaves nothing pending). If the service shuts down, or has already
/// shut down, while the sleep is pending, the sleep completes at once rather than
/// hang (possibly before its deadline: [`Sleep::is_elapsed`] then says `false`).
/// `poll` never panics.
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
    /// The deadline asked for.
    deadline: Instant,
}

impl Sleep {
    /// Schedules the sleep's timer on `timer` for `deadline`.
    pub(crate) fn new(timer: &ShardedTimer, deadline: Instant) -> Sleep {
        let shared = Arc::new(Shared {
            outcome: AtomicU8::new(WAITING),
            waker: Mutex::new(None),
        });
        let guard = FinishOnDrop(shared.clone());
        let handle = timer
            .schedule_at(deadline, move || {
                guard.0.finish(ELAPSED);
            })
            .ok();
        // If the service refused the timer (shut down, or bounded), the callback and
        // its guard are already dropped, which finished the sleep as abandoned.
        Sleep {
            shared,
            handle,
            deadline,
        }
    }

    /// The deadline asked for.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the deadline has passed (the timer fired). `false` while pending, and
    /// for a sleep that completed because its service shut down.
    pub fn is_elapsed(&self) -> bool {
        // ORDERING: Acquire pairs with the AcqRel CAS in `Shared::finish`.
        self.shared.outcome.load(Ordering::Acquire) == ELAPSED
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // ORDERING: Acquire pairs with the AcqRel CAS in `Shared::finish`.
        if self.shared.outcome.load(Ordering::Acquire) != WAITING {
            return Poll::Ready(());
        }
        {
            let mut waker = self.shared.waker.lock().unwrap_or_else(|e| e.into_inner());
            match waker.as_ref() {
                Some(current) if current.will_wake(cx.waker()) => {}
                _ => *waker = Some(cx.waker().clone()),
            }
        }
        // Finished between the first check and storing the waker: `finish` may have
        // taken the old waker (or none), so check again rather than miss the wake.
        // ORDERING: Acquire, as above; the waker mutex orders this after our store.
        if self.shared.outcome.load(Ordering::Acquire) != WAITING {
            return Poll::Ready(());
        }
        Poll::Pending
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

/// The error of a [`Timeout`] whose deadline passed before its future completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Elapsed(());

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline has elapsed")
    }
}

impl std::error::Error for Elapsed {}

/// A future that runs `F` with a deadline; made by [`ShardedTimer::timeout`].
///
/// Resolves to `Ok(output)` if `F` completes first (a future that is ready at its
/// first poll passes straight through, even if the deadline is already past), or
/// `Err(Elapsed)` once the deadline passes. The inner future is boxed, so `Timeout` is
/// `Unpin` whatever `F` is; it is `Send` when `F` is. Dropping it drops `F` and cancels
/// the timer. If the service shuts down first, the timeout elapses rather than hang.
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
            Poll::Ready(()) => Poll::Ready(Err(Elapsed(()))),
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
    /// [`schedule`](Self::schedule)). See [`Sleep`] for what happens at shutdown.
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

    /// Runs `f` with a deadline `d` from now: `Ok(output)` if it completes first,
    /// `Err(Elapsed)` otherwise. See [`Timeout`].
    ///
    /// # Panics
    ///
    /// Never.
    pub fn timeout<F: IntoFuture>(&self, d: std::time::Duration, f: F) -> Timeout<F::IntoFuture> {
        Timeout::new(f.into_future(), self.sleep(d))
    }
}
