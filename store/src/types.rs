//! The values the store takes and returns.

use core::time::Duration;
use std::time::Instant;

use outbox_lanes_core::policy::Recipient;
use outbox_lanes_core::{ActorId, DeadReason, LaneKey, Seq, Timestamp, UnitId};

mod row;

pub use row::{ACTIVITY_JSON, NewRow};

/// A lane as the store numbers it: unique across actors, stable for the database's life.
///
/// Distinct from the core's `LaneId`, which one scheduler interns densely.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreLaneId(pub i64);

/// Proof of holding an actor's drain slot (OL-12): the actor, the fencing token of this
/// acquisition and the holder's name.
///
/// Every pass operation carries it; the store refuses it with
/// [`StoreError::StaleToken`](crate::StoreError::StaleToken) once the slot was acquired again
/// or its lease expired.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlotToken {
    actor: ActorId,
    fencing: u64,
    holder: String,
    control: ControlRead,
}

impl SlotToken {
    pub(crate) fn new(actor: ActorId, fencing: u64, holder: String, control: ControlRead) -> Self {
        SlotToken {
            actor,
            fencing,
            holder,
            control,
        }
    }

    /// The actor's lane-control generation as the acquisition read it (OL-14): what a pass
    /// holding this token starts from. Every read a pass makes after the acquisition sees the
    /// lanes with at least the operator actions up to this generation applied.
    pub fn control(&self) -> ControlRead {
        self.control
    }

    /// The actor whose slot this is.
    pub fn actor(&self) -> &ActorId {
        &self.actor
    }

    /// The fencing token: incremented on every acquisition of the slot.
    pub fn fencing(&self) -> u64 {
        self.fencing
    }

    /// The holder name given at acquisition.
    pub fn holder(&self) -> &str {
        &self.holder
    }
}

/// How long a pass may start attempts on one read of its actor's lane-control generation
/// (OL-14), and so how long an operator's lane action that a running pass may not have read
/// yet waits, after its commit, before it returns.
///
/// The argument: an action commits at C and, if the actor's drain slot is held, returns at
/// R ≥ C + `CONTROL_VALIDITY`. A pass that read the generation before C read it after an
/// instant K < C taken (on its monotonic clock) before the read, and starts attempts on that
/// read only while less than `CONTROL_VALIDITY` has passed since K: so before R. Any start
/// after R follows a read made after C, which sees the action. Both sides measure the same
/// length of time on monotonic clocks; no clock is compared with another. Relays and
/// operator tools must agree on it (it is this build's constant).
pub const CONTROL_VALIDITY: Duration = Duration::from_millis(50);

/// An actor's lane-control generation (OL-14) as a pass read it, and an instant taken before
/// the read: the read saw every lane action committed before that instant.
///
/// Every operator action on a lane (pause, resume, retry, strict, unstrict, purge, skip-head)
/// increments its actor's generation in its own transaction; the lane remembers the
/// generation of the last action on it, so that a pass that saw generation `g` can read
/// exactly the lanes changed since.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ControlRead {
    /// The generation read.
    pub generation: u64,
    /// Taken before the read was sent.
    pub asked_at: Instant,
}

impl ControlRead {
    /// Whether attempts may still start on this read at `now` (see [`CONTROL_VALIDITY`]).
    pub fn fresh_at(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.asked_at) < CONTROL_VALIDITY
    }
}

/// What [`DriverStore::lane_controls`](crate::DriverStore::lane_controls) read: the actor's
/// generation now, and the lanes an operator changed since the generation the pass had seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneControls {
    /// The generation read, and when the read was asked for.
    pub read: ControlRead,
    /// The operators' host-control generation, read in the same statement: +1 per `hosts
    /// block|unblock|retry`. A pass whose host book applied an older one reads the hosts'
    /// rows ([`DriverStore::hosts`](crate::DriverStore::hosts)) before it starts anything.
    pub hosts: u64,
    /// The lanes whose last operator action came after the generation the pass had seen, in
    /// lane order, with their state now. Empty when the generation did not change.
    pub changed: Vec<ChangedLane>,
}

