//! The SQLite store: the embedded default.
//!
//! A file database runs in WAL mode with one writer connection and a few reader connections,
//! each behind a mutex, so the store is safe to share between threads (`Arc<dyn Store>`).
//! Writes take the database's write lock up front (`BEGIN IMMEDIATE`): a database locked by
//! another connection past the busy timeout gives [`StoreError::Busy`] with nothing written.
//!
//! An in-memory database is ONE connection behind a mutex (WAL and shared cache do not apply
//! to it), so one thread's rollback can never discard another thread's write.
//!
//! Durability: `synchronous=FULL` (the default) makes a commit survive power loss;
//! [`Synchronous::Normal`] is faster and survives a process crash but may lose the last
//! commits on power loss.
//!
//! The "database's clock" for drain-slot leases is SQLite's `unixepoch('subsec')`, read in
//! the statement: every process sharing a SQLite file runs on the same machine and clock.

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use core::time::Duration;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

pub use rusqlite;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{
    Connection, ErrorCode, OpenFlags, OptionalExtension, ToSql, Transaction, TransactionBehavior,
};

use outbox_lanes_core::ActorId;

use crate::backend::{Backend, Shared};
use crate::db::{Db, Dialect, Get, Sql, Value, ready};
use crate::enqueue::enqueue;
use crate::liveness::Liveness;
use crate::notify::{Notifier, PendingWake};
use crate::prepare::{check_stored_policy, prepare};
use crate::types::*;
use crate::util::needs_ddl;
use crate::watcher::WatcherThread;
use crate::{EnqueueError, SCHEMA_VERSION, StoreError};

/// The durability of a commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Durable against power loss when the commit returns (OL-15). The default.
    #[default]
    Full,
    /// Durable against a process crash; the last commits may be lost on power loss.
    Normal,
}

/// How a [`SqliteStore`] opens its database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqliteOptions {
    /// Commit durability.
    pub synchronous: Synchronous,
    /// How long a statement waits for another connection's lock before [`StoreError::Busy`].
    pub busy_timeout: Duration,
    /// Payload limit and ack retention.
    pub common: CommonOptions,
    /// Reader connections for a file database (claims, payloads, status).
    pub readers: usize,
    /// How often the cross-process watcher polls `PRAGMA data_version`.
    pub watch_interval: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
            common: CommonOptions::default(),
            readers: 2,
            watch_interval: Duration::from_millis(5),
        }
    }
}

enum Conns {
    Memory(Mutex<Connection>),
    File {
        writer: Mutex<Connection>,
        readers: Vec<Mutex<Connection>>,
        next: AtomicUsize,
    },
}

/// The SQLite implementation of [`Store`](crate::Store); see the module docs.
pub struct SqliteStore {
    conns: Conns,
    path: Option<PathBuf>,
    opts: SqliteOptions,
    shared: Shared,
    watcher: Mutex<Option<WatcherThread>>,
    /// Holder locks beside the leases (a file database opened for writing only): see
    /// [`crate::liveness`].
    liveness: Option<Liveness>,
    /// The device and inode of the file opened (a file database on Unix), for
    /// [`DriverStore::check_database`](crate::DriverStore::check_database).
    identity: Option<(u64, u64)>,
}

