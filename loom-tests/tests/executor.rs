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
