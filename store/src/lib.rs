//! The store of outbox-lanes: the [`Store`] trait, SQLite (embedded default, feature
//! `sqlite`) and Postgres (feature `postgres`); feature `sqlx` enqueues in a caller's sqlx
//! transaction and runs the relay's Postgres store on a caller's sqlx pool (`SqlxPgStore`,
//! for plain and `require` connections; [`PgStore`] for `verify-ca` / `verify-full`).
//!
//! [`Store`] is two traits: [`DriverStore`], what a pass and the monitor call, and
//! [`ServiceStore`], what the embedding service and the operator's CLI call.
//!
//! `docs/ARCHITECTURE.md` (§ `store/`) says which module does what.
//!
//! # How a pass uses the store
//!
//! 0. The monitor finds work with [`DriverStore::actors_with_work`], woken by
//!    [`DriverStore::watch`].
//! 1. [`DriverStore::acquire_slot`] takes the actor's drain slot (OL-12). Nothing is written per
//!    unit at claim time: the slot's lease *is* the lease of every unit the pass reads. A
//!    crash lets the lease expire, and the next holder reads every lane from its head again
//!    (at-least-once, OL-16).
//! 2. [`DriverStore::lanes_with_work`] lists lanes with pending units (and, with a watermark, only
//!    lanes that received units since the last look — admission streams, OL-3).
//! 3. [`DriverStore::claim`] reads the next few units at the heads of chosen lanes, from a cursor,
//!    at a cost proportional to what it returns, never to a lane's depth.
//!    Before it starts attempts, a pass makes sure it has read the actor's lane-control
//!    generation within [`CONTROL_VALIDITY`] ([`DriverStore::lane_controls`]; the token's
//!    acquisition is the first read): an operator's pause, purge, skip-head or strict reaches
//!    it before its next start (OL-14).
//! 4. [`DriverStore::payload`] fetches a unit's bytes when it starts.
//! 5. Outcomes: [`DriverStore::ack`] (group-committed by the driver's ack writer),
//!    [`DriverStore::record_attempts`], [`DriverStore::write_dead_letters`] (a round's dead letters
//!    in one transaction) and [`DriverStore::retire_lane`] (durable when they return, OL-16), [`DriverStore::set_lane_state`], [`DriverStore::block_lane`].
//! 6. **Hand-back needs no write.** Since a claim writes nothing, handing a unit back (OL-10,
//!    OL-14) is a reset of the pass's cursor in that lane to the unit's `seq`; the unit stays
//!    where it was and is claimed again by the next claim or the next pass.
//! 7. [`DriverStore::release_slot`]; on [`SlotRelease::LookAgain`] re-read the outbox and release again.
//!
//! Every pass operation takes the [`SlotToken`] and checks it in its own transaction: a stale
//! token gets [`StoreError::StaleToken`] and nothing is written.
//!
//! # Blocking
//!
//! Every method blocks: async runtimes call them through `spawn_blocking`, and a [`PgStore`]
//! (its client owns a tokio runtime) is called *and dropped* off async executor threads; the
//! `sqlx` module's enqueue is async. `SCHEMA.md` has the schema and the plain SQL of an
//! enqueue (OL-15).
#![cfg_attr(docsrs, feature(doc_cfg))]
// Without SQLite or `PgStore` (no feature, or `sqlx` alone: its enqueue and `SqlxPgStore`)
// part of the shared code is unused.
#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod backend;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod db;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod dead_letters;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod delivery_log;
mod destinations;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod driver;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod enqueue;
mod error;
mod exists;
mod headers;
mod host_figures;
pub mod hosts;
mod lag;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod lanes;
#[cfg(feature = "sqlite")]
mod liveness;
pub mod notify;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod pg_path;
#[cfg(any(feature = "postgres", feature = "sqlx"))]
mod pg_schema;
#[cfg(feature = "postgres")]
pub mod postgres;
mod prepare;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod row_ids;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod service;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod set_aside;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod slots;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod sqlite_path;
#[cfg(feature = "sqlx")]
pub mod sqlx;
#[cfg(feature = "sqlx")]
mod sqlx_pg;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod status;
mod threads;
#[cfg(feature = "postgres")]
mod tls;
mod types;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
mod units;
mod util;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod watcher;

use core::time::Duration;

pub use outbox_lanes_core as core_types;
use outbox_lanes_core::policy::AddressPolicy;
use outbox_lanes_core::{ActorId, DeadReason, Timestamp, UnitId};

