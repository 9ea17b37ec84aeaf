//! sharded-timer: hierarchical hashed timing wheels for programs that keep very many
//! timers.
//!
//! This first landing provides [`wheel::TimingWheel`], the single-threaded,
//! tick-driven wheel every shard will be built on (Varghese & Lauck 1987, scheme 7,
//! with per-level occupancy bitmaps).
#![cfg_attr(
    loom,
    allow(dead_code, reason = "the loom build compiles only the modelled parts")
)]

pub mod wheel;
