//! Timers scheduled per second, side by side with the peers (the `peers/` crate), from 1,
//! 2 and 4 producer threads with 1e3, 1e6 and 1e7 timers already pending.
//!
//! Measured: one `schedule` of a no-op callback with a delay in 1 s..60 s, handle
//! dropped (no cancel). Setup (filling the pending timers) is outside the timing.
//! Not measured: firing (timers scheduled during the bench are 1 s..60 s away, though
//! a long run sees some fire). Resident set: the pending timers plus what the bench
//! adds. Tick: 1 ms for every peer.
//!
//! Also `schedule-cpu`: the process's CPU time (every thread: producers, shards,
//! workers) per schedule, 1e6 pending, the figure that counts on a machine with fewer
//! cores than threads.
//!
//! Run: `cargo bench -p sharded-timer-benches --bench schedule` (`-- schedule-cpu` for the CPU group alone).

#![allow(
    missing_docs,
    reason = "criterion_group! and criterion_main! generate undocumented items"
)]

mod harness;
use sharded_timer_peers as peers;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use peers::spread_delay;

fn schedule(c: &mut Criterion) {
    harness::sweep(c, "schedule", |peer, i| {
        black_box(peer.schedule(spread_delay(i), || {}));
    });
}

/// The same sweep, CPU ns (every thread) per schedule: `schedule-cpu`.
fn schedule_cpu(c: &mut Criterion<sharded_timer_benches::ProcessCpu>) {
    harness::sweep_cpu(c, "schedule", |peer, i| {
        black_box(peer.schedule(spread_delay(i), || {}));
    });
}

criterion_group! {
    name = benches;
    config = harness::criterion_config();
    targets = schedule
}
criterion_group! {
    name = cpu;
    config = harness::cpu_config();
    targets = schedule_cpu
}
criterion_main!(benches, cpu);
