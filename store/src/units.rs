//! A unit's lifecycle after enqueue, shared by the backends: its payload, its attempt
//! records, counting recipients down, finishing a unit (deleted, or kept for the ack
//! retention), dropping a shared payload row nothing refers to, a lane's tail, and an actor's
//! sequence numbers.

use std::collections::HashMap;

use outbox_lanes_core::UnitId;

use crate::StoreError;
use crate::db::{AsyncDb, Db, Dialect, Sql, args};
use crate::set_aside::RECORD_ON_SET_ASIDE;
use crate::types::{AttemptRecord, Payload};
use crate::util::{decode_headers, millis_of, to_i64, to_u64};

/// `ol_units.state` of a delivery neither served nor dead-lettered.
pub(crate) const STATE_PENDING: i64 = 0;

/// A pending unit's payload, inline on its head or shared in `ol_rows` (Postgres: a `LATERAL`
/// probe, which no statistics turn into a join).
static PAYLOAD: Sql = Sql::with_sqlite(
    "SELECT coalesce(h.row_id, r.row_id), coalesce(h.content_type, r.content_type), \
     coalesce(h.body, r.body), CASE WHEN h.row_ref IS NULL THEN h.headers ELSE r.headers END \
     FROM ol_units h \
     LEFT JOIN LATERAL (SELECT r.row_id, r.content_type, r.body, r.headers FROM ol_rows r \
       WHERE r.id = h.row_ref LIMIT 1) r ON TRUE \
     WHERE h.id = $1 AND h.unit_id IS NULL AND h.acked_at IS NULL",
    "SELECT coalesce(h.row_id, r.row_id), coalesce(h.content_type, r.content_type), \
     CASE WHEN h.row_ref IS NULL THEN h.body ELSE r.body END, \
     CASE WHEN h.row_ref IS NULL THEN h.headers ELSE r.headers END \
     FROM ol_units h LEFT JOIN ol_rows r ON r.id = h.row_ref \
     WHERE h.id = $1 AND h.unit_id IS NULL AND h.acked_at IS NULL",
);

/// The payload of a pending unit.
///
/// # Errors
/// [`StoreError::NotFound`] if the unit is finished or unknown; a head whose payload row is
/// gone (the tables were edited) is [`StoreError::Database`].
pub(crate) fn payload(db: &mut impl Db, unit: UnitId) -> Result<Payload, StoreError> {
    let (row_id, content_type, body, headers) = db
        .query_opt(&PAYLOAD, args![to_i64(unit.0)], |r| {
            Ok((
                r.opt_text(0)?,
                r.opt_text(1)?,
                r.opt_bytes(2)?,
                r.opt_text(3)?,
            ))
        })?
        .ok_or(StoreError::NotFound { what: "unit" })?;
    payload_of(unit, (row_id, content_type, body, headers))
}

/// A payload from its columns (row id, content type, body, encoded headers).
fn payload_of(
    unit: UnitId,
    (row_id, content_type, body, headers): (
        Option<String>,
        Option<String>,
        Option<Vec<u8>>,
        Option<String>,
    ),
) -> Result<Payload, StoreError> {
    match (row_id, content_type, body) {
        (Some(row_id), Some(content_type), Some(body)) => Ok(Payload {
            row_id,
            content_type,
            body,
            headers: decode_headers(headers),
        }),
        _ => Err(StoreError::Database(format!("unit {unit} has no payload"))),
    }
}

/// The pending payloads of the units in the array `$1`, in one statement (Postgres only:
/// SQLite has no arrays, and there the claim brings one-lane payloads with it): each unit's
/// own columns (`id` set), then each shared payload they refer to once (`id` NULL, its
/// `ol_rows` id in the second column). A round's starts are often the same fan-out row on
/// many lanes: its payload is probed and sent once, not once per unit.
static PAYLOADS_PG: Sql = Sql::new(
    "WITH h AS MATERIALIZED (SELECT h.id, h.row_ref, h.row_id, h.content_type, h.body, h.headers \
       FROM ol_units h WHERE h.id = ANY($1) AND h.unit_id IS NULL AND h.acked_at IS NULL) \
     SELECT h.id, h.row_ref, h.row_id, h.content_type, h.body, h.headers FROM h \
     UNION ALL SELECT NULL, r.id, r.row_id, r.content_type, r.body, r.headers FROM ol_rows r \
       WHERE r.id = ANY(ARRAY(SELECT DISTINCT h.row_ref FROM h WHERE h.row_ref IS NOT NULL))",
);

/// A payload's columns as read: row id, content type, body, encoded headers.
type PayloadColumns = (
    Option<String>,
    Option<String>,
    Option<Vec<u8>>,
    Option<String>,
);

