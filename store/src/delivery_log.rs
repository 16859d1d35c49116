//! The delivery log (`ol_delivery_log`, schema 8, issue 39) and the lanes' in-flight marks.
//!
//! Every attempt's outcome — when it started, how long it took, its number, the status, the
//! error's class and the first KiB of a non-2xx answer's body — is kept for
//! [`CommonOptions::delivery_log_retention`](crate::CommonOptions::delivery_log_retention)
//! (the row-id window by default). A pass hands the entries to the store with the writes it
//! makes anyway: a failed attempt's entry with its attempt record
//! ([`DriverStore::record_attempts_logged`](crate::DriverStore::record_attempts_logged)), a
//! delivery's with its ack ([`DriverStore::ack_logged`](crate::DriverStore::ack_logged),
//! which the ack writer group-commits). On SQLite that is one more `INSERT` per entry in a
//! transaction already open; on Postgres one set-based `INSERT … SELECT FROM unnest(…)` per
//! batch, inside the ack's own single statement (a data-modifying CTE) or the record's
//! transaction: no round trip of its own. The table has one index, `(actor, row_id)`, for
//! `rows show`; the upkeep deletes old entries in `id` order (ids grow with time), so no index
//! on time is written per delivery.
//!
//! In-flight marks (`ol_lanes.in_flight_since`, `in_flight_unit`): a relay does not write
//! every start. A pass marks a lane whose head has been in flight for longer than
//! [`IN_FLIGHT_MARK_AFTER`](crate::IN_FLIGHT_MARK_AFTER) (5 s), sweeping at most once a
//! second, and clears the mark once that attempt's outcome is written (or when the pass
//! ends). Readers trust a mark only while the actor's drain slot is held (a relay that died
//! mid-attempt leaves a mark that its expired lease makes stale).

use outbox_lanes_core::{ActorId, Timestamp, UnitId};

use crate::StoreError;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use crate::db::{Db, Dialect, Sql, Value, args};
use crate::host_figures::{
    HOST_FIGURES_LATENCY_SAMPLE, HOST_FIGURES_MAX_ENTRIES, HostFigures, LatencyPercentiles,
    outcome_class,
};
use crate::hosts::origin_of;
use crate::types::{
    DeliveryLogEntry, DeliveryLogRow, LaneInFlight, RowDelivery, RowDeliveryState, StoreLaneId,
    log_excerpt,
};
use crate::util::{key_of, millis_of, status_of, timestamp_of, to_i64, to_u32, to_u64};

/// One entry (SQLite, and Postgres outside a batch).
static INSERT_ONE: Sql = Sql::new(
    "INSERT INTO ol_delivery_log (actor, row_id, unit_id, lane_id, attempt, started_at, \
     duration_ms, status, error_class, body, delivered) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
);

/// A batch of failed attempts' entries in one statement (Postgres): `$1` actor, `$2` row ids,
/// `$3` units, `$4` lanes, `$5` attempts, `$6` starts, `$7` durations, `$8` statuses, `$9`
/// classes, `$10` bodies, `$11` delivered flags as 0/1.
static INSERT_BATCH_PG: Sql = Sql::new(
    "INSERT INTO ol_delivery_log (actor, row_id, unit_id, lane_id, attempt, started_at, \
     duration_ms, status, error_class, body, delivered) \
     SELECT $1, g.row_id, g.unit, g.lane, g.attempt, g.started, g.took, g.status, g.class, \
     g.body, g.delivered <> 0 \
     FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], \
       $7::bigint[], $8::bigint[], $9::text[], $10::text[], $11::bigint[]) \
       AS g(row_id, unit, lane, attempt, started, took, status, class, body, delivered)",
);

/// The arrays of a batch, bound in the order [`INSERT_BATCH_PG`] takes them; or a
/// one-statement ack's log columns aligned with its units ([`Columns::aligned`]).
pub(crate) struct Columns<'a> {
    pub(crate) row_ids: Vec<Option<&'a str>>,
    pub(crate) units: Vec<i64>,
    pub(crate) lanes: Vec<i64>,
    pub(crate) attempts: Vec<i64>,
    pub(crate) started: Vec<i64>,
    pub(crate) took: Vec<i64>,
    pub(crate) status: Vec<Option<i64>>,
    pub(crate) class: Vec<Option<&'a str>>,
    pub(crate) body: Vec<Option<&'a str>>,
    pub(crate) delivered: Vec<i64>,
}

