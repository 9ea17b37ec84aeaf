//! Outside audit of the shard's wait for a ring slot that a producer reserved and has
//! not written yet (`Park::Retry`, `Stall` in `src/shard/park.rs`): the shard must
//! neither sleep on it indefinitely nor spin on it, and guarantees 2 (on time), 3
//! (exactly once, nothing lost) and 7 (shutdown returns everything pending) must hold
//! around it; an idle service must go back to sleep.
//!
//! Public API only. Every timer is accounted for exactly: it ran once, or a `cancel`
//! returned `true` for it, or `shutdown` handed it back, and never two of these.
//! "Never early" is strict (callback start against `TimerHandle::deadline()`, the
//! deadline in effect after every reset). Lateness is measured at the callback's start
//! (pool latency included) and bounded by `LATE` = 50 ms in a release build (50 ticks
//! of 1 ms, generous for a shared 2-core VM with up to 16 busy producer threads), 1 s
//! in a debug build (see `LATE`).
//!
//! Load: one timer in 16 is due within 5 ms, the rest 40 s to 1 h ahead (they come
//! back from shutdown). Firehoses where every timer fires soon overloaded expiry and
//! the pool on 2 cores (callbacks 50–100 ms late with or without `Stall`, judged by
//! swapping it for an immediate retry in a scratch copy): that is throughput, not
//! the stall, and not the "normal load" of guarantee 2.
//!
//! Findings: every test passes (exact counts, never early, within `LATE`; idle
//! service threads scheduled 0 times in 500 ms). In a scratch copy with counters, the
//! firehoses hit `Park::Retry` 10^3–10^5 times each but the naps only 0–6 times: a
//! producer is rarely caught mid-push for long, so the nap stage is mostly covered by
//! the crate's own unit test, not by these.
//!
//! The tests take one lock, so they run one at a time under the parallel runner.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sharded_timer::{
    Callbacks, ManualClock, Routing, ScheduleError, ShardedTimer, TimerHandle, TimerId,
};

mod support;
use support::{joined_within, wait_until, Rng};

/// The lateness bound (callback start after the deadline in effect): 50 ms in a
/// release build. In a debug build (the README's `cargo test`, and the AddressSanitizer
/// step) 1 s: there the firehoses' 8–16 producers saturate both cores and the shard's
/// work per timer is several times a release build's, so lateness measures the queue
/// for a CPU, not the shard (guarantee 2 is for normal load). Measured, the inline
/// firehose's shard-side lateness with the whole file run in a debug build: 18–85 ms
/// with the library before the stall wait (5 runs), 28–85 ms after (4 runs), 75 and
/// 209 ms in two fresh-clone CI runs; at most 27 ms in release (the audit's 9 runs).
/// The debug bound still catches a lost wake-up or a shard that stops expiring;
/// `tests/audit_firehose.rs` holds expiry under a firehose to a tighter bound.
const LATE: Duration = if cfg!(debug_assertions) {
    Duration::from_secs(1)
} else {
    Duration::from_millis(50)
};
/// Bound on waiting for a condition that should take milliseconds.
const WAIT: Duration = Duration::from_secs(10);

/// One test at a time (2 shared cores).
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The machine's cores, as first seen (a pinned thread sees only its own).
fn cores() -> &'static [core_affinity::CoreId] {
    static IDS: std::sync::OnceLock<Vec<core_affinity::CoreId>> = std::sync::OnceLock::new();
    IDS.get_or_init(|| core_affinity::get_core_ids().unwrap_or_default())
}

/// Pins the calling thread to core `k` (modulo the cores); false if it cannot.
fn pin_to(k: usize) -> bool {
    let ids = cores();
    !ids.is_empty() && core_affinity::set_for_current(ids[k % ids.len()])
}

// ---------------------------------------------------------------------------------
// The book: what happened to each timer
// ---------------------------------------------------------------------------------

/// Per timer: how often its callback started, when it first did, and how often a
/// `cancel` returned `true` for it. Leaked (a few per test) so that a callback
/// captures a plain reference and touches no shared reference count.
struct Book {
    base: Instant,
    runs: Vec<AtomicU32>,
    /// Nanoseconds since `base` of the first start, plus one (0: never started).
    at_ns: Vec<AtomicU64>,
    cancelled: Vec<AtomicU32>,
}

/// Leaks `value` for the rest of the process (callbacks that may outlive a test's
/// frame reach it), kept reachable from a static so that LeakSanitizer (`.ci/run`'s
/// AddressSanitizer step) does not report it as lost.
fn kept<T: std::any::Any + Send + Sync>(value: T) -> &'static T {
    static KEPT: Mutex<Vec<&'static (dyn std::any::Any + Send + Sync)>> = Mutex::new(Vec::new());
    let value: &'static T = Box::leak(Box::new(value));
    KEPT.lock().unwrap_or_else(|e| e.into_inner()).push(value);
    value
}

