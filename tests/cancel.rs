//! Semantic 3 (exactly once) under concurrent cancels, and the edges of `cancel`.

mod support;

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sharded_timer::TimerState;
use support::{small_timer, wait_until, DropCounter, WAIT};

#[test]
fn concurrent_random_cancels_run_every_uncancelled_timer_exactly_once() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 25_000;
    let timer = small_timer();
    let runs: Arc<Vec<AtomicU8>> = Arc::new(
        (0..THREADS * PER_THREAD)
            .map(|_| AtomicU8::new(0))
            .collect(),
    );
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let timer = timer.clone();
            let runs = runs.clone();
            std::thread::spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut handles = Vec::with_capacity(PER_THREAD);
                let mut cancelled = Vec::with_capacity(PER_THREAD);
                for i in 0..PER_THREAD {
                    let index = t * PER_THREAD + i;
                    let runs = runs.clone();
                    let delay = Duration::from_micros(next() % 30_000);
                    let handle = timer
                        .schedule(delay, move || {
                            runs[index].fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap();
                    handles.push((index, handle));
                    // Cancel a random earlier timer about half the time: some are
                    // still in the ring, some filed, some already fired.
                    if next() % 2 == 0 {
                        let (victim, handle) = &handles[(next() as usize) % handles.len()];
                        if handle.cancel() {
                            cancelled.push(*victim);
                        }
                    }
                }
                cancelled
            })
        })
        .collect();
    let mut cancelled = vec![false; THREADS * PER_THREAD];
    let mut cancelled_count = 0;
    for worker in workers {
        for index in worker.join().unwrap() {
            assert!(!cancelled[index], "cancel returned true twice for {index}");
            cancelled[index] = true;
            cancelled_count += 1;
        }
    }
    let expected_runs = THREADS * PER_THREAD - cancelled_count;
    let total_runs = || {
        runs.iter()
            .map(|r| r.load(Ordering::SeqCst) as usize)
            .sum::<usize>()
    };
    assert!(
        wait_until(WAIT, || total_runs() == expected_runs),
        "{} of {expected_runs} ran",
        total_runs()
    );
    // Shutdown decides: a timer wrongly still pending comes back, and every callback
    // already handed over has run by the time it returns.
    assert!(timer.shutdown().is_empty(), "nothing is left pending");
    for (index, run) in runs.iter().enumerate() {
        let run = run.load(Ordering::SeqCst);
        if cancelled[index] {
            assert_eq!(
                run, 0,
                "timer {index} ran although its cancel returned true"
            );
        } else {
            assert_eq!(run, 1, "timer {index} ran {run} times");
        }
    }
    let total = (THREADS * PER_THREAD) as u64;
    assert!(
        wait_until(WAIT, || {
            let s = timer.stats();
            s.scheduled == total && s.fired + s.cancelled == total
        }),
        "counters never added up: {:?}",
        timer.stats()
    );
    let stats = timer.stats();
    assert_eq!(stats.fired, expected_runs as u64);
    assert_eq!(stats.cancelled, cancelled_count as u64);
    assert_eq!(stats.pending, 0);
}

#[test]
fn cancel_twice_returns_true_then_false_and_drops_the_callback_at_once() {
    let timer = small_timer();
    let drops = DropCounter::default();
    let token = drops.token();
    let handle = timer
        .schedule(Duration::from_secs(60), move || drop(token))
        .unwrap();
    assert_eq!(handle.state(), TimerState::Pending);
    assert!(handle.cancel());
    assert_eq!(
        drops.dropped(),
        1,
        "the callback is dropped before cancel returns"
    );
    assert!(!handle.cancel());
    assert_eq!(handle.state(), TimerState::Cancelled);
    assert!(wait_until(WAIT, || timer.stats().cancelled == 1));
}

#[test]
fn cancel_after_fire_returns_false() {
    let timer = small_timer();
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = timer
        .schedule(Duration::ZERO, move || tx.send(()).unwrap())
        .unwrap();
    rx.recv_timeout(WAIT).unwrap();
    assert_eq!(handle.state(), TimerState::Fired);
    assert!(!handle.cancel());
    assert_eq!(handle.state(), TimerState::Fired);
}

#[test]
fn cancel_after_shutdown_returns_false() {
    let timer = small_timer();
    let handle = timer.schedule(Duration::from_secs(60), || {}).unwrap();
    let unfired = timer.shutdown();
    assert_eq!(unfired.len(), 1);
    assert!(!handle.cancel(), "the timer now belongs to its Unfired");
    drop(unfired);
    assert_eq!(
        handle.state(),
        TimerState::Cancelled,
        "a dropped Unfired drops the callback"
    );
    assert!(!handle.cancel());
}

