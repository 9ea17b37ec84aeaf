//! The workloads: each runs one real-world use of a timer service on sharded-timer,
//! checks every timer as it fires (never early, exactly once, never after a
//! successful cancel) and returns a [`WorkloadReport`](crate::report::WorkloadReport).

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
