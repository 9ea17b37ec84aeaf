//! Paused time against tokio's, program by program: each program runs on
//! `tokio::time` first, then, unchanged but for the import, on `sharded_timer::time`,
//! and ours must give tokio's answer (issue 38's five reproducers, the 1 ms grid,
//! tokio's own `start_paused` attribute, and the drop-in's signatures).
//!
//! `on_both!(|t| body)` runs `body` twice, with `t` naming `tokio::time` and then
//! `sharded_timer::time`, each on a fresh current-thread runtime (time enabled, not
//! paused: the bodies pause it as their users do), and returns both answers.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);

/// A fresh current-thread runtime with timers, not paused.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime")
}

/// A fresh current-thread runtime built paused (tokio's `start_paused`).
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

/// Runs `$body` (an async block's contents) on `tokio::time`, then on ours, each in
/// `$runtime()`'s `block_on`; `(tokio's answer, ours)`.
macro_rules! on_both {
    ($runtime:ident, |$t:ident| $body:block) => {{
        let tokio_answer = {
            #[allow(unused_imports, reason = "each program uses part of the namespace")]
            use tokio::time as $t;
            $runtime().block_on(async { $body })
        };
        let ours = {
            #[allow(unused_imports, reason = "each program uses part of the namespace")]
            use sharded_timer::time as $t;
            $runtime().block_on(async { $body })
        };
        (tokio_answer, ours)
    }};
}

/// Polls `future` once (registering its timer), ignoring the outcome.
async fn poll_once<F: Future>(mut future: std::pin::Pin<&mut F>) -> bool {
    poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_ready())).await
}

/// Reproducer 1: a pending sleep reset earlier in place completes at the new
/// deadline under auto-advance (it completed at 9.664 s of 10 s).
#[test]
fn a_sleep_reset_earlier_completes_at_the_new_deadline() {
    let (tokio_answer, ours) = on_both!(runtime, |t| {
        t::pause();
        let start = t::Instant::now();
        let mut sleep = pin!(t::sleep(Duration::from_secs(10)));
        assert!(!poll_once(sleep.as_mut()).await);
        // Whatever drives auto-advance has seen the 10 s timer before it moves.
        tokio::task::yield_now().await;
        sleep.as_mut().reset(start + Duration::from_secs(1));
        sleep.await;
        start.elapsed()
    });
    // Tokio's clock, paused off its grid, lands a tick after the second: 1.001 s.
    assert!(tokio_answer >= Duration::from_secs(1) && tokio_answer <= Duration::from_millis(1002));
    assert_eq!(ours, tokio_answer);
}

/// Reproducer 1, the interval's form: a tick moved earlier by `reset_after` while
/// its timer is pending.
#[test]
fn an_interval_tick_moved_earlier_completes_then() {
    let (tokio_answer, ours) = on_both!(runtime, |t| {
        t::pause();
        let start = t::Instant::now();
        let mut interval = t::interval(Duration::from_secs(10));
        interval.tick().await;
        assert!(!poll_once(pin!(interval.tick())).await);
        tokio::task::yield_now().await;
        interval.reset_after(Duration::from_secs(1));
        let due = interval.tick().await;
        (due - start, start.elapsed())
    });
    assert!(
        tokio_answer.1 >= Duration::from_secs(1) && tokio_answer.1 <= Duration::from_millis(1002)
    );
    assert_eq!(ours, tokio_answer);
}

/// Reproducer 2: tokio's own `timeout` around our sleep of the same length gives
/// `Ok`, as around tokio's sleep (a partly switched code base).
#[test]
fn tokio_timeout_around_our_sleep_of_the_same_length_is_ok() {
    let (tokio_answer, ours) = on_both!(runtime, |t| {
        t::pause();
        let start = t::Instant::now();
        let inner = tokio::time::timeout(10 * MS, t::sleep(10 * MS)).await;
        (inner.is_ok(), start.elapsed())
    });
    assert!(tokio_answer.0);
    assert_eq!(ours, tokio_answer);
}

