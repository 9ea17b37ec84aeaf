//! Testing a retry loop with `ManualClock`: the loop under test backs off 2 s between
//! attempts under a 7 s overall `timeout`; the test runs its 7 simulated seconds in
//! microseconds, and checks the attempts landed at 0, 2, 4 and 6 s exactly.
//!
//! Run: `cargo run --example retry_with_manual_clock`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sharded_timer::{ManualClock, ShardedTimer};

/// The code under test: tries `attempt` every 2 s until it succeeds or 7 s pass.
/// It reads the time through `timer.now()`, never `Instant::now()`, so the same code
/// runs on the system clock in production and on a `ManualClock` in tests.
async fn retry(timer: &ShardedTimer, mut attempt: impl FnMut(Instant) -> bool) -> bool {
    let mut every_2s = timer.interval(Duration::from_secs(2));
    let attempts = async {
        loop {
            let at = every_2s.tick().await;
            if attempt(at.into_std()) {
                return;
            }
        }
    };
    timer
        .timeout(Duration::from_secs(7), attempts)
        .await
        .is_ok()
}

fn main() {
    let clock = ManualClock::new();
    let timer = ShardedTimer::builder()
        .shards(1)
        .clock(clock.clone())
        .build()
        .expect("the service builds");
    let start = clock.now();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    let task = runtime.spawn({
        let timer = timer.clone();
        async move {
            // The backend never answers: every attempt fails.
            retry(&timer, |at| {
                record.lock().unwrap().push(at - start);
                false
            })
            .await
        }
    });
    // Drive the simulated time a second at a time, letting the task run between.
    let wall = Instant::now();
    for _ in 0..8 {
        runtime.block_on(tokio::task::yield_now());
        clock.advance(Duration::from_secs(1));
    }
    let succeeded = runtime.block_on(task).expect("the task ran");
    let attempts = seen.lock().unwrap().clone();
    println!(
        "attempts at {attempts:?}, gave up: {}, in {:?} of wall time",
        !succeeded,
        wall.elapsed()
    );
    assert!(!succeeded);
    assert_eq!(
        attempts,
        [0, 2, 4, 6].map(Duration::from_secs).to_vec(),
        "one attempt every 2 s, none after the 7 s timeout"
    );
}
