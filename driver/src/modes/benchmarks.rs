//! `--compare --write FILE`: the whole of `docs/benchmarks.md` from one run. The
//! file names the machine, the commit (and whether the tree was dirty), the date and
//! the method; gives every peer's rate and CPU ns per operation in every workload as
//! the median and the spread (lowest–highest) of interleaved rounds; gives ratios to
//! each peer with their spread over rounds, calling one a lead or a loss only when the
//! whole spread lies on one side of 1; reports a peer whose own run failed (timers
//! early or lost, timeouts elapsed, closes lost) as a failed run with its counts,
//! never as a ratio; and shows the `--plot` charts.
//!
//! A ratio is computed round by round (rounds are interleaved: within a round every
//! peer ran back to back, so a round's ratio sees one phase of a shared machine), and
//! the file gives the median of those ratios with their lowest and highest.
//!
//! Figures from another machine live in their own file, written by the same command
//! there (`--write docs/benchmarks-16-cores.md --plot docs/charts/16-cores`); this
//! file links every `benchmarks-*.md` beside it, with the machine, commit and date
//! that file names, so that each is replaced only when re-measured.

#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::modes::compare::{CompareReport, Row};
use crate::modes::conditions::{Column, ConditionsReport, BUSY_LOOPS_PER_CORE};
use crate::modes::timeouts::{TimeoutRow, UsersTimeouts};
use crate::report::{Lateness, Machine};
use crate::workloads::net::NetRound;

/// Rounds below this many give a spread too thin to call a lead or a loss.
const ROUNDS_TO_JUDGE: usize = 3;

/// One peer's rounds in one workload.
#[derive(Debug)]
struct Series {
    /// The peer's name.
    peer: String,
    /// Every round's rate (operations per second) and CPU ns per operation.
    rounds: Vec<(f64, f64)>,
    /// Why its run counts as failed (the counts), if it does.
    failure: Option<String>,
}

/// One workload: a table of every peer, sharded-timer first.
#[derive(Debug)]
struct Section {
    /// The heading.
    title: String,
    /// What one operation is, for the rate's unit ("pairs/s").
    unit: &'static str,
    /// The label of its row in the summary, if it has one.
    summary: Option<String>,
    /// The peers, sharded-timer (the reference) first.
    series: Vec<Series>,
}

/// What the run was, besides its figures.
#[derive(Debug)]
pub(crate) struct Context<'a> {
    /// The machine and the build.
    pub(crate) machine: &'a Machine,
    /// Interleaved rounds per figure.
    pub(crate) rounds: usize,
    /// The command line after the program's name.
    pub(crate) arguments: Vec<String>,
    /// When the run started and ended.
    pub(crate) started: SystemTime,
    /// See `started`.
    pub(crate) finished: SystemTime,
    /// The commit the tree was at when the run started, and the tracked files that
    /// differed from it then ([`commit`]: read before the run writes its charts).
    pub(crate) commit: (String, Vec<String>),
    /// The 1-minute load average at the start and at the end.
    pub(crate) load: (Option<f64>, Option<f64>),
    /// The charts `--plot` wrote.
    pub(crate) charts: Vec<PathBuf>,
}

/// Per peer (sharded-timer first): its name and every round.
pub(crate) type NetRuns = Vec<(&'static str, Vec<NetRound>)>;

/// The busy net rounds run with this share of the quiet rounds' connections (one
/// in this many): with all of them, beside the busy loops, every peer's server
/// falls behind its clients' 1 s request timeouts on 2 cores.
pub(crate) const NET_BUSY_SHARE: usize = 4;

/// The net workload's figures: each round in a fresh process, quiet and busy.
#[derive(Debug, serde::Serialize)]
pub(crate) struct NetFigures {
    /// Connections per quiet round.
    pub(crate) connections: usize,
    /// Connections per busy round.
    pub(crate) busy_connections: usize,
    /// Busy-loop threads beside the busy rounds.
    pub(crate) loops: usize,
    /// Quiet rounds.
    pub(crate) quiet: NetRuns,
    /// Rounds beside the busy loops.
    pub(crate) busy: NetRuns,
}

/// The async timeouts' figures: warm in the driver's process, and in the users'
/// conditions.
#[derive(Debug)]
pub(crate) struct Timeouts<'a> {
    /// Warm, in the driver's process, quiet.
    pub(crate) warm: &'a [TimeoutRow],
    /// A fresh process per run, quiet and busy.
    pub(crate) users: &'a UsersTimeouts,
}

/// Writes the file.
///
/// # Errors
///
/// A message naming the file, if it could not be written.
pub(crate) fn write(
    path: &Path,
    context: &Context<'_>,
    compare: Option<&CompareReport>,
    timeouts: &Timeouts<'_>,
    net: Option<&NetFigures>,
) -> Result<(), String> {
    let sections = sections(compare, timeouts, net);
    let text = render(path, context, &sections, compare, net);
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|error| format!("--write: creating {}: {error}", dir.display()))?;
    }
    std::fs::write(path, text).map_err(|error| format!("--write: {}: {error}", path.display()))
}

