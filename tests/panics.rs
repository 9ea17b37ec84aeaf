//! A panicking callback is caught and counted; the service lives on.

mod support;

use std::sync::mpsc;
use std::time::Duration;

use support::{small_timer, wait_until, WAIT};

#[test]
fn a_panicking_callback_does_not_take_down_the_service() {
    let timer = small_timer();
    for _ in 0..10 {
        timer
            .schedule(Duration::ZERO, || panic!("callback panics on purpose"))
            .unwrap();
    }
    assert!(wait_until(WAIT, || timer.stats().panicked == 10));
    let (tx, rx) = mpsc::channel();
    for i in 0..100 {
        let tx = tx.clone();
        timer
            .schedule(Duration::from_millis(i % 5), move || tx.send(i).unwrap())
            .unwrap();
    }
    let mut got: Vec<u64> = (0..100).map(|_| rx.recv_timeout(WAIT).unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, (0..100).collect::<Vec<_>>());
    let stats = timer.stats();
    assert_eq!((stats.fired, stats.panicked), (110, 10));
}

/// Audit defect 9: a panic whose payload panics when dropped must not kill the worker:
/// with one worker, later callbacks still run.
#[test]
fn a_panic_payload_that_panics_on_drop_does_not_kill_the_worker() {
    struct PanicOnDrop;
    impl Drop for PanicOnDrop {
        fn drop(&mut self) {
            panic!("the payload panics on drop, on purpose");
        }
    }
    let timer = support::one_shard_timer();
    timer
        .schedule(Duration::ZERO, || std::panic::panic_any(PanicOnDrop))
        .unwrap();
    assert!(wait_until(WAIT, || timer.stats().panicked == 1));
    let (tx, rx) = mpsc::channel();
    timer
        .schedule(Duration::ZERO, move || tx.send(()).unwrap())
        .unwrap();
    assert_eq!(rx.recv_timeout(WAIT), Ok(()), "the worker lives on");
}
