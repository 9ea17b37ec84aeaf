//! Conversion between `Instant`s, nanoseconds ([`Nanos`]) and the service's ticks
//! ([`Tick`]): the three forms a deadline takes, each its own type (`units.rs`), with
//! one `NEVER` in each unit.
//!
//! A tick is a count of [`Builder::tick`](crate::Builder::tick) periods since
//! the process's clock origin (one `Instant` for every service, taken when the first
//! service starts); a service driven by a [`ManualClock`] counts from that clock's
//! start instead (`manual.rs`). An entry keeps its deadline in **nanoseconds** from
//! that same start, so a handle converts it with nothing of its service (tick 0 is the
//! origin, or its manual clock's start); the shard turns it into the tick it is due at
//! ([`Clock::due_tick`], a multiplication by a precomputed inverse of the tick length,
//! not a division). Deadlines **round up** to a tick and "now" **rounds
//! down**, so a timer due at tick `t` is never due before its `Instant`: that rule
//! keeps "never early".

#![forbid(unsafe_code)]

pub(crate) mod coarse;
mod manual;
mod units;

pub use manual::ManualClock;
pub(crate) use manual::{BatchMark, ManualTime, TimeSource, TurnSlot};
pub use units::{Nanos, Tick};

use std::time::{Duration, Instant};

/// A far-future fallback for ticks whose `Instant` the platform cannot represent.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The clock origin shared by every service in the process: the `Instant` the first
/// service started.
pub(crate) fn origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Nanoseconds from `start` to `deadline`: 0 before the start, [`Nanos::NEVER`] past
/// what 64 bits of nanoseconds hold (584 years), which never comes due.
pub(crate) fn ns_since(start: Instant, deadline: Instant) -> Nanos {
    Nanos::new(
        u64::try_from(deadline.saturating_duration_since(start).as_nanos())
            .unwrap_or(Nanos::NEVER.get()),
    )
}

/// The instant `deadline` after `start`, [`Nanos::NEVER`]'s included (584 years on),
/// so that [`ns_since`] maps it back exactly and the order of instants is the order
/// of nanoseconds (one meaning of "never" for every path, timers and futures alike).
/// Only where `Instant` cannot hold that does it fall back to about a century after
/// the start.
pub(crate) fn instant_after(start: Instant, deadline: Nanos) -> Instant {
    start
        .checked_add(Duration::from_nanos(deadline.get()))
        .or_else(|| start.checked_add(FAR_FUTURE))
        .unwrap_or(start)
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

    /// The tick at which a deadline of `deadline` nanoseconds after tick 0 is due:
    /// the first tick boundary at or after it; [`Nanos::NEVER`] maps to
    /// [`Tick::NEVER`], which never comes due.
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
        let deadline_ns = deadline.get();
        let mut quotient = ((u128::from(deadline_ns) * u128::from(self.inverse)) >> 64) as u64;
        let mut remainder = deadline_ns - quotient * self.tick_ns;
        while remainder >= self.tick_ns {
            quotient += 1;
            remainder -= self.tick_ns;
        }
        Tick::new(quotient + u64::from(remainder != 0))
    }

    /// The last nanosecond (after tick 0) whose deadlines are due at tick `now`:
    /// `deadline` is due by tick `now` exactly when `deadline <= due_by(now)`
    /// ([`Nanos::NEVER`] never is: this stays at or below [`Nanos::LAST`]).
    pub(crate) fn due_by(&self, now: Tick) -> Nanos {
        Nanos::new(
            now.get()
                .saturating_mul(self.tick_ns)
                .min(Nanos::LAST.get()),
        )
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
    /// The tick length.
    ticks: Ticks,
}

impl Clock {
    /// A clock whose tick 0 is `start`. `tick` must be at least 1 ns and at most
    /// `u64::MAX` ns (checked by the builder).
    pub(crate) fn new(start: Instant, tick: Duration) -> Self {
        Clock::at(start, u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX))
    }

    /// A clock whose tick 0 is `start` and whose ticks are `tick_ns` nanoseconds long.
    pub(crate) fn at(start: Instant, tick_ns: u64) -> Self {
        Clock {
            start,
            ticks: Ticks::new(tick_ns),
        }
    }

    /// The tick length, for the shard.
    pub(crate) fn ticks(&self) -> Ticks {
        self.ticks
    }

    /// See [`Ticks::due_tick`].
    pub(crate) fn due_tick(&self, deadline: Nanos) -> Tick {
        self.ticks.due_tick(deadline)
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
    /// Instants before the start map to tick 0; instants beyond 64 bits of
    /// nanoseconds saturate to `u64::MAX`, which never comes due.
    #[cfg(test)]
    pub(crate) fn instant_to_tick(&self, deadline: Instant) -> Tick {
        self.due_tick(self.instant_to_ns(deadline))
    }

    /// The tick containing `now`, rounded down.
    pub(crate) fn tick_of(&self, now: Instant) -> Tick {
        let ns = now.saturating_duration_since(self.start).as_nanos();
        Tick::new(match u64::try_from(ns) {
            Ok(ns) => ns / self.ticks.tick_ns,
            Err(_) => u64::try_from(ns / u128::from(self.ticks.tick_ns)).unwrap_or(u64::MAX),
        })
    }

    /// The `Instant` at which `tick` begins. Ticks beyond what `Instant` can represent
    /// map to a point about a century after the start (they never come due anyway).
    pub(crate) fn tick_to_instant(&self, tick: Tick) -> Instant {
        let ns = u128::from(tick.get()) * u128::from(self.ticks.tick_ns);
        u64::try_from(ns)
            .ok()
            .and_then(|ns| self.start.checked_add(Duration::from_nanos(ns)))
            .or_else(|| self.start.checked_add(FAR_FUTURE))
            .unwrap_or(self.start)
    }
}

#[cfg(test)]
mod tests {
    use super::{Clock, Nanos, Tick};
    use std::time::{Duration, Instant};

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
                u64::MAX - 1,
            ];
            let random = (0..2_000).map(|_| next() >> (next() % 64));
            for ns in edges.into_iter().chain(random) {
                if ns == u64::MAX {
                    continue;
                }
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
            assert_eq!(clock.due_tick(Nanos::NEVER), Tick::NEVER);
        }
    }

    #[test]
    fn huge_ticks_saturate_without_panic() {
        let start = Instant::now();
        let clock = Clock::new(start, Duration::from_secs(3600));
        assert!(clock.tick_to_instant(Tick::NEVER) > start);
        let one_ns = Clock::new(start, Duration::from_nanos(1));
        let far = start + Duration::from_secs(1 << 40);
        assert_eq!(one_ns.instant_to_tick(far), Tick::NEVER);
    }
}
