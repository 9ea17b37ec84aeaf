//! `TimerHandle::reset` / `reset_at`: later is a store, earlier a message; never early
//! relative to the last successful reset; false (and no change) once fired or
//! cancelled.

mod support;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use sharded_timer::TimerState;
use support::{small_timer, wait_until, WAIT};

#[test]
fn ten_thousand_timers_reset_from_4_threads_fire_once_never_before_last_reset_plus_idle() {
    const TIMERS: usize = 10_000;
    const THREADS: usize = 4;
    let idle = Duration::from_millis(50);
    let timer = small_timer();
    let base = Instant::now();
    let ns = move |t: Instant| t.duration_since(base).as_nanos() as u64;
    // Per timer: runs, the time it ran, and the instant just before its last
    // successful reset (or its schedule).
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..TIMERS).map(|_| AtomicUsize::new(0)).collect());
    let ran_at: Arc<Vec<AtomicU64>> = Arc::new((0..TIMERS).map(|_| AtomicU64::new(0)).collect());
    let last_reset: Arc<Vec<AtomicU64>> =
        Arc::new((0..TIMERS).map(|_| AtomicU64::new(0)).collect());
    let handles: Vec<_> = (0..TIMERS)
        .map(|i| {
            let (runs, ran_at) = (runs.clone(), ran_at.clone());
            last_reset[i].store(ns(Instant::now()), Ordering::SeqCst);
            timer
                .schedule(idle, move || {
                    ran_at[i].store(ns(Instant::now()), Ordering::SeqCst);
                    runs[i].fetch_add(1, Ordering::SeqCst);
                })
                .unwrap()
        })
        .collect();
    let handles = Arc::new(handles);
    let stop = base + Duration::from_millis(600);
    let mut resets = 0;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (handles, last_reset) = (&handles, &last_reset);
                scope.spawn(move || {
                    let mut resets = 0u64;
                    while Instant::now() < stop {
                        for i in (t..TIMERS).step_by(THREADS) {
                            let before = Instant::now();
                            if handles[i].reset(idle) {
                                last_reset[i].store(ns(before), Ordering::SeqCst);
                                resets += 1;
                            }
                        }
                    }
                    resets
                })
            })
            .collect();
        resets = workers.into_iter().map(|w| w.join().unwrap()).sum::<u64>();
    });
    assert!(
        resets > TIMERS as u64,
        "each timer was reset at least once ({resets} resets)"
    );
    assert!(
        wait_until(WAIT, || runs.iter().all(|r| r.load(Ordering::SeqCst) >= 1)),
        "not every timer fired"
    );
    // Shutdown decides: a wrong second run has either run by the time it returns or
    // comes back as pending.
    assert!(timer.shutdown().is_empty(), "nothing is left pending");
    let idle_ns = idle.as_nanos() as u64;
    for i in 0..TIMERS {
        assert_eq!(
            runs[i].load(Ordering::SeqCst),
            1,
            "timer {i} ran more than once"
        );
        let (ran, last) = (
            ran_at[i].load(Ordering::SeqCst),
            last_reset[i].load(Ordering::SeqCst),
        );
        assert!(
            ran >= last + idle_ns,
            "timer {i} ran {} µs before its last reset + idle",
            (last + idle_ns - ran) / 1000
        );
        assert_eq!(handles[i].state(), TimerState::Fired);
    }
    let stats = timer.stats();
    assert_eq!(
        (stats.fired, stats.cancelled, stats.pending),
        (TIMERS as u64, 0, 0)
    );
}

#[test]
fn reset_on_a_fired_or_cancelled_timer_returns_false_and_changes_nothing() {
    let timer = small_timer();
    let (tx, rx) = mpsc::channel();
    let fired = timer
        .schedule(Duration::ZERO, move || tx.send(()).unwrap())
        .unwrap();
    rx.recv_timeout(WAIT).unwrap();
    assert!(wait_until(WAIT, || fired.state() == TimerState::Fired));
    let deadline = fired.deadline();
    assert!(!fired.reset(Duration::from_secs(60)));
    assert_eq!(fired.deadline(), deadline, "a failed reset changes nothing");
    assert_eq!(fired.state(), TimerState::Fired);

    let cancelled = timer
        .schedule(Duration::from_secs(60), || panic!("cancelled"))
        .unwrap();
    assert!(cancelled.cancel());
    let deadline = cancelled.deadline();
    assert!(!cancelled.reset_at(Instant::now()));
    assert_eq!(cancelled.deadline(), deadline);
    assert_eq!(cancelled.state(), TimerState::Cancelled);
}

#[test]
fn reset_earlier_fires_at_the_new_deadline_not_the_old_one() {
    let timer = small_timer();
    let (tx, rx) = mpsc::channel();
    let handle = timer
        .schedule(Duration::from_secs(3600), move || {
            tx.send(Instant::now()).unwrap()
        })
        .unwrap();
    // Let the shard file it, so the earlier move goes through its message ring.
    assert!(wait_until(WAIT, || timer.stats().scheduled == 1));
    let reset_at = Instant::now();
    assert!(handle.reset(Duration::from_millis(20)));
    let ran = rx
        .recv_timeout(WAIT)
        .expect("fired at the earlier deadline");
    assert!(ran >= reset_at + Duration::from_millis(20), "early");
    assert!(ran < reset_at + WAIT, "not at the old deadline");
    assert!(handle.deadline() < reset_at + Duration::from_secs(1));
}

