#![cfg(feature = "tokio")]
//! Outside audit of the claim that, inside a tokio runtime whose clock is paused,
//! `sharded_timer::time` IS `tokio::time` (tokio 1.54): differential programs.
//!
//! Every test runs one program twice, each time on a thread of its own (bounded by
//! `recv_timeout`) with fresh runtimes: once with `t` naming `tokio::time`, once with
//! `t` naming `sharded_timer::time` (the import is the only difference), and asserts
//! that ours gives tokio's answer exactly: the paused time elapsed at each step (read
//! on both `t`'s clock and tokio's own), which future completes or is ready at a
//! given poll, the order of completions, intervals' tick instants, timeouts' `Ok` /
//! `Err`, and which calls panic. Attacked: the 1 ms grid after fractional `advance`s,
//! zero and past deadlines, sleeps and timeouts racing in `select!`, spawned tasks and
//! same-tick wake-ups, resets, intervals (each `MissedTickBehavior`, tokio's 5 ms
//! lateness allowance, sub-millisecond periods, the `reset*` methods), `pause()`
//! inside a running runtime, `resume()` then `pause()`, tokio's timers mixed with
//! ours, `Instant` arithmetic, several runtimes on one thread, `spawn_blocking`,
//! `Duration::MAX`, many timers due at once, the test attributes, and signatures.

use std::fmt::Display;
use std::future::{poll_fn, Future};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

fn ns(n: u64) -> Duration {
    Duration::from_nanos(n)
}

/// A current-thread runtime with timers, built paused (tokio's `start_paused`).
fn paused_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

/// A current-thread runtime with timers, on real time.
fn plain_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime")
}

/// Runs `f` on a fresh thread; its answer, its panic, or a panic after 30 s.
fn bounded<T: Send + 'static>(who: &'static str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(who.into())
        .spawn(move || {
            let _ = tx.send(catch_unwind(AssertUnwindSafe(f)));
        })
        .expect("a thread");
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(answer)) => answer,
        Ok(Err(panic)) => resume_unwind(panic),
        Err(_) => panic!("{who}: the program gave no answer within 30 s (hung)"),
    }
}

/// Runs `$body` (a thread's program) with `$t` naming `tokio::time`, then with `$t`
/// naming `sharded_timer::time`, and asserts the answers are equal.
macro_rules! on_both {
    (|$t:ident| $body:block) => {{
        let theirs = bounded("tokio::time", move || {
            #[allow(unused_imports, reason = "each program uses part of the namespace")]
            use tokio::time as $t;
            $body
        });
        let ours = bounded("sharded_timer::time", move || {
            #[allow(unused_imports, reason = "each program uses part of the namespace")]
            use sharded_timer::time as $t;
            $body
        });
        assert_eq!(
            ours, theirs,
            "left: sharded_timer::time, right: tokio::time"
        );
    }};
}

/// `on_both!` with the body the contents of an async block, run on `paused_rt()`.
macro_rules! paused_both {
    (|$t:ident| $body:block) => {
        on_both!(|$t| { paused_rt().block_on(async move { $body }) })
    };
}

/// A log of steps, each with the paused time elapsed on `t`'s clock and on tokio's.
#[derive(Clone)]
struct Rec {
    log: Arc<Mutex<Vec<String>>>,
    ours0: std::time::Instant,
    tokio0: tokio::time::Instant,
}

impl Rec {
    /// Starts the log now; `ours_now` is `t::Instant::now().into_std()`.
    fn new(ours_now: std::time::Instant) -> Self {
        Rec {
            log: Arc::default(),
            ours0: ours_now,
            tokio0: tokio::time::Instant::now(),
        }
    }

    /// Logs `what` with the time since the start on `t`'s clock and on tokio's.
    fn at(&self, what: impl Display, ours_now: std::time::Instant) {
        let ours = match ours_now.checked_duration_since(self.ours0) {
            Some(d) => format!("{d:?}"),
            None => format!("-{:?}", self.ours0 - ours_now),
        };
        let line = format!(
            "{what} @ {ours} (tokio's clock {:?})",
            self.tokio0.elapsed()
        );
        self.log.lock().unwrap().push(line);
    }

    /// Logs `what` alone.
    fn note(&self, what: impl Display) {
        self.log.lock().unwrap().push(what.to_string());
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

/// `Rec::new` on `$t`'s clock.
macro_rules! rec {
    ($t:ident) => {
        Rec::new($t::Instant::now().into_std())
    };
}

/// `rec.at(format!(..), now on $t's clock)`.
macro_rules! at {
    ($rec:expr, $t:ident, $($fmt:tt)*) => {
        $rec.at(format!($($fmt)*), $t::Instant::now().into_std())
    };
}

/// Polls `future` once; whether it was ready.
async fn poll_once<F: Future + ?Sized>(mut future: Pin<&mut F>) -> bool {
    poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_ready())).await
}

/// Whether `f` panics.
fn panics(f: impl FnOnce()) -> bool {
    catch_unwind(AssertUnwindSafe(f)).is_err()
}

/// After `advance(x)` by whole and fractional milliseconds, a fresh `sleep(y)`: ready
/// at its first poll or not, and the paused time at which it (and one more 1 ms
/// sleep) completes, on tokio's grid in a runtime built paused.
#[test]
fn fractional_advance_then_sleep_lands_where_tokio_s_does() {
    on_both!(|t| {
        let mut out = Vec::new();
        for x in [ns(0), ns(1), us(500), ns(999_999), ms(1), us(1500)] {
            for y in [ns(0), ns(1), us(500), ms(1), us(1500), ms(2), ms(10)] {
                out.push(paused_rt().block_on(async move {
                    let rec = rec!(t);
                    t::advance(x).await;
                    at!(rec, t, "advanced {x:?}");
                    let mut s = pin!(t::sleep(y));
                    let at_once = poll_once(s.as_mut()).await;
                    s.await;
                    at!(rec, t, "sleep({y:?}) ready at first poll: {at_once}; done");
                    t::sleep(ms(1)).await;
                    at!(rec, t, "then sleep(1ms) done");
                    rec.take()
                }));
            }
        }
        out
    });
}

/// Off the grid (clock at 0.5 ms): `sleep(0)`, `sleep_until` a past instant, and
/// `timeout(0, ..)`: ready at the first poll or not, and when they complete.
#[test]
fn zero_and_past_deadlines_off_the_grid() {
    paused_both!(|t| {
        let rec = rec!(t);
        let start = t::Instant::now();
        t::advance(us(500)).await;
        let mut zero = pin!(t::sleep(Duration::ZERO));
        rec.note(format!(
            "sleep(0) ready at once: {}",
            poll_once(zero.as_mut()).await
        ));
        zero.await;
        at!(rec, t, "sleep(0) done");
        let past = t::Instant::now() - us(300);
        let mut s = pin!(t::sleep_until(past));
        rec.note(format!(
            "sleep_until(now - 0.3ms) ready at once: {}",
            poll_once(s.as_mut()).await
        ));
        s.await;
        at!(rec, t, "sleep_until(past) done");
        let r = t::timeout(Duration::ZERO, std::future::pending::<()>()).await;
        at!(rec, t, "timeout(0, pending) ok={}", r.is_ok());
        let r = t::timeout(Duration::ZERO, async { 7 }).await;
        at!(rec, t, "timeout(0, ready) = {:?}", r.ok());
        let r = t::timeout(Duration::ZERO, t::sleep(Duration::ZERO)).await;
        at!(rec, t, "timeout(0, sleep(0)) = {}", r.is_ok());
        let r = t::timeout_at(start, std::future::pending::<()>()).await;
        at!(rec, t, "timeout_at(start, pending) = {}", r.is_ok());
        rec.take()
    });
}

