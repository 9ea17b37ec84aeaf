//! Outside audit of "lists grow on the shard's thread" (src/shard/direct.rs, ground
//! rules; `ShardCore::has_room_for`): a producer whose timer (or earlier reset's move)
//! would land in a wheel list with no free place does not file it itself, even with
//! the shard's token free; the timer or message goes by the shard's ring and the
//! shard files it later. Levels 0 and 1 start with 64 places per slot, level 2 and up
//! with none, so the first timer of every far list, and every one that arrives while
//! a list is full, takes the ring path.
//!
//! Written against the public API and the documented guarantees only (README,
//! crate docs): never early, exactly once, nothing lost, `stats()` exact at
//! quiescence, `max_pending` room, shutdown's `Unfired`s. Every wait is bounded.
//!
//! Under a `ManualClock` a service's wheel ticks are 1 ns long (`Clock::manual`), so
//! level 2 starts 4,096 ns away, level 3 at 262,144 ns, level 4 at 16.8 ms, level 5
//! at 1.07 s, level 6 at 68.7 s: nearly every timer of a manual-clock test lands in a
//! list that starts with no place, which makes the manual clock the sharpest tool
//! here, and deterministic: after `advance` returns, exactly the timers due by the new
//! now have fired.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sharded_timer::{
    Callback, Callbacks, ManualClock, Routing, ScheduleError, ShardedTimer, TimerHandle, TimerId,
    TimerState,
};

mod support;
use support::{
    in_rings_shown, joined_within, thread_sleeps as shard_thread_sleeps, wait_until, WAIT,
};

/// Deadlines (ns) and the probes of the timers filed with them, from several threads.
type SharedDeadlines = Arc<Mutex<Vec<(u64, Arc<Probe>)>>>;

/// xorshift64*: a small deterministic generator.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Nanoseconds of `clock` since `start`.
fn ns_since(clock: &ManualClock, start: Instant) -> u64 {
    u64::try_from(clock.now().duration_since(start).as_nanos()).unwrap()
}

/// The wheel's level spans under a manual clock (1 ns ticks): level `l` slots are
/// `64^l` ticks wide.
fn span(level: u32) -> u64 {
    64u64.pow(level)
}

/// What one timer's callback records.
#[derive(Default)]
struct Probe {
    /// Times the callback ran.
    runs: AtomicUsize,
    /// The manual clock's now (ns since start) when it last ran.
    at_ns: AtomicU64,
}

/// Where callbacks run, for a configuration.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Pool,
    Inline,
    /// `Callbacks::spawn` with a spawner that runs the `Callback` at once, on the shard
    /// thread (so `advance` returning means it ran).
    SpawnRunNow,
}

fn callbacks(mode: Mode) -> Callbacks {
    match mode {
        Mode::Pool => Callbacks::pool(2),
        Mode::Inline => Callbacks::inline(),
        Mode::SpawnRunNow => Callbacks::spawn(|callback: Callback| callback.run()),
    }
}

/// A model timer: its handle and what the model says of it.
struct Tracked {
    handle: TimerHandle,
    probe: Arc<Probe>,
    /// `Some(deadline ns)` while pending in the model.
    pending: Option<u64>,
    /// Whether it fired in the model.
    fired: bool,
    /// Whether a cancel of ours returned true.
    cancelled: bool,
}

/// A deadline (ns since start, after `now`) in a place the change cares about: just
/// before, at or after a boundary of level 2..=6 relative to `now` (so it lands in a
/// level-2+ list, which starts with no place), one of the round's hot deadlines (many
/// timers in one list: it fills and grows again and again), or anywhere up to 2 s.
fn interesting_deadline(rng: &mut Rng, now: u64, hot: &[u64]) -> u64 {
    let pick = rng.below(10);
    let d = if pick < 4 {
        let level = 2 + rng.below(5) as u32;
        let width = span(level);
        let boundary = (now / width + 1 + rng.below(3)) * width;
        let offset = rng.below(7) as i64 - 3;
        boundary.saturating_add_signed(offset)
    } else if pick < 7 && !hot.is_empty() {
        hot[rng.below(hot.len() as u64) as usize]
    } else {
        now + 1 + rng.below(2_000_000_000)
    };
    d.max(now + 1)
}

/// A deadline earlier than `old` and after `now` (`old > now + 1`), preferring the
/// interesting places.
fn earlier_deadline(rng: &mut Rng, now: u64, old: u64, hot: &[u64]) -> Option<u64> {
    if old <= now + 1 {
        return None;
    }
    for _ in 0..4 {
        let d = interesting_deadline(rng, now, hot);
        if d < old {
            return Some(d);
        }
    }
    Some(now + 1 + rng.below(old - now - 1))
}

/// One thread's share of the model's timers, with its generator.
struct Share {
    rng: Rng,
    timers: Vec<Tracked>,
    scheduled: u64,
}

/// One operation phase of one thread: `ops` random operations on its own timers,
/// every answer checked against the model. The clock stands still meanwhile and
/// every deadline is after now, so nothing fires: the model is exact.
fn operate(
    share: &mut Share,
    timer: &ShardedTimer,
    clock: &ManualClock,
    start: Instant,
    hot: &[u64],
    ops: usize,
) {
    let now = ns_since(clock, start);
    for _ in 0..ops {
        let live: Vec<usize> = (0..share.timers.len())
            .filter(|&k| share.timers[k].pending.is_some())
            .collect();
        let op = share.rng.below(100);
        if op < 40 || live.is_empty() {
            let d = interesting_deadline(&mut share.rng, now, hot);
            let probe = Arc::new(Probe::default());
            let p = probe.clone();
            let c = clock.clone();
            let handle = timer
                .schedule_at(start + Duration::from_nanos(d), move || {
                    p.at_ns.store(ns_since(&c, start), SeqCst);
                    p.runs.fetch_add(1, SeqCst);
                })
                .expect("schedule on a running service");
            assert_eq!(handle.deadline(), start + Duration::from_nanos(d));
            share.scheduled += 1;
            share.timers.push(Tracked {
                handle,
                probe,
                pending: Some(d),
                fired: false,
                cancelled: false,
            });
            continue;
        }
        let k = live[share.rng.below(live.len() as u64) as usize];
        let t = &mut share.timers[k];
        let old = t.pending.unwrap();
        if op < 55 {
            assert!(t.handle.cancel(), "cancel of a pending timer returns true");
            assert!(!t.handle.cancel(), "a second cancel returns false");
            assert_eq!(t.handle.state(), TimerState::Cancelled);
            t.pending = None;
            t.cancelled = true;
        } else if op < 85 {
            // Earlier: a move message, by the ring if the new list has no room.
            if let Some(d) = earlier_deadline(&mut share.rng, now, old, hot) {
                assert!(t.handle.reset_at(start + Duration::from_nanos(d)));
                assert_eq!(t.handle.deadline(), start + Duration::from_nanos(d));
                t.pending = Some(d);
            }
        } else {
            // Later: one store; the shard re-files it when the old slot comes due.
            let d = old + 1 + share.rng.below(300_000_000);
            let d = if share.rng.chance(50) && !hot.is_empty() {
                hot.iter().copied().find(|&h| h > old).unwrap_or(d)
            } else {
                d
            };
            assert!(t.handle.reset_at(start + Duration::from_nanos(d)));
            t.pending = Some(d);
        }
        assert_eq!(t.handle.state(), t_state(t));
    }
}

fn t_state(t: &Tracked) -> TimerState {
    if t.cancelled {
        TimerState::Cancelled
    } else if t.fired {
        TimerState::Fired
    } else {
        TimerState::Pending
    }
}

