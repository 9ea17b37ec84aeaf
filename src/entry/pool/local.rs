//! The calling thread's heap: made (or adopted) at the thread's first allocation;
//! at its exit, the heap's last collection, and its abandonment to the next thread
//! that needs a heap.
//!
//! # Ground rules
//!
//! - A heap is never freed: its chunks may hold live entries, and frees into it may
//!   come at any time. A thread's exit abandons it (`Drop for Heap`, here) to a global
//!   list, whence the next thread that needs a heap adopts it.
//! - A thread whose own heap cannot be reached (its thread-local storage torn down, or
//!   a global allocator re-entering the pool) allocates from a shared heap behind a
//!   lock.

use core::cell::RefCell;
use core::ptr::{self, NonNull};
use std::sync::Mutex;

use super::chunk::release_chunk;
use super::heap::{collect, Class, Heap};

impl Drop for Heap {
    /// A heap's chunks may hold live entries, and frees into it may come later: it is
    /// abandoned, for the next thread that needs a heap to adopt, never freed. First it
    /// takes back what frees have sent and retires the chunks whose blocks all came
    /// back, its spares included (to the cache, or the allocator when the cache is
    /// full), so that an exited thread's free chunks serve other threads at once, not
    /// only whichever one adopts its heap.
    fn drop(&mut self) {
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
        abandon(Heap {
            shared: self.shared,
            classes: core::mem::replace(&mut self.classes, Class::none()),
            held: core::mem::take(&mut self.held),
        });
    }
}

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
fn abandon(heap: Heap) {
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
