//! Outside audit of the futures' wake-up contract (`Sleep`, `Timeout`, `Interval`),
//! on the public API only: never a lost wake-up, never early, a drop or a reset only
//! cancels, the re-registered waker is the one woken, a waker's user code (a panic,
//! dropping a task that owns other sleeps, a shutdown) neither stalls nor breaks a
//! shard, a timeout first polled after shutdown is refused at once, and no waker or
//! timer is left behind.
//!
//! Every wait is bounded: a lost wake-up shows as a failed assertion, never a hang.

mod support;

use std::future::{pending, Future, Pending};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Wake, Waker};
use std::time::{Duration, Instant};

use sharded_timer::{ScheduleError, ShardedTimer, Sleep, Timeout};
use support::{joined_within, one_shard_timer, small_timer, wait_until, within, Rng, WAIT};

/// How long a pending future may wait for its wake after its deadline passed (or after
/// a shutdown) before we call it lost: generous (debug builds, AddressSanitizer, two
/// shared cores); a lost wake-up never arrives at all.
const LOST: Duration = Duration::from_secs(5);

/// A waker that counts its wakes and lets a thread wait for one.
#[derive(Default)]
struct Flag {
    wakes: AtomicUsize,
    woken: Mutex<bool>,
    cv: Condvar,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, SeqCst);
        *self.woken.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

impl Flag {
    fn new() -> Arc<Flag> {
        Arc::new(Flag::default())
    }
    fn wakes(&self) -> usize {
        self.wakes.load(SeqCst)
    }
    /// Waits up to `bound` for a wake; whether one came.
    fn wait(&self, bound: Duration) -> bool {
        let guard = self.woken.lock().unwrap();
        let (guard, _) = self.cv.wait_timeout_while(guard, bound, |w| !*w).unwrap();
        *guard
    }
}

/// Polls `future` once with a fresh `Waker` of `flag` (dropped again before return,
/// so `Arc::strong_count(flag)` afterwards counts only the clones the library kept).
fn poll_with<F: Future + ?Sized>(future: Pin<&mut F>, flag: &Arc<Flag>) -> Poll<F::Output> {
    let waker = Waker::from(flag.clone());
    future.poll(&mut Context::from_waker(&waker))
}

/// Polls that returned `Pending` after replacing another waker (re-registrations):
/// the fresh-waker test checks that its schedule really exercised them.
static REREGISTERED: AtomicUsize = AtomicUsize::new(0);

/// Waits until no clone of `flag` is left but ours; whether that happened in `WAIT`.
fn released(flag: &Arc<Flag>) -> bool {
    wait_until(WAIT, || Arc::strong_count(flag) == 1)
}

/// One of the futures under test, with the deadline it must not beat.
enum Fut {
    Sleep(Pin<Box<Sleep>>),
    Timeout(Pin<Box<Timeout<Pending<()>>>>),
}

impl Fut {
    /// One of six constructors, picked by `kind`, for a deadline `d` from now.
    fn make(timer: &ShardedTimer, kind: u64, d: Duration) -> Fut {
        match kind % 6 {
            0 => Fut::Sleep(Box::pin(timer.sleep(d))),
            1 => Fut::Sleep(Box::pin(timer.sleep_until(Instant::now() + d))),
            2 => Fut::Sleep(Box::pin(timer.try_sleep(d).expect("unbounded, running"))),
            3 => Fut::Timeout(Box::pin(timer.timeout(d, pending()))),
            4 => Fut::Timeout(Box::pin(timer.timeout_at(Instant::now() + d, pending()))),
            _ => Fut::Timeout(Box::pin(
                timer.try_timeout(d, pending()).expect("unbounded, running"),
            )),
        }
    }

    /// Polls once with `flag`; on `Ready`, what the future says about how it ended:
    /// `Ok(())` elapsed, `Err(refusal)` refused.
    fn poll(&mut self, flag: &Arc<Flag>) -> Poll<Result<(), ScheduleError>> {
        match self {
            Fut::Sleep(sleep) => match poll_with(sleep.as_mut(), flag) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(()) => Poll::Ready(match sleep.refused() {
                    None => {
                        assert!(sleep.is_elapsed(), "completed, not refused, not elapsed");
                        Ok(())
                    }
                    Some(refusal) => {
                        assert!(!sleep.is_elapsed(), "refused yet elapsed");
                        Err(refusal)
                    }
                }),
            },
            Fut::Timeout(timeout) => match poll_with(timeout.as_mut(), flag) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(())) => unreachable!("the inner future never completes"),
                Poll::Ready(Err(elapsed)) => Poll::Ready(elapsed.refused().map_or(Ok(()), Err)),
            },
        }
    }

    /// The deadline (a timeout's is fixed at its first pending poll: read it after).
    fn deadline(&self) -> Instant {
        match self {
            Fut::Sleep(sleep) => sleep.deadline().into_std(),
            Fut::Timeout(timeout) => timeout.deadline(),
        }
    }
}

/// Never early, strictly: an elapsed future completed at or after its deadline.
fn assert_not_early(fut: &Fut, at: Instant, what: &str) {
    let deadline = fut.deadline();
    assert!(
        at >= deadline,
        "{what}: completed {:?} before its deadline",
        deadline - at
    );
}