/// After an advance to `now`: exactly the timers due by `now` have run, once each,
/// none before its deadline, none cancelled.
fn check(shares: &mut [Share], now: u64, context: &str) {
    for share in shares.iter_mut() {
        for t in &mut share.timers {
            let runs = t.probe.runs.load(SeqCst);
            match t.pending {
                Some(d) if d <= now => {
                    assert_eq!(
                        runs,
                        1,
                        "{context}: timer {:?} due at {d} ns not run exactly once by now {now} ns",
                        t.handle.id()
                    );
                    let at = t.probe.at_ns.load(SeqCst);
                    assert!(
                        at >= d,
                        "{context}: {:?} ran early: {at} < {d}",
                        t.handle.id()
                    );
                    assert_eq!(t.handle.state(), TimerState::Fired, "{context}");
                    t.pending = None;
                    t.fired = true;
                }
                Some(d) => assert_eq!(
                    runs,
                    0,
                    "{context}: timer {:?} due at {d} ns ran early (now {now} ns)",
                    t.handle.id()
                ),
                None if t.fired => assert_eq!(runs, 1, "{context}: ran twice"),
                None => assert_eq!(runs, 0, "{context}: a cancelled timer ran"),
            }
        }
    }
}

/// The earliest pending deadline of the model.
fn earliest(shares: &[Share]) -> Option<u64> {
    shares
        .iter()
        .flat_map(|s| s.timers.iter().filter_map(|t| t.pending))
        .min()
}

/// A model run on a manual clock: rounds of concurrent operations (threads on
/// disjoint timers), then an advance to an instant the change cares about (the
/// earliest deadline, one ns before it, a level boundary, or a random step), then
/// the exact check. Ends by firing everything and checking `stats()` and shutdown.
fn model_run(
    seed: u64,
    shards: usize,
    mode: Mode,
    routing: Routing,
    ring_capacity: usize,
    threads: usize,
) {
    let clock = ManualClock::new();
    let start = clock.now();
    let timer = ShardedTimer::builder()
        .shards(shards)
        .callbacks(callbacks(mode))
        .routing(routing)
        .ring_capacity(ring_capacity)
        .clock(clock.clone())
        .thread_name("lg")
        .build()
        .unwrap();
    let mut rng = Rng::new(seed);
    let mut shares: Vec<Share> = (0..threads)
        .map(|k| Share {
            rng: Rng::new(seed * 131 + k as u64 + 1),
            timers: Vec::new(),
            scheduled: 0,
        })
        .collect();
    let context = format!("seed {seed} shards {shards} {mode:?} {routing:?} ring {ring_capacity}");
    for round in 0..25 {
        let now = ns_since(&clock, start);
        // Hot deadlines: many timers share their lists, which fill and grow.
        let hot: Vec<u64> = (2..=5)
            .map(|level| {
                let w = span(level);
                (now / w + 1) * w + rng.below(w)
            })
            .collect();
        std::thread::scope(|scope| {
            for share in shares.iter_mut() {
                let (timer, clock, hot) = (&timer, &clock, &hot);
                scope.spawn(move || operate(share, timer, clock, start, hot, 60));
            }
        });
        let target = match rng.below(5) {
            0 => earliest(&shares).map_or(now + 1, |d| d.saturating_sub(1).max(now)),
            1 | 2 => earliest(&shares).unwrap_or(now + 1),
            3 => {
                let level = 2 + rng.below(4) as u32;
                (now / span(level) + 1) * span(level) + rng.below(3)
            }
            _ => now + rng.below(400_000_000),
        };
        clock.advance(Duration::from_nanos(target - now));
        assert_eq!(ns_since(&clock, start), target);
        check(&mut shares, target, &format!("{context} round {round}"));
    }
    // Everything left fires.
    let now = ns_since(&clock, start);
    let last = earliest(&shares)
        .map(|_| {
            shares
                .iter()
                .flat_map(|s| s.timers.iter().filter_map(|t| t.pending))
                .max()
                .unwrap()
        })
        .unwrap_or(now);
    clock.advance(Duration::from_nanos(last - now + 1));
    check(&mut shares, last + 1, &format!("{context} final"));
    assert!(earliest(&shares).is_none());
    let scheduled: u64 = shares.iter().map(|s| s.scheduled).sum();
    let fired = shares
        .iter()
        .flat_map(|s| &s.timers)
        .filter(|t| t.fired)
        .count() as u64;
    let cancelled = shares
        .iter()
        .flat_map(|s| &s.timers)
        .filter(|t| t.cancelled)
        .count() as u64;
    assert_eq!(fired + cancelled, scheduled);
    let settled = wait_until(WAIT, || {
        let s = timer.stats();
        s.in_rings == 0 && s.pending == 0 && s.scheduled == scheduled
    });
    let s = timer.stats();
    assert!(settled, "{context}: stats never settled: {s:?}");
    assert_eq!(
        (s.scheduled, s.fired, s.cancelled, s.pending, s.in_rings),
        (scheduled, fired, cancelled, 0, 0),
        "{context}: stats at quiescence"
    );
    assert!(timer.shutdown().is_empty(), "{context}: nothing left");
}

/// Extra seeds for the model runs: `LIST_GROWTH_SEEDS=n` runs `n` seeds per model
/// test instead of 3 (a longer hunt; the bound on each test grows with it).
fn seeds(first: u64) -> std::ops::RangeInclusive<u64> {
    let n = std::env::var("LIST_GROWTH_SEEDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(3)
        .max(1);
    first..=first + n - 1
}

/// The bound on a model test: `WAIT`, and 5 s more per seed beyond 3.
fn model_wait() -> Duration {
    WAIT + Duration::from_secs(5 * (seeds(0).count() as u64).saturating_sub(3))
}

// ---------------------------------------------------------------------------------
// Manual clock: the model runs.
// ---------------------------------------------------------------------------------

/// Attacks: direct filing vs the ring path for level 2+ lists, from 4 threads at once
/// on 2 shards (id-routed, so every thread files onto both), with cancels and resets
/// earlier (move messages by the ring when the new list is full or unallocated) and
/// later; the check after each advance is exact (due ⇔ run once; never early).
#[test]
fn manual_model_pool_two_shards_by_id_four_threads() {
    joined_within("model", model_wait(), || {
        for seed in seeds(1) {
            model_run(seed, 2, Mode::Pool, Routing::ById, 4096, 4);
        }
    });
}

/// Attacks: the same with 2-slot rings, so the ring path (taken for every full list)
/// meets full rings all the time: producers wait for room while the shard grows lists.
#[test]
fn manual_model_tiny_rings() {
    joined_within("model", model_wait(), || {
        for seed in seeds(11) {
            model_run(seed, 2, Mode::Pool, Routing::ById, 2, 4);
        }
    });
}

/// Attacks: inline callbacks (fired on the shard thread) with caller-core routing and
/// one shard: every producer files onto the one shard, whose token its own turns take.
#[test]
fn manual_model_inline_one_shard() {
    joined_within("model", model_wait(), || {
        for seed in seeds(21) {
            model_run(seed, 1, Mode::Inline, Routing::ByCore, 4, 3);
        }
    });
}

/// Attacks: the spawn mode, three shards, 2-slot rings, id routing.
#[test]
fn manual_model_spawn_three_shards() {
    joined_within("model", model_wait(), || {
        for seed in seeds(31) {
            model_run(seed, 3, Mode::SpawnRunNow, Routing::ById, 2, 3);
        }
    });
}

// ---------------------------------------------------------------------------------
// Manual clock: targeted scenarios.
// ---------------------------------------------------------------------------------

/// Counts runs per timer index.
fn counters(n: usize) -> Arc<Vec<AtomicUsize>> {
    Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect())
}

