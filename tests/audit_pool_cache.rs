//! Audit of the entry pool's process-wide cache of retired chunks (commit e04dde7,
//! `src/entry/pool/cache.rs`), through the public API only.
//!
//! What the change claims, and how each claim is attacked here:
//!
//! 1. A chunk handed out from the cache is never still in use. Every capture is a
//!    canary (`Bytes<N>`: exactly `N` bytes, its first four the timer's id, the rest a
//!    function of id and offset), checked when it runs and when it is dropped; each id
//!    counts its runs and drops, which must come out exactly once / as the timer's
//!    fate says. A chunk handed out twice, or a block of it, overwrites a live capture
//!    (an entry's header, a free block's link) or drops one twice. The tests move
//!    chunks between heaps of live threads and of exited ones, between size classes,
//!    and across many services in a row, while other threads cancel, fire, drop
//!    handles and drop `shutdown`'s `Unfired`. To show that the chunks did pass from
//!    one heap to another, a capture dropped in place (by a cancel) records its chunk
//!    (its address with the low 15 bits cleared).
//! 2. The cache is bounded (32 MiB): bursts larger than it leave at most the cache plus
//!    the heaps' spares; repeated bursts do not grow the pool's chunks.
//! 3. Reuse: a second burst after the first's timers are gone takes (almost) no new
//!    chunk from the global allocator.
//! 4. Nothing else regressed: hostile destructors (one that panics, one that calls
//!    `shutdown`, one that drops the last clone of the service), captures of every
//!    size from 0 to 300 bytes (every pool class and beyond), over-aligned captures,
//!    plain zero-sized closures, and a thread scheduling from a thread-local
//!    destructor after its own pool heap was abandoned.
//!
//! This binary counts the pool's chunks (allocations of 32 KiB aligned to 32 KiB) and
//! all live bytes with a global allocator of its own, and its trackers are global, so
//! its tests run one at a time (`serial`). A cancel frees its entry only when the
//! shard drops its reference, so tests that measure reuse wait for the shards
//! (`Stats::cancelled`) before the next burst; `pump` pushes chunks through the cache
//! between the rounds of the other tests, so that their heaps take chunks that other
//! heaps retired.
//!
//! Two tests FAIL, on purpose (claims 2 and 3 as stated, not the cache's own
//! bookkeeping): a chunk is retired only when its owner collects, so the chunks of a
//! burst on a thread that stays alive and idle, or in an abandoned heap that no new
//! thread adopts, are neither cached nor returned, however long their timers have
//! been gone: `a_burst_on_one_live_thread_takes_the_chunks_another_live_threads_burst_freed`
//! and `threads_that_exit_together_leave_no_more_than_the_cache_once_their_timers_are_gone`.
//! Every other test passes in debug, release and under AddressSanitizer (which cannot
//! see a use of a cached chunk: only the canaries can).

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Duration;

use sharded_timer::{
    Callbacks, ManualClock, ScheduleError, ShardedTimer, TimerHandle, TimerState, Unfired,
};
use support::{wait_until, Rng, WAIT};

const MS: Duration = Duration::from_millis(1);
const HOUR: Duration = Duration::from_secs(3600);
const SECOND: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------
// The counting allocator.
// ---------------------------------------------------------------------------------

/// The entry pool's chunks: 32 KiB, aligned to 32 KiB.
const CHUNK: usize = 32 * 1024;
/// The cache's limit, in chunks (32 MiB).
const CACHE_CHUNKS: usize = 32 * 1024 * 1024 / CHUNK;
/// Size classes of the pool (16-byte steps up to 256): at most one spare each per heap.
const CLASSES: usize = 16;

/// Chunk-layout allocations ever made.
static CHUNKS_MADE: AtomicUsize = AtomicUsize::new(0);
/// Chunk-layout allocations live.
static CHUNKS_LIVE: AtomicUsize = AtomicUsize::new(0);
/// Bytes of all live allocations.
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting.
struct Counting;

fn is_chunk(layout: Layout) -> bool {
    layout.size() == CHUNK && layout.align() == CHUNK
}

// SAFETY: every call is forwarded to `System` unchanged; the counting only reads the
// layout.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            // ORDERING: Relaxed: counters read after joins and polls only.
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            if is_chunk(layout) {
                CHUNKS_MADE.fetch_add(1, Ordering::Relaxed);
                CHUNKS_LIVE.fetch_add(1, Ordering::Relaxed);
            }
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        if is_chunk(layout) {
            CHUNKS_LIVE.fetch_sub(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(block, layout) };
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn chunks_made() -> usize {
    CHUNKS_MADE.load(Ordering::Relaxed)
}

fn chunks_live() -> usize {
    CHUNKS_LIVE.load(Ordering::Relaxed)
}

fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// One test at a time: the counters and trackers are process-wide.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    reset_tracker();
    guard
}

// ---------------------------------------------------------------------------------
// The canaries.
// ---------------------------------------------------------------------------------

/// Ids a test may use.
const MAX_IDS: usize = 1 << 18;

/// Per id: runs and drops of its capture.
static RUNS: [AtomicU8; MAX_IDS] = [const { AtomicU8::new(0) }; MAX_IDS];
static DROPS: [AtomicU8; MAX_IDS] = [const { AtomicU8::new(0) }; MAX_IDS];
/// Runs and drops of captures too small to carry an id (0 to 3 bytes).
static SMALL_RUNS: AtomicUsize = AtomicUsize::new(0);
static SMALL_DROPS: AtomicUsize = AtomicUsize::new(0);
/// Runs of plain zero-sized closures (no destructor).
static PLAIN_RUNS: AtomicUsize = AtomicUsize::new(0);
/// Per id: whether a cancel of it returned `true` (for tests where cancels race).
static WON: [AtomicBool; MAX_IDS] = [const { AtomicBool::new(false) }; MAX_IDS];
/// Captures that read wrong when run or dropped.
static CORRUPT: AtomicUsize = AtomicUsize::new(0);
/// While set, a capture dropped with an id records the chunk it lies in.
static RECORD: AtomicBool = AtomicBool::new(false);
/// (chunk, id) of captures dropped while `RECORD` was set.
static RECORDED: Mutex<Vec<(usize, u32)>> = Mutex::new(Vec::new());

