//! Audit of the entry pool's free list as one word with its count and its recorded
//! last block (`FreedList`, `freed_tail`, `src/entry/pool/chunk.rs`), through the public
//! API only. Entries are allocated by `schedule` on the calling thread and freed by
//! whichever thread drops the last reference: a pool worker or shard after a fire, a
//! canceller, a handle dropped on another thread, the drop of `shutdown`'s unfired
//! timers.
//!
//! Every capture is a canary: its words are a function of its timer's id, checked
//! when it runs and when it is dropped, and each id counts its runs and drops. A
//! block handed out twice, or a free list joined wrongly, overwrites a live capture
//! (the first word of a free block is its link) or drops one twice; a count taken
//! wrongly retires a chunk with entries alive (ASan: use after free) or never (the
//! chunk bytes grow). The captures cover every size class the pool has for entries
//! (32 to 256 bytes) and two beyond it (the global allocator).
//!
//! This binary counts the bytes of the pool's chunks and of all live allocations with
//! a global allocator of its own, so its tests run one at a time (`serial`).

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Duration;

use sharded_timer::{Callbacks, ManualClock, ShardedTimer, TimerHandle};
use support::{wait_until, WAIT};

const MS: Duration = Duration::from_millis(1);
const HOUR: Duration = Duration::from_secs(3600);

/// The entry pool's chunks: 32 KiB, aligned to 32 KiB.
const CHUNK: usize = 32 * 1024;

/// Bytes of live allocations with the pool's chunk layout.
static CHUNK_BYTES: AtomicUsize = AtomicUsize::new(0);
/// Bytes of all live allocations.
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting what is live.
struct Counting;

// SAFETY: every call is forwarded to `System` unchanged; the counting only reads the
// layout.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            // ORDERING: Relaxed: a counter read after joins and polls only.
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            if layout.size() == CHUNK && layout.align() == CHUNK {
                // ORDERING: as above.
                CHUNK_BYTES.fetch_add(CHUNK, Ordering::Relaxed);
            }
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // ORDERING: as in `alloc`.
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        if layout.size() == CHUNK && layout.align() == CHUNK {
            // ORDERING: as in `alloc`.
            CHUNK_BYTES.fetch_sub(CHUNK, Ordering::Relaxed);
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(block, layout) };
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn chunks() -> usize {
    // ORDERING: Relaxed: see `Counting`.
    CHUNK_BYTES.load(Ordering::Relaxed) / CHUNK
}

fn live_bytes() -> usize {
    // ORDERING: Relaxed: see `Counting`.
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// One test at a time: the byte counts and the zero-sized captures' counters are
/// process-wide.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Per timer id: how often its callback ran and how often its capture was dropped;
/// and how many captures read wrong.
struct Tracker {
    runs: Vec<AtomicU8>,
    drops: Vec<AtomicU8>,
    corrupt: AtomicUsize,
}

impl Tracker {
    fn new(timers: usize) -> Arc<Tracker> {
        Arc::new(Tracker {
            runs: (0..timers).map(|_| AtomicU8::new(0)).collect(),
            drops: (0..timers).map(|_| AtomicU8::new(0)).collect(),
            corrupt: AtomicUsize::new(0),
        })
    }

    fn runs(&self) -> usize {
        self.runs
            .iter()
            .map(|r| usize::from(r.load(Ordering::SeqCst)))
            .sum()
    }

    fn drops(&self) -> usize {
        self.drops
            .iter()
            .map(|d| usize::from(d.load(Ordering::SeqCst)))
            .sum()
    }

    /// Ids of the tracked kinds whose capture was dropped other than once.
    fn not_dropped_once(&self) -> Vec<usize> {
        (0..self.drops.len())
            .filter(|&id| kind_of(id) != ZST && self.drops[id].load(Ordering::SeqCst) != 1)
            .collect()
    }

    fn corrupt(&self) -> usize {
        self.corrupt.load(Ordering::SeqCst)
    }
}

/// A capture of `16 + 8 * N` bytes whose words are a function of its id.
struct Canary<const N: usize> {
    id: u64,
    words: [u64; N],
    tracker: Arc<Tracker>,
}

fn word(id: u64, i: usize) -> u64 {
    id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64) ^ 0xA5A5_0000_0000_5A5A
}

