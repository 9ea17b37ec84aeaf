//! Audit: a `Sleep`, `Timeout` or `Interval` keeps its service running after every
//! `ShardedTimer` clone is gone, and the service shuts down (its named threads exit)
//! exactly when its last clone and its last such future are gone; an explicit
//! `shutdown` refuses the futures still alive. Written from the public docs only.
//!
//! Each test names its service's threads with a prefix of its own (`hNN`), so the
//! tests may run side by side and still count exactly their own threads.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use sharded_timer::{Callbacks, ManualClock, ScheduleError, ShardedTimer, Sleep};
use support::{wait_until, within, DropCounter};

/// Bound on every wait in this file.
const BOUND: Duration = Duration::from_secs(5);

/// Threads of this process whose name starts with `{prefix}-`.
fn named_threads(prefix: &str) -> usize {
    let pattern = format!("{prefix}-");
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task (Linux)")
        .filter_map(Result::ok)
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .map(|comm| comm.starts_with(&pattern))
                .unwrap_or(false)
        })
        .count()
}

/// Waits (bounded) until the service named `prefix` has `n` threads; panics otherwise.
fn expect_threads(prefix: &str, n: usize, what: &str) {
    assert!(
        wait_until(BOUND, || named_threads(prefix) == n),
        "{what}: expected {n} `{prefix}-*` threads within {BOUND:?}, saw {}",
        named_threads(prefix)
    );
}

/// Asserts the service named `prefix` still has all `n` threads, now and after a
/// short settle (a shutdown in progress would show within it).
fn expect_still_running(prefix: &str, n: usize, what: &str) {
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        named_threads(prefix),
        n,
        "{what}: the service must still run"
    );
}

fn service(prefix: &str, callbacks: Callbacks, shards: usize) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(shards)
        .callbacks(callbacks)
        .pin_cores(false)
        .thread_name(prefix)
        .build()
        .expect("the service builds")
}

/// 2 shards + 1 pool worker = 3 threads.
fn pool_service(prefix: &str) -> ShardedTimer {
    let timer = service(prefix, Callbacks::pool(1), 2);
    expect_threads(prefix, 3, "after build");
    timer
}

/// 2 shards, inline callbacks = 2 threads.
fn inline_service(prefix: &str) -> ShardedTimer {
    let timer = service(prefix, Callbacks::inline(), 2);
    expect_threads(prefix, 2, "after build");
    timer
}

/// Wakes by unparking the thread that blocks on the future.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `fut` to completion on this thread, for at most `bound`; `None` if it hung.
fn block_on_within<F: Future + Unpin>(fut: &mut F, bound: Duration) -> Option<F::Output> {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let start = Instant::now();
    loop {
        if let Poll::Ready(out) = Pin::new(&mut *fut).poll(&mut cx) {
            return Some(out);
        }
        let spent = start.elapsed();
        if spent > bound {
            return None;
        }
        std::thread::park_timeout(bound - spent);
    }
}

/// One poll with a waker that does nothing.
fn poll_once<F: Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    Pin::new(fut).poll(&mut Context::from_waker(Waker::noop()))
}

/// Awaits `sleep` (bounded) and asserts it completed by its deadline passing, not by
/// a refusal, and not before its deadline.
fn expect_fires_on_time(sleep: &mut Sleep, what: &str) {
    let deadline = sleep.deadline();
    assert!(
        block_on_within(sleep, BOUND).is_some(),
        "{what}: the sleep did not complete within {BOUND:?}"
    );
    let now = Instant::now();
    assert_eq!(sleep.refused(), None, "{what}: refused though still alive");
    assert!(sleep.is_elapsed(), "{what}: completed but not elapsed");
    assert!(now >= deadline, "{what}: completed early");
    // On time: within a generous bound for a shared 2-core machine.
    assert!(
        now - deadline < Duration::from_secs(1),
        "{what}: {:?} late",
        now - deadline
    );
}

#[test]
fn a_sleep_keeps_the_service_running_after_every_clone_is_dropped() {
    let p = "h01";
    let timer = pool_service(p);
    let copy = timer.clone();
    let mut sleep = timer.sleep(Duration::from_millis(60));
    drop(timer);
    drop(copy);
    expect_still_running(p, 3, "a sleep is alive");
    expect_fires_on_time(&mut sleep, "after the clones were dropped");
    // Completed, but still alive: the service still runs (reset may re-arm it).
    expect_still_running(p, 3, "a completed sleep is alive");
    drop(sleep);
    expect_threads(p, 0, "last clone and last sleep gone");
}

