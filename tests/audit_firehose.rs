//! Outside audit of guarantee 2's newest clause: "a callback starts within one tick
//! (plus wake-up latency) after its deadline, also after any sequence of resets, and
//! while other threads schedule without pause (a shard's turn waits for at most one
//! timer's filing per producer, never for the stream of them)".
//!
//! Public API only. Each test runs a *firehose* (2-3 threads that schedule, cancel or
//! reset without pause for a fixed wall-clock time) and, meanwhile, *probes*: timers
//! due a little later, whose callbacks record when they started. The other guarantees
//! are checked under the same load: never early, exactly once, nothing lost, `cancel`
//! returning `true` iff the callback never runs, `shutdown` handing back every pending
//! timer, and `Stats`' identities at quiescence.
//!
//! # Why the bounds catch a starved shard
//!
//! A firehose lasts `FIREHOSE` = 1.5 s (the pure-schedule one until a memory cap of
//! 4.5 M timers, 230-450 ms here). Probes are scheduled every `PROBE_EVERY` = 2 ms, due
//! `PROBE_LEAD` = 20 ms later. A probe is judged only if its deadline falls at least
//! `MARGIN` = 150 ms before the firehose ends (the first producer stops), and at least
//! `MIN_JUDGED` = 20 probes must be judged (a 1.5 s firehose judges ~600). A shard
//! whose turn waited for the stream of filings (issue 41) would fire a judged probe
//! only after the firehose ends, i.e. at least 150 ms late (most of them 0.5-1.4 s),
//! twice the `LATE` = 75 ms bound and more, which itself is 75 ticks of 1 ms: one tick
//! plus generous wake-up latency on a 2-core machine with 3-6 busy threads and another
//! engineer's load. (The control test, CPU burners instead of a firehose, measures the
//! machine's own latency: shard-side max 2-6 ms, callback start max 5-16 ms; but in
//! one of ~8 runs it saw a 214 ms stall of the whole process. So a *single* cluster
//! of late probes that all start at one instant, in one run of a plain-thread
//! firehose test, may be the machine; the `FAILED` tests failed in every run, each late
//! probe starting at the moment the long callback returns.)
//!
//! The tests take one global lock, so they run one at a time even under the default
//! parallel test runner (the machine has 2 cores).
//!
//! # Findings
//!
//! The firehoses from plain threads (schedule, schedule+cancel, reset earlier, mixed,
//! pure schedule, 2-slot rings, pool callbacks, a stuck shard, a repeating timer,
//! `max_pending`, shutdown mid-firehose) all pass: the probes start within the bound
//! and every count agrees. What failed (the tests marked `FAILED` below) was a firehose
//! *from inside a long inline callback* onto another shard: a `schedule`, or an
//! earlier `reset`, that finds the other shard's ring full while its token is busy
//! is deferred until the callback returns, so that timer is late by the rest of the
//! callback's run, though its own shard is healthy and on time (0.3-1.5 s against the
//! 50 ms bound, in every run).
//!
//! Fixed since: a shard thread's later pushes and direct operations retry its deferred
//! pushes (`own::retry_deferred_after_push`), so a callback that keeps pushing
//! delivers them within its next push. The `FAILED` tests below pass now, and fail
//! again with that retry turned off. A callback that defers a push and then stops
//! pushing still holds it until its loop's next turn (documented there).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sharded_timer::{Callbacks, ScheduleError, ShardedTimer, Stats, TimerHandle, TimerState};

mod support;
use support::wait_until;

/// How long each firehose runs.
const FIREHOSE: Duration = Duration::from_millis(1500);
/// A judged probe is due at least this long before the firehose ends.
const MARGIN: Duration = Duration::from_millis(150);
/// At least this many probes must be judged for a test to mean anything.
const MIN_JUDGED: usize = 20;
/// The lateness bound: one 1 ms tick plus generous wake-up latency (times
/// `AUDIT_LATENESS_SCALE`, see `late`).
const LATE: Duration = Duration::from_millis(75);
/// The bound for timers scheduled or reset from inside a long inline callback onto
/// another, busy shard (the tests that failed before `own::retry_deferred_after_push`):
/// a push deferred there goes with the callback's next push that finds room, which on
/// a 2-core CI machine in a debug build took up to 67 ms once (3 of 5,000 probes).
/// Before the fix every run had probes 0.3-1.5 s late, so 200 ms still tells the two
/// apart.
const CALLBACK_LATE: Duration = Duration::from_millis(200);

