//! The load driver: runs sharded-timer under the workloads a user deciding on it cares
//! about, checks every timer as it fires, and prints a report.
//!
//! ```text
//! cargo run --release                        # every workload, about 30 s
//! cargo run --release -- rpc --requests 1000000 --json
//! cargo run --release -- --compare           # the same workloads on tokio and peers, ratios
//! cargo run --release -- --compare --write docs/benchmarks.md   # ... written as a report
//! cargo run --release -- --sweep producers=1,2,4,8
//! cargo run --release -- --soak 10m          # flat memory, nothing early, lost or duplicated
//! cargo run --release -- chaos 10m           # random operations from many threads, checked
//! ```
//!
//! Each workload checks itself as it runs (no early fire, nothing lost, nothing
//! duplicated, nothing run after a successful cancel) and the process exits with
//! status 1 if any check fails. `--time-scale` compresses time: at the default 100, a
//! 30 s timeout runs in 300 ms.

mod modes;
mod report;
mod system;
mod tracker;
mod workloads;

use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sharded_timer::ShardedTimer;
use sharded_timer_peers as peers;
use sharded_timer_peers::alloc;

use modes::{benchmarks, compare, plot, soak, sweep, timeouts};
use report::{IdleReport, Machine, RunReport};
use workloads::{
    asynchronous, backpressure, burst, delayed, heartbeat, keepalive, net, rpc, stall, steady,
};

#[global_allocator]
static GLOBAL: alloc::CountingAllocator = alloc::CountingAllocator;

/// The workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Workload {
    /// Idle timeouts re-armed by every packet.
    Keepalive,
    /// Request timeouts, most cancelled before they fire.
    Rpc,
    /// Delayed jobs over a long horizon.
    Delayed,
    /// Many timers due in the same tick.
    Burst,
    /// Repeating timers at a fixed rate.
    Heartbeat,
    /// `max_pending` reached and recovered, nothing lost.
    Backpressure,
    /// `timeout`s around futures on tokio and on a hand-written executor.
    Async,
    /// Timers due at a steady rate (`--rate`): lateness under constant load.
    Steady,
    /// Inline callbacks, one blocking 200 ms a second: the others' lateness with
    /// rescue on, off, and on the netty-style wheel.
    Stall,
    /// A tokio TCP server on loopback: a timeout per request, an idle close per
    /// connection, with sharded-timer, tokio::time and pingora
    Net,
}

impl Workload {
    /// Every workload, in the default order.
    /// `delayed` first: it measures bytes per pending timer, which only a process
    /// that has made no timers before can (sharded-timer's entry pool reuses memory).
    const ALL: [Workload; 10] = [
        Workload::Delayed,
        Workload::Keepalive,
        Workload::Rpc,
        Workload::Burst,
        Workload::Heartbeat,
        Workload::Backpressure,
        Workload::Async,
        Workload::Steady,
        Workload::Stall,
        Workload::Net,
    ];
}

/// Records, when dropped, that the process has made timers
/// ([`workloads::timers_made`]).
struct MadeTimers;

impl Drop for MadeTimers {
    fn drop(&mut self) {
        workloads::timers_made();
    }
}

