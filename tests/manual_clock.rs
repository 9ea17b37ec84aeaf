//! `ManualClock`: time that tests control. Every test here simulates seconds to an
//! hour of timers and runs in well under a second of wall time; each asserts exact fire
//! counts and "never early" against the manual clock, and bounds its wall time
//! generously (a tenth of the simulated time, or less) so that a real sleep anywhere
//! on the path fails it.

mod support;

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use sharded_timer::{
    Callbacks, Interval, ManualClock, MissedTickBehavior, ScheduleError, ShardedTimer, TimerState,
};
use support::{within, WAIT};

const MS: Duration = Duration::from_millis(1);

/// A two-shard, two-worker service on `clock`, callbacks on `callbacks`.
fn service(clock: &ManualClock, callbacks: Callbacks) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(2)
        .callbacks(callbacks)
        .pin_cores(false)
        .thread_name("manual")
        .clock(clock.clone())
        .build()
        .expect("a manual-clock service builds")
}

/// Polls `future` once with a waker that does nothing: under a manual clock, whether a
/// timer future is ready depends only on the clock, so tests poll at known points.
fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

/// Counts fired callbacks, and those that ran before their deadline by the clock.
#[derive(Clone, Default)]
struct Tally {
    fired: Arc<AtomicUsize>,
    early: Arc<AtomicUsize>,
}