impl Book {
    fn new(n: usize) -> &'static Book {
        kept(Book {
            base: Instant::now(),
            runs: (0..n).map(|_| AtomicU32::new(0)).collect(),
            at_ns: (0..n).map(|_| AtomicU64::new(0)).collect(),
            cancelled: (0..n).map(|_| AtomicU32::new(0)).collect(),
        })
    }

    /// The callback of timer `i`.
    fn callback(&'static self, i: usize) -> impl FnOnce() + Send + 'static {
        move || self.record(i)
    }

    fn record(&self, i: usize) {
        let ns = self.base.elapsed().as_nanos() as u64 + 1;
        let _ = self.at_ns[i].compare_exchange(0, ns, SeqCst, SeqCst);
        self.runs[i].fetch_add(1, SeqCst);
    }

    fn cancel(&self, i: usize, handle: &TimerHandle) {
        if handle.cancel() {
            self.cancelled[i].fetch_add(1, SeqCst);
        }
    }

    /// Timers whose callback started or whose cancel won, of the first `n`.
    fn settled(&self, n: usize) -> usize {
        (0..n).filter(|&i| self.is_settled(i)).count()
    }

    fn is_settled(&self, i: usize) -> bool {
        self.runs[i].load(SeqCst) + self.cancelled[i].load(SeqCst) > 0
    }

    /// Waits up to `WAIT` for every timer of `recs` due before `far` to settle;
    /// returns how many are due before `far` and how many of those did not settle.
    fn settle_short(&self, recs: &[Rec], far: Instant) -> (usize, usize) {
        let short: Vec<usize> = recs
            .iter()
            .filter(|rec| rec.deadline < far)
            .map(|rec| rec.i)
            .collect();
        wait_until(WAIT, || short.iter().all(|&i| self.is_settled(i)));
        let unsettled = short.iter().filter(|&&i| !self.is_settled(i)).count();
        (short.len(), unsettled)
    }

    /// Checks every timer of `recs` against the book and the
    /// timers `returned` by shutdown: exactly one outcome each, never early; returns
    /// (ran, cancelled, returned, max lateness, count over `late`).
    fn audit(
        &self,
        label: &str,
        recs: &[Rec],
        returned: &[(TimerId, Instant)],
        late: Duration,
    ) -> Outcome {
        let mut back: HashMap<TimerId, usize> = HashMap::new();
        for (id, _) in returned {
            *back.entry(*id).or_default() += 1;
        }
        let mut outcome = Outcome::default();
        let mut seen = 0;
        for &Rec { i, id, deadline } in recs {
            let runs = self.runs[i].load(SeqCst) as usize;
            let cancelled = self.cancelled[i].load(SeqCst) as usize;
            let returned = back.get(&id).copied().unwrap_or(0);
            seen += returned;
            assert_eq!(
                runs + cancelled + returned,
                1,
                "{label}: timer {i} ({id:?}) ran {runs}×, cancelled {cancelled}×, \
                 returned by shutdown {returned}×",
            );
            if runs == 1 {
                let at = self.base + Duration::from_nanos(self.at_ns[i].load(SeqCst) - 1);
                assert!(
                    at >= deadline,
                    "{label}: timer {i} started {:?} EARLY",
                    deadline - at
                );
                let lateness = at - deadline;
                outcome.max_late = outcome.max_late.max(lateness);
                if lateness > late {
                    outcome.over += 1;
                }
                outcome.ran += 1;
            }
            outcome.cancelled += cancelled;
            outcome.returned += returned;
        }
        assert_eq!(
            seen,
            returned.len(),
            "{label}: shutdown returned timers nobody scheduled"
        );
        outcome
    }
}

/// A timer as its producer saw it: its index in the book, its id, and the deadline in
/// effect after its producer's last successful reset.
struct Rec {
    i: usize,
    id: TimerId,
    deadline: Instant,
}

impl Rec {
    fn of(i: usize, handle: &TimerHandle) -> Rec {
        Rec {
            i,
            id: handle.id(),
            deadline: handle.deadline(),
        }
    }
}

impl Book {
    /// The lateness of those of `recs` that ran: (how many, max, how many over
    /// `late`), as an `Outcome`'s `ran`, `max_late` and `over`.
    fn lateness(&self, recs: &[Rec], late: Duration) -> Outcome {
        let mut outcome = Outcome::default();
        for rec in recs {
            let at_ns = self.at_ns[rec.i].load(SeqCst);
            if at_ns == 0 {
                continue;
            }
            let lateness = (self.base + Duration::from_nanos(at_ns - 1)) - rec.deadline;
            outcome.ran += 1;
            outcome.max_late = outcome.max_late.max(lateness);
            outcome.over += usize::from(lateness > late);
        }
        outcome
    }
}

#[derive(Debug, Default)]
struct Outcome {
    ran: usize,
    cancelled: usize,
    returned: usize,
    max_late: Duration,
    over: usize,
}

// ---------------------------------------------------------------------------------
// Firehoses
// ---------------------------------------------------------------------------------

