//! The lag an operator alerts on, told apart from what is held on purpose (issue 39): per
//! actor and per [`LaneHold`], how many lanes have pending units and when the oldest of their
//! heads was enqueued. A lane in backoff, throttled, paused or blocked waits by design; the
//! open lanes' oldest head is the lag of the relay itself.
//!
//! One statement, the cost of [`ServiceStore::oldest_pending`](crate::ServiceStore::oldest_pending)
//! (one index probe per lane, its head), grouped by the lane's state at `now`: no schema of
//! its own.

use outbox_lanes_core::{ActorId, Timestamp};

/// Why a lane with pending units does not start its head now, as [`crate::LaneState::of`]
/// tells it from the persisted lane columns (a pause wins over a backoff).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LaneHold {
    /// Not held: its head starts as soon as a pass reaches it.
    Open,
    /// A recipient's Retry-After, or its host's backoff (OL-21, a deferral), set its
    /// `not_before` in the future; backoff level 0.
    Throttled,
    /// The lane stalled (backoff level above 0) and waits for, or is in, its next probe.
    Backoff,
    /// An operator paused it (`lanes pause`).
    Paused,
    /// Paused for its host's block (`hosts block`).
    HostBlocked,
    /// A strict lane blocked on its failing head, waiting for an operator (OL-8).
    StrictBlocked,
}

impl LaneHold {
    /// Every hold but [`LaneHold::Open`], in this order.
    pub const HELD: [LaneHold; 5] = [
        LaneHold::Throttled,
        LaneHold::Backoff,
        LaneHold::Paused,
        LaneHold::HostBlocked,
        LaneHold::StrictBlocked,
    ];

    /// The snake_case name metrics give it: `open`, `throttled`, `backoff`, `paused`,
    /// `host_blocked`, `strict_blocked`.
    pub fn as_str(self) -> &'static str {
        match self {
            LaneHold::Open => "open",
            LaneHold::Throttled => "throttled",
            LaneHold::Backoff => "backoff",
            LaneHold::Paused => "paused",
            LaneHold::HostBlocked => "host_blocked",
            LaneHold::StrictBlocked => "strict_blocked",
        }
    }

    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
    fn parse(s: &str) -> Option<LaneHold> {
        [LaneHold::Open]
            .into_iter()
            .chain(LaneHold::HELD)
            .find(|h| h.as_str() == s)
    }
}

/// An actor's lanes with pending units in one [`LaneHold`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingHeads {
    /// The actor.
    pub actor: ActorId,
    /// Why these lanes wait (or [`LaneHold::Open`]: they do not).
    pub hold: LaneHold,
    /// How many lanes.
    pub lanes: u64,
    /// When the row of the oldest of their heads was enqueued.
    pub oldest: Timestamp,
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
pub(crate) use ops::*;

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod ops {
    use super::*;
    use crate::StoreError;
    use crate::db::{Db, Sql, args};
    use crate::hosts::HOST_BLOCKED_REASON;
    use crate::types::STRICT_BLOCKED_REASON;
    use crate::util::{millis_of, timestamp_of};

    /// Each lane's head as in `OLDEST_PENDING` (status.rs), with the lane's hold at `$1`;
    /// `$2` is the strict block's reason prefix as a `LIKE` pattern, `$3` the host block's
    /// reason.
    static PENDING_HEADS: Sql = Sql::new(
        "SELECT actor, hold, count(*), min(head) FROM (SELECT l.actor AS actor, \
         CASE WHEN l.paused AND l.pause_reason LIKE $2 THEN 'strict_blocked' \
              WHEN l.paused AND l.pause_reason = $3 THEN 'host_blocked' \
              WHEN l.paused THEN 'paused' \
              WHEN l.backoff_level > 0 THEN 'backoff' \
              WHEN l.not_before > $1 THEN 'throttled' \
              ELSE 'open' END AS hold, \
         (SELECT coalesce(h.enqueued_at, r.enqueued_at) FROM ol_units d \
          JOIN ol_units h ON h.id = coalesce(d.unit_id, d.id) LEFT JOIN ol_rows r ON r.id = h.row_ref \
          WHERE d.lane_id = l.id AND d.state = 0 ORDER BY d.seq, d.id LIMIT 1) AS head \
         FROM ol_lanes l) x WHERE head IS NOT NULL GROUP BY actor, hold ORDER BY actor, hold",
    );

    /// See [`ServiceStore::pending_heads`](crate::ServiceStore::pending_heads).
    pub(crate) fn pending_heads(
        db: &mut impl Db,
        now: Timestamp,
    ) -> Result<Vec<PendingHeads>, StoreError> {
        let strict = format!("{STRICT_BLOCKED_REASON}%");
        let rows = db.query(
            &PENDING_HEADS,
            args![millis_of(now), strict.as_str(), HOST_BLOCKED_REASON],
            |r| Ok((r.text(0)?, r.text(1)?, r.int(2)?, r.int(3)?)),
        )?;
        Ok(rows
            .into_iter()
            .filter_map(|(actor, hold, lanes, oldest)| {
                Some(PendingHeads {
                    actor: ActorId::new(actor),
                    hold: LaneHold::parse(&hold)?,
                    lanes: u64::try_from(lanes).unwrap_or(0),
                    oldest: timestamp_of(oldest),
                })
            })
            .collect())
    }
}
