//! The timer entry: one heap allocation per timer holding its state word, reference
//! count, id, deadline tick, its place in the shard's wheel, and the callback itself.
//!
//! The allocation is an `Entry<F>` whose first field is a type-erased [`Header`]; the
//! rest of the crate sees only `NonNull<Header>` (as [`EntryRef`], which owns one
//! reference, or [`RawEntry`], which carries one by protocol) and reaches the callback
//! through the header's vtable. The shard's timing wheel files these pointers
//! directly ([`ShardStore`]), so a pending timer costs this allocation plus one
//! pointer in a slot vector, and no separate wheel node.
//!
//! # Ground rules
//!
//! 1. **References.** `refs` counts owners: each `TimerHandle`, and one *service
//!    reference* created by `schedule`, held in turn by the shard's insert ring, the
//!    shard (in its wheel, or awaiting a cancel message), and finally an executor task
//!    ([`FiredEntry`]) or an `Unfired`. A [`RawEntry`] carries a reference it does not
//!    count twice: it is made by [`EntryRef::into_raw`] and claimed exactly once by
//!    [`EntryRef::from_raw`]. The last owner frees the allocation.
//! 2. **Callback.** The callback cell is read only by the winner of Pending → Fired,
//!    which moves the callback out and runs it, and by the winner of Pending →
//!    Cancelled, which drops it at once (`state.rs` makes the two exclusive). A
//!    repeating timer's runner holds it while `RUNNING` is set; a cancel that wins
//!    then leaves the drop to the runner. If the last reference goes while still
//!    Pending, nobody else can reach the cell and the destructor drops the callback.
//! 3. **Place.** `place` is read and written only by the shard thread holding the
//!    service reference, through [`ShardStore`].
//! 4. **Messages.** An entry that is Cancelled with `FILED` set has exactly one
//!    cancel message, sent (or about to be sent) by the canceller that won; one with
//!    `MOVING` set has exactly one move message, sent by the reset that set it. The
//!    shard releases the service reference only when it has processed the cancel
//!    message, and never lets an entry with `MOVING` leave its wheel (neither fired
//!    nor released) until its move message has arrived. So the pointer in a cancel
//!    message is live when the shard pops it, and at shutdown the shard can see every
//!    outstanding message (on entries in its wheel or held aside) and keeps draining
//!    until all have arrived before it exits: the [`CancelPort`] a sender uses is
//!    live.

use core::mem::MaybeUninit;
use core::ptr::NonNull;
use std::time::{Duration, Instant};

use crate::handle::{TimerId, TimerState};
use crate::sync::{AtomicU32, AtomicU64, Ordering, UnsafeCell};
use crate::wheel::{Place, Store};

mod state;

use state::StateWord;
pub use state::{Cancel, File, Snapshot};
pub(crate) use state::{Finish, Fire};

/// Why a shard holds an entry outside its wheel, waiting for a message (ground rule 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Aside {
    /// Cancelled; its cancel message has not arrived yet.
    Cancel,
    /// Cancelled and its cancel message processed; its move message has not arrived.
    Move,
    /// Handed back at shutdown as pending with a move message outstanding.
    DetachedMove,
}

/// The list number that marks an entry held aside; the position says why.
const ASIDE_LIST: u16 = u16::MAX;

/// References beyond this abort the process, as `Arc` does: the count must never wrap.
const MAX_REFS: u32 = i32::MAX as u32;

/// The type-erased part of every entry; always the first field of an `Entry<F>`.
#[repr(C)]
pub(crate) struct Header {
    /// Pending / Fired / Cancelled and `FILED`; see `state.rs`.
    state: StateWord,
    /// Owners of this allocation (ground rule 1). Incremented Relaxed by a holder of a
    /// reference, decremented AcqRel by each owner as it lets go.
    refs: AtomicU32,
    /// Functions that know the callback's type.
    vtable: &'static Vtable,
    /// The timer's id.
    id: TimerId,
    /// The deadline, in ticks of the service's clock: the latest one asked for. Written
    /// by `schedule` (before publishing) and by a reset while it holds `RESETTING`
    /// (Release; its `finish_reset` CAS publishes it); read by the shard (Relaxed for
    /// filing, where a stale value is corrected later; Acquire after loading the state
    /// word when deciding to fire) and by handles.
    deadline: AtomicU64,
    /// Where the entry sits in its shard's wheel. Shard thread only (ground rule 3).
    place: UnsafeCell<Place>,
    /// Under loom, reports the entry as leaked if it is never freed.
    #[cfg(loom)]
    track: loom::alloc::Track<()>,
}

