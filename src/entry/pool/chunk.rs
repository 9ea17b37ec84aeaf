//! A chunk of the pool: its head (the owner's fields, and the `freed` list any thread
//! pushes onto), the heap's list of chunks with freed blocks, the cross-thread
//! [`free`], and where chunks come from and go (the process's cache, else the global
//! allocator).
//!
//! # Ground rules
//!
//! - A chunk is `CHUNK` bytes aligned to `CHUNK`, its head at its start: a block's
//!   chunk is its address with the low bits cleared.
//! - The owner's fields (`Owned`) are touched by the heap's owner only, through
//!   [`owned`], on a cache line of their own.
//! - `freed` and the heap's list of chunks with freed blocks are the two Treiber
//!   stacks of the pool's ground rules (`pool/mod.rs`), each popped only whole, by the
//!   owner; a chunk's `next_freed` and `freed_tail` are written by the free that makes
//!   `freed` non-empty, before it lists the chunk, and read by the owner after it takes
//!   the list, before it empties `freed`.
//! - A chunk is given up ([`release_chunk`]) only when nothing refers to it any more.

use core::alloc::Layout;
use core::ptr::{self, NonNull};

#[cfg(not(loom))]
use super::cache;
use super::{CHUNK, CLASSES};
use crate::sync::{AtomicPtr, AtomicU64, CachePadded, Ordering, UnsafeCell};

/// Bytes at the start of a chunk kept for its head (two cache lines: the owner's,
/// and the one frees touch; more under loom, whose atomics and cells are larger).
pub const HEAD: usize = core::mem::size_of::<ChunkHead>().next_multiple_of(64);

/// A free block: its first word links the list it is on.
#[repr(C)]
pub(crate) struct Block {
    /// The next free block, or null.
    pub(super) next: *mut Block,
}

/// What only a chunk's owner touches: on a cache line of its own, so that the
/// owner's writes do not take the line that frees read and swap away from them.
#[repr(C, align(64))]
pub(super) struct Owned {
    /// Free blocks of this chunk taken from `freed`, to hand out.
    pub(super) local: *mut Block,
    /// Blocks of this chunk handed out and not yet taken back from `freed`.
    pub(super) handed: usize,
    /// Whether the chunk is in its class's `ready` queue.
    pub(super) queued: bool,
}

/// The head of every chunk, at its start.
#[repr(C)]
pub(super) struct ChunkHead {
    /// The owner's fields. A plain cell, not loom's: only the heap's owner touches
    /// them (the heap is `Send`, not `Sync`).
    owned: core::cell::UnsafeCell<Owned>,
    /// The heap whose list of chunks takes this chunk when a free makes its `freed`
    /// list non-empty. Written once, before any block of the chunk is handed out.
    heap: &'static HeapShared,
    /// The chunk's size class. Written once, as `heap`.
    class: usize,
    /// Blocks of this chunk freed by any thread, not yet taken by the owner: a
    /// [`FreedList`] word (the first block's place in the chunk and how many the list
    /// holds), so that the owner's swap takes the count with the list and never walks
    /// it.
    pub(super) freed: AtomicU64,
    /// The next chunk in the heap's list of chunks with freed blocks. Written by the
    /// thread whose free made `freed` non-empty, before it pushes the chunk on that
    /// list; read by the owner after taking the list, before it empties `freed`
    /// (which is what lets a free push the chunk again).
    pub(super) next_freed: UnsafeCell<*mut ChunkHead>,
    /// The last block of the `freed` list (the one pushed onto it empty), so that the
    /// owner joins the list it takes to its local one without walking it. Written and
    /// read as `next_freed` is, by the same free and the same owner's take.
    pub(super) freed_tail: UnsafeCell<*mut Block>,
}

/// A chunk's `freed` list as one word: the first block's offset from the chunk's
/// start in the low half (0: the list is empty; no block starts at 0, where the head
/// lies), and how many blocks the list holds in the high half.
#[derive(Clone, Copy)]
pub(super) struct FreedList(pub(super) u64);

