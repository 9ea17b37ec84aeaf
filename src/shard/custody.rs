//! Custody of a shard's core: an ownership token, so that the core belongs to one
//! thread at a time without belonging to one thread for ever. The shard's own thread
//! holds it for each turn (and for each pop of what the turn fired, inline); another
//! shard's thread holds it to *rescue* a shard whose own thread is stuck (inside a
//! long inline callback, or descheduled) and fire its due timers
//! (`Builder::rescue_after`; docs/architecture.md, "Custody and rescue").
//!
//! # Ground rules
//!
//! - **One holder.** The token is an `AtomicBool`: taken with a CAS `false → true`
//!   (Acquire), given back with a store of `false` (Release). Whoever takes it sees
//!   everything the previous holder did to the value: the Release store and the
//!   Acquire CAS that reads it synchronise. So the value is reached by one thread at a
//!   time, with a happens-before edge between holders — what a `Mutex` gives, without
//!   the futex: nobody ever sleeps on this token (see the next rule), and a release is
//!   one plain store. `loom-tests/tests/rescue.rs` checks it, and fails with a Relaxed
//!   CAS.
//! - **Short holds, no user code.** A holder runs one bounded turn of the core
//!   (`TURN_BUDGET` entries) or pops one fired task, and gives the token back before
//!   any user code runs (a callback, a spawner). So a thread that must have the token
//!   (the owner, for its next turn) spins with backoff for at most one bounded turn.
//! - **Holders.** The shard's own thread (each turn, each pop of a fired task, its
//!   plan to park), a rescuer (a bounded turn, a pop), a shard thread making room in
//!   a full ring, and, since issue 30, producers and cancellers (`direct.rs`): a
//!   producer files its new timer into the wheel, a canceller takes its own cancel
//!   or move message, each one entry's work. All but the owner's next turn only
//!   *try* the token and fall back to the rings, so nobody but the owner ever waits
//!   for it. The shard publishes its wake-up (`next_wake`) inside the hold in which
//!   it plans its park, and a direct filer reads it inside its own: the token's
//!   Acquire and Release order the two (`direct.rs`, the park handshake, direct).
//! - **Not re-entrant.** A holder never takes the token again before giving it back;
//!   the shard loop's thread-local borrow guards its own thread against that (user code
//!   never runs under the token, and code reached from user code finds the borrow taken).
//!
//! Cost on the common path (the owner, uncontended): one CAS and one store per turn,
//! and per fired task dispatched inline; the token sits in the cache line of the core
//! it guards, which only the owner touches until a rescue.

#![allow(
    unsafe_code,
    reason = "the token owns the invariant that makes the cell's accesses exclusive"
)]

use crate::sync::{AtomicBool, Backoff, Ordering, UnsafeCell};

/// A value reached by one thread at a time, through an ownership token (ground rules).
#[derive(Debug)]
pub struct Custody<T> {
    /// The token: `true` while a thread holds the value.
    held: AtomicBool,
    /// The value, reached only by the token's holder.
    value: UnsafeCell<T>,
}

// SAFETY: the token gives the value to one thread at a time, with a happens-before
// edge from each holder's last access to the next holder's first (ground rules), so a
// `&Custody<T>` on several threads moves the `T` between them, never shares it: that
// needs `T: Send` only.
unsafe impl<T: Send> Sync for Custody<T> {}

impl<T> Custody<T> {
    /// `value`, held by nobody.
    pub fn new(value: T) -> Self {
        Custody {
            held: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the token, runs `f` on the value, and gives the token back; if another
    /// thread holds it, `None` at once.
    pub fn try_with<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        // ORDERING: Acquire on success pairs with the Release store that gave the token
        // back (`Release::drop`): the previous holder's accesses to the value happen
        // before ours. Relaxed on failure: we touch nothing then.
        self.held
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        let _release = Release(&self.held);
        // SAFETY: we hold the token, so no other thread reaches the value until
        // `_release` gives it back (after `f` returns, or unwinds), and each earlier
        // holder's accesses happen before ours (the Acquire above). `f` gets a borrow
        // that cannot outlive this call.
        Some(self.value.with_mut(|value| f(unsafe { &mut *value })))
    }

    /// As [`try_with`](Self::try_with), waiting (spinning with backoff) while another
    /// thread holds the token: at most one bounded turn (ground rules).
    ///
    /// # Panics
    ///
    /// Only if `f` panics (the token is given back first).
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let backoff = Backoff::new();
        let mut f = Some(f);
        loop {
            if let Some(result) = self.try_with(|value| f.take().expect("called once")(value)) {
                return result;
            }
            backoff.snooze();
        }
    }
}

/// Gives the token back when dropped.
struct Release<'a>(&'a AtomicBool);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        // ORDERING: Release pairs with the next holder's Acquire CAS (`try_with`).
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::Custody;
    use std::sync::Arc;

    #[test]
    fn holders_take_turns_and_see_each_others_writes() {
        let custody = Arc::new(Custody::new(Vec::<u32>::new()));
        let threads: Vec<_> = (0..3u32)
            .map(|thread| {
                let custody = custody.clone();
                std::thread::spawn(move || {
                    for round in 0..50u32 {
                        custody.with(|log| log.push(thread * 1_000 + round));
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let mut log = custody.with(std::mem::take);
        assert_eq!(log.len(), 150, "no push lost to a racing holder");
        log.sort_unstable();
        log.dedup();
        assert_eq!(log.len(), 150);
    }

    #[test]
    fn try_with_refuses_while_held_and_the_token_comes_back_after_a_panic() {
        let custody = Custody::new(0u32);
        let inner = custody.with(|value| {
            *value += 1;
            custody.try_with(|value| *value += 1)
        });
        assert_eq!(inner, None, "held: a second holder is refused at once");
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            custody.with(|_| panic!("a holder that panics"));
        }));
        assert!(caught.is_err());
        assert_eq!(
            custody.try_with(|value| *value),
            Some(1),
            "given back on unwind"
        );
    }
}
