//! Where callbacks run: inline on the shard thread, handed to the user's spawner (and
//! rayon), beside the default pool. Every guarantee holds in every mode: never early,
//! exactly once, nothing lost at shutdown; callbacks are hostile (they panic, shut the
//! service down, hold its last clone, schedule into their own full ring).

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use sharded_timer::{Callbacks, ShardedTimer};
use support::{queued, wait_until, within, DropCounter, WAIT};

/// A service of `shards` shards whose callbacks run as `callbacks` says.
fn service(shards: usize, callbacks: Callbacks) -> ShardedTimer {
    ShardedTimer::builder()
        .shards(shards)
        .callbacks(callbacks)
        .pin_cores(false)
        .thread_name("cb")
        .build()
        .expect("the service builds")
}

/// Schedules 2,000 timers due within 20 ms, cancels every third, and checks that
/// exactly the others ran, once each, none early. `drive` runs whatever the mode
/// needs to get callbacks run (nothing, or the test's own executor).
fn exactly_once_never_early(timer: ShardedTimer, drive: impl Fn()) {
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..2_000).map(|_| AtomicUsize::new(0)).collect());
    let early = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..2_000)
        .map(|i| {
            let deadline = start + Duration::from_micros(10 * i as u64);
            let (runs, early) = (runs.clone(), early.clone());
            timer
                .schedule_at(deadline, move || {
                    if Instant::now() < deadline {
                        early.fetch_add(1, Ordering::SeqCst);
                    }
                    runs[i].fetch_add(1, Ordering::SeqCst);
                })
                .unwrap()
        })
        .collect();
    let cancelled: Vec<bool> = handles
        .iter()
        .enumerate()
        .map(|(i, h)| i % 3 == 0 && h.cancel())
        .collect();
    let expected = cancelled.iter().filter(|c| !**c).count();
    assert!(wait_until(WAIT, || {
        drive();
        runs.iter().map(|r| r.load(Ordering::SeqCst)).sum::<usize>() >= expected
    }));
    // Shutdown joins every thread that could still run a duplicate (and hands the
    // spawner's last callbacks over), so the counts below are final.
    assert!(
        timer.shutdown().is_empty(),
        "every timer fired or was cancelled"
    );
    drive();
    for (i, cancelled) in cancelled.iter().enumerate() {
        let n = runs[i].load(Ordering::SeqCst);
        assert_eq!(n, usize::from(!cancelled), "timer {i} ran {n} times");
    }
    assert_eq!(early.load(Ordering::SeqCst), 0);
}

#[test]
fn every_mode_runs_each_timer_exactly_once_and_never_early() {
    exactly_once_never_early(service(2, Callbacks::pool(2)), || {});
    exactly_once_never_early(service(2, Callbacks::inline()), || {});
    let (callbacks, queue) = queued();
    exactly_once_never_early(service(2, callbacks), || {
        for callback in queue.try_iter() {
            callback.run();
        }
    });
}

#[test]
fn inline_callbacks_run_on_the_shard_thread_in_deadline_order() {
    let timer = service(1, Callbacks::inline());
    let order = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now() + Duration::from_millis(30);
    // Scheduled in reverse, due 1 ms apart: they must run in deadline order.
    for i in (0..20u64).rev() {
        let order = order.clone();
        timer
            .schedule_at(start + Duration::from_millis(i), move || {
                let name = std::thread::current().name().unwrap_or("").to_owned();
                order.lock().unwrap().push((i, name));
            })
            .unwrap();
    }
    assert!(wait_until(WAIT, || order.lock().unwrap().len() == 20));
    let order = order.lock().unwrap();
    assert_eq!(
        order.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        (0..20).collect::<Vec<_>>()
    );
    assert!(order.iter().all(|(_, name)| name == "cb-s0"), "{order:?}");
}

