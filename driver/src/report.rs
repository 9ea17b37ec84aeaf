//! What each workload measured, the process readings behind it (/proc on Linux),
//! and the table a design review reads.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// Lateness recorded per timer: µs after its deadline, or one of these markers.
pub(crate) const NOT_FIRED: u32 = u32::MAX;

/// One workload's results.
#[derive(Debug, Serialize)]
pub(crate) struct WorkloadReport {
    /// Workload name.
    pub(crate) name: &'static str,
    /// Operations per second over the measured phase, one field per kind.
    pub(crate) rates: Rates,
    /// Timers whose callbacks ran.
    pub(crate) fired: u64,
    /// Lateness percentiles in µs.
    pub(crate) lateness_us: Lateness,
    /// Callbacks that started before their deadline (must be 0).
    pub(crate) early: u64,
    /// Timers that should have fired and did not (must be 0).
    pub(crate) lost: u64,
    /// Callbacks that ran more than once, or ran although cancelled (must be 0).
    pub(crate) duplicated: u64,
    /// Allocated bytes per pending timer at the measuring point, including the
    /// callback's captures; and those captures' size.
    pub(crate) bytes_per_pending: Option<f64>,
    /// Size of the workload's callback captures, bytes.
    pub(crate) capture_bytes: usize,
    /// Wall and CPU time, peak RSS.
    #[serde(flatten)]
    pub(crate) process: Readings,
    /// Workload-specific findings, one line each.
    pub(crate) notes: Vec<String>,
}

impl WorkloadReport {
    /// Whether any invariant was violated.
    pub(crate) fn violated(&self) -> bool {
        self.early > 0 || self.lost > 0 || self.duplicated > 0
    }

    /// Guarantee 2 judged on this workload's lateness: on time, late, too loaded to
    /// judge, or not judged (a burst's lateness is its drain, by design).
    ///
    /// Too loaded only when the machine really was, over the workload: the process
    /// itself kept at least [`BUSY_SHARE`] of the `cores` busy (its lateness then
    /// measures the queue for a CPU), or the machine's CPUs were that busy, or other
    /// processes took at least [`OTHERS_SHARE`] of them (a shard pinned to a core
    /// another process keeps busy waits for it). Otherwise the machine had CPU to
    /// spare, and too few timers on time is guarantee 2 failing — unless the machine
    /// itself stalled ([`Timeliness::Stalled`]): a CPU gave no thread a chance to run
    /// for longer than the wake-up allowance, and long enough to account for the
    /// lateness p99 (a stall of `s` makes the timers due in it up to `s` late).
    pub(crate) fn timeliness(&self, cores: usize) -> Timeliness {
        if self.name == "burst" || self.lateness_us.count == 0 {
            return Timeliness::NotJudged;
        }
        if self.lateness_us.on_time >= ON_TIME_SHARE {
            return Timeliness::OnTime;
        }
        if self.process.load(cores).too_loaded() {
            return Timeliness::TooLoaded;
        }
        match self.process.machine_stall_us {
            Some(stall)
                if stall > WAKE_ALLOWANCE_US && stall + ON_TIME_US >= self.lateness_us.p99 =>
            {
                Timeliness::Stalled
            }
            _ => Timeliness::Late,
        }
    }
}

/// The share of the CPUs busy over a workload at which the machine is too loaded to
/// judge guarantee 2.
pub(crate) const BUSY_SHARE: f64 = 0.9;

/// The share of the machine's CPUs other processes took over a workload at which it
/// is too loaded to judge guarantee 2: on 2 cores, half a core's worth on average. A
/// shard pinned to a core another process keeps busy waits for that core (a
/// scheduler slice, milliseconds), whatever the other cores have to spare.
pub(crate) const OTHERS_SHARE: f64 = 0.25;

