//! Audit of when `timeout(d, f)` fixes its deadline, through the public API only: at
//! the first poll at which `f` is pending, as the earlier of a coarse upper bound on
//! the time the `Timeout` was made plus `d` and the precise now at that poll plus `d`.
//!
//! Every claim is measured against `Instant::now()` read *before* `timeout(...)` was
//! called ("made"): never before `made + d`, never later than the value `deadline()`
//! returned before the first poll, exact on a `ManualClock`; `timeout_at` unchanged.
//! Each wait is bounded by [`WAIT`]; every thread is joined.

use std::future::{pending, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use sharded_timer::{Elapsed, ManualClock, ScheduleError, ShardedTimer, Timeout};

/// The bound on every wait in this file.
const WAIT: Duration = Duration::from_secs(2);

/// The delays every test tries: zero, one nanosecond, below and around the default
/// 1 ms tick, around a 250 Hz kernel tick (4 ms: the coarse clock's), and longer.
const DELAYS: [Duration; 9] = [
    Duration::ZERO,
    Duration::from_nanos(1),
    Duration::from_micros(1),
    Duration::from_micros(999),
    Duration::from_millis(1),
    Duration::from_nanos(1_000_001),
    Duration::from_millis(4),
    Duration::from_nanos(4_000_001),
    Duration::from_millis(17),
];

/// A year of 365.25 days.
const YEAR: Duration = Duration::from_secs(31_557_600);

/// A service with two shards and one pool thread (the machine has two cores).
fn small_timer() -> ShardedTimer {
    ShardedTimer::builder()
        .shards(2)
        .executor_threads(1)
        .build()
        .expect("builds")
}

/// A service on `clock`, one shard.
fn manual_timer(clock: &ManualClock) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(1)
        .executor_threads(1)
        .clock(clock.clone())
        .build()
        .expect("builds")
}

/// A context whose waker does nothing.
fn noop_cx() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

/// Polls `future` once with a waker that does nothing.
fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut noop_cx())
}

/// A hand-written executor with a bound: poll, park until woken or `limit` passes.
/// `None` if the future was still pending after `limit`.
fn block_within<F: Future + ?Sized>(mut future: Pin<&mut F>, limit: Duration) -> Option<F::Output> {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let give_up = Instant::now() + limit;
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return Some(output);
        }
        let now = Instant::now();
        if now >= give_up {
            return None;
        }
        std::thread::park_timeout(give_up - now);
    }
}

