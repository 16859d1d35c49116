//! Enqueue inside a caller's **sqlx** transaction (feature `sqlx`; the transactional outbox,
//! OL-15): the service's own rows and its outbox rows commit, or roll back, together.
//!
//! [`SqlxOutbox::enqueue`] runs the stores' own enqueue (the same checks, canonical
//! recipients and statements) on the caller's connection: set-based with arrays on a
//! [`PgConnection`], `SCHEMA.md`'s statements one by one on a [`SqliteConnection`] or an
//! [`AnyConnection`] (which binds no arrays).
//!
//! The relay of such a service runs on the same pool with [`SqlxPgStore`] (Postgres with
//! `sslmode` `disable`, `allow`, `prefer` or `require` and no root certificate: one Postgres
//! client in the process), or on a [`PgStore`](crate::PgStore) of the same database for
//! `verify-ca` / `verify-full` (sqlx's TLS does not verify as libpq does; see
//! [`SqlxPgStore`]'s docs), or on a [`SqliteStore`](crate::SqliteStore) of the same file.
//!
//! ```no_run
//! # use outbox_lanes_store::sqlx::sqlx;
//! # async fn f(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_lanes_store::{NewRow, sqlx::SqlxOutbox};
//! let outbox = SqlxOutbox::new(); // once; Postgres schema `outbox_lanes`
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO notes (id, text) VALUES ($1, $2)")
//!     .bind("n1").bind("hi").execute(&mut *tx).await?;
//! let row = NewRow::new("create-n1") // NewRow::activity(id, &value) with the `json` feature
//!     .body(r#"{"type":"Create"}"#)
//!     .content_type("application/activity+json")
//!     .recipient("https://b.example/inbox");
//! outbox.enqueue(&mut *tx, "alice", &[row]).await?; // the actor: &str, String or ActorId
//! tx.commit().await?; // the wake-up is delivered here
//! # Ok(()) }
//! ```
//!
//! # What the embedder must know
//!
//! - **The schema must exist.** The store creates and migrates it: open the database once with
//!   [`SqliteStore::open`](crate::SqliteStore::open) / [`PgStore::connect`](crate::PgStore::connect)
//!   / [`SqlxPgStore::new`] (or run the `outbox-lanes` relay on it) before enqueueing. Every
//!   call reads `ol_meta.schema_version` (one indexed read) and refuses a missing or different
//!   schema with a clear [`StoreError`], rolling back what it wrote, instead of leaving rows a
//!   relay would misread.
//! - **Postgres:** the tables are found in the store's schema (`outbox_lanes`, or the one given
//!   to [`SqlxOutbox::with_schema`], the relay's `PgOptions::schema` or
//!   `SqlxPgOptions::schema`), which the enqueue puts
//!   on the `search_path` for its own statements and then gives the caller's back: the
//!   caller's `search_path` does not matter and is left as it was. The wake-up is `pg_notify`
//!   on the store's channel inside the transaction: relays (their `LISTEN`) get it at the
//!   commit, never before, and not at all on a rollback.
//! - **SQLite:** nothing to do. A relay's watcher polls `PRAGMA data_version`, which changes on
//!   every commit by another connection, the caller's sqlx connection included, so it sees the
//!   rows within a few milliseconds. A relay in the same process without a watcher (no
//!   [`DriverStore::watch`](crate::DriverStore::watch)) is woken by calling its
//!   [`Notifier::notify`](crate::Notifier::notify) (or the runtime's `request_drain`) after the
//!   commit; otherwise the monitor's safety-net poll finds the rows. SQLite takes its write lock
//!   at the first write: begin the transaction with `BEGIN IMMEDIATE` if it reads before it
//!   writes, or a concurrent writer can make the upgrade fail with "database is locked".
//! - The enqueue runs under a savepoint (sqlx's nested `begin`): a refused batch leaves the
//!   caller's transaction usable, as it was. On a connection outside a transaction it is a
//!   transaction of its own.

