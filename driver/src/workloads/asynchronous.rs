//! `async`: a million `timeout`s around futures, as async servers use them: on a tokio
//! runtime (one task per request) and on a hand-written single-threaded executor,
//! beside tokio's own `tokio::time::timeout` on the same runtime. 99 % of the inner
//! futures complete after one yield (the timeout is registered, then cancelled by
//! drop); 1 % never complete and must elapse, never before their deadline.
//!
//! Requests arrive at a fixed [`REQUESTS_PER_SEC`] on each executor (through a
//! [`Pacer`]), as at a server with CPU to spare: the first timeouts come due while
//! requests still arrive, and a 2-core machine has CPU left for them. The rates in
//! the report are that pace; what a request costs is its CPU time, reported per
//! executor and for tokio's own timeout under the same load. `--compare` measures how
//! fast timeouts can go.
//!
//! Each request that must elapse is polled through a [`WakeProbe`], as `net`'s idle
//! timers are, so its lateness has two parts: when the timer woke the task (the
//! timer's part, judged by guarantee 2) and when its executor then ran it (shown, for
//! tokio::time's timeouts on the same runtime too). On a 2-core machine the second
//! adds the executor's queue: tokio::time's own elapsed tasks ran more than 2 ms late
//! 0.5–1.4 % of the time in the main job, and the hand-written executor polls arriving
//! requests before woken ones.

#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use sharded_timer::ShardedTimer;

use crate::report::{Lateness, Meter, Rates, WorkloadReport};
use crate::Common;

use super::{Pacer, WakeProbe};

/// Requests started per second on each executor.
pub(crate) const REQUESTS_PER_SEC: f64 = 500_000.0;

/// One in this many inner futures never completes.
const NEVER_EVERY: usize = 100;

/// Completes on its second poll, waking itself on the first: a reply that arrives
/// one scheduling round later.
#[derive(Debug, Default)]
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// What the requests saw.
#[derive(Debug, Default)]
struct Outcomes {
    /// Inner futures that completed in time.
    completed: AtomicU64,
    /// Timeouts that elapsed.
    elapsed: AtomicU64,
    /// Timeouts that elapsed before their deadline.
    early: AtomicU64,
    /// Timeouts that elapsed around a future that would have completed, or completed
    /// around one that never does: must be 0.
    wrong: AtomicU64,
    /// Lateness of the elapsed ones, µs: when the timer woke the task.
    woke: Mutex<Vec<u64>>,
    /// Lateness of the elapsed ones, µs: when the task ran, on which executor.
    ran: Mutex<Vec<(Executor, u64)>>,
}

/// Where a request ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Executor {
    /// A task on a tokio runtime.
    Tokio,
    /// The hand-written single-threaded executor.
    HandWritten,
}