impl<'a> Columns<'a> {
    pub(crate) fn of(entries: &'a [DeliveryLogEntry]) -> Columns<'a> {
        Columns::of_slots(entries.len(), entries.iter().map(Some))
    }

    /// A one-statement ack's log columns (Postgres), aligned with its units: entry `i`
    /// belongs to unit `i` in its lane, a NULL row id (and empty columns) where a unit has
    /// none, so the statement writes the entries of the units it finishes from its own
    /// result, with no join. `pairs` sorted and deduplicated, as the ack makes them; a pair's
    /// first entry only, as [`taken_once`] keeps, and none for a pair not in the batch.
    pub(crate) fn aligned(
        pairs: &[(UnitId, StoreLaneId)],
        log: &'a [DeliveryLogEntry],
    ) -> Columns<'a> {
        let mut slots = vec![None; pairs.len()];
        for e in log {
            if let Ok(i) = pairs.binary_search(&(e.unit, e.lane)) {
                slots[i].get_or_insert(e);
            }
        }
        Columns::of_slots(slots.len(), slots.into_iter())
    }

    fn of_slots(
        n: usize,
        slots: impl Iterator<Item = Option<&'a DeliveryLogEntry>>,
    ) -> Columns<'a> {
        let mut c = Columns {
            row_ids: Vec::with_capacity(n),
            units: Vec::with_capacity(n),
            lanes: Vec::with_capacity(n),
            attempts: Vec::with_capacity(n),
            started: Vec::with_capacity(n),
            took: Vec::with_capacity(n),
            status: Vec::with_capacity(n),
            class: Vec::with_capacity(n),
            body: Vec::with_capacity(n),
            delivered: Vec::with_capacity(n),
        };
        for e in slots {
            c.row_ids.push(e.map(|e| e.row_id.as_str()));
            c.units.push(e.map_or(0, |e| to_i64(e.unit.0)));
            c.lanes.push(e.map_or(0, |e| e.lane.0));
            c.attempts.push(e.map_or(0, |e| i64::from(e.attempt)));
            c.started.push(e.map_or(0, |e| millis_of(e.started_at)));
            c.took.push(e.map_or(0, |e| to_i64(e.duration_ms)));
            c.status.push(e.and_then(|e| e.status.map(i64::from)));
            c.class.push(e.and_then(|e| e.error_class.as_deref()));
            c.body
                .push(e.and_then(|e| e.body.as_deref().map(log_excerpt)));
            c.delivered.push(e.map_or(0, |e| i64::from(e.delivered)));
        }
        c
    }
}

/// The entries of an ack's log that belong to the deliveries the ack took (`taken`: the
/// (unit, lane) pairs it served, or landed on a dead letter an operator wrote meanwhile),
/// each pair's first entry only. An ack sent again (a retried commit whose answer was lost),
/// or a pair handed over twice in one batch, takes nothing more and so logs nothing more.
/// Borrows `log` when every entry stays (the common case).
pub(crate) fn taken_once(
    log: &[DeliveryLogEntry],
    mut taken: Vec<(UnitId, StoreLaneId)>,
) -> Cow<'_, [DeliveryLogEntry]> {
    if log.is_empty() {
        return Cow::Borrowed(log);
    }
    taken.sort_unstable();
    taken.dedup();
    let mut logged = vec![false; taken.len()];
    let keep: Vec<bool> = log
        .iter()
        .map(|e| match taken.binary_search(&(e.unit, e.lane)) {
            Ok(i) if !logged[i] => {
                logged[i] = true;
                true
            }
            _ => false,
        })
        .collect();
    if keep.iter().all(|k| *k) {
        return Cow::Borrowed(log);
    }
    Cow::Owned(
        log.iter()
            .zip(keep)
            .filter(|(_, k)| *k)
            .map(|(e, _)| e.clone())
            .collect(),
    )
}