/// A lane an operator changed, as it is now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangedLane {
    /// The lane's state (paused included).
    pub state: PendingLane,
    /// It holds pending units.
    pub pending: bool,
}

/// What [`DriverStore::acquire_slot`](crate::DriverStore::acquire_slot) found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum SlotAcquisition {
    /// The slot was free or its lease had expired: it is now held with this token.
    Acquired(SlotToken),
    /// Another holder's lease is live; "look again" was set so that holder re-reads the outbox
    /// before it releases (OL-12).
    Held,
}

/// What [`DriverStore::release_slot`](crate::DriverStore::release_slot) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum SlotRelease {
    /// The slot is free.
    Released,
    /// Someone asked for a pass while this one ran: the flag was cleared and the slot is KEPT.
    /// The holder must re-read the outbox and call `release_slot` again.
    LookAgain,
}

/// A lane with pending units, as a pass sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingLane {
    /// The store's lane id.
    pub lane: StoreLaneId,
    /// The lane's canonical key.
    pub key: LaneKey,
    /// The lane is in backoff until then (OL-11).
    pub not_before: Option<Timestamp>,
    /// The backoff level reached (0 = open).
    pub backoff_level: u32,
    /// A strict lane blocks on a failing head instead of dead-lettering it (OL-8).
    pub strict: bool,
    /// A paused lane delivers nothing until resumed.
    pub paused: bool,
    /// When the lane's current run of failed attempts began (`None` while it is not failing):
    /// [`DriverStore::set_lane_failing`](crate::DriverStore::set_lane_failing).
    pub failing_since: Option<Timestamp>,
    /// When the lane was found failing for longer than allowed, if it was since its run of
    /// failures began ([`set_lane_unavailable`](crate::DriverStore::set_lane_unavailable)).
    pub unavailable_since: Option<Timestamp>,
    /// How many units of the lane the store holds (counted up to [`PENDING_COUNT_CAP`]), for
    /// the scheduler's start order: a free place goes first to the lane with the most work
    /// left. `0` where it was not counted.
    pub pending: u64,
}

/// The most units [`PendingLane::pending`] counts: a lane deeper than that is "deep" all the
/// same, and the count stays cheap (it runs at every discovery of the lane: an index range
/// of at most this many entries). The SQL's `LIMIT` (`store/src/lanes.rs`) is this number.
pub const PENDING_COUNT_CAP: u64 = 10_000;

/// One lane's part of a claim: up to `limit` pending units with `seq >= from`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimRange {
    /// The lane.
    pub lane: StoreLaneId,
    /// The first sequence number wanted (the pass's cursor in the lane).
    pub from: Seq,
    /// At most this many units.
    pub limit: u32,
}

/// What a claim read from one lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedLane {
    /// The lane.
    pub lane: StoreLaneId,
    /// Its pending units from the cursor on, in `seq` order.
    pub units: Vec<ClaimedUnit>,
    /// Fewer than `limit` units came back: the lane holds nothing more right now.
    pub exhausted: bool,
}

/// A pending unit read by a claim, with its payload when the store reads it in the same
/// statement (see [`ClaimedUnit::payload`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedUnit {
    /// The unit id, unique across actors: the idempotency key.
    pub id: UnitId,
    /// Its sequence number in the claimed lane.
    pub seq: Seq,
    /// The row it came from.
    pub row_id: String,
    /// The payload size in bytes (for admission's byte budget).
    pub bytes: u32,
    /// When its row was enqueued.
    pub enqueued_at: Timestamp,
    /// Every lane of the unit (one for a normal unit, several for a joined one).
    pub slots: Vec<ClaimedSlot>,
    /// The payload, when the store read it with the claim (SQLite does for one-lane units,
    /// in the same statement); `None`: read it with [`DriverStore::payloads`](crate::DriverStore::payloads)
    /// when an attempt starts.
    pub payload: Option<Payload>,
}

/// One recipient of a claimed unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedSlot {
    /// The lane.
    pub lane: StoreLaneId,
    /// The lane's key.
    pub key: LaneKey,
    /// The persisted attempt count for this recipient (OL-5).
    pub attempts: u32,
    /// Nothing more is to be delivered to this recipient: it was served, or dead-lettered
    /// (only a joined unit still pending for other recipients shows this, OL-20).
    pub served: bool,
}

