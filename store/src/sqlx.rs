//! Enqueue inside a caller's **sqlx** transaction (feature `sqlx`; the transactional outbox,
//! OL-15): the service's own rows and its outbox rows commit, or roll back, together.
//!
//! The relay of such a service runs on the same sqlx pool with [`SqlxPgStore`] (Postgres; see
//! its docs), instead of a second pool of blocking `postgres` connections.
//!
//! Why: a service on sqlx cannot hand its transaction to [`SqliteStore`](crate::SqliteStore)
//! or [`PgStore`](crate::PgStore) (they own rusqlite and `postgres` connections). Rather than
//! copy `SCHEMA.md`'s plain SQL, and its URL canonicalisation, into every service,
//! [`SqlxOutbox::enqueue`] validates the batch exactly as [`ServiceStore::enqueue`](crate::ServiceStore::enqueue)
//! does (the same preparation: canonical recipients, limits, header checks) and runs that SQL
//! on the caller's connection: the actor's row lock first, the row-id check in both places,
//! the lanes, inline or shared payloads, joined rows, dedup keys and headers.
//!
//! ```no_run
//! # use outbox_lanes_store::sqlx::sqlx;
//! # async fn f(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_lanes_store::{NewRow, core_types::ActorId, sqlx::SqlxOutbox};
//! let outbox = SqlxOutbox::new(); // once; Postgres schema `outbox_lanes`
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO notes (id, text) VALUES ($1, $2)")
//!     .bind("n1").bind("hi").execute(&mut *tx).await?;
//! let row = NewRow { id: "create-n1".into(), recipients: vec!["https://b.example/inbox".into()],
//!     content_type: "application/activity+json".into(), body: b"{}".to_vec(), ..NewRow::default() };
//! outbox.enqueue(&mut *tx, &ActorId::new("alice"), &[row]).await?;
//! tx.commit().await?; // the wake-up is delivered here
//! # Ok(()) }
//! ```
//!
//! # What the embedder must know
//!
//! - **The schema must exist.** The store creates and migrates it: open the database once with
//!   [`SqliteStore::open`](crate::SqliteStore::open) / [`PgStore::connect`](crate::PgStore::connect)
//!   (or run the `outbox-lanes` relay on it) before enqueueing. Every call reads
//!   `ol_meta.schema_version` (one indexed read) and refuses a missing or different schema with
//!   a clear [`StoreError`] instead of writing rows a relay would misread.
//! - **Postgres:** tables are named with their schema (`outbox_lanes.ol_units`, or the one given
//!   to [`SqlxOutbox::with_schema`], the relay's `PgOptions::schema`): the caller's
//!   `search_path` does not matter. The wake-up is `pg_notify` on the store's channel inside
//!   the transaction: relays (their `LISTEN`) get it at the commit, never before, and not at all
//!   on a rollback.
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

use std::collections::HashMap;
use std::sync::Arc;

pub use crate::sqlx_pg::{SqlxPgOptions, SqlxPgStore};
/// The sqlx crate this module is built on (0.9), for callers that take it from here and so
/// stay on the same version without a dependency of their own.
pub use ::sqlx;
use ::sqlx::{AnyConnection, Connection as _, PgConnection, Row as _, SqliteConnection};
use outbox_lanes_core::{ActorId, LaneKey, Seq, Timestamp, UnitId};

use crate::error::EnqueueError;
use crate::prepare::{PreparedRow, prepare};
use crate::types::{CommonOptions, Enqueued, NewRow};

/// The boxed future of the sealed [`SqlxConnection`] (Send: axum handlers need it).
type BoxFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;
use crate::util::{encode_headers, millis_of, to_u64, window_millis};
use crate::{SCHEMA_VERSION, StoreError};

/// The SQL of one dialect, with the tables' schema written in (Postgres).
#[derive(Debug)]
struct Sql {
    version: String,
    alloc: String,
    taken: String,
    row_id: String,
    lane_insert: String,
    lane_select: String,
    dedup: String,
    head: String,
    other_lane: String,
    shared_row: String,
    shared_unit: String,
    tail: String,
    /// Postgres: `pg_notify` on the relays' channel.
    notify: Option<String>,
}