/// Waits until `condition` holds or [`WAIT`] passes; whether it held.
fn wait_until(mut condition: impl FnMut() -> bool) -> bool {
    let give_up = Instant::now() + WAIT;
    while Instant::now() < give_up {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    condition()
}

/// A future that is ready at its `ready_at`-th poll (1-based), with that poll's number.
#[derive(Debug)]
struct ReadyAt {
    polls: u32,
    ready_at: u32,
}

impl ReadyAt {
    fn new(ready_at: u32) -> ReadyAt {
        ReadyAt { polls: 0, ready_at }
    }
}

impl Future for ReadyAt {
    type Output = u32;
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<u32> {
        self.polls += 1;
        if self.polls >= self.ready_at {
            Poll::Ready(self.polls)
        } else {
            Poll::Pending
        }
    }
}

/// Threads that spin until dropped: a loaded machine beside the test.
struct Busy {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Busy {
    fn start(threads: usize) -> Busy {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Busy { stop, threads }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            thread.join().expect("a busy thread never panics");
        }
    }
}

/// One broken claim, for the report.
struct Broken {
    what: &'static str,
    delay: Duration,
    by: Duration,
}

/// Checks one `timeout(d, NeverReady)` made after `made`: the bound before the first
/// poll, and, if `poll`, the deadline that poll fixes. Returns what broke.
fn check_one(timer: &ShardedTimer, d: Duration, poll: bool) -> Vec<Broken> {
    let mut broken = Vec::new();
    let made = Instant::now();
    let mut timeout = pin!(timer.timeout(d, pending::<()>()));
    let unfixed = timeout.deadline();
    if unfixed < made + d {
        broken.push(Broken {
            what: "unfixed deadline before made + d",
            delay: d,
            by: made + d - unfixed,
        });
    }
    if !poll {
        return broken;
    }
    let polled = poll_once(timeout.as_mut());
    let after_poll = Instant::now();
    let fixed = timeout.deadline();
    if fixed < made + d {
        broken.push(Broken {
            what: "fixed deadline before made + d",
            delay: d,
            by: made + d - fixed,
        });
    }
    if fixed > unfixed {
        broken.push(Broken {
            what: "first poll moved the deadline later",
            delay: d,
            by: fixed - unfixed,
        });
    }
    if fixed > after_poll + d {
        broken.push(Broken {
            what: "fixed deadline after the poll's now + d",
            delay: d,
            by: fixed - (after_poll + d),
        });
    }
    match polled {
        Poll::Pending => {}
        Poll::Ready(Ok(())) => unreachable!("pending() never completes"),
        Poll::Ready(Err(elapsed)) => {
            if elapsed.refused().is_some() {
                broken.push(Broken {
                    what: "a running service refused the timer",
                    delay: d,
                    by: Duration::ZERO,
                });
            }
            if after_poll < fixed || after_poll < made + d {
                broken.push(Broken {
                    what: "elapsed at the first poll before its deadline",
                    delay: d,
                    by: fixed.max(made + d) - after_poll,
                });
            }
        }
    }
    broken
}

/// Four threads sample `timeout(d, _)` for every delay in [`DELAYS`] for 250 ms while
/// two threads spin beside them: the deadline before the first poll (the coarse upper
/// bound) and the one that poll fixes are never before `made + d`; the poll never
/// moves it later, nor past its own now plus `d`.
#[test]
fn a_timeout_deadline_is_never_before_made_plus_d_from_four_threads_on_a_loaded_machine() {
    let timer = small_timer();
    let busy = Busy::start(2);
    let run_for = Duration::from_millis(250);
    let samplers: Vec<_> = (0..4)
        .map(|k| {
            let timer = timer.clone();
            std::thread::spawn(move || {
                let mut broken = Vec::new();
                let mut samples = 0u64;
                let end = Instant::now() + run_for;
                while Instant::now() < end {
                    for d in DELAYS {
                        // Every 8th sample is polled (and arms a timer, cancelled on
                        // drop); the others only read the bound.
                        broken.extend(check_one(&timer, d, (samples + k).is_multiple_of(8)));
                        samples += 1;
                    }
                }
                (samples, broken)
            })
        })
        .collect();
    let mut samples = 0;
    let mut broken = Vec::new();
    for sampler in samplers {
        let (n, b) = sampler.join().expect("a sampler never panics");
        samples += n;
        broken.extend(b);
    }
    drop(busy);
    assert!(samples >= 1_000, "too few samples to judge: {samples}");
    let examples: Vec<String> = broken
        .iter()
        .take(5)
        .map(|b| format!("{} (d {:?}) by {:?}", b.what, b.delay, b.by))
        .collect();
    assert!(
        broken.is_empty(),
        "{} of {samples} samples broke a claim, e.g. {examples:?}",
        broken.len()
    );
    assert!(
        timer.shutdown().is_empty(),
        "a timeout's timer never comes back"
    );
}

/// The same through `sharded_timer::time::timeout` (the process-wide service) and a
/// service made current with `enter`: the free function's deadline obeys the same
/// bounds.
#[test]
fn the_free_timeout_on_global_and_entered_services_is_never_before_made_plus_d() {
    let entered = small_timer();
    for use_entered in [false, true] {
        let _guard = use_entered.then(|| entered.enter());
        for _ in 0..200 {
            for d in DELAYS {
                let made = Instant::now();
                let mut timeout = pin!(sharded_timer::time::timeout(d, pending::<()>()));
                let unfixed = timeout.deadline();
                assert!(
                    unfixed >= made + d,
                    "entered {use_entered}, {d:?}: bound early"
                );
                let polled = poll_once(timeout.as_mut());
                let fixed = timeout.deadline();
                assert!(
                    fixed >= made + d,
                    "entered {use_entered}, {d:?}: fixed early"
                );
                assert!(
                    fixed <= unfixed,
                    "entered {use_entered}, {d:?}: moved later"
                );
                if let Poll::Ready(result) = polled {
                    assert_eq!(result, Err(elapsed_none()), "{d:?}");
                    assert!(Instant::now() >= made + d, "{d:?}: elapsed early");
                }
            }
        }
    }
    assert!(entered.shutdown().is_empty());
}

/// `Elapsed` with `refused() == None`, built from a timeout that really elapsed.
fn elapsed_none() -> Elapsed {
    let clock = ManualClock::new();
    let timer = manual_timer(&clock);
    let mut timeout = pin!(timer.timeout(Duration::ZERO, pending::<()>()));
    match poll_once(timeout.as_mut()) {
        Poll::Ready(Err(elapsed)) => {
            assert_eq!(elapsed.refused(), None);
            elapsed
        }
        other => panic!("a zero timeout on a manual clock elapses at once: {other:?}"),
    }
}

/// Timeouts that really elapse, first polled at once, after a spin of 2 ms, or after a
/// 25 ms sleep (past the coarse bound's slack), on the thread that made them or on
/// another one: each completes `Err(Elapsed)` (not refused) no earlier than `made + d`
/// and than its fixed deadline, and at most [`WAIT`] late.
#[test]
fn timeouts_never_elapse_before_made_plus_d_when_first_polled_late_or_elsewhere() {
    let timer = small_timer();
    let workers: Vec<_> = (0..4u32)
        .map(|k| {
            let timer = timer.clone();
            std::thread::spawn(move || {
                let mut outcomes = Vec::new();
                for (i, d) in DELAYS.into_iter().enumerate() {
                    let wait = match (i as u32 + k) % 3 {
                        0 => Duration::ZERO,
                        1 => Duration::from_millis(2),
                        _ => Duration::from_millis(25),
                    };
                    let elsewhere = (i as u32 + k) % 2 == 1;
                    let made = Instant::now();
                    let mut timeout = Box::pin(timer.timeout(d, pending::<()>()));
                    if wait == Duration::from_millis(2) {
                        while made.elapsed() < wait {
                            std::hint::spin_loop();
                        }
                    } else {
                        std::thread::sleep(wait);
                    }
                    let mut run = move || {
                        let result = block_within(timeout.as_mut(), WAIT);
                        (result, Instant::now(), timeout.deadline())
                    };
                    let (result, at, fixed) = if elsewhere {
                        std::thread::spawn(run).join().expect("never panics")
                    } else {
                        run()
                    };
                    outcomes.push((d, wait, elsewhere, made, result, at, fixed));
                }
                outcomes
            })
        })
        .collect();
    for worker in workers {
        for (d, wait, elsewhere, made, result, at, fixed) in worker.join().expect("joins") {
            let case = format!("d {d:?}, first poll after {wait:?}, elsewhere {elsewhere}");
            let result = result.unwrap_or_else(|| panic!("{case}: still pending after {WAIT:?}"));
            assert_eq!(result.map_err(|e| e.refused()), Err(None), "{case}");
            assert!(
                fixed >= made + d,
                "{case}: deadline {:?} early",
                made + d - fixed
            );
            assert!(
                at >= fixed,
                "{case}: elapsed {:?} before its deadline",
                fixed - at
            );
            assert!(at >= made + d, "{case}: elapsed before made + d");
        }
    }
    assert!(timer.shutdown().is_empty());
}

/// First polled 40 ms after it was made (longer than the coarse bound's slack), a
/// timeout's deadline is the bound it reported before the poll, not the poll's now
/// plus `d`; and one whose bound has passed by then elapses at that first poll.
#[test]
fn a_timeout_first_polled_long_after_creation_counts_from_creation() {
    let timer = small_timer();
    let d = Duration::from_millis(100);
    let made = Instant::now();
    let mut timeout = pin!(timer.timeout(d, pending::<()>()));
    let unfixed = timeout.deadline();
    std::thread::sleep(Duration::from_millis(40));
    let poll_at = Instant::now();
    assert!(
        poll_once(timeout.as_mut()).is_pending(),
        "100 ms not yet past"
    );
    assert_eq!(timeout.deadline(), unfixed, "kept the bound from creation");
    assert!(unfixed >= made + d);
    assert!(
        unfixed < poll_at + d,
        "counted from creation, not from the poll"
    );
    let result = block_within(timeout.as_mut(), WAIT).expect("elapses within the bound");
    assert_eq!(result.map_err(|e| e.refused()), Err(None));
    assert!(Instant::now() >= unfixed);

    // d = 5 ms, first polled once its bound has passed: elapsed at that poll.
    let d = Duration::from_millis(5);
    let made = Instant::now();
    let mut timeout = pin!(timer.timeout(d, pending::<()>()));
    let unfixed = timeout.deadline();
    assert!(wait_until(|| Instant::now() > unfixed), "the bound passes");
    match poll_once(timeout.as_mut()) {
        Poll::Ready(Err(elapsed)) => assert_eq!(elapsed.refused(), None),
        other => panic!("a bound already past elapses at the first poll: {other:?}"),
    }
    assert!(timeout.deadline() >= made + d);
    assert!(timer.shutdown().is_empty());
}

/// A future ready at its first poll passes through for every delay (zero and
/// `Duration::MAX` included) and arms no timer: 1000 of them schedule nothing.
#[test]
fn a_timeout_whose_future_is_ready_at_once_passes_through_and_arms_no_timer() {
    let timer = ShardedTimer::builder().shards(1).build().expect("builds");
    let delays = [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_secs(1),
        Duration::MAX,
    ];
    for k in 0..1_000u32 {
        let d = delays[k as usize % delays.len()];
        let made = Instant::now();
        let mut timeout = pin!(timer.timeout(d, std::future::ready(k)));
        assert_eq!(poll_once(timeout.as_mut()), Poll::Ready(Ok(k)), "{d:?}");
        // The deadline stays the bound: never before made + d (saturated for MAX).
        let expected = made.checked_add(d);
        if let Some(expected) = expected {
            assert!(timeout.deadline() >= expected, "{d:?}");
        }
    }
    let past = Instant::now() - Duration::from_millis(5);
    let mut at_past = pin!(timer.timeout_at(past, std::future::ready(7)));
    assert_eq!(
        poll_once(at_past.as_mut()),
        Poll::Ready(Ok(7)),
        "past instant passes too"
    );
    let stats = timer.stats();
    assert_eq!((stats.scheduled, stats.pending, stats.in_rings), (0, 0, 0));
    assert!(timer.shutdown().is_empty());
}

/// A future ready at its 2nd or 3rd poll: the first poll arms the timer and fixes the
/// deadline, later polls leave it, the output passes through, and dropping the
/// completed timeout cancels its timer (pending back to 0). With `d = 0` the first
/// pending poll elapses instead.
#[test]
fn a_timeout_ready_at_a_later_poll_keeps_its_first_fixed_deadline_and_cancels_its_timer() {
    let timer = ShardedTimer::builder().shards(1).build().expect("builds");
    for ready_at in [2u32, 3] {
        let d = Duration::from_secs(1);
        let made = Instant::now();
        let mut timeout = Box::pin(timer.timeout(d, ReadyAt::new(ready_at)));
        assert!(poll_once(timeout.as_mut()).is_pending());
        let fixed = timeout.deadline();
        assert!(fixed >= made + d);
        let mut last = Poll::Pending;
        for _ in 1..ready_at {
            last = poll_once(timeout.as_mut());
            assert_eq!(
                timeout.deadline(),
                fixed,
                "only the first pending poll fixes it"
            );
        }
        assert_eq!(last, Poll::Ready(Ok(ready_at)));
        drop(timeout);
    }
    assert!(
        wait_until(|| {
            let stats = timer.stats();
            stats.pending == 0 && stats.in_rings == 0 && stats.cancelled == 2
        }),
        "both timers cancelled: {:?}",
        timer.stats()
    );
    assert_eq!(timer.stats().scheduled, 2, "one timer per timeout");

    let mut zero = pin!(timer.timeout(Duration::ZERO, ReadyAt::new(2)));
    match poll_once(zero.as_mut()) {
        Poll::Ready(Err(elapsed)) => assert_eq!(elapsed.refused(), None),
        other => panic!("d = 0 elapses at the first pending poll: {other:?}"),
    }
    assert!(timer.shutdown().is_empty());
}

/// Polled again after its deadline passed, a timeout whose future is ready by then
/// resolves `Ok`: the future is polled first at every poll (as tokio's).
#[test]
fn a_timeout_whose_future_is_ready_after_the_deadline_passed_still_resolves_ok() {
    let timer = ShardedTimer::builder().shards(1).build().expect("builds");
    let d = Duration::from_millis(1);
    let mut timeout = pin!(timer.timeout(d, ReadyAt::new(2)));
    assert!(poll_once(timeout.as_mut()).is_pending());
    let deadline = timeout.deadline();
    assert!(wait_until(
        || Instant::now() > deadline + Duration::from_millis(5)
    ));
    assert_eq!(poll_once(timeout.as_mut()), Poll::Ready(Ok(2)));
    assert!(timer.shutdown().is_empty());
}

/// `into_inner`, `get_mut` and drop, before and after the first poll: before it no
/// timer exists; after it the timer is cancelled, and the inner future is the same
/// one (its poll count carried over).
#[test]
fn into_inner_get_mut_and_drop_around_the_first_poll_leave_nothing_pending() {
    let timer = ShardedTimer::builder().shards(1).build().expect("builds");
    // Before the first poll.
    drop(timer.timeout(Duration::from_secs(5), pending::<()>()));
    let inner = timer
        .timeout(Duration::from_secs(5), ReadyAt::new(3))
        .into_inner();
    assert_eq!(inner.polls, 0);
    let stats = timer.stats();
    assert_eq!(
        (stats.scheduled, stats.pending),
        (0, 0),
        "never polled: no timer"
    );

    // After a pending first poll.
    let mut timeout = Box::pin(timer.timeout(Duration::from_secs(5), ReadyAt::new(3)));
    assert!(poll_once(timeout.as_mut()).is_pending());
    timeout.as_mut().get_mut().get_mut().ready_at = 2; // ready at the next poll
    assert_eq!(timeout.get_ref().polls, 1);
    let inner = Pin::into_inner(timeout).into_inner();
    assert_eq!(
        (inner.polls, inner.ready_at),
        (1, 2),
        "the same future comes back"
    );
    assert!(
        wait_until(|| {
            let stats = timer.stats();
            (stats.scheduled, stats.cancelled, stats.pending) == (1, 1, 0)
        }),
        "into_inner cancelled the timer: {:?}",
        timer.stats()
    );
    // get_mut makes the inner future ready: the next poll is Ok.
    let mut timeout = Box::pin(timer.timeout(Duration::from_secs(5), ReadyAt::new(9)));
    assert!(poll_once(timeout.as_mut()).is_pending());
    timeout.as_mut().get_mut().get_mut().ready_at = 2;
    assert_eq!(poll_once(timeout.as_mut()), Poll::Ready(Ok(2)));
    drop(timeout);
    assert!(
        wait_until(|| timer.stats().pending == 0),
        "{:?}",
        timer.stats()
    );
    assert!(timer.shutdown().is_empty());
}

/// A timeout made before `shutdown` and first polled after it, one made after it, and
/// one pending across it: each completes `Err` at once saying `Shutdown`, unless its
/// deadline has really passed (`d = 0`); none comes back from `shutdown`.
#[test]
fn a_timeout_first_polled_after_shutdown_completes_at_once_saying_shutdown() {
    let timer = small_timer();
    let made_before = timer.timeout(Duration::from_secs(10), pending::<()>());
    let zero_before = timer.timeout(Duration::ZERO, pending::<()>());
    let (tx, rx) = mpsc::channel();
    let waiting = {
        let mut across = Box::pin(timer.timeout(Duration::from_secs(10), pending::<()>()));
        assert!(poll_once(across.as_mut()).is_pending());
        std::thread::spawn(move || {
            tx.send(()).expect("the test waits");
            block_within(across.as_mut(), WAIT)
        })
    };
    rx.recv_timeout(WAIT).expect("the waiter started");
    assert!(timer.shutdown().is_empty(), "no timeout's timer comes back");
    let across = waiting
        .join()
        .expect("joins")
        .expect("woken by the shutdown");
    assert_eq!(
        across.map_err(|e| e.refused()),
        Err(Some(ScheduleError::Shutdown))
    );

    let mut made_before = pin!(made_before);
    let mut made_after = pin!(timer.timeout(Duration::from_secs(10), pending::<()>()));
    for (name, timeout) in [
        ("made before", made_before.as_mut()),
        ("made after", made_after.as_mut()),
    ] {
        match poll_once(timeout) {
            Poll::Ready(Err(elapsed)) => {
                assert_eq!(elapsed.refused(), Some(ScheduleError::Shutdown), "{name}")
            }
            other => panic!("{name}: completes at once after shutdown: {other:?}"),
        }
    }
    let mut zero_before = pin!(zero_before);
    match poll_once(zero_before.as_mut()) {
        Poll::Ready(Err(elapsed)) => {
            // Either is true: its deadline passed, and the service is down.
            if elapsed.refused().is_none() {
                assert!(Instant::now() >= zero_before.deadline());
            }
        }
        other => panic!("d = 0 after shutdown completes at once: {other:?}"),
    }
}

/// On a `ManualClock` the deadline is exactly `made + d`, before and after a first
/// poll taken after the clock moved, and the timeout elapses exactly there: not a
/// nanosecond early, and at once when first polled after it.
#[test]
fn on_a_manual_clock_the_deadline_is_exactly_made_plus_d_whenever_first_polled() {
    let clock = ManualClock::new();
    let timer = manual_timer(&clock);
    clock.advance(Duration::from_nanos(123_456_789)); // off the tick grid
    for d in DELAYS
        .into_iter()
        .chain([Duration::from_secs(30), 200 * YEAR])
    {
        let made = clock.now();
        let mut timeout = pin!(timer.timeout(d, pending::<()>()));
        assert_eq!(timeout.deadline(), made + d, "{d:?}: before the first poll");
        let half = d / 2;
        clock.advance(half);
        let polled = poll_once(timeout.as_mut());
        assert_eq!(timeout.deadline(), made + d, "{d:?}: the poll kept it");
        if d == Duration::ZERO {
            assert_eq!(
                polled.map(|r| r.map_err(|e| e.refused())),
                Poll::Ready(Err(None))
            );
            continue;
        }
        assert!(polled.is_pending(), "{d:?}: pending before made + d");
        clock.advance(d - half - Duration::from_nanos(1));
        assert!(
            poll_once(timeout.as_mut()).is_pending(),
            "{d:?}: 1 ns before, pending"
        );
        clock.advance(Duration::from_nanos(1));
        assert_eq!(
            poll_once(timeout.as_mut()).map(|r| r.map_err(|e| e.refused())),
            Poll::Ready(Err(None)),
            "{d:?}: elapsed exactly at made + d"
        );
    }
    // First polled after made + d: elapsed at that poll, deadline still made + d.
    let made = clock.now();
    let mut late = pin!(timer.timeout(Duration::from_millis(3), pending::<()>()));
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        poll_once(late.as_mut()).map(|r| r.map_err(|e| e.refused())),
        Poll::Ready(Err(None))
    );
    assert_eq!(late.deadline(), made + Duration::from_millis(3));
    assert!(timer.shutdown().is_empty());
}

