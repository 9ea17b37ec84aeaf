//! tokio's timer (`tokio::time::sleep` on a multi-thread runtime), used the way code
//! outside the runtime uses it: `schedule` spawns a task that creates a `Sleep` and
//! awaits it (its first poll, inside the task, registers it with the runtime's timer
//! wheel), then runs the callback; `cancel` aborts the task, dropping the `Sleep`
//! before it fires.
//!
//! Faithful in: tokio's own hierarchical wheel, sharded per worker, with its own
//! locking; a pending timer costs a task plus a `Sleep`. Differs from in-runtime use
//! only in that registration happens on a worker thread after `spawn` returns.

use std::time::Duration;

use tokio::runtime::{Builder, Runtime};
use tokio::task::JoinHandle;

/// The tokio peer: a multi-thread runtime with one worker per core.
pub(crate) struct TokioTimer {
    runtime: Runtime,
}

impl TokioTimer {
    pub(crate) fn new() -> Self {
        let workers = std::thread::available_parallelism().map_or(2, usize::from);
        let runtime = Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_time()
            .thread_name("tokio-peer")
            .build()
            .expect("a tokio runtime");
        TokioTimer { runtime }
    }

    pub(crate) fn schedule(
        &self,
        delay: Duration,
        f: impl FnOnce() + Send + 'static,
    ) -> JoinHandle<()> {
        self.runtime.spawn(async move {
            tokio::time::sleep(delay).await;
            f();
        })
    }

    pub(crate) fn cancel(&self, task: &JoinHandle<()>) -> bool {
        task.abort();
        true
    }
}
