//! The work-stealing pool that runs callbacks by default ([`Callbacks::pool`]), so
//! that a slow callback cannot delay the clock: with it, no callback runs on a shard
//! thread. (With `Callbacks::inline` or a spawner that runs callbacks in place they
//! do, by the user's choice; see `src/shard/shard_loop.rs`.)
//!
//! [`Callbacks::pool`]: crate::Callbacks::pool
//!
//! # Algorithm
//!
//! crossbeam-deque's work stealing (Chase–Lev deques per worker plus a global
//! injector): a shard pushes a *batch* of fired tasks to the injector; an idle worker
//! takes a batch from the injector (moving a few more to its own deque), or steals from
//! another worker's deque. Each task runs under `catch_unwind`; a panic is counted and
//! the worker carries on.
//!
//! # Ground rules
//!
//! - Sleeping: a worker with nothing to do registers in `sleepers` under `sleep_lock`,
//!   re-checks the queues, and waits on `wake`. A submitter pushes, then reads
//!   `sleepers`; if anyone sleeps it takes `sleep_lock` and notifies. A SeqCst fence on
//!   each side between the write and the read makes sure one of them sees the other
//!   (see `submit` and `wait_for_work`), so no batch waits while a worker sleeps.
//! - Stopping: once `stopping` is set and the queues are empty, workers exit. Whoever
//!   stops the pool first stops every submitter (the shards), so nothing is pushed
//!   after the last worker looked.
//! - A worker keeps the batch it is running in a thread-local slot (`CURRENT_BATCH`),
//!   so that a callback that stops the service from this very worker
//!   ([`Executor::run_queued_here`]) can run the rest of the batch, and whatever is
//!   still queued, before its shutdown returns: "handed to the executor" means "runs
//!   before shutdown returns", whichever thread calls it.
//! - Panics: a task's panic is caught and counted; its payload is dropped under
//!   `catch_unwind` too, so a payload whose own drop panics cannot unwind out of the
//!   worker (see `run_caught`).

#![forbid(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use crate::sync::{
    fence, thread, Arc, AtomicBool, AtomicU64, AtomicUsize, Backoff, CachePadded, Condvar,
    Injector, Mutex, Ordering, Steal, Stealer, Worker,
};

/// Bytes of a thread name that Linux keeps (`TASK_COMM_LEN`, 16, less the NUL).
const THREAD_NAME_BYTES: usize = 15;

/// The name of thread `index` of a service's `role` (`s` for shards, `w` for executor
/// workers): `{prefix}-{role}{index}`, the prefix cut at a character boundary so that
/// the whole name fits in [`THREAD_NAME_BYTES`].
pub(crate) fn thread_name(prefix: &str, role: char, index: usize) -> String {
    let suffix = format!("-{role}{index}");
    let mut end = prefix
        .len()
        .min(THREAD_NAME_BYTES.saturating_sub(suffix.len()));
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", &prefix[..end])
}

/// A started pool: its submit side and its worker threads.
type Started<T> = (Executor<T>, Vec<thread::JoinHandle<()>>);

/// The name of a thread that failed to spawn, and why.
type SpawnFailure = (String, std::io::Error);

/// A unit of work the pool runs.
pub trait Task: Send + 'static {
    /// Runs the task; it may panic.
    fn run(self);

    /// Whether the task must run only after the task that is running its batch has
    /// returned: when a task of the batch stops the pool from inside
    /// ([`Executor::run_queued_here`]), such a task is put back instead of run, and the
    /// worker runs it once that task returns. (A manual clock's batch end, which says
    /// the batch's callbacks have all returned.) Default: `false`.
    fn after_its_batch(&self) -> bool {
        false
    }
}

/// The submit side of the pool; cheap to clone.
pub struct Executor<T> {
    /// State shared with the workers.
    shared: Arc<Shared<T>>,
}