/// How much slower than a plain build this one runs, from `AUDIT_LATENESS_SCALE`
/// (default 1): `.ci/run` sets 4 for its AddressSanitizer step, whose instrumented
/// build stalled a plain-thread test's probes by 65 ms once. Lateness there says
/// little; memory errors and the counts are what that step is for.
fn scale() -> u32 {
    std::env::var("AUDIT_LATENESS_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// `LATE`, scaled.
fn late() -> Duration {
    LATE * scale()
}

/// `CALLBACK_LATE`, scaled.
fn callback_late() -> Duration {
    CALLBACK_LATE * scale()
}
/// Probes are due this long after they are scheduled.
const PROBE_LEAD: Duration = Duration::from_millis(20);
/// A probe is scheduled every this long.
const PROBE_EVERY: Duration = Duration::from_millis(2);
/// Far enough never to come during a test.
const HOUR: Duration = Duration::from_secs(3600);
/// Generous bound on waiting for a condition.
const WAIT: Duration = Duration::from_secs(10);

/// One test at a time (2 shared cores).
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A `'static` counter (leaked: a few per test), so that firehose callbacks capture
/// 8 bytes and touch no shared reference count when they are made. Each is kept in a
/// static list too, so that LeakSanitizer (`.ci/run`'s AddressSanitizer step) sees
/// them reachable rather than reporting the test's own leak.
fn counter() -> &'static AtomicU64 {
    static KEPT: Mutex<Vec<&'static AtomicU64>> = Mutex::new(Vec::new());
    let counter: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    KEPT.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(counter);
    counter
}

/// Counts drops of the tokens it hands out.
#[derive(Clone, Default)]
struct DropCounter(Arc<AtomicU64>);
struct DropToken(Arc<AtomicU64>);
impl DropCounter {
    fn token(&self) -> DropToken {
        DropToken(self.0.clone())
    }
    fn dropped(&self) -> u64 {
        self.0.load(SeqCst)
    }
}
impl Drop for DropToken {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// Pins the calling thread to the `k`-th core of the process's cores (as first seen:
/// a pinned thread sees only its own core).
fn pin_to(k: usize) -> bool {
    static IDS: std::sync::OnceLock<Vec<core_affinity::CoreId>> = std::sync::OnceLock::new();
    let ids = IDS.get_or_init(|| core_affinity::get_core_ids().unwrap_or_default());
    if ids.len() < 2 {
        return false;
    }
    core_affinity::set_for_current(ids[k % ids.len()])
}

// ---------------------------------------------------------------------------------
// Probes
// ---------------------------------------------------------------------------------

/// One probe: its deadline, the instants its callback started (one, if exactly once).
struct Probe {
    /// The deadline in effect (the last successful reset's).
    deadline: Mutex<Instant>,
    runs: Mutex<Vec<Instant>>,
    what: String,
}

#[derive(Default)]
struct Probes {
    list: Mutex<Vec<Arc<Probe>>>,
}

impl Probes {
    /// A new probe due at `deadline`, and the callback that records it.
    fn make(
        &self,
        deadline: Instant,
        what: String,
    ) -> (Arc<Probe>, impl FnOnce() + Send + 'static) {
        let probe = Arc::new(Probe {
            deadline: Mutex::new(deadline),
            runs: Mutex::new(Vec::new()),
            what,
        });
        self.list.lock().unwrap().push(probe.clone());
        let recorder = probe.clone();
        (probe, move || {
            let now = Instant::now();
            recorder.runs.lock().unwrap().push(now);
        })
    }

    fn all_fired(&self) -> bool {
        self.list
            .lock()
            .unwrap()
            .iter()
            .all(|probe| !probe.runs.lock().unwrap().is_empty())
    }

    /// Waits for every probe, then checks: each ran exactly once, never early, and
    /// each due by `judged_until` within `LATE`. Returns (judged, max lateness of the
    /// judged ones, a summary).
    fn judge(&self, judged_until: Instant, label: &str) -> (usize, Duration) {
        match self.verdict(judged_until, label) {
            Ok(result) => result,
            Err(failure) => panic!("{failure}"),
        }
    }

    /// As [`judge`](Self::judge), but returns the lateness failure instead of panicking
    /// (never early and exactly once still panic at once), so that a test can check
    /// its other guarantees first.
    fn verdict(&self, judged_until: Instant, label: &str) -> Result<(usize, Duration), String> {
        self.verdict_within(judged_until, label, late())
    }

    /// As `verdict`, with lateness bound `bound`.
    fn verdict_within(
        &self,
        judged_until: Instant,
        label: &str,
        bound: Duration,
    ) -> Result<(usize, Duration), String> {
        let fired = wait_until(WAIT, || self.all_fired());
        let list = self.list.lock().unwrap();
        let mut judged = 0;
        let mut worst = Duration::ZERO;
        let mut late = Vec::new();
        let mut lateness_all = Vec::new();
        for probe in list.iter() {
            let runs = probe.runs.lock().unwrap().clone();
            assert!(
                fired || !runs.is_empty(),
                "{label}: probe {} (due {:?} before the firehose ended) never ran within {WAIT:?}",
                probe.what,
                judged_until.saturating_duration_since(*probe.deadline.lock().unwrap()),
            );
            assert_eq!(
                runs.len(),
                1,
                "{label}: probe {} ran {} times",
                probe.what,
                runs.len()
            );
            let at = runs[0];
            let deadline = *probe.deadline.lock().unwrap();
            assert!(
                at >= deadline,
                "{label}: probe {} ran {:?} EARLY",
                probe.what,
                deadline - at
            );
            let lateness = at - deadline;
            lateness_all.push(lateness);
            if deadline <= judged_until {
                judged += 1;
                worst = worst.max(lateness);
                if lateness > bound {
                    late.push(format!("{} {:?} late", probe.what, lateness));
                }
            }
        }
        lateness_all.sort();
        let p50 = lateness_all
            .get(lateness_all.len() / 2)
            .copied()
            .unwrap_or_default();
        let p99 = lateness_all
            .get(lateness_all.len() * 99 / 100)
            .copied()
            .unwrap_or_default();
        eprintln!(
            "{label}: {} probes, {judged} judged; lateness p50 {p50:?} p99 {p99:?} max(judged) {worst:?}",
            list.len()
        );
        if judged < MIN_JUDGED {
            return Err(format!(
                "{label}: only {judged} probes judged (firehose too short?)"
            ));
        }
        if !late.is_empty() {
            return Err(format!(
                "{label}: {} of {judged} judged probes started more than {bound:?} after their deadline: {:?}",
                late.len(),
                &late[..late.len().min(10)]
            ));
        }
        Ok((judged, worst))
    }
}

/// Schedules a probe due `PROBE_LEAD` from now every `PROBE_EVERY` until `stop`.
fn run_probes(timer: &ShardedTimer, probes: &Probes, stop: &AtomicBool) {
    let mut k = 0;
    while !stop.load(SeqCst) {
        let deadline = Instant::now() + PROBE_LEAD;
        let (_, callback) = probes.make(deadline, format!("#{k}"));
        timer
            .schedule_at(deadline, callback)
            .expect("a probe is accepted");
        k += 1;
        std::thread::sleep(PROBE_EVERY);
    }
}

// ---------------------------------------------------------------------------------
// Firehoses
// ---------------------------------------------------------------------------------

/// What each firehose thread does without pause.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// `schedule` a timer an hour ahead, drop the handle (up to `cap` per thread).
    ScheduleFar { cap: u64 },
    /// `schedule` an hour ahead and `cancel` at once (must return true).
    ScheduleCancel,
    /// Keep 1,024 timers an hour ahead and `reset` them earlier and earlier, each
    /// reset a move (must return true); cancel them all at the end.
    ResetEarlier,
    /// Every second `schedule` due an hour ahead is cancelled at once, every other
    /// one kept (the newest `window` of them; beyond that the oldest is cancelled);
    /// plus a `reset` later of the previous kept one (a keepalive).
    Mixed { window: usize },
    /// `schedule` an hour ahead without pause, keeping the newest `window` timers:
    /// each one beyond that cancels the oldest (a request-timeout workload whose
    /// memory stays bounded, so the firehose can last the full `FIREHOSE`).
    Window { window: usize },
}

/// What one firehose thread did.
#[derive(Debug, Default, Clone, Copy)]
struct Done {
    scheduled: u64,
    cancelled: u64,
    resets: u64,
    /// Timers it left pending (to come back at shutdown).
    left_pending: u64,
    /// When it stopped filing (the earliest of the threads', in a total).
    stopped: Option<Instant>,
}

impl Done {
    fn add(&mut self, other: Done) {
        self.scheduled += other.scheduled;
        self.cancelled += other.cancelled;
        self.resets += other.resets;
        self.left_pending += other.left_pending;
        self.stopped = match (self.stopped, other.stopped) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

struct Firehose {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Done>>,
    /// Far timers' callbacks that ran (must stay 0).
    far_runs: &'static AtomicU64,
    ended: Option<Instant>,
}

impl Firehose {
    fn start(timer: &ShardedTimer, threads: usize, kind: Kind) -> Firehose {
        let stop = Arc::new(AtomicBool::new(false));
        let far_runs = counter();
        let started = Arc::new(AtomicUsize::new(0));
        let threads = (0..threads)
            .map(|_| {
                let timer = timer.clone();
                let stop = stop.clone();
                let started = started.clone();
                std::thread::spawn(move || {
                    started.fetch_add(1, SeqCst);
                    produce(&timer, &stop, kind, far_runs)
                })
            })
            .collect::<Vec<_>>();
        assert!(wait_until(WAIT, || started.load(SeqCst) == threads.len()));
        Firehose {
            stop,
            threads,
            far_runs,
            ended: None,
        }
    }

    /// Stops it (at the latest when `FIREHOSE` has passed since `since`, earlier if
    /// every thread hit its cap); returns when it ended and the threads' totals.
    fn finish(mut self, since: Instant) -> (Instant, Done) {
        while since.elapsed() < FIREHOSE && !self.threads.iter().all(JoinHandle::is_finished) {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.stop.store(true, SeqCst);
        let mut total = Done::default();
        for thread in self.threads.drain(..) {
            total.add(thread.join().expect("a firehose thread panicked"));
        }
        // The end of the firehose: the moment the first thread stopped filing (a
        // thread that hit its cap stops early).
        let ended = total.stopped.expect("threads say when they stopped");
        self.ended = Some(ended);
        (ended, total)
    }
}

fn produce(
    timer: &ShardedTimer,
    stop: &AtomicBool,
    kind: Kind,
    far_runs: &'static AtomicU64,
) -> Done {
    let mut done = Done::default();
    let far = move || {
        far_runs.fetch_add(1, SeqCst);
    };
    match kind {
        Kind::ScheduleFar { cap } => {
            while done.scheduled < cap && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for _ in 0..64 {
                    let handle = timer.schedule(HOUR, far).expect("schedule during firehose");
                    drop(handle);
                }
                done.scheduled += 64;
            }
            done.left_pending = done.scheduled;
        }
        Kind::ScheduleCancel => {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for _ in 0..64 {
                    let handle = timer.schedule(HOUR, far).expect("schedule during firehose");
                    assert!(
                        handle.cancel(),
                        "cancel of a pending far timer returned false"
                    );
                }
                done.scheduled += 64;
                done.cancelled += 64;
            }
        }
        Kind::ResetEarlier => {
            let handles: Vec<TimerHandle> = (0..1024)
                .map(|_| timer.schedule(HOUR, far).expect("schedule"))
                .collect();
            done.scheduled = handles.len() as u64;
            let base = Instant::now() + HOUR;
            let mut step = 0u64;
            'outer: loop {
                for handle in &handles {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break 'outer;
                    }
                    step += 1;
                    // Strictly earlier every time (1 µs per reset: at most 1.5 s of
                    // resets × a few M/s stays minutes ahead).
                    let deadline = base - Duration::from_micros(step);
                    assert!(
                        handle.reset_at(deadline),
                        "reset of a pending far timer returned false"
                    );
                    done.resets += 1;
                }
            }
            for handle in &handles {
                assert!(handle.cancel(), "cancel after resets returned false");
                done.cancelled += 1;
            }
        }
        Kind::Mixed { window } => {
            let mut live: std::collections::VecDeque<TimerHandle> =
                std::collections::VecDeque::with_capacity(window + 64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for k in 0..64 {
                    let handle = timer.schedule(HOUR, far).expect("schedule during firehose");
                    done.scheduled += 1;
                    if k % 2 == 0 {
                        assert!(
                            handle.cancel(),
                            "cancel of a pending far timer returned false"
                        );
                        done.cancelled += 1;
                    } else {
                        if let Some(previous) = live.back() {
                            assert!(
                                previous.reset(HOUR + Duration::from_secs(60)),
                                "keepalive reset"
                            );
                            done.resets += 1;
                        }
                        live.push_back(handle);
                    }
                }
                while live.len() > window {
                    assert!(
                        live.pop_front().unwrap().cancel(),
                        "cancel of the oldest returned false"
                    );
                    done.cancelled += 1;
                }
            }
            done.left_pending = live.len() as u64;
        }
        Kind::Window { window } => {
            let mut live = std::collections::VecDeque::with_capacity(window + 64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for _ in 0..64 {
                    live.push_back(timer.schedule(HOUR, far).expect("schedule during firehose"));
                }
                done.scheduled += 64;
                while live.len() > window {
                    let oldest: TimerHandle = live.pop_front().unwrap();
                    assert!(
                        oldest.cancel(),
                        "cancel of a pending far timer returned false"
                    );
                    done.cancelled += 1;
                }
            }
            done.stopped = Some(Instant::now());
            done.left_pending = live.len() as u64;
            return done;
        }
    }
    done.stopped = Some(Instant::now());
    done
}

