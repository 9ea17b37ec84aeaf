//! The model-checking harness for sharded-timer's cross-thread protocols.
//!
//! Each file in `tests/` models one protocol with loom, which runs the model once for
//! every interleaving of its threads' atomic operations (up to a preemption bound) and
//! checks every access to shared cells for data races. Run them with:
//!
//! ```sh
//! RUSTFLAGS="--cfg loom -C debug-assertions=on" CARGO_TARGET_DIR=target/loom \
//!     LOOM_MAX_PREEMPTIONS=3 cargo test --release -p loom-tests
//! ```
//!
//! The harness adds a trace buffer: models call [`trace`] as they go, and the buffer of
//! the failing iteration (only) is printed when a model panics.
#![cfg_attr(
    not(loom),
    allow(unused, reason = "the harness is used only under --cfg loom")
)]

use std::cell::RefCell;

/// Default preemption bound when `LOOM_MAX_PREEMPTIONS` is unset.
pub const DEFAULT_PREEMPTIONS: usize = 3;

thread_local! {
    /// Events of the current iteration. loom runs a model's threads on one OS thread,
    /// so this buffer is shared by all of them, in execution order.
    static TRACE: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Records one event of the current iteration.
pub fn trace(event: impl Into<String>) {
    TRACE.with(|trace| trace.borrow_mut().push(event.into()));
}

/// Prints the current iteration's trace if the iteration is failing.
struct PrintOnPanic;

impl Drop for PrintOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            TRACE.with(|trace| {
                eprintln!("--- trace of the failing iteration ---");
                for event in trace.borrow().iter() {
                    eprintln!("  {event}");
                }
            });
        }
    }
}

/// Runs `model` under loom with the preemption bound from `LOOM_MAX_PREEMPTIONS`
/// (default [`DEFAULT_PREEMPTIONS`]).
#[cfg(loom)]
pub fn model<F>(model: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(DEFAULT_PREEMPTIONS);
    }
    // Models with spin-and-yield loops (a consumer waiting for a push) take more
    // branches per iteration than loom's default of 1,000 allows.
    builder.max_branches = 100_000;
    builder.check(move || {
        TRACE.with(|trace| trace.borrow_mut().clear());
        let _print = PrintOnPanic;
        model();
    });
}

/// Drives the real shard core (`sharded_timer::__loom::ShardCore`, the code the shard
/// thread runs) in the models.
#[cfg(loom)]
pub mod shard {
    use sharded_timer::__loom::{Expired, RunHome, RunTask, ShardCore, ShardShared, Tick};

    /// A shard with rings of `capacity` slots and its core, wheel at tick 0, no limit.
    pub fn new(capacity: usize) -> (loom::sync::Arc<ShardShared>, ShardCore) {
        let (shared, cursors) = ShardShared::new(capacity);
        let core = ShardCore::new(shared.clone(), cursors, Tick::new(0), 1, None);
        (shared, core)
    }

    /// One turn of the shard loop at tick `now`: the core's own `turn`, which
    /// `ShardThread::run` calls (drain inserts, drain messages, expire). Runs what
    /// fired inline, each repeating run through the shipped `RunTask`, and returns how
    /// many fired.
    pub fn turn(core: &mut ShardCore, now: u64) -> usize {
        let mut ran = 0;
        let home: RunHome = std::sync::Arc::new(core.shared().clone());
        core.turn(|| Tick::new(now), &mut |expired| {
            ran += 1;
            match expired {
                Expired::Fired(task) => task.run(),
                Expired::Run(running) => RunTask::for_model(running, home.clone()).run(),
            }
        });
        ran
    }
}
