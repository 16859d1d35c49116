//! Hosts (origins: scheme, host and port of recipient URLs), written once for both backends:
//! the health the relays share (connection failures in a row, the host's backoff), the HTTP
//! signature scheme each host accepted, and the operator's block (`ol_hosts`, schema 6).
//!
//! A relay keeps the live state in memory and writes a host's row when it changes (a failure,
//! a backoff, a recovery, a scheme learned), and reads every row back about once a second, so
//! relays sharing a database, and a relay restarted, start from what the others saw. The
//! operator's columns (`blocked`) are written only by [`ServiceStore`](crate::ServiceStore)'s
//! host actions, never by a relay's [`write`].

use outbox_lanes_core::Timestamp;

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
pub(crate) use ops::*;

/// What an operator decided about a host (`outbox-lanes hosts block`): the host book's
/// [`HostControl`](outbox_lanes_core::host::HostControl).
pub use outbox_lanes_core::host::HostControl as HostBlock;

fn block_code(b: HostBlock) -> i64 {
    match b {
        HostBlock::Open => 0,
        HostBlock::Hold => 1,
        HostBlock::DeadLetter => 2,
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
fn block_of(code: i64) -> HostBlock {
    match code {
        1 => HostBlock::Hold,
        2 => HostBlock::DeadLetter,
        _ => HostBlock::Open,
    }
}

/// Every host's row, read after the operators' host-control `generation` (read first): what
/// [`DriverStore::hosts`](crate::DriverStore::hosts) returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostRows {
    /// The operators' host-control generation: +1 per `hosts block|unblock|retry`.
    pub generation: u64,
    /// Every host's row, in origin order.
    pub hosts: Vec<HostRecord>,
}

/// One host's row of `ol_hosts`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRecord {
    /// `scheme://host:port`, canonical (lower case, default port written out).
    pub origin: String,
    /// Connection-level failures in a row (refused, reset before an answer, name resolution,
    /// TLS handshake, connect timeout), across every lane and actor.
    pub failures: u32,
    /// The host's backoff level: 0 while it is open.
    pub level: u32,
    /// While in backoff: when the next probe may go.
    pub not_before: Option<Timestamp>,
    /// When the failures in a row began (`None` once it answered).
    pub failing_since: Option<Timestamp>,
    /// The last connection failure.
    pub last_error: Option<String>,
    /// The operator's block (read only for a relay).
    pub blocked: HostBlock,
    /// The HTTP signature scheme the host accepted (`rfc9421`, `cavage`), if known.
    pub spec: Option<String>,
    /// When that scheme was learned.
    pub spec_at: Option<Timestamp>,
    /// When a relay last wrote the row (its clock).
    pub updated_at: Timestamp,
}