/// Waits until the shards have taken in everything (`in_rings == 0`) and no counter
/// has moved for 50 ms of reads (each read prompts the shards); returns the stats.
fn quiescent(timer: &ShardedTimer) -> Stats {
    // Each `stats()` prompts every shard, but a shard may not get a core for a while
    // on a loaded machine (the tests run side by side on 2 cores): two snapshots 1 ms
    // apart could agree while its cancel messages still wait (a fresh-clone CI saw
    // 1,802 of them uncounted). Settled: no counter moved for `STEADY`, at least.
    const STEADY: Duration = Duration::from_millis(50);
    let mut last = timer.stats();
    let mut unchanged_since = Instant::now();
    let settled = wait_until(WAIT, || {
        let now = timer.stats();
        let same = now.in_rings == 0
            && last.in_rings == 0
            && now.scheduled == last.scheduled
            && now.fired == last.fired
            && now.cancelled == last.cancelled
            && now.pending == last.pending;
        if !same {
            unchanged_since = Instant::now();
        }
        last = now;
        same && unchanged_since.elapsed() >= STEADY
    });
    assert!(settled, "stats never settled: {last:?}");
    last
}

/// `scheduled == fired + cancelled + pending` (one-shot timers), in total and the
/// per-shard sums.
fn check_identity(stats: &Stats, label: &str) {
    assert_eq!(
        stats.scheduled,
        stats.fired + stats.cancelled + stats.pending,
        "{label}: scheduled != fired + cancelled + pending: {stats:?}"
    );
    assert_eq!(
        stats.pending,
        stats.shards.iter().map(|s| s.pending).sum::<u64>(),
        "{label}: pending != sum over shards"
    );
    assert_eq!(
        stats.fired,
        stats.shards.iter().map(|s| s.fired).sum::<u64>(),
        "{label}: fired != sum over shards"
    );
}

/// The common shape: a service, a firehose, probes meanwhile; then never early,
/// exactly once, on time, stats, and shutdown handing back exactly what was left.
fn probes_during(label: &str, timer: ShardedTimer, threads: usize, kind: Kind) {
    let probes = Probes::default();
    let stop_probes = AtomicBool::new(false);
    let since = Instant::now();
    let firehose = Firehose::start(&timer, threads, kind);
    let far_runs = firehose.far_runs;
    let (ended, done) = std::thread::scope(|scope| {
        scope.spawn(|| run_probes(&timer, &probes, &stop_probes));
        let result = firehose.finish(since);
        stop_probes.store(true, SeqCst);
        result
    });
    let lasted = ended - since;
    eprintln!("{label}: firehose {done:?} over {lasted:?}");
    let verdict = probes.verdict(ended - MARGIN, label);
    assert_eq!(far_runs.load(SeqCst), 0, "{label}: a far timer ran");
    let probe_count = probes.list.lock().unwrap().len() as u64;
    let stats = quiescent(&timer);
    eprintln!(
        "{label}: shard-side lateness (fire, not callback start): p99 {:?} max {:?}; ring_full_waits {}",
        stats.lateness.p99(),
        stats.lateness.max(),
        stats.ring_full_waits
    );
    for (k, shard) in stats.shards.iter().enumerate() {
        eprintln!(
            "{label}: shard {k}: fired {}, lateness p99 {:?} max {:?}",
            shard.fired,
            shard.lateness.p99(),
            shard.lateness.max()
        );
    }
    check_identity(&stats, label);
    assert_eq!(
        stats.scheduled,
        done.scheduled + probe_count,
        "{label}: scheduled"
    );
    assert_eq!(stats.fired, probe_count, "{label}: fired");
    assert_eq!(stats.cancelled, done.cancelled, "{label}: cancelled");
    assert_eq!(stats.pending, done.left_pending, "{label}: pending");
    let unfired = timer.shutdown();
    assert_eq!(
        unfired.len() as u64,
        done.left_pending,
        "{label}: shutdown handed back a different number of timers than were pending"
    );
    drop(unfired);
    let after = timer.stats();
    assert_eq!(
        after.pending, 0,
        "{label}: pending after shutdown: {after:?}"
    );
    assert_eq!(far_runs.load(SeqCst), 0, "{label}: a far timer ran");
    if let Err(failure) = verdict {
        panic!("{failure}");
    }
}

fn inline_one_shard() -> ShardedTimer {
    ShardedTimer::builder()
        .shards(1)
        .callbacks(Callbacks::inline())
        .pin_cores(false)
        .thread_name("fh")
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------

/// 3 threads `schedule` without pause into the one shard (inline callbacks): up to
/// 400 k timers each, an hour ahead (1.2 M in all, ~150-300 MB), for at most 1.5 s.
#[test]
fn probes_on_time_during_schedule_firehose_one_shard_inline() {
    let _serial = serial();
    probes_during(
        "1 shard inline, schedule",
        inline_one_shard(),
        3,
        Kind::Window { window: 100_000 },
    );
}

/// Pure `schedule`, no cancel at all (every filing a direct one or a ring push):
/// 3 threads, 1.5 M timers each an hour ahead (4.5 M in all, about 700 MB), one
/// shard. At the 10-20 M/s this machine files, that is 230-450 ms of firehose: judged
/// probes are those due 100 ms before the first thread hit its cap (40+ of them).
#[test]
fn probes_on_time_during_pure_schedule_firehose_one_shard_inline() {
    let _serial = serial();
    probes_during(
        "1 shard inline, pure schedule",
        inline_one_shard(),
        3,
        Kind::ScheduleFar { cap: 1_500_000 },
    );
}

/// As above with the default pool (2 workers on this machine), 2 producers.
#[test]
fn probes_on_time_during_schedule_firehose_one_shard_pool() {
    let _serial = serial();
    let timer = ShardedTimer::builder()
        .shards(1)
        .pin_cores(false)
        .thread_name("fh")
        .build()
        .unwrap();
    probes_during(
        "1 shard pool, schedule",
        timer,
        2,
        Kind::Window { window: 100_000 },
    );
}

/// Two shards, default pool, 3 producers routed by their core.
#[test]
fn probes_on_time_during_schedule_firehose_two_shards_pool() {
    let _serial = serial();
    let timer = ShardedTimer::builder()
        .shards(2)
        .pin_cores(false)
        .thread_name("fh")
        .build()
        .unwrap();
    probes_during(
        "2 shards pool, schedule",
        timer,
        3,
        Kind::Window { window: 100_000 },
    );
}

/// Schedule + cancel at once, without pause (direct unlinking, or the message ring
/// while the owner waits): every cancel must return true and no far timer may run.
#[test]
fn probes_on_time_during_schedule_cancel_firehose() {
    let _serial = serial();
    probes_during(
        "1 shard inline, schedule+cancel",
        inline_one_shard(),
        3,
        Kind::ScheduleCancel,
    );
}

/// Resets to an earlier deadline without pause (a move each, direct or by message).
#[test]
fn probes_on_time_during_reset_earlier_firehose() {
    let _serial = serial();
    probes_during(
        "1 shard inline, reset earlier",
        inline_one_shard(),
        3,
        Kind::ResetEarlier,
    );
}

/// Schedule, cancel every other, reset the kept ones later; two shards, pool.
#[test]
fn probes_on_time_during_mixed_firehose_two_shards() {
    let _serial = serial();
    let timer = ShardedTimer::builder()
        .shards(2)
        .pin_cores(false)
        .thread_name("fh")
        .build()
        .unwrap();
    probes_during(
        "2 shards pool, mixed",
        timer,
        3,
        Kind::Mixed { window: 50_000 },
    );
}

/// Rings of 2 slots: whenever the owner waits (or a producer holds the token) the
/// producers go through rings that are full almost at once.
#[test]
fn probes_on_time_with_tiny_rings_during_firehose() {
    let _serial = serial();
    let timer = ShardedTimer::builder()
        .shards(1)
        .callbacks(Callbacks::inline())
        .pin_cores(false)
        .ring_capacity(2)
        .thread_name("fh")
        .build()
        .unwrap();
    probes_during(
        "1 shard inline, ring 2, mixed",
        timer,
        3,
        Kind::Mixed { window: 50_000 },
    );
}

/// Rings of 2 slots, schedule+cancel, two shards, pool.
#[test]
fn probes_on_time_with_tiny_rings_during_cancel_firehose_two_shards() {
    let _serial = serial();
    let timer = ShardedTimer::builder()
        .shards(2)
        .pin_cores(false)
        .ring_capacity(2)
        .thread_name("fh")
        .build()
        .unwrap();
    probes_during(
        "2 shards pool, ring 2, schedule+cancel",
        timer,
        3,
        Kind::ScheduleCancel,
    );
}

/// Probes that are reset, during a schedule firehose, through sequences that end at
/// the probe's deadline: far → earlier → later → earlier (the last one the deadline),
/// near → later (the entry stays in its old slot and is re-filed), and
/// near → later → earlier → later. Each reset must return true; each probe must fire
/// once, never before its final deadline, within `LATE` after it.
#[test]
fn reset_probes_on_time_during_schedule_firehose() {
    let _serial = serial();
    let timer = inline_one_shard();
    let label = "1 shard inline, reset probes";
    let probes = Probes::default();
    let stop_probes = AtomicBool::new(false);
    let since = Instant::now();
    let firehose = Firehose::start(&timer, 3, Kind::Window { window: 100_000 });
    let (ended, done) = std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut k = 0;
            while !stop_probes.load(SeqCst) {
                let now = Instant::now();
                let target = now + PROBE_LEAD;
                let (probe, callback) = probes.make(target, format!("#{k} (kind {})", k % 3));
                // Applies one reset. A reset that returns false must be one that came
                // after the timer fired (this thread was descheduled past an earlier
                // deadline of the sequence): the probe is then judged by the deadline
                // in effect when it fired, and the sequence stops.
                let step = |handle: &TimerHandle, effective: &mut Instant, to: Instant| -> bool {
                    if handle.reset_at(to) {
                        *effective = to;
                        true
                    } else {
                        assert_eq!(
                            handle.state(),
                            TimerState::Fired,
                            "{label}: reset returned false on a timer that did not fire"
                        );
                        *probe.deadline.lock().unwrap() = *effective;
                        false
                    }
                };
                match k % 3 {
                    0 => {
                        let handle = timer.schedule(HOUR, callback).unwrap();
                        let mut effective = now + HOUR;
                        let _ = step(&handle, &mut effective, now + Duration::from_secs(1800))
                            && step(&handle, &mut effective, now + HOUR * 2)
                            && step(&handle, &mut effective, target + Duration::from_secs(1))
                            && step(&handle, &mut effective, target);
                    }
                    1 => {
                        let first = now + Duration::from_millis(3);
                        let handle = timer.schedule_at(first, callback).unwrap();
                        let mut effective = first;
                        let _ = step(&handle, &mut effective, target);
                    }
                    _ => {
                        let first = now + Duration::from_millis(2);
                        let handle = timer.schedule_at(first, callback).unwrap();
                        let mut effective = first;
                        let _ = step(&handle, &mut effective, now + Duration::from_secs(10))
                            && step(&handle, &mut effective, now + Duration::from_millis(1))
                            && step(&handle, &mut effective, target);
                    }
                }
                k += 1;
                std::thread::sleep(PROBE_EVERY);
            }
        });
        let result = firehose.finish(since);
        stop_probes.store(true, SeqCst);
        result
    });
    eprintln!("{label}: firehose {done:?} over {:?}", ended - since);
    probes.judge(ended - MARGIN, label);
    let unfired = timer.shutdown();
    assert_eq!(unfired.len() as u64, done.left_pending, "{label}: unfired");
}

