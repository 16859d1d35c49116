//! The lane scheduler: one actor's pass, from the lanes with work to the commands a runtime
//! executes.
//!
//! It implements the per-recipient ordered outbox — the lane rules of `docs/design.md`:
//! ordering, retries, stalls, dead letters and hand-backs — without I/O and without a clock:
//! every input takes `now`, every output is a value the runtime pulls.
//! A runtime feeds it what the store and the recipients said, and executes what it asks for.
//!
//! # A pass
//!
//! 1. **Discovery** — [`Scheduler::handle_lane`]: the store says a lane has pending units (and
//!    its persisted backoff). The lane is queued for a read.
//! 2. **Claims** — [`Scheduler::poll_claim`]: which lanes to read now, and how many units of
//!    each. The admission window (`max_units`, `max_bytes`) is shared breadth first: a lane
//!    with nothing admitted is read before one that only refills, each gets
//!    `max_units / lanes with work` (between 1 and `max_per_lane`), and a lane in probe mode
//!    gets its head only. The room asked for is reserved until the answer comes.
//! 3. **Admission** — [`Scheduler::handle_claimed`]: the store's answer, each lane's next units
//!    in `seq` order. A joined unit (several recipients) is admitted only once the reads of
//!    *all* its lanes have reached it, so it sits behind every earlier unit of each (OL-3).
//! 4. **Starts** — a unit that heads every lane it occupies is *ready*; it starts when each
//!    lane it still needs is open (not in backoff), has nothing in flight and is not blocked
//!    (OL-1), within `max_in_flight`: one [`Command::Start`] per recipient. When that bound
//!    binds, a free place goes to the unit whose lanes hold the most work (the store's count
//!    at discovery, [`LaneInfo::pending`], less what finished since), every fourth to the
//!    unit waiting longest (OL-2, `start.rs`). An attempt its host holds back
//!    ([`Scheduler::handle_host_wait`]: the host's window is full, or its pace not due,
//!    OL-21, OL-23) stays in flight but takes no place of the bound while it waits.
//! 5. **Outcomes** — [`Scheduler::handle_outcome`]: a 2xx resolves the recipient; a transient
//!    or throttled failure retries in the pass, throttles the lane (a Retry-After longer than
//!    the ladder's step), stalls the lane, or dead-letters the unit (OL-5 … OL-8); a
//!    permanent failure dead-letters it (410 may retire the lane, OL-9). A unit whose
//!    recipients are all resolved leaves its lanes, and the next heads are ready.
//! 6. **Timers** — [`Scheduler::handle_timeout`] at [`Scheduler::poll_timeout`]: in-pass retries
//!    fall due, lane backoffs end (the head is probed, OL-11).
//! 7. **Operator actions** — [`Scheduler::handle_lane_control`]: an operator paused, purged,
//!    skipped, made strict (or resumed, retried…) a lane while the pass ran. What the pass
//!    admitted of it predates the action: it is handed back at once, and the lane starts
//!    nothing until it is read again from the store — not at all while it is paused (OL-14).
//!    An attempt already in flight finishes and is recorded; its unit is then handed back
//!    unless it was resolved.
//! 8. **End** — [`Scheduler::is_done`] (a query) says nothing can happen any more without a
//!    new input from the store: nothing in flight, no retry pending, nothing startable, and
//!    nothing to read outside lanes in backoff (OL-10). [`Scheduler::handle_pass_end`] then
//!    hands every unit still admitted back to the store in enqueue order (OL-10, OL-14),
//!    after marking the lanes whose head waits for a throttle's retry (OL-7).
//!
//! After **every** `handle_*` call the runtime drains [`Scheduler::poll_command`] and executes
//! the commands in order ([`Command::DeadLetter`] and [`Command::RetireLane`] durable before
//! the next one, OL-16).
//!
//! # The states of a lane
//!
//! A lane is a recipient's FIFO. Its state is a few independent flags, each with one job:
//!
//! | state | flag(s) | entered when | left when |
//! |---|---|---|---|
//! | known | `known` | discovery or a lane control brings its persisted state (backoff, strict) | the pass ends |
//! | has work | `more` | the store reports units (discovery, a read that was not exhausted, a joined unit another lane's read reached) | a read comes back exhausted |
//! | queued for a read | `in_claim_queue` | it has work, is not stalled and no read is out | `poll_claim` takes it (read or dropped) |
//! | read outstanding | `planned` | `poll_claim` asks for it | `handle_claimed` / `handle_claim_failed` |
//! | waiting at a joined unit | `waiting_on` | its read reached a joined unit not yet admitted | the unit is admitted, or handed back |
//! | waiting for room | `room_wait` | its next unit did not fit the window | any unit leaves the window |
//! | attempt in flight | `in_flight` | its head starts | the outcome arrives |
//! | in backoff (probe mode above level 0) | `not_before`, `level` | a stall, a failed probe, a Retry-After longer than the ladder's step (a throttle, level 0), a pass that ends on a throttle's retry | its timer fires (`not_before` ends, probe mode stays; at level 0 it stays, past: the throttle's mark, OL-7); an answer reopens it (level 0, cleared) |
//! | stalled | `stalled` | its head failed `pass_attempts` times in a row (persisted, across passes), its probe failed, it was throttled while still throttled by an earlier pass, or its host deferred it: the head is held, the rest handed back (OL-7) | the head is resolved, the lane reopens, or the head is handed back to make room for lanes with work (`poll_claim`, OL-10) |
//! | blocked (strict lanes) | `blocked` (and `stalled`) | a strict lane's head would be dead-lettered (OL-8) | the pass ends (an operator acts) |
//! | paused | `paused` | an operator paused it ([`Scheduler::handle_lane_control`]) | a control or a discovery says it is not |
//! | fenced | `fenced` | an operator acted on it while its head had an attempt in flight | that attempt ended and its unit left |
//! | paced | `pace`, `next_start`, `pace_wait` | it is rate-limited (OL-23): each start sets `next_start` to the start plus the pace; a head that could start before then waits (`pace_wait`, a pace timer) | the timer fires |
//!
//! A lane is read only when it is known and has work, is neither paused, fenced nor stalled, has no read
//! out, waits neither at a joined unit nor for room, and is open; it starts its head only when
//! it is open, idle, on pace, and neither blocked, paused nor fenced. A recipient of a unit (a *slot*) is `Idle`, `InFlight`, `RetryAt(t)`,
//! `Stalled`, `Blocked`, `Served` or `Dead`; a unit finishes when every slot is `Served` or
//! `Dead`.
//!
//! # Invariants
//!
//! The model test (`core/tests/model.rs`) drives random admissions, outcomes, time jumps
//! (backwards too), interruptions and bad events against a per-lane FIFO reference store, and
//! checks on every command:
//!
//! - a unit starts only when nothing earlier is pending in any lane it occupies (OL-1, OL-3);
//! - at most one attempt is in flight per lane;
//! - nothing starts before its lane's `not_before` (OL-6, OL-11);
//! - each recipient of a unit is resolved (delivered or dead-lettered) once, while pending;
//! - a batch of hand-backs comes in enqueue order (OL-10, OL-14);
//! - the window holds: at most `max_units` admitted, at most `max_bytes` unless one unit;
//! - with recipients answering, every unit is resolved in the end (quiescence).
//!
//! Events the scheduler cannot apply (a stale or second completion, a chunk nobody asked for)
//! are refused with an error and change nothing.
//!
//! # Costs
//!
//! Work is queued, never searched for: ready units, lanes to read (hungry and refill queues),
//! lanes waiting for room, timers in a heap, and joined units that every lane has reached
//! but that wait for room ([`Scheduler`] keeps them in a queue, so a unit that leaves the
//! window costs the joined units it lets in, not a scan of every joined unit being read).
//!
//! # Two output channels
//!
//! Commands ([`Scheduler::poll_command`]) are effects the runtime executes in order, queued as
//! events happen. Claims ([`Scheduler::poll_claim`]) are not: they are computed when the
//! runtime is ready to read, from the room free *then*, and come as one batch so the runtime
//! reads many lanes in one store query. Queuing them as commands would fix their size when an
//! event happens (before the commands ahead of them free room), split one read into many, and
//! reserve room the runtime may not use yet; so claims stay a separate, pull-based channel.
//!
//! # Files
//!
//! - `mod.rs`: this overview, the internal state, the scheduler's constructor, queries and
//!   pass end;
//! - `types.rs`: the public inputs and outputs ([`Admit`], [`Command`], errors, …);
//! - `admission.rs`: discovery, claims and admission (joined units included);
//! - `outcomes.rs`: outcomes, retries, stalls, backoff, dead letters, units leaving;
//! - `timers.rs`: time, and the timers of retries and lane backoffs;
//! - `control.rs`: operator actions that reach a running pass (OL-14);
//! - `start.rs`: which ready units start now.

