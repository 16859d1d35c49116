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
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

pub use rusqlite;
use rusqlite::{
    Connection, ErrorCode, OpenFlags, OptionalExtension, Transaction, TransactionBehavior, params,
};

use outbox_lanes_core::{ActorId, LaneKey, Seq, Timestamp, UnitId};

use crate::backend::Backend;
use crate::db::SqliteDb;
use crate::driver::HotPath;
use crate::liveness::Liveness;
use crate::notify::{Notifier, PendingWake};
use crate::prepare::{PreparedRow, prepare};
use crate::types::*;
use crate::util::{
    decode_headers, encode_headers, key_of, millis_of, needs_ddl, timestamp_of, to_i64, to_u32,
    to_u64, window_millis,
};
use crate::watcher::WatcherThread;
use crate::{EnqueueError, SCHEMA_VERSION, StoreError};
use crate::{dead_letters, row_ids, slots, units};

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
    notifier: Notifier,
    watcher: Mutex<Option<WatcherThread>>,
    /// Holder locks beside the leases (a file database opened for writing only): see
    /// [`crate::liveness`].
    liveness: Option<Liveness>,
    /// The outbox id (`ol_meta`), read once at open.
    outbox_id: String,
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

/// SQLite's clock in milliseconds, read inside the statement.
const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

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

/// The version 2 layout. A new database is created in it and then migrated to version 4 in
/// the same transaction, so that new and migrated databases cannot differ; a migration test
/// builds a version 2 database from it.
#[doc(hidden)]
pub const SCHEMA_V2: &str = concat!(shared_tables_ddl!(), units_v2_ddl!());

/// Version 2 → 3 (SCHEMA.md, "Migrations"): the rows' own request headers, `NULL` for a row
/// without (the common case costs nothing). Adding a nullable column without a default
/// rewrites no row.
const V2_TO_V3: &str = "ALTER TABLE ol_units ADD COLUMN headers TEXT; \
     ALTER TABLE ol_rows ADD COLUMN headers TEXT;";

/// Version 3 → 4 (SCHEMA.md, "Migrations"): the lane-control generations (OL-14) — per actor
/// on its slot row, per lane the generation of the last operator action on it, with an index
/// on the lanes an operator ever touched (only those are in it: enqueues pay nothing for it).
/// A column with a constant default rewrites no row.
const V3_TO_V4: &str = "ALTER TABLE ol_slots ADD COLUMN control INTEGER NOT NULL DEFAULT 0; \
     ALTER TABLE ol_lanes ADD COLUMN control INTEGER NOT NULL DEFAULT 0; \
     CREATE INDEX ol_lanes_control ON ol_lanes (actor, control) WHERE control > 0;";

/// Version 4 → 5 (SCHEMA.md, "Migrations"): the row-id ledger (the dedup window past
/// delivery, `row_ids.rs`), filled with the row ids stored now, and the outbox id, random, made
/// once with the schema (the first half of every idempotency key).
const V4_TO_V5: &str = "CREATE TABLE ol_row_ids (\
         actor TEXT NOT NULL, row_id TEXT NOT NULL, enqueued_at INTEGER NOT NULL, \
         PRIMARY KEY (actor, row_id)) WITHOUT ROWID; \
     CREATE INDEX ol_row_ids_at ON ol_row_ids (enqueued_at); \
     INSERT OR IGNORE INTO ol_row_ids (actor, row_id, enqueued_at) \
         SELECT actor, row_id, coalesce(enqueued_at, 0) FROM ol_units WHERE row_id IS NOT NULL; \
     INSERT OR IGNORE INTO ol_row_ids (actor, row_id, enqueued_at) \
         SELECT actor, row_id, enqueued_at FROM ol_rows; \
     INSERT OR IGNORE INTO ol_meta (key, value) VALUES ('outbox_id', lower(hex(randomblob(16))));";

/// Version 5 → 6: the hosts the relays share (`hosts.rs`): connection health, the signature
/// scheme each accepted, the operator's block.
const V5_TO_V6: &str = "CREATE TABLE ol_hosts (\
         origin TEXT PRIMARY KEY, failures INTEGER NOT NULL DEFAULT 0, \
         level INTEGER NOT NULL DEFAULT 0, not_before INTEGER, failing_since INTEGER, \
         last_error TEXT, blocked INTEGER NOT NULL DEFAULT 0, spec TEXT, spec_at INTEGER, \
         updated_at INTEGER NOT NULL) WITHOUT ROWID;";

/// The version 2 `ol_units` alone, for the migration from version 1.
const UNITS_V2: &str = units_v2_ddl!();

