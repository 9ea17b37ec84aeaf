//! Conversion between `Instant`s, nanoseconds ([`Nanos`]) and the service's ticks
//! ([`Tick`]): the three forms a deadline takes, each its own type (`units.rs`).
//!
//! A tick is a count of [`Builder::tick`](crate::Builder::tick) periods since
//! the process's clock origin (one `Instant` for every service, taken when the first
//! service starts); a service driven by a [`ManualClock`] counts nanoseconds from that
//! clock's start instead ([`Clock::manual`]: no deadline waits for a tick boundary
//! there, since `advance` promises that every deadline not after now has fired). An
//! entry keeps its deadline in **signed nanoseconds** from that same start, so a
//! handle converts it with nothing of its service (tick 0 is the origin, or its manual
//! clock's start), and an instant before the start reads back exactly; the shard turns
//! it into the tick it is due at ([`Clock::due_tick`], a multiplication by a
//! precomputed inverse of the tick length, not a division; tick 0 for a deadline
//! before the start). Deadlines **round up** to a tick and "now" **rounds down**, so a
//! timer due at tick `t` is never due before its `Instant`: that rule keeps "never
//! early".

#![forbid(unsafe_code)]

// Paused time (`time.rs`, absent from the loom build) is its only listener.
#[cfg(not(loom))]
mod armed;
pub(crate) mod coarse;
mod instant;
mod manual;
mod units;

#[cfg(not(loom))]
pub(crate) use armed::{catch_up_before_arming, note_armed, set_armed_hook, ArmedListener};
// The `time` namespace (absent from the loom build) re-exports it.
#[cfg(not(loom))]
pub use instant::Instant as TimeInstant;
#[cfg(loom)]
pub(crate) use instant::Instant as TimeInstant;
pub use manual::ManualClock;
pub(crate) use manual::{BatchMark, ManualTime, TimeSource, TurnSlot};
pub use units::{Nanos, Tick};

use std::time::{Duration, Instant};

/// A fallback for a far future the platform's `Instant` cannot represent.
const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The clock origin shared by every service in the process: the `Instant` the first
/// service started.
pub(crate) fn origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Nanoseconds from `start` to `deadline`, negative before the start (exactly, back to
/// 292 years before it), saturating at [`Nanos::FAR_FUTURE`] (292 years after it).
pub(crate) fn ns_since(start: Instant, deadline: Instant) -> Nanos {
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    match deadline.checked_duration_since(start) {
        Some(after) => Nanos::new(nanos(after)),
        None => Nanos::before(nanos(start.duration_since(deadline))),
    }
}

/// The instant `deadline` from `start`, so that [`ns_since`] maps it back exactly and
/// the order of instants is the order of nanoseconds ([`Nanos::FAR_FUTURE`] included:
/// one far future for every path, timers and futures alike). Only where `Instant`
/// cannot hold that does it fall back: to about a century after the start for the far
/// future, to the start for a point before it that the platform cannot hold (later
/// than asked: never early).
pub(crate) fn instant_after(start: Instant, deadline: Nanos) -> Instant {
    match deadline.offset_from_zero() {
        Ok(after) => start
            .checked_add(Duration::from_nanos(after))
            .or_else(|| start.checked_add(CENTURY))
            .unwrap_or(start),
        Err(before) => start
            .checked_sub(Duration::from_nanos(before))
            .unwrap_or(start),
    }
}

/// Nanoseconds ↔ ticks of one length: what a shard needs to file deadlines, which
/// entries keep in nanoseconds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticks {
    /// Length of one tick in nanoseconds; at least 1.
    tick_ns: u64,
    /// `u64::MAX / tick_ns`: a quotient estimate by multiplication (see `due_tick`).
    inverse: u64,
}

impl Ticks {
    /// Ticks of `tick_ns` nanoseconds (0 is taken as 1).
    pub(crate) fn new(tick_ns: u64) -> Ticks {
        let tick_ns = tick_ns.max(1);
        Ticks {
            tick_ns,
            inverse: u64::MAX / tick_ns,
        }
    }