/// Huge delays on a `ManualClock`: `Duration::MAX` and any delay past the far future
/// saturate there (the same instant as `sleep(Duration::MAX)`'s), exactly, and
/// `advance(Duration::MAX)` elapses them.
#[test]
fn on_a_manual_clock_huge_delays_saturate_exactly_at_the_far_future() {
    let clock = ManualClock::new();
    let timer = manual_timer(&clock);
    let far = timer.sleep(Duration::MAX).deadline().into_std();
    let huge = [
        Duration::MAX,
        Duration::from_nanos(u64::MAX),
        Duration::from_nanos(u64::MAX) + Duration::from_nanos(1),
        Duration::from_secs(u64::MAX / 2),
        300 * YEAR,
    ];
    let mut timeouts: Vec<_> = huge
        .iter()
        .map(|&d| {
            let made = clock.now();
            let timeout = Box::pin(timer.timeout(d, pending::<()>()));
            let expected = made.checked_add(d).map_or(far, |at| at.min(far));
            assert_eq!(timeout.deadline(), expected, "{d:?}");
            assert_eq!(expected, far, "{d:?} is past the far future");
            timeout
        })
        .collect();
    for timeout in &mut timeouts {
        assert!(poll_once(timeout.as_mut()).is_pending());
        assert_eq!(timeout.deadline(), far);
    }
    clock.advance(Duration::MAX);
    for timeout in &mut timeouts {
        assert_eq!(
            poll_once(timeout.as_mut()).map(|r| r.map_err(|e| e.refused())),
            Poll::Ready(Err(None)),
            "elapsed at the far future"
        );
    }
    assert!(timer.shutdown().is_empty());
}

