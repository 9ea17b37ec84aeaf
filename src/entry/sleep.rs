//! A `Sleep`'s entry: the header, then the outcome and waker the sleep's future reads
//! through its handle ([`SleepShared`]), and no callback cell. Firing the timer finishes
//! the sleep as elapsed; the drop of its "callback" (a cancel that wins, shutdown,
//! or the last reference going while pending) finishes it as abandoned, which a
//! future that disarmed it first (dropped, re-armed) turns into nothing.
//!
//! Before, a sleep's timer was an ordinary entry whose callback held an `Arc` of the
//! shared state: two allocations and an `Arc` clone per armed sleep. Here it is one.
//!
//! # Ground rules (the entry's, as they apply here)
//!
//! `SleepShared` is read through any reference (it is `Sync`: an atomic word, and a
//! waker cell that the word hands from side to side; see its docs) and
//! dropped only with the allocation, by the last reference: the future's handle keeps
//! it readable for as long as the future holds the handle. The vtable's `run` and
//! `drop_callback` take nothing out of the entry; each calls [`SleepShared::finish`],
//! whose first caller wins, so the entry's rule that exactly one of them runs (the
//! winner of Pending → Fired or → Cancelled) is all that decides the outcome.
//!
//! **No waker outlives its future in the entry.** A waker is user code (a hand-written
//! executor's may own its task, and dropping it drops the task's other sleeps, whose
//! cancels fill the shard's message ring; or it may panic). The entry's last reference
//! often goes on the shard thread, inside its turn (the cancel message the shard takes),
//! so the waker must be gone by then: `finish` takes it to wake it, and the future,
//! when it gives its timer up (dropped, re-armed), takes it out with
//! [`SleepShared::give_up`] and drops it on its own thread. `dealloc` then finds
//! none (`loom-tests/tests/sleep_waker.rs`, model 4).

use core::ptr::NonNull;

use super::{EntryRef, Header, Nanos, TimerId, Vtable};
use crate::sync::{AtomicU8, Ordering, UnsafeCell};
use std::fmt;
use std::task::{Context, Poll, Waker};

/// The sleep's timer has not finished it.
pub(crate) const WAITING: u8 = 0;
/// The sleep's timer fired: the deadline has passed.
pub const ELAPSED: u8 = 1;
/// The service shut down before the deadline, or refused the timer.
pub const ABANDONED: u8 = 2;
/// The sleep was dropped or re-armed: its timer, cancelled next, wakes nobody
/// (tokio's contract: dropping a timer future only cancels).
pub const DISARMED: u8 = 3;

/// The outcome's bits of [`SleepShared`]'s state word.
const OUTCOME: u8 = 0b011;
/// Set while the sleep's future stores its waker ([`SleepShared::poll_finished`]).
const POLLING: u8 = 0b100;

/// What a sleep's timer and its future share: the outcome and the waker. It lives in
/// the timer's own entry ([`SleepEntry`]): one allocation per armed sleep.
///
/// # The handshake
///
/// One state word holds the outcome (`WAITING`, `ELAPSED`, `ABANDONED`, `DISARMED`)
/// and a `POLLING` bit; the waker sits in a cell beside it that the word hands from
/// one side to the other, with no lock:
///
/// - **Who may touch the waker.** The future (its poll, its drop, its reset: one
///   thread at a time, since they take the future by `&mut`) while the outcome is
///   `WAITING` and no `POLLING` is set by anyone but itself; the one call that moved
///   the outcome off `WAITING` after that. A finisher that wins while `POLLING` is
///   set leaves the waker to the poll under way, which sees the outcome when it
///   clears the bit, takes the waker and returns `Ready`.
/// - **No wake-up is lost.** A poll sets `POLLING` (from `WAITING` only), stores the
///   waker, clears `POLLING`. A finish that wins before the set makes the set fail:
///   `Ready`. One that wins between the set and the clear is seen by the clear:
///   `Ready`. One that wins after the clear finds the stored waker (its Acquire CAS
///   pairs with the clear's Release) and wakes it.
/// - **A waker stored before the timer is filed** ([`SleepShared::polled`]: a first
///   poll arms the timer with its waker, with no handshake at all) is published with
///   the entry: filing it into a shard (the ring's Release, the token's) happens
///   before any finisher reads it.
///
/// A loom model drives these very methods (`loom-tests/tests/sleep_waker.rs`).
pub struct SleepShared {
    /// The outcome (the low two bits) and `POLLING`.
    state: AtomicU8,
    /// The waker of the task that last polled the sleep; touched only as the
    /// handshake (above) allows.
    waker: UnsafeCell<Option<Waker>>,
}

