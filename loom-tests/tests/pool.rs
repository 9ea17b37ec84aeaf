//! Model 17: the entry pool's cross-thread free (`src/entry/pool/chunk.rs`, and the
//! owner's side in `heap.rs`): blocks freed by other threads onto their chunk's
//! `freed` list, the chunk listed with its heap by the free that made that list
//! non-empty, and the owner taking both lists.
//!
//! Explores: the real `Heap` and `free`. The owner uses up a chunk (three blocks);
//! two threads each free one of its blocks (writing to the block first, as an
//! entry's last user does) while the owner uses up a second chunk and allocates once
//! more (taking whatever the frees have listed by then); then the owner allocates
//! until both blocks have come back.
//! Asserts: no block is handed out twice while allocated; both freed blocks come back
//! exactly once; no data race on a block (each block carries a loom cell that the
//! freeing thread writes before its free and the owner writes after reuse) or on a
//! chunk's `next_freed` link or `freed_tail` (its list's last block, which lets the
//! owner join a taken list without walking it): loom cells.
//! Seeded bugs that make it fail (each checked): the owner's swap of a chunk's `freed` list without
//! Acquire (`Ordering::Release`: "Concurrent write accesses" on a block's cell:
//! the freeing thread's write does not happen before the reuse); a free's CAS on
//! `freed` without Acquire (`Ordering::Release`: "Concurrent write accesses" on
//! `next_freed`: a free re-listing the chunk writes the link that the free which
//! listed it before wrote, with nothing ordering the two); the owner reading
//! `freed_tail` after its swap of `freed` instead of before ("Concurrent read and
//! write accesses to `UnsafeCell`": the free that next finds the list empty records
//! its own block there meanwhile); the free recording `freed_tail` after listing the
//! chunk instead of before ("Concurrent read and write accesses": the owner may take
//! the listing and read it first); the owner joining a taken list at its first
//! block instead of its recorded last (a freed block never comes back: the final
//! count of returned blocks fails).
//! Command: as in `ring.rs`, with `--test pool`.
#![cfg(loom)]

use std::collections::HashSet;
use std::ptr::NonNull;

use loom::cell::UnsafeCell;
use loom::thread;
use loom_tests::{model, trace};
use sharded_timer::__loom::pool::{free, Heap, CHUNK, HEAD};

/// The class the model uses: 256-byte blocks, three to a (loom-sized) chunk.
const CLASS: usize = 15;
/// Bytes per block of `CLASS`.
const SIZE: usize = 256;
/// Where in a block its cell lies: after the free list's link.
const CELL: usize = 16;

/// The loom cell inside the block at `block`.
fn cell(block: usize) -> *mut UnsafeCell<usize> {
    (block + CELL) as *mut UnsafeCell<usize>
}

/// A block handed out: writes its cell, new (`fresh`) or reused.
fn claim(block: usize, fresh: bool, value: usize) {
    if fresh {
        // SAFETY: a fresh block is ours, and large enough and aligned for the cell.
        unsafe { cell(block).write(UnsafeCell::new(value)) };
    } else {
        // SAFETY: the cell was written when the block was first handed out; the
        // block is ours again (loom checks that the last user's write happened
        // before this one).
        unsafe { &*cell(block) }.with_mut(|slot| unsafe { *slot = value });
    }
}

#[test]
fn blocks_freed_by_other_threads_come_back_once_without_a_race() {
    const _: () = assert!(core::mem::size_of::<UnsafeCell<usize>>() + CELL <= SIZE);
    model(|| {
        let mut heap = Heap::new();
        let per_chunk = (CHUNK - HEAD) / SIZE;
        assert_eq!(
            per_chunk, 3,
            "the model is written for three blocks a chunk"
        );
        let blocks: Vec<usize> = (0..per_chunk)
            .map(|_| heap.allocate(CLASS).as_ptr() as usize)
            .collect();
        for &block in &blocks {
            claim(block, true, 0);
        }
        // One thread frees the first block, another the other two: then every block
        // of the chunk is back, and the owner keeps it as its spare.
        let freed = [blocks[0], blocks[1], blocks[2]];
        let freers: Vec<_> = [vec![blocks[0]], vec![blocks[1], blocks[2]]]
            .into_iter()
            .map(|mine| {
                thread::spawn(move || {
                    for block in mine {
                        // SAFETY: handed to this thread, used here last.
                        unsafe { &*cell(block) }.with_mut(|slot| unsafe { *slot = block });
                        trace(format!("free {block:#x}"));
                        // SAFETY: allocated by the heap, freed once, used no more.
                        unsafe { free(NonNull::new(block as *mut u8).expect("block")) };
                    }
                })
            })
            .collect();
        let mut live: HashSet<usize> = blocks[3..].iter().copied().collect();
        let mut known: HashSet<usize> = blocks.iter().copied().collect();
        let mut returned = 0;
        let mut take = |heap: &mut Heap, live: &mut HashSet<usize>, returned: &mut usize| {
            let block = heap.allocate(CLASS).as_ptr() as usize;
            trace(format!("allocated {block:#x}"));
            assert!(live.insert(block), "a block handed out twice");
            let fresh = known.insert(block);
            if freed.contains(&block) {
                *returned += 1;
            }
            claim(block, fresh, 9);
        };
        // The owner allocates while the frees run: a new chunk's blocks, then, when
        // that is used up too, whatever the frees have sent by then.
        for _ in 0..per_chunk + 1 {
            // Between allocations a producer does other work: let the frees run.
            thread::yield_now();
            take(&mut heap, &mut live, &mut returned);
        }
        for freer in freers {
            freer.join().expect("freer");
        }
        // The freed blocks come back: at most after the rest of a new chunk.
        for _ in 0..2 * per_chunk {
            if returned == freed.len() {
                break;
            }
            take(&mut heap, &mut live, &mut returned);
        }
        assert_eq!(returned, freed.len(), "every freed block came back, once");
    });
}