/// What a firehose test varies.
#[derive(Clone, Copy, Debug)]
struct Setup {
    shards: usize,
    ring: usize,
    pin_shards: bool,
    routing: Routing,
    producers: usize,
    per_producer: usize,
    /// Where the producers run.
    pin: Pin,
    /// Out of 100: cancel the timer just scheduled / an older one, reset it earlier
    /// (a message) / later (a store).
    cancel_new: u64,
    cancel_old: u64,
    reset_earlier: u64,
    reset_later: u64,
    callbacks_inline: bool,
    /// The producer yields every this many timers (0: never), to be descheduled often.
    yield_every: usize,
    /// One timer in this many is due in 0–5 ms (a probe); the others 40 s to 1 h
    /// ahead, to load the rings and wheels without loading expiry and the pool
    /// beyond what a 2-core machine fires on time (they come back from shutdown).
    short_one_in: u64,
}

#[derive(Clone, Copy, Debug)]
enum Pin {
    None,
    /// Every producer on the first core (shard 0's, when shards are pinned).
    AllOnShardCore,
    /// Producer p on core p.
    Spread,
}

impl Setup {
    const fn base() -> Setup {
        Setup {
            shards: 1,
            ring: 2,
            pin_shards: false,
            routing: Routing::ByCore,
            producers: 8,
            per_producer: 250_000,
            pin: Pin::None,
            cancel_new: 0,
            cancel_old: 0,
            reset_earlier: 0,
            reset_later: 0,
            callbacks_inline: false,
            yield_every: 0,
            short_one_in: 16,
        }
    }

    fn build(&self, name: &str) -> ShardedTimer {
        let mut builder = ShardedTimer::builder()
            .shards(self.shards)
            .ring_capacity(self.ring)
            .pin_cores(self.pin_shards)
            .routing(self.routing)
            .thread_name(name);
        builder = if self.callbacks_inline {
            builder.callbacks(Callbacks::inline())
        } else {
            builder.executor_threads(2)
        };
        builder.build().expect("the service builds")
    }
}

/// How long a firehose runs at most (each producer also stops at its cap).
const FIREHOSE: Duration = Duration::from_millis(1000);

/// One producer: schedules timers `range` (until `until`), one in
/// `setup.short_one_in` due in 0–5 ms, the others 40 s to 1 h ahead, cancelling and
/// resetting as `setup` says; returns what it scheduled.
fn produce(
    timer: &ShardedTimer,
    book: &'static Book,
    setup: &Setup,
    p: usize,
    range: std::ops::Range<usize>,
    until: Instant,
) -> Vec<Rec> {
    match setup.pin {
        Pin::None => {}
        Pin::AllOnShardCore => assert!(pin_to(0)),
        Pin::Spread => assert!(pin_to(p)),
    }
    let mut rng = Rng::new(p as u64 * 7919 + range.start as u64);
    let mut recs = Vec::with_capacity(range.len());
    let mut recent: VecDeque<(usize, TimerHandle)> = VecDeque::with_capacity(17);
    for (n, i) in range.enumerate() {
        if n % 64 == 0 && Instant::now() >= until {
            break;
        }
        let delay = if rng.below(setup.short_one_in) == 0 {
            Duration::from_micros(rng.below(5_000))
        } else {
            // At least 40 s: a quarter of it (an earlier reset) is still far.
            Duration::from_secs(40) + Duration::from_millis(rng.below(3_600_000))
        };
        let handle = timer
            .schedule(delay, book.callback(i))
            .expect("the service runs");
        let roll = rng.below(100);
        if roll < setup.cancel_new {
            book.cancel(i, &handle);
        } else if roll < setup.cancel_new + setup.reset_earlier {
            let _ = handle.reset(delay / 4);
        } else if roll < setup.cancel_new + setup.reset_earlier + setup.reset_later {
            let _ = handle.reset(delay + Duration::from_micros(rng.below(3_000)));
        }
        recs.push(Rec::of(i, &handle));
        if setup.cancel_old > 0 {
            if rng.below(100) < setup.cancel_old && recent.len() == 16 {
                let (j, old) = &recent[rng.below(16) as usize];
                book.cancel(*j, old);
            }
            recent.push_back((i, handle));
            if recent.len() > 16 {
                recent.pop_front();
            }
        }
        if setup.yield_every > 0 && n % setup.yield_every == setup.yield_every - 1 {
            std::thread::yield_now();
        }
    }
    recs
}

