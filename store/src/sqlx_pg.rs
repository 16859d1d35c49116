//! [`SqlxPgStore`]: the Postgres store on a caller's sqlx pool (feature `sqlx`), so a service
//! on sqlx runs its relay without a second pool of blocking `postgres` connections.
//!
//! It runs the same statements as [`PgStore`](crate::PgStore) (the hot path of `pg_path.rs`,
//! the operations written once over the statement layer), on the same schema, with the same
//! wake-up channel: relays on either store, and enqueues through
//! [`SqlxOutbox`](crate::sqlx::SqlxOutbox), interoperate.
//!
//! # Blocking, on the pool's runtime
//!
//! Every [`Store`](crate::Store) method blocks, as the trait says; the store runs each
//! statement's future on the tokio runtime the pool belongs to (the one current when the store
//! was made) and waits for it. The runtimes call the store from blocking threads
//! (`outbox_lanes_tokio` through `spawn_blocking`, the blocking runtime from its own threads),
//! so no executor thread waits. Called from an executor thread anyway:
//!
//! - on a multi-thread runtime, the call runs in `tokio::task::block_in_place`: the worker's
//!   other tasks move to another worker while it waits (correct, but it costs a worker);
//! - on a current-thread runtime, the runtime's own thread cannot wait for a future only it
//!   could drive: the call returns [`StoreError::Database`] saying so (tokio's refusal, caught:
//!   a build with `panic = "abort"` aborts instead). Call it through `spawn_blocking`.
//!
//! Dropping the store never blocks (its background tasks are aborted), on any thread.
//!
//! # Connections
//!
//! Statements run on connections of the caller's pool, each operation in a transaction that
//! begins with `SET LOCAL` of the store's settings (its schema first on the `search_path`, the
//! planner settings of `PgStore`'s sessions): nothing changes for the caller's other queries on
//! the same connections. Reads and the one-statement ack, which `PgStore` runs outside a
//! transaction, are transactions here too (one round trip more). An operation that loses its
//! connection is retried once on another, when that is safe (as `PgStore` does).
//!
//! - [`DriverStore::watch`](crate::DriverStore::watch) holds one connection of the pool for
//!   its `LISTEN` (a `PgListener`), for the store's life.
//! - Liveness: each slot holder takes a session advisory lock on a connection of its own,
//!   opened with the pool's connect options but outside the pool, and pinged every second; when
//!   the process dies or that connection drops, other relays take the holder's slots over at
//!   once, as with `PgStore`. If that connection cannot be opened the holder's slots are
//!   recovered by lease expiry only.

use core::future::Future;
use core::time::Duration;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Mutex, PoisonError};

use ::sqlx::postgres::{PgConnection, PgListener, PgPool, PgRow};
use ::sqlx::{AssertSqlSafe, Connection as _, Row as _};

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::task::JoinHandle;

use crate::StoreError;
use crate::backend::{Backend, Shared};
use crate::db::{Db, Dialect, Get, Sql, Value};
use crate::notify::Notifier;
use crate::pg_schema;
use crate::sqlx::{bind_pg as bind, sqlx_err};
use crate::types::CommonOptions;

/// How a [`SqlxPgStore`] uses its pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqlxPgOptions {
    /// The schema holding the tables (as [`PgOptions::schema`](crate::PgOptions)); created if
    /// missing. Letters, digits and `_` only.
    pub schema: String,
    /// Payload limit and ack retention.
    pub common: CommonOptions,
}

impl Default for SqlxPgOptions {
    fn default() -> Self {
        SqlxPgOptions {
            schema: "outbox_lanes".into(),
            common: CommonOptions::default(),
        }
    }
}

/// How often a holder's liveness connection is checked (and reopened once lost).
const LIVENESS_PING: Duration = Duration::from_secs(1);

