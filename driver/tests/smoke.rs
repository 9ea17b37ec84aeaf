//! The driver end to end, small: every workload checks itself and the process exits
//! 0; the CSV carries one column per operation kind and the machine; a short soak
//! passes; a 20-second chaos run finds no violation; bad arguments exit 2.

use std::process::Command;

/// The driver, with workload sizes small enough for a debug build.
fn driver() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sharded-timer"));
    command.args([
        "--no-pin",
        "--connections",
        "500",
        "--requests",
        "20000",
        "--background",
        "5000",
        "--jobs",
        "5000",
        "--burst",
        "5000",
        "--heartbeats",
        "100",
        "--max-pending",
        "1000",
        "--offered",
        "4000",
        "--timeouts",
        "5000",
        "--rate",
        "20000",
        "--steady-s",
        "0.5",
        "--stall-s",
        "1",
        "--net-connections",
        "200",
        "--no-idle-check",
    ]);
    command
}

#[test]
fn every_workload_passes_its_own_checks_and_the_csv_says_where_it_ran() {
    let out = driver().arg("--csv").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    let header = lines.next().unwrap();
    for column in [
        "schedule_per_sec",
        "s_cancel_per_sec",
        "reset_per_sec",
        "cancel_s_per_sec",
        "fired_per_sec",
        "drain_ms",
        "cores",
        "cpu_model",
        "kernel",
        "rustc",
        "commit",
    ] {
        assert!(header.split(',').any(|c| c == column), "{column}: {header}");
    }
    let workloads: Vec<&str> = lines.map(|l| l.split(',').next().unwrap()).collect();
    assert_eq!(
        workloads,
        [
            "delayed",
            "keepalive",
            "keepalive-cs",
            "rpc",
            "burst",
            "heartbeat",
            "backpressure",
            "async",
            "steady",
            "stall",
            "net"
        ]
    );
    assert!(stdout.contains("rustc "), "{stdout}");
}

#[test]
fn a_short_soak_passes_and_draws_its_memory() {
    let dir = std::env::temp_dir().join(format!("sharded-timer-plot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = driver()
        .args(["--soak", "3s", "--plot"])
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("PASS: memory flat"), "{stdout}");
    let chart = dir.join("soak-memory.svg");
    assert!(stdout.contains("chart: "), "{stdout}");
    let svg = std::fs::read_to_string(&chart).unwrap_or_default();
    assert!(svg.starts_with("<svg"), "{}: {svg:.80}", chart.display());
    assert!(
        svg.contains("resident set (RSS)"),
        "the legend names the series"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_arguments_exit_2_with_a_message() {
    for args in [
        ["--soak", "10d"],
        ["--sweep", "producers=0"],
        ["--time-scale", "0"],
        ["--plot", "/tmp/nowhere"],
    ] {
        let out = driver().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("error"),
            "{args:?}"
        );
    }
}

/// The table judges guarantee 2 for every workload, with a verdict each: on time, late,
/// too loaded to judge, or (the burst) not judged.
#[test]
fn the_report_judges_lateness_for_every_workload() {
    let out = driver().args(["rpc", "burst", "steady"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    // The table that fits a terminal, with its legend.
    assert!(stdout.contains("p99 ms"), "{stdout}");
    assert!(
        stdout.contains("early/lost/dup: callbacks before"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .skip_while(|line| !line.starts_with("workload"))
            .take_while(|line| !line.starts_with("  rate:"))
            .all(|line| line.chars().count() <= 100),
        "{stdout}"
    );
    assert!(stdout.contains("on time (guarantee 2"), "{stdout}");
    let verdicts: Vec<&str> = stdout
        .lines()
        .skip_while(|line| !line.starts_with("on time (guarantee 2"))
        .skip(1)
        .take(3)
        .collect();
    assert_eq!(verdicts.len(), 3, "{stdout}");
    for (line, workload) in verdicts.iter().zip(["rpc", "burst", "steady"]) {
        assert!(line.trim_start().starts_with(workload), "{line}");
        assert!(
            ["on time (", "LATE: ", "not judged"]
                .iter()
                .any(|verdict| line.contains(verdict)),
            "{line}"
        );
    }
    assert!(
        verdicts[1].contains("not judged (a burst"),
        "{}",
        verdicts[1]
    );
}

/// `--verbose` prints the wide table: every rate, four percentiles, memory and CPU.
#[test]
fn verbose_prints_the_wide_table() {
    let out = driver().args(["delayed", "--verbose"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("lateness p99 µs"), "{stdout}");
    assert!(stdout.contains("B/pending"), "{stdout}");
    assert!(stdout.contains("peak RSS: the process's"), "{stdout}");
}

/// `chaos`: 20 s of random operations from several threads on services in turn
/// (pool, inline, spawner, ...), every check passing.
#[test]
fn a_20_second_chaos_run_finds_no_violation() {
    let out = Command::new(env!("CARGO_BIN_EXE_sharded-timer"))
        .args(["chaos", "20s", "--phase", "4s", "--seed", "29"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let summary = stdout
        .lines()
        .find(|line| line.starts_with("chaos: ") && line.contains(" phases, "))
        .unwrap_or_else(|| panic!("no summary line: {stdout}"));
    assert!(summary.ends_with("violations 0: PASS"), "{summary}");
    // Pool, inline and spawner at least (phases run a little past their 4 s).
    let phases: u32 = summary
        .split(" phases, ")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(phases >= 3, "{summary}");
}

#[test]
fn chaos_refuses_a_bad_duration_with_exit_2() {
    for args in [["chaos", "10d"], ["chaos", "soon"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_sharded-timer"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("error"),
            "{args:?}"
        );
    }
}
