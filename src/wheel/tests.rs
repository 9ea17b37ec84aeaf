//! Boundary tests and the reference-model property suite for [`TimingWheel`].
//!
//! The property suite drives the wheel and a `BTreeMap` model with the same random
//! sequence of inserts (deadlines in the past, at the current tick, near every level
//! edge, far, and near `u64::MAX`), removes (live and stale keys) and advances (one
//! tick, small steps, large jumps, straight to `next_expiry`, backwards, to the end of
//! time). It proves, for every sequence:
//!
//! - exactly once: each entry is yielded once, or removed once, never both;
//! - on time: at the first `advance` whose `now` is at or after its deadline (an entry
//!   inserted overdue counts as due at the tick it was inserted at), never earlier,
//!   with the deadline it was inserted with;
//! - in order: within one `advance`, yields are in non-decreasing deadline order;
//! - a stale key returns `None` and disturbs nothing;
//! - `next_expiry` is `None` iff empty, never after the earliest deadline, never before
//!   `now`, equal to `now` only when something is overdue, and after every `advance`
//!   strictly after `now` (so advancing to it always makes progress);
//! - `len` matches the model after every step.
//!
//! Seeds are fixed, so a failure reproduces; there are no threads and no clock.

use std::collections::{BTreeSet, HashMap};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

use super::engine::OVERDUE_LIST;
use super::{TimingWheel, WheelKey};

fn drain(wheel: &mut TimingWheel<u64>, now: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    wheel.advance(now, &mut |deadline, value| out.push((deadline, value)));
    out
}

#[test]
fn fires_exactly_at_every_level_edge_never_before() {
    let mut edges = vec![1u64, 63, 64, 65, 4095, 4096, 4097];
    for level in 2..11u32 {
        let edge = 1u64 << (6 * level);
        edges.extend([edge - 1, edge, edge + 1]);
    }
    edges.push(u64::MAX - 1);
    edges.push(u64::MAX);
    for &deadline in &edges {
        let mut wheel = TimingWheel::new(0);
        wheel.insert(deadline, deadline);
        assert!(wheel.next_expiry().unwrap() <= deadline);
        assert_eq!(drain(&mut wheel, deadline - 1), [], "early at {deadline}");
        assert_eq!(
            drain(&mut wheel, deadline),
            [(deadline, deadline)],
            "missed {deadline}"
        );
        assert!(wheel.is_empty());
        assert_eq!(wheel.next_expiry(), None);
    }
}

#[test]
fn all_edges_together_come_out_in_deadline_order() {
    let mut wheel = TimingWheel::new(0);
    let mut deadlines = vec![1u64, 63, 64, 4095, 4096, 1 << 36, (1 << 36) - 1, u64::MAX];
    for &d in deadlines.iter().rev() {
        wheel.insert(d, d);
    }
    deadlines.sort_unstable();
    let got: Vec<u64> = drain(&mut wheel, u64::MAX)
        .into_iter()
        .map(|(d, _)| d)
        .collect();
    assert_eq!(got, deadlines);
}

#[test]
fn insert_at_current_tick_and_in_the_past_is_due_at_next_advance() {
    let mut wheel = TimingWheel::new(1000);
    wheel.insert(1001, 3);
    wheel.insert(1000, 1);
    wheel.insert(5, 2);
    wheel.insert(0, 4);
    assert_eq!(wheel.next_expiry(), Some(1000));
    let mut got = drain(&mut wheel, 1000);
    got.sort_unstable();
    assert_eq!(
        got,
        [(0, 4), (5, 2), (1000, 1)],
        "original deadlines, not 1001"
    );
    assert_eq!(wheel.next_expiry(), Some(1001));
    assert_eq!(drain(&mut wheel, 1001), [(1001, 3)]);
}

#[test]
fn overdue_entries_come_before_later_ones_in_one_advance() {
    let mut wheel = TimingWheel::new(10);
    wheel.insert(11, 11);
    wheel.insert(3, 3);
    assert_eq!(drain(&mut wheel, 20), [(3, 3), (11, 11)]);
}

#[test]
fn advance_backwards_only_yields_overdue_and_keeps_now() {
    let mut wheel = TimingWheel::new(100);
    wheel.insert(50, 50);
    wheel.insert(101, 101);
    assert_eq!(drain(&mut wheel, 7), [(50, 50)]);
    assert_eq!(wheel.now(), 100);
    assert_eq!(wheel.len(), 1);
}