/// Functions over the concrete `Entry<F>` behind a `Header`.
struct Vtable {
    /// Runs the callback once and drops it (a repeating timer's run by `Unfired::run`).
    run: unsafe fn(NonNull<Header>),
    /// Drops the callback in place.
    drop_callback: unsafe fn(NonNull<Header>),
    /// Frees the allocation (the callback must already be gone).
    dealloc: unsafe fn(NonNull<Header>),
    /// Repeating timers only: runs the callback in place, keeping it.
    call_again: Option<unsafe fn(NonNull<Header>)>,
    /// Repeating timers only: counts the run just made and returns the next run's
    /// deadline (`None` beyond what `Instant` holds) and how many runs were skipped.
    next_run: Option<NextRunFn>,
}

/// Counts a repeating timer's run and returns its next deadline and the runs skipped.
type NextRunFn = unsafe fn(NonNull<Header>, Instant) -> (Option<Instant>, u64);

/// A repeating timer's callback with its fixed-rate schedule: run `n` is due at
/// `start + n × period`.
struct Repeat<F> {
    /// The callback.
    f: F,
    /// When the timer was scheduled.
    start: Instant,
    /// The period; at least one tick.
    period: Duration,
    /// The number of the run most recently made (or skipped).
    runs: u64,
}

impl<F: FnMut()> Repeat<F> {
    /// The deadline of run `n`, or `None` past what `Instant` holds.
    fn deadline_of(&self, n: u64) -> Option<Instant> {
        let offset = u32::try_from(n)
            .ok()
            .and_then(|n| self.period.checked_mul(n))?;
        self.start.checked_add(offset)
    }
}

/// The allocation: header first, so a pointer to it is a pointer to the header.
#[repr(C)]
struct Entry<F> {
    /// The type-erased part.
    header: Header,
    /// The callback; initialised until run or dropped (ground rule 2).
    callback: UnsafeCell<MaybeUninit<F>>,
}

impl<F: FnOnce() + Send + 'static> Entry<F> {
    /// The vtable for callbacks of type `F`.
    const VTABLE: Vtable = Vtable {
        run: Self::run,
        drop_callback: Entry::<F>::drop_callback_any,
        dealloc: Entry::<F>::dealloc_any,
        call_again: None,
        next_run: None,
    };

    /// # Safety
    ///
    /// - `header` points to a live `Entry<F>` (not just a `Header`).
    /// - The caller won Pending → Fired and the callback has not been taken.
    unsafe fn run(header: NonNull<Header>) {
        // SAFETY: `header` points to a live `Entry<F>` (the caller's first point).
        let entry = unsafe { header.cast::<Entry<F>>().as_ref() };
        // SAFETY: we are the only reader of the cell (the caller's second point,
        // ground rule 2), and it is initialised; reading moves the callback out.
        let callback = entry
            .callback
            .with(|cell| unsafe { cell.cast::<F>().read() });
        callback();
    }
}

impl<F: FnMut() + Send + 'static> Entry<Repeat<F>> {
    /// The vtable for repeating callbacks of type `F`.
    const REPEATING_VTABLE: Vtable = Vtable {
        run: Self::run_once,
        drop_callback: Entry::<Repeat<F>>::drop_callback_any,
        dealloc: Entry::<Repeat<F>>::dealloc_any,
        call_again: Some(Self::call_again),
        next_run: Some(Self::next_run),
    };

    /// # Safety
    ///
    /// - `header` points to a live `Entry<Repeat<F>>`.
    /// - The caller won Pending → Fired (`Unfired::run`) and the callback is there.
    unsafe fn run_once(header: NonNull<Header>) {
        // SAFETY: live (the caller's first point).
        let entry = unsafe { header.cast::<Entry<Repeat<F>>>().as_ref() };
        // SAFETY: exclusive and initialised (the caller's second point); read moves it
        // out, so it is dropped exactly once, after the call.
        let mut repeat = entry
            .callback
            .with(|cell| unsafe { cell.cast::<Repeat<F>>().read() });
        (repeat.f)();
    }

    /// # Safety
    ///
    /// - `header` points to a live `Entry<Repeat<F>>`.
    /// - The caller holds `RUNNING` (it started this run), so it alone touches the
    ///   callback, which is initialised.
    unsafe fn call_again(header: NonNull<Header>) {
        // SAFETY: live (the caller's first point).
        let entry = unsafe { header.cast::<Entry<Repeat<F>>>().as_ref() };
        // SAFETY: exclusive and initialised while RUNNING (the caller's second point).
        entry
            .callback
            .with_mut(|cell| unsafe { ((*cell.cast::<Repeat<F>>()).f)() });
    }

    /// # Safety
    ///
    /// As [`call_again`](Self::call_again).
    unsafe fn next_run(header: NonNull<Header>, now: Instant) -> (Option<Instant>, u64) {
        // SAFETY: live (the caller's first point).
        let entry = unsafe { header.cast::<Entry<Repeat<F>>>().as_ref() };
        entry.callback.with_mut(|cell| {
            // SAFETY: exclusive and initialised while RUNNING (the caller's second
            // point), so this is the only reference to the callback.
            let repeat = unsafe { &mut *cell.cast::<Repeat<F>>() };
            // The run just made is run `made`; the next is due at `start + next × period`.
            let made = repeat.runs + 1;
            let mut next = made + 1;
            // Fixed rate: if that slot has already passed (the run ended a whole period
            // or more behind), skip to the first slot still ahead rather than run the
            // missed ones back to back.
            let passed = now.saturating_duration_since(repeat.start).as_nanos()
                / repeat.period.as_nanos().max(1);
            let passed = u64::try_from(passed).unwrap_or(u64::MAX);
            let mut skipped = 0;
            if passed >= next {
                skipped = passed + 1 - next;
                next = passed + 1;
            }
            repeat.runs = next - 1;
            (repeat.deadline_of(next), skipped)
        })
    }
}

