//! Paused time (tokio's `time::pause`, `resume`, `advance`): a thread's services on
//! [`ManualClock`]s of their own, one per tokio runtime whose clock is paused, each
//! following that runtime's paused clock.
//!
//! # Ground rules
//!
//! 1. **One pause per runtime, per thread.** A thread keeps a list of pauses, each
//!    for the tokio runtime it began in (its [`RuntimeId`]), or for none (paused
//!    outside any runtime). The *current* pause ([`current`]) is the current runtime's;
//!    else, inside a runtime whose tokio clock is paused (`start_paused` by any
//!    attribute, or tokio's own `pause`), a new one that follows it; else the one
//!    begun outside any runtime; and, outside every runtime, the latest. Inside a
//!    runtime whose clock is not paused and that has no pause of ours, time is not
//!    paused: a second runtime on a paused thread runs on real time, as tokio's does.
//! 2. **One clock with tokio's.** A pause that follows a runtime reads our clock as
//!    tokio's: every read (a poll of a sleep, an interval or a timeout, arming,
//!    resetting, `Instant::now()`) first moves ours to where tokio's paused clock
//!    stands ([`PauseShared::sync`]), but only inside that runtime: outside it tokio's
//!    `Instant::now()` is real time, so there ours moves only by [`advance`]. Our
//!    clock fires on tokio's 1 ms grid ([`ManualClock::on_grid`]): a deadline is due
//!    once the clock reaches the 1 ms tick at or after it, as tokio's wheel rounds.
//!    The grid starts where tokio's clock stood when we began to follow it if it was
//!    paused then (a runtime built paused starts on its grid), and a nanosecond
//!    before that if we paused it (its grid is then somewhere within the last
//!    millisecond, which tokio does not tell; one nanosecond puts deadlines a whole
//!    number of milliseconds from there where tokio's are, one tick on).
//! 3. **Every change of the earliest deadline reaches auto-advance.** Tokio advances
//!    its paused clock to its earliest timer when no task is runnable; ours are not
//!    tokio's timers, so a task of the crate on the runtime (the *mirror*) sleeps on
//!    tokio's clock until our earliest deadline ([`ManualClock::next_deadline`]) and
//!    moves ours to tokio's when it wakes. Arming a timer and moving one earlier in
//!    place (a `Sleep::reset`, an `Interval` re-armed) tell the mirror
//!    ([`PauseShared::armed`]) on the thread that did it.
//! 4. **A pause ends with its runtime**, as tokio's paused clock does: a task of the
//!    runtime holds a guard ([`EndsWithRuntime`]) that marks the pause ended when
//!    the runtime drops it; the thread's next lookup shuts that service down, outside
//!    every borrow (shutting down drops wakers: user values).
//! 5. **Nothing of the user's runs under a borrow of the thread's list**: lookups
//!    clone what they need and give the borrow back before they call anything.
//!
//! Checked against tokio itself: `tests/paused_time_tokio.rs` runs each program on
//! `tokio::time` first and asserts ours gives its answer; `conformance/` runs tokio's
//! own time tests, switched to this crate.

#![forbid(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::sync::{thread, Arc, Mutex};
use crate::{Callbacks, ManualClock, ShardedTimer};

/// The identity of a tokio runtime (`Handle::id`).
#[cfg(feature = "tokio")]
type RuntimeId = tokio::runtime::Id;
/// The identity of a tokio runtime (`Handle::id`); none can exist without feature
/// `tokio`.
#[cfg(not(feature = "tokio"))]
type RuntimeId = std::convert::Infallible;

/// The runtime whose context this thread is in, if any.
fn current_runtime() -> Option<RuntimeId> {
    #[cfg(feature = "tokio")]
    return tokio::runtime::Handle::try_current()
        .ok()
        .map(|handle| handle.id());
    #[cfg(not(feature = "tokio"))]
    None
}

/// tokio's grid step: its timer wheel's 1 ms tick.
const TOKIO_TICK_NS: u64 = 1_000_000;

