//! A thread's heap: per size class, the chunk it hands blocks out from, the chunks
//! with free blocks taken back, and a spare; allocation without an atomic
//! read-modify-write, and the collection that takes back what frees have sent and
//! retires the chunks whose blocks have all come back.
//!
//! # Ground rules
//!
//! - A heap is owned by one thread at a time (`Send`, not `Sync`): only its owner
//!   allocates from it, collects into it, and touches its chunks' owner fields.
//! - A chunk is retired (made the class's spare, or given up) only when every block
//!   is back and it is neither current nor queued nor listed ([`retire`]): then no
//!   free can touch it any more.
//! - A heap's shared half is never freed (frees into its chunks may come at any
//!   time); at its thread's exit a heap is abandoned, not dropped (`local.rs`).

use core::ptr::{self, NonNull};

use super::chunk::{
    new_chunk, owned, release_chunk, Block, ChunkHead, FreedList, HeapShared, HEAD,
};
use super::{CHUNK, CLASSES, STEP};
use crate::sync::{AtomicPtr, CachePadded, Ordering};

/// The owner's view of one size class.
pub(super) struct Class {
    /// The chunk blocks are handed out from, or null.
    current: *mut ChunkHead,
    /// The next never-used byte of the current chunk (equal to `end` when none is left
    /// or the chunk was made current again after filling).
    bump: *mut u8,
    /// See `bump`.
    end: *mut u8,
    /// Chunks with taken free blocks in their `local` list, not current.
    ready: Vec<*mut ChunkHead>,
    /// One chunk all of whose blocks came back, kept to start afresh before a new
    /// chunk is allocated; a second such chunk is returned to the global allocator.
    pub(super) spare: *mut ChunkHead,
    /// Set when a chunk in `ready` got its last block back: `ready` then holds a
    /// chunk to retire (unless the owner made it current meanwhile).
    emptied: bool,
}

impl Class {
    /// Every class of a heap with no chunks.
    pub(super) fn none() -> [Class; CLASSES] {
        core::array::from_fn(|_| Class {
            current: ptr::null_mut(),
            bump: ptr::null_mut(),
            end: ptr::null_mut(),
            ready: Vec::new(),
            spare: ptr::null_mut(),
            emptied: false,
        })
    }
}

/// A thread's heap: owned by one thread at a time (it is `Send`, not `Sync`).
pub struct Heap {
    /// The lists other threads free to; `'static`: a heap is never freed, since its
    /// chunks, and so frees into it, may outlive any owner.
    pub(super) shared: &'static HeapShared,
    /// Per class: the current chunk, its bump region, the ready chunks.
    pub(super) classes: [Class; CLASSES],
    /// Chunks this heap holds: allocated and not returned.
    pub(super) held: usize,
}

// SAFETY: a `Heap` is owned by one thread at a time; its raw pointers lead to chunks
// whose owner-only fields and unused bytes it alone touches, and to free blocks that
// it alone has taken, so moving it to another thread (an abandoned heap adopted)
// moves that exclusive use with it.
unsafe impl Send for Heap {}

impl core::fmt::Debug for Heap {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Heap")
            .field("shared", &(self.shared as *const HeapShared))
            .finish_non_exhaustive()
    }
}

impl Default for Heap {
    fn default() -> Self {
        Heap::new()
    }
}

impl Heap {
    /// An empty heap: no chunks yet.
    pub fn new() -> Heap {
        let shared = Box::leak(Box::new(HeapShared {
            chunks: core::array::from_fn(|_| CachePadded::new(AtomicPtr::new(ptr::null_mut()))),
        }));
        Heap {
            shared,
            classes: Class::none(),
            held: 0,
        }
    }

    /// The chunks this heap holds (allocated and not yet returned to the global
    /// allocator), spares included; for the loom model of their return.
    #[cfg(loom)]
    pub fn held_chunks(&self) -> usize {
        self.held
    }

