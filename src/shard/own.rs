//! This thread's own shard: what code running on a shard thread itself — an inline
//! callback, a spawner — may do to its own shard: drain its full rings (a callback
//! that schedules or cancels on its own shard must not wait for itself) and shut it
//! down from inside; and the pushes a shard thread may not wait for, deferred to its
//! own next turn.
//!
//! # Ground rules
//!
//! - The core and what its turns fired (inline, spawn) are in the shard's
//!   custody (`turn.rs`): whoever holds its token may turn the core. The shard's own thread
//!   takes the token for each turn and for each pop of a fired task, and holds it
//!   under a thread-local borrow (`OWN`); neither is held while user code runs:
//!   callbacks are dispatched one at a time, each after the borrow and the token that
//!   popped it are given back. So user code on this thread can reach the core: to
//!   drain its rings when a push finds a ring full, its own or another shard's
//!   (`drain_own_rings`), or to take it and shut the shard down (`take_own_core`),
//!   after which the loop finds no core and returns. Code reached from inside a hold
//!   finds the borrow taken, never waits on the token it holds.
//! - A shutdown from a callback on this thread dispatches the rest of the fired queue
//!   before it returns (`dispatch_rest_here`): fired timers run (inline) or reach the
//!   spawner before `shutdown` returns, as in the pool.
//! - **No shard thread waits for another shard.** A push from a shard thread (an
//!   inline callback, a rescued one, a spawner) that finds another shard's ring full
//!   takes that shard's token without waiting and drains the ring into its wheel, or
//!   else defers the push to a list of its own thread's, retried each turn and
//!   delivered before it shuts down (`make_room`, `retry_deferred`).

#![deny(unsafe_code)]

use std::cell::{Cell, RefCell};

use super::core::ShardCore;
use super::turn::{InCustody, ShardLink};
use super::{ShardShared, Wake};
use crate::clock::Tick;
use crate::entry::{EntryRef, Message};
use crate::sync::Backoff;

/// What the shard thread keeps where code on its own thread can reach it.
pub(super) struct Own {
    /// Its own shard.
    pub(super) link: ShardLink,
}

#[cfg(not(loom))]
std::thread_local! {
    /// The address of the `ShardShared` whose thread this is (0 if none).
    pub(super) static OWN_SHARD: Cell<usize> = const { Cell::new(0) };
    /// That shard's link, borrowed while its token is held (ground rules).
    pub(super) static OWN: RefCell<Option<Own>> = const { RefCell::new(None) };
    /// Every shard of the service (its own included), for a push that finds one's
    /// ring full (`make_room`). Set once, read only.
    pub(super) static PEERS: RefCell<Vec<ShardLink>> = const { RefCell::new(Vec::new()) };
    /// Pushes this shard thread could not make room for, retried each turn (`defer`).
    static DEFERRED: RefCell<Vec<(ShardLink, Deferred)>> = const { RefCell::new(Vec::new()) };
    /// Whether `retry_deferred_after_push` is retrying on this thread now.
    static RETRYING: Cell<bool> = const { Cell::new(false) };
}

#[cfg(loom)]
loom::thread_local! {
    /// As above, per model thread.
    pub(super) static OWN_SHARD: Cell<usize> = Cell::new(0);
    /// As above, per model thread.
    pub(super) static OWN: RefCell<Option<Own>> = RefCell::new(None);
    /// As above, per model thread.
    pub(super) static PEERS: RefCell<Vec<ShardLink>> = RefCell::new(Vec::new());
    /// As above, per model thread.
    static DEFERRED: RefCell<Vec<(ShardLink, Deferred)>> = RefCell::new(Vec::new());
    /// As above, per model thread.
    static RETRYING: Cell<bool> = Cell::new(false);
}

/// A push a shard thread deferred (ground rules: no shard thread waits for another).
#[derive(Debug)]
pub(super) enum Deferred {
    /// A new timer (`refile`: a repeating timer's next run).
    Insert {
        /// The service's reference.
        entry: EntryRef,
        /// Its deadline's tick.
        deadline: Tick,
        /// Whether it is a repeating timer's next run.
        refile: bool,
    },
    /// A cancel or move message.
    Message {
        /// The message.
        message: Message,
        /// How its push wakes the shard.
        wake: Wake,
    },
}

