//! A bounded lock-free multi-producer single-consumer ring: each shard's insert ring
//! and message ring (cancel and move messages).
//!
//! # Algorithm
//!
//! Dmitry Vyukov's bounded MPMC queue ("Bounded MPMC queue", 1024cores.net), reduced
//! to one consumer: every slot carries a *stamp* saying which lap may use it next.
//! Producers reserve a position by CAS on `tail` and publish the value by storing the
//! slot's stamp; the single consumer reads the stamp, takes the value and frees the
//! slot for the next lap by advancing its stamp by the capacity. Positions are `usize`
//! counters that are never reduced modulo anything but the capacity, so a stamp names
//! its lap and a stale CAS cannot succeed (no ABA short of 2^63 pushes).
//!
//! The ring can be *closed* (bit 0 of `tail`): after [`Ring::close`] every push fails
//! with [`Reserve::Closed`], atomically with respect to reservations, and the
//! consumer can drain exactly what was reserved before.
//!
//! # Ground rules
//!
//! - Any thread may [`push`](Ring::push). Only the holder of the ring's [`Cursor`]
//!   (one per ring, made by [`Ring::new`]) may pop; the cursor holds the head.
//! - A slot's value is written only by the producer whose CAS reserved its position
//!   (while the stamp says "free for this lap"), and read only by the consumer after
//!   the stamp says "published for this lap".

use core::mem::MaybeUninit;

use crate::sync::{spin_loop, AtomicUsize, Backoff, CachePadded, Ordering, UnsafeCell};

/// Bit 0 of `tail`: the ring is closed.
const CLOSED: usize = 1;
/// Positions are stored in `tail` shifted left by one, above the `CLOSED` bit.
const POSITION_SHIFT: u32 = 1;

/// One slot of the ring. (Padding slots to a cache line each was measured and did
/// not help: the tail CAS, not slot sharing, dominates producer contention.)
struct Slot<T> {
    /// `position` when free for the producer of `position`; `position + 1` when that
    /// producer has published; `position + capacity` when the consumer freed it for
    /// the next lap. Written by the reserving producer (Release) and the consumer
    /// (Release); read by both (Acquire).
    stamp: AtomicUsize,
    /// The value; initialised between publish and pop (ground rules).
    value: UnsafeCell<MaybeUninit<T>>,
}

/// A bounded MPSC ring of `T`.
pub struct Ring<T> {
    /// `(next position to reserve << 1) | CLOSED`. Written by producers' CAS and by
    /// `close`; read by producers and by the consumer to see reservations.
    tail: CachePadded<AtomicUsize>,
    /// The slots; `capacity` is a power of two.
    slots: Box<[Slot<T>]>,
    /// `capacity - 1`.
    mask: usize,
}

/// The consumer's token and head position; exactly one per ring.
#[derive(Debug)]
pub struct Cursor {
    /// Next position to pop.
    head: usize,
    /// The brand of the ring this cursor belongs to: the address of its slots'
    /// allocation, which moves with the ring (checked by every `pop`).
    ring: usize,
}

impl Cursor {
    /// How many values this cursor has popped, wrapping: a consumer that reads it
    /// twice learns whether it took anything in between.
    pub fn popped(&self) -> usize {
        self.head
    }
}

/// Why a reservation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserve {
    /// Every slot holds an unconsumed value.
    Full,
    /// The ring was closed.
    Closed,
}

use Reserve::{Closed, Full};

/// A reserved position of a [`Ring`], to be published exactly once. Dropping it
/// unpublished would leave the consumer waiting at this position for ever, so
/// [`publish`](Self::publish) is the only way to let it go (and nothing between
/// [`Ring::reserve`] and `publish` may panic in its users).
#[must_use = "a reservation must be published, or the consumer waits for it for ever"]
pub struct Reservation<'a, T> {
    /// The reserved slot.
    slot: &'a Slot<T>,
    /// The reserved position.
    position: usize,
}