mod admission;
mod control;
mod outcomes;
mod start;
mod timers;
mod types;

pub use types::{
    Admit, AdmitError, AdmitSlot, ClaimReport, Command, EventError, HoldReason, LaneChunk,
    LaneClaim, LaneControl, LaneInfo, LaneWait,
};

use alloc::collections::{BinaryHeap, VecDeque};
use alloc::vec::Vec;
use core::cmp::Reverse;
use core::hash::{BuildHasherDefault, Hasher};
use core::time::Duration;

use hashbrown::HashMap;
use smallvec::SmallVec;

use crate::config::Config;
use crate::ids::{LaneId, Seq, UnitId};
use crate::lane::{LaneKey, LaneTable};
use crate::rng::Rng;
use crate::time::Timestamp;

/// Where one recipient of an admitted unit is (see the module doc).
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
    /// Delivered or dead-lettered: nothing more happens to this recipient.
    #[inline]
    fn resolved(self) -> bool {
        matches!(self, Phase::Served | Phase::Dead)
    }
}

/// One recipient of an admitted unit.
#[derive(Clone, Debug)]
struct Slot {
    lane: LaneId,
    attempts: u32,
    /// Consecutive failures of this recipient (throttled ones included): its persisted
    /// attempts when admitted, plus this pass's failures. The head of a lane changes only
    /// when it is resolved, so these are the lane's failures in a row (OL-7).
    failures: u32,
    /// Attempts of this pass that never left (`Outcome::NotSent`): they pace the retry, and
    /// count for nothing else.
    not_sent: u32,
    phase: Phase,
    /// In flight, but its host holds it back (its window is full, or its pace not due):
    /// it takes no place of the in-flight bound ([`Scheduler::handle_host_wait`]).
    host_waits: bool,
}

/// An admitted unit (a slot of the slab; `live` is false once it left the window).
#[derive(Clone, Debug)]
struct Unit {
    id: UnitId,
    seq: Seq,
    bytes: u32,
    enqueued_at: Timestamp,
    slots: SmallVec<[Slot; 1]>,
    started: bool,
    live: bool,
    /// Its entry in [`Scheduler::start_queue`] (`0`: none): it could start but for the in-flight
    /// bound.
    wait: u64,
}

/// A lane's state in this pass; the flags are the states of the table in the module doc.
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
    /// Paused by an operator: nothing of it is read or started.
    paused: bool,
    /// An operator acted on it while its head had an attempt in flight: it reads and starts
    /// nothing until that unit has left (it is in [`Scheduler::fenced`]).
    fenced: bool,
    /// Discovery (or a lane control) told this pass the lane's persisted state. A lane known
    /// only as another lane of a joined unit is not read until then: its backoff and pause
    /// are the store's, not the defaults (OL-11).
    known: bool,
    /// This pass set its `not_before` at level 0 (a throttle or a deferral): its throttles
    /// count in this pass's failures. Only a mark left by an earlier pass stalls the lane at
    /// its next throttle (OL-7).
    throttled_here: bool,
    /// When its current run of failed attempts began (OL-8).
    failing_since: Option<Timestamp>,
    /// Found failing for longer than allowed in this run (OL-8).
    unavailable: bool,
    /// Its rate limit: the least time between two starts (OL-23).
    pace: Option<Duration>,
    /// No attempt starts before then (its last start plus `pace`).
    next_start: Option<Timestamp>,
    /// Its head could start but for `next_start`: a [`Timer::Pace`] is set.
    pace_wait: bool,
    /// Units of it the store held when it was discovered, less those finished since: the
    /// work left in the lane, as far as this pass knows (at least its admitted units).
    remaining: u32,
}

impl Lane {
    /// Not in backoff at `now`.
    #[inline]
    fn open(&self, now: Timestamp) -> bool {
        self.not_before.is_none_or(|t| t <= now)
    }

    /// Still throttled by an earlier pass: a `not_before` at level 0 (a throttle or a
    /// deferral, or the mark of throttles a pass ended on) that the store gave this pass and
    /// that no answer has cleared since ([`Command::LaneOpen`]), past or not: it stays when
    /// it ends, as it stays in the store. The next throttle then stalls the lane (OL-7).
    #[inline]
    fn throttled_before(&self) -> bool {
        self.level == 0 && self.not_before.is_some() && !self.throttled_here
    }
}

/// A joined unit that some of its lanes' reads have reached.
#[derive(Clone, Debug)]
struct Reached {
    admit: Admit,
    /// The lanes whose reads reached it; it is complete when all of its lanes did.
    lanes: SmallVec<[LaneId; 4]>,
    /// It is in [`Scheduler::complete_joined`] (complete, waiting for room).
    queued: bool,
}

