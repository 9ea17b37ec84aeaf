//! What an operator reads from `stats()`: lateness of fired timers, timers waiting in
//! rings, rings found full, each shard's load.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sharded_timer::ShardedTimer;
use support::{
    in_rings_shown, small_timer, thread_sleeps as shard_thread_sleeps, wait_until, WAIT,
};

/// Lateness a test accepts from a slow, shared CI machine: the deadline is strict,
/// this is not.
const LATE_BOUND: Duration = Duration::from_secs(5);

#[test]
fn lateness_counts_every_fired_timer_and_bounds_the_real_lateness() {
    let timer = small_timer();
    // The real lateness of each callback, measured by the callback itself.
    let worst_ns = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    for i in 0..1_000u64 {
        let deadline = start + Duration::from_millis(5 + i % 20);
        let worst_ns = worst_ns.clone();
        timer
            .schedule_at(deadline, move || {
                let late = Instant::now().duration_since(deadline).as_nanos() as u64;
                worst_ns.fetch_max(late, Ordering::Relaxed);
            })
            .unwrap();
    }
    assert!(wait_until(WAIT, || timer.stats().fired == 1_000));
    let stats = timer.stats();
    assert_eq!(stats.lateness.count(), 1_000);
    assert_eq!(stats.shards.len(), 2);
    assert_eq!(
        stats.shards.iter().map(|s| s.lateness.count()).sum::<u64>(),
        1_000
    );
    assert_eq!(stats.shards.iter().map(|s| s.fired).sum::<u64>(), 1_000);
    let (p50, p99, max) = (
        stats.lateness.p50(),
        stats.lateness.p99(),
        stats.lateness.max(),
    );
    assert!(p50 <= p99 && p99 <= max, "{:?}", stats.lateness);
    assert!(max < LATE_BOUND, "{:?}", stats.lateness);
    // The shard fires before the callback runs, and measures from the deadline's
    // tick, which is not before the deadline: its figure cannot exceed the
    // callback's own.
    assert!(
        max.as_nanos() as u64 <= worst_ns.load(Ordering::Relaxed),
        "shard says {max:?}, callbacks saw {} ns",
        worst_ns.load(Ordering::Relaxed)
    );
}

#[test]
fn each_shard_reports_its_pending_timers() {
    let timer = small_timer();
    // `schedule` routes by the caller's core: 500 from each of 2 cores.
    let handles: Vec<_> = support::on_each_core(2, |_| {
        (0..500)
            .map(|_| timer.schedule(Duration::from_secs(3600), || {}).unwrap())
            .collect::<Vec<_>>()
    })
    .into_iter()
    .flatten()
    .collect();
    assert!(wait_until(WAIT, || timer.stats().scheduled == 1_000));
    let stats = timer.stats();
    assert_eq!(stats.pending, 1_000);
    assert_eq!(stats.in_rings, 0);
    assert_eq!(stats.shards.iter().map(|s| s.pending).sum::<u64>(), 1_000);
    // Each core's caller filled its own core's shard.
    assert!(stats.shards.iter().all(|s| s.pending == 500), "{stats:?}");
    for handle in &handles[..400] {
        assert!(handle.cancel());
    }
    assert!(wait_until(WAIT, || timer.stats().pending == 600));
    assert_eq!(
        timer.stats().shards.iter().map(|s| s.pending).sum::<u64>(),
        600
    );
}

#[test]
fn timers_filed_directly_into_a_sleeping_shard_count_at_once_and_wake_nobody() {
    let timer = ShardedTimer::builder()
        .shards(1)
        .executor_threads(1)
        .pin_cores(false)
        .thread_name("stat")
        .build()
        .unwrap();
    // A timer an hour away, first: its wheel list (level 3) has no place yet, so it
    // goes by the ring and the shard files it, growing the list on its own thread
    // (`shard/direct.rs`, ground rules: lists grow on the shard's thread).
    let _far = timer.schedule(Duration::from_secs(3600), || {}).unwrap();
    // The shard sleeps until this one, 60 s away (its level-2 list also grows on the
    // shard: it goes by the ring too, and wakes the shard, being earlier).
    let _first = timer.schedule(Duration::from_secs(60), || {}).unwrap();
    assert!(wait_until(WAIT, || in_rings_shown(&timer) == (0, 2)));
    // Wait until it sleeps in its park (its thread's state in /proc).
    assert!(
        wait_until(WAIT, || shard_thread_sleeps("stat-s0")),
        "the shard parks within {WAIT:?}"
    );
    // Its token is free and the hour-away list has room (a first push gives a vector
    // 4 places): each schedule files its timer into the wheel itself, so every one
    // counts at once, none waits in a ring; and being later than the shard's
    // wake-up, none wakes it.
    let _later: Vec<_> = (0..3)
        .map(|_| timer.schedule(Duration::from_secs(3600), || {}).unwrap())
        .collect();
    assert_eq!(
        in_rings_shown(&timer),
        (0, 5),
        "filed directly, counted once"
    );
    assert!(shard_thread_sleeps("stat-s0"), "nobody woke the shard");
    let stats = timer.stats();
    assert_eq!((stats.in_rings, stats.scheduled, stats.pending), (0, 5, 5));
    // A timer two hours away goes to a list with no place yet: by the ring, and it
    // wakes the shard, which files it at once (growing that list) instead of at its
    // planned wake-up 60 s away. (`stats()` above woke it: first it sleeps again.)
    assert!(
        wait_until(WAIT, || shard_thread_sleeps("stat-s0")),
        "the shard parks again within {WAIT:?}"
    );
    let _other = timer.schedule(Duration::from_secs(7200), || {}).unwrap();
    assert!(
        wait_until(WAIT, || in_rings_shown(&timer) == (0, 6)),
        "the shard filed it within {WAIT:?}: {:?}",
        timer.stats()
    );
}

#[test]
fn a_producer_that_finds_a_ring_full_is_counted_and_loses_nothing() {
    let timer = ShardedTimer::builder()
        .shards(1)
        .executor_threads(1)
        .ring_capacity(2)
        .pin_cores(false)
        .thread_name("test")
        .build()
        .unwrap();
    // 20,000 schedules onto a 2-slot ring: filed directly while the shard's token
    // is free; those that find it held (the shard's turns) go through the ring, and
    // a full ring makes them wait, counted (`ring_full_waits`; how many is up to the
    // scheduler: possibly none).
    let handles: Vec<_> = (0..20_000)
        .map(|_| timer.schedule(Duration::from_secs(3600), || {}).unwrap())
        .collect();
    assert!(wait_until(WAIT, || timer.stats().scheduled == 20_000));
    let stats = timer.stats();
    assert!(stats.ring_full_waits <= 20_000, "counted once per push");
    assert_eq!(stats.shards[0].ring_full_waits, stats.ring_full_waits);
    assert_eq!(stats.pending, 20_000);
    assert_eq!(stats.in_rings, 0);
    drop(handles);
    assert_eq!(timer.shutdown().len(), 20_000);
}