impl Outcomes {
    /// Records request `index`'s outcome on `executor`; `deadline` is at or before
    /// its timer's; `woken`: when its timer woke it (an elapsed request's, from its
    /// probe).
    fn record(
        &self,
        index: usize,
        deadline: Instant,
        (timed_out, woken): (bool, Option<Instant>),
        executor: Executor,
    ) {
        let never = index.is_multiple_of(NEVER_EVERY);
        if timed_out != never {
            self.wrong.fetch_add(1, Ordering::Relaxed);
        }
        if timed_out {
            let now = Instant::now();
            if now < deadline {
                self.early.fetch_add(1, Ordering::Relaxed);
            }
            self.elapsed.fetch_add(1, Ordering::Relaxed);
            let late = |at: Instant| at.saturating_duration_since(deadline).as_micros() as u64;
            // An elapsed timeout was woken by its timer; were it not (no probe), its
            // wake is taken to be its run, the later of the two.
            let woke = late(woken.unwrap_or(now));
            self.woke
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(woke);
            self.ran
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((executor, late(now)));
        } else {
            self.completed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Request `index`'s inner future: a reply after one yield, or none ever.
async fn reply(index: usize) {
    if index.is_multiple_of(NEVER_EVERY) {
        std::future::pending::<()>().await;
    } else {
        YieldOnce::default().await;
    }
}

/// A future polled through a [`WakeProbe`]: its output, and when it was last woken.
struct Probed<F> {
    /// The future.
    future: Pin<Box<F>>,
    /// Records its wakes.
    probe: Arc<WakeProbe>,
    /// `probe` as a waker, made once.
    probe_waker: Waker,
}

impl<F: Future> Future for Probed<F> {
    type Output = (F::Output, Option<Instant>);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut cx = this.probe.stand_in(cx, &this.probe_waker);
        this.future
            .as_mut()
            .poll(&mut cx)
            .map(|output| (output, this.probe.woken_at()))
    }
}

/// Awaits request `index`'s `timeout` (whether it elapsed); a request that never
/// completes (and so must elapse) through a [`WakeProbe`], for when its timer woke
/// it. The others, 99 %, pay no probe.
async fn observed(index: usize, timeout: impl Future<Output = bool>) -> (bool, Option<Instant>) {
    if index.is_multiple_of(NEVER_EVERY) {
        let probe = Arc::new(WakeProbe::default());
        Probed {
            future: Box::pin(timeout),
            probe_waker: Waker::from(probe.clone()),
            probe,
        }
        .await
    } else {
        (timeout.await, None)
    }
}

/// Which timeout the tokio tasks use.
#[derive(Clone, Copy, Debug)]
enum Flavor {
    /// `ShardedTimer::timeout`.
    Sharded,
    /// `tokio::time::timeout`.
    Tokio,
}

/// `requests` tasks on a tokio runtime with `workers` threads, each awaiting a
/// timeout of `timeout` around its reply, spawned at [`REQUESTS_PER_SEC`]. Returns
/// requests per second and process CPU ns per request.
fn on_tokio(
    timer: &ShardedTimer,
    flavor: Flavor,
    requests: usize,
    workers: usize,
    timeout: Duration,
    outcomes: &'static Outcomes,
) -> (f64, f64) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_time()
        .build()
        .expect("a tokio runtime");
    let cpu = crate::report::cpu_seconds();
    let start = Instant::now();
    runtime.block_on(async {
        let mut pacer = Pacer::new(REQUESTS_PER_SEC);
        // Requests not yet finished, and the wake-up of the last one's: as a server
        // spawns, without keeping a join handle (and so every finished task's memory)
        // per request.
        let left = Arc::new(AtomicU64::new(requests as u64));
        let all_done = Arc::new(tokio::sync::Notify::new());
        for index in 0..requests {
            let timer = timer.clone();
            let (left, all_done) = (left.clone(), all_done.clone());
            tokio::spawn(async move {
                let deadline = Instant::now() + timeout;
                let outcome = match flavor {
                    Flavor::Sharded => {
                        observed(index, async {
                            timer.timeout(timeout, reply(index)).await.is_err()
                        })
                        .await
                    }
                    Flavor::Tokio => {
                        observed(index, async {
                            tokio::time::timeout(timeout, reply(index)).await.is_err()
                        })
                        .await
                    }
                };
                outcomes.record(index, deadline, outcome, Executor::Tokio);
                // ORDERING: AcqRel: the last decrement sees every other task's
                // records before it notifies (`notify_one` keeps a permit if the
                // waiter is not there yet).
                if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    all_done.notify_one();
                }
            });
            if let Some(due) = pacer.count() {
                tokio::time::sleep_until(due.into()).await;
            }
        }
        if requests > 0 {
            all_done.notified().await;
        }
    });
    let elapsed = start.elapsed();
    (
        requests as f64 / elapsed.as_secs_f64(),
        cpu_ns_per(requests, cpu),
    )
}

/// Requests per second and CPU ns per request of two runs of `halves[0]` and
/// `halves[1]` requests, each given as [`on_tokio`] returns it.
fn combined(halves: [usize; 2], first: (f64, f64), second: (f64, f64)) -> (f64, f64) {
    let [a, b] = halves.map(|n| n as f64);
    let seconds = a / first.0 + b / second.0;
    let cpu_ns = a * first.1 + b * second.1;
    ((a + b) / seconds, cpu_ns / (a + b))
}

/// Process CPU ns per request since `cpu` (seconds, as [`crate::report::cpu_seconds`]
/// read it), or NaN where it cannot be read.
fn cpu_ns_per(requests: usize, cpu: Option<f64>) -> f64 {
    match (cpu, crate::report::cpu_seconds()) {
        (Some(before), Some(after)) => (after - before) * 1e9 / requests.max(1) as f64,
        _ => f64::NAN,
    }
}