#[test]
fn a_sleep_reset_after_the_clones_are_gone_rearms_and_fires() {
    let p = "h02";
    let timer = inline_service(p);
    let mut sleep = timer.sleep(Duration::from_millis(5));
    drop(timer);
    expect_fires_on_time(&mut sleep, "first deadline");
    // Completed: re-armed with a new timer.
    Pin::new(&mut sleep).reset((Instant::now() + Duration::from_millis(20)).into());
    assert!(!sleep.is_elapsed());
    expect_fires_on_time(&mut sleep, "after reset of a completed sleep");
    // Pending: moved in place, then the far one moved near.
    Pin::new(&mut sleep).reset((Instant::now() + Duration::from_secs(60)).into());
    assert!(poll_once(&mut sleep).is_pending());
    Pin::new(&mut sleep).reset((Instant::now() + Duration::from_millis(10)).into());
    expect_fires_on_time(&mut sleep, "after reset of a pending sleep");
    expect_still_running(p, 2, "the sleep is alive");
    drop(sleep);
    expect_threads(p, 0, "last sleep gone");
}

#[test]
fn a_timeout_never_polled_keeps_the_service_and_arms_after_the_clones_are_gone() {
    let p = "h03";
    let timer = pool_service(p);
    let made = Instant::now();
    let mut timeout = timer.timeout(Duration::from_millis(30), std::future::pending::<()>());
    drop(timer);
    expect_still_running(p, 3, "an unpolled timeout is alive");
    let out = block_on_within(&mut timeout, BOUND).expect("the timeout completes");
    let elapsed = out.expect_err("a pending future times out");
    assert_eq!(elapsed.refused(), None, "refused though alive: {elapsed:?}");
    assert!(made.elapsed() >= Duration::from_millis(30), "early");
    drop(timeout);
    expect_threads(p, 0, "last timeout gone");
}

#[test]
fn a_timeout_at_never_polled_then_dropped_shuts_the_service_down() {
    let p = "h04";
    let timer = inline_service(p);
    let timeout = timer.timeout_at(
        Instant::now() + Duration::from_secs(60),
        std::future::pending::<()>(),
    );
    drop(timer);
    expect_still_running(p, 2, "an unpolled timeout is alive");
    drop(timeout);
    expect_threads(p, 0, "never-polled timeout was the last user");
}

#[test]
fn an_interval_keeps_ticking_after_the_clones_are_gone() {
    let p = "h05";
    let timer = pool_service(p);
    let mut interval = timer.interval(Duration::from_millis(10));
    drop(timer);
    let mut ticks = Vec::new();
    for _ in 0..5 {
        let mut tick = Box::pin(interval.tick());
        let due = block_on_within(&mut tick, BOUND).expect("a tick within the bound");
        assert!(Instant::now() >= due, "a tick completed before it was due");
        ticks.push(due);
    }
    assert!(!interval.is_shut_down(), "refused though alive");
    for pair in ticks.windows(2) {
        assert!(pair[1] > pair[0], "ticks move forward: {ticks:?}");
    }
    interval.reset_after(Duration::from_millis(5));
    let mut tick = Box::pin(interval.tick());
    assert!(block_on_within(&mut tick, BOUND).is_some());
    drop(tick);
    assert!(!interval.is_shut_down());
    expect_still_running(p, 3, "the interval is alive");
    drop(interval);
    expect_threads(p, 0, "last interval gone");
}

#[test]
fn a_manual_clock_sleep_fires_on_advance_after_the_clones_are_gone() {
    let p = "h06";
    let clock = ManualClock::new();
    let timer = ShardedTimer::builder()
        .shards(2)
        .executor_threads(1)
        .pin_cores(false)
        .thread_name(p)
        .clock(clock.clone())
        .build()
        .unwrap();
    expect_threads(p, 3, "after build");
    let mut sleep = timer.sleep(Duration::from_secs(30));
    let mut timeout = timer.timeout(Duration::from_secs(40), std::future::pending::<()>());
    assert!(poll_once(&mut timeout).is_pending());
    let start = clock.now();
    drop(timer);
    assert!(poll_once(&mut sleep).is_pending());
    // The clock still drives the service: it reports the sleep's timer.
    let next = clock.next_deadline().expect("the sleep's timer is pending");
    assert!(next <= start + Duration::from_secs(30));
    clock.advance(Duration::from_secs(29));
    assert!(poll_once(&mut sleep).is_pending(), "never early");
    clock.advance(Duration::from_secs(1));
    assert!(poll_once(&mut sleep).is_ready(), "due at 30 s");
    assert!(sleep.is_elapsed());
    assert_eq!(sleep.refused(), None);
    clock.advance(Duration::from_secs(10));
    match poll_once(&mut timeout) {
        Poll::Ready(Err(e)) => assert_eq!(e.refused(), None, "refused though alive"),
        other => panic!("the timeout is due at 40 s: {other:?}"),
    }
    drop(sleep);
    expect_still_running(p, 3, "the timeout is alive");
    drop(timeout);
    expect_threads(p, 0, "last future gone");
    assert_eq!(
        clock.next_deadline(),
        None,
        "a shut-down service reports nothing"
    );
    // A shut-down service holds no advance up.
    let c = clock.clone();
    assert!(
        within(BOUND, move || c.advance(Duration::from_secs(1))).is_some(),
        "advance hung after the service shut down"
    );
}

