//! Outside audit of rescue (`Builder::rescue_after`, `Callbacks::inline`) as seen from
//! an idle service: shards that have parked for a long time (with nothing due, or with
//! only far timers) get a timer due at once or in 1 ms whose inline callback blocks for
//! 300 ms, and during that stall another timer is filed into the stalled shard: from a
//! thread on that shard's core, through `reset` to an earlier deadline (from that core
//! and from the other), through `Sleep` futures, at a past instant. The watcher is
//! parked with nothing, parked with a long timeout, in a turn of its own, or stalls in
//! its turn. Written against the public docs only.
//!
//! Each round asserts what the docs promise: the timer filed during the stall fires
//! once, never early, and within `rescue_after` (rounded up to the tick) + 150 ms of its
//! deadline (the docs: noticed within 2 × `rescue_after`; 150 ms is for a slow, shared
//! machine); and a shard's inline callbacks never run two at a time unless one of the
//! running ones has run for `rescue_after` (a 200 µs allowance for the moment between
//! the shard taking a callback off its queue and the closure starting). Each scenario
//! runs three rounds on one service; a stall is 300 ms; every wait is bounded.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use sharded_timer::{Callbacks, ShardedTimer, Sleep, TimerHandle};
use support::wait_until;

/// Bound for anything that should happen within a round.
const WAIT: Duration = Duration::from_secs(5);
/// How long a blocking callback blocks.
const STALL: Duration = Duration::from_millis(300);
/// How long the shards park before a round's blocking timer.
const IDLE: Duration = Duration::from_millis(150);
/// Allowance for a slow, shared machine on top of the rescue delay.
const SLACK: Duration = Duration::from_millis(150);
/// Allowance, in the overlap check, for the gap between the shard taking a callback off
/// its queue (its last progress) and the closure starting.
const START_GAP: Duration = Duration::from_micros(200);
/// Delay of the timer filed into the stalled shard (where it is not due at once).
const VICTIM_DELAY: Duration = Duration::from_millis(5);
/// Rounds per scenario (`AUDIT_ROUNDS` overrides it, for longer hunts by hand).
fn rounds() -> usize {
    std::env::var("AUDIT_ROUNDS")
        .ok()
        .and_then(|rounds| rounds.parse().ok())
        .unwrap_or(3)
}

/// Usable cores.
fn cores() -> Vec<core_affinity::CoreId> {
    core_affinity::get_core_ids().unwrap_or_default()
}

/// Pins the calling thread to core `k`.
fn pin_to(k: usize) {
    let ids = cores();
    assert!(
        core_affinity::set_for_current(ids[k % ids.len()]),
        "pinned to {k}"
    );
}

/// The calling thread's name.
fn current_name() -> String {
    std::thread::current().name().unwrap_or("?").to_owned()
}

/// `rescue_after` as the service applies it: rounded up to whole ticks, at least one.
fn effective(rescue: Duration, tick: Duration) -> Duration {
    let ticks = rescue.as_nanos().div_ceil(tick.as_nanos()).max(1);
    tick * u32::try_from(ticks).unwrap()
}

/// Watches one shard's inline callbacks: each one wrapped in [`Probe::run`] records
/// when it starts, and a start beside a running one that has run less than
/// `rescue_after` is a violation of `Callbacks::inline`'s "never overlap".
struct Probe {
    rescue: Duration,
    next: AtomicUsize,
    running: Mutex<Vec<(usize, &'static str, Instant)>>,
    violations: Mutex<Vec<String>>,
}

impl Probe {
    fn new(rescue: Duration) -> Arc<Probe> {
        Arc::new(Probe {
            rescue,
            next: AtomicUsize::new(0),
            running: Mutex::default(),
            violations: Mutex::default(),
        })
    }

    fn run<R>(&self, name: &'static str, f: impl FnOnce() -> R) -> R {
        let id = self.next.fetch_add(1, SeqCst);
        {
            let mut running = self.running.lock().unwrap();
            let start = Instant::now();
            for (_, other, since) in running.iter() {
                let ran = start - *since;
                if ran + START_GAP < self.rescue {
                    self.violations.lock().unwrap().push(format!(
                        "{name} began on {} beside {other}, which had run {ran:?} \
                         (rescue_after {:?})",
                        current_name(),
                        self.rescue
                    ));
                }
            }
            running.push((id, name, start));
        }
        let value = f();
        self.running.lock().unwrap().retain(|entry| entry.0 != id);
        value
    }

