//! The lane scheduler: one actor's pass, from admitted units and completions to commands.

use alloc::collections::{BinaryHeap, VecDeque};
use alloc::vec::Vec;
use core::cmp::Reverse;
use core::fmt;
use core::hash::{BuildHasherDefault, Hasher};
use core::time::Duration;

use hashbrown::HashMap;
use smallvec::SmallVec;

use crate::config::{Config, MAX_BACKOFF_LEVEL, jittered};
use crate::ids::{LaneId, Seq, UnitId};
use crate::lane::{LaneKey, LaneTable};
use crate::outcome::{DeadReason, Outcome};
use crate::rng::Rng;
use crate::time::Timestamp;

/// One recipient of a unit, as read from the store at admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmitSlot {
    /// The recipient's lane.
    pub lane: LaneId,
    /// Attempts already persisted for this recipient before the pass (OL-5).
    pub attempts: u32,
    /// Whether this recipient of a joined unit was already served in an earlier pass (OL-20).
    pub served: bool,
}

/// A unit as read from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admit {
    /// The store-assigned id.
    pub id: UnitId,
    /// The enqueue sequence number of its row.
    pub seq: Seq,
    /// Payload size in bytes, counted against [`Config::max_bytes`].
    pub bytes: u32,
    /// When its row was enqueued (for [`Config::max_age`]).
    pub enqueued_at: Timestamp,
    /// Its recipients: one for a normal unit, several for a joined one.
    pub slots: SmallVec<[AdmitSlot; 1]>,
}

impl Admit {
    /// A single-lane unit with no attempts so far.
    pub fn single(id: UnitId, seq: Seq, lane: LaneId) -> Self {
        Admit {
            id,
            seq,
            bytes: 0,
            enqueued_at: Timestamp::EPOCH,
            slots: smallvec::smallvec![AdmitSlot {
                lane,
                attempts: 0,
                served: false
            }],
        }
    }

    /// A joined unit occupying `lanes`, with no attempts so far.
    pub fn joined(id: UnitId, seq: Seq, lanes: &[LaneId]) -> Self {
        Admit {
            id,
            seq,
            bytes: 0,
            enqueued_at: Timestamp::EPOCH,
            slots: lanes
                .iter()
                .map(|&lane| AdmitSlot {
                    lane,
                    attempts: 0,
                    served: false,
                })
                .collect(),
        }
    }
}

/// Persisted state of a lane, from the store (OL-11).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaneInfo {
    /// The lane is in backoff until then.
    pub not_before: Option<Timestamp>,
    /// Consecutive failed stalls/probes, at most [`crate::config::MAX_BACKOFF_LEVEL`]
    /// (a larger stored value is read as that); above zero the head is attempted once (a
    /// probe).
    pub level: u32,
    /// Strict lanes block on a failing head instead of dead-lettering it (OL-8).
    pub strict: bool,
}

/// Read the next units of `lane` with `seq >= from`, at most `limit` of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneClaim {
    /// The lane to read.
    pub lane: LaneId,
    /// The first sequence number wanted.
    pub from: Seq,
    /// The most units wanted.
    pub limit: u32,
}

/// What the store returned for one [`LaneClaim`], in `seq` order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneChunk {
    /// The lane read.
    pub lane: LaneId,
    /// Its next pending units, in `seq` order, each with all of its lanes.
    pub units: Vec<Admit>,
    /// Fewer than `limit` units came back: the lane had nothing more at that moment.
    pub exhausted: bool,
}

/// Why a unit (for one recipient) is held, not attempted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldReason {
    /// It failed [`Config::pass_attempts`] times in this pass, or its probe failed: its lane
    /// is in backoff and it waits for the lane's `not_before` (OL-7, OL-11).
    Stalled,
    /// A strict lane's head that would have been dead-lettered: the lane stays blocked until
    /// an operator acts (OL-8).
    Blocked,
}

/// A command for the runtime to execute, in order.
///
/// Runtimes match it exhaustively; a new variant must not be silently ignored.
#[must_use = "every command must be executed by the runtime"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Deliver `unit` to the recipient of `lane`; `attempt` is its 1-based attempt number.
    Start {
        /// The unit.
        unit: UnitId,
        /// The recipient's lane.
        lane: LaneId,
        /// The number of this attempt: persisted attempts so far plus one.
        attempt: u32,
    },
    /// The recipient of `lane` has `unit`: acknowledge it (may be group-committed).
    Delivered {
        /// The unit.
        unit: UnitId,
        /// The recipient's lane.
        lane: LaneId,
    },
    /// Persist the attempt count of `unit` for `lane` (OL-5).
    RecordAttempt {
        /// The unit.
        unit: UnitId,
        /// The recipient's lane.
        lane: LaneId,
        /// The persisted count after this attempt.
        attempts: u32,
        /// Whether this attempt counted toward the maximum (throttled attempts do not).
        counted: bool,
    },
    /// `unit` is held for `lane` and will not be attempted until the lane reopens.
    Hold {
        /// The unit.
        unit: UnitId,
        /// The lane it holds.
        lane: LaneId,
        /// Why.
        reason: HoldReason,
    },
    /// Persist the lane's backoff: not attempted before `not_before` (OL-11).
    LaneBackoff {
        /// The lane.
        lane: LaneId,
        /// The end of the backoff.
        not_before: Timestamp,
        /// The backoff level.
        level: u32,
    },
    /// The lane answered again: clear its persisted backoff.
    LaneOpen {
        /// The lane.
        lane: LaneId,
    },
    /// Move `unit` (for `lane`'s recipient) to the dead letters. It must be durable before
    /// the runtime executes the next command (OL-16).
    DeadLetter {
        /// The unit.
        unit: UnitId,
        /// The recipient it failed for.
        lane: LaneId,
        /// Why.
        reason: DeadReason,
    },
    /// Dead-letter every pending unit of `lane` as `lane_retired` (410 Gone, OL-9). Durable
    /// before the next command.
    RetireLane {
        /// The lane.
        lane: LaneId,
    },
    /// `unit` goes back to the store unchanged: its lease is released and it keeps its
    /// position (OL-10, OL-14).
    HandBack {
        /// The unit.
        unit: UnitId,
    },
}

/// A unit the scheduler refused at admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdmitError {
    /// The unit is already admitted.
    Duplicate(UnitId),
    /// The chunk's lane is not among the unit's lanes.
    NotInLane(UnitId),
    /// The unit is not after the units already admitted in its lane.
    OutOfOrder(UnitId),
    /// The unit has no lane.
    NoLane(UnitId),
    /// The chunk answers no outstanding claim for its lane.
    Unclaimed(LaneId),
}