/// Writes `entries` for `actor` in the caller's transaction: one statement per entry on
/// SQLite (prepared once, in process), one set-based statement on Postgres.
///
/// # Errors
/// Database failures.
pub(crate) fn write<D: Db>(
    db: &mut D,
    actor: &str,
    entries: &[DeliveryLogEntry],
) -> Result<(), StoreError> {
    if entries.is_empty() {
        return Ok(());
    }
    if D::DIALECT == Dialect::Postgres {
        let c = Columns::of(entries);
        db.execute(
            &INSERT_BATCH_PG,
            args![
                actor,
                &c.row_ids,
                &c.units,
                &c.lanes,
                &c.attempts,
                &c.started,
                &c.took,
                &c.status,
                &c.class,
                &c.body,
                &c.delivered
            ],
        )?;
        return Ok(());
    }
    // SQLite: chunks of rows in one multi-row statement each (one step of the engine for
    // many rows), the rest one by one.
    let mut rest = entries;
    while rest.len() >= CHUNK {
        let (chunk, tail) = rest.split_at(CHUNK);
        let mut values = Vec::with_capacity(CHUNK * 11);
        for e in chunk {
            values.extend([
                Value::Text(actor),
                Value::Text(&e.row_id),
                Value::Int(to_i64(e.unit.0)),
                Value::Int(e.lane.0),
                Value::Int(i64::from(e.attempt)),
                Value::Int(millis_of(e.started_at)),
                Value::Int(to_i64(e.duration_ms)),
                Value::OptInt(e.status.map(i64::from)),
                Value::OptText(e.error_class.as_deref()),
                Value::OptText(e.body.as_deref().map(log_excerpt)),
                Value::Bool(e.delivered),
            ]);
        }
        db.execute(insert_chunk(), &values)?;
        rest = tail;
    }
    for e in rest {
        db.execute(
            &INSERT_ONE,
            args![
                actor,
                e.row_id.as_str(),
                to_i64(e.unit.0),
                e.lane.0,
                i64::from(e.attempt),
                millis_of(e.started_at),
                to_i64(e.duration_ms),
                e.status.map(i64::from),
                e.error_class.as_deref(),
                e.body.as_deref().map(log_excerpt),
                e.delivered
            ],
        )?;
    }
    Ok(())
}

/// Rows of one multi-row `INSERT` on SQLite.
const CHUNK: usize = 16;

/// `INSERT … VALUES` of [`CHUNK`] rows, its text made once.
fn insert_chunk() -> &'static Sql {
    static SQL: OnceLock<Sql> = OnceLock::new();
    SQL.get_or_init(|| {
        let rows: Vec<String> = (0..CHUNK)
            .map(|i| {
                let p: Vec<String> = (1..=11).map(|k| format!("${}", i * 11 + k)).collect();
                format!("({})", p.join(", "))
            })
            .collect();
        let text = format!(
            "INSERT INTO ol_delivery_log (actor, row_id, unit_id, lane_id, attempt, started_at, \
             duration_ms, status, error_class, body, delivered) VALUES {}",
            rows.join(", ")
        );
        Sql::new(Box::leak(text.into_boxed_str()))
    })
}

/// How many entries one purge statement deletes at most.
pub(crate) const PURGE_BATCH: i64 = 5000;

/// The oldest entries (by id: ids grow with time) started before `$1`, at most `$2` of them.
static PURGE: Sql = Sql::new(
    "DELETE FROM ol_delivery_log WHERE id IN (SELECT id FROM ol_delivery_log \
     WHERE started_at < $1 ORDER BY id LIMIT $2)",
);

/// Deletes up to [`PURGE_BATCH`] entries started before `before` (ms); returns how many.
///
/// # Errors
/// Database failures.
pub(crate) fn purge_once(db: &mut impl Db, before: i64) -> Result<u64, StoreError> {
    db.execute(&PURGE, args![before, PURGE_BATCH])
}

/// Marks (`Some((unit, since))`) or clears (`None`) lanes' attempt in flight.
static MARK: Sql = Sql::new(
    "UPDATE ol_lanes SET in_flight_since = $2, in_flight_unit = $3 WHERE id = $1 AND actor = $4",
);

/// Writes in-flight marks of `actor`'s lanes, in the caller's (fenced) transaction.
///
/// # Errors
/// Database failures.
pub(crate) fn mark(
    db: &mut impl Db,
    actor: &str,
    marks: &[(StoreLaneId, Option<(UnitId, Timestamp)>)],
) -> Result<(), StoreError> {
    for (lane, m) in marks {
        let since = m.map(|(_, t)| millis_of(t));
        let unit = m.map(|(u, _)| to_i64(u.0));
        db.execute(&MARK, args![lane.0, since, unit, actor])?;
    }
    Ok(())
}

