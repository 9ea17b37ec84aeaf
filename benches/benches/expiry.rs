//! Timers fired per second when 1e6 come due over 100 ms, callback trivial (it counts),
//! side by side with the peers.
//!
//! Measured: from the first deadline until the last callback has run, for 1e6 timers
//! whose deadlines are spread evenly over 100 ms (so 10 M/s is the most any timer can
//! show: keeping up means about 100 ms). Setup (scheduling, from 2 threads, with a
//! 1.5 s lead) is outside the timing. Resident set: the 1e6 timers. Tick: 1 ms.
//!
//! Run: `cargo bench -p sharded-timer-benches --bench expiry`.

#![allow(
    missing_docs,
    reason = "criterion_group! and criterion_main! generate undocumented items"
)]

use sharded_timer_peers as peers;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use peers::Kind;

const TIMERS: u64 = 1_000_000;
const SPREAD: Duration = Duration::from_millis(100);
const LEAD: Duration = Duration::from_millis(1_500);

fn expiry(c: &mut Criterion) {
    let mut group = c.benchmark_group("expiry");
    group.throughput(Throughput::Elements(TIMERS));
    for kind in Kind::ALL {
        let peer = kind.start();
        group.bench_function(BenchmarkId::new(kind.name(), TIMERS), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let fired = Arc::new(AtomicU64::new(0));
                    let first = Instant::now() + LEAD;
                    std::thread::scope(|scope| {
                        for producer in 0..2u64 {
                            let (peer, fired) = (&peer, fired.clone());
                            scope.spawn(move || {
                                peers::pin_producer(producer as usize);
                                for i in (producer..TIMERS).step_by(2) {
                                    let deadline = first + SPREAD.mul_f64(i as f64 / TIMERS as f64);
                                    let fired = fired.clone();
                                    let delay = deadline.saturating_duration_since(Instant::now());
                                    drop(peer.schedule(delay, move || {
                                        fired.fetch_add(1, Ordering::Relaxed);
                                    }));
                                }
                            });
                        }
                    });
                    while fired.load(Ordering::Relaxed) < TIMERS {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    total += Instant::now().saturating_duration_since(first);
                }
                total
            });
        });
        drop(peer);
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(5));
    targets = expiry
}
criterion_main!(benches);
