//! Outside audit of the change "a future's task is woken on the shard thread that
//! fired its timer in every `Callbacks` mode" (pool, spawn, rayon, inline), written
//! against the public API only. (Its findings narrowed the change to services where
//! a shard stuck in a waker is rescued: two shards or more, rescue on, the system
//! clock; elsewhere a wake leaves as the mode says. The tests here that use a
//! ManualClock, one shard or `rescue_after(None)` hold to that.)
//!
//! What is attacked: hostile wakers (panicking, with a payload that panics on drop,
//! blocking, calling `shutdown`, dropping the last service reference, resetting or
//! dropping sibling sleeps of the same shard, dropping their own task's sleeps,
//! re-polling from inside `wake`); `ManualClock::advance` waiting for every due wake in
//! every mode; exactly-once and never-early wakes under concurrent creation and
//! dropping; exact `stats()` counts; no waker leaked by shutdown; the spawner never
//! receiving a future's timer; rescue of a shard stuck in a waker.
//!
//! Every test takes `serial()` first: the machine has 2 cores, shared, and the
//! lateness bounds below must not measure another test of this file.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use sharded_timer::{
    Callbacks, Interval, ManualClock, Routing, ScheduleError, ShardedTimer, Sleep, Timeout,
};
use support::{wait_until, DropCounter, WAIT};

// ---------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------

static SERIAL: Mutex<()> = Mutex::new(());

/// One test at a time (timing bounds; thread counts).
fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A value a waker or a thread hands back to the test.
type HandedBack<T> = Arc<Mutex<Option<T>>>;

/// A polled sleep and the probe it was polled with.
type ArmedSleep = (Pin<Box<Sleep>>, Arc<Probe>);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

type Hook = Box<dyn Fn(usize) + Send + Sync>;

/// A waker that records every wake (time, thread name, count) and then runs a hook
/// (the hostile part) with the wake's number (1-based).
struct Probe {
    at: Mutex<Vec<Instant>>,
    names: Mutex<Vec<String>>,
    wakes: AtomicUsize,
    hook: Option<Hook>,
}

impl Probe {
    fn new() -> Arc<Probe> {
        Arc::new(Probe {
            at: Mutex::new(Vec::new()),
            names: Mutex::new(Vec::new()),
            wakes: AtomicUsize::new(0),
            hook: None,
        })
    }
    fn with(hook: impl Fn(usize) + Send + Sync + 'static) -> Arc<Probe> {
        Arc::new(Probe {
            at: Mutex::new(Vec::new()),
            names: Mutex::new(Vec::new()),
            wakes: AtomicUsize::new(0),
            hook: Some(Box::new(hook)),
        })
    }
    fn waker(self: &Arc<Self>) -> Waker {
        Waker::from(self.clone())
    }
    fn wakes(&self) -> usize {
        self.wakes.load(SeqCst)
    }
    fn first(&self) -> Option<Instant> {
        self.at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .first()
            .copied()
    }
    fn names(&self) -> Vec<String> {
        self.names.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Wake for Probe {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Instant::now());
        self.names.lock().unwrap_or_else(|e| e.into_inner()).push(
            std::thread::current()
                .name()
                .unwrap_or("<unnamed>")
                .to_owned(),
        );
        let n = self.wakes.fetch_add(1, SeqCst) + 1;
        if let Some(hook) = &self.hook {
            hook(n);
        }
    }
}

/// Polls `fut` once with `waker`.
fn poll_with<F: Future + ?Sized>(fut: Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(waker))
}

/// Polls `sleep` with `probe`; it must be pending.
fn arm(sleep: &mut Pin<Box<Sleep>>, probe: &Arc<Probe>) {
    assert!(
        poll_with(sleep.as_mut(), &probe.waker()).is_pending(),
        "a sleep due in the future is pending at its first poll"
    );
}

/// Runs `f` on a thread pinned to core `k` (sleeps made there go to shard `k`, and,
/// with `Routing::ByCore`, so do `schedule`s).
fn on_core<T: Send>(k: usize, f: impl FnOnce() -> T + Send) -> T {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    assert!(ids.len() > k, "core {k} needed, {} cores", ids.len());
    let id = ids[k];
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                assert!(core_affinity::set_for_current(id), "pinned to core {k}");
                f()
            })
            .join()
            .unwrap()
    })
}

#[cfg(feature = "rayon")]
fn rayon_pool() -> Arc<rayon::ThreadPool> {
    Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap(),
    )
}

/// Every callbacks mode; the spawner runs each `Callback` at once on the shard
/// thread that hands it over, and counts it.
fn modes(spawned: &Arc<AtomicUsize>) -> Vec<(&'static str, Callbacks)> {
    let count = spawned.clone();
    let modes = vec![
        ("pool", Callbacks::pool(2)),
        ("inline", Callbacks::inline()),
        (
            "spawn",
            Callbacks::spawn(move |callback| {
                count.fetch_add(1, SeqCst);
                callback.run();
            }),
        ),
    ];
    #[cfg(feature = "rayon")]
    let modes = {
        let mut modes = modes;
        modes.push(("rayon", Callbacks::rayon(rayon_pool())));
        modes
    };
    modes
}

fn builder(name: &str, callbacks: Callbacks) -> sharded_timer::Builder {
    ShardedTimer::builder()
        .shards(2)
        .callbacks(callbacks)
        .pin_cores(false)
        .routing(Routing::ByCore)
        .thread_name(name)
}

fn is_shard_thread(name: &str, prefix: &str) -> bool {
    name == format!("{prefix}-s0") || name == format!("{prefix}-s1")
}

/// The names of this process's threads (Linux).
fn thread_names() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let path = entry.ok()?.path().join("comm");
        Some(std::fs::read_to_string(path).ok()?.trim().to_owned())
    })
    .collect()
}

/// A panic payload whose own drop panics.
struct Bomb;
impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("audit: the panic payload's drop panics too");
    }
}

// ---------------------------------------------------------------------------------
// 1. Panicking wakers, in every mode: caught, counted exactly, the shard lives on.
// ---------------------------------------------------------------------------------

#[test]
fn panicking_wakers_are_counted_exactly_in_every_mode_and_the_shard_lives_on() {
    let _serial = serial();
    let spawned = Arc::new(AtomicUsize::new(0));
    for (mode, callbacks) in modes(&spawned) {
        spawned.store(0, SeqCst);
        let timer = builder("ap", callbacks).build().unwrap();
        // Deadlines 120-180 ms out (not 12-19 ms): each must still be ahead at its
        // first poll on a loaded machine (a run beside 4 busy loops saw one already
        // due there, which completes it with no timer).
        let made = Instant::now();
        let mut sleeps = Vec::new();
        let mut calm = Vec::new();
        let mut hostile = Vec::new();
        for i in 0..24 {
            let probe = match i % 3 {
                0 => Probe::new(),
                1 => Probe::with(|_| panic!("audit: a waker that panics")),
                _ => Probe::with(|_| std::panic::panic_any(Bomb)),
            };
            let mut sleep = Box::pin(timer.sleep(ms(150 + i % 5)));
            arm(&mut sleep, &probe);
            if i % 3 == 0 {
                calm.push(probe.clone());
            } else {
                hostile.push(probe.clone());
            }
            sleeps.push((sleep, probe));
        }
        // Timeouts and an interval with panicking wakers too.
        let mut timeouts = Vec::new();
        for _ in 0..4 {
            let probe = Probe::with(|_| panic!("audit: a timeout's waker that panics"));
            let mut timeout = Box::pin(timer.timeout(ms(180), std::future::pending::<()>()));
            assert!(poll_with(timeout.as_mut(), &probe.waker()).is_pending());
            timeouts.push((timeout, probe));
        }
        let mut interval = timer.interval(ms(120));
        let iprobe = Probe::with(|_| std::panic::panic_any(Bomb));
        assert!(interval
            .poll_tick(&mut Context::from_waker(&iprobe.waker()))
            .is_ready());
        assert!(interval
            .poll_tick(&mut Context::from_waker(&iprobe.waker()))
            .is_pending());
        // schedule callbacks that panic: 4.
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..4 {
            let ran = ran.clone();
            timer
                .schedule(ms(160), move || {
                    ran.fetch_add(1, SeqCst);
                    panic!("audit: a schedule callback that panics");
                })
                .unwrap();
        }
        assert!(
            wait_until(WAIT, || sleeps.iter().all(|(_, p)| p.wakes() >= 1)
                && timeouts.iter().all(|(_, p)| p.wakes() >= 1)
                && iprobe.wakes() >= 1
                && ran.load(SeqCst) == 4),
            "{mode}: every waker woken and every callback run"
        );
        // 16 sleeps + 4 timeouts + 1 interval wakers panicked, + 4 callbacks.
        let expected_panics = 16 + 4 + 1 + 4;
        let expected_fired = 24 + 4 + 1 + 4;
        assert!(
            wait_until(WAIT, || {
                let s = timer.stats();
                s.panicked >= expected_panics && s.fired >= expected_fired
            }),
            "{mode}: stats reach panicked {expected_panics}, fired {expected_fired}: {:?}",
            timer.stats()
        );
        // A fresh sleep round-trips through both shards (each alive) before the exact check.
        for k in 0..2 {
            let probe = Probe::new();
            let mut sleep = on_core(k, || Box::pin(timer.sleep(ms(30))));
            arm(&mut sleep, &probe);
            assert!(
                wait_until(WAIT, || probe.wakes() == 1),
                "{mode}: shard {k} still wakes after the panics"
            );
            assert!(
                is_shard_thread(&probe.names()[0], "ap"),
                "{mode}: woken on {:?}",
                probe.names()
            );
        }
        let stats = timer.stats();
        assert_eq!(stats.panicked, expected_panics, "{mode}: panicked, exact");
        assert_eq!(stats.fired, expected_fired + 2, "{mode}: fired, exact");
        assert_eq!(stats.pending, 0, "{mode}: nothing pending");
        for (sleep, probe) in &mut sleeps {
            assert_eq!(probe.wakes(), 1, "{mode}: woken exactly once");
            assert!(
                probe.first().unwrap() >= sleep.deadline().into_std(),
                "{mode}: woken early"
            );
            assert!(
                is_shard_thread(&probe.names()[0], "ap"),
                "{mode}: woken on {:?}, not a shard thread",
                probe.names()
            );
            assert!(poll_with(sleep.as_mut(), Waker::noop()).is_ready());
        }
        assert!(made.elapsed() < Duration::from_secs(10));
        assert_eq!(calm.len(), 8);
        assert_eq!(hostile.len(), 16);
        if mode == "spawn" {
            assert_eq!(
                spawned.load(SeqCst),
                4,
                "spawn: only the 4 schedule callbacks reached the spawner"
            );
        }
        assert!(timer.shutdown().is_empty());
    }
}