#[test]
fn a_pending_callback_still_fires_while_a_sleep_keeps_the_service_then_drops_unrun() {
    let p = "h07";
    let timer = pool_service(p);
    let fired = Arc::new(AtomicBool::new(false));
    let f = fired.clone();
    timer
        .schedule(Duration::from_millis(20), move || {
            f.store(true, Ordering::SeqCst)
        })
        .unwrap();
    let never = DropCounter::default();
    let token = never.token();
    timer
        .schedule(Duration::from_secs(60), move || drop(token))
        .unwrap();
    let sleep = timer.sleep(Duration::from_secs(60));
    drop(timer);
    assert!(
        wait_until(BOUND, || fired.load(Ordering::SeqCst)),
        "a callback due while a sleep keeps the service did not fire"
    );
    assert_eq!(
        never.dropped(),
        0,
        "the far callback dropped while the service runs"
    );
    drop(sleep);
    expect_threads(p, 0, "last sleep gone");
    assert_eq!(
        never.dropped(),
        1,
        "the far callback is dropped unrun at shutdown"
    );
}

/// The last sleep is dropped by a callback of its own service, on a pool worker or
/// on a shard thread: the service shuts down from inside itself and every thread exits.
fn last_sleep_dropped_inside_a_callback(p: &str, timer: ShardedTimer) {
    let slot = Arc::new(Mutex::new(Some(timer.sleep(Duration::from_secs(60)))));
    let returned = Arc::new(AtomicBool::new(false));
    let (s, r) = (slot.clone(), returned.clone());
    timer
        .schedule(Duration::from_millis(20), move || {
            let sleep = s.lock().unwrap().take();
            drop(sleep);
            r.store(true, Ordering::SeqCst);
        })
        .unwrap();
    drop(slot);
    drop(timer);
    assert!(
        wait_until(BOUND, || returned.load(Ordering::SeqCst)),
        "the callback that drops the last sleep did not return"
    );
    expect_threads(p, 0, "the last sleep was dropped in a callback");
}

#[test]
fn the_last_sleep_dropped_inside_a_pool_callback_shuts_the_service_down() {
    let p = "h08";
    last_sleep_dropped_inside_a_callback(p, pool_service(p));
}

#[test]
fn the_last_sleep_dropped_inside_an_inline_callback_shuts_the_service_down() {
    let p = "h09";
    last_sleep_dropped_inside_a_callback(p, inline_service(p));
}

/// A task that owns its sleep: its waker is the only owner once the test lets go,
/// so the wake that the sleep's own timer makes drops the sleep.
struct OwnsSleep {
    sleep: Mutex<Option<Sleep>>,
    woken: Arc<AtomicUsize>,
    _token: support::DropToken,
}

impl Wake for OwnsSleep {
    fn wake(self: Arc<Self>) {
        self.woken.fetch_add(1, Ordering::SeqCst);
    }
}

