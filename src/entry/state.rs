//! The atomic state word of a timer entry: the only code that touches its bits.
//!
//! # Bit layout (`u32`)
//!
//! | bits | meaning |
//! | --- | --- |
//! | 0–1 | the [`TimerState`]: `PENDING` = 0, `FIRED` = 1, `CANCELLED` = 2 |
//! | 2 | `FILED`: the shard has taken the entry from its insert ring (it is in the wheel, or held aside) |
//! | 3 | `DETACHED`: shutdown handed the entry back as an `Unfired`; handles can no longer cancel or reset it |
//! | 4 | `RESETTING`: a `reset` is storing a new deadline; the shard must not claim meanwhile. On a repeating timer, which is never reset, the same bit is `QUEUED`: its run is handed over (`RUNNING`) and has not started |
//! | 5 | `MOVING`: a reset moved the deadline earlier and its move message is outstanding |
//! | 6 | `RUNNING`: a repeating timer's callback is running on the executor (out of the wheel) |
//! | 7 | `CLAIMING`: the shard is deciding to fire; resets wait, cancels may still win |
//! | 8–31 | the entry's reference count (entry ground rule 1), in units of [`REF`] |
//!
//! The count shares the word so that the header stays 32 bytes. Every transition
//! below computes its new word from the one it read (or is a `fetch_and`/`fetch_or` of
//! flag bits), so a reference taken or dropped meanwhile only makes a CAS retry.
//!
//! # States
//!
//! | from | to | actor | who owns the callback afterwards |
//! | --- | --- | --- | --- |
//! | Pending | Pending +CLAIMING | the shard, when an entry looks due ([`StateWord::try_claim`]) | unchanged |
//! | Pending +CLAIMING | Fired | the shard, its deadline re-read and due ([`StateWord::fire_claimed`]) | the executor task, which runs it |
//! | Pending +CLAIMING | Pending +RUNNING +QUEUED −FILED | the shard, a repeating timer's run ([`StateWord::start_run_claimed`]) | the runner, until `finish_run` |
//! | Pending +RUNNING +QUEUED | Pending +RUNNING | the runner, starting the callback ([`StateWord::begin_call`]; fails once Cancelled, and the run then does not start) | unchanged |
//! | any +CLAIMING | −CLAIMING | the shard, not due after all or cancelled meanwhile ([`StateWord::release_claim`]) | unchanged |
//! | Pending | Fired | `Unfired::run` ([`StateWord::try_fire`]) | the caller of `run` |
//! | Pending | Cancelled | a handle's `cancel` ([`StateWord::try_cancel`], fails once `DETACHED`) or a dropped `Unfired` ([`StateWord::try_cancel_detached`]) | the canceller, which drops it last |
//! | — | +FILED | the shard, draining its insert ring ([`StateWord::mark_filed`]) | unchanged |
//! | — | −FILED +DETACHED | the shard at shutdown, emptying its ring and wheel ([`StateWord::detach`]) | unchanged |
//! | Pending | Pending +RESETTING | a handle's `reset` ([`StateWord::begin_reset`]) | unchanged |
//! | Pending +RESETTING | −RESETTING (+MOVING if earlier and not detached) | the same `reset` ([`StateWord::finish_reset`]) | unchanged |
//! | — | −MOVING | the shard, processing the move message ([`StateWord::clear_moving`]) | unchanged |
//! | Pending/Cancelled +RUNNING | −RUNNING −QUEUED | the runner ([`StateWord::finish_run`]) | the entry again (Pending), or the runner drops it (Cancelled) |
//!
//! A cancel that wins while `RUNNING` is set leaves the callback to the runner, which
//! drops it after the run.
//!
//! # A cancel against a queued run
//!
//! A `true` cancel is final: no run starts after it, including one the shard already
//! handed to the executor that has not started. The run starts by one CAS
//! ([`StateWord::begin_call`]: Pending +QUEUED → Pending, clearing `QUEUED`) and a
//! cancel is one CAS (Pending → Cancelled); both are RMWs of this word, so one comes
//! first in its modification order. If the cancel does, `begin_call` reads Cancelled
//! and the callback is never called (the runner only drops it); if `begin_call` does,
//! the run had started when the cancel won, and that run finishes. The cancel learns
//! which from its own RMW (`Cancel::Won::queued`).
//!
//! # Why a claim bit, not a sequence
//!
//! The shard fires in two steps: it claims the entry (one CAS that fails while a reset
//! holds `RESETTING` or a move is outstanding), *then* re-reads the deadline, then
//! fires or releases the claim. A reset that began before the claim finished before it
//! (the claim's CAS found `RESETTING` clear), so the claim's Acquire reads its deadline;
//! a reset that begins after the claim waits in `begin_reset` until the claim is
//! released. So the deadline the shard decides on is the latest one, and a timer never
//! fires on a deadline older than its last successful reset. (An earlier design bumped
//! a 25-bit sequence on every reset and fired by one CAS expecting the word it had
//! loaded before reading the deadline: 2^25 resets between the load and the CAS made
//! the CAS succeed on a stale deadline. The claim has no counter to wrap.)
//!
//! Fired and Cancelled are final. Exactly one of firing and cancelling wins, because
//! both are a single read-modify-write from Pending; the loser learns it from its own
//! RMW, never from a second load. `FILED` tells a winning canceller whether the shard
//! must be sent a cancel message: an entry cancelled before it was filed is discarded
//! by `mark_filed`'s caller instead (see `entry`'s ground rules).