/// A unit's payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payload {
    /// The row it came from.
    pub row_id: String,
    /// Its content type.
    pub content_type: String,
    /// The bytes to POST.
    pub body: Vec<u8>,
    /// The row's own request headers as stored (see [`NewRow::headers`]); empty for most
    /// rows. A delivery checks them again before sending anything
    /// ([`validate_headers`](crate::validate_headers)): a row written with plain SQL may hold
    /// one enqueue would have refused.
    pub headers: Vec<(String, String)>,
}

/// One persisted attempt of one recipient of a unit (OL-5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptRecord {
    /// The unit.
    pub unit: UnitId,
    /// The recipient's lane.
    pub lane: StoreLaneId,
    /// The attempt count after this attempt (absolute, so a retried write is harmless).
    pub attempts: u32,
    /// The HTTP status, if a response came back.
    pub status: Option<u16>,
    /// The error text, if the attempt failed.
    pub error: Option<String>,
    /// When the attempt was made.
    pub at: Timestamp,
}

/// How many bytes of a non-2xx answer's body the delivery log keeps
/// ([`DeliveryLogEntry::body`]): 1 KiB.
pub const LOG_BODY_EXCERPT: usize = 1024;

/// One attempt's outcome for the delivery log (`ol_delivery_log`, schema 8), written in the
/// transaction that records the attempt ([`DriverStore::record_attempts_logged`]) or acks
/// the delivery ([`DriverStore::ack_logged`]): no write of its own.
///
/// [`DriverStore::record_attempts_logged`]: crate::DriverStore::record_attempts_logged
/// [`DriverStore::ack_logged`]: crate::DriverStore::ack_logged
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryLogEntry {
    /// The unit.
    pub unit: UnitId,
    /// The recipient's lane.
    pub lane: StoreLaneId,
    /// The unit's row id (what `rows show` looks the row up by).
    pub row_id: String,
    /// The attempt's number (1 for the first).
    pub attempt: u32,
    /// When the attempt started.
    pub started_at: Timestamp,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
    /// The HTTP status, if the recipient answered.
    pub status: Option<u16>,
    /// The error's code ([`error_class`]: `timeout`, `status 500`, `connection_refused`…),
    /// `None` when delivered.
    pub error_class: Option<String>,
    /// The start of a non-2xx answer's body, as text (at most [`LOG_BODY_EXCERPT`] bytes,
    /// cut on a character boundary); `None` for a 2xx or no answer.
    pub body: Option<String>,
    /// The attempt delivered the unit to this recipient.
    pub delivered: bool,
}

/// An error's class, as the delivery log keeps it: the text before its first `:` (the
/// stable code every error starts with: `timeout`, `connection_refused`, `status 500`…).
pub fn error_class(error: &str) -> &str {
    error.split(':').next().unwrap_or(error).trim()
}

/// `body` cut to at most [`LOG_BODY_EXCERPT`] bytes, on a character boundary.
pub fn log_excerpt(body: &str) -> &str {
    if body.len() <= LOG_BODY_EXCERPT {
        return body;
    }
    let mut end = LOG_BODY_EXCERPT;
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    body.get(..end).unwrap_or("")
}

/// One entry of the delivery log, as read back
/// ([`ServiceStore::delivery_log`](crate::ServiceStore::delivery_log)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryLogRow {
    /// The unit.
    pub unit: UnitId,
    /// The lane.
    pub lane: StoreLaneId,
    /// The recipient (canonical), `""` if its lane is unknown.
    pub recipient: String,
    /// The attempt's number.
    pub attempt: u32,
    /// When it started.
    pub started_at: Timestamp,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
    /// The HTTP status, if any.
    pub status: Option<u16>,
    /// The error's class, if it failed.
    pub error_class: Option<String>,
    /// The start of a non-2xx answer's body.
    pub body: Option<String>,
    /// It delivered.
    pub delivered: bool,
}