/// Attacks: a reset that moves an entry out of a full level-3 list into an empty
/// (never allocated) one, and back into the full one, and to a full list of another
/// level; each move goes by the message ring with the token free. Each timer must
/// fire exactly at its last deadline, not at any earlier one it held.
#[test]
fn manual_resets_between_full_and_empty_lists_fire_at_the_last_deadline() {
    joined_within("resets", WAIT, || {
        let clock = ManualClock::new();
        let start = clock.now();
        let timer = ShardedTimer::builder()
            .shards(1)
            .clock(clock.clone())
            .build()
            .unwrap();
        let at = |ns: u64| start + Duration::from_nanos(ns);
        let runs = counters(64);
        let when = Arc::new((0..64).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
        let schedule = |k: usize, ns: u64| {
            let (runs, when, c) = (runs.clone(), when.clone(), clock.clone());
            timer
                .schedule_at(at(ns), move || {
                    when[k].store(ns_since(&c, start), SeqCst);
                    runs[k].fetch_add(1, SeqCst);
                })
                .unwrap()
        };
        // A level-3 list (5 ms away, 1 ns ticks) filled and grown several times by
        // 32 timers (4 → 8 → 16 → 32 places if `Vec` doubles from 4: full).
        let full_at = 5_000_000;
        let mut filler: Vec<TimerHandle> = (0..32).map(|k| schedule(k, full_at)).collect();
        // Let the shard take everything in (a round at the same now).
        clock.advance(Duration::ZERO);
        // Movers start in another level-3 list (8 ms) and in a level-4 one (40 ms).
        let m1 = schedule(40, 8_000_000);
        let m2 = schedule(41, 40_000_000);
        let m3 = schedule(42, 40_000_001);
        clock.advance(Duration::ZERO);
        // Into the full list (32 of 32, if Vec doubled 4→8→16→32): by the ring.
        assert!(m1.reset_at(at(full_at)));
        assert!(m2.reset_at(at(full_at + 1)));
        // Out again, to a list never allocated (level 3, 3 ms) and back later.
        assert!(m2.reset_at(at(3_000_000)));
        assert!(m2.reset_at(at(4_999_999)), "later: one store");
        // m3: to a level-2 list (far from any other), then earlier again, then later.
        assert!(m3.reset_at(at(10_000)));
        assert!(m3.reset_at(at(9_000)));
        assert!(m3.reset_at(at(12_345)));
        // One more filler after the moves: the list grows on the shard again.
        filler.push(schedule(33, full_at));
        // Step: one ns before each deadline nothing, at it exactly the expected ones.
        let expect = |ns: u64, ks: &[usize]| {
            let now = ns_since(&clock, start);
            clock.advance(Duration::from_nanos(ns - now));
            for k in 0..64 {
                let want = usize::from(ks.contains(&k));
                assert_eq!(runs[k].load(SeqCst), want, "timer {k} at {ns} ns");
            }
        };
        expect(8_999, &[]);
        expect(9_000, &[]);
        expect(12_344, &[]);
        expect(12_345, &[42]);
        expect(4_999_998, &[42]);
        expect(4_999_999, &[41, 42]);
        let mut at_full: Vec<usize> = (0..32).collect();
        at_full.extend([33, 40, 41, 42]);
        expect(full_at, &at_full);
        expect(40_000_001, &at_full);
        assert_eq!(when[42].load(SeqCst), 12_345);
        assert_eq!(when[41].load(SeqCst), 4_999_999);
        assert_eq!(when[40].load(SeqCst), full_at);
        let s = timer.stats();
        assert_eq!(
            (s.scheduled, s.fired, s.pending, s.cancelled),
            (36, 36, 0, 0)
        );
        assert!(timer.shutdown().is_empty());
        drop((filler, m1, m2, m3));
    });
}

/// Attacks: `ManualClock::advance` crossing level-2, -3, -4 and -5 boundaries with
/// thousands of timers filed just before each (from 4 threads at once, most by the
/// ring path: each list starts with no place), plus a second wave filed right after
/// the boundary. Stepping to one ns before and to each boundary: exactly the due
/// ones run, once.
#[test]
fn manual_many_timers_filed_just_before_level_boundaries() {
    joined_within("boundaries", WAIT, || {
        let clock = ManualClock::new();
        let start = clock.now();
        let timer = ShardedTimer::builder()
            .shards(2)
            .routing(Routing::ById)
            .callbacks(Callbacks::pool(2))
            .clock(clock.clone())
            .build()
            .unwrap();
        let deadlines: SharedDeadlines = Arc::default();
        for level in 2..=5u32 {
            let boundary = (ns_since(&clock, start) / span(level) + 1) * span(level);
            // Just before the boundary.
            let now = ns_since(&clock, start);
            clock.advance(Duration::from_nanos((boundary - 2).saturating_sub(now)));
            let now = ns_since(&clock, start);
            assert!(now < boundary - 1);
            std::thread::scope(|scope| {
                for t in 0..4u64 {
                    let (timer, clock, deadlines) = (&timer, &clock, &deadlines);
                    scope.spawn(move || {
                        let mut rng = Rng::new(level as u64 * 10 + t);
                        for _ in 0..300 {
                            // Across the boundary, and up to two spans of each level
                            // above it.
                            let d = match rng.below(4) {
                                0 => boundary + rng.below(3),
                                1 => boundary - 1,
                                2 => boundary + rng.below(span(level + 1)),
                                _ => now + 1 + rng.below(span(level)),
                            };
                            let probe = Arc::new(Probe::default());
                            let (p, c) = (probe.clone(), clock.clone());
                            timer
                                .schedule_at(start + Duration::from_nanos(d), move || {
                                    p.at_ns.store(ns_since(&c, start), SeqCst);
                                    p.runs.fetch_add(1, SeqCst);
                                })
                                .unwrap();
                            deadlines.lock().unwrap().push((d, probe));
                        }
                    });
                }
            });
            for step in [boundary - 1, boundary, boundary + 1, boundary + 2] {
                let now = ns_since(&clock, start);
                clock.advance(Duration::from_nanos(step - now));
                for (d, probe) in deadlines.lock().unwrap().iter() {
                    let runs = probe.runs.load(SeqCst);
                    if *d <= step {
                        assert_eq!(runs, 1, "level {level}: due at {d}, now {step}");
                        assert!(probe.at_ns.load(SeqCst) >= *d);
                    } else {
                        assert_eq!(runs, 0, "level {level}: due at {d} ran at {step}");
                    }
                }
            }
        }
        let all = deadlines.lock().unwrap().len() as u64;
        let max = deadlines
            .lock()
            .unwrap()
            .iter()
            .map(|(d, _)| *d)
            .max()
            .unwrap();
        let now = ns_since(&clock, start);
        clock.advance(Duration::from_nanos(max.saturating_sub(now)));
        for (d, probe) in deadlines.lock().unwrap().iter() {
            assert_eq!(probe.runs.load(SeqCst), 1, "due at {d}");
            assert!(probe.at_ns.load(SeqCst) >= *d);
        }
        let s = timer.stats();
        assert_eq!(
            (s.scheduled, s.fired, s.pending, s.in_rings),
            (all, all, 0, 0)
        );
        assert!(timer.shutdown().is_empty());
    });
}

/// Attacks: producers filing and resetting while another thread advances the clock
/// (so the wheel's now moves under the producers between their room check and the
/// shard's filing). Each callback checks, against the clock it reads, that its
/// timer's deadline (the last successful reset's) has come; at the end everything
/// fires once.
#[test]
fn manual_advancing_while_producers_file_far_timers_and_reset_them() {
    joined_within("concurrent advance", WAIT, || {
        let clock = ManualClock::new();
        let timer = ShardedTimer::builder()
            .shards(2)
            .routing(Routing::ById)
            .ring_capacity(4)
            .clock(clock.clone())
            .build()
            .unwrap();
        let early: Arc<Mutex<Vec<String>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let advancer = {
            let (clock, stop) = (clock.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(99);
                let mut steps = 0;
                while !stop.load(SeqCst) {
                    clock.advance(Duration::from_nanos(rng.below(3 * span(3))));
                    steps += 1;
                }
                steps
            })
        };
        let producers: Vec<_> = (0..3u64)
            .map(|t| {
                let (timer, clock, early) = (timer.clone(), clock.clone(), early.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng::new(1000 + t);
                    let mut mine: Vec<(TimerHandle, Arc<AtomicUsize>, bool)> = Vec::new();
                    for _ in 0..400 {
                        let delay = match rng.below(3) {
                            0 => span(2) + rng.below(span(2)),
                            1 => span(3) + rng.below(span(4)),
                            _ => span(4) + rng.below(span(5)),
                        };
                        let runs = Arc::new(AtomicUsize::new(0));
                        let handle_slot: Arc<OnceLock<TimerHandle>> = Arc::default();
                        let deadline = clock.now() + Duration::from_nanos(delay);
                        let (r, slot, c, e) = (
                            runs.clone(),
                            handle_slot.clone(),
                            clock.clone(),
                            early.clone(),
                        );
                        let handle = timer
                            .schedule_at(deadline, move || {
                                let now = c.now();
                                // Unset: no reset happened yet (only we reset, after
                                // setting it), so the deadline is the first one.
                                let due = slot.get().map_or(deadline, TimerHandle::deadline);
                                if now < due {
                                    e.lock().unwrap().push(format!("{:?} early", now - due));
                                }
                                r.fetch_add(1, SeqCst);
                            })
                            .unwrap();
                        let _ = handle_slot.set(handle.clone());
                        let mut cancelled = false;
                        match rng.below(4) {
                            0 => cancelled = handle.cancel(),
                            1 => {
                                let d = rng.below(delay);
                                handle.reset(Duration::from_nanos(d));
                            }
                            2 => {
                                handle.reset(Duration::from_nanos(delay + rng.below(span(4))));
                            }
                            _ => {}
                        }
                        mine.push((handle, runs, cancelled));
                        if rng.chance(10) {
                            std::thread::yield_now();
                        }
                    }
                    mine
                })
            })
            .collect();
        let mine: Vec<_> = producers
            .into_iter()
            .flat_map(|p| p.join().unwrap())
            .collect();
        stop.store(true, SeqCst);
        assert!(advancer.join().unwrap() > 0);
        // Everything still pending fires now.
        clock.advance(Duration::from_secs(10));
        let mut fired = 0;
        for (handle, runs, cancelled) in &mine {
            let runs = runs.load(SeqCst);
            if *cancelled {
                assert_eq!(runs, 0, "a cancelled timer ran");
                assert_eq!(handle.state(), TimerState::Cancelled);
            } else {
                assert_eq!(runs, 1, "{handle:?} ran {runs} times");
                assert_eq!(handle.state(), TimerState::Fired);
                fired += 1;
            }
        }
        assert!(
            early.lock().unwrap().is_empty(),
            "{:?}",
            early.lock().unwrap()
        );
        let cancelled = mine.len() as u64 - fired;
        let s = timer.stats();
        assert_eq!(
            (s.scheduled, s.fired, s.cancelled, s.pending, s.in_rings),
            (mine.len() as u64, fired, cancelled, 0, 0)
        );
        assert!(timer.shutdown().is_empty());
    });
}

