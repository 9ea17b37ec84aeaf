//! The service's counters as an operator reads them: [`ShardedTimer::stats`] sums the
//! shards' counters into a [`Stats`] (the report's types are in `src/stats.rs`), and
//! `record_metrics` (feature `metrics`) exports that snapshot through the `metrics`
//! facade.

use super::ShardedTimer;
use crate::stats::{LatenessHistogram, ShardLoad, Stats};
use crate::sync::Ordering;

impl ShardedTimer {
    /// A snapshot of the counters, summed over the shards and workers, with each
    /// shard's load and the lateness of fired timers. Cheap: no lock, nothing on the
    /// hot path; it also wakes each shard so that timers waiting in its rings are
    /// counted by the next call (see [`Stats`]).
    pub fn stats(&self) -> Stats {
        for shard in self.inner.shards.iter() {
            shard.nudge();
        }
        self.counters()
    }

    /// Publishes [`stats`](Self::stats) through the [`metrics`](https://docs.rs/metrics)
    /// facade, to whatever recorder the application installed (Prometheus, StatsD…);
    /// call it periodically, e.g. once a second. Feature `metrics`.
    ///
    /// - counters (absolute, named as Prometheus expects counters: `_total`):
    ///   `sharded_timer_scheduled_total`, `sharded_timer_fired_total`,
    ///   `sharded_timer_cancelled_total`, `sharded_timer_panicked_total`,
    ///   `sharded_timer_skipped_total`, `sharded_timer_ring_full_waits_total`;
    /// - gauges: `sharded_timer_pending`, `sharded_timer_in_rings`, and
    ///   `sharded_timer_shard_pending` with label `shard` = its index;
    /// - histogram `sharded_timer_lateness_seconds`: the timers fired since the
    ///   previous call, each recorded at the upper bound of its
    ///   [`LatenessHistogram`] bucket.
    ///
    /// Every series is described (`describe_counter!` and its kin) with its unit and a
    /// help text, on every call, so that a recorder installed later still gets them.
    /// Services in one process are told apart by the recorder's global labels, or by
    /// calling this from a scope with a recorder of their own.
    ///
    /// # Examples
    ///
    /// ```
    /// # let timer = sharded_timer::ShardedTimer::builder().shards(1).build()?;
    /// // With a recorder installed (metrics_exporter_prometheus, …), once a second:
    /// timer.record_metrics();
    /// # Ok::<(), sharded_timer::BuildError>(())
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn record_metrics(&self) {
        use metrics::Unit;
        let stats = self.stats();
        let counters = [
            (
                "sharded_timer_scheduled_total",
                stats.scheduled,
                "Timers the shards have taken in (a repeating timer once)",
            ),
            (
                "sharded_timer_fired_total",
                stats.fired,
                "Timers fired, and runs of repeating timers",
            ),
            (
                "sharded_timer_cancelled_total",
                stats.cancelled,
                "Timers cancelled and processed by their shard",
            ),
            (
                "sharded_timer_panicked_total",
                stats.panicked,
                "Callbacks that panicked (caught and counted)",
            ),
            (
                "sharded_timer_skipped_total",
                stats.skipped,
                "Runs of repeating timers skipped, a whole period behind",
            ),
            (
                "sharded_timer_ring_full_waits_total",
                stats.ring_full_waits,
                "Pushes that found a shard's ring full and waited",
            ),
        ];
        for (name, value, help) in counters {
            metrics::describe_counter!(name, Unit::Count, help);
            metrics::counter!(name).absolute(value);
        }
        metrics::describe_gauge!(
            "sharded_timer_pending",
            Unit::Count,
            "Timers pending: neither fired, cancelled nor handed back"
        );
        metrics::describe_gauge!(
            "sharded_timer_in_rings",
            Unit::Count,
            "Timers in the shards' insert rings, not yet taken in"
        );
        metrics::describe_gauge!(
            "sharded_timer_shard_pending",
            Unit::Count,
            "Timers pending on one shard (label shard)"
        );
        metrics::describe_histogram!(
            "sharded_timer_lateness_seconds",
            Unit::Seconds,
            "How long after its deadline each timer fired (the upper bound of its bucket)"
        );
        metrics::gauge!("sharded_timer_pending").set(stats.pending as f64);
        metrics::gauge!("sharded_timer_in_rings").set(stats.in_rings as f64);
        for (index, shard) in stats.shards.iter().enumerate() {
            metrics::gauge!("sharded_timer_shard_pending", "shard" => index.to_string())
                .set(shard.pending as f64);
        }
        let mut exported = self
            .inner
            .exported
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let lateness = metrics::histogram!("sharded_timer_lateness_seconds");
        for (upper, count) in stats.lateness.buckets_since(&exported) {
            lateness.record_many(upper.as_secs_f64(), count as usize);
        }
        *exported = stats.lateness;
    }

    /// The counters as they stand, waking nothing (for `Debug`).
    pub(super) fn counters(&self) -> Stats {
        let mut stats = Stats::default();
        let mut lateness = LatenessHistogram::default();
        for shard in self.inner.shards.iter() {
            let load = shard.load();
            // A repeating timer counts once in `scheduled`, and leaves `pending` only
            // when it is cancelled or handed back: its runs count in `fired` alone.
            let scheduled = load.scheduled.saturating_sub(load.refiled);
            let pending = scheduled.saturating_sub(
                load.fired.saturating_sub(load.runs) + load.cancelled + load.returned,
            );
            stats.scheduled += scheduled;
            stats.pending += pending;
            stats.fired += load.fired;
            stats.cancelled += load.cancelled;
            stats.in_rings += load.in_ring;
            stats.ring_full_waits += load.ring_full_waits;
            stats.skipped += load.skipped;
            lateness.merge(&load.lateness);
            stats.shards.push(ShardLoad {
                pending,
                in_ring: load.in_ring,
                fired: load.fired,
                ring_full_waits: load.ring_full_waits,
                lateness: load.lateness,
            });
        }
        // ORDERING: Relaxed: a statistic.
        stats.panicked =
            self.inner.executor.panicked() + self.inner.callback_panics.load(Ordering::Relaxed);
        stats.lateness = lateness;
        stats
    }
}