/// What a push that found `shard`'s ring full should do (`make_room`).
#[derive(Clone, Copy, Debug)]
pub(super) enum Room {
    /// Room was made (the ring drained into its shard's wheel): try again at once.
    Made,
    /// Defer the push: this is a shard thread, and it may not wait.
    Defer,
    /// Back off and try again, as any producer (not a shard thread, or a shard of
    /// another service); `drained_own`: this shard thread took its own rings in.
    Wait {
        /// Whether the calling shard thread drained its own rings.
        drained_own: bool,
    },
}

/// Called by a push that found `shard`'s ring full. On a shard thread whose loop runs,
/// never waits for another shard (docs/architecture.md, rescue: the shard it waits for may be
/// stuck, or waiting for it): it first takes its own rings in (making room for whoever
/// waits on them); then, for its own ring, that is all it needs (`Wait`); for
/// another shard's, it takes that shard's token without waiting and drains the ring
/// into that shard's wheel, as a rescuer runs a stuck shard's core (`Made`), or, if
/// the token is busy or the drain found nothing to take (a slot reserved and not
/// yet written), says to defer the push (`Defer`). Code holding its own shard's token
/// (nothing should push there, but nothing may hang there either) defers too.
pub(super) fn make_room(shard: &ShardShared) -> Room {
    if OWN_SHARD.with(Cell::get) == 0 {
        return Room::Wait { drained_own: false };
    }
    let drained_own = drain_own_rings();
    let own = is_own_thread(shard);
    if own {
        return if drained_own {
            Room::Wait { drained_own }
        } else {
            Room::Defer // its token is held on this very thread
        };
    }
    let Some(link) = peer(shard) else {
        return Room::Wait { drained_own };
    };
    let drained = link.custody.try_with(|held| {
        held.core
            .as_mut()
            .map_or(0, |core| core.drain_inserts() + core.drain_messages())
    });
    match drained {
        Some(drained) if drained > 0 => Room::Made,
        _ => Room::Defer,
    }
}

/// The link of `shard` among this thread's peers.
fn peer(shard: &ShardShared) -> Option<ShardLink> {
    PEERS.with(|peers| {
        peers
            .borrow()
            .iter()
            .find(|link| address(&link.shared) == address(shard))
            .cloned()
    })
}

/// Keeps a push to `shard` that `make_room` said to defer, for this thread's next turn
/// (`retry_deferred`).
///
/// # Panics
///
/// If `shard` is not among this thread's peers: `make_room` says `Defer` only for one
/// that is.
pub(super) fn defer(shard: &ShardShared, push: Deferred) {
    let link = peer(shard).expect("deferral invariant: only a peer's push is deferred");
    DEFERRED.with(|deferred| deferred.borrow_mut().push((link, push)));
}

/// Whether this thread holds deferred pushes.
fn has_deferred() -> bool {
    DEFERRED.with(|deferred| !deferred.borrow().is_empty())
}

/// Tries each deferred push once more (each may be deferred again); returns whether
/// any is still deferred. Called by the shard loop outside every hold.
pub(super) fn retry_deferred() -> bool {
    let pushes = DEFERRED.with(|deferred| ::core::mem::take(&mut *deferred.borrow_mut()));
    for (link, push) in pushes {
        let shard = &link.shared;
        match push {
            Deferred::Insert {
                entry,
                deadline,
                refile,
            } => {
                if let Err(entry) =
                    shard.push_insert_as(entry, deadline, refile, Wake::Before(deadline))
                {
                    shard.insert_closed(entry, refile);
                }
            }
            Deferred::Message { message, wake } => shard.send_message(message, wake),
        }
    }
    has_deferred()
}

