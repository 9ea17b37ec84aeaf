//! The timer entry: one allocation per timer (a block of its creating thread's entry
//! pool, [`pool`]; `Box` above 256 bytes) holding its state word (with the
//! reference count), id, deadline (in nanoseconds from the service clock's tick 0, so
//! that a handle needs nothing of its service to read it), its place in the shard's wheel, and the
//! callback itself: a 32-byte [`Header`], then the callback.
//!
//! The allocation is an `Entry<F>` whose first field is a type-erased [`Header`]; the
//! rest of the crate sees only `NonNull<Header>` (as [`EntryRef`], which owns one
//! reference, or the wheel's non-owning [`EntryPtr`]) and reaches the callback through
//! the header's vtable. The shard's timing wheel files these pointers directly
//! ([`ShardStore`]), so a pending timer costs this allocation plus one pointer in a
//! slot vector, and no separate wheel node.
//!
//! One concept per file: `state.rs` the atomic state word, `repeat.rs` a repeating
//! timer's schedule and run, `sleep.rs` a `Sleep`'s entry (its outcome and waker in
//! place of a callback), `message.rs` what handles send their shard, `store.rs`
//! the shard wheel's view of entries, `winner.rs` what the winner of a transition owns.
//!
//! # Ground rules
//!
//! 1. **References.** The state word's count counts owners: each `TimerHandle`; one *service
//!    reference* created by `schedule`, held in turn by the shard's insert ring, the
//!    shard's wheel, and finally an executor task ([`FiredEntry`]) or an `Unfired`; and
//!    one per message in a shard's message ring (the sender clones its own). The last
//!    owner frees the allocation.
//! 2. **Callback.** The callback cell is read only by the winner of Pending → Fired
//!    (or of a repeating timer's run), which runs it, and by the winner of Pending →
//!    Cancelled, which drops it — **last**: after its cancel message is published and
//!    the service's room is freed ([`CancelledCallback`]), so a callback whose drop
//!    panics, shuts the service down or drops its last clone finds the service's
//!    bookkeeping already done. A repeating timer's runner holds it while `RUNNING` is
//!    set; a cancel that wins then leaves the drop to the runner. If the last reference
//!    goes while still Pending, nobody else can reach the cell and the destructor drops
//!    the callback.
//! 3. **Place.** `position` and `list` are read and written only by the shard thread, through
//!    [`ShardStore`].
//! 4. **Messages and the shard's lifetime.** An entry that is Cancelled with `FILED`
//!    set at the winning CAS has exactly one cancel message; one with `MOVING` set has
//!    exactly one move message. The shard learns of both through its own RMWs on the
//!    state word (`mark_filed`, `clear_moving`, `detach`), so at shutdown it knows every
//!    message still to come and drains its message ring until all have arrived before
//!    it exits. A sender's last access to the shard is the publication of its message
//!    (`ShardShared::push_and_wake` wakes the shard only *after* publishing, through
//!    a thread handle it took before), so once the
//!    shard has popped every message it waits for, no sender touches it again: the
//!    [`CancelPort`] a handle keeps needs no reference count.

use core::mem::MaybeUninit;
use core::ptr::NonNull;

use crate::clock::Nanos;
use crate::id::{TimerId, TimerState};
use crate::sync::{Arc, AtomicU64, Ordering, UnsafeCell};

mod message;
mod options;
pub(crate) mod pool;
mod repeat;
mod sleep;
mod state;
mod store;
mod winner;

pub use message::{CancelPort, CancelSink, Message};
pub use options::HandleOptions;
use options::KeptOptions;
pub use repeat::RunningEntry;
#[cfg(loom)]
pub use sleep::DISARMED;
pub(crate) use sleep::WAITING;
pub use sleep::{SleepShared, ABANDONED, ELAPSED};
use state::StateWord;
pub use state::{Cancel, File, Snapshot};
pub(crate) use state::{Finish, Fire};
pub(crate) use store::{Aside, EntryPtr, ShardStore};
pub use winner::{CancelledCallback, FiredEntry};

