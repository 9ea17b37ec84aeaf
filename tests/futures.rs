//! `sleep`, `sleep_until` and `timeout`: runtime-agnostic futures, never early, and
//! cancelled when dropped.

mod support;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake};
use std::time::{Duration, Instant};

use sharded_timer::{Elapsed, Sleep, Timeout};
use support::{small_timer, wait_until, WAIT};

/// A hand-written executor: poll, park until woken, repeat.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park_timeout(WAIT);
    }
}

#[test]
fn sleep_completes_never_early_under_a_hand_written_executor() {
    let timer = small_timer();
    for ms in [0u64, 1, 5, 20] {
        let start = Instant::now();
        let sleep = timer.sleep(Duration::from_millis(ms));
        let deadline = sleep.deadline();
        block_on(sleep);
        assert!(Instant::now() >= deadline, "woke early for {ms} ms");
        assert!(start.elapsed() >= Duration::from_millis(ms));
    }
}

#[test]
fn sleep_and_timeout_work_under_tokio() {
    let timer = small_timer();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let start = Instant::now();
        timer.sleep(Duration::from_millis(10)).await;
        assert!(start.elapsed() >= Duration::from_millis(10));
        let slow = timer.sleep(Duration::from_secs(60));
        assert!(timer.timeout(Duration::from_millis(5), slow).await.is_err());
    });
}

#[test]
fn timeout_on_a_pending_future_elapses_not_before_its_deadline() {
    let timer = small_timer();
    let start = Instant::now();
    let result = block_on(timer.timeout(Duration::from_millis(15), std::future::pending::<()>()));
    assert!(result.is_err());
    assert!(start.elapsed() >= Duration::from_millis(15));
    assert_eq!(result.unwrap_err().to_string(), "deadline has elapsed");
}

#[test]
fn timeout_on_a_ready_future_passes_through() {
    let timer = small_timer();
    assert_eq!(block_on(timer.timeout(Duration::ZERO, async { 7 })), Ok(7));
    assert_eq!(
        block_on(timer.timeout(Duration::from_secs(60), std::future::ready("x"))),
        Ok("x")
    );
}

#[test]
fn a_thousand_dropped_sleeps_leave_nothing_pending() {
    let timer = small_timer();
    let sleeps: Vec<Sleep> = (0..1_000)
        .map(|_| timer.sleep(Duration::from_secs(60)))
        .collect();
    assert!(wait_until(WAIT, || timer.stats().scheduled == 1_000));
    assert_eq!(timer.stats().pending, 1_000);
    drop(sleeps);
    assert!(
        wait_until(WAIT, || timer.stats().pending == 0),
        "{:?}",
        timer.stats()
    );
    assert_eq!(timer.stats().cancelled, 1_000);
    assert!(timer.shutdown().is_empty());
}

#[test]
fn a_pending_sleep_completes_when_the_service_shuts_down() {
    let timer = small_timer();
    let sleep = timer.sleep(Duration::from_secs(3600));
    let waiter = std::thread::spawn(move || {
        block_on(sleep);
    });
    std::thread::sleep(Duration::from_millis(20));
    drop(timer.shutdown());
    waiter
        .join()
        .expect("the sleep completed instead of hanging");
    // A sleep made after shutdown completes at once and says it did not elapse.
    let late = timer.sleep(Duration::from_secs(3600));
    assert!(!late.is_elapsed());
    block_on(late);
}

#[test]
fn sleep_and_timeout_are_send_and_unpin() {
    fn assert_traits<T: Send + Unpin>() {}
    assert_traits::<Sleep>();
    assert_traits::<Timeout<std::future::Pending<()>>>();
    fn assert_error<E: std::error::Error + Send + Sync + 'static>() {}
    assert_error::<Elapsed>();
}

/// Audit defect 7: a pending `Sleep` completes at shutdown even while the caller holds
/// what shutdown returned, and a sleep's timer is not handed back as an `Unfired`
/// (whose `run` would mark it elapsed before its deadline).
#[test]
fn a_pending_sleep_completes_at_shutdown_unelapsed_and_is_not_handed_back() {
    let timer = small_timer();
    let sleep = timer.sleep(Duration::from_secs(3600));
    let unfired = timer.shutdown();
    assert!(unfired.is_empty(), "a sleep's timer is not an Unfired");
    let sleep = support::within(WAIT, move || {
        let mut sleep = sleep;
        block_on(&mut sleep);
        sleep
    })
    .expect("the sleep completes at shutdown");
    assert!(!sleep.is_elapsed(), "its deadline has not passed");
    drop(unfired);
}

