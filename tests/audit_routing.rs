//! Outside audit of `Builder::routing(Routing)`: `Routing::ById` spreads new timers
//! over every shard whichever threads schedule; `Routing::ByCore` (the default) sends a
//! thread kept on one core to that core's shard; sleeps and timeouts go to their core's
//! shard under both; cancel, reset, shutdown, `max_pending`, `ManualClock` and `Stats`
//! stay exact under `ById`.

mod support;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use sharded_timer::{
    Builder, ManualClock, Routing, ScheduleError, ShardedTimer, Stats, TimerHandle, TimerState,
};
use support::{wait_until, Rng, WAIT};

const LONG: Duration = Duration::from_secs(60);

/// Joins every producer thread and gathers what each returned, in thread order.
fn joined<T>(threads: Vec<std::thread::JoinHandle<Vec<T>>>) -> Vec<T> {
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}

fn builder(routing: Routing, shards: usize) -> Builder {
    ShardedTimer::builder()
        .shards(shards)
        .executor_threads(2)
        .pin_cores(false)
        .thread_name("audit")
        .routing(routing)
}

fn build(routing: Routing, shards: usize) -> ShardedTimer {
    builder(routing, shards)
        .build()
        .expect("the service builds")
}

/// Waits until nothing is in the rings and `pending` timers are in the wheels.
fn settle(timer: &ShardedTimer, pending: u64) -> Stats {
    let mut last = timer.stats();
    let ok = wait_until(WAIT, || {
        last = timer.stats();
        last.in_rings == 0 && last.pending == pending
    });
    assert!(ok, "never settled at {pending} pending: {last:?}");
    last
}

fn shard_pending(stats: &Stats) -> Vec<u64> {
    stats.shards.iter().map(|s| s.pending).collect()
}

/// The core ids of the machine (at least `n` of them).
fn cores(n: usize) -> Vec<core_affinity::CoreId> {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    assert!(ids.len() >= n, "{n} cores needed, {} found", ids.len());
    ids
}

/// Runs `f` on a new thread pinned to `core`.
fn on_core<T: Send + 'static>(
    core: core_affinity::CoreId,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        assert!(core_affinity::set_for_current(core), "pinned to {core:?}");
        f()
    })
    .join()
    .expect("the pinned thread returned")
}

fn id_of(handle: &TimerHandle) -> u64 {
    handle
        .id()
        .to_string()
        .parse()
        .expect("ids display as decimals")
}

/// Each of `counts` holds between half and twice its even share of their total.
fn assert_even(counts: &[u64], what: &str) {
    let total: u64 = counts.iter().sum();
    let n = counts.len() as u64;
    for (k, &c) in counts.iter().enumerate() {
        assert!(
            c * 2 * n >= total && c * n <= 2 * total,
            "{what}: shard {k} has {c} of {total}, not near an even share: {counts:?}"
        );
    }
}

fn poll_once<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    f.poll(&mut cx)
}

// ---------------------------------------------------------------------------------

/// Routing is Copy + Eq + Debug + Default, the default being ByCore.
#[test]
fn routing_traits_and_default() {
    let d = Routing::default();
    assert_eq!(d, Routing::ByCore);
    let copy = d;
    assert_eq!(copy, d, "Copy: still usable after a move-by-copy");
    assert_ne!(Routing::ById, Routing::ByCore);
    assert_eq!(Routing::ById, Routing::ById);
    assert_eq!(format!("{:?}", Routing::ById), "ById");
    assert_eq!(format!("{:?}", Routing::ByCore), "ByCore");
    fn is_send_sync<T: Send + Sync + Copy + Eq + std::fmt::Debug + Default>() {}
    is_send_sync::<Routing>();
}

/// ById: one thread pinned to one core spreads its timers over all 4 shards, and
/// shutdown hands every one back exactly once.
#[test]
fn by_id_spreads_one_pinned_thread_over_every_shard() {
    let timer = build(Routing::ById, 4);
    let core = cores(1)[0];
    const N: usize = 64 * 100;
    let t = timer.clone();
    let ids = on_core(core, move || {
        (0..N)
            .map(|_| id_of(&t.schedule(LONG, || panic!("fired")).unwrap()))
            .collect::<Vec<_>>()
    });
    let stats = settle(&timer, N as u64);
    assert_eq!(stats.scheduled, N as u64);
    let per_shard = shard_pending(&stats);
    assert_eq!(per_shard.iter().sum::<u64>(), N as u64, "{stats:?}");
    assert_even(&per_shard, "one pinned thread, ById");
    let unfired = timer.shutdown();
    assert_eq!(unfired.len(), N);
    let back: HashSet<u64> = unfired
        .iter()
        .map(|u| u.id().to_string().parse().unwrap())
        .collect();
    assert_eq!(back, ids.into_iter().collect::<HashSet<_>>());
    assert_eq!(timer.stats().pending, 0);
}

