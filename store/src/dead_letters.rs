//! Dead letters, written once for both backends: setting a recipient's delivery aside (a
//! pass's dead letter, a retired, purged or skipped lane), listing them, their payloads,
//! replay and purge.

use std::collections::HashSet;

use outbox_lanes_core::policy::Recipient;
use outbox_lanes_core::{ActorId, DeadReason, Seq, Timestamp, UnitId};

use crate::db::{Db, Dialect, Get, Sql, Value, args, ready};
use crate::types::{
    DeadLetter, DeadLetterId, DeadLetterRequest, DeadLetterSelection, Payload, WrittenDeadLetter,
};
use crate::units::{advance_tail, alloc_seqs, drop_row_if_unused, settle};
use crate::util::{
    decode_headers, key_of, millis_of, status_of, timestamp_of, to_i64, to_u32, to_u64,
};
use crate::{StoreError, StoreLaneId};

const STATE_DEAD: i64 = 2;

/// The pending row of unit `$1` in lane `$2` of actor `$3`, with what its dead letter keeps.
/// Postgres reads the unit's row in the lane through an array of two index probes (an `OR`
/// would scan) and locks it; on SQLite `+d.lane_id` keeps the planner on the id lookups.
static DELIVERY_ROW: Sql = Sql::with_sqlite(
    "SELECT d.id, d.seq, d.attempts, d.last_status, d.last_error, d.first_attempt_at, d.last_attempt_at, \
     h.row_ref, coalesce(h.row_id, (SELECT r.row_id FROM ol_rows r WHERE r.id = h.row_ref)), \
     l.recipient, l.ordering_key \
     FROM ol_units d JOIN ol_units h ON h.id = $1 AND h.unit_id IS NULL JOIN ol_lanes l ON l.id = d.lane_id \
     WHERE d.id = ANY(ARRAY(SELECT x.id FROM ol_units x WHERE x.id = $1 AND x.unit_id IS NULL \
       AND x.lane_id = $2 UNION ALL SELECT x.id FROM ol_units x WHERE x.unit_id = $1 AND x.lane_id = $2)) \
     AND d.lane_id = $2 AND d.state = 0 AND l.actor = $3 FOR UPDATE OF d",
    "SELECT d.id, d.seq, d.attempts, d.last_status, d.last_error, d.first_attempt_at, d.last_attempt_at, \
     h.row_ref, coalesce(h.row_id, (SELECT r.row_id FROM ol_rows r WHERE r.id = h.row_ref)), \
     l.recipient, l.ordering_key \
     FROM ol_units d JOIN ol_units h ON h.id = $1 AND h.unit_id IS NULL JOIN ol_lanes l ON l.id = d.lane_id \
     WHERE (d.id = $1 AND d.unit_id IS NULL OR d.unit_id = $1) AND +d.lane_id = $2 AND d.state = 0 \
     AND l.actor = $3",
);
/// Moves head `$1`'s inline payload into `ol_rows` (`coalesce`s: a head written by plain SQL
/// that left a column out must not make dead-lettering fail).
static SPILL_PAYLOAD: Sql = Sql::new(
    "INSERT INTO ol_rows (actor, row_id, seq, content_type, body, body_len, dedup_key, ordering_key, \
     enqueued_at, headers) \
     SELECT actor, coalesce(row_id, 'unit-' || id), seq, coalesce(content_type, ''), \
     coalesce(body, {empty_bytes}), coalesce(body_len, length(body), 0), dedup_key, \
     coalesce(ordering_key, ''), coalesce(enqueued_at, 0), headers \
     FROM ol_units WHERE id = $1 AND unit_id IS NULL AND row_ref IS NULL RETURNING id",
);
static REFER_TO_SPILLED: Sql = Sql::new(
    "UPDATE ol_units SET row_ref = $2, row_id = NULL, content_type = NULL, body = NULL, body_len = NULL, \
     dedup_key = NULL, ordering_key = NULL, enqueued_at = NULL, headers = NULL WHERE id = $1",
);
static INSERT_DEAD_LETTER: Sql = Sql::new(
    "INSERT INTO ol_dead_letters (unit_id, row_ref, row_id, actor, lane_id, recipient, ordering_key, \
     reason, last_status, last_error, attempts, first_attempt_at, last_attempt_at, seq, dead_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) RETURNING id",
);
/// The dead letter a request for unit `$2` in lane `$3` of actor `$1`, for reason `$4` at
/// `$5`, wrote: the request's own, as no other one has the same reason and time.
/// (No index serves `unit_id` here: the actor's dead letters are scanned, on a path taken only
/// when a delivery was no longer pending.)
static WRITTEN_BY_REQUEST: Sql = Sql::new(
    "SELECT id, row_id, seq, attempts, last_status, last_error FROM ol_dead_letters \
     WHERE actor = $1 AND unit_id = $2 AND lane_id = $3 AND reason = $4 AND dead_at = $5 \
     ORDER BY id DESC LIMIT 1",
);
static MARK_DEAD: Sql = Sql::new("UPDATE ol_units SET state = $2 WHERE id = $1");
static LANE_LAST_ERROR: Sql =
    Sql::new("UPDATE ol_lanes SET last_status = $2, last_error = $3 WHERE id = $1");