// ---------------------------------------------------------------------------------
// 2. The spawner never gets a future's timer (sleep, timeout, interval, time::*),
//    and gets every schedule callback; every future is woken on a shard thread.
// ---------------------------------------------------------------------------------

#[test]
fn the_spawner_gets_every_schedule_callback_and_no_future_timer() {
    let _serial = serial();
    let got = Arc::new(Mutex::new(Vec::new()));
    let seen = got.clone();
    let timer = builder(
        "as",
        Callbacks::spawn(move |callback| {
            seen.lock().unwrap().push(callback.id());
            callback.run();
        }),
    )
    .build()
    .unwrap();
    let mut probes = Vec::new();
    let mut sleeps = Vec::new();
    let mut timeouts = Vec::new();
    let mut ns_sleeps = Vec::new();
    let mut handles = Vec::new();
    let ran = Arc::new(AtomicUsize::new(0));
    for i in 0..20u64 {
        let probe = Probe::new();
        let mut sleep = Box::pin(timer.sleep(ms(5 + i % 7)));
        arm(&mut sleep, &probe);
        sleeps.push(sleep);
        probes.push(probe);
        let probe = Probe::new();
        let mut timeout = Box::pin(timer.timeout(ms(6 + i % 5), std::future::pending::<()>()));
        assert!(poll_with(timeout.as_mut(), &probe.waker()).is_pending());
        timeouts.push(timeout);
        probes.push(probe);
        {
            let _entered = timer.enter();
            let probe = Probe::new();
            let mut sleep = Box::pin(sharded_timer::time::sleep(ms(4 + i % 3)));
            assert!(poll_with(sleep.as_mut(), &probe.waker()).is_pending());
            ns_sleeps.push(sleep);
            probes.push(probe);
        }
        let ran = ran.clone();
        handles.push(
            timer
                .schedule(ms(3 + i % 9), move || {
                    ran.fetch_add(1, SeqCst);
                })
                .unwrap(),
        );
    }
    // Intervals: 3 ticks each. A tick already due when polled completes at once
    // (Burst); one that is pending is woken by its timer.
    let mut pending_ticks = 0;
    for _ in 0..4 {
        let mut interval: Interval = timer.interval(ms(4));
        for _ in 0..3 {
            let probe = Probe::new();
            let waker = probe.waker();
            let mut cx = Context::from_waker(&waker);
            if let Poll::Ready(due) = interval.poll_tick(&mut cx) {
                assert!(due.into_std() <= Instant::now(), "a tick completed early");
                continue;
            }
            pending_ticks += 1;
            assert!(
                wait_until(WAIT, || probe.wakes() >= 1),
                "interval tick woken"
            );
            assert!(interval.poll_tick(&mut cx).is_ready());
            probes.push(probe);
        }
    }
    assert!(
        pending_ticks >= 4,
        "{pending_ticks} interval ticks waited for a timer"
    );
    assert!(
        wait_until(WAIT, || probes.iter().all(|p| p.wakes() >= 1)
            && ran.load(SeqCst) == 20),
        "every future woken and every callback run"
    );
    for probe in &probes {
        assert_eq!(probe.wakes(), 1);
        assert!(
            is_shard_thread(&probe.names()[0], "as"),
            "{:?}",
            probe.names()
        );
    }
    let mut got = got.lock().unwrap().clone();
    let mut want: Vec<_> = handles.iter().map(|h| h.id()).collect();
    got.sort_by_key(|id| id.to_string());
    want.sort_by_key(|id| id.to_string());
    assert_eq!(
        got, want,
        "the spawner got exactly the 20 schedule callbacks"
    );
    assert!(timer.shutdown().is_empty());
}

// ---------------------------------------------------------------------------------
// 3. ManualClock, every mode: `advance` returns only once every due future (sleep,
//    timeout, interval, > TURN_BUDGET of them due in one tick) has been woken; none
//    before its deadline.
// ---------------------------------------------------------------------------------

#[test]
fn manual_advance_returns_only_after_every_due_wake_in_every_mode() {
    let _serial = serial();
    let spawned = Arc::new(AtomicUsize::new(0));
    for (mode, callbacks) in modes(&spawned) {
        let clock = ManualClock::new();
        let timer = builder("am", callbacks)
            .clock(clock.clone())
            .build()
            .unwrap();
        let start = clock.now();
        let mut sleeps: Vec<(Instant, Pin<Box<Sleep>>, Arc<Probe>)> = Vec::new();
        for i in 0..600u64 {
            let deadline = start + Duration::from_micros(500 + 100 * i);
            let probe = Probe::new();
            let mut sleep = Box::pin(timer.sleep_until(deadline));
            arm(&mut sleep, &probe);
            sleeps.push((deadline, sleep, probe));
        }
        // 1,500 due in the same tick: more than a turn's budget.
        for _ in 0..1500 {
            let deadline = start + ms(25);
            let probe = Probe::new();
            let mut sleep = Box::pin(timer.sleep_until(deadline));
            arm(&mut sleep, &probe);
            sleeps.push((deadline, sleep, probe));
        }
        // A waker that takes real time (50 ms): advance must wait for it.
        let slow_done = Arc::new(AtomicBool::new(false));
        let done = slow_done.clone();
        let slow = Probe::with(move |_| {
            std::thread::sleep(ms(50));
            done.store(true, SeqCst);
        });
        let slow_deadline = start + ms(30);
        let mut slow_sleep = Box::pin(timer.sleep_until(slow_deadline));
        arm(&mut slow_sleep, &slow);
        let mut timeouts = Vec::new();
        for i in 0..100u64 {
            let probe = Probe::new();
            let mut timeout = Box::pin(timer.timeout(ms(1 + i % 50), std::future::pending::<()>()));
            assert!(poll_with(timeout.as_mut(), &probe.waker()).is_pending());
            timeouts.push((start + ms(1 + i % 50), timeout, probe));
        }
        let mut interval = timer.interval(ms(7));
        let iprobe = Probe::new();
        let iwaker = iprobe.waker();
        assert!(interval
            .poll_tick(&mut Context::from_waker(&iwaker))
            .is_ready());
        let mut next_tick = start + ms(7);
        assert!(interval
            .poll_tick(&mut Context::from_waker(&iwaker))
            .is_pending());
        let mut tick_wakes = 0;
        for step in 1..=70u64 {
            clock.advance(ms(1));
            let now = clock.now();
            assert_eq!(now, start + ms(step));
            for (deadline, _, probe) in &sleeps {
                let want = usize::from(*deadline <= now);
                assert_eq!(
                    probe.wakes(),
                    want,
                    "{mode}: after advance to +{step} ms a sleep due at +{:?} was woken {} times",
                    *deadline - start,
                    probe.wakes()
                );
            }
            for (deadline, _, probe) in &timeouts {
                assert_eq!(
                    probe.wakes(),
                    usize::from(*deadline <= now),
                    "{mode}: timeout due +{:?} at +{step} ms",
                    *deadline - start
                );
            }
            assert_eq!(
                slow.wakes() == 1 && slow_done.load(SeqCst),
                slow_deadline <= now,
                "{mode}: advance to +{step} ms returned before the slow waker finished"
            );
            if next_tick <= now {
                tick_wakes += 1;
                assert_eq!(
                    iprobe.wakes(),
                    tick_wakes,
                    "{mode}: interval tick due +{:?} not woken when advance to +{step} ms returned",
                    next_tick - start
                );
                let tick = interval.poll_tick(&mut Context::from_waker(&iwaker));
                assert_eq!(tick, Poll::Ready(next_tick.into()), "{mode}: tick instant");
                next_tick += ms(7);
                assert!(interval
                    .poll_tick(&mut Context::from_waker(&iwaker))
                    .is_pending());
            } else {
                assert_eq!(iprobe.wakes(), tick_wakes, "{mode}: interval woken early");
            }
        }
        for (_, sleep, probe) in &mut sleeps {
            assert!(poll_with(sleep.as_mut(), Waker::noop()).is_ready());
            assert!(sleep.is_elapsed());
            // Under a ManualClock no shard watches another, so a wake leaves as the
            // mode says (a pool worker, the spawner's thread): documented on
            // `Callbacks`. Inline: the shard thread.
            if mode == "inline" {
                assert!(
                    is_shard_thread(&probe.names()[0], "am"),
                    "{mode}: {:?}",
                    probe.names()
                );
            }
        }
        for (_, timeout, _) in &mut timeouts {
            assert!(matches!(
                poll_with(timeout.as_mut(), Waker::noop()),
                Poll::Ready(Err(_))
            ));
        }
        drop(sleeps);
        drop(timeouts);
        drop(slow_sleep);
        drop(interval);
        assert!(timer.shutdown().is_empty());
    }
}

// ---------------------------------------------------------------------------------
// 4. ManualClock: a waker (where the mode says: no shard is rescued under a
//    ManualClock, so wakes are not kept on the shard) that schedules a zero-delay
//    callback: `advance` runs that to the fixed point before returning (pool, inline,
//    spawn); a callback it schedules past the new now does not run.
// ---------------------------------------------------------------------------------