/// Where one recipient of a row stands
/// ([`ServiceStore::row_deliveries`](crate::ServiceStore::row_deliveries)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowDeliveryState {
    /// Waiting for (another) attempt.
    Pending,
    /// Its attempt has been in flight since this time (longer than a relay's in-flight
    /// threshold: shorter attempts are not marked).
    InFlight(Timestamp),
    /// Delivered (by the log's last entry, while the log keeps it).
    Delivered,
    /// Moved aside as a dead letter.
    DeadLetter,
    /// Finished: no longer pending, and the log has nothing more about it (off, or past its
    /// window).
    Finished,
}

impl RowDeliveryState {
    /// `pending`, `in flight`, `delivered`, `dead letter`, `finished`.
    pub fn as_str(self) -> &'static str {
        match self {
            RowDeliveryState::Pending => "pending",
            RowDeliveryState::InFlight(_) => "in flight",
            RowDeliveryState::Delivered => "delivered",
            RowDeliveryState::DeadLetter => "dead letter",
            RowDeliveryState::Finished => "finished",
        }
    }
}

/// A lane whose head a relay has had in flight for longer than
/// [`IN_FLIGHT_MARK_AFTER`](crate::IN_FLIGHT_MARK_AFTER)
/// ([`ServiceStore::lanes_in_flight`](crate::ServiceStore::lanes_in_flight)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneInFlight {
    /// The actor.
    pub actor: ActorId,
    /// The lane.
    pub lane: StoreLaneId,
    /// Its key (recipient and ordering key).
    pub key: LaneKey,
    /// The unit in flight.
    pub unit: UnitId,
    /// Since when.
    pub since: Timestamp,
}

/// One recipient of a row: its state, attempts and history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowDelivery {
    /// The unit.
    pub unit: UnitId,
    /// The lane.
    pub lane: StoreLaneId,
    /// The recipient (canonical).
    pub recipient: String,
    /// Where it stands.
    pub state: RowDeliveryState,
    /// Attempts counted so far.
    pub attempts: u32,
    /// The last HTTP status, if any.
    pub last_status: Option<u16>,
    /// The last error, if any.
    pub last_error: Option<String>,
    /// When it was delivered (the delivering attempt's end), while the log keeps it.
    pub delivered_at: Option<Timestamp>,
    /// The attempts the delivery log keeps, oldest first.
    pub history: Vec<DeliveryLogRow>,
}

/// A dead-lettering of one recipient of a unit (OL-8, OL-18).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterRequest {
    /// The unit.
    pub unit: UnitId,
    /// The recipient's lane.
    pub lane: StoreLaneId,
    /// Why.
    pub reason: DeadReason,
    /// The last HTTP status, if any.
    pub status: Option<u16>,
    /// The last error, if any.
    pub error: Option<String>,
    /// When.
    pub at: Timestamp,
}

/// Request headers a row may not set, lower-case: the client sets them itself (the body's
/// framing, the host, the idempotency key, the user agent), the signer does, or they are
/// hop-by-hop or proxy headers that would change how the request is framed or forwarded.
/// Every name starting with `webhook-` is refused too (the Standard Webhooks signer's). Refused
/// at enqueue and again before every delivery attempt ([`validate_headers`](crate::validate_headers)).
pub const RESERVED_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "host",
    "idempotency-key",
    "user-agent",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "trailers",
    "upgrade",
    "expect",
    "date",
    "digest",
    "content-digest",
    "signature",
    "signature-input",
];

/// What enqueue did with one row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enqueued {
    /// The row id.
    pub row_id: String,
    /// The row's sequence number.
    pub seq: Seq,
    /// The units created (one per recipient, or one for a joined row; none if every
    /// recipient was skipped).
    pub units: Vec<UnitId>,
    /// Recipients (canonical) skipped because a unit with the same dedup key is still
    /// pending for them (OL-17).
    pub skipped: Vec<String>,
}

/// Actors with work for the monitor (OL-13).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ActorsDue {
    /// Actors with a pending unit in an open, unpaused lane whose `not_before` has passed.
    pub ready: Vec<ActorId>,
    /// The earliest future `not_before` among unpaused lanes with pending units.
    pub next_not_before: Option<Timestamp>,
}

