//! The Postgres hot path of a pass, over the statement layer ([`Db`], Postgres dialect): the
//! lanes with work, claims and acks. Every statement is a round trip to the server, so each
//! call is one set-based statement (arrays, `unnest`, data-modifying CTEs) fenced by the slot
//! token in the same statement, where SQLite runs small statements per lane (`sqlite_path.rs`).
//! They run on connections with the planner settings of
//! [`pg_schema::settings`](crate::pg_schema::settings). Enqueue is in `enqueue.rs`, payloads
//! and attempt records in `units.rs`.

use std::collections::{BTreeMap, HashMap};

use outbox_lanes_core::{LaneKey, Seq, UnitId};

use crate::backend::Backend;
use crate::db::{Db, Sql, args};
use crate::lanes::{self, pending_lane};
use crate::types::{
    ClaimRange, ClaimedLane, ClaimedSlot, ClaimedUnit, DELIVERED_AFTER_SET_ASIDE, PendingLane,
    SlotToken, StoreLaneId,
};
use crate::units::STATE_PENDING;
use crate::util::{key_of, timestamp_of, to_i64, to_u32, to_u64};
use crate::{StoreError, delivery_log, slots};

/// The drain-slot check as an SQL condition on `$1` (actor) and `$2` (fencing token), for
/// statements that fence themselves instead of spending a round trip on
/// [`slots::fence`].
macro_rules! live_slot {
    () => {
        "SELECT 1 FROM ol_slots WHERE actor = $1 AND token = $2 AND holder IS NOT NULL \
         AND lease_expires > {now}"
    };
}

/// In a claim, what a joined unit's lane row `d` does not hold itself: its head's row id,
/// length, time and lane count (and the head's shared payload's, if any), one probe of each
/// table at most. A fan-out unit's shared payload is not probed here but once per statement
/// for all the units that refer to it (see [`CLAIM`]); a head with its payload inline reads
/// nothing (the branch is gated off before any probe). It was three subqueries, each probing
/// the head and the payload again: 9 index probes per delivery of a fan-out row where 4
/// remained (`pg_stat_user_indexes` over a 100 lanes x 500 rows drain), then fewer as the
/// shared row went out of the per-unit path.
macro_rules! payload_of_d {
    () => {
        "SELECT coalesce(h.row_id, r.row_id) AS row_id, coalesce(h.body_len, r.body_len) AS len, \
           coalesce(h.enqueued_at, r.enqueued_at) AS at, h.lanes \
         FROM ol_units h LEFT JOIN ol_rows r ON r.id = h.row_ref \
         WHERE d.unit_id IS NOT NULL AND h.id = d.unit_id"
    };
}

/// The one-statement ack of one-lane units (see [`ack`]); `$finish` deletes or retains them,
/// and with `logged` the statement also writes their delivery-log entries.
macro_rules! ack_one_lane {
    // The common part: the slot, whether joined units exist, the finish and the rows freed.
    (@ctes $finish:expr) => {
        concat!(
            "WITH f AS (",
            live_slot!(),
            " FOR SHARE), \
             j AS (SELECT CASE WHEN EXISTS (SELECT 1 FROM ol_units WHERE unit_id IS NOT NULL) \
               THEN EXISTS (SELECT 1 FROM ol_units x WHERE x.unit_id = ANY($3::bigint[])) ELSE FALSE END AS joined), \
             s AS (",
            $finish,
            "), \
             r AS (DELETE FROM ol_rows r WHERE r.id = ANY(ARRAY(SELECT row_ref FROM s WHERE row_ref IS NOT NULL)) \
               AND NOT EXISTS (SELECT 1 FROM ol_units x WHERE x.row_ref = r.id \
                 AND NOT (x.id = ANY(ARRAY(SELECT id FROM s))) OFFSET 0) \
               AND NOT EXISTS (SELECT 1 FROM ol_dead_letters x WHERE x.row_ref = r.id OFFSET 0))"
        )
    };
    ($finish:expr) => {
        concat!(
            ack_one_lane!(@ctes $finish),
            " SELECT EXISTS (SELECT 1 FROM f), (SELECT joined FROM j), ARRAY(SELECT id FROM s)"
        )
    };
    // `$finish` returns each finished unit's log entry (`$5`…`$11`, aligned with the units;
    // a NULL row id where a unit has none): the log is written from the statement's own result,
    // only for the units it finished, with no join.
    ($finish:expr, logged) => {
        concat!(
            ack_one_lane!(@ctes $finish),
            ", \
             g AS (INSERT INTO ol_delivery_log (actor, row_id, unit_id, lane_id, attempt, started_at, \
               duration_ms, status, error_class, body, delivered) \
               SELECT $1, s.log_row_id, s.id, s.lane, s.attempt, s.started, s.took, s.status, \
               s.class, s.body, TRUE FROM s WHERE s.log_row_id IS NOT NULL) \
             SELECT EXISTS (SELECT 1 FROM f), (SELECT joined FROM j), ARRAY(SELECT id FROM s)"
        )
    };
}

