//! The timing wheel alone (no threads, no clock): cost per operation as the number of
//! resident entries grows, and memory per resident entry.
//!
//! Measured, at 1e3, 1e6 and 1e7 entries resident with deadlines uniform over
//! 1 ms..1 h at a 1 ms tick (1..3,600,000 ticks), `T = u64`:
//! - `insert_remove`: one insert at a random deadline plus the remove of that key;
//! - `insert_expire`: steady state of a shard: advance the wheel, expire what is due,
//!   and insert as many new entries as expired, so residency stays constant. Time per
//!   expired entry, which includes its insert and every cascade it went through.
//!
//! Not measured: allocation of the user's value, threads, the clock. Memory is counted
//! exactly by a counting global allocator and printed before the timings, as bytes per
//! resident entry including and excluding `size_of::<T>()`.
//!
//! Run: `cargo bench -p sharded-timer-benches --bench wheel`.

#![allow(
    missing_docs,
    reason = "criterion_group! and criterion_main! generate undocumented items"
)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sharded_timer::wheel::TimingWheel;

use sharded_timer_peers::alloc;

#[global_allocator]
static GLOBAL: alloc::CountingAllocator = alloc::CountingAllocator;

/// One hour at a 1 ms tick.
const HORIZON_TICKS: u64 = 3_600_000;
const SIZES: [usize; 3] = [1_000, 1_000_000, 10_000_000];

/// xorshift64*: deterministic deadlines without a dependency in the timed loop.
struct Rng(u64);

impl Rng {
    fn delay(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        1 + self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % HORIZON_TICKS
    }
}

fn filled(resident: usize, rng: &mut Rng) -> TimingWheel<u64> {
    let mut wheel = TimingWheel::new(0);
    for i in 0..resident {
        wheel.insert(rng.delay(), i as u64);
    }
    wheel
}

fn report_memory() {
    for resident in SIZES {
        let before = alloc::allocated();
        let wheel = filled(resident, &mut Rng(7));
        let bytes = alloc::allocated() - before;
        let per_entry = bytes as f64 / resident as f64;
        let nodes = wheel.capacity() as f64 / resident as f64;
        println!(
            "wheel memory, {resident:>8} resident, grown: {per_entry:5.1} B/entry with T = u64, \
             {:5.1} B/entry excluding T ({nodes:.2} slab nodes per entry)",
            per_entry - 8.0 * nodes
        );
        drop(black_box(wheel));
        let before = alloc::allocated();
        let mut wheel = TimingWheel::with_capacity(0, resident);
        let mut rng = Rng(7);
        for i in 0..resident {
            wheel.insert(rng.delay(), i as u64);
        }
        let per_entry = (alloc::allocated() - before) as f64 / resident as f64;
        println!(
            "wheel memory, {resident:>8} resident, with_capacity: {per_entry:5.1} B/entry with T = u64, \
             {:5.1} B/entry excluding T",
            per_entry - 8.0
        );
        drop(black_box(wheel));
    }
}

fn insert_remove(c: &mut Criterion) {
    report_memory();
    let mut group = c.benchmark_group("wheel/insert_remove");
    group.throughput(Throughput::Elements(1));
    for resident in SIZES {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut wheel = filled(resident, &mut rng);
        group.bench_with_input(BenchmarkId::from_parameter(resident), &resident, |b, _| {
            b.iter(|| {
                let key = wheel.insert(rng.delay(), 1);
                black_box(wheel.remove(black_box(key)))
            });
        });
    }
    group.finish();
}

fn insert_expire(c: &mut Criterion) {
    let mut group = c.benchmark_group("wheel/insert_expire");
    group.throughput(Throughput::Elements(1));
    for resident in SIZES {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mut wheel = filled(resident, &mut rng);
        // Advance far enough per step that about 64 entries come due.
        let step = (HORIZON_TICKS * 64 / resident as u64).max(1);
        group.bench_with_input(BenchmarkId::from_parameter(resident), &resident, |b, _| {
            b.iter_custom(|iters| {
                let mut expired_total = 0u64;
                let start = Instant::now();
                while expired_total < iters {
                    let mut expired = 0u64;
                    let now = wheel.now() + step;
                    wheel.advance(now, &mut |deadline, value| {
                        black_box((deadline, value));
                        expired += 1;
                    });
                    for _ in 0..expired {
                        wheel.insert(now + rng.delay(), 0);
                    }
                    expired_total += expired;
                }
                // Scale to exactly `iters` operations.
                start.elapsed().mul_f64(iters as f64 / expired_total as f64)
            });
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = insert_remove, insert_expire
}
criterion_main!(benches);
