//! Conversion between `Instant`s and the service's ticks.
//!
//! A tick is a `u64` count of [`Builder::tick`](crate::Builder::tick) periods since
//! the process's clock origin (one `Instant` for every service, taken when the first
//! service starts), so a handle converts its deadline with nothing but the tick
//! length; a service driven by a [`ManualClock`] counts from that clock's start
//! instead (`manual.rs`). Deadlines **round up** to a tick and "now" **rounds
//! down**, so a timer due at tick `t` is never due before its `Instant`: that rule
//! keeps "never early".

#![forbid(unsafe_code)]

mod manual;

pub use manual::ManualClock;
pub(crate) use manual::{BatchMark, ManualTime, TimeSource, TurnSlot};

use std::time::{Duration, Instant};

/// A far-future fallback for ticks whose `Instant` the platform cannot represent.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The clock origin shared by every service in the process: the `Instant` the first
/// service started.
pub(crate) fn origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// The service's time base: its start `Instant` (the process's [`origin`] for a
/// service) and its tick length.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    /// Tick 0.
    start: Instant,
    /// Length of one tick in nanoseconds; at least 1.
    tick_ns: u64,
}

impl Clock {
    /// A clock whose tick 0 is `start`. `tick` must be at least 1 ns and at most
    /// `u64::MAX` ns (checked by the builder).
    pub(crate) fn new(start: Instant, tick: Duration) -> Self {
        let tick_ns = u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX).max(1);
        Clock { start, tick_ns }
    }

    /// A clock at the process's [`origin`] whose ticks are `tick_ns` nanoseconds long
    /// (a handle's, from [`tick_ns`](Self::tick_ns)).
    pub(crate) fn at_origin(tick_ns: u64) -> Self {
        Clock::at(origin(), tick_ns)
    }

    /// A clock whose tick 0 is `start` and whose ticks are `tick_ns` nanoseconds long.
    pub(crate) fn at(start: Instant, tick_ns: u64) -> Self {
        Clock {
            start,
            tick_ns: tick_ns.max(1),
        }
    }

    /// The tick length in nanoseconds.
    pub(crate) fn tick_ns(&self) -> u64 {
        self.tick_ns
    }

    /// The tick at which `deadline` is due: the first tick boundary at or after it.
    /// Instants before the start map to tick 0; instants beyond the `u64` tick range
    /// saturate to `u64::MAX`, which never comes due.
    pub(crate) fn instant_to_tick(&self, deadline: Instant) -> u64 {
        let ns = deadline.saturating_duration_since(self.start).as_nanos();
        // A 64-bit division on the schedule path (the u128 one showed in profiles);
        // the wide path only past 584 years.
        match u64::try_from(ns) {
            Ok(ns) => ns.div_ceil(self.tick_ns),
            Err(_) => u64::try_from(ns.div_ceil(u128::from(self.tick_ns))).unwrap_or(u64::MAX),
        }
    }

    /// The tick containing `now`, rounded down.
    pub(crate) fn tick_of(&self, now: Instant) -> u64 {
        let ns = now.saturating_duration_since(self.start).as_nanos();
        match u64::try_from(ns) {
            Ok(ns) => ns / self.tick_ns,
            Err(_) => u64::try_from(ns / u128::from(self.tick_ns)).unwrap_or(u64::MAX),
        }
    }

    /// Nanoseconds from tick 0 to `now`, saturating (0 before the start, `u64::MAX`
    /// past 584 years).
    pub(crate) fn ns_of(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.start).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The `Instant` at which `tick` begins. Ticks beyond what `Instant` can represent
    /// map to a point about a century after the start (they never come due anyway).
    pub(crate) fn tick_to_instant(&self, tick: u64) -> Instant {
        let ns = u128::from(tick) * u128::from(self.tick_ns);
        u64::try_from(ns)
            .ok()
            .and_then(|ns| self.start.checked_add(Duration::from_nanos(ns)))
            .or_else(|| self.start.checked_add(FAR_FUTURE))
            .unwrap_or(self.start)
    }
}

#[cfg(test)]
mod tests {
    use super::Clock;
    use std::time::{Duration, Instant};

    #[test]
    fn deadlines_round_up_and_now_rounds_down() {
        let start = Instant::now();
        let clock = Clock::new(start, Duration::from_millis(1));
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        assert_eq!(clock.instant_to_tick(start), 0);
        assert_eq!(clock.instant_to_tick(start + us(1)), 1);
        assert_eq!(clock.instant_to_tick(start + ms(1)), 1);
        assert_eq!(
            clock.instant_to_tick(start + ms(1) + Duration::from_nanos(1)),
            2
        );
        assert_eq!(clock.tick_of(start + us(999)), 0);
        assert_eq!(clock.tick_of(start + ms(1)), 1);
        assert_eq!(clock.tick_of(start + us(1999)), 1);
        // Before the start: tick 0, both ways.
        if let Some(before) = start.checked_sub(ms(5)) {
            assert_eq!(clock.instant_to_tick(before), 0);
            assert_eq!(clock.tick_of(before), 0);
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
            assert!(clock.tick_to_instant(tick - 1) < deadline, "{ns} ns");
        }
    }

    #[test]
    fn huge_ticks_saturate_without_panic() {
        let start = Instant::now();
        let clock = Clock::new(start, Duration::from_secs(3600));
        assert!(clock.tick_to_instant(u64::MAX) > start);
        let one_ns = Clock::new(start, Duration::from_nanos(1));
        let far = start + Duration::from_secs(1 << 40);
        assert_eq!(one_ns.instant_to_tick(far), u64::MAX);
    }
}