/// The payloads of `units`, in their order, read with ONE statement whatever their number
/// (the round's starts: never one round trip per unit). Each unit's result is its own, as
/// [`payload`] would give it; a failure of the statement itself is the `Err`.
///
/// # Errors
/// The statement's failure (a lost connection among them); per unit, as [`payload`].
pub(crate) fn payloads_pg(
    db: &mut impl Db,
    units: &[UnitId],
) -> Result<Vec<Result<Payload, StoreError>>, StoreError> {
    let ids: Vec<i64> = units.iter().map(|u| to_i64(u.0)).collect();
    let read = db.query(&PAYLOADS_PG, args![&ids], |r| {
        Ok((
            r.opt_int(0)?,
            r.opt_int(1)?,
            (
                r.opt_text(2)?,
                r.opt_text(3)?,
                r.opt_bytes(4)?,
                r.opt_text(5)?,
            ),
        ))
    })?;
    // The shared payloads first, then each unit's own columns completed from its row's the
    // way `payload` does: the unit's own value where it has one, the row's headers always.
    let mut shared: HashMap<i64, PayloadColumns> = HashMap::new();
    let mut own: Vec<(i64, Option<i64>, PayloadColumns)> = Vec::with_capacity(ids.len());
    for (id, row_ref, cols) in read {
        match (id, row_ref) {
            (Some(id), row_ref) => own.push((id, row_ref, cols)),
            (None, Some(row)) => {
                shared.insert(row, cols);
            }
            (None, None) => {}
        }
    }
    let mut found: HashMap<i64, Result<Payload, StoreError>> = HashMap::with_capacity(own.len());
    for (id, row_ref, (row_id, content_type, body, headers)) in own {
        let cols = match row_ref {
            None => (row_id, content_type, body, headers),
            Some(row) => match shared.get(&row) {
                Some((r_id, r_type, r_body, r_headers)) => (
                    row_id.or_else(|| r_id.clone()),
                    content_type.or_else(|| r_type.clone()),
                    body.or_else(|| r_body.clone()),
                    r_headers.clone(),
                ),
                // The row is gone (the tables were edited): no payload, as `payload` says.
                None => (row_id, content_type, body, None),
            },
        };
        found.insert(id, payload_of(UnitId(to_u64(id)), cols));
    }
    // A unit asked for twice (a joined unit's starts on several lanes) gets its payload each
    // time: the last ask takes it, earlier ones copy it.
    let mut asks: HashMap<i64, usize> = HashMap::with_capacity(ids.len());
    for id in &ids {
        *asks.entry(*id).or_default() += 1;
    }
    Ok(ids
        .iter()
        .map(|id| {
            let left = asks.get_mut(id).map_or(0, |n| {
                *n -= 1;
                *n
            });
            let p = if left == 0 {
                found.remove(id)
            } else {
                found.get(id).cloned()
            };
            p.unwrap_or(Err(StoreError::NotFound { what: "unit" }))
        })
        .collect())
}

/// An enqueue takes the actor's row first and then its lanes; attempt records write several
/// lanes too, so they take the actor's row first as well (shared: they do not wait for each
/// other), instead of locking two lanes crosswise with an enqueue and deadlocking.
static LOCK_ACTOR_SHARED: Sql = Sql::new("SELECT 1 FROM ol_actors WHERE actor = $1 FOR SHARE");

/// One attempt record on unit `$1`'s row in lane `$2`: its head, or another lane's row of a
/// joined unit. Postgres finds it through an array of two index probes (an `OR` would scan);
/// on SQLite `+d.lane_id` keeps the planner on the id and `ol_units_unit` lookups.
static RECORD_ATTEMPT: Sql = Sql::with_sqlite(
    "UPDATE ol_units SET attempts = $3, last_status = $4, last_error = $5, \
     first_attempt_at = coalesce(first_attempt_at, $6), last_attempt_at = $6 \
     WHERE id = ANY(ARRAY(SELECT x.id FROM ol_units x WHERE x.id = $1 AND x.unit_id IS NULL \
       AND x.lane_id = $2 UNION ALL SELECT x.id FROM ol_units x WHERE x.unit_id = $1 AND x.lane_id = $2)) \
     AND lane_id = $2 AND state = 0 AND actor = $7",
    "UPDATE ol_units AS d SET attempts = $3, last_status = $4, last_error = $5, \
     first_attempt_at = coalesce(first_attempt_at, $6), last_attempt_at = $6 \
     WHERE (d.id = $1 AND d.unit_id IS NULL OR d.unit_id = $1) AND +d.lane_id = $2 \
     AND d.state = 0 AND d.actor = $7",
);
static LANE_LAST_ATTEMPT: Sql =
    Sql::new("UPDATE ol_lanes SET last_status = $2, last_error = $3 WHERE id = $1");

/// Persists attempt records (OL-5), in the caller's fenced transaction: each recipient's count
/// and last status/error, and its lane's last status/error. A record of a delivery no longer
/// pending (set aside by an operator while the attempt was in flight, OL-14) goes on its dead
/// letter. Rows are written in (lane, unit) order, so two writers of overlapping lanes cannot
/// deadlock each other on Postgres (a deadlock the server breaks surfaces as
/// [`StoreError::Busy`]).
pub(crate) fn record_attempts<D: Db>(
    db: &mut D,
    actor: &str,
    attempts: &[AttemptRecord],
) -> Result<(), StoreError> {
    let mut sorted: Vec<&AttemptRecord> = attempts.iter().collect();
    sorted.sort_by_key(|a| (a.lane, a.unit));
    if D::DIALECT == Dialect::Postgres {
        db.execute(&LOCK_ACTOR_SHARED, args![actor])?;
    }
    for a in sorted {
        let (unit, n, at) = (to_i64(a.unit.0), i64::from(a.attempts), millis_of(a.at));
        let (status, error) = (a.status.map(i64::from), a.error.as_deref());
        let v = args![unit, a.lane.0, n, status, error, at, actor];
        if db.execute(&RECORD_ATTEMPT, v)? == 1 {
            db.execute(&LANE_LAST_ATTEMPT, args![a.lane.0, status, error])?;
        } else {
            db.execute(&RECORD_ON_SET_ASIDE, v)?;
        }
    }
    Ok(())
}