fn last_sleep_dropped_by_its_own_waker(p: &str, timer: ShardedTimer) {
    let dropped = DropCounter::default();
    let woken = Arc::new(AtomicUsize::new(0));
    let task = Arc::new(OwnsSleep {
        sleep: Mutex::new(Some(timer.sleep(Duration::from_millis(20)))),
        woken: woken.clone(),
        _token: dropped.token(),
    });
    let waker = Waker::from(task.clone());
    {
        let mut guard = task.sleep.lock().unwrap();
        let sleep = guard.as_mut().unwrap();
        assert!(Pin::new(sleep)
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
    }
    drop(waker);
    drop(task);
    drop(timer);
    assert!(
        wait_until(BOUND, || woken.load(Ordering::SeqCst) == 1),
        "the sleep's timer woke its task {} times",
        woken.load(Ordering::SeqCst)
    );
    assert!(
        wait_until(BOUND, || dropped.dropped() == 1),
        "the task (and its sleep) was not dropped after the wake"
    );
    expect_threads(p, 0, "the last sleep was dropped by its waker's drop");
}

#[test]
fn the_last_sleep_dropped_by_its_own_waker_on_a_pool_worker_shuts_down() {
    let p = "h10";
    last_sleep_dropped_by_its_own_waker(p, pool_service(p));
}

#[test]
fn the_last_sleep_dropped_by_its_own_waker_on_a_shard_thread_shuts_down() {
    let p = "h11";
    last_sleep_dropped_by_its_own_waker(p, inline_service(p));
}

#[test]
fn the_last_clone_dropped_inside_a_callback_leaves_a_live_sleep_working() {
    for (p, timer) in [("h12", pool_service("h12")), ("h13", inline_service("h13"))] {
        let threads = named_threads(p);
        let mut sleep = timer.sleep(Duration::from_millis(80));
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let holder = timer.clone();
        timer
            .schedule(Duration::from_millis(5), move || {
                drop(holder);
                r.store(true, Ordering::SeqCst);
            })
            .unwrap();
        drop(timer);
        assert!(wait_until(BOUND, || ran.load(Ordering::SeqCst)));
        expect_still_running(p, threads, "the last clone went in a callback");
        expect_fires_on_time(&mut sleep, "after the last clone went in a callback");
        drop(sleep);
        expect_threads(p, 0, "last sleep gone");
    }
}

#[test]
fn a_callback_capturing_the_last_sleep_cancelled_from_outside_shuts_down() {
    let p = "h14";
    let timer = pool_service(p);
    let sleep = timer.sleep(Duration::from_secs(60));
    let handle = timer
        .schedule(Duration::from_secs(60), move || drop(sleep))
        .unwrap();
    drop(timer);
    expect_still_running(p, 3, "the captured sleep is alive");
    assert!(handle.cancel(), "the pending callback is cancelled");
    expect_threads(p, 0, "the cancel dropped the last sleep");
}

/// Pins the calling thread to core `k` of those available, if it can.
fn pin_to(k: usize) {
    if let Some(ids) = core_affinity::get_core_ids() {
        if !ids.is_empty() {
            let _ = core_affinity::set_for_current(ids[k % ids.len()]);
        }
    }
}

#[test]
fn sleeps_made_and_dropped_on_many_threads_while_the_last_clone_goes() {
    let p = "h15";
    for round in 0..15 {
        let timer = service(p, Callbacks::inline(), 2);
        expect_threads(p, 2, "after build");
        let mut workers = Vec::new();
        for k in 0..4 {
            let mine = timer.clone();
            workers.push(std::thread::spawn(move || {
                pin_to(k);
                // Some sleeps made and dropped around the drop of the clones.
                for _ in 0..50 {
                    drop(mine.sleep(Duration::from_millis(1)));
                }
                let mut sleep = mine.sleep(Duration::from_millis(3 + k as u64));
                let mut timeout =
                    mine.timeout(Duration::from_millis(4), std::future::pending::<()>());
                drop(mine);
                let deadline = sleep.deadline();
                let done = block_on_within(&mut sleep, BOUND);
                let timed_out = block_on_within(&mut timeout, BOUND);
                (
                    done.is_some(),
                    sleep.refused(),
                    sleep.is_elapsed(),
                    deadline,
                    timed_out,
                )
            }));
        }
        drop(timer);
        for (k, w) in workers.into_iter().enumerate() {
            let (done, refused, elapsed, deadline, timed_out) = w.join().unwrap();
            assert!(done, "round {round} thread {k}: the sleep hung");
            assert_eq!(refused, None, "round {round} thread {k}: sleep refused");
            assert!(elapsed && Instant::now() >= deadline);
            match timed_out {
                Some(Err(e)) => {
                    assert_eq!(
                        e.refused(),
                        None,
                        "round {round} thread {k}: timeout refused"
                    )
                }
                other => panic!("round {round} thread {k}: timeout {other:?}"),
            }
        }
        expect_threads(p, 0, "every clone and future gone");
    }
}

#[test]
fn a_sleep_moved_to_another_core_outlives_the_clones_and_shuts_down_there() {
    let p = "h16";
    let timer = pool_service(p);
    let maker = std::thread::spawn(move || {
        pin_to(0);
        let sleep = timer.sleep(Duration::from_millis(40));
        drop(timer); // the last clone goes on the maker's thread
        sleep
    });
    let mut sleep = maker.join().unwrap();
    expect_still_running(p, 3, "the moved sleep is alive");
    let waiter = std::thread::spawn(move || {
        pin_to(1);
        expect_fires_on_time(&mut sleep, "on another core");
        drop(sleep);
    });
    waiter.join().unwrap();
    expect_threads(p, 0, "the moved sleep was the last");
}

#[test]
fn services_kept_by_sleeps_and_dropped_in_a_loop_leave_no_threads() {
    let p = "h17";
    for i in 0..40 {
        let timer = service(p, Callbacks::pool(1), 1);
        let mut sleep = if i % 2 == 0 {
            timer.sleep(Duration::from_secs(60))
        } else {
            timer.try_sleep(Duration::from_secs(60)).unwrap()
        };
        assert!(poll_once(&mut sleep).is_pending());
        drop(timer);
        assert!(
            poll_once(&mut sleep).is_pending(),
            "service {i}: refused early"
        );
        assert_eq!(sleep.refused(), None);
        drop(sleep);
        expect_threads(p, 0, "loop");
    }
}

#[test]
fn explicit_shutdown_refuses_a_live_sleep_even_after_the_other_clones_are_gone() {
    let p = "h18";
    let timer = pool_service(p);
    let mut sleep = timer.sleep(Duration::from_secs(60));
    let mut interval = timer.interval(Duration::from_secs(60));
    let mut first = Box::pin(interval.tick());
    assert!(poll_once(&mut first).is_ready());
    drop(first);
    let last = timer.clone();
    drop(timer);
    assert!(poll_once(&mut sleep).is_pending());
    let unfired = last.shutdown();
    assert!(unfired.is_empty(), "a sleep's timer is not handed back");
    expect_threads(p, 0, "shutdown joins the threads");
    assert!(block_on_within(&mut sleep, BOUND).is_some());
    assert_eq!(sleep.refused(), Some(ScheduleError::Shutdown));
    assert!(!sleep.is_elapsed());
    // Re-armed after the shutdown: completes at once, refused.
    Pin::new(&mut sleep).reset((Instant::now() + Duration::from_secs(60)).into());
    assert!(poll_once(&mut sleep).is_ready());
    assert_eq!(sleep.refused(), Some(ScheduleError::Shutdown));
    let mut tick = Box::pin(interval.tick());
    assert!(block_on_within(&mut tick, BOUND).is_some());
    drop(tick);
    assert!(interval.is_shut_down());
    drop(last);
    drop(sleep);
    drop(interval);
    assert_eq!(named_threads(p), 0);
}

// ---- Aimed at the implementation (after reading src/home.rs, src/timer.rs,
// ---- src/timer/shutdown.rs): the service's last reference goes on its own threads.

/// Runs `f` on a new thread pinned to core `k`, so that the timers and sleeps it makes
/// go to that core's home and shard, and returns its result.
fn on_core<T: Send + 'static>(k: usize, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        pin_to(k);
        f()
    })
    .join()
    .unwrap()
}

