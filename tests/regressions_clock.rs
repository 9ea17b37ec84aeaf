//! Regression tests for the clock defects of issue 29 (5, 9, 10 and 11; 11's test is a
//! unit test in `src/clock/coarse.rs`, since it injects a fault into the calibration),
//! each failing on 1da8323. The defect each covers is in its name and its doc line.
//!
//! | defect | test |
//! | --- | --- |
//! | 5. `ManualClock` leaves a due deadline pending inside the current tick | `d5_*` |
//! | 9. `deadline()` is not the instant asked for before the clock's origin | `d9_*` |
//! | 10. tokio's `immediate_sleep`, `exactly_max`, `no_out_of_bounds_close_to_max` | `d10_*` |

mod support;

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use sharded_timer::{Callbacks, ManualClock, ShardedTimer, TimerState};
use support::{queued, WAIT};

const MS: Duration = Duration::from_millis(1);
const US: Duration = Duration::from_micros(1);
const HOUR: Duration = Duration::from_secs(3_600);

/// A service of `shards` shards and a 1 ms tick on `clock`, callbacks as `callbacks`
/// says.
fn manual(clock: &ManualClock, shards: usize, callbacks: Callbacks) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(shards)
        .callbacks(callbacks)
        .tick(MS)
        .pin_cores(false)
        .thread_name("regress-clk")
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// A waker that counts its wakes.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl CountingWaker {
    fn wakes(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

fn poll_with<F: Future + ?Sized>(
    future: Pin<&mut F>,
    waker: &Arc<CountingWaker>,
) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(&Waker::from(waker.clone())))
}

fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

/// A callback that counts its runs and checks it never runs before `deadline` on
/// `clock`.
fn counting(
    runs: &Arc<AtomicUsize>,
    clock: &ManualClock,
    deadline: Instant,
) -> impl FnOnce() + Send + 'static {
    let runs = runs.clone();
    let clock = clock.clone();
    move || {
        assert!(clock.now() >= deadline, "never early");
        runs.fetch_add(1, Ordering::SeqCst);
    }
}

/// Defect 5, first form: at 1.5 ms on a 1 ms tick, `schedule_at(now)` then
/// `advance(ZERO)` fires it before `advance` returns (it waited for 2 ms), on the pool
/// and inline, on one shard and two.
#[test]
fn d5_schedule_at_now_mid_tick_fires_on_advance_zero() {
    for callbacks in [Callbacks::pool(1), Callbacks::inline()] {
        for shards in [1, 2] {
            let clock = ManualClock::new();
            let timer = manual(&clock, shards, callbacks.clone());
            clock.advance(MS + 500 * US);
            let runs = Arc::new(AtomicUsize::new(0));
            let now = clock.now();
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    timer
                        .schedule_at(now, counting(&runs, &clock, now))
                        .unwrap()
                })
                .collect();
            // One not due yet, in the same tick: it must stay pending (never early).
            let later = timer
                .schedule_at(now + 100 * US, counting(&runs, &clock, now + 100 * US))
                .unwrap();
            clock.advance(Duration::ZERO);
            assert_eq!(
                runs.load(Ordering::SeqCst),
                4,
                "{callbacks:?}, {shards} shards"
            );
            assert!(handles.iter().all(|h| h.state() == TimerState::Fired));
            assert_eq!(later.state(), TimerState::Pending, "100 µs ahead: not yet");
            clock.advance(100 * US);
            assert_eq!(runs.load(Ordering::SeqCst), 5, "due at 1.6 ms exactly");
            assert_eq!(later.state(), TimerState::Fired);
            drop(timer.shutdown());
        }
    }
}

/// Defect 5, second form: a callback that runs at 1.5 ms (the clock advanced there)
/// and schedules `schedule(ZERO)`: the child is due at 1.5 ms and has run when that
/// `advance` returns.
#[test]
fn d5_a_callbacks_schedule_zero_mid_tick_runs_within_the_same_advance() {
    for callbacks in [Callbacks::pool(1), Callbacks::inline()] {
        let clock = ManualClock::new();
        let timer = manual(&clock, 2, callbacks.clone());
        let runs = Arc::new(AtomicUsize::new(0));
        let child_at = Arc::new(Mutex::new(None));
        let (service, seen, tally, at) =
            (timer.clone(), clock.clone(), runs.clone(), child_at.clone());
        let start = clock.now();
        timer
            .schedule(MS, move || {
                let now = seen.now();
                *at.lock().unwrap() = Some(now);
                service
                    .schedule(Duration::ZERO, counting(&tally, &seen, now))
                    .unwrap();
            })
            .unwrap();
        clock.advance(MS + 500 * US);
        assert_eq!(
            *child_at.lock().unwrap(),
            Some(start + MS + 500 * US),
            "the parent ran at the new now"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{callbacks:?}: the child ran"
        );
        drop(timer.shutdown());
    }
}

