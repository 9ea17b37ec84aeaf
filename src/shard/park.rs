//! Park planning: what the shard thread does instead of another turn ([`Park`]),
//! planned holding the token (`plan_park`) and slept without it (`park`).
//!
//! # Ground rules
//!
//! - The plan is made holding the token, and publishes the tick the shard will sleep
//!   until (its half of the park handshake, `shard.rs`), so a producer filing directly
//!   under the token reads it in order (`direct.rs`); it re-checks the rings after the
//!   park fence, and sleeps not at all if work arrived.
//! - It publishes `due`, the core's next expiry, before that fence, for the shard's
//!   watcher, and the watched shard's horizon bounds its own sleep; the sleep itself
//!   first unparks the watcher if this shard has timers due before the watcher's
//!   wake-up allows for (`rescue.rs`'s ground rules: watching).
//! - A shard thread with pushes deferred (`own.rs`) sleeps a millisecond at most, to
//!   retry them.
//! - **A producer between its reservation and its write is let run** ([`Stall`]).
//!   Work that arrived after the fence may be a ring slot reserved and not yet
//!   written, which no turn can pop until its producer writes it; and that producer
//!   may have read the shard awake and will not unpark it. So the shard turns again
//!   rather than sleep, but it must not spin for it: the producer may be a thread the
//!   shard preempted on its own core (a pool worker re-arming a repeating timer, say),
//!   runnable and waiting for that core, which a spinning shard holds until the
//!   kernel's next scheduler tick. Found by the main job on a quiet machine (issue
//!   41, item 6): streaks of such spins of 1.3–4.8 ms on shard threads, with the
//!   preempted pool worker holding the fired runs that were then 2–10 ms late. So
//!   while turns take nothing, the shard spins briefly, then yields, then naps
//!   ([`FIRST_NAP`] doubling to [`LONGEST_NAP`], never longer than a tick nor past the
//!   next expiry): bounded sleeps in which the producer gets the core, each followed
//!   by a turn that expires what came due; any turn that takes something starts over.
//!   A producer descheduled mid-push for longer still holds what was reserved after
//!   it in its ring (first in, first out): see docs/architecture.md, section 7.

#![deny(unsafe_code)]

use std::time::{Duration, Instant};

use super::core::ShardCore;
use super::rescue::{nudge_unless_looking_by, Watch};
use super::ShardShared;
use crate::clock::{Clock, Tick, TurnSlot};
#[cfg(loom)]
use crate::sync::spin_loop;
use crate::sync::{thread, Arc, Backoff};

/// What the shard thread does instead of another turn.
#[derive(Clone, Copy, Debug)]
pub(super) enum Park {
    /// Work is due or arrived: turn again.
    No,
    /// Sleep until unparked (nothing due; or a manual clock, which unparks); the
    /// core's next expiry.
    Indefinitely(Tick),
    /// Sleep until this instant (the next expiry, or the watch horizon, if earlier);
    /// the core's next expiry.
    Until(Instant, Tick),
    /// Work arrived that the last turn may not have been able to take (a slot
    /// reserved, not yet written): turn again, after [`Stall::wait`]. `popped`: the
    /// core's count of values popped from its rings, at the plan.
    Retry {
        /// [`ShardCore::popped`] when the plan was made.
        popped: usize,
        /// The longest the shard may nap before that turn: [`LONGEST_NAP`], or less
        /// if the tick is shorter or the next expiry (or watch) is sooner.
        cap: Duration,
    },
}

/// The shard's first nap while a producer it may have preempted holds a reserved ring
/// slot unwritten ([`Stall`]): long enough for that producer to be scheduled and write
/// it.
pub(super) const FIRST_NAP: Duration = Duration::from_micros(20);

/// The longest nap of a [`Stall`]: a quarter of the default 1 ms tick. Naps double up
/// to it: each costs the shard a timed sleep and a wake-up (a few µs on a VM), so 20 µs
/// naps alone used half a core over a long stall, and a producer still not done after
/// the first naps is running elsewhere or descheduled. A nap is also never longer than
/// the tick, nor than the time to the shard's next expiry (`Park::Retry`'s `cap`): so
/// the turn after it expires a timer that came due meanwhile within guarantee 2 (an
/// outside audit measured a 100 µs tick's p99 at 3.5 ticks with a fixed 250 µs cap).
pub(super) const LONGEST_NAP: Duration = Duration::from_micros(250);

