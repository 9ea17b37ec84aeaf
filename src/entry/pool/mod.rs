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
//!
//! [`Heap`]: heap::Heap

#[cfg(not(loom))]
mod cache;
mod chunk;
mod heap;
#[cfg(not(loom))]
mod local;
#[cfg(all(test, not(loom)))]
mod tests;

use core::ptr::NonNull;

pub use self::chunk::free;
pub(crate) use self::heap::prefetch;
/// The heap and the chunk's head, for the loom models (`crate::__loom::pool`).
#[cfg(loom)]
pub use self::{chunk::HEAD, heap::Heap};

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

/// Under loom nothing is pooled (`pooled` is false); this only keeps `boxed` whole.
#[cfg(loom)]
mod local {
    use core::ptr::NonNull;

    /// Unreachable under loom.
    pub(super) fn allocate(_class: usize) -> NonNull<u8> {
        unreachable!("nothing is pooled under loom")
    }
}
