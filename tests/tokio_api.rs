//! tokio's time API as a drop-in: `ShardedTimer::now` under a `ManualClock`,
//! `timeout_at`, each `Interval` reset, the `Stream` (feature `stream`), and the
//! process-wide service with its free functions (`sharded_timer::time`).

use std::future::{pending, Future};
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use sharded_timer::{Callbacks, ManualClock, ShardedTimer};

const MS: Duration = Duration::from_millis(1);

fn service(clock: &ManualClock) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(1)
        .callbacks(Callbacks::inline())
        .pin_cores(false)
        .thread_name("tokio-api")
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn now_is_the_manual_clock_s_so_deadlines_computed_from_it_are_exact() {
    let clock = ManualClock::new();
    let timer = service(&clock);
    assert_eq!(timer.now(), clock.now());
    let mut idle = pin!(timer.sleep(2 * MS));
    clock.advance(MS);
    // A packet arrived: 2 s idle from the service's now, not the wall clock's.
    idle.as_mut().reset(timer.now() + Duration::from_secs(2));
    clock.advance(Duration::from_secs(2) - Duration::from_nanos(1));
    assert!(
        poll_once(idle.as_mut()).is_pending(),
        "not a nanosecond early"
    );
    clock.advance(Duration::from_nanos(1));
    assert!(poll_once(idle.as_mut()).is_ready(), "exactly on time");
    assert_eq!(timer.now(), clock.now());
}

#[test]
fn timeout_at_gives_up_at_its_instant() {
    let clock = ManualClock::new();
    let timer = service(&clock);
    let deadline = timer.now() + 5 * MS;
    let mut timeout = pin!(timer.timeout_at(deadline, pending::<()>()));
    assert_eq!(timeout.deadline(), deadline);
    assert!(poll_once(timeout.as_mut()).is_pending());
    clock.advance(4 * MS);
    assert!(poll_once(timeout.as_mut()).is_pending());
    clock.advance(MS);
    assert!(matches!(poll_once(timeout.as_mut()), Poll::Ready(Err(e)) if e.refused().is_none()));
    let mut ready = pin!(timer.timeout_at(timer.now(), async { 7 }));
    assert!(matches!(poll_once(ready.as_mut()), Poll::Ready(Ok(7))));
}

#[test]
fn each_interval_reset_moves_the_next_tick() {
    let clock = ManualClock::new();
    let timer = service(&clock);
    let start = timer.now();
    let mut interval = timer.interval(10 * MS);
    assert_eq!(poll_once(pin!(interval.tick())), Poll::Ready(start));

    interval.reset_after(3 * MS);
    clock.advance(2 * MS);
    assert!(poll_once(pin!(interval.tick())).is_pending());
    clock.advance(MS);
    assert_eq!(
        poll_once(pin!(interval.tick())),
        Poll::Ready(start + 3 * MS)
    );

    interval.reset_immediately();
    assert_eq!(
        poll_once(pin!(interval.tick())),
        Poll::Ready(start + 3 * MS)
    );
    assert!(
        poll_once(pin!(interval.tick())).is_pending(),
        "then a period on"
    );
    clock.advance(10 * MS);
    assert_eq!(
        poll_once(pin!(interval.tick())),
        Poll::Ready(start + 13 * MS)
    );

    interval.reset_at(start + 20 * MS);
    clock.advance(6 * MS);
    assert!(
        poll_once(pin!(interval.tick())).is_pending(),
        "19 ms < 20 ms"
    );
    clock.advance(MS);
    assert_eq!(
        poll_once(pin!(interval.tick())),
        Poll::Ready(start + 20 * MS)
    );

    interval.reset();
    clock.advance(9 * MS);
    assert!(poll_once(pin!(interval.tick())).is_pending());
    clock.advance(MS);
    assert_eq!(
        poll_once(pin!(interval.tick())),
        Poll::Ready(start + 30 * MS)
    );
}

#[cfg(feature = "stream")]
#[test]
fn an_interval_is_a_stream_of_due_instants() {
    use futures_core::Stream;
    let clock = ManualClock::new();
    let timer = service(&clock);
    let start = timer.now();
    let mut ticks = pin!(timer.interval(5 * MS));
    let mut cx = Context::from_waker(Waker::noop());
    assert_eq!(ticks.as_mut().poll_next(&mut cx), Poll::Ready(Some(start)));
    assert!(ticks.as_mut().poll_next(&mut cx).is_pending());
    clock.advance(5 * MS);
    assert_eq!(
        ticks.as_mut().poll_next(&mut cx),
        Poll::Ready(Some(start + 5 * MS))
    );
}

/// The process-wide service: configured once by `build_global`, then what `global()`
/// and the free functions use; a second configuration is refused. (One test: the
/// service is per process.)
#[test]
fn the_process_wide_service_is_configured_once_and_serves_the_free_functions() {
    let global = ShardedTimer::builder()
        .shards(1)
        .executor_threads(1)
        .pin_cores(false)
        .thread_name("global")
        .build_global()
        .expect("the first configuration wins");
    assert!(std::ptr::eq(global, sharded_timer::global()));
    assert!(matches!(
        ShardedTimer::builder().build_global(),
        Err(sharded_timer::BuildError::GlobalExists)
    ));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        use sharded_timer::time::{interval, sleep, sleep_until, timeout, timeout_at};
        let start = std::time::Instant::now();
        sleep(2 * MS).await;
        assert!(start.elapsed() >= 2 * MS);
        sleep_until(std::time::Instant::now() + MS).await;
        assert!(timeout(MS, pending::<()>()).await.is_err());
        assert!(timeout_at(std::time::Instant::now() + MS, pending::<()>())
            .await
            .is_err());
        assert_eq!(timeout(Duration::from_secs(5), async { 3 }).await, Ok(3));
        let mut ticks = interval(MS);
        let first = ticks.tick().await;
        let second = ticks.tick().await;
        assert!(second >= first + MS);
    });
    assert_eq!(sharded_timer::global().stats().shards.len(), 1);
}