/// The shard's wait before turning again on [`Park::Retry`] (ground rules: a producer
/// between its reservation and its write is let run). While consecutive turns take
/// nothing from the rings, it spins, then yields, then naps from [`FIRST_NAP`],
/// doubling to [`LONGEST_NAP`] (at most the retry's `cap`); a turn that took
/// something starts it over. The naps are what surely hand the core over: a yield
/// lets a preempted producer run only if the scheduler picks it next, and under EEVDF a
/// thread with the shards' short slice may be picked again first.
#[derive(Debug, Default)]
pub(super) struct Stall {
    /// The core's popped count at the last retry, if the last plan was one.
    popped: Option<usize>,
    /// The backoff since the rings last gave something.
    backoff: Backoff,
    /// The next nap, once the backoff is complete (set to [`FIRST_NAP`] at each start).
    nap: Duration,
}

impl Stall {
    /// Waits before the turn that follows a [`Park::Retry`] made with `popped`, napping
    /// at most `cap`.
    pub(super) fn wait(&mut self, popped: usize, cap: Duration) {
        if self.popped != Some(popped) {
            // The turn before this plan took something (or this is the first retry):
            // most likely more is on its way from a producer on another core.
            self.popped = Some(popped);
            self.backoff.reset();
            self.nap = FIRST_NAP;
        }
        if !self.backoff.is_completed() {
            // Spins (a producer running elsewhere writes within nanoseconds), then
            // yields (one preempted on this core may be picked).
            self.backoff.snooze();
            return;
        }
        // Under loom a backoff completes at once and a timed park never returns by
        // itself (`sync.rs`): yielding to the model is the wait there.
        #[cfg(not(loom))]
        {
            let nap = self.nap.min(cap);
            if nap.is_zero() {
                // Something is due now: turn at once.
                std::hint::spin_loop();
            } else {
                thread::park_timeout(nap);
            }
        }
        #[cfg(loom)]
        {
            let _ = cap;
            spin_loop();
        }
        self.nap = (self.nap * 2).min(LONGEST_NAP);
    }

    /// The plan was not a retry: the next one starts over.
    pub(super) fn clear(&mut self) {
        self.popped = None;
    }
}

/// Plans the sleep after a turn, holding the token: until the core's next expiry (or
/// the watched shard's horizon, if earlier), unless work arrived meanwhile. Under a
/// manual clock (`turns`), indefinitely, and not at all if a round later than
/// `answered` is asked for: nothing comes due until an `advance`, which unparks the
/// shard. Publishes the tick it will sleep until (the park handshake's store half).
pub(super) fn plan_park(
    core: &ShardCore,
    clock: Clock,
    turns: Option<&TurnSlot>,
    answered: u64,
    watch: Option<&Watch>,
    blocked_until: Option<Tick>,
) -> Park {
    let due = core.next_expiry().unwrap_or(Tick::NEVER);
    let mut wake = due;
    let (now, manual) = match turns {
        Some(turns) => {
            let (now, round_asked) = turns.before_park(answered);
            if round_asked {
                return Park::No;
            }
            (now, true)
        }
        None => (Instant::now(), false),
    };
    let now = clock.tick_of(now);
    if let Some(watch) = watch {
        wake = wake.min(watch.horizon(now));
    }
    if let Some(blocked_until) = blocked_until {
        wake = wake.min(blocked_until);
    }
    if wake <= now {
        return Park::No;
    }
    // Stored before the fence in `prepare_park`, for the watcher (ground rules of
    // `rescue.rs`).
    core.shared().set_due(due);
    if !core.prepare_park(wake) {
        if core.shared().is_stopping() {
            return Park::No;
        }
        // Work arrived; it may be a slot reserved and not yet written, which the next
        // turn cannot pop until its producer writes it: let the producer run (ground
        // rules), napping no longer than a tick nor past the next expiry.
        let mut cap = LONGEST_NAP.min(Duration::from_nanos(clock.ticks().tick_ns()));
        if manual {
            // Nothing comes due until an `advance`, which waits for this shard's turn.
            cap = cap.min(FIRST_NAP);
        } else if wake != Tick::NEVER {
            cap = cap.min(
                clock
                    .tick_to_instant(wake)
                    .saturating_duration_since(Instant::now()),
            );
        }
        return Park::Retry {
            popped: core.popped(),
            cap,
        };
    }
    // After our fence (in `prepare_park`): the watched shard's state again, in case it
    // went to sleep with an earlier wake-up than we planned for, while its read of our
    // `next_wake` came before our store (ground rules of `rescue.rs`: watching).
    if watch.is_some_and(|watch| watch.horizon(now) < wake) {
        core.shared().wake_up();
        return Park::No;
    }
    if wake == Tick::NEVER || manual {
        Park::Indefinitely(due)
    } else {
        Park::Until(clock.tick_to_instant(wake), due)
    }
}

