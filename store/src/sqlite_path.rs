//! The SQLite hot path of a pass, over the statement layer: the lanes with work, claims and
//! acks. Enqueue is in `enqueue.rs`, payloads and attempt records in `units.rs`, the same on
//! both dialects.
//!
//! SQLite runs in the process, so a statement costs no round trip: these are small statements
//! run once per lane or per unit, each planned by an index, where Postgres sends one
//! set-based statement per call (`pg_path.rs`). Every call runs in one transaction (a read's
//! snapshot, or the write lock), fenced by [`slots::fence`] in it.

use core::fmt::Write as _;

use outbox_lanes_core::{Seq, UnitId};

use crate::db::{Db, Get, Sql, args};
use crate::lanes::{self, pending_lane};
use crate::types::{
    ClaimRange, ClaimedLane, ClaimedSlot, ClaimedUnit, Payload, PendingLane, SlotToken, StoreLaneId,
};
use crate::util::{decode_headers, key_of, timestamp_of, to_i64, to_u32, to_u64};
use crate::{StoreError, set_aside, slots, units};

/// The actor's lanes with pending units enqueued after `$2` (see [`lanes_with_work`]).
static LANES_WITH_WORK: Sql = Sql::new(concat!(
    "SELECT ",
    lanes::pending_lane_cols!(),
    ", l.tail_seq, ",
    lanes::pending_count_col!(),
    " FROM ol_lanes l WHERE l.actor = $1 AND l.tail_seq > $2 \
     AND EXISTS (SELECT 1 FROM ol_units d WHERE d.lane_id = l.id) ORDER BY l.id"
));

/// The lanes of the token's actor with pending units enqueued after `since`, and the new
/// watermark.
pub(crate) fn lanes_with_work(
    db: &mut impl Db,
    token: &SlotToken,
    since: u64,
) -> Result<(Vec<PendingLane>, u64), StoreError> {
    slots::fence(db, token)?;
    let rows = db.query(
        &LANES_WITH_WORK,
        args![token.actor().as_str(), to_i64(since)],
        |r| {
            let mut lane = pending_lane(r, 0)?;
            lane.pending = to_u64(r.int(lanes::PENDING_LANE_COLS + 1)?);
            Ok((lane, to_u64(r.int(lanes::PENDING_LANE_COLS)?)))
        },
    )?;
    let mark = rows.iter().map(|(_, tail)| *tail).fold(since, u64::max);
    Ok((rows.into_iter().map(|(lane, _)| lane).collect(), mark))
}

static LANE: Sql =
    Sql::new("SELECT recipient, ordering_key, paused FROM ol_lanes WHERE id = $1 AND actor = $2");

/// Up to `$3` rows of lane `$1` from seq `$2`, in order. `d` is the lane's row: on a unit's
/// head (every one-lane unit, the hot path) it holds everything, its payload's size and time
/// inline or in `r`; a joined unit's other lanes read their head separately ([`HEAD`]). A
/// one-lane unit's payload (content type, body, headers) comes with it: the pass keeps it for
/// its attempts instead of reading it again per attempt.
///
/// `LIMIT +$3`, not `LIMIT $3`: SQLite plans with a bare bound LIMIT's value and so re-prepares
/// the statement on every new value (over half a claim's time); the unary plus keeps the cached
/// plan.
static CLAIM: Sql = Sql::new(
    "SELECT d.id, d.unit_id, d.seq, d.attempts, d.state, coalesce(d.row_id, r.row_id), \
     coalesce(d.body_len, r.body_len), coalesce(d.enqueued_at, r.enqueued_at), d.lanes, \
     CASE WHEN d.lanes = 1 THEN coalesce(d.content_type, r.content_type) END, \
     CASE WHEN d.lanes = 1 THEN CASE WHEN d.row_ref IS NULL THEN d.body ELSE r.body END END, \
     CASE WHEN d.lanes = 1 THEN CASE WHEN d.row_ref IS NULL THEN d.headers ELSE r.headers END END \
     FROM ol_units d LEFT JOIN ol_rows r ON r.id = d.row_ref \
     WHERE d.lane_id = $1 AND d.seq >= $2 ORDER BY d.seq, d.id LIMIT +$3",
);

