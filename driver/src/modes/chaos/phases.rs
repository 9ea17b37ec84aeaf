//! One phase: a service of a random configuration (where callbacks run, shards, ring,
//! `max_pending`, tick), its load threads, its shutdown (at a quiescent point, or
//! under load), and the accounting after it: the `Stats` identities at the quiescent
//! point, every timer accounted for, the hand-written executor's tasks freed, and the
//! live bytes once they settle.

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use sharded_timer::{Callback, Callbacks, ShardedTimer, Stats, TimerId};

use super::checker::{check_monotonic, Kind, Record, Shared};
use super::futures::tokio_load;
use super::hand_executor::hand_load;
use super::operations::load;
use super::report::{bump, payload_text, stage, violation, Op, DELIBERATE};
use super::{Rng, FAR};

/// Where a phase's callbacks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    Pool,
    Inline,
    Spawner,
}

/// A phase's configuration.
#[derive(Clone, Copy, Debug)]
pub(super) struct Config {
    callbacks: Where,
    pool_threads: usize,
    shards: usize,
    ring: usize,
    max_pending: Option<usize>,
    tick: Duration,
    /// Shut down while the load runs, instead of at a quiescent point.
    abrupt: bool,
}

impl std::fmt::Display for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.callbacks {
            Where::Pool => write!(f, "pool of {}", self.pool_threads)?,
            Where::Inline => f.write_str("inline")?,
            Where::Spawner => f.write_str("spawner")?,
        }
        write!(
            f,
            ", {} shards, ring {}, tick {:?}, max_pending {}, {}",
            self.shards,
            self.ring,
            self.tick,
            self.max_pending
                .map_or("none".to_owned(), |n| n.to_string()),
            if self.abrupt {
                "shutdown under load"
            } else {
                "shutdown at quiescence"
            }
        )
    }
}

/// A random configuration for phase `phase`.
pub(super) fn config(phase: u64, rng: &mut Rng) -> Config {
    Config {
        callbacks: [Where::Pool, Where::Inline, Where::Spawner][(phase % 3) as usize],
        pool_threads: rng.range(1..=2) as usize,
        shards: rng.range(1..=3) as usize,
        ring: [2, 4, 8, 16, 32, 64][rng.below(6) as usize],
        max_pending: rng.chance(30).then(|| rng.range(200..=3_000) as usize),
        tick: [Duration::from_micros(500), Duration::from_millis(1)][rng.below(2) as usize],
        abrupt: rng.chance(33),
    }
}

/// The spawner's threads: run each callback handed over until `stop` and the queue is
/// empty.
fn spawner_thread(
    queue: Arc<Mutex<mpsc::Receiver<Callback>>>,
    stop: Arc<AtomicBool>,
    with_spawner: Arc<Mutex<HashSet<TimerId>>>,
) {
    loop {
        let next = queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .recv_timeout(Duration::from_millis(2));
        match next {
            Ok(callback) => {
                let deadline = callback.deadline();
                if Instant::now() < deadline {
                    violation(format!(
                        "callback {} handed to the spawner before its deadline",
                        callback.id()
                    ));
                }
                let id = callback.id();
                callback.run();
                with_spawner
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
            }
            // ORDERING: Relaxed: a stop flag; set after shutdown returned.
            Err(mpsc::RecvTimeoutError::Timeout) if !stop.load(Ordering::Relaxed) => {}
            Err(_) => break,
        }
    }
}

/// What a phase measured.
#[derive(Debug, Default)]
pub(super) struct PhaseOutcome {
    /// Live bytes after the phase and everything it made were dropped.
    pub(super) allocated_after: usize,
}

/// Waits, printing nothing, until `condition` holds or `timeout` passes.
fn wait(timeout: Duration, condition: impl FnMut() -> bool) -> bool {
    crate::report::wait_until(timeout, condition)
}

/// The service the hang guard may read while a phase runs.
pub(super) static CURRENT: Mutex<Option<(ShardedTimer, Arc<Shared>)>> = Mutex::new(None);