std::thread_local! {
    /// This thread's pauses (ground rule 1), oldest first.
    static PAUSES: RefCell<Vec<Paused>> = const { RefCell::new(Vec::new()) };
    /// The last runtime this thread read the time in while its tokio clock ran: if
    /// that clock is found paused later, tokio's own `pause()` paused it off its grid.
    static SEEN_RUNNING: Cell<Option<RuntimeId>> = const { Cell::new(None) };
}

/// One pause: its service and what its mirror shares.
#[derive(Clone)]
pub(super) struct Paused {
    /// The paused service, on `shared.clock`.
    pub(super) timer: ShardedTimer,
    /// The clock and its state.
    shared: Arc<PauseShared>,
}

/// What a pause, its mirror task and its pacer share.
struct PauseShared {
    /// The paused service's clock.
    clock: ManualClock,
    /// The runtime the pause began in (`None`: outside any).
    runtime: Option<RuntimeId>,
    /// Everything that changes.
    state: Mutex<PauseState>,
}

/// How a paused clock moves.
#[derive(Clone, Copy, Debug)]
enum Pace {
    /// Only with `advance` (no tokio runtime to follow).
    Frozen,
    /// Following real time from `real` on (after [`resume`] without a runtime): the
    /// clock reads `at` plus the real time since `real`.
    Real {
        /// The real instant of the resume.
        real: std::time::Instant,
        /// The clock's instant then.
        at: std::time::Instant,
    },
    /// Following tokio's clock, paused or not: our now is `at` plus the time tokio's
    /// clock has moved since it read `tokio_at`.
    #[cfg(feature = "tokio")]
    Tokio {
        /// Tokio's instant when we began to follow it.
        tokio_at: tokio::time::Instant,
        /// Our clock's instant then.
        at: std::time::Instant,
    },
}

/// The state under [`PauseShared`]'s lock.
#[derive(Debug)]
struct PauseState {
    /// How the clock moves.
    pace: Pace,
    /// Whether time is paused now (between `pause` and `resume`).
    frozen: bool,
    /// The instant the mirror sleeps until (`None`: no timer to wait for).
    target: Option<std::time::Instant>,
    /// The mirror's waker, to make it look again.
    mirror: Option<Waker>,
    /// Set when the mirror must look again.
    look_again: bool,
    /// Set when the tokio runtime the pause began in was dropped: the pause is over,
    /// and the thread's next lookup discards it.
    ended: bool,
}

impl PauseShared {
    /// The lock (a poisoned one is taken over: every update is an assignment).
    fn lock(&self) -> crate::sync::MutexGuard<'_, PauseState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where the clock should be now, by its pace; `None` while frozen, and for a
    /// pace of tokio's outside its runtime (there tokio's clock reads real time).
    fn due_now(&self) -> Option<std::time::Instant> {
        let state = self.lock();
        match state.pace {
            Pace::Frozen => None,
            Pace::Real { real, at } => Some(at + real.elapsed()),
            #[cfg(feature = "tokio")]
            Pace::Tokio { tokio_at, at } => {
                if current_runtime() != self.runtime {
                    return None;
                }
                Some(at + tokio::time::Instant::now().saturating_duration_since(tokio_at))
            }
        }
    }

    /// Moves the clock up to where its pace says it is (never back), firing what
    /// that made due.
    fn sync(&self) {
        let Some(due) = self.due_now() else { return };
        let behind = due.saturating_duration_since(self.clock.now());
        if !behind.is_zero() {
            self.clock.advance(behind);
        }
    }

    /// A timer due at `deadline` was armed, or moved there in place: the mirror looks
    /// again if it waits for a later one (or none).
    fn armed(&self, deadline: std::time::Instant) {
        let mut state = self.lock();
        if state.target.is_some_and(|target| target <= deadline) {
            return;
        }
        state.look_again = true;
        let mirror = state.mirror.take();
        drop(state);
        if let Some(mirror) = mirror {
            mirror.wake();
        }
    }
}

impl Paused {
    /// Brings the clock up to where its pace says it is (ground rule 2).
    pub(super) fn catch_up(&self) {
        self.shared.sync();
    }
}