/// Attacks: a cancel of a timer still in the insert ring because its list had no room
/// (the shard sleeps until an earlier timer, so nothing drains the ring): `true` once,
/// `false` after, and it never runs, also once the clock passes its deadline.
#[test]
fn manual_cancel_of_a_timer_waiting_in_the_ring_is_final() {
    joined_within("cancel in ring", WAIT, || {
        let clock = ManualClock::new();
        let timer = ShardedTimer::builder()
            .shards(1)
            .clock(clock.clone())
            .build()
            .unwrap();
        let ran = counters(200);
        // The shard takes this one in and then sleeps until it (60 s).
        let r = ran.clone();
        let anchor = timer
            .schedule(Duration::from_secs(60), move || {
                r[199].fetch_add(1, SeqCst);
            })
            .unwrap();
        clock.advance(Duration::ZERO);
        // Far timers, later than the shard's wake-up: each new list has no place, so
        // they go by the ring and wake nobody; cancel each at once.
        let mut handles = Vec::new();
        for k in 0..100usize {
            let r = ran.clone();
            let delay = Duration::from_secs(100) + Duration::from_nanos(span(5) * k as u64);
            let h = timer
                .schedule(delay, move || {
                    r[k].fetch_add(1, SeqCst);
                })
                .unwrap();
            if k % 2 == 0 {
                assert!(h.cancel(), "timer {k}: cancel in the ring returns true");
                assert!(!h.cancel(), "timer {k}: once");
                assert!(
                    !h.reset(Duration::from_secs(1)),
                    "timer {k}: stays cancelled"
                );
                assert_eq!(h.state(), TimerState::Cancelled);
            }
            handles.push(h);
        }
        clock.advance(Duration::from_secs(100_000));
        for k in 0..100 {
            assert_eq!(ran[k].load(SeqCst), usize::from(k % 2 == 1), "timer {k}");
        }
        assert_eq!(ran[199].load(SeqCst), 1);
        let s = timer.stats();
        assert_eq!(
            (s.scheduled, s.fired, s.cancelled, s.pending, s.in_rings),
            (101, 51, 50, 0, 0)
        );
        assert!(timer.shutdown().is_empty());
        drop((anchor, handles));
    });
}

/// Attacks: `max_pending` with the ring path: far timers (no list has room) take
/// their room at `schedule`; cancelling some while they may still wait in the ring
/// gives exactly that room back; firing gives the rest back. 4 threads race for the
/// room: exactly `limit` win.
#[test]
fn manual_max_pending_room_is_taken_and_given_back_exactly_on_the_ring_path() {
    joined_within("max_pending", WAIT, || {
        const LIMIT: usize = 64;
        let clock = ManualClock::new();
        let timer = ShardedTimer::builder()
            .shards(2)
            .routing(Routing::ById)
            .ring_capacity(2)
            .max_pending(LIMIT)
            .clock(clock.clone())
            .build()
            .unwrap();
        let fired = Arc::new(AtomicUsize::new(0));
        let race = |timer: &ShardedTimer, base: u64| -> Vec<TimerHandle> {
            let barrier = Barrier::new(4);
            std::thread::scope(|scope| {
                let joins: Vec<_> = (0..4u64)
                    .map(|t| {
                        let (barrier, fired) = (&barrier, fired.clone());
                        scope.spawn(move || {
                            barrier.wait();
                            let mut won = Vec::new();
                            for k in 0..40u64 {
                                // Each in its own level-5 or -6 list: by the ring.
                                let delay = Duration::from_nanos(
                                    base + span(5) * (t * 40 + k) + span(4) * t,
                                );
                                let f = fired.clone();
                                match timer.schedule(delay, move || {
                                    f.fetch_add(1, SeqCst);
                                }) {
                                    Ok(h) => won.push(h),
                                    Err(ScheduleError::TooManyPending { .. }) => {}
                                    Err(other) => panic!("unexpected {other:?}"),
                                }
                            }
                            won
                        })
                    })
                    .collect();
                joins.into_iter().flat_map(|j| j.join().unwrap()).collect()
            })
        };
        let won = race(&timer, span(5));
        assert_eq!(won.len(), LIMIT, "exactly the limit wins");
        assert!(matches!(
            timer.schedule(Duration::from_secs(1), || {}),
            Err(ScheduleError::TooManyPending { .. })
        ));
        // Cancel 16 at once (some still in a ring): 16 places, no more.
        for h in &won[..16] {
            assert!(h.cancel());
        }
        let again = race(&timer, span(5) + 7);
        assert_eq!(again.len(), 16, "the cancelled timers' room, exactly");
        // Fire everything: all room back.
        clock.advance(Duration::from_secs(86_400 * 30));
        assert_eq!(fired.load(SeqCst), LIMIT);
        let third = race(&timer, span(5) * 1000);
        assert_eq!(third.len(), LIMIT, "all room back after firing");
        for h in &third {
            assert!(h.cancel());
        }
        // Exact at quiescence: once the shards have met the cancels (messages, or
        // timers cancelled in a ring).
        let want = (LIMIT as u64 * 2 + 16, LIMIT as u64, LIMIT as u64 + 16, 0, 0);
        wait_until(WAIT, || {
            let s = timer.stats();
            (s.scheduled, s.fired, s.cancelled, s.pending, s.in_rings) == want
        });
        let s = timer.stats();
        assert_eq!(
            (s.scheduled, s.fired, s.cancelled, s.pending, s.in_rings),
            (LIMIT as u64 * 2 + 16, LIMIT as u64, LIMIT as u64 + 16, 0, 0)
        );
        assert!(timer.shutdown().is_empty());
    });
}

