//! One shard: a thread that runs its [`ShardCore`] in a loop — drain the insert and
//! message rings, advance the wheel to the current tick, hand what fired to the
//! executor — and parks until its next expiry. This file holds [`ShardShared`], what
//! producers and handles reach: the two rings, the park handshake, the stop flag.
//! The rest has a file each:
//!
//! | file | what it holds |
//! | --- | --- |
//! | `core.rs` | [`ShardCore`]: the wheel, the rings' consumer side, one bounded turn (`ShardCore::turn`) |
//! | `custody.rs` | the token whose holder owns the core, its ground rules (one holder, waiters first) |
//! | `turn.rs` | what the token guards (`InCustody`) and the turn as a thread takes it (`ShardLink::turn`: lateness, dispatch) |
//! | `direct.rs` | producers and cancellers filing or unlinking under the token themselves |
//! | `park.rs` | how long a shard sleeps (`plan_park`, in a hold) and the sleep (`park`) |
//! | `rescue.rs` | the watcher (`Watch::check`) that turns a stuck shard and runs its fired tasks |
//! | `fired.rs` | the fired queue of inline and spawn callbacks, and the claim on a rescued run |
//! | `own.rs` | what code on a shard thread reaches of its own shard: the borrow, deferred pushes, making room |
//! | `shard_loop.rs` | the thread: start-up, the loop over turn, watch and park, its end |
//! | `loom_facade.rs` | (loom builds only) the façade through which the loom models drive the code above |
//!
//! # Ground rules
//!
//! - The core (wheel, store, ring cursors) belongs to whoever holds the shard's
//!   ownership token (`shard/custody.rs`): its own thread, or, for one bounded turn at
//!   a time, the shard thread rescuing it (`rescue.rs`).
//! - **Park handshake.** Before parking, the shard publishes the tick it will sleep
//!   until in `next_wake`, issues a SeqCst fence, and re-checks both rings' tails. A
//!   producer reserves its ring slot, issues a SeqCst fence, then reads `next_wake`
//!   and unparks the shard if its deadline is earlier. The two fences are ordered in
//!   the single SeqCst order: if the shard's comes first, the producer's read sees
//!   the published tick (and unparks, which makes a later `park` return at once); if
//!   the producer's comes first, the shard's re-check sees the reservation (and does
//!   not park). No wakeup is lost. Fences rather than SeqCst accesses because this is
//!   the form loom can check (it treats SeqCst accesses as AcqRel), modelled in
//!   `loom-tests/tests/park.rs`. While awake the shard publishes [`AWAKE`], so
//!   producers do not unpark it. That is the ring's half: a producer that gets the
//!   shard's token files directly instead (`direct.rs`), and reads `next_wake` inside
//!   its hold, which the token orders against the shard's plan (made in a hold too),
//!   with no fence (`loom-tests/tests/direct.rs`).
//! - **Publish last.** A producer decides on the wake-up *between* reserving its slot
//!   and publishing its value, taking an owned handle to the shard's thread if it
//!   must wake it; publishing is its last access to the shard, and the unpark goes
//!   through that handle afterwards. Until the publication the shard cannot pop the
//!   value, so a shard that waits for that message at shutdown is still there; after
//!   it, the shard may exit and be freed (entry ground rule 4;
//!   `loom-tests/tests/sink_lifetime.rs`).
//! - **Shutdown.** See [`ShardCore::shut_down`]: the shard exits only after every
//!   message it knows to be coming has arrived. Pending timers come back to the
//!   caller. Repeating timers whose run ends after their shard stopped go to `late`;
//!   the service collects them once, then seals it, and a run ending after that
//!   cancels its timer (the callback that shut the service down from inside its own
//!   run is one).
//!
//! # Threads
//!
//! | function | runs on |
//! | --- | --- |
//! | `push_insert`, `send_cancel`, `send_move` | callers of `schedule`, `cancel`, `reset`; executor workers (a repeating timer's next run) |
//! | `ShardThread::run_loop` (through `ShardLink::turn`), everything in `ShardCore` | the shard thread, or the one rescuing it, holding the token (loom models: the model's threads) |
//! | `ShardCore::file_direct`, `cancel_direct`, `move_direct` | callers of `schedule`, `cancel`, `reset`, holding the token (`direct.rs`) |
//! | `RunTask::run` | an executor worker |
//! | `request_stop`, `take_late` | the caller of `shutdown` |

