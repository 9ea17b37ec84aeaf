//! Audit of `timeout(d, f)`'s deadline under paused time (feature `tokio`): on a
//! paused thread the deadline is exactly the paused time the `Timeout` was made plus
//! `d`, whenever it is first polled, and it elapses exactly there.

use std::future::{pending, Future};
use std::pin::pin;
use std::task::Poll;

use sharded_timer::time::{self, Duration, Instant};

/// tokio's paused clock moves on a 1 ms grid: what auto-advance may add.
const TOKIO_GRID: Duration = Duration::from_millis(1);

/// Polls `future` once inside the running task; its outcome.
async fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut *future).poll(cx))).await
}

/// Made at paused time `start`, moved 4 s by `advance` before its first poll, a 10 s
/// timeout keeps `start + 10 s` and elapses exactly there (not 10 s after the poll).
#[sharded_timer::test(start_paused = true)]
async fn a_paused_timeout_first_polled_after_advance_elapses_exactly_at_made_plus_d() {
    let start = Instant::now();
    let d = Duration::from_secs(10);
    let mut timeout = pin!(time::timeout(d, pending::<()>()));
    assert_eq!(timeout.deadline(), start + d, "before the first poll");
    time::advance(Duration::from_secs(4)).await;
    assert!(poll_once(&mut timeout).await.is_pending());
    assert_eq!(timeout.deadline(), start + d, "the poll kept it");
    let result = timeout.as_mut().await;
    assert_eq!(result.map_err(|e| e.refused()), Err(None));
    assert_eq!(Instant::now() - start, d, "elapsed exactly at made + d");
}

/// Zero, one nanosecond and a millisecond and a nanosecond on the paused clock: the
/// deadline is exactly `made + d`; zero elapses at the first pending poll with no time
/// passing; the others elapse no earlier, and at most tokio's 1 ms grid later.
#[sharded_timer::test(start_paused = true)]
async fn paused_timeouts_of_tiny_delays_are_exact_and_never_early() {
    for d in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_nanos(1_000_001),
        Duration::from_millis(4),
    ] {
        let start = Instant::now();
        let mut timeout = pin!(time::timeout(d, pending::<()>()));
        assert_eq!(timeout.deadline(), start + d, "{d:?}");
        if d == Duration::ZERO {
            assert_eq!(
                poll_once(&mut timeout)
                    .await
                    .map(|r| r.map_err(|e| e.refused())),
                Poll::Ready(Err(None)),
                "zero elapses at the first pending poll"
            );
            assert_eq!(Instant::now(), start, "with no time passing");
            continue;
        }
        let result = timeout.as_mut().await;
        assert_eq!(result.map_err(|e| e.refused()), Err(None), "{d:?}");
        let elapsed = Instant::now() - start;
        assert!(elapsed >= d, "{d:?}: elapsed early at {elapsed:?}");
        assert!(elapsed <= d + TOKIO_GRID, "{d:?}: {elapsed:?}");
        assert_eq!(timeout.deadline(), start + d, "{d:?}: fixed at creation");
    }
}

/// tokio's own clock moved first (`tokio::time::advance`): a timeout made afterwards
/// counts from the moved time, as tokio's would.
#[sharded_timer::test(start_paused = true)]
async fn a_paused_timeout_made_after_tokio_advanced_counts_from_tokios_now() {
    let start = Instant::now();
    let tokio_start = tokio::time::Instant::now();
    tokio::time::advance(Duration::from_secs(3)).await;
    let d = Duration::from_secs(2);
    let timeout = time::timeout(d, pending::<()>());
    assert_eq!(
        Instant::now() - start,
        Duration::from_secs(3),
        "ours follows"
    );
    assert_eq!(timeout.deadline(), start + Duration::from_secs(5));
    assert_eq!(timeout.await.map_err(|e| e.refused()), Err(None));
    assert_eq!(Instant::now() - start, Duration::from_secs(5));
    assert_eq!(tokio_start.elapsed(), Duration::from_secs(5));
}

/// Made at `start`, then the task sleeps past its deadline on tokio's clock (tokio
/// auto-advances; ours follows): the first poll finds the deadline past and completes
/// at once, as tokio's `timeout` would, and the paused time does not move further.
///
/// Observed: the first poll is `Pending` although `Instant::now()` (12 s) is past the
/// deadline (10 s): the poll compares with the paused service's clock, which the
/// mirror has not yet brought up to tokio's (nothing of ours was armed while tokio
/// slept); the timeout then elapses at the next poll, still at 12 s. Not from the
/// audited change: a manual clock's deadline is fixed at creation and armed through the
/// same past check as before it.
#[sharded_timer::test(start_paused = true)]
async fn a_paused_timeout_first_polled_after_its_deadline_elapses_at_that_poll() {
    let start = Instant::now();
    let mut timeout = pin!(time::timeout(Duration::from_secs(10), pending::<()>()));
    tokio::time::sleep(Duration::from_secs(12)).await;
    let first = poll_once(&mut timeout).await;
    let now = Instant::now() - start;
    assert_eq!(
        first.map(|r| r.map_err(|e| e.refused())),
        Poll::Ready(Err(None)),
        "past at its first poll (paused time {now:?})"
    );
    assert_eq!(now, Duration::from_secs(12));
    assert_eq!(timeout.deadline(), start + Duration::from_secs(10));
}

/// In `tokio::select!` on paused time: a timeout that loses to a shorter tokio sleep
/// is dropped (and time stops there); one that wins against a longer tokio sleep
/// elapses exactly at `made + d` on the paused clock (within tokio's grid).
#[sharded_timer::test(start_paused = true)]
async fn a_paused_timeout_in_select_loses_and_wins_on_exact_paused_times() {
    let start = Instant::now();
    tokio::select! {
        _ = time::timeout(Duration::from_secs(30), pending::<()>()) => {
            panic!("30 s cannot pass before 5 s");
        }
        () = tokio::time::sleep(Duration::from_secs(5)) => {}
    }
    assert_eq!(Instant::now() - start, Duration::from_secs(5));
    let made = Instant::now();
    tokio::select! {
        result = time::timeout(Duration::from_millis(1500), pending::<()>()) => {
            assert_eq!(result.map_err(|e| e.refused()), Err(None));
        }
        () = tokio::time::sleep(Duration::from_secs(60)) => {
            panic!("the timeout must win");
        }
    }
    let elapsed = Instant::now() - made;
    assert!(elapsed >= Duration::from_millis(1500), "early: {elapsed:?}");
    assert!(
        elapsed <= Duration::from_millis(1500) + TOKIO_GRID,
        "{elapsed:?}"
    );
}

/// `Duration::MAX` on the paused clock saturates at the far future (the same instant
/// as `sleep(Duration::MAX)`'s), before and after the first poll; no panic.
#[sharded_timer::test(start_paused = true)]
async fn a_paused_timeout_of_duration_max_saturates_at_the_far_future() {
    let far = time::sleep(Duration::MAX).deadline();
    let mut timeout = pin!(time::timeout(Duration::MAX, pending::<()>()));
    assert_eq!(timeout.deadline(), far);
    assert!(poll_once(&mut timeout).await.is_pending());
    assert_eq!(timeout.deadline(), far);
}