pub use destinations::{PolicyChange, covers, parse_policy_name, policy_name, widest};
pub use error::{Cause, EnqueueError, StoreError};
pub use headers::{HeaderProblem, MAX_HEADER_BYTES, MAX_HEADERS, RefusedHeader, validate_headers};
pub use host_figures::{
    HOST_FIGURES_LATENCY_SAMPLE, HOST_FIGURES_MAX_ENTRIES, HostFigures, LatencyPercentiles,
};
pub use hosts::{HostBlock, HostRecord, HostRows, HostStatus, origin_of};
pub use lag::{LaneHold, PendingHeads};
pub use notify::{Notifier, PendingWake, Subscription};
#[cfg(feature = "postgres")]
pub use postgres::{PgOptions, PgStore};
pub use prepare::{check_destinations, check_headers};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteOptions, SqliteStore, Synchronous};
pub use threads::{SpawnThread, StdThreads};
#[cfg(feature = "postgres")]
pub use tls::SslMode;
pub use types::*;

/// How long an attempt stays in flight before a pass marks its lane in flight
/// ([`DriverStore::mark_in_flight`]): 5 s. Shorter attempts write nothing.
pub const IN_FLIGHT_MARK_AFTER: Duration = Duration::from_secs(5);

/// The newest schema version this build writes and understands.
pub const SCHEMA_VERSION: u32 = 8;

/// The whole store: what a runtime holds, as `Arc<dyn Store>`. It is the two sides below
/// together and has no method of its own; every type that implements both is a `Store`.
///
/// - [`DriverStore`]: what a pass and the monitor call — the drain slot, discovery, claims,
///   payloads, acks, attempt records, dead letters and lane states of a pass, the wake-ups.
///   Every call but the monitor's is fenced by the pass's [`SlotToken`].
/// - [`ServiceStore`]: what the embedding service and the operator's CLI call — enqueue,
///   status, lanes, dead letters and lane controls. None of it is fenced by a drain slot.
///
/// Both are blocking and object-safe; call a method through `Arc<dyn Store>` with the side's
/// trait in scope.
pub trait Store: DriverStore + ServiceStore {}

impl<T: DriverStore + ServiceStore + ?Sized> Store for T {}

/// The driver's side of the store: what a pass and the monitor call (see [`Store`]).
pub trait DriverStore: Send + Sync {
    /// Takes `actor`'s drain slot if it is free or its lease expired (judged by the database's
    /// clock), with a fresh fencing token. If another holder's lease is live, sets its
    /// "look again" flag and returns [`SlotAcquisition::Held`] without waiting.
    ///
    /// # Errors
    /// Database failures.
    fn acquire_slot(
        &self,
        actor: &ActorId,
        holder: &str,
        lease: Duration,
    ) -> Result<SlotAcquisition, StoreError>;

    /// Extends the lease of a held slot to `lease` from now.
    ///
    /// # Errors
    /// [`StoreError::StaleToken`] if the slot was lost.
    fn renew_slot(&self, token: &SlotToken, lease: Duration) -> Result<(), StoreError>;

    /// Releases the slot, unless "look again" was set: then the flag is cleared, the slot is
    /// kept and [`SlotRelease::LookAgain`] tells the holder to re-read the outbox first.
    ///
    /// # Errors
    /// [`StoreError::StaleToken`] if the slot was lost.
    fn release_slot(&self, token: &SlotToken) -> Result<SlotRelease, StoreError>;

    /// Releases the slot whatever its "look again" flag: for a holder that will not look again
    /// itself (its drain stops, yields or failed), so that the slot is free at once for
    /// whoever asked meanwhile instead of held, with no pass running, until its lease ends.
    ///
    /// # Errors
    /// [`StoreError::StaleToken`] if the slot was lost.
    fn free_slot(&self, token: &SlotToken) -> Result<(), StoreError>;

    /// A clean stop of `holder`, which this process will not use again unless it takes a slot
    /// anew: its liveness ends at once (OL-12). SQLite: its lock file
    /// `<database>-holders/<holder>.lock` is removed — unless the holder still holds a live
    /// slot (a pass that did not end), whose file then stays, unlocked, so that other relays
    /// find the holder dead and take its slots over at once. Postgres: the holder's liveness
    /// session ends (its advisory lock with it), and its row in `ol_live_holders` is deleted
    /// first unless it still holds a live slot (then other relays find it dead at once, and
    /// forget it). A later [`DriverStore::acquire_slot`] of the
    /// holder takes its lock again. Failures are logged, never returned: the lease still
    /// bounds everything.
    fn close_holder(&self, holder: &str);

    /// The actor's lanes holding pending units whose last enqueued `seq` is above `since`
    /// (0: every lane with pending units), and the new watermark to pass next time.
    ///
    /// # Errors
    /// [`StoreError::StaleToken`], database failures.
    fn lanes_with_work(
        &self,
        token: &SlotToken,
        since: u64,
    ) -> Result<(Vec<PendingLane>, u64), StoreError>;

