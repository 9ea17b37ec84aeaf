//! Direct filing and unlinking: a producer files its new timer into its shard's wheel
//! itself, and a canceller unlinks its timer itself, when nobody holds the shard's
//! custody token; the rings stay for when somebody does.
//!
//! # Design and source
//!
//! Every per-core timer system inserts on the caller's thread under a per-core lock
//! that is almost never contended: Linux's per-CPU `timer_base` (a spinlock per CPU,
//! taken by `add_timer` on the local base), Go's per-P timer heaps (a lock per P;
//! other Ps take it to steal when the owner is busy), tokio's sharded wheels (one
//! lock per worker). A shard already has such a lock: the custody token
//! (`custody.rs`) that its own thread takes for each turn and a rescuer takes to turn
//! a stuck shard. So `schedule` tries that token with one CAS; if it gets it, it files
//! the entry into the wheel in one pass (the same filing, through the same
//! `ShardCore`, as the drain of the insert ring), gives the token back and unparks
//! the shard only if the new deadline is earlier than the wake-up the shard published.
//! If the token is held (the shard is in a turn, a rescuer or another producer is
//! filing), it pushes into the insert ring as before, without waiting: the ring is the
//! contended path, and the shard drains it every turn. A handle's cancel (or a reset
//! to an earlier deadline, or a dropped future's cancel) wins the entry's CAS as
//! before and then does the same: under the token it takes its own message, exactly
//! as the shard's drain of the message ring would; without it, it sends the message.
//! Filing costs one CAS, the wheel's insert and one store, instead of the ring's
//! reservation, SeqCst fence and publication plus the shard's pop and insert; a
//! schedule+cancel pair no longer pays the hand-off twice.
//!
//! # Ground rules
//!
//! - **Same core, same bookkeeping.** A direct operation is `ShardCore::file_direct`
//!   or `ShardCore::cancel_direct` / `move_direct`: the drain's code for one entry or
//!   message, with
//!   its counters (`filed_direct`, `cancelled`), its awaited messages (entry ground
//!   rule 4) and the entry's service reference, all under the token. `max_pending`
//!   room is taken and freed by the caller as on the ring path.
//! - **Never wait.** A direct operation only ever *tries* the token; a held token
//!   sends it to the ring. So a producer on a shard thread (an inline callback, a
//!   spawner, a rescuer's run) never waits for a shard, its own included, and code
//!   that holds a token and reaches a direct operation (none does: the core runs no
//!   user code) would fall back to the ring rather than deadlock.
//! - **Never ahead of a waiter.** A direct operation tries the token only while no
//!   thread waits for it (`Custody::try_with_unless_awaited`; custody.rs, ground
//!   rules: waiters first), so a firehose of producers filing back to back cannot
//!   keep the owner's turn, and the expiry it runs, waiting for longer than one
//!   single-entry hold per producer.
//! - **Lists grow on the shard's thread.** A direct filing or move that would grow
//!   the wheel list it goes to (no free place in its vector,
//!   `ShardCore::has_room_for`) is not made: the timer or message goes by its ring,
//!   as if the token were held, waking the shard (whatever its plan), which files
//!   it, growing the list in its own allocator arena; the filings after that go
//!   direct again. With glibc the arena a block was allocated in is where it is
//!   later grown, cut down and freed, and a producer's arena is full of the small
//!   blocks (boxed callbacks) freed as its timers fire: a shard that cut down a list
//!   a producer had allocated first paid for consolidating all of them, under its
//!   token, with every due timer waiting (core.rs, `has_room_for`).
//! - **No user code under the token.** References a direct operation gives up (a
//!   cancelled entry's service reference, the wheel's) are dropped
//!   after the token is given back, and the callback of a winning cancel is dropped by
//!   its canceller after that (entry ground rule 2); dropping an entry's reference
//!   under the token could never run user code anyway (the canceller's own reference
//!   keeps the entry), but nothing relies on it.
//! - **The park handshake, direct.** The shard decides how long to sleep while it
//!   holds its token: `plan_park` reads the core's next expiry and publishes the
//!   wake-up in `next_wake` inside the same hold (`park.rs`). A direct filer
//!   reads `next_wake` inside its own hold, after filing. Holds are ordered by the
//!   token (each Release store of the token synchronises with the next holder's
//!   Acquire CAS), so for the last plan `S` before the shard's sleep and the filer's
//!   hold `P`: if `P` came first, `S` read a next expiry at or before the new
//!   deadline and the shard sleeps no later than it; if `S` came first, its store of
//!   the wake-up `w` happens-before `P`'s read, so `P` reads `w` or a value the shard
//!   stored after this sleep ended (it writes [`AWAKE`](super::AWAKE) when it wakes,
//!   and only its own thread writes `next_wake`): if the deadline is before `w`, `P`
//!   unparks it, and an unpark before the park makes the park return. No wake-up is
//!   lost, and no fence is needed: the token's Acquire and Release carry the order
//!   that the ring path's two SeqCst fences carry there. A shard that is awake
//!   publishes `AWAKE`, and its next plan, in a later hold, sees the entry.
//!   `loom-tests/tests/direct.rs` checks this on the real code, and fails if the
//!   filer reads `next_wake` before taking the token.
//! - **Shutdown.** Shutdown takes the core out of custody (`take_own_core`) before it
//!   closes and drains the insert ring. A direct filer that finds the token free but
//!   the core gone pushes into the ring, whose close decides as before: drained into
//!   the `Unfired`s, or refused (`ScheduleError::Shutdown`). One that filed before
//!   the core was taken left the entry in the wheel, which shutdown empties. A
//!   canceller that finds the core gone sends its message, which shutdown waits for.
//! - **Lifetimes.** A producer reaches the custody through its [`DirectPort`] (an
//!   `Arc`, kept by the service's home for that shard), so it may find the core gone
//!   but never the custody. A message's sender reaches it through the shard's
//!   [`CustodySlot`], a plain pointer, under the obligation it already has for the
//!   shard itself (entry ground rule 4): it owes the shard a message, so the shard
//!   has not finished its shutdown, and the shard's own thread (or a model) keeps the
//!   custody until it has. Its last access to the shard is the token's release (the
//!   direct form of "publish last"); a thread handle to unpark is taken before it.