/// Runs a firehose as `setup` says, waits for every timer to fire, then shuts down
/// and audits. Returns the outcome.
fn firehose(label: &str, setup: Setup) -> Outcome {
    let _serial = serial();
    let timer = setup.build("stl");
    let book = Book::new(setup.producers * setup.per_producer);
    let started = Instant::now();
    let recs = run_producers(&timer, book, &setup, started + FIREHOSE);
    let produced = started.elapsed();
    let n = recs.len();
    // Every short deadline is at most 8 ms after its producer's last schedule: each
    // must fire (or have been cancelled) without shutdown's help. The far ones
    // come back from shutdown.
    let (short, unsettled_short) = book.settle_short(&recs, started + Duration::from_secs(5));
    let settled_after = started.elapsed();
    let stats = timer.stats();
    let returned = shut_down_within(&timer, WAIT);
    let outcome = book.audit(label, &recs, &returned, LATE);
    eprintln!(
        "{label}: {n} timers ({} short) in {produced:?} (short settled at \
         {settled_after:?}): {outcome:?}; shard-side lateness max {:?}, ring-full waits {}",
        short,
        stats.lateness.max(),
        stats.ring_full_waits
    );
    assert_eq!(
        unsettled_short, 0,
        "{label}: {unsettled_short} of {short} short timers neither fired nor were cancelled \
         within {WAIT:?} of the end of the firehose (they came back from shutdown: a lost \
         wake-up)"
    );
    assert_eq!(
        outcome.ran + outcome.cancelled + outcome.returned,
        n,
        "{label}: every timer accounted for"
    );
    assert!(
        outcome.ran <= short,
        "{label}: a far timer ran (it would have been early)"
    );
    assert_eq!(
        outcome.over, 0,
        "{label}: {} timers started more than {LATE:?} late (max {:?})",
        outcome.over, outcome.max_late
    );
    outcome
}

/// Runs `setup.producers` producers until `until`; returns what they scheduled.
fn run_producers(
    timer: &ShardedTimer,
    book: &'static Book,
    setup: &Setup,
    until: Instant,
) -> Vec<Rec> {
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..setup.producers)
            .map(|p| {
                let range = p * setup.per_producer..(p + 1) * setup.per_producer;
                scope.spawn(move || produce(timer, book, setup, p, range, until))
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    })
}

/// Shuts `timer` down from another thread, failing the test if that takes longer
/// than `bound`; returns the id and deadline of each timer handed back.
fn shut_down_within(timer: &ShardedTimer, bound: Duration) -> Vec<(TimerId, Instant)> {
    let timer = timer.clone();
    joined_within("shutdown", bound, move || {
        timer
            .shutdown()
            .into_iter()
            .map(|u| (u.id(), u.deadline()))
            .collect()
    })
}

/// One shard, 2-slot rings, 8 unpinned producers on 2 cores: the slot at the ring's
/// head is often reserved by a producer that was preempted before writing it.
#[test]
fn unpinned_producers_on_two_slot_rings_lose_nothing_and_fire_on_time() {
    firehose("unpinned/ring 2", Setup::base());
}

/// The scenario `Stall` is for: the shard pinned to core 0 and every producer pinned
/// there too, so that a producer preempted between its reservation and its write can
/// only run when the shard gives up the core.
#[test]
fn producers_pinned_to_the_shards_own_core_are_let_run() {
    if cores().len() < 2 {
        return;
    }
    firehose(
        "all on shard core/ring 2",
        Setup {
            pin_shards: true,
            pin: Pin::AllOnShardCore,
            producers: 6,
            ..Setup::base()
        },
    );
}

/// As above with more producers than cores that yield often (each yield is a chance
/// to be descheduled with the next reservation pending), and 4-slot rings.
#[test]
fn producers_descheduled_often_lose_nothing() {
    firehose(
        "yielding/ring 4",
        Setup {
            ring: 4,
            producers: 12,
            yield_every: 3,
            pin_shards: true,
            pin: Pin::Spread,
            ..Setup::base()
        },
    );
}

/// Oversubscribed: 16 producers on 2 cores, so a producer preempted mid-push waits
/// several slices for a core. (With 32 the shard's own share of the CPU, 1/33,
/// made it 18–44 ms late with or without `Stall`: overload, not the stall.)
#[test]
fn sixteen_producers_on_two_cores_lose_nothing_and_fire_on_time() {
    firehose(
        "16 producers/ring 2",
        Setup {
            producers: 16,
            per_producer: 120_000,
            cancel_old: 10,
            reset_earlier: 10,
            ..Setup::base()
        },
    );
}

/// Two shards by id (every producer pushes onto both), with cancel and reset storms:
/// the message ring gets reserved-unwritten slots too (cancels of filed timers and
/// earlier resets are messages).
#[test]
fn cancel_and_reset_storms_on_two_shards_keep_every_count_exact() {
    let outcome = firehose(
        "storm/2 shards by id/ring 2",
        Setup {
            shards: 2,
            routing: Routing::ById,
            producers: 8,
            cancel_new: 10,
            cancel_old: 30,
            reset_earlier: 15,
            reset_later: 15,
            ..Setup::base()
        },
    );
    assert!(outcome.cancelled > 0 && outcome.ran > 0);
}

