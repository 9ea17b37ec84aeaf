//! The loom shim: every atomic, cell, lock, thread and backoff the crate uses comes
//! from here, so that under `--cfg loom` the model checker sees each of them.
//!
//! | item | normal build | `cfg(loom)` build | what the models therefore do not check |
//! | --- | --- | --- | --- |
//! | atomics, `fence`, `Arc`, `Mutex`, `Condvar` | `std` | `loom` | — |
//! | [`UnsafeCell`] | `core::cell::UnsafeCell` behind loom's `with`/`with_mut` API | `loom::cell::UnsafeCell` | — |
//! | `thread::{spawn, park, current}` | `std::thread` | `loom::thread` | — |
//! | `thread::park_timeout` | `std::thread::park_timeout` | `park` (no real time) | that a timed park returns by itself: models unpark explicitly |
//! | [`Backoff`] | `crossbeam_utils::Backoff` | `loom::thread::yield_now` | the spin/yield schedule |
//! | executor queues | `crossbeam_deque` | a `Mutex<VecDeque>` stand-in | crossbeam-deque's own lock-freedom (it has its own tests) |
//! | core pinning | `core_affinity` | not called | — |
//! | the coarse clock ([`coarse_monotonic`]) | `CLOCK_MONOTONIC_COARSE` on Linux | `None` (the precise clock is read) | nothing: it only spares a precise read |
//! | a shard thread's timer slack and scheduling slice ([`prompt_wake_ups`]) | `prctl(PR_SET_TIMERSLACK, 1)` and `sched_setattr` (a 100 µs slice) on Linux | nothing | nothing: only how late a timed park returns and how soon a woken shard gets its CPU |
//! | the caller's CPU ([`current_cpu`]) | `sched_getcpu` on Linux | `None` (homes picked by id block) | nothing: the CPU only picks a home |
//! | the manual clock's lock (`clock/manual.rs`) | `Mutex::lock` | a spin on loom's `Mutex::try_lock` (loom cannot unpark a thread blocked on a mutex) | nothing of the protocol: the spin is a lock taken |
//! | `thread_local!` (in `handle`, `executor`) | `std`, const-initialised | `loom`'s, one per model thread | — |
//! | entry allocations | the entry pool (`entry/pool/`), `Box` above 256 bytes | `Box` plus a `loom::alloc::Track` in each header | the pool in entries: its cross-thread free (a chunk's `freed` list, a heap's list of such chunks) has its own model (`pool.rs`), driving the real `Heap` and `free` |
//! | `TimerId` prefix counter (`id.rs`) | a `std` static atomic | the same `std` static (loom atomics cannot be statics) | nothing: it only keeps ids unique and guards no memory |

#![allow(
    unreachable_pub,
    reason = "re-exports keep the std/loom names; visibility is crate-wide anyway"
)]

#[cfg(not(loom))]
pub(crate) use std::sync::{
    atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering},
    Arc, Condvar, Mutex, MutexGuard,
};

#[cfg(loom)]
pub(crate) use loom::sync::{
    atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering},
    Arc, Condvar, Mutex, MutexGuard,
};

pub(crate) use crossbeam_utils::CachePadded;

/// Threads: spawn, park and unpark.
pub(crate) mod thread {
    #[cfg(not(loom))]
    pub(crate) use std::thread::{current, park, park_timeout, Builder, JoinHandle, Thread};

    #[cfg(loom)]
    pub(crate) use loom::thread::{current, park, Builder, JoinHandle, Thread};

    /// Under loom there is no real time: a timed park is a plain park, and the models
    /// unpark explicitly.
    #[cfg(loom)]
    pub(crate) fn park_timeout(_timeout: std::time::Duration) {
        park();
    }
}