#[test]
fn manual_advance_runs_what_a_waker_schedules_to_the_fixed_point() {
    let _serial = serial();
    let spawned = Arc::new(AtomicUsize::new(0));
    for (mode, callbacks) in modes(&spawned) {
        if mode == "rayon" {
            continue; // advance does not wait for rayon's callbacks (documented)
        }
        let clock = ManualClock::new();
        let timer = builder("af", callbacks)
            .clock(clock.clone())
            .build()
            .unwrap();
        let zero_ran = Arc::new(AtomicUsize::new(0));
        let later_ran = Arc::new(AtomicUsize::new(0));
        let (t, z, l) = (timer.clone(), zero_ran.clone(), later_ran.clone());
        let probe = Probe::with(move |_| {
            let z = z.clone();
            let l = l.clone();
            t.schedule(Duration::ZERO, move || {
                z.fetch_add(1, SeqCst);
            })
            .unwrap();
            t.schedule(ms(3), move || {
                l.fetch_add(1, SeqCst);
            })
            .unwrap();
        });
        let mut sleep = Box::pin(timer.sleep(ms(5)));
        arm(&mut sleep, &probe);
        clock.advance(ms(10));
        assert_eq!(probe.wakes(), 1, "{mode}: the sleep was woken");
        assert_eq!(
            zero_ran.load(SeqCst),
            1,
            "{mode}: advance returned before the waker's zero-delay callback ran"
        );
        assert_eq!(
            later_ran.load(SeqCst),
            0,
            "{mode}: a callback due after now ran"
        );
        clock.advance(ms(3));
        assert_eq!(later_ran.load(SeqCst), 1, "{mode}: due now");
        drop(sleep);
        assert!(timer.shutdown().is_empty());
    }
}

// ---------------------------------------------------------------------------------
// 5. Shutdown from another thread while a shard is stuck in a waker: when `shutdown`
//    returns, every polled future has been woken exactly once (fired or abandoned),
//    and after the futures are dropped no waker is left anywhere.
// ---------------------------------------------------------------------------------

#[test]
fn shutdown_returns_after_every_future_was_woken_once_and_leaks_no_waker() {
    let _serial = serial();
    let spawned = Arc::new(AtomicUsize::new(0));
    for (mode, callbacks) in modes(&spawned) {
        let timer = builder("ad", callbacks).rescue_after(None).build().unwrap();
        let release = Arc::new(AtomicBool::new(false));
        let r = release.clone();
        let blocker = Probe::with(move |_| {
            let start = Instant::now();
            while !r.load(SeqCst) && start.elapsed() < ms(400) {
                std::thread::sleep(ms(1));
            }
        });
        let start = Instant::now() + ms(50); // slack: thread start-up on a loaded machine
        let (blocking, mut mine) = on_core(0, || {
            let mut blocking = Box::pin(timer.sleep_until(start + ms(10)));
            arm(&mut blocking, &blocker);
            let mut mine = Vec::new();
            for i in 0..30u64 {
                // Due while shard 0 is stuck.
                let probe = Probe::new();
                let mut sleep = Box::pin(timer.sleep_until(start + ms(12 + i % 8)));
                arm(&mut sleep, &probe);
                mine.push((sleep, probe));
            }
            for _ in 0..20 {
                let probe = Probe::new();
                let mut sleep = Box::pin(timer.sleep(Duration::from_secs(10)));
                arm(&mut sleep, &probe);
                mine.push((sleep, probe));
            }
            (blocking, mine)
        });
        let theirs = on_core(1, || {
            let mut theirs = Vec::new();
            for i in 0..20u64 {
                let probe = Probe::new();
                let mut sleep = Box::pin(timer.sleep_until(start + ms(5 + i)));
                arm(&mut sleep, &probe);
                theirs.push((sleep, probe));
            }
            for _ in 0..20 {
                let probe = Probe::new();
                let mut sleep = Box::pin(timer.sleep(Duration::from_secs(10)));
                arm(&mut sleep, &probe);
                theirs.push((sleep, probe));
            }
            theirs
        });
        mine.extend(theirs);
        let mut timeouts = Vec::new();
        for i in 0..10u64 {
            let probe = Probe::new();
            let mut timeout =
                Box::pin(timer.timeout(ms(5 + 1000 * (i % 2)), std::future::pending::<()>()));
            assert!(poll_with(timeout.as_mut(), &probe.waker()).is_pending());
            timeouts.push((timeout, probe));
        }
        assert!(
            wait_until(WAIT, || blocker.wakes() == 1),
            "{mode}: blocker woken"
        );
        // Let the victims' deadlines pass while shard 0 is stuck.
        std::thread::sleep(ms(30));
        let stopper = {
            let release = release.clone();
            std::thread::spawn(move || {
                std::thread::sleep(ms(100));
                release.store(true, SeqCst);
            })
        };
        let unfired = timer.shutdown();
        assert!(unfired.is_empty(), "{mode}: no schedule timers");
        // Exactly once, and already: shutdown returned.
        for (i, (sleep, probe)) in mine.iter_mut().enumerate() {
            assert_eq!(
                probe.wakes(),
                1,
                "{mode}: sleep {i} (deadline +{:?}) woken {} times when shutdown returned",
                sleep.deadline().into_std() - start,
                probe.wakes()
            );
            assert!(poll_with(sleep.as_mut(), Waker::noop()).is_ready());
            if sleep.is_elapsed() {
                assert!(probe.first().unwrap() >= sleep.deadline().into_std());
            } else {
                assert_eq!(sleep.refused(), Some(ScheduleError::Shutdown));
            }
        }
        for (timeout, probe) in &mut timeouts {
            assert_eq!(
                probe.wakes(),
                1,
                "{mode}: timeout woken once by shutdown's return"
            );
            assert!(poll_with(timeout.as_mut(), Waker::noop()).is_ready());
        }
        stopper.join().unwrap();
        assert_eq!(blocker.wakes(), 1);
        drop(release);
        let probes: Vec<Arc<Probe>> = mine
            .iter()
            .map(|(_, p)| p.clone())
            .chain(timeouts.iter().map(|(_, p)| p.clone()))
            .chain(std::iter::once(blocker))
            .collect();
        drop(mine);
        drop(timeouts);
        drop(blocking);
        drop(timer);
        for (i, probe) in probes.iter().enumerate() {
            // With rescue off, the blocker's wake ran where the mode says: on rayon,
            // whose runs `shutdown` does not wait for (documented on
            // `Callbacks::rayon`): its job lets the waker go when it returns.
            if mode == "rayon" {
                assert!(
                    wait_until(WAIT, || Arc::strong_count(probe) == 1),
                    "{mode}: waker {i} of {} still held",
                    probes.len()
                );
            }
            assert_eq!(
                Arc::strong_count(probe),
                1,
                "{mode}: waker {i} of {} is still held after shutdown and every future dropped",
                probes.len()
            );
        }
    }
}

// ---------------------------------------------------------------------------------
// 6. A waker that calls `shutdown()` on its own service, from the shard thread, in
//    every mode: no hang; it returns every pending schedule timer (the calling
//    shard's included); every other future is woken exactly once before it returns.
// ---------------------------------------------------------------------------------

#[test]
fn a_waker_that_shuts_the_service_down_from_the_shard_thread() {
    let _serial = serial();
    let spawned = Arc::new(AtomicUsize::new(0));
    for (mode, callbacks) in modes(&spawned) {
        let timer = builder("ax", callbacks).build().unwrap();
        // Others: due with or just before the caller (some queued behind it on shard
        // 0), and far ones on both shards.
        let others: Arc<Mutex<Vec<Arc<Probe>>>> = Arc::new(Mutex::new(Vec::new()));
        let seen_in_wake: HandedBack<(usize, Vec<usize>, Result<(), ScheduleError>)> =
            Arc::new(Mutex::new(None));
        let (t, o, seen) = (timer.clone(), others.clone(), seen_in_wake.clone());
        let caller = Probe::with(move |_| {
            let unfired = t.shutdown();
            let counts = o.lock().unwrap().iter().map(|p| p.wakes()).collect();
            let after = t.schedule(ms(1), || {}).map(drop);
            *seen.lock().unwrap() = Some((unfired.len(), counts, after));
        });
        let start = Instant::now() + ms(50); // slack: thread start-up on a loaded machine
        let mut keep = Vec::new();
        let mut caller_sleep = on_core(0, || {
            let mut s = Box::pin(timer.sleep_until(start + ms(20)));
            arm(&mut s, &caller);
            for i in 0..10u64 {
                let probe = Probe::new();
                let mut sleep = Box::pin(timer.sleep_until(start + ms(19 + i % 2)));
                arm(&mut sleep, &probe);
                others.lock().unwrap().push(probe.clone());
                keep.push(sleep);
                let probe = Probe::new();
                let mut sleep = Box::pin(timer.sleep(Duration::from_secs(30)));
                arm(&mut sleep, &probe);
                others.lock().unwrap().push(probe.clone());
                keep.push(sleep);
                timer.schedule(Duration::from_secs(30), || {}).unwrap();
            }
            s
        });
        on_core(1, || {
            for i in 0..10u64 {
                let probe = Probe::new();
                let mut sleep = Box::pin(timer.sleep_until(start + ms(15 + i)));
                arm(&mut sleep, &probe);
                others.lock().unwrap().push(probe.clone());
                keep.push(sleep);
                let probe = Probe::new();
                let mut sleep = Box::pin(timer.sleep(Duration::from_secs(30)));
                arm(&mut sleep, &probe);
                others.lock().unwrap().push(probe.clone());
                keep.push(sleep);
                timer.schedule(Duration::from_secs(30), || {}).unwrap();
            }
        });
        assert!(
            wait_until(Duration::from_secs(8), || seen_in_wake
                .lock()
                .unwrap()
                .is_some()),
            "{mode}: the waker's shutdown did not return within 8 s (hang?)"
        );
        let (unfired, counts, after) = seen_in_wake.lock().unwrap().take().unwrap();
        assert!(
            is_shard_thread(&caller.names()[0], "ax"),
            "{mode}: {:?}",
            caller.names()
        );
        assert_eq!(
            unfired, 20,
            "{mode}: shutdown from the waker returns all 20 pending timers"
        );
        assert!(
            counts.iter().all(|&n| n == 1),
            "{mode}: when the waker's shutdown returned, wakes of the others were {counts:?}"
        );
        assert_eq!(after, Err(ScheduleError::Shutdown), "{mode}");
        assert!(timer.shutdown().is_empty(), "{mode}: idempotent");
        assert!(poll_with(caller_sleep.as_mut(), Waker::noop()).is_ready());
        for sleep in &mut keep {
            assert!(poll_with(sleep.as_mut(), Waker::noop()).is_ready());
        }
        assert!(
            others.lock().unwrap().iter().all(|p| p.wakes() == 1),
            "{mode}: exactly once"
        );
    }
}