fn reset_tracker() {
    for ((r, d), w) in RUNS.iter().zip(DROPS.iter()).zip(WON.iter()) {
        r.store(0, Ordering::SeqCst);
        d.store(0, Ordering::SeqCst);
        w.store(false, Ordering::SeqCst);
    }
    SMALL_RUNS.store(0, Ordering::SeqCst);
    SMALL_DROPS.store(0, Ordering::SeqCst);
    PLAIN_RUNS.store(0, Ordering::SeqCst);
    CORRUPT.store(0, Ordering::SeqCst);
    RECORD.store(false, Ordering::SeqCst);
    RECORDED.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

fn byte(id: u32, i: usize) -> u8 {
    let x = u64::from(id)
        .wrapping_add(1)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .rotate_left((i % 61) as u32)
        ^ (i as u64).wrapping_mul(0x2545_F491_4F6C_DD1D);
    (x >> 56) as u8 ^ (x as u8) ^ 0x5A
}

/// The pattern of captures too small for an id.
const SMALL: [u8; 3] = [0xA5, 0x3C, 0xC3];

/// A capture of exactly `N` bytes (alignment 1): the id in its first four, then a
/// pattern of id and offset.
#[repr(C)]
struct Bytes<const N: usize>([u8; N]);

impl<const N: usize> Bytes<N> {
    fn new(id: u32) -> Bytes<N> {
        const { assert!(core::mem::size_of::<Bytes<N>>() == N) };
        let mut bytes = [0u8; N];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = if N < 4 {
                SMALL[i]
            } else if i < 4 {
                id.to_le_bytes()[i]
            } else {
                byte(id, i)
            };
        }
        Bytes(bytes)
    }

    fn id(&self) -> Option<u32> {
        (N >= 4).then(|| u32::from_le_bytes([self.0[0], self.0[1], self.0[2], self.0[3]]))
    }

    fn intact(&self) -> bool {
        match self.id() {
            Some(id) => (id as usize) < MAX_IDS && (4..N).all(|i| self.0[i] == byte(id, i)),
            None => self.0.iter().zip(SMALL).all(|(&b, s)| b == s),
        }
    }

    fn ran(&self) {
        if !self.intact() {
            CORRUPT.fetch_add(1, Ordering::SeqCst);
            return;
        }
        match self.id() {
            Some(id) => {
                RUNS[id as usize].fetch_add(1, Ordering::SeqCst);
            }
            None => {
                SMALL_RUNS.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

impl<const N: usize> Drop for Bytes<N> {
    fn drop(&mut self) {
        if !self.intact() {
            CORRUPT.fetch_add(1, Ordering::SeqCst);
            return;
        }
        match self.id() {
            Some(id) => {
                DROPS[id as usize].fetch_add(1, Ordering::SeqCst);
                if RECORD.load(Ordering::SeqCst) {
                    let chunk = (self as *const Self as usize) & !(CHUNK - 1);
                    RECORDED
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((chunk, id));
                }
            }
            None => {
                SMALL_DROPS.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

/// The callback of timer `id`, capturing exactly `N` bytes.
fn job<const N: usize>(id: u32) -> impl FnOnce() + Send + 'static {
    let bytes = Bytes::<N>::new(id);
    move || {
        let bytes = bytes;
        bytes.ran();
    }
}

type Sched = fn(&ShardedTimer, u32, Duration) -> Result<TimerHandle, ScheduleError>;

fn sched<const N: usize>(
    timer: &ShardedTimer,
    id: u32,
    delay: Duration,
) -> Result<TimerHandle, ScheduleError> {
    let f = job::<N>(id);
    assert_eq!(core::mem::size_of_val(&f), N, "the closure is its capture");
    timer.schedule(delay, f)
}

/// An over-aligned capture (alignment above 16: never pooled).
#[repr(C, align(32))]
struct Align32(Bytes<40>);
/// A capture aligned to the pool's step exactly.
#[repr(C, align(16))]
struct Align16(Bytes<20>);

macro_rules! by_size {
    ($($n:literal)*) => { [$(sched::<$n> as Sched),*] };
}

/// `BY_SIZE[n]` schedules a timer whose closure is exactly `n` bytes.
static BY_SIZE: [Sched; 301] = by_size!(
    0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
    32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59
    60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87
    88 89 90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111
    112 113 114 115 116 117 118 119 120 121 122 123 124 125 126 127 128 129 130 131 132
    133 134 135 136 137 138 139 140 141 142 143 144 145 146 147 148 149 150 151 152 153
    154 155 156 157 158 159 160 161 162 163 164 165 166 167 168 169 170 171 172 173 174
    175 176 177 178 179 180 181 182 183 184 185 186 187 188 189 190 191 192 193 194 195
    196 197 198 199 200 201 202 203 204 205 206 207 208 209 210 211 212 213 214 215 216
    217 218 219 220 221 222 223 224 225 226 227 228 229 230 231 232 233 234 235 236 237
    238 239 240 241 242 243 244 245 246 247 248 249 250 251 252 253 254 255 256 257 258
    259 260 261 262 263 264 265 266 267 268 269 270 271 272 273 274 275 276 277 278 279
    280 281 282 283 284 285 286 287 288 289 290 291 292 293 294 295 296 297 298 299 300
);

/// Schedules timer `id` with a capture of `size` bytes: 0 to 300 exactly; 301 an
/// over-aligned one (align 32, 64 bytes), 302 one aligned to 16 (32 bytes), 303 a
/// plain zero-sized closure without destructor (counted in `PLAIN_RUNS` only).
fn schedule_sized(timer: &ShardedTimer, size: usize, id: u32, delay: Duration) -> TimerHandle {
    let scheduled = match size {
        0..=300 => BY_SIZE[size](timer, id, delay),
        301 => {
            let capture = Align32(Bytes::new(id));
            timer.schedule(delay, move || {
                let capture = capture;
                capture.0.ran();
            })
        }
        302 => {
            let capture = Align16(Bytes::new(id));
            timer.schedule(delay, move || {
                let capture = capture;
                capture.0.ran();
            })
        }
        _ => timer.schedule(delay, || {
            PLAIN_RUNS.fetch_add(1, Ordering::SeqCst);
        }),
    };
    scheduled.expect("scheduled")
}

/// Whether a capture of `size` carries its id (else it is counted in `SMALL_*`, or,
/// for 303, in `PLAIN_RUNS`).
fn tracked(size: usize) -> bool {
    (4..=302).contains(&size)
}

/// Checks ids `ids`: no capture read wrong; every capture dropped exactly once; run
/// exactly once if `ran(id)`, else never. Captures too small for an id are checked in
/// aggregate, against `SMALL_*` and `PLAIN_RUNS` (which the test must have reset).
fn verify(
    what: &str,
    ids: std::ops::Range<u32>,
    size_of: impl Fn(u32) -> usize,
    ran: impl Fn(u32) -> bool,
) {
    assert_eq!(
        CORRUPT.load(Ordering::SeqCst),
        0,
        "{what}: captures read wrong (overwritten)"
    );
    let (mut small, mut small_runs, mut plain_runs) = (0, 0, 0);
    let mut wrong = Vec::new();
    for id in ids {
        let size = size_of(id);
        let should = ran(id);
        if !tracked(size) {
            if size == 303 {
                plain_runs += usize::from(should);
            } else {
                small += 1;
                small_runs += usize::from(should);
            }
            continue;
        }
        let runs = RUNS[id as usize].load(Ordering::SeqCst);
        let drops = DROPS[id as usize].load(Ordering::SeqCst);
        if runs != u8::from(should) || drops != 1 {
            wrong.push((id, size, runs, drops));
        }
    }
    assert!(
        wrong.is_empty(),
        "{what}: {} timers wrong (id, size, runs, drops), first: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(8)]
    );
    assert_eq!(
        SMALL_DROPS.load(Ordering::SeqCst),
        small,
        "{what}: small drops"
    );
    assert_eq!(
        SMALL_RUNS.load(Ordering::SeqCst),
        small_runs,
        "{what}: small runs"
    );
    assert_eq!(
        PLAIN_RUNS.load(Ordering::SeqCst),
        plain_runs,
        "{what}: ZST runs"
    );
}

/// Sum of the runs of the tracked ids in `ids`, plus the untracked runs.
fn runs_so_far(ids: std::ops::Range<u32>) -> usize {
    ids.map(|id| usize::from(RUNS[id as usize].load(Ordering::SeqCst)))
        .sum::<usize>()
        + SMALL_RUNS.load(Ordering::SeqCst)
        + PLAIN_RUNS.load(Ordering::SeqCst)
}

// ---------------------------------------------------------------------------------
// Services.
// ---------------------------------------------------------------------------------

fn pool_service(shards: usize) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(shards)
        .executor_threads(1)
        .pin_cores(false)
        .thread_name("audit-cache")
        .build()
        .expect("builds")
}

fn inline_manual(shards: usize, clock: &ManualClock) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(shards)
        .callbacks(Callbacks::inline())
        .pin_cores(false)
        .thread_name("audit-cache-m")
        .clock(clock.clone())
        .build()
        .expect("builds")
}

/// Waits until the shards have processed `n` cancels (and so dropped their
/// references: the entries are freed).
fn wait_cancelled(timer: &ShardedTimer, n: usize) {
    assert!(
        wait_until(WAIT, || timer.stats().cancelled >= n as u64),
        "the shards processed {n} cancels within {WAIT:?}: {}",
        timer.stats().cancelled
    );
}

/// Drops `unfired` on a thread of its own (a free from a third thread).
fn drop_elsewhere<T: Send + 'static>(value: T) {
    std::thread::spawn(move || drop(value))
        .join()
        .expect("dropper");
}

// ---------------------------------------------------------------------------------
// Claim 1 and 4: every capture size, chunks through the cache, heaps adopted.
// ---------------------------------------------------------------------------------

/// Twelve rounds, each on a new producer thread (which adopts the heap the last one
/// abandoned), schedule four timers of every capture size 0..=300 plus over-aligned
/// and plain ZST ones, sizes interleaved so that consecutive entries take different
/// classes. Per timer, by id: fire on the manual clock (freed on the shard thread);
/// cancel from a canceller thread; keep pending with its handle dropped on another
/// thread (handed back by `shutdown` at the end: half dropped on another thread, half
/// run here); or fire with the handle kept and cancelled after the fire (`false`).
/// Between rounds a hog thread schedules and cancels 3 to 35 chunks of 256-byte
/// entries and exits, and the next producer's heap (which adopts the hog's) retires
/// them into the cache and takes them back out, in other classes: chunks pass between heaps and classes through the cache while the kept
/// timers still live in neighbouring chunks. Every capture runs or drops exactly as
/// its fate says.
#[test]
fn every_capture_size_runs_or_drops_once_as_chunks_pass_between_adopted_heaps() {
    let _serial = serial();
    const SIZES: usize = 304;
    const PER: u32 = (SIZES * 4) as u32;
    const ROUNDS: u32 = 12;
    let clock = ManualClock::new();
    let timer = inline_manual(2, &clock);
    let size_of = |id: u32| (id as usize * 7 + (id / PER) as usize) % SIZES;
    let fate = |id: u32| (id / 5) % 4; // 0 fire, 1 cancel, 2 unfired, 3 fire + late cancel
    let hog_base = ROUNDS * PER;
    const HOG_MOST: u32 = 35 * 127;
    let hog_count = |round: u32| (3 + (round % 5) * 8) * 127;
    // The test id of each timer left pending (`TimerId`s are opaque).
    let mut ids: HashMap<sharded_timer::TimerId, u32> = HashMap::new();
    let mut cancels = 0;
    for round in 0..ROUNDS {
        let (tx, rx) = mpsc::channel::<(u32, TimerHandle)>();
        let canceller = std::thread::spawn(move || {
            let mut late = Vec::new();
            let mut kept = Vec::new();
            for (id, handle) in rx {
                match fate(id) {
                    1 => assert!(handle.cancel(), "id {id}: pending until cancelled"),
                    2 => kept.push((handle.id(), id)),
                    _ => late.push((id, handle)),
                }
            }
            (late, kept)
        });
        let producer = timer.clone();
        std::thread::spawn(move || {
            for id in round * PER..(round + 1) * PER {
                let delay = if fate(id) == 2 || fate(id) == 1 {
                    HOUR
                } else {
                    SECOND
                };
                let handle = schedule_sized(&producer, size_of(id), id, delay);
                tx.send((id, handle)).expect("canceller alive");
            }
        })
        .join()
        .expect("producer");
        let (late, kept) = canceller.join().expect("canceller");
        ids.extend(kept);
        clock.advance(2 * SECOND);
        for (id, handle) in late {
            assert_eq!(handle.state(), TimerState::Fired, "id {id}");
            assert!(!handle.cancel(), "id {id}: a fired timer is not cancelled");
        }
        // The hog: chunks of 256-byte entries (216-byte captures on a manual-clock
        // service: header 32 + options 8), cancelled at once; exits.
        let hog = timer.clone();
        let base = hog_base + round * HOG_MOST;
        let count = hog_count(round);
        std::thread::spawn(move || {
            let handles: Vec<TimerHandle> = (base..base + count)
                .map(|id| BY_SIZE[216](&hog, id, HOUR).expect("scheduled"))
                .collect();
            for handle in handles {
                assert!(handle.cancel());
            }
        })
        .join()
        .expect("hog");
        cancels += (round * PER..(round + 1) * PER)
            .filter(|&id| fate(id) == 1)
            .count()
            + count as usize;
        wait_cancelled(&timer, cancels);
    }
    let unfired = timer.shutdown();
    let pending = (0..ROUNDS * PER).filter(|&id| fate(id) == 2).count();
    assert_eq!(unfired.len(), pending, "every kept timer is handed back");
    // Half of them (even test ids) run here, the rest are dropped on another thread.
    let (run_here, dropped): (Vec<Unfired>, Vec<Unfired>) = unfired
        .into_iter()
        .partition(|u| ids[&u.id()].is_multiple_of(2));
    for unfired in run_here {
        unfired.run();
    }
    drop_elsewhere(dropped);
    drop(timer);
    verify("every size", 0..ROUNDS * PER, size_of, |id| {
        fate(id) == 0 || fate(id) == 3 || (fate(id) == 2 && id % 2 == 0)
    });
    let hogs = (0..ROUNDS).flat_map(|round| {
        let base = hog_base + round * HOG_MOST;
        base..base + hog_count(round)
    });
    for id in hogs {
        assert_eq!(
            (
                RUNS[id as usize].load(Ordering::SeqCst),
                DROPS[id as usize].load(Ordering::SeqCst)
            ),
            (0, 1),
            "hog id {id}"
        );
    }
}

/// Forty-eight services made and dropped one after another, three kinds in turn (a
/// pool of one shard; inline on a manual clock, two shards; a pool of two shards).
/// For each, two producer threads (which exit: the next service's producers adopt
/// their heaps) schedule 300 timers each, of sizes across every class; a handler
/// thread cancels some, races a cancel against the fire of others, and drops the
/// other handles. Then the service ends: `shutdown` with its `Unfired` dropped on
/// another thread, or the drop of its last clone (pending callbacks dropped unrun).
/// Every capture runs or drops exactly as its fate says.
#[test]
fn services_made_and_dropped_in_a_row_drop_every_capture_exactly_once() {
    let _serial = serial();
    const SERVICES: u32 = 48;
    const EACH: u32 = 600;
    let size_of = |id: u32| ((id as usize) * 37 + 11) % 304;
    // id % 8: 0, 1 fire; 2 fire raced by a cancel; 3, 4 cancelled; 5, 6, 7 pending.
    let short = |id: u32| id % 8 <= 2;
    let mut won_all: HashSet<u32> = HashSet::new();
    let mut expected_runs = 0;
    for service in 0..SERVICES {
        let base = service * EACH;
        let clock = ManualClock::new();
        let timer = match service % 3 {
            0 => pool_service(1),
            1 => inline_manual(2, &clock),
            _ => pool_service(2),
        };
        pump(&timer, 2 + (service as usize % 7) * 3);
        let (tx, rx) = mpsc::channel::<(u32, TimerHandle)>();
        let handler = std::thread::spawn(move || {
            let mut won = Vec::new();
            for (id, handle) in rx {
                match id % 8 {
                    2 if handle.cancel() => {
                        won.push(id);
                    }
                    3 | 4 => assert!(handle.cancel(), "id {id}: pending until cancelled"),
                    _ => {}
                }
            }
            won
        });
        std::thread::scope(|scope| {
            for half in 0..2 {
                let (timer, tx) = (&timer, tx.clone());
                scope.spawn(move || {
                    let start = base + half * EACH / 2;
                    for id in start..start + EACH / 2 {
                        let delay = if short(id) { Duration::ZERO } else { HOUR };
                        let handle = schedule_sized(timer, size_of(id), id, delay);
                        tx.send((id, handle)).expect("handler alive");
                    }
                });
            }
        });
        drop(tx);
        let won = handler.join().expect("handler");
        expected_runs += (base..base + EACH).filter(|&id| short(id)).count() - won.len();
        won_all.extend(won);
        if service % 3 == 1 {
            clock.advance(Duration::ZERO);
        }
        assert!(
            wait_until(WAIT, || runs_so_far(0..base + EACH) >= expected_runs),
            "service {service}: short timers ran within {WAIT:?}: {} of {expected_runs}",
            runs_so_far(0..base + EACH)
        );
        if service % 2 == 0 {
            let unfired = timer.shutdown();
            assert_eq!(
                unfired.len(),
                (base..base + EACH).filter(|id| id % 8 >= 5).count(),
                "service {service}: the pending timers come back"
            );
            drop_elsewhere(unfired);
        }
        drop(timer);
        verify(
            &format!("service {service}"),
            0..base + EACH,
            size_of,
            |id| short(id) && !won_all.contains(&id),
        );
    }
}

/// A producer thread of the live-heaps test, and where to send it bursts (first id,
/// count).
type Producer = (mpsc::Sender<(u32, u32)>, std::thread::JoinHandle<()>);

/// Two live producer threads, A and B, whose heaps never change owner, burst in
/// turn: A in 232- to 256-byte entries (classes 14 and 15), B in 152- to 176-byte
/// ones (classes 9 and 10), big and small in alternate rounds, so that the heap whose
/// burst shrinks retires chunks (at its next collection) that the other's growing
/// burst takes from the cache, in another class. A third thread cancels half of the
/// handles as they arrive, racing the burst that is filling the same chunks, the
/// other half when the burst ends, and keeps one timer in a thousand for three more bursts
/// (a chunk with a live neighbour stays). Each capture
/// dropped by a cancel records its chunk: chunks must have served both heaps; after
/// the first three rounds the bursts ask the allocator for at most four chunks in all;
/// and every capture is dropped once, never run.
#[test]
#[cfg_attr(
    chunk_cache_off,
    ignore = "counts on the entry pool's chunk cache, off in this build"
)]
fn chunks_retired_by_one_live_heap_serve_another_heap_and_class_while_neighbours_live() {
    let _serial = serial();
    const ROUNDS: u32 = 8;
    const SLOT: u32 = 4_000;
    const SMALL_BURST: u32 = 600;
    let timer = pool_service(1);
    // A's sizes 200..=224, B's 120..=144 (no options: an entry is 32 bytes + capture).
    let size_of = |id: u32| {
        let producer = (id / SLOT) % 2;
        (if producer == 0 { 200 } else { 120 }) + (id as usize % 25)
    };
    let (cancel_tx, cancel_rx) = mpsc::channel::<Option<(u32, TimerHandle)>>();
    let (done_tx, done_rx) = mpsc::channel::<usize>();
    let canceller = std::thread::spawn(move || {
        let mut cancels = 0;
        // Pins by the round that made them; a `None` ends a burst.
        let mut pins: Vec<Vec<TimerHandle>> = Vec::new();
        let mut current: Vec<TimerHandle> = Vec::new();
        let mut held: Vec<(u32, TimerHandle)> = Vec::new();
        for message in cancel_rx {
            match message {
                Some((id, handle)) => {
                    if id % 1000 == 7 {
                        current.push(handle);
                    } else if id % 2 == 0 {
                        assert!(handle.cancel(), "id {id}: pending until cancelled");
                        cancels += 1;
                    } else {
                        held.push((id, handle));
                    }
                }
                None => {
                    for (id, handle) in held.drain(..) {
                        assert!(handle.cancel(), "id {id}: pending until cancelled");
                        cancels += 1;
                    }
                    pins.push(std::mem::take(&mut current));
                    // A burst's pins live through the next three bursts.
                    if pins.len() > 3 {
                        for pin in pins.remove(0) {
                            assert!(pin.cancel(), "a pin is pending until cancelled");
                            cancels += 1;
                        }
                    }
                    done_tx.send(cancels).expect("main alive");
                }
            }
        }
        for pin in pins.into_iter().flatten() {
            assert!(pin.cancel());
        }
    });
    let producers: Vec<Producer> = (0..2)
        .map(|_| {
            let (tx, rx) = mpsc::channel::<(u32, u32)>();
            let (timer, cancel_tx) = (timer.clone(), cancel_tx.clone());
            let thread = std::thread::spawn(move || {
                for (base, count) in rx {
                    for id in base..base + count {
                        let handle = schedule_sized(&timer, size_of(id), id, HOUR);
                        cancel_tx.send(Some((id, handle))).expect("canceller alive");
                    }
                    cancel_tx.send(None).expect("canceller alive");
                }
            });
            (tx, thread)
        })
        .collect();
    drop(cancel_tx);
    RECORD.store(true, Ordering::SeqCst);
    let mut made = Vec::new();
    let mut ids_used = Vec::new();
    for round in 0..ROUNDS {
        for (p, (tx, _)) in producers.iter().enumerate() {
            let p = p as u32;
            let base = (round * 2 + p) * SLOT;
            let big = (round + p).is_multiple_of(2);
            let count = if big { SLOT } else { SMALL_BURST };
            let before = chunks_made();
            tx.send((base, count)).expect("producer alive");
            let cancels = done_rx.recv_timeout(WAIT).expect("the burst was cancelled");
            made.push(chunks_made() - before);
            // A cancel frees the entry when the shard drops its reference: wait for
            // the shard, so that the next burst's collection finds every block back.
            wait_cancelled(&timer, cancels);
            ids_used.extend(base..base + count);
        }
    }
    for (tx, thread) in producers {
        drop(tx);
        thread.join().expect("producer");
    }
    canceller.join().expect("canceller");
    RECORD.store(false, Ordering::SeqCst);
    assert!(timer.shutdown().is_empty());
    assert_eq!(CORRUPT.load(Ordering::SeqCst), 0, "captures read wrong");
    let wrong: Vec<u32> = ids_used
        .iter()
        .copied()
        .filter(|&id| {
            RUNS[id as usize].load(Ordering::SeqCst) != 0
                || DROPS[id as usize].load(Ordering::SeqCst) != 1
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "timers not dropped exactly once: {wrong:?}"
    );
    // Which producers' entries each chunk held.
    let mut users: HashMap<usize, [bool; 2]> = HashMap::new();
    for &(chunk, id) in RECORDED.lock().unwrap().iter() {
        users.entry(chunk).or_default()[((id / SLOT) % 2) as usize] = true;
    }
    let shared = users.values().filter(|u| u[0] && u[1]).count();
    assert!(
        shared >= 10,
        "chunks that held entries of both heaps: {shared} of {} (allocated per burst \
         {made:?})",
        users.len()
    );
    // Round 2's big burst may still need new chunks (the other heap holds what it
    // took until its next collection); from round 3 on, the chunks are there.
    let later: usize = made[6..].iter().sum();
    assert!(
        later <= 4,
        "chunks allocated per burst: {made:?} (from round 3: {later})"
    );
}

// ---------------------------------------------------------------------------------
// Claim 2 and 3: bounded, and reused.
// ---------------------------------------------------------------------------------

/// A thread that schedules one timer with a zero-sized closure (a 32-byte entry, a
/// class the bursts here do not use), cancels it and exits: its heap (the last one
/// abandoned) has no current chunk in that class, so it collects at once, retiring
/// every chunk whose blocks all came back.
fn collect_abandoned(timer: &ShardedTimer) {
    let timer = timer.clone();
    std::thread::spawn(move || {
        let handle = timer.schedule(HOUR, || {}).expect("scheduled");
        assert!(handle.cancel());
    })
    .join()
    .expect("collector");
}

/// Pushes about `chunks` chunks through the cache: a thread schedules that many
/// chunks' worth of 256-byte entries (untracked 216-byte captures), cancels them,
/// waits for the shards to free them, and exits; `collect_abandoned` then adopts its
/// heap (the last abandoned) and retires them into the cache, for the test's next
/// heap to take.
fn pump(timer: &ShardedTimer, chunks: usize) {
    let n = chunks * 127;
    let before = timer.stats().cancelled;
    let service = timer.clone();
    std::thread::spawn(move || {
        let handles: Vec<TimerHandle> = (0..n)
            .map(|_| {
                let pad = [0xEEu8; 216];
                service
                    .schedule(HOUR, move || {
                        std::hint::black_box(&pad);
                    })
                    .expect("scheduled")
            })
            .collect();
        for handle in handles {
            assert!(handle.cancel());
        }
    })
    .join()
    .expect("pump");
    assert!(
        wait_until(WAIT, || timer.stats().cancelled >= before + n as u64),
        "the pump's timers freed within {WAIT:?}"
    );
    collect_abandoned(timer);
}

/// Three bursts of 195,072 hour-long timers of 256-byte entries (1,536 chunks, 48
/// MiB: half as much again as the cache holds), each on a thread of its own that
/// cancels them all and exits, then a collection of its heap. After each, the pool
/// holds at most what it held before plus the cache's 1,024 chunks and a heap's
/// spares (the rest went back to the allocator); the peaks and what is left do not
/// grow from burst to burst, nor do the process's live bytes.
#[test]
fn bursts_larger_than_the_cache_leave_at_most_the_cache_and_do_not_grow() {
    let _serial = serial();
    const PER_CHUNK: u32 = 127; // (32 KiB - 128-byte head) / 256
    const BURST: u32 = 1_536 * PER_CHUNK;
    let timer = pool_service(1);
    collect_abandoned(&timer);
    let mut cancels = 1;
    let before = chunks_live();
    let mut peaks = Vec::new();
    let mut after = Vec::new();
    let mut bytes = Vec::new();
    for burst in 0..3 {
        let producer = timer.clone();
        let peak = std::thread::spawn(move || {
            let handles: Vec<TimerHandle> = (0..BURST)
                .map(|id| BY_SIZE[224](&producer, id, HOUR).expect("scheduled"))
                .collect();
            let peak = chunks_live();
            for handle in handles {
                assert!(handle.cancel());
            }
            peak
        })
        .join()
        .expect("burst");
        // The shard frees each cancelled entry when it drops its reference.
        cancels += BURST as usize;
        wait_cancelled(&timer, cancels);
        collect_abandoned(&timer);
        cancels += 1;
        peaks.push(peak);
        after.push(chunks_live());
        bytes.push(live_bytes());
        assert_eq!(CORRUPT.load(Ordering::SeqCst), 0, "burst {burst}");
        let wrong = (0..BURST)
            .filter(|&id| {
                DROPS[id as usize].load(Ordering::SeqCst) != burst + 1
                    || RUNS[id as usize].load(Ordering::SeqCst) != 0
            })
            .count();
        assert_eq!(wrong, 0, "burst {burst}: captures not dropped once");
    }
    assert!(timer.shutdown().is_empty());
    assert!(
        peaks[0] >= before + 1_536 - CACHE_CHUNKS,
        "the burst held its 1,536 chunks: {before} before, peak {peaks:?}"
    );
    for (burst, &left) in after.iter().enumerate() {
        assert!(
            left <= before + CACHE_CHUNKS + 2 * CLASSES,
            "burst {burst}: {left} chunks held after it, {before} before: the cache \
             keeps at most {CACHE_CHUNKS} (peaks {peaks:?}, after {after:?})"
        );
    }
    assert!(
        peaks[2] <= peaks[0] + 2 * CLASSES && after[2] <= after[0] + 2 * CLASSES,
        "chunks grow from burst to burst: peaks {peaks:?}, after {after:?}"
    );
    assert!(
        bytes[2] <= bytes[0] + (1 << 20),
        "live bytes grow from burst to burst: {bytes:?}"
    );
}

/// A first burst of 20 chunks of 48-byte entries, on a manual clock with inline
/// callbacks, from a thread that exits before they fire or are cancelled: every
/// tenth is cancelled here (its capture, dropped in place, records its chunk), the
/// rest fire (the shard thread frees them into the abandoned heap). Then a second
/// burst on a new thread, in 256-byte entries (another class), of 20 chunks' worth,
/// cancelled. The second takes the first's chunks: at most one new chunk from the
/// allocator, and at least 15 of the first's 20 chunks hold its entries.
#[test]
#[cfg_attr(
    chunk_cache_off,
    ignore = "counts on the entry pool's chunk cache, off in this build"
)]
fn a_second_burst_in_another_class_on_a_new_thread_takes_the_first_bursts_chunks() {
    let _serial = serial();
    const FIRST: u32 = 20 * 680;
    const SECOND_BURST: u32 = 20 * 127;
    let clock = ManualClock::new();
    let timer = inline_manual(1, &clock);
    let producer = timer.clone();
    // 8-byte captures: 32 + 8 (options) + 8 = 48 bytes.
    let handles = std::thread::spawn(move || {
        (0..FIRST)
            .map(|id| BY_SIZE[8](&producer, id, SECOND).expect("scheduled"))
            .collect::<Vec<_>>()
    })
    .join()
    .expect("first burst");
    // Only a cancel drops a capture in place (a fired callback is moved out of its
    // entry before it runs): record the chunks of the cancelled ones.
    RECORD.store(true, Ordering::SeqCst);
    for handle in handles.iter().step_by(10) {
        assert!(handle.cancel());
    }
    RECORD.store(false, Ordering::SeqCst);
    drop(handles);
    clock.advance(2 * SECOND);
    wait_cancelled(&timer, FIRST as usize / 10);
    let cancelled = |id: u32| id < FIRST && id.is_multiple_of(10);
    assert_eq!(
        runs_so_far(0..FIRST),
        (0..FIRST).filter(|&id| !cancelled(id)).count(),
        "the first burst fired"
    );
    let first_chunks: HashSet<usize> = RECORDED
        .lock()
        .unwrap()
        .drain(..)
        .map(|(chunk, _)| chunk)
        .collect();
    assert!(
        (20..=24).contains(&first_chunks.len()),
        "the first burst's chunks: {}",
        first_chunks.len()
    );
    let before = chunks_made();
    let producer = timer.clone();
    let base = FIRST;
    RECORD.store(true, Ordering::SeqCst);
    std::thread::spawn(move || {
        let handles: Vec<TimerHandle> = (base..base + SECOND_BURST)
            .map(|id| BY_SIZE[216](&producer, id, HOUR).expect("scheduled"))
            .collect();
        for handle in handles {
            assert!(handle.cancel());
        }
    })
    .join()
    .expect("second burst");
    RECORD.store(false, Ordering::SeqCst);
    let new = chunks_made() - before;
    let second_chunks: HashSet<usize> = RECORDED
        .lock()
        .unwrap()
        .iter()
        .map(|&(chunk, _)| chunk)
        .collect();
    assert!(timer.shutdown().is_empty());
    verify(
        "two bursts",
        0..base + SECOND_BURST,
        |id| if id < FIRST { 8 } else { 216 },
        |id| id < FIRST && !cancelled(id),
    );
    let reused = second_chunks.intersection(&first_chunks).count();
    assert!(
        new <= 1 && reused >= 15,
        "the second burst allocated {new} new chunks for its 20, and used {reused} of \
         the first's {} chunks",
        first_chunks.len()
    );
}

/// A thread that stays alive, scheduling bursts on command: `(first id, count,
/// capture size)`, and sending the handles back.
type Burst = (u32, u32, usize, mpsc::Sender<Vec<TimerHandle>>);

fn live_thread(timer: &ShardedTimer) -> (mpsc::Sender<Burst>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<Burst>();
    let timer = timer.clone();
    let thread = std::thread::spawn(move || {
        for (base, count, size, reply) in rx {
            let handles = (base..base + count)
                .map(|id| schedule_sized(&timer, size, id, HOUR))
                .collect();
            reply.send(handles).expect("main alive");
        }
    });
    (tx, thread)
}

fn burst_on(thread: &mpsc::Sender<Burst>, base: u32, count: u32, size: usize) -> Vec<TimerHandle> {
    let (tx, rx) = mpsc::channel();
    thread.send((base, count, size, tx)).expect("thread alive");
    rx.recv_timeout(WAIT).expect("the burst")
}

/// A known limit, older than the cache, stated in `src/entry/pool/mod.rs` and the README
/// since this audit (whose README claim it showed overstated): a thread that stays
/// alive and idle after its burst does not collect, so the chunks of its burst, every
/// block of which came back, are neither cached nor returned: a burst on another live
/// thread (a server's other worker) takes none of them and allocates its own, and the
/// first burst's memory stays held for as long as that thread schedules nothing more
/// (past the cache's 32 MiB, without bound: N idle threads hold N bursts). Run it with
/// `--ignored` to see the limit; it passes once a free can retire a chunk.
#[test]
#[ignore = "known limit: a live idle thread's freed chunks return only when it next collects or exits (src/entry/pool/mod.rs)"]
fn a_burst_on_one_live_thread_takes_the_chunks_another_live_threads_burst_freed() {
    let _serial = serial();
    const BURST: u32 = 20 * 127; // 20 chunks of 256-byte entries
    let timer = pool_service(1);
    let (first, first_thread) = live_thread(&timer);
    let (second, second_thread) = live_thread(&timer);
    RECORD.store(true, Ordering::SeqCst);
    for handle in burst_on(&first, 0, BURST, 224) {
        assert!(handle.cancel());
    }
    wait_cancelled(&timer, BURST as usize);
    let first_chunks: HashSet<usize> = RECORDED
        .lock()
        .unwrap()
        .drain(..)
        .map(|(chunk, _)| chunk)
        .collect();
    // The first thread stays alive and idle; the second bursts.
    let before = chunks_made();
    for handle in burst_on(&second, BURST, BURST, 224) {
        assert!(handle.cancel());
    }
    wait_cancelled(&timer, 2 * BURST as usize);
    RECORD.store(false, Ordering::SeqCst);
    let new = chunks_made() - before;
    let second_chunks: HashSet<usize> = RECORDED
        .lock()
        .unwrap()
        .iter()
        .map(|&(chunk, _)| chunk)
        .collect();
    drop((first, second));
    first_thread.join().expect("first");
    second_thread.join().expect("second");
    assert!(timer.shutdown().is_empty());
    verify("live threads", 0..2 * BURST, |_| 224, |_| false);
    let reused = second_chunks.intersection(&first_chunks).count();
    assert!(
        reused >= 15,
        "the second burst used {reused} of the {} chunks the first burst's timers \
         left (all gone), and asked the allocator for {new} new chunks",
        first_chunks.len()
    );
}

/// Claim 2, for heaps abandoned together: two threads each schedule 600 chunks' worth
/// of 256-byte entries (76,200 timers), cancel them all and exit together. Before the
/// exit collection (found by this audit, fixed since; `tests/memory.rs` checks it), no
/// timer was alive, yet the pool held both bursts' chunks, 1,200 (37.5 MiB), beyond
/// the cache's 32 MiB: a new thread adopted one abandoned heap, the other kept its 600
/// free chunks until another thread needed a heap. Here, two rounds: the first leaves
/// the cache full (the chunks it gives up exceed 32 MiB), so the bound does not depend
/// on what earlier tests of this binary left; after the second, the pool holds no more
/// than after the first but for spares (what the exited heaps keep must not grow).
#[test]
fn threads_that_exit_together_leave_no_more_than_the_cache_once_their_timers_are_gone() {
    let _serial = serial();
    const EACH: u32 = 600 * 127;
    let timer = pool_service(1);
    collect_abandoned(&timer);
    let mut held = Vec::new();
    for round in 0..2u32 {
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let go_rx = Arc::new(Mutex::new(go_rx));
        let threads: Vec<_> = (0..2u32)
            .map(|t| {
                let (timer, go_rx) = (timer.clone(), go_rx.clone());
                std::thread::spawn(move || {
                    let first = t * EACH;
                    let handles: Vec<TimerHandle> = (first..first + EACH)
                        .map(|id| BY_SIZE[224](&timer, id, HOUR).expect("scheduled"))
                        .collect();
                    for handle in handles {
                        assert!(handle.cancel());
                    }
                    // Both bursts done before either thread exits.
                    let _ = go_rx.lock().unwrap().recv();
                })
            })
            .collect();
        assert!(
            wait_until(WAIT, || timer.stats().cancelled
                > u64::from(round + 1) * 2 * u64::from(EACH)),
            "round {round}: both bursts cancelled within {WAIT:?}"
        );
        drop(go_tx);
        for thread in threads {
            thread.join().expect("burst thread");
        }
        held.push(chunks_live());
        verify("threads exiting together", 0..2 * EACH, |_| 224, |_| false);
        reset_tracker();
    }
    assert!(timer.shutdown().is_empty());
    let (first, second) = (held[0], held[1]);
    assert!(
        second <= first + 4 * CLASSES,
        "no timer alive, and after a second pair of bursts the pool holds {second} chunks \
         ({} MiB), {first} after the first: the exited heaps kept what the full cache \
         refused",
        (second * CHUNK) >> 20
    );
}

// ---------------------------------------------------------------------------------
// Claim 4: hostile captures.
// ---------------------------------------------------------------------------------

/// The panic message of `Boom`'s destructor, silenced in the panic hook.
const BOOM: &str = "audit-boom: a capture's destructor panics";

/// A capture whose destructor panics (its canary field is dropped all the same).
struct Boom(Bytes<24>);

impl Drop for Boom {
    fn drop(&mut self) {
        panic!("{BOOM}");
    }
}

/// Runs `f` with the panic hook silent for `BOOM`.
fn quiet_booms<T>(f: impl FnOnce() -> T) -> T {
    let previous: Arc<dyn Fn(&std::panic::PanicHookInfo<'_>) + Send + Sync> =
        Arc::from(std::panic::take_hook());
    let chained = previous.clone();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied());
        if message != Some(BOOM) {
            chained(info);
        }
    }));
    let result = catch_unwind(AssertUnwindSafe(f));
    let _ = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| previous(info)));
    match result {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Four rounds on a manual clock with inline callbacks, each from a new producer
/// thread: 400 timers whose capture's destructor panics and 400 plain canaries of the
/// same entry size. A third of the panicking ones is cancelled (the panic comes out
/// of `cancel`, after the cancel took effect), a third fires (the panic is caught and
/// counted), a third is handed back by `shutdown` at the end and dropped (the panic
/// comes out of the drop). Every canary is dropped exactly once, no capture is
/// overwritten, and the pool's chunks do not grow from round to round (an entry
/// leaked by an unwinding path would pin its chunk; one freed twice would be handed
/// out twice and overwrite a capture).
#[test]
fn captures_whose_destructor_panics_are_dropped_once_and_their_blocks_reused() {
    let _serial = serial();
    const ROUNDS: u32 = 4;
    const EACH: u32 = 800;
    let clock = ManualClock::new();
    let timer = inline_manual(1, &clock);
    // Even ids: Boom; odd: a plain 24-byte canary (the same 64-byte entries).
    // id / 2 % 3: 0 cancel, 1 fire, 2 pending until shutdown.
    let fate = |id: u32| (id / 2) % 3;
    let mut after_round = Vec::new();
    let mut cancels = 0;
    let unfired = quiet_booms(|| {
        let mut kept = Vec::new();
        for round in 0..ROUNDS {
            pump(&timer, 5 + round as usize * 7);
            cancels = timer.stats().cancelled as usize;
            let producer = timer.clone();
            let handles = std::thread::spawn(move || {
                (round * EACH..(round + 1) * EACH)
                    .map(|id| {
                        let delay = if fate(id) == 1 { SECOND } else { HOUR };
                        let handle = if id % 2 == 0 {
                            let boom = Boom(Bytes::new(id));
                            producer.schedule(delay, move || {
                                let boom = boom;
                                boom.0.ran();
                            })
                        } else {
                            BY_SIZE[24](&producer, id, delay)
                        };
                        (id, handle.expect("scheduled"))
                    })
                    .collect::<Vec<_>>()
            })
            .join()
            .expect("producer");
            for (id, handle) in handles {
                match fate(id) {
                    0 => {
                        let cancelled = catch_unwind(AssertUnwindSafe(|| handle.cancel()));
                        if id % 2 == 0 {
                            assert!(cancelled.is_err(), "id {id}: the destructor's panic");
                        } else {
                            assert_eq!(cancelled.ok(), Some(true), "id {id}");
                        }
                        assert_eq!(handle.state(), TimerState::Cancelled, "id {id}");
                        cancels += 1;
                    }
                    _ => kept.push(handle),
                }
            }
            clock.advance(2 * SECOND);
            wait_cancelled(&timer, cancels);
            after_round.push(chunks_live());
        }
        drop(kept);
        let unfired = timer.shutdown();
        let mut panicked = 0;
        let count = unfired.len();
        for unfired in unfired {
            if catch_unwind(AssertUnwindSafe(|| drop(unfired))).is_err() {
                panicked += 1;
            }
        }
        (count, panicked)
    });
    let total = ROUNDS * EACH;
    let pending = (0..total).filter(|&id| fate(id) == 2).count();
    let pending_booms = (0..total)
        .filter(|&id| fate(id) == 2 && id % 2 == 0)
        .count();
    assert_eq!(
        unfired,
        (pending, pending_booms),
        "handed back, and panicked on drop"
    );
    let fired_booms = (0..total)
        .filter(|&id| fate(id) == 1 && id % 2 == 0)
        .count();
    assert_eq!(
        timer.stats().panicked,
        fired_booms as u64,
        "fired panics counted"
    );
    drop(timer);
    verify(
        "panicking destructors",
        0..total,
        |_| 24,
        |id| fate(id) == 1,
    );
    assert!(
        after_round[1..].iter().all(|&c| c <= after_round[0] + 4),
        "pool chunks after each round: {after_round:?}"
    );
}

/// A capture whose destructor calls `shutdown` on the service that holds it, and
/// drops what comes back; next to it, 300 pending canaries. The destructor runs on
/// each path: a cancel (on this thread), the fire (on the shard thread inline, on a
/// pool worker), and the drop of its own `Unfired` (whose `shutdown` then returns
/// nothing). Six services in a row; every canary is dropped exactly once.
#[test]
fn a_capture_whose_destructor_shuts_the_service_down_leaves_every_capture_dropped_once() {
    let _serial = serial();
    struct ShutOnDrop(Option<ShardedTimer>, Bytes<32>);
    impl Drop for ShutOnDrop {
        fn drop(&mut self) {
            if let Some(timer) = self.0.take() {
                drop(timer.shutdown());
            }
        }
    }
    const CANARIES: u32 = 300;
    let mut base = 0;
    let mut ran = HashSet::new();
    for service in 0..6u32 {
        let clock = ManualClock::new();
        let timer = if service % 2 == 0 {
            inline_manual(1, &clock)
        } else {
            pool_service(1)
        };
        let path = service / 2; // 0 cancel, 1 fire, 2 unfired
        pump(&timer, 3 + service as usize * 4);
        for id in base..base + CANARIES {
            drop(schedule_sized(&timer, (id as usize * 13) % 304, id, HOUR));
        }
        let hostile_id = base + CANARIES;
        let hostile = ShutOnDrop(Some(timer.clone()), Bytes::new(hostile_id));
        let delay = if path == 1 { Duration::ZERO } else { HOUR };
        let handle = timer
            .schedule(delay, move || {
                let hostile = hostile;
                hostile.1.ran();
            })
            .expect("scheduled");
        match path {
            0 => assert!(handle.cancel(), "service {service}"),
            1 => {
                ran.insert(hostile_id);
                if service % 2 == 0 {
                    let clock = clock.clone();
                    assert!(
                        support::within(WAIT, move || clock.advance(Duration::ZERO)).is_some(),
                        "service {service}: advance returned within {WAIT:?}"
                    );
                }
            }
            _ => {
                let unfired = timer.shutdown();
                assert_eq!(unfired.len(), CANARIES as usize + 1, "service {service}");
                drop_elsewhere(unfired);
            }
        }
        let done = || {
            (base..=hostile_id).all(|id| {
                !tracked(size_of_in(id, hostile_id))
                    || DROPS[id as usize].load(Ordering::SeqCst) == 1
            })
        };
        assert!(
            wait_until(WAIT, done),
            "service {service}: every capture dropped within {WAIT:?}"
        );
        assert_eq!(
            timer.schedule(Duration::ZERO, || {}).err(),
            Some(ScheduleError::Shutdown),
            "service {service}: shut down by the destructor"
        );
        drop(timer);
        base = hostile_id + 1;
    }
    verify(
        "shutdown in a destructor",
        0..base,
        |id| {
            if (id + 1) % (CANARIES + 1) == 0 {
                32
            } else {
                (id as usize * 13) % 304
            }
        },
        |id| ran.contains(&id),
    );
}

/// The capture size `a_capture_whose_destructor_shuts_the_service_down_...` and
/// `a_capture_holding_the_last_clone_...` give id `id`, whose hostile capture is
/// `hostile` (32 bytes of canary).
fn size_of_in(id: u32, hostile: u32) -> usize {
    if id == hostile {
        32
    } else {
        (id as usize * 13) % 304
    }
}

/// A capture that holds the service's last clone (the test drops its own), next to
/// 300 pending canaries: dropping the capture drops the service, whose pending
/// callbacks are dropped unrun. On each path: a cancel (this thread), the fire (the
/// shard thread inline, a pool worker: the service ends on its own thread), and the
/// drop of its `Unfired` after a `shutdown`. Six services in a row; every canary is
/// dropped exactly once.
#[test]
fn a_capture_holding_the_last_clone_of_the_service_leaves_every_capture_dropped_once() {
    let _serial = serial();
    const CANARIES: u32 = 300;
    let mut base = 0;
    let mut ran = HashSet::new();
    for service in 0..6u32 {
        let clock = ManualClock::new();
        let timer = if service % 2 == 0 {
            inline_manual(1, &clock)
        } else {
            pool_service(1)
        };
        let path = service / 2; // 0 cancel, 1 fire, 2 unfired
        pump(&timer, 3 + service as usize * 4);
        for id in base..base + CANARIES {
            drop(schedule_sized(&timer, (id as usize * 13) % 304, id, HOUR));
        }
        let hostile_id = base + CANARIES;
        let capture = (timer.clone(), Bytes::<32>::new(hostile_id));
        let delay = if path == 1 { Duration::ZERO } else { HOUR };
        let handle = timer
            .schedule(delay, move || {
                let (service, bytes) = capture;
                bytes.ran();
                drop(service);
            })
            .expect("scheduled");
        match path {
            0 => {
                drop(timer);
                assert!(handle.cancel(), "service {service}");
            }
            1 => {
                ran.insert(hostile_id);
                drop(timer);
                if service % 2 == 0 {
                    let clock = clock.clone();
                    assert!(
                        support::within(WAIT, move || clock.advance(Duration::ZERO)).is_some(),
                        "service {service}: advance returned within {WAIT:?}"
                    );
                }
            }
            _ => {
                let unfired = timer.shutdown();
                assert_eq!(unfired.len(), CANARIES as usize + 1, "service {service}");
                drop(timer);
                drop_elsewhere(unfired);
            }
        }
        drop(handle);
        let done = || {
            (base..=hostile_id).all(|id| {
                !tracked(size_of_in(id, hostile_id))
                    || DROPS[id as usize].load(Ordering::SeqCst) == 1
            })
        };
        assert!(
            wait_until(WAIT, done),
            "service {service}: every capture dropped within {WAIT:?}"
        );
        base = hostile_id + 1;
    }
    verify(
        "the last clone in a capture",
        0..base,
        |id| {
            if (id + 1) % (CANARIES + 1) == 0 {
                32
            } else {
                (id as usize * 13) % 304
            }
        },
        |id| ran.contains(&id),
    );
}

// ---------------------------------------------------------------------------------
// Threads exiting: scheduling from a thread-local destructor.
// ---------------------------------------------------------------------------------

/// Handles scheduled from thread-local destructors, by id.
static LATE_HANDLES: Mutex<Vec<(u32, TimerHandle)>> = Mutex::new(Vec::new());

/// A thread-local whose destructor schedules `count` timers from `base` on `timer`.
struct Late(RefCell<Option<(ShardedTimer, u32, u32)>>);

impl Drop for Late {
    fn drop(&mut self) {
        if let Some((timer, base, count)) = self.0.get_mut().take() {
            let handles: Vec<(u32, TimerHandle)> = (base..base + count)
                .map(|id| (id, schedule_sized(&timer, late_size(id), id, HOUR)))
                .collect();
            LATE_HANDLES
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(handles);
        }
    }
}

std::thread_local! {
    static LATE: Late = const { Late(RefCell::new(None)) };
}

fn late_size(id: u32) -> usize {
    (id as usize * 29 + 3) % 303
}

/// Threads that schedule timers as they exit, from a thread-local destructor: one
/// registered before the thread's first timer (so it runs after the pool's own
/// thread-local heap was abandoned: the pool's shared fallback heap serves it), one
/// after. Six such threads in a row, each also scheduling timers normally; half of
/// all timers cancelled here, the rest handed back by `shutdown` and dropped on
/// another thread. Every capture is dropped exactly once.
#[test]
fn timers_scheduled_from_thread_local_destructors_are_dropped_once() {
    let _serial = serial();
    const EACH: u32 = 600;
    let timer = pool_service(2);
    for thread in 0..6u32 {
        pump(&timer, 4 + thread as usize * 5);
        let service = timer.clone();
        let base = thread * 2 * EACH;
        std::thread::spawn(move || {
            let arm = || {
                LATE.with(|late| *late.0.borrow_mut() = Some((service.clone(), base + EACH, EACH)))
            };
            if thread % 2 == 0 {
                arm();
            }
            let handles: Vec<(u32, TimerHandle)> = (base..base + EACH)
                .map(|id| (id, schedule_sized(&service, late_size(id), id, HOUR)))
                .collect();
            LATE_HANDLES.lock().unwrap().extend(handles);
            if thread % 2 == 1 {
                arm();
            }
        })
        .join()
        .expect("thread");
    }
    let handles = std::mem::take(&mut *LATE_HANDLES.lock().unwrap());
    let total = 6 * 2 * EACH;
    assert_eq!(handles.len(), total as usize, "every timer scheduled");
    let mut cancels = 0;
    for (id, handle) in handles {
        if id % 2 == 0 {
            assert!(handle.cancel(), "id {id}");
            cancels += 1;
        }
    }
    wait_cancelled(&timer, cancels);
    let unfired = timer.shutdown();
    assert_eq!(unfired.len(), total as usize / 2);
    drop_elsewhere(unfired);
    drop(timer);
    verify("thread-local destructors", 0..total, late_size, |_| false);
}

// ---------------------------------------------------------------------------------
// Everything at once.
// ---------------------------------------------------------------------------------

/// Three driver threads at once, for up to a second and a half, each in a loop: a short-lived
/// child thread bursts 100 to 1,500 timers in one capture size (any of 0..=302),
/// some due within 2 ms (freed by a pool worker or shard after their run), some an
/// hour away; it cancels some at once, some as they may be firing, leaves others
/// pending, drops the rest's handles, and exits (its heap abandoned, adopted by the
/// next child: chunks retire into the cache and come out in another heap and class,
/// concurrently); one driver also pumps 4 to 12 chunks through the cache every
/// fourth turn. At the end, `shutdown`: every capture runs or drops exactly as
/// its fate says.
#[test]
fn concurrent_bursts_on_short_lived_threads_run_or_drop_every_capture_exactly_once() {
    let _serial = serial();
    const PER_DRIVER: u32 = 80_000;
    let timer = pool_service(2);
    let started = std::time::Instant::now();
    let used: Vec<(u32, usize)> = std::thread::scope(|scope| {
        let drivers: Vec<_> = (0..3u32)
            .map(|driver| {
                let timer = &timer;
                scope.spawn(move || {
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ u64::from(driver + 1));
                    let mut next = driver * PER_DRIVER;
                    let end = next + PER_DRIVER - 1_500;
                    let mut ends = Vec::new();
                    let mut iteration = 0;
                    while started.elapsed() < Duration::from_millis(1_500) && next < end {
                        iteration += 1;
                        if driver == 0 && iteration % 4 == 0 {
                            pump(timer, 4 + iteration % 9);
                        }
                        let count = 100 + rng.below(1_400) as u32;
                        let size = rng.below(303) as usize;
                        let seed = rng.next();
                        let base = next;
                        next += count;
                        let service = timer.clone();
                        std::thread::spawn(move || {
                            let mut rng = Rng(seed | 1);
                            let mut racing = Vec::new();
                            for id in base..base + count {
                                // 0: short; 1: short, cancel racing; 2: long, cancelled;
                                // 3: long, pending.
                                let fate = rng.below(4);
                                let delay = match fate {
                                    0 | 1 => MS * rng.below(3) as u32,
                                    _ => HOUR,
                                };
                                let handle = schedule_sized(&service, size, id, delay);
                                match fate {
                                    1 => racing.push((id, handle)),
                                    2 => {
                                        assert!(handle.cancel(), "id {id}");
                                        WON[id as usize].store(true, Ordering::SeqCst);
                                    }
                                    3 => LONG.lock().unwrap().push(id),
                                    _ => {}
                                }
                            }
                            for (id, handle) in racing {
                                if handle.cancel() {
                                    WON[id as usize].store(true, Ordering::SeqCst);
                                }
                            }
                        })
                        .join()
                        .expect("child");
                        ends.push((base, count, size));
                    }
                    ends
                })
            })
            .collect();
        drivers
            .into_iter()
            .flat_map(|d| d.join().expect("driver"))
            .flat_map(|(base, count, size)| (base..base + count).map(move |id| (id, size)))
            .collect()
    });
    let long: HashSet<u32> = LONG.lock().unwrap().drain(..).collect();
    let sizes: HashMap<u32, usize> = used.iter().copied().collect();
    let won = |id: u32| WON[id as usize].load(Ordering::SeqCst);
    // Short timers whose cancel (if any) lost; long ones never run.
    let should_run = |id: u32| !long.contains(&id) && !won(id);
    // Short timers not cancelled must all run before the shutdown.
    let expected = used.iter().filter(|&&(id, _)| should_run(id)).count();
    let ids: Vec<u32> = used.iter().map(|&(id, _)| id).collect();
    let ran = || {
        ids.iter()
            .map(|&id| usize::from(RUNS[id as usize].load(Ordering::SeqCst)))
            .sum::<usize>()
            + SMALL_RUNS.load(Ordering::SeqCst)
            + PLAIN_RUNS.load(Ordering::SeqCst)
    };
    assert!(
        wait_until(WAIT, || ran() >= expected),
        "short timers ran within {WAIT:?}: {} of {expected}",
        ran()
    );
    let unfired = timer.shutdown();
    assert_eq!(
        unfired.len(),
        long.len(),
        "the pending long timers come back"
    );
    drop_elsewhere(unfired);
    drop(timer);
    assert!(used.len() > 2_000, "timers made: {}", used.len());
    // Ids not used (the gaps at each driver's end) have no capture: check the used.
    assert_eq!(CORRUPT.load(Ordering::SeqCst), 0, "captures read wrong");
    let mut wrong = Vec::new();
    let (mut small, mut small_runs, mut plain_runs) = (0, 0, 0);
    for &(id, size) in &used {
        let should = should_run(id);
        if !tracked(size) {
            if size == 303 {
                plain_runs += usize::from(should);
            } else {
                small += 1;
                small_runs += usize::from(should);
            }
            continue;
        }
        let (runs, drops) = (
            RUNS[id as usize].load(Ordering::SeqCst),
            DROPS[id as usize].load(Ordering::SeqCst),
        );
        if runs != u8::from(should) || drops != 1 {
            wrong.push((id, sizes[&id], runs, drops));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong (id, size, runs, drops): {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(8)]
    );
    assert_eq!(SMALL_DROPS.load(Ordering::SeqCst), small);
    assert_eq!(SMALL_RUNS.load(Ordering::SeqCst), small_runs);
    assert_eq!(PLAIN_RUNS.load(Ordering::SeqCst), plain_runs);
}

/// Ids of long timers left pending, from the children of the concurrent test.
static LONG: Mutex<Vec<u32>> = Mutex::new(Vec::new());

// ---------------------------------------------------------------------------------
// Other entries in the same chunks: sleeps, repeating timers, resets.
// ---------------------------------------------------------------------------------

/// Counts its wake-ups.
struct CountingWaker(AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Four rounds, each from a new producer thread (heaps adopted, chunks retired and
/// reused), of other kinds of entries in the same pool next to canaries: 200 `Sleep`
/// futures polled once (half due in a millisecond, completed and woken; half an hour
/// away, dropped on another thread: a cancel), 40 repeating timers with a 40-byte
/// canary capture (cancelled after they ran twice: their capture is dropped once, by
/// the canceller or by the run under way), 200 one-shot canaries reset from an hour
/// to a millisecond (run once), and 200 canaries cancelled. Every canary runs and
/// drops exactly as its fate says, and every short sleep wakes its task.
#[test]
fn sleeps_repeating_timers_and_resets_share_the_chunks_without_harm() {
    let _serial = serial();
    const ROUNDS: u32 = 4;
    const SLEEPS: usize = 200;
    const REPEATING: u32 = 40;
    const ONE_SHOT: u32 = 400;
    const PER: u32 = REPEATING + ONE_SHOT;
    let timer = pool_service(1);
    let waker = Arc::new(CountingWaker(AtomicUsize::new(0)));
    let mut woken_expected = 0;
    for round in 0..ROUNDS {
        pump(&timer, 6 + round as usize * 5);
        let base = round * PER;
        let (producer, waker_for) = (timer.clone(), waker.clone());
        let counts: Arc<Vec<AtomicUsize>> =
            Arc::new((0..REPEATING).map(|_| AtomicUsize::new(0)).collect());
        let counts_for = counts.clone();
        let (sleeps, repeating, one_shot) = std::thread::spawn(move || {
            let waker = std::task::Waker::from(waker_for);
            let mut cx = std::task::Context::from_waker(&waker);
            let mut sleeps = Vec::new();
            let mut repeating = Vec::new();
            let mut one_shot = Vec::new();
            for i in 0..SLEEPS {
                let d = if i % 2 == 0 { MS } else { HOUR };
                let mut sleep = Box::pin(producer.sleep(d));
                assert!(sleep.as_mut().poll(&mut cx).is_pending(), "sleep {i}");
                sleeps.push(sleep);
                if i % (SLEEPS / REPEATING as usize) == 0 {
                    let k = i / (SLEEPS / REPEATING as usize);
                    let id = base + k as u32;
                    let (bytes, counts) = (Bytes::<40>::new(id), counts_for.clone());
                    let handle = producer
                        .schedule_repeating(MS, move || {
                            if bytes.intact() {
                                counts[k].fetch_add(1, Ordering::SeqCst);
                            } else {
                                CORRUPT.fetch_add(1, Ordering::SeqCst);
                            }
                        })
                        .expect("scheduled");
                    repeating.push(handle);
                }
            }
            for id in base + REPEATING..base + PER {
                one_shot.push((id, BY_SIZE[40](&producer, id, HOUR)));
            }
            (sleeps, repeating, one_shot)
        })
        .join()
        .expect("producer");
        woken_expected += SLEEPS / 2;
        for (id, handle) in one_shot {
            let handle = handle.expect("scheduled");
            if id % 2 == 0 {
                assert!(handle.reset(MS), "id {id}: reset while pending");
            } else {
                assert!(handle.cancel(), "id {id}");
            }
        }
        assert!(
            wait_until(WAIT, || counts
                .iter()
                .all(|c| c.load(Ordering::SeqCst) >= 2)),
            "round {round}: each repeating timer ran twice within {WAIT:?}"
        );
        for handle in repeating {
            assert!(handle.cancel(), "a repeating timer is cancelled");
        }
        assert!(
            wait_until(WAIT, || waker.0.load(Ordering::SeqCst) >= woken_expected),
            "round {round}: short sleeps woke within {WAIT:?}"
        );
        // The hour-long sleeps (and the completed ones) dropped on another thread.
        drop_elsewhere(sleeps);
        assert!(
            wait_until(WAIT, || (base..base + PER)
                .all(|id| { DROPS[id as usize].load(Ordering::SeqCst) == 1 })),
            "round {round}: every capture dropped within {WAIT:?}"
        );
    }
    assert!(timer.shutdown().is_empty(), "nothing left pending");
    drop(timer);
    assert_eq!(
        waker.0.load(Ordering::SeqCst),
        woken_expected,
        "short sleeps woke once"
    );
    verify(
        "sleeps, repeating, resets",
        0..ROUNDS * PER,
        |_| 40,
        |id| id % PER >= REPEATING && id % 2 == 0,
    );
}
