//! [`PgStore`]: the one Postgres store, for several relay processes (on several machines)
//! sharing one database, on sqlx's Postgres driver. It connects in one of two ways:
//!
//! - [`PgStore::connect`] (feature `postgres`): from a connection string, with its own
//!   connections (up to [`PgOptions::pool_size`]) and a small tokio runtime of its own that
//!   drives them. This is what the binary runs. The session settings (the schema first on
//!   the `search_path`, the planner settings the hot path is tuned for) are set once per
//!   connection, reads run outside a transaction and writes in one.
//! - [`PgStore::new`] (feature `sqlx`): on a caller's sqlx [`PgPool`], so that a service on
//!   sqlx runs its relay without a second set of connections. Every operation is then a
//!   transaction that begins with `SET LOCAL` of the same settings: nothing changes for the
//!   caller's other queries on the same connections (reads cost one round trip more).
//!
//! Both run the same statements, on the same schema, with the same wake-up channel: relays
//! on either, and enqueues through [`SqlxOutbox`](crate::sqlx::SqlxOutbox) or
//! [`PgStore::enqueue_in`], interoperate. `docs/ARCHITECTURE.md` says why sqlx.
//!
//! # Blocking, on a tokio runtime
//!
//! Every [`Store`](crate::Store) method blocks, as the trait says: the store runs each
//! statement's future on its runtime (its own, or the pool's: the one current when
//! [`PgStore::new`] was called) and waits for it. The runtimes call the store from blocking
//! threads (`outbox_lanes_tokio` through `spawn_blocking`, the blocking runtime from its own
//! threads), so no executor thread waits. Called from an executor thread anyway:
//!
//! - on a multi-thread runtime, the call runs in `tokio::task::block_in_place`: the worker's
//!   other tasks move to another worker while it waits (correct, but it costs a worker);
//! - on a current-thread runtime, the runtime's own thread cannot wait for a future only it
//!   could drive: the call returns [`StoreError::Database`] saying so (tokio's refusal, caught:
//!   a build with `panic = "abort"` aborts instead). Call it through `spawn_blocking`.
//!
//! Dropping the store never blocks (its background tasks are aborted, its runtime shut down
//! in the background), on any thread.
//!
//! # Connections and reconnection
//!
//! When an operation fails because its connection was lost (server restart,
//! `pg_terminate_backend`, network cut) the connection is dropped — with its own connections,
//! every idle one too: whatever killed one most likely killed the others — and the operation
//! is retried ONCE on a new connection when that is safe:
//! - the failure came before the commit was sent: the transaction was certainly rolled back,
//!   so any operation is retried;
//! - the failure came from the commit itself (did it commit?): only idempotent operations are
//!   retried — reads, `ack` (acking a served unit is a no-op), `record_attempts` (absolute
//!   values), `dead_letter` (a delivery no longer pending is left alone; the re-run of one that
//!   did commit finds its dead letter and returns the same id), lane state writes,
//!   `renew_slot`. `enqueue`, `acquire_slot`, `release_slot`, `retire_lane`, replay and purge
//!   return [`StoreError::ConnectionLost`] instead: the caller must check (a re-sent enqueue
//!   would be refused as a duplicate row id if the first one committed).
//!
//! # Clock, slots, wake-ups and liveness
//!
//! Drain-slot leases are judged by the server's `clock_timestamp()` (OL-12), so relays on
//! machines with skewed clocks agree. Pass operations lock the slot row `FOR SHARE` while
//! they check the token, so a take-over waits for them to commit and cannot slip between the
//! check and the write. Every enqueue sends `NOTIFY` in its transaction (delivered on commit,
//! coalesced by the server per transaction); [`DriverStore::watch`](crate::DriverStore::watch)
//! `LISTEN`s on a connection of its own (sqlx's `PgListener`, which reconnects).
//!
//! Each slot holder takes a session advisory lock on a connection of its own, pinged every
//! second: when the process dies or that connection drops, other relays take the holder's
//! slots over at once instead of after their lease (see `pg_schema.rs`). If that connection
//! cannot be opened the holder's slots are recovered by lease expiry only.
//!
//! # TLS and errors
//!
//! [`PgStore::connect`] honours libpq's `sslmode`, `sslrootcert`, `sslcert` and `sslkey`
//! (see [`SslMode`](crate::SslMode) and `pg_url.rs`), on rustls with the `ring` provider, the
//! one the HTTP clients use. A failure keeps sqlx's error as its `source()`, and its message
//! carries what the server said (message, SQLSTATE, detail) in one line.
//!
//! Each store lives in one schema ([`PgOptions::schema`]), created or migrated as
//! [`CommonOptions::schema`] allows, with the tables of `SCHEMA.md`.

