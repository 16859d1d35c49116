//! The Postgres store: several relay processes (on several machines) sharing one database.
//!
//! # Keep it off the async executor
//!
//! The `postgres` crate is a blocking wrapper that owns a tokio runtime per connection. Every
//! call into a [`PgStore`] — and its drop, which closes connections — must run on a plain
//! thread (an async runtime calls it through `spawn_blocking`), never on an executor thread:
//! blocking there panics or stalls the executor.
//! [`PgStore::connect_async`] connects from async code on any executor: the connect runs on a
//! thread of its own.
//!
//! # Connections and reconnection
//!
//! A small pool of connections (created on demand up to [`PgOptions::pool_size`]), each with
//! its own cache of prepared statements. When an operation fails because the connection was
//! lost (server restart, `pg_terminate_backend`, network cut) the connection is dropped and
//! the operation is retried ONCE on a new connection when that is safe:
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
//! # Clock, slots and wake-ups
//!
//! Drain-slot leases are judged by the server's `clock_timestamp()` (OL-12), so relays on
//! machines with skewed clocks agree. Pass operations lock the slot row `FOR SHARE` while
//! they check the token, so a take-over waits for them to commit and cannot slip between the
//! check and the write. Every enqueue sends `NOTIFY` in its transaction (delivered on commit,
//! coalesced by the server per transaction); [`DriverStore::watch`](crate::DriverStore::watch) LISTENs on its own connection.
//!
//! # TLS and errors
//!
//! Connections honour libpq's `sslmode` and `sslrootcert` (see [`SslMode`](crate::SslMode));
//! `sslmode=disable` connects exactly as a plain client. A failure keeps the driver's
//! `postgres::Error` as its `source()`, and its message carries what the server said (message,
//! SQLSTATE, detail, hint) in one line.
//!
//! Each store lives in one schema ([`PgOptions::schema`]) with the tables of `SCHEMA.md`.

use core::time::Duration;
use std::collections::HashMap;
use std::error::Error;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use core::sync::atomic::{AtomicBool, Ordering};

pub use postgres;
use postgres::fallible_iterator::FallibleIterator;
use postgres::types::private::BytesMut;
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use postgres::{Client, Config, Row, Statement, Transaction};

use outbox_lanes_core::ActorId;

use crate::backend::{Backend, Shared};
use crate::db::{Db, Dialect, Get, Sql, Value, ready};
use crate::enqueue::enqueue;
use crate::notify::{Notifier, PendingWake};
use crate::pg_schema;
use crate::prepare::{check_stored_policy, prepare};
use crate::tls::{ConfigError, Connector};
use crate::types::*;
use crate::watcher::WatcherThread;
use crate::{EnqueueError, StoreError};

/// How a [`PgStore`] connects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgOptions {
    /// The schema holding the tables; created if missing. Letters, digits and `_` only.
    pub schema: String,
    /// Payload limit and ack retention.
    pub common: CommonOptions,
    /// Most connections kept open at once.
    pub pool_size: usize,
    /// `application_name` of the connections (shows in `pg_stat_activity`).
    pub application_name: String,
    /// Timeout for establishing a connection.
    pub connect_timeout: Duration,
    /// How long the LISTEN watcher waits between checks of its stop flag.
    pub watch_interval: Duration,
    /// The CA certificates (a PEM file) that sign the server's certificate, for `sslmode`
    /// `verify-ca` and `verify-full` (and `prefer`/`require`, which then check the chain);
    /// `sslrootcert` in the URL takes precedence. `None`: the webpki roots for the `verify-*`
    /// modes, no check for the others. See [`SslMode`](crate::SslMode).
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
            watch_interval: Duration::from_millis(100),
            ssl_root_cert: None,
        }
    }
}

/// Schema version 1, for the migration test, which builds a version 1 database.
#[doc(hidden)]
pub const SCHEMA_V1: &str = pg_schema::SCHEMA_V1;
/// Schema version 2, for the migration test.
#[doc(hidden)]
pub const SCHEMA_V2: &str = pg_schema::SCHEMA_V2;