/// A deadline: a lane's backoff ends, or a unit's in-pass retry is due. Stale ones (the
/// state changed since) are skipped when they come up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Lane(u32),
    Retry(u32, UnitId),
    /// A paced lane may start again (OL-23).
    Pace(u32),
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
/// It keeps the lane rules of the design (`docs/design.md`) for the units a runtime admits,
/// and tells the runtime what to do through [`Command`]s. It performs no I/O and reads no
/// clock: every input takes `now`, and deadlines come back from [`Scheduler::poll_timeout`].
///
/// # The driving loop
///
/// After **every** `handle_*` call, drain [`Scheduler::poll_command`] until `None` and
/// execute the commands in order; then ask [`Scheduler::poll_claim`] for lanes to read from
/// the store, and wait for the earliest of a completion, new rows, or
/// [`Scheduler::poll_timeout`] (then call [`Scheduler::handle_timeout`]). The pass is over
/// when [`Scheduler::is_done`] says so; then [`Scheduler::handle_pass_end`] hands every
/// waiting unit back. The [module documentation](self) describes a pass step by step.
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
///             | Command::Interrupted { .. }
///             | Command::Hold { .. }
///             | Command::LaneBackoff { .. }
///             | Command::LaneOpen { .. }
///             | Command::LaneFailing { .. }
///             | Command::LaneRestart { .. }
///             | Command::LaneUnavailable { .. }
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
    /// The seed `rng` and the lane hasher were made from: a run is replayed from it.
    seed: u64,
    rng: Rng,
    now: Timestamp,
    table: LaneTable<LaneKey>,
    lanes: Vec<Lane>,
    units: Vec<Unit>,
    free: Vec<u32>,
    index: HashMap<UnitId, u32, BuildHasherDefault<IdHasher>>,
    /// Joined units some of whose lanes' reads reached them, not admitted yet.
    joined: HashMap<UnitId, Reached, BuildHasherDefault<IdHasher>>,
    /// Joined units every lane of which reached them but that did not fit the window, in
    /// the order they became complete: admitted when units leave the window.
    complete_joined: VecDeque<UnitId>,
    commands: VecDeque<Command>,
    ready: VecDeque<(u32, UnitId)>,
    /// Units that could start but for the in-flight bound: the one with the most work left
    /// in its lanes goes first, and every [`start::AGING`]-th place to the one waiting
    /// longest.
    start_queue: start::StartQueue,
    /// Deep lanes to read (holding at least `max_per_lane` units): served before the others,
    /// each at most its share (two while its share is one): their chains are a drain's
    /// critical path.
    deep_queue: VecDeque<LaneId>,
    /// Lanes to read that had nothing admitted when they were queued: served first.
    hungry_queue: VecDeque<LaneId>,
    /// Lanes to read that only refill.
    claim_queue: VecDeque<LaneId>,
    room_waiters: Vec<LaneId>,
    /// The lanes with `fenced` set (few: the lanes an operator acted on mid-attempt).
    fenced: Vec<LaneId>,
    /// Lanes whose head is held while they wait in backoff (stalled or deferred), by the
    /// end of that wait, latest on top: the heads [`Scheduler::poll_claim`] hands back when
    /// the window is full and lanes with work wait for room. Stale entries (the lane moved
    /// on since) are skipped when they come up.
    held: BinaryHeap<(Timestamp, LaneId)>,
    timers: BinaryHeap<Reverse<(Timestamp, Timer)>>,
    admitted: usize,
    admitted_bytes: u64,
    /// Lanes with at least one admitted unit.
    occupied: usize,
    reserved: usize,
    in_flight: usize,
    /// Attempts in flight that their host holds back (`Slot::host_waits`): they take no
    /// place of the in-flight bound.
    host_waiting: usize,
    retry_pending: usize,
    /// Lanes whose head waits only for its rate limit (`pace_wait`).
    paced: usize,
    stopping: bool,
    /// What [`Scheduler::poll_waiting`] said last.
    waiting: bool,
}