impl<T> Reservation<'_, T> {
    /// The reserved position (positions count reservations).
    pub fn position(&self) -> usize {
        self.position
    }

    /// Writes `value` and publishes it to the consumer. The last access to the ring:
    /// once the stamp is stored the consumer may pop the value, and the ring's owner
    /// may go away.
    pub fn publish(self, value: T) {
        // SAFETY: our CAS in `reserve` reserved `position` while the stamp said the
        // slot is free for it, so we are its only writer until we publish (ground
        // rules); the consumer does not read it yet.
        self.slot
            .value
            .with_mut(|cell| unsafe { (*cell).write(value) });
        // ORDERING: Release pairs with the consumer's Acquire load of the stamp in
        // `pop`: the value write happens-before its read.
        self.slot
            .stamp
            .store(self.position.wrapping_add(1), Ordering::Release);
    }
}

impl<T> core::fmt::Debug for Reservation<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Reservation")
            .field("position", &self.position)
            .finish()
    }
}

/// Why a push failed; the value comes back.
#[cfg(any(test, loom))]
#[derive(Debug, PartialEq, Eq)]
pub enum PushError<T> {
    /// Every slot holds an unconsumed value.
    Full(T),
    /// The ring was closed.
    Closed(T),
}

impl<T> Ring<T> {
    /// A ring of `capacity` slots (a power of two, at least 2) and its one cursor.
    ///
    /// # Panics
    ///
    /// If `capacity` is not a power of two of at least 2 (the builder checks first).
    pub fn new(capacity: usize) -> (Self, CursorSeed) {
        assert!(
            capacity >= 2 && capacity.is_power_of_two(),
            "ring capacity invariant: a power of two >= 2, got {capacity}"
        );
        let slots = (0..capacity)
            .map(|position| Slot {
                stamp: AtomicUsize::new(position),
                value: UnsafeCell::new(MaybeUninit::uninit()),
            })
            .collect();
        let ring = Ring {
            tail: CachePadded::new(AtomicUsize::new(0)),
            slots,
            mask: capacity - 1,
        };
        let brand = ring.brand();
        (ring, CursorSeed(brand))
    }

    /// What ties a seed and a cursor to this ring: the address of its slots'
    /// allocation, unique while the ring lives and unchanged when the ring moves.
    fn brand(&self) -> usize {
        self.slots.as_ptr() as usize
    }

    /// The number of slots.
    pub fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Pushes `value`; returns the position it was given (positions count pushes). The
    /// service reserves and publishes separately (see [`reserve`](Self::reserve)); this
    /// is the tests' and models' shorthand.
    ///
    /// # Errors
    ///
    /// [`PushError::Full`] if every slot holds an unconsumed value, and
    /// [`PushError::Closed`] after [`close`](Ring::close); the value comes back.
    #[cfg(any(test, loom))]
    pub fn push(&self, value: T) -> Result<usize, PushError<T>> {
        match self.reserve() {
            Ok(reservation) => {
                let position = reservation.position();
                reservation.publish(value);
                Ok(position)
            }
            Err(Full) => Err(PushError::Full(value)),
            Err(Closed) => Err(PushError::Closed(value)),
        }
    }