// ---------------------------------------------------------------------------------
// 7. A waker that drops the last reference to the service (the last ShardedTimer and
//    the sleep itself) on the shard thread, pool mode: the service shuts down (its
//    pending callback dropped unrun), the wake returns, every thread exits.
// ---------------------------------------------------------------------------------

struct LastRefs {
    timer: Mutex<Option<ShardedTimer>>,
    sleep: Mutex<Option<Pin<Box<Sleep>>>>,
    returned: AtomicBool,
}

impl Wake for LastRefs {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let sleep = self.sleep.lock().unwrap().take();
        let timer = self.timer.lock().unwrap().take();
        drop(sleep);
        drop(timer); // the last reference: the service shuts down here
        self.returned.store(true, SeqCst);
    }
}

#[test]
fn a_waker_that_drops_the_last_service_reference_on_the_shard_thread() {
    let _serial = serial();
    let spawned = Arc::new(AtomicUsize::new(0));
    for (mode, callbacks) in modes(&spawned) {
        let timer = builder("al", callbacks).build().unwrap();
        assert!(wait_until(WAIT, || thread_names()
            .iter()
            .any(|n| n == "al-s0")));
        let dropped = DropCounter::default();
        let token = dropped.token();
        timer
            .schedule(Duration::from_secs(30), move || drop(token))
            .unwrap();
        let refs = Arc::new(LastRefs {
            timer: Mutex::new(None),
            sleep: Mutex::new(None),
            returned: AtomicBool::new(false),
        });
        let mut sleep = Box::pin(timer.sleep(ms(10)));
        assert!(poll_with(sleep.as_mut(), &Waker::from(refs.clone())).is_pending());
        *refs.sleep.lock().unwrap() = Some(sleep);
        *refs.timer.lock().unwrap() = Some(timer);
        assert!(
            wait_until(Duration::from_secs(8), || refs.returned.load(SeqCst)),
            "{mode}: the wake that dropped the service did not return (hang?)"
        );
        assert!(
            wait_until(WAIT, || dropped.dropped() == 1),
            "{mode}: the pending callback was not dropped by the shutdown"
        );
        // Every thread of the service exits (test threads of this binary come and
        // go meanwhile, so names, not counts).
        assert!(
            wait_until(WAIT, || !thread_names()
                .iter()
                .any(|n| n.starts_with("al-"))),
            "{mode}: the service's threads left behind: {:?}",
            thread_names()
        );
    }
}

// ---------------------------------------------------------------------------------
// 8. A waker whose drop drops its own task, which holds other sleeps of the same
//    shard (re-entrancy into the shard from its own thread), pool mode.
// ---------------------------------------------------------------------------------

struct OwnTask {
    sleeps: Mutex<Vec<Pin<Box<Sleep>>>>,
    _token: support::DropToken,
}

impl Wake for OwnTask {
    fn wake(self: Arc<Self>) {
        // Consumes (here: drops) what may be the last reference to the task.
    }
}

#[test]
fn a_waker_whose_drop_drops_its_tasks_other_sleeps_on_the_same_shard() {
    let _serial = serial();
    let spawned = Arc::new(AtomicUsize::new(0));
    for (mode, callbacks) in modes(&spawned) {
        let timer = builder("ao", callbacks).build().unwrap();
        let dropped = DropCounter::default();
        on_core(0, || {
            // The first and last due at the same instant (fired in the same turn).
            let due = Instant::now() + ms(10);
            let task = Arc::new(OwnTask {
                sleeps: Mutex::new(vec![
                    Box::pin(timer.sleep_until(due)),
                    Box::pin(timer.sleep(Duration::from_secs(5))),
                    Box::pin(timer.sleep(Duration::from_secs(5))),
                    Box::pin(timer.sleep_until(due)),
                ]),
                _token: dropped.token(),
            });
            let waker = Waker::from(task.clone());
            // Only the first sleep holds the waker: the task is kept alive by it alone.
            assert!(poll_with(task.sleeps.lock().unwrap()[0].as_mut(), &waker).is_pending());
            drop(waker);
            drop(task);
        });
        assert!(
            wait_until(WAIT, || dropped.dropped() == 1),
            "{mode}: the task was not dropped by its wake"
        );
        assert!(
            wait_until(WAIT, || {
                let s = timer.stats();
                s.pending == 0 && s.cancelled == 2
            }),
            "{mode}: the two 5 s sleeps dropped by the waker are cancelled: {:?}",
            timer.stats()
        );
        // The shard still wakes on time.
        let probe = Probe::new();
        // 50 ms: `arm` needs its first poll, on this thread, before the deadline.
        let mut sleep = on_core(0, || Box::pin(timer.sleep(ms(50))));
        arm(&mut sleep, &probe);
        assert!(
            wait_until(WAIT, || probe.wakes() == 1),
            "{mode}: shard 0 alive"
        );
        assert!(probe.first().unwrap() >= sleep.deadline().into_std());
        let s = timer.stats();
        assert_eq!(
            (s.fired, s.cancelled, s.pending),
            (3, 2, 0),
            "{mode}: exact stats"
        );
        drop(sleep);
        assert!(timer.shutdown().is_empty());
    }
}

// ---------------------------------------------------------------------------------
// 9. A waker that resets and drops sibling sleeps of its shard (one pending, one
//    fired in the same tick and maybe still queued behind it), pool mode and others.
// ---------------------------------------------------------------------------------

type Shared = Arc<Mutex<Pin<Box<Sleep>>>>;

#[test]
fn a_waker_that_resets_and_drops_sibling_sleeps_of_its_shard() {
    let _serial = serial();
    let spawned = Arc::new(AtomicUsize::new(0));
    for (mode, callbacks) in modes(&spawned) {
        let timer = builder("ar", callbacks).build().unwrap();
        let start = Instant::now() + ms(50); // slack: thread start-up on a loaded machine
        let (b, c, d, pb, pc, pd) = on_core(0, || {
            let b: Shared = Arc::new(Mutex::new(Box::pin(timer.sleep(Duration::from_secs(3)))));
            let c: Shared = Arc::new(Mutex::new(Box::pin(timer.sleep(Duration::from_secs(3)))));
            let d: Shared = Arc::new(Mutex::new(Box::pin(timer.sleep_until(start + ms(20)))));
            let (pb, pc, pd) = (Probe::new(), Probe::new(), Probe::new());
            assert!(poll_with(b.lock().unwrap().as_mut(), &pb.waker()).is_pending());
            assert!(poll_with(c.lock().unwrap().as_mut(), &pc.waker()).is_pending());
            (b, c, d, pb, pc, pd)
        });
        let c_slot = Arc::new(Mutex::new(Some(c)));
        let reset_at = Arc::new(Mutex::new(None::<(Instant, Instant)>));
        let (bb, cc, dd, ra) = (b.clone(), c_slot.clone(), d.clone(), reset_at.clone());
        let a_probe = Probe::with(move |_| {
            let now = Instant::now();
            let b_new = now + ms(80);
            let d_new = now + ms(100);
            bb.lock().unwrap().as_mut().reset(b_new.into());
            dd.lock().unwrap().as_mut().reset(d_new.into());
            drop(cc.lock().unwrap().take()); // drops C on the shard thread
            *ra.lock().unwrap() = Some((b_new, d_new));
        });
        let mut a = on_core(0, || {
            let mut a = Box::pin(timer.sleep_until(start + ms(20)));
            arm(&mut a, &a_probe);
            assert!(poll_with(d.lock().unwrap().as_mut(), &pd.waker()).is_pending());
            a
        });
        assert!(
            wait_until(WAIT, || reset_at.lock().unwrap().is_some()),
            "{mode}: A's wake ran"
        );
        let (b_new, d_new) = reset_at.lock().unwrap().unwrap();
        // B: the reset moved its pending timer; it completes once, at or after b_new.
        // D: fired with A; if its wake had not run yet, the reset woke it once.
        let d_woken_before = pd.wakes();
        assert!(
            d_woken_before <= 1,
            "{mode}: D woken {d_woken_before} times"
        );
        // Poll D again (its waiting waker was taken by the reset, or by its own wake).
        let d_ready_at_once = {
            let mut d = d.lock().unwrap();
            let ready = poll_with(d.as_mut(), &pd.waker()).is_ready();
            if ready {
                assert!(
                    Instant::now() >= d_new,
                    "{mode}: D, reset 100 ms on, completed before its new deadline"
                );
            } else {
                assert!(!d.is_elapsed(), "{mode}: D pending, yet elapsed");
            }
            ready
        };
        {
            let mut bl = b.lock().unwrap();
            if poll_with(bl.as_mut(), &pb.waker()).is_ready() {
                assert!(
                    Instant::now() >= b_new,
                    "{mode}: B completed before its new deadline"
                );
            }
        }
        let d_wakes_final = d_woken_before + usize::from(!d_ready_at_once);
        assert!(
            wait_until(WAIT, || pd.wakes() == d_wakes_final),
            "{mode}: D woken by its new timer"
        );
        assert!(wait_until(WAIT, || pb.wakes() >= 1), "{mode}: B woken");
        let d_last = *pd.at.lock().unwrap().last().unwrap();
        assert!(
            d_last >= d_new,
            "{mode}: D woken {:?} before its new deadline",
            d_new - d_last
        );
        assert!(pb.first().unwrap() >= b_new, "{mode}: B woken early");
        {
            let mut dl = d.lock().unwrap();
            assert!(poll_with(dl.as_mut(), Waker::noop()).is_ready());
            assert!(dl.is_elapsed());
            let mut bl = b.lock().unwrap();
            assert!(poll_with(bl.as_mut(), Waker::noop()).is_ready());
        }
        assert_eq!(a_probe.wakes(), 1);
        assert!(poll_with(a.as_mut(), Waker::noop()).is_ready());
        // A probe through shard 0 so that any late wake of C or B would have landed.
        let probe = Probe::new();
        // 50 ms: `arm` needs its first poll, on this thread, before the deadline.
        let mut last = on_core(0, || Box::pin(timer.sleep(ms(50))));
        arm(&mut last, &probe);
        assert!(wait_until(WAIT, || probe.wakes() == 1));
        assert_eq!(
            pc.wakes(),
            0,
            "{mode}: C, dropped before its deadline, was woken"
        );
        assert_eq!(pb.wakes(), 1, "{mode}: B exactly once");
        assert_eq!(pd.wakes(), d_wakes_final, "{mode}: D");
        assert_eq!(Arc::strong_count(&pc), 1, "{mode}: C's waker freed");
        drop((a, b, d, last));
        assert!(timer.shutdown().is_empty());
    }
}

