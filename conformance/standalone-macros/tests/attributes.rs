//! `#[sharded_timer::test]`, every flavour, in a crate whose only dependency is
//! `sharded-timer` (it failed with E0433: cannot find `tokio` in the crate root).

use sharded_timer::time::{self, Duration, Instant};

#[sharded_timer::test(start_paused = true)]
async fn a_paused_test_sleeps_an_hour_at_once() {
    let wall = std::time::Instant::now();
    let start = Instant::now();
    time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(start.elapsed(), Duration::from_secs(3600));
    assert!(wall.elapsed() < Duration::from_secs(5));
}

#[sharded_timer::test]
async fn a_plain_test_runs_on_real_time() {
    let wall = std::time::Instant::now();
    time::sleep(Duration::from_millis(5)).await;
    assert!(wall.elapsed() >= Duration::from_millis(5));
}

#[sharded_timer::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_thread_test_runs() {
    let outcome = time::timeout(Duration::from_secs(5), async { 7 }).await;
    assert_eq!(outcome, Ok(7));
}