/// Attacks: callbacks (inline, pool, spawn) that themselves file far timers and
/// reset earlier other pending timers into full and unallocated lists: a chain that
/// climbs the levels. On a shard thread a push that finds its ring full must never
/// wait for itself. Everything runs exactly once, never early.
#[test]
fn manual_callbacks_file_and_move_far_timers_in_every_mode() {
    for mode in [Mode::Inline, Mode::Pool, Mode::SpawnRunNow] {
        joined_within("callbacks", WAIT, move || {
            let clock = ManualClock::new();
            let start = clock.now();
            let timer = ShardedTimer::builder()
                .shards(2)
                .routing(Routing::ById)
                .ring_capacity(2)
                .callbacks(callbacks(mode))
                .clock(clock.clone())
                .build()
                .unwrap();
            let runs = Arc::new(AtomicUsize::new(0));
            let early = Arc::new(AtomicUsize::new(0));
            // Victims: far pending timers the callbacks pull earlier.
            let victims: Arc<Mutex<Vec<TimerHandle>>> = Arc::default();
            for k in 0..50u64 {
                let (r, e, c) = (runs.clone(), early.clone(), clock.clone());
                let d = start + Duration::from_nanos(span(6) + k * span(4));
                // Its handle, to read the deadline of its last successful reset (the
                // chain pulls it earlier).
                let me: Arc<OnceLock<TimerHandle>> = Arc::default();
                let m = me.clone();
                let h = timer
                    .schedule_at(d, move || {
                        let due = m.get().map_or(d, TimerHandle::deadline);
                        if c.now() < due {
                            e.fetch_add(1, SeqCst);
                        }
                        r.fetch_add(1, SeqCst);
                    })
                    .unwrap();
                me.set(h.clone()).unwrap();
                victims.lock().unwrap().push(h);
            }
            // A chain: each run files 8 more (depth 3) further out, one level up each
            // time, and moves one victim earlier to a deadline just after its own.
            fn link(
                timer: ShardedTimer,
                clock: ManualClock,
                runs: Arc<AtomicUsize>,
                early: Arc<AtomicUsize>,
                victims: Arc<Mutex<Vec<TimerHandle>>>,
                depth: u32,
                deadline: Instant,
            ) -> impl FnOnce() + Send + 'static {
                move || {
                    if clock.now() < deadline {
                        early.fetch_add(1, SeqCst);
                    }
                    runs.fetch_add(1, SeqCst);
                    if depth == 0 {
                        return;
                    }
                    let now = clock.now();
                    for k in 0..8u64 {
                        let d = now + Duration::from_nanos(span(depth + 2) + k * 3);
                        let f = link(
                            timer.clone(),
                            clock.clone(),
                            runs.clone(),
                            early.clone(),
                            victims.clone(),
                            depth - 1,
                            d,
                        );
                        // The service may have shut down only at the very end.
                        timer.schedule_at(d, f).unwrap();
                    }
                    if let Some(v) = victims.lock().unwrap().pop() {
                        // True unless it already fired; either way fine.
                        v.reset_at(now + Duration::from_nanos(span(3) + 1));
                    }
                }
            }
            for k in 0..5u64 {
                let d = start + Duration::from_nanos(span(3) * (k + 1));
                let f = link(
                    timer.clone(),
                    clock.clone(),
                    runs.clone(),
                    early.clone(),
                    victims.clone(),
                    3,
                    d,
                );
                timer.schedule_at(d, f).unwrap();
            }
            // 5 roots × (1 + 8 + 64 + 512) chain runs, plus the 50 victims.
            let chain = 5 * (1 + 8 + 64 + 512);
            let mut steps = 0;
            while runs.load(SeqCst) < chain + 50 && steps < 200 {
                clock.advance(Duration::from_nanos(span(4)));
                steps += 1;
            }
            clock.advance(Duration::from_nanos(span(7)));
            assert_eq!(runs.load(SeqCst), chain + 50, "{mode:?}: every run once");
            assert_eq!(early.load(SeqCst), 0, "{mode:?}: none early");
            let s = timer.stats();
            assert_eq!(
                (s.scheduled, s.fired, s.pending, s.in_rings),
                ((chain + 50) as u64, (chain + 50) as u64, 0, 0),
                "{mode:?}"
            );
            // The chain's closures hold clones of the service: shut it down.
            assert!(timer.shutdown().is_empty(), "{mode:?}");
        });
    }
}

/// Attacks: repeating timers with periods in level 2+ lists (each run's re-filing
/// lands in a list that may have no place) beside one-shot timers filed into the same
/// lists: run counts bounded on both sides on a stepping clock (never a run before its
/// slot, a run in every advance that passed one), every one-shot once.
#[test]
fn manual_repeating_timers_with_far_periods_run_exactly_on_schedule() {
    joined_within("repeating", WAIT, || {
        let clock = ManualClock::new();
        // A period shorter than the service's tick runs once per tick (documented), so
        // the tick is 1 ns here; the manual clock's wheel ticks are 1 ns anyway.
        let timer = ShardedTimer::builder()
            .shards(2)
            .routing(Routing::ById)
            .ring_capacity(2)
            .tick(Duration::from_nanos(1))
            .clock(clock.clone())
            .build()
            .unwrap();
        let periods = [span(2) + 3, span(3) + 5, span(4) - 1, span(4) * 3];
        let counts = counters(periods.len());
        let handles: Vec<_> = periods
            .iter()
            .enumerate()
            .map(|(k, &p)| {
                let c = counts.clone();
                timer
                    .schedule_repeating(Duration::from_nanos(p), move || {
                        c[k].fetch_add(1, SeqCst);
                    })
                    .unwrap()
            })
            .collect();
        let one_shots = Arc::new(AtomicUsize::new(0));
        let mut elapsed = 0u64;
        let mut crossings = [0u64; 4];
        for step in 0..300u64 {
            // One-shots into the lists the repeating timers use next.
            for &p in &periods {
                let o = one_shots.clone();
                let next = (elapsed / p + 1) * p;
                timer
                    .schedule(Duration::from_nanos(next - elapsed), move || {
                        o.fetch_add(1, SeqCst);
                    })
                    .unwrap();
            }
            let by = span(3) / 2 + step * 17;
            clock.advance(Duration::from_nanos(by));
            for (k, &p) in periods.iter().enumerate() {
                if (elapsed + by) / p > elapsed / p {
                    crossings[k] += 1;
                }
            }
            elapsed += by;
            for (k, &p) in periods.iter().enumerate() {
                // At most one run per slot passed (never early), and at least one in
                // every advance that passed a slot (runs whose slots a jump passed
                // may be skipped: a run ending a whole period behind skips them).
                let runs = counts[k].load(SeqCst) as u64;
                assert!(
                    runs <= elapsed / p && runs >= crossings[k],
                    "period {p} after {elapsed} ns: {runs} runs, {} slots, {} advances crossed one",
                    elapsed / p,
                    crossings[k]
                );
            }
        }
        for h in &handles {
            assert!(h.cancel());
        }
        clock.advance(Duration::from_nanos(span(5)));
        assert_eq!(one_shots.load(SeqCst), 300 * periods.len());
        assert!(timer.shutdown().is_empty());
    });
}

// ---------------------------------------------------------------------------------
// Real clock.
// ---------------------------------------------------------------------------------

