//! The plain model the service is checked against: every timer's kind, deadline and
//! fate, every future's expected outcome, and the counters `Stats` must show.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::time::{Duration, Instant};

use sharded_timer::{Sleep, Timeout, TimerHandle};

/// What a timer's callback does, resolved to timer indices.
#[derive(Clone, Debug)]
pub(crate) enum Plan {
    /// Only records its run.
    Record,
    /// Schedules a child `delay` from its now (whose plan is `Child { then, None }`
    /// or `Record`).
    Child {
        delay: Duration,
        then: Option<Duration>,
    },
    /// Cancels timer `target`.
    Cancel { target: usize },
    /// Resets timer `target` to `delay` from its now.
    Reset { target: usize, delay: Duration },
    /// Shuts the service down.
    Shutdown,
}

/// A timer's kind.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    /// `schedule`, `schedule_at`.
    Once,
    /// `schedule_repeating`: run `slot` is due at `start + slot × period`.
    Rate {
        start: Instant,
        period: Duration,
        slot: u64,
    },
    /// `schedule_with_fixed_delay`.
    FixedDelay { delay: Duration },
}

/// Where a timer stands in the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Neither fired, cancelled nor handed back (a repeating timer between runs).
    Pending,
    /// A one-shot timer whose callback ran.
    Ran,
    /// A `cancel` won (or its `Unfired` was dropped).
    Cancelled,
    /// Handed back by `shutdown` and run through its `Unfired`.
    ReturnedRun,
}

/// One timer.
#[derive(Debug)]
pub(crate) struct ModelTimer {
    /// Its handle.
    pub handle: TimerHandle,
    /// Its kind.
    pub kind: Kind,
    /// The instant asked for (the clock's far future for a delay beyond `Instant`);
    /// `deadline()` reports it, saturated at the far future.
    pub requested: Instant,
    /// Its fate.
    pub fate: Fate,
    /// The timer whose callback acts on this one (the only one that may), if any.
    pub owner: Option<usize>,
    /// A `cancel` or `reset` found it fired while the model had not yet seen it run:
    /// its run must show up by the end of the next `advance`.
    pub fired_unlogged: bool,
    /// The sequence number at which a `cancel` of this repeating timer returned
    /// `true`, and how many runs began after it.
    pub cancelled_at: Option<(u64, u32)>,
    /// Its callback's plan.
    pub plan: Plan,
}

/// Counts the wakes a waker gets.
#[derive(Debug, Default)]
pub(crate) struct WakeCount(pub AtomicU64);