use core::future::Future;
use core::time::Duration;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use ::sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgRow};
use ::sqlx::{AssertSqlSafe, Connection as _, Row as _};
use tokio::runtime::{Handle, Runtime, RuntimeFlavor};
use tokio::task::JoinHandle;

use crate::StoreError;
use crate::backend::{Backend, Shared};
use crate::db::{Db, Dialect, Get, Sql, Value};
use crate::notify::Notifier;
use crate::pg_schema;
use crate::sqlx::{bind_pg as bind, sqlx_err};
use crate::types::CommonOptions;

/// How a [`PgStore`] connects and what it keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgOptions {
    /// The schema holding the tables; created if missing. Letters, digits and `_` only.
    pub schema: String,
    /// Payload limit and ack retention.
    pub common: CommonOptions,
    /// Most connections kept open at once ([`PgStore::connect`] only; a caller's pool has
    /// its own bound). The `LISTEN` watcher and each holder's liveness session have one more
    /// each.
    pub pool_size: usize,
    /// `application_name` of the connections (shows in `pg_stat_activity`); an
    /// `application_name` in the connection string takes precedence.
    pub application_name: String,
    /// Timeout for establishing a connection.
    pub connect_timeout: Duration,
    /// The CA certificates (a PEM file) that sign the server's certificate, for `sslmode`
    /// `verify-ca` and `verify-full` (and `prefer`/`require`, which then check the chain);
    /// `sslrootcert` in the connection string takes precedence. `None`: the webpki roots for
    /// the `verify-*` modes, no check for the others. See [`SslMode`](crate::SslMode).
    pub ssl_root_cert: Option<std::path::PathBuf>,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            schema: "outbox_lanes".into(),
            common: CommonOptions::default(),
            pool_size: 4,
            application_name: "outbox-lanes".into(),
            connect_timeout: Duration::from_secs(10),
            ssl_root_cert: None,
        }
    }
}

/// How a [`PgStore`] on a caller's pool ([`PgStore::new`]) uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqlxPgOptions {
    /// The schema holding the tables (as [`PgOptions::schema`]); created if missing. Letters,
    /// digits and `_` only.
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

/// The `postgres` crate whose transactions [`PgStore::enqueue_in`] takes, for callers that take
/// it from here and so stay on the same version.
#[cfg(feature = "postgres")]
pub use ::postgres;

/// Schema version 1, for the migration test, which builds a version 1 database.
#[doc(hidden)]
pub const SCHEMA_V1: &str = pg_schema::SCHEMA_V1;
/// Schema version 2, for the migration test.
#[doc(hidden)]
pub const SCHEMA_V2: &str = pg_schema::SCHEMA_V2;

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