/// Who holds an actor's drain slot (OL-12), as `status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotHolder {
    /// The holder name given at acquisition (by default the runtimes name the process:
    /// `pid<pid>-<nanos>`).
    pub holder: String,
    /// When its lease ends, by the database's clock, unless renewed.
    pub lease_expires: Timestamp,
}

/// One actor's outbox at a glance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActorStatus {
    /// The actor.
    pub actor: ActorId,
    /// Units not yet finished.
    pub pending: u64,
    /// Whether a pass holds the actor's drain slot (a live lease).
    pub in_flight: bool,
    /// The holder of the drain slot and its lease end, while a lease is live.
    pub slot: Option<SlotHolder>,
    /// Lanes with pending units that wait for a time: [`LaneState::Throttled`],
    /// [`LaneState::Backoff`] or [`LaneState::Unavailable`] (found failing for longer than
    /// allowed and not paused: it waits for its next probe), earliest next attempt first.
    pub lanes_in_backoff: Vec<LaneSummary>,
    /// Lanes with pending units that wait for an operator: [`LaneState::Paused`] or
    /// [`LaneState::StrictBlocked`].
    pub lanes_paused: Vec<LaneSummary>,
    /// Dead letters kept for the actor.
    pub dead_letters: u64,
}

/// A lane that is not open, in [`ActorStatus`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneSummary {
    /// The lane key (recipient and ordering key).
    pub key: LaneKey,
    /// Its state.
    pub state: LaneState,
    /// Its next attempt (the persisted `not_before`), if it waits for a time.
    pub next_attempt: Option<Timestamp>,
}

/// The `last_error` of a dead letter whose unit an operator set aside (purge, skip-head) while
/// an attempt of it was in flight, and that attempt then delivered it (OL-14: an attempt in
/// flight finishes and is recorded; the delivery's own status is not kept). A replay of it
/// sends the recipient a unit it already has.
pub const DELIVERED_AFTER_SET_ASIDE: &str =
    "delivered: the attempt in flight when an operator set this unit aside succeeded";

/// What `pause_reason` of a strict lane blocked on its failing head starts with (OL-8): how
/// [`LaneState::StrictBlocked`] is told from an operator's pause.
pub const STRICT_BLOCKED_REASON: &str = "strict lane blocked";

/// The state of one lane, as every view shows it (`lanes`, `status`, the drain's progress).
///
/// Computed in one place, [`LaneState::of`], from the persisted lane columns and the time of
/// the look; [`LaneStatus::state`] adds [`LaneState::Unavailable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LaneState {
    /// Deliveries start as soon as the lane's head is ready.
    Open,
    /// A recipient's Retry-After set the lane's next attempt (OL-6); its backoff level is 0.
    Throttled,
    /// The lane stalled and waits for its next probe (OL-11); the level counts the stalls and
    /// failed probes since the lane last answered.
    Backoff(u32),
    /// An operator paused the lane.
    Paused,
    /// A strict lane's head failed for good: the lane waits for an operator (OL-8).
    StrictBlocked,
    /// The lane (its endpoint) was found failing for longer than allowed (issue 41,
    /// `unavailable_since`), and is not paused.
    Unavailable,
}

impl LaneState {
    /// The state of a lane from its persisted columns, at `now`.
    ///
    /// A pause wins over a backoff; a lane at level 0 whose `not_before` passed is open again
    /// (a throttle needs no probe), one at a level above 0 stays in backoff until its probe
    /// succeeds.
    pub fn of(
        not_before: Option<Timestamp>,
        backoff_level: u32,
        paused: bool,
        pause_reason: Option<&str>,
        now: Timestamp,
    ) -> LaneState {
        if paused {
            if pause_reason.is_some_and(|r| r.starts_with(STRICT_BLOCKED_REASON)) {
                LaneState::StrictBlocked
            } else {
                LaneState::Paused
            }
        } else if backoff_level > 0 {
            LaneState::Backoff(backoff_level)
        } else if not_before.is_some_and(|t| t > now) {
            LaneState::Throttled
        } else {
            LaneState::Open
        }
    }

