//! Enqueue, written once per dialect over the statement layer ([`AsyncDb`]): the store's
//! [`ServiceStore::enqueue`](crate::ServiceStore::enqueue), the caller's-transaction entry
//! points (`SqliteStore::enqueue_in`, `PgStore::enqueue_in`, the `sqlx` module's
//! `SqlxOutbox::enqueue`) all run [`enqueue`] on rows that `prepare.rs` validated and
//! canonicalised. What it writes is `SCHEMA.md`'s plain-SQL contract (OL-15): the actor's seqs
//! first, its row-id checks (stored rows and the ledger, OL-17), the lanes, the units (payload
//! inline, shared, or a joined unit's other lanes), the lanes' tails, and on Postgres the
//! `NOTIFY` delivered at the commit.
//!
//! - **Postgres** ([`one_lane_rows_at_once`], [`set_based`]): every statement is a round trip,
//!   so a batch is written set-based, with arrays, in a fixed number of statements whatever
//!   its size (one, plus a row-id check, for the common batch of one-recipient rows).
//! - **Statement by statement** ([`by_statement`]): SQLite, where a statement costs no round
//!   trip, runs SCHEMA.md's statements row by row; so does a Postgres connection that binds no
//!   arrays (sqlx's `Any`).
//!
//! Async for a caller's sqlx connection; the stores' own run it at once ([`crate::db::ready`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::SystemTime;

use outbox_lanes_core::{ActorId, LaneKey, Seq, Timestamp, UnitId};

use crate::db::{AsyncDb, Sql, args};
use crate::prepare::PreparedRow;
use crate::types::{CommonOptions, Enqueued};
use crate::units::{ADVANCE_TAIL, alloc_seqs};
use crate::util::{encode_headers, millis_of, to_i64, to_u64, window_millis};
use crate::{EnqueueError, StoreError, row_ids};

/// Enqueues `rows` (validated, not empty) for `actor` in the caller's transaction, and returns
/// what [`ServiceStore::enqueue`](crate::ServiceStore::enqueue) returns. `channel`: the
/// Postgres wake-up channel (`None` on SQLite, whose watchers see every commit).
///
/// # Errors
/// [`EnqueueError::DuplicateRowId`] for a row id the actor has (stored, or in the ledger's
/// window); database failures. The caller must roll its transaction (or savepoint) back.
pub(crate) async fn enqueue<D: AsyncDb>(
    db: &mut D,
    actor: &ActorId,
    rows: &[PreparedRow<'_>],
    channel: Option<&str>,
    common: &CommonOptions,
) -> Result<Vec<Enqueued>, EnqueueError> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let b = Batch {
        actor: actor.as_str(),
        rows,
        ids: rows.iter().map(|p| p.row.id.as_str()).collect(),
        now: millis_of(Timestamp::from_system_time(SystemTime::now())),
        window: window_millis(common),
    };
    match channel {
        Some(channel) if db.arrays() => {
            // The dedup window past delivery, first: one statement for the batch.
            row_ids::take(db, b.actor, &b.ids, b.now, b.window).await?;
            if one_lane_rows(rows) {
                one_lane_rows_at_once(db, &b, channel).await
            } else {
                set_based(db, &b, channel).await
            }
        }
        _ => by_statement(db, &b, channel).await,
    }
}

/// One enqueue's batch, as each way of writing it reads it.
struct Batch<'b, 'r> {
    actor: &'b str,
    rows: &'b [PreparedRow<'r>],
    /// The rows' ids, in order.
    ids: Vec<&'b str>,
    /// The enqueue's time, in milliseconds.
    now: i64,
    /// The row-id retention, in milliseconds.
    window: i64,
}

