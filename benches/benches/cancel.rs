//! schedule+cancel pairs per second (the RPC-timeout pattern: most timers never fire),
//! side by side with the peers, from 1, 2 and 4 threads with 1e3, 1e6 and 1e7 timers
//! already pending.
//!
//! Measured: one `schedule` of a no-op callback with a delay in 1 s..60 s followed at
//! once by `cancel` of that timer. Setup (filling the pending timers) is outside the
//! timing. Not measured: the peers' later clean-up of cancelled timers on their own
//! threads (it competes for the cores, as it would in production). Resident set: the
//! pending timers (the heap peer also keeps cancelled tasks until their deadline, as
//! java.util.Timer does). Tick: 1 ms.
//!
//! Also `schedule_cancel-cpu`: the process's CPU time (every thread) per pair, 1e6
//! pending.
//!
//! Run: `cargo bench -p sharded-timer-benches --bench cancel` (`-- schedule_cancel-cpu` for the CPU group alone).

#![allow(
    missing_docs,
    reason = "criterion_group! and criterion_main! generate undocumented items"
)]

mod harness;
use sharded_timer_peers as peers;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use peers::spread_delay;

fn schedule_cancel(c: &mut Criterion) {
    harness::sweep(c, "schedule_cancel", |peer, i| {
        let handle = peer.schedule(spread_delay(i), || {});
        black_box(peer.cancel(&handle));
    });
}

/// The same sweep, CPU ns (every thread) per pair: `schedule_cancel-cpu`.
fn schedule_cancel_cpu(c: &mut Criterion<sharded_timer_benches::ProcessCpu>) {
    harness::sweep_cpu(c, "schedule_cancel", |peer, i| {
        let handle = peer.schedule(spread_delay(i), || {});
        black_box(peer.cancel(&handle));
    });
}

criterion_group! {
    name = benches;
    config = harness::criterion_config();
    targets = schedule_cancel
}
criterion_group! {
    name = cpu;
    config = harness::cpu_config();
    targets = schedule_cancel_cpu
}
criterion_main!(benches, cpu);