/// Drives `fut` to completion the way a strict executor would: re-polls only when
/// woken (a lost wake-up fails after `LOST`), with a fresh waker at every poll, and
/// sometimes re-polls at once with another waker (re-registration) instead of
/// waiting. Checks: never early; a waker replaced by a poll that returned `Pending`
/// is never woken and is released by that poll; each waker is woken at most once; a
/// wake means the next poll completes (the only wake source is the finish); no clone
/// of any waker outlives the future.
fn drive(mut fut: Fut, rng: &mut Rng, what: &str) -> Result<(), ScheduleError> {
    let started = Instant::now();
    let mut current = Flag::new();
    let mut replaced: Vec<Arc<Flag>> = Vec::new();
    let mut all: Vec<Arc<Flag>> = Vec::new();
    let mut woken_before = false;
    let outcome = loop {
        match fut.poll(&current) {
            Poll::Ready(outcome) => {
                let at = Instant::now();
                if outcome.is_ok() {
                    assert_not_early(&fut, at, what);
                }
                break outcome;
            }
            Poll::Pending => {
                assert!(
                    !woken_before,
                    "{what}: the last waker was woken, yet the next poll is Pending"
                );
                // The wakers this Pending poll replaced: released, and never woken.
                if !replaced.is_empty() {
                    REREGISTERED.fetch_add(1, SeqCst);
                }
                for old in replaced.drain(..) {
                    assert_eq!(old.wakes(), 0, "{what}: a replaced waker was woken");
                    assert_eq!(
                        Arc::strong_count(&old),
                        1,
                        "{what}: a replaced waker was kept by the timer"
                    );
                    all.push(old);
                }
            }
        }
        if rng.below(3) == 0 {
            // Re-register at once: poll again with another waker.
            if rng.below(2) == 0 {
                std::thread::yield_now();
            }
            replaced.push(std::mem::replace(&mut current, Flag::new()));
        } else {
            assert!(
                current.wait(LOST),
                "{what}: lost wake-up: pending {:?} past its deadline, never woken",
                Instant::now().saturating_duration_since(fut.deadline())
            );
            woken_before = true;
            all.push(std::mem::replace(&mut current, Flag::new()));
        }
        assert!(started.elapsed() < 2 * LOST, "{what}: never completed");
    };
    drop(fut);
    all.push(current);
    all.extend(replaced);
    for flag in &all {
        assert!(
            flag.wakes() <= 1,
            "{what}: a waker was woken {} times",
            flag.wakes()
        );
        assert!(released(flag), "{what}: a waker outlived its future");
    }
    outcome
}

/// Threads race first polls, re-polls with fresh wakers, and fires of tiny deadlines
/// (0–2 ms), on all six constructors: never a lost wake-up, never early, the
/// re-registered waker is the one woken, and nothing is left pending.
#[test]
fn fresh_wakers_racing_tiny_deadlines_lose_no_wake_and_never_complete_early() {
    let timer = small_timer();
    const THREADS: u64 = 6;
    let iterations: u64 = if cfg!(debug_assertions) { 250 } else { 600 };
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let timer = &timer;
            scope.spawn(move || {
                let mut rng = Rng::new(0xA0D1 + t);
                for i in 0..iterations {
                    let kind = rng.below(6);
                    let d = Duration::from_micros(rng.below(2_001));
                    let fut = Fut::make(timer, kind, d);
                    let what = format!("thread {t} iteration {i} kind {kind} {d:?}");
                    assert_eq!(drive(fut, &mut rng, &what), Ok(()), "{what}: refused");
                }
            });
        }
    });
    assert!(
        wait_until(WAIT, || timer.stats().pending == 0),
        "timers left pending: {:?}",
        timer.stats().pending
    );
    assert!(
        REREGISTERED.load(SeqCst) > 0,
        "no re-registration was exercised"
    );
    assert!(timer.shutdown().is_empty());
}

/// A future polled on one thread and moved to another between polls: the waker of
/// the thread that polled last is the one woken, and the first is released.
#[test]
fn a_future_moved_between_threads_wakes_the_last_poller() {
    let timer = small_timer();
    let (tx, rx) = std::sync::mpsc::channel::<(Fut, Arc<Flag>)>();
    let rounds = 300u64;
    let receiver = std::thread::spawn(move || {
        let mut rng = Rng::new(7);
        for (i, (mut fut, first)) in rx.iter().enumerate() {
            let what = format!("round {i}");
            let second = Flag::new();
            match fut.poll(&second) {
                Poll::Ready(outcome) => {
                    assert_eq!(outcome, Ok(()));
                    assert_not_early(&fut, Instant::now(), &what);
                }
                Poll::Pending => {
                    assert_eq!(
                        first.wakes(),
                        0,
                        "{what}: the first thread's waker was woken"
                    );
                    assert_eq!(Arc::strong_count(&first), 1, "{what}: first waker kept");
                    assert!(second.wait(LOST), "{what}: lost wake-up after the move");
                    assert_eq!(drive(fut, &mut rng, &what), Ok(()));
                    assert_eq!(
                        first.wakes(),
                        0,
                        "{what}: the first thread's waker was woken"
                    );
                }
            }
        }
    });
    let mut rng = Rng::new(11);
    for _ in 0..rounds {
        let d = Duration::from_micros(rng.below(2_001));
        let mut fut = Fut::make(&timer, rng.below(6), d);
        let first = Flag::new();
        if fut.poll(&first).is_ready() {
            assert_not_early(&fut, Instant::now(), "first poll");
            continue;
        }
        tx.send((fut, first)).unwrap();
    }
    drop(tx);
    let finished = wait_until(Duration::from_secs(60), || receiver.is_finished());
    assert!(finished, "the receiving thread hung (a lost wake-up?)");
    receiver.join().unwrap();
    assert!(wait_until(WAIT, || timer.stats().pending == 0));
}

