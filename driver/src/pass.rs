//! One pass of one actor, advanced in rounds: the core's scheduler and pass session
//! executed against a store.
//!
//! A runtime's loop is:
//!
//! 1. [`PassCore::round`] (blocking: run it where store calls may block) executes every
//!    command the scheduler queued, in order, discovers and claims lane heads, renews the
//!    lease when the [`PassSession`] says so, fetches the payloads of the attempts it starts
//!    in one call, and returns the [`Job`]s to hand to the executor.
//! 2. Unless [`PassCore::ended`], wait for an event — completions (take every one that is
//!    waiting: one wake-up for many), a wake-up from an enqueue, [`PassCore::poll_timeout`],
//!    a stop or a cancellation — and feed it with the `handle_*` methods (cheap, no I/O).
//!    An async runtime first tries [`PassCore::try_round_inline`] on its own task: a round
//!    that only turns completions into acks and next starts (their payloads came with the
//!    claims) touches no store and needs no hop to the blocking pool; at the first write or
//!    renewal it stops, and [`PassCore::round`] goes on from there. A claim (a lane
//!    refilling its window) does not stop it: the runtime reads it where blocking is allowed
//!    ([`PassCore::take_claim`]) while the pass goes on, and hands the answer back
//!    ([`PassCore::handle_claim`]); one claim is out at a time.
//! 3. Back to 1. Once ended, [`PassCore::finish`] (blocking) hands every unfinished unit back,
//!    executes the commands still queued (acks included: a delivered unit is never sent
//!    again because its pass was cancelled) and flushes this pass's acks.
//!
//! # Operator actions reach a running pass (OL-14)
//!
//! A pass holds units it claimed earlier in its window; an operator's `lanes pause`, `purge`,
//! `skip-head` or `strict` changes the store, not the window. So that no unit of such a lane
//! starts once the action has returned — in this process or another, on SQLite or Postgres —
//! the pass starts attempts only on a *fresh* read of its actor's lane-control generation:
//!
//! - Every lane action bumps the actor's generation in its own transaction and stamps the lane
//!   with it (`ol_slots.control`, `ol_lanes.control`).
//! - The pass knows the generation from its token's acquisition, and reads it again
//!   ([`DriverStore::lane_controls`](outbox_lanes_store::DriverStore::lane_controls), one
//!   statement, fenced) before it hands out attempts on a read taken more than
//!   [`CONTROL_VALIDITY`](outbox_lanes_store::CONTROL_VALIDITY) (50 ms) ago — measured from an
//!   instant taken *before* the read was sent. A busy pass reads it at most once per 50 ms
//!   (an inline round that finds its read stale goes to the blocking round for it); a pass
//!   whose rounds are further apart reads it once per round that starts attempts. Never once
//!   per unit.
//! - When the generation moved, the same statement lists the lanes changed since; the round's
//!   starts of those lanes that were not sent yet are reported [`Outcome::NotSent`], and
//!   [`Scheduler::handle_lane_control`] hands back what the pass held of them (an attempt in
//!   flight finishes and is recorded) and reads them again from the store, which answers with
//!   the action applied. Then the round's steps run again before anything is sent.
//! - A pause, purge, skip-head or strict, when a pass holds the actor's slot, returns only 50
//!   ms after its commit.
//!
//! Why that is enough: the action commits at C and returns at R ≥ C + 50 ms. A read that did
//! not see it was taken before C, so its instant K is before C, and attempts start on it only
//! until K + 50 ms < R. Every attempt handed out after R was handed out on a read that saw the
//! action. Only lengths of time on monotonic clocks are compared, never two clocks (a relay
//! whose monotonic clock stands still meanwhile — a suspended VM — is outside the argument).
//!
//! What remains: an attempt handed to the executor before R may reach the recipient after R
//! — the time from the read to the request on the wire (spawning the delivery, connecting;
//! longer if the job waits for a worker or under a per-host cap). That is at most one attempt
//! per lane (one is in flight per lane), and it is the "attempt already in flight" the rule
//! allows: it finishes and is recorded — on the unit's dead letter if the action set the unit
//! aside. A relay of an older version (schema 3) does not take part.
//!
//! # Dead letters are written together (OL-16)
//!
//! The rule is about what is *sent*: no unit of a lane may reach the recipient before the
//! dead letter of the lane's earlier unit is durable, or a crash would resend that one after
//! it. So the dead letters the scheduler asks for while the queued commands are executed are
//! gathered and written at the end of that execution, in one
//! [`DriverStore::write_dead_letters`](outbox_lanes_store::DriverStore::write_dead_letters)
//! transaction, after the attempt records gathered with them (a dead letter keeps the
//! persisted count) — and before any other write (a lane state, a retirement: writes keep
//! their order), before the next claim, and before the round hands out a single job. Only
//! once it committed are they reported — INFO line, [`PassReport::dead_lettered`], the
//! [`Hooks::dead_lettered`] hook — once each, in the order they were asked for (lane order
//! within a lane). A failed write writes none of them and reports none; the pass ends and
//! the next one reads their units again.
//!
//! Outcomes that arrive together (the heads of many lanes refused at once) thus share one
//! commit. A single lane has one unit in flight, so its dead letters would still come one
//! per round; but a start whose destination nothing may be sent to — an IP literal the
//! address policy refuses, a URL that does not parse ([`Destination::check`], the checks of
//! [`RequestPolicy::build`](crate::request::RequestPolicy::build) that need no I/O, made
//! once per lane and pass) — needs no executor: its result is given to the scheduler in the
//! round itself, as an executor's would be (the `started` and `attempted` hooks are called
//! for it all the same), and the scheduler's next decision for the lane, usually its next
//! head's start, follows in the same execution. A deep refused lane is dead-lettered with
//! one transaction per claim of its heads instead of one per unit, and nothing of it is
//! sent. The driver decides nothing here: the scheduler does, on the same outcomes as
//! before. Such a start is resolved only on a fresh read of the lane controls, as a send
//! would be (an operator's pause or `strict` of the lane comes first, OL-14), and at most
//! 1,024 of them per round: a deep refused lane takes several rounds, each due at once, so
//! completions, stops and cancellations are taken in between.
//!
//! Failures on our side never count as attempts: a payload the store cannot give becomes
//! [`Outcome::NotSent`] (retried, not counted). A failed store write (an attempt record, a
//! dead letter, a lane state, a claim, the lease, or this pass's group-committed acks) ends
//! the pass at once: no attempt starts after it, and everything unfinished is handed back,
//! so a store that cannot write never lets the pass run ahead of what it recorded.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use outbox_lanes_core::policy::{AddressPolicy, Classifier};
use outbox_lanes_core::{
    ActorId, Admit, AdmitSlot, Command, DeadReason, HoldReason, LaneChunk, LaneClaim, LaneControl,
    LaneId, LaneInfo, Outcome, PassEnd, PassSession, Scheduler, SessionAction, SessionConfig,
    Timestamp, UnitId,
};
use outbox_lanes_store::{
    AttemptRecord, ChangedLane, ClaimRange, ClaimedLane, ControlRead, DeadLetterRequest,
    DeliveryLogEntry, IN_FLIGHT_MARK_AFTER, Payload, PendingLane, SlotToken, Store, StoreError,
    StoreLaneId, WrittenDeadLetter, error_class,
};
use tracing::{debug, info, trace, warn};

use crate::ack::AckWriter;
use crate::config::OutboxConfig;
use crate::fmt::rfc3339;
use crate::hooks::{Attempted, DeadLettered, Delivered, Hooks, LaneUnavailable, Started};
use crate::http::{AttemptResult, OutboxAddresses};
use crate::job::{Completions, Done, Job};
use crate::origins::OriginGate;
use crate::request::Destination;

/// The last error recorded for an attempt cut off in flight (OL-14): it does not count
/// toward the maximum, and says why the unit is sent again.
pub const INTERRUPTED: &str = "interrupted: the relay stopped with the attempt in flight";

/// How a pass ended, with its totals.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    /// Recipients served.
    pub delivered: u64,
    /// Recipients dead-lettered: one per dead letter the pass wrote, each unit of a lane a
    /// 410 retired included (one per call of the dead-letter hook).
    pub dead_lettered: u64,
    /// Units handed back at the end (stalled, waiting behind a stall, in backoff).
    pub handed_back: u64,
    /// The pass stopped at its time slice or for shutdown with work left.
    pub yielded: bool,
    /// A graceful stop's grace ended with attempts in flight: they were handed back
    /// unanswered (their units are delivered again later).
    pub grace_over: bool,
}

impl std::fmt::Display for PassReport {
    /// `12 delivered, 1 dead-lettered, 3 handed back` (and `, yielded`, `, grace over`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} delivered, {} dead-lettered, {} handed back",
            self.delivered, self.dead_lettered, self.handed_back
        )?;
        if self.yielded {
            f.write_str(", yielded")?;
        }
        if self.grace_over {
            f.write_str(", grace over")?;
        }
        Ok(())
    }
}

impl PassReport {
    /// Adds `other`'s totals to these.
    pub fn add(&mut self, other: &PassReport) {
        self.delivered += other.delivered;
        self.dead_lettered += other.dead_lettered;
        self.handed_back += other.handed_back;
        self.yielded |= other.yielded;
        self.grace_over |= other.grace_over;
    }
}

/// What [`PassCore::finish`] returns.
#[derive(Debug)]
pub struct PassResult {
    /// The totals.
    pub report: PassReport,
    /// Why the pass ended.
    pub end: PassEnd,
    /// The store failure that ended it, or a failure of the final ack flush.
    pub error: Option<StoreError>,
    /// When the slot's lease was acquired or last renewed: the next pass on the same slot
    /// starts from it ([`PassCore::new`]).
    pub lease_renewed: Timestamp,
}

