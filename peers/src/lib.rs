//! The timers sharded-timer is compared with, side by side in one process: tokio's
//! timer, a `Mutex<BinaryHeap>` timer thread (java.util.Timer), a `Mutex`-guarded
//! single hashed wheel with rounds (Netty's HashedWheelTimer), and sharded-timer
//! itself, pinned and unpinned. Every comparing bench uses these, through [`Peer`];
//! and [`alloc::CountingAllocator`], the counting global allocator that the driver's
//! and the benches' "bytes per pending timer" read.

pub mod alloc;
mod heap;
mod netty;
mod once;
mod tokio_timer;

use std::sync::Arc;
use std::time::Duration;

use sharded_timer::{Callbacks, Routing, ShardedTimer, TimerHandle};

pub use heap::HeapTimer;
pub use netty::NettyTimer;
pub use tokio_timer::{Form, TokioHandle, TokioTimer};

/// Which peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// sharded-timer at its defaults (shards pinned to cores).
    Sharded,
    /// sharded-timer with `pin_cores(false)`.
    ShardedUnpinned,
    /// sharded-timer with `routing(Routing::ById)`: each timer to the shard its id's
    /// hash picks, instead of the calling thread's core's.
    ShardedById,
    /// sharded-timer with `Callbacks::inline()`: callbacks on the shard threads.
    ShardedInline,
    /// sharded-timer with `Callbacks::spawn`, each callback spawned as its own job on
    /// a rayon pool (one thread per core): what a user's own spawner costs.
    /// (`Callbacks::rayon` batches; the driver's `--callbacks rayon` measures it.)
    ShardedSpawn,
    /// tokio's timer: a `tokio::time::sleep` per timer.
    Tokio,
    /// tokio's timer: a `tokio::time::timeout` around a request per timer.
    TokioTimeout,
    /// `Mutex<BinaryHeap>` with a timer thread.
    Heap,
    /// Netty-style single wheel with rounds.
    NettyStyle,
}

impl Kind {
    /// Every peer, sharded-timer first.
    pub const ALL: [Kind; 5] = [
        Kind::Sharded,
        Kind::ShardedUnpinned,
        Kind::Tokio,
        Kind::Heap,
        Kind::NettyStyle,
    ];

    /// Short name for bench ids and tables.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Sharded => "sharded-timer",
            Kind::ShardedUnpinned => "sharded-unpinned",
            Kind::ShardedById => "sharded-by-id",
            Kind::ShardedInline => "sharded-inline",
            Kind::ShardedSpawn => "sharded-spawn",
            Kind::Tokio => "tokio",
            Kind::TokioTimeout => "tokio-timeout",
            Kind::Heap => "heap",
            Kind::NettyStyle => "netty-style",
        }
    }

    /// Bytes of the handle a caller keeps per timer: the peer's own handle type.
    pub fn handle_size(self) -> usize {
        match self {
            Kind::Sharded
            | Kind::ShardedUnpinned
            | Kind::ShardedById
            | Kind::ShardedInline
            | Kind::ShardedSpawn => std::mem::size_of::<TimerHandle>(),
            Kind::Tokio | Kind::TokioTimeout => std::mem::size_of::<TokioHandle>(),
            Kind::Heap => std::mem::size_of::<Arc<once::OnceTask>>(),
            Kind::NettyStyle => std::mem::size_of::<Arc<netty::Timeout>>(),
        }
    }

    /// A fresh instance.
    ///
    /// # Panics
    ///
    /// If the peer's threads cannot be started.
    pub fn start(self) -> Peer {
        match self {
            Kind::Sharded => Peer::Sharded(ShardedTimer::new()),
            Kind::ShardedUnpinned => Peer::Sharded(
                ShardedTimer::builder()
                    .pin_cores(false)
                    .build()
                    .expect("sharded-timer starts"),
            ),
            Kind::ShardedById => Peer::Sharded(
                ShardedTimer::builder()
                    .routing(Routing::ById)
                    .build()
                    .expect("sharded-timer starts"),
            ),
            Kind::ShardedInline => Peer::Sharded(
                ShardedTimer::builder()
                    .callbacks(Callbacks::inline())
                    .build()
                    .expect("sharded-timer starts"),
            ),
            Kind::ShardedSpawn => {
                let pool = Arc::new(
                    rayon::ThreadPoolBuilder::new()
                        .build()
                        .expect("a rayon pool starts"),
                );
                Peer::Sharded(
                    ShardedTimer::builder()
                        .callbacks(Callbacks::spawn(move |callback| {
                            pool.spawn(move || callback.run());
                        }))
                        .build()
                        .expect("sharded-timer starts"),
                )
            }
            Kind::Tokio => Peer::Tokio(TokioTimer::new(Form::Sleep)),
            Kind::TokioTimeout => Peer::Tokio(TokioTimer::new(Form::Timeout)),
            Kind::Heap => Peer::Heap(HeapTimer::new()),
            Kind::NettyStyle => Peer::NettyStyle(NettyTimer::new()),
        }
    }
}