/// Huge delays on the system clock: a delay past the far future saturates there
/// (never a panic), before and after the first poll; 200 years (within it) is never
/// before `made + d`, and the first poll never moves it later.
#[test]
fn on_the_system_clock_huge_delays_saturate_and_are_never_early() {
    let timer = small_timer();
    let far = timer.sleep(Duration::MAX).deadline().into_std();
    let huge = [
        Duration::MAX,
        Duration::from_nanos(u64::MAX),
        Duration::from_nanos(u64::MAX - 1),
        Duration::from_nanos(u64::MAX) + Duration::from_nanos(1),
        Duration::from_secs(u64::MAX / 2),
        300 * YEAR,
        200 * YEAR,
    ];
    for d in huge {
        let made = Instant::now();
        let mut timeout = pin!(timer.timeout(d, pending::<()>()));
        let unfixed = timeout.deadline();
        assert!(unfixed <= far, "{d:?}: beyond the far future");
        assert!(poll_once(timeout.as_mut()).is_pending(), "{d:?}");
        let after = Instant::now();
        let fixed = timeout.deadline();
        assert!(fixed <= unfixed, "{d:?}: moved later");
        match made.checked_add(d).filter(|&at| at < far) {
            Some(expected) => {
                assert!(fixed >= expected, "{d:?}: early");
                assert!(fixed <= after + d, "{d:?}: after the poll's now + d");
            }
            None => assert_eq!(fixed, far, "{d:?}: saturates at the far future"),
        }
    }
    assert!(timer.shutdown().is_empty());
}