#![deny(unsafe_code)]

mod core;
mod custody;
mod direct;
mod fired;
#[cfg(loom)]
mod loom_facade;
mod own;
mod park;
mod rescue;
mod shard_loop;
mod turn;

use crate::clock::{Tick, TimeSource};
use crate::dispatch::RunSink;
use crate::entry::{CancelPort, CancelSink, EntryRef, Message};
use crate::limit::PendingLimit;
use crate::ring::{Cursor, Reserve, Ring};
use crate::stats::{LatenessHistogram, LatenessRecorder};
use crate::sync::{
    fence, thread, Arc, AtomicBool, AtomicU64, Backoff, CachePadded, Canary, Mutex, Ordering,
    ThreadSlot,
};

#[cfg(loom)]
pub use self::core::{Expired, ShardCore};
#[cfg(loom)]
pub use self::custody::Custody;
pub(crate) use self::direct::DirectPort;
#[cfg(loom)]
pub use self::fired::{Claim, FiredQueue};
#[cfg(loom)]
pub use self::loom_facade::{park_for_model, run_as_shard_thread, ModelShard};
pub(crate) use self::own::{dispatch_rest_here, is_own_thread, take_own_core};
pub(crate) use self::shard_loop::ShardThread;

/// `next_wake` while the shard is running: no deadline is earlier, so no producer
/// needs to wake it. (`next_wake` is [`Tick::NEVER`] while the shard sleeps with
/// nothing due: any deadline is earlier.)
pub const AWAKE: Tick = Tick::new(0);
/// Fired tasks handed to the executor per batch.
const FIRE_BATCH: usize = 256;

/// The counters one shard keeps; written only by the holder of the shard's ownership
/// token (its own thread, or one rescuing it: the token orders one holder's writes
/// before the next's), Relaxed; summed on read, exact at quiescence.
#[derive(Debug, Default)]
pub struct ShardStats {
    /// Timers taken from the insert ring.
    pub scheduled: AtomicU64,
    /// Timers filed directly by their producer, under the token (`direct.rs`).
    pub filed_direct: AtomicU64,
    /// Timers that won Pending → Fired (and runs of repeating timers).
    pub fired: AtomicU64,
    /// Runs of repeating timers started (counted in `fired` too).
    pub runs: AtomicU64,
    /// Cancelled timers the shard has discarded or unlinked.
    pub cancelled: AtomicU64,
    /// Lateness of the timers this shard fired.
    pub(crate) lateness: LatenessRecorder,
}

/// One shard's counters as read by [`ShardShared::load`].
#[derive(Debug)]
pub(crate) struct Load {
    /// Taken from the insert ring.
    pub(crate) scheduled: u64,
    /// Fired (and runs started).
    pub(crate) fired: u64,
    /// Cancelled and processed.
    pub(crate) cancelled: u64,
    /// Runs of repeating timers started (in `fired` too).
    pub(crate) runs: u64,
    /// Of `scheduled`, the re-filings of repeating timers after a run.
    pub(crate) refiled: u64,
    /// Handed back (or cancelled) by shutdown.
    pub(crate) returned: u64,
    /// Runs of repeating timers skipped.
    pub(crate) skipped: u64,
    /// Waiting in the insert ring.
    pub(crate) in_ring: u64,
    /// Pushes that found a ring full.
    pub(crate) ring_full_waits: u64,
    /// Lateness of fired timers.
    pub(crate) lateness: LatenessHistogram,
}