impl FreedList {
    /// The empty list.
    pub(super) const EMPTY: FreedList = FreedList(0);

    /// The list after pushing the block at `offset` onto `self`.
    fn pushed(self, offset: usize) -> FreedList {
        debug_assert!((HEAD..CHUNK).contains(&offset));
        FreedList(((self.0 >> 32) + 1) << 32 | offset as u64)
    }

    /// The first block, in `chunk`; `None` if empty.
    pub(super) fn first(self, chunk: *mut ChunkHead) -> Option<NonNull<Block>> {
        // The low half, an offset below `CHUNK` (`pushed`).
        let offset = (self.0 & 0xFFFF_FFFF) as usize;
        if offset == 0 {
            return None;
        }
        // SAFETY: a non-zero offset is that of a block inside the chunk's allocation.
        let block = unsafe { chunk.cast::<u8>().add(offset) };
        NonNull::new(block.cast())
    }

    /// How many blocks the list holds.
    pub(super) fn len(self) -> usize {
        // At most the blocks of one chunk.
        (self.0 >> 32) as usize
    }
}

/// The owner's fields of `chunk`.
///
/// # Safety
///
/// `chunk` is a live chunk of a heap the caller owns (holds `&mut`), and no other
/// reference to its owned fields is alive.
#[allow(
    clippy::mut_from_ref,
    reason = "the owner's exclusive use, per the contract"
)]
pub(super) unsafe fn owned<'a>(chunk: *mut ChunkHead) -> &'a mut Owned {
    // SAFETY: the caller's contract: the chunk is live.
    let cell = unsafe { &(*chunk).owned };
    // SAFETY: the caller's contract: its owned fields are the owner's alone.
    unsafe { &mut *cell.get() }
}

/// The part of a heap that other threads touch: per class, a list of chunks that
/// have freed blocks waiting.
pub(crate) struct HeapShared {
    /// Per class, the chunks whose `freed` list a free made non-empty since the owner
    /// last emptied it; each list on its own cache line.
    pub(super) chunks: [CachePadded<AtomicPtr<ChunkHead>>; CLASSES],
}

/// A fresh chunk for `class` of `heap`, its head written.
pub(super) fn new_chunk(heap: &'static HeapShared, class: usize) -> NonNull<u8> {
    const _: () = assert!(core::mem::size_of::<ChunkHead>() <= HEAD);
    let layout = chunk_layout();
    // A kept chunk first (its pages resident), else a new allocation.
    let chunk = match take_cached() {
        Some(chunk) => chunk,
        // SAFETY: the layout has a non-zero size.
        None => unsafe { std::alloc::alloc(layout) },
    };
    let Some(chunk) = NonNull::new(chunk) else {
        std::alloc::handle_alloc_error(layout);
    };
    // SAFETY: the chunk is fresh, `CHUNK`-aligned and larger than a `ChunkHead`.
    unsafe {
        chunk.cast::<ChunkHead>().write(ChunkHead {
            owned: core::cell::UnsafeCell::new(Owned {
                local: ptr::null_mut(),
                handed: 0,
                queued: false,
            }),
            heap,
            class,
            freed: AtomicU64::new(FreedList::EMPTY.0),
            next_freed: UnsafeCell::new(ptr::null_mut()),
            freed_tail: UnsafeCell::new(ptr::null_mut()),
        });
    }
    chunk
}

/// A chunk from the process's cache of free chunks ([`cache`]), if it has one: the
/// caller owns it. Never under loom, which has no cache.
fn take_cached() -> Option<*mut u8> {
    #[cfg(not(loom))]
    return cache::CHUNKS.take();
    #[cfg(loom)]
    None
}