/// The device and inode of the file at `path`, if there is one.
#[cfg(unix)]
fn file_identity(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

impl core::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

// The DDL pieces are macros so that `concat!` can assemble the constants from them.

/// The tables version 2 shares with version 1, unchanged.
macro_rules! shared_tables_ddl {
    () => {
        "
CREATE TABLE ol_actors (
    actor     TEXT PRIMARY KEY,
    last_seq  INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE ol_rows (
    id            INTEGER PRIMARY KEY,
    actor         TEXT NOT NULL,
    row_id        TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    content_type  TEXT NOT NULL,
    body          BLOB NOT NULL,
    body_len      INTEGER NOT NULL,
    dedup_key     TEXT,
    ordering_key  TEXT NOT NULL DEFAULT '',
    enqueued_at   INTEGER NOT NULL,
    UNIQUE (actor, row_id)
);
CREATE INDEX ol_rows_dedup ON ol_rows (actor, dedup_key) WHERE dedup_key IS NOT NULL;
CREATE TABLE ol_lanes (
    id             INTEGER PRIMARY KEY,
    actor          TEXT NOT NULL,
    recipient      TEXT NOT NULL,
    ordering_key   TEXT NOT NULL DEFAULT '',
    not_before     INTEGER,
    backoff_level  INTEGER NOT NULL DEFAULT 0,
    strict         INTEGER NOT NULL DEFAULT 0,
    paused         INTEGER NOT NULL DEFAULT 0,
    pause_reason   TEXT,
    last_status    INTEGER,
    last_error     TEXT,
    tail_seq       INTEGER NOT NULL DEFAULT 0,
    UNIQUE (actor, recipient, ordering_key)
);
CREATE INDEX ol_lanes_tail ON ol_lanes (actor, tail_seq);
CREATE TABLE ol_dead_letters (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    unit_id           INTEGER NOT NULL,
    row_ref           INTEGER NOT NULL,
    row_id            TEXT NOT NULL,
    actor             TEXT NOT NULL,
    lane_id           INTEGER NOT NULL,
    recipient         TEXT NOT NULL,
    ordering_key      TEXT NOT NULL,
    reason            TEXT NOT NULL,
    last_status       INTEGER,
    last_error        TEXT,
    attempts          INTEGER NOT NULL,
    first_attempt_at  INTEGER,
    last_attempt_at   INTEGER,
    seq               INTEGER NOT NULL,
    dead_at           INTEGER NOT NULL
);
CREATE INDEX ol_dead_letters_actor ON ol_dead_letters (actor, seq);
CREATE INDEX ol_dead_letters_row ON ol_dead_letters (row_ref);
CREATE TABLE ol_slots (
    actor          TEXT PRIMARY KEY,
    token          INTEGER NOT NULL DEFAULT 0,
    holder         TEXT,
    lease_expires  INTEGER NOT NULL DEFAULT 0,
    look_again     INTEGER NOT NULL DEFAULT 0
);
"
    };
}

/// The version 1 layout (a unit in `ol_rows` + `ol_units` + `ol_deliveries`): the shared
/// tables and version 1's own two. Only a migration test builds it now, to check that
/// [`SqliteStore::open`] migrates it. (Should a later version change a shared table, version
/// 1 gets its own copy of it here.)
#[doc(hidden)]
pub const SCHEMA_V1: &str = concat!(
    shared_tables_ddl!(),
    "
CREATE TABLE ol_units (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    actor     TEXT NOT NULL,
    row_ref   INTEGER NOT NULL,
    seq       INTEGER NOT NULL,
    lanes     INTEGER NOT NULL,
    pending   INTEGER NOT NULL,
    acked_at  INTEGER
);
CREATE INDEX ol_units_row ON ol_units (row_ref);
CREATE INDEX ol_units_acked ON ol_units (acked_at) WHERE acked_at IS NOT NULL;
CREATE TABLE ol_deliveries (
    unit_id           INTEGER NOT NULL,
    lane_id           INTEGER NOT NULL,
    seq               INTEGER NOT NULL,
    state             INTEGER NOT NULL DEFAULT 0,
    attempts          INTEGER NOT NULL DEFAULT 0,
    last_status       INTEGER,
    last_error        TEXT,
    first_attempt_at  INTEGER,
    last_attempt_at   INTEGER,
    PRIMARY KEY (unit_id, lane_id)
) WITHOUT ROWID;
CREATE INDEX ol_deliveries_lane ON ol_deliveries (lane_id, seq, unit_id);
"
);

/// Version 2's `ol_units` (see SCHEMA.md): one row per (unit, lane); a one-recipient unit is
/// one row with its payload inline. Its indexes are partial, so that a one-lane inline unit
/// writes only `ol_units_lane` and `ol_units_row_id`.
macro_rules! units_v2_ddl {
    () => {
        "
CREATE TABLE ol_units (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    unit_id           INTEGER,
    actor             TEXT NOT NULL,
    lane_id           INTEGER,
    seq               INTEGER NOT NULL,
    state             INTEGER NOT NULL DEFAULT 0,
    attempts          INTEGER NOT NULL DEFAULT 0,
    last_status       INTEGER,
    last_error        TEXT,
    first_attempt_at  INTEGER,
    last_attempt_at   INTEGER,
    lanes             INTEGER NOT NULL DEFAULT 1,
    pending           INTEGER NOT NULL DEFAULT 1,
    acked_at          INTEGER,
    row_ref           INTEGER,
    row_id            TEXT,
    content_type      TEXT,
    body              BLOB,
    body_len          INTEGER,
    dedup_key         TEXT,
    ordering_key      TEXT,
    enqueued_at       INTEGER
);
CREATE INDEX ol_units_lane ON ol_units (lane_id, seq) WHERE lane_id IS NOT NULL;
CREATE UNIQUE INDEX ol_units_row_id ON ol_units (actor, row_id) WHERE row_id IS NOT NULL;
CREATE INDEX ol_units_unit ON ol_units (unit_id) WHERE unit_id IS NOT NULL;
CREATE INDEX ol_units_row ON ol_units (row_ref) WHERE row_ref IS NOT NULL;
CREATE INDEX ol_units_dedup ON ol_units (actor, dedup_key) WHERE dedup_key IS NOT NULL;
CREATE INDEX ol_units_acked ON ol_units (acked_at) WHERE acked_at IS NOT NULL;
CREATE INDEX ol_units_settled ON ol_units (lane_id) WHERE state <> 0 AND lane_id IS NOT NULL;
"
    };
}

/// The version 2 layout: a new database starts in it, then runs `MIGRATIONS` (tests use it too).
#[doc(hidden)]
pub const SCHEMA_V2: &str = concat!(shared_tables_ddl!(), units_v2_ddl!());

/// Version 2 → 3 (SCHEMA.md, "Migrations"): the rows' own request headers.
const V2_TO_V3: &str = "ALTER TABLE ol_units ADD COLUMN headers TEXT; \
     ALTER TABLE ol_rows ADD COLUMN headers TEXT;";

/// Version 3 → 4 (SCHEMA.md, "Migrations"): the lane-control generations (OL-14).
const V3_TO_V4: &str = "ALTER TABLE ol_slots ADD COLUMN control INTEGER NOT NULL DEFAULT 0; \
     ALTER TABLE ol_lanes ADD COLUMN control INTEGER NOT NULL DEFAULT 0; \
     CREATE INDEX ol_lanes_control ON ol_lanes (actor, control) WHERE control > 0;";

/// Version 4 → 5 (SCHEMA.md, "Migrations"): the row-id ledger and the outbox id.
const V4_TO_V5: &str = "CREATE TABLE ol_row_ids (\
         actor TEXT NOT NULL, row_id TEXT NOT NULL, enqueued_at INTEGER NOT NULL, \
         PRIMARY KEY (actor, row_id)) WITHOUT ROWID; \
     CREATE INDEX ol_row_ids_at ON ol_row_ids (enqueued_at); \
     INSERT OR IGNORE INTO ol_row_ids (actor, row_id, enqueued_at) \
         SELECT actor, row_id, coalesce(enqueued_at, 0) FROM ol_units WHERE row_id IS NOT NULL; \
     INSERT OR IGNORE INTO ol_row_ids (actor, row_id, enqueued_at) \
         SELECT actor, row_id, enqueued_at FROM ol_rows; \
     INSERT OR IGNORE INTO ol_meta (key, value) VALUES ('outbox_id', lower(hex(randomblob(16))));";

/// Version 5 → 6 (SCHEMA.md, "Migrations"): the hosts the relays share (`hosts.rs`).
const V5_TO_V6: &str = "CREATE TABLE ol_hosts (\
         origin TEXT PRIMARY KEY, failures INTEGER NOT NULL DEFAULT 0, \
         level INTEGER NOT NULL DEFAULT 0, not_before INTEGER, failing_since INTEGER, \
         last_error TEXT, blocked INTEGER NOT NULL DEFAULT 0, spec TEXT, spec_at INTEGER, \
         updated_at INTEGER NOT NULL) WITHOUT ROWID;";

/// Version 6 → 7 (SCHEMA.md, "Migrations"): a lane's run of failures (issue 41).
const V6_TO_V7: &str = "ALTER TABLE ol_lanes ADD COLUMN failing_since INTEGER; \
     ALTER TABLE ol_lanes ADD COLUMN unavailable_since INTEGER;";

/// Version 7 → 8 (SCHEMA.md, "Migrations"): the delivery log and the lanes' in-flight marks
/// (issue 39).
const V7_TO_V8: &str = "CREATE TABLE ol_delivery_log (\
         id INTEGER PRIMARY KEY, actor TEXT NOT NULL, row_id TEXT NOT NULL, \
         unit_id INTEGER NOT NULL, lane_id INTEGER NOT NULL, attempt INTEGER NOT NULL, \
         started_at INTEGER NOT NULL, duration_ms INTEGER NOT NULL, status INTEGER, \
         error_class TEXT, body TEXT, delivered INTEGER NOT NULL DEFAULT 0); \
     CREATE INDEX ol_delivery_log_row ON ol_delivery_log (actor, row_id); \
     ALTER TABLE ol_lanes ADD COLUMN in_flight_since INTEGER; \
     ALTER TABLE ol_lanes ADD COLUMN in_flight_unit INTEGER; \
     CREATE INDEX ol_lanes_in_flight ON ol_lanes (in_flight_since) \
         WHERE in_flight_since IS NOT NULL;";

/// The migrations past version 2 and the version each reaches: a new database runs them too.
const MIGRATIONS: [(u32, &str); 6] = [
    (3, V2_TO_V3),
    (4, V3_TO_V4),
    (5, V4_TO_V5),
    (6, V5_TO_V6),
    (7, V6_TO_V7),
    (8, V7_TO_V8),
];

/// The version 2 `ol_units` alone, for the migration from version 1.
const UNITS_V2: &str = units_v2_ddl!();

const STATE_SERVED: i64 = 1;

fn lock(m: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    // A panic inside a transaction rolled it back when the Transaction dropped; the
    // connection itself is still sound.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A SQLite failure as the store's error: locked is [`StoreError::Busy`], read-only is
/// [`StoreError::ReadOnly`] at `path`, anything else what `other` makes of it.
fn sqlite_err(
    e: rusqlite::Error,
    path: &str,
    other: impl FnOnce(rusqlite::Error) -> StoreError,
) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Busy,
        Some(ErrorCode::ReadOnly) => StoreError::ReadOnly { path: path.into() },
        _ => other(e),
    }
}

fn db_err(e: rusqlite::Error) -> StoreError {
    sqlite_err(e, "(database)", |e| StoreError::driver(e.to_string(), e))
}

/// A failure to open the database at `target`.
pub(crate) fn open_err(target: &str, e: rusqlite::Error) -> StoreError {
    sqlite_err(e, target, |e| {
        let hint = match e.sqlite_error_code() {
            Some(ErrorCode::CannotOpen) => " (does the directory exist and is it writable?)",
            _ => "",
        };
        StoreError::open(target, format!("{e}{hint}"), e)
    })
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        db_err(e)
    }
}