impl Tally {
    /// A callback due at `deadline` that counts itself.
    fn callback(&self, clock: &ManualClock, deadline: Instant) -> impl FnOnce() + Send + 'static {
        let (tally, clock) = (self.clone(), clock.clone());
        move || {
            if clock.now() < deadline {
                tally.early.fetch_add(1, Ordering::SeqCst);
            }
            tally.fired.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn fired(&self) -> usize {
        self.fired.load(Ordering::SeqCst)
    }
    fn early(&self) -> usize {
        self.early.load(Ordering::SeqCst)
    }
}

#[test]
fn a_thirty_second_timeout_fires_at_thirty_seconds_and_not_a_tick_before() {
    let wall = Instant::now();
    let clock = ManualClock::new();
    let timer = service(&clock, Callbacks::pool(2));
    let start = clock.now();
    let tally = Tally::default();
    let deadline = start + Duration::from_secs(30);
    let handle = timer
        .schedule(Duration::from_secs(30), tally.callback(&clock, deadline))
        .unwrap();
    assert_eq!(
        handle.deadline(),
        deadline,
        "the grid starts at the clock's start"
    );
    clock.advance(Duration::from_secs(30) - MS);
    assert_eq!(tally.fired(), 0);
    assert_eq!(handle.state(), TimerState::Pending);
    clock.advance(MS);
    assert_eq!(
        tally.fired(),
        1,
        "advance returns after the callback returned"
    );
    assert_eq!(clock.now(), deadline);
    assert_eq!(tally.early(), 0);
    assert!(
        wall.elapsed() < Duration::from_secs(3),
        "{:?}",
        wall.elapsed()
    );
}

#[test]
fn a_keepalive_storm_of_thirty_seconds_fires_exactly_the_idle_connections() {
    // 2,000 connections with a 30 s idle timeout; the even ones send a packet every
    // 10 s (their timer is reset), the odd ones go quiet after a connection-specific
    // moment. Simulated: 120 s in 100 ms steps.
    let wall = Instant::now();
    let clock = ManualClock::new();
    let timer = service(&clock, Callbacks::pool(2));
    let start = clock.now();
    let closed = Arc::new(Mutex::new(Vec::new()));
    let early = Arc::new(AtomicUsize::new(0));
    let idle = Duration::from_secs(30);
    let connections = 2_000usize;
    let handles: Vec<_> = (0..connections)
        .map(|connection| {
            let (closed, clock, early) = (closed.clone(), clock.clone(), early.clone());
            let last_packet = Arc::new(AtomicU64::new(0));
            let seen = last_packet.clone();
            let handle = timer
                .schedule(idle, move || {
                    let quiet =
                        clock.now() - (start + Duration::from_nanos(seen.load(Ordering::SeqCst)));
                    if quiet < idle {
                        early.fetch_add(1, Ordering::SeqCst);
                    }
                    closed.lock().unwrap().push(connection);
                })
                .unwrap();
            (handle, last_packet)
        })
        .collect();
    // The odd connection k sends packets until (k % 50) seconds, then goes quiet.
    let quiet_from = |connection: usize| Duration::from_secs((connection % 50) as u64);
    let step = Duration::from_millis(100);
    let mut now = Duration::ZERO;
    while now < Duration::from_secs(120) {
        clock.advance(step);
        now += step;
        if now.as_millis().is_multiple_of(10_000) {
            for (connection, (handle, last_packet)) in handles.iter().enumerate() {
                if connection.is_multiple_of(2) || now <= quiet_from(connection) {
                    last_packet.store(now.as_nanos() as u64, Ordering::SeqCst);
                    assert!(handle.reset(idle), "connection {connection} was still open");
                }
            }
        }
    }
    let mut closed = closed.lock().unwrap().clone();
    closed.sort_unstable();
    let expected: Vec<usize> = (0..connections).filter(|c| c % 2 == 1).collect();
    assert_eq!(
        closed, expected,
        "exactly the quiet connections closed, once each"
    );
    assert_eq!(early.load(Ordering::SeqCst), 0, "none before 30 s of quiet");
    for (connection, (handle, _)) in handles.iter().enumerate() {
        let expected = if connection % 2 == 0 {
            TimerState::Pending
        } else {
            TimerState::Fired
        };
        assert_eq!(handle.state(), expected, "connection {connection}");
    }
    assert!(
        wall.elapsed() < Duration::from_secs(12),
        "{:?}",
        wall.elapsed()
    );
}

#[test]
fn a_hundred_thousand_timers_over_a_simulated_hour_fire_exactly_on_time() {
    let wall = Instant::now();
    let clock = ManualClock::new();
    let timer = service(&clock, Callbacks::pool(2));
    let start = clock.now();
    let tally = Tally::default();
    // Deadlines spread over the hour, in whole milliseconds (on the tick grid), from a
    // fixed linear congruential sequence.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut offsets: Vec<u64> = (0..100_000)
        .map(|_| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % 3_600_000 + 1
        })
        .collect();
    for &ms in &offsets {
        let delay = Duration::from_millis(ms);
        timer
            .schedule(delay, tally.callback(&clock, start + delay))
            .unwrap();
    }
    offsets.sort_unstable();
    // One second at a time: after each advance, exactly the timers due by now fired.
    for second in 1..=3_600u64 {
        clock.advance(Duration::from_secs(1));
        let due = offsets.partition_point(|&ms| ms <= second * 1_000);
        assert_eq!(tally.fired(), due, "at {second} s");
    }
    assert_eq!(tally.fired(), 100_000);
    assert_eq!(tally.early(), 0);
    assert_eq!(timer.stats().pending, 0);
    assert!(
        wall.elapsed() < Duration::from_secs(60),
        "{:?}",
        wall.elapsed()
    );
}

#[test]
fn advance_runs_to_a_fixed_point_across_shards_in_every_callback_mode() {
    for callbacks in [Callbacks::pool(2), Callbacks::inline()] {
        let clock = ManualClock::new();
        let timer = service(&clock, callbacks.clone());
        let start = clock.now();
        let hops = Arc::new(Mutex::new(Vec::new()));
        // A chain of 21 timers (the first due at 1 ms), each scheduled by the previous one's callback: the odd
        // hops with a delay of zero, the even ones at an instant in the 50 ms advanced
        // (so already past): all are due by the new now, so all fire in one advance.
        fn hop(
            timer: &ShardedTimer,
            clock: &ManualClock,
            hops: &Arc<Mutex<Vec<Instant>>>,
            start: Instant,
            left: u32,
        ) {
            let (next_timer, clock2, hops2) = (timer.clone(), clock.clone(), hops.clone());
            let callback = move || {
                hops2.lock().unwrap().push(clock2.now());
                if left > 0 {
                    hop(&next_timer, &clock2, &hops2, start, left - 1);
                }
            };
            if left % 2 == 1 {
                timer.schedule(Duration::ZERO, callback).unwrap();
            } else {
                timer
                    .schedule_at(start + MS * (21 - left), callback)
                    .unwrap();
            }
        }
        hop(&timer, &clock, &hops, start, 20);
        clock.advance(MS * 50);
        let hops = hops.lock().unwrap().clone();
        assert_eq!(
            hops.len(),
            21,
            "{callbacks:?}: every hop fired within one advance"
        );
        assert!(
            hops.iter().all(|&at| at == start + MS * 50),
            "callbacks see the new now"
        );
        assert_eq!(timer.stats().pending, 0);
    }
}