/// A task owning `sleep`, polled once with its own waker, then let go: only the sleep's
/// timer holds it. Returns how often it was woken and whether it was dropped.
fn hand_sleep_to_its_waker(sleep: Sleep) -> (Arc<AtomicUsize>, DropCounter) {
    let dropped = DropCounter::default();
    let woken = Arc::new(AtomicUsize::new(0));
    let task = Arc::new(OwnsSleep {
        sleep: Mutex::new(Some(sleep)),
        woken: woken.clone(),
        _token: dropped.token(),
    });
    let waker = Waker::from(task.clone());
    {
        let mut guard = task.sleep.lock().unwrap();
        let sleep = guard.as_mut().unwrap();
        assert!(Pin::new(sleep)
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
    }
    (woken, dropped)
}

#[test]
fn the_last_sleep_dropped_by_its_waker_during_a_rescue_shuts_down() {
    let p = "h19";
    let timer = ShardedTimer::builder()
        .shards(2)
        .callbacks(Callbacks::inline())
        .tick(Duration::from_millis(1))
        .rescue_after(Some(Duration::from_millis(2)))
        .pin_cores(false)
        .thread_name(p)
        .build()
        .unwrap();
    expect_threads(p, 2, "after build");
    let blocked = Arc::new(AtomicBool::new(false));
    let released = Arc::new(AtomicBool::new(false));
    let (b, r) = (blocked.clone(), released.clone());
    let (woken, dropped) = on_core(0, move || {
        // Shard 0's thread is stuck in this callback from 5 ms to 305 ms...
        timer
            .schedule(Duration::from_millis(5), move || {
                b.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(300));
                r.store(true, Ordering::SeqCst);
            })
            .unwrap();
        // ...so shard 1 rescues this sleep's timer, due at 30 ms, and the wake drops
        // the last sleep on shard 1's thread, during the rescue.
        let sleep = timer.sleep(Duration::from_millis(30));
        hand_sleep_to_its_waker(sleep)
    });
    assert!(wait_until(BOUND, || woken.load(Ordering::SeqCst) == 1));
    assert!(blocked.load(Ordering::SeqCst));
    assert!(
        !released.load(Ordering::SeqCst),
        "the sleep was woken by a rescue, while its shard was stuck"
    );
    assert!(wait_until(BOUND, || dropped.dropped() == 1));
    expect_threads(p, 0, "the last sleep was dropped during a rescue");
}