    fn assert_clean(&self, what: &str) {
        let violations = self.violations.lock().unwrap();
        assert!(violations.is_empty(), "{what}: {violations:#?}");
    }
}

/// A blocking inline callback on the shard of the thread that scheduled it.
struct Blocker {
    started: Arc<OnceLock<(Instant, String)>>,
    ended: Arc<OnceLock<Instant>>,
    _handle: TimerHandle,
}

impl Blocker {
    /// Schedules, from the calling thread (so onto its core's shard), a callback due
    /// at `at` that blocks for `stall` (sleeping, or spinning when `spin`).
    fn schedule_at(
        timer: &ShardedTimer,
        probe: &Arc<Probe>,
        at: Instant,
        stall: Duration,
        spin: bool,
    ) -> Blocker {
        let started = Arc::new(OnceLock::new());
        let ended = Arc::new(OnceLock::new());
        let (started2, ended2, probe) = (started.clone(), ended.clone(), probe.clone());
        let handle = timer
            .schedule_at(at, move || {
                probe.run("blocker", || {
                    let began = Instant::now();
                    let _ = started2.set((began, current_name()));
                    if spin {
                        while began.elapsed() < stall {
                            std::hint::spin_loop();
                        }
                    } else {
                        std::thread::sleep(stall);
                    }
                    let _ = ended2.set(Instant::now());
                });
            })
            .expect("schedule the blocker");
        Blocker {
            started,
            ended,
            _handle: handle,
        }
    }

    /// Waits until it runs; returns when, and the thread it runs on.
    fn wait_started(&self) -> (Instant, String) {
        assert!(
            wait_until(WAIT, || self.started.get().is_some()),
            "the blocker ran"
        );
        self.started.get().unwrap().clone()
    }

    /// Waits until it returned; returns when.
    fn wait_ended(&self) -> Instant {
        assert!(
            wait_until(WAIT, || self.ended.get().is_some()),
            "the blocker returned"
        );
        *self.ended.get().unwrap()
    }
}

/// When a timer fired and the thread it ran on.
type Slot = Arc<OnceLock<(Instant, String)>>;

/// A callback that records when it ran (inside `probe`), and its slot.
fn recorder(probe: &Arc<Probe>) -> (impl FnOnce() + Send + 'static, Slot) {
    let slot: Slot = Arc::default();
    let (slot2, probe) = (slot.clone(), probe.clone());
    let callback = move || {
        probe.run("victim", || {
            let _ = slot2.set((Instant::now(), current_name()));
        });
    };
    (callback, slot)
}

/// Waits for `slot`; returns when it fired and on which thread.
fn wait_slot(slot: &Slot, what: &str) -> (Instant, String) {
    assert!(wait_until(WAIT, || slot.get().is_some()), "{what}: fired");
    slot.get().unwrap().clone()
}

/// Wakes a parked thread.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `sleep` on this thread until it completes (parking between polls); returns
/// when it completed.
fn wait_sleep(mut sleep: Pin<&mut Sleep>) -> Instant {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let limit = Instant::now() + WAIT;
    loop {
        if let Poll::Ready(()) = sleep.as_mut().poll(&mut context) {
            return Instant::now();
        }
        let now = Instant::now();
        assert!(now < limit, "the sleep completed within {WAIT:?}");
        std::thread::park_timeout(limit - now);
    }
}

/// How the timer of a round gets into the stalled shard during the stall.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Filing {
    /// `schedule(5 ms)` from a thread on the stalled shard's core.
    Schedule,
    /// `schedule(ZERO)` from that thread.
    DueAtOnce,
    /// `schedule_at` an instant 50 ms past, from that thread.
    PastInstant,
    /// A 10 s timer made by that thread before the idle park, `reset(5 ms)` from it.
    ResetEarlier,
    /// As `ResetEarlier`, but the reset comes from a thread on another core.
    ResetEarlierFromOtherCore,
    /// `sleep(5 ms)` made and awaited on that thread.
    Sleep,
    /// A 10 s `sleep` made by that thread before the idle park, `Sleep::reset` to
    /// 5 ms from now.
    SleepResetEarlier,
}

/// What the watcher (and every shard) is doing when the stall begins.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Watcher {
    /// Parked like the others.
    Parked,
    /// Running an inline callback of its own of this long, begun at the blocker's
    /// deadline.
    InATurn(Duration),
    /// A repeating timer fires on it every 2 ms throughout (a 100 µs callback).
    Ticking,
}