use ::sqlx::postgres::PgDatabaseError;
use ::sqlx::sqlite::SqliteError;
use ::sqlx::{
    AnyConnection, AssertSqlSafe, Connection, Database, PgConnection, Row as _, SqliteConnection,
};
use outbox_lanes_core::ActorId;

pub use crate::sqlx_pg::{SqlxPgOptions, SqlxPgStore};
/// The sqlx crate this module is built on (0.9), for callers that take it from here and so
/// stay on the same version without a dependency of their own.
pub use ::sqlx;

use crate::db::{AsyncDb, Dialect, Get, Sql, Value, args};
use crate::enqueue::enqueue;
use crate::error::EnqueueError;
use crate::prepare::{check_stored_policy, prepare};
use crate::types::{CommonOptions, Enqueued, NewRow};
use crate::{SchemaPolicy, StoreError, util};

/// What [`SqlxOutbox::enqueue`] hands the sealed [`SqlxConnection`]: itself, the actor, the rows.
type Call<'a> = (&'a SqlxOutbox, &'a ActorId, &'a [NewRow]);
/// The boxed enqueue of the sealed [`SqlxConnection`] (Send: axum handlers need it).
type Enqueueing<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<Vec<Enqueued>, EnqueueError>> + Send + 'a>>;

/// Enqueues rows inside a caller's sqlx transaction, on Postgres or SQLite (see the
/// [module docs](self)). Cheap to clone; make one and share it.
#[derive(Clone, Debug)]
pub struct SqlxOutbox {
    schema: String,
    channel: String,
    limits: CommonOptions,
}

impl Default for SqlxOutbox {
    fn default() -> Self {
        SqlxOutbox::new()
    }
}

impl SqlxOutbox {
    /// For the store's default Postgres schema, `outbox_lanes` (and for SQLite, which has
    /// none), with the default limits ([`CommonOptions`]).
    pub fn new() -> SqlxOutbox {
        SqlxOutbox::build("outbox_lanes", CommonOptions::default())
    }

    fn build(schema: &str, limits: CommonOptions) -> SqlxOutbox {
        SqlxOutbox {
            schema: schema.to_owned(),
            channel: crate::pg_schema::channel(schema),
            limits,
        }
    }

    /// On Postgres, the schema holding the tables: the relay's `PgOptions::schema`.
    ///
    /// # Errors
    /// [`StoreError::Database`] for a name the store would refuse (lower-case letters, digits
    /// and `_`, not starting with a digit, at most 48 bytes).
    pub fn with_schema(self, schema: &str) -> Result<SqlxOutbox, StoreError> {
        if !crate::pg_schema::valid_schema(schema) {
            return Err(StoreError::Database(format!(
                "invalid schema name {schema:?} (use lower-case letters, digits, _)"
            )));
        }
        Ok(SqlxOutbox::build(schema, self.limits))
    }

    /// The enqueue limits (payload size, recipients per row); use the relay's.
    pub fn with_limits(mut self, limits: CommonOptions) -> SqlxOutbox {
        self.limits = limits;
        self
    }

    /// Enqueues `rows` for `actor` on `conn`, inside its transaction: all or nothing, and
    /// committed (or rolled back) with it. Returns what [`ServiceStore::enqueue`](crate::ServiceStore::enqueue)
    /// returns for the same batch; the relays are woken at the commit (see the module docs).
    ///
    /// `conn` is a [`PgConnection`], a [`SqliteConnection`] or an [`AnyConnection`] to either:
    /// pass `&mut *tx` for a `sqlx::Transaction`.
    ///
    /// # Errors
    /// As [`ServiceStore::enqueue`](crate::ServiceStore::enqueue): a refused row refuses the batch before
    /// anything is written; a row id the actor already has is
    /// [`EnqueueError::DuplicateRowId`]. [`EnqueueError::Store`] for a database failure, a
    /// schema the store has not created ([`StoreError::NoSchema`]) or another version
    /// ([`StoreError::SchemaTooNew`], [`StoreError::SchemaTooOld`]). The caller's transaction
    /// is left as it was.
    pub async fn enqueue<C: SqlxConnection + ?Sized>(
        &self,
        conn: &mut C,
        actor: impl Into<ActorId>,
        rows: &[NewRow],
    ) -> Result<Vec<Enqueued>, EnqueueError> {
        conn.enqueue_rows((self, &actor.into(), rows), sealed::Token)
            .await
    }

