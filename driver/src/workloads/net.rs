//! `net`: timeouts on real sockets (issue 21). A tokio TCP server on 127.0.0.1 and
//! its clients, in one process on one multi-thread runtime (one worker per core):
//!
//! - every request is a round trip of 8 bytes under a client-side `timeout`
//!   ([`REQUEST_TIMEOUT`]), and the server answers it under a `timeout` too;
//! - the server closes a connection after [`IDLE`] without a message, through one
//!   `Sleep` per connection reset by every message;
//! - first every connection sends requests back to back for [`LOAD`] (the measured
//!   phase: requests/s and CPU ns per request); then half the connections go quiet,
//!   one after another over [`QUIET_SPREAD`] (each sends one last request), and the
//!   other half send one request every [`PACE`] (well inside `IDLE`), until every
//!   quiet connection has been closed (bounded by [`CLOSE_WAIT`]); then the busy half
//!   hangs up.
//!
//! Checked per run: every quiet connection is closed by the server, none before its
//! idle deadline (the `Sleep`'s deadline: last message + 2 s), no busy connection is
//! closed, and no request timed out. The same program runs with sharded-timer's
//! `timeout` and `sleep` (inline callbacks), with `tokio::time`'s, and with pingora's
//! `fast_timeout` for the timeouts (its idle `Sleep` is tokio's: pingora has no
//! resettable sleep).
//!
//! Each idle timer is polled through a [`WakeProbe`], so an idle close has two
//! latenesses: when the timer woke the server's task (the timer's part, which
//! guarantee 2 bounds and the report judges) and when the task ran (after a runtime
//! worker took it up: what the connection sees, for every peer alike). Between the
//! two the task waits in a queue of the runtime: a wake from one of its workers (as
//! tokio's timer's) puts it in that worker's own queue, a wake from any other thread
//! (as sharded-timer's shard's) in the runtime's global queue, which a busy worker
//! looks at only now and then; the report gives that queue's depth while the quiet
//! half closes.

#![forbid(unsafe_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::{Duration, Instant};

use sharded_timer::{Callbacks, ShardedTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::report::{cpu_seconds, histogram, lateness, Lateness, Meter, Rates, WorkloadReport};
use crate::Common;

use super::WakeProbe;

/// A request's (and its answer's) timeout; none should elapse on loopback.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// A connection without a message for this long is closed by the server.
const IDLE: Duration = Duration::from_secs(2);
/// The measured phase: every connection sends back to back.
const LOAD: Duration = Duration::from_millis(1500);
/// The busy half's spacing between requests while the quiet half waits to be closed.
const PACE: Duration = Duration::from_millis(250);
/// The quiet half's last requests spread over this long after `LOAD`.
const QUIET_SPREAD: Duration = Duration::from_secs(1);
/// How long the busy half waits, after `LOAD`, for every quiet connection's close.
const CLOSE_WAIT: Duration = Duration::from_secs(6);
/// How long the server waits for a connection's first message.
const FIRST_MESSAGE_WAIT: Duration = Duration::from_secs(60);
/// Connections opened at once while connecting (well inside the listen backlog).
const CONNECT_BATCH: usize = 128;
/// The listen backlog asked for.
const BACKLOG: u32 = 1024;
/// How long a batch of connections may take to be accepted.
const ACCEPT_WAIT: Duration = Duration::from_secs(10);
/// Descriptors kept free for the rest of the process.
const SPARE_FDS: u64 = 256;

/// The clients' phase.
const PHASE_LOAD: u8 = 0;
/// The quiet half is quiet, the busy half paced.
const PHASE_QUIET: u8 = 1;
/// The busy half hangs up.
const PHASE_STOP: u8 = 2;

/// A request's first byte: the connection's half.
const BUSY: u8 = b'b';
/// See [`BUSY`].
const QUIET: u8 = b'q';

/// Whose timers the server and clients use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peer {
    /// sharded-timer: `timeout` and a resettable `sleep`, inline callbacks.
    Ours,
    /// `tokio::time::timeout` and `tokio::time::sleep`.
    Tokio,
    /// `pingora_timeout::fast_timeout` for the timeouts; tokio's `sleep` for idle.
    Pingora,
}

