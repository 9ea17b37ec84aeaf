//! Rescue of a stuck shard (issue 22; docs/architecture.md, `Builder::rescue_after`): with
//! inline callbacks, one callback that blocks does not make the other timers of its
//! shard late by the whole block: the shard that watches it fires them, once each,
//! never early. With rescue off, they wait (the companion test shows the stall is
//! real, so the first cannot pass by accident).
//!
//! Timing bounds are generous (CI machines are slow and shared): the blocker blocks
//! 400 ms; rescued timers must be less than 150 ms late, unrescued ones at least
//! 200 ms late.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sharded_timer::{Callbacks, ShardedTimer};
use support::within;

/// How long the blocking callback blocks.
const BLOCK: Duration = Duration::from_millis(400);
/// The others' first deadline after the blocker's, and their spacing.
const SPACING: Duration = Duration::from_millis(10);
/// How many others (one thread's timers go to one shard 64 at a time: all on the
/// blocker's shard).
const OTHERS: usize = 20;

/// Two shards, inline callbacks, rescue as given.
fn service(rescue_after: Option<Duration>) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(2)
        .callbacks(Callbacks::inline())
        .pin_cores(false)
        .thread_name("rescue")
        .rescue_after(rescue_after)
        .build()
        .expect("build")
}

/// When each of the others fired, its deadline, and the thread it ran on.
type Fired = Arc<Mutex<Vec<(Instant, Instant, String)>>>;

/// Schedules, from a fresh thread (so that every timer lands on one shard), a
/// callback due in 20 ms that blocks for [`BLOCK`] (or until released), and
/// [`OTHERS`] timers due every [`SPACING`] after it. Returns what the others record,
/// the blocker's thread name, and the release.
fn stall(timer: &ShardedTimer) -> (Fired, Arc<Mutex<String>>, mpsc::Sender<()>) {
    let fired: Fired = Arc::default();
    let blocker_thread = Arc::new(Mutex::new(String::new()));
    let (release, released) = mpsc::channel::<()>();
    let timer = timer.clone();
    let (fired_out, blocker_out) = (fired.clone(), blocker_thread.clone());
    std::thread::spawn(move || {
        let start = Instant::now();
        let block_at = start + Duration::from_millis(20);
        timer
            .schedule_at(block_at, move || {
                *blocker_out.lock().unwrap() = current_name();
                let _ = released.recv_timeout(BLOCK);
            })
            .expect("schedule the blocker");
        for k in 1..=OTHERS {
            let deadline = block_at + SPACING * k as u32;
            let fired = fired_out.clone();
            timer
                .schedule_at(deadline, move || {
                    fired
                        .lock()
                        .unwrap()
                        .push((Instant::now(), deadline, current_name()));
                })
                .expect("schedule");
        }
    })
    .join()
    .expect("the scheduling thread");
    (fired, blocker_thread, release)
}

/// The calling thread's name.
fn current_name() -> String {
    std::thread::current().name().unwrap_or("?").to_owned()
}