/// Attacks: the system clock with a 50 µs tick, so that a level-2 boundary (4,096
/// ticks) passes every 205 ms and deadlines 0–600 ms cross it; 4 threads schedule,
/// cancel and reset (earlier and later) at once on 2 shards. Never early (strict,
/// against the deadline of the last successful reset), exactly once, and late by at
/// most a generous bound.
#[test]
fn real_time_boundary_crossing_timers_from_four_threads() {
    joined_within("real time", WAIT, || {
        let timer = ShardedTimer::builder()
            .shards(2)
            .tick(Duration::from_micros(50))
            .routing(Routing::ById)
            .ring_capacity(8)
            .callbacks(Callbacks::pool(2))
            .build()
            .unwrap();
        let violations: Arc<Mutex<Vec<String>>> = Arc::default();
        let max_late = Arc::new(AtomicU64::new(0));
        let producers: Vec<_> = (0..4u64)
            .map(|t| {
                let (timer, violations, max_late) =
                    (timer.clone(), violations.clone(), max_late.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng::new(500 + t);
                    let mut mine = Vec::new();
                    for _ in 0..250 {
                        let delay = Duration::from_micros(rng.below(600_000));
                        let deadline = Instant::now() + delay;
                        let runs = Arc::new(AtomicUsize::new(0));
                        let slot: Arc<OnceLock<TimerHandle>> = Arc::default();
                        let (r, s, v, m) = (
                            runs.clone(),
                            slot.clone(),
                            violations.clone(),
                            max_late.clone(),
                        );
                        let handle = timer
                            .schedule_at(deadline, move || {
                                let now = Instant::now();
                                let due = s.get().map_or(deadline, TimerHandle::deadline);
                                if now < due {
                                    v.lock().unwrap().push(format!("early by {:?}", due - now));
                                } else {
                                    let late = (now - due).as_micros() as u64;
                                    m.fetch_max(late, SeqCst);
                                }
                                r.fetch_add(1, SeqCst);
                            })
                            .unwrap();
                        let _ = slot.set(handle.clone());
                        let mut cancelled = false;
                        match rng.below(6) {
                            0 => cancelled = handle.cancel(),
                            1 | 2 => {
                                handle.reset(Duration::from_micros(rng.below(600_000)));
                            }
                            _ => {}
                        }
                        mine.push((handle, runs, cancelled));
                        if rng.chance(5) {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                    mine
                })
            })
            .collect();
        let mine: Vec<_> = producers
            .into_iter()
            .flat_map(|p| p.join().unwrap())
            .collect();
        let expected = mine.iter().filter(|(_, _, c)| !c).count();
        let all_ran = wait_until(Duration::from_secs(10), || {
            mine.iter()
                .filter(|(_, r, c)| !c && r.load(SeqCst) == 1)
                .count()
                == expected
        });
        // A little longer, for a second run that should never come.
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            all_ran,
            "not every timer ran within 10 s of the last filing"
        );
        for (handle, runs, cancelled) in &mine {
            assert_eq!(runs.load(SeqCst), usize::from(!cancelled), "{handle:?}");
        }
        assert!(
            violations.lock().unwrap().is_empty(),
            "{:?}",
            violations.lock().unwrap()
        );
        let late = Duration::from_micros(max_late.load(SeqCst));
        assert!(late < Duration::from_secs(2), "lateness {late:?}");
        let s = timer.stats();
        assert_eq!(s.lateness.count(), expected as u64);
        assert!(timer.shutdown().is_empty());
    });
}