/// Unit `$1`'s head: (row id, payload size, enqueued at, lanes).
static HEAD: Sql = Sql::new(
    "SELECT coalesce(h.row_id, r.row_id), coalesce(h.body_len, r.body_len), \
     coalesce(h.enqueued_at, r.enqueued_at), h.lanes \
     FROM ol_units h LEFT JOIN ol_rows r ON r.id = h.row_ref WHERE h.id = $1",
);

/// Every lane's row of joined unit `$1`.
static JOINED_SLOTS: Sql = Sql::new(
    "SELECT d.lane_id, l.recipient, l.ordering_key, d.attempts, d.state \
     FROM ol_units d JOIN ol_lanes l ON l.id = d.lane_id \
     WHERE d.id = $1 AND d.unit_id IS NULL OR d.unit_id = $1 ORDER BY d.lane_id",
);

/// One row of [`CLAIM`].
struct ClaimRow {
    id: i64,
    head: Option<i64>,
    seq: i64,
    attempts: i64,
    state: i64,
    row_id: Option<String>,
    len: Option<i64>,
    at: Option<i64>,
    lanes: i64,
    content_type: Option<String>,
    body: Option<Vec<u8>>,
    headers: Option<String>,
}

fn claim_row(r: &dyn Get) -> Result<ClaimRow, StoreError> {
    Ok(ClaimRow {
        id: r.int(0)?,
        head: r.opt_int(1)?,
        seq: r.int(2)?,
        attempts: r.int(3)?,
        state: r.int(4)?,
        row_id: r.opt_text(5)?,
        len: r.opt_int(6)?,
        at: r.opt_int(7)?,
        lanes: r.int(8)?,
        content_type: r.opt_text(9)?,
        body: r.opt_bytes(10)?,
        headers: r.opt_text(11)?,
    })
}

/// For each requested lane, up to its limit of units from its cursor (see
/// [`DriverStore::claim`](crate::DriverStore::claim)), in one read.
pub(crate) fn claim(
    db: &mut impl Db,
    token: &SlotToken,
    lanes: &[ClaimRange],
) -> Result<Vec<ClaimedLane>, StoreError> {
    slots::fence(db, token)?;
    let actor = token.actor().as_str();
    let mut out = Vec::with_capacity(lanes.len());
    for req in lanes {
        let lane = db.query_opt(&LANE, args![req.lane.0, actor], |r| {
            Ok((r.text(0)?, r.text(1)?, r.flag(2)?))
        })?;
        let Some((recipient, ok, paused)) = lane else {
            out.push(lanes::claimed_nothing(req.lane, true));
            continue;
        };
        if paused || req.limit == 0 {
            out.push(lanes::claimed_nothing(req.lane, paused));
            continue;
        }
        let key = key_of(recipient, ok);
        let limit = i64::from(req.limit);
        let rows = db.query(
            &CLAIM,
            args![req.lane.0, to_i64(req.from.0), limit],
            claim_row,
        )?;
        let exhausted = rows.len() < req.limit as usize;
        let mut units = Vec::with_capacity(rows.len());
        for row in rows {
            let (unit, row_id, len, at, nlanes) = match row.head {
                None => (row.id, row.row_id, row.len, row.at, row.lanes),
                Some(h) => {
                    let found = db.query_opt(&HEAD, args![h], |r| {
                        Ok((r.opt_text(0)?, r.opt_int(1)?, r.opt_int(2)?, r.int(3)?))
                    })?;
                    // The store deletes a unit's other lanes before its head: none is
                    // headless. One written so by hand is not a unit to deliver.
                    let Some((row_id, len, at, nlanes)) = found else {
                        continue;
                    };
                    (h, row_id, len, at, nlanes)
                }
            };
            let row_id = row_id.unwrap_or_default();
            let payload = match (row.head, row.content_type, row.body) {
                (None, Some(content_type), Some(body)) if nlanes <= 1 => Some(Payload {
                    row_id: row_id.clone(),
                    content_type,
                    body,
                    headers: decode_headers(row.headers),
                }),
                _ => None,
            };
            let slots = if nlanes <= 1 {
                vec![ClaimedSlot {
                    lane: req.lane,
                    key: key.clone(),
                    attempts: to_u32(row.attempts),
                    served: row.state != units::STATE_PENDING,
                }]
            } else {
                db.query(&JOINED_SLOTS, args![unit], |r| lanes::claimed_slot(r, 0))?
            };
            units.push(ClaimedUnit {
                id: UnitId(to_u64(unit)),
                seq: Seq(to_u64(row.seq)),
                row_id,
                bytes: to_u32(len.unwrap_or(0)),
                enqueued_at: timestamp_of(at.unwrap_or(0)),
                slots,
                payload,
            });
        }
        out.push(ClaimedLane {
            lane: req.lane,
            units,
            exhausted,
        });
    }
    Ok(out)
}