/// As above with pinned shards and producers spread over the cores, by core.
#[test]
fn cancel_and_reset_storms_pinned_by_core_keep_every_count_exact() {
    if cores().len() < 2 {
        return;
    }
    firehose(
        "storm/2 pinned shards by core/ring 2",
        Setup {
            shards: 2,
            pin_shards: true,
            pin: Pin::Spread,
            producers: 8,
            cancel_new: 10,
            cancel_old: 30,
            reset_earlier: 15,
            reset_later: 15,
            ..Setup::base()
        },
    );
}

/// Inline callbacks: the shard thread itself runs every callback, so a stalled shard
/// would show directly in callback lateness.
#[test]
fn inline_callbacks_under_a_firehose_fire_on_time() {
    firehose(
        "inline/ring 2",
        Setup {
            callbacks_inline: true,
            cancel_old: 20,
            reset_earlier: 10,
            ..Setup::base()
        },
    );
}

/// The main job's scenario (issue 41 in `park.rs`): pool workers re-arming repeating
/// timers on the shard's own core while producers there push too. Every run starts
/// never early against its grid point, and consecutive runs of a heartbeat are never
/// more than `LATE` beyond a period apart while the firehose runs.
#[test]
fn repeating_timers_rearmed_by_workers_on_the_shards_core_keep_their_beat() {
    if cores().len() < 2 {
        return;
    }
    let _serial = serial();
    let timer = ShardedTimer::builder()
        .shards(1)
        .ring_capacity(2)
        .pin_cores(true)
        .executor_threads(1)
        .thread_name("stl")
        .build()
        .unwrap();
    const BEATS: usize = 16;
    const PERIOD: Duration = Duration::from_millis(1);
    struct Beat {
        start: Instant,
        runs: AtomicUsize,
        early: AtomicUsize,
        last_ns: AtomicU64,
        max_gap_ns: AtomicU64,
    }
    let base = Instant::now();
    let beats: Vec<Arc<Beat>> = (0..BEATS)
        .map(|_| {
            Arc::new(Beat {
                start: timer.now(),
                runs: AtomicUsize::new(0),
                early: AtomicUsize::new(0),
                last_ns: AtomicU64::new(0),
                max_gap_ns: AtomicU64::new(0),
            })
        })
        .collect();
    let handles: Vec<TimerHandle> = beats
        .iter()
        .map(|beat| {
            let beat = beat.clone();
            timer
                .schedule_repeating(PERIOD, move || {
                    let now = Instant::now();
                    let r = beat.runs.fetch_add(1, SeqCst) + 1;
                    if now < beat.start + PERIOD * r as u32 {
                        beat.early.fetch_add(1, SeqCst);
                    }
                    let ns = now.duration_since(base).as_nanos() as u64;
                    let last = beat.last_ns.swap(ns, SeqCst);
                    if last > 0 {
                        beat.max_gap_ns.fetch_max(ns.saturating_sub(last), SeqCst);
                    }
                })
                .unwrap()
        })
        .collect();
    let setup = Setup {
        pin_shards: true,
        pin: Pin::AllOnShardCore,
        producers: 4,
        yield_every: 1,
        ..Setup::base()
    };
    let book = Book::new(setup.producers * setup.per_producer);
    let produced = run_producers(&timer, book, &setup, Instant::now() + FIREHOSE);
    let (_, unsettled) = book.settle_short(&produced, Instant::now() + Duration::from_secs(5));
    for handle in &handles {
        assert!(
            handle.cancel(),
            "a repeating timer stays pending until cancelled"
        );
    }
    let stats = timer.stats();
    let returned = shut_down_within(&timer, WAIT);
    let outcome = book.audit("beats + firehose", &produced, &returned, LATE);
    let runs: usize = beats.iter().map(|b| b.runs.load(SeqCst)).sum();
    let early: usize = beats.iter().map(|b| b.early.load(SeqCst)).sum();
    let max_gap = beats
        .iter()
        .map(|b| Duration::from_nanos(b.max_gap_ns.load(SeqCst)))
        .max()
        .unwrap();
    eprintln!(
        "beats + firehose: {outcome:?}; {runs} beats, max gap {max_gap:?}; shard-side \
         lateness max {:?}",
        stats.lateness.max()
    );
    assert_eq!(unsettled, 0, "every short one-shot settled");
    assert_eq!(early, 0, "no heartbeat ran before its grid point");
    assert!(runs >= BEATS, "every heartbeat ran");
    assert_eq!(outcome.over, 0, "one-shots over {LATE:?}: {outcome:?}");
    assert!(
        max_gap <= PERIOD + LATE,
        "a heartbeat waited {max_gap:?} between runs"
    );
}

// ---------------------------------------------------------------------------------
// Shutdown mid-push
// ---------------------------------------------------------------------------------