    /// For each requested lane, up to `limit` units with `seq >= from`, in `seq` order.
    /// Writes nothing. A paused lane, or a lane of another actor, returns no unit.
    ///
    /// # Errors
    /// [`StoreError::StaleToken`], database failures.
    fn claim(
        &self,
        token: &SlotToken,
        lanes: &[ClaimRange],
    ) -> Result<Vec<ClaimedLane>, StoreError>;

    /// The actor's lane-control generation now, and the lanes an operator changed (paused,
    /// resumed, purged, skipped, retried, made strict or not) after generation `seen`, with
    /// their state now: what a pass reads before it starts attempts once its last read is no
    /// longer fresh ([`ControlRead::fresh_at`]), so that no attempt of a lane starts after an
    /// operator's action on it has returned (OL-14). One statement; the lanes are read only
    /// when the generation moved. The read's [`LaneControls::read`] carries an instant taken
    /// before it was sent.
    ///
    /// # Errors
    /// [`StoreError::StaleToken`], database failures.
    fn lane_controls(&self, token: &SlotToken, seen: u64) -> Result<LaneControls, StoreError>;

    /// The payload of a unit.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] if the unit is finished or unknown.
    fn payload(&self, unit: UnitId) -> Result<Payload, StoreError>;

    /// The payloads of several units, in order: what a pass fetches for the attempts it
    /// starts in one round (one call, not one per unit). One unit's error does not fail the
    /// others.
    fn payloads(&self, units: &[UnitId]) -> Vec<Result<Payload, StoreError>> {
        units.iter().map(|u| self.payload(*u)).collect()
    }

    /// Marks these recipients of these units served, in one transaction. A unit whose
    /// recipients are all served or dead-lettered is finished (deleted, or kept for the
    /// retention). Acks of unknown or already finished deliveries are ignored, so a retried
    /// ack is harmless.
    ///
    /// # Errors
    /// [`StoreError::StaleToken`] (nothing written), database failures.
    fn ack(&self, token: &SlotToken, delivered: &[(UnitId, StoreLaneId)])
    -> Result<(), StoreError>;

    /// Persists attempt counts and last status/error per recipient, and the lane's last
    /// status/error (OL-5).
    ///
    /// # Errors
    /// [`StoreError::StaleToken`] (nothing written), database failures.
    fn record_attempts(
        &self,
        token: &SlotToken,
        attempts: &[AttemptRecord],
    ) -> Result<(), StoreError>;

    /// Whether the delivery log is on
    /// ([`CommonOptions::delivery_log_retention`] is not zero): a pass gathers
    /// [`DeliveryLogEntry`]s only then. `false` unless a store keeps one.
    fn logs_deliveries(&self) -> bool {
        false
    }

    /// [`DriverStore::ack`], and the delivery log's entries of these deliveries written in
    /// the same transaction (on Postgres in the ack's one statement). A store without a log
    /// only acks.
    ///
    /// # Errors
    /// As [`DriverStore::ack`].
    fn ack_logged(
        &self,
        token: &SlotToken,
        delivered: &[(UnitId, StoreLaneId)],
        log: &[DeliveryLogEntry],
    ) -> Result<(), StoreError> {
        let _ = log;
        self.ack(token, delivered)
    }

    /// [`DriverStore::record_attempts`], and the delivery log's entries of these attempts
    /// written in the same transaction. A store without a log only records.
    ///
    /// # Errors
    /// As [`DriverStore::record_attempts`].
    fn record_attempts_logged(
        &self,
        token: &SlotToken,
        attempts: &[AttemptRecord],
        log: &[DeliveryLogEntry],
    ) -> Result<(), StoreError> {
        let _ = log;
        self.record_attempts(token, attempts)
    }

    /// Marks lanes whose head has been in flight for longer than [`IN_FLIGHT_MARK_AFTER`]
    /// (`Some((unit, since))`), or clears their mark (`None`), in one fenced transaction
    /// (`ol_lanes.in_flight_since`, `in_flight_unit`). A pass sweeps at most once a second,
    /// so a relay writes nothing for attempts that answer within the threshold.
    ///
    /// # Errors
    /// [`StoreError::StaleToken`] (nothing written), database failures.
    fn mark_in_flight(
        &self,
        token: &SlotToken,
        marks: &[(StoreLaneId, Option<(UnitId, Timestamp)>)],
    ) -> Result<(), StoreError> {
        let _ = (token, marks);
        Ok(())
    }

