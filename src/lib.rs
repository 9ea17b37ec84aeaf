//! A timer service for programs that keep millions of timers (request timeouts, idle
//! reapers, keepalives, retries, delayed jobs) and create and cancel them from many
//! threads at once. It is a hierarchical timing wheel per core (Varghese and Lauck,
//! as in Netty, Kafka and Linux), works under any executor, and offers
//! `sharded_timer::time`, a drop-in for `tokio::time`.
//!
//! ```toml
//! [dependencies]
//! sharded-timer = "0.1"                                      # the service API
//! # sharded-timer = { version = "0.1", features = ["tokio"] } # + #[sharded_timer::test], paused time with tokio's
//! ```
//!
//! | feature | what it adds | extra dependencies |
//! | --- | --- | --- |
//! | (none) | [`ShardedTimer`], [`TimerHandle`], futures ([`Sleep`], [`Timeout`], [`Interval`]), [`time`], [`ManualClock`] | none beyond crossbeam, `core_affinity`, `pin-project-lite` (and `libc` on Linux) |
//! | `tokio` | `#[sharded_timer::test]` and `#[sharded_timer::main]` (tokio's attributes, pausing this crate's time too); [`time::pause`] inside a tokio runtime pauses tokio's clock as well | tokio (`rt`, `time`, `test-util`), the macros crate |
//! | `stream` | [`Interval`] implements `futures_core::Stream` | `futures-core` |
//! | `rayon` | `Callbacks::rayon`: callbacks on your rayon pool | `rayon` |
//! | `metrics` | `ShardedTimer::record_metrics`: [`Stats`] through the `metrics` facade | `metrics` |
//!
//! Items that need a feature say so on their page (on docs.rs, which builds with every
//! feature); locally, `cargo doc --open --all-features` shows them all, the attribute
//! macros included.
//!
//! # One service per process, cloned
//!
//! [`ShardedTimer::new`] starts a shard thread per core and an executor pool of as
//! many threads: build one at start-up and clone it (a clone is a reference-counted
//! pointer) into every part of the program that needs timers. A hundred services are
//! four hundred threads. [`global`] is such a shared service, made on first use;
//! [`time`]'s functions use it (or the one a thread [entered](ShardedTimer::enter)).
//!
//! # Which API: the service or `time::*`?
//!
//! - **Callbacks, and timers you cancel or reset by handle** (timeouts cancelled when
//!   the answer comes, keepalives pushed back on every packet, delayed jobs): the
//!   service API, [`ShardedTimer::schedule`] and [`TimerHandle`]. No executor needed.
//! - **Async code**: [`ShardedTimer::sleep`], [`ShardedTimer::timeout`],
//!   [`ShardedTimer::interval`] on a service you hold, under any executor; or, for code
//!   written against `tokio::time`, [`time`]: the same names and signatures, so the
//!   switch is one import line, and its paused tests keep passing (feature `tokio`).
//! - **Tests**: [`Builder::clock`] with a [`ManualClock`]: [`ManualClock::advance`]
//!   moves time and returns once everything it made due has fired, so code with
//!   30-second timeouts is tested in microseconds.
//!
//! ```
//! use std::time::Duration;
//! use sharded_timer::ShardedTimer;
//!
//! let timer = ShardedTimer::new(); // once, at start-up; clone it where needed
//! let handle = timer.schedule(Duration::from_secs(30), || println!("request timed out"))?;
//! // ... the response arrived in time:
//! assert!(handle.cancel());
//! # Ok::<(), sharded_timer::ScheduleError>(())
//! ```
//!
//! Beyond one-shot timers: [`TimerHandle::reset`] moves a pending timer (later is one
//! atomic store, for keepalives), [`ShardedTimer::schedule_repeating`] runs a callback
//! at a fixed rate without drift, [`ShardedTimer::schedule_with_fixed_delay`] a fixed
//! delay after each run. [`ShardedTimer::stats`] counts what the service did; its
//! lateness ([`Stats::lateness`]) is how long after its deadline the *shard fired*
//! each timer, not when the callback ran: the hand-off to the executor and the wait for
//! a free worker come after it (measure those in the callback if they matter).
//!
//! How it works, file by file (the wheel, the entry, the ring, the shard's turn, custody
//! and rescue, parking, the entry pool, and which modules use `unsafe` and why):
//! `docs/architecture.md` in the repository.
//!
//! # Guarantees
//!
//! 1. **Never early.** A callback starts at or after its deadline, measured with
//!    `Instant` (or with the [`ManualClock`] of a service built with
//!    [`Builder::clock`]).
//! 2. **On time.** Under normal load it starts within one tick (plus wake-up latency)
//!    after it, also after any sequence of [`TimerHandle::reset`]s, and while other
//!    threads schedule without pause (a shard's turn waits for at most one timer's
//!    filing per producer, never for the stream of them).
//! 3. **Exactly once.** A callback runs once, unless [`cancel`] returned `true` (then
//!    never) or the service stopped first (then [`shutdown`] returns it as an
//!    [`Unfired`], or it is dropped if the last [`ShardedTimer`] was dropped). Nothing
//!    is silently lost.
//! 4. **Dropping a handle does not cancel.** Fire-and-forget is the common case.
//! 5. **Re-entrant.** [`schedule`], [`cancel`], [`TimerHandle::reset`] and
//!    [`shutdown`] work from inside callbacks; a [`shutdown`] there runs the callbacks
//!    queued behind the caller before it returns.
//! 6. **Bounded when asked.** With [`Builder::max_pending`]`(n)`, the `n + 1`-th
//!    pending timer gets [`ScheduleError::TooManyPending`]; firing and cancelling
//!    free room again.
//! 7. **Shutdown.** After [`shutdown`] starts, [`schedule`] returns
//!    [`ScheduleError::Shutdown`]. Callbacks already handed to the executor finish
//!    before it returns; everything still pending, in wheels or rings, comes back as
//!    [`Unfired`]. Dropping the last clone shuts down the same way, but drops the
//!    pending callbacks unrun. A pending [`Sleep`] or [`Timeout`] completes instead of
//!    coming back, and says its deadline did not pass ([`Sleep::refused`],
//!    [`Elapsed::refused`]).
//! 8. **Odd input never panics.** `Duration::ZERO` or a past `Instant` (even one
//!    before the service started) fire on the next tick (on a [`ManualClock`], at
//!    once: a deadline not after its now is due); a delay beyond the wheel's range or
//!    `Duration::MAX` saturates at the clock's far future, about 292 years after its
//!    start (never early, never a panic; for a timer or a future alike): on the system
//!    clock it never comes, and a [`ManualClock`]'s `advance(Duration::MAX)` reaches
//!    it. A future whose deadline is at or before the service's now completes at its
//!    first poll, with no timer (and is not [`Sleep::is_elapsed`] before it).
//! 9. **Futures never complete early.** On a running service a [`Sleep`],
//!    [`Timeout`] or [`Interval`] tick completes only once its deadline has passed.
//!    The infallible constructors ([`ShardedTimer::sleep`], [`ShardedTimer::timeout`],
//!    [`ShardedTimer::interval`]) always get their timer: [`Builder::max_pending`]
//!    bounds `schedule*` and the `try_*` constructors only.
//! 10. **Dropping a future only cancels.** Dropping (or re-arming) a pending
//!     [`Sleep`], [`Timeout`] or [`Interval`] cancels its timer and wakes nobody; only
//!     a shutdown wakes a waiting task. (A timer already firing when the drop begins
//!     may still land its one wake just after the drop returns, as tokio's can.)
//! 11. **One deadline.** `deadline()` is the instant asked for everywhere
//!     ([`TimerHandle`], [`Unfired`], [`Callback`], [`Sleep`]).
//! 12. **Limits that fit in memory.** Any number of [`TimerHandle`] clones works:
//!     past 2^23 clones of one handle its reference count saturates and the timer's
//!     entry is kept for ever instead of freed (Linux's `refcount_t`), never an abort.
//!
//! **Happens-before.** Everything the scheduling thread did before [`schedule`]
//! returned happens-before the callback starts (the entry is published by a Release
//! store in the ring and taken with an Acquire load, then handed to the executor
//! through crossbeam-deque, which synchronises likewise). A [`cancel`] that returns
//! `true` has dropped the callback before it returns — last, after the service's own
//! bookkeeping — unless a repeating timer's run is under way, whose runner drops it
//! when the run returns.
//!
//! A callback that captures a clone of its own [`ShardedTimer`] keeps the service
//! alive while it is pending: call [`shutdown`] to stop such a service (the pending
//! callbacks, and their clones, come back as [`Unfired`]).
//!
//! [`schedule`]: ShardedTimer::schedule
//! [`cancel`]: TimerHandle::cancel
//! [`shutdown`]: ShardedTimer::shutdown
#![cfg_attr(
    loom,
    allow(dead_code, reason = "the loom build compiles only the modelled parts")
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// Maintainer notes (not rendered).
//
// Ownership of an entry's "service reference" moves: schedule -> insert ring -> shard
// wheel -> executor task or Unfired. Every message (cancel, move) owns a reference of
// its own. The shard never exits while a message it knows of is outstanding (entry
// ground rule 4; the tables in src/shard/core.rs), and a sender's last access to the
// shard is the publication of its message (src/shard.rs, "publish last"). That is why
// a TimerHandle can hold a plain pointer to its shard.
//
// Thread map:
// - caller threads: ShardedTimer::{schedule*, stats, shutdown}, TimerHandle::*,
//   Unfired::*, Sleep/Timeout polls; they reach ShardShared::{push_insert,
//   send_cancel, send_move, nudge, request_stop, take_late}.
// - shard threads: ShardThread::run and everything in ShardCore, their own or, while
//   rescuing it, the watched shard's, holding its ownership token (the loom models run
//   ShardCore on the model's threads instead).
// - worker threads: executor::worker_loop, FiredEntry::run, RunTask::run (which calls
//   push_insert or hand_back_late), and, for a shutdown called from a callback,
//   Executor::run_queued_here.
// - any thread: the last EntryRef drop (frees the entry; drops a pending callback).

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg_attr(
    not(loom),
    allow(
        unreachable_pub,
        reason = "items are `pub` so that `__loom` can re-export them to the models"
    )
)]
mod clock;
#[cfg_attr(
    not(loom),
    allow(
        unreachable_pub,
        reason = "items are `pub` so that `__loom` can re-export them to the models"
    )
)]
mod dispatch;
#[cfg_attr(
    not(loom),
    allow(
        unreachable_pub,
        reason = "items are `pub` so that `__loom` can re-export them to the models"
    )
)]
mod entry;
mod error;
#[cfg_attr(
    not(loom),
    allow(
        unreachable_pub,
        reason = "items are `pub` so that `__loom` can re-export them to the models"
    )
)]
mod executor;
#[cfg_attr(
    not(loom),
    allow(
        unreachable_pub,
        reason = "items are `pub` so that `__loom` can re-export them to the models"
    )
)]
mod future;
mod handle;
#[cfg_attr(
    not(loom),
    allow(
        unreachable_pub,
        reason = "items are `pub` so that `__loom` can re-export them to the models"
    )
)]
mod home;
mod id;
mod interval;
#[cfg_attr(
    not(loom),
    allow(
        unreachable_pub,
        reason = "items are `pub` so that `__loom` can re-export them to the models"
    )
)]
mod limit;
#[cfg_attr(
    not(loom),
    allow(
        unreachable_pub,
        reason = "items are `pub` so that `__loom` can re-export them to the models"
    )
)]
mod ring;
mod routing;
#[cfg_attr(
    not(loom),
    allow(
        unreachable_pub,
        reason = "items are `pub` so that `__loom` can re-export them to the models"
    )
)]
mod shard;
mod stats;
mod sync;
#[cfg(not(loom))]
pub mod time;
mod timer;
pub mod wheel;

