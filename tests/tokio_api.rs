//! tokio's time API as a drop-in: `ShardedTimer::now` under a `ManualClock`,
//! `timeout_at`, each `Interval` reset, the `Stream` (feature `stream`), the
//! process-wide service with its free functions (`sharded_timer::time`), tokio's type
//! paths and `time::Instant`, and the current service (`ShardedTimer::enter`).

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
    idle.as_mut()
        .reset((timer.now() + Duration::from_secs(2)).into());
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
    let start = sharded_timer::time::Instant::from_std(timer.now());
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
    let start = sharded_timer::time::Instant::from_std(timer.now());
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
    // Its shard runs; its callback pool has not started: nothing was handed to it.
    let named = |name: &str| {
        std::fs::read_dir("/proc/self/task").map_or(0, |tasks| {
            tasks
                .flatten()
                .filter(|task| {
                    std::fs::read_to_string(task.path().join("comm"))
                        .is_ok_and(|comm| comm.trim_end() == name)
                })
                .count()
        })
    };
    let has_proc = std::path::Path::new("/proc/self/task").exists();
    if has_proc {
        // A thread names itself once it runs: wait for the shard's.
        let started = std::time::Instant::now();
        while named("global-s0") == 0 && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(MS);
        }
        assert_eq!(named("global-s0"), 1, "the shard thread");
        assert_eq!(named("global-w0"), 0, "no pool thread before a callback");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        use sharded_timer::time::{interval, sleep, sleep_until, timeout, timeout_at};
        let start = std::time::Instant::now();
        sleep(2 * MS).await;
        assert!(start.elapsed() >= 2 * MS);
        sleep_until((std::time::Instant::now() + MS).into()).await;
        assert!(timeout(MS, pending::<()>()).await.is_err());
        assert!(
            timeout_at((std::time::Instant::now() + MS).into(), pending::<()>())
                .await
                .is_err()
        );
        assert_eq!(timeout(Duration::from_secs(5), async { 3 }).await, Ok(3));
        let mut ticks = interval(MS);
        let first = ticks.tick().await;
        let second = ticks.tick().await;
        assert!(second >= first + MS);
    });
    assert_eq!(sharded_timer::global().stats().shards.len(), 1);
    if has_proc {
        // The sleeps' wake-ups went through the pool: it started with the first.
        assert_eq!(
            named("global-w0"),
            1,
            "the pool's one worker, started on demand"
        );
    }
}

/// tokio-style code, written against `tokio::time`'s paths with only the import
/// changed, compiles and behaves: the types, `time::Instant` with its arithmetic and
/// its comparisons with `std::time::Instant` both ways, `Timeout`'s accessors,
/// `Elapsed` into `std::io::Error`, and instants of either kind where one is taken.
#[test]
fn tokio_style_code_compiles_against_the_namespace_with_an_import_change() {
    use sharded_timer::time::{
        self, error::Elapsed, Duration, Instant, Interval, MissedTickBehavior, Sleep, Timeout,
    };
    struct Conn {
        idle: Pin<Box<Sleep>>,
        call: Option<Timeout<std::future::Ready<u8>>>,
        heartbeat: Interval,
        opened: Instant,
    }
    fn timed_out(elapsed: Elapsed) -> std::io::Error {
        elapsed.into()
    }
    let clock = ManualClock::new();
    let timer = service(&clock);
    let _current = timer.enter();
    let opened = Instant::now();
    assert_eq!(
        opened,
        clock.now(),
        "now() reads the current service's clock"
    );
    let mut conn = Conn {
        idle: Box::pin(time::sleep_until(opened + Duration::from_secs(30))),
        call: Some(time::timeout(MS, std::future::ready(7))),
        heartbeat: time::interval_at(opened, Duration::from_secs(10)),
        opened,
    };
    assert_eq!(conn.idle.deadline(), opened + Duration::from_secs(30));
    assert!(opened + Duration::from_secs(30) == conn.idle.deadline());
    conn.idle.as_mut().reset(opened + Duration::from_secs(60));
    conn.idle
        .as_mut()
        .reset((clock.now() + Duration::from_secs(60)).into());
    assert_eq!(
        conn.heartbeat.missed_tick_behavior(),
        MissedTickBehavior::Burst,
        "tokio's default"
    );
    let mut call = conn.call.take().unwrap();
    assert_eq!(call.get_ref().clone().into_inner(), 7);
    assert_eq!(call.get_mut().clone().into_inner(), 7);
    assert_eq!(call.into_inner().into_inner(), 7);
    let mut later = conn.opened;
    later += Duration::from_secs(5);
    later -= Duration::from_secs(2);
    assert_eq!(later - conn.opened, Duration::from_secs(3));
    assert_eq!(
        conn.opened - later,
        Duration::ZERO,
        "saturating, as tokio's"
    );
    assert_eq!(later.duration_since(conn.opened), Duration::from_secs(3));
    assert_eq!(conn.opened.checked_duration_since(later), None);
    assert_eq!(later.checked_sub(Duration::from_secs(3)), Some(conn.opened));
    assert!(later > conn.opened && later > clock.now());
    assert!(clock.now() < later, "std on the left compares too");
    assert_eq!(later.into_std() - clock.now(), Duration::from_secs(3));
    assert_eq!(Instant::from_std(later.into_std()), later);
    clock.advance(Duration::from_secs(4));
    assert_eq!(conn.opened.elapsed(), Duration::from_secs(4));
    let mut ticks = pin!(conn.heartbeat.tick());
    assert_eq!(poll_once(ticks.as_mut()), Poll::Ready(opened));
    let mut late = pin!(time::timeout(MS, pending::<()>()));
    assert!(poll_once(late.as_mut()).is_pending());
    clock.advance(MS);
    let Poll::Ready(Err(elapsed)) = poll_once(late.as_mut()) else {
        panic!("the timeout elapsed");
    };
    let io = timed_out(elapsed);
    assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
}