/// A background task, aborted when dropped.
#[derive(Debug)]
struct Task(JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The Postgres store on a caller's [`PgPool`]; see the [`sqlx` module docs](crate::sqlx).
#[derive(Debug)]
pub struct SqlxPgStore {
    pool: PgPool,
    handle: Handle,
    opts: SqlxPgOptions,
    /// `BEGIN` and the store's `SET LOCAL`s, one round trip.
    begin: String,
    shared: Shared,
    watcher: Mutex<Option<Task>>,
    /// Per holder, the task keeping its liveness lock's connection.
    live: Mutex<HashMap<String, Task>>,
}

impl SqlxPgStore {
    /// A store on `pool`, creating or migrating the schema as [`CommonOptions::schema`] allows
    /// (blocking: call it where the other
    /// methods are called, e.g. in `spawn_blocking`). The pool's runtime must be the current
    /// one: every statement runs on it.
    ///
    /// # Errors
    /// [`StoreError::Open`] outside a tokio runtime or for an invalid schema name;
    /// [`StoreError::SchemaTooNew`] for a database from a newer version; database failures.
    pub fn new(pool: PgPool, opts: SqlxPgOptions) -> Result<SqlxPgStore, StoreError> {
        let open_error = |reason: String| StoreError::Open {
            target: format!("sqlx pool (schema {})", opts.schema),
            reason,
            cause: None,
        };
        if !pg_schema::valid_schema(&opts.schema) {
            return Err(open_error(format!(
                "invalid schema name {:?} (use lower-case letters, digits, _)",
                opts.schema
            )));
        }
        let handle = Handle::try_current().map_err(|e| {
            open_error(format!(
                "no tokio runtime to run the pool's futures on: {e}"
            ))
        })?;
        let store = SqlxPgStore {
            begin: format!("BEGIN; {}", pg_schema::settings("LOCAL", &opts.schema)),
            shared: Shared::new(Some(pg_schema::channel(&opts.schema))),
            pool,
            handle,
            watcher: Mutex::new(None),
            live: Mutex::new(HashMap::new()),
            opts,
        };
        let mut store = store;
        store.shared.outbox_id = store.tx(false, |db: &mut SqlxDb<'_>| {
            pg_schema::init(
                db,
                &store.opts.schema,
                store.shared.pg_channel(),
                store.opts.common.schema,
            )
        })?;
        Ok(store)
    }

    /// The options the store was made with.
    pub fn options(&self) -> &SqlxPgOptions {
        &self.opts
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Waits for `f` on the pool's runtime (see the module docs).
    fn run<F: Future>(&self, f: F) -> Result<F::Output, StoreError> {
        match Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(RuntimeFlavor::MultiThread) => {
                Ok(tokio::task::block_in_place(|| self.handle.block_on(f)))
            }
            // A current-thread runtime's blocking thread may wait; its own thread may not, and
            // tokio refuses that before the future is polled.
            Ok(_) => std::panic::catch_unwind(AssertUnwindSafe(|| self.handle.block_on(f)))
                .map_err(|_| {
                    StoreError::Database(
                        "SqlxPgStore called on a current-thread tokio runtime's own thread; \
                         call it through spawn_blocking"
                            .into(),
                    )
                }),
            Err(_) => Ok(self.handle.block_on(f)),
        }
    }

    /// [`Self::run`] for a sqlx future.
    fn run_sql<T>(
        &self,
        f: impl Future<Output = Result<T, ::sqlx::Error>>,
    ) -> Result<T, StoreError> {
        self.run(f)?.map_err(sqlx_err)
    }

    /// Runs `f` in a transaction and commits; retries once on a lost connection when safe:
    /// always if the commit was not sent, only `idempotent` operations otherwise.
    fn tx<T, E: From<StoreError>>(
        &self,
        idempotent: bool,
        mut f: impl FnMut(&mut SqlxDb<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (res, lost, at_commit) =
                match self.run_sql(self.pool.begin_with(AssertSqlSafe(self.begin.clone()))) {
                    Err(e) => {
                        let lost = matches!(e, StoreError::ConnectionLost { .. });
                        (Err(E::from(e)), lost, false)
                    }
                    Ok(mut tx) => {
                        let mut db = SqlxDb {
                            conn: &mut tx,
                            store: self,
                            lost: false,
                        };
                        match f(&mut db) {
                            Err(e) => {
                                let lost = db.lost;
                                // On the runtime: a pooled connection goes back to its pool from there.
                                let _ = self.run(tx.rollback());
                                (Err(e), lost, false)
                            }
                            Ok(v) => match self.run_sql(tx.commit()) {
                                Ok(()) => (Ok(v), false, false),
                                Err(e) => {
                                    let lost = matches!(e, StoreError::ConnectionLost { .. });
                                    (Err(E::from(e)), lost, true)
                                }
                            },
                        }
                    }
                };
            match res {
                Err(e) if lost => {
                    let retry = attempt < 2 && (!at_commit || idempotent);
                    tracing::warn!(target: "outbox_lanes::store", at_commit, idempotent, retry, "postgres connection lost (sqlx pool)");
                    if !retry {
                        return Err(e);
                    }
                }
                res => return res,
            }
        }
    }

    /// Takes `holder`'s liveness lock on a connection of its own, kept by a task that pings it
    /// (see the module docs and `PgStore`'s `register_holder`).
    fn keep_alive(&self, holder: &str) -> Result<Option<Task>, StoreError> {
        let options = self.pool.connect_options();
        let mut conn = self.run_sql(PgConnection::connect_with(&options))?;
        let mut db = SqlxDb {
            conn: &mut conn,
            store: self,
            lost: false,
        };
        db.batch(&format!("SET search_path TO {}", self.opts.schema))?;
        if !pg_schema::take_live_lock(&mut db, &self.opts.schema, holder)? {
            return Ok(None);
        }
        Ok(Some(Task(self.handle.spawn(async move {
            // Ends when the connection is lost; the next acquisition opens a new one.
            loop {
                tokio::time::sleep(LIVENESS_PING).await;
                if conn.ping().await.is_err() {
                    return;
                }
            }
        }))))
    }
}