/// ById: "each run of 64 consecutive timers of one thread goes to one shard (the id
/// without its low 6 bits), and successive runs spread over all of them".
#[test]
fn by_id_runs_of_64_ids_share_a_shard() {
    let timer = build(Routing::ById, 4);
    let mut shard_of_run: HashMap<u64, usize> = HashMap::new();
    let mut handles = Vec::new();
    let mut before = shard_pending(&settle(&timer, 0));
    for i in 0..(64 * 6) as u64 {
        let h = timer.schedule(LONG, || {}).unwrap();
        let after = shard_pending(&settle(&timer, i + 1));
        let grew: Vec<usize> = (0..4).filter(|&k| after[k] == before[k] + 1).collect();
        assert_eq!(
            grew.len(),
            1,
            "one shard took timer {i}: {before:?} -> {after:?}"
        );
        let shard = grew[0];
        let run = id_of(&h) >> 6;
        let first = *shard_of_run.entry(run).or_insert(shard);
        assert_eq!(
            first,
            shard,
            "timer {} (run {run}) left its run's shard",
            id_of(&h)
        );
        before = after;
        handles.push(h);
    }
    let used: HashSet<usize> = shard_of_run.values().copied().collect();
    assert!(
        used.len() >= 2,
        "6+ runs all went to one shard: {shard_of_run:?}"
    );
    for h in &handles {
        assert!(h.cancel());
    }
    settle(&timer, 0);
}

/// ById with shard counts that are not powers of two: still even.
#[test]
fn by_id_spreads_over_odd_shard_counts() {
    for shards in [3usize, 5, 7] {
        let timer = build(Routing::ById, shards);
        const N: u64 = 64 * 200;
        let handles: Vec<_> = (0..N)
            .map(|_| timer.schedule(LONG, || {}).unwrap())
            .collect();
        let stats = settle(&timer, N);
        assert_eq!(stats.shards.len(), shards);
        assert_even(&shard_pending(&stats), &format!("{shards} shards, ById"));
        drop(handles);
        assert_eq!(timer.shutdown().len(), N as usize);
    }
}

