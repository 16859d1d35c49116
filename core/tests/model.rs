//! Model-based property test: random admissions, completions, time jumps, interruptions, bad
//! events and operator lane actions (pause, resume, purge, skip-head, strict) reaching the
//! pass, checked against a per-lane FIFO reference model (the model store).
#![allow(missing_docs)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{ModelStore, T0, World};
use outbox_lanes_core::{Command, Config, LaneChunk, LaneId, Outcome, Timestamp, UnitId};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Enqueue {
        lanes: Vec<u8>,
        joined: bool,
    },
    Discover,
    Complete {
        pick: usize,
        outcome: u8,
    },
    Advance {
        ms: u32,
    },
    Backwards {
        ms: u32,
    },
    Interrupt,
    EndPassIfDone,
    StaleCompletion {
        unit: u64,
    },
    UnclaimedChunk {
        lane: u8,
    },
    /// An operator acts on a lane: 0 pause, 1 resume, 2 purge, 3 skip-head, 4 strict,
    /// 5 unstrict; the pass is told the lane's state after it.
    Control {
        lane: u8,
        action: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop::collection::vec(0u8..6, 1..=3), prop::bool::weighted(0.2))
            .prop_map(|(lanes, joined)| Op::Enqueue { lanes, joined }),
        2 => Just(Op::Discover),
        8 => (any::<usize>(), 0u8..20).prop_map(|(pick, outcome)| Op::Complete { pick, outcome }),
        3 => (0u32..40_000).prop_map(|ms| Op::Advance { ms }),
        1 => (0u32..5_000).prop_map(|ms| Op::Backwards { ms }),
        1 => Just(Op::Interrupt),
        1 => Just(Op::EndPassIfDone),
        1 => (0u64..64).prop_map(|unit| Op::StaleCompletion { unit }),
        1 => (0u8..6).prop_map(|lane| Op::UnclaimedChunk { lane }),
        2 => (0u8..6, 0u8..6).prop_map(|(lane, action)| Op::Control { lane, action }),
    ]
}

fn outcome_of(code: u8) -> Outcome {
    match code {
        0..=11 => Outcome::Delivered,
        12..=15 => Outcome::Transient { retry_after: None },
        16 => Outcome::Throttled {
            retry_after: Some(Duration::from_secs(5)),
        },
        17 => Outcome::Transient {
            retry_after: Some(Duration::from_secs(2)),
        },
        18 => Outcome::Permanent,
        _ => Outcome::Gone,
    }
}

/// The pace of the rate-limited lane of the model.
const PACE: Duration = Duration::from_millis(300);

/// The reference checks, applied to every command the scheduler emits.
struct Checker {
    in_flight: BTreeMap<LaneId, UnitId>,
    flights: Vec<(UnitId, LaneId)>,
    resolved: BTreeSet<(UnitId, LaneId)>,
    /// Recipients an operator dead-lettered while an attempt to them was in flight: that
    /// attempt may still end in a delivery or a dead letter, once.
    late: BTreeSet<(UnitId, LaneId)>,
    /// Units an operator dead-lettered (for some lane): the pass may hand them back.
    gone: BTreeSet<UnitId>,
    config: Config,
}