impl<const N: usize> Canary<N> {
    fn new(id: usize, tracker: &Arc<Tracker>) -> Canary<N> {
        let id = id as u64;
        Canary {
            id,
            words: core::array::from_fn(|i| word(id, i)),
            tracker: tracker.clone(),
        }
    }

    fn intact(&self) -> bool {
        (self.id as usize) < self.tracker.drops.len()
            && self
                .words
                .iter()
                .enumerate()
                .all(|(i, &w)| w == word(self.id, i))
    }

    fn run(self) {
        if !self.intact() {
            self.tracker.corrupt.fetch_add(1, Ordering::SeqCst);
            return;
        }
        self.tracker.runs[self.id as usize].fetch_add(1, Ordering::SeqCst);
    }
}

impl<const N: usize> Drop for Canary<N> {
    fn drop(&mut self) {
        if !self.intact() {
            self.tracker.corrupt.fetch_add(1, Ordering::SeqCst);
            return;
        }
        self.tracker.drops[self.id as usize].fetch_add(1, Ordering::SeqCst);
    }
}

/// Runs and drops of zero-sized captures (a 32-byte entry, the smallest class used).
static ZST_RUNS: AtomicUsize = AtomicUsize::new(0);
static ZST_DROPS: AtomicUsize = AtomicUsize::new(0);

struct Zst;

impl Drop for Zst {
    fn drop(&mut self) {
        ZST_DROPS.fetch_add(1, Ordering::SeqCst);
    }
}

/// Capture kinds: zero-sized; 16 to 224 bytes in 16-byte steps (entries of 48 to 256
/// bytes: every pooled class); 232 and 336 bytes (entries beyond the pool).
const KINDS: usize = 17;
const ZST: usize = 0;

fn kind_of(id: usize) -> usize {
    id % KINDS
}

fn ids_of_kind(timers: usize, kind: usize) -> usize {
    (0..timers).filter(|&id| kind_of(id) == kind).count()
}

/// Schedules timer `id` with a capture of its kind.
fn schedule(
    timer: &ShardedTimer,
    id: usize,
    delay: Duration,
    tracker: &Arc<Tracker>,
) -> TimerHandle {
    macro_rules! canary {
        ($n:literal) => {{
            let canary = Canary::<$n>::new(id, tracker);
            timer.schedule(delay, move || canary.run())
        }};
    }
    let scheduled = match kind_of(id) {
        ZST => {
            let zst = Zst;
            timer.schedule(delay, move || {
                let _zst = zst;
                ZST_RUNS.fetch_add(1, Ordering::SeqCst);
            })
        }
        1 => canary!(0),
        2 => canary!(2),
        3 => canary!(4),
        4 => canary!(6),
        5 => canary!(8),
        6 => canary!(10),
        7 => canary!(12),
        8 => canary!(14),
        9 => canary!(16),
        10 => canary!(18),
        11 => canary!(20),
        12 => canary!(22),
        13 => canary!(24),
        14 => canary!(26),
        15 => canary!(27),
        _ => canary!(40),
    };
    scheduled.expect("scheduled")
}

fn service(shards: usize, workers: usize) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(shards)
        .executor_threads(workers)
        .pin_cores(false)
        .thread_name("audit-pool")
        .build()
        .expect("builds")
}

fn zst_counts() -> (usize, usize) {
    (
        ZST_RUNS.load(Ordering::SeqCst),
        ZST_DROPS.load(Ordering::SeqCst),
    )
}