/// Where the service runs its callbacks (`--callbacks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum CallbackMode {
    /// The built-in work-stealing pool (`--executor-threads`).
    Pool,
    /// On the shard thread that fired them.
    Inline,
    /// Spawned on a rayon pool of `--executor-threads` threads.
    Rayon,
}

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Load driver for sharded-timer: real-world timer workloads, checked and measured"
)]
struct Args {
    /// Workloads to run, in order [default: all; none with --compare, --sweep or --soak]
    #[arg(value_enum)]
    workloads: Vec<Workload>,
    /// Run rpc, burst, schedule and memory on sharded-timer and its peers (tokio as
    /// its users write it, the netty-style wheel, a heap), and print ratios
    #[arg(long)]
    compare: bool,
    /// --compare (and the net workload): peers to run, by name, comma-separated
    /// [default: all]
    #[arg(long, value_delimiter = ',', value_parser = [
        "sharded-timer", "sharded-unpinned", "sharded-by-id", "sharded-inline", "sharded-spawn",
        "tokio", "tokio-timeout", "heap", "netty-style", "pingora",
    ])]
    peers: Vec<String>,
    /// --compare: run only its async timeouts section (sharded-timer, tokio-timeout and
    /// pingora unless --peers names fewer)
    #[arg(long)]
    async_only: bool,
    /// --compare, --sweep and --soak: write SVG charts of the run into this directory
    /// [with --write: `charts` beside FILE]
    #[arg(long, value_name = "DIR")]
    plot: Option<std::path::PathBuf>,
    /// --compare: also run the net workload on each peer, the same rounds interleaved,
    /// and write the whole run as Markdown into FILE (machine, commit, date, method,
    /// medians, spreads, ratios and verdicts, failed runs, charts), e.g.
    /// docs/benchmarks.md
    #[arg(long, value_name = "FILE")]
    write: Option<std::path::PathBuf>,
    /// --compare and --sweep: interleaved rounds per figure (the median is kept)
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Print a scaling table over producer threads (and as many shards), e.g.
    /// `producers=1,2,4,8` (or `1,2,4,8`)
    #[arg(long, value_delimiter = ',', value_parser = sweep::producer_count)]
    sweep: Vec<usize>,
    /// Run the rpc and keepalive loads on one service for this long (e.g. 10m, 90s,
    /// 1h 30m; at most 24h), checking memory stays flat and no timer is early, lost or
    /// duplicated
    #[arg(long, value_parser = soak::parse_duration)]
    soak: Option<std::time::Duration>,
    /// Internal: measure one users'-conditions cell of --compare in this process
    /// (modes/conditions.rs, `Cell`), print it and exit
    #[arg(long, hide = true, value_name = "CELL")]
    cold_cell: Option<String>,
    /// Internal: spin this many busy-loop threads until standard input closes
    #[arg(long, hide = true, value_name = "N")]
    busy_loops: Option<usize>,
    /// Print the workload report as CSV, one line per workload
    #[arg(long)]
    csv: bool,
    /// Divide every workload duration (timeouts, horizons) by this factor
    #[arg(long, default_value_t = 100.0)]
    time_scale: f64,
    /// Print the report as JSON instead of a table
    #[arg(long)]
    json: bool,
    /// Print the wide table (every rate, every percentile, memory and CPU per
    /// workload) instead of the one that fits a terminal
    #[arg(long)]
    verbose: bool,
    /// Shards [default: available cores]
    #[arg(long)]
    shards: Option<usize>,
    /// Executor threads (the pool's, or rayon's) [default: available cores]
    #[arg(long)]
    executor_threads: Option<usize>,
    /// Where callbacks run
    #[arg(long, value_enum, default_value_t = CallbackMode::Pool)]
    callbacks: CallbackMode,
    /// Wheel tick in microseconds
    #[arg(long, default_value_t = 1_000)]
    tick_us: u64,
    /// Do not pin shards to cores
    #[arg(long)]
    no_pin: bool,
    /// Threads that schedule and cancel
    #[arg(long, default_value_t = 2)]
    producers: usize,
    /// keepalive: connections
    #[arg(long, default_value_t = 100_000)]
    connections: usize,
    /// keepalive: idle timeout in seconds (before --time-scale)
    #[arg(long, default_value_t = 30.0)]
    idle_timeout_s: f64,
    /// rpc: requests
    #[arg(long, default_value_t = 5_000_000)]
    requests: usize,
    /// rpc: fraction of requests cancelled (answered) before their timeout
    #[arg(long, default_value_t = 0.97)]
    cancel_ratio: f64,
    /// rpc: request timeout in seconds (before --time-scale)
    #[arg(long, default_value_t = 30.0)]
    request_timeout_s: f64,
    /// rpc: timers kept pending in the background throughout
    #[arg(long, default_value_t = 1_000_000)]
    background: usize,
    /// delayed: jobs
    #[arg(long, default_value_t = 1_000_000)]
    jobs: usize,
    /// delayed: horizon in seconds over which jobs are spread (before --time-scale)
    #[arg(long, default_value_t = 300.0)]
    horizon_s: f64,
    /// burst: timers due in the same tick
    #[arg(long, default_value_t = 1_000_000)]
    burst: usize,
    /// heartbeat: repeating timers
    #[arg(long, default_value_t = 10_000)]
    heartbeats: usize,
    /// heartbeat: period in seconds (before --time-scale)
    #[arg(long, default_value_t = 1.0)]
    heartbeat_period_s: f64,
    /// backpressure: the service's max_pending
    #[arg(long, default_value_t = 100_000)]
    max_pending: usize,
    /// backpressure: timers offered (more than max_pending)
    #[arg(long, default_value_t = 400_000)]
    offered: usize,
    /// async: timeouts per executor
    #[arg(long, default_value_t = 1_000_000)]
    timeouts: usize,
    /// steady: timers due per second
    #[arg(long, default_value_t = 1_000_000.0)]
    rate: f64,
    /// steady: seconds of load
    #[arg(long, default_value_t = 2.0)]
    steady_s: f64,
    /// stall: seconds of load on each of the three targets
    #[arg(long, default_value_t = 2.0)]
    stall_s: f64,
    /// net: loopback connections (two descriptors each; fewer if RLIMIT_NOFILE cannot
    /// be raised that far)
    #[arg(long, default_value_t = 10_000)]
    net_connections: usize,
    /// Skip the idle-wakeup check
    #[arg(long)]
    no_idle_check: bool,
}

