//! `--compare`'s users' conditions (issue 41): schedule and schedule+cancel as a
//! service meets them in production, for every peer alike.
//!
//! - **Cold**: each measurement is its own process (the driver runs itself with the
//!   hidden `--cold-cell CELL`, [`Cell`]), so every peer is measured as a newly
//!   started service: its first million timers, its memory not yet warmed by an
//!   earlier round (sharded-timer's entry pool, the allocator's arenas, the page
//!   tables). rpc, burst, firehose, the async timeouts and net run the same way
//!   ([`cold_row`], [`cold_timeout`], [`cold_net`]).
//! - **Unpinned**: producer threads go where the OS puts them, as a runtime's workers
//!   do.
//! - **The common callback**: a `Box<dyn FnOnce() + Send>` with a 16-byte capture, made
//!   per timer by the producer; deadlines spread over 1–60 s (every wheel level).
//! - **Busy**: the same cells again beside [`BUSY_LOOPS_PER_CORE`] busy-loop threads per
//!   core at normal priority, in a process of their own (the driver run with the hidden
//!   `--busy-loops N`), so that the measured process's CPU time is its own. The
//!   harness starts them before the busy cells and stops them after.
//!
//! Rounds are interleaved as in the rest of `--compare`: in each round every column
//! runs every peer once, back to back.

#![forbid(unsafe_code)]

use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::modes::compare::{schedule_rate_shaped, Rounds, Row, Shape, TimerWorkload};
use crate::modes::timeouts;
use crate::peers::Kind;
use crate::workloads::net::{self, NetRound};
use crate::Common;

/// Busy-loop threads per core in the busy cells.
pub(crate) const BUSY_LOOPS_PER_CORE: usize = 4;

/// Producer threads of the columns.
pub(crate) const PRODUCERS: [usize; 3] = [1, 2, 8];

/// A cell that has not printed its figures by then has failed (a hung peer).
const CELL_LIMIT: Duration = Duration::from_secs(120);

/// One cell's rate and CPU ns per operation, or why its process failed.
type CellResult = Result<(f64, f64), String>;

/// One peer's rounds in one column.
#[derive(Debug, Serialize)]
pub(crate) struct PeerRounds {
    /// The peer.
    pub(crate) peer: &'static str,
    /// Every round's rate (timers or pairs per second) and CPU ns per operation, in
    /// round order; NaN for a round whose process failed.
    pub(crate) rounds: Rounds,
    /// What went wrong in the rounds whose process failed, if any did.
    pub(crate) failure: Option<String>,
}

/// One column: a workload at a producer count, quiet or busy.
#[derive(Debug, Serialize)]
pub(crate) struct Column {
    /// schedule+cancel (each timer cancelled right after it is scheduled), else
    /// schedule (each handle kept).
    pub(crate) cancel: bool,
    /// Producer threads, unpinned.
    pub(crate) producers: usize,
    /// Beside the busy loops.
    pub(crate) busy: bool,
    /// Every peer, sharded-timer first.
    pub(crate) peers: Vec<PeerRounds>,
}

impl Column {
    /// The workload's name: `schedule` or `schedule+cancel`.
    pub(crate) fn workload(&self) -> &'static str {
        if self.cancel {
            "schedule+cancel"
        } else {
            "schedule"
        }
    }
}

/// Everything the users' conditions measured.
#[derive(Debug, Serialize)]
pub(crate) struct ConditionsReport {
    /// Busy-loop threads beside the busy cells (per core × cores).
    pub(crate) busy_loops: usize,
    /// The quiet columns, then the busy ones.
    pub(crate) columns: Vec<Column>,
}

/// Runs every column on each of `kinds`, `rounds` times interleaved, each cell in a
/// fresh process; quiet first, then beside the busy loops. Prints a line per column
/// unless `quiet`.
pub(crate) fn run(kinds: &[Kind], rounds: usize, quiet: bool) -> ConditionsReport {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let busy_loops = BUSY_LOOPS_PER_CORE * cores;
    let mut columns = Vec::new();
    for busy in [false, true] {
        let loops = busy.then(|| BusyLoops::start(busy_loops));
        let shapes: Vec<(bool, usize)> = [false, true]
            .into_iter()
            .flat_map(|cancel| PRODUCERS.into_iter().map(move |p| (cancel, p)))
            .collect();
        // Per column, per peer: each round's figures, or what went wrong.
        let mut cells: Vec<Vec<Vec<CellResult>>> =
            vec![vec![Vec::new(); kinds.len()]; shapes.len()];
        for _ in 0..rounds.max(1) {
            for (c, &(cancel, producers)) in shapes.iter().enumerate() {
                for (k, &kind) in kinds.iter().enumerate() {
                    let cell = Cell::Schedule {
                        kind,
                        producers,
                        cancel,
                    };
                    cells[c][k].push(in_fresh_process(&cell));
                }
            }
        }
        drop(loops);
        for (&(cancel, producers), per_peer) in shapes.iter().zip(cells) {
            let column = Column {
                cancel,
                producers,
                busy,
                peers: kinds
                    .iter()
                    .zip(per_peer)
                    .map(|(kind, results)| peer_rounds(kind.name(), results))
                    .collect(),
            };
            if !quiet {
                print(&column, busy_loops);
            }
            columns.push(column);
        }
    }
    ConditionsReport {
        busy_loops,
        columns,
    }
}