    /// The tick at which a deadline of `deadline` nanoseconds from tick 0 is due:
    /// the first tick boundary at or after it; tick 0 for a deadline before tick 0;
    /// [`Tick::NEVER`] for [`Nanos::NEVER`] only ([`Nanos::FAR_FUTURE`]'s is before).
    ///
    /// Exact, without a division: with `m = ⌊(2⁶⁴−1)/d⌋` for the tick length `d`, the
    /// high half of `n·m` is at most `⌊n/d⌋` and at least `⌊n/d⌋ − 2` (the error of `m`
    /// is below one, times `n/2⁶⁴ < 1`, plus the truncation), so at most two
    /// corrections of the remainder give the exact quotient (Granlund and Montgomery,
    /// "Division by invariant integers using multiplication", 1994, §4, without the
    /// extra bit that makes a single step exact).
    pub(crate) fn due_tick(&self, deadline: Nanos) -> Tick {
        if deadline == Nanos::NEVER {
            return Tick::NEVER;
        }
        let Ok(deadline_ns) = deadline.offset_from_zero() else {
            return Tick::new(0);
        };
        let mut quotient = ((u128::from(deadline_ns) * u128::from(self.inverse)) >> 64) as u64;
        let mut remainder = deadline_ns - quotient * self.tick_ns;
        while remainder >= self.tick_ns {
            quotient += 1;
            remainder -= self.tick_ns;
        }
        Tick::new(quotient + u64::from(remainder != 0))
    }

    /// The last nanosecond whose deadlines are due at tick `now` (its start):
    /// `deadline` is due by tick `now` exactly when `deadline <= due_by(now)`
    /// (saturating at [`Nanos::FAR_FUTURE`], which is due at its own tick;
    /// [`Nanos::NEVER`] never is).
    pub(crate) fn due_by(&self, now: Tick) -> Nanos {
        Nanos::new(now.get().saturating_mul(self.tick_ns))
    }

    /// The tick length in nanoseconds.
    pub(crate) fn tick_ns(&self) -> u64 {
        self.tick_ns
    }
}

/// The service's time base: its start `Instant` (the process's [`origin`] for a
/// service) and its tick length.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    /// Tick 0.
    start: Instant,
    /// The tick length: the service's tick, or 1 ns under a manual clock.
    ticks: Ticks,
    /// The service's tick ([`Builder::tick`](crate::Builder::tick)), whatever its
    /// wheel's ticks: what counts as late (`Interval`'s missed ticks).
    resolution: Duration,
    /// [`Nanos::FAR_FUTURE`] as an instant, computed once: every future's deadline is
    /// clamped to it.
    far_future: Instant,
}