#[test]
fn an_entered_service_is_current_until_its_guard_drops_and_guards_nest() {
    use sharded_timer::time::Instant;
    let outer_clock = ManualClock::new();
    let outer = service(&outer_clock);
    let inner_clock = ManualClock::new();
    let inner = service(&inner_clock);
    inner_clock.advance(Duration::from_secs(3600));
    {
        let _outer = outer.enter();
        assert_eq!(Instant::now(), outer_clock.now());
        {
            let _inner = inner.enter();
            assert_eq!(Instant::now(), inner_clock.now());
            let sleep = sharded_timer::time::sleep(Duration::from_secs(1));
            assert_eq!(sleep.deadline(), inner_clock.now() + Duration::from_secs(1));
        }
        assert_eq!(Instant::now(), outer_clock.now(), "the outer one again");
        outer_clock.advance(Duration::from_secs(30));
        assert_eq!(Instant::now(), outer_clock.now());
    }
    // Dropping the outer guard makes the process-wide service current again, which
    // this binary's other test configures: tests/paused_time.rs checks it.
}

/// `ManualClock::next_deadline`: the earliest pending timer of the clock's services,
/// timers still in a shard's ring included: never later than it (earlier while the
/// timer waits in a higher level of a wheel), and moving the clock to each answer in
/// turn reaches it exactly, firing nothing before it.
#[test]
fn next_deadline_is_never_after_the_earliest_timer_and_moving_to_it_reaches_it() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let clock = ManualClock::new();
    let timer = service(&clock);
    let other = service(&clock);
    let start = clock.now();
    assert_eq!(clock.next_deadline(), None, "nothing pending");
    let fired = Arc::new(AtomicUsize::new(0));
    let count = |fired: &Arc<AtomicUsize>| {
        let fired = fired.clone();
        move || {
            fired.fetch_add(1, Ordering::SeqCst);
        }
    };
    // Moves the clock to each answer until a timer fires; returns how many moves.
    let reach = |expected: std::time::Instant, fired_before: usize| {
        let mut moves = 0;
        while fired.load(Ordering::SeqCst) == fired_before {
            let next = clock.next_deadline().expect("a timer is pending");
            assert!(next <= expected, "never later: {next:?} > {expected:?}");
            clock.advance(next.saturating_duration_since(clock.now()));
            moves += 1;
            assert!(moves < 64, "a bounded cascade");
        }
        assert_eq!(clock.now(), expected, "exactly at the deadline");
        moves
    };
    let hour = timer
        .schedule(Duration::from_secs(3600), count(&fired))
        .unwrap();
    let _five = other
        .schedule(Duration::from_secs(5), count(&fired))
        .unwrap();
    // A sleep's timer counts too: it comes first, and once dropped it is gone.
    let sleep = timer.sleep(Duration::from_secs(2));
    assert!(clock.next_deadline().unwrap() <= start + Duration::from_secs(2));
    drop(sleep);
    reach(start + Duration::from_secs(5), 0);
    assert_eq!(
        fired.load(Ordering::SeqCst),
        1,
        "the five seconds' timer alone"
    );
    reach(start + Duration::from_secs(3600), 1);
    assert_eq!(fired.load(Ordering::SeqCst), 2);
    assert!(!hour.cancel(), "it fired");
    assert_eq!(clock.next_deadline(), None);
}
