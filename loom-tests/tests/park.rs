//! Model 4: the shard's park handshake (`ShardShared::prepare_park` against
//! `ShardShared::push_insert`, `src/shard.rs` ground rules).
//!
//! Explores: a producer inserting a timer due at tick 5 while the shard, with nothing
//! to do before tick 10, publishes its wake-up tick, re-checks its rings and parks.
//! The ring has 4 slots so that the first push is not "filling" (which unparks
//! regardless): only the deadline rule can wake the shard.
//! Asserts: no lost wakeup: the shard never stays parked while a timer earlier than
//! its published wake-up sits in its ring (a lost wakeup leaves the shard parked
//! forever, which loom reports as a deadlock); the shard then finds the timer.
//! Seeded bug that makes it fail: the producer's SeqCst fence in `push_and_wake` (the path of `push_insert`)
//! removed (its Relaxed read of `next_wake` may then miss the published tick while
//! the shard's re-check misses the push: loom reports the parked shard as a deadlock).
//! The shard's re-check of its rings removed fails the same way.
//! Command: as in `ring.rs`, with `--test park`.
#![cfg(loom)]

use loom::thread;
use loom_tests::{model, trace};
use sharded_timer::__loom::{next_id, EntryRef, ShardShared};

#[test]
fn an_earlier_deadline_always_wakes_a_parking_shard() {
    model(|| {
        let (shard, mut cursors) = ShardShared::new(4);
        let shard_thread = {
            let shard = shard.clone();
            thread::spawn(move || {
                let mut found = shard.pop_insert(&mut cursors);
                if found.is_none() {
                    if shard.prepare_park(&cursors, 10) {
                        trace("parking until tick 10");
                        thread::park();
                        shard.wake_up();
                        trace("woke");
                    } else {
                        trace("work arrived before parking");
                    }
                    // Awake: the push is reserved; wait for it to be published.
                    while found.is_none() {
                        found = shard.pop_insert(&mut cursors);
                        if found.is_none() {
                            thread::yield_now();
                        }
                    }
                }
                assert!(found.is_some());
            })
        };
        // As `Builder::build` does: the shard's thread is known before any producer.
        shard.set_thread(shard_thread.thread().clone());
        let producer = {
            let shard = shard.clone();
            thread::spawn(move || {
                let (handle, service) = EntryRef::new(next_id(), 5, || {});
                assert!(shard.push_insert(service, 5).is_ok());
                trace("pushed a timer due at tick 5");
                drop(handle);
            })
        };
        producer.join().unwrap();
        shard_thread.join().unwrap();
    });
}
