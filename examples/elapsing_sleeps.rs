//! What a sleep that runs its course costs on a tokio runtime: 200,000 tasks, each
//! awaiting one sleep of 2-22 ms, spawned 1,000 per millisecond, on a 2-worker
//! runtime; the process's CPU time (every thread, `getrusage`) per sleep, for
//! sharded-timer's default service (`ShardedTimer::new()`: a shard per core, callbacks
//! on its pool) or for `tokio::time::sleep`. Three measured rounds after one warm-up.
//!
//! ```sh
//! cargo run --release --example elapsing_sleeps -- sharded-timer
//! cargo run --release --example elapsing_sleeps -- tokio
//! ```
//!
//! A sleep's wake is its timer's whole callback: where it runs decides how many
//! threads a sleep wakes (issue 41: futures are woken on the shard thread).

use std::time::{Duration, Instant};

/// Sleeps per round.
const SLEEPS: usize = 200_000;

/// The process's CPU time so far, user and system, every thread, in seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: all-zero bytes are a valid `rusage` (integers and `timeval`s).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `getrusage` writes the `rusage` it is given a valid pointer to.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

fn main() {
    let peer = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sharded-timer".into());
    let ours = match peer.as_str() {
        "sharded-timer" => true,
        "tokio" => false,
        other => {
            eprintln!("usage: elapsing_sleeps [sharded-timer|tokio], not {other:?}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("a tokio runtime");
    let timer = sharded_timer::ShardedTimer::new();
    for round in 0..4 {
        let cpu = cpu_seconds();
        let started = Instant::now();
        runtime.block_on(async {
            let mut tasks = Vec::with_capacity(SLEEPS);
            for i in 0..SLEEPS {
                let timer = timer.clone();
                let delay = Duration::from_micros(2_000 + (i as u64 % 1_000) * 20);
                tasks.push(tokio::spawn(async move {
                    if ours {
                        timer.sleep(delay).await;
                    } else {
                        tokio::time::sleep(delay).await;
                    }
                }));
                if i % 1_000 == 999 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            for task in tasks {
                task.await.expect("a sleeping task");
            }
        });
        let cpu_ns = (cpu_seconds() - cpu) * 1e9 / SLEEPS as f64;
        if round > 0 {
            println!(
                "{peer}: {cpu_ns:.0} CPU ns per sleep, {:?} for the round",
                started.elapsed()
            );
        }
    }
    drop(timer.shutdown());
}