/// This thread's listener for timers armed or read on it (`clock::ArmedListener`):
/// it finds the current pause at each call, so one serves all of the thread's pauses.
struct ThreadPauses;

impl crate::clock::ArmedListener for ThreadPauses {
    fn catch_up(&self) {
        if let Some(paused) = current() {
            paused.shared.sync();
        }
    }

    fn armed(&self, deadline: std::time::Instant) {
        if let Some(paused) = current() {
            paused.shared.armed(deadline);
        }
    }
}

/// Ends a pause when dropped: owned by a task on the tokio runtime the pause began
/// in, which the runtime drops as it shuts down.
#[cfg(feature = "tokio")]
struct EndsWithRuntime(Arc<PauseShared>);

#[cfg(feature = "tokio")]
impl Drop for EndsWithRuntime {
    fn drop(&mut self) {
        self.0.lock().ended = true;
    }
}

/// Shuts down this thread's pauses whose runtimes were dropped (ground rule 4), and
/// stops listening for armed timers once none is left.
fn discard_ended() {
    let ended: Vec<Paused> = PAUSES.with(|pauses| {
        let Ok(mut pauses) = pauses.try_borrow_mut() else {
            return Vec::new();
        };
        if pauses.is_empty() {
            return Vec::new();
        }
        let (ended, kept) = pauses
            .drain(..)
            .partition(|paused: &Paused| paused.shared.lock().ended);
        *pauses = kept;
        ended
    });
    if ended.is_empty() {
        return;
    }
    // Outside the borrow: shutting a service down drops its pending timers' wakers.
    let none_left = PAUSES.with(|pauses| pauses.try_borrow().is_ok_and(|p| p.is_empty()));
    if none_left {
        drop(crate::clock::set_armed_hook(None));
    }
    for paused in ended {
        drop(paused.timer.shutdown());
    }
}

/// The current pause (ground rule 1), if time is paused here; a clone, the thread's
/// list given back.
pub(super) fn current() -> Option<Paused> {
    discard_ended();
    let runtime = current_runtime();
    let found = PAUSES.with(|pauses| {
        let pauses = pauses.try_borrow().ok()?;
        if let Some(own) = runtime.and_then(|runtime| {
            pauses
                .iter()
                .rev()
                .find(|paused| paused.shared.runtime == Some(runtime))
        }) {
            return Some(own.clone());
        }
        if runtime.is_some() {
            return pauses
                .iter()
                .rev()
                .find(|paused| paused.shared.runtime.is_none())
                .cloned();
        }
        pauses.last().cloned()
    });
    if found.is_some() {
        return found;
    }
    // A runtime whose tokio clock is paused, with no pause of ours yet
    // (`#[tokio::test(start_paused = true)]`): follow it.
    // Looked at on every read, not once per runtime: tokio's own `pause()` may come
    // later (a partly switched code base), and three clock reads are cheap beside a
    // timer (feature `tokio` only).
    let runtime = runtime?;
    if !tokio_clock_is_paused() {
        SEEN_RUNNING.with(|seen| seen.set(Some(runtime)));
        return None;
    }
    // Paused since this thread saw it run (tokio's own `pause()`): off its grid.
    let off_grid = SEEN_RUNNING.with(|seen| seen.get() == Some(runtime));
    Some(begin(
        Some(runtime),
        if off_grid {
            Start::PausedOffGrid
        } else {
            Start::Paused
        },
    ))
}

/// How tokio's clock stands when a pause begins in a runtime (ground rule 2).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Start {
    /// Running: we pause it, off its grid.
    Running,
    /// Paused already, on its grid as far as we know (built paused, or paused before
    /// this thread read the time in it).
    Paused,
    /// Paused already, by tokio's own `pause()` after this thread saw it run: off
    /// its grid.
    PausedOffGrid,
}