/// Waits until `n` others fired, or `limit` passed.
fn wait_for(fired: &Fired, n: usize, limit: Duration) {
    let start = Instant::now();
    while fired.lock().unwrap().len() < n && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_blocked_inline_callback_does_not_make_its_shards_other_timers_late() {
    within(Duration::from_secs(30), || {
        let timer = service(Some(Duration::from_millis(4)));
        let (fired, blocker, release) = stall(&timer);
        wait_for(&fired, OTHERS, Duration::from_secs(10));
        let fired = fired.lock().unwrap().clone();
        let blocker = blocker.lock().unwrap().clone();
        drop(release); // lets the blocker return
        assert_eq!(fired.len(), OTHERS, "every other timer fired");
        let mut rescued = 0;
        for (at, deadline, thread) in &fired {
            assert!(at >= deadline, "early by {:?}", *deadline - *at);
            let late = *at - *deadline;
            assert!(
                late < Duration::from_millis(150),
                "late by {late:?} on {thread}"
            );
            rescued += usize::from(*thread != blocker);
        }
        // All of them were due while the blocker blocked: none ran on its thread.
        assert_eq!(
            rescued, OTHERS,
            "ran on {fired:?}; the blocker on {blocker}"
        );
        timer.shutdown();
    })
    .expect("done within 30 s (or it failed: see the panic above)");
}

#[test]
fn with_rescue_off_the_other_timers_wait_for_the_blocked_callback() {
    within(Duration::from_secs(30), || {
        let timer = service(None);
        let (fired, blocker, _release) = stall(&timer);
        wait_for(&fired, OTHERS, Duration::from_secs(10));
        let fired = fired.lock().unwrap().clone();
        let blocker = blocker.lock().unwrap().clone();
        assert_eq!(fired.len(), OTHERS);
        // The first other was due 10 ms after the blocker began its 400 ms block.
        let (at, deadline, thread) = &fired[0];
        assert!(
            *at - *deadline >= Duration::from_millis(200),
            "{:?}",
            *at - *deadline
        );
        assert_eq!(*thread, blocker, "no rescue: its own thread ran it");
        timer.shutdown();
    })
    .expect("done within 30 s (or it failed: see the panic above)");
}

#[test]
fn many_timers_with_blocking_callbacks_each_fire_once_and_never_early() {
    within(Duration::from_secs(60), || {
        let timer = service(Some(Duration::from_millis(2)));
        const TIMERS: usize = 2_000;
        let counts: Arc<Vec<AtomicUsize>> =
            Arc::new((0..TIMERS).map(|_| AtomicUsize::new(0)).collect());
        let early = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        // From four threads, so both shards get timers; every 100th callback blocks
        // 20 ms, so rescues happen throughout.
        let threads: Vec<_> = (0..4)
            .map(|part| {
                let (timer, counts, early) = (timer.clone(), counts.clone(), early.clone());
                std::thread::spawn(move || {
                    for index in (part..TIMERS).step_by(4) {
                        let deadline = start + Duration::from_micros(100 * index as u64);
                        let (counts, early) = (counts.clone(), early.clone());
                        timer
                            .schedule_at(deadline, move || {
                                if Instant::now() < deadline {
                                    early.fetch_add(1, Ordering::SeqCst);
                                }
                                counts[index].fetch_add(1, Ordering::SeqCst);
                                if index % 100 == 0 {
                                    std::thread::sleep(Duration::from_millis(20));
                                }
                            })
                            .expect("schedule");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while counts.iter().any(|c| c.load(Ordering::SeqCst) == 0) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(50));
        for (index, count) in counts.iter().enumerate() {
            assert_eq!(count.load(Ordering::SeqCst), 1, "timer {index}");
        }
        assert_eq!(early.load(Ordering::SeqCst), 0);
        let stats = timer.stats();
        assert_eq!(stats.fired, TIMERS as u64);
        assert_eq!(stats.pending, 0);
        timer.shutdown();
    })
    .expect("done within 60 s (or it failed: see the panic above)");
}

#[test]
fn a_rescued_callback_may_shut_the_service_down() {
    within(Duration::from_secs(30), || {
        let timer = service(Some(Duration::from_millis(4)));
        let (fired, _blocker, release) = stall(&timer);
        // One more, on either shard: it shuts the service down from whatever thread
        // runs it (its own shard's, or the one rescuing it).
        let done = Arc::new(Mutex::new(None));
        {
            let (timer2, done) = (timer.clone(), done.clone());
            let deadline = Instant::now() + Duration::from_millis(60);
            let scheduled = std::thread::spawn(move || {
                let inner = timer2.clone();
                timer2
                    .schedule_at(deadline, move || {
                        let unfired = inner.shutdown();
                        *done.lock().unwrap() = Some((current_name(), unfired.len()));
                    })
                    .expect("schedule")
            });
            drop(scheduled.join());
        }
        // The shutdown waits for the blocked callback's thread: let it go.
        std::thread::sleep(Duration::from_millis(150));
        drop(release);
        let start = Instant::now();
        while done.lock().unwrap().is_none() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let (thread, unfired) = done.lock().unwrap().clone().expect("the shutdown returned");
        assert!(thread.starts_with("rescue-s"), "{thread}");
        let fired = fired.lock().unwrap().len();
        // Each other either fired (rescued, or on its own thread once the blocker
        // returned, before that thread's shard shut down) or came back unfired.
        assert_eq!(fired + unfired, OTHERS, "fired {fired}, unfired {unfired}");
    })
    .expect("done within 30 s (or it failed: see the panic above)");
}