impl Clock {
    /// A clock whose tick 0 is `start`. `tick` must be at least 1 ns and at most
    /// `u64::MAX` ns (checked by the builder).
    pub(crate) fn new(start: Instant, tick: Duration) -> Self {
        Clock {
            resolution: tick,
            ..Clock::at(start, u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX))
        }
    }

    /// The clock of a service that a manual clock starting at `start` drives, of
    /// service tick `tick`: its wheel's ticks are 1 ns long, so every deadline is due
    /// at its own instant. A tick is how often a shard on the system clock wakes to
    /// look (a deadline waits for the next boundary at most one tick); a manual clock
    /// wakes its shards at every `advance` instead, which promises that every deadline
    /// not after the new now has fired: a coarser grid would leave one inside the
    /// current tick pending, and firing a whole tick would fire the rest of it early.
    /// A deadline a whole number of service ticks from the start is due exactly then
    /// on either grid.
    pub(crate) fn manual(start: Instant, tick: Duration) -> Self {
        Clock {
            resolution: tick,
            ..Clock::at(start, 1)
        }
    }

    /// The clock of a service that a gridded manual clock drives
    /// ([`ManualClock::on_grid`]): its wheel's ticks are the grid's steps, from the
    /// manual clock's start, so a deadline is due at the grid point at or after it.
    pub(crate) fn on_grid(start: Instant, grid_ns: u64, tick: Duration) -> Self {
        Clock {
            resolution: tick,
            ..Clock::at(start, grid_ns)
        }
    }

    /// A clock whose tick 0 is `start` and whose ticks are `tick_ns` nanoseconds long.
    pub(crate) fn at(start: Instant, tick_ns: u64) -> Self {
        Clock {
            start,
            ticks: Ticks::new(tick_ns),
            resolution: Duration::from_nanos(tick_ns.max(1)),
            far_future: instant_after(start, Nanos::FAR_FUTURE),
        }
    }

    /// The service's tick (see the field).
    pub(crate) fn resolution(&self) -> Duration {
        self.resolution
    }

    /// The tick length, for the shard.
    pub(crate) fn ticks(&self) -> Ticks {
        self.ticks
    }

    /// See [`Ticks::due_tick`].
    pub(crate) fn due_tick(&self, deadline: Nanos) -> Tick {
        self.ticks.due_tick(deadline)
    }

    /// The far future: where every deadline too far to count saturates
    /// ([`Nanos::FAR_FUTURE`] after tick 0), and where a manual clock saturates.
    pub(crate) fn far_future(&self) -> Instant {
        self.far_future
    }

    /// Nanoseconds from tick 0 to `deadline` (see [`ns_since`]).
    pub(crate) fn instant_to_ns(&self, deadline: Instant) -> Nanos {
        ns_since(self.start, deadline)
    }

    /// The instant `deadline_ns` after tick 0 (see [`instant_after`]).
    pub(crate) fn ns_to_instant(&self, deadline: Nanos) -> Instant {
        instant_after(self.start, deadline)
    }

    /// The tick at which `deadline` is due: the first tick boundary at or after it.
    /// Instants before the start map to tick 0; instants beyond the far future
    /// saturate to its tick.
    #[cfg(test)]
    pub(crate) fn instant_to_tick(&self, deadline: Instant) -> Tick {
        self.due_tick(self.instant_to_ns(deadline))
    }

    /// The tick containing `now`, rounded down; at or past the far future, the far
    /// future's own (due) tick, so that every deadline is due there whatever the tick
    /// length (a deadline saturated at the far future rounds up to the tick after the
    /// one the far future lies in).
    pub(crate) fn tick_of(&self, now: Instant) -> Tick {
        if now >= self.far_future {
            return self.due_tick(Nanos::FAR_FUTURE);
        }
        let ns = now.saturating_duration_since(self.start).as_nanos();
        Tick::new(match u64::try_from(ns) {
            Ok(ns) => ns / self.ticks.tick_ns,
            Err(_) => u64::try_from(ns / u128::from(self.ticks.tick_ns)).unwrap_or(u64::MAX),
        })
    }

    /// The `Instant` at which `tick` begins, saturating at the far future (ticks
    /// beyond it never come due).
    pub(crate) fn tick_to_instant(&self, tick: Tick) -> Instant {
        self.ns_to_instant(self.ticks.due_by(tick))
    }
}

#[cfg(test)]
mod tests {
    use super::{Clock, Nanos, Tick};
    use std::time::{Duration, Instant};

    /// [`Nanos::FAR_FUTURE`]'s count after tick 0.
    const FAR_NS: u64 = (1 << 63) - 2;

    #[test]
    fn deadlines_round_up_and_now_rounds_down() {
        let start = Instant::now();
        let clock = Clock::new(start, Duration::from_millis(1));
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        assert_eq!(clock.instant_to_tick(start), Tick::new(0));
        assert_eq!(clock.instant_to_tick(start + us(1)), Tick::new(1));
        assert_eq!(clock.instant_to_tick(start + ms(1)), Tick::new(1));
        assert_eq!(
            clock.instant_to_tick(start + ms(1) + Duration::from_nanos(1)),
            Tick::new(2)
        );
        assert_eq!(clock.tick_of(start + us(999)), Tick::new(0));
        assert_eq!(clock.tick_of(start + ms(1)), Tick::new(1));
        assert_eq!(clock.tick_of(start + us(1999)), Tick::new(1));
        // Before the start: tick 0, both ways.
        if let Some(before) = start.checked_sub(ms(5)) {
            assert_eq!(clock.instant_to_tick(before), Tick::new(0));
            assert_eq!(clock.tick_of(before), Tick::new(0));
        }
    }

