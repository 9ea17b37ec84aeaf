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
//! `SleepShared` is read through any reference (it is `Sync`: an atomic and a mutex) and
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
use crate::sync::{AtomicU8, Mutex, Ordering};
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

/// What a sleep's timer and its future share: the outcome and the waker. It lives in
/// the timer's own entry ([`SleepEntry`]): one allocation per armed sleep.
///
/// The handshake (a loom model, `loom-tests/tests/sleep_waker.rs`, drives these very
/// methods): the poller stores its waker under the mutex and then re-reads the
/// outcome; `finish` CASes the outcome and then takes the waker under the same mutex.
/// Either the poller's re-read sees the outcome, or `finish`'s take comes after the
/// store and wakes the stored waker — a wake-up cannot be lost.
#[derive(Debug, Default)]
pub struct SleepShared {
    /// `WAITING`, `ELAPSED` or `ABANDONED`; written once by the callback or its drop.
    outcome: AtomicU8,
    /// The waker of the task that last polled the sleep.
    waker: Mutex<Option<Waker>>,
}

impl SleepShared {
    /// A sleep not yet finished, with no waker.
    pub fn new() -> SleepShared {
        SleepShared {
            outcome: AtomicU8::new(WAITING),
            waker: Mutex::new(None),
        }
    }

    /// Records the outcome (first writer wins) and wakes the waiting task. Returns
    /// whether this call's outcome won.
    pub fn finish(&self, outcome: u8) -> bool {
        // ORDERING: AcqRel: the poller's Acquire load of `outcome` sees it; nothing
        // else is published through it. Failure Relaxed: already finished.
        let won = self
            .outcome
            .compare_exchange(WAITING, outcome, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if won {
            let waker = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
        won
    }

    /// The sleep's future gives its timer up (it is dropped or re-armed): unless the
    /// timer already finished it, the outcome becomes `DISARMED`, so that the timer's
    /// callback, dropped by the cancel that follows, wakes nobody. Returns whether
    /// this call disarmed it.
    pub fn disarm(&self) -> bool {
        // ORDERING: AcqRel/Relaxed as in `finish`: the same word, the same readers.
        self.outcome
            .compare_exchange(WAITING, DISARMED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// The sleep's future gives its timer up for good or for a new one (dropped,
    /// re-armed): [`disarm`](Self::disarm)s it (the first value: whether this call
    /// did, so that the caller cancels the timer), and takes the stored waker out for
    /// the caller to drop on its own thread, after the cancel (ground rules: a waker
    /// is user code, and the entry's last reference may go on a shard thread, inside
    /// its turn). Nothing stores a waker afterwards: only `poll_finished` does, for
    /// the future that gave the timer up.
    pub fn give_up(&self) -> (bool, Option<Waker>) {
        let disarmed = self.disarm();
        let waker = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
        (disarmed, waker)
    }

    /// `WAITING`, `ELAPSED`, `ABANDONED` or `DISARMED`.
    pub fn outcome(&self) -> u8 {
        // ORDERING: Acquire pairs with the AcqRel CAS in `finish`.
        self.outcome.load(Ordering::Acquire)
    }
}

impl SleepShared {
    /// `Ready` once the sleep has an outcome; otherwise stores `cx`'s waker for
    /// `finish` to wake and returns `Pending`.
    pub fn poll_finished(&self, cx: &mut Context<'_>) -> Poll<()> {
        // ORDERING: Acquire pairs with the AcqRel CAS in `SleepShared::finish`.
        if self.outcome.load(Ordering::Acquire) != WAITING {
            return Poll::Ready(());
        }
        {
            let mut waker = self.waker.lock().unwrap_or_else(|e| e.into_inner());
            match waker.as_ref() {
                Some(current) if current.will_wake(cx.waker()) => {}
                _ => *waker = Some(cx.waker().clone()),
            }
        }
        // Finished between the first check and storing the waker: `finish` may have
        // taken the old waker (or none), so check again rather than miss the wake.
        // ORDERING: Acquire, as above. The waker mutex orders this load after our
        // store, and `finish`'s CAS before its take: if `finish`'s take saw no waker
        // of ours, its CAS precedes our unlock, so this load sees the outcome.
        if self.outcome.load(Ordering::Acquire) != WAITING {
            return Poll::Ready(());
        }
        Poll::Pending
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
    pub fn new_sleep(id: TimerId, deadline: Nanos, holds_room: bool) -> (EntryRef, EntryRef) {
        let vtable = if holds_room {
            &SleepEntry::TRY_VTABLE
        } else {
            &SleepEntry::VTABLE
        };
        let header = super::pool::boxed(SleepEntry {
            header: Header::new(id, deadline, vtable),
            shared: SleepShared::new(),
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
        let (handle, service) = EntryRef::new_sleep(TimerId::next(), Nanos::new(5), false);
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
