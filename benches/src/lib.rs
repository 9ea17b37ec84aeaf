//! Criterion benches of sharded-timer beside its peers: see `benches/` here, and the
//! repository's README for the commands (`cargo bench -p sharded-timer-benches`).

use std::time::Duration;

use sharded_timer_peers::process_cpu;

/// A criterion measurement of the process's CPU time, every thread, instead of wall
/// time: on a machine with fewer cores than threads, the honest figure (a wall rate
/// mostly says who got the CPU). Values are durations, shown as criterion shows time,
/// and its throughput lines are then operations per CPU-second.
pub struct ProcessCpu {
    /// Lends its duration formatter.
    wall: criterion::measurement::WallTime,
}

impl Default for ProcessCpu {
    fn default() -> Self {
        ProcessCpu {
            wall: criterion::measurement::WallTime,
        }
    }
}

impl std::fmt::Debug for ProcessCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProcessCpu")
    }
}

impl criterion::measurement::Measurement for ProcessCpu {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        process_cpu()
    }

    fn end(&self, start: Duration) -> Duration {
        process_cpu().saturating_sub(start)
    }

    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }

    fn zero(&self) -> Duration {
        Duration::ZERO
    }

    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }

    fn formatter(&self) -> &dyn criterion::measurement::ValueFormatter {
        self.wall.formatter()
    }
}
