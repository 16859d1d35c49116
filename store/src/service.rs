//! The user's side of the store ([`ServiceStore`]), written once for every [`Backend`]: each
//! method opens the backend's read or write transaction and runs the shared operation of its
//! concern (`status`, `lanes`, `dead_letters`, `units`).

use std::time::SystemTime;

use outbox_lanes_core::policy::AddressPolicy;
use outbox_lanes_core::{ActorId, DeadReason, LaneKey, Timestamp, UnitId};

use crate::backend::Backend;
use crate::db::{Db, Sql, args, ready};
use crate::destinations::{self, PolicyChange, covers};
use crate::enqueue::{NOTIFY, enqueue};
use crate::hosts::{HostBlock, HostStatus};
use crate::prepare::{check_stored_policy, prepare};
use crate::types::{
    ActorStatus, CONTROL_VALIDITY, DeadLetter, DeadLetterId, DeadLetterSelection, Enqueued,
    LaneStatus, NewRow, Payload,
};
use crate::units::drop_row_if_unused;
use crate::util::{millis_of, window_millis};
use crate::{
    EnqueueError, ServiceStore, StoreError, StoreLaneId, dead_letters, hosts, lanes, row_ids,
    status,
};

/// Deletes the finished units kept for the retention that finished before `$1`, returning
/// their payload rows.
static PURGE_RETAINED: Sql =
    Sql::new("DELETE FROM ol_units WHERE acked_at IS NOT NULL AND acked_at < $1 RETURNING row_ref");

/// Tells the other processes that `actors` have work, inside the transaction (Postgres
/// `NOTIFY`, delivered at the commit; SQLite's watchers see every commit by themselves).
fn notify_others<B: Backend>(
    store: &B,
    db: &mut B::Conn<'_>,
    actors: &[ActorId],
) -> Result<(), StoreError> {
    if let Some(channel) = store.shared().channel.as_deref() {
        for a in actors {
            db.execute(&NOTIFY, args![channel, a.as_str()])?;
        }
    }
    Ok(())
}

/// Whether a lane action must reach running passes before it returns (OL-14): the actions
/// after which no unit of the lane may start as it would have before (pause, purge,
/// skip-head, strict). The others (resume, retry, unstrict) let more start, and are picked up
/// by a pass at its next read of the generation.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reach {
    BeforeReturn,
    NextRead,
}

/// An operator action on `lane`: `f` in one transaction with the bump of the actor's control
/// generation (OL-14), then the wake-ups. With [`Reach::BeforeReturn`] and a pass holding the
/// slot at the commit, it returns [`CONTROL_VALIDITY`] after the commit (see there), else at once.
fn lane_action<B: Backend, T>(
    store: &B,
    lane: StoreLaneId,
    idempotent: bool,
    reach: Reach,
    mut f: impl FnMut(&mut B::Conn<'_>, &str) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let (v, held) = store.write(idempotent, |db| {
        let bumped = lanes::bump_control(db, lane)?;
        let v = f(db, bumped.actor.as_str())?;
        notify_others(store, db, std::slice::from_ref(&bumped.actor))?;
        Ok::<_, StoreError>((v, bumped.held))
    })?;
    store.shared().notifier.notify();
    if held && reach == Reach::BeforeReturn {
        std::thread::sleep(CONTROL_VALIDITY);
    }
    Ok(v)
}