/// Four producers schedule timers in every class; two other threads cancel or drop
/// each handle as it arrives: short timers fire (freed by a worker or shard) racing
/// a cancel on every other one; a third of the long ones is cancelled, the rest are
/// handed back by `shutdown` and dropped on yet another thread.
#[test]
fn frees_racing_across_threads_drop_every_callback_once_in_every_size_class() {
    let _serial = serial();
    const PRODUCERS: usize = 4;
    const EACH: usize = 3_000;
    const TIMERS: usize = PRODUCERS * EACH;
    let (zst_runs0, zst_drops0) = zst_counts();
    let timer = service(2, 2);
    let tracker = Tracker::new(TIMERS);
    let (sender, receiver) = mpsc::channel::<(usize, TimerHandle)>();
    let receiver = Mutex::new(receiver);
    let short_wins = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for producer in 0..PRODUCERS {
            let (timer, tracker, sender) = (&timer, &tracker, sender.clone());
            scope.spawn(move || {
                for id in (producer * EACH)..((producer + 1) * EACH) {
                    let delay = if id % 3 == 0 {
                        MS * ((id / 3) % 3) as u32
                    } else {
                        HOUR
                    };
                    let handle = schedule(timer, id, delay, tracker);
                    sender.send((id, handle)).expect("receiver alive");
                }
            });
        }
        drop(sender);
        for _ in 0..2 {
            let (receiver, short_wins) = (&receiver, &short_wins);
            scope.spawn(move || loop {
                let next = receiver.lock().expect("receiver").recv();
                let Ok((id, handle)) = next else { return };
                match id % 3 {
                    // A cancel racing the fire of every other short timer.
                    0 if id % 2 == 0 && handle.cancel() => {
                        short_wins.fetch_add(1, Ordering::SeqCst);
                    }
                    1 => assert!(handle.cancel(), "an hour-long timer is cancelled"),
                    _ => {}
                }
            });
        }
    });
    let short = (0..TIMERS).filter(|id| id % 3 == 0).count();
    let short_zst = (0..TIMERS)
        .filter(|&id| id % 3 == 0 && kind_of(id) == ZST)
        .count();
    let expected_runs = short - short_wins.load(Ordering::SeqCst);
    assert!(
        wait_until(WAIT, || {
            tracker.runs() + (ZST_RUNS.load(Ordering::SeqCst) - zst_runs0) >= expected_runs
        }),
        "short timers fired within {WAIT:?}"
    );
    let unfired = timer.shutdown();
    let long_kept = (0..TIMERS).filter(|id| id % 3 == 2).count();
    assert_eq!(
        unfired.len(),
        long_kept,
        "every kept long timer is handed back"
    );
    std::thread::spawn(move || drop(unfired))
        .join()
        .expect("dropper");
    assert_eq!(tracker.corrupt(), 0, "no capture was overwritten");
    assert_eq!(
        tracker.runs() + (ZST_RUNS.load(Ordering::SeqCst) - zst_runs0),
        expected_runs,
        "exactly the short timers whose cancel lost ran"
    );
    assert!(tracker.runs.iter().all(|r| r.load(Ordering::SeqCst) <= 1));
    assert_eq!(tracker.not_dropped_once(), Vec::<usize>::new());
    assert_eq!(
        ZST_DROPS.load(Ordering::SeqCst) - zst_drops0,
        ids_of_kind(TIMERS, ZST)
    );
    assert!(ZST_RUNS.load(Ordering::SeqCst) - zst_runs0 <= short_zst);
    assert_eq!(tracker.drops(), TIMERS - ids_of_kind(TIMERS, ZST));
}

