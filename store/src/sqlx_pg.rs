//! [`SqlxPgStore`]: the relay's Postgres store on a caller's sqlx pool (feature `sqlx`); its
//! docs say which pools it takes, how it blocks and which connections it uses.

use core::future::Future;
use core::time::Duration;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Mutex, PoisonError};

use ::sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgSslMode};
use ::sqlx::{AssertSqlSafe, ConnectOptions as _, Connection as _};

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
    /// Payload limit, retentions and schema policy.
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

/// The smallest pool the store takes: its `LISTEN` holds one connection, its transactions
/// need another.
const MIN_POOL: u32 = 2;

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

/// The relay's Postgres store on a caller's sqlx [`PgPool`] (feature `sqlx`), so a service on
/// sqlx runs its relay with one Postgres client, for plain and `require` connections;
/// [`PgStore`](crate::PgStore) keeps the modes that verify the server.
///
/// ```no_run
/// # async fn f(url: &str) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_lanes_store::sqlx::{SqlxPgOptions, SqlxPgStore, sqlx::PgPool};
/// let pool = PgPool::connect(url).await?; // the service's own pool
/// // Refuses verify-ca / verify-full; creates or migrates the schema.
/// let store = SqlxPgStore::new(pool.clone(), SqlxPgOptions::default()).await?;
/// // Hand `Arc::new(store)` to the runtime's `Outbox::open`.
/// # Ok(()) }
/// ```
///
/// It runs the same statements as [`PgStore`](crate::PgStore) (the hot path of `pg_path.rs`,
/// the operations written once over the statement layer), on the same schema, with the same
/// wake-up channel: relays on either store, and enqueues through
/// [`SqlxOutbox`](crate::sqlx::SqlxOutbox), interoperate.
///
/// # Which pools it takes
///
/// [`SqlxPgStore::new`] refuses a pool whose connect options ask for `sslmode=verify-ca` or
/// `verify-full`, or carry a root certificate (`sslrootcert`, `PGSSLROOTCERT`,
/// `PgConnectOptions::ssl_root_cert`), in any mode; the error names
/// [`PgStore::connect`](crate::PgStore::connect), the store for those. It takes `disable`,
/// `allow`, `prefer` and `require` without a root certificate: there sqlx does what libpq
/// does, it checks no certificate. Where they would verify, sqlx 0.9 does not do what libpq
/// does:
///
/// - `verify-ca` / `verify-full` with a CA file: sqlx's rustls handshake adds the file's
///   certificates to the public (webpki) roots instead of trusting them alone, so a server
///   with any publicly issued certificate passes `verify-ca` whatever its name, and
///   `verify-full` trusts every public CA beside yours;
/// - `prefer` / `require` with a CA file: libpq checks the chain, sqlx checks nothing;
/// - `sslrootcert=system`: sqlx reads it as a file named `system`.
///
/// `PgStore`'s TLS (`tls.rs`) keeps libpq's rules. sqlx also sends no SCRAM channel binding:
/// a deployment that relies on `channel_binding=require` uses `PgStore` too. The check reads
/// the options when the store is made ([`PgConnectOptions::get_ssl_mode`], and the
/// `sslrootcert` of
/// [`ConnectOptions::to_url_lossy`](::sqlx::ConnectOptions::to_url_lossy), since sqlx 0.9
/// has no getter for it); options set on the pool later (`PgPool::set_connect_options`) are
/// not checked again.
///
/// # Blocking, on the pool's runtime
///
/// Every [`Store`](crate::Store) method blocks, as the trait says; the store runs each
/// statement's future on the tokio runtime the pool belongs to (the one [`SqlxPgStore::new`]
/// ran on) and waits for it. The runtimes call the store from blocking threads
/// (`outbox_lanes_tokio` through `spawn_blocking`, the blocking runtime from its own threads),
/// so no executor thread waits. Called from an executor thread anyway:
///
/// - on a multi-thread runtime, the call runs in `tokio::task::block_in_place`: the worker's
///   other tasks move to another worker while it waits (correct, but it costs a worker);
/// - on a current-thread runtime, the runtime's own thread cannot wait for a future only it
///   could drive: the call returns [`StoreError::Database`] saying so (tokio's refusal, caught:
///   a build with `panic = "abort"` aborts instead). Call it through `spawn_blocking`.
///
/// Dropping the store never blocks (its background tasks are aborted), on any thread.
///
/// # Connections
///
/// Statements run on connections of the caller's pool, each operation in a transaction that
/// begins with `SET LOCAL` of the store's settings (its schema first on the `search_path`, the
/// planner settings of `PgStore`'s sessions): nothing changes for the caller's other queries on
/// the same connections. Reads and the one-statement ack, which `PgStore` runs outside a
/// transaction, are transactions here too (one round trip more). An operation that loses its
/// connection is retried once on another, when that is safe (as `PgStore` does).
///
/// - [`DriverStore::watch`](crate::DriverStore::watch) holds one connection of the pool for
///   its `LISTEN` (a `PgListener`), for the store's life: size the pool one larger (the
///   store refuses a pool of fewer than 2).
/// - Liveness: each slot holder takes a session advisory lock on a connection of its own,
///   opened with the pool's connect options but outside the pool, and pinged every second; when
///   the process dies or that connection drops, other relays take the holder's slots over at
///   once, as with `PgStore`. If that connection cannot be opened the holder's slots are
///   recovered by lease expiry only.
/// - Creating or migrating the schema takes the DDL lock on one pool connection for the
///   session, as `PgStore` does; a connection whose lock could not be given back is closed,
///   not returned to the pool.
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

