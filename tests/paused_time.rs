//! Paused time as tokio's (feature `tokio`): `#[sharded_timer::test(start_paused =
//! true)]`, `time::pause()` inside a plain `#[tokio::test]`, auto-advance, `advance`,
//! `Instant::now()` on the paused clock, and parallel tests that never share a clock.
//! Every test here runs in parallel with the others (the default harness), each
//! asserting exact paused times: a shared clock would make them fail.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sharded_timer::time::{self, Duration, Instant};

const HOUR: Duration = Duration::from_secs(3600);

/// Wall-clock bound on a test whose paused hours must take no real time.
const REAL_BOUND: Duration = Duration::from_secs(5);

#[sharded_timer::test(start_paused = true)]
async fn an_hour_sleep_returns_at_once_at_exactly_one_hour_of_paused_time() {
    let real = std::time::Instant::now();
    let start = Instant::now();
    time::sleep(HOUR).await;
    assert_eq!(
        Instant::now() - start,
        HOUR,
        "exactly the hour, on the paused clock"
    );
    assert!(
        real.elapsed() < REAL_BOUND,
        "no real hour: {:?}",
        real.elapsed()
    );
}

/// Several paused tests with different sleeps, in parallel: each sees exactly its own
/// paused time.
macro_rules! parallel_paused_test {
    ($name:ident, $secs:expr) => {
        #[sharded_timer::test(start_paused = true)]
        async fn $name() {
            let start = Instant::now();
            for _ in 0..3 {
                time::sleep(Duration::from_secs($secs)).await;
            }
            assert_eq!(Instant::now() - start, Duration::from_secs(3 * $secs));
            let timed_out =
                time::timeout(Duration::from_secs($secs), std::future::pending::<()>()).await;
            assert!(timed_out.is_err());
            assert_eq!(Instant::now() - start, Duration::from_secs(4 * $secs));
        }
    };
}

parallel_paused_test!(parallel_paused_clock_of_7_s, 7);
parallel_paused_test!(parallel_paused_clock_of_11_s, 11);
parallel_paused_test!(parallel_paused_clock_of_13_s, 13);
parallel_paused_test!(parallel_paused_clock_of_1000_s, 1000);

/// `time::pause()` inside a plain `#[tokio::test]` (with tokio's `test-util`), as tokio
/// users write it.
#[tokio::test]
async fn pause_inside_a_plain_tokio_test_auto_advances() {
    time::pause();
    let start = Instant::now();
    let tokio_start = tokio::time::Instant::now();
    time::sleep(Duration::from_secs(90)).await;
    // Tokio's paused clock, paused here off its millisecond grid, lands on the grid:
    // ours reads what tokio's reads, as a tokio sleep would have.
    let elapsed = start.elapsed();
    assert_eq!(elapsed, tokio_start.elapsed(), "ours reads tokio's clock");
    assert!(
        elapsed >= Duration::from_secs(90),
        "never early: {elapsed:?}"
    );
    assert!(
        elapsed <= Duration::from_millis(90_001),
        "within tokio's tick: {elapsed:?}"
    );
}

#[sharded_timer::test(start_paused = true)]
async fn instant_now_follows_the_paused_clock_and_advance_moves_it() {
    let start = Instant::now();
    assert_eq!(Instant::now(), start, "paused: no time passes by itself");
    time::advance(Duration::from_millis(1500)).await;
    assert_eq!(Instant::now() - start, Duration::from_millis(1500));
    assert_eq!(start.elapsed(), Duration::from_millis(1500));
}

#[sharded_timer::test(start_paused = true)]
async fn advance_fires_what_it_made_due_and_yields_to_the_woken_task() {
    let start = Instant::now();
    let done = Arc::new(AtomicUsize::new(0));
    let seen = done.clone();
    let sleeper = tokio::spawn(async move {
        time::sleep(Duration::from_secs(10)).await;
        seen.store(1, Ordering::SeqCst);
        Instant::now()
    });
    // Let the sleeper arm its sleep.
    tokio::task::yield_now().await;
    time::advance(Duration::from_secs(9)).await;
    assert_eq!(done.load(Ordering::SeqCst), 0, "never early");
    time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        done.load(Ordering::SeqCst),
        1,
        "advance returned after the woken task ran"
    );
    assert_eq!(sleeper.await.unwrap() - start, Duration::from_secs(10));
}

#[sharded_timer::test(start_paused = true)]
async fn a_runnable_task_never_sees_time_jump() {
    const SPINS: usize = 200;
    let spun = Arc::new(AtomicUsize::new(0));
    let counter = spun.clone();
    let start = Instant::now();
    let spinner = tokio::spawn(async move {
        for _ in 0..SPINS {
            assert_eq!(
                Instant::now(),
                start,
                "time moved while this task was runnable"
            );
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
        }
    });
    time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        spun.load(Ordering::SeqCst),
        SPINS,
        "the sleeper completed only once the spinner was done"
    );
    assert_eq!(Instant::now() - start, Duration::from_secs(5));
    spinner.await.unwrap();
}