/// Sleeps sharing one tick of tokio's grid race in a biased `select!`: the first
/// branch wins even when its deadline is the later one; distinct ticks: the earlier.
#[test]
fn sleeps_sharing_a_tick_race_in_select_as_tokio_s() {
    on_both!(|t| {
        let mut out = Vec::new();
        for (a, b) in [
            (us(10_700), us(10_200)),
            (us(10_200), us(10_700)),
            (ms(11), us(10_001)),
            (us(10_001), ms(10)),
            (ms(10), ms(10)),
        ] {
            out.push(paused_rt().block_on(async move {
                let rec = rec!(t);
                tokio::select! {
                    biased;
                    _ = t::sleep(a) => at!(rec, t, "{a:?} (first branch) beat {b:?}"),
                    _ = t::sleep(b) => at!(rec, t, "{b:?} (second branch) beat {a:?}"),
                }
                rec.take()
            }));
        }
        out
    });
}

/// `timeout(d, sleep(e))` and `timeout_at` for deadlines on and off the grid:
/// `Ok`/`Err` and when, from a clock on the grid and from one at 0.5 ms.
#[test]
fn timeout_against_its_inner_sleep_on_tokio_s_grid() {
    on_both!(|t| {
        let mut out = Vec::new();
        for offset in [ns(0), us(500)] {
            for (d, e) in [
                (ms(10), ms(10)),
                (ms(10), us(10_500)),
                (us(10_200), us(10_500)),
                (us(10_500), us(10_200)),
                (ms(10), us(9_500)),
                (us(10_500), ms(10)),
                (ms(10), ms(11)),
            ] {
                out.push(paused_rt().block_on(async move {
                    t::advance(offset).await;
                    let rec = rec!(t);
                    let r = t::timeout(d, t::sleep(e)).await;
                    at!(
                        rec,
                        t,
                        "+{offset:?}: timeout({d:?}, sleep({e:?})) ok={}",
                        r.is_ok()
                    );
                    let now = t::Instant::now();
                    let r = t::timeout_at(now + d, t::sleep_until(now + e)).await;
                    at!(
                        rec,
                        t,
                        "timeout_at(+{d:?}, sleep_until(+{e:?})) ok={}",
                        r.is_ok()
                    );
                    rec.take()
                }));
            }
        }
        out
    });
}

