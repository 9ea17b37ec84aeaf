//! What an operator reads: [`Stats`], the service's counters, with the lateness of
//! fired timers as a log-scale [`LatenessHistogram`] and each shard's load
//! ([`ShardLoad`]). Everything here is written by one thread (a shard) or on a slow
//! path (a producer that found a ring full), so keeping it costs the hot path nothing
//! but a few single-writer stores per fired timer.

#![forbid(unsafe_code)]

use std::fmt;
use std::time::Duration;

/// Sub-buckets per power of two: 4, so a bucket spans at most a quarter of its lower
/// bound (percentiles are within 25 % above the true value, like a 2-digit HDR).
const SUB_BITS: u32 = 2;
/// Lateness at or above 2^40 ns (about 18 minutes) shares the last bucket.
const TOP_EXPONENT: u32 = 40;
/// Buckets: the values below 4 ns one each, then 4 per power of two from 2^2 to
/// 2^39, then the open-ended top one.
pub(crate) const BUCKETS: usize = (((TOP_EXPONENT - SUB_BITS + 1) << SUB_BITS) + 1) as usize;

/// The bucket of a lateness of `ns` nanoseconds: exact below 4 ns, then 4 buckets per
/// power of two (the two bits after the leading one), saturating at the top.
fn bucket_of(ns: u64) -> usize {
    let sub = 1u64 << SUB_BITS;
    if ns < sub {
        return ns as usize;
    }
    let exponent = 63 - ns.leading_zeros();
    if exponent >= TOP_EXPONENT {
        return BUCKETS - 1;
    }
    let mantissa = (ns >> (exponent - SUB_BITS)) & (sub - 1);
    ((exponent - SUB_BITS + 1) as u64 * sub + mantissa) as usize
}

/// The largest lateness (ns) that falls in `bucket`.
fn bucket_upper_ns(bucket: usize) -> u64 {
    let sub = 1usize << SUB_BITS;
    if bucket < sub {
        return bucket as u64;
    }
    if bucket == BUCKETS - 1 {
        return u64::MAX;
    }
    let exponent = (bucket / sub) as u32 + SUB_BITS - 1;
    let mantissa = (bucket % sub) as u64;
    let lower = (1u64 << exponent) | (mantissa << (exponent - SUB_BITS));
    lower + (1u64 << (exponent - SUB_BITS)) - 1
}

/// The lateness of fired timers: how long after its deadline each timer was fired by
/// its shard, in a log-scale histogram (4 buckets per power of two of nanoseconds, so
/// a percentile reads at most 25 % high; one bucket for everything from about 18
/// minutes on).
///
/// Measured by the shard when it fires the timer: its clock reading for that pass of
/// the wheel minus the start of the tick the deadline was rounded up to. What comes
/// after, the hand-off to the executor and the wait for a free worker, is not in it,
/// and neither is the rounding of the deadline to its tick (less than one tick). The
/// runs of repeating timers are counted too.
///
/// # Examples
///
/// ```
/// # let timer = sharded_timer::ShardedTimer::builder().shards(1).build()?;
/// let lateness = timer.stats().lateness;
/// println!("fired {} timers; p50 {:?}, p99 {:?}, max {:?}",
///     lateness.count(), lateness.p50(), lateness.p99(), lateness.max());
/// # Ok::<(), sharded_timer::BuildError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LatenessHistogram {
    /// Fired timers per bucket.
    buckets: [u64; BUCKETS],
    /// The largest lateness recorded, ns.
    max_ns: u64,
}

impl Default for LatenessHistogram {
    fn default() -> Self {
        LatenessHistogram {
            buckets: [0; BUCKETS],
            max_ns: 0,
        }
    }
}