#[sharded_timer::test(start_paused = true)]
async fn an_interval_bursts_by_default_and_ticks_on_the_paused_grid() {
    let start = Instant::now();
    let mut every = time::interval(Duration::from_secs(10));
    assert_eq!(
        every.missed_tick_behavior(),
        time::MissedTickBehavior::Burst
    );
    assert_eq!(every.tick().await, start);
    assert_eq!(every.tick().await, start + Duration::from_secs(10));
    time::advance(Duration::from_secs(35)).await;
    // Burst: 20, 30 and 40 at once, then 50 on the grid.
    for due in [20, 30, 40] {
        assert_eq!(every.tick().await, start + Duration::from_secs(due));
    }
    assert_eq!(Instant::now() - start, Duration::from_secs(45));
    assert_eq!(every.tick().await, start + Duration::from_secs(50));
    assert_eq!(Instant::now() - start, Duration::from_secs(50));
}

#[sharded_timer::test(start_paused = true)]
async fn a_later_sleep_armed_while_another_waits_is_not_skipped() {
    let start = Instant::now();
    let long = tokio::spawn(time::sleep(Duration::from_secs(100)));
    tokio::task::yield_now().await;
    // Armed after the mirror looked at the 100 s sleep: the mirror must look again.
    time::sleep(Duration::from_secs(3)).await;
    assert_eq!(Instant::now() - start, Duration::from_secs(3));
    long.await.unwrap();
    assert_eq!(Instant::now() - start, Duration::from_secs(100));
}

#[sharded_timer::test(start_paused = true)]
async fn resume_lets_the_paused_clock_follow_real_time_again() {
    let start = Instant::now();
    time::sleep(HOUR).await;
    time::resume();
    let real = std::time::Instant::now();
    time::sleep(Duration::from_millis(20)).await;
    let real = real.elapsed();
    assert!(
        real >= Duration::from_millis(20),
        "real time passed: {real:?}"
    );
    let paused = Instant::now() - start;
    assert!(paused >= HOUR + Duration::from_millis(20), "{paused:?}");
    assert!(paused < HOUR + REAL_BOUND, "{paused:?}");
}

#[test]
fn pause_without_a_runtime_moves_only_with_advance() {
    time::pause();
    let start = Instant::now();
    std::thread::sleep(Duration::from_millis(2));
    assert_eq!(Instant::now(), start);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(time::advance(Duration::from_secs(2)));
    assert_eq!(Instant::now() - start, Duration::from_secs(2));
}

#[test]
fn another_thread_and_a_dropped_guard_fall_back_to_the_system_clock() {
    let clock = sharded_timer::ManualClock::new();
    let timer = sharded_timer::ShardedTimer::builder()
        .clock(clock.clone())
        .shards(1)
        .pin_cores(false)
        .build()
        .unwrap();
    let guard = timer.enter();
    assert_eq!(Instant::now(), clock.now());
    clock.advance(HOUR);
    // Another thread never sees this thread's current service.
    let there = std::thread::spawn(|| {
        let before = std::time::Instant::now();
        (before, Instant::now(), std::time::Instant::now())
    })
    .join()
    .unwrap();
    assert!(there.0 <= there.1 && there.1 <= there.2, "the system clock");
    drop(guard);
    let before = std::time::Instant::now();
    let now = Instant::now();
    assert!(
        before <= now && now <= std::time::Instant::now(),
        "the system clock again"
    );
    assert!(
        now < clock.now(),
        "not the entered manual clock, an hour ahead"
    );
}

#[test]
fn elapsed_converts_into_a_timed_out_io_error() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        time::pause();
        let elapsed = time::timeout(Duration::from_secs(1), std::future::pending::<()>())
            .await
            .unwrap_err();
        let io: std::io::Error = elapsed.into();
        assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
    });
}

#[test]
#[should_panic(expected = "paused time needs a tokio runtime with timers enabled")]
fn pause_in_a_runtime_without_timers_panics_instead_of_hanging() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async { time::pause() });
}

/// The attribute without `start_paused` is tokio's: here a multi-thread runtime on
/// the system clock (the process-wide service), its workers' tasks included.
#[sharded_timer::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_builds_a_multi_thread_runtime_on_the_system_clock() {
    let real = std::time::Instant::now();
    let start = Instant::now();
    let slept = tokio::spawn(async {
        time::sleep(Duration::from_millis(2)).await;
        Instant::now()
    })
    .await
    .unwrap();
    assert!(slept - start >= Duration::from_millis(2), "never early");
    assert!(
        real.elapsed() >= Duration::from_millis(2),
        "real time passed"
    );
}