/// The first `$2` pending units of lane `$1` (all of them if `$2` is NULL: a negative LIMIT
/// is none on SQLite, NULL is none on Postgres).
static LANE_PENDING_UNITS: Sql = Sql::with_sqlite(
    "SELECT coalesce(unit_id, id) FROM ol_units WHERE lane_id = $1 AND state = 0 \
     ORDER BY seq, id LIMIT $2",
    "SELECT coalesce(unit_id, id) FROM ol_units WHERE lane_id = $1 AND state = 0 \
     ORDER BY seq, id LIMIT coalesce($2, -1)",
);

/// Moves one recipient's pending delivery of a unit to the dead letters (durable with the
/// transaction); finishes the unit if nothing else is pending. Returns the dead letter
/// written, or `None` if nothing was pending there (already served, dead or another actor's
/// lane).
pub(crate) fn dead_letter(
    db: &mut impl Db,
    actor: &str,
    d: &DeadLetterRequest,
    retention: bool,
) -> Result<Option<WrittenDeadLetter>, StoreError> {
    let unit = to_i64(d.unit.0);
    let found = db.query_opt(&DELIVERY_ROW, args![unit, d.lane.0, actor], |r| {
        Ok((
            [r.int(0)?, r.int(1)?, r.int(2)?],
            (r.opt_int(3)?, r.opt_text(4)?),
            [r.opt_int(5)?, r.opt_int(6)?, r.opt_int(7)?],
            (r.opt_text(8)?, r.text(9)?, r.text(10)?),
        ))
    })?;
    let Some((
        [row, seq, attempts],
        (last_status, last_error),
        [first, last, row_ref],
        (row_id, recipient, ordering_key),
    )) = found
    else {
        return Ok(None);
    };
    // A head written by hand without a row id still becomes a dead letter (the spill names it
    // the same way).
    let row_id = row_id.unwrap_or_else(|| format!("unit-{unit}"));
    // A dead letter keeps its payload in ol_rows: an inline payload moves there first (the head
    // then refers to it), so it outlives the unit and serves a replay.
    let row_ref = match row_ref {
        Some(r) => r,
        None => {
            let spilled = db.query_one(&SPILL_PAYLOAD, args![unit], |r| r.int(0))?;
            db.execute(&REFER_TO_SPILLED, args![unit, spilled])?;
            spilled
        }
    };
    let status = d.status.map(i64::from).or(last_status);
    let error = d.error.clone().or(last_error);
    let dead_at = millis_of(d.at);
    let (lane, reason, e) = (d.lane.0, d.reason.as_str(), error.as_deref());
    let (to, ok) = (&recipient, &ordering_key);
    let v = args![
        unit, row_ref, &row_id, actor, lane, to, ok, reason, status, e, attempts, first, last, seq,
        dead_at
    ];
    let id = db.query_one(&INSERT_DEAD_LETTER, v, |r| r.int(0))?;
    db.execute(&MARK_DEAD, args![row, STATE_DEAD])?;
    if d.status.is_some() || d.error.is_some() {
        db.execute(&LANE_LAST_ERROR, args![lane, status, e])?;
    }
    settle(db, unit, retention)?;
    Ok(Some(WrittenDeadLetter {
        id: DeadLetterId(id),
        unit: d.unit,
        row_id,
        seq: Seq(to_u64(seq)),
        attempts: to_u32(attempts),
        last_status: status_of(status),
        last_error: error,
        dead_at: timestamp_of(dead_at),
    }))
}