/// The type-erased part of every entry; always the first field of an `Entry<F>`.
/// 32 bytes: the reference count shares the state word, the id is 48 bits, and the
/// id's high half shares a word with the wheel place's list number.
#[repr(C)]
pub(crate) struct Header {
    /// Functions that know the callback's type.
    vtable: &'static Vtable,
    /// The deadline, in nanoseconds from tick 0 of the service's clock (a [`Nanos`]
    /// kept as its bits, ordered as time, negative before tick 0; `Nanos::FAR_FUTURE`:
    /// the far future): the latest one asked for; the shard files it by the tick it is
    /// due at
    /// (`ShardStore`). Written
    /// by `schedule` (before publishing) and by a reset while it holds `RESETTING`
    /// (Release; its `finish_reset` CAS publishes it) and by a repeating timer's runner
    /// while it holds `RUNNING`; read by the shard (Relaxed for filing, where a stale
    /// value is corrected later; Relaxed after its Acquire claim when deciding to fire)
    /// and by handles.
    deadline: AtomicU64,
    /// Pending / Fired / Cancelled, the flags, and the owners of this allocation
    /// (ground rule 1); see `state.rs`.
    state: StateWord,
    /// The low 32 bits of the timer's id.
    id_low: u32,
    /// Where the entry sits in its list of the shard's wheel: the position. Shard
    /// thread only (ground rule 3).
    position: UnsafeCell<u32>,
    /// Which list of the shard's wheel holds the entry. Shard thread only (ground
    /// rule 3).
    list: UnsafeCell<u16>,
    /// The high 16 bits of the timer's (48-bit) id.
    id_high: u16,
    /// Under loom, reports the entry as leaked if it is never freed.
    #[cfg(loom)]
    track: loom::alloc::Track<()>,
}

impl Header {
    /// The header of a new entry with two references (the handle's, the service's).
    fn new(id: TimerId, deadline: Nanos, vtable: &'static Vtable) -> Header {
        let (id_low, id_high) = id.to_parts();
        Header {
            vtable,
            deadline: AtomicU64::new(deadline.to_bits()),
            state: StateWord::new(2),
            id_low,
            position: UnsafeCell::new(0),
            list: UnsafeCell::new(0),
            id_high,
            #[cfg(loom)]
            track: loom::alloc::Track::new(()),
        }
    }
}

/// Functions over the concrete `Entry<F>` (or `SleepEntry`) behind a `Header`.
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
    next_run: Option<repeat::NextRunFn>,
    /// Whether shutdown hands the timer back as an `Unfired` (user callbacks), or
    /// cancels it, dropping the callback (a `Sleep`'s, which then completes).
    hands_back: bool,
    /// Whether the timer holds room under `max_pending` (freed when it fires or is
    /// cancelled): every timer of `schedule*` and the `try_*` futures; not the timer of
    /// an infallible future (`sleep`, `timeout`, `interval`: guarantee 9; docs/architecture.md).
    holds_room: bool,
    /// Whether the allocation is a `SleepEntry` (`sleep.rs`), not an `Entry<F, O>`.
    sleep: bool,
    /// Whether the allocation is an `Entry<F, Arc<HandleOptions>>`: its handles honour
    /// the service options it keeps after the header ([`EntryRef::options`]).
    options: bool,
}

/// The allocation: header first, so a pointer to it is a pointer to the header; then
/// the options the handles honour (`O`: [`KeptOptions`]), then the callback.
#[repr(C)]
struct Entry<F, O = ()> {
    /// The type-erased part.
    header: Header,
    /// What the handles honour of the service; dropped with the allocation.
    options: O,
    /// The callback; initialised until run or dropped (ground rule 2).
    callback: UnsafeCell<MaybeUninit<F>>,
}

