//! The service's `stats()` as Prometheus metrics: `record_metrics` publishes them
//! through the `metrics` facade to the recorder the application installed, here
//! `metrics-exporter-prometheus`'s. A real program serves `handle.render()` on its
//! `/metrics` endpoint (or enables that crate's HTTP listener) and calls
//! `record_metrics` about once a second; this one records twice and prints the
//! exposition text.
//!
//! Run: `cargo run --example prometheus --features metrics`.

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use sharded_timer::ShardedTimer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new().install_recorder()?;
    let timer = ShardedTimer::builder().shards(2).build()?;

    // Some traffic: request timeouts, most answered (cancelled) in time.
    let mut timeouts = Vec::new();
    for request in 0..1_000u64 {
        let timeout = timer.schedule(Duration::from_millis(20), move || {
            let _ = request; // a request that timed out
        })?;
        timeouts.push(timeout);
    }
    for timeout in timeouts.iter().take(900) {
        timeout.cancel();
    }
    timer.record_metrics();
    // Let the 100 unanswered requests time out (20 ms; a slow machine gets 5 s).
    let start = std::time::Instant::now();
    while timer.stats().fired < 100 && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // Once a second in a real program: counters are absolute, the lateness histogram
    // gets the timers fired since the previous call.
    timer.record_metrics();

    let exposition = handle.render();
    println!("{exposition}");
    // What a scrape would find (an example users run checks itself).
    for series in [
        "sharded_timer_scheduled_total 1000",
        "sharded_timer_cancelled_total 900",
        "sharded_timer_fired_total 100",
        "sharded_timer_pending 0",
        "# HELP sharded_timer_lateness_seconds",
    ] {
        assert!(exposition.contains(series), "missing `{series}`");
    }
    drop(timer.shutdown());
    Ok(())
}