/// State shared by the workers and the submitters.
struct Shared<T> {
    /// Batches submitted by shards, not yet taken by a worker.
    injector: Injector<Vec<T>>,
    /// Every worker's deque, for stealing.
    stealers: Box<[Stealer<Vec<T>>]>,
    /// Workers registered as about to sleep or sleeping. Written (SeqCst RMW) by
    /// workers under `sleep_lock`; read by submitters after their fence.
    sleepers: AtomicUsize,
    /// Guards the re-check-then-wait of a sleeping worker against a notify.
    sleep_lock: Mutex<()>,
    /// Where idle workers wait.
    wake: Condvar,
    /// Set once by `stop`; workers exit when it is set and they find no work.
    stopping: AtomicBool,
    /// Panicked tasks, one counter per worker (written only by that worker, Relaxed;
    /// exact at quiescence).
    panicked: Box<[CachePadded<AtomicU64>]>,
    /// Set once a worker of a pool started on demand ([`Executor::on_demand`]) has
    /// started: written Release under `on_demand`'s lock, read Acquire by `submit`'s
    /// fast path. Set from the outset for a pool started at once.
    started: AtomicBool,
    /// A pool started on demand: the workers' deques until the first batch starts
    /// them, then their join handles until shutdown takes them.
    on_demand: Mutex<OnDemand<T>>,
}

/// The workers of a pool started on demand.
struct OnDemand<T> {
    /// Their deques and the threads' name prefix, until the first batch (`None` once
    /// started, or once the pool stopped first: it then never starts).
    unstarted: Option<(Vec<Worker<Vec<T>>>, String)>,
    /// Their threads, once started, for shutdown to join.
    handles: Vec<thread::JoinHandle<()>>,
}

