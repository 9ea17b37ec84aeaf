//! The shard's deterministic core: everything a shard does to its wheel, driven by
//! tick numbers, with no clock, no thread and no executor. The shard thread calls it
//! in a loop; the loom models in `loom-tests/` call the same methods, so what they
//! check is the code that ships.
//!
//! # Ground rules
//!
//! - A `ShardCore` belongs to one thread at a time (it is `Send`, not `Sync`): the
//!   wheel, the store and both ring cursors are reached only through `&mut self`.
//! - **Awaited messages** (entry ground rule 4). `awaiting` counts the messages still
//!   to come for entries the core tracks *outside* its wheel; each such entry carries
//!   an [`Aside`] tag in its shard-only place. Entries in the wheel need no count: a
//!   message for one finds it there. The core learns that a message is coming only
//!   from its own RMWs on the state word, so it never misses one:
//!
//! | where the core sees it | word it reads (RMW) | a message is coming | what the core does |
//! | --- | --- | --- | --- |
//! | filing, `mark_filed` | Cancelled, +MOVING | move | tag `Move`, count it |
//! | filing, `mark_filed` | Cancelled | none | discard |
//! | expiry, the claim | Cancelled | cancel (it was filed) | tag `Cancel`, count it |
//! | cancel message | +MOVING (load after the message) | move | tag `Move`, count it |
//! | shutdown, `detach` of a ring entry | Pending/Cancelled +MOVING | move | tag `DetachedMove`/`Move`, count it |
//! | shutdown, `detach` of a wheel entry | Cancelled | cancel | tag `Cancel`, count it |
//! | shutdown, `detach` of a wheel entry | Pending +MOVING | move | tag `DetachedMove`, count it |
//!
//!   And for each message, by the entry's tag and the word `clear_moving` returns:
//!
//! | message | tag | word | action |
//! | --- | --- | --- | --- |
//! | cancel | `Cancel` | — | uncount; then as below for MOVING |
//! | cancel | none | — | unlink from the wheel, drop the wheel's reference; if MOVING: tag `Move`, count |
//! | move | `Move`, `DetachedMove` | — | uncount |
//! | move | `Cancel` | — | nothing: the cancel message, still to come, finds MOVING clear |
//! | move | none | not FILED | nothing: still in the insert ring, filed later at its current deadline |
//! | move | none | FILED, Pending | re-file at the (earlier) deadline |
//! | move | none | FILED, Cancelled | nothing: its cancel message unlinks it |
//!
//! - **Shutdown** closes the insert ring and drains it, empties the wheel, then drains
//!   messages until `awaiting` is zero, and only then retires the shard: every sender
//!   has published its last message, and a sender touches nothing after publishing,
//!   so nothing reaches the shard's shared state afterwards.

#![allow(
    unsafe_code,
    reason = "the core claims the wheel's references back; it owns that invariant"
)]

use crate::clock::{Nanos, Tick, Ticks};
use crate::entry::{
    Aside, Due, EntryPtr, EntryRef, File, FiredEntry, Message, RunningEntry, ShardStore,
};
use crate::id::TimerState;
use crate::limit::PendingLimit;
use crate::sync::{Arc, Backoff};
use crate::wheel::Wheel;

use super::{Cursors, ShardShared, ShardStats};

/// The most entries one turn takes out of the wheel (fired, started, re-filed or let
/// go) before the shard drains its rings again.
///
/// A count, not a time budget: it needs no clock read per entry (a clock read per timer
/// was 8 % of the hot path's profile), it makes a turn's reach deterministic under a
/// [`ManualClock`](crate::ManualClock), and the shard's own work per entry is bounded
/// (a CAS on the entry's state and a push). 1,024 entries take the shard roughly
/// 30–100 µs, a tenth of a 1 ms tick or less, so during a burst the rings are drained,
/// and a cancel for a timer not yet reached wins, many times per tick; and the
/// per-turn costs (two ring drains, a clock read, a hand-off of a batch to the pool)
/// stay well under 1 % of the turn. In inline mode the callbacks of a turn run before
/// the next turn, so the bound is also on the callbacks run between two drains.
pub(crate) const TURN_BUDGET: usize = 1024;

/// The capacity, in entry references, that each of the wheel's lowest slot lists gets
/// on the shard's own thread ([`ShardCore::anchor_lists`]): 129 lists of 64 references,
/// 66 KiB per shard.
const ANCHORED_LIST_CAPACITY: usize = 64;