static ACK_ONE_LANE_RETAIN: Sql = Sql::new(ack_one_lane!(
    "UPDATE ol_units d SET state = 1, pending = 0, acked_at = {now}, lane_id = NULL \
     FROM unnest($3::bigint[], $4::bigint[]) AS a(id, lane) \
     WHERE NOT (SELECT joined FROM j) AND EXISTS (SELECT 1 FROM f) \
     AND d.id = a.id AND d.lane_id = a.lane AND d.unit_id IS NULL \
     AND d.state = 0 AND d.lanes = 1 AND d.actor = $1 RETURNING d.id, NULL::bigint AS row_ref"
));
static ACK_ONE_LANE_DELETE: Sql = Sql::new(ack_one_lane!(
    "DELETE FROM ol_units d USING unnest($3::bigint[], $4::bigint[]) AS a(id, lane) \
     WHERE NOT (SELECT joined FROM j) AND EXISTS (SELECT 1 FROM f) \
     AND d.id = a.id AND d.lane_id = a.lane AND d.unit_id IS NULL \
     AND d.state = 0 AND d.lanes = 1 AND d.actor = $1 RETURNING d.id, d.row_ref"
));

/// The units `$3` in lanes `$4` with their log entries' columns, aligned (see
/// [`crate::delivery_log::Columns::aligned`]).
macro_rules! units_with_log {
    () => {
        "unnest($3::bigint[], $4::bigint[], $5::text[], $6::bigint[], $7::bigint[], $8::bigint[], \
           $9::bigint[], $10::text[], $11::text[]) \
           AS a(id, lane, log_row_id, attempt, started, took, status, class, body)"
    };
}

/// The log columns a logged finish returns.
macro_rules! log_returned {
    () => {
        "a.lane, a.log_row_id, a.attempt, a.started, a.took, a.status, a.class, a.body"
    };
}

/// [`ACK_ONE_LANE_DELETE`] writing the delivery log's entries too (`$5`…`$11`), in the same
/// statement: the log costs no round trip.
static ACK_ONE_LANE_DELETE_LOGGED: Sql = Sql::new(ack_one_lane!(
    concat!(
        "DELETE FROM ol_units d USING ",
        units_with_log!(),
        " WHERE NOT (SELECT joined FROM j) AND EXISTS (SELECT 1 FROM f) \
         AND d.id = a.id AND d.lane_id = a.lane AND d.unit_id IS NULL \
         AND d.state = 0 AND d.lanes = 1 AND d.actor = $1 RETURNING d.id, d.row_ref, ",
        log_returned!()
    ),
    logged
));

/// [`ACK_ONE_LANE_RETAIN`] writing the delivery log's entries too.
static ACK_ONE_LANE_RETAIN_LOGGED: Sql = Sql::new(ack_one_lane!(
    concat!(
        "UPDATE ol_units d SET state = 1, pending = 0, acked_at = {now}, lane_id = NULL FROM ",
        units_with_log!(),
        " WHERE NOT (SELECT joined FROM j) AND EXISTS (SELECT 1 FROM f) \
         AND d.id = a.id AND d.lane_id = a.lane AND d.unit_id IS NULL \
         AND d.state = 0 AND d.lanes = 1 AND d.actor = $1 RETURNING d.id, NULL::bigint AS row_ref, ",
        log_returned!()
    ),
    logged
));