/// How busy the CPUs were over a workload, each a share of their capacity over its
/// wall time (`None` where it cannot be read).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Load {
    /// This process's CPU time over `cores` × wall.
    pub(crate) process: Option<f64>,
    /// Every process's CPU time (/proc/stat) over the machine's CPUs × wall.
    pub(crate) machine: Option<f64>,
    /// This process's CPU time over the machine's CPUs × wall.
    process_of_machine: Option<f64>,
}

impl Load {
    /// Whether the machine was too loaded to judge lateness by (`timeliness`): the
    /// process kept [`BUSY_SHARE`] of its cores busy, or the machine was that busy, or
    /// other processes took [`OTHERS_SHARE`] of it. The same rule judges a peer's
    /// failures that load explains (a request timed out, a client failed).
    pub(crate) fn too_loaded(&self) -> bool {
        let busy = self.process.is_some_and(|share| share >= BUSY_SHARE);
        let machine = self.machine.is_some_and(|share| share >= BUSY_SHARE);
        let others = self.others().is_some_and(|share| share >= OTHERS_SHARE);
        busy || machine || others
    }

    /// Other processes' share of the machine's CPUs.
    pub(crate) fn others(&self) -> Option<f64> {
        Some((self.machine? - self.process_of_machine?).max(0.0))
    }

    /// `CPU busy: this process 23 % of 2 cores, other processes 4 %`, for the
    /// verdict lines.
    fn describe(&self, cores: usize) -> String {
        let percent =
            |share: Option<f64>| share.map_or("n/a".into(), |s| format!("{:.0} %", s * 100.0));
        format!(
            "CPU busy: this process {} of {cores} cores, other processes {} of the machine",
            percent(self.process),
            percent(self.others())
        )
    }
}

/// Guarantee 2's verdict for one workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timeliness {
    /// At least [`ON_TIME_SHARE`] of its timers fired within [`ON_TIME_US`].
    OnTime,
    /// Fewer did, on a machine with CPU to spare: guarantee 2 not met.
    Late,
    /// Fewer did, but the workload kept the cores busy, or the machine was busy, or
    /// other processes took half of it: lateness there measures the wait for a CPU.
    TooLoaded,
    /// Fewer did on a machine with CPU to spare, but the machine itself stalled
    /// (a CPU ran no thread, ours or anybody's) longer than the wake-up allowance and
    /// long enough to account for the lateness p99: wake-up latency, not the service.
    Stalled,
    /// A burst (its lateness is the drain it measures), or nothing fired.
    NotJudged,
}

/// A workload's rates, one per kind of operation (`None`: the workload does not do it).
#[derive(Debug, Default, Serialize, Clone, Copy)]
pub(crate) struct Rates {
    /// Timers scheduled per second (not cancelled by the workload).
    pub(crate) schedule: Option<f64>,
    /// Schedule + cancel pairs per second (a request answered before its timeout).
    pub(crate) schedule_cancel: Option<f64>,
    /// `reset`s per second (a keepalive re-armed in place).
    pub(crate) reset: Option<f64>,
    /// Re-arms per second by cancel + schedule (a keepalive without `reset`).
    pub(crate) cancel_schedule: Option<f64>,
    /// Callbacks run per second (a drain of timers due together).
    pub(crate) fired: Option<f64>,
    /// Time from a common deadline to the last callback, ms.
    pub(crate) drain_ms: Option<f64>,
}

impl Rates {
    /// The table's column heads, in order.
    pub(crate) const HEADS: [&'static str; 6] = [
        "schedule/s",
        "s+cancel/s",
        "reset/s",
        "cancel+s/s",
        "fired/s",
        "drain ms",
    ];

    /// The values in [`HEADS`](Self::HEADS) order.
    pub(crate) fn columns(&self) -> [Option<f64>; 6] {
        [
            self.schedule,
            self.schedule_cancel,
            self.reset,
            self.cancel_schedule,
            self.fired,
            self.drain_ms,
        ]
    }
}

/// Guarantee 2's bound, as the driver judges it: a timer is on time when it fires
/// within one tick (the driver's 1 ms) plus a wake-up allowance of 1 ms (a parked
/// thread's wake-up on a shared VM; stated, not tuned) after its deadline, µs.
pub(crate) const ON_TIME_US: u64 = 2_000;