/// What expiry hands out.
#[derive(Debug)]
pub enum Expired {
    /// A one-shot timer that fired: run it.
    Fired(FiredEntry),
    /// One run of a repeating timer: run it, then file the next run.
    Run(RunningEntry),
}

impl Expired {
    /// The timer's (or this run's) deadline, in nanoseconds from tick 0.
    pub fn deadline(&self) -> Nanos {
        match self {
            Expired::Fired(task) => task.deadline(),
            Expired::Run(running) => running.deadline(),
        }
    }
}

/// One shard's wheel and the bookkeeping around it; see the module's ground rules.
#[derive(Debug)]
pub struct ShardCore {
    /// Shared with producers and handles.
    shared: Arc<ShardShared>,
    /// The rings' consumer cursors.
    cursors: Cursors,
    /// The timing wheel over this shard's entries.
    wheel: Wheel<EntryPtr>,
    /// The wheel's view of the entries.
    store: ShardStore,
    /// Messages still to come for entries tracked outside the wheel.
    awaiting: usize,
    /// Room freed on fire, when the service has a limit.
    limit: Option<Arc<PendingLimit>>,
    /// Entries found not yet due during an advance, re-filed after it.
    refile: Vec<EntryPtr>,
    /// Nanoseconds ↔ ticks.
    ticks: Ticks,
}

impl ShardCore {
    /// The core of the shard behind `shared`, whose rings `cursors` consume, with its
    /// wheel at tick `now` and ticks of `tick_ns` nanoseconds (entries' deadlines are
    /// in nanoseconds; the models use 1, so that the two are the same).
    pub fn new(
        shared: Arc<ShardShared>,
        cursors: Cursors,
        now: Tick,
        tick_ns: u64,
        limit: Option<Arc<PendingLimit>>,
    ) -> Self {
        let ticks = Ticks::new(tick_ns);
        ShardCore {
            shared,
            cursors,
            wheel: Wheel::new(now.get()),
            // SAFETY: the core keeps the store behind `&mut self` (one thread at a
            // time), passes it only pointers to entries it holds a reference to (in the
            // wheel, popped from a ring, or in a message), and claims each released
            // pointer once: the wheel hands each back once (`expire`, `shut_down`) or
            // the core unlinks it first (`take_cancel`).
            store: unsafe { ShardStore::new(ticks) },
            awaiting: 0,
            limit,
            refile: Vec::new(),
            ticks,
        }
    }

    /// The shared half.
    pub fn shared(&self) -> &Arc<ShardShared> {
        &self.shared
    }

    /// Messages the core still waits for (the models' check).
    #[cfg(loom)]
    pub fn awaiting(&self) -> usize {
        self.awaiting
    }
    /// Gives the wheel's lowest slot lists their vectors on the calling thread (the
    /// shard's, as it starts), so that their memory belongs to the shard thread's
    /// allocator arena wherever they later grow.
    ///
    /// With glibc, a block is reallocated and freed in the arena of the thread that
    /// allocated it. A slot list first grown by a producer filing directly lives in
    /// that producer's arena, and when the shard later grows it (a cascade filling the
    /// level below) glibc first consolidates that arena's fast bins: every small block
    /// the producer allocated that others freed since, such as the boxed callbacks of
    /// timers that fired, or, in a thread that inherited the arena of an exited one,
    /// all of that thread's garbage. The firehose row (2 producers filing without
    /// pause) measured 5-20 ms of a shard's CPU per such cascade, and the timers due
    /// meanwhile that late. Anchored here, a list grows in the shard's own arena,
    /// which [`settle_allocator`](super::shard_loop) settled as the thread began.
    pub fn anchor_lists(&mut self) {
        self.wheel.reserve_lists(ANCHORED_LIST_CAPACITY);
    }