/// Runs one phase of `length`.
pub(super) fn phase(
    number: u64,
    config: Config,
    length: Duration,
    threads: usize,
    seed: u64,
) -> PhaseOutcome {
    let mut builder = ShardedTimer::builder()
        .shards(config.shards)
        .tick(config.tick)
        .ring_capacity(config.ring)
        .pin_cores(false)
        .thread_name(format!("chaos{}", number % 100));
    if let Some(limit) = config.max_pending {
        builder = builder.max_pending(limit);
    }
    let spawned = config.callbacks == Where::Spawner;
    let (sender, receiver) = mpsc::channel::<Callback>();
    let spawner_stop = Arc::new(AtomicBool::new(false));
    // The timers whose run is with the spawner (handed over, its `run()` not yet
    // returned): at shutdown such a run of a repeating timer is its last (documented
    // on `Callbacks::spawn`), which `account_records` accepts.
    let with_spawner: Arc<Mutex<HashSet<TimerId>>> = Arc::default();
    let mut spawners = Vec::new();
    builder = match config.callbacks {
        Where::Pool => builder.callbacks(Callbacks::pool(config.pool_threads)),
        Where::Inline => builder.callbacks(Callbacks::inline()),
        Where::Spawner => {
            let receiver = Arc::new(Mutex::new(receiver));
            for k in 0..2 {
                let (receiver, stop, with) =
                    (receiver.clone(), spawner_stop.clone(), with_spawner.clone());
                spawners.push(
                    std::thread::Builder::new()
                        .name(format!("chaos-spawn{k}"))
                        .spawn(move || spawner_thread(receiver, stop, with))
                        .expect("a spawner thread"),
                );
            }
            let sender = Mutex::new(sender);
            let with = with_spawner.clone();
            builder.callbacks(Callbacks::spawn(move |callback| {
                with.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(callback.id());
                let sent = sender
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .send(callback);
                if let Err(mpsc::SendError(callback)) = sent {
                    violation(format!(
                        "callback {} handed to the spawner after its threads stopped",
                        callback.id()
                    ));
                }
            }))
        }
    };
    let timer = match builder.build() {
        Ok(timer) => timer,
        Err(error) => {
            violation(format!("phase {number}: build failed: {error}"));
            return PhaseOutcome::default();
        }
    };
    let shared = Arc::new(Shared {
        base: Instant::now(),
        ledger: Mutex::new(Vec::new()),
        shutting_down: AtomicBool::new(false),
        shut_down: AtomicBool::new(false),
        spawned,
        body_panics: AtomicU64::new(0),
        drop_panics: AtomicU64::new(0),
        caught: AtomicU64::new(0),
        repeating_runs: AtomicU64::new(0),
        repeating_cancelled: AtomicU64::new(0),
        anchors: Mutex::new(Vec::new()),
        hand_tasks: AtomicUsize::new(0),
        in_callbacks: AtomicUsize::new(0),
    });
    *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) = Some((timer.clone(), shared.clone()));
    stage(format!("phase {number} ({config}): load running"));
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = Vec::new();
    for k in 0..threads {
        let (timer, shared, stop) = (timer.clone(), shared.clone(), stop.clone());
        let seed = seed ^ ((k as u64 + 1) << 40);
        loads.push(
            std::thread::Builder::new()
                .name(format!("chaos-load{k}"))
                .spawn(move || load(timer, shared, stop, seed))
                .expect("a load thread"),
        );
    }
    {
        let (timer, shared, stop) = (timer.clone(), shared.clone(), stop.clone());
        loads.push(
            std::thread::Builder::new()
                .name("chaos-tokio-main".into())
                .spawn(move || tokio_load(timer, shared, stop, seed ^ 0x70c10))
                .expect("a tokio thread"),
        );
    }
    {
        let (timer, shared, stop) = (timer.clone(), shared.clone(), stop.clone());
        loads.push(
            std::thread::Builder::new()
                .name("chaos-hand".into())
                .spawn(move || hand_load(timer, shared, stop, seed ^ 0x4a4d))
                .expect("an executor thread"),
        );
    }
    let start = Instant::now();
    let mut last_stats: Option<Stats> = None;
    while start.elapsed() < length {
        std::thread::sleep(Duration::from_millis(200).min(length.saturating_sub(start.elapsed())));
        shared.prune();
        let stats = timer.stats();
        if let Some(last) = &last_stats {
            check_monotonic(last, &stats);
        }
        last_stats = Some(stats);
    }
    let unfired;
    let mut expected_unfired = None;
    if config.abrupt {
        stage(format!("phase {number} ({config}): shutdown under load"));
        Record::set(&shared.shutting_down);
        mark_runs_with_the_spawner(&shared, &with_spawner);
        unfired = timer.shutdown();
        Record::set(&shared.shut_down);
        // ORDERING: Relaxed: a stop flag; the joins order the rest.
        stop.store(true, Ordering::Relaxed);
        stage(format!(
            "phase {number} ({config}): joining the loads after shutdown"
        ));
        for thread in loads {
            if thread.join().is_err() {
                violation(format!("phase {number}: a load thread panicked"));
            }
        }
    } else {
        // ORDERING: Relaxed: as above.
        stop.store(true, Ordering::Relaxed);
        stage(format!("phase {number} ({config}): joining the loads"));
        for thread in loads {
            if thread.join().is_err() {
                violation(format!("phase {number}: a load thread panicked"));
            }
        }
        expected_unfired = Some(quiesce(number, &config, &timer, &shared));
        stage(format!("phase {number} ({config}): shutdown at quiescence"));
        Record::set(&shared.shutting_down);
        mark_runs_with_the_spawner(&shared, &with_spawner);
        unfired = timer.shutdown();
        Record::set(&shared.shut_down);
    }
    stage(format!("phase {number} ({config}): accounting"));
    let returned = unfired.len();
    account_unfired(&shared, unfired, seed);
    if let Some(expected) = expected_unfired {
        if returned != expected {
            // Which ones: pending still, after shutdown's were accounted (each name
            // says its kind; runs, and whether a run is under way).
            let missing: Vec<String> = shared
                .records()
                .iter()
                .filter(|record| record.pending())
                .take(5)
                .map(|record| {
                    format!(
                        "{} (runs {}, running {}, not before {} ns)",
                        record.name(),
                        record.runs(),
                        Record::get(&record.running),
                        // ORDERING: Acquire: as in `quiesce`.
                        record.not_before.load(Ordering::Acquire)
                    )
                })
                .collect();
            violation(format!(
                "phase {number} ({config}): shutdown at quiescence returned {returned} timers, {expected} were pending; still pending after it: [{}]",
                missing.join("; ")
            ));
        }
    }
    // ORDERING: Relaxed: a stop flag, set after shutdown returned.
    spawner_stop.store(true, Ordering::Relaxed);
    for thread in spawners {
        if thread.join().is_err() {
            violation(format!("phase {number}: a spawner thread panicked"));
        }
    }
    let after = timer.stats();
    if after.pending != 0 || after.in_rings != 0 {
        violation(format!(
            "phase {number} ({config}): after shutdown Stats::pending = {}, in_rings = {} (both must be 0)",
            after.pending, after.in_rings
        ));
    }
    // Orphan tasks are freed once their anchors' wakers are.
    if !wait(Duration::from_secs(5), || {
        // ORDERING: Relaxed: as in `Alive`.
        shared.hand_tasks.load(Ordering::Relaxed) == 0
    }) {
        violation(format!(
            "phase {number} ({config}): {} tasks of the hand-written executor never freed after shutdown (a waker kept)",
            shared.hand_tasks.load(Ordering::Relaxed)
        ));
    }
    account_records(number, &config, &shared);
    *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) = None;
    drop(timer);
    drop(shared);
    stage(format!("phase {number} ({config}): memory settling"));
    PhaseOutcome {
        allocated_after: settled_allocation(),
    }
}