/// Whether the current runtime's tokio clock is paused: two reads of it, the system
/// clock moving in between, agree only if it is (a paused clock moves only when its
/// runtime's driver parks, which cannot happen between two reads on this thread).
fn tokio_clock_is_paused() -> bool {
    #[cfg(feature = "tokio")]
    {
        let first = tokio::time::Instant::now();
        let real = std::time::Instant::now();
        while std::time::Instant::now() == real {
            std::hint::spin_loop();
        }
        first == tokio::time::Instant::now()
    }
    #[cfg(not(feature = "tokio"))]
    false
}

/// Begins a pause in `runtime` (or outside any): a service of its own on a clock of
/// its own, following tokio's paused clock inside a runtime (which `start` says how
/// it stands; this pauses it if it runs), frozen outside one.
#[track_caller]
fn begin(runtime: Option<RuntimeId>, start: Start) -> Paused {
    let follows = cfg!(feature = "tokio") && runtime.is_some();
    // Inside a runtime, ours starts where tokio's paused clock stands, so that the
    // instants of the two agree (ground rule 2), on tokio's grid; outside one, at
    // the system clock's now, with no grid (`advance` fires every deadline it
    // reaches to the nanosecond).
    #[cfg(feature = "tokio")]
    let at = if follows {
        if start == Start::Running {
            // Panics, as ours should, on a runtime that is not current-thread.
            tokio::time::pause();
        }
        tokio::time::Instant::now().into_std()
    } else {
        std::time::Instant::now()
    };
    #[cfg(not(feature = "tokio"))]
    let at = std::time::Instant::now();
    // A clock paused while it ran lies past its grid: 1 ns, by assumption (ground
    // rule 2); our grid starts there, and our clock 1 ns on, where tokio's stands.
    let off_grid = follows && start != Start::Paused;
    let past_the_grid = Duration::from_nanos(u64::from(off_grid));
    let grid_start = at.checked_sub(past_the_grid).unwrap_or(at);
    let clock = ManualClock::on_grid(grid_start, if follows { TOKIO_TICK_NS } else { 0 });
    clock.advance(at.saturating_duration_since(grid_start));
    let timer = match ShardedTimer::builder()
        .clock(clock.clone())
        .shards(1)
        .pin_cores(false)
        .callbacks(Callbacks::inline())
        .thread_name("paused")
        .build()
    {
        Ok(timer) => timer,
        Err(error) => panic!("sharded-timer could not start a paused service: {error}"),
    };
    let shared = Arc::new(PauseShared {
        state: Mutex::new(PauseState {
            pace: Pace::Frozen,
            frozen: true,
            target: None,
            mirror: None,
            look_again: false,
            ended: false,
        }),
        runtime,
        clock,
    });
    #[cfg(feature = "tokio")]
    if follows {
        follow_tokio(&shared);
    }
    let paused = Paused { timer, shared };
    let first = PAUSES.with(|pauses| {
        let mut pauses = pauses.borrow_mut();
        pauses.push(paused.clone());
        pauses.len() == 1
    });
    if first {
        // Sleeps armed and read on this thread tell the current pause (through
        // `clock`, which the futures may import).
        drop(crate::clock::set_armed_hook(Some(std::rc::Rc::new(
            ThreadPauses,
        ))));
    }
    paused
}

