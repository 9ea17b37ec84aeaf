//! Model 14: two shards meeting on each other's full rings (issue 19, defect 1;
//! `ShardShared::push_and_wake` and `drain_own_rings` in `src/shard.rs` and
//! `src/shard/own.rs`), with the real cores installed as their threads' own
//! (`run_as_shard_thread`, as `ShardThread::run` installs them).
//!
//! Explores: two shard threads, each inside an inline callback that schedules three
//! timers onto the *other* shard, whose insert ring has two slots: each may find the
//! other's ring full while the other, inside its own callback, waits on its ring.
//! Asserts: both callbacks finish (a shard thread never waits for a shard while its
//! own rings stay full; loom reports a wait that never ends as a deadlock or as a
//! model past its branch limit); each shard then holds exactly the three timers the
//! other scheduled; nothing leaks.
//! Seeded bug that makes it fail: `push_and_wake` draining the calling thread's rings
//! only when the full ring is its own (as before the fix): both threads spin on each
//! other's full ring, and loom stops the model ("Model exceeded maximum number of
//! branches").
//! Model 2 (issue 29, defect 2): a shard thread meets a stuck shard's full ring; see
//! its doc comment.
//! Command: as in `ring.rs`, with `--test full_rings`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, shard, trace};
use sharded_timer::__loom::{
    next_id, run_as_shard_thread, EntryRef, Nanos, ShardCore, ShardShared, Tick,
};

/// Timers each callback schedules onto the other shard: one more than its ring holds.
const EACH: u64 = 3;

/// Runs, on a thread of its own, shard `core`'s inline callback that schedules `EACH`
/// timers onto `other`, then (as the shard loop would, turn after turn) takes in its
/// own insert ring until the other shard's callback is done too (`others_done`);
/// returns the core. `done` says this one is.
fn callback_scheduling_onto(
    core: ShardCore,
    other: &Arc<ShardShared>,
    done: &Arc<AtomicBool>,
    others_done: &Arc<AtomicBool>,
    name: &'static str,
) -> thread::JoinHandle<ShardCore> {
    let (other, done, others_done) = (other.clone(), done.clone(), others_done.clone());
    thread::spawn(move || {
        core.shared().set_thread(thread::current());
        let mut core = run_as_shard_thread(core, || {
            for k in 0..EACH {
                let (handle, service) = EntryRef::new(next_id(), Nanos::new(10 + k), || {});
                assert!(other.push_insert(service, Tick::new(10 + k)).is_ok());
                trace(format!("{name} scheduled {k} onto the other shard"));
                drop(handle);
            }
        });
        done.store(true, Ordering::SeqCst);
        while !others_done.load(Ordering::SeqCst) {
            core.drain_inserts();
            thread::yield_now();
        }
        core
    })
}

#[test]
fn inline_callbacks_scheduling_onto_each_others_full_rings_both_finish() {
    model(|| {
        let (a, core_a) = shard::new(2);
        let (b, core_b) = shard::new(2);
        let (a_done, b_done) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let on_a = callback_scheduling_onto(core_a, &b, &a_done, &b_done, "a");
        let on_b = callback_scheduling_onto(core_b, &a, &b_done, &a_done, "b");
        let mut core_a = on_a.join().unwrap();
        let mut core_b = on_b.join().unwrap();
        // What is left in each ring was published before the joins.
        core_a.drain_inserts();
        core_b.drain_inserts();
        assert_eq!(core_a.shut_down().len() as u64, EACH, "a holds b's timers");
        assert_eq!(core_b.shut_down().len() as u64, EACH, "b holds a's timers");
    });
}

/// Model 2 (issue 29, defect 2): a shard thread meets a *stuck* shard's full ring.
/// Shard `a`'s thread is stuck inside a callback (it takes nothing in until the other
/// callback is done); shard `b`'s thread runs an inline callback (a rescued one, say)
/// that schedules three timers onto `a`, whose insert ring has two slots.
/// Asserts: `b`'s callback finishes while `a` stays stuck (`b` takes `a`'s token and
/// drains the ring into `a`'s wheel, or defers the push to its next turn: it never
/// waits for `a`); `a` then holds exactly the three timers; nothing leaks.
/// Seeded bug that makes it fail: `make_room` answering `Wait` for another shard's
/// ring (the push backs off as before the fix): `b` spins on `a`'s full ring while
/// `a` waits for `b`, and loom stops the model ("Model exceeded maximum number of
/// branches").
#[test]
fn a_shard_thread_never_waits_for_a_stuck_shards_full_ring() {
    use sharded_timer::__loom::ModelShard;
    model(|| {
        let (_, core_a) = shard::new(2);
        let (_, core_b) = shard::new(2);
        let a = ModelShard::new(core_a);
        let b = ModelShard::new(core_b);
        let b_done = Arc::new(AtomicBool::new(false));
        let on_b = {
            let (a, b, b_done) = (a.clone(), b.clone(), b_done.clone());
            thread::spawn(move || {
                b.shared().set_thread(thread::current());
                b.run_as_thread(&[&a, &b], || {
                    for k in 0..EACH {
                        let (handle, service) = EntryRef::new(next_id(), Nanos::new(10 + k), || {});
                        assert!(a.shared().push_insert(service, Tick::new(10 + k)).is_ok());
                        trace(format!("b scheduled {k} onto a"));
                        drop(handle);
                    }
                });
                b_done.store(true, Ordering::SeqCst);
            })
        };
        // `a` is stuck until `b`'s callback is done (it waits for it, say).
        a.shared().set_thread(thread::current());
        while !b_done.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        on_b.join().unwrap();
        let pending = a.with_core(|core| {
            core.drain_inserts();
            core.shut_down().len() as u64
        });
        assert_eq!(pending, EACH, "a holds b's timers");
        b.with_core(|core| assert!(core.shut_down().is_empty()));
    });
}