/// The store's own runtime, shut down without waiting when the store is dropped.
#[derive(Debug)]
struct OwnRuntime(Option<Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The store's own connections ([`PgStore::connect`]): created on demand up to the bound,
/// each with sqlx's cache of prepared statements.
#[derive(Debug)]
struct OwnPool {
    options: PgConnectOptions,
    size: usize,
    /// Run on each new connection: the session settings.
    settings: String,
    state: Mutex<PoolState>,
    freed: Condvar,
}

#[derive(Debug)]
struct PoolState {
    idle: Vec<PgConnection>,
    open: usize,
}

/// Where the store's connections come from.
#[derive(Debug)]
enum Source {
    /// Its own ([`PgStore::connect`]); `_runtime` drives them.
    Own(Box<OwnPool>),
    /// A caller's pool ([`PgStore::new`]), every operation a transaction begun with
    /// `SET LOCAL`s: this statement.
    Caller(PgPool, String),
}

/// The Postgres implementation of [`Store`](crate::Store); see the module docs.
#[derive(Debug)]
pub struct PgStore {
    source: Source,
    handle: Handle,
    opts: PgOptions,
    shared: Shared,
    watcher: Mutex<Option<Task>>,
    /// Per holder, the task keeping its liveness lock's connection.
    live: Mutex<HashMap<String, Task>>,
    /// Last: the tasks and connections above go before the runtime that drives them.
    _runtime: OwnRuntime,
}

impl PgStore {
    /// A store on a caller's sqlx `pool`, creating or migrating the schema as
    /// [`CommonOptions::schema`] allows (blocking: call it where the other methods are called,
    /// e.g. in `spawn_blocking`). The pool's runtime must be the current one: every statement
    /// runs on it.
    ///
    /// # Errors
    /// [`StoreError::Open`] outside a tokio runtime or for an invalid schema name;
    /// [`StoreError::SchemaTooNew`] for a database from a newer version; database failures.
    pub fn new(pool: PgPool, opts: SqlxPgOptions) -> Result<PgStore, StoreError> {
        let open_error = |reason: String| StoreError::Open {
            target: format!("sqlx pool (schema {})", opts.schema),
            reason,
            cause: None,
        };
        check_schema_name(&opts.schema).map_err(open_error)?;
        let handle = Handle::try_current().map_err(|e| {
            open_error(format!(
                "no tokio runtime to run the pool's futures on: {e}"
            ))
        })?;
        let begin = format!("BEGIN; {}", pg_schema::settings("LOCAL", &opts.schema));
        let opts = PgOptions {
            schema: opts.schema,
            common: opts.common,
            ..PgOptions::default()
        };
        PgStore::open(Source::Caller(pool, begin), handle, OwnRuntime(None), opts)
    }

    /// Runs the schema's creation or migration and reads the outbox id.
    fn open(
        source: Source,
        handle: Handle,
        runtime: OwnRuntime,
        opts: PgOptions,
    ) -> Result<PgStore, StoreError> {
        let mut store = PgStore {
            shared: Shared::new(Some(pg_schema::channel(&opts.schema))),
            source,
            handle,
            watcher: Mutex::new(None),
            live: Mutex::new(HashMap::new()),
            opts,
            _runtime: runtime,
        };
        store.shared.outbox_id = store.op(true, false, |db: &mut PgDb<'_>| {
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
    pub fn options(&self) -> &PgOptions {
        &self.opts
    }

    /// The caller's pool the store runs on; `None` for a store with its own connections.
    pub fn pool(&self) -> Option<&PgPool> {
        match &self.source {
            Source::Caller(pool, _) => Some(pool),
            Source::Own(_) => None,
        }
    }

    /// Waits for `f` on the store's runtime (see the module docs).
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
                        "PgStore called on a current-thread tokio runtime's own thread; \
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

    /// Runs `f` on a connection, in a transaction it commits (`tx`, and always on a caller's
    /// pool) or with each statement committed on its own, and retries once on a new
    /// connection when the old one was lost and that is safe (see the module docs).
    fn op<T, E: From<StoreError>>(
        &self,
        tx: bool,
        idempotent: bool,
        mut f: impl FnMut(&mut PgDb<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (res, lost, at_commit) = match &self.source {
                Source::Own(pool) => match self.checkout(pool) {
                    Err(e) => {
                        let lost = matches!(e, StoreError::ConnectionLost { .. });
                        (Err(E::from(e)), lost, false)
                    }
                    Ok(mut conn) => {
                        let begin = if tx { Some("BEGIN") } else { None };
                        let out = self.attempt(&mut conn, begin, &mut f);
                        if out.1 {
                            self.discard(pool, conn);
                        } else {
                            self.checkin(pool, conn);
                        }
                        out
                    }
                },
                Source::Caller(pool, begin) => match self.run_sql(pool.acquire()) {
                    Err(e) => {
                        let lost = matches!(e, StoreError::ConnectionLost { .. });
                        (Err(E::from(e)), lost, false)
                    }
                    Ok(mut conn) => {
                        let out = self.attempt(&mut conn, Some(begin), &mut f);
                        if out.1 {
                            conn.close_on_drop();
                        }
                        // On the runtime: a pooled connection goes back to its pool from there.
                        let _on = self.handle.enter();
                        drop(conn);
                        out
                    }
                },
            };
            match res {
                Err(e) if lost => {
                    let retry = attempt < 2 && (!at_commit || idempotent);
                    tracing::warn!(target: "outbox_lanes::store", tx, at_commit, idempotent, retry,
                        "postgres connection lost");
                    if !retry {
                        return Err(e);
                    }
                }
                res => return res,
            }
        }
    }

    /// One attempt of [`Self::op`] on `conn`, in a transaction begun with `begin` if any:
    /// the outcome, whether the connection was lost, and whether at the commit.
    fn attempt<T, E: From<StoreError>>(
        &self,
        conn: &mut PgConnection,
        begin: Option<&str>,
        f: &mut impl FnMut(&mut PgDb<'_>) -> Result<T, E>,
    ) -> (Result<T, E>, bool, bool) {
        let is_lost = |e: &StoreError| matches!(e, StoreError::ConnectionLost { .. });
        let Some(begin) = begin else {
            let mut db = PgDb {
                conn,
                store: self,
                lost: false,
            };
            let out = f(&mut db);
            return (out, db.lost, false);
        };
        let mut t = match self.run_sql(conn.begin_with(AssertSqlSafe(begin.to_owned()))) {
            Ok(t) => t,
            Err(e) => {
                let lost = is_lost(&e);
                return (Err(E::from(e)), lost, false);
            }
        };
        let mut db = PgDb {
            conn: &mut t,
            store: self,
            lost: false,
        };
        match f(&mut db) {
            Err(e) => {
                let lost = db.lost;
                let _ = self.run(t.rollback());
                (Err(e), lost, false)
            }
            Ok(v) => match self.run_sql(t.commit()) {
                Ok(()) => (Ok(v), false, false),
                Err(e) => {
                    let lost = is_lost(&e);
                    (Err(E::from(e)), lost, true)
                }
            },
        }
    }

    fn lock_pool<'p>(&self, pool: &'p OwnPool) -> MutexGuard<'p, PoolState> {
        pool.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An idle connection of the store's own, or a new one while fewer than the bound are
    /// open; else waits for one.
    fn checkout(&self, pool: &OwnPool) -> Result<PgConnection, StoreError> {
        let mut state = self.lock_pool(pool);
        loop {
            if let Some(c) = state.idle.pop() {
                return Ok(c);
            }
            if state.open < pool.size.max(1) {
                state.open += 1;
                drop(state);
                return self.new_conn(pool).inspect_err(|_| {
                    self.lock_pool(pool).open -= 1;
                    pool.freed.notify_one();
                });
            }
            state = pool
                .freed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn new_conn(&self, pool: &OwnPool) -> Result<PgConnection, StoreError> {
        let timeout = self.opts.connect_timeout;
        self.run(async {
            let mut conn = tokio::time::timeout(timeout, PgConnection::connect_with(&pool.options))
                .await
                .map_err(|_| connect_timed_out(timeout))?
                .map_err(sqlx_err)?;
            ::sqlx::raw_sql(AssertSqlSafe(pool.settings.clone()))
                .execute(&mut conn)
                .await
                .map_err(sqlx_err)?;
            Ok(conn)
        })?
    }

    fn checkin(&self, pool: &OwnPool, conn: PgConnection) {
        self.lock_pool(pool).idle.push(conn);
        pool.freed.notify_one();
    }

    /// Drops a lost connection and every idle one: whatever killed one (a server restart, a
    /// network cut) most likely killed the others, and a retry must not pick up a corpse.
    fn discard(&self, pool: &OwnPool, conn: PgConnection) {
        let idle = {
            let mut state = self.lock_pool(pool);
            let idle = core::mem::take(&mut state.idle);
            state.open -= 1 + idle.len();
            idle
        };
        // On the runtime: closing a connection deregisters its socket there.
        let _on = self.handle.enter();
        drop(conn);
        drop(idle);
        pool.freed.notify_all();
    }

    /// A connection outside the pool, with the store's options: the liveness sessions.
    fn connect_alone(&self) -> Result<PgConnection, StoreError> {
        match &self.source {
            Source::Own(pool) => {
                let timeout = self.opts.connect_timeout;
                self.run(async {
                    tokio::time::timeout(timeout, PgConnection::connect_with(&pool.options))
                        .await
                        .map_err(|_| connect_timed_out(timeout))?
                        .map_err(sqlx_err)
                })?
            }
            Source::Caller(pool, _) => {
                let options = pool.connect_options();
                self.run_sql(PgConnection::connect_with(&options))
            }
        }
    }

    /// Takes `holder`'s liveness lock on a connection of its own, kept by a task that pings it
    /// (see the module docs).
    fn keep_alive(&self, holder: &str) -> Result<Option<Task>, StoreError> {
        let mut conn = self.connect_alone()?;
        let mut db = PgDb {
            conn: &mut conn,
            store: self,
            lost: false,
        };
        db.batch(&format!("SET search_path TO {}", self.opts.schema))?;
        if !pg_schema::take_live_lock(&mut db, &self.opts.schema, holder)? {
            let _on = self.handle.enter();
            drop(conn);
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

/// The error of a connection not made within `timeout`.
fn connect_timed_out(timeout: Duration) -> StoreError {
    StoreError::ConnectionLost {
        reason: format!("no connection within the connect timeout ({timeout:?})"),
        cause: None,
    }
}

/// Refuses a schema name the store would not put in its statements.
pub(crate) fn check_schema_name(schema: &str) -> Result<(), String> {
    if pg_schema::valid_schema(schema) {
        Ok(())
    } else {
        Err(format!(
            "invalid schema name {schema:?} (use lower-case letters, digits, _)"
        ))
    }
}

/// A connection of the store (pooled, in a transaction, or a liveness session) as a [`Db`]:
/// each statement waits on the store's runtime; sqlx caches the prepared statements per
/// connection.
pub(crate) struct PgDb<'c> {
    conn: &'c mut PgConnection,
    store: &'c PgStore,
    lost: bool,
}

impl PgDb<'_> {
    fn checked<T>(&mut self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if matches!(r, Err(StoreError::ConnectionLost { .. })) {
            self.lost = true;
        }
        r
    }
}

impl Db for PgDb<'_> {
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

impl Backend for PgStore {
    const DIALECT: Dialect = Dialect::Postgres;
    type Conn<'c> = PgDb<'c>;

    fn read<T>(
        &self,
        f: impl FnMut(&mut PgDb<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.op(false, true, f)
    }

    fn write<T, E: From<StoreError>>(
        &self,
        idempotent: bool,
        f: impl FnMut(&mut PgDb<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.op(true, idempotent, f)
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

    fn holder_is_dead(&self, db: &mut PgDb<'_>, holder: &str) -> Result<bool, StoreError> {
        pg_schema::holder_is_dead(db, &self.opts.schema, holder)
    }

    fn watch(&self) -> Result<Notifier, StoreError> {
        let mut w = self.watcher.lock().unwrap_or_else(PoisonError::into_inner);
        if w.is_none() {
            let channel = self.shared.pg_channel();
            let mut listener = match &self.source {
                Source::Caller(pool, _) => self.run_sql(PgListener::connect_with(pool))?,
                Source::Own(pool) => {
                    // A pool of one, for the listener alone: it reconnects through it.
                    let options = pool.options.clone();
                    let timeout = self.opts.connect_timeout;
                    let listen_pool = {
                        let _on = self.handle.enter();
                        ::sqlx::postgres::PgPoolOptions::new()
                            .max_connections(1)
                            .acquire_timeout(timeout)
                            .connect_lazy_with(options)
                    };
                    self.run_sql(PgListener::connect_with(&listen_pool))?
                }
            };
            self.run_sql(listener.listen(channel))?;
            let notifier = self.shared.notifier.clone();
            *w = Some(Task(self.handle.spawn(async move {
                loop {
                    match listener.try_recv().await {
                        Ok(Some(_)) => {
                            tracing::trace!(target: "outbox_lanes::store", reason = "notify", "wake-up from another process");
                            notifier.notify();
                        }
                        Ok(None) => {
                            // Notifications sent while it was away are lost: wake everyone.
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

/// [`PgStore::connect`], the schema probes of a connection string, and
/// [`PgStore::enqueue_in`] on a caller's `postgres` transaction: the feature `postgres`.
#[cfg(feature = "postgres")]
mod connect {
    use std::collections::HashMap;
    use std::error::Error;
    use std::sync::{Condvar, Mutex};

    use postgres::Transaction;
    use postgres::types::private::BytesMut;
    use postgres::types::{IsNull, ToSql, Type, to_sql_checked};

    use outbox_lanes_core::ActorId;

    use ::sqlx::{AssertSqlSafe, Connection as _};

    use super::{OwnPool, OwnRuntime, PgConnection, PgOptions, PgStore, PoolState, Source};
    use crate::db::{Db, Dialect, Get, Sql, Value, ready};
    use crate::enqueue::enqueue;
    use crate::notify::PendingWake;
    use crate::pg_schema;
    use crate::pg_url::{connect_error, connect_options};
    use crate::prepare::prepare;
    use crate::types::{Enqueued, NewRow};
    use crate::{EnqueueError, StoreError};

    impl PgStore {
        /// Connects to `url` (a `postgres://` URL or a libpq key=value string), and creates or
        /// migrates the schema and its tables as [`CommonOptions::schema`](crate::CommonOptions::schema)
        /// allows (by default: both). A current schema runs no DDL.
        ///
        /// # Errors
        /// [`StoreError::Open`] if the connection string is malformed, the server unreachable
        /// or refusing, or the schema name invalid; [`StoreError::SchemaTooNew`] for a
        /// database from a newer version.
        pub fn connect(url: &str, opts: PgOptions) -> Result<PgStore, StoreError> {
            let (options, target) = connect_options(url, &opts)?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("outbox-lanes-pg")
                .enable_all()
                .build()
                .map_err(|e| StoreError::open(target.clone(), e.to_string(), e))?;
            let handle = runtime.handle().clone();
            let pool = OwnPool {
                options,
                size: opts.pool_size,
                settings: pg_schema::settings("", &opts.schema),
                state: Mutex::new(PoolState {
                    idle: Vec::new(),
                    open: 0,
                }),
                freed: Condvar::new(),
            };
            let source = Source::Own(Box::new(pool));
            PgStore::open(source, handle, OwnRuntime(Some(runtime)), opts).map_err(|e| match e {
                StoreError::ConnectionLost { .. } | StoreError::Driver { .. } => {
                    connect_error(&target, e)
                }
                e => e,
            })
        }

        /// The schema version of the outbox in the schema [`PgOptions::schema`] on the
        /// database at `url`: `None` if it holds none. Reads only (`SELECT` on `ol_meta`).
        ///
        /// # Errors
        /// [`StoreError::Open`] if the connection string is malformed, the server unreachable
        /// or the schema name invalid; [`StoreError::ConnectionLost`] if the query failed.
        pub fn schema_version(url: &str, opts: &PgOptions) -> Result<Option<u32>, StoreError> {
            let (options, target) = connect_options(url, opts)?;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| StoreError::open(target.clone(), e.to_string(), e))?;
            let timeout = opts.connect_timeout;
            let found = runtime.block_on(async {
                let mut conn = tokio::time::timeout(timeout, PgConnection::connect_with(&options))
                    .await
                    .map_err(|_| super::connect_timed_out(timeout))?
                    .map_err(crate::sqlx::sqlx_err)?;
                let meta = format!("{}.ol_meta", opts.schema);
                let found: bool = ::sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
                    .bind(&meta)
                    .fetch_one(&mut conn)
                    .await
                    .map_err(crate::sqlx::sqlx_err)?;
                if !found {
                    return Ok(None);
                }
                let version = format!("SELECT value FROM {meta} WHERE key = 'schema_version'");
                let v: Option<String> = ::sqlx::query_scalar(AssertSqlSafe(version))
                    .fetch_optional(&mut conn)
                    .await
                    .map_err(crate::sqlx::sqlx_err)?;
                v.map(|v| {
                    v.parse().map_err(|_| {
                        StoreError::Database(format!("unreadable schema_version {v:?}"))
                    })
                })
                .transpose()
            });
            found.map_err(|e| match e {
                StoreError::ConnectionLost { .. } | StoreError::Driver { .. } => {
                    connect_error(&target, e)
                }
                e => e,
            })
        }

        /// Whether the schema [`PgOptions::schema`] holds an outbox's tables on the database
        /// at `url`. Creates nothing (no schema, no table).
        ///
        /// # Errors
        /// As [`PgStore::schema_version`].
        pub fn exists(url: &str, opts: &PgOptions) -> Result<bool, StoreError> {
            Ok(PgStore::schema_version(url, opts)?.is_some())
        }

        /// Enqueues inside the caller's own transaction of the `postgres` crate (the
        /// transactional outbox, OL-15). The transaction's connection must have this store's
        /// schema on its `search_path` (`SET search_path TO <schema>`). The `NOTIFY` is part of
        /// the transaction, so other processes are woken on commit; call the returned
        /// [`PendingWake::fire`] after the commit to wake this process's waiters.
        ///
        /// # Errors
        /// As [`ServiceStore::enqueue`](crate::ServiceStore::enqueue). The enqueue runs under a
        /// savepoint: a refused batch leaves the caller's transaction usable.
        pub fn enqueue_in(
            &self,
            tx: &mut Transaction<'_>,
            actor: impl Into<ActorId>,
            rows: &[NewRow],
        ) -> Result<(Vec<Enqueued>, PendingWake), EnqueueError> {
            let actor = &actor.into();
            let prepared = prepare(rows, &self.opts.common)?;
            let mut db = TxDb {
                tx: tx.savepoint("ol_enqueue").map_err(pg_err)?,
                cache: HashMap::new(),
            };
            let channel = Some(self.shared.pg_channel());
            let out = ready(enqueue(
                &mut db,
                actor,
                &prepared,
                channel,
                &self.opts.common,
            ))?;
            db.tx.commit().map_err(pg_err)?;
            Ok((out, PendingWake::new(self.shared.notifier.clone())))
        }
    }

    /// A caller's `postgres` transaction (a savepoint of it) as a [`Db`].
    struct TxDb<'t> {
        tx: Transaction<'t>,
        cache: HashMap<String, postgres::Statement>,
    }

    /// A `postgres` crate error: the server's message and SQLSTATE when it sent one.
    fn pg_err(e: postgres::Error) -> StoreError {
        let reason = match e.as_db_error() {
            Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
            None => e.to_string(),
        };
        if e.is_closed() {
            StoreError::connection_lost(reason, e)
        } else {
            StoreError::driver(reason, e)
        }
    }

    impl TxDb<'_> {
        fn statement(&mut self, sql: &Sql) -> Result<postgres::Statement, StoreError> {
            let text = sql.text(Dialect::Postgres);
            if let Some(st) = self.cache.get(text) {
                return Ok(st.clone());
            }
            let st = self.tx.prepare(text).map_err(pg_err)?;
            self.cache.insert(text.to_owned(), st.clone());
            Ok(st)
        }

        fn rows(
            &mut self,
            sql: &Sql,
            args: &[Value<'_>],
        ) -> Result<Vec<postgres::Row>, StoreError> {
            let st = self.statement(sql)?;
            let params: Vec<&(dyn ToSql + Sync)> = args.iter().map(|v| v as _).collect();
            self.tx.query(&st, &params).map_err(pg_err)
        }
    }

    impl Db for TxDb<'_> {
        const DIALECT: Dialect = Dialect::Postgres;

        fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
            self.tx.batch_execute(sql).map_err(pg_err)
        }

        fn execute(&mut self, sql: &Sql, args: &[Value<'_>]) -> Result<u64, StoreError> {
            let st = self.statement(sql)?;
            let params: Vec<&(dyn ToSql + Sync)> = args.iter().map(|v| v as _).collect();
            self.tx.execute(&st, &params).map_err(pg_err)
        }

        fn insert(&mut self, sql: &Sql, args: &[Value<'_>]) -> Result<Option<i64>, StoreError> {
            self.rows(sql, args)?.first().map(|r| r.int(0)).transpose()
        }

        fn query<T>(
            &mut self,
            sql: &Sql,
            args: &[Value<'_>],
            mut map: impl FnMut(&dyn Get) -> Result<T, StoreError>,
        ) -> Result<Vec<T>, StoreError> {
            self.rows(sql, args)?.iter().map(|r| map(r)).collect()
        }
    }

    impl ToSql for Value<'_> {
        fn to_sql(
            &self,
            ty: &Type,
            out: &mut BytesMut,
        ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
            match *self {
                Value::Int(v) => v.to_sql_checked(ty, out),
                Value::OptInt(v) => v.to_sql_checked(ty, out),
                Value::Text(v) => v.to_sql_checked(ty, out),
                Value::OptText(v) => v.to_sql_checked(ty, out),
                Value::Bytes(v) => v.to_sql_checked(ty, out),
                Value::Bool(v) => v.to_sql_checked(ty, out),
                Value::Ints(v) => v.to_sql_checked(ty, out),
                Value::OptInts(v) => v.to_sql_checked(ty, out),
                Value::Texts(v) => v.to_sql_checked(ty, out),
                Value::OptTexts(v) => v.to_sql_checked(ty, out),
                Value::Byteses(v) => v.to_sql_checked(ty, out),
            }
        }

        fn accepts(_: &Type) -> bool {
            // Each value checks its own type in `to_sql`.
            true
        }

        to_sql_checked!();
    }

    crate::db::impl_get!(postgres::Row, |r, c| r.try_get(c).map_err(pg_err), arrays);
}
