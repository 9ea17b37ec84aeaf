//! Audit of "TimerHandle is 16 bytes": a service built with `max_pending` or a
//! `ManualClock` keeps those options in each timer's entry, not in the handle. These
//! tests attack that through the public API only: the room a cancel frees (exactly
//! once, from any clone, on any thread, racing firing, shutdown and other cancels),
//! the manual clock a handle reads (deadline, reset, reset_at), and handles that
//! outlive the service, its clock and their own timer's callback.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sharded_timer::{
    Callback, Callbacks, ManualClock, ScheduleError, ShardedTimer, TimerHandle, TimerState, Unfired,
};
use support::{wait_until, DropCounter, WAIT};

const LONG: Duration = Duration::from_secs(3600);

/// A 2-shard, 1-worker service on `prefix`-named threads, with the options given.
fn service(
    prefix: &str,
    limit: Option<usize>,
    clock: Option<&ManualClock>,
    callbacks: Option<Callbacks>,
) -> ShardedTimer {
    let mut builder = ShardedTimer::builder()
        .shards(2)
        .executor_threads(1)
        .pin_cores(false)
        .thread_name(prefix);
    if let Some(limit) = limit {
        builder = builder.max_pending(limit);
    }
    if let Some(clock) = clock {
        builder = builder.clock(clock.clone());
    }
    if let Some(callbacks) = callbacks {
        builder = builder.callbacks(callbacks);
    }
    builder.build().expect("the service builds")
}

/// Threads of this process whose name starts with `prefix-` (Linux).
fn threads_named(prefix: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(&format!("{prefix}-")))
        .count()
}

/// Schedules `free` long timers, each of which must be accepted, then asserts that the
/// next is refused with `TooManyPending { limit }`: exactly `free` places were free.
/// Returns the accepted handles.
fn take_exactly(timer: &ShardedTimer, free: usize, limit: usize) -> Vec<TimerHandle> {
    let handles: Vec<_> = (0..free)
        .map(|i| {
            timer
                .schedule(LONG, || {})
                .unwrap_or_else(|e| panic!("place {i} of {free} free: {e}"))
        })
        .collect();
    assert_eq!(
        timer.schedule(LONG, || {}).unwrap_err(),
        ScheduleError::TooManyPending { limit },
        "exactly {free} places were free"
    );
    handles
}

/// Cancels `handles` and asserts each cancel won: gives their room back.
fn give_back(handles: Vec<TimerHandle>) {
    for handle in handles {
        assert!(handle.cancel());
    }
}

#[test]
fn a_handle_is_16_bytes() {
    assert_eq!(std::mem::size_of::<TimerHandle>(), 16);
}

/// Four threads, each with its own clones of six victims of every kind (one-shot,
/// repeating, fixed-delay), cancel them all at once in different orders: exactly one
/// cancel wins per victim, each victim's callback is dropped once, and exactly six
/// places come free.
#[test]
fn racing_cancels_from_clones_on_threads_free_each_place_exactly_once() {
    const LIMIT: usize = 12;
    let timer = service("aho-race", Some(LIMIT), None, None);
    let drops = DropCounter::default();
    let mut handles = Vec::new();
    for i in 0..LIMIT {
        let token = drops.token();
        let handle = match i % 3 {
            0 => timer.schedule(LONG, move || drop(token)),
            1 => timer.schedule_repeating(LONG, move || {
                let _ = &token;
            }),
            _ => timer.schedule_with_fixed_delay(LONG, move || {
                let _ = &token;
            }),
        };
        handles.push(handle.unwrap());
    }
    assert_eq!(
        timer.schedule(LONG, || {}).unwrap_err(),
        ScheduleError::TooManyPending { limit: LIMIT }
    );
    let victims: Vec<TimerHandle> = handles.drain(..6).collect();
    let barrier = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let mut mine: Vec<(usize, TimerHandle)> = victims.iter().cloned().enumerate().collect();
            if t % 2 == 1 {
                mine.reverse();
            }
            mine.rotate_left(t);
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                mine.into_iter()
                    .map(|(i, handle)| (i, handle.cancel()))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut wins = [0usize; 6];
    for thread in threads {
        for (i, won) in thread.join().unwrap() {
            wins[i] += usize::from(won);
        }
    }
    assert_eq!(wins, [1; 6], "one winning cancel per victim");
    assert_eq!(drops.dropped(), 6, "each victim's callback dropped once");
    for victim in &victims {
        assert_eq!(victim.state(), TimerState::Cancelled);
        assert!(!victim.cancel(), "a later cancel loses");
    }
    let refill = take_exactly(&timer, 6, LIMIT);
    give_back(refill);
    give_back(handles);
    let all = take_exactly(&timer, LIMIT, LIMIT);
    assert_eq!(timer.shutdown().len(), LIMIT);
    assert_eq!(drops.dropped(), LIMIT);
    drop(all);
}