// ---------------------------------------------------------------------------------
// 10. A waker that re-polls its own sleep inside `wake` (it is ready, elapsed, not
//     early), then resets it 5 ms on and polls it again: 20 rounds, each never early.
// ---------------------------------------------------------------------------------

struct Repoll {
    sleep: Mutex<Option<Pin<Box<Sleep>>>>,
    rounds: AtomicUsize,
    errors: Mutex<Vec<String>>,
}

impl Wake for Repoll {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let mut guard = self.sleep.lock().unwrap();
        let Some(sleep) = guard.as_mut() else { return };
        let waker = Waker::from(self.clone());
        let now = Instant::now();
        match poll_with(sleep.as_mut(), &waker) {
            Poll::Ready(()) => {
                if now < sleep.deadline().into_std() {
                    self.errors.lock().unwrap().push("ready early".into());
                }
                if !sleep.is_elapsed() {
                    self.errors
                        .lock()
                        .unwrap()
                        .push("ready, not elapsed".into());
                }
                let round = self.rounds.fetch_add(1, SeqCst) + 1;
                if round < 20 {
                    sleep.as_mut().reset((Instant::now() + ms(5)).into());
                    if poll_with(sleep.as_mut(), &waker).is_ready() {
                        self.errors
                            .lock()
                            .unwrap()
                            .push("ready right after reset".into());
                    }
                }
            }
            Poll::Pending => self
                .errors
                .lock()
                .unwrap()
                .push("woken, then pending".into()),
        }
    }
}

#[test]
fn a_waker_that_repolls_and_rearms_its_sleep_inside_wake() {
    let _serial = serial();
    let spawned = Arc::new(AtomicUsize::new(0));
    for (mode, callbacks) in modes(&spawned) {
        let timer = builder("aq", callbacks).build().unwrap();
        let task = Arc::new(Repoll {
            sleep: Mutex::new(Some(Box::pin(timer.sleep(ms(5))))),
            rounds: AtomicUsize::new(0),
            errors: Mutex::new(Vec::new()),
        });
        let waker = Waker::from(task.clone());
        assert!(poll_with(
            task.sleep.lock().unwrap().as_mut().unwrap().as_mut(),
            &waker
        )
        .is_pending());
        let start = Instant::now();
        assert!(
            wait_until(Duration::from_secs(8), || task.rounds.load(SeqCst) == 20),
            "{mode}: 20 rounds, got {}",
            task.rounds.load(SeqCst)
        );
        assert!(
            start.elapsed() >= ms(95),
            "{mode}: 20 rounds of 5 ms in {:?}",
            start.elapsed()
        );
        assert_eq!(
            task.errors.lock().unwrap().clone(),
            Vec::<String>::new(),
            "{mode}"
        );
        drop(task.sleep.lock().unwrap().take());
        assert!(timer.shutdown().is_empty());
    }
}

// ---------------------------------------------------------------------------------
// 11. Exactly once and never early, pool mode, under concurrent creation and dropping
//     from both cores: sleeps, timeouts, interval ticks; dropped-before-deadline
//     futures never woken; stats exact at quiescence.
// ---------------------------------------------------------------------------------

enum Fut {
    S(Pin<Box<Sleep>>),
    T(Pin<Box<Timeout<std::future::Pending<()>>>>),
    I(Box<Interval>, Instant),
}

#[test]
fn exactly_once_never_early_under_concurrent_create_and_drop_in_pool_mode() {
    let _serial = serial();
    let timer = builder("ae", Callbacks::pool(2)).build().unwrap();
    let results = support::on_each_core(2, |core| {
        let mut rng = support::Rng::new(core as u64 + 7);
        let mut live: Vec<(Fut, Instant, Arc<Probe>)> = Vec::new();
        let mut dropped_early: Vec<Arc<Probe>> = Vec::new();
        let mut dropped_late: Vec<Arc<Probe>> = Vec::new();
        for i in 0..400u64 {
            let d = Duration::from_micros(500 + rng.below(30_000));
            let probe = Probe::new();
            let waker = probe.waker();
            let made = Instant::now();
            let (fut, deadline) = match i % 3 {
                0 => {
                    let mut s = Box::pin(timer.sleep(d));
                    assert!(poll_with(s.as_mut(), &waker).is_pending());
                    let deadline = s.deadline().into_std();
                    (Fut::S(s), deadline)
                }
                1 => {
                    let mut t = Box::pin(timer.timeout(d, std::future::pending::<()>()));
                    assert!(poll_with(t.as_mut(), &waker).is_pending());
                    let deadline = t.deadline();
                    (Fut::T(t), deadline)
                }
                _ => {
                    let mut it = Box::new(timer.interval(d));
                    let mut cx = Context::from_waker(&waker);
                    let Poll::Ready(first) = it.poll_tick(&mut cx) else {
                        panic!("first tick at once")
                    };
                    assert!(it.poll_tick(&mut cx).is_pending());
                    // A period below the tick (1 ms) is raised to it (documented).
                    let deadline = first.into_std() + d.max(ms(1));
                    (Fut::I(it, first.into_std()), deadline)
                }
            };
            assert!(
                deadline >= made + d,
                "a future's deadline {:?} before its creation plus its delay",
                made + d - deadline
            );
            live.push((fut, deadline, probe));
            // Drop a random live one now and then.
            if rng.below(3) == 0 && !live.is_empty() {
                let k = rng.below(live.len() as u64) as usize;
                let (fut, deadline, probe) = live.swap_remove(k);
                let before = Instant::now();
                drop(fut);
                if before < deadline {
                    dropped_early.push(probe);
                } else {
                    dropped_late.push(probe);
                }
            }
            if i % 50 == 0 {
                std::thread::sleep(ms(2));
            }
        }
        assert!(
            wait_until(WAIT, || live.iter().all(|(_, _, p)| p.wakes() >= 1)),
            "every live future woken"
        );
        let mut errors = Vec::new();
        for (fut, deadline, probe) in &mut live {
            if probe.wakes() != 1 {
                errors.push(format!("woken {} times", probe.wakes()));
            }
            let at = probe.first().unwrap();
            if at < *deadline {
                errors.push(format!("woken {:?} early", *deadline - at));
            }
            let now = Instant::now();
            let ready = match fut {
                Fut::S(s) => poll_with(s.as_mut(), Waker::noop()).is_ready(),
                Fut::T(t) => poll_with(t.as_mut(), Waker::noop()).is_ready(),
                Fut::I(it, first) => {
                    let mut cx = Context::from_waker(Waker::noop());
                    match it.poll_tick(&mut cx) {
                        Poll::Ready(tick) => {
                            if tick.into_std() != *deadline {
                                errors.push(format!(
                                    "tick {:?} after first, want {:?}",
                                    tick.into_std() - *first,
                                    *deadline - *first
                                ));
                            }
                            true
                        }
                        Poll::Pending => false,
                    }
                }
            };
            if !ready {
                errors.push("woken, but not ready".into());
            }
            if now < *deadline {
                errors.push("polled ready before its deadline".into());
            }
        }
        (live, dropped_early, dropped_late, errors)
    });
    // A probe on each shard: any stray wake of a dropped future would have landed.
    for k in 0..2 {
        let probe = Probe::new();
        let mut s = on_core(k, || Box::pin(timer.sleep(ms(40))));
        arm(&mut s, &probe);
        assert!(wait_until(WAIT, || probe.wakes() == 1));
    }
    let mut total_live = 0;
    for (core, (live, early, late, errors)) in results.iter().enumerate() {
        assert!(errors.is_empty(), "core {core}: {errors:?}");
        for probe in early {
            assert_eq!(
                probe.wakes(),
                0,
                "core {core}: a future dropped before its deadline was woken"
            );
        }
        for probe in late {
            assert!(
                probe.wakes() <= 1,
                "core {core}: a dropped future woken twice"
            );
        }
        for (_, _, probe) in live {
            assert_eq!(probe.wakes(), 1, "core {core}: exactly once");
            assert!(
                is_shard_thread(&probe.names()[0], "ae"),
                "woken on {:?}",
                probe.names()
            );
        }
        total_live += live.len();
    }
    drop(results);
    assert!(total_live > 300);
    let stats = timer.stats();
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(stats.panicked, 0);
    assert_eq!(stats.fired + stats.cancelled, stats.scheduled, "{stats:?}");
    assert!(timer.shutdown().is_empty());
}

// ---------------------------------------------------------------------------------
// 12. Rescue: one shard stuck 600 ms in a waker, pool / spawn / rayon: its other
//     sleeps and its schedule callbacks, due 20-120 ms after, are run by the shard
//     that watches it: each once, never early, at most 250 ms late (without rescue:
//     about 600 ms).
// ---------------------------------------------------------------------------------