/// The wake-up allowance within [`ON_TIME_US`], µs: a stall of the machine itself
/// longer than this, during a workload, is wake-up latency the allowance did not
/// cover (`Timeliness::Stalled`).
pub(crate) const WAKE_ALLOWANCE_US: u64 = 1_000;

/// The share of a workload's timers that must be on time for guarantee 2 to hold.
pub(crate) const ON_TIME_SHARE: f64 = 0.99;

/// Lateness percentiles, µs after the deadline.
#[derive(Debug, Default, Serialize, serde::Deserialize, Clone, Copy)]
pub(crate) struct Lateness {
    /// Median.
    pub(crate) p50: u64,
    /// 99th percentile.
    pub(crate) p99: u64,
    /// 99.9th percentile.
    pub(crate) p999: u64,
    /// Maximum.
    pub(crate) max: u64,
    /// Samples.
    pub(crate) count: u64,
    /// The share of samples at most [`ON_TIME_US`] late (1.0 when there are none).
    pub(crate) on_time: f64,
}

impl Lateness {
    /// Percentiles of a histogram.
    pub(crate) fn of(histogram: &Histogram<u64>) -> Self {
        Lateness {
            p50: histogram.value_at_quantile(0.5),
            p99: histogram.value_at_quantile(0.99),
            p999: histogram.value_at_quantile(0.999),
            max: histogram.max(),
            count: histogram.len(),
            on_time: if histogram.is_empty() {
                1.0
            } else {
                histogram.count_between(0, ON_TIME_US) as f64 / histogram.len() as f64
            },
        }
    }
}

/// A lateness histogram: 1 µs to 1 hour, 3 significant digits.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// What the process used during a workload.
#[derive(Debug, Serialize, Clone, Copy)]
pub(crate) struct Readings {
    /// Wall-clock seconds.
    pub(crate) wall_seconds: f64,
    /// CPU seconds (user + system) of the whole process.
    pub(crate) cpu_seconds: Option<f64>,
    /// Peak resident set, bytes.
    pub(crate) peak_rss_bytes: Option<u64>,
    /// CPU seconds the whole machine was busy (every process, /proc/stat).
    pub(crate) machine_busy_seconds: Option<f64>,
    /// The CPUs the machine's busy time was counted over.
    pub(crate) machine_cpus: Option<usize>,
    /// The longest time, µs, a CPU of the machine stalled: woke a sleeping probe
    /// thread that late with no thread ahead of it ([`crate::system::StallProbe`]).
    pub(crate) machine_stall_us: Option<u64>,
}

impl Readings {
    /// How busy the CPUs were: this process's share of `cores`, the machine's.
    pub(crate) fn load(&self, cores: usize) -> Load {
        let wall = self.wall_seconds.max(f64::MIN_POSITIVE);
        let machine_capacity = self.machine_cpus.map(|cpus| cpus as f64 * wall);
        Load {
            process: self
                .cpu_seconds
                .map(|cpu| cpu / (cores.max(1) as f64 * wall)),
            machine: self
                .machine_busy_seconds
                .zip(machine_capacity)
                .map(|(busy, capacity)| busy / capacity),
            process_of_machine: self
                .cpu_seconds
                .zip(machine_capacity)
                .map(|(cpu, capacity)| cpu / capacity),
        }
    }
}

/// Process readings taken at the start of a workload.
pub(crate) struct Meter {
    /// Wall clock at start.
    start: Instant,
    /// CPU seconds at start.
    cpu: Option<f64>,
    /// The machine's busy CPU seconds at start, and its CPUs.
    machine: Option<(f64, usize)>,
    /// Watches the CPUs for stalls of the machine itself.
    stalls: crate::system::StallProbe,
}