    /// A block of class `class` (`(class + 1) * 16` bytes, 16-aligned), uninitialised.
    /// Taken from the current chunk's free blocks, else its never-used bytes, else
    /// from another chunk of this heap with free blocks (one per 32 KiB, so blocks
    /// handed out one after another lie close together), else from a new chunk.
    ///
    /// # Panics
    ///
    /// If `class` is out of range. Aborts through `handle_alloc_error` if a new chunk
    /// cannot be allocated.
    pub fn allocate(&mut self, class: usize) -> NonNull<u8> {
        let shared = self.shared;
        let size = (class + 1) * STEP;
        loop {
            let state = &mut self.classes[class];
            if !state.current.is_null() {
                // SAFETY: the current chunk is live (a chunk is freed only when none
                // of its blocks is out and it is neither current nor queued) and
                // ours; no other reference to its owned fields is alive.
                let owned = unsafe { owned(state.current) };
                if let Some(block) = NonNull::new(owned.local) {
                    // SAFETY: a block on a local list is free and ours; its link was
                    // written before it reached the list (by its free, which our
                    // Acquire swap of `freed` synchronised with).
                    let next = unsafe { (*block.as_ptr()).next };
                    owned.local = next;
                    owned.handed += 1;
                    // Blocks come back in the order they were freed, not by address:
                    // fetch the next one now, while the caller fills this one.
                    prefetch(next);
                    return block.cast();
                }
                if (state.end as usize) - (state.bump as usize) >= size {
                    let block = state.bump;
                    // SAFETY: at least `size` bytes remain before `end`, in the chunk.
                    state.bump = unsafe { block.add(size) };
                    owned.handed += 1;
                    // SAFETY: `block` points into a live chunk, so it is not null.
                    return unsafe { NonNull::new_unchecked(block) };
                }
            }
            // The current chunk has nothing left: take what frees have sent (for
            // every class, so that a class no longer used gives its chunks back),
            // then move to a chunk with free blocks, else to a fresh one.
            self.held -= collect(shared, &mut self.classes);
            let state = &mut self.classes[class];
            if !state.current.is_null() {
                // SAFETY: as above.
                if !unsafe { owned(state.current) }.local.is_null() {
                    continue;
                }
            }
            if let Some(chunk) = state.ready.pop() {
                // SAFETY: a queued chunk is live and ours.
                unsafe { owned(chunk) }.queued = false;
                state.current = chunk;
                state.bump = ptr::null_mut();
                state.end = ptr::null_mut();
                continue;
            }
            let chunk = match NonNull::new(core::mem::replace(&mut state.spare, ptr::null_mut())) {
                Some(spare) => spare.cast::<u8>(),
                None => {
                    self.held += 1;
                    new_chunk(shared, class)
                }
            };
            state.current = chunk.as_ptr().cast();
            // SAFETY: `HEAD` is within the `CHUNK`-byte allocation.
            state.bump = unsafe { chunk.as_ptr().add(HEAD) };
            // SAFETY: one past the end of the same allocation.
            state.end = unsafe { chunk.as_ptr().add(CHUNK) };
        }
    }
}

/// Takes what frees have sent for every class ([`take_freed`]) and retires each
/// chunk whose blocks have all come back (see [`retire`]). Returns the chunks
/// returned to the global allocator.
pub(super) fn collect(shared: &HeapShared, classes: &mut [Class; CLASSES]) -> usize {
    let mut returned = 0;
    for (class, state) in classes.iter_mut().enumerate() {
        returned += take_freed(shared, class, state);
        if state.emptied {
            returned += retire_emptied_ready(state);
        }
    }
    returned
}

/// Takes every chunk that frees have listed for `class` and moves each one's freed
/// blocks to its local list; chunks other than the current one join `ready`, unless
/// all their blocks are back: then the chunk is retired ([`chunk_back`]). Returns
/// the chunks returned to the global allocator.
fn take_freed(shared: &HeapShared, class: usize, state: &mut Class) -> usize {
    let list = &shared.chunks[class];
    // Relaxed: only a hint whether to swap; the swap is what takes.
    if list.load(Ordering::Relaxed).is_null() {
        return 0;
    }
    // Acquire: synchronises with the Release pushes of every chunk taken (each push a
    // Release CAS, every later change of the list a read-modify-write, so the swap
    // reads from the release sequence of each): their `next_freed` links are visible.
    let mut chunk = list.swap(ptr::null_mut(), Ordering::Acquire);
    let mut returned = 0;
    while !chunk.is_null() {
        // SAFETY: a listed chunk is live: it has a block out (the one whose free
        // listed it is in `freed` until the swap below), so it was not returned.
        let head = unsafe { &*chunk };
        // SAFETY: the link was written by the free that listed the chunk, before its
        // push (synchronised above); no free writes it again until the swap of
        // `freed` below empties that list.
        let next = head.next_freed.with(|link| unsafe { *link });
        // SAFETY: as for `next_freed`: written by the same free, before its listing.
        let tail = head.freed_tail.with(|tail| unsafe { *tail });
        // AcqRel. Acquire: synchronises with each free's Release push onto `freed`
        // (the blocks' links and the freeing threads' last use of the blocks happen
        // before we hand them out). Release: the free that next finds `freed` empty
        // reads this swap with Acquire, so our reads of `next_freed` and `freed_tail`
        // above happen before its writes of them.
        let blocks = FreedList(head.freed.swap(FreedList::EMPTY.0, Ordering::AcqRel));
        returned += chunk_back(chunk, blocks, tail, state);
        chunk = next;
    }
    returned
}