impl Checker {
    fn check(&mut self, store: &ModelStore, now: Timestamp, cmd: &Command) {
        match *cmd {
            Command::Start { unit, lane, .. } => {
                let u = store
                    .units
                    .get(&unit)
                    .expect("a started unit is pending in the store");
                // Per-lane order: nothing earlier is pending in any lane the unit occupies.
                // Never in a paused lane, never to a recipient an operator set aside (OL-14).
                assert!(
                    !store.paused.contains(&lane),
                    "{unit:?} started on paused {lane:?}"
                );
                assert!(
                    store.unresolved_in(lane).contains(&unit),
                    "{unit:?} started on {lane:?}, where it is not pending"
                );
                for s in &u.admit.slots {
                    let head = store.pending_in(s.lane)[0].admit.id;
                    assert_eq!(
                        head, unit,
                        "{unit:?} started on {lane:?} while {head:?} is ahead in {:?}",
                        s.lane
                    );
                }
                assert!(
                    self.in_flight.insert(lane, unit).is_none(),
                    "two attempts in flight on {lane:?}"
                );
                let info = store.lane_info(lane);
                assert!(
                    info.not_before.is_none_or(|t| t <= now),
                    "{unit:?} started on {lane:?} before its not_before"
                );
                // A paced lane's starts are at least its pace apart (OL-23); time going
                // backwards is clamped by the scheduler, not by this clock.
                assert!(
                    info.paced_until.is_none_or(|t| t <= now),
                    "{unit:?} started on paced {lane:?} before {:?}",
                    info.paced_until
                );
                self.flights.push((unit, lane));
            }
            Command::Delivered { unit, lane } | Command::DeadLetter { unit, lane, .. }
                if self.late.remove(&(unit, lane)) => {}
            Command::Delivered { unit, lane } | Command::DeadLetter { unit, lane, .. } => {
                assert!(
                    self.resolved.insert((unit, lane)),
                    "{unit:?} resolved twice for {lane:?}"
                );
                assert!(
                    store.units.contains_key(&unit),
                    "{unit:?} resolved while not pending"
                );
            }
            Command::HandBack { unit } => {
                assert!(
                    store.units.contains_key(&unit) || self.gone.contains(&unit),
                    "{unit:?} handed back but not pending"
                );
            }
            Command::RetireLane { lane, .. } => {
                // The store dead-letters every recipient still pending in the lane.
                for unit in store.unresolved_in(lane) {
                    assert!(
                        self.resolved.insert((unit, lane)),
                        "{unit:?} resolved twice for {lane:?}"
                    );
                }
            }
            Command::Interrupted { unit, lane, .. } => {
                assert_eq!(
                    self.in_flight.remove(&lane),
                    Some(unit),
                    "{unit:?} recorded as interrupted on {lane:?} but was not in flight there"
                );
            }
            Command::RecordAttempt { .. }
            | Command::Hold { .. }
            | Command::LaneBackoff { .. }
            | Command::LaneOpen { .. }
            | Command::LaneFailing { .. }
            | Command::LaneRestart { .. }
            | Command::LaneUnavailable { .. } => {}
        }
    }
}

fn settle(w: &mut World, c: &mut Checker) {
    loop {
        let mut any = execute(w, c);
        if let Some(claims) = w.s.poll_claim(w.now) {
            let chunks = w.store.claim(&claims);
            let report = w.s.handle_claimed(chunks, w.now);
            assert!(report.refused.is_empty(), "refused {:?}", report.refused);
            any = true;
        } else {
            // It may have handed back heads held in backoff to make room: executed before
            // the next claim.
            any |= execute(w, c);
        }
        assert!(w.s.admitted() <= c.config.max_units, "window exceeded");
        assert!(
            w.s.admitted() <= 1 || w.s.admitted_bytes() <= c.config.max_bytes,
            "byte bound exceeded"
        );
        if !any {
            break;
        }
    }
}

/// Executes the queued commands, checking each; returns whether there were any.
fn execute(w: &mut World, c: &mut Checker) -> bool {
    let mut any = false;
    let mut backs = Vec::new();
    while let Some(cmd) = w.s.poll_command() {
        c.check(&w.store, w.now, &cmd);
        if let Command::Start { lane, .. } = cmd {
            // What a runtime remembers of a paced lane's last start, for its next pass.
            let info = w.store.lane_state.entry(lane).or_default();
            if let Some(pace) = info.pace {
                info.paced_until = Some(w.now + pace);
            }
        }
        if let Command::HandBack { unit } = cmd {
            if let Some(u) = w.store.units.get(&unit) {
                backs.push(u.admit.seq);
            }
        }
        w.store.apply(&cmd);
        any = true;
    }
    // A batch of hand-backs comes in enqueue order.
    assert!(
        backs.windows(2).all(|p| p[0] <= p[1]),
        "hand-backs out of order: {backs:?}"
    );
    any
}

fn complete(w: &mut World, c: &mut Checker, i: usize, o: Outcome) {
    let (unit, lane) = c.flights.remove(i);
    c.in_flight.remove(&lane);
    w.s.handle_outcome(unit, lane, o, w.now)
        .expect("an attempt in flight accepts its outcome");
    settle(w, c);
}