    /// [`LaneState::Unavailable`] for a lane found failing for longer than allowed
    /// (`unavailable`) that is not paused, else [`LaneState::of`]: the one rule of every view
    /// ([`LaneStatus::state`], `status`).
    pub(crate) fn with_unavailable(
        unavailable: bool,
        not_before: Option<Timestamp>,
        backoff_level: u32,
        paused: bool,
        pause_reason: Option<&str>,
        now: Timestamp,
    ) -> LaneState {
        if unavailable && !paused {
            return LaneState::Unavailable;
        }
        LaneState::of(not_before, backoff_level, paused, pause_reason, now)
    }

    /// The state's name without its level: `open`, `throttled`, `backoff`, `paused`,
    /// `strict_blocked`, `unavailable` (for JSON).
    pub fn name(self) -> &'static str {
        match self {
            LaneState::Open => "open",
            LaneState::Throttled => "throttled",
            LaneState::Backoff(_) => "backoff",
            LaneState::Paused => "paused",
            LaneState::StrictBlocked => "strict_blocked",
            LaneState::Unavailable => "unavailable",
        }
    }

    /// Whether the lane waits for a time (throttled or in backoff).
    pub fn is_waiting_for_time(self) -> bool {
        matches!(self, LaneState::Throttled | LaneState::Backoff(_))
    }

    /// Whether the lane waits for an operator (paused or strict blocked).
    pub fn is_waiting_for_operator(self) -> bool {
        matches!(self, LaneState::Paused | LaneState::StrictBlocked)
    }
}

impl core::fmt::Display for LaneState {
    /// `open`, `throttled`, `backoff N`, `paused`, `strict blocked`, `unavailable`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LaneState::Backoff(level) => write!(f, "backoff {level}"),
            LaneState::StrictBlocked => f.write_str("strict blocked"),
            other => f.write_str(other.name()),
        }
    }
}

/// One lane at a glance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneStatus {
    /// The store's lane id (for the operator lane operations).
    pub lane: StoreLaneId,
    /// The lane key (recipient and ordering key).
    pub key: LaneKey,
    /// Pending deliveries in the lane.
    pub depth: u64,
    /// When the head (oldest pending) unit's row was enqueued.
    pub head_enqueued_at: Option<Timestamp>,
    /// The last HTTP status seen in the lane.
    pub last_status: Option<u16>,
    /// The last error seen in the lane.
    pub last_error: Option<String>,
    /// The last status/error is stale: the unit it came from is no longer pending at the
    /// lane's head (the lane delivered it or moved past it since), and the head has not failed.
    pub last_error_stale: bool,
    /// Backoff until then.
    pub not_before: Option<Timestamp>,
    /// Backoff level.
    pub backoff_level: u32,
    /// Strict mode.
    pub strict: bool,
    /// Paused (by an operator, or blocked on a strict lane's failing head).
    pub paused: bool,
    /// Why it is paused.
    pub pause_reason: Option<String>,
    /// When the lane's current run of failed attempts began (`None` while it is not failing).
    pub failing_since: Option<Timestamp>,
    /// When the lane was found failing for longer than allowed (issue 41), if it was since
    /// its run of failures began.
    pub unavailable_since: Option<Timestamp>,
    /// Since when the lane's head has been in flight, when a relay has had it in flight for
    /// longer than [`IN_FLIGHT_MARK_AFTER`](crate::IN_FLIGHT_MARK_AFTER) (its mark, trusted
    /// only while the actor's drain slot is held); `None` otherwise.
    pub in_flight_since: Option<Timestamp>,
    /// The unit of that attempt.
    pub in_flight_unit: Option<UnitId>,
}

impl LaneStatus {
    /// The lane's state at `now`: [`LaneState::Unavailable`] when it was found failing for
    /// longer than allowed and is not paused, else [`LaneState::of`].
    pub fn state(&self, now: Timestamp) -> LaneState {
        LaneState::with_unavailable(
            self.unavailable_since.is_some(),
            self.not_before,
            self.backoff_level,
            self.paused,
            self.pause_reason.as_deref(),
            now,
        )
    }
}

