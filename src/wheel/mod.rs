//! A hierarchical hashed timing wheel over tick numbers: pure, single-threaded and
//! clock-free, so it can be driven deterministically by tests and by any event loop.
//!
//! # Algorithm
//!
//! Varghese & Lauck, "Hashed and Hierarchical Timing Wheels" (SOSP 1987), scheme 7
//! (hierarchical wheels), with a per-level occupancy bitmap as in the Linux kernel's
//! and tokio's wheels so that the next occupied slot is found by a bit scan rather than
//! by stepping through empty ticks.
//!
//! - 11 levels of 64 slots; slot `s` of level `L` covers `64^L` ticks. Together they
//!   cover the whole `u64` tick range, so a deadline never overflows the wheel: at a
//!   1 ms tick, level 5 alone reaches 64^6 ms ≈ 2.2 years and the top level reaches
//!   `u64::MAX`.
//! - An entry is filed at the level of the highest 6-bit group in which its deadline
//!   differs from the current tick. When the current tick reaches the start of a
//!   higher-level slot, that slot's entries *cascade*: they are re-filed at lower
//!   levels (or expire, if due). Each entry cascades at most `NUM_LEVELS - 1` times.
//! - Entries live in a slab; each slot is a vector of slab indices and each node
//!   records its position, so insert and remove (a `swap_remove`) are O(1), and a
//!   [`WheelKey`] carries a generation that makes a stale key miss.
//!
//! # Units
//!
//! Every `u64` in this API is a tick: the wheel neither knows nor cares how long a tick
//! is. A *deadline* is the first tick at which an entry is due; *now* is the wheel's
//! current tick.

#![forbid(unsafe_code)]

mod engine;
mod level;
mod slab;
#[cfg(test)]
mod tests;

use slab::Slab;

pub(crate) use engine::{Place, Store, Wheel};

/// Names one entry inserted into a [`TimingWheel`].
///
/// A key stays valid until its entry is removed or expires; after that it is *stale*
/// and [`TimingWheel::remove`] returns `None` for it, even if its storage has been
/// reused (each reuse bumps a 32-bit generation; a key would only alias after the same
/// storage was reused 2^32 times while the stale key was kept).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct WheelKey {
    /// Slab index of the entry.
    index: u32,
    /// Generation of the slab node when the entry was inserted.
    generation: u32,
}

/// A hierarchical hashed timing wheel holding values of type `T` keyed by deadline
/// tick.
///
/// | call | cost |
/// | --- | --- |
/// | [`insert`](Self::insert), [`remove`](Self::remove) | O(1) (amortised: vectors grow) |
/// | [`next_expiry`](Self::next_expiry) | O(levels) = O(1): one bit scan per level |
/// | [`advance`](Self::advance), [`advance_bounded`](Self::advance_bounded) | O(1) per expired entry plus O(1) per cascade (at most 10 per entry), independent of the number of ticks advanced |
///
/// Memory: a 24-byte slab node plus `size_of::<T>()` (rounded up to 8) and a 4-byte
/// slot index per entry, plus the vectors' spare capacity, plus 17 KiB of empty slot
/// vectors per wheel. [`with_capacity`](Self::with_capacity) avoids the slab's growth
/// slack when the size is known.
///
/// # Examples
///
/// ```
/// use sharded_timer::wheel::TimingWheel;
///
/// let mut wheel = TimingWheel::new(0);
/// let late = wheel.insert(100, "late");
/// wheel.insert(10, "soon");
/// assert_eq!(wheel.next_expiry(), Some(10));
///
/// let mut fired = Vec::new();
/// wheel.advance(50, &mut |deadline, value| fired.push((deadline, value)));
/// assert_eq!(fired, [(10, "soon")]);
///
/// assert_eq!(wheel.remove(late), Some("late"));
/// assert_eq!(wheel.remove(late), None); // stale key
/// assert!(wheel.is_empty());
/// ```
pub struct TimingWheel<T> {
    /// The levels and overdue list, holding slab indices.
    wheel: Wheel<u32>,
    /// Storage for every entry: deadline, place and value.
    slab: Slab<T>,
}

impl<T> Store for Slab<T> {
    type Ref = u32;
    fn deadline(&self, index: u32) -> u64 {
        Slab::deadline(self, index)
    }
    fn place(&self, index: u32) -> Place {
        let (list, position) = Slab::place(self, index);
        Place { list, position }
    }
    fn set_place(&mut self, index: u32, place: Place) {
        Slab::set_place(self, index, place.list, place.position);
    }
}

impl<T> TimingWheel<T> {
    /// A wheel whose current tick is `now`.
    ///
    /// # Panics
    ///
    /// Never.
    pub fn new(now: u64) -> Self {
        Self::with_capacity(now, 0)
    }

    /// A wheel whose current tick is `now`, with storage for `capacity` entries
    /// allocated up front.
    ///
    /// # Panics
    ///
    /// If the allocation fails or `capacity` overflows `isize::MAX` bytes.
    pub fn with_capacity(now: u64, capacity: usize) -> Self {
        TimingWheel {
            wheel: Wheel::new(now),
            slab: Slab::with_capacity(capacity),
        }
    }

    /// The current tick: the last `now` passed to [`advance`](Self::advance), or the
    /// one given to [`new`](Self::new).
    pub fn now(&self) -> u64 {
        self.wheel.now()
    }

    /// The number of entries held.
    pub fn len(&self) -> usize {
        self.slab.len()
    }