/// Live bytes once they stop falling (threads of the phase finish exiting and free
/// what they held): sampled every 50 ms until two samples are within 64 KiB, for at
/// most 3 s.
fn settled_allocation() -> usize {
    let mut last = crate::alloc::allocated();
    for _ in 0..60 {
        std::thread::sleep(Duration::from_millis(50));
        let now = crate::alloc::allocated();
        if now.abs_diff(last) < 64 << 10 {
            return now.min(last);
        }
        last = now;
    }
    last
}

/// At a quiescent point (loads joined): waits until every due timer has run and the
/// counters have caught up, checks the `Stats` identities, and returns how many
/// timers are pending (which `shutdown` must return).
fn quiesce(number: u64, config: &Config, timer: &ShardedTimer, shared: &Shared) -> usize {
    stage(format!(
        "phase {number} ({config}): waiting for every due timer to run"
    ));
    let far = |record: &Record| {
        // ORDERING: Acquire: pairs with the resets' Release stores (all joined).
        let due = record.not_before.load(Ordering::Acquire);
        due >= shared.ns(Instant::now() + FAR / 2)
    };
    // The hang guard ends this if a due timer never runs.
    loop {
        let records = shared.records();
        // ORDERING: SeqCst: as `InCallback` writes it.
        let in_callbacks = shared.in_callbacks.load(Ordering::SeqCst) > 0;
        let waiting = in_callbacks
            || records.iter().any(|record| {
                Record::get(&record.running)
                    || (record.kind == Kind::OneShot && record.pending() && !far(record))
            });
        if !waiting {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let records = shared.records();
    let pending = records.iter().filter(|r| r.pending()).count() as u64;
    stage(format!(
        "phase {number} ({config}): waiting for Stats to catch up"
    ));
    let mut stats = timer.stats();
    let caught_up = wait(Duration::from_secs(5), || {
        stats = timer.stats();
        stats.in_rings == 0 && stats.pending == pending
    });
    if !caught_up {
        violation(format!(
            "phase {number} ({config}): at quiescence Stats::pending = {} and in_rings = {}, but {pending} timers are pending",
            stats.pending, stats.in_rings
        ));
    }
    let runs = Shared::read(&shared.repeating_runs);
    let cancelled_repeating = Shared::read(&shared.repeating_cancelled);
    let surplus = (stats.fired + stats.cancelled + stats.pending) as i128 - stats.scheduled as i128;
    if surplus < runs as i128 || surplus > (runs + cancelled_repeating) as i128 {
        violation(format!(
            "phase {number} ({config}): at quiescence fired {} + cancelled {} + pending {} - scheduled {} = {surplus}, but repeating timers started {runs} runs ({cancelled_repeating} of them cancelled)",
            stats.fired, stats.cancelled, stats.pending, stats.scheduled
        ));
    }
    let body = Shared::read(&shared.body_panics);
    let most = body + Shared::read(&shared.drop_panics) - Shared::read(&shared.caught);
    if stats.panicked < body || stats.panicked > most {
        violation(format!(
            "phase {number} ({config}): Stats::panicked = {} at quiescence, expected {body} to {most}",
            stats.panicked
        ));
    }
    pending as usize
}

/// Matches what `shutdown` returned against the ledger, then drops them (running
/// one in four).
fn account_unfired(shared: &Arc<Shared>, unfired: Vec<sharded_timer::Unfired>, seed: u64) {
    let by_id: HashMap<TimerId, Arc<Record>> = shared
        .records()
        .into_iter()
        .filter_map(|record| record.id.get().copied().map(|id| (id, record)))
        .collect();
    let mut rng = Rng::new(seed ^ 0xdead);
    for timer in unfired {
        bump(Op::Unfired);
        let Some(record) = by_id.get(&timer.id()) else {
            violation(format!(
                "shutdown returned timer {}, which had run, been cancelled, or was never scheduled",
                timer.id()
            ));
            continue;
        };
        if Record::get(&record.unfired) {
            violation(format!("{}: returned twice by shutdown", record.name()));
        }
        Record::set(&record.unfired);
        if Record::get(&record.cancelled) || (record.kind == Kind::OneShot && record.runs() > 0) {
            violation(format!(
                "{}: returned by shutdown after it ran or a cancel returned true",
                record.name()
            ));
        }
        let run = rng.chance(25);
        if run {
            Record::set(&record.released);
            bump(Op::UnfiredRun);
        }
        let outcome = catch_unwind(AssertUnwindSafe(move || {
            if run {
                timer.run();
            } else {
                drop(timer);
            }
        }));
        if let Err(payload) = outcome {
            if !payload_text(payload.as_ref()).starts_with(DELIBERATE) {
                violation("an Unfired panicked with a panic not ours".to_owned());
            }
            if !run {
                Shared::count(&shared.caught);
            }
        }
    }
}

/// Marks the timers whose run is with the spawner as shutdown begins (after
/// `shutting_down` is set: a run handed over later starts late and marks itself).
fn mark_runs_with_the_spawner(shared: &Shared, with_spawner: &Mutex<HashSet<TimerId>>) {
    let with = with_spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if with.is_empty() {
        return;
    }
    for record in shared.records() {
        if record.id.get().is_some_and(|id| with.contains(id)) {
            Record::set(&record.late_run);
        }
    }
}

/// Every timer accounted for: ran (one-shot), cancelled, handed back or refused.
fn account_records(number: u64, config: &Config, shared: &Shared) {
    let mut lost = 0;
    for record in shared.records() {
        let ran = record.runs() > 0;
        let cancelled = Record::get(&record.cancelled);
        let unfired = Record::get(&record.unfired);
        let refused = Record::get(&record.refused);
        let accounted = match record.kind {
            Kind::OneShot => ran || cancelled || unfired || refused,
            // A spawner's run under way at shutdown ends a repeating timer: shutdown
            // cannot hand it back, and no later run is filed.
            _ => {
                cancelled
                    || unfired
                    || refused
                    || (shared.spawned && ran && Record::get(&record.late_run))
            }
        };
        if !accounted {
            lost += 1;
            if lost <= 5 {
                // ORDERING: Acquire: as in `quiesce`.
                let due = record.not_before.load(Ordering::Acquire);
                violation(format!(
                    "phase {number} ({config}): {} lost: {} runs, no cancel returned true, not returned by shutdown (first due {} ms into the phase)",
                    record.name(),
                    record.runs(),
                    due / 1_000_000
                ));
            }
        }
    }
    if lost > 5 {
        violation(format!("phase {number}: {lost} timers lost in all"));
    }
}
