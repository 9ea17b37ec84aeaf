//! `--plot DIR`: SVG charts of a `--compare`, `--sweep` or `--soak` run, drawn with
//! plotters' SVG backend (text as SVG `<text>`, so no font library is needed).
//!
//! | mode | file | what it shows |
//! | --- | --- | --- |
//! | `--compare` | `compare-ratios.svg` | sharded-timer's rate ÷ each peer's, per workload (right of 1 is ahead) |
//! | `--compare` | `compare-cpu.svg` | CPU ns per operation, per workload and peer |
//! | `--compare` | `compare-lateness.svg` | rpc: lateness p50, p99, p99.9 and max of the timeouts that fire, per peer |
//! | `--compare` | `timeouts.svg` | async timeouts inside tokio tasks, M/s, per shape and peer |
//! | `--sweep` | `sweep-rate.svg` | schedule and schedule+cancel M/s against producer threads |
//! | `--soak` | `soak-memory.svg` | allocated bytes and RSS over the soak |

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

use crate::modes::compare::CompareReport;
use crate::modes::soak::SoakReport;
use crate::modes::sweep::SweepRow;
use crate::modes::timeouts::TimeoutRow;

/// Chart size, pixels.
const SIZE: (u32, u32) = (960, 600);

/// A colour per series, stable across charts for the same index.
fn colour(index: usize) -> RGBColor {
    const COLOURS: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    COLOURS[index % COLOURS.len()]
}

/// Turns a plotters error into a message naming the file.
fn failed(path: &Path) -> impl Fn(Box<dyn std::error::Error>) -> String + '_ {
    move |error| format!("--plot: drawing {}: {error}", path.display())
}

/// Horizontal bars, one per label, coloured by group. With a `rule` (ratios), the x
/// axis is logarithmic and each bar runs from the rule to its value: right of it is
/// ahead, left behind, and a 12× lead does not flatten a 0.8× lag.
fn bars(
    path: &Path,
    title: &str,
    x_label: &str,
    rows: &[(String, f64, usize)],
    rule: Option<f64>,
) -> Result<(), String> {
    let err = failed(path);
    let height = SIZE.1.max(80 + 18 * rows.len() as u32);
    let root = SVGBackend::new(path, (SIZE.0, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.into()))?;
    let values = rows
        .iter()
        .map(|row| row.1)
        .filter(|v| v.is_finite() && *v > 0.0);
    let (low, high) = values.fold(
        (rule.unwrap_or(1.0), rule.unwrap_or(0.0)),
        |(low, high), v| (low.min(v), high.max(v)),
    );
    let count = rows.len() as u32;
    // With a rule, the log scale is drawn as log10 of the values on a linear axis,
    // labelled back in ratios (as `lines` does): one drawing path for both kinds.
    let x_of = |x: f64| if rule.is_some() { x.log10() } else { x };
    let x_range = match rule {
        Some(_) => x_of(low * 0.8)..x_of(high * 1.25),
        None => 0.0..high.max(f64::MIN_POSITIVE) * 1.1,
    };
    let from = rule.map_or(0.0, x_of);
    let x_format = |x: &f64| -> String {
        if rule.is_some() {
            format!("{:.2}×", 10f64.powf(*x))
        } else {
            format!("{x}")
        }
    };
    let label = |value: &SegmentValue<u32>| match value {
        SegmentValue::CenterOf(index) => rows
            .get(*index as usize)
            .map(|row| row.0.clone())
            .unwrap_or_default(),
        _ => String::new(),
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(280)
        .build_cartesian_2d(x_range, (0u32..count).into_segmented())
        .map_err(|e| err(e.into()))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc(x_label)
        .x_label_formatter(&x_format)
        .y_labels(rows.len())
        .y_label_formatter(&label)
        .draw()
        .map_err(|e| err(e.into()))?;
    chart
        .draw_series(rows.iter().enumerate().map(|(index, (_, value, group))| {
            let index = index as u32;
            let mut bar = Rectangle::new(
                [
                    (from, SegmentValue::Exact(index)),
                    (x_of(*value), SegmentValue::Exact(index + 1)),
                ],
                colour(*group).filled(),
            );
            bar.set_margin(2, 2, 0, 0);
            bar
        }))
        .map_err(|e| err(e.into()))?;
    if rule.is_some() {
        chart
            .draw_series(LineSeries::new(
                [
                    (from, SegmentValue::Exact(0)),
                    (from, SegmentValue::Exact(count)),
                ],
                BLACK.stroke_width(2),
            ))
            .map_err(|e| err(e.into()))?;
    }
    root.present().map_err(|e| err(e.into()))?;
    Ok(())
}

/// Lines over a shared x axis, one per named series; `x_names` names the integer x
/// positions (empty: plain numbers); `log_y` draws y on a log scale.
fn lines(
    path: &Path,
    title: &str,
    (x_label, y_label): (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
    x_names: &[&str],
    log_y: bool,
) -> Result<(), String> {
    let err = failed(path);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.into()))?;
    let points = series.iter().flat_map(|(_, points)| points.iter());
    let (x_max, y_max) = points.fold((1.0f64, 1.0f64), |(x, y), &(px, py)| (x.max(px), y.max(py)));
    let x_range = if x_names.is_empty() {
        0.0..x_max * 1.05
    } else {
        -0.1..x_max + 0.1
    };
    let x_format = |x: &f64| -> String {
        if x_names.is_empty() {
            format!("{x}")
        } else if (x - x.round()).abs() < 1e-6 {
            x_names
                .get(x.round() as usize)
                .copied()
                .unwrap_or_default()
                .to_owned()
        } else {
            String::new()
        }
    };
    let x_labels = if x_names.is_empty() {
        10
    } else {
        x_names.len()
    };
    // A log scale is drawn as log10 of the values on a linear axis, labelled back in
    // the values' units: one drawing path for both.
    let y_of = |y: f64| if log_y { y.max(1.0).log10() } else { y };
    let y_range = if log_y {
        0.0..y_of(y_max) + 0.3
    } else {
        0.0..y_max * 1.1
    };
    let y_format = |y: &f64| -> String {
        if log_y {
            format!("{:.0}", 10f64.powf(*y))
        } else {
            format!("{y}")
        }
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range, y_range)
        .map_err(|e| err(e.into()))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_labels(x_labels)
        .x_label_formatter(&x_format)
        .y_label_formatter(&y_format)
        .draw()
        .map_err(|e| err(e.into()))?;
    for (index, (name, points)) in series.iter().enumerate() {
        let style = colour(index).stroke_width(2);
        let points: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (x, y_of(y))).collect();
        chart
            .draw_series(LineSeries::new(points.iter().copied(), style))
            .map_err(|e| err(e.into()))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
        chart
            .draw_series(
                points
                    .iter()
                    .map(|&point| Circle::new(point, 3, colour(index).filled())),
            )
            .map_err(|e| err(e.into()))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| err(e.into()))?;
    root.present().map_err(|e| err(e.into()))?;
    Ok(())
}