    /// Moves recipients' deliveries of units to the dead letters, in one transaction: all of
    /// them are durable when it returns (OL-16), or, on an error, none is written. Finishes
    /// each unit that has no other pending recipient. Returns, for each request in order, the
    /// new dead letter as the store keeps it: its id (the one [`ServiceStore::dead_letters`]
    /// lists; the ids of one call ascend in request order), so that whoever is told about it
    /// can show, replay or purge it by id, and the attempts, status and error persisted by
    /// every pass, not only the caller's.
    ///
    /// A delivery that is not pending is left alone and `None` returned in its place (it was
    /// served, or something else dead-lettered it, such as an operator's
    /// [`ServiceStore::purge_lane`]). Calling it again with the same requests after it
    /// succeeded (a store retrying a commit whose outcome it did not learn) returns the same
    /// dead letters. No requests: nothing is read or written.
    ///
    /// A pass gathers the dead letters of units that were decided together (a round's
    /// outcomes) into one call, and sends no later unit of their lanes before it returned.
    ///
    /// # Errors
    /// [`StoreError::StaleToken`] (nothing written), database failures (nothing written).
    fn write_dead_letters(
        &self,
        token: &SlotToken,
        dead: &[DeadLetterRequest],
    ) -> Result<Vec<Option<WrittenDeadLetter>>, StoreError>;

    /// One dead letter: [`DriverStore::write_dead_letters`] with one request.
    ///
    /// # Errors
    /// As [`DriverStore::write_dead_letters`].
    fn dead_letter(
        &self,
        token: &SlotToken,
        dead: &DeadLetterRequest,
    ) -> Result<Option<WrittenDeadLetter>, StoreError> {
        let mut written = self.write_dead_letters(token, std::slice::from_ref(dead))?;
        Ok(written.pop().flatten())
    }

    /// Persists a lane's backoff (OL-11): `None` opens it.
    ///
    /// # Errors
    /// [`StoreError::StaleToken`] (nothing written), database failures.
    fn set_lane_state(
        &self,
        token: &SlotToken,
        lane: StoreLaneId,
        not_before: Option<Timestamp>,
        backoff_level: u32,
    ) -> Result<(), StoreError>;

    /// Pauses a strict lane on its failing head until an operator resumes it (OL-8).
    ///
    /// # Errors
    /// [`StoreError::StaleToken`] (nothing written), database failures.
    fn block_lane(
        &self,
        token: &SlotToken,
        lane: StoreLaneId,
        reason: &str,
    ) -> Result<(), StoreError>;

    /// Persists when the lane's current run of failed attempts began (issue 41): `Some` from
    /// its first failure on, `None` once it answers again, which also clears
    /// [`DriverStore::set_lane_unavailable`]'s mark. Idempotent. Operator actions that bring
    /// the lane back (`lanes retry`, `resume`, `hosts retry`) clear both.
    ///
    /// # Errors
    /// [`StoreError::StaleToken`] (nothing written), [`StoreError::NotFound`] for a lane the
    /// token's actor does not have, database failures.
    fn set_lane_failing(
        &self,
        token: &SlotToken,
        lane: StoreLaneId,
        since: Option<Timestamp>,
    ) -> Result<(), StoreError>;

    /// Marks the lane found failing for longer than allowed at `at` (issue 41), unless it is
    /// marked already: the first mark is kept, so calling it again changes nothing. Cleared by
    /// [`DriverStore::set_lane_failing`] with `None` and by the operator actions that clear
    /// the failing run.
    ///
    /// # Errors
    /// [`StoreError::StaleToken`] (nothing written), [`StoreError::NotFound`] for a lane the
    /// token's actor does not have, database failures.
    fn set_lane_unavailable(
        &self,
        token: &SlotToken,
        lane: StoreLaneId,
        at: Timestamp,
    ) -> Result<(), StoreError>;

    /// Dead-letters every pending delivery of the lane with `reason` (for a joined unit, only
    /// this recipient), in one transaction; durable when it returns: `lane_retired` after a
    /// 410 Gone, `lane_unavailable` for a lane failing for longer than allowed. Returns the
    /// dead letters written, one per delivery, in lane order (oldest first): what a pass
    /// reports to its dead-letter hook. The list is as long as the lane was deep.
    ///
    /// # Errors
    /// [`StoreError::StaleToken`] (nothing written), database failures.
    fn retire_lane(
        &self,
        token: &SlotToken,
        lane: StoreLaneId,
        at: Timestamp,
        reason: DeadReason,
    ) -> Result<Vec<WrittenDeadLetter>, StoreError>;