    /// Whether the wheel holds no entry.
    pub fn is_empty(&self) -> bool {
        self.slab.len() == 0
    }

    /// The number of entries the wheel can hold before its storage grows.
    pub fn capacity(&self) -> usize {
        self.slab.capacity()
    }

    /// Inserts `value`, due at tick `deadline`, in O(1).
    ///
    /// A `deadline` at or before [`now`](Self::now) counts as due at the current tick:
    /// the entry comes out of the next [`advance`](Self::advance), before anything due
    /// later, and is yielded with the `deadline` given here. Any `u64` is accepted,
    /// up to `u64::MAX`.
    ///
    /// # Panics
    ///
    /// Only if `u32::MAX - 1` entries are already held.
    pub fn insert(&mut self, deadline: u64, value: T) -> WheelKey {
        let (index, generation) = self.slab.insert(deadline, value);
        self.wheel.insert(&mut self.slab, index);
        WheelKey { index, generation }
    }

    /// Removes the entry named by `key` in O(1) and returns its value, or `None` if
    /// the key is stale (the entry was already removed or has expired).
    pub fn remove(&mut self, key: WheelKey) -> Option<T> {
        if !self.slab.is_live(key.index, key.generation) {
            return None;
        }
        self.wheel.remove(&mut self.slab, key.index);
        Some(self.slab.take(key.index).1)
    }

    /// The tick at which [`advance`](Self::advance) next has work to do, in O(1).
    ///
    /// `None` when the wheel is empty. Otherwise a tick that is never later than the
    /// earliest deadline held, and after [`now`](Self::now) unless an entry is already
    /// overdue, or left due by an [`advance_bounded`](Self::advance_bounded) (then it
    /// is `now`). It may be earlier than the earliest deadline when
    /// the earliest entry sits in a higher level's slot that must first cascade;
    /// advancing to it always makes progress (yields or cascades), so a caller may
    /// sleep exactly until it.
    pub fn next_expiry(&self) -> Option<u64> {
        self.wheel.next_expiry()
    }

    /// Moves the current tick forward to `now` and calls `expired(deadline, value)`
    /// for every entry due at or before it, removing it.
    ///
    /// Each entry is yielded exactly once, at the first `advance` whose `now` is at or
    /// after its deadline, with the deadline it was inserted with, in non-decreasing
    /// deadline order (any order within one tick; overdue entries first). A `now`
    /// before the current tick does not move the wheel backwards: it only yields the
    /// overdue entries. The cost is O(1) per entry yielded or cascaded and does not
    /// depend on how many ticks are skipped: advancing from 0 to 10^12 over three
    /// entries does at most a few dozen steps.
    pub fn advance(&mut self, now: u64, expired: &mut impl FnMut(u64, T)) {
        self.wheel.advance(&mut self.slab, now, &mut |slab, index| {
            let (deadline, value) = slab.take(index);
            expired(deadline, value);
        });
    }

    /// As [`advance`](Self::advance), but yields at most `budget` entries, so that a
    /// caller can do other work in the middle of a burst (a shard drains its rings,
    /// and a cancel issued meanwhile wins for an entry not yet yielded). Each call costs
    /// O(1) per entry yielded or cascaded, however large the slot it stops in.
    ///
    /// Returns `true` when everything due by `now` has been yielded and the current
    /// tick is `now`; `false` when the budget ran out first (with entries still due, or
    /// a slot still to cascade, by `now`): then the entries still due stay held
    /// (removable with their keys), [`next_expiry`](Self::next_expiry) is at or before
    /// `now`, and the next call goes on. A `budget` of 0 yields nothing and returns
    /// `false` if anything is due.
    ///
    /// Order: a slot with more due entries than the budget left becomes a *backlog*
    /// that later calls work through in order; while one is worked through, each call
    /// gives half its budget to what came due since (overdue entries, then slots in
    /// tick order, each slot only if it fits whole) and the rest, at least half, to the
    /// backlog. So entries come out tick by tick, except that an entry coming due
    /// during a backlog need not wait for all of it; no entry waits for ever (the
    /// backlog always moves). Within a tick, and among overdue entries, no order is
    /// promised.
    ///
    /// # Examples
    ///
    /// ```
    /// use sharded_timer::wheel::TimingWheel;
    ///
    /// let mut wheel = TimingWheel::new(0);
    /// for value in 0..5 {
    ///     wheel.insert(10, value);
    /// }
    /// let mut fired = Vec::new();
    /// assert!(!wheel.advance_bounded(10, 2, &mut |_, value| fired.push(value)));
    /// assert_eq!(fired, [0, 1]);
    /// assert!(wheel.advance_bounded(10, 8, &mut |_, value| fired.push(value)));
    /// assert_eq!(fired, [0, 1, 2, 3, 4]);
    /// ```
    pub fn advance_bounded(
        &mut self,
        now: u64,
        budget: usize,
        expired: &mut impl FnMut(u64, T),
    ) -> bool {
        self.wheel
            .advance_bounded(&mut self.slab, now, budget, &mut |slab, index| {
                let (deadline, value) = slab.take(index);
                expired(deadline, value);
            })
    }
}

impl<T> core::fmt::Debug for TimingWheel<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TimingWheel")
            .field("now", &self.now())
            .field("len", &self.len())
            .field("next_expiry", &self.next_expiry())
            .finish()
    }
}

impl<T> Default for TimingWheel<T> {
    /// A wheel at tick 0.
    fn default() -> Self {
        Self::new(0)
    }
}