/// What a round needs besides the pass itself.
#[derive(Clone, Copy)]
pub struct RoundContext<'a> {
    /// The store.
    pub store: &'a dyn Store,
    /// The shared ack writer.
    pub acks: &'a AckWriter,
    /// The embedding service's hooks.
    pub hooks: &'a Hooks,
    /// The process's hosts (the origin gate in front of the executor): a read of the lane
    /// controls that finds the operators' host-control generation moved gives them the
    /// hosts' rows before anything starts (OL-14 for hosts). `None`: no gate.
    pub hosts: Option<&'a OriginGate>,
}

/// Per-unit facts the pass keeps for tracing, hooks and its attempts.
struct UnitInfo {
    row_id: String,
    enqueued_at: Timestamp,
    /// Recipients not yet delivered or dead-lettered in this pass.
    open: usize,
    /// The payload, when the claim brought it: every attempt of the unit in this pass shares
    /// it, with no store read and no copy. Kept while the unit is admitted (the scheduler's
    /// byte budget bounds them all), dropped once it is resolved or handed back.
    payload: Option<Arc<Payload>>,
}

/// A lane's destination in this pass: the URL parsed once, and what its checks before
/// sending answered ([`Destination::check`]): the same for every attempt to the lane.
struct LaneDestination {
    to: Arc<Destination>,
    /// `Some`: nothing may be sent to it (a refused IP literal, a URL that does not parse, a
    /// host whose addresses the guard refused); every attempt comes to this.
    unsendable: Option<AttemptResult>,
    /// For a refused host name: until when its refusal is trusted ([`REFUSAL_TRUST`]), after
    /// which the next attempt resolves it again. `None`: for the whole pass.
    until: Option<Instant>,
}

/// How long a host name whose addresses the guard refused stays refused without being
/// resolved again: a DNS answer changes, a pass may run for hours.
const REFUSAL_TRUST: Duration = Duration::from_secs(60);

impl LaneDestination {
    /// What every attempt to the lane comes to now, if nothing may be sent to it.
    fn refused(&self) -> Option<&AttemptResult> {
        self.unsendable
            .as_ref()
            .filter(|_| self.until.is_none_or(|t| Instant::now() < t))
    }
}

/// A dead letter the scheduler asked for, waiting for the write of its execution's batch.
struct PendingDead {
    req: DeadLetterRequest,
    lane: LaneId,
    row: String,
}

/// An attempt handed to the executor, until its completion: its lane's in-flight mark
/// (`ol_lanes.in_flight_since`, written once it has been in flight for
/// [`IN_FLIGHT_MARK_AFTER`]) and its number and start for the delivery log.
struct Flight {
    unit: UnitId,
    attempt: u32,
    since: Timestamp,
    /// Its lane's in-flight mark is written (cleared once the attempt ends).
    marked: bool,
}

/// What the delivery log keeps of a finished attempt, until the command that records or
/// acks it takes it ([`DeliveryLogEntry`]).
struct LogInfo {
    attempt: u32,
    started_at: Timestamp,
    duration_ms: u64,
    status: Option<u16>,
    error_class: Option<String>,
    body: Option<String>,
}

/// How often at most a pass writes in-flight marks (a sweep).
const MARK_SWEEP: Duration = Duration::from_secs(1);

/// An attempt the scheduler started, waiting for its payload at the end of the round.
struct Start {
    unit: UnitId,
    lane: LaneId,
    attempt: u32,
}

/// One pass; see the [module docs](self).
pub struct PassCore {
    actor: ActorId,
    token: SlotToken,
    lease: Duration,
    seed: u64,
    sched: Scheduler,
    session: PassSession,
    lanes: HashMap<StoreLaneId, LaneId>,
    store_lanes: Vec<StoreLaneId>,
    recipients: Vec<String>,
    /// Each lane's recipient URL, parsed and checked at its first attempt in this pass and
    /// shared by its jobs from then on (by lane index).
    destinations: Vec<Option<LaneDestination>>,
    /// The address policy and classification of the HTTP clients: what
    /// [`Destination::check`] answers before anything is sent. The configuration's or the
    /// outbox's stored policy (OL-24), read again when the pass begins.
    addresses: AddressPolicy,
    own_addresses: AddressPolicy,
    outbox_addresses: OutboxAddresses,
    classifier: Classifier,
    units: HashMap<UnitId, UnitInfo>,
    last: HashMap<(UnitId, LaneId), AttemptResult>,
    watermark: u64,
    /// Look for lanes with new units at the next round (set at the start and on wake-ups:
    /// a burst of enqueues costs one look).
    look: bool,
    sink: Arc<dyn Completions>,
    /// Shared with every job this pass started; cleared when the pass ends.
    live: Arc<AtomicBool>,
    /// The store's outbox id, the first half of every idempotency key, read at the first
    /// start and shared by the pass's jobs.
    outbox: Option<Arc<str>>,
    report: PassReport,
    end: Option<PassEnd>,
    /// A store write failed: nothing more is written or started (acks excepted).
    error: Option<StoreError>,
    records: Vec<AttemptRecord>,
    /// Dead letters of the commands executed so far, written together at the end of the
    /// execution (one transaction), before any later write and before the round sends
    /// anything (OL-16).
    dead: Vec<PendingDead>,
    /// Lanes throttled or in backoff (level 0: throttled by a Retry-After), as this pass last
    /// wrote or read them: what the INFO lines of a probe and a recovery need.
    waiting: HashMap<LaneId, u32>,
    /// The last failure per lane (status, error), for the INFO line of its backoff; only
    /// failures write it, a delivery removes it.
    lane_failure: HashMap<LaneId, (Option<u16>, Option<String>)>,
    /// Lanes whose last attempt its host deferred (OL-21): their hold logs at DEBUG only.
    host_held: HashSet<LaneId>,
    /// Lanes whose dead letters for a refused destination or a permanent answer this pass
    /// logged at WARN already: once per lane and pass, the rest at INFO.
    refusals_warned: HashSet<LaneId>,
    /// Lanes whose host an operator holds, met by an attempt: paused for the host in the
    /// store at the next write (with the host's origin).
    host_pauses: Vec<(StoreLaneId, String)>,
    /// Deliveries of this round, handed to the ack writer together at its end.
    acked: Vec<(UnitId, StoreLaneId)>,
    /// The delivery log's entries of `acked`, committed with them.
    acked_log: Vec<DeliveryLogEntry>,
    /// The delivery log's entries of `records`, written with them.
    records_log: Vec<DeliveryLogEntry>,
    /// Finished attempts waiting for the command that records or acks them (log on only).
    log_info: HashMap<(UnitId, LaneId), LogInfo>,
    /// The store keeps a delivery log (`None`: not asked yet; asked at the first round).
    log_on: Option<bool>,
    /// Attempts handed to the executor and not yet finished, by lane.
    flights: HashMap<LaneId, Flight>,
    /// Lanes whose in-flight mark is to be cleared (their attempt ended).
    unmarks: Vec<LaneId>,
    /// When to look for attempts in flight for longer than [`IN_FLIGHT_MARK_AFTER`] next
    /// (`None`: none could be).
    next_sweep: Option<Timestamp>,
    /// The session asked for a lease renewal; done at the next round.
    renew_due: bool,
    /// The claim an inline round handed to the runtime, read where blocking is allowed
    /// while the pass goes on; no other is planned until it is answered.
    claim: ClaimOut,
    /// Commands taken from the scheduler by an inline round that needed the store for them:
    /// the next round executes them first, in order.
    deferred: VecDeque<Command>,
    /// Starts of an inline round that could not finish without the store, or of a round
    /// that could not make its read of the lane controls fresh; the next round sends them
    /// with its own.
    pending_starts: Vec<Start>,
    /// What [`PassCore::waiting_changed`] last said.
    only_waiting: bool,
    /// Starts to a destination nothing may be sent to resolved in the current round
    /// ([`RESOLVED_PER_ROUND`] at most).
    resolved: usize,
    /// The actor's lane-control generation as last read, and when (OL-14): attempts start
    /// only while it is fresh.
    control: ControlRead,
    /// No round ran yet.
    first_round: bool,
    /// The endpoints' rate limits, and the memory of their last starts this process shares
    /// between passes (OL-23).
    rates: crate::rates::RateLimits,
}

/// Reads of the lane controls one round makes at most before it leaves its starts for the
/// next round (only a store slower than [`outbox_lanes_store::CONTROL_VALIDITY`] per round
/// needs more than two).
const CONTROL_READS_PER_ROUND: usize = 4;

/// Starts to a destination nothing may be sent to that one round resolves at most: past it,
/// they wait for the next round (at once, see [`PassCore::poll_timeout`]), so that a deep
/// refused lane cannot keep a round going (and other lanes' completions, a stop or a
/// cancellation waiting) for as long as it is deep.
const RESOLVED_PER_ROUND: usize = 1024;

/// An inline round stopped: what is left needs the store.
#[derive(Debug)]
struct NeedsStore;

impl std::fmt::Debug for PassCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassCore")
            .field("actor", &self.actor)
            .field("seed", &self.seed)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

/// The wall clock as the core's timestamp.
pub fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

/// A fresh seed for a pass's jitter (logged with the pass, so its run can be replayed).
pub(crate) fn fresh_seed() -> u64 {
    let t = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // Mixed with the process id: two passes started in the same nanosecond differ.
    t ^ (u64::from(std::process::id()) << 32)
}

/// A claim an inline round planned ([`PassCore::take_claim`], [`PassCore::handle_claim`]).
enum ClaimOut {
    /// None out: a round may plan one.
    None,
    /// Planned, for the runtime to take.
    Planned(Vec<ClaimRange>),
    /// Taken by the runtime, not yet answered.
    Reading,
}

