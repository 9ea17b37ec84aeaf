//! One shard: a thread that owns a timing wheel and drains its insert and cancel
//! rings, advances the wheel to the current tick, fires what is due and parks until
//! its next expiry.
//!
//! # Ground rules
//!
//! - The wheel, the [`ShardStore`] and both ring cursors belong to the shard thread.
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
//!   producers do not unpark it.
//! - **Shutdown.** The shard closes its insert ring and drains it, empties its wheel
//!   (clearing `FILED` on each entry), then drains its cancel ring until every
//!   outstanding cancel message has arrived (entry ground rule 4). Pending timers come
//!   back to the caller.

#![forbid(unsafe_code)]

use std::time::Instant;

use crate::clock::Clock;
use crate::entry::{
    Aside, CancelSink, Due, EntryRef, File, FiredEntry, Message, RawEntry, RunningEntry, ShardStore,
};
use crate::executor::{Executor, Task};
use crate::handle::TimerState;
use crate::ring::{Cursor, PushError, Ring};
use crate::sync::{
    fence, thread, Arc, AtomicBool, AtomicU64, AtomicUsize, Backoff, CachePadded, Mutex, Ordering,
    ThreadSlot,
};
use crate::wheel::Wheel;

/// `next_wake` while the shard is running: no producer needs to wake it.
pub const AWAKE: u64 = 0;
/// `next_wake` while the shard sleeps with nothing due: any deadline is earlier.
pub const NEVER: u64 = u64::MAX;
/// Fired tasks handed to the executor per batch.
const FIRE_BATCH: usize = 256;

/// What a shard hands the executor.
#[derive(Debug)]
pub(crate) enum ShardTask {
    /// A one-shot timer that fired.
    Fired(FiredEntry),
    /// One run of a repeating timer.
    Run(RunTask),
}

impl Task for ShardTask {
    fn run(self) {
        match self {
            ShardTask::Fired(task) => task.run(),
            ShardTask::Run(task) => task.run(),
        }
    }
}

/// One run of a repeating timer, on an executor thread: run the callback, schedule the
/// next run at the fixed rate (skipping runs whose slots passed), end the run, and
/// hand the entry back to its shard. A panic is re-raised after that, so the executor
/// counts it and the timer keeps going.
#[derive(Debug)]
pub(crate) struct RunTask {
    /// The entry, holding `RUNNING`.
    running: RunningEntry,
    /// Its shard, to file the next run.
    shard: Arc<ShardShared>,
    /// Ticks ↔ instants.
    clock: Clock,
}

impl RunTask {
    fn run(self) {
        let RunTask {
            mut running,
            shard,
            clock,
        } = self;
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| running.call()));
        let (next, skipped) = running.schedule_next(Instant::now(), |at| clock.instant_to_tick(at));
        if skipped > 0 {
            // ORDERING: Relaxed: a statistic.
            shard.skipped.fetch_add(skipped, Ordering::Relaxed);
        }
        if let Some(entry) = running.finish() {
            if let Err(entry) = shard.push_insert(entry, next) {
                // The shard has shut down: `shutdown` hands this one back too.
                shard
                    .late
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(entry);
            }
        }
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    }
}

/// The counters one shard keeps; written only by the shard thread (Relaxed), summed
/// on read, exact at quiescence.
#[derive(Debug, Default)]
pub struct ShardStats {
    /// Timers taken from the insert ring.
    pub scheduled: AtomicU64,
    /// Timers that won Pending → Fired.
    pub fired: AtomicU64,
    /// Cancelled timers the shard has discarded or unlinked.
    pub cancelled: AtomicU64,
}

impl ShardStats {
    /// Adds `n` to a counter only this thread writes.
    fn bump(counter: &AtomicU64, n: u64) {
        // ORDERING: Relaxed: a single-writer statistic; readers want a value, not a
        // happens-before edge.
        counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }
}

/// The optional bound of `Builder::max_pending`: one shared counter of pending
/// timers. Only services built with a limit pay for it.
#[derive(Debug)]
pub(crate) struct PendingLimit {
    /// Timers scheduled and neither fired nor cancelled.
    pending: CachePadded<AtomicUsize>,
    /// The configured limit.
    limit: usize,
}