/// An operator's action on a host and every lane of it, in one transaction with the bump of
/// the operators' host-control generation and of the lanes' actors' control generations
/// (OL-14, extended to hosts): `first` acts on the host's row, `f` on one lane and returns
/// how many units or lanes it changed. Returns the total once the action reaches running
/// passes: [`CONTROL_VALIDITY`] after the commit when any drain slot is held, since a pass of
/// any actor may meet the host in a lane enqueued later (one wait for everything).
fn host_lanes_action<B: Backend>(
    store: &B,
    origin: &str,
    mut first: impl FnMut(&mut B::Conn<'_>) -> Result<(), StoreError>,
    mut f: impl FnMut(&mut B::Conn<'_>, &str, StoreLaneId) -> Result<u64, StoreError>,
) -> Result<u64, StoreError> {
    let (n, held) = store.write(false, |db| {
        let mut held = hosts::bump_generation(db)?;
        first(db)?;
        let mut n = 0;
        let mut actors: Vec<ActorId> = Vec::new();
        for lane in hosts::lanes_of(db, origin)? {
            let bumped = lanes::bump_control(db, lane)?;
            n += f(db, bumped.actor.as_str(), lane)?;
            held |= bumped.held;
            if !actors.contains(&bumped.actor) {
                actors.push(bumped.actor);
            }
        }
        notify_others(store, db, &actors)?;
        Ok::<_, StoreError>((n, held))
    })?;
    store.shared().notifier.notify();
    if held {
        std::thread::sleep(CONTROL_VALIDITY);
    }
    Ok(n)
}

// `Backend` is crate-private on purpose (sealed): only this crate's stores implement it.
#[allow(private_bounds)]
impl<B: Backend> ServiceStore for B {
    fn row_deliveries(
        &self,
        actor: &ActorId,
        row_id: &str,
    ) -> Result<Vec<crate::RowDelivery>, StoreError> {
        self.read(|db| crate::delivery_log::row_deliveries(db, actor, row_id))
    }

    fn lanes_in_flight(&self) -> Result<Vec<crate::LaneInFlight>, StoreError> {
        self.read(|db| crate::delivery_log::in_flight(db))
    }

    fn delivery_log(
        &self,
        actor: &ActorId,
        row_id: &str,
    ) -> Result<Vec<crate::DeliveryLogRow>, StoreError> {
        self.read(|db| crate::delivery_log::read(db, actor.as_str(), row_id))
    }

    fn host_figures(&self, since: Timestamp) -> Result<Vec<crate::HostFigures>, StoreError> {
        self.read(|db| crate::delivery_log::host_figures(db, since))
    }

    fn host_list(&self) -> Result<Vec<HostStatus>, StoreError> {
        let (records, usage, flying) = self.read(|db| {
            Ok((
                hosts::all(db)?,
                hosts::usage(db)?,
                crate::delivery_log::in_flight(db)?,
            ))
        })?;
        let mut out = hosts::statuses(records.hosts, usage);
        for l in flying {
            let origin = hosts::origin_of(l.key.recipient());
            if let Some(h) = out
                .iter_mut()
                .find(|h| Some(&h.record.origin) == origin.as_ref())
            {
                h.in_flight_long += 1;
            }
        }
        Ok(out)
    }

    fn block_host(&self, origin: &str, block: HostBlock, at: Timestamp) -> Result<u64, StoreError> {
        let retention = self.common().ack_retention.is_some();
        host_lanes_action(
            self,
            origin,
            |db| hosts::set_block(db, origin, block, at),
            |db, actor, lane| match block {
                HostBlock::Hold => Ok(u64::from(hosts::pause_for_host(db, lane)?)),
                HostBlock::DeadLetter => {
                    let dead = dead_letters::dead_letter_lane(
                        db,
                        actor,
                        lane,
                        DeadReason::Blocked,
                        at,
                        None,
                        retention,
                    )?;
                    Ok(dead.len() as u64)
                }
                HostBlock::Open => Ok(u64::from(hosts::resume_for_host(db, lane)?)),
            },
        )
    }

    fn retry_host(&self, origin: &str, at: Timestamp) -> Result<u64, StoreError> {
        host_lanes_action(
            self,
            origin,
            |db| hosts::reset(db, origin, at).map(drop),
            |db, _, lane| Ok(u64::from(hosts::retry_lane_for_host(db, lane)?)),
        )
    }

    fn enqueue(&self, actor: &ActorId, rows: &[NewRow]) -> Result<Vec<Enqueued>, EnqueueError> {
        let prepared = prepare(rows, self.common())?;
        if prepared.is_empty() {
            return Ok(Vec::new());
        }
        // In a transaction even when it is one statement: a statement that fails before the
        // COMMIT is sent certainly did not commit, so it is retried on a new connection.
        let (channel, common) = (self.shared().channel.as_deref(), self.common());
        let out = self.write(false, |db| {
            let out = ready(enqueue(db, actor, &prepared, channel, common))?;
            ready(check_stored_policy(db, &prepared))?;
            Ok::<_, EnqueueError>(out)
        })?;
        self.shared().notifier.notify();
        Ok(out)
    }

    fn destination_policy(&self) -> Result<AddressPolicy, StoreError> {
        self.read(|db| ready(destinations::read(db)))
    }

    fn widen_destination_policy(&self, wanted: AddressPolicy) -> Result<PolicyChange, StoreError> {
        // A read first: the usual answer (it allows that already) needs no write access.
        let before = self.destination_policy()?;
        if covers(before, wanted) {
            return Ok(PolicyChange {
                before,
                after: before,
                undid_narrowing: false,
            });
        }
        self.write(true, |db| destinations::widen(db, wanted))
    }

    fn set_destination_policy(&self, policy: AddressPolicy) -> Result<PolicyChange, StoreError> {
        self.write(false, |db| destinations::set(db, policy))
    }

    fn status(&self) -> Result<Vec<ActorStatus>, StoreError> {
        let now = Timestamp::from_system_time(SystemTime::now());
        self.read(|db| status::status(db, now))
    }

    fn lanes(&self, actor: &ActorId) -> Result<Vec<LaneStatus>, StoreError> {
        self.read(|db| lanes::list(db, actor))
    }

    fn lane_status(&self, lane: StoreLaneId) -> Result<Option<LaneStatus>, StoreError> {
        self.read(|db| lanes::one(db, lane))
    }

    fn knows_actor(&self, actor: &ActorId) -> Result<bool, StoreError> {
        self.read(|db| lanes::known_actor(db, actor))
    }

    fn dead_letters(&self, actor: Option<&ActorId>) -> Result<Vec<DeadLetter>, StoreError> {
        self.read(|db| dead_letters::list(db, actor))
    }

    fn select_dead_letters(
        &self,
        which: &DeadLetterSelection,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        self.read(|db| dead_letters::selected(db, which))
    }

    fn replay_dead_letters(&self, which: &DeadLetterSelection) -> Result<Vec<UnitId>, StoreError> {
        let units = self.write(false, |db| {
            let (units, actors) = dead_letters::replay(db, which)?;
            notify_others(self, db, &actors)?;
            Ok::<_, StoreError>(units)
        })?;
        self.shared().notifier.notify();
        Ok(units)
    }

    fn purge_dead_letters(&self, which: &DeadLetterSelection) -> Result<u64, StoreError> {
        self.write(false, |db| dead_letters::purge(db, which))
    }

    fn dead_letter_payload(&self, id: DeadLetterId) -> Result<Payload, StoreError> {
        self.read(|db| dead_letters::payload(db, id))
    }

    fn oldest_pending(&self) -> Result<Vec<(ActorId, Timestamp)>, StoreError> {
        self.read(|db| status::oldest_pending(db))
    }

    fn pending_heads(&self, now: Timestamp) -> Result<Vec<crate::PendingHeads>, StoreError> {
        self.read(|db| crate::lag::pending_heads(db, now))
    }

    fn pause_lane(&self, lane: StoreLaneId, reason: &str) -> Result<(), StoreError> {
        lane_action(self, lane, true, Reach::BeforeReturn, |db, _| {
            lanes::pause(db, lane, reason)
        })
    }

    fn resume_lane(&self, lane: StoreLaneId) -> Result<(), StoreError> {
        lane_action(self, lane, true, Reach::NextRead, |db, _| {
            lanes::resume(db, lane)
        })
    }

    fn retry_lane_now(&self, lane: StoreLaneId) -> Result<(), StoreError> {
        lane_action(self, lane, true, Reach::NextRead, |db, _| {
            lanes::retry_now(db, lane)
        })
    }

    fn purge_lane(&self, lane: StoreLaneId, at: Timestamp) -> Result<u64, StoreError> {
        let retention = self.common().ack_retention.is_some();
        lane_action(self, lane, false, Reach::BeforeReturn, |db, actor| {
            let purged = dead_letters::dead_letter_lane(
                db,
                actor,
                lane,
                DeadReason::Purged,
                at,
                None,
                retention,
            )?;
            Ok(purged.len() as u64)
        })
    }

    fn skip_lane_head(
        &self,
        lane: StoreLaneId,
        at: Timestamp,
    ) -> Result<Option<UnitId>, StoreError> {
        let retention = self.common().ack_retention.is_some();
        lane_action(self, lane, false, Reach::BeforeReturn, |db, actor| {
            let skipped = dead_letters::dead_letter_lane(
                db,
                actor,
                lane,
                DeadReason::Skipped,
                at,
                Some(1),
                retention,
            )?;
            lanes::retry_now(db, lane)?;
            Ok(skipped.first().map(|d| d.unit))
        })
    }

    fn set_lane_strict(&self, lane: StoreLaneId, strict: bool) -> Result<(), StoreError> {
        let reach = if strict {
            Reach::BeforeReturn
        } else {
            Reach::NextRead
        };
        lane_action(self, lane, true, reach, |db, _| {
            lanes::set_strict(db, lane, strict)
        })
    }

    fn find_lane(&self, actor: &ActorId, key: &LaneKey) -> Result<Option<StoreLaneId>, StoreError> {
        self.read(|db| lanes::find(db, actor, key))
    }

    fn purge_acked(&self, older_than: Timestamp) -> Result<u64, StoreError> {
        self.write(true, |db| {
            let done = db.query(&PURGE_RETAINED, args![millis_of(older_than)], |r| {
                r.opt_int(0)
            })?;
            let mut rows: Vec<i64> = done.iter().flatten().copied().collect();
            rows.sort_unstable();
            rows.dedup();
            for row_ref in rows {
                drop_row_if_unused(db, row_ref)?;
            }
            Ok(done.len() as u64)
        })
    }

    fn purge_row_ids(&self, now: Timestamp) -> Result<u64, StoreError> {
        let before = millis_of(now).saturating_sub(window_millis(self.common()));
        let mut total = 0;
        // Bounded statements, each its own short transaction: the write lock is never held
        // for the whole backlog.
        loop {
            let n = self.write(true, |db| row_ids::purge_once(db, before))?;
            total += n;
            if n < row_ids::PURGE_BATCH as u64 {
                return Ok(total);
            }
        }
    }
}
