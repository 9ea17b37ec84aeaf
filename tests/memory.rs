//! What a burst of timers leaves behind for the next one: the entry pool keeps the
//! chunks a burst gave up (up to its cache's 32 MiB) and the next burst, on another
//! thread, starts from them instead of asking the global allocator for fresh memory,
//! which the kernel would have to fault in and zero again.
//!
//! This binary counts the pool's chunk allocations with a global allocator of its
//! own, so it holds one test, whose steps run in a fixed order (each step's counts
//! depend on what the cache holds, which the steps before it decide).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sharded_timer::{ShardedTimer, TimerHandle};

/// The entry pool's chunks: 32 KiB, aligned to 32 KiB.
const CHUNK: usize = 32 * 1024;

/// Chunks taken from the global allocator so far.
static CHUNKS_ALLOCATED: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting allocations with the pool's chunk layout.
struct Counting;

// SAFETY: every call is forwarded to `System` unchanged; the counting only reads the
// layout.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() == CHUNK && layout.align() == CHUNK {
            // ORDERING: Relaxed: a counter read after the threads that allocate joined.
            CHUNKS_ALLOCATED.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(block, layout) };
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn chunks_allocated() -> usize {
    // ORDERING: Relaxed: see `CHUNKS_ALLOCATED`.
    CHUNKS_ALLOCATED.load(Ordering::Relaxed)
}

/// 20 chunks' worth of entries with a 16-byte capture (680 blocks of 48 bytes each),
/// 13,600 timers: far below the cache's limit.
const TIMERS: usize = 20 * 680;

/// On a thread of its own (a new heap, or the one an exited thread left), schedules
/// `TIMERS` hour-long timers with a 16-byte capture, then cancels and drops them all.
fn burst(timer: &ShardedTimer) {
    let timer = timer.clone();
    // A plain thread, joined: its heap is abandoned (its thread-local destructor has
    // run) by the time `join` returns, which a scoped thread's end does not wait for.
    std::thread::spawn(move || schedule_and_cancel(&timer))
        .join()
        .expect("the burst's thread");
}

/// Schedules `TIMERS` hour-long timers with a 16-byte capture on this thread, then
/// cancels and drops them all.
fn schedule_and_cancel(timer: &ShardedTimer) {
    let handles: Vec<TimerHandle> = (0..TIMERS)
        .map(|index| {
            let capture = (index as u64, index as u64);
            timer
                .schedule(Duration::from_secs(3600), move || {
                    std::hint::black_box(capture);
                })
                .expect("schedules")
        })
        .collect();
    for handle in &handles {
        assert!(handle.cancel(), "pending until cancelled");
    }
}

/// A one-shard service for these tests.
fn service(name: &str) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(1)
        .executor_threads(1)
        .pin_cores(false)
        .thread_name(name)
        .build()
        .expect("builds")
}

#[test]
#[cfg_attr(
    chunk_cache_off,
    ignore = "counts on the entry pool's chunk cache, off in this build"
)]
fn freed_chunks_serve_the_next_burst_on_a_new_thread_and_on_a_living_one() {
    // First, with the cache empty (nothing before in this process made timers).
    a_second_burst_on_a_new_thread_reuses_the_chunks_of_the_first();
    threads_that_exit_leave_their_free_chunks_to_a_thread_that_lives_on();
}

/// A burst on a thread that exits, then three more, each on a new thread: the later
/// ones allocate (almost) no chunk.
fn a_second_burst_on_a_new_thread_reuses_the_chunks_of_the_first() {
    let timer = service("memory");
    let before = chunks_allocated();
    burst(&timer);
    let first = chunks_allocated() - before;
    assert!(
        first >= 20,
        "the first burst needs at least 20 chunks, took {first}"
    );
    // Each later burst adopts the heap the last one's thread left, takes its chunks
    // back (all their blocks are free), and starts from them: its spare per class,
    // then the cache. A pool that gave retired chunks back to the allocator at once
    // allocates about as many again each time.
    for round in 1..=3 {
        let before = chunks_allocated();
        burst(&timer);
        let again = chunks_allocated() - before;
        assert!(
            again <= 1,
            "burst {round} allocated {again} new chunks (the first took {first})"
        );
    }
    assert!(timer.shutdown().is_empty());
}

/// Two threads burst and exit; a thread that lived through them bursts next and takes
/// their chunks from the cache (each exiting heap collects on the way out).
fn threads_that_exit_leave_their_free_chunks_to_a_thread_that_lives_on() {
    let timer = service("memory-exit");
    // A thread that lives through the test, with its own heap: it never adopts the
    // exiting threads' heaps, so it can reuse their chunks only through the cache.
    let (go, wait) = mpsc::channel::<()>();
    let living = {
        let timer = timer.clone();
        std::thread::spawn(move || {
            drop(
                timer
                    .schedule(Duration::from_secs(3600), || {})
                    .expect("schedules"),
            );
            wait.recv().expect("told to burst");
            let before = chunks_allocated();
            schedule_and_cancel(&timer);
            chunks_allocated() - before
        })
    };
    // Two threads burst, cancel, wait until every cancel was taken in (their blocks
    // are freed by then), and exit: each heap collects on the way out.
    let exiting: Vec<_> = (0..2)
        .map(|_| {
            let timer = timer.clone();
            std::thread::spawn(move || schedule_and_cancel(&timer))
        })
        .collect();
    for thread in exiting {
        thread.join().expect("an exiting burst");
    }
    let all_cancelled = Instant::now() + Duration::from_secs(30);
    while timer.stats().cancelled < 2 * TIMERS as u64 {
        assert!(
            Instant::now() < all_cancelled,
            "cancels taken in within 30 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    go.send(()).expect("the living thread waits");
    let allocated = living.join().expect("the living thread's burst");
    assert!(
        allocated <= 1,
        "the living thread's burst of 20 chunks allocated {allocated} new ones while the \
         exited threads had left 40 free"
    );
    let _ = timer.shutdown();
}