/// A connection of the store (in a transaction, or the liveness session) as a [`Db`]: each
/// statement waits on the pool's runtime; sqlx caches the prepared statements per connection.
pub(crate) struct SqlxDb<'c> {
    conn: &'c mut PgConnection,
    store: &'c SqlxPgStore,
    lost: bool,
}

impl SqlxDb<'_> {
    fn checked<T>(&mut self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if matches!(r, Err(StoreError::ConnectionLost { .. })) {
            self.lost = true;
        }
        r
    }
}

impl Db for SqlxDb<'_> {
    const DIALECT: Dialect = Dialect::Postgres;

    fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
        let r = self
            .store
            .run_sql(::sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut *self.conn));
        self.checked(r).map(drop)
    }

    fn execute(&mut self, sql: &Sql, args: &[Value<'_>]) -> Result<u64, StoreError> {
        let q = bind(
            ::sqlx::query(AssertSqlSafe(sql.text(Dialect::Postgres))),
            args,
        )?;
        let r = self.store.run_sql(q.execute(&mut *self.conn));
        self.checked(r).map(|r| r.rows_affected())
    }

    fn insert(&mut self, sql: &Sql, args: &[Value<'_>]) -> Result<Option<i64>, StoreError> {
        self.query_opt(sql, args, |r| r.int(0))
    }

    fn query<T>(
        &mut self,
        sql: &Sql,
        args: &[Value<'_>],
        mut map: impl FnMut(&dyn Get) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let q = bind(
            ::sqlx::query(AssertSqlSafe(sql.text(Dialect::Postgres))),
            args,
        )?;
        let rows = self.store.run_sql(q.fetch_all(&mut *self.conn));
        self.checked(rows)?.iter().map(|r| map(r)).collect()
    }
}

crate::db::impl_get!(PgRow, |r, c| r.try_get(c).map_err(sqlx_err), arrays);

impl Backend for SqlxPgStore {
    const DIALECT: Dialect = Dialect::Postgres;
    type Conn<'c> = SqlxDb<'c>;

    fn read<T>(
        &self,
        f: impl FnMut(&mut SqlxDb<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        // Committed, not rolled back: the one-statement ack writes through a read.
        self.tx(true, f)
    }

    fn write<T, E: From<StoreError>>(
        &self,
        idempotent: bool,
        f: impl FnMut(&mut SqlxDb<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.tx(idempotent, f)
    }

    fn common(&self) -> &CommonOptions {
        &self.opts.common
    }

    fn shared(&self) -> &Shared {
        &self.shared
    }

    fn register_holder(&self, holder: &str) {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if live.get(holder).is_some_and(|t| !t.0.is_finished()) {
            return;
        }
        match self.keep_alive(holder) {
            Ok(Some(task)) => {
                live.insert(holder.to_owned(), task);
            }
            Ok(None) => pg_schema::log_no_live_lock(holder, None),
            Err(e) => pg_schema::log_no_live_lock(holder, Some(&e)),
        }
    }

    fn holder_is_dead(&self, db: &mut SqlxDb<'_>, holder: &str) -> Result<bool, StoreError> {
        pg_schema::holder_is_dead(db, &self.opts.schema, holder)
    }

    fn watch(&self) -> Result<Notifier, StoreError> {
        let mut w = self.watcher.lock().unwrap_or_else(PoisonError::into_inner);
        if w.is_none() {
            let mut listener = self.run_sql(async {
                let mut listener = PgListener::connect_with(&self.pool).await?;
                listener.listen(self.shared.pg_channel()).await?;
                Ok(listener)
            })?;
            let notifier = self.shared.notifier.clone();
            *w = Some(Task(self.handle.spawn(async move {
                loop {
                    match listener.try_recv().await {
                        Ok(Some(_)) => {
                            tracing::trace!(target: "outbox_lanes::store", reason = "notify", "wake-up from another process");
                            notifier.notify();
                        }
                        Ok(None) => {
                            tracing::warn!(target: "outbox_lanes::store", reason = "listen_reconnected", "LISTEN connection lost; reconnecting");
                            notifier.notify();
                        }
                        Err(::sqlx::Error::PoolClosed) => return,
                        Err(e) => {
                            tracing::warn!(target: "outbox_lanes::store", error = %e, "LISTEN failed; retrying");
                            tokio::time::sleep(LIVENESS_PING).await;
                            notifier.notify();
                        }
                    }
                }
            })));
        }
        Ok(self.shared.notifier.clone())
    }
}
