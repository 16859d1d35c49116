//! The drain slot of each actor (OL-12), written once for both backends: taking it with a
//! fresh fencing token, renewing its lease, releasing it (or keeping it when "look again" was
//! set), checking a token.
//!
//! Each backend brings its own way of knowing that a holder died (SQLite: lock files; Postgres:
//! session advisory locks), as the `is_dead` of [`acquire`].

use core::time::Duration;
use std::time::Instant;

use outbox_lanes_core::ActorId;

use crate::StoreError;
use crate::db::{Db, Sql, args};
use crate::types::{ControlRead, SlotAcquisition, SlotRelease, SlotToken};
use crate::util::{to_i64, to_u64};

fn lease_ms(lease: Duration) -> i64 {
    crate::util::to_i64(lease.as_millis())
}

static ENSURE: Sql =
    Sql::new("INSERT INTO ol_slots (actor) VALUES ($1) ON CONFLICT (actor) DO NOTHING");
static TAKE_IF_FREE: Sql = Sql::new(
    "UPDATE ol_slots SET token = token + 1, holder = $2, lease_expires = {now} + $3, look_again = FALSE \
     WHERE actor = $1 AND (holder IS NULL OR lease_expires <= {now}) RETURNING token, control",
);
static LOOK_AGAIN: Sql = Sql::new("UPDATE ol_slots SET look_again = TRUE WHERE actor = $1");

/// Another holder's live slot of actor `$1`, if any (`$2`: the one asking).
static LIVE_HOLDER: Sql = Sql::new(
    "SELECT holder FROM ol_slots WHERE actor = $1 AND holder IS NOT NULL AND holder <> $2 \
     AND lease_expires > {now}",
);
static EXPIRE_HOLDER: Sql = Sql::new("UPDATE ol_slots SET lease_expires = 0 WHERE holder = $1");
/// Whether holder `$1` holds a drain slot whose lease runs.
static HOLDS_A_SLOT: Sql =
    Sql::new("SELECT EXISTS (SELECT 1 FROM ol_slots WHERE holder = $1 AND lease_expires > {now})");

/// Whether `holder` holds a drain slot whose lease runs (a stopping holder that does keeps
/// its liveness listed, so that other relays find it dead and take its slots over at once).
///
/// # Errors
/// Database failures.
pub(crate) fn holds_a_slot(db: &mut impl Db, holder: &str) -> Result<bool, StoreError> {
    db.query_one(&HOLDS_A_SLOT, args![holder], |r| r.flag(0))
}

/// Takes `actor`'s slot if it is free or its lease expired; else sets "look again". When
/// another holder's lease is live and `is_dead` says that holder is gone (the backend's
/// liveness: lock files, advisory locks), every slot it held ends at once and is taken over
/// with a new fencing token, instead of after its lease.
pub(crate) fn acquire<D: Db>(
    db: &mut D,
    actor: &ActorId,
    holder: &str,
    lease: Duration,
    is_dead: impl FnOnce(&mut D, &str) -> Result<bool, StoreError>,
) -> Result<SlotAcquisition, StoreError> {
    db.execute(&ENSURE, args![actor.as_str()])?;
    if let Some(other) = db.query_opt(&LIVE_HOLDER, args![actor.as_str(), holder], |r| r.text(0))? {
        if is_dead(db, &other)? {
            let n = db.execute(&EXPIRE_HOLDER, args![&other])?;
            tracing::info!(target: "outbox_lanes::store", holder = %other, slots = n,
                "the holder of these drain slots is gone (its process or session ended): taken over without waiting for the lease");
        }
    }
    let asked_at = Instant::now();
    let got = db.query_opt(
        &TAKE_IF_FREE,
        args![actor.as_str(), holder, lease_ms(lease)],
        |r| Ok((r.int(0)?, r.int(1)?)),
    )?;
    match got {
        Some((t, generation)) => Ok(SlotAcquisition::Acquired(SlotToken::new(
            actor.clone(),
            to_u64(t),
            holder.to_string(),
            ControlRead {
                generation: to_u64(generation),
                asked_at,
            },
        ))),
        None => {
            db.execute(&LOOK_AGAIN, args![actor.as_str()])?;
            Ok(SlotAcquisition::Held)
        }
    }
}