/// Every chunk's layout: `CHUNK` bytes aligned to `CHUNK`.
pub(super) fn chunk_layout() -> Layout {
    match Layout::from_size_align(CHUNK, CHUNK) {
        Ok(layout) => layout,
        Err(_) => unreachable!("CHUNK is a power of two"),
    }
}

/// Gives up a chunk that nothing refers to any more: into the process's cache of
/// free chunks while it has room ([`cache`]), else back to the global allocator.
///
/// # Safety
///
/// `chunk` was made by [`new_chunk`] (or taken from the cache) and nothing refers to
/// it any more.
pub(super) unsafe fn release_chunk(chunk: *mut u8) {
    // SAFETY: nothing refers to the chunk, made with the pool's layout (the contract).
    #[cfg(not(loom))]
    let Some(chunk) = (unsafe { cache::CHUNKS.keep(chunk) }) else {
        return;
    };
    // SAFETY: made with this layout; nothing refers to it (the contract).
    unsafe { std::alloc::dealloc(chunk, chunk_layout()) };
}

/// Returns `block` to the heap that allocated it, from any thread: one CAS on its
/// chunk's `freed` list, and, when that list was empty, one more to list the chunk
/// with its heap.
///
/// # Safety
///
/// `block` came from [`Heap::allocate`], is not used after this call, and is freed
/// once.
///
/// [`Heap::allocate`]: super::heap::Heap::allocate
pub unsafe fn free(block: NonNull<u8>) {
    let chunk = block
        .as_ptr()
        .map_addr(|address| address & !(CHUNK - 1))
        .cast::<ChunkHead>();
    // SAFETY: a block lies within its `CHUNK`-aligned chunk, whose head was written
    // when the chunk was made. The chunk is live until this call returns: its owner
    // returns a chunk only once it has taken back every block, and it can take ours
    // only from a `freed` list it reached through the heap's list of chunks, which
    // (if our push below makes `freed` non-empty) our own listing, this call's last
    // touch of the chunk, puts it on.
    let head = unsafe { &*chunk };
    let block = block.cast::<Block>().as_ptr();
    let offset = block.addr() - chunk.addr();
    // Relaxed: the head read is only the expected value; the CAS checks it.
    let mut list = FreedList(head.freed.load(Ordering::Relaxed));
    loop {
        let first = list.first(chunk).map_or(ptr::null_mut(), NonNull::as_ptr);
        // SAFETY: the block is ours to write until the CAS publishes it (the caller's
        // contract), and large enough for a link (every class is at least 16 bytes).
        unsafe { block.write(Block { next: first }) };
        // Success AcqRel. Release: publishes the link and everything this thread did
        // with the block to the owner's Acquire swap. Acquire: when the list was
        // empty, we are about to write the chunk's `next_freed` and `freed_tail`,
        // which the owner read before its Release swap emptied the list (the value we
        // replace). Failure Relaxed: the new head is again only an expected value.
        match head.freed.compare_exchange_weak(
            list.0,
            list.pushed(offset).0,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => break,
            Err(current) => list = FreedList(current),
        }
    }
    if list.first(chunk).is_some() {
        // The chunk is listed already (or its owner is taking it): nothing more.
        return;
    }
    // We made the list non-empty, so our block is its last: record it, and list the
    // chunk with its heap, once until the owner empties `freed` again.
    // SAFETY: only the free that made `freed` non-empty writes it, and the owner read
    // it before emptying `freed` (see the CAS above).
    head.freed_tail.with_mut(|tail| unsafe { *tail = block });
    let list = &head.heap.chunks[head.class];
    let mut listed = list.load(Ordering::Relaxed);
    loop {
        // SAFETY: only the free that made `freed` non-empty writes the link, and the
        // owner read it before emptying `freed` (see the CAS above).
        head.next_freed.with_mut(|link| unsafe { *link = listed });
        // Release: publishes the link and the last block to the owner's Acquire swap
        // of the list.
        match list.compare_exchange_weak(listed, chunk, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return,
            Err(current) => listed = current,
        }
    }
}
