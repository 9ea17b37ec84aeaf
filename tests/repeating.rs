//! `schedule_repeating`: fixed rate without drift, no overlap, skipped runs counted,
//! `schedule_with_fixed_delay`: each run a delay after the previous one returned;
//! panics survived, cancel stops later runs.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sharded_timer::{ShardedTimer, TimerState};
use support::{small_timer, wait_until, WAIT};

/// Lateness allowed per run on a slow, shared CI machine. It must not grow with the
/// run number: that is what "no cumulative drift" means.
const LATE: Duration = Duration::from_millis(250);

#[test]
fn a_50ms_timer_runs_10_times_without_drift_and_never_after_cancel() {
    let timer = small_timer();
    let period = Duration::from_millis(50);
    let runs: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let start = Instant::now();
    let recorded = runs.clone();
    let handle = timer
        .schedule_repeating(period, move || {
            recorded.lock().unwrap().push(Instant::now())
        })
        .unwrap();
    assert!(wait_until(WAIT, || runs.lock().unwrap().len() >= 10));
    assert!(handle.cancel());
    // A run may start up to the moment `cancel` wins; none after it returns.
    let cancelled_at = Instant::now();
    assert_eq!(handle.state(), TimerState::Cancelled);
    // Shutdown joins every callback handed over: no run can start after this.
    assert!(
        timer.shutdown().is_empty(),
        "a cancelled timer is not handed back"
    );
    let runs = runs.lock().unwrap().clone();
    assert!(runs.len() <= 11, "{} runs", runs.len());
    for (k, &ran) in runs.iter().enumerate() {
        let due = start + period * (k as u32 + 1);
        assert!(ran >= due, "run {} early", k + 1);
        assert!(
            ran < due + LATE,
            "run {} drifted {:?} late",
            k + 1,
            ran - due
        );
        assert!(
            ran < cancelled_at,
            "run {} started after cancel returned",
            k + 1
        );
    }
    let tenth = runs[9] - start;
    assert!(
        tenth >= Duration::from_millis(500) && tenth < Duration::from_millis(500) + LATE,
        "10 runs took {tenth:?}"
    );
}

