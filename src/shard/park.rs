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

#![deny(unsafe_code)]

use std::time::Instant;

use super::core::ShardCore;
use super::rescue::{nudge_unless_looking_by, Watch};
use super::ShardShared;
use crate::clock::{Clock, Tick, TurnSlot};
use crate::sync::{spin_loop, thread, Arc};

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
        // Work arrived; it may be a slot reserved and not yet written, which the next
        // turn cannot pop until its producer writes it: let the producer run.
        spin_loop();
        return Park::No;
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
    if matches!(plan, Park::No) {
        return;
    }
    tell_watcher(plan, watcher);
    let retry = std::time::Duration::from_millis(1);
    match plan {
        Park::No => {}
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