impl<C> Entry<C> {
    /// Drops the callback in place.
    ///
    /// # Safety
    ///
    /// - `header` points to a live `Entry<C>`.
    /// - The caller won Pending → Cancelled (or holds the last reference of a Pending
    ///   entry, or ended a run that a cancel won) and the callback has not been taken.
    unsafe fn drop_callback_any(header: NonNull<Header>) {
        // SAFETY: live (the caller's first point).
        let entry = unsafe { header.cast::<Entry<C>>().as_ref() };
        // SAFETY: exclusive and initialised (the caller's second point); dropped once.
        entry
            .callback
            .with_mut(|cell| unsafe { cell.cast::<C>().drop_in_place() });
    }

    /// Frees the allocation.
    ///
    /// # Safety
    ///
    /// - `header` came from the box leaked in `EntryRef::allocate`.
    /// - No other reference remains, and the callback has been run or dropped
    ///   (`MaybeUninit` does not drop it again).
    unsafe fn dealloc_any(header: NonNull<Header>) {
        // SAFETY: the caller's points: our box, unaliased, callback already gone.
        drop(unsafe { Box::from_raw(header.cast::<Entry<C>>().as_ptr()) });
    }
}

/// One counted reference to an entry (ground rule 1).
pub struct EntryRef(NonNull<Header>);

// SAFETY: the header's shared fields are atomics or immutable; the callback cell and
// `place` are reached only under ground rules 2 and 3, which hand them to exactly one
// thread at a time; the callback is `Send` (required by `EntryRef::new`).
unsafe impl Send for EntryRef {}
// SAFETY: as for `Send`: `&EntryRef` only exposes the atomic state and immutable fields.
unsafe impl Sync for EntryRef {}