/// Creates `dir` if needed; the path of `name` in it.
fn file(dir: &Path, name: &str) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir)
        .map_err(|error| format!("--plot: creating {}: {error}", dir.display()))?;
    Ok(dir.join(name))
}

/// The `--compare` charts.
///
/// # Errors
///
/// A message naming the file that could not be written.
pub(crate) fn compare(report: &CompareReport, dir: &Path) -> Result<Vec<PathBuf>, String> {
    // Ours and the outside peers: sharded-timer's other configurations are in the
    // table, not in the charts, which they would crowd.
    let ours = report.rpc.first().map_or("sharded-timer", |row| row.peer);
    let peers: Vec<&str> = report
        .rpc
        .iter()
        .map(|row| row.peer)
        .filter(|peer| *peer == ours || !peer.starts_with("sharded-"))
        .collect();
    let peer_index = |name: &str| peers.iter().position(|p| *p == name).unwrap_or(0);
    // Rates per workload: (workload label, peer, rate, CPU ns).
    let mut figures: Vec<(String, &str, f64, f64)> = Vec::new();
    for row in &report.rpc {
        figures.push(("rpc".into(), row.peer, row.rate, row.cpu_ns_per_op));
    }
    for row in &report.burst {
        figures.push(("burst".into(), row.peer, row.rate, row.cpu_ns_per_op));
    }
    for ((peer, plain, cancel), (_, plain_cpu, cancel_cpu)) in
        report.schedule.iter().zip(&report.schedule_cpu_ns)
    {
        for (column, &producers) in report.producers.iter().enumerate() {
            figures.push((
                format!("schedule, {producers} prod."),
                peer,
                plain[column],
                plain_cpu[column],
            ));
        }
        for (column, &producers) in report.producers.iter().enumerate() {
            figures.push((
                format!("sched.+cancel, {producers} prod."),
                peer,
                cancel[column],
                cancel_cpu[column],
            ));
        }
    }
    let mut ratios = Vec::new();
    let mut cpu = Vec::new();
    let mut workloads: Vec<&String> = Vec::new();
    for (workload, ..) in &figures {
        if !workloads.contains(&workload) {
            workloads.push(workload);
        }
    }
    for workload in &workloads {
        let of = |peer: &str| {
            figures
                .iter()
                .find(|(w, p, ..)| w == *workload && *p == peer)
                .map(|&(_, _, rate, cpu)| (rate, cpu))
        };
        let Some((mine, _)) = of(ours) else { continue };
        for &peer in &peers {
            let Some((rate, ns)) = of(peer) else { continue };
            if peer != ours && rate > 0.0 {
                ratios.push((
                    format!("{workload}: ÷ {peer}"),
                    mine / rate,
                    peer_index(peer),
                ));
            }
            if ns.is_finite() && ns > 0.0 {
                cpu.push((format!("{workload}: {peer}"), ns, peer_index(peer)));
            }
        }
    }
    let mut written = Vec::new();
    let path = file(dir, "compare-ratios.svg")?;
    bars(
        &path,
        &format!(
            "{ours} rate ÷ peer rate (median of {} rounds; right of 1: ahead)",
            report.rounds
        ),
        "ratio",
        &ratios,
        Some(1.0),
    )?;
    written.push(path);
    let path = file(dir, "compare-cpu.svg")?;
    bars(
        &path,
        "CPU ns per operation (process CPU, every thread; lower is better)",
        "ns",
        &cpu,
        None,
    )?;
    written.push(path);
    let lateness: Vec<(String, Vec<(f64, f64)>)> = report
        .rpc
        .iter()
        .filter(|row| peers.contains(&row.peer))
        .map(|row| {
            let points = row
                .lateness
                .iter()
                .enumerate()
                .map(|(index, &us)| (index as f64, us.max(1) as f64))
                .collect();
            (row.peer.to_owned(), points)
        })
        .collect();
    let path = file(dir, "compare-lateness.svg")?;
    lines(
        &path,
        "rpc: lateness of the timeouts that fire (300 ms timeouts, 1 M pending)",
        ("percentile", "µs late (log scale)"),
        &lateness,
        &["p50", "p99", "p99.9", "max"],
        true,
    )?;
    written.push(path);
    Ok(written)
}