/// Unit `$1` has one recipient fewer pending; its new count.
static COUNT_DOWN: Sql = Sql::new(
    "UPDATE ol_units SET pending = pending - 1 WHERE id = $1 AND unit_id IS NULL RETURNING pending",
);
pub(crate) static DELETE_OTHER_LANES: Sql = Sql::new("DELETE FROM ol_units WHERE unit_id = $1");
static KEEP_FOR_RETENTION: Sql =
    Sql::new("UPDATE ol_units SET acked_at = {now}, pending = 0, lane_id = NULL WHERE id = $1");
static DELETE_HEAD: Sql = Sql::new("DELETE FROM ol_units WHERE id = $1 RETURNING row_ref");
/// `OFFSET 0` keeps Postgres from planning the two probes as joins (SQLite needs no fence).
static DROP_ROW_IF_UNUSED: Sql = Sql::with_sqlite(
    "DELETE FROM ol_rows WHERE id = $1 \
     AND NOT EXISTS (SELECT 1 FROM ol_units WHERE row_ref = $1 OFFSET 0) \
     AND NOT EXISTS (SELECT 1 FROM ol_dead_letters WHERE row_ref = $1 OFFSET 0)",
    "DELETE FROM ol_rows WHERE id = $1 \
     AND NOT EXISTS (SELECT 1 FROM ol_units WHERE row_ref = $1) \
     AND NOT EXISTS (SELECT 1 FROM ol_dead_letters WHERE row_ref = $1)",
);
pub(crate) static ADVANCE_TAIL: Sql = Sql::with_sqlite(
    "UPDATE ol_lanes SET tail_seq = GREATEST(tail_seq, $2) WHERE id = $1",
    "UPDATE ol_lanes SET tail_seq = max(tail_seq, $2) WHERE id = $1",
);
static ALLOC_SEQS: Sql = Sql::new(
    "INSERT INTO ol_actors AS a (actor, last_seq) VALUES ($1, $2) \
     ON CONFLICT (actor) DO UPDATE SET last_seq = a.last_seq + excluded.last_seq RETURNING last_seq",
);

/// One recipient of `unit` is no longer pending: count it down, and finish the unit when
/// nothing is left (its other lanes' rows deleted; the head deleted, or kept out of every lane
/// for the ack retention).
pub(crate) fn settle(db: &mut impl Db, unit: i64, retention: bool) -> Result<(), StoreError> {
    let pending = db.query_opt(&COUNT_DOWN, args![unit], |r| r.int(0))?;
    if pending.is_none_or(|p| p > 0) {
        return Ok(());
    }
    db.execute(&DELETE_OTHER_LANES, args![unit])?;
    finish_head(db, unit, retention)
}

/// Removes a finished unit's head (or keeps it, out of every lane, for the retention), and
/// its shared payload once nothing refers to it.
pub(crate) fn finish_head(db: &mut impl Db, unit: i64, retention: bool) -> Result<(), StoreError> {
    if retention {
        db.execute(&KEEP_FOR_RETENTION, args![unit])?;
    } else if let Some(Some(row_ref)) = db.query_opt(&DELETE_HEAD, args![unit], |r| r.opt_int(0))? {
        drop_row_if_unused(db, row_ref)?;
    }
    Ok(())
}

/// Deletes a shared payload row once no unit and no dead letter refers to it.
pub(crate) fn drop_row_if_unused(db: &mut impl Db, row_ref: i64) -> Result<(), StoreError> {
    db.execute(&DROP_ROW_IF_UNUSED, args![row_ref])?;
    Ok(())
}

/// Raises a lane's last enqueued `seq` (the watermark of admission streams) to `seq`.
pub(crate) fn advance_tail(db: &mut impl Db, lane: i64, seq: i64) -> Result<(), StoreError> {
    db.execute(&ADVANCE_TAIL, args![lane, seq])?;
    Ok(())
}

/// Takes `n` sequence numbers of `actor`; returns the first. The actor's row stays locked to
/// the commit: enqueues of one actor commit in seq order, so a pass never sees seq n+1 before
/// seq n.
pub(crate) async fn alloc_seqs(
    db: &mut impl AsyncDb,
    actor: &str,
    n: i64,
) -> Result<i64, StoreError> {
    let last = db
        .query_one(&ALLOC_SEQS, args![actor, n], |r| r.int(0))
        .await?;
    Ok(last - n + 1)
}