/// Dropping a pending future wakes nobody and releases its waker on the dropping
/// thread at once; a reset that moves a pending timer in place wakes nobody; a reset
/// into the past wakes the waiting task once and its next poll completes.
#[test]
fn a_drop_or_a_reset_in_place_wakes_nobody_and_releases_the_waker() {
    let timer = small_timer();
    let far = Duration::from_secs(60);
    for kind in 0..6 {
        let mut fut = Fut::make(&timer, kind, far);
        let flag = Flag::new();
        assert!(fut.poll(&flag).is_pending());
        assert_eq!(
            Arc::strong_count(&flag),
            2,
            "kind {kind}: the timer keeps one clone"
        );
        drop(fut);
        assert_eq!(
            Arc::strong_count(&flag),
            1,
            "kind {kind}: released by the drop"
        );
        assert_eq!(flag.wakes(), 0, "kind {kind}: a drop woke the task");
    }
    // A reset in place (pending, to another future deadline): no wake, same waker.
    let mut sleep = Box::pin(timer.sleep(far));
    let flag = Flag::new();
    assert!(poll_with(sleep.as_mut(), &flag).is_pending());
    for k in 1..50u64 {
        let deadline = Instant::now() + far + Duration::from_millis(k);
        sleep.as_mut().reset(deadline.into());
    }
    assert_eq!(flag.wakes(), 0, "a reset in place woke the task");
    assert_eq!(Arc::strong_count(&flag), 2);
    // Reset into the past: the waiting task is woken once; the next poll completes.
    sleep.as_mut().reset(Instant::now().into());
    assert!(
        flag.wait(LOST),
        "a reset to the past left the waiting task asleep"
    );
    assert_eq!(flag.wakes(), 1);
    assert!(released(&flag));
    let again = Flag::new();
    assert!(poll_with(sleep.as_mut(), &again).is_ready());
    assert!(sleep.is_elapsed());
    drop(sleep);
    assert!(released(&again));
    assert_eq!(again.wakes(), 0);
    // An interval's pending tick, dropped: no wake.
    let mut interval = timer.interval(far);
    let first = Flag::new();
    let waker = Waker::from(first.clone());
    assert!(interval
        .poll_tick(&mut Context::from_waker(&waker))
        .is_ready());
    assert!(interval
        .poll_tick(&mut Context::from_waker(&waker))
        .is_pending());
    drop(waker);
    drop(interval);
    assert_eq!(first.wakes(), 0, "dropping an interval woke the task");
    assert_eq!(Arc::strong_count(&first), 1);
    assert!(wait_until(WAIT, || timer.stats().pending == 0));
}

/// Resets racing the fire of tiny deadlines (in place, replaced, into the past),
/// polled with fresh wakers: the last waker is always woken, and the sleep completes
/// only at or after the latest reset's deadline.
#[test]
fn reset_storms_racing_the_fire_never_complete_early_nor_lose_the_wake() {
    let timer = small_timer();
    let steps: u64 = if cfg!(debug_assertions) { 400 } else { 1_000 };
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let timer = &timer;
            scope.spawn(move || {
                let mut rng = Rng::new(0x5E7 + t);
                let mut sleep = Box::pin(timer.sleep(Duration::from_micros(rng.below(2_000))));
                let mut flags = Vec::new();
                for step in 0..steps {
                    let what = format!("thread {t} step {step}");
                    let flag = Flag::new();
                    let waiting = match poll_with(sleep.as_mut(), &flag) {
                        Poll::Ready(()) => {
                            let at = Instant::now();
                            let deadline = sleep.deadline().into_std();
                            assert!(at >= deadline, "{what}: {:?} early", deadline - at);
                            assert!(sleep.is_elapsed() && sleep.refused().is_none(), "{what}");
                            None
                        }
                        Poll::Pending => Some(flag.clone()),
                    };
                    flags.push(flag);
                    // Reset: into the past, or 0–2 ms ahead.
                    let new = match rng.below(5) {
                        0 => Instant::now() - Duration::from_micros(rng.below(500)),
                        _ => Instant::now() + Duration::from_micros(rng.below(2_000)),
                    };
                    if rng.below(4) != 0 {
                        sleep.as_mut().reset(new.into());
                    }
                    // A task that was pending is woken: by the fire, the reset, or
                    // the moved timer at its new deadline.
                    if let Some(w) = waiting {
                        if rng.below(2) == 0 {
                            assert!(w.wait(LOST), "{what}: lost wake-up around a reset");
                        }
                    }
                }
                // Finish: wait out the last deadline.
                let last = Flag::new();
                let mut polls = 0;
                while poll_with(sleep.as_mut(), &last).is_pending() {
                    assert!(last.wait(LOST), "thread {t}: lost wake-up at the end");
                    polls += 1;
                    assert!(polls < 3, "thread {t}: woken, yet pending again");
                }
                assert!(Instant::now() >= sleep.deadline().into_std());
                drop(sleep);
                flags.push(last);
                for flag in &flags {
                    assert!(flag.wakes() <= 1, "thread {t}: a waker woken twice");
                    assert!(released(flag), "thread {t}: a waker outlived its sleep");
                }
            });
        }
    });
    assert!(wait_until(WAIT, || timer.stats().pending == 0));
}

/// Shutdown racing first polls (which arm a timeout's timer with the waker inside)
/// and later polls: every pending future is woken, refused futures say `Shutdown`,
/// and once `shutdown` returned a first poll is refused at once and wakes nobody.
#[test]
fn shutdown_racing_first_polls_wakes_every_pending_future() {
    let rounds = if cfg!(debug_assertions) { 12 } else { 30 };
    for round in 0..rounds {
        let timer = small_timer();
        let stop = AtomicBool::new(false);
        let mut rng = Rng::new(round);
        let gap = Duration::from_micros(rng.below(3_000));
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let (timer, stop) = (&timer, &stop);
                scope.spawn(move || {
                    let mut rng = Rng::new(round * 100 + t);
                    let mut n = 0;
                    // Until well after the shutdown: first polls before, during, after.
                    while !stop.load(SeqCst) || n < 40 {
                        n += 1;
                        // Mostly long deadlines: only the shutdown can end those.
                        let d = if rng.below(4) == 0 {
                            Duration::from_micros(rng.below(2_000))
                        } else {
                            Duration::from_secs(60)
                        };
                        let mut fut = Fut::make_infallible(timer, rng.below(4), d);
                        if rng.below(2) == 0 {
                            std::thread::yield_now();
                        }
                        let what = format!("round {round} thread {t} future {n} {d:?}");
                        let flag = Flag::new();
                        let outcome = match fut.poll(&flag) {
                            Poll::Ready(outcome) => outcome,
                            Poll::Pending => {
                                assert!(flag.wait(LOST), "{what}: pending, never woken");
                                let again = Flag::new();
                                match fut.poll(&again) {
                                    Poll::Ready(outcome) => outcome,
                                    Poll::Pending => panic!("{what}: woken, still pending"),
                                }
                            }
                        };
                        match outcome {
                            Ok(()) => assert_not_early(&fut, Instant::now(), &what),
                            Err(refusal) => assert_eq!(refusal, ScheduleError::Shutdown),
                        }
                        drop(fut);
                        assert!(released(&flag), "{what}: a waker outlived its future");
                        assert!(flag.wakes() <= 1);
                    }
                });
            }
            std::thread::sleep(gap);
            let unfired = timer.shutdown();
            assert!(
                unfired.is_empty(),
                "round {round}: a future's timer handed back"
            );
            stop.store(true, SeqCst);
        });
        // After shutdown returned: a first poll is refused at once, wakes nobody,
        // keeps no waker (timeouts armed lazily and sleeps armed when made).
        for kind in 0..6 {
            let flag = Flag::new();
            let mut fut = match kind {
                0..=3 => Fut::make_infallible(&timer, kind, Duration::from_secs(60)),
                4 => Fut::Timeout(Box::pin(timer.timeout(Duration::ZERO, pending()))),
                _ => Fut::Timeout(Box::pin(
                    timer.timeout_at(Instant::now() + Duration::from_millis(1), pending()),
                )),
            };
            match fut.poll(&flag) {
                Poll::Ready(outcome) if kind != 4 => {
                    assert_eq!(outcome, Err(ScheduleError::Shutdown), "kind {kind}");
                }
                Poll::Ready(_) => {} // a zero timeout may have elapsed: its deadline is now
                Poll::Pending => panic!("round {round} kind {kind}: pending after shutdown"),
            }
            assert_eq!(flag.wakes(), 0, "kind {kind}: the refusal woke the task");
            drop(fut);
            assert_eq!(Arc::strong_count(&flag), 1, "kind {kind}: waker kept");
        }
        assert!(matches!(
            timer.try_sleep(Duration::from_secs(1)),
            Err(ScheduleError::Shutdown)
        ));
    }
}

