//! The operations the load threads issue: one-shot, repeating and fixed-delay timers
//! (a delay or an instant, near, far or past), cancels and resets, dropped handles,
//! `Stats` reads; callbacks that block, panic or schedule, and hostile captures whose
//! `Drop` panics, schedules or cancels. Each checks what it can at once
//! (`deadline()`, `cancel`'s answer) and files its timer in the ledger.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sharded_timer::{ScheduleError, ShardedTimer, Stats, TimerHandle, TimerState};

use super::checker::{
    check_monotonic, end_run, start_run, DropFlag, InCallback, Kind, Record, Shared,
};
use super::hand_executor::drop_anchor;
use super::report::{bump, deliberate, violation, Op};
use super::{Rng, FAR};

/// What a one-shot callback does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behaviour {
    /// Checks itself and returns.
    Plain,
    /// Blocks this many µs.
    Block(u64),
    /// Panics.
    Panic,
    /// Schedules a near timer on the service it captured.
    Schedule,
}

/// A capture whose `Drop` panics.
#[derive(Debug)]
struct PanicOnDrop(Arc<Shared>);

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A second panic would abort: the capture is being dropped by an unwind.
            return;
        }
        Shared::count(&self.0.drop_panics);
        deliberate("panic in a capture's Drop");
    }
}

/// A capture whose `Drop` schedules a near timer on the service.
#[derive(Debug)]
struct ScheduleOnDrop(ShardedTimer, Arc<Shared>);

impl Drop for ScheduleOnDrop {
    fn drop(&mut self) {
        let delay = Duration::from_micros(500);
        drop(schedule_plain(&self.0, &self.1, delay));
    }
}

/// A capture whose `Drop` cancels another (plain) timer.
#[derive(Debug)]
struct CancelOnDrop(TimerHandle, Arc<Record>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.0.cancel() {
            self.1.note_cancel_won();
            if self.1.runs() > 0 {
                violation(format!(
                    "{}: cancel() returned true (from a capture's Drop) after it ran",
                    self.1.name()
                ));
            }
        }
    }
}

/// A hostile capture.
#[derive(Debug)]
#[allow(dead_code, reason = "each capture is held for its Drop, never read")]
enum Hostile {
    /// None.
    None,
    /// `Drop` panics.
    Panics(PanicOnDrop),
    /// `Drop` schedules.
    Schedules(ScheduleOnDrop),
    /// `Drop` cancels another timer.
    Cancels(CancelOnDrop),
    /// A clone of the service.
    Service(ShardedTimer),
}

/// How to schedule: a delay or an instant.
#[derive(Clone, Copy, Debug)]
enum When {
    /// `schedule(delay)`.
    After(Duration),
    /// `schedule_at(instant)`.
    At(Instant),
}

/// Schedules a plain near one-shot timer (from a capture's drop or a callback).
fn schedule_plain(
    timer: &ShardedTimer,
    shared: &Arc<Shared>,
    delay: Duration,
) -> Option<(TimerHandle, Arc<Record>)> {
    schedule_one(
        timer,
        shared,
        When::After(delay),
        Behaviour::Plain,
        Hostile::None,
    )
}

/// Schedules one one-shot timer; `None` if refused. Checks `deadline()`.
fn schedule_one(
    timer: &ShardedTimer,
    shared: &Arc<Shared>,
    when: When,
    behaviour: Behaviour,
    hostile: Hostile,
) -> Option<(TimerHandle, Arc<Record>)> {
    let before = Instant::now();
    let not_before = match when {
        When::After(delay) => shared.ns_after(before, delay),
        When::At(at) => shared.ns(at),
    };
    let record = Record::new(Kind::OneShot, not_before, 0);
    let (run_record, run_shared) = (record.clone(), shared.clone());
    let service = match behaviour {
        Behaviour::Schedule => Some(timer.clone()),
        _ => None,
    };
    let callback = move || {
        // Dropped last, after `_hostile` (which may schedule as it drops).
        let _in_callback = InCallback::enter(&run_shared);
        let _hostile = hostile;
        start_run(&run_shared, &run_record);
        match behaviour {
            Behaviour::Plain => {}
            Behaviour::Block(us) => {
                bump(Op::CallbackBlock);
                std::thread::sleep(Duration::from_micros(us));
            }
            Behaviour::Panic => {
                bump(Op::CallbackPanic);
                Shared::count(&run_shared.body_panics);
                deliberate("panic in a callback");
            }
            Behaviour::Schedule => {
                bump(Op::CallbackSchedule);
                if let Some(service) = &service {
                    let delay = Duration::from_micros(200);
                    drop(schedule_plain(service, &run_shared, delay));
                }
            }
        }
    };
    // The closure is dropped here on refusal: a panicking capture's panic is ours.
    let result = catch_unwind(AssertUnwindSafe(|| match when {
        When::After(delay) => timer.schedule(delay, callback),
        When::At(at) => timer.schedule_at(at, callback),
    }));
    let after = Instant::now();
    let result = match result {
        Ok(result) => result,
        Err(_) => {
            Shared::count(&shared.caught);
            Err(ScheduleError::Shutdown)
        }
    };
    shared.file(&record);
    match result {
        Ok(handle) => {
            let _ = record.id.set(handle.id());
            check_deadline(&handle, when, before, after);
            Some((handle, record))
        }
        Err(error) => {
            refused(&record, error);
            None
        }
    }
}