fn configure(conn: &Connection, opts: &SqliteOptions, file: bool) -> Result<(), rusqlite::Error> {
    conn.busy_timeout(opts.busy_timeout)?;
    if file {
        let _mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        conn.pragma_update(
            None,
            "synchronous",
            match opts.synchronous {
                Synchronous::Full => "FULL",
                Synchronous::Normal => "NORMAL",
            },
        )?;
    }
    // No foreign keys (as on Postgres): each would cost a parent lookup per inserted row and
    // a child lookup per deleted one on the hot path; the store's transactions keep the
    // references consistent.
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

/// The schema version a database records, without writing anything: `None` when it has no
/// outbox schema (no `ol_meta`, or no version in it).
pub(crate) fn schema_version(conn: &Connection) -> Result<Option<u32>, StoreError> {
    let has_meta: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ol_meta')",
        [],
        |r| r.get(0),
    )?;
    if !has_meta {
        return Ok(None);
    }
    let v: Option<String> = conn
        .query_row(
            "SELECT value FROM ol_meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    v.as_deref().map(crate::util::parse_version).transpose()
}

/// Creates or migrates the schema as `policy` allows (see [`SchemaPolicy`]). A current schema
/// costs two reads and no write; otherwise the DDL runs in one `BEGIN IMMEDIATE` transaction,
/// which looks at the version again under the write lock (another process may have created
/// or migrated it meanwhile).
fn init_schema(
    conn: &mut Connection,
    policy: SchemaPolicy,
    target: &str,
) -> Result<(), StoreError> {
    if !needs_ddl(schema_version(conn)?, policy, || target.to_owned())? {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found = schema_version(&tx)?;
    if !needs_ddl(found, policy, || target.to_owned())? {
        return Ok(());
    }
    match found {
        None => {
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS ol_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
            )?;
            tx.execute_batch(SCHEMA_V2)?;
            for (_, ddl) in MIGRATIONS {
                tx.execute_batch(ddl)?;
            }
            tx.execute(
                "INSERT INTO ol_meta (key, value) VALUES ('schema_version', ?1)",
                [SCHEMA_VERSION.to_string()],
            )?;
        }
        Some(found) => {
            // Migrations run in order, in this one transaction: all of them or none.
            if found < 2 {
                migrate_v1_to_v2(&tx)?;
            }
            for (_, ddl) in MIGRATIONS.iter().filter(|(to, _)| found < *to) {
                tx.execute_batch(ddl)?;
            }
            tx.execute(
                "UPDATE ol_meta SET value = ?1 WHERE key = 'schema_version'",
                [SCHEMA_VERSION.to_string()],
            )?;
            tracing::info!(target: "outbox_lanes::store", from = found, to = SCHEMA_VERSION, "migrated the SQLite schema");
        }
    }
    tx.commit()?;
    Ok(())
}

/// The outbox id (`ol_meta`), made with the schema.
fn outbox_id(conn: &Connection) -> Result<String, StoreError> {
    conn.query_row(
        "SELECT value FROM ol_meta WHERE key = 'outbox_id'",
        [],
        |r| r.get(0),
    )
    .optional()?
    .ok_or_else(|| StoreError::Database("the database has no outbox_id in ol_meta".into()))
}

/// Version 1 → 2 (SCHEMA.md, "Migrations"): a unit's three tables become one `ol_units` row per
/// (unit, lane). Each unit keeps its id (its head is its lowest lane), its payload stays in
/// `ol_rows` (`row_ref`), its other lanes get fresh ids after every id ever handed out.
fn migrate_v1_to_v2(tx: &Transaction<'_>) -> Result<(), StoreError> {
    // The AUTOINCREMENT high-water mark: ids of deleted units must never come back.
    let issued: i64 = tx
        .query_row(
            "SELECT seq FROM sqlite_sequence WHERE name = 'ol_units'",
            [],
            |r| r.get(0),
        )
        .optional()?
        .unwrap_or(0);
    // Renamed rather than copied aside: the rows are read once, straight into the new table.
    // Its indexes go first, since version 2 reuses two of their names.
    tx.execute_batch(
        "DROP INDEX IF EXISTS ol_units_row; DROP INDEX IF EXISTS ol_units_acked; \
         ALTER TABLE ol_units RENAME TO ol_units_v1;",
    )?;
    tx.execute_batch(UNITS_V2)?;
    // Heads: every unit at its lowest lane (the seq is the delivery's: the seq the lane
    // orders by). A unit without deliveries was kept by the ack retention: out of every lane.
    tx.execute_batch(&format!(
        "INSERT INTO ol_units (id, unit_id, actor, lane_id, seq, state, attempts, last_status, last_error, \
         first_attempt_at, last_attempt_at, lanes, pending, acked_at, row_ref) \
         SELECT u.id, NULL, u.actor, d.lane_id, coalesce(d.seq, u.seq), coalesce(d.state, {STATE_SERVED}), \
         coalesce(d.attempts, 0), d.last_status, d.last_error, d.first_attempt_at, d.last_attempt_at, \
         u.lanes, u.pending, u.acked_at, u.row_ref \
         FROM ol_units_v1 u LEFT JOIN ol_deliveries d ON d.unit_id = u.id \
         AND d.lane_id = (SELECT min(m.lane_id) FROM ol_deliveries m WHERE m.unit_id = u.id) \
         ORDER BY u.id;"
    ))?;
    // The new table's sequence continues after the largest id ever issued, and the other lanes'
    // rows draw from it. (Whether the rename carried the old sequence row along or not, this
    // leaves exactly one row for `ol_units`.)
    tx.execute("DELETE FROM sqlite_sequence WHERE name = 'ol_units'", [])?;
    tx.execute(
        "INSERT INTO sqlite_sequence (name, seq) \
         VALUES ('ol_units', max(?1, (SELECT coalesce(max(id), 0) FROM ol_units)))",
        [issued],
    )?;
    tx.execute_batch(
        "INSERT INTO ol_units (unit_id, actor, lane_id, seq, state, attempts, last_status, last_error, \
         first_attempt_at, last_attempt_at) \
         SELECT d.unit_id, u.actor, d.lane_id, d.seq, d.state, d.attempts, d.last_status, d.last_error, \
         d.first_attempt_at, d.last_attempt_at \
         FROM ol_deliveries d JOIN ol_units_v1 u ON u.id = d.unit_id \
         WHERE d.lane_id > (SELECT min(m.lane_id) FROM ol_deliveries m WHERE m.unit_id = d.unit_id) \
         ORDER BY d.unit_id, d.lane_id; \
         DROP TABLE ol_deliveries; \
         DROP TABLE ol_units_v1;",
    )?;
    Ok(())
}

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path`, and creates or migrates its
    /// schema as [`CommonOptions::schema`] allows (by default: both).
    ///
    /// # Errors
    /// [`StoreError::Open`] if the file cannot be opened or created (missing directory),
    /// [`StoreError::ReadOnly`] if it cannot be written, [`StoreError::SchemaTooNew`] for a
    /// database from a newer version, [`StoreError::SchemaTooOld`] or
    /// [`StoreError::NoSchema`] when the schema policy forbids the DDL it would take,
    /// [`StoreError::Busy`] if it stayed locked.
    pub fn open(path: impl AsRef<Path>, opts: SqliteOptions) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_file(path.as_ref(), opts, false)
    }

    /// Opens an existing database file for reading only: no connection can write, no DDL runs
    /// (the schema must be current), no file is created beside it (no holder locks). What
    /// `status`, `lanes` and `dead-letters list|show` need, with only read permission on the
    /// file. Every write through it fails with [`StoreError::ReadOnly`].
    ///
    /// A WAL database is read through its `-wal` and `-shm` files: when a writer has it open
    /// they exist and only need to be readable; when none has, SQLite creates them if the
    /// directory is writable. If it cannot (a read-only directory, no writer), the file is
    /// read as immutable, which is exact while nobody writes it: the snapshot of a moment
    /// when nobody did.
    ///
    /// # Errors
    /// [`StoreError::Open`] if the file is missing or unreadable, [`StoreError::NoSchema`],
    /// [`StoreError::SchemaTooOld`], [`StoreError::SchemaTooNew`].
    pub fn open_read_only(
        path: impl AsRef<Path>,
        opts: SqliteOptions,
    ) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_file(path.as_ref(), opts, true)
    }

    fn open_file(
        path: &Path,
        opts: SqliteOptions,
        read_only: bool,
    ) -> Result<SqliteStore, StoreError> {
        let path = path.to_path_buf();
        let shown = path.display().to_string();
        if read_only && !path.exists() {
            return Err(StoreError::NoSchema { target: shown });
        }
        let policy = if read_only {
            SchemaPolicy::Existing
        } else {
            opts.common.schema
        };
        // Read-only, a WAL database whose -shm cannot be made (no writer has it open and the
        // directory is not writable) is read as immutable (see `open_read_only`).
        let immutable = AtomicBool::new(false);
        let open_one = || -> Result<Connection, StoreError> {
            let conn = if read_only {
                read_only_conn(&path, &immutable).map_err(|e| open_err(&shown, e))?
            } else {
                Connection::open_with_flags(
                    &path,
                    OpenFlags::SQLITE_OPEN_READ_WRITE
                        | OpenFlags::SQLITE_OPEN_CREATE
                        | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )
                .map_err(|e| open_err(&shown, e))?
            };
            configure(&conn, &opts, !read_only).map_err(|e| open_err(&shown, e))?;
            Ok(conn)
        };
        // Two processes opening a new database at once (a relay starting while an enqueue
        // creates the file) race to switch it to WAL and to create the tables; SQLite answers
        // the loser "busy" at once, without its busy handler. Both steps are retried until
        // the busy timeout has passed.
        let deadline = std::time::Instant::now() + opts.busy_timeout;
        let retry_busy = |step: &mut dyn FnMut() -> Result<Connection, StoreError>| loop {
            match step() {
                Err(StoreError::Busy) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                other => return other,
            }
        };
        let writer = retry_busy(&mut || {
            let mut writer = open_one()?;
            init_schema(&mut writer, policy, &shown).map_err(|e| match e {
                StoreError::ReadOnly { .. } => StoreError::ReadOnly {
                    path: shown.clone(),
                },
                other => other,
            })?;
            Ok(writer)
        })?;
        let outbox_id = outbox_id(&writer)?;
        let mut readers = Vec::with_capacity(opts.readers.max(1));
        for _ in 0..opts.readers.max(1) {
            readers.push(Mutex::new(retry_busy(&mut || open_one())?));
        }
        if immutable.load(Ordering::Relaxed) {
            tracing::debug!(target: "outbox_lanes::store", path = %shown,
                "read as immutable: no writer has the database open and its directory is not writable");
        }
        Ok(SqliteStore {
            conns: Conns::File {
                writer: Mutex::new(writer),
                readers,
                next: AtomicUsize::new(0),
            },
            liveness: (!read_only).then(|| Liveness::new(&path)),
            #[cfg(unix)]
            identity: file_identity(&path).ok(),
            #[cfg(not(unix))]
            identity: None,
            path: Some(path),
            opts,
            shared: Shared {
                outbox_id,
                ..Shared::new(None)
            },
            watcher: Mutex::new(None),
        })
    }

    /// A private in-memory database with default options.
    ///
    /// # Errors
    /// Only if SQLite cannot allocate the database.
    pub fn in_memory() -> Result<SqliteStore, StoreError> {
        SqliteStore::in_memory_with(SqliteOptions::default())
    }

    /// A private in-memory database: one connection behind a mutex.
    ///
    /// # Errors
    /// Only if SQLite cannot allocate the database.
    pub fn in_memory_with(opts: SqliteOptions) -> Result<SqliteStore, StoreError> {
        let mut conn = Connection::open_in_memory().map_err(|e| open_err(":memory:", e))?;
        configure(&conn, &opts, false)?;
        // A new database: there is nothing to migrate, only the schema to create.
        init_schema(&mut conn, SchemaPolicy::Migrate, ":memory:")?;
        let outbox_id = outbox_id(&conn)?;
        Ok(SqliteStore {
            conns: Conns::Memory(Mutex::new(conn)),
            path: None,
            opts,
            shared: Shared {
                outbox_id,
                ..Shared::new(None)
            },
            watcher: Mutex::new(None),
            liveness: None,
            identity: None,
        })
    }

    fn writer(&self) -> MutexGuard<'_, Connection> {
        match &self.conns {
            Conns::Memory(c) => lock(c),
            Conns::File { writer, .. } => lock(writer),
        }
    }

    fn reader(&self) -> MutexGuard<'_, Connection> {
        match &self.conns {
            Conns::Memory(c) => lock(c),
            Conns::File { readers, next, .. } => {
                // Prefer an idle reader; otherwise queue on one in turn.
                for r in readers {
                    if let Ok(g) = r.try_lock() {
                        return g;
                    }
                }
                let n = next.fetch_add(1, Ordering::Relaxed) % readers.len();
                lock(&readers[n])
            }
        }
    }

    /// `e`, naming this store's file when it is about the database being read-only.
    fn named(&self, e: StoreError) -> StoreError {
        named(e, self.path.as_deref())
    }

    /// Enqueues inside the caller's own transaction (the transactional outbox, OL-15): the
    /// rows commit or roll back with the caller's data. The transaction must be on a connection
    /// to this store's database (the schema exists once the store was opened).
    ///
    /// Call the returned [`PendingWake::fire`] after the commit; never before. If it is not
    /// fired, the cross-process watcher (started by [`DriverStore::watch`](crate::DriverStore::watch)) or the monitor's poll
    /// still finds the rows.
    ///
    /// # Errors
    /// As [`ServiceStore::enqueue`](crate::ServiceStore::enqueue); the caller's transaction is left to the caller (roll it back).
    pub fn enqueue_in(
        &self,
        tx: &Transaction<'_>,
        actor: impl Into<ActorId>,
        rows: &[NewRow],
    ) -> Result<(Vec<Enqueued>, PendingWake), EnqueueError> {
        let actor = &actor.into();
        let prepared = prepare(rows, &self.opts.common)?;
        // A savepoint so a refused batch leaves the caller's transaction as it was.
        tx.execute_batch("SAVEPOINT ol_enqueue").map_err(db_err)?;
        let mut db = SqliteDb {
            conn: tx,
            path: self.path.as_deref(),
        };
        let done = ready(enqueue(&mut db, actor, &prepared, None, &self.opts.common))
            .and_then(|v| ready(check_stored_policy(&mut db, &prepared)).map(|()| v));
        match done {
            Ok(v) => {
                tx.execute_batch("RELEASE ol_enqueue").map_err(db_err)?;
                Ok((v, PendingWake::new(self.shared.notifier.clone())))
            }
            Err(e) => {
                let _ = tx.execute_batch("ROLLBACK TO ol_enqueue; RELEASE ol_enqueue");
                Err(e)
            }
        }
    }

    /// Runs `f` in a transaction on the store's own writer connection, commits it, then fires
    /// the wake-up itself (drop the [`PendingWake`] that [`SqliteStore::enqueue_in`] returns
    /// inside `f`; firing it there, before the commit, would wake a pass too early). The way
    /// to enqueue beside business writes when the caller has no connection of its own to the
    /// database (an in-memory store); with a file store, the caller's own connection and
    /// [`SqliteStore::enqueue_in`] do the same. If `f` fails, the transaction rolls back and
    /// nothing is written.
    ///
    /// Inside `f`, use only `enqueue_in` and your own SQL on `tx`: any other method of this store
    /// waits for the connection `f` is holding, and never gets it.
    ///
    /// # Errors
    /// `f`'s error, or the commit's.
    pub fn with_transaction<T, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let v = {
            let mut conn = self.writer();
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(StoreError::from)?;
            let v = f(&tx)?;
            tx.commit().map_err(StoreError::from)?;
            v
        };
        self.shared.notifier.notify();
        Ok(v)
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &SqliteOptions {
        &self.opts
    }
}

/// A read-only connection to the database at `path`, checked with a read. A WAL database whose
/// `-shm` cannot be made (no writer has it open and the directory is not writable) is opened
/// immutable instead, and `immutable` is set so that the next connection goes straight there.
pub(crate) fn read_only_conn(
    path: &Path,
    immutable: &AtomicBool,
) -> Result<Connection, rusqlite::Error> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let probe = |conn: Connection| -> Result<Connection, rusqlite::Error> {
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
            r.get::<_, i64>(0)
        })?;
        Ok(conn)
    };
    if !immutable.load(Ordering::Relaxed) {
        match Connection::open_with_flags(path, flags).and_then(probe) {
            Err(e) if is_cannot_open(&e) => {}
            other => return other,
        }
    }
    immutable.store(true, Ordering::Relaxed);
    Connection::open_with_flags(immutable_uri(path), flags | OpenFlags::SQLITE_OPEN_URI)
        .and_then(probe)
}

/// Whether a read-only connection failed for want of the WAL index: its `-shm` could not be
/// made or initialised (`SQLITE_CANTOPEN`, or `SQLITE_READONLY_CANTINIT` and its kin, which
/// a connection that only reads gets for nothing else).
fn is_cannot_open(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::CannotOpen | ErrorCode::ReadOnly)
    )
}

/// `path` as an SQLite URI opening it immutable (`file:…?immutable=1`, the path's `%`, `?` and
/// `#` escaped).
fn immutable_uri(path: &Path) -> String {
    let mut uri = String::from("file:");
    for c in path.to_string_lossy().chars() {
        match c {
            '%' => uri.push_str("%25"),
            '?' => uri.push_str("%3f"),
            '#' => uri.push_str("%23"),
            c => uri.push(c),
        }
    }
    uri.push_str("?immutable=1");
    uri
}

impl SqliteStore {
    /// Whether `holder` may still hold a live drain slot of this database (`true` when the
    /// check fails: its lock file then stays, the safe side).
    fn holds_a_slot(&self, holder: &str) -> bool {
        let held = self.read(|db| crate::slots::holds_a_slot(db, holder));
        !matches!(held, Ok(false))
    }
}

impl Drop for SqliteStore {
    /// Before the liveness locks (`crate::liveness`) remove the lock files of this store's holders (a clean stop freed
    /// their slots already), a holder that still holds a slot (a pass cut off by a shutdown
    /// grace that ended) keeps its file, unlocked: other processes then find it dead and take
    /// its slots over at once, instead of not knowing it and waiting for the lease.
    fn drop(&mut self) {
        let Some(live) = &self.liveness else {
            return;
        };
        for holder in live.held() {
            if self.holds_a_slot(&holder) {
                tracing::debug!(holder = %holder,
                    "drain slots still held at close: the lock file stays, unlocked, so other relays take them over at once");
                live.leave_unlocked(&holder);
            }
        }
    }
}

/// `e`, naming the file at `path` when it is about the database being read-only.
fn named(e: StoreError, path: Option<&Path>) -> StoreError {
    match (e, path) {
        (StoreError::ReadOnly { .. }, Some(path)) => StoreError::ReadOnly {
            path: path.display().to_string(),
        },
        (e, _) => e,
    }
}

impl ToSql for Value<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Value::Int(v) | Value::OptInt(Some(v)) => ValueRef::Integer(v),
            Value::Text(v) | Value::OptText(Some(v)) => ValueRef::Text(v.as_bytes()),
            Value::OptInt(None) | Value::OptText(None) => ValueRef::Null,
            Value::Bytes(v) => ValueRef::Blob(v),
            Value::Bool(v) => ValueRef::Integer(i64::from(v)),
            Value::Ints(_)
            | Value::OptInts(_)
            | Value::Texts(_)
            | Value::OptTexts(_)
            | Value::Byteses(_) => {
                return Err(rusqlite::Error::ToSqlConversionFailure(
                    "an array bound on SQLite (arrays are Postgres only)".into(),
                ));
            }
        }))
    }
}