impl Meter {
    /// Resets the peak-RSS mark (Linux) and records CPU time and the clock.
    pub(crate) fn start() -> Self {
        crate::system::reset_peak_rss();
        Meter {
            start: Instant::now(),
            cpu: cpu_seconds(),
            machine: crate::system::machine_busy(),
            stalls: crate::system::StallProbe::start(),
        }
    }

    /// Wall seconds, CPU seconds and peak RSS since `start`.
    pub(crate) fn stop(&self) -> Readings {
        Readings {
            wall_seconds: self.start.elapsed().as_secs_f64(),
            cpu_seconds: match (self.cpu, cpu_seconds()) {
                (Some(a), Some(b)) => Some(b - a),
                _ => None,
            },
            peak_rss_bytes: crate::system::peak_rss_bytes(),
            machine_busy_seconds: match (self.machine, crate::system::machine_busy()) {
                (Some((a, _)), Some((b, _))) => Some(b - a),
                _ => None,
            },
            machine_cpus: self.machine.map(|(_, cpus)| cpus),
            machine_stall_us: self.stalls.longest_us(),
        }
    }
}

/// User + system CPU seconds of this process so far, every thread
/// (`CLOCK_PROCESS_CPUTIME_ID`, through the `cpu-time` crate: nanosecond resolution,
/// where `/proc/self/stat` counts in clock ticks).
pub(crate) fn cpu_seconds() -> Option<f64> {
    cpu_time::ProcessTime::try_now()
        .ok()
        .map(|time| time.as_duration().as_secs_f64())
}

/// The idle check: wakeups per second of an idle service's threads.
#[derive(Debug, Serialize)]
pub(crate) struct IdleReport {
    /// Threads observed.
    pub(crate) threads: usize,
    /// Context switches per second over the observation.
    pub(crate) wakeups_per_sec: f64,
    /// Observation length.
    pub(crate) seconds: f64,
}

/// The whole run.
#[derive(Debug, Serialize)]
pub(crate) struct RunReport {
    /// How the service was configured.
    pub(crate) config: String,
    /// What it ran on.
    pub(crate) machine: Machine,
    /// One entry per workload run.
    pub(crate) workloads: Vec<WorkloadReport>,
    /// The idle check, if run.
    pub(crate) idle: Option<IdleReport>,
}

fn megabytes(bytes: Option<u64>) -> String {
    bytes.map_or("n/a".into(), |b| format!("{:.0} MB", b as f64 / 1e6))
}

/// A rate or a figure in a short column: `12.34 M`, `567 k`, or `-` for none.
fn short(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(v) if v >= 1e6 => format!("{:.2} M", v / 1e6),
        Some(v) if v >= 1e4 => format!("{:.0} k", v / 1e3),
        Some(v) => format!("{v:.1}"),
    }
}

/// Prints the report: the table (the wide one if `verbose`), what each workload did,
/// and the verdicts.
pub(crate) fn print_table(run: &RunReport, verbose: bool) {
    println!();
    println!("sharded-timer load driver — {}", run.config);
    println!("{}", run.machine);
    println!();
    if verbose {
        print_wide(run);
    } else {
        print_narrow(run);
    }
    print_notes_and_verdicts(run);
}

/// One line for a workload as it finishes: its main rate, lateness p99 and its checks.
pub(crate) fn result_line(w: &WorkloadReport, elapsed: Duration) -> String {
    let (value, head) = main_rate(w);
    format!(
        "[{:>5.1} s] {:<12} done: {value} {head}, lateness p99 {:.2} ms, {:.1} % on time, early/lost/dup {}/{}/{}",
        elapsed.as_secs_f64(),
        w.name,
        w.lateness_us.p99 as f64 / 1e3,
        w.lateness_us.on_time * 100.0,
        w.early,
        w.lost,
        w.duplicated
    )
}

/// A workload's main rate and what it counts: the first rate it has; a burst's main
/// figure is its drain.
fn main_rate(w: &WorkloadReport) -> (String, &'static str) {
    let skip = usize::from(w.name == "burst") * 4;
    w.rates
        .columns()
        .into_iter()
        .zip(Rates::HEADS)
        .skip(skip)
        .find_map(|(value, head)| value.map(|v| (v, head)))
        .map_or(("-".to_owned(), ""), |(v, head)| (short(Some(v)), head))
}

