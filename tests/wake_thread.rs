//! Which thread wakes a future's task: the shard thread that fired its timer, in every
//! `Callbacks` mode (as tokio's driver wakes on its own thread), never a pool worker
//! or the user's spawner; and what a hostile waker does there (panics: counted, the
//! shard lives on; blocks: the shard's other tasks are woken by its rescuer).

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

use sharded_timer::{Callbacks, ShardedTimer, Sleep};
use support::{on_each_core, wait_until, WAIT};

/// A waker that records the name of each thread that wakes it, and optionally
/// panics or blocks in `wake`.
#[derive(Default)]
struct Recorder {
    /// The waking threads' names, in order.
    woken_on: Mutex<Vec<String>>,
    /// When it was last woken.
    woken_at: Mutex<Option<Instant>>,
    /// Panic in `wake` (after recording).
    panics: bool,
    /// Block in `wake` for this long (after recording).
    blocks: Option<Duration>,
}

impl Wake for Recorder {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let name = std::thread::current().name().unwrap_or("").to_owned();
        self.woken_on.lock().unwrap().push(name);
        *self.woken_at.lock().unwrap() = Some(Instant::now());
        if let Some(block) = self.blocks {
            std::thread::sleep(block);
        }
        if self.panics {
            panic!("a hostile waker");
        }
    }
}

impl Recorder {
    fn names(&self) -> Vec<String> {
        self.woken_on.lock().unwrap().clone()
    }
}

/// Polls `sleep` once with `recorder` as the waker; it must be pending.
fn poll_pending(sleep: &mut Pin<Box<Sleep>>, recorder: &Arc<Recorder>) {
    let waker = Waker::from(recorder.clone());
    assert!(
        sleep
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending(),
        "a sleep still ahead is pending at its first poll"
    );
}

/// A 2-shard service named "wk" whose callbacks run as `callbacks` says.
fn service(callbacks: Callbacks) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(2)
        .callbacks(callbacks)
        .pin_cores(false)
        .thread_name("wk")
        .build()
        .expect("the service builds")
}

/// 20 sleeps of 100 ms (ahead at their first poll even on a loaded machine), each polled once: every task is woken exactly once, by a shard
/// thread ("wk-s0" or "wk-s1"), never early.
fn every_task_woken_once_on_a_shard_thread(timer: &ShardedTimer) {
    let made = Instant::now();
    let mut sleeps: Vec<_> = (0..20)
        .map(|_| {
            let recorder = Arc::new(Recorder::default());
            let mut sleep = Box::pin(timer.sleep(Duration::from_millis(100)));
            poll_pending(&mut sleep, &recorder);
            (sleep, recorder)
        })
        .collect();
    assert!(
        wait_until(WAIT, || sleeps.iter().all(|(_, r)| !r.names().is_empty())),
        "every task woken"
    );
    for (sleep, recorder) in &mut sleeps {
        let names = recorder.names();
        assert_eq!(names.len(), 1, "woken once: {names:?}");
        assert!(
            names[0] == "wk-s0" || names[0] == "wk-s1",
            "woken on a shard thread, not {:?}",
            names[0]
        );
        let woken_at = recorder.woken_at.lock().unwrap().unwrap();
        assert!(woken_at >= made + Duration::from_millis(100), "never early");
        let waker = Waker::noop();
        assert!(sleep
            .as_mut()
            .poll(&mut Context::from_waker(waker))
            .is_ready());
    }
}

#[test]
fn the_pool_mode_wakes_tasks_on_the_shard_thread() {
    let timer = service(Callbacks::pool(2));
    every_task_woken_once_on_a_shard_thread(&timer);
    // The pool still runs `schedule`'s callbacks.
    let ran_on = Arc::new(Mutex::new(String::new()));
    let seen = ran_on.clone();
    timer
        .schedule(Duration::from_millis(1), move || {
            *seen.lock().unwrap() = std::thread::current().name().unwrap_or("").to_owned();
        })
        .unwrap();
    assert!(wait_until(WAIT, || !ran_on.lock().unwrap().is_empty()));
    assert!(
        ran_on.lock().unwrap().starts_with("wk-w"),
        "{:?}",
        ran_on.lock().unwrap()
    );
    assert!(timer.shutdown().is_empty());
}

#[test]
fn the_spawn_mode_never_hands_a_wake_to_the_spawner() {
    let spawned = Arc::new(AtomicUsize::new(0));
    let count = spawned.clone();
    let timer = service(Callbacks::spawn(move |callback| {
        count.fetch_add(1, SeqCst);
        callback.run();
    }));
    every_task_woken_once_on_a_shard_thread(&timer);
    assert_eq!(
        spawned.load(SeqCst),
        0,
        "no sleep's timer reached the spawner"
    );
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    timer
        .schedule(Duration::from_millis(1), move || flag.store(true, SeqCst))
        .unwrap();
    assert!(wait_until(WAIT, || ran.load(SeqCst)));
    assert_eq!(spawned.load(SeqCst), 1, "a schedule's callback still does");
    assert!(timer.shutdown().is_empty());
}

#[test]
fn the_inline_mode_wakes_tasks_on_the_shard_thread() {
    let timer = service(Callbacks::inline());
    every_task_woken_once_on_a_shard_thread(&timer);
    assert!(timer.shutdown().is_empty());
}

#[cfg(feature = "rayon")]
#[test]
fn the_rayon_mode_wakes_tasks_on_the_shard_thread() {
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap(),
    );
    let timer = service(Callbacks::rayon(pool));
    every_task_woken_once_on_a_shard_thread(&timer);
    assert!(timer.shutdown().is_empty());
}