/// On a service with both options, timers that fired free their room when they fire;
/// cancels from every clone afterwards lose and free nothing.
#[test]
fn cancels_after_firing_lose_and_free_nothing() {
    const LIMIT: usize = 4;
    let clock = ManualClock::new();
    let timer = service("aho-fired", Some(LIMIT), Some(&clock), None);
    let ran = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..LIMIT)
        .map(|_| {
            let ran = ran.clone();
            timer
                .schedule(Duration::from_millis(10), move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap()
        })
        .collect();
    assert!(timer.schedule(LONG, || {}).is_err());
    clock.advance(Duration::from_millis(10));
    assert_eq!(ran.load(Ordering::SeqCst), LIMIT);
    let losers: Vec<_> = (0..2)
        .map(|_| {
            let clones = handles.clone();
            thread::spawn(move || clones.iter().filter(|h| h.cancel()).count())
        })
        .collect();
    for loser in losers {
        assert_eq!(loser.join().unwrap(), 0, "no cancel wins after firing");
    }
    for handle in &handles {
        assert!(!handle.cancel());
        assert_eq!(handle.state(), TimerState::Fired);
        assert!(!handle.reset(Duration::from_secs(1)));
    }
    let again = take_exactly(&timer, LIMIT, LIMIT);
    give_back(again);
    let again = take_exactly(&timer, LIMIT, LIMIT);
    drop(timer.shutdown());
    drop(again);
}

/// A cancel on one thread races `advance` firing the same timer: the callback runs
/// xor the cancel wins, and either way exactly one place comes free (bound 1).
#[test]
fn cancel_racing_the_clock_frees_the_place_exactly_once() {
    let clock = ManualClock::new();
    let timer = service("aho-clk", Some(1), Some(&clock), None);
    let ran = Arc::new(AtomicUsize::new(0));
    let mut cancel_wins = 0;
    for round in 0..150 {
        let before = ran.load(Ordering::SeqCst);
        let counter = ran.clone();
        let handle = timer
            .schedule(Duration::from_nanos(1 + round % 3), move || {
                counter.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        assert_eq!(
            timer.schedule(LONG, || {}).unwrap_err(),
            ScheduleError::TooManyPending { limit: 1 }
        );
        let barrier = Arc::new(Barrier::new(2));
        let canceller = {
            let handle = handle.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                handle.cancel()
            })
        };
        barrier.wait();
        clock.advance(Duration::from_nanos(3));
        let won = canceller.join().unwrap();
        // The cancel may have won after the advance's rounds: run what is due again.
        clock.advance(Duration::ZERO);
        let runs = ran.load(Ordering::SeqCst) - before;
        assert_eq!(
            runs + usize::from(won),
            1,
            "round {round}: ran {runs}, cancel won {won}"
        );
        cancel_wins += usize::from(won);
        assert_eq!(
            handle.state(),
            if won {
                TimerState::Cancelled
            } else {
                TimerState::Fired
            }
        );
        let next = take_exactly(&timer, 1, 1);
        give_back(next);
    }
    eprintln!("cancel won {cancel_wins} of 150 races");
    drop(timer.shutdown());
}

/// `shutdown` on one thread races cancels from clones on another: every timer is
/// either cancelled (its cancel won) or handed back, never both, never neither, and
/// its callback is dropped once.
#[test]
fn cancel_racing_shutdown_cancels_or_hands_back_each_timer_once() {
    for round in 0..12 {
        let clock = ManualClock::new();
        let bounded_only = round % 2 == 0;
        let timer = service("aho-shut", Some(8), (!bounded_only).then_some(&clock), None);
        let drops = DropCounter::default();
        let handles: Vec<_> = (0..8u64)
            .map(|i| {
                let token = drops.token();
                if i % 4 == 3 {
                    timer.schedule_repeating(LONG, move || {
                        let _ = &token;
                    })
                } else {
                    timer.schedule(LONG + Duration::from_nanos(i), move || drop(token))
                }
                .unwrap()
            })
            .collect();
        let deadlines: Vec<Instant> = handles.iter().map(TimerHandle::deadline).collect();
        let barrier = Arc::new(Barrier::new(2));
        let canceller = {
            let clones = handles.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                clones
                    .iter()
                    .map(TimerHandle::cancel)
                    .collect::<Vec<bool>>()
            })
        };
        barrier.wait();
        let unfired = timer.shutdown();
        let won = canceller.join().unwrap();
        for (i, handle) in handles.iter().enumerate() {
            let back: Vec<&Unfired> = unfired.iter().filter(|u| u.id() == handle.id()).collect();
            assert_eq!(
                back.len() + usize::from(won[i]),
                1,
                "round {round}, timer {i}: handed back {} times, cancel won {}",
                back.len(),
                won[i]
            );
            if let Some(back) = back.first() {
                assert_eq!(back.deadline(), deadlines[i], "one deadline");
            }
        }
        let cancelled = won.iter().filter(|&&w| w).count();
        assert_eq!(
            drops.dropped(),
            cancelled,
            "the winners' callbacks are dropped"
        );
        drop(unfired);
        assert_eq!(drops.dropped(), 8, "every callback dropped once");
        drop(timer);
        for (i, handle) in handles.iter().enumerate() {
            assert_eq!(handle.state(), TimerState::Cancelled);
            assert!(!handle.cancel());
            assert!(!handle.reset(Duration::from_secs(1)));
            assert_eq!(handle.deadline(), deadlines[i]);
        }
    }
}