    #[test]
    fn a_deadline_is_never_before_its_tick_start() {
        let start = Instant::now();
        let clock = Clock::new(start, Duration::from_micros(250));
        for ns in [1u64, 249_999, 250_000, 250_001, 7_777_777, 1 << 40] {
            let deadline = start + Duration::from_nanos(ns);
            let tick = clock.instant_to_tick(deadline);
            assert!(clock.tick_to_instant(tick) >= deadline, "{ns} ns");
            assert!(
                clock.tick_to_instant(Tick::new(tick.get() - 1)) < deadline,
                "{ns} ns"
            );
        }
    }

    #[test]
    fn due_tick_is_the_exact_rounded_up_quotient_without_a_division() {
        let start = Instant::now();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let ticks = [
            1u64,
            2,
            3,
            7,
            1_000,
            999_983,
            1_000_000,
            1 << 32,
            u64::MAX / 3,
            u64::MAX,
        ];
        for tick_ns in ticks {
            let clock = Clock::at(start, tick_ns);
            let edges = [
                0,
                1,
                tick_ns - 1,
                tick_ns,
                tick_ns.saturating_add(1),
                FAR_NS - 1,
                FAR_NS,
            ];
            let random = (0..2_000).map(|_| next() >> (next() % 64));
            for ns in edges.into_iter().chain(random) {
                // Counts past the far future saturate there.
                let ns = ns.min(FAR_NS);
                assert_eq!(
                    clock.due_tick(Nanos::new(ns)),
                    Tick::new(ns.div_ceil(tick_ns)),
                    "{ns} ns, tick {tick_ns}"
                );
                let due = clock.due_tick(Nanos::new(ns));
                assert!(
                    Nanos::new(ns) <= clock.ticks().due_by(due),
                    "due at its tick"
                );
                assert!(
                    due == Tick::new(0)
                        || Nanos::new(ns) > clock.ticks().due_by(Tick::new(due.get() - 1)),
                    "not a tick before"
                );
            }
            assert_eq!(
                clock.due_tick(Nanos::FAR_FUTURE),
                Tick::new(FAR_NS.div_ceil(tick_ns))
            );
            assert!(clock.due_tick(Nanos::FAR_FUTURE) < Tick::NEVER);
            assert_eq!(clock.due_tick(Nanos::NEVER), Tick::NEVER);
            assert!(clock.ticks().due_by(Tick::NEVER) < Nanos::NEVER);
            assert_eq!(clock.due_tick(Nanos::before(1)), Tick::new(0));
            assert_eq!(clock.due_tick(Nanos::EARLIEST), Tick::new(0));
        }
    }

    #[test]
    fn instants_before_the_start_read_back_exactly() {
        let start = Instant::now() + Duration::from_secs(7_200);
        let clock = Clock::new(start, Duration::from_millis(1));
        for back in [1, 999, 1_000_000, 3_600_000_000_000, 7_199_999_999_999] {
            let deadline = start - Duration::from_nanos(back);
            let ns = clock.instant_to_ns(deadline);
            assert_eq!(ns, Nanos::before(back));
            assert_eq!(clock.ns_to_instant(ns), deadline, "{back} ns before");
            assert_eq!(clock.due_tick(ns), Tick::new(0), "due at once");
            assert!(ns < Nanos::ZERO && ns > Nanos::EARLIEST);
        }
        let after = start + Duration::from_nanos(1_500_001);
        assert_eq!(clock.ns_to_instant(clock.instant_to_ns(after)), after);
        if let Some(beyond) = start.checked_add(Duration::from_secs(1 << 40)) {
            assert_eq!(clock.instant_to_ns(beyond), Nanos::FAR_FUTURE, "saturates");
        }
    }

    #[test]
    fn huge_ticks_saturate_without_panic() {
        let start = Instant::now();
        let clock = Clock::new(start, Duration::from_secs(3600));
        assert!(clock.tick_to_instant(Tick::NEVER) > start);
        let one_ns = Clock::new(start, Duration::from_nanos(1));
        let far = start + Duration::from_secs(1 << 40);
        let far_tick = one_ns.instant_to_tick(far);
        assert_eq!(far_tick, one_ns.due_tick(Nanos::FAR_FUTURE), "saturates");
        assert!(
            far_tick < Tick::NEVER,
            "and comes due at the far future's tick"
        );
    }
}