/// The CPU the calling thread runs on now (`sched_getcpu`, which glibc 2.35 and later
/// answers from the thread's rseq area without a system call), or `None` where it is
/// unknown: other systems, loom (a model has no CPUs) and Miri (no such call). The
/// answer may be stale as soon as it is read (the thread may migrate): callers use it
/// only to pick a home, never for correctness.
pub(crate) fn current_cpu() -> Option<usize> {
    #[cfg(all(target_os = "linux", not(loom), not(miri)))]
    {
        // SAFETY: `sched_getcpu` takes no arguments, touches no memory of ours and
        // has no preconditions; it returns -1 on error.
        let cpu = unsafe { libc::sched_getcpu() };
        usize::try_from(cpu).ok()
    }
    #[cfg(not(all(target_os = "linux", not(loom), not(miri))))]
    {
        None
    }
}

/// The coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`: the same time base as
/// `Instant`'s `CLOCK_MONOTONIC`, updated once per kernel tick, read without the time
/// stamp counter: 7.5 ns here against `Instant::now`'s 28) as a duration since boot,
/// or its resolution (the kernel tick) if `resolution`; `None` where there is none
/// (other systems, loom, Miri). Only `clock::coarse` reads it, to bound "now" cheaply.
pub(crate) fn coarse_monotonic(resolution: bool) -> Option<std::time::Duration> {
    #[cfg(all(target_os = "linux", not(loom), not(miri)))]
    {
        let mut time = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let status = if resolution {
            // SAFETY: `time` is a valid, writable `timespec` for the call's duration;
            // an unknown clock id only makes the call return -1.
            unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut time) }
        } else {
            // SAFETY: as above.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut time) }
        };
        if status != 0 {
            return None;
        }
        Some(std::time::Duration::new(
            u64::try_from(time.tv_sec).ok()?,
            u32::try_from(time.tv_nsec).ok()?,
        ))
    }
    #[cfg(not(all(target_os = "linux", not(loom), not(miri))))]
    {
        let _ = resolution;
        None
    }
}

/// Asks the kernel to run the calling thread (a shard thread) promptly when it wakes:
///
/// - **timer slack 1 ns** (`prctl(PR_SET_TIMERSLACK)`): how late the kernel may fire a
///   timed wait's timer to batch wake-ups, 50 µs by default. A shard thread parks until
///   the next tick boundary with `park_timeout`, so the slack is lateness added to
///   every timer.
/// - **a scheduling slice of [`SHARD_SLICE`]** (`sched_setattr`'s `sched_runtime` for a
///   normal-policy thread: EEVDF's custom slice, Linux 6.12 and later, no privilege
///   needed). A woken thread waits on its core behind a running CPU-bound one until
///   that one's slice (about 3 ms) ends, unless its own slice is shorter: then it
///   preempts at once. Shards pinned to cores met that wait beside unpinned tokio
///   workers (a shard woken, then waiting 3.2 ms while the other core idled); with the
///   short slice a 1 ms timed wait beside a busy loop on the same core woke at most
///   0.1 ms late, against 3.6–3.9 ms (2,000 waits, this 2-core VM). Fairness is
///   unchanged: the slice sets how soon the thread runs, not how much CPU it gets.
///
/// A no-op elsewhere, under loom and Miri; each failure is ignored (the defaults stay:
/// an older kernel rejects or ignores the slice).
pub(crate) fn prompt_wake_ups() {
    #[cfg(all(target_os = "linux", not(loom), not(miri)))]
    {
        // SAFETY: `PR_SET_TIMERSLACK` takes one integer argument (the slack in ns)
        // and touches only the calling thread's scheduling attributes; the unused
        // arguments are ignored by the kernel for this option.
        let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_u64, 0_u64, 0_u64, 0_u64) };
        // Only a normal-policy thread (SCHED_OTHER: 0) gets a fair-class slice; keep
        // whatever else the application chose.
        if let Some(mut attr) = SchedAttr::of_this_thread().filter(|a| a.sched_policy == 0) {
            attr.size = SchedAttr::SIZE;
            attr.sched_flags = 0;
            attr.sched_runtime = SHARD_SLICE.as_nanos() as u64;
            // SAFETY: `sched_setattr(0, attr, 0)` reads `attr.size` bytes of `attr`
            // (filled by the kernel above, its slice changed) and changes only the
            // calling thread's scheduling attributes; it keeps the policy and nice
            // value it read.
            let _ =
                unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
        }
    }
}