impl PassCore {
    /// A pass holding `token`, whose completions arrive through `sink`, starting at `now`;
    /// the slot's lease was acquired or last renewed at `lease_renewed` (the acquisition
    /// time for a drain's first pass, then [`PassResult::lease_renewed`] of the one before),
    /// so the lease is renewed every third of it across back-to-back passes.
    pub fn new(
        token: SlotToken,
        config: &OutboxConfig,
        sink: Arc<dyn Completions>,
        now: Timestamp,
        lease_renewed: Timestamp,
    ) -> PassCore {
        let seed = config.seed.unwrap_or_else(fresh_seed);
        let actor = token.actor().clone();
        let control = token.control();
        debug!(%actor, seed, "pass started");
        PassCore {
            actor,
            token,
            lease: config.lease,
            seed,
            sched: Scheduler::new(config.pass_scheduler(), seed),
            session: PassSession::new(
                SessionConfig {
                    time_slice: config.time_slice,
                    lease: config.lease,
                    shutdown_grace: config.shutdown_grace,
                },
                now,
            )
            .with_lease_renewed_at(lease_renewed),
            lanes: HashMap::new(),
            store_lanes: Vec::new(),
            recipients: Vec::new(),
            destinations: Vec::new(),
            addresses: config.http.allowed(),
            own_addresses: config.http.addresses,
            outbox_addresses: config.http.outbox_addresses.clone(),
            classifier: config.http.classifier.clone(),
            units: HashMap::new(),
            last: HashMap::new(),
            watermark: 0,
            look: true,
            sink,
            live: Arc::new(AtomicBool::new(true)),
            outbox: None,
            report: PassReport::default(),
            end: None,
            error: None,
            records: Vec::new(),
            dead: Vec::new(),
            waiting: HashMap::new(),
            lane_failure: HashMap::new(),
            host_held: HashSet::new(),
            refusals_warned: HashSet::new(),
            host_pauses: Vec::new(),
            acked: Vec::new(),
            acked_log: Vec::new(),
            records_log: Vec::new(),
            log_info: HashMap::new(),
            log_on: None,
            flights: HashMap::new(),
            unmarks: Vec::new(),
            next_sweep: None,
            renew_due: false,
            deferred: VecDeque::new(),
            pending_starts: Vec::new(),
            claim: ClaimOut::None,
            only_waiting: false,
            resolved: 0,
            control,
            first_round: true,
            rates: config.rates.clone(),
        }
    }

    /// The seed of this pass's jitter.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The slot token the pass holds.
    pub fn token(&self) -> &SlotToken {
        &self.token
    }

    /// Why the pass ended, once it has.
    pub fn ended(&self) -> Option<PassEnd> {
        self.end
    }

    /// The actor of this pass.
    pub fn actor(&self) -> &ActorId {
        &self.actor
    }

    /// Whether the pass came to only wait (`Some(true)`) or has work again (`Some(false)`)
    /// since the last call; `None`: no change. Waiting: attempts in flight, and nothing
    /// startable, to read or to write now ([`Scheduler::only_waits`]). A runtime reports
    /// it through [`DrainControl::report_waiting`](crate::DrainControl::report_waiting)
    /// after each round, so a monitor does not count a pass that waits on a hanging
    /// recipient against its bound (OL-13). A pass waiting only for an in-pass retry's timer
    /// still counts: waiting passes each hold an attempt in flight, so `concurrency` bounds
    /// them.
    pub fn waiting_changed(&mut self) -> Option<bool> {
        let t = now();
        let waiting = self.end.is_none()
            && !self.look
            && !self.renew_due
            && self.pending_starts.is_empty()
            && self.deferred.is_empty()
            && self.records.is_empty()
            && self.sched.in_flight() > 0
            && self.sched.only_waits(t);
        (waiting != self.only_waiting).then(|| {
            self.only_waiting = waiting;
            waiting
        })
    }

    /// The claim an inline round planned, once: the runtime reads it where blocking is
    /// allowed ([`DriverStore::claim`](outbox_lanes_store::DriverStore::claim) with this
    /// pass's [`PassCore::token`]) and hands the answer to [`PassCore::handle_claim`]. The
    /// pass goes on meanwhile: completions, acks and the starts of units already claimed do
    /// not wait for the read.
    pub fn take_claim(&mut self) -> Option<Vec<ClaimRange>> {
        match std::mem::replace(&mut self.claim, ClaimOut::Reading) {
            ClaimOut::Planned(ranges) => Some(ranges),
            other => {
                self.claim = other;
                None
            }
        }
    }

    /// The answer to the claim [`PassCore::take_claim`] handed out (and to a blocking round's
    /// own). A failed read releases what the claim reserved and ends the pass.
    pub fn handle_claim(&mut self, answer: Result<Vec<ClaimedLane>, StoreError>) {
        self.claim = ClaimOut::None;
        let t = now();
        match answer {
            Ok(lanes) => self.admit_claimed(lanes),
            Err(e) => {
                self.sched.handle_claim_failed(t);
                self.store_failed("claim", e, t);
            }
        }
    }

    /// Attempts in flight (the scheduler's count: started, not yet completed).
    pub fn in_flight(&self) -> usize {
        self.sched.in_flight()
    }

    /// The next instant the pass must be woken without an event: a retry or probe due, a
    /// lease renewal, the end of the time slice or of the grace period.
    pub fn poll_timeout(&mut self) -> Option<Timestamp> {
        if !self.pending_starts.is_empty() {
            // Starts left by a round that could not read the lane controls: at once.
            return Some(now());
        }
        if !self.unmarks.is_empty() {
            return Some(now());
        }
        [
            self.sched.poll_timeout(),
            self.session.poll_timeout(),
            self.next_sweep,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// An attempt finished.
    pub fn handle_done(&mut self, d: Done, hooks: &Hooks, now: Timestamp) {
        let latency = d.started.elapsed();
        self.finished(d.unit, d.lane, d.result, latency, hooks, now);
    }

    /// The result of an attempt, from the executor or (for a destination nothing may be sent
    /// to) from the round that started it: hooks, logs, and the scheduler's input.
    fn finished(
        &mut self,
        unit: UnitId,
        lane: LaneId,
        result: AttemptResult,
        latency: Duration,
        hooks: &Hooks,
        now: Timestamp,
    ) {
        let outcome = result.outcome;
        let flight = match self.flights.get(&lane) {
            Some(f) if f.unit == unit => self.flights.remove(&lane),
            _ => None,
        };
        if let Some(f) = flight {
            if f.marked {
                self.unmarks.push(lane);
            }
            let counted = !matches!(
                outcome,
                Outcome::Held | Outcome::Deferred { .. } | Outcome::NotSent
            );
            if counted && self.log_on != Some(false) {
                self.log_info.insert(
                    (unit, lane),
                    LogInfo {
                        attempt: f.attempt,
                        started_at: now.saturating_sub(latency),
                        duration_ms: u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
                        status: result.status,
                        error_class: result.error.as_deref().map(|e| error_class(e).to_owned()),
                        body: result.body.clone(),
                    },
                );
            }
        }
        if crate::http::is_refusal(&result) {
            // The guard refused every address the lane's host resolved to: the lane's later
            // starts come to the same for a while, in their round and without a job each, as
            // for a refused IP literal.
            if let Some(Some(d)) = self.destinations.get_mut(lane.index()) {
                if d.unsendable.is_none() || d.until.is_some() {
                    d.unsendable = Some(result.clone());
                    d.until = Some(Instant::now() + REFUSAL_TRUST);
                }
            }
        }
        trace!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
            outcome = outcome.as_str(),
            retry_after_ms = outcome.retry_after().map(|d| d.as_millis() as u64),
            status = result.status,
            error = result.error.as_deref(), took_ms = latency.as_millis() as u64,
            "attempt finished");
        if let Some(hook) = &hooks.attempted {
            let queued = self.units.get(&unit).map_or(Duration::ZERO, |u| {
                now.saturating_sub(latency)
                    .saturating_duration_since(u.enqueued_at)
            });
            hook(&Attempted {
                actor: self.actor.clone(),
                unit,
                recipient: self.recipient(lane).to_owned(),
                outcome,
                status: result.status,
                latency,
                queued,
            });
        }
        // Kept for the attempt record or dead letter a failure may lead to; a delivery and
        // an attempt that never left need none.
        if outcome == Outcome::Held {
            // An operator holds the host: the scheduler pauses the lane in the pass, and the
            // pause is persisted for the host, so that `hosts unblock` resumes it.
            debug!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
                error = result.error.as_deref(), "attempt held: its host is blocked by an operator");
            let origin = self.destination(lane).origin().to_string();
            self.host_pauses.push((self.store_lane(lane), origin));
        } else if let Outcome::Deferred { .. } = outcome {
            // Held for its host (origin health, OL-21): the host's state is logged once, by
            // the gate; its lanes' holds are not news.
            debug!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
                error = result.error.as_deref(), "attempt deferred: its host is not contacted now");
            self.host_held.insert(lane);
        } else if outcome != Outcome::NotSent && outcome != Outcome::Delivered {
            self.lane_failure
                .insert(lane, (result.status, result.error.clone()));
            self.last.insert((unit, lane), result);
        }
        if let Err(e) = self.sched.handle_outcome(unit, lane, outcome, now) {
            debug!(error = %e, "late completion ignored");
        }
    }

    /// New rows were enqueued somewhere: look for lanes with new units at the next round.
    pub fn handle_wake(&mut self) {
        self.look = true;
    }

    /// The time from [`PassCore::poll_timeout`] came (or any time: extra calls are harmless).
    pub fn handle_timeout(&mut self, now: Timestamp) {
        self.sched.handle_timeout(now);
    }

    /// A graceful stop was asked (shutdown, a stop request): nothing new starts, attempts in
    /// flight finish within the grace period.
    pub fn handle_shutdown(&mut self, now: Timestamp) {
        // Also while stopping for the time slice: the stop becomes a shutdown's, whose grace
        // starts now (a slice has none, and would wait for a hanging attempt's timeout).
        if self.end.is_none() {
            self.session.handle_shutdown(now);
        }
    }

    /// Whether the time slice applies to this pass: see
    /// [`PassSession::set_slicing`](outbox_lanes_core::PassSession::set_slicing).
    pub fn set_slicing(&mut self, on: bool) {
        self.session.set_slicing(on);
    }

    /// The caller went away: the pass ends at the next round, handing everything back.
    pub fn handle_cancel(&mut self, now: Timestamp) {
        self.session.handle_cancel(now);
        self.take_session_actions(now);
    }

    /// The scheduler's view of a lane's persisted state, as a discovery or a lane control
    /// read it, with its endpoint's pace and the process's memory of its last start.
    fn lane_info(&self, s: &PendingLane) -> LaneInfo {
        let recipient = s.key.recipient();
        let pace = self.rates.endpoint_interval(self.actor.as_str(), recipient);
        LaneInfo {
            not_before: s.not_before,
            level: s.backoff_level,
            strict: s.strict,
            failing_since: s.failing_since,
            unavailable: s.unavailable_since.is_some(),
            pace,
            paced_until: pace.and_then(|_| self.rates.paced_until(self.actor.as_str(), recipient)),
        }
    }

    /// An attempt of `lane` starts: a paced endpoint's next start is remembered for the
    /// passes after this one.
    fn paced_start(&self, lane: LaneId) {
        if self.rates.is_empty() {
            return;
        }
        let recipient = self.recipient(lane);
        if let Some(pace) = self.rates.endpoint_interval(self.actor.as_str(), recipient) {
            let t = now();
            self.rates
                .started(self.actor.as_str(), recipient, t.saturating_add(pace), t);
        }
    }

    fn recipient(&self, lane: LaneId) -> &str {
        self.recipients.get(lane.index()).map_or("", String::as_str)
    }

    fn store_lane(&self, lane: LaneId) -> StoreLaneId {
        self.store_lanes
            .get(lane.index())
            .copied()
            .unwrap_or(StoreLaneId(0))
    }

    fn lane(&mut self, id: StoreLaneId, key: &outbox_lanes_core::LaneKey) -> LaneId {
        if let Some(l) = self.lanes.get(&id) {
            return *l;
        }
        let l = self.sched.lane(key);
        self.lanes.insert(id, l);
        if self.store_lanes.len() <= l.index() {
            self.store_lanes.resize(l.index() + 1, StoreLaneId(0));
            self.recipients.resize(l.index() + 1, String::new());
        }
        self.store_lanes[l.index()] = id;
        self.recipients[l.index()] = key.recipient().to_string();
        l
    }

    /// A store call failed: nothing more is written or started; the pass ends.
    fn store_failed(&mut self, what: &str, e: StoreError, now: Timestamp) {
        warn!(actor = %self.actor, error = %e, what, "store failed; the pass stops starting attempts and hands everything back");
        if self.error.is_none() {
            self.error = Some(e);
        }
        self.session.handle_store_failed(now);
        self.take_session_actions(now);
    }

    /// Applies the session's decisions; returns whether the scheduler was told to stop.
    fn take_session_actions(&mut self, now: Timestamp) -> bool {
        let mut stopped = false;
        while let Some(action) = self.session.poll_action() {
            match action {
                SessionAction::RenewLease => {
                    // Renewed in the round (it needs the store); remembered here.
                    self.renew_due = true;
                }
                SessionAction::StopStarting(reason) => {
                    debug!(actor = %self.actor, %reason, "pass stopping: nothing new starts");
                    self.sched.handle_stop(now);
                    stopped = true;
                }
                SessionAction::End(end) => {
                    if self.end.is_none() {
                        self.end = Some(end);
                    }
                }
            }
        }
        stopped
    }
}

