//! Shared helpers for the integration tests.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sharded_timer::{Callback, Callbacks, ShardedTimer};

/// Generous bound for waiting on a condition on a slow, shared CI machine.
pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// Polls `condition` every millisecond until it holds or `timeout` passes; returns
/// whether it held.
pub(crate) fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs `f` on a thread of its own; panics if it has not returned within `timeout`
/// (a hang: the thread is left behind), and propagates its panic (where [`within`]
/// reports a hang as `None`).
pub(crate) fn joined_within<T: Send + 'static>(
    what: &str,
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let thread = std::thread::spawn(f);
    let finished = wait_until(timeout, || thread.is_finished());
    assert!(finished, "{what}: hung for {timeout:?} (deadlock?)");
    match thread.join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Whether the thread named `name` sleeps (state `S` in `/proc/self/task/*/stat`): a
/// shard thread on the system clock sleeps only in its park.
pub(crate) fn thread_sleeps(name: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return false;
    };
    tasks.flatten().any(|task| {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // The state follows the parenthesised name: "tid (name) S ...".
        let state = stat
            .rsplit_once(") ")
            .map(|(_, rest)| rest.starts_with('S'));
        comm.trim() == name && state == Some(true)
    })
}

/// The `in_rings` and `scheduled` figures of a service's `Debug` output, which reads
/// the counters without waking a shard (as `stats()` does).
pub(crate) fn in_rings_shown(timer: &ShardedTimer) -> (u64, u64) {
    let shown = format!("{timer:?}");
    let field = |name: &str| -> u64 {
        let at = shown.find(&format!(" {name}: ")).expect(name) + name.len() + 3;
        let digits: String = shown[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap()
    };
    (field("in_rings"), field("scheduled"))
}

/// A small service for tests: 2 shards, 2 workers, no pinning (tests run side by
/// side), and a short thread name.
pub(crate) fn small_timer() -> ShardedTimer {
    ShardedTimer::builder()
        .shards(2)
        .executor_threads(2)
        .pin_cores(false)
        .thread_name("test")
        .build()
        .expect("a 2-shard service builds")
}

/// Counts how often it was dropped; clone it into a callback to see when the
/// callback's captures are freed.
#[derive(Clone, Debug, Default)]
pub(crate) struct DropCounter(Arc<AtomicUsize>);

/// The token a callback captures.
#[derive(Debug)]
pub(crate) struct DropToken(Arc<AtomicUsize>);

impl DropCounter {
    pub(crate) fn token(&self) -> DropToken {
        DropToken(self.0.clone())
    }
    pub(crate) fn dropped(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Drop for DropToken {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Threads of this process, from /proc (Linux); `None` elsewhere.
pub(crate) fn thread_count() -> Option<usize> {
    std::fs::read_dir("/proc/self/task")
        .ok()
        .map(|dir| dir.count())
}

/// Runs `f` on its own thread and waits up to `timeout` for its result: `None` means it
/// hung (the thread is left behind, which is the failure being reported).
pub(crate) fn within<T: Send + 'static>(
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(timeout).ok()
}

/// A one-shard service (so every timer goes to the same wheel), 1 worker.
pub(crate) fn one_shard_timer() -> ShardedTimer {
    one_shard_builder()
        .build()
        .expect("a 1-shard service builds")
}

/// As [`one_shard_timer`], with `max_pending(limit)`.
pub(crate) fn one_shard_timer_bounded(limit: usize) -> ShardedTimer {
    one_shard_builder()
        .max_pending(limit)
        .build()
        .expect("a bounded 1-shard service builds")
}

/// The builder of the one-shard services above.
fn one_shard_builder() -> sharded_timer::Builder {
    ShardedTimer::builder()
        .shards(1)
        .executor_threads(1)
        .pin_cores(false)
        .thread_name("test")
}

/// Waits until the shards have taken `n` timers in (so they are filed in a wheel).
pub(crate) fn wait_filed(timer: &ShardedTimer, n: u64) {
    assert!(
        wait_until(WAIT, || timer.stats().scheduled >= n),
        "the shard took {n} timers in within {WAIT:?}"
    );
}

/// A spawner that queues every `Callback` for the test to run or drop.
pub(crate) fn queued() -> (Callbacks, std::sync::mpsc::Receiver<Callback>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let callbacks = Callbacks::spawn(move |callback| {
        let _ = tx.lock().unwrap().send(callback);
    });
    (callbacks, rx)
}

/// Runs `f(k)` on a thread pinned to core `k`, for each `k` below `cores`, and returns
/// the results in core order: `schedule` routes a timer to the shard of its caller's
/// core, so this reaches shard `k` of a service with `cores` shards.
///
/// # Panics
///
/// If the machine has fewer than `cores` cores, or `f` panics.
#[allow(dead_code, reason = "not every test file spreads timers over shards")]
pub(crate) fn on_each_core<T: Send>(cores: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    assert!(
        ids.len() >= cores,
        "{cores} cores needed, {} found",
        ids.len()
    );
    std::thread::scope(|scope| {
        let threads: Vec<_> = ids[..cores]
            .iter()
            .enumerate()
            .map(|(k, &id)| {
                let f = &f;
                scope.spawn(move || {
                    assert!(core_affinity::set_for_current(id), "pinned to core {k}");
                    f(k)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

/// A small xorshift (Marsaglia, "Xorshift RNGs", 2003; shifts 13, 7, 17), so that
/// runs vary without a dependency. The tuple field is its state (never 0).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// A generator whose state is derived from `seed` (any value, 0 included).
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next value.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value below `n` (not exactly uniform; enough for choosing test steps).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
