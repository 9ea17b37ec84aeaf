//! Model 8: a repeating timer's run racing a cancel, on the real `ShardCore`
//! (`RUNNING` in `src/entry/state.rs`, `RunningEntry`, the core's expiry and
//! re-filing).
//!
//! Explores: the shard starting a run of a filed repeating timer (the core's
//! `expire`), a runner thread calling it, scheduling the next run, ending the run and
//! pushing it back to the shard's insert ring, against a handle's `cancel` landing
//! before the run, during it, between its end and the re-filing, or after.
//! Asserts: the callback is dropped exactly once — by the canceller when no run is
//! under way, by the runner when the cancel lands during the run — and never while it
//! runs (loom checks the cell); the core ends up holding nothing and awaiting no
//! message; the entry is freed exactly once (`Track`). And a `true` cancel is final:
//! a cancel that won while the run was handed over but not started (`QUEUED`, which
//! the cancel reports as `stopped_run`) means the callback is never called; the
//! callback is called at most once.
//! Seeded bugs that make it fail (each checked): `EntryRef::cancel` owning the
//! callback even when `RUNNING` is set (`CancelledCallback::new(self, true, queued)`):
//! the canceller then drops it under the running callback: "Causality violation:
//! Concurrent write accesses to `UnsafeCell`". `RunningEntry::call` not starting the
//! run by `begin_call` (calling whatever the state; the code before issue 29's defect
//! 8): "a run started after a cancel that returned true".
//! Second model: a run ending across the shard's shutdown (`ShardShared::refile_run`,
//! the `late` list and its seal, as `shutdown` collects it; a shutdown called from the
//! timer's own callback is the case where the run ends after the seal).
//! Explores: the runner finishing a run and filing the next one while the shard shuts
//! down (closes its insert ring, drains it) and the service then collects and seals
//! the late list.
//! Asserts: the timer is handed back (from the ring or the late list) or, if its run
//! ended after the seal, cancelled — exactly one of these; its callback is dropped
//! exactly once; nothing leaks.
//! Seeded bug that makes it fail: `hand_back_late` ignoring the seal (157dca7 pushed
//! to a list no later shutdown read): "assertion `left == right` failed: handed back
//! or cancelled, exactly once".
//! The whole service with a repeating timer, which needs a clock the model moves, is
//! in `manual_clock.rs` (a cancel racing its runs under `ManualClock`); the integration
//! test `a_repeating_timer_that_shuts_down_its_service_stops_and_is_dropped` covers a
//! run that shuts its own service down, on real threads.
//! Command: as in `ring.rs`, with `--test repeating`.
#![cfg(loom)]

use std::time::{Duration, Instant};

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, trace};
use sharded_timer::__loom::{
    next_id, EntryRef, Expired, Nanos, RunHome, RunTask, RunningEntry, ShardCore, ShardShared, Tick,
};
use sharded_timer::TimerState;

/// Counts drops of the callback's captures.
struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A fresh shard with a repeating timer (period 1 s) filed in its wheel, due at tick
/// 0; the callback's captures count their drops in `dropped`, its calls in `calls`.
/// Returns the shard, its core and the timer's handle.
fn filed_repeating(
    dropped: &Arc<AtomicUsize>,
    calls: &Arc<AtomicUsize>,
) -> (Arc<ShardShared>, ShardCore, EntryRef) {
    let (shared, mut core) = loom_tests::shard::new(2);
    let capture = DropCount(dropped.clone());
    let calls = calls.clone();
    let start = Instant::now();
    let (handle, service) = EntryRef::new_repeating(
        next_id(),
        Nanos::new(0),
        start,
        Duration::from_secs(1),
        None,
        move || {
            let _capture = &capture;
            calls.fetch_add(1, Ordering::SeqCst);
            trace("run");
        },
    );
    assert!(shared.push_insert(service, Tick::new(0)).is_ok());
    core.drain_inserts();
    (shared, core, handle)
}

/// The runs the core starts at tick 0.
fn start_runs(core: &mut ShardCore) -> Vec<RunningEntry> {
    let mut runs = Vec::new();
    core.expire(Tick::new(0), &mut |expired| match expired {
        Expired::Run(running) => runs.push(running),
        Expired::Fired(_) => panic!("a repeating timer runs, it does not fire"),
    });
    runs
}

/// A runner thread: the shipped `RunTask::run` for each run (call, schedule the
/// next run, end the run, and file the next one with `refile_run`, or hand it to the
/// late list), as an executor worker runs it.
fn spawn_runner(shared: &Arc<ShardShared>, runs: Vec<RunningEntry>) -> thread::JoinHandle<()> {
    // The shard as its runs reach it (one per shard, as the shard loop makes it).
    let home: RunHome = std::sync::Arc::new(shared.clone());
    thread::spawn(move || {
        for running in runs {
            RunTask::for_model(running, home.clone()).run();
            trace("ran; filed again, handed back, or ended cancelled");
        }
    })
}

#[test]
fn a_cancel_during_a_run_leaves_the_drop_to_the_runner() {
    model(|| {
        let dropped = Arc::new(AtomicUsize::new(0));
        let calls = Arc::new(AtomicUsize::new(0));
        let (shared, mut core, handle) = filed_repeating(&dropped, &calls);
        let cancelled = Arc::new(AtomicBool::new(false));
        let canceller = {
            let (shared, cancelled) = (shared.clone(), cancelled.clone());
            thread::spawn(move || {
                let won = handle.cancel(&shared.port());
                let stopped_run = won.as_ref().is_some_and(|won| won.stopped_run());
                trace(format!(
                    "cancel won: {}, stopped a queued run: {stopped_run}",
                    won.is_some()
                ));
                drop(won);
                cancelled.store(true, Ordering::SeqCst);
                stopped_run
            })
        };
        let runner = spawn_runner(&shared, start_runs(&mut core));
        runner.join().unwrap();
        let stopped_run = canceller.join().unwrap();
        let calls = calls.load(Ordering::SeqCst);
        assert!(calls <= 1, "one run at most before the cancel");
        if stopped_run {
            assert_eq!(calls, 0, "a run started after a cancel that returned true");
        }
        // Let the core settle: take the re-filed run (or discard it), take messages.
        loop {
            core.drain_inserts();
            core.drain_messages();
            if core.awaiting() == 0 {
                break;
            }
            thread::yield_now();
        }
        assert!(cancelled.load(Ordering::SeqCst));
        let left = core.shut_down();
        assert!(left.is_empty(), "a cancelled timer is not handed back");
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "dropped exactly once");
    });
}

#[test]
fn a_run_ending_across_shutdown_is_handed_back_or_cancelled_exactly_once() {
    model(|| {
        let dropped = Arc::new(AtomicUsize::new(0));
        let calls = Arc::new(AtomicUsize::new(0));
        let (shared, mut core, handle) = filed_repeating(&dropped, &calls);
        let runner = spawn_runner(&shared, start_runs(&mut core));
        let unfired = core.shut_down();
        let late = shared.take_late();
        trace(format!(
            "handed back: {} from the ring, {} late",
            unfired.len(),
            late.len()
        ));
        runner.join().unwrap();
        let cancelled = handle.state() == TimerState::Cancelled;
        assert_eq!(
            unfired.len() + late.len() + usize::from(cancelled),
            1,
            "handed back or cancelled, exactly once"
        );
        drop((unfired, late, handle));
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "dropped exactly once");
    });
}
