//! Model 6: the executor (`src/executor.rs`): submit, stealing, the sleep handshake.
//!
//! Explores: two workers (which sleep when idle) and a submitter handing over two
//! batches; under loom the deques are a `Mutex<VecDeque>` stand-in (see `src/sync.rs`),
//! so what is checked is the pool's own protocol: find work, steal, sleep, wake.
//! Asserts: every submitted task runs exactly once, and all of them run before
//! `stop` (a lost wakeup would leave the submitter waiting forever, which loom
//! reports).
//! Seeded bug that makes it fail: the worker's re-check of the queues in
//! `wait_for_work` removed (a worker can then sleep on a batch pushed while it was
//! deciding to; the submitter waits forever and loom stops it at its branch limit).
//! Not caught: removing only the SeqCst fence in `submit`, because under loom the
//! injector is a `Mutex` stand-in whose lock already orders the push before the
//! worker's re-check; that fence guards crossbeam's lock-free injector, which loom
//! cannot see (see `src/sync.rs`).
//! Second model: a task whose panic payload panics when dropped, with one worker.
//! Asserts: the panic is counted and the worker lives on to run the next task.
//! Seeded bug that makes it fail: dropping the payload outside `catch_unwind` in
//! `run_caught` (as 157dca7 did, with `drop(payload)` after the match): the payload's panic unwinds out of the worker and
//! loom fails the model with it ("the payload panics on drop, on purpose").
//! Third model: a task that stops the pool from its worker (as `shutdown` called from a
//! callback does) with tasks queued behind it in its batch and in the injector.
//! Asserts: `run_queued_here` runs every one of them before it returns.
//! Seeded bug that makes it fail: `run_queued_here` returning at once: "assertion
//! `left == right` failed: everything queued ran before the stop returned".
//! Command: as in `ring.rs`, with `--test executor`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, trace};
use sharded_timer::__loom::{Executor, Task};

/// A task that counts its runs.
struct Count(Arc<AtomicUsize>);

impl Task for Count {
    fn run(self) {
        trace("task ran");
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn every_task_runs_exactly_once_before_stop() {
    model(|| {
        let (executor, workers) = Executor::<Count>::start(2, "loom").unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        executor.submit(vec![Count(runs.clone())]);
        executor.submit(vec![Count(runs.clone())]);
        while runs.load(Ordering::SeqCst) < 2 {
            thread::yield_now();
        }
        executor.stop();
        for worker in workers {
            worker.join().unwrap();
        }
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    });
}

/// A panic payload that panics again when dropped.
struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("the payload panics on drop, on purpose");
    }
}

/// What the next two models run.
enum Job {
    /// Counts one run.
    Count(Arc<AtomicUsize>),
    /// Panics with a payload that panics on drop.
    Panic,
    /// Stops the pool from its worker, runs what is queued, records the count.
    StopHere(Executor<Job>, Arc<AtomicUsize>, Arc<AtomicUsize>),
}

impl Task for Job {
    fn run(self) {
        match self {
            Job::Count(runs) => {
                runs.fetch_add(1, Ordering::SeqCst);
            }
            Job::Panic => std::panic::panic_any(PanicOnDrop),
            Job::StopHere(executor, runs, seen) => {
                executor.stop();
                executor.run_queued_here();
                seen.store(runs.load(Ordering::SeqCst), Ordering::SeqCst);
            }
        }
    }
}

#[test]
fn a_payload_that_panics_on_drop_does_not_kill_the_worker() {
    model(|| {
        let (executor, workers) = Executor::<Job>::start(1, "loom").unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        executor.submit(vec![Job::Panic, Job::Count(runs.clone())]);
        while runs.load(Ordering::SeqCst) < 1 {
            thread::yield_now();
        }
        executor.stop();
        for worker in workers {
            worker.join().unwrap();
        }
        assert_eq!(executor.panicked(), 1);
    });
}

#[test]
fn stopping_from_a_worker_runs_everything_queued_first() {
    model(|| {
        let (executor, workers) = Executor::<Job>::start(1, "loom").unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(AtomicUsize::new(usize::MAX));
        // The stopping batch last: as in `shutdown`, nothing is submitted after the
        // stop (the shards, the only submitters, are joined first).
        executor.submit(vec![Job::Count(runs.clone())]);
        executor.submit(vec![
            Job::StopHere(executor.clone(), runs.clone(), seen.clone()),
            Job::Count(runs.clone()),
        ]);
        for worker in workers {
            worker.join().unwrap();
        }
        assert_eq!(
            seen.load(Ordering::SeqCst),
            2,
            "everything queued ran before the stop returned"
        );
    });
}