impl Sql {
    /// `p`: the table prefix (`"schema".` or empty); `greatest`: `GREATEST` or `max`.
    fn new(p: &str, greatest: &str, notify: Option<String>) -> Sql {
        Sql {
            version: format!("SELECT value FROM {p}ol_meta WHERE key = 'schema_version'"),
            alloc: format!(
                "INSERT INTO {p}ol_actors AS a (actor, last_seq) VALUES ($1, $2) \
                 ON CONFLICT (actor) DO UPDATE SET last_seq = a.last_seq + excluded.last_seq RETURNING last_seq"
            ),
            taken: format!(
                "SELECT 1 FROM {p}ol_units WHERE actor = $1 AND row_id = $2 \
                 UNION ALL SELECT 1 FROM {p}ol_rows WHERE actor = $1 AND row_id = $2"
            ),
            row_id: format!(
                "INSERT INTO {p}ol_row_ids AS l (actor, row_id, enqueued_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (actor, row_id) DO UPDATE SET enqueued_at = excluded.enqueued_at \
                 WHERE l.enqueued_at <= $4"
            ),
            lane_insert: format!(
                "INSERT INTO {p}ol_lanes (actor, recipient, ordering_key) VALUES ($1, $2, $3) \
                 ON CONFLICT (actor, recipient, ordering_key) DO NOTHING"
            ),
            lane_select: format!(
                "SELECT id FROM {p}ol_lanes WHERE actor = $1 AND recipient = $2 AND ordering_key = $3"
            ),
            dedup: format!(
                "SELECT 1 WHERE EXISTS (SELECT 1 FROM {p}ol_units h JOIN {p}ol_units d ON d.id = h.id OR d.unit_id = h.id \
                   JOIN {p}ol_lanes l ON l.id = d.lane_id \
                   WHERE h.actor = $1 AND h.dedup_key = $2 AND h.unit_id IS NULL AND d.state = 0 AND l.recipient = $3) \
                 OR EXISTS (SELECT 1 FROM {p}ol_rows r JOIN {p}ol_units h ON h.row_ref = r.id \
                   JOIN {p}ol_units d ON d.id = h.id OR d.unit_id = h.id JOIN {p}ol_lanes l ON l.id = d.lane_id \
                   WHERE r.actor = $1 AND r.dedup_key = $2 AND h.unit_id IS NULL AND d.state = 0 AND l.recipient = $3)"
            ),
            head: format!(
                "INSERT INTO {p}ol_units (actor, lane_id, seq, lanes, pending, row_id, content_type, body, \
                 body_len, dedup_key, ordering_key, enqueued_at, headers) \
                 VALUES ($1, $2, $3, $4, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING id"
            ),
            other_lane: format!(
                "INSERT INTO {p}ol_units (unit_id, actor, lane_id, seq) VALUES ($1, $2, $3, $4)"
            ),
            shared_row: format!(
                "INSERT INTO {p}ol_rows (actor, row_id, seq, content_type, body, body_len, dedup_key, \
                 ordering_key, enqueued_at, headers) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id"
            ),
            shared_unit: format!(
                "INSERT INTO {p}ol_units (actor, lane_id, seq, row_ref) VALUES ($1, $2, $3, $4) RETURNING id"
            ),
            tail: format!(
                "UPDATE {p}ol_lanes SET tail_seq = {greatest}(tail_seq, $2) WHERE id = $1"
            ),
            notify,
        }
    }
}

/// Enqueues rows inside a caller's sqlx transaction, on Postgres or SQLite (see the
/// [module docs](self)). Cheap to clone; make one and share it.
#[derive(Clone, Debug)]
pub struct SqlxOutbox {
    pg: Arc<Sql>,
    sqlite: Arc<Sql>,
    schema: String,
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
            pg: Arc::new(Sql::new(
                &format!("\"{schema}\"."),
                "GREATEST",
                Some("SELECT pg_notify($1, $2)".to_owned()),
            )),
            sqlite: Arc::new(Sql::new("", "max", None)),
            schema: schema.to_owned(),
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
    /// schema the store has not created ([`StoreError::Database`]) or a newer one
    /// ([`StoreError::SchemaTooNew`]). The caller's transaction is left as it was.
    pub async fn enqueue<C: SqlxConnection + ?Sized>(
        &self,
        conn: &mut C,
        actor: &ActorId,
        rows: &[NewRow],
    ) -> Result<Vec<Enqueued>, EnqueueError> {
        conn.enqueue_rows(self, actor, rows).await
    }

    fn sql(&self, postgres: bool) -> &Sql {
        if postgres { &self.pg } else { &self.sqlite }
    }