impl ShardStats {
    /// Adds `n` to a counter only the holder of the shard's token writes.
    fn bump(counter: &AtomicU64, n: u64) {
        if n == 0 {
            return;
        }
        // ORDERING: Relaxed: one writer at a time (the token holder, the token ordering
        // holders); readers want a value, not a happens-before edge.
        counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }
}

/// Repeating timers whose run ended after their shard stopped.
#[derive(Debug, Default)]
struct Late {
    /// Waiting for `shutdown` to hand them back.
    entries: Vec<EntryRef>,
    /// Set once `shutdown` has collected `entries`; later arrivals are cancelled.
    sealed: bool,
}

/// What producers, cancellers and the façade share with one shard thread.
#[derive(Debug)]
pub struct ShardShared {
    /// New timers, carrying the service reference (entry ground rule 1).
    insert: Ring<EntryRef>,
    /// Cancel and move messages, each owning a reference (entry ground rule 4).
    messages: Ring<Message>,
    /// The tick the shard sleeps until (a [`Tick`]'s `u64`): [`AWAKE`] while running,
    /// [`Tick::NEVER`] when idle.
    /// Written by the shard (before its fence when parking; on waking); read by
    /// producers after their fence. Relaxed accesses: the fences order them.
    next_wake: CachePadded<AtomicU64>,
    /// The owner's progress (its turns begun, parks and fired tasks popped; `fired.rs`), as
    /// last published: how the shard that watches it tells a stuck shard from a busy
    /// one (`rescue.rs`), without a clock read per callback. Written by the
    /// shard thread only, holding its token; Relaxed: a stale value only delays or
    /// hastens a rescue attempt, and the attempt re-checks the exact count under the
    /// token.
    progress: CachePadded<AtomicU64>,
    /// The tick of the core's next expiry when the shard last parked (a [`Tick`]'s
    /// `u64`; [`Tick::NEVER`] if none): for the watcher, as `progress`. Written by
    /// the shard thread before its park fence.
    due: CachePadded<AtomicU64>,
    /// Set by shutdown; the shard then shuts down instead of parking.
    stop: AtomicBool,
    /// The shard thread, to unpark.
    thread: ThreadSlot,
    /// Where the shard's core is in custody, for direct unlinking (`direct.rs`): set
    /// once, before the shard is shared, by whoever puts the core there; null for a
    /// core that no custody holds (the models' bare cores), whose messages all go
    /// through the ring.
    custody: direct::CustodySlot,
    /// Counters written by the shard thread.
    pub stats: CachePadded<ShardStats>,
    /// Runs of repeating timers skipped because they fell a whole period behind;
    /// written by executor threads (Relaxed `fetch_add`), exact at quiescence.
    pub(crate) skipped: AtomicU64,
    /// Repeating timers re-filed after a run: their insert counts in
    /// `stats.scheduled` but is not a new timer. Written by the runners (Relaxed
    /// `fetch_add`), exact at quiescence.
    refiled: AtomicU64,
    /// Repeating timers cancelled while out of the wheel for a run (the shard never
    /// sees those cancels). Written by the runners (Relaxed `fetch_add`).
    run_cancelled: AtomicU64,
    /// Runs of repeating timers handed over (counted in `fired` and `runs` when the
    /// turn fired them) that never started: a cancel won before the run began, or the
    /// run was given up unrun. `Stats::fired` counts runs that started, so these are
    /// taken off again when the counters are read.
    run_unstarted: AtomicU64,
    /// Pending timers that shutdown took out of this shard (handed back as `Unfired`,
    /// or cancelled if a sleep's). Written at shutdown (Relaxed `fetch_add`).
    pub(crate) returned: AtomicU64,
    /// The `max_pending` bound, if any: a run cancelled by its runner frees room.
    limit: Option<Arc<PendingLimit>>,
    /// Pushes into either ring that found it full and waited; written by producers on
    /// that slow path only. A plain `std` atomic, also under loom: a statistic in no
    /// protocol.
    ring_full_waits: std::sync::atomic::AtomicU64,
    /// Repeating timers whose next run could not be filed because the shard had shut
    /// down.
    late: Mutex<Late>,
    /// Touched by senders, retired by the shard at the end of its shutdown: lets loom
    /// see a sender that reads the shard after its last message (ground rules).
    canary: Canary,
    /// Where the shard and its repeating timers' runs read the time.
    pub(crate) time: TimeSource,
    /// Tests only: makes the shard thread's next turn fail an internal invariant.
    #[cfg(test)]
    pub(crate) fail_turn: std::sync::atomic::AtomicBool,
}

