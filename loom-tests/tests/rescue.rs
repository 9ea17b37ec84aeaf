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
//! Model 3 (issue 29, defect 4): the token orders pops, not runs, so the queue
//! remembers the run in progress (`src/shard/fired.rs`, the real `FiredQueue`). Two
//! timers fired onto the queue by the owner's turn; the owner pops and runs them one
//! per hold (each pop ending the previous run), while a rescuer judges the owner stuck
//! at some point (its progress then) and, later, pops one against that judgement and
//! runs it. Asserts: the owner never pops (starts) a callback while the rescuer's run
//! lasts, from its pop to its finish (a rescuer may run alongside the owner's run in
//! progress: that is the rescue of a stuck owner); each timer runs once.
//! Seeded bug that makes model 3 fail: `FiredQueue::pop_for_owner` ignoring a
//! rescuer's run in progress (as the shard loop popped before the fix): "the owner
//! starts a callback while the rescuer runs one".
//!
//! Seeded bug that makes models 1 and 2 fail: `Custody::try_with`'s CAS with `Ordering::Relaxed`
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
    next_id, Claim, Custody, EntryRef, Expired, FiredEntry, FiredQueue, Nanos, ShardCore, Tick,
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

/// What the token guards in the shard loop since issue 29: the core and the fired
/// queue that remembers the run in progress (`src/shard/fired.rs`, the real type).
struct Queued {
    core: ShardCore,
    fired: FiredQueue<FiredEntry>,
}

/// The owner's turn at tick 0 onto the queue, counted as its progress.
fn owner_turn(held: &mut Queued) {
    held.fired.owner_turned();
    let Queued { core, fired } = held;
    core.turn(|| Tick::new(0), &mut |expired| match expired {
        Expired::Fired(task) => fired.push_back(task),
        Expired::Run(_) => unreachable!("no repeating timers here"),
    });
}

#[test]
fn the_owner_never_starts_a_callback_while_a_rescuers_runs() {
    model(|| {
        let (shared, core) = shard::new(2);
        let runs: Vec<Arc<AtomicUsize>> = (0..2).map(|_| Arc::new(AtomicUsize::new(0))).collect();
        let handles: Vec<EntryRef> = runs.iter().map(|runs| due_now(&shared, runs)).collect();
        let custody = Arc::new(Custody::new(Queued {
            core,
            fired: FiredQueue::new(),
        }));
        let rescuer_in = Arc::new(AtomicBool::new(false));
        custody.with(owner_turn);
        let rescuer = {
            let (custody, rescuer_in) = (custody.clone(), rescuer_in.clone());
            thread::spawn(move || {
                // The watcher's judgement (the owner's progress, as `Watch` reads it),
                // then, later, one rescue pop checked against it, as `Watch::check`.
                let Some(judged) = custody.try_with(|held| held.fired.progress()) else {
                    return;
                };
                let popped = custody
                    .try_with(|held| {
                        if held.fired.is_empty() {
                            owner_turn_free(held);
                        }
                        let popped = held.fired.pop_for_rescuer(judged, Tick::new(0));
                        // Its run lasts from this pop to its finish, both under the token.
                        rescuer_in.store(popped.is_some(), Ordering::SeqCst);
                        popped
                    })
                    .flatten();
                if let Some((task, claim)) = popped {
                    trace("rescuer runs one");
                    task.run();
                    custody.with(|held| {
                        held.fired.finish(claim);
                        rescuer_in.store(false, Ordering::SeqCst);
                    });
                }
            })
        };
        // The owner's dispatch loop: each pop ends the previous run in the same hold;
        // a rescuer's run in progress is never stuck here (no clock).
        let mut claim: Option<Claim> = None;
        loop {
            let popped = custody.with(|held| {
                if let Some(claim) = claim.take() {
                    held.fired.finish(claim);
                }
                let popped = held.fired.pop_for_owner(|_| false);
                assert!(
                    popped.is_none() || !rescuer_in.load(Ordering::SeqCst),
                    "the owner starts a callback while the rescuer runs one"
                );
                popped
            });
            let Some((task, next)) = popped else {
                break;
            };
            claim = Some(next);
            trace("owner runs one");
            task.run();
        }
        if let Some(claim) = claim.take() {
            custody.with(|held| held.fired.finish(claim));
        }
        rescuer.join().unwrap();
        // What is left once the rescuer is done: the owner's next dispatch.
        while let Some((task, claim)) = custody.with(|held| held.fired.pop_for_owner(|_| false)) {
            task.run();
            custody.with(|held| held.fired.finish(claim));
        }
        for (index, runs) in runs.iter().enumerate() {
            assert_eq!(runs.load(Ordering::SeqCst), 1, "timer {index} ran once");
        }
        drop(handles);
    });
}

/// A rescuer's turn: as the owner's, but not counted as the owner's progress.
fn owner_turn_free(held: &mut Queued) {
    let Queued { core, fired } = held;
    core.turn(|| Tick::new(0), &mut |expired| match expired {
        Expired::Fired(task) => fired.push_back(task),
        Expired::Run(_) => unreachable!("no repeating timers here"),
    });
}