/// Why `options` cannot carry the relay's store (see [`SqlxPgStore`]), as the reason of a
/// [`StoreError::Open`]; `None` when they can.
fn tls_refusal(options: &PgConnectOptions) -> Option<String> {
    let mode = match options.get_ssl_mode() {
        PgSslMode::VerifyCa => Some("sslmode=verify-ca"),
        PgSslMode::VerifyFull => Some("sslmode=verify-full"),
        PgSslMode::Disable | PgSslMode::Allow | PgSslMode::Prefer | PgSslMode::Require => None,
    };
    let root_cert = options
        .to_url_lossy()
        .query_pairs()
        .any(|(k, _)| k == "sslrootcert");
    let what = match (mode, root_cert) {
        (Some(mode), _) => mode.to_owned(),
        (None, true) => format!(
            "a root certificate (sslrootcert or PGSSLROOTCERT) with sslmode={}",
            mode_name(options.get_ssl_mode())
        ),
        (None, false) => return None,
    };
    Some(format!(
        "SqlxPgStore refuses a pool with {what}: sqlx's TLS does not verify the server as libpq \
         does (it adds a CA file to the public roots, and checks nothing in prefer/require); \
         open the relay's store with PgStore::connect(url, PgOptions) for verify-ca, \
         verify-full or a root certificate, or give SqlxPgStore a pool with sslmode=disable, \
         prefer or require and no root certificate"
    ))
}

fn mode_name(mode: PgSslMode) -> &'static str {
    match mode {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    }
}

impl SqlxPgStore {
    /// A store on `pool`, after checking that its connect options are ones sqlx verifies as
    /// libpq would (see [which pools it takes](SqlxPgStore#which-pools-it-takes): no
    /// `verify-ca`, `verify-full` or root certificate), creating or migrating the schema as [`CommonOptions::schema`] allows.
    /// Call it on the tokio runtime the pool belongs to: every statement of the store runs
    /// there. The schema work runs on that runtime's blocking pool.
    ///
    /// # Errors
    /// [`StoreError::Open`] for a pool with `verify-ca`, `verify-full` or a root certificate
    /// (naming [`PgStore::connect`](crate::PgStore::connect), the store for those), a pool of
    /// fewer than 2 connections (the store's `LISTEN` holds one), outside a tokio runtime, or
    /// for an invalid schema name; [`StoreError::SchemaTooNew`] for a
    /// database from a newer version; database failures.
    pub async fn new(pool: PgPool, opts: SqlxPgOptions) -> Result<SqlxPgStore, StoreError> {
        let options = pool.connect_options();
        let target = format!(
            "sqlx pool {}@{}:{}/{} (schema {})",
            options.get_username(),
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or(""),
            opts.schema
        );
        let open_error = |reason: String| StoreError::Open {
            target: target.clone(),
            reason,
            cause: None,
        };
        if let Some(reason) = tls_refusal(&options) {
            return Err(open_error(reason));
        }
        let size = pool.options().get_max_connections();
        if size < MIN_POOL {
            return Err(open_error(format!(
                "SqlxPgStore needs a pool of at least {MIN_POOL} connections (this one has \
                 max_connections {size}): its LISTEN holds one for the store's life; raise \
                 PgPoolOptions::max_connections"
            )));
        }
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
        let mut store = SqlxPgStore {
            begin: format!("BEGIN; {}", pg_schema::settings("LOCAL", &opts.schema)),
            shared: Shared::new(Some(pg_schema::channel(&opts.schema))),
            pool,
            handle: handle.clone(),
            watcher: Mutex::new(None),
            live: Mutex::new(HashMap::new()),
            opts,
        };
        handle
            .spawn_blocking(move || {
                store.shared.outbox_id = store.open_schema()?;
                Ok(store)
            })
            .await
            .map_err(|e| open_error(format!("opening the schema did not finish: {e}")))?
    }