impl HostRecord {
    /// A host nothing is known about.
    pub fn new(origin: impl Into<String>, at: Timestamp) -> HostRecord {
        HostRecord {
            origin: origin.into(),
            failures: 0,
            level: 0,
            not_before: None,
            failing_since: None,
            last_error: None,
            blocked: HostBlock::Open,
            spec: None,
            spec_at: None,
            updated_at: at,
        }
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod ops {
    use outbox_lanes_core::Timestamp;

    use super::{
        HOST_BLOCKED_REASON, HostBlock, HostRecord, HostRows, block_code, block_of, origin_of,
    };
    use crate::StoreError;
    use crate::db::{Db, Sql, args};
    use crate::types::StoreLaneId;
    use crate::util::{millis_of, timestamp_of, to_u32, to_u64};

    static ALL: Sql = Sql::new(
        "SELECT origin, failures, level, not_before, failing_since, last_error, blocked, spec, \
         spec_at, updated_at FROM ol_hosts ORDER BY origin",
    );
    /// A relay's write: everything but the operator's `blocked`, unless the row was written
    /// later (by another relay, or by an operator's retry): the last writer wins, so a write
    /// that was on its way when an operator reset the host does not undo the reset.
    static UPSERT: Sql = Sql::new(
        "INSERT INTO ol_hosts (origin, failures, level, not_before, failing_since, last_error, \
         spec, spec_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
         ON CONFLICT (origin) DO UPDATE SET failures = excluded.failures, level = excluded.level, \
         not_before = excluded.not_before, failing_since = excluded.failing_since, \
         last_error = excluded.last_error, spec = excluded.spec, spec_at = excluded.spec_at, \
         updated_at = excluded.updated_at WHERE ol_hosts.updated_at <= excluded.updated_at",
    );
    /// The operators' host-control generation (0 before the first host action).
    static GENERATION: Sql = Sql::new(
        "SELECT coalesce((SELECT CAST(value AS BIGINT) FROM ol_meta WHERE key = 'host_control'), 0)",
    );
    /// An operator's host action: the generation goes up by one, in its transaction.
    static BUMP_GENERATION: Sql = Sql::new(
        "INSERT INTO ol_meta (key, value) VALUES ('host_control', '1') ON CONFLICT (key) \
         DO UPDATE SET value = CAST(CAST(ol_meta.value AS BIGINT) + 1 AS TEXT)",
    );
    /// Whether any drain slot is held: a pass may have read the generation before the action.
    static ANY_HELD: Sql =
        Sql::new("SELECT EXISTS (SELECT 1 FROM ol_slots WHERE holder IS NOT NULL)");
    static BLOCK: Sql = Sql::new(
        "INSERT INTO ol_hosts (origin, blocked, updated_at) VALUES ($1, $2, $3) \
         ON CONFLICT (origin) DO UPDATE SET blocked = excluded.blocked",
    );
    /// The operator's retry: the health and the learned scheme forgotten.
    static RESET: Sql = Sql::new(
        "UPDATE ol_hosts SET failures = 0, level = 0, not_before = NULL, failing_since = NULL, \
         last_error = NULL, spec = NULL, spec_at = NULL, updated_at = $2 WHERE origin = $1",
    );
    static LANES: Sql = Sql::new("SELECT id, recipient FROM ol_lanes ORDER BY id");
    static PENDING: Sql = Sql::new(
        "SELECT l.recipient, count(d.id) FROM ol_lanes l LEFT JOIN ol_units d \
         ON d.lane_id = l.id AND d.state = 0 GROUP BY l.id, l.recipient",
    );

    fn record(r: &dyn crate::db::Get) -> Result<HostRecord, StoreError> {
        Ok(HostRecord {
            origin: r.text(0)?,
            failures: to_u32(r.int(1)?),
            level: to_u32(r.int(2)?),
            not_before: r.opt_int(3)?.map(timestamp_of),
            failing_since: r.opt_int(4)?.map(timestamp_of),
            last_error: r.opt_text(5)?,
            blocked: block_of(r.int(6)?),
            spec: r.opt_text(7)?,
            spec_at: r.opt_int(8)?.map(timestamp_of),
            updated_at: timestamp_of(r.int(9)?),
        })
    }

    /// Every host's row, after the generation (read first, so the rows are at least as new).
    pub(crate) fn all(db: &mut impl Db) -> Result<HostRows, StoreError> {
        let generation = generation(db)?;
        Ok(HostRows {
            generation,
            hosts: db.query(&ALL, &[], record)?,
        })
    }

    /// The operators' host-control generation.
    pub(crate) fn generation(db: &mut impl Db) -> Result<u64, StoreError> {
        Ok(to_u64(db.query_one(&GENERATION, &[], |r| r.int(0))?))
    }

    /// An operator's host action, in its transaction: the generation goes up; returns whether
    /// a drain slot is held (a running pass may have read the generation before).
    pub(crate) fn bump_generation(db: &mut impl Db) -> Result<bool, StoreError> {
        db.execute(&BUMP_GENERATION, &[])?;
        db.query_one(&ANY_HELD, &[], |r| r.flag(0))
    }

    /// A relay's writes of host states (the operator's block is left as it is).
    pub(crate) fn write(db: &mut impl Db, hosts: &[HostRecord]) -> Result<(), StoreError> {
        for h in hosts {
            db.execute(
                &UPSERT,
                args![
                    &h.origin,
                    i64::from(h.failures),
                    i64::from(h.level),
                    h.not_before.map(millis_of),
                    h.failing_since.map(millis_of),
                    h.last_error.as_deref(),
                    h.spec.as_deref(),
                    h.spec_at.map(millis_of),
                    millis_of(h.updated_at),
                ],
            )?;
        }
        Ok(())
    }

    /// Sets the operator's block of `origin`.
    pub(crate) fn set_block(
        db: &mut impl Db,
        origin: &str,
        block: HostBlock,
        at: Timestamp,
    ) -> Result<(), StoreError> {
        db.execute(&BLOCK, args![origin, block_code(block), millis_of(at)])?;
        Ok(())
    }

    /// Forgets `origin`'s failures and backoff (the operator's retry). Whether it had a row.
    pub(crate) fn reset(db: &mut impl Db, origin: &str, at: Timestamp) -> Result<bool, StoreError> {
        Ok(db.execute(&RESET, args![origin, millis_of(at)])? > 0)
    }

    /// The lanes whose recipient is on `origin`.
    pub(crate) fn lanes_of(db: &mut impl Db, origin: &str) -> Result<Vec<StoreLaneId>, StoreError> {
        let lanes = db.query(&LANES, &[], |r| Ok((r.int(0)?, r.text(1)?)))?;
        Ok(lanes
            .into_iter()
            .filter(|(_, url)| origin_of(url).as_deref() == Some(origin))
            .map(|(id, _)| StoreLaneId(id))
            .collect())
    }

    static PAUSE_FOR_HOST: Sql = Sql::new(
        "UPDATE ol_lanes SET paused = TRUE, pause_reason = $2 WHERE id = $1 AND NOT paused",
    );
    static RESUME_FOR_HOST: Sql = Sql::new(
        "UPDATE ol_lanes SET paused = FALSE, pause_reason = NULL WHERE id = $1 AND paused \
         AND pause_reason = $2",
    );
    /// The unblock forgets the run of failures of every lane to the host, held (paused) or
    /// dead-lettered by the block, as an operator's resume does: the time the block lasted is
    /// not the recipient's failure (a run from before it would otherwise make the lane
    /// unavailable at its first failure after it).
    static FORGET_RUN: Sql = Sql::new(
        "UPDATE ol_lanes SET failing_since = NULL, unavailable_since = NULL WHERE id = $1 \
         AND (failing_since IS NOT NULL OR unavailable_since IS NOT NULL)",
    );
    /// A lane waiting (its own backoff, or held for its host) comes back at once, and a
    /// failing one starts a new run of failures.
    static RETRY_FOR_HOST: Sql = Sql::new(
        "UPDATE ol_lanes SET not_before = NULL, backoff_level = 0, failing_since = NULL, \
         unavailable_since = NULL WHERE id = $1 \
         AND (not_before IS NOT NULL OR backoff_level > 0 OR failing_since IS NOT NULL \
         OR unavailable_since IS NOT NULL)",
    );

    /// Pauses `lane` for its host's block ([`HOST_BLOCKED_REASON`]), unless an operator
    /// paused it already. Whether it did.
    pub(crate) fn pause_for_host(db: &mut impl Db, lane: StoreLaneId) -> Result<bool, StoreError> {
        Ok(db.execute(&PAUSE_FOR_HOST, args![lane.0, HOST_BLOCKED_REASON])? > 0)
    }

    /// Whether `origin` is held by an operator, read so that no unblock commits between the
    /// read and the end of the transaction (Postgres: the row is share-locked; SQLite has one
    /// writer).
    static HELD: Sql = Sql::with_sqlite(
        "SELECT blocked FROM ol_hosts WHERE origin = $1 FOR SHARE",
        "SELECT blocked FROM ol_hosts WHERE origin = $1",
    );

    /// Pauses `lane` for its host's block, as a pass that found the host held writes it (a
    /// lane enqueued after the block, or one the block did not reach), if `origin` is still
    /// held: an unblock that committed first leaves the lane as it is, and one that commits
    /// after sees the pause and resumes it. Whether it paused.
    pub(crate) fn pause_if_held(
        db: &mut impl Db,
        lane: StoreLaneId,
        origin: &str,
    ) -> Result<bool, StoreError> {
        let held = db.query_opt(&HELD, args![origin], |r| r.int(0))?;
        if held.map(block_of) != Some(HostBlock::Hold) {
            return Ok(false);
        }
        pause_for_host(db, lane)
    }

    /// A lane's state as a pass reads a changed lane (`controls`).
    static LANE_STATE: Sql = Sql::new(concat!(
        "SELECT ",
        crate::lanes::pending_lane_cols!(),
        ", EXISTS (SELECT 1 FROM ol_units d WHERE d.lane_id = l.id AND d.state = 0) \
         FROM ol_lanes l WHERE l.id = $1"
    ));

    /// `lane`'s state now, as [`crate::lanes::controls`] lists a changed lane.
    pub(crate) fn lane_state(
        db: &mut impl Db,
        lane: StoreLaneId,
    ) -> Result<Option<crate::types::ChangedLane>, StoreError> {
        db.query_opt(&LANE_STATE, args![lane.0], |r| {
            Ok(crate::types::ChangedLane {
                state: crate::lanes::pending_lane(r, 0)?,
                pending: r.flag(crate::lanes::PENDING_LANE_COLS)?,
            })
        })
    }

    /// Resumes `lane` if it was paused for its host's block, and forgets its run of failures
    /// in any case ([`FORGET_RUN`]). Whether it resumed it.
    pub(crate) fn resume_for_host(db: &mut impl Db, lane: StoreLaneId) -> Result<bool, StoreError> {
        db.execute(&FORGET_RUN, args![lane.0])?;
        Ok(db.execute(&RESUME_FOR_HOST, args![lane.0, HOST_BLOCKED_REASON])? > 0)
    }

    /// Clears `lane`'s backoff and its run of failures for the operator's retry of its host.
    /// Whether it waited or was failing.
    pub(crate) fn retry_lane_for_host(
        db: &mut impl Db,
        lane: StoreLaneId,
    ) -> Result<bool, StoreError> {
        Ok(db.execute(&RETRY_FOR_HOST, args![lane.0])? > 0)
    }

    /// Per origin: (lanes, pending units), for the host list.
    pub(crate) fn usage(db: &mut impl Db) -> Result<Vec<(String, u64, u64)>, StoreError> {
        let rows = db.query(&PENDING, &[], |r| Ok((r.text(0)?, r.int(1)?)))?;
        let mut by: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for (url, pending) in rows {
            let Some(origin) = origin_of(&url) else {
                continue;
            };
            let e = by.entry(origin).or_default();
            e.0 += 1;
            e.1 += u64::try_from(pending).unwrap_or(0);
        }
        Ok(by.into_iter().map(|(o, (l, p))| (o, l, p)).collect())
    }
}

/// The pause reason of a lane held because an operator blocked its host.
pub const HOST_BLOCKED_REASON: &str = "host blocked by an operator";

/// A host as `outbox-lanes hosts` lists it: its row (or a fresh one for a host only lanes
/// know) and what waits for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostStatus {
    /// The host's row.
    pub record: HostRecord,
    /// Lanes whose recipient is on it.
    pub lanes: u64,
    /// Pending units of those lanes.
    pub pending: u64,
    /// Those lanes whose head a relay has had in flight for longer than
    /// [`IN_FLIGHT_MARK_AFTER`](crate::IN_FLIGHT_MARK_AFTER) (their in-flight marks, while
    /// their actors' drain slots are held; issue 39).
    pub in_flight_long: u64,
}

/// Every host that has a row or a lane, in origin order.
pub fn statuses(records: Vec<HostRecord>, usage: Vec<(String, u64, u64)>) -> Vec<HostStatus> {
    let mut by: std::collections::BTreeMap<String, HostStatus> = records
        .into_iter()
        .map(|r| {
            (
                r.origin.clone(),
                HostStatus {
                    record: r,
                    lanes: 0,
                    pending: 0,
                    in_flight_long: 0,
                },
            )
        })
        .collect();
    for (origin, lanes, pending) in usage {
        let e = by.entry(origin.clone()).or_insert_with(|| HostStatus {
            record: HostRecord::new(origin, Timestamp::from_millis(0)),
            lanes: 0,
            pending: 0,
            in_flight_long: 0,
        });
        e.lanes += lanes;
        e.pending += pending;
    }
    by.into_values().collect()
}

/// The origin of a recipient URL as the store keeps it (canonical since enqueue parsed it):
/// `scheme://host:port` with the port written out; `None` for a URL that does not parse.
pub fn origin_of(url: &str) -> Option<String> {
    let r = outbox_lanes_core::policy::Recipient::parse(url).ok()?;
    Some(format!(
        "{}://{}:{}",
        r.scheme().as_str(),
        r.host(),
        r.port()
    ))
}