/// One scenario.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    shards: usize,
    tick: Duration,
    rescue: Duration,
    /// Each shard holds a 10 s timer while it parks.
    far_timers: bool,
    /// The blocker's delay, from the end of the idle park.
    blocker_delay: Duration,
    /// The blocker spins instead of sleeping.
    spin: bool,
    /// How long into the stall the timer is filed.
    file_after: Duration,
    filing: Filing,
    watcher: Watcher,
}

impl Scenario {
    fn new(shards: usize, tick_ms: u64, rescue_ms: u64) -> Scenario {
        Scenario {
            shards,
            tick: Duration::from_millis(tick_ms),
            rescue: Duration::from_millis(rescue_ms),
            far_timers: false,
            blocker_delay: Duration::ZERO,
            spin: false,
            file_after: Duration::from_millis(50),
            filing: Filing::Schedule,
            watcher: Watcher::Parked,
        }
    }

    fn rescue_effective(&self) -> Duration {
        effective(self.rescue, self.tick)
    }

    fn build(&self, name: &str) -> ShardedTimer {
        ShardedTimer::builder()
            .shards(self.shards)
            .tick(self.tick)
            .callbacks(Callbacks::inline())
            .rescue_after(Some(self.rescue))
            .thread_name(name)
            .build()
            .expect("build")
    }
}

/// What one round saw of the timer filed during the stall.
#[derive(Debug)]
struct Round {
    deadline: Instant,
    fired: Instant,
    fired_on: String,
    blocker_on: String,
    blocker_due: Instant,
    stall_began: Instant,
    stall_ended: Instant,
}

/// Runs `scenario` for [`ROUNDS`] rounds on one service and checks each.
fn run_scenario(name: &str, scenario: Scenario) {
    if cores().len() < 2 {
        eprintln!("skipped: fewer than 2 cores");
        return;
    }
    let timer = scenario.build(name);
    let probe = Probe::new(scenario.rescue_effective());
    for round in 0..rounds() {
        let seen = one_round(&timer, &probe, &scenario);
        let what = format!(
            "{name} round {round}: {scenario:?}: fired on {}, {:?} into the stall \
             (which ended {:?} in): {seen:?}",
            seen.fired_on,
            seen.fired.saturating_duration_since(seen.stall_began),
            seen.stall_ended.saturating_duration_since(seen.stall_began),
        );
        // The blocker ran on shard 0 (thread `{name}-s0`): where core 0's timers go;
        // or another shard rescued it, which it may do only once shard 0 overslept
        // its wake-up by `rescue_after` (a loaded machine).
        assert!(
            seen.blocker_on.ends_with("-s0")
                || seen.stall_began + START_GAP >= seen.blocker_due + scenario.rescue_effective(),
            "{what}: the blocker was rescued {:?} after its deadline",
            seen.stall_began.saturating_duration_since(seen.blocker_due)
        );
        assert!(seen.fired >= seen.deadline, "{what}: fired early");
        let late = seen.fired - seen.deadline;
        let bound = scenario.rescue_effective() + SLACK;
        // With one shard there is nobody to rescue it: it waits for the stall.
        if scenario.shards == 1 {
            assert!(
                seen.fired >= seen.stall_ended,
                "{what}: a lone shard's timer ran beside its blocker"
            );
        } else {
            assert!(
                late < bound,
                "{what}: fired {late:?} late (bound {bound:?}; stall {STALL:?})"
            );
        }
        probe.assert_clean(&what);
    }
    assert!(timer.shutdown().is_empty(), "{name}: nothing left pending");
}

