//! Model 1: the bounded MPSC ring (`src/ring.rs`).
//!
//! Explores, with a ring of capacity 2: one producer pushing three values (the
//! full-ring path and a second lap) against the consumer; two producers racing for
//! the tail; and a producer racing
//! `close` and `drain_closed`.
//! Asserts: nothing lost, nothing duplicated, each producer's order kept, no data race
//! on a slot (loom checks every `UnsafeCell` access); after a close, every value was
//! either drained or handed back as `Closed`.
//! Seeded bug that makes it fail: the producer's Release store of the slot stamp in
//! `Reservation::publish` weakened to Relaxed (loom reports the consumer's read of the slot as
//! a causality violation).
//! Command: `RUSTFLAGS="--cfg loom -C debug-assertions=on" CARGO_TARGET_DIR=target/loom
//! LOOM_MAX_PREEMPTIONS=3 cargo test --release -p loom-tests --test ring`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, trace};
use sharded_timer::__loom::{PushError, Ring};

/// Pushes `value`, yielding while the ring is full.
fn push_retrying(ring: &Ring<u32>, mut value: u32) {
    loop {
        match ring.push(value) {
            Ok(position) => {
                trace(format!("pushed {value} at {position}"));
                return;
            }
            Err(PushError::Full(back)) => {
                trace(format!("full, {back} waits"));
                value = back;
                thread::yield_now();
            }
            Err(PushError::Closed(_)) => panic!("the ring was never closed"),
        }
    }
}

#[test]
fn a_producer_filling_the_ring_loses_nothing_and_keeps_order() {
    model(|| {
        let (ring, seed) = Ring::new(2);
        let ring = Arc::new(ring);
        let mut cursor = seed.cursor(&*ring);
        let producer = {
            let ring = ring.clone();
            // Three values through two slots: the full path and a second lap.
            thread::spawn(move || (0..3).for_each(|value| push_retrying(&ring, value)))
        };
        let mut next = 0;
        while next < 3 {
            match ring.pop(&mut cursor) {
                Some(value) => {
                    trace(format!("popped {value}"));
                    assert_eq!(value, next, "order kept, nothing lost or duplicated");
                    next += 1;
                }
                None => thread::yield_now(),
            }
        }
        producer.join().unwrap();
        assert_eq!(
            ring.pop(&mut cursor),
            None,
            "nothing beyond what was pushed"
        );
    });
}

#[test]
fn two_producers_racing_for_the_tail_lose_and_duplicate_nothing() {
    model(|| {
        let (ring, seed) = Ring::new(2);
        let ring = Arc::new(ring);
        let mut cursor = seed.cursor(&*ring);
        let producers: Vec<_> = (0..2u32)
            .map(|producer| {
                let ring = ring.clone();
                thread::spawn(move || push_retrying(&ring, producer))
            })
            .collect();
        let mut seen = [false; 2];
        let mut received = 0;
        while received < 2 {
            match ring.pop(&mut cursor) {
                Some(value) => {
                    trace(format!("popped {value}"));
                    assert!(!seen[value as usize], "duplicated {value}");
                    seen[value as usize] = true;
                    received += 1;
                }
                None => thread::yield_now(),
            }
        }
        for producer in producers {
            producer.join().unwrap();
        }
        assert_eq!(
            ring.pop(&mut cursor),
            None,
            "nothing beyond what was pushed"
        );
    });
}

#[test]
fn close_racing_a_push_loses_nothing() {
    model(|| {
        let (ring, seed) = Ring::new(2);
        let ring = Arc::new(ring);
        let mut cursor = seed.cursor(&*ring);
        let refused = Arc::new(AtomicUsize::new(0));
        let producer = {
            let (ring, refused) = (ring.clone(), refused.clone());
            thread::spawn(move || {
                for value in 0..2u32 {
                    match ring.push(value) {
                        Ok(_) => trace(format!("pushed {value}")),
                        Err(PushError::Closed(_)) => {
                            trace(format!("{value} refused: closed"));
                            refused.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(PushError::Full(_)) => panic!("two values fit in two slots"),
                    }
                }
            })
        };
        let reserved = ring.close();
        let mut drained = 0;
        ring.drain_closed(&mut cursor, reserved, &mut |value| {
            trace(format!("drained {value}"));
            drained += 1;
        });
        producer.join().unwrap();
        assert_eq!(drained + refused.load(Ordering::SeqCst), 2);
        assert_eq!(ring.pop(&mut cursor), None);
    });
}
