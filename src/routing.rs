//! Which shard a new timer goes to: [`Routing`], a policy of the service
//! ([`Builder::routing`](crate::Builder::routing)).
//!
//! Whichever route a timer takes, its handle names its shard, so `cancel` and `reset`
//! go straight there; and whichever shard it lands on, the caller files it into that
//! shard's wheel itself when the shard's token is free (`shard/direct.rs`), else
//! through the shard's ring.

#![forbid(unsafe_code)]

use crate::id::TimerId;
use crate::sync::current_cpu;

/// Which shard a new timer scheduled through [`ShardedTimer::schedule`],
/// [`schedule_at`](crate::ShardedTimer::schedule_at),
/// [`schedule_repeating`](crate::ShardedTimer::schedule_repeating) or
/// [`schedule_with_fixed_delay`](crate::ShardedTimer::schedule_with_fixed_delay) goes
/// to.
///
/// Sleeps and timeouts ([`ShardedTimer::sleep`], the `time` namespace) go to the
/// shard of the core they are made on under either policy: a sleep holds its core's
/// home, which keeps the service alive for it (docs/architecture.md, homes).
///
/// The default, [`ByCore`](Routing::ByCore), was chosen by `--compare`'s users'
/// conditions (a fresh process per run, unpinned producers, boxed callbacks, quiet
/// and beside busy loops; `docs/benchmarks.md`, the `sharded-by-id` rows). On 2
/// cores, in its 12 columns (schedule and schedule+cancel at 1, 2 and 8 producers,
/// quiet and busy), ByCore against ById: ahead in 7 (1.02–2.62× the rate at 0.36–1.00×
/// the CPU per timer), level in 5 (three of the four 1-producer columns among them),
/// behind in none. An earlier run, before ById's hash was fixed to spread over any
/// shard count: ahead in 8, level in 3, behind in 1 (1 producer, busy: 0.86×).
/// Prefer `ById` where load must spread evenly over the shards although a few
/// threads, kept on one core, make most timers (each shard's load is in
/// [`Stats::shards`](crate::Stats::shards)).
///
/// [`ShardedTimer::schedule`]: crate::ShardedTimer::schedule
/// [`ShardedTimer::sleep`]: crate::ShardedTimer::sleep
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Routing {
    /// By the hash of the timer's [`TimerId`] (Fibonacci hashing of the id without its
    /// low 6 bits, scaled to the shard count: each run of 64 consecutive timers of one
    /// thread goes to one shard, and any 2 × `shards` successive runs reach every
    /// shard, whatever their count): load spreads evenly over the shards whichever
    /// threads schedule, and however the OS moves them.
    ById,
    /// To the shard of the core the calling thread runs on (`sched_getcpu`; shard `k`
    /// is pinned to core `k`), as Linux, Go and Erlang/OTP insert timers on the local
    /// CPU: the entry and that shard's wheel stay in the caller's core's cache, and the
    /// shard's token is contended only by its own turns. Where the core is unknown
    /// (other systems, Miri), by id as [`ById`](Routing::ById). A thread that the OS
    /// keeps on one core sends all its timers to one shard.
    #[default]
    ByCore,
}

impl Routing {
    /// The index, among `shards` (at least one), of the shard timer `id` goes to.
    pub(crate) fn shard(self, shards: usize, id: TimerId) -> usize {
        match self {
            Routing::ById => id.shard_index(shards),
            Routing::ByCore => match current_cpu() {
                Some(cpu) => cpu % shards,
                None => id.shard_index(shards),
            },
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::Routing;
    use crate::id::TimerId;

    #[test]
    fn by_id_spreads_one_thread_s_timers_over_every_shard() {
        let mut counts = [0usize; 4];
        for _ in 0..64 * 400 {
            counts[Routing::ById.shard(4, TimerId::next())] += 1;
        }
        let total: usize = counts.iter().sum();
        for (shard, &count) in counts.iter().enumerate() {
            assert!(
                count * 5 > total && count * 3 < total,
                "shard {shard} got {count} of {total}: {counts:?}"
            );
        }
    }

    #[test]
    fn both_routes_stay_within_the_shards() {
        for shards in 1..9 {
            for _ in 0..200 {
                let id = TimerId::next();
                assert!(Routing::ById.shard(shards, id) < shards);
                assert!(Routing::ByCore.shard(shards, id) < shards);
            }
        }
    }
}