/// See [`lanes_with_work`].
static LANES_WITH_WORK: Sql = Sql::new(concat!(
    "SELECT f.live, ",
    lanes::pending_lane_cols!(),
    ", l.tail_seq, ",
    lanes::pending_count_col!(),
    " FROM (SELECT EXISTS (",
    live_slot!(),
    ") AS live) f \
                     LEFT JOIN LATERAL (SELECT * FROM ol_lanes l WHERE f.live AND l.actor = $1 AND l.tail_seq > $3 \
                     AND EXISTS (SELECT 1 FROM ol_units d WHERE d.lane_id = l.id \
                     ORDER BY d.lane_id DESC, d.seq DESC, d.id DESC LIMIT 1 OFFSET 0)) l ON TRUE ORDER BY l.id"
));

/// See [`claim`]. The lanes' units (`c`, each with its lane's place in the request, `ord`),
/// then, once each, the shared payloads (`ol_rows`) the fan-out units among them refer to:
/// their row id, length and time, marked by a NULL unit and lane and their id in the last
/// column. No `ORDER BY`: [`claim`] groups the units by `ord` and orders each lane's by seq.
static CLAIM: Sql = Sql::new(concat!(
    "WITH c AS MATERIALIZED (SELECT f.live, d.unit, d.seq, d.attempts, d.state, d.row_id, d.len, \
                       d.at, d.lanes, l.ord, l.id, l.recipient, l.ordering_key, l.paused, d.row_ref \
                     FROM (SELECT EXISTS (",
    live_slot!(),
    ") AS live) f \
                     LEFT JOIN LATERAL (SELECT k.ord, k.from_seq, k.lim, l.id, l.recipient, l.ordering_key, l.paused \
                       FROM unnest($3::bigint[], $4::bigint[], $5::bigint[]) WITH ORDINALITY AS k(lane, from_seq, lim, ord) \
                       CROSS JOIN LATERAL (SELECT l.id, l.recipient, l.ordering_key, l.paused FROM ol_lanes l \
                         WHERE l.id = k.lane AND l.actor = $1 LIMIT 1) l \
                       WHERE f.live) l ON TRUE \
                     LEFT JOIN LATERAL (SELECT coalesce(d.unit_id, d.id) AS unit, d.seq, d.id, d.attempts, d.state, \
                         coalesce(d.row_id, x.row_id) AS row_id, coalesce(d.body_len, x.len) AS len, \
                         coalesce(d.enqueued_at, x.at) AS at, \
                         CASE WHEN d.unit_id IS NULL THEN d.lanes ELSE x.lanes END AS lanes, \
                         CASE WHEN d.unit_id IS NULL THEN d.row_ref END AS row_ref \
                       FROM ol_units d LEFT JOIN LATERAL (",
    payload_of_d!(),
    ") x ON TRUE \
                       WHERE NOT l.paused AND d.lane_id = l.id AND d.seq >= l.from_seq \
                       ORDER BY d.lane_id, d.seq, d.id LIMIT l.lim) d ON TRUE) \
     SELECT * FROM c \
     UNION ALL SELECT TRUE, NULL, NULL, NULL, NULL, r.row_id, r.body_len, r.enqueued_at, NULL, NULL, \
       NULL, NULL, NULL, NULL, r.id FROM ol_rows r \
       WHERE r.id = ANY(ARRAY(SELECT DISTINCT c.row_ref FROM c WHERE c.row_ref IS NOT NULL))"
));