impl Fut {
    /// As [`make`](Self::make), the infallible constructors only.
    fn make_infallible(timer: &ShardedTimer, kind: u64, d: Duration) -> Fut {
        match kind % 4 {
            0 => Fut::Sleep(Box::pin(timer.sleep(d))),
            1 => Fut::Sleep(Box::pin(timer.sleep_until(Instant::now() + d))),
            2 => Fut::Timeout(Box::pin(timer.timeout(d, pending()))),
            _ => Fut::Timeout(Box::pin(timer.timeout_at(Instant::now() + d, pending()))),
        }
    }
}

/// A `Timeout` around a future that is pending, then made ready (and woken) by
/// another thread at a random moment racing the timeout's own fire: exactly one
/// outcome, never early, the last waker woken, nothing kept.
#[test]
fn a_timeout_around_a_future_that_becomes_ready_races_its_fire_cleanly() {
    /// Pending until `ready` is set; stores its last waker for the setter.
    struct Gate(Arc<(AtomicBool, Mutex<Option<Waker>>)>);
    impl Future for Gate {
        type Output = u32;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u32> {
            *self.0 .1.lock().unwrap() = Some(cx.waker().clone());
            if self.0 .0.load(SeqCst) {
                Poll::Ready(7)
            } else {
                Poll::Pending
            }
        }
    }
    let timer = small_timer();
    let mut rng = Rng::new(99);
    let rounds = if cfg!(debug_assertions) { 300 } else { 800 };
    let (mut oks, mut errs) = (0, 0);
    for round in 0..rounds {
        let shared = Arc::new((AtomicBool::new(false), Mutex::new(None::<Waker>)));
        let d = Duration::from_micros(rng.below(2_001));
        let mut timeout = Box::pin(timer.timeout(d, Gate(shared.clone())));
        let opener = {
            let shared = shared.clone();
            let after = Duration::from_micros(rng.below(2_001));
            std::thread::spawn(move || {
                std::thread::sleep(after);
                shared.0.store(true, SeqCst);
                if let Some(waker) = shared.1.lock().unwrap().take() {
                    waker.wake();
                }
            })
        };
        let mut flags = Vec::new();
        let result = loop {
            let flag = Flag::new();
            let poll = poll_with(timeout.as_mut(), &flag);
            flags.push(flag.clone());
            match poll {
                Poll::Ready(result) => break result,
                Poll::Pending => assert!(flag.wait(LOST), "round {round}: lost wake-up"),
            }
        };
        match result {
            Ok(7) => oks += 1,
            Ok(_) => unreachable!(),
            Err(elapsed) => {
                errs += 1;
                assert_eq!(
                    elapsed.refused(),
                    None,
                    "round {round}: refused while running"
                );
                let deadline = timeout.deadline();
                let at = Instant::now();
                assert!(at >= deadline, "round {round}: {:?} early", deadline - at);
            }
        }
        opener.join().unwrap();
        drop(timeout);
        shared.1.lock().unwrap().take();
        for flag in &flags {
            assert!(
                released(flag),
                "round {round}: a waker outlived its timeout"
            );
        }
    }
    assert!(
        oks > 0 && errs > 0,
        "both outcomes raced: {oks} ok, {errs} elapsed"
    );
    assert!(wait_until(WAIT, || timer.stats().pending == 0));
}