/// The consumer cursors of a shard's two rings; they belong to the shard thread.
#[derive(Debug)]
pub struct Cursors {
    /// The insert ring's cursor.
    insert: Cursor,
    /// The message ring's cursor.
    messages: Cursor,
}

#[cfg(test)]
impl ShardShared {
    /// Tests only: the insert ring, to hold a reservation unwritten as a preempted
    /// producer would.
    pub(crate) fn insert_ring(&self) -> &Ring<EntryRef> {
        &self.insert
    }
}

impl Cursors {
    /// How many values the shard has popped from both rings, wrapping (see
    /// [`Cursor::popped`]).
    pub fn popped(&self) -> usize {
        self.insert.popped().wrapping_add(self.messages.popped())
    }
}

/// Why a push did not publish its value.
enum Refused<T> {
    /// The ring is closed (the shard shut down).
    Closed(T),
    /// The ring is full and the calling shard thread may not wait: defer it.
    Defer(T),
}

/// How a push decides whether to wake the shard.
#[derive(Clone, Copy, Debug)]
enum Wake {
    /// If the shard sleeps past this tick (a new timer's deadline).
    Before(Tick),
    /// If the shard sleeps with nothing to do (a cancel: it frees memory, never urgent).
    IfIdle,
    /// Always (a move: later resets of the same timer may have moved it earlier still
    /// without a message of their own; the shard reads the latest deadline on arrival).
    Always,
}

impl ShardShared {
    /// A shard's shared half, with rings of `ring_capacity` slots, and the cursors
    /// that only its thread may use; it reads the system's time. (The models' way in;
    /// the service uses [`with_time`](Self::with_time).)
    #[cfg(loom)]
    pub fn new(ring_capacity: usize) -> (Arc<ShardShared>, Cursors) {
        Self::with_time(ring_capacity, TimeSource::System, None)
    }

    /// As [`new`](Self::new), reading the time from `time`, under the pending bound
    /// `limit` if any.
    pub(crate) fn with_time(
        ring_capacity: usize,
        time: TimeSource,
        limit: Option<Arc<PendingLimit>>,
    ) -> (Arc<ShardShared>, Cursors) {
        let (insert, insert_seed) = Ring::new(ring_capacity);
        let (messages, messages_seed) = Ring::new(ring_capacity);
        let shared = Arc::new(ShardShared {
            insert,
            messages,
            next_wake: CachePadded::new(AtomicU64::new(AWAKE.get())),
            progress: CachePadded::new(AtomicU64::new(0)),
            due: CachePadded::new(AtomicU64::new(Tick::NEVER.get())),
            stop: AtomicBool::new(false),
            thread: ThreadSlot::default(),
            custody: direct::CustodySlot::default(),
            stats: CachePadded::new(ShardStats::default()),
            skipped: AtomicU64::new(0),
            refiled: AtomicU64::new(0),
            run_cancelled: AtomicU64::new(0),
            run_unstarted: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            limit,
            ring_full_waits: std::sync::atomic::AtomicU64::new(0),
            late: Mutex::new(Late::default()),
            canary: Canary::new(),
            time,
            #[cfg(test)]
            fail_turn: std::sync::atomic::AtomicBool::new(false),
        });
        let cursors = Cursors {
            insert: insert_seed.cursor(&shared.insert),
            messages: messages_seed.cursor(&shared.messages),
        };
        (shared, cursors)
    }