/// Every lane's row of the joined units `$1`.
static CLAIM_JOINED: Sql = Sql::new(
    "SELECT d.unit, d.lane_id, l.recipient, l.ordering_key, d.attempts, d.state FROM ( \
                       SELECT id AS unit, lane_id, attempts, state FROM ol_units \
                         WHERE id = ANY($1::bigint[]) AND unit_id IS NULL \
                       UNION ALL SELECT unit_id, lane_id, attempts, state FROM ol_units \
                         WHERE unit_id = ANY($1::bigint[])) d \
                     JOIN ol_lanes l ON l.id = d.lane_id ORDER BY d.unit, d.lane_id",
);

/// The joined units' other lanes served, and the heads acked on their own lane (the last
/// column says which).
static ACK_JOINED_OTHER_LANES: Sql = Sql::new(
    "WITH a AS (SELECT * FROM unnest($1::bigint[], $2::bigint[]) AS a(unit, lane)), \
                 o AS (UPDATE ol_units d SET state = 1 FROM a \
                   WHERE d.unit_id = a.unit AND d.lane_id = a.lane AND d.state = 0 AND d.actor = $3 \
                   RETURNING d.unit_id, d.lane_id) \
                 SELECT unit_id, lane_id, FALSE FROM o \
                 UNION ALL SELECT h.id, h.lane_id, TRUE FROM a JOIN ol_units h ON h.id = a.unit AND h.lane_id = a.lane \
                   WHERE h.unit_id IS NULL AND h.state = 0 AND h.actor = $3",
);

/// Each head served on its own lane (if still pending there) and counted down.
static ACK_JOINED_HEADS: Sql = Sql::new(
    "UPDATE ol_units h SET \
                       state = CASE WHEN h.lane_id = x.lane AND h.state = 0 THEN 1 ELSE h.state END, \
                       pending = h.pending - x.n - CASE WHEN h.lane_id = x.lane AND h.state = 0 THEN 1 ELSE 0 END \
                     FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS x(id, n, lane) \
                     WHERE h.id = x.id AND h.unit_id IS NULL RETURNING h.id, h.pending, h.row_ref",
);

/// Finished joined units kept for the retention.
static ACK_JOINED_RETAIN: Sql = Sql::new(
    "WITH o AS (DELETE FROM ol_units d USING unnest($1::bigint[]) AS k(id) WHERE d.unit_id = k.id) \
                         UPDATE ol_units h SET acked_at = {now}, lane_id = NULL, pending = 0 \
                         FROM unnest($1::bigint[]) AS k(id) WHERE h.id = k.id",
);

/// Finished joined units deleted, with their shared payloads nothing else refers to.
static ACK_JOINED_DELETE: Sql = Sql::new(
    "WITH o AS (DELETE FROM ol_units d USING unnest($1::bigint[]) AS k(id) WHERE d.unit_id = k.id), \
                          h AS (DELETE FROM ol_units h USING unnest($1::bigint[]) AS k(id) WHERE h.id = k.id) \
                     DELETE FROM ol_rows r WHERE r.id = ANY($2::bigint[]) \
                     AND NOT EXISTS (SELECT 1 FROM ol_units x WHERE x.row_ref = r.id AND NOT (x.id = ANY($1)) OFFSET 0) \
                     AND NOT EXISTS (SELECT 1 FROM ol_dead_letters x WHERE x.row_ref = r.id OFFSET 0)",
);