/// A running peer.
#[derive(Debug)]
pub enum Peer {
    /// sharded-timer (any of its configurations).
    Sharded(ShardedTimer),
    /// tokio's timer, through a runtime of its own.
    Tokio(TokioTimer),
    /// A `Mutex<BinaryHeap>` timer thread.
    Heap(HeapTimer),
    /// The Netty-style wheel.
    NettyStyle(NettyTimer),
}

/// A scheduled timer of some peer.
pub enum Handle {
    /// sharded-timer's handle.
    Sharded(TimerHandle),
    /// tokio's future, dropped to cancel.
    Tokio(TokioHandle),
    /// The heap timer's task cell.
    Heap(Arc<once::OnceTask>),
    /// The Netty-style wheel's timeout.
    NettyStyle(Arc<netty::Timeout>),
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Handle::Sharded(handle) => f.debug_tuple("Sharded").field(handle).finish(),
            Handle::Tokio(_) => f.write_str("Tokio(..)"),
            Handle::Heap(task) => f.debug_tuple("Heap").field(task).finish(),
            Handle::NettyStyle(timeout) => f.debug_tuple("NettyStyle").field(timeout).finish(),
        }
    }
}

impl Peer {
    /// Runs `f` once after `delay`.
    ///
    /// # Panics
    ///
    /// If sharded-timer refuses the timer (it has shut down: never while a peer runs).
    pub fn schedule(&self, delay: Duration, f: impl FnOnce() + Send + 'static) -> Handle {
        match self {
            Peer::Sharded(timer) => Handle::Sharded(timer.schedule(delay, f).expect("accepted")),
            Peer::Tokio(timer) => Handle::Tokio(timer.schedule(delay, f)),
            Peer::Heap(timer) => Handle::Heap(timer.schedule(delay, f)),
            Peer::NettyStyle(timer) => Handle::NettyStyle(timer.schedule(delay, f)),
        }
    }