#[test]
fn reset_later_postpones_and_reset_at_a_past_instant_fires_next_tick() {
    let timer = small_timer();
    let (tx, rx) = mpsc::channel();
    let handle = timer
        .schedule(Duration::from_millis(30), move || {
            tx.send(Instant::now()).unwrap()
        })
        .unwrap();
    let postponed = Instant::now();
    assert!(handle.reset(Duration::from_millis(200)));
    let ran = rx.recv_timeout(WAIT).unwrap();
    assert!(
        ran >= postponed + Duration::from_millis(200),
        "fired at the old deadline"
    );

    let (tx, rx) = mpsc::channel();
    let handle = timer
        .schedule(Duration::from_secs(3600), move || tx.send(()).unwrap())
        .unwrap();
    let past = Instant::now()
        .checked_sub(Duration::from_secs(1))
        .unwrap_or_else(Instant::now);
    assert!(handle.reset_at(past));
    rx.recv_timeout(WAIT)
        .expect("a past deadline fires on the next tick");
}

#[test]
fn reset_after_shutdown_returns_false() {
    let timer = small_timer();
    let handle = timer.schedule(Duration::from_secs(60), || {}).unwrap();
    let unfired = timer.shutdown();
    assert!(
        !handle.reset(Duration::from_millis(1)),
        "the timer belongs to its Unfired"
    );
    assert_eq!(unfired.len(), 1);
}

#[test]
fn repeated_earlier_and_later_resets_on_filed_timers_lose_nothing_at_shutdown() {
    let timer = small_timer();
    let handles: Vec<_> = (0..2_000)
        .map(|_| timer.schedule(Duration::from_secs(3600), || {}).unwrap())
        .collect();
    assert!(wait_until(WAIT, || timer.stats().scheduled == 2_000));
    for (i, handle) in handles.iter().enumerate() {
        // Alternate earlier and later moves, all still far away.
        let delay = Duration::from_secs(if i % 2 == 0 { 1800 } else { 7200 });
        assert!(handle.reset(delay));
    }
    let unfired = timer.shutdown();
    assert_eq!(unfired.len(), 2_000, "every pending timer comes back once");
}

/// How late a reset timer may fire here: well under the 3 s the shard would sleep if
/// the reset did not wake it, generous for a slow CI machine.
const RESET_LATE: Duration = Duration::from_millis(1500);

/// Schedules a timer that keeps a one-shard service asleep until 3 s from now.
fn park_shard_for_3s(timer: &sharded_timer::ShardedTimer) -> sharded_timer::TimerHandle {
    let parked = timer.schedule(Duration::from_secs(3), || {}).unwrap();
    support::wait_filed(timer, 1);
    // `stats()` woke the shard; let it go back to sleep until the 3 s deadline.
    std::thread::sleep(Duration::from_millis(100));
    parked
}

/// A timer due in 60 s that reports the instant it runs.
fn schedule_reporting_in_60s(
    timer: &sharded_timer::ShardedTimer,
) -> (sharded_timer::TimerHandle, mpsc::Receiver<Instant>) {
    let (tx, rx) = mpsc::channel();
    let handle = timer
        .schedule(Duration::from_secs(60), move || {
            tx.send(Instant::now()).unwrap()
        })
        .unwrap();
    (handle, rx)
}

/// Waits for the reset timer's run and checks it came at or after `asked`, within
/// [`RESET_LATE`].
fn assert_fires_on_time(rx: &mpsc::Receiver<Instant>, asked: Instant) {
    let fired = rx.recv_timeout(WAIT).expect("the reset timer fires");
    assert!(fired >= asked, "never early");
    assert!(
        fired - asked < RESET_LATE,
        "fired {:?} after its reset deadline (the shard slept until 3 s)",
        fired - asked
    );
}

/// Audit defect 4, first case: an earlier reset of a timer still in the insert ring
/// must wake the shard, which sleeps until a later deadline.
#[test]
fn an_earlier_reset_of_a_timer_not_yet_filed_fires_on_time() {
    let timer = support::one_shard_timer();
    let _parked = park_shard_for_3s(&timer);
    let (handle, rx) = schedule_reporting_in_60s(&timer);
    let asked = Instant::now() + Duration::from_millis(10);
    assert!(handle.reset_at(asked));
    assert_fires_on_time(&rx, asked);
}

/// Audit defect 4, second case: a second earlier reset while the first one's move
/// message is outstanding must not leave the timer waiting for the shard's old sleep.
#[test]
fn two_earlier_resets_in_a_row_fire_on_the_second_deadline() {
    let timer = support::one_shard_timer();
    let _parked = park_shard_for_3s(&timer);
    let (handle, rx) = schedule_reporting_in_60s(&timer);
    support::wait_filed(&timer, 2);
    std::thread::sleep(Duration::from_millis(100));
    assert!(handle.reset(Duration::from_secs(30)), "earlier than 60 s");
    let asked = Instant::now() + Duration::from_millis(10);
    assert!(handle.reset_at(asked), "earlier again");
    assert_fires_on_time(&rx, asked);
}