impl fmt::Display for AdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdmitError::Duplicate(u) => write!(f, "unit {u} is already admitted"),
            AdmitError::NotInLane(u) => write!(f, "unit {u} does not occupy the claimed lane"),
            AdmitError::OutOfOrder(u) => {
                write!(f, "unit {u} is not after its lane's admitted units")
            }
            AdmitError::NoLane(u) => write!(f, "unit {u} has no lane"),
            AdmitError::Unclaimed(l) => write!(f, "lane {l:?} has no outstanding claim"),
        }
    }
}

/// An event the scheduler could not apply; it changed nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventError {
    /// No admitted unit has this id (never admitted, already finished or handed back).
    UnknownUnit(UnitId),
    /// The unit does not occupy this lane.
    UnknownLane(UnitId, LaneId),
    /// The unit has no attempt in flight for this lane.
    NotInFlight(UnitId, LaneId),
}

impl fmt::Display for EventError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventError::UnknownUnit(u) => write!(f, "unit {u} is not admitted"),
            EventError::UnknownLane(u, l) => write!(f, "unit {u} does not occupy lane {l:?}"),
            EventError::NotInFlight(u, l) => {
                write!(f, "unit {u} has no attempt in flight on lane {l:?}")
            }
        }
    }
}

/// What [`Scheduler::handle_claimed`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimReport {
    /// Units admitted.
    pub admitted: usize,
    /// Units refused (the rest of their chunk is left for a later claim).
    pub refused: Vec<AdmitError>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    InFlight,
    RetryAt(Timestamp),
    Stalled,
    Blocked,
    Served,
    Dead,
}

impl Phase {
    fn resolved(self) -> bool {
        matches!(self, Phase::Served | Phase::Dead)
    }
}

#[derive(Clone, Debug)]
struct Slot {
    lane: LaneId,
    attempts: u32,
    pass_failures: u32,
    /// Attempts of this pass that never left (`Outcome::NotSent`): they pace the retry, and
    /// count for nothing else.
    not_sent: u32,
    phase: Phase,
}

#[derive(Clone, Debug)]
struct Unit {
    id: UnitId,
    seq: Seq,
    bytes: u32,
    enqueued_at: Timestamp,
    slots: SmallVec<[Slot; 1]>,
    started: bool,
    live: bool,
}

#[derive(Clone, Debug, Default)]
struct Lane {
    /// Admitted units of this lane, in seq order (slab indices).
    queue: VecDeque<u32>,
    in_flight: bool,
    not_before: Option<Timestamp>,
    level: u32,
    strict: bool,
    /// The store may hold units of this lane at or after `next_from`.
    more: bool,
    next_from: Seq,
    /// Closed for admission: its head is stalled or blocked.
    stalled: bool,
    blocked: bool,
    in_claim_queue: bool,
    /// A claim for this lane is outstanding, for this many units…
    planned: Option<u32>,
    /// …from this sequence number on.
    planned_from: Seq,
    /// The read reached this joined unit, which is not admitted yet: read nothing further.
    waiting_on: Option<UnitId>,
    /// Its next unit did not fit the window: read nothing until a unit leaves it.
    room_wait: bool,
}

impl Lane {
    fn open(&self, now: Timestamp) -> bool {
        self.not_before.is_none_or(|t| t <= now)
    }
}

/// A joined unit that some of its lanes' reads have reached.
#[derive(Clone, Debug)]
struct Reached {
    admit: Admit,
    lanes: SmallVec<[LaneId; 4]>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Lane(u32),
    Retry(u32, UnitId),
}

/// A multiplicative hasher for store-assigned unit ids (integers the store picks, not
/// strings from outside, so a keyed hash is not needed here).
#[derive(Default, Clone, Copy)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, n: u64) {
        let x = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 29);
    }
}

/// The lane scheduler for one actor's outbox pass.
///
/// It keeps the ordering rules of the design (OL-1 … OL-20) for the units a runtime admits,
/// and tells the runtime what to do through [`Command`]s. It performs no I/O and reads no
/// clock: every input takes `now`, and deadlines come back from [`Scheduler::poll_timeout`].
///
/// # The driving loop
///
/// After **every** `handle_*` call, drain [`Scheduler::poll_command`] until `None` and
/// execute the commands in order; then ask [`Scheduler::poll_claim`] for lanes to read from
/// the store, and wait for the earliest of a completion, new rows, or
/// [`Scheduler::poll_timeout`]. The pass is over when [`Scheduler::is_done`] says so; then
/// [`Scheduler::handle_pass_end`] hands every waiting unit back.
///
/// ```
/// use outbox_lanes_core::{
///     Admit, Command, Config, LaneChunk, LaneInfo, LaneKey, Outcome, Scheduler, Seq,
///     Timestamp, UnitId,
/// };
///
/// let mut sched = Scheduler::new(Config::default(), 7);
/// let now = Timestamp::from_secs(1_700_000_000);
/// let lane = sched.lane(&LaneKey::new("https://b.example/inbox", None).unwrap());
/// // The store said this lane has pending units.
/// sched.handle_lane(lane, LaneInfo::default(), now);
///
/// let mut delivered = Vec::new();
/// while !sched.is_done(now) {
///     // Read lane heads from the store (here: two units, then nothing more).
///     if let Some(claims) = sched.poll_claim(now) {
///         let chunks = claims
///             .iter()
///             .map(|c| LaneChunk {
///                 lane: c.lane,
///                 units: vec![Admit::single(UnitId(1), Seq(1), c.lane), Admit::single(UnitId(2), Seq(2), c.lane)],
///                 exhausted: true,
///             })
///             .collect();
///         let _report = sched.handle_claimed(chunks, now);
///     }
///     while let Some(cmd) = sched.poll_command() {
///         match cmd {
///             Command::Start { unit, lane, .. } => {
///                 // POST the payload here; then report what happened.
///                 sched.handle_outcome(unit, lane, Outcome::Delivered, now).unwrap();
///             }
///             Command::Delivered { unit, .. } => delivered.push(unit),
///             Command::RecordAttempt { .. }
///             | Command::Hold { .. }
///             | Command::LaneBackoff { .. }
///             | Command::LaneOpen { .. }
///             | Command::DeadLetter { .. }
///             | Command::RetireLane { .. }
///             | Command::HandBack { .. } => {}
///         }
///     }
/// }
/// sched.handle_pass_end(now);
/// assert_eq!(delivered, [UnitId(1), UnitId(2)]);
/// ```
#[derive(Debug)]
pub struct Scheduler {
    config: Config,
    rng: Rng,
    now: Timestamp,
    table: LaneTable<LaneKey>,
    lanes: Vec<Lane>,
    units: Vec<Unit>,
    free: Vec<u32>,
    index: HashMap<UnitId, u32, BuildHasherDefault<IdHasher>>,
    joined: HashMap<UnitId, Reached, BuildHasherDefault<IdHasher>>,
    commands: VecDeque<Command>,
    ready: VecDeque<(u32, UnitId)>,
    capacity_wait: VecDeque<(u32, UnitId)>,
    /// Lanes to read that had nothing admitted when they were queued: served first.
    hungry_queue: VecDeque<LaneId>,
    /// Lanes to read that only refill.
    claim_queue: VecDeque<LaneId>,
    room_waiters: Vec<LaneId>,
    timers: BinaryHeap<Reverse<(Timestamp, Timer)>>,
    admitted: usize,
    admitted_bytes: u64,
    /// Lanes with at least one admitted unit.
    occupied: usize,
    reserved: usize,
    in_flight: usize,
    retry_pending: usize,
    stopping: bool,
}

