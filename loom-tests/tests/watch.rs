//! Models of the watcher's park handshake (issue 29, `src/shard/rescue.rs` and
//! `park.rs`): a shard parks for as long as the shard it watches allows (its `Watch`
//! horizon), and the watched shard makes sure its watcher looks in time when it
//! begins to need a rescue. Both sides run the shard loop's own code through
//! `ModelShard`: the watcher's `plan_park` with its `Watch`, then `park`; the watched
//! shard's `plan_park` and `park`'s `tell_watcher`, and `alert_watcher`.
//!
//! The handshake is a store-buffer pair: the watcher stores its wake-up
//! (`prepare_park`), issues a SeqCst fence and reads the watched shard's state again;
//! the watched shard stores its own state (awake, or asleep until its next expiry),
//! issues a SeqCst fence (`prepare_park`'s, or `alert_watcher`'s) and reads the
//! watcher's wake-up, unparking it if it sleeps past when it must look. At least one
//! of the two reads sees the other's store.
//!
//! Model 1: the watched shard, asleep with nothing due, is woken (by a producer's
//! unpark) and is about to run an inline callback that may block it: `alert_watcher`
//! at tick 0, rescue after 1 tick. The watcher plans its park meanwhile. Asserts: the
//! watcher does not stay parked past tick 1 (a sleep it is not unparked from is a
//! deadlock, which loom reports).
//!
//! Model 2: the watched shard, asleep with nothing due, is woken, a timer due at tick
//! 1 is filed into it, and it parks again until tick 1 (rescue after 1 tick: its
//! watcher must look by tick 2). Asserts the same, by tick 2.
//!
//! Seeded bugs that make them fail (loom reports a deadlock of the parked watcher):
//! - Model 1: `alert_watcher` without its SeqCst fence: both reads can be stale.
//! - Models 1 and 2: `plan_park` without its re-check of the watched shard after its
//!   fence (`watch.horizon(now) < wake`).
//! - Model 2: `tell_watcher` (`park`'s unpark of a watcher sleeping past the shard's
//!   next expiry plus `rescue_after`) left out.
//!
//! Command: as in `ring.rs`, with `--test watch`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, shard, trace};
use sharded_timer::__loom::{next_id, EntryRef, ModelShard, Nanos, Tick};

/// The watcher's loop: plans and parks until a plan looks at the watched shard by
/// `bound` (each park must be ended by an unpark: loom reports one that is not).
fn watch_until_looking_by(watcher: &ModelShard, watched: &ModelShard, bound: u64) {
    while !watcher.watch_park_unless_looking_by(watched, 1, Tick::new(bound)) {
        trace("watcher unparked");
    }
    trace("watcher looks in time");
}

/// Waits for the watched shard's thread to finish. Not a `join`: the watcher's thread
/// may hold an unpark it did not park for (a nudge that came after its plan), which
/// loom's `join` (a wait on the same thread's notification) mistakes for its own.
fn wait_for(done: &AtomicBool) {
    // ORDERING: Acquire: pairs with the owner's Release; what it did is seen after.
    while !done.load(Ordering::Acquire) {
        thread::yield_now();
    }
}

/// Two shards: the watcher on the model's own thread (as its loop), and the watched
/// one, whose owner runs `owner` on a thread of its own meanwhile. The watcher plans
/// and parks until it looks by tick `bound` (`watch_until_looking_by`), then waits
/// for the owner. Returns both shards, to be shut down.
fn watcher_on_this_thread_and_owner(
    owner: impl FnOnce(&ModelShard, &ModelShard) + Send + 'static,
    bound: u64,
) -> (ModelShard, ModelShard) {
    let (watcher_shared, watcher_core) = shard::new(2);
    watcher_shared.set_thread(thread::current());
    let watcher = ModelShard::new(watcher_core);
    let (_, watched_core) = shard::new(2);
    let watched = ModelShard::new(watched_core);
    let done = Arc::new(AtomicBool::new(false));
    {
        let watcher = watcher.clone();
        let watched = watched.clone();
        let done = done.clone();
        thread::spawn(move || {
            owner(&watcher, &watched);
            // ORDERING: Release: pairs with `wait_for`'s Acquire.
            done.store(true, Ordering::Release);
        });
    }
    watch_until_looking_by(&watcher, &watched, bound);
    wait_for(&done);
    (watcher, watched)
}

#[test]
fn a_woken_shard_about_to_run_a_callback_makes_its_parking_watcher_look() {
    model(|| {
        let (watcher, watched) = watcher_on_this_thread_and_owner(
            |watcher, watched| {
                watched.park_woken_at_once(watcher, 1);
                trace("watched shard woken");
                watched.alert_watcher(watcher, 1, Tick::new(0));
                trace("watched shard runs a callback that blocks");
            },
            1,
        );
        assert!(watcher.with_core(|core| core.shut_down().is_empty()));
        assert!(watched.with_core(|core| core.shut_down().is_empty()));
    });
}

#[test]
fn a_shard_parking_with_a_timer_due_makes_its_parking_watcher_look() {
    model(|| {
        let (watcher, watched) = watcher_on_this_thread_and_owner(
            |watcher, watched| {
                watched.park_woken_at_once(watcher, 1);
                let (handle, service) = EntryRef::new(next_id(), Nanos::new(1), || {});
                assert!(watched.schedule(service, Tick::new(1)).is_ok());
                trace("a timer due at tick 1 filed");
                watched.park_woken_at_once(watcher, 1);
                trace("watched shard parked until tick 1");
                drop(handle);
            },
            2,
        );
        assert!(watcher.with_core(|core| core.shut_down().is_empty()));
        assert_eq!(watched.with_core(|core| core.shut_down().len()), 1);
    });
}
