//! `TimerHandle::reset` against the cancel + schedule a timer without reset needs, per
//! re-arm of an idle timer (the keepalive pattern), with 1e6 timers pending.
//!
//! Measured: one re-arm of an already-pending timer to 30 s from now, on 1 and 2
//! threads, each thread cycling over its own 10,000 timers (the cancel + schedule
//! variant replaces the handle it re-armed). Not measured: the shard's later
//! re-filing of reset timers when their old slot comes due, which happens on the
//! shard thread (it competes for the cores, as in production). Resident set: 1e6
//! pending timers plus the re-armed ones. Tick: 1 ms.
//!
//! Run: `cargo bench -p sharded-timer-benches --bench reset`.

#![allow(
    missing_docs,
    reason = "criterion_group! and criterion_main! generate undocumented items"
)]

mod harness;
use sharded_timer_peers as peers;

use std::sync::Mutex;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use peers::{fill, on_threads, Kind, Peer};
use sharded_timer::TimerHandle;

const PER_THREAD: usize = 10_000;
const IDLE: Duration = Duration::from_secs(30);

fn timers(peer: &Peer, count: usize) -> Vec<Mutex<TimerHandle>> {
    let Peer::Sharded(timer) = peer else {
        unreachable!("reset is sharded-timer's")
    };
    (0..count)
        .map(|_| Mutex::new(timer.schedule(IDLE, || {}).expect("accepted")))
        .collect()
}

fn rearm(c: &mut Criterion) {
    let mut group = c.benchmark_group("rearm");
    group.throughput(Throughput::Elements(1));
    let peer = Kind::Sharded.start();
    let resident = fill(&peer, 1_000_000, 2);
    let Peer::Sharded(timer) = &peer else {
        unreachable!()
    };
    for threads in [1usize, 2] {
        let handles = timers(&peer, PER_THREAD * threads);
        group.bench_function(BenchmarkId::new("reset", format!("{threads}t")), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, |i| {
                    let t = (i >> 40) as usize;
                    let slot = t * PER_THREAD + (i as usize & 0xff_ffff) % PER_THREAD;
                    // Each thread owns its slots: the lock is never contended.
                    assert!(handles[slot].lock().unwrap().reset(IDLE));
                })
            });
        });
        group.bench_function(
            BenchmarkId::new("cancel+schedule", format!("{threads}t")),
            |b| {
                b.iter_custom(|iters| {
                    on_threads(threads, iters, |i| {
                        let t = (i >> 40) as usize;
                        let slot = t * PER_THREAD + (i as usize & 0xff_ffff) % PER_THREAD;
                        let mut handle = handles[slot].lock().unwrap();
                        assert!(handle.cancel());
                        *handle = timer.schedule(IDLE, || {}).expect("accepted");
                    })
                });
            },
        );
        drop(handles);
    }
    drop(resident);
    group.finish();
}

criterion_group! {
    name = benches;
    config = harness::criterion_config();
    targets = rearm
}
criterion_main!(benches);
