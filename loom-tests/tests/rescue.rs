//! Models of rescue (issue 22): the ownership token that lets another shard's thread
//! turn a stuck shard's core (`src/shard/custody.rs`), on the real `Custody` and the
//! real `ShardCore`. (Which shard is stuck and when to look is a heuristic of the
//! shard loop, `Watch`; it decides only *whether* a rescuer tries the token, so the
//! models let the rescuer try at every point loom chooses.)
//!
//! Model 1: a rescuer and a returning owner race over the token. Two timers are due;
//! the owner turns its core and pops what fired one task per hold, as the shard loop
//! does; the rescuer, when it gets the token, turns the core if nothing waits and pops
//! one task. Asserts: each timer runs exactly once; no data race on the core or the
//! fired queue (loom checks the token's `UnsafeCell`); nothing leaks.
//!
//! Model 2: a handle's cancel racing an expiry that a rescuer runs, while the owner
//! comes back and turns too. Asserts: exactly one of cancel and expiry wins; the
//! owner, holding the token again, receives the cancel's message (nothing awaited)
//! and nothing fired is left unrun.
//!
//! Seeded bug that makes both fail: `Custody::try_with`'s CAS with `Ordering::Relaxed`
//! on success instead of `Acquire`: loom reports "Causality violation: Concurrent
//! mutable access" on the token's cell (the rescuer's turn is not ordered after the
//! owner's).
//! Command: as in `ring.rs`, with `--test rescue`.
#![cfg(loom)]

use std::collections::VecDeque;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, shard, trace};
use sharded_timer::__loom::{
    next_id, Custody, EntryRef, Expired, FiredEntry, Nanos, ShardCore, Tick,
};

/// What the token guards, as in the shard loop: the core and its fired queue.
struct Held {
    core: ShardCore,
    fired: VecDeque<FiredEntry>,
}

/// A bounded turn at tick 0 onto the fired queue (the shard loop's `ShardLink::turn`,
/// inline mode).
fn turn(held: &mut Held) {
    let Held { core, fired } = held;
    core.turn(|| Tick::new(0), &mut |expired| match expired {
        Expired::Fired(task) => fired.push_back(task),
        Expired::Run(_) => unreachable!("no repeating timers here"),
    });
}

/// Schedules a timer due at tick 0 that counts its runs in `runs`; returns its handle.
fn due_now(shared: &sharded_timer::__loom::ShardShared, runs: &Arc<AtomicUsize>) -> EntryRef {
    let runs = runs.clone();
    let (handle, service) = EntryRef::new(next_id(), Nanos::new(0), move || {
        runs.fetch_add(1, Ordering::SeqCst);
    });
    assert!(shared.push_insert(service, Tick::new(0)).is_ok());
    handle
}

#[test]
fn a_rescuer_and_the_returning_owner_fire_each_timer_once() {
    model(|| {
        let (shared, core) = shard::new(2);
        let runs: Vec<Arc<AtomicUsize>> = (0..2).map(|_| Arc::new(AtomicUsize::new(0))).collect();
        let handles: Vec<EntryRef> = runs.iter().map(|runs| due_now(&shared, runs)).collect();
        let custody = Arc::new(Custody::new(Held {
            core,
            fired: VecDeque::new(),
        }));
        let rescuer = {
            let custody = custody.clone();
            thread::spawn(move || {
                // One rescue step, as `Watch::check` takes it: never waits.
                let task = custody.try_with(|held| {
                    if held.fired.is_empty() {
                        turn(held);
                    }
                    held.fired.pop_front()
                });
                match task {
                    None => trace("rescuer: the owner holds the token"),
                    Some(task) => {
                        trace("rescuer: stepped");
                        if let Some(task) = task {
                            task.run();
                        }
                    }
                }
            })
        };
        // The owner: its turn, then one pop per hold, running each outside the hold.
        custody.with(turn);
        while let Some(task) = custody.with(|held| held.fired.pop_front()) {
            task.run();
        }
        rescuer.join().unwrap();
        // Whatever the rescuer's turn fired after the owner's loop ended.
        custody.with(turn);
        while let Some(task) = custody.with(|held| held.fired.pop_front()) {
            task.run();
        }
        for (index, runs) in runs.iter().enumerate() {
            assert_eq!(runs.load(Ordering::SeqCst), 1, "timer {index} ran once");
        }
        drop(handles);
        let custody = Arc::try_unwrap(custody).unwrap_or_else(|_| panic!("one owner left"));
        drop(custody);
    });
}

#[test]
fn a_cancel_racing_a_rescued_expiry_wins_or_loses_once() {
    model(|| {
        let (shared, core) = shard::new(2);
        let runs = Arc::new(AtomicUsize::new(0));
        let handle = due_now(&shared, &runs);
        let custody = Arc::new(Custody::new(Held {
            core,
            fired: VecDeque::new(),
        }));
        // The owner files the timer, then is stuck (it does nothing until the end).
        custody.with(|held| {
            held.core.drain_inserts();
        });
        let won = Arc::new(AtomicBool::new(false));
        let canceller = {
            let (shared, won) = (shared.clone(), won.clone());
            thread::spawn(move || {
                if let Some(callback) = handle.cancel(&shared.port()) {
                    trace("cancel won");
                    won.store(true, Ordering::SeqCst);
                    drop(callback);
                }
            })
        };
        let rescuer = {
            let custody = custody.clone();
            thread::spawn(move || {
                let task = custody
                    .try_with(|held| {
                        turn(held);
                        held.fired.pop_front()
                    })
                    .flatten();
                if let Some(task) = task {
                    trace("rescuer fired it");
                    task.run();
                }
            })
        };
        // The owner comes back meanwhile: one turn of its own, racing the rescuer.
        custody.with(turn);
        while let Some(task) = custody.with(|held| held.fired.pop_front()) {
            task.run();
        }
        canceller.join().unwrap();
        rescuer.join().unwrap();
        // Then it takes the rest of its messages.
        custody.with(|held| {
            while held.core.awaiting() > 0 {
                held.core.drain_messages();
            }
            held.core.drain_messages();
            assert!(held.fired.is_empty(), "the rescuer ran what it fired");
        });
        let cancelled = won.load(Ordering::SeqCst);
        assert_eq!(
            runs.load(Ordering::SeqCst) + usize::from(cancelled),
            1,
            "exactly one of cancel and expiry wins"
        );
    });
}