    /// Whether a timer due at tick `deadline` can be filed now without growing the
    /// wheel list it goes to. A direct filer or mover (`direct.rs`, ground rules:
    /// lists grow on the shard's thread) that finds no room sends the timer or
    /// message by its ring instead, so that every list of the wheel is allocated,
    /// grown and shrunk by the shard's own thread, in its own allocator arena.
    ///
    /// Why (glibc): a block is reallocated and freed in the arena of the thread that
    /// allocated it, and a free of 64 KiB or more (a drained list cut down by
    /// `recycle`) first consolidates that arena's fast bins. [`anchor_lists`] covers
    /// levels 0 and 1 from the start; a list first allocated by a producer (level 2 and
    /// up, or one whose vector went to a draining batch) lived in the producer's
    /// arena, full of the boxed callbacks freed as their timers fired, and the
    /// shard's cut of it after its cascade took 40–55 ms, with every timer due
    /// meanwhile that late (the warm firehose row, whose 1 M deadlines crossed a
    /// level-2 boundary: p99 13–44 ms against the netty-style wheel's 1.8–2.6).
    ///
    /// Always `true` under loom: the models check the custody protocol, to which
    /// this is a placement policy (its `false` takes the path of a held token).
    ///
    /// [`anchor_lists`]: Self::anchor_lists
    pub fn has_room_for(&self, deadline: Tick) -> bool {
        cfg!(loom) || self.wheel.has_room_for(deadline.get())
    }

    /// The earliest tick with work in the wheel.
    pub fn next_expiry(&self) -> Option<Tick> {
        self.wheel.next_expiry().map(Tick::new)
    }

    /// The tick `entry` is due at, by its latest deadline.
    pub(crate) fn due_tick(&self, entry: &EntryRef) -> Tick {
        self.ticks.due_tick(entry.deadline())
    }

    /// How many values this core has popped from its rings, wrapping: two readings
    /// tell whether a turn between them took anything.
    pub fn popped(&self) -> usize {
        self.cursors.popped()
    }

    /// The park handshake's store half; see [`ShardShared::prepare_park`].
    pub fn prepare_park(&self, wake: Tick) -> bool {
        self.shared.prepare_park(&self.cursors, wake)
    }

    /// Files new timers; at most one ring's worth per call so expiry is not starved.
    /// Returns how many it took.
    pub fn drain_inserts(&mut self) -> usize {
        let mut drained = 0;
        let mut cancelled = 0;
        while drained < self.shared.insert.capacity() {
            let Some(entry) = self.shared.insert.pop(&mut self.cursors.insert) else {
                break;
            };
            drained += 1;
            if let Some(entry) = self.file_one(entry) {
                cancelled += 1;
                drop(entry);
            }
        }
        ShardStats::bump(&self.shared.stats.scheduled, drained as u64);
        ShardStats::bump(&self.shared.stats.cancelled, cancelled);
        drained
    }

    /// Files `entry` (the service reference of a new timer, or of a repeating timer's
    /// next run) into the wheel, as the drain of the insert ring does; if a cancel won
    /// first, tracks the move message still to come (if any) and gives the reference
    /// back, to be dropped by the caller.
    fn file_one(&mut self, entry: EntryRef) -> Option<EntryRef> {
        match entry.mark_filed() {
            File::Filed => {
                let ptr = self.store.release(entry);
                self.wheel.insert(&mut self.store, ptr);
                None
            }
            File::AlreadyCancelled { moving } => {
                if moving {
                    await_message(&mut self.store, &mut self.awaiting, &entry, Aside::Move);
                }
                Some(entry)
            }
        }
    }

    /// Direct filing (`direct.rs`): files a new timer handed over by its producer,
    /// who holds the shard's token, with the drain's bookkeeping (counted in
    /// `filed_direct`, not `scheduled`, which counts what left the insert ring).
    /// Returns the reference if a cancel won first, for the caller to drop after it
    /// gives the token back.
    pub fn file_direct(&mut self, entry: EntryRef) -> Option<EntryRef> {
        ShardStats::bump(&self.shared.stats.filed_direct, 1);
        let cancelled = self.file_one(entry);
        if cancelled.is_some() {
            ShardStats::bump(&self.shared.stats.cancelled, 1);
        }
        cancelled
    }

    /// Direct unlinking (`direct.rs`): takes the cancel message for `entry` from its
    /// sender, who holds the shard's token, exactly as the drain of the message ring
    /// would (the second table of the ground rules). Returns the wheel's reference if
    /// the entry was in the wheel, to be dropped after the token is given back.
    pub fn cancel_direct(&mut self, entry: &EntryRef) -> Option<EntryRef> {
        ShardStats::bump(&self.shared.stats.cancelled, 1);
        self.take_cancel(entry)
    }