    /// Whether the database this store opened is still the one its name leads to: on a
    /// SQLite file, that the path still names the file (device and inode) opened; always so
    /// for a server database. Cheap (one `stat`): the monitor asks on every poll, `/readyz`
    /// on every probe, never per unit.
    ///
    /// # Errors
    /// [`StoreError::Replaced`] if the file was removed or replaced.
    fn check_database(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Actors with work admissible at `now`, and the earliest future `not_before` (OL-13).
    ///
    /// # Errors
    /// Database failures.
    fn actors_with_work(&self, now: Timestamp) -> Result<ActorsDue, StoreError>;

    /// The in-process wake-up fired after every enqueue through this store.
    fn notifier(&self) -> Notifier;

    /// Starts (once) the cross-process watcher — Postgres LISTEN/NOTIFY, or SQLite
    /// `PRAGMA data_version` polled every few milliseconds on its own connection — and returns
    /// the notifier that both it and in-process enqueues fire. The watcher stops when the
    /// store is dropped.
    ///
    /// # Errors
    /// The watcher's connection could not be opened.
    fn watch(&self) -> Result<Notifier, StoreError>;

    /// Where this store starts its threads (its watcher, when [`DriverStore::watch`] starts
    /// it): the runtime's, given by the outbox that opens on the store, so that the runtime
    /// owns every thread the library starts. Until then, and for a store that starts no
    /// thread, [`StdThreads`]. A watcher already running keeps its thread.
    fn use_threads(&self, threads: std::sync::Arc<dyn SpawnThread>) {
        let _ = threads;
    }

    /// The outbox id: random, made once with the schema (`ol_meta`), the same for every store
    /// opened on this database (or Postgres schema) and different for every other. Every
    /// request's idempotency key is `<outbox id>-<unit id>` (see `docs/design.md`, OL-16), so
    /// two outboxes — two services, or a database created again — never send one receiver the
    /// same key for different units.
    fn outbox_id(&self) -> &str;

    /// The monitor's upkeep, every few minutes: forgets the row ids past their dedup window
    /// ([`ServiceStore::purge_row_ids`]) and, with an ack retention
    /// ([`CommonOptions::ack_retention`]), deletes the finished units kept longer than it
    /// ([`ServiceStore::purge_acked`]). Returns how many of each.
    ///
    /// # Errors
    /// Database failures (what was deleted before one stays deleted).
    fn upkeep(&self, now: Timestamp) -> Result<(u64, u64), StoreError>;

    /// Every host's row (`ol_hosts`, [`hosts`]): the connection health and the HTTP signature
    /// schemes the relays share, and the operator's blocks. A relay reads it at start and
    /// about once a second.
    ///
    /// # Errors
    /// Database failures.
    fn hosts(&self) -> Result<HostRows, StoreError>;

    /// Pauses each lane for its host's block (pause reason
    /// [`HOST_BLOCKED_REASON`](hosts::HOST_BLOCKED_REASON)), as a pass that found the host
    /// held by an operator writes it — a lane enqueued after the block, or one the block did
    /// not reach — if the host (`scheme://host:port`, given with each lane) is still held when
    /// the write commits: `hosts unblock` resumes it, and an unblock that committed first
    /// leaves it open. Fenced by `token`. Returns each lane's state after the write (paused
    /// or not: a lane left open is read again by the pass).
    ///
    /// # Errors
    /// [`StoreError::StaleToken`]; database failures.
    fn pause_for_host(
        &self,
        token: &SlotToken,
        lanes: &[(StoreLaneId, String)],
    ) -> Result<Vec<ChangedLane>, StoreError>;

    /// Writes host states a relay observed, in one transaction (the operator's
    /// [`HostRecord::blocked`] is not written).
    ///
    /// # Errors
    /// Database failures.
    fn write_hosts(&self, hosts: &[HostRecord]) -> Result<(), StoreError>;
}

/// The user's side of the store: what the embedding service and the operator's CLI call
/// (see [`Store`]).
pub trait ServiceStore: Send + Sync {
    /// Enqueues rows for `actor`, all or nothing, and fires the wake-up after the commit.
    ///
    /// Each row gets the next sequence number of the actor. A normal row with k recipients
    /// becomes k units (one lane each); a `joined` row becomes one unit with k lanes.
    /// Recipients for which a unit with the same dedup key is still pending (neither finished
    /// nor dead-lettered) are skipped and reported (OL-17); if that pending unit is later
    /// dead-lettered, the skipped recipient is NOT revived.
    ///
    /// # Errors
    /// A row with no recipient or more than the limit
    /// ([`CommonOptions::max_recipients`]), a recipient that is not an absolute http(s) URL, a
    /// content type that is not a valid HTTP header value, a refused header
    /// ([`check_headers`]), a duplicate row id or a payload over the limit refuses the whole
    /// batch with an error naming the row; so does a recipient whose address the outbox's
    /// destination policy refuses without a lookup (an IP literal, `localhost`:
    /// [`EnqueueError::DestinationRefused`], OL-24). Nothing is written.
    fn enqueue(&self, actor: &ActorId, rows: &[NewRow]) -> Result<Vec<Enqueued>, EnqueueError>;