impl PassCore {
    /// One round (blocking); see the [module docs](self). Returns the attempts to hand to the
    /// executor, each with its payload.
    pub fn round(&mut self, cx: RoundContext<'_>) -> Vec<Job> {
        if self.log_on.is_none() {
            self.log_on = Some(cx.store.logs_deliveries());
        }
        let mut starts = std::mem::take(&mut self.pending_starts);
        if self.end.is_some() {
            return Vec::new();
        }
        self.resolved = 0;
        if let Some(e) = cx.acks.failure(&self.token) {
            self.store_failed("ack", e, now());
        }
        if self.first_round {
            // OL-24: the outbox's destination policy as stored now (widened by another
            // process, or narrowed by an operator, since this one opened), before the pass's
            // first start; the HTTP clients read the same handle.
            match cx.store.destination_policy() {
                Ok(p) => {
                    self.outbox_addresses.set(p);
                    self.addresses = self.outbox_addresses.allowing(self.own_addresses);
                }
                Err(e) => self.store_failed("destination policy", e, now()),
            }
        }
        // The token's read of the lane controls carries no host-control generation: with a
        // host book, the first round reads both (OL-14 for hosts), so that a host action
        // that committed before this pass began reaches the book before its first start.
        if std::mem::take(&mut self.first_round)
            && (cx.hosts.is_some() || !self.control.fresh_at(Instant::now()))
        {
            // The token may be an earlier pass's: what the pass discovers next is read after
            // a fresh generation, so only later actions count as changes.
            if let Err(e) = self.read_controls(cx, &mut starts, false) {
                self.store_failed("lane controls", e, now());
            }
        }
        if self.look && self.end.is_none() {
            self.look = false;
            if let Err(e) = self.discover(cx.store) {
                self.store_failed("discover", e, now());
            }
        }
        // Payloads read this round for starts whose claim did not bring them.
        let mut fetched = HashMap::new();
        let mut reads = 0;
        loop {
            // Not inline: it never stops for the store.
            let _ = self.steps(cx, &mut starts, false);
            if self.end.is_some() || starts.is_empty() {
                // Never sent: the attempts the scheduler started this round are handed back
                // with everything else by `finish`.
                return Vec::new();
            }
            if !self.control.fresh_at(Instant::now()) {
                if reads == CONTROL_READS_PER_ROUND {
                    break;
                }
                reads += 1;
                // The last read of the lane controls is too old to start on (OL-14).
                match self.read_controls(cx, &mut starts, true) {
                    // An operator changed lanes: their starts are gone, and what the change
                    // queued (hand-backs, reads, other starts) runs first.
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(StoreError::Busy) => break,
                    Err(e) => {
                        self.store_failed("lane controls", e, now());
                        return Vec::new();
                    }
                }
            }
            // Starts made while the read was too old, to a destination nothing may be sent
            // to: they come to their result now, and what the scheduler makes of it (a dead
            // letter, the lane's next start) runs first. None of them becomes a job.
            if self.resolve_unsendable(cx.hooks, &mut starts) {
                continue;
            }
            self.read_payloads(cx.store, &mut starts, &mut fetched);
            if self.end.is_some() {
                return Vec::new();
            }
            if self.control.fresh_at(Instant::now()) {
                return self.jobs(cx, &starts, &mut fetched);
            }
        }
        // The store was busy, or too slow to answer within the read's validity: the next
        // round tries again, at once (see `poll_timeout`).
        debug!(actor = %self.actor, starts = starts.len(),
            "lane controls not read in time; the starts wait for the next round");
        self.pending_starts.extend(starts);
        Vec::new()
    }

    /// One round without the store, on the caller's thread (an async runtime's task): taken
    /// when the round has nothing to read or write, as a round that only turns completions
    /// into the next starts with payloads the claims brought. `None`: the round needs the
    /// store; run [`PassCore::round`] where blocking is allowed — it goes on from here
    /// (commands already taken and starts already made are kept in order).
    pub fn try_round_inline(&mut self, cx: RoundContext<'_>) -> Option<Vec<Job>> {
        if self.end.is_some() {
            return Some(Vec::new());
        }
        if self.look || self.renew_due {
            return None;
        }
        if let Some(e) = cx.acks.failure(&self.token) {
            self.store_failed("ack", e, now());
        }
        self.resolved = 0;
        let mut starts = std::mem::take(&mut self.pending_starts);
        let needs_store = self.steps(cx, &mut starts, true).is_err();
        if self.end.is_some() {
            return Some(Vec::new());
        }
        let cached = starts.iter().all(|s| {
            self.units.get(&s.unit).is_some_and(|u| u.payload.is_some())
                && !self.is_unsendable(s.lane)
        });
        // Starts need a fresh read of the lane controls (OL-14), which is a store read.
        let fresh = starts.is_empty() || self.control.fresh_at(Instant::now());
        if needs_store || !cached || !fresh {
            self.pending_starts = starts;
            return None;
        }
        Some(self.jobs(cx, &starts, &mut HashMap::new()))
    }

