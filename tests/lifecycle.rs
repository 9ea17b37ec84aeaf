//! Creating and dropping services leaves no threads behind; an idle service makes no
//! wakeups.

mod support;

use std::sync::Mutex;
use std::time::Duration;

use support::{small_timer, thread_count};

/// Both tests count this process's threads, so they must not overlap.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn creating_and_dropping_30_services_leaves_no_threads_behind() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(before) = thread_count() else {
        eprintln!("skipped: /proc/self/task is not available on this platform");
        return;
    };
    for i in 0..30 {
        let timer = small_timer();
        let _handle = timer.schedule(Duration::from_millis(i % 3), || {}).unwrap();
        let _pending = timer.schedule(Duration::from_secs(60), || {}).unwrap();
        assert_eq!(
            thread_count(),
            Some(before + 4),
            "2 shards + 2 workers while alive"
        );
        drop(timer);
        assert_eq!(
            thread_count(),
            Some(before),
            "service {i} left threads behind"
        );
    }
}

/// Context switches of one thread, from /proc (Linux).
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
fn an_idle_service_makes_no_wakeups() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(before) = thread_count() else {
        eprintln!("skipped: /proc/self/task is not available on this platform");
        return;
    };
    let timer = small_timer();
    let _far = timer.schedule(Duration::from_secs(3600), || {}).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let tasks: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(tasks.len() >= before + 4);
    let named: Vec<String> = tasks
        .into_iter()
        .filter(|tid| {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
                .map(|c| c.starts_with("test-"))
                .unwrap_or(false)
        })
        .collect();
    assert_eq!(named.len(), 4, "the service's 4 threads are visible");
    let first: Vec<u64> = named.iter().map(|t| context_switches(t).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(500));
    let second: Vec<u64> = named.iter().map(|t| context_switches(t).unwrap()).collect();
    assert_eq!(first, second, "an idle service's threads woke up");
}