    /// The one enqueue of `enqueue.rs`, under a savepoint of `conn` (a transaction of its own
    /// outside one), then the schema version: checked after the first write, so that SQLite
    /// takes its write lock first (see there). On a failure, a missing or other schema is
    /// reported rather than the statement it made fail.
    async fn run<C, DB>(
        &self,
        conn: &mut C,
        dialect: Dialect,
        arrays: bool,
        actor: &ActorId,
        rows: &[NewRow],
    ) -> Result<Vec<Enqueued>, EnqueueError>
    where
        C: Connection<Database = DB>,
        DB: Database<Connection = C>,
        for<'t> Caller<'t, C>: AsyncDb,
    {
        let prepared = prepare(rows, &self.limits)?;
        if prepared.is_empty() {
            return Ok(Vec::new());
        }
        let channel = (dialect == Dialect::Postgres).then_some(self.channel.as_str());
        let mut t = conn.begin().await.map_err(sqlx_err)?;
        let done = async {
            let mut db = Caller {
                conn: &mut *t,
                dialect,
                arrays,
            };
            let restore = self.enter_schema(&mut db).await?;
            let out = enqueue(&mut db, actor, &prepared, channel, &self.limits).await?;
            self.check_version(&mut db).await?;
            check_stored_policy(&mut db, &prepared).await?;
            if let Some(path) = restore {
                db.execute(&SET_SEARCH_PATH, args![&path]).await?;
            }
            Ok::<_, EnqueueError>(out)
        }
        .await;
        match done {
            Ok(out) => {
                t.commit().await.map_err(sqlx_err)?;
                Ok(out)
            }
            Err(e) => {
                t.rollback().await.map_err(sqlx_err)?;
                Err(self
                    .schema_problem(conn, dialect, arrays)
                    .await
                    .unwrap_or(e))
            }
        }
    }

    /// Postgres: puts the store's schema on the `search_path` for the enqueue, and returns the
    /// caller's, to be put back at its end (a rollback of the savepoint puts it back itself).
    async fn enter_schema(&self, db: &mut impl AsyncDb) -> Result<Option<String>, StoreError> {
        if db.dialect() != Dialect::Postgres {
            return Ok(None);
        }
        let v = args![self.schema.as_str()];
        db.query_one(&ENTER_SCHEMA, v, |r| r.text(0))
            .await
            .map(Some)
    }

    /// Refuses a missing schema or another version than this build's
    /// [`SCHEMA_VERSION`](crate::SCHEMA_VERSION).
    async fn check_version(&self, db: &mut impl AsyncDb) -> Result<(), EnqueueError> {
        let found = match db
            .query_opt(&crate::pg_schema::VERSION, args![], |r| r.text(0))
            .await
        {
            Err(e) if no_table(&e) => None,
            found => found?,
        };
        let found = found.as_deref().map(util::parse_version).transpose()?;
        util::needs_ddl(found, SchemaPolicy::Existing, || match db.dialect() {
            Dialect::Postgres => format!("Postgres schema {:?}", self.schema),
            Dialect::Sqlite => "this SQLite database".to_owned(),
        })?;
        Ok(())
    }