#![allow(
    unsafe_code,
    reason = "the custody slot is a plain pointer under the message sender's obligation"
)]

use super::custody::Custody;
use super::turn::InCustody;
use super::ShardShared;
use crate::clock::Tick;
use crate::entry::EntryRef;
use crate::sync::{Arc, AtomicPtr, Ordering};

/// What a producer keeps to file onto one shard directly: its custody.
#[derive(Clone, Debug)]
pub(crate) struct DirectPort {
    /// The shard's core and fired queue, behind the token.
    custody: Arc<Custody<InCustody>>,
}

impl DirectPort {
    /// The port of the shard whose core `custody` holds.
    pub(super) fn new(custody: Arc<Custody<InCustody>>) -> Self {
        DirectPort { custody }
    }

    /// Schedules a new timer onto `shard` (this port's shard): files `entry` (its
    /// service reference) due at tick `deadline` directly if the token is free and
    /// the core still there, else pushes it into the insert ring (ground rules).
    ///
    /// # Errors
    ///
    /// The entry comes back if the shard has shut down (its insert ring is closed).
    pub(crate) fn schedule(
        &self,
        shard: &ShardShared,
        entry: EntryRef,
        deadline: Tick,
    ) -> Result<(), EntryRef> {
        match file(&self.custody, shard, entry, deadline) {
            Ok(()) => {
                // A shard thread's pushes deferred earlier go now (own.rs).
                super::own::retry_deferred_after_push();
                Ok(())
            }
            Err((entry, NotFiled::Busy)) => shard.push_insert(entry, deadline),
            // The shard grows the list now (ground rules: lists grow on the
            // shard's thread).
            Err((entry, NotFiled::NoRoom)) => shard.push_insert_to_grow(entry, deadline),
        }
    }
}

/// Why a direct filing was not made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NotFiled {
    /// The token was held (or awaited), or the core gone.
    Busy,
    /// The wheel list the timer goes to has no free place (ground rules: lists grow
    /// on the shard's thread).
    NoRoom,
}

/// Files `entry`, due at tick `deadline`, into the wheel of the core in `custody`
/// (`shard`'s) if the token is free, the core there and the timer's list has room;
/// unparks the shard if it sleeps past `deadline`. The entry comes back otherwise,
/// untouched, with the reason.
fn file(
    custody: &Custody<InCustody>,
    shard: &ShardShared,
    entry: EntryRef,
    deadline: Tick,
) -> Result<(), (EntryRef, NotFiled)> {
    let mut entry = Some(entry);
    // Never ahead of a waiter (the owner's turn): the ring instead (custody.rs,
    // ground rules: waiters first).
    let filed = custody.try_with_unless_awaited(|held| {
        let Some(core) = held.core_mut() else {
            return Err(NotFiled::Busy);
        };
        // Lists grow on the shard's thread (ground rules): no room, the ring.
        if !core.has_room_for(deadline) {
            return Err(NotFiled::NoRoom);
        }
        let cancelled = core.file_direct(entry.take().expect("filed once"));
        // ORDERING: Relaxed, inside our hold: the shard publishes its wake-up inside
        // its own hold, so the token orders that store before this read, or this read
        // before the plan that sees our entry (ground rules: the park handshake,
        // direct).
        let sleeps_until = Tick::new(shard.next_wake.load(Ordering::Relaxed));
        Ok((deadline < sleeps_until, cancelled))
    });
    match filed.unwrap_or(Err(NotFiled::Busy)) {
        Ok((wake, cancelled)) => {
            // After the token is given back (ground rules: no user code under it).
            drop(cancelled);
            if wake {
                // The producer's home keeps the shard alive: it may touch it still.
                shard.thread.unpark();
            }
            Ok(())
        }
        Err(why) => Err((entry.expect("not filed: the entry comes back"), why)),
    }
}

