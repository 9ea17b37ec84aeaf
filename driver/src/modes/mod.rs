//! The modes beside the workloads: `--compare` (sharded-timer beside its peers),
//! its async section (`timeouts`: tokio's, pingora's and ours inside tokio tasks),
//! `--sweep` (scaling with producer threads), `--soak` (flat memory over a long run),
//! `conditions` (`--compare`'s cold, unpinned and busy cells, each in a fresh
//! process), `--plot`, which draws the three, `--write` (`benchmarks`: a whole `--compare` run as
//! the Markdown of `docs/benchmarks.md`), and `chaos` (random operations from many
//! threads, checked).

pub(crate) mod benchmarks;
pub(crate) mod chaos;
pub(crate) mod compare;
pub(crate) mod conditions;
pub(crate) mod plot;
pub(crate) mod soak;
pub(crate) mod sweep;
pub(crate) mod timeouts;
