//! [`TimerId`] and [`TimerState`]: the vocabulary every other module shares, at the
//! bottom of the import graph (this file imports nothing of the crate but the shim).

#![forbid(unsafe_code)]

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Ids a thread takes from the shared counter at once.
const BLOCK: u64 = 1 << 12;
/// Ids are 48 bits wide (the entry header keeps 48; see `entry.rs`).
const ID_MASK: u64 = (1 << 48) - 1;

/// The first id of the next unused block. Touched once per thread per [`BLOCK`]
/// timers, never on the hot path. A `std` static even under loom (loom atomics cannot
/// be statics): it guards no memory, it only keeps ids unique.
static NEXT_BLOCK: AtomicU64 = AtomicU64::new(BLOCK);

#[cfg(not(loom))]
std::thread_local! {
    /// The next id this thread hands out and the end of its block (`0, 0`: none yet).
    static BLOCK_OF_THREAD: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

#[cfg(loom)]
loom::thread_local! {
    /// As above, per model thread.
    static BLOCK_OF_THREAD: Cell<(u64, u64)> = Cell::new((0, 0));
}

/// The state of a timer. See the crate docs for the transitions.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum TimerState {
    /// Neither fired nor cancelled yet.
    Pending,
    /// Its deadline passed and its callback was handed to the executor (it may still
    /// be running, or have finished).
    Fired,
    /// A [`TimerHandle::cancel`](crate::TimerHandle::cancel) won (or its `Unfired` was
    /// dropped): the callback never runs.
    Cancelled,
}

/// A timer's unique id, made without touching a shared counter on the hot path: each
/// thread takes a block of 4,096 ids from a process-wide counter, then hands them out
/// one by one.
///
/// Ids are 48 bits wide, so that a timer's header stays 32 bytes. They are unique
/// within the process until 2^48 ids have been handed out in blocks: at 10 million
/// timers a second without pause, about 325 days; a program that starts a thousand
/// new scheduling threads a second (each takes a block) runs two years. After that
/// they wrap and may repeat. They display as a decimal number below 2^48.
///
/// # Examples
///
/// ```
/// let timer = sharded_timer::ShardedTimer::new();
/// let a = timer.schedule(std::time::Duration::from_secs(60), || {}).unwrap();
/// let b = timer.schedule(std::time::Duration::from_secs(60), || {}).unwrap();
/// assert_ne!(a.id(), b.id());
/// println!("{}", a.id()); // e.g. "65536"
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct TimerId(u64);

impl TimerId {
    /// A fresh id from the calling thread's block.
    pub(crate) fn next() -> TimerId {
        BLOCK_OF_THREAD.with(|block| {
            let (mut next, mut end) = block.get();
            if next == end {
                // ORDERING: Relaxed: uniqueness comes from the RMW alone.
                next = NEXT_BLOCK.fetch_add(BLOCK, Ordering::Relaxed);
                end = next.wrapping_add(BLOCK);
            }
            block.set((next + 1, end));
            TimerId(next & ID_MASK)
        })
    }

    /// The id as the entry header stores it: the low 32 bits and the next 16.
    pub(crate) fn to_parts(self) -> (u32, u16) {
        (self.0 as u32, (self.0 >> 32) as u16)
    }

    /// The id [`to_parts`](Self::to_parts) split.
    pub(crate) fn from_parts(low: u32, high: u16) -> TimerId {
        TimerId((u64::from(high) << 32) | u64::from(low))
    }

    /// An id with the given bits (tests).
    #[cfg(test)]
    pub(crate) fn from_raw(bits: u64) -> TimerId {
        TimerId(bits)
    }

    /// The shard this id routes to, among `shards`: Fibonacci hashing of the id
    /// without its low 6 bits (Knuth, TAOCP vol. 3, §6.4: the product with 2^64/φ),
    /// scaled to the shard count by its top 32 bits (multiply and shift, not a
    /// remainder), so each run of 64 consecutive timers of one thread goes to one shard
    /// (that ring's tail stays in the thread's cache for the run) and successive runs
    /// spread over all shards, whatever their count: the points k/φ (mod 1) of
    /// consecutive k leave gaps of at most two lengths (the three-distance theorem), so
    /// any 2 × `shards` successive runs reach every shard. (A remainder of the hash,
    /// as before, spread evenly only over a power of two: an outside audit saw 6
    /// successive runs on one of 3 shards.)
    pub(crate) fn shard_index(self, shards: usize) -> usize {
        let hash = (self.0 >> 6).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
        ((u128::from(hash) * shards as u128) >> 32) as usize
    }
}

impl fmt::Display for TimerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{TimerId, BLOCK};
    use std::collections::HashSet;

    #[test]
    fn the_header_halves_round_trip_every_48_bit_id() {
        for bits in [0, 1, u64::from(u32::MAX), 1 << 32, (1 << 48) - 1] {
            let (low, high) = TimerId::from_raw(bits).to_parts();
            assert_eq!(TimerId::from_parts(low, high), TimerId::from_raw(bits));
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "hands out 4,106 ids into a HashSet and spawns threads: slow under Miri, and no unsafe"
    )]
    fn ids_are_unique_across_blocks_and_threads() {
        let mut seen = HashSet::new();
        for _ in 0..(BLOCK + 10) {
            assert!(
                seen.insert(TimerId::next()),
                "one thread, across a block edge"
            );
        }
        let others: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..1000).map(|_| TimerId::next()).collect::<Vec<_>>()))
            .collect();
        for ids in others {
            for id in ids.join().unwrap() {
                assert!(seen.insert(id), "ids of other threads never repeat ours");
            }
        }
    }
}