/// Defect 5, third form: a task awaiting a 1.5 ms `Sleep` is woken, and the sleep is
/// ready, once `advance(1.5 ms)` returns (it waited for 2 ms); one of 1.6 ms is not.
#[test]
fn d5_a_sleep_ending_mid_tick_completes_when_the_clock_reaches_it() {
    for callbacks in [Callbacks::pool(1), Callbacks::inline()] {
        let clock = ManualClock::new();
        let timer = manual(&clock, 1, callbacks.clone());
        let waker = Arc::new(CountingWaker::default());
        let mut sleep = pin!(timer.sleep(MS + 500 * US));
        let mut later = pin!(timer.sleep(MS + 600 * US));
        assert!(poll_with(sleep.as_mut(), &waker).is_pending());
        assert!(poll_once(later.as_mut()).is_pending());
        clock.advance(MS + 500 * US);
        assert_eq!(
            waker.wakes(),
            1,
            "{callbacks:?}: woken before advance returned"
        );
        assert!(poll_with(sleep.as_mut(), &waker).is_ready());
        assert!(sleep.is_elapsed());
        assert!(poll_once(later.as_mut()).is_pending(), "never early");
        assert!(!later.is_elapsed());
        drop(timer.shutdown());
    }
}

/// Defect 9: `schedule_at(now - 1 h)`, before the clock's origin, reports the instant
/// asked for from `TimerHandle::deadline` (it read 3,599.95 s later), fires at once,
/// and so do `Callback::deadline`, `Sleep::deadline` and `Timeout::deadline`; on the
/// system clock as on a manual one.
#[test]
fn d9_deadlines_before_the_clock_origin_read_back_exactly() {
    // The system clock: its origin is when the first service of the process started.
    let timer = support::small_timer();
    let asked = Instant::now() - HOUR;
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = timer
        .schedule_at(asked, move || {
            let _ = tx.send(());
        })
        .unwrap();
    assert_eq!(handle.deadline(), asked);
    rx.recv_timeout(WAIT).unwrap();
    assert_eq!(handle.deadline(), asked, "after it fired too");
    let before_reset = Instant::now() - 2 * HOUR;
    let parked = timer.schedule(HOUR, || {}).unwrap();
    assert!(parked.reset_at(before_reset));
    assert_eq!(
        parked.deadline(),
        before_reset,
        "reset_at before the origin"
    );
    assert_eq!(timer.sleep_until(asked).deadline(), asked);
    assert_eq!(
        timer
            .timeout_at(asked, std::future::pending::<()>())
            .deadline(),
        asked
    );
    drop(timer.shutdown());

    // A manual clock: its origin is its start.
    let (callbacks, handed) = queued();
    let clock = ManualClock::new();
    let timer = manual(&clock, 1, callbacks);
    let asked = clock.now() - HOUR;
    let handle = timer.schedule_at(asked, || {}).unwrap();
    assert_eq!(handle.deadline(), asked);
    clock.advance(Duration::ZERO);
    let callback = handed.recv_timeout(WAIT).unwrap();
    assert_eq!(callback.deadline(), asked, "Callback::deadline");
    callback.run();
    assert_eq!(handle.state(), TimerState::Fired);
    assert_eq!(handle.deadline(), asked);
    let sleep = timer.sleep_until(asked);
    assert_eq!(sleep.deadline(), asked, "Sleep::deadline");
    assert_eq!(timer.timeout_at(asked, async {}).deadline(), asked);
    drop(timer.shutdown());
}

/// Defect 9, `Unfired`: a timer asked for an hour before the manual clock's start and
/// handed back by a `shutdown` (from an inline callback, before its shard could turn
/// again) reports the instant asked for.
#[test]
fn d9_unfired_deadline_before_the_origin_is_the_instant_asked_for() {
    let clock = ManualClock::new();
    let timer = manual(&clock, 1, Callbacks::inline());
    let asked = clock.now() - HOUR;
    let reported = Arc::new(Mutex::new(Vec::new()));
    let (service, out) = (timer.clone(), reported.clone());
    timer
        .schedule(MS, move || {
            service.schedule_at(asked, || {}).unwrap();
            let unfired = service.shutdown();
            *out.lock().unwrap() = unfired.iter().map(|u| u.deadline()).collect();
        })
        .unwrap();
    clock.advance(MS);
    assert_eq!(*reported.lock().unwrap(), vec![asked]);
    drop(timer.shutdown());
}

/// tokio's `MAX_DURATION` (its wheel's range, in ms) in `time_sleep.rs`.
const TOKIO_MAX_DURATION: u64 = (1 << 36) - 1;