/// A waker that panics, in the pool mode (where it now runs on the shard): the panic
/// is caught and counted as a callback's, the shard lives on and keeps waking.
#[test]
fn a_panicking_waker_in_the_pool_mode_is_counted_and_its_shard_lives_on() {
    let timer = service(Callbacks::pool(1));
    let hostile = Arc::new(Recorder {
        panics: true,
        ..Recorder::default()
    });
    let mut first = Box::pin(timer.sleep(Duration::from_millis(50)));
    poll_pending(&mut first, &hostile);
    assert!(wait_until(WAIT, || hostile.names().len() == 1));
    assert!(wait_until(WAIT, || timer.stats().panicked == 1));
    assert!(
        hostile.names()[0].starts_with("wk-s"),
        "{:?}",
        hostile.names()
    );
    // The shards fire and wake after it.
    let calm = Arc::new(Recorder::default());
    let mut second = Box::pin(timer.sleep(Duration::from_millis(50)));
    poll_pending(&mut second, &calm);
    assert!(wait_until(WAIT, || calm.names().len() == 1));
    assert!(calm.names()[0].starts_with("wk-s"), "{:?}", calm.names());
    assert_eq!(timer.stats().panicked, 1);
    assert!(timer.shutdown().is_empty());
}

/// Where no shard watches another (one shard; rescue off), a future's wake leaves as
/// the mode says, as before: a pool worker wakes it, so that a waker that blocks holds
/// no shard. A schedule'd callback due meanwhile runs on time.
#[test]
fn without_a_rescuer_the_pool_wakes_the_task_and_a_blocking_waker_holds_no_shard() {
    for (shards, rescue) in [(1, Some(Duration::from_millis(4))), (2, None)] {
        let timer = ShardedTimer::builder()
            .shards(shards)
            .executor_threads(2)
            .rescue_after(rescue)
            .pin_cores(false)
            .thread_name("wk")
            .build()
            .unwrap();
        let blocker = Arc::new(Recorder {
            blocks: Some(Duration::from_millis(600)),
            ..Recorder::default()
        });
        let start = Instant::now();
        let mut blocking = Box::pin(timer.sleep(Duration::from_millis(50)));
        poll_pending(&mut blocking, &blocker);
        let ran_at = Arc::new(Mutex::new(None));
        let seen = ran_at.clone();
        let due = start + Duration::from_millis(70);
        timer
            .schedule_at(due, move || *seen.lock().unwrap() = Some(Instant::now()))
            .unwrap();
        assert!(wait_until(WAIT, || ran_at.lock().unwrap().is_some()));
        let late = ran_at.lock().unwrap().unwrap() - due;
        assert!(
            late < Duration::from_millis(300),
            "{shards} shard(s), rescue {rescue:?}: a callback ran {late:?} late behind a blocking waker"
        );
        assert!(wait_until(WAIT, || blocker.names().len() == 1));
        assert!(
            blocker.names()[0].starts_with("wk-w"),
            "{shards} shard(s), rescue {rescue:?}: woken on {:?}",
            blocker.names()
        );
        drop(blocking);
        assert!(timer.shutdown().is_empty());
    }
}

/// A waker that blocks its shard for 800 ms, in the pool mode: the shard's other
/// sleeps, due 10-30 ms after it starts, are woken by the shard that watches it (rescue,
/// default 4 ticks), well before the blocker returns. Bound: 300 ms late (a generous
/// allowance for a slow CI machine; without rescue they would be about 800 ms late).
#[test]
fn a_blocking_waker_in_the_pool_mode_is_rescued() {
    let timer = ShardedTimer::builder()
        .shards(2)
        .executor_threads(2)
        .pin_cores(false)
        .thread_name("wk")
        .build()
        .unwrap();
    let block = Duration::from_millis(800);
    // Made on core 0: every sleep goes to shard 0 (a sleep's shard is its core's).
    let results = on_each_core(1, |_| {
        let start = Instant::now();
        let blocker = Arc::new(Recorder {
            blocks: Some(block),
            ..Recorder::default()
        });
        let mut blocking = Box::pin(timer.sleep_until(start + Duration::from_millis(100)));
        poll_pending(&mut blocking, &blocker);
        let victims: Vec<_> = (0..20u64)
            .map(|i| {
                let deadline = start + Duration::from_millis(110 + i);
                let recorder = Arc::new(Recorder::default());
                let mut sleep = Box::pin(timer.sleep_until(deadline));
                poll_pending(&mut sleep, &recorder);
                (sleep, recorder, deadline)
            })
            .collect();
        assert!(
            wait_until(WAIT, || victims
                .iter()
                .all(|(_, r, _)| !r.names().is_empty())),
            "every victim woken"
        );
        let lateness: Vec<_> = victims
            .iter()
            .map(|(_, recorder, deadline)| {
                let at = recorder.woken_at.lock().unwrap().unwrap();
                assert!(at >= *deadline, "never early");
                at - *deadline
            })
            .collect();
        let rescued = victims
            .iter()
            .filter(|(_, r, _)| r.names() == ["wk-s1"])
            .count();
        assert!(wait_until(WAIT, || blocker.names().len() == 1));
        drop((blocking, victims));
        (lateness, rescued)
    });
    let (lateness, rescued) = &results[0];
    let worst = lateness.iter().max().unwrap();
    assert!(
        *worst < Duration::from_millis(300),
        "the blocked shard's other tasks woke {worst:?} late (rescued {rescued} of 20)"
    );
    assert!(*rescued > 0, "the rescuer woke none of them");
    assert!(timer.shutdown().is_empty());
}