/// One round: the shards park for [`IDLE`], then a thread on core 0 stalls shard 0 and
/// files the round's timer into it.
fn one_round(timer: &ShardedTimer, probe: &Arc<Probe>, scenario: &Scenario) -> Round {
    let scenario = *scenario;
    std::thread::scope(|scope| {
        // The watcher's side, on core 1: far timer, a ticking timer, or a turn.
        let watcher_far = scenario.far_timers.then(|| {
            scope
                .spawn(|| {
                    pin_to(1);
                    timer.schedule(Duration::from_secs(10), || {}).unwrap()
                })
                .join()
                .unwrap()
        });
        let ticking = (scenario.watcher == Watcher::Ticking).then(|| {
            scope
                .spawn(|| {
                    pin_to(1);
                    timer
                        .schedule_repeating(Duration::from_millis(2), || {
                            let began = Instant::now();
                            while began.elapsed() < Duration::from_micros(100) {
                                std::hint::spin_loop();
                            }
                        })
                        .unwrap()
                })
                .join()
                .unwrap()
        });
        let round = scope
            .spawn(|| {
                pin_to(0);
                let far = scenario
                    .far_timers
                    .then(|| timer.schedule(Duration::from_secs(10), || {}).unwrap());
                // Made before the park, so the shard parks with them.
                let (reset_victim, reset_slot) = {
                    let (callback, slot) = recorder(probe);
                    let handle = matches!(
                        scenario.filing,
                        Filing::ResetEarlier | Filing::ResetEarlierFromOtherCore
                    )
                    .then(|| timer.schedule(Duration::from_secs(10), callback).unwrap());
                    (handle, slot)
                };
                let mut sleep = (scenario.filing == Filing::SleepResetEarlier)
                    .then(|| Box::pin(timer.sleep(Duration::from_secs(10))));
                if let Some(sleep) = sleep.as_mut() {
                    // Registered, pending.
                    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
                    assert!(sleep
                        .as_mut()
                        .poll(&mut Context::from_waker(&waker))
                        .is_pending());
                }
                std::thread::sleep(IDLE);
                let at = Instant::now() + scenario.blocker_delay;
                if let Watcher::InATurn(busy) = scenario.watcher {
                    std::thread::scope(|inner| {
                        inner.spawn(|| {
                            pin_to(1);
                            timer
                                .schedule_at(at, move || std::thread::sleep(busy))
                                .unwrap();
                        });
                    });
                }
                let blocker = Blocker::schedule_at(timer, probe, at, STALL, scenario.spin);
                let (stall_began, blocker_on) = blocker.wait_started();
                std::thread::sleep(scenario.file_after);
                let (deadline, fired, fired_on) = match scenario.filing {
                    Filing::Schedule | Filing::DueAtOnce => {
                        let (callback, slot) = recorder(probe);
                        let delay = if scenario.filing == Filing::Schedule {
                            VICTIM_DELAY
                        } else {
                            Duration::ZERO
                        };
                        let handle = timer.schedule(delay, callback).unwrap();
                        let (fired, on) = wait_slot(&slot, "the timer");
                        (handle.deadline(), fired, on)
                    }
                    Filing::PastInstant => {
                        let (callback, slot) = recorder(probe);
                        let past = Instant::now() - Duration::from_millis(50);
                        let handle = timer.schedule_at(past, callback).unwrap();
                        let (fired, on) = wait_slot(&slot, "the timer");
                        (handle.deadline(), fired, on)
                    }
                    Filing::ResetEarlier => {
                        let handle = reset_victim.as_ref().unwrap();
                        assert!(handle.reset(VICTIM_DELAY));
                        let (fired, on) = wait_slot(&reset_slot, "the reset timer");
                        (handle.deadline(), fired, on)
                    }
                    Filing::ResetEarlierFromOtherCore => {
                        let handle = reset_victim.as_ref().unwrap();
                        std::thread::scope(|inner| {
                            inner.spawn(|| {
                                pin_to(1);
                                assert!(handle.reset(VICTIM_DELAY));
                            });
                        });
                        let (fired, on) = wait_slot(&reset_slot, "the reset timer");
                        (handle.deadline(), fired, on)
                    }
                    Filing::Sleep => {
                        let mut sleep = Box::pin(timer.sleep(VICTIM_DELAY));
                        let deadline = sleep.deadline().into_std();
                        let fired = wait_sleep(sleep.as_mut());
                        (deadline, fired, current_name())
                    }
                    Filing::SleepResetEarlier => {
                        let sleep = sleep.as_mut().unwrap();
                        sleep.as_mut().reset((Instant::now() + VICTIM_DELAY).into());
                        let deadline = sleep.deadline().into_std();
                        let fired = wait_sleep(sleep.as_mut());
                        (deadline, fired, current_name())
                    }
                };
                let stall_ended = blocker.wait_ended();
                if let Some(far) = far {
                    assert!(far.cancel());
                }
                Round {
                    deadline,
                    fired,
                    fired_on,
                    blocker_on,
                    blocker_due: at,
                    stall_began,
                    stall_ended,
                }
            })
            .join()
            .unwrap();
        if let Some(far) = watcher_far {
            assert!(far.cancel());
        }
        if let Some(ticking) = ticking {
            assert!(ticking.cancel());
        }
        // The stall is over before the next round's idle park begins.
        std::thread::sleep(Duration::from_millis(20));
        round
    })
}