#[test]
fn the_last_sleep_dropped_in_a_spawner_on_the_shard_thread_shuts_down() {
    let p = "h20";
    // The spawner drops every callback unrun, on the shard thread that fired it.
    let timer = service(p, Callbacks::spawn(drop), 2);
    expect_threads(p, 2, "after build");
    let sleep = timer.sleep(Duration::from_secs(60));
    let dropped = DropCounter::default();
    let token = dropped.token();
    timer
        .schedule(Duration::from_millis(10), move || {
            drop(sleep);
            drop(token);
        })
        .unwrap();
    drop(timer);
    assert!(wait_until(BOUND, || dropped.dropped() == 1));
    expect_threads(p, 0, "the last sleep was dropped in the spawner");
}

#[test]
fn the_last_sleep_run_by_a_spawner_on_the_shard_thread_shuts_down() {
    let p = "h21";
    let freed = DropCounter::default();
    let timer = service(p, counted_spawner(&freed), 2);
    expect_threads(p, 2, "after build");
    let (woken, dropped) = hand_sleep_to_its_waker(timer.sleep(Duration::from_millis(10)));
    drop(timer);
    assert!(wait_until(BOUND, || woken.load(Ordering::SeqCst) == 1));
    assert!(wait_until(BOUND, || dropped.dropped() == 1));
    expect_threads(p, 0, "the last sleep was dropped by a spawned wake");
    assert!(
        wait_until(BOUND, || freed.dropped() == 1),
        "the service was not freed"
    );
}

fn manual_service(
    p: &str,
    clock: &ManualClock,
    callbacks: Callbacks,
    threads: usize,
) -> ShardedTimer {
    let timer = ShardedTimer::builder()
        .shards(2)
        .callbacks(callbacks)
        .pin_cores(false)
        .thread_name(p)
        .clock(clock.clone())
        .build()
        .unwrap();
    expect_threads(p, threads, "after build");
    timer
}

fn manual_last_sleep_dropped_during_advance(p: &str, callbacks: Callbacks, threads: usize) {
    let clock = ManualClock::new();
    let timer = manual_service(p, &clock, callbacks, threads);
    // One last sleep dropped by a callback, the other by its own waker.
    let slot = Arc::new(Mutex::new(Some(timer.sleep(Duration::from_secs(60)))));
    let s = slot.clone();
    timer
        .schedule(Duration::from_secs(10), move || {
            drop(s.lock().unwrap().take())
        })
        .unwrap();
    drop(slot);
    let (woken, dropped) = hand_sleep_to_its_waker(timer.sleep(Duration::from_secs(10)));
    drop(timer);
    clock.advance(Duration::from_secs(9));
    expect_still_running(p, threads, "both sleeps alive");
    let c = clock.clone();
    assert!(
        within(BOUND, move || c.advance(Duration::from_secs(1))).is_some(),
        "advance hung while its callbacks shut the service down"
    );
    assert_eq!(woken.load(Ordering::SeqCst), 1);
    assert!(wait_until(BOUND, || dropped.dropped() == 1));
    expect_threads(p, 0, "both last sleeps dropped during advance");
    let c = clock.clone();
    assert!(within(BOUND, move || c.advance(Duration::from_secs(1))).is_some());
}

#[test]
fn manual_clock_last_sleeps_dropped_on_a_pool_during_advance_shut_down() {
    manual_last_sleep_dropped_during_advance("h22", Callbacks::pool(1), 3);
}

#[test]
fn manual_clock_last_sleeps_dropped_inline_during_advance_shut_down() {
    manual_last_sleep_dropped_during_advance("h23", Callbacks::inline(), 2);
}

/// A repeating timer whose closure holds the last sleep cancels itself during its
/// third run: its runner drops the closure (and the sleep) when the run returns, on
/// the service's own thread, outside any callback.
fn repeating_capture_holds_the_last_sleep(p: &str, timer: ShardedTimer) {
    let sleep = timer.sleep(Duration::from_secs(60));
    let me: Arc<Mutex<Option<sharded_timer::TimerHandle>>> = Arc::new(Mutex::new(None));
    let runs = Arc::new(AtomicUsize::new(0));
    let dropped = DropCounter::default();
    let (m, r, token) = (me.clone(), runs.clone(), dropped.token());
    let handle = timer
        .schedule_repeating(Duration::from_millis(5), move || {
            let _keep = (&sleep, &token);
            if r.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
                let handle = m
                    .lock()
                    .unwrap()
                    .take()
                    .expect("stored before the first run");
                assert!(handle.cancel(), "cancels its own pending repeating timer");
            }
        })
        .unwrap();
    *me.lock().unwrap() = Some(handle);
    drop(timer);
    assert!(
        wait_until(BOUND, || dropped.dropped() == 1),
        "runs: {runs:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    expect_threads(p, 0, "the runner dropped the last sleep");
}

