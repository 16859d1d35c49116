//! The outbox at a glance, written once for both backends: every actor's status, the age of
//! what waits longest, and which actors have work now.

use std::collections::BTreeMap;

use outbox_lanes_core::{ActorId, Timestamp};

use crate::StoreError;
use crate::db::{Db, Sql, args};
use crate::types::{ActorStatus, ActorsDue};
use crate::util::{WaitingLane, assemble_status, millis_of, timestamp_of};

/// Unfinished units per actor = rows in lanes minus the other lanes of joined units, counted
/// from the lane index and the small joined-unit index: no unit row, and so no payload, is
/// read. (SQLite: the CROSS JOIN keeps lanes as the outer loop.)
static PENDING: Sql = Sql::with_sqlite(
    "SELECT actor, sum(n)::bigint FROM ( \
       SELECT l.actor AS actor, count(*) AS n FROM ol_lanes l JOIN ol_units d \
         ON d.lane_id = l.id GROUP BY l.actor \
       UNION ALL SELECT actor, -count(*) FROM ol_units WHERE unit_id IS NOT NULL GROUP BY actor) x \
     GROUP BY actor HAVING sum(n) > 0",
    "SELECT actor, sum(n) FROM ( \
       SELECT l.actor AS actor, count(*) AS n FROM ol_lanes l CROSS JOIN ol_units d \
         ON d.lane_id = l.id GROUP BY l.actor \
       UNION ALL SELECT actor, -count(*) FROM ol_units WHERE unit_id IS NOT NULL GROUP BY actor) \
     GROUP BY actor HAVING sum(n) > 0",
);
static HELD: Sql = Sql::new(
    "SELECT actor, holder, lease_expires FROM ol_slots \
     WHERE holder IS NOT NULL AND lease_expires > {now}",
);
/// Every lane that may not be open and has pending units; `assemble_status` says which.
static WAITING: Sql = Sql::new(
    "SELECT l.actor, l.recipient, l.ordering_key, l.not_before, l.backoff_level, l.paused, \
     l.pause_reason, l.unavailable_since FROM ol_lanes l \
     WHERE (l.paused OR l.backoff_level > 0 OR l.not_before > $1 \
       OR l.unavailable_since IS NOT NULL) \
     AND EXISTS (SELECT 1 FROM ol_units d WHERE d.lane_id = l.id AND d.state = 0) \
     ORDER BY l.actor, l.not_before, l.id",
);
static DEAD: Sql = Sql::new("SELECT actor, count(*) FROM ol_dead_letters GROUP BY actor");

/// Every actor with pending units or dead letters.
pub(crate) fn status(db: &mut impl Db, now: Timestamp) -> Result<Vec<ActorStatus>, StoreError> {
    let now = millis_of(now);
    let pending = db.query(&PENDING, &[], |r| Ok((r.text(0)?, r.int(1)?)))?;
    let held = db.query(&HELD, &[], |r| Ok((r.text(0)?, r.text(1)?, r.int(2)?)))?;
    let waiting: Vec<WaitingLane> = db.query(&WAITING, args![now], |r| {
        Ok((
            r.text(0)?,
            r.text(1)?,
            r.text(2)?,
            r.opt_int(3)?,
            r.int(4)?,
            r.flag(5)?,
            r.opt_text(6)?,
            r.opt_int(7)?,
        ))
    })?;
    let dead = db.query(&DEAD, &[], |r| Ok((r.text(0)?, r.int(1)?)))?;
    Ok(assemble_status(
        &mut BTreeMap::new(),
        pending,
        held,
        waiting,
        dead,
        timestamp_of(now),
    ))
}

/// Per actor with pending units, when the row of its oldest lane head was enqueued: the head
/// of each lane through `ol_units_lane` (the query the lane list makes per lane).
static OLDEST_PENDING: Sql = Sql::new(
    "SELECT actor, min(head) FROM (SELECT l.actor AS actor, \
     (SELECT coalesce(h.enqueued_at, r.enqueued_at) FROM ol_units d \
      JOIN ol_units h ON h.id = coalesce(d.unit_id, d.id) LEFT JOIN ol_rows r ON r.id = h.row_ref \
      WHERE d.lane_id = l.id AND d.state = 0 ORDER BY d.seq, d.id LIMIT 1) AS head \
     FROM ol_lanes l) x WHERE head IS NOT NULL GROUP BY actor ORDER BY actor",
);

/// See [`ServiceStore::oldest_pending`](crate::ServiceStore::oldest_pending).
pub(crate) fn oldest_pending(db: &mut impl Db) -> Result<Vec<(ActorId, Timestamp)>, StoreError> {
    db.query(&OLDEST_PENDING, &[], |r| {
        Ok((ActorId::new(r.text(0)?), timestamp_of(r.int(1)?)))
    })
}

static READY_ACTORS: Sql = Sql::new(
    "SELECT DISTINCT l.actor FROM ol_lanes l WHERE NOT l.paused \
     AND (l.not_before IS NULL OR l.not_before <= $1) \
     AND EXISTS (SELECT 1 FROM ol_units d WHERE d.lane_id = l.id AND d.state = 0) ORDER BY l.actor",
);
static NEXT_NOT_BEFORE: Sql = Sql::new(
    "SELECT min(l.not_before) FROM ol_lanes l WHERE NOT l.paused AND l.not_before > $1 \
     AND EXISTS (SELECT 1 FROM ol_units d WHERE d.lane_id = l.id AND d.state = 0)",
);

/// Actors with work admissible at `now`, and the earliest future `not_before`.
pub(crate) fn actors_with_work(db: &mut impl Db, now: Timestamp) -> Result<ActorsDue, StoreError> {
    let now = millis_of(now);
    let ready = db.query(&READY_ACTORS, args![now], |r| Ok(ActorId::new(r.text(0)?)))?;
    let next = db.query_one(&NEXT_NOT_BEFORE, args![now], |r| r.opt_int(0))?;
    Ok(ActorsDue {
        ready,
        next_not_before: next.map(timestamp_of),
    })
}