/// A peer's rounds from its cells' results: NaN where a process failed, and the
/// failures' texts.
fn peer_rounds(peer: &'static str, results: Vec<CellResult>) -> PeerRounds {
    let mut failures = Vec::new();
    let rounds = results
        .into_iter()
        .map(|result| {
            result.unwrap_or_else(|failure| {
                failures.push(failure);
                (f64::NAN, f64::NAN)
            })
        })
        .collect();
    PeerRounds {
        peer,
        rounds,
        failure: (!failures.is_empty()).then(|| failures.join("; ")),
    }
}

fn print(column: &Column, busy_loops: usize) {
    let condition = if column.busy {
        format!("busy ({busy_loops} busy loops)")
    } else {
        "quiet".to_owned()
    };
    let ours = &column.peers[0];
    let median = |rounds: &Rounds, pick: fn(&(f64, f64)) -> f64| {
        let mut values: Vec<f64> = rounds.iter().map(pick).filter(|v| !v.is_nan()).collect();
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let cells: Vec<String> = column
        .peers
        .iter()
        .map(|peer| {
            let rate = median(&peer.rounds, |r| r.0);
            let cpu = median(&peer.rounds, |r| r.1);
            let ratio = median(&ours.rounds, |r| r.0) / rate;
            match &peer.failure {
                Some(failure) => format!("{}: failed ({failure})", peer.peer),
                None => format!(
                    "{} {:.2} M/s {cpu:.0} ns ({ratio:.2}x)",
                    peer.peer,
                    rate / 1e6
                ),
            }
        })
        .collect();
    println!(
        "\n{}, {} unpinned producer{}, cold, {condition}: {}",
        column.workload(),
        column.producers,
        if column.producers == 1 { "" } else { "s" },
        cells.join(" | ")
    );
}

/// One measurement in a fresh process: what the hidden `--cold-cell` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cell {
    /// schedule (or schedule+cancel) of 1 M timers from `producers` unpinned
    /// producers, boxed callbacks: `schedule:PEER:PRODUCERS:CANCEL`.
    Schedule {
        /// The peer.
        kind: Kind,
        /// Producer threads.
        producers: usize,
        /// schedule+cancel.
        cancel: bool,
    },
    /// rpc, burst or firehose, producers unpinned, callbacks boxed: `WORKLOAD:PEER`.
    Timers {
        /// The workload.
        workload: TimerWorkload,
        /// The peer.
        kind: Kind,
    },
    /// One async timeouts run: `async-pending:PEER` or `async-ready:PEER`.
    Timeout {
        /// The peer.
        peer: timeouts::Peer,
        /// The inner future's shape.
        shape: timeouts::Shape,
    },
    /// One net round: `net:PEER:CONNECTIONS`.
    Net {
        /// The peer.
        peer: net::Peer,
        /// Connections.
        connections: usize,
    },
}

impl Cell {
    /// Its `--cold-cell` spelling, which [`Cell::parse`] reads back.
    pub(crate) fn spec(&self) -> String {
        match *self {
            Cell::Schedule {
                kind,
                producers,
                cancel,
            } => format!("schedule:{}:{producers}:{cancel}", kind.name()),
            Cell::Timers { workload, kind } => format!("{}:{}", workload.name(), kind.name()),
            Cell::Timeout { peer, shape } => {
                format!("async-{}:{}", shape.name(), peer.name())
            }
            Cell::Net { peer, connections } => {
                format!("net:{}:{connections}", peer.spec_name())
            }
        }
    }

