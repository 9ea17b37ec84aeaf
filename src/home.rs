//! The service as seen from one core: [`CoreHome`], the shard that core's sleeps go
//! to and everything needed to schedule onto it, and [`Home`], how a `Sleep` keeps its
//! service alive without touching the service's reference count (issue 21).
//!
//! A `Sleep` (and a `Timeout`) used to hold a clone of its `ShardedTimer`: an `Arc`
//! increment when made and a decrement when dropped, on the one cache line that every
//! core making sleeps shares. Profiled on 2 cores (1,000 tokio tasks, each awaiting
//! 1,000 `timeout(1 s, f)`), that line's two locked instructions were 13 % of all
//! samples. A `Home` is one core's: each shard has one, and a sleep registers with
//! the home of the core it is made on, so the count it touches stays in that core's
//! cache. The home holds one reference to the service from its first sleep on, so a
//! sleep still keeps its service running (as tokio's `Sleep` keeps its runtime's
//! timer); that reference is given up only once no `ShardedTimer` is left and the
//! home has no sleep, so the service still shuts down when its last clone and its
//! last sleep are gone.
//!
//! # The protocol
//!
//! Three counts and a lock: the service counts its *users* (the `ShardedTimer`
//! clones; homes' references are not users); each home counts its *sleeps* and holds
//! `keep`, the service reference, under its lock, with `kept` saying whether it is
//! in.
//!
//! - **enter** (a sleep is made, from a `&ShardedTimer`, so users > 0): count the
//!   sleep; if `kept` is false, lock and put the reference in. Users never rise from
//!   0 (a clone needs a clone), so no release runs while a sleep is being made, and
//!   `kept` read true stays true until the last user is gone.
//! - **leave** (a sleep is dropped): uncount the sleep; only if that made the home
//!   empty *and* no user is left, lock and take the reference out if the home is
//!   still empty.
//! - **release** (the last user is dropped: users 1 → 0): lock each home and take its
//!   reference out if it has no sleep.
//!
//! The last two race like Dekker's: each writes its count, then reads the other's,
//! with a SeqCst fence between (as the shard's park handshake), so at least one of
//! them reads the other's write: either the leaving sleep sees no user and releases,
//! or the release sees the home empty. The reference taken out is dropped by the caller after the lock is released,
//! since dropping the service's last reference shuts it down (which runs user code).
//! In the common case (users alive, sleeps coming and going) a sleep costs its home
//! two uncontended read-modify-writes and two reads of lines that rarely change.
//! `loom-tests/tests/home.rs` drives this very type; it fails when `leave` reads the
//! users Relaxed, or when the release skips a home.

#![forbid(unsafe_code)]

use std::fmt;
use std::time::Instant;

use crate::clock::{Clock, Nanos, TimeSource};
use crate::entry::EntryRef;
use crate::error::ScheduleError;
use crate::handle::{HandleOptions, TimerHandle};
use crate::id::TimerId;
use crate::limit::PendingLimit;
use crate::shard::{DirectPort, ShardShared};
use crate::sync::{current_cpu, fence, Arc, AtomicBool, AtomicUsize, CachePadded, Mutex, Ordering};