/// The hand-written executor's shared run queue.
#[derive(Debug, Default)]
struct RunQueue {
    /// Indexes of tasks woken since their last poll.
    woken: Mutex<VecDeque<usize>>,
}

/// A task's waker: queue its index and unpark the executor thread.
#[derive(Debug)]
struct TaskWaker {
    /// The task.
    index: usize,
    /// Where to queue it.
    queue: Arc<RunQueue>,
    /// The executor thread.
    thread: std::thread::Thread,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.queue
            .woken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(self.index);
        self.thread.unpark();
    }
}

/// A boxed request future.
type Request = Pin<Box<dyn Future<Output = ()> + Send>>;

/// `requests` timeouts polled by a minimal single-threaded executor: start (poll
/// first) the requests as they arrive at [`REQUESTS_PER_SEC`], poll whatever is woken
/// meanwhile, and park while nothing is due. A future may be woken after it
/// completed; such wakes are ignored. Returns requests per second and process CPU ns
/// per request.
fn on_hand_written(
    timer: &ShardedTimer,
    requests: usize,
    timeout: Duration,
    outcomes: &'static Outcomes,
) -> (f64, f64) {
    let queue = Arc::new(RunQueue::default());
    let cpu = crate::report::cpu_seconds();
    let start = Instant::now();
    let mut tasks: Vec<Option<(Request, Waker)>> = (0..requests)
        .map(|index| {
            // The timeout starts at the request's first poll, as in a task: made here,
            // a million of them would start before the first is polled.
            let timer = timer.clone();
            let request: Request = Box::pin(async move {
                let deadline = Instant::now() + timeout;
                let outcome = observed(index, async {
                    timer.timeout(timeout, reply(index)).await.is_err()
                })
                .await;
                outcomes.record(index, deadline, outcome, Executor::HandWritten);
            });
            let waker = Waker::from(Arc::new(TaskWaker {
                index,
                queue: queue.clone(),
                thread: std::thread::current(),
            }));
            Some((request, waker))
        })
        .collect();
    let mut left = requests;
    let mut poll = |index: usize, tasks: &mut Vec<Option<(Request, Waker)>>| {
        if let Some((request, waker)) = &mut tasks[index] {
            if request
                .as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_ready()
            {
                tasks[index] = None;
                left -= 1;
            }
        }
    };
    let mut pacer = Pacer::new(REQUESTS_PER_SEC);
    // The next request to start, and when it may.
    let mut arriving = 0;
    let mut arrives_at = Instant::now();
    loop {
        let now = Instant::now();
        if arriving < requests && arrives_at <= now {
            poll(arriving, &mut tasks);
            arriving += 1;
            if let Some(due) = pacer.count() {
                arrives_at = due;
            }
            continue;
        }
        let next = queue
            .woken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        match next {
            Some(index) => poll(index, &mut tasks),
            None if arriving == requests && tasks.iter().all(Option::is_none) => break,
            None if arriving < requests => {
                std::thread::park_timeout(arrives_at.saturating_duration_since(now));
            }
            None => std::thread::park_timeout(Duration::from_millis(100)),
        }
    }
    let elapsed = start.elapsed();
    (
        requests as f64 / elapsed.as_secs_f64(),
        cpu_ns_per(requests, cpu),
    )
}