impl EntryRef {
    /// Allocates an entry with two references: one for the handle, one for the service.
    pub fn new<F: FnOnce() + Send + 'static>(
        id: TimerId,
        deadline: u64,
        callback: F,
    ) -> (EntryRef, EntryRef) {
        Self::allocate(id, deadline, &Entry::<F>::VTABLE, callback)
    }

    /// One allocation holding the header and `callback`, with two references.
    fn allocate<C>(
        id: TimerId,
        deadline: u64,
        vtable: &'static Vtable,
        callback: C,
    ) -> (EntryRef, EntryRef) {
        let entry = Box::new(Entry {
            header: Header {
                state: StateWord::new(),
                refs: AtomicU32::new(2),
                vtable,
                id,
                deadline: AtomicU64::new(deadline),
                place: UnsafeCell::new(Place::default()),
                #[cfg(loom)]
                track: loom::alloc::Track::new(()),
            },
            callback: UnsafeCell::new(MaybeUninit::new(callback)),
        });
        let header = NonNull::from(Box::leak(entry)).cast::<Header>();
        (EntryRef(header), EntryRef(header))
    }

    /// Allocates a repeating entry, first due at tick `deadline`, with runs due at
    /// `start + n × period`: two references, as [`new`](Self::new).
    pub fn new_repeating<F: FnMut() + Send + 'static>(
        id: TimerId,
        deadline: u64,
        start: Instant,
        period: Duration,
        callback: F,
    ) -> (EntryRef, EntryRef) {
        let repeat = Repeat {
            f: callback,
            start,
            period,
            runs: 0,
        };
        Self::allocate(id, deadline, &Entry::<Repeat<F>>::REPEATING_VTABLE, repeat)
    }

    /// Whether this is a repeating timer.
    pub(crate) fn is_repeating(&self) -> bool {
        self.header().vtable.call_again.is_some()
    }

    /// The header.
    fn header(&self) -> &Header {
        // SAFETY: we own a reference, so the allocation is live (ground rule 1).
        unsafe { self.0.as_ref() }
    }

    /// The timer's id.
    pub fn id(&self) -> TimerId {
        self.header().id
    }

    /// The deadline tick (the latest reset's, if any).
    pub fn deadline(&self) -> u64 {
        // ORDERING: Acquire pairs with the Release store in `reset`, for a handle that
        // reads back a deadline another thread set.
        self.header().deadline.load(Ordering::Acquire)
    }

    /// The current state.
    pub fn state(&self) -> TimerState {
        self.header().state.load().state()
    }

    /// Gives up this reference into a [`RawEntry`] that carries it.
    pub fn into_raw(self) -> RawEntry {
        let raw = RawEntry(self.0);
        core::mem::forget(self);
        raw
    }

    /// Claims the reference a [`RawEntry`] carries.
    ///
    /// # Safety
    ///
    /// - `raw` came from [`EntryRef::into_raw`], and
    /// - its reference has not been claimed yet; it is claimed now.
    pub unsafe fn from_raw(raw: RawEntry) -> EntryRef {
        EntryRef(raw.0)
    }

    /// The shard's Pending → Fired; on success the returned task owns the callback.
    ///
    /// # Errors
    ///
    /// The reference comes back if a cancel won first.
    pub fn try_fire(self) -> Result<FiredEntry, EntryRef> {
        match self.header().state.try_fire() {
            Fire::Won => Ok(FiredEntry {
                entry: self,
                taken: false,
            }),
            Fire::Lost | Fire::Moved => Err(self),
        }
    }

    /// The shard's expiry: fires the entry if it is pending, due at tick `now` by its
    /// latest deadline, and no reset or move is under way.
    pub fn try_fire_due(self, now: u64) -> Due {
        let seen = self.header().state.load();
        if seen.state() != TimerState::Pending {
            return Due::Cancelled(self);
        }
        // ORDERING: Acquire: with the Acquire load of the word above, which reads the
        // Release of the last finished reset, this reads that reset's deadline or a
        // later one; a reset that starts after the load above makes the CAS fail.
        if self.header().deadline.load(Ordering::Acquire) > now {
            return Due::Later(self);
        }
        if self.is_repeating() {
            return match self.header().state.try_start_run(seen) {
                Fire::Won => Due::Run(RunningEntry { entry: Some(self) }),
                Fire::Lost => Due::Cancelled(self),
                Fire::Moved => Due::Later(self),
            };
        }
        match self.header().state.try_fire_seen(seen) {
            Fire::Won => Due::Fired(FiredEntry {
                entry: self,
                taken: false,
            }),
            Fire::Lost => Due::Cancelled(self),
            Fire::Moved => Due::Later(self),
        }
    }

    /// Moves the deadline to tick `deadline`; `true` iff the timer was still pending
    /// (then it fires no earlier than `deadline`). A later deadline is one store: the
    /// shard re-files the entry when its old slot comes due. An earlier one for a filed
    /// entry also sends the shard one move message through `port` (ground rule 4).
    pub fn reset<S: CancelSink>(&self, deadline: u64, port: &CancelPort<S>) -> bool {
        let header = self.header();
        if self.is_repeating() {
            // A repeating timer keeps its fixed rate; nothing to move.
            return false;
        }
        if !header.state.begin_reset() {
            return false;
        }
        // ORDERING: Relaxed: we hold RESETTING, so no other reset writes meanwhile, and
        // `begin_reset`'s Acquire ordered us after the previous reset's store.
        let old = header.deadline.load(Ordering::Relaxed);
        // ORDERING: Release, and `finish_reset`'s Release CAS after it, publish the
        // deadline to the shard's Acquire loads.
        header.deadline.store(deadline, Ordering::Release);
        match header.state.finish_reset(deadline < old) {
            Finish::Pending { send_move } => {
                if send_move {
                    // SAFETY: we set MOVING on a filed, pending entry: its shard keeps
                    // the entry in its wheel, and does not exit, until this message
                    // arrives (ground rule 4), so the sink is live.
                    let sink = unsafe { port.0.as_ref() };
                    sink.send_move(self.clone(), deadline);
                }
                true
            }
            Finish::Lost => {
                // Fired or cancelled meanwhile: change nothing. No reset can begin any
                // more, so restoring is race-free.
                // ORDERING: Release, as above.
                header.deadline.store(old, Ordering::Release);
                false
            }
        }
    }

    /// The shard takes a move message for this entry.
    pub fn clear_moving(&self) -> Snapshot {
        self.header().state.clear_moving()
    }

    /// The current state word.
    pub fn snapshot(&self) -> Snapshot {
        self.header().state.load()
    }

    /// A non-owning pointer to this entry, for finding it in the shard's wheel while
    /// this reference keeps it alive.
    pub(crate) fn as_raw(&self) -> RawEntry {
        RawEntry(self.0)
    }

    /// Pending → Cancelled; the winner drops the callback before returning.
    pub fn try_cancel(&self) -> Cancel {
        let outcome = self.header().state.try_cancel();
        if let Cancel::Won { running: false, .. } = outcome {
            // SAFETY: the entry is live (we own a reference) and we won Pending →
            // Cancelled, so we own the untaken callback (ground rule 2).
            unsafe { (self.header().vtable.drop_callback)(self.0) };
        }
        outcome
    }

    /// Cancels, and if the entry was filed, tells its shard through `port`.
    /// Returns whether this call won.
    pub fn cancel<S: CancelSink>(&self, port: &CancelPort<S>) -> bool {
        match self.try_cancel() {
            Cancel::Won { filed, .. } => {
                if filed {
                    // SAFETY: we won Pending → Cancelled with FILED set, so the shard
                    // behind `port` waits for this message before it exits (ground
                    // rule 4): the sink is live.
                    let sink = unsafe { port.0.as_ref() };
                    sink.send_cancel(RawEntry(self.0));
                }
                true
            }
            Cancel::Lost(_) => false,
        }
    }

    /// The shard marks the entry as filed; see [`File`].
    pub fn mark_filed(&self) -> File {
        self.header().state.mark_filed()
    }

    /// The shard hands the entry back at shutdown; see `StateWord::detach`.
    pub fn detach(&self) -> Snapshot {
        self.header().state.detach()
    }

    /// An `Unfired` dropped without running: Pending → Cancelled, dropping the
    /// callback.
    pub fn cancel_detached(&self) -> bool {
        let outcome = self.header().state.try_cancel_detached();
        if let Cancel::Won { filed, running } = outcome {
            debug_assert!(!filed, "a detached entry is never filed");
            if running {
                // The runner drops the callback when its run ends.
                return true;
            }
            // SAFETY: the entry is live (we own a reference) and we won Pending →
            // Cancelled, so we own the untaken callback (ground rule 2).
            unsafe { (self.header().vtable.drop_callback)(self.0) };
            return true;
        }
        false
    }
}