// SAFETY: the waker (`Send + Sync`) is touched by one thread at a time, handed over
// by the state word's atomic read-modify-writes (the handshake above); everything
// else is atomic.
unsafe impl Sync for SleepShared {}
// SAFETY: as for `Sync`: a `Waker` may move between threads.
unsafe impl Send for SleepShared {}

impl Default for SleepShared {
    fn default() -> SleepShared {
        SleepShared::new()
    }
}

impl fmt::Debug for SleepShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SleepShared")
            .field("outcome", &self.outcome())
            .finish_non_exhaustive()
    }
}

impl SleepShared {
    /// A sleep not yet finished, with no waker.
    pub fn new() -> SleepShared {
        SleepShared {
            state: AtomicU8::new(WAITING),
            waker: UnsafeCell::new(None),
        }
    }

    /// A sleep not yet finished whose task already waits on it: `waker` is stored
    /// before anyone else can see the sleep (its timer is not filed yet), so the poll
    /// that arms the timer returns `Pending` without the handshake.
    pub fn polled(waker: Waker) -> SleepShared {
        SleepShared {
            state: AtomicU8::new(WAITING),
            waker: UnsafeCell::new(Some(waker)),
        }
    }

    /// Records the outcome (first writer wins) and wakes the waiting task, unless
    /// its poll is under way (that poll then returns `Ready`). Returns whether this
    /// call's outcome won.
    pub fn finish(&self, outcome: u8) -> bool {
        debug_assert!(outcome != WAITING && outcome & !OUTCOME == 0);
        // ORDERING: Relaxed: this load only spares the CAS where the sleep is finished
        // already (a disarmed sleep's cancelled timer); the CAS decides.
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            if state & OUTCOME != WAITING {
                return false;
            }
            // ORDERING: AcqRel on success: Acquire pairs with the poll's Release (the
            // clear of POLLING), so the waker it stored is seen here; Release publishes
            // the outcome to the Acquire loads of `outcome` and the poll. Failure
            // Relaxed: the loop reads the outcome again and only that.
            match self.state.compare_exchange_weak(
                state,
                state | outcome,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => state = now,
            }
        }
        if state & POLLING == 0 {
            // SAFETY: we moved the outcome off WAITING with no poll under way: the
            // waker is ours alone (the handshake): no poll stores one any more (its
            // set of POLLING fails), and `give_up`'s disarm lost.
            let waker = self.waker.with_mut(|waker| unsafe { (*waker).take() });
            if let Some(waker) = waker {
                waker.wake();
            }
        }
        true
    }

    /// The sleep's future gives its timer up (it is dropped or re-armed): unless the
    /// timer already finished it, the outcome becomes `DISARMED`, so that the timer's
    /// callback, dropped by the cancel that follows, wakes nobody. Returns whether
    /// this call disarmed it.
    ///
    /// Only the sleep's future calls this, never while its own poll is under way.
    pub fn disarm(&self) -> bool {
        // ORDERING: AcqRel/Relaxed as in `finish`: the same word, the same readers.
        // The future is not polling, so POLLING is clear: WAITING is the whole word.
        self.state
            .compare_exchange(WAITING, DISARMED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// The sleep's future gives its timer up for good or for a new one (dropped,
    /// re-armed): [`disarm`](Self::disarm)s it (the first value: whether this call
    /// did, so that the caller cancels the timer), and, if it did, takes the stored
    /// waker out for the caller to drop on its own thread, after the cancel (ground
    /// rules: a waker is user code, and the entry's last reference may go on a shard
    /// thread, inside its turn). If the timer finished the sleep first, the finish
    /// owns the waker and wakes it (on its own thread, as every wake).
    ///
    /// Only the sleep's future calls this, never while its own poll is under way.
    pub fn give_up(&self) -> (bool, Option<Waker>) {
        if !self.disarm() {
            return (false, None);
        }
        // SAFETY: our disarm moved the outcome off WAITING with no poll under way: the
        // waker is ours alone (the handshake).
        let waker = self.waker.with_mut(|waker| unsafe { (*waker).take() });
        (true, waker)
    }

    /// `WAITING`, `ELAPSED`, `ABANDONED` or `DISARMED`.
    pub fn outcome(&self) -> u8 {
        // ORDERING: Acquire pairs with the AcqRel CAS in `finish`.
        self.state.load(Ordering::Acquire) & OUTCOME
    }

    /// `Ready` once the sleep has an outcome; otherwise stores `cx`'s waker for
    /// `finish` to wake and returns `Pending`.
    ///
    /// Only the sleep's future calls this.
    pub fn poll_finished(&self, cx: &mut Context<'_>) -> Poll<()> {
        // ORDERING: Acquire pairs with the AcqRel CAS in `finish` (the outcome; it
        // publishes nothing else).
        if self.state.load(Ordering::Acquire) & OUTCOME != WAITING {
            return Poll::Ready(());
        }
        // ORDERING: Acquire, as above, for the outcome a failure reads. The success
        // needs no ordering for the waker: it was last written by this future (on its
        // thread, or before the future moved here) or taken by a finish that won,
        // which a success rules out.
        if self
            .state
            .compare_exchange(
                WAITING,
                WAITING | POLLING,
                Ordering::Acquire,
                Ordering::Acquire,
            )
            .is_err()
        {
            return Poll::Ready(());
        }
        // The waker's clone is user code and may panic: unwinding out of it must not
        // leave POLLING set for good (a drop's disarm, which expects `WAITING`, would
        // fail, and a finish would leave the waker to a poll that is gone).
        let unwinding = PollUnwind(self);
        let replaced = self.waker.with_mut(|waker| {
            // SAFETY: POLLING is set, by us: a finish that wins now leaves the waker to
            // us, and `give_up` is this future's, not under way during its poll; the
            // cell is ours until we clear POLLING.
            let waker = unsafe { &mut *waker };
            match waker {
                Some(current) if current.will_wake(cx.waker()) => None,
                _ => waker.replace(cx.waker().clone()),
            }
        });
        core::mem::forget(unwinding);
        let (finished, left_to_us) = self.end_poll();
        // User code last: the wakers go after the handshake.
        drop(replaced);
        drop(left_to_us);
        if finished {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Ends a poll's hold of the waker: clears `POLLING` and says whether a finish
    /// came meanwhile, with the waker that finish left to the poll (the caller drops
    /// it, or wakes it where the poll cannot return `Ready`).
    fn end_poll(&self) -> (bool, Option<Waker>) {
        // ORDERING: Release publishes the stored waker to a finish whose CAS comes
        // later (its Acquire); Acquire reads an outcome a finish set meanwhile.
        let before = self.state.fetch_and(!POLLING, Ordering::AcqRel);
        if before & OUTCOME == WAITING {
            return (false, None);
        }
        // SAFETY: a finish won while POLLING was set, so it left the waker to this
        // poll; nobody else touches it once the outcome is set (the handshake).
        let waker = self.waker.with_mut(|waker| unsafe { (*waker).take() });
        (true, waker)
    }
}

/// Clears `POLLING` if a poll unwinds out of its waker's clone (a panic in user
/// code); forgotten on every other path. A finish that came meanwhile left the old
/// waker to the poll: it is woken here, as that finish would have woken it, so a
/// caller that catches the panic and keeps the sleep loses no wake-up (audit
/// `tests/audit_sleep_waker.rs`: with the bit left set, a drop could no longer
/// cancel the timer, and the earlier waker was never woken). That wake runs while the
/// clone's panic unwinds: a panic of the wake is caught here and its payload dropped
/// as a pool worker drops a callback's (`executor::run_caught`), and the clone's panic
/// goes on, so that a second panic escaping this drop does not abort the process.
struct PollUnwind<'a>(&'a SleepShared);

impl Drop for PollUnwind<'_> {
    fn drop(&mut self) {
        if let (true, Some(waker)) = self.0.end_poll() {
            crate::executor::run_caught(WakeCaught(waker));
        }
    }
}

/// A waker's wake, run by [`run_caught`](crate::executor::run_caught), which catches
/// its panic and drops the payload (see there).
struct WakeCaught(Waker);

impl crate::executor::Task for WakeCaught {
    fn run(self) {
        self.0.wake();
    }
}

/// A sleep's allocation: the header first, so a pointer to it is a pointer to the
/// header (as for `Entry<F>`).
#[repr(C)]
pub(super) struct SleepEntry {
    /// The type-erased part.
    header: Header,
    /// The outcome and waker, read through any reference.
    shared: SleepShared,
}

impl SleepEntry {
    /// The vtable of an infallible future's timer: shutdown cancels it instead of
    /// handing it back, and it holds no room under `max_pending`.
    const VTABLE: Vtable = Vtable {
        run: SleepEntry::fire,
        drop_callback: SleepEntry::abandon,
        dealloc: SleepEntry::dealloc,
        call_again: None,
        next_run: None,
        hands_back: false,
        holds_room: false,
        sleep: true,
        options: false,
    };

    /// The vtable of a `try_*` future's timer: it holds room, as `schedule`'s do.
    const TRY_VTABLE: Vtable = Vtable {
        holds_room: true,
        ..SleepEntry::VTABLE
    };

    /// The shared state of the sleep entry behind `header`.
    ///
    /// # Safety
    ///
    /// - `header` points to a live `SleepEntry` (its vtable is one of this type's),
    ///   and stays live for `'a`.
    unsafe fn shared<'a>(header: NonNull<Header>) -> &'a SleepShared {
        // SAFETY: live and a `SleepEntry` for `'a` (the caller's point); `shared` is
        // only ever read through shared references until the allocation is freed.
        unsafe { &header.cast::<SleepEntry>().as_ref().shared }
    }

    /// The timer fired: the sleep is elapsed.
    ///
    /// # Safety
    ///
    /// - `header` points to a live `SleepEntry` (the vtable's contract).
    unsafe fn fire(header: NonNull<Header>) {
        // SAFETY: the caller's point; the caller holds a reference for the call.
        unsafe { SleepEntry::shared(header) }.finish(ELAPSED);
    }

    /// The timer's callback is dropped unrun (a cancel won, shutdown, or the last
    /// reference went while pending): the sleep is abandoned, unless its future
    /// disarmed it first.
    ///
    /// # Safety
    ///
    /// - `header` points to a live `SleepEntry` (the vtable's contract).
    unsafe fn abandon(header: NonNull<Header>) {
        // SAFETY: the caller's point; the caller holds a reference for the call.
        unsafe { SleepEntry::shared(header) }.finish(ABANDONED);
    }

    /// Frees the allocation, dropping the shared state (a stored waker).
    ///
    /// # Safety
    ///
    /// - `header` came from `pool::boxed` in [`EntryRef::new_sleep`], and no other
    ///   reference remains.
    unsafe fn dealloc(header: NonNull<Header>) {
        // SAFETY: the caller's point: from `pool::boxed::<SleepEntry>`, unaliased.
        unsafe { super::pool::unbox(header.cast::<SleepEntry>()) };
    }
}

impl EntryRef {
    /// Allocates a `Sleep`'s timer, with two references (the handle's, the
    /// service's): shutdown cancels it (finishing the sleep as abandoned) instead of
    /// handing it back. It holds room under `max_pending` only if `holds_room` (a
    /// `try_*` future's).
    ///
    /// `waker`, if any, is the waker of the task whose poll arms the timer: stored
    /// before the entry is filed ([`SleepShared::polled`]), so that the poll needs no
    /// handshake.
    pub fn new_sleep(
        id: TimerId,
        deadline: Nanos,
        holds_room: bool,
        waker: Option<Waker>,
    ) -> (EntryRef, EntryRef) {
        let vtable = if holds_room {
            &SleepEntry::TRY_VTABLE
        } else {
            &SleepEntry::VTABLE
        };
        let header = super::pool::boxed(SleepEntry {
            header: Header::new(id, deadline, vtable),
            shared: waker.map_or_else(SleepShared::new, SleepShared::polled),
        })
        .cast::<Header>();
        (EntryRef(header), EntryRef(header))
    }

    /// The outcome and waker of a `Sleep`'s timer; `None` for any other timer.
    pub fn sleep_shared(&self) -> Option<&SleepShared> {
        if !self.header().vtable.sleep {
            return None;
        }
        // SAFETY: only `new_sleep` makes entries with a `sleep` vtable, and they are
        // `SleepEntry`s; our reference keeps the allocation live for `&self`.
        Some(unsafe { SleepEntry::shared(self.0) })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{EntryRef, ABANDONED, DISARMED, ELAPSED, WAITING};
    use crate::clock::Nanos;
    use crate::id::TimerId;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Wake, Waker};

    /// Counts wakes and drops of a waker.
    #[derive(Default)]
    struct Counted {
        wakes: AtomicUsize,
    }

    impl Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.wakes.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A sleep entry with a stored waker; returns both references and the waker's
    /// counter.
    fn polled() -> (EntryRef, EntryRef, Arc<Counted>) {
        let (handle, service) = EntryRef::new_sleep(TimerId::next(), Nanos::new(5), false, None);
        let counted = Arc::new(Counted::default());
        let waker = Waker::from(counted.clone());
        let shared = handle.sleep_shared().expect("a sleep's entry");
        assert!(shared
            .poll_finished(&mut Context::from_waker(&waker))
            .is_pending());
        assert_eq!(shared.outcome(), WAITING);
        (handle, service, counted)
    }

    #[test]
    fn firing_a_sleep_entry_finishes_it_elapsed_and_wakes_once() {
        let (handle, service, counted) = polled();
        let Ok(fired) = service.try_fire() else {
            panic!("pending, so it fires");
        };
        fired.run();
        assert_eq!(handle.sleep_shared().unwrap().outcome(), ELAPSED);
        assert_eq!(counted.wakes.load(Ordering::SeqCst), 1);
        drop(handle);
        // Every reference gone: the stored waker was taken by the wake, nothing
        // else holds the counter.
        assert_eq!(Arc::strong_count(&counted), 1);
    }

    #[test]
    fn a_cancelled_sleep_entry_is_abandoned_unless_disarmed_first() {
        let (handle, service, counted) = polled();
        drop(handle.cancel_detached().expect("the cancel wins"));
        assert_eq!(handle.sleep_shared().unwrap().outcome(), ABANDONED);
        assert_eq!(counted.wakes.load(Ordering::SeqCst), 1, "shutdown wakes");
        drop((handle, service));

        let (handle, service, counted) = polled();
        assert!(handle.sleep_shared().unwrap().disarm());
        drop(handle.cancel_detached().expect("the cancel wins"));
        assert_eq!(handle.sleep_shared().unwrap().outcome(), DISARMED);
        assert_eq!(
            counted.wakes.load(Ordering::SeqCst),
            0,
            "a drop wakes nobody"
        );
        drop((handle, service));
        // The stored waker was dropped with the allocation.
        assert_eq!(Arc::strong_count(&counted), 1);
    }

    #[test]
    fn the_last_reference_of_a_pending_sleep_entry_abandons_it_and_frees_the_waker() {
        let (handle, service, counted) = polled();
        drop(service);
        drop(handle);
        assert_eq!(counted.wakes.load(Ordering::SeqCst), 1);
        assert_eq!(Arc::strong_count(&counted), 1);
    }

    #[test]
    fn only_sleep_entries_have_sleep_state() {
        let (handle, _service) = EntryRef::new(TimerId::next(), Nanos::new(5), || {});
        assert!(handle.sleep_shared().is_none());
    }
}