    /// The outbox's destination policy (OL-24): which address classes beyond public space
    /// every process on this database may deliver to. Enqueue refuses what it refuses;
    /// delivery allows what it or the process's own configuration allows. Public only until
    /// an outbox whose configuration asks for more, or an operator, widens it.
    ///
    /// # Errors
    /// Database failures; a stored value this version does not read.
    fn destination_policy(&self) -> Result<AddressPolicy, StoreError>;

    /// Widens the outbox's destination policy to allow what `wanted` allows too: a union,
    /// never a narrowing, and no write when it allows that already (so a store opened
    /// read-only may ask). Every outbox calls it when it opens, with its configuration's
    /// `HttpConfig::addresses`.
    ///
    /// # Errors
    /// Database failures; a stored value this version does not read.
    fn widen_destination_policy(&self, wanted: AddressPolicy) -> Result<PolicyChange, StoreError>;

    /// Sets the outbox's destination policy, narrower or wider: an operator's act
    /// (`outbox-lanes destinations set`). After a narrowing, units already enqueued for a
    /// destination it now refuses are dead-lettered `destination_refused` at their next
    /// attempt by every process whose own configuration does not allow it; a process whose
    /// configuration still asks for more widens it again when it next opens (and says so at
    /// WARN: [`PolicyChange::undid_narrowing`]).
    ///
    /// # Errors
    /// Database failures.
    fn set_destination_policy(&self, policy: AddressPolicy) -> Result<PolicyChange, StoreError>;

    /// Every actor with pending units or dead letters, at a glance.
    ///
    /// # Errors
    /// Database failures.
    fn status(&self) -> Result<Vec<ActorStatus>, StoreError>;

    /// Where each recipient of `actor`'s row `row_id` stands (pending, in flight, delivered,
    /// dead letter), with the delivery log's history of its attempts; empty when the store
    /// knows nothing of the row (never enqueued, or finished and past the log's window).
    ///
    /// # Errors
    /// Database failures.
    fn row_deliveries(
        &self,
        actor: &ActorId,
        row_id: &str,
    ) -> Result<Vec<RowDelivery>, StoreError> {
        let _ = (actor, row_id);
        Ok(Vec::new())
    }

    /// Every lane whose head a relay has had in flight for longer than
    /// [`IN_FLIGHT_MARK_AFTER`] (while its actor's drain slot is held), every actor's,
    /// longest first: `status` counts them, `hosts` per host.
    ///
    /// # Errors
    /// Database failures.
    fn lanes_in_flight(&self) -> Result<Vec<LaneInFlight>, StoreError> {
        Ok(Vec::new())
    }

    /// The delivery log's entries of `actor`'s row `row_id`, by lane, oldest first.
    ///
    /// # Errors
    /// Database failures.
    fn delivery_log(
        &self,
        actor: &ActorId,
        row_id: &str,
    ) -> Result<Vec<DeliveryLogRow>, StoreError> {
        let _ = (actor, row_id);
        Ok(Vec::new())
    }

    /// Per-host figures from the delivery log's entries that started at or after `since`
    /// (`hosts` asks for the last hour): attempts, attempts per outcome class, success rate
    /// and latency percentiles per origin (the lane's recipient's `scheme://host:port`),
    /// hosts in origin order. Bounded: the read takes at most the
    /// [`HOST_FIGURES_MAX_ENTRIES`] (100,000) most recent entries, all hosts together
    /// (counted per class in SQL), and at most [`HOST_FIGURES_LATENCY_SAMPLE`] (10,000)
    /// durations per origin for its percentiles. Empty when the log is off or holds nothing
    /// since then.
    ///
    /// # Errors
    /// Database failures.
    fn host_figures(&self, since: Timestamp) -> Result<Vec<HostFigures>, StoreError> {
        let _ = since;
        Ok(Vec::new())
    }

    /// Every lane of the actor (lanes are never deleted), with its depth and state.
    ///
    /// # Errors
    /// Database failures.
    fn lanes(&self, actor: &ActorId) -> Result<Vec<LaneStatus>, StoreError>;

    /// One lane, with its depth and state, as [`ServiceStore::lanes`] lists it; `None` if no
    /// lane has this id. Reads that lane alone, however many the actor has.
    ///
    /// # Errors
    /// Database failures.
    fn lane_status(&self, lane: StoreLaneId) -> Result<Option<LaneStatus>, StoreError>;

