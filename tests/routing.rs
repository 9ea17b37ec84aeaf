//! `Builder::routing`: which shard a new timer goes to, seen through `stats()`.
//!
//! `Routing::ById` spreads one thread's timers over every shard; `Routing::ByCore`
//! (the default) sends a thread's timers to its core's shard. Each test makes the
//! other policy fail: one thread on one core under `ById` is spread, under `ByCore`
//! it is not.

mod support;

use std::time::Duration;

use sharded_timer::{Routing, ShardedTimer};
use support::{wait_until, WAIT};

const SHARDS: usize = 4;
/// 64 runs of 64: `ById` sends each run of 64 consecutive timers of a thread to one
/// shard, so fewer runs would spread unevenly by chance.
const TIMERS: usize = 64 * 64;

/// Schedules `TIMERS` timers an hour away from a thread pinned to the first core (if
/// the platform pins), waits until every shard has taken them in, and returns each
/// shard's pending count, and whether the thread was pinned.
fn pending_per_shard(routing: Routing) -> (Vec<u64>, bool) {
    let timer = ShardedTimer::builder()
        .shards(SHARDS)
        .pin_cores(false)
        .routing(routing)
        .build()
        .expect("builds");
    let pinned = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let pinned = core_affinity::get_core_ids()
                    .and_then(|cores| cores.first().copied())
                    .is_some_and(core_affinity::set_for_current);
                let handles: Vec<_> = (0..TIMERS)
                    .map(|_| {
                        timer
                            .schedule(Duration::from_secs(3600), || {})
                            .expect("accepted")
                    })
                    .collect();
                drop(handles); // dropping a handle does not cancel
                pinned
            })
            .join()
            .expect("producer")
    });
    assert!(
        wait_until(WAIT, || {
            let stats = timer.stats();
            stats.in_rings == 0 && stats.pending == TIMERS as u64
        }),
        "every timer taken in: {:?}",
        timer.stats()
    );
    let pending = timer.stats().shards.iter().map(|s| s.pending).collect();
    timer.shutdown();
    (pending, pinned)
}

#[test]
fn by_id_spreads_one_thread_s_timers_over_every_shard() {
    let (pending, _) = pending_per_shard(Routing::ById);
    assert_eq!(pending.len(), SHARDS);
    assert_eq!(pending.iter().sum::<u64>(), TIMERS as u64);
    let fair = (TIMERS / SHARDS) as u64;
    for (shard, &count) in pending.iter().enumerate() {
        assert!(
            count > fair * 3 / 5 && count < fair * 7 / 5,
            "shard {shard} holds {count} of {TIMERS} (fair share {fair}): {pending:?}"
        );
    }
}

#[test]
fn by_core_sends_a_pinned_thread_s_timers_to_its_core_s_shard() {
    let (pending, pinned) = pending_per_shard(Routing::ByCore);
    assert_eq!(pending.iter().sum::<u64>(), TIMERS as u64);
    if !pinned || !cfg!(target_os = "linux") {
        // Without pinning (or the core number) the thread's core is not known here.
        return;
    }
    // Core 0's shard is shard 0 (`core % shards`).
    assert_eq!(
        pending[0], TIMERS as u64,
        "all on the first core's shard: {pending:?}"
    );
}

#[test]
fn the_default_routing_is_by_core() {
    assert_eq!(Routing::default(), Routing::ByCore);
}