/// `timeout_at` is unchanged: its deadline is exactly the instant asked for (off any
/// grid, in the past or not), before and after the first poll, and it elapses no
/// earlier.
#[test]
fn timeout_at_keeps_exactly_the_instant_asked_for() {
    let timer = small_timer();
    let asked = Instant::now() + Duration::from_millis(23) + Duration::from_nanos(7);
    let mut timeout = pin!(timer.timeout_at(asked, pending::<()>()));
    assert_eq!(timeout.deadline(), asked);
    assert!(poll_once(timeout.as_mut()).is_pending());
    assert_eq!(timeout.deadline(), asked);
    let result = block_within(timeout.as_mut(), WAIT).expect("elapses");
    assert_eq!(result.map_err(|e| e.refused()), Err(None));
    assert!(Instant::now() >= asked);
    assert_eq!(timeout.deadline(), asked);

    let past = Instant::now() - Duration::from_millis(1) - Duration::from_nanos(3);
    let mut timeout = pin!(timer.timeout_at(past, pending::<()>()));
    assert_eq!(timeout.deadline(), past);
    assert_eq!(
        poll_once(timeout.as_mut()).map(|r| r.map_err(|e| e.refused())),
        Poll::Ready(Err(None))
    );
    assert_eq!(
        timeout.deadline(),
        past,
        "a past instant is kept, not moved to now"
    );
    assert!(timer.shutdown().is_empty());
}