/// Many producers schedule (and cancel) without pause onto 2-slot rings while another
/// thread shuts the service down: shutdown returns within 10 s, and every timer whose
/// `schedule` returned `Ok` ran once, was cancelled, or came back — exactly one.
fn shutdown_mid_push(label: &str, shards: usize, pin: bool, delay_us: u64) {
    let _serial = serial();
    let timer = ShardedTimer::builder()
        .shards(shards)
        .ring_capacity(2)
        .pin_cores(pin)
        .routing(Routing::ById)
        .executor_threads(2)
        .thread_name("stl")
        .build()
        .unwrap();
    const PRODUCERS: usize = 8;
    const CAP: usize = 400_000;
    let book = Book::new(PRODUCERS * CAP);
    let go = AtomicBool::new(false);
    let (recs, returned, fired_at_return, took) = std::thread::scope(|scope| {
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (timer, go) = (&timer, &go);
                scope.spawn(move || {
                    if pin {
                        pin_to(p);
                    }
                    let mut rng = Rng::new(p as u64 + 99);
                    let mut recs = Vec::new();
                    while !go.load(SeqCst) {
                        std::hint::spin_loop();
                    }
                    for i in p * CAP..(p + 1) * CAP {
                        let delay = Duration::from_micros(rng.below(delay_us));
                        match timer.schedule(delay, book.callback(i)) {
                            Ok(handle) => {
                                if rng.below(8) == 0 {
                                    book.cancel(i, &handle);
                                }
                                recs.push(Rec::of(i, &handle));
                            }
                            Err(ScheduleError::Shutdown) => return (recs, true),
                            Err(other) => panic!("{other:?}"),
                        }
                    }
                    (recs, false)
                })
            })
            .collect();
        go.store(true, SeqCst);
        std::thread::sleep(Duration::from_millis(60));
        let started = Instant::now();
        let returned = shut_down_within(&timer, WAIT);
        let took = started.elapsed();
        let fired_at_return: u32 = book.runs.iter().map(|r| r.load(SeqCst)).sum();
        let mut recs = Vec::new();
        for producer in producers {
            let (mine, refused) = producer.join().unwrap();
            assert!(refused, "{label}: a producer stopped before shutdown");
            recs.extend(mine);
        }
        (recs, returned, fired_at_return, took)
    });
    // Nothing fires after shutdown returned (callbacks handed over finished first).
    std::thread::sleep(Duration::from_millis(20));
    let fired_later: u32 = book.runs.iter().map(|r| r.load(SeqCst)).sum();
    let outcome = book.audit(label, &recs, &returned, Duration::MAX);
    eprintln!(
        "{label}: {} scheduled, shutdown took {took:?}: {outcome:?}",
        recs.len()
    );
    assert_eq!(
        fired_later, fired_at_return,
        "{label}: callbacks ran after shutdown returned"
    );
    assert!(outcome.returned > 0, "{label}: some timers were pending");
}

#[test]
fn shutdown_while_producers_push_returns_every_pending_timer() {
    shutdown_mid_push("shutdown mid-push/1 shard", 1, false, 50_000);
}

#[test]
fn shutdown_while_pinned_producers_push_onto_two_shards_returns_every_pending_timer() {
    if cores().len() < 2 {
        return;
    }
    shutdown_mid_push("shutdown mid-push/2 pinned shards", 2, true, 2_000);
}

// ---------------------------------------------------------------------------------
// Idle
// ---------------------------------------------------------------------------------

/// (name, CPU ns, times scheduled in) of each thread of this process whose name starts
/// with `prefix`.
fn schedstat_of(prefix: &str) -> Vec<(String, u64, u64)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").into_iter().flatten() {
        let Ok(task) = task else { continue };
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let comm = comm.trim();
        if !comm.starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        let fields: Vec<u64> = stat
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        if fields.len() == 3 {
            found.push((comm.to_string(), fields[0], fields[2]));
        }
    }
    found.sort();
    found
}