#[test]
fn a_shard_stuck_in_a_waker_is_rescued_exactly_once_never_early() {
    let _serial = serial();
    let spawned = Arc::new(AtomicUsize::new(0));
    for (mode, callbacks) in modes(&spawned) {
        if mode == "inline" {
            continue; // covered by the crate's own rescue tests
        }
        let timer = builder("aw", callbacks).build().unwrap();
        let start = Instant::now() + ms(50); // slack: thread start-up on a loaded machine
        let blocker = Probe::with(|_| std::thread::sleep(ms(600)));
        let ran: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::new(Mutex::new(Vec::new()));
        let (blocking, victims) = on_core(0, || {
            let mut blocking = Box::pin(timer.sleep_until(start + ms(20)));
            arm(&mut blocking, &blocker);
            let mut victims = Vec::new();
            for i in 0..100u64 {
                let deadline = start + ms(25 + i);
                let probe = Probe::new();
                let mut sleep = Box::pin(timer.sleep_until(deadline));
                arm(&mut sleep, &probe);
                victims.push((deadline, sleep, probe));
                if i % 5 == 0 {
                    let ran = ran.clone();
                    timer
                        .schedule_at(deadline, move || {
                            ran.lock().unwrap().push((deadline, Instant::now()));
                        })
                        .unwrap();
                }
            }
            (blocking, victims)
        });
        assert!(
            wait_until(WAIT, || victims.iter().all(|(_, _, p)| p.wakes() >= 1)
                && ran.lock().unwrap().len() == 20),
            "{mode}: every victim woken and every callback run"
        );
        // Wait for the blocker to return and shard 0 to turn again (a fresh sleep
        // woken there), then judge: any duplicate would have landed.
        assert!(wait_until(WAIT, || start.elapsed() > ms(650)));
        let probe = Probe::new();
        let mut fresh = on_core(0, || Box::pin(timer.sleep(ms(2))));
        // Elapsed already at its first poll (this thread got no core for 2 ms: a
        // fresh-clone CI on 2 loaded cores) means shard 0 fired it: it turned.
        if poll_with(fresh.as_mut(), &probe.waker()).is_pending() {
            assert!(wait_until(WAIT, || probe.wakes() == 1));
        }
        let mut worst = Duration::ZERO;
        let mut rescued = 0;
        for (deadline, _, probe) in &victims {
            assert_eq!(probe.wakes(), 1, "{mode}: exactly once");
            let at = probe.first().unwrap();
            assert!(at >= *deadline, "{mode}: woken {:?} early", *deadline - at);
            worst = worst.max(at - *deadline);
            if probe.names()[0] == "aw-s1" {
                rescued += 1;
            }
        }
        let ran = ran.lock().unwrap().clone();
        assert_eq!(ran.len(), 20, "{mode}: each callback once");
        for (deadline, at) in &ran {
            assert!(at >= deadline, "{mode}: callback early");
            worst = worst.max(*at - *deadline);
        }
        assert!(
            worst < ms(250),
            "{mode}: the stuck shard's others ran up to {worst:?} late ({rescued} of 100 wakes by its watcher)"
        );
        assert_eq!(blocker.wakes(), 1);
        drop((blocking, victims, fresh));
        assert!(timer.shutdown().is_empty());
    }
}

// ---------------------------------------------------------------------------------
// 13. Rescue in pool mode while the pool is backed up by slow schedule callbacks: the
//     wakes do not need the pool, so a shard stuck in a waker should still be rescued.
// ---------------------------------------------------------------------------------

#[test]
fn a_shard_stuck_in_a_waker_is_rescued_even_when_the_pool_is_backed_up() {
    let _serial = serial();
    let timer = ShardedTimer::builder()
        .shards(2)
        .executor_threads(1)
        .pin_cores(false)
        .routing(Routing::ByCore)
        .thread_name("ab")
        .build()
        .unwrap();
    let start = Instant::now() + ms(50); // slack: thread start-up on a loaded machine
    let blocker = Probe::with(|_| std::thread::sleep(ms(800)));
    let victims = on_core(0, || {
        // The only worker is busy for 1.2 s from +5 ms; 6 more batches queue behind it
        // (distinct ticks): the pool is "backed up" (more waiting than it can start).
        timer
            .schedule_at(start + ms(5), || std::thread::sleep(ms(1200)))
            .unwrap();
        for i in 0..6u64 {
            timer.schedule_at(start + ms(7 + 2 * i), || {}).unwrap();
        }
        let mut blocking = Box::pin(timer.sleep_until(start + ms(30)));
        arm(&mut blocking, &blocker);
        let mut victims = Vec::new();
        for i in 0..10u64 {
            let deadline = start + ms(40 + i);
            let probe = Probe::new();
            let mut sleep = Box::pin(timer.sleep_until(deadline));
            arm(&mut sleep, &probe);
            victims.push((deadline, sleep, probe));
        }
        (blocking, victims)
    });
    let (blocking, victims) = victims;
    assert!(wait_until(WAIT, || victims
        .iter()
        .all(|(_, _, p)| p.wakes() >= 1)));
    let worst = victims
        .iter()
        .map(|(deadline, _, probe)| {
            let at = probe.first().unwrap();
            assert!(at >= *deadline, "never early");
            at - *deadline
        })
        .max()
        .unwrap();
    let names: Vec<_> = victims
        .iter()
        .map(|(_, _, p)| p.names()[0].clone())
        .collect();
    assert!(
        worst < ms(300),
        "a shard stuck 800 ms in a waker was not rescued while the pool was backed up: its \
         other sleeps woke up to {worst:?} late, on {names:?}"
    );
    drop((blocking, victims));
    assert!(timer.shutdown().is_empty());
}

// ---------------------------------------------------------------------------------
// 14. A one-shard pool service (the default on a 1-core machine: rescue is off with
//     one shard): a waker that blocks 600 ms. Pool mode promised "a slow callback
//     delays only the callbacks queued behind it on that worker; the shards keep
//     time": do `schedule` callbacks, run by the pool, stay on time?
// ---------------------------------------------------------------------------------

#[test]
fn a_blocking_waker_on_a_one_shard_pool_service_and_schedule_callbacks() {
    let _serial = serial();
    let timer = ShardedTimer::builder()
        .shards(1)
        .executor_threads(2)
        .pin_cores(false)
        .thread_name("a1")
        .build()
        .unwrap();
    let blocker = Probe::with(|_| std::thread::sleep(ms(600)));
    let mut blocking = Box::pin(timer.sleep(ms(10)));
    arm(&mut blocking, &blocker);
    let ran = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    for i in 0..5u64 {
        let ran = ran.clone();
        let deadline = start + ms(40 + 10 * i);
        timer
            .schedule_at(deadline, move || {
                ran.lock().unwrap().push((deadline, Instant::now()))
            })
            .unwrap();
    }
    assert!(wait_until(WAIT, || ran.lock().unwrap().len() == 5));
    let worst = ran
        .lock()
        .unwrap()
        .iter()
        .map(|(deadline, at)| {
            assert!(at >= deadline);
            *at - *deadline
        })
        .max()
        .unwrap();
    assert!(
        worst < ms(250),
        "pool mode, one shard: schedule callbacks ran up to {worst:?} late behind a blocking waker \
         (before the change the waker blocked a pool worker, not the shard)"
    );
    drop(blocking);
    assert!(timer.shutdown().is_empty());
}

// ---------------------------------------------------------------------------------
// 15. A waker that calls `shutdown()` while it runs on the RESCUER (the watching
//     shard's thread, rescuing a shard stuck in another waker), pool mode: no hang,
//     all pending schedule timers come back, every other future woken once by then.
// ---------------------------------------------------------------------------------

#[test]
fn a_waker_run_by_the_rescuer_that_shuts_the_service_down() {
    let _serial = serial();
    let timer = builder("ay", Callbacks::pool(2)).build().unwrap();
    let start = Instant::now() + ms(50); // slack: thread start-up on a loaded machine
    let stuck = Probe::with(|_| std::thread::sleep(ms(400)));
    let others: Arc<Mutex<Vec<Arc<Probe>>>> = Arc::new(Mutex::new(Vec::new()));
    let result: HandedBack<(String, usize, Vec<usize>)> = Arc::new(Mutex::new(None));
    let (t, o, r) = (timer.clone(), others.clone(), result.clone());
    let caller = Probe::with(move |_| {
        let name = std::thread::current().name().unwrap_or("").to_owned();
        let unfired = t.shutdown();
        let counts = o.lock().unwrap().iter().map(|p| p.wakes()).collect();
        *r.lock().unwrap() = Some((name, unfired.len(), counts));
    });
    let keep = on_core(0, || {
        let mut keep = Vec::new();
        let mut s = Box::pin(timer.sleep_until(start + ms(20)));
        arm(&mut s, &stuck);
        keep.push(s);
        let mut s = Box::pin(timer.sleep_until(start + ms(40)));
        arm(&mut s, &caller);
        keep.push(s);
        for i in 0..10u64 {
            let probe = Probe::new();
            let mut s = Box::pin(timer.sleep_until(start + ms(41 + i)));
            arm(&mut s, &probe);
            others.lock().unwrap().push(probe);
            keep.push(s);
            let probe = Probe::new();
            let mut s = Box::pin(timer.sleep(Duration::from_secs(30)));
            arm(&mut s, &probe);
            others.lock().unwrap().push(probe);
            keep.push(s);
            timer.schedule(Duration::from_secs(30), || {}).unwrap();
        }
        keep
    });
    on_core(1, || {
        for _ in 0..10 {
            timer.schedule(Duration::from_secs(30), || {}).unwrap();
        }
    });
    assert!(
        wait_until(Duration::from_secs(8), || result.lock().unwrap().is_some()),
        "the rescued waker's shutdown did not return within 8 s (hang?)"
    );
    let (name, unfired, counts) = result.lock().unwrap().take().unwrap();
    assert!(is_shard_thread(&name, "ay"), "{name}");
    assert_eq!(unfired, 20, "every pending schedule timer (ran on {name})");
    assert!(
        counts.iter().all(|&n| n == 1),
        "wakes of the others when the shutdown (on {name}) returned: {counts:?}"
    );
    drop(keep);
    assert!(timer.shutdown().is_empty());
}

// ---------------------------------------------------------------------------------
// 16. `sharded_timer::time` under a tokio runtime, on a global service (pool on
//     demand): every task woken on a shard thread; no pool thread ever started for
//     futures only; a panicking waker counted there too.
// ---------------------------------------------------------------------------------

struct Forward {
    names: Arc<Mutex<Vec<String>>>,
    inner: Waker,
}