/// One shard of a service, with what scheduling onto it needs: the service's clock,
/// time source, pending bound and handle options, and the [`Home`] of the sleeps
/// made on the shard's core. `K` is the service (`ShardedTimer`); generic so that
/// this module sits below the façade in the import graph.
pub(crate) struct CoreHome<K> {
    /// The sleeps registered here, and the service's clone kept for them.
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
    /// The service's users (its `ShardedTimer` clones), shared by its homes.
    users: Arc<CachePadded<AtomicUsize>>,
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
        users: Arc<CachePadded<AtomicUsize>>,
    ) -> CoreHome<K> {
        CoreHome {
            home: Home::new(),
            users,
            shard,
            direct,
            clock,
            time,
            limit,
            handle_options,
        }
    }

    /// The home of this core's sleeps.
    pub(crate) fn home(&self) -> &Home<K> {
        &self.home
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

    /// The service's clock.
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Schedules the entry `make` builds for `id`, due at `deadline` (nanoseconds from
    /// tick 0), on this home's shard; it takes room under `max_pending` if `holds_room`.
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
        make: impl FnOnce(TimerId) -> (EntryRef, EntryRef),
    ) -> Result<TimerHandle, ScheduleError> {
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
            // references drops the callback.
            drop(service_ref);
            drop(handle_ref);
            if let Some(limit) = limit {
                limit.release();
            }
            return Err(ScheduleError::Shutdown);
        }
        Ok(TimerHandle::new(
            handle_ref,
            shard,
            self.handle_options.clone(),
        ))
    }

    /// Schedules a `Sleep`'s timer at `deadline` (its entry holds the sleep's outcome
    /// and waker, `entry/sleep.rs`): shutdown cancels it (completing the sleep) instead
    /// of handing it back, and only a `try_*` future's timer
    /// (`holds_room`) is bounded by `max_pending` (guarantee 9; docs/architecture.md).
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Self::enqueue).
    pub(crate) fn schedule_sleep(
        &self,
        deadline: Instant,
        holds_room: bool,
    ) -> Result<TimerHandle, ScheduleError> {
        let deadline = self.clock.instant_to_ns(deadline);
        self.enqueue(TimerId::next(), deadline, holds_room, |id| {
            EntryRef::new_sleep(id, deadline, holds_room)
        })
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

/// The index, among `homes`, of the home a new timer `id` goes to: the calling
/// thread's core's, as for sleeps, or, where the core is unknown, the one `id`'s hash
/// picks. By core rather than by hash since producers file directly into their shard's
/// wheel (`shard/direct.rs`): each wheel then stays in one core's cache and its token
/// is contended only by its own shard's turns (issue 30 measured 2 producers on 2
/// cores: schedule 6.2 → 10.1 M/s, schedule+cancel 4.7 → 8.2 M pairs/s, CPU per pair
/// 420 → 215 ns; 16 producers on 16 cores: 26 → 71 M/s).
pub(crate) fn route(homes: usize, id: TimerId) -> usize {
    match current_cpu() {
        Some(cpu) => cpu % homes,
        None => id.shard_index(homes),
    }
}

/// A sleep's registration with the home of the core it was made on: keeps the
/// service alive (through the home's reference, module docs) and schedules the sleep's
/// timers onto that home's shard. Dropping it unregisters.
pub(crate) struct Registration<K: Clone> {
    /// The home; an `Arc`, so that the home outlives a registration dropped after
    /// the service has gone.
    home: Arc<CoreHome<K>>,
}

impl<K: Clone> Registration<K> {
    /// Registers with `home`, the home of the service `service` (alive for this call).
    pub(crate) fn enter(home: &Arc<CoreHome<K>>, service: &K) -> Registration<K> {
        home.home.enter(service);
        Registration { home: home.clone() }
    }
}

impl<K: Clone> std::ops::Deref for Registration<K> {
    type Target = CoreHome<K>;
    fn deref(&self) -> &CoreHome<K> {
        &self.home
    }
}

impl<K: Clone> Drop for Registration<K> {
    fn drop(&mut self) {
        // The service's last clone may be in here: dropped after `leave` released
        // the lock (its drop shuts the service down, which runs user code).
        drop(self.home.home.leave(&self.home.users));
    }
}

impl<K: Clone> fmt::Debug for Registration<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration").finish_non_exhaustive()
    }
}

/// One core's sleeps, and the reference to the service that keeps it alive while
/// they exist. See the module docs for the protocol.
#[derive(Debug)]
pub struct Home<K> {
    /// Registered sleeps. Alone on its cache line: only this core's sleeps touch it.
    sleeps: CachePadded<AtomicUsize>,
    /// Whether `keep` holds the reference: read without the lock by `enter`.
    kept: AtomicBool,
    /// The reference; put in and taken out only under this lock.
    keep: Mutex<Option<K>>,
}

impl<K: Clone> Home<K> {
    /// A home with no sleep and no reference.
    pub fn new() -> Home<K> {
        Home {
            sleeps: CachePadded::new(AtomicUsize::new(0)),
            kept: AtomicBool::new(false),
            keep: Mutex::new(None),
        }
    }

    /// Registers one more sleep. `service` (a reference the caller holds, from a user
    /// of the service: users > 0 for the whole call) is cloned in if the home holds
    /// none.
    pub fn enter(&self, service: &K) {
        // ORDERING: Relaxed: a sleep is made while users > 0, so no release runs
        // concurrently (module docs); a later leave's fence orders it.
        self.sleeps.fetch_add(1, Ordering::Relaxed);
        // ORDERING: Relaxed: `kept` is only cleared by a release, which cannot run
        // while users > 0 (module docs); a stale `false` just takes the lock.
        if !self.kept.load(Ordering::Relaxed) {
            let mut keep = self.keep.lock().unwrap_or_else(|e| e.into_inner());
            if keep.is_none() {
                *keep = Some(service.clone());
            }
            // ORDERING: Relaxed: written under the lock; see the load above.
            self.kept.store(true, Ordering::Relaxed);
        }
    }

