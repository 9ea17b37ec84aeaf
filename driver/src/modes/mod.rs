//! The modes beside the workloads: `--compare` (sharded-timer beside its peers),
//! `--sweep` (scaling with producer threads), `--soak` (flat memory over a long run),
//! and `--plot`, which draws the three.

pub(crate) mod compare;
pub(crate) mod plot;
pub(crate) mod soak;
pub(crate) mod sweep;
