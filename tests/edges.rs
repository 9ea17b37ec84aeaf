//! Semantic 8 and the builder's validation: odd input never panics.

mod support;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use sharded_timer::{BuildError, ShardedTimer, TimerState};
use support::{small_timer, WAIT};

#[test]
fn zero_delay_fires_on_the_next_tick() {
    let timer = small_timer();
    let (tx, rx) = mpsc::channel();
    let before = Instant::now();
    timer
        .schedule(Duration::ZERO, move || tx.send(Instant::now()).unwrap())
        .unwrap();
    let at = rx.recv_timeout(WAIT).unwrap();
    assert!(at >= before);
}

#[test]
fn a_past_instant_fires_on_the_next_tick() {
    let timer = small_timer();
    let (tx, rx) = mpsc::channel();
    let past = Instant::now()
        .checked_sub(Duration::from_secs(3600))
        .unwrap_or_else(Instant::now);
    let handle = timer
        .schedule_at(past, move || tx.send(()).unwrap())
        .unwrap();
    rx.recv_timeout(WAIT).unwrap();
    assert_eq!(handle.state(), TimerState::Fired);
}

#[test]
fn duration_max_and_far_deadlines_saturate_without_panic_and_never_fire() {
    let timer = small_timer();
    let forever = timer.schedule(Duration::MAX, || panic!("fired")).unwrap();
    let century = timer
        .schedule(Duration::from_secs(100 * 365 * 86_400), || panic!("fired"))
        .unwrap();
    let past_range = timer
        .schedule(Duration::from_secs(u64::MAX / 4), || panic!("fired"))
        .unwrap();
    assert!(forever.deadline() > Instant::now() + Duration::from_secs(3600 * 24 * 365));
    for handle in [&forever, &century, &past_range] {
        assert_eq!(handle.state(), TimerState::Pending);
    }
    let unfired = timer.shutdown();
    assert_eq!(unfired.len(), 3);
    drop(unfired);
    assert_eq!(timer.stats().panicked, 0);
}

#[test]
fn build_rejects_invalid_configuration_with_errors() {
    let base = || ShardedTimer::builder().pin_cores(false);
    assert!(matches!(
        base().shards(0).build(),
        Err(BuildError::ZeroShards)
    ));
    assert!(matches!(
        base().executor_threads(0).build(),
        Err(BuildError::ZeroExecutorThreads)
    ));
    assert!(matches!(
        base().tick(Duration::ZERO).build(),
        Err(BuildError::InvalidTick { .. })
    ));
    assert!(matches!(
        base().tick(Duration::MAX).build(),
        Err(BuildError::InvalidTick { .. })
    ));
    for capacity in [0, 1, 3, 1000] {
        match base().ring_capacity(capacity).build() {
            Err(BuildError::InvalidRingCapacity { capacity: c }) => assert_eq!(c, capacity),
            other => panic!("ring_capacity({capacity}) gave {other:?}"),
        }
    }
    assert!(matches!(
        base().max_pending(0).build(),
        Err(BuildError::ZeroMaxPending)
    ));
    let message = base().shards(0).build().unwrap_err().to_string();
    assert_eq!(message, "shards must be at least 1");
}

#[test]
fn the_smallest_configuration_works() {
    let timer = ShardedTimer::builder()
        .shards(1)
        .executor_threads(1)
        .ring_capacity(2)
        .tick(Duration::from_nanos(1))
        .pin_cores(true)
        .build()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    for i in 0..100 {
        let tx = tx.clone();
        timer
            .schedule(Duration::from_micros(i), move || tx.send(()).unwrap())
            .unwrap();
    }
    for _ in 0..100 {
        rx.recv_timeout(WAIT).unwrap();
    }
}

#[test]
fn public_types_are_send_sync_clone_debug() {
    fn assert_traits<T: Clone + Send + Sync + std::fmt::Debug>() {}
    assert_traits::<ShardedTimer>();
    assert_traits::<sharded_timer::TimerHandle>();
    assert_traits::<sharded_timer::ManualClock>();
    fn assert_value<T: Copy + Eq + std::fmt::Debug + Default>() {}
    assert_value::<sharded_timer::MissedTickBehavior>();
    fn assert_future<T: Send + Unpin + std::fmt::Debug>() {}
    assert_future::<sharded_timer::Sleep>();
    assert_future::<sharded_timer::Interval>();
    assert_future::<sharded_timer::Timeout<std::future::Ready<()>>>();
    let timer = small_timer();
    let handle = timer.schedule(Duration::from_secs(1), || {}).unwrap();
    assert!(format!("{timer:?}").contains("shards: 2"));
    assert!(format!("{handle:?}").contains("Pending"));
    let shown: u64 = handle
        .id()
        .to_string()
        .parse()
        .expect("an id displays as a number");
    assert!(shown > 0);
}
