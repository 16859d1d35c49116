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
//!
//! [`Job`]: crate::job::Job
//! [`Outcome::NotSent`]: outbox_lanes_core::Outcome::NotSent
//! [`Destination::check`]: crate::request::Destination::check

mod commands;
mod controls;
mod lanes;
mod outcome;
mod round;
mod start;
mod writes;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use outbox_lanes_core::policy::{AddressPolicy, Classifier};
use outbox_lanes_core::{
    ActorId, Command, LaneId, PassEnd, PassSession, Scheduler, SessionAction, SessionConfig,
    Timestamp, UnitId,
};
use outbox_lanes_store::{
    AttemptRecord, ClaimRange, ClaimedLane, ControlRead, DeadLetterRequest, DeliveryLogEntry,
    Payload, SlotToken, Store, StoreError, StoreLaneId,
};
use tracing::{debug, warn};

use crate::ack::AckWriter;
use crate::clock::Clock;
use crate::config::OutboxConfig;
use crate::hooks::Hooks;
use crate::http::{AttemptResult, OutboxAddresses};
use crate::job::Completions;
use crate::origins::OriginGate;

use self::lanes::LaneDestination;

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
    /// Attempts cut off in flight (at a stop's grace): each recorded as interrupted, not
    /// counted toward `max_attempts`, its unit handed back.
    pub interrupted: u64,
}

