//! Model 4: the shard's park handshake (`ShardShared::prepare_park` against
//! `ShardShared::push_insert`, `src/shard.rs` ground rules), with the real
//! `ShardCore` and the shard thread's real park (`plan_park` and `park` in
//! `src/shard/park.rs`, through `park_for_model` in `src/shard/model.rs`) on the
//! shard side.
//!
//! Explores: a producer inserting a timer due at tick 5 while the shard, whose next
//! expiry is tick 10, publishes its wake-up tick, re-checks its rings and parks.
//! The ring has 8 slots so that neither push is "filling" (which unparks regardless):
//! only the deadline rule can wake the shard.
//! Asserts: no lost wakeup: the shard never stays parked while a timer earlier than
//! its published wake-up sits in its ring (a lost wakeup leaves the shard parked
//! forever, which loom reports as a deadlock); the shard then files the timer.
//! Seeded bug that makes it fail: the producer's SeqCst fence in `push_and_wake` (the
//! path of `push_insert`) removed (its Relaxed read of `next_wake` may then miss the
//! published tick while the shard's re-check misses the push: loom reports the parked
//! shard as a deadlock). The shard's re-check of its rings removed fails the same way.
//! Command: as in `ring.rs`, with `--test park`.
#![cfg(loom)]

use loom::thread;
use loom_tests::{model, shard, trace};
use sharded_timer::__loom::{next_id, park_for_model, EntryRef, Nanos, Tick};

#[test]
fn an_earlier_deadline_always_wakes_a_parking_shard() {
    model(|| {
        let (shared, mut core) = shard::new(8);
        // As `Builder::build` does: the shard's thread is known before any producer.
        shared.set_thread(thread::current());
        // The shard's next expiry: tick 10.
        let (later, service) = EntryRef::new(next_id(), Nanos::new(10), || {});
        assert!(shared.push_insert(service, Tick::new(10)).is_ok());
        assert_eq!(core.drain_inserts(), 1);
        let producer = {
            let shared = shared.clone();
            thread::spawn(move || {
                let (handle, service) = EntryRef::new(next_id(), Nanos::new(5), || {});
                assert!(shared.push_insert(service, Tick::new(5)).is_ok());
                trace("pushed a timer due at tick 5");
                drop(handle);
            })
        };
        // The shard at tick 0: the real park, until tick 10 unless woken.
        if core.drain_inserts() == 0 {
            trace("parking until tick 10");
            park_for_model(&core);
            trace("awake");
            // Awake: the push is reserved; wait for it to be published.
            while core.drain_inserts() == 0 {
                thread::yield_now();
            }
        }
        assert_eq!(core.next_expiry(), Some(Tick::new(5)), "the timer is filed");
        producer.join().unwrap();
        assert_eq!(core.shut_down().len(), 2);
        drop(later);
    });
}
