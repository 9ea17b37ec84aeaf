//! Model 3: a cancel racing the shard's drain of its insert ring (`src/shard.rs`,
//! `src/entry.rs` ground rules 1 and 4).
//!
//! Explores: a producer that pushes a timer into a shard's insert ring and cancels it
//! at once, against the shard popping it, filing it (`mark_filed`), trying to fire it,
//! and processing cancel messages from its cancel ring.
//! Asserts: a cancel that reaches the entry before it is filed is honoured (the shard
//! discards it at filing, and no message is sent); one that reaches it after is
//! delivered as exactly one message, which the shard processes whether the entry is
//! still in its "wheel" or already expired (awaiting the message); the callback runs
//! iff `cancel` returned `false`; the entry is freed exactly once and never touched
//! after (loom's `Track` and object checks).
//! Seeded bug that makes it fail: `StateWord::mark_filed`'s `fetch_or` replaced by a
//! load and a store (the shard can then overwrite a won cancel; the callback runs
//! although `cancel` returned `true`).
//! Command: as in `ring.rs`, with `--test cancel_vs_drain`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, trace};
use sharded_timer::__loom::{
    next_id, shard_store, CancelPort, EntryRef, File, Message, ShardShared,
};

#[test]
fn cancel_before_or_after_filing_is_honoured_exactly_once() {
    model(|| {
        let (shard, mut cursors) = ShardShared::new(2);
        let ran = Arc::new(AtomicUsize::new(0));
        let won = Arc::new(AtomicBool::new(false));
        let producer = {
            let (shard, ran, won) = (shard.clone(), ran.clone(), won.clone());
            thread::spawn(move || {
                let (handle, service) = EntryRef::new(next_id(), 0, move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                });
                assert!(shard.push_insert(service, 0).is_ok());
                let cancelled = handle.cancel(&CancelPort::new(&*shard));
                trace(format!("cancel returned {cancelled}"));
                won.store(cancelled, Ordering::SeqCst);
            })
        };
        // The shard: drain inserts, file, try to expire, process cancel messages.
        let mut store = shard_store();
        let mut in_wheel = None;
        let mut awaiting = None;
        let mut resolved = false;
        while !resolved {
            if let Some(entry) = shard.pop_insert(&mut cursors) {
                match entry.mark_filed() {
                    File::Filed => {
                        trace("filed");
                        // Expire it at once: fire, or await the cancel message.
                        match entry.try_fire() {
                            Ok(task) => {
                                trace("fired");
                                task.run();
                                resolved = true;
                            }
                            Err(entry) => {
                                trace("expired while cancelled: awaiting message");
                                let raw = store.release(entry);
                                store.set_awaiting_cancel(raw);
                                awaiting = Some(raw);
                            }
                        }
                    }
                    File::AlreadyCancelled => {
                        trace("discarded at filing");
                        drop(entry);
                        resolved = true;
                    }
                }
            }
            if let Some(Message::Cancel(raw)) = shard.pop_cancel(&mut cursors) {
                trace("cancel message");
                let expected = awaiting.take().or_else(|| in_wheel.take());
                assert_eq!(
                    Some(raw),
                    expected,
                    "a message names the entry the shard holds"
                );
                assert!(store.is_awaiting_cancel(raw));
                drop(store.claim(raw));
                resolved = true;
            }
            if !resolved {
                thread::yield_now();
            }
        }
        producer.join().unwrap();
        let cancelled = won.load(Ordering::SeqCst);
        assert_eq!(ran.load(Ordering::SeqCst), usize::from(!cancelled));
        assert!(
            awaiting.is_none() && in_wheel.is_none(),
            "the shard holds nothing"
        );
        assert!(shard.pop_cancel(&mut cursors).is_none(), "no stray message");
    });
}