#[test]
fn near_u64_max_start_and_deadlines_do_not_overflow() {
    let mut wheel = TimingWheel::new(u64::MAX - 3);
    wheel.insert(u64::MAX, 1);
    wheel.insert(u64::MAX - 2, 2);
    wheel.insert(u64::MAX - 3, 3);
    assert_eq!(drain(&mut wheel, u64::MAX - 3), [(u64::MAX - 3, 3)]);
    assert_eq!(drain(&mut wheel, u64::MAX - 1), [(u64::MAX - 2, 2)]);
    assert_eq!(drain(&mut wheel, u64::MAX), [(u64::MAX, 1)]);
    assert_eq!(wheel.now(), u64::MAX);
    wheel.insert(u64::MAX, 9);
    assert_eq!(wheel.next_expiry(), Some(u64::MAX));
    assert_eq!(drain(&mut wheel, u64::MAX), [(u64::MAX, 9)]);
}

#[test]
fn stale_keys_return_none_even_after_storage_reuse() {
    let mut wheel = TimingWheel::new(0);
    let removed = wheel.insert(10, 1);
    assert_eq!(wheel.remove(removed), Some(1));
    assert_eq!(wheel.remove(removed), None);
    let expired = wheel.insert(5, 2);
    assert_eq!(drain(&mut wheel, 5), [(5, 2)]);
    assert_eq!(wheel.remove(expired), None);
    let reused = wheel.insert(7, 3);
    assert_eq!(
        wheel.remove(removed),
        None,
        "old key must not hit the reused node"
    );
    assert_eq!(wheel.remove(expired), None);
    assert_eq!(wheel.len(), 1);
    assert_eq!(wheel.remove(reused), Some(3));
}

#[test]
fn removing_the_last_entry_of_a_slot_clears_next_expiry() {
    let mut wheel = TimingWheel::new(0);
    let a = wheel.insert(4096, 1);
    let b = wheel.insert(4097, 2);
    assert_eq!(wheel.next_expiry(), Some(4096));
    wheel.remove(a);
    assert_eq!(
        wheel.next_expiry(),
        Some(4096),
        "same level-2 slot still occupied"
    );
    wheel.remove(b);
    assert_eq!(wheel.next_expiry(), None);
}

#[test]
fn cost_does_not_depend_on_empty_ticks() {
    let mut wheel = TimingWheel::new(0);
    for d in [1_000u64, 1_000_000_000, 1_000_000_000_000] {
        wheel.insert(d, d);
    }
    let mut fired = Vec::new();
    let mut steps = 0;
    while let Some(t) = wheel.next_expiry() {
        steps += 1;
        wheel.advance(t, &mut |d, _| fired.push(d));
        assert!(
            steps <= 3 * 11,
            "more steps than 3 entries x 11 levels: {steps}"
        );
    }
    assert_eq!(fired, [1_000, 1_000_000_000, 1_000_000_000_000]);
    // One call over 10^12 ticks does the same bounded work.
    let mut wheel = TimingWheel::new(0);
    for d in [1_000u64, 1_000_000_000, 1_000_000_000_000] {
        wheel.insert(d, d);
    }
    assert_eq!(drain(&mut wheel, 1_000_000_000_000).len(), 3);
}

#[test]
fn many_entries_in_one_tick_all_fire() {
    let mut wheel = TimingWheel::new(0);
    let n = if cfg!(miri) { 100 } else { 10_000 };
    for i in 0..n {
        wheel.insert(300_000, i);
    }
    assert_eq!(drain(&mut wheel, 299_999).len(), 0);
    assert_eq!(drain(&mut wheel, 300_000).len(), n as usize);
}

#[test]
fn a_bounded_advance_yields_a_burst_tick_by_tick_a_budget_at_a_time() {
    let mut bounded = TimingWheel::new(0);
    let mut unbounded = TimingWheel::new(0);
    // One tick's burst, a cascade from level 1, and entries already overdue.
    for value in 0..50u64 {
        let deadline = [7, 7, 100, 0][value as usize % 4];
        bounded.insert(deadline, value);
        unbounded.insert(deadline, value);
    }
    let mut expected = Vec::new();
    unbounded.advance(100, &mut |deadline, value| expected.push((deadline, value)));
    let mut got = Vec::new();
    let mut calls = 0;
    loop {
        calls += 1;
        let before = got.len();
        let finished =
            bounded.advance_bounded(100, 3, &mut |deadline, value| got.push((deadline, value)));
        assert!(got.len() - before <= 3, "at most the budget per call");
        assert!(bounded.now() <= 100);
        if finished {
            break;
        }
        assert!(bounded.next_expiry().is_some_and(|tick| tick <= 100));
    }
    // The same entries, each tick's after the earlier tick's: every slot here is larger
    // than the budget, so none is taken while another is a backlog (within a tick, and
    // among overdue entries, any order: the wheel promises none).
    let deadlines = |yielded: &[(u64, u64)]| yielded.iter().map(|&(d, _)| d).collect::<Vec<_>>();
    assert_eq!(deadlines(&got), deadlines(&expected));
    got.sort_unstable();
    expected.sort_unstable();
    assert_eq!(got, expected);
    assert_eq!(calls, 17, "50 entries, 3 a call: 17 calls");
    assert_eq!(bounded.now(), 100);
    assert!(bounded.is_empty());
}