pub use clock::ManualClock;
pub use dispatch::{Callback, Callbacks};
pub use error::{BuildError, ScheduleError};
pub use future::{Elapsed, Sleep, Timeout};
pub use interval::{Interval, MissedTickBehavior};

/// What the loom models in `loom-tests/` drive: the ring, the entry state machine,
/// a shard's rings and park handshake, and the executor. Compiled only under
/// `--cfg loom`; not public API.
#[cfg(loom)]
#[doc(hidden)]
pub mod __loom {
    pub use crate::clock::{Nanos, Tick};
    pub use crate::dispatch::{RunHome, RunSink, RunTask};
    pub use crate::entry::{
        Cancel, CancelPort, CancelSink, CancelledCallback, Due, EntryRef, File, FiredEntry,
        HandleOptions, Message, RunningEntry, Snapshot,
    };
    pub use crate::entry::{SleepShared, ABANDONED, DISARMED, ELAPSED};
    pub use crate::executor::{Executor, Task};
    pub use crate::home::{Home, Users};
    /// The entry pool's heap and its cross-thread free (`src/entry/pool/`).
    pub mod pool {
        pub use crate::entry::pool::{free, Heap, CHUNK, HEAD};
    }
    pub use crate::limit::PendingLimit;
    pub use crate::ring::{Cursor, CursorSeed, PushError, Reservation, Reserve, Ring};
    pub use crate::shard::{
        park_for_model, run_as_shard_thread, Claim, Cursors, Custody, Expired, FiredQueue,
        ModelShard, ShardCore, ShardShared, AWAKE,
    };

    /// A fresh timer id (the models need one per entry).
    pub fn next_id() -> crate::TimerId {
        crate::TimerId::next()
    }
}
pub use handle::{TimerHandle, Unfired};
pub use id::{TimerId, TimerState};
pub use routing::Routing;
pub use stats::{LatenessHistogram, ShardLoad, Stats};
#[cfg(not(loom))]
pub use time::{global, EnterGuard};

/// `#[sharded_timer::test]` and `#[sharded_timer::main]` (feature `tokio`):
/// `#[tokio::test]` and `#[tokio::main]`, with the same arguments, whose
/// `start_paused = true` pauses this crate's time ([`time::pause`]) as well as
/// tokio's.
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub use sharded_timer_macros::{main, test};

/// What the attribute macros' expansions name, so that a user's crate needs no
/// `tokio` dependency of its own: not public API.
#[cfg(feature = "tokio")]
#[doc(hidden)]
pub mod __private {
    pub use tokio;
}
pub use timer::{Builder, ShardedTimer};