    fn channel(&self) -> String {
        crate::pg_schema::channel(&self.schema)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for ::sqlx::PgConnection {}
    impl Sealed for ::sqlx::SqliteConnection {}
    impl Sealed for ::sqlx::AnyConnection {}
}

/// The connections [`SqlxOutbox::enqueue`] writes on: [`PgConnection`],
/// [`SqliteConnection`] and [`AnyConnection`] (sealed).
pub trait SqlxConnection: sealed::Sealed + Send {
    /// What [`SqlxOutbox::enqueue`] runs (call that instead).
    #[doc(hidden)]
    fn enqueue_rows<'a>(
        &'a mut self,
        outbox: &'a SqlxOutbox,
        actor: &'a ActorId,
        rows: &'a [NewRow],
    ) -> BoxFuture<'a, Result<Vec<Enqueued>, EnqueueError>>;
}

/// A sqlx failure as the store reports one: a busy database or a serialization failure is
/// [`StoreError::Busy`], a lost connection [`StoreError::ConnectionLost`], the rest
/// [`StoreError::Driver`] with sqlx's error as the cause.
fn sqlx_err(e: ::sqlx::Error) -> EnqueueError {
    let reason = e.to_string().replace('\n', " ");
    let err = match &e {
        ::sqlx::Error::Database(d) if retryable(&**d) => StoreError::Busy,
        ::sqlx::Error::Io(_) | ::sqlx::Error::PoolTimedOut | ::sqlx::Error::PoolClosed => {
            StoreError::connection_lost(reason, e)
        }
        _ => StoreError::driver(reason, e),
    };
    EnqueueError::Store(err)
}

/// SQLite busy or locked (any extended code of `SQLITE_BUSY` / `SQLITE_LOCKED`), or a
/// Postgres serialization failure or deadlock: nothing was written, the caller may retry.
fn retryable(d: &dyn ::sqlx::error::DatabaseError) -> bool {
    let code = d.code();
    let code = code.as_deref().unwrap_or("");
    if d.try_downcast_ref::<::sqlx::sqlite::SqliteError>()
        .is_some()
    {
        code.parse::<i32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
    } else {
        matches!(code, "40001" | "40P01")
    }
}

fn schema_missing(where_: &str) -> EnqueueError {
    EnqueueError::Store(StoreError::NoSchema {
        target: where_.to_owned(),
    })
}

/// Checks `ol_meta.schema_version` against this build's [`SCHEMA_VERSION`].
fn check_version(found: Option<String>, where_: &str) -> Result<(), EnqueueError> {
    let Some(v) = found else {
        return Err(schema_missing(where_));
    };
    let v: u32 = v.trim().parse().map_err(|_| {
        EnqueueError::Store(StoreError::Database(format!(
            "unreadable schema_version {v:?}"
        )))
    })?;
    match v {
        _ if v > SCHEMA_VERSION => Err(EnqueueError::Store(StoreError::SchemaTooNew {
            found: v,
            supported: SCHEMA_VERSION,
        })),
        _ if v < SCHEMA_VERSION => Err(EnqueueError::Store(StoreError::SchemaTooOld {
            found: v,
            supported: SCHEMA_VERSION,
        })),
        _ => Ok(()),
    }
}

