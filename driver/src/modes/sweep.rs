//! `--sweep producers=1,2,4,8`: how schedule and schedule+cancel scale with producer
//! threads, sharded-timer (as many shards as producers) beside the netty-style wheel
//! (one lock), up to the cores of the machine it runs on.

#![forbid(unsafe_code)]

use serde::Serialize;
use sharded_timer::ShardedTimer;

use crate::modes::compare::schedule_rate_on;
use crate::peers::{Kind, Peer};
use crate::report::median_by;

/// One producer count's figures, M/s (median of the rounds).
#[derive(Debug, Serialize)]
pub(crate) struct SweepRow {
    /// Producer threads, and sharded-timer's shards.
    pub(crate) producers: usize,
    /// sharded-timer: schedule, schedule+cancel.
    pub(crate) sharded: [f64; 2],
    /// The netty-style wheel: schedule, schedule+cancel.
    pub(crate) netty_style: [f64; 2],
}

/// One element of `--sweep producers=1,2,4,8` (or `1,2,4,8`), which clap splits at
/// the commas: a positive producer count, the first one perhaps named.
///
/// # Errors
///
/// A message naming what did not parse.
pub(crate) fn producer_count(element: &str) -> Result<usize, String> {
    let count = element.strip_prefix("producers=").unwrap_or(element).trim();
    count
        .parse::<usize>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("`{count}` is not a positive producer count"))
}

/// The median of `rounds` runs of `measure`, in M/s.
fn median(rounds: usize, mut measure: impl FnMut() -> f64) -> f64 {
    let runs: Vec<f64> = (0..rounds.max(1)).map(|_| measure()).collect();
    median_by(runs, |&rate| rate) / 1e6
}

/// Runs the sweep and prints its table.
pub(crate) fn run(producers: &[usize], rounds: usize, quiet: bool) -> Vec<SweepRow> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if !quiet {
        println!(
            "\nscaling: 1 M timers from n producer threads, M/s (median of {rounds}); sharded-timer with n shards; {cores} cores{}",
            if cores <= 2 {
                " — only 2 cores here: counts above 2 share cores and do not show scaling"
            } else {
                ""
            }
        );
        println!(
            "{:>9} {:>12} {:>12} {:>8} {:>12} {:>12} {:>8}",
            "producers", "sharded s", "netty s", "ratio", "sharded s+c", "netty s+c", "ratio"
        );
    }
    let mut rows = Vec::new();
    for &n in producers {
        let mut sharded = [0.0; 2];
        let mut netty_style = [0.0; 2];
        for (column, cancel) in [false, true].into_iter().enumerate() {
            sharded[column] = median(rounds, || {
                let timer = ShardedTimer::builder()
                    .shards(n)
                    .executor_threads(n.min(cores))
                    .build()
                    .expect("sharded-timer starts");
                schedule_rate_on(&Peer::Sharded(timer), n, cancel).0
            });
            netty_style[column] = median(rounds, || {
                schedule_rate_on(&Kind::NettyStyle.start(), n, cancel).0
            });
        }
        if !quiet {
            println!(
                "{n:>9} {:>12.2} {:>12.2} {:>7.2}x {:>12.2} {:>12.2} {:>7.2}x",
                sharded[0],
                netty_style[0],
                sharded[0] / netty_style[0],
                sharded[1],
                netty_style[1],
                sharded[1] / netty_style[1],
            );
        }
        rows.push(SweepRow {
            producers: n,
            sharded,
            netty_style,
        });
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::producer_count;

    #[test]
    fn producer_counts_parse_with_or_without_their_name() {
        assert_eq!(producer_count("producers=1"), Ok(1));
        assert_eq!(producer_count("16"), Ok(16));
        for bad in ["", "producers=", "0", "producers=x", "shards=2"] {
            assert!(producer_count(bad).is_err(), "{bad}");
        }
    }
}