/// The lanes of the token's actor with pending units enqueued after `since`, and the new
/// watermark; fenced in the same statement (one round trip): the first column says whether
/// the token is live, and a stale token reads no lane. A lane's rows are probed from its tail:
/// acked units leave dead index entries at its head until vacuum, and the tail holds the
/// newest units (kept a per-lane subplan, scanning backwards, by OFFSET 0).
pub(crate) fn lanes_with_work(
    db: &mut impl Db,
    token: &SlotToken,
    since: u64,
) -> Result<(Vec<PendingLane>, u64), StoreError> {
    type Row = (bool, Option<(PendingLane, i64)>);
    let rows: Vec<Row> = db.query(
        &LANES_WITH_WORK,
        args![
            token.actor().as_str(),
            to_i64(token.fencing()),
            to_i64(since)
        ],
        |r| {
            let lane = match r.opt_int(1)? {
                None => None,
                Some(_) => {
                    let mut lane = pending_lane(r, 1)?;
                    lane.pending = to_u64(r.int(2 + lanes::PENDING_LANE_COLS)?);
                    Some((lane, r.int(1 + lanes::PENDING_LANE_COLS)?))
                }
            };
            Ok((r.flag(0)?, lane))
        },
    )?;
    if !rows.first().is_some_and(|r| r.0) {
        return Err(slots::stale(token));
    }
    let mut mark = since;
    let mut out = Vec::with_capacity(rows.len());
    for (lane, tail) in rows.into_iter().filter_map(|r| r.1) {
        mark = mark.max(to_u64(tail));
        out.push(lane);
    }
    Ok((out, mark))
}

/// One row of [`CLAIM`]: a unit at a lane's head (if any) and its lane (if known).
struct ClaimRow {
    unit: Option<i64>,
    seq: i64,
    attempts: i64,
    state: i64,
    row_id: Option<String>,
    len: Option<i64>,
    at: Option<i64>,
    lanes: i64,
    ord: i64,
    lane: Option<(i64, LaneKey, bool)>,
    /// The shared payload the unit refers to (a fan-out unit), or, on a shared payload's
    /// own row (no unit, no lane), its id.
    row_ref: Option<i64>,
}

/// A shared payload's row id, length and enqueue time, as a claim reads them.
type SharedRow = (Option<String>, Option<i64>, Option<i64>);