impl Wake for Forward {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.names
            .lock()
            .unwrap()
            .push(std::thread::current().name().unwrap_or("").to_owned());
        self.inner.wake_by_ref();
    }
}

/// Polls `inner` with a waker that records the waking thread.
struct Recorded<F> {
    inner: Pin<Box<F>>,
    names: Arc<Mutex<Vec<String>>>,
}

impl<F: Future> Future for Recorded<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let waker = Waker::from(Arc::new(Forward {
            names: self.names.clone(),
            inner: cx.waker().clone(),
        }));
        self.inner.as_mut().poll(&mut Context::from_waker(&waker))
    }
}

#[test]
fn the_time_namespace_on_a_global_service_wakes_tokio_tasks_on_shard_threads() {
    let _serial = serial();
    let global = ShardedTimer::builder()
        .shards(2)
        .pin_cores(false)
        .thread_name("ag")
        .build_global()
        .expect("this file's only global");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let names = Arc::new(Mutex::new(Vec::new()));
    let errors = runtime.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..40u64 {
            let names = names.clone();
            tasks.push(tokio::spawn(async move {
                let start = Instant::now();
                let d = ms(5 + i % 10);
                Recorded {
                    inner: Box::pin(sharded_timer::time::sleep(d)),
                    names: names.clone(),
                }
                .await;
                let mut errors = Vec::new();
                if start.elapsed() < d {
                    errors.push(format!("sleep early by {:?}", d - start.elapsed()));
                }
                let r = Recorded {
                    inner: Box::pin(sharded_timer::time::timeout(
                        ms(7),
                        std::future::pending::<()>(),
                    )),
                    names: names.clone(),
                }
                .await;
                if r.is_ok() {
                    errors.push("timeout".into());
                }
                let mut interval = sharded_timer::time::interval(ms(3));
                let first = interval.tick().await;
                for n in 1..=3u32 {
                    let names = names.clone();
                    let tick = Recorded {
                        inner: Box::pin(async { interval.tick().await }),
                        names,
                    }
                    .await;
                    if tick != first + ms(3) * n {
                        errors.push(format!(
                            "tick {n} at {:?}",
                            tick.into_std() - first.into_std()
                        ));
                    }
                    if Instant::now() < tick.into_std() {
                        errors.push("tick early".into());
                    }
                }
                errors
            }));
        }
        let mut errors = Vec::new();
        for task in tasks {
            errors.extend(task.await.unwrap());
        }
        errors
    });
    assert!(errors.is_empty(), "{errors:?}");
    let names = names.lock().unwrap().clone();
    // Up to 5 wakes per task (a sleep, a timeout, 3 ticks): fewer where a deadline
    // passed before its first poll, which then completes with no wake (a run beside
    // 4 busy loops saw 180-196). Enough of them to judge where they ran:
    assert!(names.len() >= 40 * 5 / 2, "{} wakes", names.len());
    let off: Vec<_> = names.iter().filter(|n| !is_shard_thread(n, "ag")).collect();
    assert!(off.is_empty(), "woken off the shard threads: {off:?}");
    let workers: Vec<_> = thread_names()
        .into_iter()
        .filter(|n| n.starts_with("ag-w"))
        .collect();
    assert!(
        workers.is_empty(),
        "a pool thread started for futures only: {workers:?}"
    );
    // A panicking waker through the namespace: counted, still no pool thread.
    let before = global.stats().panicked;
    let probe = Probe::with(|_| panic!("audit: a global waker that panics"));
    let mut sleep = Box::pin(sharded_timer::time::sleep(ms(3)));
    assert!(poll_with(sleep.as_mut(), &probe.waker()).is_pending());
    assert!(wait_until(WAIT, || probe.wakes() == 1));
    assert!(wait_until(WAIT, || global.stats().panicked == before + 1));
    assert!(thread_names().iter().all(|n| !n.starts_with("ag-w")));
    drop(runtime);
}

// ---------------------------------------------------------------------------------
// 17. A waker that panics when `shutdown` (not a shard) wakes its abandoned sleep:
//     "a waker that panics is caught and counted". Run in a child process, since
//     an unwinding shutdown may abort.
// ---------------------------------------------------------------------------------

const CHILD: &str = "AUDIT_WAKE_THREAD_SHUTDOWN_PANIC_CHILD";

#[test]
fn a_panicking_waker_woken_by_shutdown_is_caught_and_counted() {
    if std::env::var_os(CHILD).is_some() {
        let timer = builder("ac", Callbacks::pool(2)).build().unwrap();
        let mut sleeps = Vec::new();
        for i in 0..3 {
            // The last one's panic payload panics again when dropped.
            let probe = if i < 2 {
                Probe::with(|_| panic!("audit: a waker that panics at shutdown"))
            } else {
                Probe::with(|_| std::panic::panic_any(Bomb))
            };
            let mut sleep = Box::pin(timer.sleep(Duration::from_secs(30)));
            arm(&mut sleep, &probe);
            sleeps.push((sleep, probe));
        }
        let calm = Probe::new();
        let mut calm_sleep = Box::pin(timer.sleep(Duration::from_secs(30)));
        arm(&mut calm_sleep, &calm);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| timer.shutdown()));
        println!(
            "CHILD-RESULT unwound={} woken={} calm={} panicked={}",
            outcome.is_err(),
            sleeps.iter().map(|(_, p)| p.wakes()).sum::<usize>(),
            calm.wakes(),
            timer.stats().panicked
        );
        std::process::exit(0);
    }
    let _serial = serial();
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_panicking_waker_woken_by_shutdown_is_caught_and_counted",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the child died: {:?}\nstdout: {stdout}\nstderr: {stderr}",
        output.status
    );
    let line = stdout
        .lines()
        .find_map(|l| l.find("CHILD-RESULT").map(|at| &l[at..]))
        .unwrap_or_else(|| panic!("no result line: {stdout}"));
    assert_eq!(
        line, "CHILD-RESULT unwound=false woken=3 calm=1 panicked=3",
        "shutdown with 3 panicking wakers and a calm one"
    );
}

// ---------------------------------------------------------------------------------
// 18. A waker that floods tiny (2-slot) rings from the shard thread, in every mode:
//     300 schedules, 100 new sleeps (50 dropped at once: cancel messages), while the
//     test thread floods the same rings. Nothing lost or doubled, no self-deadlock.
// ---------------------------------------------------------------------------------

#[test]
fn a_waker_that_floods_full_rings_from_the_shard_thread() {
    let _serial = serial();
    let spawned = Arc::new(AtomicUsize::new(0));
    for (mode, callbacks) in modes(&spawned) {
        let timer = builder("ai", callbacks).ring_capacity(2).build().unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let made: Arc<Mutex<Vec<ArmedSleep>>> = Arc::new(Mutex::new(Vec::new()));
        let dropped: Arc<Mutex<Vec<Arc<Probe>>>> = Arc::new(Mutex::new(Vec::new()));
        let returned = Arc::new(AtomicBool::new(false));
        let (t, r, m, d, ret) = (
            timer.clone(),
            ran.clone(),
            made.clone(),
            dropped.clone(),
            returned.clone(),
        );
        let flood = Probe::with(move |_| {
            for i in 0..300u64 {
                let r = r.clone();
                t.schedule(Duration::from_micros(500 + 10 * i), move || {
                    r.fetch_add(1, SeqCst);
                })
                .unwrap();
            }
            for i in 0..100u64 {
                let probe = Probe::new();
                let mut sleep = Box::pin(t.sleep(ms(20 + i % 10)));
                assert!(poll_with(sleep.as_mut(), &probe.waker()).is_pending());
                if i % 2 == 0 {
                    drop(sleep); // a cancel message, from the shard thread
                    d.lock().unwrap().push(probe);
                } else {
                    m.lock().unwrap().push((sleep, probe));
                }
            }
            ret.store(true, SeqCst);
        });
        let mut trigger = Box::pin(timer.sleep(ms(5)));
        arm(&mut trigger, &flood);
        // The test thread floods the rings too, meanwhile.
        let outside = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        while start.elapsed() < ms(30) {
            let o = outside.clone();
            timer
                .schedule(Duration::ZERO, move || {
                    o.fetch_add(1, SeqCst);
                })
                .unwrap();
        }
        assert!(
            wait_until(Duration::from_secs(8), || returned.load(SeqCst)),
            "{mode}: the flooding waker did not return (deadlock on its own shard's ring?)"
        );
        assert!(
            wait_until(WAIT, || ran.load(SeqCst) == 300
                && made.lock().unwrap().iter().all(|(_, p)| p.wakes() >= 1)),
            "{mode}: ran {} of 300",
            ran.load(SeqCst)
        );
        // A probe on each shard, then the exact check.
        for k in 0..2 {
            let probe = Probe::new();
            let mut s = on_core(k, || Box::pin(timer.sleep(ms(40))));
            arm(&mut s, &probe);
            assert!(wait_until(WAIT, || probe.wakes() == 1));
        }
        assert_eq!(ran.load(SeqCst), 300, "{mode}: exactly once");
        for (sleep, probe) in made.lock().unwrap().iter_mut() {
            assert_eq!(probe.wakes(), 1, "{mode}");
            assert!(
                probe.first().unwrap() >= sleep.deadline().into_std(),
                "{mode}: early"
            );
            assert!(poll_with(sleep.as_mut(), Waker::noop()).is_ready());
        }
        for probe in dropped.lock().unwrap().iter() {
            assert_eq!(
                probe.wakes(),
                0,
                "{mode}: a sleep dropped before its deadline was woken"
            );
        }
        let s = timer.stats();
        assert_eq!(s.pending, 0, "{mode}: {s:?}");
        assert_eq!(s.fired + s.cancelled, s.scheduled, "{mode}: {s:?}");
        assert!(s.cancelled >= 50, "{mode}: {s:?}");
        made.lock().unwrap().clear();
        drop(trigger);
        assert!(timer.shutdown().is_empty());
        let outside = outside.load(SeqCst);
        assert!(outside > 0);
    }
}

// ---------------------------------------------------------------------------------
// 19. ManualClock: a waker that calls `advance` itself (on the shard thread inline,
//     else where the mode says): it must return without waiting for its own shard, and what it made due
//     is woken by the next `advance(ZERO)` of the test thread at the latest.
// ---------------------------------------------------------------------------------