/// [`dead_letter`] for a request that may run a second time after a commit whose outcome was
/// not known (Postgres runs an idempotent write again on a fresh connection): when nothing is
/// pending any more because the first run committed, the dead letter it wrote is found (same
/// unit, lane, reason and time) and returned all the same. `None`: nothing was pending and
/// this request wrote nothing (served, or dead-lettered by something else, such as an
/// operator's purge).
pub(crate) fn dead_letter_once(
    db: &mut impl Db,
    actor: &str,
    d: &DeadLetterRequest,
    retention: bool,
) -> Result<Option<WrittenDeadLetter>, StoreError> {
    if let Some(written) = dead_letter(db, actor, d, retention)? {
        return Ok(Some(written));
    }
    let (unit, at) = (to_i64(d.unit.0), millis_of(d.at));
    let key = args![actor, unit, d.lane.0, d.reason.as_str(), at];
    db.query_opt(&WRITTEN_BY_REQUEST, key, |r| {
        Ok(WrittenDeadLetter {
            id: DeadLetterId(r.int(0)?),
            unit: d.unit,
            row_id: r.text(1)?,
            seq: Seq(to_u64(r.int(2)?)),
            attempts: to_u32(r.int(3)?),
            last_status: status_of(r.opt_int(4)?),
            last_error: r.opt_text(5)?,
            dead_at: timestamp_of(millis_of(d.at)),
        })
    })
}

/// Dead-letters the pending units of `lane`, oldest first (at most `limit` of them), for
/// `reason`. Returns the dead letters written, in that order.
pub(crate) fn dead_letter_lane(
    db: &mut impl Db,
    actor: &str,
    lane: StoreLaneId,
    reason: DeadReason,
    at: Timestamp,
    limit: Option<u32>,
    retention: bool,
) -> Result<Vec<WrittenDeadLetter>, StoreError> {
    let limit = limit.map(i64::from);
    let units = db.query(&LANE_PENDING_UNITS, args![lane.0, limit], |r| r.int(0))?;
    let mut done = Vec::with_capacity(units.len());
    for unit in units {
        let req = DeadLetterRequest {
            unit: UnitId(to_u64(unit)),
            lane,
            reason,
            status: None,
            error: None,
            at,
        };
        done.extend(dead_letter(db, actor, &req, retention)?);
    }
    Ok(done)
}

/// The columns [`dead_of`] reads.
macro_rules! dead_cols {
    () => {
        "SELECT id, unit_id, row_id, actor, recipient, ordering_key, reason, last_status, \
         last_error, attempts, first_attempt_at, last_attempt_at, seq, dead_at, row_ref, lane_id \
         FROM ol_dead_letters "
    };
}

static DEAD_OF_ACTOR: Sql = Sql::new(concat!(
    dead_cols!(),
    "WHERE actor = $1 ORDER BY seq, unit_id, id"
));
static DEAD_BY_ID: Sql = Sql::new(concat!(dead_cols!(), "WHERE id = $1"));
static DEAD_BY_IDS: Sql = Sql::new(concat!(
    dead_cols!(),
    "WHERE id = ANY($1) ORDER BY actor, seq, unit_id, id"
));
static DEAD_ALL: Sql = Sql::new(concat!(dead_cols!(), "ORDER BY actor, seq, unit_id, id"));