#![forbid(unsafe_code)]

use crate::id::TimerState;
use crate::sync::{AtomicU32, Ordering};

/// The state bits.
const STATE_MASK: u32 = 0b11;
/// Not yet fired or cancelled.
const PENDING: u32 = 0;
/// Won by expiry.
const FIRED: u32 = 1;
/// Won by cancel.
const CANCELLED: u32 = 2;
/// Set while the entry is (or was last) filed in its shard's wheel.
const FILED: u32 = 0b100;
/// Set when shutdown hands the entry back; handle cancels then lose.
const DETACHED: u32 = 0b1000;
/// Set while a reset stores its new deadline.
const RESETTING: u32 = 1 << 4;
/// Set on a repeating timer from the hand-over of a run until the runner starts the
/// callback. The bit of `RESETTING`: only `EntryRef::reset` sets that, and it refuses a
/// repeating timer before touching the word, so the two never meet on one entry (and
/// `try_claim` refuses a word with `RUNNING`, which `QUEUED` always comes with).
const QUEUED: u32 = RESETTING;
/// Set while a move message is outstanding.
const MOVING: u32 = 1 << 5;
/// Set while a repeating timer's callback runs.
const RUNNING: u32 = 1 << 6;
/// Set while the shard decides whether a claimed entry is due.
const CLAIMING: u32 = 1 << 7;
/// One reference: the count lives in bits 8–31.
const REF: u32 = 1 << 8;
/// Where the count saturates (Linux's `refcount_t`): a count that reaches it is moved
/// to [`SATURATED_MIDDLE`] and stays in the saturated range for ever, so the entry is
/// never freed (a leak, never a use-after-free, never an abort). Every later
/// increment or decrement of a saturated count is undone at once by the thread that
/// made it.
const SATURATED_REFS: u32 = 1 << 23;
/// The middle of the saturated range `[2^23, 2^24)`: 2^22 racing increments or
/// decrements, each not yet undone, could neither leave the range nor carry past bit
/// 31.
const SATURATED_MIDDLE: u32 = 3 << 22;

/// A loaded value of the state word.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Snapshot(u32);

impl Snapshot {
    /// The timer state in this snapshot.
    pub fn state(self) -> TimerState {
        match self.0 & STATE_MASK {
            PENDING => TimerState::Pending,
            FIRED => TimerState::Fired,
            _ => TimerState::Cancelled,
        }
    }

    /// Whether `FILED` is set.
    pub fn is_filed(self) -> bool {
        self.0 & FILED != 0
    }

    /// Whether a move message is outstanding.
    pub fn is_moving(self) -> bool {
        self.0 & MOVING != 0
    }
}

impl core::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:?}", self.state())?;
        if self.is_filed() {
            f.write_str("+FILED")?;
        }
        Ok(())
    }
}