    /// The options the store was made with.
    pub fn options(&self) -> &SqlxPgOptions {
        &self.opts
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Opens the schema as [`CommonOptions::schema`] allows and returns the outbox id, as
    /// `PgStore` does: a current schema costs one read transaction; otherwise the DDL lock is
    /// taken for one pool connection's session and the schema made or migrated in a
    /// transaction begun after it was granted (see [`pg_schema::lock_ddl`]).
    fn open_schema(&self) -> Result<String, StoreError> {
        let (schema, policy) = (&self.opts.schema, self.opts.common.schema);
        if let Some(id) = self.tx(true, |db| pg_schema::current(db, schema, policy))? {
            return Ok(id);
        }
        let channel = self.shared.pg_channel();
        let mut conn = self.run_sql(self.pool.acquire())?;
        let locked = pg_schema::lock_ddl(&mut self.on(&mut conn), channel);
        let made = locked.and_then(|()| {
            let mut tx = self.run_sql(conn.begin_with(AssertSqlSafe(self.begin.clone())))?;
            let id = pg_schema::create_or_migrate(&mut self.on(&mut tx), schema, policy);
            match id {
                Ok(id) => self.run_sql(tx.commit()).map(|()| id),
                Err(e) => {
                    let _ = self.run(tx.rollback());
                    Err(e)
                }
            }
        });
        let unlocked = pg_schema::unlock_ddl(&mut self.on(&mut conn), channel);
        if made.is_err() || unlocked.is_err() {
            // Its session may still hold the lock, or be mid-transaction: not for the pool.
            conn.close_on_drop();
        }
        // On the runtime: a pooled connection goes back to (or leaves) its pool from there.
        let _in = self.handle.enter();
        drop(conn);
        let id = made?;
        unlocked?;
        Ok(id)
    }

    /// A connection of the store's as the statement layer.
    fn on<'c>(&'c self, conn: &'c mut PgConnection) -> SqlxDb<'c> {
        SqlxDb {
            conn,
            store: self,
            lost: false,
        }
    }

    /// Waits for `f` on the pool's runtime (see [`SqlxPgStore`], "Blocking").
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
                        let mut db = self.on(&mut tx);
                        match f(&mut db) {
                            Err(e) => {
                                let lost = db.lost;
                                // On the runtime: a pooled connection goes back to its pool
                                // from there.
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
    /// (see [`SqlxPgStore`], "Connections", and `PgStore`'s `keep_alive`).
    fn keep_alive(&self, holder: &str) -> Result<Option<Task>, StoreError> {
        let options = self.pool.connect_options();
        let mut conn = self.run_sql(PgConnection::connect_with(&options))?;
        let mut db = self.on(&mut conn);
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

    /// The holder leaves `ol_live_holders` when it holds no slot
    /// ([`pg_schema::leave_live_holders`], on a pooled connection), then its liveness session
    /// ends (the task that keeps it is aborted, which closes the connection and frees the lock).
    fn release_holder(&self, holder: &str) {
        let task = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(holder);
        if task.is_none() {
            return;
        }
        if let Err(e) = self.write(false, |db| pg_schema::leave_live_holders(db, holder)) {
            tracing::debug!(target: "outbox_lanes::store", holder, error = %e,
                "could not leave the live holders; another relay forgets this one when it finds it dead");
        }
        drop(task);
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

#[cfg(test)]
mod tests {
    use ::sqlx::postgres::{PgConnectOptions, PgSslMode};

    use super::tls_refusal;

    fn options(mode: PgSslMode) -> PgConnectOptions {
        PgConnectOptions::new_without_pgpass()
            .host("127.0.0.1")
            .ssl_mode(mode)
    }

    #[test]
    fn the_modes_that_verify_are_refused_naming_pgstore() {
        for mode in [PgSslMode::VerifyCa, PgSslMode::VerifyFull] {
            let why = tls_refusal(&options(mode)).expect("refused");
            assert!(why.contains("PgStore::connect"), "{why}");
            assert!(why.contains("sslmode=verify-"), "{why}");
        }
    }

    #[test]
    fn a_root_certificate_is_refused_in_any_mode() {
        for mode in [
            PgSslMode::Disable,
            PgSslMode::Allow,
            PgSslMode::Prefer,
            PgSslMode::Require,
        ] {
            let why = tls_refusal(&options(mode).ssl_root_cert("/etc/ssl/ca.pem"))
                .expect("refused with a CA");
            assert!(why.contains("root certificate"), "{why}");
            assert!(why.contains("PgStore::connect"), "{why}");
            let inline =
                options(mode).ssl_root_cert_from_pem(b"-----BEGIN CERTIFICATE-----".to_vec());
            assert!(tls_refusal(&inline).is_some(), "{mode:?} with an inline CA");
        }
    }

    #[test]
    fn the_modes_that_verify_nothing_are_taken_without_a_ca() {
        for mode in [
            PgSslMode::Disable,
            PgSslMode::Allow,
            PgSslMode::Prefer,
            PgSslMode::Require,
        ] {
            assert_eq!(tls_refusal(&options(mode)), None, "{mode:?}");
        }
        // A client certificate is the server's check of us, not ours of the server.
        let client = options(PgSslMode::Require)
            .ssl_client_cert("/etc/ssl/me.pem")
            .ssl_client_key("/etc/ssl/me.key");
        assert_eq!(tls_refusal(&client), None);
    }
}
