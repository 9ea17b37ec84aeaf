//! A counting global allocator: exact bytes allocated, for "bytes per pending timer"
//! (RSS moves in pages and never shrinks, so it cannot show a per-timer cost).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Wraps the system allocator and counts live bytes.
#[derive(Debug)]
pub struct CountingAllocator;

/// Bytes currently allocated (requested sizes, not allocator chunks).
static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

/// Bytes currently allocated by the whole process.
pub fn allocated() -> usize {
    // ORDERING: Relaxed: a statistic sampled between phases.
    ALLOCATED.load(Ordering::Relaxed)
}

// SAFETY: every method forwards to `System` with the same arguments and only adds a
// Relaxed counter update, so `System`'s guarantees carry over unchanged.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // ORDERING: Relaxed: a statistic; no memory is published through it.
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // ORDERING: as in `alloc`.
        ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::dealloc`'s contract, passed through.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // ORDERING: as in `alloc`.
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // ORDERING: as in `alloc`.
        ALLOCATED.fetch_add(new_size, Ordering::Relaxed);
        // ORDERING: as in `alloc`.
        ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract, passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