impl PendingLimit {
    /// A limit of `limit` pending timers.
    pub(crate) fn new(limit: usize) -> Self {
        PendingLimit {
            pending: CachePadded::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// The configured limit.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Takes room for one timer, or fails if `limit` are pending.
    pub(crate) fn try_acquire(&self) -> bool {
        // ORDERING: Relaxed: the counter guards no other memory; the RMW alone keeps
        // it exact, so at most `limit` acquisitions are outstanding.
        let previous = self.pending.fetch_add(1, Ordering::Relaxed);
        if previous >= self.limit {
            // ORDERING: Relaxed, as above.
            self.pending.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Frees the room of one timer that fired or was cancelled.
    pub(crate) fn release(&self) {
        // ORDERING: Relaxed, as in `try_acquire`.
        self.pending.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What producers, cancellers and the façade share with one shard thread.
#[derive(Debug)]
pub struct ShardShared {
    /// New timers, carrying the service reference (entry ground rule 1).
    insert: Ring<EntryRef>,
    /// Cancel and move messages (entry ground rule 4).
    cancel: Ring<Message>,
    /// The tick the shard sleeps until: [`AWAKE`] while running, [`NEVER`] when idle.
    /// Written by the shard (before its fence when parking; on waking); read by
    /// producers after their fence. Relaxed accesses: the fences order them.
    next_wake: CachePadded<AtomicU64>,
    /// Set by shutdown; the shard then shuts down instead of parking.
    stop: AtomicBool,
    /// The shard thread, to unpark.
    thread: ThreadSlot,
    /// Counters written by the shard thread.
    pub stats: CachePadded<ShardStats>,
    /// Runs of repeating timers skipped because they fell a whole period behind;
    /// written by executor threads (Relaxed `fetch_add`), exact at quiescence.
    pub(crate) skipped: AtomicU64,
    /// Repeating timers whose next run could not be filed because the shard had shut
    /// down; `shutdown` hands them back.
    late: Mutex<Vec<EntryRef>>,
}

/// What the shard thread holds: its wheel and the entries it keeps aside.
struct Held {
    /// The timing wheel over this shard's entries.
    wheel: Wheel<RawEntry>,
    /// The wheel's view of the entries.
    store: ShardStore,
    /// Entries held outside the wheel, waiting for a cancel or move message.
    aside: usize,
    /// Entries handed back at shutdown whose move message is still coming.
    detached_moves: usize,
}

/// The shard thread's own state.
#[derive(Debug)]
pub(crate) struct ShardThread {
    /// Shared with producers.
    shared: Arc<ShardShared>,
    /// The rings' consumer cursors.
    cursors: Cursors,
    /// Ticks ↔ instants.
    clock: Clock,
    /// Where fired timers go.
    executor: Executor<ShardTask>,
    /// Room freed on fire, when the service has a limit.
    limit: Option<Arc<PendingLimit>>,
}

/// The consumer cursors of a shard's two rings; they belong to the shard thread.
#[derive(Debug)]
pub struct Cursors {
    /// The insert ring's cursor.
    insert: Cursor,
    /// The cancel ring's cursor.
    cancel: Cursor,
}

impl ShardShared {
    /// A shard's shared half, with rings of `ring_capacity` slots, and the cursors
    /// that only its thread may use.
    pub fn new(ring_capacity: usize) -> (Arc<ShardShared>, Cursors) {
        let (insert, insert_seed) = Ring::new(ring_capacity);
        let (cancel, cancel_seed) = Ring::new(ring_capacity);
        let shared = Arc::new(ShardShared {
            insert,
            cancel,
            next_wake: CachePadded::new(AtomicU64::new(AWAKE)),
            stop: AtomicBool::new(false),
            thread: ThreadSlot::default(),
            stats: CachePadded::new(ShardStats::default()),
            skipped: AtomicU64::new(0),
            late: Mutex::new(Vec::new()),
        });
        let cursors = Cursors {
            insert: insert_seed.cursor(&shared.insert),
            cancel: cancel_seed.cursor(&shared.cancel),
        };
        (shared, cursors)
    }

    /// The store half of the park handshake (ground rules): publishes that the shard
    /// will sleep until tick `wake` ([`NEVER`] for no timer), then re-checks both
    /// rings and the stop flag. Returns whether the shard may park; if not, it has
    /// already published [`AWAKE`] again. Shard thread only.
    pub fn prepare_park(&self, cursors: &Cursors, wake: u64) -> bool {
        // ORDERING: Relaxed store, then a SeqCst fence before re-checking the rings:
        // the shard's half of the park handshake (ground rules), pairing with the
        // fence after a producer's push.
        self.next_wake.store(wake, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let work_arrived =
            self.insert.has_pending(&cursors.insert) || self.cancel.has_pending(&cursors.cancel);
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
        self.next_wake.store(AWAKE, Ordering::Relaxed);
    }

    /// Pops one new timer (the loom models' shard side). Shard thread only.
    #[cfg(loom)]
    pub fn pop_insert(&self, cursors: &mut Cursors) -> Option<EntryRef> {
        self.insert.pop(&mut cursors.insert)
    }

    /// Pops one message (the loom models' shard side). Shard thread only.
    #[cfg(loom)]
    pub fn pop_cancel(&self, cursors: &mut Cursors) -> Option<Message> {
        self.cancel.pop(&mut cursors.cancel)
    }

    /// Records the shard's thread so producers can unpark it.
    pub fn set_thread(&self, handle: thread::Thread) {
        self.thread.set(handle);
    }

    /// Hands a new timer due at tick `deadline` to the shard. A full ring never
    /// loses it: the producer wakes the shard and backs off until there is room.
    ///
    /// # Errors
    ///
    /// The entry comes back if the shard has shut down (its insert ring is closed).
    pub fn push_insert(&self, entry: EntryRef, deadline: u64) -> Result<(), EntryRef> {
        self.push_and_wake(&self.insert, entry, deadline, false)
    }

    /// Pushes `value` into `ring` (one of this shard's), backing off and waking the
    /// shard while the ring is full; then wakes it if it sleeps past `deadline`, or
    /// (with `wake_idle`) sleeps with nothing to do, or the ring is filling. The
    /// producer's half of the park handshake (ground rules).
    ///
    /// # Errors
    ///
    /// The value comes back if the ring is closed.
    fn push_and_wake<T>(
        &self,
        ring: &Ring<T>,
        value: T,
        deadline: u64,
        wake_idle: bool,
    ) -> Result<(), T> {
        let backoff = Backoff::new();
        let mut value = value;
        loop {
            match ring.push(value) {
                Ok(position) => {
                    // ORDERING: this SeqCst fence, between our reservation in `push`
                    // and our read of `next_wake`, pairs with the fence in
                    // `prepare_park`; the read itself can then be Relaxed.
                    fence(Ordering::SeqCst);
                    // ORDERING: Relaxed: ordered by the fence above.
                    let wake = self.next_wake.load(Ordering::Relaxed);
                    let idle = wake_idle && wake == NEVER;
                    if deadline < wake || idle || self.is_filling(position) {
                        self.thread.unpark();
                    }
                    return Ok(());
                }
                Err(PushError::Full(back)) => {
                    value = back;
                    self.thread.unpark();
                    backoff.snooze();
                }
                Err(PushError::Closed(back)) => return Err(back),
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

    /// Takes the repeating timers that came back after the shard shut down.
    pub(crate) fn take_late(&self) -> Vec<EntryRef> {
        core::mem::take(&mut *self.late.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Asks the shard to shut down and wakes it.
    pub fn request_stop(&self) {
        // ORDERING: Release pairs with the shard's Acquire load in its loop; the
        // unpark below makes a park after that load return at once, so no handshake
        // beyond the park token is needed.
        self.stop.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

impl ShardShared {
    /// Sends a message. An idle shard (nothing in its wheel) is woken so the message
    /// is processed and counted now; a busy one processes it at its next wake-up, at
    /// the latest after half a ring of messages.
    fn send_message(&self, message: Message, deadline: u64) {
        if self
            .push_and_wake(&self.cancel, message, deadline, true)
            .is_err()
        {
            unreachable!("message ring invariant: the message ring is never closed");
        }
    }
}

impl CancelSink for ShardShared {
    fn send_cancel(&self, entry: RawEntry) {
        // A cancel frees memory but is never urgent: no earlier wake-up needed.
        self.send_message(Message::Cancel(entry), NEVER);
    }

    fn send_move(&self, entry: EntryRef, deadline: u64) {
        self.send_message(Message::Move(entry), deadline);
    }
}

impl ShardThread {
    /// The thread half of a shard.
    pub(crate) fn new(
        shared: Arc<ShardShared>,
        cursors: Cursors,
        clock: Clock,
        executor: Executor<ShardTask>,
        limit: Option<Arc<PendingLimit>>,
    ) -> Self {
        ShardThread {
            shared,
            cursors,
            clock,
            executor,
            limit,
        }
    }

    /// The shard loop. Returns the timers still pending at shutdown.
    pub(crate) fn run(mut self, pin_to: Option<core_affinity::CoreId>) -> Vec<EntryRef> {
        #[cfg(not(loom))]
        if let Some(core) = pin_to {
            let _ = core_affinity::set_for_current(core);
        }
        #[cfg(loom)]
        let _ = pin_to;
        let mut held = Held {
            wheel: Wheel::new(self.clock.now_tick()),
            store: crate::entry::shard_store(),
            aside: 0,
            detached_moves: 0,
        };
        let mut fired: Vec<ShardTask> = Vec::with_capacity(FIRE_BATCH);
        let mut refile = Vec::new();
        loop {
            self.drain_inserts(&mut held);
            self.drain_messages(&mut held);
            let now = self.clock.now_tick();
            let Held {
                wheel,
                store,
                aside,
                ..
            } = &mut held;
            wheel.advance(store, now, &mut |store, raw| {
                self.expire(store, now, raw, &mut fired, &mut refile, aside);
            });
            // Entries whose deadline moved later (or whose reset is under way) go back
            // into the wheel at their current deadline.
            for raw in refile.drain(..) {
                wheel.insert(store, raw);
            }
            if !fired.is_empty() {
                self.executor.submit(core::mem::replace(
                    &mut fired,
                    Vec::with_capacity(FIRE_BATCH),
                ));
            }
            // ORDERING: Acquire pairs with the Release store in `request_stop`.
            if self.shared.stop.load(Ordering::Acquire) {
                break;
            }
            self.park_until(held.wheel.next_expiry());
        }
        self.shut_down(&mut held)
    }

    /// Fires `raw` if it is due at tick `now` by its latest deadline, handing it to
    /// the executor in batches; one whose deadline moved later, or whose reset or move
    /// is under way, goes to `refile`; one cancelled while filed is held aside for its
    /// cancel message.
    fn expire(
        &self,
        store: &mut ShardStore,
        now: u64,
        raw: RawEntry,
        fired: &mut Vec<ShardTask>,
        refile: &mut Vec<RawEntry>,
        aside: &mut usize,
    ) {
        let entry = store.claim(raw);
        match entry.try_fire_due(now) {
            Due::Fired(task) => {
                ShardStats::bump(&self.shared.stats.fired, 1);
                if let Some(limit) = &self.limit {
                    limit.release();
                }
                self.hand_over(fired, ShardTask::Fired(task));
            }
            Due::Run(running) => {
                // A repeating timer's run: it stays pending (no room freed).
                ShardStats::bump(&self.shared.stats.fired, 1);
                let task = RunTask {
                    running,
                    shard: self.shared.clone(),
                    clock: self.clock,
                };
                self.hand_over(fired, ShardTask::Run(task));
            }
            Due::Later(entry) => refile.push(store.release(entry)),
            Due::Cancelled(entry) => {
                // Cancelled while filed: its message is on the way, and the wheel's
                // reference stays until it arrives (ground rule 4).
                let raw = store.release(entry);
                store.set_aside(raw, Aside::Cancel);
                *aside += 1;
            }
        }
    }

    /// Adds `task` to the batch, handing the batch to the executor once full.
    fn hand_over(&self, fired: &mut Vec<ShardTask>, task: ShardTask) {
        fired.push(task);
        if fired.len() == FIRE_BATCH {
            self.executor
                .submit(core::mem::replace(fired, Vec::with_capacity(FIRE_BATCH)));
        }
    }

    /// Files new timers; at most one ring's worth per call so expiry is not starved.
    fn drain_inserts(&mut self, held: &mut Held) {
        let mut drained = 0u64;
        while drained < self.shared.insert.capacity() as u64 {
            let Some(entry) = self.shared.insert.pop(&mut self.cursors.insert) else {
                break;
            };
            drained += 1;
            match entry.mark_filed() {
                File::Filed => {
                    let raw = held.store.release(entry);
                    held.wheel.insert(&mut held.store, raw);
                }
                File::AlreadyCancelled => {
                    ShardStats::bump(&self.shared.stats.cancelled, 1);
                    drop(entry);
                }
            }
        }
        ShardStats::bump(&self.shared.stats.scheduled, drained);
    }

    /// Processes cancel and move messages; returns how many.
    fn drain_messages(&mut self, held: &mut Held) -> usize {
        let mut drained = 0;
        let mut cancelled = 0;
        while drained < self.shared.cancel.capacity() {
            let Some(message) = self.shared.cancel.pop(&mut self.cursors.cancel) else {
                break;
            };
            drained += 1;
            match message {
                Message::Cancel(raw) => {
                    cancelled += 1;
                    match held.store.aside(raw) {
                        Some(Aside::Cancel) => held.aside -= 1,
                        None => held.wheel.remove(&mut held.store, raw),
                        Some(other) => {
                            unreachable!("message invariant: a cancel message for an entry aside as {other:?}")
                        }
                    }
                    // The wheel's reference goes now, unless a move message is still
                    // outstanding: then the entry waits aside for it (ground rule 4).
                    let entry = held.store.claim(raw);
                    if entry.snapshot().is_moving() {
                        let raw = held.store.release(entry);
                        held.store.set_aside(raw, Aside::Move);
                        held.aside += 1;
                    }
                }
                Message::Move(entry) => {
                    let raw = entry.as_raw();
                    let before = entry.clear_moving();
                    match held.store.aside(raw) {
                        // Cancelled, cancel message processed: release it now.
                        Some(Aside::Move) => {
                            held.aside -= 1;
                            drop(held.store.claim(raw));
                        }
                        // Cancelled, cancel message still to come: it releases it.
                        Some(Aside::Cancel) => {}
                        // Handed back at shutdown; this was the message it waited for.
                        Some(Aside::DetachedMove) => held.detached_moves -= 1,
                        // In the wheel: re-file it by its (earlier) deadline. A
                        // cancelled one stays until its cancel message unlinks it.
                        None => {
                            if before.state() == TimerState::Pending {
                                held.wheel.remove(&mut held.store, raw);
                                held.wheel.insert(&mut held.store, raw);
                            }
                        }
                    }
                    drop(entry); // the message's own reference
                }
            }
        }
        ShardStats::bump(&self.shared.stats.cancelled, cancelled);
        drained
    }

    /// Sleeps until tick `next` (or indefinitely), unless work arrived meanwhile.
    fn park_until(&self, next: Option<u64>) {
        let wake = next.unwrap_or(NEVER);
        let now = self.clock.now_tick();
        if wake <= now {
            return;
        }
        if self.shared.prepare_park(&self.cursors, wake) {
            if wake == NEVER {
                thread::park();
            } else {
                let until = self.clock.tick_to_instant(wake);
                let now = Instant::now();
                if until > now {
                    thread::park_timeout(until - now);
                }
            }
            self.shared.wake_up();
        }
    }

    /// Closes the insert ring, empties everything, waits for outstanding messages,
    /// and returns the pending timers.
    fn shut_down(&mut self, held: &mut Held) -> Vec<EntryRef> {
        let mut unfired = Vec::new();
        let reserved = self.shared.insert.close();
        let mut scheduled = 0u64;
        let mut cancelled = 0u64;
        self.shared
            .insert
            .drain_closed(&mut self.cursors.insert, reserved, &mut |entry| {
                scheduled += 1;
                // Never filed, so neither a cancel nor a reset sent a message.
                match entry.detach().state() {
                    TimerState::Pending => unfired.push(entry),
                    _ => cancelled += 1,
                }
            });
        ShardStats::bump(&self.shared.stats.scheduled, scheduled);
        ShardStats::bump(&self.shared.stats.cancelled, cancelled);
        let Held {
            wheel,
            store,
            aside,
            detached_moves,
        } = held;
        wheel.drain(&mut |raw| {
            let entry = store.claim(raw);
            let before = entry.detach();
            match before.state() {
                TimerState::Pending => {
                    if before.is_moving() {
                        // Its move message is still coming: wait for it.
                        store.set_aside(entry.as_raw(), Aside::DetachedMove);
                        *detached_moves += 1;
                    }
                    unfired.push(entry);
                }
                TimerState::Cancelled => {
                    let raw = store.release(entry);
                    store.set_aside(raw, Aside::Cancel);
                    *aside += 1;
                }
                TimerState::Fired => {
                    unreachable!("wheel invariant: a fired entry is never in the wheel")
                }
            }
        });
        let backoff = Backoff::new();
        while held.aside > 0 || held.detached_moves > 0 {
            if self.drain_messages(held) == 0 {
                backoff.snooze();
            }
        }
        unfired
    }
}