    /// Unregisters one sleep. Returns the reference if this was the home's last sleep
    /// and `users` (the service's count of users) is 0: the caller drops it after
    /// this returns.
    #[must_use = "the reference taken out is to be dropped outside the lock"]
    pub fn leave(&self, users: &AtomicUsize) -> Option<K> {
        // ORDERING: Relaxed, then the SeqCst fence: this side of the Dekker race
        // (module docs), ordered as the shard's park handshake is, by fences (which
        // loom models; it does not model SeqCst accesses alone).
        if self.sleeps.fetch_sub(1, Ordering::Relaxed) != 1 {
            return None;
        }
        fence(Ordering::SeqCst);
        // ORDERING: Relaxed: ordered by the fence above, which pairs with the one in
        // `user_gone`.
        if users.load(Ordering::Relaxed) != 0 {
            return None;
        }
        self.release()
    }

    /// Takes the reference out if the home has no sleep: the last user is gone
    /// ([`user_gone`] for each home, or [`leave`](Self::leave)). The caller drops
    /// what it returns outside the lock.
    #[must_use = "the reference taken out is to be dropped outside the lock"]
    fn release(&self) -> Option<K> {
        let mut keep = self.keep.lock().unwrap_or_else(|e| e.into_inner());
        // ORDERING: Relaxed: the caller's SeqCst fence (after its write of `sleeps` or
        // of `users`) orders it (module docs).
        if self.sleeps.load(Ordering::Relaxed) != 0 {
            return None;
        }
        // ORDERING: Relaxed: written under the lock; no sleep is made any more.
        self.kept.store(false, Ordering::Relaxed);
        keep.take()
    }

    /// Registered sleeps now (a snapshot, for tests).
    #[cfg(any(test, loom))]
    pub fn registered(&self) -> usize {
        // ORDERING: Relaxed: a statistic.
        self.sleeps.load(Ordering::Relaxed)
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

/// A user of the service is dropped (`ShardedTimer::drop`): counts it out of `users`
/// and, if it was the last, takes the reference out of every home in `homes` that
/// has no sleep. The caller drops what comes back after this returns.
#[must_use = "the references taken out are to be dropped outside the homes' locks"]
pub fn user_gone<'a, K: Clone + 'a>(
    users: &AtomicUsize,
    homes: impl IntoIterator<Item = &'a Home<K>>,
) -> Vec<K> {
    // ORDERING: Relaxed, then the SeqCst fence: the release's side of the Dekker race
    // (module docs); the fence pairs with the one in `Home::leave`.
    if users.fetch_sub(1, Ordering::Relaxed) != 1 {
        return Vec::new();
    }
    fence(Ordering::SeqCst);
    homes.into_iter().filter_map(Home::release).collect()
}

impl<K: Clone> Default for Home<K> {
    fn default() -> Self {
        Home::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::Home;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    #[test]
    fn a_home_keeps_its_reference_until_no_user_and_no_sleep_is_left() {
        let service = Arc::new(());
        let users = AtomicUsize::new(1);
        let home = Home::new();
        home.enter(&service);
        home.enter(&service);
        assert_eq!(
            Arc::strong_count(&service),
            2,
            "one reference for both sleeps"
        );
        assert!(home.leave(&users).is_none());
        assert!(
            home.leave(&users).is_none(),
            "a user is left: the home keeps it"
        );
        assert!(home.keeps());
        home.enter(&service);
        assert_eq!(Arc::strong_count(&service), 2, "taken once, kept since");
        // The last user goes while a sleep is registered: kept for the sleep.
        assert!(super::user_gone(&users, [&home]).is_empty());
        assert!(home.keeps());
        // The last sleep goes: the reference comes out.
        let last = home.leave(&users).expect("the last sleep takes it out");
        drop(last);
        assert_eq!(Arc::strong_count(&service), 1);
        assert!(!home.keeps());
        assert_eq!(home.registered(), 0);
    }

    #[test]
    fn the_last_user_releases_an_empty_home() {
        let service = Arc::new(());
        let users = AtomicUsize::new(1);
        let home = Home::new();
        home.enter(&service);
        assert!(home.leave(&users).is_none());
        assert_eq!(super::user_gone(&users, [&home]).len(), 1);
        assert!(!home.keeps());
    }
}