#[test]
fn dropping_a_handle_does_not_cancel() {
    let timer = small_timer();
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..100 {
        let ran = ran.clone();
        drop(timer.schedule(Duration::from_millis(5), move || {
            ran.fetch_add(1, Ordering::SeqCst);
        }));
    }
    assert!(wait_until(WAIT, || ran.load(Ordering::SeqCst) == 100));
}

#[test]
fn cancelled_timers_free_their_callbacks_before_their_deadline() {
    let timer = small_timer();
    let drops = DropCounter::default();
    let handles: Vec<_> = (0..1_000)
        .map(|_| {
            let token = drops.token();
            timer
                .schedule(Duration::from_secs(3600), move || drop(token))
                .unwrap()
        })
        .collect();
    // Let the shards file them, so the cancels go through the cancel rings.
    assert!(wait_until(WAIT, || timer.stats().scheduled == 1_000));
    for handle in &handles {
        assert!(handle.cancel());
    }
    assert_eq!(drops.dropped(), 1_000);
    assert!(
        wait_until(WAIT, || timer.stats().cancelled == 1_000),
        "{:?}",
        timer.stats()
    );
    assert_eq!(timer.stats().pending, 0);
}

/// A timer due in 60 s whose callback holds `capture`, filed in its shard's wheel (so a
/// winning cancel sends the shard a message).
fn filed_timer_holding<C: Send + 'static>(
    timer: &sharded_timer::ShardedTimer,
    capture: C,
) -> sharded_timer::TimerHandle {
    let handle = timer
        .schedule(Duration::from_secs(60), move || {
            let _capture = &capture;
        })
        .unwrap();
    support::wait_filed(timer, 1);
    handle
}

/// Cancels on another thread; the cancel must win and return within `WAIT`.
fn assert_cancel_wins_and_returns(handle: sharded_timer::TimerHandle) {
    let won = support::within(support::WAIT, move || handle.cancel());
    assert_eq!(
        won,
        Some(true),
        "cancel returned within {:?}",
        support::WAIT
    );
}

/// Audit defect 2: a winning cancel whose callback holds the last clone of the service
/// (so dropping the callback shuts the service down) must return, not deadlock.
#[test]
fn cancel_whose_callback_holds_the_last_clone_returns() {
    let timer = support::one_shard_timer();
    let keep = timer.clone();
    let handle = filed_timer_holding(&timer, keep);
    drop(timer);
    assert_cancel_wins_and_returns(handle);
}

/// Audit defect 2, second trigger: a capture whose `Drop` calls `shutdown`.
#[test]
fn cancel_whose_capture_shuts_down_on_drop_returns() {
    struct ShutdownOnDrop(sharded_timer::ShardedTimer);
    impl Drop for ShutdownOnDrop {
        fn drop(&mut self) {
            drop(self.0.shutdown());
        }
    }
    let timer = support::one_shard_timer();
    let capture = ShutdownOnDrop(timer.clone());
    let handle = filed_timer_holding(&timer, capture);
    assert_cancel_wins_and_returns(handle);
    let again = support::within(support::WAIT, move || timer.shutdown().len());
    assert_eq!(
        again,
        Some(0),
        "the service is shut down and a second shutdown returns"
    );
}

/// Audit defect 3: a capture whose `Drop` panics during a winning cancel. The panic
/// reaches the caller, but the service stays whole: the room is freed, the cancel is
/// processed, and shutdown returns.
#[test]
fn cancel_whose_capture_panics_on_drop_leaves_the_service_whole() {
    struct PanicOnDrop;
    impl Drop for PanicOnDrop {
        fn drop(&mut self) {
            panic!("capture panics on drop, on purpose");
        }
    }
    let timer = support::one_shard_timer_bounded(1);
    let capture = PanicOnDrop;
    let handle = filed_timer_holding(&timer, capture);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle.cancel()));
    assert!(outcome.is_err(), "the capture's panic reaches the caller");
    assert_eq!(handle.state(), TimerState::Cancelled);
    let again = timer.schedule(Duration::from_secs(60), || {});
    assert!(again.is_ok(), "the room was freed: {again:?}");
    assert!(
        wait_until(WAIT, || timer.stats().cancelled == 1),
        "the shard processed the cancel"
    );
    let unfired = support::within(WAIT, move || timer.shutdown().len());
    assert_eq!(unfired, Some(1), "shutdown returns, with the second timer");
}