/// Every marked lane whose actor's slot is held, longest in flight first (the partial index
/// `ol_lanes_in_flight` holds only marked lanes).
static IN_FLIGHT: Sql = Sql::new(
    "SELECT l.actor, l.id, l.recipient, l.ordering_key, l.in_flight_unit, l.in_flight_since \
     FROM ol_lanes l WHERE l.in_flight_since IS NOT NULL AND l.in_flight_unit IS NOT NULL \
     AND EXISTS (SELECT 1 FROM ol_slots s WHERE s.actor = l.actor AND s.holder IS NOT NULL \
       AND s.lease_expires > {now}) \
     ORDER BY l.in_flight_since, l.id",
);

/// The lanes in flight for long, every actor's.
///
/// # Errors
/// Database failures.
pub(crate) fn in_flight(db: &mut impl Db) -> Result<Vec<LaneInFlight>, StoreError> {
    db.query(&IN_FLIGHT, &[], |r| {
        Ok(LaneInFlight {
            actor: ActorId::new(r.text(0)?),
            lane: StoreLaneId(r.int(1)?),
            key: key_of(r.text(2)?, r.text(3)?),
            unit: UnitId(to_u64(r.int(4)?)),
            since: timestamp_of(r.int(5)?),
        })
    })
}

/// The entries of a row, oldest first per lane.
static READ_ROW: Sql = Sql::new(
    "SELECT g.unit_id, g.lane_id, coalesce(l.recipient, ''), g.attempt, g.started_at, \
     g.duration_ms, g.status, g.error_class, g.body, g.delivered \
     FROM ol_delivery_log g LEFT JOIN ol_lanes l ON l.id = g.lane_id \
     WHERE g.actor = $1 AND g.row_id = $2 ORDER BY g.lane_id, g.started_at, g.id",
);

/// The log's entries of `actor`'s row `row_id`.
///
/// # Errors
/// Database failures.
pub(crate) fn read(
    db: &mut impl Db,
    actor: &str,
    row_id: &str,
) -> Result<Vec<DeliveryLogRow>, StoreError> {
    db.query(&READ_ROW, args![actor, row_id], |r| {
        Ok(DeliveryLogRow {
            unit: UnitId(to_u64(r.int(0)?)),
            lane: StoreLaneId(r.int(1)?),
            recipient: r.text(2)?,
            attempt: to_u32(r.int(3)?),
            started_at: timestamp_of(r.int(4)?),
            duration_ms: to_u64(r.int(5)?),
            status: status_of(r.opt_int(6)?),
            error_class: r.opt_text(7)?,
            body: r.opt_text(8)?,
            delivered: r.flag(9)?,
        })
    })
}

/// The lanes of a row's pending units (heads inline or sharing an `ol_rows` payload, and the
/// other lanes of joined units), with each lane's in-flight mark and whether the actor's slot
/// is held now (a mark is trusted only then).
static PENDING_OF_ROW: Sql = Sql::new(
    "SELECT coalesce(d.unit_id, d.id), d.lane_id, l.recipient, d.state, d.attempts, \
     d.last_status, d.last_error, l.in_flight_since, l.in_flight_unit, \
     EXISTS (SELECT 1 FROM ol_slots s WHERE s.actor = $1 AND s.holder IS NOT NULL \
       AND s.lease_expires > {now}) \
     FROM (SELECT h.id FROM ol_units h WHERE h.actor = $1 AND h.row_id = $2 AND h.unit_id IS NULL \
       AND h.acked_at IS NULL \
       UNION SELECT h.id FROM ol_rows r JOIN ol_units h ON h.row_ref = r.id \
       WHERE r.actor = $1 AND r.row_id = $2 AND h.unit_id IS NULL AND h.acked_at IS NULL) u \
     JOIN ol_units d ON d.id = u.id OR d.unit_id = u.id \
     JOIN ol_lanes l ON l.id = d.lane_id \
     ORDER BY d.lane_id",
);

/// A row's dead letters.
static DEAD_OF_ROW: Sql = Sql::new(
    "SELECT unit_id, lane_id, recipient, attempts, last_status, last_error \
     FROM ol_dead_letters WHERE actor = $1 AND row_id = $2 ORDER BY lane_id, id",
);