impl<F: FnOnce() + Send + 'static, O: KeptOptions> Entry<F, O> {
    /// The vtable for callbacks of type `F`.
    const VTABLE: Vtable = Vtable {
        run: Self::run,
        drop_callback: Entry::<F, O>::drop_callback_any,
        dealloc: Entry::<F, O>::dealloc_any,
        call_again: None,
        next_run: None,
        hands_back: true,
        holds_room: true,
        sleep: false,
        options: O::PRESENT,
    };

    /// # Safety
    ///
    /// - `header` points to a live `Entry<F, O>` (not just a `Header`).
    /// - The caller won Pending → Fired and the callback has not been taken.
    unsafe fn run(header: NonNull<Header>) {
        // SAFETY: `header` points to a live `Entry<F, O>` (the caller's first point).
        let entry = unsafe { header.cast::<Entry<F, O>>().as_ref() };
        // SAFETY: we are the only reader of the cell (the caller's second point,
        // ground rule 2), and it is initialised; reading moves the callback out.
        let callback = entry
            .callback
            .with(|cell| unsafe { cell.cast::<F>().read() });
        callback();
    }
}

impl<C, O> Entry<C, O> {
    /// Drops the callback in place.
    ///
    /// # Safety
    ///
    /// - `header` points to a live `Entry<C, O>`.
    /// - The caller won Pending → Cancelled (or holds the last reference of a Pending
    ///   entry, or ended a run that a cancel won) and the callback has not been taken.
    unsafe fn drop_callback_any(header: NonNull<Header>) {
        // SAFETY: live (the caller's first point).
        let entry = unsafe { header.cast::<Entry<C, O>>().as_ref() };
        // SAFETY: exclusive and initialised (the caller's second point); dropped once.
        entry
            .callback
            .with_mut(|cell| unsafe { cell.cast::<C>().drop_in_place() });
    }

    /// Frees the allocation, dropping the kept options.
    ///
    /// # Safety
    ///
    /// - `header` came from `pool::boxed` in `EntryRef::allocate`.
    /// - No other reference remains, and the callback has been run or dropped
    ///   (`MaybeUninit` does not drop it again).
    unsafe fn dealloc_any(header: NonNull<Header>) {
        // SAFETY: the caller's points: from `pool::boxed::<Entry<C, O>>`, unaliased,
        // callback already gone.
        unsafe { pool::unbox(header.cast::<Entry<C, O>>()) };
    }
}

/// One counted reference to an entry (ground rule 1).
pub struct EntryRef(NonNull<Header>);

// SAFETY: the header's shared fields are atomics or immutable; the callback cell and
// `place` are reached only under ground rules 2 and 3, which hand them to exactly one
// thread at a time; the callback is `Send` (required by every constructor).
unsafe impl Send for EntryRef {}
// SAFETY: as for `Send`: `&EntryRef` only exposes the atomic state and immutable fields.
unsafe impl Sync for EntryRef {}