// ---------------------------------------------------------------------------------
// Idle shards, then a stall; the timer filed from the stalled shard's core.
// ---------------------------------------------------------------------------------

#[test]
fn empty_idle_then_1ms_blocker_rescue_1ms_tick_1ms_schedule_is_rescued() {
    let mut s = Scenario::new(2, 1, 1);
    s.blocker_delay = Duration::from_millis(1);
    run_scenario("ari-a", s);
}

#[test]
fn far_timers_idle_then_blocker_due_at_once_rescue_20ms_schedule_is_rescued() {
    let mut s = Scenario::new(2, 1, 20);
    s.far_timers = true;
    run_scenario("ari-b", s);
}

#[test]
fn far_timers_idle_then_1ms_blocker_tick_10ms_rescue_1ms_is_rescued() {
    let mut s = Scenario::new(2, 10, 1);
    s.far_timers = true;
    s.blocker_delay = Duration::from_millis(1);
    run_scenario("ari-c", s);
}

#[test]
fn tick_10ms_rescue_20ms_spinning_blocker_schedule_is_rescued() {
    let mut s = Scenario::new(2, 10, 20);
    s.spin = true;
    s.blocker_delay = Duration::from_millis(1);
    run_scenario("ari-d", s);
}

#[test]
fn timer_due_at_once_filed_as_the_stall_begins_waits_rescue_after_and_is_rescued() {
    // Filed right after the blocker started: the overlap check bites here.
    let mut s = Scenario::new(2, 1, 4);
    s.file_after = Duration::ZERO;
    s.filing = Filing::DueAtOnce;
    run_scenario("ari-e", s);
}

#[test]
fn timer_due_at_once_filed_as_the_stall_begins_with_rescue_1ms_does_not_overlap_early() {
    let mut s = Scenario::new(2, 1, 1);
    s.far_timers = true;
    s.file_after = Duration::ZERO;
    s.filing = Filing::DueAtOnce;
    run_scenario("ari-f", s);
}

#[test]
fn past_instant_filed_during_a_stall_after_far_timer_idle_is_rescued() {
    let mut s = Scenario::new(2, 10, 20);
    s.far_timers = true;
    s.filing = Filing::PastInstant;
    run_scenario("ari-g", s);
}

// ---------------------------------------------------------------------------------
// Reset to an earlier deadline, from the stalled shard's core and from another.
// ---------------------------------------------------------------------------------

#[test]
fn far_timer_reset_earlier_during_a_stall_is_rescued() {
    let mut s = Scenario::new(2, 1, 4);
    s.filing = Filing::ResetEarlier;
    s.blocker_delay = Duration::from_millis(1);
    run_scenario("ari-h", s);
}

#[test]
fn far_timer_reset_earlier_from_another_core_during_a_stall_is_rescued() {
    let mut s = Scenario::new(2, 1, 20);
    s.filing = Filing::ResetEarlierFromOtherCore;
    run_scenario("ari-i", s);
}

#[test]
fn far_timer_reset_earlier_from_another_core_tick_10ms_rescue_1ms_is_rescued() {
    let mut s = Scenario::new(2, 10, 1);
    s.far_timers = true;
    s.filing = Filing::ResetEarlierFromOtherCore;
    s.blocker_delay = Duration::from_millis(1);
    run_scenario("ari-j", s);
}

// ---------------------------------------------------------------------------------
// Sleep futures.
// ---------------------------------------------------------------------------------

#[test]
fn sleep_made_during_a_stall_completes_on_time() {
    let mut s = Scenario::new(2, 1, 4);
    s.filing = Filing::Sleep;
    s.far_timers = true;
    run_scenario("ari-k", s);
}

#[test]
fn far_sleep_reset_earlier_during_a_stall_completes_on_time() {
    let mut s = Scenario::new(2, 1, 20);
    s.filing = Filing::SleepResetEarlier;
    s.blocker_delay = Duration::from_millis(1);
    run_scenario("ari-l", s);
}