/// A dead letter's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeadLetterId(pub i64);

/// One recipient's undelivered unit, kept aside (OL-18).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The dead letter's id.
    pub id: DeadLetterId,
    /// The unit (its idempotency key; kept on replay).
    pub unit: UnitId,
    /// The row id.
    pub row_id: String,
    /// The actor.
    pub actor: ActorId,
    /// The lane key (recipient).
    pub key: LaneKey,
    /// Why.
    pub reason: DeadReason,
    /// The last HTTP status.
    pub last_status: Option<u16>,
    /// The last error.
    pub last_error: Option<String>,
    /// Persisted attempts.
    pub attempts: u32,
    /// First attempt time.
    pub first_attempt_at: Option<Timestamp>,
    /// Last attempt time.
    pub last_attempt_at: Option<Timestamp>,
    /// The sequence number it had.
    pub seq: Seq,
    /// When it was dead-lettered.
    pub dead_at: Timestamp,
}

impl DeadLetter {
    /// Whether its recipient already has it: an attempt in flight when an operator set the
    /// unit aside delivered it afterwards (its `last_error` is [`DELIVERED_AFTER_SET_ASIDE`]).
    /// A replay sends it a second time, so the binary's `dead-letters replay` and the
    /// dashboard leave these out unless asked for them.
    pub fn delivered_after_set_aside(&self) -> bool {
        self.last_error.as_deref() == Some(DELIVERED_AFTER_SET_ASIDE)
    }
}

/// A dead letter a pass wrote, as [`DriverStore::dead_letter`] and
/// [`DriverStore::retire_lane`] return it: the fields of its [`DeadLetter`] the caller does not
/// already know (the actor, the lane and the reason are the caller's), as the store keeps them
/// (attempts, status and error persisted by earlier passes included).
///
/// [`DriverStore::dead_letter`]: crate::DriverStore::dead_letter
/// [`DriverStore::retire_lane`]: crate::DriverStore::retire_lane
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenDeadLetter {
    /// The dead letter's id (what `dead-letters show --id` and a replay by id take).
    pub id: DeadLetterId,
    /// The unit.
    pub unit: UnitId,
    /// The row id.
    pub row_id: String,
    /// The sequence number it had.
    pub seq: Seq,
    /// Persisted attempts.
    pub attempts: u32,
    /// The last HTTP status, as the dead letter keeps it.
    pub last_status: Option<u16>,
    /// The last error, as the dead letter keeps it.
    pub last_error: Option<String>,
    /// When it was dead-lettered.
    pub dead_at: Timestamp,
}

/// Which dead letters an operator operation applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeadLetterSelection {
    /// Every dead letter of the actor.
    Actor(ActorId),
    /// These dead letters.
    Ids(Vec<DeadLetterId>),
    /// The dead letters that match every criterion the filter gives (all of them when it gives
    /// none), selected by the database.
    Matching(DeadLetterFilter),
}

/// Criteria on dead letters, for [`DeadLetterSelection::Matching`]; a dead letter must match
/// every one given (`None` is no criterion).
///
/// The time range is half-open on [`DeadLetter::dead_at`]: `since` inclusive, `until`
/// exclusive, so consecutive ranges (`..t`, `t..`) select each dead letter once. A range with
/// `since` not before `until` selects nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeadLetterFilter {
    /// This actor's only.
    pub actor: Option<ActorId>,
    /// For this recipient only (any ordering key): its canonical form, as lanes are keyed.
    pub recipient: Option<Recipient>,
    /// With this reason only.
    pub reason: Option<DeadReason>,
    /// Dead-lettered at or after this time only.
    pub since: Option<Timestamp>,
    /// Dead-lettered before this time only.
    pub until: Option<Timestamp>,
}

/// Default payload limit: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;

/// Default cap on the recipients of one row: 100,000.
pub const DEFAULT_MAX_RECIPIENTS: usize = 100_000;

