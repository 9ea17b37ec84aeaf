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
//! names that list and its index there — with one exception, the *draining batch*:
//!
//! **Bounded advance** ([`Wheel::advance_bounded`]). A slot (or the overdue list) with
//! more due entries than the budget left is taken out of the wheel whole, as the
//! draining batch, with a cursor: the entries before the cursor have been handed out,
//! those after it wait, and keep the places they had in the list they came from (no
//! entry is touched when a batch starts draining, so a turn stays bounded however big
//! the slot). `remove` tells a draining entry from one filed since in the same list by
//! comparing references: an entry is in exactly one list, so at most one of the two
//! vectors holds it at that position. At most one batch drains at a time; each bounded
//! advance gives it at least half its budget, so it never starves, and gives the rest
//! first to what came due since (a timer due one tick after a burst is not late by the
//! whole burst).

#![forbid(unsafe_code)]

use super::level::{
    level_for, slot_for, slot_start, Level, NUM_LEVELS, RETAINED_LIST_CAPACITY, SLOTS_PER_LEVEL,
};

/// Starts loading the first [`PREFETCH_AHEAD`] of `entries`, a list about to be worked
/// through ([`Store::prefetch`]).
fn prefetch_first<S: Store>(store: &S, entries: &[S::Ref]) {
    for &entry in entries.iter().take(PREFETCH_AHEAD) {
        store.prefetch(entry);
    }
}

/// Before handling `entries[at]`: starts loading the entry [`PREFETCH_AHEAD`] further on.
fn prefetch_ahead<S: Store>(store: &S, entries: &[S::Ref], at: usize) {
    if let Some(&ahead) = entries.get(at + PREFETCH_AHEAD) {
        store.prefetch(ahead);
    }
}

/// Empties a drained list's vector, every entry handed on, and cuts it down to
/// [`RETAINED_LIST_CAPACITY`] places: a slot that held more (a busy slot of level 0, or
/// a cascading one) grows back from there next time, one reallocation per doubling
/// above it, instead of from nothing; and memory follows the entries held, not the peak
/// of every slot.
///
/// The shrink frees the vector's tail in the allocator arena of the thread that
/// allocated the vector; with glibc, a free of 64 KiB or more first consolidates that
/// arena's fast bins. For the lowest levels that arena is the shard's own
/// ([`Wheel::reserve_lists`], called by the shard as it starts), whose fast bins stay
/// nearly empty. Before that, a list first grown by a producer filing directly lived
/// in the producer's arena, full of the boxed callbacks freed as their timers fired,
/// and each level-1 cascade paid 5–20 ms of the shard's CPU for its consolidation
/// (docs/architecture.md, the wheel). Keeping every list's capacity instead was as fast
/// under a firehose but kept up to a burst's worth of memory in every slot it had
/// passed through, never given back (`tests/audit_round4.rs`'s memory test failed).
fn recycle<R>(entries: &mut Vec<R>) {
    entries.clear();
    entries.shrink_to(RETAINED_LIST_CAPACITY);
}

/// The list id of the overdue list (entries filed with a deadline `<=` now).
pub(super) const OVERDUE_LIST: u16 = (NUM_LEVELS * SLOTS_PER_LEVEL) as u16;

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
    /// A hint: the engine will ask for `entry`'s deadline soon (it is
    /// [`PREFETCH_AHEAD`] entries further on in a list being worked through). A store
    /// whose entries lie apart in memory starts loading it now, so that a cascade or a
    /// drain of a big slot overlaps its cache misses instead of paying them one after
    /// another. Never needed for correctness; the default does nothing.
    fn prefetch(&self, entry: Self::Ref) {
        let _ = entry;
    }
}

/// How far ahead in a list the engine asks its store to prefetch ([`Store::prefetch`]):
/// enough misses in flight to cover a memory latency per entry handled. 8 measured
/// best on the 2-core VM (docs/benchmarks.md, the firehose row).
pub(crate) const PREFETCH_AHEAD: usize = 8;

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
    /// The draining batch, if any (ground rules).
    draining: Option<Draining<R>>,
}