/// Reproducer 2: a sleep made first is complete once tokio's clock reaches its
/// deadline, at its next poll.
#[test]
fn a_sleep_is_complete_when_tokio_s_clock_reaches_its_deadline() {
    let (tokio_answer, ours) = on_both!(runtime, |t| {
        t::pause();
        let mut ours_first = pin!(t::sleep(10 * MS));
        assert!(!poll_once(ours_first.as_mut()).await);
        tokio::time::sleep(10 * MS).await;
        poll_once(ours_first.as_mut()).await
    });
    assert!(tokio_answer);
    assert_eq!(ours, tokio_answer);
}

/// Reproducer 3: `Delay` and `Skip` judge missed ticks by the clock the task sees,
/// after tokio's clock moved on (a layer still on tokio's sleep).
#[test]
fn missed_ticks_are_judged_by_tokio_s_clock() {
    for behavior in ["delay", "skip", "burst"] {
        for gap in [25, 35] {
            let (tokio_answer, ours) = on_both!(runtime, |t| {
                t::pause();
                let start = t::Instant::now();
                let mut interval = t::interval(10 * MS);
                interval.set_missed_tick_behavior(match behavior {
                    "delay" => t::MissedTickBehavior::Delay,
                    "skip" => t::MissedTickBehavior::Skip,
                    _ => t::MissedTickBehavior::Burst,
                });
                let mut ticks = Vec::new();
                for _ in 0..2 {
                    ticks.push(interval.tick().await - start);
                }
                tokio::time::sleep(gap * MS).await;
                for _ in 0..3 {
                    ticks.push(interval.tick().await - start);
                }
                ticks
            });
            assert_eq!(ours, tokio_answer, "{behavior}, {gap} ms behind");
        }
    }
}

/// Reproducer 4: between two `block_on`s of a live paused runtime, reading the time
/// does not move the paused clock by real time; the next sleep waits for
/// auto-advance, as tokio's.
#[test]
fn reading_the_time_between_block_ons_does_not_move_the_paused_clock() {
    let program = |on_tokio: bool| {
        let runtime = runtime();
        if on_tokio {
            runtime.block_on(async { tokio::time::pause() });
        } else {
            runtime.block_on(async { sharded_timer::time::pause() });
        }
        std::thread::sleep(30 * MS);
        if on_tokio {
            let _ = tokio::time::Instant::now();
        } else {
            let _ = sharded_timer::time::Instant::now();
        }
        std::thread::sleep(30 * MS);
        runtime.block_on(async {
            if on_tokio {
                let start = tokio::time::Instant::now();
                tokio::time::sleep(200 * MS).await;
                start.elapsed()
            } else {
                let start = sharded_timer::time::Instant::now();
                sharded_timer::time::sleep(200 * MS).await;
                start.elapsed()
            }
        })
    };
    let tokio_answer = program(true);
    assert!(tokio_answer >= 200 * MS && tokio_answer <= 202 * MS);
    assert_eq!(program(false), tokio_answer);
}

/// Reproducer 5: a thread paused inside runtime A (still alive) runs runtime B,
/// whose clock is not paused: a sleep there completes in real time, as tokio's (it
/// hung, waiting on A's mirror).
#[test]
fn a_second_runtime_on_a_paused_thread_runs_on_its_own_clock() {
    let program = |on_tokio: bool| {
        let a = runtime();
        if on_tokio {
            a.block_on(async { tokio::time::pause() });
        } else {
            a.block_on(async { sharded_timer::time::pause() });
        }
        let b = runtime();
        let wall = std::time::Instant::now();
        b.block_on(async {
            if on_tokio {
                tokio::time::sleep(10 * MS).await;
            } else {
                sharded_timer::time::sleep(10 * MS).await;
            }
        });
        let took = wall.elapsed();
        drop(a);
        took
    };
    for on_tokio in [true, false] {
        // On a thread of its own, so that a hang fails within a bound.
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || done.send(program(on_tokio)));
        let took = finished
            .recv_timeout(Duration::from_secs(20))
            .expect("the sleep in runtime B completed within 20 s");
        assert!(took >= 10 * MS, "never early: {took:?} (tokio: {on_tokio})");
    }
}

