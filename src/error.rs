//! Errors of [`ShardedTimer::schedule`](crate::ShardedTimer::schedule) and
//! [`Builder::build`](crate::Builder::build).

#![forbid(unsafe_code)]

use std::fmt;

/// Why [`ShardedTimer::schedule`](crate::ShardedTimer::schedule) (or `schedule_at`)
/// refused a timer. The callback was dropped without running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The service has shut down (or is shutting down): [`shutdown`] was called or the
    /// last [`ShardedTimer`] clone was dropped.
    ///
    /// [`shutdown`]: crate::ShardedTimer::shutdown
    /// [`ShardedTimer`]: crate::ShardedTimer
    Shutdown,
    /// [`Builder::max_pending`](crate::Builder::max_pending) timers are already
    /// pending. Firing and cancelling make room again.
    TooManyPending {
        /// The configured limit.
        limit: usize,
    },
}

/// A [`ScheduleError`] without the limit, which its service knows: one byte, so that
/// a sleep's arming (`Result<EntryHandle, Refusal>`, 16 bytes) comes back in two
/// registers instead of through memory (issue 30).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// [`ScheduleError::Shutdown`].
    Shutdown,
    /// [`ScheduleError::TooManyPending`].
    TooManyPending,
}

impl Refusal {
    /// The error, with the service's `limit` (`max_pending`, if configured).
    pub(crate) fn error(self, limit: Option<usize>) -> ScheduleError {
        match self {
            Refusal::Shutdown => ScheduleError::Shutdown,
            Refusal::TooManyPending => ScheduleError::TooManyPending {
                limit: limit.unwrap_or(0),
            },
        }
    }
}

impl From<ScheduleError> for Refusal {
    fn from(error: ScheduleError) -> Refusal {
        match error {
            ScheduleError::Shutdown => Refusal::Shutdown,
            ScheduleError::TooManyPending { .. } => Refusal::TooManyPending,
        }
    }
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleError::Shutdown => f.write_str("the timer service has shut down"),
            ScheduleError::TooManyPending { limit } => {
                write!(f, "too many pending timers: the limit is {limit}")
            }
        }
    }
}

impl std::error::Error for ScheduleError {}

/// Why [`Builder::build`](crate::Builder::build) failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// `shards(0)`: at least one shard is needed.
    ZeroShards,
    /// `executor_threads(0)`: at least one thread must run callbacks.
    ZeroExecutorThreads,
    /// `tick(Duration::ZERO)`, or a tick longer than `u64::MAX` nanoseconds.
    InvalidTick {
        /// The tick given.
        tick: std::time::Duration,
    },
    /// `ring_capacity` that is not a power of two of at least 2.
    InvalidRingCapacity {
        /// The capacity given.
        capacity: usize,
    },
    /// `max_pending(0)`: a service that may hold no timer cannot accept any.
    ZeroMaxPending,
    /// [`Builder::build_global`](crate::Builder::build_global) found the process-wide
    /// service already built (by an earlier call, or by a first use of
    /// [`global`](crate::global)).
    GlobalExists,
    /// The operating system refused to start a thread.
    Spawn {
        /// Name of the thread that could not start.
        thread: String,
        /// The error from `std::thread::Builder::spawn`.
        source: std::io::Error,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::ZeroShards => f.write_str("shards must be at least 1"),
            BuildError::ZeroExecutorThreads => f.write_str("executor_threads must be at least 1"),
            BuildError::InvalidTick { tick } => {
                write!(f, "tick must be between 1 ns and u64::MAX ns, got {tick:?}")
            }
            BuildError::InvalidRingCapacity { capacity } => write!(
                f,
                "ring_capacity must be a power of two of at least 2, got {capacity}"
            ),
            BuildError::ZeroMaxPending => f.write_str("max_pending must be at least 1"),
            BuildError::GlobalExists => f.write_str(
                "the process-wide service exists already; configure it before first use",
            ),
            BuildError::Spawn { thread, source } => {
                write!(f, "could not start thread {thread:?}: {source}")
            }
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Spawn { source, .. } => Some(source),
            _ => None,
        }
    }
}
