//! The process's free chunks, kept for reuse rather than returned to the global
//! allocator at once.
//!
//! A chunk whose blocks have all come back is retired. Most retired chunks used to go
//! straight back to `malloc`, which gives a wholly free region of its heap back to
//! the kernel (its trim), so the next burst of timers faulted every page in again and
//! had the kernel zero it: in a process that made a million timers, freed them and
//! made a million more on a new thread, entry blocks took 42 % of the second million's
//! page faults (`perf record -e page-faults`; the caller's vector of handles and the
//! wheel's slot vectors took the rest), and keeping their chunks cut the schedule from
//! 85–88 to 66–78 CPU ns per timer (issue 30, `--compare`), a cost that memory kept in
//! `malloc`'s own free lists does not pay. The cache keeps up to
//! [`CACHE_LIMIT`] chunks, their pages resident, for any thread's heap to start afresh
//! from; beyond that a retired chunk goes back to the allocator as before. It is a
//! plain lock: taken once per chunk made or retired (a chunk holds 680 entries of 48
//! bytes), never per timer.
//!
//! [`CACHE_LIMIT`]: super::CACHE_LIMIT

use std::sync::{Mutex, MutexGuard, PoisonError};

/// A free chunk's address.
struct Free(*mut u8);

// SAFETY: a cached chunk is referred to by nothing but its entry in the cache
// (`ChunkCache::keep`'s contract), so whichever thread takes it owns it alone.
unsafe impl Send for Free {}

/// Free chunks, at most `limit` of them.
pub(super) struct ChunkCache {
    /// The chunks; its capacity is reserved whole at the first keep.
    free: Mutex<Vec<Free>>,
    /// The most chunks kept.
    limit: usize,
}

impl ChunkCache {
    /// An empty cache that keeps at most `limit` chunks.
    pub(super) const fn new(limit: usize) -> Self {
        ChunkCache {
            free: Mutex::new(Vec::new()),
            limit,
        }
    }

    /// The chunks, poison ignored (a panic while pushing or popping leaves the
    /// vector valid).
    fn free(&self) -> MutexGuard<'_, Vec<Free>> {
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `chunk` for reuse, or gives it back if the cache is full.
    ///
    /// # Safety
    ///
    /// Nothing refers to `chunk` any more, and it is a chunk of the pool's layout,
    /// whose memory is valid until deallocated.
    pub(super) unsafe fn keep(&self, chunk: *mut u8) -> Option<*mut u8> {
        let mut free = self.free();
        if free.len() >= self.limit {
            return Some(chunk);
        }
        if free.capacity() == 0 {
            // Reserved whole, once: so that keeping a chunk allocates nothing
            // after the first time.
            free.reserve_exact(self.limit);
        }
        free.push(Free(chunk));
        None
    }

    /// A kept chunk, if there is one: the caller owns it.
    pub(super) fn take(&self) -> Option<*mut u8> {
        self.free().pop().map(|chunk| chunk.0)
    }

    /// How many chunks are kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.free().len()
    }
}

impl core::fmt::Debug for ChunkCache {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ChunkCache")
            .field("kept", &self.free().len())
            .field("limit", &self.limit)
            .finish()
    }
}

/// The process's cache.
pub(super) static CHUNKS: ChunkCache = ChunkCache::new(super::CACHE_LIMIT);