/// Runs `requests` timeouts of `timeout_s` (before the time scale) on each executor.
pub(crate) fn run(common: &Common, requests: usize, timeout_s: f64) -> WorkloadReport {
    let timer = common.service("async");
    let timeout = common.scaled(timeout_s);
    let workers = common.producers;
    let meter = Meter::start();
    let ours: &'static Outcomes = Box::leak(Box::default());
    let theirs: &'static Outcomes = Box::leak(Box::default());
    // The two flavors on tokio run in halves, in the order ours, tokio's, (the
    // hand-written executor), tokio's, ours: each flavor meets the machine and the
    // process's heap as often early as late. (Run whole, ours first, ours paid for
    // the heap's growth alone: 1.14-1.59x tokio's CPU per request in the main job,
    // 1.06x in a run of this workload alone.)
    let first = requests / 2;
    let halves = [first, requests - first];
    let on_tokio_in = |flavor, outcomes, half: usize| {
        on_tokio(&timer, flavor, halves[half], workers, timeout, outcomes)
    };
    let ours_first = on_tokio_in(Flavor::Sharded, ours, 0);
    let theirs_first = on_tokio_in(Flavor::Tokio, theirs, 0);
    let (hand_rate, hand_cpu) = on_hand_written(&timer, requests, timeout, ours);
    let theirs_second = on_tokio_in(Flavor::Tokio, theirs, 1);
    let ours_second = on_tokio_in(Flavor::Sharded, ours, 1);
    let (tokio_rate, tokio_cpu) = combined(halves, ours_first, ours_second);
    let (peer_rate, peer_cpu) = combined(halves, theirs_first, theirs_second);
    drop(timer.shutdown());
    let process = meter.stop();
    let mut histogram = crate::report::histogram();
    for &late in ours.woke.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        histogram.saturating_record(late.max(1));
    }
    // When the elapsed tasks ran, per executor and timeout.
    let ran = |outcomes: &Outcomes, on: Executor| {
        let mut histogram = crate::report::histogram();
        for &(executor, late) in outcomes
            .ran
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            if executor == on {
                histogram.saturating_record(late.max(1));
            }
        }
        let ran = Lateness::of(&histogram);
        format!(
            "p50 {:.2} / p99 {:.2} / max {:.2} ms, {:.1} % within {:.1} ms",
            ran.p50 as f64 / 1e3,
            ran.p99 as f64 / 1e3,
            ran.max as f64 / 1e3,
            ran.on_time * 100.0,
            crate::report::ON_TIME_US as f64 / 1e3
        )
    };
    let count = |o: &Outcomes, f: fn(&Outcomes) -> &AtomicU64| f(o).load(Ordering::Relaxed);
    let never = |n: usize| n.div_ceil(NEVER_EVERY) as u64;
    let expected_elapsed = never(halves[0]) + never(halves[1]) + never(requests);
    let elapsed = count(ours, |o| &o.elapsed);
    let completed = count(ours, |o| &o.completed);
    let lost = (2 * requests as u64).saturating_sub(elapsed + completed);
    let theirs_early = count(theirs, |o| &o.early);
    WorkloadReport {
        name: "async",
        rates: Rates {
            schedule_cancel: Some(tokio_rate),
            ..Rates::default()
        },
        fired: elapsed,
        lateness_us: Lateness::of(&histogram),
        early: count(ours, |o| &o.early),
        lost,
        duplicated: count(ours, |o| &o.wrong) + (elapsed + completed).saturating_sub(2 * requests as u64),
        bytes_per_pending: None,
        capture_bytes: 0,
        process,
        notes: vec![
            format!(
                "{requests} timeouts ({timeout:?}) around replies, 1 in {NEVER_EVERY} never answered, paced at {:.2} M/s per executor (a load, not a throughput: --compare measures that): tokio runtime ({workers} workers), one task each, in two halves (ours, tokio's, the hand-written executor's, tokio's, ours: each flavor as often early as late in the process): {:.2} M/s, {tokio_cpu:.0} CPU ns/request; hand-written executor, 1 thread: {:.2} M/s, {hand_cpu:.0} CPU ns/request",
                REQUESTS_PER_SEC / 1e6,
                tokio_rate / 1e6,
                hand_rate / 1e6
            ),
            format!(
                "same tasks with tokio::time::timeout: {:.2} M/s, {peer_cpu:.0} CPU ns/request (sharded-timer used {:.2}x as much CPU per request); its early elapses: {theirs_early}; elapsed {expected_elapsed} expected, {elapsed} seen",
                peer_rate / 1e6,
                tokio_cpu / peer_cpu
            ),
            format!(
                "lateness columns: when the timer woke an elapsed request's task (the timer's part, judged: guarantee 2, as in net); the task then ran: on tokio {}, on the hand-written executor {}; tokio::time's elapsed tasks on the same runtime ran {} (the executor's queue adds the difference)",
                ran(ours, Executor::Tokio),
                ran(ours, Executor::HandWritten),
                ran(theirs, Executor::Tokio)
            ),
        ],
    }
}
