//! A process-wide service for code that would rather not pass one around, and
//! tokio's `tokio::time` free functions on it: switching from tokio is an import
//! change (`use sharded_timer::time::{sleep, timeout};`).
//!
//! **One service per process, cloned.** Each [`ShardedTimer`] runs its own shard and
//! worker threads (as Netty warns of `HashedWheelTimer`), so a program builds one and
//! clones it, or uses this one. [`global`] builds it with the defaults on first use;
//! [`Builder::build_global`] configures it, before that first use. It is never shut
//! down (it lives as long as the process): calling `shutdown` on it stops it for every
//! user of the process, after which these functions' futures complete at once.

#![forbid(unsafe_code)]

use std::future::IntoFuture;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{BuildError, Builder, Interval, ShardedTimer, Sleep, Timeout};

/// The process-wide service, once built.
static GLOBAL: OnceLock<ShardedTimer> = OnceLock::new();

/// The process-wide service: built with the defaults ([`ShardedTimer::new`]) on first
/// use, unless [`Builder::build_global`] built it first; never shut down.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// let handle = sharded_timer::global()
///     .schedule(Duration::from_secs(30), || println!("timed out"))?;
/// assert!(handle.cancel());
/// # Ok::<(), sharded_timer::ScheduleError>(())
/// ```
///
/// # Panics
///
/// Only if the operating system cannot start the service's threads on first use (as
/// [`ShardedTimer::new`]); call [`Builder::build_global`] first to handle that as an
/// error.
pub fn global() -> &'static ShardedTimer {
    GLOBAL.get_or_init(ShardedTimer::new)
}

impl Builder {
    /// Builds this configuration as the process-wide service that [`global`] and the
    /// [`time`](crate::time) functions use. Call it before their first use.
    ///
    /// # Errors
    ///
    /// [`BuildError::GlobalExists`] if the process-wide service exists already (an
    /// earlier call, or a first use of [`global`]); otherwise as
    /// [`build`](Self::build). A service built by a call that lost a race to another
    /// is shut down again.
    pub fn build_global(self) -> Result<&'static ShardedTimer, BuildError> {
        if GLOBAL.get().is_some() {
            return Err(BuildError::GlobalExists);
        }
        match GLOBAL.set(self.build()?) {
            // Set by this call, so `get` finds it.
            Ok(()) => GLOBAL.get().ok_or(BuildError::GlobalExists),
            Err(lost) => {
                drop(lost.shutdown());
                Err(BuildError::GlobalExists)
            }
        }
    }
}

/// [`ShardedTimer::sleep`] on [`global`]: tokio's `time::sleep`.
///
/// # Panics
///
/// As [`global`].
pub fn sleep(d: Duration) -> Sleep {
    global().sleep(d)
}

/// [`ShardedTimer::sleep_until`] on [`global`]: tokio's `time::sleep_until` (with a
/// `std::time::Instant`).
///
/// # Panics
///
/// As [`global`].
pub fn sleep_until(deadline: Instant) -> Sleep {
    global().sleep_until(deadline)
}

/// [`ShardedTimer::timeout`] on [`global`]: tokio's `time::timeout`.
///
/// # Panics
///
/// As [`global`].
pub fn timeout<F: IntoFuture>(d: Duration, f: F) -> Timeout<F::IntoFuture> {
    global().timeout(d, f)
}

/// [`ShardedTimer::timeout_at`] on [`global`]: tokio's `time::timeout_at`.
///
/// # Panics
///
/// As [`global`].
pub fn timeout_at<F: IntoFuture>(deadline: Instant, f: F) -> Timeout<F::IntoFuture> {
    global().timeout_at(deadline, f)
}

/// [`ShardedTimer::interval`] on [`global`]: tokio's `time::interval` (a zero
/// `period` is raised to the tick instead of panicking; the default missed-tick
/// behaviour is `Skip`, not `Burst`).
///
/// # Panics
///
/// As [`global`].
pub fn interval(period: Duration) -> Interval {
    global().interval(period)
}

/// [`ShardedTimer::interval_at`] on [`global`]: tokio's `time::interval_at`.
///
/// # Panics
///
/// As [`global`].
pub fn interval_at(start: Instant, period: Duration) -> Interval {
    global().interval_at(start, period)
}