impl Clone for EntryRef {
    fn clone(&self) -> Self {
        // ORDERING: Relaxed, as `Arc::clone`: a new reference is made from one we
        // hold, so the allocation cannot be freed meanwhile; nothing is published.
        let previous = self.header().refs.fetch_add(1, Ordering::Relaxed);
        if previous > MAX_REFS {
            std::process::abort();
        }
        EntryRef(self.0)
    }
}

impl Drop for EntryRef {
    fn drop(&mut self) {
        // ORDERING: AcqRel. Release: our uses of the entry happen-before the free by
        // whoever drops last. Acquire (for the last owner): every other owner's uses
        // happen-before our free. An AcqRel RMW instead of Release plus an Acquire
        // fence, which loom models poorly.
        if self.header().refs.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        if self.header().state.load().state() == TimerState::Pending {
            // SAFETY: we hold the last reference to a live entry that was neither
            // fired nor cancelled, so nobody else can reach the untaken callback.
            unsafe { (self.header().vtable.drop_callback)(self.0) };
        }
        let dealloc = self.header().vtable.dealloc;
        // SAFETY: last reference; the callback was taken (Fired), dropped by the
        // cancel winner (Cancelled), or dropped just above (Pending).
        unsafe { dealloc(self.0) };
    }
}

impl core::fmt::Debug for EntryRef {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Entry")
            .field("id", &self.id())
            .field("deadline_tick", &self.deadline())
            .field("state", &self.header().state)
            .finish()
    }
}

/// What [`EntryRef::try_fire_due`] decided.
#[derive(Debug)]
pub enum Due {
    /// Fired: the task owns the callback.
    Fired(FiredEntry),
    /// Not (yet) due by its latest deadline, or a reset or move is under way: re-file.
    Later(EntryRef),
    /// A cancel won; its message is on the way (the entry was filed).
    Cancelled(EntryRef),
    /// A repeating timer's run started: the entry left the wheel with `RUNNING` set.
    Run(RunningEntry),
}

/// A repeating timer during one run: holds `RUNNING`, so it alone touches the
/// callback. [`finish`](Self::finish) ends the run.
#[derive(Debug)]
pub struct RunningEntry {
    /// The service reference; `None` once finished.
    entry: Option<EntryRef>,
}

impl RunningEntry {
    /// The entry.
    fn entry(&self) -> &EntryRef {
        self.entry
            .as_ref()
            .expect("running entry invariant: not yet finished")
    }