const STATE_PENDING: i64 = 0;
const STATE_SERVED: i64 = 1;
/// The row of one (unit, lane): the unit's head itself, or one of its other lanes. `+lane_id`
/// keeps the planner on the id / `ol_units_unit` lookups instead of walking the lane's index.
const UNIT_LANE: &str = "(d.id = ?1 AND d.unit_id IS NULL OR d.unit_id = ?1) AND +d.lane_id = ?2";

fn lock(m: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    // A panic inside a transaction rolled it back when the Transaction dropped; the
    // connection itself is still sound.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn db_err(e: rusqlite::Error) -> StoreError {
    match &e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => StoreError::Busy,
            ErrorCode::ReadOnly => StoreError::ReadOnly {
                path: String::from("(database)"),
            },
            _ => StoreError::driver(e.to_string(), e),
        },
        _ => StoreError::driver(e.to_string(), e),
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        db_err(e)
    }
}

impl From<rusqlite::Error> for EnqueueError {
    fn from(e: rusqlite::Error) -> Self {
        EnqueueError::Store(db_err(e))
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
    v.map(|v| {
        v.parse()
            .map_err(|_| StoreError::Database(format!("unreadable schema_version {v:?}")))
    })
    .transpose()
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
            tx.execute_batch(V2_TO_V3)?;
            tx.execute_batch(V3_TO_V4)?;
            tx.execute_batch(V4_TO_V5)?;
            tx.execute_batch(V5_TO_V6)?;
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
            if found < 3 {
                tx.execute_batch(V2_TO_V3)?;
            }
            if found < 4 {
                tx.execute_batch(V3_TO_V4)?;
            }
            if found < 5 {
                tx.execute_batch(V4_TO_V5)?;
            }
            if found < 6 {
                tx.execute_batch(V5_TO_V6)?;
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
            outbox_id,
            notifier: Notifier::new(),
            watcher: Mutex::new(None),
        })
    }

    /// Ends the leases of every slot of the dead holders among those holding `actor`'s slot
    /// (or any slot): a holder whose lock file is free (see [`crate::liveness`]). Their slots
    /// are then taken over at once, with a new fencing token, instead of after their lease.
    fn expire_dead_holders(
        &self,
        c: &Connection,
        us: &str,
        actor: Option<&ActorId>,
    ) -> Result<(), StoreError> {
        let Some(live) = &self.liveness else {
            return Ok(());
        };
        // One primary-key lookup for one actor (every acquisition): an `?2 IS NULL OR` form
        // would scan every slot, once per pass. Every slot only for the monitor's poll.
        let holders: Vec<String> = match actor {
            Some(a) => c
                .prepare_cached(&format!(
                    "SELECT holder FROM ol_slots WHERE actor = ?2 AND holder IS NOT NULL \
                     AND holder <> ?1 AND lease_expires > {NOW}"
                ))?
                .query_map(params![us, a.as_str()], |r| r.get(0))?
                .collect::<Result<_, _>>()?,
            None => c
                .prepare_cached(&format!(
                    "SELECT DISTINCT holder FROM ol_slots WHERE holder IS NOT NULL AND holder <> ?1 \
                     AND lease_expires > {NOW}"
                ))?
                .query_map(params![us], |r| r.get(0))?
                .collect::<Result<_, _>>()?,
        };
        for dead in holders.into_iter().filter(|h| live.is_dead(h)) {
            // Every slot it held: it is dead for all of them (and its lock file is gone now).
            let n = c
                .prepare_cached("UPDATE ol_slots SET lease_expires = 0 WHERE holder = ?1")?
                .execute([&dead])?;
            tracing::info!(holder = %dead, slots = n,
                "the holder of these drain slots is dead (its process is gone): taken over without waiting for the lease");
        }
        Ok(())
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
            outbox_id,
            notifier: Notifier::new(),
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

    fn write<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.writer();
        let written = (|| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let v = f(&tx)?;
            tx.commit()?;
            Ok(v)
        })();
        written.map_err(|e| self.named(e))
    }

    /// `e`, naming this store's file when it is about the database being read-only.
    fn named(&self, e: StoreError) -> StoreError {
        match (e, &self.path) {
            (StoreError::ReadOnly { .. }, Some(path)) => StoreError::ReadOnly {
                path: path.display().to_string(),
            },
            (e, _) => e,
        }
    }

    fn read<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.reader();
        // A deferred transaction: one consistent snapshot for the whole read.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
        let v = f(&tx)?;
        tx.commit()?;
        Ok(v)
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
        actor: &ActorId,
        rows: &[NewRow],
    ) -> Result<(Vec<Enqueued>, PendingWake), EnqueueError> {
        let prepared = prepare(rows, &self.opts.common)?;
        // A savepoint so a refused batch leaves the caller's transaction as it was.
        tx.execute_batch("SAVEPOINT ol_enqueue")?;
        match enqueue_tx(tx, actor, &prepared, &self.opts.common) {
            Ok(v) => {
                tx.execute_batch("RELEASE ol_enqueue")?;
                Ok((v, PendingWake::new(self.notifier.clone())))
            }
            Err(e) => {
                let _ = tx.execute_batch("ROLLBACK TO ol_enqueue; RELEASE ol_enqueue");
                Err(e)
            }
        }
    }

    /// Runs `f` in a transaction on the store's own writer connection, commits it, then fires
    /// the wake-up. Meant for an in-memory store, whose caller cannot open a second
    /// connection: call [`SqliteStore::enqueue_in`] inside `f` beside the business writes.
    /// If `f` fails, the transaction rolls back and nothing is written.
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
        self.notifier.notify();
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
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if matches!(f.code, ErrorCode::CannotOpen | ErrorCode::ReadOnly))
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

