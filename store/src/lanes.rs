//! Lanes, written once for both backends: a pass's lane states (backoff, strict block, a run
//! of failures and the unavailability found in it), the operator's controls (pause, resume,
//! retry now, strict) and the control generations that carry them to running passes (OL-14),
//! finding a lane, and the lane list.

use outbox_lanes_core::{ActorId, LaneKey, Timestamp};

use crate::db::{Db, Get, Sql, args};
use crate::types::{
    ChangedLane, ClaimedLane, ClaimedSlot, LaneStatus, PendingLane, STRICT_BLOCKED_REASON,
    SlotToken,
};
use crate::util::{key_of, millis_of, status_of, timestamp_of, to_i64, to_u32, to_u64};
use crate::{StoreError, StoreLaneId, slots};

/// The columns [`pending_lane`] reads, of lane `l`.
macro_rules! pending_lane_cols {
    () => {
        "l.id, l.recipient, l.ordering_key, l.not_before, l.backoff_level, l.strict, l.paused, \
         l.failing_since, l.unavailable_since"
    };
}
pub(crate) use pending_lane_cols;

/// The units lane `l` holds, counted up to [`PENDING_COUNT_CAP`](crate::types::PENDING_COUNT_CAP)
/// (the lane index's entries: acked units leave it).
macro_rules! pending_count_col {
    () => {
        "(SELECT count(*) FROM (SELECT 1 FROM ol_units c WHERE c.lane_id = l.id LIMIT 10000) c)"
    };
}
pub(crate) use pending_count_col;

/// How many columns [`pending_lane`] reads.
pub(crate) const PENDING_LANE_COLS: usize = 9;

/// A lane's state as a pass reads it, from the columns `at..at + PENDING_LANE_COLS` of a row
/// ([`pending_lane_cols!`]): id, recipient, ordering key, `not_before`, backoff level,
/// strict, paused, `failing_since`, `unavailable_since`.
pub(crate) fn pending_lane(r: &dyn Get, at: usize) -> Result<PendingLane, StoreError> {
    Ok(PendingLane {
        lane: StoreLaneId(r.int(at)?),
        key: key_of(r.text(at + 1)?, r.text(at + 2)?),
        not_before: r.opt_int(at + 3)?.map(timestamp_of),
        backoff_level: to_u32(r.int(at + 4)?),
        strict: r.flag(at + 5)?,
        paused: r.flag(at + 6)?,
        failing_since: r.opt_int(at + 7)?.map(timestamp_of),
        unavailable_since: r.opt_int(at + 8)?.map(timestamp_of),
        pending: 0,
    })
}

/// A joined unit's slot as the claims read it, from column `at` on: lane, recipient, ordering
/// key, attempts, state.
pub(crate) fn claimed_slot(r: &dyn Get, at: usize) -> Result<ClaimedSlot, StoreError> {
    Ok(ClaimedSlot {
        lane: StoreLaneId(r.int(at)?),
        key: key_of(r.text(at + 1)?, r.text(at + 2)?),
        attempts: to_u32(r.int(at + 3)?),
        served: r.int(at + 4)? != crate::units::STATE_PENDING,
    })
}

/// A lane a claim read nothing from.
pub(crate) fn claimed_nothing(lane: StoreLaneId, exhausted: bool) -> ClaimedLane {
    ClaimedLane {
        lane,
        units: Vec::new(),
        exhausted,
    }
}