/// The table that fits a terminal (under 100 columns): each workload's main rate,
/// its lateness, and its checks; a legend under it says what each column is.
fn print_narrow(run: &RunReport) {
    println!(
        "{:<13} {:>10} {:<11} {:>7} {:>7} {:>7} {:>8} {:>15}",
        "workload", "rate", "(of what)", "p50 ms", "p99 ms", "max ms", "on time", "early/lost/dup"
    );
    for w in &run.workloads {
        let (value, head) = main_rate(w);
        println!(
            "{:<13} {:>10} {:<11} {:>7.2} {:>7.2} {:>7.2} {:>7.1}% {:>15}",
            w.name,
            value,
            head,
            w.lateness_us.p50 as f64 / 1e3,
            w.lateness_us.p99 as f64 / 1e3,
            w.lateness_us.max as f64 / 1e3,
            w.lateness_us.on_time * 100.0,
            format!("{}/{}/{}", w.early, w.lost, w.duplicated),
        );
    }
    println!();
    println!("  rate: the workload's main operation per second (schedule/s: timers scheduled;");
    println!(
        "        s+cancel/s: schedule and cancel pairs; reset/s: keepalive re-arms; cancel+s/s:"
    );
    println!("        cancel then schedule again). Paced workloads show their pace: a load, not a");
    println!("        throughput (--compare measures throughput against tokio and the others).");
    println!("  p50/p99/max ms: how long after its deadline each callback started (a burst's is");
    println!("        its drain). on time: the share within one tick + 1 ms (guarantee 2).");
    println!(
        "  early/lost/dup: callbacks before their deadline, never run, run twice: all must be 0."
    );
    println!(
        "  time scale (first line): every workload's timeouts and horizons are divided by it,"
    );
    println!("        so the run takes about a minute; lateness is not scaled.");
    println!("  --verbose: every rate and percentile, memory per pending timer, peak RSS, CPU.");
    println!();
}

/// The wide table: every rate column, four percentiles, memory and CPU.
fn print_wide(run: &RunReport) {
    print!("{:<13}", "workload");
    for head in Rates::HEADS {
        print!(" {head:>10}");
    }
    println!(
        " {:>16} {:>16} {:>17} {:>16} {:>8} {:>6} {:>5} {:>4} {:>9} {:>10} {:>7}",
        "lateness p50 µs",
        "lateness p99 µs",
        "lateness p999 µs",
        "lateness max µs",
        "on time",
        "early",
        "lost",
        "dup",
        "peak RSS",
        "B/pending",
        "CPU s"
    );
    for w in &run.workloads {
        print!("{:<13}", w.name);
        for value in w.rates.columns() {
            print!(" {:>10}", short(value));
        }
        println!(
            " {:>16} {:>16} {:>17} {:>16} {:>7.1}% {:>6} {:>5} {:>4} {:>9} {:>10} {:>7}",
            w.lateness_us.p50,
            w.lateness_us.p99,
            w.lateness_us.p999,
            w.lateness_us.max,
            w.lateness_us.on_time * 100.0,
            w.early,
            w.lost,
            w.duplicated,
            megabytes(w.process.peak_rss_bytes),
            w.bytes_per_pending
                .map_or("n/a".into(), |b| format!("{b:.0}")),
            w.process
                .cpu_seconds
                .map_or("n/a".into(), |c| format!("{c:.2}")),
        );
    }
    println!();
    println!(
        "  peak RSS: the process's, so far (it does not fall between workloads: later rows carry"
    );
    println!(
        "        earlier ones' peaks). B/pending: bytes allocated per pending timer, measured only"
    );
    println!(
        "        where the workload holds many at once in a process that freed none before it."
    );
    println!("  CPU s: the process's CPU time (every thread) during the workload.");
    println!();
}