impl EntryRef {
    /// Allocates an entry with two references: one for the handle, one for the service.
    /// It keeps no options (a service with the default ones). For the unit tests and
    /// the loom models; the service uses [`with_options`](Self::with_options).
    #[cfg(any(test, loom))]
    pub fn new<F: FnOnce() + Send + 'static>(
        id: TimerId,
        deadline: Nanos,
        callback: F,
    ) -> (EntryRef, EntryRef) {
        Self::allocate(id, deadline, &Entry::<F>::VTABLE, (), callback)
    }

    /// As [`new`](Self::new), keeping `options` (the service's, if it has any) for
    /// the entry's handles.
    pub fn with_options<F: FnOnce() + Send + 'static>(
        id: TimerId,
        deadline: Nanos,
        options: Option<Arc<HandleOptions>>,
        callback: F,
    ) -> (EntryRef, EntryRef) {
        Self::allocate_keeping(
            id,
            deadline,
            options,
            callback,
            [&Entry::<F>::VTABLE, &Entry::<F, Arc<HandleOptions>>::VTABLE],
        )
    }

    /// One allocation holding `callback`, keeping `options` for the entry's handles:
    /// `vtables` are `Entry<C>`'s (no options) and `Entry<C, Arc<HandleOptions>>`'s.
    fn allocate_keeping<C>(
        id: TimerId,
        deadline: Nanos,
        options: Option<Arc<HandleOptions>>,
        callback: C,
        [without, with]: [&'static Vtable; 2],
    ) -> (EntryRef, EntryRef) {
        match options {
            None => Self::allocate(id, deadline, without, (), callback),
            Some(options) => Self::allocate(id, deadline, with, options, callback),
        }
    }

    /// One allocation holding the header, `options` and `callback`, with two
    /// references. `vtable` must be `Entry<C, O>`'s.
    fn allocate<C, O: KeptOptions>(
        id: TimerId,
        deadline: Nanos,
        vtable: &'static Vtable,
        options: O,
        callback: C,
    ) -> (EntryRef, EntryRef) {
        debug_assert_eq!(vtable.options, O::PRESENT);
        let header = pool::boxed(Entry {
            header: Header::new(id, deadline, vtable),
            options,
            callback: UnsafeCell::new(MaybeUninit::new(callback)),
        })
        .cast::<Header>();
        (EntryRef(header), EntryRef(header))
    }

    /// The service options this entry keeps for its handles (`None` on a service
    /// with the default options, and for a `Sleep`'s timer, whose future reaches them
    /// through its home).
    pub(crate) fn options(&self) -> Option<&HandleOptions> {
        if !self.header().vtable.options {
            return None;
        }
        let entry = self.0.cast::<Entry<(), Arc<HandleOptions>>>().as_ptr();
        // SAFETY: a place projection, reading nothing: the allocation is live (we own
        // a reference, ground rule 1), and the vtable says it is an
        // `Entry<C, Arc<HandleOptions>>` for some `C`, whose `options` field sits at the
        // same offset as in `Entry<(), _>` (`repr(C)`: header, then options, then the
        // callback).
        let options = unsafe { core::ptr::addr_of!((*entry).options) };
        // SAFETY: that field is written once, before the entry is shared, and dropped
        // only with the allocation, which outlives `&self`: a shared borrow is sound.
        Some(unsafe { &*options })
    }

    /// Whether this is a repeating timer.
    pub(crate) fn is_repeating(&self) -> bool {
        self.header().vtable.call_again.is_some()
    }

    /// Whether shutdown hands this timer back as an `Unfired` (`false` for a sleep's).
    pub(crate) fn hands_back(&self) -> bool {
        self.header().vtable.hands_back
    }

    /// Whether this timer holds room under `max_pending`, to be freed when it fires or
    /// is cancelled (`false` for an infallible future's timer).
    pub fn holds_room(&self) -> bool {
        self.header().vtable.holds_room
    }

    /// The header.
    fn header(&self) -> &Header {
        // SAFETY: we own a reference, so the allocation is live (ground rule 1).
        unsafe { self.0.as_ref() }
    }

    /// The timer's id.
    pub fn id(&self) -> TimerId {
        let header = self.header();
        TimerId::from_parts(header.id_low, header.id_high)
    }

    /// The deadline in nanoseconds from the service clock's tick 0 (the latest
    /// reset's, if any).
    pub fn deadline(&self) -> Nanos {
        // ORDERING: Acquire pairs with the Release store in `reset`, for a handle that
        // reads back a deadline another thread set.
        Nanos::from_bits(self.header().deadline.load(Ordering::Acquire))
    }

    /// The current state.
    pub fn state(&self) -> TimerState {
        self.header().state.load().state()
    }

    /// A non-owning pointer to this entry, for the shard's wheel.
    pub(crate) fn as_ptr(&self) -> EntryPtr {
        EntryPtr(self.0)
    }

    /// Pending → Fired for `Unfired::run`; on success the task owns the callback.
    ///
    /// # Errors
    ///
    /// The reference comes back if a cancel won first.
    pub fn try_fire(self) -> Result<FiredEntry, EntryRef> {
        match self.header().state.try_fire() {
            Fire::Won => Ok(FiredEntry::new(self)),
            Fire::Lost | Fire::Moved => Err(self),
        }
    }

    /// The shard's expiry: fires the entry if it is pending, due by its latest
    /// deadline (at most `due_by` nanoseconds: `Ticks::due_by` of the shard's tick),
    /// and no reset or move is under way (see `state.rs`, "Why a claim bit").
    pub fn try_fire_due(self, due_by: Nanos) -> Due {
        let due_by = due_by.to_bits();
        let header = self.header();
        if header.state.load().state() != TimerState::Pending {
            return Due::Cancelled(self);
        }
        // ORDERING: Relaxed: a cheap pre-check. Deferring is always safe (the entry is
        // re-filed); the decision to fire re-reads the deadline under the claim.
        if header.deadline.load(Ordering::Relaxed) > due_by {
            return Due::Later(self);
        }
        match header.state.try_claim() {
            Fire::Won => {}
            Fire::Lost => return Due::Cancelled(self),
            Fire::Moved => return Due::Later(self),
        }
        // ORDERING: Relaxed: `try_claim`'s Acquire CAS read the last `finish_reset`'s
        // Release (or later), which the reset's deadline store precedes, and no reset
        // can store while we hold CLAIMING; so this reads the latest deadline.
        if header.deadline.load(Ordering::Relaxed) > due_by {
            header.state.release_claim();
            return Due::Later(self);
        }
        if self.is_repeating() {
            return match header.state.start_run_claimed() {
                Fire::Won => Due::Run(RunningEntry::new(self)),
                Fire::Lost | Fire::Moved => Due::Cancelled(self),
            };
        }
        match header.state.fire_claimed() {
            Fire::Won => Due::Fired(FiredEntry::new(self)),
            Fire::Lost | Fire::Moved => Due::Cancelled(self),
        }
    }

    /// Moves the deadline to `deadline` (nanoseconds from tick 0); `true` iff the timer
    /// was still pending
    /// (then it fires no earlier than `deadline`). A later deadline is one store: the
    /// shard re-files the entry when its old slot comes due. An earlier one also sends
    /// the shard one move message through `port` (ground rule 4), which wakes it, filed
    /// or not yet filed; one already outstanding carries this reset too, since the
    /// shard reads the latest deadline when it arrives.
    pub fn reset<S: CancelSink>(&self, deadline: Nanos, port: &CancelPort<S>) -> bool {
        let deadline = deadline.to_bits();
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
        // deadline to the shard's Acquire RMWs.
        header.deadline.store(deadline, Ordering::Release);
        match header.state.finish_reset(deadline < old) {
            Finish::Pending { send_move } => {
                if send_move {
                    // SAFETY: `finish_reset` set MOVING on this pending, undetached
                    // entry for this very message (`send_move` is true only then).
                    unsafe { port.send_move(self) };
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

    /// The shard takes a move message for this entry: clears `MOVING`, returns the
    /// word before.
    pub fn clear_moving(&self) -> Snapshot {
        self.header().state.clear_moving()
    }

    /// The current state word.
    pub fn snapshot(&self) -> Snapshot {
        self.header().state.load()
    }

    /// A handle's cancel: Pending → Cancelled, and if the entry was filed, one cancel
    /// message to its shard through `port`. `Some` iff this call won; the caller frees
    /// whatever room the service keeps for the timer, then drops the returned value,
    /// which drops the callback last (ground rule 2).
    pub fn cancel<S: CancelSink>(&self, port: &CancelPort<S>) -> Option<CancelledCallback<'_>> {
        match self.header().state.try_cancel() {
            Cancel::Won {
                filed,
                running,
                queued,
            } => {
                if filed {
                    // SAFETY: we won Pending → Cancelled with FILED set; this is the
                    // one cancel message the shard waits for.
                    unsafe { port.send_cancel(self) };
                }
                Some(CancelledCallback::new(self, !running, queued))
            }
            Cancel::Lost(_) => None,
        }
    }

    /// An `Unfired` dropped without running: Pending → Cancelled. `Some` iff it won;
    /// dropping the value drops the callback (unless a run holds it).
    pub fn cancel_detached(&self) -> Option<CancelledCallback<'_>> {
        match self.header().state.try_cancel_detached() {
            Cancel::Won {
                filed,
                running,
                queued,
            } => {
                debug_assert!(!filed, "a detached entry is never filed");
                Some(CancelledCallback::new(self, !running, queued))
            }
            Cancel::Lost(_) => None,
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

    /// Drops the callback in place.
    ///
    /// # Safety
    ///
    /// The caller owns the untaken callback (ground rule 2): it won Pending →
    /// Cancelled with no run under way, or Pending → Fired without taking it, or ended a
    /// run that a cancel won; and it drops it once.
    unsafe fn drop_callback(&self) {
        // SAFETY: the entry is live (we hold a reference); the callback is ours and
        // untaken (the caller's obligation).
        unsafe { (self.header().vtable.drop_callback)(self.0) };
    }
}

impl Clone for EntryRef {
    fn clone(&self) -> Self {
        self.header().state.add_ref();
        EntryRef(self.0)
    }
}

impl Drop for EntryRef {
    fn drop(&mut self) {
        let Some(last) = self.header().state.drop_ref() else {
            return;
        };
        let dealloc = self.header().vtable.dealloc;
        if last.state() == TimerState::Pending {
            // Free the allocation even if the callback's destructor panics.
            struct Free(NonNull<Header>, unsafe fn(NonNull<Header>));
            impl Drop for Free {
                fn drop(&mut self) {
                    // SAFETY: last reference; the callback was dropped (or its drop
                    // unwound, which ends its use too) just before this guard drops.
                    unsafe { (self.1)(self.0) };
                }
            }
            let _free = Free(self.0, dealloc);
            // SAFETY: we hold the last reference to a live entry that was neither
            // fired nor cancelled, so nobody else can reach the untaken callback.
            unsafe { self.drop_callback() };
            return;
        }
        // SAFETY: last reference; the callback was taken (Fired) or dropped by the
        // cancel winner (Cancelled).
        unsafe { dealloc(self.0) };
    }
}

impl core::fmt::Debug for EntryRef {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Entry")
            .field("id", &self.id())
            .field("deadline_ns", &self.deadline())
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{CancelPort, CancelSink, EntryRef};
    use crate::clock::Nanos;
    use crate::id::{TimerId, TimerState};
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

    /// A sink that records the messages (it lives as long as the test).
    #[derive(Default)]
    struct Sink(Mutex<Vec<EntryRef>>);
    impl CancelSink for Sink {
        fn send_cancel(&self, entry: &EntryRef) {
            self.0.lock().unwrap().push(entry.clone());
        }
        fn send_move(&self, entry: &EntryRef) {
            self.0.lock().unwrap().push(entry.clone());
        }
    }

    #[test]
    fn fired_runs_once_and_frees() {
        let (callback, ran, dropped) = counted();
        let (handle, service) = EntryRef::new(TimerId::from_raw(1), Nanos::new(5), callback);
        let fired = service.try_fire().expect("pending entry fires");
        fired.run();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        assert_eq!(handle.state(), TimerState::Fired);
        let sink = Sink::default();
        // SAFETY: the sink outlives every use of the port in this test.
        let port = unsafe { CancelPort::new(&sink) };
        assert!(handle.cancel(&port).is_none());
    }

    #[test]
    fn cancel_drops_the_callback_last_and_sends_a_message_only_when_filed() {
        let sink = Sink::default();
        // SAFETY: the sink outlives every use of the port in this test.
        let port = unsafe { CancelPort::new(&sink) };
        let (callback, ran, dropped) = counted();
        let (handle, service) = EntryRef::new(TimerId::from_raw(2), Nanos::new(5), callback);
        let won = handle.cancel(&port).expect("pending: this cancel wins");
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            0,
            "not before the winner lets go"
        );
        drop(won);
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "dropped by the canceller"
        );
        assert!(sink.0.lock().unwrap().is_empty(), "unfiled: no message");
        assert!(handle.cancel(&port).is_none());
        assert!(service.try_fire().is_err());
        assert_eq!(ran.load(Ordering::SeqCst), 0);

        let (callback, _, _) = counted();
        let (handle, service) = EntryRef::new(TimerId::from_raw(3), Nanos::new(5), callback);
        assert_eq!(service.mark_filed(), super::File::Filed);
        drop(handle.cancel(&port).expect("wins"));
        let message = sink.0.lock().unwrap().pop().expect("filed: one message");
        assert_eq!(message.as_ptr(), service.as_ptr(), "it names the entry");
    }

    #[test]
    fn last_reference_of_a_pending_entry_drops_the_callback() {
        let (callback, ran, dropped) = counted();
        let (handle, service) = EntryRef::new(TimerId::from_raw(4), Nanos::new(5), callback);
        drop(service);
        assert_eq!(dropped.load(Ordering::SeqCst), 0);
        drop(handle);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn fired_but_never_run_drops_the_callback() {
        let (callback, ran, dropped) = counted();
        let (_handle, service) = EntryRef::new(TimerId::from_raw(5), Nanos::new(5), callback);
        drop(service.try_fire().unwrap());
        assert_eq!(
            (ran.load(Ordering::SeqCst), dropped.load(Ordering::SeqCst)),
            (0, 1)
        );
    }

    #[test]
    fn panicking_callback_still_releases() {
        let (handle, service) =
            EntryRef::new(TimerId::from_raw(6), Nanos::new(5), || panic!("boom"));
        let fired = service.try_fire().unwrap();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fired.run()));
        assert!(result.is_err());
        assert_eq!(handle.state(), TimerState::Fired);
    }

    #[test]
    fn a_reset_while_claimed_waits_and_the_claim_fires_on_the_latest_deadline() {
        let (handle, service) = EntryRef::new(TimerId::from_raw(7), Nanos::new(5), || {});
        assert_eq!(service.mark_filed(), super::File::Filed);
        let sink = Sink::default();
        // SAFETY: the sink outlives every use of the port in this test.
        let port = unsafe { CancelPort::new(&sink) };
        assert!(handle.reset(Nanos::new(20), &port), "later: one store");
        match service.try_fire_due(Nanos::new(10)) {
            super::Due::Later(entry) => drop(entry),
            other => panic!("not due at 10 after a reset to 20: {other:?}"),
        }
    }

    #[test]
    fn kept_options_are_read_through_any_reference_and_freed_with_the_entry() {
        let limit = Arc::new(crate::limit::PendingLimit::new(3));
        let options = super::HandleOptions::of(Some(limit.clone()), None);
        let (handle, service) =
            EntryRef::with_options(TimerId::from_raw(8), Nanos::new(5), options.clone(), || {});
        let kept = handle
            .options()
            .expect("a service with a bound keeps its options");
        assert!(core::ptr::eq(kept, &**options.as_ref().unwrap()));
        assert_eq!(
            service
                .options()
                .and_then(|o| o.limit.as_ref())
                .map(|l| l.limit()),
            Some(3)
        );
        assert_eq!(Arc::strong_count(options.as_ref().unwrap()), 2);
        drop(options);
        drop(service);
        assert_eq!(
            Arc::strong_count(&limit),
            2,
            "the handle keeps the entry, which keeps them"
        );
        drop(handle);
        assert_eq!(Arc::strong_count(&limit), 1, "freed with the entry");

        let (plain, service) = EntryRef::new(TimerId::from_raw(9), Nanos::new(5), || {});
        assert!(plain.options().is_none() && service.options().is_none());
    }

    #[test]
    #[cfg(not(loom))]
    fn an_entry_keeps_options_only_on_a_configured_service() {
        // The 16-byte capture of the memory figure: 48 bytes, or 56 with options.
        type Capture = [u64; 2];
        assert_eq!(core::mem::size_of::<super::Entry<Capture>>(), 48);
        assert_eq!(
            core::mem::size_of::<super::Entry<Capture, Arc<super::HandleOptions>>>(),
            56
        );
    }

    #[test]
    #[cfg(not(loom))]
    fn header_is_32_bytes() {
        assert_eq!(core::mem::size_of::<super::Header>(), 32);
    }
}
