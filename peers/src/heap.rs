//! The `Mutex<BinaryHeap>` timer: the java.util.Timer / ScheduledThreadPoolExecutor
//! design. One binary heap of tasks ordered by deadline under one mutex, and one timer
//! thread that sleeps on a condition variable until the earliest deadline, pops due
//! tasks one at a time and runs them inline (as java.util.Timer does).
//!
//! Faithful in: O(log n) insert and pop under a single lock shared by every producer;
//! cancel marks the task cancelled and leaves it in the heap until its deadline (as
//! `TimerTask.cancel` does without `purge()`), so cancelled tasks hold memory until
//! then. Differs in: Rust closures instead of task objects (two allocations per timer:
//! the shared task and the boxed closure).

use super::once::OnceTask;
use std::cmp::{Ordering as CmpOrdering, Reverse};
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

struct Item {
    deadline: Instant,
    seq: u64,
    task: Arc<OnceTask>,
}

impl PartialEq for Item {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline, self.seq) == (other.deadline, other.seq)
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Item {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (self.deadline, self.seq).cmp(&(other.deadline, other.seq))
    }
}

struct State {
    heap: BinaryHeap<Reverse<Item>>,
    seq: u64,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// The heap timer.
pub struct HeapTimer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Default for HeapTimer {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for HeapTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapTimer").finish_non_exhaustive()
    }
}

impl HeapTimer {
    /// Starts the timer thread.
    ///
    /// # Panics
    ///
    /// If the thread cannot be spawned.
    pub fn new() -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                heap: BinaryHeap::new(),
                seq: 0,
                shutdown: false,
            }),
            wake: Condvar::new(),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("heap-timer".into())
            .spawn(move || run(&worker))
            .expect("spawn the heap timer thread");
        HeapTimer {
            shared,
            thread: Some(thread),
        }
    }

    /// Runs `f` once after `delay` unless cancelled.
    ///
    /// # Panics
    ///
    /// If the lock is poisoned (a callback panicked under it: never, callbacks run
    /// outside it).
    pub fn schedule(&self, delay: Duration, f: impl FnOnce() + Send + 'static) -> Arc<OnceTask> {
        let task = Arc::new(OnceTask::new(f));
        let deadline = Instant::now() + delay;
        let mut state = self.shared.state.lock().unwrap();
        state.seq += 1;
        let seq = state.seq;
        let earliest = state
            .heap
            .peek()
            .is_none_or(|top| deadline < top.0.deadline);
        state.heap.push(Reverse(Item {
            deadline,
            seq,
            task: task.clone(),
        }));
        drop(state);
        if earliest {
            self.shared.wake.notify_one();
        }
        task
    }

    /// Cancels `task`; `true` iff this call stopped it.
    pub fn cancel(&self, task: &OnceTask) -> bool {
        task.cancel()
    }
}

fn run(shared: &Shared) {
    let mut state = shared.state.lock().unwrap();
    loop {
        if state.shutdown {
            return;
        }
        let now = Instant::now();
        match state.heap.peek().map(|top| top.0.deadline) {
            None => state = shared.wake.wait(state).unwrap(),
            Some(deadline) if deadline > now => {
                state = shared.wake.wait_timeout(state, deadline - now).unwrap().0;
            }
            Some(_) => {
                let Reverse(item) = state.heap.pop().expect("peeked");
                drop(state);
                item.task.fire();
                state = shared.state.lock().unwrap();
            }
        }
    }
}

impl Drop for HeapTimer {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap().shutdown = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