/// `max_pending`: the infallible `timeout` always gets its timer (a full service does
/// not refuse it, and it takes no room), while `try_timeout` is refused up front and
/// accepted again once room is freed. `try_timeout`'s deadline is read at creation.
#[test]
fn max_pending_refuses_try_timeout_but_never_the_infallible_timeout() {
    let timer = ShardedTimer::builder()
        .shards(1)
        .max_pending(1)
        .build()
        .expect("builds");
    let room = timer
        .schedule(Duration::from_secs(30), || {})
        .expect("room for one");
    let refused = timer.try_timeout(Duration::from_secs(1), pending::<()>());
    assert!(
        matches!(refused, Err(ScheduleError::TooManyPending { limit: 1 })),
        "{refused:?}"
    );
    let made = Instant::now();
    let mut infallible = pin!(timer.timeout(Duration::from_millis(5), pending::<()>()));
    assert!(
        poll_once(infallible.as_mut()).is_pending(),
        "not refused at its first poll"
    );
    let result = block_within(infallible.as_mut(), WAIT).expect("elapses");
    assert_eq!(
        result.map_err(|e| e.refused()),
        Err(None),
        "elapsed, not refused"
    );
    assert!(Instant::now() >= made + Duration::from_millis(5));

    assert!(room.cancel());
    let made = Instant::now();
    let accepted = timer
        .try_timeout(Duration::from_millis(50), pending::<()>())
        .expect("room again after the cancel");
    let after = Instant::now();
    let d = Duration::from_millis(50);
    assert!(accepted.deadline() >= made + d && accepted.deadline() <= after + d);
    // With that room taken, an infallible timeout still gets its timer and schedule
    // is refused (the try_ one holds the room).
    let mut infallible = pin!(timer.timeout(Duration::from_secs(1), pending::<()>()));
    assert!(poll_once(infallible.as_mut()).is_pending());
    assert!(matches!(
        timer.schedule(Duration::from_secs(1), || {}),
        Err(ScheduleError::TooManyPending { limit: 1 })
    ));
    drop(accepted);
    assert!(
        wait_until(|| timer.schedule(Duration::from_secs(1), || {}).is_ok()),
        "dropping the try_timeout frees its room"
    );
    drop(timer.shutdown());
}

