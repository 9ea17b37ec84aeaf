//! The service as seen from one core: [`CoreHome`], the shard that core's sleeps go
//! to and everything needed to schedule onto it, and how a `Sleep` keeps its service
//! alive without touching the service's reference count (issues 21 and 30).
//!
//! A `Sleep` (and a `Timeout`) used to hold a clone of its `ShardedTimer`: an `Arc`
//! increment when made and a decrement when dropped, on the one cache line that every
//! core making sleeps shares. Profiled on 2 cores (1,000 tokio tasks, each awaiting
//! 1,000 `timeout(1 s, f)`), that line's two locked instructions were 13 % of all
//! samples. Instead a sleep holds a clone of the `Arc` of the [`CoreHome`] of the core
//! it is made on, so the count it touches stays in that core's cache, and that home
//! keeps the service running for its sleeps (as tokio's `Sleep` keeps its runtime's
//! timer) once no `ShardedTimer` is left.
//!
//! # The protocol: an `Arc` per home, and a hand-off at the last user's drop
//!
//! - The service's *users* (its `ShardedTimer` clones) share one [`Users`]: it holds
//!   every home's `Arc`, and a reference to the service. The homes are held by the
//!   users, not by the service, so that a home can outlive the users and the service
//!   without a cycle.
//! - A sleep is made from a user: it clones its home's `Arc` (one uncontended
//!   read-modify-write on that home's count), and drops it when it is dropped.
//! - The last user's drop (`Users`'s) first gives every home a clone of the service
//!   reference ([`Home::keep`]), then drops its `Arc`s of the homes. A home whose last
//!   `Arc` goes (at once, if it has no sleep; else with its last sleep) drops its
//!   reference, and the last of those shuts the service down.
//!
//! Nothing is raced here that `Arc` itself does not order. The service reference is
//! put into a home before the users' `Arc` of it is dropped, so whoever drops that
//! home's last `Arc` finds it in (`Arc`'s drop orders every use before the last
//! decrement, Release then Acquire). While any sleep is registered, its home is alive
//! and holds the reference or a user is left: the service runs. A sleep costs two
//! uncontended read-modify-writes, on its core's home (issue 30 measured: the earlier
//! protocol's count of sleeps beside the `Arc`, with a SeqCst fence each time the count
//! fell to 0, cost a ready `timeout` 7–8 ns of its 35).
//!
//! The service's last reference may be dropped where a home is dropped; dropping it
//! shuts the service down, which runs user code: never under the home's lock (the
//! lock is `get_mut`'s when the home is dropped). `loom-tests/tests/home.rs` drives
//! [`Users`] and [`Home`]; it fails when the hand-off skips a home.

#![forbid(unsafe_code)]

use std::fmt;
use std::task::Waker;
use std::time::Instant;

use crate::clock::{Clock, Nanos, TimeSource};
use crate::entry::{EntryRef, HandleOptions};
use crate::error::{Refusal, ScheduleError};
use crate::handle::{EntryHandle, TimerHandle};
use crate::id::TimerId;
use crate::limit::PendingLimit;
use crate::shard::{DirectPort, ShardShared};
use crate::sync::{current_cpu, Arc, Mutex};

/// One shard of a service, with what scheduling onto it needs: the service's clock,
/// time source, pending bound and handle options, and the [`Home`] of the sleeps
/// made on the shard's core. `K` is the service (`ShardedTimer`); generic so that
/// this module sits below the façade in the import graph.
pub(crate) struct CoreHome<K> {
    /// The service's reference kept for the sleeps registered here once no user is
    /// left (module docs).
    home: Home<K>,
    /// The shard this home schedules onto.
    shard: Arc<ShardShared>,
    /// Its custody, to file new timers into its wheel directly (`shard/direct.rs`).
    direct: DirectPort,
    /// Ticks ↔ instants.
    clock: Clock,
    /// Where the service reads the time.
    time: TimeSource,
    /// The pending bound, if configured.
    limit: Option<Arc<PendingLimit>>,
    /// What every handle keeps of the options (`None` on a default service).
    handle_options: Option<Arc<HandleOptions>>,
}

impl<K: Clone> CoreHome<K> {
    /// The home of `shard`.
    pub(crate) fn new(
        shard: Arc<ShardShared>,
        direct: DirectPort,
        clock: Clock,
        time: TimeSource,
        limit: Option<Arc<PendingLimit>>,
        handle_options: Option<Arc<HandleOptions>>,
    ) -> CoreHome<K> {
        CoreHome {
            home: Home::new(),
            shard,
            direct,
            clock,
            time,
            limit,
            handle_options,
        }
    }

