//! Creating and dropping services leaves no threads behind; an idle service makes no
//! wakeups. Both read /proc (Linux) and skip elsewhere, saying so.

mod support;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use support::{small_timer, thread_count, wait_until, WAIT};

/// These tests look at this process's threads, so they must not overlap.
static SERIAL: Mutex<()> = Mutex::new(());

/// Takes the tests' turn to look at this process's threads, or says the test is
/// skipped where /proc is not there to look at them.
fn serial_with_proc() -> Option<MutexGuard<'static, ()>> {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if thread_count().is_none() {
        eprintln!("skipped: /proc/self/task is not available on this platform");
        return None;
    }
    Some(serial)
}

/// Thread ids of this process named like a test service's threads (`test-s{k}`,
/// `test-w{k}`). The harness's own threads come and go and are not counted.
fn service_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter(|task| {
                    std::fs::read_to_string(task.path().join("comm"))
                        .map(|comm| comm.starts_with("test-"))
                        .unwrap_or(false)
                })
                .map(|task| task.file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default()
}

/// Voluntary plus involuntary context switches of one thread.
fn context_switches(tid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    status
        .lines()
        .filter(|l| {
            l.starts_with("voluntary_ctxt_switches") || l.starts_with("nonvoluntary_ctxt_switches")
        })
        .map(|l| l.split_whitespace().last().unwrap().parse::<u64>().unwrap())
        .reduce(|a, b| a + b)
}

#[test]
fn creating_and_dropping_30_services_leaves_no_threads_behind() {
    let Some(_serial) = serial_with_proc() else {
        return;
    };
    // A previous test's joined threads may still be listed for a moment (below).
    assert!(wait_until(WAIT, || service_threads().is_empty()));
    for i in 0..30 {
        let timer = small_timer();
        let _handle = timer.schedule(Duration::from_millis(i % 3), || {}).unwrap();
        let _pending = timer.schedule(Duration::from_secs(60), || {}).unwrap();
        // A new thread names itself when it first runs: wait for all four names.
        assert!(
            wait_until(WAIT, || service_threads().len() == 4),
            "2 shards + 2 workers while alive"
        );
        drop(timer);
        // Dropping joined every thread; the kernel removes a joined thread from
        // /proc/self/task a moment later (the join returns when the thread has cleared
        // its tid, before the kernel reaps it), so wait for the listing, boundedly.
        assert!(
            wait_until(WAIT, || service_threads().is_empty()),
            "service {i} left threads behind: {:?}",
            service_threads()
        );
    }
}

/// A 2-shard test service holding one timer an hour away, its threads started and
/// settled, and their ids.
fn settled_idle_service() -> (
    sharded_timer::ShardedTimer,
    sharded_timer::TimerHandle,
    Vec<String>,
) {
    let timer = small_timer();
    let far = timer.schedule(Duration::from_secs(3600), || {}).unwrap();
    // Let the threads start, take the timer in and settle.
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        wait_until(WAIT, || service_threads().len() == 4),
        "the service's 4 threads are visible"
    );
    (timer, far, service_threads())
}

/// Context switches of each of `threads`.
fn switches_of(threads: &[String]) -> Vec<u64> {
    threads
        .iter()
        .map(|t| context_switches(t).unwrap())
        .collect()
}

#[test]
fn an_idle_service_makes_no_wakeups() {
    let Some(_serial) = serial_with_proc() else {
        return;
    };
    let (_timer, _far, threads) = settled_idle_service();
    let first = switches_of(&threads);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        first,
        switches_of(&threads),
        "an idle service's threads woke up: {threads:?}"
    );
}

#[test]
fn threads_are_named_prefix_s_k_and_prefix_w_k_in_fifteen_bytes() {
    let Some(_serial) = serial_with_proc() else {
        return;
    };
    let timer = sharded_timer::ShardedTimer::builder()
        .shards(2)
        .executor_threads(2)
        .pin_cores(false)
        .thread_name("request-timeouts")
        .build()
        .unwrap();
    let names = || {
        let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(Result::ok)
            .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
            .map(|comm| comm.trim_end().to_owned())
            .filter(|comm| comm.starts_with("request-"))
            .collect();
        names.sort();
        names
    };
    assert!(wait_until(WAIT, || names().len() == 4), "{:?}", names());
    // The kernel would cut a longer name: these are whole, so they were at most 15.
    assert_eq!(
        names(),
        [
            "request-time-s0",
            "request-time-s1",
            "request-time-w0",
            "request-time-w1"
        ]
    );
    drop(timer);
}

#[test]
fn formatting_a_service_with_debug_wakes_no_thread() {
    let Some(_serial) = serial_with_proc() else {
        return;
    };
    let (timer, _far, threads) = settled_idle_service();
    let before = switches_of(&threads);
    let mut shown = String::new();
    for _ in 0..100 {
        shown = format!("{timer:?}");
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        before,
        switches_of(&threads),
        "Debug woke the service's threads"
    );
    assert!(shown.contains("shards: 2"), "{shown}");
}

#[test]
fn a_manual_clock_service_never_wakes_on_the_wall_clock() {
    let Some(_serial) = serial_with_proc() else {
        return;
    };
    let clock = sharded_timer::ManualClock::new();
    let timer = sharded_timer::ShardedTimer::builder()
        .shards(2)
        .executor_threads(2)
        .pin_cores(false)
        .thread_name("test")
        .clock(clock.clone())
        .build()
        .unwrap();
    // Due 2 ms from the clock's start: on the wall clock that is soon, but the manual
    // clock does not move, so nothing may wake for it.
    let fired = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = fired.clone();
    let _soon = timer
        .schedule(Duration::from_millis(2), move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .unwrap();
    clock.advance(Duration::ZERO); // taken in
    std::thread::sleep(Duration::from_millis(100)); // the threads settle, as above
    assert!(
        wait_until(WAIT, || service_threads().len() == 4),
        "the service's 4 threads are visible"
    );
    let threads = service_threads();
    let before = switches_of(&threads);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        before,
        switches_of(&threads),
        "a shard woke on the wall clock"
    );
    assert_eq!(fired.load(std::sync::atomic::Ordering::SeqCst), 0);
    clock.advance(Duration::from_millis(2));
    assert_eq!(fired.load(std::sync::atomic::Ordering::SeqCst), 1);
}