/// Where each recipient of `actor`'s row `row_id` stands, with the log's history.
///
/// # Errors
/// Database failures.
pub(crate) fn row_deliveries(
    db: &mut impl Db,
    actor: &ActorId,
    row_id: &str,
) -> Result<Vec<RowDelivery>, StoreError> {
    let actor = actor.as_str();
    let mut log = read(db, actor, row_id)?;
    let mut out: Vec<RowDelivery> = Vec::new();
    let pending = db.query(&PENDING_OF_ROW, args![actor, row_id], |r| {
        Ok((
            r.int(0)?,
            r.int(1)?,
            r.text(2)?,
            r.int(3)?,
            r.int(4)?,
            r.opt_int(5)?,
            r.opt_text(6)?,
            r.opt_int(7)?,
            r.opt_int(8)?,
            r.flag(9)?,
        ))
    })?;
    for (unit, lane, recipient, state, attempts, status, error, since, in_unit, held) in pending {
        // A joined unit's lane already served or dead-lettered: the log or the dead letter
        // tells it below.
        if state != crate::units::STATE_PENDING {
            continue;
        }
        let state = match (since, in_unit) {
            (Some(since), Some(u)) if u == unit && held => {
                RowDeliveryState::InFlight(timestamp_of(since))
            }
            _ => RowDeliveryState::Pending,
        };
        out.push(RowDelivery {
            unit: UnitId(to_u64(unit)),
            lane: StoreLaneId(lane),
            recipient,
            state,
            attempts: to_u32(attempts),
            last_status: status_of(status),
            last_error: error,
            delivered_at: None,
            history: Vec::new(),
        });
    }
    let dead = db.query(&DEAD_OF_ROW, args![actor, row_id], |r| {
        Ok((
            r.int(0)?,
            r.int(1)?,
            r.text(2)?,
            r.int(3)?,
            r.opt_int(4)?,
            r.opt_text(5)?,
        ))
    })?;
    for (unit, lane, recipient, attempts, status, error) in dead {
        let (unit, lane) = (UnitId(to_u64(unit)), StoreLaneId(lane));
        if out.iter().any(|d| d.unit == unit && d.lane == lane) {
            continue;
        }
        out.push(RowDelivery {
            unit,
            lane,
            recipient,
            state: RowDeliveryState::DeadLetter,
            attempts: to_u32(attempts),
            last_status: status_of(status),
            last_error: error,
            delivered_at: None,
            history: Vec::new(),
        });
    }
    // The rest of the log: recipients no longer pending nor dead (delivered, or finished).
    for e in &log {
        if out.iter().any(|d| d.unit == e.unit && d.lane == e.lane) {
            continue;
        }
        out.push(RowDelivery {
            unit: e.unit,
            lane: e.lane,
            recipient: e.recipient.clone(),
            state: RowDeliveryState::Finished,
            attempts: 0,
            last_status: None,
            last_error: None,
            delivered_at: None,
            history: Vec::new(),
        });
    }
    for d in &mut out {
        let (mine, rest): (Vec<_>, Vec<_>) = log
            .into_iter()
            .partition(|e| e.unit == d.unit && e.lane == d.lane);
        log = rest;
        if let Some(last) = mine.last() {
            if d.state == RowDeliveryState::Finished {
                d.attempts = last.attempt;
                d.last_status = last.status;
                d.last_error.clone_from(&last.error_class);
            }
            if last.delivered {
                if d.state == RowDeliveryState::Finished {
                    d.state = RowDeliveryState::Delivered;
                }
                d.delivered_at = Some(
                    last.started_at
                        .saturating_add(core::time::Duration::from_millis(last.duration_ms)),
                );
            }
        }
        d.history = mine;
    }
    out.sort_by(|a, b| a.recipient.cmp(&b.recipient).then(a.unit.cmp(&b.unit)));
    Ok(out)
}

/// The most recent [`HOST_FIGURES_MAX_ENTRIES`] entries (walking the primary key backwards),
/// of those the ones started at or after `$1`: every figures read goes through it.
macro_rules! recent_entries {
    () => {
        "(SELECT lane_id, started_at, duration_ms, status, error_class, delivered \
         FROM ol_delivery_log ORDER BY id DESC LIMIT 100000) g"
    };
}