/// Tokio's 1 ms grid, in a runtime built paused: a deadline off the grid (after an
/// `advance` by a fraction) fires on tokio's next tick, as tokio's does.
#[test]
fn deadlines_fall_on_tokio_s_grid_in_a_runtime_built_paused() {
    let (tokio_answer, ours) = on_both!(paused_runtime, |t| {
        let start = t::Instant::now();
        let mut elapsed = Vec::new();
        t::sleep(10 * MS).await;
        elapsed.push(start.elapsed());
        t::advance(Duration::from_micros(1500)).await;
        elapsed.push(start.elapsed());
        let mut sleep = pin!(t::sleep(MS));
        assert!(!poll_once(sleep.as_mut()).await);
        t::advance(Duration::from_micros(600)).await;
        elapsed.push(start.elapsed());
        let ready_after_the_fraction = poll_once(sleep.as_mut()).await;
        sleep.await;
        elapsed.push(start.elapsed());
        let at_the_landing = t::sleep_until(start + Duration::from_micros(13_000));
        at_the_landing.await;
        elapsed.push(start.elapsed());
        (ready_after_the_fraction, elapsed)
    });
    assert_eq!(ours, tokio_answer);
}

/// Tokio's 1 ms grid after `pause()` inside a running runtime (its clock paused off
/// the grid): a timer due exactly where auto-advance lands fires a tick later, as
/// tokio's (ours fired at the landing; the keyed delay queue's failures). Whole
/// milliseconds only: where tokio's grid lies within the millisecond is not told.
#[test]
fn a_deadline_where_auto_advance_lands_fires_on_tokio_s_next_tick() {
    let (tokio_answer, ours) = on_both!(runtime, |t| {
        t::pause();
        let start = t::Instant::now();
        let mut landings = Vec::new();
        t::sleep(5 * MS).await;
        landings.push(start.elapsed());
        let landed = t::Instant::now();
        t::sleep_until(landed + 3 * MS).await;
        landings.push(start.elapsed());
        let mut interval = t::interval_at(t::Instant::now() + 2 * MS, 4 * MS);
        for _ in 0..3 {
            interval.tick().await;
            landings.push(start.elapsed());
        }
        landings
    });
    assert_eq!(ours, tokio_answer);
}

/// Issue 38, item 3: tokio's own `#[tokio::test(start_paused = true)]` with our
/// import: our time follows tokio's paused clock, auto-advance included (it ran a
/// 2.5 s backoff in 2.5 s of wall time).
#[tokio::test(start_paused = true)]
async fn tokio_s_start_paused_attribute_pauses_ours_too() {
    use sharded_timer::time;
    let wall = std::time::Instant::now();
    let start = time::Instant::now();
    let tokio_start = tokio::time::Instant::now();
    for backoff in [100, 400, 2000] {
        time::sleep(backoff * MS).await;
    }
    assert_eq!(start.elapsed(), 2500 * MS);
    assert_eq!(tokio_start.elapsed(), 2500 * MS, "one clock with tokio's");
    assert!(
        wall.elapsed() < Duration::from_secs(2),
        "paused, not real time: {:?}",
        wall.elapsed()
    );
}

/// The same test under our attribute, in the same binary (tests run in parallel).
#[sharded_timer::test(start_paused = true)]
async fn our_start_paused_attribute_beside_tokio_s() {
    use sharded_timer::time;
    let wall = std::time::Instant::now();
    let start = time::Instant::now();
    for backoff in [100, 400, 2000] {
        time::sleep(backoff * MS).await;
    }
    assert_eq!(start.elapsed(), 2500 * MS);
    assert!(wall.elapsed() < Duration::from_secs(2));
}

/// A plain `#[tokio::test]` (clock not paused) with our import runs on real time:
/// the start_paused tests beside it do not pause it.
#[tokio::test]
async fn a_plain_tokio_test_beside_them_runs_on_real_time() {
    use sharded_timer::time;
    let wall = std::time::Instant::now();
    time::sleep(20 * MS).await;
    assert!(wall.elapsed() >= 20 * MS, "never early on real time");
}

