//! The criterion side of the comparing benches: a sweep over peers, pending timers
//! and producer threads, and the settings they share.

#![allow(
    dead_code,
    reason = "each bench uses the helpers it needs, not every one"
)]

use std::time::Duration;

use crate::peers::{fill, on_threads, Kind, Peer};

/// Timers pending before a sweep's measurements: 1e3, 1e6, 1e7.
const SIZES: [usize; 3] = [1_000, 1_000_000, 10_000_000];
/// Producer threads in a sweep: 1, 2, 4.
const THREADS: [usize; 3] = [1, 2, 4];

/// Benchmarks `op` (given the peer and a per-call index) in group `name` for every
/// peer, with each of [`SIZES`] timers already pending, on each of [`THREADS`]
/// threads; the pending timers are filled outside the timing.
pub(crate) fn sweep(c: &mut criterion::Criterion, name: &str, op: impl Fn(&Peer, u64) + Sync) {
    let mut group = c.benchmark_group(name);
    group.throughput(criterion::Throughput::Elements(1));
    for pending in SIZES {
        for kind in Kind::ALL {
            let peer = kind.start();
            let resident = fill(&peer, pending, 2);
            for threads in THREADS {
                let id =
                    criterion::BenchmarkId::new(format!("{}/{threads}t", kind.name()), pending);
                group.bench_function(id, |b| {
                    b.iter_custom(|iters| on_threads(threads, iters, |i| op(&peer, i)));
                });
            }
            drop(resident);
            drop(peer);
        }
    }
    group.finish();
}

/// The criterion settings the comparing benches share: short, since each group has
/// many peers and sizes; medians over 10 samples.
pub(crate) fn criterion_config() -> criterion::Criterion {
    criterion::Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}
