//! A repeating timer: its fixed-rate schedule ([`Repeat`]), the vtable functions that
//! run it in place, and one run in progress ([`RunningEntry`]).

use core::ptr::NonNull;
use std::time::{Duration, Instant};

use super::{Entry, EntryRef, HandleOptions, Header, KeptOptions, Vtable};
use crate::clock::Nanos;
use crate::sync::{Arc, Ordering};

/// Counts a repeating timer's run and returns its next deadline and the runs skipped.
pub(super) type NextRunFn = unsafe fn(NonNull<Header>, Instant) -> (Option<Instant>, u64);

/// A repeating timer's callback with its schedule: at a fixed rate, run `n` is due at
/// `start + n × period`; with a fixed delay, each run is due `period` after the
/// previous one returned.
pub(super) struct Repeat<F> {
    /// The callback.
    f: F,
    /// When the timer was scheduled.
    start: Instant,
    /// The period; at least one tick.
    period: Duration,
    /// The number of the run most recently made (or skipped).
    runs: u64,
    /// Fixed delay (`ScheduleWithFixedDelay`) rather than fixed rate.
    fixed_delay: bool,
}

impl<F> Repeat<F> {
    /// A schedule with no run made yet: fixed rate from `start`, or, with
    /// `fixed_delay`, each run `period` after the previous one returned.
    fn new(f: F, start: Instant, period: Duration, fixed_delay: bool) -> Self {
        Repeat {
            f,
            start,
            period,
            runs: 0,
            fixed_delay,
        }
    }

    /// The deadline of run `n`, or `None` past what `Instant` holds. Computed in
    /// 128-bit nanoseconds, so any run number works (a 1 ms period passes 2^32 runs
    /// after 49.7 days).
    fn deadline_of(&self, n: u64) -> Option<Instant> {
        let ns = self.period.as_nanos().checked_mul(u128::from(n))?;
        let secs = u64::try_from(ns / 1_000_000_000).ok()?;
        // The remainder is below 10^9, so it fits a `u32`.
        let nanos = (ns % 1_000_000_000) as u32;
        self.start.checked_add(Duration::new(secs, nanos))
    }
}

impl<F: FnMut() + Send + 'static, O: KeptOptions> Entry<Repeat<F>, O> {
    /// The vtable for repeating callbacks of type `F`.
    const REPEATING_VTABLE: Vtable = Vtable {
        run: Self::run_once,
        drop_callback: Entry::<Repeat<F>, O>::drop_callback_any,
        dealloc: Entry::<Repeat<F>, O>::dealloc_any,
        call_again: Some(Self::call_again),
        next_run: Some(Self::next_run),
        hands_back: true,
        holds_room: true,
        sleep: false,
        options: O::PRESENT,
    };

    /// # Safety
    ///
    /// - `header` points to a live `Entry<Repeat<F>, O>`.
    /// - The caller won Pending → Fired (`Unfired::run`) and the callback is there.
    unsafe fn run_once(header: NonNull<Header>) {
        // SAFETY: live (the caller's first point).
        let entry = unsafe { header.cast::<Entry<Repeat<F>, O>>().as_ref() };
        // SAFETY: exclusive and initialised (the caller's second point); read moves it
        // out, so it is dropped exactly once, after the call.
        let mut repeat = entry
            .callback
            .with(|cell| unsafe { cell.cast::<Repeat<F>>().read() });
        (repeat.f)();
    }

    /// # Safety
    ///
    /// - `header` points to a live `Entry<Repeat<F>, O>`.
    /// - The caller holds `RUNNING` (it started this run), so it alone touches the
    ///   callback, which is initialised.
    unsafe fn call_again(header: NonNull<Header>) {
        // SAFETY: live (the caller's first point).
        let entry = unsafe { header.cast::<Entry<Repeat<F>, O>>().as_ref() };
        // SAFETY: exclusive and initialised while RUNNING (the caller's second point).
        entry
            .callback
            .with_mut(|cell| unsafe { ((*cell.cast::<Repeat<F>>()).f)() });
    }

    /// # Safety
    ///
    /// As [`call_again`](Self::call_again).
    unsafe fn next_run(header: NonNull<Header>, now: Instant) -> (Option<Instant>, u64) {
        // SAFETY: live (the caller's first point).
        let entry = unsafe { header.cast::<Entry<Repeat<F>, O>>().as_ref() };
        entry.callback.with_mut(|cell| {
            // SAFETY: exclusive and initialised while RUNNING (the caller's second
            // point), so this is the only reference to the callback.
            let repeat = unsafe { &mut *cell.cast::<Repeat<F>>() };
            if repeat.fixed_delay {
                // `now` is when the run returned: the next is due a period later, and
                // no run is ever skipped.
                repeat.runs += 1;
                return (now.checked_add(repeat.period), 0);
            }
            // The run just made is run `made`; the next is due at `start + next × period`.
            let made = repeat.runs + 1;
            let mut next = made + 1;
            // Fixed rate: if that slot has already passed (the run ended a whole period
            // or more behind), skip to the first slot still ahead rather than run the
            // missed ones back to back.
            let passed = now.saturating_duration_since(repeat.start).as_nanos()
                / repeat.period.as_nanos().max(1);
            let passed = u64::try_from(passed).unwrap_or(u64::MAX);
            let mut skipped = 0;
            if passed >= next {
                skipped = passed + 1 - next;
                next = passed + 1;
            }
            repeat.runs = next - 1;
            (repeat.deadline_of(next), skipped)
        })
    }
}

