//! What differs between the two backends under the operations written once: how a read and a
//! write transaction are opened, the wake-ups, and enqueue (a hot path tuned per backend).
//!
//! [`SqliteStore`](crate::SqliteStore) and [`PgStore`](crate::PgStore) implement [`Backend`];
//! [`ServiceStore`](crate::ServiceStore) is implemented once for every `Backend` (in
//! `service.rs`). The trait is crate-private, so no other type can implement it, and the
//! connection types it names stay private too.

use outbox_lanes_core::ActorId;

use crate::db::Db;
use crate::{CommonOptions, EnqueueError, Enqueued, NewRow, StoreError};

/// One backend under the shared operations (see the module docs).
pub(crate) trait Backend: Send + Sync {
    /// A connection reading outside a write transaction (one consistent snapshot on SQLite,
    /// autocommit on Postgres).
    type Reader<'c>: Db
    where
        Self: 'c;
    /// A write transaction.
    type Writer<'c>: Db
    where
        Self: 'c;

    /// Runs `f` as a read. Postgres may run it twice on a lost connection.
    fn read<T>(
        &self,
        f: impl FnMut(&mut Self::Reader<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError>;

    /// Runs `f` in a write transaction and commits it. `idempotent`: Postgres may run `f` again
    /// on a fresh connection if the connection is lost before the commit is known.
    fn write<T>(
        &self,
        idempotent: bool,
        f: impl FnMut(&mut Self::Writer<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError>;

    /// The options every backend shares.
    fn common(&self) -> &CommonOptions;

    /// The outbox id (`ol_meta`), read when the store was opened.
    fn outbox_id(&self) -> &str;

    /// Fires the in-process wake-up (after a commit that made work).
    fn notify(&self);

    /// Tells the other processes that `actors` have work, inside the transaction (Postgres
    /// NOTIFY; SQLite's watcher sees every commit by itself).
    fn notify_others(
        &self,
        db: &mut Self::Writer<'_>,
        actors: &[ActorId],
    ) -> Result<(), StoreError>;

    /// Enqueues a batch in one transaction (see
    /// [`ServiceStore::enqueue`](crate::ServiceStore::enqueue)).
    fn enqueue_batch(
        &self,
        actor: &ActorId,
        rows: &[NewRow],
    ) -> Result<Vec<Enqueued>, EnqueueError>;
}