/// Wakes the relays listening on channel `$1` for actor `$2` (delivered on commit only).
pub(crate) static NOTIFY: Sql = Sql::new("SELECT pg_notify($1, $2)");

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
/// A unique violation on a row id index (`ol_units_row_id` or `ol_rows`' `UNIQUE (actor,
/// row_id)`), mapped to the batch row it names: how the one-statement enqueue refuses a row id
/// already inline on a unit, and a safety net for the general path (whose plan checks both
/// places first, under the actor lock) against a writer that skipped the lock.
fn duplicate_of(e: &StoreError, rows: &[PreparedRow<'_>]) -> Option<EnqueueError> {
    let (constraint, detail) = e.unique_violation()?;
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

/// Whether [`one_lane_rows_at_once`] can write this batch.
fn one_lane_rows(rows: &[PreparedRow<'_>]) -> bool {
    rows.iter()
        .all(|p| p.lanes.len() == 1 && p.row.dedup_key.is_none())
}

/// Postgres, the hot path: every row has one recipient and no dedup key, so each row
/// is one unit with its payload inline, and one statement does it all: the actor's seqs, the
/// duplicate check against shared payloads (ol_rows), the lanes (created or their tail
/// advanced, by one upsert each), the units, and the wake-up. A row id already inline on a
/// unit is refused by the unique index `ol_units_row_id`.
///
/// The statement's snapshot is taken before it waits for the actor's row lock, so it cannot
/// judge the row ids against the shared payloads (ol_rows): a second statement does, after
/// it. Lanes are upserted, so one created meanwhile is found all the same; seqs still follow
/// commit order (the lock is held to commit).
async fn one_lane_rows_at_once<D: AsyncDb>(
    t: &mut D,
    b: &Batch<'_, '_>,
    channel: &str,
) -> Result<Vec<Enqueued>, EnqueueError> {
    let (a, rows, now) = (b.actor, b.rows, b.now);
    let n = to_i64(rows.len());
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
            to_i64(k + 1),
        );
    }
    let (mut l_rec, mut l_ok, mut l_last) = (vec![], vec![], vec![]);
    let mut ordinal: HashMap<(&str, &str), i64> = HashMap::with_capacity(lanes.len());
    for (k, (key, last)) in lanes.into_iter().enumerate() {
        l_rec.push(key.0);
        l_ok.push(key.1);
        l_last.push(last);
        ordinal.insert(key, to_i64(k + 1));
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
        r_len.push(to_i64(p.row.body.len()));
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
        .await
        .map_err(|e| duplicate_of(&e, rows).unwrap_or_else(|| EnqueueError::from(e)))?;
    // The row ids against the shared payloads, in a statement of its own: its snapshot is
    // taken now that the actor's lock is held, so it sees every shared payload committed
    // before, including while the statement above waited for the lock (a concurrent fan-out
    // enqueue, a plain-SQL writer, a dead letter moving an inline payload to ol_rows: that one
    // also made the insert above wait for it through the unique index). No writer adds a
    // shared payload for this actor from now to the commit: they all take the actor's lock,
    // or (the dead letter) hold the inline row this batch would have collided with.
    // The caller's transaction (or savepoint) is rolled back on the error.
    if let Some(taken) = t
        .query_opt(&SHARED_ROW_ID_TAKEN, args![a, &r_id], |r| r.text(0))
        .await?
    {
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
            seq: Seq(to_u64(base + to_i64(k + 1))),
            units: vec![UnitId(to_u64(unit))],
            skipped: Vec::new(),
        })
        .collect())
}

