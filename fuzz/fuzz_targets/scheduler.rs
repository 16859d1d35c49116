//! The scheduler against a model store, on event sequences decoded from the fuzz input.
//!
//! A port of `core/tests/model.rs` (whose helpers are not a library): the input chooses a
//! configuration, then a sequence of operations (enqueue to 1–4 of 4 lanes, discover, complete
//! an attempt in flight with an outcome, advance time, time going backwards, interrupt, stop,
//! end the pass, stale completions). Every command the scheduler emits is checked:
//! - a `Start` is for the head (lowest pending `seq`) of every lane its unit occupies, never
//!   before the lane's `not_before`, and at most one attempt is in flight per lane;
//! - the admission window (`max_units`, `max_bytes`) and `max_in_flight` hold (a unit
//!   wider than `max_in_flight` starts alone, as documented);
//! - a delivery is resolved (delivered or dead-lettered) at most once, only while pending;
//! - hand-backs come in enqueue order; completions of interrupted attempts are refused.
//!
//! At the end every recipient answers and passes run until the model store is empty: nothing
//! is lost, every enqueued delivery was resolved exactly once.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use outbox_lanes_core::{
    Admit, AdmitSlot, Command, Config, LaneChunk, LaneClaim, LaneId, LaneInfo, LaneKey, Outcome,
    Scheduler, Seq, Timestamp, UnitId,
};

const T0: Timestamp = Timestamp::from_secs(1_000_000);
const LANES: usize = 4;
const MAX_OPS: usize = 256;

// ---- the model store (from core/tests/common/mod.rs) ----

#[derive(Clone, Debug)]
struct StoredUnit {
    admit: Admit,
    resolved: Vec<bool>,
}

#[derive(Clone, Debug, Default)]
struct ModelStore {
    units: BTreeMap<UnitId, StoredUnit>,
    lane_state: BTreeMap<LaneId, LaneInfo>,
    next_id: u64,
    next_seq: u64,
}

impl ModelStore {
    fn enqueue(
        &mut self,
        lanes: &[LaneId],
        joined: bool,
        bytes: u32,
        at: Timestamp,
    ) -> Vec<UnitId> {
        self.next_seq += 1;
        let seq = Seq(self.next_seq);
        let groups: Vec<Vec<LaneId>> = if joined {
            vec![lanes.to_vec()]
        } else {
            lanes.iter().map(|&l| vec![l]).collect()
        };
        let mut ids = Vec::new();
        for g in groups {
            self.next_id += 1;
            let id = UnitId(self.next_id);
            let admit = Admit {
                id,
                seq,
                bytes,
                enqueued_at: at,
                slots: g
                    .iter()
                    .map(|&lane| AdmitSlot {
                        lane,
                        attempts: 0,
                        served: false,
                    })
                    .collect(),
            };
            let n = admit.slots.len();
            self.units.insert(
                id,
                StoredUnit {
                    admit,
                    resolved: vec![false; n],
                },
            );
            ids.push(id);
        }
        ids
    }

    fn lanes_with_work(&self) -> BTreeSet<LaneId> {
        self.units
            .values()
            .flat_map(|u| u.admit.slots.iter().map(|s| s.lane))
            .collect()
    }

    fn lane_info(&self, lane: LaneId) -> LaneInfo {
        self.lane_state.get(&lane).copied().unwrap_or_default()
    }

    fn pending_in(&self, lane: LaneId) -> Vec<&StoredUnit> {
        let mut v: Vec<&StoredUnit> = self
            .units
            .values()
            .filter(|u| u.admit.slots.iter().any(|s| s.lane == lane))
            .collect();
        v.sort_by_key(|u| u.admit.seq);
        v
    }

    fn claim(&self, claims: &[LaneClaim]) -> Vec<LaneChunk> {
        claims
            .iter()
            .map(|c| {
                let units: Vec<Admit> = self
                    .pending_in(c.lane)
                    .into_iter()
                    .filter(|u| u.admit.seq >= c.from)
                    .take(c.limit as usize)
                    .map(|u| {
                        let mut a = u.admit.clone();
                        for (s, r) in a.slots.iter_mut().zip(&u.resolved) {
                            s.served = *r;
                        }
                        a
                    })
                    .collect();
                LaneChunk {
                    lane: c.lane,
                    exhausted: units.len() < c.limit as usize,
                    units,
                }
            })
            .collect()
    }

