//! The driver's side of the store ([`DriverStore`]), written once for every backend: the drain
//! slot, a pass's lane states and dead letters, and the monitor's calls, over the operations
//! of `slots.rs`, `lanes.rs`, `dead_letters.rs` and `status.rs`. Each backend brings what is
//! its own ([`HotPath`]): the hot path of a pass (lanes with work, claim, payloads, ack,
//! attempt records, tuned per backend), how it finds slot holders that died, and how it
//! watches for enqueues of other processes.

use core::time::Duration;
use std::time::Instant;

use outbox_lanes_core::{ActorId, DeadReason, Timestamp, UnitId};

use crate::backend::Backend;
use crate::notify::Notifier;
use crate::types::{
    ActorsDue, AttemptRecord, ClaimRange, ClaimedLane, ControlRead, DeadLetterRequest,
    LaneControls, Payload, PendingLane, SlotAcquisition, SlotRelease, SlotToken, StoreLaneId,
    WrittenDeadLetter,
};
use crate::{DriverStore, StoreError, dead_letters, lanes, slots, status};

/// What a backend does its own way on the driver's side (see the module docs). The names
/// differ from [`DriverStore`]'s so that both traits can be in scope.
pub(crate) trait HotPath: Backend {
    /// Runs `f` in a write transaction fenced by `token` ([`StoreError::StaleToken`] and
    /// nothing written if the slot was lost).
    fn fenced<T>(
        &self,
        token: &SlotToken,
        idempotent: bool,
        mut f: impl FnMut(&mut Self::Writer<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.write(idempotent, |db| {
            slots::fence(db, token)?;
            f(db)
        })
    }

    /// Makes `holder` known as alive while this store lives (a failure only means that its
    /// slots are recovered by lease expiry instead).
    fn register_holder(&self, holder: &str);

    /// Ends, at once, the leases of holders (other than `us`) that are known to be dead; of
    /// `actor`'s slot only, or of every slot.
    fn expire_dead_holders(
        &self,
        db: &mut Self::Writer<'_>,
        us: &str,
        actor: Option<&ActorId>,
    ) -> Result<(), StoreError>;

    /// [`DriverStore::lanes_with_work`].
    fn find_lanes_with_work(
        &self,
        token: &SlotToken,
        since: u64,
    ) -> Result<(Vec<PendingLane>, u64), StoreError>;

    /// [`DriverStore::claim`].
    fn claim_units(
        &self,
        token: &SlotToken,
        lanes: &[ClaimRange],
    ) -> Result<Vec<ClaimedLane>, StoreError>;

    /// [`DriverStore::payload`].
    fn read_payload(&self, unit: UnitId) -> Result<Payload, StoreError>;

    /// [`DriverStore::payloads`].
    fn read_payloads(&self, units: &[UnitId]) -> Vec<Result<Payload, StoreError>> {
        units.iter().map(|u| self.read_payload(*u)).collect()
    }

    /// [`DriverStore::ack`].
    fn ack_units(
        &self,
        token: &SlotToken,
        delivered: &[(UnitId, StoreLaneId)],
    ) -> Result<(), StoreError>;

    /// [`DriverStore::record_attempts`].
    fn write_attempts(
        &self,
        token: &SlotToken,
        attempts: &[AttemptRecord],
    ) -> Result<(), StoreError>;

    /// [`DriverStore::check_database`].
    fn check_file(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// [`DriverStore::notifier`].
    fn wake_ups(&self) -> Notifier;

    /// [`DriverStore::watch`].
    fn start_watch(&self) -> Result<Notifier, StoreError>;
}

// `HotPath` is crate-private on purpose (sealed): only this crate's stores implement it.
#[allow(private_bounds)]
impl<B: HotPath> DriverStore for B {
    fn acquire_slot(
        &self,
        actor: &ActorId,
        holder: &str,
        lease: Duration,
    ) -> Result<SlotAcquisition, StoreError> {
        self.register_holder(holder);
        self.write(false, |db| {
            slots::acquire(db, actor, holder, lease, |db| {
                self.expire_dead_holders(db, holder, Some(actor))
            })
        })
    }

    fn renew_slot(&self, token: &SlotToken, lease: Duration) -> Result<(), StoreError> {
        self.write(true, |db| slots::renew(db, token, lease))
    }

    fn release_slot(&self, token: &SlotToken) -> Result<SlotRelease, StoreError> {
        self.write(false, |db| slots::release(db, token))
    }

    fn check_database(&self) -> Result<(), StoreError> {
        self.check_file()
    }

    fn free_slot(&self, token: &SlotToken) -> Result<(), StoreError> {
        self.write(false, |db| slots::free(db, token))
    }

    fn lanes_with_work(
        &self,
        token: &SlotToken,
        since: u64,
    ) -> Result<(Vec<PendingLane>, u64), StoreError> {
        self.find_lanes_with_work(token, since)
    }

    fn claim(
        &self,
        token: &SlotToken,
        lanes: &[ClaimRange],
    ) -> Result<Vec<ClaimedLane>, StoreError> {
        self.claim_units(token, lanes)
    }

    fn lane_controls(&self, token: &SlotToken, seen: u64) -> Result<LaneControls, StoreError> {
        let asked_at = Instant::now();
        let (generation, changed) = self.read(|db| lanes::controls(db, token, seen))?;
        Ok(LaneControls {
            read: ControlRead {
                generation,
                asked_at,
            },
            changed,
        })
    }

    fn payload(&self, unit: UnitId) -> Result<Payload, StoreError> {
        self.read_payload(unit)
    }

    fn payloads(&self, units: &[UnitId]) -> Vec<Result<Payload, StoreError>> {
        self.read_payloads(units)
    }

    fn ack(
        &self,
        token: &SlotToken,
        delivered: &[(UnitId, StoreLaneId)],
    ) -> Result<(), StoreError> {
        self.ack_units(token, delivered)
    }

    fn record_attempts(
        &self,
        token: &SlotToken,
        attempts: &[AttemptRecord],
    ) -> Result<(), StoreError> {
        self.write_attempts(token, attempts)
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
        self.fenced(token, true, |db| {
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
        self.fenced(token, true, |db| {
            lanes::set_backoff(db, token.actor().as_str(), lane, not_before, backoff_level)
        })
    }

    fn block_lane(
        &self,
        token: &SlotToken,
        lane: StoreLaneId,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.fenced(token, true, |db| {
            lanes::block(db, token.actor().as_str(), lane, reason)
        })
    }

    fn retire_lane(
        &self,
        token: &SlotToken,
        lane: StoreLaneId,
        at: Timestamp,
    ) -> Result<Vec<WrittenDeadLetter>, StoreError> {
        let retention = self.common().ack_retention.is_some();
        self.fenced(token, false, |db| {
            let actor = token.actor().as_str();
            let reason = DeadReason::LaneRetired;
            dead_letters::dead_letter_lane(db, actor, lane, reason, at, None, retention)
        })
    }

    fn actors_with_work(&self, now: Timestamp) -> Result<ActorsDue, StoreError> {
        self.read(|db| status::actors_with_work(db, now))
    }

    fn notifier(&self) -> Notifier {
        self.wake_ups()
    }

    fn watch(&self) -> Result<Notifier, StoreError> {
        self.start_watch()
    }

    fn hosts(&self) -> Result<Vec<crate::HostRecord>, StoreError> {
        self.read(|db| crate::hosts::all(db))
    }

    fn write_hosts(&self, hosts: &[crate::HostRecord]) -> Result<(), StoreError> {
        if hosts.is_empty() {
            return Ok(());
        }
        self.write(true, |db| crate::hosts::write(db, hosts))
    }

    fn outbox_id(&self) -> &str {
        Backend::outbox_id(self)
    }
}
