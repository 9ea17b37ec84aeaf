//! What handles send their shard: a cancel or move [`Message`], through the handle's
//! [`CancelPort`] to the shard's [`CancelSink`] (entry ground rule 4).

use core::ptr::NonNull;

use super::EntryRef;

/// A message to a shard about an entry it holds; each owns one reference (entry ground
/// rule 1), so the entry outlives the message whatever the shard does meanwhile.
#[derive(Debug)]
pub enum Message {
    /// A winning cancel of a filed entry.
    Cancel(EntryRef),
    /// A reset moved the entry's deadline earlier.
    Move(EntryRef),
}

/// The shard's side of a cancel or reset: receives the message of a winning canceller
/// whose entry was filed, or of a reset that moved an entry earlier.
///
/// The sender lends its own reference: a sink that queues the message clones one for
/// it (ground rule 1); a shard that takes the message on the spot, under its token
/// (`shard/direct.rs`), needs none, so a direct cancel costs no reference count.
pub trait CancelSink: Sync {
    /// Delivers a cancel message; must not lose it, and must not touch the sink after
    /// publishing it (ground rule 4).
    fn send_cancel(&self, entry: &EntryRef);
    /// Delivers a move message for an entry whose deadline moved earlier; must not lose
    /// it, and must not touch the sink after publishing it (ground rule 4). The shard
    /// reads the entry's latest deadline when the message arrives, so it carries none.
    fn send_move(&self, entry: &EntryRef);
}

/// A handle's pointer to its shard's [`CancelSink`]. It is dereferenced only to send a
/// message the shard waits for (ground rule 4), so it needs no reference count of its
/// own, and a handle stays one pointer wide however many handles a shard has.
pub struct CancelPort<S>(NonNull<S>);

impl<S: CancelSink> CancelPort<S> {
    /// A port to `sink`.
    ///
    /// # Safety
    ///
    /// - `sink` stays at this address until it has received every message that entry
    ///   ground rule 4 makes it wait for (the shard's `ShardCore::shut_down`), and
    /// - the port is used only through [`send_cancel`](Self::send_cancel) and
    ///   [`send_move`](Self::send_move), each called only when that rule makes the sink
    ///   wait for the message.
    pub unsafe fn new(sink: &S) -> Self {
        CancelPort(NonNull::from(sink))
    }

    /// Sends a cancel message for `entry`.
    ///
    /// # Safety
    ///
    /// - The caller won Pending → Cancelled on `entry` with `FILED` set, so the sink
    ///   waits for exactly this message before it goes (ground rule 4), and this is
    ///   that message (sent once).
    pub(super) unsafe fn send_cancel(&self, entry: &EntryRef) {
        // SAFETY: by the caller's obligation the sink waits for this message, so it is
        // still at its address (`new`'s first point); a sender touches nothing of it
        // after publishing.
        let sink = unsafe { self.0.as_ref() };
        sink.send_cancel(entry);
    }

    /// Sends a move message for `entry`.
    ///
    /// # Safety
    ///
    /// - The caller set `MOVING` on `entry`, pending and not detached, so the sink
    ///   waits for exactly this message before it goes (ground rule 4), and this is
    ///   that message (sent once).
    pub(super) unsafe fn send_move(&self, entry: &EntryRef) {
        // SAFETY: by the caller's obligation the sink waits for this message (ground
        // rule 4), so it is still at its address (`new`'s first point).
        let sink = unsafe { self.0.as_ref() };
        sink.send_move(entry);
    }
}

impl<S> Clone for CancelPort<S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for CancelPort<S> {}

// SAFETY: the port is dereferenced only as `&S` where `S: CancelSink: Sync`.
unsafe impl<S: Sync> Send for CancelPort<S> {}
// SAFETY: as for `Send`.
unsafe impl<S: Sync> Sync for CancelPort<S> {}

impl<S> core::fmt::Debug for CancelPort<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("CancelPort")
    }
}