    /// The body of a round, shared by both kinds: the queued commands in order, claims, timers
    /// that fell due, the session's tick and the lease renewal, until there is nothing more
    /// to do now or the pass ended. `inline`: without the store — it stops with
    /// [`NeedsStore`] at the first claim, store write or renewal, keeping everything in order
    /// for the blocking round that goes on from there.
    fn steps(
        &mut self,
        cx: RoundContext<'_>,
        starts: &mut Vec<Start>,
        inline: bool,
    ) -> Result<(), NeedsStore> {
        loop {
            self.execute(cx, starts, inline)?;
            if self.end.is_some() {
                return Ok(());
            }
            let t = now();
            // Timers that fell due fire first: a retry or a probe may queue starts.
            self.sched.handle_timeout(t);
            let idle = matches!(self.claim, ClaimOut::None);
            if let Some(claims) = idle.then(|| self.sched.poll_claim(t)).flatten() {
                let ranges = self.claim_ranges(&claims);
                if inline {
                    // The read goes out from the runtime and the round goes on: a lane
                    // refilling its window does not hold back its next attempt, nor a
                    // completion its ack, for a read of the store.
                    self.claim = ClaimOut::Planned(ranges);
                    continue;
                }
                let answer = cx.store.claim(&self.token, &ranges);
                self.handle_claim(answer);
                continue;
            }
            let done = self.sched.is_done(t);
            if self.execute(cx, starts, inline)? > 0 {
                continue;
            }
            self.session.handle_tick(t, self.sched.in_flight(), done);
            let stopped = self.take_session_actions(t);
            if self.renew_due && self.end.is_none() {
                if inline {
                    return Err(NeedsStore);
                }
                self.renew_due = false;
                match cx.store.renew_slot(&self.token, self.lease) {
                    Ok(()) => self.session.handle_lease_renewed(now()),
                    Err(e) => self.store_failed("lease renewal", e, now()),
                }
                let _ = self.take_session_actions(now());
            }
            if !stopped {
                return Ok(());
            }
        }
    }

    /// Reads, in one call, the payloads of this round's starts that neither their claim
    /// brought nor an earlier read of the round did. A start whose payload cannot be read is
    /// not sent (reported [`Outcome::NotSent`]: retried, never counted) and leaves `starts`.
    fn read_payloads(
        &mut self,
        store: &dyn Store,
        starts: &mut Vec<Start>,
        fetched: &mut HashMap<UnitId, Arc<Payload>>,
    ) {
        // A joined unit starts once per member lane: its payload is read once.
        let mut missing: Vec<UnitId> = starts
            .iter()
            .filter(|s| {
                !fetched.contains_key(&s.unit)
                    && self.units.get(&s.unit).is_none_or(|u| u.payload.is_none())
            })
            .map(|s| s.unit)
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if missing.is_empty() {
            return;
        }
        let mut failed: HashMap<UnitId, StoreError> = HashMap::new();
        for (unit, p) in missing.iter().zip(store.payloads(&missing)) {
            match p {
                Ok(payload) => {
                    fetched.insert(*unit, Arc::new(payload));
                }
                Err(e) => {
                    failed.insert(*unit, e);
                }
            }
        }
        if failed.is_empty() {
            return;
        }
        let t = now();
        let mut kept = Vec::with_capacity(starts.len());
        for s in starts.drain(..) {
            let Some(e) = failed.get(&s.unit) else {
                kept.push(s);
                continue;
            };
            // Our side failed, the recipient saw nothing: retried, never counted.
            debug!(unit = %s.unit, error = %e, "payload not read; the attempt is not sent");
            if let Err(e) = self
                .sched
                .handle_outcome(s.unit, s.lane, Outcome::NotSent, t)
            {
                debug!(error = %e, "not-sent outcome ignored");
            }
            // A busy database may answer next time; any other failure (the unit is gone, the
            // database is) means the pass's view is stale: end it.
            if *e != StoreError::Busy {
                self.store_failed("payload", e.clone(), t);
            }
        }
        *starts = kept;
    }

    /// Whether nothing may be sent to `lane`'s destination ([`Destination::check`]), as
    /// checked when the lane's first start in this pass was executed.
    fn is_unsendable(&self, lane: LaneId) -> bool {
        self.destinations
            .get(lane.index())
            .and_then(Option::as_ref)
            .is_some_and(|d| d.refused().is_some())
    }

    /// On a fresh read of the lane controls (OL-14): takes the starts whose destination
    /// nothing may be sent to out of `starts` and gives the scheduler their results, as an
    /// executor would, up to [`RESOLVED_PER_ROUND`] in the round; those past it go to the
    /// next round's starts. Returns whether any was resolved (their commands are queued).
    fn resolve_unsendable(&mut self, hooks: &Hooks, starts: &mut Vec<Start>) -> bool {
        if !starts.iter().any(|s| self.is_unsendable(s.lane))
            || !self.control.fresh_at(Instant::now())
        {
            return false;
        }
        let mut resolved = false;
        let mut kept = Vec::with_capacity(starts.len());
        for s in std::mem::take(starts) {
            let unsendable = self.lane_destination(s.lane).refused().cloned();
            match unsendable {
                Some(result) if self.resolved < RESOLVED_PER_ROUND => {
                    self.resolved += 1;
                    resolved = true;
                    self.not_sendable(hooks, s.unit, s.lane, s.attempt, result);
                }
                // Never a job: the next round resolves it.
                Some(_) => self.pending_starts.push(s),
                None => kept.push(s),
            }
        }
        *starts = kept;
        resolved
    }

    /// Makes the jobs of this round's starts, each with the payload its claim brought or the
    /// round read. Called only on a fresh read of the lane controls (OL-14).
    fn jobs(
        &mut self,
        cx: RoundContext<'_>,
        starts: &[Start],
        fetched: &mut HashMap<UnitId, Arc<Payload>>,
    ) -> Vec<Job> {
        if self.end.is_some() || starts.is_empty() {
            return Vec::new();
        }
        let hooks = cx.hooks;
        let outbox = Arc::clone(
            self.outbox
                .get_or_insert_with(|| Arc::from(cx.store.outbox_id())),
        );
        let mut jobs = Vec::with_capacity(starts.len());
        let t = now();
        for s in starts {
            let cached = self.units.get(&s.unit).and_then(|u| u.payload.clone());
            let Some(payload) = cached.or_else(|| fetched.remove(&s.unit)) else {
                // Every start's payload was cached or read (`read_payloads`).
                debug!(unit = %s.unit, "no payload; the attempt is not sent");
                if let Err(e) = self
                    .sched
                    .handle_outcome(s.unit, s.lane, Outcome::NotSent, now())
                {
                    debug!(error = %e, "not-sent outcome ignored");
                }
                continue;
            };
            let destination = self.destination(s.lane);
            self.flights.insert(
                s.lane,
                Flight {
                    unit: s.unit,
                    attempt: s.attempt,
                    since: t,
                    marked: false,
                },
            );
            if self.next_sweep.is_none() {
                self.next_sweep = Some(t.saturating_add(IN_FLIGHT_MARK_AFTER));
            }
            jobs.push(Job::new(
                self.actor.clone(),
                Arc::clone(&outbox),
                s.unit,
                s.lane,
                destination,
                s.attempt,
                payload,
                Arc::clone(&self.sink),
                Arc::clone(&self.live),
            ));
        }
        if let Some(hook) = &hooks.started {
            for job in &jobs {
                hook(&Started {
                    actor: &job.actor,
                    unit: job.unit,
                    recipient: job.recipient.as_str(),
                    attempt: job.attempt,
                });
            }
        }
        jobs
    }

    /// `lane`'s recipient URL, parsed and checked at the lane's first attempt in this pass.
    fn lane_destination(&mut self, lane: LaneId) -> &LaneDestination {
        let i = lane.index();
        if self.destinations.len() <= i {
            self.destinations.resize_with(i + 1, || None);
        }
        if self.destinations[i].is_none() {
            let to = Arc::new(Destination::parse(self.recipient(lane)));
            let unsendable = to.check(&self.addresses, &self.classifier).err();
            self.destinations[i] = Some(LaneDestination {
                to,
                unsendable,
                until: None,
            });
        }
        self.destinations[i]
            .as_ref()
            .expect("the lane's destination was just set")
    }

    /// `lane`'s recipient URL, shared by every job of the lane in this pass.
    fn destination(&mut self, lane: LaneId) -> Arc<Destination> {
        Arc::clone(&self.lane_destination(lane).to)
    }

    /// Reads the actor's lane-control generation again (OL-14) and, with `apply`, tells the
    /// scheduler about every lane an operator changed since the last read: the starts of
    /// those lanes that were not sent yet are reported [`Outcome::NotSent`] and leave
    /// `starts`, then [`Scheduler::handle_lane_control`] hands back what the pass holds of
    /// them. A changed lane the pass never saw, not paused and with work, is discovered.
    /// Returns whether a lane the pass knew changed.
    fn read_controls(
        &mut self,
        cx: RoundContext<'_>,
        starts: &mut Vec<Start>,
        apply: bool,
    ) -> Result<bool, StoreError> {
        let read = cx
            .store
            .lane_controls(&self.token, self.control.generation)?;
        trace!(actor = %self.actor, generation = read.read.generation, hosts = read.hosts,
            changed = read.changed.len(), "lane controls read");
        if let Some(gate) = cx.hosts
            && read.hosts > gate.generation()
        {
            // An operator acted on a host since this process's book last looked: the hosts'
            // rows, read after this read's instant, reach the book before anything starts on
            // it (a block holds, an unblock or retry opens, for lanes met later too).
            let rows = cx.store.hosts()?;
            gate.apply_rows(&rows);
        }
        self.control = read.read;
        if !apply || read.changed.is_empty() {
            return Ok(false);
        }
        Ok(self.apply_controls(read.changed, starts))
    }

    fn apply_controls(&mut self, changed: Vec<ChangedLane>, starts: &mut Vec<Start>) -> bool {
        let t = now();
        let mut known = Vec::new();
        for cl in changed {
            let s = &cl.state;
            let info = self.lane_info(s);
            let Some(&lane) = self.lanes.get(&s.lane) else {
                if !s.paused && cl.pending {
                    // Resumed, say: read it as a discovery would.
                    let lane = self.lane(s.lane, &s.key);
                    self.note_backoff(lane, info);
                    self.sched.handle_lane(lane, info, t);
                }
                continue;
            };
            known.push((lane, info, s.paused, cl.pending));
        }
        if known.is_empty() {
            return false;
        }
        let hit: HashSet<LaneId> = known.iter().map(|k| k.0).collect();
        let actor = &self.actor;
        let sched = &mut self.sched;
        starts.retain(|s| {
            if !hit.contains(&s.lane) {
                return true;
            }
            debug!(%actor, unit = s.unit.0, "not sent: an operator changed its lane");
            if let Err(e) = sched.handle_outcome(s.unit, s.lane, Outcome::NotSent, t) {
                debug!(error = %e, "not-sent outcome ignored");
            }
            false
        });
        for (lane, info, paused, pending) in known {
            info!(actor = %self.actor, recipient = self.recipient(lane), paused,
                strict = info.strict, pending,
                "lane changed by an operator: the pass hands back what it held of it");
            self.note_backoff(lane, info);
            self.sched.handle_lane_control(
                lane,
                LaneControl {
                    info,
                    paused,
                    pending,
                },
                t,
            );
        }
        true
    }