/// Pauses time on this thread (tokio's `time::pause`): from now on the
/// [`time`](crate::time) functions and [`Instant::now`](super::Instant::now) here use
/// a service of their own, on a [`ManualClock`] of its own, that moves only when told
/// to: by [`advance`], and, inside a current-thread tokio runtime (feature `tokio`),
/// by auto-advance: when the runtime has no task to run, the clock jumps to the next
/// timer. Each thread pauses its own clock, so tests running in parallel in one
/// binary never share one. Inside a tokio runtime, it pauses tokio's clock too, and
/// ours then *is* tokio's: every read of ours first catches up with it, and our
/// timers fire on its 1 ms grid, as its own do (see the [module](crate::time) docs).
///
/// A pause begun inside a runtime belongs to that runtime, as tokio's paused clock
/// does: while another runtime runs on the thread, that one's time is real (or its
/// own paused clock, if it was built paused); outside every runtime, the clock stands
/// still unless [`advance`]d; once the runtime is dropped, the paused service is shut
/// down (futures still made on it complete at once) and a later `pause` starts
/// afresh. Paused outside any runtime (or without the feature), it lasts until the
/// thread ends. [`resume`] lets its clock follow real time again. Futures made before
/// the pause keep the service they were made on.
///
/// # Panics
///
/// If time is already paused here (as tokio's: a runtime built with `start_paused`
/// is paused already); inside a tokio runtime that is not current-thread (as
/// tokio's) or has no timers (`enable_time`; feature `tokio`); if the paused
/// service's thread cannot start.
#[track_caller]
pub fn pause() {
    let runtime = current_runtime();
    let own = current().filter(|paused| paused.shared.runtime == runtime);
    let Some(paused) = own else {
        begin(runtime, Start::Running);
        return;
    };
    let shared = paused.shared;
    assert!(!shared.lock().frozen, "time is already frozen");
    // Paused again: the clock stops where it stands (a real pace stops; tokio's
    // clock stops with tokio's pause).
    shared.sync();
    let mut state = shared.lock();
    state.frozen = true;
    #[cfg(feature = "tokio")]
    if matches!(state.pace, Pace::Tokio { .. }) {
        drop(state);
        tokio::time::pause();
        return;
    }
    state.pace = Pace::Frozen;
}

/// Inside a tokio runtime with timers enabled, its clock paused: makes ours follow
/// it, and spawns the mirror and the guard that ends the pause with the runtime.
#[cfg(feature = "tokio")]
#[track_caller]
fn follow_tokio(shared: &Arc<PauseShared>) {
    // A runtime without timers (no `enable_time`) cannot host the mirror, and a
    // paused test on it would hang at its first sleep: say so at once instead.
    let timers = std::panic::catch_unwind(|| drop(tokio::time::sleep(Duration::ZERO))).is_ok();
    assert!(
        timers,
        "paused time needs a tokio runtime with timers enabled (`enable_time`)"
    );
    shared.lock().pace = Pace::Tokio {
        tokio_at: tokio::time::Instant::now(),
        at: shared.clock.now(),
    };
    drop(tokio::spawn(mirror(shared.clone())));
    // The pause belongs to this runtime (ground rule 4): a task that never completes
    // holds the guard, and the runtime drops it as it shuts down.
    let ends = EndsWithRuntime(shared.clone());
    drop(tokio::spawn(async move {
        let _ends = ends;
        std::future::pending::<()>().await;
    }));
}

/// Resumes time on this thread (tokio's `time::resume`): the paused service stays
/// this thread's, and its clock follows real time again from where it stands (never
/// back): inside a tokio runtime, tokio's resumed clock, which ours follows; without
/// one, the system clock, followed by a thread of the crate that moves ours about
/// every millisecond (a timer due then fires within about a millisecond).
///
/// # Panics
///
/// If time is not paused here (as tokio's).
#[track_caller]
pub fn resume() {
    let shared = frozen();
    let mut state = shared.lock();
    state.frozen = false;
    match state.pace {
        #[cfg(feature = "tokio")]
        Pace::Tokio { .. } => {
            drop(state);
            tokio::time::resume();
        }
        _ => {
            state.pace = Pace::Real {
                real: std::time::Instant::now(),
                at: shared.clock.now(),
            };
            drop(state);
            start_pacer(&shared);
        }
    }
}

/// Starts a thread that moves a resumed clock along with real time, about every
/// millisecond, until time is paused again or the pause is gone.
fn start_pacer(shared: &Arc<PauseShared>) {
    let shared = Arc::downgrade(shared);
    let started = thread::Builder::new()
        .name("paused-pacer".to_owned())
        .spawn(move || loop {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            if shared.lock().frozen {
                return;
            }
            shared.sync();
            drop(shared);
            thread::park_timeout(Duration::from_millis(1));
        });
    if let Err(error) = started {
        panic!("sharded-timer could not start the resumed clock's thread: {error}");
    }
}