/// Marks a refused timer.
fn refused(record: &Record, error: ScheduleError) {
    bump(Op::Refused);
    Record::set(&record.refused);
    if record.runs() > 0 {
        violation(format!(
            "{} ran although schedule returned {error:?}",
            record.name()
        ));
    }
}

/// `deadline()` is the instant asked for.
fn check_deadline(handle: &TimerHandle, when: When, before: Instant, after: Instant) {
    let deadline = handle.deadline();
    match when {
        When::At(at) if deadline != at => violation(format!(
            "timer {}: schedule_at({at:?}) but deadline() = {deadline:?}",
            handle.id()
        )),
        When::After(delay) => {
            if let (Some(low), Some(high)) = (before.checked_add(delay), after.checked_add(delay)) {
                if delay < Duration::from_secs(365 * 86_400) && !(low..=high).contains(&deadline) {
                    violation(format!(
                        "timer {}: schedule({delay:?}) between {low:?} and {high:?}, but deadline() = {deadline:?}",
                        handle.id()
                    ));
                }
            }
        }
        When::At(_) => {}
    }
}

/// Schedules a repeating (`fixed_delay == false`) or fixed-delay timer of `period`.
fn schedule_repeating(
    timer: &ShardedTimer,
    shared: &Arc<Shared>,
    period: Duration,
    fixed_delay: bool,
    rng: &mut Rng,
) -> Option<(TimerHandle, Arc<Record>)> {
    let period = period.max(Duration::from_millis(1));
    let before = Instant::now();
    let kind = if fixed_delay {
        Kind::FixedDelay
    } else {
        Kind::Repeating
    };
    let record = Record::new(
        kind,
        shared.ns_after(before, period),
        period.as_nanos() as u64,
    );
    let (run_record, run_shared) = (record.clone(), shared.clone());
    let block = rng.chance(10).then(|| rng.range(100..=2_000));
    let panics = rng.chance(10);
    let hostile = if !panics && rng.chance(10) {
        bump(Op::PanickingCapture);
        Hostile::Panics(PanicOnDrop(shared.clone()))
    } else {
        Hostile::None
    };
    let dropped = DropFlag(record.clone());
    let callback = move || {
        let _hostile = &hostile;
        let _dropped = &dropped;
        let run = start_run(&run_shared, &run_record);
        Shared::count(&run_shared.repeating_runs);
        if let Some(us) = block {
            bump(Op::CallbackBlock);
            std::thread::sleep(Duration::from_micros(us));
        }
        end_run(&run_shared, &run_record);
        if panics && run.is_multiple_of(3) {
            bump(Op::CallbackPanic);
            Shared::count(&run_shared.body_panics);
            deliberate("panic in a repeating callback");
        }
    };
    let result = catch_unwind(AssertUnwindSafe(|| {
        if fixed_delay {
            timer.schedule_with_fixed_delay(period, callback)
        } else {
            timer.schedule_repeating(period, callback)
        }
    }));
    let result = result.unwrap_or_else(|_| {
        Shared::count(&shared.caught);
        Err(ScheduleError::Shutdown)
    });
    shared.file(&record);
    match result {
        Ok(handle) => {
            let _ = record.id.set(handle.id());
            bump(if fixed_delay {
                Op::FixedDelay
            } else {
                Op::Repeating
            });
            Some((handle, record))
        }
        Err(error) => {
            refused(&record, error);
            None
        }
    }
}