/// A waker whose `wake` panics, and one whose drop panics, run on a shard thread: the
/// panic is caught there; the shard goes on waking other sleeps on time.
#[test]
fn a_waker_that_panics_in_wake_or_drop_does_not_stop_its_shard() {
    struct PanicWake(AtomicUsize);
    impl Wake for PanicWake {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
            panic!("audit: a waker whose wake panics");
        }
    }
    struct PanicDrop(Arc<AtomicUsize>);
    impl Wake for PanicDrop {
        fn wake(self: Arc<Self>) {}
    }
    impl Drop for PanicDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
            if !std::thread::panicking() {
                panic!("audit: a waker whose drop panics");
            }
        }
    }
    joined_within("panicking wakers", Duration::from_secs(30), || {
        let timer = one_shard_timer();
        for round in 0..20 {
            // wake panics.
            let panicky = Arc::new(PanicWake(AtomicUsize::new(0)));
            let mut a = Box::pin(timer.sleep(Duration::from_millis(1)));
            let waker = Waker::from(panicky.clone());
            assert!(a
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
            drop(waker);
            // drop panics: ours is released first, so the timer's clone is the last.
            let drops = Arc::new(AtomicUsize::new(0));
            let mut b = Box::pin(timer.timeout(Duration::from_millis(1), pending::<()>()));
            let waker = Waker::from(Arc::new(PanicDrop(drops.clone())));
            assert!(b
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
            drop(waker);
            assert!(
                wait_until(WAIT, || panicky.0.load(SeqCst) == 1),
                "round {round}"
            );
            assert!(
                wait_until(WAIT, || drops.load(SeqCst) == 1),
                "round {round}"
            );
            assert!(
                released_arc(&panicky),
                "round {round}: the panicking waker kept"
            );
            // The same shard still wakes a well-behaved sleep.
            let mut c = Box::pin(timer.sleep(Duration::from_millis(1)));
            let flag = Flag::new();
            if poll_with(c.as_mut(), &flag).is_pending() {
                assert!(flag.wait(LOST), "round {round}: the shard stopped waking");
            }
            assert!(poll_with(c.as_mut(), &Flag::new()).is_ready());
            assert!(poll_with(a.as_mut(), &Flag::new()).is_ready());
            assert!(poll_with(b.as_mut(), &Flag::new()).is_ready());
        }
        assert!(wait_until(WAIT, || timer.stats().pending == 0));
    });
}

fn released_arc<T>(arc: &Arc<T>) -> bool {
    wait_until(WAIT, || Arc::strong_count(arc) == 1)
}

/// A waker that is its task's last reference: firing the sleep wakes it on a shard
/// thread and so drops the task there, and the task owns a thousand other pending
/// sleeps (and timeouts) on the same one-shard service with a tiny ring: their
/// cancels are posted from the shard's own thread. No deadlock; they are all cancelled,
/// and the shard goes on waking sleeps.
#[test]
fn a_waker_that_drops_a_task_owning_other_sleeps_on_the_shard_thread() {
    type Timeouts = Mutex<Vec<Pin<Box<Timeout<Pending<()>>>>>>;
    #[allow(dead_code, reason = "held only to be dropped with the task")]
    struct Task {
        sleeps: Mutex<Vec<Pin<Box<Sleep>>>>,
        timeouts: Timeouts,
        dropped_on: Arc<Mutex<Option<String>>>,
    }
    impl Wake for Task {
        fn wake(self: Arc<Self>) {}
    }
    impl Drop for Task {
        fn drop(&mut self) {
            let name = std::thread::current().name().unwrap_or("?").to_owned();
            *self.dropped_on.lock().unwrap() = Some(name);
        }
    }
    for shards in [1, 2] {
        joined_within(
            "a task dropped by its waker",
            Duration::from_secs(30),
            move || {
                let timer = ShardedTimer::builder()
                    .shards(shards)
                    .executor_threads(1)
                    .pin_cores(false)
                    .ring_capacity(4)
                    .thread_name("audit")
                    .build()
                    .unwrap();
                for round in 0..3 {
                    let dropped_on = Arc::new(Mutex::new(None));
                    let noop = Waker::from(Flag::new());
                    let mut timeouts = Vec::new();
                    for _ in 0..300 {
                        let mut t =
                            Box::pin(timer.timeout(Duration::from_secs(60), pending::<()>()));
                        assert!(t
                            .as_mut()
                            .poll(&mut Context::from_waker(&noop))
                            .is_pending());
                        timeouts.push(t);
                    }
                    let sleeps = (0..700)
                        .map(|_| Box::pin(timer.sleep(Duration::from_secs(60))))
                        .collect();
                    let task = Arc::new(Task {
                        sleeps: Mutex::new(sleeps),
                        timeouts: Mutex::new(timeouts),
                        dropped_on: dropped_on.clone(),
                    });
                    let mut a = Box::pin(timer.sleep(Duration::from_millis(2)));
                    let waker = Waker::from(task);
                    assert!(a
                        .as_mut()
                        .poll(&mut Context::from_waker(&waker))
                        .is_pending());
                    drop(waker); // the timer's clone is now the task's last reference
                    assert!(
                        wait_until(WAIT, || dropped_on.lock().unwrap().is_some()),
                        "round {round}: the task was never dropped (its sleep's wake lost?)"
                    );
                    // Where it went: a service thread (shard or worker), never ours.
                    let on = dropped_on.lock().unwrap().clone().unwrap();
                    assert!(on.starts_with("audit-"), "round {round}: dropped on {on}");
                    assert!(
                        wait_until(WAIT, || timer.stats().pending <= 1),
                        "round {round}: the dropped task's timers stayed pending: {}",
                        timer.stats().pending
                    );
                    let flag = Flag::new();
                    let mut c = Box::pin(timer.sleep(Duration::from_millis(1)));
                    if poll_with(c.as_mut(), &flag).is_pending() {
                        assert!(flag.wait(LOST), "round {round}: the shard stopped waking");
                    }
                    assert!(poll_with(a.as_mut(), &Flag::new()).is_ready());
                }
                assert!(wait_until(WAIT, || timer.stats().pending == 0));
                assert!(timer.shutdown().is_empty());
            },
        );
    }
}

/// A waker that calls `shutdown` from its wake (on the shard thread, for a timer
/// that fired) returns, and the shutdown wakes the other pending futures, refused.
#[test]
fn a_waker_that_shuts_the_service_down_from_the_shard_thread() {
    struct ShutsDown(Mutex<Option<ShardedTimer>>, AtomicBool);
    impl Wake for ShutsDown {
        fn wake(self: Arc<Self>) {
            let timer = self.0.lock().unwrap().take();
            if let Some(timer) = timer {
                drop(timer.shutdown());
                self.1.store(true, SeqCst);
            }
        }
    }
    for builder in [
        ShardedTimer::builder().shards(2).executor_threads(1),
        ShardedTimer::builder().shards(1).executor_threads(1),
    ] {
        let timer = builder
            .pin_cores(false)
            .thread_name("audit")
            .build()
            .unwrap();
        let result = within(Duration::from_secs(30), move || {
            let waiting: Vec<_> = (0..20)
                .map(|k| {
                    let mut fut = Fut::make_infallible(&timer, k, Duration::from_secs(60));
                    let flag = Flag::new();
                    assert!(fut.poll(&flag).is_pending());
                    (fut, flag)
                })
                .collect();
            let shuts = Arc::new(ShutsDown(
                Mutex::new(Some(timer.clone())),
                AtomicBool::new(false),
            ));
            let mut a = Box::pin(timer.sleep(Duration::from_millis(2)));
            let waker = Waker::from(shuts.clone());
            assert!(a
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
            drop(waker);
            assert!(
                wait_until(LOST, || shuts.1.load(SeqCst)),
                "shutdown from a waker did not return"
            );
            for (k, (mut fut, flag)) in waiting.into_iter().enumerate() {
                assert!(flag.wait(LOST), "future {k}: not woken by the shutdown");
                assert_eq!(
                    fut.poll(&Flag::new()),
                    Poll::Ready(Err(ScheduleError::Shutdown))
                );
                drop(fut);
                assert!(released(&flag));
            }
            assert!(poll_with(a.as_mut(), &Flag::new()).is_ready());
            assert!(timer.shutdown().is_empty());
        });
        assert!(result.is_some(), "a shutdown called from a waker hung");
    }
}

/// A tokio multi-thread runtime (tasks migrate between workers between polls) with
/// many tasks mixing sleeps, timeouts around sleeps and resets, tiny deadlines:
/// everything completes (bounded), never early.
#[test]
fn tokio_multi_thread_many_tasks_never_early_never_hang() {
    let timer = small_timer();
    let tasks: u64 = if cfg!(debug_assertions) { 150 } else { 400 };
    let each: u64 = 20;
    let done = within(Duration::from_secs(60), move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(3)
            .build()
            .unwrap();
        let spawner = timer.clone();
        runtime.block_on(async move {
            let timer = spawner;
            let mut handles = Vec::new();
            for task in 0..tasks {
                let timer = timer.clone();
                handles.push(tokio::spawn(async move {
                    let mut rng = Rng::new(task + 1_000);
                    for _ in 0..each {
                        let d = Duration::from_micros(rng.below(2_001));
                        match rng.below(4) {
                            0 => {
                                let sleep = timer.sleep(d);
                                let deadline = sleep.deadline().into_std();
                                sleep.await;
                                assert!(Instant::now() >= deadline, "a sleep woke early");
                            }
                            1 => {
                                let inner = Duration::from_micros(rng.below(2_001));
                                let made = Instant::now();
                                let mut t = Box::pin(timer.timeout(d, timer.sleep(inner)));
                                let result = (&mut t).await;
                                let at = Instant::now();
                                match result {
                                    Ok(()) => assert!(at >= made + inner, "inner early"),
                                    Err(e) => {
                                        assert!(e.refused().is_none());
                                        assert!(at >= t.deadline() && at >= made + d, "early");
                                    }
                                }
                            }
                            2 => {
                                let mut sleep = Box::pin(timer.sleep(d));
                                // Pending once, then reset (earlier or later) and awaited.
                                let _ = futures_poll_once(sleep.as_mut()).await;
                                let new = Instant::now() + Duration::from_micros(rng.below(2_001));
                                sleep.as_mut().reset(new.into());
                                sleep.as_mut().await;
                                assert!(Instant::now() >= new, "a reset sleep woke early");
                            }
                            _ => {
                                let deadline = Instant::now() + d;
                                let r = timer.timeout_at(deadline, pending::<()>()).await;
                                assert!(r.is_err() && Instant::now() >= deadline);
                            }
                        }
                    }
                }));
            }
            for handle in handles {
                handle.await.expect("a task panicked");
            }
        });
        timer
    });
    let timer = done.expect("tasks hung: a lost wake-up");
    assert!(wait_until(WAIT, || timer.stats().pending == 0));
}

/// Polls `future` once, returning whether it was ready.
async fn futures_poll_once<F: Future + Unpin>(mut future: F) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut future).poll(cx).is_ready())).await
}