    /// The service's now.
    pub(crate) fn now(&self) -> Instant {
        self.time.now()
    }

    /// Whether the service runs on a [`ManualClock`](crate::ManualClock).
    pub(crate) fn is_manual(&self) -> bool {
        matches!(self.time, TimeSource::Manual(_))
    }

    /// An instant at or after the service's now, where one is cheaper than
    /// [`now`](Self::now) (`TimeSource::latest_now`).
    pub(crate) fn latest_now(&self) -> Option<Instant> {
        self.time.latest_now()
    }

    /// Whether `deadline` is at or before the service's now (cheaply: `coarse.rs`).
    pub(crate) fn is_past(&self, deadline: Instant) -> bool {
        self.time.is_past(deadline)
    }

    /// The error a [`Refusal`] stands for on this service.
    pub(crate) fn refusal_error(&self, refusal: Refusal) -> ScheduleError {
        refusal.error(self.limit.as_ref().map(|limit| limit.limit()))
    }

    /// The service's pending bound, if configured.
    pub(crate) fn limit(&self) -> Option<&PendingLimit> {
        self.limit.as_deref()
    }

    /// The service's clock.
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Schedules the entry `make` builds for `id` (keeping the service's handle
    /// options, which `make` gets), due at `deadline` (nanoseconds from tick 0), on
    /// this home's shard; it takes room under `max_pending` if `holds_room`.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::TooManyPending`] when the bound is reached;
    /// [`ScheduleError::Shutdown`] when the shard's ring is closed (the entry is then
    /// dropped here, and with it its callback: nobody else has seen it).
    pub(crate) fn enqueue(
        &self,
        id: TimerId,
        deadline: Nanos,
        holds_room: bool,
        make: impl FnOnce(TimerId, Option<Arc<HandleOptions>>) -> (EntryRef, EntryRef),
    ) -> Result<TimerHandle, ScheduleError> {
        self.file(id, deadline, holds_room, |id| {
            make(id, self.handle_options.clone())
        })
        .map(TimerHandle::new)
    }

    /// As [`enqueue`](Self::enqueue), returning the handle without the options (a
    /// `Sleep`'s: it reaches them through its home).
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue).
    fn file(
        &self,
        id: TimerId,
        deadline: Nanos,
        holds_room: bool,
        make: impl FnOnce(TimerId) -> (EntryRef, EntryRef),
    ) -> Result<EntryHandle, ScheduleError> {
        let limit = self.limit.as_ref().filter(|_| holds_room);
        if let Some(limit) = limit {
            if !limit.try_acquire() {
                return Err(ScheduleError::TooManyPending {
                    limit: limit.limit(),
                });
            }
        }
        let (handle_ref, service_ref) = make(id);
        let shard = &*self.shard;
        let due = self.clock.due_tick(deadline);
        // Filed directly if the shard's token is free, else through its ring.
        if let Err(service_ref) = self.direct.schedule(shard, service_ref, due) {
            // The shard has shut down: nobody else has seen this entry; dropping both
            // references drops the callback. A sleep's waker (stored by the poll that
            // arms it) is taken out first, so that the drop, which finishes the sleep
            // abandoned, wakes nobody: the refusal completes that poll at once.
            let waker = handle_ref
                .sleep_shared()
                .and_then(|shared| shared.give_up().1);
            drop(service_ref);
            drop(handle_ref);
            if let Some(limit) = limit {
                limit.release();
            }
            // User code last, after the bookkeeping.
            drop(waker);
            return Err(ScheduleError::Shutdown);
        }
        Ok(EntryHandle::new(handle_ref, shard))
    }

    /// Schedules a `Sleep`'s timer at `deadline` (its entry holds the sleep's outcome
    /// and waker, `entry/sleep.rs`): shutdown cancels it (completing the sleep) instead
    /// of handing it back, and only a `try_*` future's timer
    /// (`holds_room`) is bounded by `max_pending` (guarantee 9; docs/architecture.md).
    /// `waker`: the waker of the task whose poll arms it, stored in the entry before
    /// it is filed (`SleepShared::polled`).
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue).
    pub(crate) fn schedule_sleep(
        &self,
        deadline: Instant,
        holds_room: bool,
        waker: Option<&Waker>,
    ) -> Result<EntryHandle, Refusal> {
        let deadline = self.clock.instant_to_ns(deadline);
        self.file(TimerId::next(), deadline, holds_room, |id| {
            EntryRef::new_sleep(id, deadline, holds_room, waker.cloned())
        })
        .map_err(Refusal::from)
    }
}