impl std::fmt::Display for PassReport {
    /// `12 delivered, 1 dead-lettered, 3 handed back` (and `, yielded`, `, grace over`,
    /// `, 2 interrupted`).
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
        if self.interrupted > 0 {
            write!(f, ", {} interrupted", self.interrupted)?;
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
        self.interrupted += other.interrupted;
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

/// What the store's claim said of a unit, for tracing, hooks and its attempts.
struct UnitInfo {
    row_id: String,
    enqueued_at: Timestamp,
    /// The payload, when the claim brought it: every attempt of the unit in this pass shares
    /// it, with no store read and no copy. Kept while the unit is admitted (the scheduler's
    /// byte budget bounds them all), dropped once it is resolved or handed back.
    payload: Option<Arc<Payload>>,
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

/// An attempt the scheduler started, waiting for its payload at the end of the round.
struct Start {
    unit: UnitId,
    lane: LaneId,
    attempt: u32,
}

/// One pass; see the [module docs](self).
///
/// It decides nothing and keeps no copy of what the core knows: the [`Scheduler`] holds
/// every lane's and unit's state (a lane's backoff, a unit's open recipients, whether the
/// pass only waits) and the [`PassSession`] the pass's lifecycle; the pass asks them. What
/// it holds besides is what only an executor knows: the store's names and answers, the
/// jobs and the claim out, the writes gathered, and the memory of its own log lines.
pub struct PassCore {
    /// The actor, for every log line and hook (the token's, shared).
    actor: ActorId,
    /// The drain slot the pass holds: every store call is fenced with it.
    token: SlotToken,
    /// The slot's lease, renewed when the session says so.
    lease: Duration,
    /// Where the pass reads the time: the runtime's clock.
    clock: Arc<dyn Clock>,
    sched: Scheduler,
    session: PassSession,
    /// The store's side of the scheduler's lanes: store ids, destinations and their
    /// checks, the address policy, endpoints' paces.
    lanes: LaneTable,
    /// What the claims said of the units the pass holds, and the last result of each
    /// failed attempt.
    units: Units,
    /// Lanes whose refusals were logged at WARN already.
    lane_log: LaneLog,
    /// Writes gathered by the commands executed so far, and the delivery log's entries.
    pending: Pending,
    /// What every job shares, and the attempts in flight with their in-flight marks.
    jobs: Jobs,
    /// The state rounds carry from one to the next.
    round: RoundState,
    /// The totals, for [`PassResult`].
    report: PassReport,
    /// Why the pass ended, once the session said so.
    end: Option<PassEnd>,
    /// A store write failed: nothing more is written or started (acks excepted).
    error: Option<StoreError>,
}

/// The store's side of the scheduler's lanes (whose recipients and states the scheduler
/// keeps): by store lane its scheduler lane, and by scheduler lane its store id and
/// destination.
struct LaneTable {
    /// The store's lane ids, as the scheduler's: store answers name lanes so.
    ids: HashMap<StoreLaneId, LaneId>,
    /// The other way, by lane index: every write names the store's lane.
    store_lanes: Vec<StoreLaneId>,
    /// Each lane's recipient URL, parsed and checked at its first attempt in this pass and
    /// shared by its jobs from then on (by lane index); a host the resolver's guard refused
    /// is remembered here for a while (an executor's answer, not a decision).
    destinations: Vec<Option<LaneDestination>>,
    /// The address policy and classification of the HTTP clients: what
    /// [`Destination::check`] answers before anything is sent. The configuration's or the
    /// outbox's stored policy (OL-24), read again when the pass begins.
    addresses: AddressPolicy,
    /// The configuration's own policy, which the stored one widens.
    own_addresses: AddressPolicy,
    /// The outbox's handle on the stored policy, shared with the HTTP clients: the pass's
    /// first round gives it the store's answer.
    outbox_addresses: OutboxAddresses,
    /// The clients' classification of an address, for the same checks.
    classifier: Classifier,
    /// The endpoints' rate limits, and the memory of their last starts this process shares
    /// between passes (OL-23).
    rates: crate::rates::RateLimits,
}

/// What the store's claims said of the units the pass holds (which of them are still
/// admitted, and which recipients are open, the scheduler knows: [`Scheduler::unit_open`]).
struct Units {
    /// By unit: its row, its age and its payload. Kept while commands about the unit may
    /// still come, forgotten once the scheduler no longer holds it and none is queued.
    info: HashMap<UnitId, UnitInfo>,
    /// The last result of a failed attempt, by recipient: the executor's answer, which the
    /// attempt record and a dead letter that may follow it carry.
    last: HashMap<(UnitId, LaneId), AttemptResult>,
    /// Units a recipient of which the commands executed since the scheduler's queue was
    /// last empty resolved: forgotten then, unless the scheduler still holds them.
    resolved: Vec<UnitId>,
}

/// The memory of the pass's own log lines.
struct LaneLog {
    /// Lanes whose dead letters for a refused destination or a permanent answer this pass
    /// logged at WARN already: once per lane and pass, the rest at INFO.
    refusals_warned: HashSet<LaneId>,
}

/// Store writes the executed commands gathered, flushed together (OL-16), and the delivery
/// log's entries that go with them and with the acks.
struct Pending {
    records: Vec<AttemptRecord>,
    /// The delivery log's entries of `records`, written with them.
    records_log: Vec<DeliveryLogEntry>,
    /// Dead letters of the commands executed so far, written together at the end of the
    /// execution (one transaction), before any later write and before the round sends
    /// anything (OL-16).
    dead: Vec<PendingDead>,
    /// Lanes whose host an operator holds, met by an attempt: paused for the host in the
    /// store at the next write (with the host's origin).
    host_pauses: Vec<(StoreLaneId, String)>,
    /// Deliveries of this round, handed to the ack writer together at its end.
    acked: Vec<(UnitId, StoreLaneId)>,
    /// The delivery log's entries of `acked`, committed with them.
    acked_log: Vec<DeliveryLogEntry>,
    /// Finished attempts waiting for the command that records or acks them (log on only).
    log_info: HashMap<(UnitId, LaneId), LogInfo>,
    /// The store keeps a delivery log (`None`: not asked yet; asked at the first round).
    log_on: Option<bool>,
}

/// What the pass's jobs share, and its attempts in flight.
struct Jobs {
    sink: Arc<dyn Completions>,
    /// Shared with every job this pass started; cleared when the pass ends.
    live: Arc<AtomicBool>,
    /// The store's outbox id, the first half of every idempotency key, read at the first
    /// start and shared by the pass's jobs.
    outbox: Option<Arc<str>>,
    /// Attempts handed to the executor and not yet finished, by lane.
    flights: HashMap<LaneId, Flight>,
    /// Lanes whose in-flight mark is to be cleared (their attempt ended).
    unmarks: Vec<LaneId>,
    /// When to look for attempts in flight for longer than [`IN_FLIGHT_MARK_AFTER`] next
    /// (`None`: none could be).
    next_sweep: Option<Timestamp>,
}

/// What one round leaves for the next.
struct RoundState {
    /// Look for lanes with new units at the next round (set at the start and on wake-ups:
    /// a burst of enqueues costs one look).
    look: bool,
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
    /// Starts to a destination nothing may be sent to resolved in the current round
    /// ([`RESOLVED_PER_ROUND`] at most).
    resolved: usize,
    /// No round ran yet.
    first_round: bool,
    /// The store's answer to the last discovery: only lanes with units enqueued after it
    /// are news to the next one.
    watermark: u64,
    /// The actor's lane-control generation as last read, and when (OL-14): attempts start
    /// only while it is fresh.
    control: ControlRead,
}

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
            .field("seed", &self.sched.seed())
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

/// A fresh seed for a pass's jitter (logged with the pass, so its run can be replayed).
pub(crate) fn fresh_seed() -> u64 {
    let t = crate::clock::system_nanos();
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
    /// A pass holding `token`, whose completions arrive through `sink`, starting now by
    /// `clock` (the runtime's: the pass reads the time nowhere else); the slot's lease was
    /// acquired or last renewed at `lease_renewed` (the acquisition time for a drain's first
    /// pass, then [`PassResult::lease_renewed`] of the one before), so the lease is renewed
    /// every third of it across back-to-back passes.
    pub fn new(
        token: SlotToken,
        config: &OutboxConfig,
        sink: Arc<dyn Completions>,
        clock: Arc<dyn Clock>,
        lease_renewed: Timestamp,
    ) -> PassCore {
        let seed = config.seed.unwrap_or_else(fresh_seed);
        let actor = token.actor().clone();
        let control = token.control();
        let now = clock.now();
        debug!(%actor, seed, "pass started");
        PassCore {
            actor,
            token,
            lease: config.lease,
            clock,
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
            lanes: LaneTable {
                ids: HashMap::new(),
                store_lanes: Vec::new(),
                destinations: Vec::new(),
                addresses: config.http.allowed(),
                own_addresses: config.http.addresses,
                outbox_addresses: config.http.outbox_addresses.clone(),
                classifier: config.http.classifier.clone(),
                rates: config.rates.clone(),
            },
            units: Units {
                info: HashMap::new(),
                last: HashMap::new(),
                resolved: Vec::new(),
            },
            lane_log: LaneLog {
                refusals_warned: HashSet::new(),
            },
            pending: Pending {
                records: Vec::new(),
                records_log: Vec::new(),
                dead: Vec::new(),
                host_pauses: Vec::new(),
                acked: Vec::new(),
                acked_log: Vec::new(),
                log_info: HashMap::new(),
                log_on: None,
            },
            jobs: Jobs {
                sink,
                live: Arc::new(AtomicBool::new(true)),
                outbox: None,
                flights: HashMap::new(),
                unmarks: Vec::new(),
                next_sweep: None,
            },
            round: RoundState {
                look: true,
                renew_due: false,
                claim: ClaimOut::None,
                deferred: VecDeque::new(),
                pending_starts: Vec::new(),
                resolved: 0,
                first_round: true,
                watermark: 0,
                control,
            },
            report: PassReport::default(),
            end: None,
            error: None,
        }
    }

    /// The seed of this pass's jitter.
    pub fn seed(&self) -> u64 {
        self.sched.seed()
    }

    /// The wall-clock time now, by the pass's clock.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The monotonic time now, by the pass's clock.
    fn instant(&self) -> Instant {
        self.clock.instant()
    }

    /// `lane`'s recipient URL (the scheduler's lane key).
    fn recipient(&self, lane: LaneId) -> &str {
        lanes::recipient(&self.sched, lane)
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
    /// recipient against its bound (OL-13). The scheduler decides and remembers what it
    /// said ([`Scheduler::poll_waiting`]); the pass adds only that it has reads or writes
    /// of its own to make.
    pub fn waiting_changed(&mut self) -> Option<bool> {
        let busy = self.end.is_some()
            || self.round.look
            || self.round.renew_due
            || !self.round.pending_starts.is_empty()
            || !self.round.deferred.is_empty()
            || !self.pending.records.is_empty();
        let t = self.now();
        self.sched.poll_waiting(t, busy)
    }

    /// The claim an inline round planned, once: the runtime reads it where blocking is
    /// allowed ([`DriverStore::claim`](outbox_lanes_store::DriverStore::claim) with this
    /// pass's [`PassCore::token`]) and hands the answer to [`PassCore::handle_claim`]. The
    /// pass goes on meanwhile: completions, acks and the starts of units already claimed do
    /// not wait for the read.
    pub fn take_claim(&mut self) -> Option<Vec<ClaimRange>> {
        match std::mem::replace(&mut self.round.claim, ClaimOut::Reading) {
            ClaimOut::Planned(ranges) => Some(ranges),
            other => {
                self.round.claim = other;
                None
            }
        }
    }

    /// The answer to the claim [`PassCore::take_claim`] handed out (and to a blocking round's
    /// own). A failed read releases what the claim reserved and ends the pass.
    pub fn handle_claim(&mut self, answer: Result<Vec<ClaimedLane>, StoreError>) {
        self.round.claim = ClaimOut::None;
        let t = self.now();
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
        if !self.round.pending_starts.is_empty() || !self.jobs.unmarks.is_empty() {
            // Starts left by a round that could not read the lane controls, or in-flight
            // marks to clear: at once.
            return Some(self.now());
        }
        [
            self.sched.poll_timeout(),
            self.session.poll_timeout(),
            self.jobs.next_sweep,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// New rows were enqueued somewhere: look for lanes with new units at the next round.
    pub fn handle_wake(&mut self) {
        self.round.look = true;
    }

    /// An attempt of this pass waits at its host, or goes after such a wait (see
    /// [`HostWait`](crate::HostWait)): while it waits it takes no place of the pass's
    /// in-flight bound ([`Scheduler::handle_host_wait`]).
    pub fn handle_host_wait(&mut self, w: crate::HostWait, now: Timestamp) {
        self.sched
            .handle_host_wait(w.unit, w.lane, w.attempt, w.waits, now);
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
                    self.round.renew_due = true;
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