/// What each workload did, the invariants and the verdicts.
fn print_notes_and_verdicts(run: &RunReport) {
    // Each note wrapped to 100 columns, under its workload's name.
    let indent = " ".repeat(15);
    for w in &run.workloads {
        for note in &w.notes {
            let first = format!("  {:<12} ", w.name);
            let options = textwrap::Options::new(100)
                .initial_indent(&first)
                .subsequent_indent(&indent);
            for line in textwrap::wrap(note, options) {
                println!("{line}");
            }
        }
    }
    if let Some(idle) = &run.idle {
        println!(
            "  {:<9} {:.1} wakeups/s across the service's {} threads over {:.1} s with a timer 1 h away",
            "idle", idle.wakeups_per_sec, idle.threads, idle.seconds
        );
    }
    println!();
    let violations: Vec<_> = run
        .workloads
        .iter()
        .filter(|w| w.violated())
        .map(|w| w.name)
        .collect();
    if violations.is_empty() {
        println!("all invariants held: no early fire, nothing lost, nothing duplicated");
    } else {
        println!("INVARIANT VIOLATED in: {}", violations.join(", "));
    }
    // Guarantee 2, judged per workload.
    println!(
        "Guarantee 2 (on time) asks that at least {:.0} % of a workload's timers start within",
        ON_TIME_SHARE * 100.0
    );
    println!(
        "one tick + a 1 ms wake-up allowance ({ON_TIME_US} µs) of their deadline. A workload that meets it is"
    );
    println!("on time whatever the load; one that misses it is LATE, unless the machine was too");
    println!(
        "loaded to judge (this process or the whole machine {:.0} % busy, or other processes {:.0} %),",
        BUSY_SHARE * 100.0,
        OTHERS_SHARE * 100.0
    );
    println!(
        "or stalled: a CPU ran no thread for over {WAKE_ALLOWANCE_US} µs, long enough to explain the p99 (a probe"
    );
    println!(
        "thread per CPU, sleeping 1 ms at a time, woke that late with no thread ahead of it)."
    );
    println!("on time (guarantee 2), per workload:");
    for w in &run.workloads {
        let share = w.lateness_us.on_time * 100.0;
        let cores = run.machine.cores;
        let load = w.process.load(cores).describe(cores);
        let verdict = match w.timeliness(cores) {
            Timeliness::OnTime => format!("on time ({share:.1} %; {load})"),
            Timeliness::Late => format!(
                "LATE: {share:.1} % on time, p99 {} µs, on a machine with CPU to spare ({load}; longest stall of the machine itself {})",
                w.lateness_us.p99,
                w.process
                    .machine_stall_us
                    .map_or("not measured".into(), |us| format!("{us} µs"))
            ),
            Timeliness::TooLoaded => format!(
                "not judged: {share:.1} % on time, the machine too loaded to judge ({load})"
            ),
            Timeliness::Stalled => format!(
                "not judged: {share:.1} % on time, p99 {} µs, the machine stalled {} µs (a CPU ran no thread: host or interrupts; {load})",
                w.lateness_us.p99,
                w.process.machine_stall_us.unwrap_or(0)
            ),
            Timeliness::NotJudged => "not judged (a burst's lateness is its drain)".to_owned(),
        };
        println!("  {:<12} {verdict}", w.name);
    }
    let count = |wanted: Timeliness| {
        run.workloads
            .iter()
            .filter(|w| w.timeliness(run.machine.cores) == wanted)
            .count()
    };
    let (on_time, late) = (count(Timeliness::OnTime), count(Timeliness::Late));
    let not_judged = run.workloads.len() - on_time - late;
    println!();
    if violations.is_empty() {
        println!(
            "result: PASS (exit status 0): every invariant held; on time {on_time}, LATE {late}, not judged {not_judged}{}",
            if late > 0 {
                " (LATE is reported, not an exit status: the invariants decide that)"
            } else {
                ""
            }
        );
    } else {
        println!(
            "result: FAIL (exit status 1): invariants violated in {}",
            violations.join(", ")
        );
    }
}