#[test]
fn far_sleep_reset_earlier_tick_10ms_rescue_1ms_completes_on_time() {
    let mut s = Scenario::new(2, 10, 1);
    s.filing = Filing::SleepResetEarlier;
    run_scenario("ari-m", s);
}

// ---------------------------------------------------------------------------------
// What the watcher is doing when the stall begins; 1 and 4 shards.
// ---------------------------------------------------------------------------------

#[test]
fn stall_beginning_while_the_watcher_runs_a_30ms_callback_is_rescued() {
    let mut s = Scenario::new(2, 1, 4);
    s.blocker_delay = Duration::from_millis(20);
    s.watcher = Watcher::InATurn(Duration::from_millis(30));
    run_scenario("ari-n", s);
}

#[test]
fn stall_beginning_while_the_watcher_parks_on_a_far_timer_is_rescued_after_reset() {
    let mut s = Scenario::new(2, 10, 20);
    s.far_timers = true;
    s.filing = Filing::ResetEarlier;
    s.blocker_delay = Duration::from_millis(1);
    run_scenario("ari-o", s);
}

#[test]
fn stall_while_the_watcher_fires_a_2ms_repeating_timer_is_rescued() {
    let mut s = Scenario::new(2, 1, 4);
    s.watcher = Watcher::Ticking;
    s.filing = Filing::Sleep;
    run_scenario("ari-p", s);
}

#[test]
fn four_shards_idle_then_stall_schedule_is_rescued() {
    let mut s = Scenario::new(4, 1, 4);
    s.blocker_delay = Duration::from_millis(1);
    run_scenario("ari-q", s);
}

#[test]
fn four_shards_far_timers_tick_10ms_rescue_1ms_reset_from_other_core_is_rescued() {
    let mut s = Scenario::new(4, 10, 1);
    s.far_timers = true;
    s.filing = Filing::ResetEarlierFromOtherCore;
    run_scenario("ari-r", s);
}

#[test]
fn four_shards_due_at_once_as_the_stall_begins_does_not_overlap_early() {
    let mut s = Scenario::new(4, 1, 20);
    s.file_after = Duration::ZERO;
    s.filing = Filing::DueAtOnce;
    run_scenario("ari-s", s);
}

#[test]
fn one_shard_waits_for_its_stall_and_never_overlaps() {
    let mut s = Scenario::new(1, 1, 4);
    s.far_timers = true;
    s.file_after = Duration::ZERO;
    s.filing = Filing::DueAtOnce;
    run_scenario("ari-t", s);
}

// ---------------------------------------------------------------------------------
// Both shards stall, in turn and overlapping.
// ---------------------------------------------------------------------------------