#[test]
fn runs_never_overlap_and_runs_that_fall_behind_are_skipped_and_counted() {
    let timer = small_timer();
    let running = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let count = Arc::new(AtomicUsize::new(0));
    let (r, o, c) = (running.clone(), overlaps.clone(), count.clone());
    let handle = timer
        .schedule_repeating(Duration::from_millis(5), move || {
            if r.swap(true, Ordering::SeqCst) {
                o.fetch_add(1, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_millis(17)); // longer than the period
            c.fetch_add(1, Ordering::SeqCst);
            r.store(false, Ordering::SeqCst);
        })
        .unwrap();
    assert!(wait_until(WAIT, || count.load(Ordering::SeqCst) >= 5));
    assert!(handle.cancel());
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two runs overlapped");
    assert!(
        wait_until(WAIT, || timer.stats().skipped > 0),
        "missed slots were not counted: {:?}",
        timer.stats()
    );
}

#[test]
fn a_panic_in_one_run_is_counted_and_the_timer_keeps_going() {
    let timer = small_timer();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    let handle = timer
        .schedule_repeating(Duration::from_millis(2), move || {
            if c.fetch_add(1, Ordering::SeqCst) == 1 {
                panic!("second run panics on purpose");
            }
        })
        .unwrap();
    assert!(wait_until(WAIT, || count.load(Ordering::SeqCst) >= 5));
    assert!(handle.cancel());
    assert!(wait_until(WAIT, || timer.stats().panicked == 1));
    assert_eq!(handle.state(), TimerState::Cancelled);
}

#[test]
fn reset_is_refused_and_dropping_the_handle_does_not_stop_it() {
    let timer = small_timer();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    let handle = timer
        .schedule_repeating(Duration::from_millis(2), move || {
            c.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    assert!(
        !handle.reset(Duration::from_secs(1)),
        "a repeating timer keeps its rate"
    );
    assert_eq!(handle.state(), TimerState::Pending);
    drop(handle);
    let seen = count.load(Ordering::SeqCst);
    assert!(wait_until(WAIT, || count.load(Ordering::SeqCst) >= seen + 3));
}

#[test]
fn shutdown_hands_a_repeating_timer_back_once_and_its_run_makes_one_last_run() {
    let clock = sharded_timer::ManualClock::new();
    let timer = sharded_timer::ShardedTimer::builder()
        .shards(2)
        .executor_threads(2)
        .pin_cores(false)
        .clock(clock.clone())
        .build()
        .unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    let handle = timer
        .schedule_repeating(Duration::from_millis(1), move || {
            c.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    for _ in 0..3 {
        clock.advance(Duration::from_millis(1));
    }
    assert_eq!(count.load(Ordering::SeqCst), 3);
    let unfired = timer.shutdown();
    assert_eq!(
        unfired.len(),
        1,
        "the repeating timer comes back exactly once"
    );
    let before = count.load(Ordering::SeqCst);
    // Twenty more periods on the clock: a live service would run it twenty times.
    clock.advance(Duration::from_millis(20));
    assert_eq!(
        count.load(Ordering::SeqCst),
        before,
        "no run after shutdown"
    );
    assert!(!handle.cancel(), "it belongs to its Unfired");
    unfired.into_iter().next().unwrap().run();
    assert_eq!(count.load(Ordering::SeqCst), before + 1);
    assert_eq!(handle.state(), TimerState::Fired);
}

#[test]
fn a_cancel_during_a_run_drops_the_callback_after_it() {
    let timer = small_timer();
    let drops = support::DropCounter::default();
    let token = drops.token();
    let started = Arc::new(AtomicBool::new(false));
    let s = started.clone();
    let handle = timer
        .schedule_repeating(Duration::from_millis(1), move || {
            let _keep = &token;
            s.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
        })
        .unwrap();
    assert!(wait_until(WAIT, || started.load(Ordering::SeqCst)));
    assert!(handle.cancel(), "cancel wins while a run is under way");
    assert_eq!(
        drops.dropped(),
        0,
        "the running callback is not dropped under it"
    );
    assert!(
        wait_until(WAIT, || drops.dropped() == 1),
        "dropped once the run ends"
    );
}

/// Audit defect 5: a repeating timer keeps going past 2^32 periods. With a 1 ns tick
/// and period, run 2^32 is due 4.3 s after the start; the old index conversion made
/// its deadline "never" there.
#[test]
fn a_repeating_timer_keeps_running_past_two_to_the_32_periods() {
    let timer = sharded_timer::ShardedTimer::builder()
        .shards(1)
        .executor_threads(1)
        .tick(Duration::from_nanos(1))
        .pin_cores(false)
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let start = Instant::now();
    let handle = timer
        .schedule_repeating(Duration::from_nanos(1), move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let past = Duration::from_nanos(1 << 32) + Duration::from_millis(300);
    while start.elapsed() < past {
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = runs.load(Ordering::SeqCst);
    assert!(
        wait_until(WAIT, || runs.load(Ordering::SeqCst) > before + 10),
        "runs continue after 2^32 periods ({before} so far)"
    );
    assert!(handle.cancel());
}

/// Audit defect 6: a repeating timer whose own callback shuts the service down stops:
/// its handle reads Cancelled and its callback (holding a clone of the service) is
/// dropped, so nothing is kept alive in a cycle.
#[test]
fn a_repeating_timer_that_shuts_down_its_service_stops_and_is_dropped() {
    let timer = support::one_shard_timer();
    let drops = support::DropCounter::default();
    let token = drops.token();
    let service = timer.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = timer
        .schedule_repeating(Duration::from_millis(1), move || {
            let _token = &token;
            let _ = tx.send(service.shutdown().len());
        })
        .unwrap();
    assert_eq!(
        rx.recv_timeout(WAIT),
        Ok(0),
        "shutdown from the callback returns"
    );
    assert!(
        wait_until(WAIT, || handle.state() == TimerState::Cancelled),
        "the timer stops: {:?}",
        handle.state()
    );
    assert!(
        wait_until(WAIT, || drops.dropped() == 1),
        "the callback, with its clone of the service, is dropped"
    );
}

/// With a fixed delay, each run starts at least `delay` after the previous one
/// returned, however long that run took, in each callback mode; none is skipped.
#[test]
fn fixed_delay_runs_start_a_delay_after_the_previous_run_returned() {
    for callbacks in [
        sharded_timer::Callbacks::pool(2),
        sharded_timer::Callbacks::inline(),
    ] {
        let timer = ShardedTimer::builder()
            .shards(2)
            .callbacks(callbacks)
            .pin_cores(false)
            .thread_name("test")
            .build()
            .unwrap();
        let delay = Duration::from_millis(5);
        let slow = Duration::from_millis(8);
        // (start, end) of each run.
        let runs: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
        let record = runs.clone();
        let scheduled = Instant::now();
        let handle = timer
            .schedule_with_fixed_delay(delay, move || {
                let start = Instant::now();
                std::thread::sleep(slow);
                record.lock().unwrap().push((start, Instant::now()));
            })
            .unwrap();
        assert!(wait_until(WAIT, || runs.lock().unwrap().len() >= 5));
        assert!(handle.cancel());
        let runs = runs.lock().unwrap().clone();
        assert!(
            runs[0].0 >= scheduled + delay,
            "the first run is due a delay from now"
        );
        for pair in runs.windows(2) {
            let (previous_end, next_start) = (pair[0].1, pair[1].0);
            assert!(
                next_start >= previous_end + delay,
                "a run started {:?} after the previous returned, before the {delay:?} delay",
                next_start.duration_since(previous_end)
            );
        }
        assert_eq!(timer.stats().skipped, 0, "a fixed delay skips nothing");
    }
}