/// A firehose from inside callbacks: with the pool (3 workers), two callbacks each
/// schedule without pause for `FIREHOSE` from their worker thread (both due at once),
/// while the main thread's probes run on the third worker.
#[test]
fn probes_on_time_while_pool_callbacks_schedule_without_pause() {
    let _serial = serial();
    let timer = ShardedTimer::builder()
        .shards(2)
        .executor_threads(3)
        .pin_cores(false)
        .thread_name("fh")
        .build()
        .unwrap();
    let label = "2 shards pool(3), firehose in callbacks";
    let far_runs = counter();
    let scheduled = counter();
    let cancelled = counter();
    let left = counter();
    let finished = Arc::new(AtomicUsize::new(0));
    let since = Instant::now();
    for _ in 0..2 {
        let inner = timer.clone();
        let finished = finished.clone();
        timer
            .schedule(Duration::ZERO, move || {
                let start = Instant::now();
                let mut live = std::collections::VecDeque::new();
                let mut n = 0u64;
                while start.elapsed() < FIREHOSE {
                    for _ in 0..64 {
                        live.push_back(
                            inner
                                .schedule(HOUR, move || {
                                    far_runs.fetch_add(1, SeqCst);
                                })
                                .expect("schedule from a callback"),
                        );
                    }
                    n += 64;
                    while live.len() > 100_000 {
                        let oldest: TimerHandle = live.pop_front().unwrap();
                        assert!(oldest.cancel(), "cancel from a callback returned false");
                        cancelled.fetch_add(1, SeqCst);
                    }
                }
                scheduled.fetch_add(n, SeqCst);
                left.fetch_add(live.len() as u64, SeqCst);
                finished.fetch_add(1, SeqCst);
            })
            .unwrap();
    }
    let probes = Probes::default();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| run_probes(&timer, &probes, &stop));
        assert!(wait_until(WAIT, || finished.load(SeqCst) > 0));
        stop.store(true, SeqCst);
    });
    let ended = Instant::now();
    assert!(wait_until(WAIT, || finished.load(SeqCst) == 2));
    eprintln!(
        "{label}: {} scheduled in callbacks over {:?}",
        scheduled.load(SeqCst),
        ended - since
    );
    probes.judge(ended - MARGIN, label);
    let probe_count = probes.list.lock().unwrap().len() as u64;
    let stats = quiescent(&timer);
    check_identity(&stats, label);
    assert_eq!(stats.fired, probe_count + 2, "{label}: fired");
    assert_eq!(
        stats.cancelled,
        cancelled.load(SeqCst),
        "{label}: cancelled"
    );
    assert_eq!(
        stats.scheduled,
        scheduled.load(SeqCst) + probe_count + 2,
        "{label}: scheduled"
    );
    let unfired = timer.shutdown();
    assert_eq!(unfired.len() as u64, left.load(SeqCst), "{label}: unfired");
    assert_eq!(far_runs.load(SeqCst), 0);
}

/// A firehose from inside inline callbacks: a self-renewing pump on the one shard
/// (each run schedules 256 timers an hour ahead and re-schedules itself due now),
/// plus 2 producer threads. The probes share the shard thread with the pump.
#[test]
fn probes_on_time_while_inline_callbacks_schedule() {
    let _serial = serial();
    let timer = inline_one_shard();
    let label = "1 shard inline, pump in callbacks + 2 producers";
    let far_runs = counter();
    let pumped = counter();
    let pump_runs = counter();
    let stop_pump = Arc::new(AtomicBool::new(false));
    fn pump(
        timer: ShardedTimer,
        stop: Arc<AtomicBool>,
        far_runs: &'static AtomicU64,
        pumped: &'static AtomicU64,
        runs: &'static AtomicU64,
    ) {
        runs.fetch_add(1, SeqCst);
        if stop.load(SeqCst) {
            return;
        }
        for _ in 0..256 {
            drop(
                timer
                    .schedule(HOUR, move || {
                        far_runs.fetch_add(1, SeqCst);
                    })
                    .expect("schedule from an inline callback"),
            );
        }
        pumped.fetch_add(256, SeqCst);
        let again = timer.clone();
        timer
            .schedule(Duration::ZERO, move || {
                pump(again, stop, far_runs, pumped, runs)
            })
            .expect("the pump re-schedules itself");
    }
    {
        let again = timer.clone();
        let stop = stop_pump.clone();
        timer
            .schedule(Duration::ZERO, move || {
                pump(again, stop, far_runs, pumped, pump_runs)
            })
            .unwrap();
    }
    let probes = Probes::default();
    let stop_probes = AtomicBool::new(false);
    let since = Instant::now();
    let firehose = Firehose::start(&timer, 2, Kind::Window { window: 100_000 });
    let producers_far = firehose.far_runs;
    let (ended, done) = std::thread::scope(|scope| {
        scope.spawn(|| run_probes(&timer, &probes, &stop_probes));
        let result = firehose.finish(since);
        stop_probes.store(true, SeqCst);
        result
    });
    stop_pump.store(true, SeqCst);
    let runs_then = pump_runs.load(SeqCst);
    assert!(
        wait_until(WAIT, || pump_runs.load(SeqCst) > runs_then),
        "the pump stops"
    );
    eprintln!(
        "{label}: producers {done:?}, pump ran {} times and scheduled {}, over {:?}",
        pump_runs.load(SeqCst),
        pumped.load(SeqCst),
        ended - since
    );
    probes.judge(ended - MARGIN, label);
    let probe_count = probes.list.lock().unwrap().len() as u64;
    let stats = quiescent(&timer);
    check_identity(&stats, label);
    assert_eq!(
        stats.fired,
        probe_count + pump_runs.load(SeqCst),
        "{label}: fired"
    );
    let unfired = timer.shutdown();
    assert_eq!(
        unfired.len() as u64,
        done.left_pending + pumped.load(SeqCst),
        "{label}: unfired"
    );
    assert_eq!(far_runs.load(SeqCst) + producers_far.load(SeqCst), 0);
}