/// After a push or direct operation from this thread went through: if the thread
/// holds deferred pushes (a shard thread's callback found another shard's ring full
/// and its token busy, and keeps pushing), tries them again now. The shard loop
/// retries them each turn, but a long callback postpones its loop's next turn, and
/// the deferred timers (or the earlier resets' messages) waited for the whole callback
/// on a healthy shard: an outside audit measured 0.3-1.5 s (issue 41,
/// tests/audit_firehose.rs). A callback that stops pushing after a deferral still
/// leaves them to its loop's next turn. Never nested: a retry's own pushes do not
/// retry again.
pub(crate) fn retry_deferred_after_push() {
    // Only a shard thread defers: any other producer leaves at the first, cheapest
    // look (a `const` cell with no destructor, so readable even as the thread exits).
    if OWN_SHARD.try_with(Cell::get).unwrap_or(0) == 0 {
        return;
    }
    // `try_with`: a push may come from another thread-local's destructor as the
    // thread exits (a sleep kept in one, dropped), after this one was destroyed; a
    // `with` would panic there, and a panic in a thread-local's destructor aborts.
    let holds = DEFERRED
        .try_with(|deferred| {
            deferred
                .try_borrow()
                .is_ok_and(|deferred| !deferred.is_empty())
        })
        .unwrap_or(false);
    if !holds || RETRYING.try_with(Cell::get).unwrap_or(true) {
        return;
    }
    /// Clears `RETRYING` however the retry ends.
    struct Retrying;
    impl Drop for Retrying {
        fn drop(&mut self) {
            RETRYING.with(|retrying| retrying.set(false));
        }
    }
    RETRYING.with(|retrying| retrying.set(true));
    let _retrying = Retrying;
    retry_deferred();
}

/// Retries the deferred pushes until none is left, taking this shard's own rings in
/// between: before this shard shuts down, so that every message another shard waits
/// for at its own shutdown arrives, and no timer is lost. (The shards they go to are
/// shutting down too, and drain what they wait for.)
pub(super) fn flush_deferred() {
    let backoff = Backoff::new();
    while retry_deferred() {
        drain_own_rings();
        backoff.snooze();
    }
}

/// The address that identifies a shard.
pub(super) fn address(shard: &ShardShared) -> usize {
    shard as *const ShardShared as usize
}

/// Runs `f` on this thread's own shard, holding its token (waiting, at most a rescuer's
/// bounded turn, if a rescuer holds it), if this is a shard thread whose loop runs and
/// nothing on this thread holds it now.
pub(super) fn with_own<R>(f: impl FnOnce(&ShardLink, &mut InCustody) -> R) -> Option<R> {
    OWN.with(|own| {
        let own = own.try_borrow_mut().ok()?;
        let link = &own.as_ref()?.link;
        Some(link.custody.with(|held| f(link, held)))
    })
}

/// Whether the calling thread is `shard`'s own thread.
pub(crate) fn is_own_thread(shard: &ShardShared) -> bool {
    OWN_SHARD.with(|own| own.get() == address(shard))
}

/// Called by a push that found a shard's ring full: if this is a shard thread whose
/// loop runs (a callback on it, inline or in a spawner), takes in everything waiting
/// in its own two rings, making room there, and returns `true`; otherwise `false`.
/// Whatever shard the push waits for, this keeps the calling shard from holding up a
/// shard that waits for it in turn (two inline callbacks scheduling onto each other's
/// full rings).
pub(super) fn drain_own_rings() -> bool {
    with_own(|_, held| {
        held.core.as_mut().is_some_and(|core| {
            core.drain_inserts();
            core.drain_messages();
            true
        })
    })
    .unwrap_or(false)
}

/// Takes the calling shard thread's core, for a shutdown started by a callback on it
/// (or by its own loop); the shard loop then returns once that callback does. `None`
/// elsewhere, or if taken. First delivers what this thread deferred.
pub(crate) fn take_own_core() -> Option<ShardCore> {
    if OWN_SHARD.with(Cell::get) != 0 {
        flush_deferred();
    }
    with_own(|_, held| held.core.take()).flatten()
}

/// Dispatches, on the calling shard thread, what its turns fired and has not yet been
/// dispatched: for a shutdown started by a callback on it (ground rules).
pub(crate) fn dispatch_rest_here() {
    while let Some((task, link)) = with_own(|link, held| {
        held.fired
            .pop_at_shutdown()
            .map(|task| (task, link.clone()))
    })
    .flatten()
    {
        link.dispatch.one(task, link.clock);
    }
}