/// Handles kept after every clone of the service and of its clock is dropped: the
/// service's threads end, the pending callbacks are dropped unrun once, and the
/// handles still answer (cancel and reset lose, state is Cancelled, the deadline
/// still reads against the manual clock's start).
#[test]
fn handles_outlive_the_service_and_its_clock() {
    let clock = ManualClock::new();
    let start = clock.now();
    let timer = service("aho-gone", Some(3), Some(&clock), Some(Callbacks::inline()));
    let drops = DropCounter::default();
    let (a, b, c) = {
        let (ta, tb, tc) = (drops.token(), drops.token(), drops.token());
        (
            timer
                .schedule(Duration::from_secs(30), move || drop(ta))
                .unwrap(),
            timer.schedule(Duration::MAX, move || drop(tb)).unwrap(),
            timer
                .schedule_with_fixed_delay(Duration::from_secs(7), move || {
                    let _ = &tc;
                })
                .unwrap(),
        )
    };
    assert_eq!(a.deadline(), start + Duration::from_secs(30));
    assert_eq!(c.deadline(), start + Duration::from_secs(7));
    let far = b.deadline();
    assert!(
        far > start + Duration::from_secs(290 * 365 * 86_400),
        "{far:?}"
    );
    let kept: Vec<TimerHandle> = vec![a.clone(), b.clone(), c.clone()];
    drop(clock);
    drop(timer);
    assert!(
        wait_until(WAIT, || threads_named("aho-gone") == 0),
        "the service's threads end while its handles are kept"
    );
    assert_eq!(drops.dropped(), 3, "the pending callbacks are dropped once");
    for (handle, deadline) in kept.iter().zip([
        start + Duration::from_secs(30),
        far,
        start + Duration::from_secs(7),
    ]) {
        assert_eq!(handle.state(), TimerState::Cancelled);
        assert!(!handle.cancel());
        assert!(!handle.reset(Duration::from_secs(1)));
        assert!(!handle.reset_at(start));
        assert_eq!(
            handle.deadline(),
            deadline,
            "the deadline reads back exactly"
        );
        assert!(format!("{handle:?}").contains("Cancelled"));
    }
    // Drop the clones on other threads, then the originals here.
    let droppers: Vec<_> = kept
        .into_iter()
        .map(|handle| thread::spawn(move || drop(handle)))
        .collect();
    for dropper in droppers {
        dropper.join().unwrap();
    }
    assert_eq!(a.deadline(), start + Duration::from_secs(30));
    drop((a, b, c));
    assert_eq!(drops.dropped(), 3);
}

