//! The scheduler's inputs and outputs: units and lanes as the store reports them, the claims
//! it answers, the [`Command`]s a runtime executes, and the errors of refused inputs.

use alloc::vec::Vec;
use core::fmt;
use core::time::Duration;

use smallvec::SmallVec;

use crate::ids::{LaneId, Seq, UnitId};
use crate::outcome::DeadReason;
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
    /// Payload size in bytes, counted against
    /// [`Config::max_bytes`](crate::config::Config::max_bytes).
    pub bytes: u32,
    /// When its row was enqueued (for [`Config::max_age`](crate::config::Config::max_age)).
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
    /// When its current run of failed attempts began (`None`: its last attempt was
    /// answered, or none failed) — across its heads: a unit dead-lettered `exhausted` does not
    /// end the run (OL-8).
    pub failing_since: Option<Timestamp>,
    /// It was found failing for longer than
    /// [`Config::lane_unavailable_after`](crate::config::Config::lane_unavailable_after).
    pub unavailable: bool,
    /// Its endpoint's rate limit: the least time between two attempt starts (OL-23).
    /// `None`: not limited.
    pub pace: Option<Duration>,
    /// No attempt starts before then: an earlier pass started one less than `pace` ago.
    pub paced_until: Option<Timestamp>,
    /// How many units the store holds for the lane (an estimate; `0`: not known). When the
    /// in-flight bound binds, a free place goes first to the lane with the most work left
    /// ([`Scheduler`](super::Scheduler)'s start order): a deep lane's serial chain is the
    /// critical path of a drain.
    pub pending: u32,
}

/// A lane's persisted state read again during a pass because an operator acted on it (pause,
/// resume, purge, skip-head, retry, strict): what
/// [`Scheduler::handle_lane_control`](super::Scheduler::handle_lane_control) is told (OL-14).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaneControl {
    /// Its backoff and strict mode as the store has them now.
    pub info: LaneInfo,
    /// Paused (by an operator, or a strict lane blocked on its head): nothing of it is read
    /// or started until a later control or discovery says otherwise.
    pub paused: bool,
    /// The store holds pending units of it.
    pub pending: bool,
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
    /// It failed [`Config::pass_attempts`](crate::config::Config::pass_attempts) times in
    /// a row (its persisted attempts count, so passes and restarts do not reset them), or
    /// its probe failed: its lane is in backoff and it waits for the lane's
    /// `not_before` (OL-7, OL-11).
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
    /// The attempt of `unit` on `lane` was cut off in flight by an interruption (a
    /// shutdown past its grace, a cancellation, a store failure): record it as interrupted
    /// (OL-14), so `lanes` and the dead letters say why the unit is sent again. It does not
    /// count toward the maximum — the recipient may have it, and the cut was ours — so
    /// `attempts` is the persisted count, unchanged. A [`Command::HandBack`] of the unit
    /// follows.
    Interrupted {
        /// The unit.
        unit: UnitId,
        /// The recipient's lane.
        lane: LaneId,
        /// The persisted attempt count, unchanged.
        attempts: u32,
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
    /// The lane answered again: clear its persisted backoff (and its run of failures, with
    /// a [`Command::LaneFailing`] of `None` before it when it had one).
    LaneOpen {
        /// The lane.
        lane: LaneId,
    },
    /// Persist when the lane's current run of failed attempts began (`Some`: at its first
    /// failure), or that it ended (`None`, before a [`Command::LaneOpen`]: the lane answered;
    /// it is available again).
    LaneFailing {
        /// The lane.
        lane: LaneId,
        /// When the run began.
        since: Option<Timestamp>,
    },
    /// The lane's head was dead-lettered after its attempts (OL-8): the lane starts over,
    /// level 0 and no backoff persisted, so that its next unit gets a schedule of its own
    /// (its run of failures goes on).
    LaneRestart {
        /// The lane.
        lane: LaneId,
    },
    /// The lane has been failing for longer than allowed: persist that it is unavailable
    /// (once per run of failures; a [`Command::RetireLane`] with
    /// [`DeadReason::LaneUnavailable`] follows).
    LaneUnavailable {
        /// The lane.
        lane: LaneId,
        /// When its run of failures began.
        since: Timestamp,
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
    /// Dead-letter every pending unit of `lane` with `reason`: `lane_retired` (410 Gone,
    /// OL-9) or `lane_unavailable` (OL-8). Durable before the next command.
    RetireLane {
        /// The lane.
        lane: LaneId,
        /// The dead letters' reason.
        reason: DeadReason,
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

/// What [`Scheduler::handle_claimed`](super::Scheduler::handle_claimed) did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimReport {
    /// Units admitted.
    pub admitted: usize,
    /// Units refused (the rest of their chunk is left for a later claim).
    pub refused: Vec<AdmitError>,
}

/// A lane that waits before its next attempt: in backoff, or throttled
/// ([`Scheduler::lane_wait`](super::Scheduler::lane_wait)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneWait {
    /// Its backoff level: above zero its head is attempted once (a probe, OL-11); zero: a
    /// throttle (a Retry-After or a host's deferral), or its mark left by an earlier pass,
    /// which stays until an answer clears it (OL-7).
    pub level: u32,
    /// Nothing of it starts before then. `None`: its backoff ended and its probe is due or
    /// out (level above zero only).
    pub not_before: Option<Timestamp>,
}