/// A repeating timer (every 10 ms) during a schedule firehose: no run early (run n no
/// earlier than n periods after the call began), and no gap between runs longer than
/// a period plus `LATE`.
#[test]
fn repeating_timer_on_time_during_schedule_firehose() {
    let _serial = serial();
    let timer = inline_one_shard();
    let label = "1 shard inline, repeating";
    let period = Duration::from_millis(10);
    let runs: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let firehose = Firehose::start(&timer, 3, Kind::Window { window: 100_000 });
    let since = Instant::now();
    let before = Instant::now();
    let record = runs.clone();
    let repeating = timer
        .schedule_repeating(period, move || record.lock().unwrap().push(Instant::now()))
        .unwrap();
    let after = Instant::now();
    let (ended, done) = firehose.finish(since);
    assert!(repeating.cancel());
    let runs = runs.lock().unwrap().clone();
    let stats = timer.stats();
    eprintln!(
        "{label}: firehose {done:?}; {} runs, {} skipped, call took {:?}",
        runs.len(),
        stats.skipped,
        after - before
    );
    // Never early: the n-th run that happened is due at the n-th slot or later (a
    // skipped slot only pushes later runs further out).
    for (n, at) in runs.iter().enumerate() {
        let n = n as u32 + 1;
        assert!(*at >= before + period * n, "{label}: run {n} early");
    }
    // On time, judged by the gaps: a shard that stalls for S delays a run by S and
    // leaves a gap of about `period + S` before it (a starved shard: a gap as long as
    // the firehose). Runs in the judged window only. (A run 10 ms late is skipped by
    // the fixed-rate rule, so `skipped` alone is not the bound.)
    let judged_runs: Vec<Instant> = runs
        .iter()
        .copied()
        .filter(|at| *at <= ended - MARGIN)
        .collect();
    let gaps: Vec<Duration> = judged_runs.windows(2).map(|w| w[1] - w[0]).collect();
    let first = judged_runs
        .first()
        .map(|at| at.saturating_duration_since(after));
    eprintln!(
        "{label}: first run {first:?} after the call; largest gap between runs {:?}; shard-side lateness max {:?}",
        gaps.iter().max(),
        stats.lateness.max()
    );
    assert!(
        gaps.len() + 1 >= MIN_JUDGED,
        "{label}: only {} runs judged",
        gaps.len() + 1
    );
    assert!(
        first.is_some_and(|first| first <= period + late()),
        "{label}: the first run came {first:?} after the call"
    );
    for (k, gap) in gaps.iter().enumerate() {
        assert!(
            *gap <= period + late(),
            "{label}: {gap:?} between runs {} and {} (period {period:?}, bound {:?} late)",
            k + 1,
            k + 2,
            late()
        );
    }
    let unfired = timer.shutdown();
    assert_eq!(unfired.len() as u64, done.left_pending);
}

/// Guarantee 13 under a firehose: shard 0's thread is stuck in a 1.5 s inline callback
/// while 3 producers (and the probes) file into shard 0 without pause (all threads
/// pinned to core 0, and timers go to the shard of the caller's core). The watcher
/// only *tries* the token (never waits), so it competes with the producers' direct
/// filings for it; the probes must still be rescued within `LATE`.
#[test]
fn stuck_shard_is_rescued_during_schedule_firehose() {
    let _serial = serial();
    let label = "2 shards inline, stuck shard 0, firehose into it";
    let timer = ShardedTimer::builder()
        .shards(2)
        .callbacks(Callbacks::inline())
        .pin_cores(false)
        .thread_name("fh")
        .build()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Done>();
    let stop = Arc::new(AtomicBool::new(false));
    let blocked = Arc::new(AtomicBool::new(false));
    let probes = Arc::new(Probes::default());
    let ended = Arc::new(Mutex::new(None::<Instant>));
    // Everything runs on a thread pinned to core 0.
    let worker = {
        let timer = timer.clone();
        let stop = stop.clone();
        let blocked = blocked.clone();
        let probes = probes.clone();
        let ended = ended.clone();
        std::thread::spawn(move || {
            if !pin_to(0) {
                eprintln!("{label}: cannot pin; the test proves less");
            }
            let flag = blocked.clone();
            timer
                .schedule(Duration::ZERO, move || {
                    flag.store(true, SeqCst);
                    std::thread::sleep(FIREHOSE + Duration::from_millis(300));
                })
                .unwrap();
            assert!(wait_until(WAIT, || blocked.load(SeqCst)));
            let since = Instant::now();
            let far_runs = counter();
            let producers: Vec<_> = (0..3)
                .map(|_| {
                    let timer = timer.clone();
                    let stop = stop.clone();
                    std::thread::spawn(move || {
                        pin_to(0);
                        produce(&timer, &stop, Kind::Window { window: 100_000 }, far_runs)
                    })
                })
                .collect();
            let stop_probes = AtomicBool::new(false);
            std::thread::scope(|scope| {
                scope.spawn(|| run_probes(&timer, &probes, &stop_probes));
                while since.elapsed() < FIREHOSE && !producers.iter().all(JoinHandle::is_finished) {
                    std::thread::sleep(Duration::from_millis(2));
                }
                *ended.lock().unwrap() = Some(Instant::now());
                stop.store(true, SeqCst);
                stop_probes.store(true, SeqCst);
            });
            let mut total = Done::default();
            for producer in producers {
                total.add(producer.join().unwrap());
            }
            assert_eq!(far_runs.load(SeqCst), 0);
            tx.send(total).unwrap();
        })
    };
    let done = rx.recv_timeout(WAIT).expect("the pinned driver finishes");
    worker.join().unwrap();
    let ended = ended.lock().unwrap().unwrap();
    eprintln!("{label}: firehose {done:?}");
    probes.judge(ended - MARGIN, label);
    let unfired = timer.shutdown();
    assert_eq!(unfired.len() as u64, done.left_pending, "{label}: unfired");
}

/// `max_pending` under a firehose: 3 threads schedule far timers without pause; exactly
/// `limit` succeed, every other attempt gets `TooManyPending { limit }`. Then half are
/// cancelled (each cancel true) while the firehose goes on: exactly that many more
/// succeed. The probes (which need room too) are not used here; stats must agree.
#[test]
fn max_pending_is_exact_under_firehose() {
    let _serial = serial();
    const LIMIT: usize = 20_000;
    let timer = ShardedTimer::builder()
        .shards(2)
        .callbacks(Callbacks::inline())
        .pin_cores(false)
        .max_pending(LIMIT)
        .thread_name("fh")
        .build()
        .unwrap();
    let far_runs = counter();
    let hammer = |until: Instant| {
        std::thread::scope(|scope| {
            let threads: Vec<_> = (0..3)
                .map(|_| {
                    let timer = &timer;
                    scope.spawn(move || {
                        let mut ok = Vec::new();
                        let mut refused = 0u64;
                        while Instant::now() < until {
                            for _ in 0..64 {
                                match timer.schedule(HOUR, move || {
                                    far_runs.fetch_add(1, SeqCst);
                                }) {
                                    Ok(handle) => ok.push(handle),
                                    Err(ScheduleError::TooManyPending { limit }) => {
                                        assert_eq!(limit, LIMIT);
                                        refused += 1;
                                    }
                                    Err(other) => panic!("unexpected {other:?}"),
                                }
                            }
                        }
                        (ok, refused)
                    })
                })
                .collect();
            let mut ok = Vec::new();
            let mut refused = 0;
            for thread in threads {
                let (mut handles, r) = thread.join().unwrap();
                ok.append(&mut handles);
                refused += r;
            }
            (ok, refused)
        })
    };
    let (mut handles, refused) = hammer(Instant::now() + Duration::from_millis(500));
    eprintln!(
        "max_pending: phase 1: {} accepted, {refused} refused",
        handles.len()
    );
    assert_eq!(handles.len(), LIMIT, "phase 1: accepted != limit");
    assert!(refused > 0);
    // Cancel half from this thread while the firehose goes on.
    let to_cancel: Vec<TimerHandle> = handles.drain(..LIMIT / 2).collect();
    let cancelled = AtomicUsize::new(0);
    let (more, refused2) = std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            for handle in &to_cancel {
                assert!(
                    handle.cancel(),
                    "cancel of a pending far timer returned false"
                );
                cancelled.fetch_add(1, SeqCst);
            }
        });
        hammer(Instant::now() + Duration::from_millis(600))
    });
    eprintln!(
        "max_pending: phase 2: {} more accepted, {refused2} refused",
        more.len()
    );
    assert_eq!(cancelled.load(SeqCst), LIMIT / 2);
    assert_eq!(
        more.len(),
        LIMIT / 2,
        "phase 2: accepted != room freed by cancels"
    );
    // Every cancel counted (a bounded wait: the shard takes its messages at its next
    // turn), then the books at quiescence.
    assert!(
        wait_until(WAIT, || {
            let stats = timer.stats();
            stats.pending == LIMIT as u64 && stats.cancelled == (LIMIT / 2) as u64
        }),
        "max_pending: pending and cancelled never reached {} and {}: {:?}",
        LIMIT,
        LIMIT / 2,
        timer.stats()
    );
    let stats = quiescent(&timer);
    check_identity(&stats, "max_pending");
    assert_eq!(stats.pending, LIMIT as u64);
    assert_eq!(stats.cancelled, (LIMIT / 2) as u64);
    let unfired = timer.shutdown();
    assert_eq!(unfired.len(), LIMIT);
    assert_eq!(far_runs.load(SeqCst), 0);
    drop((handles, more, to_cancel));
}

