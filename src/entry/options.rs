//! What an entry keeps of its service for its handles: [`HandleOptions`] (the
//! pending bound a winning cancel frees, the manual clock a handle reads), only on a
//! service configured with either, so that a `TimerHandle` is 16 bytes (its entry and
//! its shard's port) and a default service's entries keep nothing.

#![forbid(unsafe_code)]

use crate::clock::ManualTime;
use crate::limit::PendingLimit;
use crate::sync::Arc;

/// What a handle needs of a service configured away from the defaults: the pending
/// bound that a winning cancel frees, and the manual clock it reads the time from.
/// Kept in each of the service's entries ([`KeptOptions`]); a default service has
/// none, and its entries keep nothing.
#[derive(Debug)]
pub struct HandleOptions {
    /// The service's pending bound.
    pub(crate) limit: Option<Arc<PendingLimit>>,
    /// The service's manual clock.
    pub(crate) time: Option<Arc<ManualTime>>,
}

impl HandleOptions {
    /// The options of a service, or `None` if it has none to honour.
    pub(crate) fn of(
        limit: Option<Arc<PendingLimit>>,
        time: Option<Arc<ManualTime>>,
    ) -> Option<Arc<HandleOptions>> {
        (limit.is_some() || time.is_some()).then(|| Arc::new(HandleOptions { limit, time }))
    }
}

/// What an entry keeps of its service for its handles, after its header: nothing
/// (`()`) on a service with the default options, or the options a handle honours (the
/// pending bound a winning cancel frees, the manual clock it reads) on one built with
/// `max_pending` or a `ManualClock`. Kept in the entry, which every handle keeps alive,
/// so that a handle is 16 bytes and a default service's entries pay nothing for them.
pub(super) trait KeptOptions: Send + Sync + 'static {
    /// Whether this type is `Arc<HandleOptions>` (the vtable's `options`).
    const PRESENT: bool;
}

impl KeptOptions for () {
    const PRESENT: bool = false;
}

impl KeptOptions for Arc<HandleOptions> {
    const PRESENT: bool = true;
}
