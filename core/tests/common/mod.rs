//! A model of the store for driving the scheduler in tests: per-lane FIFO of pending units,
//! claims at lane heads, and the effects of the scheduler's commands.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use outbox_lanes_core::{
    Admit, AdmitSlot, Command, Config, DeadReason, LaneChunk, LaneClaim, LaneControl, LaneId,
    LaneInfo, LaneKey, Scheduler, Seq, Timestamp, UnitId,
};

pub const T0: Timestamp = Timestamp::from_secs(1_000_000);

#[derive(Clone, Debug)]
pub struct StoredUnit {
    pub admit: Admit,
    pub resolved: Vec<bool>,
}

#[derive(Clone, Debug, Default)]
pub struct ModelStore {
    pub units: BTreeMap<UnitId, StoredUnit>,
    pub lane_state: BTreeMap<LaneId, LaneInfo>,
    pub next_id: u64,
    pub next_seq: u64,
    pub delivered: Vec<(UnitId, LaneId)>,
    pub dead: Vec<(UnitId, LaneId, DeadReason)>,
    /// Lanes an operator paused: a claim reads nothing of them.
    pub paused: BTreeSet<LaneId>,
}

impl ModelStore {
    /// One row: a unit per lane, or one joined unit over all of them.
    pub fn enqueue(
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

    /// Lanes with units that are not paused (a runtime skips paused lanes at discovery).
    pub fn lanes_with_work(&self) -> BTreeSet<LaneId> {
        self.units
            .values()
            .flat_map(|u| u.admit.slots.iter().map(|s| s.lane))
            .filter(|l| !self.paused.contains(l))
            .collect()
    }

    pub fn lane_info(&self, lane: LaneId) -> LaneInfo {
        self.lane_state.get(&lane).copied().unwrap_or_default()
    }

    /// What discovery says of `lane`: its state and how many units it holds (the start
    /// order's weight).
    pub fn discovery_info(&self, lane: LaneId) -> LaneInfo {
        LaneInfo {
            pending: u32::try_from(self.pending_in(lane).len()).unwrap_or(u32::MAX),
            ..self.lane_info(lane)
        }
    }

    pub fn pending_in(&self, lane: LaneId) -> Vec<&StoredUnit> {
        let mut v: Vec<&StoredUnit> = self
            .units
            .values()
            .filter(|u| u.admit.slots.iter().any(|s| s.lane == lane))
            .collect();
        v.sort_by_key(|u| u.admit.seq);
        v
    }

    pub fn claim(&self, claims: &[LaneClaim]) -> Vec<LaneChunk> {
        claims
            .iter()
            .map(|c| {
                let paused = self.paused.contains(&c.lane);
                let units: Vec<Admit> = self
                    .pending_in(c.lane)
                    .into_iter()
                    .filter(|_| !paused)
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

    pub fn apply(&mut self, cmd: &Command) {
        match *cmd {
            Command::Start { .. }
            | Command::Hold { .. }
            | Command::HandBack { .. }
            | Command::Interrupted { .. } => {}
            Command::Delivered { unit, lane } => {
                self.delivered.push((unit, lane));
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
            Command::DeadLetter { unit, lane, reason } => {
                self.dead.push((unit, lane, reason));
                self.resolve(unit, lane);
            }
            Command::RetireLane { lane, reason } => {
                for id in self.unresolved_in(lane) {
                    self.dead.push((id, lane, reason));
                    self.resolve(id, lane);
                }
            }
        }
    }
}

impl ModelStore {
    /// Like [`ModelStore::apply`], except that `RetireLane` dead-letters only the recipients
    /// of the lane that are still pending (a joined unit already served on the lane keeps
    /// that recipient delivered).
    pub fn apply_exact(&mut self, cmd: &Command) {
        match *cmd {
            Command::RetireLane { lane, reason } => {
                for id in self.unresolved_in(lane) {
                    self.dead.push((id, lane, reason));
                    self.resolve(id, lane);
                }
            }
            _ => self.apply(cmd),
        }
    }

    /// The units still pending for `lane`'s recipient, in `seq` order.
    pub fn unresolved_in(&self, lane: LaneId) -> Vec<UnitId> {
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

    /// An operator's purge (`limit` None) or skip-head (`Some(1)`): the first pending units of
    /// `lane` are dead-lettered; a skip also clears the lane's backoff.
    pub fn operator_dead_letters(&mut self, lane: LaneId, limit: Option<usize>) -> Vec<UnitId> {
        let units: Vec<UnitId> = self
            .unresolved_in(lane)
            .into_iter()
            .take(limit.unwrap_or(usize::MAX))
            .collect();
        let reason = if limit.is_some() {
            DeadReason::Skipped
        } else {
            DeadReason::Purged
        };
        for &id in &units {
            self.dead.push((id, lane, reason));
            self.resolve(id, lane);
        }
        if limit.is_some() {
            let e = self.lane_state.entry(lane).or_default();
            e.not_before = None;
            e.level = 0;
        }
        units
    }

    /// What a pass reads of `lane` after an operator acted on it.
    pub fn lane_control(&self, lane: LaneId) -> LaneControl {
        LaneControl {
            info: self.lane_info(lane),
            paused: self.paused.contains(&lane),
            pending: !self.unresolved_in(lane).is_empty(),
        }
    }

    /// The persisted attempt count of `unit` for `lane`, if it is still stored.
    pub fn attempts(&self, unit: UnitId, lane: LaneId) -> Option<u32> {
        let u = self.units.get(&unit)?;
        u.admit
            .slots
            .iter()
            .find(|s| s.lane == lane)
            .map(|s| s.attempts)
    }
}

/// The scheduler, the model store, a virtual clock and the transcript of commands.
pub struct World {
    pub s: Scheduler,
    pub store: ModelStore,
    pub now: Timestamp,
    pub names: BTreeMap<LaneId, String>,
    pub ids: BTreeMap<String, LaneId>,
    pub log: Vec<Command>,
}

pub fn transcript_config() -> Config {
    Config {
        jitter_percent: 0,
        ..Config::default()
    }
}

impl World {
    pub fn new(config: Config) -> Self {
        World {
            s: Scheduler::new(config, 1),
            store: ModelStore::default(),
            now: T0,
            names: BTreeMap::new(),
            ids: BTreeMap::new(),
            log: Vec::new(),
        }
    }

    /// A world whose scheduler draws its jitter from `seed`.
    pub fn with_seed(config: Config, seed: u64) -> Self {
        World {
            s: Scheduler::new(config, seed),
            ..World::new(Config::default())
        }
    }

    /// Starts the next pass at `now` (after [`World::end_pass`]) as a runtime does: a new
    /// scheduler (jitter from `seed`) that knows only what the store persisted, its lanes
    /// interned in the same order, discovering the lanes with work.
    pub fn new_pass(&mut self, seed: u64) {
        self.s = Scheduler::new(self.s.config().clone(), seed);
        for (&id, name) in &self.names {
            let key = LaneKey::from_canonical(format!("http://{name}.test/inbox"), None);
            assert_eq!(self.s.lane(&key), id, "lanes interned in the same order");
        }
        self.discover();
    }

    pub fn lane(&mut self, name: &str) -> LaneId {
        if let Some(&l) = self.ids.get(name) {
            return l;
        }
        let key = LaneKey::from_canonical(format!("http://{name}.test/inbox"), None);
        let l = self.s.lane(&key);
        self.names.insert(l, name.to_string());
        self.ids.insert(name.to_string(), l);
        l
    }

    /// Enqueue one row to the named lanes.
    pub fn enqueue(&mut self, lanes: &[&str], joined: bool) -> Vec<UnitId> {
        let ids: Vec<LaneId> = lanes.iter().map(|n| self.lane(n)).collect();
        self.store.enqueue(&ids, joined, 100, self.now)
    }

    /// Tells the scheduler which lanes have work (a pass start or a wake-up).
    pub fn discover(&mut self) {
        for lane in self.store.lanes_with_work() {
            let info = self.store.lane_info(lane);
            self.s.handle_lane(lane, info, self.now);
        }
        self.settle();
    }

    /// Drains commands into the store and the log, and answers claims, until quiet.
    pub fn settle(&mut self) {
        loop {
            let mut any = self.execute();
            if let Some(claims) = self.s.poll_claim(self.now) {
                let chunks = self.store.claim(&claims);
                let report = self.s.handle_claimed(chunks, self.now);
                assert!(report.refused.is_empty(), "refused: {:?}", report.refused);
                any = true;
            } else {
                // Hand-backs of heads held in backoff, to make room, come before the claim.
                any |= self.execute();
            }
            if !any {
                break;
            }
        }
    }

    /// Drains the queued commands into the store and the log; returns whether there were any.
    fn execute(&mut self) -> bool {
        let mut any = false;
        while let Some(c) = self.s.poll_command() {
            self.store.apply(&c);
            self.log.push(c);
            any = true;
        }
        any
    }

    pub fn outcome(&mut self, unit: UnitId, lane: &str, o: outbox_lanes_core::Outcome) {
        let l = self.lane(lane);
        self.s
            .handle_outcome(unit, l, o, self.now)
            .unwrap_or_else(|e| panic!("outcome for {unit:?} on {lane}: {e}"));
        self.settle();
    }

    pub fn ok(&mut self, unit: UnitId, lane: &str) {
        self.outcome(unit, lane, outbox_lanes_core::Outcome::Delivered);
    }

    pub fn fail(&mut self, unit: UnitId, lane: &str) {
        self.outcome(
            unit,
            lane,
            outbox_lanes_core::Outcome::Transient { retry_after: None },
        );
    }

    pub fn advance(&mut self, d: Duration) {
        self.now = self.now + d;
        self.s.handle_timeout(self.now);
        self.settle();
    }

    /// Jump to the scheduler's next deadline.
    pub fn jump_to_next_timeout(&mut self) -> Timestamp {
        let t = self.s.poll_timeout().expect("a deadline is pending");
        self.now = self.now.max(t);
        self.s.handle_timeout(self.now);
        self.settle();
        t
    }

    /// An operator acted on the named lane; the pass is told its state now.
    pub fn control(&mut self, lane: &str) {
        let l = self.lane(lane);
        let control = self.store.lane_control(l);
        self.s.handle_lane_control(l, control, self.now);
        self.settle();
    }

    pub fn end_pass(&mut self) {
        self.s.handle_pass_end(self.now);
        self.settle();
    }

    /// The log since the last call, rendered one command per line.
    pub fn take(&mut self) -> Vec<String> {
        let log = std::mem::take(&mut self.log);
        log.iter().map(|c| self.render(c)).collect()
    }

    pub fn render(&self, c: &Command) -> String {
        let n = |l: &LaneId| {
            self.names
                .get(l)
                .cloned()
                .unwrap_or_else(|| format!("{l:?}"))
        };
        let mut s = String::new();
        match c {
            Command::Start {
                unit,
                lane,
                attempt,
            } => write!(s, "start {unit:?} {} #{attempt}", n(lane)),
            Command::Delivered { unit, lane } => write!(s, "delivered {unit:?} {}", n(lane)),
            Command::RecordAttempt {
                unit,
                lane,
                attempts,
                counted,
            } => write!(
                s,
                "attempt {unit:?} {} {attempts}{}",
                n(lane),
                if *counted { "" } else { " uncounted" }
            ),
            Command::Interrupted {
                unit,
                lane,
                attempts,
            } => write!(s, "interrupted {unit:?} {} {attempts}", n(lane)),
            Command::Hold { unit, lane, reason } => {
                write!(s, "hold {unit:?} {} {reason:?}", n(lane))
            }
            Command::LaneBackoff {
                lane,
                not_before,
                level,
            } => write!(
                s,
                "backoff {} until +{}s level {level}",
                n(lane),
                not_before.saturating_duration_since(T0).as_secs_f64()
            ),
            Command::LaneOpen { lane } => write!(s, "open {}", n(lane)),
            Command::LaneFailing {
                lane,
                since: Some(since),
            } => write!(
                s,
                "failing {} since +{}s",
                n(lane),
                since.saturating_duration_since(T0).as_secs_f64()
            ),
            Command::LaneFailing { lane, since: None } => write!(s, "answering {}", n(lane)),
            Command::LaneRestart { lane } => write!(s, "restart {}", n(lane)),
            Command::LaneUnavailable { lane, .. } => write!(s, "unavailable {}", n(lane)),
            Command::DeadLetter { unit, lane, reason } => {
                write!(s, "dead {unit:?} {} {reason}", n(lane))
            }
            Command::RetireLane {
                lane,
                reason: DeadReason::LaneRetired,
            } => write!(s, "retire {}", n(lane)),
            Command::RetireLane { lane, reason } => write!(s, "retire {} {reason}", n(lane)),
            Command::HandBack { unit } => write!(s, "back {unit:?}"),
        }
        .expect("writing to a String");
        s
    }
}