/// Settings every workload shares.
#[derive(Debug, Clone)]
pub(crate) struct Common {
    /// Service shards.
    pub(crate) shards: Option<usize>,
    /// Service executor threads.
    executor_threads: Option<usize>,
    /// Where callbacks run.
    callbacks: CallbackMode,
    /// Wheel tick.
    pub(crate) tick: Duration,
    /// Pin shards.
    pub(crate) pin: bool,
    /// Time compression factor.
    time_scale: f64,
    /// Producer threads.
    pub(crate) producers: usize,
    /// Whether to draw progress bars.
    pub(crate) progress: bool,
}

impl Common {
    /// A fresh service with the run's configuration.
    pub(crate) fn service(&self, name: &str) -> ShardedTimer {
        let mut builder = ShardedTimer::builder()
            .tick(self.tick)
            .pin_cores(self.pin)
            .thread_name(name);
        if let Some(shards) = self.shards {
            builder = builder.shards(shards);
        }
        let threads = self
            .executor_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
        builder = match self.callbacks {
            CallbackMode::Pool => builder.executor_threads(threads),
            CallbackMode::Inline => builder.callbacks(sharded_timer::Callbacks::inline()),
            CallbackMode::Rayon => {
                let prefix = name.to_owned();
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(move |k| format!("{prefix}-r{k}"))
                    .build()
                    .unwrap_or_else(|error| {
                        eprintln!("error: could not start the rayon pool: {error}");
                        std::process::exit(2);
                    });
                builder.callbacks(sharded_timer::Callbacks::rayon(std::sync::Arc::new(pool)))
            }
        };
        match builder.build() {
            Ok(timer) => timer,
            Err(error) => {
                eprintln!("error: could not start the timer service: {error}");
                std::process::exit(2);
            }
        }
    }

    /// Pins producer thread `producer` to core `producer % cores` (when pinning is
    /// on), so that producers on different cores contend as they would in a real
    /// server, run after run, instead of sometimes sharing a core by chance.
    pub(crate) fn pin_producer(&self, producer: usize) {
        if !self.pin {
            return;
        }
        if let Some(cores) = core_affinity::get_core_ids() {
            if !cores.is_empty() {
                let _ = core_affinity::set_for_current(cores[producer % cores.len()]);
            }
        }
    }

    /// Producer `producer`'s contiguous share of `0..total`. Contiguous, so that
    /// producers never write neighbouring per-timer slots (false sharing would
    /// measure the driver, not the timer).
    pub(crate) fn share(&self, producer: usize, total: usize) -> std::ops::Range<usize> {
        let per = total.div_ceil(self.producers);
        (producer * per).min(total)..((producer + 1) * per).min(total)
    }

