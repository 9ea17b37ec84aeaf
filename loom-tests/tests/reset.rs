//! Model 7: resets against the shard, on the real `ShardCore` and park handshake
//! (`src/entry.rs` `EntryRef::reset`, `src/entry/state.rs` the claim,
//! `src/shard/core.rs` move messages, `src/shard.rs` `Wake::Always`).
//!
//! Explores: (A) a timer pushed with a far deadline (tick 10) and at once moved
//! earlier (tick 2) by its handle, possibly before the shard has filed it, against a
//! shard at tick 2 that holds a blocker due at tick 5, drains, expires, and parks until
//! its next expiry when nothing is due; (B) a filed timer due now whose handle moves it later (tick 10) while the
//! shard claims and fires it.
//! Asserts: (A) the shard never parks for good while the timer is due: the reset's
//! move message wakes it (a shard left parked is a deadlock, which loom reports;
//! on real threads, a fire as late as the shard's sleep), and the timer fires once;
//! (B) a reset that returned `true` is never fired on its old deadline: the shard
//! fires iff the reset lost (returned `false`).
//! Seeded bugs that make them fail: (A) `StateWord::finish_reset` sending a move only
//! for a `FILED` entry (as 157dca7 did): "deadlock; threads = [(Id(0), Blocked),
//! (Id(1), Terminated)]". (B) `EntryRef::try_fire_due` firing without re-reading the
//! deadline under its claim: "fired although the reset to tick 10 took effect".
//! Command: as in `ring.rs`, with `--test reset`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, shard, trace};
use sharded_timer::__loom::{next_id, EntryRef, Nanos, Tick};

#[test]
fn an_earlier_reset_of_a_timer_not_yet_filed_wakes_the_shard() {
    model(|| {
        // 8 slots: the two pushes below are not "filling" (which wakes regardless).
        let (shared, mut core) = shard::new(8);
        let ran = Arc::new(AtomicUsize::new(0));
        shared.set_thread(thread::current());
        // A blocker due at tick 5: the shard sleeps until then, so the new timer's
        // push (due at tick 10) does not wake it; only the reset can.
        let (_blocker, blocker) = EntryRef::new(next_id(), Nanos::new(5), || {});
        assert!(shared.push_insert(blocker, Tick::new(5)).is_ok());
        core.drain_inserts();
        let producer = {
            let (shared, ran) = (shared.clone(), ran.clone());
            thread::spawn(move || {
                let (handle, service) = EntryRef::new(next_id(), Nanos::new(10), move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                });
                assert!(shared.push_insert(service, Tick::new(10)).is_ok());
                assert!(
                    handle.reset(Nanos::new(2), &shared.port()),
                    "pending: the reset takes effect"
                );
                trace("moved to tick 2");
            })
        };
        // The shard, with the clock at tick 2.
        while shard::turn(&mut core, 2) == 0 {
            let wake = core.next_expiry().unwrap_or(Tick::NEVER);
            if wake > Tick::new(2) && core.prepare_park(wake) {
                trace(format!("parking until tick {}", wake.get()));
                thread::park();
                core.shared().wake_up();
            } else {
                // Due but not fired (its move is under way), or work arrived.
                thread::yield_now();
            }
        }
        producer.join().unwrap();
        while core.awaiting() > 0 {
            core.drain_messages();
        }
        assert_eq!(ran.load(Ordering::SeqCst), 1, "fired once");
        assert_eq!(core.shut_down().len(), 1, "the blocker is handed back");
    });
}

#[test]
fn a_reset_that_took_effect_is_never_fired_on_its_old_deadline() {
    model(|| {
        let (shared, mut core) = shard::new(2);
        let ran = Arc::new(AtomicUsize::new(0));
        let ran_in = ran.clone();
        let (handle, service) = EntryRef::new(next_id(), Nanos::new(0), move || {
            ran_in.fetch_add(1, Ordering::SeqCst);
        });
        assert!(shared.push_insert(service, Tick::new(0)).is_ok());
        core.drain_inserts();
        let moved = Arc::new(AtomicBool::new(false));
        let resetter = {
            let (shared, moved) = (shared.clone(), moved.clone());
            thread::spawn(move || {
                let took = handle.reset(Nanos::new(10), &shared.port());
                trace(format!("reset to 10 took effect: {took}"));
                moved.store(took, Ordering::SeqCst);
            })
        };
        let fired = shard::turn(&mut core, 0);
        resetter.join().unwrap();
        let took = moved.load(Ordering::SeqCst);
        assert_eq!(
            fired,
            usize::from(!took),
            "fired although the reset to tick 10 took effect"
        );
        assert_eq!(ran.load(Ordering::SeqCst), fired);
        drop(core.shut_down());
    });
}