/// Cancels `handle` (of `record`), catching a panicking capture's panic; checks the
/// answer. Returns whether it won.
fn cancel(shared: &Shared, handle: &TimerHandle, record: &Record) -> bool {
    let won = match catch_unwind(AssertUnwindSafe(|| handle.cancel())) {
        Ok(won) => won,
        Err(_) => {
            // Only a winning cancel drops the callback.
            Shared::count(&shared.caught);
            true
        }
    };
    if won {
        bump(Op::CancelTrue);
        record.note_cancel_won();
        if record.kind == Kind::OneShot && record.runs() > 0 {
            violation(format!(
                "{}: cancel() returned true after it ran",
                record.name()
            ));
        }
        if record.kind != Kind::OneShot {
            Shared::count(&shared.repeating_cancelled);
        }
        if Record::get(&record.unfired) {
            violation(format!(
                "{}: cancel() returned true after shutdown handed it back",
                record.name()
            ));
        }
    } else {
        bump(Op::CancelFalse);
        if handle.state() == TimerState::Pending && !Record::get(&shared.shutting_down) {
            violation(format!(
                "{}: cancel() returned false but state() is Pending",
                record.name()
            ));
        }
    }
    won
}

/// A handle a load thread holds.
#[derive(Debug)]
struct Held {
    handle: TimerHandle,
    record: Arc<Record>,
    /// No hostile capture, one-shot: may be a `CancelOnDrop`'s victim.
    plain: bool,
}

