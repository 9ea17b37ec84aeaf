//! Audit round 4: attacks on the public API by an outside auditor, on real threads.
//!
//! Each test states the public promise it attacks. The tests run one at a time (a
//! binary-wide lock): they measure lateness and live heap bytes, which neighbours
//! would disturb on a 2-core machine. Every wait is bounded; a service left wedged by
//! a defect is leaked (not joined) so that the test fails instead of hanging.

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use sharded_timer::{
    Callback, Callbacks, ManualClock, ScheduleError, ShardedTimer, TimerHandle, TimerState,
};

// ---------------------------------------------------------------------------------
// Infrastructure
// ---------------------------------------------------------------------------------

/// Live heap bytes of the whole process (a counting allocator over `System`).
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

/// Of `LIVE_BYTES`, those in allocations of the entry pool's chunk layout (32 KiB,
/// aligned to 32 KiB): chunks in use, spare, or kept in the pool's process-wide cache.
static CHUNK_BYTES: AtomicIsize = AtomicIsize::new(0);

/// The entry pool's chunks: 32 KiB, aligned to 32 KiB.
const CHUNK: usize = 32 * 1024;

/// Counts `size` bytes in (positive) or out (negative) of the live totals.
fn count(layout: Layout, size: isize) {
    // ORDERING: a statistic; Relaxed suffices.
    LIVE_BYTES.fetch_add(size, Ordering::Relaxed);
    if layout.size() == CHUNK && layout.align() == CHUNK {
        // ORDERING: as above.
        CHUNK_BYTES.fetch_add(size, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to `System` unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            count(layout, layout.size() as isize);
        }
        ptr
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(layout, -(layout.size() as isize));
        // SAFETY: the caller's contract is System's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            count(layout, layout.size() as isize);
        }
        ptr
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // ORDERING: a statistic; Relaxed suffices.
            LIVE_BYTES.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::SeqCst)
}

/// Live bytes in the entry pool's chunks (see `CHUNK_BYTES`).
fn chunk_bytes() -> isize {
    CHUNK_BYTES.load(Ordering::SeqCst)
}

/// One test at a time in this binary.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

const WAIT: Duration = Duration::from_secs(20);

/// Polls `condition` every half millisecond until it holds or `limit` passes.
fn wait_until(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        thread::sleep(Duration::from_micros(500));
    }
}

/// Fails the test without joining a service that may be wedged.
fn leak_and_fail(timer: ShardedTimer, why: &str) -> ! {
    std::mem::forget(timer);
    panic!("{why}");
}

/// Runs `f` on a thread and waits at most `limit` for it; `None` if it did not finish
/// (the thread is left behind).
fn bounded<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    let join = thread::spawn(move || {
        let out = f();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(limit) {
        Ok(()) => Some(join.join().expect("bounded thread panicked")),
        Err(_) => {
            if join.is_finished() {
                // It panicked (the sender was dropped): propagate.
                match join.join() {
                    Ok(out) => Some(out),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            } else {
                None
            }
        }
    }
}

fn builder(shards: usize) -> sharded_timer::Builder {
    ShardedTimer::builder()
        .shards(shards)
        .pin_cores(false)
        .thread_name("aud")
}

fn pool_timer(shards: usize) -> ShardedTimer {
    builder(shards).executor_threads(2).build().unwrap()
}

fn inline_timer(shards: usize) -> ShardedTimer {
    builder(shards)
        .callbacks(Callbacks::inline())
        .build()
        .unwrap()
}

/// The shard `timer` files a pending far-future timer on: schedules a placeholder for
/// each try with `make()`, watches which shard's `pending` grows, keeps it if it is
/// `shard` (returns its handle, still an hour away), otherwise cancels it.
fn place<F: FnOnce() + Send + 'static>(
    timer: &ShardedTimer,
    shard: usize,
    mut make: impl FnMut() -> F,
) -> TimerHandle {
    for attempt in 0..200 {
        let mut before = Vec::new();
        assert!(wait_until(WAIT, || {
            let s = timer.stats();
            before = s.shards.iter().map(|l| l.pending).collect();
            s.in_rings == 0
        }));
        let total: u64 = before.iter().sum();
        // New timers go to the shard of the caller's core: schedule each try from a
        // thread pinned to the next core in turn (the hash of the id where the core
        // is unknown, which the retries cover as well).
        let cores = core_affinity::get_core_ids().unwrap_or_default();
        let callback = make();
        let handle = thread::scope(|scope| {
            scope
                .spawn(|| {
                    if !cores.is_empty() {
                        core_affinity::set_for_current(cores[attempt % cores.len()]);
                    }
                    timer.schedule(Duration::from_secs(3600), callback).unwrap()
                })
                .join()
                .unwrap()
        });
        let mut after = Vec::new();
        assert!(
            wait_until(WAIT, || {
                let s = timer.stats();
                after = s.shards.iter().map(|l| l.pending).collect();
                s.in_rings == 0 && after.iter().sum::<u64>() == total + 1
            }),
            "the placeholder was never taken in"
        );
        let on = (0..after.len())
            .find(|&k| after[k] == before[k] + 1)
            .expect("one shard grew");
        if on == shard {
            return handle;
        }
        assert!(handle.cancel());
        assert!(wait_until(WAIT, || timer.stats().pending == total));
    }
    panic!("no timer landed on shard {shard} in 200 tries");
}

/// A waker that unparks a thread and records the wake.
struct ThreadWake {
    woken: AtomicBool,
    thread: thread::Thread,
}

impl Wake for ThreadWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// Polls `fut` on this thread until it completes or `limit` passes.
fn block_on_for<F: Future>(fut: F, limit: Duration) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let wake = Arc::new(ThreadWake {
        woken: AtomicBool::new(false),
        thread: thread::current(),
    });
    let waker = Waker::from(wake.clone());
    let mut cx = Context::from_waker(&waker);
    let start = Instant::now();
    loop {
        wake.woken.store(false, Ordering::SeqCst);
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return Some(out);
        }
        while !wake.woken.load(Ordering::SeqCst) {
            let left = limit.checked_sub(start.elapsed())?;
            thread::park_timeout(left.min(Duration::from_millis(5)));
        }
    }
}

/// A waker that does nothing.
struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}
fn noop_waker() -> Waker {
    Waker::from(Arc::new(Noop))
}

// ---------------------------------------------------------------------------------
// Rescue of a stuck shard (inline callbacks, 2 shards, tiny rings)
// ---------------------------------------------------------------------------------

fn rescue_timer() -> ShardedTimer {
    builder(2)
        .callbacks(Callbacks::inline())
        .ring_capacity(2)
        .tick(Duration::from_millis(1))
        .rescue_after(Some(Duration::from_millis(2)))
        .build()
        .unwrap()
}

/// What the followers of a blocked callback record.
#[derive(Default)]
struct Followers {
    running: AtomicUsize,
    overlaps: AtomicUsize,
    done: AtomicUsize,
    order: Mutex<Vec<usize>>,
    /// (follower, thread name, start, end) of each run.
    runs: Mutex<Vec<(usize, String, Instant, Instant)>>,
    early: AtomicUsize,
    /// Largest start-after-deadline, ns.
    worst_late_ns: AtomicU64,
}

/// Blocker B on shard 0 at base+30 ms, followers 0..n on shard 0 at base+40 ms + 2i ms,
/// each 1 ms long. B returns when `release(followers)` holds (bounded by 5 s) and says
/// whether it had to time out.
fn blocked_shard_scenario(
    n: usize,
    release: impl Fn(&Followers) -> bool + Send + Sync + 'static,
) -> (Arc<Followers>, bool) {
    blocked_shard_scenario_with(
        n,
        Duration::from_millis(2),
        Duration::from_millis(1),
        release,
    )
}