/// `($test $p OR $p IS NULL)`: a criterion that holds when its placeholder is NULL. (The
/// placeholder is compared before it is tested: Postgres takes its type from the first use.)
macro_rules! or_null {
    ($test:literal, $p:literal) => {
        concat!("(", $test, " ", $p, " OR ", $p, " IS NULL)")
    };
}

/// A [`DeadLetterFilter`](crate::DeadLetterFilter)'s criteria past the actor: recipient,
/// reason, dead at or after, dead before.
macro_rules! matching {
    ($recipient:literal, $reason:literal, $since:literal, $until:literal) => {
        concat!(
            or_null!("recipient =", $recipient),
            " AND ",
            or_null!("reason =", $reason),
            " AND ",
            or_null!("dead_at >=", $since),
            " AND ",
            or_null!("dead_at <", $until),
            " "
        )
    };
}

/// The dead letters of actor `$1` matching `$2`…`$5` (the actor's index, then the rest).
static DEAD_MATCHING_OF_ACTOR: Sql = Sql::new(concat!(
    dead_cols!(),
    "WHERE actor = $1 AND ",
    matching!("$2", "$3", "$4", "$5"),
    "ORDER BY seq, unit_id, id"
));
/// The dead letters of every actor matching `$1`…`$4`.
static DEAD_MATCHING: Sql = Sql::new(concat!(
    dead_cols!(),
    "WHERE ",
    matching!("$1", "$2", "$3", "$4"),
    "ORDER BY actor, seq, unit_id, id"
));

/// A dead letter with its payload row and lane.
struct Selected {
    dead: DeadLetter,
    row_ref: i64,
    lane: i64,
}

fn dead_of(r: &dyn Get) -> Result<Selected, StoreError> {
    let reason = r.text(6)?;
    Ok(Selected {
        dead: DeadLetter {
            id: DeadLetterId(r.int(0)?),
            unit: UnitId(to_u64(r.int(1)?)),
            row_id: r.text(2)?,
            actor: ActorId::new(r.text(3)?),
            key: key_of(r.text(4)?, r.text(5)?),
            // A code from a newer build reads as the closest meaning we know.
            reason: DeadReason::from_code(&reason).unwrap_or(DeadReason::Permanent),
            last_status: status_of(r.opt_int(7)?),
            last_error: r.opt_text(8)?,
            attempts: to_u32(r.int(9)?),
            first_attempt_at: r.opt_int(10)?.map(timestamp_of),
            last_attempt_at: r.opt_int(11)?.map(timestamp_of),
            seq: Seq(to_u64(r.int(12)?)),
            dead_at: timestamp_of(r.int(13)?),
        },
        row_ref: r.int(14)?,
        lane: r.int(15)?,
    })
}

/// The selected dead letters in (actor, original seq, unit, id) order.
pub(crate) fn selected(
    db: &mut impl Db,
    which: &DeadLetterSelection,
) -> Result<Vec<DeadLetter>, StoreError> {
    Ok(select(db, which)?.into_iter().map(|s| s.dead).collect())
}

/// The selected dead letters in (actor, original seq, unit, id) order, with their payload
/// rows and lanes.
fn select<D: Db>(db: &mut D, which: &DeadLetterSelection) -> Result<Vec<Selected>, StoreError> {
    match which {
        DeadLetterSelection::Actor(a) => db.query(&DEAD_OF_ACTOR, args![a.as_str()], dead_of),
        DeadLetterSelection::Matching(f) => {
            let recipient = f.recipient.as_ref().map(Recipient::as_str);
            let reason = f.reason.map(DeadReason::as_str);
            let (since, until) = (f.since.map(millis_of), f.until.map(millis_of));
            match &f.actor {
                Some(a) => db.query(
                    &DEAD_MATCHING_OF_ACTOR,
                    args![a.as_str(), recipient, reason, since, until],
                    dead_of,
                ),
                None => db.query(
                    &DEAD_MATCHING,
                    args![recipient, reason, since, until],
                    dead_of,
                ),
            }
        }
        // Postgres reads them in one statement; SQLite, which binds no arrays, one by one.
        DeadLetterSelection::Ids(ids) if D::DIALECT == Dialect::Postgres => {
            let ids: Vec<i64> = ids.iter().map(|d| d.0).collect();
            db.query(&DEAD_BY_IDS, &[Value::Ints(&ids)], dead_of)
        }
        DeadLetterSelection::Ids(ids) => {
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                out.extend(db.query_opt(&DEAD_BY_ID, args![id.0], dead_of)?);
            }
            fn key(s: &Selected) -> (&str, Seq, UnitId, DeadLetterId) {
                (s.dead.actor.as_str(), s.dead.seq, s.dead.unit, s.dead.id)
            }
            out.sort_by(|a, b| key(a).cmp(&key(b)));
            Ok(out)
        }
    }
}

