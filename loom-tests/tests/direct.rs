//! Models of direct filing and unlinking (issue 30, `src/shard/direct.rs`): a producer
//! files its timer into the shard's wheel itself when the shard's custody token is
//! free, and a canceller unlinks its timer itself; each falls back to the rings when
//! the token is held. The shard side is the shard loop's own code through
//! `ModelShard`: its turn holding the token (`ShardLink::turn`), and its park
//! (`plan_park` holding the token, then `park` without it); the producer's side is
//! `DirectPort::schedule`, which `CoreHome::enqueue` calls for every `schedule`.
//!
//! Model 1: a producer schedules a timer due at tick 5 while the shard, whose next
//! expiry is tick 10, turns, plans its sleep and parks, again and again until it has
//! the timer (in its wheel, or in the plan of a sleep until tick 5); a rescuer tries the token once meanwhile and, if it gets it, turns the
//! core (as `Watch::check` does), so the producer also meets a token held by a
//! thread other than the owner. The producer files directly (token free), or pushes
//! into the ring (token held). Asserts: no lost wake-up (a shard left parked while a
//! timer earlier than its published wake-up is in its wheel or ring is a deadlock,
//! which loom reports); the shard ends with the timer filed and both timers come back
//! at shutdown; no data race on the core (loom checks the token's cell).
//!
//! Model 2: a handle's cancel racing the shard's expiry of a due timer that was filed
//! directly; the cancel that wins unlinks the timer itself if it gets the token (from
//! the wheel, or, if the turn claimed it first and found it cancelled, from the
//! shard's list of entries awaiting a message), else sends its message. Asserts:
//! exactly one of cancel and expiry wins; the callback runs iff the cancel lost; the
//! core awaits no message at the end; nothing leaks (loom tracks the entry).
//!
//! Model 3: waiters first (custody.rs): a producer schedules two timers back to back
//! while the owner waits for the token (`with_core`, the `Custody::with` its turns
//! take). Before each `schedule` the producer looks whether the owner waits; it
//! counts whether the timer was filed directly (the shard's `scheduled` count grows
//! only by direct filing: `filed_direct`). The owner counts, inside its
//! hold, the direct filings before it. Asserts: none of those started after the
//! producer had seen the owner waiting (so the owner waits for at most the hold in
//! progress, not for the producer's next filings); both timers come back at shutdown.
//!
//! Seeded bugs that make them fail:
//! - Model 1: `direct::file` reading `next_wake` before taking the token (outside its
//!   hold) instead of inside it: the read can see the shard awake, the shard's plan
//!   can come before the filing, and the shard parks until tick 10 with the tick-5
//!   timer in its wheel; loom reports the deadlock of the parked shard.
//! - Model 2: `ShardCore::cancel_direct` unlinking a cancelled entry from the wheel
//!   without looking at whether the turn already put it aside (as a plain
//!   `wheel.remove` + claim): the entry the turn claimed is "removed" from a wheel that
//!   no longer holds it, and its awaited message is never counted off: the model's
//!   `awaiting() == 0` assertion fails (or the wheel's own invariant panics).
//! - Model 3: `Custody::try_with_unless_awaited` not looking at `waiters` (a plain
//!   `try_with`): the producer sees the owner waiting, then files directly ahead of
//!   it: "a direct filing started after the owner was seen waiting came first".
//!
//! Command: as in `ring.rs`, with `--test direct`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, shard, trace};
use sharded_timer::__loom::{next_id, EntryRef, ModelShard, Nanos, Tick};

