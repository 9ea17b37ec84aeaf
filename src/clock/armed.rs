//! Who hears that a sleep's timer was armed, per thread: paused time (`time.rs`)
//! listens here, so that `future.rs` can tell it without importing it (which would
//! make a cycle: `time` re-exports the futures).

#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

/// What hears of an armed timer: its deadline.
pub(crate) type ArmedHook = Rc<dyn Fn(Instant)>;

std::thread_local! {
    /// This thread's listener, if any.
    static ARMED_HOOK: RefCell<Option<ArmedHook>> = const { RefCell::new(None) };
}

/// Makes `hook` this thread's listener (or none), returning the previous one.
pub(crate) fn set_armed_hook(hook: Option<ArmedHook>) -> Option<ArmedHook> {
    ARMED_HOOK.with(|current| current.replace(hook))
}

/// Tells this thread's listener, if any, that a timer due at `deadline` was armed.
/// The listener runs after the thread-local's borrow is given back, so it may set a
/// new listener itself.
pub(crate) fn note_armed(deadline: Instant) {
    let hook = ARMED_HOOK.with(|current| current.try_borrow().ok().and_then(|hook| hook.clone()));
    if let Some(hook) = hook {
        hook(deadline);
    }
}
