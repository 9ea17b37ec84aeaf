//! The hand-written executor: one thread polling tasks with wakers of its own, whose
//! tasks live only in its run queue and in their wakers; among them orphan tasks,
//! which live only behind the waker stored in an anchor sleep that another thread
//! drops, so that dropping that waker drops the task and its other sleeps.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use sharded_timer::{ShardedTimer, Sleep};

use super::checker::{Anchor, Shared};
use super::futures::future_op;
use super::report::{bump, Op, PROGRESS};
use super::{Rng, FAR};

/// A boxed task future.
type TaskFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The executor's run queue.
#[derive(Debug)]
struct RunQueue {
    /// Woken tasks.
    woken: Mutex<VecDeque<Arc<Task>>>,
    /// The executor thread.
    thread: std::thread::Thread,
}

/// A task: its future lives here, and the task lives only in the run queue and in
/// its wakers (the executor keeps no list of tasks), so dropping its last waker drops
/// it.
struct Task {
    /// The future, `None` once complete.
    future: Mutex<Option<TaskFuture>>,
    /// Where waking queues it.
    queue: Arc<RunQueue>,
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task").finish_non_exhaustive()
    }
}

impl Wake for Task {
    fn wake(self: Arc<Self>) {
        let queue = self.queue.clone();
        queue
            .woken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(self);
        queue.thread.unpark();
    }
}

/// A waker that wakes nobody (an orphan task's other sleeps).
#[derive(Debug)]
struct Nobody;

impl Wake for Nobody {
    fn wake(self: Arc<Self>) {}
}

/// Counts a hand-written task alive until dropped.
#[derive(Debug)]
struct Alive(Arc<Shared>);

impl Alive {
    /// One more task alive.
    fn new(shared: &Arc<Shared>) -> Alive {
        // ORDERING: Relaxed: a count polled until it reaches 0; no data rides on it.
        shared.hand_tasks.fetch_add(1, Ordering::Relaxed);
        Alive(shared.clone())
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        PROGRESS.fetch_add(1, Ordering::Relaxed);
        // ORDERING: Relaxed: as in `new`.
        self.0.hand_tasks.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Drops one anchor sleep (from any thread): its waker, and with it the orphan task
/// and that task's other sleeps, are dropped when the service lets the waker go.
pub(super) fn drop_anchor(shared: &Shared) {
    let anchor = shared
        .anchors
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .pop();
    if let Some(anchor) = anchor {
        let sleep = anchor.lock().unwrap_or_else(|e| e.into_inner()).take();
        bump(Op::AnchorDropped);
        drop(sleep);
    }
}

/// An orphan task: polls its anchor with the task's waker and its other sleeps with
/// a waker that wakes nobody, then waits for ever.
struct Orphan {
    /// The anchor (shared with whoever drops it).
    anchor: Anchor,
    /// Far sleeps dropped with the task.
    others: Vec<Sleep>,
    /// Polled once.
    polled: bool,
    /// Counts the task alive.
    _alive: Alive,
}

impl Future for Orphan {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.polled {
            return Poll::Pending;
        }
        self.polled = true;
        if let Some(sleep) = self
            .anchor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            let _ = Pin::new(sleep).poll(cx);
        }
        let nobody = Waker::from(Arc::new(Nobody));
        let mut quiet = Context::from_waker(&nobody);
        for sleep in &mut self.others {
            let _ = Pin::new(sleep).poll(&mut quiet);
        }
        Poll::Pending
    }
}

/// The hand-written executor's thread: tasks of [`future_op`] and orphans, up to 24
/// alive at a time, until `stop`; then drops every anchor and runs until no task is
/// alive.
pub(super) fn hand_load(
    timer: ShardedTimer,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    let queue = Arc::new(RunQueue {
        woken: Mutex::new(VecDeque::new()),
        thread: std::thread::current(),
    });
    let spawn = |future: TaskFuture| {
        let task = Arc::new(Task {
            future: Mutex::new(Some(future)),
            queue: queue.clone(),
        });
        Waker::from(task).wake();
    };
    let alive = || {
        // ORDERING: Relaxed: as in `Alive`.
        shared.hand_tasks.load(Ordering::Relaxed)
    };
    let mut stopping = false;
    loop {
        // ORDERING: Relaxed: a stop flag.
        if !stopping && stop.load(Ordering::Relaxed) {
            stopping = true;
            while !shared
                .anchors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
            {
                drop_anchor(&shared);
            }
        }
        if !stopping && alive() < 24 {
            let guard = Alive::new(&shared);
            if rng.chance(15) {
                bump(Op::OrphanTask);
                let far = if rng.chance(80) {
                    FAR
                } else {
                    Duration::from_millis(rng.range(1..=20))
                };
                let anchor: Anchor = Arc::new(Mutex::new(Some(timer.sleep(far))));
                let others = (0..rng.range(2..=20))
                    .map(|_| timer.sleep(FAR + Duration::from_secs(rng.range(0..=60))))
                    .collect();
                shared
                    .anchors
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(anchor.clone());
                spawn(Box::pin(Orphan {
                    anchor,
                    others,
                    polled: false,
                    _alive: guard,
                }));
            } else {
                let op = future_op(timer.clone(), shared.clone(), rng.next());
                spawn(Box::pin(async move {
                    let _guard = guard;
                    op.await;
                    bump(Op::HandFuture);
                }));
            }
            if rng.chance(5) {
                drop_anchor(&shared);
            }
        }
        let next = queue
            .woken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        match next {
            Some(task) => {
                let waker = Waker::from(task.clone());
                let mut cx = Context::from_waker(&waker);
                let mut slot = task.future.lock().unwrap_or_else(|e| e.into_inner());
                let done = slot
                    .as_mut()
                    .is_some_and(|future| future.as_mut().poll(&mut cx).is_ready());
                let finished = if done { slot.take() } else { None };
                drop(slot);
                drop(finished);
                // This thread's references go: the task lives on in its wakers only.
            }
            None if stopping && alive() == 0 => break,
            None => std::thread::park_timeout(Duration::from_millis(1)),
        }
    }
}