/// The `--compare` async section's chart.
///
/// # Errors
///
/// A message naming the file that could not be written.
pub(crate) fn timeouts(rows: &[TimeoutRow], dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut bars_of = Vec::new();
    for (shape, pick) in [
        (
            "pending once",
            (|row: &TimeoutRow| row.pending_once.0) as fn(&TimeoutRow) -> f64,
        ),
        ("ready at once", |row: &TimeoutRow| row.ready.0),
    ] {
        for (index, row) in rows.iter().enumerate() {
            bars_of.push((format!("{shape}: {}", row.peer), pick(row) / 1e6, index));
        }
    }
    let path = file(dir, "timeouts.svg")?;
    bars(
        &path,
        "timeout(1 s, f) inside tokio tasks: M timeouts/s (higher is better)",
        "M timeouts/s",
        &bars_of,
        None,
    )?;
    Ok(vec![path])
}

/// The `--sweep` chart.
///
/// # Errors
///
/// A message naming the file that could not be written.
pub(crate) fn sweep(rows: &[SweepRow], dir: &Path) -> Result<Vec<PathBuf>, String> {
    let column = |pick: fn(&SweepRow) -> f64| -> Vec<(f64, f64)> {
        rows.iter()
            .map(|row| (row.producers as f64, pick(row)))
            .collect()
    };
    let series = vec![
        (
            "sharded-timer, schedule".to_owned(),
            column(|row| row.sharded[0]),
        ),
        (
            "netty-style, schedule".to_owned(),
            column(|row| row.netty_style[0]),
        ),
        (
            "sharded-timer, schedule+cancel".to_owned(),
            column(|row| row.sharded[1]),
        ),
        (
            "netty-style, schedule+cancel".to_owned(),
            column(|row| row.netty_style[1]),
        ),
    ];
    let path = file(dir, "sweep-rate.svg")?;
    lines(
        &path,
        "1 M timers from n producers (sharded-timer with n shards): M/s",
        ("producer threads", "M/s"),
        &series,
        &[],
        false,
    )?;
    Ok(vec![path])
}

/// The `--soak` chart.
///
/// # Errors
///
/// A message naming the file that could not be written.
pub(crate) fn soak(report: &SoakReport, dir: &Path) -> Result<Vec<PathBuf>, String> {
    const MB: f64 = 1024.0 * 1024.0;
    let allocated = report
        .samples
        .iter()
        .map(|sample| (sample.second as f64, sample.allocated as f64 / MB))
        .collect();
    let rss = report
        .samples
        .iter()
        .filter_map(|sample| {
            sample
                .rss
                .map(|rss| (sample.second as f64, rss as f64 / MB))
        })
        .collect();
    let series = vec![
        ("allocated (live heap)".to_owned(), allocated),
        ("resident set (RSS)".to_owned(), rss),
    ];
    let path = file(dir, "soak-memory.svg")?;
    lines(
        &path,
        &format!(
            "soak: memory over {:.0} s of rpc and keepalive load",
            report.seconds
        ),
        ("seconds", "MiB"),
        &series,
        &[],
        false,
    )?;
    Ok(vec![path])
}