/// The outcome of [`StateWord::try_cancel`].
#[must_use = "the winner of a cancel owns the callback and must drop it"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cancel {
    /// This call moved Pending → Cancelled. `filed` says whether the entry was in its
    /// shard's wheel at that moment (so the shard must be told); `running` whether a
    /// repeating timer's run was under way (so the runner drops the callback);
    /// `queued` whether that run had not started yet (it now never starts).
    Won {
        /// `FILED` was set when the CAS succeeded.
        filed: bool,
        /// `RUNNING` was set when the CAS succeeded.
        running: bool,
        /// `RUNNING` and `QUEUED` were set when the CAS succeeded: the run was handed
        /// over and had not started; `begin_call` now fails.
        queued: bool,
    },
    /// Expiry or an earlier cancel won; the state found.
    Lost(TimerState),
}

/// The outcome of [`StateWord::try_fire`], [`StateWord::try_claim`] and the ends of a claim.
#[must_use = "the winner of expiry owns the callback and must run it"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fire {
    /// This call moved Pending → Fired.
    Won,
    /// A cancel won first.
    Lost,
    /// A reset is under way or happened since the word was read, or a move message
    /// is outstanding: not now; re-file with the current deadline.
    Moved,
}

/// The outcome of [`StateWord::finish_reset`].
#[must_use = "a reset that set MOVING must send its move message"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Finish {
    /// Still pending: the reset took effect. `send_move`: this reset set `MOVING` and
    /// must send the shard one move message.
    Pending {
        /// Whether to send a move message.
        send_move: bool,
    },
    /// Fired or cancelled while the reset ran: it did not take effect.
    Lost,
}

/// The outcome of [`StateWord::mark_filed`].
#[must_use = "a cancelled entry must be discarded, not filed"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum File {
    /// `FILED` is now set and the entry was pending: file it in the wheel.
    Filed,
    /// The entry was cancelled before the shard reached it; its canceller sent no
    /// message, so the shard discards it now.
    AlreadyCancelled {
        /// `MOVING` was set: a reset's move message is still to come.
        moving: bool,
    },
}

/// The atomic state word.
pub(crate) struct StateWord(AtomicU32);

impl StateWord {
    /// A pending, unfiled state with `refs` references.
    pub(crate) fn new(refs: u32) -> Self {
        StateWord(AtomicU32::new(PENDING | (refs * REF)))
    }

    /// Takes one more reference; the caller holds one. At [`SATURATED_REFS`] the
    /// count saturates: the increment is undone and the entry is kept for ever.
    pub(crate) fn add_ref(&self) {
        // ORDERING: Relaxed, as `Arc::clone`: a new reference is made from one we
        // hold, so the allocation cannot be freed meanwhile; nothing is published.
        let previous = self.0.fetch_add(REF, Ordering::Relaxed) / REF;
        if previous >= SATURATED_REFS {
            // ORDERING: Relaxed: undoes our own increment of a saturated count.
            self.0.fetch_sub(REF, Ordering::Relaxed);
        } else if previous + 1 == SATURATED_REFS {
            // Ours reached the saturated range: move to its middle, out of reach of
            // racing transients. ORDERING: Relaxed: an RMW of the count bits alone.
            self.0
                .fetch_add((SATURATED_MIDDLE - SATURATED_REFS) * REF, Ordering::Relaxed);
        }
    }

    /// Lets one reference go; returns the word before if it was the last (the
    /// caller then frees the entry: nobody else can change the word any more). A
    /// saturated count is left as it is: the entry is never freed.
    pub(crate) fn drop_ref(&self) -> Option<Snapshot> {
        // ORDERING: AcqRel. Release: our uses of the entry happen-before the free by
        // whoever drops last. Acquire (for the last owner): every other owner's uses
        // happen-before our free. An AcqRel RMW instead of Release plus an Acquire
        // fence, which loom models poorly.
        let previous = self.0.fetch_sub(REF, Ordering::AcqRel);
        if previous / REF >= SATURATED_REFS {
            // ORDERING: Relaxed: undoes our own decrement of a saturated count, which
            // thus never reaches 1; nothing is freed, so nothing needs ordering.
            self.0.fetch_add(REF, Ordering::Relaxed);
            return None;
        }
        (previous / REF == 1).then_some(Snapshot(previous))
    }

    /// The current state, for `TimerHandle::state`.
    pub(crate) fn load(&self) -> Snapshot {
        // ORDERING: Acquire pairs with the AcqRel transitions below, so a caller that
        // sees Fired or Cancelled also sees what the winner did before its CAS.
        Snapshot(self.0.load(Ordering::Acquire))
    }