/// `shutdown` in the middle of a firehose of schedule (deadlines 0-5 ms or an hour),
/// cancel and reset from 3 threads: every attempted timer is exactly one of fired
/// (its callback ran once), cancelled (`cancel` returned true, never ran), refused
/// (`Err(Shutdown)`, and every later attempt of that thread refused too) or handed
/// back as `Unfired`; no callback runs after `shutdown` returns; every callback is
/// dropped exactly once; stats agree.
#[test]
fn shutdown_mid_firehose_accounts_for_every_timer() {
    for (round, inline) in [(0, true), (1, false)] {
        let _serial = serial();
        let label = format!(
            "shutdown mid-firehose ({})",
            if inline { "inline" } else { "pool" }
        );
        let mut builder = ShardedTimer::builder()
            .shards(2)
            .pin_cores(false)
            .thread_name("fh");
        if inline {
            builder = builder.callbacks(Callbacks::inline());
        }
        let timer = builder.build().unwrap();
        let fired = counter();
        let drops = DropCounter::default();
        let go = Arc::new(AtomicBool::new(false));
        #[derive(Default, Debug)]
        struct Tally {
            attempts: u64,
            ok: u64,
            refused: u64,
            cancelled: u64,
            handles: Vec<TimerHandle>,
        }
        let producers: Vec<_> = (0..3u64)
            .map(|p| {
                let timer = timer.clone();
                let drops = drops.clone();
                let go = go.clone();
                std::thread::spawn(move || {
                    let mut tally = Tally::default();
                    let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (p + 1) ^ (round << 8);
                    let mut refused_since = None;
                    while !go.load(SeqCst) {
                        std::hint::spin_loop();
                    }
                    loop {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        let delay = if seed.is_multiple_of(4) {
                            HOUR
                        } else {
                            Duration::from_micros(seed % 5000)
                        };
                        let token = drops.token();
                        tally.attempts += 1;
                        match timer.schedule(delay, move || {
                            let _token = token;
                            fired.fetch_add(1, SeqCst);
                        }) {
                            Ok(handle) => {
                                assert!(
                                    refused_since.is_none(),
                                    "accepted after a Shutdown refusal"
                                );
                                tally.ok += 1;
                                match seed % 7 {
                                    0 => {
                                        if handle.cancel() {
                                            tally.cancelled += 1;
                                        }
                                    }
                                    1 => {
                                        let _ = handle.reset(Duration::from_micros(seed % 3000));
                                        tally.handles.push(handle);
                                    }
                                    _ => tally.handles.push(handle),
                                }
                                // Cancel an older one now and then.
                                if seed.is_multiple_of(11) && !tally.handles.is_empty() {
                                    let k = (seed as usize / 11) % tally.handles.len();
                                    let old = tally.handles.swap_remove(k);
                                    if old.cancel() {
                                        tally.cancelled += 1;
                                    }
                                }
                            }
                            Err(ScheduleError::Shutdown) => {
                                tally.refused += 1;
                                let since = *refused_since.get_or_insert(tally.attempts);
                                if tally.attempts > since + 1000 {
                                    break;
                                }
                            }
                            Err(other) => panic!("unexpected {other:?}"),
                        }
                    }
                    tally
                })
            })
            .collect();
        go.store(true, SeqCst);
        std::thread::sleep(Duration::from_millis(400));
        let unfired = timer.shutdown();
        let fired_at_return = fired.load(SeqCst);
        let tallies: Vec<Tally> = producers.into_iter().map(|p| p.join().unwrap()).collect();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            fired.load(SeqCst),
            fired_at_return,
            "{label}: a callback ran after shutdown returned"
        );
        let attempts: u64 = tallies.iter().map(|t| t.attempts).sum();
        let ok: u64 = tallies.iter().map(|t| t.ok).sum();
        let refused: u64 = tallies.iter().map(|t| t.refused).sum();
        let cancelled: u64 = tallies.iter().map(|t| t.cancelled).sum();
        eprintln!(
            "{label}: attempts {attempts}, ok {ok}, refused {refused}, cancelled {cancelled}, fired {fired_at_return}, unfired {}",
            unfired.len()
        );
        assert_eq!(attempts, ok + refused);
        assert_eq!(
            ok,
            fired_at_return + cancelled + unfired.len() as u64,
            "{label}: accepted != fired + cancelled(true) + unfired"
        );
        // Handles of returned timers: Pending until their Unfired is dropped; the rest
        // Fired or Cancelled.
        let mut pending_handles = 0;
        for tally in &tallies {
            for handle in &tally.handles {
                match handle.state() {
                    TimerState::Pending => pending_handles += 1,
                    TimerState::Fired | TimerState::Cancelled => {}
                }
            }
        }
        assert!(
            pending_handles <= unfired.len(),
            "{label}: more pending handles than unfired"
        );
        let stats = timer.stats();
        assert_eq!(
            stats.pending, 0,
            "{label}: pending after shutdown: {stats:?}"
        );
        assert_eq!(stats.in_rings, 0, "{label}");
        assert_eq!(stats.scheduled, ok, "{label}: stats.scheduled");
        assert_eq!(stats.fired, fired_at_return, "{label}: stats.fired");
        assert_eq!(stats.cancelled, cancelled, "{label}: stats.cancelled");
        assert_eq!(
            stats.scheduled,
            stats.fired + stats.cancelled + unfired.len() as u64,
            "{label}: stats identity after shutdown"
        );
        drop(unfired);
        for tally in &tallies {
            for handle in &tally.handles {
                assert_ne!(
                    handle.state(),
                    TimerState::Pending,
                    "{label}: pending after its Unfired was dropped"
                );
                assert!(!handle.cancel(), "{label}: cancel true after shutdown");
            }
        }
        drop(tallies);
        assert_eq!(
            drops.dropped(),
            attempts,
            "{label}: every callback dropped exactly once"
        );
        assert_eq!(fired.load(SeqCst), fired_at_return);
    }
}