/// Dead letters, of one actor or all, in (actor, original seq) order.
pub(crate) fn list(
    db: &mut impl Db,
    actor: Option<&ActorId>,
) -> Result<Vec<DeadLetter>, StoreError> {
    let selected = match actor {
        Some(a) => db.query(&DEAD_OF_ACTOR, args![a.as_str()], dead_of)?,
        None => db.query(&DEAD_ALL, &[], dead_of)?,
    };
    Ok(selected.into_iter().map(|s| s.dead).collect())
}

static DEAD_LETTER_PAYLOAD: Sql = Sql::new(
    "SELECT d.row_id, r.content_type, r.body, r.headers FROM ol_dead_letters d \
     JOIN ol_rows r ON r.id = d.row_ref WHERE d.id = $1",
);

/// A payload from a row of (row id, content type, body, headers).
pub(crate) fn payload_of(r: &dyn Get) -> Result<Payload, StoreError> {
    Ok(Payload {
        row_id: r.text(0)?,
        content_type: r.text(1)?,
        body: r.bytes(2)?,
        headers: decode_headers(r.opt_text(3)?),
    })
}

/// The payload a dead letter keeps for its replay.
pub(crate) fn payload(db: &mut impl Db, id: DeadLetterId) -> Result<Payload, StoreError> {
    db.query_opt(&DEAD_LETTER_PAYLOAD, args![id.0], payload_of)?
        .ok_or(StoreError::NotFound {
            what: "dead letter",
        })
}

static DELETE_DEAD_LETTER: Sql = Sql::new("DELETE FROM ol_dead_letters WHERE id = $1");

/// Deletes the selected dead letters and the payloads nothing refers to any more.
pub(crate) fn purge(db: &mut impl Db, which: &DeadLetterSelection) -> Result<u64, StoreError> {
    let mut n = 0;
    for s in select(db, which)? {
        n += db.execute(&DELETE_DEAD_LETTER, args![s.dead.id.0])?;
        drop_row_if_unused(db, s.row_ref)?;
    }
    Ok(n)
}

static UNIT_HEAD: Sql =
    Sql::new("SELECT pending, acked_at FROM ol_units WHERE id = $1 AND unit_id IS NULL");
/// Unit `$1`'s row in lane `$2` is pending again, its attempts forgotten.
static REJOIN_IN_PLACE: Sql = Sql::with_sqlite(
    "UPDATE ol_units SET state = 0, attempts = 0, last_status = NULL, last_error = NULL, \
     first_attempt_at = NULL, last_attempt_at = NULL WHERE id = ANY(ARRAY(SELECT x.id FROM ol_units x \
     WHERE x.id = $1 AND x.unit_id IS NULL AND x.lane_id = $2 UNION ALL \
     SELECT x.id FROM ol_units x WHERE x.unit_id = $1 AND x.lane_id = $2))",
    "UPDATE ol_units AS d SET state = 0, attempts = 0, last_status = NULL, last_error = NULL, \
     first_attempt_at = NULL, last_attempt_at = NULL \
     WHERE (d.id = $1 AND d.unit_id IS NULL OR d.unit_id = $1) AND +d.lane_id = $2",
);
static ONE_MORE_PENDING: Sql = Sql::new("UPDATE ol_units SET pending = pending + 1 WHERE id = $1");
static ONE_MORE_LANE: Sql =
    Sql::new("UPDATE ol_units SET pending = pending + 1, lanes = lanes + 1 WHERE id = $1");