#[test]
fn a_timer_due_during_a_backlog_does_not_wait_for_all_of_it() {
    let mut wheel = TimingWheel::new(0);
    for value in 0..1_000u64 {
        wheel.insert(10, value);
    }
    let mut fired = Vec::new();
    assert!(!wheel.advance_bounded(10, 100, &mut |deadline, value| fired
        .push((deadline, value))));
    assert_eq!(fired.len(), 100);
    wheel.insert(11, 11_000);
    fired.clear();
    // Half the budget to the backlog, then what came due since (the one at tick 11),
    // then the backlog again: it comes out in the next call, not after 900 more.
    assert!(!wheel.advance_bounded(11, 100, &mut |deadline, value| fired
        .push((deadline, value))));
    assert_eq!(fired.len(), 100);
    assert_eq!(fired[50], (11, 11_000));
    assert_eq!(
        fired
            .iter()
            .filter(|&&(deadline, _)| deadline == 10)
            .count(),
        99
    );
    let mut rest = 0;
    while !wheel.advance_bounded(11, 100, &mut |_, _| rest += 1) {}
    assert_eq!(rest, 1_000 - 199);
    assert!(wheel.is_empty());
}

#[test]
fn an_entry_left_due_by_a_bounded_advance_can_still_be_removed() {
    let mut wheel = TimingWheel::new(0);
    let keys: Vec<WheelKey> = (0..10u64).map(|value| wheel.insert(5, value)).collect();
    let mut fired = Vec::new();
    assert!(!wheel.advance_bounded(5, 4, &mut |_, value| fired.push(value)));
    assert_eq!(fired, [0, 1, 2, 3]);
    // Left in the backlog: removable, beside one filed since.
    let later = wheel.insert(69, 690);
    assert_eq!(wheel.remove(keys[6]), Some(6));
    assert_eq!(wheel.remove(keys[2]), None, "already yielded");
    assert!(wheel.advance_bounded(5, 100, &mut |_, value| fired.push(value)));
    fired[4..].sort_unstable();
    assert_eq!(fired, [0, 1, 2, 3, 4, 5, 7, 8, 9]);
    assert_eq!(wheel.remove(later), Some(690));
    assert!(wheel.is_empty());
    assert!(
        wheel.advance_bounded(6, 0, &mut |_, _| {}),
        "nothing due: finished"
    );
    wheel.insert(7, 70);
    assert!(
        !wheel.advance_bounded(7, 0, &mut |_, _| {}),
        "due, and no budget"
    );
    assert_eq!(wheel.next_expiry(), Some(7));
}

/// A drained slot keeps the retained capacity and no more, however many entries it
/// held: memory follows the entries held (a slot that once held a burst does not keep
/// it), and the next fill starts from the retained places, not from nothing.
#[test]
fn a_drained_slot_keeps_the_retained_capacity_and_no_more() {
    const SLOT_1_OF_LEVEL_1: u16 = 64 + 1;
    let mut wheel = TimingWheel::new(0);
    for i in 0..5_000u64 {
        wheel.insert(64 + i % 64, i); // level 1, slot 1: ticks 64..128
    }
    assert!(wheel.wheel.list_capacity(SLOT_1_OF_LEVEL_1) >= 5_000);
    assert_eq!(drain(&mut wheel, 127).len(), 5_000);
    let capacity = wheel.wheel.list_capacity(SLOT_1_OF_LEVEL_1);
    assert!(
        (1024..2 * 1024).contains(&capacity),
        "cut down to the retained capacity: {capacity}"
    );
    // Each level-0 slot held about 78 of them (tick 64's fired in the cascade): kept.
    assert!(wheel.wheel.list_capacity(1) >= 78);
}