#[cfg(not(loom))]
std::thread_local! {
    /// Address of the pool whose worker this thread is (0 if none), so that a
    /// shutdown started from a callback does not join its own thread.
    static CURRENT_POOL: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

#[cfg(loom)]
loom::thread_local! {
    /// As above, per model thread.
    static CURRENT_POOL: core::cell::Cell<usize> = core::cell::Cell::new(0);
}

/// The rest of the batch a worker is running: a `std::vec::IntoIter<T>` of its pool's
/// task type, type-erased because a thread-local cannot be generic.
type CurrentBatch = core::cell::RefCell<Option<Box<dyn core::any::Any>>>;

#[cfg(not(loom))]
std::thread_local! {
    /// The rest of the batch this worker is running (ground rules).
    static CURRENT_BATCH: CurrentBatch = const { core::cell::RefCell::new(None) };
}

#[cfg(loom)]
loom::thread_local! {
    /// As above, per model thread.
    static CURRENT_BATCH: CurrentBatch = core::cell::RefCell::new(None);
}

/// How many panics in a row a payload's destructors may raise before the last payload
/// is forgotten (leaked) instead of dropped.
const PAYLOAD_DROPS: usize = 8;

/// Runs `task`, catching a panic; returns whether it panicked. The payload is dropped
/// under `catch_unwind` as well, so a payload whose destructor panics cannot unwind out
/// of the worker: the payload of that second panic (usually a message) is dropped the
/// same way, and only after [`PAYLOAD_DROPS`] panicking destructors in a row is the
/// last payload forgotten.
pub(crate) fn run_caught<T: Task>(task: T) -> bool {
    let Err(mut payload) = catch_unwind(AssertUnwindSafe(|| task.run())) else {
        return false;
    };
    for _ in 0..PAYLOAD_DROPS {
        match catch_unwind(AssertUnwindSafe(move || drop(payload))) {
            Ok(()) => return true,
            Err(again) => payload = again,
        }
    }
    core::mem::forget(payload);
    true
}

/// The next task of the calling worker's current batch, if any.
fn next_of_current_batch<T: Task>() -> Option<T> {
    CURRENT_BATCH.with(|batch| {
        batch
            .borrow_mut()
            .as_mut()
            .and_then(|rest| rest.downcast_mut::<std::vec::IntoIter<T>>())
            .and_then(Iterator::next)
    })
}

impl<T: Task> Executor<T> {
    /// Starts `threads` workers named `{name}-w{k}` (cut to 15 bytes).
    ///
    /// # Errors
    ///
    /// The name of the thread that failed to spawn and the OS error; workers started
    /// before it are stopped and joined first.
    pub fn start(threads: usize, name: &str) -> Result<Started<T>, SpawnFailure> {
        let (executor, workers) = Executor::unstarted(threads, true);
        let mut handles = Vec::with_capacity(threads);
        for (index, local) in workers.into_iter().enumerate() {
            match executor.spawn_worker(name, index, local) {
                Ok(handle) => handles.push(handle),
                Err(failure) => {
                    executor.stop();
                    for handle in handles {
                        let _ = handle.join();
                    }
                    return Err(failure);
                }
            }
        }
        Ok((executor, handles))
    }

    /// A pool of `threads` workers named `{name}-w{k}` that start with the first
    /// batch submitted: a service that never hands a callback over starts no worker.
    /// [`take_started`](Self::take_started) gives their threads to join. A worker
    /// that cannot start is left out (the others share its work); if none can, the
    /// next submit tries again.
    pub fn on_demand(threads: usize, name: &str) -> Executor<T> {
        let (executor, workers) = Executor::unstarted(threads, false);
        executor
            .shared
            .on_demand
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unstarted = Some((workers, name.to_owned()));
        executor
    }

    /// A pool of `threads` workers' deques, none started; `started` as the field says.
    fn unstarted(threads: usize, started: bool) -> (Executor<T>, Vec<Worker<Vec<T>>>) {
        let workers: Vec<Worker<Vec<T>>> = (0..threads).map(|_| Worker::new_fifo()).collect();
        let shared = Arc::new(Shared {
            injector: Injector::new(),
            stealers: workers.iter().map(Worker::stealer).collect(),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            stopping: AtomicBool::new(false),
            panicked: (0..threads)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            started: AtomicBool::new(started),
            on_demand: Mutex::new(OnDemand {
                unstarted: None,
                handles: Vec::new(),
            }),
        });
        (Executor { shared }, workers)
    }

    /// Spawns worker `index` on its deque `local`.
    fn spawn_worker(
        &self,
        name: &str,
        index: usize,
        local: Worker<Vec<T>>,
    ) -> Result<thread::JoinHandle<()>, SpawnFailure> {
        let shared = self.shared.clone();
        let thread_name = thread_name(name, 'w', index);
        thread::Builder::new()
            .name(thread_name.clone())
            .spawn(move || worker_loop(&shared, index, &local))
            .map_err(|error| (thread_name, error))
    }

    /// Starts the workers of a pool started on demand, once. If none can start, the
    /// deques are put back for the next submit to try again (what is queued waits,
    /// and a shutdown runs it: [`run_if_never_started`](Self::run_if_never_started));
    /// a worker that cannot start while others did is left out (its deque stays
    /// empty: only its own thread pushes onto it).
    fn start_on_demand(&self) {
        let mut on_demand = self
            .shared
            .on_demand
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let Some((workers, name)) = on_demand.unstarted.take() else {
            return; // started by another submitter, or stopped
        };
        for (index, local) in workers.into_iter().enumerate() {
            if let Ok(handle) = self.spawn_worker(&name, index, local) {
                on_demand.handles.push(handle);
            }
        }
        if on_demand.handles.is_empty() {
            // None started: try again at the next submit with fresh deques (the
            // failed spawns consumed theirs; they were empty).
            let threads = self.shared.stealers.len();
            on_demand.unstarted = Some(((0..threads).map(|_| Worker::new_fifo()).collect(), name));
            return;
        }
        // ORDERING: Release pairs with `submit`'s Acquire load (only a fast path: the
        // lock above decides who starts the workers).
        self.shared.started.store(true, Ordering::Release);
    }

    /// For shutdown, after [`stop`](Self::stop): if this pool started on demand and no
    /// worker ever started (none could), runs what was queued on the calling thread,
    /// so that a callback handed over still runs before shutdown returns.
    pub fn run_if_never_started(&self) {
        let never = self
            .shared
            .on_demand
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .handles
            .is_empty();
        // ORDERING: Acquire pairs with the Release store in `start_on_demand`.
        if never && !self.shared.started.load(Ordering::Acquire) {
            self.run_queued_by_submitter();
        }
    }

    /// Runs every queued batch on the calling thread (a pool with no worker).
    fn run_queued_by_submitter(&self) {
        let mut ran_panicked = 0;
        loop {
            let stolen = core::iter::repeat_with(|| self.shared.injector.steal())
                .find(|steal| !steal.is_retry())
                .and_then(Steal::success);
            let Some(batch) = stolen else { break };
            for task in batch {
                ran_panicked += u64::from(run_caught(task));
            }
        }
        if let Some(counter) = self.shared.panicked.first() {
            // ORDERING: Relaxed: a statistic.
            counter.fetch_add(ran_panicked, Ordering::Relaxed);
        }
    }

    /// Whether more batches wait to be run than the workers can start at once, twice
    /// over: a shard handing out a burst then lets the pool catch up before it claims
    /// more, so a timer that comes due meanwhile is not queued behind the whole burst
    /// (issue 22). The count is a snapshot, exact only at quiescence.
    pub fn is_backed_up(&self) -> bool {
        let waiting = self.shared.injector.len()
            + self.shared.stealers.iter().map(Stealer::len).sum::<usize>();
        waiting > 2 * self.shared.stealers.len()
    }

    /// Hands a batch of tasks to the pool. Never blocks on running tasks.
    pub fn submit(&self, batch: Vec<T>) {
        if batch.is_empty() {
            return;
        }
        self.shared.injector.push(batch);
        // ORDERING: Acquire pairs with the Release store in `start_on_demand`; a
        // stale `false` only takes the lock there, which decides.
        if !self.shared.started.load(Ordering::Acquire) {
            self.start_on_demand();
        }
        // ORDERING: SeqCst fence between our push and our read of `sleepers`, paired
        // with the fence in `wait_for_work` between a worker's increment of `sleepers`
        // and its re-check of the queues: of the two fences, whichever is first in the
        // total order makes the other side's read see this side's write.
        fence(Ordering::SeqCst);
        // ORDERING: Relaxed: ordered by the fence above.
        if self.shared.sleepers.load(Ordering::Relaxed) > 0 {
            let _guard = self
                .shared
                .sleep_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_one();
        }
    }
}

impl<T> Executor<T> {
    /// Tells the workers to exit once the queues are empty, and wakes them all. A
    /// pool started on demand whose workers have not started never starts them.
    pub fn stop(&self) {
        drop(
            self.shared
                .on_demand
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .unstarted
                .take(),
        );
        // ORDERING: SeqCst store, read under `sleep_lock` by workers before they wait;
        // the lock orders it against their re-check.
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _guard = self
            .shared
            .sleep_lock
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.shared.wake.notify_all();
    }

    /// The threads of a pool started on demand that have started, for the caller
    /// (shutdown, after [`stop`](Self::stop)) to join; empty for a pool started at
    /// once, whose threads [`start`](Self::start) returned.
    pub fn take_started(&self) -> Vec<thread::JoinHandle<()>> {
        core::mem::take(
            &mut self
                .shared
                .on_demand
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .handles,
        )
    }

    /// Whether the calling thread is one of this pool's workers.
    pub fn is_current_worker(&self) -> bool {
        let address = Arc::as_ptr(&self.shared) as *const () as usize;
        CURRENT_POOL.with(|pool| pool.get() == address)
    }

    /// Runs, on the calling thread, everything handed to the pool and not yet run:
    /// the rest of the calling worker's current batch (but its tasks that run
    /// [`after_its_batch`](Task::after_its_batch), which it puts back for the worker to
    /// run when the calling task returns), then whatever is still queued.
    /// For a callback that stops the service from a worker of this pool, after the
    /// submitters and the other workers have stopped; panics are caught and counted.
    pub fn run_queued_here(&self)
    where
        T: Task,
    {
        if !self.is_current_worker() {
            return;
        }
        let mut ran_panicked = 0;
        let mut after = Vec::new();
        while let Some(task) = next_of_current_batch::<T>() {
            if task.after_its_batch() {
                after.push(task);
            } else {
                ran_panicked += u64::from(run_caught(task));
            }
        }
        if !after.is_empty() {
            // Put back: the worker runs them when the calling task returns.
            CURRENT_BATCH.with(|batch| {
                *batch.borrow_mut() = Some(Box::new(after.into_iter()));
            });
        }
        loop {
            let stolen = core::iter::once(self.shared.injector.steal())
                .chain(self.shared.stealers.iter().map(Stealer::steal))
                .find_map(Steal::success);
            let Some(batch) = stolen else { break };
            for task in batch {
                ran_panicked += u64::from(run_caught(task));
            }
        }
        // ORDERING: Relaxed: a statistic; this worker's own counter (index 0 is as
        // good as any: the sum is what is read).
        self.shared.panicked[0].fetch_add(ran_panicked, Ordering::Relaxed);
    }

    /// Counts a task of the pool's service that panicked outside the pool (a wake
    /// the shard ran on its own thread), so that [`panicked`](Self::panicked) counts
    /// every one.
    pub fn count_panicked(&self) {
        // ORDERING: Relaxed: a statistic, as in `run_queued_here`.
        self.shared.panicked[0].fetch_add(1, Ordering::Relaxed);
    }

    /// Tasks that panicked so far (exact at quiescence).
    pub fn panicked(&self) -> u64 {
        self.shared
            .panicked
            .iter()
            // ORDERING: Relaxed: a statistic, exact once the workers are quiet.
            .map(|counter| counter.load(Ordering::Relaxed))
            .sum()
    }
}

impl<T> Clone for Executor<T> {
    fn clone(&self) -> Self {
        Executor {
            shared: self.shared.clone(),
        }
    }
}

impl<T> core::fmt::Debug for Executor<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Executor")
            .field("workers", &self.shared.stealers.len())
            .field("panicked", &self.panicked())
            .finish()
    }
}