static RENEW: Sql = Sql::new(
    "UPDATE ol_slots SET lease_expires = {now} + $3 WHERE actor = $1 AND token = $2 \
     AND holder IS NOT NULL AND lease_expires > {now}",
);

/// Extends a held slot's lease to `lease` from now; [`StoreError::StaleToken`] if it was lost.
pub(crate) fn renew(
    db: &mut impl Db,
    token: &SlotToken,
    lease: Duration,
) -> Result<(), StoreError> {
    let fencing = to_i64(token.fencing());
    match db.execute(
        &RENEW,
        args![token.actor().as_str(), fencing, lease_ms(lease)],
    )? {
        0 => Err(stale(token)),
        _ => Ok(()),
    }
}

/// The live slot's "look again" flag, locked on Postgres until the release commits.
static LOOK_AGAIN_OF_LIVE: Sql = Sql::new(
    "SELECT look_again FROM ol_slots WHERE actor = $1 AND token = $2 AND holder IS NOT NULL \
     AND lease_expires > {now} {lock}",
);
static CLEAR_LOOK_AGAIN: Sql = Sql::new("UPDATE ol_slots SET look_again = FALSE WHERE actor = $1");
static FREE: Sql =
    Sql::new("UPDATE ol_slots SET holder = NULL, lease_expires = 0 WHERE actor = $1");

/// Releases the slot, unless "look again" was set: then the flag is cleared and it is kept.
pub(crate) fn release(db: &mut impl Db, token: &SlotToken) -> Result<SlotRelease, StoreError> {
    let actor = token.actor().as_str();
    let fencing = to_i64(token.fencing());
    match db.query_opt(&LOOK_AGAIN_OF_LIVE, args![actor, fencing], |r| r.flag(0))? {
        None => Err(stale(token)),
        Some(true) => {
            db.execute(&CLEAR_LOOK_AGAIN, args![actor])?;
            Ok(SlotRelease::LookAgain)
        }
        Some(false) => {
            db.execute(&FREE, args![actor])?;
            Ok(SlotRelease::Released)
        }
    }
}

static FREE_LIVE: Sql = Sql::new(
    "UPDATE ol_slots SET holder = NULL, lease_expires = 0, look_again = FALSE \
     WHERE actor = $1 AND token = $2 AND holder IS NOT NULL AND lease_expires > {now}",
);

/// Releases the slot whatever its "look again" flag (the holder will not look again itself;
/// whoever asked finds the actor with work and the slot free).
pub(crate) fn free(db: &mut impl Db, token: &SlotToken) -> Result<(), StoreError> {
    let fencing = to_i64(token.fencing());
    match db.execute(&FREE_LIVE, args![token.actor().as_str(), fencing])? {
        0 => Err(stale(token)),
        _ => Ok(()),
    }
}

/// The token's slot is held and its lease live (Postgres: the slot row is share-locked to the
/// commit, so a release or takeover waits for this transaction).
static FENCE: Sql = Sql::with_sqlite(
    "SELECT 1 FROM ol_slots WHERE actor = $1 AND token = $2 AND holder IS NOT NULL \
     AND lease_expires > {now} FOR SHARE",
    "SELECT 1 FROM ol_slots WHERE actor = $1 AND token = $2 AND holder IS NOT NULL \
     AND lease_expires > {now}",
);

/// Checks the token in the caller's transaction: [`StoreError::StaleToken`] unless its slot is
/// held and its lease live.
pub(crate) fn fence(db: &mut impl Db, token: &SlotToken) -> Result<(), StoreError> {
    let fencing = to_i64(token.fencing());
    match db.query_opt(&FENCE, args![token.actor().as_str(), fencing], |_| Ok(()))? {
        Some(()) => Ok(()),
        None => Err(stale(token)),
    }
}

/// The error of a token whose slot was lost (logged: a pass that sees it ends).
pub(crate) fn stale(token: &SlotToken) -> StoreError {
    tracing::debug!(target: "outbox_lanes::store", actor = token.actor().as_str(),
        fencing = token.fencing(), "stale drain-slot token refused");
    StoreError::StaleToken
}