#[test]
fn with_a_spawner_advance_returns_once_every_due_timer_is_handed_over() {
    let clock = ManualClock::new();
    let queue = Arc::new(Mutex::new(Vec::new()));
    let spawned = queue.clone();
    let timer = service(
        &clock,
        Callbacks::spawn(move |callback| spawned.lock().unwrap().push(callback)),
    );
    let tally = Tally::default();
    for ms in 1..=10u64 {
        timer
            .schedule(
                MS * ms as u32,
                tally.callback(&clock, clock.now() + MS * ms as u32),
            )
            .unwrap();
    }
    clock.advance(MS * 5);
    assert_eq!(queue.lock().unwrap().len(), 5, "handed over, not yet run");
    assert_eq!(tally.fired(), 0);
    for callback in queue.lock().unwrap().drain(..) {
        callback.run();
    }
    assert_eq!(tally.fired(), 5);
    assert_eq!(tally.early(), 0);
}

#[test]
fn one_clock_drives_two_services_and_a_shut_down_one_holds_nothing_up() {
    let clock = ManualClock::new();
    let first = service(&clock, Callbacks::pool(1));
    let second = service(&clock, Callbacks::inline());
    let tally = Tally::default();
    let due = clock.now() + Duration::from_secs(10);
    first.schedule_at(due, tally.callback(&clock, due)).unwrap();
    second
        .schedule_at(due, tally.callback(&clock, due))
        .unwrap();
    let far = clock.now() + Duration::from_secs(3_600);
    second
        .schedule_at(far, tally.callback(&clock, far))
        .unwrap();
    clock.advance(Duration::from_secs(10));
    assert_eq!(tally.fired(), 2);
    // Shut down: the far timer comes back; the clock no longer waits for its shards.
    let unfired = second.shutdown();
    assert_eq!(unfired.len(), 1);
    assert_eq!(unfired[0].deadline(), far);
    drop(second);
    drop(first);
    let advanced = within(WAIT, move || {
        clock.advance(Duration::from_secs(1));
        clock.now()
    });
    assert!(advanced.is_some(), "advance hung on shut-down services");
}

#[test]
fn advance_from_inside_a_callback_does_not_wait_for_itself() {
    for callbacks in [Callbacks::pool(1), Callbacks::inline()] {
        let clock = ManualClock::new();
        let timer = service(&clock, callbacks.clone());
        let tally = Tally::default();
        let start = clock.now();
        let later = start + MS * 20;
        timer
            .schedule_at(later, tally.callback(&clock, later))
            .unwrap();
        let inner = clock.clone();
        timer.schedule(MS, move || inner.advance(MS * 19)).unwrap();
        // The callback's advance makes the second timer due; the outer advance's fixed
        // point fires it before returning.
        let outer = clock.clone();
        let done = within(WAIT, move || outer.advance(MS));
        assert!(
            done.is_some(),
            "{callbacks:?}: advance from a callback deadlocked"
        );
        assert_eq!(clock.now(), later);
        assert_eq!(tally.fired(), 1, "{callbacks:?}");
        assert_eq!(tally.early(), 0);
    }
}

#[test]
fn sleep_and_timeout_follow_the_manual_clock() {
    let clock = ManualClock::new();
    let timer = service(&clock, Callbacks::pool(1));
    let mut sleep = pin!(timer.sleep(Duration::from_secs(30)));
    assert!(poll_once(sleep.as_mut()).is_pending());
    clock.advance(Duration::from_secs(29));
    assert!(poll_once(sleep.as_mut()).is_pending());
    clock.advance(Duration::from_secs(1));
    assert!(poll_once(sleep.as_mut()).is_ready());
    assert!(sleep.is_elapsed());

    let mut never = pin!(timer.timeout(Duration::from_secs(5), std::future::pending::<()>()));
    assert!(poll_once(never.as_mut()).is_pending());
    clock.advance(Duration::from_secs(5));
    match poll_once(never.as_mut()) {
        Poll::Ready(Err(elapsed)) => assert_eq!(elapsed.refused(), None),
        other => panic!("expected the deadline to pass, got {other:?}"),
    }
}