fn run(ops: Vec<Op>, config: Config) {
    let mut w = World::new(config.clone());
    let mut c = Checker {
        in_flight: BTreeMap::new(),
        flights: Vec::new(),
        resolved: BTreeSet::new(),
        late: BTreeSet::new(),
        gone: BTreeSet::new(),
        config,
    };
    let names = ["a", "b", "c", "d", "e", "f"];
    // Lane "b" is rate-limited (OL-23): its starts at least 300 ms apart, across passes too.
    let b = w.lane("b");
    w.store.lane_state.entry(b).or_default().pace = Some(PACE);
    let mut enqueued: BTreeSet<(UnitId, LaneId)> = BTreeSet::new();
    // A runtime's pass discovers its lanes before anything else: a control reaches a pass
    // that has (before it, the pass's discovery reads the lane as the operator left it).
    let mut discovered = false;
    for op in ops {
        match op {
            Op::Enqueue { lanes, joined } => {
                let mut ls: Vec<&str> = lanes.iter().map(|&i| names[i as usize]).collect();
                ls.sort_unstable();
                ls.dedup();
                for u in w.enqueue(&ls, joined) {
                    for s in &w.store.units[&u].admit.slots {
                        enqueued.insert((u, s.lane));
                    }
                }
            }
            Op::Discover => {
                discovered = true;
                for lane in w.store.lanes_with_work() {
                    let info = w.store.discovery_info(lane);
                    w.s.handle_lane(lane, info, w.now);
                }
                settle(&mut w, &mut c);
            }
            Op::Complete { pick, outcome } => {
                if !c.flights.is_empty() {
                    let i = pick % c.flights.len();
                    complete(&mut w, &mut c, i, outcome_of(outcome));
                }
            }
            Op::Advance { ms } => {
                w.now = w.now + Duration::from_millis(u64::from(ms));
                w.s.handle_timeout(w.now);
                settle(&mut w, &mut c);
            }
            Op::Backwards { ms } => {
                // Time going backwards is clamped: nothing fires, nothing breaks.
                let earlier = w.now.saturating_sub(Duration::from_millis(u64::from(ms)));
                w.s.handle_timeout(earlier);
                settle(&mut w, &mut c);
            }
            Op::Interrupt => {
                discovered = false;
                w.s.handle_interrupt(w.now);
                let stale = std::mem::take(&mut c.flights);
                settle(&mut w, &mut c);
                assert!(
                    c.in_flight.is_empty(),
                    "attempts cut off in flight but not recorded as interrupted: {:?}",
                    c.in_flight
                );
                assert_eq!(w.s.admitted(), 0);
                // Late completions of interrupted attempts are refused and change nothing.
                for (u, l) in stale {
                    assert!(w.s.handle_outcome(u, l, Outcome::Delivered, w.now).is_err());
                    assert!(w.s.poll_command().is_none());
                }
            }
            Op::EndPassIfDone => {
                if w.s.is_done(w.now) {
                    discovered = false;
                    w.s.handle_pass_end(w.now);
                    settle(&mut w, &mut c);
                    assert_eq!(w.s.admitted(), 0, "pass end leaves nothing admitted");
                }
            }
            Op::StaleCompletion { unit } => {
                let unit = UnitId(unit);
                if !c.flights.iter().any(|(u, _)| *u == unit) {
                    let lane = w.lane("a");
                    assert!(
                        w.s.handle_outcome(unit, lane, Outcome::Delivered, w.now)
                            .is_err()
                    );
                    assert!(w.s.poll_command().is_none());
                }
            }
            Op::UnclaimedChunk { lane } => {
                let lane = w.lane(names[lane as usize]);
                let report = w.s.handle_claimed(
                    vec![LaneChunk {
                        lane,
                        units: vec![],
                        exhausted: true,
                    }],
                    w.now,
                );
                // Either it answered nothing outstanding (refused) or the scheduler had
                // nothing planned: it never admits anything.
                assert_eq!(report.admitted, 0);
                settle(&mut w, &mut c);
            }
            Op::Control { lane, action } => {
                let name = names[lane as usize];
                let l = w.lane(name);
                match action {
                    0 => {
                        w.store.paused.insert(l);
                    }
                    1 => {
                        w.store.paused.remove(&l);
                    }
                    2 | 3 => {
                        let limit = (action == 3).then_some(1);
                        for u in w.store.operator_dead_letters(l, limit) {
                            assert!(c.resolved.insert((u, l)), "{u:?} resolved twice");
                            c.gone.insert(u);
                            if c.in_flight.get(&l) == Some(&u) {
                                c.late.insert((u, l));
                            }
                        }
                    }
                    _ => w.store.lane_state.entry(l).or_default().strict = action == 4,
                }
                if discovered {
                    let control = w.store.lane_control(l);
                    w.s.handle_lane_control(l, control, w.now);
                    settle(&mut w, &mut c);
                }
            }
        }
    }

    // An operator resumes every paused lane.
    for l in std::mem::take(&mut w.store.paused) {
        if discovered {
            let control = w.store.lane_control(l);
            w.s.handle_lane_control(l, control, w.now);
            settle(&mut w, &mut c);
        }
    }

    // Quiescence: every recipient answers from now on; passes run until the store is empty.
    for _ in 0..10_000 {
        if w.store.units.is_empty() {
            break;
        }
        if !c.flights.is_empty() {
            complete(&mut w, &mut c, 0, Outcome::Delivered);
            continue;
        }
        if w.s.is_done(w.now) {
            w.s.handle_pass_end(w.now);
            settle(&mut w, &mut c);
            // Next pass, at the earliest persisted not_before if the lanes are backing off.
            let next = w
                .store
                .lane_state
                .values()
                .filter_map(|i| i.not_before)
                .filter(|&t| t > w.now)
                .min();
            if let Some(t) = next {
                w.now = t;
            }
            for lane in w.store.lanes_with_work() {
                let info = w.store.discovery_info(lane);
                w.s.handle_lane(lane, info, w.now);
            }
            settle(&mut w, &mut c);
            continue;
        }
        if let Some(t) = w.s.poll_timeout() {
            w.now = w.now.max(t);
        }
        w.s.handle_timeout(w.now);
        settle(&mut w, &mut c);
    }
    assert!(
        w.store.units.is_empty(),
        "not quiescent: {} units left",
        w.store.units.len()
    );
    // Nothing lost: every enqueued recipient was delivered or dead-lettered exactly once.
    assert_eq!(c.resolved, enqueued);
    let _ = T0;
}