/// A slot that drained as a backlog (a bounded advance took it whole) gets its vector
/// back when the backlog ends, so its next fill does not grow one from nothing.
#[test]
fn a_slot_drained_as_a_backlog_gets_its_vector_back() {
    const SLOT_5_OF_LEVEL_0: u16 = 5;
    let mut wheel = TimingWheel::new(0);
    for i in 0..3_000u64 {
        wheel.insert(5, i);
    }
    let mut fired = 0;
    assert!(!wheel.advance_bounded(5, 100, &mut |_, _| fired += 1));
    assert_eq!(
        wheel.wheel.list_capacity(SLOT_5_OF_LEVEL_0),
        0,
        "taken as the backlog"
    );
    assert!(wheel.advance_bounded(5, usize::MAX, &mut |_, _| fired += 1));
    assert_eq!(fired, 3_000);
    let capacity = wheel.wheel.list_capacity(SLOT_5_OF_LEVEL_0);
    assert!(
        (1024..2 * 1024).contains(&capacity),
        "given back, cut down to the retained capacity: {capacity}"
    );
    // Entries filed in the same list while the backlog drained (the overdue list here)
    // move into the returned vector at the positions they had: still removable, still
    // yielded once.
    let mut wheel = TimingWheel::new(10);
    let keys: Vec<WheelKey> = (0..3_000u64).map(|i| wheel.insert(3, i)).collect();
    let mut yielded = 0;
    assert!(!wheel.advance_bounded(10, 100, &mut |_, _| yielded += 1));
    assert_eq!(yielded, 100);
    let (a, b) = (wheel.insert(4, 1_000_001), wheel.insert(4, 1_000_002));
    let removed = keys
        .iter()
        .filter(|&&key| wheel.remove(key).is_some())
        .count();
    assert_eq!(removed, 2_900, "the backlog ends by its last removal");
    assert!(
        wheel.wheel.list_capacity(OVERDUE_LIST) >= 1024,
        "the overdue list got the backlog's vector back"
    );
    assert_eq!(wheel.remove(a), Some(1_000_001));
    assert_eq!(drain(&mut wheel, 10), [(4, 1_000_002)]);
    assert_eq!(wheel.remove(b), None);
    assert!(wheel.is_empty());
}

/// Where an inserted deadline lands relative to the wheel's current tick.
#[derive(Clone, Debug)]
enum Deadline {
    Past(u64),
    Now,
    Near(u64),
    LevelEdge { level: u32, delta: i64 },
    Far(u64),
    NearMax(u64),
}

#[derive(Clone, Debug)]
enum Step {
    One,
    Small(u64),
    Jump(u64),
    ToNextExpiry,
    Backwards(u64),
    ToEnd,
}

#[derive(Clone, Debug)]
enum Op {
    Insert(Deadline),
    RemoveLive(usize),
    RemoveStale(usize),
    Advance(Step),
    /// A bounded advance by this many ticks, yielding at most this many entries.
    AdvanceBounded(u64, usize),
    /// Bounded advances by this many ticks with this budget, repeated until one
    /// finishes, as a shard's turns do.
    AdvanceInTurns(u64, usize),
    /// A burst: `count` entries in the next slot of `level` (so they cascade when it
    /// comes due), spread over its first `spread` ticks, as many timers made for one
    /// deadline are. Bigger than a bounded advance's budget, it becomes a backlog
    /// that cascades while later slots come due (the defect of a burst re-filed
    /// against a stale tick, which held a due entry for a rotation, needs exactly this).
    Burst {
        level: u32,
        count: usize,
        spread: u64,
    },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let deadline = prop_oneof![
        2 => (1u64..200).prop_map(Deadline::Past),
        2 => Just(Deadline::Now),
        6 => (1u64..64).prop_map(Deadline::Near),
        4 => (1u32..11, -2i64..=2).prop_map(|(level, delta)| Deadline::LevelEdge { level, delta }),
        3 => (1u64..1 << 40).prop_map(Deadline::Far),
        1 => (0u64..100).prop_map(Deadline::NearMax),
    ];
    let step = prop_oneof![
        4 => Just(Step::One),
        4 => (1u64..200).prop_map(Step::Small),
        1 => (1u64..1 << 38).prop_map(Step::Jump),
        4 => Just(Step::ToNextExpiry),
        1 => (0u64..50).prop_map(Step::Backwards),
        1 => Just(Step::ToEnd),
    ];
    prop_oneof![
        10 => deadline.prop_map(Op::Insert),
        4 => any::<usize>().prop_map(Op::RemoveLive),
        1 => any::<usize>().prop_map(Op::RemoveStale),
        5 => step.prop_map(Op::Advance),
        2 => (0u64..100, 0usize..8).prop_map(|(by, budget)| Op::AdvanceBounded(by, budget)),
        2 => (0u64..200, 1usize..8).prop_map(|(by, budget)| Op::AdvanceInTurns(by, budget)),
        1 => (1u32..4, 5usize..40, 1u64..80)
            .prop_map(|(level, count, spread)| Op::Burst { level, count, spread }),
    ]
}