#[test]
fn a_timeout_whose_future_is_ready_at_once_costs_no_timer() {
    let clock = ManualClock::new();
    let timer = service(&clock, Callbacks::pool(1));
    let scheduled_before = timer.stats().scheduled;
    let mut ready = pin!(timer.timeout(Duration::from_secs(5), async { 7 }));
    assert_eq!(poll_once(ready.as_mut()), Poll::Ready(Ok(7)));
    clock.advance(Duration::ZERO); // every shard has taken in what was pushed
    assert_eq!(
        timer.stats().scheduled,
        scheduled_before,
        "no timer was registered"
    );
    // One that is not ready registers its timer on that first poll.
    let mut slow = pin!(timer.timeout(Duration::from_secs(5), std::future::pending::<()>()));
    assert!(poll_once(slow.as_mut()).is_pending());
    clock.advance(Duration::ZERO);
    assert_eq!(timer.stats().scheduled, scheduled_before + 1);
}

#[test]
fn sleep_reset_moves_a_pending_sleep_either_way_and_re_arms_a_completed_one() {
    let clock = ManualClock::new();
    let timer = service(&clock, Callbacks::pool(1));
    let start = clock.now();
    // Later: in place.
    let mut sleep = pin!(timer.sleep(Duration::from_secs(10)));
    assert!(poll_once(sleep.as_mut()).is_pending());
    sleep
        .as_mut()
        .reset((start + Duration::from_secs(20)).into());
    assert_eq!(sleep.deadline(), start + Duration::from_secs(20));
    clock.advance(Duration::from_secs(10));
    assert!(
        poll_once(sleep.as_mut()).is_pending(),
        "moved later: not at 10 s"
    );
    clock.advance(Duration::from_secs(10));
    assert!(poll_once(sleep.as_mut()).is_ready(), "due at 20 s");
    // After completion: re-armed.
    sleep
        .as_mut()
        .reset((start + Duration::from_secs(25)).into());
    assert!(!sleep.is_elapsed());
    assert!(poll_once(sleep.as_mut()).is_pending());
    clock.advance(Duration::from_secs(4));
    assert!(poll_once(sleep.as_mut()).is_pending());
    clock.advance(Duration::from_secs(1));
    assert!(poll_once(sleep.as_mut()).is_ready(), "re-armed for 25 s");
    // Earlier.
    let mut sleep = pin!(timer.sleep(Duration::from_secs(60)));
    assert!(poll_once(sleep.as_mut()).is_pending());
    sleep
        .as_mut()
        .reset((clock.now() + Duration::from_secs(1)).into());
    clock.advance(Duration::from_secs(1));
    assert!(
        poll_once(sleep.as_mut()).is_ready(),
        "moved earlier: due at 1 s"
    );
    // Nothing left behind: the moved and the re-armed timers all fired or were freed.
    clock.advance(Duration::from_secs(120));
    assert_eq!(timer.stats().pending, 0);
}

/// Ticks `interval` yields now, without the clock moving.
fn ready_ticks(interval: &mut Interval) -> Vec<Instant> {
    let mut ticks = Vec::new();
    while let Poll::Ready(due) = poll_once(pin!(interval.tick())) {
        ticks.push(due.into_std());
        assert!(ticks.len() < 100, "an interval that never stops yielding");
    }
    ticks
}