    /// Whether the outbox has seen `actor`: it enqueued at least once (so every actor with a
    /// lane, a pending unit or a dead letter). One index probe, for tools that refuse a
    /// mistyped actor.
    ///
    /// # Errors
    /// Database failures.
    fn knows_actor(&self, actor: &ActorId) -> Result<bool, StoreError>;

    /// Dead letters, of one actor or all, in (actor, original seq) order.
    ///
    /// # Errors
    /// Database failures.
    fn dead_letters(&self, actor: Option<&ActorId>) -> Result<Vec<DeadLetter>, StoreError>;

    /// The dead letters a selection names, in (actor, original seq) order: what
    /// [`ServiceStore::replay_dead_letters`] and [`ServiceStore::purge_dead_letters`] with it
    /// would act on at this moment. A tool that shows them first and then acts on exactly
    /// those passes their ids ([`DeadLetterSelection::Ids`]).
    ///
    /// # Errors
    /// Database failures.
    fn select_dead_letters(
        &self,
        which: &DeadLetterSelection,
    ) -> Result<Vec<DeadLetter>, StoreError>;

    /// Puts dead letters back at the tail of their lanes in their original order: new `seq`,
    /// attempts reset, the SAME unit id (the idempotency key stays stable, so a recipient that
    /// did get an earlier attempt can recognise it). Returns the units re-enqueued.
    /// Not fenced (an operator action).
    ///
    /// # Errors
    /// Database failures.
    fn replay_dead_letters(&self, which: &DeadLetterSelection) -> Result<Vec<UnitId>, StoreError>;

    /// Deletes dead letters (and payloads nothing references any more). Returns how many.
    ///
    /// # Errors
    /// Database failures.
    fn purge_dead_letters(&self, which: &DeadLetterSelection) -> Result<u64, StoreError>;

    /// The payload a dead letter keeps for its replay: its row id, content type and body.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] if no dead letter has this id; database failures.
    fn dead_letter_payload(&self, id: DeadLetterId) -> Result<Payload, StoreError>;

    /// Per actor with pending units, when the row of its oldest lane head was enqueued: the
    /// age of what waits longest, the lag an operator alerts on. One statement; its cost is
    /// one index probe per lane (the head of each lane), never a lane's depth.
    ///
    /// # Errors
    /// Database failures.
    fn oldest_pending(&self) -> Result<Vec<(ActorId, Timestamp)>, StoreError>;

    /// Per actor and [`LaneHold`] at `now`, how many lanes have pending units and when the
    /// row of the oldest of their heads was enqueued: [`ServiceStore::oldest_pending`] told
    /// apart by what holds each lane, so that the lag excludes lanes that wait on purpose
    /// (backoff, throttle, pauses, blocks). One statement, the same cost.
    ///
    /// # Errors
    /// Database failures.
    fn pending_heads(&self, now: Timestamp) -> Result<Vec<PendingHeads>, StoreError>;

    /// Pauses a lane (operator).
    ///
    /// Once it returns, no pass — of this process or another, on this database — starts an
    /// attempt of the lane (OL-14); an attempt already in flight finishes and is recorded. If
    /// a pass holds the actor's drain slot it may have read the lane's state just before, so
    /// the call returns only [`CONTROL_VALIDITY`] after its commit (at once otherwise).
    ///
    /// # Errors
    /// [`StoreError::NotFound`], database failures.
    fn pause_lane(&self, lane: StoreLaneId, reason: &str) -> Result<(), StoreError>;

    /// Resumes a paused lane (operator), and forgets its run of failures (`failing_since`,
    /// `unavailable_since`: it starts a new one). A running pass picks it up at its next read
    /// of the actor's control generation (or the next pass does).
    ///
    /// # Errors
    /// [`StoreError::NotFound`], database failures.
    fn resume_lane(&self, lane: StoreLaneId) -> Result<(), StoreError>;

    /// Clears a lane's backoff so its head is attempted at once (operator). A strict lane
    /// blocked on its failing head ([`STRICT_BLOCKED_REASON`]) is unblocked too, so the head is
    /// probed again; a lane an operator paused stays paused (resume it). The lane's run of
    /// failures is forgotten (`failing_since`, `unavailable_since`: it starts a new one).
    ///
    /// # Errors
    /// [`StoreError::NotFound`], database failures.
    fn retry_lane_now(&self, lane: StoreLaneId) -> Result<(), StoreError>;