/// A `Timeout` inside `tokio::select!`: losing to another branch drops it and cancels
/// its timer; winning, it elapses no earlier than `made + d`.
#[test]
fn a_timeout_inside_tokio_select_is_cancelled_when_it_loses_and_never_early_when_it_wins() {
    let timer = ShardedTimer::builder().shards(1).build().expect("builds");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        tokio::time::timeout(WAIT, async {
            tokio::select! {
                _ = timer.timeout(Duration::from_secs(5), pending::<()>()) => {
                    panic!("5 s cannot pass first");
                }
                () = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
            for d in [
                Duration::ZERO,
                Duration::from_nanos(1),
                Duration::from_millis(4),
            ] {
                let made = Instant::now();
                tokio::select! {
                    result = timer.timeout(d, pending::<()>()) => {
                        assert_eq!(result.map_err(|e| e.refused()), Err(None));
                        assert!(Instant::now() >= made + d, "{d:?}: early");
                    }
                    () = tokio::time::sleep(Duration::from_millis(500)) => {
                        panic!("{d:?}: the timeout did not win");
                    }
                }
            }
        })
        .await
        .expect("within the bound");
    });
    assert!(
        wait_until(|| {
            let stats = timer.stats();
            stats.pending == 0 && stats.cancelled >= 1
        }),
        "the losing timeout's timer was cancelled: {:?}",
        timer.stats()
    );
    assert!(timer.shutdown().is_empty());
}