/// After a firehose onto 2-slot rings (the shards stalled on reserved slots many
/// times), the service goes back to sleep: over 500 ms of idleness its shard and
/// worker threads use under 5 ms of CPU and are scheduled in at most a few times
/// each. Run twice: everything fired, and with far-future timers still pending.
#[test]
fn the_service_sleeps_once_a_firehose_ends() {
    let _serial = serial();
    for keep_pending in [false, true] {
        let timer = ShardedTimer::builder()
            .shards(2)
            .ring_capacity(2)
            .pin_cores(false)
            .executor_threads(2)
            .thread_name("idl")
            .build()
            .unwrap();
        assert!(wait_until(WAIT, || schedstat_of("idl-s").len() == 2));
        const PRODUCERS: usize = 6;
        const PER: usize = 10_000;
        let book = Book::new(PRODUCERS * PER);
        let far = if keep_pending { 100 } else { 0 };
        std::thread::scope(|scope| {
            for p in 0..PRODUCERS {
                let timer = &timer;
                scope.spawn(move || {
                    let mut rng = Rng::new(p as u64);
                    for i in p * PER..(p + 1) * PER {
                        let delay = if (i % PER) < far {
                            Duration::from_secs(3600)
                        } else {
                            Duration::from_micros(rng.below(3_000))
                        };
                        // Handles dropped: fire-and-forget.
                        drop(timer.schedule(delay, book.callback(i)).unwrap());
                    }
                });
            }
        });
        let expected = PRODUCERS * (PER - far);
        assert!(
            wait_until(WAIT, || book.settled(PRODUCERS * PER) == expected),
            "every short timer fired ({} of {expected})",
            book.settled(PRODUCERS * PER)
        );
        // Settle: the last turns, parks and worker parks.
        std::thread::sleep(Duration::from_millis(50));
        let before = schedstat_of("idl-");
        std::thread::sleep(Duration::from_millis(500));
        let after = schedstat_of("idl-");
        assert_eq!(before.len(), after.len());
        let mut report = Vec::new();
        let mut cpu = 0;
        let mut worst_switches = 0;
        for ((name, cpu0, in0), (name1, cpu1, in1)) in before.iter().zip(&after) {
            assert_eq!(name, name1);
            cpu += cpu1 - cpu0;
            worst_switches = worst_switches.max(in1 - in0);
            report.push(format!(
                "{name}: {} µs, {}×",
                (cpu1 - cpu0) / 1000,
                in1 - in0
            ));
        }
        eprintln!("idle (pending far timers: {keep_pending}): {report:?}");
        assert!(
            cpu < 5_000_000,
            "the service used {} µs of CPU over 500 ms of idleness: {report:?}",
            cpu / 1000
        );
        assert!(
            worst_switches <= 3,
            "a service thread was scheduled in {worst_switches}× while idle: {report:?}"
        );
        let returned = joined_within("shutdown", WAIT, move || timer.shutdown().len());
        assert_eq!(returned, PRODUCERS * far);
    }
}

// ---------------------------------------------------------------------------------
// Manual clock
// ---------------------------------------------------------------------------------

/// Producers push onto 2-slot rings of a manual-clock service while the test advances
/// the clock in 1 ms steps: every `advance` returns promptly (the slowest bounded by
/// 1 s, the whole run by 8 s), every timer fires exactly once, never before its
/// deadline on the manual clock, and by the end of the `advance` that passed it
/// (checked once the producers stop).
#[test]
fn advance_is_not_slowed_by_producers_mid_push() {
    let _serial = serial();
    let clock = ManualClock::new();
    let timer = ShardedTimer::builder()
        .shards(2)
        .ring_capacity(2)
        .pin_cores(false)
        .routing(Routing::ById)
        .executor_threads(2)
        .thread_name("man")
        .clock(clock.clone())
        .build()
        .unwrap();
    const PRODUCERS: usize = 6;
    const PER: usize = 5_000;
    let n = PRODUCERS * PER;
    struct Seen {
        runs: Vec<AtomicU32>,
        early: AtomicUsize,
    }
    let seen: &'static Seen = kept(Seen {
        runs: (0..n).map(|_| AtomicU32::new(0)).collect(),
        early: AtomicUsize::new(0),
    });
    let stop = AtomicBool::new(false);
    let (handles, slowest, steps) = std::thread::scope(|scope| {
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (timer, clock) = (&timer, &clock);
                scope.spawn(move || {
                    let mut rng = Rng::new(p as u64 + 5);
                    let mut handles = Vec::with_capacity(PER);
                    for i in p * PER..(p + 1) * PER {
                        let delay = Duration::from_micros(rng.below(5_000));
                        let deadline = timer.now() + delay;
                        let clock = clock.clone();
                        let handle = timer
                            .schedule_at(deadline, move || {
                                if clock.now() < deadline {
                                    seen.early.fetch_add(1, SeqCst);
                                }
                                seen.runs[i].fetch_add(1, SeqCst);
                            })
                            .unwrap();
                        handles.push(handle);
                    }
                    handles
                })
            })
            .collect();
        let started = Instant::now();
        let mut slowest = Duration::ZERO;
        let mut steps = 0;
        while !producers.iter().all(|t| t.is_finished()) && !stop.load(SeqCst) {
            let step = Instant::now();
            clock.advance(Duration::from_millis(1));
            slowest = slowest.max(step.elapsed());
            steps += 1;
            assert!(
                started.elapsed() < Duration::from_secs(8),
                "the producers and {steps} advances took over 8 s"
            );
        }
        stop.store(true, SeqCst);
        let handles: Vec<TimerHandle> = producers
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        (handles, slowest, steps)
    });
    // Everything still pending is at most 5 ms ahead.
    let last = joined_within("the last advance", WAIT, {
        let clock = clock.clone();
        move || {
            let step = Instant::now();
            clock.advance(Duration::from_millis(10));
            step.elapsed()
        }
    });
    let unfired: Vec<usize> = (0..n).filter(|&i| seen.runs[i].load(SeqCst) != 1).collect();
    eprintln!(
        "manual: {steps} advances while pushing, slowest {slowest:?}, last {last:?}, \
         not exactly once: {}",
        unfired.len()
    );
    assert!(
        unfired.is_empty(),
        "{} timers did not run exactly once by the advance past their deadline, e.g. {:?}",
        unfired.len(),
        unfired
            .iter()
            .take(5)
            .map(|&i| (i, seen.runs[i].load(SeqCst), handles[i].state()))
            .collect::<Vec<_>>()
    );
    assert_eq!(seen.early.load(SeqCst), 0, "a timer fired early");
    assert!(
        slowest < Duration::from_secs(1),
        "an advance took {slowest:?}"
    );
    assert_eq!(timer.shutdown().len(), 0);
}