#[test]
fn a_repeating_closure_holding_the_last_sleep_cancelled_in_its_run_on_a_pool() {
    let p = "h24";
    repeating_capture_holds_the_last_sleep(p, pool_service(p));
}

#[test]
fn a_repeating_closure_holding_the_last_sleep_cancelled_in_its_run_inline() {
    let p = "h25";
    repeating_capture_holds_the_last_sleep(p, inline_service(p));
}

/// A spawner that runs each callback here and counts its own drop: the service's
/// threads and state let it go once the service has stopped, so a count of 1 says
/// nothing kept the spawner (nor a cycle through it).
fn counted_spawner(freed: &DropCounter) -> Callbacks {
    let token = freed.token();
    Callbacks::spawn(move |callback| {
        let _owner = &token;
        callback.run();
    })
}

#[test]
fn a_service_kept_by_a_sleep_is_freed_once_the_sleep_goes() {
    let p = "h26";
    let freed = DropCounter::default();
    let timer = service(p, counted_spawner(&freed), 2);
    let mut sleep = timer.sleep(Duration::from_millis(10));
    drop(timer);
    expect_fires_on_time(&mut sleep, "spawned wake");
    expect_still_running(p, 2, "the sleep is alive");
    assert_eq!(freed.dropped(), 0, "freed while a sleep keeps it");
    drop(sleep);
    expect_threads(p, 0, "last sleep gone");
    assert!(
        wait_until(BOUND, || freed.dropped() == 1),
        "the service's state was not freed (spawner drops: {})",
        freed.dropped()
    );
}

#[test]
fn the_last_clone_and_the_last_sleep_dropped_at_once_on_two_threads() {
    let p = "h27";
    for round in 0..150 {
        let freed = DropCounter::default();
        let timer = service(p, counted_spawner(&freed), 1);
        let sleep = if round % 2 == 0 {
            timer.sleep(Duration::from_secs(60))
        } else {
            timer.sleep(Duration::from_micros(200))
        };
        let start = Arc::new(std::sync::Barrier::new(2));
        let s2 = start.clone();
        let a = std::thread::spawn(move || {
            pin_to(0);
            s2.wait();
            drop(timer);
        });
        let b = std::thread::spawn(move || {
            pin_to(1);
            start.wait();
            drop(sleep);
        });
        a.join().unwrap();
        b.join().unwrap();
        assert!(
            wait_until(BOUND, || freed.dropped() == 1),
            "round {round}: the service was not freed"
        );
        expect_threads(p, 0, "both dropped at once");
    }
}

#[test]
fn the_last_sleeps_reset_onto_a_full_peer_ring_then_dropped_in_a_callback() {
    let p = "h28";
    let timer = ShardedTimer::builder()
        .shards(2)
        .callbacks(Callbacks::inline())
        .ring_capacity(2)
        .pin_cores(true)
        .thread_name(p)
        .build()
        .unwrap();
    expect_threads(p, 2, "after build");
    // Sleeps homed on core 1, completed without a timer (a deadline already past).
    let homed = timer.clone();
    let mut sleeps: Vec<Sleep> = on_core(1, move || {
        (0..64).map(|_| homed.sleep_until(homed.now())).collect()
    });
    for sleep in &mut sleeps {
        assert!(poll_once(sleep).is_ready());
    }
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let far = Instant::now() + Duration::from_secs(60);
    let maker = timer.clone();
    on_core(0, move || {
        maker
            .schedule(Duration::from_millis(5), move || {
                // Each reset files a new timer on core 1's shard, from this shard's
                // thread: the small ring fills and pushes are deferred.
                for sleep in &mut sleeps {
                    Pin::new(sleep).reset(far.into());
                }
                drop(sleeps); // the last futures: the service shuts down here
                d.store(true, Ordering::SeqCst);
            })
            .unwrap();
    });
    drop(timer);
    assert!(
        wait_until(BOUND, || done.load(Ordering::SeqCst)),
        "the callback hung"
    );
    expect_threads(
        p,
        0,
        "the last sleeps went in a callback with deferred pushes",
    );
}

