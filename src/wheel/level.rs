//! One level of the timing wheel: 64 slots, an occupancy bitmap, and the pure
//! arithmetic that maps a deadline tick to a level and a slot.
//!
//! # Algorithm
//!
//! Level `L` has 64 slots, each covering `64^L` ticks. A deadline is filed at the
//! level of the highest 6-bit group in which it differs from the current tick
//! (`deadline ^ now`), in the slot given by that group of the deadline. Entries at
//! level `L` therefore always lie inside the current tick's level-`L + 1` slot and
//! strictly after the current tick's level-`L` slot. The `occupied` bitmap makes
//! "the next occupied slot" a bit scan, as in the Linux and tokio wheels.

#![forbid(unsafe_code)]

/// Bits of the tick number consumed by one level.
pub(crate) const BITS_PER_LEVEL: u32 = 6;
/// Slots in one level (`2^BITS_PER_LEVEL`).
pub(crate) const SLOTS_PER_LEVEL: usize = 1 << BITS_PER_LEVEL;
/// Levels in the wheel: `ceil(64 / 6)`, so that every `u64` tick has a slot and no
/// deadline ever needs an overflow list.
pub(crate) const NUM_LEVELS: usize = 11;
/// Mask of the slot bits within one level.
const SLOT_MASK: u64 = SLOTS_PER_LEVEL as u64 - 1;

/// A drained slot list keeps its allocation for reuse up to this many indices; a
/// larger one is shrunk to it (the engine's `recycle`), so memory follows the entries
/// held rather than the peak of every slot (a high level's slot can briefly hold
/// millions).
pub(crate) const RETAINED_LIST_CAPACITY: usize = 1024;

/// One level: the entry references held in each slot and a bitmap of the non-empty
/// slots.
pub(crate) struct Level<R> {
    /// Bit `s` is set iff slot `s` holds at least one entry (`slots[s]` is non-empty).
    pub(crate) occupied: u64,
    /// References (slab indices, or entry pointers in a shard) of the entries in each
    /// slot, in no particular order.
    pub(crate) slots: [Vec<R>; SLOTS_PER_LEVEL],
}

impl<R> Level<R> {
    /// An empty level.
    pub(crate) const fn new() -> Self {
        Level {
            occupied: 0,
            slots: [const { Vec::new() }; SLOTS_PER_LEVEL],
        }
    }

    /// The lowest occupied slot, if any.
    pub(crate) fn first_occupied(&self) -> Option<usize> {
        if self.occupied == 0 {
            None
        } else {
            Some(self.occupied.trailing_zeros() as usize)
        }
    }
}

impl<R> core::fmt::Debug for Level<R> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Level {{ occupied: {:#018x} }}", self.occupied)
    }
}

/// The level at which `deadline` is filed when the wheel's current tick is `now`.
///
/// Requires `deadline > now`; the result is in `0..NUM_LEVELS`.
pub(crate) fn level_for(now: u64, deadline: u64) -> usize {
    debug_assert!(
        deadline > now,
        "level_for needs deadline {deadline} > now {now}"
    );
    let highest_differing_bit = 63 - (now ^ deadline).leading_zeros();
    (highest_differing_bit / BITS_PER_LEVEL) as usize
}

/// The slot of `tick` within `level`.
pub(crate) fn slot_for(tick: u64, level: usize) -> usize {
    ((tick >> (BITS_PER_LEVEL * level as u32)) & SLOT_MASK) as usize
}

/// The first tick covered by `slot` of `level`, within the level-`level + 1` slot
/// that contains `now`.
pub(crate) fn slot_start(now: u64, level: usize, slot: usize) -> u64 {
    let shift = BITS_PER_LEVEL * level as u32;
    let block_bits = shift + BITS_PER_LEVEL;
    let block_base = if block_bits >= 64 {
        0
    } else {
        now & !((1u64 << block_bits) - 1)
    };
    block_base | ((slot as u64) << shift)
}

#[cfg(test)]
mod tests {
    use super::{level_for, slot_for, slot_start, NUM_LEVELS};

    #[test]
    fn level_boundaries_at_every_level_edge() {
        assert_eq!(level_for(0, 1), 0);
        assert_eq!(level_for(0, 63), 0);
        assert_eq!(level_for(0, 64), 1);
        assert_eq!(level_for(0, 4095), 1);
        assert_eq!(level_for(0, 4096), 2);
        for level in 1..NUM_LEVELS {
            let edge = 1u64 << (6 * level as u32);
            assert_eq!(level_for(0, edge - 1), level - 1, "below edge of {level}");
            assert_eq!(level_for(0, edge), level, "at edge of {level}");
        }
        assert_eq!(level_for(0, u64::MAX), NUM_LEVELS - 1);
        assert_eq!(level_for(u64::MAX - 1, u64::MAX), 0);
        // Same level-1 slot as `now`: level 0 even if 60 ticks apart.
        assert_eq!(level_for(64, 127), 0);
        // Crossing into the next level-1 slot by one tick: level 1.
        assert_eq!(level_for(127, 128), 1);
    }

    #[test]
    fn slot_boundaries() {
        assert_eq!(slot_for(63, 0), 63);
        assert_eq!(slot_for(64, 0), 0);
        assert_eq!(slot_for(64, 1), 1);
        assert_eq!(slot_for(4095, 1), 63);
        assert_eq!(slot_for(4096, 1), 0);
        assert_eq!(slot_for(4096, 2), 1);
        assert_eq!(slot_for(u64::MAX, 10), 15);
        assert_eq!(slot_for(u64::MAX, 0), 63);
    }

    #[test]
    fn slot_start_is_the_first_tick_of_the_slot() {
        assert_eq!(slot_start(0, 0, 5), 5);
        assert_eq!(slot_start(70, 0, 9), 73);
        assert_eq!(slot_start(70, 1, 2), 128);
        assert_eq!(slot_start(5000, 1, 63), 4096 + 63 * 64);
        assert_eq!(slot_start(0, 10, 15), 15 << 60);
        assert_eq!(slot_start(u64::MAX - 5, 0, 63), u64::MAX);
        // A deadline's own slot starts at or before it, at every level.
        for &(now, deadline) in &[
            (0u64, 1u64),
            (0, 64),
            (3, 4095),
            (0, u64::MAX),
            (1 << 40, (1 << 41) + 7),
        ] {
            let level = level_for(now, deadline);
            let start = slot_start(now, level, slot_for(deadline, level));
            assert!(
                start <= deadline && start > now,
                "now {now} deadline {deadline} start {start}"
            );
        }
    }
}
