//! Timers scheduled per second, side by side with the peers (`benches/peers/`), from 1,
//! 2 and 4 producer threads with 1e3, 1e6 and 1e7 timers already pending.
//!
//! Measured: one `schedule` of a no-op callback with a delay in 1 s..60 s, handle
//! dropped (no cancel). Setup (filling the pending timers) is outside the timing.
//! Not measured: firing (timers scheduled during the bench are 1 s..60 s away, though
//! a long run sees some fire). Resident set: the pending timers plus what the bench
//! adds. Tick: 1 ms for every peer.
//!
//! Run: `cargo bench --bench schedule`.

#![allow(
    missing_docs,
    reason = "criterion_group! and criterion_main! generate undocumented items"
)]

mod peers;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use peers::{fill, on_threads, spread_delay, Kind};

const SIZES: [usize; 3] = [1_000, 1_000_000, 10_000_000];
const THREADS: [usize; 3] = [1, 2, 4];

fn schedule(c: &mut Criterion) {
    let mut group = c.benchmark_group("schedule");
    group.throughput(Throughput::Elements(1));
    for pending in SIZES {
        for kind in Kind::ALL {
            let peer = kind.start();
            let resident = fill(&peer, pending, 2);
            for threads in THREADS {
                let id = BenchmarkId::new(format!("{}/{threads}t", kind.name()), pending);
                group.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        on_threads(threads, iters, |i| {
                            black_box(peer.schedule(spread_delay(i), || {}));
                        })
                    });
                });
            }
            drop(resident);
            drop(peer);
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = peers::criterion_config();
    targets = schedule
}
criterion_main!(benches);