/// The reference model: live entries by id, with their key, original deadline and
/// effective deadline (the tick at which they are due), indexed by effective deadline.
#[derive(Default)]
struct Model {
    /// id -> (key, original deadline, effective deadline, position in `ids`).
    live: HashMap<u64, (WheelKey, u64, u64, usize)>,
    /// Live ids, for picking one at random in O(1).
    ids: Vec<u64>,
    /// `(effective deadline, id)` of every live entry: the reference order.
    by_deadline: BTreeSet<(u64, u64)>,
    stale: Vec<WheelKey>,
    next_id: u64,
    /// `ToEnd` is allowed once per case so most of the case runs below `u64::MAX`.
    ended: bool,
}

impl Model {
    fn add(&mut self, id: u64, key: WheelKey, deadline: u64, effective: u64) {
        self.live
            .insert(id, (key, deadline, effective, self.ids.len()));
        self.ids.push(id);
        self.by_deadline.insert((effective, id));
    }

    /// Removes a live id and returns (key, original deadline, effective deadline).
    fn take(&mut self, id: u64) -> Option<(WheelKey, u64, u64)> {
        let (key, deadline, effective, pos) = self.live.remove(&id)?;
        self.ids.swap_remove(pos);
        if let Some(&moved) = self.ids.get(pos) {
            self.live.get_mut(&moved).unwrap().3 = pos;
        }
        self.by_deadline.remove(&(effective, id));
        self.stale.push(key);
        Some((key, deadline, effective))
    }
}

/// One bounded advance to `target` checked against the model; returns whether it
/// finished.
fn bounded_step(
    wheel: &mut TimingWheel<u64>,
    model: &mut Model,
    target: u64,
    budget: usize,
) -> Result<bool, TestCaseError> {
    let mut yielded = Vec::new();
    let finished = wheel.advance_bounded(target, budget, &mut |deadline, id| {
        yielded.push((deadline, id));
    });
    prop_assert!(yielded.len() <= budget);
    let due = model.by_deadline.range(..=(target, u64::MAX)).count();
    // Finished: everything due came out. Not finished: something due is
    // left, or only a cascade (a slot reached whose entries are not due).
    prop_assert!(!finished || yielded.len() == due, "finished, yet due left");
    prop_assert!(wheel.now() <= target);
    if finished {
        prop_assert_eq!(wheel.now(), target);
    } else {
        prop_assert!(wheel.next_expiry().is_some_and(|tick| tick <= target));
    }
    for &(deadline, id) in &yielded {
        let Some((_, original, effective)) = model.take(id) else {
            return Err(TestCaseError::fail(format!(
                "id {id} yielded twice or never inserted"
            )));
        };
        prop_assert_eq!(deadline, original);
        prop_assert!(
            effective <= target,
            "early: id {} due {} at {}",
            id,
            effective,
            target
        );
    }
    Ok(finished)
}

