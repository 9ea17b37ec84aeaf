//! Bounded turns (issue 22): a shard takes at most 1,024 entries out of its wheel per
//! turn (`TURN_BUDGET` in `src/shard/core.rs`), then drains its rings again. So during
//! a burst a cancel still wins for a timer not yet fired, and a timer scheduled
//! part-way through is filed, and fires, long before the burst ends. Deterministic:
//! a `ManualClock`, one shard, inline callbacks (each runs before the next turn).

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sharded_timer::{Callbacks, ManualClock, ShardedTimer, TimerHandle, TimerState};
use support::within;

/// Entries one turn may take out of the wheel (`shard::core::TURN_BUDGET`).
const TURN_BUDGET: usize = 1024;
/// Timers due together.
const BURST: usize = 100_000;
/// The callback (by firing order, from 1) that acts part-way through the burst.
const ACTS_AT: usize = 10;

/// One shard on `clock`, inline callbacks.
fn one_inline_shard(clock: &ManualClock) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(1)
        .callbacks(Callbacks::inline())
        .pin_cores(false)
        .thread_name("bounded")
        .clock(clock.clone())
        .build()
        .expect("build")
}

#[test]
fn a_cancel_from_a_callback_part_way_through_a_burst_wins_for_every_timer_not_yet_fired() {
    within(Duration::from_secs(60), || {
        let clock = ManualClock::new();
        let timer = one_inline_shard(&clock);
        let fired = Arc::new(AtomicUsize::new(0));
        let handles: Arc<OnceLock<Vec<TimerHandle>>> = Arc::new(OnceLock::new());
        // Which timers fired, and how many cancels the acting callback won.
        let fired_ids = Arc::new(Mutex::new(vec![false; BURST]));
        let cancels_won = Arc::new(AtomicUsize::new(usize::MAX));
        let mut scheduled = Vec::with_capacity(BURST);
        for index in 0..BURST {
            let (fired, handles, fired_ids, cancels_won) = (
                fired.clone(),
                handles.clone(),
                fired_ids.clone(),
                cancels_won.clone(),
            );
            scheduled.push(
                timer
                    .schedule(Duration::from_millis(10), move || {
                        fired_ids.lock().unwrap()[index] = true;
                        if fired.fetch_add(1, Ordering::SeqCst) + 1 == ACTS_AT {
                            let won = handles
                                .get()
                                .expect("handles stored before the advance")
                                .iter()
                                .filter(|handle| handle.cancel())
                                .count();
                            cancels_won.store(won, Ordering::SeqCst);
                        }
                    })
                    .expect("schedule"),
            );
        }
        handles.set(scheduled).expect("set once");
        clock.advance(Duration::from_millis(10));

        let fired = fired.load(Ordering::SeqCst);
        let won = cancels_won.load(Ordering::SeqCst);
        // Every timer either fired or was cancelled, never both.
        assert_eq!(fired + won, BURST, "fired {fired}, cancels won {won}");
        // Only what the acting callback's turn (and the one before it) had taken out of
        // the wheel still fired: without the bound, one turn takes all 100,000 and
        // every cancel loses.
        assert!(fired >= ACTS_AT, "{fired}");
        assert!(
            fired <= ACTS_AT.max(TURN_BUDGET),
            "fired {fired} after the cancels"
        );
        let fired_ids = fired_ids.lock().unwrap();
        for (index, handle) in handles.get().unwrap().iter().enumerate() {
            let expected = if fired_ids[index] {
                TimerState::Fired
            } else {
                TimerState::Cancelled
            };
            assert_eq!(handle.state(), expected, "timer {index}");
        }
        let stats = timer.stats();
        assert_eq!(stats.fired, fired as u64);
        assert_eq!(stats.cancelled, won as u64);
        assert_eq!(stats.pending, 0);
    })
    .expect("done within 60 s (or it failed: see the panic above)");
}

#[test]
fn a_timer_scheduled_part_way_through_a_burst_fires_within_two_turns_not_after_it() {
    within(Duration::from_secs(60), || {
        let clock = ManualClock::new();
        let timer = Arc::new(one_inline_shard(&clock));
        let fired = Arc::new(AtomicUsize::new(0));
        // How many burst callbacks had run when the late-comer fired.
        let late_comer_at = Arc::new(AtomicUsize::new(usize::MAX));
        for _ in 0..BURST {
            let (fired, late_comer_at, service) =
                (fired.clone(), late_comer_at.clone(), Arc::downgrade(&timer));
            timer
                .schedule(Duration::from_millis(10), move || {
                    if fired.fetch_add(1, Ordering::SeqCst) + 1 == ACTS_AT {
                        let service = service.upgrade().expect("the service is alive");
                        let fired = fired.clone();
                        // Due now: filed by the next turn, fired by it or the one after.
                        service
                            .schedule(Duration::ZERO, move || {
                                late_comer_at.store(fired.load(Ordering::SeqCst), Ordering::SeqCst);
                            })
                            .expect("schedule from a callback");
                    }
                })
                .expect("schedule");
        }
        clock.advance(Duration::from_millis(10));
        assert_eq!(fired.load(Ordering::SeqCst), BURST);
        let at = late_comer_at.load(Ordering::SeqCst);
        // Its turn begins at most one turn after the acting callback's: at most two
        // budgets of burst callbacks ran before it (without the bound: all 100,000).
        assert!(at >= ACTS_AT, "{at}");
        assert!(
            at <= ACTS_AT + 2 * TURN_BUDGET,
            "fired after {at} burst callbacks"
        );
        assert_eq!(timer.stats().fired, BURST as u64 + 1);
    })
    .expect("done within 60 s (or it failed: see the panic above)");
}