    /// Runs the callback once, in place. Call [`finish`](Self::finish) either way.
    ///
    /// # Panics
    ///
    /// If the callback panics (the panic propagates). The `expect`s inside cannot fire:
    /// a `RunningEntry` is always an unfinished repeating entry.
    pub fn call(&mut self) {
        let entry = self.entry();
        let call = entry
            .header()
            .vtable
            .call_again
            .expect("a running entry is repeating");
        // SAFETY: the entry is live (we hold a reference) and repeating, and we hold
        // RUNNING, so the callback is ours and initialised.
        unsafe { call(entry.0) };
    }

    /// Counts this run and sets the deadline of the next one (tick `to_tick` of the
    /// next run's instant); returns the next deadline tick and the runs skipped.
    ///
    /// # Panics
    ///
    /// Never: a `RunningEntry` is always an unfinished repeating entry.
    pub fn schedule_next(&mut self, now: Instant, to_tick: impl Fn(Instant) -> u64) -> (u64, u64) {
        let entry = self.entry();
        let next = entry
            .header()
            .vtable
            .next_run
            .expect("a running entry is repeating");
        // SAFETY: as in `call`.
        let (deadline, skipped) = unsafe { next(entry.0, now) };
        let tick = deadline.map_or(u64::MAX, to_tick);
        // ORDERING: Release: published with the entry through the insert ring (and by
        // `finish_run`'s Release) to the shard's loads.
        entry.header().deadline.store(tick, Ordering::Release);
        (tick, skipped)
    }

    /// Ends the run: the entry back if the timer is still pending (the caller files
    /// it again); `None` if it was cancelled meanwhile (the callback is then dropped).
    pub fn finish(mut self) -> Option<EntryRef> {
        self.finish_in_place()
    }

    /// As [`finish`](Self::finish), for `Drop` too.
    fn finish_in_place(&mut self) -> Option<EntryRef> {
        let entry = self.entry.take()?;
        if entry.header().state.finish_run() {
            return Some(entry);
        }
        // SAFETY: live (we hold a reference); a cancel won while we held RUNNING, so it
        // left the callback to us (ground rule 2), untaken.
        unsafe { (entry.header().vtable.drop_callback)(entry.0) };
        None
    }
}

impl Drop for RunningEntry {
    fn drop(&mut self) {
        // Unfinished (the task was dropped unrun): end the run so the callback is
        // dropped exactly once, by the canceller's rule or with the last reference.
        drop(self.finish_in_place());
    }
}

/// A message to a shard about an entry it holds.
#[derive(Debug)]
pub enum Message {
    /// A winning cancel of a filed entry; owns no reference (ground rule 4).
    Cancel(RawEntry),
    /// A reset moved a filed entry earlier; owns one reference.
    Move(EntryRef),
}

/// A pointer to an entry that carries one reference by protocol, not by type: in a
/// ring, in a shard's wheel, or in a cancel message (ground rules 1 and 4). `Copy` so
/// the wheel can move it around; claimed once with [`EntryRef::from_raw`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RawEntry(NonNull<Header>);

// SAFETY: a `RawEntry` is only a token that moves a reference between threads; the
// reference itself is `Send` (see `EntryRef`).
unsafe impl Send for RawEntry {}

/// An entry whose Pending → Fired this thread won: it owns the callback.
pub struct FiredEntry {
    /// The reference the shard held.
    entry: EntryRef,
    /// Whether the callback has been moved out to run.
    taken: bool,
}

impl FiredEntry {
    /// Runs the callback on this thread. A panic propagates; the reference is released
    /// either way.
    pub fn run(mut self) {
        self.taken = true;
        let header = self.entry.0;
        // SAFETY: the entry is live (we hold a reference) and we won Pending → Fired
        // with the callback untaken (`taken` was false until the line above).
        unsafe { (self.entry.header().vtable.run)(header) };
    }
}

impl Drop for FiredEntry {
    fn drop(&mut self) {
        if !self.taken {
            // SAFETY: live (we hold a reference); we won Pending → Fired and never took
            // the callback, so we own it and drop it instead of running it.
            unsafe { (self.entry.header().vtable.drop_callback)(self.entry.0) };
        }
    }
}

impl core::fmt::Debug for FiredEntry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FiredEntry")
            .field("entry", &self.entry)
            .field("taken", &self.taken)
            .finish()
    }
}

/// The shard's side of a cancel or reset: receives the message of a winning canceller
/// whose entry was filed, or of a reset that moved a filed entry earlier.
pub trait CancelSink: Sync {
    /// Delivers a cancel message; must not lose it (ground rule 4).
    fn send_cancel(&self, entry: RawEntry);
    /// Delivers a move message for an entry now due at tick `deadline`; must not lose
    /// it (ground rule 4).
    fn send_move(&self, entry: EntryRef, deadline: u64);
}

