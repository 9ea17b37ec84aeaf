//! The run's counters and verdict: operations per kind, the progress pulse the hang
//! guard watches, the violations found (each printed as it is found), where the run
//! is, the panic hook that tells deliberate panics from violations, and the summary
//! printed at the end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Payloads of the panics the chaos makes on purpose start with this.
pub(super) const DELIBERATE: &str = "chaos: deliberate";

/// The kinds of operation counted.
#[derive(Clone, Copy, Debug)]
pub(super) enum Op {
    Schedule,
    ScheduleAt,
    BurstTimer,
    Repeating,
    FixedDelay,
    CancelTrue,
    CancelFalse,
    ResetTrue,
    ResetFalse,
    DropHandle,
    Refused,
    Callback,
    CallbackPanic,
    CallbackBlock,
    CallbackSchedule,
    PanickingCapture,
    SchedulingCapture,
    CancellingCapture,
    ServiceCapture,
    StatsRead,
    TokioFuture,
    HandFuture,
    OrphanTask,
    AnchorDropped,
    Unfired,
    UnfiredRun,
}

/// Names of [`Op`]s, in order.
const OP_NAMES: [&str; 26] = [
    "schedule",
    "schedule_at",
    "burst timers",
    "repeating",
    "fixed-delay",
    "cancel true",
    "cancel false",
    "reset true",
    "reset false",
    "handles dropped",
    "refused",
    "callbacks run",
    "callbacks panicked",
    "callbacks blocked",
    "callbacks scheduled",
    "panicking captures",
    "scheduling captures",
    "cancelling captures",
    "service captures",
    "stats reads",
    "tokio futures",
    "hand-executor futures",
    "orphan tasks",
    "anchors dropped",
    "unfired returned",
    "unfired run",
];

/// Operations done, per kind.
pub(super) static OPS: [AtomicU64; 26] = [const { AtomicU64::new(0) }; 26];
/// Bumped by every operation, callback and finished future: the hang guard's pulse.
pub(super) static PROGRESS: AtomicU64 = AtomicU64::new(0);
/// Violations found.
static VIOLATIONS: AtomicU64 = AtomicU64::new(0);
/// The first violations' messages.
static VIOLATION_LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Times a `Stats` counter read lower than an earlier read (under load).
pub(super) static REGRESSIONS: AtomicU64 = AtomicU64::new(0);
/// Where the run is, for the hang report.
pub(super) static STAGE: Mutex<String> = Mutex::new(String::new());

/// Counts one `op`.
pub(super) fn bump(op: Op) {
    // ORDERING: Relaxed: statistics and a pulse; nothing is published through them.
    OPS[op as usize].fetch_add(1, Ordering::Relaxed);
    PROGRESS.fetch_add(1, Ordering::Relaxed);
}

/// Records and prints a violation.
pub(super) fn violation(message: String) {
    // ORDERING: Relaxed: a count read at the end, after the joins.
    let n = VIOLATIONS.fetch_add(1, Ordering::Relaxed);
    if n < 50 {
        eprintln!("VIOLATION: {message}");
    }
    let mut log = VIOLATION_LOG.lock().unwrap_or_else(|e| e.into_inner());
    if log.len() < 50 {
        log.push(message);
    }
}

/// Violations so far.
pub(super) fn violations() -> u64 {
    // ORDERING: Relaxed: as in `violation`.
    VIOLATIONS.load(Ordering::Relaxed)
}

/// Says where the run is (for the hang report).
pub(super) fn stage(text: String) {
    PROGRESS.fetch_add(1, Ordering::Relaxed);
    *STAGE.lock().unwrap_or_else(|e| e.into_inner()) = text;
}

/// A deliberate panic (silenced by the hook).
pub(super) fn deliberate(what: &str) -> ! {
    std::panic::panic_any(format!("{DELIBERATE} {what}"))
}

/// The text of a panic payload.
pub(super) fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else {
        "(not a string)".to_owned()
    }
}

/// Silences deliberate panics; any other panic, on any thread, is a violation.
pub(super) fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if payload_text(info.payload()).starts_with(DELIBERATE) {
            return;
        }
        let thread = std::thread::current();
        violation(format!(
            "unexpected panic on thread {}: {info}",
            thread.name().unwrap_or("?")
        ));
        default(info);
    }));
}

/// Total operations so far.
pub(super) fn total_ops() -> u64 {
    OPS.iter().map(|n| n.load(Ordering::Relaxed)).sum()
}

/// Prints the per-kind counts and the verdict.
pub(super) fn print_summary(seconds: Option<(f64, u64)>) {
    println!("\nchaos: operations by kind");
    for (name, count) in OP_NAMES.iter().zip(OPS.iter()) {
        println!("  {name:<24} {:>12}", count.load(Ordering::Relaxed));
    }
    let log = VIOLATION_LOG
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    for message in log.iter().take(10) {
        println!("  violation: {message}");
    }
    println!(
        "  Stats counters read lower than an earlier read, under load (not a violation): {}",
        REGRESSIONS.load(Ordering::Relaxed)
    );
    let (secs, phases) = seconds.unwrap_or((0.0, 0));
    println!(
        "chaos: {secs:.0} s, {phases} phases, {} operations, violations {}: {}",
        total_ops(),
        violations(),
        if violations() == 0 { "PASS" } else { "FAIL" }
    );
}
