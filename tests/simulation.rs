//! A simulation of the whole service against a plain model: seeded, shrinking
//! (proptest), deterministic in what it asks (a `ManualClock`; no wall-clock wait).
//!
//! **What it generates.** A configuration per case (1–4 shards; callbacks on a pool of
//! 1 or 2 threads, inline, or handed to a spawner whose `Callback`s the harness runs
//! right after each `advance`, earliest or latest deadline first; ring capacity 2 to
//! 4,096;
//! `max_pending` off, tiny or around a burst's size; a tick of 1 µs, 250 µs, 1 ms,
//! 7 ms or 1 s) and a program of up to 47 steps: `schedule` (zero, sub-tick, a few
//! ticks, thousands of ticks, ten years, beyond `u64::MAX` ns, `Duration::MAX`),
//! `schedule_at` (now, ahead, behind, before the clock's origin, the last instants
//! `advance(Duration::MAX)` reaches), fixed-rate and fixed-delay repeating timers,
//! `cancel`, `reset` and `reset_at` earlier and later, sleeps (`sleep`,
//! `sleep_until`, polled with a counting waker, reset, dropped), timeouts (armed by
//! their first poll, over a future that is ready at once or never), bursts of 1,025
//! to 1,400 timers 64 to 4,200 ticks out (more than a shard's turn budget of 1,024,
//! cascading from a higher wheel level) plus one a few ticks after them, `advance` by
//! zero, part of a tick, one tick, many, ten years or `Duration::MAX`, `shutdown`,
//! and the drop of every clone of the service while handles and futures live on
//! (the service then keeps firing for its futures, and shuts down, dropping what
//! is pending unrun, when the last future is dropped). A timer's callback records its run and the clock's now, and may also
//! schedule a child (and grandchild), cancel or reset another timer (or itself), or
//! shut the service down (its target: one of the last timers, itself, any timer, or
//! the next one made, which can share its deadline and queue behind it); each timer is
//! acted on by at most one callback, so every answer it gets has one meaning.
//!
//! **What it checks, after every step.** Against a model of every timer's kind,
//! deadline and fate (a `BTreeMap`), every future's outcome, and the counters:
//!
//! - exactly the due set has run once `advance` returns: every timer whose deadline is
//!   not after the clock's now and that no `cancel` won has run exactly once (a
//!   fixed-rate timer once per advance, skipping the slots that passed; a fixed-delay
//!   one once, then `delay` after that run), and nothing else; with a spawner, every
//!   due timer was handed over before `advance` returned, with its deadline;
//! - never early (each callback's own reading of the clock is not before its
//!   deadline), never twice, never after a `cancel` returned `true` (for a repeating
//!   timer: no run begins after it where one thread runs all callbacks, so none can
//!   have been under way);
//! - every `cancel` and `reset` answer (`true` iff the model holds it pending; a
//!   `false` for a due timer obliges its run to show up), `state()`, `deadline()` ==
//!   the instant asked for (a far-future one where none can be represented), and
//!   `Sleep::deadline` / `Timeout::deadline`;
//! - `max_pending`: a refusal exactly when the model's pending count is at the limit;
//!   `Shutdown` exactly after shutdown;
//! - sleeps and timeouts: ready exactly when their deadline passed (or at the first
//!   poll when it had already), `is_elapsed`, `refused`, and exactly one wake per
//!   fired timer that a poll left a waker in, none for a dropped one;
//! - `Stats`: `scheduled`, `fired`, `cancelled`, `pending` and `skipped` equal the
//!   model's after every `advance` (quiescence), `in_rings` and `panicked` are 0, and
//!   `pending` is 0 once `shutdown` returned;
//! - the last user's drop (no clone left, then the last future dropped) shuts the
//!   service down on the spot, as `shutdown` does but handing nothing back: every
//!   pending timer's handle reads `Cancelled`, with its deadline, and no callback
//!   runs after it; before that drop, futures complete and timers fire as if a clone
//!   still existed;
//! - `shutdown` (the harness's, at the latest at the end of every case) hands back
//!   exactly the pending timers, with their deadlines; a callback's shutdown hands
//!   back every pending one-shot timer that did not run (a repeating one may instead
//!   end cancelled, when its run was under way), and nothing else.
//!
//! **How to run.** `cargo test --test simulation` runs `SIM_CASES` cases (default 128);
//! the seed is fixed (`SIM_SEED` changes it). A long run is one command:
//!
//! ```text
//! SIM_CASES=20000 cargo test --release --test simulation -- --nocapture
//! ```
//!
//! A failure prints the shrunk configuration and program. A case that hangs for 120 s
//! prints its program and aborts (a hang cannot be shrunk).