    /// Reserves the next position, to be filled by [`Reservation::publish`]. Between
    /// the two the consumer sees the position as pending ([`has_pending`](Self::has_pending))
    /// but cannot pop it, so a producer can act on the ring's owner (wake it) while the
    /// owner still waits for its value, and touch nothing after publishing.
    ///
    /// # Errors
    ///
    /// [`Reserve::Full`] if every slot holds an unconsumed value, [`Reserve::Closed`]
    /// after [`close`](Ring::close).
    pub fn reserve(&self) -> Result<Reservation<'_, T>, Reserve> {
        // ORDERING: Relaxed: the tail is only a guess here; the stamp check and the
        // CAS below validate it.
        let mut tail = self.tail.load(Ordering::Relaxed);
        loop {
            if tail & CLOSED != 0 {
                return Err(Closed);
            }
            let position = tail >> POSITION_SHIFT;
            let slot = &self.slots[position & self.mask];
            // ORDERING: Acquire pairs with the consumer's Release store of the stamp in
            // `pop`: its read of the previous lap's value happens-before our write.
            let stamp = slot.stamp.load(Ordering::Acquire);
            let lag = stamp.wrapping_sub(position) as isize;
            if lag == 0 {
                // ORDERING: success Relaxed, as in Vyukov's queue: the reservation
                // publishes nothing (the value is published by the stamp's Release
                // store in `publish`, and the previous lap's read was ordered by the
                // Acquire stamp load above); the RMW alone makes reservations unique.
                // The park handshake in `shard.rs` orders this store against the shard
                // with a SeqCst fence after `reserve` returns. Failure Relaxed: we
                // retry.
                match self.tail.compare_exchange_weak(
                    tail,
                    tail + (1 << POSITION_SHIFT),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Ok(Reservation { slot, position }),
                    Err(actual) => tail = actual,
                }
            } else if lag < 0 {
                // The slot still holds the value of the previous lap: full, unless
                // the tail moved on meanwhile.
                // ORDERING: Relaxed: a re-check of the guess, validated as above.
                let fresh = self.tail.load(Ordering::Relaxed);
                if fresh == tail {
                    return Err(Full);
                }
                tail = fresh;
            } else {
                // Another producer reserved this position first; take the new tail.
                spin_loop();
                // ORDERING: Relaxed: a fresh guess, validated as above.
                tail = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Closes the ring: every later push fails with [`PushError::Closed`]. Returns the
    /// number of positions reserved before the close, so the consumer can drain
    /// exactly those. Idempotent.
    pub fn close(&self) -> usize {
        // ORDERING: Relaxed: the RMW alone makes close atomic with respect to every
        // reservation (each CAS expects the bit clear); the values reserved before it
        // are then read through their stamps (Acquire) in `drain_closed`.
        self.tail.fetch_or(CLOSED, Ordering::Relaxed) >> POSITION_SHIFT
    }

    /// Pops the oldest published value, or `None` if the next position is not yet
    /// published (empty, or reserved by a producer that has not written yet).
    ///
    /// # Panics
    ///
    /// If `cursor` was made for another ring (reading that ring's slots would be
    /// undefined behaviour).
    pub fn pop(&self, cursor: &mut Cursor) -> Option<T> {
        // One comparison per pop: a cursor used on another ring would read slots that
        // ring's consumer also reads, which is undefined behaviour, so this is checked
        // in release builds too.
        assert_eq!(
            cursor.ring,
            self.brand(),
            "ring invariant: a cursor pops only the ring it was made for"
        );
        let position = cursor.head;
        let slot = &self.slots[position & self.mask];
        // ORDERING: Acquire pairs with the producer's Release store of the stamp in
        // `push`: its value write happens-before our read.
        let stamp = slot.stamp.load(Ordering::Acquire);
        if stamp != position.wrapping_add(1) {
            return None;
        }
        // SAFETY: the stamp says the producer of `position` published, and we hold the
        // ring's only cursor, so the value is initialised and read exactly once.
        let value = slot.value.with(|cell| unsafe { cell.cast::<T>().read() });
        // ORDERING: Release pairs with the producers' Acquire load of the stamp in
        // `push`: our read happens-before the next lap's write.
        slot.stamp
            .store(position.wrapping_add(self.capacity()), Ordering::Release);
        cursor.head = position.wrapping_add(1);
        Some(value)
    }

    /// Whether any position has been reserved that the cursor has not popped: a value
    /// is published or about to be. The load half of the park handshake.
    pub fn has_pending(&self, cursor: &Cursor) -> bool {
        // ORDERING: Relaxed: the caller orders this load after its own store with a
        // SeqCst fence (`ShardShared::prepare_park`), which pairs with the producer's
        // fence after its reservation; see the ground rules of `shard.rs`.
        (self.tail.load(Ordering::Relaxed) >> POSITION_SHIFT) != cursor.head
    }

    /// How many positions have been reserved beyond the first `taken` (the count the
    /// consumer has popped, kept by it): values waiting, or about to be published. A
    /// statistic: the tail may move at any moment.
    pub fn reserved_since(&self, taken: u64) -> u64 {
        // ORDERING: Relaxed: a statistic; no value is read through it.
        let reserved = (self.tail.load(Ordering::Relaxed) >> POSITION_SHIFT) as u64;
        // Positions wrap at 2^63 (one bit holds CLOSED).
        reserved.wrapping_sub(taken) & (u64::MAX >> POSITION_SHIFT)
    }

    /// After [`close`](Ring::close) returned `reserved`, pops every value reserved
    /// before the close, waiting for producers that reserved but have not yet written.
    ///
    /// Waits by spinning, then yielding, then sleeping 20 µs at a time: a producer
    /// between its reservation and its write may be a thread preempted on the
    /// consumer's own core, which a spin would keep from running until the kernel's
    /// next scheduler tick, and a yield may not hand over (the scheduler may pick the
    /// consumer again); a sleep does.
    pub fn drain_closed(&self, cursor: &mut Cursor, reserved: usize, each: &mut impl FnMut(T)) {
        let backoff = Backoff::new();
        while cursor.head != reserved {
            match self.pop(cursor) {
                Some(value) => {
                    backoff.reset();
                    each(value);
                }
                None if !backoff.is_completed() => backoff.snooze(),
                None => {
                    // Under loom a backoff completes at once; yielding to the model
                    // is the wait there.
                    #[cfg(not(loom))]
                    std::thread::sleep(std::time::Duration::from_micros(20));
                    #[cfg(loom)]
                    spin_loop();
                }
            }
        }
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // `&mut self`: no producer or consumer remains, so every reserved position was
        // published. A slot holds an unconsumed value iff its stamp is one past a
        // position of its own index (`index + 1` modulo the capacity); a free slot's
        // stamp is its own index modulo the capacity, and capacity >= 2 tells them apart.
        for (index, slot) in self.slots.iter().enumerate() {
            // ORDERING: Relaxed: exclusive access, nothing to synchronise with.
            let stamp = slot.stamp.load(Ordering::Relaxed);
            if stamp & self.mask == (index + 1) & self.mask {
                // SAFETY: the stamp says published and not consumed, and we are the
                // only accessor, so the value is initialised and dropped once.
                slot.value
                    .with_mut(|cell| unsafe { cell.cast::<T>().drop_in_place() });
            }
        }
    }
}

/// The right to make the ring's one [`Cursor`]: returned only by [`Ring::new`],
/// branded with that ring, and consumed by [`cursor`](Self::cursor), so no ring ever
/// has two consumers.
#[derive(Debug)]
pub struct CursorSeed(usize);

impl CursorSeed {
    /// The cursor of `ring`, the ring this seed came with.
    ///
    /// # Panics
    ///
    /// If `ring` is not the ring whose [`Ring::new`] returned this seed (a second
    /// consumer for another ring would be undefined behaviour).
    pub fn cursor<T>(self, ring: &Ring<T>) -> Cursor {
        assert_eq!(
            self.0,
            ring.brand(),
            "ring invariant: a seed makes the cursor of its own ring only"
        );
        Cursor {
            head: 0,
            ring: self.0,
        }
    }
}

// SAFETY: values move between threads through the ring, so `T: Send` is required;
// the slots are reached only under the ground rules (one writer per reserved
// position, one consumer through its cursor).
unsafe impl<T: Send> Send for Ring<T> {}
// SAFETY: as for `Send`: `&Ring` allows pushes from many threads and pops from the
// cursor holder, which the stamps serialise per slot.
unsafe impl<T: Send> Sync for Ring<T> {}

impl<T> core::fmt::Debug for Ring<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // ORDERING: Relaxed: a diagnostic snapshot.
        let tail = self.tail.load(Ordering::Relaxed);
        f.debug_struct("Ring")
            .field("capacity", &self.capacity())
            .field("reserved", &(tail >> POSITION_SHIFT))
            .field("closed", &(tail & CLOSED != 0))
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{PushError, Ring};
    use std::collections::VecDeque;
    use std::sync::Arc;

    use proptest::prelude::*;

    #[test]
    fn fifo_full_and_wraparound() {
        let (ring, seed) = Ring::new(4);
        let mut cursor = seed.cursor(&ring);
        for lap in 0..3 {
            for i in 0..4 {
                assert_eq!(ring.push(lap * 10 + i), Ok((lap * 4 + i) as usize));
            }
            assert_eq!(ring.push(99), Err(PushError::Full(99)));
            assert!(ring.has_pending(&cursor));
            for i in 0..4 {
                assert_eq!(ring.pop(&mut cursor), Some(lap * 10 + i));
            }
            assert_eq!(ring.pop(&mut cursor), None);
            assert!(!ring.has_pending(&cursor));
        }
    }

    #[test]
    #[should_panic(expected = "a seed makes the cursor of its own ring only")]
    fn a_seed_cannot_make_a_cursor_for_another_ring() {
        let (first, _first_seed) = Ring::<u32>::new(4);
        let (_second, second_seed) = Ring::<u32>::new(4);
        // A second consumer for `first` would race its real one: refused.
        let _ = second_seed.cursor(&first);
    }

    #[test]
    fn a_cursor_follows_its_ring_when_the_ring_moves() {
        let (ring, seed) = Ring::new(4);
        let mut cursor = seed.cursor(&ring);
        assert!(ring.push(7u32).is_ok());
        let moved = Box::new(ring);
        assert_eq!(moved.pop(&mut cursor), Some(7));
    }

    #[test]
    fn close_rejects_later_pushes_and_drains_earlier_ones() {
        let (ring, seed) = Ring::new(8);
        let mut cursor = seed.cursor(&ring);
        ring.push(1).unwrap();
        ring.push(2).unwrap();
        let reserved = ring.close();
        assert_eq!(reserved, 2);
        assert_eq!(ring.push(3), Err(PushError::Closed(3)));
        let mut drained = Vec::new();
        ring.drain_closed(&mut cursor, reserved, &mut |v| drained.push(v));
        assert_eq!(drained, [1, 2]);
        assert_eq!(ring.close(), 2, "idempotent");
    }

    #[test]
    fn dropping_a_ring_drops_unconsumed_values() {
        let marker = Arc::new(());
        let (ring, seed) = Ring::new(4);
        let mut cursor = seed.cursor(&ring);
        for _ in 0..3 {
            ring.push(marker.clone()).unwrap();
        }
        drop(ring.pop(&mut cursor));
        ring.push(marker.clone()).unwrap();
        assert_eq!(Arc::strong_count(&marker), 4);
        drop(ring);
        assert_eq!(Arc::strong_count(&marker), 1);
    }

    #[test]
    fn producers_on_real_threads_lose_and_duplicate_nothing() {
        let per_producer = if cfg!(miri) { 50 } else { 20_000 };
        let (ring, seed) = Ring::new(64);
        let ring = Arc::new(ring);
        let mut cursor = seed.cursor(&*ring);
        let producers: Vec<_> = (0..3u64)
            .map(|p| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    for i in 0..per_producer {
                        let mut value = (p << 32) | i;
                        while let Err(PushError::Full(back)) = ring.push(value) {
                            value = back;
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut next = [0u64; 3];
        let mut received = 0;
        while received < 3 * per_producer {
            if let Some(value) = ring.pop(&mut cursor) {
                let p = (value >> 32) as usize;
                assert_eq!(value & 0xffff_ffff, next[p], "per-producer order");
                next[p] += 1;
                received += 1;
            } else {
                std::thread::yield_now();
            }
        }
        for producer in producers {
            producer.join().unwrap();
        }
        assert_eq!(next, [per_producer; 3]);
        assert_eq!(ring.pop(&mut cursor), None);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Push(u32),
        Pop,
        Close,
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 256 },
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x0001_2345),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Sequentially, the ring behaves as a bounded `VecDeque` that can be closed.
        #[test]
        fn ring_matches_vecdeque(
            log2 in 1u32..5,
            ops in prop::collection::vec(prop_oneof![
                6 => any::<u32>().prop_map(Op::Push),
                5 => Just(Op::Pop),
                1 => Just(Op::Close),
            ], 0..if cfg!(miri) { 50 } else { 2_000 })
        ) {
            let capacity = 1usize << log2;
            let (ring, seed) = Ring::new(capacity);
            let mut cursor = seed.cursor(&ring);
            let mut model = VecDeque::new();
            let mut closed = false;
            for op in ops {
                match op {
                    Op::Push(v) => {
                        let got = ring.push(v);
                        if closed {
                            prop_assert_eq!(got, Err(PushError::Closed(v)));
                        } else if model.len() == capacity {
                            prop_assert_eq!(got, Err(PushError::Full(v)));
                        } else {
                            prop_assert!(got.is_ok());
                            model.push_back(v);
                        }
                    }
                    Op::Pop => prop_assert_eq!(ring.pop(&mut cursor), model.pop_front()),
                    Op::Close => {
                        closed = true;
                        ring.close();
                    }
                }
                prop_assert_eq!(ring.has_pending(&cursor), !model.is_empty());
            }
        }
    }
}