/// A one-lane unit's ack: its one row goes (the retention: [`ACK_RETAIN`]). No `RETURNING`
/// for a shared payload's reference: it costs SQLite a temporary result table on every
/// statement (about a quarter of an ack's time); [`ACK_ROWS`] reads the batch's references
/// once.
static ACK_ONE: Sql = Sql::new(
    "DELETE FROM ol_units WHERE id = $1 AND unit_id IS NULL AND lane_id = $2 AND state = 0 \
     AND lanes = 1 AND actor = $3",
);
/// A one-lane unit's ack with the retention: the head stays, out of every lane.
static ACK_RETAIN: Sql = Sql::new(
    "UPDATE ol_units SET state = 1, pending = 0, acked_at = {now}, lane_id = NULL \
     WHERE id = $1 AND unit_id IS NULL AND lane_id = $2 AND state = 0 AND lanes = 1 AND actor = $3",
);
/// The shared payloads the units `$1` (a JSON array of ids) refer to, read before their acks:
/// each goes with its last unit, checked once per batch.
static ACK_ROWS: Sql = Sql::new(
    "SELECT DISTINCT row_ref FROM ol_units \
     WHERE id IN (SELECT value FROM json_each($1)) AND row_ref IS NOT NULL",
);
/// A joined unit's row in one lane served (`+d.lane_id` keeps the planner on the id and
/// `ol_units_unit` lookups instead of the lane's index).
static ACK_JOINED_LANE: Sql = Sql::new(
    "UPDATE ol_units AS d SET state = 1 WHERE (d.id = $1 AND d.unit_id IS NULL OR d.unit_id = $1) \
     AND +d.lane_id = $2 AND d.state = 0 AND d.actor = $3",
);

/// Marks these recipients served, in the caller's fenced write transaction (see
/// [`DriverStore::ack`](crate::DriverStore::ack)). Returns the pairs the ack took (served, or
/// landed on an operator's dead letter), for the delivery log
/// ([`delivery_log::taken_once`](crate::delivery_log::taken_once)).
pub(crate) fn ack(
    db: &mut impl Db,
    token: &SlotToken,
    delivered: &[(UnitId, StoreLaneId)],
    retention: bool,
) -> Result<Vec<(UnitId, StoreLaneId)>, StoreError> {
    let actor = token.actor().as_str();
    // Shared payloads (rows fanned out to many recipients keep theirs in `ol_rows`) that may
    // have lost their last unit; the retention keeps every head, and so every payload.
    let rows = if retention || delivered.is_empty() {
        Vec::new()
    } else {
        let mut ids = String::with_capacity(delivered.len() * 8 + 2);
        for (i, (unit, _)) in delivered.iter().enumerate() {
            ids.push(if i == 0 { '[' } else { ',' });
            let _ = write!(ids, "{}", to_i64(unit.0)); // a `String` takes every write
        }
        ids.push(']');
        db.query(&ACK_ROWS, args![ids.as_str()], |r| r.int(0))?
    };
    let one = if retention { &ACK_RETAIN } else { &ACK_ONE };
    let mut taken = Vec::with_capacity(delivered.len());
    for &(id, lane) in delivered {
        let unit = to_i64(id.0);
        let a = args![unit, lane.0, actor];
        let took = if db.execute(one, a)? == 1 {
            true
        } else if db.execute(&ACK_JOINED_LANE, a)? == 1 {
            // A joined unit: this lane is served; the unit finishes with its last lane.
            units::settle(db, unit, retention)?;
            true
        } else {
            // Not pending: set aside by an operator while the attempt was in flight (OL-14),
            // or an ack sent again.
            set_aside::delivered_on_set_aside(db, actor, unit, lane)?
        };
        if took {
            taken.push((id, lane));
        }
    }
    for row_ref in rows {
        units::drop_row_if_unused(db, row_ref)?;
    }
    Ok(taken)
}