/// Before this shard sleeps as `plan` says: unparks its watcher if the watcher sleeps
/// past `rescue_after` after this shard's next expiry, the latest it must look
/// (`rescue.rs`'s ground rules: watching; after `prepare_park`'s fence).
pub(super) fn tell_watcher(plan: Park, watcher: Option<&(Arc<ShardShared>, u64)>) {
    let (Park::Indefinitely(due) | Park::Until(_, due)) = plan else {
        return;
    };
    if let Some((watcher, rescue_after)) = watcher {
        if due != Tick::NEVER {
            nudge_unless_looking_by(watcher, due.get().saturating_add(*rescue_after));
        }
    }
}

/// Sleeps as `plan` says, without the token; first unparks the watcher if this shard
/// has timers due before the watcher's own wake-up allows for (`rescue.rs`'s ground
/// rules: watching).
/// With pushes `deferred`, sleeps a millisecond at most, to retry them.
pub(super) fn park(
    plan: Park,
    shared: &ShardShared,
    watcher: Option<&(Arc<ShardShared>, u64)>,
    deferred: bool,
) {
    if matches!(plan, Park::No | Park::Retry { .. }) {
        return;
    }
    tell_watcher(plan, watcher);
    let retry = std::time::Duration::from_millis(1);
    match plan {
        Park::No | Park::Retry { .. } => {}
        Park::Indefinitely(_) if deferred => thread::park_timeout(retry),
        Park::Indefinitely(_) => thread::park(),
        Park::Until(until, _) => {
            let now = Instant::now();
            if until > now {
                let sleep = until - now;
                thread::park_timeout(if deferred { sleep.min(retry) } else { sleep });
            }
        }
    }
    shared.wake_up();
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::{Duration, Instant};

    use super::{plan_park, Park, LONGEST_NAP};
    use crate::clock::{Clock, Nanos, Tick, TimeSource};
    use crate::entry::EntryRef;
    use crate::id::TimerId;
    use crate::shard::core::ShardCore;
    use crate::shard::ShardShared;

    /// The nap a plan allows while a slot is reserved and unwritten, for a service of
    /// `tick_ns` ticks whose clock started `ago` before now, with a timer due at `due`
    /// ns if any; `None` if the plan was to turn at once (the timer already due: a slow
    /// build, under a sanitizer, can take longer than its deadline to get here).
    fn retry_cap(tick_ns: u64, ago: Duration, due: Option<u64>) -> Option<Duration> {
        let (shared, cursors) = ShardShared::with_time(8, TimeSource::System, None);
        let clock = Clock::at(Instant::now() - ago, tick_ns);
        let mut core = ShardCore::new(shared.clone(), cursors, Tick::new(0), tick_ns, None);
        let mut handles = Vec::new();
        if let Some(due) = due {
            let (handle, service) = EntryRef::new(TimerId::next(), Nanos::new(due), || {});
            assert!(shared.insert_ring().push(service).is_ok());
            assert_eq!(core.drain_inserts(), 1);
            handles.push(handle);
        }
        let reservation = shared.insert_ring().reserve().unwrap();
        let plan = plan_park(&core, clock, None, 0, None, None);
        let (handle, service) = EntryRef::new(TimerId::next(), Nanos::new(u64::MAX / 2), || {});
        reservation.publish(service);
        handles.push(handle);
        core.drain_inserts();
        drop(core.shut_down());
        match plan {
            Park::Retry { cap, .. } => Some(cap),
            Park::No if due.is_some() => None,
            other => panic!("a reserved, unwritten slot plans a retry, not {other:?}"),
        }
    }

    /// An outside audit measured a 100 µs tick's lateness p99 at 3.5 ticks while a
    /// slot stayed reserved, with naps of up to 250 µs whatever the tick: a nap is
    /// never longer than a tick, nor than the time to the next expiry.
    #[test]
    fn a_retry_naps_no_longer_than_a_tick_nor_past_the_next_expiry() {
        assert_eq!(
            retry_cap(1_000_000, Duration::ZERO, None),
            Some(LONGEST_NAP)
        );
        assert_eq!(
            retry_cap(100_000, Duration::ZERO, None),
            Some(Duration::from_micros(100))
        );
        // 1 ms ticks, a timer due at tick 1, the clock started 0.9 ms ago: tick 1 is
        // at most 100 µs away (or already here: then no nap at all).
        let cap = retry_cap(1_000_000, Duration::from_micros(900), Some(1_000_000));
        assert!(
            cap.is_none_or(|cap| cap <= Duration::from_micros(100)),
            "{cap:?}"
        );
    }
}