fn run_case(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut wheel = TimingWheel::new(0);
    let mut model = Model::default();
    for op in ops {
        let now = wheel.now();
        match op {
            Op::Insert(choice) => {
                let deadline = match *choice {
                    Deadline::Past(back) => now.saturating_sub(back),
                    Deadline::Now => now,
                    Deadline::Near(ahead) | Deadline::Far(ahead) => now.saturating_add(ahead),
                    Deadline::LevelEdge { level, delta } => {
                        let edge = 1u64 << (6 * level);
                        let base = now & !(edge - 1);
                        base.saturating_add(edge).saturating_add_signed(delta)
                    }
                    Deadline::NearMax(back) => u64::MAX - back,
                };
                let id = model.next_id;
                model.next_id += 1;
                let key = wheel.insert(deadline, id);
                model.add(id, key, deadline, deadline.max(now));
            }
            &Op::Burst {
                level,
                count,
                spread,
            } => {
                let edge = 1u64 << (6 * level);
                let base = (now & !(edge - 1)).saturating_add(edge);
                for i in 0..count as u64 {
                    let deadline = base.saturating_add(i % spread);
                    let id = model.next_id;
                    model.next_id += 1;
                    let key = wheel.insert(deadline, id);
                    model.add(id, key, deadline, deadline.max(now));
                }
            }
            Op::RemoveLive(pick) => {
                if model.live.is_empty() {
                    continue;
                }
                let id = model.ids[pick % model.ids.len()];
                let (key, _, _) = model.take(id).unwrap();
                prop_assert_eq!(wheel.remove(key), Some(id));
            }
            Op::RemoveStale(pick) => {
                if model.stale.is_empty() {
                    continue;
                }
                let key = model.stale[pick % model.stale.len()];
                prop_assert_eq!(wheel.remove(key), None);
            }
            &Op::AdvanceBounded(by, budget) => {
                bounded_step(&mut wheel, &mut model, now.saturating_add(by), budget)?;
            }
            &Op::AdvanceInTurns(by, budget) => {
                // As a shard turns: bounded calls to one target until one finishes.
                let target = now.saturating_add(by);
                let mut calls = 0;
                while !bounded_step(&mut wheel, &mut model, target, budget)? {
                    calls += 1;
                    prop_assert!(calls < 100_000, "bounded advance made no progress");
                }
            }
            Op::Advance(step) => {
                let earliest = model.by_deadline.first().map(|&(eff, _)| eff);
                let next = wheel.next_expiry();
                prop_assert_eq!(next.is_none(), earliest.is_none());
                if let (Some(next), Some(earliest)) = (next, earliest) {
                    // An entry left due by a bounded advance may be due before now.
                    prop_assert!(
                        next <= earliest.max(now),
                        "next_expiry {} after earliest {}",
                        next,
                        earliest
                    );
                    prop_assert!(next >= now);
                    // Due entries make it `now`; so may a backlog that only has a
                    // cascade left (work to do, nothing to yield): the advance below
                    // does that work, and the next `next_expiry` moves on.
                    if earliest <= now {
                        prop_assert_eq!(next, now, "next_expiry is now when overdue");
                    }
                }
                let target = match *step {
                    Step::One => now.saturating_add(1),
                    Step::Small(n) | Step::Jump(n) => now.saturating_add(n),
                    Step::ToNextExpiry => next.unwrap_or(now),
                    Step::Backwards(n) => now.saturating_sub(n),
                    Step::ToEnd if !model.ended => {
                        model.ended = true;
                        u64::MAX
                    }
                    Step::ToEnd => now.saturating_add(1),
                };
                let yielded = drain(&mut wheel, target);
                let due_by = target.max(now);
                let expected = model.by_deadline.range(..=(due_by, u64::MAX)).count();
                prop_assert_eq!(yielded.len(), expected, "advance {} -> {}", now, target);
                let mut last_effective = 0;
                for &(deadline, id) in &yielded {
                    let Some((_, original, effective)) = model.take(id) else {
                        return Err(TestCaseError::fail(format!(
                            "id {id} yielded twice or never inserted"
                        )));
                    };
                    prop_assert_eq!(deadline, original, "yielded with its original deadline");
                    prop_assert!(
                        effective <= due_by,
                        "early: id {} due {} at {}",
                        id,
                        effective,
                        due_by
                    );
                    prop_assert!(effective >= last_effective, "out of deadline order");
                    last_effective = effective;
                }
                prop_assert_eq!(wheel.now(), due_by);
                if let Some(next) = wheel.next_expiry() {
                    prop_assert!(
                        next > wheel.now(),
                        "after advance next_expiry {} must be after now {}",
                        next,
                        wheel.now()
                    );
                }
            }
        }
        prop_assert_eq!(wheel.len(), model.live.len());
    }
    // Finally everything still held comes out at the end of time, exactly once.
    let rest = drain(&mut wheel, u64::MAX);
    prop_assert_eq!(rest.len(), model.live.len());
    for (_, id) in rest {
        prop_assert!(model.take(id).is_some());
    }
    prop_assert!(wheel.is_empty());
    Ok(())
}

fn config() -> Config {
    Config {
        cases: if cfg!(miri) { 2 } else { 256 },
        rng_seed: RngSeed::Fixed(0x5eed_71e4),
        failure_persistence: None,
        max_shrink_iters: 2_000,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn wheel_matches_btreemap_model(ops in prop::collection::vec(op_strategy(), if cfg!(miri) { 200..201 } else { 10_000..10_001 })) {
        run_case(&ops)?;
    }
}