    /// After a failed enqueue: the schema's own problem, if it has one, read under a savepoint
    /// of its own (a failed read on Postgres would abort the caller's transaction).
    async fn schema_problem<C, DB>(
        &self,
        conn: &mut C,
        dialect: Dialect,
        arrays: bool,
    ) -> Option<EnqueueError>
    where
        C: Connection<Database = DB>,
        DB: Database<Connection = C>,
        for<'t> Caller<'t, C>: AsyncDb,
    {
        let mut t = conn.begin().await.ok()?;
        let mut db = Caller {
            conn: &mut *t,
            dialect,
            arrays,
        };
        let problem = match self.enter_schema(&mut db).await {
            Ok(_) => self.check_version(&mut db).await.err(),
            Err(_) => None,
        };
        t.rollback().await.ok()?;
        problem
    }
}

/// Sets `search_path` to `$1` for the transaction and returns the one it replaces (the
/// select list is evaluated in order).
static ENTER_SCHEMA: Sql =
    Sql::new("SELECT current_setting('search_path'), set_config('search_path', $1, true)");
static SET_SEARCH_PATH: Sql = Sql::new("SELECT set_config('search_path', $1, true)");
static LAST_ROWID: Sql = Sql::new("SELECT last_insert_rowid()");

/// Whether the store's tables are missing (the store never opened this database or schema).
fn no_table(e: &StoreError) -> bool {
    let StoreError::Driver { cause, .. } = e else {
        return false;
    };
    cause
        .downcast_ref::<::sqlx::Error>()
        .and_then(::sqlx::Error::as_database_error)
        .is_some_and(|d| {
            d.code().as_deref() == Some("42P01") || d.message().contains("no such table")
        })
}

mod sealed {
    /// Seals [`SqlxConnection`](super::SqlxConnection): no other crate can name it, so none
    /// can implement the trait's method.
    #[derive(Debug)]
    pub struct Token;
}

/// The connections [`SqlxOutbox::enqueue`] writes on: [`PgConnection`],
/// [`SqliteConnection`] and [`AnyConnection`] (sealed).
pub trait SqlxConnection: Send {
    /// What [`SqlxOutbox::enqueue`] runs (call that instead).
    #[doc(hidden)]
    fn enqueue_rows<'a>(&'a mut self, call: Call<'a>, _: sealed::Token) -> Enqueueing<'a>;
}

/// [`SqlxConnection`] for a connection type: `$how` says its dialect and whether it binds
/// arrays.
macro_rules! sqlx_connection {
    ($conn:ty, $how:expr) => {
        impl SqlxConnection for $conn {
            fn enqueue_rows<'a>(&'a mut self, call: Call<'a>, _: sealed::Token) -> Enqueueing<'a> {
                let (outbox, actor, rows) = call;
                let how: fn(&$conn) -> Result<(Dialect, bool), StoreError> = $how;
                match how(self) {
                    Ok((dialect, arrays)) => {
                        Box::pin(outbox.run(self, dialect, arrays, actor, rows))
                    }
                    Err(e) => Box::pin(core::future::ready(Err(e.into()))),
                }
            }
        }
    };
}

sqlx_connection!(PgConnection, |_| Ok((Dialect::Postgres, true)));
sqlx_connection!(SqliteConnection, |_| Ok((Dialect::Sqlite, false)));
// `Any` binds scalars only: the statement-by-statement enqueue, on either dialect.
sqlx_connection!(AnyConnection, |c| match c.backend_name() {
    "PostgreSQL" => Ok((Dialect::Postgres, false)),
    "SQLite" => Ok((Dialect::Sqlite, false)),
    other => Err(StoreError::Database(format!(
        "outbox-lanes enqueues on Postgres and SQLite, not on {other}"
    ))),
});

/// A caller's connection inside the enqueue's savepoint, as the statement layer: the one
/// [`AsyncDb`] whose statements really wait.
pub(crate) struct Caller<'c, C> {
    conn: &'c mut C,
    dialect: Dialect,
    /// Whether it binds arrays (Postgres, but not through `Any`).
    arrays: bool,
}