/// Default row-id retention: 7 days (see [`CommonOptions::row_id_retention`]).
pub const DEFAULT_ROW_ID_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// What opening a store may do to the database's schema.
///
/// The library's default, [`SchemaPolicy::Migrate`], makes an embedded store just work. An
/// operator who separates privileges runs the schema's DDL once, as the schema's owner
/// (`outbox-lanes migrate`), and opens everything else with [`SchemaPolicy::Existing`], which
/// runs no DDL at all and so needs no privilege beyond the statements it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SchemaPolicy {
    /// Create the schema in a database that has none; upgrade an older one (the default).
    #[default]
    Migrate,
    /// Create the schema in a database that has none; refuse an older one with
    /// [`StoreError::SchemaTooOld`](crate::StoreError::SchemaTooOld) instead of upgrading it.
    Create,
    /// Run no DDL: the schema must exist at this build's version
    /// ([`StoreError::NoSchema`](crate::StoreError::NoSchema) or
    /// [`StoreError::SchemaTooOld`](crate::StoreError::SchemaTooOld) otherwise).
    Existing,
}

/// What the stores have in common to configure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommonOptions {
    /// Largest payload accepted at enqueue.
    pub max_payload: usize,
    /// Most recipients one row may name ([`DEFAULT_MAX_RECIPIENTS`] by default); a row with
    /// more is refused with [`EnqueueError::TooManyRecipients`](crate::EnqueueError) before
    /// anything is written.
    ///
    /// Every recipient becomes a unit (or a lane of a joined unit) written in the enqueue's one
    /// transaction, which holds the database's write lock meanwhile and keeps the row's lanes in
    /// memory: a row of millions of recipients, most likely a bug in the caller, would stall
    /// every other enqueue and pass for that long. A real fan-out that large can be raised to,
    /// or split into several rows.
    pub max_recipients: usize,
    /// Keep finished units (with their payloads) this long instead of deleting them at once;
    /// [`ServiceStore::purge_acked`](crate::ServiceStore::purge_acked) removes them (the
    /// monitor's upkeep, [`DriverStore::upkeep`](crate::DriverStore::upkeep), every
    /// `upkeep_interval`: 10 minutes by default).
    pub ack_retention: Option<Duration>,
    /// How long a row id an actor used stays refused by its enqueues, counted from the
    /// enqueue ([`DEFAULT_ROW_ID_RETENTION`], 7 days): the dedup window past delivery. An id is
    /// refused for as long as the row is stored (pending, or kept for a dead letter or the
    /// ack retention) and, after that, until the window has passed; the store keeps only the
    /// (actor, row id, time) of a finished row for it, in `ol_row_ids`, which
    /// [`ServiceStore::purge_row_ids`](crate::ServiceStore::purge_row_ids) trims (the monitor's
    /// upkeep, [`DriverStore::upkeep`](crate::DriverStore::upkeep), every `upkeep_interval`:
    /// 10 minutes by default). Zero turns the window off: enqueue then writes no ledger
    /// entry (one table write per row less).
    pub row_id_retention: Duration,
    /// How long the delivery log (`ol_delivery_log`, schema 8) keeps each attempt's outcome
    /// ([`DeliveryLogEntry`]), counted from the attempt's start; by default the row-id window
    /// ([`DEFAULT_ROW_ID_RETENTION`], 7 days), so that a delivered row answers "delivered at T
    /// after N attempts" for as long as its id is remembered. The monitor's upkeep
    /// ([`DriverStore::upkeep`](crate::DriverStore::upkeep)) deletes older entries. Zero turns
    /// the log off: a pass then writes nothing for it
    /// ([`DriverStore::logs_deliveries`](crate::DriverStore::logs_deliveries) is `false`).
    pub delivery_log_retention: Duration,
    /// What opening the store may do to the schema.
    pub schema: SchemaPolicy,
}

impl Default for CommonOptions {
    fn default() -> Self {
        CommonOptions {
            max_payload: DEFAULT_MAX_PAYLOAD,
            max_recipients: DEFAULT_MAX_RECIPIENTS,
            ack_retention: None,
            row_id_retention: DEFAULT_ROW_ID_RETENTION,
            delivery_log_retention: DEFAULT_ROW_ID_RETENTION,
            schema: SchemaPolicy::Migrate,
        }
    }
}