    /// Dead-letters every pending unit of a lane, oldest first, with reason
    /// [`DeadReason::Purged`](outbox_lanes_core::DeadReason) (operator). A joined unit is
    /// dead-lettered for this lane's recipient only (OL-20). Returns how many.
    ///
    /// Once it returns no pass starts an attempt of the purged units (OL-14, as
    /// [`ServiceStore::pause_lane`], whose wait it shares). An attempt a running pass already
    /// had in flight finishes and is recorded on its dead letter: a failure with its count and
    /// status, a delivery as one attempt more with the error [`DELIVERED_AFTER_SET_ASIDE`]
    /// (replaying that one sends the recipient a unit it has). The dead letters keep the
    /// attempts, status and error persisted for each unit.
    ///
    /// # Errors
    /// [`StoreError::NotFound`], database failures.
    fn purge_lane(&self, lane: StoreLaneId, at: Timestamp) -> Result<u64, StoreError>;

    /// Dead-letters the head (oldest pending unit) of a lane with reason
    /// [`DeadReason::Skipped`](outbox_lanes_core::DeadReason), lifts a strict block
    /// ([`STRICT_BLOCKED_REASON`]) and clears the lane's backoff and its run of failures, so
    /// its followers go on in order (operator). Returns the skipped unit, or `None` if the
    /// lane had none pending.
    ///
    /// Once it returns no pass sends the skipped unit again, and its attempt in flight, if
    /// any, is recorded on its dead letter (OL-14, as [`ServiceStore::purge_lane`]).
    ///
    /// # Errors
    /// [`StoreError::NotFound`], database failures.
    fn skip_lane_head(
        &self,
        lane: StoreLaneId,
        at: Timestamp,
    ) -> Result<Option<UnitId>, StoreError>;

    /// Sets a lane's strict mode (OL-8). Making it strict reaches running passes before it
    /// returns, as [`ServiceStore::pause_lane`] does (no attempt of the lane starts in the old
    /// mode after it); making it lenient again reaches them at their next read.
    ///
    /// # Errors
    /// [`StoreError::NotFound`], database failures.
    fn set_lane_strict(&self, lane: StoreLaneId, strict: bool) -> Result<(), StoreError>;

    /// The id of an actor's lane, if it exists.
    ///
    /// # Errors
    /// Database failures.
    fn find_lane(
        &self,
        actor: &ActorId,
        key: &outbox_lanes_core::LaneKey,
    ) -> Result<Option<StoreLaneId>, StoreError>;

    /// Deletes finished units kept for the retention that finished before `older_than`.
    ///
    /// # Errors
    /// Database failures.
    fn purge_acked(&self, older_than: Timestamp) -> Result<u64, StoreError>;

    /// Forgets the row ids whose dedup window ended before `now`: the entries of `ol_row_ids`
    /// enqueued longer than [`CommonOptions::row_id_retention`] ago (an id whose row is still
    /// stored stays refused all the same). Returns how many. Deletes in bounded statements,
    /// each its own short transaction. The monitor calls it in its upkeep
    /// ([`DriverStore::upkeep`]); a service without a monitor calls it itself.
    ///
    /// # Errors
    /// Database failures.
    fn purge_row_ids(&self, now: Timestamp) -> Result<u64, StoreError>;

    /// Every host with a row or a lane: its health, signature scheme and block as the relays
    /// and operators left them, and its lanes and pending units (`outbox-lanes hosts`).
    ///
    /// # Errors
    /// Database failures.
    fn host_list(&self) -> Result<Vec<HostStatus>, StoreError>;

    /// An operator's block of `origin` (`scheme://host:port`), or its lifting with
    /// [`HostBlock::Open`]. [`HostBlock::Hold`] pauses every lane to it (pause reason
    /// [`HOST_BLOCKED_REASON`](hosts::HOST_BLOCKED_REASON); a lane an operator paused already
    /// stays as it is) and returns how many; [`HostBlock::DeadLetter`] dead-letters every
    /// pending unit to it as `blocked` and returns how many; `Open` resumes the lanes the
    /// block paused and forgets the run of failures of every lane to the host
    /// (`failing_since`, `unavailable_since`, as [`ServiceStore::resume_lane`] does: the time
    /// the block lasted is not the recipient's failure). Running relays hold (or dead-letter)
    /// units enqueued later for it too.
    /// Like [`ServiceStore::pause_lane`], it returns once no pass starts an attempt to the
    /// host any more (OL-14).
    ///
    /// # Errors
    /// Database failures.
    fn block_host(&self, origin: &str, block: HostBlock, at: Timestamp) -> Result<u64, StoreError>;

    /// An operator's retry of `origin`: its failures and backoff are forgotten and every lane
    /// to it that waits (its own backoff, or held for the host) comes back at once, its run of
    /// failures forgotten (`failing_since`, `unavailable_since`). Returns how many lanes
    /// waited or were failing.
    ///
    /// # Errors
    /// Database failures.
    fn retry_host(&self, origin: &str, at: Timestamp) -> Result<u64, StoreError>;
}