/// An interval polled with fresh wakers, 1 ms period: each tick woken, never before
/// the instant it reports as due.
#[test]
fn an_interval_with_fresh_wakers_never_ticks_early_and_loses_no_wake() {
    let timer = small_timer();
    let mut interval = timer.interval(Duration::from_millis(1));
    let mut last = None;
    for tick in 0..100 {
        let flag = Flag::new();
        let waker = Waker::from(flag.clone());
        let due = match interval.poll_tick(&mut Context::from_waker(&waker)) {
            Poll::Ready(due) => due,
            Poll::Pending => {
                assert!(flag.wait(LOST), "tick {tick}: lost wake-up");
                match interval.poll_tick(&mut Context::from_waker(&Waker::from(Flag::new()))) {
                    Poll::Ready(due) => due,
                    Poll::Pending => panic!("tick {tick}: woken yet pending"),
                }
            }
        };
        assert!(Instant::now() >= due.into_std(), "tick {tick} early");
        if let Some(last) = last {
            assert!(due > last, "tick {tick}: not after the last");
        }
        last = Some(due);
    }
    drop(interval);
    assert!(wait_until(WAIT, || timer.stats().pending == 0));
}

/// A hand-made waker (`RawWakerVTable`) that counts wakes, may panic in `clone`, and
/// records the thread each of its clones is dropped on.
struct Raw {
    panic_clone: bool,
    /// Whether `wake` panics (after counting the wake and giving back its count).
    panic_wake: bool,
    /// How long each clone blocks (a slow user clone: it widens the window in which a
    /// poll stores its waker).
    clone_delay: Duration,
    wakes: AtomicUsize,
    dropped_on: Mutex<Vec<String>>,
}

impl Raw {
    fn new(panic_clone: bool) -> Arc<Raw> {
        Raw::slow(panic_clone, Duration::ZERO)
    }