impl Scheduler {
    /// A scheduler with `config`; `seed` drives the retry jitter and keys the lane hasher, so
    /// the same seed replays the same run.
    pub fn new(config: Config, seed: u64) -> Self {
        Scheduler {
            config,
            rng: Rng::new(seed),
            now: Timestamp::EPOCH,
            table: LaneTable::new(seed),
            lanes: Vec::new(),
            units: Vec::new(),
            free: Vec::new(),
            index: HashMap::default(),
            joined: HashMap::default(),
            commands: VecDeque::new(),
            ready: VecDeque::new(),
            capacity_wait: VecDeque::new(),
            hungry_queue: VecDeque::new(),
            claim_queue: VecDeque::new(),
            room_waiters: Vec::new(),
            timers: BinaryHeap::new(),
            admitted: 0,
            admitted_bytes: 0,
            occupied: 0,
            reserved: 0,
            in_flight: 0,
            retry_pending: 0,
            stopping: false,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The lane id of `key`, interning it on first sight.
    pub fn lane(&mut self, key: &LaneKey) -> LaneId {
        let id = self.table.intern(key);
        if self.lanes.len() <= id.index() {
            self.lanes.resize_with(id.index() + 1, Lane::default);
        }
        id
    }

    /// The key of a lane interned by this scheduler.
    pub fn lane_key(&self, lane: LaneId) -> Option<&LaneKey> {
        self.table.key(lane)
    }

    /// Units admitted and not yet finished or handed back.
    pub fn admitted(&self) -> usize {
        self.admitted
    }

    /// Payload bytes of the admitted units.
    pub fn admitted_bytes(&self) -> u64 {
        self.admitted_bytes
    }

    /// Attempts in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The store has pending units in `lane` (discovered at pass start, or after new rows
    /// were enqueued); `info` is its persisted state. During a pass the scheduler's own view
    /// of a lane it has admitted units for wins over `info`.
    pub fn handle_lane(&mut self, lane: LaneId, info: LaneInfo, now: Timestamp) {
        self.advance(now);
        let Some(l) = self.lanes.get_mut(lane.index()) else {
            return;
        };
        l.strict = info.strict;
        let idle = l.queue.is_empty() && !l.in_flight && !l.stalled;
        if idle {
            l.not_before = info.not_before;
            l.level = info.level.min(MAX_BACKOFF_LEVEL);
        }
        l.more = true;
        if let Some(t) = l.not_before.filter(|&t| t > self.now) {
            self.timers.push(Reverse((t, Timer::Lane(lane.0))));
        }
        self.consider_claim(lane);
        self.pump();
    }

    /// The lanes to read from the store now, if any. The room they ask for is reserved
    /// until [`Scheduler::handle_claimed`] (or [`Scheduler::handle_claim_failed`]).
    ///
    /// Breadth first: the window is shared by the lanes with work, each up to a depth of
    /// `max_units / lanes` (at least 1, at most `max_per_lane`), and a lane with nothing
    /// admitted (nothing it could start) is read before a lane that only refills. With 1,000
    /// lanes and a window of 4,000 units each lane gets 4, not 250 lanes 16 each (which would
    /// leave 750 recipients idle while the in-flight window has room for them). A lane
    /// refills once it is down to half its depth, and only when the room for the whole refill
    /// is free: few, larger reads, not one read per unit that leaves the window.
    ///
    /// Its cost is the lanes it takes from its queues (each leaves them, read or not), not
    /// the length of the queues: with 10,000 lanes waiting and one unit of room, it looks at
    /// one or a few.
    pub fn poll_claim(&mut self, now: Timestamp) -> Option<Vec<LaneClaim>> {
        self.advance(now);
        if self.stopping {
            return None;
        }
        let mut room = self
            .config
            .max_units
            .saturating_sub(self.admitted + self.reserved);
        if room == 0 || (self.admitted > 0 && self.admitted_bytes >= self.config.max_bytes) {
            return None;
        }
        debug_assert_eq!(
            self.occupied,
            self.lanes.iter().filter(|l| !l.queue.is_empty()).count(),
            "the count of occupied lanes drifted"
        );
        // (Lanes queued as hungry may have become unclaimable since: they only make the
        // share and the depth smaller, never zero.)
        let hungry = self.hungry_queue.len();
        let depth = self.depth(hungry);
        let share = u32::try_from(room / hungry.max(1))
            .unwrap_or(u32::MAX)
            .max(1);
        let mut out = Vec::new();
        // Hungry lanes first, each its share (one unit at least) while there is room.
        while room > 0 {
            let Some(lane) = self.hungry_queue.pop_front() else {
                break;
            };
            let l = &mut self.lanes[lane.index()];
            l.in_claim_queue = false;
            let Some(limit) = Self::claimable(l, self.now, depth) else {
                continue;
            };
            let limit = limit
                .min(share)
                .min(u32::try_from(room).unwrap_or(u32::MAX));
            room -= limit as usize;
            out.push(self.plan(lane, limit));
        }
        // Then the refills, in their order, each only if the room holds all of it: the first
        // that does not fit waits at the front (its lane still has work admitted).
        while room > 0 {
            let Some(&lane) = self.claim_queue.front() else {
                break;
            };
            let l = &mut self.lanes[lane.index()];
            let Some(limit) = Self::claimable(l, self.now, depth) else {
                self.claim_queue.pop_front();
                l.in_claim_queue = false;
                continue;
            };
            // A lane that emptied while it waited here is hungry: it takes what there is.
            let limit = if l.queue.is_empty() {
                limit.min(u32::try_from(room).unwrap_or(u32::MAX))
            } else if limit as usize <= room {
                limit
            } else {
                break;
            };
            self.claim_queue.pop_front();
            l.in_claim_queue = false;
            room -= limit as usize;
            out.push(self.plan(lane, limit));
        }
        (!out.is_empty()).then_some(out)
    }

    /// Reserves `limit` units of room for a read of `lane`.
    fn plan(&mut self, lane: LaneId, limit: u32) -> LaneClaim {
        let l = &mut self.lanes[lane.index()];
        l.planned = Some(limit);
        l.planned_from = l.next_from;
        self.reserved += limit as usize;
        LaneClaim {
            lane,
            from: l.next_from,
            limit,
        }
    }

    /// A lane's share of the window: `max_units` over the lanes with work (those with units
    /// admitted, and `hungry` more waiting for their first), between 1 and `max_per_lane`.
    fn depth(&self, hungry: usize) -> u32 {
        let lanes = (self.occupied + hungry).max(1);
        u32::try_from(self.config.max_units / lanes)
            .unwrap_or(u32::MAX)
            .clamp(1, self.config.max_per_lane.max(1))
    }

    /// How many units `l` may be asked for now, up to `depth` admitted, or `None` if it must
    /// not be claimed.
    fn claimable(l: &Lane, now: Timestamp, depth: u32) -> Option<u32> {
        if !l.more
            || l.stalled
            || l.room_wait
            || l.planned.is_some()
            || l.waiting_on.is_some()
            || !l.open(now)
        {
            return None;
        }
        let queued = u32::try_from(l.queue.len()).unwrap_or(u32::MAX);
        // A lane in probe mode (backoff level above zero) gets its head only: a dead
        // recipient costs one probe per interval, not one per unit (OL-11).
        let cap = if l.level > 0 { 1 } else { depth.max(1) };
        // Refill a lane once it is down to half, not one unit at a time: fewer, larger reads.
        if queued > 0 && queued * 2 > cap {
            return None;
        }
        let room = cap.saturating_sub(queued);
        (room > 0).then_some(room)
    }

    /// The store could not answer the last claim: release the room it reserved. The lanes
    /// will be asked for again.
    pub fn handle_claim_failed(&mut self, now: Timestamp) {
        self.advance(now);
        for i in 0..self.lanes.len() {
            if let Some(limit) = self.lanes[i].planned.take() {
                self.reserved -= limit as usize;
                self.consider_claim(LaneId(i as u32));
            }
        }
    }

    /// The store's answer to the last [`Scheduler::poll_claim`]: for each lane, its next
    /// pending units in `seq` order.
    ///
    /// A joined unit is admitted only once the reads of all its lanes have reached it, so it
    /// always sits behind the earlier units of every lane (OL-3); a lane whose read reached
    /// one waits there, reading nothing further, until it is admitted. Units it refuses are
    /// listed in the report, and the rest of their chunk is left; the other chunks are
    /// admitted regardless.
    pub fn handle_claimed(&mut self, chunks: Vec<LaneChunk>, now: Timestamp) -> ClaimReport {
        self.advance(now);
        let mut report = ClaimReport::default();
        for chunk in chunks {
            let lane = chunk.lane;
            match self
                .lanes
                .get_mut(lane.index())
                .and_then(|l| l.planned.take())
            {
                Some(limit) => self.reserved -= limit as usize,
                None => {
                    report.refused.push(AdmitError::Unclaimed(lane));
                    continue;
                }
            }
            let l = &mut self.lanes[lane.index()];
            if l.next_from < l.planned_from {
                // Units of this lane were handed back while the read was outstanding: the
                // answer starts after them. Read the lane again from its new position.
                l.more = true;
                self.consider_claim(lane);
                continue;
            }
            let mut consumed = true;
            for u in &chunk.units {
                if let Err(e) = self.validate(u, lane) {
                    report.refused.push(e);
                    // Reading it again would only repeat it; the lane waits for the next
                    // discovery.
                    self.lanes[lane.index()].more = false;
                    consumed = false;
                    break;
                }
                if u.slots.len() > 1 {
                    // The lane waits at the joined unit until all its lanes have reached it.
                    consumed = false;
                    match self.reach_joined(u, lane) {
                        Ok(admitted) => report.admitted += usize::from(admitted),
                        Err(e) => {
                            report.refused.push(e);
                            self.lanes[lane.index()].more = false;
                        }
                    }
                    break;
                }
                if !self.room_for(u.bytes) {
                    let l = &mut self.lanes[lane.index()];
                    l.more = true;
                    if !l.room_wait {
                        // Read it again only once a unit leaves the window.
                        l.room_wait = true;
                        self.room_waiters.push(lane);
                    }
                    consumed = false;
                    break;
                }
                self.admit(u);
                report.admitted += 1;
            }
            if consumed {
                self.lanes[lane.index()].more = !chunk.exhausted;
                self.consider_claim(lane);
            }
        }
        self.pump();
        report
    }

    /// `lane`'s read reached joined unit `u`; admits it if that was its last lane and there
    /// is room. Returns whether it was admitted.
    fn reach_joined(&mut self, u: &Admit, lane: LaneId) -> Result<bool, AdmitError> {
        let entry = self.joined.entry(u.id).or_insert_with(|| Reached {
            admit: u.clone(),
            lanes: SmallVec::new(),
        });
        if entry.admit.seq != u.seq || entry.lanes.contains(&lane) {
            return Err(AdmitError::Duplicate(u.id));
        }
        entry.lanes.push(lane);
        let complete = entry.lanes.len() == entry.admit.slots.len();
        let l = &mut self.lanes[lane.index()];
        l.waiting_on = Some(u.id);
        l.more = true;
        l.next_from = u.seq;
        if !complete {
            // Its other lanes have work: they must read up to it.
            for s in &u.slots {
                if s.lane != lane {
                    self.lanes[s.lane.index()].more = true;
                    self.consider_claim(s.lane);
                }
            }
            return Ok(false);
        }
        Ok(self.admit_joined(u.id))
    }

    /// Admits a joined unit every lane of which has reached it, if there is room.
    fn admit_joined(&mut self, id: UnitId) -> bool {
        let Some(r) = self.joined.get(&id) else {
            return false;
        };
        if r.lanes.len() != r.admit.slots.len() || !self.room_for(r.admit.bytes) {
            return false;
        }
        let Some(r) = self.joined.remove(&id) else {
            return false;
        };
        for s in &r.admit.slots {
            self.lanes[s.lane.index()].waiting_on = None;
        }
        self.admit(&r.admit);
        true
    }

    /// Whether one more unit of `bytes` fits the window.
    fn room_for(&self, bytes: u32) -> bool {
        self.admitted < self.config.max_units.max(1) && self.bytes_fit(bytes)
    }

    /// Whether `seq` may be appended to `lane`'s admitted units.
    fn in_order(&self, lane: LaneId, seq: Seq) -> bool {
        let l = &self.lanes[lane.index()];
        seq >= l.next_from
            && l.queue
                .back()
                .is_none_or(|&back| self.units[back as usize].seq < seq)
    }

    /// Whether unit `idx` heads every lane it occupies.
    fn heads_all(&self, idx: u32) -> bool {
        self.units[idx as usize]
            .slots
            .iter()
            .all(|s| self.lanes[s.lane.index()].queue.front() == Some(&idx))
    }

    fn validate(&self, u: &Admit, lane: LaneId) -> Result<(), AdmitError> {
        if u.slots.is_empty() {
            return Err(AdmitError::NoLane(u.id));
        }
        if self.index.contains_key(&u.id) {
            return Err(AdmitError::Duplicate(u.id));
        }
        if !u.slots.iter().any(|s| s.lane == lane) {
            return Err(AdmitError::NotInLane(u.id));
        }
        for (i, s) in u.slots.iter().enumerate() {
            if s.lane.index() >= self.lanes.len() || u.slots[..i].iter().any(|o| o.lane == s.lane) {
                return Err(AdmitError::NoLane(u.id));
            }
        }
        if !self.in_order(lane, u.seq) {
            return Err(AdmitError::OutOfOrder(u.id));
        }
        Ok(())
    }

    fn bytes_fit(&self, bytes: u32) -> bool {
        self.admitted == 0 || self.admitted_bytes + u64::from(bytes) <= self.config.max_bytes
    }

    fn admit(&mut self, u: &Admit) {
        if u.slots.iter().all(|s| s.served) {
            // Nothing left to deliver (its last recipients were resolved while it waited to
            // be admitted): the store finished it with its last recipient.
            for s in &u.slots {
                self.consider_claim(s.lane);
            }
            return;
        }
        let unit = Unit {
            id: u.id,
            seq: u.seq,
            bytes: u.bytes,
            enqueued_at: u.enqueued_at,
            slots: u
                .slots
                .iter()
                .map(|s| Slot {
                    lane: s.lane,
                    attempts: s.attempts,
                    pass_failures: 0,
                    not_sent: 0,
                    phase: if s.served { Phase::Served } else { Phase::Idle },
                })
                .collect(),
            started: false,
            live: true,
        };
        let idx = match self.free.pop() {
            Some(i) => {
                self.units[i as usize] = unit;
                i
            }
            None => {
                self.units.push(unit);
                u32::try_from(self.units.len() - 1).expect("fewer than 2^32 admitted units")
            }
        };
        self.index.insert(u.id, idx);
        self.admitted += 1;
        self.admitted_bytes += u64::from(u.bytes);
        for s in &u.slots {
            let l = &mut self.lanes[s.lane.index()];
            if l.queue.is_empty() {
                self.occupied += 1;
            }
            l.queue.push_back(idx);
            l.next_from = Seq(u.seq.0.saturating_add(1)).max(l.next_from);
            if u.slots.len() > 1 {
                // A joined unit's lanes waited at it; they may read on.
                self.consider_claim(s.lane);
            }
        }
        if self.heads_all(idx) {
            self.ready.push_back((idx, u.id));
        }
    }

    /// The outcome of the attempt started for `unit` on `lane`.
    ///
    /// # Errors
    /// [`EventError`] when no such attempt is in flight (an unknown or finished unit, a
    /// second completion); nothing changes then.
    pub fn handle_outcome(
        &mut self,
        unit: UnitId,
        lane: LaneId,
        outcome: Outcome,
        now: Timestamp,
    ) -> Result<(), EventError> {
        // The input applies to the state the runtime saw: timers that fell due meanwhile
        // fire after it, so a stale answer never lands on a restarted attempt.
        self.set_now(now);
        let &idx = self.index.get(&unit).ok_or(EventError::UnknownUnit(unit))?;
        let s = self.units[idx as usize]
            .slots
            .iter()
            .position(|s| s.lane == lane)
            .ok_or(EventError::UnknownLane(unit, lane))?;
        if self.units[idx as usize].slots[s].phase != Phase::InFlight {
            return Err(EventError::NotInFlight(unit, lane));
        }
        self.lanes[lane.index()].in_flight = false;
        self.in_flight -= 1;
        self.units[idx as usize].slots[s].phase = Phase::Idle;

        match outcome {
            Outcome::Delivered => {
                self.units[idx as usize].slots[s].phase = Phase::Served;
                self.commands.push_back(Command::Delivered { unit, lane });
                self.reopen(lane);
                self.finish_if_resolved(idx);
            }
            Outcome::Throttled { retry_after } => {
                // Free below `max_throttled_level` (OL-5); from it on, a recipient that is
                // still throttling after a stall counts like a failing one, so it ends.
                if self.lanes[lane.index()].level >= self.config.max_throttled_level {
                    self.count_attempt(idx, s);
                    self.failed(idx, s, retry_after, true);
                } else {
                    let attempts = self.units[idx as usize].slots[s].attempts;
                    self.commands.push_back(Command::RecordAttempt {
                        unit,
                        lane,
                        attempts,
                        counted: false,
                    });
                    self.failed(idx, s, retry_after, false);
                }
            }
            Outcome::Transient { retry_after } => {
                self.count_attempt(idx, s);
                self.failed(idx, s, retry_after, true);
            }
            Outcome::Permanent | Outcome::Gone => {
                self.count_attempt(idx, s);
                // The recipient answered: it is up, whatever it thinks of this unit.
                self.reopen(lane);
                let gone = outcome == Outcome::Gone;
                let reason = if gone {
                    DeadReason::Gone
                } else {
                    DeadReason::Permanent
                };
                if self.dead_or_block(idx, s, reason) && gone && self.config.retire_on_gone {
                    self.retire(lane, idx);
                }
                self.finish_if_resolved(idx);
            }
            Outcome::Refused => {
                self.count_attempt(idx, s);
                self.dead_or_block(idx, s, DeadReason::DestinationRefused);
                self.finish_if_resolved(idx);
            }
            Outcome::NotSent => self.not_sent(idx, s),
        }
        self.fire_timers();
        Ok(())
    }

    fn count_attempt(&mut self, idx: u32, s: usize) {
        let u = &mut self.units[idx as usize];
        let slot = &mut u.slots[s];
        slot.attempts = slot.attempts.saturating_add(1);
        self.commands.push_back(Command::RecordAttempt {
            unit: u.id,
            lane: slot.lane,
            attempts: slot.attempts,
            counted: true,
        });
    }

    /// An attempt that never left: retried after the in-pass delay, nothing recorded, the
    /// unit and its lane untouched otherwise.
    fn not_sent(&mut self, idx: u32, s: usize) {
        let slot = &mut self.units[idx as usize].slots[s];
        slot.not_sent = slot.not_sent.saturating_add(1);
        let n = slot.not_sent;
        let delay = jittered(
            self.config.retry_delay(n),
            self.config.jitter_percent,
            &mut self.rng,
        );
        let at = self.now + delay;
        let u = &mut self.units[idx as usize];
        u.slots[s].phase = Phase::RetryAt(at);
        self.retry_pending += 1;
        self.timers.push(Reverse((at, Timer::Retry(idx, u.id))));
    }

    /// A transient or throttled failure: retry in the pass, stall, or dead-letter.
    ///
    /// A Retry-After is a floor, never a shortcut: the wait is the longer of it and the delay
    /// taken without one, so `Retry-After: 0` cannot make a tight loop.
    fn failed(&mut self, idx: u32, s: usize, retry_after: Option<Duration>, counted: bool) {
        let lane = self.units[idx as usize].slots[s].lane;
        let probe = self.lanes[lane.index()].level > 0;
        let retry_after = retry_after.map(|d| d.min(self.config.retry_after_cap));
        let slot = &mut self.units[idx as usize].slots[s];
        let exhausted = counted && slot.attempts >= self.config.max_attempts;
        if !probe && !exhausted {
            slot.pass_failures += 1;
        }
        let failures = slot.pass_failures;
        let stall = probe || (!exhausted && failures >= self.config.pass_attempts);
        // The in-pass retry: after the ladder's delay, or the Retry-After if it is longer.
        let mut retry_at = None;
        if stall {
            // A failed probe, or the stall itself, puts the lane one backoff level further.
            self.extend_backoff(lane, retry_after);
        } else {
            let delay = jittered(
                self.config.retry_delay(failures),
                self.config.jitter_percent,
                &mut self.rng,
            );
            match retry_after {
                Some(ra) if ra > delay => {
                    // Retry-After sets the lane's not_before at once (OL-6).
                    let t = self.now + ra;
                    let l = &mut self.lanes[lane.index()];
                    let t = l.not_before.map_or(t, |old| old.max(t));
                    l.not_before = Some(t);
                    let level = l.level;
                    self.timers.push(Reverse((t, Timer::Lane(lane.0))));
                    self.commands.push_back(Command::LaneBackoff {
                        lane,
                        not_before: t,
                        level,
                    });
                }
                _ => retry_at = Some(self.now + delay),
            }
        }
        if exhausted {
            self.dead_or_block(idx, s, DeadReason::Exhausted);
            self.finish_if_resolved(idx);
            return;
        }
        if stall {
            self.hold_stalled(idx, s);
            return;
        }
        // Without a retry time the lane's not_before governs; its timer brings the unit back.
        if let Some(at) = retry_at {
            let u = &mut self.units[idx as usize];
            u.slots[s].phase = Phase::RetryAt(at);
            self.retry_pending += 1;
            self.timers.push(Reverse((at, Timer::Retry(idx, u.id))));
        }
    }

    /// Puts `lane` in backoff one level further (up to [`MAX_BACKOFF_LEVEL`]) for the lane
    /// backoff of that level, or the Retry-After if it is longer, and persists it.
    fn extend_backoff(&mut self, lane: LaneId, retry_after: Option<Duration>) {
        let l = &mut self.lanes[lane.index()];
        l.level = l.level.saturating_add(1).min(MAX_BACKOFF_LEVEL);
        let level = l.level;
        let backoff = jittered(
            self.config.lane_backoff(level),
            self.config.jitter_percent,
            &mut self.rng,
        );
        let delay = retry_after.map_or(backoff, |ra| ra.max(backoff));
        let t = self.now + delay;
        let l = &mut self.lanes[lane.index()];
        l.not_before = Some(t);
        self.timers.push(Reverse((t, Timer::Lane(lane.0))));
        self.commands.push_back(Command::LaneBackoff {
            lane,
            not_before: t,
            level,
        });
    }

    /// Holds a stalled unit at its lane's head and hands back the lane's other units (OL-7).
    fn hold_stalled(&mut self, idx: u32, s: usize) {
        let u = &mut self.units[idx as usize];
        u.slots[s].phase = Phase::Stalled;
        let (unit, lane) = (u.id, u.slots[s].lane);
        self.lanes[lane.index()].stalled = true;
        self.commands.push_back(Command::Hold {
            unit,
            lane,
            reason: HoldReason::Stalled,
        });
        self.hand_back_behind(lane);
    }

    /// Dead-letters `idx` for slot `s`, or blocks the lane if it is strict. Returns whether
    /// it was dead-lettered.
    fn dead_or_block(&mut self, idx: u32, s: usize, reason: DeadReason) -> bool {
        let u = &mut self.units[idx as usize];
        let (unit, lane) = (u.id, u.slots[s].lane);
        if self.lanes[lane.index()].strict {
            u.slots[s].phase = Phase::Blocked;
            let l = &mut self.lanes[lane.index()];
            l.blocked = true;
            l.stalled = true;
            self.commands.push_back(Command::Hold {
                unit,
                lane,
                reason: HoldReason::Blocked,
            });
            self.hand_back_behind(lane);
            return false;
        }
        u.slots[s].phase = Phase::Dead;
        self.commands
            .push_back(Command::DeadLetter { unit, lane, reason });
        let l = &mut self.lanes[lane.index()];
        if l.stalled {
            // The stalled head is gone; the lane moves on (still in backoff if it is).
            l.stalled = false;
            self.consider_claim(lane);
        }
        true
    }

    /// 410 Gone with `retire_on_gone`: every pending unit of `lane` is dead-lettered by the
    /// store; here they are dropped from the lane.
    fn retire(&mut self, lane: LaneId, head: u32) {
        self.commands.push_back(Command::RetireLane { lane });
        let queued: Vec<u32> = self.lanes[lane.index()].queue.iter().copied().collect();
        for idx in queued {
            if idx == head {
                continue;
            }
            for slot in self.units[idx as usize].slots.iter_mut() {
                if slot.lane == lane && !slot.phase.resolved() {
                    slot.phase = Phase::Dead;
                }
            }
            self.finish_if_resolved(idx);
        }
        // A joined unit this lane's read reached but that is not admitted yet lost this
        // recipient too: it must not be posted to it when it is admitted.
        for r in self.joined.values_mut() {
            for slot in r.admit.slots.iter_mut().filter(|s| s.lane == lane) {
                slot.served = true;
            }
        }
        self.lanes[lane.index()].more = false;
    }

    /// A recipient answered on `lane`: end its backoff.
    fn reopen(&mut self, lane: LaneId) {
        let l = &mut self.lanes[lane.index()];
        if l.level > 0 || l.stalled {
            l.level = 0;
            l.not_before = None;
            l.stalled = false;
            self.commands.push_back(Command::LaneOpen { lane });
            self.consider_claim(lane);
        }
    }

    fn finish_if_resolved(&mut self, idx: u32) {
        let u = &self.units[idx as usize];
        if u.live && u.slots.iter().all(|s| s.phase.resolved()) {
            self.finish(idx);
        }
    }

    /// Removes a finished unit: its lanes move on.
    fn finish(&mut self, idx: u32) {
        let lanes: SmallVec<[LaneId; 4]> = self.units[idx as usize]
            .slots
            .iter()
            .map(|s| s.lane)
            .collect();
        for lane in lanes {
            self.remove_from_lane(lane, idx);
            if let Some(&head) = self.lanes[lane.index()].queue.front() {
                self.ready.push_back((head, self.units[head as usize].id));
            }
            self.consider_claim(lane);
        }
        self.release(idx);
    }

    fn remove_from_lane(&mut self, lane: LaneId, idx: u32) {
        let q = &mut self.lanes[lane.index()].queue;
        let was_empty = q.is_empty();
        if q.front() == Some(&idx) {
            q.pop_front();
        } else if let Some(p) = q.iter().position(|&i| i == idx) {
            q.remove(p);
        }
        if !was_empty && q.is_empty() {
            self.occupied -= 1;
        }
    }

    fn release(&mut self, idx: u32) {
        let u = &mut self.units[idx as usize];
        u.live = false;
        for s in u.slots.iter() {
            if let Phase::RetryAt(_) = s.phase {
                self.retry_pending -= 1;
            }
        }
        self.index.remove(&u.id);
        self.admitted -= 1;
        self.admitted_bytes -= u64::from(u.bytes);
        self.free.push(idx);
        if !self.joined.is_empty() {
            let complete: SmallVec<[UnitId; 4]> = self
                .joined
                .iter()
                .filter(|(_, r)| r.lanes.len() == r.admit.slots.len())
                .map(|(id, _)| *id)
                .collect();
            for id in complete {
                self.admit_joined(id);
            }
        }
        if !self.room_waiters.is_empty() {
            for lane in core::mem::take(&mut self.room_waiters) {
                self.lanes[lane.index()].room_wait = false;
                self.lanes[lane.index()].more = true;
                self.consider_claim(lane);
            }
        }
    }

    /// Hands back every unit behind `lane`'s head, and with them every unit that, through a
    /// joined unit, waits behind one of them in another lane.
    fn hand_back_behind(&mut self, lane: LaneId) {
        let l = &mut self.lanes[lane.index()];
        if l.queue.len() <= 1 {
            return;
        }
        let mut victims: Vec<u32> = l.queue.drain(1..).collect();
        let mut touched: SmallVec<[LaneId; 8]> = SmallVec::new();
        let mut i = 0;
        while i < victims.len() {
            let v = victims[i];
            i += 1;
            if !self.units[v as usize].live {
                continue;
            }
            self.units[v as usize].live = false;
            let seq = self.units[v as usize].seq;
            let lanes: SmallVec<[LaneId; 4]> = self.units[v as usize]
                .slots
                .iter()
                .map(|s| s.lane)
                .collect();
            for m in lanes {
                let ml = &mut self.lanes[m.index()];
                if let Some(p) = ml.queue.iter().position(|&x| x == v) {
                    victims.extend(ml.queue.drain(p..).skip(1));
                    if ml.queue.is_empty() {
                        self.occupied -= 1;
                    }
                }
                ml.next_from = ml.next_from.min(seq);
                ml.more = true;
                if let Some(j) = ml.waiting_on.take() {
                    // It will read up to that joined unit again, behind the units handed back.
                    if let Some(r) = self.joined.get_mut(&j) {
                        r.lanes.retain(|x| *x != m);
                    }
                }
                if !touched.contains(&m) {
                    touched.push(m);
                }
            }
        }
        let mut handed: Vec<(Seq, UnitId, u32)> = victims
            .iter()
            .map(|&v| (self.units[v as usize].seq, self.units[v as usize].id, v))
            .collect();
        handed.sort_unstable();
        handed.dedup();
        for (_, id, v) in handed {
            self.units[v as usize].live = true;
            self.release(v);
            self.commands.push_back(Command::HandBack { unit: id });
        }
        // Lanes that lost units may read them again when they can.
        for m in touched {
            self.consider_claim(m);
        }
    }

    /// Puts `lane` in the claim queue if it may have units to read.
    fn consider_claim(&mut self, lane: LaneId) {
        let l = &mut self.lanes[lane.index()];
        if l.more && !l.in_claim_queue && !l.stalled && l.planned.is_none() {
            l.in_claim_queue = true;
            if l.queue.is_empty() {
                self.hungry_queue.push_back(lane);
            } else {
                self.claim_queue.push_back(lane);
            }
        }
    }

    /// Time passed: fires every due timer.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        self.advance(now);
        self.pump();
    }

    /// Stop starting units (graceful shutdown or the end of a time slice): attempts in
    /// flight finish, nothing new starts or is claimed, and [`Scheduler::is_done`] turns true
    /// once nothing is in flight.
    pub fn handle_stop(&mut self, now: Timestamp) {
        self.set_now(now);
        self.stopping = true;
    }

    /// Ends the pass: every admitted unit that is not finished — waiting, stalled, blocked,
    /// or (after an interruption) in flight — is handed back in enqueue order (OL-10,
    /// OL-14). Completions that arrive later are refused with [`EventError::UnknownUnit`].
    /// The scheduler can then start a new pass.
    pub fn handle_pass_end(&mut self, now: Timestamp) {
        // Nothing due fires first: what was waiting goes back, it does not start.
        self.set_now(now);
        let mut live: Vec<(Seq, UnitId)> = self
            .units
            .iter()
            .filter(|u| u.live)
            .map(|u| (u.seq, u.id))
            .collect();
        live.sort_unstable();
        for (_, unit) in live {
            self.commands.push_back(Command::HandBack { unit });
        }
        self.units.clear();
        self.free.clear();
        self.index.clear();
        self.joined.clear();
        self.ready.clear();
        self.capacity_wait.clear();
        self.hungry_queue.clear();
        self.claim_queue.clear();
        self.room_waiters.clear();
        self.timers.clear();
        for l in &mut self.lanes {
            *l = Lane::default();
        }
        self.admitted = 0;
        self.admitted_bytes = 0;
        self.occupied = 0;
        self.reserved = 0;
        self.in_flight = 0;
        self.retry_pending = 0;
        self.stopping = false;
    }

    /// An interruption (an error, a cancellation): same as [`Scheduler::handle_pass_end`],
    /// including the units in flight, whose outcome is unknown (at-least-once).
    pub fn handle_interrupt(&mut self, now: Timestamp) {
        self.handle_pass_end(now);
    }

    /// The next command to execute, in order.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// The earliest deadline (an in-pass retry, or a lane whose backoff ends) at which
    /// [`Scheduler::handle_timeout`] should be called.
    pub fn poll_timeout(&mut self) -> Option<Timestamp> {
        while let Some(&Reverse((t, timer))) = self.timers.peek() {
            if self.timer_valid(t, timer) {
                return Some(t);
            }
            self.timers.pop();
        }
        None
    }

    /// Whether the pass is over: nothing in flight, no in-pass retry pending, nothing
    /// startable, and nothing to read outside lanes in backoff (OL-10).
    pub fn is_done(&mut self, now: Timestamp) -> bool {
        self.advance(now);
        if self.in_flight > 0 || self.reserved > 0 || !self.commands.is_empty() {
            return false;
        }
        if self.stopping {
            return true;
        }
        if self.retry_pending > 0 || !self.ready.is_empty() || !self.capacity_wait.is_empty() {
            return false;
        }
        let room = self.admitted < self.config.max_units;
        let max = self.config.max_per_lane;
        let now = self.now;
        !(room
            && self
                .hungry_queue
                .iter()
                .chain(&self.claim_queue)
                .any(|l| Self::claimable(&self.lanes[l.index()], now, max).is_some()))
    }

    fn timer_valid(&self, t: Timestamp, timer: Timer) -> bool {
        match timer {
            Timer::Lane(l) => self.lanes[l as usize].not_before == Some(t),
            Timer::Retry(idx, id) => {
                let u = &self.units[idx as usize];
                u.live && u.id == id && u.slots.iter().any(|s| s.phase == Phase::RetryAt(t))
            }
        }
    }

    /// Moves time forward (never backward) and fires due timers.
    fn advance(&mut self, now: Timestamp) {
        self.set_now(now);
        self.fire_timers();
    }

    /// Moves time forward, never backward (a clock that steps back is clamped).
    fn set_now(&mut self, now: Timestamp) {
        if now > self.now {
            self.now = now;
        }
    }

    /// Fires every timer due at `self.now`, then starts what may start.
    fn fire_timers(&mut self) {
        while let Some(&Reverse((t, timer))) = self.timers.peek() {
            if t > self.now {
                break;
            }
            self.timers.pop();
            if !self.timer_valid(t, timer) {
                continue;
            }
            match timer {
                Timer::Lane(l) => {
                    let lane = LaneId(l);
                    let ll = &mut self.lanes[l as usize];
                    ll.not_before = None;
                    if let Some(&head) = ll.queue.front() {
                        let u = &mut self.units[head as usize];
                        for s in u.slots.iter_mut() {
                            if s.lane == lane && s.phase == Phase::Stalled {
                                // The probe (OL-11).
                                s.phase = Phase::Idle;
                            }
                        }
                        self.ready.push_back((head, u.id));
                    }
                    self.consider_claim(lane);
                }
                Timer::Retry(idx, id) => {
                    let u = &mut self.units[idx as usize];
                    for s in u.slots.iter_mut() {
                        if s.phase == Phase::RetryAt(t) {
                            s.phase = Phase::Idle;
                            self.retry_pending -= 1;
                        }
                    }
                    self.ready.push_back((idx, id));
                }
            }
        }
        self.pump();
    }

    /// Starts every unit that may start, units held up by the in-flight bound first.
    fn pump(&mut self) {
        if self.stopping {
            return;
        }
        while self.in_flight < self.config.max_in_flight || self.in_flight == 0 {
            let Some((idx, id)) = self
                .capacity_wait
                .pop_front()
                .or_else(|| self.ready.pop_front())
            else {
                break;
            };
            let u = &self.units[idx as usize];
            if !u.live || u.id != id {
                continue;
            }
            if !self.try_start(idx) {
                self.capacity_wait.push_front((idx, id));
                break;
            }
        }
    }

    /// Starts what it can of unit `idx`; returns false if it was held up by the in-flight
    /// bound only.
    fn try_start(&mut self, idx: u32) -> bool {
        let now = self.now;
        if !self.heads_all(idx) {
            return true;
        }
        let u = &self.units[idx as usize];
        let mut startable: SmallVec<[usize; 4]> = SmallVec::new();
        for (i, s) in u.slots.iter().enumerate() {
            let l = &self.lanes[s.lane.index()];
            let due = match s.phase {
                Phase::Idle => true,
                Phase::RetryAt(t) => t <= now,
                Phase::InFlight | Phase::Stalled | Phase::Blocked | Phase::Served | Phase::Dead => {
                    false
                }
            };
            let lane_ok = l.open(now) && !l.in_flight && !l.blocked;
            if due && lane_ok {
                startable.push(i);
            } else if !u.started && !s.phase.resolved() {
                // OL-1: a unit first starts only when every lane it still needs is ready.
                return true;
            }
        }
        if startable.is_empty() {
            return true;
        }
        if !u.started {
            if let Some(max_age) = self.config.max_age {
                if now.saturating_duration_since(u.enqueued_at) > max_age {
                    for i in startable {
                        self.dead_or_block(idx, i, DeadReason::Expired);
                    }
                    self.finish_if_resolved(idx);
                    return true;
                }
            }
        }
        let room = self.config.max_in_flight.saturating_sub(self.in_flight);
        let mut partial = false;
        if startable.len() > room {
            if !u.started {
                // A unit starts as a whole; one wider than the bound starts alone.
                if self.in_flight > 0 {
                    return false;
                }
            } else {
                if room == 0 {
                    return false;
                }
                startable.truncate(room);
                partial = true;
            }
        }
        let u = &mut self.units[idx as usize];
        u.started = true;
        let id = u.id;
        for i in startable {
            let slot = &mut u.slots[i];
            if let Phase::RetryAt(_) = slot.phase {
                self.retry_pending -= 1;
            }
            slot.phase = Phase::InFlight;
            self.lanes[slot.lane.index()].in_flight = true;
            self.in_flight += 1;
            self.commands.push_back(Command::Start {
                unit: id,
                lane: slot.lane,
                attempt: slot.attempts.saturating_add(1),
            });
        }
        !partial
    }
}
