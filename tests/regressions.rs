//! Regression tests for the ten defects of the third outside audit (issue 19), one or
//! more per defect, each failing on 920c58f. The defect each covers is in its name and
//! its doc line; the rest of the suite keeps the guarantees they restore.
//!
//! | defect | test |
//! | --- | --- |
//! | 1. inline callbacks on each other's full rings hang | `d1_*` |
//! | 2. inline `shutdown` loses a repeating timer queued behind it | `d2_*` |
//! | 3. futures complete early when `max_pending` is reached | `d3_*` |
//! | 4. `ManualClock` saturation goes backwards; two meanings of "never" | `d4_*` |
//! | 5. ~8.4 million handle clones abort the process | `d5_*` |
//! | 6. a dropped repeating `Callback` does not cancel | `d6_*` |
//! | 7. `Stats::scheduled` counts every run; `pending` after shutdown | `d7_*` |
//! | 8. dropping a pending `Sleep`/`Timeout` wakes its task | `d8_*` |
//! | 9. a deadline at or before now races the shard | `d9_*` |
//! | 10. `Callback::deadline` is rounded to the tick | `d10_*` |

mod support;

use std::future::{pending, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use sharded_timer::{Callbacks, ManualClock, ScheduleError, ShardedTimer, TimerState};
use support::{queued, within, WAIT};

const MS: Duration = Duration::from_millis(1);

/// A service of `shards` shards on `clock`, callbacks as `callbacks` says.
fn manual(clock: &ManualClock, shards: usize, callbacks: Callbacks) -> sharded_timer::Builder {
    ShardedTimer::builder()
        .shards(shards)
        .callbacks(callbacks)
        .pin_cores(false)
        .thread_name("regress")
        .clock(clock.clone())
}

/// Polls `future` once with a waker that does nothing.
fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

/// A waker that counts its wakes.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Schedules `f` due in 5 ms from a thread of its own: a thread's timers go to one
/// shard 64 at a time, so callbacks scheduled from fresh threads land on every shard.
fn on_a_new_thread(timer: &ShardedTimer, f: impl FnOnce() + Send + 'static) {
    let timer = timer.clone();
    std::thread::spawn(move || timer.schedule(5 * MS, f).map(drop))
        .join()
        .unwrap()
        .unwrap();
}

/// Defect 1: two shards whose inline callbacks schedule onto each other's full
/// (2-slot) insert rings finish, and `advance` and `shutdown` return.
#[test]
fn d1_inline_callbacks_scheduling_onto_each_others_full_rings_finish() {
    const CALLBACKS: usize = 16;
    const EACH: usize = 2_000;
    let clock = ManualClock::new();
    let timer = manual(&clock, 2, Callbacks::inline())
        .ring_capacity(2)
        .build()
        .unwrap();
    let scheduled = Arc::new(AtomicUsize::new(0));
    for _ in 0..CALLBACKS {
        let (inner, scheduled) = (timer.clone(), scheduled.clone());
        on_a_new_thread(&timer, move || {
            for _ in 0..EACH {
                inner.schedule(Duration::from_secs(3_600), || {}).unwrap();
                scheduled.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    let (clock2, timer2) = (clock.clone(), timer.clone());
    let unfired = within(WAIT, move || {
        clock2.advance(5 * MS);
        timer2.shutdown().len()
    })
    .expect("advance and shutdown return: no shard waits for another");
    assert_eq!(scheduled.load(Ordering::SeqCst), CALLBACKS * EACH);
    assert_eq!(unfired, CALLBACKS * EACH, "every far timer comes back");
}

/// Defect 1, the message ring: inline callbacks cancelling timers filed on the other
/// shard through its full message ring finish too.
#[test]
fn d1_inline_callbacks_cancelling_through_each_others_full_message_rings_finish() {
    const CALLBACKS: usize = 16;
    const EACH: usize = 500;
    let clock = ManualClock::new();
    let timer = manual(&clock, 2, Callbacks::inline())
        .ring_capacity(2)
        .build()
        .unwrap();
    // Far timers spread over both shards, filed before the callbacks run.
    let far: Vec<_> = (0..CALLBACKS * EACH)
        .map(|_| timer.schedule(Duration::from_secs(3_600), || {}).unwrap())
        .collect();
    clock.advance(Duration::ZERO);
    let far = Arc::new(far);
    let won = Arc::new(AtomicUsize::new(0));
    for k in 0..CALLBACKS {
        let (far, won) = (far.clone(), won.clone());
        on_a_new_thread(&timer, move || {
            for handle in &far[k * EACH..(k + 1) * EACH] {
                if handle.cancel() {
                    won.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
    }
    let (clock2, timer2) = (clock.clone(), timer.clone());
    let unfired = within(WAIT, move || {
        clock2.advance(5 * MS);
        timer2.shutdown().len()
    })
    .expect("advance and shutdown return");
    assert_eq!(won.load(Ordering::SeqCst), CALLBACKS * EACH);
    assert_eq!(unfired, 0);
}

/// Defect 2: a repeating timer fired in the same turn as, and queued behind, an inline
/// callback that calls `shutdown` runs once and comes back among the `Unfired`.
#[test]
fn d2_inline_shutdown_hands_back_a_repeating_timer_queued_behind_it() {
    let clock = ManualClock::new();
    let timer = manual(&clock, 1, Callbacks::inline()).build().unwrap();
    let returned = Arc::new(Mutex::new(None));
    {
        let (inner, returned) = (timer.clone(), returned.clone());
        timer
            .schedule(5 * MS, move || {
                *returned.lock().unwrap() = Some(inner.shutdown());
            })
            .unwrap();
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let repeating = timer
        .schedule_repeating(10 * MS, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    // One turn fires both: the shutdown first (5 ms), the run behind it (10 ms).
    clock.advance(10 * MS);
    let unfired = returned
        .lock()
        .unwrap()
        .take()
        .expect("the callback shut down");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the queued run ran once");
    let ids: Vec<_> = unfired.iter().map(|u| u.id()).collect();
    assert_eq!(ids, vec![repeating.id()], "and its timer came back");
    assert_eq!(
        repeating.state(),
        TimerState::Pending,
        "nobody cancelled it"
    );
    for unfired in unfired {
        unfired.run();
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "its Unfired makes one last run"
    );
}

/// Defect 3: with `max_pending` reached, `sleep`, `timeout` and `interval` still get
/// their timers and complete only at their deadlines; the `try_*` forms are refused.
#[test]
fn d3_futures_get_their_timer_when_max_pending_is_reached() {
    let clock = ManualClock::new();
    let timer = manual(&clock, 1, Callbacks::pool(1))
        .max_pending(1)
        .build()
        .unwrap();
    let _room = timer.schedule(Duration::from_secs(3_600), || {}).unwrap();
    assert!(matches!(
        timer.schedule(MS, || {}),
        Err(ScheduleError::TooManyPending { limit: 1 })
    ));
    assert!(matches!(
        timer.try_sleep(5 * MS),
        Err(ScheduleError::TooManyPending { limit: 1 })
    ));

    let mut sleep = pin!(timer.sleep(5 * MS));
    let mut timeout = pin!(timer.timeout(5 * MS, pending::<()>()));
    let mut interval = timer.interval(10 * MS);
    assert!(
        poll_once(pin!(interval.tick())).is_ready(),
        "the first tick"
    );
    assert!(poll_once(sleep.as_mut()).is_pending(), "not early");
    assert!(poll_once(timeout.as_mut()).is_pending(), "not early");
    assert!(poll_once(pin!(interval.tick())).is_pending());
    assert!(!interval.is_shut_down());
    assert_eq!(sleep.refused(), None);

    clock.advance(4 * MS);
    assert!(poll_once(sleep.as_mut()).is_pending());
    assert!(poll_once(timeout.as_mut()).is_pending());
    clock.advance(MS);
    assert!(poll_once(sleep.as_mut()).is_ready());
    assert!(sleep.is_elapsed());
    match poll_once(timeout.as_mut()) {
        Poll::Ready(Err(elapsed)) => assert_eq!(elapsed.refused(), None, "really elapsed"),
        other => panic!("the timeout elapsed at 5 ms: {other:?}"),
    }
    assert!(poll_once(pin!(interval.tick())).is_pending());
    clock.advance(5 * MS);
    assert!(poll_once(pin!(interval.tick())).is_ready());
    // The futures' timers never took room: the bound still holds exactly.
    assert!(timer.schedule(MS, || {}).is_err());
    drop(timer.shutdown());
}

/// Defect 4: the manual clock never goes backwards, a timer due in 200 years fires
/// after `advance(Duration::MAX)`, and `Duration::MAX` means one thing for a sleep as
/// for a scheduled timer: the clock's far future (since issue 29, which
/// `advance(Duration::MAX)` reaches, as tokio's paused clock does).
#[test]
fn d4_manual_clock_saturation_never_goes_backwards_and_max_means_one_far_future() {
    const YEAR: Duration = Duration::from_secs(365 * 24 * 3_600);
    let clock = ManualClock::new();
    let timer = manual(&clock, 1, Callbacks::inline()).build().unwrap();
    let fired = Arc::new(AtomicUsize::new(0));
    let counter = fired.clone();
    timer
        .schedule(200 * YEAR, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let never = timer.schedule(Duration::MAX, || {}).unwrap();
    let mut sleep_never = pin!(timer.sleep(Duration::MAX));

    clock.advance(101 * YEAR);
    assert!(
        poll_once(sleep_never.as_mut()).is_pending(),
        "MAX is centuries away"
    );
    assert_eq!(fired.load(Ordering::SeqCst), 0);
    assert_eq!(never.state(), TimerState::Pending);
    let at_101 = clock.now();
    clock.advance(Duration::MAX);
    assert!(clock.now() > at_101 + 100 * YEAR, "saturates forward");
    assert_eq!(fired.load(Ordering::SeqCst), 1, "the 200-year timer fired");
    assert_eq!(never.deadline(), sleep_never.deadline(), "one far future");
    assert_eq!(clock.now(), never.deadline(), "where the clock saturates");
    assert!(
        poll_once(sleep_never.as_mut()).is_ready(),
        "MAX elapses there, for a sleep"
    );
    assert_eq!(never.state(), TimerState::Fired, "as for a timer");
    let saturated = clock.now();
    clock.advance(Duration::MAX);
    assert_eq!(clock.now(), saturated, "saturated: it stays");
    drop(timer.shutdown());

    let clock = ManualClock::new();
    clock.advance(200 * YEAR);
    let at_200 = clock.now();
    clock.advance(Duration::MAX);
    assert!(clock.now() > at_200, "time never goes backwards");
}

/// Defect 5: more clones of one handle than the 24-bit count holds saturate it (the
/// entry is then kept for ever) instead of aborting the process.
#[test]
fn d5_millions_of_handle_clones_saturate_instead_of_aborting() {
    let timer = ShardedTimer::builder()
        .shards(1)
        .executor_threads(1)
        .pin_cores(false)
        .build()
        .unwrap();
    let handle = timer.schedule(Duration::from_secs(3_600), || {}).unwrap();
    let clones: Vec<_> = (0..(1usize << 24) + 16).map(|_| handle.clone()).collect();
    assert_eq!(clones[clones.len() - 1].state(), TimerState::Pending);
    drop(clones);
    assert_eq!(handle.state(), TimerState::Pending);
    assert!(handle.cancel());
    assert_eq!(handle.state(), TimerState::Cancelled);
    drop(handle);
    drop(timer.shutdown());
}

/// Defect 6: a repeating timer's run dropped unrun by the spawner cancels the timer,
/// as documented: no run is handed over again.
#[test]
fn d6_a_repeating_run_dropped_unrun_cancels_its_timer() {
    let clock = ManualClock::new();
    let (callbacks, queue) = queued();
    let timer = manual(&clock, 1, callbacks).build().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let handle = timer
        .schedule_repeating(2 * MS, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    clock.advance(2 * MS);
    drop(
        queue
            .recv_timeout(WAIT)
            .expect("the first run is handed over"),
    );
    assert_eq!(handle.state(), TimerState::Cancelled);
    assert!(!handle.cancel(), "already cancelled");
    clock.advance(20 * MS);
    assert!(queue.try_recv().is_err(), "no run after it was dropped");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let stats = timer.stats();
    assert_eq!((stats.pending, stats.cancelled), (0, 1), "{stats:?}");
}

/// Defect 7: a repeating timer counts once in `scheduled`, its runs in `fired`;
/// `pending` reads 0 once it is cancelled, and after `shutdown` returns.
#[test]
fn d7_a_repeating_timer_counts_once_in_scheduled_and_pending_is_zero_after_shutdown() {
    let clock = ManualClock::new();
    let timer = manual(&clock, 1, Callbacks::inline()).build().unwrap();
    let handle = timer.schedule_repeating(MS, || {}).unwrap();
    for _ in 0..10 {
        clock.advance(MS);
    }
    let stats = timer.stats();
    assert_eq!((stats.scheduled, stats.fired, stats.pending), (1, 10, 1));
    assert!(handle.cancel());
    clock.advance(MS);
    let stats = timer.stats();
    assert_eq!(
        (stats.scheduled, stats.fired, stats.cancelled, stats.pending),
        (1, 10, 1, 0)
    );

    let _far = timer.schedule(Duration::from_secs(60), || {}).unwrap();
    let _beat = timer.schedule_repeating(MS, || {}).unwrap();
    clock.advance(3 * MS);
    assert_eq!(timer.shutdown().len(), 2);
    let stats = timer.stats();
    assert_eq!(stats.scheduled, 3, "{stats:?}");
    assert_eq!(
        stats.pending, 0,
        "nothing is pending once shutdown returned"
    );
    assert!(format!("{timer:?}").contains("pending: 0"));
}

/// Defect 8: dropping a pending `Sleep`, or a `Timeout` whose future won, cancels its
/// timer and wakes nobody.
#[test]
fn d8_dropping_a_pending_sleep_or_timeout_wakes_nobody() {
    let clock = ManualClock::new();
    let timer = manual(&clock, 1, Callbacks::inline()).build().unwrap();
    let wakes = Arc::new(CountingWaker::default());
    let waker = Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&waker);

    let mut sleep = Box::pin(timer.sleep(Duration::from_secs(5)));
    assert!(sleep.as_mut().poll(&mut cx).is_pending());
    drop(sleep);

    let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
    let mut timeout = Box::pin(timer.timeout(Duration::from_secs(5), rx));
    assert!(timeout.as_mut().poll(&mut cx).is_pending());
    tx.send(7).unwrap();
    let woken_by_the_channel = wakes.0.load(Ordering::SeqCst);
    assert!(matches!(
        timeout.as_mut().poll(&mut cx),
        Poll::Ready(Ok(Ok(7)))
    ));
    drop(timeout);

    clock.advance(Duration::from_secs(10));
    assert_eq!(
        wakes.0.load(Ordering::SeqCst),
        woken_by_the_channel,
        "no wake from a dropped sleep or timeout"
    );
    assert_eq!(woken_by_the_channel, 1, "the channel's own wake");
    let stats = timer.stats();
    assert_eq!((stats.fired, stats.cancelled, stats.pending), (0, 2, 0));
}

/// Defect 9: a deadline at or before now completes at the first poll, with no timer.
#[test]
fn d9_a_deadline_at_or_before_now_completes_at_the_first_poll() {
    let clock = ManualClock::new();
    let timer = manual(&clock, 1, Callbacks::inline()).build().unwrap();
    for _ in 0..8 {
        let mut now = pin!(timer.sleep_until(clock.now()));
        assert!(poll_once(now.as_mut()).is_ready());
        assert!(now.is_elapsed());
        let mut zero = pin!(timer.sleep(Duration::ZERO));
        assert!(poll_once(zero.as_mut()).is_ready());
        let mut timeout = pin!(timer.timeout(Duration::ZERO, pending::<()>()));
        match poll_once(timeout.as_mut()) {
            Poll::Ready(Err(elapsed)) => assert_eq!(elapsed.refused(), None),
            other => panic!("timeout(ZERO, pending) elapsed at once: {other:?}"),
        }
        let mut later = pin!(timer.sleep(Duration::from_secs(1)));
        assert!(poll_once(later.as_mut()).is_pending());
        later.as_mut().reset((clock.now() - MS).into());
        assert!(poll_once(later.as_mut()).is_ready(), "reset into the past");
        clock.advance(MS);
    }
    assert_eq!(
        timer.stats().scheduled,
        8,
        "only the 1 s sleeps took a timer"
    );
}

/// Defect 10: the deadline a spawner's `Callback` reports is the one the timer's
/// handle reports: the requested instant, not rounded to the tick.
#[test]
fn d10_a_callback_reports_the_requested_deadline() {
    let clock = ManualClock::new();
    let (callbacks, queue) = queued();
    let timer = manual(&clock, 1, callbacks).build().unwrap();
    let deadline = clock.now() + Duration::from_micros(2_480);
    let handle = timer.schedule_at(deadline, || {}).unwrap();
    clock.advance(3 * MS);
    let callback = queue.recv_timeout(WAIT).unwrap();
    assert_eq!(callback.deadline(), deadline);
    assert_eq!(callback.deadline(), handle.deadline());
    callback.run();
}
