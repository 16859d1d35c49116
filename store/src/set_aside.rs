//! An attempt that ends after an operator set its unit aside (`lanes purge`, `lanes
//! skip-head`, `hosts block --dead-letter`, OL-14): its record, or its delivery, lands on the
//! dead letter the operator wrote for it, if there is one. Written once for both backends;
//! the Postgres hot path's set-based ack uses `operator_reasons!` too.

use crate::db::{Db, Sql, args};
use crate::types::DELIVERED_AFTER_SET_ASIDE;
use crate::{StoreError, StoreLaneId};

/// The newest dead letter an operator wrote (purge, skip-head, a host block with dead letters)
/// for unit `$1` in lane `$2` of actor `$A`: the one an attempt that was in flight then
/// belongs to. (Scans the actor's dead letters, on a path taken only when an attempt's unit
/// was no longer pending.)
macro_rules! set_aside {
    ($actor:literal) => {
        concat!(
            "(SELECT max(x.id) FROM ol_dead_letters x WHERE x.actor = ",
            $actor,
            " AND x.unit_id = $1 AND x.lane_id = $2 AND x.reason IN ",
            operator_reasons!(),
            ")"
        )
    };
}

/// The reasons of the dead letters an operator writes while an attempt may be in flight
/// (`lanes purge`, `lanes skip-head`, `hosts block --dead-letter`), as an SQL list.
macro_rules! operator_reasons {
    () => {
        "('purged', 'skipped', 'blocked')"
    };
}
#[cfg_attr(not(feature = "postgres"), allow(unused_imports))]
pub(crate) use operator_reasons;

/// An attempt record for unit `$1` in lane `$2` of actor `$7` that was no longer pending
/// (OL-14): counts, status, error and time `$3`…`$6` (`RECORD_ATTEMPT`'s) land on the dead
/// letter an operator wrote for it while the attempt was in flight, if there is one. The
/// count is absolute, as in the unit's own record, so a retried write is harmless.
pub(crate) static RECORD_ON_SET_ASIDE: Sql = Sql::new(concat!(
    "UPDATE ol_dead_letters SET attempts = CASE WHEN attempts > $3 THEN attempts ELSE $3 END, \
     last_status = $4, last_error = $5, first_attempt_at = coalesce(first_attempt_at, $6), \
     last_attempt_at = $6 WHERE id = ",
    set_aside!("$7")
));

/// An ack of unit `$1` in lane `$2` of actor `$3` that was no longer pending (OL-14): its
/// operator dead letter counts the delivery and says so (`$4`,
/// [`DELIVERED_AFTER_SET_ASIDE`]); the check of `$4` keeps a retried ack from counting twice.
static DELIVERED_ON_SET_ASIDE: Sql = Sql::new(concat!(
    "UPDATE ol_dead_letters SET attempts = attempts + 1, last_status = NULL, last_error = $4, \
     first_attempt_at = coalesce(first_attempt_at, {now}), last_attempt_at = {now} \
     WHERE coalesce(last_error, '') <> $4 AND id = ",
    set_aside!("$3")
));

/// Records a delivery of a unit that was no longer pending in its lane on the dead letter an
/// operator wrote for it while the attempt was in flight, if there is one. Returns whether it
/// did (not for an ack sent again: the letter has it already).
pub(crate) fn delivered_on_set_aside(
    db: &mut impl Db,
    actor: &str,
    unit: i64,
    lane: StoreLaneId,
) -> Result<bool, StoreError> {
    let n = db.execute(
        &DELIVERED_ON_SET_ASIDE,
        args![unit, lane.0, actor, DELIVERED_AFTER_SET_ASIDE],
    )?;
    Ok(n > 0)
}
