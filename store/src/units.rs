//! A unit's lifecycle after enqueue, shared by the backends: counting recipients down,
//! finishing a unit (deleted, or kept for the ack retention), dropping a shared payload row
//! nothing refers to, a lane's tail, and an actor's sequence numbers.

use crate::StoreError;
use crate::db::{Db, Sql, args};

/// Unit `$1` has one recipient fewer pending; its new count.
static COUNT_DOWN: Sql = Sql::new(
    "UPDATE ol_units SET pending = pending - 1 WHERE id = $1 AND unit_id IS NULL RETURNING pending",
);
static DELETE_OTHER_LANES: Sql = Sql::new("DELETE FROM ol_units WHERE unit_id = $1");
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
static ADVANCE_TAIL: Sql = Sql::with_sqlite(
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
pub(crate) fn alloc_seqs(db: &mut impl Db, actor: &str, n: i64) -> Result<i64, StoreError> {
    let last = db.query_one(&ALLOC_SEQS, args![actor, n], |r| r.int(0))?;
    Ok(last - n + 1)
}