/// Round after round, a producer thread schedules timers due within 2 ms, hands
/// their handles to a holder thread, and exits (abandoning its heap) while the
/// fires and handle drops still free into its chunks; the next round's producer
/// adopts that heap. Every callback runs once, and the pool's chunks stay bounded.
#[test]
fn heaps_of_exited_producers_are_adopted_while_their_entries_are_still_freed() {
    let _serial = serial();
    const ROUNDS: usize = 60;
    const EACH: usize = 1_500;
    const TIMERS: usize = ROUNDS * EACH;
    let (zst_runs0, zst_drops0) = zst_counts();
    let timer = service(2, 1);
    let tracker = Tracker::new(TIMERS);
    let (sender, receiver) = mpsc::channel::<Vec<TimerHandle>>();
    let holder = std::thread::spawn(move || {
        // Keeps one round's handles while the next round schedules: the last
        // reference is a handle here or the service's, whichever goes last.
        let mut kept: Vec<TimerHandle> = Vec::new();
        for handles in receiver {
            drop(std::mem::replace(&mut kept, handles));
        }
    });
    let mut after_round = Vec::new();
    for round in 0..ROUNDS {
        let (service, mine, sender) = (timer.clone(), tracker.clone(), sender.clone());
        std::thread::spawn(move || {
            let handles: Vec<TimerHandle> = (round * EACH..(round + 1) * EACH)
                .map(|id| schedule(&service, id, MS * (id % 3) as u32, &mine))
                .collect();
            sender.send(handles).expect("holder alive");
        })
        .join()
        .expect("producer");
        // The previous round has fired by now (its entries may still be freeing):
        // what is live is this round's and the previous round's, whatever the
        // service's backlog.
        let fired = || tracker.runs() + (ZST_RUNS.load(Ordering::SeqCst) - zst_runs0);
        assert!(
            wait_until(WAIT, || fired() >= round * EACH),
            "round {round}: the previous rounds fired within {WAIT:?}"
        );
        after_round.push(chunks());
    }
    drop(sender);
    holder.join().expect("holder");
    assert!(
        wait_until(WAIT, || {
            tracker.runs() + (ZST_RUNS.load(Ordering::SeqCst) - zst_runs0) == TIMERS
        }),
        "every timer fired within {WAIT:?}: {} of {TIMERS}",
        tracker.runs() + (ZST_RUNS.load(Ordering::SeqCst) - zst_runs0)
    );
    assert!(timer.shutdown().is_empty());
    drop(timer);
    assert_eq!(tracker.corrupt(), 0, "no capture was overwritten");
    assert!(tracker
        .runs
        .iter()
        .enumerate()
        .all(|(id, r)| kind_of(id) == ZST || r.load(Ordering::SeqCst) == 1));
    assert_eq!(tracker.not_dropped_once(), Vec::<usize>::new());
    assert_eq!(
        ZST_DROPS.load(Ordering::SeqCst) - zst_drops0,
        ids_of_kind(TIMERS, ZST)
    );
    // A round's entries take at most one chunk per class (16 classes); two rounds'
    // entries are live when a round is counted, and the adopted heap takes the
    // earlier rounds' chunks back as it collects. A leak grows by a chunk a class a
    // few rounds; allow one chunk a class of slack over round 5.
    let base = after_round[5];
    let worst = *after_round[5..].iter().max().expect("rounds");
    assert!(
        worst <= base + 16,
        "pool chunks grew from {base} (round 5) to {worst}: {after_round:?}"
    );
}

