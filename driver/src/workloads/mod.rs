//! The workloads: each runs one real-world use of a timer service on sharded-timer,
//! checks every timer as it fires (never early, exactly once, never after a
//! successful cancel) and returns a [`WorkloadReport`](crate::report::WorkloadReport).

use std::sync::atomic::{AtomicBool, Ordering};

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