/// For each requested lane, up to its limit of units from its cursor (see
/// [`DriverStore::claim`](crate::DriverStore::claim)).
///
/// One round trip whatever the number of lanes (and a second one only when joined units are
/// read): the fence, every lane's state and its heads (one index range scan per lane, LIMITed)
/// in one statement. A requested lane yields one row with its state and no unit when it has
/// none to give, and no row at all when it is unknown or another actor's. A one-lane unit with
/// its payload inline (the common case) is read whole from its lane row; a joined unit's other
/// lanes (`unit_id`) and shared payloads (`row_ref`) need the head or ol_rows, looked up by
/// subqueries that CASE and coalesce only run when the lane row lacks the value (a join, even
/// on a NULL key, costs a rescan per unit). Columns 1-8 are the unit (NULL when none), 9-13
/// the lane.
pub(crate) fn claim(
    db: &mut impl Db,
    token: &SlotToken,
    lanes: &[ClaimRange],
) -> Result<Vec<ClaimedLane>, StoreError> {
    let actor = token.actor().as_str();
    let (mut k_lane, mut k_from, mut k_lim) = (vec![], vec![], vec![]);
    for req in lanes {
        k_lane.push(req.lane.0);
        k_from.push(to_i64(req.from.0));
        k_lim.push(i64::from(req.limit));
    }
    let rows: Vec<(bool, ClaimRow)> = db.query(
        &CLAIM,
        args![actor, to_i64(token.fencing()), &k_lane, &k_from, &k_lim],
        |r| {
            let unit = r.opt_int(1)?;
            let lane = match r.opt_int(10)? {
                None => None,
                Some(id) => Some((id, key_of(r.text(11)?, r.text(12)?), r.flag(13)?)),
            };
            let row = ClaimRow {
                unit,
                seq: unit.map_or(Ok(0), |_| r.int(2))?,
                attempts: unit.map_or(Ok(0), |_| r.int(3))?,
                state: unit.map_or(Ok(0), |_| r.int(4))?,
                row_id: r.opt_text(5)?,
                len: r.opt_int(6)?,
                at: r.opt_int(7)?,
                lanes: r.opt_int(8)?.unwrap_or(1),
                ord: r.opt_int(9)?.unwrap_or(0),
                lane,
                row_ref: r.opt_int(14)?,
            };
            Ok((r.flag(0)?, row))
        },
    )?;
    // A stale token reads one row, not live; a live one reads only live rows.
    if rows.is_empty() || rows.iter().any(|r| !r.0) {
        return Err(slots::stale(token));
    }
    let mut info: HashMap<i64, (LaneKey, bool)> = HashMap::new();
    let mut heads: Vec<Vec<ClaimRow>> = lanes.iter().map(|_| Vec::new()).collect();
    // The shared payloads' row id, length and time, read once each.
    let mut shared: HashMap<i64, SharedRow> = HashMap::new();
    for (_, mut r) in rows {
        let Some((lane, key, paused)) = r.lane.take() else {
            if let (None, Some(id)) = (r.unit, r.row_ref) {
                shared.insert(id, (r.row_id, r.len, r.at));
            }
            continue;
        };
        info.entry(lane).or_insert((key, paused));
        if r.unit.is_none() {
            continue;
        }
        let ord = usize::try_from(r.ord).unwrap_or(0);
        if let Some(v) = ord.checked_sub(1).and_then(|k| heads.get_mut(k)) {
            v.push(r);
        }
    }
    for r in heads.iter_mut().flatten() {
        // A fan-out unit's own columns win; the rest is its shared payload's.
        if let Some((row_id, len, at)) = r.row_ref.and_then(|id| shared.get(&id)) {
            r.row_id = r.row_id.take().or_else(|| row_id.clone());
            r.len = r.len.or(*len);
            r.at = r.at.or(*at);
        }
    }
    // The statement does not order its rows: each lane's units are put in seq order here (a
    // lane holds one unit per seq).
    for v in &mut heads {
        v.sort_by_key(|r| r.seq);
    }
    let joined: Vec<i64> = heads
        .iter()
        .flatten()
        .filter(|h| h.lanes > 1)
        .filter_map(|h| h.unit)
        .collect();
    let mut slots_of: HashMap<i64, Vec<ClaimedSlot>> = HashMap::new();
    if !joined.is_empty() {
        for (unit, slot) in db.query(&CLAIM_JOINED, args![&joined], |r| {
            Ok((r.int(0)?, lanes::claimed_slot(r, 1)?))
        })? {
            slots_of.entry(unit).or_default().push(slot);
        }
    }
    let mut out = Vec::with_capacity(lanes.len());
    for (req, rows) in lanes.iter().zip(heads) {
        let Some((key, paused)) = info.get(&req.lane.0) else {
            out.push(lanes::claimed_nothing(req.lane, true));
            continue;
        };
        let exhausted = *paused || rows.len() < req.limit as usize;
        let units = rows
            .into_iter()
            .filter_map(|h| {
                let unit = h.unit?;
                let slots = if h.lanes > 1 {
                    slots_of.get(&unit).cloned().unwrap_or_default()
                } else {
                    vec![ClaimedSlot {
                        lane: req.lane,
                        key: key.clone(),
                        attempts: to_u32(h.attempts),
                        served: h.state != STATE_PENDING,
                    }]
                };
                Some(ClaimedUnit {
                    id: UnitId(to_u64(unit)),
                    seq: Seq(to_u64(h.seq)),
                    // A head written by hand without these reads as empty, as on SQLite: one
                    // odd row neither panics nor blocks the claim.
                    row_id: h.row_id.unwrap_or_default(),
                    bytes: to_u32(h.len.unwrap_or(0)),
                    enqueued_at: timestamp_of(h.at.unwrap_or(0)),
                    slots,
                    // Read when an attempt starts (`DriverStore::payloads`).
                    payload: None,
                })
            })
            .collect();
        out.push(ClaimedLane {
            lane: req.lane,
            units,
            exhausted,
        });
    }
    Ok(out)
}