/// Which message a sender takes itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Taken {
    /// A winning cancel's.
    Cancel,
    /// An earlier reset's.
    Move,
}

/// Takes the `kind` message for `entry` under `shard`'s token if it is free and the
/// core there (ground rules), lending the sender's own reference: returns whether it
/// did; if not, the caller sends the message.
pub(super) fn take(shard: &ShardShared, kind: Taken, entry: &EntryRef) -> bool {
    // SAFETY: the caller owes `shard` this message (entry ground rule 4), so the shard
    // has not finished its shutdown, and whoever put its core in custody keeps the
    // custody until it has (`CustodySlot::set`'s contract).
    let Some(custody) = (unsafe { shard.custody.get() }) else {
        return false;
    };
    // As a filer, never ahead of a waiter.
    let taken = custody.try_with_unless_awaited(|held| {
        let core = held.core_mut()?;
        // A move re-files the entry: lists grow on the shard's thread (ground rules).
        // The room is judged by the deadline read here; a later reset's store racing
        // in before the move's own read (it reads after clearing MOVING, as it must)
        // may send the entry to another list, grown on this thread: a slip of
        // placement only, never of timing.
        if kind == Taken::Move && !core.has_room_for(core.due_tick(entry)) {
            return None;
        }
        let unlinked = match kind {
            Taken::Cancel => core.cancel_direct(entry),
            Taken::Move => {
                core.move_direct(entry);
                None
            }
        };
        // A move makes the entry due earlier (filed, or still in the insert ring, whose
        // push judged the wake-up by the old deadline): as a filer does, read the
        // published wake-up inside our hold, and take the thread's handle before we give
        // the token back, our last access to the shard (ground rules: lifetimes).
        // ORDERING: Relaxed: ordered by the token, as in `file`.
        let sleeps_until = Tick::new(shard.next_wake.load(Ordering::Relaxed));
        let wake_up = (kind == Taken::Move && core.due_tick(entry) < sleeps_until)
            .then(|| shard.thread.get())
            .flatten();
        shard.canary.touch();
        Some((unlinked, wake_up))
    });
    match taken.flatten() {
        Some((unlinked, wake_up)) => {
            // After the token is given back (ground rules: no user code under it).
            drop(unlinked);
            if let Some(shard_thread) = wake_up {
                shard_thread.unpark();
            }
            // A shard thread's pushes deferred earlier go now (own.rs).
            super::own::retry_deferred_after_push();
            true
        }
        None => false,
    }
}

/// Where a shard's core is in custody, for the senders of its messages (ground rules:
/// lifetimes): a plain pointer, set once.
#[derive(Debug, Default)]
pub(super) struct CustodySlot(AtomicPtr<Custody<InCustody>>);

impl CustodySlot {
    /// Records `custody` as where the shard's core is.
    ///
    /// # Safety
    ///
    /// `custody` stays alive until the shard's `ShardCore::shut_down` has received
    /// every message it waits for (the shard thread's own link keeps it; a model keeps
    /// its `ModelShard`), and it is set before any message can be sent.
    pub(super) unsafe fn set(&self, custody: &Arc<Custody<InCustody>>) {
        // ORDERING: Release pairs with `get`'s Acquire: the custody is initialised
        // before a sender reaches it (in the service, set before the shard is shared).
        self.0
            .store(Arc::as_ptr(custody).cast_mut(), Ordering::Release);
    }