/// An idle worker's brief wait before it sleeps: spins, then yields, unless a yield
/// has lately been slow.
///
/// On a quiet machine a yield lets the shard on the worker's core run at once and
/// hand out the next batch (a 1 M burst drains at 22 M/s; spinning instead, 14 M/s).
/// On a busy one a `sched_yield` puts the worker behind every CPU-bound thread of its
/// core: about 12 ms beside 4 busy loops (perf sched: 255 switches of 11 ms average
/// delay per worker in a 1 M burst, which drained at 0.7 M/s), where a parked worker,
/// woken by the next submit, is placed ahead of them. So a yield that took longer
/// than [`SLOW_YIELD`] stops yields for [`NO_YIELDS_FOR`].
#[derive(Default)]
struct Idle {
    /// The spins' schedule.
    backoff: Backoff,
    /// Waiting steps taken since the last batch.
    steps: u32,
    /// Until when yields are skipped.
    no_yields_until: Option<Instant>,
}

/// Waiting steps an idle worker takes before it sleeps ([`Idle`]).
const IDLE_STEPS: u32 = 11;
/// Of which spins first ([`Backoff::spin`]: 1, 2, .. 64 pauses).
const IDLE_SPINS: u32 = 7;
/// A yield that took longer than this was behind other threads' CPU-bound slices.
const SLOW_YIELD: Duration = Duration::from_micros(500);
/// How long a slow yield stops the worker's yields.
const NO_YIELDS_FOR: Duration = Duration::from_millis(100);

