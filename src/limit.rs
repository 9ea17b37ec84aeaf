//! The optional bound of [`Builder::max_pending`](crate::Builder::max_pending): one
//! shared counter of pending timers, paid for only by services built with a limit.

#![forbid(unsafe_code)]

use crate::sync::{AtomicUsize, CachePadded, Ordering};

/// A bound of `limit` pending timers.
#[derive(Debug)]
pub struct PendingLimit {
    /// Timers scheduled and neither fired nor cancelled. Written by `try_acquire` (CAS)
    /// and `release` (`fetch_sub`) from any thread; never above `limit`.
    pending: CachePadded<AtomicUsize>,
    /// The configured limit.
    limit: usize,
}

impl PendingLimit {
    /// A limit of `limit` pending timers.
    pub fn new(limit: usize) -> Self {
        PendingLimit {
            pending: CachePadded::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// The configured limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Takes room for one timer, or fails if `limit` are pending. A compare-and-swap,
    /// not an add-then-undo: a transient overshoot by one thread would make another
    /// refuse while fewer than `limit` timers are pending.
    pub fn try_acquire(&self) -> bool {
        // ORDERING: Relaxed throughout: the counter guards no other memory; the RMW
        // alone keeps it exact, so at most `limit` acquisitions are outstanding.
        let mut pending = self.pending.load(Ordering::Relaxed);
        loop {
            if pending >= self.limit {
                return false;
            }
            // ORDERING: Relaxed success and failure, as above.
            match self.pending.compare_exchange_weak(
                pending,
                pending + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => pending = actual,
            }
        }
    }

    /// Frees the room of one timer that fired or was cancelled.
    pub fn release(&self) {
        // ORDERING: Relaxed, as in `try_acquire`.
        let before = self.pending.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(before > 0, "limit invariant: a release matches an acquire");
    }

    /// The number of pending timers counted now (the loom model's check).
    #[cfg(loom)]
    pub fn pending(&self) -> usize {
        // ORDERING: Relaxed: a reading for assertions at quiescence.
        self.pending.load(Ordering::Relaxed)
    }
}