/// One body for every connection type: `SCHEMA.md`'s "Enqueue with plain SQL", in order.
macro_rules! enqueue_body {
    ($db:ty, $conn:expr, $outbox:expr, $actor:expr, $rows:expr, $postgres:expr) => {{
        let conn = $conn;
        let outbox: &SqlxOutbox = $outbox;
        let prepared = prepare($rows, &outbox.limits)?;
        if prepared.is_empty() {
            return Ok(Vec::new());
        }
        let rows: &[PreparedRow<'_>] = &prepared;
        let postgres: bool = $postgres;
        let sql = outbox.sql(postgres);
        let a = $actor.as_str();
        let q = |s: &str| ::sqlx::query::<$db>(::sqlx::AssertSqlSafe(s.to_owned()));
        let where_ = if postgres {
            format!("Postgres schema {:?}", outbox.schema)
        } else {
            "this SQLite database".to_owned()
        };
        // A savepoint inside the caller's transaction (a transaction of its own outside one).
        let mut t = conn.begin().await.map_err(sqlx_err)?;
        let now = millis_of(Timestamp::from_system_time(std::time::SystemTime::now()));
        let n = i64::try_from(rows.len()).unwrap_or(i64::MAX);
        // 1. FIRST: the actor's row (its lock orders the actor's enqueues by seq). A write
        //    before any read: SQLite takes its write lock here, waiting for it, where a read
        //    first would make the lock upgrade fail at once under a concurrent writer.
        let last: i64 = match q(&sql.alloc).bind(a).bind(n).fetch_one(&mut *t).await {
            Ok(r) => r.try_get(0).map_err(sqlx_err)?,
            // No outbox tables: the store never opened this database (or schema).
            Err(::sqlx::Error::Database(d))
                if d.code().as_deref() == Some("42P01")
                    || d.message().contains("no such table") =>
            {
                return Err(schema_missing(&where_));
            }
            Err(e) => return Err(sqlx_err(e)),
        };
        let version = q(&sql.version)
            .fetch_optional(&mut *t)
            .await
            .and_then(|row| row.map(|r| r.try_get::<String, _>(0)).transpose())
            .map_err(sqlx_err)?;
        check_version(version, &where_)?;
        let first = last - n + 1;
        let mut lanes: HashMap<&LaneKey, i64> = HashMap::new();
        let mut tails: HashMap<i64, i64> = HashMap::new();
        let mut out = Vec::with_capacity(rows.len());
        for (k, p) in rows.iter().enumerate() {
            let seq = first + i64::try_from(k).unwrap_or(i64::MAX);
            let row = p.row;
            // 2. A row id the actor already has, in either place, refuses the batch.
            let taken = q(&sql.taken)
                .bind(a)
                .bind(row.id.as_str())
                .fetch_optional(&mut *t)
                .await
                .map_err(sqlx_err)?;
            if taken.is_some() {
                return Err(EnqueueError::DuplicateRowId {
                    row: row.id.clone(),
                });
            }
            // 2b. The dedup window past delivery: the id new to the actor's ledger, or last
            //     used before the window (`ol_row_ids`).
            let window = window_millis(&outbox.limits);
            let since = now.saturating_sub(window);
            let recorded = if window <= 0 {
                None
            } else {
                Some(
                    q(&sql.row_id)
                        .bind(a)
                        .bind(row.id.as_str())
                        .bind(now)
                        .bind(since)
                        .execute(&mut *t)
                        .await
                        .map_err(sqlx_err)?,
                )
            };
            if recorded.is_some_and(|r| r.rows_affected() == 0) {
                return Err(EnqueueError::DuplicateRowId {
                    row: row.id.clone(),
                });
            }
            // 3. Its lanes (created on first use), less those dedup skips.
            let mut kept = Vec::with_capacity(p.lanes.len());
            let mut skipped = Vec::new();
            for key in &p.lanes {
                let ok = key.ordering_key().unwrap_or("");
                let id = match lanes.get(key) {
                    Some(id) => *id,
                    None => {
                        q(&sql.lane_insert)
                            .bind(a)
                            .bind(key.recipient())
                            .bind(ok)
                            .execute(&mut *t)
                            .await
                            .map_err(sqlx_err)?;
                        let id: i64 = q(&sql.lane_select)
                            .bind(a)
                            .bind(key.recipient())
                            .bind(ok)
                            .fetch_one(&mut *t)
                            .await
                            .and_then(|r| r.try_get(0))
                            .map_err(sqlx_err)?;
                        lanes.insert(key, id);
                        id
                    }
                };
                if let Some(dk) = &row.dedup_key {
                    let pending = q(&sql.dedup)
                        .bind(a)
                        .bind(dk.as_str())
                        .bind(key.recipient())
                        .fetch_optional(&mut *t)
                        .await
                        .map_err(sqlx_err)?;
                    if pending.is_some() {
                        skipped.push(key.recipient().to_string());
                        continue;
                    }
                }
                kept.push(id);
            }
            let body_len = i64::try_from(row.body.len()).unwrap_or(i64::MAX);
            let headers = encode_headers(&row.headers);
            let mut units = Vec::new();
            if kept.is_empty() {
                // Every recipient skipped: nothing stored (the id was checked above).
            } else if row.joined || kept.len() == 1 {
                // 4a/4b. One unit, its payload inline on the head.
                let lanes_n = i64::try_from(kept.len()).unwrap_or(i64::MAX);
                let unit: i64 = q(&sql.head)
                    .bind(a)
                    .bind(kept[0])
                    .bind(seq)
                    .bind(lanes_n)
                    .bind(row.id.as_str())
                    .bind(row.content_type.as_str())
                    .bind(row.body.as_slice())
                    .bind(body_len)
                    .bind(row.dedup_key.as_deref())
                    .bind(p.ordering_key)
                    .bind(now)
                    .bind(headers.as_deref())
                    .fetch_one(&mut *t)
                    .await
                    .and_then(|r| r.try_get(0))
                    .map_err(|e| dup_or(e, &row.id))?;
                tails.insert(kept[0], seq);
                for &lane in &kept[1..] {
                    q(&sql.other_lane)
                        .bind(unit)
                        .bind(a)
                        .bind(lane)
                        .bind(seq)
                        .execute(&mut *t)
                        .await
                        .map_err(sqlx_err)?;
                    tails.insert(lane, seq);
                }
                units.push(UnitId(to_u64(unit)));
            } else {
                // 4c. k units sharing one payload in ol_rows.
                let row_ref: i64 = q(&sql.shared_row)
                    .bind(a)
                    .bind(row.id.as_str())
                    .bind(seq)
                    .bind(row.content_type.as_str())
                    .bind(row.body.as_slice())
                    .bind(body_len)
                    .bind(row.dedup_key.as_deref())
                    .bind(p.ordering_key)
                    .bind(now)
                    .bind(headers.as_deref())
                    .fetch_one(&mut *t)
                    .await
                    .and_then(|r| r.try_get(0))
                    .map_err(|e| dup_or(e, &row.id))?;
                for lane in kept {
                    let unit: i64 = q(&sql.shared_unit)
                        .bind(a)
                        .bind(lane)
                        .bind(seq)
                        .bind(row_ref)
                        .fetch_one(&mut *t)
                        .await
                        .and_then(|r| r.try_get(0))
                        .map_err(sqlx_err)?;
                    units.push(UnitId(to_u64(unit)));
                    tails.insert(lane, seq);
                }
            }
            out.push(Enqueued {
                row_id: row.id.clone(),
                seq: Seq(to_u64(seq)),
                units,
                skipped,
            });
        }
        // 5. Each lane's tail, once (seqs grow through the batch).
        for (lane, seq) in tails {
            q(&sql.tail)
                .bind(lane)
                .bind(seq)
                .execute(&mut *t)
                .await
                .map_err(sqlx_err)?;
        }
        // 6. Postgres: the wake-up, delivered by the server at the commit.
        if let Some(notify) = &sql.notify {
            q(notify)
                .bind(outbox.channel())
                .bind(a)
                .execute(&mut *t)
                .await
                .map_err(sqlx_err)?;
        }
        t.commit().await.map_err(sqlx_err)?;
        Ok(out)
    }};
}

/// A unique-index refusal of an insert is a row id the actor already has (belt and braces:
/// step 2 looked first, under the actor's lock).
fn dup_or(e: ::sqlx::Error, row: &str) -> EnqueueError {
    match &e {
        ::sqlx::Error::Database(d) if d.is_unique_violation() => EnqueueError::DuplicateRowId {
            row: row.to_owned(),
        },
        _ => sqlx_err(e),
    }
}

impl SqlxConnection for PgConnection {
    fn enqueue_rows<'a>(
        &'a mut self,
        outbox: &'a SqlxOutbox,
        actor: &'a ActorId,
        rows: &'a [NewRow],
    ) -> BoxFuture<'a, Result<Vec<Enqueued>, EnqueueError>> {
        Box::pin(async move { enqueue_body!(::sqlx::Postgres, self, outbox, actor, rows, true) })
    }
}

impl SqlxConnection for SqliteConnection {
    fn enqueue_rows<'a>(
        &'a mut self,
        outbox: &'a SqlxOutbox,
        actor: &'a ActorId,
        rows: &'a [NewRow],
    ) -> BoxFuture<'a, Result<Vec<Enqueued>, EnqueueError>> {
        Box::pin(async move { enqueue_body!(::sqlx::Sqlite, self, outbox, actor, rows, false) })
    }
}

impl SqlxConnection for AnyConnection {
    fn enqueue_rows<'a>(
        &'a mut self,
        outbox: &'a SqlxOutbox,
        actor: &'a ActorId,
        rows: &'a [NewRow],
    ) -> BoxFuture<'a, Result<Vec<Enqueued>, EnqueueError>> {
        Box::pin(async move {
            let postgres = match self.backend_name() {
                "PostgreSQL" => true,
                "SQLite" => false,
                other => {
                    return Err(EnqueueError::Store(StoreError::Database(format!(
                        "outbox-lanes enqueues on Postgres and SQLite, not on {other}"
                    ))));
                }
            };
            enqueue_body!(::sqlx::Any, self, outbox, actor, rows, postgres)
        })
    }
}