/// Attempts per lane, status class (the status's hundreds) or error class, and delivered.
static FIGURES_COUNTS: Sql = Sql::new(concat!(
    "SELECT g.lane_id, coalesce(l.recipient, ''), \
     CASE WHEN g.status IS NULL THEN NULL ELSE g.status / 100 END, \
     CASE WHEN g.status IS NULL THEN g.error_class ELSE NULL END, g.delivered, count(*) \
     FROM ",
    recent_entries!(),
    " LEFT JOIN ol_lanes l ON l.id = g.lane_id WHERE g.started_at >= $1 \
     GROUP BY g.lane_id, l.recipient, \
       CASE WHEN g.status IS NULL THEN NULL ELSE g.status / 100 END, \
       CASE WHEN g.status IS NULL THEN g.error_class ELSE NULL END, g.delivered",
));

/// The durations of the same entries, most recent first.
static FIGURES_DURATIONS: Sql = Sql::new(concat!(
    "SELECT g.lane_id, g.duration_ms FROM ",
    recent_entries!(),
    " WHERE g.started_at >= $1 ORDER BY g.started_at DESC",
));

/// Whether the log holds more than [`HOST_FIGURES_MAX_ENTRIES`] entries since `$1`: the
/// oldest of the most recent ones started after it.
static FIGURES_CAPPED: Sql = Sql::new(concat!(
    "SELECT count(*), coalesce(min(g.started_at), 0) FROM ",
    recent_entries!(),
));

/// Per-host figures of the log's entries since `since` (bounded: see
/// [`ServiceStore::host_figures`](crate::ServiceStore::host_figures)).
///
/// # Errors
/// Database failures.
pub(crate) fn host_figures(
    db: &mut impl Db,
    since: Timestamp,
) -> Result<Vec<HostFigures>, StoreError> {
    const _: () = assert!(
        HOST_FIGURES_MAX_ENTRIES == 100_000,
        "recent_entries! says 100000"
    );
    let from = millis_of(since);
    let (read, oldest) = db
        .query(&FIGURES_CAPPED, &[], |r| Ok((to_u64(r.int(0)?), r.int(1)?)))?
        .into_iter()
        .next()
        .unwrap_or((0, 0));
    // The window holds more than the read takes: the figures start at the oldest entry read.
    let since = if read >= HOST_FIGURES_MAX_ENTRIES as u64 && oldest > from {
        timestamp_of(oldest)
    } else {
        since
    };
    let mut by_origin: BTreeMap<String, HostFigures> = BTreeMap::new();
    let mut origin_of_lane: HashMap<i64, String> = HashMap::new();
    let counts = db.query(&FIGURES_COUNTS, args![from], |r| {
        Ok((
            r.int(0)?,
            r.text(1)?,
            r.opt_int(2)?,
            r.opt_text(3)?,
            r.flag(4)?,
            to_u64(r.int(5)?),
        ))
    })?;
    for (lane, recipient, class, error, delivered, n) in counts {
        let Some(origin) = origin_of(&recipient) else {
            continue;
        };
        origin_of_lane.insert(lane, origin.clone());
        let h = by_origin
            .entry(origin.clone())
            .or_insert_with(|| HostFigures {
                origin,
                since,
                attempts: 0,
                delivered: 0,
                outcomes: BTreeMap::new(),
                latency_ms: None,
            });
        h.attempts += n;
        if delivered {
            h.delivered += n;
        }
        *h.outcomes
            .entry(outcome_class(class, error.as_deref()))
            .or_insert(0) += n;
    }
    let mut durations: HashMap<&str, Vec<u64>> = HashMap::new();
    let rows = db.query(&FIGURES_DURATIONS, args![from], |r| {
        Ok((r.int(0)?, to_u64(r.int(1)?)))
    })?;
    for (lane, took) in rows {
        let Some(origin) = origin_of_lane.get(&lane) else {
            continue;
        };
        let d = durations.entry(origin.as_str()).or_default();
        if d.len() < HOST_FIGURES_LATENCY_SAMPLE {
            d.push(took);
        }
    }
    for (origin, mut d) in durations {
        if let Some(h) = by_origin.get_mut(origin) {
            h.latency_ms = LatencyPercentiles::of(&mut d);
        }
    }
    Ok(by_origin.into_values().collect())
}
