//! The wheel's engine, generic over where entries are stored: the levels, the overdue
//! list, filing, cascading and expiry.
//!
//! [`TimingWheel`](super::TimingWheel) runs it over a slab (`R = u32`); a shard runs it
//! over its timer entries (`R` = an entry pointer), so that a pending timer is one
//! allocation with no separate wheel node. The engine only ever asks a [`Store`] for
//! an entry's deadline and where it sits, and tells it where the entry now sits.
//!
//! # Ground rules
//!
//! Every reference handed to the engine is *live* (its store can answer for it) until
//! the engine hands it back: through `expired` in [`Wheel::advance`], or through
//! [`Wheel::drain`]; or until the caller takes it out with [`Wheel::remove`]. A
//! reference is held in at most one list at a time, and its store's [`Place`] always
//! names that list and its index there.

#![forbid(unsafe_code)]

use super::level::{
    level_for, slot_for, slot_start, Level, NUM_LEVELS, RETAINED_LIST_CAPACITY, SLOTS_PER_LEVEL,
};

/// The list id of the overdue list (entries filed with a deadline `<=` now).
const OVERDUE_LIST: u16 = (NUM_LEVELS * SLOTS_PER_LEVEL) as u16;

/// Where an entry sits in the wheel: which list, and its index in that list's vector.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub(crate) struct Place {
    /// `level * 64 + slot`, or the overdue list.
    pub(crate) list: u16,
    /// Index within the list's vector.
    pub(crate) position: u32,
}

/// What the engine needs to know about the entries it holds.
pub(crate) trait Store {
    /// A cheap reference to one entry.
    type Ref: Copy + PartialEq + core::fmt::Debug;
    /// The entry's deadline, in ticks. It may move *later* while the entry is held (a
    /// shard's `reset`): the engine reads it again when the entry's slot comes due and
    /// re-files the entry if it is not due yet. A deadline that moves earlier must be
    /// re-filed by the caller (`remove` then `insert`).
    fn deadline(&self, entry: Self::Ref) -> u64;
    /// Where the engine last said the entry sits.
    fn place(&self, entry: Self::Ref) -> Place;
    /// Records where the entry now sits.
    fn set_place(&mut self, entry: Self::Ref, place: Place);
}

/// The levels and the overdue list of one timing wheel, holding references of type `R`.
pub(crate) struct Wheel<R> {
    /// The current tick: every entry held has a deadline after it, except those on the
    /// overdue list.
    now: u64,
    /// Level 0 (one tick per slot) to level 10 (2^60 ticks per slot), boxed so that a
    /// wheel moves cheaply.
    levels: Box<[Level<R>; NUM_LEVELS]>,
    /// Entries filed with a deadline `<=` `now`; the next `advance` yields them first.
    overdue: Vec<R>,
}

impl<R: Copy + PartialEq + core::fmt::Debug> Wheel<R> {
    /// An empty wheel at tick `now`.
    pub(crate) fn new(now: u64) -> Self {
        Wheel {
            now,
            levels: Box::new([const { Level::new() }; NUM_LEVELS]),
            overdue: Vec::new(),
        }
    }

    /// The current tick.
    pub(crate) fn now(&self) -> u64 {
        self.now
    }

    /// Files `entry` by its deadline in O(1) (amortised). A deadline `<=` now goes on
    /// the overdue list.
    pub(crate) fn insert<S: Store<Ref = R>>(&mut self, store: &mut S, entry: R) {
        self.file(store, entry, store.deadline(entry));
    }

    /// Takes a held `entry` out of its list in O(1).
    pub(crate) fn remove<S: Store<Ref = R>>(&mut self, store: &mut S, entry: R) {
        let place = store.place(entry);
        let (list, occupied_bit) = self.list_mut(place.list);
        let removed = list.swap_remove(place.position as usize);
        debug_assert_eq!(
            removed, entry,
            "engine invariant: the store's place is stale"
        );
        if let Some(&moved) = list.get(place.position as usize) {
            store.set_place(moved, place);
        } else if list.is_empty() {
            if let Some((occupied, bit)) = occupied_bit {
                *occupied &= !bit;
            }
        }
    }