    /// Direct moving (`direct.rs`): takes the move message for `entry` from its
    /// sender, who holds the shard's token, as the drain of the message ring would.
    pub fn move_direct(&mut self, entry: &EntryRef) {
        self.take_move(entry);
    }

    /// Processes cancel and move messages (the second table of the ground rules);
    /// at most one ring's worth per call. Returns how many.
    pub fn drain_messages(&mut self) -> usize {
        let mut drained = 0;
        let mut cancelled = 0;
        while drained < self.shared.messages.capacity() {
            let Some(message) = self.shared.messages.pop(&mut self.cursors.messages) else {
                break;
            };
            drained += 1;
            match message {
                Message::Cancel(entry) => {
                    cancelled += 1;
                    drop(self.take_cancel(&entry));
                }
                Message::Move(entry) => self.take_move(&entry),
            }
        }
        ShardStats::bump(&self.shared.stats.cancelled, cancelled);
        drained
    }

    /// A cancel message for `entry`; returns the wheel's reference if the entry was
    /// in the wheel (never the last: the message holds one).
    fn take_cancel(&mut self, entry: &EntryRef) -> Option<EntryRef> {
        let ptr = entry.as_ptr();
        let mut unlinked = None;
        match self.store.aside(ptr) {
            Some(Aside::Cancel) => {
                self.awaiting -= 1;
                self.store.clear_aside(ptr);
            }
            None => {
                self.wheel.remove(&mut self.store, ptr);
                // SAFETY: the entry was in the wheel, filed with the reference that
                // `release` gave up, unclaimed until now; it leaves the store here.
                unlinked = Some(unsafe { self.store.claim(ptr) });
            }
            Some(other) => {
                unreachable!("message invariant: a cancel message for an entry aside as {other:?}")
            }
        }
        if entry.snapshot().is_moving() {
            await_message(&mut self.store, &mut self.awaiting, entry, Aside::Move);
        }
        unlinked
    }

    /// A move message for `entry`.
    fn take_move(&mut self, entry: &EntryRef) {
        let ptr = entry.as_ptr();
        let before = entry.clear_moving();
        match self.store.aside(ptr) {
            Some(Aside::Move | Aside::DetachedMove) => {
                self.awaiting -= 1;
                self.store.clear_aside(ptr);
            }
            Some(Aside::Cancel) => {}
            None if !before.is_filed() => {}
            None if before.state() == TimerState::Pending => {
                self.wheel.remove(&mut self.store, ptr);
                self.wheel.insert(&mut self.store, ptr);
            }
            None => {}
        }
    }

    /// One turn of the shard loop: files what waits in the insert ring, takes the
    /// messages, reads the time (`now`, a tick) and expires what is due by it into
    /// `out`, at most [`TURN_BUDGET`] entries. Returns whether everything due by `now`
    /// was expired (if not, the next turn should follow at once: `next_expiry` is at
    /// or before `now`). `ShardThread::run` calls this every turn; the loom models
    /// call it too.
    pub fn turn(&mut self, now: impl FnOnce() -> Tick, out: &mut impl FnMut(Expired)) -> bool {
        self.drain_inserts();
        self.drain_messages();
        let now = now();
        self.expire_bounded(now, TURN_BUDGET, out)
    }

    /// Advances the wheel to tick `now` and expires everything due: each fired timer
    /// or started run goes to `out`; entries whose deadline moved later (or whose
    /// reset is under way) are re-filed; cancelled ones are tracked until their
    /// message. (The models' way in; the shard loop turns with a budget.)
    #[cfg(loom)]
    pub fn expire(&mut self, now: Tick, out: &mut impl FnMut(Expired)) {
        let finished = self.expire_bounded(now, usize::MAX, out);
        debug_assert!(finished, "core invariant: an unbounded expiry finishes");
    }