/// Defect 10, tokio's `immediate_sleep`: `sleep_until(now)` is not elapsed before its
/// first poll (it read `true`), is ready at that poll, and then is elapsed, with the
/// clock moved by less than a tick (tokio: within 1 ms).
#[test]
fn d10_tokio_immediate_sleep() {
    let clock = ManualClock::new();
    let timer = manual(&clock, 1, Callbacks::inline());
    let now = timer.now();
    let mut sleep = pin!(timer.sleep_until(now));
    assert!(!sleep.is_elapsed(), "not elapsed until polled");
    assert!(
        poll_once(sleep.as_mut()).is_ready(),
        "ready at the first poll"
    );
    assert!(sleep.is_elapsed());
    assert!(timer.now() - now <= MS);
    // The same after a reset to a passed deadline, and on the system clock.
    sleep.as_mut().reset(now.into());
    assert!(poll_once(sleep.as_mut()).is_ready());
    assert!(sleep.is_elapsed());
    drop(timer.shutdown());
    let timer = support::small_timer();
    let now = Instant::now();
    let mut sleep = pin!(timer.sleep_until(now));
    assert!(!sleep.is_elapsed(), "not elapsed until polled");
    assert!(poll_once(sleep.as_mut()).is_ready());
    assert!(sleep.is_elapsed());
    drop(timer.shutdown());
}

/// Awaits a sleep of `delay` as tokio's paused clock does: polls it, and while it is
/// pending advances the manual clock to its deadline (`advance_by` says how), at most
/// twice; returns whether it completed, elapsed, with the clock at or after its
/// deadline.
fn await_with_advance(
    delay: Duration,
    advance_by: impl Fn(&ShardedTimer, Instant) -> Duration,
) -> bool {
    let clock = ManualClock::new();
    let timer = manual(&clock, 1, Callbacks::inline());
    let mut sleep = pin!(timer.sleep(delay));
    let deadline = sleep.deadline().into_std();
    let mut done = poll_once(sleep.as_mut()).is_ready();
    for _ in 0..2 {
        if done {
            break;
        }
        clock.advance(advance_by(&timer, deadline));
        done = poll_once(sleep.as_mut()).is_ready();
    }
    let ok = done && sleep.is_elapsed() && timer.now() >= deadline;
    drop(timer.shutdown());
    ok
}

/// Defect 10, tokio's `exactly_max`: a sleep of tokio's longest delay, and of
/// `Duration::MAX` (which saturates at the clock's far future, its reported deadline),
/// completes once the clock is advanced to its deadline (`Duration::MAX` never did).
#[test]
fn d10_tokio_exactly_max() {
    let to_deadline = |timer: &ShardedTimer, deadline: Instant| deadline - timer.now();
    let all_the_way = |_: &ShardedTimer, _: Instant| Duration::MAX;
    assert!(await_with_advance(
        Duration::from_millis(TOKIO_MAX_DURATION),
        to_deadline
    ));
    assert!(
        await_with_advance(Duration::MAX, all_the_way),
        "advance(MAX)"
    );
    assert!(
        await_with_advance(Duration::MAX, to_deadline),
        "advance to its deadline"
    );
}

/// Defect 10, tokio's `no_out_of_bounds_close_to_max`: as `exactly_max`, one
/// millisecond short of the longest delay.
#[test]
fn d10_tokio_no_out_of_bounds_close_to_max() {
    let to_deadline = |timer: &ShardedTimer, deadline: Instant| deadline - timer.now();
    let all_the_way = |_: &ShardedTimer, _: Instant| Duration::MAX;
    assert!(await_with_advance(
        Duration::from_millis(TOKIO_MAX_DURATION - 1),
        to_deadline
    ));
    assert!(
        await_with_advance(Duration::MAX - MS, all_the_way),
        "advance(MAX)"
    );
    assert!(
        await_with_advance(Duration::MAX - MS, to_deadline),
        "advance to its deadline"
    );
}

/// Defect 10's guard: with `advance(Duration::MAX)` reaching the far future, repeating
/// timers (fixed rate and fixed delay, of an hour and of `Duration::MAX`) run once
/// there and no more, so the call returns (at the far future every run would
/// otherwise be due again at once); each stays pending.
#[test]
fn d10_advance_max_runs_repeating_timers_once_at_the_far_future_and_returns() {
    let clock = ManualClock::new();
    let timer = manual(&clock, 2, Callbacks::pool(1));
    let runs = Arc::new(AtomicUsize::new(0));
    let count = |runs: &Arc<AtomicUsize>| {
        let runs = runs.clone();
        move || {
            runs.fetch_add(1, Ordering::SeqCst);
        }
    };
    let handles = [
        timer.schedule_repeating(HOUR, count(&runs)).unwrap(),
        timer.schedule_with_fixed_delay(HOUR, count(&runs)).unwrap(),
        timer
            .schedule_repeating(Duration::MAX, count(&runs))
            .unwrap(),
        timer
            .schedule_with_fixed_delay(Duration::MAX, count(&runs))
            .unwrap(),
    ];
    let advancing = clock.clone();
    let returned = support::within(WAIT, move || advancing.advance(Duration::MAX));
    assert!(returned.is_some(), "advance(Duration::MAX) returned");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        4,
        "each ran once at the far future"
    );
    clock.advance(Duration::MAX);
    assert_eq!(runs.load(Ordering::SeqCst), 4, "and no more");
    assert!(handles.iter().all(|h| h.state() == TimerState::Pending));
    assert_eq!(timer.shutdown().len(), 4);
}