/// A handle's pointer to its shard's [`CancelSink`]. It is dereferenced only under
/// ground rule 4, so it needs no reference count of its own.
pub struct CancelPort<S>(NonNull<S>);

impl<S> CancelPort<S> {
    /// A port to `sink`. The sink must stay at this address until it has received every
    /// message of the entries it filed (the shard guarantees this before exiting).
    pub fn new(sink: &S) -> Self {
        CancelPort(NonNull::from(sink))
    }
}

impl<S> Clone for CancelPort<S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for CancelPort<S> {}

// SAFETY: the port is dereferenced only as `&S` where `S: CancelSink: Sync`.
unsafe impl<S: Sync> Send for CancelPort<S> {}
// SAFETY: as for `Send`.
unsafe impl<S: Sync> Sync for CancelPort<S> {}

impl<S> core::fmt::Debug for CancelPort<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("CancelPort")
    }
}

/// The store of a shard's wheel. Called once per shard thread, which then upholds
/// [`ShardStore::new`]'s obligations: it passes the store only `RawEntry`s made by
/// [`ShardStore::release`] or popped from its cancel ring, and claims each once.
pub fn shard_store() -> ShardStore {
    // SAFETY: the shard loop (`shard.rs`) is the only caller; it keeps the store on
    // its own thread and claims each reference once (see its ground rules).
    unsafe { ShardStore::new() }
}

/// The wheel's view of entries in a shard: deadlines and places read through the
/// entry pointers themselves.
#[derive(Debug)]
pub struct ShardStore(());

impl ShardStore {
    /// A store for one shard's wheel.
    ///
    /// # Safety
    ///
    /// - Every [`RawEntry`] passed to the store's methods carries an unclaimed
    ///   reference (ground rule 1), and each is passed to [`claim`](Self::claim) at
    ///   most once, after which it is not passed to the store again; and
    /// - the store is used only by the shard thread that holds those references
    ///   (ground rule 3).
    pub unsafe fn new() -> Self {
        ShardStore(())
    }

    /// The header of an entry the store may touch.
    fn header(entry: RawEntry) -> &'static Header {
        // SAFETY: `ShardStore::new`'s first point: `entry` carries a reference, so it
        // is live while the wheel holds it; the `'static` never escapes a method here.
        unsafe { entry.0.as_ref() }
    }

    /// Marks an entry held outside the wheel until a message arrives (ground rule 4).
    pub(crate) fn set_aside(&mut self, entry: RawEntry, why: Aside) {
        let position = match why {
            Aside::Cancel => 0,
            Aside::Move => 1,
            Aside::DetachedMove => 2,
        };
        self.set_place(
            entry,
            Place {
                list: ASIDE_LIST,
                position,
            },
        );
    }

    /// Why the entry is held outside the wheel, or `None` if it is in the wheel.
    pub(crate) fn aside(&self, entry: RawEntry) -> Option<Aside> {
        let place = self.place(entry);
        if place.list != ASIDE_LIST {
            return None;
        }
        Some(match place.position {
            0 => Aside::Cancel,
            1 => Aside::Move,
            _ => Aside::DetachedMove,
        })
    }

    /// Marks an entry that left the wheel while cancelled (the loom models' view of
    /// [`Aside::Cancel`]).
    #[cfg(loom)]
    pub fn set_awaiting_cancel(&mut self, entry: RawEntry) {
        self.set_aside(entry, Aside::Cancel);
    }

    /// Whether the entry is out of the wheel awaiting a message (the loom models).
    #[cfg(loom)]
    pub fn is_awaiting_cancel(&self, entry: RawEntry) -> bool {
        self.aside(entry).is_some()
    }

    /// Gives the shard's reference to the wheel as a [`RawEntry`].
    pub fn release(&mut self, entry: EntryRef) -> RawEntry {
        entry.into_raw()
    }

    /// Claims the reference a [`RawEntry`] from this shard's wheel or cancel ring
    /// carries. Each reference is claimed once: a `RawEntry` handed back by the wheel,
    /// or popped from the cancel ring, is claimed exactly once by the shard loop.
    pub fn claim(&mut self, entry: RawEntry) -> EntryRef {
        // SAFETY: `ShardStore::new`'s first point: `entry` carries an unclaimed
        // reference, made by `release` (or, for a cancel message, the wheel's
        // reference, ground rule 4); the shard loop claims it once.
        unsafe { EntryRef::from_raw(entry) }
    }
}

impl Store for ShardStore {
    type Ref = RawEntry;

