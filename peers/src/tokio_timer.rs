//! tokio's timer used as tokio users write timeouts: one `tokio::time::sleep` (or one
//! `tokio::time::timeout` around the request's future) per timer, registered where it
//! is created and dropped to cancel — no task per timer.
//!
//! `schedule` enters the runtime's context on the calling thread, creates the `Sleep`
//! (or `Timeout`), and polls it once there: that first poll registers it in the
//! runtime's timer wheel, as the first poll inside a request's task would. The waker
//! it registers runs the callback when the time driver wakes it (what a task's wake
//! would start). `cancel` drops the future, which deregisters it: tokio's cancel.
//!
//! Faithful in: tokio's own hierarchical wheel, sharded per worker, with its own
//! locking; a pending timer costs the boxed future plus its waker. Differs from
//! in-task use in that the waker runs a callback instead of scheduling a task, which
//! is cheaper than tokio's real wake-up; tokio is favoured, not handicapped.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio::runtime::{Builder, Runtime};

/// Which tokio future a timer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `tokio::time::sleep(delay)`.
    Sleep,
    /// `tokio::time::timeout(delay, request)` around a request that never completes.
    Timeout,
}

/// The tokio peer: a multi-thread runtime with one worker per core.
#[derive(Debug)]
pub struct TokioTimer {
    runtime: Runtime,
    form: Form,
}

/// A registered timer: the boxed future, dropped to cancel. `Cell` so that `cancel`
/// can take it through `&`, as the other peers' handles are used.
pub type TokioHandle = Cell<Option<Pin<Box<dyn Future<Output = ()> + Send>>>>;

/// The waker a timer registers: runs the callback once.
struct RunOnWake(Mutex<Option<Box<dyn FnOnce() + Send>>>);

impl Wake for RunOnWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let callback = self.0.lock().unwrap().take();
        if let Some(callback) = callback {
            callback();
        }
    }
}

impl TokioTimer {
    /// A runtime with one worker per core, whose timers take the shape `form`.
    ///
    /// # Panics
    ///
    /// If the runtime cannot be built.
    pub fn new(form: Form) -> Self {
        let workers = std::thread::available_parallelism().map_or(2, usize::from);
        let runtime = Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_time()
            .thread_name("tokio-peer")
            .build()
            .expect("a tokio runtime");
        TokioTimer { runtime, form }
    }

    /// Registers a timer that runs `f` once after `delay`, as a user's `sleep` or
    /// `timeout` future registers it on its first poll.
    pub fn schedule(&self, delay: Duration, f: impl FnOnce() + Send + 'static) -> TokioHandle {
        let _context = self.runtime.enter();
        let mut future: Pin<Box<dyn Future<Output = ()> + Send>> = match self.form {
            Form::Sleep => Box::pin(tokio::time::sleep(delay)),
            Form::Timeout => Box::pin(async move {
                let _ = tokio::time::timeout(delay, std::future::pending::<()>()).await;
            }),
        };
        let waker = Waker::from(Arc::new(RunOnWake(Mutex::new(Some(Box::new(f))))));
        let mut cx = Context::from_waker(&waker);
        if let Poll::Ready(()) = future.as_mut().poll(&mut cx) {
            // Due already (a zero delay): tokio's future completes on its first poll.
            waker.wake();
            return Cell::new(None);
        }
        Cell::new(Some(future))
    }

    /// Drops the future (tokio's cancel); `true` iff it was still registered.
    pub fn cancel(&self, handle: &TokioHandle) -> bool {
        // Dropping deregisters the timer; true iff it was still registered (a fired
        // timer's future is also dropped here, as a user's would be).
        handle.take().is_some()
    }
}