/// The common ack batch, one-lane units only, in ONE statement, to run outside a transaction
/// (no BEGIN or COMMIT round trip; an ack is idempotent, so it is safe to retry on a new
/// connection if the connection is lost). A one-lane unit is finished by its ack: its row
/// (payload included) is deleted outright, or with a retention taken out of its lane and
/// stamped. The statement writes nothing unless the token is live (the slot row locked FOR
/// SHARE to its commit, as `fence` does) and no acked unit is joined, so the batch stays one
/// transaction: a pending joined unit always has rows for its other lanes, found by the small
/// partial index ol_units_unit (not even probed per unit while it is empty). A shared payload
/// goes with its last unit; the statement's snapshot still shows the units it deletes, so that
/// check skips them by id.
///
/// With `log`, the statement writes the entries of the units it finished (an ack sent again
/// finishes nothing, and logs nothing).
///
/// Returns whether the token was live, whether a unit is joined (then nothing was written:
/// run [`ack_joined`]) and the units it finished.
fn ack_one_lane(
    db: &mut impl Db,
    token: &SlotToken,
    pairs: &[(UnitId, StoreLaneId)],
    units: &Vec<i64>,
    lanes: &Vec<i64>,
    log: &[crate::types::DeliveryLogEntry],
    retention: bool,
) -> Result<(bool, bool, Vec<i64>), StoreError> {
    let read =
        |r: &dyn crate::db::Get| Ok((r.flag(0)?, r.flag(1)?, r.opt_ints(2)?.unwrap_or_default()));
    let (actor, fencing) = (token.actor().as_str(), to_i64(token.fencing()));
    if log.is_empty() {
        let sql = if retention {
            &ACK_ONE_LANE_RETAIN
        } else {
            &ACK_ONE_LANE_DELETE
        };
        return db.query_one(sql, args![actor, fencing, units, lanes], read);
    }
    let sql = if retention {
        &ACK_ONE_LANE_RETAIN_LOGGED
    } else {
        &ACK_ONE_LANE_DELETE_LOGGED
    };
    let c = crate::delivery_log::Columns::aligned(pairs, log);
    db.query_one(
        sql,
        args![
            actor,
            fencing,
            units,
            lanes,
            &c.row_ids,
            &c.attempts,
            &c.started,
            &c.took,
            &c.status,
            &c.class,
            &c.body
        ],
        read,
    )
}

/// Acks of one-lane units `$3` in lanes `$4` that were no longer pending (OL-14): each lands
/// on the dead letter an operator wrote for it while its attempt was in flight, if there is
/// one (see [`crate::set_aside::delivered_on_set_aside`]), in one statement; returns the pairs
/// it recorded (an ack sent again records nothing more).
static DELIVERED_ON_SET_ASIDE: Sql = Sql::new(concat!(
    "UPDATE ol_dead_letters d SET attempts = d.attempts + 1, last_status = NULL, last_error = $2, \
     first_attempt_at = coalesce(d.first_attempt_at, {now}), last_attempt_at = {now} \
     FROM unnest($3::bigint[], $4::bigint[]) AS a(unit, lane) \
     WHERE coalesce(d.last_error, '') <> $2 AND d.id = (SELECT max(x.id) FROM ol_dead_letters x \
       WHERE x.actor = $1 AND x.unit_id = a.unit AND x.lane_id = a.lane \
       AND x.reason IN ",
    crate::set_aside::operator_reasons!(),
    ") RETURNING a.unit, a.lane"
));