/// A firehose from inside a long inline callback: callback X runs on shard 0's thread
/// (scheduled from a thread pinned to core 0) and moves itself to core 1, so that what
/// it schedules goes to shard 1 (timers go to the shard of the caller's core); for
/// `FIREHOSE` it schedules without pause (far timers, the newest 50 k kept) and every
/// `PROBE_EVERY` a probe due `PROBE_LEAD` later. Meanwhile `producers` threads pinned
/// to core 1 schedule onto shard 1 without pause too, so shard 1's token is often
/// held and its insert ring (of `ring` slots) often full. Shard 1 is healthy (its own
/// thread turns it); shard 0's other timers are rescued by shard 1 (guarantee 13).
/// Every probe is a timer of shard 1 and must start within `LATE` of its deadline.
fn probes_from_a_long_inline_callback(label: &'static str, ring: usize, producers: usize) {
    let timer = ShardedTimer::builder()
        .shards(2)
        .callbacks(Callbacks::inline())
        .pin_cores(false)
        .ring_capacity(ring)
        .thread_name("fh")
        .build()
        .unwrap();
    let probes = Arc::new(Probes::default());
    let far_runs = counter();
    let x_scheduled = counter();
    let x_left = counter();
    let x_cancelled = counter();
    let x_began = Arc::new(Mutex::new(None::<Instant>));
    let x_ended = Arc::new(Mutex::new(None::<Instant>));
    let stop = Arc::new(AtomicBool::new(false));
    let driver = {
        let timer = timer.clone();
        let probes = probes.clone();
        let x_began = x_began.clone();
        let x_ended = x_ended.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            assert!(pin_to(0), "{label}: needs 2 cores to pin to");
            let inner = timer.clone();
            let began = x_began.clone();
            let ended = x_ended.clone();
            timer
                .schedule(Duration::ZERO, move || {
                    assert!(pin_to(1));
                    let start = Instant::now();
                    *began.lock().unwrap() = Some(start);
                    let mut live = std::collections::VecDeque::new();
                    let mut next_probe = start;
                    let mut k = 0;
                    while start.elapsed() < FIREHOSE {
                        for _ in 0..64 {
                            live.push_back(
                                inner
                                    .schedule(HOUR, move || {
                                        far_runs.fetch_add(1, SeqCst);
                                    })
                                    .expect("schedule from an inline callback"),
                            );
                        }
                        x_scheduled.fetch_add(64, SeqCst);
                        while live.len() > 50_000 {
                            let oldest: TimerHandle = live.pop_front().unwrap();
                            assert!(oldest.cancel());
                            x_cancelled.fetch_add(1, SeqCst);
                        }
                        if Instant::now() >= next_probe {
                            let deadline = Instant::now() + PROBE_LEAD;
                            let (_, callback) = probes.make(deadline, format!("#{k}"));
                            inner.schedule_at(deadline, callback).expect("a probe");
                            k += 1;
                            next_probe += PROBE_EVERY;
                        }
                    }
                    x_left.fetch_add(live.len() as u64, SeqCst);
                    *ended.lock().unwrap() = Some(Instant::now());
                })
                .unwrap();
            assert!(wait_until(WAIT, || x_began.lock().unwrap().is_some()));
            let far = counter();
            let threads: Vec<_> = (0..producers)
                .map(|_| {
                    let timer = timer.clone();
                    let stop = stop.clone();
                    std::thread::spawn(move || {
                        pin_to(1);
                        produce(&timer, &stop, Kind::Window { window: 50_000 }, far)
                    })
                })
                .collect();
            assert!(wait_until(WAIT, || x_ended.lock().unwrap().is_some()));
            stop.store(true, SeqCst);
            let mut total = Done::default();
            for thread in threads {
                total.add(thread.join().unwrap());
            }
            assert_eq!(far.load(SeqCst), 0);
            total
        })
    };
    let done = driver.join().expect("the pinned driver");
    let ended = x_ended.lock().unwrap().unwrap();
    eprintln!(
        "{label}: producers {done:?}; the callback scheduled {} over {:?}",
        x_scheduled.load(SeqCst),
        ended - x_began.lock().unwrap().unwrap()
    );
    // Every probe first (the late ones arrive after the callback returns), so that
    // the shard-side lateness printed below includes them.
    wait_until(WAIT, || probes.all_fired());
    let stats = quiescent(&timer);
    eprintln!(
        "{label}: shard-side lateness p99 {:?} max {:?}; ring_full_waits {}",
        stats.lateness.p99(),
        stats.lateness.max(),
        stats.ring_full_waits
    );
    for (k, shard) in stats.shards.iter().enumerate() {
        eprintln!(
            "{label}: shard {k}: fired {}, lateness p99 {:?} max {:?}",
            shard.fired,
            shard.lateness.p99(),
            shard.lateness.max()
        );
    }
    let verdict = probes.verdict_within(ended - MARGIN, label, callback_late());
    check_identity(&stats, label);
    let unfired = timer.shutdown();
    assert_eq!(
        unfired.len() as u64,
        done.left_pending + x_left.load(SeqCst),
        "{label}: unfired"
    );
    assert_eq!(far_runs.load(SeqCst), 0);
    // Last: the other guarantees held; the lateness is the finding.
    if let Err(failure) = verdict {
        panic!("{failure}");
    }
}

// FAILED in every run before the fix (2026-11-28 audit; fixed by
// `own::retry_deferred_after_push`, src/shard/own.rs): probes scheduled from the long inline callback onto shard 1
// start up to the callback's remaining run time late (observed 0.3-1.5 s against a
// 50 ms bound), all at the instant the callback returns; shard 1's own lateness
// histogram shows the same, so they reached shard 1 late. Cause: a push from a shard
// thread that finds another shard's ring full and its token busy is deferred to the
// calling thread's own next turn (`own::make_room` -> `Room::Defer` -> `own::defer`),
// a thread-local list that only that thread's loop retries (`retry_deferred`), so it
// waits for the callback to return; rescue cannot deliver it.
#[test]
fn probes_from_a_long_inline_callback_onto_a_busy_shard_fire_on_time() {
    let _serial = serial();
    probes_from_a_long_inline_callback("inline callback firehose -> busy shard 1", 4096, 2);
}

// FAILED in every run before the fix (2026-11-28 audit; fixed by
// `own::retry_deferred_after_push`, src/shard/own.rs): probes scheduled from the long inline callback onto shard 1
// start up to the callback's remaining run time late (observed 0.3-1.5 s against a
// 50 ms bound), all at the instant the callback returns; shard 1's own lateness
// histogram shows the same, so they reached shard 1 late. Cause: a push from a shard
// thread that finds another shard's ring full and its token busy is deferred to the
// calling thread's own next turn (`own::make_room` -> `Room::Defer` -> `own::defer`),
// a thread-local list that only that thread's loop retries (`retry_deferred`), so it
// waits for the callback to return; rescue cannot deliver it.
#[test]
fn probes_from_a_long_inline_callback_onto_a_busy_shard_with_tiny_rings_fire_on_time() {
    let _serial = serial();
    probes_from_a_long_inline_callback("inline callback firehose -> busy shard 1, ring 2", 2, 2);
}

/// Minimal form of the failure above: one producer thread pinned to core 1 schedules
/// without pause (so shard 1's token is often held, and its 2-slot insert ring often
/// full); one inline callback on shard 0, moved to core 1, schedules one probe (due
/// 20 ms later) every 100 µs for 1 s, onto shard 1, and in between schedules and cancels
/// far timers onto shard 1 without pause. A probe whose `schedule` finds
/// shard 1's ring full while its token is held is deferred to shard 0's next turn,
/// i.e. until this callback returns. (Without the producer thread the ring is never
/// found full and the test passes: `ring_full_waits` 0.)
// FAILED in every run before the fix (2026-11-28 audit; fixed by
// `own::retry_deferred_after_push`, src/shard/own.rs): probes scheduled from the long inline callback onto shard 1
// start up to the callback's remaining run time late (observed 0.3-1.5 s against a
// 50 ms bound), all at the instant the callback returns; shard 1's own lateness
// histogram shows the same, so they reached shard 1 late. Cause: a push from a shard
// thread that finds another shard's ring full and its token busy is deferred to the
// calling thread's own next turn (`own::make_room` -> `Room::Defer` -> `own::defer`),
// a thread-local list that only that thread's loop retries (`retry_deferred`), so it
// waits for the callback to return; rescue cannot deliver it.
#[test]
fn minimal_probe_from_a_long_inline_callback_is_not_held_until_it_returns() {
    let _serial = serial();
    let label = "minimal: long inline callback schedules onto shard 1 (ring 2)";
    let timer = ShardedTimer::builder()
        .shards(2)
        .callbacks(Callbacks::inline())
        .pin_cores(false)
        .ring_capacity(2)
        .thread_name("fh")
        .build()
        .unwrap();
    let probes = Arc::new(Probes::default());
    let ended = Arc::new(Mutex::new(None::<Instant>));
    let stop = Arc::new(AtomicBool::new(false));
    let driver = {
        let timer = timer.clone();
        let probes = probes.clone();
        let ended = ended.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            assert!(pin_to(0), "{label}: needs 2 cores to pin to");
            let inner = timer.clone();
            let started = Arc::new(AtomicBool::new(false));
            let go = started.clone();
            let ended_x = ended.clone();
            timer
                .schedule(Duration::ZERO, move || {
                    assert!(pin_to(1));
                    while !go.load(SeqCst) {
                        std::hint::spin_loop();
                    }
                    let start = Instant::now();
                    let mut k = 0;
                    let mut next = start;
                    while start.elapsed() < Duration::from_millis(1000) {
                        // Schedule and cancel without pause in between.
                        let far = inner.schedule(HOUR, || {}).expect("schedule");
                        assert!(far.cancel());
                        if Instant::now() >= next {
                            let deadline = Instant::now() + PROBE_LEAD;
                            let (_, callback) = probes.make(deadline, format!("#{k}"));
                            inner.schedule_at(deadline, callback).expect("a probe");
                            k += 1;
                            next += Duration::from_micros(100);
                        }
                    }
                    *ended_x.lock().unwrap() = Some(Instant::now());
                })
                .unwrap();
            let far = counter();
            let producer = {
                let timer = timer.clone();
                let stop = stop.clone();
                std::thread::spawn(move || {
                    pin_to(1);
                    produce(&timer, &stop, Kind::Window { window: 50_000 }, far)
                })
            };
            started.store(true, SeqCst);
            assert!(wait_until(WAIT, || ended.lock().unwrap().is_some()));
            stop.store(true, SeqCst);
            producer.join().unwrap()
        })
    };
    let done = driver.join().unwrap();
    assert!(wait_until(WAIT, || ended.lock().unwrap().is_some()));
    let ended = ended.lock().unwrap().unwrap();
    // Every probe first (the late ones arrive after the callback returns), so that
    // the shard-side lateness printed below includes them.
    wait_until(WAIT, || probes.all_fired());
    let stats = quiescent(&timer);
    eprintln!(
        "{label}: shard-side lateness p99 {:?} max {:?}; ring_full_waits {}",
        stats.lateness.p99(),
        stats.lateness.max(),
        stats.ring_full_waits
    );
    for (k, shard) in stats.shards.iter().enumerate() {
        eprintln!(
            "{label}: shard {k}: fired {}, lateness p99 {:?} max {:?}",
            shard.fired,
            shard.lateness.p99(),
            shard.lateness.max()
        );
    }
    let verdict = probes.verdict_within(ended - MARGIN, label, callback_late());
    check_identity(&stats, label);
    assert_eq!(timer.shutdown().len() as u64, done.left_pending);
    if let Err(failure) = verdict {
        panic!("{failure}");
    }
}