    fn slow(panic_clone: bool, clone_delay: Duration) -> Arc<Raw> {
        Raw::with(panic_clone, false, clone_delay)
    }

    /// A waker whose `wake` panics.
    fn panicking_in_wake() -> Arc<Raw> {
        Raw::with(false, true, Duration::ZERO)
    }

    fn with(panic_clone: bool, panic_wake: bool, clone_delay: Duration) -> Arc<Raw> {
        Arc::new(Raw {
            panic_clone,
            panic_wake,
            clone_delay,
            wakes: AtomicUsize::new(0),
            dropped_on: Mutex::new(Vec::new()),
        })
    }

    fn waker(self: &Arc<Raw>) -> Waker {
        let ptr = Arc::into_raw(self.clone()).cast::<()>();
        // SAFETY: `ptr` is an `Arc<Raw>`'s, owned by the new waker; the vtable keeps
        // the count (RawWaker's contract).
        unsafe { Waker::from_raw(RawWaker::new(ptr, &RAW_VTABLE)) }
    }

    const fn vtable() -> RawWakerVTable {
        unsafe fn clone(ptr: *const ()) -> RawWaker {
            // SAFETY: a live waker's pointer: an `Arc<Raw>` it owns a count of.
            let raw = unsafe { &*ptr.cast::<Raw>() };
            if !raw.clone_delay.is_zero() {
                std::thread::sleep(raw.clone_delay);
            }
            if raw.panic_clone {
                panic!("audit: a waker whose clone panics");
            }
            // SAFETY: as above; the clone owns the new count.
            unsafe { Arc::increment_strong_count(ptr.cast::<Raw>()) };
            RawWaker::new(ptr, &RAW_VTABLE)
        }
        unsafe fn wake(ptr: *const ()) {
            // SAFETY: the waker's pointer, consumed: wake then drop.
            let panics = unsafe { &*ptr.cast::<Raw>() }.panic_wake;
            // SAFETY: as above.
            unsafe { wake_by_ref(ptr) };
            // SAFETY: as above; this consumes the waker's count.
            unsafe { drop_raw(ptr) };
            if panics {
                panic!("audit: a waker whose wake panics");
            }
        }
        unsafe fn wake_by_ref(ptr: *const ()) {
            // SAFETY: a live waker's pointer.
            unsafe { &*ptr.cast::<Raw>() }.wakes.fetch_add(1, SeqCst);
        }
        unsafe fn drop_raw(ptr: *const ()) {
            // SAFETY: a live waker's pointer, whose count this drop gives back.
            let raw = unsafe { Arc::from_raw(ptr.cast::<Raw>()) };
            let name = std::thread::current().name().unwrap_or("?").to_owned();
            raw.dropped_on
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(name);
        }
        RawWakerVTable::new(clone, wake, wake_by_ref, drop_raw)
    }
}

static RAW_VTABLE: RawWakerVTable = Raw::vtable();

/// Polls `sleep` with `bad`'s waker, whose `clone` panics (as an executor that
/// catches a task's panic would): the panic comes through the poll.
fn poll_panicking_in_clone(sleep: &mut Pin<Box<Sleep>>, bad: &Arc<Raw>) {
    let bad_waker = bad.waker();
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        let _ = sleep.as_mut().poll(&mut Context::from_waker(&bad_waker));
    }));
    assert!(
        panicked.is_err(),
        "the user's clone panicked through the poll"
    );
}