impl Peer {
    /// Every peer, ours first.
    pub(crate) const ALL: [Peer; 3] = [Peer::Ours, Peer::Tokio, Peer::Pingora];

    /// The peer `name` names (as `--peers` does), if any.
    pub(crate) fn named(name: &str) -> Option<Peer> {
        Peer::ALL.into_iter().find(|peer| peer.is_named(name))
    }

    /// Its name in `--peers` (and in `--cold-cell`).
    pub(crate) fn spec_name(self) -> &'static str {
        match self {
            Peer::Ours => "sharded-timer",
            Peer::Tokio => "tokio",
            Peer::Pingora => "pingora",
        }
    }

    /// Whether `--peers` names it.
    fn is_named(self, name: &str) -> bool {
        match self {
            Peer::Ours => name == "sharded-timer",
            Peer::Tokio => name == "tokio" || name == "tokio-timeout",
            Peer::Pingora => name == "pingora",
        }
    }

    /// Its name in the report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Peer::Ours => "sharded-timer",
            Peer::Tokio => "tokio::time",
            Peer::Pingora => "pingora (timeouts)",
        }
    }
}

/// The timers of one run, as the server and clients call them.
#[derive(Clone)]
struct Timers {
    /// Whose.
    peer: Peer,
    /// sharded-timer's service (used only by `Peer::Ours`).
    timer: ShardedTimer,
}

/// A connection's idle timer: ours or tokio's.
enum IdleSleep {
    /// sharded-timer's `Sleep`.
    Ours(sharded_timer::Sleep),
    /// tokio's (boxed: it is `!Unpin`).
    Tokio(Pin<Box<tokio::time::Sleep>>),
}

/// A connection's idle timer, polled through a [`WakeProbe`]: when it fires, the
/// probe has the instant the timer woke the task, apart from when the runtime polled
/// it.
struct Idle {
    /// The timer.
    sleep: IdleSleep,
    /// Records the timer's wakes.
    probe: Arc<WakeProbe>,
    /// `probe` as a waker, made once (the timers see the same waker at each poll).
    probe_waker: Waker,
}

impl Idle {
    /// An idle timer around `sleep`.
    fn new(sleep: IdleSleep) -> Self {
        let probe = Arc::new(WakeProbe::default());
        Idle {
            sleep,
            probe_waker: Waker::from(probe.clone()),
            probe,
        }
    }

    /// Moves the deadline to `deadline`.
    fn reset(&mut self, deadline: Instant) {
        match &mut self.sleep {
            IdleSleep::Ours(sleep) => Pin::new(sleep).reset(deadline.into()),
            IdleSleep::Tokio(sleep) => sleep.as_mut().reset(deadline.into()),
        }
    }

    /// The deadline asked for.
    fn deadline(&self) -> Instant {
        match &self.sleep {
            IdleSleep::Ours(sleep) => sleep.deadline().into_std(),
            IdleSleep::Tokio(sleep) => sleep.deadline().into_std(),
        }
    }

    /// When the timer last woke the task.
    fn woken_at(&self) -> Option<Instant> {
        self.probe.woken_at()
    }
}

impl Future for Idle {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let idle = self.get_mut();
        let mut cx = idle.probe.stand_in(cx, &idle.probe_waker);
        match &mut idle.sleep {
            IdleSleep::Ours(sleep) => Pin::new(sleep).poll(&mut cx),
            IdleSleep::Tokio(sleep) => sleep.as_mut().poll(&mut cx),
        }
    }
}