    /// A handle's Pending → Cancelled, keeping `FILED`. Loses once `DETACHED`: the
    /// timer then belongs to its `Unfired`.
    pub(crate) fn try_cancel(&self) -> Cancel {
        self.cancel_unless(DETACHED)
    }

    /// An `Unfired`'s Pending → Cancelled (it owns a `DETACHED` entry).
    pub(crate) fn try_cancel_detached(&self) -> Cancel {
        self.cancel_unless(0)
    }

    /// Pending → Cancelled unless any bit of `blocking` is set.
    fn cancel_unless(&self, blocking: u32) -> Cancel {
        // ORDERING: Relaxed first read; the CAS below validates it.
        let mut current = self.0.load(Ordering::Relaxed);
        loop {
            if current & STATE_MASK != PENDING || current & blocking != 0 {
                return Cancel::Lost(Snapshot(current).state());
            }
            // ORDERING: success AcqRel. Acquire: the winner is about to drop the
            // callback, whose initialisation must happen-before (it did, through the
            // handle's creation; Acquire also orders after a FILED set by the shard).
            // Release: the shard's `mark_filed`, which may read Cancelled, and any
            // `state()` reader see the transition after everything the canceller did
            // before it. Failure Relaxed: we only retry with the fresh value.
            match self.0.compare_exchange_weak(
                current,
                (current & !STATE_MASK) | CANCELLED,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    let running = current & RUNNING != 0;
                    return Cancel::Won {
                        filed: current & FILED != 0,
                        running,
                        queued: running && current & QUEUED != 0,
                    };
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Pending → Fired, keeping `FILED`. Shard thread only.
    pub(crate) fn try_fire(&self) -> Fire {
        // ORDERING: Relaxed first read; the CAS below validates it.
        let mut current = self.0.load(Ordering::Relaxed);
        loop {
            if current & STATE_MASK != PENDING {
                return Fire::Lost;
            }
            // ORDERING: success AcqRel, for the same reasons as `try_cancel`: the
            // winner takes the callback; readers of Fired see what preceded it.
            // Failure Relaxed: we only retry with the fresh value.
            match self.0.compare_exchange_weak(
                current,
                (current & !STATE_MASK) | FIRED,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Fire::Won,
                Err(actual) => current = actual,
            }
        }
    }

    /// The shard's claim of an entry that looks due: Pending (and none of
    /// `RESETTING`, `MOVING`, `RUNNING`) → +`CLAIMING`. `Won` means the caller must now
    /// re-read the deadline and end the claim with [`fire_claimed`](Self::fire_claimed),
    /// [`start_run_claimed`](Self::start_run_claimed) or
    /// [`release_claim`](Self::release_claim). Shard thread only.
    pub(crate) fn try_claim(&self) -> Fire {
        // ORDERING: Relaxed first read; the CAS below validates it.
        let mut current = self.0.load(Ordering::Relaxed);
        loop {
            if current & STATE_MASK != PENDING {
                return Fire::Lost;
            }
            if current & (RESETTING | MOVING | RUNNING) != 0 {
                return Fire::Moved;
            }
            // ORDERING: success Acquire: it reads the value written by the last
            // `finish_reset` (Release) or a later one, so the deadline that reset stored
            // is visible to the caller's next load; no reset can store another until the
            // claim is released (`begin_reset` waits on CLAIMING). Failure Relaxed: we
            // only retry with the fresh value.
            match self.0.compare_exchange_weak(
                current,
                current | CLAIMING,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Fire::Won,
                Err(actual) => current = actual,
            }
        }
    }

    /// Ends a claim by firing: Pending +CLAIMING → Fired. `Lost` if a cancel won while
    /// the entry was claimed (the claim is then released). Shard thread only.
    pub(crate) fn fire_claimed(&self) -> Fire {
        self.end_claim(|current| (current & !(STATE_MASK | CLAIMING)) | FIRED)
    }

    /// Ends a claim by starting a repeating timer's run: Pending stays, `FILED` clears
    /// (the entry leaves the wheel for the run), `RUNNING` and `QUEUED` set. `Won`
    /// means the caller owns the callback until [`finish_run`](Self::finish_run), and
    /// may call it only after winning [`begin_call`](Self::begin_call). Shard thread
    /// only.
    pub(crate) fn start_run_claimed(&self) -> Fire {
        self.end_claim(|current| (current & !(CLAIMING | FILED)) | RUNNING | QUEUED)
    }

    /// The runner starts the callback of a run handed over by
    /// [`start_run_claimed`](Self::start_run_claimed): Pending +QUEUED → Pending
    /// (clearing `QUEUED`). `Lost` if a cancel won first: the run must not start (the
    /// runner still ends it with `finish_run`, and drops the callback). Runner only,
    /// once per run, while it holds `RUNNING`.
    pub(crate) fn begin_call(&self) -> Fire {
        // ORDERING: Relaxed first read; the CAS below validates it.
        let mut current = self.0.load(Ordering::Relaxed);
        loop {
            debug_assert!(
                current & RUNNING != 0 && current & QUEUED != 0,
                "run invariant: the runner holds RUNNING and its run has not started"
            );
            if current & STATE_MASK != PENDING {
                return Fire::Lost;
            }
            // ORDERING: Relaxed, success and failure: the decision is this RMW's place
            // in the word's modification order against the cancel's CAS (RMWs of one
            // atomic are totally ordered, and a cancel that happened-before us is
            // earlier in it, so we read Cancelled); no data changes hands here: the
            // runner owns the callback since the hand-over (the executor's queue
            // synchronises), and `finish_run`'s AcqRel orders what it did with it.
            match self.0.compare_exchange_weak(
                current,
                current & !QUEUED,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Fire::Won,
                Err(actual) => current = actual,
            }
        }
    }

    /// Ends a claim with `next(current)` if the entry is still pending; otherwise (a
    /// cancel won meanwhile) just clears `CLAIMING` and returns `Lost`.
    fn end_claim(&self, next: impl Fn(u32) -> u32) -> Fire {
        // ORDERING: Relaxed first read; the CAS below validates it.
        let mut current = self.0.load(Ordering::Relaxed);
        loop {
            debug_assert!(
                current & CLAIMING != 0,
                "claim invariant: the shard holds CLAIMING"
            );
            let new = if current & STATE_MASK == PENDING {
                next(current)
            } else {
                current & !CLAIMING
            };
            // ORDERING: success AcqRel, as in `try_cancel`: the winner of Pending → Fired
            // takes the callback (Acquire: after its initialisation and any cancel that
            // lost); readers of Fired see what preceded it (Release). Failure Relaxed:
            // we retry with the fresh value (a cancel or a reference count changed it).
            match self
                .0
                .compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) if current & STATE_MASK == PENDING => return Fire::Won,
                Ok(_) => return Fire::Lost,
                Err(actual) => current = actual,
            }
        }
    }

    /// Ends a claim without firing (not due after all): clears `CLAIMING`. Shard thread
    /// only.
    pub(crate) fn release_claim(&self) {
        // ORDERING: Release: a reset waiting in `begin_reset` (Acquire) sees the claim
        // gone after everything the shard did while holding it; the shard only read.
        self.0.fetch_and(!CLAIMING, Ordering::Release);
    }

    /// The runner ends a run: clears `RUNNING` (and `QUEUED`, if the run never
    /// started). Returns whether the timer is still pending (then the runner files it
    /// again); if it was cancelled meanwhile, the runner owns the callback and drops it.
    pub(crate) fn finish_run(&self) -> bool {
        // ORDERING: AcqRel: Release hands the callback (mutated by the run) to whoever
        // takes it next; Acquire orders the runner after a cancel that won meanwhile.
        let before = self.0.fetch_and(!(RUNNING | QUEUED), Ordering::AcqRel);
        before & STATE_MASK == PENDING
    }

    /// A handle's reset, first half: Pending (not detached) → Pending + RESETTING.
    /// Waits while another reset holds RESETTING (it holds it for two stores) or the
    /// shard holds CLAIMING (a few instructions). Returns `false` if the timer is no longer pending (or detached).
    pub(crate) fn begin_reset(&self) -> bool {
        let backoff = crate::sync::Backoff::new();
        // ORDERING: Relaxed first read; the CAS below validates it.
        let mut current = self.0.load(Ordering::Relaxed);
        loop {
            if current & STATE_MASK != PENDING || current & DETACHED != 0 {
                return false;
            }
            if current & (RESETTING | CLAIMING) != 0 {
                backoff.snooze();
                // ORDERING: Relaxed: a fresh guess, validated by the CAS.
                current = self.0.load(Ordering::Relaxed);
                continue;
            }
            // ORDERING: success Acquire: we then read the old deadline, which the
            // previous reset stored before its Release in `finish_reset`. Failure
            // Relaxed: we retry with the fresh value.
            match self.0.compare_exchange_weak(
                current,
                current | RESETTING,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    /// A handle's reset, second half: clears RESETTING; if the new deadline is
    /// `earlier` and the entry is still pending and not detached, sets MOVING (unless a
    /// move message is already outstanding) and tells the caller to send one. Filed or
    /// not: the shard may sleep past the new deadline either way, and the message is
    /// what wakes it. A second earlier reset while a message is outstanding sends none:
    /// the shard reads the latest deadline when the first message arrives.
    pub(crate) fn finish_reset(&self, earlier: bool) -> Finish {
        // ORDERING: Relaxed first read; the CAS below validates it.
        let mut current = self.0.load(Ordering::Relaxed);
        loop {
            let pending = current & STATE_MASK == PENDING;
            let send_move = pending && earlier && current & (MOVING | DETACHED) == 0;
            let new = (current & !RESETTING) | if send_move { MOVING } else { 0 };
            // ORDERING: success Release: the new deadline, stored before, is visible to
            // the shard's Acquire RMWs of this word (`try_claim`, `clear_moving`,
            // `detach`). Failure Relaxed: retry with the fresh value.
            match self
                .0
                .compare_exchange_weak(current, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) if pending => return Finish::Pending { send_move },
                Ok(_) => return Finish::Lost,
                Err(actual) => current = actual,
            }
        }
    }

    /// The shard takes a move message: clears MOVING and returns the word before.
    pub(crate) fn clear_moving(&self) -> Snapshot {
        // ORDERING: AcqRel: Acquire so that the deadline the shard reads next is at
        // least the one stored by the reset that set MOVING, or a later one; Release so
        // that a reset finishing after this sees MOVING clear and sends a new message.
        Snapshot(self.0.fetch_and(!MOVING, Ordering::AcqRel))
    }

    /// Sets `FILED`. Shard thread only, once, when it drains the entry from its insert
    /// ring.
    pub(crate) fn mark_filed(&self) -> File {
        // ORDERING: AcqRel. The RMW is what orders the shard against a concurrent
        // `try_cancel`: exactly one of them sees the other (both are RMWs on this
        // word). Acquire: if we read Cancelled, the canceller's work happened-before.
        // Release: a canceller that reads FILED sees the entry as filed.
        let previous = self.0.fetch_or(FILED, Ordering::AcqRel);
        if previous & STATE_MASK == CANCELLED {
            File::AlreadyCancelled {
                moving: previous & MOVING != 0,
            }
        } else {
            File::Filed
        }
    }

    /// Clears `FILED`, sets `DETACHED`, and returns the snapshot before. Shard thread
    /// only, at shutdown, when it hands the entry back: a handle cancel after this
    /// loses and sends no message.
    pub(crate) fn detach(&self) -> Snapshot {
        // ORDERING: Relaxed first read; the CAS below validates it.
        let mut current = self.0.load(Ordering::Relaxed);
        loop {
            // ORDERING: success AcqRel, as in `mark_filed`: the RMW decides against a
            // concurrent `try_cancel` whether that cancel won (and sends a message) or
            // lost. Failure Relaxed: we retry with the fresh value.
            match self.0.compare_exchange_weak(
                current,
                (current & !FILED) | DETACHED,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(previous) => return Snapshot(previous),
                Err(actual) => current = actual,
            }
        }
    }
}

impl core::fmt::Debug for StateWord {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.load().fmt(f)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{Cancel, File, Fire, StateWord};
    use crate::id::TimerState;

    #[test]
    fn references_share_the_word_without_touching_the_state() {
        let word = StateWord::new(2);
        word.add_ref();
        assert_eq!(
            word.try_cancel(),
            Cancel::Won {
                filed: false,
                running: false,
                queued: false
            }
        );
        assert_eq!(word.drop_ref(), None, "two references left");
        assert!(matches!(
            word.mark_filed(),
            File::AlreadyCancelled { moving: false }
        ));
        assert_eq!(word.drop_ref(), None, "one reference left");
        let last = word.drop_ref().expect("the last reference");
        assert_eq!(last.state(), TimerState::Cancelled);
        assert!(last.is_filed(), "the flags survive the count's changes");
    }

    #[test]
    fn cancel_then_fire_cancel_wins_once() {
        let word = StateWord::new(1);
        assert_eq!(
            word.try_cancel(),
            Cancel::Won {
                filed: false,
                running: false,
                queued: false
            }
        );
        assert_eq!(word.try_cancel(), Cancel::Lost(TimerState::Cancelled));
        assert_eq!(word.try_fire(), Fire::Lost);
        assert_eq!(word.mark_filed(), File::AlreadyCancelled { moving: false });
        assert_eq!(word.load().state(), TimerState::Cancelled);
    }

    #[test]
    fn fire_then_cancel_fire_wins_once() {
        let word = StateWord::new(1);
        assert_eq!(word.mark_filed(), File::Filed);
        assert_eq!(word.try_fire(), Fire::Won);
        assert_eq!(word.try_fire(), Fire::Lost);
        assert_eq!(word.try_cancel(), Cancel::Lost(TimerState::Fired));
        assert!(word.load().is_filed());
    }

    #[test]
    fn filed_flag_reaches_the_canceller() {
        let word = StateWord::new(1);
        assert_eq!(word.mark_filed(), File::Filed);
        assert_eq!(
            word.try_cancel(),
            Cancel::Won {
                filed: true,
                running: false,
                queued: false
            }
        );
        assert_eq!(word.detach().state(), TimerState::Cancelled);
    }

    #[test]
    fn detached_entries_belong_to_their_unfired() {
        let word = StateWord::new(1);
        assert_eq!(word.mark_filed(), File::Filed);
        assert!(word.detach().is_filed());
        assert_eq!(word.try_cancel(), Cancel::Lost(TimerState::Pending));
        assert_eq!(
            word.try_cancel_detached(),
            Cancel::Won {
                filed: false,
                running: false,
                queued: false
            }
        );
        let word = StateWord::new(1);
        let _ = word.detach();
        assert_eq!(
            word.try_fire(),
            Fire::Won,
            "Unfired::run fires a detached entry"
        );
    }

    #[test]
    fn a_cancel_before_a_queued_run_starts_stops_it_and_one_after_lets_it_finish() {
        // Cancel first: the run, handed over but not started, never starts.
        let word = StateWord::new(1);
        assert_eq!(word.mark_filed(), File::Filed);
        assert_eq!(word.try_claim(), Fire::Won);
        assert_eq!(word.start_run_claimed(), Fire::Won);
        assert_eq!(
            word.try_cancel(),
            Cancel::Won {
                filed: false,
                running: true,
                queued: true
            }
        );
        assert_eq!(word.begin_call(), Fire::Lost, "the run must not start");
        assert!(
            !word.finish_run(),
            "cancelled: the runner drops the callback"
        );
        // The run starts first: the cancel still wins, the started run finishes.
        let word = StateWord::new(1);
        assert_eq!(word.mark_filed(), File::Filed);
        assert_eq!(word.try_claim(), Fire::Won);
        assert_eq!(word.start_run_claimed(), Fire::Won);
        assert_eq!(word.begin_call(), Fire::Won);
        assert_eq!(
            word.try_cancel(),
            Cancel::Won {
                filed: false,
                running: true,
                queued: false
            }
        );
        assert!(!word.finish_run());
        // Not cancelled: the run ends pending, with neither bit left behind.
        let word = StateWord::new(1);
        assert_eq!(word.mark_filed(), File::Filed);
        assert_eq!(word.try_claim(), Fire::Won);
        assert_eq!(word.start_run_claimed(), Fire::Won);
        assert_eq!(word.begin_call(), Fire::Won);
        assert!(word.finish_run());
        assert_eq!(word.mark_filed(), File::Filed);
        assert_eq!(word.try_claim(), Fire::Won, "no RUNNING or QUEUED left");
    }
}