    /// The tick at which `advance` next has work to do: `now` if anything is overdue,
    /// else the first tick of the earliest occupied slot; `None` when empty.
    pub(crate) fn next_expiry(&self) -> Option<u64> {
        if !self.overdue.is_empty() {
            return Some(self.now);
        }
        self.next_occupied().map(|(_, _, start)| start)
    }

    /// Moves to tick `now` (never backwards) and hands every entry due at or before it
    /// to `expired`, in non-decreasing deadline order, overdue entries first. The entry
    /// is no longer held when `expired` sees it.
    pub(crate) fn advance<S: Store<Ref = R>>(
        &mut self,
        store: &mut S,
        now: u64,
        expired: &mut impl FnMut(&mut S, R),
    ) {
        if !self.overdue.is_empty() {
            let mut overdue = core::mem::take(&mut self.overdue);
            for &entry in &overdue {
                expired(store, entry);
            }
            overdue.clear();
            self.overdue = overdue;
        }
        while let Some((level, slot, start)) = self.next_occupied() {
            if start > now {
                break;
            }
            debug_assert!(
                start >= self.now,
                "engine invariant: slot start {start} before now {}",
                self.now
            );
            self.now = start;
            let lvl = &mut self.levels[level];
            lvl.occupied &= !(1u64 << slot);
            let mut entries = core::mem::take(&mut lvl.slots[slot]);
            for &entry in &entries {
                let deadline = store.deadline(entry);
                if deadline <= start {
                    expired(store, entry);
                } else {
                    // A higher slot cascading, or (level 0) an entry whose deadline
                    // moved later since it was filed: file it where it now belongs.
                    self.file(store, entry, deadline);
                }
            }
            // Entries cascade only to lower levels, so this slot is still empty.
            if entries.capacity() <= RETAINED_LIST_CAPACITY {
                entries.clear();
                self.levels[level].slots[slot] = entries;
            }
        }
        self.now = self.now.max(now);
    }

    /// Hands every held entry to `each`, in no particular order, leaving the wheel
    /// empty at the same tick.
    pub(crate) fn drain(&mut self, each: &mut impl FnMut(R)) {
        for entry in self.overdue.drain(..) {
            each(entry);
        }
        for lvl in self.levels.iter_mut() {
            lvl.occupied = 0;
            for list in &mut lvl.slots {
                for entry in list.drain(..) {
                    each(entry);
                }
            }
        }
    }

    /// Places a held entry in the list for `deadline` relative to `now`.
    fn file<S: Store<Ref = R>>(&mut self, store: &mut S, entry: R, deadline: u64) {
        let (list, entries) = if deadline <= self.now {
            (OVERDUE_LIST, &mut self.overdue)
        } else {
            let level = level_for(self.now, deadline);
            let slot = slot_for(deadline, level);
            let lvl = &mut self.levels[level];
            lvl.occupied |= 1u64 << slot;
            (
                (level * SLOTS_PER_LEVEL + slot) as u16,
                &mut lvl.slots[slot],
            )
        };
        let position = entries.len() as u32;
        entries.push(entry);
        store.set_place(entry, Place { list, position });
    }

    /// The vector of list `list`, and for a slot list its level's occupied bitmap and
    /// the slot's bit.
    fn list_mut(&mut self, list: u16) -> (&mut Vec<R>, Option<(&mut u64, u64)>) {
        if list == OVERDUE_LIST {
            return (&mut self.overdue, None);
        }
        let (level, slot) = (
            list as usize / SLOTS_PER_LEVEL,
            list as usize % SLOTS_PER_LEVEL,
        );
        let lvl = &mut self.levels[level];
        (
            &mut lvl.slots[slot],
            Some((&mut lvl.occupied, 1u64 << slot)),
        )
    }

    /// The earliest occupied slot: `(level, slot, first tick of the slot)`.
    ///
    /// Entries at a lower level always lie before any higher level's occupied slot
    /// (they are inside the current tick's slot of every level above them), so the
    /// first occupied level holds the earliest slot.
    fn next_occupied(&self) -> Option<(usize, usize, u64)> {
        self.levels.iter().enumerate().find_map(|(level, lvl)| {
            lvl.first_occupied()
                .map(|slot| (level, slot, slot_start(self.now, level, slot)))
        })
    }
}

impl<R> core::fmt::Debug for Wheel<R> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Wheel").field("now", &self.now).finish()
    }
}