/// Runs an update of one lane; [`StoreError::NotFound`] if it changed nothing.
fn update(db: &mut impl Db, sql: &Sql, args: &[crate::db::Value<'_>]) -> Result<(), StoreError> {
    if db.execute(sql, args)? == 0 {
        return Err(StoreError::NotFound { what: "lane" });
    }
    Ok(())
}

static SET_BACKOFF: Sql = Sql::new(
    "UPDATE ol_lanes SET not_before = $3, backoff_level = $4 WHERE id = $1 AND actor = $2",
);

/// Persists a lane's backoff (`None`: open) for a pass of `actor`.
pub(crate) fn set_backoff(
    db: &mut impl Db,
    actor: &str,
    lane: StoreLaneId,
    not_before: Option<Timestamp>,
    level: u32,
) -> Result<(), StoreError> {
    let level = i64::from(level);
    update(
        db,
        &SET_BACKOFF,
        args![lane.0, actor, not_before.map(millis_of), level],
    )
}

static BLOCK: Sql =
    Sql::new("UPDATE ol_lanes SET paused = TRUE, pause_reason = $3 WHERE id = $1 AND actor = $2");

/// Pauses a strict lane of `actor` on its failing head ([`STRICT_BLOCKED_REASON`]).
pub(crate) fn block(
    db: &mut impl Db,
    actor: &str,
    lane: StoreLaneId,
    reason: &str,
) -> Result<(), StoreError> {
    let reason = format!("{STRICT_BLOCKED_REASON}: {reason}");
    update(db, &BLOCK, args![lane.0, actor, &reason])
}

static SET_FAILING: Sql =
    Sql::new("UPDATE ol_lanes SET failing_since = $3 WHERE id = $1 AND actor = $2");
/// A lane answers again: its run of failures, and the unavailability found in it, end.
static CLEAR_FAILING: Sql = Sql::new(
    "UPDATE ol_lanes SET failing_since = NULL, unavailable_since = NULL \
     WHERE id = $1 AND actor = $2",
);
/// The first mark is kept (the row still matches: a second call is no error).
static SET_UNAVAILABLE: Sql = Sql::new(
    "UPDATE ol_lanes SET unavailable_since = coalesce(unavailable_since, $3) \
     WHERE id = $1 AND actor = $2",
);

/// Persists when a lane of `actor` began failing (`None`: it answers again, which also
/// clears its unavailability).
pub(crate) fn set_failing(
    db: &mut impl Db,
    actor: &str,
    lane: StoreLaneId,
    since: Option<Timestamp>,
) -> Result<(), StoreError> {
    match since {
        Some(t) => update(db, &SET_FAILING, args![lane.0, actor, millis_of(t)]),
        None => update(db, &CLEAR_FAILING, args![lane.0, actor]),
    }
}

/// Marks a lane of `actor` unavailable since `at`, unless it is already.
pub(crate) fn set_unavailable(
    db: &mut impl Db,
    actor: &str,
    lane: StoreLaneId,
    at: Timestamp,
) -> Result<(), StoreError> {
    update(db, &SET_UNAVAILABLE, args![lane.0, actor, millis_of(at)])
}

static PAUSE: Sql = Sql::new("UPDATE ol_lanes SET paused = TRUE, pause_reason = $2 WHERE id = $1");
/// An operator's resume also forgets the lane's run of failures (a new one starts).
static RESUME: Sql = Sql::new(
    "UPDATE ol_lanes SET paused = FALSE, pause_reason = NULL, failing_since = NULL, \
     unavailable_since = NULL WHERE id = $1",
);
static SET_STRICT: Sql = Sql::new("UPDATE ol_lanes SET strict = $2 WHERE id = $1");
/// Clears a lane's backoff and its run of failures and lifts a strict block (a pause reason
/// starting with `$2`, [`STRICT_BLOCKED_REASON`]); an operator's pause stays.
static RETRY_NOW: Sql = Sql::new(
    "UPDATE ol_lanes SET not_before = NULL, backoff_level = 0, failing_since = NULL, \
     unavailable_since = NULL, \
     paused = CASE WHEN substr(pause_reason, 1, length($2)) = $2 THEN FALSE ELSE paused END, \
     pause_reason = CASE WHEN substr(pause_reason, 1, length($2)) = $2 THEN NULL \
     ELSE pause_reason END \
     WHERE id = $1",
);

/// Pauses a lane (operator).
pub(crate) fn pause(db: &mut impl Db, lane: StoreLaneId, reason: &str) -> Result<(), StoreError> {
    update(db, &PAUSE, args![lane.0, reason])
}

/// Resumes a paused lane (operator).
pub(crate) fn resume(db: &mut impl Db, lane: StoreLaneId) -> Result<(), StoreError> {
    update(db, &RESUME, args![lane.0])
}

/// Sets a lane's strict mode (operator).
pub(crate) fn set_strict(
    db: &mut impl Db,
    lane: StoreLaneId,
    strict: bool,
) -> Result<(), StoreError> {
    update(db, &SET_STRICT, args![lane.0, strict])
}

/// Clears a lane's backoff and its run of failures and lifts a strict block (operator).
pub(crate) fn retry_now(db: &mut impl Db, lane: StoreLaneId) -> Result<(), StoreError> {
    update(db, &RETRY_NOW, args![lane.0, STRICT_BLOCKED_REASON])
}

/// An operator action on lane `$1`: its actor's control generation goes up by one (its slot
/// row is created if no pass ever ran), and whether a pass holds the slot comes back. The slot
/// row is written before anything of the lane, in the order a pass's fenced writes take them
/// (slot, then lanes and units), so that the two never wait for each other crosswise.
static BUMP_CONTROL: Sql = Sql::new(
    "INSERT INTO ol_slots (actor, control) SELECT actor, 1 FROM ol_lanes WHERE id = $1 \
     ON CONFLICT (actor) DO UPDATE SET control = ol_slots.control + 1 \
     RETURNING actor, control, holder IS NOT NULL",
);
static MARK_CONTROL: Sql = Sql::new("UPDATE ol_lanes SET control = $2 WHERE id = $1");

/// What [`bump_control`] did.
pub(crate) struct Bumped {
    /// The lane's actor.
    pub(crate) actor: ActorId,
    /// A pass holds the actor's drain slot (it may have read the generation before).
    pub(crate) held: bool,
}

/// Records an operator action on `lane` in its transaction, before the action's own writes
/// (OL-14): the actor's control generation goes up, and the lane keeps the new value, so
/// that a running pass's next [`controls`] sees the lane changed. [`StoreError::NotFound`] if
/// no lane has this id.
pub(crate) fn bump_control(db: &mut impl Db, lane: StoreLaneId) -> Result<Bumped, StoreError> {
    let (actor, generation, held) = db
        .query_opt(&BUMP_CONTROL, args![lane.0], |r| {
            Ok((r.text(0)?, r.int(1)?, r.flag(2)?))
        })?
        .ok_or(StoreError::NotFound { what: "lane" })?;
    db.execute(&MARK_CONTROL, args![lane.0, generation])?;
    Ok(Bumped {
        actor: ActorId::new(actor),
        held,
    })
}

/// The token's live slot and its control generation, with every lane of the actor changed
/// by an operator after generation `$3` (`control > 0` lets the partial index
/// `ol_lanes_control` serve it: it holds only lanes an operator touched). No row: the token
/// is stale. The lanes' pending check runs only for those lanes.
static CONTROLS: Sql = Sql::new(concat!(
    "SELECT s.control, \
     coalesce((SELECT CAST(value AS BIGINT) FROM ol_meta WHERE key = 'host_control'), 0), ",
    pending_lane_cols!(),
    ", EXISTS (SELECT 1 FROM ol_units d WHERE d.lane_id = l.id AND d.state = 0) \
     FROM ol_slots s LEFT JOIN ol_lanes l ON l.actor = s.actor AND l.control > $3 AND l.control > 0 \
     WHERE s.actor = $1 AND s.token = $2 AND s.holder IS NOT NULL AND s.lease_expires > {now} \
     ORDER BY l.id"
));

/// The actor's control generation, the operators' host-control generation, and the lanes an
/// operator changed after generation `seen` (nothing when it did not change), for the pass
/// holding `token`; one statement.
///
/// # Errors
/// [`StoreError::StaleToken`] if the slot was lost; database failures.
pub(crate) fn controls(
    db: &mut impl Db,
    token: &SlotToken,
    seen: u64,
) -> Result<(u64, u64, Vec<ChangedLane>), StoreError> {
    let rows = db.query(
        &CONTROLS,
        args![
            token.actor().as_str(),
            to_i64(token.fencing()),
            to_i64(seen)
        ],
        |r| {
            let generation = (to_u64(r.int(0)?), to_u64(r.int(1)?));
            let lane = match r.opt_int(2)? {
                None => None,
                Some(_) => Some(ChangedLane {
                    state: pending_lane(r, 2)?,
                    pending: r.flag(2 + PENDING_LANE_COLS)?,
                }),
            };
            Ok((generation, lane))
        },
    )?;
    let Some(&((generation, hosts), _)) = rows.first() else {
        return Err(slots::stale(token));
    };
    Ok((
        generation,
        hosts,
        rows.into_iter().filter_map(|r| r.1).collect(),
    ))
}

static FIND: Sql =
    Sql::new("SELECT id FROM ol_lanes WHERE actor = $1 AND recipient = $2 AND ordering_key = $3");

/// The id of an actor's lane, if it exists.
pub(crate) fn find(
    db: &mut impl Db,
    actor: &ActorId,
    key: &LaneKey,
) -> Result<Option<StoreLaneId>, StoreError> {
    let ordering_key = key.ordering_key().unwrap_or("");
    db.query_opt(
        &FIND,
        args![actor.as_str(), key.recipient(), ordering_key],
        |r| Ok(StoreLaneId(r.int(0)?)),
    )
}

/// A lane's status row: `$where` picks the lanes. Depth: the lane's rows minus its settled
/// ones (served or dead lanes of joined units still pending elsewhere), two index counts: no
/// unit row, so no payload, is read.
macro_rules! lane_status {
    ($where:literal) => {
        concat!(
            "SELECT l.id, l.recipient, l.ordering_key, l.not_before, l.backoff_level, l.strict, \
             l.paused, l.pause_reason, l.last_status, l.last_error, \
             (SELECT count(*) FROM ol_units d WHERE d.lane_id = l.id) \
             - (SELECT count(*) FROM ol_units d WHERE d.lane_id = l.id AND d.state <> 0), \
             (SELECT coalesce(h.enqueued_at, r.enqueued_at) FROM ol_units d \
              JOIN ol_units h ON h.id = coalesce(d.unit_id, d.id) LEFT JOIN ol_rows r ON r.id = h.row_ref \
              WHERE d.lane_id = l.id AND d.state = 0 ORDER BY d.seq, d.id LIMIT 1), \
             (SELECT d.last_attempt_at IS NOT NULL FROM ol_units d \
              WHERE d.lane_id = l.id AND d.state = 0 ORDER BY d.seq, d.id LIMIT 1), \
             l.failing_since, l.unavailable_since, \
             CASE WHEN l.in_flight_since IS NOT NULL AND EXISTS (SELECT 1 FROM ol_slots s \
               WHERE s.actor = l.actor AND s.holder IS NOT NULL AND s.lease_expires > {now}) \
               THEN l.in_flight_since END, l.in_flight_unit \
             FROM ol_lanes l WHERE ",
            $where
        )
    };
}

static LIST: Sql = Sql::new(lane_status!("l.actor = $1 ORDER BY l.id"));
static ONE: Sql = Sql::new(lane_status!("l.id = $1"));

/// Whether the actor ever enqueued: every enqueue (the store's, `SqlxOutbox`'s, the plain SQL
/// of SCHEMA.md) writes its actor's row, never deleted, before any lane, unit or dead letter
/// of it exists. One primary-key probe.
static KNOWN_ACTOR: Sql = Sql::new("SELECT EXISTS (SELECT 1 FROM ol_actors WHERE actor = $1)");

/// Every lane of the actor, with its depth and state.
pub(crate) fn list(db: &mut impl Db, actor: &ActorId) -> Result<Vec<LaneStatus>, StoreError> {
    db.query(&LIST, args![actor.as_str()], status_of_row)
}

/// One lane with its depth and state, if it exists.
pub(crate) fn one(db: &mut impl Db, lane: StoreLaneId) -> Result<Option<LaneStatus>, StoreError> {
    db.query_opt(&ONE, args![lane.0], status_of_row)
}

/// Whether the outbox has seen `actor` (see [`KNOWN_ACTOR`]).
pub(crate) fn known_actor(db: &mut impl Db, actor: &ActorId) -> Result<bool, StoreError> {
    db.query_one(&KNOWN_ACTOR, args![actor.as_str()], |r| r.flag(0))
}

/// A [`LaneStatus`] from a row of [`lane_status!`].
fn status_of_row(r: &dyn Get) -> Result<LaneStatus, StoreError> {
    let last_status = status_of(r.opt_int(8)?);
    let last_error = r.opt_text(9)?;
    let head_failed = r.opt_flag(12)?.unwrap_or(false);
    Ok(LaneStatus {
        last_error_stale: (last_status.is_some() || last_error.is_some()) && !head_failed,
        last_status,
        last_error,
        lane: StoreLaneId(r.int(0)?),
        key: key_of(r.text(1)?, r.text(2)?),
        not_before: r.opt_int(3)?.map(timestamp_of),
        backoff_level: to_u32(r.int(4)?),
        strict: r.flag(5)?,
        paused: r.flag(6)?,
        pause_reason: r.opt_text(7)?,
        depth: to_u64(r.int(10)?),
        head_enqueued_at: r.opt_int(11)?.map(timestamp_of),
        failing_since: r.opt_int(13)?.map(timestamp_of),
        unavailable_since: r.opt_int(14)?.map(timestamp_of),
        in_flight_since: r.opt_int(15)?.map(timestamp_of),
        in_flight_unit: match r.opt_int(15)? {
            Some(_) => r.opt_int(16)?.map(|u| outbox_lanes_core::UnitId(to_u64(u))),
            None => None,
        },
    })
}