impl Scheduler {
    /// A scheduler with `config`; `seed` drives the retry jitter and keys the lane hasher, so
    /// the same seed replays the same run.
    pub fn new(config: Config, seed: u64) -> Self {
        Scheduler {
            config,
            seed,
            rng: Rng::new(seed),
            now: Timestamp::EPOCH,
            table: LaneTable::new(seed),
            lanes: Vec::new(),
            units: Vec::new(),
            free: Vec::new(),
            index: HashMap::default(),
            joined: HashMap::default(),
            complete_joined: VecDeque::new(),
            commands: VecDeque::new(),
            ready: VecDeque::new(),
            start_queue: start::StartQueue::default(),
            deep_queue: VecDeque::new(),
            hungry_queue: VecDeque::new(),
            claim_queue: VecDeque::new(),
            room_waiters: Vec::new(),
            fenced: Vec::new(),
            held: BinaryHeap::new(),
            timers: BinaryHeap::new(),
            admitted: 0,
            admitted_bytes: 0,
            occupied: 0,
            reserved: 0,
            in_flight: 0,
            host_waiting: 0,
            retry_pending: 0,
            paced: 0,
            stopping: false,
            waiting: false,
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

    /// Attempts in flight (those their host holds back included).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Places of the in-flight bound taken: attempts in flight but those their host holds
    /// back ([`Scheduler::handle_host_wait`]).
    pub fn places_taken(&self) -> usize {
        self.in_flight - self.host_waiting
    }

    /// The seed given at construction: the same seed replays the same run.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Whether `lane` waits before its next attempt, and how: in backoff (a level above
    /// zero, its probe due once `not_before` has passed), or throttled (level zero with a
    /// `not_before`, until an answer clears it, OL-7). `None`: open, or not a lane of this
    /// scheduler. The state the inputs so far left: a [`Command::LaneBackoff`],
    /// [`Command::LaneOpen`] or [`Command::LaneRestart`] still queued has applied already.
    pub fn lane_wait(&self, lane: LaneId) -> Option<LaneWait> {
        let l = self.lanes.get(lane.index())?;
        (l.level > 0 || l.not_before.is_some()).then_some(LaneWait {
            level: l.level,
            not_before: l.not_before,
        })
    }

    /// How many recipients of `unit` are neither delivered nor dead-lettered yet. `None`:
    /// the unit is not admitted (never, or it finished or was handed back — commands about
    /// it may still be queued).
    pub fn unit_open(&self, unit: UnitId) -> Option<usize> {
        let &idx = self.index.get(&unit)?;
        let u = &self.units[idx as usize];
        Some(u.slots.iter().filter(|s| !s.phase.resolved()).count())
    }

    /// Whether the pass came to only wait (`Some(true)`) or has work again (`Some(false)`)
    /// since the last call; `None`: no change. Waiting: attempts in flight, and nothing
    /// else to do now ([`Scheduler::only_waits`]) — here nor, by `busy`, in the runtime
    /// (reads or writes it still has to make). A runtime tells its monitor, which does not
    /// count a waiting pass against its bound (OL-13). A pass waiting only for an in-pass
    /// retry's timer (nothing in flight) still counts: waiting passes each hold an attempt
    /// in flight, so the monitor's `concurrency` bounds them.
    pub fn poll_waiting(&mut self, now: Timestamp, busy: bool) -> Option<bool> {
        let waiting = !busy && self.in_flight > 0 && self.only_waits(now);
        (waiting != self.waiting).then(|| {
            self.waiting = waiting;
            waiting
        })
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
    ///
    /// A head that waits for the retry of a throttle (a pass stopped by its time slice or a
    /// shutdown, or interrupted) first leaves its lane's throttle mark, a
    /// [`Command::LaneBackoff`] at level 0 until that retry, so the next pass counts on
    /// from it (OL-7).
    pub fn handle_pass_end(&mut self, now: Timestamp) {
        // Nothing due fires first: what was waiting goes back, it does not start.
        self.set_now(now);
        self.mark_throttled();
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
        self.complete_joined.clear();
        self.ready.clear();
        self.start_queue.clear();
        self.deep_queue.clear();
        self.hungry_queue.clear();
        self.claim_queue.clear();
        self.room_waiters.clear();
        self.fenced.clear();
        self.held.clear();
        self.timers.clear();
        for l in &mut self.lanes {
            *l = Lane::default();
        }
        self.admitted = 0;
        self.admitted_bytes = 0;
        self.occupied = 0;
        self.reserved = 0;
        self.in_flight = 0;
        self.host_waiting = 0;
        self.retry_pending = 0;
        self.paced = 0;
        self.stopping = false;
        self.waiting = false;
    }

    /// A pass that ends (stopped, interrupted) while a lane's head waits for the retry of a
    /// throttle leaves the throttle's mark: the lane's `not_before` at level 0 (its retry
    /// time), persisted, so the next pass knows the lane is still throttled and stalls it at
    /// its next throttle (OL-7) — however passes are sliced, a throttle stays counted. A
    /// lane already in backoff or throttled has its mark.
    fn mark_throttled(&mut self) {
        let mut marks: Vec<(Seq, LaneId, Timestamp)> = Vec::new();
        for u in self.units.iter().filter(|u| u.live) {
            for s in &u.slots {
                let l = &self.lanes[s.lane.index()];
                // At level 0 a counted failure adds to both counts: only this pass's
                // uncounted throttles make `failures` exceed `attempts`.
                if s.phase.resolved() || l.level > 0 || l.not_before.is_some() {
                    continue;
                }
                if s.failures > s.attempts {
                    let at = match s.phase {
                        Phase::RetryAt(t) => t.max(self.now),
                        _ => self.now,
                    };
                    marks.push((u.seq, s.lane, at));
                }
            }
        }
        marks.sort_unstable();
        for (_, lane, not_before) in marks {
            self.lanes[lane.index()].not_before = Some(not_before);
            self.commands.push_back(Command::LaneBackoff {
                lane,
                not_before,
                level: 0,
            });
        }
    }

    /// An interruption (a shutdown past its grace, a cancellation, an error): same as
    /// [`Scheduler::handle_pass_end`], including the units in flight, whose outcome is
    /// unknown (at-least-once). Each attempt cut off in flight is first recorded as a
    /// [`Command::Interrupted`], in enqueue order, never silently (OL-14).
    pub fn handle_interrupt(&mut self, now: Timestamp) {
        self.set_now(now);
        let mut cut: Vec<(Seq, UnitId, LaneId, u32)> = self
            .units
            .iter()
            .filter(|u| u.live)
            .flat_map(|u| {
                u.slots
                    .iter()
                    .filter(|s| s.phase == Phase::InFlight)
                    .map(move |s| (u.seq, u.id, s.lane, s.attempts))
            })
            .collect();
        cut.sort_unstable_by_key(|&(seq, _, lane, _)| (seq, lane));
        for (_, unit, lane, attempts) in cut {
            self.commands.push_back(Command::Interrupted {
                unit,
                lane,
                attempts,
            });
        }
        self.handle_pass_end(now);
    }

    /// The next command to execute, in order.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// Whether the pass is over at `now`: nothing in flight, no in-pass retry pending, no
    /// head waiting for its lane's rate limit (OL-23), nothing startable, and nothing to read
    /// outside lanes in backoff (OL-10).
    ///
    /// A query: it changes nothing. A timer that fell due by `now` and was not handled yet
    /// (no input at `now` so far) counts as work: call [`Scheduler::handle_timeout`] first.
    pub fn is_done(&self, now: Timestamp) -> bool {
        self.in_flight == 0
            && (self.stopping || (self.retry_pending == 0 && self.paced == 0))
            && self.only_waits(now)
    }

    /// Whether the pass has nothing to do at `now` but wait: for attempts in flight or for
    /// in-pass retries, with nothing startable, nothing to read and no command queued. A
    /// pass in that state costs nothing but its in-flight attempts, so a monitor need not
    /// count it against its bound on passes (OL-13): an actor waiting on a hanging recipient
    /// keeps no other actor from a pass.
    ///
    /// A query, like [`Scheduler::is_done`], which is this with nothing in flight and no
    /// retry pending.
    pub fn only_waits(&self, now: Timestamp) -> bool {
        if self.reserved > 0 || !self.commands.is_empty() {
            return false;
        }
        if self.stopping {
            return true;
        }
        let now = now.max(self.now);
        if self.timer_due(now) || !self.ready.is_empty() || !self.start_queue.is_empty() {
            return false;
        }
        if self.window_full() {
            // Heads held in backoff make room for lanes with work ([`Scheduler::poll_claim`]).
            return self.room_wanted(now) == 0
                || !self
                    .held
                    .iter()
                    .any(|&(t, lane)| self.evictable(t, lane, now).is_ok());
        }
        let max = self.config.max_per_lane;
        !self
            .deep_queue
            .iter()
            .chain(&self.hungry_queue)
            .chain(&self.claim_queue)
            .any(|l| Self::claimable(&self.lanes[l.index()], now, max, max).is_some())
    }
}

#[cfg(test)]
mod tests {
    //! Transcripts of the queries a runtime asks between commands: the exact commands of
    //! each step, and what the query answers after it.

    use alloc::vec;
    use alloc::vec::Vec;
    use core::time::Duration;

    use super::{Admit, Command, HoldReason, LaneChunk, LaneInfo, LaneWait, Scheduler};
    use crate::config::Config;
    use crate::ids::{LaneId, Seq, UnitId};
    use crate::lane::LaneKey;
    use crate::outcome::Outcome;
    use crate::time::Timestamp;

    const T0: Timestamp = Timestamp::from_secs(1_700_000_000);

    fn at(secs: u64) -> Timestamp {
        T0.saturating_add(Duration::from_secs(secs))
    }

    fn drain(s: &mut Scheduler) -> Vec<Command> {
        core::iter::from_fn(|| s.poll_command()).collect()
    }

    fn lane(s: &mut Scheduler, url: &str) -> LaneId {
        let l = s.lane(&LaneKey::new(url, None).expect("a valid URL"));
        s.handle_lane(l, LaneInfo::default(), T0);
        l
    }

    /// Answers the scheduler's claim with `units` for each lane it asks for (all of them:
    /// the lanes are exhausted).
    fn admit(s: &mut Scheduler, units: impl Fn(LaneId) -> Vec<Admit>) {
        let claims = s.poll_claim(T0).expect("a claim");
        let chunks = claims
            .iter()
            .map(|c| LaneChunk {
                lane: c.lane,
                units: units(c.lane),
                exhausted: true,
            })
            .collect();
        let report = s.handle_claimed(chunks, T0);
        assert!(report.refused.is_empty(), "{report:?}");
    }

    fn config() -> Config {
        Config {
            jitter_percent: 0,
            pass_attempts: 2,
            ..Config::default()
        }
    }

    #[test]
    fn the_seed_is_the_one_given() {
        assert_eq!(Scheduler::new(Config::default(), 42).seed(), 42);
    }

    #[test]
    fn lane_wait_follows_a_throttle_a_stall_its_probe_and_the_answer() {
        let mut s = Scheduler::new(config(), 7);
        let l = lane(&mut s, "https://a.example/inbox");
        let (u1, u2) = (UnitId(1), UnitId(2));
        assert_eq!(s.lane_wait(l), None);
        admit(&mut s, |l| {
            vec![Admit::single(u1, Seq(1), l), Admit::single(u2, Seq(2), l)]
        });
        assert_eq!(
            drain(&mut s),
            [Command::Start {
                unit: u1,
                lane: l,
                attempt: 1
            }]
        );

        // A Retry-After longer than the ladder's step throttles the lane (level 0).
        let throttled = Outcome::Throttled {
            retry_after: Some(Duration::from_secs(60)),
        };
        s.handle_outcome(u1, l, throttled, T0).expect("in flight");
        assert_eq!(
            drain(&mut s),
            [
                Command::RecordAttempt {
                    unit: u1,
                    lane: l,
                    attempts: 0,
                    counted: false
                },
                Command::LaneBackoff {
                    lane: l,
                    not_before: at(60),
                    level: 0
                },
            ]
        );
        let throttle = LaneWait {
            level: 0,
            not_before: Some(at(60)),
        };
        assert_eq!(s.lane_wait(l), Some(throttle));

        // Its end is no answer: the lane stays throttled while its head is tried again.
        s.handle_timeout(at(60));
        assert_eq!(
            drain(&mut s),
            [Command::Start {
                unit: u1,
                lane: l,
                attempt: 1
            }]
        );
        assert_eq!(s.lane_wait(l), Some(throttle));

        // The second failure in a row stalls it: level 1, 30 s.
        let failed = Outcome::Transient { retry_after: None };
        s.handle_outcome(u1, l, failed, at(60)).expect("in flight");
        assert_eq!(
            drain(&mut s),
            [
                Command::RecordAttempt {
                    unit: u1,
                    lane: l,
                    attempts: 1,
                    counted: true
                },
                Command::LaneFailing {
                    lane: l,
                    since: Some(at(60))
                },
                Command::LaneBackoff {
                    lane: l,
                    not_before: at(90),
                    level: 1
                },
                Command::Hold {
                    unit: u1,
                    lane: l,
                    reason: HoldReason::Stalled
                },
                Command::HandBack { unit: u2 },
            ]
        );
        assert_eq!(
            s.lane_wait(l),
            Some(LaneWait {
                level: 1,
                not_before: Some(at(90))
            })
        );

        // The backoff ends: the probe goes out, the level stays until it is answered.
        s.handle_timeout(at(90));
        assert_eq!(
            drain(&mut s),
            [Command::Start {
                unit: u1,
                lane: l,
                attempt: 2
            }]
        );
        assert_eq!(
            s.lane_wait(l),
            Some(LaneWait {
                level: 1,
                not_before: None
            })
        );
        s.handle_outcome(u1, l, Outcome::Delivered, at(91))
            .expect("in flight");
        assert_eq!(
            drain(&mut s),
            [
                Command::Delivered { unit: u1, lane: l },
                Command::LaneFailing {
                    lane: l,
                    since: None
                },
                Command::LaneOpen { lane: l },
            ]
        );
        assert_eq!(s.lane_wait(l), None);
        assert_eq!(
            s.lane_wait(LaneId(99)),
            None,
            "not a lane of this scheduler"
        );
    }

    #[test]
    fn unit_open_counts_a_joined_units_recipients_until_it_leaves() {
        let mut s = Scheduler::new(config(), 7);
        let a = lane(&mut s, "https://a.example/inbox");
        let b = lane(&mut s, "https://b.example/inbox");
        let u = UnitId(1);
        assert_eq!(s.unit_open(u), None, "not admitted yet");
        admit(&mut s, |_| vec![Admit::joined(u, Seq(1), &[a, b])]);
        assert_eq!(
            drain(&mut s),
            [
                Command::Start {
                    unit: u,
                    lane: a,
                    attempt: 1
                },
                Command::Start {
                    unit: u,
                    lane: b,
                    attempt: 1
                },
            ]
        );
        assert_eq!(s.unit_open(u), Some(2));
        s.handle_outcome(u, a, Outcome::Delivered, T0)
            .expect("in flight");
        assert_eq!(s.unit_open(u), Some(1));
        // A transient failure leaves the recipient open.
        s.handle_outcome(u, b, Outcome::Transient { retry_after: None }, T0)
            .expect("in flight");
        assert_eq!(s.unit_open(u), Some(1));
        s.handle_timeout(at(1));
        s.handle_outcome(u, b, Outcome::Delivered, at(1))
            .expect("in flight");
        // The unit left: its commands are still queued, for the runtime to execute.
        assert_eq!(s.unit_open(u), None);
        assert_eq!(
            drain(&mut s),
            [
                Command::Delivered { unit: u, lane: a },
                Command::RecordAttempt {
                    unit: u,
                    lane: b,
                    attempts: 1,
                    counted: true
                },
                Command::LaneFailing {
                    lane: b,
                    since: Some(T0)
                },
                Command::Start {
                    unit: u,
                    lane: b,
                    attempt: 2
                },
                Command::Delivered { unit: u, lane: b },
                Command::LaneFailing {
                    lane: b,
                    since: None
                },
            ]
        );
    }

    #[test]
    fn poll_waiting_says_each_change_once() {
        let mut s = Scheduler::new(config(), 7);
        let l = lane(&mut s, "https://a.example/inbox");
        let u = UnitId(1);
        // Lanes to read: work to do.
        assert_eq!(s.poll_waiting(T0, false), None);
        admit(&mut s, |l| vec![Admit::single(u, Seq(1), l)]);
        // A command queued is work too.
        assert_eq!(s.poll_waiting(T0, false), None);
        assert_eq!(
            drain(&mut s),
            [Command::Start {
                unit: u,
                lane: l,
                attempt: 1
            }]
        );
        // Only the attempt in flight is left.
        assert_eq!(s.poll_waiting(T0, false), Some(true));
        assert_eq!(s.poll_waiting(at(5), false), None, "no change");
        // The runtime has reads or writes of its own to make.
        assert_eq!(s.poll_waiting(at(5), true), Some(false));
        assert_eq!(s.poll_waiting(at(5), false), Some(true));
        // An in-pass retry due: nothing in flight, work again.
        s.handle_outcome(u, l, Outcome::Transient { retry_after: None }, at(5))
            .expect("in flight");
        assert_eq!(s.poll_waiting(at(5), false), Some(false));
        let _ = drain(&mut s);
        assert_eq!(s.poll_waiting(at(5), false), None, "nothing in flight");
        s.handle_pass_end(at(5));
        assert_eq!(s.poll_waiting(at(5), false), None);
    }

    fn deferred(secs: u64) -> Outcome {
        Outcome::Deferred {
            retry_after: Duration::from_secs(secs),
        }
    }

    /// Two lanes whose heads fill a window of two, both deferred by their hosts (a for
    /// 60 s, b for 120 s), with `max_units` 2.
    fn window_of_held_heads() -> (Scheduler, LaneId, LaneId) {
        let mut s = Scheduler::new(
            Config {
                max_units: 2,
                ..config()
            },
            7,
        );
        let a = lane(&mut s, "https://a.example/inbox");
        let b = lane(&mut s, "https://b.example/inbox");
        admit(&mut s, |l| {
            let (id, seq) = if l == a { (1, 1) } else { (2, 2) };
            vec![Admit::single(UnitId(id), Seq(seq), l)]
        });
        let _ = drain(&mut s);
        s.handle_outcome(UnitId(1), a, deferred(60), T0)
            .expect("in flight");
        s.handle_outcome(UnitId(2), b, deferred(120), T0)
            .expect("in flight");
        assert_eq!(
            drain(&mut s),
            [
                Command::LaneBackoff {
                    lane: a,
                    not_before: at(60),
                    level: 0
                },
                Command::Hold {
                    unit: UnitId(1),
                    lane: a,
                    reason: HoldReason::Stalled
                },
                Command::LaneBackoff {
                    lane: b,
                    not_before: at(120),
                    level: 0
                },
                Command::Hold {
                    unit: UnitId(2),
                    lane: b,
                    reason: HoldReason::Stalled
                },
            ]
        );
        (s, a, b)
    }

    #[test]
    fn held_heads_of_lanes_in_backoff_make_room_for_a_lane_with_work() {
        let (mut s, a, b) = window_of_held_heads();
        let (a1, b1, c1) = (UnitId(1), UnitId(2), UnitId(3));
        // A third lane has work; the window is full of heads that wait.
        let c = lane(&mut s, "https://c.example/inbox");
        assert!(!s.is_done(T0), "the held heads can make room: not done");
        // The head whose wait ends last goes back; the claim comes at the next call.
        assert_eq!(s.poll_claim(T0), None);
        assert_eq!(drain(&mut s), [Command::HandBack { unit: b1 }]);
        assert_eq!(s.admitted(), 1);
        assert_eq!(
            s.lane_wait(b),
            Some(LaneWait {
                level: 0,
                not_before: Some(at(120))
            }),
            "b keeps its wait"
        );
        let claims = s.poll_claim(T0).expect("c is read");
        assert_eq!(
            claims,
            [super::LaneClaim {
                lane: c,
                from: Seq(0),
                limit: 1
            }]
        );
        let report = s.handle_claimed(
            vec![LaneChunk {
                lane: c,
                units: vec![Admit::single(c1, Seq(3), c)],
                exhausted: true,
            }],
            T0,
        );
        assert!(report.refused.is_empty(), "{report:?}");
        assert_eq!(
            drain(&mut s),
            [Command::Start {
                unit: c1,
                lane: c,
                attempt: 1
            }]
        );
        s.handle_outcome(c1, c, Outcome::Delivered, at(1))
            .expect("in flight");
        assert_eq!(drain(&mut s), [Command::Delivered { unit: c1, lane: c }]);
        // Nothing waits for room any more: a's head stays held until its wait ends.
        assert_eq!(s.poll_claim(at(1)), None);
        assert_eq!(drain(&mut s), []);
        s.handle_timeout(at(60));
        assert_eq!(
            drain(&mut s),
            [Command::Start {
                unit: a1,
                lane: a,
                attempt: 1
            }]
        );
        s.handle_outcome(a1, a, Outcome::Delivered, at(61))
            .expect("in flight");
        assert_eq!(
            drain(&mut s),
            [
                Command::Delivered { unit: a1, lane: a },
                Command::LaneOpen { lane: a },
            ]
        );
        // b's wait ends: it is read again from its head, which starts.
        assert_eq!(s.poll_claim(at(61)), None, "b still waits");
        s.handle_timeout(at(120));
        let claims = s.poll_claim(at(120)).expect("b is read again");
        assert_eq!(
            claims,
            [super::LaneClaim {
                lane: b,
                from: Seq(2),
                limit: 2
            }]
        );
        s.handle_claimed(
            vec![LaneChunk {
                lane: b,
                units: vec![Admit::single(b1, Seq(2), b)],
                exhausted: true,
            }],
            at(120),
        );
        assert_eq!(
            drain(&mut s),
            [Command::Start {
                unit: b1,
                lane: b,
                attempt: 1
            }]
        );
    }

    #[test]
    fn held_heads_stay_held_when_no_lane_waits_for_room() {
        let (mut s, _, _) = window_of_held_heads();
        assert_eq!(s.poll_claim(T0), None);
        assert_eq!(drain(&mut s), []);
        assert_eq!(s.admitted(), 2);
        // Nothing to do but wait for the lanes in backoff: the pass may end (OL-10).
        assert!(s.is_done(T0));
    }

    #[test]
    fn a_head_with_an_attempt_in_flight_is_not_handed_back() {
        // A joined unit held in one lane while its other recipient is still in flight.
        let mut s = Scheduler::new(
            Config {
                max_units: 1,
                ..config()
            },
            7,
        );
        let a = lane(&mut s, "https://a.example/inbox");
        let b = lane(&mut s, "https://b.example/inbox");
        let u = UnitId(1);
        // A window of one is read one lane at a time: the unit is admitted when both
        // reads reached it.
        for _ in 0..2 {
            admit(&mut s, |_| vec![Admit::joined(u, Seq(1), &[a, b])]);
        }
        assert_eq!(s.admitted(), 1);
        let _ = drain(&mut s);
        s.handle_outcome(u, a, deferred(60), T0).expect("in flight");
        let _ = drain(&mut s);
        let c = lane(&mut s, "https://c.example/inbox");
        assert_eq!(s.poll_claim(T0), None);
        assert_eq!(
            drain(&mut s),
            [],
            "b's attempt is in flight: a's head stays"
        );
        // b answers: now the head may go back for c.
        s.handle_outcome(u, b, Outcome::Delivered, at(1))
            .expect("in flight");
        assert_eq!(drain(&mut s), [Command::Delivered { unit: u, lane: b }]);
        assert!(!s.is_done(at(1)));
        assert_eq!(s.poll_claim(at(1)), None);
        assert_eq!(drain(&mut s), [Command::HandBack { unit: u }]);
        let claims = s.poll_claim(at(1)).expect("c is read");
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].lane, c);
    }

    /// A lane the store says holds `pending` units.
    fn lane_with(s: &mut Scheduler, url: &str, pending: u32) -> LaneId {
        let l = s.lane(&LaneKey::new(url, None).expect("a valid URL"));
        let info = LaneInfo {
            pending,
            ..LaneInfo::default()
        };
        s.handle_lane(l, info, T0);
        l
    }

    fn delivered(unit: UnitId, lane: LaneId) -> Command {
        Command::Delivered { unit, lane }
    }

    fn start(unit: UnitId, lane: LaneId) -> Command {
        Command::Start {
            unit,
            lane,
            attempt: 1,
        }
    }

    /// Delivers `unit` on `lane` and returns the commands: its `Delivered`, then what started.
    fn deliver(s: &mut Scheduler, unit: UnitId, lane: LaneId) -> Vec<Command> {
        s.handle_outcome(unit, lane, Outcome::Delivered, T0)
            .expect("in flight");
        drain(s)
    }

    fn in_flight_of(max: usize) -> Config {
        Config {
            max_in_flight: max,
            ..config()
        }
    }

    #[test]
    fn a_free_place_goes_to_the_lane_with_the_most_work_left() {
        let mut s = Scheduler::new(in_flight_of(2), 7);
        let a = lane_with(&mut s, "https://a.example/inbox", 1);
        let b = lane_with(&mut s, "https://b.example/inbox", 1);
        let c = lane_with(&mut s, "https://c.example/inbox", 1);
        let d = lane_with(&mut s, "https://d.example/inbox", 5);
        let (a1, b1, c1, d1, d2) = (UnitId(1), UnitId(2), UnitId(3), UnitId(4), UnitId(5));
        admit(&mut s, |l| match l {
            l if l == a => vec![Admit::single(a1, Seq(1), l)],
            l if l == b => vec![Admit::single(b1, Seq(2), l)],
            l if l == c => vec![Admit::single(c1, Seq(3), l)],
            l => vec![Admit::single(d1, Seq(4), l), Admit::single(d2, Seq(5), l)],
        });
        // The first two ready heads take the two places; c and d wait.
        assert_eq!(drain(&mut s), [start(a1, a), start(b1, b)]);
        // A place frees: d's chain (5 units) goes before c's single unit, which came first.
        assert_eq!(deliver(&mut s, a1, a), [delivered(a1, a), start(d1, d)]);
        // d's next head is ready at once and takes the next place (4 units left).
        assert_eq!(deliver(&mut s, d1, d), [delivered(d1, d), start(d2, d)]);
        assert_eq!(deliver(&mut s, b1, b), [delivered(b1, b), start(c1, c)]);
    }

    #[test]
    fn an_attempt_its_host_holds_back_gives_its_place_to_another_lane() {
        let mut s = Scheduler::new(in_flight_of(2), 7);
        let a = lane_with(&mut s, "https://hangs.example/a", 1);
        let b = lane_with(&mut s, "https://hangs.example/b", 1);
        let c = lane_with(&mut s, "https://c.example/inbox", 1);
        let d = lane_with(&mut s, "https://d.example/inbox", 1);
        let (a1, b1, c1, d1) = (UnitId(1), UnitId(2), UnitId(3), UnitId(4));
        admit(&mut s, |l| match l {
            l if l == a => vec![Admit::single(a1, Seq(1), l)],
            l if l == b => vec![Admit::single(b1, Seq(2), l)],
            l if l == c => vec![Admit::single(c1, Seq(3), l)],
            l => vec![Admit::single(d1, Seq(4), l)],
        });
        assert_eq!(drain(&mut s), [start(a1, a), start(b1, b)]);
        // b's host holds it back (its window is full): b's place goes to c; b is still in
        // flight (its lane busy, the pass waiting for it).
        s.handle_host_wait(b1, b, 1, true, T0);
        assert_eq!(drain(&mut s), [start(c1, c)]);
        assert_eq!((s.in_flight(), s.places_taken()), (3, 2));
        // Reports that change nothing, or are about another attempt, are ignored.
        s.handle_host_wait(b1, b, 1, true, T0);
        s.handle_host_wait(a1, a, 2, true, T0);
        s.handle_host_wait(c1, c, 1, false, T0);
        assert_eq!(drain(&mut s), []);
        assert_eq!((s.in_flight(), s.places_taken()), (3, 2));
        // b goes: three places taken, above the bound; nothing starts until two are free.
        s.handle_host_wait(b1, b, 1, false, T0);
        assert_eq!((s.in_flight(), s.places_taken()), (3, 3));
        assert_eq!(deliver(&mut s, a1, a), [delivered(a1, a)]);
        assert_eq!(deliver(&mut s, b1, b), [delivered(b1, b), start(d1, d)]);
        // An attempt whose outcome comes while its host holds it back gives nothing twice;
        // a report after its outcome is ignored.
        s.handle_host_wait(d1, d, 1, true, T0);
        assert_eq!((s.in_flight(), s.places_taken()), (2, 1));
        assert_eq!(deliver(&mut s, d1, d), [delivered(d1, d)]);
        s.handle_host_wait(d1, d, 1, false, T0);
        assert_eq!((s.in_flight(), s.places_taken()), (1, 1));
        assert!(!s.is_done(T0), "c is still in flight");
        assert_eq!(deliver(&mut s, c1, c), [delivered(c1, c)]);
        assert_eq!((s.in_flight(), s.places_taken()), (0, 0));
    }

    #[test]
    fn a_light_unit_waits_at_most_aging_places() {
        let mut s = Scheduler::new(in_flight_of(1), 7);
        let x = lane_with(&mut s, "https://x.example/inbox", 1);
        let light = lane_with(&mut s, "https://light.example/inbox", 1);
        let heavy: Vec<LaneId> = (1..=3)
            .map(|i| lane_with(&mut s, &alloc::format!("https://h{i}.example/inbox"), 10))
            .collect();
        let (x1, l1) = (UnitId(1), UnitId(2));
        let h = |i: usize, k: u64| UnitId(10 * (i as u64 + 1) + k);
        admit(&mut s, |l| {
            if l == x {
                vec![Admit::single(x1, Seq(1), l)]
            } else if l == light {
                vec![Admit::single(l1, Seq(2), l)]
            } else {
                let i = heavy.iter().position(|&hl| hl == l).expect("a heavy lane");
                (0..2)
                    .map(|k| Admit::single(h(i, k), Seq(10 * (i as u64 + 1) + k), l))
                    .collect()
            }
        });
        assert_eq!(drain(&mut s), [start(x1, x)]);
        // Places 1-3 go to the heaviest heads (ties: the first to wait)...
        assert_eq!(
            deliver(&mut s, x1, x),
            [delivered(x1, x), start(h(0, 0), heavy[0])]
        );
        assert_eq!(
            deliver(&mut s, h(0, 0), heavy[0]),
            [
                Command::Delivered {
                    unit: h(0, 0),
                    lane: heavy[0]
                },
                start(h(1, 0), heavy[1])
            ]
        );
        assert_eq!(
            deliver(&mut s, h(1, 0), heavy[1]),
            [
                Command::Delivered {
                    unit: h(1, 0),
                    lane: heavy[1]
                },
                start(h(2, 0), heavy[2])
            ]
        );
        // ...the fourth to the unit waiting longest: the light lane's, though the heavy
        // lanes' next heads weigh more.
        assert_eq!(
            deliver(&mut s, h(2, 0), heavy[2]),
            [
                Command::Delivered {
                    unit: h(2, 0),
                    lane: heavy[2]
                },
                start(l1, light)
            ]
        );
    }

    #[test]
    fn equal_weights_start_in_the_order_they_became_ready() {
        let mut s = Scheduler::new(in_flight_of(1), 7);
        let lanes: Vec<LaneId> = (1..=4)
            .map(|i| lane(&mut s, &alloc::format!("https://e{i}.example/inbox")))
            .collect();
        admit(&mut s, |l| {
            let i = lanes.iter().position(|&x| x == l).expect("a lane") as u64;
            vec![Admit::single(UnitId(i + 1), Seq(i + 1), l)]
        });
        let mut order = Vec::new();
        for c in drain(&mut s) {
            if let Command::Start { unit, .. } = c {
                order.push(unit);
            }
        }
        for _ in 0..4 {
            let (unit, lane) = (order[order.len() - 1], lanes[order.len() - 1]);
            for c in deliver(&mut s, unit, lane) {
                if let Command::Start { unit, .. } = c {
                    order.push(unit);
                }
            }
        }
        assert_eq!(order, [UnitId(1), UnitId(2), UnitId(3), UnitId(4)]);
    }

    /// Lanes d (the store holds `pending` units of it), a and b, in a window of three: each
    /// gets one unit; a's is delivered, so d's share stays one (d and b have work). Returns
    /// what the scheduler asks to read then.
    fn claim_after_a_frees_room(pending: u32) -> Option<Vec<super::LaneClaim>> {
        let mut s = Scheduler::new(
            Config {
                max_units: 3,
                ..config()
            },
            7,
        );
        let d = lane_with(&mut s, "https://d.example/inbox", pending);
        let a = lane_with(&mut s, "https://a.example/inbox", 1);
        let b = lane_with(&mut s, "https://b.example/inbox", 1);
        let (d1, a1, b1) = (UnitId(1), UnitId(2), UnitId(3));
        let claims = s.poll_claim(T0).expect("every lane is read");
        assert_eq!(
            claims.iter().map(|c| c.limit).collect::<Vec<_>>(),
            [1, 1, 1]
        );
        let chunk = |lane, unit, seq, exhausted| LaneChunk {
            lane,
            units: vec![Admit::single(unit, Seq(seq), lane)],
            exhausted,
        };
        s.handle_claimed(
            vec![
                chunk(d, d1, 1, false),
                chunk(a, a1, 2, true),
                chunk(b, b1, 3, false),
            ],
            T0,
        );
        assert_eq!(drain(&mut s), [start(d1, d), start(a1, a), start(b1, b)]);
        assert_eq!(deliver(&mut s, a1, a), [delivered(a1, a)]);
        s.poll_claim(T0)
    }

    #[test]
    fn a_lane_of_a_few_units_waits_for_its_head_when_its_share_is_one() {
        // d holds 5 units: its next is read only once its head is answered.
        assert_eq!(claim_after_a_frees_room(5), None);
    }

    #[test]
    fn a_deep_lane_is_read_first_and_keeps_its_next_head_admitted() {
        // d holds more units than a lane may have admitted (64): in a window of three, with
        // a and b hungry too, it is read first, two units (its share is one).
        let mut s = Scheduler::new(
            Config {
                max_units: 3,
                ..config()
            },
            7,
        );
        let a = lane_with(&mut s, "https://a.example/inbox", 1);
        let b = lane_with(&mut s, "https://b.example/inbox", 1);
        let d = lane_with(&mut s, "https://d.example/inbox", 100);
        let claim = |lane, from, limit| super::LaneClaim {
            lane,
            from: Seq(from),
            limit,
        };
        assert_eq!(
            s.poll_claim(T0),
            Some(vec![claim(d, 0, 2), claim(a, 0, 1)]),
            "b waits for room"
        );
        let (d1, d2, d3, a1, b1) = (UnitId(1), UnitId(2), UnitId(3), UnitId(4), UnitId(5));
        s.handle_claimed(
            vec![
                LaneChunk {
                    lane: d,
                    units: vec![Admit::single(d1, Seq(1), d), Admit::single(d2, Seq(2), d)],
                    exhausted: false,
                },
                LaneChunk {
                    lane: a,
                    units: vec![Admit::single(a1, Seq(10), a)],
                    exhausted: true,
                },
            ],
            T0,
        );
        assert_eq!(drain(&mut s), [start(d1, d), start(a1, a)]);
        // d's head answered: its next one starts at once, and d reads its third.
        assert_eq!(deliver(&mut s, d1, d), [delivered(d1, d), start(d2, d)]);
        assert_eq!(s.poll_claim(T0), Some(vec![claim(d, 3, 1)]));
        answer(&mut s, d, vec![Admit::single(d3, Seq(3), d)], T0);
        // a's unit answered: b, which waited, takes the room.
        assert_eq!(deliver(&mut s, a1, a), [delivered(a1, a)]);
        assert_eq!(s.poll_claim(T0), Some(vec![claim(b, 0, 1)]));
        answer(&mut s, b, vec![Admit::single(b1, Seq(20), b)], T0);
        assert_eq!(drain(&mut s), [start(b1, b)]);
    }

    /// A joined unit of lanes a and b in a window of one, started on both.
    fn joined_in_a_window_of_one() -> (Scheduler, LaneId, LaneId, UnitId) {
        let mut s = Scheduler::new(
            Config {
                max_units: 1,
                ..config()
            },
            7,
        );
        let a = lane(&mut s, "https://a.example/inbox");
        let b = lane(&mut s, "https://b.example/inbox");
        let u = UnitId(1);
        for _ in 0..2 {
            admit(&mut s, |_| vec![Admit::joined(u, Seq(1), &[a, b])]);
        }
        assert_eq!(drain(&mut s), [start(u, a), start(u, b)]);
        (s, a, b, u)
    }

    /// Answers a claim of `lane` with `units`, the lane exhausted.
    fn answer(s: &mut Scheduler, lane: LaneId, units: Vec<Admit>, now: Timestamp) {
        let report = s.handle_claimed(
            vec![LaneChunk {
                lane,
                units,
                exhausted: true,
            }],
            now,
        );
        assert!(report.refused.is_empty(), "{report:?}");
    }

    #[test]
    fn a_joined_head_handed_back_is_read_again_in_each_of_its_lanes() {
        let (mut s, a, b, u) = joined_in_a_window_of_one();
        s.handle_outcome(u, a, deferred(60), T0).expect("in flight");
        s.handle_outcome(u, b, deferred(120), T0)
            .expect("in flight");
        let _ = drain(&mut s);
        let c = lane(&mut s, "https://c.example/inbox");
        assert_eq!(s.poll_claim(T0), None);
        assert_eq!(drain(&mut s), [Command::HandBack { unit: u }]);
        let claims = s.poll_claim(T0).expect("c is read");
        assert_eq!(claims[0].lane, c);
        answer(&mut s, c, vec![Admit::single(UnitId(3), Seq(3), c)], T0);
        assert_eq!(drain(&mut s), [start(UnitId(3), c)]);
        s.handle_outcome(UnitId(3), c, Outcome::Delivered, at(1))
            .expect("in flight");
        let _ = drain(&mut s);
        // a's wait ends: a is read again and reaches the joined unit, which waits for b.
        s.handle_timeout(at(60));
        let claims = s.poll_claim(at(60)).expect("a is read again");
        assert_eq!(
            (claims.len(), claims[0].lane, claims[0].from),
            (1, a, Seq(1))
        );
        answer(&mut s, a, vec![Admit::joined(u, Seq(1), &[a, b])], at(60));
        assert_eq!(drain(&mut s), []);
        assert_eq!(s.poll_claim(at(60)), None, "b still waits");
        // b's wait ends: b reaches it too, and it starts in both lanes.
        s.handle_timeout(at(120));
        let claims = s.poll_claim(at(120)).expect("b is read again");
        assert_eq!(
            (claims.len(), claims[0].lane, claims[0].from),
            (1, b, Seq(1))
        );
        answer(&mut s, b, vec![Admit::joined(u, Seq(1), &[a, b])], at(120));
        assert_eq!(drain(&mut s), [start(u, a), start(u, b)]);
    }

    #[test]
    fn a_head_handed_back_keeps_its_uncounted_throttles() {
        // pass_attempts 2: two throttles in a row stall a lane (OL-7), however the head
        // comes and goes.
        let mut s = Scheduler::new(
            Config {
                max_units: 1,
                ..config()
            },
            7,
        );
        let a = lane(&mut s, "https://a.example/inbox");
        let u = UnitId(1);
        admit(&mut s, |l| vec![Admit::single(u, Seq(1), l)]);
        let _ = drain(&mut s);
        // A throttle waited in the pass (uncounted), then the host defers the retry.
        let throttle = Outcome::Throttled {
            retry_after: Some(Duration::from_secs(1)),
        };
        s.handle_outcome(u, a, throttle, T0).expect("in flight");
        s.handle_timeout(at(1));
        let _ = drain(&mut s);
        s.handle_outcome(u, a, deferred(60), at(1))
            .expect("in flight");
        let _ = drain(&mut s);
        // A lane with work waits for room: the head goes back.
        let c = lane(&mut s, "https://c.example/inbox");
        assert_eq!(s.poll_claim(at(1)), None);
        assert_eq!(drain(&mut s), [Command::HandBack { unit: u }]);
        let _ = s.poll_claim(at(1)).expect("c is read");
        answer(&mut s, c, vec![Admit::single(UnitId(2), Seq(2), c)], at(1));
        s.handle_outcome(UnitId(2), c, Outcome::Delivered, at(2))
            .expect("in flight");
        let _ = drain(&mut s);
        // The head comes back with its persisted count (no counted attempt)...
        s.handle_timeout(at(61));
        let _ = s.poll_claim(at(61)).expect("a is read again");
        answer(&mut s, a, vec![Admit::single(u, Seq(1), a)], at(61));
        assert_eq!(drain(&mut s), [start(u, a)]);
        // ...and its next throttle is its second in a row: the lane stalls.
        s.handle_outcome(u, a, throttle, at(61)).expect("in flight");
        assert_eq!(
            drain(&mut s),
            [
                Command::RecordAttempt {
                    unit: u,
                    lane: a,
                    attempts: 0,
                    counted: false
                },
                Command::LaneBackoff {
                    lane: a,
                    not_before: at(91),
                    level: 1
                },
                Command::Hold {
                    unit: u,
                    lane: a,
                    reason: HoldReason::Stalled
                },
            ]
        );
    }
}