/// The scheduling slice a shard thread asks for ([`prompt_wake_ups`]): the shortest
/// the kernel takes (0.1 ms).
#[cfg(all(target_os = "linux", not(loom), not(miri)))]
const SHARD_SLICE: std::time::Duration = std::time::Duration::from_micros(100);

/// The kernel's `struct sched_attr` (`include/uapi/linux/sched/types.h`, its first
/// version with the utilisation clamps: 56 bytes), which the `libc` crate does not
/// define.
#[cfg(all(target_os = "linux", not(loom), not(miri)))]
#[repr(C)]
#[derive(Debug, Default)]
struct SchedAttr {
    /// This structure's size, bytes.
    size: u32,
    /// `SCHED_OTHER` (0), `SCHED_FIFO`, …
    sched_policy: u32,
    /// `SCHED_FLAG_*`.
    sched_flags: u64,
    /// The nice value (normal policies).
    sched_nice: i32,
    /// The static priority (real-time policies).
    sched_priority: u32,
    /// For a normal policy (Linux 6.12+): the requested slice, ns.
    sched_runtime: u64,
    /// `SCHED_DEADLINE` only.
    sched_deadline: u64,
    /// `SCHED_DEADLINE` only.
    sched_period: u64,
    /// Utilisation clamp, low.
    sched_util_min: u32,
    /// Utilisation clamp, high.
    sched_util_max: u32,
}

#[cfg(all(target_os = "linux", not(loom), not(miri)))]
impl SchedAttr {
    /// The size the kernel is told, bytes.
    const SIZE: u32 = std::mem::size_of::<SchedAttr>() as u32;

    /// The calling thread's scheduling attributes, as the kernel reports them
    /// (`sched_getattr`), or `None` if it refuses.
    fn of_this_thread() -> Option<SchedAttr> {
        let mut attr = SchedAttr::default();
        // SAFETY: `sched_getattr(0, attr, size, 0)` writes at most `size` bytes into
        // `attr`, which is that large and lives across the call; pid 0 is the calling
        // thread.
        let read = unsafe {
            libc::syscall(
                libc::SYS_sched_getattr,
                0,
                &mut attr as *mut SchedAttr,
                SchedAttr::SIZE,
                0,
            )
        };
        (read == 0).then_some(attr)
    }
}

/// A spin hint for tight retry loops.
pub(crate) fn spin_loop() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Exponential backoff for retry loops.
#[cfg(not(loom))]
pub(crate) use crossbeam_utils::Backoff;

/// Under loom, backing off must yield to the model's scheduler, or a spinning thread
/// would starve the thread it waits for.
#[cfg(loom)]
#[derive(Debug, Default)]
pub(crate) struct Backoff;

#[cfg(loom)]
impl Backoff {
    /// A fresh backoff.
    pub(crate) fn new() -> Self {
        Backoff
    }
    /// Yields to loom.
    pub(crate) fn spin(&self) {
        loom::thread::yield_now();
    }
    /// Yields to loom.
    pub(crate) fn snooze(&self) {
        loom::thread::yield_now();
    }
    /// Under loom a backoff is complete at once: waiting is the model's business.
    pub(crate) fn is_completed(&self) -> bool {
        true
    }
    /// Nothing to reset.
    pub(crate) fn reset(&self) {}
}

/// `UnsafeCell` with loom's closure API in both builds, so that every access to the
/// cell's contents is visible to loom's race detector.
#[cfg(not(loom))]
#[derive(Debug, Default)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// A cell holding `value`.
    pub(crate) const fn new(value: T) -> Self {
        UnsafeCell(core::cell::UnsafeCell::new(value))
    }
    /// Calls `f` with a shared raw pointer to the contents.
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }
    /// Calls `f` with an exclusive raw pointer to the contents.
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// The executor's queues.
#[cfg(not(loom))]
pub(crate) use crossbeam_deque::{Injector, Steal, Stealer, Worker};