/// Three cycles of 100 000 pending timers from two producer threads (which exit; the
/// next cycle's adopt their heaps), all handed back by `shutdown` and dropped on
/// another thread: each capture dropped once, and neither the pool's chunks nor the
/// process's live bytes grow from cycle to cycle.
#[test]
fn shutdown_bursts_of_100k_timers_drop_each_once_and_memory_is_reused() {
    let _serial = serial();
    const TIMERS: usize = 100_000;
    let mut peaks = Vec::new();
    let mut after = Vec::new();
    for cycle in 0..3 {
        let timer = service(2, 1);
        let tracker = Tracker::new(TIMERS);
        std::thread::scope(|scope| {
            for half in 0..2 {
                let (timer, tracker) = (&timer, &tracker);
                scope.spawn(move || {
                    for id in (half * TIMERS / 2)..((half + 1) * TIMERS / 2) {
                        drop(schedule(timer, id, HOUR, tracker));
                    }
                });
            }
        });
        peaks.push(chunks());
        let unfired = timer.shutdown();
        assert_eq!(unfired.len(), TIMERS, "cycle {cycle}");
        std::thread::spawn(move || drop(unfired))
            .join()
            .expect("dropper");
        drop(timer);
        assert_eq!(tracker.corrupt(), 0, "cycle {cycle}");
        assert_eq!(tracker.runs(), 0, "cycle {cycle}");
        assert_eq!(
            tracker.not_dropped_once(),
            Vec::<usize>::new(),
            "cycle {cycle}"
        );
        drop(tracker);
        after.push(live_bytes());
    }
    // 100 000 entries of 32 to 256 bytes: about 460 chunks. The cycles after the
    // first take the freed chunks back (keeping one spare a class) before making new
    // ones: 2 heaps x 16 classes of slack.
    assert!(
        peaks[1] <= peaks[0] + 32 && peaks[2] <= peaks[0] + 32,
        "pool chunks at each cycle's peak: {peaks:?}"
    );
    assert!(
        after[2] <= after[0] + (1 << 20),
        "live bytes after each cycle: {after:?}"
    );
}