impl EntryRef {
    /// Allocates a repeating entry, first due at `deadline` (nanoseconds from tick 0),
    /// with runs due at `start + n × period` (fixed rate): two references, as
    /// [`EntryRef::new`].
    pub fn new_repeating<F: FnMut() + Send + 'static>(
        id: crate::id::TimerId,
        deadline: Nanos,
        start: Instant,
        period: Duration,
        options: Option<Arc<HandleOptions>>,
        callback: F,
    ) -> (EntryRef, EntryRef) {
        let repeat = Repeat::new(callback, start, period, false);
        Self::allocate_keeping(id, deadline, options, repeat, repeating_vtables::<F>())
    }

    /// Allocates a repeating entry, first due at `deadline` (nanoseconds from tick 0),
    /// each later run due `delay` after the previous one returned (fixed delay): two
    /// references, as [`EntryRef::new`].
    pub fn new_fixed_delay<F: FnMut() + Send + 'static>(
        id: crate::id::TimerId,
        deadline: Nanos,
        start: Instant,
        delay: Duration,
        options: Option<Arc<HandleOptions>>,
        callback: F,
    ) -> (EntryRef, EntryRef) {
        let repeat = Repeat::new(callback, start, delay, true);
        Self::allocate_keeping(id, deadline, options, repeat, repeating_vtables::<F>())
    }
}

/// The vtables of a repeating entry for `F`, without and with kept options.
fn repeating_vtables<F: FnMut() + Send + 'static>() -> [&'static Vtable; 2] {
    [
        &Entry::<Repeat<F>>::REPEATING_VTABLE,
        &Entry::<Repeat<F>, Arc<HandleOptions>>::REPEATING_VTABLE,
    ]
}

/// A repeating timer during one run: holds `RUNNING`, so it alone touches the
/// callback. [`finish`](Self::finish) ends the run.
#[derive(Debug)]
pub struct RunningEntry {
    /// The service reference; `None` once finished.
    entry: Option<EntryRef>,
}

impl RunningEntry {
    /// The run of `entry`, whose `RUNNING` the caller just set.
    pub(super) fn new(entry: EntryRef) -> Self {
        RunningEntry { entry: Some(entry) }
    }

    /// The entry.
    fn entry(&self) -> &EntryRef {
        self.entry
            .as_ref()
            .expect("running entry invariant: not yet finished")
    }

    /// The timer's id.
    pub fn id(&self) -> crate::id::TimerId {
        self.entry().id()
    }

    /// This run's deadline, in nanoseconds from tick 0.
    pub fn deadline(&self) -> Nanos {
        self.entry().deadline()
    }

    /// Starts the run and runs the callback once, in place; returns whether it ran.
    /// `false`: a cancel won while the run waited to start (its `true` is final, so
    /// the run does not start). Call [`finish`](Self::finish) either way, once.
    ///
    /// # Panics
    ///
    /// If the callback panics (the panic propagates). The `expect`s inside cannot fire:
    /// a `RunningEntry` is always an unfinished repeating entry.
    pub fn call(&mut self) -> bool {
        let entry = self.entry();
        if entry.header().state.begin_call() != super::Fire::Won {
            return false;
        }
        let call = entry
            .header()
            .vtable
            .call_again
            .expect("a running entry is repeating");
        // SAFETY: the entry is live (we hold a reference) and repeating, and we hold
        // RUNNING, so the callback is ours and initialised.
        unsafe { call(entry.0) };
        true
    }