/// A timeout first polled on one tokio runtime, then moved to a runtime on another
/// thread: it elapses there, no earlier than its deadline fixed on the first.
#[test]
fn a_timeout_moved_between_executors_after_its_first_poll_elapses_never_early() {
    let timer = small_timer();
    let d = Duration::from_millis(15);
    let made = Instant::now();
    let mut timeout: Pin<Box<Timeout<_>>> = Box::pin(timer.timeout(d, pending::<()>()));
    let first = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    first.block_on(std::future::poll_fn(|cx| {
        assert!(timeout.as_mut().poll(cx).is_pending());
        Poll::Ready(())
    }));
    drop(first);
    let fixed = timeout.deadline();
    assert!(fixed >= made + d);
    let elsewhere = std::thread::spawn(move || {
        let second = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        second.block_on(async {
            let result = tokio::time::timeout(WAIT, timeout.as_mut()).await;
            (result.expect("within the bound"), Instant::now())
        })
    });
    let (result, at) = elsewhere.join().expect("joins");
    assert_eq!(result.map_err(|e| e.refused()), Err(None));
    assert!(at >= fixed, "elapsed {:?} before its deadline", fixed - at);
    assert!(timer.shutdown().is_empty());
}

/// The environment variable that makes [`bound_probe_prints_how_far_ahead_the_bound_runs`]
/// measure instead of passing at once.
const PROBE_ENV: &str = "SHARDED_TIMER_AUDIT_BOUND_PROBE";

/// Not a check of its own: run by
/// [`the_bound_before_the_first_poll_is_at_most_four_coarse_ticks_late`] in a fresh
/// process (the coarse clock is calibrated once per process, at its first use), it
/// samples for 60 ms how far the bound `timeout(0, _).deadline()` runs ahead of an
/// `Instant` read right after the call, and prints the largest and smallest gap.
#[test]
fn bound_probe_prints_how_far_ahead_the_bound_runs() {
    if std::env::var_os(PROBE_ENV).is_none() {
        return;
    }
    let timer = ShardedTimer::builder().shards(1).build().expect("builds");
    let mut ahead_max = Duration::ZERO;
    let mut ahead_min = Duration::MAX;
    let end = Instant::now() + Duration::from_millis(60);
    while Instant::now() < end {
        let timeout = timer.timeout(Duration::ZERO, pending::<()>());
        let after = Instant::now();
        let ahead = timeout.deadline().saturating_duration_since(after);
        ahead_max = ahead_max.max(ahead);
        ahead_min = ahead_min.min(ahead);
    }
    println!("PROBE {} {}", ahead_max.as_nanos(), ahead_min.as_nanos());
    assert!(timer.shutdown().is_empty());
}

/// `Timeout::deadline`'s docs: the bound on the time a timeout was made is at most
/// "its calibration's width, plus the coarse clock's lag when it was calibrated (below
/// a kernel tick or two on a machine that is not overloaded), plus four kernel ticks"
/// late. In five fresh processes (each calibrating afresh), the bound's lead over an
/// `Instant` read *after* `timeout(0, _)` returned (so never more than its true lead)
/// is compared with six ticks (four, plus two for the lag), the tick `J` measured as
/// the spread of that lead over 60 ms (the coarse clock steps by `J`; preemption only
/// widens the spread, making the check more lenient), plus 500 µs for the
/// calibration's width. The lag depends on the machine's load (two spinning threads
/// beside it made it 2.2 ticks once), so the median process is judged, not each: the
/// docs once said "width plus four ticks", which 2 to 5 of 5 processes exceeded by up
/// to 3 ms (the lag at calibration, left out).
#[test]
fn the_bound_before_the_first_poll_is_at_most_six_coarse_ticks_late_in_the_median_process() {
    let exe = std::env::current_exe().expect("the test binary");
    let mut seen = Vec::new();
    for _ in 0..5 {
        let output = std::process::Command::new(&exe)
            .args([
                "--exact",
                "bound_probe_prints_how_far_ahead_the_bound_runs",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(PROBE_ENV, "1")
            .output()
            .expect("the probe runs");
        assert!(output.status.success(), "the probe failed: {output:?}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line = stdout
            .lines()
            .find_map(|line| line.split_once("PROBE ").map(|(_, rest)| rest))
            .unwrap_or_else(|| panic!("no probe line in {output:?}"));
        let mut numbers = line
            .split_whitespace()
            .map(|n| n.parse::<u64>().expect("a number"));
        let (ahead_max, ahead_min) = (numbers.next().expect("max"), numbers.next().expect("min"));
        let tick = ahead_max - ahead_min;
        let allowed = 6 * tick + 500_000;
        seen.push((ahead_max, tick, allowed));
    }
    let over: Vec<String> = seen
        .iter()
        .filter(|(ahead_max, _, allowed)| ahead_max > allowed)
        .map(|(ahead_max, tick, allowed)| {
            format!(
                "lead {:?} > 6 x tick {:?} + 0.5 ms = {:?}",
                Duration::from_nanos(*ahead_max),
                Duration::from_nanos(*tick),
                Duration::from_nanos(*allowed)
            )
        })
        .collect();
    assert!(over.len() <= 2, "{} of 5 processes: {over:?}", over.len());
}