fn blocked_shard_scenario_with(
    n: usize,
    rescue_after: Duration,
    follower_run: Duration,
    release: impl Fn(&Followers) -> bool + Send + Sync + 'static,
) -> (Arc<Followers>, bool) {
    let timer = builder(2)
        .callbacks(Callbacks::inline())
        .ring_capacity(2)
        .tick(Duration::from_millis(1))
        .rescue_after(Some(rescue_after))
        .build()
        .unwrap();
    let followers = Arc::new(Followers::default());
    let deadlines: Arc<Mutex<Vec<Instant>>> = Arc::new(Mutex::new(vec![Instant::now(); n]));
    let b_timed_out = Arc::new(AtomicBool::new(false));
    let b_done = Arc::new(AtomicBool::new(false));
    let release = Arc::new(release);
    let blocker = {
        let followers = followers.clone();
        let b_timed_out = b_timed_out.clone();
        let b_done = b_done.clone();
        let release = release.clone();
        place(&timer, 0, move || {
            let followers = followers.clone();
            let b_timed_out = b_timed_out.clone();
            let b_done = b_done.clone();
            let release = release.clone();
            move || {
                let start = Instant::now();
                while !release(&followers) {
                    if start.elapsed() > Duration::from_secs(5) {
                        b_timed_out.store(true, Ordering::SeqCst);
                        break;
                    }
                    thread::sleep(Duration::from_micros(200));
                }
                b_done.store(true, Ordering::SeqCst);
            }
        })
    };
    let mut handles = Vec::new();
    for i in 0..n {
        let followers = followers.clone();
        let deadlines = deadlines.clone();
        handles.push(place(&timer, 0, move || {
            let followers = followers.clone();
            let deadlines = deadlines.clone();
            move || {
                let start = Instant::now();
                let deadline = deadlines.lock().unwrap()[i];
                if start < deadline {
                    followers.early.fetch_add(1, Ordering::SeqCst);
                }
                let late = start.saturating_duration_since(deadline).as_nanos() as u64;
                followers.worst_late_ns.fetch_max(late, Ordering::SeqCst);
                if followers.running.fetch_add(1, Ordering::SeqCst) != 0 {
                    followers.overlaps.fetch_add(1, Ordering::SeqCst);
                }
                followers.order.lock().unwrap().push(i);
                thread::sleep(follower_run);
                followers.running.fetch_sub(1, Ordering::SeqCst);
                let name = thread::current().name().unwrap_or("?").to_owned();
                followers
                    .runs
                    .lock()
                    .unwrap()
                    .push((i, name, start, Instant::now()));
                followers.done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let base = Instant::now();
    {
        let mut d = deadlines.lock().unwrap();
        for (i, slot) in d.iter_mut().enumerate() {
            *slot = base + Duration::from_millis(40 + 2 * i as u64);
        }
    }
    for (i, h) in handles.iter().enumerate() {
        assert!(h.reset_at(base + Duration::from_millis(40 + 2 * i as u64)));
    }
    assert!(blocker.reset_at(base + Duration::from_millis(30)));
    if !wait_until(WAIT, || {
        followers.done.load(Ordering::SeqCst) == n && b_done.load(Ordering::SeqCst)
    }) {
        leak_and_fail(timer, "followers or blocker never finished");
    }
    assert!(timer.shutdown().is_empty());
    (followers, b_timed_out.load(Ordering::SeqCst))
}

/// Builder::rescue_after: "the watcher takes the shard's wheel for a turn ... and fires
/// what is due: inline callbacks then run on the watcher's thread, still one at a
/// time in deadline order per shard"; "one callback that blocks for 200 ms makes its
/// shard's other timers late by about rescue_after, not 200 ms".
#[test]
fn rescue_runs_a_stuck_shards_followers_in_order_one_at_a_time_while_it_blocks() {
    let _serial = serial();
    let n = 12;
    let (followers, b_timed_out) =
        blocked_shard_scenario(n, move |f| f.done.load(Ordering::SeqCst) == n);
    assert!(
        !b_timed_out,
        "the followers of a blocked inline callback were never rescued"
    );
    assert_eq!(
        followers.overlaps.load(Ordering::SeqCst),
        0,
        "overlapping runs"
    );
    assert_eq!(*followers.order.lock().unwrap(), (0..n).collect::<Vec<_>>());
    assert_eq!(
        followers.early.load(Ordering::SeqCst),
        0,
        "a follower ran early"
    );
    let worst = Duration::from_nanos(followers.worst_late_ns.load(Ordering::SeqCst));
    assert!(
        worst < Duration::from_millis(500),
        "a follower was {worst:?} late"
    );
}

/// The owner returns mid-rescue; followers are short (200 us) against rescue_after
/// (10 ms): two followers of one shard may overlap only where one of them outlasted
/// rescue_after (then it is itself a stuck callback, and running its successor beside it
/// is the rescue).
#[test]
fn owner_returning_mid_rescue_overlaps_only_past_rescue_after() {
    let _serial = serial();
    let rescue_after = Duration::from_millis(10);
    for attempt in 0..6 {
        let n = 8;
        let (followers, b_timed_out) =
            blocked_shard_scenario_with(n, rescue_after, Duration::from_micros(200), |f| {
                f.order.lock().unwrap().len() >= 3
            });
        assert!(!b_timed_out, "never rescued");
        let runs = followers.runs.lock().unwrap().clone();
        for a in &runs {
            for b in &runs {
                let overlap = a.0 < b.0 && b.2 < a.3 && a.2 < b.3;
                let both_short = a.3 - a.2 < rescue_after && b.3 - b.2 < rescue_after;
                assert!(
                    !(overlap && both_short),
                    "attempt {attempt}: #{} and #{} overlap: {runs:?}",
                    a.0,
                    b.0
                );
            }
        }
        assert_eq!(
            followers.early.load(Ordering::SeqCst),
            0,
            "a follower ran early"
        );
        let mut order = followers.order.lock().unwrap().clone();
        let unsorted = order.clone();
        order.sort();
        assert_eq!(order, (0..n).collect::<Vec<_>>());
        if runs.iter().all(|r| r.3 - r.2 < rescue_after) {
            assert_eq!(
                unsorted,
                (0..n).collect::<Vec<_>>(),
                "attempt {attempt}: deadline order: {runs:?}"
            );
        }
    }
}

/// As above, but the blocked callback returns in the middle of the rescue (after the
/// third follower started): the owner carries on while the rescuer is inside a run.
/// `Callbacks::inline`: "still one at a time in deadline order" (also
/// `Builder::rescue_after`: "inline callbacks then run on the watcher's thread, still
/// one at a time in deadline order per shard"). Fails in about 1 run in 4 (each run
/// tries up to 10 times): two followers of shard 0 run at once, one on the owner
/// (`aud-s0`), one on the rescuer (`aud-s1`).
#[test]
#[ignore = "by design (Callbacks::inline docs): a callback that outlasts rescue_after (2 ms here, 1 ms callbacks, so descheduling alone does it) has its shard's next one run beside it; kept to show what rescue does"]
fn owner_returning_mid_rescue_never_overlaps_followers() {
    let _serial = serial();
    for attempt in 0..10 {
        let n = 8;
        let (followers, b_timed_out) =
            blocked_shard_scenario(n, |f| f.order.lock().unwrap().len() >= 3);
        assert!(!b_timed_out, "never rescued");
        let overlaps = followers.overlaps.load(Ordering::SeqCst);
        let order = followers.order.lock().unwrap().clone();
        let runs = followers.runs.lock().unwrap().clone();
        let t0 = runs.iter().map(|r| r.2).min().unwrap();
        let show: Vec<String> = runs
            .iter()
            .map(|(i, name, a, b)| format!("#{i} on {name} {:?}..{:?}", *a - t0, *b - t0))
            .collect();
        assert_eq!(
            overlaps, 0,
            "attempt {attempt}: overlapping runs of one shard: {show:#?}"
        );
        assert_eq!(
            order,
            (0..n).collect::<Vec<_>>(),
            "attempt {attempt}: order {show:#?}"
        );
        assert_eq!(
            followers.early.load(Ordering::SeqCst),
            0,
            "a follower ran early"
        );
    }
}

/// "No shard waits for another" and "a full ring never drops a timer": an inline
/// callback schedules 200 zero-delay timers (onto both shards' rings of 2 slots, its
/// own included, which its thread cannot drain while inside the callback), resets 50
/// and cancels 50 far timers of both shards.
#[test]
fn inline_callback_floods_full_rings_of_its_own_and_the_other_shard() {
    let _serial = serial();
    let timer = rescue_timer();
    let fired = Arc::new(AtomicUsize::new(0));
    let far_fired = Arc::new(AtomicUsize::new(0));
    let far: Vec<TimerHandle> = (0..100)
        .map(|_| {
            let far_fired = far_fired.clone();
            timer
                .schedule(Duration::from_secs(3600), move || {
                    far_fired.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap()
        })
        .collect();
    let flood_done = Arc::new(AtomicBool::new(false));
    let cancels_won = Arc::new(AtomicUsize::new(0));
    {
        let t = timer.clone();
        let fired = fired.clone();
        let flood_done = flood_done.clone();
        let cancels_won = cancels_won.clone();
        timer
            .schedule(Duration::ZERO, move || {
                for _ in 0..200 {
                    let fired = fired.clone();
                    t.schedule(Duration::ZERO, move || {
                        fired.fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap();
                }
                for h in &far[..50] {
                    assert!(h.reset(Duration::from_secs(7200)));
                }
                for h in &far[50..] {
                    if h.cancel() {
                        cancels_won.fetch_add(1, Ordering::SeqCst);
                    }
                }
                flood_done.store(true, Ordering::SeqCst);
            })
            .unwrap();
    }
    if !wait_until(WAIT, || {
        flood_done.load(Ordering::SeqCst) && fired.load(Ordering::SeqCst) == 200
    }) {
        let why = format!(
            "flood_done {} fired {}/200: a shard waited on a full ring",
            flood_done.load(Ordering::SeqCst),
            fired.load(Ordering::SeqCst)
        );
        leak_and_fail(timer, &why);
    }
    assert_eq!(cancels_won.load(Ordering::SeqCst), 50);
    let unfired = timer.shutdown();
    assert_eq!(unfired.len(), 50, "the 50 reset timers come back");
    assert_eq!(fired.load(Ordering::SeqCst), 200, "exactly once");
    assert_eq!(far_fired.load(Ordering::SeqCst), 0);
}

/// A rescued callback (run on the watcher's thread for the stuck shard 0) floods both
/// rings: shard 0's (whose owner is stuck) and the watcher's own.
#[test]
fn rescued_callback_floods_both_full_rings() {
    let _serial = serial();
    let timer = rescue_timer();
    let release = Arc::new(AtomicBool::new(false));
    let fired = Arc::new(AtomicUsize::new(0));
    let flood_done = Arc::new(AtomicBool::new(false));
    let b_timed_out = Arc::new(AtomicBool::new(false));
    let blocker = {
        let release = release.clone();
        let b_timed_out = b_timed_out.clone();
        place(&timer, 0, move || {
            let release = release.clone();
            let b_timed_out = b_timed_out.clone();
            move || {
                if !wait_until(Duration::from_secs(10), || release.load(Ordering::SeqCst)) {
                    b_timed_out.store(true, Ordering::SeqCst);
                }
            }
        })
    };
    let flooder = {
        let t = timer.clone();
        let fired = fired.clone();
        let flood_done = flood_done.clone();
        let release = release.clone();
        place(&timer, 0, move || {
            let t = t.clone();
            let fired = fired.clone();
            let flood_done = flood_done.clone();
            let release = release.clone();
            move || {
                for _ in 0..300 {
                    let fired = fired.clone();
                    t.schedule(Duration::ZERO, move || {
                        fired.fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap();
                }
                flood_done.store(true, Ordering::SeqCst);
                // Let the blocker go only once the flood's timers fired (by rescue).
                let _ = wait_until(Duration::from_secs(5), || {
                    fired.load(Ordering::SeqCst) == 300
                });
                release.store(true, Ordering::SeqCst);
            }
        })
    };
    let base = Instant::now();
    assert!(flooder.reset_at(base + Duration::from_millis(20)));
    assert!(blocker.reset_at(base + Duration::from_millis(10)));
    if !wait_until(WAIT, || {
        flood_done.load(Ordering::SeqCst) && fired.load(Ordering::SeqCst) == 300
    }) {
        let why = format!(
            "flood_done {} fired {}/300 released {}",
            flood_done.load(Ordering::SeqCst),
            fired.load(Ordering::SeqCst),
            release.load(Ordering::SeqCst)
        );
        leak_and_fail(timer, &why);
    }
    assert!(!b_timed_out.load(Ordering::SeqCst));
    assert!(timer.shutdown().is_empty());
    assert_eq!(fired.load(Ordering::SeqCst), 300);
}

/// Both shard threads inside inline callbacks at the same moment, each flooding both
/// tiny rings: neither may wait for the other.
#[test]
fn two_shards_flooding_each_other_from_inline_callbacks_do_not_deadlock() {
    let _serial = serial();
    for round in 0..3 {
        let timer = rescue_timer();
        let fired = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(std::sync::Barrier::new(2));
        let mut placed = Vec::new();
        for shard in 0..2 {
            let t = timer.clone();
            let fired = fired.clone();
            let gate = gate.clone();
            placed.push(place(&timer, shard, move || {
                let t = t.clone();
                let fired = fired.clone();
                let gate = gate.clone();
                move || {
                    gate.wait();
                    for _ in 0..300 {
                        let fired = fired.clone();
                        t.schedule(Duration::ZERO, move || {
                            fired.fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap();
                    }
                }
            }));
        }
        let at = Instant::now() + Duration::from_millis(10);
        for h in &placed {
            assert!(h.reset_at(at));
        }
        if !wait_until(WAIT, || fired.load(Ordering::SeqCst) == 600) {
            let why = format!("round {round}: fired {}/600", fired.load(Ordering::SeqCst));
            leak_and_fail(timer, &why);
        }
        assert!(timer.shutdown().is_empty());
    }
}

/// A callback of shard 0 blocks until a later timer of its own shard has run: only a
/// rescue can run it.
#[test]
fn callback_waiting_for_a_later_timer_of_its_own_shard_is_rescued() {
    let _serial = serial();
    let timer = rescue_timer();
    let later_ran = Arc::new(AtomicBool::new(false));
    let waited = Arc::new(AtomicBool::new(false));
    let waiter = {
        let later_ran = later_ran.clone();
        let waited = waited.clone();
        place(&timer, 0, move || {
            let later_ran = later_ran.clone();
            let waited = waited.clone();
            move || {
                let ok = wait_until(Duration::from_secs(5), || later_ran.load(Ordering::SeqCst));
                waited.store(ok, Ordering::SeqCst);
            }
        })
    };
    let later = {
        let later_ran = later_ran.clone();
        place(&timer, 0, move || {
            let later_ran = later_ran.clone();
            move || later_ran.store(true, Ordering::SeqCst)
        })
    };
    let base = Instant::now();
    assert!(later.reset_at(base + Duration::from_millis(20)));
    assert!(waiter.reset_at(base + Duration::from_millis(10)));
    assert!(wait_until(WAIT, || waiter.state() == TimerState::Fired));
    assert!(wait_until(Duration::from_secs(8), || waited.load(Ordering::SeqCst)));
    assert!(timer.shutdown().is_empty());
}

/// A blocked inline callback resets (earlier) and cancels timers of its own stuck
/// shard: the cancels win, the reset timer fires by rescue, on time.
#[test]
fn blocked_callback_resets_and_cancels_its_own_shards_timers() {
    let _serial = serial();
    let timer = rescue_timer();
    let ran = Arc::new(AtomicUsize::new(0));
    let victims: Vec<TimerHandle> = (0..6)
        .map(|_| {
            let ran = ran.clone();
            place(&timer, 0, move || {
                let ran = ran.clone();
                move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let victims = Arc::new(victims);
    let outcome = Arc::new(Mutex::new(None));
    let blocker = {
        let victims = victims.clone();
        let ran = ran.clone();
        let outcome = outcome.clone();
        place(&timer, 0, move || {
            let victims = victims.clone();
            let ran = ran.clone();
            let outcome = outcome.clone();
            move || {
                let cancels: Vec<bool> = victims[..3].iter().map(|h| h.cancel()).collect();
                let resets: Vec<bool> = victims[3..]
                    .iter()
                    .map(|h| h.reset(Duration::from_millis(5)))
                    .collect();
                // Stay blocked until the reset timers ran (by rescue).
                let rescued =
                    wait_until(Duration::from_secs(5), || ran.load(Ordering::SeqCst) == 3);
                *outcome.lock().unwrap() = Some((cancels, resets, rescued));
            }
        })
    };
    assert!(blocker.reset(Duration::from_millis(5)));
    if !wait_until(WAIT, || outcome.lock().unwrap().is_some()) {
        leak_and_fail(timer, "the blocked callback never finished");
    }
    let (cancels, resets, rescued) = outcome.lock().unwrap().clone().unwrap();
    assert_eq!(cancels, vec![true; 3]);
    assert_eq!(resets, vec![true; 3]);
    assert!(
        rescued,
        "timers reset by a blocked callback were not rescued"
    );
    assert!(timer.shutdown().is_empty());
    assert_eq!(ran.load(Ordering::SeqCst), 3);
}

// ---------------------------------------------------------------------------------
// Sleeps and timeouts on hand-written executors with hostile wakers
// ---------------------------------------------------------------------------------

/// A task that owns its future; its waker holds the only reference to it, so the
/// waker's last drop drops the task, and with it the `Sleep`.
struct SelfOwnedTask {
    sleep: Mutex<Option<Pin<Box<sharded_timer::Sleep>>>>,
    dropped: Arc<AtomicBool>,
    woken: Arc<AtomicUsize>,
}

impl Drop for SelfOwnedTask {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

impl Wake for SelfOwnedTask {
    fn wake(self: Arc<Self>) {
        self.woken.fetch_add(1, Ordering::SeqCst);
        // Dropping `self` here (by value) may be the last reference: the task and its
        // sleep are dropped inside the timer's wake.
    }
}

/// Guarantee 10 / Sleep: "Dropping it cancels its timer and wakes nobody". A waker
/// whose drop drops its own task (and the `Sleep` in it), on every callback mode.
#[test]
fn waker_whose_drop_drops_its_task_and_sleep() {
    let _serial = serial();
    for mode in 0..3 {
        let spawned: Arc<Mutex<Vec<Callback>>> = Arc::default();
        let timer = match mode {
            0 => pool_timer(2),
            1 => inline_timer(2),
            _ => {
                let spawned = spawned.clone();
                builder(2)
                    .callbacks(Callbacks::spawn(move |c| spawned.lock().unwrap().push(c)))
                    .build()
                    .unwrap()
            }
        };
        let mut flags = Vec::new();
        for i in 0..20 {
            let dropped = Arc::new(AtomicBool::new(false));
            let woken = Arc::new(AtomicUsize::new(0));
            let task = Arc::new(SelfOwnedTask {
                sleep: Mutex::new(Some(Box::pin(
                    timer.sleep(Duration::from_millis(1 + i % 3)),
                ))),
                dropped: dropped.clone(),
                woken: woken.clone(),
            });
            let waker = Waker::from(task.clone());
            let mut cx = Context::from_waker(&waker);
            {
                let mut slot = task.sleep.lock().unwrap();
                assert!(slot.as_mut().unwrap().as_mut().poll(&mut cx).is_pending());
            }
            // Only the waker stored in the sleep keeps the task (a cycle the wake
            // breaks).
            let _ = cx;
            drop(waker);
            drop(task);
            flags.push((dropped, woken));
        }
        let done = wait_until(WAIT, || {
            if mode == 2 {
                let batch: Vec<Callback> = std::mem::take(&mut *spawned.lock().unwrap());
                for c in batch {
                    c.run();
                }
            }
            flags.iter().all(|(d, _)| d.load(Ordering::SeqCst))
        });
        if !done {
            leak_and_fail(timer, &format!("mode {mode}: a task was never dropped"));
        }
        for (_, woken) in &flags {
            assert_eq!(woken.load(Ordering::SeqCst), 1, "mode {mode}: woken once");
        }
        // The service is whole.
        let ok = Arc::new(AtomicBool::new(false));
        let o = ok.clone();
        timer
            .schedule(Duration::ZERO, move || o.store(true, Ordering::SeqCst))
            .unwrap();
        assert!(wait_until(WAIT, || {
            if mode == 2 {
                let batch: Vec<Callback> = std::mem::take(&mut *spawned.lock().unwrap());
                for c in batch {
                    c.run();
                }
            }
            ok.load(Ordering::SeqCst)
        }));
        let leftover = bounded(WAIT, move || timer.shutdown().len());
        assert_eq!(leftover, Some(0), "mode {mode}");
    }
}

/// A waker whose wake and whose drop both panic.
struct PanickyWaker {
    drops: Arc<AtomicUsize>,
    panic_on_wake: bool,
    panic_on_drop: bool,
}
impl Wake for PanickyWaker {
    fn wake(self: Arc<Self>) {
        if self.panic_on_wake {
            panic!("hostile wake");
        }
    }
}
impl Drop for PanickyWaker {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
        if self.panic_on_drop && !thread::panicking() {
            panic!("hostile waker drop");
        }
    }
}

/// Sleep: "`poll` never panics" (it did not say a user waker cannot); a waker whose
/// drop panics is replaced by a re-poll, and a sleep holding one is dropped: the
/// service stays whole, the timer is cancelled, the next waker is woken.
#[test]
fn waker_whose_drop_panics_replaced_and_dropped_leaves_the_service_whole() {
    let _serial = serial();
    let timer = inline_timer(2);
    let drops = Arc::new(AtomicUsize::new(0));
    // 1. Replaced by a re-poll with another waker.
    let mut sleep = Box::pin(timer.sleep(Duration::from_millis(30)));
    let hostile = Waker::from(Arc::new(PanickyWaker {
        drops: drops.clone(),
        panic_on_wake: false,
        panic_on_drop: true,
    }));
    assert!(sleep
        .as_mut()
        .poll(&mut Context::from_waker(&hostile))
        .is_pending());
    drop(hostile);
    let good = Arc::new(ThreadWake {
        woken: AtomicBool::new(false),
        thread: thread::current(),
    });
    let good_waker = Waker::from(good.clone());
    let repoll = catch_unwind(AssertUnwindSafe(|| {
        sleep
            .as_mut()
            .poll(&mut Context::from_waker(&good_waker))
            .is_pending()
    }));
    // Whether or not the re-poll propagated the drop's panic, the sleep must still
    // complete and wake the new waker.
    let _ = repoll;
    assert!(
        wait_until(WAIT, || good.woken.load(Ordering::SeqCst)),
        "the waker registered after a panicking waker's drop was never woken"
    );
    assert!(sleep
        .as_mut()
        .poll(&mut Context::from_waker(&good_waker))
        .is_ready());
    assert!(sleep.is_elapsed());
    // 2. A pending sleep holding the hostile waker is dropped.
    let mut sleep = Box::pin(timer.sleep(Duration::from_secs(3600)));
    let hostile = Waker::from(Arc::new(PanickyWaker {
        drops: drops.clone(),
        panic_on_wake: false,
        panic_on_drop: true,
    }));
    assert!(sleep
        .as_mut()
        .poll(&mut Context::from_waker(&hostile))
        .is_pending());
    drop(hostile);
    let dropped = catch_unwind(AssertUnwindSafe(move || drop(sleep)));
    assert!(
        dropped.is_err(),
        "the waker's drop panic surfaces on the dropping thread"
    );
    assert!(
        wait_until(WAIT, || timer.stats().pending == 0),
        "the dropped sleep's timer is still pending: {:?}",
        timer.stats()
    );
    assert_eq!(drops.load(Ordering::SeqCst), 2);
    let leftover = bounded(WAIT, move || timer.shutdown().len());
    assert_eq!(leftover, Some(0));
}

/// A waker whose `wake` panics, woken by the service's own firing (shard thread with
/// inline callbacks, a pool worker otherwise): caught, the service lives on.
#[test]
fn waker_whose_wake_panics_does_not_kill_the_service() {
    let _serial = serial();
    for inline in [true, false] {
        let timer = if inline {
            inline_timer(2)
        } else {
            pool_timer(2)
        };
        let drops = Arc::new(AtomicUsize::new(0));
        let mut sleeps = Vec::new();
        for _ in 0..4 {
            let mut sleep = Box::pin(timer.sleep(Duration::from_millis(2)));
            let hostile = Waker::from(Arc::new(PanickyWaker {
                drops: drops.clone(),
                panic_on_wake: true,
                panic_on_drop: false,
            }));
            assert!(sleep
                .as_mut()
                .poll(&mut Context::from_waker(&hostile))
                .is_pending());
            sleeps.push(sleep);
        }
        let noop = noop_waker();
        let ok = wait_until(WAIT, || {
            sleeps
                .iter_mut()
                .all(|s| s.as_mut().poll(&mut Context::from_waker(&noop)).is_ready())
        });
        if !ok {
            leak_and_fail(timer, "a sleep whose waker panics never completed");
        }
        let fired = Arc::new(AtomicBool::new(false));
        let f = fired.clone();
        timer
            .schedule(Duration::from_millis(1), move || {
                f.store(true, Ordering::SeqCst)
            })
            .unwrap();
        assert!(
            wait_until(WAIT, || fired.load(Ordering::SeqCst)),
            "service dead"
        );
        drop(sleeps);
        let leftover = bounded(WAIT, move || timer.shutdown().len());
        assert_eq!(leftover, Some(0));
    }
}

/// A waker whose wake re-polls the sleep synchronously (on the firing thread), and an
/// interval whose wake re-polls `poll_tick` (re-arming from inside the firing).
#[test]
fn wake_that_repolls_synchronously() {
    let _serial = serial();
    struct Repoll {
        sleep: Mutex<Option<Pin<Box<sharded_timer::Sleep>>>>,
        ready: AtomicBool,
        // Its own waker; cleared at the end (a self-reference: LeakSanitizer).
        me: Mutex<Option<Waker>>,
    }
    impl Wake for Repoll {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            let waker = self
                .me
                .lock()
                .unwrap()
                .clone()
                .expect("set before the first poll");
            let mut cx = Context::from_waker(&waker);
            if let Some(s) = self.sleep.lock().unwrap().as_mut() {
                if s.as_mut().poll(&mut cx).is_ready() {
                    self.ready.store(true, Ordering::SeqCst);
                }
            }
        }
    }
    for inline in [true, false] {
        let timer = if inline {
            inline_timer(2)
        } else {
            pool_timer(2)
        };
        let tasks: Vec<Arc<Repoll>> = (0..10)
            .map(|i| {
                let task = Arc::new(Repoll {
                    sleep: Mutex::new(Some(Box::pin(timer.sleep(Duration::from_millis(1 + i))))),
                    ready: AtomicBool::new(false),
                    me: Mutex::new(None),
                });
                let waker = Waker::from(task.clone());
                *task.me.lock().unwrap() = Some(waker.clone());
                task.wake_by_ref();
                task
            })
            .collect();
        if !wait_until(WAIT, || {
            tasks.iter().all(|t| t.ready.load(Ordering::SeqCst))
        }) {
            leak_and_fail(timer, "a synchronously re-polled sleep never completed");
        }
        for t in &tasks {
            // Break the waker cycles.
            *t.sleep.lock().unwrap() = None;
            *t.me.lock().unwrap() = None;
        }
        let leftover = bounded(WAIT, move || timer.shutdown().len());
        assert_eq!(leftover, Some(0));
    }
}

/// An interval whose waker polls `poll_tick` synchronously from the firing thread,
/// counting ticks: never early (each due instant is at or before now), in order.
#[test]
fn interval_repolled_from_its_own_wake_ticks_in_order_never_early() {
    let _serial = serial();
    struct Ticker {
        interval: Mutex<Option<sharded_timer::Interval>>,
        ticks: Mutex<Vec<(Instant, Instant)>>,
        // Its own waker; cleared at the end (a self-reference: LeakSanitizer).
        me: Mutex<Option<Waker>>,
    }
    impl Wake for Ticker {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            let waker = self
                .me
                .lock()
                .unwrap()
                .clone()
                .expect("set before the first poll");
            let mut cx = Context::from_waker(&waker);
            let mut guard = self.interval.lock().unwrap();
            if let Some(iv) = guard.as_mut() {
                while let Poll::Ready(due) = iv.poll_tick(&mut cx) {
                    self.ticks
                        .lock()
                        .unwrap()
                        .push((due.into_std(), Instant::now()));
                    if self.ticks.lock().unwrap().len() >= 30 {
                        return;
                    }
                }
            }
        }
    }
    for inline in [true, false] {
        let timer = if inline {
            inline_timer(2)
        } else {
            pool_timer(2)
        };
        let task = Arc::new(Ticker {
            interval: Mutex::new(Some(timer.interval(Duration::from_millis(2)))),
            ticks: Mutex::default(),
            me: Mutex::new(None),
        });
        *task.me.lock().unwrap() = Some(Waker::from(task.clone()));
        task.wake_by_ref();
        if !wait_until(WAIT, || task.ticks.lock().unwrap().len() >= 30) {
            leak_and_fail(timer, "interval stalled");
        }
        let ticks = task.ticks.lock().unwrap().clone();
        for w in ticks.windows(2) {
            assert_eq!(w[1].0 - w[0].0, Duration::from_millis(2), "grid kept");
        }
        for (due, at) in &ticks {
            assert!(at >= due, "tick completed early");
        }
        *task.interval.lock().unwrap() = None;
        *task.me.lock().unwrap() = None;
        let leftover = bounded(WAIT, move || timer.shutdown().len());
        assert_eq!(leftover, Some(0));
    }
}

/// A waker that calls `shutdown` from its wake (the firing thread: a shard thread
/// inline, a pool worker otherwise): other pending sleeps complete refused.
#[test]
fn waker_that_calls_shutdown() {
    let _serial = serial();
    struct ShutdownWake {
        timer: Mutex<Option<ShardedTimer>>,
        returned: AtomicBool,
    }
    impl Wake for ShutdownWake {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            let timer = self.timer.lock().unwrap().take();
            if let Some(t) = timer {
                let _ = t.shutdown();
                self.returned.store(true, Ordering::SeqCst);
            }
        }
    }
    for inline in [true, false] {
        let timer = if inline {
            inline_timer(2)
        } else {
            pool_timer(2)
        };
        let task = Arc::new(ShutdownWake {
            timer: Mutex::new(Some(timer.clone())),
            returned: AtomicBool::new(false),
        });
        let waker = Waker::from(task.clone());
        let mut trigger = Box::pin(timer.sleep(Duration::from_millis(2)));
        assert!(trigger
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        let mut others: Vec<_> = (0..8)
            .map(|_| Box::pin(timer.sleep(Duration::from_secs(3600))))
            .collect();
        let noop = noop_waker();
        for s in &mut others {
            assert!(s
                .as_mut()
                .poll(&mut Context::from_waker(&noop))
                .is_pending());
        }
        if !wait_until(WAIT, || task.returned.load(Ordering::SeqCst)) {
            leak_and_fail(timer, "shutdown from a waker never returned");
        }
        for s in &mut others {
            assert!(s.as_mut().poll(&mut Context::from_waker(&noop)).is_ready());
            assert!(!s.is_elapsed());
            assert_eq!(s.refused(), Some(ScheduleError::Shutdown));
        }
        assert!(trigger
            .as_mut()
            .poll(&mut Context::from_waker(&noop))
            .is_ready());
        assert!(trigger.is_elapsed());
        assert_eq!(timer.stats().pending, 0);
        drop(others);
        drop(trigger);
        let leftover = bounded(WAIT, move || timer.shutdown().len());
        assert_eq!(leftover, Some(0));
    }
}

/// Sleeps dropped, reset and polled from two threads while a third shuts the service
/// down: every sleep completes (elapsed or refused, never both), nothing hangs,
/// nothing stays pending.
#[test]
fn sleeps_and_timeouts_racing_shutdown() {
    let _serial = serial();
    for round in 0..5 {
        let timer = if round % 2 == 0 {
            inline_timer(2)
        } else {
            pool_timer(2)
        };
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        for w in 0..2 {
            let timer = timer.clone();
            workers.push(thread::spawn(move || {
                let mut outcomes = (0usize, 0usize);
                for i in 0..200u64 {
                    let d = Duration::from_micros((i * 37 + w * 11) % 3000);
                    match i % 4 {
                        0 => drop(timer.sleep(d)),
                        1 => {
                            let mut s = Box::pin(timer.sleep(d));
                            s.as_mut().reset((Instant::now() + d / 2).into());
                            let _ = s.as_mut().poll(&mut Context::from_waker(&noop_waker()));
                        }
                        2 => {
                            let r = block_on_for(
                                timer.timeout(d, std::future::pending::<()>()),
                                Duration::from_secs(10),
                            )
                            .expect("a timeout hung");
                            let e = r.unwrap_err();
                            if e.refused().is_some() {
                                outcomes.1 += 1;
                            } else {
                                outcomes.0 += 1;
                            }
                        }
                        _ => {
                            let s = timer.sleep(d);
                            let mut s = std::pin::pin!(s);
                            block_on_for(s.as_mut(), Duration::from_secs(10))
                                .expect("a sleep hung");
                            assert!(
                                s.is_elapsed() != s.refused().is_some(),
                                "elapsed {} refused {:?}",
                                s.is_elapsed(),
                                s.refused()
                            );
                        }
                    }
                }
                outcomes
            }));
        }
        thread::sleep(Duration::from_millis(3 + round as u64 * 3));
        let t2 = timer.clone();
        let shut = bounded(WAIT, move || t2.shutdown().len());
        stop.store(true, Ordering::SeqCst);
        for w in workers {
            w.join().expect("a worker failed");
        }
        assert_eq!(shut, Some(0), "sleeps never come back as Unfired");
        assert_eq!(timer.stats().pending, 0, "{:?}", timer.stats());
    }
}

/// Found by a foreign-thread reset racing a poll (the resetter computed `now + 3 ms`
/// and ran late). Minimal form: a task polled its sleep (waker registered), then the
/// sleep is reset to a deadline already past, and nobody polls it again: the old timer
/// is given up (waking nobody) and no timer is armed, so the registered task is never
/// woken. tokio's `Sleep::reset` to a past deadline fires the entry and wakes the
/// stored waker. The doc of `Sleep::reset` does say "Poll the sleep again afterwards"
/// and "(one at or before the service's now: at the next poll, with no timer)".
#[test]
fn sleep_reset_to_a_past_deadline_after_poll_wakes_the_registered_task() {
    let _serial = serial();
    let timer = pool_timer(2);
    let mut sleep = Box::pin(timer.sleep(Duration::from_millis(500)));
    let wake = Arc::new(ThreadWake {
        woken: AtomicBool::new(false),
        thread: thread::current(),
    });
    let waker = Waker::from(wake.clone());
    assert!(sleep
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    sleep
        .as_mut()
        .reset((Instant::now() - Duration::from_millis(1)).into());
    let woke = wait_until(Duration::from_secs(2), || wake.woken.load(Ordering::SeqCst));
    assert!(sleep
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_ready());
    let leftover = bounded(WAIT, move || timer.shutdown().len());
    assert_eq!(leftover, Some(0));
    assert!(
        woke,
        "the task that polled the sleep is never woken after a reset to the past"
    );
}

/// Minimal: poll a pending sleep (registering a waker), then reset it (earlier, in
/// place) without polling again: is the registered task woken by the re-armed timer?
#[test]
fn sleep_reset_after_poll_without_repoll_wakes_the_registered_task() {
    let _serial = serial();
    let timer = pool_timer(2);
    for earlier in [true, false] {
        let mut sleep = Box::pin(timer.sleep(Duration::from_millis(if earlier { 500 } else { 2 })));
        let wake = Arc::new(ThreadWake {
            woken: AtomicBool::new(false),
            thread: thread::current(),
        });
        let waker = Waker::from(wake.clone());
        assert!(sleep
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        sleep
            .as_mut()
            .reset((Instant::now() + Duration::from_millis(5)).into());
        let woke = wait_until(Duration::from_secs(2), || wake.woken.load(Ordering::SeqCst));
        assert!(
            woke,
            "earlier={earlier}: the task that polled the sleep was not woken by the re-armed timer"
        );
    }
    let leftover = bounded(WAIT, move || timer.shutdown().len());
    assert_eq!(leftover, Some(0));
}

// ---------------------------------------------------------------------------------
// Repeating and fixed-delay timers
// ---------------------------------------------------------------------------------

fn repeating(
    timer: &ShardedTimer,
    fixed_delay: bool,
    period: Duration,
    f: impl FnMut() + Send + 'static,
) -> TimerHandle {
    if fixed_delay {
        timer.schedule_with_fixed_delay(period, f).unwrap()
    } else {
        timer.schedule_repeating(period, f).unwrap()
    }
}

/// TimerHandle::cancel: "Returns true iff this call moved it from Pending to Cancelled:
/// the callback will then never run (again)"; schedule_repeating: "cancel stops every
/// later run". A run that starts after `cancel` returned true is a violation, but for
/// the one run under way (begun by its runner, its body not yet entered), which the
/// captures' drop tells apart (`cancel`'s docs).
#[test]
fn repeating_cancel_true_means_no_run_starts_after_it() {
    /// Records the callback's drop.
    struct DroppedFlag(Arc<AtomicBool>);
    impl Drop for DroppedFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let _serial = serial();
    for mode in 0..4 {
        let timer = if mode % 2 == 0 {
            pool_timer(2)
        } else {
            inline_timer(2)
        };
        let fixed_delay = mode >= 2;
        let mut violations = 0;
        for i in 0..40u64 {
            let cancelled = Arc::new(AtomicBool::new(false));
            let bad = Arc::new(AtomicUsize::new(0));
            let runs = Arc::new(AtomicUsize::new(0));
            let dropped = Arc::new(AtomicBool::new(false));
            let (c, b, r) = (cancelled.clone(), bad.clone(), runs.clone());
            let flag = DroppedFlag(dropped.clone());
            let h = repeating(&timer, fixed_delay, Duration::from_millis(1), move || {
                let _flag = &flag;
                if c.load(Ordering::SeqCst) {
                    b.fetch_add(1, Ordering::SeqCst);
                }
                r.fetch_add(1, Ordering::SeqCst);
                thread::sleep(Duration::from_micros(300));
            });
            assert!(wait_until(WAIT, || runs.load(Ordering::SeqCst) > (i as usize % 3)));
            thread::sleep(Duration::from_micros(i * 97 % 1500));
            assert!(h.cancel());
            // The library begins a run before its body's first instruction, so a run
            // begun just before the cancel may enter the body after it returned. The
            // docs tell the cases apart: with no run under way the captures are
            // dropped before `cancel` returns (then no body may start afterwards);
            // with one under way its runner drops them after that run (then that one
            // body, and no other, may start afterwards).
            let under_way = !dropped.load(Ordering::SeqCst);
            cancelled.store(true, Ordering::SeqCst);
            let runs_at_cancel = runs.load(Ordering::SeqCst);
            thread::sleep(Duration::from_millis(5));
            let late = bad.load(Ordering::SeqCst);
            if under_way {
                assert!(late <= 1, "mode {mode}: {late} bodies after the cancel");
            } else {
                violations += late;
            }
            assert!(runs.load(Ordering::SeqCst) <= runs_at_cancel + 1);
            assert!(
                wait_until(WAIT, || dropped.load(Ordering::SeqCst)),
                "mode {mode}: the callback was never dropped"
            );
            assert_eq!(h.state(), TimerState::Cancelled);
        }
        assert_eq!(
            violations, 0,
            "mode {mode}: runs started after cancel returned true"
        );
        assert!(
            wait_until(WAIT, || timer.stats().pending == 0),
            "{:?}",
            timer.stats()
        );
        assert!(timer.shutdown().is_empty());
    }
}

/// Cancel from inside its own run: true, no later run, the callback (captures) dropped
/// once the run returns, state Cancelled, counted once in `cancelled`.
#[test]
fn repeating_cancelled_from_inside_its_own_run() {
    let _serial = serial();
    struct Capture(Arc<AtomicUsize>);
    impl Drop for Capture {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    for mode in 0..4 {
        let timer = if mode % 2 == 0 {
            pool_timer(2)
        } else {
            inline_timer(2)
        };
        let fixed_delay = mode >= 2;
        let me: Arc<OnceLock<TimerHandle>> = Arc::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let cancel_result = Arc::new(Mutex::new(None));
        let dropped = Arc::new(AtomicUsize::new(0));
        let capture = Capture(dropped.clone());
        let (m, r, cr) = (me.clone(), runs.clone(), cancel_result.clone());
        let h = repeating(&timer, fixed_delay, Duration::from_millis(1), move || {
            let _keep = &capture;
            let n = r.fetch_add(1, Ordering::SeqCst) + 1;
            if n == 3 {
                let h = loop {
                    if let Some(h) = m.get() {
                        break h;
                    }
                    thread::yield_now();
                };
                *cr.lock().unwrap() = Some((h.cancel(), dropped_now(&_keep.0)));
            }
        });
        fn dropped_now(c: &AtomicUsize) -> usize {
            c.load(Ordering::SeqCst)
        }
        let _ = me.set(h.clone());
        assert!(
            wait_until(WAIT, || dropped.load(Ordering::SeqCst) == 1),
            "mode {mode}: callback never dropped"
        );
        thread::sleep(Duration::from_millis(10));
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "mode {mode}: a run after the cancel"
        );
        assert_eq!(*cancel_result.lock().unwrap(), Some((true, 0)));
        assert_eq!(h.state(), TimerState::Cancelled);
        assert!(
            wait_until(WAIT, || {
                let s = timer.stats();
                s.pending == 0 && s.cancelled == 1 && s.fired == 3 && s.scheduled == 1
            }),
            "mode {mode}: {:?}",
            timer.stats()
        );
        assert!(timer.shutdown().is_empty());
    }
}

/// schedule_repeating: shutdown from inside its own run: "it is not handed back; when
/// that run returns the timer is cancelled (its handle reads Cancelled) and its callback
/// dropped"; Stats: "Once shutdown has returned, pending is 0" and a repeating timer
/// counts once in `cancelled`.
#[test]
fn repeating_shutdown_from_its_own_run_then_stats_identities() {
    let _serial = serial();
    struct Capture(Arc<AtomicUsize>);
    impl Drop for Capture {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    for mode in 0..4 {
        let timer = if mode % 2 == 0 {
            pool_timer(2)
        } else {
            inline_timer(2)
        };
        let fixed_delay = mode >= 2;
        // Some company: 5 fired one-shots, 4 far one-shots (handed back), 3 cancelled.
        let fired = Arc::new(AtomicUsize::new(0));
        for _ in 0..5 {
            let f = fired.clone();
            timer
                .schedule(Duration::ZERO, move || {
                    f.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
        }
        assert!(wait_until(WAIT, || fired.load(Ordering::SeqCst) == 5));
        let far: Vec<_> = (0..7)
            .map(|_| timer.schedule(Duration::from_secs(3600), || {}).unwrap())
            .collect();
        for h in &far[..3] {
            assert!(h.cancel());
        }
        let runs = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let returned = Arc::new(Mutex::new(None));
        let capture = Capture(dropped.clone());
        let (t, r, ret) = (timer.clone(), runs.clone(), returned.clone());
        let mut t = Some(t);
        let h = repeating(&timer, fixed_delay, Duration::from_millis(1), move || {
            let _keep = &capture;
            if r.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
                if let Some(t) = t.take() {
                    let unfired = t.shutdown();
                    *ret.lock().unwrap() = Some(unfired.len());
                    drop(unfired);
                }
            }
        });
        if !wait_until(WAIT, || returned.lock().unwrap().is_some()) {
            leak_and_fail(timer, "shutdown from a repeating run never returned");
        }
        assert_eq!(
            *returned.lock().unwrap(),
            Some(4),
            "mode {mode}: the 4 far timers come back, not itself"
        );
        assert!(
            wait_until(WAIT, || dropped.load(Ordering::SeqCst) == 1),
            "mode {mode}: callback never dropped"
        );
        assert_eq!(h.state(), TimerState::Cancelled, "mode {mode}");
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        let s = timer.stats();
        assert_eq!(s.pending, 0, "mode {mode}: {s:?}");
        assert_eq!(s.scheduled, 5 + 7 + 1, "mode {mode}: {s:?}");
        assert_eq!(s.fired, 5 + 3, "mode {mode}: {s:?}");
        assert_eq!(s.cancelled, 3 + 1, "mode {mode}: {s:?}");
        assert_eq!(s.in_rings, 0, "mode {mode}: {s:?}");
    }
}

/// A repeating timer handed back by shutdown (from outside) makes one last run on
/// `Unfired::run`, and none after; its capture is dropped once.
#[test]
fn repeating_handed_back_runs_once_more_and_never_again() {
    let _serial = serial();
    for fixed_delay in [false, true] {
        let timer = pool_timer(2);
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        let h = repeating(&timer, fixed_delay, Duration::from_millis(3), move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        assert!(wait_until(WAIT, || runs.load(Ordering::SeqCst) >= 2));
        let unfired = timer.shutdown();
        let before = runs.load(Ordering::SeqCst);
        let mine: Vec<_> = unfired.into_iter().filter(|u| u.id() == h.id()).collect();
        // Its run may have been under way at shutdown on the pool: then it is not
        // handed back (the pool finishes it) - accept either, but exactly one outcome.
        assert!(mine.len() <= 1);
        let had = mine.len();
        for u in mine {
            u.run();
        }
        thread::sleep(Duration::from_millis(10));
        assert_eq!(runs.load(Ordering::SeqCst), before + had);
        assert!(!h.cancel());
        let s = timer.stats();
        assert_eq!(s.pending, 0, "{s:?}");
    }
}

// ---------------------------------------------------------------------------------
// ManualClock
// ---------------------------------------------------------------------------------

fn manual(shards: usize, inline: bool, tick: Duration) -> (ManualClock, ShardedTimer) {
    let clock = ManualClock::new();
    let mut b = builder(shards).clock(clock.clone()).tick(tick);
    b = if inline {
        b.callbacks(Callbacks::inline())
    } else {
        b.executor_threads(2)
    };
    (clock, b.build().unwrap())
}

/// advance: "returns once every timer ... due at or before the new now has fired and
/// ... its callback has returned"; deadlines mid-tick, before the clock's start, at
/// `Duration::MAX`; callbacks see the new now; never early.
#[test]
fn manual_advance_fires_mid_tick_pre_origin_and_far_future_deadlines() {
    let _serial = serial();
    for inline in [true, false] {
        let (clock, timer) = manual(2, inline, Duration::from_millis(10));
        let start = clock.now();
        let log: Arc<Mutex<Vec<(&'static str, Instant)>>> = Arc::default();
        let add = |name: &'static str, at: Instant| {
            let log = log.clone();
            let c = clock.clone();
            let h = timer
                .schedule_at(at, move || {
                    thread::sleep(Duration::from_millis(1));
                    log.lock().unwrap().push((name, c.now()));
                })
                .unwrap();
            assert_eq!(
                h.deadline(),
                at,
                "{name}: deadline() is the instant asked for"
            );
            h
        };
        let pre = start.checked_sub(Duration::from_secs(5)).unwrap();
        add("pre-origin", pre);
        add("mid-tick-3ms", start + Duration::from_millis(3));
        add(
            "mid-tick-3ms+1ns",
            start + Duration::from_millis(3) + Duration::from_nanos(1),
        );
        add("tick-boundary", start + Duration::from_millis(10));
        let max = {
            let log = log.clone();
            let c = clock.clone();
            timer
                .schedule(Duration::MAX, move || {
                    log.lock().unwrap().push(("max", c.now()))
                })
                .unwrap()
        };
        clock.advance(Duration::ZERO);
        assert_eq!(names(&log), vec!["pre-origin"], "inline={inline}");
        clock.advance(Duration::from_millis(3));
        assert_eq!(
            names(&log),
            vec!["pre-origin", "mid-tick-3ms"],
            "inline={inline}"
        );
        clock.advance(Duration::from_nanos(1));
        assert_eq!(names(&log).len(), 3, "inline={inline}");
        clock.advance(Duration::from_millis(7) - Duration::from_nanos(2));
        assert_eq!(names(&log).len(), 3, "inline={inline}: never early");
        clock.advance(Duration::from_nanos(1));
        assert_eq!(names(&log).len(), 4, "inline={inline}");
        clock.advance(Duration::from_secs(100 * 365 * 86400));
        assert_eq!(
            names(&log).len(),
            4,
            "inline={inline}: MAX not reached at +100 years"
        );
        clock.advance(Duration::MAX);
        assert_eq!(
            names(&log).len(),
            5,
            "inline={inline}: advance(MAX) reaches Duration::MAX"
        );
        assert_eq!(max.state(), TimerState::Fired);
        for (name, at) in log.lock().unwrap().iter() {
            let _ = (name, at);
        }
        // The clock stays saturated and never goes backwards.
        let far = clock.now();
        clock.advance(Duration::MAX);
        clock.advance(Duration::from_secs(1));
        assert_eq!(clock.now(), far);
        assert!(timer.shutdown().is_empty());
    }
    fn names(log: &Mutex<Vec<(&'static str, Instant)>>) -> Vec<&'static str> {
        log.lock().unwrap().iter().map(|(n, _)| *n).collect()
    }
}

/// Callbacks that schedule more due work, to a fixed point: a chain of 200, each link
/// scheduling the next at a past instant, all within one `advance`.
#[test]
fn manual_advance_runs_chains_of_due_work_to_a_fixed_point() {
    let _serial = serial();
    for inline in [true, false] {
        let (clock, timer) = manual(2, inline, Duration::from_millis(1));
        let start = clock.now();
        let count = Arc::new(AtomicUsize::new(0));
        fn link(timer: ShardedTimer, start: Instant, count: Arc<AtomicUsize>, k: u64) {
            let t = timer.clone();
            timer
                .schedule_at(start + Duration::from_micros(k * 10), move || {
                    count.fetch_add(1, Ordering::SeqCst);
                    if k < 200 {
                        // Twice: one zero-delay, one at a past instant.
                        let c2 = count.clone();
                        t.schedule(Duration::ZERO, move || {
                            c2.fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap();
                        link(t.clone(), start, count, k + 1);
                    }
                })
                .unwrap();
        }
        link(timer.clone(), start, count.clone(), 1);
        clock.advance(Duration::from_millis(5));
        assert_eq!(count.load(Ordering::SeqCst), 200 + 199, "inline={inline}");
        assert!(timer.shutdown().is_empty());
    }
}

/// `advance` from three threads at once, with timers every millisecond: when a call
/// returns, every timer due at or before (the now it read before) + its step fired.
#[test]
fn manual_advance_from_several_threads_at_once() {
    let _serial = serial();
    for inline in [true, false] {
        let (clock, timer) = manual(2, inline, Duration::from_millis(1));
        let start = clock.now();
        let n = 150usize;
        let fired: Arc<Vec<AtomicBool>> =
            Arc::new((0..=n).map(|_| AtomicBool::new(false)).collect());
        let early = Arc::new(AtomicUsize::new(0));
        for k in 1..=n {
            let f = fired.clone();
            let c = clock.clone();
            let e = early.clone();
            let at = start + Duration::from_micros(k as u64 * 1000 - 500);
            timer
                .schedule_at(at, move || {
                    if c.now() < at {
                        e.fetch_add(1, Ordering::SeqCst);
                    }
                    f[k].store(true, Ordering::SeqCst);
                })
                .unwrap();
        }
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let clock = clock.clone();
                let fired = fired.clone();
                thread::spawn(move || {
                    let mut misses = Vec::new();
                    for _ in 0..50 {
                        let before = clock.now();
                        clock.advance(Duration::from_millis(1));
                        let bound = before + Duration::from_millis(1);
                        for k in 1..=n {
                            let at = start + Duration::from_micros(k as u64 * 1000 - 500);
                            if at <= bound && !fired[k].load(Ordering::SeqCst) {
                                misses.push(k);
                            }
                        }
                    }
                    misses
                })
            })
            .collect();
        let out = bounded(WAIT, move || {
            threads
                .into_iter()
                .map(|t| t.join().unwrap())
                .collect::<Vec<_>>()
        });
        let Some(out) = out else {
            leak_and_fail(timer, "concurrent advances hung")
        };
        for misses in out {
            assert!(
                misses.is_empty(),
                "inline={inline}: advance returned before {misses:?} fired"
            );
        }
        assert_eq!(early.load(Ordering::SeqCst), 0);
        assert!(timer.shutdown().is_empty());
    }
}

/// `advance` racing `schedule` and `cancel` from other threads: never early, exactly
/// once, a true cancel never runs; after a final advance everything else ran.
#[test]
fn manual_advance_racing_schedule_and_cancel() {
    let _serial = serial();
    for inline in [true, false] {
        let (clock, timer) = manual(2, inline, Duration::from_millis(1));
        let stop = Arc::new(AtomicBool::new(false));
        let advancer = {
            let clock = clock.clone();
            let stop = stop.clone();
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    clock.advance(Duration::from_micros(300));
                }
            })
        };
        let schedulers: Vec<_> = (0..2)
            .map(|w| {
                let timer = timer.clone();
                let clock = clock.clone();
                thread::spawn(move || {
                    let mut recs = Vec::new();
                    for i in 0..400u64 {
                        let runs = Arc::new(AtomicUsize::new(0));
                        let early = Arc::new(AtomicBool::new(false));
                        let at = clock.now() + Duration::from_micros((i * 131 + w * 7) % 2000);
                        let (r, e, c) = (runs.clone(), early.clone(), clock.clone());
                        let h = timer
                            .schedule_at(at, move || {
                                if c.now() < at {
                                    e.store(true, Ordering::SeqCst);
                                }
                                r.fetch_add(1, Ordering::SeqCst);
                            })
                            .unwrap();
                        let won = i % 3 == 0 && h.cancel();
                        recs.push((runs, early, won));
                    }
                    recs
                })
            })
            .collect();
        let recs: Vec<_> = schedulers
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        stop.store(true, Ordering::SeqCst);
        advancer.join().unwrap();
        clock.advance(Duration::from_secs(1));
        for (runs, early, won) in &recs {
            assert!(!early.load(Ordering::SeqCst), "inline={inline}: early");
            assert_eq!(
                runs.load(Ordering::SeqCst),
                usize::from(!won),
                "inline={inline}"
            );
        }
        let s = timer.stats();
        assert_eq!(s.pending, 0, "{s:?}");
        assert_eq!(s.scheduled, s.fired + s.cancelled, "{s:?}");
        assert!(timer.shutdown().is_empty());
    }
}

/// A repeating timer on a ManualClock saturated at the far future: "a repeating
/// timer's runs stop there (it stays pending, and runs no more)"; advance returns.
#[test]
fn manual_repeating_stops_at_the_far_future_and_advance_returns() {
    let _serial = serial();
    for fixed_delay in [false, true] {
        let (clock, timer) = manual(2, true, Duration::from_millis(1));
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        let h = repeating(&timer, fixed_delay, Duration::from_secs(3600), move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        let c = clock.clone();
        if bounded(WAIT, move || c.advance(Duration::MAX)).is_none() {
            leak_and_fail(timer, "advance(MAX) with a repeating timer never returned");
        }
        let after = runs.load(Ordering::SeqCst);
        assert!(after >= 1);
        clock.advance(Duration::from_secs(7200));
        assert_eq!(runs.load(Ordering::SeqCst), after);
        assert_eq!(h.state(), TimerState::Pending);
        let unfired = timer.shutdown();
        assert_eq!(unfired.len(), 1);
    }
}

// ---------------------------------------------------------------------------------
// deadline() everywhere
// ---------------------------------------------------------------------------------

/// Guarantee 11: "deadline() is the instant asked for on TimerHandle, Unfired,
/// Callback and Sleep" - before the origin, odd nanoseconds, far (but reachable)
/// future; after reset_at too; on the system clock and a ManualClock.
#[test]
fn deadline_is_the_instant_asked_for_everywhere() {
    let _serial = serial();
    for use_manual in [false, true] {
        let clock = ManualClock::new();
        let spawned: Arc<Mutex<Vec<Callback>>> = Arc::default();
        let sp = spawned.clone();
        let mut b = builder(2).callbacks(Callbacks::spawn(move |c| sp.lock().unwrap().push(c)));
        if use_manual {
            b = b.clock(clock.clone());
        }
        let timer = b.build().unwrap();
        let now = timer.now();
        let asks = [
            now.checked_sub(Duration::from_secs(3600)).unwrap_or(now),
            now.checked_sub(Duration::from_nanos(1)).unwrap(),
            now + Duration::from_nanos(123_456_789),
            now + Duration::from_secs(100 * 365 * 86400) + Duration::from_nanos(7),
            now + Duration::from_secs(3600) + Duration::from_nanos(1),
        ];
        let mut handles = Vec::new();
        for &at in &asks {
            let h = timer.schedule_at(at, || {}).unwrap();
            assert_eq!(h.deadline(), at, "manual={use_manual}: handle");
            let s = timer.sleep_until(at);
            assert_eq!(s.deadline(), at, "manual={use_manual}: sleep");
            handles.push(h);
        }
        // reset_at moves deadline() exactly.
        let moved = now + Duration::from_secs(7200) + Duration::from_nanos(3);
        assert!(handles[4].reset_at(moved));
        assert_eq!(handles[4].deadline(), moved);
        let mut s = Box::pin(timer.sleep(Duration::from_secs(1)));
        s.as_mut().reset(moved.into());
        assert_eq!(s.deadline(), moved);
        // Callback::deadline for the due ones.
        if use_manual {
            clock.advance(Duration::from_nanos(123_456_789));
        }
        assert!(wait_until(WAIT, || spawned.lock().unwrap().len() >= 3));
        let mut seen: Vec<Instant> = spawned
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.deadline())
            .collect();
        seen.sort();
        assert_eq!(
            seen,
            asks[..3].to_vec(),
            "manual={use_manual}: Callback::deadline"
        );
        // Unfired::deadline for the rest.
        drop(s);
        let mut back: Vec<Instant> = timer.shutdown().iter().map(|u| u.deadline()).collect();
        back.sort();
        let mut want = vec![asks[3], moved];
        want.sort();
        assert_eq!(back, want, "manual={use_manual}: Unfired::deadline");
    }
}

// ---------------------------------------------------------------------------------
// Bursts larger than one turn's 1,024 timers
// ---------------------------------------------------------------------------------

/// Guarantee 13: "A turn takes at most 1,024 timers out of its wheel before it drains
/// its rings again, so ... a timer coming due is not queued behind the whole burst".
/// ManualClock, so "never early" is exact: 3,000 timers due at T whose callbacks move
/// the clock on (allowed from a callback), and 400 timers due during the burst.
#[test]
fn manual_burst_with_timers_coming_due_during_it_never_early_never_lost() {
    let _serial = serial();
    for inline in [true, false] {
        let (clock, timer) = manual(2, inline, Duration::from_millis(1));
        let start = clock.now();
        let t0 = start + Duration::from_millis(10);
        let early = Arc::new(AtomicUsize::new(0));
        let ran: Arc<Vec<AtomicUsize>> = Arc::new((0..3400).map(|_| AtomicUsize::new(0)).collect());
        let mut deadlines = Vec::new();
        for i in 0..3400usize {
            let at = if i < 3000 {
                t0
            } else {
                t0 + Duration::from_micros(50 * (i as u64 - 2999)) + Duration::from_nanos(i as u64)
            };
            deadlines.push(at);
            let (c, e, r) = (clock.clone(), early.clone(), ran.clone());
            timer
                .schedule_at(at, move || {
                    if c.now() < at {
                        e.fetch_add(1, Ordering::SeqCst);
                    }
                    r[i].fetch_add(1, Ordering::SeqCst);
                    if i < 3000 && i % 10 == 0 {
                        c.advance(Duration::from_micros(7));
                    }
                })
                .unwrap();
        }
        clock.advance(Duration::from_millis(10));
        clock.advance(Duration::ZERO);
        let now = clock.now();
        assert_eq!(early.load(Ordering::SeqCst), 0, "inline={inline}: early");
        for (i, at) in deadlines.iter().enumerate() {
            let want = usize::from(*at <= now);
            assert_eq!(
                ran[i].load(Ordering::SeqCst),
                want,
                "inline={inline}: timer {i} at +{:?}, now +{:?}",
                *at - start,
                now - start
            );
        }
        clock.advance(Duration::from_secs(1));
        assert!(ran.iter().all(|r| r.load(Ordering::SeqCst) == 1));
        assert!(timer.shutdown().is_empty());
    }
}

/// System clock: 5,000 timers due together, with 40 later timers due 1..40 ms after:
/// none early, none late by anything like a wheel rotation.
#[test]
fn system_burst_later_timers_not_late_by_a_rotation() {
    let _serial = serial();
    for inline in [true, false] {
        let timer = if inline {
            inline_timer(2)
        } else {
            pool_timer(2)
        };
        let t0 = Instant::now() + Duration::from_millis(30);
        let late: Arc<Mutex<Vec<(usize, Duration)>>> = Arc::default();
        let early = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        for i in 0..5040usize {
            let at = if i < 5000 {
                t0
            } else {
                t0 + Duration::from_millis(i as u64 - 4999)
            };
            let (l, e, d) = (late.clone(), early.clone(), done.clone());
            timer
                .schedule_at(at, move || {
                    let now = Instant::now();
                    if now < at {
                        e.fetch_add(1, Ordering::SeqCst);
                    }
                    if i >= 5000 {
                        l.lock().unwrap().push((i, now - at));
                    }
                    d.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
        }
        assert!(wait_until(WAIT, || done.load(Ordering::SeqCst) == 5040));
        assert_eq!(early.load(Ordering::SeqCst), 0);
        let worst = late.lock().unwrap().iter().map(|(_, d)| *d).max().unwrap();
        assert!(
            worst < Duration::from_millis(60),
            "inline={inline}: a later timer was {worst:?} late: {:?}",
            late.lock().unwrap()
        );
        assert!(timer.shutdown().is_empty());
    }
}

/// Cancel racing a burst of 4,000: a true cancel never runs, a false one runs exactly
/// once, and the stats agree.
#[test]
fn cancel_racing_a_burst() {
    let _serial = serial();
    for inline in [true, false] {
        let timer = if inline {
            inline_timer(2)
        } else {
            pool_timer(2)
        };
        let t0 = Instant::now() + Duration::from_millis(20);
        let runs: Arc<Vec<AtomicUsize>> =
            Arc::new((0..4000).map(|_| AtomicUsize::new(0)).collect());
        let handles: Vec<TimerHandle> = (0..4000)
            .map(|i| {
                let r = runs.clone();
                timer
                    .schedule_at(t0, move || {
                        r[i].fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap()
            })
            .collect();
        while Instant::now() < t0 {
            std::hint::spin_loop();
        }
        let won: Vec<bool> = handles.iter().map(|h| h.cancel()).collect();
        let lost = won.iter().filter(|w| !**w).count();
        // "Fired" is handed to the pool, not finished: wait for the runs too.
        assert!(wait_until(WAIT, || {
            let s = timer.stats();
            s.pending == 0
                && s.in_rings == 0
                && runs.iter().map(|r| r.load(Ordering::SeqCst)).sum::<usize>() >= lost
        }));
        let mut n_won = 0;
        for (i, w) in won.iter().enumerate() {
            n_won += usize::from(*w);
            assert_eq!(
                runs[i].load(Ordering::SeqCst),
                usize::from(!w),
                "inline={inline}: timer {i}"
            );
        }
        let s = timer.stats();
        assert_eq!(s.cancelled as usize, n_won, "{s:?}");
        assert_eq!(s.fired as usize, 4000 - n_won, "{s:?}");
        assert!(timer.shutdown().is_empty());
    }
}

// ---------------------------------------------------------------------------------
// Memory coming back (the entry pool)
// ---------------------------------------------------------------------------------

/// "A freed entry's memory is reused by the thread that allocated it, and a 32 KiB
/// chunk all of whose entries are gone is kept as a spare (one per size class and
/// thread), in the process's cache (up to 32 MiB), or returned to the allocator".
/// 50,000 timers of a small capture fire (74 chunks of 48-byte entries), then 50,000
/// of a large one (343 chunks of 224-byte entries), then again, for several cycles.
///
/// What may stay live between cycles is the pool's chunks (in use, spare or cached):
/// at most the two phases' working sets together, 417 chunks (13.7 MB), however many
/// cycles run (`AUDIT_CYCLES`), since each phase reuses what the last one gave back.
/// A pool that leaked a phase's chunks, or never took them back from the cache, would
/// pass that within two cycles. Everything else (rings, queues, vectors) comes back
/// to within 1 MiB of where it started. The cache is why the chunks' figure is not
/// near zero: which chunks a phase finds spare, cached or still out depends on when
/// the shards' frees land, so it moves between runs (0-5.3 MB above the start here).
#[test]
fn entry_pool_memory_comes_back_when_switching_capture_sizes() {
    let _serial = serial();
    let timer = pool_timer(2);
    let fired = Arc::new(AtomicUsize::new(0));
    let mut expected = 0usize;
    let phase = |big: bool, expected: &mut usize| {
        for i in 0..50_000usize {
            let f = fired.clone();
            if big {
                let pad = [i as u8; 180];
                timer
                    .schedule(Duration::ZERO, move || {
                        std::hint::black_box(&pad);
                        f.fetch_add(1, Ordering::Relaxed);
                    })
                    .unwrap();
            } else {
                timer
                    .schedule(Duration::ZERO, move || {
                        f.fetch_add(1, Ordering::Relaxed);
                    })
                    .unwrap();
            }
        }
        *expected += 50_000;
        assert!(wait_until(WAIT, || fired.load(Ordering::SeqCst) == *expected));
        assert!(wait_until(WAIT, || timer.stats().pending == 0));
        // One more timer of the other class: the owner collects what came back.
        let other = timer
            .schedule(Duration::from_secs(3600), move || {
                std::hint::black_box(big).then_some(()).map_or((), |_| ())
            })
            .unwrap();
        assert!(other.cancel());
    };
    // Warm up both classes once, then measure.
    phase(false, &mut expected);
    phase(true, &mut expected);
    thread::sleep(Duration::from_millis(20));
    let base = live_bytes();
    let chunk_base = chunk_bytes();
    let mut chunk_peaks = Vec::new();
    let mut peaks = Vec::new();
    let cycles: usize = std::env::var("AUDIT_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    for _ in 0..cycles {
        phase(false, &mut expected);
        phase(true, &mut expected);
        thread::sleep(Duration::from_millis(20));
        peaks.push(live_bytes() - base);
        chunk_peaks.push(chunk_bytes() - chunk_base);
    }
    phase(false, &mut expected);
    thread::sleep(Duration::from_millis(20));
    let after_switch = live_bytes() - base;
    eprintln!(
        "peaks {peaks:?} chunk_peaks {chunk_peaks:?} chunk_base {chunk_base} after_switch {after_switch} fired {}",
        fired.load(Ordering::SeqCst)
    );
    // The two working sets, 74 + 343 chunks, and room for one spare chunk per class.
    let most_chunks = ((74 + 343 + 16) * (32 << 10)) as isize;
    for (k, (p, c)) in peaks.iter().zip(&chunk_peaks).enumerate() {
        assert!(
            chunk_base + c <= most_chunks,
            "cycle {k}: {} bytes of chunks live, more than two phases' working sets",
            chunk_base + c
        );
        assert!(
            p - c < 1 << 20,
            "cycle {k}: {} bytes outside chunks more live than at the start",
            p - c
        );
    }
    assert!(
        chunk_bytes() <= most_chunks,
        "after switching back: {} bytes of chunks live",
        chunk_bytes()
    );
    assert!(timer.shutdown().is_empty());
}

/// A thread that scheduled 50,000 timers exits; its timers fire; the next thread's
/// timers reuse the memory ("a thread's pool passes to the next thread after it exits").
#[test]
fn entry_pool_of_an_exited_thread_is_not_leaked() {
    let _serial = serial();
    let timer = pool_timer(2);
    let fired = Arc::new(AtomicUsize::new(0));
    let mut expected = 0;
    let mut deltas = Vec::new();
    let base = live_bytes();
    let threads: usize = std::env::var("AUDIT_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
        .max(4);
    for _ in 0..threads {
        let t = timer.clone();
        let f = fired.clone();
        thread::spawn(move || {
            for _ in 0..50_000 {
                let f = f.clone();
                t.schedule(Duration::ZERO, move || {
                    f.fetch_add(1, Ordering::Relaxed);
                })
                .unwrap();
            }
        })
        .join()
        .unwrap();
        expected += 50_000;
        assert!(wait_until(WAIT, || fired.load(Ordering::SeqCst) == expected));
        thread::sleep(Duration::from_millis(20));
        deltas.push(live_bytes() - base);
    }
    // Each thread's 50,000 entries are ~3 MB; if exited pools leaked, it grows by that.
    eprintln!("exited-thread deltas {deltas:?}");
    let growth = deltas[deltas.len() - 1] - deltas[0];
    assert!(
        growth < 2 << 20,
        "live bytes grew by {growth} over 3 exited threads: {deltas:?}"
    );
    assert!(timer.shutdown().is_empty());
}

// ---------------------------------------------------------------------------------
// Hostile closures
// ---------------------------------------------------------------------------------

struct PanicOnDrop(Arc<AtomicUsize>);
impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
        if !thread::panicking() {
            panic!("hostile capture drop");
        }
    }
}

/// TimerHandle::cancel "# Panics: Only if the callback's destructor panics (the panic
/// propagates, after the cancel has fully taken effect)"; a fired callback whose
/// capture's drop panics (on the pool, inline, on a spawner's thread) does not kill the
/// service; an `Unfired` whose drop panics.
#[test]
fn capture_whose_drop_panics() {
    let _serial = serial();
    for mode in 0..2 {
        let timer = if mode == 0 {
            pool_timer(2)
        } else {
            inline_timer(2)
        };
        let drops = Arc::new(AtomicUsize::new(0));
        // Cancelled.
        let cap = PanicOnDrop(drops.clone());
        let h = timer
            .schedule(Duration::from_secs(3600), move || drop(cap))
            .unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| h.cancel()));
        assert!(r.is_err(), "the destructor's panic propagates");
        assert_eq!(h.state(), TimerState::Cancelled);
        assert!(
            wait_until(WAIT, || timer.stats().pending == 0),
            "{:?}",
            timer.stats()
        );
        // Fired: run, then dropped on the service's thread (the closure moves `cap`
        // in but does not consume it).
        for _ in 0..4 {
            let cap = PanicOnDrop(drops.clone());
            timer
                .schedule(Duration::ZERO, move || {
                    let _ = &cap;
                })
                .unwrap();
        }
        assert!(
            wait_until(WAIT, || drops.load(Ordering::SeqCst) == 5),
            "mode {mode}: drops {}",
            drops.load(Ordering::SeqCst)
        );
        let ok = Arc::new(AtomicBool::new(false));
        let o = ok.clone();
        timer
            .schedule(Duration::from_millis(1), move || {
                o.store(true, Ordering::SeqCst)
            })
            .unwrap();
        assert!(
            wait_until(WAIT, || ok.load(Ordering::SeqCst)),
            "mode {mode}: the service died"
        );
        // Handed back, dropped by the user one by one.
        for _ in 0..2 {
            let cap = PanicOnDrop(drops.clone());
            timer
                .schedule(Duration::from_secs(3600), move || drop(cap))
                .unwrap();
        }
        let t = timer.clone();
        let Some(unfired) = bounded(WAIT, move || t.shutdown()) else {
            leak_and_fail(timer, "shutdown hung");
        };
        assert_eq!(unfired.len(), 2);
        for u in unfired {
            assert!(catch_unwind(AssertUnwindSafe(move || drop(u))).is_err());
        }
        assert_eq!(drops.load(Ordering::SeqCst), 7);
        assert_eq!(timer.stats().pending, 0);
    }
}

/// Dropping the last clone with pending callbacks whose captures panic on drop:
/// "drops the pending callbacks unrun" - must not hang or abort.
#[test]
fn last_clone_dropped_with_pending_panicking_captures() {
    let _serial = serial();
    for mode in 0..2 {
        let timer = if mode == 0 {
            pool_timer(2)
        } else {
            inline_timer(2)
        };
        let drops = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 {
            let cap = PanicOnDrop(drops.clone());
            timer
                .schedule(Duration::from_secs(3600), move || drop(cap))
                .unwrap();
        }
        let r = bounded(WAIT, move || {
            catch_unwind(AssertUnwindSafe(move || drop(timer))).is_err()
        });
        assert!(r.is_some(), "mode {mode}: dropping the last clone hung");
        assert_eq!(drops.load(Ordering::SeqCst), 3, "mode {mode}");
    }
}

/// A capture whose drop calls `shutdown` (holding a clone), or drops the last clone of
/// the service, dropped (a) by a winning cancel on the user's thread, (b) after its
/// run on the pool / the shard thread.
#[test]
fn capture_whose_drop_shuts_down_or_drops_the_last_clone() {
    let _serial = serial();
    struct Hostile {
        timer: Option<ShardedTimer>,
        shutdown: bool,
        done: Arc<AtomicBool>,
    }
    impl Drop for Hostile {
        fn drop(&mut self) {
            if let Some(t) = self.timer.take() {
                if self.shutdown {
                    let _ = t.shutdown();
                }
                drop(t);
            }
            self.done.store(true, Ordering::SeqCst);
        }
    }
    for mode in 0..2 {
        for shutdown in [true, false] {
            for by_cancel in [true, false] {
                let timer = if mode == 0 {
                    pool_timer(2)
                } else {
                    inline_timer(2)
                };
                let done = Arc::new(AtomicBool::new(false));
                let cap = Hostile {
                    timer: Some(timer.clone()),
                    shutdown,
                    done: done.clone(),
                };
                let delay = if by_cancel {
                    Duration::from_secs(3600)
                } else {
                    Duration::ZERO
                };
                let h = timer
                    .schedule(delay, move || {
                        let _ = &cap;
                    })
                    .unwrap();
                // Only the capture holds the service now (when !shutdown).
                let keep = if shutdown {
                    Some(timer)
                } else {
                    drop(timer);
                    None
                };
                let d = done.clone();
                let ok = bounded(WAIT, move || {
                    if by_cancel {
                        assert!(h.cancel());
                    }
                    wait_until(WAIT, || d.load(Ordering::SeqCst))
                });
                assert_eq!(
                    ok,
                    Some(true),
                    "mode {mode} shutdown {shutdown} by_cancel {by_cancel}: hung"
                );
                if let Some(t) = keep {
                    let left = bounded(WAIT, move || t.shutdown().len());
                    assert_eq!(left, Some(0));
                }
            }
        }
    }
}

/// Guarantee 5: a callback that calls cancel and reset on its own handle (false, false:
/// it has fired; it runs once) and shutdown (callbacks fired with it still run).
#[test]
fn callback_resets_cancels_and_shuts_down_its_own_service() {
    let _serial = serial();
    for mode in 0..2 {
        let timer = if mode == 0 {
            pool_timer(2)
        } else {
            inline_timer(2)
        };
        let me: Arc<OnceLock<TimerHandle>> = Arc::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(None));
        let (m, r, s) = (me.clone(), runs.clone(), seen.clone());
        let h = timer
            .schedule(Duration::from_millis(5), move || {
                r.fetch_add(1, Ordering::SeqCst);
                let h = m.get().unwrap();
                *s.lock().unwrap() = Some((
                    h.reset(Duration::ZERO),
                    h.reset(Duration::from_millis(1)),
                    h.cancel(),
                ));
            })
            .unwrap();
        let _ = me.set(h);
        assert!(wait_until(WAIT, || seen.lock().unwrap().is_some()));
        thread::sleep(Duration::from_millis(10));
        assert_eq!(*seen.lock().unwrap(), Some((false, false, false)));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // Shutdown from inside, with 50 timers due in the same tick behind it.
        let ran = Arc::new(AtomicUsize::new(0));
        let returned = Arc::new(Mutex::new(None));
        let at = Instant::now() + Duration::from_millis(5);
        let (t, ret) = (timer.clone(), returned.clone());
        timer
            .schedule_at(at, move || {
                *ret.lock().unwrap() = Some(t.shutdown().len());
            })
            .unwrap();
        for _ in 0..50 {
            let r = ran.clone();
            timer
                .schedule_at(at, move || {
                    r.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
        }
        let far = timer.schedule(Duration::from_secs(3600), || {}).unwrap();
        if !wait_until(WAIT, || returned.lock().unwrap().is_some()) {
            leak_and_fail(timer, "shutdown from a callback hung");
        }
        let back = returned.lock().unwrap().unwrap();
        // Either a sibling fired (ran) or came back; nothing lost, the far one came back.
        assert_eq!(
            ran.load(Ordering::SeqCst) + back - 1,
            50,
            "mode {mode}: ran {} back {back}",
            ran.load(Ordering::SeqCst)
        );
        assert_eq!(far.state(), TimerState::Cancelled);
        assert_eq!(timer.stats().pending, 0);
    }
}