impl Timers {
    /// Runs `f` under a `REQUEST_TIMEOUT`; `None` if it elapsed.
    async fn timeout<F: Future>(&self, f: F) -> Option<F::Output> {
        match self.peer {
            Peer::Ours => self.timer.timeout(REQUEST_TIMEOUT, f).await.ok(),
            Peer::Tokio => tokio::time::timeout(REQUEST_TIMEOUT, f).await.ok(),
            Peer::Pingora => pingora_timeout::fast_timeout::fast_timeout(REQUEST_TIMEOUT, f)
                .await
                .ok(),
        }
    }

    /// A fresh idle timer, due `after` from now.
    fn idle(&self, after: Duration) -> Idle {
        match self.peer {
            Peer::Ours => Idle::new(IdleSleep::Ours(self.timer.sleep(after))),
            Peer::Tokio | Peer::Pingora => {
                Idle::new(IdleSleep::Tokio(Box::pin(tokio::time::sleep(after))))
            }
        }
    }
}

/// What the server and clients saw.
#[derive(Debug, Default)]
struct Tally {
    /// Requests answered during `LOAD` (counted by the clients).
    load_requests: AtomicU64,
    /// Requests answered after it.
    later_requests: AtomicU64,
    /// Requests (either side's) whose timeout elapsed: must be 0 on loopback.
    timed_out: AtomicU64,
    /// Quiet connections the server closed for idleness.
    quiet_closed: AtomicU64,
    /// Busy connections the server closed for idleness: must be 0.
    busy_closed: AtomicU64,
    /// Idle closes before the idle deadline: must be 0.
    early: AtomicU64,
    /// Idle closes' lateness after the deadline, µs: when the server's task ran.
    lateness: Mutex<Vec<u32>>,
    /// When the idle timer woke the server's task, µs after the deadline.
    wake_lateness: Mutex<Vec<u32>>,
    /// Clients that failed (connect, I/O): must be 0.
    failed: AtomicU64,
}

/// One peer's run.
#[derive(Debug)]
struct NetRun {
    /// Whose timers.
    peer: Peer,
    /// Requests per second during `LOAD`.
    requests_per_sec: f64,
    /// Process CPU ns per request during `LOAD`.
    cpu_ns_per_request: f64,
    /// Idle closes' lateness, µs: when the server's task ran.
    lateness: Lateness,
    /// When the idle timers woke the server's tasks, µs after their deadlines.
    wake_lateness: Lateness,
    /// The runtime's global (injection) queue while the quiet half closed, sampled
    /// each millisecond: median and largest depth, in tasks.
    global_queue: (usize, usize),
    /// The tallies.
    tally: Arc<Tally>,
}

impl NetRun {
    /// Whether the run failed, out of `quiet` quiet connections: a request timed out,
    /// a client failed, or an idle close was lost, early or of a busy connection.
    fn failed(&self, quiet: u64) -> bool {
        // ORDERING: Relaxed: the run has ended and its runtime is dropped.
        let count = |f: fn(&Tally) -> &AtomicU64| f(&self.tally).load(Ordering::Relaxed);
        count(|t| &t.timed_out)
            + count(|t| &t.failed)
            + quiet.saturating_sub(count(|t| &t.quiet_closed))
            + count(|t| &t.busy_closed)
            + count(|t| &t.early)
            > 0
    }
}

