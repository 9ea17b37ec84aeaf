//! The entry pool: where timer entries live, without `malloc` on the hot path.
//!
//! The design is mimalloc's (Leijen, Zorn, de Moura, "Mimalloc: Free List Sharding in
//! Action", APLAS 2019, §2–3), cut down to what entries need: each thread that
//! creates timers owns a [`Heap`] of 32 KiB chunks, one size class per chunk (16-byte
//! steps up to [`LARGEST`] bytes). A thread allocates from its own heap without an
//! atomic read-modify-write: from its local free list, else by bumping through its
//! current chunk. Any thread frees a block by pushing it onto its chunk's `freed`
//! list, one compare-and-swap (the free that makes the list non-empty also lists the
//! chunk with its heap, a second one); when its current chunk runs dry, the owner
//! takes the heap's list of such chunks and each one's `freed` list whole, one swap
//! each, and moves to a chunk with free blocks. Blocks handed out one after another
//! so lie in one 32 KiB chunk, not across the whole heap. Entries are
//! mostly freed by a shard thread (the service's reference is dropped last after a
//! fire), so the free that `malloc` made cross-arena under the arena's lock becomes a
//! push, and an entry with a 16-byte capture takes 48 bytes, with no `malloc` header
//! or rounding.
//!
//! Finding the owner: chunks are aligned to their size, so a block's chunk is its
//! address with the low 15 bits cleared, and the chunk's head names the heap and the
//! class.
//!
//! Memory comes back by the chunk: the owner counts the blocks of each chunk that
//! are out, and when it takes back the last one, the chunk becomes its class's spare
//! (started afresh before a new chunk is allocated) or, if there is one already, goes
//! to the process's cache of free chunks (up to 32 MiB, whence any heap's next new
//! chunk comes first, its pages still resident: see [`cache`]) or, the cache full, back
//! to the global allocator, whether it was current, waiting in `ready` or neither.
//! The owner takes back what frees have sent for *every* class whenever
//! it collects for one (its current chunk of that class used up), so a class the
//! thread stopped using gives its chunks back at the thread's next collection of any
//! class: at most one spare per class stays. A chunk with any entry alive stays. When a
//! thread exits, its heap is abandoned to a global list, and the next thread that
//! needs a heap adopts it (chunks, free lists, and the lists that frees have filled
//! meanwhile). A heap takes back its freed blocks only when it collects: when a class's
//! current chunk is used up, and once more as its thread exits (the chunks all of
//! whose blocks are back then go to the cache). So the chunks of a live thread that
//! has stopped making timers, and of an abandoned heap whose blocks were freed after
//! its thread exited, stay with that heap until it collects again. A heap's own
//! record (2 KiB) is never freed, since frees into its chunks may come at any time;
//! there are at most as many as threads that created timers at the same time.
//!
//! Entries larger than [`LARGEST`] bytes or aligned above 16 go to the global
//! allocator, as do all entries under loom (whose models track each entry's
//! allocation; the pool's own protocol has its model, `loom-tests/tests/pool.rs`).
//!
//! The cross-thread protocol is two lists, a chunk's `freed` blocks and a heap's
//! chunks with freed blocks, each a Treiber stack (Treiber, "Systems Programming:
//! Coping with Parallelism", IBM RJ 5118, 1986) whose only pop takes the whole
//! stack. A take-all pop cannot suffer ABA: a pusher's CAS expects
//! the head it read and links its block to that head, and whatever happened to the
//! stack in between, a head equal to the one read is a correct successor. A chunk's
//! head word also counts its blocks (each push adds one to the count of the head it
//! replaces, so an equal head carries a correct count too), and the push onto an
//! empty stack records its block as the stack's last before it lists the chunk: the
//! owner takes a whole stack, with its length and its last block, without walking it
//! (a walk of blocks freed in any order costs a cache miss per block).

use core::alloc::Layout;
use core::ptr::{self, NonNull};

use crate::sync::{AtomicPtr, AtomicU64, CachePadded, Ordering, UnsafeCell};

/// The largest block the pool hands out, in bytes; larger entries use the global
/// allocator.
pub(crate) const LARGEST: usize = 256;

