//! The Postgres hot path, written once for both Postgres drivers ([`PgStore`](crate::PgStore)
//! on the blocking `postgres` client, `SqlxPgStore` on a caller's sqlx pool) over the
//! statement layer ([`Db`], Postgres dialect): enqueue, claim, payloads, acks, attempt
//! records, the lanes with work, and the take-over of dead slot holders. Its statements are
//! tuned for Postgres alone (arrays, `unnest`, data-modifying CTEs, one round trip each) and
//! run on connections with the planner settings of [`pg_schema::settings`](crate::pg_schema::settings).
//!
//! [`DriverStore`] is implemented here once for every [`PgBackend`]; each backend brings its
//! connections, its liveness sessions and its LISTEN watcher.

use std::collections::{BTreeMap, HashMap, HashSet};

use outbox_lanes_core::{ActorId, LaneKey, Seq, Timestamp, UnitId};

use crate::backend::Backend;
use crate::db::{Db, Sql, args};
use crate::driver::HotPath;
use crate::notify::Notifier;
use crate::prepare::{PreparedRow, prepare};
use crate::types::*;
use crate::util::{
    decode_headers, encode_headers, key_of, millis_of, timestamp_of, to_i64, to_u32, to_u64,
    window_millis,
};
use crate::{EnqueueError, StoreError};
use crate::{dead_letters, row_ids, slots, units};

const STATE_PENDING: i64 = 0;

/// The drain-slot check as an SQL condition on `$1` (actor) and `$2` (fencing token), for
/// statements that fence themselves instead of spending a round trip on
/// [`slots::fence`].
macro_rules! live_slot {
    () => {
        "SELECT 1 FROM ol_slots WHERE actor = $1 AND token = $2 AND holder IS NOT NULL \
         AND lease_expires > {now}"
    };
}

/// The id of unit `$1`'s row in lane `$2` (its head, or another lane's row of a joined unit)
/// as an array for `id = ANY(…)`: two index probes, where an `OR` of the two would scan.
macro_rules! row_of_unit_in_lane {
    () => {
        "ARRAY(SELECT x.id FROM ol_units x WHERE x.id = $1 AND x.unit_id IS NULL \
         AND x.lane_id = $2 UNION ALL SELECT x.id FROM ol_units x WHERE x.unit_id = $1 AND x.lane_id = $2)"
    };
}

/// In a claim, the head of lane row `d`: `d` itself, or the unit's head for another lane's row.
macro_rules! head_of_d {
    () => {
        "FROM ol_units h WHERE h.id = coalesce(d.unit_id, d.id)"
    };
}

