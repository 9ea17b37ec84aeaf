//! The one-shot task cell the lock-based peers (heap, netty-style) share: a state
//! byte decided by one compare-and-swap, and the boxed callback the winner takes.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

const PENDING: u8 = 0;
const FIRED: u8 = 1;
const CANCELLED: u8 = 2;

/// A scheduled callback: exactly one of `cancel` and `fire` wins.
pub struct OnceTask {
    /// `PENDING`, `FIRED` or `CANCELLED`.
    state: AtomicU8,
    /// The callback, until the winner takes it.
    callback: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for OnceTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnceTask")
            .field("state", &self.state.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl OnceTask {
    /// A pending task that will run `f`.
    pub fn new(f: impl FnOnce() + Send + 'static) -> Self {
        OnceTask {
            state: AtomicU8::new(PENDING),
            callback: Mutex::new(Some(Box::new(f))),
        }
    }

    /// Whether neither `cancel` nor `fire` has won yet.
    pub fn is_pending(&self) -> bool {
        self.state.load(Ordering::Acquire) == PENDING
    }

    /// Pending → Cancelled; the winner drops the callback. Returns whether it won.
    pub fn cancel(&self) -> bool {
        let won = self.win(CANCELLED);
        if won {
            drop(self.callback.lock().unwrap().take());
        }
        won
    }

    /// Pending → Fired; the winner runs the callback on this thread.
    pub fn fire(&self) {
        if self.win(FIRED) {
            let callback = self.callback.lock().unwrap().take();
            if let Some(callback) = callback {
                callback();
            }
        }
    }

    fn win(&self, to: u8) -> bool {
        self.state
            .compare_exchange(PENDING, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}