    fn resolve(&mut self, unit: UnitId, lane: LaneId) {
        if let Some(u) = self.units.get_mut(&unit) {
            if let Some(i) = u.admit.slots.iter().position(|s| s.lane == lane) {
                u.resolved[i] = true;
            }
            if u.resolved.iter().all(|r| *r) {
                self.units.remove(&unit);
            }
        }
    }

    fn unresolved_in(&self, lane: LaneId) -> Vec<UnitId> {
        self.pending_in(lane)
            .into_iter()
            .filter(|u| {
                u.admit
                    .slots
                    .iter()
                    .zip(&u.resolved)
                    .any(|(s, r)| s.lane == lane && !*r)
            })
            .map(|u| u.admit.id)
            .collect()
    }

    fn apply(&mut self, cmd: &Command) {
        match *cmd {
            Command::Start { .. }
            | Command::Hold { .. }
            | Command::HandBack { .. }
            | Command::Interrupted { .. } => {}
            Command::Delivered { unit, lane } | Command::DeadLetter { unit, lane, .. } => {
                self.resolve(unit, lane);
            }
            Command::RecordAttempt {
                unit,
                lane,
                attempts,
                ..
            } => {
                if let Some(u) = self.units.get_mut(&unit) {
                    for s in u.admit.slots.iter_mut().filter(|s| s.lane == lane) {
                        s.attempts = attempts;
                    }
                }
            }
            Command::LaneBackoff {
                lane,
                not_before,
                level,
            } => {
                let e = self.lane_state.entry(lane).or_default();
                e.not_before = Some(not_before);
                e.level = level;
            }
            Command::LaneOpen { lane } | Command::LaneRestart { lane } => {
                let e = self.lane_state.entry(lane).or_default();
                e.not_before = None;
                e.level = 0;
            }
            Command::LaneFailing { lane, since } => {
                let e = self.lane_state.entry(lane).or_default();
                e.failing_since = since;
                if since.is_none() {
                    e.unavailable = false;
                }
            }
            Command::LaneUnavailable { lane, .. } => {
                self.lane_state.entry(lane).or_default().unavailable = true;
            }
            Command::RetireLane { lane, .. } => {
                for id in self.unresolved_in(lane) {
                    self.resolve(id, lane);
                }
            }
        }
    }
}

// ---- the checker (from core/tests/model.rs) ----

struct Checker {
    in_flight: BTreeMap<LaneId, UnitId>,
    flights: Vec<(UnitId, LaneId)>,
    resolved: BTreeSet<(UnitId, LaneId)>,
    config: Config,
}