#[test]
fn a_waker_that_advances_the_manual_clock_from_the_shard_thread() {
    let _serial = serial();
    let spawned = Arc::new(AtomicUsize::new(0));
    for (mode, callbacks) in modes(&spawned) {
        let clock = ManualClock::new();
        let timer = builder("av", callbacks)
            .clock(clock.clone())
            .build()
            .unwrap();
        let start = clock.now();
        let inner_returned = Arc::new(AtomicBool::new(false));
        let (c, ir) = (clock.clone(), inner_returned.clone());
        let a = Probe::with(move |_| {
            c.advance(ms(10));
            ir.store(true, SeqCst);
        });
        let mut sa = Box::pin(timer.sleep_until(start + ms(5)));
        arm(&mut sa, &a);
        let b = Probe::new();
        let mut sb = Box::pin(timer.sleep_until(start + ms(12)));
        arm(&mut sb, &b);
        let c = Probe::new();
        let mut sc = Box::pin(timer.sleep_until(start + ms(16)));
        arm(&mut sc, &c);
        let outer = {
            let clock = clock.clone();
            support::within(Duration::from_secs(8), move || clock.advance(ms(5)))
        };
        assert!(outer.is_some(), "{mode}: the test thread's advance hung");
        assert!(
            inner_returned.load(SeqCst),
            "{mode}: the waker's advance did not return"
        );
        assert_eq!(clock.now(), start + ms(15), "{mode}");
        let settle = {
            let clock = clock.clone();
            support::within(Duration::from_secs(8), move || {
                clock.advance(Duration::ZERO)
            })
        };
        assert!(settle.is_some(), "{mode}: advance(ZERO) hung");
        assert_eq!(a.wakes(), 1, "{mode}");
        assert_eq!(
            b.wakes(),
            1,
            "{mode}: B, due at +12 ms with the clock at +15 ms, not woken"
        );
        assert_eq!(c.wakes(), 0, "{mode}: C, due at +16 ms, woken at +15 ms");
        clock.advance(ms(1));
        assert_eq!(c.wakes(), 1, "{mode}");
        drop((sa, sb, sc));
        assert!(timer.shutdown().is_empty());
    }
}

// ---------------------------------------------------------------------------------
// 20. Pool mode, a burst of callbacks (more than a turn's budget) on a pool whose only
//     worker is stuck: the futures no longer need the pool, so does a sleep of the
//     same shard, due 30 ms later, still wake on time (bound: 300 ms late)?
// ---------------------------------------------------------------------------------

#[test]
#[ignore = "a limit, not a regression: the pre-change crate is as late (1.17 s); see the report"]
fn a_sleep_behind_a_burst_on_a_jammed_pool() {
    let _serial = serial();
    let timer = ShardedTimer::builder()
        .shards(2)
        .executor_threads(1)
        .pin_cores(false)
        .routing(Routing::ByCore)
        .thread_name("aj")
        .build()
        .unwrap();
    let start = Instant::now() + ms(50); // slack: thread start-up on a loaded machine
    let probe = Probe::new();
    let (deadline, sleep) = on_core(0, || {
        timer
            .schedule_at(start + ms(5), || std::thread::sleep(ms(1200)))
            .unwrap();
        for _ in 0..3000 {
            timer.schedule_at(start + ms(10), || {}).unwrap();
        }
        let deadline = start + ms(40);
        let mut sleep = Box::pin(timer.sleep_until(deadline));
        arm(&mut sleep, &probe);
        (deadline, sleep)
    });
    assert!(wait_until(WAIT, || probe.wakes() == 1));
    let late = probe.first().unwrap() - deadline;
    assert!(
        late < ms(300),
        "pool mode: a sleep woke {late:?} late behind a burst on a stuck pool (on {:?})",
        probe.names()
    );
    drop(sleep);
    assert!(timer.shutdown().is_empty());
}

// ---------------------------------------------------------------------------------
// 21. Rescue racing the owner on wakes: rescue_after 1 ms, 2 shards, 1,500 sleeps
//     over 60 ms whose wakers block 0-3 ms at random (so each shard keeps getting
//     "stuck" and rescued), and schedule callbacks among them: each woken / run
//     exactly once, never early (pool and spawn).
// ---------------------------------------------------------------------------------

#[test]
fn rescue_racing_the_owner_on_wakes_exactly_once_never_early() {
    let _serial = serial();
    let spawned = Arc::new(AtomicUsize::new(0));
    for (mode, callbacks) in modes(&spawned) {
        if mode != "pool" && mode != "spawn" {
            continue;
        }
        let timer = builder("at", callbacks)
            .rescue_after(Some(ms(1)))
            .build()
            .unwrap();
        // Slack for making 1,500 sleeps before the first is due: under
        // AddressSanitizer 10 ms was too little (a sleep already due at its first
        // poll completes there, with no timer).
        let start = Instant::now() + ms(300);
        let results = support::on_each_core(2, |core| {
            let mut rng = support::Rng::new(core as u64 + 99);
            let mut sleeps = Vec::new();
            let mut runs = Vec::new();
            for _ in 0..750 {
                let deadline = start + Duration::from_micros(rng.below(60_000));
                let block = rng.below(4);
                let probe = if rng.below(8) == 0 {
                    Probe::with(move |_| std::thread::sleep(ms(block)))
                } else {
                    Probe::new()
                };
                let mut sleep = Box::pin(timer.sleep_until(deadline));
                arm(&mut sleep, &probe);
                sleeps.push((deadline, sleep, probe));
                if rng.below(5) == 0 {
                    let ran: Arc<Mutex<Vec<Instant>>> = Arc::new(Mutex::new(Vec::new()));
                    let r = ran.clone();
                    timer
                        .schedule_at(deadline, move || r.lock().unwrap().push(Instant::now()))
                        .unwrap();
                    runs.push((deadline, ran));
                }
            }
            (sleeps, runs)
        });
        assert!(
            wait_until(WAIT, || results.iter().all(|(sleeps, runs)| {
                sleeps.iter().all(|(_, _, p)| p.wakes() >= 1)
                    && runs.iter().all(|(_, r)| !r.lock().unwrap().is_empty())
            })),
            "{mode}: every sleep woken and every callback run"
        );
        for k in 0..2 {
            let probe = Probe::new();
            let mut s = on_core(k, || Box::pin(timer.sleep(ms(20))));
            arm(&mut s, &probe);
            assert!(wait_until(WAIT, || probe.wakes() == 1));
        }
        let mut rescued = 0;
        for (sleeps, runs) in &results {
            for (deadline, _, probe) in sleeps {
                assert_eq!(
                    probe.wakes(),
                    1,
                    "{mode}: a sleep woken {} times",
                    probe.wakes()
                );
                let at = probe.first().unwrap();
                assert!(
                    at >= *deadline,
                    "{mode}: a sleep woken {:?} early",
                    *deadline - at
                );
                let names = probe.names();
                assert!(is_shard_thread(&names[0], "at"), "{mode}: {names:?}");
                rescued += usize::from(names[0] != "at-s0" && names[0] != "at-s1");
            }
            for (deadline, ran) in runs {
                let ran = ran.lock().unwrap();
                assert_eq!(ran.len(), 1, "{mode}: a callback ran {} times", ran.len());
                assert!(ran[0] >= *deadline, "{mode}: a callback ran early");
            }
        }
        assert_eq!(rescued, 0);
        let s = timer.stats();
        assert_eq!(s.pending, 0, "{mode}: {s:?}");
        assert_eq!(s.fired, s.scheduled, "{mode}: {s:?}");
        drop(results);
        assert!(timer.shutdown().is_empty());
    }
}

// ---------------------------------------------------------------------------------
// 22. tokio's paused time through `sharded_timer::time` (feature "tokio"): sleeps,
//     timeouts and interval ticks of many tasks complete exactly at their deadlines,
//     once each, with the clock auto-advancing; woken off the tokio thread.
// ---------------------------------------------------------------------------------

#[cfg(feature = "tokio")]
#[test]
fn paused_tokio_time_through_the_namespace_completes_exactly_on_time() {
    use sharded_timer::time;
    let _serial = serial();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let names = Arc::new(Mutex::new(Vec::new()));
    let errors = runtime.block_on(async {
        let start = time::Instant::now();
        let mut tasks = Vec::new();
        for i in 0..20u64 {
            let names = names.clone();
            tasks.push(tokio::spawn(async move {
                let mut errors = Vec::new();
                let d = Duration::from_secs(1 + i % 7);
                Recorded {
                    inner: Box::pin(time::sleep(d)),
                    names: names.clone(),
                }
                .await;
                let at = time::Instant::now().into_std() - start.into_std();
                if at != d {
                    errors.push(format!("sleep {d:?} completed at {at:?}"));
                }
                let t0 = time::Instant::now();
                let r = Recorded {
                    inner: Box::pin(time::timeout(
                        Duration::from_secs(5),
                        std::future::pending::<()>(),
                    )),
                    names: names.clone(),
                }
                .await;
                let took = time::Instant::now().into_std() - t0.into_std();
                if r.is_ok() || took != Duration::from_secs(5) {
                    errors.push(format!("timeout 5 s: {r:?} after {took:?}"));
                }
                let mut interval = time::interval(Duration::from_millis(300));
                let first = interval.tick().await;
                for n in 1..=4u32 {
                    let tick = interval.tick().await;
                    let now = time::Instant::now();
                    let want = first.into_std() + Duration::from_millis(300) * n;
                    if tick.into_std() != want || now.into_std() != want {
                        errors.push(format!(
                            "tick {n}: due {:?}, completed {:?}",
                            tick.into_std() - first.into_std(),
                            now.into_std() - first.into_std()
                        ));
                    }
                }
                errors
            }));
        }
        let mut errors = Vec::new();
        for task in tasks {
            errors.extend(task.await.unwrap());
        }
        errors
    });
    assert!(errors.is_empty(), "{errors:?}");
    let names = names.lock().unwrap().clone();
    assert!(names.len() >= 40, "{} wakes", names.len());
    drop(runtime);
}