impl Idle {
    /// A batch came (or the worker is about to sleep): the next idle period waits
    /// from its first step.
    fn reset(&mut self) {
        self.steps = 0;
        self.backoff.reset();
    }

    /// Under loom an idle worker sleeps at once: waiting is the model's business.
    #[cfg(loom)]
    fn wait(&mut self) -> bool {
        false
    }

    /// One waiting step; `false` (and reset) once the worker should sleep.
    #[cfg(not(loom))]
    fn wait(&mut self) -> bool {
        if self.steps >= IDLE_STEPS {
            self.reset();
            return false;
        }
        self.steps += 1;
        if self.steps <= IDLE_SPINS {
            self.backoff.spin();
            return true;
        }
        let now = Instant::now();
        if self.no_yields_until.is_some_and(|until| now < until) {
            self.reset();
            return false; // sleep: the next submit wakes it
        }
        std::thread::yield_now();
        if now.elapsed() > SLOW_YIELD {
            self.no_yields_until = Some(Instant::now() + NO_YIELDS_FOR);
        }
        true
    }
}

/// One worker: run batches until stopped and out of work.
fn worker_loop<T: Task>(shared: &Arc<Shared<T>>, index: usize, local: &Worker<Vec<T>>) {
    let address = Arc::as_ptr(shared) as *const () as usize;
    CURRENT_POOL.with(|pool| pool.set(address));
    let mut idle = Idle::default();
    loop {
        if let Some(batch) = find_batch(shared, local) {
            idle.reset();
            CURRENT_BATCH.with(|current| {
                *current.borrow_mut() = Some(Box::new(batch.into_iter()));
            });
            while let Some(task) = next_of_current_batch::<T>() {
                if run_caught(task) {
                    // ORDERING: Relaxed: a statistic written only by this worker.
                    shared.panicked[index].fetch_add(1, Ordering::Relaxed);
                }
            }
            continue;
        }
        // Spin and yield briefly before sleeping: a shard handing out a burst submits
        // the next batch within microseconds, and waking a parked thread costs tens of
        // microseconds on a virtual machine. An idle pool still sleeps after these few
        // microseconds, with no wakeups.
        if idle.wait() {
            continue;
        }
        if !wait_for_work(shared) {
            return;
        }
    }
}