    /// The port a timer handle keeps to send this shard its messages.
    #[allow(
        unsafe_code,
        reason = "the shard owns the invariant that makes the port sound"
    )]
    pub fn port(&self) -> CancelPort<ShardShared> {
        // SAFETY: the shard stays at this address (inside its `Arc`, held by its
        // thread) until `ShardCore::shut_down` has received every message entry ground
        // rule 4 makes it wait for, and `CancelPort` sends only such messages. The
        // thread never exits otherwise: it never unwinds (`ShardThread::run` aborts
        // the process instead), and it returns only after `shut_down` or after a
        // shutdown on it took its core and ran `shut_down` there.
        unsafe { CancelPort::new(self) }
    }

    /// This shard's counters as they stand (exact at quiescence); wakes nothing.
    pub(crate) fn load(&self) -> Load {
        // ORDERING: Relaxed throughout: statistics, exact at quiescence.
        let from_ring = self.stats.scheduled.load(Ordering::Relaxed);
        // ORDERING: as above.
        let unstarted = self.run_unstarted.load(Ordering::Relaxed);
        Load {
            // ORDERING: as above.
            scheduled: from_ring + self.stats.filed_direct.load(Ordering::Relaxed),
            // ORDERING: as above.
            fired: self
                .stats
                .fired
                .load(Ordering::Relaxed)
                .saturating_sub(unstarted),
            // ORDERING: as above.
            cancelled: self.stats.cancelled.load(Ordering::Relaxed)
                // ORDERING: as above.
                + self.run_cancelled.load(Ordering::Relaxed),
            // ORDERING: as above.
            runs: self
                .stats
                .runs
                .load(Ordering::Relaxed)
                .saturating_sub(unstarted),
            // ORDERING: as above.
            refiled: self.refiled.load(Ordering::Relaxed),
            // ORDERING: as above.
            returned: self.returned.load(Ordering::Relaxed),
            // ORDERING: as above.
            skipped: self.skipped.load(Ordering::Relaxed),
            in_ring: self.insert.reserved_since(from_ring),
            // ORDERING: as above.
            ring_full_waits: self
                .ring_full_waits
                .load(std::sync::atomic::Ordering::Relaxed),
            lateness: self.stats.lateness.snapshot(),
        }
    }

    /// The store half of the park handshake (ground rules): publishes that the shard
    /// will sleep until tick `wake` ([`Tick::NEVER`] for no timer), then re-checks both
    /// rings and the stop flag. Returns whether the shard may park; if not, it has
    /// already published [`AWAKE`] again. Shard thread only.
    pub fn prepare_park(&self, cursors: &Cursors, wake: Tick) -> bool {
        // ORDERING: Relaxed store, then a SeqCst fence before re-checking the rings:
        // the shard's half of the park handshake (ground rules), pairing with the
        // fence after a producer's reservation.
        self.next_wake.store(wake.get(), Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let work_arrived = self.insert.has_pending(&cursors.insert)
            || self.messages.has_pending(&cursors.messages);
        // ORDERING: Acquire pairs with `request_stop`'s Release store.
        if work_arrived || self.stop.load(Ordering::Acquire) {
            self.wake_up();
            return false;
        }
        true
    }

    /// Publishes that the shard is awake again. Shard thread only.
    pub fn wake_up(&self) {
        // ORDERING: Relaxed: a stale value only makes a producer unpark needlessly.
        self.next_wake.store(AWAKE.get(), Ordering::Relaxed);
    }

    /// What the shard publishes of its sleep: the tick it sleeps until, [`AWAKE`], or
    /// [`Tick::NEVER`]. For the shard that watches it (a heuristic: see `progress`).
    pub(crate) fn sleeps_until(&self) -> Tick {
        // ORDERING: Relaxed: a stale value only delays or hastens a rescue (the
        // watcher's park handshake re-reads it after its fence).
        Tick::new(self.next_wake.load(Ordering::Relaxed))
    }

    /// Publishes the owner's progress count (its thread, holding its token).
    pub(crate) fn set_progress(&self, progress: u64) {
        // ORDERING: Relaxed: see `progress`.
        self.progress.store(progress, Ordering::Relaxed);
    }

    /// Publishes the core's next expiry as the shard parks (before its park fence).
    pub(crate) fn set_due(&self, due: Tick) {
        // ORDERING: Relaxed: see `progress`; the park fence that follows orders it
        // before the watcher's read after its own fence.
        self.due.store(due.get(), Ordering::Relaxed);
    }

    /// The core's next expiry as the shard last parked.
    pub(crate) fn due(&self) -> Tick {
        // ORDERING: Relaxed: see `progress`.
        Tick::new(self.due.load(Ordering::Relaxed))
    }

    /// The owner's progress count as last published.
    pub(crate) fn progress(&self) -> u64 {
        // ORDERING: Relaxed: see `progress`.
        self.progress.load(Ordering::Relaxed)
    }

    /// Records the shard's thread so producers can unpark it.
    pub fn set_thread(&self, handle: thread::Thread) {
        self.thread.set(handle);
    }

    /// Hands a new timer due at tick `deadline` to the shard. A full ring never
    /// loses it: the producer wakes the shard and backs off until there is room; a
    /// shard thread never waits for another shard (`own::make_room`): it makes
    /// room itself, or defers the push to its own next turn.
    ///
    /// # Errors
    ///
    /// The entry comes back if the shard has shut down (its insert ring is closed).
    pub fn push_insert(&self, entry: EntryRef, deadline: Tick) -> Result<(), EntryRef> {
        self.push_insert_as(entry, deadline, false, Wake::Before(deadline))
    }

    /// As [`push_insert`](Self::push_insert), waking the shard whatever its plan: for
    /// a timer that a direct filer left to the shard because its wheel list has no
    /// free place (`direct.rs`, ground rules: lists grow on the shard's thread), so
    /// that the shard grows the list now, not at its next planned wake-up, and the
    /// filings after it go direct again.
    ///
    /// # Errors
    ///
    /// As [`push_insert`](Self::push_insert).
    pub fn push_insert_to_grow(&self, entry: EntryRef, deadline: Tick) -> Result<(), EntryRef> {
        self.push_insert_as(entry, deadline, false, Wake::Always)
    }

    /// As [`push_insert`](Self::push_insert); `refile` says it is a repeating timer's
    /// next run (for a deferred push that finds the ring closed later); `wake` says
    /// when the push wakes the shard.
    fn push_insert_as(
        &self,
        entry: EntryRef,
        deadline: Tick,
        refile: bool,
        wake: Wake,
    ) -> Result<(), EntryRef> {
        match self.push_and_wake(&self.insert, entry, wake) {
            Ok(()) => {
                own::retry_deferred_after_push();
                Ok(())
            }
            Err(Refused::Closed(entry)) => Err(entry),
            Err(Refused::Defer(entry)) => {
                own::defer(
                    self,
                    own::Deferred::Insert {
                        entry,
                        deadline,
                        refile,
                    },
                );
                Ok(())
            }
        }
    }

    /// A deferred insert that found the ring closed: the shard shut down after the
    /// push was accepted, so the timer goes where runs ending after shutdown go.
    fn insert_closed(&self, entry: EntryRef, refile: bool) {
        if refile {
            // ORDERING: Relaxed: a statistic (as in `refile_run`).
            self.refiled.fetch_sub(1, Ordering::Relaxed);
        }
        self.hand_back_late(entry);
    }

    /// Reserves a slot in `ring` (one of this shard's), backing off and waking the
    /// shard while the ring is full; wakes the shard as `wake` says or if the ring is
    /// filling; and publishes `value` last (ground rules: the producer's half of the
    /// park handshake, and "publish last"). On a shard thread, a full ring of another
    /// shard (or its own, while its token is held here) is never waited for:
    /// `own::make_room` drains it, or the value comes back to be deferred.
    ///
    /// # Errors
    ///
    /// The value comes back if the ring is closed, or to be deferred.
    fn push_and_wake<T>(&self, ring: &Ring<T>, value: T, wake: Wake) -> Result<(), Refused<T>> {
        let backoff = Backoff::new();
        let mut waited = false;
        let mut made_room = 0;
        loop {
            match ring.reserve() {
                Ok(reservation) => {
                    // ORDERING: this SeqCst fence, between our reservation and our read
                    // of `next_wake`, pairs with the fence in `prepare_park`; the read
                    // itself can then be Relaxed.
                    fence(Ordering::SeqCst);
                    self.canary.touch();
                    // ORDERING: Relaxed: ordered by the fence above.
                    let sleeps_until = Tick::new(self.next_wake.load(Ordering::Relaxed));
                    let urgent = match wake {
                        Wake::Before(deadline) => deadline < sleeps_until,
                        Wake::IfIdle => sleeps_until == Tick::NEVER,
                        Wake::Always => true,
                    };
                    // An owned handle, taken before publishing: after `publish` we may
                    // touch nothing of the shard, but this handle outlives it. (Waking
                    // before publishing instead lets the woken shard preempt us on our
                    // core and spin on a slot it cannot pop yet.)
                    let wake_up = (urgent || self.is_filling(reservation.position()))
                        .then(|| self.thread.get())
                        .flatten();
                    // The last access to the shard (ground rules: publish last).
                    reservation.publish(value);
                    if let Some(shard_thread) = wake_up {
                        shard_thread.unpark();
                    }
                    return Ok(());
                }
                Err(Reserve::Full) => {
                    if !waited {
                        waited = true;
                        // ORDERING: Relaxed: a statistic, on the slow path only.
                        self.ring_full_waits
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    // Code on a shard thread (an inline callback, a spawner, a
                    // rescued callback) never waits for another shard: it takes that
                    // shard's token and drains the ring itself, or defers the push
                    // to its own next turn. Its own full ring it drains (a slot
                    // reserved by another producer and not yet written still waits
                    // for that producer: hence the back-off).
                    match own::make_room(self) {
                        own::Room::Made if made_room < 2 => {
                            made_room += 1;
                            continue;
                        }
                        own::Room::Made | own::Room::Defer => {
                            return Err(Refused::Defer(value));
                        }
                        own::Room::Wait { drained_own } => {
                            if drained_own && own::is_own_thread(self) {
                                backoff.snooze();
                                continue;
                            }
                        }
                    }
                    // The canary watches message senders, which reach the shard
                    // through a port and must not outlive its shutdown (ground
                    // rules). A producer of a new timer holds the service, whose
                    // `Arc` keeps the shard alive, and may find the ring full just
                    // before the shard closes it and retires.
                    if !matches!(wake, Wake::Before(_)) {
                        self.canary.touch();
                    }
                    self.thread.unpark();
                    backoff.snooze();
                }
                Err(Reserve::Closed) => return Err(Refused::Closed(value)),
            }
        }
    }

    /// Whether a push at `position` should wake the shard because its ring is
    /// filling: once every half ring, so a sleeping shard drains before producers
    /// find the ring full.
    fn is_filling(&self, position: usize) -> bool {
        let half = (self.insert.capacity() / 2).max(1);
        position % half == half - 1
    }

    /// Wakes the shard so it drains its rings (used by `stats`).
    pub fn nudge(&self) {
        self.thread.unpark();
    }

    /// Files a repeating timer's next run, due at tick `next`, after its run ended;
    /// if the shard has shut down, hands it to the late list instead.
    pub fn refile_run(&self, entry: EntryRef, next: Tick) {
        // Counted first: a re-filing is not a new timer, and the shard may count its
        // insert as soon as it is published.
        // ORDERING: Relaxed: a statistic, exact at quiescence.
        self.refiled.fetch_add(1, Ordering::Relaxed);
        if let Err(entry) = self.push_insert_as(entry, next, true, Wake::Before(next)) {
            // ORDERING: as above.
            self.refiled.fetch_sub(1, Ordering::Relaxed);
            self.hand_back_late(entry);
        }
    }

    /// Counts a repeating timer cancelled while out of the wheel for a run.
    fn count_run_cancelled(&self) {
        // ORDERING: Relaxed: a statistic, exact at quiescence.
        self.run_cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// A repeating timer whose run ended after the shard shut down: kept for
    /// `shutdown` to hand back, or, once `shutdown` has collected them, cancelled (its
    /// callback dropped here, after the lock is released).
    fn hand_back_late(&self, entry: EntryRef) {
        let mut late = self.late.lock().unwrap_or_else(|e| e.into_inner());
        if !late.sealed {
            late.entries.push(entry);
            return;
        }
        drop(late);
        let _ = entry.detach();
        let cancelled = entry.cancel_detached();
        self.count_run_cancelled();
        drop(cancelled);
    }

    /// Takes the repeating timers that came back after the shard shut down, and seals
    /// the list: a run ending later cancels its timer.
    pub fn take_late(&self) -> Vec<EntryRef> {
        let mut late = self.late.lock().unwrap_or_else(|e| e.into_inner());
        late.sealed = true;
        ::core::mem::take(&mut late.entries)
    }

    /// Asks the shard to shut down and wakes it.
    pub fn request_stop(&self) {
        // ORDERING: Release pairs with the shard's Acquire load in its loop; the
        // unpark below makes a park after that load return at once, so no handshake
        // beyond the park token is needed.
        self.stop.store(true, Ordering::Release);
        self.thread.unpark();
    }

    /// Whether shutdown was requested. Shard thread only.
    pub fn is_stopping(&self) -> bool {
        // ORDERING: Acquire pairs with the Release store in `request_stop`.
        self.stop.load(Ordering::Acquire)
    }

    /// Marks the end of the shard's use of this state (the canary; ground rules).
    fn retire(&self) {
        self.canary.retire();
    }

    /// Sends a message, waking the shard as `wake` says (or, on a shard thread that
    /// cannot make room in a full ring, deferring it to its own next turn).
    fn send_message(&self, message: Message, wake: Wake) {
        match self.push_and_wake(&self.messages, message, wake) {
            Ok(()) => own::retry_deferred_after_push(),
            Err(Refused::Defer(message)) => {
                own::defer(self, own::Deferred::Message { message, wake });
            }
            Err(Refused::Closed(_)) => {
                unreachable!("message ring invariant: the message ring is never closed")
            }
        }
    }
}

/// How a repeating timer's run reaches its shard (`dispatch::RunTask`). On the
/// shard's `Arc`, so that a run keeps the shard alive until it has ended.
impl RunSink for Arc<ShardShared> {
    fn now(&self) -> std::time::Instant {
        self.time.now()
    }

    fn count_skipped(&self, runs: u64) {
        // ORDERING: Relaxed: a statistic.
        self.skipped.fetch_add(runs, Ordering::Relaxed);
    }

    fn refile_run(&self, entry: EntryRef, next: Tick) {
        ShardShared::refile_run(self, entry, next);
    }

    fn count_run_cancelled(&self) {
        ShardShared::count_run_cancelled(self);
    }

    fn count_run_unstarted(&self) {
        // ORDERING: Relaxed: a statistic, exact at quiescence.
        self.run_unstarted.fetch_add(1, Ordering::Relaxed);
    }

    fn release_room(&self) {
        if let Some(limit) = &self.limit {
            limit.release();
        }
    }
}

impl CancelSink for ShardShared {
    fn send_cancel(&self, entry: &EntryRef) {
        // Direct unlinking (`direct.rs`) if the token is free; else the ring, with a
        // reference of the message's own.
        if !direct::take(self, direct::Taken::Cancel, entry) {
            self.send_message(Message::Cancel(entry.clone()), Wake::IfIdle);
        }
    }

    fn send_move(&self, entry: &EntryRef) {
        if !direct::take(self, direct::Taken::Move, entry) {
            self.send_message(Message::Move(entry.clone()), Wake::Always);
        }
    }
}