/// Acks a batch holding joined units, in the caller's fenced transaction. Returns the pairs
/// it served.
fn ack_joined(
    db: &mut impl Db,
    actor: &str,
    units: &Vec<i64>,
    lanes: &Vec<i64>,
    retention: bool,
) -> Result<Vec<(i64, i64)>, StoreError> {
    // Each statement writes a row once (Postgres does not let one statement update a row
    // twice): first the other lanes' rows, with a read of the heads acked on their own lane (a
    // one-lane unit's head is its only row)...
    let served = db.query(&ACK_JOINED_OTHER_LANES, args![units, lanes, actor], |r| {
        Ok((r.int(0)?, r.int(1)?, r.flag(2)?))
    })?;
    let mut per_unit: BTreeMap<i64, (i64, Option<i64>)> = BTreeMap::new();
    for &(unit, lane, head) in &served {
        let e = per_unit.entry(unit).or_insert((0, None));
        if head {
            e.1 = Some(lane);
        } else {
            e.0 += 1;
        }
    }
    let served: Vec<(i64, i64)> = served.into_iter().map(|(u, l, _)| (u, l)).collect();
    if per_unit.is_empty() {
        return Ok(served);
    }
    // ...then each head once: served on its own lane (if still pending there) and counted
    // down; the units with nothing pending left are finished.
    let (mut h_id, mut h_n, mut h_lane) = (vec![], vec![], vec![]);
    for (unit, (n, own)) in per_unit {
        h_id.push(unit);
        h_n.push(n);
        h_lane.push(own);
    }
    let done: Vec<(i64, Option<i64>)> = db
        .query(&ACK_JOINED_HEADS, args![&h_id, &h_n, &h_lane], |r| {
            Ok((r.int(0)?, r.int(1)?, r.opt_int(2)?))
        })?
        .into_iter()
        .filter(|(_, pending, _)| *pending <= 0)
        .map(|(id, _, row_ref)| (id, row_ref))
        .collect();
    if done.is_empty() {
        return Ok(served);
    }
    let ids: Vec<i64> = done.iter().map(|d| d.0).collect();
    if retention {
        db.execute(&ACK_JOINED_RETAIN, args![&ids])?;
    } else {
        let rows: Vec<Option<i64>> = done.iter().map(|d| d.1).collect();
        // One round trip: the row delete runs on the statement's snapshot, which still shows
        // the finished units, so it skips them by id.
        db.execute(&ACK_JOINED_DELETE, args![&ids, &rows])?;
    }
    Ok(served)
}

/// Marks these recipients served (see [`DriverStore::ack`](crate::DriverStore::ack)): the
/// common batch of one-lane units in one statement outside a transaction ([`ack_one_lane`]),
/// a batch holding joined units in a fenced transaction.
pub(crate) fn ack<B: Backend>(
    store: &B,
    token: &SlotToken,
    delivered: &[(UnitId, StoreLaneId)],
    log: &[crate::types::DeliveryLogEntry],
    retention: bool,
) -> Result<(), StoreError> {
    let mut pairs = delivered.to_vec();
    pairs.sort();
    pairs.dedup();
    let units: Vec<i64> = pairs.iter().map(|(u, _)| to_i64(u.0)).collect();
    let lanes: Vec<i64> = pairs.iter().map(|(_, l)| l.0).collect();
    let (live, joined, mut done) =
        store.read(|db| ack_one_lane(db, token, &pairs, &units, &lanes, log, retention))?;
    if !live {
        return Err(slots::stale(token));
    }
    if !joined && done.len() == units.len() {
        return Ok(());
    }
    let actor = token.actor().as_str();
    store.write(true, |db| {
        slots::fence(db, token)?;
        // The pairs taken here: a joined batch's served (the statement above wrote nothing)...
        let mut taken: Vec<(i64, i64)> = if joined {
            ack_joined(db, actor, &units, &lanes, retention)?
        } else {
            Vec::new()
        };
        // ...and the rest, not pending: set aside by an operator while their attempt was in
        // flight (OL-14), or acked before (an ack sent again, which takes nothing more).
        done.sort_unstable();
        taken.sort_unstable();
        let (mut r_units, mut r_lanes) = (Vec::new(), Vec::new());
        for (&u, &l) in units.iter().zip(&lanes) {
            if done.binary_search(&u).is_err() && taken.binary_search(&(u, l)).is_err() {
                r_units.push(u);
                r_lanes.push(l);
            }
        }
        if !r_units.is_empty() {
            let a = args![actor, DELIVERED_AFTER_SET_ASIDE, &r_units, &r_lanes];
            taken.extend(db.query(&DELIVERED_ON_SET_ASIDE, a, |r| Ok((r.int(0)?, r.int(1)?)))?);
        }
        let taken = taken
            .into_iter()
            .map(|(u, l)| (UnitId(to_u64(u)), StoreLaneId(l)))
            .collect();
        delivery_log::write(db, actor, &delivery_log::taken_once(log, taken))
    })
}