#[test]
fn each_missed_tick_behavior_on_three_and_a_half_missed_periods() {
    let period = MS * 10;
    for behavior in [
        MissedTickBehavior::Burst,
        MissedTickBehavior::Skip,
        MissedTickBehavior::Delay,
    ] {
        let clock = ManualClock::new();
        let timer = service(&clock, Callbacks::pool(1));
        let t0 = clock.now();
        let mut interval = timer.interval(period);
        interval.set_missed_tick_behavior(behavior);
        assert_eq!(
            ready_ticks(&mut interval),
            vec![t0],
            "the first tick at once"
        );
        clock.advance(period * 7 / 2);
        let (now_ticks, next) = match behavior {
            MissedTickBehavior::Burst => (
                vec![t0 + period, t0 + period * 2, t0 + period * 3],
                t0 + period * 4,
            ),
            MissedTickBehavior::Skip => (vec![t0 + period], t0 + period * 4),
            MissedTickBehavior::Delay => (vec![t0 + period], t0 + period * 7 / 2 + period),
        };
        assert_eq!(
            ready_ticks(&mut interval),
            now_ticks,
            "{behavior:?} at 3.5 periods"
        );
        clock.advance(next - clock.now() - MS);
        assert_eq!(
            ready_ticks(&mut interval),
            Vec::<Instant>::new(),
            "{behavior:?}: not a tick early"
        );
        clock.advance(MS);
        assert_eq!(
            ready_ticks(&mut interval),
            vec![next],
            "{behavior:?}: the next tick"
        );
        clock.advance(period);
        assert_eq!(
            ready_ticks(&mut interval),
            vec![next + period],
            "{behavior:?}: on the grid"
        );
    }
    assert_eq!(MissedTickBehavior::default(), MissedTickBehavior::Burst);
}

#[test]
fn a_retry_back_off_driven_by_an_interval() {
    // A client retries every 2 s until its fifth attempt succeeds, under a 30 s
    // overall timeout; the test drives it 500 ms at a time.
    let clock = ManualClock::new();
    let timer = service(&clock, Callbacks::pool(1));
    let t0 = clock.now();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let log = attempts.clone();
    let mut retries = timer.interval(Duration::from_secs(2));
    let client = async move {
        loop {
            let due = retries.tick().await;
            let mut log = log.lock().unwrap();
            log.push(due);
            if log.len() == 5 {
                return "connected";
            }
        }
    };
    let mut call = pin!(timer.timeout(Duration::from_secs(30), client));
    let mut steps = 0;
    let outcome = loop {
        if let Poll::Ready(outcome) = poll_once(call.as_mut()) {
            break outcome;
        }
        clock.advance(MS * 500);
        steps += 1;
        assert!(steps < 1_000);
    };
    assert_eq!(outcome, Ok("connected"));
    let expected: Vec<Instant> = (0..5u32).map(|k| t0 + Duration::from_secs(2) * k).collect();
    assert_eq!(*attempts.lock().unwrap(), expected);
    assert_eq!(
        clock.now(),
        t0 + Duration::from_secs(8),
        "connected at 8 s, not later"
    );
}

#[test]
fn fixed_delay_with_a_slow_callback_waits_the_delay_after_each_run_returns() {
    // Each run takes 3 ms of (manual) time; the delay is 5 ms: runs start at 5, 13,
    // 21, … ms. The callback moves the clock itself (from inside a callback, advance
    // does not wait).
    for callbacks in [Callbacks::pool(1), Callbacks::inline()] {
        let clock = ManualClock::new();
        let timer = service(&clock, callbacks.clone());
        let t0 = clock.now();
        let runs = Arc::new(Mutex::new(Vec::new()));
        let (log, inner) = (runs.clone(), clock.clone());
        let handle = timer
            .schedule_with_fixed_delay(MS * 5, move || {
                let started = inner.now();
                inner.advance(MS * 3);
                log.lock().unwrap().push((started, inner.now()));
            })
            .unwrap();
        while clock.now() < t0 + MS * 100 {
            clock.advance(MS);
        }
        assert!(handle.cancel());
        let runs = runs.lock().unwrap().clone();
        assert!(runs.len() >= 11, "{callbacks:?}: {} runs", runs.len());
        assert_eq!(runs[0].0, t0 + MS * 5);
        for pair in runs.windows(2) {
            assert_eq!(pair[1].0 - pair[0].1, MS * 5, "{callbacks:?}: {pair:?}");
        }
        assert_eq!(timer.stats().skipped, 0);
    }
}