    /// `seconds` of workload time, compressed by the time scale.
    pub(crate) fn scaled(&self, seconds: f64) -> Duration {
        Duration::from_secs_f64(seconds / self.time_scale)
    }

    /// A progress bar for a phase of `total` steps (hidden when not drawing).
    pub(crate) fn progress(&self, label: &str, total: u64) -> ProgressBar {
        if !self.progress {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{prefix:>10} {bar:40} {pos}/{len} {msg} ({elapsed})")
                .expect("valid template"),
        );
        bar.set_prefix(label.to_owned());
        bar
    }
}

/// Threads of a service named `prefix`: wakeups per second while it holds one timer
/// an hour away.
fn idle_check(common: &Common) -> Option<IdleReport> {
    let timer = common.service("idle-check");
    let _far = timer.schedule(Duration::from_secs(3600), || {}).ok()?;
    std::thread::sleep(Duration::from_millis(200));
    let (threads, before) = system::context_switches("idle-check")?;
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let (_, after) = system::context_switches("idle-check")?;
    let seconds = start.elapsed().as_secs_f64();
    drop(timer.shutdown());
    Some(IdleReport {
        threads,
        wakeups_per_sec: (after - before) as f64 / seconds,
        seconds,
    })
}

/// Reports the charts `--plot` wrote (or why it could not); returns whether it did.
fn charts(written: Result<Vec<std::path::PathBuf>, String>, quiet: bool) -> bool {
    match written {
        Ok(paths) => {
            if !quiet {
                for path in paths {
                    println!("chart: {}", path.display());
                }
            }
            true
        }
        Err(message) => {
            eprintln!("error: {message}");
            false
        }
    }
}

/// Whether the run had no workload (a --compare, --sweep or --soak run only).
fn workloads_empty(run: &RunReport) -> bool {
    run.workloads.is_empty()
}