fn small_config() -> Config {
    Config {
        max_units: 6,
        max_per_lane: 2,
        max_bytes: 350,
        max_in_flight: 3,
        pass_attempts: 3,
        max_attempts: 5,
        jitter_percent: 20,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(4096),
        ..ProptestConfig::default()
    })]

    #[test]
    fn scheduler_keeps_lane_order_and_loses_nothing(ops in prop::collection::vec(op(), 1..120)) {
        run(ops, small_config());
    }

    #[test]
    fn scheduler_with_strictless_gone_retirement(ops in prop::collection::vec(op(), 1..80)) {
        run(ops, Config { retire_on_gone: true, ..small_config() });
    }
}

/// Found by `scheduler_keeps_lane_order_and_loses_nothing` on 2026-12-02 (the CI run's
/// random seed): after an interruption, a lane whose backoff is persisted (`not_before` in the
/// future) but that the pass had not discovered yet was read through a joined unit when
/// another lane of that unit was resumed, with default state, and its head started before
/// `not_before` ("u4 started on L4 before its not_before"). The minimal input proptest shrank
/// it to, replayed here. Fixed: a lane known only as another lane of a joined unit is not read
/// until its discovery brings its persisted state (`transcripts.rs`
/// `a_lane_known_only_through_a_joined_unit_waits_for_its_discovery_and_keeps_its_backoff`).
#[test]
fn a_lane_reached_through_a_joined_unit_keeps_its_persisted_backoff() {
    use Op::*;
    let e = |lanes: &[u8], joined: bool| Enqueue {
        lanes: lanes.to_vec(),
        joined,
    };
    let done = |pick: usize, outcome: u8| Complete { pick, outcome };
    let ops = vec![
        e(&[1, 3, 5], false),
        StaleCompletion { unit: 0 },
        e(&[2], false),
        e(&[1], false),
        e(&[0], false),
        Discover,
        done(202_680_087_424_754_113, 0),
        e(&[0], false),
        done(7_537_662_747_514, 0),
        EndPassIfDone,
        Advance { ms: 0 },
        done(2_546_685_660_465_037_332, 0),
        e(&[1], false),
        Control { lane: 0, action: 0 },
        done(7_926_548_281_630_881_324, 0),
        done(359_434_439_693_136_288, 12),
        done(0, 0),
        Discover,
        Advance { ms: 1027 },
        done(3_802_887_479_352_966_019, 12),
        Advance { ms: 2197 },
        Discover,
        done(3_532_107_256_386_387_326, 0),
        e(&[1], false),
        done(0, 12),
        Discover,
        Discover,
        Interrupt,
        Control { lane: 2, action: 0 },
        e(&[0, 2], true),
        Discover,
    ];
    run(ops, small_config());
}
