//! Model 10: the `max_pending` counter (`src/limit.rs`).
//!
//! Explores: with a limit of 1 and one timer pending, thread A frees that timer's
//! room and then takes room for a new one, while thread B tries to take room too.
//! Asserts: the count never exceeds the limit; a thread is refused only if, at its
//! attempt, `limit` timers were really pending — so at least one of A and B is
//! accepted (A's attempt comes after its own release: unless B took that room, A
//! gets it); the counter ends exact.
//! Seeded bug that makes it fail: `try_acquire` as add-then-undo (157dca7's
//! `fetch_add`, then `fetch_sub` when over): a transient overshoot refuses a thread
//! while fewer than `limit` are pending: "assertion failed: refused while fewer than
//! the limit were pending".
//! Command: as in `ring.rs`, with `--test limit`.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use loom_tests::model;
use sharded_timer::__loom::PendingLimit;

#[test]
fn room_is_refused_only_when_the_limit_is_really_reached() {
    model(|| {
        let limit = Arc::new(PendingLimit::new(1));
        assert!(limit.try_acquire(), "one pending");
        let a = {
            let limit = limit.clone();
            thread::spawn(move || {
                limit.release();
                limit.try_acquire()
            })
        };
        let b = {
            let limit = limit.clone();
            thread::spawn(move || limit.try_acquire())
        };
        let taken = usize::from(a.join().unwrap()) + usize::from(b.join().unwrap());
        assert!(
            taken >= 1,
            "refused while fewer than the limit were pending"
        );
        assert_eq!(
            limit.pending(),
            taken,
            "the counter ends exact, never above 1"
        );
    });
}