/// Spawned tasks sleeping on distinct ticks (fractions included) complete in tokio's
/// order, each at tokio's paused time.
#[test]
fn spawned_sleepers_complete_in_tokio_s_order() {
    paused_both!(|t| {
        let rec = rec!(t);
        let mut tasks = Vec::new();
        for (i, d) in [
            ms(7),
            ms(3),
            us(4500),
            ms(10),
            ms(1),
            us(1500),
            ns(0),
            ms(20),
            us(100),
        ]
        .into_iter()
        .enumerate()
        {
            let rec = rec.clone();
            tasks.push(tokio::spawn(async move {
                t::sleep(d).await;
                at!(rec, t, "task {i} slept {d:?}");
                t::sleep(d).await;
                at!(rec, t, "task {i} slept {d:?} again");
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        at!(rec, t, "all joined");
        rec.take()
    });
}

/// A thousand spawned tasks due on one tick (deadlines 9.4 ms to 10 ms) all complete
/// at 10 ms; then a thousand sleeps of 1 ms to 1000 ms each complete at its own tick.
#[test]
fn a_thousand_timers_due_at_one_instant() {
    paused_both!(|t| {
        let start = t::Instant::now();
        let mut tasks = Vec::new();
        for i in 0..1000u64 {
            tasks.push(tokio::spawn(async move {
                t::sleep(ms(10) - us(300 * (i % 3))).await;
                let first = start.elapsed();
                t::sleep_until(start + ms(1 + i)).await;
                (i, first, start.elapsed())
            }));
        }
        let mut out = Vec::new();
        for task in tasks {
            out.push(task.await.unwrap());
        }
        (out, start.elapsed())
    });
}

/// Same-tick wake-ups as the main task sees them: the main task's sleep and a
/// spawned task's sleep due together; has the spawned task run when main resumes?
/// (Ours, mixed with tokio's, and two spawned tasks' order.)
#[test]
#[ignore = "documented difference (README): wake-ups due on one tick come from the mirror task, in another order than tokio's driver gives them"]
fn same_tick_wake_ups_seen_by_the_main_task() {
    paused_both!(|t| {
        let rec = rec!(t);
        for case in 0..4 {
            let flag = Arc::new(AtomicBool::new(false));
            let f = flag.clone();
            let spawned = tokio::spawn(async move {
                if case == 2 {
                    tokio::time::sleep(ms(10)).await;
                } else {
                    t::sleep(ms(10)).await;
                }
                f.store(true, Ordering::SeqCst);
            });
            tokio::task::yield_now().await;
            if case == 1 {
                tokio::time::sleep(ms(10)).await;
            } else if case == 3 {
                t::sleep_until(t::Instant::now() + us(9_500)).await;
            } else {
                t::sleep(ms(10)).await;
            }
            at!(
                rec,
                t,
                "case {case}: main resumed, spawned ran: {}",
                flag.load(Ordering::SeqCst)
            );
            spawned.await.unwrap();
        }
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..4 {
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                t::sleep(ms(5) - us(100 * i)).await;
                order.lock().unwrap().push(i);
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        rec.note(format!(
            "same-tick order of 4 tasks: {:?}",
            order.lock().unwrap()
        ));
        rec.take()
    });
}

/// `advance` past a spawned task's deadline (whole ms): has the task run when
/// `advance` returns? And a main-task sleep polled before: `is_elapsed`, ready at the
/// next poll. With `t::advance` and, in a partly switched test, `tokio::time::advance`.
#[test]
fn advance_past_deadlines_wakes_as_tokio_s() {
    on_both!(|t| {
        let mut out = Vec::new();
        for tokio_s_advance in [false, true] {
            out.push(paused_rt().block_on(async move {
                let rec = rec!(t);
                let flag = Arc::new(AtomicBool::new(false));
                let f = flag.clone();
                let spawned = tokio::spawn(async move {
                    t::sleep(ms(10)).await;
                    f.store(true, Ordering::SeqCst);
                });
                tokio::task::yield_now().await;
                let mut mine = pin!(t::sleep(ms(15)));
                let at_once = poll_once(mine.as_mut()).await;
                if tokio_s_advance {
                    tokio::time::advance(ms(20)).await;
                } else {
                    t::advance(ms(20)).await;
                }
                at!(
                    rec,
                    t,
                    "tokio's advance {tokio_s_advance}: at once {at_once}; spawned ran: {}; \
                     is_elapsed {}",
                    flag.load(Ordering::SeqCst),
                    mine.is_elapsed()
                );
                rec.note(format!(
                    "ready at next poll: {}",
                    poll_once(mine.as_mut()).await
                ));
                spawned.await.unwrap();
                at!(rec, t, "joined");
                rec.take()
            }));
        }
        out
    });
}

/// A pending sleep reset in place from a `select!` loop (earlier, later, the same,
/// into the past, and after it completed), on and off the grid.
#[test]
fn sleep_reset_in_place_as_tokio_s() {
    on_both!(|t| {
        let mut out = Vec::new();
        for offset in [ns(0), us(500)] {
            for (label, to) in [
                ("earlier", 10i64),
                ("later", 200),
                ("same", 95),
                ("now", 0),
                ("past", -3),
                ("off grid", 7),
            ] {
                out.push(paused_rt().block_on(async move {
                    t::advance(offset).await;
                    let rec = rec!(t);
                    let mut s = pin!(t::sleep(ms(100)));
                    let mut step = pin!(t::sleep(ms(5)));
                    let mut stepped = false;
                    loop {
                        tokio::select! {
                            biased;
                            _ = &mut s => { at!(rec, t, "+{offset:?} reset {label}: fired"); break }
                            _ = &mut step, if !stepped => {
                                stepped = true;
                                let now = t::Instant::now();
                                let deadline = match to {
                                    7 => now + us(7_300),
                                    to if to >= 0 => now + ms(to as u64),
                                    to => now - ms((-to) as u64),
                                };
                                s.as_mut().reset(deadline);
                                rec.note(format!("deadline - now {:?}", s.deadline() - now));
                            }
                        }
                    }
                    // A completed sleep reset: pending again until its new deadline.
                    s.as_mut().reset(t::Instant::now() + us(2_500));
                    rec.note(format!("is_elapsed after reset {}", s.is_elapsed()));
                    s.as_mut().await;
                    at!(rec, t, "fired again");
                    rec.take()
                }));
            }
        }
        out
    });
}

/// A sleep reset by its own task on a message from another task (earlier, later,
/// into the past), with tokio's mpsc channel.
#[test]
fn sleep_reset_on_a_message_from_another_task() {
    on_both!(|t| {
        let mut out = Vec::new();
        for shift in [10i64, 200, -3] {
            out.push(paused_rt().block_on(async move {
                let rec = rec!(t);
                let (tx, mut rx) = tokio::sync::mpsc::channel::<i64>(1);
                let sender = tokio::spawn(async move {
                    t::sleep(us(5_500)).await;
                    tx.send(shift).await.unwrap();
                    t::sleep(ms(1000)).await;
                });
                let mut s = pin!(t::sleep(ms(100)));
                loop {
                    tokio::select! {
                        biased;
                        _ = &mut s => { at!(rec, t, "shift {shift}: fired"); break }
                        Some(shift) = rx.recv() => {
                            let now = t::Instant::now();
                            let deadline = if shift >= 0 {
                                now + ms(shift as u64)
                            } else {
                                now - ms((-shift) as u64)
                            };
                            s.as_mut().reset(deadline);
                            at!(rec, t, "reset by {shift}");
                        }
                    }
                }
                sender.abort();
                rec.take()
            }));
        }
        out
    });
}

/// Each `MissedTickBehavior` with a tick late by 3, 5, 6 and 27 ms (tokio judges a
/// tick missed only beyond 5 ms), by a sleep and by an `advance`: tick instants and
/// when each tick completes.
#[test]
fn interval_missed_ticks_as_tokio_judges_them() {
    on_both!(|t| {
        let mut out = Vec::new();
        for behavior in [
            t::MissedTickBehavior::Burst,
            t::MissedTickBehavior::Delay,
            t::MissedTickBehavior::Skip,
        ] {
            for late in [ms(3), ms(5), ms(6), us(6_500), ms(27)] {
                for by_advance in [false, true] {
                    out.push(paused_rt().block_on(async move {
                        let rec = rec!(t);
                        let start = t::Instant::now();
                        let mut i = t::interval(ms(10));
                        i.set_missed_tick_behavior(behavior);
                        i.tick().await;
                        if by_advance {
                            t::advance(ms(10) + late).await;
                        } else {
                            t::sleep(ms(10) + late).await;
                        }
                        for n in 0..5 {
                            let tick = i.tick().await;
                            at!(
                                rec,
                                t,
                                "{behavior:?} late {late:?} advance {by_advance}: tick {n} due {:?}",
                                tick.duration_since(start)
                            );
                        }
                        rec.take()
                    }));
                }
            }
        }
        out
    });
}

/// Intervals with periods off the grid (1.5 ms, 0.3 ms, 1 ns) and one started off the
/// grid, each behavior: the instants ticks yield and when they complete.
#[test]
fn intervals_with_periods_off_the_grid() {
    on_both!(|t| {
        let mut out = Vec::new();
        for behavior in [
            t::MissedTickBehavior::Burst,
            t::MissedTickBehavior::Delay,
            t::MissedTickBehavior::Skip,
        ] {
            for (offset, period) in [
                (ns(0), us(1500)),
                (ns(0), us(300)),
                (ns(0), ns(1)),
                (us(500), ms(10)),
                (us(700), us(1500)),
            ] {
                out.push(paused_rt().block_on(async move {
                    t::advance(offset).await;
                    let rec = rec!(t);
                    let start = t::Instant::now();
                    let mut i = t::interval(period);
                    i.set_missed_tick_behavior(behavior);
                    for n in 0..8 {
                        let tick = i.tick().await;
                        at!(
                            rec,
                            t,
                            "{behavior:?} +{offset:?} every {period:?}: tick {n} due {:?}",
                            tick.duration_since(start)
                        );
                    }
                    rec.take()
                }));
            }
        }
        out
    });
}

/// `Interval::reset`, `reset_immediately`, `reset_after` and `reset_at` (future, past,
/// off the grid) between ticks: the instants ticks yield and when they complete.
#[test]
fn interval_reset_methods_as_tokio_s() {
    on_both!(|t| {
        let mut out = Vec::new();
        for behavior in [t::MissedTickBehavior::Burst, t::MissedTickBehavior::Skip] {
            out.push(paused_rt().block_on(async move {
                let rec = rec!(t);
                let start = t::Instant::now();
                let mut i = t::interval(ms(10));
                i.set_missed_tick_behavior(behavior);
                macro_rules! tick {
                    ($what:expr) => {{
                        let tick = i.tick().await;
                        at!(
                            rec,
                            t,
                            "{behavior:?} {}: due {:?}",
                            $what,
                            tick.duration_since(start)
                        );
                    }};
                }
                tick!("first");
                t::sleep(ms(3)).await;
                i.reset();
                tick!("after reset() at 3");
                t::sleep(ms(2)).await;
                i.reset_immediately();
                tick!("after reset_immediately()");
                tick!("next");
                i.reset_after(ms(4));
                tick!("after reset_after(4ms)");
                i.reset_after(us(2_500));
                tick!("after reset_after(2.5ms)");
                i.reset_at(start + ms(100));
                tick!("after reset_at(100)");
                i.reset_at(start + ms(30));
                tick!("after reset_at(30, past)");
                tick!("next");
                t::advance(us(400)).await;
                i.reset_at(t::Instant::now() + us(200));
                tick!("after reset_at(+0.2ms)");
                tick!("next");
                i.reset_after(Duration::ZERO);
                tick!("after reset_after(0)");
                tick!("next");
                rec.take()
            }));
        }
        out
    });
}

/// `interval_at` a start 25 ms in the past and one 2.5 ms ahead, each behavior.
#[test]
fn interval_at_past_and_future_starts() {
    on_both!(|t| {
        let mut out = Vec::new();
        for behavior in [
            t::MissedTickBehavior::Burst,
            t::MissedTickBehavior::Delay,
            t::MissedTickBehavior::Skip,
        ] {
            out.push(paused_rt().block_on(async move {
                t::advance(ms(100)).await;
                let rec = rec!(t);
                let now = t::Instant::now();
                for (label, from) in [("past", now - ms(25)), ("ahead", now + us(2_500))] {
                    let mut i = t::interval_at(from, ms(10));
                    i.set_missed_tick_behavior(behavior);
                    for n in 0..5 {
                        let tick = i.tick().await;
                        let due = match tick.checked_duration_since(now) {
                            Some(d) => format!("{d:?}"),
                            None => format!("-{:?}", now.duration_since(tick)),
                        };
                        at!(rec, t, "{behavior:?} {label}: tick {n} due {due}");
                    }
                }
                rec.take()
            }));
        }
        out
    });
}

/// `pause()` inside a runtime not built paused (tokio's grid then lies off the pause
/// instant by an unknown fraction, almost surely not zero): whole-millisecond sleeps,
/// timeouts and intervals, whose answers do not depend on where the grid lies.
#[test]
fn pause_inside_a_running_runtime_whole_milliseconds() {
    on_both!(|t| {
        plain_rt().block_on(async move {
            t::sleep(ms(2)).await;
            t::pause();
            let rec = rec!(t);
            let start = t::Instant::now();
            t::sleep(ms(10)).await;
            at!(rec, t, "sleep(10ms)");
            t::sleep(Duration::ZERO).await;
            at!(rec, t, "sleep(0)");
            t::sleep_until(start).await;
            at!(rec, t, "sleep_until(pause instant)");
            let r = t::timeout(ms(10), std::future::pending::<()>()).await;
            at!(rec, t, "timeout(10ms, pending) ok={}", r.is_ok());
            let r = t::timeout(ms(10), t::sleep(ms(10))).await;
            at!(rec, t, "timeout(10ms, sleep(10ms)) ok={}", r.is_ok());
            let r = t::timeout(ms(10), t::sleep(ms(11))).await;
            at!(rec, t, "timeout(10ms, sleep(11ms)) ok={}", r.is_ok());
            for behavior in [t::MissedTickBehavior::Burst, t::MissedTickBehavior::Delay] {
                let from = t::Instant::now();
                let mut i = t::interval(ms(10));
                i.set_missed_tick_behavior(behavior);
                for n in 0..4 {
                    let tick = i.tick().await;
                    at!(
                        rec,
                        t,
                        "{behavior:?} tick {n} due {:?}",
                        tick.duration_since(from)
                    );
                }
            }
            for behavior in [t::MissedTickBehavior::Delay, t::MissedTickBehavior::Skip] {
                let from = t::Instant::now();
                let mut i = t::interval(ms(10));
                i.set_missed_tick_behavior(behavior);
                i.tick().await;
                t::sleep(ms(27)).await;
                for n in 1..4 {
                    let tick = i.tick().await;
                    at!(
                        rec,
                        t,
                        "{behavior:?} late tick {n} due {:?}",
                        tick.duration_since(from)
                    );
                }
            }
            t::advance(ms(3)).await;
            at!(rec, t, "advance(3ms)");
            t::sleep(ms(4)).await;
            at!(rec, t, "sleep(4ms)");
            rec.take()
        })
    });
}

/// `resume()` then `pause()` again in a runtime built paused: a real sleep takes
/// real time; paused sleeps after it (tokio's grid now off the clock by the real
/// time spent resumed) take tokio's paused time, each stretch measured on its own.
#[test]
fn resume_then_pause_again_in_a_runtime_built_paused() {
    on_both!(|t| {
        paused_rt().block_on(async move {
            let mut log = Vec::new();
            let s = t::Instant::now();
            t::sleep(ms(10)).await;
            log.push(format!("paused sleep(10ms): {:?}", s.elapsed()));
            t::resume();
            let wall = std::time::Instant::now();
            t::sleep(ms(3)).await;
            log.push(format!(
                "resumed sleep(3ms) took real time: {}",
                wall.elapsed() >= ms(3)
            ));
            t::pause();
            let s = t::Instant::now();
            t::sleep(ms(10)).await;
            log.push(format!("paused again, sleep(10ms): {:?}", s.elapsed()));
            let s = t::Instant::now();
            t::sleep(ms(1)).await;
            log.push(format!("sleep(1ms): {:?}", s.elapsed()));
            t::resume();
            t::pause();
            let s = t::Instant::now();
            t::sleep(ms(10)).await;
            log.push(format!(
                "resume+pause at once, sleep(10ms): {:?}",
                s.elapsed()
            ));
            let s = t::Instant::now();
            let wall = std::time::Instant::now();
            t::sleep(ms(3_600_000)).await;
            log.push(format!(
                "sleep(1h): {:?}, under 5 s of wall time: {}",
                s.elapsed(),
                wall.elapsed() < ms(5000)
            ));
            log
        })
    });
}

/// With tokio's clock paused: where it stands within a step of tokio's 1 ms grid,
/// found with tokio's own sleeps (`sleep(x)` takes 2 ms, not 1, once the phase plus
/// `x` passes a grid point); moves the clock by whole milliseconds only.
async fn tokio_grid_phase() -> Duration {
    let (mut lo, mut hi) = (0u64, 1_000_000u64);
    while hi - lo > 1 {
        let x = (lo + hi) / 2;
        let s = tokio::time::Instant::now();
        tokio::time::sleep(ns(x)).await;
        if s.elapsed() > ms(1) {
            hi = x;
        } else {
            lo = x;
        }
    }
    ms(1) - ns(hi)
}

/// `pause()` inside a running runtime, `resume()`, and `pause()` again at an earlier
/// phase of tokio's 1 ms grid (found with tokio's own sleeps): a whole-millisecond
/// paused sleep after each pause completes, taking tokio's paused time (d + 1 ms).
#[test]
fn resume_then_pause_again_earlier_in_a_tick() {
    on_both!(|t| {
        for attempt in 0..10u64 {
            let answer = plain_rt().block_on(async move {
                let t0 = tokio::time::Instant::now();
                while tokio::time::Instant::now() - t0 < us(500 + 50 * attempt) {
                    std::hint::spin_loop();
                }
                t::pause();
                let f = tokio_grid_phase().await;
                if f < us(200) {
                    return None;
                }
                let mut log = Vec::new();
                let s = t::Instant::now();
                t::sleep(ms(10)).await;
                log.push(format!("paused sleep(10ms): {:?}", s.elapsed()));
                let c = tokio::time::Instant::now();
                t::resume();
                let phase = || (tokio::time::Instant::now() - c + f).as_nanos() % 1_000_000;
                let window = (f / 4).as_nanos()..(f / 2).as_nanos();
                while !window.contains(&phase()) {
                    std::hint::spin_loop();
                }
                t::pause();
                let s = t::Instant::now();
                t::sleep(ms(10)).await;
                log.push(format!("paused again, sleep(10ms): {:?}", s.elapsed()));
                Some(log)
            });
            if let Some(log) = answer {
                return log;
            }
        }
        panic!("no pause landed 0.2 ms or more into a grid step");
    });
}

/// After `pause()` inside a running runtime (or tokio's `advance` by a fraction
/// before our clock is first read in a runtime built paused, or tokio's `pause()`),
/// an `advance` by a fraction of a millisecond, then `sleep(1ms)`: it completes (each
/// case on a thread of its own, 5 s each), after 2 ms of paused time (tokio's grid
/// is then off the clock by a fraction, whatever it is).
#[test]
fn a_sleep_after_a_fractional_advance_completes() {
    fn completes(f: impl FnOnce() -> Duration + Send + 'static) -> String {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(elapsed) => format!("took {elapsed:?}"),
            Err(_) => "hung".to_string(),
        }
    }
    on_both!(|t| {
        let mut out = Vec::new();
        for a in [us(999), us(500), ns(1)] {
            out.push(completes(move || {
                plain_rt().block_on(async move {
                    t::pause();
                    t::advance(a).await;
                    let s = t::Instant::now();
                    t::sleep(ms(1)).await;
                    s.elapsed()
                })
            }));
        }
        out.push(completes(move || {
            paused_rt().block_on(async move {
                tokio::time::advance(us(500)).await;
                t::advance(us(600)).await;
                let s = t::Instant::now();
                t::sleep(ms(1)).await;
                s.elapsed()
            })
        }));
        out.push(completes(move || {
            plain_rt().block_on(async move {
                tokio::time::pause();
                t::advance(us(999)).await;
                let s = t::Instant::now();
                t::sleep(ms(1)).await;
                s.elapsed()
            })
        }));
        out
    });
}

/// Which misuses panic, as tokio's: `pause()` twice, `resume()` unpaused, a zero
/// `interval` period, `advance` unpaused, `pause()` in a multi-thread runtime.
#[test]
fn misuse_panics_as_tokio_s() {
    on_both!(|t| {
        let mut out = Vec::new();
        out.push(paused_rt().block_on(async { panics(t::pause) }));
        out.push(plain_rt().block_on(async { panics(t::resume) }));
        out.push(paused_rt().block_on(async { panics(|| drop(t::interval(Duration::ZERO))) }));
        out.push(plain_rt().block_on(async {
            tokio::spawn(async { t::advance(ms(1)).await })
                .await
                .is_err()
        }));
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        out.push(multi.block_on(async { panics(t::pause) }));
        out
    });
}

/// A partly switched code base: tokio's `timeout` around our sleep and ours around
/// tokio's, on and off the grid; `Ok`/`Err` and when.
#[test]
fn tokio_s_timeout_around_our_sleep_and_ours_around_tokio_s() {
    on_both!(|t| {
        let mut out = Vec::new();
        for offset in [ns(0), us(500)] {
            for (d, e) in [
                (ms(10), ms(10)),
                (ms(10), us(10_500)),
                (us(10_200), us(10_500)),
                (us(10_500), us(10_200)),
                (ms(10), us(9_999)),
            ] {
                out.push(paused_rt().block_on(async move {
                    t::advance(offset).await;
                    let rec = rec!(t);
                    let r = tokio::time::timeout(d, t::sleep(e)).await;
                    at!(
                        rec,
                        t,
                        "+{offset:?} tokio::timeout({d:?}, t::sleep({e:?})) ok={}",
                        r.is_ok()
                    );
                    let r = t::timeout(d, tokio::time::sleep(e)).await;
                    at!(
                        rec,
                        t,
                        "t::timeout({d:?}, tokio::sleep({e:?})) ok={}",
                        r.is_ok()
                    );
                    rec.take()
                }));
            }
        }
        out
    });
}

/// A partly switched code base: tokio's sleep and ours racing in a biased `select!`
/// and joined, deadlines on one tick or on neighbouring ticks, on and off the grid.
#[test]
#[ignore = "documented difference (README): follows from the extra wake-up (polls_per_timer_as_tokio_s): join! rotates which branch it polls first"]
fn tokio_s_sleep_and_ours_race_and_join() {
    on_both!(|t| {
        let mut out = Vec::new();
        for offset in [ns(0), us(500)] {
            for (a, b) in [
                (ms(10), ms(10)),
                (us(10_700), us(10_200)),
                (us(10_200), us(10_700)),
                (ms(11), ms(10)),
                (ms(10), ms(11)),
            ] {
                out.push(paused_rt().block_on(async move {
                    t::advance(offset).await;
                    let rec = rec!(t);
                    tokio::select! {
                        biased;
                        _ = tokio::time::sleep(a) => at!(rec, t, "tokio's {a:?} beat t's {b:?}"),
                        _ = t::sleep(b) => at!(rec, t, "t's {b:?} beat tokio's {a:?}"),
                    }
                    tokio::select! {
                        biased;
                        _ = t::sleep(a) => at!(rec, t, "t's {a:?} beat tokio's {b:?}"),
                        _ = tokio::time::sleep(b) => at!(rec, t, "tokio's {b:?} beat t's {a:?}"),
                    }
                    tokio::join!(
                        async {
                            tokio::time::sleep(a).await;
                            at!(rec, t, "joined tokio's {a:?}");
                        },
                        async {
                            t::sleep(b).await;
                            at!(rec, t, "joined t's {b:?}");
                        }
                    );
                    rec.take()
                }));
            }
        }
        out
    });
}

/// Tokio's `advance` (a partly switched test) moves our clock: `Instant::now`, a
/// sleep made after it, and a sleep made before it.
#[test]
fn tokio_s_advance_moves_our_clock() {
    paused_both!(|t| {
        let rec = rec!(t);
        let early = t::sleep(ms(5));
        tokio::time::advance(us(7_300)).await;
        at!(rec, t, "tokio::advance(7.3ms)");
        early.await;
        at!(rec, t, "sleep(5ms) made before it");
        t::sleep(ms(2)).await;
        at!(rec, t, "sleep(2ms) after");
        tokio::time::advance(ms(1)).await;
        let mut s = pin!(t::sleep(Duration::ZERO));
        rec.note(format!(
            "sleep(0) ready at once: {}",
            poll_once(s.as_mut()).await
        ));
        rec.take()
    });
}

/// `t::Instant::now()` is tokio's paused `Instant::now()`, the same std instant, at
/// each step (start, fractional advance, sleeps, after `pause()` in a running
/// runtime); so instants pass between a switched and an unswitched layer.
#[test]
fn instant_now_is_tokio_s_instant() {
    on_both!(|t| {
        let mut out = Vec::new();
        out.push(paused_rt().block_on(async {
            let same = || t::Instant::now().into_std() == tokio::time::Instant::now().into_std();
            let mut v = vec![same()];
            t::advance(ns(1)).await;
            v.push(same());
            t::sleep(us(1_500)).await;
            v.push(same());
            tokio::time::sleep(ms(3)).await;
            v.push(same());
            v
        }));
        out.push(plain_rt().block_on(async {
            t::pause();
            let same = || t::Instant::now().into_std() == tokio::time::Instant::now().into_std();
            let mut v = vec![same()];
            t::sleep(ms(10)).await;
            v.push(same());
            t::advance(us(300)).await;
            v.push(same());
            v
        }));
        out
    });
}

/// `Instant` arithmetic and deadlines: `sleep(d).deadline() - now` for short, long and
/// `Duration::MAX` delays, `checked_add`/`checked_sub`, `elapsed`, a reset deadline.
#[test]
#[ignore = "documented difference (README): tokio caps a deadline at 30 years from now; ours keeps the instant asked for up to 292 years (guarantee 11)"]
fn instant_arithmetic_and_deadlines() {
    paused_both!(|t| {
        t::advance(us(1_234)).await;
        let now = t::Instant::now();
        let mut v = Vec::new();
        for d in [
            ns(0),
            ns(1),
            us(1500),
            ms(3_600_000),
            Duration::from_secs(40 * 365 * 86_400),
            Duration::MAX,
        ] {
            let s = t::sleep(d);
            v.push(format!(
                "sleep({d:?}).deadline() - now = {:?}",
                s.deadline().duration_since(now)
            ));
        }
        v.push(format!(
            "checked_add(MAX) is none: {}",
            now.checked_add(Duration::MAX).is_none()
        ));
        v.push(format!(
            "checked_sub(1ns) is some: {}",
            now.checked_sub(ns(1)).is_some()
        ));
        v.push(format!("now + 1.5ms - now = {:?}", (now + us(1500)) - now));
        v.push(format!(
            "saturating past = {:?}",
            now.saturating_duration_since(now + ms(1))
        ));
        t::sleep(us(10)).await;
        v.push(format!("elapsed after sleep(10us) = {:?}", now.elapsed()));
        let mut s = pin!(t::sleep(ms(5)));
        s.as_mut().reset(now + us(7_777));
        v.push(format!("reset deadline - now = {:?}", s.deadline() - now));
        let mut i = t::interval(ms(3));
        v.push(format!("first tick - now = {:?}", i.tick().await - now));
        v
    });
}

/// `Duration::MAX` and very long sleeps and timeouts race shorter ones: which wins and
/// at what paused time.
#[test]
fn very_long_and_max_sleeps() {
    paused_both!(|t| {
        let rec = rec!(t);
        tokio::select! {
            biased;
            _ = t::sleep(Duration::MAX) => at!(rec, t, "MAX won"),
            _ = t::sleep(ms(86_400_000)) => at!(rec, t, "1 day won"),
        }
        let r = t::timeout(Duration::MAX, t::sleep(ms(3_600_000))).await;
        at!(rec, t, "timeout(MAX, sleep(1h)) ok={}", r.is_ok());
        let r = t::timeout(ms(3_600_000), t::sleep(Duration::MAX)).await;
        at!(rec, t, "timeout(1h, sleep(MAX)) ok={}", r.is_ok());
        t::sleep(Duration::from_secs(365 * 86_400)).await;
        at!(rec, t, "sleep(365 days)");
        let mut i = t::interval(Duration::from_secs(400 * 86_400));
        i.tick().await;
        i.tick().await;
        at!(rec, t, "interval(400 days) second tick");
        rec.take()
    });
}

/// Runtimes one after another on one thread: a paused one advanced by an hour and
/// dropped, then a paused one (its clock starts near the real time, its sleeps take
/// paused time), then a plain one (real time).
#[test]
fn paused_runtimes_one_after_another_on_one_thread() {
    on_both!(|t| {
        let mut out = Vec::new();
        let real = std::time::Instant::now();
        {
            let rt = paused_rt();
            out.push(rt.block_on(async {
                let s = t::Instant::now();
                t::sleep(ms(3_600_000)).await;
                format!("first: sleep(1h) took {:?}", s.elapsed())
            }));
        }
        {
            let rt = paused_rt();
            out.push(rt.block_on(async {
                let now = t::Instant::now().into_std();
                let near = now >= real && now <= std::time::Instant::now();
                let s = t::Instant::now();
                t::sleep(ms(10)).await;
                format!(
                    "second: starts at real time {near}, sleep(10ms) took {:?}",
                    s.elapsed()
                )
            }));
        }
        {
            let rt = paused_rt();
            out.push(rt.block_on(async {
                tokio::spawn(async { t::sleep(ms(3_600_000)).await });
                t::sleep(ms(2)).await;
                "third: dropped with a sleep pending".to_string()
            }));
        }
        {
            let rt = plain_rt();
            out.push(rt.block_on(async {
                t::pause();
                let s = t::Instant::now();
                t::sleep(ms(10)).await;
                format!(
                    "fourth: pause() in a plain runtime, sleep(10ms) took {:?}",
                    s.elapsed()
                )
            }));
        }
        {
            let rt = plain_rt();
            out.push(rt.block_on(async {
                let now = t::Instant::now().into_std();
                let near = now >= real && now <= std::time::Instant::now();
                let wall = std::time::Instant::now();
                t::sleep(ms(3)).await;
                format!(
                    "plain: real time {near}, sleep(3ms) took real time {}",
                    wall.elapsed() >= ms(3)
                )
            }));
        }
        out
    });
}

/// Two paused runtimes alive together on one thread, their `block_on`s interleaved:
/// each keeps its own paused clock.
#[test]
fn two_paused_runtimes_interleaved_on_one_thread() {
    on_both!(|t| {
        let a = paused_rt();
        let b = paused_rt();
        let a0 = a.block_on(async { t::Instant::now() });
        let b0 = b.block_on(async { t::Instant::now() });
        let mut out = Vec::new();
        out.push(a.block_on(async move {
            t::sleep(ms(100)).await;
            format!("A after sleep(100ms): {:?}", a0.elapsed())
        }));
        out.push(b.block_on(async move {
            t::sleep(ms(10)).await;
            format!("B after sleep(10ms): {:?}", b0.elapsed())
        }));
        out.push(a.block_on(async move {
            t::sleep(ms(1)).await;
            format!("A after sleep(1ms): {:?}", a0.elapsed())
        }));
        drop(a);
        out.push(b.block_on(async move {
            t::sleep(ms(5)).await;
            format!("B after A dropped, sleep(5ms): {:?}", b0.elapsed())
        }));
        out
    });
}

/// Between `block_on`s of a live paused runtime advanced by an hour, outside every
/// runtime, `Instant::now()` reads real time (tokio's reads the system clock there).
#[test]
#[ignore = "documented difference (README): outside every runtime, paused time stands still (issue 38); tokio's Instant::now() reads the system clock there"]
fn instant_now_between_block_ons_reads_real_time() {
    on_both!(|t| {
        let rt = paused_rt();
        rt.block_on(async { t::sleep(ms(3_600_000)).await });
        let now = t::Instant::now().into_std();
        let real = std::time::Instant::now();
        format!(
            "outside: within a second of real time: {}",
            now <= real + ms(1000)
        )
    });
}

/// While a `spawn_blocking` task runs, tokio does not auto-advance: a sleep racing it
/// loses, whatever its length, and takes its paused time afterwards.
#[test]
fn spawn_blocking_holds_auto_advance() {
    paused_both!(|t| {
        let rec = rec!(t);
        let blocking = tokio::task::spawn_blocking(|| std::thread::sleep(ms(50)));
        let mut blocking = pin!(blocking);
        tokio::select! {
            biased;
            _ = t::sleep(ms(10)) => at!(rec, t, "sleep won"),
            _ = &mut blocking => at!(rec, t, "spawn_blocking won"),
        }
        t::sleep(ms(10)).await;
        at!(rec, t, "sleep(10ms) after");
        rec.take()
    });
}

/// A task that keeps yielding is runnable, so tokio never auto-advances: a spawned
/// sleep does not complete and the clock stands.
#[test]
fn a_yielding_task_holds_auto_advance() {
    paused_both!(|t| {
        let rec = rec!(t);
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        let spawned = tokio::spawn(async move {
            t::sleep(ms(1)).await;
            f.store(true, Ordering::SeqCst);
        });
        for _ in 0..200 {
            tokio::task::yield_now().await;
        }
        at!(
            rec,
            t,
            "after 200 yields, spawned done: {}",
            flag.load(Ordering::SeqCst)
        );
        spawned.await.unwrap();
        at!(rec, t, "joined");
        rec.take()
    });
}

/// A partly switched code base passes instants between tokio's layer and ours
/// (`into_std`/`from_std`), and a std deadline built before the runtime: sleeps on
/// them take tokio's paused time.
#[test]
fn instants_pass_between_tokio_s_layer_and_ours() {
    on_both!(|t| {
        let before_runtime = std::time::Instant::now() + ms(10);
        paused_rt().block_on(async move {
            let rec = rec!(t);
            let d = t::Instant::from_std(tokio::time::Instant::now().into_std() + ms(10));
            t::sleep_until(d).await;
            at!(rec, t, "t::sleep_until(tokio's now + 10ms)");
            let d = tokio::time::Instant::from_std(t::Instant::now().into_std() + ms(10));
            tokio::time::sleep_until(d).await;
            at!(rec, t, "tokio::sleep_until(t's now + 10ms)");
            let s = t::Instant::now();
            t::sleep_until(t::Instant::from_std(before_runtime)).await;
            rec.note(format!(
                "t::sleep_until(std deadline 10ms past the build) took 9 or 10 ms: {}",
                [ms(9), ms(10)].contains(&s.elapsed())
            ));
            rec.take()
        })
    });
}

/// `advance` by 10 ms past three ticks of a spawned interval (3 ms, each behavior):
/// the instants its ticks yield, the time each tick sees, and when `advance` returns.
#[test]
fn advance_past_a_spawned_interval_s_ticks() {
    on_both!(|t| {
        let mut out = Vec::new();
        for behavior in [
            t::MissedTickBehavior::Burst,
            t::MissedTickBehavior::Delay,
            t::MissedTickBehavior::Skip,
        ] {
            out.push(paused_rt().block_on(async move {
                let rec = rec!(t);
                let start = t::Instant::now();
                let r = rec.clone();
                let ticker = tokio::spawn(async move {
                    let mut i = t::interval(ms(3));
                    i.set_missed_tick_behavior(behavior);
                    for n in 0..6 {
                        let due = i.tick().await.duration_since(start);
                        at!(r, t, "{behavior:?} tick {n} due {due:?}");
                    }
                });
                tokio::task::yield_now().await;
                t::advance(ms(10)).await;
                at!(rec, t, "advance(10ms) returned");
                ticker.await.unwrap();
                at!(rec, t, "joined");
                rec.take()
            }));
        }
        out
    });
}

/// Tokio's own `pause()` (a test not yet switched), and ours, before our clock is
/// read in a running runtime: our sleeps follow tokio's paused clock, auto-advancing.
#[test]
#[ignore = "documented difference (README): tokio's own pause() before our first read looks like a runtime built paused, so ours takes its clock to be on its grid; tokio's lies off it (1 ms later here)"]
fn a_pause_before_our_clock_is_read() {
    on_both!(|t| {
        let mut out = Vec::new();
        for tokio_s_pause in [true, false] {
            out.push(plain_rt().block_on(async move {
                if tokio_s_pause {
                    tokio::time::pause();
                } else {
                    t::pause();
                }
                let s = t::Instant::now();
                let wall = std::time::Instant::now();
                t::sleep(ms(3_600_000)).await;
                format!(
                    "tokio's pause {tokio_s_pause}: sleep(1h) took {:?}, under 5 s of wall time: {}",
                    s.elapsed(),
                    wall.elapsed() < ms(5000)
                )
            }));
        }
        out.push(plain_rt().block_on(async move {
            let _ = t::Instant::now();
            t::pause();
            let s = t::Instant::now();
            t::sleep(ms(3_600_000)).await;
            format!("our pause after a read: sleep(1h) took {:?}", s.elapsed())
        }));
        out
    });
}

/// Tokio's own `pause()` (a test not yet switched) after our clock was read in a
/// running runtime: our sleep(1h) then follows tokio's paused clock, auto-advancing.
#[test]
fn tokio_s_pause_after_our_clock_was_read() {
    on_both!(|t| {
        plain_rt().block_on(async move {
            let _ = t::Instant::now();
            tokio::time::pause();
            let s = t::Instant::now();
            t::sleep(ms(3_600_000)).await;
            format!("sleep(1h) took {:?}", s.elapsed())
        })
    });
}

/// How many times a task is polled through our futures under auto-advance (tokio:
/// once to arm, once when due): a sleep, a reset sleep, a timeout, interval ticks,
/// and a sleep after a `select!` our sleep won on the tick of a sleep it dropped.
#[test]
#[ignore = "documented difference (README): under auto-advance our timers fire from a task of ours (the mirror), which can wake a task one more time than tokio's driver does"]
fn polls_per_timer_as_tokio_s() {
    struct Counted<F>(F, Arc<Mutex<u32>>);
    impl<F: Future + Unpin> Future for Counted<F> {
        type Output = F::Output;
        fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
            *self.1.lock().unwrap() += 1;
            Pin::new(&mut self.0).poll(cx)
        }
    }
    paused_both!(|t| {
        let mut v = Vec::new();
        for program in 0..8 {
            let n = Arc::new(Mutex::new(0));
            let fut: Pin<Box<dyn Future<Output = ()>>> = match program {
                0 => Box::pin(async { t::sleep(ms(10)).await }),
                1 => Box::pin(async { t::sleep(Duration::ZERO).await }),
                2 => Box::pin(async {
                    let _ = t::timeout(ms(10), std::future::pending::<()>()).await;
                }),
                3 => Box::pin(async {
                    let mut i = t::interval(ms(10));
                    for _ in 0..3 {
                        i.tick().await;
                    }
                }),
                4 => Box::pin(async {
                    let mut s = pin!(t::sleep(ms(10)));
                    let _ = poll_once(s.as_mut()).await;
                    s.as_mut().reset(t::Instant::now() + ms(20));
                    s.await;
                }),
                5 => Box::pin(async {
                    tokio::join!(t::sleep(ms(10)), tokio::time::sleep(ms(10)));
                }),
                6 => Box::pin(async {
                    tokio::select! {
                        biased;
                        _ = t::sleep(ms(10)) => {}
                        _ = tokio::time::sleep(ms(10)) => {}
                    }
                    tokio::time::sleep(ms(10)).await;
                }),
                _ => Box::pin(async {
                    tokio::select! {
                        biased;
                        _ = t::sleep(ms(10)) => {}
                        _ = t::sleep(ms(10)) => {}
                    }
                    t::sleep(ms(10)).await;
                }),
            };
            Counted(fut, n.clone()).await;
            v.push(format!(
                "program {program}: polled {} times",
                *n.lock().unwrap()
            ));
        }
        v
    });
}

/// `is_elapsed` of a sleep never polled and of one polled once, after the clock
/// passed both deadlines by our sleep, by tokio's sleep, and by tokio's `advance`.
#[test]
#[ignore = "documented difference (README): our sleep arms its timer when made, so one never polled elapses; tokio's registers at its first poll"]
fn is_elapsed_of_polled_and_unpolled_sleeps() {
    paused_both!(|t| {
        let mut v = Vec::new();
        for how in ["t::sleep", "tokio::time::sleep", "tokio::time::advance"] {
            let unpolled = t::sleep(ms(5));
            let mut polled = pin!(t::sleep(ms(5)));
            let _ = poll_once(polled.as_mut()).await;
            match how {
                "t::sleep" => t::sleep(ms(10)).await,
                "tokio::time::sleep" => tokio::time::sleep(ms(10)).await,
                _ => tokio::time::advance(ms(10)).await,
            }
            v.push(format!(
                "after {how}: unpolled {}, polled {}",
                unpolled.is_elapsed(),
                polled.is_elapsed()
            ));
        }
        v
    });
}

/// Futures made before an `advance` past their deadlines, first polled after it:
/// a timeout around a shorter sleep is `Ok`, around `pending` is `Err`, at once.
#[test]
fn futures_made_before_an_advance() {
    paused_both!(|t| {
        let rec = rec!(t);
        let ok = t::timeout(ms(5), t::sleep(ms(3)));
        let err = t::timeout(ms(5), std::future::pending::<()>());
        let late = t::timeout(ms(5), t::sleep(ms(7)));
        let sleep = t::sleep(ms(4));
        t::advance(ms(10)).await;
        let r = ok.await;
        at!(rec, t, "timeout(5, sleep(3)) ok={}", r.is_ok());
        let r = err.await;
        at!(rec, t, "timeout(5, pending) ok={}", r.is_ok());
        let r = late.await;
        at!(rec, t, "timeout(5, sleep(7)) ok={}", r.is_ok());
        sleep.await;
        at!(rec, t, "sleep(4)");
        rec.take()
    });
}

/// Inside `Runtime::enter()` of a paused runtime advanced by an hour (outside
/// `block_on`), `Instant::now()` reads that runtime's paused clock, as tokio's.
#[test]
fn instant_now_under_a_paused_runtime_s_enter_guard() {
    on_both!(|t| {
        let rt = paused_rt();
        let start = rt.block_on(async {
            let start = t::Instant::now();
            t::sleep(ms(3_600_000)).await;
            start
        });
        let _guard = rt.enter();
        format!("under enter(): {:?}", start.elapsed())
    });
}

/// A sleep polled in one task, then moved into a spawned task and awaited there
/// (its waker changes), and a spawned task's sleep due while the main task awaits a
/// later tokio sleep: each completes at its deadline.
#[test]
fn sleeps_that_change_task() {
    paused_both!(|t| {
        let rec = rec!(t);
        let mut s = Box::pin(t::sleep(ms(10)));
        let _ = poll_once(s.as_mut()).await;
        let r = rec.clone();
        let moved = tokio::spawn(async move {
            s.await;
            at!(r, t, "moved sleep(10ms) done");
        });
        let r = rec.clone();
        let other = tokio::spawn(async move {
            t::sleep(ms(15)).await;
            at!(r, t, "spawned sleep(15ms) done");
        });
        tokio::time::sleep(ms(20)).await;
        at!(rec, t, "main's tokio sleep(20ms) done");
        moved.await.unwrap();
        other.await.unwrap();
        rec.take()
    });
}

/// After a paused runtime advanced by an hour is dropped, `Instant::now()` on that
/// thread, outside any runtime, is real time again, as tokio's.
#[test]
fn instant_now_after_the_paused_runtime_is_dropped() {
    on_both!(|t| {
        let real = std::time::Instant::now();
        drop({
            let rt = paused_rt();
            rt.block_on(async { t::sleep(ms(3_600_000)).await });
            rt
        });
        let now = t::Instant::now().into_std();
        format!(
            "real time: {}",
            now >= real && now <= std::time::Instant::now()
        )
    });
}

/// The program of the attribute tests below, on `$t`: a mixture of sleeps, an
/// advance by a fraction, a timeout and an interval; its log.
macro_rules! attribute_program {
    ($t:ident) => {
        async {
            let rec = rec!($t);
            $t::sleep(ms(2_500)).await;
            at!(rec, $t, "sleep(2.5s)");
            $t::advance(us(300)).await;
            $t::sleep(ms(1)).await;
            at!(rec, $t, "advance(0.3ms), sleep(1ms)");
            let r = $t::timeout(ms(5), std::future::pending::<()>()).await;
            at!(rec, $t, "timeout(5ms) ok={}", r.is_ok());
            let mut i = $t::interval(us(1_500));
            for _ in 0..3 {
                i.tick().await;
                at!(rec, $t, "tick");
            }
            rec.take()
        }
    };
}

/// Tokio's answer to `attribute_program!`, on a runtime built paused.
fn tokio_s_attribute_answer() -> Vec<String> {
    bounded("tokio::time", || {
        paused_rt().block_on(attribute_program!(tokio_time))
    })
}

use tokio::time as tokio_time;

/// The test attributes with our import: `#[tokio::test(start_paused = true)]`,
/// `#[sharded_timer::test(start_paused = true)]` and `#[sharded_timer::main(..)]` run
/// `attribute_program!` on `sharded_timer::time` and get tokio's answer.
#[test]
fn start_paused_attributes_give_tokio_s_answer() {
    use sharded_timer::time as ours;
    mod under {
        use super::*;
        use sharded_timer::time as ours;
        thread_local! {
            pub(super) static LOG: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
        }

        #[tokio::main(flavor = "current_thread", start_paused = true)]
        pub(super) async fn tokio_main() {
            let log = attribute_program!(ours).await;
            LOG.with(|l| *l.borrow_mut() = log);
        }

        #[sharded_timer::main(flavor = "current_thread", start_paused = true)]
        pub(super) async fn our_main() {
            let log = attribute_program!(ours).await;
            LOG.with(|l| *l.borrow_mut() = log);
        }
    }
    let theirs = tokio_s_attribute_answer();
    let via_tokio_main = bounded("tokio::main", || {
        under::tokio_main();
        under::LOG.with(|l| l.take())
    });
    let via_our_main = bounded("sharded_timer::main", || {
        under::our_main();
        under::LOG.with(|l| l.take())
    });
    let via_builder = bounded("builder", || paused_rt().block_on(attribute_program!(ours)));
    assert_eq!(via_builder, theirs, "built paused");
    assert_eq!(
        via_tokio_main, theirs,
        "#[tokio::main(start_paused = true)]"
    );
    assert_eq!(
        via_our_main, theirs,
        "#[sharded_timer::main(start_paused = true)]"
    );
}

/// `#[tokio::test(start_paused = true)]` left unchanged, our import.
#[tokio::test(start_paused = true)]
async fn tokio_test_attribute_gives_tokio_s_answer() {
    use sharded_timer::time as ours;
    let log = attribute_program!(ours).await;
    assert_eq!(log, tokio_s_attribute_answer());
}

/// `#[sharded_timer::test(start_paused = true)]`, our import.
#[sharded_timer::test(start_paused = true)]
async fn our_test_attribute_gives_tokio_s_answer() {
    use sharded_timer::time as ours;
    let log = attribute_program!(ours).await;
    assert_eq!(log, tokio_s_attribute_answer());
}

/// Tokio-style code compiles unchanged with our import: a wrapper returning
/// `Poll<Option<Instant>>` from `poll_tick`, `.into()` from std instants where tokio
/// takes its `Instant`, `deadline()` and ticks stored in `time::Instant` fields, and
/// `Elapsed` into `io::Error`; and it runs as tokio's.
#[test]
fn tokio_style_signatures_compile_and_agree() {
    on_both!(|t| {
        struct Stored {
            deadline: t::Instant,
            tick: t::Instant,
        }
        fn next(i: &mut t::Interval, cx: &mut std::task::Context<'_>) -> Poll<Option<t::Instant>> {
            i.poll_tick(cx).map(Some)
        }
        fn io(e: t::error::Elapsed) -> std::io::Error {
            e.into()
        }
        paused_rt().block_on(async {
            let start = t::Instant::now();
            let std_start: std::time::Instant = start.into_std();
            let mut i = t::interval_at((std_start + ms(2)).into(), us(1_500));
            let first = poll_fn(|cx| next(&mut i, cx)).await;
            let mut sleep = Box::pin(t::sleep_until((std_start + ms(5)).into()));
            sleep.as_mut().reset((std_start + ms(4)).into());
            let stored = Stored {
                deadline: sleep.deadline(),
                tick: first.unwrap(),
            };
            sleep.await;
            let later: t::Instant = t::Instant::from_std(std_start + ms(9));
            let e = t::timeout_at(later, std::future::pending::<()>())
                .await
                .unwrap_err();
            i.reset_at((std_start + ms(20)).into());
            let last: t::Instant = i.tick().await;
            let end: std::time::Instant = t::Instant::now().into();
            vec![
                format!("{:?}", stored.deadline - start),
                format!("{:?}", stored.tick - start),
                format!("{:?}", io(e).kind()),
                format!("{:?}", last - start),
                format!("{:?}", end - std_start),
            ]
        })
    });
}