    /// The custody, if one was recorded.
    ///
    /// # Safety
    ///
    /// The caller owes the shard a message it waits for (entry ground rule 4), so the
    /// custody is still alive (`set`'s contract), for at least the returned borrow.
    unsafe fn get(&self) -> Option<&Custody<InCustody>> {
        // ORDERING: Acquire pairs with `set`'s Release.
        let custody = self.0.load(Ordering::Acquire);
        // SAFETY: non-null only once set; alive by the caller's obligation.
        unsafe { custody.as_ref() }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use super::{DirectPort, InCustody};
    use crate::clock::{Nanos, Tick, TimeSource};
    use crate::entry::EntryRef;
    use crate::id::TimerId;
    use crate::shard::core::ShardCore;
    use crate::shard::custody::Custody;
    use crate::shard::ShardShared;
    use crate::sync::Arc;

    /// A shard with rings of `capacity` slots, its core in custody (its lowest lists
    /// anchored, as its thread does first), no thread.
    fn shard(capacity: usize) -> (Arc<ShardShared>, Arc<Custody<InCustody>>, DirectPort) {
        let (shared, cursors) = ShardShared::with_time(capacity, TimeSource::System, None);
        let mut core = ShardCore::new(shared.clone(), cursors, Tick::new(0), 1, None);
        core.anchor_lists();
        let custody = Arc::new(Custody::new(InCustody::new(core)));
        // SAFETY: the test keeps `custody` until the core has shut down.
        unsafe { shared.custody.set(&custody) };
        let port = DirectPort::new(custody.clone());
        (shared, custody, port)
    }

    /// A new timer's two references, due at `at` ns (= ticks here).
    fn timer(at: u64) -> (EntryRef, EntryRef) {
        EntryRef::new(TimerId::next(), Nanos::new(at), || {})
    }

    #[test]
    fn a_free_token_files_directly_and_a_held_one_sends_the_ring() {
        let (shared, custody, port) = shard(4);
        let (first, service) = timer(10);
        assert!(port.schedule(&shared, service, Tick::new(10)).is_ok());
        let load = shared.load();
        assert_eq!((load.scheduled, load.in_ring), (1, 0), "filed directly");
        assert_eq!(
            custody.with(|held| held.core_mut().unwrap().next_expiry()),
            Some(Tick::new(10))
        );
        // The token held (as by the shard's turn): the next goes through the ring.
        let second = custody.with(|_| {
            let (second, service) = timer(5);
            assert!(port.schedule(&shared, service, Tick::new(5)).is_ok());
            second
        });
        let load = shared.load();
        assert_eq!((load.scheduled, load.in_ring), (1, 1), "in the ring");
        assert_eq!(
            custody.with(|held| held.core_mut().unwrap().drain_inserts()),
            1
        );
        // A cancel with the token free unlinks directly: no message in the ring.
        assert!(first.cancel(&shared.port()).is_some());
        assert_eq!(shared.messages.reserved_since(0), 0, "no message sent");
        let load = shared.load();
        assert_eq!((load.scheduled, load.cancelled), (2, 1));
        let unfired = custody.with(|held| held.core_mut().unwrap().shut_down());
        assert_eq!(unfired.len(), 1, "the ring's timer comes back");
        drop((unfired, second));
    }

    /// Lists grow on the shard's thread (ground rules): a timer whose wheel list has
    /// no free place goes by the ring even with the token free, and once the shard
    /// has filed it (growing the list on its own thread) the next one files directly.
    /// A move of an entry into a list with no room sends its message the same way.
    /// Level 2 (deadlines 4,096 ticks or more away) is not anchored: its lists start
    /// with no place at all.
    #[test]
    fn a_filing_that_would_grow_a_list_goes_by_the_ring_and_the_shard_grows_it() {
        let (shared, custody, port) = shard(8);
        let far = 5_000;
        let (first, service) = timer(far);
        assert!(port.schedule(&shared, service, Tick::new(far)).is_ok());
        let load = shared.load();
        assert_eq!(
            (load.scheduled, load.in_ring),
            (0, 1),
            "no room in the level-2 list: the ring, though the token was free"
        );
        // The shard's turn files it, allocating the list on its own thread.
        assert_eq!(
            custody.with(|held| held.core_mut().unwrap().drain_inserts()),
            1
        );
        let (second, service) = timer(far + 1);
        assert!(port.schedule(&shared, service, Tick::new(far + 1)).is_ok());
        let load = shared.load();
        assert_eq!(
            (load.scheduled, load.in_ring),
            (2, 0),
            "room now: filed directly"
        );
        // A level-0 list is anchored: room from the start.
        let (near, service) = timer(3);
        assert!(port.schedule(&shared, service, Tick::new(3)).is_ok());
        assert_eq!(shared.load().in_ring, 0, "filed directly");
        // A reset to an earlier deadline whose list has no room (level 2, another
        // slot): its move message goes by the ring, though the token is free.
        let (moved, service) = timer(20_000);
        assert!(port.schedule(&shared, service, Tick::new(20_000)).is_ok());
        custody.with(|held| held.core_mut().unwrap().drain_inserts());
        let sent = shared.messages.reserved_since(0);
        assert!(moved.reset(Nanos::new(10_000), &shared.port()));
        assert_eq!(
            shared.messages.reserved_since(0),
            sent + 1,
            "no room: the move went by the ring"
        );
        assert_eq!(
            custody.with(|held| held.core_mut().unwrap().drain_messages()),
            1
        );
        // Into a list with room, the mover takes it itself: no message.
        assert!(moved.reset(Nanos::new(far + 2), &shared.port()));
        assert_eq!(
            shared.messages.reserved_since(0),
            sent + 1,
            "taken directly"
        );
        let unfired = custody.with(|held| held.core_mut().unwrap().shut_down());
        assert_eq!(unfired.len(), 4);
        drop((unfired, first, second, near, moved));
    }

    /// Waiters first (custody.rs): once the owner waits for the token, a producer that
    /// files next goes through the ring, so the owner's hold comes before any direct
    /// filing that starts after it counted itself in. Without the rule the producer,
    /// which has just given the token back and is on a hot cache line, wins the race
    /// for it nearly every time (each round files 3 timers; the owner then sees them).
    #[test]
    fn a_producer_yields_the_token_to_a_waiting_owner() {
        let (shared, custody, port) = shard(64);
        let mut handles = Vec::new();
        for round in 0..100 {
            let timers: Vec<_> = (0..3).map(|k| timer(1_000 + k)).collect();
            let before = shared.stats.filed_direct.load(Ordering::Relaxed);
            let seen_by_owner = std::thread::scope(|scope| {
                let owner = custody.with(|_| {
                    // The owner's hold counts the direct filings before it, then
                    // drains the ring as its turn would.
                    let owner = scope.spawn(|| {
                        custody.with(|held| {
                            let filed = shared.stats.filed_direct.load(Ordering::Relaxed);
                            held.core_mut().unwrap().drain_inserts();
                            filed
                        })
                    });
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while custody.waiters() == 0 {
                        assert!(Instant::now() < deadline, "the owner waits within 10 s");
                        std::thread::yield_now();
                    }
                    owner
                });
                // The token is free, the owner counted in: these go through the ring
                // unless the owner has had its hold already.
                for (handle, service) in timers {
                    assert!(port.schedule(&shared, service, Tick::new(1_000)).is_ok());
                    handles.push(handle);
                }
                owner.join().unwrap() - before
            });
            assert_eq!(
                seen_by_owner, 0,
                "round {round}: the owner got the token only after {seen_by_owner} direct filings"
            );
        }
        assert_eq!(custody.waiters(), 0);
        let unfired = custody.with(|held| {
            let core = held.core_mut().unwrap();
            core.drain_inserts();
            core.shut_down()
        });
        assert_eq!(unfired.len(), 300, "nothing lost");
        drop((unfired, handles));
    }

    #[test]
    fn a_producer_that_finds_the_ring_full_while_the_token_is_held_waits_and_loses_nothing() {
        let (shared, custody, port) = shard(2);
        let waiting = AtomicBool::new(false);
        let handles = std::thread::scope(|scope| {
            custody
                .with(|held| {
                    let producer = scope.spawn(|| {
                        (0..3)
                            .map(|k| {
                                let (handle, service) = timer(100 + k);
                                assert!(port.schedule(&shared, service, Tick::new(100)).is_ok());
                                handle
                            })
                            .collect::<Vec<_>>()
                    });
                    // The third push finds the 2-slot ring full and waits, counted.
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while shared.load().ring_full_waits == 0 {
                        assert!(
                            Instant::now() < deadline,
                            "the third push waits within 10 s"
                        );
                        std::thread::yield_now();
                    }
                    waiting.store(true, Ordering::Relaxed);
                    // The holder drains the ring (as the shard's turn does): room again.
                    let core = held.core_mut().unwrap();
                    let mut drained = core.drain_inserts();
                    while drained < 2 {
                        drained += core.drain_inserts();
                    }
                    producer
                })
                .join()
                .unwrap()
        });
        assert!(waiting.load(Ordering::Relaxed));
        let load = shared.load();
        assert_eq!(load.ring_full_waits, 1, "counted once");
        assert_eq!(load.scheduled + load.in_ring, 3, "nothing lost");
        let unfired = custody.with(|held| {
            let core = held.core_mut().unwrap();
            core.drain_inserts();
            core.shut_down()
        });
        assert_eq!(unfired.len(), 3);
        drop((unfired, handles));
    }
}