/// Serves one connection: answers each request under a timeout, closes after `IDLE`
/// without a message.
async fn serve(timers: Timers, mut stream: TcpStream, tally: Arc<Tally>) {
    // Until the first message, a deadline the connecting phase cannot reach: every
    // connection sends during `LOAD`, and each message moves it to `IDLE` from then.
    let mut idle = timers.idle(FIRST_MESSAGE_WAIT);
    let mut buf = [0u8; 64];
    let mut half = None;
    loop {
        tokio::select! {
            biased;
            read = stream.read(&mut buf) => {
                let n = match read {
                    Ok(0) | Err(_) => return, // the client hung up
                    Ok(n) => n,
                };
                half.get_or_insert(buf[0]);
                if timers.timeout(stream.write_all(&buf[..n])).await.is_none() {
                    tally.timed_out.fetch_add(1, Ordering::Relaxed);
                }
                idle.reset(Instant::now() + IDLE);
            }
            () = &mut idle => {
                let (late, early) = lateness(idle.deadline(), Instant::now());
                let woken = idle.woken_at().map_or(late, |at| lateness(idle.deadline(), at).0);
                tally.wake_lateness.lock().unwrap_or_else(|e| e.into_inner()).push(woken);
                if early {
                    tally.early.fetch_add(1, Ordering::Relaxed);
                }
                tally.lateness.lock().unwrap_or_else(|e| e.into_inner()).push(late);
                if half == Some(BUSY) {
                    tally.busy_closed.fetch_add(1, Ordering::Relaxed);
                } else {
                    tally.quiet_closed.fetch_add(1, Ordering::Relaxed);
                }
                return; // dropping the stream closes it
            }
        }
    }
}