    /// Notes a lane's persisted backoff for the log lines of its probe and recovery: any
    /// `not_before` at level 0 is a throttle not yet ended by a delivery (even one already
    /// past: it is cleared, and logged, at the next delivery).
    fn note_backoff(&mut self, lane: LaneId, info: LaneInfo) {
        if info.level > 0 || info.not_before.is_some() {
            self.waiting.entry(lane).or_insert(info.level);
        } else {
            self.waiting.remove(&lane);
        }
    }

    /// The pass is over (blocking): hands every unfinished unit back (OL-10, OL-14),
    /// executes every command still queued — acks and hooks of deliveries included — and
    /// flushes this pass's acks, so the slot is released only once they are durable.
    pub fn finish(mut self, cx: RoundContext<'_>) -> PassResult {
        let end = self.end.unwrap_or(PassEnd::Cancelled);
        // Jobs not yet sent (queued for a worker, parked under a host cap) are dropped from
        // now on: their units are handed back below.
        self.live.store(false, Ordering::SeqCst);
        let t = now();
        if end.hands_back_in_flight() {
            if end != PassEnd::StoreFailed {
                warn!(actor = %self.actor, %end, in_flight = self.sched.in_flight(),
                    "pass interrupted; handing every unfinished unit back");
            }
            self.sched.handle_interrupt(t);
        } else {
            self.sched.handle_pass_end(t);
        }
        let mut ignored = Vec::new();
        let _ = self.execute(cx, &mut ignored, false);
        self.flush_marks(cx.store, true);
        self.log_info.clear();
        self.report.yielded = end.yielded();
        self.report.grace_over = matches!(end, PassEnd::GraceOver(_));
        let flushed = cx.acks.flush(&self.token);
        let error = match (self.error.take(), flushed) {
            (Some(e), _) | (None, Err(e)) => Some(e),
            (None, Ok(())) => None,
        };
        debug!(actor = %self.actor, %end, delivered = self.report.delivered,
            dead_lettered = self.report.dead_lettered, handed_back = self.report.handed_back,
            "pass ended");
        PassResult {
            report: self.report,
            end,
            error,
            lease_renewed: self.session.lease_renewed_at(),
        }
    }

    /// Tells the scheduler about lanes that got new units since the last look.
    fn discover(&mut self, store: &dyn Store) -> Result<(), StoreError> {
        let (infos, watermark) = store.lanes_with_work(&self.token, self.watermark)?;
        self.watermark = self.watermark.max(watermark);
        let t = now();
        for info in infos {
            if info.paused {
                continue;
            }
            let lane = self.lane(info.lane, &info.key);
            // Any persisted `not_before` at level 0 is a throttle not yet ended by a delivery
            // (even one already past: it is cleared, and logged, at the next delivery).
            let waits = info.backoff_level > 0 || info.not_before.is_some();
            if waits {
                self.waiting.entry(lane).or_insert(info.backoff_level);
            }
            let lane_info = self.lane_info(&info);
            self.sched.handle_lane(lane, lane_info, t);
        }
        Ok(())
    }

    /// The store's form of the scheduler's claims.
    fn claim_ranges(&self, claims: &[LaneClaim]) -> Vec<ClaimRange> {
        claims
            .iter()
            .map(|c| ClaimRange {
                lane: self.store_lane(c.lane),
                from: c.from,
                limit: c.limit,
            })
            .collect()
    }

    /// Hands the store's answer to a claim to the scheduler.
    fn admit_claimed(&mut self, answer: Vec<ClaimedLane>) {
        let claims = answer.len();
        let mut chunks = Vec::with_capacity(answer.len());
        for cl in answer {
            let cl: ClaimedLane = cl;
            // Only lanes this pass asked for come back.
            let Some(lane) = self.lanes.get(&cl.lane).copied() else {
                continue;
            };
            let mut units = Vec::with_capacity(cl.units.len());
            for u in cl.units {
                let slots = u
                    .slots
                    .iter()
                    .map(|s| {
                        let lane = self.lane(s.lane, &s.key);
                        AdmitSlot {
                            lane,
                            attempts: s.attempts,
                            served: s.served,
                        }
                    })
                    .collect();
                let open = u.slots.iter().filter(|s| !s.served).count();
                let info = self.units.entry(u.id).or_insert(UnitInfo {
                    row_id: u.row_id,
                    enqueued_at: u.enqueued_at,
                    open,
                    payload: None,
                });
                if info.payload.is_none() {
                    info.payload = u.payload.map(Arc::new);
                }
                units.push(Admit {
                    id: u.id,
                    seq: u.seq,
                    bytes: u.bytes,
                    enqueued_at: u.enqueued_at,
                    slots,
                });
            }
            chunks.push(LaneChunk {
                lane,
                units,
                exhausted: cl.exhausted,
            });
        }
        let read: usize = chunks.iter().map(|c| c.units.len()).sum();
        let report = self.sched.handle_claimed(chunks, now());
        trace!(actor = %self.actor, lanes = claims, read, admitted = report.admitted, "claimed");
        for e in report.refused {
            warn!(actor = %self.actor, error = %e, "store answer refused by the scheduler");
        }
    }

    /// Writes what the commands executed so far gathered: their attempt records, then their
    /// dead letters (which keep the persisted counts), each in one call.
    fn flush_writes(&mut self, store: &dyn Store, hooks: &Hooks) {
        self.flush_records(store);
        self.flush_dead_letters(store, hooks);
        self.flush_host_pauses(store);
    }

    /// Pauses for their host the lanes whose attempts found it held by an operator.
    fn flush_host_pauses(&mut self, store: &dyn Store) {
        if self.host_pauses.is_empty() {
            return;
        }
        let mut lanes = std::mem::take(&mut self.host_pauses);
        if self.error.is_some() {
            return;
        }
        lanes.sort_unstable();
        lanes.dedup();
        match store.pause_for_host(&self.token, &lanes) {
            Ok(states) => {
                let (paused, open): (Vec<ChangedLane>, Vec<ChangedLane>) =
                    states.into_iter().partition(|cl| cl.state.paused);
                for cl in &paused {
                    info!(actor = %self.actor, recipient = cl.state.key.recipient(),
                        "lane paused: its host is blocked by an operator");
                }
                // An unblock committed first: the lane is open after all, and read again.
                if !open.is_empty() {
                    let _ = self.apply_controls(open, &mut Vec::new());
                }
            }
            Err(e) => self.store_failed("host pause", e, now()),
        }
    }

    /// Writes the dead letters gathered so far in one transaction; once it committed, reports
    /// each (log, [`PassReport::dead_lettered`], the hook) in the order the scheduler asked
    /// for them, which is lane order within each lane. A failure writes none of them and
    /// ends the pass: nothing is reported, and their units are read again by the next pass.
    fn flush_dead_letters(&mut self, store: &dyn Store, hooks: &Hooks) {
        if self.dead.is_empty() {
            return;
        }
        let dead = std::mem::take(&mut self.dead);
        if self.error.is_some() {
            return;
        }
        let reqs: Vec<DeadLetterRequest> = dead.iter().map(|d| d.req.clone()).collect();
        let written = match store.write_dead_letters(&self.token, &reqs) {
            Ok(written) => written,
            Err(e) => {
                self.store_failed("dead letter", e, now());
                return;
            }
        };
        trace!(actor = %self.actor, dead_letters = reqs.len(), "dead letters written");
        for (p, written) in dead.into_iter().zip(written) {
            let (unit, reason) = (p.req.unit, p.req.reason);
            let Some(d) = written else {
                // Not ours to report: an operator purged the lane or skipped its head
                // while the attempt was in flight, and that made the dead letter.
                debug!(actor = %self.actor, unit = unit.0, row = %p.row,
                    recipient = self.recipient(p.lane), reason = reason.as_str(),
                    "not dead-lettered: no longer pending");
                continue;
            };
            self.report.dead_lettered += 1;
            info!(actor = %self.actor, unit = unit.0, row = %p.row,
                recipient = self.recipient(p.lane), reason = reason.as_str(),
                status = d.last_status, error = d.last_error.as_deref(), attempts = d.attempts,
                dead_letter = d.id.0, "dead-lettered");
            // A refused destination or a permanent answer dead-letters every unit of the lane
            // the same way: said at WARN once per lane and pass, so an embedder with a default
            // subscriber sees it.
            let refusal = matches!(
                reason,
                DeadReason::DestinationRefused | DeadReason::Permanent
            );
            if refusal && self.refusals_warned.insert(p.lane) {
                warn!(actor = %self.actor, recipient = self.recipient(p.lane),
                    reason = reason.as_str(), status = d.last_status,
                    error = d.last_error.as_deref(),
                    "dead-lettering this lane's units: {}", refusal_hint(reason));
            }
            if let Some(hook) = &hooks.dead_lettered {
                hook(&self.dead_lettered(d, p.lane, reason));
            }
        }
    }

