//! Criterion benches of sharded-timer beside its peers: see `benches/` here, and the
//! repository's README for the commands (`cargo bench -p sharded-timer-benches`).
