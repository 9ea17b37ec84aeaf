//! The pool's unit tests: reuse, collection, the cache, racing frees, adoption.

use super::chunk::{chunk_layout, HEAD};
use super::heap::Heap;
use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

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