/// Attacks: 2-slot rings, a shard asleep until a timer a minute away, and 4 threads
/// filing 2,000 far timers each (level 2+ lists that start with no place, spread over
/// many slots: most of the first ones by the ring, the shard growing lists as it
/// drains). Nothing lost, no deadlock, and `stats()` exact at quiescence; then
/// cancels from 2 threads and a shutdown that returns exactly the rest.
#[test]
fn real_time_tiny_rings_thousands_of_far_timers_while_the_shard_sleeps() {
    joined_within("tiny rings", WAIT, || {
        let timer = ShardedTimer::builder()
            .shards(2)
            .routing(Routing::ById)
            .ring_capacity(2)
            .build()
            .unwrap();
        let anchors: Vec<_> = (0..4)
            .map(|_| timer.schedule(Duration::from_secs(60), || {}).unwrap())
            .collect();
        assert!(wait_until(WAIT, || timer.stats().in_rings == 0));
        let filed: Vec<TimerHandle> = std::thread::scope(|scope| {
            let joins: Vec<_> = (0..4u64)
                .map(|t| {
                    let timer = &timer;
                    scope.spawn(move || {
                        let mut rng = Rng::new(7000 + t);
                        (0..2000)
                            .map(|_| {
                                let delay = Duration::from_secs(120)
                                    + Duration::from_millis(rng.below(7_200_000));
                                timer.schedule(delay, || panic!("never due")).unwrap()
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            joins.into_iter().flat_map(|j| j.join().unwrap()).collect()
        });
        let total = filed.len() as u64 + 4;
        let settled = wait_until(WAIT, || {
            let s = timer.stats();
            s.in_rings == 0 && s.scheduled == total
        });
        let s = timer.stats();
        assert!(settled, "stats never settled: {s:?}");
        assert_eq!(
            (s.scheduled, s.pending, s.fired, s.cancelled),
            (total, total, 0, 0)
        );
        assert_eq!(
            s.shards.iter().map(|l| l.pending).sum::<u64>(),
            total,
            "per-shard pending adds up"
        );
        // Cancel every third, from two threads.
        let cancelled = std::thread::scope(|scope| {
            let joins: Vec<_> = (0..2)
                .map(|half| {
                    let filed = &filed;
                    scope.spawn(move || {
                        filed
                            .iter()
                            .enumerate()
                            .filter(|(k, _)| k % 3 == 0 && k % 2 == half)
                            .map(|(_, h)| {
                                assert!(h.cancel());
                                h.id()
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            joins
                .into_iter()
                .flat_map(|j| j.join().unwrap())
                .collect::<HashSet<TimerId>>()
        });
        let k = cancelled.len() as u64;
        let settled = wait_until(WAIT, || {
            let s = timer.stats();
            s.cancelled == k && s.pending == total - k
        });
        let s = timer.stats();
        assert!(settled, "cancels never settled: {s:?}");
        let unfired = timer.shutdown();
        assert_eq!(unfired.len() as u64, total - k);
        let returned: HashSet<TimerId> = unfired.iter().map(|u| u.id()).collect();
        assert_eq!(returned.len(), unfired.len(), "each returned once");
        for h in filed.iter().chain(&anchors) {
            assert_eq!(
                returned.contains(&h.id()),
                !cancelled.contains(&h.id()),
                "{h:?}"
            );
        }
        // Dropping the Unfireds drops the callbacks unrun (they would panic).
        drop(unfired);
    });
}

/// Attacks: shutdown racing 4 producers that file far timers (ring path) and near
/// ones, with 2-slot rings, while a fifth thread cancels: every accepted timer is
/// exactly one of fired, returned by `shutdown` or cancelled (cancel `true`); every
/// refusal is `Shutdown`. Repeated with other ring sizes and modes.
#[test]
fn real_time_shutdown_racing_far_filings_accounts_for_every_timer() {
    for (round, (ring, mode)) in [
        (2usize, Mode::Pool),
        (2, Mode::Inline),
        (4096, Mode::Pool),
        (4, Mode::SpawnRunNow),
    ]
    .into_iter()
    .enumerate()
    {
        joined_within("shutdown race", WAIT, move || {
            let timer = ShardedTimer::builder()
                .shards(2)
                .routing(Routing::ById)
                .ring_capacity(ring)
                .callbacks(callbacks(mode))
                .build()
                .unwrap();
            let fired: Arc<Mutex<Vec<TimerId>>> = Arc::default();
            let cancel_queue: Arc<Mutex<Vec<TimerHandle>>> = Arc::default();
            let stop_cancel = Arc::new(AtomicBool::new(false));
            let canceller = {
                let (q, stop) = (cancel_queue.clone(), stop_cancel.clone());
                std::thread::spawn(move || {
                    let mut won = Vec::new();
                    loop {
                        let batch: Vec<_> = std::mem::take(&mut *q.lock().unwrap());
                        for h in batch {
                            if h.cancel() {
                                won.push(h.id());
                            }
                        }
                        if stop.load(SeqCst) && q.lock().unwrap().is_empty() {
                            return won;
                        }
                        std::thread::yield_now();
                    }
                })
            };
            let producers: Vec<_> = (0..4u64)
                .map(|t| {
                    let (timer, fired, q) = (timer.clone(), fired.clone(), cancel_queue.clone());
                    std::thread::spawn(move || {
                        let mut rng = Rng::new(round as u64 * 100 + t);
                        let mut accepted = Vec::new();
                        loop {
                            let delay = if rng.chance(20) {
                                Duration::from_micros(rng.below(3_000))
                            } else {
                                Duration::from_secs(5)
                                    + Duration::from_millis(rng.below(10_000_000))
                            };
                            let slot: Arc<OnceLock<TimerId>> = Arc::default();
                            let (f, s) = (fired.clone(), slot.clone());
                            match timer.schedule(delay, move || {
                                // The id is set right after schedule returns; a run
                                // before that is a near timer: wait for it, bounded.
                                let t0 = Instant::now();
                                while s.get().is_none() && t0.elapsed() < WAIT {
                                    std::thread::yield_now();
                                }
                                f.lock().unwrap().push(*s.get().expect("id set"));
                            }) {
                                Ok(h) => {
                                    let _ = slot.set(h.id());
                                    accepted.push(h.id());
                                    if rng.chance(15) {
                                        q.lock().unwrap().push(h);
                                    }
                                }
                                Err(ScheduleError::Shutdown) => return accepted,
                                Err(other) => panic!("unexpected {other:?}"),
                            }
                        }
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(40));
            let unfired = timer.shutdown();
            let accepted: Vec<TimerId> = producers
                .into_iter()
                .flat_map(|p| p.join().unwrap())
                .collect();
            stop_cancel.store(true, SeqCst);
            let cancelled = canceller.join().unwrap();
            assert!(matches!(
                timer.schedule(Duration::from_secs(1), || {}),
                Err(ScheduleError::Shutdown)
            ));
            let fired = fired.lock().unwrap().clone();
            let mut seen: HashMap<TimerId, &str> = HashMap::new();
            for (ids, what) in [
                (&fired, "fired"),
                (
                    &unfired.iter().map(|u| u.id()).collect::<Vec<_>>(),
                    "returned",
                ),
                (&cancelled, "cancelled"),
            ] {
                for id in ids {
                    if let Some(before) = seen.insert(*id, what) {
                        panic!("{ring}/{mode:?}: {id:?} both {before} and {what}");
                    }
                }
            }
            let accepted_set: HashSet<TimerId> = accepted.iter().copied().collect();
            assert_eq!(accepted_set.len(), accepted.len());
            for id in &accepted {
                assert!(seen.contains_key(id), "{ring}/{mode:?}: {id:?} lost");
            }
            assert_eq!(
                seen.len(),
                accepted.len(),
                "{ring}/{mode:?}: nothing unknown"
            );
            drop(unfired);
        });
    }
}

/// Attacks: a far timer (no room in its list: by the ring) cancelled while the shard
/// sleeps until an earlier one, on the system clock: `true` once, counted once in
/// `stats().cancelled` after the shard meets it, and not among shutdown's `Unfired`.
#[test]
fn real_time_cancel_while_in_the_ring_counts_once_and_is_not_returned() {
    joined_within("cancel in ring", WAIT, || {
        let timer = ShardedTimer::builder().shards(1).build().unwrap();
        let anchor = timer.schedule(Duration::from_secs(30), || {}).unwrap();
        assert!(wait_until(WAIT, || timer.stats().in_rings == 0));
        // Each its own level-3 slot (an hour and more away at 1 ms ticks).
        let far: Vec<_> = (0..20u64)
            .map(|k| {
                timer
                    .schedule(Duration::from_secs(3600 + 300 * k), || panic!("cancelled"))
                    .unwrap()
            })
            .collect();
        for h in &far {
            assert!(h.cancel());
            assert!(!h.cancel());
        }
        let settled = wait_until(WAIT, || {
            let s = timer.stats();
            s.in_rings == 0 && s.cancelled == 20
        });
        let s = timer.stats();
        assert!(settled, "{s:?}");
        assert_eq!(
            (s.scheduled, s.pending, s.cancelled, s.fired),
            (21, 1, 20, 0)
        );
        let unfired = timer.shutdown();
        assert_eq!(unfired.len(), 1);
        assert_eq!(unfired[0].id(), anchor.id());
    });
}

/// Attacks: an earlier reset whose new list has no room, on a shard asleep until the
/// timer's old, far deadline: the move goes by the message ring (not taken by the
/// mover), and the shard must still wake for it and fire on time. 50 µs ticks, so
/// the new deadline (250–450 ms, 5,000+ ticks) is in a level-2 list (4,096+ ticks
/// away), never allocated.
#[test]
fn real_time_earlier_reset_into_a_list_with_no_room_still_fires_on_time() {
    joined_within("earlier reset", WAIT, || {
        let timer = ShardedTimer::builder()
            .shards(1)
            .tick(Duration::from_micros(50))
            .build()
            .unwrap();
        let fired_at: Arc<Mutex<Vec<(usize, Instant)>>> = Arc::default();
        let handles: Vec<_> = (0..5usize)
            .map(|k| {
                let f = fired_at.clone();
                timer
                    .schedule(Duration::from_secs(3600), move || {
                        f.lock().unwrap().push((k, Instant::now()));
                    })
                    .unwrap()
            })
            .collect();
        assert!(wait_until(WAIT, || timer.stats().in_rings == 0));
        // Let the shard park until an hour from now.
        std::thread::sleep(Duration::from_millis(20));
        let mut due = Vec::new();
        for (k, h) in handles.iter().enumerate() {
            let d = Instant::now() + Duration::from_millis(250 + 50 * k as u64);
            assert!(h.reset_at(d));
            due.push(d);
        }
        assert!(
            wait_until(Duration::from_secs(5), || fired_at.lock().unwrap().len()
                == 5),
            "an earlier reset by the ring did not fire within 5 s: {:?}",
            fired_at.lock().unwrap()
        );
        for &(k, at) in fired_at.lock().unwrap().iter() {
            assert!(at >= due[k], "timer {k} early");
            assert!(
                at - due[k] < Duration::from_secs(2),
                "timer {k} late by {:?}",
                at - due[k]
            );
        }
        assert!(timer.shutdown().is_empty());
    });
}

/// The voluntary context switches of the thread named `name` (`/proc/self/task/*/status`):
/// a parked shard thread adds one each time something wakes it.
fn thread_switches(name: &str) -> Option<u64> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    tasks.flatten().find_map(|task| {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            return None;
        }
        let status = std::fs::read_to_string(task.path().join("status")).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|n| n.trim().parse().ok())
    })
}

/// Probe (sanity of the other tests): the ring path really is taken from the outside.
/// With the shard asleep until a timer a minute away, a first timer an hour away (a
/// level-3 list, never allocated) goes by the ring, though the token is free, and
/// wakes the shard, which files it (growing the list on its thread) without anything
/// else waking it; the next ones into the same list are filed directly and wake
/// nobody, until the list is full again, when one goes by the ring and wakes the shard
/// again. Told by the shard thread's context switches (a direct filing into a
/// sleeping shard's wheel leaves it asleep).
#[test]
fn probe_far_timers_take_the_ring_until_the_shard_grew_their_list() {
    joined_within("probe", WAIT, || {
        let timer = ShardedTimer::builder()
            .shards(1)
            .executor_threads(1)
            .pin_cores(false)
            .thread_name("lgprobe")
            .build()
            .unwrap();
        let _anchor = timer.schedule(Duration::from_secs(60), || {}).unwrap();
        assert!(wait_until(WAIT, || timer.stats().in_rings == 0));
        // Let the shard park (nothing wakes it before the anchor).
        assert!(wait_until(WAIT, || shard_thread_sleeps("lgprobe-s0")));
        let switches = || thread_switches("lgprobe-s0").expect("the shard thread");
        let parked = switches();
        let mut held = vec![timer.schedule(Duration::from_secs(3600), || {}).unwrap()];
        // By the ring, and the shard woke for it (no `stats()`, which would wake it).
        assert!(
            wait_until(WAIT, || in_rings_shown(&timer) == (0, 2)),
            "the first far timer, filed by the woken shard: {:?}",
            in_rings_shown(&timer)
        );
        assert!(switches() > parked, "the shard woke for it");
        assert!(wait_until(WAIT, || shard_thread_sleeps("lgprobe-s0")));
        // Room now: filed directly, at once, and nobody wakes.
        let parked = switches();
        held.push(timer.schedule(Duration::from_secs(3600), || {}).unwrap());
        assert_eq!(in_rings_shown(&timer), (0, 3), "room now: filed directly");
        assert_eq!(switches(), parked, "a direct filing woke the shard");
        // Keep filing into the same list: once it is full, one goes by the ring and
        // wakes the shard.
        let mut to_ring = None;
        for k in 0..200 {
            held.push(timer.schedule(Duration::from_secs(3600), || {}).unwrap());
            if switches() > parked {
                to_ring = Some(k);
                break;
            }
        }
        assert!(
            to_ring.is_some(),
            "a full list sends the next timer by the ring, waking the shard"
        );
        let n = held.len() as u64 + 1;
        assert!(wait_until(WAIT, || in_rings_shown(&timer) == (0, n)));
        let s = timer.stats();
        assert_eq!((s.scheduled, s.pending), (n, n));
        assert_eq!(timer.shutdown().len() as u64, n);
    });
}

/// Attacks: the overdue list (deadlines at or before the wheel's now) has 64 places
/// from the start; past deadlines beyond that, from 2 threads at once (new timers
/// `schedule_at` a past instant, and earlier resets of far timers to a past instant),
/// find it full and take the ring. All run exactly once, promptly.
#[test]
fn real_time_past_deadlines_overflow_the_overdue_list() {
    joined_within("overdue", WAIT, || {
        let timer = ShardedTimer::builder()
            .shards(1)
            .callbacks(Callbacks::pool(2))
            .build()
            .unwrap();
        let runs = counters(2000);
        let far: Vec<TimerHandle> = (0..1000usize)
            .map(|k| {
                let r = runs.clone();
                timer
                    .schedule(Duration::from_secs(7200), move || {
                        r[k].fetch_add(1, SeqCst);
                    })
                    .unwrap()
            })
            .collect();
        let past = Instant::now() - Duration::from_millis(5);
        let made = Instant::now();
        std::thread::scope(|scope| {
            let (timer, runs, far) = (&timer, &runs, &far);
            scope.spawn(move || {
                for h in far {
                    assert!(h.reset_at(past), "reset of a pending timer");
                }
            });
            scope.spawn(move || {
                for k in 1000..2000usize {
                    let r = runs.clone();
                    timer
                        .schedule_at(past, move || {
                            r[k].fetch_add(1, SeqCst);
                        })
                        .unwrap();
                }
            });
        });
        assert!(
            wait_until(Duration::from_secs(10), || runs
                .iter()
                .all(|r| r.load(SeqCst) >= 1)),
            "not all past-due timers ran within 10 s: {} of 2000",
            runs.iter().filter(|r| r.load(SeqCst) >= 1).count()
        );
        let took = made.elapsed();
        std::thread::sleep(Duration::from_millis(20));
        assert!(runs.iter().all(|r| r.load(SeqCst) == 1), "exactly once");
        assert!(took < Duration::from_secs(5), "took {took:?}");
        let s = timer.stats();
        assert_eq!((s.scheduled, s.fired, s.pending), (2000, 2000, 0));
        assert!(timer.shutdown().is_empty());
    });
}

/// Attacks: far-future deadlines (`Duration::MAX`, saturated at about 292 years, in
/// the wheel's top level, whose lists start with no place) and 2^40-ns-scale ones,
/// filed from 3 threads, some cancelled and some reset earlier into levels 2..4; on a
/// manual clock `advance(Duration::MAX)` reaches them all: exactly once each.
#[test]
fn manual_far_future_deadlines_in_the_top_levels() {
    joined_within("far future", WAIT, || {
        let clock = ManualClock::new();
        let start = clock.now();
        let timer = ShardedTimer::builder()
            .shards(2)
            .routing(Routing::ById)
            .ring_capacity(2)
            .clock(clock.clone())
            .build()
            .unwrap();
        let results: Vec<(TimerHandle, Arc<AtomicUsize>, bool, Option<u64>)> =
            std::thread::scope(|scope| {
                let joins: Vec<_> = (0..3u64)
                    .map(|t| {
                        let timer = &timer;
                        scope.spawn(move || {
                            let mut rng = Rng::new(4242 + t);
                            (0..300)
                                .map(|k| {
                                    let runs = Arc::new(AtomicUsize::new(0));
                                    let r = runs.clone();
                                    let delay = match k % 3 {
                                        0 => Duration::MAX,
                                        1 => Duration::from_nanos(span(7 + rng.below(3) as u32)),
                                        _ => {
                                            Duration::from_secs(86_400 * 365 * (1 + rng.below(200)))
                                        }
                                    };
                                    let h = timer
                                        .schedule(delay, move || {
                                            r.fetch_add(1, SeqCst);
                                        })
                                        .unwrap();
                                    let mut cancelled = false;
                                    let mut moved = None;
                                    match rng.below(4) {
                                        0 => cancelled = h.cancel(),
                                        1 => {
                                            let d = span(2 + rng.below(3) as u32) + rng.below(100);
                                            assert!(h.reset_at(start + Duration::from_nanos(d)));
                                            moved = Some(d);
                                        }
                                        _ => {}
                                    }
                                    (h, runs, cancelled, moved)
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                joins.into_iter().flat_map(|j| j.join().unwrap()).collect()
            });
        // The moved ones, and only they, by span(5).
        clock.advance(Duration::from_nanos(span(5)));
        for (h, runs, cancelled, moved) in &results {
            let want = usize::from(moved.is_some() && !cancelled);
            assert_eq!(runs.load(SeqCst), want, "{h:?} moved {moved:?}");
        }
        clock.advance(Duration::MAX);
        for (h, runs, cancelled, _) in &results {
            assert_eq!(runs.load(SeqCst), usize::from(!cancelled), "{h:?}");
        }
        let n = results.len() as u64;
        let c = results.iter().filter(|r| r.2).count() as u64;
        let s = timer.stats();
        assert_eq!(
            (s.scheduled, s.fired, s.cancelled, s.pending, s.in_rings),
            (n, n - c, c, 0, 0)
        );
        assert!(timer.shutdown().is_empty());
    });
}

/// A waker that counts its wakes.
struct CountWake(AtomicUsize);

impl std::task::Wake for CountWake {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// Attacks: far `Sleep`s (each a timer in a list with no place: by the ring) polled
/// once, then half dropped while their timers may still wait in the ring: a dropped
/// sleep cancels and wakes nobody (guarantee 10); the others complete only once
/// their deadline has passed on the manual clock, woken once.
#[test]
fn manual_far_sleeps_dropped_while_in_the_ring_wake_nobody() {
    joined_within("sleeps", WAIT, || {
        let clock = ManualClock::new();
        let timer = ShardedTimer::builder()
            .shards(1)
            .clock(clock.clone())
            .build()
            .unwrap();
        let wakes = Arc::new(CountWake(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(wakes.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let mut sleeps: Vec<_> = (0..100u64)
            .map(|k| Box::pin(timer.sleep(Duration::from_nanos(span(5) * (k + 1) + 7))))
            .collect();
        for s in &mut sleeps {
            assert!(s.as_mut().poll(&mut cx).is_pending());
        }
        let kept: Vec<_> = sleeps
            .into_iter()
            .enumerate()
            .filter_map(|(k, s)| (k % 2 == 0).then_some(s))
            .collect();
        // 50 dropped: no wake from them, ever.
        clock.advance(Duration::from_nanos(span(5) * 101));
        assert_eq!(
            wakes.0.load(SeqCst),
            50,
            "one wake per kept sleep, none for dropped"
        );
        for mut s in kept {
            assert!(s.as_mut().poll(&mut cx).is_ready());
        }
        let s = timer.stats();
        assert_eq!(
            (s.scheduled, s.fired, s.cancelled, s.pending),
            (100, 50, 50, 0)
        );
        assert!(timer.shutdown().is_empty());
    });
}