crate::db::impl_get!(rusqlite::Row<'_>, |r, c| Ok(r.get(c)?));

/// A SQLite connection (or a transaction on it) as a [`Db`]; statements are prepared
/// through rusqlite's statement cache. A read-only failure names the store's file.
pub(crate) struct SqliteDb<'c> {
    conn: &'c Connection,
    path: Option<&'c Path>,
}

impl SqliteDb<'_> {
    fn checked<T>(&self, r: Result<T, rusqlite::Error>) -> Result<T, StoreError> {
        r.map_err(|e| named(db_err(e), self.path))
    }
}

impl Db for SqliteDb<'_> {
    const DIALECT: Dialect = Dialect::Sqlite;

    fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
        self.checked(self.conn.execute_batch(sql))
    }

    fn execute(&mut self, sql: &Sql, args: &[Value<'_>]) -> Result<u64, StoreError> {
        let n = self
            .conn
            .prepare_cached(sql.text(Dialect::Sqlite))
            .and_then(|mut st| st.execute(rusqlite::params_from_iter(args)));
        self.checked(n).map(|n| n as u64)
    }

    fn insert(&mut self, sql: &Sql, args: &[Value<'_>]) -> Result<Option<i64>, StoreError> {
        let n = self.execute(sql, args)?;
        Ok((n > 0).then(|| self.conn.last_insert_rowid()))
    }

    fn query<T>(
        &mut self,
        sql: &Sql,
        args: &[Value<'_>],
        mut map: impl FnMut(&dyn Get) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let mut st = self.checked(self.conn.prepare_cached(sql.text(Dialect::Sqlite)))?;
        let mut rows = self.checked(st.query(rusqlite::params_from_iter(args)))?;
        let mut out = Vec::new();
        while let Some(row) = self.checked(rows.next())? {
            out.push(map(row)?);
        }
        Ok(out)
    }
}

impl Backend for SqliteStore {
    const DIALECT: Dialect = Dialect::Sqlite;
    type Conn<'c> = SqliteDb<'c>;

    fn read<T>(
        &self,
        mut f: impl FnMut(&mut SqliteDb<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.reader();
        // A deferred transaction: one consistent snapshot for the whole read.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
        let path = self.path.as_deref();
        let v = f(&mut SqliteDb { conn: &tx, path })?;
        tx.commit()?;
        Ok(v)
    }

    fn write<T, E: From<StoreError>>(
        &self,
        _idempotent: bool,
        mut f: impl FnMut(&mut SqliteDb<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut conn = self.writer();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.named(e.into()))?;
        let path = self.path.as_deref();
        let v = f(&mut SqliteDb { conn: &tx, path })?;
        tx.commit().map_err(|e| self.named(e.into()))?;
        Ok(v)
    }

    fn common(&self) -> &CommonOptions {
        &self.opts.common
    }

    fn shared(&self) -> &Shared {
        &self.shared
    }

    fn register_holder(&self, holder: &str) {
        if let Some(l) = &self.liveness {
            l.register(holder);
        }
    }

    fn release_holder(&self, holder: &str) {
        let Some(live) = &self.liveness else {
            return;
        };
        if !live.held().iter().any(|h| h == holder) {
            return;
        }
        if self.holds_a_slot(holder) {
            tracing::debug!(
                holder,
                "drain slots still held at the stop: the lock file stays, unlocked, so other relays take them over at once"
            );
            live.leave_unlocked(holder);
        } else {
            live.close(holder);
        }
    }

    fn holder_is_dead(&self, _: &mut SqliteDb<'_>, holder: &str) -> Result<bool, StoreError> {
        Ok(self.liveness.as_ref().is_some_and(|l| l.is_dead(holder)))
    }

    fn check_database(&self) -> Result<(), StoreError> {
        #[cfg(unix)]
        if let (Some(opened), Some(path)) = (self.identity, &self.path) {
            let what = match file_identity(path) {
                Ok(now) if now == opened => return Ok(()),
                Ok(_) => "replaced by another file",
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => "removed",
                // Cannot tell (a directory made unreadable): not known to be replaced.
                Err(_) => return Ok(()),
            };
            return Err(StoreError::Replaced {
                path: path.display().to_string(),
                what,
            });
        }
        Ok(())
    }

    fn watch(&self) -> Result<Notifier, StoreError> {
        let Some(path) = &self.path else {
            // Nothing outside this process can reach a private in-memory database.
            return Ok(self.shared.notifier.clone());
        };
        let mut w = self.watcher.lock().unwrap_or_else(PoisonError::into_inner);
        if w.is_none() {
            let conn = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(|e| open_err(&path.display().to_string(), e))?;
            conn.busy_timeout(self.opts.busy_timeout)?;
            let notifier = self.shared.notifier.clone();
            let every = self.opts.watch_interval;
            *w = Some(WatcherThread::spawn(
                &*self.shared.threads(),
                "outbox-lanes-sqlite-watch",
                move |stop| watch_loop(&conn, stop, &notifier, every),
            )?);
        }
        Ok(self.shared.notifier.clone())
    }
}

/// `PRAGMA data_version` changes when another connection (another process, or this store's
/// own writer) commits; any change is "something changed".
fn watch_loop(conn: &Connection, stop: &AtomicBool, notifier: &Notifier, every: Duration) {
    let read = || {
        conn.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
            .ok()
    };
    let mut last = read();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(every);
        let now = read();
        if now.is_some() && now != last {
            last = now;
            tracing::trace!(target: "outbox_lanes::store", reason = "data_version", "wake-up from a commit on another connection");
            notifier.notify();
        }
    }
}
