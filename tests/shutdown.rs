//! Semantic 7: shutdown returns exactly the pending timers, waits for running
//! callbacks, and refuses new ones.

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sharded_timer::{ScheduleError, TimerState};
use support::{small_timer, wait_until, DropCounter, WAIT};

#[test]
fn shutdown_returns_exactly_the_pending_ones() {
    let timer = small_timer();
    let fired = Arc::new(AtomicUsize::new(0));
    for _ in 0..500 {
        let fired = fired.clone();
        timer
            .schedule(Duration::ZERO, move || {
                fired.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    assert!(wait_until(WAIT, || fired.load(Ordering::SeqCst) == 500));
    let pending: Vec<_> = (0..1_000)
        .map(|i| {
            timer
                .schedule(Duration::from_secs(60 + i), || panic!("must not run"))
                .unwrap()
        })
        .collect();
    let cancelled: Vec<_> = pending.iter().step_by(10).filter(|h| h.cancel()).collect();
    assert_eq!(cancelled.len(), 100);

    let unfired = timer.shutdown();
    let expected: HashSet<_> = pending
        .iter()
        .filter(|h| h.state() == TimerState::Pending)
        .map(|h| h.id())
        .collect();
    let got: HashSet<_> = unfired.iter().map(|u| u.id()).collect();
    assert_eq!(unfired.len(), 900);
    assert_eq!(got, expected);
    for (handle, unfired) in pending
        .iter()
        .filter(|h| h.state() == TimerState::Pending)
        .zip(&unfired)
    {
        let _ = (handle, unfired);
    }
    for u in &unfired {
        let handle = pending.iter().find(|h| h.id() == u.id()).unwrap();
        assert_eq!(u.deadline(), handle.deadline());
    }
    assert_eq!(fired.load(Ordering::SeqCst), 500);
    assert!(timer.shutdown().is_empty(), "idempotent");
    drop(unfired); // dropped, not run: their callbacks would panic if run
}

#[test]
fn schedule_after_shutdown_is_an_error_and_drops_the_callback() {
    let timer = small_timer();
    assert!(timer.shutdown().is_empty());
    let drops = DropCounter::default();
    let token = drops.token();
    let result = timer.schedule(Duration::from_millis(1), move || drop(token));
    assert_eq!(result.unwrap_err(), ScheduleError::Shutdown);
    assert_eq!(drops.dropped(), 1);
    let clone = timer.clone();
    assert_eq!(
        clone.schedule_at(Instant::now(), || {}).unwrap_err(),
        ScheduleError::Shutdown
    );
}

#[test]
fn unfired_run_runs_and_drop_drops() {
    let timer = small_timer();
    let ran = Arc::new(AtomicUsize::new(0));
    let drops = DropCounter::default();
    let a = {
        let ran = ran.clone();
        timer
            .schedule(Duration::from_secs(60), move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap()
    };
    let token = drops.token();
    let b = timer
        .schedule(Duration::from_secs(60), move || drop(token))
        .unwrap();
    let mut unfired = timer.shutdown();
    assert_eq!(unfired.len(), 2);
    unfired.sort_by_key(|u| u.id() != a.id());
    let mut it = unfired.into_iter();
    it.next().unwrap().run();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(a.state(), TimerState::Fired);
    assert_eq!(drops.dropped(), 0);
    drop(it);
    assert_eq!(drops.dropped(), 1);
    assert_eq!(b.state(), TimerState::Cancelled);
}

#[test]
fn shutdown_waits_for_callbacks_already_running() {
    let timer = small_timer();
    let started = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    {
        let (started, finished) = (started.clone(), finished.clone());
        timer
            .schedule(Duration::ZERO, move || {
                started.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(200));
                finished.store(true, Ordering::SeqCst);
            })
            .unwrap();
    }
    assert!(wait_until(WAIT, || started.load(Ordering::SeqCst)));
    assert!(timer.shutdown().is_empty());
    assert!(
        finished.load(Ordering::SeqCst),
        "shutdown returned before the callback finished"
    );
}

#[test]
fn dropping_the_last_clone_drops_unfired_callbacks() {
    let drops = DropCounter::default();
    let timer = small_timer();
    let clone = timer.clone();
    let handles: Vec<_> = (0..100)
        .map(|_| {
            let token = drops.token();
            timer
                .schedule(Duration::from_secs(60), move || drop(token))
                .unwrap()
        })
        .collect();
    drop(timer);
    assert_eq!(drops.dropped(), 0, "a clone is still alive");
    drop(clone);
    assert_eq!(drops.dropped(), 100);
    assert!(handles.iter().all(|h| h.state() == TimerState::Cancelled));
}

#[test]
fn shutdown_racing_schedule_loses_nothing() {
    for _ in 0..20 {
        let timer = small_timer();
        let ran = Arc::new(AtomicUsize::new(0));
        let producers: Vec<_> = (0..2)
            .map(|_| {
                let timer = timer.clone();
                let ran = ran.clone();
                std::thread::spawn(move || {
                    let mut accepted = 0usize;
                    for i in 0..2_000u64 {
                        let ran = ran.clone();
                        match timer.schedule(Duration::from_micros(i % 3_000), move || {
                            ran.fetch_add(1, Ordering::SeqCst);
                        }) {
                            Ok(_) => accepted += 1,
                            Err(ScheduleError::Shutdown) => break,
                            Err(e) => panic!("unexpected {e}"),
                        }
                    }
                    accepted
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1));
        let unfired = timer.shutdown();
        let accepted: usize = producers.into_iter().map(|p| p.join().unwrap()).sum();
        let unfired_count = unfired.len();
        for u in unfired {
            u.run();
        }
        assert_eq!(
            ran.load(Ordering::SeqCst),
            accepted,
            "every accepted timer ran once ({unfired_count} after shutdown)"
        );
    }
}

/// Audit defect 6, second half: shutdown called from a callback must not return while
/// other callbacks of the same batch are still to run on the calling worker.
#[test]
fn shutdown_from_a_callback_runs_the_rest_of_its_batch_before_returning() {
    let timer = support::one_shard_timer();
    let returned = Arc::new(AtomicBool::new(false));
    let after = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new(AtomicUsize::new(0));
    let first = Arc::new(AtomicBool::new(true));
    let due = Instant::now() + Duration::from_millis(50);
    const N: usize = 20;
    for _ in 0..N {
        let (service, returned, after, ran, first) = (
            timer.clone(),
            returned.clone(),
            after.clone(),
            ran.clone(),
            first.clone(),
        );
        timer
            .schedule_at(due, move || {
                ran.fetch_add(1, Ordering::SeqCst);
                if first.swap(false, Ordering::SeqCst) {
                    drop(service.shutdown());
                    returned.store(true, Ordering::SeqCst);
                } else if returned.load(Ordering::SeqCst) {
                    after.fetch_add(1, Ordering::SeqCst);
                }
            })
            .unwrap();
    }
    assert!(wait_until(WAIT, || returned.load(Ordering::SeqCst)));
    assert_eq!(ran.load(Ordering::SeqCst), N, "every due callback ran");
    assert_eq!(
        after.load(Ordering::SeqCst),
        0,
        "none ran after shutdown returned"
    );
}

/// Audit defect 1: a cancel racing `shutdown` and the drop of the last clone must not
/// touch the shard's freed state. On real threads this is a race; AddressSanitizer
/// (see the README) turns a lost race into a failure.
#[test]
fn cancel_racing_shutdown_and_drop_of_the_service_is_safe() {
    for _ in 0..if cfg!(miri) { 2 } else { 200 } {
        let timer = support::one_shard_timer();
        let handle = timer.schedule(Duration::from_secs(60), || {}).unwrap();
        support::wait_filed(&timer, 1);
        let canceller = std::thread::spawn(move || handle.cancel());
        let unfired = timer.shutdown();
        drop(timer);
        let won = canceller.join().unwrap();
        assert_eq!(
            usize::from(!won),
            unfired.len(),
            "cancelled, or handed back"
        );
    }
}
