//! A counting global allocator: exact bytes allocated, for "bytes per pending timer"
//! (RSS moves in pages and never shrinks, so it cannot show a per-timer cost).

//!
//! The count is striped by CPU: one counter per CPU (modulo [`STRIPES`]), each on its
//! own cache line, summed when read. A single counter cost every allocation and free a
//! locked instruction on a line all cores share (12 % of the samples of the async
//! timeouts comparison on 2 cores), a cost no user of any peer pays, and one that
//! penalised each peer by its number of allocations rather than by their price.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use crossbeam_utils::CachePadded;

/// Wraps the system allocator and counts live bytes.
#[derive(Debug)]
pub struct CountingAllocator;

/// Counters: a free on another CPU than its allocation moves bytes between stripes,
/// so a stripe may go negative; the sum is exact.
const STRIPES: usize = 64;

/// Bytes allocated minus bytes freed on each stripe (requested sizes, not chunks).
static ALLOCATED: [CachePadded<AtomicIsize>; STRIPES] =
    [const { CachePadded::new(AtomicIsize::new(0)) }; STRIPES];

/// The calling thread's stripe: its CPU (glibc answers from the rseq area, no
/// system call), or stripe 0 where that is unknown.
fn stripe() -> &'static AtomicIsize {
    #[cfg(target_os = "linux")]
    // SAFETY: `sched_getcpu` takes no arguments and has no preconditions; it returns
    // -1 on error (then stripe 0). It does not allocate, so it may run in `alloc`.
    let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).unwrap_or(0);
    #[cfg(not(target_os = "linux"))]
    let cpu = 0;
    &ALLOCATED[cpu % STRIPES]
}

/// Adds `bytes` (negative: freed) to the calling thread's stripe.
fn count(bytes: isize) {
    // ORDERING: Relaxed: a statistic; no memory is published through it.
    stripe().fetch_add(bytes, Ordering::Relaxed);
}

/// The size of a layout as a signed count (allocations never exceed `isize::MAX`).
fn signed(size: usize) -> isize {
    isize::try_from(size).unwrap_or(isize::MAX)
}

/// Bytes currently allocated by the whole process.
pub fn allocated() -> usize {
    let total: isize = ALLOCATED
        .iter()
        // ORDERING: Relaxed: a statistic sampled between phases.
        .map(|stripe| stripe.load(Ordering::Relaxed))
        .sum();
    usize::try_from(total).unwrap_or(0)
}

// SAFETY: every method forwards to `System` with the same arguments and only adds a
// Relaxed counter update (which does not allocate), so `System`'s guarantees carry over unchanged.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(signed(layout.size()));
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-signed(layout.size()));
        // SAFETY: the caller upholds `GlobalAlloc::dealloc`'s contract, passed through.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(signed(layout.size()));
        // SAFETY: the caller upholds `GlobalAlloc::alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(signed(new_size) - signed(layout.size()));
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract, passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