/// Block sizes step by this many bytes (and blocks are aligned to it).
const STEP: usize = 16;

/// Size classes: class `k` holds blocks of `(k + 1) * STEP` bytes.
const CLASSES: usize = LARGEST / STEP;

/// Bytes per chunk, and its alignment. Smaller under loom, whose models make one per
/// execution.
#[cfg(not(loom))]
pub const CHUNK: usize = 32 * 1024;
/// Bytes per chunk under loom.
#[cfg(loom)]
pub const CHUNK: usize = 1024;

/// The most free chunks the process keeps for reuse ([`cache`]): 32 MiB, the entries of
/// about 690,000 timers with a 16-byte capture. A burst larger than that gives the
/// rest of its chunks back to the allocator when its timers are gone. None under Miri,
/// and in a build with `--cfg chunk_cache_off` (`.ci/run`'s AddressSanitizer step), so
/// that a use of a chunk after its retirement is a use after free that Miri or the
/// sanitizer reports, rather than a use of a chunk another heap may be handing out again.
#[cfg(not(loom))]
const CACHE_LIMIT: usize = if cfg!(any(miri, chunk_cache_off)) {
    0
} else {
    32 * 1024 * 1024 / CHUNK
};

/// Bytes at the start of a chunk kept for its head (two cache lines: the owner's,
/// and the one frees touch; more under loom, whose atomics and cells are larger).
pub const HEAD: usize = core::mem::size_of::<ChunkHead>().next_multiple_of(64);

/// Whether a value of type `T` is kept in the pool (else in a `Box`).
pub(crate) const fn pooled<T>() -> bool {
    !cfg!(loom)
        && core::mem::size_of::<T>() <= LARGEST
        && core::mem::size_of::<T>() > 0
        && core::mem::align_of::<T>() <= STEP
}

/// The size class of `T`, which [`pooled`] must have accepted.
const fn class_of<T>() -> usize {
    core::mem::size_of::<T>().div_ceil(STEP) - 1
}

/// A free block: its first word links the list it is on.
#[repr(C)]
pub(crate) struct Block {
    /// The next free block, or null.
    next: *mut Block,
}

/// What only a chunk's owner touches: on a cache line of its own, so that the
/// owner's writes do not take the line that frees read and swap away from them.
#[repr(C, align(64))]
struct Owned {
    /// Free blocks of this chunk taken from `freed`, to hand out.
    local: *mut Block,
    /// Blocks of this chunk handed out and not yet taken back from `freed`.
    handed: usize,
    /// Whether the chunk is in its class's `ready` queue.
    queued: bool,
}

/// The head of every chunk, at its start.
#[repr(C)]
struct ChunkHead {
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
    freed: AtomicU64,
    /// The next chunk in the heap's list of chunks with freed blocks. Written by the
    /// thread whose free made `freed` non-empty, before it pushes the chunk on that
    /// list; read by the owner after taking the list, before it empties `freed`
    /// (which is what lets a free push the chunk again).
    next_freed: UnsafeCell<*mut ChunkHead>,
    /// The last block of the `freed` list (the one pushed onto it empty), so that the
    /// owner joins the list it takes to its local one without walking it. Written and
    /// read as `next_freed` is, by the same free and the same owner's take.
    freed_tail: UnsafeCell<*mut Block>,
}

/// A chunk's `freed` list as one word: the first block's offset from the chunk's
/// start in the low half (0: the list is empty; no block starts at 0, where the head
/// lies), and how many blocks the list holds in the high half.
#[derive(Clone, Copy)]
struct FreedList(u64);

impl FreedList {
    /// The empty list.
    const EMPTY: FreedList = FreedList(0);

    /// The list after pushing the block at `offset` onto `self`.
    fn pushed(self, offset: usize) -> FreedList {
        debug_assert!((HEAD..CHUNK).contains(&offset));
        FreedList(((self.0 >> 32) + 1) << 32 | offset as u64)
    }

