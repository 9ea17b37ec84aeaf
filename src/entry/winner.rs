//! What the winner of a state transition owns: a fired timer's task
//! ([`FiredEntry`]) and a cancelled timer's callback, dropped last
//! ([`CancelledCallback`]).

use super::EntryRef;

/// An entry whose Pending → Fired this thread won: it owns the callback.
pub struct FiredEntry {
    /// The reference the shard held.
    entry: EntryRef,
    /// Whether the callback has been moved out to run.
    taken: bool,
}

impl FiredEntry {
    /// The task of an entry whose Pending → Fired the caller just won.
    pub(super) fn new(entry: EntryRef) -> Self {
        FiredEntry {
            entry,
            taken: false,
        }
    }

    /// The timer's id.
    pub fn id(&self) -> crate::id::TimerId {
        self.entry.id()
    }

    /// Its deadline, in nanoseconds from tick 0.
    pub fn deadline(&self) -> crate::clock::Nanos {
        self.entry.deadline()
    }

    /// Whether its "callback" only wakes a task: a [`Sleep`](crate::Sleep)'s timer
    /// (also a `Timeout`'s and an `Interval`'s), whose run finishes the sleep and
    /// calls the waker of the task that last polled it.
    pub fn only_wakes(&self) -> bool {
        self.entry.sleep_shared().is_some()
    }

    /// Runs the callback on this thread. A panic propagates; the reference is released
    /// either way.
    pub fn run(mut self) {
        self.taken = true;
        let header = self.entry.0;
        // SAFETY: the entry is live (we hold a reference) and we won Pending → Fired
        // with the callback untaken (`taken` was false until the line above).
        unsafe { (self.entry.header().vtable.run)(header) };
    }
}

impl Drop for FiredEntry {
    /// Drops the callback unrun. A sleep's timer is the exception: it fired, so its
    /// deadline has passed, and dropped unrun (a spawner that drops or panics on the
    /// wake it was handed, a queue dropped at shutdown) it still finishes the sleep
    /// elapsed, waking its task, where dropping its "callback" would finish it
    /// abandoned: refused with `Shutdown` while the service runs.
    fn drop(&mut self) {
        if !self.taken {
            if self.entry.header().vtable.sleep {
                let header = self.entry.0;
                // SAFETY: the entry is live (we hold a reference) and we won Pending →
                // Fired with the callback untaken; a sleep's `run` takes nothing out
                // of the entry (it finishes the sleep), and `taken` stays false only
                // because this value is going.
                unsafe { (self.entry.header().vtable.run)(header) };
            } else {
                // SAFETY: we won Pending → Fired and never took the callback, so we
                // own it and drop it instead of running it.
                unsafe { self.entry.drop_callback() };
            }
        }
    }
}

impl core::fmt::Debug for FiredEntry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FiredEntry")
            .field("entry", &self.entry)
            .field("taken", &self.taken)
            .finish()
    }
}

/// The callback a winning cancel owns. Dropping this value drops the callback: callers
/// first finish the service's bookkeeping (message sent, room freed), then drop it, so
/// a destructor that panics or shuts the service down finds nothing half done (entry
/// ground rule 2).
#[must_use = "the winner of a cancel owns the callback and must drop it last"]
pub struct CancelledCallback<'a> {
    /// The entry whose cancel was won.
    entry: &'a EntryRef,
    /// `false` when a repeating timer's run holds the callback (the runner drops it).
    owns_callback: bool,
    /// The cancel stopped a repeating timer's run that was handed over but had not
    /// started: it never starts.
    stopped_run: bool,
}

impl<'a> CancelledCallback<'a> {
    /// The callback of `entry`, whose Pending → Cancelled the caller just won.
    pub(super) fn new(entry: &'a EntryRef, owns_callback: bool, stopped_run: bool) -> Self {
        CancelledCallback {
            entry,
            owns_callback,
            stopped_run,
        }
    }

    /// Whether this cancel stopped a repeating timer's run that was handed to the
    /// executor but had not started (that run never starts); `false` if no run was
    /// under way, or one had started (it finishes). For the loom models, which check
    /// that such a run never starts.
    #[cfg(loom)]
    pub fn stopped_run(&self) -> bool {
        self.stopped_run
    }
}

impl Drop for CancelledCallback<'_> {
    fn drop(&mut self) {
        if self.owns_callback {
            // SAFETY: we won Pending → Cancelled with no run under way, so we own the
            // untaken callback, and this value is dropped once.
            unsafe { self.entry.drop_callback() };
        }
    }
}

impl core::fmt::Debug for CancelledCallback<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CancelledCallback")
            .field("entry", self.entry)
            .field("owns_callback", &self.owns_callback)
            .field("stopped_run", &self.stopped_run)
            .finish()
    }
}