/// The drop-in's signatures: a `Stream` wrapper over `Interval::poll_tick` returning
/// `Poll<Option<time::Instant>>` (it failed with E0308), `.into()` from a std instant
/// where tokio takes its `Instant` (E0283), and `Sleep::deadline` compared with a
/// `time::Instant`.
#[test]
fn tokio_s_signatures_compile_unchanged() {
    use sharded_timer::time::{self, Instant, Interval};
    use std::task::Context;

    struct Ticks {
        inner: Interval,
    }
    impl Ticks {
        fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Instant>> {
            self.inner.poll_tick(cx).map(Some)
        }
    }

    paused_runtime().block_on(async {
        let start = Instant::now();
        let mut ticks = Ticks {
            inner: time::interval(5 * MS),
        };
        let first = poll_fn(|cx| ticks.poll_next(cx)).await;
        assert_eq!(first, Some(start));
        let std_deadline = start.into_std() + 3 * MS;
        let mut sleep = pin!(time::sleep_until(std_deadline.into()));
        let deadline: Instant = sleep.deadline();
        assert_eq!(deadline, start + 3 * MS);
        sleep.as_mut().reset(std_deadline.into());
        sleep.await;
        let timeout = time::timeout_at(std_deadline.into(), std::future::pending::<()>());
        assert!(timeout.await.is_err());
        let mut later = time::interval_at(std_deadline.into(), MS);
        assert_eq!(later.tick().await, start + 3 * MS);
        later.reset_at((std_deadline + 2 * MS).into());
        assert_eq!(later.tick().await, start + 5 * MS);
    });
}

/// A sleep beyond the end of tokio's wheel (about 2.2 years of paused time) completes
/// under auto-advance, as tokio's (ours slept at the wheel's end again and again, a
/// busy loop: tokio's own `exactly_max`, found by the conformance step).
#[test]
fn a_sleep_beyond_tokio_s_wheel_completes_under_auto_advance() {
    // Each delay after a first sleep of 0 to 1.5 ms, on a clock paused off the grid
    // and on one built paused: where auto-advance lands decides whether our clock
    // stops inside the far future's grid step (ours spun there, sleeping on tokio until
    // an instant already past, in about 1 run of 2 of tokio's own suite).
    let delays = [
        Duration::MAX,
        Duration::MAX - MS,
        Duration::from_secs(5 * 365 * 86_400),
    ];
    for delay in delays {
        for first_us in [0, 250, 1500] {
            let (done, finished) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let off_grid = on_both!(runtime, |t| {
                    t::pause();
                    t::sleep(Duration::from_micros(first_us)).await;
                    t::sleep(delay).await;
                    true
                });
                let built_paused = on_both!(paused_runtime, |t| {
                    t::sleep(Duration::from_micros(first_us)).await;
                    t::sleep(delay).await;
                    true
                });
                done.send((off_grid, built_paused))
            });
            let answers = finished
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("sleep({delay:?}) completed within 30 s"));
            assert_eq!(answers, ((true, true), (true, true)));
        }
    }
}

/// On the system clock, `sleep(Duration::ZERO).await` yields once, as tokio's: a task
/// spawned before it runs during it (tryhard's `retry_hook_succeed` counted 0 of 10
/// hooks). A deadline further in the past completes at the first poll on both.
#[test]
fn on_the_system_clock_a_zero_sleep_yields_once_as_tokio_s() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let (tokio_answer, ours) = on_both!(runtime, |t| {
        let ran = Arc::new(AtomicBool::new(false));
        let task_ran = ran.clone();
        drop(tokio::spawn(async move {
            task_ran.store(true, Ordering::SeqCst)
        }));
        t::sleep(Duration::ZERO).await;
        let ran_during_the_sleep = ran.load(Ordering::SeqCst);
        let zero_timeout_pending_first = !poll_once(pin!(t::timeout(
            Duration::ZERO,
            std::future::pending::<()>()
        )))
        .await;
        let long_past_ready_first = poll_once(pin!(t::sleep_until(
            t::Instant::now() - Duration::from_millis(50)
        )))
        .await;
        (
            ran_during_the_sleep,
            zero_timeout_pending_first,
            long_past_ready_first,
        )
    });
    assert_eq!(tokio_answer, (true, true, true));
    assert_eq!(ours, tokio_answer);
}