#[cfg(loom)]
pub(crate) use loom_deque::{Injector, Steal, Stealer, Worker};

/// A loom-visible stand-in for crossbeam-deque: every queue is a `Mutex<VecDeque>`.
/// It keeps crossbeam's API and FIFO/LIFO shape, not its lock-freedom.
#[cfg(loom)]
mod loom_deque {
    use super::{Arc, Mutex};
    use std::collections::VecDeque;

    /// The outcome of a steal.
    #[derive(Debug)]
    pub(crate) enum Steal<T> {
        Empty,
        Success(T),
        Retry,
    }

    impl<T> Steal<T> {
        pub(crate) fn is_retry(&self) -> bool {
            matches!(self, Steal::Retry)
        }
        pub(crate) fn success(self) -> Option<T> {
            match self {
                Steal::Success(task) => Some(task),
                _ => None,
            }
        }
        pub(crate) fn or_else(self, f: impl FnOnce() -> Steal<T>) -> Steal<T> {
            match self {
                Steal::Success(task) => Steal::Success(task),
                _ => f(),
            }
        }
    }

    impl<T> FromIterator<Steal<T>> for Steal<T> {
        fn from_iter<I: IntoIterator<Item = Steal<T>>>(iter: I) -> Self {
            for steal in iter {
                if let Steal::Success(task) = steal {
                    return Steal::Success(task);
                }
            }
            Steal::Empty
        }
    }

    /// The global queue.
    #[derive(Debug)]
    pub(crate) struct Injector<T>(Mutex<VecDeque<T>>);

    impl<T> Injector<T> {
        pub(crate) fn new() -> Self {
            Injector(Mutex::new(VecDeque::new()))
        }
        pub(crate) fn push(&self, task: T) {
            self.0.lock().unwrap().push_back(task);
        }
        pub(crate) fn is_empty(&self) -> bool {
            self.0.lock().unwrap().is_empty()
        }
        pub(crate) fn len(&self) -> usize {
            self.0.lock().unwrap().len()
        }
        pub(crate) fn steal(&self) -> Steal<T> {
            self.0
                .lock()
                .unwrap()
                .pop_front()
                .map_or(Steal::Empty, Steal::Success)
        }
        pub(crate) fn steal_batch_and_pop(&self, _dest: &Worker<T>) -> Steal<T> {
            self.0
                .lock()
                .unwrap()
                .pop_front()
                .map_or(Steal::Empty, Steal::Success)
        }
    }

    /// A worker's own queue.
    #[derive(Debug)]
    pub(crate) struct Worker<T>(Arc<Mutex<VecDeque<T>>>);

    impl<T> Worker<T> {
        pub(crate) fn new_fifo() -> Self {
            Worker(Arc::new(Mutex::new(VecDeque::new())))
        }
        pub(crate) fn pop(&self) -> Option<T> {
            self.0.lock().unwrap().pop_front()
        }
        pub(crate) fn stealer(&self) -> Stealer<T> {
            Stealer(self.0.clone())
        }
    }

    /// Another worker's view of a queue.
    #[derive(Debug)]
    pub(crate) struct Stealer<T>(Arc<Mutex<VecDeque<T>>>);

    impl<T> Stealer<T> {
        pub(crate) fn is_empty(&self) -> bool {
            self.0.lock().unwrap().is_empty()
        }
        pub(crate) fn len(&self) -> usize {
            self.0.lock().unwrap().len()
        }
        pub(crate) fn steal(&self) -> Steal<T> {
            self.0
                .lock()
                .unwrap()
                .pop_back()
                .map_or(Steal::Empty, Steal::Success)
        }
    }
}

/// A thread handle set once after the thread is spawned, then used by any thread to
/// unpark it.
#[derive(Debug, Default)]
pub(crate) struct ThreadSlot {
    /// The thread, once set.
    #[cfg(not(loom))]
    thread: std::sync::OnceLock<thread::Thread>,
    /// The thread, once set (loom has no `OnceLock`).
    #[cfg(loom)]
    thread: Mutex<Option<thread::Thread>>,
}

