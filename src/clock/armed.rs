//! Who hears of a sleep's timer being armed, per thread: paused time (`time.rs`)
//! listens here, so that `future.rs` can tell it without importing it (which would
//! make a cycle: `time` re-exports the futures).

#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

/// What listens on a paused thread: its paused time.
pub(crate) trait ArmedListener {
    /// A timer of a manual-clock service is about to be armed on this thread: bring
    /// the clock up to where its pace says it is (tokio's paused clock may have
    /// moved since this thread last looked), so that a deadline tokio's clock has
    /// passed is judged past now, as tokio's own timers judge it.
    fn catch_up(&self);
    /// A timer due at `deadline` was armed.
    fn armed(&self, deadline: Instant);
}

/// This thread's listener.
pub(crate) type ArmedHook = Rc<dyn ArmedListener>;

std::thread_local! {
    /// This thread's listener, if any.
    static ARMED_HOOK: RefCell<Option<ArmedHook>> = const { RefCell::new(None) };
}

/// Makes `hook` this thread's listener (or none), returning the previous one.
pub(crate) fn set_armed_hook(hook: Option<ArmedHook>) -> Option<ArmedHook> {
    ARMED_HOOK.with(|current| current.replace(hook))
}

/// This thread's listener, the thread-local's borrow given back (so that the listener
/// may set a new one itself).
fn listener() -> Option<ArmedHook> {
    ARMED_HOOK.with(|current| current.try_borrow().ok().and_then(|hook| hook.clone()))
}

/// Tells this thread's listener, if any, that a timer due at `deadline` was armed.
pub(crate) fn note_armed(deadline: Instant) {
    if let Some(hook) = listener() {
        hook.armed(deadline);
    }
}

/// Asks this thread's listener, if any, to bring its clock up to date before a timer
/// of a manual-clock service is armed ([`ArmedListener::catch_up`]).
pub(crate) fn catch_up_before_arming() {
    if let Some(hook) = listener() {
        hook.catch_up();
    }
}
