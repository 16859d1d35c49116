//! The row-id ledger (`ol_row_ids`): the dedup window past delivery.
//!
//! An enqueue is refused ([`EnqueueError::DuplicateRowId`]) when the actor used the row id
//! within [`CommonOptions::row_id_retention`](crate::CommonOptions::row_id_retention), even if
//! the row is gone; [`purge`] trims the ledger past it. A row still stored is refused by the
//! units' unique indexes anyway, however old.
//!
//! One statement, the same on both dialects: an upsert that takes an id that is new or whose
//! last use is older than the window, and changes nothing otherwise (0 rows: refused).
//! Postgres records a batch in one round trip (a connection that binds no arrays, one
//! statement per id, as SQLite and SCHEMA.md's plain SQL do).

use crate::EnqueueError;
use crate::StoreError;
use crate::db::{AsyncDb, Db, Sql, args};

/// One id: taken if new or last used at or before `$4` (the window's start).
static TAKE_ONE: Sql = Sql::new(
    "INSERT INTO ol_row_ids AS l (actor, row_id, enqueued_at) VALUES ($1, $2, $3) \
     ON CONFLICT (actor, row_id) DO UPDATE SET enqueued_at = excluded.enqueued_at \
     WHERE l.enqueued_at <= $4",
);

/// A batch (Postgres): the first id of `$2` that was not taken, if any. The ids of one batch
/// are distinct (enqueue refused a repeat before); they are written in sorted order, so two
/// batches sharing ids wait for each other instead of deadlocking.
static TAKE_BATCH: Sql = Sql::new(
    "WITH taken AS (INSERT INTO ol_row_ids AS l (actor, row_id, enqueued_at) \
       SELECT $1::text, i, $3::bigint FROM unnest($2::text[]) i ORDER BY i \
       ON CONFLICT (actor, row_id) DO UPDATE SET enqueued_at = excluded.enqueued_at \
       WHERE l.enqueued_at <= $4::bigint RETURNING l.row_id) \
     SELECT i FROM unnest($2::text[]) WITH ORDINALITY AS b(i, n) \
     WHERE NOT EXISTS (SELECT 1 FROM taken WHERE taken.row_id = b.i) ORDER BY n LIMIT 1",
);

/// Up to `$2` entries last used at or before `$1`.
static PURGE: Sql = Sql::new(
    "DELETE FROM ol_row_ids WHERE (actor, row_id) IN (SELECT actor, row_id FROM ol_row_ids \
     WHERE enqueued_at <= $1 ORDER BY enqueued_at LIMIT $2)",
);

/// How many entries one purge statement deletes: a bounded write, so that the write lock is
/// never held long.
pub(crate) const PURGE_BATCH: i64 = 10_000;

/// Records the batch's row ids (`ids`, distinct) as used at `now` (ms), inside the enqueue's
/// transaction; `window` is the retention in ms. A zero window writes nothing: the ledger
/// costs an enqueue one more table write per row (measured in BENCHMARKS.md), which a
/// service that needs no window does not pay.
///
/// # Errors
/// [`EnqueueError::DuplicateRowId`] naming the first id the actor used within the window;
/// the caller's transaction must then be rolled back. Database failures.
pub(crate) async fn take(
    db: &mut impl AsyncDb,
    actor: &str,
    ids: &[&str],
    now: i64,
    window: i64,
) -> Result<(), EnqueueError> {
    if window <= 0 {
        // No window: nothing to remember (a stored row is refused by its own indexes).
        return Ok(());
    }
    let since = now.saturating_sub(window);
    let refused = if db.arrays() {
        let ids: Vec<&str> = ids.to_vec();
        db.query_opt(&TAKE_BATCH, args![actor, &ids, now, since], |r| r.text(0))
            .await?
    } else {
        let mut refused = None;
        for id in ids {
            if db.execute(&TAKE_ONE, args![actor, *id, now, since]).await? == 0 {
                refused = Some((*id).to_owned());
                break;
            }
        }
        refused
    };
    match refused {
        Some(row) => Err(EnqueueError::DuplicateRowId { row }),
        None => Ok(()),
    }
}

/// Deletes ledger entries last used before `before` (ms), in bounded statements; returns how
/// many. Runs in its own short write transactions (`write` opens one per statement).
///
/// # Errors
/// Database failures.
pub(crate) fn purge_once(db: &mut impl Db, before: i64) -> Result<u64, StoreError> {
    db.execute(&PURGE, args![before, PURGE_BATCH])
}