/// Audit defect 7: with `max_pending` reached, a timeout must not claim its deadline
/// passed: `try_timeout` refuses up front, and `timeout` resolves to an `Elapsed`
/// that says the deadline was refused, not reached.
#[test]
fn under_max_pending_only_try_timeout_is_refused_and_only_shutdown_ends_a_timeout_early() {
    let timer = support::one_shard_timer_bounded(1);
    let _held = timer.schedule(Duration::from_secs(3600), || {}).unwrap();
    let refused = timer.try_timeout(Duration::from_secs(3600), std::future::pending::<()>());
    assert_eq!(
        refused.err(),
        Some(sharded_timer::ScheduleError::TooManyPending { limit: 1 })
    );
    assert!(timer.try_sleep(Duration::from_secs(1)).is_err());
    // The infallible form gets its timer and waits (guarantee 9)...
    let mut timeout = pin!(timer.timeout(Duration::from_secs(3600), std::future::pending::<()>()));
    let mut cx = Context::from_waker(std::task::Waker::noop());
    assert!(timeout.as_mut().poll(&mut cx).is_pending());
    // ...until a shutdown, which ends it and says why.
    drop(timer.shutdown());
    match timeout.as_mut().poll(&mut cx) {
        Poll::Ready(Err(elapsed)) => assert_eq!(
            elapsed.refused(),
            Some(sharded_timer::ScheduleError::Shutdown)
        ),
        other => panic!("shutdown ends the timeout: {other:?}"),
    }
}

/// Sets its flag when dropped: tells when a service dropped its pending timers.
struct DropFlag(Arc<std::sync::atomic::AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn a_sleep_keeps_its_service_running_after_the_last_clone_is_dropped() {
    // A sleep registers with its core's home instead of cloning the service; the home
    // keeps the service alive for it (src/home.rs).
    let sleep = {
        let timer = small_timer();
        timer.sleep(Duration::from_millis(20))
    };
    let start = Instant::now();
    let deadline = sleep.deadline();
    let mut sleep = pin!(sleep);
    block_on(sleep.as_mut());
    assert!(sleep.is_elapsed(), "fired, not abandoned by a shutdown");
    assert_eq!(sleep.refused(), None);
    assert!(Instant::now() >= deadline, "never early");
    assert!(start.elapsed() < WAIT, "fired within the wait bound");
}

#[test]
fn the_service_shuts_down_when_its_last_clone_and_its_last_sleep_are_gone() {
    for sleeps_first in [false, true] {
        let timer = small_timer();
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = DropFlag(dropped.clone());
        // A pending timer whose callback the shutdown drops unrun.
        let _handle = timer
            .schedule(Duration::from_secs(600), move || drop(flag))
            .unwrap();
        let sleep = timer.sleep(Duration::from_secs(600));
        let timeout = timer.timeout(Duration::from_secs(600), std::future::pending::<()>());
        if sleeps_first {
            drop(sleep);
            drop(timeout);
            assert!(!dropped.load(std::sync::atomic::Ordering::SeqCst));
            drop(timer);
        } else {
            drop(timer);
            assert!(
                !dropped.load(std::sync::atomic::Ordering::SeqCst),
                "the sleeps keep the service running"
            );
            drop(sleep);
            assert!(!dropped.load(std::sync::atomic::Ordering::SeqCst));
            drop(timeout);
        }
        // The last of them shut the service down (synchronously: shutdown joins its
        // threads and drops the pending callbacks before returning).
        assert!(
            dropped.load(std::sync::atomic::Ordering::SeqCst),
            "shut down once the last clone and sleep are gone (sleeps first: {sleeps_first})"
        );
    }
}

/// A future pending at every poll.
struct NeverReady;

impl Future for NeverReady {
    type Output = ();
    fn poll(self: std::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        Poll::Pending
    }
}

/// `timeout(d, f)` fixes its deadline at its first pending poll, from the coarse
/// clock's upper bound on the time it was made or the precise now, whichever is
/// earlier: never before the time it was made plus `d`, never after the latest the
/// deadline read before the poll, and at most a generous 2 s late when it fires.
/// Before that poll the deadline is the upper bound, which reads no precise clock: on
/// Linux it is after any precise reading taken once the timeout was made, plus `d`
/// (a deadline read from the precise clock at creation could not be).
#[test]
fn a_timeout_fixes_its_deadline_at_its_first_pending_poll_never_early() {
    const LATE: Duration = Duration::from_secs(2);
    let timer = small_timer();
    let d = Duration::from_millis(40);
    for wait_before_poll in [
        Duration::ZERO,
        Duration::from_millis(10),
        Duration::from_millis(60),
    ] {
        let made = Instant::now();
        let mut timeout = pin!(timer.timeout(d, NeverReady));
        let after_made = Instant::now();
        let latest = timeout.deadline();
        assert!(
            latest >= after_made + d,
            "{wait_before_poll:?}: the bound is before now"
        );
        if cfg!(target_os = "linux") {
            assert!(
                latest > after_made + d,
                "{wait_before_poll:?}: the unfixed deadline came from the precise clock"
            );
        }
        std::thread::sleep(wait_before_poll);
        let polled = timeout
            .as_mut()
            .poll(&mut Context::from_waker(std::task::Waker::noop()));
        let after_poll = Instant::now();
        let fixed = timeout.deadline();
        assert!(fixed >= made + d, "{wait_before_poll:?}: fixed early");
        assert!(
            fixed <= latest,
            "{wait_before_poll:?}: the poll moved it later"
        );
        assert!(
            fixed <= after_poll + d,
            "{wait_before_poll:?}: later than the poll's now"
        );
        match polled {
            Poll::Pending => {
                let result = block_on(timeout.as_mut());
                let at = Instant::now();
                assert!(result.is_err(), "never ready: it elapses");
                assert!(
                    at >= fixed,
                    "{wait_before_poll:?}: elapsed before its deadline"
                );
                assert!(
                    at - fixed < LATE,
                    "{wait_before_poll:?}: {:?} late",
                    at - fixed
                );
            }
            Poll::Ready(result) => {
                // Only if the deadline had passed by the first poll.
                assert!(result.is_err());
                assert!(
                    after_poll >= fixed,
                    "ready at once only when past its deadline"
                );
            }
        }
    }
    assert!(timer.shutdown().is_empty());
}

/// Counts a waker's wakes.
#[derive(Default)]
struct CountWakes(std::sync::atomic::AtomicUsize);

impl Wake for CountWakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Issue 41: the poll that arms a timeout's timer stores its waker in the timer's
/// entry before filing it. A filing refused by a shutdown drops that entry unseen,
/// which finishes it abandoned; the waker must be out by then: the poll completes
/// refused at once, and nobody is woken (the simulation found the spurious wake).
#[test]
fn a_timeout_first_polled_after_shutdown_is_refused_at_once_and_wakes_nobody() {
    let timer = small_timer();
    drop(timer.shutdown());
    let wakes = Arc::new(CountWakes::default());
    let waker = std::task::Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&waker);
    let mut timeout =
        Box::pin(timer.timeout(Duration::from_secs(3600), std::future::pending::<()>()));
    match timeout.as_mut().poll(&mut cx) {
        Poll::Ready(Err(elapsed)) => assert!(elapsed.refused().is_some(), "refused, not elapsed"),
        other => panic!("expected a refusal at the first poll, got {other:?}"),
    }
    assert_eq!(wakes.0.load(std::sync::atomic::Ordering::SeqCst), 0);
    drop(timeout);
    assert_eq!(
        Arc::strong_count(&wakes),
        2,
        "the waker's clones are all gone"
    );
}