/// Shard 0 stalls (a 300 ms blocker due 1 ms after an idle park); `offset` after it
/// began, shard 1 stalls likewise. 50 ms into each stall, a thread on that shard's
/// core schedules a 5 ms timer onto it. Each fires never early and within
/// `rescue_after` + 150 ms of its deadline, or, for shard 1's while shard 0 (its
/// rescuer) is still stalled, of the end of shard 0's stall.
fn both_shards_stall(name: &str, tick_ms: u64, rescue_ms: u64, offset: Duration) {
    if cores().len() < 2 {
        return;
    }
    let scenario = Scenario::new(2, tick_ms, rescue_ms);
    let timer = scenario.build(name);
    let bound = scenario.rescue_effective() + SLACK;
    let probes = [
        Probe::new(scenario.rescue_effective()),
        Probe::new(scenario.rescue_effective()),
    ];
    for round in 0..rounds() {
        std::thread::sleep(IDLE);
        let stall0 = Arc::new(OnceLock::<(Instant, Instant)>::new());
        let seen: Vec<(usize, Instant, Instant, String)> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..2)
                .map(|k| {
                    let (timer, probe, stall0) = (&timer, &probes[k], stall0.clone());
                    scope.spawn(move || {
                        pin_to(k);
                        if k == 1 {
                            // Begins `offset` after shard 0's stall did.
                            assert!(wait_until(WAIT, || stall0.get().is_some()));
                            let began = stall0.get().unwrap().0;
                            let now = Instant::now();
                            if began + offset > now {
                                std::thread::sleep(began + offset - now);
                            }
                        }
                        let at = Instant::now() + Duration::from_millis(1);
                        let blocker = Blocker::schedule_at(timer, probe, at, STALL, false);
                        let (began, on) = blocker.wait_started();
                        assert!(on.ends_with(&format!("-s{k}")), "blocker {k} on {on}");
                        std::thread::sleep(Duration::from_millis(50));
                        if k == 0 {
                            let _ = stall0.set((began, began + STALL));
                        }
                        let (callback, slot) = recorder(probe);
                        let handle = timer.schedule(VICTIM_DELAY, callback).unwrap();
                        let (fired, fired_on) = wait_slot(&slot, "the timer");
                        let ended = blocker.wait_ended();
                        if k == 0 {
                            // The real end, for shard 1's bound.
                            let _ = stall0.set((began, ended));
                        }
                        (
                            k,
                            handle.deadline(),
                            fired,
                            format!("{fired_on}; ended {ended:?}"),
                        )
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let (_, stall0_end) = *stall0.get().unwrap();
        for (k, deadline, fired, on) in seen {
            let what = format!("{name} round {round}: shard {k}'s timer (ran on {on})");
            assert!(fired >= deadline, "{what}: fired early");
            let from = if k == 1 {
                deadline.max(stall0_end)
            } else {
                deadline
            };
            let late = fired.saturating_duration_since(from);
            assert!(late < bound, "{what}: {late:?} late (bound {bound:?})");
            probes[k].assert_clean(&what);
        }
    }
    assert!(timer.shutdown().is_empty());
}

#[test]
fn both_shards_stalling_in_turn_are_each_rescued() {
    // Shard 1 stalls 20 ms after shard 0's stall ended.
    both_shards_stall("ari-u", 1, 4, STALL + Duration::from_millis(20));
}

#[test]
fn both_shards_stalling_in_turn_tick_10ms_rescue_20ms_are_each_rescued() {
    both_shards_stall("ari-v", 10, 20, STALL + Duration::from_millis(5));
}

#[test]
fn shard_stalling_while_its_rescuer_is_stalled_is_rescued_when_the_rescuer_returns() {
    // Shard 1 stalls 200 ms into shard 0's stall: shard 0's timer (filed 50 ms in) is
    // rescued by shard 1 before that; shard 1's, by shard 0 once its stall ends.
    both_shards_stall("ari-w", 1, 4, Duration::from_millis(200));
}

// ---------------------------------------------------------------------------------
// The stuck thread returns while its rescuer runs one of its callbacks.
// ---------------------------------------------------------------------------------

/// Rescue after 20 ms. Shard 0's blocker (due 1 ms after an idle park) blocks until
/// released; 50 ms in, a thread on core 0 schedules A (5 ms) and B (7 ms) onto shard
/// 0. A, rescued, releases the blocker and then runs 15 ms (less than
/// `rescue_after`). Shard 0's thread carries on meanwhile; B comes due 2 ms after A.
/// Whoever runs B must not start it beside A, which has not run for `rescue_after`.
#[test]
fn a_stuck_shard_returning_does_not_run_its_next_callback_beside_a_rescued_one() {
    if cores().len() < 2 {
        return;
    }
    let scenario = Scenario::new(2, 1, 20);
    let timer = scenario.build("ari-x");
    let probe = Probe::new(scenario.rescue_effective());
    for round in 0..rounds() {
        std::thread::sleep(IDLE);
        let what = format!("ari-x round {round}");
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    pin_to(0);
                    let release = Arc::new(AtomicBool::new(false));
                    let (began, ended) = (Arc::new(OnceLock::new()), Arc::new(OnceLock::new()));
                    let (release2, began2, ended2, probe2) =
                        (release.clone(), began.clone(), ended.clone(), probe.clone());
                    let _blocker = timer
                        .schedule(Duration::from_millis(1), move || {
                            probe2.run("blocker", || {
                                let _ = began2.set(Instant::now());
                                let start = Instant::now();
                                while !release2.load(SeqCst) && start.elapsed() < STALL {
                                    std::thread::sleep(Duration::from_micros(200));
                                }
                                let _ = ended2.set(Instant::now());
                            });
                        })
                        .unwrap();
                    assert!(
                        wait_until(WAIT, || began.get().is_some()),
                        "{what}: blocked"
                    );
                    std::thread::sleep(Duration::from_millis(50));
                    let a_slot: Slot = Arc::default();
                    let (a_slot2, release2, probe2) =
                        (a_slot.clone(), release.clone(), probe.clone());
                    let a = timer
                        .schedule(VICTIM_DELAY, move || {
                            probe2.run("A", || {
                                let _ = a_slot2.set((Instant::now(), current_name()));
                                release2.store(true, SeqCst);
                                std::thread::sleep(Duration::from_millis(15));
                            });
                        })
                        .unwrap();
                    let (b_callback, b_slot) = recorder(&probe);
                    let b = timer
                        .schedule_at(a.deadline() + Duration::from_millis(2), b_callback)
                        .unwrap();
                    let (a_at, a_on) = wait_slot(&a_slot, "A");
                    let (b_at, b_on) = wait_slot(&b_slot, "B");
                    assert!(
                        wait_until(WAIT, || ended.get().is_some()),
                        "{what}: returned"
                    );
                    let what = format!(
                        "{what}: A on {a_on} late {:?}, B on {b_on} late {:?}",
                        a_at - a.deadline(),
                        b_at - b.deadline()
                    );
                    assert!(
                        a_at >= a.deadline() && b_at >= b.deadline(),
                        "{what}: early"
                    );
                    let bound = scenario.rescue_effective() + SLACK;
                    assert!(a_at - a.deadline() < bound, "{what}: A late");
                    // B waits at most for A (15 ms) and rescue.
                    assert!(
                        b_at - b.deadline() < bound + Duration::from_millis(15),
                        "{what}: B late"
                    );
                    probe.assert_clean(&what);
                })
                .join()
                .unwrap();
        });
    }
    assert!(timer.shutdown().is_empty());
}