    fn deadline(&self, entry: RawEntry) -> u64 {
        // ORDERING: Relaxed: for filing only. A stale later value is corrected by the
        // move message of the reset that moved it earlier; a stale earlier one makes
        // the entry come due early, where `try_fire_due` re-checks with Acquire and
        // re-files it.
        Self::header(entry).deadline.load(Ordering::Relaxed)
    }

    fn place(&self, entry: RawEntry) -> Place {
        // SAFETY: only the shard thread touches `place` (`ShardStore::new`'s second
        // point), so this read races with no write.
        Self::header(entry).place.with(|place| unsafe { *place })
    }

    fn set_place(&mut self, entry: RawEntry, place: Place) {
        // SAFETY: only the shard thread touches `place`, so this write is exclusive.
        Self::header(entry)
            .place
            .with_mut(|cell| unsafe { *cell = place });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{Cancel, CancelPort, CancelSink, EntryRef, RawEntry};
    use crate::handle::{TimerId, TimerState};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// Counts drops of the callback's captures and runs of the callback.
    fn counted() -> (
        impl FnOnce() + Send + 'static,
        Arc<AtomicUsize>,
        Arc<AtomicUsize>,
    ) {
        let ran = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        struct OnDrop(Arc<AtomicUsize>);
        impl Drop for OnDrop {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let guard = OnDrop(dropped.clone());
        let ran2 = ran.clone();
        let callback = move || {
            let _guard = &guard;
            ran2.fetch_add(1, Ordering::SeqCst);
        };
        (callback, ran, dropped)
    }

    #[derive(Default)]
    struct Sink(Mutex<Vec<RawEntry>>);
    impl CancelSink for Sink {
        fn send_cancel(&self, entry: RawEntry) {
            self.0.lock().unwrap().push(entry);
        }
        fn send_move(&self, entry: EntryRef, _deadline: u64) {
            self.0.lock().unwrap().push(entry.as_raw());
        }
    }

    #[test]
    fn fired_runs_once_and_frees() {
        let (callback, ran, dropped) = counted();
        let (handle, service) = EntryRef::new(TimerId::from_raw(1), 5, callback);
        let fired = service.try_fire().expect("pending entry fires");
        fired.run();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        assert_eq!(handle.state(), TimerState::Fired);
        assert_eq!(handle.try_cancel(), Cancel::Lost(TimerState::Fired));
    }

    #[test]
    fn cancel_drops_callback_at_once_and_sends_message_only_when_filed() {
        let sink = Sink::default();
        let port = CancelPort::new(&sink);
        let (callback, ran, dropped) = counted();
        let (handle, service) = EntryRef::new(TimerId::from_raw(2), 5, callback);
        assert!(handle.cancel(&port));
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "dropped by the canceller"
        );
        assert!(sink.0.lock().unwrap().is_empty(), "unfiled: no message");
        assert!(!handle.cancel(&port));
        assert!(service.try_fire().is_err());
        assert_eq!(ran.load(Ordering::SeqCst), 0);

        let (callback, _, _) = counted();
        let (handle, service) = EntryRef::new(TimerId::from_raw(3), 5, callback);
        assert_eq!(service.mark_filed(), super::File::Filed);
        let raw = service.into_raw();
        assert!(handle.cancel(&port));
        let message = sink.0.lock().unwrap().pop().expect("filed: one message");
        assert_eq!(message, raw);
        // SAFETY: the message names the service reference given up above, unclaimed.
        drop(unsafe { EntryRef::from_raw(message) });
    }

    #[test]
    fn last_reference_of_a_pending_entry_drops_the_callback() {
        let (callback, ran, dropped) = counted();
        let (handle, service) = EntryRef::new(TimerId::from_raw(4), 5, callback);
        drop(service);
        assert_eq!(dropped.load(Ordering::SeqCst), 0);
        drop(handle);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn fired_but_never_run_drops_the_callback() {
        let (callback, ran, dropped) = counted();
        let (_handle, service) = EntryRef::new(TimerId::from_raw(5), 5, callback);
        drop(service.try_fire().unwrap());
        assert_eq!(
            (ran.load(Ordering::SeqCst), dropped.load(Ordering::SeqCst)),
            (0, 1)
        );
    }

    #[test]
    fn panicking_callback_still_releases() {
        let (handle, service) = EntryRef::new(TimerId::from_raw(6), 5, || panic!("boom"));
        let fired = service.try_fire().unwrap();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fired.run()));
        assert!(result.is_err());
        assert_eq!(handle.state(), TimerState::Fired);
    }

    #[test]
    #[cfg(not(loom))]
    fn header_is_40_bytes() {
        assert_eq!(core::mem::size_of::<super::Header>(), 40);
    }
}
