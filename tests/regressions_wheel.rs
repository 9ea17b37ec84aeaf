//! Regression tests for the timing wheel's bounded advance (issue "correctness, round
//! four", defect 1): a bounded turn whose backlog is a higher-level slot that cascades
//! must never hold a due entry when it reports that it is done, and must never move the
//! wheel past an entry it has just filed.
//!
//! Each test failed at 1da8323: the 69-tick entry came out at tick 228 (a whole level-1
//! rotation later than the 200 it was advanced to) on the public `TimingWheel`, and on a
//! one-shard service under a `ManualClock`; debug builds tripped the engine's
//! `slot start 197 before now 200` invariant instead (on the service, an abort).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sharded_timer::wheel::TimingWheel;
use sharded_timer::{Callbacks, ManualClock, ShardedTimer};

/// The shard's turn budget (`TURN_BUDGET`): a burst bigger than this drains over turns.
const TURN_BUDGET: usize = 1024;

/// Advances `wheel` to `now` in bounded calls, as a shard does, returning every entry
/// yielded with the tick it came out at.
fn advance_in_turns(wheel: &mut TimingWheel<u32>, now: u64, budget: usize) -> Vec<(u64, u64, u32)> {
    let mut out = Vec::new();
    let mut calls = 0;
    loop {
        calls += 1;
        assert!(calls < 10_000, "bounded advance made no progress");
        let done = wheel.advance_bounded(now, budget, &mut |deadline, value| {
            out.push((now, deadline, value));
        });
        if done {
            return out;
        }
    }
}

#[test]
fn bounded_advance_through_a_cascading_burst_yields_every_due_entry() {
    // 1,724 entries at 64 (a level-1 slot seen from tick 0) and one at 69; advance to
    // 200 with the shard's budget.
    let mut wheel = TimingWheel::new(0);
    for value in 0..1_724 {
        wheel.insert(64, value);
    }
    wheel.insert(69, 99_999);
    let out = advance_in_turns(&mut wheel, 200, TURN_BUDGET);
    assert_eq!(out.len(), 1_725, "every entry due by 200 came out");
    assert!(out.iter().all(|&(_, deadline, _)| deadline <= 200));
    assert!(out.iter().any(|&(_, _, value)| value == 99_999));
    assert_eq!(wheel.len(), 0);
    assert_eq!(wheel.next_expiry(), None);
    assert_eq!(wheel.now(), 200);
}

#[test]
fn done_means_nothing_due_is_held_for_every_burst_shape() {
    // Bursts of several sizes at several levels, a straggler a few ticks later, and
    // targets before, at and past the straggler; the budget varies too.
    for &(burst_at, burst, straggler, target, budget) in &[
        (64u64, 1_724usize, 69u64, 200u64, 1_024usize),
        (64, 1_100, 65, 66, 1_024),
        (4_096, 3_000, 4_100, 5_000, 1_024),
        (4_160, 2_049, 4_161, 300_000, 1_024),
        (70, 10, 75, 1_000, 3),
        (262_144, 5_000, 262_150, 262_150, 1_024),
    ] {
        let mut wheel = TimingWheel::new(0);
        for value in 0..burst as u32 {
            wheel.insert(burst_at, value);
        }
        wheel.insert(straggler, u32::MAX);
        // Something not yet due must stay, at its own tick.
        wheel.insert(target + 1, u32::MAX - 1);
        let out = advance_in_turns(&mut wheel, target, budget);
        let due = burst + usize::from(straggler <= target);
        assert_eq!(
            out.len(),
            due,
            "burst of {burst} at {burst_at}, straggler at {straggler}, advanced to {target}"
        );
        assert_eq!(wheel.len(), 1 + usize::from(straggler > target));
        assert_eq!(wheel.now(), target);
        let next = wheel
            .next_expiry()
            .expect("the entry after the target is held");
        assert!(next > target, "next expiry {next} not after {target}");
        // And it comes out exactly at its tick.
        let mut late = Vec::new();
        assert!(wheel.advance_bounded(target + 1, budget, &mut |d, v| late.push((d, v))));
        assert!(late.contains(&(target + 1, u32::MAX - 1)));
    }
}

#[test]
fn a_burst_on_one_manual_clock_shard_fires_the_straggler_when_due() {
    let clock = ManualClock::new();
    let timer = ShardedTimer::builder()
        .shards(1)
        .callbacks(Callbacks::inline())
        .clock(clock.clone())
        .build()
        .expect("a one-shard service builds");
    let fired = Arc::new(AtomicUsize::new(0));
    for _ in 0..1_724 {
        let fired = fired.clone();
        timer
            .schedule(Duration::from_millis(64), move || {
                fired.fetch_add(1, Ordering::Relaxed);
            })
            .expect("scheduled");
    }
    let start = clock.now();
    let straggler_at = Arc::new(AtomicU64::new(u64::MAX));
    let seen = Arc::new(Mutex::new(None));
    {
        let (straggler_at, seen, clock) = (straggler_at.clone(), seen.clone(), clock.clone());
        timer
            .schedule(Duration::from_millis(69), move || {
                let at = clock.now() - start;
                straggler_at.store(at.as_millis() as u64, Ordering::Relaxed);
                *seen.lock().unwrap() = Some(at);
            })
            .expect("scheduled");
    }
    clock.advance(Duration::from_millis(200));
    assert_eq!(fired.load(Ordering::Relaxed), 1_724);
    assert_eq!(
        straggler_at.load(Ordering::Relaxed),
        200,
        "the 69 ms timer fired within the advance to 200 ms (saw {:?})",
        seen.lock().unwrap()
    );
    assert_eq!(timer.stats().pending, 0);
    assert!(timer.shutdown().is_empty());
}