#[test]
fn a_directly_filed_earlier_timer_always_wakes_a_parking_shard() {
    model(|| {
        let (shared, core) = shard::new(8);
        // As `Builder::build` does: the shard's thread is known before any producer.
        shared.set_thread(thread::current());
        let shard = ModelShard::new(core);
        // The shard's next expiry: tick 10 (filed directly: nobody holds the token).
        let (later, service) = EntryRef::new(next_id(), Nanos::new(10), || {});
        assert!(shard.schedule(service, Tick::new(10)).is_ok());
        let producer = {
            let shard = shard.clone();
            thread::spawn(move || {
                let (handle, service) = EntryRef::new(next_id(), Nanos::new(5), || {});
                assert!(shard.schedule(service, Tick::new(5)).is_ok());
                trace("scheduled a timer due at tick 5");
                drop(handle);
            })
        };
        let rescuer = {
            let shard = shard.clone();
            thread::spawn(move || match shard.try_turn(0) {
                Some(_) => trace("rescuer turned the core"),
                None => trace("rescuer found the token held"),
            })
        };
        // The shard loop at tick 0: turn, and park until its next expiry unless it
        // has the timer (a lost wake-up leaves it parked: a deadlock).
        loop {
            assert_eq!(shard.turn_and_run(0), 0, "nothing is due at tick 0");
            if shard.with_core(|core| core.next_expiry()) == Some(Tick::new(5)) {
                break;
            }
            trace("parking");
            // A plan that sleeps until tick 5 has the timer (the rescuer's turn filed
            // it meanwhile); a sleep until tick 10 must be ended by an unpark.
            if shard.park_unless_due_by(Tick::new(5)) {
                trace("planned to sleep until tick 5");
                break;
            }
            trace("awake");
        }
        assert_eq!(
            shard.with_core(|core| core.next_expiry()),
            Some(Tick::new(5))
        );
        producer.join().unwrap();
        rescuer.join().unwrap();
        assert_eq!(shard.with_core(|core| core.shut_down().len()), 2);
        drop(later);
    });
}

#[test]
fn a_direct_cancel_racing_the_expiry_wins_or_loses_once() {
    model(|| {
        let (shared, core) = shard::new(2);
        let shard = ModelShard::new(core);
        let runs = Arc::new(AtomicUsize::new(0));
        let (handle, service) = {
            let runs = runs.clone();
            EntryRef::new(next_id(), Nanos::new(0), move || {
                runs.fetch_add(1, Ordering::SeqCst);
            })
        };
        assert!(shard.schedule(service, Tick::new(0)).is_ok());
        let won = Arc::new(AtomicBool::new(false));
        let canceller = {
            let won = won.clone();
            thread::spawn(move || {
                if let Some(callback) = handle.cancel(&shared.port()) {
                    trace("cancel won");
                    won.store(true, Ordering::SeqCst);
                    drop(callback);
                }
            })
        };
        let ran = shard.turn_and_run(0);
        canceller.join().unwrap();
        // A message the canceller sent (the token was held) arrives with this turn.
        let ran_later = shard.turn_and_run(0);
        assert_eq!(ran_later, 0, "nothing more is due");
        let won = won.load(Ordering::SeqCst);
        assert_eq!(
            usize::from(won) + ran,
            1,
            "exactly one of cancel and expiry"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            ran,
            "the callback ran iff cancel lost"
        );
        assert_eq!(
            shard.with_core(|core| core.awaiting()),
            0,
            "no message awaited"
        );
        assert!(shard.with_core(|core| core.shut_down()).is_empty());
    });
}

#[test]
fn a_producer_never_files_ahead_of_an_owner_it_has_seen_waiting() {
    model(|| {
        let (shared, core) = shard::new(8);
        let shard = ModelShard::new(core);
        let producer = {
            let shard = shard.clone();
            let shared = shared.clone();
            thread::spawn(move || {
                let mut filings = Vec::new();
                let mut handles = Vec::new();
                for k in 0..2 {
                    let saw_waiter = shard.waiters() > 0;
                    let before = shared.stats.filed_direct.load(Ordering::SeqCst);
                    let (handle, service) = EntryRef::new(next_id(), Nanos::new(10 + k), || {});
                    assert!(shard.schedule(service, Tick::new(10)).is_ok());
                    let direct = shared.stats.filed_direct.load(Ordering::SeqCst) > before;
                    trace(format!(
                        "timer {k}: saw the owner waiting {saw_waiter}, filed directly {direct}"
                    ));
                    filings.push((saw_waiter, direct));
                    handles.push(handle);
                }
                drop(handles);
                filings
            })
        };
        // The owner's hold, as a turn takes it: it counts the direct filings before it.
        let direct_before_owner =
            shard.with_core(|_| shared.stats.filed_direct.load(Ordering::SeqCst));
        trace(format!(
            "owner: {direct_before_owner} direct filings before its hold"
        ));
        let filings = producer.join().unwrap();
        // The first `direct_before_owner` direct filings came before the owner's hold.
        for (saw_waiter, _) in filings
            .iter()
            .filter(|(_, direct)| *direct)
            .take(direct_before_owner as usize)
        {
            assert!(
                !saw_waiter,
                "a direct filing started after the owner was seen waiting came first"
            );
        }
        let back = shard.with_core(|core| {
            core.drain_inserts();
            core.shut_down().len()
        });
        assert_eq!(back, 2, "both timers come back");
    });
}