    /// Reads a `--cold-cell` spelling.
    ///
    /// # Errors
    ///
    /// A message saying what is wrong with `spec`.
    pub(crate) fn parse(spec: &str) -> Result<Cell, String> {
        let parts: Vec<&str> = spec.split(':').collect();
        let wrong = || {
            format!(
                "--cold-cell {spec}: expected schedule:PEER:PRODUCERS:CANCEL, rpc:PEER, burst:PEER, firehose:PEER, async-pending:PEER, async-ready:PEER or net:PEER:CONNECTIONS"
            )
        };
        let positive = |text: &str, what: &str| -> Result<usize, String> {
            text.parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("--cold-cell: {what} {text:?} is not a positive count"))
        };
        match parts.as_slice() {
            ["schedule", name, producers, cancel] => Ok(Cell::Schedule {
                kind: kind_named(name)?,
                producers: positive(producers, "producers")?,
                cancel: cancel
                    .parse()
                    .map_err(|_| format!("--cold-cell: cancel {cancel:?} is not true or false"))?,
            }),
            [workload, name] if TimerWorkload::named(workload).is_some() => Ok(Cell::Timers {
                workload: TimerWorkload::named(workload).ok_or_else(wrong)?,
                kind: kind_named(name)?,
            }),
            [shape, name] if shape.starts_with("async-") => Ok(Cell::Timeout {
                shape: timeouts::Shape::named(&shape["async-".len()..]).ok_or_else(wrong)?,
                peer: timeouts::Peer::named(name)
                    .ok_or_else(|| format!("--cold-cell: no async peer named {name:?}"))?,
            }),
            ["net", name, connections] => Ok(Cell::Net {
                peer: net::Peer::named(name)
                    .ok_or_else(|| format!("--cold-cell: no net peer named {name:?}"))?,
                connections: positive(connections, "connections")?,
            }),
            _ => Err(wrong()),
        }
    }
}

/// The timer peer named `name`.
fn kind_named(name: &str) -> Result<Kind, String> {
    Kind::ALL
        .into_iter()
        .chain([
            Kind::TokioTimeout,
            Kind::ShardedInline,
            Kind::ShardedSpawn,
            Kind::ShardedById,
        ])
        .find(|kind| kind.name() == name)
        .ok_or_else(|| format!("--cold-cell: no peer named {name:?}"))
}

/// rpc, burst or firehose on `kind` in a fresh process: its row, or a failed row
/// saying what went wrong with the process.
pub(crate) fn cold_row(workload: TimerWorkload, kind: Kind) -> Row {
    match in_fresh_process::<Row>(&Cell::Timers { workload, kind }) {
        Ok(mut row) => {
            row.peer = kind.name();
            row
        }
        Err(failure) => Row::failed_round(kind, failure),
    }
}

/// One async timeouts run of `peer` and `shape` in a fresh process: (timeouts/s, CPU
/// ns per timeout) and the timeouts that elapsed, or what went wrong.
pub(crate) fn cold_timeout(
    peer: timeouts::Peer,
    shape: timeouts::Shape,
) -> Result<((f64, f64), u64), String> {
    in_fresh_process(&Cell::Timeout { peer, shape })
}

/// One net round of `peer` over `connections` in a fresh process, or what went
/// wrong.
pub(crate) fn cold_net(peer: net::Peer, connections: usize) -> Result<NetRound, String> {
    in_fresh_process(&Cell::Net { peer, connections })
}

/// Runs `cell` in a fresh process (the driver itself with `--cold-cell`) and reads
/// back what it printed: its figures, or what went wrong.
fn in_fresh_process<T: DeserializeOwned>(cell: &Cell) -> Result<T, String> {
    let exe = std::env::current_exe().map_err(|error| format!("current_exe: {error}"))?;
    let mut child = Command::new(exe)
        .args(["--cold-cell", &cell.spec()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("starting the cell's process: {error}"))?;
    let started = Instant::now();
    // The cell prints one line (and a panic a few more): less than a pipe's buffer,
    // so waiting before reading cannot block the child.
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > CELL_LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no result within {} s", CELL_LIMIT.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(error) => return Err(format!("waiting for the cell: {error}")),
        }
    };
    let output = child
        .wait_with_output()
        .map_err(|error| format!("reading the cell: {error}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "the cell's process exited with {status}: {}",
            stderr.lines().last().unwrap_or("")
        ));
    }
    parse_cell(&stdout)
}

/// The figures from a cell's output line, `cold-cell JSON`.
fn parse_cell<T: DeserializeOwned>(output: &str) -> Result<T, String> {
    let line = output
        .lines()
        .find_map(|l| l.strip_prefix("cold-cell "))
        .ok_or_else(|| format!("no cold-cell line in the cell's output {output:?}"))?;
    serde_json::from_str(line).map_err(|error| format!("unreadable cell output {line:?}: {error}"))
}