/// A driver error in one line, with what it wraps: the server's message, SQLSTATE, detail
/// and hint for a `DbError` (`postgres::Error` itself only says "db error"), else the chain of
/// causes (`error performing TLS handshake: invalid peer certificate: UnknownIssuer`).
pub(crate) fn pg_text(e: &postgres::Error) -> String {
    use core::fmt::Write as _;
    let mut out = String::new();
    if let Some(db) = e.as_db_error() {
        let _ = write!(
            out,
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
        if let Some(d) = db.detail() {
            let _ = write!(out, "; detail: {d}");
        }
        if let Some(h) = db.hint() {
            let _ = write!(out, "; hint: {h}");
        }
    } else {
        out = e.to_string();
        let mut cause = core::error::Error::source(e);
        // Bounded: an error chain is finite, but a cycle must not hang an error report.
        for _ in 0..8 {
            let Some(c) = cause else { break };
            let text = c.to_string();
            if !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            cause = c.source();
        }
        if let Some(hint) = crate::tls::hint(e) {
            out.push_str(" (");
            out.push_str(hint);
            out.push(')');
        }
    }
    // One line, whatever the server sent.
    out.replace(['\n', '\r'], " ")
}

fn pg_err(e: postgres::Error) -> StoreError {
    if e.is_closed() {
        return StoreError::connection_lost(pg_text(&e), e);
    }
    // Owned: `e` goes into the error as its cause.
    let code = e.code().map(|c| String::from(c.code()));
    match code {
        Some(c) => StoreError::of_sqlstate(&c, pg_text(&e), e),
        // No SQLSTATE: an I/O failure means the connection is gone; anything else (a value
        // that does not convert) is an ordinary error.
        None => {
            let io = core::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
            if io {
                StoreError::connection_lost(pg_text(&e), e)
            } else {
                StoreError::driver(pg_text(&e), e)
            }
        }
    }
}

impl From<postgres::Error> for StoreError {
    fn from(e: postgres::Error) -> Self {
        pg_err(e)
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

crate::db::impl_get!(Row, |r, c| Ok(r.try_get(c)?), arrays);

/// A connection as a [`Db`]: a pooled client, each statement committed on its own, or a
/// transaction (the store's own, or a savepoint in a caller's). With the pool's cache, each
/// statement is prepared once per connection.
pub(crate) struct PgDb<'c> {
    on: On<'c>,
    cache: Option<&'c mut HashMap<String, Statement>>,
    /// A statement failed because the connection was lost: the store retries elsewhere.
    lost: bool,
}

enum On<'c> {
    Client(&'c mut Client),
    Tx(Transaction<'c>),
}

impl<'c> PgDb<'c> {
    /// Statements on `on`, prepared through `cache` if given (else each time).
    fn new(on: On<'c>, cache: Option<&'c mut HashMap<String, Statement>>) -> PgDb<'c> {
        PgDb {
            on,
            cache,
            lost: false,
        }
    }

    fn statement(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        if let Some(st) = self.cache.as_deref().and_then(|c| c.get(sql)) {
            return Ok(st.clone());
        }
        let st = match &mut self.on {
            On::Client(c) => c.prepare(sql)?,
            On::Tx(t) => t.prepare(sql)?,
        };
        if let Some(c) = self.cache.as_deref_mut() {
            c.insert(sql.to_owned(), st.clone());
        }
        Ok(st)
    }

    /// Statements on a plain client, each prepared when it runs.
    pub(crate) fn of_client(client: &'c mut Client) -> PgDb<'c> {
        PgDb::new(On::Client(client), None)
    }

    /// `r` as the store's error, noting a lost connection.
    fn checked<T>(&mut self, r: Result<T, postgres::Error>) -> Result<T, StoreError> {
        r.map_err(|e| {
            let e = pg_err(e);
            self.lost |= matches!(e, StoreError::ConnectionLost { .. });
            e
        })
    }

    fn rows(&mut self, sql: &Sql, args: &[Value<'_>]) -> Result<Vec<Row>, StoreError> {
        let params: Vec<&(dyn ToSql + Sync)> = args.iter().map(|v| v as _).collect();
        let rows = self
            .statement(sql.text(Dialect::Postgres))
            .and_then(|st| match &mut self.on {
                On::Client(c) => c.query(&st, &params),
                On::Tx(t) => t.query(&st, &params),
            });
        self.checked(rows)
    }

    /// Commits a transaction (nothing to do for a client's statements).
    fn commit(self) -> Result<(), StoreError> {
        match self.on {
            On::Tx(t) => Ok(t.commit()?),
            On::Client(_) => Ok(()),
        }
    }
}

impl Db for PgDb<'_> {
    const DIALECT: Dialect = Dialect::Postgres;

    fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
        let done = match &mut self.on {
            On::Client(c) => c.batch_execute(sql),
            On::Tx(t) => t.batch_execute(sql),
        };
        self.checked(done)
    }

    fn execute(&mut self, sql: &Sql, args: &[Value<'_>]) -> Result<u64, StoreError> {
        let params: Vec<&(dyn ToSql + Sync)> = args.iter().map(|v| v as _).collect();
        let n = self
            .statement(sql.text(Dialect::Postgres))
            .and_then(|st| match &mut self.on {
                On::Client(c) => c.execute(&st, &params),
                On::Tx(t) => t.execute(&st, &params),
            });
        self.checked(n)
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

struct Conn {
    client: Client,
    cache: HashMap<String, Statement>,
}

struct Pool {
    idle: Vec<Conn>,
    open: usize,
}

/// The Postgres implementation of [`Store`](crate::Store); see the module docs.
pub struct PgStore {
    config: Config,
    /// Plain or TLS connections, as the URL's `sslmode` says.
    tls: Connector,
    target: String,
    opts: PgOptions,
    pool: Mutex<Pool>,
    freed: Condvar,
    shared: Shared,
    watcher: Mutex<Option<WatcherThread>>,
    /// One session per holder of this store, holding the holder's advisory lock for the
    /// store's life: see [`PgStore::register_holder`].
    live: Mutex<HashMap<String, postgres::Client>>,
}

/// The waiting end of [`PgStore::connect_async`]. Dropped before the store came (the future
/// was cancelled), it closes the channel, so that the connecting thread keeps the store and
/// drops it there; a store already sent is dropped on a thread of its own. A `PgStore`
/// dropped on an executor thread would panic (its client owns a runtime).
struct Connecting(futures_channel::oneshot::Receiver<Result<PgStore, StoreError>>);

impl Drop for Connecting {
    fn drop(&mut self) {
        self.0.close();
        if let Ok(Some(Ok(store))) = self.0.try_recv() {
            let _ = std::thread::Builder::new()
                .name("outbox-lanes-pg-close".into())
                .spawn(move || drop(store));
        }
    }
}

impl core::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PgStore")
            .field("target", &self.target)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

/// `url` without its password (for error messages), the driver's configuration with `opts`'
/// connection settings, and the connector: `sslmode` and `sslrootcert` are handled by
/// [`crate::tls`], the rest by the `postgres` crate.
pub(crate) fn config_of(
    url: &str,
    opts: &PgOptions,
) -> Result<(String, Config, Connector), StoreError> {
    let target = redact(url);
    let refused = |reason| StoreError::Open {
        target: target.clone(),
        reason,
        cause: None,
    };
    if !pg_schema::valid_schema(&opts.schema) {
        let s = &opts.schema;
        return Err(refused(format!(
            "invalid schema name {s:?} (use lower-case letters, digits, _)"
        )));
    }
    let (mut config, tls) =
        Connector::new(url, opts.ssl_root_cert.as_deref()).map_err(|e| match e {
            ConfigError::Driver(e) => StoreError::open(target.clone(), pg_text(&e), e),
            ConfigError::Message(reason) => refused(reason),
        })?;
    config.application_name(&opts.application_name);
    config.connect_timeout(opts.connect_timeout);
    Ok((target, config, tls))
}

/// A URL without its password, for error messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &userinfo[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

impl PgStore {
    /// Connects to `url` (a `postgres://` URL or key=value string), and creates or migrates
    /// the schema and its tables as [`CommonOptions::schema`] allows (by default: both). A
    /// current schema runs no DDL.
    ///
    /// # Errors
    /// [`StoreError::Open`] if the URL is malformed, the server unreachable or the schema name
    /// invalid; [`StoreError::SchemaTooNew`] for a database from a newer version.
    pub fn connect(url: &str, opts: PgOptions) -> Result<PgStore, StoreError> {
        let (target, config, tls) = config_of(url, &opts)?;
        let mut store = PgStore {
            shared: Shared::new(Some(pg_schema::channel(&opts.schema))),
            config,
            tls,
            target,
            pool: Mutex::new(Pool {
                idle: Vec::new(),
                open: 0,
            }),
            freed: Condvar::new(),
            watcher: Mutex::new(None),
            live: Mutex::new(HashMap::new()),
            opts,
        };
        let mut conn = store.new_conn(true)?;
        store.shared.outbox_id = store.init_schema(&mut conn)?;
        store.lock_pool().open += 1;
        store.checkin(conn);
        Ok(store)
    }

    /// [`PgStore::connect`] for async code, on any executor (tokio, async-std, smol): the
    /// connect, and the schema's creation or migration, run on a thread of their own, and the
    /// future waits for them without blocking the executor.
    ///
    /// The store it gives is a `PgStore` like any other: hand it to an async runtime's
    /// `Outbox`, which calls it (and drops it) on its blocking pool, never on an executor
    /// thread (see the [module docs](self)). Dropping the future before it is ready leaves
    /// the store to that thread, which closes it there.
    ///
    /// # Errors
    /// As [`PgStore::connect`]; [`StoreError::Open`] if the thread could not be started.
    pub async fn connect_async(url: &str, opts: PgOptions) -> Result<PgStore, StoreError> {
        let url = url.to_owned();
        let (tx, rx) = futures_channel::oneshot::channel();
        std::thread::Builder::new()
            .name("outbox-lanes-pg-connect".into())
            .spawn(move || {
                // Refused when the future was dropped: the store comes back, dropped here.
                let _ = tx.send(PgStore::connect(&url, opts));
            })
            .map_err(|e| {
                StoreError::open(
                    "(postgres)",
                    format!("cannot start a thread to connect: {e}"),
                    e,
                )
            })?;
        let mut answer = Connecting(rx);
        (&mut answer.0).await.unwrap_or_else(|_| {
            Err(StoreError::Database(
                "the thread connecting to postgres ended without an answer".into(),
            ))
        })
    }

    fn new_conn(&self, first: bool) -> Result<Conn, StoreError> {
        let mut client = self.tls.connect(&self.config).map_err(|e| {
            if first {
                StoreError::open(self.target.clone(), pg_text(&e), e)
            } else {
                StoreError::connection_lost(pg_text(&e), e)
            }
        })?;
        // The planner settings every statement of the store is tuned for (see there).
        client.batch_execute(&pg_schema::settings("", &self.opts.schema))?;
        Ok(Conn {
            client,
            cache: HashMap::new(),
        })
    }

    /// Opens the schema on `conn` as [`CommonOptions::schema`] allows and returns the outbox
    /// id. A current schema costs three reads in one transaction and no lock. Otherwise the
    /// DDL lock is taken for the session and the schema made or migrated in a transaction of
    /// its own, begun after the lock was granted (see [`pg_schema::lock_ddl`] for why), so
    /// processes opening one schema at once make it once; the lock is given back after the
    /// commit, or goes with the connection when the store fails to open.
    fn init_schema(&self, conn: &mut Conn) -> Result<String, StoreError> {
        let (schema, policy) = (&self.opts.schema, self.opts.common.schema);
        let channel = self.shared.pg_channel();
        let mut db = PgDb::new(On::Tx(conn.client.transaction()?), None);
        let found = pg_schema::current(&mut db, schema, policy)?;
        db.commit()?;
        if let Some(id) = found {
            return Ok(id);
        }
        pg_schema::lock_ddl(&mut PgDb::of_client(&mut conn.client), channel)?;
        let made = (|| -> Result<String, StoreError> {
            let mut db = PgDb::new(On::Tx(conn.client.transaction()?), None);
            let id = pg_schema::create_or_migrate(&mut db, schema, policy)?;
            db.commit()?;
            Ok(id)
        })();
        let unlocked = pg_schema::unlock_ddl(&mut PgDb::of_client(&mut conn.client), channel);
        let id = made?;
        unlocked?;
        Ok(id)
    }

    /// Liveness beside the lease: `holder` holds a session advisory lock on a connection of
    /// its own for as long as this store lives (see [`pg_schema::take_live_lock`]).
    fn keep_alive(&self, holder: &str) {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if live.get(holder).is_some_and(|c| !c.is_closed()) {
            return;
        }
        let registered = (|| -> Result<bool, StoreError> {
            let mut client = self.tls.connect(&self.config)?;
            client.batch_execute(&format!("SET search_path TO {}", self.opts.schema))?;
            let mut db = PgDb::of_client(&mut client);
            let got = pg_schema::take_live_lock(&mut db, &self.opts.schema, holder)?;
            drop(db);
            if got {
                live.insert(holder.to_owned(), client);
            }
            Ok(got)
        })();
        match registered {
            Ok(true) => {}
            Ok(false) => pg_schema::log_no_live_lock(holder, None),
            Err(e) => pg_schema::log_no_live_lock(holder, Some(&e)),
        }
    }

    fn lock_pool(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn checkout(&self) -> Result<Conn, StoreError> {
        let mut pool = self.lock_pool();
        loop {
            if let Some(c) = pool.idle.pop() {
                if !c.client.is_closed() {
                    return Ok(c);
                }
                pool.open -= 1;
                continue;
            }
            if pool.open < self.opts.pool_size.max(1) {
                pool.open += 1;
                drop(pool);
                return self.new_conn(false).inspect_err(|_| {
                    self.lock_pool().open -= 1;
                    self.freed.notify_one();
                });
            }
            pool = self
                .freed
                .wait(pool)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn checkin(&self, conn: Conn) {
        let mut pool = self.lock_pool();
        if conn.client.is_closed() {
            pool.open -= 1;
        } else {
            pool.idle.push(conn);
        }
        drop(pool);
        self.freed.notify_one();
    }

    /// Drops a lost connection and every idle one: whatever killed one (a server restart, a
    /// network cut) most likely killed the others, and a retry must not pick up a corpse.
    fn discard(&self, conn: Conn) {
        let idle = {
            let mut pool = self.lock_pool();
            let idle = core::mem::take(&mut pool.idle);
            pool.open -= 1 + idle.len();
            idle
        };
        drop(conn);
        drop(idle);
        self.freed.notify_all();
    }

    /// Runs `f` on a pooled connection, in a transaction it commits (`tx`) or with each
    /// statement committed on its own, and retries once on a new connection when the old one
    /// was lost and that is safe (see the module docs).
    fn run<T, E: From<StoreError>>(
        &self,
        tx: bool,
        idempotent: bool,
        mut f: impl FnMut(&mut PgDb<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut conn = self.checkout()?;
            let (res, lost, at_commit) = {
                let Conn { client, cache } = &mut conn;
                let on = if tx {
                    client.transaction().map(On::Tx)
                } else {
                    Ok(On::Client(client))
                };
                match on.map_err(pg_err) {
                    Err(e) => {
                        let lost = matches!(e, StoreError::ConnectionLost { .. });
                        (Err(E::from(e)), lost, false)
                    }
                    Ok(on) => {
                        let mut db = PgDb::new(on, Some(cache));
                        match f(&mut db) {
                            Err(e) => (Err(e), db.lost, false),
                            Ok(v) => match db.commit() {
                                Ok(()) => (Ok(v), false, false),
                                Err(e) => {
                                    let lost = matches!(e, StoreError::ConnectionLost { .. });
                                    (Err(E::from(e)), lost, true)
                                }
                            },
                        }
                    }
                }
            };
            match res {
                Ok(v) => {
                    self.checkin(conn);
                    return Ok(v);
                }
                Err(e) if lost || conn.client.is_closed() => {
                    self.discard(conn);
                    let retry = attempt < 2 && (!at_commit || idempotent);
                    tracing::warn!(target: "outbox_lanes::store", tx, at_commit, idempotent, retry,
                        "postgres connection lost; dropped the pool's idle connections");
                    if retry {
                        continue;
                    }
                    return Err(e);
                }
                Err(e) => {
                    self.checkin(conn);
                    return Err(e);
                }
            }
        }
    }

    /// Enqueues inside the caller's own transaction (the transactional outbox, OL-15). The
    /// transaction's connection must have this store's schema on its `search_path`
    /// (`SET search_path TO <schema>`). The `NOTIFY` is part of the transaction, so other
    /// processes are woken on commit; call the returned [`PendingWake::fire`] after the commit
    /// to wake this process's waiters.
    ///
    /// # Errors
    /// As [`ServiceStore::enqueue`](crate::ServiceStore::enqueue). The enqueue runs under a savepoint: a refused batch leaves the
    /// caller's transaction usable.
    pub fn enqueue_in(
        &self,
        tx: &mut Transaction<'_>,
        actor: impl Into<ActorId>,
        rows: &[NewRow],
    ) -> Result<(Vec<Enqueued>, PendingWake), EnqueueError> {
        let actor = &actor.into();
        let prepared = prepare(rows, &self.opts.common)?;
        let mut db = PgDb::new(On::Tx(tx.savepoint("ol_enqueue").map_err(pg_err)?), None);
        let channel = Some(self.shared.pg_channel());
        let out = ready(enqueue(
            &mut db,
            actor,
            &prepared,
            channel,
            &self.opts.common,
        ))?;
        ready(check_stored_policy(&mut db, &prepared))?;
        db.commit()?;
        Ok((out, PendingWake::new(self.shared.notifier.clone())))
    }

    /// The options the store connected with.
    pub fn options(&self) -> &PgOptions {
        &self.opts
    }
}

impl Backend for PgStore {
    const DIALECT: Dialect = Dialect::Postgres;
    type Conn<'c> = PgDb<'c>;

    fn read<T>(
        &self,
        f: impl FnMut(&mut PgDb<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.run(false, true, f)
    }

    fn write<T, E: From<StoreError>>(
        &self,
        idempotent: bool,
        f: impl FnMut(&mut PgDb<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.run(true, idempotent, f)
    }

    fn common(&self) -> &CommonOptions {
        &self.opts.common
    }

    fn shared(&self) -> &Shared {
        &self.shared
    }

    fn register_holder(&self, holder: &str) {
        self.keep_alive(holder);
    }

    /// The holder's liveness session ends here rather than with the store: its row in
    /// `ol_live_holders` goes first when it holds no slot ([`pg_schema::leave_live_holders`]),
    /// then the session (and with it the advisory lock).
    fn release_holder(&self, holder: &str) {
        let client = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(holder);
        let Some(mut client) = client else {
            return;
        };
        if let Err(e) = pg_schema::leave_live_holders(&mut PgDb::of_client(&mut client), holder) {
            tracing::debug!(target: "outbox_lanes::store", holder, error = %e,
                "could not leave the live holders; another relay forgets this one when it finds it dead");
        }
    }

    fn holder_is_dead(&self, db: &mut PgDb<'_>, holder: &str) -> Result<bool, StoreError> {
        pg_schema::holder_is_dead(db, &self.opts.schema, holder)
    }

    fn watch(&self) -> Result<Notifier, StoreError> {
        let mut w = self.watcher.lock().unwrap_or_else(PoisonError::into_inner);
        if w.is_none() {
            let mut client = self.new_conn(false)?.client;
            client.batch_execute(&format!("LISTEN {}", self.shared.pg_channel()))?;
            let notifier = self.shared.notifier.clone();
            let config = self.config.clone();
            let tls = self.tls.clone();
            let channel = self.shared.pg_channel().to_owned();
            let every = self.opts.watch_interval;
            *w = Some(WatcherThread::spawn(
                &*self.shared.threads(),
                "outbox-lanes-pg-listen",
                move |stop| listen_loop(client, &config, &tls, &channel, stop, &notifier, every),
            )?);
        }
        Ok(self.shared.notifier.clone())
    }
}

/// LISTENs on the store's channel; reconnects after a lost connection (and then wakes every
/// waiter once, since notifications sent meanwhile were lost).
fn listen_loop(
    mut client: Client,
    config: &Config,
    tls: &Connector,
    channel: &str,
    stop: &AtomicBool,
    notifier: &Notifier,
    every: Duration,
) {
    while !stop.load(Ordering::SeqCst) {
        let mut failed = false;
        {
            let mut n = client.notifications();
            let mut it = n.timeout_iter(every);
            let mut got = false;
            loop {
                match it.next() {
                    Ok(Some(_)) => got = true,
                    Err(_) => {
                        failed = true;
                        break;
                    }
                    Ok(None) => break,
                }
            }
            if got {
                tracing::trace!(target: "outbox_lanes::store", reason = "notify", "wake-up from another process");
                notifier.notify();
            }
        }
        if failed || client.is_closed() {
            tracing::warn!(target: "outbox_lanes::store", "LISTEN connection lost; reconnecting");
            loop {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(every);
                if let Ok(mut c) = tls.connect(config) {
                    if c.batch_execute(&format!("LISTEN {channel}")).is_ok() {
                        client = c;
                        // Notifications sent while we were away are lost: wake everyone once.
                        tracing::debug!(target: "outbox_lanes::store", reason = "listen_reconnected", "wake-up");
                        notifier.notify();
                        break;
                    }
                }
            }
        }
    }
}
