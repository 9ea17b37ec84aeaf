//! The Netty-style timer: Netty's HashedWheelTimer design. A single hashed wheel of 512
//! slots with a 1 ms tick and *remaining rounds* per timeout (a timeout more than one
//! revolution away waits in its slot for that many passes), driven by one worker
//! thread that wakes every tick, moves newly scheduled timeouts from a queue into the
//! wheel, removes cancelled ones, and runs expired callbacks inline.
//!
//! Faithful in: 512 slots, 1 ms tick, rounds, one ticking thread that wakes every
//! tick even when idle, new timeouts and cancellations queued and applied on the next
//! tick (so a cancelled timeout's memory is freed within a tick), callbacks inline.
//! Differs in: the two queues are `Mutex<Vec>` (Netty uses lock-free MPSC queues), and
//! slots are vectors with tombstones rather than doubly-linked lists.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::once::OnceTask;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const SLOTS: usize = 512;
const TICK: Duration = Duration::from_millis(1);
/// `position` of a timeout not (or no longer) in a slot.
const NOWHERE: usize = usize::MAX;

/// A slot: timeouts with their remaining rounds; `None` marks a removed one.
type Slot = Vec<Option<(Arc<Timeout>, u64)>>;

/// One scheduled timeout.
#[derive(Debug)]
pub struct Timeout {
    /// Deadline in ns since the timer's start.
    deadline_ns: u64,
    /// The callback and who won it.
    task: OnceTask,
    /// `slot * 2^32 + index` in the wheel; written only by the worker.
    position: AtomicUsize,
}

#[derive(Debug)]
struct Shared {
    start: Instant,
    incoming: Mutex<Vec<Arc<Timeout>>>,
    cancelled: Mutex<Vec<Arc<Timeout>>>,
    shutdown: AtomicBool,
    /// Timeouts the worker has taken from `incoming` and placed (or found cancelled
    /// and dropped); written only by the worker, once per batch, so producers never
    /// touch it.
    taken_in: AtomicU64,
}

/// The Netty-style timer.
#[derive(Debug)]
pub struct NettyTimer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Default for NettyTimer {
    fn default() -> Self {
        Self::new()
    }
}

impl NettyTimer {
    /// Starts the wheel's worker thread.
    ///
    /// # Panics
    ///
    /// If the thread cannot be spawned.
    pub fn new() -> Self {
        let shared = Arc::new(Shared {
            start: Instant::now(),
            incoming: Mutex::new(Vec::new()),
            cancelled: Mutex::new(Vec::new()),
            shutdown: AtomicBool::new(false),
            taken_in: AtomicU64::new(0),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("netty-wheel".into())
            .spawn(move || run(&worker))
            .expect("spawn the wheel thread");
        NettyTimer {
            shared,
            thread: Some(thread),
        }
    }

    /// Runs `f` once after `delay` unless cancelled: queued for the worker's next
    /// tick.
    ///
    /// # Panics
    ///
    /// If the queue's lock is poisoned (never: nothing panics under it).
    pub fn schedule(&self, delay: Duration, f: impl FnOnce() + Send + 'static) -> Arc<Timeout> {
        let deadline = Instant::now() + delay;
        let timeout = Arc::new(Timeout {
            deadline_ns: deadline.duration_since(self.shared.start).as_nanos() as u64,
            task: OnceTask::new(f),
            position: AtomicUsize::new(NOWHERE),
        });
        self.shared.incoming.lock().unwrap().push(timeout.clone());
        timeout
    }

    /// Timeouts the worker has taken into its wheel so far (each scheduled one once,
    /// cancelled ones included): a scheduled timeout is in the wheel once this count
    /// reaches it.
    pub fn taken_in(&self) -> u64 {
        self.shared.taken_in.load(Ordering::Acquire)
    }

    /// Cancels `timeout`; `true` iff this call stopped it (it leaves the wheel on the
    /// worker's next tick).
    ///
    /// # Panics
    ///
    /// If the queue's lock is poisoned (never: nothing panics under it).
    pub fn cancel(&self, timeout: &Arc<Timeout>) -> bool {
        let won = timeout.task.cancel();
        if won {
            self.shared.cancelled.lock().unwrap().push(timeout.clone());
        }
        won
    }
}

fn run(shared: &Shared) {
    let mut wheel: Vec<Slot> = (0..SLOTS).map(|_| Vec::new()).collect();
    let mut tick: u64 = 0;
    let tick_ns = TICK.as_nanos() as u64;
    while !shared.shutdown.load(Ordering::Acquire) {
        // Sleep until the end of this tick, as Netty's worker does.
        let tick_end = shared.start + TICK * (tick as u32 + 1);
        let now = Instant::now();
        if tick_end > now {
            std::thread::sleep(tick_end - now);
        }
        // Move new timeouts into the wheel.
        let incoming = std::mem::take(&mut *shared.incoming.lock().unwrap());
        let batch = incoming.len() as u64;
        for timeout in incoming {
            if !timeout.task.is_pending() {
                continue;
            }
            let calculated = timeout.deadline_ns / tick_ns;
            let rounds = calculated.saturating_sub(tick) / SLOTS as u64;
            let slot = (calculated.max(tick) as usize) & (SLOTS - 1);
            let index = wheel[slot].len();
            timeout
                .position
                .store((slot << 32) | index, Ordering::Relaxed);
            wheel[slot].push(Some((timeout, rounds)));
        }
        // ORDERING: Release pairs with `taken_in`'s Acquire load: a reader that sees
        // the count sees the wheel's writes of the batch (it only compares counts).
        shared.taken_in.fetch_add(batch, Ordering::Release);
        // Remove cancelled timeouts.
        let cancelled = std::mem::take(&mut *shared.cancelled.lock().unwrap());
        for timeout in cancelled {
            let position = timeout.position.swap(NOWHERE, Ordering::Relaxed);
            if position != NOWHERE {
                wheel[position >> 32][position & 0xffff_ffff] = None;
            }
        }
        // Expire this tick's slot.
        let slot = (tick as usize) & (SLOTS - 1);
        let entries = std::mem::take(&mut wheel[slot]);
        let mut kept = Vec::with_capacity(entries.len());
        for (timeout, rounds) in entries.into_iter().flatten() {
            if rounds == 0 {
                timeout.position.store(NOWHERE, Ordering::Relaxed);
                timeout.task.fire();
            } else {
                let index = kept.len();
                timeout
                    .position
                    .store((slot << 32) | index, Ordering::Relaxed);
                kept.push(Some((timeout, rounds - 1)));
            }
        }
        wheel[slot] = kept;
        tick += 1;
    }
}

impl Drop for NettyTimer {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