/// Files the free blocks `blocks` (a list, possibly empty, whose last block is
/// `tail`) taken from `chunk`'s `freed`, and the chunk itself: on its local list and
/// in `ready`, or, with all its blocks back, retired: if it is current, at once; if
/// it waits in `ready`, by the collection's [`retire_emptied_ready`]. Returns the
/// chunks returned to the global allocator (0 or 1). Touches no block but `tail`:
/// the count comes with the list, so a list of a whole chunk's blocks (freed in any
/// order, each a likely cache miss) is not walked.
fn chunk_back(
    chunk: *mut ChunkHead,
    blocks: FreedList,
    tail: *mut Block,
    state: &mut Class,
) -> usize {
    let Some(first) = blocks.first(chunk) else {
        return 0;
    };
    debug_assert!(
        !tail.is_null(),
        "a non-empty list has its last block recorded"
    );
    // SAFETY: the chunk is live and ours (see `take_freed`); no other reference to
    // its owned fields is alive.
    let owned = unsafe { owned(chunk) };
    owned.handed -= blocks.len();
    if owned.handed == 0 && !owned.queued {
        // Every block is back and nobody can free into the chunk any more (see
        // `retire`): stop handing out from it if it is current, and retire it.
        if chunk == state.current {
            state.current = ptr::null_mut();
            state.bump = ptr::null_mut();
            state.end = ptr::null_mut();
        }
        // SAFETY: a live chunk of ours with no block out, now neither current nor
        // queued, on no list (its listing was taken above) and not the spare (a spare
        // has no block out to come back).
        return unsafe { retire(chunk, &mut state.spare) };
    }
    // SAFETY: `tail` is the last block of the list we took: free and ours, its link
    // (null, the list being empty when it was pushed) written before its push.
    unsafe { (*tail).next = owned.local };
    owned.local = first.as_ptr();
    if owned.handed == 0 {
        // Queued in `ready`: retired by the collection, after this take.
        state.emptied = true;
    } else if chunk != state.current && !owned.queued {
        owned.queued = true;
        state.ready.push(chunk);
    }
    0
}

/// Retires the chunks in `state.ready` whose blocks have all come back (see
/// [`retire`]); returns how many were returned to the global allocator.
fn retire_emptied_ready(state: &mut Class) -> usize {
    state.emptied = false;
    let mut returned = 0;
    let spare = &mut state.spare;
    state.ready.retain(|&chunk| {
        // SAFETY: a queued chunk is live and ours; no other reference to its owned
        // fields is alive.
        let owned = unsafe { owned(chunk) };
        if owned.handed != 0 {
            return true;
        }
        owned.queued = false;
        // SAFETY: live and ours, no block out, leaving `ready` here; not current
        // (a current chunk is never queued) and on no list (no block in `freed`).
        returned += unsafe { retire(chunk, spare) };
        false
    });
    returned
}

/// Makes `chunk` the class's spare (to start afresh) if it has none, else returns it
/// to the global allocator; returns 1 if it was returned. No free can touch the
/// chunk any more: every block is back, and a free's last touch of its chunk is its
/// push onto `freed` (or, when that push made the list non-empty, its listing of the
/// chunk, which happened before the owner took the list and the block with it).
///
/// # Safety
///
/// `chunk` is a live chunk of a heap the caller owns, no block of it is out or in
/// `freed`, and it is neither current, queued nor `spare`.
unsafe fn retire(chunk: *mut ChunkHead, spare: &mut *mut ChunkHead) -> usize {
    // SAFETY: live and ours (the contract).
    unsafe { owned(chunk) }.local = ptr::null_mut();
    if spare.is_null() {
        *spare = chunk;
        return 0;
    }
    // SAFETY: made by `new_chunk` with this layout; nothing refers to it any more
    // (the contract).
    unsafe { release_chunk(chunk.cast()) };
    1
}

/// Asks the CPU to bring the line at `at` into its caches; a hint, a no-op for null,
/// under Miri and on other architectures. Also the shard wheel's, for the entries of a
/// slot it works through (`ShardStore::prefetch`).
#[inline(always)]
pub(crate) fn prefetch<T>(at: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: a prefetch is a hint that never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(at.cast());
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = at;
}
