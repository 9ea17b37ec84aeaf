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
//! - **Waiters first (fairness).** Direct filers and cancellers take the token back to
//!   back when they file without pause (a firehose of `schedule` from several threads),
//!   and a thread that must wait for the token (the owner, for the turn that expires
//!   its due timers) could lose every race to them for as long as the firehose lasts:
//!   expiry starved, guarantee 2 broken (issue 41). So a thread that waits in
//!   [`with`](Custody::with) counts itself in `waiters` after its first failed try, and
//!   counts itself out inside the hold it gets; the direct operations take the token
//!   through [`try_with_unless_awaited`](Custody::try_with_unless_awaited), which
//!   refuses (they use the rings, as for a held token) while anybody waits. A filer
//!   that read no waiter just before one counted itself in may still take the token
//!   once; its next try sees the waiter (coherence of the one counter), so each filer
//!   takes the token at most once after a waiter is counted, and the waiter's wait is
//!   bounded by that many single-entry holds, not by the firehose.
//!   `loom-tests/tests/direct.rs` (model 3) checks it on the real code, and fails with
//!   the direct path's check removed.
//! - **Not re-entrant.** A holder never takes the token again before giving it back;
//!   the thread-local borrow of `own.rs` (`OWN`) guards a shard's thread against that (user code
//!   never runs under the token, and code reached from user code finds the borrow taken).
//!
//! Cost on the common path (the owner, uncontended): one CAS and one store per turn,
//! and per fired task dispatched inline; the token sits in the cache line of the core
//! it guards, which only the owner touches until a rescue.

#![allow(
    unsafe_code,
    reason = "the token owns the invariant that makes the cell's accesses exclusive"
)]

use crate::sync::{AtomicBool, AtomicU32, Backoff, Ordering, UnsafeCell};

/// A value reached by one thread at a time, through an ownership token (ground rules).
#[derive(Debug)]
pub struct Custody<T> {
    /// The token: `true` while a thread holds the value.
    held: AtomicBool,
    /// How many threads wait in [`with`](Custody::with) (ground rules: waiters first).
    waiters: AtomicU32,
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
            waiters: AtomicU32::new(0),
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

    /// As [`try_with`](Self::try_with), but `None` at once also while a thread waits
    /// for the token in [`with`](Self::with): the direct operations' way in, so that
    /// they yield to the owner's turn (ground rules: waiters first).
    pub fn try_with_unless_awaited<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        // ORDERING: Relaxed: a hint about whom to let go first, not a guard of the value
        // (the token's CAS in `try_with` is). Coherence of this one counter is what the
        // bound needs: once this thread has read a waiter's increment, it reads it or a
        // later value on every try after.
        if self.waiters.load(Ordering::Relaxed) != 0 {
            return None;
        }
        self.try_with(f)
    }

    /// As [`try_with`](Self::try_with), waiting (spinning with backoff) while another
    /// thread holds the token: at most one bounded turn, or one single-entry hold per
    /// direct filer (ground rules: short holds, waiters first).
    ///
    /// # Panics
    ///
    /// Only if `f` panics (the token is given back first).
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut f = Some(f);
        if let Some(result) = self.try_with(|value| f.take().expect("called once")(value)) {
            return result;
        }
        // ORDERING: Relaxed: see `try_with_unless_awaited`; the count comes off inside
        // the hold we get, so it never goes below zero.
        self.waiters.fetch_add(1, Ordering::Relaxed);
        let backoff = Backoff::new();
        loop {
            backoff.snooze();
            let got = self.try_with(|value| {
                // ORDERING: Relaxed, as the increment.
                self.waiters.fetch_sub(1, Ordering::Relaxed);
                f.take().expect("called once")(value)
            });
            if let Some(result) = got {
                return result;
            }
        }
    }

    /// How many threads wait for the token in [`with`](Self::with) now (a snapshot).
    #[cfg(any(test, loom))]
    pub fn waiters(&self) -> u32 {
        // ORDERING: Relaxed: a snapshot for tests and models.
        self.waiters.load(Ordering::Relaxed)
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