/// The reset clause, from a long inline callback on another shard: 5,000 probe timers
/// and 1 M pressure timers are made an hour ahead by a thread pinned to core 1 (so they
/// live on shard 1); a thread pinned to core 1 schedules without pause onto shard 1
/// (its token often held, its 2-slot rings often full). An inline callback X on shard
/// 0 (scheduled from core 0) runs for 1 s: it cancels pressure timers without pause
/// (cancel messages for shard 1) and every 100 µs resets one probe to 20 ms ahead, an
/// earlier reset, which sends shard 1 a move message: taken directly if its token is
/// free, else through its message ring. Each reset probe must start within `LATE`
/// of its new deadline.
fn resets_from_a_long_inline_callback(label: &'static str, ring: Option<usize>, pin_shards: bool) {
    let mut builder = ShardedTimer::builder()
        .shards(2)
        .callbacks(Callbacks::inline())
        .pin_cores(pin_shards)
        .thread_name("fh");
    if let Some(ring) = ring {
        builder = builder.ring_capacity(ring);
    }
    let timer = builder.build().unwrap();
    let probes = Arc::new(Probes::default());
    let ended = Arc::new(Mutex::new(None::<Instant>));
    let stop = Arc::new(AtomicBool::new(false));
    let driver = {
        let timer = timer.clone();
        let probes = probes.clone();
        let ended = ended.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            assert!(pin_to(1), "{label}: needs 2 cores to pin to");
            // On shard 1: (probe, handle) pairs, each due an hour ahead for now.
            let armed: Vec<(Arc<Probe>, TimerHandle)> = (0..5000)
                .map(|k| {
                    let (probe, callback) = probes.make(Instant::now() + HOUR, format!("#{k}"));
                    (probe, timer.schedule(HOUR, callback).unwrap())
                })
                .collect();
            let pressure: Vec<TimerHandle> = (0..1_000_000)
                .map(|_| timer.schedule(HOUR, || {}).unwrap())
                .collect();
            let far = counter();
            let producer = {
                let timer = timer.clone();
                let stop = stop.clone();
                std::thread::spawn(move || {
                    pin_to(1);
                    produce(&timer, &stop, Kind::Window { window: 50_000 }, far)
                })
            };
            assert!(pin_to(0));
            let fired_by_x = Arc::new(AtomicUsize::new(0));
            let used = fired_by_x.clone();
            let ended_x = ended.clone();
            timer
                .schedule(Duration::ZERO, move || {
                    let start = Instant::now();
                    let mut next = start;
                    let mut k = 0;
                    let mut pressure = pressure.into_iter();
                    while start.elapsed() < Duration::from_secs(1) && k < armed.len() {
                        if let Some(handle) = pressure.next() {
                            assert!(handle.cancel(), "cancel of a pending pressure timer");
                        }
                        if Instant::now() >= next {
                            let (probe, handle) = &armed[k];
                            let deadline = Instant::now() + PROBE_LEAD;
                            *probe.deadline.lock().unwrap() = deadline;
                            assert!(handle.reset_at(deadline), "reset of a pending timer");
                            k += 1;
                            next += Duration::from_micros(100);
                        }
                    }
                    used.store(k, SeqCst);
                    // The rest stay an hour ahead: cancel them (each true).
                    for (_, handle) in &armed[k..] {
                        assert!(handle.cancel());
                    }
                    for handle in pressure {
                        assert!(handle.cancel());
                    }
                    *ended_x.lock().unwrap() = Some(Instant::now());
                })
                .unwrap();
            assert!(wait_until(WAIT, || ended.lock().unwrap().is_some()));
            stop.store(true, SeqCst);
            let done = producer.join().unwrap();
            assert_eq!(far.load(SeqCst), 0);
            (done, fired_by_x.load(SeqCst))
        })
    };
    let (done, used) = driver.join().unwrap();
    let ended = ended.lock().unwrap().unwrap();
    // Only the probes that were reset count (the others were cancelled, never ran).
    {
        let mut list = probes.list.lock().unwrap();
        list.truncate(used);
    }
    // Every probe first (the late ones arrive after the callback returns), so that
    // the shard-side lateness printed below includes them.
    wait_until(WAIT, || probes.all_fired());
    let stats = quiescent(&timer);
    eprintln!(
        "{label}: producer {done:?}; {used} resets; shard-side lateness p99 {:?} max {:?}; ring_full_waits {}",
        stats.lateness.p99(),
        stats.lateness.max(),
        stats.ring_full_waits
    );
    for (k, shard) in stats.shards.iter().enumerate() {
        eprintln!(
            "{label}: shard {k}: fired {}, lateness p99 {:?} max {:?}",
            shard.fired,
            shard.lateness.p99(),
            shard.lateness.max()
        );
    }
    let verdict = probes.verdict_within(ended - MARGIN, label, callback_late());
    check_identity(&stats, label);
    assert_eq!(timer.shutdown().len() as u64, done.left_pending);
    if let Err(failure) = verdict {
        panic!("{failure}");
    }
}

// FAILED in every run before the fix (2026-11-28 audit; fixed by
// `own::retry_deferred_after_push`, src/shard/own.rs): the reset clause of guarantee 2. An earlier reset made from
// an inline callback on shard 0 sends shard 1 a move message; when shard 1's token is
// busy (or awaited) and its message ring full, the message is deferred to shard 0's
// thread (`own::defer`) and delivered only when the callback returns: the timer stays
// in its old slot (an hour ahead) meanwhile, and starts up to ~470 ms late (the
// callback's remaining run time). Also with default rings and pinned shards.
#[test]
fn timers_reset_earlier_from_a_long_inline_callback_fire_on_time() {
    let _serial = serial();
    resets_from_a_long_inline_callback(
        "resets earlier from a long inline callback on shard 0 onto busy shard 1 (ring 2, unpinned)",
        Some(2),
        false,
    );
}

/// As above with the builder's defaults for rings (4,096 slots) and pinning (shard k
/// pinned to core k): only the callbacks are inline.
// FAILED in every run before the fix (2026-11-28 audit; fixed by
// `own::retry_deferred_after_push`, src/shard/own.rs): the reset clause of guarantee 2. An earlier reset made from
// an inline callback on shard 0 sends shard 1 a move message; when shard 1's token is
// busy (or awaited) and its message ring full, the message is deferred to shard 0's
// thread (`own::defer`) and delivered only when the callback returns: the timer stays
// in its old slot (an hour ahead) meanwhile, and starts up to ~470 ms late (the
// callback's remaining run time). Also with default rings and pinned shards.
#[test]
fn timers_reset_earlier_from_a_long_inline_callback_fire_on_time_default_rings_pinned() {
    let _serial = serial();
    resets_from_a_long_inline_callback(
        "resets earlier from a long inline callback on shard 0 onto busy shard 1 (defaults)",
        None,
        true,
    );
}

/// Control for the firehose tests (not an attack): the same probes beside 2 threads
/// that only burn CPU (no timer operation), with the default pool. What lateness the
/// machine itself gives (wake-up latency under the same CPU contention), to compare
/// with the firehose tests' printed lateness.
#[test]
fn control_probes_beside_cpu_burners() {
    let _serial = serial();
    let label = "control: 1 shard pool, 2 CPU burners";
    let timer = ShardedTimer::builder()
        .shards(1)
        .pin_cores(false)
        .thread_name("fh")
        .build()
        .unwrap();
    let probes = Probes::default();
    let stop = AtomicBool::new(false);
    let since = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                let mut x = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            });
        }
        scope.spawn(|| run_probes(&timer, &probes, &stop));
        std::thread::sleep(FIREHOSE);
        stop.store(true, SeqCst);
    });
    let ended = since + FIREHOSE;
    // Informational: the machine's own latency under the same CPU contention. Never
    // early and exactly once are still asserted (inside `verdict`); the lateness is
    // printed, not asserted (one run of this control on the shared machine saw a
    // 214 ms stall of every thread of the process, firehose or not).
    let verdict = probes.verdict(ended - MARGIN, label);
    eprintln!("{label}: verdict {verdict:?}");
    let stats = quiescent(&timer);
    eprintln!(
        "{label}: shard-side lateness p99 {:?} max {:?}",
        stats.lateness.p99(),
        stats.lateness.max()
    );
    assert!(timer.shutdown().is_empty());
}