#[test]
fn a_past_deadline_on_a_manual_clock_fires_without_an_advance_and_shutdown_returns_the_rest() {
    let clock = ManualClock::new();
    let timer = service(&clock, Callbacks::pool(1));
    clock.advance(Duration::from_secs(5));
    let tally = Tally::default();
    let past = clock.now() - Duration::from_secs(1);
    timer
        .schedule_at(past, tally.callback(&clock, past))
        .unwrap();
    // Due at once: no advance needed (the shard wakes for it); advance(0) waits for it.
    clock.advance(Duration::ZERO);
    assert_eq!(tally.fired(), 1);
    let far = clock.now() + Duration::from_secs(60);
    timer.schedule_at(far, tally.callback(&clock, far)).unwrap();
    let unfired = timer.shutdown();
    assert_eq!(unfired.len(), 1);
    assert_eq!(
        timer.schedule(MS, || {}).unwrap_err(),
        ScheduleError::Shutdown
    );
}

#[test]
fn a_callback_that_drops_the_last_clone_of_its_service_does_not_hang_advance() {
    for callbacks in [Callbacks::pool(1), Callbacks::inline()] {
        let clock = ManualClock::new();
        let timer = service(&clock, callbacks.clone());
        let ran = Arc::new(AtomicUsize::new(0));
        let (owner, counter) = (timer.clone(), ran.clone());
        timer
            .schedule(MS, move || {
                counter.fetch_add(1, Ordering::SeqCst);
                drop(owner); // the last clone: the service shuts down from here
            })
            .unwrap();
        // A far timer, dropped unrun when the service goes.
        let far = timer.schedule(Duration::from_secs(60), || {}).unwrap();
        drop(timer);
        let advancing = clock.clone();
        let done = within(WAIT, move || advancing.advance(MS));
        assert!(done.is_some(), "{callbacks:?}: advance hung");
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert_eq!(
            far.state(),
            TimerState::Cancelled,
            "dropped with the service"
        );
        let later = clock.clone();
        assert!(within(WAIT, move || later.advance(Duration::from_secs(120))).is_some());
    }
}

#[test]
fn an_interval_reset_moves_the_next_tick_to_a_period_from_now() {
    let clock = ManualClock::new();
    let timer = service(&clock, Callbacks::pool(1));
    let t0 = clock.now();
    let period = MS * 10;
    let mut interval = timer.interval_at(t0 + period, period);
    assert_eq!(
        ready_ticks(&mut interval),
        Vec::<Instant>::new(),
        "the first tick is due at 10 ms"
    );
    clock.advance(MS * 7);
    interval.reset();
    clock.advance(MS * 9);
    assert_eq!(
        ready_ticks(&mut interval),
        Vec::<Instant>::new(),
        "moved to 17 ms: nothing at 16 ms"
    );
    clock.advance(MS);
    assert_eq!(ready_ticks(&mut interval), vec![t0 + MS * 17]);
    clock.advance(period);
    assert_eq!(
        ready_ticks(&mut interval),
        vec![t0 + MS * 27],
        "the grid from 17 ms"
    );
    assert_eq!(interval.period(), period);
}

#[test]
fn a_huge_advance_fires_what_is_due_and_returns_promptly() {
    let wall = Instant::now();
    let clock = ManualClock::new();
    let timer = service(&clock, Callbacks::pool(1));
    let tally = Tally::default();
    let start = clock.now();
    for delay in [
        MS,
        Duration::from_secs(3_600),
        Duration::from_secs(10 * 365 * 86_400),
    ] {
        timer
            .schedule(delay, tally.callback(&clock, start + delay))
            .unwrap();
    }
    let far = timer.schedule(Duration::MAX, || {}).unwrap();
    clock.advance(Duration::from_secs(100 * 365 * 86_400));
    assert_eq!(tally.fired(), 3);
    assert_eq!(tally.early(), 0);
    assert_eq!(
        far.state(),
        TimerState::Pending,
        "Duration::MAX saturates at the clock's far future, centuries on"
    );
    clock.advance(Duration::MAX);
    assert_eq!(clock.now(), far.deadline(), "which advance(MAX) reaches");
    assert_eq!(far.state(), TimerState::Fired, "and is due there");
    assert!(
        wall.elapsed() < Duration::from_secs(10),
        "{:?}",
        wall.elapsed()
    );
}