/// Our own deque first, then the injector, then the other workers (crossbeam-deque's
/// recommended order).
fn find_batch<T>(shared: &Shared<T>, local: &Worker<Vec<T>>) -> Option<Vec<T>> {
    local.pop().or_else(|| {
        core::iter::repeat_with(|| {
            shared
                .injector
                .steal_batch_and_pop(local)
                .or_else(|| shared.stealers.iter().map(Stealer::steal).collect())
        })
        .find(|steal| !steal.is_retry())
        .and_then(Steal::success)
    })
}

/// Sleeps until work may be available. Returns `false` when the worker should exit.
fn wait_for_work<T>(shared: &Shared<T>) -> bool {
    let guard = shared.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
    // ORDERING: SeqCst RMW, then the SeqCst fence below, pairs with `submit`'s fence:
    // see there.
    shared.sleepers.fetch_add(1, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    let has_work = !shared.injector.is_empty() || shared.stealers.iter().any(|s| !s.is_empty());
    // ORDERING: SeqCst load under the lock `stop` takes before notifying.
    let stopping = shared.stopping.load(Ordering::SeqCst);
    let keep_going = if has_work {
        true
    } else if stopping {
        false
    } else {
        let _guard = shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        true
    };
    // ORDERING: Relaxed: only ever makes a submitter notify needlessly, never miss.
    shared.sleepers.fetch_sub(1, Ordering::Relaxed);
    keep_going
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{thread_name, Executor, Task};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct Count(Arc<AtomicUsize>, bool);
    impl Task for Count {
        fn run(self) {
            self.0.fetch_add(1, Ordering::SeqCst);
            if self.1 {
                panic!("task panics on purpose");
            }
        }
    }

    #[test]
    fn every_task_runs_once_and_panics_are_counted() {
        let (executor, handles) = Executor::<Count>::start(2, "test").unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        for batch in 0..100 {
            executor.submit(
                (0..10)
                    .map(|i| Count(ran.clone(), batch == 3 && i == 0))
                    .collect(),
            );
        }
        executor.stop();
        for handle in handles {
            handle.join().unwrap();
        }
        assert_eq!(ran.load(Ordering::SeqCst), 1000);
        assert_eq!(executor.panicked(), 1);
    }

    #[test]
    fn thread_names_fit_in_fifteen_bytes_and_keep_their_role_and_index() {
        assert_eq!(thread_name("timer", 's', 0), "timer-s0");
        assert_eq!(thread_name("timer", 'w', 15), "timer-w15");
        // The prefix is cut, never the role and index.
        assert_eq!(thread_name("request-timeouts", 's', 3), "request-time-s3");
        assert_eq!(thread_name("request-timeouts", 'w', 127), "request-ti-w127");
        // At a character boundary: "é" is two bytes and would straddle byte 12.
        assert_eq!(thread_name("aaaaaaaaaaaé", 's', 1), "aaaaaaaaaaa-s1");
        assert_eq!(thread_name("", 's', 1), "-s1");
        for index in [0, 9, 10, 99, 100, 9_999, usize::MAX] {
            for prefix in ["", "t", "sharded-timer", "ééééééééééééééé"] {
                let name = thread_name(prefix, 'w', index);
                assert!(name.len() <= 15 || index == usize::MAX, "{name}");
                assert!(name.ends_with(&format!("-w{index}")), "{name}");
            }
        }
    }
}