static INSERT_LANE_ROW: Sql =
    Sql::new("INSERT INTO ol_units (unit_id, actor, lane_id, seq) VALUES ($1, $2, $3, $4)");
static REVIVE_RETAINED: Sql = Sql::new(
    "UPDATE ol_units SET acked_at = NULL, pending = 1, lanes = 1, seq = $2, lane_id = $3, \
     state = 0, attempts = 0, last_status = NULL, last_error = NULL, first_attempt_at = NULL, \
     last_attempt_at = NULL, row_ref = $4, row_id = NULL, content_type = NULL, body = NULL, \
     body_len = NULL, dedup_key = NULL, ordering_key = NULL, enqueued_at = NULL, headers = NULL \
     WHERE id = $1",
);
static INSERT_HEAD: Sql =
    Sql::new("INSERT INTO ol_units (id, actor, lane_id, seq, row_ref) VALUES ($1, $2, $3, $4, $5)");

/// Puts the selected dead letters back at the tail of their lanes in their original order:
/// one new `seq` per (actor, original seq), attempts reset, the same unit id. Returns the units
/// and the actors that got work.
pub(crate) fn replay(
    db: &mut impl Db,
    which: &DeadLetterSelection,
) -> Result<(Vec<UnitId>, Vec<ActorId>), StoreError> {
    let mut revived: HashSet<i64> = HashSet::new();
    let mut units = Vec::new();
    let mut actors: Vec<ActorId> = Vec::new();
    // One new seq per (actor, original seq): the units of one row keep sharing a seq.
    let mut last_group: Option<(ActorId, Seq)> = None;
    let mut seq = 0;
    for Selected {
        dead,
        row_ref,
        lane,
    } in select(db, which)?
    {
        let group = (dead.actor.clone(), dead.seq);
        if last_group.as_ref() != Some(&group) {
            seq = ready(alloc_seqs(db, dead.actor.as_str(), 1))?;
            last_group = Some(group);
        }
        if !actors.contains(&dead.actor) {
            actors.push(dead.actor.clone());
        }
        let unit = to_i64(dead.unit.0);
        let actor = dead.actor.as_str();
        let head = db.query_opt(&UNIT_HEAD, args![unit], |r| Ok((r.int(0)?, r.opt_int(1)?)))?;
        match head {
            // A joined unit still pending for other recipients: this recipient rejoins in
            // place (its lanes already hold the unit at its seq).
            Some((pending, None)) if pending > 0 && !revived.contains(&unit) => {
                db.execute(&REJOIN_IN_PLACE, args![unit, lane])?;
                db.execute(&ONE_MORE_PENDING, args![unit])?;
            }
            // Revived earlier in this replay: another lane joins it.
            Some(_) if revived.contains(&unit) => {
                db.execute(&ONE_MORE_LANE, args![unit])?;
                db.execute(&INSERT_LANE_ROW, args![unit, actor, lane, seq])?;
                advance_tail(db, lane, seq)?;
            }
            // Kept for the ack retention: it becomes pending again, in this lane only, its
            // payload read from the dead letter's row.
            Some(_) => {
                db.execute(&crate::units::DELETE_OTHER_LANES, args![unit])?;
                db.execute(&REVIVE_RETAINED, args![unit, seq, lane, row_ref])?;
                revived.insert(unit);
                advance_tail(db, lane, seq)?;
            }
            // Gone: a head with the same id (the idempotency key stays stable; ids are never
            // handed out twice).
            None => {
                db.execute(&INSERT_HEAD, args![unit, actor, lane, seq, row_ref])?;
                revived.insert(unit);
                advance_tail(db, lane, seq)?;
            }
        }
        db.execute(&DELETE_DEAD_LETTER, args![dead.id.0])?;
        if !units.contains(&dead.unit) {
            units.push(dead.unit);
        }
    }
    Ok((units, actors))
}