/// One chunk's worth of 48-byte entries, again and again: each timer is due within
/// 2 ms and two threads holding clones cancel and drop it as it fires; exactly one of
/// fire and cancels wins, each capture is dropped once, and the chunk is reused.
#[test]
fn cancels_from_clones_racing_the_fire_free_each_entry_once_and_reuse_the_chunk() {
    let _serial = serial();
    const ROUNDS: usize = 20;
    const EACH: usize = 600;
    let timer = service(1, 1);
    let mut after_round = Vec::new();
    for round in 0..ROUNDS {
        let tracker = Tracker::new(EACH);
        let wins = AtomicUsize::new(0);
        let handles: Vec<TimerHandle> = (0..EACH)
            .map(|i| {
                // A 16-byte capture: 48-byte entries, one class.
                let canary = Canary::<0>::new(i, &tracker);
                timer
                    .schedule(MS * (i % 3) as u32, move || canary.run())
                    .expect("scheduled")
            })
            .collect();
        std::thread::scope(|scope| {
            for side in 0..2 {
                let (handles, wins) = (handles.clone(), &wins);
                scope.spawn(move || {
                    for (i, handle) in handles.into_iter().enumerate() {
                        if (i + side) % 2 == 0 {
                            std::thread::yield_now();
                        }
                        if handle.cancel() {
                            wins.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        drop(handles);
        let wins = wins.load(Ordering::SeqCst);
        assert!(
            wait_until(WAIT, || tracker.runs() + wins == EACH),
            "round {round}: {} ran, {wins} cancelled, of {EACH}",
            tracker.runs()
        );
        assert_eq!(tracker.corrupt(), 0, "round {round}");
        for id in 0..EACH {
            let (runs, drops) = (
                tracker.runs[id].load(Ordering::SeqCst),
                tracker.drops[id].load(Ordering::SeqCst),
            );
            assert!(
                runs <= 1 && drops == 1,
                "round {round} id {id}: {runs} runs, {drops} drops"
            );
        }
        after_round.push(chunks());
    }
    let base = after_round[2];
    assert!(
        after_round[2..].iter().all(|&c| c <= base + 2),
        "pool chunks per round: {after_round:?}"
    );
    assert!(timer.shutdown().is_empty());
}

/// On a manual clock with callbacks inline (entries keep the clock's options, a
/// different size; every free after a fire is the shard thread's), three producers
/// that exit each cycle schedule timers in every class; one `advance` fires them
/// all. Every callback runs once, and the chunks stay bounded over ten cycles.
#[test]
fn manual_clock_inline_fires_free_on_the_shard_and_chunks_stay_bounded() {
    let _serial = serial();
    const CYCLES: usize = 10;
    const EACH: usize = 1_000;
    const TIMERS: usize = 3 * EACH;
    let clock = ManualClock::new();
    let timer = ShardedTimer::builder()
        .shards(2)
        .callbacks(Callbacks::inline())
        .pin_cores(false)
        .thread_name("audit-pool-manual")
        .clock(clock.clone())
        .build()
        .expect("builds");
    let mut after_cycle = Vec::new();
    for cycle in 0..CYCLES {
        let (zst_runs0, zst_drops0) = zst_counts();
        let tracker = Tracker::new(TIMERS);
        std::thread::scope(|scope| {
            for producer in 0..3 {
                let (timer, tracker) = (&timer, &tracker);
                scope.spawn(move || {
                    for id in producer * EACH..(producer + 1) * EACH {
                        drop(schedule(timer, id, Duration::from_secs(1), tracker));
                    }
                });
            }
        });
        clock.advance(Duration::from_secs(2));
        let done = || tracker.runs() + (ZST_RUNS.load(Ordering::SeqCst) - zst_runs0) == TIMERS;
        assert!(
            wait_until(WAIT, done),
            "cycle {cycle}: all fired within {WAIT:?}"
        );
        assert!(wait_until(WAIT, || tracker.not_dropped_once().is_empty()));
        assert_eq!(tracker.corrupt(), 0, "cycle {cycle}");
        assert_eq!(
            ZST_DROPS.load(Ordering::SeqCst) - zst_drops0,
            ids_of_kind(TIMERS, ZST)
        );
        after_cycle.push(chunks());
    }
    let base = after_cycle[2];
    assert!(
        after_cycle[2..].iter().all(|&c| c <= base + 3 * 16),
        "pool chunks per cycle: {after_cycle:?}"
    );
    assert!(timer.shutdown().is_empty());
}

/// One producer thread, cycle after cycle, schedules an hour-long timer it keeps
/// (pinning its chunk: never all blocks back) and 500 timers due at once in the same
/// class, freed on a worker after their runs, and waits for them. Each cycle's
/// timers take the blocks the last cycle's freed (the whole list taken, joined to
/// the chunk's local list): the pool's chunks do not grow with the cycles.
#[test]
fn freed_blocks_of_chunks_pinned_by_live_timers_are_all_reused() {
    let _serial = serial();
    const CYCLES: usize = 30;
    const EACH: usize = 500;
    let timer = service(1, 1);
    let tracker = Tracker::new(CYCLES * (EACH + 1));
    let after_cycle = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let mut pins = Vec::new();
                let mut after_cycle = Vec::new();
                for cycle in 0..CYCLES {
                    let first = cycle * (EACH + 1);
                    let pin = Canary::<0>::new(first, &tracker);
                    pins.push(timer.schedule(HOUR, move || pin.run()).expect("scheduled"));
                    for id in first + 1..=first + EACH {
                        let canary = Canary::<0>::new(id, &tracker);
                        drop(
                            timer
                                .schedule(Duration::ZERO, move || canary.run())
                                .expect("scheduled"),
                        );
                    }
                    assert!(
                        wait_until(WAIT, || tracker.runs() == (cycle + 1) * EACH),
                        "cycle {cycle}: fired within {WAIT:?}"
                    );
                    after_cycle.push(chunks());
                }
                for pin in pins {
                    assert!(pin.cancel(), "a pinned timer is cancelled");
                }
                after_cycle
            })
            .join()
            .expect("producer")
    });
    assert!(timer.shutdown().is_empty());
    assert_eq!(tracker.corrupt(), 0);
    assert_eq!(tracker.runs(), CYCLES * EACH);
    assert_eq!(tracker.not_dropped_once(), Vec::<usize>::new());
    // 48-byte entries, 680 to a chunk: the pins and one cycle's timers fit in two.
    let base = after_cycle[2];
    assert!(
        after_cycle[2..].iter().all(|&c| c <= base + 1),
        "pool chunks per cycle: {after_cycle:?}"
    );
}
