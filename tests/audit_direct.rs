//! Outside audit of direct filing and unlinking: `schedule` files a timer into its
//! shard's wheel on the calling thread when nobody holds the shard, and `cancel`, an
//! earlier `reset` and dropping a pending `Sleep` unlink it there likewise; new timers
//! go to the shard of the caller's core. Written against the public promises only
//! (the crate docs' guarantees and the public items' docs), on real threads: 2 to 4
//! threads at a time, every wait bounded.

mod support;

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use support::{joined_within, wait_until, Rng, WAIT};

use sharded_timer::{
    Callbacks, ManualClock, ScheduleError, ShardedTimer, TimerHandle, TimerId, TimerState,
};

/// Pins the calling thread to the `k`-th usable core (modulo the count); returns
/// whether that worked.
fn pin_to(k: usize) -> bool {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    if ids.is_empty() {
        return false;
    }
    core_affinity::set_for_current(ids[k % ids.len()])
}

/// Usable cores.
fn cores() -> usize {
    core_affinity::get_core_ids().map_or(1, |ids| ids.len())
}

/// Runs its closure when dropped: a capture (or waker) with a hostile destructor.
struct OnDrop(Option<Box<dyn FnOnce() + Send>>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

fn on_drop(f: impl FnOnce() + Send + 'static) -> OnDrop {
    OnDrop(Some(Box::new(f)))
}

/// A waker that counts its wakes and runs a closure when its last clone is dropped.
struct HostileWake {
    woken: AtomicUsize,
    /// The wakes, readable after the waker is gone.
    counter: Arc<AtomicUsize>,
    on_drop: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Wake for HostileWake {
    fn wake(self: Arc<Self>) {
        self.woken.fetch_add(1, SeqCst);
        self.counter.fetch_add(1, SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.fetch_add(1, SeqCst);
        self.counter.fetch_add(1, SeqCst);
    }
}

impl Drop for HostileWake {
    fn drop(&mut self) {
        let f = self
            .on_drop
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(f) = f {
            f();
        }
    }
}

fn hostile_waker(f: impl FnOnce() + Send + 'static) -> (Waker, Arc<AtomicUsize>) {
    let wake = Arc::new(HostileWake {
        woken: AtomicUsize::new(0),
        on_drop: Mutex::new(Some(Box::new(f))),
        counter: Arc::default(),
    });
    let woken = wake.counter.clone();
    (Waker::from(wake), woken)
}

/// Polls `future` once with `waker`.
fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(waker))
}

/// Waits until the service is quiescent: nothing pending, nothing in rings, and the
/// one-shot identity holds; returns the last snapshot.
fn quiescent_stats(timer: &ShardedTimer) -> sharded_timer::Stats {
    let mut last = timer.stats();
    let settled = wait_until(WAIT, || {
        last = timer.stats();
        last.pending == 0 && last.in_rings == 0 && last.scheduled == last.fired + last.cancelled
    });
    assert!(settled, "service never became quiescent: {last:?}");
    last
}

// ---------------------------------------------------------------------------------
// On time: a shard asleep for a later deadline must be woken.
// ---------------------------------------------------------------------------------

/// For each mode: one shard per core with a timer at +10 s (so each sleeps until
/// then); from threads pinned to each core, timers at 1, 5 and 20 ms must fire never
/// early and within 200 ms after their deadline.
#[test]
fn timer_scheduled_while_its_shard_sleeps_for_10_s_fires_on_time() {
    for (mode, callbacks) in [
        ("pool", Callbacks::pool(1)),
        ("inline", Callbacks::inline()),
    ] {
        let shards = cores().min(2);
        let timer = ShardedTimer::builder()
            .shards(shards)
            .callbacks(callbacks)
            .thread_name("aud-wake")
            .build()
            .unwrap();
        let lateness: Vec<Vec<(Duration, i128)>> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..shards)
                .map(|k| {
                    let timer = &timer;
                    scope.spawn(move || {
                        pin_to(k);
                        let far = timer.schedule(Duration::from_secs(10), || {}).unwrap();
                        // Let the shard take the far timer in and park until it.
                        std::thread::sleep(Duration::from_millis(20));
                        let mut out = Vec::new();
                        for round in 0..12u64 {
                            let delay = [1, 5, 20][(round % 3) as usize];
                            let delay = Duration::from_millis(delay);
                            let fired_at = Arc::new(OnceLock::<Instant>::new());
                            let slot = fired_at.clone();
                            let handle = timer
                                .schedule(delay, move || {
                                    let _ = slot.set(Instant::now());
                                })
                                .unwrap();
                            let ran =
                                wait_until(Duration::from_secs(5), || fired_at.get().is_some());
                            assert!(ran, "{mode}: a {delay:?} timer never fired in 5 s");
                            let at = *fired_at.get().unwrap();
                            let late = at.saturating_duration_since(handle.deadline());
                            let early = if at < handle.deadline() {
                                (handle.deadline() - at).as_nanos() as i128
                            } else {
                                0
                            };
                            out.push((late, early));
                            // Let the shard park again until +10 s.
                            std::thread::sleep(Duration::from_millis(3 + round % 4));
                        }
                        assert!(far.cancel(), "the far timer was still pending");
                        out
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        for (late, early) in lateness.into_iter().flatten() {
            assert_eq!(early, 0, "{mode}: fired {early} ns early");
            assert!(
                late < Duration::from_millis(200),
                "{mode}: fired {late:?} late"
            );
        }
        let stats = quiescent_stats(&timer);
        assert_eq!(stats.scheduled, shards as u64 * 13);
        assert_eq!(stats.fired, shards as u64 * 12);
        assert_eq!(stats.cancelled, shards as u64);
        timer.shutdown();
    }
}

/// A timer at +10 s reset to +5 ms from another thread while its shard sleeps fires
/// within 200 ms of the new deadline, never before it.
#[test]
fn reset_earlier_while_the_shard_sleeps_fires_on_time() {
    let timer = ShardedTimer::builder()
        .shards(1)
        .executor_threads(1)
        .thread_name("aud-rst")
        .build()
        .unwrap();
    for _ in 0..10 {
        let fired_at = Arc::new(OnceLock::<Instant>::new());
        let slot = fired_at.clone();
        let handle = timer
            .schedule(Duration::from_secs(10), move || {
                let _ = slot.set(Instant::now());
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(15));
        let resetter = handle.clone();
        let ok = std::thread::spawn(move || resetter.reset(Duration::from_millis(5)))
            .join()
            .unwrap();
        assert!(ok, "reset of a pending timer returns true");
        assert!(
            wait_until(Duration::from_secs(5), || fired_at.get().is_some()),
            "never fired"
        );
        let at = *fired_at.get().unwrap();
        assert!(at >= handle.deadline(), "fired before its reset deadline");
        let late = at - handle.deadline();
        assert!(late < Duration::from_millis(200), "fired {late:?} late");
    }
    timer.shutdown();
}

// ---------------------------------------------------------------------------------
// Exactly once, cancel true => never runs, Stats at quiescence.
// ---------------------------------------------------------------------------------

struct Tracked {
    runs: AtomicUsize,
    ran_at: OnceLock<Instant>,
}

/// A timer, what its callback did, and its cancel's result (`None`: not cancelled).
type Outcome = (TimerHandle, Arc<Tracked>, Option<bool>);

/// Three threads on one shard schedule 0-4 ms timers and cancel about half of them
/// after a short random spin, while the shard sleeps, turns and fires. Every timer
/// whose cancel returned `true` never runs (and its capture is dropped before the
/// cancel returns); every other one runs exactly once, never early; the stats add up.
#[test]
fn concurrent_schedule_and_cancel_on_one_shard_is_exactly_once() {
    for (mode, callbacks) in [
        ("pool", Callbacks::pool(1)),
        ("inline", Callbacks::inline()),
    ] {
        let timer = ShardedTimer::builder()
            .shards(1)
            .callbacks(callbacks)
            .thread_name("aud-x1")
            .build()
            .unwrap();
        let per_thread = 400usize;
        let results: Vec<Vec<Outcome>> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..3u64)
                .map(|t| {
                    let timer = &timer;
                    scope.spawn(move || {
                        let mut rng = Rng::new(t + 1);
                        let mut out = Vec::with_capacity(per_thread);
                        for _ in 0..per_thread {
                            let tracked = Arc::new(Tracked {
                                runs: AtomicUsize::new(0),
                                ran_at: OnceLock::new(),
                            });
                            let capture = tracked.clone();
                            let dropped = Arc::new(AtomicBool::new(false));
                            let flag = dropped.clone();
                            let guard = on_drop(move || flag.store(true, SeqCst));
                            let delay = Duration::from_micros(rng.below(4000));
                            let handle = timer
                                .schedule(delay, move || {
                                    let _keep = &guard;
                                    let _ = capture.ran_at.set(Instant::now());
                                    capture.runs.fetch_add(1, SeqCst);
                                })
                                .unwrap();
                            let cancelled = if rng.below(2) == 0 {
                                let spin = Instant::now();
                                let spin_for = Duration::from_micros(rng.below(3000));
                                while spin.elapsed() < spin_for {
                                    std::hint::spin_loop();
                                }
                                let won = handle.cancel();
                                if won {
                                    assert!(
                                        dropped.load(SeqCst),
                                        "a winning cancel returned before dropping the capture"
                                    );
                                }
                                Some(won)
                            } else {
                                None
                            };
                            out.push((handle, tracked, cancelled));
                        }
                        out
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let all: Vec<_> = results.into_iter().flatten().collect();
        let must_run: Vec<_> = all.iter().filter(|(_, _, c)| *c != Some(true)).collect();
        let ran = wait_until(WAIT, || {
            must_run.iter().all(|(_, t, _)| t.runs.load(SeqCst) >= 1)
        });
        let missing = must_run
            .iter()
            .filter(|(_, t, _)| t.runs.load(SeqCst) == 0)
            .count();
        assert!(ran, "{mode}: {missing} uncancelled timers never ran");
        let stats = quiescent_stats(&timer);
        let mut cancelled_true = 0u64;
        for (handle, tracked, cancelled) in &all {
            let runs = tracked.runs.load(SeqCst);
            if *cancelled == Some(true) {
                cancelled_true += 1;
                assert_eq!(runs, 0, "{mode}: cancel returned true but the callback ran");
                assert_eq!(handle.state(), TimerState::Cancelled);
            } else {
                assert_eq!(runs, 1, "{mode}: ran {runs} times");
                assert_eq!(handle.state(), TimerState::Fired);
                let at = *tracked.ran_at.get().unwrap();
                assert!(at >= handle.deadline(), "{mode}: ran before its deadline");
            }
        }
        let total = all.len() as u64;
        assert_eq!(stats.scheduled, total, "{mode}: {stats:?}");
        assert_eq!(stats.cancelled, cancelled_true, "{mode}: {stats:?}");
        assert_eq!(stats.fired, total - cancelled_true, "{mode}: {stats:?}");
        let shard_fired: u64 = stats.shards.iter().map(|s| s.fired).sum();
        assert_eq!(shard_fired, stats.fired);
        timer.shutdown();
    }
}

/// A cancel racing the expiry: cancels issued from -300 µs to +300 µs around the
/// deadline, by two threads at once on one handle. At most one cancel wins; a winner
/// means the callback never runs, no winner means it runs exactly once.
#[test]
fn cancel_racing_expiry_has_exactly_one_outcome() {
    for (mode, callbacks) in [
        ("pool", Callbacks::pool(1)),
        ("inline", Callbacks::inline()),
    ] {
        let timer = ShardedTimer::builder()
            .shards(1)
            .callbacks(callbacks)
            .thread_name("aud-race")
            .build()
            .unwrap();
        let mut outcomes = Vec::new();
        let mut rng = Rng::new(99);
        for _ in 0..300 {
            let runs = Arc::new(AtomicUsize::new(0));
            let counter = runs.clone();
            let handle = timer
                .schedule(Duration::from_millis(1), move || {
                    counter.fetch_add(1, SeqCst);
                })
                .unwrap();
            let offset = rng.below(600) as i64 - 300;
            let at = if offset >= 0 {
                handle.deadline() + Duration::from_micros(offset as u64)
            } else {
                handle.deadline() - Duration::from_micros((-offset) as u64)
            };
            let wins: Vec<bool> = std::thread::scope(|scope| {
                let racers: Vec<_> = (0..2)
                    .map(|_| {
                        let handle = handle.clone();
                        scope.spawn(move || {
                            while Instant::now() < at {
                                std::hint::spin_loop();
                            }
                            handle.cancel()
                        })
                    })
                    .collect();
                racers.into_iter().map(|r| r.join().unwrap()).collect()
            });
            let won = wins.iter().filter(|w| **w).count();
            assert!(
                won <= 1,
                "{mode}: two cancels of one timer both returned true"
            );
            outcomes.push((handle, runs, won == 1));
        }
        let settled = wait_until(WAIT, || {
            outcomes
                .iter()
                .all(|(_, runs, won)| *won || runs.load(SeqCst) == 1)
        });
        assert!(settled, "{mode}: a timer no cancel won never ran");
        // Give a wrongly surviving cancelled timer time to run (its deadline is long past).
        std::thread::sleep(Duration::from_millis(30));
        let mut won_count = 0;
        for (handle, runs, won) in &outcomes {
            let runs = runs.load(SeqCst);
            if *won {
                won_count += 1;
                assert_eq!(runs, 0, "{mode}: cancel won but the callback ran");
                assert_eq!(handle.state(), TimerState::Cancelled);
            } else {
                assert_eq!(runs, 1, "{mode}: no cancel won, ran {runs} times");
                assert_eq!(handle.state(), TimerState::Fired);
            }
        }
        let stats = quiescent_stats(&timer);
        assert_eq!(stats.cancelled, won_count, "{mode}: {stats:?}");
        assert_eq!(stats.fired, 300 - won_count, "{mode}: {stats:?}");
        timer.shutdown();
    }
}

// ---------------------------------------------------------------------------------
// Shutdown racing schedules.
// ---------------------------------------------------------------------------------

/// Two producers (one per core) schedule 0 ms, 1 ms and 10 s timers until refused,
/// while two other threads call `shutdown` at once. Every `Ok` timer either ran
/// exactly once (handle `Fired`) or came back as exactly one `Unfired` (and did not
/// run); every refusal is `Shutdown`; nothing runs after both shutdowns returned;
/// every capture is dropped once the `Unfired`s are.
#[test]
fn schedule_racing_shutdown_accounts_for_every_timer() {
    for round in 0..8u64 {
        let inline = round % 2 == 1;
        let callbacks = if inline {
            Callbacks::inline()
        } else {
            Callbacks::pool(2)
        };
        let timer = ShardedTimer::builder()
            .shards(2)
            .callbacks(callbacks)
            .thread_name("aud-shut")
            .build()
            .unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let drops = Arc::new(AtomicUsize::new(0));
        let attempts = Arc::new(AtomicUsize::new(0));
        let start = Arc::new(AtomicBool::new(false));
        let (oks, unfired) = std::thread::scope(|scope| {
            let producers: Vec<_> = (0..2u64)
                .map(|k| {
                    let timer = &timer;
                    let runs = runs.clone();
                    let drops = drops.clone();
                    let attempts = attempts.clone();
                    scope.spawn(move || {
                        pin_to(k as usize);
                        let mut rng = Rng::new(round * 7 + k + 1);
                        let mut oks: Vec<(TimerHandle, Arc<AtomicUsize>)> = Vec::new();
                        let began = Instant::now();
                        loop {
                            let mine = Arc::new(AtomicUsize::new(0));
                            let (counter, total) = (mine.clone(), runs.clone());
                            let drops = drops.clone();
                            let guard = on_drop(move || {
                                drops.fetch_add(1, SeqCst);
                            });
                            let delay = match rng.below(3) {
                                0 => Duration::ZERO,
                                1 => Duration::from_millis(1),
                                _ => Duration::from_secs(10),
                            };
                            attempts.fetch_add(1, SeqCst);
                            match timer.schedule(delay, move || {
                                let _keep = &guard;
                                counter.fetch_add(1, SeqCst);
                                total.fetch_add(1, SeqCst);
                            }) {
                                Ok(handle) => oks.push((handle, mine)),
                                Err(ScheduleError::Shutdown) => break,
                                Err(other) => panic!("unexpected refusal {other:?}"),
                            }
                            // Past 20,000 timers, slow down rather than fail: on a
                            // loaded machine the closers may wait for a core while
                            // these pinned producers run (a full test run beside
                            // another test binary once got 20,000 in first). The
                            // bound that fails: no refusal within WAIT.
                            if oks.len() > 20_000 {
                                assert!(
                                    began.elapsed() < WAIT,
                                    "shutdown never refused a schedule"
                                );
                                std::thread::sleep(Duration::from_micros(100));
                            }
                        }
                        assert_eq!(
                            timer.schedule(Duration::ZERO, || {}).unwrap_err(),
                            ScheduleError::Shutdown
                        );
                        oks
                    })
                })
                .collect();
            // Let the producers get going, then shut down from two threads at once.
            assert!(wait_until(WAIT, || attempts.load(SeqCst) > 300 + 50 * round as usize));
            let closers: Vec<_> = (0..2)
                .map(|_| {
                    let timer = &timer;
                    let start = &start;
                    scope.spawn(move || {
                        while !start.load(SeqCst) {
                            std::hint::spin_loop();
                        }
                        timer.shutdown()
                    })
                })
                .collect();
            start.store(true, SeqCst);
            let unfired: Vec<_> = closers
                .into_iter()
                .flat_map(|c| c.join().unwrap())
                .collect();
            let oks: Vec<_> = producers
                .into_iter()
                .flat_map(|p| p.join().unwrap())
                .collect();
            (oks, unfired)
        });
        let runs_after_shutdown = runs.load(SeqCst);
        let unfired_ids: HashSet<TimerId> = unfired.iter().map(|u| u.id()).collect();
        assert_eq!(
            unfired_ids.len(),
            unfired.len(),
            "round {round}: an Unfired came back twice"
        );
        let mut ran = 0;
        let mut lost = Vec::new();
        for (handle, mine) in &oks {
            let count = mine.load(SeqCst);
            let back = unfired_ids.contains(&handle.id());
            match (count, back) {
                (1, false) => {
                    ran += 1;
                    assert_eq!(handle.state(), TimerState::Fired);
                }
                (0, true) => {}
                _ => lost.push((handle.id(), count, back, handle.state())),
            }
        }
        assert!(
            lost.is_empty(),
            "round {round} (inline {inline}): {} of {} timers neither ran once nor came back \
             once (id, runs, unfired, state): {:?}",
            lost.len(),
            oks.len(),
            &lost[..lost.len().min(5)]
        );
        assert_eq!(
            ran + unfired.len(),
            oks.len(),
            "round {round}: an Unfired of no Ok timer"
        );
        assert_eq!(runs_after_shutdown, ran, "round {round}");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            runs.load(SeqCst),
            ran,
            "round {round}: a callback ran after shutdown"
        );
        drop(unfired);
        let total_attempts = attempts.load(SeqCst);
        // Each attempt's capture is dropped: run, refused, or dropped with its Unfired.
        assert!(
            wait_until(Duration::from_secs(5), || drops.load(SeqCst)
                == total_attempts),
            "round {round}: {} of {total_attempts} captures dropped",
            drops.load(SeqCst)
        );
        let stats = timer.stats();
        assert_eq!(
            stats.pending, 0,
            "round {round}: pending after shutdown: {stats:?}"
        );
    }
}

// ---------------------------------------------------------------------------------
// Hostile captures and wakers: user code dropped must find the service whole.
// ---------------------------------------------------------------------------------

/// A winning cancel drops the capture on the calling thread; that capture's Drop
/// cancels another timer of the same shard, and schedules a third there. Neither
/// deadlocks; the second timer never runs; the third runs.
#[test]
fn capture_drop_cancels_and_schedules_on_the_same_shard() {
    for (mode, callbacks) in [
        ("pool", Callbacks::pool(1)),
        ("inline", Callbacks::inline()),
    ] {
        let timer = ShardedTimer::builder()
            .shards(1)
            .callbacks(callbacks)
            .thread_name("aud-drop")
            .build()
            .unwrap();
        for fire in [false, true] {
            let y_runs = Arc::new(AtomicUsize::new(0));
            let y_counter = y_runs.clone();
            let y = timer
                .schedule(Duration::from_secs(10), move || {
                    y_counter.fetch_add(1, SeqCst);
                })
                .unwrap();
            let y_cancelled = Arc::new(OnceLock::<bool>::new());
            let z_runs = Arc::new(AtomicUsize::new(0));
            let (y2, slot, z_counter, service) = (
                y.clone(),
                y_cancelled.clone(),
                z_runs.clone(),
                timer.clone(),
            );
            let guard = on_drop(move || {
                let _ = slot.set(y2.cancel());
                service
                    .schedule(Duration::from_millis(1), move || {
                        z_counter.fetch_add(1, SeqCst);
                    })
                    .expect("schedule from a capture's Drop");
            });
            let delay = if fire {
                Duration::from_millis(1)
            } else {
                Duration::from_secs(10)
            };
            let x = timer.schedule(delay, move || drop(guard)).unwrap();
            if !fire {
                let x2 = x.clone();
                assert!(joined_within(mode, Duration::from_secs(10), move || x2.cancel()));
            }
            assert!(
                wait_until(Duration::from_secs(10), || y_cancelled.get().is_some()),
                "{mode} fire {fire}: the capture's Drop never ran (or hung)"
            );
            assert_eq!(y_cancelled.get(), Some(&true), "{mode}: y was pending");
            assert!(
                wait_until(Duration::from_secs(5), || z_runs.load(SeqCst) == 1),
                "{mode} fire {fire}: z scheduled from a Drop never ran"
            );
            assert_eq!(y_runs.load(SeqCst), 0);
        }
        let stats = quiescent_stats(&timer);
        assert_eq!(stats.scheduled, 6, "{mode}: {stats:?}");
        assert_eq!(stats.cancelled, 3, "{mode}: {stats:?}");
        assert_eq!(stats.fired, 3, "{mode}: {stats:?}");
        timer.shutdown();
    }
}

/// A capture whose Drop shuts the service down, dropped by a winning cancel on the
/// calling thread (direct unlink), by a refusal (`TooManyPending`), by a fired
/// callback (pool and inline) and by a dropped `Unfired`: none deadlocks, and the
/// other pending timer comes back.
#[test]
fn capture_drop_that_shuts_down_the_service_does_not_deadlock() {
    for path in ["cancel", "refused", "fired-pool", "fired-inline"] {
        let callbacks = if path == "fired-inline" {
            Callbacks::inline()
        } else {
            Callbacks::pool(1)
        };
        let timer = ShardedTimer::builder()
            .shards(1)
            .callbacks(callbacks)
            .max_pending(2)
            .thread_name("aud-dsd")
            .build()
            .unwrap();
        let other = timer.schedule(Duration::from_secs(10), || {}).unwrap();
        let back = Arc::new(Mutex::new(None::<Vec<TimerId>>));
        let (service, slot) = (timer.clone(), back.clone());
        let guard = on_drop(move || {
            let unfired = service.shutdown();
            *slot.lock().unwrap() = Some(unfired.iter().map(|u| u.id()).collect());
        });
        match path {
            "cancel" => {
                let x = timer
                    .schedule(Duration::from_secs(10), move || drop(guard))
                    .unwrap();
                assert!(joined_within(path, Duration::from_secs(10), move || x.cancel()));
            }
            "refused" => {
                let _filler = timer.schedule(Duration::from_secs(10), || {}).unwrap();
                let service = timer.clone();
                let err = joined_within(path, Duration::from_secs(10), move || {
                    service
                        .schedule(Duration::from_secs(10), move || drop(guard))
                        .unwrap_err()
                });
                assert_eq!(err, ScheduleError::TooManyPending { limit: 2 });
            }
            _ => {
                timer
                    .schedule(Duration::from_millis(1), move || drop(guard))
                    .unwrap();
            }
        }
        assert!(
            wait_until(Duration::from_secs(10), || back.lock().unwrap().is_some()),
            "{path}: the Drop's shutdown never returned"
        );
        let ids = back.lock().unwrap().take().unwrap();
        assert!(
            ids.contains(&other.id()),
            "{path}: the other timer did not come back"
        );
        assert_eq!(
            timer.schedule(Duration::ZERO, || {}).unwrap_err(),
            ScheduleError::Shutdown
        );
    }
}

/// A pending `Sleep` polled with waker A, then with waker B (A is let go), then
/// dropped from its thread (direct unlink). A's Drop schedules and cancels on the
/// same shard; B's Drop shuts the service down. Nothing deadlocks, neither waker is
/// woken (dropping only cancels), both are dropped.
#[test]
fn sleep_waker_drop_reenters_the_same_service() {
    for (mode, callbacks) in [
        ("pool", Callbacks::pool(1)),
        ("inline", Callbacks::inline()),
    ] {
        let timer = ShardedTimer::builder()
            .shards(1)
            .callbacks(callbacks)
            .thread_name("aud-wk")
            .build()
            .unwrap();
        let a_dropped = Arc::new(AtomicBool::new(false));
        let b_dropped = Arc::new(AtomicBool::new(false));
        let (service, flag) = (timer.clone(), a_dropped.clone());
        let (waker_a, woken_a) = hostile_waker(move || {
            let h = service.schedule(Duration::from_secs(10), || {}).unwrap();
            assert!(h.cancel());
            flag.store(true, SeqCst);
        });
        let (service, flag) = (timer.clone(), b_dropped.clone());
        let (waker_b, woken_b) = hostile_waker(move || {
            let _ = service.shutdown();
            flag.store(true, SeqCst);
        });
        let service = timer.clone();
        joined_within(mode, Duration::from_secs(10), move || {
            let mut sleep = Box::pin(service.sleep(Duration::from_secs(10)));
            assert!(poll_once(sleep.as_mut(), &waker_a).is_pending());
            drop(waker_a);
            assert!(poll_once(sleep.as_mut(), &waker_b).is_pending());
            drop(waker_b);
            drop(sleep);
        });
        assert!(
            wait_until(Duration::from_secs(10), || a_dropped.load(SeqCst)
                && b_dropped.load(SeqCst)),
            "{mode}: a waker was never dropped (a {}, b {})",
            a_dropped.load(SeqCst),
            b_dropped.load(SeqCst)
        );
        assert_eq!(
            woken_a.load(SeqCst) + woken_b.load(SeqCst),
            0,
            "{mode}: a dropped sleep woke"
        );
        assert_eq!(
            timer.schedule(Duration::ZERO, || {}).unwrap_err(),
            ScheduleError::Shutdown
        );
    }
}

/// A `Sleep` that fires inline wakes a waker whose Drop (on the shard thread, after
/// the wake) schedules and cancels on the same shard and then shuts it down.
#[test]
fn fired_sleep_waker_drop_on_the_shard_thread_reenters() {
    let timer = ShardedTimer::builder()
        .shards(1)
        .callbacks(Callbacks::inline())
        .thread_name("aud-wk2")
        .build()
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let (service, flag) = (timer.clone(), done.clone());
    let (waker, woken) = hostile_waker(move || {
        let h = service.schedule(Duration::from_secs(10), || {}).unwrap();
        assert!(h.cancel());
        let _ = service.shutdown();
        flag.store(true, SeqCst);
    });
    let mut sleep = Box::pin(timer.sleep(Duration::from_millis(2)));
    assert!(poll_once(sleep.as_mut(), &waker).is_pending());
    drop(waker);
    assert!(
        wait_until(Duration::from_secs(10), || woken.load(SeqCst) == 1),
        "never woken"
    );
    // The sleep still holds its waker until the timer lets it go, or the sleep is polled.
    assert!(poll_once(sleep.as_mut(), Waker::noop()).is_ready());
    drop(sleep);
    assert!(
        wait_until(Duration::from_secs(10), || done.load(SeqCst)),
        "the waker's Drop never finished (deadlock?)"
    );
}

/// Two threads make, poll and drop pending sleeps (1-3 ms and 10 s) on one shard: a
/// sleep dropped before its deadline is never woken afterwards (one dropped after it
/// may see its timer's one wake land after the drop), every waker is dropped, and the
/// service ends with nothing pending.
#[test]
fn dropping_pending_sleeps_from_two_threads_wakes_nobody_afterwards() {
    let timer = ShardedTimer::builder()
        .shards(1)
        .callbacks(Callbacks::inline())
        .thread_name("aud-slp")
        .build()
        .unwrap();
    // Each record: the waker's wake count, that count when the sleep was dropped,
    // whether the waker was dropped, whether the sleep was a 10 s one; and whether
    // its first poll came back before its deadline could have passed (a sleep whose
    // deadline has passed by its first poll completes there with no timer,
    // guarantee 8: under load a thread can be descheduled for longer than 1 ms).
    // And whether it was dropped before its deadline.
    type Record = (Arc<AtomicUsize>, usize, Arc<AtomicBool>, bool, bool, bool);
    let records: Vec<Record> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let timer = &timer;
                scope.spawn(move || {
                    let mut rng = Rng::new(t + 11);
                    let mut out = Vec::new();
                    for _ in 0..300 {
                        let dropped = Arc::new(AtomicBool::new(false));
                        let flag = dropped.clone();
                        let (waker, woken) = hostile_waker(move || flag.store(true, SeqCst));
                        let long = rng.below(4) == 0;
                        let d = if long {
                            Duration::from_secs(10)
                        } else {
                            Duration::from_micros(1000 + rng.below(2000))
                        };
                        let made = Instant::now();
                        let mut sleep = Box::pin(timer.sleep(d));
                        let _ = poll_once(sleep.as_mut(), &waker);
                        let surely_armed = made.elapsed() < d;
                        drop(waker);
                        let spin = Instant::now();
                        let spin_for = Duration::from_micros(rng.below(2500));
                        while spin.elapsed() < spin_for {
                            std::hint::spin_loop();
                        }
                        // Dropped before its deadline (read before the drop, so
                        // surely before): its timer cannot have fired (never early),
                        // so no wake can come afterwards. Dropped after it, the
                        // timer may be firing on the shard thread: its one wake can
                        // land after the drop returns (tokio's too: its driver wakes
                        // outside its lock), and the sleep was not pending then.
                        let before_deadline = Instant::now() < made + d;
                        drop(sleep);
                        let at_drop = woken.load(SeqCst);
                        out.push((woken, at_drop, dropped, long, surely_armed, before_deadline));
                    }
                    out
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    let all_dropped = wait_until(WAIT, || records.iter().all(|r| r.2.load(SeqCst)));
    assert!(all_dropped, "a waker of a dropped sleep was never dropped");
    for (woken, at_drop, _, long, _, before_deadline) in &records {
        let wakes = woken.load(SeqCst);
        if *before_deadline {
            assert_eq!(
                wakes, *at_drop,
                "a sleep dropped before its deadline was woken after the drop"
            );
        } else {
            assert!(wakes <= 1, "a sleep was woken {wakes} times");
        }
        if *long {
            assert_eq!(wakes, 0, "a 10 s sleep was woken");
        }
    }
    // Every sleep whose first poll returned before its deadline armed a timer (on an
    // unloaded machine, all 600); one descheduled past its deadline may have not.
    let surely_armed = records.iter().filter(|r| r.4).count() as u64;
    let stats = quiescent_stats(&timer);
    assert!(
        (surely_armed..=600).contains(&stats.scheduled),
        "{surely_armed} sleeps were surely armed: {stats:?}"
    );
    timer.shutdown();
}

// ---------------------------------------------------------------------------------
// Re-entrancy from an inline callback onto its own shard.
// ---------------------------------------------------------------------------------

/// On one inline shard, a callback schedules 40 timers (0-3 ms) onto its own shard
/// and cancels every other one at once (they cannot have fired: the shard is busy
/// running this callback), and a chain of 200 zero-delay timers reschedules itself,
/// while another thread schedules onto the same shard. Every cancel wins; cancelled
/// timers never run; the rest run once.
#[test]
fn inline_callback_schedules_and_cancels_on_its_own_shard_while_firing() {
    let timer = ShardedTimer::builder()
        .shards(1)
        .callbacks(Callbacks::inline())
        .thread_name("aud-inl")
        .build()
        .unwrap();
    let fanout_runs = Arc::new(AtomicUsize::new(0));
    let cancel_losses = Arc::new(AtomicUsize::new(0));
    let fanout_done = Arc::new(AtomicBool::new(false));
    let (service, runs, losses, done) = (
        timer.clone(),
        fanout_runs.clone(),
        cancel_losses.clone(),
        fanout_done.clone(),
    );
    timer
        .schedule(Duration::from_millis(2), move || {
            for k in 0..40u64 {
                let runs = runs.clone();
                let h = service
                    .schedule(Duration::from_micros(k * 75), move || {
                        runs.fetch_add(1, SeqCst);
                    })
                    .unwrap();
                if k % 2 == 0 && !h.cancel() {
                    losses.fetch_add(1, SeqCst);
                }
            }
            done.store(true, SeqCst);
        })
        .unwrap();
    // The chain.
    let chain = Arc::new(AtomicUsize::new(0));
    fn link(timer: ShardedTimer, chain: Arc<AtomicUsize>) {
        let next = timer.clone();
        timer
            .schedule(Duration::ZERO, move || {
                if chain.fetch_add(1, SeqCst) + 1 < 200 {
                    link(next, chain);
                }
            })
            .unwrap();
    }
    link(timer.clone(), chain.clone());
    // Meanwhile another thread.
    let outside_runs = Arc::new(AtomicUsize::new(0));
    let service = timer.clone();
    let counter = outside_runs.clone();
    std::thread::spawn(move || {
        for k in 0..200u64 {
            let counter = counter.clone();
            service
                .schedule(Duration::from_micros(k * 20), move || {
                    counter.fetch_add(1, SeqCst);
                })
                .unwrap();
        }
    })
    .join()
    .unwrap();
    assert!(
        wait_until(WAIT, || fanout_done.load(SeqCst)),
        "fan-out callback never ran"
    );
    assert!(
        wait_until(WAIT, || chain.load(SeqCst) == 200),
        "chain stalled at {}",
        chain.load(SeqCst)
    );
    assert!(wait_until(WAIT, || fanout_runs.load(SeqCst) >= 20));
    assert!(wait_until(WAIT, || outside_runs.load(SeqCst) >= 200));
    assert_eq!(
        cancel_losses.load(SeqCst),
        0,
        "a cancel from the firing shard lost"
    );
    let stats = quiescent_stats(&timer);
    assert_eq!(
        fanout_runs.load(SeqCst),
        20,
        "a cancelled fan-out timer ran"
    );
    assert_eq!(outside_runs.load(SeqCst), 200);
    assert_eq!(stats.scheduled, 1 + 40 + 200 + 200, "{stats:?}");
    assert_eq!(stats.cancelled, 20, "{stats:?}");
    timer.shutdown();
}

// ---------------------------------------------------------------------------------
// max_pending exact under concurrency.
// ---------------------------------------------------------------------------------

/// Limit 32, one then two shards: three threads schedule 10 s timers and cancel
/// their own at random. The pending count seen by the test never exceeds 32. Then,
/// quiescent, 60 concurrent schedules get exactly 32 `Ok`; cancelling 5 gives room to
/// exactly 5 more; and once 32 short timers have all run, 32 more fit.
#[test]
fn max_pending_is_exact_under_concurrent_schedule_and_cancel() {
    const LIMIT: usize = 32;
    for shards in [1usize, 2] {
        let timer = ShardedTimer::builder()
            .shards(shards)
            .executor_threads(1)
            .max_pending(LIMIT)
            .thread_name("aud-max")
            .build()
            .unwrap();
        // A lower bound of the true pending count: raised after an Ok returns,
        // lowered before a cancel is asked.
        let live = Arc::new(AtomicI64::new(0));
        let peak = Arc::new(AtomicI64::new(0));
        let refusals = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|scope| {
            for t in 0..3u64 {
                let (timer, live, peak, refusals) = (&timer, &live, &peak, &refusals);
                scope.spawn(move || {
                    pin_to(t as usize);
                    let mut rng = Rng::new(t + 21);
                    let mut mine: Vec<TimerHandle> = Vec::new();
                    for _ in 0..1500 {
                        if rng.below(3) != 0 {
                            match timer.schedule(Duration::from_secs(10), || {}) {
                                Ok(h) => {
                                    let now = live.fetch_add(1, SeqCst) + 1;
                                    peak.fetch_max(now, SeqCst);
                                    mine.push(h);
                                }
                                Err(ScheduleError::TooManyPending { limit }) => {
                                    assert_eq!(limit, LIMIT);
                                    refusals.fetch_add(1, SeqCst);
                                }
                                Err(e) => panic!("{e:?}"),
                            }
                        } else if !mine.is_empty() {
                            let k = rng.below(mine.len() as u64) as usize;
                            let h = mine.swap_remove(k);
                            live.fetch_sub(1, SeqCst);
                            assert!(h.cancel(), "a pending 10 s timer's cancel lost");
                        }
                    }
                    for h in mine {
                        live.fetch_sub(1, SeqCst);
                        assert!(h.cancel());
                    }
                });
            }
        });
        assert!(
            peak.load(SeqCst) <= LIMIT as i64,
            "shards {shards}: {} pending",
            peak.load(SeqCst)
        );
        assert!(
            refusals.load(SeqCst) > 0,
            "shards {shards}: the limit was never reached"
        );
        // Quiescent: 60 concurrent schedules, exactly LIMIT succeed.
        let got: Vec<TimerHandle> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..3usize)
                .map(|t| {
                    let timer = &timer;
                    scope.spawn(move || {
                        pin_to(t);
                        (0..20)
                            .filter_map(|_| timer.schedule(Duration::from_secs(10), || {}).ok())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect()
        });
        assert_eq!(got.len(), LIMIT, "shards {shards}: concurrent fill");
        for h in &got[..5] {
            assert!(h.cancel());
        }
        let more: Vec<_> = (0..8)
            .filter_map(|_| timer.schedule(Duration::from_secs(10), || {}).ok())
            .collect();
        assert_eq!(
            more.len(),
            5,
            "shards {shards}: cancelling 5 made room for exactly 5"
        );
        for h in got.iter().chain(&more) {
            h.cancel();
        }
        // Firing frees room: 32 short timers, all run, then 32 long ones fit.
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..LIMIT {
            let ran = ran.clone();
            timer
                .schedule(Duration::from_millis(1), move || {
                    ran.fetch_add(1, SeqCst);
                })
                .unwrap();
        }
        assert!(wait_until(WAIT, || ran.load(SeqCst) == LIMIT));
        let refill: Vec<_> = (0..LIMIT)
            .map(|_| timer.schedule(Duration::from_secs(10), || {}))
            .collect();
        let refused = refill.iter().filter(|r| r.is_err()).count();
        assert_eq!(
            refused, 0,
            "shards {shards}: {refused} refused after every timer ran"
        );
        timer.shutdown();
    }
}

// ---------------------------------------------------------------------------------
// Routing by core.
// ---------------------------------------------------------------------------------

/// Two shards on a 2-core machine: threads pinned to core 0 and core 1 schedule 300
/// and 200 10 s timers; shard k's pending count is what core k scheduled. Each
/// thread then cancels the other core's timers (cross-shard unlink): all win.
#[test]
fn timers_go_to_the_shard_of_the_callers_core_and_cancel_across_cores() {
    if cores() < 2 {
        eprintln!("skipped: fewer than 2 cores");
        return;
    }
    let timer = ShardedTimer::builder()
        .shards(2)
        .executor_threads(1)
        .thread_name("aud-rt")
        .build()
        .unwrap();
    let counts = [300usize, 200];
    let handles: Vec<Vec<TimerHandle>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2usize)
            .map(|k| {
                let timer = &timer;
                scope.spawn(move || {
                    assert!(pin_to(k));
                    (0..counts[k])
                        .map(|_| timer.schedule(Duration::from_secs(10), || {}).unwrap())
                        .collect()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let mut last = timer.stats();
    let settled = wait_until(WAIT, || {
        last = timer.stats();
        last.in_rings == 0 && last.pending == 500
    });
    assert!(settled, "{last:?}");
    assert_eq!(
        [last.shards[0].pending, last.shards[1].pending],
        [300, 200],
        "timers were not filed in their core's shard"
    );
    let wins: usize = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2usize)
            .map(|k| {
                let theirs = &handles[1 - k];
                scope.spawn(move || {
                    assert!(pin_to(k));
                    theirs.iter().filter(|h| h.cancel()).count()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    });
    assert_eq!(wins, 500);
    let stats = quiescent_stats(&timer);
    assert_eq!(stats.cancelled, 500, "{stats:?}");
    timer.shutdown();
}

/// A thread that hops between cores on every operation schedules 1-3 ms timers and
/// cancels half of them, beside a thread pinned to core 0 doing the same, on a
/// 2-shard inline service: exactly once, never early, stats add up.
#[test]
fn core_hopping_producers_keep_exactly_once() {
    let timer = ShardedTimer::builder()
        .shards(2)
        .callbacks(Callbacks::inline())
        .thread_name("aud-hop")
        .build()
        .unwrap();
    let all: Vec<(TimerHandle, Arc<Tracked>, bool)> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let timer = &timer;
                scope.spawn(move || {
                    let mut rng = Rng::new(t + 31);
                    let mut out = Vec::new();
                    for i in 0..400usize {
                        pin_to(if t == 0 { i } else { 0 });
                        let tracked = Arc::new(Tracked {
                            runs: AtomicUsize::new(0),
                            ran_at: OnceLock::new(),
                        });
                        let capture = tracked.clone();
                        let h = timer
                            .schedule(Duration::from_micros(1000 + rng.below(2000)), move || {
                                let _ = capture.ran_at.set(Instant::now());
                                capture.runs.fetch_add(1, SeqCst);
                            })
                            .unwrap();
                        let won = if rng.below(2) == 0 {
                            pin_to(if t == 0 { i + 1 } else { 0 });
                            h.cancel()
                        } else {
                            false
                        };
                        out.push((h, tracked, won));
                    }
                    out
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    assert!(wait_until(WAIT, || all
        .iter()
        .all(|(_, t, won)| *won || t.runs.load(SeqCst) == 1)));
    let stats = quiescent_stats(&timer);
    let won = all.iter().filter(|a| a.2).count() as u64;
    for (h, t, w) in &all {
        assert_eq!(t.runs.load(SeqCst), usize::from(!*w));
        if !*w {
            assert!(*t.ran_at.get().unwrap() >= h.deadline(), "ran early");
        }
    }
    assert_eq!(
        (stats.scheduled, stats.cancelled, stats.fired),
        (800, won, 800 - won),
        "{stats:?}"
    );
    timer.shutdown();
}

// ---------------------------------------------------------------------------------
// Rescue of a stuck shard.
// ---------------------------------------------------------------------------------

/// Shard 0 (inline, rescue after 4 ticks of 1 ms) is stuck 400 ms in a callback;
/// meanwhile a thread on core 0 schedules 20 timers 5 ms ahead, one every 5 ms, onto
/// that shard. Each fires never early and within 150 ms (rescue), not after 400 ms.
#[test]

fn timers_filed_into_a_stuck_shard_are_rescued_on_time() {
    if cores() < 2 {
        eprintln!("skipped: fewer than 2 cores");
        return;
    }
    let timer = ShardedTimer::builder()
        .shards(2)
        .callbacks(Callbacks::inline())
        .rescue_after(Some(Duration::from_millis(4)))
        .thread_name("aud-res")
        .build()
        .unwrap();
    let late: Vec<(Duration, bool)> = std::thread::scope(|scope| {
        let timer = &timer;
        scope
            .spawn(move || {
                assert!(pin_to(0));
                let stuck = Arc::new(AtomicBool::new(false));
                let flag = stuck.clone();
                timer
                    .schedule(Duration::from_millis(1), move || {
                        flag.store(true, SeqCst);
                        std::thread::sleep(Duration::from_millis(400));
                    })
                    .unwrap();
                assert!(wait_until(Duration::from_secs(5), || stuck.load(SeqCst)));
                let began = Instant::now();
                let mut slots = Vec::new();
                for _ in 0..20 {
                    let at = Arc::new(OnceLock::<Instant>::new());
                    let slot = at.clone();
                    let h = timer
                        .schedule(Duration::from_millis(5), move || {
                            let _ = slot.set(Instant::now());
                        })
                        .unwrap();
                    slots.push((h, at));
                    std::thread::sleep(Duration::from_millis(5));
                    if began.elapsed() > Duration::from_millis(300) {
                        break;
                    }
                }
                assert!(wait_until(WAIT, || slots
                    .iter()
                    .all(|s| s.1.get().is_some())));
                slots
                    .iter()
                    .map(|(h, at)| {
                        let at = *at.get().unwrap();
                        (
                            at.saturating_duration_since(h.deadline()),
                            at >= h.deadline(),
                        )
                    })
                    .collect()
            })
            .join()
            .unwrap()
    });
    eprintln!(
        "lateness: {:?}",
        late.iter().map(|l| l.0.as_millis()).collect::<Vec<_>>()
    );
    for (i, (late, on_or_after)) in late.iter().enumerate() {
        assert!(on_or_after, "timer {i} fired early");
        assert!(
            *late < Duration::from_millis(150),
            "timer {i} fired {late:?} late"
        );
    }
    timer.shutdown();
}

// ---------------------------------------------------------------------------------
// ManualClock: schedules from other threads while `advance` runs.
// ---------------------------------------------------------------------------------

/// Two threads schedule 0-50 ms (manual) timers onto a 2-shard manual-clock service
/// and cancel a third of them, while the test thread advances by 1-5 ms steps. After
/// each `advance` returns, every timer whose `schedule` returned before it began and
/// whose deadline is at or before the new now (and not cancelled-true) has run; no
/// callback sees a now before its deadline; finally every timer ran once or was
/// cancelled.
#[test]
fn manual_advance_fires_everything_due_while_other_threads_schedule() {
    for (mode, callbacks) in [
        ("pool", Callbacks::pool(2)),
        ("inline", Callbacks::inline()),
    ] {
        let clock = ManualClock::new();
        let timer = ShardedTimer::builder()
            .shards(2)
            .callbacks(callbacks)
            .clock(clock.clone())
            .thread_name("aud-man")
            .build()
            .unwrap();
        type Published = Arc<Mutex<Vec<(TimerHandle, Arc<Tracked2>, Arc<AtomicBool>)>>>;
        struct Tracked2 {
            runs: AtomicUsize,
            now_at_run: OnceLock<Instant>,
        }
        let published: Published = Arc::default();
        let producers_done = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|scope| {
            for t in 0..2u64 {
                let (timer, clock, published, done) = (&timer, &clock, &published, &producers_done);
                scope.spawn(move || {
                    pin_to(t as usize);
                    let mut rng = Rng::new(t + 41);
                    for _ in 0..400 {
                        let tracked = Arc::new(Tracked2 {
                            runs: AtomicUsize::new(0),
                            now_at_run: OnceLock::new(),
                        });
                        let (capture, clock2) = (tracked.clone(), clock.clone());
                        let h = timer
                            .schedule(Duration::from_micros(rng.below(50_000)), move || {
                                let _ = capture.now_at_run.set(clock2.now());
                                capture.runs.fetch_add(1, SeqCst);
                            })
                            .unwrap();
                        let cancelled = Arc::new(AtomicBool::new(false));
                        if rng.below(3) == 0 && h.cancel() {
                            cancelled.store(true, SeqCst);
                        }
                        published.lock().unwrap().push((h, tracked, cancelled));
                        if rng.below(8) == 0 {
                            std::thread::yield_now();
                        }
                    }
                    done.fetch_add(1, SeqCst);
                });
            }
            let mut rng = Rng::new(7);
            let mut steps = 0;
            while producers_done.load(SeqCst) < 2 || steps < 20 {
                let before: Vec<_> = published
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(h, t, c)| (h.clone(), t.clone(), c.clone()))
                    .collect();
                clock.advance(Duration::from_micros(1000 + rng.below(4000)));
                steps += 1;
                let now = clock.now();
                for (h, t, c) in &before {
                    if h.deadline() <= now && !c.load(SeqCst) {
                        // A cancel may still be racing this advance: only a timer whose
                        // cancel was never tried or lost must have run. A cancel that
                        // wins later cannot be told apart here, so re-check by state.
                        if t.runs.load(SeqCst) == 0 {
                            assert_ne!(
                                h.state(),
                                TimerState::Fired,
                                "{mode}: state Fired but the callback had not returned after advance"
                            );
                            assert_eq!(
                                h.state(),
                                TimerState::Cancelled,
                                "{mode}: a due timer scheduled before advance did not run \
                                 (deadline {:?} <= now {:?})",
                                h.deadline(),
                                now
                            );
                        }
                    }
                }
                if steps > 2000 {
                    panic!("{mode}: producers never finished");
                }
            }
        });
        clock.advance(Duration::from_millis(100));
        let all = published.lock().unwrap();
        assert_eq!(all.len(), 800);
        let mut cancelled = 0;
        for (h, t, c) in all.iter() {
            let runs = t.runs.load(SeqCst);
            if c.load(SeqCst) {
                cancelled += 1;
                assert_eq!(runs, 0, "{mode}: cancelled and ran");
            } else {
                assert_eq!(
                    runs, 1,
                    "{mode}: ran {runs} times after advancing past everything"
                );
                assert!(
                    *t.now_at_run.get().unwrap() >= h.deadline(),
                    "{mode}: ran early"
                );
            }
        }
        let stats = timer.stats();
        assert_eq!(stats.scheduled, 800, "{mode}: {stats:?}");
        assert_eq!(stats.cancelled, cancelled, "{mode}: {stats:?}");
        assert_eq!(stats.fired, 800 - cancelled, "{mode}: {stats:?}");
        assert_eq!(stats.pending, 0, "{mode}: {stats:?}");
        timer.shutdown();
    }
}

// ---------------------------------------------------------------------------------
// An idle service makes no wake-ups.
// ---------------------------------------------------------------------------------

/// Context switches of this process's threads whose name starts with `prefix`.
fn switches_of(prefix: &str) -> Option<u64> {
    let mut total = 0;
    let mut found = false;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.trim_end().starts_with(prefix) {
            continue;
        }
        found = true;
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        for line in status.lines() {
            if line.starts_with("voluntary_ctxt_switches")
                || line.starts_with("nonvoluntary_ctxt_switches")
            {
                total += line.split_whitespace().last()?.parse::<u64>().ok()?;
            }
        }
    }
    found.then_some(total)
}

/// Two shards: threads on each core schedule 200 timers 50-150 ms ahead and cancel
/// them all at once (unlinked on the calling thread). Past every deadline they had,
/// the shard threads make no wake-up in 500 ms.
#[test]
fn idle_service_after_direct_cancels_makes_no_wakeups() {
    let timer = ShardedTimer::builder()
        .shards(2)
        .executor_threads(1)
        .thread_name("aud-idle")
        .build()
        .unwrap();
    std::thread::scope(|scope| {
        for k in 0..2usize {
            let timer = &timer;
            scope.spawn(move || {
                pin_to(k);
                let mut rng = Rng::new(k as u64 + 51);
                let hs: Vec<_> = (0..200)
                    .map(|_| {
                        timer
                            .schedule(Duration::from_millis(50 + rng.below(100)), || {})
                            .unwrap()
                    })
                    .collect();
                for h in hs {
                    assert!(h.cancel());
                }
            });
        }
    });
    let first = switches_of("aud-idle-s");
    std::thread::sleep(Duration::from_millis(300));
    let second = switches_of("aud-idle-s");
    std::thread::sleep(Duration::from_millis(500));
    let third = switches_of("aud-idle-s");
    let (Some(first), Some(second), Some(third)) = (first, second, third) else {
        eprintln!("skipped: no /proc task names");
        return;
    };
    eprintln!(
        "shard wake-ups: {} in the first 300 ms, {} in the next 500 ms",
        second - first,
        third - second
    );
    assert_eq!(
        third - second,
        0,
        "an idle service's shards woke {} times in 500 ms",
        third - second
    );
    let stats = quiescent_stats(&timer);
    assert_eq!((stats.scheduled, stats.cancelled), (400, 400), "{stats:?}");
    timer.shutdown();
}

/// A burst of 2000 timers due at once on one inline shard, while two threads
/// schedule and cancel 1-2 ms timers onto that shard during the burst: exactly
/// once, cancel true means never ran, stats add up.
#[test]
fn schedule_and_cancel_during_an_inline_burst() {
    let timer = ShardedTimer::builder()
        .shards(1)
        .callbacks(Callbacks::inline())
        .thread_name("aud-bur")
        .build()
        .unwrap();
    let burst_runs = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_millis(20);
    for _ in 0..2000 {
        let runs = burst_runs.clone();
        timer
            .schedule_at(deadline, move || {
                runs.fetch_add(1, SeqCst);
                std::hint::black_box(0..50).for_each(drop);
            })
            .unwrap();
    }
    let all: Vec<(TimerHandle, Arc<AtomicUsize>, bool)> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let timer = &timer;
                scope.spawn(move || {
                    while Instant::now() < deadline {
                        std::hint::spin_loop();
                    }
                    let mut rng = Rng::new(t + 61);
                    (0..300)
                        .map(|_| {
                            let runs = Arc::new(AtomicUsize::new(0));
                            let c = runs.clone();
                            let h = timer
                                .schedule(Duration::from_micros(500 + rng.below(1500)), move || {
                                    c.fetch_add(1, SeqCst);
                                })
                                .unwrap();
                            let won = rng.below(2) == 0 && h.cancel();
                            (h, runs, won)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    assert!(wait_until(WAIT, || burst_runs.load(SeqCst) == 2000));
    assert!(wait_until(WAIT, || all
        .iter()
        .all(|(_, r, w)| *w || r.load(SeqCst) == 1)));
    let stats = quiescent_stats(&timer);
    let won = all.iter().filter(|a| a.2).count() as u64;
    for (_, r, w) in &all {
        assert_eq!(r.load(SeqCst), usize::from(!*w));
    }
    assert_eq!(burst_runs.load(SeqCst), 2000);
    assert_eq!(
        (stats.scheduled, stats.cancelled, stats.fired),
        (2600, won, 2600 - won),
        "{stats:?}"
    );
    timer.shutdown();
}

/// Shrunk from the test above. Shard 0 (inline, rescue after 4 ms) is stuck 400 ms in
/// a callback and its wheel is otherwise empty (`far`: false) or holds a 10 s timer
/// (`far`: true); 50 ms into the stall a thread on core 0 schedules one timer 5 ms
/// ahead onto shard 0. Returns how late it fired.
fn lateness_of_a_timer_filed_into_a_stuck_shard(far: bool) -> Duration {
    assert!(cores() >= 2, "needs 2 cores");
    let timer = ShardedTimer::builder()
        .shards(2)
        .callbacks(Callbacks::inline())
        .rescue_after(Some(Duration::from_millis(4)))
        .thread_name("aud-res1")
        .build()
        .unwrap();
    let service = timer.clone();
    let late = std::thread::spawn(move || {
        assert!(pin_to(0));
        let _far = far.then(|| service.schedule(Duration::from_secs(10), || {}).unwrap());
        let stuck = Arc::new(AtomicBool::new(false));
        let flag = stuck.clone();
        service
            .schedule(Duration::from_millis(1), move || {
                flag.store(true, SeqCst);
                std::thread::sleep(Duration::from_millis(400));
            })
            .unwrap();
        assert!(wait_until(Duration::from_secs(5), || stuck.load(SeqCst)));
        std::thread::sleep(Duration::from_millis(50));
        let at = Arc::new(OnceLock::<Instant>::new());
        let slot = at.clone();
        let h = service
            .schedule(Duration::from_millis(5), move || {
                let _ = slot.set(Instant::now());
            })
            .unwrap();
        assert!(wait_until(WAIT, || at.get().is_some()));
        let at = *at.get().unwrap();
        assert!(at >= h.deadline(), "fired early");
        at - h.deadline()
    })
    .join()
    .unwrap();
    timer.shutdown();
    late
}

#[test]

fn timer_filed_into_a_stuck_shard_with_an_empty_wheel_is_rescued() {
    if cores() < 2 {
        return;
    }
    let late = lateness_of_a_timer_filed_into_a_stuck_shard(false);
    assert!(
        late < Duration::from_millis(150),
        "fired {late:?} late (stall: 400 ms)"
    );
}

#[test]

fn timer_filed_into_a_stuck_shard_holding_a_far_timer_is_rescued() {
    if cores() < 2 {
        return;
    }
    let late = lateness_of_a_timer_filed_into_a_stuck_shard(true);
    assert!(
        late < Duration::from_millis(150),
        "fired {late:?} late (stall: 400 ms)"
    );
}

/// Two threads schedule 10 s timers and cancel them (unlinked on the calling
/// thread) while a third shuts the service down: a timer whose cancel returned
/// `true` never comes back as `Unfired`; every other `Ok` timer comes back exactly
/// once; none runs.
#[test]
fn cancel_racing_shutdown_never_hands_back_a_cancelled_timer() {
    for round in 0..6u64 {
        let timer = ShardedTimer::builder()
            .shards(2)
            .executor_threads(1)
            .thread_name("aud-cxs")
            .build()
            .unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let attempts = Arc::new(AtomicUsize::new(0));
        let (records, unfired) = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..2u64)
                .map(|k| {
                    let (timer, runs, attempts) = (&timer, &runs, &attempts);
                    scope.spawn(move || {
                        pin_to(k as usize);
                        let mut rng = Rng::new(round * 3 + k + 71);
                        let mut out: Vec<(TimerHandle, bool)> = Vec::new();
                        let mut live: Vec<usize> = Vec::new();
                        loop {
                            attempts.fetch_add(1, SeqCst);
                            let runs = runs.clone();
                            match timer.schedule(Duration::from_secs(10), move || {
                                runs.fetch_add(1, SeqCst);
                            }) {
                                Ok(h) => {
                                    live.push(out.len());
                                    out.push((h, false));
                                }
                                Err(ScheduleError::Shutdown) => break,
                                Err(e) => panic!("{e:?}"),
                            }
                            if rng.below(2) == 0 && !live.is_empty() {
                                let i = live.swap_remove(rng.below(live.len() as u64) as usize);
                                out[i].1 = out[i].0.cancel();
                            }
                            assert!(out.len() < 50_000, "shutdown never refused");
                        }
                        // Cancels racing the rest of the shutdown: they may win
                        // (the timer is not yet handed back), and must then not come back.
                        for i in live {
                            out[i].1 = out[i].0.cancel();
                        }
                        out
                    })
                })
                .collect();
            assert!(wait_until(WAIT, || attempts.load(SeqCst) > 400 + 40 * round as usize));
            let unfired = timer.shutdown();
            let records: Vec<_> = workers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect();
            (records, unfired)
        });
        let back: HashSet<TimerId> = unfired.iter().map(|u| u.id()).collect();
        assert_eq!(back.len(), unfired.len());
        for (h, won) in &records {
            assert_ne!(
                *won,
                back.contains(&h.id()),
                "round {round}: cancel won {won}, handed back {}",
                back.contains(&h.id())
            );
        }
        assert_eq!(back.len(), records.iter().filter(|r| !r.1).count());
        assert_eq!(runs.load(SeqCst), 0);
    }
}

/// A repeating 1 ms timer cancelled from another thread at a random moment: once
/// `cancel` has returned `true` (and a run under way has finished), no run starts.
#[test]
fn repeating_timer_cancelled_from_another_thread_stops() {
    let timer = ShardedTimer::builder()
        .shards(1)
        .executor_threads(1)
        .thread_name("aud-rep")
        .build()
        .unwrap();
    let mut rng = Rng::new(81);
    for _ in 0..20 {
        let runs = Arc::new(AtomicUsize::new(0));
        let in_run = Arc::new(AtomicBool::new(false));
        let (counter, flag) = (runs.clone(), in_run.clone());
        let h = timer
            .schedule_repeating(Duration::from_millis(1), move || {
                flag.store(true, SeqCst);
                counter.fetch_add(1, SeqCst);
                flag.store(false, SeqCst);
            })
            .unwrap();
        std::thread::sleep(Duration::from_micros(500 + rng.below(5000)));
        let h2 = h.clone();
        assert!(std::thread::spawn(move || h2.cancel()).join().unwrap());
        assert!(wait_until(Duration::from_secs(5), || !in_run.load(SeqCst)));
        let after = runs.load(SeqCst);
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(
            runs.load(SeqCst),
            after,
            "a repeating timer ran after its cancel won"
        );
        assert_eq!(h.state(), TimerState::Cancelled);
    }
    let mut stats = timer.stats();
    let settled = wait_until(WAIT, || {
        stats = timer.stats();
        stats.pending == 0 && stats.in_rings == 0 && stats.cancelled == 20
    });
    assert!(settled, "{stats:?}");
    assert_eq!(stats.scheduled, 20, "{stats:?}");
    timer.shutdown();
}

/// A pending 10 s `Sleep` reset (on its own thread) to 5 ms ahead while the shard
/// sleeps until +10 s: woken within 200 ms of the new deadline, not before it.
#[test]
fn sleep_reset_earlier_while_the_shard_sleeps_wakes_on_time() {
    let timer = ShardedTimer::builder()
        .shards(1)
        .callbacks(Callbacks::inline())
        .thread_name("aud-srs")
        .build()
        .unwrap();
    for _ in 0..10 {
        let (waker, woken) = hostile_waker(|| {});
        let mut sleep = Box::pin(timer.sleep(Duration::from_secs(10)));
        assert!(poll_once(sleep.as_mut(), &waker).is_pending());
        std::thread::sleep(Duration::from_millis(15));
        let new_deadline = Instant::now() + Duration::from_millis(5);
        sleep.as_mut().reset(new_deadline.into());
        assert!(poll_once(sleep.as_mut(), &waker).is_pending());
        assert!(
            wait_until(Duration::from_secs(5), || woken.load(SeqCst) >= 1),
            "never woken"
        );
        let at = Instant::now();
        assert!(at >= new_deadline);
        assert!(
            at - new_deadline < Duration::from_millis(200),
            "woken {:?} late",
            at - new_deadline
        );
        assert!(poll_once(sleep.as_mut(), &waker).is_ready());
        assert!(sleep.is_elapsed());
    }
    timer.shutdown();
}