    /// Counts this run and sets the deadline of the next one (`to_ns` of the next
    /// run's instant: nanoseconds from tick 0); returns that deadline and the runs
    /// skipped.
    ///
    /// # Panics
    ///
    /// Never: a `RunningEntry` is always an unfinished repeating entry.
    pub fn schedule_next(
        &mut self,
        now: Instant,
        to_ns: impl Fn(Instant) -> Nanos,
    ) -> (Nanos, u64) {
        let entry = self.entry();
        let next = entry
            .header()
            .vtable
            .next_run
            .expect("a running entry is repeating");
        // SAFETY: as in `call`.
        let (deadline, skipped) = unsafe { next(entry.0, now) };
        // A next run after the far future (where `to_ns` saturates) never comes: at
        // the far future a manual clock stops, and every run would be due at once.
        let deadline = deadline
            .map(to_ns)
            .filter(|&ns| ns < Nanos::FAR_FUTURE)
            .unwrap_or(Nanos::NEVER);
        // ORDERING: Release: published with the entry through the insert ring (and by
        // `finish_run`'s Release) to the shard's loads.
        entry
            .header()
            .deadline
            .store(deadline.to_bits(), Ordering::Release);
        (deadline, skipped)
    }

    /// Cancels the timer during its run, as a handle's `cancel` would (Pending →
    /// Cancelled; the callback stays with this run, which drops it in
    /// [`finish`](Self::finish)). Returns whether this call won: the caller then frees
    /// the timer's room. No message: a running entry is out of its shard's wheel
    /// (`FILED` is clear while `RUNNING` is set).
    pub fn try_cancel(&self) -> bool {
        match self.entry().header().state.try_cancel() {
            super::Cancel::Won { filed, running, .. } => {
                debug_assert!(
                    running && !filed,
                    "run invariant: a running entry is unfiled (would be a lost message)"
                );
                true
            }
            super::Cancel::Lost(_) => false,
        }
    }

    /// Ends the run: the entry back if the timer is still pending (the caller files
    /// it again); `None` if it was cancelled meanwhile (the callback is then dropped).
    pub fn finish(mut self) -> Option<EntryRef> {
        self.finish_in_place()
    }

    /// As [`finish`](Self::finish), but a cancelled timer's callback is not dropped
    /// here: it comes back as a [`CancelledRun`], which drops it when it is dropped, so
    /// the caller does its bookkeeping (counting the cancel) first and lets user code
    /// (the callback's captures, whose `Drop` may panic) run last.
    ///
    /// # Errors
    ///
    /// `Err(CancelledRun)` when a cancel won during the run: the timer is done.
    ///
    /// # Panics
    ///
    /// If the run was finished already (an internal invariant: `finish*` consume the
    /// run, and only `Drop` finishes one in place).
    pub fn finish_deferred(mut self) -> Result<EntryRef, CancelledRun> {
        let entry = self
            .entry
            .take()
            .expect("run invariant: a run is finished once");
        if entry.header().state.finish_run() {
            return Ok(entry);
        }
        Err(CancelledRun(Some(entry)))
    }

    /// As [`finish`](Self::finish), for `Drop` too.
    fn finish_in_place(&mut self) -> Option<EntryRef> {
        let entry = self.entry.take()?;
        if entry.header().state.finish_run() {
            return Some(entry);
        }
        // SAFETY: a cancel won while we held RUNNING, so it left the callback to us
        // (ground rule 2), untaken; we drop it once, after the state word is settled.
        unsafe { entry.drop_callback() };
        None
    }
}

/// A repeating timer whose run ended after a cancel won: its callback is the run's to
/// drop (ground rule 2), and is dropped when this is dropped, after the caller's
/// bookkeeping.
#[derive(Debug)]
pub struct CancelledRun(Option<EntryRef>);

impl Drop for CancelledRun {
    fn drop(&mut self) {
        if let Some(entry) = self.0.take() {
            // SAFETY: a cancel won while the run held RUNNING (`finish_run` returned
            // false), so it left the callback to the run, untaken; `finish_deferred`
            // handed that duty here, and `take` makes this the only drop. If the drop
            // panics, `entry` (a local) still gives its reference back as it unwinds.
            unsafe { entry.drop_callback() };
        }
    }
}

impl Drop for RunningEntry {
    fn drop(&mut self) {
        // Unfinished (the task was dropped unrun): end the run so the callback is
        // dropped exactly once, by the canceller's rule or with the last reference.
        drop(self.finish_in_place());
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::Repeat;
    use std::time::{Duration, Instant};

    #[test]
    fn run_deadlines_hold_past_two_to_the_32_runs() {
        let start = Instant::now();
        let repeat = Repeat::new((), start, Duration::from_millis(1), false);
        let n = (1u64 << 32) + 5;
        assert_eq!(
            repeat.deadline_of(n),
            Some(start + Duration::from_millis(n)),
            "run 2^32 + 5 of a 1 ms timer is due 49.7 days on"
        );
        assert_eq!(
            repeat.deadline_of(u64::MAX),
            start.checked_add(Duration::from_millis(u64::MAX))
        );
        let long = Repeat::new((), start, Duration::MAX, false);
        assert_eq!(
            long.deadline_of(2),
            None,
            "beyond Duration: None, never a panic"
        );
    }
}