impl ThreadSlot {
    /// Records the thread; later calls are ignored.
    pub(crate) fn set(&self, handle: thread::Thread) {
        #[cfg(not(loom))]
        let _ = self.thread.set(handle);
        #[cfg(loom)]
        {
            let mut slot = self.thread.lock().unwrap();
            if slot.is_none() {
                *slot = Some(handle);
            }
        }
    }

    /// An owned handle to the thread, if set: it stays valid after this slot (and
    /// whatever holds it) is gone, so it can be unparked after the last access to the
    /// slot's owner.
    pub(crate) fn get(&self) -> Option<thread::Thread> {
        #[cfg(not(loom))]
        return self.thread.get().cloned();
        #[cfg(loom)]
        return self.thread.lock().unwrap().clone();
    }

    /// Unparks the thread, if set. An unpark before the park makes the park return.
    pub(crate) fn unpark(&self) {
        #[cfg(not(loom))]
        if let Some(handle) = self.thread.get() {
            handle.unpark();
        }
        #[cfg(loom)]
        if let Some(handle) = self.thread.lock().unwrap().as_ref() {
            handle.unpark();
        }
    }
}

/// A lifetime canary for the loom models: the owner of some shared state [`retire`]s it
/// when it is done with the state (a shard at the end of its shutdown), and every other
/// thread [`touch`]es it wherever it reads that state. Under loom these are a write and
/// reads of one `UnsafeCell`, so a touch that does not happen-before the retirement (a
/// sender still reading a shard that may be freed) is reported as a data race. In the
/// normal build both are no-ops on a zero-sized value.
///
/// [`retire`]: Canary::retire
/// [`touch`]: Canary::touch
#[derive(Debug)]
pub(crate) struct Canary {
    /// Written once by `retire`, read by `touch` (loom only).
    #[cfg(loom)]
    retired: loom::cell::UnsafeCell<bool>,
}

// SAFETY: the cell's contents are never read or written: `touch` and `retire` only
// record an access for loom's race detector, and an unordered pair of them is exactly
// what the canary exists to report (as a failing model, not as undefined behaviour).
#[cfg(loom)]
unsafe impl Sync for Canary {}

impl Canary {
    /// A live canary.
    pub(crate) fn new() -> Self {
        Canary {
            #[cfg(loom)]
            retired: loom::cell::UnsafeCell::new(false),
        }
    }

    /// Records a read of the guarded state.
    #[inline]
    pub(crate) fn touch(&self) {
        #[cfg(loom)]
        self.retired.with(|_| ());
    }

    /// Records that the owner is done with the guarded state.
    #[inline]
    pub(crate) fn retire(&self) {
        #[cfg(loom)]
        self.retired.with_mut(|_| ());
    }
}

#[cfg(all(test, target_os = "linux", not(loom), not(miri)))]
mod tests {
    use super::{prompt_wake_ups, SchedAttr, SHARD_SLICE};

    /// The calling thread's scheduling attributes, as the kernel reports them.
    fn sched_attr() -> SchedAttr {
        SchedAttr::of_this_thread().expect("sched_getattr")
    }

    /// A shard thread's slice is the short one where the kernel has custom slices
    /// (6.12+: it then reports the slice asked for), and its policy and nice value are
    /// what they were; elsewhere the call changes nothing.
    #[test]
    fn a_shard_thread_asks_for_a_short_slice_and_keeps_its_policy_and_nice_value() {
        std::thread::spawn(|| {
            let before = sched_attr();
            prompt_wake_ups();
            let after = sched_attr();
            assert_eq!(after.sched_policy, before.sched_policy);
            assert_eq!(after.sched_nice, before.sched_nice);
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
            let mut version = release.split(|c: char| !c.is_ascii_digit());
            let major: u32 = version.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            let minor: u32 = version.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            if (major, minor) >= (6, 12) && before.sched_policy == 0 {
                assert_eq!(
                    after.sched_runtime,
                    SHARD_SLICE.as_nanos() as u64,
                    "{release}"
                );
            }
        })
        .join()
        .expect("the thread");
    }
}