    /// Waits until every one of the `scheduled` timers made on this peer so far is in
    /// its wheel (or heap), not in a queue that its own thread drains: sharded-timer's
    /// insert rings empty, the netty-style worker's incoming queue taken in. tokio's
    /// sleeps (registered by their first poll, inside `schedule`) and the heap (filed
    /// under its lock) are in at once. Returns false if `limit` passed first.
    pub fn wait_taken_in(&self, scheduled: u64, limit: Duration) -> bool {
        let start = std::time::Instant::now();
        loop {
            let done = match self {
                Peer::Sharded(timer) => timer.stats().in_rings == 0,
                Peer::NettyStyle(timer) => timer.taken_in() >= scheduled,
                Peer::Tokio(_) | Peer::Heap(_) => true,
            };
            if done {
                return true;
            }
            if start.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Cancels; true iff it was still pending (tokio: iff its future was still held).
    pub fn cancel(&self, handle: &Handle) -> bool {
        match (self, handle) {
            (Peer::Sharded(_), Handle::Sharded(h)) => h.cancel(),
            (Peer::Tokio(t), Handle::Tokio(h)) => t.cancel(h),
            (Peer::Heap(t), Handle::Heap(h)) => t.cancel(h),
            (Peer::NettyStyle(t), Handle::NettyStyle(h)) => t.cancel(h),
            _ => unreachable!("a handle of another peer"),
        }
    }
}

/// Schedules `count` no-op timers with delays spread over 1 s..60 s from
/// `producers` threads, so they stay pending through a bench; returns their handles.
///
/// # Panics
///
/// If a producer thread panics.
pub fn fill(peer: &Peer, count: usize, producers: usize) -> Vec<Handle> {
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..producers)
            .map(|p| {
                scope.spawn(move || {
                    pin_producer(p);
                    let per = count.div_ceil(producers);
                    let range = (p * per).min(count)..((p + 1) * per).min(count);
                    range
                        .map(|i| peer.schedule(spread_delay(i as u64), || {}))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("filler"))
            .collect()
    })
}

/// Pins the calling producer thread to core `index % cores`, for every peer alike: a
/// thread-per-core server's layout, and stable run to run (unpinned producers that
/// the OS happens to place on the same core change every peer's figures).
pub fn pin_producer(index: usize) {
    if let Some(cores) = core_affinity::get_core_ids() {
        if !cores.is_empty() {
            let _ = core_affinity::set_for_current(cores[index % cores.len()]);
        }
    }
}

/// A delay in 1 s..60 s, spread by index.
pub fn spread_delay(i: u64) -> Duration {
    Duration::from_millis(1_000 + i.wrapping_mul(0x9e37_79b9_7f4a_7c15) % 59_000)
}

/// Operations per thread per sample at the least: enough that thread wake-up and the
/// barriers are noise, whatever iteration count criterion asks for.
const MIN_PER_THREAD: u64 = 10_000;

/// Times `iters` calls of `op` spread over `threads` threads running at once: runs at
/// least [`MIN_PER_THREAD`] per thread and scales the wall time to `iters` calls.
pub fn on_threads(threads: usize, iters: u64, op: impl Fn(u64) + Sync) -> Duration {
    let start = std::cell::Cell::new(None);
    measured_on_threads(threads, iters, op, || match start.take() {
        None => {
            start.set(Some(std::time::Instant::now()));
            Duration::ZERO
        }
        Some(start) => start.elapsed(),
    })
}

/// As [`on_threads`], but the process's CPU time (every thread: the producers, and
/// the shards and workers that take their timers in) over the same window, scaled to
/// `iters` calls: what the benches' `ProcessCpu` measures.
pub fn cpu_on_threads(threads: usize, iters: u64, op: impl Fn(u64) + Sync) -> Duration {
    measured_on_threads(threads, iters, op, process_cpu)
}

/// The process's CPU time so far, every thread (`CLOCK_PROCESS_CPUTIME_ID`).
pub fn process_cpu() -> Duration {
    cpu_time::ProcessTime::try_now().map_or(Duration::ZERO, |time| time.as_duration())
}

/// Runs `op` as [`on_threads`] says; `read` is called once when every thread is ready
/// and once when every thread is done, and the difference is scaled to `iters` calls.
fn measured_on_threads(
    threads: usize,
    iters: u64,
    op: impl Fn(u64) + Sync,
    mut read: impl FnMut() -> Duration,
) -> Duration {
    let per_thread = iters.div_ceil(threads as u64).max(MIN_PER_THREAD);
    let barrier = std::sync::Barrier::new(threads + 1);
    let measured = std::thread::scope(|scope| {
        for t in 0..threads {
            let (barrier, op) = (&barrier, &op);
            scope.spawn(move || {
                pin_producer(t);
                barrier.wait();
                for i in 0..per_thread {
                    op((t as u64) << 40 | i);
                }
                barrier.wait();
            });
        }
        barrier.wait();
        let start = read();
        barrier.wait();
        read().saturating_sub(start)
    });
    measured.mul_f64(iters as f64 / (per_thread * threads as u64) as f64)
}