/// The median (the upper middle of an even count, as the driver's `median_by`), the
/// lowest and the highest of `values`; NaN for none.
fn spread(values: impl Iterator<Item = f64>) -> (f64, f64, f64) {
    let mut values: Vec<f64> = values.filter(|v| !v.is_nan()).collect();
    if values.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

/// A rate in a table cell: `12.34 M`, `567.8 k` or `950`.
fn rate(value: f64) -> String {
    if value.is_nan() {
        "n/a".into()
    } else if value >= 1e6 {
        format!("{:.2} M", value / 1e6)
    } else if value >= 1e3 {
        format!("{:.1} k", value / 1e3)
    } else {
        format!("{value:.0}")
    }
}

/// CPU ns per operation in a table cell.
fn ns(value: f64) -> String {
    if value.is_nan() {
        "n/a".into()
    } else if value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

/// A ratio's verdict from its spread: `higher_is_better` for rates, not for CPU.
fn judge(low: f64, high: f64, rounds: usize, higher_is_better: bool) -> &'static str {
    if rounds < ROUNDS_TO_JUDGE {
        "not judged (too few rounds)"
    } else if low.is_nan() || high.is_nan() {
        "n/a"
    } else if low > 1.0 {
        if higher_is_better {
            "lead"
        } else {
            "loss"
        }
    } else if high < 1.0 {
        if higher_is_better {
            "loss"
        } else {
            "lead"
        }
    } else {
        "within noise"
    }
}

/// sharded-timer's figure ÷ the peer's, round by round: the median, the spread and
/// the verdict, as `1.23× (1.10–1.31), lead`.
fn ratio(ours: &Series, peer: &Series, pick: fn(&(f64, f64)) -> f64, higher: bool) -> String {
    let per_round = ours
        .rounds
        .iter()
        .zip(&peer.rounds)
        .map(|(o, p)| pick(o) / pick(p));
    let (median, low, high) = spread(per_round);
    if median.is_nan() {
        return "n/a".into();
    }
    let rounds = ours.rounds.len().min(peer.rounds.len());
    format!(
        "{median:.2}× ({low:.2}–{high:.2}), {}",
        judge(low, high, rounds, higher)
    )
}

/// A short form of [`ratio`] for the summary: `1.23×, lead`.
fn ratio_short(ours: &Series, peer: &Series, pick: fn(&(f64, f64)) -> f64, higher: bool) -> String {
    let per_round = ours
        .rounds
        .iter()
        .zip(&peer.rounds)
        .map(|(o, p)| pick(o) / pick(p));
    let (median, low, high) = spread(per_round);
    if median.is_nan() {
        return "n/a".into();
    }
    let rounds = ours.rounds.len().min(peer.rounds.len());
    format!("{median:.2}×, {}", judge(low, high, rounds, higher))
}

/// A failure text for a timer workload's row, if its run failed.
fn row_failure(row: &Row) -> Option<String> {
    row.failed()
        .then(|| format!("{} early, {} lost", row.early, row.lost))
}

/// Every workload's section, in the file's order.
fn sections(
    compare: Option<&CompareReport>,
    timeouts: &Timeouts<'_>,
    net: Option<&NetFigures>,
) -> Vec<Section> {
    let mut sections = Vec::new();
    if let Some(report) = compare {
        let of_rows = |rows: &[Row]| -> Vec<Series> {
            rows.iter()
                .map(|row| Series {
                    peer: row.peer.to_owned(),
                    rounds: row.rounds.clone(),
                    failure: row_failure(row),
                })
                .collect()
        };
        sections.push(Section {
            title: "rpc: request timeouts, 97 % cancelled, on top of 1 M pending".into(),
            unit: "pairs/s",
            summary: Some("rpc (schedule+cancel, 1 M pending)".into()),
            series: of_rows(&report.rpc),
        });
        sections.push(Section {
            title: "burst: 1 M timers due at one instant, drain rate".into(),
            unit: "fired/s",
            summary: Some("burst (1 M due at once, drain)".into()),
            series: of_rows(&report.burst),
        });
        sections.push(Section {
            title: "firehose: 1 M timers due in 10–1000 ms from 2 unpinned producers without pause, schedule rate".into(),
            unit: "timers/s",
            summary: Some("firehose (2 unpinned producers, spread deadlines)".into()),
            series: of_rows(&report.firehose),
        });
        let loops = report.users.loops;
        for (condition, label, rows) in [
            ("quiet".to_owned(), "quiet", &report.users.quiet),
            (
                format!("beside {loops} busy-loop threads"),
                "busy",
                &report.users.busy,
            ),
        ] {
            for (workload, rows) in rows.each() {
                sections.push(Section {
                    title: format!(
                        "{}, users' conditions: a fresh process per run, producers unpinned, boxed callbacks, {condition}",
                        workload.name()
                    ),
                    unit: workload.unit(),
                    summary: Some(format!("{}, cold, {label}", workload.name())),
                    series: of_rows(rows),
                });
            }
        }
        let columns = report.producers.len();
        for (cancel, name) in [(false, "schedule"), (true, "schedule+cancel")] {
            for (index, &producers) in report.producers.iter().enumerate() {
                let column = usize::from(cancel) * columns + index;
                let summary = match (cancel, producers) {
                    (false, 2) => Some("schedule, 2 producers".into()),
                    (true, 2) => Some("schedule+cancel, 2 producers".into()),
                    _ => None,
                };
                sections.push(Section {
                    title: format!(
                        "{name}: 1 M timers from {producers} producer thread{}",
                        if producers == 1 { "" } else { "s" }
                    ),
                    unit: if cancel { "pairs/s" } else { "timers/s" },
                    summary,
                    series: report
                        .schedule_rounds
                        .iter()
                        .map(|(peer, rounds)| Series {
                            peer: (*peer).to_owned(),
                            rounds: rounds[column].clone(),
                            failure: None,
                        })
                        .collect(),
                });
            }
        }
    }
    if let Some(report) = compare {
        for column in &report.conditions.columns {
            sections.push(Section {
                title: condition_title(column, report.conditions.busy_loops),
                unit: if column.cancel { "pairs/s" } else { "timers/s" },
                summary: None,
                series: condition_series(column),
            });
        }
    }
    let users = timeouts.users;
    for (condition, label, rows) in [
        ("warm, in the driver's process", "", timeouts.warm),
        (
            "a fresh process per run, quiet",
            ", cold",
            users.quiet.as_slice(),
        ),
        (
            &*format!(
                "a fresh process per run, beside {} busy-loop threads",
                users.loops
            ),
            ", cold, busy",
            users.busy.as_slice(),
        ),
    ] {
        if rows.is_empty() {
            continue;
        }
        type Pick = fn(&TimeoutRow) -> (&Vec<(f64, f64)>, u64, &Option<String>);
        let shapes: [(&str, &'static str, Pick); 2] = [
            (
                "async timeouts, the reply pending at the first poll (the timer armed, then cancelled)",
                "async timeout, armed then cancelled",
                |row| (&row.pending_once_rounds, row.timed_out.0, &row.failure.0),
            ),
            (
                "async timeouts, the reply ready at the first poll (no timer needed)",
                "async timeout, reply ready at once",
                |row| (&row.ready_rounds, row.timed_out.1, &row.failure.1),
            ),
        ];
        for (title, summary, pick) in shapes {
            sections.push(Section {
                title: format!("{title}, {condition}"),
                unit: "timeouts/s",
                summary: Some(format!("{summary}{label}")),
                series: rows
                    .iter()
                    .map(|row| {
                        let (rounds, timed_out, failure) = pick(row);
                        Series {
                            peer: row.peer.to_owned(),
                            rounds: rounds.clone(),
                            failure: failure.clone().or_else(|| {
                                (timed_out > 0).then(|| format!("{timed_out} timeouts elapsed"))
                            }),
                        }
                    })
                    .collect(),
            });
        }
    }
    if let Some(net) = net {
        for (condition, connections, summary, runs) in [
            (
                "quiet".to_owned(),
                net.connections,
                "net (TCP on loopback), cold, quiet",
                &net.quiet,
            ),
            (
                format!(
                    "beside {} busy-loop threads (1/{NET_BUSY_SHARE} of the connections: with all of them every peer's requests time out)",
                    net.loops
                ),
                net.busy_connections,
                "net (TCP on loopback), cold, busy",
                &net.busy,
            ),
        ] {
            sections.push(Section {
                title: format!(
                    "net: a tokio TCP server and {connections} loopback connections, a timeout per request, an idle close per connection; a fresh process per run, {condition}"
                ),
                unit: "requests/s",
                summary: Some(summary.into()),
                series: runs
                    .iter()
                    .map(|(peer, rounds)| Series {
                        peer: (*peer).to_owned(),
                        rounds: rounds
                            .iter()
                            .map(|r| (r.requests_per_sec, r.cpu_ns_per_request))
                            .collect(),
                        failure: net_failure(rounds),
                    })
                    .collect(),
            });
        }
    }
    sections
}

/// The heading of a users'-conditions column.
fn condition_title(column: &Column, busy_loops: usize) -> String {
    format!(
        "{}: 1 M timers from {} unpinned producer{}, boxed callbacks, a fresh process per run, {}",
        column.workload(),
        column.producers,
        if column.producers == 1 { "" } else { "s" },
        if column.busy {
            format!("busy ({busy_loops} busy loops)")
        } else {
            "quiet".to_owned()
        }
    )
}

/// A users'-conditions column's peers as series, sharded-timer first.
fn condition_series(column: &Column) -> Vec<Series> {
    column
        .peers
        .iter()
        .map(|peer| Series {
            peer: peer.peer.to_owned(),
            rounds: peer.rounds.clone(),
            failure: peer.failure.clone(),
        })
        .collect()
}

/// The users' conditions' summary: each column's quiet and busy figures side by
/// side, sharded-timer's median rate and, against each outside timer peer, the rate
/// and CPU ratios with their verdicts.
fn conditions_summary(o: &mut String, report: &ConditionsReport, rounds: usize) {
    const PEERS: [(&str, &str); 3] = [
        ("netty-style wheel", "netty-style"),
        ("tokio", "tokio"),
        ("heap timer", "heap"),
    ];
    let _ = writeln!(
        o,
        "### In the users' conditions: cold, unpinned, quiet and busy
"
    );
    let _ = writeln!(
        o,
        "Each figure from a fresh process per run (a newly started service's first million timers), producers not pinned, each callback a `Box<dyn FnOnce() + Send>` with a 16-byte capture, deadlines spread over 1–60 s; busy: beside {} busy-loop threads ({BUSY_LOOPS_PER_CORE} per core, normal priority, in a process of their own that the harness starts before the busy runs and stops after). Each cell: sharded-timer's rate ÷ the peer's, then its CPU per operation ÷ the peer's (below 1 is less CPU), medians over {rounds} interleaved rounds, a lead or a loss only where every round agrees.\n",
        report.busy_loops
    );
    let _ = write!(o, "| workload | quiet: sharded-timer |");
    for (title, _) in PEERS {
        let _ = write!(o, " ÷ {title} |");
    }
    let _ = write!(o, " busy: sharded-timer |");
    for (title, _) in PEERS {
        let _ = write!(o, " ÷ {title} |");
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "|---|---:|{}---:|{}",
        "---|".repeat(PEERS.len()),
        "---|".repeat(PEERS.len())
    );
    let quiet = report.columns.iter().filter(|c| !c.busy);
    for column in quiet {
        let busy = report
            .columns
            .iter()
            .find(|c| c.busy && c.cancel == column.cancel && c.producers == column.producers);
        let unit = if column.cancel { "pairs/s" } else { "timers/s" };
        let _ = write!(
            o,
            "| {}, {} producer{} |",
            column.workload(),
            column.producers,
            if column.producers == 1 { "" } else { "s" }
        );
        for side in [Some(column), busy] {
            let Some(side) = side else {
                let _ = write!(o, " — |{}", " — |".repeat(PEERS.len()));
                continue;
            };
            let series = condition_series(side);
            let ours = &series[0];
            let (median, ..) = spread(ours.rounds.iter().map(|r| r.0));
            let _ = write!(o, " {} {unit} |", rate(median));
            for (_, name) in PEERS {
                let cell = match series.iter().skip(1).find(|s| s.peer == name) {
                    None => "—".to_owned(),
                    Some(_) if ours.failure.is_some() => "sharded-timer's run failed".into(),
                    Some(peer) if peer.failure.is_some() => "failed run".into(),
                    Some(peer) => format!(
                        "{}; CPU {}",
                        ratio_short(ours, peer, |r| r.0, true),
                        ratio_short(ours, peer, |r| r.1, false)
                    ),
                };
                let _ = write!(o, " {cell} |");
            }
        }
        let _ = writeln!(o);
    }
    let _ = writeln!(o);
}

/// A failure text for a peer's net rounds, if any failed: the counts over all rounds.
fn net_failure(rounds: &[NetRound]) -> Option<String> {
    if !rounds.iter().any(NetRound::failed) {
        return None;
    }
    let sum = |f: fn(&NetRound) -> u64| rounds.iter().map(f).sum::<u64>();
    Some(format!(
        "{} requests timed out, {} clients failed, {} idle closes lost, {} busy connections closed, {} closes early",
        sum(|r| r.timed_out),
        sum(|r| r.failed),
        sum(|r| r.lost_closes),
        sum(|r| r.busy_closed),
        sum(|r| r.early),
    ))
}

/// The outside peers of the summary: a column title and the names it covers (one
/// per section at most).
const SUMMARY_PEERS: [(&str, &[&str]); 4] = [
    ("tokio", &["tokio", "tokio-timeout", "tokio::time"]),
    ("netty-style wheel", &["netty-style"]),
    ("heap timer", &["heap"]),
    ("pingora", &["pingora", "pingora (timeouts)"]),
];

/// The commit the tree is at, and the tracked files that differ from it.
pub(crate) fn commit() -> (String, Vec<String>) {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok())
    };
    let head = run(&["rev-parse", "HEAD"]).map_or_else(|| "unknown".into(), |s| s.trim().into());
    let dirty = run(&["status", "--porcelain", "--untracked-files=no"])
        .map(|text| {
            text.lines()
                .filter_map(|line| line.get(3..).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    (head, dirty)
}

/// A load average for the text.
fn load(value: Option<f64>) -> String {
    value.map_or("n/a".into(), |v| format!("{v:.2}"))
}

/// The whole file.
fn render(
    path: &Path,
    context: &Context<'_>,
    sections: &[Section],
    compare: Option<&CompareReport>,
    net: Option<&NetFigures>,
) -> String {
    let machine = context.machine;
    let (head, dirty) = &context.commit;
    let command = format!("cargo run --release -- {}", context.arguments.join(" "));
    let minutes = context
        .finished
        .duration_since(context.started)
        .map_or(0.0, |d| d.as_secs_f64() / 60.0);
    let mut out = String::new();
    let o = &mut out;
    let _ = writeln!(o, "# Benchmarks\n");
    let _ = writeln!(
        o,
        "<!-- Written whole by the driver (driver/src/modes/benchmarks.rs); do not edit: run the command again. -->\n"
    );
    let _ = writeln!(
        o,
        "Every figure here comes from one run of one command, at the commit below. The\nREADME's table is the summary below.\n"
    );
    let _ = writeln!(o, "- Command: `{command}`");
    let _ = writeln!(
        o,
        "- Machine: {} cores of {}, {}",
        machine.cores, machine.cpu_model, machine.kernel
    );
    let _ = writeln!(
        o,
        "- Commit: {head}{}",
        if dirty.is_empty() {
            " (clean tree)".to_owned()
        } else {
            format!(
                " with uncommitted changes to {} tracked file{}: {}",
                dirty.len(),
                if dirty.len() == 1 { "" } else { "s" },
                dirty.join(", ")
            )
        }
    );
    let _ = writeln!(
        o,
        "- Date: {} (UTC); the run took {minutes:.1} min",
        humantime::format_rfc3339_seconds(context.started)
    );
    let _ = writeln!(o, "- Toolchain: {}", machine.rustc);
    let _ = writeln!(
        o,
        "- Load average (1 min) at the start and the end: {} and {} (another process's load slows every peer alike within a round, not across rounds)",
        load(context.load.0),
        load(context.load.1)
    );
    let _ = writeln!(o, "- Rounds: {}, interleaved", context.rounds);
    summary(o, sections, context.rounds);
    if let Some(report) = compare {
        conditions_summary(o, &report.conditions, context.rounds);
    }
    method(o, context.rounds);
    let _ = writeln!(o, "## Every workload\n");
    let _ = writeln!(
        o,
        "Rate and CPU ns per operation: the median round, then the lowest and highest. Ratios: sharded-timer's figure ÷ the peer's, round by round, the median and the spread; for the rate above 1 is ahead, for CPU below 1 is ahead.\n"
    );
    for section in sections {
        table(o, section);
    }
    if let Some(report) = compare {
        details(o, report);
    }
    if let Some(net) = net {
        net_lateness(o, net);
    }
    charts(o, path, &context.charts);
    other_machines(o, path);
    out
}

/// The summary: one row per workload, sharded-timer's median rate and, against each
/// outside peer, the rate ratio and its verdict.
fn summary(o: &mut String, sections: &[Section], rounds: usize) {
    let _ = writeln!(o, "\n## Summary\n");
    let _ = writeln!(
        o,
        "sharded-timer's rate ÷ each peer's: the median over {rounds} interleaved round{}, and a lead or a loss only where every round agrees (else within noise). \"failed run\": that peer's own run went wrong (its counts are in its section); no ratio is given.\n",
        if rounds == 1 { "" } else { "s" }
    );
    let _ = write!(o, "| workload | sharded-timer |");
    for (title, _) in SUMMARY_PEERS {
        let _ = write!(o, " ÷ {title} |");
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "|---|---:|{}", "---|".repeat(SUMMARY_PEERS.len()));
    for section in sections {
        let Some(label) = &section.summary else {
            continue;
        };
        let Some(ours) = section.series.first() else {
            continue;
        };
        let (median, ..) = spread(ours.rounds.iter().map(|r| r.0));
        let _ = write!(o, "| {label} | {} {} |", rate(median), section.unit);
        for (_, names) in SUMMARY_PEERS {
            let peer = section
                .series
                .iter()
                .skip(1)
                .find(|s| names.contains(&s.peer.as_str()));
            let cell = match peer {
                None => "—".to_owned(),
                Some(_) if ours.failure.is_some() => "sharded-timer's run failed".into(),
                Some(peer) if peer.failure.is_some() => "failed run".into(),
                Some(peer) => ratio_short(ours, peer, |r| r.0, true),
            };
            let _ = write!(o, " {cell} |");
        }
        let _ = writeln!(o);
    }
    let _ = writeln!(o);
}

/// The method section.
fn method(o: &mut String, rounds: usize) {
    let plural = if rounds == 1 { "" } else { "s" };
    let _ = writeln!(
        o,
        "## Method\n
- **Interleaved rounds.** Each workload runs {rounds} round{plural}; in each round every peer runs once, back to back, in the same order. A figure is the median round; its spread is the lowest and highest round. A ratio is taken within each round (the peers of one round saw the same phase of the machine) and given as the median of those ratios with their lowest and highest: a lead or a loss only when every round's ratio is on the same side of 1.0, else within noise. With fewer than {ROUNDS_TO_JUDGE} rounds nothing is judged.
- **CPU ns per operation**: the process's CPU time, user and system, of every thread (the timer's own threads, the producers and the runtime's workers; `clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`), over the measured phase, divided by its operations. On a machine with few cores it says what a rate cannot: how much of the machine each operation costs.
- **Checked runs.** Every timer workload records each callback against its deadline: an early fire or a timer due and not fired by the end of the wait makes that peer's run a failed run; so does an elapsed timeout in the async section, and in `net` a request timed out, a client failed, a quiet connection never closed, a busy one closed, or a close before its deadline. A failed run is reported with its counts, never as a ratio.
- **Peers.** `sharded-timer`: the service at its defaults (a shard per core, pinned, callbacks on its pool, 1 ms tick); `sharded-unpinned`, `sharded-inline`, `sharded-spawn`: the same with shards unpinned, callbacks inline on the shards, callbacks each spawned onto a rayon pool. `tokio`: a `tokio::time::sleep` per timer, `tokio-timeout`: a `tokio::time::timeout` around each request, both as their users write them (registered where created, dropped to cancel). `heap`: a `Mutex<BinaryHeap>` and a timer thread (as `java.util.Timer`). `netty-style`: one `Mutex`-guarded hashed wheel with rounds and one thread (as Netty's `HashedWheelTimer`). `pingora`: Cloudflare's `pingora-timeout` `fast_timeout` (deadlines rounded up to 10 ms and shared). Every peer ticks at 1 ms; producer threads are pinned one per core for every peer alike.
- **rpc**: 2 producers make 1 M requests, each with a 300 ms timeout, on top of 1 M pending timers; each request is answered (its timer cancelled) 1,024 requests later, 97 % of the time; the rest time out. Rate: schedule+cancel pairs per second; lateness: of the timeouts that fire.
- **burst**: 1 M timers due at one instant, scheduled from 2 producers; rate: timers fired per second from the deadline to the last callback.
- **firehose**: 2 producer threads, not pinned, schedule 1 M timers due uniformly 10–1000 ms ahead as fast as they can, each callback a `Box<dyn FnOnce() + Send>`; rate: timers scheduled per second; lateness: of every timer, those that come due while the producers still file included (expiry must not wait for the filing to end).
- **schedule, schedule+cancel**: 1 M timers, delays spread over 1–60 s, from 1, 2 and 8 producer threads, each keeping its handles; with cancel, each timer is cancelled right after it is scheduled. Rate: from the moment every producer is ready to the moment the last returns from its last call (a peer that takes timers in on its own thread, as netty-style, tokio's tasks and sharded-timer's rings do, may still be filing them then; its CPU for that is counted only as far as it ran inside the window).
- **The classic rows and the users' conditions.** rpc, burst, firehose, schedule, schedule+cancel and the async timeouts are measured twice. *Classic*: in the driver's own process (warm: earlier rounds have grown its allocator's arenas and sharded-timer's entry pool), rpc's and burst's producers pinned one per core, callbacks plain closures. *Users' conditions* (\"cold\"): each run of each peer in a fresh process of the driver (`--cold-cell`, hidden: the figure a newly started service sees), producers not pinned (the OS places them, as a runtime's workers), each callback a `Box<dyn FnOnce() + Send>` with a 16-byte capture; first quiet, then beside {BUSY_LOOPS_PER_CORE} busy-loop threads per core at normal priority in a process of their own (`--busy-loops`, hidden; started before the busy runs and stopped after), so that the CPU time measured is the measured process's own. net runs only in the users' conditions, quiet and busy. rpc, burst and firehose in the users' conditions run on sharded-timer and the outside peers.
- **memory**: allocated bytes (a counting global allocator, not RSS) per pending timer for 1 M pending timers, the caller keeping its handle, minus the 16-byte closure each captures; measured once, first thing in the process.
- **async timeouts**: on a tokio multi-thread runtime (one worker per core), 1,000 tasks each await 1,000 `timeout(1 s, f)` in turn; `f` is pending at the first poll and ready at the second (the timer is armed, then cancelled by the drop), or ready at once. sharded-timer runs with inline callbacks, as its docs advise an async program.
- **net**: a tokio TCP server on loopback and its clients in one process (a fresh one per run): each request (8 bytes each way) under a 1 s timeout on both sides, the server closing a connection idle for 2 s through a `Sleep` reset by every message. Rate and CPU: requests over 1.5 s of back-to-back requests; then half the connections go quiet and their idle closes are timed (when the server task ran the close, after the deadline). pingora's column uses `fast_timeout` for the timeouts and tokio's `Sleep` for the idle close (pingora has no resettable sleep).
"
    );
}

/// One workload's table.
fn table(o: &mut String, section: &Section) {
    let _ = writeln!(o, "### {}\n", section.title);
    let _ = writeln!(
        o,
        "| peer | {} (lowest–highest) | CPU ns/op (lowest–highest) | rate ratio | CPU ratio |",
        section.unit
    );
    let _ = writeln!(o, "|---|---:|---:|---|---|");
    let Some(ours) = section.series.first() else {
        return;
    };
    for (index, series) in section.series.iter().enumerate() {
        let (rate_median, rate_low, rate_high) = spread(series.rounds.iter().map(|r| r.0));
        let (cpu_median, cpu_low, cpu_high) = spread(series.rounds.iter().map(|r| r.1));
        let (rate_ratio, cpu_ratio) = if index == 0 {
            match &series.failure {
                Some(failure) => (format!("**failed run**: {failure}"), String::new()),
                None => ("(reference)".to_owned(), String::new()),
            }
        } else if let Some(failure) = &series.failure {
            (format!("**failed run**: {failure}"), String::new())
        } else if ours.failure.is_some() {
            ("sharded-timer's run failed".to_owned(), String::new())
        } else {
            (
                ratio(ours, series, |r| r.0, true),
                ratio(ours, series, |r| r.1, false),
            )
        };
        let _ = writeln!(
            o,
            "| {} | {} ({}–{}) | {} ({}–{}) | {rate_ratio} | {cpu_ratio} |",
            series.peer,
            rate(rate_median),
            rate(rate_low),
            rate(rate_high),
            ns(cpu_median),
            ns(cpu_low),
            ns(cpu_high),
        );
    }
    let _ = writeln!(o);
}

/// The rpc timeouts' lateness, the burst's drain and the memory per pending timer.
fn details(o: &mut String, report: &CompareReport) {
    let _ = writeln!(o, "### Lateness (median round)\n");
    let _ = writeln!(
        o,
        "rpc: of the ~3 % of timeouts that fire; burst: of every timer (its maximum is the drain); firehose: of every timer. µs after the deadline; early fires must be 0 (summed over every round).\n"
    );
    let _ = writeln!(
        o,
        "| workload | peer | p50 µs | p99 µs | p99.9 µs | max µs | early |"
    );
    let _ = writeln!(o, "|---|---|---:|---:|---:|---:|---:|");
    let classic = [
        ("rpc".to_owned(), &report.rpc),
        ("burst".to_owned(), &report.burst),
        ("firehose".to_owned(), &report.firehose),
    ];
    let users = [
        ("cold, quiet", &report.users.quiet),
        ("cold, busy", &report.users.busy),
    ]
    .into_iter()
    .flat_map(|(condition, rows)| {
        rows.each()
            .map(|(workload, rows)| (format!("{}, {condition}", workload.name()), rows))
    });
    for (name, rows) in classic.into_iter().chain(users) {
        for row in rows {
            let [p50, p99, p999, max] = row.lateness;
            let _ = writeln!(
                o,
                "| {name} | {} | {p50} | {p99} | {p999} | {max} | {} |",
                row.peer, row.early
            );
        }
    }
    let _ = writeln!(o, "\n### Memory per pending timer\n");
    let _ = writeln!(
        o,
        "Allocated bytes per pending timer with 1 M pending, the caller keeping its handle (handle included, the 16-byte closure excluded); one measurement.\n"
    );
    let _ = writeln!(
        o,
        "| peer | bytes per pending timer | of which the handle | sharded-timer ÷ peer |"
    );
    let _ = writeln!(o, "|---|---:|---:|---:|");
    let ours = report.memory.first().map_or(f64::NAN, |m| m.1);
    for (peer, bytes, handle) in &report.memory {
        let _ = writeln!(
            o,
            "| {peer} | {bytes:.1} | {handle} | {:.2}× |",
            ours / bytes
        );
    }
    let _ = writeln!(o);
}

/// The net workload's idle closes: lateness of the median round by rate, quiet and
/// busy.
fn net_lateness(o: &mut String, net: &NetFigures) {
    let _ = writeln!(o, "### net: idle closes after their deadline\n");
    let _ = writeln!(
        o,
        "Lateness of the server's idle closes (the task *ran*, not only woken), ms, in each peer's median round (by rate); failures summed over every round. Quiet: {} connections; busy: {} connections beside {} busy-loop threads.\n",
        net.connections, net.busy_connections, net.loops
    );
    let _ = writeln!(
        o,
        "| condition | peer | p50 ms | p99 ms | max ms | timed out | clients failed | closes lost | busy closed | early |"
    );
    let _ = writeln!(o, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (condition, runs) in [("quiet", &net.quiet), ("busy", &net.busy)] {
        for (peer, rounds) in runs {
            let Some(median) = median_round(rounds) else {
                continue;
            };
            let l: Lateness = median.idle_close_lateness;
            let sum = |f: fn(&NetRound) -> u64| rounds.iter().map(f).sum::<u64>();
            let _ = writeln!(
                o,
                "| {condition} | {peer} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} |",
                l.p50 as f64 / 1e3,
                l.p99 as f64 / 1e3,
                l.max as f64 / 1e3,
                sum(|r| r.timed_out),
                sum(|r| r.failed),
                sum(|r| r.lost_closes),
                sum(|r| r.busy_closed),
                sum(|r| r.early),
            );
        }
    }
    let _ = writeln!(o);
}

/// The round with the median rate (the upper middle of an even count).
fn median_round(rounds: &[NetRound]) -> Option<&NetRound> {
    let mut sorted: Vec<&NetRound> = rounds.iter().collect();
    sorted.sort_by(|a, b| a.requests_per_sec.total_cmp(&b.requests_per_sec));
    sorted.get(sorted.len() / 2).copied()
}

/// The charts, as links relative to the file.
fn charts(o: &mut String, path: &Path, charts: &[PathBuf]) {
    if charts.is_empty() {
        return;
    }
    let _ = writeln!(o, "## Charts\n");
    let _ = writeln!(
        o,
        "Drawn by the same run (`--plot`); the ratio chart shows the ratio of the median rates.\n"
    );
    let base = path.parent().unwrap_or(Path::new(""));
    for chart in charts {
        let relative = chart.strip_prefix(base).unwrap_or(chart);
        let name = chart
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("chart");
        let _ = writeln!(
            o,
            "![{name}]({})\n",
            relative.display().to_string().replace('\\', "/")
        );
    }
}

/// The section that links the files written on other machines beside this one.
fn other_machines(o: &mut String, path: &Path) {
    let _ = writeln!(o, "## Other machines\n");
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let mut found: Vec<(String, Vec<String>)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let other = name.strip_prefix(stem)?.strip_prefix('-')?;
            if !other.ends_with(".md") {
                return None;
            }
            let text = std::fs::read_to_string(entry.path()).ok()?;
            let lines = text
                .lines()
                .filter(|line| {
                    ["- Machine:", "- Commit:", "- Date:"]
                        .iter()
                        .any(|head| line.starts_with(head))
                })
                .map(|line| line.trim_start_matches("- ").to_owned())
                .collect();
            Some((name, lines))
        })
        .collect();
    found.sort();
    if found.is_empty() {
        let _ = writeln!(
            o,
            "None recorded. On another machine (the 16-core one, say), `cargo run --release -- --compare --write {}/{stem}-16-cores.md --plot {}/charts/16-cores` writes a file of this form beside this one, with its own machine, commit and date; the next run of this command links it here. Re-measuring there replaces it.",
            dir.display(),
            dir.display()
        );
        return;
    }
    let _ = writeln!(
        o,
        "Written by the same command on those machines, each at the commit and date it names (re-measuring there replaces it):\n"
    );
    for (name, lines) in found {
        let _ = writeln!(o, "- [{name}]({name}): {}", lines.join("; "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(peer: &str, rates: &[f64], failure: Option<&str>) -> Series {
        Series {
            peer: peer.to_owned(),
            rounds: rates.iter().map(|&rate| (rate, 100.0)).collect(),
            failure: failure.map(str::to_owned),
        }
    }

    #[test]
    fn a_ratio_is_a_lead_or_a_loss_only_when_every_round_agrees() {
        let ours = series("sharded-timer", &[10.0, 12.0, 11.0], None);
        let behind = series("peer", &[5.0, 6.0, 5.5], None);
        let mixed = series("peer", &[9.0, 13.0, 11.0], None);
        let ahead = series("peer", &[20.0, 24.0, 22.0], None);
        assert_eq!(
            ratio(&ours, &behind, |r| r.0, true),
            "2.00× (2.00–2.00), lead"
        );
        // Round ratios 1.11, 0.92, 1.00: the spread straddles 1.
        assert_eq!(
            ratio(&ours, &mixed, |r| r.0, true),
            "1.00× (0.92–1.11), within noise"
        );
        assert_eq!(
            ratio(&ours, &ahead, |r| r.0, true),
            "0.50× (0.50–0.50), loss"
        );
        // CPU: below 1 is the lead.
        assert_eq!(judge(0.4, 0.6, 3, false), "lead");
        assert_eq!(judge(0.4, 0.6, 2, true), "not judged (too few rounds)");
    }

    #[test]
    fn a_failed_peer_run_is_reported_with_its_counts_and_no_ratio() {
        let section = Section {
            title: "net".into(),
            unit: "requests/s",
            summary: Some("net".into()),
            series: vec![
                series("sharded-timer", &[10.0, 11.0, 12.0], None),
                series(
                    "tokio::time",
                    &[20.0, 21.0, 22.0],
                    Some("815 requests timed out"),
                ),
            ],
        };
        let mut text = String::new();
        table(&mut text, &section);
        let row = text
            .lines()
            .find(|line| line.starts_with("| tokio::time"))
            .expect("the peer's row");
        assert!(
            row.contains("**failed run**: 815 requests timed out"),
            "{row}"
        );
        assert!(!row.contains('×'), "a failed run has no ratio: {row}");
        let mut text = String::new();
        summary(&mut text, &[section], 3);
        let row = text
            .lines()
            .find(|line| line.starts_with("| net"))
            .expect("the summary's row");
        assert!(row.contains("| failed run |"), "{row}");
        assert!(!row.contains('×'), "{row}");
    }
}
