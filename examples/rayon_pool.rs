//! Callbacks on the application's own rayon pool (feature `rayon`): fired timers run
//! as rayon jobs, beside the rest of the program's parallel work.
//!
//! Run: `cargo run --example rayon_pool --features rayon`.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sharded_timer::{Callbacks, ShardedTimer};

fn main() {
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .thread_name(|k| format!("app-rayon-{k}"))
            .build()
            .expect("a rayon pool"),
    );
    let timer = ShardedTimer::builder()
        .callbacks(Callbacks::rayon(pool))
        .build()
        .expect("the service builds");
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    for k in 0..10u64 {
        let tx = tx.clone();
        let deadline = start + Duration::from_millis(5 * k);
        timer
            .schedule_at(deadline, move || {
                let thread = std::thread::current().name().unwrap_or("?").to_owned();
                tx.send((k, Instant::now() >= deadline, thread)).unwrap();
            })
            .expect("scheduled");
    }
    drop(tx);
    let mut fired: Vec<_> = rx.iter().collect();
    fired.sort();
    for (k, on_time, thread) in &fired {
        println!("timer {k}: never early: {on_time}, ran on {thread}");
    }
    assert_eq!(fired.len(), 10);
    assert!(fired
        .iter()
        .all(|(_, on_time, thread)| *on_time && thread.starts_with("app-rayon")));
}