    /// As [`expire`](Self::expire), taking at most `budget` entries out of the wheel;
    /// returns whether everything due by `now` was expired (the wheel's
    /// `advance_bounded`).
    pub fn expire_bounded(
        &mut self,
        now: Tick,
        budget: usize,
        out: &mut impl FnMut(Expired),
    ) -> bool {
        let ShardCore {
            shared,
            wheel,
            store,
            awaiting,
            limit,
            refile,
            ticks,
            ..
        } = self;
        let due_by = ticks.due_by(now);
        let mut fired = 0;
        let mut runs = 0;
        let finished = wheel.advance_bounded(store, now.get(), budget, &mut |store, ptr| {
            // SAFETY: the wheel hands back each filed pointer once, and its reference
            // (given up by `release` when filed) is unclaimed until now.
            let entry = unsafe { store.claim(ptr) };
            let holds_room = entry.holds_room();
            match entry.try_fire_due(due_by) {
                Due::Fired(task) => {
                    fired += 1;
                    if let Some(limit) = limit.as_deref().filter(|_| holds_room) {
                        limit.release();
                    }
                    out(Expired::Fired(task));
                }
                Due::Run(running) => {
                    // A repeating timer's run: it stays pending (no room freed).
                    fired += 1;
                    runs += 1;
                    out(Expired::Run(running));
                }
                Due::Later(entry) => refile.push(store.release(entry)),
                Due::Cancelled(entry) => {
                    // Filed when its cancel won, so its message is on the way.
                    await_message(store, awaiting, &entry, Aside::Cancel);
                }
            }
        });
        for ptr in refile.drain(..) {
            wheel.insert(store, ptr);
        }
        ShardStats::bump(&shared.stats.fired, fired);
        ShardStats::bump(&shared.stats.runs, runs);
        finished
    }

    /// Closes the insert ring, empties the ring and the wheel, waits for every awaited
    /// message, retires the shard, and returns the timers still pending (detached:
    /// handles can no longer cancel or reset them).
    pub fn shut_down(&mut self) -> Vec<EntryRef> {
        let mut unfired = Vec::new();
        let reserved = self.shared.insert.close();
        let mut scheduled = 0u64;
        let mut cancelled = 0u64;
        let ShardCore {
            shared,
            cursors,
            wheel,
            store,
            awaiting,
            ..
        } = self;
        shared
            .insert
            .drain_closed(&mut cursors.insert, reserved, &mut |entry| {
                scheduled += 1;
                let detached = detach(store, awaiting, entry, false, &mut unfired);
                cancelled += u64::from(!detached);
            });
        ShardStats::bump(&shared.stats.scheduled, scheduled);
        ShardStats::bump(&shared.stats.cancelled, cancelled);
        wheel.drain(&mut |ptr| {
            // SAFETY: as in `expire`: each filed pointer comes back once, unclaimed.
            let entry = unsafe { store.claim(ptr) };
            detach(store, awaiting, entry, true, &mut unfired);
        });
        let backoff = Backoff::new();
        while self.awaiting > 0 {
            if self.drain_messages() == 0 {
                backoff.snooze();
            }
        }
        // ORDERING: Relaxed: a statistic (shutdown's caller reads it after joining
        // this thread, or on this thread).
        self.shared
            .returned
            .fetch_add(unfired.len() as u64, crate::sync::Ordering::Relaxed);
        self.shared.retire();
        unfired
    }
}

/// Tracks `entry` outside the wheel until the message `why` names arrives (ground
/// rules: the first table).
fn await_message(store: &mut ShardStore, awaiting: &mut usize, entry: &EntryRef, why: Aside) {
    store.set_aside(entry.as_ptr(), why);
    *awaiting += 1;
}

/// Shutdown's detach of an entry taken from the insert ring or (`in_wheel`) the
/// wheel: a pending one goes to `unfired`, a cancelled one is let go; either waits for
/// a message still to come (ground rules: the first table). Returns whether it was
/// pending.
fn detach(
    store: &mut ShardStore,
    awaiting: &mut usize,
    entry: EntryRef,
    in_wheel: bool,
    unfired: &mut Vec<EntryRef>,
) -> bool {
    let before = entry.detach();
    match before.state() {
        TimerState::Pending => {
            if before.is_moving() {
                await_message(store, awaiting, &entry, Aside::DetachedMove);
            }
            unfired.push(entry);
            true
        }
        // Filed when its cancel won: the cancel message is coming (and finds MOVING).
        TimerState::Cancelled if in_wheel => {
            await_message(store, awaiting, &entry, Aside::Cancel);
            false
        }
        // Never filed: no cancel message, perhaps a move.
        TimerState::Cancelled => {
            if before.is_moving() {
                await_message(store, awaiting, &entry, Aside::Move);
            }
            false
        }
        TimerState::Fired => {
            unreachable!("shutdown invariant: a fired entry is in neither ring nor wheel")
        }
    }
}
