//! Stopping the service: [`ShardedTimer::shutdown`], the drop of the last clone, and
//! the joining of the service's threads ([`Threads`]), also from a callback on one of
//! them.

use super::{Inner, ShardedTimer};
use crate::dispatch::ShardTask;
use crate::entry::EntryRef;
use crate::executor::{run_caught, Executor, Task};
use crate::handle::Unfired;
use crate::id::TimerState;
use crate::shard::{dispatch_rest_here, is_own_thread, take_own_core};
use crate::sync::{thread, Ordering};

/// The service's threads, until shutdown joins them.
pub(super) struct Threads {
    /// Shard threads; each returns its pending timers.
    pub(super) shards: Vec<thread::JoinHandle<Vec<EntryRef>>>,
    /// Executor workers.
    pub(super) workers: Vec<thread::JoinHandle<()>>,
}

impl Threads {
    /// Joins the shards (already asked to stop) but the calling thread's own, if it is
    /// shard `caller_shard`'s (a callback on it: its loop ends once the callback
    /// returns), then stops and joins the executor, skipping the calling thread if it
    /// is one of the workers; that one then runs, here, what was handed to the executor
    /// and has not run yet (the rest of its own batch included). Returns the pending
    /// timers.
    pub(super) fn join(
        self,
        executor: &Executor<ShardTask>,
        caller_is_worker: bool,
        caller_shard: Option<usize>,
    ) -> Vec<EntryRef> {
        let mut pending = Vec::new();
        for (index, shard) in self.shards.into_iter().enumerate() {
            if caller_shard == Some(index) {
                continue; // detached: it exits by itself once this callback returns
            }
            match shard.join() {
                Ok(unfired) => pending.extend(unfired),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        executor.stop();
        let me = thread::current().id();
        for worker in self.workers.into_iter().chain(executor.take_started()) {
            if caller_is_worker && worker.thread().id() == me {
                continue; // exits by itself once this callback returns
            }
            let _ = worker.join();
        }
        if caller_is_worker {
            executor.run_queued_here();
        } else {
            // A pool started on demand none of whose workers could start.
            executor.run_if_never_started();
        }
        pending
    }
}

impl Inner {
    /// Shuts down (idempotent); returns the pending timers.
    fn shut_down(&self) -> Vec<Unfired> {
        // ORDERING: Release pairs with `schedule`'s Acquire load; a schedule that
        // misses it is caught by the closed insert ring instead.
        self.stopped.store(true, Ordering::Release);
        let caller_is_worker = self.executor.is_current_worker();
        // A callback on one of this service's shard threads (inline, or a spawner).
        let caller_shard = self.shards.iter().position(|shard| is_own_thread(shard));
        let mut guard = if caller_is_worker || caller_shard.is_some() {
            // A callback calling shutdown while another shutdown waits for that very
            // callback must not block: that shutdown will do the work.
            match self.threads.try_lock() {
                Ok(guard) => guard,
                Err(_) => return Vec::new(),
            }
        } else {
            self.threads.lock().unwrap_or_else(|e| e.into_inner())
        };
        let Some(threads) = guard.take() else {
            return Vec::new();
        };
        for shard in self.shards.iter() {
            shard.request_stop();
        }
        // The calling shard cannot be joined: shut its core down here, first, so that
        // no other shard waits on a ring of it while we join them.
        let mut pending = match caller_shard {
            Some(_) => take_own_core()
                .map(|mut core| core.shut_down())
                .unwrap_or_default(),
            None => Vec::new(),
        };
        pending.extend(threads.join(&self.executor, caller_is_worker, caller_shard));
        drop(guard);
        // What the calling shard fired with this callback runs (or reaches the
        // spawner) before `shutdown` returns, as with the pool; and before the late
        // lists are sealed, so that a repeating timer queued behind this callback
        // comes back below, as from the pool, instead of being cancelled.
        if caller_shard.is_some() {
            dispatch_rest_here();
        }
        // Repeating timers whose run ended after their shard stopped come back too;
        // taking them seals each list (a run ending later cancels its timer).
        for shard in self.shards.iter() {
            let mut returned = 0;
            for entry in shard.take_late() {
                match entry.detach().state() {
                    TimerState::Pending => {
                        pending.push(entry);
                        returned += 1;
                    }
                    // A handle cancelled it on the late list: out of the wheel and not
                    // running, so it sent no message and no runner saw it; it is
                    // counted here, once (only this loop takes it off the list).
                    TimerState::Cancelled => {
                        crate::dispatch::RunSink::count_run_cancelled(shard);
                    }
                    // Never: a repeating timer's runs leave it pending, and nothing
                    // fires an entry before this loop detaches it; nothing to count.
                    TimerState::Fired => {}
                }
            }
            // ORDERING: Relaxed: a statistic.
            shard.returned.fetch_add(returned, Ordering::Relaxed);
        }
        let mut unfired = Vec::with_capacity(pending.len());
        let mut sleeps = Vec::new();
        for entry in pending {
            if entry.hands_back() {
                let deadline = self.clock.ns_to_instant(entry.deadline());
                unfired.push(Unfired::new(entry, deadline));
            } else {
                sleeps.push(entry);
            }
        }
        // A sleep's timer is not handed back: cancelling it drops its callback, which
        // completes the sleep (not elapsed) and wakes its task. Last, since a waker is
        // user code: the service's own bookkeeping is done by now. A waker that
        // panics is caught and counted as a callback's panic, and the other tasks are
        // woken all the same (an outside audit's test,
        // `a_panicking_waker_woken_by_shutdown_is_caught_and_counted`, saw the first
        // panic unwind out of `shutdown` with the rest never woken).
        for entry in sleeps {
            if run_caught(Abandon(entry)) {
                // ORDERING: Relaxed: a statistic.
                self.callback_panics.fetch_add(1, Ordering::Relaxed);
            }
        }
        unfired
    }
}

/// A pending sleep's timer at shutdown, as a task: its cancel completes the sleep and
/// wakes the task (user code, so it runs under `run_caught`).
struct Abandon(EntryRef);

impl Task for Abandon {
    fn run(self) {
        drop(self.0.cancel_detached());
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Dropping the last clone shuts down as `shutdown` does, then drops the
        // unfired timers (their callbacks are dropped unrun).
        drop(self.shut_down());
    }
}

impl ShardedTimer {
    /// Stops the service and returns every timer still pending, in wheels or rings.
    ///
    /// After `shutdown` starts, [`schedule`](Self::schedule) returns
    /// [`ScheduleError::Shutdown`]. Callbacks already handed to the executor finish
    /// before `shutdown` returns, and all threads are joined. Idempotent: later calls
    /// return an empty vector. Called from a callback, it does not wait for that
    /// callback itself; the callbacks queued behind it run on the calling thread before
    /// `shutdown` returns. The timers of [`sleep`](Self::sleep)s and
    /// [`timeout`](Self::timeout)s are not handed back: those futures complete (not
    /// elapsed) instead.
    ///
    /// # Panics
    ///
    /// Only if a shard thread panicked (an internal invariant failed); the panic is
    /// propagated.
    ///
    /// [`ScheduleError::Shutdown`]: crate::ScheduleError::Shutdown
    pub fn shutdown(&self) -> Vec<Unfired> {
        self.inner.shut_down()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// Set in the child process of the test below.
    const UNWIND_CHILD: &str = "SHARDED_TIMER_SHARD_UNWIND_CHILD";

    /// A shard thread whose internal invariant fails aborts the process instead of
    /// unwinding: its shard would be freed by the join and the handle's `cancel`
    /// below would write through a dangling pointer (`ShardShared::port`). The child
    /// process makes its shard fail; the parent sees it abort, before the cancel.
    #[test]
    fn a_shard_thread_that_fails_aborts_the_process_so_no_handle_dangles() {
        if std::env::var_os(UNWIND_CHILD).is_some() {
            let timer = super::ShardedTimer::builder()
                .shards(1)
                .executor_threads(1)
                .pin_cores(false)
                .build()
                .unwrap();
            let handle = timer.schedule(Duration::from_secs(60), || {}).unwrap();
            let shard = &timer.inner.shards[0];
            shard
                .fail_turn
                .store(true, std::sync::atomic::Ordering::Relaxed);
            shard.nudge();
            std::thread::sleep(Duration::from_secs(20));
            // Not reached: the abort comes first. Were it reached, the shard would be
            // gone and this cancel would use it.
            drop(timer.shutdown());
            let _ = handle.cancel();
            std::process::exit(0);
        }
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "timer::shutdown::tests::a_shard_thread_that_fails_aborts_the_process_so_no_handle_dangles",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(UNWIND_CHILD, "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            output.status.signal(),
            Some(6),
            "the child aborted (SIGABRT): {:?}\n{stderr}",
            output.status
        );
        assert!(stderr.contains("a shard thread panicked"), "{stderr}");
    }
}