#[path = "simulation/harness.rs"]
mod harness;
#[path = "simulation/model.rs"]
mod model;
#[path = "simulation/program.rs"]
mod program;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::test_runner::{Config, RngAlgorithm, RngSeed, TestRunner};

use harness::Sim;
use program::{Op, Setup};

/// Cases per run, from `SIM_CASES`.
fn cases() -> u32 {
    std::env::var("SIM_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(128)
}

/// The seed, from `SIM_SEED`.
fn seed() -> u64 {
    std::env::var("SIM_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(0x5eed_0029)
}

/// What the watchdog prints if a case stops making progress.
struct Watch {
    /// Steps taken, ever.
    steps: AtomicU64,
    /// The case under way.
    case: Mutex<String>,
    /// The test is over.
    done: AtomicBool,
}

/// Runs one case; `Err` on a violation.
fn run_case(
    watch: &Watch,
    setup: &Setup,
    program: &[Op],
) -> Result<(), proptest::test_runner::TestCaseError> {
    *watch.case.lock().unwrap_or_else(|e| e.into_inner()) = format!("{setup:?}\n{program:#?}");
    let mut sim = Sim::new(setup);
    for op in program {
        // ORDERING: Relaxed: a progress count the watchdog samples.
        watch.steps.fetch_add(1, Ordering::Relaxed);
        sim.step(op)?;
    }
    sim.finish()
}

#[test]
fn the_service_matches_its_model_step_by_step() {
    let watch = Arc::new(Watch {
        steps: AtomicU64::new(0),
        case: Mutex::new(String::new()),
        done: AtomicBool::new(false),
    });
    let watchdog = {
        let watch = watch.clone();
        std::thread::spawn(move || {
            let mut last = (0, Instant::now());
            // ORDERING: Relaxed: the flag only ends this loop.
            while !watch.done.load(Ordering::Relaxed) {
                std::thread::park_timeout(Duration::from_millis(200));
                // ORDERING: Relaxed: a progress count.
                let steps = watch.steps.load(Ordering::Relaxed);
                if steps != last.0 {
                    last = (steps, Instant::now());
                } else if last.1.elapsed() > Duration::from_secs(120) {
                    let case = watch.case.lock().unwrap_or_else(|e| e.into_inner());
                    eprintln!("simulation: no progress for 120 s; the case:\n{case}");
                    std::process::abort();
                }
            }
        })
    };
    let config = Config {
        cases: cases(),
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: RngSeed::Fixed(seed()),
        failure_persistence: None,
        max_shrink_iters: 4_000,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let started = Instant::now();
    let result = runner.run(&program::case(), |(setup, program)| {
        run_case(&watch, &setup, &program)
    });
    // ORDERING: Relaxed: ends the watchdog's loop; the join orders the rest.
    watch.done.store(true, Ordering::Relaxed);
    watchdog.thread().unpark();
    watchdog.join().expect("the watchdog does not panic");
    eprintln!(
        "simulation: {} cases in {:.1?} (seed {:#x})",
        cases(),
        started.elapsed(),
        seed()
    );
    if let Err(failure) = result {
        panic!("the simulation found a violation:\n{failure}");
    }
}