    /// A start of `unit` on `lane`, whose destination nothing may be sent to: it is reported
    /// to the hooks as started and finished at once, with `result`, and the result goes to
    /// the scheduler as an executor's would; no job is made.
    fn not_sendable(
        &mut self,
        hooks: &Hooks,
        unit: UnitId,
        lane: LaneId,
        attempt: u32,
        result: AttemptResult,
    ) {
        if let Some(hook) = &hooks.started {
            hook(&Started {
                actor: &self.actor,
                unit,
                recipient: self.recipient(lane),
                attempt,
            });
        }
        let t = now();
        self.flights.insert(
            lane,
            Flight {
                unit,
                attempt,
                since: t,
                marked: false,
            },
        );
        self.finished(unit, lane, result, Duration::ZERO, hooks, t);
    }

    /// The delivery log's entry of a finished attempt.
    fn log_entry(
        &self,
        unit: UnitId,
        lane: LaneId,
        row: &str,
        i: LogInfo,
        delivered: bool,
    ) -> DeliveryLogEntry {
        DeliveryLogEntry {
            unit,
            lane: self.store_lane(lane),
            row_id: row.to_owned(),
            attempt: i.attempt,
            started_at: i.started_at,
            duration_ms: i.duration_ms,
            status: i.status,
            error_class: i.error_class,
            body: i.body,
            delivered,
        }
    }

    /// In-flight marks are to be written or cleared now.
    fn marks_due(&self) -> bool {
        !self.unmarks.is_empty() || self.next_sweep.is_some_and(|at| now() >= at)
    }

    /// Writes the in-flight marks due (see [`Flight`]): clears those of attempts that ended
    /// and, at most once per [`MARK_SWEEP`], marks lanes whose attempt has been in flight for
    /// longer than [`IN_FLIGHT_MARK_AFTER`]. `all`: the pass ends, every mark is cleared.
    /// A failed write is only logged: the marks inform operators, nothing depends on them.
    fn flush_marks(&mut self, store: &dyn Store, all: bool) {
        if all {
            let marked: Vec<LaneId> = self
                .flights
                .iter()
                .filter(|(_, f)| f.marked)
                .map(|(l, _)| *l)
                .collect();
            self.unmarks.extend(marked);
            self.next_sweep = None;
        }
        let t = now();
        let mut marks: Vec<(StoreLaneId, Option<(UnitId, Timestamp)>)> = Vec::new();
        for lane in std::mem::take(&mut self.unmarks) {
            marks.push((self.store_lane(lane), None));
        }
        if self.next_sweep.is_some_and(|at| t >= at) {
            let mut earliest: Option<Timestamp> = None;
            let mut due = Vec::new();
            for (lane, f) in &mut self.flights {
                if f.marked {
                    continue;
                }
                let at = f.since.saturating_add(IN_FLIGHT_MARK_AFTER);
                if at <= t {
                    f.marked = true;
                    due.push((*lane, f.unit, f.since));
                } else {
                    earliest = Some(earliest.map_or(at, |e| e.min(at)));
                }
            }
            for (lane, unit, since) in due {
                debug!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
                    since = %rfc3339(since), "attempt in flight for long: lane marked");
                marks.push((self.store_lane(lane), Some((unit, since))));
            }
            self.next_sweep = earliest.map(|e| e.max(t.saturating_add(MARK_SWEEP)));
        }
        if marks.is_empty() || self.error.is_some() {
            return;
        }
        if let Err(e) = store.mark_in_flight(&self.token, &marks) {
            debug!(actor = %self.actor, error = %e, "in-flight marks not written");
        }
    }

    /// Writes the attempt records gathered so far, in one call.
    fn flush_records(&mut self, store: &dyn Store) {
        if self.records.is_empty() {
            return;
        }
        let records = std::mem::take(&mut self.records);
        let log = std::mem::take(&mut self.records_log);
        if self.error.is_some() {
            return;
        }
        if let Err(e) = store.record_attempts_logged(&self.token, &records, &log) {
            self.store_failed("attempt record", e, now());
        }
    }

    /// Executes every queued command in order; returns how many there were. Attempt records
    /// are batched, but written before any other write and before the round's starts leave.
    ///
    /// `inline`: the store must not be called; at the first command that needs it (or if
    /// attempt records wait) it stops, keeping that command for the next round.
    fn execute(
        &mut self,
        cx: RoundContext<'_>,
        starts: &mut Vec<Start>,
        inline: bool,
    ) -> Result<usize, NeedsStore> {
        let mut n = 0;
        let mut result = Ok(());
        while let Some(cmd) = self
            .deferred
            .pop_front()
            .or_else(|| self.sched.poll_command())
        {
            if inline && self.needs_store(&cmd) {
                self.deferred.push_front(cmd);
                result = Err(NeedsStore);
                break;
            }
            n += 1;
            self.command(cx, cmd, starts);
        }
        if inline {
            if !self.records.is_empty() || !self.host_pauses.is_empty() || self.marks_due() {
                result = Err(NeedsStore);
            }
        } else {
            self.flush_writes(cx.store, cx.hooks);
            self.flush_marks(cx.store, false);
        }
        cx.acks.ack_batch_logged(
            &self.token,
            std::mem::take(&mut self.acked),
            std::mem::take(&mut self.acked_log),
        );
        result.map(|()| n)
    }

    fn command(&mut self, cx: RoundContext<'_>, cmd: Command, starts: &mut Vec<Start>) {
        let writable = self.error.is_none();
        match cmd {
            Command::Start {
                unit,
                lane,
                attempt,
            } => {
                if let Some(info) = self.units.get(&unit) {
                    trace!(actor = %self.actor, unit = unit.0, row = %info.row_id,
                        recipient = self.recipient(lane), attempt,
                        queued_ms = now().saturating_duration_since(info.enqueued_at).as_millis() as u64,
                        "started");
                }
                // A start in a lane in backoff is its probe (OL-11): one per interval.
                if let Some(&level) = self.waiting.get(&lane) {
                    if level > 0 {
                        info!(actor = %self.actor, recipient = self.recipient(lane), unit = unit.0,
                            level, attempt, "lane probed: one attempt at its head");
                    } else {
                        debug!(actor = %self.actor, recipient = self.recipient(lane), unit = unit.0,
                            attempt, "throttled lane retried");
                    }
                }
                // After a failure nothing starts: the unit is handed back at the end.
                if !writable || self.end.is_some() {
                    return;
                }
                // A destination nothing may be sent to (a refused IP literal) answers every
                // attempt of its lane the same, without I/O: the attempt comes to that result
                // here, and the scheduler's next decision for the lane (its next head's start,
                // say) follows in this round, so a deep refused lane is dead-lettered in few
                // rounds and transactions. Only on a fresh read of the lane controls, as a
                // send (OL-14): an operator's action on the lane comes first.
                let unsendable = self.lane_destination(lane).refused().cloned();
                if let Some(result) = unsendable {
                    if self.resolved < RESOLVED_PER_ROUND && self.control.fresh_at(Instant::now()) {
                        self.resolved += 1;
                        self.not_sendable(cx.hooks, unit, lane, attempt, result);
                        return;
                    }
                }
                self.paced_start(lane);
                starts.push(Start {
                    unit,
                    lane,
                    attempt,
                });
            }
            Command::Delivered { unit, lane } => {
                // Acked even after a failure: an ack is harmless, a lost one is a resend.
                self.acked.push((unit, self.store_lane(lane)));
                self.report.delivered += 1;
                let row = self.resolved(unit, lane);
                if let Some(i) = self.log_info.remove(&(unit, lane)) {
                    let entry = self.log_entry(unit, lane, &row, i, true);
                    self.acked_log.push(entry);
                }
                trace!(actor = %self.actor, unit = unit.0, %row, recipient = self.recipient(lane),
                    "delivered");
                // Only lanes that failed are in these maps: a healthy lane pays two checks.
                if !self.lane_failure.is_empty() {
                    self.lane_failure.remove(&lane);
                }
                // A throttle ends with the lane's first delivery: its persisted `not_before`
                // is cleared then (a backoff is cleared by the LaneOpen that follows).
                if !self.waiting.is_empty() && self.recovered(lane, "delivered") == Some(0) {
                    self.write(
                        cx,
                        "lane state",
                        |s, t, l| s.set_lane_state(t, l, None, 0),
                        lane,
                    );
                }
                if let Some(hook) = &cx.hooks.delivered {
                    hook(&Delivered {
                        actor: self.actor.clone(),
                        unit,
                        row_id: row,
                        recipient: self.recipient(lane).to_owned(),
                    });
                }
            }
            Command::RecordAttempt {
                unit,
                lane,
                attempts,
                counted,
            } => {
                // The detail stays in `last` for a dead letter that may follow.
                let (status, error) = self
                    .last
                    .get(&(unit, lane))
                    .map_or((None, None), |r| (r.status, r.error.clone()));
                debug!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
                    attempts, counted, status, error = error.as_deref(), "attempt failed");
                if let Some(i) = self.log_info.remove(&(unit, lane)) {
                    let row = self
                        .units
                        .get(&unit)
                        .map_or_else(String::new, |u| u.row_id.clone());
                    let entry = self.log_entry(unit, lane, &row, i, false);
                    self.records_log.push(entry);
                }
                self.records.push(AttemptRecord {
                    unit,
                    lane: self.store_lane(lane),
                    attempts,
                    status,
                    error,
                    at: now(),
                });
            }
            Command::Interrupted {
                unit,
                lane,
                attempts,
            } => {
                info!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
                    attempts, "attempt interrupted in flight; the unit will be sent again");
                self.records.push(AttemptRecord {
                    unit,
                    lane: self.store_lane(lane),
                    attempts,
                    status: None,
                    error: Some(INTERRUPTED.to_owned()),
                    at: now(),
                });
            }
            Command::Hold { unit, lane, reason } => match reason {
                HoldReason::Stalled => {
                    debug!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
                        "stalled: held until the lane's next attempt");
                }
                HoldReason::Blocked => {
                    warn!(actor = %self.actor, unit = unit.0, recipient = self.recipient(lane),
                        "strict lane blocked on its head until an operator acts");
                    self.write(
                        cx,
                        "block lane",
                        |s, t, l| s.block_lane(t, l, "its head failed for good"),
                        lane,
                    );
                }
            },
            Command::LaneBackoff {
                lane,
                not_before,
                level,
            } => {
                self.log_backoff(lane, not_before, level);
                self.write(
                    cx,
                    "lane state",
                    |s, t, l| s.set_lane_state(t, l, Some(not_before), level),
                    lane,
                );
            }
            Command::LaneOpen { lane } => {
                self.recovered(lane, "the recipient answered");
                self.write(
                    cx,
                    "lane state",
                    |s, t, l| s.set_lane_state(t, l, None, 0),
                    lane,
                );
            }
            Command::LaneFailing { lane, since } => {
                debug!(actor = %self.actor, recipient = self.recipient(lane),
                    since = since.map(rfc3339), "lane's run of failures");
                self.write(
                    cx,
                    "lane state",
                    |s, t, l| s.set_lane_failing(t, l, since),
                    lane,
                );
            }
            Command::LaneRestart { lane } => {
                // Its head was dead-lettered after its attempts: the next unit gets a
                // schedule of its own (OL-8).
                self.waiting.remove(&lane);
                debug!(actor = %self.actor, recipient = self.recipient(lane),
                    "lane starts over after its head's last attempt");
                self.write(
                    cx,
                    "lane state",
                    |s, t, l| s.set_lane_state(t, l, None, 0),
                    lane,
                );
            }
            Command::LaneUnavailable { lane, since } => {
                let at = now();
                warn!(actor = %self.actor, recipient = self.recipient(lane),
                    failing_since = %rfc3339(since),
                    "lane unavailable: failing for longer than allowed; its units are \
                     dead-lettered together (lane_unavailable) until it answers again");
                self.write(
                    cx,
                    "lane state",
                    |s, t, l| s.set_lane_unavailable(t, l, at),
                    lane,
                );
                if self.error.is_none()
                    && let Some(hook) = &cx.hooks.lane_unavailable
                {
                    hook(&LaneUnavailable {
                        actor: self.actor.clone(),
                        recipient: self.recipient(lane).to_owned(),
                        failing_since: since,
                        at,
                    });
                }
            }
            Command::DeadLetter { unit, lane, reason } => {
                let last = self.last.remove(&(unit, lane));
                let (status, error) = last.map_or((None, None), |r| (r.status, r.error));
                if !writable {
                    return;
                }
                // Written with the other dead letters of this execution, at its end
                // (`flush_dead_letters`): before any later write, and before the round sends
                // anything, so that no later unit of the lane is sent before this outcome is
                // durable (OL-16).
                let row = self.resolved(unit, lane);
                let req = DeadLetterRequest {
                    unit,
                    lane: self.store_lane(lane),
                    reason,
                    status,
                    error,
                    at: now(),
                };
                self.dead.push(PendingDead { req, lane, row });
            }
            Command::RetireLane { lane, reason } => {
                if !writable {
                    return;
                }
                self.flush_writes(cx.store, cx.hooks);
                if self.error.is_some() {
                    return;
                }
                let retired =
                    match cx
                        .store
                        .retire_lane(&self.token, self.store_lane(lane), now(), reason)
                    {
                        Ok(retired) => retired,
                        Err(e) => {
                            self.store_failed("retire lane", e, now());
                            return;
                        }
                    };
                let units = retired.len() as u64;
                self.report.dead_lettered += units;
                // One INFO line for the lane, not one per unit: a retired lane can be deep.
                if reason == DeadReason::LaneRetired {
                    info!(actor = %self.actor, recipient = self.recipient(lane), units,
                        "lane retired (410 Gone)");
                } else if units > 0 {
                    info!(actor = %self.actor, recipient = self.recipient(lane), units,
                        reason = reason.as_str(), "the lane's pending units dead-lettered together");
                }
                for d in retired {
                    // Admitted units of the lane are resolved (the scheduler dropped them).
                    self.resolved(d.unit, lane);
                    debug!(actor = %self.actor, unit = d.unit.0, row = %d.row_id,
                        recipient = self.recipient(lane), reason = reason.as_str(),
                        status = d.last_status, error = d.last_error.as_deref(),
                        dead_letter = d.id.0, "dead-lettered");
                    if let Some(hook) = &cx.hooks.dead_lettered {
                        hook(&self.dead_lettered(d, lane, reason));
                    }
                }
            }
            Command::HandBack { unit } => {
                self.units.remove(&unit);
                self.report.handed_back += 1;
                trace!(actor = %self.actor, unit = unit.0, "handed back");
            }
        }
    }

    /// What the dead-letter hook is told of a dead letter the store wrote for `lane`.
    fn dead_lettered(
        &self,
        d: WrittenDeadLetter,
        lane: LaneId,
        reason: DeadReason,
    ) -> DeadLettered {
        DeadLettered {
            id: d.id,
            actor: self.actor.clone(),
            unit: d.unit,
            row_id: d.row_id,
            recipient: self.recipient(lane).to_owned(),
            reason,
            status: d.last_status,
            error: d.last_error,
            attempts: d.attempts,
            at: d.dead_at,
        }
    }

    /// The INFO line of a lane entering or staying in backoff (or a throttle), with the
    /// failure that put it there and its next attempt.
    fn log_backoff(&mut self, lane: LaneId, not_before: Timestamp, level: u32) {
        if self.host_held.remove(&lane) {
            return;
        }
        let before = self.waiting.insert(lane, level);
        let (status, error) = self
            .lane_failure
            .get(&lane)
            .map_or((None, None), |(s, e)| (*s, e.as_deref()));
        let next_attempt = rfc3339(not_before);
        let recipient = self.recipient(lane);
        match (before, level) {
            (Some(0), 0) => debug!(actor = %self.actor, recipient, status, error,
                next_attempt = %next_attempt, "lane still throttled"),
            (_, 0) => info!(actor = %self.actor, recipient, status, error,
                next_attempt = %next_attempt, "lane throttled by Retry-After"),
            (Some(b), _) if b > 0 => info!(actor = %self.actor, recipient, level, status, error,
                next_attempt = %next_attempt, "lane probe failed; backoff extended"),
            _ => info!(actor = %self.actor, recipient, level, status, error,
                next_attempt = %next_attempt, "lane entered backoff"),
        }
    }

    /// The INFO line of a throttled or backed-off lane that answered again; the level it
    /// was at (0: throttled), if it was waiting.
    fn recovered(&mut self, lane: LaneId, how: &'static str) -> Option<u32> {
        let level = self.waiting.remove(&lane);
        match level {
            Some(level) => info!(actor = %self.actor, recipient = self.recipient(lane),
                after_level = level, how, "lane recovered"),
            None => debug!(actor = %self.actor, recipient = self.recipient(lane), how,
                "lane open"),
        }
        level
    }

    /// Whether executing `cmd` writes to the store: [`writes`], and the delivery that ends
    /// a throttle (its `not_before` is cleared).
    fn needs_store(&self, cmd: &Command) -> bool {
        match cmd {
            Command::Delivered { lane, .. } => self.waiting.get(lane) == Some(&0),
            other => writes(other),
        }
    }

    /// One fenced write about `lane`, after the attempt records and dead letters gathered
    /// before it.
    fn write(
        &mut self,
        cx: RoundContext<'_>,
        what: &str,
        f: impl FnOnce(&dyn Store, &SlotToken, StoreLaneId) -> Result<(), StoreError>,
        lane: LaneId,
    ) {
        if self.error.is_some() {
            return;
        }
        self.flush_writes(cx.store, cx.hooks);
        if self.error.is_some() {
            return;
        }
        if let Err(e) = f(cx.store, &self.token, self.store_lane(lane)) {
            self.store_failed(what, e, now());
        }
    }

    /// One recipient of `unit` is resolved; forget the unit once all are.
    fn resolved(&mut self, unit: UnitId, lane: LaneId) -> String {
        self.last.remove(&(unit, lane));
        let Some(info) = self.units.get_mut(&unit) else {
            return String::new();
        };
        info.open = info.open.saturating_sub(1);
        if info.open > 0 {
            return info.row_id.clone();
        }
        // Its last recipient (every one-lane unit): the row id moves out, no copy.
        self.units
            .remove(&unit)
            .map(|u| u.row_id)
            .unwrap_or_default()
    }
}