/// One load thread, until `stop` (or the service refuses with `Shutdown`).
pub(super) fn load(timer: ShardedTimer, shared: Arc<Shared>, stop: Arc<AtomicBool>, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut held: Vec<Held> = Vec::new();
    let mut last_stats: Option<Stats> = None;
    let mut ops = 0u64;
    // ORDERING: Relaxed: a stop flag; the join orders the rest.
    while !stop.load(Ordering::Relaxed) {
        ops += 1;
        if ops.is_multiple_of(4) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let pick = rng.below(100);
        match pick {
            0..=44 => {
                let when = if pick < 30 {
                    bump(Op::Schedule);
                    When::After(rng.delay())
                } else {
                    bump(Op::ScheduleAt);
                    let now = Instant::now();
                    When::At(match rng.below(6) {
                        0 => now,
                        1 => now
                            .checked_sub(Duration::from_micros(rng.range(1..=20_000)))
                            .unwrap_or(now),
                        2 => now.checked_sub(Duration::from_secs(3_600)).unwrap_or(now),
                        3 => now + FAR + Duration::from_secs(rng.range(0..=3_600)),
                        _ => now + Duration::from_micros(rng.range(0..=40_000)),
                    })
                };
                let behaviour = match rng.below(20) {
                    0 => Behaviour::Block(rng.range(100..=2_000)),
                    1..=2 => Behaviour::Panic,
                    3..=4 => Behaviour::Schedule,
                    _ => Behaviour::Plain,
                };
                let hostile = match rng.below(20) {
                    0..=1 if behaviour != Behaviour::Panic => {
                        bump(Op::PanickingCapture);
                        Hostile::Panics(PanicOnDrop(shared.clone()))
                    }
                    2..=3 => {
                        bump(Op::SchedulingCapture);
                        Hostile::Schedules(ScheduleOnDrop(timer.clone(), shared.clone()))
                    }
                    4..=5 => match held.iter().rev().find(|h| h.plain) {
                        Some(victim) => {
                            bump(Op::CancellingCapture);
                            Hostile::Cancels(CancelOnDrop(
                                victim.handle.clone(),
                                victim.record.clone(),
                            ))
                        }
                        None => Hostile::None,
                    },
                    6 => {
                        bump(Op::ServiceCapture);
                        Hostile::Service(timer.clone())
                    }
                    _ => Hostile::None,
                };
                let plain = behaviour == Behaviour::Plain && matches!(hostile, Hostile::None);
                match schedule_one(&timer, &shared, when, behaviour, hostile) {
                    Some((handle, record)) => held.push(Held {
                        handle,
                        record,
                        plain,
                    }),
                    None if Record::get(&shared.shutting_down) => break,
                    None => {}
                }
            }
            45..=59 if !held.is_empty() => {
                let k = rng.below(held.len() as u64) as usize;
                let Held { handle, record, .. } = &held[k];
                cancel(&shared, handle, record);
            }
            60..=74 if !held.is_empty() => {
                let k = rng.below(held.len() as u64) as usize;
                let Held { handle, record, .. } = &held[k];
                reset(&shared, handle, record, &mut rng);
            }
            75..=80 => {
                let live = held
                    .iter()
                    .filter(|h| h.record.kind != Kind::OneShot && h.record.pending())
                    .count();
                if live < 6 {
                    let period = if rng.chance(15) {
                        FAR
                    } else {
                        Duration::from_micros(rng.range(500..=20_000))
                    };
                    if let Some((handle, record)) =
                        schedule_repeating(&timer, &shared, period, pick >= 78, &mut rng)
                    {
                        held.push(Held {
                            handle,
                            record,
                            plain: false,
                        });
                    }
                }
            }
            81 => {
                let at = Instant::now() + Duration::from_micros(rng.range(500..=5_000));
                for _ in 0..rng.range(16..=128) {
                    bump(Op::BurstTimer);
                    if schedule_one(
                        &timer,
                        &shared,
                        When::At(at),
                        Behaviour::Plain,
                        Hostile::None,
                    )
                    .is_none()
                    {
                        break;
                    }
                }
            }
            82..=89 if !held.is_empty() => {
                // Fire and forget; repeating timers are kept, to be cancelled.
                let k = rng.below(held.len() as u64) as usize;
                if held[k].record.kind == Kind::OneShot || !held[k].record.pending() {
                    bump(Op::DropHandle);
                    held.swap_remove(k);
                }
            }
            90..=92 => drop_anchor(&shared),
            93 => {
                bump(Op::StatsRead);
                let stats = timer.stats();
                if let Some(last) = &last_stats {
                    check_monotonic(last, &stats);
                }
                last_stats = Some(stats);
            }
            _ => {
                bump(Op::Schedule);
                let delay = Duration::from_micros(rng.range(0..=3_000));
                if let Some((handle, record)) = schedule_plain(&timer, &shared, delay) {
                    held.push(Held {
                        handle,
                        record,
                        plain: true,
                    });
                }
            }
        }
        if held.len() > 512 {
            // Keep the newest, and every live repeating timer.
            let mut k = 0;
            held.retain(|h| {
                k += 1;
                k > 256 || (h.record.kind != Kind::OneShot && h.record.pending())
            });
        }
    }
    // Cancel the repeating timers that would run for ever (far ones come back from
    // shutdown).
    for Held { handle, record, .. } in &held {
        if record.kind != Kind::OneShot && record.period_ns < FAR.as_nanos() as u64 {
            cancel(&shared, handle, record);
        }
    }
}

/// Resets `handle` earlier or later, keeping `not_before` at or before the deadline.
fn reset(shared: &Shared, handle: &TimerHandle, record: &Record, rng: &mut Rng) {
    let before = Instant::now();
    let at = rng.chance(30);
    let (new, want) = if at {
        let instant = before + Duration::from_micros(rng.range(0..=30_000));
        (shared.ns(instant), When::At(instant))
    } else {
        let delay = rng.delay();
        (shared.ns_after(before, delay), When::After(delay))
    };
    // ORDERING: Acquire/Release pair with the callback's Acquire load in `start_run`.
    let old = record.not_before.load(Ordering::Acquire);
    if record.kind == Kind::OneShot {
        record.not_before.store(old.min(new), Ordering::Release);
    }
    let won = match want {
        When::At(instant) => handle.reset_at(instant),
        When::After(delay) => handle.reset(delay),
    };
    let after = Instant::now();
    if !won {
        bump(Op::ResetFalse);
        return;
    }
    bump(Op::ResetTrue);
    if record.kind != Kind::OneShot {
        violation(format!(
            "{}: reset() returned true for a repeating timer",
            record.name()
        ));
        return;
    }
    // ORDERING: as above.
    record.not_before.store(new, Ordering::Release);
    if Record::get(&record.cancelled) || Record::get(&record.unfired) {
        violation(format!(
            "{}: reset() returned true after it was cancelled or handed back",
            record.name()
        ));
    }
    check_deadline(handle, want, before, after);
}