fn open_err(target: &str, e: rusqlite::Error) -> StoreError {
    match &e {
        rusqlite::Error::SqliteFailure(f, _) if f.code == ErrorCode::CannotOpen => {
            let reason = format!("{e} (does the directory exist and is it writable?)");
            StoreError::open(target, reason, e)
        }
        rusqlite::Error::SqliteFailure(f, _) if f.code == ErrorCode::ReadOnly => {
            StoreError::ReadOnly {
                path: target.to_string(),
            }
        }
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(f.code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) =>
        {
            StoreError::Busy
        }
        _ => StoreError::open(target, e.to_string(), e),
    }
}

fn lane_id(c: &Connection, actor: &str, key: &LaneKey) -> Result<i64, rusqlite::Error> {
    let ok = key.ordering_key().unwrap_or("");
    let found = c
        .prepare_cached(
            "SELECT id FROM ol_lanes WHERE actor = ?1 AND recipient = ?2 AND ordering_key = ?3",
        )?
        .query_row(params![actor, key.recipient(), ok], |r| r.get(0))
        .optional()?;
    match found {
        Some(id) => Ok(id),
        // The write lock is held: nobody else can create it between the look and the insert.
        None => c
            .prepare_cached("INSERT INTO ol_lanes (actor, recipient, ordering_key) VALUES (?1, ?2, ?3) RETURNING id")?
            .query_row(params![actor, key.recipient(), ok], |r| r.get(0)),
    }
}

/// Whether `e` is a UNIQUE violation (here: a row id the actor already has).
fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE)
}

/// Maps a failed insert of row `row` to [`EnqueueError::DuplicateRowId`] when a unique index
/// refused it (belt and braces: the inserts check for the id first).
fn dup_or(e: rusqlite::Error, row: &str) -> EnqueueError {
    if is_unique_violation(&e) {
        EnqueueError::DuplicateRowId {
            row: row.to_string(),
        }
    } else {
        EnqueueError::from(e)
    }
}

/// Whether a unit with this dedup key is still pending for this recipient. Two index paths
/// (payload inline on a head, or in a shared `ol_rows` row), each through the unit's head
/// and its other lanes.
fn dedup_pending(
    c: &Connection,
    actor: &str,
    dedup_key: &str,
    recipient: &str,
) -> Result<bool, rusqlite::Error> {
    c.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM ol_units h JOIN ol_units d ON d.id = h.id OR d.unit_id = h.id \
           JOIN ol_lanes l ON l.id = d.lane_id \
           WHERE h.actor = ?1 AND h.dedup_key = ?2 AND h.unit_id IS NULL AND d.state = 0 AND l.recipient = ?3) \
         OR EXISTS (SELECT 1 FROM ol_rows r JOIN ol_units h ON h.row_ref = r.id \
           JOIN ol_units d ON d.id = h.id OR d.unit_id = h.id JOIN ol_lanes l ON l.id = d.lane_id \
           WHERE r.actor = ?1 AND r.dedup_key = ?2 AND h.unit_id IS NULL AND d.state = 0 AND l.recipient = ?3)",
    )?
    .query_row(params![actor, dedup_key, recipient], |r| r.get(0))
}