/// What a WARN of dead letters for `reason` tells the reader to look at.
fn refusal_hint(reason: DeadReason) -> &'static str {
    match reason {
        DeadReason::DestinationRefused => {
            "the address policy refuses the recipient's address (loopback and private \
             addresses are delivered to only when this process's configuration or the \
             outbox's destination policy admits them: OutboxConfig::allow_loopback or \
             allow_private, HttpConfig::addresses, `outbox-lanes destinations set`; link-local \
             and cloud metadata addresses never are)"
        }
        _ => "the recipient answered with a permanent error (a status the policy does not retry)",
    }
}

/// Whether executing `cmd` writes to the store.
fn writes(cmd: &Command) -> bool {
    match cmd {
        Command::Start { .. }
        | Command::Delivered { .. }
        | Command::RecordAttempt { .. }
        | Command::Interrupted { .. }
        | Command::HandBack { .. }
        | Command::Hold {
            reason: HoldReason::Stalled,
            ..
        } => false,
        Command::Hold {
            reason: HoldReason::Blocked,
            ..
        }
        | Command::LaneBackoff { .. }
        | Command::LaneOpen { .. }
        | Command::LaneFailing { .. }
        | Command::LaneRestart { .. }
        | Command::LaneUnavailable { .. }
        | Command::DeadLetter { .. }
        | Command::RetireLane { .. } => true,
    }
}