/// A slot's (or the overdue list's) entries that a bounded advance took out of the
/// wheel and has not finished handing out (ground rules).
struct Draining<R> {
    /// The list they came from; their places still name it.
    from: u16,
    /// The entries; `entries[next..]` still wait.
    entries: Vec<R>,
    /// The first entry not yet handed out.
    next: usize,
}

impl<R: Copy + PartialEq> Draining<R> {
    /// Whether `entry`, whose place is `place`, waits in this batch.
    fn holds(&self, place: Place, entry: R) -> bool {
        let position = place.position as usize;
        place.list == self.from
            && position >= self.next
            && self.entries.get(position) == Some(&entry)
    }
}

impl<R: Copy + PartialEq + core::fmt::Debug> Wheel<R> {
    /// An empty wheel at tick `now`.
    pub(crate) fn new(now: u64) -> Self {
        Wheel {
            now,
            levels: Box::new([const { Level::new() }; NUM_LEVELS]),
            overdue: Vec::new(),
            draining: None,
        }
    }

    /// Gives every slot list of the two lowest levels, and the overdue list, a vector
    /// of at least `capacity` references now, allocated by the calling thread (see
    /// [`ShardCore::anchor_lists`](crate::shard::core::ShardCore::anchor_lists) for
    /// why a shard does this on its own thread).
    pub(crate) fn reserve_lists(&mut self, capacity: usize) {
        for level in self.levels.iter_mut().take(2) {
            for list in &mut level.slots {
                list.reserve(capacity.saturating_sub(list.len()));
            }
        }
        self.overdue
            .reserve(capacity.saturating_sub(self.overdue.len()));
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
        if let Some(batch) = self
            .draining
            .as_mut()
            .filter(|batch| batch.holds(place, entry))
        {
            // The last waiting entry takes its position (the order within a batch, all
            // due by one tick, is not promised), keeping the list it names.
            batch.entries.swap_remove(place.position as usize);
            if let Some(&moved) = batch.entries.get(place.position as usize) {
                store.set_place(moved, place);
            }
            if batch.next == batch.entries.len() {
                self.retire_batch();
            }
            return;
        }
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
        if !self.overdue.is_empty() || self.draining.is_some() {
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
        let finished = self.advance_bounded(store, now, usize::MAX, expired);
        debug_assert!(finished, "engine invariant: an unbounded advance finishes");
    }

    /// As [`advance`](Self::advance), handing at most `budget` due entries to
    /// `expired` (entries filed again because they are not due yet are not counted).
    /// Returns `true` if everything due by `now` was handed out and the wheel stands at
    /// `now`; `false` if the budget ran out first: then [`next_expiry`](Self::next_expiry)
    /// is at or before `now`, so the caller knows to call again.
    ///
    /// Order (ground rules): the draining batch (the backlog) gets half the budget
    /// first; then what came due since the last call (the overdue list, then slots in
    /// tick order, each only if it fits whole while a backlog drains) gets the rest;
    /// then the backlog gets what that left. So entries come out in deadline order,
    /// except that a timer coming due during a backlog does not wait for the whole
    /// backlog; an unbounded advance keeps deadline order.
    pub(crate) fn advance_bounded<S: Store<Ref = R>>(
        &mut self,
        store: &mut S,
        now: u64,
        budget: usize,
        expired: &mut impl FnMut(&mut S, R),
    ) -> bool {
        // The backlog's half first (it is older than anything that came due since).
        let mut reserved = budget / 2;
        self.work_backlog(store, &mut reserved, expired);
        let mut left = budget - budget / 2;
        if self.draining.is_none() {
            // No backlog (left): what came due since may have the whole budget.
            left += reserved;
            reserved = 0;
        }
        // Each round: what came due since, then the backlog. A backlog taken from a
        // higher-level slot re-files its entries that are not due yet as it is worked
        // through, against the current tick, which is behind `now` until the round
        // ends; so the wheel may hold entries due by `now` again after the backlog
        // empties, and the round repeats until nothing held is due by `now` (then, and
        // only then, the wheel may stand at `now`) or the budget is spent. A round
        // that repeats has emptied the backlog, and each repeat files entries only at
        // lower levels, so this ends.
        loop {
            let was_draining = self.draining.is_some();
            let mut reached = self.yield_overdue(&mut left, store, expired);
            if !was_draining && self.draining.is_some() {
                // The overdue list became the backlog: half of what is left is its.
                let half = left / 2;
                reserved += half;
                left -= half;
            }
            while reached {
                let Some((level, slot, start)) = self.next_occupied() else {
                    break;
                };
                if start > now {
                    break;
                }
                debug_assert!(
                    start >= self.now,
                    "engine invariant: slot start {start} before now {}",
                    self.now
                );
                let count = self.levels[level].slots[slot].len();
                if left == 0 || (count > left && self.draining.is_some()) {
                    // Due, and this call cannot take it: the next call starts here.
                    reached = false;
                    break;
                }
                self.now = start;
                let lvl = &mut self.levels[level];
                lvl.occupied &= !(1u64 << slot);
                let mut entries = core::mem::take(&mut lvl.slots[slot]);
                let list = (level * SLOTS_PER_LEVEL + slot) as u16;
                let mut handed = 0;
                prefetch_first(store, &entries);
                while handed < entries.len() && left > 0 {
                    prefetch_ahead(store, &entries, handed);
                    let entry = entries[handed];
                    handed += 1;
                    left -= self.hand_out(store, entry, start, expired);
                }
                if handed < entries.len() {
                    // Out of budget mid-slot: the rest drains from here. (No batch
                    // drains already: then only a slot that fits whole is taken, and
                    // each entry uses at most one unit of budget.)
                    debug_assert!(self.draining.is_none(), "engine invariant: one backlog");
                    self.draining = Some(Draining {
                        from: list,
                        entries,
                        next: handed,
                    });
                    reached = false;
                    break;
                }
                // Entries cascade only to lower levels, so this slot is still empty. Its
                // vector stays for the slot's next fill ([`recycle`]).
                recycle(&mut entries);
                self.levels[level].slots[slot] = entries;
            }
            left += reserved;
            reserved = 0;
            self.work_backlog(store, &mut left, expired);
            if !reached || self.draining.is_some() {
                return false;
            }
            let due_held = !self.overdue.is_empty()
                || self
                    .next_occupied()
                    .is_some_and(|(_, _, start)| start <= now);
            if !due_held {
                self.now = self.now.max(now);
                return true;
            }
            if left == 0 {
                // Due entries the backlog re-filed wait for the next call, which
                // `next_expiry` (at or before `now`) announces.
                return false;
            }
        }
    }

    /// Works through the backlog (the draining batch) while `left` allows.
    fn work_backlog<S: Store<Ref = R>>(
        &mut self,
        store: &mut S,
        left: &mut usize,
        expired: &mut impl FnMut(&mut S, R),
    ) {
        let Some(batch) = &mut self.draining else {
            return;
        };
        let (entries, mut next) = (core::mem::take(&mut batch.entries), batch.next);
        // Against the current tick, not the one the batch was taken at: slots after
        // the batch's may have come due since, and an entry of the batch due by now
        // (a cascading entry, or one reset later) comes out now, before anything filed
        // after it, rather than going to the back of the overdue list. An entry not
        // due yet is filed where it belongs from the current tick.
        prefetch_first(store, &entries[next..]);
        while next < entries.len() && *left > 0 {
            prefetch_ahead(store, &entries, next);
            let entry = entries[next];
            next += 1;
            *left -= self.hand_out(store, entry, self.now, expired);
        }
        let batch = self.draining.as_mut().expect("still draining");
        batch.entries = entries;
        batch.next = next;
        if next == batch.entries.len() {
            self.retire_batch();
        }
    }

    /// Ends the draining batch, every entry of it handed out or removed, and gives its
    /// vector ([`recycle`]d) back to the list it came from when that list's own is
    /// smaller (that list got a fresh, empty vector when the batch was taken, and may
    /// have grown a little since): a slot that drained as a batch then keeps its
    /// retained capacity, and the vector the shard allocated for it
    /// ([`reserve_lists`](Self::reserve_lists)), as one that drained whole does,
    /// instead of growing a new one from nothing, possibly in a producer's arena.
    fn retire_batch(&mut self) {
        let Some(batch) = self.draining.take() else {
            return;
        };
        let mut recycled = batch.entries;
        recycle(&mut recycled);
        let (list, _) = self.list_mut(batch.from);
        if list.capacity() < recycled.capacity() {
            // Same entries at the same positions: every store place stays true.
            recycled.extend_from_slice(list);
            *list = recycled;
        }
    }

    /// Yields the overdue list within `left`, in order if it fits. If it does not: it
    /// becomes the draining batch if none drains, else it gives up `left` entries from
    /// its end (no other entry moves). Returns whether it is empty now.
    fn yield_overdue<S: Store<Ref = R>>(
        &mut self,
        left: &mut usize,
        store: &mut S,
        expired: &mut impl FnMut(&mut S, R),
    ) -> bool {
        if self.overdue.is_empty() {
            return true;
        }
        if self.overdue.len() <= *left {
            *left -= self.overdue.len();
            let mut overdue = core::mem::take(&mut self.overdue);
            for &entry in &overdue {
                expired(store, entry);
            }
            overdue.clear();
            self.overdue = overdue;
            return true;
        }
        if self.draining.is_none() {
            self.draining = Some(Draining {
                from: OVERDUE_LIST,
                entries: core::mem::take(&mut self.overdue),
                next: 0,
            });
            return true;
        }
        while *left > 0 {
            let entry = self.overdue.pop().expect("longer than the budget");
            *left -= 1;
            expired(store, entry);
        }
        false
    }

    /// One entry out of a slot (or batch) taken at tick `tick`: handed to `expired` if
    /// due by then (returns 1, the budget it used), else filed where it now belongs (a
    /// higher slot cascading, or an entry whose deadline moved later since it was
    /// filed; returns 0).
    fn hand_out<S: Store<Ref = R>>(
        &mut self,
        store: &mut S,
        entry: R,
        tick: u64,
        expired: &mut impl FnMut(&mut S, R),
    ) -> usize {
        let deadline = store.deadline(entry);
        if deadline <= tick {
            expired(store, entry);
            1
        } else {
            self.file(store, entry, deadline);
            0
        }
    }

    /// Hands every held entry to `each`, in no particular order, leaving the wheel
    /// empty at the same tick.
    pub(crate) fn drain(&mut self, each: &mut impl FnMut(R)) {
        if let Some(batch) = self.draining.take() {
            for &entry in &batch.entries[batch.next..] {
                each(entry);
            }
        }
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

    /// Whether an entry due at tick `deadline`, filed now, would find a free place in
    /// its list's vector: filing it would allocate nothing.
    pub(crate) fn has_room_for(&self, deadline: u64) -> bool {
        let entries = if deadline <= self.now {
            &self.overdue
        } else {
            let level = level_for(self.now, deadline);
            &self.levels[level].slots[slot_for(deadline, level)]
        };
        entries.len() < entries.capacity()
    }

    /// The capacity of list `list`'s vector (`level * 64 + slot`, or [`OVERDUE_LIST`]).
    #[cfg(test)]
    pub(crate) fn list_capacity(&mut self, list: u16) -> usize {
        self.list_mut(list).0.capacity()
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