fn enqueue_tx(
    c: &Connection,
    actor: &ActorId,
    rows: &[PreparedRow<'_>],
    common: &CommonOptions,
) -> Result<Vec<Enqueued>, EnqueueError> {
    let a = actor.as_str();
    let now = millis_of(Timestamp::from_system_time(std::time::SystemTime::now()));
    let n = i64::try_from(rows.len()).unwrap_or(i64::MAX);
    let first = units::alloc_seqs(&mut SqliteDb(c), a, n)?;
    // The dedup window past delivery: each id new to the actor, or last used before it.
    let ids: Vec<&str> = rows.iter().map(|p| p.row.id.as_str()).collect();
    row_ids::take(&mut SqliteDb(c), a, &ids, now, window_millis(common))?;
    let mut lanes: HashMap<&LaneKey, i64> = HashMap::new();
    let mut tails: HashMap<i64, i64> = HashMap::new();
    let mut out = Vec::with_capacity(rows.len());
    // A row id must be new in `ol_units` (its unique index says so at the INSERT) and in
    // `ol_rows`. An actor without shared rows (no fan-out row, no dead letter: the common
    // case) cannot clash there, so one look per batch spares a probe per row. The write lock
    // is held: only this batch can add shared rows, and it notes when it does.
    let mut shared_rows: bool = c
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM ol_rows WHERE actor = ?1)")?
        .query_row([a], |r| r.get(0))?;
    // The hot statement, looked up in the statement cache once per batch, not once per row.
    let mut insert_inline: Option<rusqlite::CachedStatement<'_>> = None;
    for (k, p) in rows.iter().enumerate() {
        let seq = first + i64::try_from(k).unwrap_or(i64::MAX);
        let row = p.row;
        let mut kept = Vec::with_capacity(p.lanes.len());
        let mut skipped = Vec::new();
        for key in &p.lanes {
            let id = match lanes.get(key) {
                Some(id) => *id,
                None => {
                    let id = lane_id(c, a, key)?;
                    lanes.insert(key, id);
                    id
                }
            };
            if let Some(dk) = &row.dedup_key {
                if dedup_pending(c, a, dk, key.recipient())? {
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
            // Nothing is stored, but the id must still be one the actor does not have.
            let taken: bool = c
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM ol_units WHERE actor = ?1 AND row_id = ?2) \
                     OR EXISTS (SELECT 1 FROM ol_rows WHERE actor = ?1 AND row_id = ?2)",
                )?
                .query_row(params![a, row.id], |r| r.get(0))?;
            if taken {
                return Err(EnqueueError::DuplicateRowId {
                    row: row.id.clone(),
                });
            }
        } else if row.joined || kept.len() == 1 {
            // One unit: its head holds the payload. With shared rows about, the id check
            // against `ol_rows` rides in the INSERT (no row inserted = taken).
            let k = i64::try_from(kept.len()).unwrap_or(i64::MAX);
            let args = params![
                a,
                kept[0],
                seq,
                k,
                row.id,
                row.content_type,
                row.body,
                body_len,
                row.dedup_key,
                p.ordering_key,
                now,
                headers
            ];
            let inserted = if shared_rows {
                c.prepare_cached(
                    "INSERT INTO ol_units (actor, lane_id, seq, lanes, pending, row_id, content_type, body, \
                     body_len, dedup_key, ordering_key, enqueued_at, headers) \
                     SELECT ?1, ?2, ?3, ?4, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12 \
                     WHERE NOT EXISTS (SELECT 1 FROM ol_rows WHERE actor = ?1 AND row_id = ?5)",
                )?
                .execute(args)
            } else {
                let st = match &mut insert_inline {
                    Some(st) => st,
                    None => insert_inline.insert(c.prepare_cached(
                        "INSERT INTO ol_units (actor, lane_id, seq, lanes, pending, row_id, content_type, body, \
                         body_len, dedup_key, ordering_key, enqueued_at, headers) \
                         VALUES (?1, ?2, ?3, ?4, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                    )?),
                };
                st.execute(args)
            }
            .map_err(|e| dup_or(e, &row.id))?;
            if inserted == 0 {
                return Err(EnqueueError::DuplicateRowId {
                    row: row.id.clone(),
                });
            }
            let unit = c.last_insert_rowid();
            tails.insert(kept[0], seq);
            for &lane in &kept[1..] {
                c.prepare_cached(
                    "INSERT INTO ol_units (unit_id, actor, lane_id, seq) VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(params![unit, a, lane, seq])?;
                tails.insert(lane, seq);
            }
            units.push(UnitId(to_u64(unit)));
        } else {
            // k units sharing one payload: it goes once into `ol_rows`.
            let inserted = c
                .prepare_cached(
                    "INSERT INTO ol_rows (actor, row_id, seq, content_type, body, body_len, dedup_key, \
                     ordering_key, enqueued_at, headers) SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10 \
                     WHERE NOT EXISTS (SELECT 1 FROM ol_units WHERE actor = ?1 AND row_id = ?2)",
                )?
                .execute(params![
                    a,
                    row.id,
                    seq,
                    row.content_type,
                    row.body,
                    body_len,
                    row.dedup_key,
                    p.ordering_key,
                    now,
                    headers
                ])
                .map_err(|e| dup_or(e, &row.id))?;
            if inserted == 0 {
                return Err(EnqueueError::DuplicateRowId {
                    row: row.id.clone(),
                });
            }
            let row_ref = c.last_insert_rowid();
            shared_rows = true;
            for lane in kept {
                c.prepare_cached(
                    "INSERT INTO ol_units (actor, lane_id, seq, row_ref) VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(params![a, lane, seq, row_ref])?;
                units.push(UnitId(to_u64(c.last_insert_rowid())));
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
    // Once per lane: seqs grow through the batch, so the last one seen is the tail.
    for (lane, seq) in tails {
        c.prepare_cached("UPDATE ol_lanes SET tail_seq = max(tail_seq, ?2) WHERE id = ?1")?
            .execute(params![lane, seq])?;
    }
    Ok(out)
}

/// A payload from a row of (row id, content type, body, headers).
fn payload_of(r: &rusqlite::Row<'_>) -> Result<Payload, rusqlite::Error> {
    Ok(Payload {
        row_id: r.get(0)?,
        content_type: r.get(1)?,
        body: r.get(2)?,
        headers: decode_headers(r.get(3)?),
    })
}

impl Backend for SqliteStore {
    type Reader<'c> = SqliteDb<'c>;
    type Writer<'c> = SqliteDb<'c>;

    fn read<T>(
        &self,
        mut f: impl FnMut(&mut SqliteDb<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        SqliteStore::read(self, |tx| f(&mut SqliteDb(tx)))
    }

    fn write<T>(
        &self,
        _idempotent: bool,
        mut f: impl FnMut(&mut SqliteDb<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        SqliteStore::write(self, |tx| f(&mut SqliteDb(tx)))
    }

    fn common(&self) -> &CommonOptions {
        &self.opts.common
    }

    fn outbox_id(&self) -> &str {
        &self.outbox_id
    }

    fn notify(&self) {
        self.notifier.notify();
    }

    fn notify_others(&self, _: &mut SqliteDb<'_>, _: &[ActorId]) -> Result<(), StoreError> {
        // The other processes' watchers see every commit (`PRAGMA data_version`).
        Ok(())
    }

    fn enqueue_batch(
        &self,
        actor: &ActorId,
        rows: &[NewRow],
    ) -> Result<Vec<Enqueued>, EnqueueError> {
        let prepared = prepare(rows, &self.opts.common)?;
        if prepared.is_empty() {
            return Ok(Vec::new());
        }
        let out = {
            let mut conn = self.writer();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = enqueue_tx(&tx, actor, &prepared, &self.opts.common)?;
            tx.commit()?;
            out
        };
        self.notifier.notify();
        Ok(out)
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
        let holders = live.held();
        if holders.is_empty() {
            return;
        }
        let c = self.writer();
        for holder in holders {
            let holds = c
                .prepare_cached(&format!(
                    "SELECT EXISTS (SELECT 1 FROM ol_slots WHERE holder = ?1 AND lease_expires > {NOW})"
                ))
                .and_then(|mut s| s.query_row([&holder], |r| r.get::<_, bool>(0)));
            if !matches!(holds, Ok(false)) {
                tracing::debug!(holder = %holder,
                    "drain slots still held at close: the lock file stays, unlocked, so other relays take them over at once");
                live.leave_unlocked(&holder);
            }
        }
    }
}

impl HotPath for SqliteStore {
    fn check_file(&self) -> Result<(), StoreError> {
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

    fn register_holder(&self, holder: &str) {
        if let Some(l) = &self.liveness {
            l.register(holder);
        }
    }

    fn expire_dead_holders(
        &self,
        db: &mut SqliteDb<'_>,
        us: &str,
        actor: Option<&ActorId>,
    ) -> Result<(), StoreError> {
        SqliteStore::expire_dead_holders(self, db.0, us, actor)
    }

    fn find_lanes_with_work(
        &self,
        token: &SlotToken,
        since: u64,
    ) -> Result<(Vec<PendingLane>, u64), StoreError> {
        self.read(|c| {
            slots::fence(&mut SqliteDb(c), token)?;
            let mut mark = since;
            let mut st = c.prepare_cached(
                "SELECT l.id, l.recipient, l.ordering_key, l.not_before, l.backoff_level, l.strict, l.paused, l.tail_seq \
                 FROM ol_lanes l WHERE l.actor = ?1 AND l.tail_seq > ?2 \
                 AND EXISTS (SELECT 1 FROM ol_units d WHERE d.lane_id = l.id) ORDER BY l.id",
            )?;
            let rows = st.query_map(params![token.actor().as_str(), to_i64(since)], |r| {
                Ok((
                    PendingLane {
                        lane: StoreLaneId(r.get(0)?),
                        key: key_of(r.get(1)?, r.get(2)?),
                        not_before: r.get::<_, Option<i64>>(3)?.map(timestamp_of),
                        backoff_level: to_u32(r.get(4)?),
                        strict: r.get(5)?,
                        paused: r.get(6)?,
                    },
                    to_u64(r.get(7)?),
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (info, tail) = row?;
                mark = mark.max(tail);
                out.push(info);
            }
            Ok((out, mark))
        })
    }

    fn claim_units(
        &self,
        token: &SlotToken,
        lanes: &[ClaimRange],
    ) -> Result<Vec<ClaimedLane>, StoreError> {
        self.read(|c| {
            slots::fence(&mut SqliteDb(c), token)?;
            let actor = token.actor().as_str();
            let mut out = Vec::with_capacity(lanes.len());
            for req in lanes {
                let lane: Option<(String, String, bool)> = c
                    .prepare_cached("SELECT recipient, ordering_key, paused FROM ol_lanes WHERE id = ?1 AND actor = ?2")?
                    .query_row(params![req.lane.0, actor], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()?;
                let Some((recipient, ok, paused)) = lane else {
                    out.push(ClaimedLane { lane: req.lane, units: Vec::new(), exhausted: true });
                    continue;
                };
                if paused || req.limit == 0 {
                    out.push(ClaimedLane { lane: req.lane, units: Vec::new(), exhausted: paused });
                    continue;
                }
                let key = key_of(recipient, ok);
                // `d` is the lane's row. On a unit's head (every one-lane unit, the hot path)
                // it holds everything, its payload's size and time inline or in `r`; a joined
                // unit's other lanes read their head separately below.
                // `LIMIT +?3`, not `LIMIT ?3`: SQLite plans with a bare bound LIMIT's value and
                // so re-prepares the statement on every new value (over half a claim's time);
                // the unary plus keeps the cached plan.
                // A one-lane unit's payload (content type and body) comes with it: the pass
                // keeps it for its attempts instead of reading it again per attempt.
                let mut st = c.prepare_cached(
                    "SELECT d.id, d.unit_id, d.seq, d.attempts, d.state, coalesce(d.row_id, r.row_id), \
                     coalesce(d.body_len, r.body_len), coalesce(d.enqueued_at, r.enqueued_at), d.lanes, \
                     CASE WHEN d.lanes = 1 THEN coalesce(d.content_type, r.content_type) END, \
                     CASE WHEN d.lanes = 1 THEN CASE WHEN d.row_ref IS NULL THEN d.body ELSE r.body END END, \
                     CASE WHEN d.lanes = 1 THEN CASE WHEN d.row_ref IS NULL THEN d.headers ELSE r.headers END END \
                     FROM ol_units d LEFT JOIN ol_rows r ON r.id = d.row_ref \
                     WHERE d.lane_id = ?1 AND d.seq >= ?2 ORDER BY d.seq, d.id LIMIT +?3",
                )?;
                // (row id, payload size, enqueued at, lanes) of a unit.
                type UnitInfo = (Option<String>, Option<i64>, Option<i64>, i64);
                type Row = (
                    (i64, Option<i64>, i64, i64, i64),
                    (Option<String>, Option<i64>, Option<i64>, i64),
                    (Option<String>, Option<Vec<u8>>, Option<String>),
                );
                let rows: Vec<Row> = st
                    .query_map(params![req.lane.0, to_i64(req.from.0), i64::from(req.limit)], |r| {
                        Ok((
                            (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?),
                            (r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?),
                            (r.get(9)?, r.get(10)?, r.get(11)?),
                        ))
                    })?
                    .collect::<Result<_, _>>()?;
                let exhausted = rows.len() < req.limit as usize;
                let mut units = Vec::with_capacity(rows.len());
                for ((id, head, seq, attempts, state), (row_id, len, at, nlanes), body) in rows {
                    let (unit, row_id, len, at, nlanes) = match head {
                        None => (id, row_id, len, at, nlanes),
                        Some(h) => {
                            let found: Option<UnitInfo> = c
                                .prepare_cached(
                                    "SELECT coalesce(h.row_id, r.row_id), coalesce(h.body_len, r.body_len), \
                                     coalesce(h.enqueued_at, r.enqueued_at), h.lanes \
                                     FROM ol_units h LEFT JOIN ol_rows r ON r.id = h.row_ref WHERE h.id = ?1",
                                )?
                                .query_row([h], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                                .optional()?;
                            // The store deletes a unit's other lanes before its head: none is
                            // headless. One written so by hand is not a unit to deliver.
                            let Some((row_id, len, at, nlanes)) = found else { continue };
                            (h, row_id, len, at, nlanes)
                        }
                    };
                    let (row_id, len, at) = (row_id.unwrap_or_default(), len.unwrap_or(0), at.unwrap_or(0));
                    let payload = match (head, body) {
                        (None, (Some(content_type), Some(body), headers)) if nlanes <= 1 => Some(Payload {
                            row_id: row_id.clone(),
                            content_type,
                            body,
                            headers: decode_headers(headers),
                        }),
                        _ => None,
                    };
                    let slots = if nlanes <= 1 {
                        vec![ClaimedSlot {
                            lane: req.lane,
                            key: key.clone(),
                            attempts: to_u32(attempts),
                            served: state != STATE_PENDING,
                        }]
                    } else {
                        c.prepare_cached(
                            "SELECT d.lane_id, l.recipient, l.ordering_key, d.attempts, d.state \
                             FROM ol_units d JOIN ol_lanes l ON l.id = d.lane_id \
                             WHERE d.id = ?1 AND d.unit_id IS NULL OR d.unit_id = ?1 ORDER BY d.lane_id",
                        )?
                        .query_map([unit], |r| {
                            Ok(ClaimedSlot {
                                lane: StoreLaneId(r.get(0)?),
                                key: key_of(r.get(1)?, r.get(2)?),
                                attempts: to_u32(r.get(3)?),
                                served: r.get::<_, i64>(4)? != STATE_PENDING,
                            })
                        })?
                        .collect::<Result<_, _>>()?
                    };
                    units.push(ClaimedUnit {
                        id: UnitId(to_u64(unit)),
                        seq: Seq(to_u64(seq)),
                        row_id,
                        bytes: to_u32(len),
                        enqueued_at: timestamp_of(at),
                        slots,
                        payload,
                    });
                }
                out.push(ClaimedLane { lane: req.lane, units, exhausted });
            }
            Ok(out)
        })
    }

    fn read_payload(&self, unit: UnitId) -> Result<Payload, StoreError> {
        self.read(|c| read_payload(c, unit))
    }

    fn read_payloads(&self, units: &[UnitId]) -> Vec<Result<Payload, StoreError>> {
        // One snapshot and one statement for the round's starts.
        let mut out = Vec::with_capacity(units.len());
        let all = self.read(|c| {
            for u in units {
                out.push(read_payload(c, *u));
            }
            Ok(())
        });
        match all {
            Ok(()) => out,
            Err(e) => units.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    fn ack_units(
        &self,
        token: &SlotToken,
        delivered: &[(UnitId, StoreLaneId)],
    ) -> Result<(), StoreError> {
        let retention = self.opts.common.ack_retention.is_some();
        self.write(|c| {
            slots::fence(&mut SqliteDb(c), token)?;
            let actor = token.actor().as_str();
            // A unit with one lane (the common case) is finished by its ack: its one row goes
            // (with its payload, when inline) in one plain DELETE; with the retention, the head
            // stays, out of every lane. (A RETURNING clause would cost SQLite a temporary
            // result table on every ack: a shared payload takes its own statement below.)
            let mut single = if retention {
                c.prepare_cached(&format!(
                    "UPDATE ol_units SET state = {STATE_SERVED}, pending = 0, acked_at = {NOW}, lane_id = NULL \
                     WHERE id = ?1 AND unit_id IS NULL AND lane_id = ?2 AND state = 0 AND lanes = 1 AND actor = ?3"
                ))?
            } else {
                c.prepare_cached(
                    "DELETE FROM ol_units WHERE id = ?1 AND unit_id IS NULL AND lane_id = ?2 AND state = 0 \
                     AND lanes = 1 AND actor = ?3 AND row_ref IS NULL",
                )?
            };
            let mut shared = c.prepare_cached(
                "DELETE FROM ol_units WHERE id = ?1 AND unit_id IS NULL AND lane_id = ?2 AND state = 0 \
                 AND lanes = 1 AND actor = ?3 AND row_ref IS NOT NULL RETURNING row_ref",
            )?;
            // Rows fanned out to many recipients keep their payload in `ol_rows`, and a batch
            // tends to hold units of one kind: the statement that matched last is tried first.
            let mut shared_first = false;
            // Shared payloads whose units were acked: each goes with its last unit, checked
            // once per batch, not once per ack.
            let mut rows: Vec<i64> = Vec::new();
            for (unit, lane) in delivered {
                let unit = to_i64(unit.0);
                let p = params![unit, lane.0, actor];
                let mut done = false;
                for try_shared in [shared_first, !shared_first] {
                    if try_shared && retention {
                        continue;
                    }
                    done = if try_shared {
                        let gone: Option<i64> = shared.query_row(p, |r| r.get(0)).optional()?;
                        gone.map(|row_ref| rows.push(row_ref)).is_some()
                    } else {
                        single.execute(p)? == 1
                    };
                    if done {
                        shared_first = try_shared;
                        break;
                    }
                }
                if done {
                    continue;
                }
                // A joined unit: this lane is served; the unit finishes with its last lane.
                let n = c
                    .prepare_cached(&format!(
                        "UPDATE ol_units AS d SET state = {STATE_SERVED} WHERE {UNIT_LANE} AND d.state = 0 AND d.actor = ?3"
                    ))?
                    .execute(p)?;
                if n == 1 {
                    units::settle(&mut SqliteDb(c), unit, retention)?;
                } else {
                    // Not pending: set aside by an operator while the attempt was in flight
                    // (OL-14), or an ack sent again.
                    dead_letters::delivered_on_set_aside(&mut SqliteDb(c), actor, unit, *lane)?;
                }
            }
            rows.sort_unstable();
            rows.dedup();
            for row_ref in rows {
                units::drop_row_if_unused(&mut SqliteDb(c), row_ref)?;
            }
            Ok(())
        })
    }

    fn write_attempts(
        &self,
        token: &SlotToken,
        attempts: &[AttemptRecord],
    ) -> Result<(), StoreError> {
        self.write(|c| {
            slots::fence(&mut SqliteDb(c), token)?;
            let actor = token.actor().as_str();
            for a in attempts {
                let status = a.status.map(i64::from);
                let n = c
                    .prepare_cached(
                        &format!("UPDATE ol_units AS d SET attempts = ?3, last_status = ?4, last_error = ?5, \
                         first_attempt_at = coalesce(first_attempt_at, ?6), last_attempt_at = ?6 \
                         WHERE {UNIT_LANE} AND d.state = 0 AND d.actor = ?7"),
                    )?
                    .execute(params![to_i64(a.unit.0), a.lane.0, i64::from(a.attempts), status, a.error, millis_of(a.at), actor])?;
                if n == 1 {
                    c.prepare_cached("UPDATE ol_lanes SET last_status = ?2, last_error = ?3 WHERE id = ?1")?
                        .execute(params![a.lane.0, status, a.error])?;
                } else {
                    // Set aside by an operator while the attempt was in flight (OL-14).
                    dead_letters::record_on_set_aside(&mut SqliteDb(c), actor, a)?;
                }
            }
            Ok(())
        })
    }

    fn wake_ups(&self) -> Notifier {
        self.notifier.clone()
    }

    fn start_watch(&self) -> Result<Notifier, StoreError> {
        let Some(path) = &self.path else {
            // Nothing outside this process can reach a private in-memory database.
            return Ok(self.notifier.clone());
        };
        let mut w = self.watcher.lock().unwrap_or_else(PoisonError::into_inner);
        if w.is_none() {
            let conn = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(|e| open_err(&path.display().to_string(), e))?;
            conn.busy_timeout(self.opts.busy_timeout)?;
            let notifier = self.notifier.clone();
            let every = self.opts.watch_interval;
            *w = Some(WatcherThread::spawn(
                "outbox-lanes-sqlite-watch",
                move |stop| watch_loop(&conn, stop, &notifier, every),
            )?);
        }
        Ok(self.notifier.clone())
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

/// One unit's payload, inline or from its shared row.
fn read_payload(c: &Transaction<'_>, unit: UnitId) -> Result<Payload, StoreError> {
    c.prepare_cached(
        "SELECT coalesce(h.row_id, r.row_id), coalesce(h.content_type, r.content_type), \
         CASE WHEN h.row_ref IS NULL THEN h.body ELSE r.body END, \
         CASE WHEN h.row_ref IS NULL THEN h.headers ELSE r.headers END \
         FROM ol_units h LEFT JOIN ol_rows r ON r.id = h.row_ref \
         WHERE h.id = ?1 AND h.unit_id IS NULL AND h.acked_at IS NULL",
    )?
    .query_row([to_i64(unit.0)], payload_of)
    .optional()?
    .ok_or(StoreError::NotFound { what: "unit" })
}