/// Found by this audit (fixed: `PollUnwind` in `src/entry/sleep.rs` clears POLLING
/// when a poll unwinds out of the clone): a waker whose `clone` panics inside
/// `Sleep::poll`. The poll stores the new waker between setting
/// the state word's POLLING bit and clearing it (`SleepShared::poll_finished`), and the
/// clone is user code run inside that window; a panic there unwinds with POLLING left
/// set for good. Then:
/// - dropping the sleep does not cancel its timer (`give_up`'s disarm CAS expects the
///   word to be exactly WAITING, sees WAITING|POLLING, fails, and skips the cancel): the
///   timer stays pending until its deadline ("dropping only cancels" broken: a
///   60 s timeout leaks for 60 s);
/// - the waker stored by the earlier poll is not taken out by the drop: it stays in the
///   entry, and when the timer fires the finish leaves it to the "poll under way"
///   (POLLING), so it is never woken and is dropped with the entry's last reference,
///   on the shard thread ("no waker outlives its future in the entry").
///
/// A runtime that catches a task's panic (tokio does) drops the future exactly so.
#[test]
fn a_waker_whose_clone_panics_mid_poll_leaves_the_sleep_uncancellable() {
    let timer = ShardedTimer::builder()
        .shards(1)
        .executor_threads(1)
        .pin_cores(false)
        .thread_name("audit")
        .build()
        .unwrap();
    // The deadline is well past the bound on the cancel below, so that a cancel that
    // never happened is not hidden by the timer firing.
    let deadline = Duration::from_millis(1000);
    let good = Raw::new(false);
    let bad = Raw::new(true);
    let mut sleep = Box::pin(timer.sleep(deadline));
    let waker = good.waker();
    assert!(sleep
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    drop(waker);
    assert_eq!(
        Arc::strong_count(&good),
        2,
        "the timer keeps the good waker"
    );
    poll_panicking_in_clone(&mut sleep, &bad);
    // Filed through the ring when the shard's token was busy: counted once taken.
    assert!(wait_until(Duration::from_millis(500), || timer
        .stats()
        .pending
        == 1));
    // The runtime drops the task's future: the sleep must cancel its timer, and the
    // waker it stored must be released here, on this thread, unwoken.
    drop(sleep);
    let cancelled = wait_until(Duration::from_millis(600), || timer.stats().pending == 0);
    let released_here = Arc::strong_count(&good) == 1;
    // Let the deadline pass to see where the stored waker goes.
    std::thread::sleep(deadline + Duration::from_millis(100));
    assert!(released_arc(&good));
    let dropped_on = good.dropped_on.lock().unwrap().clone();
    assert!(
        cancelled && released_here,
        "dropping the sleep did not cancel its timer (cancelled: {cancelled}) nor release \
         its waker (released at the drop: {released_here}); the waker was woken {} times \
         and its clones were dropped on {dropped_on:?}",
        good.wakes.load(SeqCst)
    );
    assert!(timer.shutdown().is_empty());
}

/// Found by this audit, same root cause as the test above (fixed likewise): after a poll
/// whose waker `clone` panicked (caught by an executor that keeps the task), the
/// waker registered by the task's previous, successful poll is never woken when the
/// deadline passes: the finish sees POLLING still set and leaves the wake to a poll
/// that is no longer under way. A lost wake-up (HEAD~1, with its mutex, woke it).
#[test]
fn a_waker_whose_clone_panics_mid_poll_loses_the_previous_wakers_wake() {
    let timer = small_timer();
    let good = Raw::new(false);
    let bad = Raw::new(true);
    let mut sleep = Box::pin(timer.sleep(Duration::from_millis(20)));
    let waker = good.waker();
    assert!(sleep
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    drop(waker);
    poll_panicking_in_clone(&mut sleep, &bad);
    let woken = wait_until(Duration::from_secs(2), || good.wakes.load(SeqCst) == 1);
    let dropped_on = good.dropped_on.lock().unwrap().clone();
    assert!(
        woken,
        "lost wake-up: the deadline passed {:?} ago and the registered waker was never \
         woken (its clones were dropped on {:?})",
        Instant::now().saturating_duration_since(sleep.deadline().into_std()),
        dropped_on
    );
    assert!(poll_with(sleep.as_mut(), &Flag::new()).is_ready());
}

/// The same panic, with the timer firing while the panicking clone runs (it sleeps
/// 50 ms first, past the 2 ms deadline): the finish sees the poll under way and leaves
/// the wake to it; the poll unwinds, and its guard wakes the waker stored by the
/// earlier poll, once, as the finish would have (the session's own check of the fix's
/// other branch).
#[test]
fn a_fire_during_a_panicking_clone_still_wakes_the_previous_waker() {
    fire_during_a_panicking_clone(
        &Raw::new(false),
        Duration::from_millis(2),
        Duration::from_millis(50),
    );
}

/// As above, and the earlier waker's `wake` panics too: the guard's wake runs while
/// the clone's panic unwinds, and a second panic escaping the guard's drop aborted the
/// process (noted in session 20, fixed since: the guard catches the wake's panic and
/// drops its payload). The clone's panic comes through the poll; the earlier waker
/// is woken once and released; the sleep completes at its next poll.
#[test]
fn a_fire_during_a_panicking_clone_wakes_a_panicking_waker_without_aborting() {
    // The clone outlasts the deadline by far, so the fire lands inside it even on a
    // loaded machine.
    fire_during_a_panicking_clone(
        &Raw::panicking_in_wake(),
        Duration::from_millis(20),
        Duration::from_millis(150),
    );
}

/// A sleep of `deadline` polled first with `good`'s waker, then with a waker whose
/// clone blocks for `clone_delay` (past the deadline) and panics: the fire lands in
/// the clone; the panic comes through the poll, `good` is woken once, the sleep
/// completes at its next poll, and both wakers are released.
fn fire_during_a_panicking_clone(good: &Arc<Raw>, deadline: Duration, clone_delay: Duration) {
    let timer = small_timer();
    let bad = Raw::slow(true, clone_delay);
    let mut sleep = Box::pin(timer.sleep(deadline));
    let waker = good.waker();
    assert!(sleep
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    drop(waker);
    poll_panicking_in_clone(&mut sleep, &bad);
    assert!(
        wait_until(LOST, || good.wakes.load(SeqCst) == 1),
        "the fire during the panicking poll woke nobody"
    );
    assert!(poll_with(sleep.as_mut(), &Flag::new()).is_ready());
    assert_eq!(good.wakes.load(SeqCst), 1, "woken once");
    drop(sleep);
    assert!(released_arc(good));
    assert!(released_arc(&bad));
    assert!(timer.shutdown().is_empty());
}

/// A waker whose `clone` blocks 0–1.5 ms, on polls of sleeps and timeouts due within
/// 0–2 ms: the fire lands inside the window in which a poll stores its waker (the
/// handshake's POLLING window) often. Whatever the interleaving, the poll completes or
/// its waker is woken, once, and is released afterwards.
#[test]
fn a_fire_inside_a_slow_waker_clone_is_never_lost() {
    let timer = small_timer();
    let mut rng = Rng::new(0x51_0e);
    let rounds = if cfg!(debug_assertions) { 300 } else { 600 };
    let mut pending_polls = 0;
    for round in 0..rounds {
        let d = Duration::from_micros(rng.below(2_001));
        let mut fut = Fut::make(&timer, rng.below(6), d);
        // A first poll with a plain waker, so the slow one goes through the handshake.
        let first = Flag::new();
        if fut.poll(&first).is_ready() {
            continue;
        }
        let slow = Raw::slow(false, Duration::from_micros(rng.below(1_501)));
        let waker = slow.waker();
        let mut cx = Context::from_waker(&waker);
        let polled = match &mut fut {
            Fut::Sleep(sleep) => sleep.as_mut().poll(&mut cx).is_ready(),
            Fut::Timeout(timeout) => timeout.as_mut().poll(&mut cx).is_ready(),
        };
        drop(waker);
        if !polled {
            pending_polls += 1;
            assert!(
                wait_until(LOST, || slow.wakes.load(SeqCst) == 1),
                "round {round}: lost wake-up: a fire during the slow clone woke nobody"
            );
            assert!(
                fut.poll(&Flag::new()).is_ready(),
                "round {round}: woken, pending"
            );
        }
        assert_not_early(&fut, Instant::now(), &format!("round {round}"));
        drop(fut);
        assert!(
            released_arc(&slow),
            "round {round}: the slow waker was kept"
        );
        assert!(released(&first));
        assert!(slow.wakes.load(SeqCst) <= 1);
    }
    assert!(pending_polls > 0, "no slow poll was left pending");
    assert!(wait_until(WAIT, || timer.stats().pending == 0));
}
