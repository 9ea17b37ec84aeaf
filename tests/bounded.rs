//! Semantic 6: `max_pending` bounds pending timers; firing and cancelling free room.

mod support;

use std::sync::mpsc;
use std::time::Duration;

use sharded_timer::{ScheduleError, ShardedTimer};
use support::WAIT;

fn bounded(limit: usize) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(2)
        .executor_threads(1)
        .pin_cores(false)
        .max_pending(limit)
        .build()
        .unwrap()
}

#[test]
fn the_limit_plus_one_th_pending_timer_is_rejected_and_cancel_frees_room() {
    let timer = bounded(10);
    let handles: Vec<_> = (0..10)
        .map(|_| timer.schedule(Duration::from_secs(60), || {}).unwrap())
        .collect();
    let err = timer.schedule(Duration::from_secs(60), || {}).unwrap_err();
    assert_eq!(err, ScheduleError::TooManyPending { limit: 10 });
    assert_eq!(err.to_string(), "too many pending timers: the limit is 10");
    assert!(handles[3].cancel());
    let again = timer.schedule(Duration::from_secs(60), || {}).unwrap();
    assert!(timer.schedule(Duration::from_secs(60), || {}).is_err());
    assert!(!handles[3].cancel(), "a second cancel frees nothing");
    assert!(timer.schedule(Duration::from_secs(60), || {}).is_err());
    assert!(again.cancel());
    assert!(timer.schedule(Duration::from_secs(60), || {}).is_ok());
}

#[test]
fn firing_frees_room() {
    let timer = bounded(3);
    let (tx, rx) = mpsc::channel();
    for _ in 0..3 {
        let tx = tx.clone();
        timer
            .schedule(Duration::from_millis(10), move || tx.send(()).unwrap())
            .unwrap();
    }
    assert!(timer.schedule(Duration::from_millis(10), || {}).is_err());
    for _ in 0..3 {
        rx.recv_timeout(WAIT).unwrap();
    }
    // Room is freed when the shard fires, before the callback runs.
    for _ in 0..3 {
        timer.schedule(Duration::from_secs(60), || {}).unwrap();
    }
    assert!(timer.schedule(Duration::from_secs(60), || {}).is_err());
}