/// One request: 8 bytes out, 8 back, under a timeout. `Err` on I/O failure or EOF.
async fn request(
    timers: &Timers,
    stream: &mut TcpStream,
    half: u8,
    tally: &Tally,
) -> Result<(), ()> {
    let message = [half; 8];
    let mut answer = [0u8; 8];
    let round_trip = async {
        stream.write_all(&message).await?;
        stream.read_exact(&mut answer).await.map(|_| ())
    };
    match timers.timeout(round_trip).await {
        Some(Ok(())) => Ok(()),
        Some(Err(_)) => Err(()),
        None => {
            tally.timed_out.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }
}

/// A client: requests back to back during `LOAD`; then, if quiet, one last request
/// `stagger × QUIET_SPREAD` later and nothing until the server closes; if busy, one
/// request every `PACE` (from `stagger × PACE` on) until told to stop.
async fn client(
    timers: Timers,
    mut stream: TcpStream,
    half: u8,
    stagger: f64,
    phase: Arc<AtomicU8>,
    tally: Arc<Tally>,
) {
    let mut load_requests = 0;
    while phase.load(Ordering::Relaxed) == PHASE_LOAD {
        if request(&timers, &mut stream, half, &tally).await.is_err() {
            tally.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        load_requests += 1;
    }
    tally
        .load_requests
        .fetch_add(load_requests, Ordering::Relaxed);
    if half == QUIET {
        // One last request, `quiet_after` into the quiet phase (the quiet half's
        // idle deadlines spread over `QUIET_SPREAD`, as connections going quiet at
        // random times), then wait for the server's close: EOF.
        tokio::time::sleep(QUIET_SPREAD.mul_f64(stagger)).await;
        if request(&timers, &mut stream, half, &tally).await.is_err() {
            tally.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut byte = [0u8; 1];
        if !matches!(stream.read(&mut byte).await, Ok(0)) {
            tally.failed.fetch_add(1, Ordering::Relaxed);
        }
        return;
    }
    // Paced, each connection at its own offset into the period: the busy half's
    // requests spread evenly rather than arrive as one burst every `PACE`.
    tokio::time::sleep(PACE.mul_f64(stagger)).await;
    while phase.load(Ordering::Relaxed) == PHASE_QUIET {
        if request(&timers, &mut stream, half, &tally).await.is_err() {
            // Closed by the server: counted there as a busy close.
            return;
        }
        tally.later_requests.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(PACE).await;
    }
}

/// A listener on a fresh loopback port with a [`BACKLOG`]-deep accept queue.
fn listen() -> TcpListener {
    let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
    socket
        .bind("127.0.0.1:0".parse().expect("an address"))
        .expect("a loopback port");
    socket.listen(BACKLOG).expect("listening")
}

/// Raises the descriptor limit as far as allowed and returns how many connections fit
/// (two descriptors each, client and server side).
fn connections_that_fit(wanted: usize) -> usize {
    let want = wanted as u64 * 2 + SPARE_FDS;
    let limit = rlimit::increase_nofile_limit(want).unwrap_or(1024);
    let fit = (limit.saturating_sub(SPARE_FDS) / 2) as usize;
    wanted.min(fit).max(2)
}

/// One run with `peer`'s timers over `connections` connections.
fn run_peer(common: &Common, peer: Peer, connections: usize) -> NetRun {
    let workers = std::thread::available_parallelism().map_or(2, usize::from);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .thread_name("net-rt")
        .build()
        .expect("a tokio runtime");
    let timer = ShardedTimer::builder()
        .callbacks(Callbacks::inline())
        .tick(common.tick)
        .pin_cores(common.pin)
        .thread_name("net")
        .build()
        .expect("sharded-timer starts");
    let timers = Timers {
        peer,
        timer: timer.clone(),
    };
    let tally = Arc::new(Tally::default());
    let phase = Arc::new(AtomicU8::new(PHASE_LOAD));
    // Where a woken task waits for a worker: a wake from a runtime worker (tokio's
    // timer fires on one) queues the task in that worker's own queue, a wake from
    // any other thread (sharded-timer's shard) in the runtime's global queue, which a
    // busy worker looks at only now and then. Its depth while the quiet half closes,
    // from a thread of its own (a task would wait in the same queues).
    let global_queue = {
        let (metrics, phase) = (runtime.metrics(), phase.clone());
        std::thread::Builder::new()
            .name("net-queue".to_owned())
            .spawn(move || {
                let mut depths = Vec::new();
                loop {
                    // ORDERING: Relaxed: a phase flag, read for sampling only.
                    match phase.load(Ordering::Relaxed) {
                        PHASE_LOAD => {}
                        PHASE_QUIET => depths.push(metrics.global_queue_depth()),
                        _ => break,
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                depths.sort_unstable();
                let median = depths.get(depths.len() / 2).copied().unwrap_or(0);
                (median, depths.last().copied().unwrap_or(0))
            })
            .expect("a sampling thread")
    };
    let (load_wall, load_cpu) = runtime.block_on(async {
        let listener = listen();
        let address = listener.local_addr().expect("its address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let server = {
            let (timers, tally, accepted) = (timers.clone(), tally.clone(), accepted.clone());
            tokio::spawn(async move {
                while accepted.load(Ordering::Relaxed) < connections {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(serve(timers.clone(), stream, tally.clone()));
                    accepted.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        // Connect every client first, a batch at a time, each batch accepted before
        // the next: a connection the kernel completes but the accept queue drops
        // would otherwise never reach the server.
        let mut streams = Vec::with_capacity(connections);
        while streams.len() < connections {
            let batch = CONNECT_BATCH.min(connections - streams.len());
            let connecting: Vec<_> = (0..batch)
                .map(|_| tokio::spawn(TcpStream::connect(address)))
                .collect();
            for connect in connecting {
                let stream = connect
                    .await
                    .expect("a connect task")
                    .expect("a loopback connection");
                let _ = stream.set_nodelay(true);
                streams.push(stream);
            }
            let waited = Instant::now();
            while accepted.load(Ordering::Relaxed) < streams.len() {
                assert!(
                    waited.elapsed() < ACCEPT_WAIT,
                    "the server did not accept a loopback connection within {ACCEPT_WAIT:?}"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        server.await.expect("the accept loop");
        let cpu_before = cpu_seconds();
        let start = Instant::now();
        let quiet = connections / 2;
        let clients: Vec<_> = streams
            .into_iter()
            .enumerate()
            .map(|(index, stream)| {
                let half = if index % 2 == 0 { BUSY } else { QUIET };
                // Where in its half this connection falls, in [0, 1).
                let stagger = (index / 2) as f64 / quiet.max(1) as f64;
                tokio::spawn(client(
                    timers.clone(),
                    stream,
                    half,
                    stagger,
                    phase.clone(),
                    tally.clone(),
                ))
            })
            .collect();
        tokio::time::sleep(LOAD).await;
        phase.store(PHASE_QUIET, Ordering::Relaxed);
        let load_wall = start.elapsed();
        let load_cpu = match (cpu_before, cpu_seconds()) {
            (Some(before), Some(after)) => Some(after - before),
            _ => None,
        };
        // Wait for every quiet connection's close, then stop the busy half.
        let waited = Instant::now();
        while tally.quiet_closed.load(Ordering::Relaxed) < quiet as u64
            && waited.elapsed() < CLOSE_WAIT
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        phase.store(PHASE_STOP, Ordering::Relaxed);
        for client in clients {
            client.await.expect("a client task");
        }
        (load_wall, load_cpu)
    });
    let global_queue = global_queue.join().expect("the sampling thread");
    drop(runtime);
    drop(timers);
    drop(timer.shutdown());
    let load_requests = tally.load_requests.load(Ordering::Relaxed) as f64;
    let of = |samples: &Mutex<Vec<u32>>| {
        let mut lateness_histogram = histogram();
        for &late in samples.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            lateness_histogram.saturating_record(u64::from(late).max(1));
        }
        Lateness::of(&lateness_histogram)
    };
    NetRun {
        peer,
        requests_per_sec: load_requests / load_wall.as_secs_f64(),
        cpu_ns_per_request: load_cpu.map_or(f64::NAN, |cpu| cpu * 1e9 / load_requests),
        lateness: of(&tally.lateness),
        wake_lateness: of(&tally.wake_lateness),
        global_queue,
        tally,
    }
}

/// Runs the three peers over `wanted` connections (fewer if the descriptor limit
/// cannot be raised that far; the report says so) and reports sharded-timer's run,
/// with tokio's and pingora's in its notes.
pub(crate) fn run(common: &Common, wanted: usize, only: &[String]) -> WorkloadReport {
    let connections = connections_that_fit(wanted);
    let meter = Meter::start();
    // sharded-timer always runs; `--peers` may leave the others out.
    let runs: Vec<NetRun> = [Peer::Ours, Peer::Tokio, Peer::Pingora]
        .into_iter()
        .filter(|&peer| {
            peer == Peer::Ours || only.is_empty() || only.iter().any(|name| peer.is_named(name))
        })
        .map(|peer| run_peer(common, peer, connections))
        .collect();
    let process = meter.stop();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let too_loaded = process.load(cores).too_loaded();
    let ours = &runs[0];
    let count = |run: &NetRun, f: fn(&Tally) -> &AtomicU64| f(&run.tally).load(Ordering::Relaxed);
    let quiet = connections as u64 / 2;
    let mut notes = vec![format!(
        "{connections} loopback connections{}, one tokio runtime; each request under a {REQUEST_TIMEOUT:?} timeout; idle close after {IDLE:?} through a Sleep reset per message; requests/s and CPU ns per request over {LOAD:?} of back-to-back requests; then half go quiet over {QUIET_SPREAD:?} while the rest send every {PACE:?}: idle closes' lateness, judged when the timer woke the server's task (the timer's part: guarantee 2), and shown also when the task ran (after a runtime worker took it up)",
        if connections < wanted {
            format!(" (of {wanted} asked: RLIMIT_NOFILE allows no more)")
        } else {
            String::new()
        }
    )];
    for run in &runs {
        notes.push(format!(
            "{:<19} {:>8.0} requests/s, {:>6.0} CPU ns/request ({:.2}x sharded-timer's); {}/{quiet} quiet connections closed, each after its deadline (none early); how long after it: the timer woke the task p50 {:.2} / p99 {:.2} / max {:.2} ms, the task ran p50 {:.2} / p99 {:.2} / max {:.2} ms (the runtime's global queue meanwhile p50 {} / max {} tasks); busy connections closed {}, requests timed out {}, clients failed {}{}{}",
            run.peer.name(),
            run.requests_per_sec,
            run.cpu_ns_per_request,
            run.cpu_ns_per_request / ours.cpu_ns_per_request,
            count(run, |t| &t.quiet_closed),
            run.wake_lateness.p50 as f64 / 1e3,
            run.wake_lateness.p99 as f64 / 1e3,
            run.wake_lateness.max as f64 / 1e3,
            run.lateness.p50 as f64 / 1e3,
            run.lateness.p99 as f64 / 1e3,
            run.lateness.max as f64 / 1e3,
            run.global_queue.0,
            run.global_queue.1,
            count(run, |t| &t.busy_closed),
            count(run, |t| &t.timed_out),
            count(run, |t| &t.failed),
            ran_later_than_peers(run, &runs),
            if !run.failed(quiet) {
                String::new()
            } else if count(run, |t| &t.early) == 0 && too_loaded {
                ": not judged (the machine was too loaded: the rule that declines to judge sharded-timer's lateness)".to_owned()
            } else {
                format!(": FAILED ({} early)", count(run, |t| &t.early))
            },
        ));
    }
    /// A flag for a run whose task ran later (p99) than another peer's by more than a
    /// millisecond and a half while its timer woke it as promptly: the difference is
    /// then in the wait for a runtime worker after the wake-up, not in the timer.
    fn ran_later_than_peers(run: &NetRun, runs: &[NetRun]) -> String {
        let slower: Vec<&str> = runs
            .iter()
            .filter(|other| {
                run.lateness.p99 > other.lateness.p99 + 1_500
                    && run.wake_lateness.p99 <= other.wake_lateness.p99 + 1_500
            })
            .map(|other| other.peer.name())
            .collect();
        let woken_later: Vec<&str> = runs
            .iter()
            .filter(|other| run.wake_lateness.p99 > other.wake_lateness.p99 + 1_500)
            .map(|other| other.peer.name())
            .collect();
        let mut flags = String::new();
        if !slower.is_empty() {
            flags.push_str(&format!(
                "; NOTE: the task ran later than with {} though woken as promptly: the extra wait came after the timer's wake-up, for a runtime worker to take the task up (not judged: guarantee 2 is the wake-up). A wake from outside the runtime's workers, as a timer thread's, queues the task in the runtime's global queue, behind the tasks there; tokio::time's, from a worker, in that worker's own",
                slower.join(", ")
            ));
        }
        if !woken_later.is_empty() {
            flags.push_str(&format!(
                "; NOTE: the timer woke the task later (p99) than with {}: the timer's own lateness, judged for sharded-timer under 'on time' below (a loaded machine is not judged)",
                woken_later.join(", ")
            ));
        }
        flags
    }
    let failed: Vec<&str> = runs
        .iter()
        .filter(|run| {
            run.peer != Peer::Ours
                && run.failed(quiet)
                && (count(run, |t| &t.early) > 0 || !too_loaded)
        })
        .map(|run| run.peer.name())
        .collect();
    if !failed.is_empty() {
        notes.push(format!(
            "FAILED peer runs (a request timed out, a client failed, or an idle close was lost, early or of a busy connection, on a machine not too loaded to judge; sharded-timer's exit status is its own runs' alone): {}",
            failed.join(", ")
        ));
    }
    let closed = count(ours, |t| &t.quiet_closed);
    WorkloadReport {
        name: "net",
        rates: Rates {
            schedule_cancel: Some(ours.requests_per_sec),
            reset: Some(ours.requests_per_sec),
            ..Rates::default()
        },
        fired: closed,
        lateness_us: ours.wake_lateness,
        early: runs.iter().map(|run| count(run, |t| &t.early)).sum(),
        lost: quiet.saturating_sub(closed)
            + count(ours, |t| &t.timed_out)
            + count(ours, |t| &t.failed),
        duplicated: count(ours, |t| &t.busy_closed),
        bytes_per_pending: None,
        capture_bytes: 0,
        process,
        notes,
    }
}

/// One peer's round of the net workload, for `--compare --write`: the load phase's
/// rate and CPU, the idle closes' lateness, and what went wrong (each must be 0).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct NetRound {
    /// Requests answered per second during the load phase.
    pub(crate) requests_per_sec: f64,
    /// Process CPU ns (every thread) per request during the load phase.
    pub(crate) cpu_ns_per_request: f64,
    /// The idle closes' lateness after their deadline, µs.
    pub(crate) idle_close_lateness: Lateness,
    /// Requests whose timeout elapsed.
    pub(crate) timed_out: u64,
    /// Clients that failed (connect, I/O).
    pub(crate) failed: u64,
    /// Quiet connections the server never closed for idleness.
    pub(crate) lost_closes: u64,
    /// Busy connections the server closed for idleness.
    pub(crate) busy_closed: u64,
    /// Idle closes before their deadline.
    pub(crate) early: u64,
    /// Why the round gave no figures (its process failed), if it did.
    #[serde(default)]
    pub(crate) failure: Option<String>,
}

impl NetRound {
    /// Whether the round failed: any request timed out, client failed, close was
    /// lost, early or of a busy connection, or its process failed.
    pub(crate) fn failed(&self) -> bool {
        self.timed_out + self.failed + self.lost_closes + self.busy_closed + self.early > 0
            || self.failure.is_some()
    }

    /// The round of a process that failed: NaN figures, and why.
    pub(crate) fn failed_process(failure: String) -> NetRound {
        NetRound {
            requests_per_sec: f64::NAN,
            cpu_ns_per_request: f64::NAN,
            idle_close_lateness: Lateness::default(),
            timed_out: 0,
            failed: 0,
            lost_closes: 0,
            busy_closed: 0,
            early: 0,
            failure: Some(failure),
        }
    }
}

/// The net workload over `wanted` connections (fewer if the descriptor limit cannot
/// be raised that far) on sharded-timer and each peer `only` names (all when empty),
/// `rounds` times interleaved, each round in a fresh process of the driver
/// (`--cold-cell`). Returns the connections
/// used and, per peer in order (sharded-timer first), its name and every round.
pub(crate) fn rounds(
    wanted: usize,
    rounds: usize,
    only: &[String],
) -> (usize, Vec<(&'static str, Vec<NetRound>)>) {
    let connections = connections_that_fit(wanted);
    let peers: Vec<Peer> = Peer::ALL
        .into_iter()
        .filter(|&peer| {
            peer == Peer::Ours || only.is_empty() || only.iter().any(|name| peer.is_named(name))
        })
        .collect();
    let mut runs: Vec<(&'static str, Vec<NetRound>)> =
        peers.iter().map(|peer| (peer.name(), Vec::new())).collect();
    for _ in 0..rounds.max(1) {
        for (index, &peer) in peers.iter().enumerate() {
            let round = crate::modes::conditions::cold_net(peer, connections)
                .unwrap_or_else(NetRound::failed_process);
            runs[index].1.push(round);
        }
    }
    (connections, runs)
}

/// One round of the net workload on `peer` over `connections` (this process's
/// descriptor limit raised as far as it goes), for `--cold-cell`.
pub(crate) fn round(common: &Common, peer: Peer, connections: usize) -> NetRound {
    let connections = connections_that_fit(connections);
    let quiet = connections as u64 / 2;
    let run = run_peer(common, peer, connections);
    // ORDERING: Relaxed: the run has ended and its runtime is dropped.
    let count = |f: fn(&Tally) -> &AtomicU64| f(&run.tally).load(Ordering::Relaxed);
    NetRound {
        requests_per_sec: run.requests_per_sec,
        cpu_ns_per_request: run.cpu_ns_per_request,
        idle_close_lateness: run.lateness,
        timed_out: count(|t| &t.timed_out),
        failed: count(|t| &t.failed),
        lost_closes: quiet.saturating_sub(count(|t| &t.quiet_closed)),
        busy_closed: count(|t| &t.busy_closed),
        early: count(|t| &t.early),
        failure: None,
    }
}