impl LatenessHistogram {
    /// Timers recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The lateness that a fraction `quantile` (0.0 to 1.0; clamped) of the recorded
    /// timers did not exceed: the upper bound of the bucket where that fraction is
    /// reached, never above [`max`](Self::max). `Duration::ZERO` when nothing was
    /// recorded.
    pub fn quantile(&self, quantile: f64) -> Duration {
        let count = self.count();
        if count == 0 {
            return Duration::ZERO;
        }
        let quantile = if quantile.is_nan() {
            1.0
        } else {
            quantile.clamp(0.0, 1.0)
        };
        // The rank of the timer at the quantile, 1-based: at least the first.
        let rank = ((quantile * count as f64).ceil() as u64).clamp(1, count);
        let mut seen = 0;
        for (bucket, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Duration::from_nanos(bucket_upper_ns(bucket).min(self.max_ns));
            }
        }
        Duration::from_nanos(self.max_ns)
    }

    /// The median lateness; see [`quantile`](Self::quantile).
    pub fn p50(&self) -> Duration {
        self.quantile(0.5)
    }

    /// The 99th percentile of lateness; see [`quantile`](Self::quantile).
    pub fn p99(&self) -> Duration {
        self.quantile(0.99)
    }

    /// The largest lateness recorded, exact.
    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.max_ns)
    }

    /// The non-empty buckets in increasing order: the largest lateness each holds
    /// (`Duration::MAX` for the last, open-ended one) and its count. For exporting to
    /// a metrics system of your own.
    pub fn buckets(&self) -> impl Iterator<Item = (Duration, u64)> + '_ {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(bucket, &n)| {
                let upper = bucket_upper_ns(bucket);
                let upper = if upper == u64::MAX {
                    Duration::MAX
                } else {
                    Duration::from_nanos(upper)
                };
                (upper, n)
            })
    }

    /// The buckets' counts beyond `earlier`'s (a previous snapshot of the same
    /// timers), as [`buckets`](Self::buckets) gives them.
    #[cfg(feature = "metrics")]
    pub(crate) fn buckets_since<'a>(
        &'a self,
        earlier: &'a LatenessHistogram,
    ) -> impl Iterator<Item = (Duration, u64)> + 'a {
        self.buckets
            .iter()
            .zip(earlier.buckets.iter())
            .enumerate()
            .filter(|(_, (now, then))| now > then)
            .map(|(bucket, (now, then))| {
                let upper = bucket_upper_ns(bucket);
                // The open-ended top bucket is exported at its lower bound, 2^40 ns.
                let upper = Duration::from_nanos(upper.min(1 << TOP_EXPONENT));
                (upper, now - then)
            })
    }

    /// Adds `other`'s timers to these.
    pub fn merge(&mut self, other: &LatenessHistogram) {
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *mine += theirs;
        }
        self.max_ns = self.max_ns.max(other.max_ns);
    }
}

impl fmt::Debug for LatenessHistogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LatenessHistogram")
            .field("count", &self.count())
            .field("p50", &self.p50())
            .field("p99", &self.p99())
            .field("max", &self.max())
            .finish()
    }
}

/// The lateness histogram one shard writes (only that shard's thread writes it).
///
/// Plain `std` atomics, also under loom: statistics take part in no protocol, and
/// loom need not explore them.
pub(crate) struct LatenessRecorder {
    /// Fired timers per bucket.
    buckets: [std::sync::atomic::AtomicU64; BUCKETS],
    /// The largest lateness recorded, ns.
    max_ns: std::sync::atomic::AtomicU64,
}

impl Default for LatenessRecorder {
    fn default() -> Self {
        LatenessRecorder {
            buckets: std::array::from_fn(|_| std::sync::atomic::AtomicU64::new(0)),
            max_ns: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl fmt::Debug for LatenessRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.snapshot().fmt(f)
    }
}

impl LatenessRecorder {
    /// Records one fired timer `ns` nanoseconds late. Only the holder of the shard's
    /// ownership token (its own thread, or one rescuing it).
    pub(crate) fn record(&self, ns: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let bucket = &self.buckets[bucket_of(ns)];
        // ORDERING: Relaxed load and store, no RMW: one writer at a time (the holder
        // of the shard's token, whose hand-over orders one holder's writes before the
        // next's: `shard/custody.rs`); readers want a value, not a happens-before edge.
        bucket.store(bucket.load(Relaxed) + 1, Relaxed);
        // ORDERING: as above.
        if ns > self.max_ns.load(Relaxed) {
            // ORDERING: as above.
            self.max_ns.store(ns, Relaxed);
        }
    }

    /// A copy of the histogram as it stands (exact at quiescence).
    pub(crate) fn snapshot(&self) -> LatenessHistogram {
        use std::sync::atomic::Ordering::Relaxed;
        LatenessHistogram {
            // ORDERING: Relaxed: a statistic.
            buckets: std::array::from_fn(|bucket| self.buckets[bucket].load(Relaxed)),
            // ORDERING: Relaxed: a statistic.
            max_ns: self.max_ns.load(Relaxed),
        }
    }
}

/// One shard's load, in [`Stats::shards`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardLoad {
    /// Timers in this shard's wheel that have neither fired nor been cancelled (a
    /// repeating timer is pending until cancelled, its runs included).
    pub pending: u64,
    /// Timers in this shard's insert ring, not yet taken into its wheel (reserved
    /// slots included).
    pub in_ring: u64,
    /// Timers this shard fired (and runs of repeating timers that started).
    pub fired: u64,
    /// Times a producer found one of this shard's rings full and waited for room.
    pub ring_full_waits: u64,
    /// Lateness of the timers this shard fired.
    pub lateness: LatenessHistogram,
}