/// ById: 6 threads, all pinned to the same core, spread evenly over 3 shards, while
/// ByCore puts all of them on that core's shard.
#[test]
fn many_threads_on_one_core_by_id_vs_by_core() {
    let core = cores(1)[0];
    for routing in [Routing::ById, Routing::ByCore] {
        let timer = build(routing, 3);
        const PER: u64 = 64 * 25;
        let threads: Vec<_> = (0..6)
            .map(|_| {
                let t = timer.clone();
                std::thread::spawn(move || {
                    assert!(core_affinity::set_for_current(core));
                    (0..PER)
                        .map(|_| t.schedule(LONG, || {}).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let handles = joined(threads);
        let stats = settle(&timer, 6 * PER);
        let per_shard = shard_pending(&stats);
        match routing {
            Routing::ById => assert_even(&per_shard, "6 threads on one core, ById"),
            Routing::ByCore => {
                let mut expect = vec![0; 3];
                expect[core.id % 3] = 6 * PER;
                assert_eq!(per_shard, expect, "ByCore: all on core {}'s shard", core.id);
            }
        }
        drop(handles);
        assert_eq!(timer.shutdown().len(), 6 * PER as usize);
    }
}

/// ByCore (explicit and default): a thread pinned to core k sends every timer to
/// shard k % shards.
#[test]
fn by_core_pinned_thread_stays_on_its_cores_shard() {
    let ids = cores(2);
    for explicit in [true, false] {
        let b = ShardedTimer::builder()
            .shards(2)
            .executor_threads(2)
            .pin_cores(false)
            .thread_name("audit");
        let timer = if explicit {
            b.routing(Routing::ByCore)
        } else {
            b
        }
        .build()
        .unwrap();
        let mut expect = vec![0u64; 2];
        let mut all = Vec::new();
        for &core in &ids[..2] {
            let t = timer.clone();
            let hs = on_core(core, move || {
                (0..500)
                    .map(|_| t.schedule(LONG, || {}).unwrap())
                    .collect::<Vec<_>>()
            });
            all.extend(hs);
            expect[core.id % 2] += 500;
            let stats = settle(&timer, all.len() as u64);
            assert_eq!(
                shard_pending(&stats),
                expect,
                "ByCore (explicit: {explicit}) after core {}'s thread",
                core.id
            );
        }
        drop(all);
        timer.shutdown();
    }
}

/// The last `routing` call wins.
#[test]
fn last_routing_call_wins() {
    let core = cores(1)[0];
    let by_core = builder(Routing::ById, 2)
        .routing(Routing::ByCore)
        .build()
        .unwrap();
    let by_id = builder(Routing::ByCore, 2)
        .routing(Routing::ById)
        .build()
        .unwrap();
    for (timer, spread) in [(by_core, false), (by_id, true)] {
        let t = timer.clone();
        let hs = on_core(core, move || {
            (0..64 * 40)
                .map(|_| t.schedule(LONG, || {}).unwrap())
                .collect::<Vec<_>>()
        });
        let per_shard = shard_pending(&settle(&timer, hs.len() as u64));
        if spread {
            assert_even(&per_shard, "ByCore then ById");
        } else {
            let mut expect = vec![0; 2];
            expect[core.id % 2] = hs.len() as u64;
            assert_eq!(per_shard, expect, "ById then ByCore");
        }
        drop(hs);
        timer.shutdown();
    }
}

type Kind = fn(&ShardedTimer) -> TimerHandle;

fn kinds() -> Vec<(&'static str, Kind)> {
    vec![
        ("schedule", |t| t.schedule(LONG, || {}).unwrap()),
        ("schedule_at", |t| {
            t.schedule_at(Instant::now() + LONG, || {}).unwrap()
        }),
        ("schedule_repeating", |t| {
            t.schedule_repeating(LONG, || {}).unwrap()
        }),
        ("schedule_with_fixed_delay", |t| {
            t.schedule_with_fixed_delay(LONG, || {}).unwrap()
        }),
    ]
}

/// All four `schedule*` kinds obey ByCore (on a pinned thread) and ById (spread).
#[test]
fn every_schedule_kind_obeys_the_routing() {
    let core = cores(2)[1];
    for routing in [Routing::ByCore, Routing::ById] {
        let timer = build(routing, 2);
        let mut pending = 0u64;
        let mut before = shard_pending(&settle(&timer, 0));
        for (name, kind) in kinds() {
            let t = timer.clone();
            let hs = on_core(core, move || {
                (0..64 * 20).map(|_| kind(&t)).collect::<Vec<_>>()
            });
            pending += hs.len() as u64;
            let after = shard_pending(&settle(&timer, pending));
            let delta: Vec<u64> = (0..2).map(|k| after[k] - before[k]).collect();
            match routing {
                Routing::ByCore => {
                    let mut expect = vec![0; 2];
                    expect[core.id % 2] = hs.len() as u64;
                    assert_eq!(delta, expect, "{name} under ByCore on core {}", core.id);
                }
                Routing::ById => assert_even(&delta, &format!("{name} under ById")),
            }
            for h in &hs {
                assert!(h.cancel(), "{name}: cancel of a pending timer wins");
            }
            pending -= hs.len() as u64;
            before = shard_pending(&settle(&timer, pending));
        }
        let stats = timer.stats();
        assert_eq!(stats.scheduled, 4 * 64 * 20);
        assert_eq!(stats.cancelled, 4 * 64 * 20);
        assert_eq!(stats.fired, 0);
        assert!(timer.shutdown().is_empty());
    }
}

/// Sleeps and timeouts go to the shard of the core they are made on, under both
/// policies.
#[test]
fn sleeps_and_timeouts_stay_on_their_cores_shard() {
    for core in cores(2).into_iter().take(2) {
        for routing in [Routing::ById, Routing::ByCore] {
            let timer = build(routing, 2);
            let t = timer.clone();
            let (sleeps, timeouts) = on_core(core, move || {
                let mut sleeps = Vec::new();
                let mut timeouts = Vec::new();
                for _ in 0..200 {
                    let mut s = Box::pin(t.sleep(LONG));
                    assert!(poll_once(s.as_mut()).is_pending());
                    sleeps.push(s);
                    let mut o = Box::pin(t.timeout(LONG, std::future::pending::<()>()));
                    assert!(poll_once(o.as_mut()).is_pending());
                    timeouts.push(o);
                }
                (sleeps, timeouts)
            });
            let stats = settle(&timer, 400);
            let mut expect = vec![0; 2];
            expect[core.id % 2] = 400;
            assert_eq!(
                shard_pending(&stats),
                expect,
                "{routing:?}: sleeps and timeouts made on core {}",
                core.id
            );
            drop(sleeps);
            drop(timeouts);
            let stats = settle(&timer, 0);
            assert_eq!(stats.cancelled, 400, "{stats:?}");
            assert!(timer.shutdown().is_empty());
        }
    }
}

/// Many threads schedule and cancel under ById (two threads racing to cancel some
/// timers): every timer either fires once, never early, or has exactly one winning
/// cancel; the counters add up.
#[test]
fn by_id_concurrent_schedule_and_cancel_is_exact() {
    const THREADS: usize = 6;
    const PER: usize = 1500;
    let timer = build(Routing::ById, 4);
    struct Rec {
        fired: AtomicU32,
        early: AtomicBool,
        wins: AtomicU32,
    }
    let recs: Arc<Vec<Rec>> = Arc::new(
        (0..THREADS * PER)
            .map(|_| Rec {
                fired: AtomicU32::new(0),
                early: AtomicBool::new(false),
                wins: AtomicU32::new(0),
            })
            .collect(),
    );
    let mut txs = Vec::new();
    let mut rxs = Vec::new();
    for _ in 0..THREADS {
        let (tx, rx) = mpsc::channel::<(usize, TimerHandle)>();
        txs.push(tx);
        rxs.push(Some(rx));
    }
    let threads: Vec<_> = (0..THREADS)
        .map(|i| {
            let t = timer.clone();
            let recs = recs.clone();
            let tx = txs[(i + 1) % THREADS].clone();
            let rx = rxs[i].take().unwrap();
            std::thread::spawn(move || {
                let mut rng = Rng::new(i as u64 + 17);
                let mut mine = Vec::new();
                for j in 0..PER {
                    let n = i * PER + j;
                    let delay = Duration::from_micros(rng.below(200_000));
                    let not_before = Instant::now() + delay;
                    let r = recs.clone();
                    let h = t
                        .schedule(delay, move || {
                            if Instant::now() < not_before {
                                r[n].early.store(true, Ordering::SeqCst);
                            }
                            r[n].fired.fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap();
                    if n.is_multiple_of(3) {
                        tx.send((n, h.clone())).unwrap();
                    }
                    mine.push((n, h));
                    if j % 50 == 0 {
                        // Cancel the racing ones the neighbour sent so far.
                        while let Ok((m, h)) = rx.try_recv() {
                            if h.cancel() {
                                recs[m].wins.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    }
                }
                drop(tx);
                for (n, h) in &mine {
                    if n % 3 != 2 && h.cancel() {
                        recs[*n].wins.fetch_add(1, Ordering::SeqCst);
                    }
                }
                for (m, h) in rx {
                    if h.cancel() {
                        recs[m].wins.fetch_add(1, Ordering::SeqCst);
                    }
                }
                mine
            })
        })
        .collect();
    drop(txs);
    let handles = joined(threads);
    let total = (THREADS * PER) as u64;
    let ok = wait_until(WAIT, || {
        recs.iter()
            .all(|r| r.fired.load(Ordering::SeqCst) + r.wins.load(Ordering::SeqCst) >= 1)
    });
    assert!(ok, "some timer neither fired nor was cancelled");
    // Give a stray second fire a chance to show.
    std::thread::sleep(Duration::from_millis(50));
    let stats = settle(&timer, 0);
    let mut fired = 0u64;
    let mut cancelled = 0u64;
    assert_eq!(handles.len(), THREADS * PER);
    for (n, h) in &handles {
        let r = &recs[*n];
        let f = r.fired.load(Ordering::SeqCst);
        let w = r.wins.load(Ordering::SeqCst);
        assert!(!r.early.load(Ordering::SeqCst), "timer {n} fired early");
        assert_eq!(f + w, 1, "timer {n}: fired {f}, winning cancels {w}");
        assert_eq!(
            h.state(),
            if w == 1 {
                TimerState::Cancelled
            } else {
                TimerState::Fired
            },
            "timer {n}"
        );
        fired += u64::from(f);
        cancelled += u64::from(w);
    }
    assert_eq!(stats.scheduled, total, "{stats:?}");
    assert_eq!(stats.fired, fired, "{stats:?}");
    assert_eq!(stats.cancelled, cancelled, "{stats:?}");
    assert_eq!(
        stats.scheduled,
        stats.fired + stats.cancelled + stats.pending
    );
    assert_eq!(stats.shards.iter().map(|s| s.fired).sum::<u64>(), fired);
    assert!(
        stats.shards.iter().all(|s| s.fired > 0),
        "ById: every shard fired some: {stats:?}"
    );
    assert!(timer.shutdown().is_empty());
}

/// Shutdown while 4 threads schedule under ById: every timer that was accepted
/// either ran once, or comes back exactly once; refused ones never run.
#[test]
fn by_id_shutdown_during_scheduling_returns_each_pending_timer_once() {
    let timer = build(Routing::ById, 4);
    let runs = Arc::new(Mutex::new(HashMap::<usize, u32>::new()));
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let t = timer.clone();
            let runs = runs.clone();
            std::thread::spawn(move || {
                let mut accepted = Vec::new();
                let mut refused = 0usize;
                let mut cancelled = HashSet::new();
                for j in 0.. {
                    let n = i * 1_000_000 + j;
                    let r = runs.clone();
                    let delay = if j % 4 == 0 { Duration::ZERO } else { LONG };
                    match t.schedule(delay, move || *r.lock().unwrap().entry(n).or_insert(0) += 1) {
                        Ok(h) => {
                            if j % 5 == 1 && h.cancel() {
                                cancelled.insert(n);
                            }
                            accepted.push((n, h));
                        }
                        Err(ScheduleError::Shutdown) => {
                            refused += 1;
                            if refused > 100 {
                                break;
                            }
                        }
                        Err(e) => panic!("unexpected {e:?}"),
                    }
                }
                (accepted, cancelled)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let unfired = timer.shutdown();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let runs = runs.lock().unwrap().clone();
    let mut by_id: HashMap<u64, usize> = HashMap::new();
    for (k, u) in unfired.iter().enumerate() {
        let id: u64 = u.id().to_string().parse().unwrap();
        assert!(
            by_id.insert(id, k).is_none(),
            "timer {id} handed back twice"
        );
    }
    let mut accepted = 0;
    let mut back = 0;
    for (hs, cancelled) in &results {
        for (n, h) in hs {
            accepted += 1;
            let ran = runs.get(n).copied().unwrap_or(0);
            let returned = by_id.contains_key(&id_of(h));
            let was_cancelled = cancelled.contains(n);
            back += usize::from(returned);
            assert_eq!(
                u32::from(was_cancelled) + ran + u32::from(returned),
                1,
                "timer {n}: cancelled {was_cancelled}, ran {ran}, handed back {returned}"
            );
            if returned {
                assert!(
                    !h.cancel(),
                    "an Unfired's timer cannot be cancelled by handle"
                );
            }
        }
    }
    assert_eq!(back, unfired.len(), "handed back only accepted timers");
    assert!(
        accepted > 1000,
        "the threads scheduled something ({accepted})"
    );
    assert_eq!(
        runs.len(),
        runs.values().filter(|&&v| v == 1).count(),
        "none ran twice"
    );
    assert!(
        unfired.len() > 100,
        "long timers were pending at shutdown ({})",
        unfired.len()
    );
    let stats = timer.stats();
    assert_eq!(stats.pending, 0, "after shutdown: {stats:?}");
    // Run half the handed-back ones, drop the rest.
    let mut ran_now = 0;
    for (k, u) in unfired.into_iter().enumerate() {
        if k % 2 == 0 {
            u.run();
            ran_now += 1;
        }
    }
    assert!(ran_now > 0);
    assert!(timer.shutdown().is_empty(), "shutdown is idempotent");
}

/// One shard under ById: everything on shard 0, everything fires once.
#[test]
fn one_shard_by_id() {
    let timer = build(Routing::ById, 1);
    let fired = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let t = timer.clone();
            let f = fired.clone();
            std::thread::spawn(move || {
                let mut long = Vec::new();
                for k in 0..500u64 {
                    let f = f.clone();
                    t.schedule(Duration::from_millis(k % 50), move || {
                        f.fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap();
                    long.push(t.schedule(LONG, || {}).unwrap());
                }
                long
            })
        })
        .collect();
    let long = joined(threads);
    assert!(wait_until(WAIT, || fired.load(Ordering::SeqCst) == 2000));
    let stats = settle(&timer, 2000);
    assert_eq!(stats.shards.len(), 1);
    assert_eq!(stats.shards[0].pending, 2000);
    assert_eq!(stats.shards[0].fired, 2000);
    // Handed to the pool is not yet run: wait for the callbacks, then exactly 2000.
    assert!(wait_until(WAIT, || fired.load(Ordering::SeqCst) >= 2000));
    assert_eq!(fired.load(Ordering::SeqCst), 2000);
    assert_eq!(timer.shutdown().len(), long.len());
}

/// A ManualClock service under ById fires every timer exactly when the clock first
/// reaches its deadline (decided on the nanosecond), never before.
#[test]
fn manual_clock_by_id_fires_each_timer_exactly_at_its_deadline() {
    let clock = ManualClock::new();
    let timer = builder(Routing::ById, 4)
        .clock(clock.clone())
        .build()
        .unwrap();
    let start = clock.now();
    const N: usize = 64 * 20;
    let seen: Arc<Vec<Mutex<Option<Instant>>>> =
        Arc::new((0..N).map(|_| Mutex::new(None)).collect());
    let deadlines: Vec<Instant> = {
        let mut rng = Rng::new(5);
        (0..N)
            .map(|_| start + Duration::from_nanos(1 + rng.below(50_000_000)))
            .collect()
    };
    let threads: Vec<_> = (0..2)
        .map(|i| {
            let t = timer.clone();
            let c = clock.clone();
            let seen = seen.clone();
            let deadlines = deadlines.clone();
            std::thread::spawn(move || {
                (i * N / 2..(i + 1) * N / 2)
                    .map(|n| {
                        let c = c.clone();
                        let seen = seen.clone();
                        let h = if n % 2 == 0 {
                            t.schedule_at(deadlines[n], move || {
                                let mut s = seen[n].lock().unwrap();
                                assert!(s.is_none(), "timer {n} ran twice");
                                *s = Some(c.now());
                            })
                        } else {
                            t.schedule(deadlines[n] - c.now(), move || {
                                let mut s = seen[n].lock().unwrap();
                                assert!(s.is_none(), "timer {n} ran twice");
                                *s = Some(c.now());
                            })
                        }
                        .unwrap();
                        assert_eq!(h.deadline(), deadlines[n]);
                        h
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let handles = joined(threads);
    let per_shard = shard_pending(&settle(&timer, N as u64));
    assert!(
        per_shard.iter().all(|&p| p > 0),
        "ById spreads: {per_shard:?}"
    );
    let step = Duration::from_nanos(37_003);
    let mut now = start;
    while now < start + Duration::from_millis(51) {
        clock.advance(step);
        now += step;
        assert_eq!(clock.now(), now);
        for n in 0..N {
            let s = *seen[n].lock().unwrap();
            if deadlines[n] <= now {
                let at = s.unwrap_or_else(|| {
                    panic!(
                        "timer {n} due {:?} not fired at {:?}",
                        deadlines[n] - start,
                        now - start
                    )
                });
                assert!(at >= deadlines[n], "timer {n} early");
                assert!(
                    at + step > deadlines[n],
                    "timer {n} fired at {:?}, due {:?}: late",
                    at - start,
                    deadlines[n] - start
                );
            } else {
                assert!(
                    s.is_none(),
                    "timer {n} due {:?} fired at {:?}",
                    deadlines[n] - start,
                    now - start
                );
            }
        }
    }
    for h in &handles {
        assert_eq!(h.state(), TimerState::Fired);
    }
    let stats = settle(&timer, 0);
    assert_eq!(stats.fired, N as u64);
    assert_eq!(stats.scheduled, N as u64);
    assert!(timer.shutdown().is_empty());
}

/// Repeating timers on a ManualClock under ById: run n exactly at start + n × period.
#[test]
fn manual_clock_by_id_repeating_runs_on_the_grid() {
    let clock = ManualClock::new();
    let timer = builder(Routing::ById, 3)
        .clock(clock.clone())
        .build()
        .unwrap();
    let start = clock.now();
    let mut logs = Vec::new();
    let mut handles = Vec::new();
    for p in 1..=130u64 {
        // At least the tick (1 ms): a shorter period runs once per tick.
        let period = Duration::from_micros(1000 + 37 * p);
        let log = Arc::new(Mutex::new(Vec::new()));
        let (c, l) = (clock.clone(), log.clone());
        handles.push(
            timer
                .schedule_repeating(period, move || l.lock().unwrap().push(c.now()))
                .unwrap(),
        );
        logs.push((period, log));
    }
    settle(&timer, 130);
    for _ in 0..600 {
        clock.advance(Duration::from_micros(50));
    }
    let end = clock.now();
    for (period, log) in &logs {
        let log = log.lock().unwrap();
        let expected = ((end - start).as_nanos() / period.as_nanos()) as usize;
        assert_eq!(log.len(), expected, "period {period:?}");
        for (k, &at) in log.iter().enumerate() {
            let due = start + *period * (k as u32 + 1);
            assert!(
                at >= due && at < due + Duration::from_micros(50),
                "period {period:?} run {k} at {:?}, due {:?}",
                at - start,
                due - start
            );
        }
    }
    for h in &handles {
        assert!(h.cancel());
    }
    let stats = settle(&timer, 0);
    assert_eq!(stats.cancelled, 130);
    assert_eq!(stats.scheduled, 130);
}

/// `max_pending` counts across all shards under ById, exactly.
#[test]
fn by_id_max_pending_is_exact_across_shards() {
    let timer = builder(Routing::ById, 4).max_pending(300).build().unwrap();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let t = timer.clone();
            std::thread::spawn(move || {
                let mut ok = Vec::new();
                let mut refused = 0;
                for _ in 0..200 {
                    match t.schedule(LONG, || {}) {
                        Ok(h) => ok.push(h),
                        Err(ScheduleError::TooManyPending { limit: 300 }) => refused += 1,
                        Err(e) => panic!("{e:?}"),
                    }
                }
                (ok, refused)
            })
        })
        .collect();
    let mut ok = Vec::new();
    let mut refused = 0;
    for t in threads {
        let (o, r) = t.join().unwrap();
        ok.extend(o);
        refused += r;
    }
    assert_eq!(ok.len(), 300);
    assert_eq!(refused, 300);
    // 300 timers are about 5 runs of 64 ids: at least two shards, not all four.
    let per_shard = shard_pending(&settle(&timer, 300));
    assert!(
        per_shard.iter().filter(|&&p| p > 0).count() >= 2,
        "{per_shard:?}"
    );
    assert!(timer.schedule(LONG, || {}).is_err());
    assert!(ok[0].cancel());
    let extra = timer.schedule(LONG, || {}).expect("a cancel freed room");
    assert!(timer.schedule(LONG, || {}).is_err());
    drop(extra);
    assert_eq!(timer.shutdown().len(), 300);
}

/// Under ById, another thread (on another core) resets timers earlier; each fires
/// once, not before its new deadline, on the shard it was filed in.
#[test]
fn by_id_reset_from_another_core() {
    let ids = cores(2);
    let timer = build(Routing::ById, 4);
    const N: usize = 64 * 10;
    let not_before: Arc<Vec<Mutex<Option<Instant>>>> =
        Arc::new((0..N).map(|_| Mutex::new(None)).collect());
    let fired = Arc::new((0..N).map(|_| AtomicU32::new(0)).collect::<Vec<_>>());
    let early = Arc::new(AtomicUsize::new(0));
    let (t, nb, f, e) = (
        timer.clone(),
        not_before.clone(),
        fired.clone(),
        early.clone(),
    );
    let handles = on_core(ids[0], move || {
        (0..N)
            .map(|n| {
                let (nb, f, e) = (nb.clone(), f.clone(), e.clone());
                t.schedule(LONG, move || {
                    let bound = nb[n].lock().unwrap().expect("reset before firing");
                    if Instant::now() < bound {
                        e.fetch_add(1, Ordering::SeqCst);
                    }
                    f[n].fetch_add(1, Ordering::SeqCst);
                })
                .unwrap()
            })
            .collect::<Vec<_>>()
    });
    let before = shard_pending(&settle(&timer, N as u64));
    let hs = handles.clone();
    let nb = not_before.clone();
    on_core(ids[1], move || {
        for (n, h) in hs.iter().enumerate() {
            let d = Duration::from_millis(20 + (n as u64 % 80));
            *nb[n].lock().unwrap() = Some(Instant::now() + d);
            assert!(h.reset(d), "timer {n} was pending");
        }
    });
    assert!(wait_until(WAIT, || fired
        .iter()
        .all(|f| f.load(Ordering::SeqCst) >= 1)));
    std::thread::sleep(Duration::from_millis(30));
    assert!(
        fired.iter().all(|f| f.load(Ordering::SeqCst) == 1),
        "each fired once"
    );
    assert_eq!(
        early.load(Ordering::SeqCst),
        0,
        "none before its reset deadline"
    );
    let stats = settle(&timer, 0);
    let fired_per_shard: Vec<u64> = stats.shards.iter().map(|s| s.fired).collect();
    assert_eq!(
        fired_per_shard, before,
        "each timer fired on the shard it was filed in"
    );
    for h in &handles {
        assert!(!h.reset(LONG));
        assert!(!h.cancel());
    }
    assert!(timer.shutdown().is_empty());
}

// Found by this audit (a defect, fixed in `TimerId::shard_index`): `Routing::ById`
// promises "Fibonacci hashing of the id without its low 6 bits, so each run of 64
// consecutive timers of one thread goes to one shard and successive runs spread over
// all of them". The hash was reduced by a remainder, which spread successive runs
// only over a power of two shards (2, 4, 8): with 3, 5, 6 or 7 they clumped (on 3
// shards one thread's 6 successive runs, 384 timers, all went to one shard; on 6, 12
// successive runs reached only 4). Fibonacci hashing proper, the product's high part
// times `shards`, spreads them for any count.
/// ById: every window of 2 × shards successive runs of 64 ids of one thread reaches
/// every shard, for 2 to 8 shards.
#[test]
fn by_id_successive_runs_spread_over_every_shard_for_any_shard_count() {
    let mut failures = Vec::new();
    for shards in 2usize..=8 {
        // A manual clock: nothing fires, so the per-shard counts only grow.
        let clock = ManualClock::new();
        let timer = builder(Routing::ById, shards)
            .clock(clock.clone())
            .build()
            .unwrap();
        let mut before = shard_pending(&settle(&timer, 0));
        let mut seq = Vec::new();
        let mut handles = Vec::new();
        for r in 0..64u64 {
            for _ in 0..64 {
                handles.push(timer.schedule(LONG, || {}).unwrap());
            }
            let after = shard_pending(&settle(&timer, (r + 1) * 64));
            // The 64 may straddle two runs when the thread's ids do not start on a run.
            let grew: Vec<usize> = (0..shards).filter(|&k| after[k] > before[k]).collect();
            if grew.len() == 1 {
                seq.push(grew[0]);
            }
            before = after;
        }
        assert!(
            seq.len() >= 60,
            "runs of 64 ids were not aligned: {}",
            seq.len()
        );
        let worst = seq
            .windows(2 * shards)
            .map(|w| w.iter().collect::<HashSet<_>>().len())
            .min()
            .unwrap();
        if worst < shards {
            failures.push(format!(
                "{shards} shards: a window of {} successive runs reached only {worst} shards; runs went to {:?}",
                2 * shards,
                &seq[..24]
            ));
        }
        drop(handles);
        assert_eq!(timer.shutdown().len(), 64 * 64);
    }
    assert!(
        failures.is_empty(),
        "successive runs did not spread:\n{}",
        failures.join("\n")
    );
}

/// Re-entrant under ById with inline callbacks: a callback on one shard schedules a
/// child (routed by id, so often to another shard) and cancels a long timer (on its
/// own shard, wherever that is); every count is exact.
#[test]
fn by_id_reentrant_schedule_and_cancel_across_shards() {
    let timer = builder(Routing::ById, 4)
        .callbacks(sharded_timer::Callbacks::inline())
        .build()
        .unwrap();
    const N: usize = 64 * 8;
    let children = Arc::new(AtomicUsize::new(0));
    let wins = Arc::new(AtomicUsize::new(0));
    let victims: Vec<_> = (0..N)
        .map(|_| timer.schedule(LONG, || panic!("a victim fired")))
        .collect::<Result<_, _>>()
        .unwrap();
    for (k, victim) in victims.iter().enumerate() {
        let (t, c, w, v) = (
            timer.clone(),
            children.clone(),
            wins.clone(),
            victim.clone(),
        );
        timer
            .schedule(Duration::from_millis(k as u64 % 50), move || {
                if v.cancel() {
                    w.fetch_add(1, Ordering::SeqCst);
                }
                let not_before = Instant::now() + Duration::from_millis(1 + k as u64 % 10);
                t.schedule(Duration::from_millis(1 + k as u64 % 10), move || {
                    assert!(Instant::now() >= not_before, "child early");
                    c.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
            })
            .unwrap();
    }
    assert!(
        wait_until(WAIT, || children.load(Ordering::SeqCst) == N),
        "children: {}",
        children.load(Ordering::SeqCst)
    );
    assert_eq!(wins.load(Ordering::SeqCst), N, "every victim cancel won");
    let stats = settle(&timer, 0);
    assert_eq!(stats.scheduled, 3 * N as u64, "{stats:?}");
    assert_eq!(stats.fired, 2 * N as u64, "{stats:?}");
    assert_eq!(stats.cancelled, N as u64, "{stats:?}");
    assert_eq!(stats.panicked, 0);
    for v in &victims {
        assert_eq!(v.state(), TimerState::Cancelled);
    }
    assert!(timer.shutdown().is_empty());
}
