//! The criterion side of the comparing benches: a sweep over peers, pending timers
//! and producer threads, and the settings they share.

#![allow(
    dead_code,
    reason = "each bench uses the helpers it needs, not every one"
)]

use std::time::Duration;

use criterion::measurement::Measurement;

use crate::peers::{cpu_on_threads, fill, on_threads, Kind, Peer};
use sharded_timer_benches::ProcessCpu;

/// Timers pending before a sweep's measurements: 1e3, 1e6, 1e7.
const SIZES: [usize; 3] = [1_000, 1_000_000, 10_000_000];
/// Producer threads in a sweep: 1, 2, 4.
const THREADS: [usize; 3] = [1, 2, 4];

/// Benchmarks `op` (given the peer and a per-call index) in group `name` for every
/// peer, with each of [`SIZES`] timers already pending, on each of [`THREADS`]
/// threads; the pending timers are filled outside the timing. Wall time.
pub(crate) fn sweep(c: &mut criterion::Criterion, name: &str, op: impl Fn(&Peer, u64) + Sync) {
    sweep_with(c, name, &SIZES, op, |threads, iters, op| {
        on_threads(threads, iters, op)
    });
}

/// As [`sweep`], measuring the process's CPU time (every thread) per operation
/// instead of wall time ([`ProcessCpu`]), with 1e6 timers pending: group `{name}-cpu`.
pub(crate) fn sweep_cpu(
    c: &mut criterion::Criterion<ProcessCpu>,
    name: &str,
    op: impl Fn(&Peer, u64) + Sync,
) {
    sweep_with(
        c,
        &format!("{name}-cpu"),
        &[1_000_000],
        op,
        |threads, iters, op| cpu_on_threads(threads, iters, op),
    );
}

/// The sweep under any measurement `M`: `run(threads, iters, op)` runs the calls and
/// measures them.
fn sweep_with<M: Measurement>(
    c: &mut criterion::Criterion<M>,
    name: &str,
    sizes: &[usize],
    op: impl Fn(&Peer, u64) + Sync,
    run: impl Fn(usize, u64, &(dyn Fn(u64) + Sync)) -> M::Value,
) {
    let mut group = c.benchmark_group(name);
    group.throughput(criterion::Throughput::Elements(1));
    for &pending in sizes {
        for kind in Kind::ALL {
            let peer = kind.start();
            let resident = fill(&peer, pending, 2);
            for threads in THREADS {
                let id =
                    criterion::BenchmarkId::new(format!("{}/{threads}t", kind.name()), pending);
                group.bench_function(id, |b| {
                    b.iter_custom(|iters| run(threads, iters, &|i| op(&peer, i)));
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

/// As [`criterion_config`], measuring CPU time (every thread) instead of wall time.
pub(crate) fn cpu_config() -> criterion::Criterion<ProcessCpu> {
    criterion::Criterion::default()
        .with_measurement(ProcessCpu::default())
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}
