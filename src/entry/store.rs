//! The shard wheel's view of entries: [`EntryPtr`], the non-owning pointer the wheel
//! files, and [`ShardStore`], through which the wheel reads deadlines and keeps each
//! entry's place.

use core::ptr::NonNull;

use super::{EntryRef, Header};
use crate::clock::{Nanos, Ticks};
use crate::sync::Ordering;
use crate::wheel::{Place, Store};

/// Why a shard keeps track of an entry outside its wheel: a message for it is still to
/// come (entry ground rule 4), and the shard must neither look for it in the wheel nor
/// exit before it arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Aside {
    /// Cancelled with `FILED` and out of the wheel (it came due): its cancel message
    /// is still to come.
    Cancel,
    /// Cancelled and out of the wheel, with a move message still to come.
    Move,
    /// Handed back at shutdown as pending, with a move message still to come.
    DetachedMove,
}

/// The list number that marks an entry tracked aside; the position says why.
const ASIDE_LIST: u16 = u16::MAX;

/// A non-owning pointer to an entry, as filed in a shard's wheel. `Copy` so the wheel
/// can move it between slots; it owns nothing, so copying it cannot free anything: the
/// shard's reference it stands for is given up by [`ShardStore::release`] and taken
/// back once by the unsafe [`ShardStore::claim`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct EntryPtr(pub(super) NonNull<Header>);

// SAFETY: an `EntryPtr` is an address the shard's wheel keeps for an entry whose
// reference the shard holds; the entry's shared fields are atomics or immutable, and
// its place is reached only by the shard thread (entry ground rule 3), so moving the
// wheel (with its core) to the shard thread is sound.
unsafe impl Send for EntryPtr {}

/// The wheel's view of entries in a shard: deadlines and places read through the
/// entry pointers themselves; entries keep deadlines in nanoseconds, the wheel files
/// them by the tick they are due at. Every method, the safe ones of
/// [`Store`](crate::wheel::Store) included, dereferences the pointers it is given
/// under the contract of the unsafe [`new`](Self::new).
#[derive(Debug)]
pub(crate) struct ShardStore(Ticks);

impl ShardStore {
    /// A store for one shard's wheel, whose ticks are `ticks`.
    ///
    /// # Safety
    ///
    /// - Every [`EntryPtr`] passed to the store's methods points to a live entry: one
    ///   whose reference the store holds (given by [`release`](Self::release) and not
    ///   yet claimed back), or one the caller holds a reference to; and
    /// - the store is used only by one shard thread (entry ground rule 3).
    pub(crate) unsafe fn new(ticks: Ticks) -> Self {
        ShardStore(ticks)
    }

    /// The header of an entry the store may touch.
    fn header(&self, entry: EntryPtr) -> &Header {
        // SAFETY: `ShardStore::new`'s first point: the entry is live while the store or
        // the caller holds a reference, for at least this borrow of `self`.
        unsafe { entry.0.as_ref() }
    }

    /// Gives the shard's reference to the wheel.
    pub(crate) fn release(&mut self, entry: EntryRef) -> EntryPtr {
        let ptr = entry.as_ptr();
        core::mem::forget(entry);
        ptr
    }

    /// Takes back the reference that [`release`](Self::release) gave up for `entry`.
    ///
    /// # Safety
    ///
    /// `entry` came from `release` on this store and has not been claimed since; it is
    /// claimed now, and not passed to the store again until released again.
    pub(crate) unsafe fn claim(&mut self, entry: EntryPtr) -> EntryRef {
        EntryRef(entry.0)
    }

    /// Marks an entry tracked outside the wheel until a message arrives.
    pub(crate) fn set_aside(&mut self, entry: EntryPtr, why: Aside) {
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

    /// Why the entry is tracked outside the wheel, or `None` if it is not.
    pub(crate) fn aside(&self, entry: EntryPtr) -> Option<Aside> {
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

    /// Clears the mark of an entry no longer tracked aside.
    pub(crate) fn clear_aside(&mut self, entry: EntryPtr) {
        self.set_place(entry, Place::default());
    }
}

// The wheel calls these safe methods with the `EntryPtr`s it was given; each
// dereferences its pointer under the contract of the unsafe `ShardStore::new` (a
// live entry, the shard thread only), which the one caller, `ShardCore`, takes on
// (its SAFETY comment at `ShardStore::new`). Keeping them safe is what lets the pure
// wheel (`src/wheel/`, `forbid(unsafe_code)`) drive a store of raw pointers; tokio
// instead makes every operation on its raw timer handle `unsafe`. The contract is
// why a `ShardStore` can be made only by `unsafe` code and never leaves its core.
impl Store for ShardStore {
    type Ref = EntryPtr;

    fn deadline(&self, entry: EntryPtr) -> u64 {
        // ORDERING: Relaxed: for filing only. A stale later value is corrected by the
        // move message of the reset that moved it earlier; a stale earlier one makes
        // the entry come due early, where `try_fire_due` re-checks under its claim and
        // re-files it.
        let deadline = Nanos::from_bits(self.header(entry).deadline.load(Ordering::Relaxed));
        // The pure wheel is in plain `u64` ticks.
        self.0.due_tick(deadline).get()
    }

    fn prefetch(&self, entry: EntryPtr) {
        // The header's line: the deadline the engine reads next, and the place it writes.
        super::pool::prefetch(entry.0.as_ptr().cast_const());
    }

    fn place(&self, entry: EntryPtr) -> Place {
        let header = self.header(entry);
        // SAFETY: only the shard thread touches `position` and `list`
        // (`ShardStore::new`'s second point), so these reads race with no write.
        let position = header.position.with(|position| unsafe { *position });
        // SAFETY: as above.
        let list = header.list.with(|list| unsafe { *list });
        Place { list, position }
    }

    fn set_place(&mut self, entry: EntryPtr, place: Place) {
        let header = self.header(entry);
        // SAFETY: only the shard thread touches `position` and `list`, so these
        // writes are exclusive.
        header
            .position
            .with_mut(|cell| unsafe { *cell = place.position });
        // SAFETY: as above.
        header.list.with_mut(|cell| unsafe { *cell = place.list });
    }
}