// ---------------------------------------------------------------------------------
// When a stuck shard is judged stuck: from the instant of its last progress, or from
// the tick in which the watcher saw it?
// ---------------------------------------------------------------------------------

/// Tick 10 ms, rescue after 10 ms (one tick). After an idle park, shard 0 gets P
/// (runs 5 ms), then B (blocks 150 ms), both due at D, and V due one tick after D;
/// shard 1, its watcher, gets W (runs 7 ms) due at D, so the watcher looks at shard 0
/// in the middle of D's tick, after B began. B has made no progress since it began,
/// 5 ms into the tick: the docs say it is noticed between 10 and 20 ms after that,
/// and V, which comes due in the meantime, may start beside B only once B has run
/// 10 ms. Returns how long B had run when V started (`Duration::MAX` if V ran
/// after B returned); the probe records any overlap.
fn rescue_beside_a_blocker_begun_mid_tick(timer: &ShardedTimer, probe: &Arc<Probe>) -> Duration {
    std::thread::sleep(IDLE);
    let d = Instant::now() + Duration::from_millis(30);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            pin_to(1);
            timer
                .schedule_at(d, || std::thread::sleep(Duration::from_millis(7)))
                .unwrap();
        });
        scope
            .spawn(|| {
                pin_to(0);
                let probe2 = probe.clone();
                let _p = timer
                    .schedule_at(d, move || {
                        probe2.run("P", || std::thread::sleep(Duration::from_millis(5)));
                    })
                    .unwrap();
                let blocker =
                    Blocker::schedule_at(timer, probe, d, Duration::from_millis(150), false);
                let (callback, slot) = recorder(probe);
                let v = timer
                    .schedule_at(d + Duration::from_millis(10), callback)
                    .unwrap();
                let (began, _) = blocker.wait_started();
                let (fired, on) = wait_slot(&slot, "V");
                let ended = blocker.wait_ended();
                assert!(fired >= v.deadline(), "V fired early");
                let late = fired - v.deadline();
                assert!(
                    late < Duration::from_millis(10) + SLACK,
                    "V {late:?} late on {on}"
                );
                if fired < ended {
                    fired.saturating_duration_since(began)
                } else {
                    Duration::MAX
                }
            })
            .join()
            .unwrap()
    })
}

#[test]
fn a_rescued_callback_never_starts_beside_one_that_has_run_less_than_rescue_after() {
    if cores().len() < 2 {
        return;
    }
    let scenario = Scenario::new(2, 10, 10);
    let timer = scenario.build("ari-y");
    let probe = Probe::new(scenario.rescue_effective());
    let ran: Vec<Duration> = (0..rounds())
        .map(|_| rescue_beside_a_blocker_begun_mid_tick(&timer, &probe))
        .collect();
    assert!(timer.shutdown().is_empty());
    let violations = probe.violations.lock().unwrap().clone();
    assert!(
        violations.is_empty(),
        "B had run {ran:?} when V began beside it (MAX: V ran after B); {violations:#?}"
    );
}