/// `shutdown` hands back a one-shot and a fixed-delay timer; the service and its clock
/// are then dropped. Handles lose their cancels (the timers belong to their
/// `Unfired`s), the `Unfired` deadlines equal the handles', and running or dropping
/// an `Unfired` shows up in its handle.
#[test]
fn unfired_timers_outlive_the_service_and_their_handles_follow_them() {
    let clock = ManualClock::new();
    let start = clock.now();
    let timer = service("aho-unf", Some(2), Some(&clock), None);
    let ran = Arc::new(AtomicUsize::new(0));
    let drops = DropCounter::default();
    let one_shot = {
        let ran = ran.clone();
        timer
            .schedule_at(start - Duration::from_secs(5), move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap()
    };
    let token = drops.token();
    let poller = timer
        .schedule_with_fixed_delay(Duration::from_secs(5), move || {
            let _ = &token;
        })
        .unwrap();
    let mut unfired = timer.shutdown();
    drop(clock);
    drop(timer);
    // The past one-shot may have fired in a shard turn before the shutdown (a deadline
    // not after the manual now is due at once).
    let fired_before = ran.load(Ordering::SeqCst);
    assert_eq!(
        unfired.len(),
        2 - fired_before,
        "what had not fired comes back"
    );
    for handle in [&one_shot, &poller] {
        assert!(
            !handle.cancel(),
            "a handed-back timer belongs to its Unfired"
        );
        assert!(!handle.reset(Duration::from_secs(1)));
    }
    assert_eq!(one_shot.deadline(), start - Duration::from_secs(5));
    assert_eq!(poller.deadline(), start + Duration::from_secs(5));
    unfired.sort_by_key(Unfired::deadline);
    let back_poller = unfired.pop().unwrap();
    assert_eq!(back_poller.id(), poller.id());
    assert_eq!(back_poller.deadline(), poller.deadline());
    if let Some(back_one_shot) = unfired.pop() {
        assert_eq!(back_one_shot.id(), one_shot.id());
        assert_eq!(back_one_shot.deadline(), one_shot.deadline());
        back_one_shot.run();
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(one_shot.state(), TimerState::Fired);
    drop(back_poller);
    assert_eq!(drops.dropped(), 1);
    assert_eq!(poller.state(), TimerState::Cancelled);
    assert!(!poller.cancel());
}

/// Deadlines read back exactly on a manual clock (with and without a bound): before the
/// clock's start, one nanosecond after it, after `advance`, and saturated at the far
/// future, which `advance(Duration::MAX)` reaches.
#[test]
fn deadlines_read_back_exactly_against_the_manual_clock() {
    for limit in [None, Some(8)] {
        let clock = ManualClock::new();
        let start = clock.now();
        let timer = service("aho-dl", limit, Some(&clock), None);
        let ran = Arc::new(AtomicUsize::new(0));
        let count = |ran: &Arc<AtomicUsize>| {
            let ran = ran.clone();
            move || {
                ran.fetch_add(1, Ordering::SeqCst);
            }
        };
        let early = start - Duration::from_secs(3) - Duration::from_nanos(7);
        let past = timer.schedule_at(early, count(&ran)).unwrap();
        assert_eq!(past.deadline(), early);
        let next_ns = timer
            .schedule_at(start + Duration::from_nanos(1), count(&ran))
            .unwrap();
        assert_eq!(next_ns.deadline(), start + Duration::from_nanos(1));
        let odd = timer
            .schedule(Duration::from_nanos(1_234_567_891), count(&ran))
            .unwrap();
        assert_eq!(odd.deadline(), start + Duration::from_nanos(1_234_567_891));
        clock.advance(Duration::from_secs(10));
        assert_eq!(ran.load(Ordering::SeqCst), 3);
        let later = timer.schedule(Duration::from_secs(5), count(&ran)).unwrap();
        assert_eq!(later.deadline(), start + Duration::from_secs(15));
        let far = timer.schedule(Duration::MAX, count(&ran)).unwrap();
        let beyond = start
            .checked_add(Duration::from_secs(400 * 365 * 86_400))
            .expect("an Instant 400 years ahead fits on Linux");
        let far_at = timer.schedule_at(beyond, count(&ran)).unwrap();
        assert_eq!(far_at.deadline(), far.deadline(), "one far future");
        assert!(far.deadline() > start + Duration::from_secs(290 * 365 * 86_400));
        for handle in [&past, &next_ns, &odd] {
            assert_eq!(handle.state(), TimerState::Fired);
        }
        clock.advance(Duration::from_secs(5) - Duration::from_nanos(1));
        assert_eq!(ran.load(Ordering::SeqCst), 3, "never early");
        clock.advance(Duration::from_nanos(1));
        assert_eq!(ran.load(Ordering::SeqCst), 4);
        clock.advance(Duration::MAX);
        assert_eq!(ran.load(Ordering::SeqCst), 6, "the far future comes");
        assert_eq!(
            clock.now(),
            far.deadline(),
            "the clock saturates at the same instant"
        );
        // Handles read the same after the service and clock are gone.
        let far_deadline = far.deadline();
        drop(timer);
        drop(clock);
        assert_eq!(far.deadline(), far_deadline);
        assert_eq!(past.deadline(), early);
    }
}

/// `reset` reads the manual clock's now (not the system's), also on a bounded
/// service, whose room a reset neither takes nor frees.
#[test]
fn reset_and_reset_at_read_the_manual_clock() {
    let clock = ManualClock::new();
    let start = clock.now();
    let timer = service("aho-rst", Some(2), Some(&clock), None);
    clock.advance(Duration::from_secs(100));
    let ran = Arc::new(AtomicUsize::new(0));
    let counter = ran.clone();
    let h = timer
        .schedule(Duration::from_secs(1), move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let counter = ran.clone();
    let g = timer
        .schedule(Duration::from_secs(60), move || {
            counter.fetch_add(10, Ordering::SeqCst);
        })
        .unwrap();
    assert!(timer.schedule(LONG, || {}).is_err());
    assert!(h.reset(Duration::from_secs(5)));
    assert_eq!(h.deadline(), start + Duration::from_secs(105));
    assert!(
        h.clone().reset(Duration::from_secs(5)),
        "a clone resets the same timer"
    );
    assert!(g.reset(Duration::from_secs(70)));
    assert_eq!(
        timer.schedule(LONG, || {}).unwrap_err(),
        ScheduleError::TooManyPending { limit: 2 },
        "a reset frees no room"
    );
    let past = start + Duration::from_secs(99);
    assert!(g.reset_at(past));
    assert_eq!(g.deadline(), past);
    clock.advance(Duration::ZERO);
    assert_eq!(
        ran.load(Ordering::SeqCst),
        10,
        "a past reset_at is due at once"
    );
    clock.advance(Duration::from_secs(5) - Duration::from_nanos(1));
    assert_eq!(ran.load(Ordering::SeqCst), 10, "never early after a reset");
    clock.advance(Duration::from_nanos(1));
    assert_eq!(ran.load(Ordering::SeqCst), 11);
    let again = take_exactly(&timer, 2, 2);
    assert!(again[0].reset(Duration::from_secs(1)));
    assert_eq!(again[0].deadline(), start + Duration::from_secs(106));
    drop(timer.shutdown());
}

/// Two services on one manual clock with different bounds: each handle frees room in
/// its own service.
#[test]
fn each_handle_frees_room_in_its_own_service() {
    let clock = ManualClock::new();
    let a = service("aho-sa", Some(2), Some(&clock), None);
    let b = service("aho-sb", Some(3), Some(&clock), None);
    let in_a = take_exactly(&a, 2, 2);
    let in_b = take_exactly(&b, 3, 3);
    assert!(in_a[0].cancel());
    let _ = take_exactly(&b, 0, 3);
    let refill_a = take_exactly(&a, 1, 2);
    assert!(in_b[1].cancel() && in_b[2].cancel());
    let _ = take_exactly(&a, 0, 2);
    let refill_b = take_exactly(&b, 2, 3);
    drop(a.shutdown());
    drop(b.shutdown());
    drop((in_a, in_b, refill_a, refill_b));
}

/// A callback that owns a clone of its service and its own handle (a cycle until it
/// runs): inside the run its handle reads Fired and loses its cancel, its room is
/// already free (so it can schedule one timer under a bound of 1, and not two), and
/// once it has run the service's threads end when the test drops its clone.
#[test]
fn a_callback_holding_its_own_handle_and_service_sees_its_room_freed() {
    for inline in [false, true] {
        let clock = ManualClock::new();
        let prefix = if inline { "aho-cyi" } else { "aho-cyp" };
        let timer = service(
            prefix,
            Some(1),
            Some(&clock),
            inline.then(Callbacks::inline),
        );
        let slot: Arc<Mutex<Option<TimerHandle>>> = Arc::default();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let handle = {
            let (timer, slot, seen) = (timer.clone(), slot.clone(), seen.clone());
            timer
                .clone()
                .schedule(Duration::from_secs(1), move || {
                    let own = slot.lock().unwrap().take().expect("the handle is stored");
                    let mut seen = seen.lock().unwrap();
                    seen.push(format!("{:?}", own.state()));
                    seen.push(format!("{}", own.cancel()));
                    let inner = timer.schedule(LONG, || {});
                    seen.push(format!("{}", inner.is_ok()));
                    seen.push(format!("{:?}", timer.schedule(LONG, || {}).err()));
                    *slot.lock().unwrap() = inner.ok();
                })
                .unwrap()
        };
        *slot.lock().unwrap() = Some(handle.clone());
        drop(handle);
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "Fired",
                "false",
                "true",
                "Some(TooManyPending { limit: 1 })"
            ]
        );
        let inner = slot.lock().unwrap().take().unwrap();
        assert!(inner.cancel());
        let last = take_exactly(&timer, 1, 1);
        drop(timer);
        drop(clock);
        assert!(
            wait_until(WAIT, || threads_named(prefix) == 0),
            "the cycle is broken once the callback has run"
        );
        assert_eq!(last[0].state(), TimerState::Cancelled);
    }
}

/// A capture whose `Drop` cancels its own timer's handle: however the callback is
/// dropped (a winning cancel, firing, an `Unfired` dropped, the last service clone
/// dropped), that inner cancel loses and the room is freed once.
#[test]
fn a_capture_whose_drop_cancels_its_own_handle_loses_and_frees_nothing() {
    struct CancelOnDrop {
        slot: Arc<Mutex<Option<TimerHandle>>>,
        results: Arc<Mutex<Vec<bool>>>,
    }
    impl Drop for CancelOnDrop {
        fn drop(&mut self) {
            let own = self.slot.lock().unwrap().take();
            if let Some(own) = own {
                self.results.lock().unwrap().push(own.cancel());
            }
        }
    }
    // How each case ends the timer.
    for case in 0..5 {
        let clock = ManualClock::new();
        let timer = service("aho-cod", Some(1), Some(&clock), None);
        let slot: Arc<Mutex<Option<TimerHandle>>> = Arc::default();
        let results: Arc<Mutex<Vec<bool>>> = Arc::default();
        let capture = CancelOnDrop {
            slot: slot.clone(),
            results: results.clone(),
        };
        let handle = if case == 4 {
            timer
                .schedule_repeating(Duration::from_secs(1), move || {
                    let _ = &capture;
                })
                .unwrap()
        } else {
            timer
                .schedule(Duration::from_secs(1), move || {
                    let _ = &capture;
                })
                .unwrap()
        };
        *slot.lock().unwrap() = Some(handle.clone());
        match case {
            0 | 4 => {
                if case == 4 {
                    clock.advance(Duration::from_secs(3));
                }
                assert!(handle.cancel());
                assert_eq!(handle.state(), TimerState::Cancelled);
            }
            1 => {
                clock.advance(Duration::from_secs(1));
                assert_eq!(handle.state(), TimerState::Fired);
            }
            2 => {
                let unfired = timer.shutdown();
                assert_eq!(unfired.len(), 1);
                drop(unfired);
                assert_eq!(handle.state(), TimerState::Cancelled);
            }
            _ => {
                drop(timer.clone());
                let timer = timer;
                drop(timer);
                assert!(wait_until(WAIT, || !results.lock().unwrap().is_empty()));
                assert_eq!(handle.state(), TimerState::Cancelled);
                assert_eq!(*results.lock().unwrap(), [false], "case {case}");
                continue;
            }
        }
        assert_eq!(*results.lock().unwrap(), [false], "case {case}");
        if case != 2 {
            let next = take_exactly(&timer, 1, 1);
            give_back(next);
        }
        assert!(!handle.cancel());
        drop(timer.shutdown());
    }
}

/// A repeating (and a fixed-delay) timer that cancels itself inside its third run:
/// the cancel wins, no fourth run comes, and its one place comes free once.
#[test]
fn a_repeating_timer_cancelling_itself_in_a_run_frees_its_place_once() {
    for fixed_delay in [false, true] {
        let clock = ManualClock::new();
        let timer = service("aho-rep", Some(1), Some(&clock), None);
        let slot: Arc<Mutex<Option<TimerHandle>>> = Arc::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let won: Arc<Mutex<Vec<bool>>> = Arc::default();
        let body = {
            let (slot, runs, won) = (slot.clone(), runs.clone(), won.clone());
            move || {
                if runs.fetch_add(1, Ordering::SeqCst) == 2 {
                    let own = slot.lock().unwrap().clone().unwrap();
                    won.lock().unwrap().push(own.cancel());
                    won.lock().unwrap().push(own.cancel());
                }
            }
        };
        let handle = if fixed_delay {
            timer.schedule_with_fixed_delay(Duration::from_secs(1), body)
        } else {
            timer.schedule_repeating(Duration::from_secs(1), body)
        }
        .unwrap();
        *slot.lock().unwrap() = Some(handle.clone());
        for _ in 0..3 {
            assert_eq!(
                timer.schedule(LONG, || {}).unwrap_err(),
                ScheduleError::TooManyPending { limit: 1 }
            );
            clock.advance(Duration::from_secs(1));
        }
        clock.advance(Duration::from_secs(1));
        clock.advance(Duration::from_secs(1));
        assert_eq!(runs.load(Ordering::SeqCst), 3, "no run after the cancel");
        assert_eq!(*won.lock().unwrap(), [true, false]);
        assert_eq!(handle.state(), TimerState::Cancelled);
        assert!(!handle.cancel());
        let next = take_exactly(&timer, 1, 1);
        give_back(next);
        let next = take_exactly(&timer, 1, 1);
        drop(timer.shutdown());
        drop(next);
        slot.lock().unwrap().take();
    }
}

/// A spawner service: a repeating timer's run is handed over as a `Callback`. Whether
/// the handle's cancel comes before the `Callback` is dropped or run, or after, the
/// place comes free exactly once; the `Callback`'s deadline is the handle's.
#[test]
fn a_repeating_run_handed_to_a_spawner_frees_its_place_once_whoever_cancels() {
    for order in 0..3 {
        let clock = ManualClock::new();
        let queue: Arc<Mutex<Vec<Callback>>> = Arc::default();
        let callbacks = {
            let queue = queue.clone();
            Callbacks::spawn(move |callback| queue.lock().unwrap().push(callback))
        };
        let timer = service("aho-spn", Some(1), Some(&clock), Some(callbacks));
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = runs.clone();
        let handle = timer
            .schedule_repeating(Duration::from_secs(2), move || {
                counter.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        let first_deadline = handle.deadline();
        clock.advance(Duration::from_secs(2));
        let callback = queue.lock().unwrap().pop().expect("the run is handed over");
        assert_eq!(callback.id(), handle.id());
        assert_eq!(callback.deadline(), first_deadline);
        match order {
            0 => {
                assert!(handle.cancel(), "cancel before the Callback is dropped");
                drop(callback);
            }
            1 => {
                drop(callback);
                assert!(!handle.cancel(), "a dropped run cancelled the timer");
            }
            _ => {
                assert!(handle.cancel(), "cancel before the Callback runs");
                callback.run();
                assert_eq!(
                    runs.load(Ordering::SeqCst),
                    0,
                    "a cancelled run does not start"
                );
            }
        }
        assert_eq!(handle.state(), TimerState::Cancelled);
        let next = take_exactly(&timer, 1, 1);
        give_back(next);
        let next = take_exactly(&timer, 1, 1);
        drop(timer.shutdown());
        drop(next);
        assert!(queue.lock().unwrap().is_empty());
    }
}

/// Many clones of eight timers are dropped on two threads while the clock fires four
/// of them and the test cancels the other four: each callback is run or dropped once,
/// and the bound's count is exact afterwards.
#[test]
fn clones_dropped_on_threads_while_timers_fire_and_cancel_keep_counts_exact() {
    const LIMIT: usize = 8;
    let clock = ManualClock::new();
    let timer = service("aho-cln", Some(LIMIT), Some(&clock), None);
    let drops = DropCounter::default();
    let ran = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..LIMIT as u64)
        .map(|i| {
            let (token, ran) = (drops.token(), ran.clone());
            timer
                .schedule(Duration::from_secs(1 + (i % 2) * 1000), move || {
                    let _ = &token;
                    ran.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap()
        })
        .collect();
    let barrier = Arc::new(Barrier::new(3));
    let droppers: Vec<_> = (0..2)
        .map(|_| {
            let clones: Vec<TimerHandle> = (0..500).flat_map(|_| handles.iter().cloned()).collect();
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                for clone in clones {
                    let _ = clone.state();
                    drop(clone);
                }
            })
        })
        .collect();
    barrier.wait();
    clock.advance(Duration::from_secs(1));
    let wins = handles
        .iter()
        .skip(1)
        .step_by(2)
        .filter(|h| h.cancel())
        .count();
    for dropper in droppers {
        dropper.join().unwrap();
    }
    assert_eq!(wins, LIMIT / 2);
    assert_eq!(ran.load(Ordering::SeqCst), LIMIT / 2);
    assert_eq!(drops.dropped(), LIMIT, "every callback run or dropped once");
    let all = take_exactly(&timer, LIMIT, LIMIT);
    drop(handles);
    drop(timer.shutdown());
    drop(all);
}

/// Past 2^23 live references a timer's count saturates (its entry is kept for ever):
/// its handle still cancels once, frees its place once, and reads its deadline.
#[test]
fn a_saturated_handle_still_cancels_once_and_frees_its_place_once() {
    let clock = ManualClock::new();
    let start = clock.now();
    let timer = service("aho-sat", Some(1), Some(&clock), None);
    let drops = DropCounter::default();
    let token = drops.token();
    let handle = timer
        .schedule(Duration::from_secs(9), move || drop(token))
        .unwrap();
    for _ in 0..(1u32 << 23) + 3 {
        std::mem::forget(handle.clone());
    }
    assert_eq!(handle.deadline(), start + Duration::from_secs(9));
    let clone = handle.clone();
    assert!(clone.cancel());
    assert!(!handle.cancel());
    assert_eq!(drops.dropped(), 1);
    let next = take_exactly(&timer, 1, 1);
    give_back(next);
    drop(timer.shutdown());
    assert_eq!(handle.state(), TimerState::Cancelled);
    assert_eq!(clone.deadline(), start + Duration::from_secs(9));
}

/// The entry keeps the options beside the callback: whatever the capture's size and
/// alignment (none, 256-byte aligned, 8 KiB), the handle reads the manual clock and
/// frees its place right.
#[test]
fn options_are_read_right_whatever_the_capture_layout() {
    #[repr(align(256))]
    struct Aligned([u8; 3]);
    let clock = ManualClock::new();
    let start = clock.now();
    let timer = service("aho-lay", Some(4), Some(&clock), None);
    let aligned = Aligned([1, 2, 3]);
    let big = [7u8; 8192];
    let aligned_rep = Aligned([4, 5, 6]);
    let handles = [
        timer.schedule(Duration::from_nanos(11), || {}).unwrap(),
        timer
            .schedule(Duration::from_nanos(22), move || {
                std::hint::black_box(&aligned.0);
            })
            .unwrap(),
        timer
            .schedule(Duration::from_nanos(33), move || {
                std::hint::black_box(&big);
            })
            .unwrap(),
        timer
            .schedule_repeating(Duration::from_millis(44), move || {
                std::hint::black_box(&aligned_rep.0);
            })
            .unwrap(),
    ];
    // A repeating period is at least the tick (1 ms): 44 ms.
    let asked = [11, 22, 33, 44_000_000].map(|ns| start + Duration::from_nanos(ns));
    for (handle, asked) in handles.iter().zip(asked) {
        assert_eq!(handle.deadline(), asked);
    }
    assert!(timer.schedule(LONG, || {}).is_err());
    clock.advance(Duration::from_secs(1));
    for handle in &handles[..3] {
        assert_eq!(handle.state(), TimerState::Fired);
        assert!(!handle.reset(Duration::from_secs(1)));
    }
    assert_eq!(handles[3].state(), TimerState::Pending);
    assert!(
        !handles[3].reset(Duration::from_secs(1)),
        "a repeating timer keeps its rate"
    );
    let moved = timer.schedule(Duration::from_secs(2), || {}).unwrap();
    assert_eq!(moved.deadline(), start + Duration::from_secs(3));
    assert!(
        handles[3].cancel(),
        "the repeating one keeps going until cancelled"
    );
    let rest = take_exactly(&timer, 3, 4);
    give_back(rest);
    drop(timer.shutdown());
}

/// Services without options (default, and bounded on the system clock): deadlines
/// read back exactly, before the process's first service too, and reset reads
/// `Instant::now()`.
#[test]
fn handles_of_services_without_a_manual_clock_read_the_system_clock() {
    for limit in [None, Some(4)] {
        let timer = service("aho-sys", limit, None, None);
        let now = Instant::now();
        let ahead = now + Duration::from_secs(30) + Duration::from_nanos(3);
        let h = timer.schedule_at(ahead, || {}).unwrap();
        assert_eq!(h.deadline(), ahead);
        let before = now
            .checked_sub(Duration::from_millis(500))
            .expect("the monotonic clock is past 500 ms");
        let past = timer.schedule_at(before, || {}).unwrap();
        assert_eq!(past.deadline(), before);
        let from = Instant::now();
        assert!(h.reset(Duration::from_secs(60)));
        let to = Instant::now();
        let deadline = h.deadline();
        assert!(
            deadline >= from + Duration::from_secs(60) && deadline <= to + Duration::from_secs(60),
            "{deadline:?} not within [{from:?}, {to:?}] + 60 s"
        );
        let far = timer.schedule(Duration::MAX, || {}).unwrap();
        assert!(far.deadline() > now + Duration::from_secs(290 * 365 * 86_400));
        assert!(h.cancel());
        assert!(far.cancel());
        assert!(wait_until(WAIT, || past.state() == TimerState::Fired));
        assert_eq!(past.deadline(), before);
        if let Some(limit) = limit {
            let _ = take_exactly(&timer, limit, limit);
        }
        drop(timer.shutdown());
    }
}

/// A callback that owns the last clone of its bounded, manual-clock service (the test
/// dropped its own): `advance` fires it, the service goes down from inside its own
/// worker or shard thread, `advance` returns, the threads end, and the handle, now
/// the last thing left besides the clock, still reads Fired and its deadline.
#[test]
fn a_callback_dropping_the_last_service_clone_leaves_its_handle_working() {
    for inline in [false, true] {
        let clock = ManualClock::new();
        let start = clock.now();
        let prefix = if inline { "aho-lsi" } else { "aho-lsp" };
        let timer = service(
            prefix,
            Some(1),
            Some(&clock),
            inline.then(Callbacks::inline),
        );
        let ran = Arc::new(AtomicUsize::new(0));
        let handle = {
            let (keep, ran) = (timer.clone(), ran.clone());
            timer
                .schedule(Duration::from_secs(2), move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                    drop(keep);
                })
                .unwrap()
        };
        drop(timer);
        let advancer = clock.clone();
        let returned = support::within(WAIT, move || advancer.advance(Duration::from_secs(2)));
        assert!(returned.is_some(), "advance returned (inline: {inline})");
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert!(
            wait_until(WAIT, || threads_named(prefix) == 0),
            "the service's threads end (inline: {inline})"
        );
        drop(clock);
        assert_eq!(handle.state(), TimerState::Fired);
        assert!(!handle.cancel());
        assert!(!handle.reset(Duration::from_secs(1)));
        assert_eq!(handle.deadline(), start + Duration::from_secs(2));
    }
}

/// The last reference to a timer (and so to the options its entry keeps) is a
/// handle in a thread-local of a thread that exits after the service and its clock
/// are gone: the entry is freed during that thread's teardown.
#[test]
fn the_last_handle_freed_in_a_thread_local_destructor() {
    use std::cell::RefCell;
    thread_local! {
        static KEPT: RefCell<Vec<TimerHandle>> = const { RefCell::new(Vec::new()) };
    }
    let clock = ManualClock::new();
    let timer = service("aho-tls", Some(2), Some(&clock), None);
    let drops = DropCounter::default();
    let handles: Vec<TimerHandle> = (0..2)
        .map(|i| {
            let token = drops.token();
            if i == 0 {
                timer.schedule(Duration::from_secs(1), move || drop(token))
            } else {
                timer.schedule_repeating(Duration::from_secs(1), move || {
                    let _ = &token;
                })
            }
            .unwrap()
        })
        .collect();
    clock.advance(Duration::from_secs(1));
    drop(timer);
    drop(clock);
    assert_eq!(
        drops.dropped(),
        2,
        "fired and consumed, or dropped with the service"
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let keeper = thread::spawn(move || {
        KEPT.with(|kept| kept.borrow_mut().extend(handles));
        tx.send(()).unwrap();
    });
    rx.recv_timeout(WAIT).unwrap();
    keeper.join().unwrap();
}

/// Two threads schedule timers of every kind on a bound of 6 and cancel each at once
/// (some through a clone, some racing their firing: zero delays), 3,000 each: no
/// schedule is refused for longer than [`WAIT`] (each thread has at most 3 pending),
/// every timer runs xor its cancel wins, and exactly 6 places are free at the end. A
/// room released twice, or never, would show as a lasting refusal or a wrong count at
/// the end. (A refusal for a moment is the contract: a fire frees its room just
/// *after* the timer turns `Fired`, so a thread whose cancel lost to the fire can
/// schedule again before the room is free: `Builder::max_pending`. A fresh-clone CI
/// on a loaded runner once refused a thread's third timer of a group: the other
/// thread held 3, this one 2, and the short timer of its group before had fired, its
/// cancel lost, while the firing thread had not yet freed its room: 6 of 6.)
#[test]
fn schedule_and_cancel_storms_keep_the_bound_exact() {
    storm(None);
}

/// As above on a manual clock, which a third thread advances by a nanosecond at a
/// time while the two schedule 1-ns timers and cancel them: cancels race firing.
#[test]
fn schedule_and_cancel_storms_racing_a_manual_clock_keep_the_bound_exact() {
    storm(Some(ManualClock::new()));
}

fn storm(clock: Option<ManualClock>) {
    const LIMIT: usize = 6;
    const EACH: usize = 3_000;
    let timer = service("aho-sto", Some(LIMIT), clock.as_ref(), None);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let advancer = clock.clone().map(|clock| {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut advances = 0u64;
            while !stop.load(Ordering::SeqCst) {
                clock.advance(Duration::from_nanos(1));
                advances += 1;
            }
            advances
        })
    });
    let short = if clock.is_some() {
        Duration::from_nanos(1)
    } else {
        Duration::ZERO
    };
    let manual = clock.is_some();
    let ran = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (timer, ran, barrier) = (timer.clone(), ran.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let mut wins = 0;
                let mut held: Vec<TimerHandle> = Vec::new();
                let mut refused = 0usize;
                for i in 0..EACH {
                    let schedule = || {
                        let counter = ran.clone();
                        let run = move || {
                            counter.fetch_add(1, Ordering::SeqCst);
                        };
                        match (i + t) % 4 {
                            0 => timer.schedule(short, run),
                            1 => timer.schedule(LONG, run),
                            2 => timer.schedule_repeating(LONG, {
                                let mut run = Some(run);
                                move || {
                                    if let Some(run) = run.take() {
                                        run();
                                    }
                                }
                            }),
                            _ => timer.schedule_with_fixed_delay(LONG, {
                                let mut run = Some(run);
                                move || {
                                    if let Some(run) = run.take() {
                                        run();
                                    }
                                }
                            }),
                        }
                    };
                    let refused_since = Instant::now();
                    let handle = loop {
                        match schedule() {
                            Ok(handle) => break handle,
                            // A room a fire is about to free (the doc comment above).
                            Err(ScheduleError::TooManyPending { .. })
                                if refused_since.elapsed() < WAIT =>
                            {
                                refused += 1;
                                thread::yield_now();
                            }
                            Err(e) => panic!("thread {t}, timer {i}: {e} for {WAIT:?}"),
                        }
                    };
                    held.push(handle);
                    if held.len() == 3 {
                        if manual {
                            // Let the advancer in: some of these fire first.
                            for _ in 0..i % 4 {
                                thread::yield_now();
                            }
                        }
                        let clone = held.remove(i % 3).clone();
                        wins += usize::from(clone.cancel());
                        for handle in held.drain(..) {
                            wins += usize::from(handle.cancel());
                        }
                    }
                }
                for handle in held {
                    wins += usize::from(handle.cancel());
                }
                eprintln!("thread {t}: {refused} schedules refused for a moment");
                wins
            })
        })
        .collect();
    let wins: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    stop.store(true, Ordering::SeqCst);
    if let Some(advancer) = advancer {
        let advances = advancer.join().unwrap();
        clock.as_ref().unwrap().advance(Duration::from_nanos(1));
        eprintln!("{advances} advances; ran {}", ran.load(Ordering::SeqCst));
    }
    assert!(
        wait_until(WAIT, || ran.load(Ordering::SeqCst) + wins == 2 * EACH),
        "every timer ran or was cancelled: ran {}, cancelled {wins}",
        ran.load(Ordering::SeqCst)
    );
    assert!(
        wins >= 2 * EACH * 3 / 4,
        "the long ones are all cancelled: {wins}"
    );
    let all = take_exactly(&timer, LIMIT, LIMIT);
    give_back(all);
    let all = take_exactly(&timer, LIMIT, LIMIT);
    drop(timer.shutdown());
    drop(all);
}