/// Postgres, the general case (several recipients, joined units, dedup keys), set-based: a
/// fixed number of statements per batch whatever its size, because every statement costs a
/// round trip to the server.
async fn set_based<D: AsyncDb>(
    t: &mut D,
    b: &Batch<'_, '_>,
    channel: &str,
) -> Result<Vec<Enqueued>, EnqueueError> {
    let (a, rows, now, ids) = (b.actor, b.rows, b.now, &b.ids);
    let n = to_i64(rows.len());
    // First: the actor row lock serialises this actor's enqueues (seq order = commit order),
    // and the plan below reads after it, so it sees every enqueue committed before.
    let first = alloc_seqs(t, a, n).await?;

    // Everything the plan needs, in one round trip: row ids already taken (inline on a unit
    // or in ol_rows), the batch's known lanes, what is pending for its dedup keys, and enough
    // unit and shared-row ids (upper bounds: skipped recipients only leave gaps).
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
    // One ol_units row per (row, lane) at most; an ol_rows row per row split into several units.
    let max_units: i64 = rows.iter().map(|p| to_i64(p.lanes.len())).sum();
    let max_shared: i64 = to_i64(
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
    let plan = t
        .query_one(
            &ENQUEUE_PLAN,
            args![a, ids, &recs, &oks, &dks, max_shared, max_units],
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
        )
        .await?;
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
        let new = t
            .query(&NEW_LANES, args![a, &mr, &mo], |r| {
                Ok((r.int(0)?, r.text(1)?, r.text(2)?))
            })
            .await?;
        for (id, rec, ok) in new {
            lane_ids.insert((rec, ok), id);
        }
    }

    // The rows to write, as columns (one array per column, unnested by the insert):
    // heads with the payload inline, shared payloads, and rows without a payload (a joined
    // unit's other lanes, the heads of a shared payload's units).
    /// Payloads, inline on a head (with its `lane` and lane count `n`) or shared.
    #[derive(Default)]
    struct Payloads<'r> {
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
    impl<'r> Payloads<'r> {
        fn push(&mut self, id: i64, seq: i64, p: &PreparedRow<'r>) {
            self.id.push(id);
            self.seq.push(seq);
            self.row.push(p.row.id.as_str());
            self.ct.push(p.row.content_type.as_str());
            self.body.push(p.row.body.as_slice());
            self.len.push(to_i64(p.row.body.len()));
            self.dk.push(p.row.dedup_key.as_deref());
            self.ok.push(p.ordering_key);
            self.hd.push(encode_headers(&p.row.headers));
        }
    }
    #[derive(Default)]
    struct Bare {
        id: Vec<i64>,
        unit: Vec<Option<i64>>,
        lane: Vec<i64>,
        seq: Vec<i64>,
        row_ref: Vec<Option<i64>>,
    }
    let (mut inl, mut sh, mut bare) = (Payloads::default(), Payloads::default(), Bare::default());
    // Highest seq written per lane, in lane order (the tail update locks lanes in that order).
    let mut tails: BTreeMap<i64, i64> = BTreeMap::new();
    let (mut sk, mut uk) = (shared_keys.into_iter(), unit_keys.into_iter());
    let mut next_unit = || {
        uk.next()
            .ok_or_else(|| StoreError::Database("unit id allocation short".into()))
    };
    let mut out = Vec::with_capacity(rows.len());
    for (k, p) in rows.iter().enumerate() {
        let seq = first + to_i64(k);
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
        let mut units = Vec::new();
        if let [first_lane, others @ ..] = kept.as_slice() {
            if p.row.joined || others.is_empty() {
                // One unit: its head holds the payload; a joined unit's other lanes are rows
                // pointing at the head.
                let head = next_unit()?;
                inl.push(head, seq, p);
                inl.lane.push(*first_lane);
                inl.n.push(to_i64(kept.len()));
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
                sh.push(row_ref, seq, p);
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
        t.execute(&NOTIFY, args![channel, a]).await?;
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
    .await
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

/// An insert that returns the new row's id: `RETURNING id` on Postgres; on SQLite the insert
/// alone, its id read from the connection (`last_insert_rowid`).
macro_rules! returning_id {
    ($sql:expr $(,)?) => {
        Sql::with_sqlite(concat!($sql, " RETURNING id"), $sql)
    };
}

/// Whether actor `$1` has any shared payload (see [`by_statement`]).
static HAS_SHARED_ROWS: Sql = Sql::new("SELECT 1 FROM ol_rows WHERE actor = $1 LIMIT 1");
static LANE_ID: Sql =
    Sql::new("SELECT id FROM ol_lanes WHERE actor = $1 AND recipient = $2 AND ordering_key = $3");
static NEW_LANE: Sql =
    returning_id!("INSERT INTO ol_lanes (actor, recipient, ordering_key) VALUES ($1, $2, $3)",);
/// A unit with this dedup key (`$2`) still pending for this recipient (`$3`): two index paths
/// (payload inline on a head, or in a shared `ol_rows` row), each through the unit's head and
/// its other lanes.
static DEDUP_PENDING: Sql = Sql::new(
    "SELECT 1 WHERE EXISTS (SELECT 1 FROM ol_units h JOIN ol_units d ON d.id = h.id OR d.unit_id = h.id \
       JOIN ol_lanes l ON l.id = d.lane_id \
       WHERE h.actor = $1 AND h.dedup_key = $2 AND h.unit_id IS NULL AND d.state = 0 AND l.recipient = $3) \
     OR EXISTS (SELECT 1 FROM ol_rows r JOIN ol_units h ON h.row_ref = r.id \
       JOIN ol_units d ON d.id = h.id OR d.unit_id = h.id JOIN ol_lanes l ON l.id = d.lane_id \
       WHERE r.actor = $1 AND r.dedup_key = $2 AND h.unit_id IS NULL AND d.state = 0 AND l.recipient = $3)",
);
/// Row id `$2` stored for actor `$1`, in either place.
static ROW_ID_TAKEN: Sql = Sql::new(
    "SELECT 1 FROM ol_units WHERE actor = $1 AND row_id = $2 \
     UNION ALL SELECT 1 FROM ol_rows WHERE actor = $1 AND row_id = $2",
);
/// A unit's head with its payload inline (`$4`: its lane count).
static INSERT_HEAD: Sql = returning_id!(
    "INSERT INTO ol_units (actor, lane_id, seq, lanes, pending, row_id, content_type, body, \
     body_len, dedup_key, ordering_key, enqueued_at, headers) \
     VALUES ($1, $2, $3, $4, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
);
/// [`INSERT_HEAD`], unless the row id is on a shared payload of the actor (nothing inserted).
static INSERT_HEAD_CHECKED: Sql = returning_id!(
    "INSERT INTO ol_units (actor, lane_id, seq, lanes, pending, row_id, content_type, body, \
     body_len, dedup_key, ordering_key, enqueued_at, headers) \
     SELECT $1, $2, $3, $4, $4, $5, $6, $7, $8, $9, $10, $11, $12 \
     WHERE NOT EXISTS (SELECT 1 FROM ol_rows WHERE actor = $1 AND row_id = $5)",
);
/// Another lane's row of joined unit `$1`.
static INSERT_OTHER_LANE: Sql =
    Sql::new("INSERT INTO ol_units (unit_id, actor, lane_id, seq) VALUES ($1, $2, $3, $4)");
/// A shared payload, unless the row id is inline on a unit of the actor (nothing inserted).
static INSERT_SHARED: Sql = returning_id!(
    "INSERT INTO ol_rows (actor, row_id, seq, content_type, body, body_len, dedup_key, \
     ordering_key, enqueued_at, headers) SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 \
     WHERE NOT EXISTS (SELECT 1 FROM ol_units WHERE actor = $1 AND row_id = $2)",
);
/// One unit of a shared payload `$4`.
static INSERT_SHARED_UNIT: Sql =
    returning_id!("INSERT INTO ol_units (actor, lane_id, seq, row_ref) VALUES ($1, $2, $3, $4)",);

/// An insert's refusal by a unique index (belt and braces: the statements look for the row id
/// first), as the row id it names.
fn dup_or(e: StoreError, row: &str) -> EnqueueError {
    if e.unique_violation().is_some() {
        EnqueueError::DuplicateRowId {
            row: row.to_owned(),
        }
    } else {
        EnqueueError::from(e)
    }
}

/// SCHEMA.md's statements, row by row (see the module docs), after the actor's seqs: the
/// first statement is a write, so that SQLite takes its write lock there, waiting for it,
/// where a read first would make a caller's deferred transaction fail to upgrade at once
/// under a concurrent writer.
async fn by_statement<D: AsyncDb>(
    c: &mut D,
    b: &Batch<'_, '_>,
    channel: Option<&str>,
) -> Result<Vec<Enqueued>, EnqueueError> {
    let (a, rows, now) = (b.actor, b.rows, b.now);
    let n = to_i64(rows.len());
    let first = alloc_seqs(c, a, n).await?;
    row_ids::take(c, a, &b.ids, now, b.window).await?;
    let mut lanes: HashMap<&LaneKey, i64> = HashMap::new();
    let mut tails: BTreeMap<i64, i64> = BTreeMap::new();
    let mut out = Vec::with_capacity(rows.len());
    // A row id must be new in `ol_units` (its unique index says so at the INSERT) and in
    // `ol_rows`. An actor without shared rows (no fan-out row, no dead letter: the common
    // case) cannot clash there, so one look per batch spares a probe per row. The actor's row
    // is locked: only this batch can add shared rows, and it notes when it does.
    let mut shared_rows = c
        .query_opt(&HAS_SHARED_ROWS, args![a], |_| Ok(()))
        .await?
        .is_some();
    for (k, p) in rows.iter().enumerate() {
        let seq = first + to_i64(k);
        let row = p.row;
        let mut kept = Vec::with_capacity(p.lanes.len());
        let mut skipped = Vec::new();
        for key in &p.lanes {
            let id = match lanes.get(key) {
                Some(id) => *id,
                None => {
                    let v = args![a, key.recipient(), key.ordering_key().unwrap_or("")];
                    let id = match c.query_opt(&LANE_ID, v, |r| r.int(0)).await? {
                        Some(id) => id,
                        None => c.insert(&NEW_LANE, v).await?.ok_or_else(|| {
                            StoreError::Database("a lane insert wrote nothing".into())
                        })?,
                    };
                    lanes.insert(key, id);
                    id
                }
            };
            if let Some(dk) = &row.dedup_key {
                let v = args![a, dk.as_str(), key.recipient()];
                if c.query_opt(&DEDUP_PENDING, v, |_| Ok(())).await?.is_some() {
                    skipped.push(key.recipient().to_string());
                    continue;
                }
            }
            kept.push(id);
        }
        let (id, ct, body) = (&*row.id, &*row.content_type, &*row.body);
        let (len, dk, ok) = (to_i64(body.len()), row.dedup_key.as_deref(), p.ordering_key);
        let headers = encode_headers(&row.headers);
        let h = headers.as_deref();
        let mut units = Vec::new();
        let written = match kept.as_slice() {
            // Nothing is stored, but the id must still be one the actor does not have.
            [] => {
                let v = args![a, id];
                c.query_opt(&ROW_ID_TAKEN, v, |_| Ok(())).await?.is_none()
            }
            [head_lane, others @ ..] if row.joined || others.is_empty() => {
                // One unit: its head holds the payload. With shared rows about, the id check
                // against `ol_rows` rides in the INSERT (no row inserted: taken).
                let sql = if shared_rows {
                    &INSERT_HEAD_CHECKED
                } else {
                    &INSERT_HEAD
                };
                let n = to_i64(kept.len());
                let v = args![a, *head_lane, seq, n, id, ct, body, len, dk, ok, now, h];
                let unit = c.insert(sql, v).await.map_err(|e| dup_or(e, id))?;
                if let Some(unit) = unit {
                    tails.insert(*head_lane, seq);
                    for &lane in others {
                        let v = args![unit, a, lane, seq];
                        c.execute(&INSERT_OTHER_LANE, v).await?;
                        tails.insert(lane, seq);
                    }
                    units.push(UnitId(to_u64(unit)));
                }
                unit.is_some()
            }
            _ => {
                // k units sharing one payload: it goes once into `ol_rows`.
                let v = args![a, id, seq, ct, body, len, dk, ok, now, h];
                let row_ref = c
                    .insert(&INSERT_SHARED, v)
                    .await
                    .map_err(|e| dup_or(e, id))?;
                if let Some(row_ref) = row_ref {
                    shared_rows = true;
                    for &lane in &kept {
                        let v = args![a, lane, seq, row_ref];
                        let unit = c.insert(&INSERT_SHARED_UNIT, v).await?.ok_or_else(|| {
                            StoreError::Database("a unit insert wrote nothing".into())
                        })?;
                        units.push(UnitId(to_u64(unit)));
                        tails.insert(lane, seq);
                    }
                }
                row_ref.is_some()
            }
        };
        if !written {
            return Err(EnqueueError::DuplicateRowId {
                row: row.id.clone(),
            });
        }
        out.push(Enqueued {
            row_id: row.id.clone(),
            seq: Seq(to_u64(seq)),
            units,
            skipped,
        });
    }
    // Once per lane, in lane order: seqs grow through the batch, so the last one seen is the
    // tail.
    for (lane, seq) in tails {
        c.execute(&ADVANCE_TAIL, args![lane, seq]).await?;
    }
    if let Some(channel) = channel {
        c.execute(&NOTIFY, args![channel, a]).await?;
    }
    Ok(out)
}