/// The hidden `--cold-cell` mode: measures one cell in this (fresh) process, prints
/// `cold-cell JSON` and exits without dropping the peer (the parent measured what it
/// needed; a million handles' drop would only delay the next cell).
pub(crate) fn cell_main(spec: &str, common: &Common) -> ! {
    let cell = match Cell::parse(spec) {
        Ok(cell) => cell,
        Err(message) => {
            eprintln!("error: {message}");
            std::process::exit(2);
        }
    };
    let figures = match cell {
        Cell::Schedule {
            kind,
            producers,
            cancel,
        } => {
            let peer = kind.start();
            let figures = schedule_rate_shaped(&peer, producers, cancel, Shape::USERS);
            std::mem::forget(peer);
            serde_json::to_string(&figures)
        }
        Cell::Timers { workload, kind } => serde_json::to_string(&workload.measure(kind, true)),
        Cell::Timeout { peer, shape } => serde_json::to_string(&timeouts::run_once(peer, shape)),
        Cell::Net { peer, connections } => {
            serde_json::to_string(&net::round(common, peer, connections))
        }
    };
    let line = match figures {
        Ok(line) => line,
        Err(error) => {
            eprintln!("error: the cell's figures do not serialise: {error}");
            std::process::exit(1);
        }
    };
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "cold-cell {line}");
    let _ = stdout.flush();
    std::process::exit(0);
}

/// The hidden `--busy-loops N` mode: `N` threads that spin at normal priority until
/// standard input closes (the parent's end of the pipe: it closes when the harness
/// stops them, or when the harness dies).
pub(crate) fn busy_main(loops: usize) -> ! {
    for _ in 0..loops {
        std::thread::spawn(|| {
            let mut x = 0u64;
            loop {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        });
    }
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    std::process::exit(0);
}

/// Runs `measure` beside [`BUSY_LOOPS_PER_CORE`] busy loops per core (a process of
/// their own, started first and stopped after); returns how many loops ran and what
/// `measure` returned.
pub(crate) fn beside_busy_loops<T>(measure: impl FnOnce() -> T) -> (usize, T) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let loops = BUSY_LOOPS_PER_CORE * cores;
    let busy = BusyLoops::start(loops);
    let measured = measure();
    drop(busy);
    (loops, measured)
}

/// The busy loops' process, stopped on drop.
struct BusyLoops(Option<Child>);

impl BusyLoops {
    /// Starts `loops` busy loops in a process of their own.
    ///
    /// # Panics
    ///
    /// If the process cannot be started: a busy measurement without its load would
    /// be a quiet one under a wrong name.
    fn start(loops: usize) -> BusyLoops {
        let exe = std::env::current_exe().expect("the driver's own path, for the busy loops");
        let child = Command::new(exe)
            .args(["--busy-loops", &loops.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("the busy loops' process starts");
        // Let every loop reach the CPU before the first busy cell.
        std::thread::sleep(Duration::from_millis(200));
        BusyLoops(Some(child))
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            drop(child.stdin.take());
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_spec_reads_back_as_written_and_anything_else_is_refused() {
        let cells = [
            Cell::Schedule {
                kind: Kind::NettyStyle,
                producers: 8,
                cancel: true,
            },
            Cell::Timers {
                workload: TimerWorkload::Firehose,
                kind: Kind::Tokio,
            },
            Cell::Timeout {
                peer: timeouts::Peer::Pingora,
                shape: timeouts::Shape::PendingOnce,
            },
            Cell::Timeout {
                peer: timeouts::Peer::Ours,
                shape: timeouts::Shape::Ready,
            },
            Cell::Net {
                peer: net::Peer::Tokio,
                connections: 2000,
            },
        ];
        for cell in cells {
            assert_eq!(Cell::parse(&cell.spec()), Ok(cell), "{}", cell.spec());
        }
        assert_eq!(Cell::parse("schedule:netty-style:8:true"), Ok(cells[0]));
        for wrong in [
            "schedule:netty-style:0:true",
            "schedule:no-such-peer:1:false",
            "schedule:tokio:1:maybe",
            "schedule:tokio:1",
            "schedule:tokio:1:false:extra",
            "netty-style:8:true",
            "rpc:no-such-peer",
            "rpc:tokio:1",
            "async-sometimes:pingora",
            "async-ready:netty-style",
            "net:tokio:0",
            "net:heap:10",
            "",
        ] {
            assert!(Cell::parse(wrong).is_err(), "{wrong} was accepted");
        }
    }

    #[test]
    fn a_cell_line_gives_its_figures_and_anything_else_is_unreadable() {
        assert_eq!(
            parse_cell::<(f64, f64)>("noise\ncold-cell [1234.5,678.25]\n"),
            Ok((1234.5, 678.25))
        );
        assert!(parse_cell::<(f64, f64)>("cold-cell [1234.5]\n").is_err());
        assert!(parse_cell::<(f64, f64)>("cold-cell x 1\n").is_err());
        assert!(parse_cell::<(f64, f64)>("").is_err());
    }
}