#[test]
fn a_panicking_inline_callback_is_counted_and_its_shard_lives_on() {
    let timer = service(1, Callbacks::inline());
    for _ in 0..3 {
        timer
            .schedule(Duration::ZERO, || panic!("on purpose"))
            .unwrap();
    }
    assert!(wait_until(WAIT, || timer.stats().panicked == 3));
    let (tx, rx) = mpsc::channel();
    timer
        .schedule(Duration::from_millis(1), move || tx.send(()).unwrap())
        .unwrap();
    assert_eq!(rx.recv_timeout(WAIT), Ok(()));
}

#[test]
fn inline_callbacks_schedule_and_cancel_on_their_own_full_ring_without_waiting_for_themselves() {
    // Rings of 2: a callback scheduling 1,000 timers fills its own shard's ring at
    // once, and the shard is the thread running it.
    let timer = ShardedTimer::builder()
        .shards(1)
        .ring_capacity(2)
        .callbacks(Callbacks::inline())
        .pin_cores(false)
        .thread_name("cb")
        .build()
        .unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let inner = timer.clone();
    let ran_inner = ran.clone();
    timer
        .schedule(Duration::ZERO, move || {
            let handles: Vec<_> = (0..1_000)
                .map(|_| {
                    let ran = ran_inner.clone();
                    inner
                        .schedule(Duration::from_millis(1), move || {
                            ran.fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap()
                })
                .collect();
            // Cancels go to the same shard's message ring, also of 2 slots.
            for handle in &handles[..500] {
                assert!(handle.cancel());
            }
        })
        .unwrap();
    assert!(wait_until(WAIT, || ran.load(Ordering::SeqCst) == 500));
    assert!(wait_until(WAIT, || timer.stats().pending == 0));
    // Shutdown joins the shard: nothing can run after it, so the count is final.
    assert!(timer.shutdown().is_empty());
    assert_eq!(
        ran.load(Ordering::SeqCst),
        500,
        "the 500 cancelled never ran"
    );
}

#[test]
fn shutdown_from_an_inline_callback_returns_every_pending_timer_its_own_shards_included() {
    let timer = service(2, Callbacks::inline());
    let ran = Arc::new(AtomicUsize::new(0));
    // Pending on both shards, an hour away (`schedule` routes by the caller's core:
    // 500 from each of 2 cores).
    support::on_each_core(2, |_| {
        for _ in 0..500 {
            timer.schedule(Duration::from_secs(3600), || {}).unwrap();
        }
    });
    support::wait_filed(&timer, 1_000);
    let loads = timer.stats().shards;
    assert!(loads.iter().all(|s| s.pending > 0), "{loads:?}");
    // Due together with the shutdown: each either fired with it (then it runs
    // before shutdown returns, on whichever shard) or is still pending (then it comes
    // back).
    let due = Instant::now() + Duration::from_millis(5);
    for _ in 0..10 {
        let ran = ran.clone();
        timer
            .schedule_at(due, move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    let (tx, rx) = mpsc::channel();
    let inner = timer.clone();
    timer
        .schedule_at(due, move || {
            let unfired = inner.shutdown();
            tx.send(unfired.len()).unwrap();
            // Idempotent, from here too.
            assert!(inner.shutdown().is_empty());
        })
        .unwrap();
    let unfired = rx
        .recv_timeout(WAIT)
        .expect("shutdown returned in the callback");
    assert_eq!(
        unfired + ran.load(Ordering::SeqCst),
        1_010,
        "every pending timer of both shards came back; every fired one ran"
    );
    assert!(
        unfired >= 1_000,
        "the hour-away timers of both shards came back"
    );
    assert!(timer.shutdown().is_empty());
    assert!(timer.schedule(Duration::ZERO, || {}).is_err());
}

#[test]
fn an_inline_callback_holding_the_last_clone_shuts_the_service_down_by_dropping_it() {
    let dropped = DropCounter::default();
    let finished = within(WAIT, move || {
        let timer = service(2, Callbacks::inline());
        let (tx, rx) = mpsc::channel();
        let last = timer.clone();
        let token = dropped.token();
        timer
            .schedule(Duration::from_millis(2), move || {
                drop(last); // the last clone, by now: the service shuts down here
                drop(token);
                tx.send(()).unwrap();
            })
            .unwrap();
        let _pending = timer.schedule(Duration::from_secs(3600), || {}).unwrap();
        drop(timer);
        rx.recv_timeout(WAIT).unwrap();
        dropped.dropped()
    });
    assert_eq!(
        finished,
        Some(1),
        "the callback ran and the service shut down"
    );
}

#[test]
fn an_inline_callback_resetting_itself_gets_false() {
    let timer = service(1, Callbacks::inline());
    let (tx, rx) = mpsc::channel();
    let slot: Arc<Mutex<Option<sharded_timer::TimerHandle>>> = Arc::default();
    let mine = slot.clone();
    let handle = timer
        .schedule(Duration::from_millis(5), move || {
            let reset = mine
                .lock()
                .unwrap()
                .as_ref()
                .map(|h| h.reset(Duration::from_secs(1)));
            tx.send(reset).unwrap();
        })
        .unwrap();
    *slot.lock().unwrap() = Some(handle);
    assert_eq!(
        rx.recv_timeout(WAIT),
        Ok(Some(false)),
        "a fired timer stays fired"
    );
}

#[test]
fn a_spawned_callback_knows_its_timer_runs_once_and_counts_its_panic() {
    let (callbacks, queue) = queued();
    let timer = service(1, callbacks);
    let ran = Arc::new(AtomicUsize::new(0));
    let before = Instant::now();
    let ran_clone = ran.clone();
    let handle = timer
        .schedule(Duration::from_millis(3), move || {
            ran_clone.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let callback = queue.recv_timeout(WAIT).unwrap();
    assert_eq!(callback.id(), handle.id());
    assert!(callback.deadline() >= before + Duration::from_millis(3));
    assert!(callback.deadline() >= handle.deadline());
    assert_eq!(ran.load(Ordering::SeqCst), 0, "handed over, not run");
    callback.run();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    timer
        .schedule(Duration::ZERO, || panic!("on purpose"))
        .unwrap();
    queue.recv_timeout(WAIT).unwrap().run(); // caught, not propagated
    assert_eq!(timer.stats().panicked, 1);
}

#[test]
fn a_spawned_callback_dropped_unrun_drops_its_closure_and_stays_runnable_after_shutdown() {
    let (callbacks, queue) = queued();
    let timer = service(1, callbacks);
    let dropped = DropCounter::default();
    let token = dropped.token();
    timer.schedule(Duration::ZERO, move || drop(token)).unwrap();
    drop(queue.recv_timeout(WAIT).unwrap());
    assert_eq!(
        dropped.dropped(),
        1,
        "the closure was dropped with the Callback"
    );

    let ran = Arc::new(AtomicUsize::new(0));
    let ran_clone = ran.clone();
    timer
        .schedule(Duration::ZERO, move || {
            ran_clone.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let callback = queue.recv_timeout(WAIT).unwrap();
    assert!(timer.shutdown().is_empty());
    drop(timer);
    callback.run();
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "runnable after the service is gone"
    );
}

#[test]
fn a_panicking_spawner_is_counted_and_its_callback_dropped() {
    let timer = service(
        1,
        Callbacks::spawn(|_callback| panic!("spawner on purpose")),
    );
    let dropped = DropCounter::default();
    let token = dropped.token();
    timer.schedule(Duration::ZERO, move || drop(token)).unwrap();
    assert!(wait_until(WAIT, || timer.stats().panicked == 1));
    assert_eq!(dropped.dropped(), 1);
}

/// A sleep's wake handed to a spawner (one shard: no rescuer, so the wake leaves as the
/// mode says) that drops it unrun, or panics on it: the timer fired, so the sleep and
/// the timeout still complete elapsed, never before their deadline, and are not
/// refused (they were, with `Shutdown`, while the service ran, before this round; the
/// blind audit of issue 41 noticed).
#[test]
fn a_sleeps_wake_dropped_by_the_spawner_completes_it_elapsed_not_refused() {
    for panics in [false, true] {
        let timer = service(
            1,
            Callbacks::spawn(move |callback| {
                if panics {
                    panic!("spawner on purpose");
                }
                drop(callback);
            }),
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let start = Instant::now();
        let sleep = timer.sleep(Duration::from_millis(5));
        let deadline = sleep.deadline().into_std();
        let timeout = timer.timeout(Duration::from_millis(5), std::future::pending::<()>());
        let (slept, timed_out) = runtime.block_on(async {
            let mut sleep = std::pin::pin!(sleep);
            (&mut sleep).await;
            let refused = sleep.refused();
            (refused, timeout.await)
        });
        assert!(Instant::now() >= deadline, "never early");
        assert!(start.elapsed() >= Duration::from_millis(5));
        assert_eq!(
            slept, None,
            "the sleep elapsed (panicking spawner: {panics})"
        );
        let elapsed = timed_out.expect_err("the timeout elapsed");
        assert_eq!(
            elapsed.refused(),
            None,
            "elapsed, not refused (panics: {panics})"
        );
        assert!(timer.shutdown().is_empty());
    }
}

// A repeating timer's run dropped unrun cancels the timer: tests/regressions.rs, d6.

#[test]
fn with_a_spawner_shutdown_waits_for_the_hand_over_not_the_run() {
    let (callbacks, queue) = queued();
    let timer = service(2, callbacks);
    for _ in 0..100 {
        timer.schedule(Duration::ZERO, || {}).unwrap();
    }
    let pending: Vec<_> = (0..50)
        .map(|_| timer.schedule(Duration::from_secs(3600), || {}).unwrap())
        .collect();
    assert!(wait_until(WAIT, || timer.stats().fired == 100));
    let unfired = timer.shutdown();
    assert_eq!(unfired.len(), 50);
    assert_eq!(
        queue.try_iter().count(),
        100,
        "every fired timer was handed over"
    );
    drop(pending);
}

#[cfg(feature = "rayon")]
#[test]
fn rayon_runs_the_callbacks_on_its_pool() {
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .thread_name(|k| format!("rayon-{k}"))
            .build()
            .unwrap(),
    );
    let timer = service(2, Callbacks::rayon(pool));
    let (tx, rx) = mpsc::channel();
    for _ in 0..100 {
        let tx = tx.clone();
        timer
            .schedule(Duration::from_millis(1), move || {
                let name = std::thread::current().name().unwrap_or("").to_owned();
                tx.send(name).unwrap();
            })
            .unwrap();
    }
    for _ in 0..100 {
        let name = rx.recv_timeout(WAIT).unwrap();
        assert!(name.starts_with("rayon-"), "{name}");
    }
}

/// Shuts its service down when dropped.
struct ShutdownOnDrop(Option<ShardedTimer>, mpsc::Sender<usize>);

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        if let Some(timer) = self.0.take() {
            let _ = self.1.send(timer.shutdown().len());
        }
    }
}

/// Panics when dropped.
struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("a capture panics on drop, on purpose");
    }
}

#[test]
fn inline_captures_that_panic_or_shut_down_when_dropped_are_survived() {
    let timer = service(1, Callbacks::inline());
    let capture = PanicOnDrop;
    timer
        .schedule(Duration::ZERO, move || {
            let _held = &capture;
        })
        .unwrap();
    assert!(wait_until(WAIT, || timer.stats().panicked == 1));
    let _pending = timer.schedule(Duration::from_secs(3600), || {}).unwrap();
    support::wait_filed(&timer, 2);
    let (tx, rx) = mpsc::channel();
    let capture = ShutdownOnDrop(Some(timer.clone()), tx);
    timer
        .schedule(Duration::from_millis(1), move || {
            let _held = &capture;
        })
        .unwrap();
    assert_eq!(
        rx.recv_timeout(WAIT),
        Ok(1),
        "the capture's drop, on the shard thread, shut the service down and got the pending timer back"
    );
    assert!(timer.shutdown().is_empty());
}
