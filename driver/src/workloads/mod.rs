//! The workloads: each runs one real-world use of a timer service on sharded-timer,
//! checks every timer as it fires (never early, exactly once, never after a
//! successful cancel) and returns a [`WorkloadReport`](crate::report::WorkloadReport).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

/// Whether this process has made timers yet (a workload, `--compare`, `--sweep` or
/// `--soak` has run).
static TIMERS_MADE: AtomicBool = AtomicBool::new(false);

/// Records that this process has made timers: sharded-timer's entry pool now holds
/// memory that later timers reuse, so bytes allocated no longer measure bytes per
/// timer.
pub(crate) fn timers_made() {
    // ORDERING: Relaxed: read and written by the main thread, between workloads.
    TIMERS_MADE.store(true, Ordering::Relaxed);
}

/// Whether bytes allocated from now on measure what new timers cost: no timer was
/// made in this process before (else the entry pool reuses their memory).
pub(crate) fn memory_is_fresh() -> bool {
    // ORDERING: Relaxed: as in `timers_made`.
    !TIMERS_MADE.load(Ordering::Relaxed)
}

/// Why a workload reports no bytes per pending timer.
pub(crate) const NOT_FRESH: &str = "bytes per pending timer not measured: earlier \
    timers of this process freed memory that sharded-timer's entry pool reuses (run \
    this workload alone, or first, for the figure)";

/// Stands between a timer and the task it wakes: records when it was last woken,
/// then wakes the task. So a workload tells the timer's part of a task's lateness
/// (when the timer woke it: guarantee 2) from the executor's (when a worker then ran
/// it).
#[derive(Default)]
pub(crate) struct WakeProbe {
    /// The instant of the last wake.
    woken_at: Mutex<Option<Instant>>,
    /// The task's waker, from its last poll.
    task: Mutex<Option<Waker>>,
}

impl Wake for WakeProbe {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let now = Instant::now();
        *self.woken_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl WakeProbe {
    /// When the timer last woke the task.
    pub(crate) fn woken_at(&self) -> Option<Instant> {
        *self.woken_at.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `cx`'s waker as the task's, and returns the context to poll the timer
    /// with: `probe_waker`, this probe as a waker (made once by the caller, so the
    /// timer sees the same waker at each poll).
    pub(crate) fn stand_in<'a>(&self, cx: &Context<'_>, probe_waker: &'a Waker) -> Context<'a> {
        let replaced = {
            let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
            if task.as_ref().is_some_and(|task| task.will_wake(cx.waker())) {
                None
            } else {
                task.replace(cx.waker().clone())
            }
        };
        // The task's old waker is dropped outside the lock.
        drop(replaced);
        Context::from_waker(probe_waker)
    }
}

pub(crate) mod asynchronous;
pub(crate) mod backpressure;
pub(crate) mod burst;
pub(crate) mod delayed;
pub(crate) mod heartbeat;
pub(crate) mod keepalive;
pub(crate) mod net;
pub(crate) mod rpc;
pub(crate) mod stall;
pub(crate) mod steady;

/// Paces a producer at a fixed rate, as a service's clients would load it: operation
/// `n` is due `n / per_sec` seconds after the pacer's start. Every [`Pacer::BATCH_SPAN`]
/// worth of operations the producer sleeps until the next batch is due. A producer
/// that falls behind (refused, descheduled) catches up at full speed, but never by
/// more than [`Pacer::MAX_BEHIND`]: further behind, the schedule restarts from now, so
/// a stall never turns into a burst above the rate.
#[derive(Debug)]
pub(crate) struct Pacer {
    /// When operation 0 was due (moved forward when the pacer fell too far behind).
    start: Instant,
    /// Operations per second.
    per_sec: f64,
    /// Operations since `start`.
    sent: u64,
    /// Operations between looks at the clock.
    batch: u64,
}

impl Pacer {
    /// The span of one batch: operations between sleeps.
    pub(crate) const BATCH_SPAN: Duration = Duration::from_micros(200);
    /// How far behind its schedule a pacer catches up.
    pub(crate) const MAX_BEHIND: Duration = Duration::from_millis(5);

    /// A pacer at `per_sec` operations per second (at least 1), starting now.
    pub(crate) fn new(per_sec: f64) -> Self {
        let per_sec = per_sec.max(1.0);
        Pacer {
            start: Instant::now(),
            per_sec,
            sent: 0,
            batch: ((per_sec * Self::BATCH_SPAN.as_secs_f64()) as u64).max(1),
        }
    }

    /// Counts one operation; at the end of a batch, returns when the next batch is
    /// due if that is still ahead (`None`: go on now).
    pub(crate) fn count(&mut self) -> Option<Instant> {
        self.sent += 1;
        if !self.sent.is_multiple_of(self.batch) {
            return None;
        }
        let due = self.start + Duration::from_secs_f64(self.sent as f64 / self.per_sec);
        let now = Instant::now();
        if due > now {
            return Some(due);
        }
        if now - due > Self::MAX_BEHIND {
            // Too far behind: restart the schedule from now rather than burst.
            self.start = now;
            self.sent = 0;
        }
        None
    }

    /// Counts one operation and, at the end of a batch, sleeps until the next is due.
    pub(crate) fn pace(&mut self) {
        if let Some(due) = self.count() {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pacer_never_runs_ahead_of_its_rate() {
        // 2,000 operations at 20,000/s: the last batch is due no earlier than
        // (2,000 - one batch) / 20,000 s after the start, and the pacer sleeps until
        // each batch is due.
        let mut pacer = Pacer::new(20_000.0);
        let start = Instant::now();
        for _ in 0..2_000 {
            pacer.pace();
        }
        let batch = (20_000.0 * Pacer::BATCH_SPAN.as_secs_f64()) as u64;
        let least = Duration::from_secs_f64((2_000 - batch) as f64 / 20_000.0);
        assert_eq!(batch, 4);
        assert!(
            start.elapsed() >= least,
            "{:?} < {least:?}",
            start.elapsed()
        );
    }

    #[test]
    fn a_pacer_far_behind_restarts_from_now_instead_of_bursting() {
        // 100/s: a batch of one, each due 10 ms after the one before.
        let mut pacer = Pacer::new(100.0);
        std::thread::sleep(Duration::from_millis(10) + Pacer::MAX_BEHIND * 4);
        // Behind by more than MAX_BEHIND: the schedule restarts from now...
        assert_eq!(pacer.count(), None);
        // ...so the next operation is due 10 ms after it, not in the past.
        let restarted = Instant::now();
        let due = pacer.count().expect("the next operation is ahead");
        assert!(due > restarted, "{due:?} <= {restarted:?}");
    }
}
