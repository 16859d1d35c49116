//! Delivery hooks for the embedding service.

use std::fmt;
use std::time::Duration;

use outbox_lanes_core::{ActorId, DeadReason, Outcome, Timestamp, UnitId};
use outbox_lanes_store::DeadLetterId;

/// A recipient was served.
#[derive(Clone, Debug)]
pub struct Delivered {
    /// The actor.
    pub actor: ActorId,
    /// The unit (its idempotency key).
    pub unit: UnitId,
    /// The row it came from.
    pub row_id: String,
    /// The recipient URL.
    pub recipient: String,
}

/// A recipient's unit became a dead letter: one call per dead letter, whether a failure of
/// the unit itself put it there or a 410 Gone retired its whole lane
/// ([`DeadReason::LaneRetired`], one call per unit of the lane, in lane order).
#[derive(Clone, Debug)]
pub struct DeadLettered {
    /// The dead letter's id in the store: what the store's `dead_letters` lists, and what
    /// showing, replaying or purging this one dead letter takes.
    pub id: DeadLetterId,
    /// The actor.
    pub actor: ActorId,
    /// The unit.
    pub unit: UnitId,
    /// The row it came from.
    pub row_id: String,
    /// The recipient URL.
    pub recipient: String,
    /// Why.
    pub reason: DeadReason,
    /// The last HTTP status, if any, as the dead letter keeps it (an earlier attempt's when
    /// the last one had none, or when this pass made no attempt, as for a retired lane's unit).
    pub status: Option<u16>,
    /// The last error, if any, as the dead letter keeps it.
    pub error: Option<String>,
    /// The persisted attempts of this recipient (OL-5), as the dead letter keeps them.
    pub attempts: u32,
    /// When it was dead-lettered: the dead letter's time in the store.
    pub at: Timestamp,
}

/// An attempt starts: its payload was read and it is handed to the executor, or its
/// destination is one nothing may be sent to (a refused IP literal), and its [`Attempted`]
/// follows at once, with no request made (for metrics: attempts in flight are the started
/// ones not yet [`Attempted`]). Borrowed from the job: the
/// hook runs once per attempt, and copies nothing it does not keep.
#[derive(Clone, Copy, Debug)]
pub struct Started<'a> {
    /// The actor.
    pub actor: &'a ActorId,
    /// The unit.
    pub unit: UnitId,
    /// The recipient URL.
    pub recipient: &'a str,
    /// The 1-based attempt number.
    pub attempt: u32,
}

/// An attempt finished, whatever its outcome (for metrics: latency, queue wait, outcomes).
#[derive(Clone, Debug)]
pub struct Attempted {
    /// The actor.
    pub actor: ActorId,
    /// The unit.
    pub unit: UnitId,
    /// The recipient URL.
    pub recipient: String,
    /// What the attempt came to.
    pub outcome: Outcome,
    /// The HTTP status, if a response came back.
    pub status: Option<u16>,
    /// From handing the attempt to the executor to its result.
    pub latency: Duration,
    /// From the row's enqueue to the start of this attempt.
    pub queued: Duration,
}

/// A lane (an endpoint) found failing for longer than allowed (`--lane-unavailable-after`):
/// reported once per run of failures, when its units start being dead-lettered together as
/// `lane_unavailable`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneUnavailable {
    /// The actor.
    pub actor: ActorId,
    /// The recipient (the lane's canonical URL).
    pub recipient: String,
    /// When its run of failed attempts began.
    pub failing_since: Timestamp,
    /// When it was found unavailable.
    pub at: Timestamp,
}

type Hook<T> = Box<dyn Fn(&T) + Send + Sync>;
/// A hook of [`Started`], which borrows from the job.
type StartedHook = Box<dyn for<'a> Fn(&Started<'a>) + Send + Sync>;

/// Delivery hooks for the embedding service. They are called from the pass (a pass thread
/// or a blocking-pool thread): keep them short, and do not block on an async runtime in them.
#[derive(Default)]
pub struct Hooks {
    /// Called for every recipient served.
    pub delivered: Option<Hook<Delivered>>,
    /// Called for every dead letter a pass writes, once it is durable: a unit's own, and each
    /// unit of a lane a 410 Gone retired. Dead letters an operator makes (a lane's purge or
    /// skipped head) are not passes' and call no hook. One exception: on Postgres, when the
    /// connection is lost while a lane's retirement commits, the pass learns of the error
    /// and not of the dead letters, which may have been written (`dead-letters list` shows
    /// them); a unit's own dead letter is found again and reported.
    pub dead_lettered: Option<Hook<DeadLettered>>,
    /// Called for every finished attempt, before the outcome is acted on.
    pub attempted: Option<Hook<Attempted>>,
    /// Called once per run of failures when a lane is found failing for longer than allowed
    /// (its units are then dead-lettered together, each reported to `dead_lettered` too).
    pub lane_unavailable: Option<Hook<LaneUnavailable>>,
    /// Called for every attempt handed to the executor, and for every attempt to a
    /// destination refused before sending (see [`Started`]). Every started attempt is later
    /// reported to `attempted` (an attempt dropped unsent as [`Outcome::NotSent`]), unless
    /// the pass ends first and hands it back.
    pub started: Option<StartedHook>,
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("delivered", &self.delivered.is_some())
            .field("dead_lettered", &self.dead_lettered.is_some())
            .field("attempted", &self.attempted.is_some())
            .field("lane_unavailable", &self.lane_unavailable.is_some())
            .field("started", &self.started.is_some())
            .finish()
    }
}