impl Checker {
    fn check(&mut self, store: &ModelStore, now: Timestamp, cmd: &Command) {
        match *cmd {
            Command::Start { unit, lane, .. } => {
                let u = store
                    .units
                    .get(&unit)
                    .unwrap_or_else(|| panic!("started {unit:?} is not pending in the store"));
                assert!(
                    u.admit.slots.iter().any(|s| s.lane == lane),
                    "{unit:?} started on {lane:?}, a lane it does not occupy"
                );
                // Per-lane order: nothing earlier is pending in any lane the unit occupies.
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
                let nb = store.lane_info(lane).not_before;
                assert!(
                    nb.is_none_or(|t| t <= now),
                    "{unit:?} started on {lane:?} before its not_before"
                );
                self.flights.push((unit, lane));
                // A unit starts as a whole: one wider than `max_in_flight` starts alone.
                assert!(
                    self.flights.len() <= self.config.max_in_flight
                        || self.flights.iter().all(|&(u, _)| u == unit),
                    "more than max_in_flight attempts in flight: {:?}",
                    self.flights
                );
            }
            Command::Delivered { unit, lane } | Command::DeadLetter { unit, lane, .. } => {
                assert!(
                    self.resolved.insert((unit, lane)),
                    "{unit:?} resolved twice for {lane:?}"
                );
                assert!(
                    store.units.contains_key(&unit),
                    "{unit:?} resolved while not pending"
                );
                assert!(
                    self.in_flight.get(&lane) != Some(&unit),
                    "{unit:?} resolved on {lane:?} while its attempt is in flight"
                );
            }
            Command::HandBack { unit } => {
                assert!(
                    store.units.contains_key(&unit),
                    "{unit:?} handed back but not pending"
                );
            }
            Command::RetireLane { lane, .. } => {
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

struct World {
    s: Scheduler,
    store: ModelStore,
    now: Timestamp,
    lanes: Vec<LaneId>,
    c: Checker,
}

impl World {
    /// Executes the queued commands, checking each; returns whether there were any.
    fn execute(&mut self) -> bool {
        let mut any = false;
        let mut backs = Vec::new();
        while let Some(cmd) = self.s.poll_command() {
            self.c.check(&self.store, self.now, &cmd);
            if let Command::HandBack { unit } = cmd {
                backs.push(self.store.units[&unit].admit.seq);
            }
            self.store.apply(&cmd);
            any = true;
        }
        assert!(
            backs.windows(2).all(|p| p[0] <= p[1]),
            "hand-backs out of order: {backs:?}"
        );
        any
    }

    fn settle(&mut self) {
        loop {
            let mut any = self.execute();
            if let Some(claims) = self.s.poll_claim(self.now) {
                let chunks = self.store.claim(&claims);
                let report = self.s.handle_claimed(chunks, self.now);
                assert!(report.refused.is_empty(), "refused {:?}", report.refused);
                any = true;
            } else {
                // It may have handed back heads held in backoff to make room: executed
                // before the next claim.
                any |= self.execute();
            }
            assert!(
                self.s.admitted() <= self.c.config.max_units,
                "window exceeded: {} admitted, max_units {}",
                self.s.admitted(),
                self.c.config.max_units
            );
            assert!(
                self.s.admitted() <= 1 || self.s.admitted_bytes() <= self.c.config.max_bytes,
                "byte bound exceeded"
            );
            if !any {
                break;
            }
        }
    }

    fn discover(&mut self) {
        for lane in self.store.lanes_with_work() {
            let info = self.store.lane_info(lane);
            self.s.handle_lane(lane, info, self.now);
        }
        self.settle();
    }

    fn complete(&mut self, i: usize, o: Outcome) {
        let (unit, lane) = self.c.flights.remove(i);
        self.c.in_flight.remove(&lane);
        self.s
            .handle_outcome(unit, lane, o, self.now)
            .unwrap_or_else(|e| panic!("attempt of {unit:?} on {lane:?} in flight refused: {e}"));
        self.settle();
    }

    fn interrupt(&mut self) {
        self.s.handle_interrupt(self.now);
        let stale = std::mem::take(&mut self.c.flights);
        self.settle();
        assert!(
            self.c.in_flight.is_empty(),
            "attempts cut off in flight but not recorded as interrupted: {:?}",
            self.c.in_flight
        );
        assert_eq!(
            self.s.admitted(),
            0,
            "an interrupted pass keeps units admitted"
        );
        for (u, l) in stale {
            assert!(
                self.s
                    .handle_outcome(u, l, Outcome::Delivered, self.now)
                    .is_err(),
                "late completion of interrupted {u:?} accepted"
            );
            assert!(self.s.poll_command().is_none());
        }
    }
}

/// Reads the fuzz input a byte at a time; zeros once it is used up.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn outcome_of(code: u8, b: &mut Bytes<'_>) -> Outcome {
    let retry_after = |b: &mut Bytes<'_>| match b.byte() % 4 {
        0 => None,
        1 => Some(Duration::ZERO),
        2 => Some(Duration::from_secs(u64::from(b.byte()))),
        _ => Some(Duration::from_millis(u64::from(b.u16()) * 100)),
    };
    match code % 16 {
        0..=6 => Outcome::Delivered,
        7..=9 => Outcome::Transient {
            retry_after: retry_after(b),
        },
        10 | 11 => Outcome::Throttled {
            retry_after: retry_after(b),
        },
        12 => Outcome::Permanent,
        13 => Outcome::Gone,
        14 => Outcome::Refused,
        _ => Outcome::NotSent,
    }
}

fn config_of(b: &mut Bytes<'_>) -> Config {
    let flags = b.byte();
    let sizes = b.byte();
    let attempts = b.byte();
    Config {
        max_units: 1 + usize::from(sizes % 8),
        max_per_lane: 1 + u32::from(sizes / 8 % 3),
        max_bytes: 100 + 50 * u64::from(sizes / 24 % 8),
        max_in_flight: 1 + usize::from(flags % 4),
        pass_attempts: 1 + u32::from(attempts % 4),
        max_attempts: 1 + u32::from(attempts / 4 % 6),
        max_throttled_level: u32::from(attempts / 24 % 3),
        jitter_percent: if flags & 4 != 0 { 20 } else { 0 },
        retire_on_gone: flags & 8 != 0,
        max_age: (flags & 16 != 0).then(|| Duration::from_secs(60 * u64::from(1 + flags / 32))),
        ..Config::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    let config = config_of(&mut b);
    let seed = u64::from(b.byte());
    let mut s = Scheduler::new(config.clone(), seed);
    let lanes: Vec<LaneId> = (0..LANES)
        .map(|i| {
            s.lane(&LaneKey::from_canonical(
                format!("http://l{i}.test/inbox"),
                None,
            ))
        })
        .collect();
    let mut w = World {
        s,
        store: ModelStore::default(),
        now: T0,
        lanes,
        c: Checker {
            in_flight: BTreeMap::new(),
            flights: Vec::new(),
            resolved: BTreeSet::new(),
            config,
        },
    };
    let mut enqueued: BTreeSet<(UnitId, LaneId)> = BTreeSet::new();

    let mut ops = 0;
    while !b.is_empty() && ops < MAX_OPS {
        ops += 1;
        match b.byte() % 12 {
            0 | 1 => {
                // Enqueue a row to a non-empty subset of the 4 lanes.
                let mask = b.byte();
                let subset = (mask % 15) + 1;
                let joined = mask & 0x10 != 0;
                let bytes = 50 + 25 * u32::from(mask >> 5);
                let ls: Vec<LaneId> = (0..LANES)
                    .filter(|i| subset & (1 << i) != 0)
                    .map(|i| w.lanes[i])
                    .collect();
                for u in w.store.enqueue(&ls, joined, bytes, w.now) {
                    for s in &w.store.units[&u].admit.slots {
                        enqueued.insert((u, s.lane));
                    }
                }
            }
            2 => w.discover(),
            3..=5 => {
                let pick = usize::from(b.byte());
                let code = b.byte();
                if !w.c.flights.is_empty() {
                    let i = pick % w.c.flights.len();
                    let o = outcome_of(code, &mut b);
                    w.complete(i, o);
                }
            }
            6 => {
                let ms = u64::from(b.u16()) * 4;
                w.now = w.now + Duration::from_millis(ms);
                w.s.handle_timeout(w.now);
                w.settle();
            }
            7 => {
                // Jump to the next deadline, if any.
                if let Some(t) = w.s.poll_timeout() {
                    w.now = w.now.max(t);
                    w.s.handle_timeout(w.now);
                    w.settle();
                }
            }
            8 => {
                // Time going backwards is clamped: nothing fires, nothing breaks.
                let earlier = w
                    .now
                    .saturating_sub(Duration::from_millis(u64::from(b.u16())));
                w.s.handle_timeout(earlier);
                w.settle();
            }
            9 => match b.byte() % 3 {
                0 => w.interrupt(),
                1 => {
                    w.s.handle_stop(w.now);
                    w.settle();
                }
                _ => {
                    if w.s.is_done(w.now) {
                        w.s.handle_pass_end(w.now);
                        w.settle();
                        assert_eq!(w.s.admitted(), 0, "pass end leaves nothing admitted");
                    }
                }
            },
            10 => {
                // A completion of an attempt that is not in flight is refused, changes nothing.
                let unit = UnitId(u64::from(b.byte() % 64));
                let lane = w.lanes[usize::from(b.byte()) % LANES];
                if !w.c.flights.iter().any(|&(u, l)| u == unit && l == lane) {
                    assert!(
                        w.s.handle_outcome(unit, lane, Outcome::Delivered, w.now)
                            .is_err(),
                        "completion of {unit:?} on {lane:?}, not in flight, accepted"
                    );
                    assert!(w.s.poll_command().is_none());
                }
            }
            _ => {
                // A chunk nobody asked for never admits anything.
                let lane = w.lanes[usize::from(b.byte()) % LANES];
                let report = w.s.handle_claimed(
                    vec![LaneChunk {
                        lane,
                        units: vec![],
                        exhausted: true,
                    }],
                    w.now,
                );
                assert_eq!(report.admitted, 0, "an unasked chunk admitted units");
                w.settle();
            }
        }
    }

    // Quiescence: every recipient answers from now on; passes run until the store is empty.
    for _ in 0..10_000 {
        if w.store.units.is_empty() {
            break;
        }
        if !w.c.flights.is_empty() {
            w.complete(0, Outcome::Delivered);
            continue;
        }
        if w.s.is_done(w.now) {
            w.s.handle_pass_end(w.now);
            w.settle();
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
            w.discover();
            continue;
        }
        if let Some(t) = w.s.poll_timeout() {
            w.now = w.now.max(t);
        }
        w.s.handle_timeout(w.now);
        w.settle();
    }
    assert!(
        w.store.units.is_empty(),
        "not quiescent: {} units left",
        w.store.units.len()
    );
    assert_eq!(
        w.c.resolved, enqueued,
        "not every enqueued delivery was resolved exactly once"
    );
});