/// Prints the run as CSV (the `csv` crate: quoting as RFC 4180 says): a header, then
/// one line per workload, each carrying the machine, toolchain and commit it ran on.
pub(crate) fn print_csv(run: &RunReport) {
    let mut out = csv::Writer::from_writer(std::io::stdout().lock());
    let heads = Rates::HEADS
        .iter()
        .map(|h| h.replace("/s", "_per_sec").replace(['+', ' '], "_"));
    let header: Vec<String> = std::iter::once("workload".to_owned())
        .chain(heads)
        .chain(
            [
                "p50_us",
                "p99_us",
                "p999_us",
                "max_us",
                "early",
                "lost",
                "duplicated",
                "peak_rss_bytes",
                "bytes_per_pending",
                "cpu_seconds",
                "wall_seconds",
                "cores",
                "cpu_model",
                "kernel",
                "rustc",
                "commit",
                "config",
            ]
            .map(str::to_owned),
        )
        .collect();
    let field = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.1}"));
    let write = |out: &mut csv::Writer<_>, record: Vec<String>| {
        if let Err(error) = out.write_record(&record) {
            eprintln!("error: writing the CSV: {error}");
            std::process::exit(1);
        }
    };
    write(&mut out, header);
    for w in &run.workloads {
        let mut record = vec![w.name.to_owned()];
        record.extend(w.rates.columns().into_iter().map(field));
        record.extend([
            w.lateness_us.p50.to_string(),
            w.lateness_us.p99.to_string(),
            w.lateness_us.p999.to_string(),
            w.lateness_us.max.to_string(),
            w.early.to_string(),
            w.lost.to_string(),
            w.duplicated.to_string(),
            w.process
                .peak_rss_bytes
                .map_or(String::new(), |b| b.to_string()),
            field(w.bytes_per_pending),
            field(w.process.cpu_seconds),
            format!("{:.3}", w.process.wall_seconds),
            run.machine.cores.to_string(),
            run.machine.cpu_model.clone(),
            run.machine.kernel.clone(),
            run.machine.rustc.clone(),
            run.machine.commit.clone(),
            run.config.clone(),
        ]);
        write(&mut out, record);
    }
    if let Err(error) = out.flush() {
        eprintln!("error: writing the CSV: {error}");
        std::process::exit(1);
    }
}

/// What a run ran on: the machine, the toolchain and the commit.
#[derive(Debug, Serialize, Clone)]
pub(crate) struct Machine {
    /// Cores available to the process.
    pub(crate) cores: usize,
    /// The CPU's model name (/proc/cpuinfo), or "unknown".
    pub(crate) cpu_model: String,
    /// The kernel's release (/proc/sys/kernel/osrelease), or the OS name.
    pub(crate) kernel: String,
    /// `rustc -V` of the compiler that built the driver.
    pub(crate) rustc: String,
    /// The commit the driver was built from (`git describe --always --dirty`).
    pub(crate) commit: String,
}

impl Machine {
    /// Reads the machine; the toolchain and commit were recorded at build time.
    pub(crate) fn read() -> Self {
        let cpu_model = crate::system::cpu_model();
        let kernel = crate::system::kernel();
        Machine {
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            cpu_model,
            kernel,
            rustc: env!("DRIVER_RUSTC_VERSION").to_owned(),
            commit: env!("DRIVER_COMMIT").to_owned(),
        }
    }
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "on {} cores of {}, {}; built by {} from commit {}",
            self.cores, self.cpu_model, self.kernel, self.rustc, self.commit
        )
    }
}

/// Lateness of `now` after `deadline` in µs (saturating), and whether it was early.
pub(crate) fn lateness(deadline: Instant, now: Instant) -> (u32, bool) {
    match now.checked_duration_since(deadline) {
        Some(late) => (
            u32::try_from(late.as_micros()).unwrap_or(u32::MAX - 1),
            false,
        ),
        None => (0, true),
    }
}