#[test]
fn shutdown_in_a_callback_holding_the_last_clone_refuses_a_live_sleep_then_frees() {
    let p = "h29";
    let freed = DropCounter::default();
    let timer = service(p, counted_spawner(&freed), 2);
    expect_threads(p, 2, "after build");
    let mut sleep = timer.sleep(Duration::from_secs(60));
    assert!(poll_once(&mut sleep).is_pending());
    let last = timer.clone();
    let returned = Arc::new(AtomicUsize::new(usize::MAX));
    let r = returned.clone();
    timer
        .schedule(Duration::from_millis(5), move || {
            r.store(last.shutdown().len(), Ordering::SeqCst);
            drop(last);
        })
        .unwrap();
    drop(timer);
    assert!(wait_until(BOUND, || returned.load(Ordering::SeqCst) != usize::MAX));
    assert_eq!(
        returned.load(Ordering::SeqCst),
        0,
        "a sleep is not handed back"
    );
    assert!(
        block_on_within(&mut sleep, BOUND).is_some(),
        "shutdown completes the sleep"
    );
    assert_eq!(sleep.refused(), Some(ScheduleError::Shutdown));
    expect_threads(p, 0, "shut down from a callback");
    drop(sleep);
    assert!(
        wait_until(BOUND, || freed.dropped() == 1),
        "the service was not freed"
    );
}

#[test]
fn the_last_sleep_of_one_service_dropped_in_a_callback_of_another() {
    for (a, b, inline_a) in [("h30", "h31", false), ("h32", "h33", true)] {
        let host = if inline_a {
            inline_service(a)
        } else {
            pool_service(a)
        };
        let guest = if inline_a {
            pool_service(b)
        } else {
            inline_service(b)
        };
        let guest_threads = named_threads(b);
        let sleep = guest.sleep(Duration::from_secs(60));
        drop(guest);
        expect_still_running(b, guest_threads, "the guest's sleep is alive");
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        host.schedule(Duration::from_millis(5), move || {
            drop(sleep);
            d.store(true, Ordering::SeqCst);
        })
        .unwrap();
        assert!(wait_until(BOUND, || done.load(Ordering::SeqCst)));
        expect_threads(b, 0, "the guest's last sleep went in the host's callback");
        assert!(named_threads(a) > 0, "the host runs on");
        drop(host);
        expect_threads(a, 0, "host dropped");
    }
}

#[test]
fn the_last_sleep_dropped_while_a_spawner_unwinds_on_the_shard_thread() {
    let p = "h34";
    let panics = Arc::new(AtomicUsize::new(0));
    let n = panics.clone();
    let timer = service(
        p,
        Callbacks::spawn(move |callback| {
            let _held = callback; // dropped by the unwinding below
            n.fetch_add(1, Ordering::SeqCst);
            panic!("audit: a spawner that refuses (expected)");
        }),
        2,
    );
    expect_threads(p, 2, "after build");
    let sleep = timer.sleep(Duration::from_secs(60));
    let dropped = DropCounter::default();
    let token = dropped.token();
    timer
        .schedule(Duration::from_millis(5), move || {
            drop(sleep);
            drop(token);
        })
        .unwrap();
    drop(timer);
    assert!(wait_until(BOUND, || dropped.dropped() == 1));
    assert_eq!(panics.load(Ordering::SeqCst), 1);
    expect_threads(p, 0, "the last sleep was dropped by an unwinding spawner");
}

#[test]
fn the_last_sleep_dropped_by_a_spawner_during_a_rescue_shuts_down() {
    let p = "h35";
    let stuck = Arc::new(AtomicBool::new(false));
    let s = stuck.clone();
    // Runs the first callback (which blocks its shard), drops every other unrun.
    let timer = ShardedTimer::builder()
        .shards(2)
        .callbacks(Callbacks::spawn(move |callback| {
            if !s.swap(true, Ordering::SeqCst) {
                callback.run();
            }
        }))
        .tick(Duration::from_millis(1))
        .rescue_after(Some(Duration::from_millis(2)))
        .pin_cores(false)
        .thread_name(p)
        .build()
        .unwrap();
    expect_threads(p, 2, "after build");
    let released = Arc::new(AtomicBool::new(false));
    let r = released.clone();
    let dropped = DropCounter::default();
    let token = dropped.token();
    on_core(0, move || {
        timer
            .schedule(Duration::from_millis(5), move || {
                std::thread::sleep(Duration::from_millis(300));
                r.store(true, Ordering::SeqCst);
            })
            .unwrap();
        // Dropped unrun: the token first, then the sleep (whose drop shuts the
        // service down, which joins the stuck shard).
        let held = (token, timer.sleep(Duration::from_secs(60)));
        timer
            .schedule(Duration::from_millis(30), move || drop(held))
            .unwrap();
    });
    assert!(wait_until(BOUND, || dropped.dropped() == 1));
    assert!(
        !released.load(Ordering::SeqCst),
        "dropped by a rescue, while its shard was stuck"
    );
    expect_threads(
        p,
        0,
        "the last sleep was dropped by a spawner during a rescue",
    );
}
