//! What a backend brings, under the operations written once: its connections and
//! transactions, its wake-ups, and how it knows that a slot holder died.
//!
//! [`SqliteStore`](crate::SqliteStore), [`PgStore`](crate::PgStore) and `SqlxPgStore`
//! implement [`Backend`];
//! [`DriverStore`](crate::DriverStore) and [`ServiceStore`](crate::ServiceStore) are
//! implemented once for every `Backend` (in `driver.rs` and `service.rs`), choosing the SQL of
//! the backend's [`Dialect`] where the hot path differs. The trait is crate-private, so no other
//! type can implement it, and the connection types it names stay private too.

use crate::db::{Db, Dialect};
use crate::notify::Notifier;
use crate::{CommonOptions, StoreError};

/// What every store holds alike, for the operations written once.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The outbox id (`ol_meta`), read when the store was opened.
    pub(crate) outbox_id: String,
    /// The in-process wake-up, fired after a commit that made work.
    pub(crate) notifier: Notifier,
    /// Postgres: the channel that wakes the other processes (a `NOTIFY` in the transaction).
    /// SQLite: none, its watchers see every commit by themselves.
    pub(crate) channel: Option<String>,
    /// Where the store starts its watcher ([`DriverStore::use_threads`](crate::DriverStore::use_threads)).
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) threads: std::sync::Mutex<std::sync::Arc<dyn crate::SpawnThread>>,
}

impl Shared {
    /// A store's parts, before its outbox id is read.
    pub(crate) fn new(channel: Option<String>) -> Shared {
        Shared {
            outbox_id: String::new(),
            notifier: Notifier::new(),
            channel,
            threads: std::sync::Mutex::new(std::sync::Arc::new(crate::StdThreads)),
        }
    }

    /// Where the store starts its threads now.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) fn threads(&self) -> std::sync::Arc<dyn crate::SpawnThread> {
        std::sync::Arc::clone(
            &self
                .threads
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// The channel of a Postgres store's wake-ups.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn pg_channel(&self) -> &str {
        self.channel
            .as_deref()
            .expect("a Postgres store is made with its channel")
    }
}

/// One backend under the shared operations (see the module docs).
pub(crate) trait Backend: Send + Sync {
    /// The SQL this backend speaks.
    const DIALECT: Dialect;

    /// A connection: reading (one consistent snapshot on SQLite, each statement committed on
    /// its own on Postgres) or in a write transaction.
    type Conn<'c>: Db
    where
        Self: 'c;

    /// Runs `f` as a read. Postgres may run it twice on a lost connection.
    fn read<T>(
        &self,
        f: impl FnMut(&mut Self::Conn<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError>;

    /// Runs `f` in a write transaction and commits it, or rolls it back when `f` fails.
    /// `idempotent`: Postgres may run `f` again on a fresh connection if the connection is lost
    /// before the commit is known (any `f` is run again when it was lost before the commit was
    /// sent).
    fn write<T, E: From<StoreError>>(
        &self,
        idempotent: bool,
        f: impl FnMut(&mut Self::Conn<'_>) -> Result<T, E>,
    ) -> Result<T, E>;

    /// The options every backend shares.
    fn common(&self) -> &CommonOptions;

    /// What every store holds alike.
    fn shared(&self) -> &Shared;

    /// Makes `holder` known as alive while this store lives (a failure only means that its
    /// slots are recovered by lease expiry instead).
    fn register_holder(&self, holder: &str);

    /// [`DriverStore::close_holder`](crate::DriverStore::close_holder): a clean stop of `holder`
    /// ends its liveness (by default there is none to end).
    fn release_holder(&self, _holder: &str) {}

    /// Whether `holder`, which holds a live slot, is known to be dead (SQLite: its lock file is
    /// free; Postgres: its session advisory lock is). Never for a holder that registered no
    /// liveness (an older version's).
    fn holder_is_dead(&self, db: &mut Self::Conn<'_>, holder: &str) -> Result<bool, StoreError>;

    /// [`DriverStore::check_database`](crate::DriverStore::check_database).
    fn check_database(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// [`DriverStore::watch`](crate::DriverStore::watch).
    fn watch(&self) -> Result<Notifier, StoreError>;
}