/// [`AsyncDb`] for a caller's connection of one sqlx driver: `$bind` binds the values, `$id`
/// reads an insert's new id off its result (SQLite; Postgres returns it), else it is asked
/// for.
macro_rules! caller_db {
    ($conn:ty, $db:ty, $bind:expr, $id:expr) => {
        impl AsyncDb for Caller<'_, $conn> {
            fn dialect(&self) -> Dialect {
                self.dialect
            }

            fn arrays(&self) -> bool {
                self.arrays
            }

            async fn execute(
                &mut self,
                sql: &'static Sql,
                args: &[Value<'_>],
            ) -> Result<u64, StoreError> {
                let q = $bind(
                    ::sqlx::query::<$db>(AssertSqlSafe(sql.text(self.dialect))),
                    args,
                )?;
                let done = q.execute(&mut *self.conn).await.map_err(sqlx_err)?;
                Ok(done.rows_affected())
            }

            async fn insert(
                &mut self,
                sql: &'static Sql,
                args: &[Value<'_>],
            ) -> Result<Option<i64>, StoreError> {
                if self.dialect == Dialect::Postgres {
                    return self.query_opt(sql, args, |r| r.int(0)).await;
                }
                let q = $bind(
                    ::sqlx::query::<$db>(AssertSqlSafe(sql.text(self.dialect))),
                    args,
                )?;
                let done = q.execute(&mut *self.conn).await.map_err(sqlx_err)?;
                if done.rows_affected() == 0 {
                    return Ok(None);
                }
                match $id(&done) {
                    Some(id) => Ok(Some(id)),
                    None => self
                        .query_one(&LAST_ROWID, &[], |r| r.int(0))
                        .await
                        .map(Some),
                }
            }

            async fn query<T, F: FnMut(&dyn Get) -> Result<T, StoreError>>(
                &mut self,
                sql: &'static Sql,
                args: &[Value<'_>],
                mut map: F,
            ) -> Result<Vec<T>, StoreError> {
                let q = $bind(
                    ::sqlx::query::<$db>(AssertSqlSafe(sql.text(self.dialect))),
                    args,
                )?;
                let rows = q.fetch_all(&mut *self.conn).await.map_err(sqlx_err)?;
                rows.iter().map(|r| map(r)).collect()
            }
        }
    };
}

caller_db!(
    PgConnection,
    ::sqlx::Postgres,
    bind_pg,
    |_: &::sqlx::postgres::PgQueryResult| None
);
caller_db!(
    SqliteConnection,
    ::sqlx::Sqlite,
    |q, a| bind(q, a, no_arrays),
    |d: &::sqlx::sqlite::SqliteQueryResult| Some(d.last_insert_rowid())
);
// Its SQLite driver does not pass the rowid on: it is asked for.
caller_db!(
    AnyConnection,
    ::sqlx::Any,
    |q, a| bind(q, a, no_arrays),
    |_: &::sqlx::any::AnyQueryResult| None
);

/// A query of driver `DB`.
type Query<'q, DB> = ::sqlx::query::Query<'q, DB, <DB as Database>::Arguments>;

/// Binds the values in order; `arrays` binds an array (only Postgres has them).
fn bind<'q, DB: Database>(
    mut q: Query<'q, DB>,
    args: &[Value<'_>],
    arrays: impl Fn(Query<'q, DB>, &Value<'_>) -> Result<Query<'q, DB>, StoreError>,
) -> Result<Query<'q, DB>, StoreError>
where
    i64: for<'e> ::sqlx::Encode<'e, DB> + ::sqlx::Type<DB>,
    Option<i64>: for<'e> ::sqlx::Encode<'e, DB> + ::sqlx::Type<DB>,
    bool: for<'e> ::sqlx::Encode<'e, DB> + ::sqlx::Type<DB>,
    for<'v> &'v str: ::sqlx::Encode<'v, DB> + ::sqlx::Type<DB>,
    for<'v> Option<&'v str>: ::sqlx::Encode<'v, DB> + ::sqlx::Type<DB>,
    for<'v> &'v [u8]: ::sqlx::Encode<'v, DB> + ::sqlx::Type<DB>,
{
    for v in args {
        q = match *v {
            Value::Int(v) => q.bind(v),
            Value::OptInt(v) => q.bind(v),
            Value::Text(v) => q.bind(v),
            Value::OptText(v) => q.bind(v),
            Value::Bytes(v) => q.bind(v),
            Value::Bool(v) => q.bind(v),
            Value::Ints(_)
            | Value::OptInts(_)
            | Value::Texts(_)
            | Value::OptTexts(_)
            | Value::Byteses(_) => arrays(q, v)?,
        };
    }
    Ok(q)
}

/// No array binds on a driver without arrays (SQLite, `Any`).
fn no_arrays<Q>(_: Q, _: &Value<'_>) -> Result<Q, StoreError> {
    Err(StoreError::Database(
        "arrays are bound on Postgres connections only".into(),
    ))
}

/// Binds the values on Postgres, arrays too.
pub(crate) fn bind_pg<'q>(
    q: Query<'q, ::sqlx::Postgres>,
    args: &[Value<'_>],
) -> Result<Query<'q, ::sqlx::Postgres>, StoreError> {
    bind(q, args, |q, v| {
        Ok(match *v {
            Value::Ints(v) => q.bind(v),
            Value::OptInts(v) => q.bind(v),
            Value::Texts(v) => q.bind(v),
            Value::OptTexts(v) => q.bind(v),
            Value::Byteses(v) => q.bind(v),
            _ => unreachable!("bind binds the scalars itself"),
        })
    })
}

// Through `Any` a flag is read as a boolean, which SQLite's integer is not: the enqueue reads
// integers and text only.
crate::db::impl_get!(::sqlx::sqlite::SqliteRow, |r, c| r
    .try_get(c)
    .map_err(sqlx_err));
crate::db::impl_get!(::sqlx::any::AnyRow, |r, c| r.try_get(c).map_err(sqlx_err));
crate::db::impl_get!(
    ::sqlx::postgres::PgRow,
    |r, c| r.try_get(c).map_err(sqlx_err),
    arrays
);

/// A sqlx error as the store reports one, in one line: a lost connection (or pool) is
/// [`StoreError::ConnectionLost`]; SQLite busy or locked, or a conflict the Postgres server
/// broke (serialization failure, deadlock, lock not available), [`StoreError::Busy`]: nothing
/// was written, retry; a read-only server [`StoreError::ReadOnly`]; the rest
/// [`StoreError::Driver`] with sqlx's error as the cause.
pub(crate) fn sqlx_err(e: ::sqlx::Error) -> StoreError {
    use ::sqlx::Error as E;
    let reason = match &e {
        E::Database(db) => {
            let mut out = format!(
                "{} (SQLSTATE {})",
                db.message(),
                db.code().as_deref().unwrap_or("?")
            );
            if let Some(d) = db
                .try_downcast_ref::<PgDatabaseError>()
                .and_then(|p| p.detail())
            {
                out.push_str("; detail: ");
                out.push_str(d);
            }
            out
        }
        other => other.to_string(),
    }
    .replace(['\n', '\r'], " ");
    match &e {
        E::Io(_)
        | E::Tls(_)
        | E::Protocol(_)
        | E::WorkerCrashed
        | E::PoolTimedOut
        | E::PoolClosed => StoreError::connection_lost(reason, e),
        // Any extended code of SQLITE_BUSY (5) or SQLITE_LOCKED (6).
        E::Database(db) if db.try_downcast_ref::<SqliteError>().is_some() => {
            let code = db.code().and_then(|c| c.parse::<i32>().ok());
            if code.is_some_and(|c| matches!(c & 0xff, 5 | 6)) {
                StoreError::Busy
            } else {
                StoreError::driver(reason, e)
            }
        }
        E::Database(db) => match db.code().map(String::from) {
            Some(c) => StoreError::of_sqlstate(&c, reason, e),
            None => StoreError::driver(reason, e),
        },
        _ => StoreError::driver(reason, e),
    }
}