fn main() {
    // `chaos` has arguments of its own (modes/chaos/mod.rs).
    if std::env::args().nth(1).as_deref() == Some("chaos") {
        std::process::exit(modes::chaos::main(std::env::args().skip(1)));
    }
    let args = Args::parse();
    if let Some(loops) = args.busy_loops {
        modes::conditions::busy_main(loops);
    }
    if !(args.time_scale > 0.0 && args.time_scale.is_finite()) {
        eprintln!("error: --time-scale must be a positive number");
        std::process::exit(2);
    }
    if !(0.0..=1.0).contains(&args.cancel_ratio) {
        eprintln!("error: --cancel-ratio must be between 0 and 1");
        std::process::exit(2);
    }
    if args.producers == 0 {
        eprintln!("error: --producers must be at least 1");
        std::process::exit(2);
    }
    let common = Common {
        shards: args.shards,
        executor_threads: args.executor_threads,
        callbacks: args.callbacks,
        tick: Duration::from_micros(args.tick_us.max(1)),
        pin: !args.no_pin,
        time_scale: args.time_scale,
        producers: args.producers,
        progress: !args.json && !args.csv,
    };
    // --compare's own child processes (modes/conditions.rs).
    if let Some(cell) = &args.cold_cell {
        modes::conditions::cell_main(cell, &common);
    }
    if args.write.is_some() && (!args.compare || args.async_only) {
        eprintln!(
            "error: --write writes a whole --compare run: give --compare, without --async-only"
        );
        std::process::exit(2);
    }
    let modes = args.compare || !args.sweep.is_empty() || args.soak.is_some();
    if args.plot.is_some() && !modes {
        eprintln!("error: --plot draws a --compare, --sweep or --soak run: give one of them");
        std::process::exit(2);
    }
    let workloads = if !args.workloads.is_empty() {
        args.workloads.clone()
    } else if modes {
        Vec::new()
    } else {
        Workload::ALL.to_vec()
    };
    let machine = Machine::read();
    let quiet = args.json || args.csv;
    let mut failed = false;
    let mut extra = serde_json::Map::new();
    if args.compare || !args.sweep.is_empty() || args.soak.is_some() {
        // Modes run first and make timers: the workloads after them reuse memory.
        workloads::timers_made();
    }
    if args.compare {
        if !quiet {
            println!("sharded-timer --compare {machine}");
        }
        let started = std::time::SystemTime::now();
        let load_at_start = system::load_average();
        // Read before the run writes anything (its charts are tracked files).
        let commit = args.write.as_ref().map(|_| benchmarks::commit());
        // With --write, the charts go beside the file unless --plot says where.
        let plot_dir = args.plot.clone().or_else(|| {
            args.write.as_ref().map(|file| {
                file.parent()
                    .unwrap_or(std::path::Path::new(""))
                    .join("charts")
            })
        });
        let mut drawn = Vec::new();
        let mut draw = |written: Result<Vec<std::path::PathBuf>, String>| {
            if let Ok(paths) = &written {
                drawn.extend(paths.iter().cloned());
            }
            charts(written, quiet)
        };
        // The timer peers (all but pingora, which has only the async section).
        let timer_peers = args.peers.is_empty() || args.peers.iter().any(|peer| peer != "pingora");
        let mut compared = None;
        if timer_peers && !args.async_only {
            let report = compare::run(args.rounds, &args.peers, quiet);
            failed |= report.early() > 0;
            if let Some(dir) = &plot_dir {
                failed |= !draw(plot::compare(&report, dir));
            }
            extra.insert(
                "compare".into(),
                serde_json::to_value(&report).expect("serialises"),
            );
            compared = Some(report);
        }
        let rows = timeouts::run(args.rounds, &args.peers, quiet);
        if let Some(dir) = &plot_dir {
            failed |= !draw(plot::timeouts(&rows, dir));
        }
        extra.insert(
            "timeouts".into(),
            serde_json::to_value(&rows).expect("serialises"),
        );
        let users_timeouts = timeouts::run_users(args.rounds, &args.peers, quiet);
        extra.insert(
            "timeouts_users".into(),
            serde_json::to_value(&users_timeouts).expect("serialises"),
        );
        if let Some(file) = &args.write {
            if !quiet {
                println!(
                    "\nnet, {} interleaved rounds per peer, a fresh process per round, quiet then busy ...",
                    args.rounds
                );
            }
            let (connections, quiet_runs) =
                net::rounds(args.net_connections, args.rounds, &args.peers);
            // Beside the busy loops, a quarter of the connections: with all of them
            // every peer's server falls behind its clients' 1 s request timeouts
            // there (a failed run for each, and no figure).
            let busy_wanted = (args.net_connections / benchmarks::NET_BUSY_SHARE).max(2);
            let (loops, (busy_connections, busy_runs)) =
                modes::conditions::beside_busy_loops(|| {
                    net::rounds(busy_wanted, args.rounds, &args.peers)
                });
            let net = benchmarks::NetFigures {
                connections,
                busy_connections,
                loops,
                quiet: quiet_runs,
                busy: busy_runs,
            };
            extra.insert(
                "net".into(),
                serde_json::to_value(&net).expect("serialises"),
            );
            let context = benchmarks::Context {
                machine: &machine,
                rounds: args.rounds.max(1),
                arguments: std::env::args().skip(1).collect(),
                started,
                finished: std::time::SystemTime::now(),
                commit: commit.clone().unwrap_or_default(),
                load: (load_at_start, system::load_average()),
                charts: drawn,
            };
            let timeouts = benchmarks::Timeouts {
                warm: &rows,
                users: &users_timeouts,
            };
            match benchmarks::write(file, &context, compared.as_ref(), &timeouts, Some(&net)) {
                Ok(()) => {
                    if !quiet {
                        println!("wrote {}", file.display());
                    }
                }
                Err(message) => {
                    eprintln!("error: {message}");
                    failed = true;
                }
            }
        }
    }
    if !args.sweep.is_empty() {
        let producers = &args.sweep;
        if !quiet && !args.compare {
            println!("sharded-timer --sweep {machine}");
        }
        let rows = sweep::run(producers, args.rounds, quiet);
        if let Some(dir) = &args.plot {
            failed |= !charts(plot::sweep(&rows, dir), quiet);
        }
        extra.insert(
            "sweep".into(),
            serde_json::to_value(&rows).expect("serialises"),
        );
    }
    if let Some(duration) = args.soak {
        let text = humantime::format_duration(duration);
        if !quiet {
            println!("sharded-timer --soak {text} {machine}");
        }
        let report = soak::run(&common, duration);
        if !quiet {
            report.print();
        }
        failed |= report.grew() || report.violated();
        if let Some(dir) = &args.plot {
            failed |= !charts(plot::soak(&report, dir), quiet);
        }
        extra.insert(
            "soak".into(),
            serde_json::to_value(&report).expect("serialises"),
        );
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let config = format!(
        "{} shards, callbacks {}, tick {} µs, {}, {} producer threads, time scale {}x, {} cores",
        args.shards.unwrap_or(cores),
        match args.callbacks {
            CallbackMode::Inline => "inline".to_owned(),
            CallbackMode::Pool =>
                format!("on a pool of {}", args.executor_threads.unwrap_or(cores)),
            CallbackMode::Rayon => format!(
                "on rayon, {} threads",
                args.executor_threads.unwrap_or(cores)
            ),
        },
        args.tick_us,
        if common.pin {
            "shards pinned to cores"
        } else {
            "shards not pinned"
        },
        args.producers,
        args.time_scale,
        cores,
    );
    let mut run = RunReport {
        config,
        machine,
        workloads: Vec::new(),
        idle: None,
    };
    let started = std::time::Instant::now();
    // Each workload's result as it finishes (stderr, so the report stays whole on
    // stdout): the first comes seconds after the build, not at the end of the run.
    let announce = |report: &report::WorkloadReport| {
        if !args.json && !args.csv {
            eprintln!("{}", report::result_line(report, started.elapsed()));
        }
    };
    for workload in workloads {
        // Whatever it runs, it has made timers once it returns.
        let _made = MadeTimers;
        if workload == Workload::Keepalive {
            // reset, then the cancel + schedule a timer without reset needs, side by side.
            for rearm in [keepalive::Rearm::Reset, keepalive::Rearm::CancelSchedule] {
                let result = keepalive::run(&common, args.connections, args.idle_timeout_s, rearm);
                announce(&result);
                run.workloads.push(result);
            }
            continue;
        }
        let result = match workload {
            Workload::Keepalive => unreachable!("handled above"),
            Workload::Rpc => rpc::run(
                &common,
                args.requests,
                args.cancel_ratio,
                args.request_timeout_s,
                args.background,
            ),
            Workload::Delayed => delayed::run(&common, args.jobs, args.horizon_s),
            Workload::Burst => burst::run(&common, args.burst),
            Workload::Heartbeat => {
                heartbeat::run(&common, args.heartbeats, args.heartbeat_period_s, 50)
            }
            Workload::Backpressure => {
                backpressure::run(&common, args.max_pending, args.offered, 20.0)
            }
            Workload::Async => asynchronous::run(&common, args.timeouts, 30.0),
            Workload::Steady => steady::run(&common, args.rate, args.steady_s),
            Workload::Stall => stall::run(&common, args.stall_s),
            Workload::Net => net::run(&common, args.net_connections, &args.peers),
        };
        announce(&result);
        run.workloads.push(result);
    }
    if !args.no_idle_check && !workloads_empty(&run) {
        run.idle = idle_check(&common);
    }
    if args.json {
        let mut value = serde_json::to_value(&run).expect("the report serialises");
        if let Some(object) = value.as_object_mut() {
            object.extend(extra);
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&value).expect("the report serialises")
        );
    } else if args.csv {
        report::print_csv(&run);
    } else if !workloads_empty(&run) {
        report::print_table(&run, args.verbose);
    }
    if failed || run.workloads.iter().any(report::WorkloadReport::violated) {
        std::process::exit(1);
    }
}