impl<K> fmt::Debug for CoreHome<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoreHome")
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// The index, among `homes`, of the home of the core the calling thread runs on
/// (`sched_getcpu`; shard `k` is pinned to core `k`), or of a home picked by the
/// thread's id block where the core is unknown (loom, Miri, other systems).
pub(crate) fn home_index(homes: usize) -> usize {
    match current_cpu() {
        Some(cpu) => cpu % homes,
        None => TimerId::next().shard_index(homes),
    }
}

impl<K> AsRef<Home<K>> for CoreHome<K> {
    fn as_ref(&self) -> &Home<K> {
        &self.home
    }
}

/// A home's reference to the service, kept for its sleeps once the service's last
/// user is gone (module docs): put in by [`Users`]'s drop, dropped with the home,
/// that is when the home's last `Arc` (its last sleep's) goes.
#[derive(Debug)]
pub struct Home<K> {
    /// The reference; `None` while a user is left.
    keep: Mutex<Option<K>>,
}

impl<K> Home<K> {
    /// A home holding no reference.
    pub fn new() -> Home<K> {
        Home {
            keep: Mutex::new(None),
        }
    }

    /// Keeps `service` for this home's sleeps (the last user is going). Returns the
    /// reference it replaces, if any (none: `Users` is dropped once), for the caller
    /// to drop outside the lock.
    #[must_use = "the reference replaced is to be dropped outside the lock"]
    pub fn keep(&self, service: K) -> Option<K> {
        self.keep
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(service)
    }

    /// Whether the home holds its reference now (for tests).
    #[cfg(any(test, loom))]
    pub fn keeps(&self) -> bool {
        self.keep
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

/// A home is its own `Home` (the loom model's homes are nothing else).
impl<K> AsRef<Home<K>> for Home<K> {
    fn as_ref(&self) -> &Home<K> {
        self
    }
}

impl<K> Default for Home<K> {
    fn default() -> Self {
        Home::new()
    }
}

impl<K> Drop for Home<K> {
    fn drop(&mut self) {
        // The service's reference, dropped outside the lock (this may be its last:
        // the shutdown runs user code). `get_mut`: nobody else can reach the home.
        let kept = self
            .keep
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(kept);
    }
}

/// What the service's users (its `ShardedTimer` clones) share: every core's home,
/// held here rather than by the service, and a reference to the service to hand to
/// them when the last user goes (module docs). `H` is the home (`CoreHome<K>`; the
/// loom model's own `Home<K>`).
pub struct Users<H: AsRef<Home<K>>, K: Clone> {
    /// Every core's home: `homes[k]` schedules onto shard `k`.
    homes: Box<[Arc<H>]>,
    /// The service, handed to every home when the last user goes.
    service: K,
}

impl<H: AsRef<Home<K>>, K: Clone> Users<H, K> {
    /// The users' share of `service`, whose homes are `homes`.
    pub fn new(homes: Box<[Arc<H>]>, service: K) -> Users<H, K> {
        Users { homes, service }
    }

    /// Every core's home.
    pub fn homes(&self) -> &[Arc<H>] {
        &self.homes
    }
}

impl<H: AsRef<Home<K>>, K: Clone> Drop for Users<H, K> {
    fn drop(&mut self) {
        // The last user is gone: every home keeps the service for its sleeps before
        // the users' `Arc`s of the homes are dropped (after this body, with the
        // fields), so that the last `Arc` of each finds it in. No home held one
        // before (this runs once), so nothing is replaced.
        for home in self.homes.iter() {
            drop((**home).as_ref().keep(self.service.clone()));
        }
    }
}

impl<H: AsRef<Home<K>>, K: Clone> fmt::Debug for Users<H, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Users")
            .field("homes", &self.homes.len())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{Home, Users};
    use std::sync::Arc;

    #[test]
    fn a_home_keeps_the_service_from_the_last_users_drop_until_its_last_sleep() {
        let service = Arc::new(());
        let homes: Box<[Arc<Home<Arc<()>>>]> =
            vec![Arc::new(Home::new()), Arc::new(Home::new())].into();
        let users = Arc::new(Users::new(homes, service.clone()));
        let sleep = users.homes()[0].clone();
        let other = users.clone();
        drop(users);
        assert!(!sleep.keeps(), "a user is left: no home keeps the service");
        assert_eq!(Arc::strong_count(&service), 2, "the test's and the users'");
        drop(other);
        assert!(
            sleep.keeps(),
            "the last user is gone: the sleep's home keeps it"
        );
        assert_eq!(
            Arc::strong_count(&service),
            2,
            "the home without a sleep gave its reference back at once"
        );
        drop(sleep);
        assert_eq!(Arc::strong_count(&service), 1, "the last sleep let it go");
    }
}