    /// The first block, in `chunk`; `None` if empty.
    fn first(self, chunk: *mut ChunkHead) -> Option<NonNull<Block>> {
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
    fn len(self) -> usize {
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
unsafe fn owned<'a>(chunk: *mut ChunkHead) -> &'a mut Owned {
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
    chunks: [CachePadded<AtomicPtr<ChunkHead>>; CLASSES],
}

/// The owner's view of one size class.
struct Class {
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
    spare: *mut ChunkHead,
    /// Set when a chunk in `ready` got its last block back: `ready` then holds a
    /// chunk to retire (unless the owner made it current meanwhile).
    emptied: bool,
}

impl Class {
    /// Every class of a heap with no chunks.
    fn none() -> [Class; CLASSES] {
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
    shared: &'static HeapShared,
    /// Per class: the current chunk, its bump region, the ready chunks.
    classes: [Class; CLASSES],
    /// Chunks this heap holds: allocated and not returned.
    held: usize,
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

impl Drop for Heap {
    /// A heap's chunks may hold live entries, and frees into it may come later: it is
    /// abandoned, for the next thread that needs a heap to adopt, never freed. First it
    /// takes back what frees have sent and retires the chunks whose blocks all came
    /// back, its spares included (to the cache, or the allocator when the cache is
    /// full), so that an exited thread's free chunks serve other threads at once, not
    /// only whichever one adopts its heap.
    fn drop(&mut self) {
        #[cfg(not(loom))]
        {
            self.held -= collect(self.shared, &mut self.classes);
            for state in &mut self.classes {
                let spare = core::mem::replace(&mut state.spare, ptr::null_mut());
                if !spare.is_null() {
                    // SAFETY: a spare is a live chunk of ours with no block out, on no
                    // list, neither current nor queued; nothing refers to it once it
                    // is no longer the spare.
                    unsafe { release_chunk(spare.cast()) };
                    self.held -= 1;
                }
            }
        }
        #[cfg(not(loom))]
        local::abandon(Heap {
            shared: self.shared,
            classes: core::mem::replace(&mut self.classes, Class::none()),
            held: core::mem::take(&mut self.held),
        });
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
fn collect(shared: &HeapShared, classes: &mut [Class; CLASSES]) -> usize {
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

/// Gives up a chunk that nothing refers to any more: into the process's cache of
/// free chunks while it has room ([`cache`]), else back to the global allocator.
///
/// # Safety
///
/// `chunk` was made by [`new_chunk`] (or taken from the cache) and nothing refers to
/// it any more.
unsafe fn release_chunk(chunk: *mut u8) {
    // SAFETY: nothing refers to the chunk, made with the pool's layout (the contract).
    #[cfg(not(loom))]
    let Some(chunk) = (unsafe { cache::CHUNKS.keep(chunk) }) else {
        return;
    };
    // SAFETY: made with this layout; nothing refers to it (the contract).
    unsafe { std::alloc::dealloc(chunk, chunk_layout()) };
}

/// Asks the CPU to bring the line at `block` into its caches; a hint, a no-op for
/// null and on other architectures.
#[inline(always)]
fn prefetch(block: *const Block) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: a prefetch is a hint that never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(block.cast());
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = block;
}

/// A fresh chunk for `class` of `heap`, its head written.
fn new_chunk(heap: &'static HeapShared, class: usize) -> NonNull<u8> {
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
fn chunk_layout() -> Layout {
    match Layout::from_size_align(CHUNK, CHUNK) {
        Ok(layout) => layout,
        Err(_) => unreachable!("CHUNK is a power of two"),
    }
}

/// Returns `block` to the heap that allocated it, from any thread: one CAS on its
/// chunk's `freed` list, and, when that list was empty, one more to list the chunk
/// with its heap.
///
/// # Safety
///
/// `block` came from [`Heap::allocate`], is not used after this call, and is freed
/// once.
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

/// Moves `value` into a pooled block (when [`pooled::<T>()`]) or a `Box`, and returns
/// the pointer; [`unbox`] frees it.
pub(crate) fn boxed<T>(value: T) -> NonNull<T> {
    if pooled::<T>() {
        let block = local::allocate(class_of::<T>()).cast::<T>();
        // SAFETY: the block is fresh, at least `size_of::<T>()` bytes (its class) and
        // 16-aligned, which `pooled` checked covers `T`'s alignment.
        unsafe { block.write(value) };
        block
    } else {
        NonNull::from(Box::leak(Box::new(value)))
    }
}

/// Drops the `T` at `value` and frees its memory.
///
/// # Safety
///
/// `value` came from [`boxed::<T>`], is live, and is not used after this call.
pub(crate) unsafe fn unbox<T>(value: NonNull<T>) {
    if pooled::<T>() {
        /// Frees the block even if `T`'s destructor panics.
        struct Free(NonNull<u8>);
        impl Drop for Free {
            fn drop(&mut self) {
                // SAFETY: `unbox`'s contract: the block is ours and freed only here.
                unsafe { free(self.0) };
            }
        }
        let _free = Free(value.cast());
        // SAFETY: live and ours (the contract); dropped once, before the block is freed.
        unsafe { value.as_ptr().drop_in_place() };
    } else {
        // SAFETY: `boxed` leaked this `Box` (not pooled), and it is ours now.
        drop(unsafe { Box::from_raw(value.as_ptr()) });
    }
}

/// The process's free chunks, kept for reuse rather than returned to the global
/// allocator at once.
///
/// A chunk whose blocks have all come back is retired. Most retired chunks used to go
/// straight back to `malloc`, which gives a wholly free region of its heap back to
/// the kernel (its trim), so the next burst of timers faulted every page in again and
/// had the kernel zero it: in a process that made a million timers, freed them and
/// made a million more on a new thread, entry blocks took 42 % of the second million's
/// page faults (`perf record -e page-faults`; the caller's vector of handles and the
/// wheel's slot vectors took the rest), and keeping their chunks cut the schedule from
/// 85–88 to 66–78 CPU ns per timer (issue 30, `--compare`), a cost that memory kept in
/// `malloc`'s own free lists does not pay. The cache keeps up to
/// [`CACHE_LIMIT`] chunks, their pages resident, for any thread's heap to start afresh
/// from; beyond that a retired chunk goes back to the allocator as before. It is a
/// plain lock: taken once per chunk made or retired (a chunk holds 680 entries of 48
/// bytes), never per timer.
#[cfg(not(loom))]
mod cache {
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
}

/// The calling thread's heap.
#[cfg(not(loom))]
mod local {
    use core::cell::RefCell;
    use core::ptr::NonNull;
    use std::sync::Mutex;

    use super::Heap;

    /// A thread's heap, made at its first allocation, abandoned at its exit (by the
    /// heap's `Drop`).
    struct Local(RefCell<Option<Heap>>);

    std::thread_local! {
        static LOCAL: Local = const { Local(RefCell::new(None)) };
    }

    /// Heaps whose threads have exited, to be adopted.
    static ABANDONED: Mutex<Vec<Heap>> = Mutex::new(Vec::new());

    /// For a thread whose own heap cannot be reached (its thread-local storage is
    /// being torn down, or a global allocator re-entered the pool): a shared heap
    /// behind a lock.
    static SPARE: Mutex<Option<Heap>> = Mutex::new(None);

    /// The abandoned heaps, poison ignored (a heap is a pointer set; a panic while
    /// pushing or popping leaves the vector valid).
    fn abandoned() -> std::sync::MutexGuard<'static, Vec<Heap>> {
        ABANDONED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `heap` for the next thread that needs one.
    pub(super) fn abandon(heap: Heap) {
        abandoned().push(heap);
    }

    /// A heap for a thread that has none: an abandoned one, else a new one.
    fn adopt() -> Heap {
        abandoned().pop().unwrap_or_default()
    }

    /// A block of `class` from the calling thread's heap.
    pub(super) fn allocate(class: usize) -> NonNull<u8> {
        let own = LOCAL.try_with(|local| {
            let mut heap = local.0.try_borrow_mut().ok()?;
            Some(heap.get_or_insert_with(adopt).allocate(class))
        });
        if let Ok(Some(block)) = own {
            return block;
        }
        let mut spare = SPARE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        spare.get_or_insert_with(adopt).allocate(class)
    }
}

/// Under loom nothing is pooled (`pooled` is false); this only keeps `boxed` whole.
#[cfg(loom)]
mod local {
    use core::ptr::NonNull;

    /// Unreachable under loom.
    pub(super) fn allocate(_class: usize) -> NonNull<u8> {
        unreachable!("nothing is pooled under loom")
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Blocks of class 2 (48 bytes) in one chunk.
    const PER_CHUNK: usize = (CHUNK - HEAD) / 48;

    /// A block, as the tests pass it between threads and compare it.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    struct Sent(NonNull<u8>);

    // SAFETY: test-only: a block handed to the thread that frees it, as an entry's
    // last reference is.
    unsafe impl Send for Sent {}
    // SAFETY: as for `Send`: the tests only read the address through a shared one.
    unsafe impl Sync for Sent {}

    impl Sent {
        fn addr(self) -> usize {
            self.0.as_ptr().addr()
        }
        fn chunk(self) -> usize {
            self.addr() & !(CHUNK - 1)
        }
    }

    impl PartialOrd for Sent {
        fn partial_cmp(&self, other: &Self) -> Option<core::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }

    impl Ord for Sent {
        fn cmp(&self, other: &Self) -> core::cmp::Ordering {
            self.addr().cmp(&other.addr())
        }
    }

    fn address(block: NonNull<u8>) -> Sent {
        Sent(block)
    }

    fn block_at(block: Sent) -> NonNull<u8> {
        block.0
    }

    /// A chunk's worth of class-2 blocks from `heap`.
    fn a_chunk_of_blocks(heap: &mut Heap) -> Vec<Sent> {
        (0..PER_CHUNK).map(|_| address(heap.allocate(2))).collect()
    }

    /// Frees `blocks` on this thread.
    fn free_all(blocks: impl IntoIterator<Item = Sent>) {
        for block in blocks {
            // SAFETY: every caller passes blocks it allocated and uses no more, each
            // once.
            unsafe { free(block_at(block)) };
        }
    }

    /// Frees `blocks` on another thread, as a shard frees an entry a producer made.
    fn free_on_another_thread(blocks: impl IntoIterator<Item = Sent> + Send) {
        std::thread::scope(|scope| {
            scope.spawn(|| free_all(blocks));
        });
    }

    #[test]
    fn blocks_freed_by_another_thread_are_reused_by_their_owner_once_the_chunk_is_used_up() {
        let mut heap = Heap::new();
        let blocks: Vec<Sent> = a_chunk_of_blocks(&mut heap);
        assert_eq!(blocks[1].addr() - blocks[0].addr(), 48);
        let (first, second) = (blocks[3], blocks[7]);
        free_on_another_thread([first, second]);
        // Last freed, first reused; then, with nothing free, a new chunk.
        assert_eq!(address(heap.allocate(2)), second);
        assert_eq!(address(heap.allocate(2)), first);
        let fresh = address(heap.allocate(2));
        assert_ne!(fresh.chunk(), blocks[0].chunk());
        free_all(blocks.into_iter().chain([fresh]));
    }

    #[test]
    fn frees_into_an_older_chunk_are_found_when_the_current_one_is_used_up() {
        let mut heap = Heap::new();
        let old: Vec<Sent> = a_chunk_of_blocks(&mut heap);
        let newer: Vec<Sent> = a_chunk_of_blocks(&mut heap);
        assert_ne!(old[0].chunk(), newer[0].chunk());
        // Free half of the old chunk and one of the newer, from another thread.
        free_on_another_thread(old.iter().copied().step_by(2).chain([newer[5]]));
        let mut again: Vec<Sent> = (0..old.len().div_ceil(2) + 1)
            .map(|_| address(heap.allocate(2)))
            .collect();
        again.sort_unstable();
        let mut expected: Vec<Sent> = old.iter().step_by(2).copied().chain([newer[5]]).collect();
        expected.sort_unstable();
        assert_eq!(
            again, expected,
            "exactly the freed blocks come back, each once"
        );
        // Every block is allocated again now.
        free_all(old.into_iter().chain(newer));
    }

    #[test]
    fn the_chunk_cache_keeps_up_to_its_limit_and_gives_the_rest_back() {
        let cache = cache::ChunkCache::new(2);
        // SAFETY: the pool's layout, which has a non-zero size.
        let chunks: Vec<*mut u8> = (0..3)
            .map(|_| unsafe { std::alloc::alloc(chunk_layout()) })
            .collect();
        assert!(chunks.iter().all(|chunk| !chunk.is_null()));
        // SAFETY: fresh chunks of the pool's layout that nothing else refers to.
        let kept: Vec<Option<*mut u8>> = chunks.iter().map(|&c| unsafe { cache.keep(c) }).collect();
        assert_eq!(
            kept,
            [None, None, Some(chunks[2])],
            "the third is over the limit"
        );
        assert_eq!(cache.len(), 2);
        assert_eq!(
            cache.take(),
            Some(chunks[1]),
            "the last kept comes out first"
        );
        assert_eq!(cache.take(), Some(chunks[0]));
        assert_eq!(cache.take(), None);
        for chunk in chunks {
            // SAFETY: each was allocated above with this layout and is ours again.
            unsafe { std::alloc::dealloc(chunk, chunk_layout()) };
        }
    }

    #[test]
    fn a_chunk_whose_blocks_all_came_back_is_kept_as_the_spare_and_a_second_returned() {
        let mut heap = Heap::new();
        let first: Vec<Sent> = a_chunk_of_blocks(&mut heap);
        let second: Vec<Sent> = a_chunk_of_blocks(&mut heap);
        let third: Vec<Sent> = a_chunk_of_blocks(&mut heap);
        free_on_another_thread(first.iter().chain(&second).copied());
        // The third chunk is used up: the next allocation takes the two freed chunks
        // back; one becomes the spare and is started afresh, in address order; the
        // other is returned (Miri would report a use of it after that).
        let again: Vec<Sent> = a_chunk_of_blocks(&mut heap);
        let spare = if again[0] == first[0] {
            &first
        } else {
            &second
        };
        assert_eq!(&again, spare, "the spare chunk, from its start");
        let fresh = address(heap.allocate(2));
        assert_ne!(fresh.chunk(), again[0].chunk());
        assert_ne!(fresh.chunk(), third[0].chunk());
        free_all(again.into_iter().chain(third).chain([fresh]));
    }

    #[test]
    fn chunks_of_a_class_no_longer_used_come_back_at_the_next_collection_of_any_class() {
        let mut heap = Heap::new();
        // Three chunks of 224-byte blocks (class 13), all freed by another thread; the
        // owner then allocates only 48-byte blocks (class 2).
        let per_chunk = (CHUNK - HEAD) / 224;
        let big: Vec<Sent> = (0..3 * per_chunk)
            .map(|_| address(heap.allocate(13)))
            .collect();
        assert_eq!(heap.held, 3);
        free_on_another_thread(big);
        let small = address(heap.allocate(2));
        assert_eq!(
            heap.held, 2,
            "class 13 keeps one spare, returns two; class 2 has its first chunk"
        );
        // The current chunk of a class comes back too, once its blocks have: a half
        // used one, freed, is retired (here: returned, class 13 has its spare).
        let some: Vec<Sent> = (0..per_chunk / 2)
            .map(|_| address(heap.allocate(13)))
            .collect();
        assert_eq!(heap.held, 2, "started afresh from the spare");
        let more: Vec<Sent> = (0..per_chunk).map(|_| address(heap.allocate(13))).collect();
        assert_eq!(heap.held, 3, "a second chunk, current now");
        free_on_another_thread(some.into_iter().chain(more));
        let rest: Vec<Sent> = a_chunk_of_blocks(&mut heap);
        assert_eq!(
            heap.held, 3,
            "class 13: one spare kept, one returned; class 2: a second chunk"
        );
        free_all(rest.into_iter().chain([small]));
    }

    #[test]
    fn frees_racing_the_owner_never_hand_a_block_out_twice() {
        // Miri checks the race for data races too, on fewer blocks.
        let chunks = if cfg!(miri) { 2 } else { 8 };
        let mut heap = Heap::new();
        let blocks: Vec<Sent> = (0..chunks * PER_CHUNK)
            .map(|_| address(heap.allocate(2)))
            .collect();
        let even: Vec<Sent> = blocks.iter().copied().step_by(2).collect();
        let odd: Vec<Sent> = blocks.iter().copied().skip(1).step_by(2).collect();
        let mut live: std::collections::HashSet<Sent> = std::collections::HashSet::new();
        std::thread::scope(|scope| {
            for half in [&even, &odd] {
                scope.spawn(move || {
                    for &block in half {
                        // SAFETY: each block is in one half only, ours until freed
                        // below; the owner writes it only after taking it back.
                        unsafe { block_at(block).as_ptr().wrapping_add(8).write(0xA5) };
                        // SAFETY: as above.
                        unsafe { free(block_at(block)) };
                    }
                });
            }
            // Meanwhile the owner allocates as much again, writing each block.
            for _ in 0..chunks * PER_CHUNK {
                let block = heap.allocate(2);
                // SAFETY: a block just handed out is ours.
                unsafe { block.as_ptr().wrapping_add(8).write(0x5A) };
                assert!(live.insert(address(block)), "a block handed out twice");
            }
        });
        free_all(live);
    }

    #[test]
    fn a_chunk_is_used_up_before_the_next_and_classes_do_not_mix() {
        let mut heap = Heap::new();
        let per_chunk = (CHUNK - HEAD) / 64;
        let blocks: Vec<_> = (0..per_chunk + 1).map(|_| heap.allocate(3)).collect();
        let chunk_of = |block: &NonNull<u8>| block.as_ptr().addr() & !(CHUNK - 1);
        assert!(blocks[..per_chunk]
            .iter()
            .all(|block| chunk_of(block) == chunk_of(&blocks[0])));
        assert_ne!(chunk_of(&blocks[per_chunk]), chunk_of(&blocks[0]));
        let other = heap.allocate(0);
        assert_ne!(chunk_of(&other), chunk_of(&blocks[per_chunk]));
        for block in blocks.into_iter().chain([other]) {
            // SAFETY: ours, freed once each.
            unsafe { free(block) };
        }
    }

    #[test]
    fn boxed_values_are_dropped_once_and_large_ones_use_the_global_allocator() {
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        struct Counted([u64; 4]);
        impl Drop for Counted {
            fn drop(&mut self) {
                assert_eq!(self.0, [7; 4]);
                DROPS.fetch_add(1, Ordering::Relaxed);
            }
        }
        assert!(pooled::<Counted>());
        assert!(!pooled::<[u8; LARGEST + 1]>());
        assert!(!pooled::<()>());
        let value = boxed(Counted([7; 4]));
        // SAFETY: from `boxed`, used no more.
        unsafe { unbox(value) };
        assert_eq!(DROPS.load(Ordering::Relaxed), 1);
        let large = boxed([3_u8; LARGEST + 1]);
        // SAFETY: from `boxed`, used no more.
        unsafe { unbox(large) };
    }

    #[test]
    fn a_heap_outlives_its_thread_and_its_next_owner_reuses_what_was_freed() {
        // The owner thread exits and hands its heap on, as a thread's exit abandons
        // it and the next thread adopts it.
        let (heap, blocks) = std::thread::spawn(|| {
            let mut heap = Heap::new();
            let blocks: Vec<Sent> = a_chunk_of_blocks(&mut heap);
            (heap, blocks)
        })
        .join()
        .expect("owner");
        // A third thread frees a block while the heap has no owner running.
        let freed = blocks[11];
        std::thread::spawn(move || {
            // SAFETY: allocated above, used no more, freed once.
            unsafe { free(block_at(freed)) };
        })
        .join()
        .expect("freer");
        let reused = std::thread::spawn(move || {
            let mut heap = heap;
            address(heap.allocate(2))
        })
        .join()
        .expect("adopter");
        assert_eq!(reused, freed);
        // Every block is allocated again now.
        free_all(blocks);
    }

    #[test]
    fn the_thread_local_heap_serves_a_thread_after_another_has_exited() {
        let first = std::thread::spawn(|| address(local::allocate(1)))
            .join()
            .expect("thread");
        let second = std::thread::spawn(|| address(local::allocate(1)))
            .join()
            .expect("thread");
        assert_ne!(first, second, "both blocks are still allocated");
        free_all([first, second]);
    }
}