/// Sleeps until `condition` holds or `timeout` passes; returns whether it held.
/// The middle item of `items` by `key` (the upper middle of an even count): the
/// driver's one median, for a run of rounds (a whole round is kept, so that its other
/// figures come from the same round).
///
/// # Panics
///
/// If `items` is empty.
pub(crate) fn median_by<T>(mut items: Vec<T>, key: impl Fn(&T) -> f64) -> T {
    assert!(!items.is_empty(), "the median of nothing");
    items.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let middle = items.len() / 2;
    items.swap_remove(middle)
}

pub(crate) fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !condition() {
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workload report with `on_time` of its timers on time, measured over 1 s of
    /// wall on a 2-CPU machine: the process used `process` CPU seconds and every
    /// process together `machine`.
    fn judged(on_time: f64, process: f64, machine: f64) -> Timeliness {
        let mut report = judged_report();
        report.lateness_us.on_time = on_time;
        report.process.cpu_seconds = Some(process);
        report.process.machine_busy_seconds = Some(machine);
        report.timeliness(2)
    }

    #[test]
    fn late_with_cpu_to_spare_is_late_and_only_real_load_excuses_it() {
        assert_eq!(judged(0.995, 1.9, 2.0), Timeliness::OnTime);
        // The process at 30 %, others at 5 %: CPU to spare.
        assert_eq!(judged(0.97, 0.6, 0.7), Timeliness::Late);
        // Others just under a quarter of the machine: still judged.
        assert_eq!(judged(0.97, 0.6, 1.08), Timeliness::Late);
        // Others at a quarter of the machine (half a core of 2).
        assert_eq!(judged(0.97, 0.6, 1.1), Timeliness::TooLoaded);
        // The process itself kept 90 % of the cores busy.
        assert_eq!(judged(0.97, 1.8, 1.8), Timeliness::TooLoaded);
    }

    #[test]
    fn only_a_stall_of_the_machine_past_the_allowance_that_explains_the_p99_excuses_lateness() {
        let mut report = judged_report();
        report.lateness_us.on_time = 0.97;
        report.lateness_us.p99 = 4_000;
        assert_eq!(report.timeliness(2), Timeliness::Late, "not measured");
        report.process.machine_stall_us = Some(WAKE_ALLOWANCE_US);
        assert_eq!(
            report.timeliness(2),
            Timeliness::Late,
            "within the allowance"
        );
        report.process.machine_stall_us = Some(1_500);
        assert_eq!(
            report.timeliness(2),
            Timeliness::Late,
            "1.5 ms does not explain 4 ms"
        );
        report.process.machine_stall_us = Some(2_000);
        assert_eq!(report.timeliness(2), Timeliness::Stalled);
        report.lateness_us.on_time = 0.995;
        assert_eq!(
            report.timeliness(2),
            Timeliness::OnTime,
            "on time whatever the stall"
        );
    }

    #[test]
    fn without_machine_readings_only_the_process_excuses_lateness() {
        let mut report = judged_report();
        report.process.machine_busy_seconds = None;
        assert_eq!(report.timeliness(2), Timeliness::Late);
        report.process.cpu_seconds = Some(1.8);
        assert_eq!(report.timeliness(2), Timeliness::TooLoaded);
    }

    /// A report with 97 % on time, the process at 30 % of 2 cores over 1 s.
    fn judged_report() -> WorkloadReport {
        WorkloadReport {
            name: "rpc",
            rates: Rates::default(),
            fired: 100,
            lateness_us: Lateness {
                count: 100,
                on_time: 0.97,
                ..Lateness::default()
            },
            early: 0,
            lost: 0,
            duplicated: 0,
            bytes_per_pending: None,
            capture_bytes: 0,
            process: Readings {
                wall_seconds: 1.0,
                cpu_seconds: Some(0.6),
                peak_rss_bytes: None,
                machine_busy_seconds: Some(0.7),
                machine_cpus: Some(2),
                machine_stall_us: None,
            },
            notes: Vec::new(),
        }
    }
}