/// The one-statement ack of one-lane units (see [`ack`]); `$finish` deletes or retains them.
macro_rules! ack_one_lane {
    ($finish:literal) => {
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
               AND NOT EXISTS (SELECT 1 FROM ol_dead_letters x WHERE x.row_ref = r.id OFFSET 0)) \
             SELECT EXISTS (SELECT 1 FROM f), (SELECT joined FROM j), (SELECT count(*) FROM s)"
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

/// [`enqueue_one_lane_rows`]'s statement (see there).
static ENQUEUE_ONE_LANE_ROWS: Sql = Sql::new(
    "WITH a AS (INSERT INTO ol_actors AS a (actor, last_seq) SELECT $1::text, $2::bigint \
               ON CONFLICT (actor) DO UPDATE SET last_seq = a.last_seq + excluded.last_seq \
               RETURNING a.last_seq - $2::bigint AS base), \
             v AS (SELECT * FROM unnest($8::text[], $9::text[], $10::bigint[]) \
               WITH ORDINALITY AS v(recipient, ok, last_ix, lane)), \
             l AS (INSERT INTO ol_lanes AS l (actor, recipient, ordering_key, tail_seq) \
               SELECT $1, v.recipient, v.ok, a.base + v.last_ix FROM a, v ORDER BY v.lane \
               ON CONFLICT (actor, recipient, ordering_key) DO UPDATE \
               SET tail_seq = GREATEST(l.tail_seq, excluded.tail_seq) \
               RETURNING l.id, l.recipient, l.ordering_key), \
             k AS (SELECT array_agg(l.id ORDER BY v.lane) AS ids FROM v JOIN l \
               ON l.recipient = v.recipient AND l.ordering_key = v.ok), \
             u AS (INSERT INTO ol_units (actor, lane_id, seq, row_id, content_type, body, body_len, \
                 ordering_key, enqueued_at, headers) \
               SELECT $1, k.ids[r.lane], a.base + r.ix, r.row_id, r.ct, r.body, r.len, $9[r.lane], $11, r.hd \
               FROM a, k, unnest($3::text[], $4::bigint[], $5::text[], $6::bytea[], $7::bigint[], $13::text[]) \
                 WITH ORDINALITY AS r(row_id, lane, ct, body, len, hd, ix) RETURNING id, seq) \
             SELECT NULL::text[], (SELECT base FROM a), \
               (SELECT array_agg(id ORDER BY seq) FROM u), (SELECT pg_notify($12, $1) FROM a)",
);

/// A row id of the batch (`$2`) already on a shared payload of actor `$1`.
static SHARED_ROW_ID_TAKEN: Sql =
    Sql::new("SELECT row_id FROM ol_rows WHERE actor = $1 AND row_id = ANY($2) LIMIT 1");

/// What the general enqueue must know before it writes (see [`enqueue_tx`]).
static ENQUEUE_PLAN: Sql = Sql::new(
    "SELECT dup.v, ln.ids, ln.recs, ln.oks, pend.dks, pend.recs, idr.v, idu.v FROM \
         (SELECT array_agg(k.row_id) AS v FROM unnest($2::text[]) AS k(row_id) CROSS JOIN LATERAL ( \
            SELECT 1 FROM ol_units u WHERE u.actor = $1 AND u.row_id = k.row_id \
            UNION ALL SELECT 1 FROM ol_rows r WHERE r.actor = $1 AND r.row_id = k.row_id LIMIT 1) x) dup, \
         (SELECT array_agg(l.id) AS ids, array_agg(k.recipient) AS recs, array_agg(k.ordering_key) AS oks \
            FROM unnest($3::text[], $4::text[]) AS k(recipient, ordering_key) CROSS JOIN LATERAL ( \
            SELECT l.id FROM ol_lanes l WHERE l.actor = $1 AND l.recipient = k.recipient \
            AND l.ordering_key = k.ordering_key LIMIT 1) l) ln, \
         (SELECT array_agg(x.dedup_key) AS dks, array_agg(x.recipient) AS recs FROM \
            (SELECT DISTINCT k.dk AS dedup_key, l.recipient FROM unnest($5::text[]) AS k(dk) \
             CROSS JOIN LATERAL ( \
               SELECT h.id FROM ol_units h WHERE h.actor = $1 AND h.dedup_key = k.dk AND h.unit_id IS NULL \
               UNION ALL \
               SELECT h.id FROM ol_rows r CROSS JOIN LATERAL (SELECT h.id FROM ol_units h \
                 WHERE h.row_ref = r.id AND h.unit_id IS NULL OFFSET 0) h \
                 WHERE r.actor = $1 AND r.dedup_key = k.dk OFFSET 0) p \
             CROSS JOIN LATERAL ( \
               SELECT d.lane_id FROM ol_units d WHERE d.id = p.id AND d.state = 0 \
               UNION ALL \
               SELECT d.lane_id FROM ol_units d WHERE d.unit_id = p.id AND d.state = 0 OFFSET 0) d \
             CROSS JOIN LATERAL (SELECT l.recipient FROM ol_lanes l WHERE l.id = d.lane_id LIMIT 1) l) x) pend, \
         (SELECT array_agg(nextval('ol_rows_id_seq')) AS v FROM generate_series(1::bigint, $6::bigint)) idr, \
         (SELECT array_agg(nextval('ol_units_id_seq')) AS v FROM generate_series(1::bigint, $7::bigint)) idu",
);

/// Creates lanes used for the first time.
static NEW_LANES: Sql = Sql::new(
    "INSERT INTO ol_lanes (actor, recipient, ordering_key) SELECT $1, * FROM unnest($2::text[], $3::text[]) \
     ON CONFLICT (actor, recipient, ordering_key) DO NOTHING RETURNING id, recipient, ordering_key",
);

/// Wakes the relays listening on channel `$1` for actor `$2` (delivered on commit only).
static NOTIFY: Sql = Sql::new("SELECT pg_notify($1, $2)");

/// The general enqueue's one write (see [`enqueue_tx`]).
static ENQUEUE_WRITE: Sql = Sql::new(
    "WITH h AS (INSERT INTO ol_units (id, actor, lane_id, seq, lanes, pending, row_id, content_type, body, \
             body_len, dedup_key, ordering_key, enqueued_at, headers) \
           SELECT id, $1, lane, seq, n, n, row_id, ct, body, len, dk, ok, $2, hd FROM unnest($3::bigint[], $4::bigint[], \
             $5::bigint[], $6::bigint[], $7::text[], $8::text[], $9::bytea[], $10::bigint[], $11::text[], $12::text[], \
             $29::text[]) AS t(id, lane, seq, n, row_id, ct, body, len, dk, ok, hd)), \
         r AS (INSERT INTO ol_rows (id, actor, row_id, seq, content_type, body, body_len, dedup_key, ordering_key, \
             enqueued_at, headers) \
           SELECT id, $1, row_id, seq, ct, body, len, dk, ok, $2, hd FROM unnest($13::bigint[], $14::text[], \
             $15::bigint[], $16::text[], $17::bytea[], $18::bigint[], $19::text[], $20::text[], $30::text[]) \
             AS t(id, row_id, seq, ct, body, len, dk, ok, hd)), \
         o AS (INSERT INTO ol_units (id, unit_id, actor, lane_id, seq, row_ref) \
           SELECT id, uid, $1, lane, seq, rr FROM unnest($21::bigint[], $22::bigint[], $23::bigint[], \
             $24::bigint[], $25::bigint[]) AS t(id, uid, lane, seq, rr)), \
         l AS (UPDATE ol_lanes l SET tail_seq = GREATEST(l.tail_seq, v.seq) \
           FROM unnest($26::bigint[], $27::bigint[]) AS v(lane, seq) WHERE l.id = v.lane) \
         SELECT pg_notify($28, $1)",
);

/// See [`lanes_with_work`].
static LANES_WITH_WORK: Sql = Sql::new(concat!(
    "SELECT f.live, l.id, l.recipient, l.ordering_key, l.not_before, l.backoff_level, l.strict, \
                     l.paused, l.tail_seq FROM (SELECT EXISTS (",
    live_slot!(),
    ") AS live) f \
                     LEFT JOIN LATERAL (SELECT * FROM ol_lanes l WHERE f.live AND l.actor = $1 AND l.tail_seq > $3 \
                     AND EXISTS (SELECT 1 FROM ol_units d WHERE d.lane_id = l.id \
                     ORDER BY d.lane_id DESC, d.seq DESC, d.id DESC LIMIT 1 OFFSET 0)) l ON TRUE ORDER BY l.id"
));

/// See [`claim`].
static CLAIM: Sql = Sql::new(concat!(
    "SELECT f.live, d.unit, d.seq, d.attempts, d.state, d.row_id, d.len, d.at, d.lanes, \
                       l.ord, l.id, l.recipient, l.ordering_key, l.paused \
                     FROM (SELECT EXISTS (",
    live_slot!(),
    ") AS live) f \
                     LEFT JOIN LATERAL (SELECT k.ord, k.from_seq, k.lim, l.id, l.recipient, l.ordering_key, l.paused \
                       FROM unnest($3::bigint[], $4::bigint[], $5::bigint[]) WITH ORDINALITY AS k(lane, from_seq, lim, ord) \
                       CROSS JOIN LATERAL (SELECT l.id, l.recipient, l.ordering_key, l.paused FROM ol_lanes l \
                         WHERE l.id = k.lane AND l.actor = $1 LIMIT 1) l \
                       WHERE f.live) l ON TRUE \
                     LEFT JOIN LATERAL (SELECT coalesce(d.unit_id, d.id) AS unit, d.seq, d.id, d.attempts, d.state, \
                         CASE WHEN d.row_id IS NOT NULL THEN d.row_id ELSE (SELECT coalesce(h.row_id, \
                           (SELECT r.row_id FROM ol_rows r WHERE r.id = h.row_ref)) ",
    head_of_d!(),
    ") END AS row_id, \
                         CASE WHEN d.body_len IS NOT NULL THEN d.body_len ELSE (SELECT coalesce(h.body_len, \
                           (SELECT r.body_len FROM ol_rows r WHERE r.id = h.row_ref)) ",
    head_of_d!(),
    ") END AS len, \
                         CASE WHEN d.enqueued_at IS NOT NULL THEN d.enqueued_at ELSE (SELECT coalesce(h.enqueued_at, \
                           (SELECT r.enqueued_at FROM ol_rows r WHERE r.id = h.row_ref)) ",
    head_of_d!(),
    ") END AS at, \
                         CASE WHEN d.unit_id IS NULL THEN d.lanes \
                           ELSE (SELECT h.lanes FROM ol_units h WHERE h.id = d.unit_id) END AS lanes \
                       FROM ol_units d WHERE NOT l.paused AND d.lane_id = l.id AND d.seq >= l.from_seq \
                       ORDER BY d.lane_id, d.seq, d.id LIMIT l.lim) d ON TRUE \
                     ORDER BY l.ord, d.seq, d.id"
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

/// A pending unit's payload, inline or shared.
static PAYLOAD: Sql = Sql::new(
    "SELECT coalesce(h.row_id, r.row_id), coalesce(h.content_type, r.content_type), \
                     coalesce(h.body, r.body), CASE WHEN h.row_ref IS NULL THEN h.headers ELSE r.headers END \
                     FROM ol_units h \
                     LEFT JOIN LATERAL (SELECT r.row_id, r.content_type, r.body, r.headers FROM ol_rows r \
                       WHERE r.id = h.row_ref LIMIT 1) r ON TRUE \
                     WHERE h.id = $1 AND h.unit_id IS NULL AND h.acked_at IS NULL",
);

/// The joined units' other lanes served, and the heads acked on their own lane.
static ACK_JOINED_OTHER_LANES: Sql = Sql::new(
    "WITH a AS (SELECT * FROM unnest($1::bigint[], $2::bigint[]) AS a(unit, lane)), \
                 o AS (UPDATE ol_units d SET state = 1 FROM a \
                   WHERE d.unit_id = a.unit AND d.lane_id = a.lane AND d.state = 0 AND d.actor = $3 \
                   RETURNING d.unit_id) \
                 SELECT unit_id, NULL::bigint FROM o \
                 UNION ALL SELECT h.id, h.lane_id FROM a JOIN ol_units h ON h.id = a.unit AND h.lane_id = a.lane \
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

/// One attempt record on unit `$1`'s row in lane `$2`.
static RECORD_ATTEMPT: Sql = Sql::new(concat!(
    "UPDATE ol_units SET attempts = $3, last_status = $4, last_error = $5, \
                         first_attempt_at = coalesce(first_attempt_at, $6), last_attempt_at = $6 \
                         WHERE id = ANY(",
    row_of_unit_in_lane!(),
    ") AND lane_id = $2 AND state = 0 AND actor = $7"
));

/// Registered holders other than `$1` holding a live slot (of any actor: the monitor's
/// `acquire_ready`, once per poll).
static DEAD_HOLDER_CANDIDATES: Sql = Sql::new(
    "SELECT h.holder FROM ol_live_holders h WHERE h.holder <> $1 AND EXISTS \
                     (SELECT 1 FROM ol_slots s WHERE s.holder = h.holder AND s.lease_expires > {now})",
);
/// The registered holder, other than `$1`, of actor `$2`'s live slot: one primary-key
/// lookup per acquisition (an `$2 IS NULL OR` form would scan every slot, per pass).
static DEAD_HOLDER_CANDIDATE_OF: Sql = Sql::new(
    "SELECT h.holder FROM ol_slots s JOIN ol_live_holders h ON h.holder = s.holder \
                     WHERE s.actor = $2 AND s.holder <> $1 AND s.lease_expires > {now}",
);

/// A unique violation on a row id index (`ol_units_row_id` or `ol_rows`' `UNIQUE (actor,
/// row_id)`), mapped to the batch row it names: how the one-statement enqueue refuses a row id
/// already inline on a unit, and a safety net for the general path (whose plan checks both
/// places first, under the actor lock) against a writer that skipped the lock.
fn duplicate_of(e: &StoreError, rows: &[PreparedRow<'_>]) -> Option<EnqueueError> {
    let (constraint, detail) = unique_violation(e)?;
    if !matches!(
        constraint.as_str(),
        "ol_units_row_id" | "ol_rows_actor_row_id_key"
    ) {
        return None;
    }
    // "Key (actor, row_id)=(alice, r1) already exists."
    let detail = detail.as_str();
    let row = rows
        .iter()
        .map(|p| p.row.id.as_str())
        .filter(|id| detail.contains(&format!(", {id})=")) || detail.contains(&format!(", {id}) ")))
        .max_by_key(|id| id.len())
        .or_else(|| rows.first().map(|p| p.row.id.as_str()))?;
    Some(EnqueueError::DuplicateRowId {
        row: row.to_string(),
    })
}

/// Whether [`enqueue_one_lane_rows`] can write this batch.
fn one_lane_rows(rows: &[PreparedRow<'_>]) -> bool {
    rows.iter()
        .all(|p| p.lanes.len() == 1 && p.row.dedup_key.is_none())
}

/// The hot path of [`enqueue_tx`]: every row has one recipient and no dedup key, so each row
/// is one unit with its payload inline, and one statement does it all: the actor's seqs, the
/// duplicate check against shared payloads (ol_rows), the lanes (created or their tail
/// advanced, by one upsert each), the units, and the wake-up. A row id already inline on a
/// unit is refused by the unique index `ol_units_row_id`.
///
/// The statement's snapshot is taken before it waits for the actor's row lock, so it cannot
/// judge the row ids against the shared payloads (ol_rows): a second statement does, after
/// it. Lanes are upserted, so one created meanwhile is found all the same; seqs still follow
/// commit order (the lock is held to commit).
fn enqueue_one_lane_rows(
    t: &mut impl Db,
    actor: &ActorId,
    rows: &[PreparedRow<'_>],
    channel: &str,
) -> Result<Vec<Enqueued>, EnqueueError> {
    let a = actor.as_str();
    let now = millis_of(Timestamp::from_system_time(std::time::SystemTime::now()));
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let n = count(rows.len());
    // The batch's lanes in key order (the upsert locks them in that order), each with the
    // 1-based index of its last row: the lane's new tail is the actor's base seq + that.
    let mut lanes: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for (k, p) in rows.iter().enumerate() {
        let key = p
            .lanes
            .first()
            .ok_or_else(|| StoreError::Database("row without a lane".into()))?;
        lanes.insert(
            (key.recipient(), key.ordering_key().unwrap_or("")),
            count(k + 1),
        );
    }
    let (mut l_rec, mut l_ok, mut l_last) = (vec![], vec![], vec![]);
    let mut ordinal: HashMap<(&str, &str), i64> = HashMap::with_capacity(lanes.len());
    for (k, (key, last)) in lanes.into_iter().enumerate() {
        l_rec.push(key.0);
        l_ok.push(key.1);
        l_last.push(last);
        ordinal.insert(key, count(k + 1));
    }
    let (mut r_id, mut r_lane, mut r_ct, mut r_body, mut r_len, mut r_hd) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for p in rows {
        let key = p
            .lanes
            .first()
            .ok_or_else(|| StoreError::Database("row without a lane".into()))?;
        r_id.push(p.row.id.as_str());
        r_lane.push(
            ordinal
                .get(&(key.recipient(), key.ordering_key().unwrap_or("")))
                .copied()
                .ok_or_else(|| StoreError::Database("lane missing from the batch".into()))?,
        );
        r_ct.push(p.row.content_type.as_str());
        r_body.push(p.row.body.as_slice());
        r_len.push(count(p.row.body.len()));
        r_hd.push(encode_headers(&p.row.headers));
    }
    let r_hd: Vec<Option<&str>> = r_hd.iter().map(Option::as_deref).collect();
    // Each data-modifying part depends on `a`, which writes nothing when a duplicate was
    // found: a refused batch writes nothing. The probes of ol_rows are skipped altogether
    // when the actor has no shared payload (the common case: one probe instead of one per
    // row). The rows are unnested where they are inserted (a CTE read twice would copy every
    // payload into a temporary store). Rows name their lane by its 1-based position in
    // the lane arrays; `k` lists the upserted lanes' ids in that order. The NOTIFY is
    // delivered on commit only.
    let (base, units) = t
        .query_one(
            &ENQUEUE_ONE_LANE_ROWS,
            args![
                a, n, &r_id, &r_lane, &r_ct, &r_body, &r_len, &l_rec, &l_ok, &l_last, now, channel,
                &r_hd,
            ],
            |r| Ok((r.opt_int(1)?, r.opt_ints(2)?)),
        )
        .map_err(|e| duplicate_of(&e, rows).unwrap_or_else(|| EnqueueError::from(e)))?;
    // The row ids against the shared payloads, in a statement of its own: its snapshot is
    // taken now that the actor's lock is held, so it sees every shared payload committed
    // before, including while the statement above waited for the lock (a concurrent fan-out
    // enqueue, a plain-SQL writer, a dead letter moving an inline payload to ol_rows: that one
    // also made the insert above wait for it through the unique index). No writer adds a
    // shared payload for this actor from now to the commit: they all take the actor's lock,
    // or (the dead letter) hold the inline row this batch would have collided with.
    // The caller's transaction (or savepoint) is rolled back on the error.
    if let Some(taken) = t.query_opt(&SHARED_ROW_ID_TAKEN, args![a, &r_id], |r| r.text(0))? {
        return Err(EnqueueError::DuplicateRowId { row: taken });
    }
    let base = base.ok_or_else(|| StoreError::Database("no seq reserved".into()))?;
    let units = units.unwrap_or_default();
    if units.len() != rows.len() {
        return Err(StoreError::Database(format!(
            "{} units written for {} rows",
            units.len(),
            rows.len()
        ))
        .into());
    }
    Ok(rows
        .iter()
        .zip(units)
        .enumerate()
        .map(|(k, (p, unit))| Enqueued {
            row_id: p.row.id.clone(),
            seq: Seq(to_u64(base + count(k + 1))),
            units: vec![UnitId(to_u64(unit))],
            skipped: Vec::new(),
        })
        .collect())
}

/// Set-based: a fixed number of statements per batch whatever its size, because every
/// statement costs a round trip to the server.
pub(crate) fn enqueue_tx(
    t: &mut impl Db,
    actor: &ActorId,
    rows: &[PreparedRow<'_>],
    channel: &str,
    common: &CommonOptions,
) -> Result<Vec<Enqueued>, EnqueueError> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    // The dedup window past delivery, first: one statement for the batch (`row_ids.rs`).
    let now = millis_of(Timestamp::from_system_time(std::time::SystemTime::now()));
    let ids: Vec<&str> = rows.iter().map(|p| p.row.id.as_str()).collect();
    row_ids::take(t, actor.as_str(), &ids, now, window_millis(common))?;
    if one_lane_rows(rows) {
        return enqueue_one_lane_rows(t, actor, rows, channel);
    }
    // The general case: several recipients, joined units, dedup keys.
    let a = actor.as_str();
    let now = millis_of(Timestamp::from_system_time(std::time::SystemTime::now()));
    let n = i64::try_from(rows.len()).unwrap_or(i64::MAX);
    // First: the actor row lock serialises this actor's enqueues (seq order = commit order),
    // and the plan below reads after it, so it sees every enqueue committed before.
    let first = units::alloc_seqs(t, a, n)?;

    // Everything the plan needs, in one round trip: row ids already taken (inline on a unit
    // or in ol_rows), the batch's known lanes, what is pending for its dedup keys, and enough
    // unit and shared-row ids (upper bounds: skipped recipients only leave gaps).
    let ids: Vec<&str> = rows.iter().map(|p| p.row.id.as_str()).collect();
    let mut recs: Vec<&str> = Vec::new();
    let mut oks: Vec<&str> = Vec::new();
    {
        let mut seen: HashSet<(&str, &str)> = HashSet::new();
        for p in rows {
            for k in &p.lanes {
                let pair = (k.recipient(), k.ordering_key().unwrap_or(""));
                if seen.insert(pair) {
                    recs.push(pair.0);
                    oks.push(pair.1);
                }
            }
        }
    }
    let dks: Vec<&str> = rows
        .iter()
        .filter_map(|p| p.row.dedup_key.as_deref())
        .collect();
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    // One ol_units row per (row, lane) at most; an ol_rows row per row split into several units.
    let max_units: i64 = rows.iter().map(|p| count(p.lanes.len())).sum();
    let max_shared: i64 = count(
        rows.iter()
            .filter(|p| !p.row.joined && p.lanes.len() > 1)
            .count(),
    );
    // Pending units for the dedup keys: inline heads by ol_units_dedup, shared rows by
    // ol_rows_dedup then ol_units_row; then each unit's rows still pending (the head's own
    // lane, or a joined unit's other lanes by ol_units_unit).
    // Every lookup driven by the batch is a LATERAL probe (LIMIT or OFFSET 0 keeps the planner
    // from flattening it into a join it could hash): `enqueue_in` runs on the caller's
    // connection, without the store's planner settings, and a hash join planned on stale
    // statistics would read every row id of the actor.
    // The serial sequences are named literally (`<table>_id_seq`, as BIGSERIAL names them):
    // `pg_get_serial_sequence` would be re-evaluated for every id drawn (a catalog search each).
    let plan = t.query_one(
        &ENQUEUE_PLAN,
        args![a, &ids, &recs, &oks, &dks, max_shared, max_units],
        |r| {
            Ok(Plan {
                taken: r.opt_texts(0)?,
                lane_ids: r.opt_ints(1)?,
                lane_recs: r.opt_texts(2)?,
                lane_oks: r.opt_texts(3)?,
                pending_dks: r.opt_texts(4)?,
                pending_recs: r.opt_texts(5)?,
                shared_keys: r.opt_ints(6)?,
                unit_keys: r.opt_ints(7)?,
            })
        },
    )?;
    let taken: HashSet<String> = plan.taken.unwrap_or_default().into_iter().collect();
    if let Some(p) = rows.iter().find(|p| taken.contains(&p.row.id)) {
        return Err(EnqueueError::DuplicateRowId {
            row: p.row.id.clone(),
        });
    }
    let mut lane_ids: HashMap<(String, String), i64> = HashMap::new();
    if let (Some(i), Some(r), Some(o)) = (plan.lane_ids, plan.lane_recs, plan.lane_oks) {
        for ((id, rec), ok) in i.into_iter().zip(r).zip(o) {
            lane_ids.insert((rec, ok), id);
        }
    }
    let mut pending: HashSet<(String, String)> = HashSet::new();
    if let (Some(d), Some(r)) = (plan.pending_dks, plan.pending_recs) {
        pending.extend(d.into_iter().zip(r));
    }
    let shared_keys = plan.shared_keys.unwrap_or_default();
    let unit_keys = plan.unit_keys.unwrap_or_default();

    // Lanes used for the first time.
    if lane_ids.len() < recs.len() {
        let (mr, mo): (Vec<&str>, Vec<&str>) = recs
            .iter()
            .zip(&oks)
            .filter(|(r, o)| !lane_ids.contains_key(&((**r).to_string(), (**o).to_string())))
            .map(|(r, o)| (*r, *o))
            .unzip();
        for (id, rec, ok) in t.query(&NEW_LANES, args![a, &mr, &mo], |r| {
            Ok((r.int(0)?, r.text(1)?, r.text(2)?))
        })? {
            lane_ids.insert((rec, ok), id);
        }
    }

    // The rows to write, as columns (one array per column, unnested by the insert):
    // heads with the payload inline, shared payloads, and rows without a payload (a joined
    // unit's other lanes, the heads of a shared payload's units).
    #[derive(Default)]
    struct Inline<'r> {
        id: Vec<i64>,
        lane: Vec<i64>,
        seq: Vec<i64>,
        n: Vec<i64>,
        row: Vec<&'r str>,
        ct: Vec<&'r str>,
        body: Vec<&'r [u8]>,
        len: Vec<i64>,
        dk: Vec<Option<&'r str>>,
        ok: Vec<&'r str>,
        hd: Vec<Option<String>>,
    }
    #[derive(Default)]
    struct Shared<'r> {
        id: Vec<i64>,
        row: Vec<&'r str>,
        seq: Vec<i64>,
        ct: Vec<&'r str>,
        body: Vec<&'r [u8]>,
        len: Vec<i64>,
        dk: Vec<Option<&'r str>>,
        ok: Vec<&'r str>,
        hd: Vec<Option<String>>,
    }
    #[derive(Default)]
    struct Bare {
        id: Vec<i64>,
        unit: Vec<Option<i64>>,
        lane: Vec<i64>,
        seq: Vec<i64>,
        row_ref: Vec<Option<i64>>,
    }
    let (mut inl, mut sh, mut bare) = (Inline::default(), Shared::default(), Bare::default());
    // Highest seq written per lane, in lane order (the tail update locks lanes in that order).
    let mut tails: BTreeMap<i64, i64> = BTreeMap::new();
    let (mut sk, mut uk) = (shared_keys.into_iter(), unit_keys.into_iter());
    let mut next_unit = || {
        uk.next()
            .ok_or_else(|| StoreError::Database("unit id allocation short".into()))
    };
    let mut out = Vec::with_capacity(rows.len());
    for (k, p) in rows.iter().enumerate() {
        let seq = first + count(k);
        let mut kept = Vec::with_capacity(p.lanes.len());
        let mut skipped = Vec::new();
        for key in &p.lanes {
            if let Some(dk) = &p.row.dedup_key {
                if !pending.insert((dk.clone(), key.recipient().to_string())) {
                    skipped.push(key.recipient().to_string());
                    continue;
                }
            }
            let id = lane_ids
                .get(&(
                    key.recipient().to_string(),
                    key.ordering_key().unwrap_or("").to_string(),
                ))
                .copied()
                .ok_or_else(|| StoreError::Database("lane vanished during enqueue".into()))?;
            kept.push(id);
            let tail = tails.entry(id).or_insert(seq);
            *tail = (*tail).max(seq);
        }
        let len = count(p.row.body.len());
        let mut units = Vec::new();
        if let [first_lane, others @ ..] = kept.as_slice() {
            if p.row.joined || others.is_empty() {
                // One unit: its head holds the payload; a joined unit's other lanes are rows
                // pointing at the head.
                let head = next_unit()?;
                inl.id.push(head);
                inl.lane.push(*first_lane);
                inl.seq.push(seq);
                inl.n.push(count(kept.len()));
                inl.row.push(p.row.id.as_str());
                inl.ct.push(p.row.content_type.as_str());
                inl.body.push(p.row.body.as_slice());
                inl.len.push(len);
                inl.dk.push(p.row.dedup_key.as_deref());
                inl.ok.push(p.ordering_key);
                inl.hd.push(encode_headers(&p.row.headers));
                for lane in others {
                    bare.id.push(next_unit()?);
                    bare.unit.push(Some(head));
                    bare.lane.push(*lane);
                    bare.seq.push(seq);
                    bare.row_ref.push(None);
                }
                units.push(UnitId(to_u64(head)));
            } else {
                // Several units: the payload once in ol_rows, one head per lane referring to it.
                let row_ref = sk
                    .next()
                    .ok_or_else(|| StoreError::Database("row id allocation short".into()))?;
                sh.id.push(row_ref);
                sh.row.push(p.row.id.as_str());
                sh.seq.push(seq);
                sh.ct.push(p.row.content_type.as_str());
                sh.body.push(p.row.body.as_slice());
                sh.len.push(len);
                sh.dk.push(p.row.dedup_key.as_deref());
                sh.ok.push(p.ordering_key);
                sh.hd.push(encode_headers(&p.row.headers));
                for lane in &kept {
                    let head = next_unit()?;
                    bare.id.push(head);
                    bare.unit.push(None);
                    bare.lane.push(*lane);
                    bare.seq.push(seq);
                    bare.row_ref.push(Some(row_ref));
                    units.push(UnitId(to_u64(head)));
                }
            }
        }
        out.push(Enqueued {
            row_id: p.row.id.clone(),
            seq: Seq(to_u64(seq)),
            units,
            skipped,
        });
    }
    if tails.is_empty() {
        // Every recipient was skipped by dedup: nothing to write but the wake-up (delivered
        // to listeners when, and only if, the transaction commits).
        t.execute(&NOTIFY, args![channel, a])?;
        return Ok(out);
    }
    let (t_lane, t_seq): (Vec<i64>, Vec<i64>) = tails.into_iter().unzip();
    // One statement, one round trip: the tables have no foreign keys, so the order of the
    // inserts within it does not matter. The NOTIFY is delivered on commit only. The tails'
    // update is driven by the batch (`l.id = v.lane` alone: a nested loop probing the lanes'
    // primary key per tail). An extra `l.id = ANY($26)` made the planner drive it by the lanes
    // instead and rescan the batch for each: quadratic in one enqueue's lanes (20,000
    // recipients in one row: 4.9 s, now 0.38 s; one-recipient enqueues among 100,000 lanes:
    // 3.3 ms, now 0.64 ms).
    let (inl_hd, sh_hd): (Vec<Option<&str>>, Vec<Option<&str>>) = (
        inl.hd.iter().map(Option::as_deref).collect(),
        sh.hd.iter().map(Option::as_deref).collect(),
    );
    t.execute(
        &ENQUEUE_WRITE,
        args![
            a,
            now,
            &inl.id,
            &inl.lane,
            &inl.seq,
            &inl.n,
            &inl.row,
            &inl.ct,
            &inl.body,
            &inl.len,
            &inl.dk,
            &inl.ok,
            &sh.id,
            &sh.row,
            &sh.seq,
            &sh.ct,
            &sh.body,
            &sh.len,
            &sh.dk,
            &sh.ok,
            &bare.id,
            &bare.unit,
            &bare.lane,
            &bare.seq,
            &bare.row_ref,
            &t_lane,
            &t_seq,
            channel,
            &inl_hd,
            &sh_hd,
        ],
    )
    .map_err(|e| duplicate_of(&e, rows).unwrap_or_else(|| EnqueueError::from(e)))?;
    Ok(out)
}

/// What [`ENQUEUE_PLAN`] reads, column by column.
struct Plan {
    taken: Option<Vec<String>>,
    lane_ids: Option<Vec<i64>>,
    lane_recs: Option<Vec<String>>,
    lane_oks: Option<Vec<String>>,
    pending_dks: Option<Vec<String>>,
    pending_recs: Option<Vec<String>>,
    shared_keys: Option<Vec<i64>>,
    unit_keys: Option<Vec<i64>>,
}

/// The constraint and the detail of a unique violation reported by either driver.
pub(crate) fn unique_violation(e: &StoreError) -> Option<(String, String)> {
    const UNIQUE_VIOLATION: &str = "23505";
    let StoreError::Driver { cause, .. } = e else {
        return None;
    };
    #[cfg(feature = "postgres")]
    if let Some(db) = cause
        .downcast_ref::<postgres::Error>()
        .and_then(postgres::Error::as_db_error)
    {
        return (db.code().code() == UNIQUE_VIOLATION).then(|| {
            (
                db.constraint().unwrap_or("").to_owned(),
                db.detail().unwrap_or("").to_owned(),
            )
        });
    }
    #[cfg(feature = "sqlx")]
    if let Some(db) = cause
        .downcast_ref::<::sqlx::Error>()
        .and_then(::sqlx::Error::as_database_error)
    {
        let detail = db
            .try_downcast_ref::<::sqlx::postgres::PgDatabaseError>()
            .and_then(|e| e.detail())
            .unwrap_or("");
        return (db.code().as_deref() == Some(UNIQUE_VIOLATION))
            .then(|| (db.constraint().unwrap_or("").to_owned(), detail.to_owned()));
    }
    None
}

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
                Some(id) => Some((
                    PendingLane {
                        lane: StoreLaneId(id),
                        key: key_of(r.text(2)?, r.text(3)?),
                        not_before: r.opt_int(4)?.map(timestamp_of),
                        backoff_level: to_u32(r.int(5)?),
                        strict: r.flag(6)?,
                        paused: r.flag(7)?,
                    },
                    r.int(8)?,
                )),
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
}

/// For each requested lane, up to its limit of units from its cursor (see
/// [`DriverStore::claim`]).
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
            };
            Ok((r.flag(0)?, row))
        },
    )?;
    if !rows.first().is_some_and(|r| r.0) {
        return Err(slots::stale(token));
    }
    let mut info: HashMap<i64, (LaneKey, bool)> = HashMap::new();
    let mut heads: Vec<Vec<ClaimRow>> = lanes.iter().map(|_| Vec::new()).collect();
    for (_, mut r) in rows {
        let Some((lane, key, paused)) = r.lane.take() else {
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
    let joined: Vec<i64> = heads
        .iter()
        .flatten()
        .filter(|h| h.lanes > 1)
        .filter_map(|h| h.unit)
        .collect();
    let mut slots_of: HashMap<i64, Vec<ClaimedSlot>> = HashMap::new();
    if !joined.is_empty() {
        for (unit, slot) in db.query(&CLAIM_JOINED, args![&joined], |r| {
            Ok((
                r.int(0)?,
                ClaimedSlot {
                    lane: StoreLaneId(r.int(1)?),
                    key: key_of(r.text(2)?, r.text(3)?),
                    attempts: to_u32(r.int(4)?),
                    served: r.int(5)? != STATE_PENDING,
                },
            ))
        })? {
            slots_of.entry(unit).or_default().push(slot);
        }
    }
    let mut out = Vec::with_capacity(lanes.len());
    for (req, rows) in lanes.iter().zip(heads) {
        let Some((key, paused)) = info.get(&req.lane.0) else {
            out.push(ClaimedLane {
                lane: req.lane,
                units: Vec::new(),
                exhausted: true,
            });
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

/// The payload of a pending unit, inline on its head or shared in `ol_rows`.
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
    match (row_id, content_type, body) {
        (Some(row_id), Some(content_type), Some(body)) => Ok(Payload {
            row_id,
            content_type,
            body,
            headers: decode_headers(headers),
        }),
        // A head referring to a payload row that is gone: the tables were edited.
        _ => Err(StoreError::Database(format!("unit {unit} has no payload"))),
    }
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
/// Returns whether the token was live, whether a unit is joined (then nothing was written:
/// run [`ack_joined`]) and how many units it finished.
fn ack_one_lane(
    db: &mut impl Db,
    token: &SlotToken,
    units: &Vec<i64>,
    lanes: &Vec<i64>,
    retention: bool,
) -> Result<(bool, bool, usize), StoreError> {
    let sql = if retention {
        &ACK_ONE_LANE_RETAIN
    } else {
        &ACK_ONE_LANE_DELETE
    };
    db.query_one(
        sql,
        args![
            token.actor().as_str(),
            to_i64(token.fencing()),
            units,
            lanes
        ],
        |r| {
            Ok((
                r.flag(0)?,
                r.flag(1)?,
                usize::try_from(r.int(2)?).unwrap_or(0),
            ))
        },
    )
}

/// Acks of one-lane units `$3` in lanes `$4` that were no longer pending (OL-14): each lands
/// on the dead letter an operator wrote for it while its attempt was in flight, if there is
/// one (see [`dead_letters::delivered_on_set_aside`]), in one statement.
static DELIVERED_ON_SET_ASIDE: Sql = Sql::new(
    "UPDATE ol_dead_letters d SET attempts = d.attempts + 1, last_status = NULL, last_error = $2, \
     first_attempt_at = coalesce(d.first_attempt_at, {now}), last_attempt_at = {now} \
     FROM unnest($3::bigint[], $4::bigint[]) AS a(unit, lane) \
     WHERE coalesce(d.last_error, '') <> $2 AND d.id = (SELECT max(x.id) FROM ol_dead_letters x \
       WHERE x.actor = $1 AND x.unit_id = a.unit AND x.lane_id = a.lane \
       AND x.reason IN ('purged', 'skipped'))",
);

/// Acks a batch holding joined units, in the caller's fenced transaction.
fn ack_joined(
    db: &mut impl Db,
    actor: &str,
    units: &Vec<i64>,
    lanes: &Vec<i64>,
    retention: bool,
) -> Result<(), StoreError> {
    // Each statement writes a row once (Postgres does not let one statement update a row
    // twice): first the other lanes' rows, with a read of the heads acked on their own lane (a
    // one-lane unit's head is its only row)...
    let mut per_unit: BTreeMap<i64, (i64, Option<i64>)> = BTreeMap::new();
    for (unit, own) in db.query(&ACK_JOINED_OTHER_LANES, args![units, lanes, actor], |r| {
        Ok((r.int(0)?, r.opt_int(1)?))
    })? {
        let e = per_unit.entry(unit).or_insert((0, None));
        match own {
            None => e.0 += 1,
            own => e.1 = own,
        }
    }
    if per_unit.is_empty() {
        return Ok(());
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
        return Ok(());
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
    Ok(())
}

/// Persists attempt records, in the caller's fenced transaction.
fn record_attempts(
    db: &mut impl Db,
    actor: &str,
    attempts: &[&AttemptRecord],
) -> Result<(), StoreError> {
    // An enqueue takes the actor's row first and then its lanes, in an order of its own
    // (recipient order); this writes several lanes too. Taking the actor's row first as well
    // (shared: attempt writers do not wait for each other) orders the two, instead of letting
    // them lock two lanes crosswise and deadlock.
    db.execute(&LOCK_ACTOR_SHARED, args![actor])?;
    for a in attempts {
        let status = a.status.map(i64::from);
        let n = db.execute(
            &RECORD_ATTEMPT,
            args![
                to_i64(a.unit.0),
                a.lane.0,
                i64::from(a.attempts),
                status,
                a.error.as_deref(),
                millis_of(a.at),
                actor
            ],
        )?;
        if n == 1 {
            db.execute(
                &LANE_LAST_ATTEMPT,
                args![a.lane.0, status, a.error.as_deref()],
            )?;
        } else {
            // Set aside by an operator while the attempt was in flight (OL-14).
            dead_letters::record_on_set_aside(db, actor, a)?;
        }
    }
    Ok(())
}

static LOCK_ACTOR_SHARED: Sql = Sql::new("SELECT 1 FROM ol_actors WHERE actor = $1 FOR SHARE");
static LANE_LAST_ATTEMPT: Sql =
    Sql::new("UPDATE ol_lanes SET last_status = $2, last_error = $3 WHERE id = $1");

/// Takes the session advisory lock of a holder if nobody holds it: `$1` is the holder's
/// [`live_key`]. The first key is `'ol'` (0x6f6c), the second a hash of the schema and the
/// holder name.
pub(crate) static TRY_LIVE_LOCK: Sql = Sql::new("SELECT pg_try_advisory_lock(28524, hashtext($1))");
static LIVE_UNLOCK: Sql = Sql::new("SELECT pg_advisory_unlock(28524, hashtext($1))");
/// Registers a holder that keeps a liveness lock.
pub(crate) static REGISTER_HOLDER: Sql =
    Sql::new("INSERT INTO ol_live_holders (holder) VALUES ($1) ON CONFLICT DO NOTHING");
static EXPIRE_HOLDER: Sql = Sql::new("UPDATE ol_slots SET lease_expires = 0 WHERE holder = $1");
static FORGET_HOLDER: Sql = Sql::new("DELETE FROM ol_live_holders WHERE holder = $1");

/// The advisory-lock name of `holder` in `schema`.
pub(crate) fn live_key(schema: &str, holder: &str) -> String {
    format!("{schema}/{holder}")
}

/// Ends the leases of every slot of the dead holders (registered in `ol_live_holders`, their
/// advisory lock free) among those holding `actor`'s slot, or any slot.
fn expire_dead_holders(
    db: &mut impl Db,
    schema: &str,
    us: &str,
    actor: Option<&ActorId>,
) -> Result<(), StoreError> {
    let candidates = match actor {
        Some(a) => db.query(&DEAD_HOLDER_CANDIDATE_OF, args![us, a.as_str()], |r| {
            r.text(0)
        })?,
        None => db.query(&DEAD_HOLDER_CANDIDATES, args![us], |r| r.text(0))?,
    };
    for dead in candidates {
        let key = live_key(schema, &dead);
        // Taken at once when nobody holds it: then the holder is gone; given back at once (a
        // session lock outlives the transaction).
        if !db.query_one(&TRY_LIVE_LOCK, args![&key], |r| r.flag(0))? {
            continue;
        }
        db.query_one(&LIVE_UNLOCK, args![&key], |r| r.flag(0))?;
        let n = db.execute(&EXPIRE_HOLDER, args![&dead])?;
        db.execute(&FORGET_HOLDER, args![&dead])?;
        tracing::info!(target: "outbox_lanes::store", holder = %dead, slots = n,
            "the holder of these drain slots is gone (its session ended): taken over without waiting for the lease");
    }
    Ok(())
}

/// Logs how a holder's liveness registration went: `Ok(true)` registered, `Ok(false)` the
/// lock is held by another live session, an error no liveness at all.
pub(crate) fn log_registration(holder: &str, outcome: &Result<bool, StoreError>) {
    match outcome {
        Ok(true) => {}
        Ok(false) => tracing::warn!(target: "outbox_lanes::store", holder,
            "another live session holds this holder's lock (a holder name used twice?); its slots wait for their lease"),
        Err(e) => tracing::debug!(target: "outbox_lanes::store", holder, error = %e,
            "no liveness lock; slots of this holder wait for their lease"),
    }
}

/// Tells the relays listening on `channel` that `actors` have work (delivered on commit).
pub(crate) fn notify_actors(
    db: &mut impl Db,
    channel: &str,
    actors: &[ActorId],
) -> Result<(), StoreError> {
    for a in actors {
        db.execute(&NOTIFY, args![channel, a.as_str()])?;
    }
    Ok(())
}

/// A Postgres backend: a [`Backend`] whose reads run outside a write transaction (each
/// statement committed on its own: the one-statement ack writes through it), with what the
/// two drivers do their own way.
pub(crate) trait PgBackend: Backend {
    /// The schema holding the tables.
    fn schema(&self) -> &str;
    /// The wake-up channel.
    fn channel(&self) -> &str;
    /// Keeps `holder`'s liveness lock for as long as the store lives (see
    /// [`PgStore`](crate::PgStore)'s `register_holder`); a failure only means no liveness.
    fn register_holder(&self, holder: &str);
    /// The in-process wake-up.
    fn wake_ups(&self) -> Notifier;
    /// Starts (once) the LISTEN watcher.
    fn listen(&self) -> Result<Notifier, StoreError>;

    /// Runs `f` in a write transaction and commits it, as [`Backend::write`] does, for an
    /// enqueue (not idempotent: retried only if the connection was lost before the commit).
    fn write_enqueue<T>(
        &self,
        f: impl FnMut(&mut Self::Writer<'_>) -> Result<T, EnqueueError>,
    ) -> Result<T, EnqueueError>;

    /// Enqueues a batch in one transaction and fires the wake-up (`Backend::enqueue_batch`).
    fn enqueue_pg(&self, actor: &ActorId, rows: &[NewRow]) -> Result<Vec<Enqueued>, EnqueueError> {
        let prepared = prepare(rows, self.common())?;
        if prepared.is_empty() {
            return Ok(Vec::new());
        }
        // In a transaction even when it is one statement: a statement that fails before the
        // COMMIT is sent certainly did not commit, so it is retried on a new connection.
        let out =
            self.write_enqueue(|t| enqueue_tx(t, actor, &prepared, self.channel(), self.common()))?;
        self.notify();
        Ok(out)
    }
}

// `PgBackend` is crate-private on purpose (sealed): only this crate's stores implement it.
#[allow(private_bounds)]
impl<B: PgBackend> HotPath for B {
    fn register_holder(&self, holder: &str) {
        PgBackend::register_holder(self, holder);
    }

    fn expire_dead_holders(
        &self,
        t: &mut Self::Writer<'_>,
        us: &str,
        actor: Option<&ActorId>,
    ) -> Result<(), StoreError> {
        expire_dead_holders(t, self.schema(), us, actor)
    }

    fn find_lanes_with_work(
        &self,
        token: &SlotToken,
        since: u64,
    ) -> Result<(Vec<PendingLane>, u64), StoreError> {
        self.read(|t| lanes_with_work(t, token, since))
    }

    fn claim_units(
        &self,
        token: &SlotToken,
        lanes: &[ClaimRange],
    ) -> Result<Vec<ClaimedLane>, StoreError> {
        self.read(|t| claim(t, token, lanes))
    }

    fn read_payload(&self, unit: UnitId) -> Result<Payload, StoreError> {
        self.read(|t| payload(t, unit))
    }

    fn ack_units(
        &self,
        token: &SlotToken,
        delivered: &[(UnitId, StoreLaneId)],
    ) -> Result<(), StoreError> {
        if delivered.is_empty() {
            return Ok(());
        }
        let retention = self.common().ack_retention.is_some();
        let mut pairs = delivered.to_vec();
        pairs.sort();
        pairs.dedup();
        let units: Vec<i64> = pairs.iter().map(|(u, _)| to_i64(u.0)).collect();
        let lanes: Vec<i64> = pairs.iter().map(|(_, l)| l.0).collect();
        let (live, joined, done) =
            self.read(|t| ack_one_lane(t, token, &units, &lanes, retention))?;
        if !live {
            return Err(slots::stale(token));
        }
        if !joined {
            if done < units.len() {
                // Some were not pending: set aside by an operator while their attempt was in
                // flight (OL-14), or acked before (an ack sent again).
                self.fenced(token, true, |t| {
                    t.execute(
                        &DELIVERED_ON_SET_ASIDE,
                        args![
                            token.actor().as_str(),
                            DELIVERED_AFTER_SET_ASIDE,
                            &units,
                            &lanes
                        ],
                    )
                })?;
            }
            return Ok(());
        }
        // Joined units (the statement above wrote nothing): in a transaction, fenced.
        self.fenced(token, true, |t| {
            ack_joined(t, token.actor().as_str(), &units, &lanes, retention)
        })
    }

    fn write_attempts(
        &self,
        token: &SlotToken,
        attempts: &[AttemptRecord],
    ) -> Result<(), StoreError> {
        // Rows locked in (lane, unit) order, so two writers of overlapping lanes cannot
        // deadlock each other (a deadlock the server breaks surfaces as StoreError::Busy).
        let mut sorted: Vec<&AttemptRecord> = attempts.iter().collect();
        sorted.sort_by_key(|a| (a.lane, a.unit));
        self.fenced(token, true, |t| {
            record_attempts(t, token.actor().as_str(), &sorted)
        })
    }

    fn wake_ups(&self) -> Notifier {
        PgBackend::wake_ups(self)
    }

    fn start_watch(&self) -> Result<Notifier, StoreError> {
        self.listen()
    }
}