impl Wake for WakeCount {
    fn wake(self: Arc<Self>) {
        // ORDERING: SeqCst: read by the harness after `advance` returned, which
        // synchronises with the callback that woke it; SeqCst is simplest.
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A future that is ready at once, or never: the future under a `Timeout`.
#[derive(Debug)]
pub(crate) struct Gate(pub bool);

impl std::future::Future for Gate {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if self.0 {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    }
}

/// A `Sleep` or a `Timeout`, as the harness holds it.
pub(crate) enum Fut {
    /// A sleep.
    Sleep(Pin<Box<Sleep>>),
    /// A timeout whose future is a [`Gate`].
    Timeout(Pin<Box<Timeout<Gate>>>),
}

/// One future and what the model expects of it.
pub(crate) struct ModelFuture {
    /// The future; `None` once dropped.
    pub fut: Option<Fut>,
    /// The instant `deadline()` must report.
    pub requested: Instant,
    /// Whether its timer is pending (scheduled, neither fired nor cancelled).
    pub timer: bool,
    /// Whether a timeout's timer has been armed (a timeout arms at its first poll).
    pub armed: bool,
    /// Completed because its deadline passed.
    pub elapsed: bool,
    /// Completed because the service shut down.
    pub refused: bool,
    /// Whether a poll left a waker in its timer since it was (re-)armed.
    pub registered: bool,
    /// The waker every poll passes.
    pub wakes: Arc<WakeCount>,
    /// How many wakes `wakes` must have counted.
    pub expected_wakes: u64,
    /// A timeout's future is ready at once.
    pub ready: bool,
}

impl ModelFuture {
    /// The waker every poll of this future passes.
    pub(crate) fn waker(&self) -> Waker {
        Waker::from(self.wakes.clone())
    }
}

/// The model of one case.
pub(crate) struct Model {
    /// The clock's start.
    pub start: Instant,
    /// The clock's far future: where `advance(Duration::MAX)` stops, where every
    /// deadline beyond it saturates, and where every deadline is due.
    pub far: Instant,
    /// The clock's now.
    pub now: Instant,
    /// Every timer, by index.
    pub timers: BTreeMap<usize, ModelTimer>,
    /// Sleeps.
    pub sleeps: Vec<ModelFuture>,
    /// Timeouts.
    pub timeouts: Vec<ModelFuture>,
    /// Timers the shards must have taken in (a repeating timer once).
    pub scheduled: u64,
    /// Fired timers and runs of repeating ones.
    pub fired: u64,
    /// Runs of repeating timers that may have been handed over and then cancelled
    /// before they started: `fired` may count them.
    pub fired_slack: u64,
    /// Cancelled timers.
    pub cancelled: u64,
    /// Runs of repeating timers skipped.
    pub skipped: u64,
    /// The service has shut down.
    pub shut: bool,
}

impl Model {
    /// A model whose clock starts at `start` and saturates at `far`.
    pub(crate) fn new(start: Instant, far: Instant) -> Model {
        Model {
            start,
            far,
            now: start,
            timers: BTreeMap::new(),
            sleeps: Vec::new(),
            timeouts: Vec::new(),
            scheduled: 0,
            fired: 0,
            fired_slack: 0,
            cancelled: 0,
            skipped: 0,
            shut: false,
        }
    }

    /// The deadline a requested instant gives: saturated at the far future.
    pub(crate) fn effective(&self, requested: Instant) -> Instant {
        requested.min(self.far)
    }

    /// Whether `requested` is due at the model's now.
    pub(crate) fn is_due(&self, requested: Instant) -> bool {
        self.effective(requested) <= self.now
    }

    /// Whether a timer is due at the model's now: a one-shot timer at its deadline
    /// saturated at the far future; a repeating timer's later run only if it is not
    /// beyond the far future (there the clock stops, and every run would be due).
    pub(crate) fn timer_due(&self, timer: &ModelTimer) -> bool {
        match timer.kind {
            Kind::Once => self.is_due(timer.requested),
            Kind::Rate { .. } | Kind::FixedDelay { .. } => timer.requested <= self.now,
        }
    }

    /// The instant `delay` from now (the far future where that does not exist).
    pub(crate) fn after(&self, delay: Duration) -> Instant {
        self.now.checked_add(delay).unwrap_or(self.far)
    }

    /// `at` since the clock's start, for messages (negative before it).
    pub(crate) fn since(&self, at: Instant) -> String {
        since(self.start, at)
    }

    /// Timers that hold room under `max_pending`: pending ones.
    pub(crate) fn room_taken(&self) -> usize {
        self.timers
            .values()
            .filter(|timer| timer.fate == Fate::Pending)
            .count()
    }

    /// Pending one-shot timers that are due: they may have fired already (a shard's
    /// turn between two `advance`s fires what is due at the clock's now).
    pub(crate) fn maybe_fired(&self) -> usize {
        self.timers
            .values()
            .filter(|timer| {
                timer.fate == Fate::Pending
                    && matches!(timer.kind, Kind::Once)
                    && self.is_due(timer.requested)
            })
            .count()
    }

    /// Timers and futures pending, as `Stats::pending` counts them.
    pub(crate) fn pending(&self) -> u64 {
        let timers = self.room_taken() as u64;
        let futures = self
            .sleeps
            .iter()
            .chain(&self.timeouts)
            .filter(|future| future.timer)
            .count() as u64;
        timers + futures
    }
}

/// Run `slot` of a fixed-rate timer (the library's arithmetic: `start + slot ×
/// period` in whole nanoseconds, `None` beyond `Instant`).
pub(crate) fn rate_deadline(start: Instant, period: Duration, slot: u64) -> Option<Instant> {
    let ns = period.as_nanos().checked_mul(u128::from(slot))?;
    let secs = u64::try_from(ns / 1_000_000_000).ok()?;
    start.checked_add(Duration::new(secs, (ns % 1_000_000_000) as u32))
}

/// `at` since `start`, for messages (negative before it).
pub(crate) fn since(start: Instant, at: Instant) -> String {
    match at.checked_duration_since(start) {
        Some(after) => format!("{after:?}"),
        None => format!("-{:?}", start.duration_since(at)),
    }
}