/// Issue 41: a timeout whose first poll armed its timer (the waker stored with it) is
/// woken exactly once when the timer fires, and a second poll with another waker
/// re-registers: the new waker is the one woken, the old one dropped.
#[test]
fn a_timeout_armed_at_its_first_poll_wakes_the_last_waker_once() {
    let timer = small_timer();
    let first = Arc::new(CountWakes::default());
    let second = Arc::new(CountWakes::default());
    let first_waker = std::task::Waker::from(first.clone());
    let second_waker = std::task::Waker::from(second.clone());
    let mut timeout = pin!(timer.timeout(Duration::from_millis(30), std::future::pending::<()>()));
    assert!(timeout
        .as_mut()
        .poll(&mut Context::from_waker(&first_waker))
        .is_pending());
    assert!(timeout
        .as_mut()
        .poll(&mut Context::from_waker(&second_waker))
        .is_pending());
    drop(first_waker);
    assert_eq!(
        Arc::strong_count(&first),
        1,
        "the replaced waker was dropped"
    );
    assert!(
        wait_until(WAIT, || second.0.load(std::sync::atomic::Ordering::SeqCst)
            == 1),
        "the timer woke the last waker"
    );
    assert_eq!(first.0.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(matches!(
        timeout
            .as_mut()
            .poll(&mut Context::from_waker(&second_waker)),
        Poll::Ready(Err(_))
    ));
    assert_eq!(
        second.0.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "woken once"
    );
    assert!(timer.shutdown().is_empty());
}