/// Moves this thread's paused time forward by `duration` and fires what that made due
/// (tokio's `time::advance`). Inside a tokio runtime, tokio's clock moves by as much,
/// and ours with it, as tokio's does: it yields once, and returns with the tasks its
/// timers woke scheduled to run after the caller's task (not yet run); a timer fires
/// once the clock reaches the 1 ms tick at or after its deadline (a 1.5 ms sleep
/// completes when `advance` reaches 2 ms). Outside every runtime it fires each timer
/// once the clock reaches its deadline, to the nanosecond, and yields once, so that
/// the tasks it woke run before it returns.
///
/// # Panics
///
/// If time is not paused here (as tokio's).
pub async fn advance(duration: Duration) {
    let shared = frozen();
    #[cfg(feature = "tokio")]
    if matches!(shared.lock().pace, Pace::Tokio { .. }) && current_runtime() == shared.runtime {
        // Tokio's `advance` yields once, after its driver fired what came due; ours
        // fire at the sync, and wake their tasks to run after this one, as tokio's
        // do: no second yield (tasks woken by our timers ran before `advance`
        // returned, where tokio's had not).
        tokio::time::advance(duration).await;
        shared.sync();
        return;
    }
    shared.clock.advance(duration);
    YieldNow(false).await;
}

/// The current pause, frozen (`resume` and `advance` need it so).
///
/// # Panics
///
/// If time is not paused here (as tokio's).
#[track_caller]
fn frozen() -> Arc<PauseShared> {
    let paused = current().filter(|paused| paused.shared.lock().frozen);
    let Some(paused) = paused else {
        panic!("time is not frozen");
    };
    paused.shared
}

/// Completes at its second poll, waking its task at the first: the task goes to the
/// back of its executor's queue.
struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The mirror: a task on the paused runtime that sleeps on tokio's clock until our
/// clock's earliest timer, then moves ours to tokio's, for ever (it ends with the
/// runtime). Tokio's auto-advance moves tokio's clock to the mirror's sleep only when
/// no task is runnable; arming an earlier timer wakes the mirror, which then sleeps
/// until that one.
#[cfg(feature = "tokio")]
async fn mirror(shared: Arc<PauseShared>) {
    loop {
        shared.sync();
        // On tokio's grid, our earliest work is due at a grid point; tokio rounds the
        // mirror's sleep up to its own tick, so the mirror sleeps until the first
        // instant of that grid step, which tokio rounds up to the same tick.
        // Never at or before our now, though: a sleep tokio fires at once would make
        // this loop spin without tokio's clock moving (our far future, saturated, lies
        // off the grid, short of its step's end).
        let step = shared.clock.time().grid_ns().unwrap_or(1);
        let now = shared.clock.now();
        let next = shared.clock.next_deadline().map(|due| {
            let first = due
                .checked_sub(Duration::from_nanos(step - 1))
                .unwrap_or(due);
            first.max(now + Duration::from_nanos(1))
        });
        let mut sleep = {
            let mut state = shared.lock();
            state.look_again = false;
            state.target = next;
            let Pace::Tokio { tokio_at, at } = state.pace else {
                return;
            };
            // Tokio's instant of our `next`; none past tokio's range (never due).
            next.and_then(|next| {
                tokio_at
                    .checked_add(next.saturating_duration_since(at))
                    .map(tokio::time::sleep_until)
            })
            .map(Box::pin)
        };
        std::future::poll_fn(|cx| {
            let mut state = shared.lock();
            if state.look_again {
                return Poll::Ready(());
            }
            state.mirror = Some(cx.waker().clone());
            drop(state);
            match sleep.as_mut() {
                Some(sleep) => sleep.as_mut().poll(cx),
                None => Poll::Pending,
            }
        })
        .await;
    }
}

/// The attribute macros' runtime hook (feature `tokio`): not for users. With
/// `start_paused`, the runtime was built paused: ours follows it from the start.
#[cfg(feature = "tokio")]
#[doc(hidden)]
pub fn __pause_if(start_paused: bool) {
    if start_paused && current().is_none() {
        begin(current_runtime(), Start::Paused);
    }
}
