//! [`DriverStore`] written once for every backend; the hot path (lanes with work, claims,
//! acks) comes from `sqlite_path.rs` or `pg_path.rs` by [`Backend::DIALECT`].

use core::time::Duration;
use std::time::Instant;

use outbox_lanes_core::{ActorId, DeadReason, Timestamp, UnitId};

use crate::backend::Backend;
use crate::db::Dialect;
use crate::hosts::{HostRecord, HostRows};
use crate::notify::Notifier;
use crate::types::{
    ActorsDue, AttemptRecord, ChangedLane, ClaimRange, ClaimedLane, ControlRead, DeadLetterRequest,
    DeliveryLogEntry, LaneControls, Payload, PendingLane, SlotAcquisition, SlotRelease, SlotToken,
    StoreLaneId, WrittenDeadLetter,
};
use crate::util::millis_of;
use crate::{
    DriverStore, StoreError, dead_letters, delivery_log, hosts, lanes, pg_path, slots, sqlite_path,
    status, units,
};

/// Runs `f` in a write transaction fenced by `token` ([`StoreError::StaleToken`] and nothing
/// written if the slot was lost).
fn fenced<B: Backend, T>(
    store: &B,
    token: &SlotToken,
    idempotent: bool,
    mut f: impl FnMut(&mut B::Conn<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    store.write(idempotent, |db| {
        slots::fence(db, token)?;
        f(db)
    })
}

// `Backend` is crate-private on purpose (sealed): only this crate's stores implement it.
#[allow(private_bounds)]
impl<B: Backend> DriverStore for B {
    fn acquire_slot(
        &self,
        actor: &ActorId,
        holder: &str,
        lease: Duration,
    ) -> Result<SlotAcquisition, StoreError> {
        self.register_holder(holder);
        self.write(false, |db| {
            slots::acquire(db, actor, holder, lease, |db, other| {
                self.holder_is_dead(db, other)
            })
        })
    }

    fn renew_slot(&self, token: &SlotToken, lease: Duration) -> Result<(), StoreError> {
        self.write(true, |db| slots::renew(db, token, lease))
    }

    fn release_slot(&self, token: &SlotToken) -> Result<SlotRelease, StoreError> {
        self.write(false, |db| slots::release(db, token))
    }

    fn free_slot(&self, token: &SlotToken) -> Result<(), StoreError> {
        self.write(false, |db| slots::free(db, token))
    }

    fn close_holder(&self, holder: &str) {
        self.release_holder(holder);
    }

    fn lanes_with_work(
        &self,
        token: &SlotToken,
        since: u64,
    ) -> Result<(Vec<PendingLane>, u64), StoreError> {
        self.read(|db| match B::DIALECT {
            Dialect::Sqlite => sqlite_path::lanes_with_work(db, token, since),
            Dialect::Postgres => pg_path::lanes_with_work(db, token, since),
        })
    }

    fn claim(
        &self,
        token: &SlotToken,
        lanes: &[ClaimRange],
    ) -> Result<Vec<ClaimedLane>, StoreError> {
        self.read(|db| match B::DIALECT {
            Dialect::Sqlite => sqlite_path::claim(db, token, lanes),
            Dialect::Postgres => pg_path::claim(db, token, lanes),
        })
    }

    fn lane_controls(&self, token: &SlotToken, seen: u64) -> Result<LaneControls, StoreError> {
        let asked_at = Instant::now();
        let (generation, hosts, changed) = self.read(|db| lanes::controls(db, token, seen))?;
        Ok(LaneControls {
            read: ControlRead {
                generation,
                asked_at,
            },
            hosts,
            changed,
        })
    }

    fn payload(&self, unit: UnitId) -> Result<Payload, StoreError> {
        self.read(|db| units::payload(db, unit))
    }

    fn payloads(&self, units: &[UnitId]) -> Vec<Result<Payload, StoreError>> {
        if units.is_empty() {
            return Vec::new();
        }
        // Postgres: one statement for the round's starts, never one round trip per unit.
        if B::DIALECT == Dialect::Postgres {
            return self
                .read(|db| units::payloads_pg(db, units))
                .unwrap_or_else(|e| units.iter().map(|_| Err(e.clone())).collect());
        }
        // SQLite: one read (one snapshot), a statement per unit in process (the claim brings
        // one-lane payloads, so this reads only joined units'); a lost connection reads them
        // all again, one unit's other error is that unit's.
        let all = self.read(|db| {
            let mut out = Vec::with_capacity(units.len());
            for u in units {
                match units::payload(db, *u) {
                    Err(e @ StoreError::ConnectionLost { .. }) => return Err(e),
                    one => out.push(one),
                }
            }
            Ok(out)
        });
        all.unwrap_or_else(|e| units.iter().map(|_| Err(e.clone())).collect())
    }

    fn ack(
        &self,
        token: &SlotToken,
        delivered: &[(UnitId, StoreLaneId)],
    ) -> Result<(), StoreError> {
        if delivered.is_empty() {
            return Ok(());
        }
        self.ack_logged(token, delivered, &[])
    }

    fn logs_deliveries(&self) -> bool {
        !self.common().delivery_log_retention.is_zero()
    }

    fn ack_logged(
        &self,
        token: &SlotToken,
        delivered: &[(UnitId, StoreLaneId)],
        log: &[DeliveryLogEntry],
    ) -> Result<(), StoreError> {
        if delivered.is_empty() {
            return Ok(());
        }
        let log = if self.logs_deliveries() { log } else { &[] };
        let retention = self.common().ack_retention.is_some();
        match B::DIALECT {
            Dialect::Sqlite => fenced(self, token, true, |db| {
                let taken = sqlite_path::ack(db, token, delivered, retention)?;
                let log = delivery_log::taken_once(log, taken);
                delivery_log::write(db, token.actor().as_str(), &log)
            }),
            Dialect::Postgres => pg_path::ack(self, token, delivered, log, retention),
        }
    }

    fn record_attempts_logged(
        &self,
        token: &SlotToken,
        attempts: &[AttemptRecord],
        log: &[DeliveryLogEntry],
    ) -> Result<(), StoreError> {
        let log = if self.logs_deliveries() { log } else { &[] };
        if attempts.is_empty() && log.is_empty() {
            return Ok(());
        }
        fenced(self, token, true, |db| {
            let actor = token.actor().as_str();
            units::record_attempts(db, actor, attempts)?;
            delivery_log::write(db, actor, log)
        })
    }

    fn mark_in_flight(
        &self,
        token: &SlotToken,
        marks: &[(StoreLaneId, Option<(UnitId, Timestamp)>)],
    ) -> Result<(), StoreError> {
        if marks.is_empty() {
            return Ok(());
        }
        fenced(self, token, true, |db| {
            delivery_log::mark(db, token.actor().as_str(), marks)
        })
    }

    fn record_attempts(
        &self,
        token: &SlotToken,
        attempts: &[AttemptRecord],
    ) -> Result<(), StoreError> {
        fenced(self, token, true, |db| {
            units::record_attempts(db, token.actor().as_str(), attempts)
        })
    }

    fn write_dead_letters(
        &self,
        token: &SlotToken,
        dead: &[DeadLetterRequest],
    ) -> Result<Vec<Option<WrittenDeadLetter>>, StoreError> {
        if dead.is_empty() {
            return Ok(Vec::new());
        }
        let retention = self.common().ack_retention.is_some();
        // Idempotent: a second run finds the dead letters the first one wrote.
        fenced(self, token, true, |db| {
            let actor = token.actor().as_str();
            dead.iter()
                .map(|d| dead_letters::dead_letter_once(db, actor, d, retention))
                .collect()
        })
    }

    fn set_lane_state(
        &self,
        token: &SlotToken,
        lane: StoreLaneId,
        not_before: Option<Timestamp>,
        backoff_level: u32,
    ) -> Result<(), StoreError> {
        fenced(self, token, true, |db| {
            lanes::set_backoff(db, token.actor().as_str(), lane, not_before, backoff_level)
        })
    }

    fn block_lane(
        &self,
        token: &SlotToken,
        lane: StoreLaneId,
        reason: &str,
    ) -> Result<(), StoreError> {
        fenced(self, token, true, |db| {
            lanes::block(db, token.actor().as_str(), lane, reason)
        })
    }

    fn set_lane_failing(
        &self,
        token: &SlotToken,
        lane: StoreLaneId,
        since: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        fenced(self, token, true, |db| {
            lanes::set_failing(db, token.actor().as_str(), lane, since)
        })
    }

    fn set_lane_unavailable(
        &self,
        token: &SlotToken,
        lane: StoreLaneId,
        at: Timestamp,
    ) -> Result<(), StoreError> {
        fenced(self, token, true, |db| {
            lanes::set_unavailable(db, token.actor().as_str(), lane, at)
        })
    }

    fn retire_lane(
        &self,
        token: &SlotToken,
        lane: StoreLaneId,
        at: Timestamp,
        reason: DeadReason,
    ) -> Result<Vec<WrittenDeadLetter>, StoreError> {
        let retention = self.common().ack_retention.is_some();
        fenced(self, token, false, |db| {
            let actor = token.actor().as_str();
            dead_letters::dead_letter_lane(db, actor, lane, reason, at, None, retention)
        })
    }

    fn check_database(&self) -> Result<(), StoreError> {
        Backend::check_database(self)
    }

    fn actors_with_work(&self, now: Timestamp) -> Result<ActorsDue, StoreError> {
        self.read(|db| status::actors_with_work(db, now))
    }

    fn notifier(&self) -> Notifier {
        self.shared().notifier.clone()
    }

    fn watch(&self) -> Result<Notifier, StoreError> {
        Backend::watch(self)
    }

    fn use_threads(&self, threads: std::sync::Arc<dyn crate::SpawnThread>) {
        *self
            .shared()
            .threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = threads;
    }

    fn outbox_id(&self) -> &str {
        &self.shared().outbox_id
    }

    fn upkeep(&self, now: Timestamp) -> Result<(u64, u64), StoreError> {
        // Both are tried, whichever fails.
        let forgotten = crate::ServiceStore::purge_row_ids(self, now);
        let purged = match self.common().ack_retention {
            Some(keep) => crate::ServiceStore::purge_acked(self, now.saturating_sub(keep)),
            None => Ok(0),
        };
        // The delivery log past its window. With the log off, nothing: another relay on the
        // same database may keep one.
        let keep = self.common().delivery_log_retention;
        let before = millis_of(now.saturating_sub(keep));
        let mut logged = Ok(());
        while !keep.is_zero() && logged.is_ok() {
            match self.write(true, |db| delivery_log::purge_once(db, before)) {
                Ok(n) if n < delivery_log::PURGE_BATCH as u64 => break,
                Ok(_) => {}
                Err(e) => logged = Err(e),
            }
        }
        let (forgotten, purged) = (forgotten?, purged?);
        logged?;
        Ok((forgotten, purged))
    }

    fn hosts(&self) -> Result<HostRows, StoreError> {
        self.read(|db| hosts::all(db))
    }

    fn pause_for_host(
        &self,
        token: &SlotToken,
        lanes: &[(StoreLaneId, String)],
    ) -> Result<Vec<ChangedLane>, StoreError> {
        if lanes.is_empty() {
            return Ok(Vec::new());
        }
        fenced(self, token, true, |db| {
            let mut states = Vec::with_capacity(lanes.len());
            for (lane, origin) in lanes {
                hosts::pause_if_held(db, *lane, origin)?;
                states.extend(hosts::lane_state(db, *lane)?);
            }
            Ok(states)
        })
    }

    fn write_hosts(&self, hosts: &[HostRecord]) -> Result<(), StoreError> {
        if hosts.is_empty() {
            return Ok(());
        }
        self.write(true, |db| hosts::write(db, hosts))
    }
}
