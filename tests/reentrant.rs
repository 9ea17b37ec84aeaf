//! Semantic 5: schedule and cancel from inside callbacks; shutdown from a callback.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use sharded_timer::{ShardedTimer, TimerState};
use support::{small_timer, wait_until, WAIT};

fn chain(timer: ShardedTimer, remaining: usize, done: mpsc::Sender<()>) {
    if remaining == 0 {
        done.send(()).unwrap();
        return;
    }
    let next = timer.clone();
    timer
        .schedule(Duration::from_micros(100), move || {
            chain(next, remaining - 1, done)
        })
        .unwrap();
}

#[test]
fn callbacks_schedule_further_timers() {
    let timer = small_timer();
    let (tx, rx) = mpsc::channel();
    chain(timer.clone(), 200, tx);
    rx.recv_timeout(WAIT)
        .expect("the chain of 200 timers completed");
    assert!(wait_until(WAIT, || timer.stats().fired == 200));
    assert!(timer.shutdown().is_empty());
}

#[test]
fn callbacks_cancel_other_timers() {
    let timer = small_timer();
    let victim = timer
        .schedule(Duration::from_millis(300), || panic!("cancelled"))
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let v = victim.clone();
    timer
        .schedule(Duration::ZERO, move || tx.send(v.cancel()).unwrap())
        .unwrap();
    assert_eq!(rx.recv_timeout(WAIT), Ok(true));
    assert_eq!(victim.state(), TimerState::Cancelled);
    // Shutdown decides: the victim is not handed back, and did not run.
    assert!(timer.shutdown().is_empty());
    assert_eq!(timer.stats().panicked, 0);
}

#[test]
fn shutdown_from_a_callback_does_not_deadlock() {
    let timer = small_timer();
    // Pending first: scheduled after the callback, it could find the service already
    // shut down (seen under AddressSanitizer's slowdown).
    let _pending = timer.schedule(Duration::from_secs(60), || {}).unwrap();
    let (tx, rx) = mpsc::channel();
    let inner = timer.clone();
    timer
        .schedule(Duration::ZERO, move || {
            let unfired = inner.shutdown();
            tx.send(unfired.len()).unwrap();
        })
        .unwrap();
    assert_eq!(rx.recv_timeout(WAIT), Ok(1));
    assert!(timer.shutdown().is_empty());
}

#[test]
fn a_callback_dropping_the_last_clone_shuts_down_without_deadlock() {
    let (tx, rx) = mpsc::channel();
    let ran = Arc::new(AtomicUsize::new(0));
    {
        let timer = small_timer();
        let held = timer.clone();
        let ran = ran.clone();
        timer
            .schedule(Duration::from_millis(20), move || {
                std::thread::sleep(Duration::from_millis(50));
                ran.fetch_add(1, Ordering::SeqCst);
                drop(held); // the last clone, once the outer one is gone
                tx.send(()).unwrap();
            })
            .unwrap();
    } // the caller's clone is dropped here, before the callback runs
    rx.recv_timeout(WAIT)
        .expect("callback ran and dropped the service");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}