// ---------------------------------------------------------------------------------
// A producer that is almost never scheduled
// ---------------------------------------------------------------------------------

/// Sets the calling thread's nice value (Linux: per thread).
fn set_nice(nice: i32) -> bool {
    // SAFETY: gettid takes no arguments and only returns the caller's thread id.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::id_t;
    // SAFETY: setpriority on the calling thread's own id changes only its nice value.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) == 0 }
}

/// A producer at nice 19 shares the shard's core with a CPU-bound thread at normal
/// priority, so once preempted it waits long for the core (EEVDF gives it about 1.5 %
/// of it, in slices far apart). A ring slot it reserved and has not written would
/// block every value behind it (the ring is FIFO), and the shard's naps would hand
/// the core to the CPU-bound thread, not to it. Meanwhile two normal-priority
/// producers on the other core schedule without pause; those that find the token held
/// go by the ring. Guarantee 2: their short timers start within `LATE`. Guarantee 3:
/// every timer, the niced producer's included, runs once or comes back from shutdown,
/// never early. (Probabilistic: the niced producer is rarely caught mid-push; its own
/// timers were up to 150 ms late, the others' at most 6–23 ms.)
#[test]
fn a_producer_starved_of_cpu_mid_push_does_not_hold_other_threads_timers() {
    if cores().len() < 2 {
        return;
    }
    let _serial = serial();
    let timer = ShardedTimer::builder()
        .shards(1)
        .ring_capacity(2)
        .pin_cores(true)
        .executor_threads(1)
        .thread_name("hol")
        .build()
        .unwrap();
    assert!(wait_until(WAIT, || schedstat_of("hol-s0").len() == 1));
    let setup = Setup {
        producers: 2,
        per_producer: 1_500_000,
        pin: Pin::None,
        ..Setup::base()
    };
    const NICED: usize = 4_000_000;
    let book = Book::new(setup.producers * setup.per_producer + NICED);
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let cpu0 = schedstat_of("hol-s0")[0].1;
    let (mut recs, niced_recs, shard_cpu) = std::thread::scope(|scope| {
        let (timer, stop, setup) = (&timer, &stop, &setup);
        // The CPU-bound thread on the shard's core.
        scope.spawn(move || {
            assert!(pin_to(0));
            while !stop.load(SeqCst) {
                std::hint::spin_loop();
            }
        });
        // The niced producer on the shard's core.
        let niced = scope.spawn(move || {
            assert!(pin_to(0));
            assert!(set_nice(19));
            let first = setup.producers * setup.per_producer;
            let mut recs = Vec::new();
            for i in first..first + NICED {
                if stop.load(SeqCst) {
                    break;
                }
                let handle = timer
                    .schedule(Duration::from_millis(1), book.callback(i))
                    .unwrap();
                recs.push(Rec::of(i, &handle));
            }
            recs
        });
        // The normal producers, on the other core.
        let producers: Vec<_> = (0..setup.producers)
            .map(|p| {
                let range = p * setup.per_producer..(p + 1) * setup.per_producer;
                scope.spawn(move || {
                    assert!(pin_to(1));
                    produce(timer, book, setup, p, range, started + FIREHOSE)
                })
            })
            .collect();
        let recs: Vec<Rec> = producers
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let shard_cpu = schedstat_of("hol-s0")[0].1 - cpu0;
        stop.store(true, SeqCst);
        (recs, niced.join().unwrap(), shard_cpu)
    });
    let elapsed = started.elapsed();
    let normal = recs.len();
    recs.extend(niced_recs);
    let (_, unsettled) = book.settle_short(&recs, started + Duration::from_secs(5));
    let stats = timer.stats();
    let returned = shut_down_within(&timer, WAIT);
    let all = book.audit("starved producer", &recs, &returned, Duration::MAX);
    let (normal_recs, niced_recs) = recs.split_at(normal);
    let niced = book.lateness(niced_recs, LATE);
    let outcome = book.lateness(normal_recs, LATE);
    eprintln!(
        "starved producer: {all:?}; {} pushed by it ({niced:?}); the others' {normal}: \
         {outcome:?}; shard-side lateness max {:?}; shard CPU {} ms of {elapsed:?}",
        niced_recs.len(),
        stats.lateness.max(),
        shard_cpu / 1_000_000
    );
    assert_eq!(unsettled, 0, "every short timer settled");
    assert_eq!(
        outcome.over, 0,
        "{} of {normal} timers of normal-priority producers started over {LATE:?} late \
         (max {:?})",
        outcome.over, outcome.max_late
    );
}