/// A snapshot of the service's counters.
///
/// Each shard counts what it has processed, so the counters are cheap (no shared
/// counter on the hot path) and exact at quiescence: once every timer has fired or
/// been cancelled and the shards have caught up, `scheduled == fired + cancelled +
/// pending` for one-shot timers. A repeating timer counts once in `scheduled` and
/// once in `cancelled` (or not at all, if `shutdown` handed it back), however many
/// times it ran; each run counts in `fired`. Once `shutdown` has returned, `pending`
/// is 0: what it handed back, or cancelled for a sleep, is no longer pending. A timer still in a shard's insert ring
/// is counted in `in_rings` until the shard takes it in: at once if its deadline is
/// earlier than anything the shard holds, otherwise when the shard next wakes, which
/// [`ShardedTimer::stats`](crate::ShardedTimer::stats) itself prompts (it unparks
/// every shard), so counts catch up within one shard loop.
///
/// # Examples
///
/// What an operator prints to check a timeout SLO:
///
/// ```
/// # let timer = sharded_timer::ShardedTimer::builder().shards(2).build()?;
/// let stats = timer.stats();
/// println!(
///     "pending {} (in rings {}), fired {}, lateness p99 {:?} max {:?}, ring full {}×",
///     stats.pending, stats.in_rings, stats.fired,
///     stats.lateness.p99(), stats.lateness.max(), stats.ring_full_waits,
/// );
/// for (k, shard) in stats.shards.iter().enumerate() {
///     println!("shard {k}: pending {}, fired {}", shard.pending, shard.fired);
/// }
/// # Ok::<(), sharded_timer::BuildError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Timers the shards hold that have neither fired nor been cancelled, nor been
    /// handed back by `shutdown` (a repeating timer is pending until cancelled).
    pub pending: u64,
    /// Timers the shards have taken in; a repeating timer once, not once per run.
    pub scheduled: u64,
    /// One-shot timers whose callbacks were handed to the executor, and runs of
    /// repeating timers that started: a run handed over and then stopped by a `true`
    /// cancel before it began (or given up unrun) is not a fire. Between the hand-over
    /// and the run's start (or its cancel) the run counts, as it may still start.
    pub fired: u64,
    /// Cancelled timers the shards have processed.
    pub cancelled: u64,
    /// Callbacks that panicked (caught; the executor lives on).
    pub panicked: u64,
    /// Runs of repeating timers skipped because they fell a whole period behind.
    pub skipped: u64,
    /// Timers in the shards' insert rings that no shard has taken in yet.
    pub in_rings: u64,
    /// Times a producer (scheduling, cancelling or resetting) found a shard's ring full
    /// and waited for room. Nonzero means the rings are too small for the bursts, or a
    /// shard is falling behind.
    pub ring_full_waits: u64,
    /// Lateness of every fired timer, all shards merged.
    pub lateness: LatenessHistogram,
    /// Each shard's load, in shard order.
    pub shards: Vec<ShardLoad>,
}

#[cfg(test)]
mod tests {
    use super::{bucket_of, bucket_upper_ns, LatenessRecorder, BUCKETS};
    use std::time::Duration;

    #[test]
    fn buckets_are_contiguous_and_each_value_lies_within_its_bucket() {
        let mut lower = 0;
        for bucket in 0..BUCKETS - 1 {
            let upper = bucket_upper_ns(bucket);
            assert!(upper >= lower, "bucket {bucket}");
            assert_eq!(bucket_of(lower), bucket, "lower bound of bucket {bucket}");
            assert_eq!(bucket_of(upper), bucket, "upper bound of bucket {bucket}");
            // At most a quarter wide, past the exact ones.
            assert!(
                upper - lower <= lower / 4,
                "bucket {bucket}: {lower}..={upper}"
            );
            lower = upper + 1;
        }
        assert_eq!(lower, 1 << 40);
        assert_eq!(bucket_of(lower), BUCKETS - 1);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_read_the_bucket_bound_and_never_exceed_the_max() {
        let recorder = LatenessRecorder::default();
        assert_eq!(recorder.snapshot().p99(), Duration::ZERO);
        // 98 timers 1 µs late, one 1 ms late, one 5 ms late.
        for _ in 0..98 {
            recorder.record(1_000);
        }
        recorder.record(1_000_000);
        recorder.record(5_000_000);
        let lateness = recorder.snapshot();
        assert_eq!(lateness.count(), 100);
        let p50 = lateness.p50();
        assert!(
            p50 >= Duration::from_nanos(1_000) && p50 <= Duration::from_nanos(1_250),
            "{p50:?}"
        );
        let p99 = lateness.p99();
        assert!(
            p99 >= Duration::from_millis(1) && p99 <= Duration::from_micros(1_250),
            "{p99:?}"
        );
        assert_eq!(lateness.quantile(1.0), Duration::from_millis(5));
        assert_eq!(lateness.max(), Duration::from_millis(5));
        assert_eq!(lateness.quantile(0.0), lateness.quantile(0.001));
        assert_eq!(lateness.buckets().map(|(_, n)| n).sum::<u64>(), 100);
        let mut merged = lateness.clone();
        merged.merge(&lateness);
        assert_eq!(merged.count(), 200);
        assert_eq!(merged.p99(), lateness.p99());
    }
}
