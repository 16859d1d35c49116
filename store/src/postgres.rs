//! The Postgres store: several relay processes (on several machines) sharing one database.
//!
//! # Keep it off the async executor
//!
//! The `postgres` crate is a blocking wrapper that owns a tokio runtime per connection. Every
//! call into a [`PgStore`] — and its drop, which closes connections — must run on a plain
//! thread (an async runtime calls it through `spawn_blocking`), never on an executor thread:
//! blocking there panics or stalls the executor.
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
//!   values), `dead_letter` (a delivery no longer pending is left alone), lane state writes,
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
//! coalesced by the server per transaction); [`DriverStore::watch`] LISTENs on its own connection.
//!
//! # TLS and errors
//!
//! Connections honour libpq's `sslmode` and `sslrootcert` (see [`SslMode`](crate::SslMode));
//! `sslmode=disable` connects exactly as a plain client. A failure keeps the driver's
//! `postgres::Error` as its `source()`, and its message carries what the server said (message,
//! SQLSTATE, detail, hint) in one line.
//!
//! Each store lives in one schema ([`PgOptions::schema`]), created if missing, with the tables
//! of `SCHEMA.md` (schema version 2: a one-recipient unit is one `ol_units` row holding its
//! payload); a version 1 schema is migrated when a store connects.

use core::time::Duration;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use core::sync::atomic::{AtomicBool, Ordering};

pub use postgres;
use postgres::error::SqlState;
use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use postgres::{Client, Config, Row, Statement, Transaction};

use outbox_lanes_core::{ActorId, DeadReason, LaneKey, Seq, Timestamp, UnitId};

use crate::backend::Backend;
use crate::db::{Db, Dialect, Get, Sql, Value};
use crate::notify::{Notifier, PendingWake};
use crate::prepare::{PreparedRow, prepare};
use crate::tls::{ConfigError, Connector};
use crate::types::*;
use crate::util::{
    decode_headers, encode_headers, key_of, millis_of, timestamp_of, to_i64, to_u32, to_u64,
};
use crate::{DriverStore, EnqueueError, SCHEMA_VERSION, StoreError};
use crate::{dead_letters, lanes, slots, status, units};

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

/// The server's clock in milliseconds (not the transaction start: a long transaction must not
/// see a lease as live after it expired).
const NOW: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// The tables both schema versions share (everything but the units).
macro_rules! shared_tables_a {
    () => {
        "
CREATE TABLE ol_actors (
    actor     TEXT PRIMARY KEY,
    last_seq  BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE ol_rows (
    id            BIGSERIAL PRIMARY KEY,
    actor         TEXT NOT NULL,
    row_id        TEXT NOT NULL,
    seq           BIGINT NOT NULL,
    content_type  TEXT NOT NULL,
    body          BYTEA NOT NULL,
    body_len      BIGINT NOT NULL,
    dedup_key     TEXT,
    ordering_key  TEXT NOT NULL DEFAULT '',
    enqueued_at   BIGINT NOT NULL,
    UNIQUE (actor, row_id)
);
CREATE INDEX ol_rows_dedup ON ol_rows (actor, dedup_key) WHERE dedup_key IS NOT NULL;
CREATE TABLE ol_lanes (
    id             BIGSERIAL PRIMARY KEY,
    actor          TEXT NOT NULL,
    recipient      TEXT NOT NULL,
    ordering_key   TEXT NOT NULL DEFAULT '',
    not_before     BIGINT,
    backoff_level  BIGINT NOT NULL DEFAULT 0,
    strict         BOOLEAN NOT NULL DEFAULT FALSE,
    paused         BOOLEAN NOT NULL DEFAULT FALSE,
    pause_reason   TEXT,
    last_status    BIGINT,
    last_error     TEXT,
    tail_seq       BIGINT NOT NULL DEFAULT 0,
    UNIQUE (actor, recipient, ordering_key)
);
CREATE INDEX ol_lanes_tail ON ol_lanes (actor, tail_seq);
"
    };
}

/// The tables both schema versions share, after the units.
macro_rules! shared_tables_b {
    () => {
        "
CREATE TABLE ol_dead_letters (
    id                BIGSERIAL PRIMARY KEY,
    unit_id           BIGINT NOT NULL,
    row_ref           BIGINT NOT NULL,
    row_id            TEXT NOT NULL,
    actor             TEXT NOT NULL,
    lane_id           BIGINT NOT NULL,
    recipient         TEXT NOT NULL,
    ordering_key      TEXT NOT NULL,
    reason            TEXT NOT NULL,
    last_status       BIGINT,
    last_error        TEXT,
    attempts          BIGINT NOT NULL,
    first_attempt_at  BIGINT,
    last_attempt_at   BIGINT,
    seq               BIGINT NOT NULL,
    dead_at           BIGINT NOT NULL
);
CREATE INDEX ol_dead_letters_actor ON ol_dead_letters (actor, seq);
CREATE INDEX ol_dead_letters_row ON ol_dead_letters (row_ref);
CREATE TABLE ol_slots (
    actor          TEXT PRIMARY KEY,
    token          BIGINT NOT NULL DEFAULT 0,
    holder         TEXT,
    lease_expires  BIGINT NOT NULL DEFAULT 0,
    look_again     BOOLEAN NOT NULL DEFAULT FALSE
);
"
    };
}

/// Version 2's `ol_units` (SCHEMA.md) with its indexes; `$id` is the id column's type: a fresh
/// database gets `BIGSERIAL`, the migration keeps version 1's sequence.
macro_rules! units_v2 {
    ($id:literal) => {
        concat!(
            "
CREATE TABLE ol_units (
    id                ",
            $id,
            ",
    unit_id           BIGINT,
    actor             TEXT NOT NULL,
    lane_id           BIGINT,
    seq               BIGINT NOT NULL,
    state             BIGINT NOT NULL DEFAULT 0,
    attempts          BIGINT NOT NULL DEFAULT 0,
    last_status       BIGINT,
    last_error        TEXT,
    first_attempt_at  BIGINT,
    last_attempt_at   BIGINT,
    lanes             BIGINT NOT NULL DEFAULT 1,
    pending           BIGINT NOT NULL DEFAULT 1,
    acked_at          BIGINT,
    row_ref           BIGINT,
    row_id            TEXT,
    content_type      TEXT,
    body              BYTEA,
    body_len          BIGINT,
    dedup_key         TEXT,
    ordering_key      TEXT,
    enqueued_at       BIGINT
);
CREATE INDEX ol_units_lane ON ol_units (lane_id, seq, id) WHERE lane_id IS NOT NULL;
CREATE UNIQUE INDEX ol_units_row_id ON ol_units (actor, row_id) WHERE row_id IS NOT NULL;
CREATE INDEX ol_units_unit ON ol_units (unit_id) WHERE unit_id IS NOT NULL;
CREATE INDEX ol_units_row ON ol_units (row_ref) WHERE row_ref IS NOT NULL;
CREATE INDEX ol_units_dedup ON ol_units (actor, dedup_key) WHERE dedup_key IS NOT NULL;
CREATE INDEX ol_units_acked ON ol_units (acked_at) WHERE acked_at IS NOT NULL;
CREATE INDEX ol_units_settled ON ol_units (lane_id) WHERE state <> 0 AND lane_id IS NOT NULL;
"
        )
    };
}

/// Schema version 1 (units in three tables: `ol_rows`, `ol_units`, `ol_deliveries`). Only read
/// by the migration to version 2; public for the migration test, which builds a version 1
/// database.
#[doc(hidden)]
pub const SCHEMA_V1: &str = concat!(
    shared_tables_a!(),
    "CREATE TABLE ol_units (
    id        BIGSERIAL PRIMARY KEY,
    actor     TEXT NOT NULL,
    row_ref   BIGINT NOT NULL,
    seq       BIGINT NOT NULL,
    lanes     BIGINT NOT NULL,
    pending   BIGINT NOT NULL,
    acked_at  BIGINT
);
CREATE INDEX ol_units_row ON ol_units (row_ref);
CREATE INDEX ol_units_acked ON ol_units (acked_at) WHERE acked_at IS NOT NULL;
CREATE TABLE ol_deliveries (
    unit_id           BIGINT NOT NULL,
    lane_id           BIGINT NOT NULL,
    seq               BIGINT NOT NULL,
    state             BIGINT NOT NULL DEFAULT 0,
    attempts          BIGINT NOT NULL DEFAULT 0,
    last_status       BIGINT,
    last_error        TEXT,
    first_attempt_at  BIGINT,
    last_attempt_at   BIGINT,
    PRIMARY KEY (unit_id, lane_id)
);
CREATE INDEX ol_deliveries_lane ON ol_deliveries (lane_id, seq, unit_id);
",
    shared_tables_b!()
);

/// Schema version 2 (SCHEMA.md): a one-recipient unit is one `ol_units` row.
#[doc(hidden)]
pub const SCHEMA_V2: &str = concat!(
    shared_tables_a!(),
    units_v2!("BIGSERIAL PRIMARY KEY"),
    shared_tables_b!()
);

/// Version 1 to 2, in the opening transaction (SCHEMA.md "Migrations"). Each version 1 unit
/// becomes its head row for its lowest lane (a unit kept by the ack retention has no delivery:
/// no lane, served); its other deliveries become rows of their own with fresh ids. The payload
/// stays in `ol_rows` (`row_ref`). The id sequence is detached before the old table goes and
/// reused by the new one, so no unit id is ever handed out twice; index names are per schema,
/// so the old table goes before the new one is created.
const MIGRATE_V1_TO_V2: &str = concat!(
    // First: wait for every transaction still writing the version 1 tables (a relay of the
    // previous version acking, dead-lettering…) and keep new ones out until the commit, so
    // the copy below (its own statement, its own snapshot) misses no write and none lands in
    // a table about to be dropped. Such a relay fails on its next statement afterwards.
    "
LOCK TABLE ol_actors, ol_rows, ol_lanes, ol_units, ol_deliveries, ol_dead_letters, ol_slots
    IN ACCESS EXCLUSIVE MODE;
ALTER SEQUENCE ol_units_id_seq OWNED BY NONE;
CREATE TEMP TABLE ol_migrate_units ON COMMIT DROP AS
    SELECT u.id, NULL::bigint AS unit_id, u.actor, d.lane_id, coalesce(d.seq, u.seq) AS seq,
        coalesce(d.state, 1) AS state, coalesce(d.attempts, 0) AS attempts, d.last_status,
        d.last_error, d.first_attempt_at, d.last_attempt_at, u.lanes, u.pending, u.acked_at,
        u.row_ref
    FROM ol_units u LEFT JOIN LATERAL (SELECT * FROM ol_deliveries x WHERE x.unit_id = u.id
        ORDER BY x.lane_id LIMIT 1) d ON TRUE
    UNION ALL
    SELECT nextval('ol_units_id_seq'), o.unit_id, o.actor, o.lane_id, o.seq, o.state, o.attempts,
        o.last_status, o.last_error, o.first_attempt_at, o.last_attempt_at, 1, 1, NULL, NULL
    FROM (SELECT d.*, u.actor FROM ol_deliveries d JOIN ol_units u ON u.id = d.unit_id
        WHERE d.lane_id > (SELECT min(x.lane_id) FROM ol_deliveries x WHERE x.unit_id = d.unit_id)
        ORDER BY d.unit_id, d.lane_id) o;
DROP TABLE ol_deliveries;
DROP TABLE ol_units;
",
    units_v2!("BIGINT NOT NULL DEFAULT nextval('ol_units_id_seq') PRIMARY KEY"),
    "
ALTER SEQUENCE ol_units_id_seq OWNED BY ol_units.id;
INSERT INTO ol_units (id, unit_id, actor, lane_id, seq, state, attempts, last_status, last_error,
        first_attempt_at, last_attempt_at, lanes, pending, acked_at, row_ref)
    SELECT * FROM pg_temp.ol_migrate_units ORDER BY id;
SELECT setval('ol_units_id_seq', m) FROM (SELECT max(id) AS m FROM ol_units) x
    WHERE m > (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM ol_units_id_seq);
DROP TABLE pg_temp.ol_migrate_units;
UPDATE ol_meta SET value = '2' WHERE key = 'schema_version';
"
);

/// Version 2 to 3 (SCHEMA.md "Migrations"): the rows' own request headers, `NULL` for a row
/// without. A nullable column without a default is added without rewriting any row; the
/// statement takes its table's lock only for that moment. Relays of version 2 keep working
/// against version 3 (they name their columns), without headers.
const MIGRATE_V2_TO_V3: &str = "ALTER TABLE ol_units ADD COLUMN headers TEXT; \
     ALTER TABLE ol_rows ADD COLUMN headers TEXT; \
     UPDATE ol_meta SET value = '3' WHERE key = 'schema_version';";

const STATE_PENDING: i64 = 0;

/// The id of unit `$1`'s row in lane `$2` (its head, or another lane's row of a joined unit)
/// as an array for `id = ANY(…)`: two index probes, where an `OR` of the two would scan.
const ROW_OF_UNIT_IN_LANE: &str = "ARRAY(SELECT x.id FROM ol_units x WHERE x.id = $1 AND x.unit_id IS NULL \
     AND x.lane_id = $2 UNION ALL SELECT x.id FROM ol_units x WHERE x.unit_id = $1 AND x.lane_id = $2)";

type PgParam<'a> = &'a (dyn ToSql + Sync);

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
    match e.code() {
        Some(c)
            if *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || c.code().starts_with("08") =>
        {
            StoreError::connection_lost(pg_text(&e), e)
        }
        // Aborted by the server to break a deadlock or a serialization conflict: nothing was
        // written and a retry can succeed.
        Some(c)
            if *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::T_R_DEADLOCK_DETECTED
                || *c == SqlState::LOCK_NOT_AVAILABLE =>
        {
            StoreError::Busy
        }
        Some(c) if *c == SqlState::READ_ONLY_SQL_TRANSACTION => StoreError::ReadOnly {
            path: "(postgres)".into(),
        },
        Some(_) => StoreError::driver(pg_text(&e), e),
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

impl From<postgres::Error> for EnqueueError {
    fn from(e: postgres::Error) -> Self {
        EnqueueError::Store(pg_err(e))
    }
}

/// Runs SQL on a transaction, with or without the statement cache.
trait PgExec {
    fn query_rows(&mut self, sql: &str, p: &[PgParam<'_>]) -> Result<Vec<Row>, postgres::Error>;
    fn execute_sql(&mut self, sql: &str, p: &[PgParam<'_>]) -> Result<u64, postgres::Error>;
    fn query_opt_row(
        &mut self,
        sql: &str,
        p: &[PgParam<'_>],
    ) -> Result<Option<Row>, postgres::Error> {
        Ok(self.query_rows(sql, p)?.into_iter().next())
    }
    fn query_one_row(&mut self, sql: &str, p: &[PgParam<'_>]) -> Result<Row, StoreError> {
        // Every caller's SQL returns one row (an aggregate, or RETURNING of a row the same
        // transaction just wrote or locked); none means the tables were edited by hand.
        self.query_rows(sql, p)?
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::Database(format!("no row returned by: {sql}")))
    }
}

impl PgExec for Transaction<'_> {
    fn query_rows(&mut self, sql: &str, p: &[PgParam<'_>]) -> Result<Vec<Row>, postgres::Error> {
        self.query(sql, p)
    }
    fn execute_sql(&mut self, sql: &str, p: &[PgParam<'_>]) -> Result<u64, postgres::Error> {
        self.execute(sql, p)
    }
}

pub(crate) struct PgTx<'a> {
    tx: Transaction<'a>,
    cache: &'a mut HashMap<String, Statement>,
}

impl PgTx<'_> {
    fn st(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.cache.get(sql) {
            return Ok(s.clone());
        }
        let s = self.tx.prepare(sql)?;
        self.cache.insert(sql.to_string(), s.clone());
        Ok(s)
    }
}

impl PgExec for PgTx<'_> {
    fn query_rows(&mut self, sql: &str, p: &[PgParam<'_>]) -> Result<Vec<Row>, postgres::Error> {
        let st = self.st(sql)?;
        self.tx.query(&st, p)
    }
    fn execute_sql(&mut self, sql: &str, p: &[PgParam<'_>]) -> Result<u64, postgres::Error> {
        let st = self.st(sql)?;
        self.tx.execute(&st, p)
    }
}

/// Every runner of SQL on Postgres is a [`Db`] of the shared statement layer.
impl<E: PgExec> Db for E {
    const DIALECT: Dialect = Dialect::Postgres;

    fn execute(&mut self, sql: &Sql, args: &[Value<'_>]) -> Result<u64, StoreError> {
        let params: Vec<PgParam<'_>> = args.iter().map(|v| v as PgParam<'_>).collect();
        Ok(self.execute_sql(sql.text(Dialect::Postgres), &params)?)
    }

    fn query<T>(
        &mut self,
        sql: &Sql,
        args: &[Value<'_>],
        mut map: impl FnMut(&dyn Get) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let params: Vec<PgParam<'_>> = args.iter().map(|v| v as PgParam<'_>).collect();
        let rows = self.query_rows(sql.text(Dialect::Postgres), &params)?;
        rows.iter().map(|r| map(r)).collect()
    }
}

/// A connection used outside a transaction (reads), with its statement cache.
pub(crate) struct PgConn<'a> {
    client: &'a mut Client,
    cache: &'a mut HashMap<String, Statement>,
}

impl PgExec for PgConn<'_> {
    fn query_rows(&mut self, sql: &str, p: &[PgParam<'_>]) -> Result<Vec<Row>, postgres::Error> {
        let st = match self.cache.get(sql) {
            Some(s) => s.clone(),
            None => {
                let s = self.client.prepare(sql)?;
                self.cache.insert(sql.to_string(), s.clone());
                s
            }
        };
        self.client.query(&st, p)
    }
    fn execute_sql(&mut self, sql: &str, p: &[PgParam<'_>]) -> Result<u64, postgres::Error> {
        let st = match self.cache.get(sql) {
            Some(s) => s.clone(),
            None => {
                let s = self.client.prepare(sql)?;
                self.cache.insert(sql.to_string(), s.clone());
                s
            }
        };
        self.client.execute(&st, p)
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

struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
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
    notifier: Notifier,
    channel: String,
    watcher: Mutex<Option<Watcher>>,
    /// One session per holder of this store, holding the holder's advisory lock for the
    /// store's life: see [`PgStore::register_holder`].
    live: Mutex<HashMap<String, postgres::Client>>,
}

/// The first key of the holders' advisory locks (`'ol'`); the second is a hash of the schema
/// and the holder name.
const LIVE_LOCK: i32 = 0x6f6c;

impl core::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PgStore")
            .field("target", &self.target)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

/// `url` without its password (for error messages), once `opts` names a valid schema.
pub(crate) fn checked_target(url: &str, opts: &PgOptions) -> Result<String, StoreError> {
    let target = redact(url);
    if !valid_schema(&opts.schema) {
        return Err(StoreError::Open {
            target,
            reason: format!(
                "invalid schema name {:?} (use lower-case letters, digits, _)",
                opts.schema
            ),
            cause: None,
        });
    }
    Ok(target)
}

/// The driver's configuration and the connector for `url`: `sslmode` and `sslrootcert` are
/// handled by [`crate::tls`], the rest by the `postgres` crate.
pub(crate) fn parse_url(
    url: &str,
    target: &str,
    opts: &PgOptions,
) -> Result<(Config, Connector), StoreError> {
    Connector::new(url, opts.ssl_root_cert.as_deref()).map_err(|e| match e {
        ConfigError::Driver(e) => StoreError::open(target, pg_text(&e), e),
        ConfigError::Message(reason) => StoreError::Open {
            target: target.to_owned(),
            reason,
            cause: None,
        },
    })
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

fn valid_schema(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 48
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !s.as_bytes()[0].is_ascii_digit()
}

/// Errors that can tell "the connection was lost".
trait Lost {
    fn lost(&self) -> bool;
}

impl Lost for StoreError {
    fn lost(&self) -> bool {
        matches!(self, StoreError::ConnectionLost { .. })
    }
}

impl Lost for EnqueueError {
    fn lost(&self) -> bool {
        matches!(self, EnqueueError::Store(StoreError::ConnectionLost { .. }))
    }
}

impl PgStore {
    /// Connects to `url` (a `postgres://` URL or key=value string), creating the schema and
    /// tables if missing.
    ///
    /// # Errors
    /// [`StoreError::Open`] if the URL is malformed, the server unreachable or the schema name
    /// invalid; [`StoreError::SchemaTooNew`] for a database from a newer version.
    pub fn connect(url: &str, opts: PgOptions) -> Result<PgStore, StoreError> {
        let target = checked_target(url, &opts)?;
        let (mut config, tls) = parse_url(url, &target, &opts)?;
        config.application_name(&opts.application_name);
        config.connect_timeout(opts.connect_timeout);
        let store = PgStore {
            channel: format!("outbox_lanes_{}", opts.schema),
            config,
            tls,
            target,
            pool: Mutex::new(Pool {
                idle: Vec::new(),
                open: 0,
            }),
            freed: Condvar::new(),
            notifier: Notifier::new(),
            watcher: Mutex::new(None),
            live: Mutex::new(HashMap::new()),
            opts,
        };
        let mut conn = store.new_conn(true)?;
        store.init_schema(&mut conn)?;
        store.lock_pool().open += 1;
        store.checkin(conn);
        Ok(store)
    }

    fn new_conn(&self, first: bool) -> Result<Conn, StoreError> {
        let mut client = self.tls.connect(&self.config).map_err(|e| {
            if first {
                StoreError::open(self.target.clone(), pg_text(&e), e)
            } else {
                StoreError::connection_lost(pg_text(&e), e)
            }
        })?;
        if first {
            client
                .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {}", self.opts.schema))
                .or_else(|e| {
                    // Two stores creating the schema at once: the loser sees a unique violation.
                    if e.code() == Some(&SqlState::UNIQUE_VIOLATION) {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })?;
        }
        // Queue tables churn faster than their statistics follow: a plan made while a table
        // looked empty would scan it whole once it is deep (a hash join reading every row id of
        // the actor to check a batch of 100, say). Every statement of the store has an ordered
        // index path, so its own connections plan no sequential or bitmap scans and join by
        // index probes only (claims must cost what they return, never a lane's depth, whatever
        // the statistics say). Prepared statements always run their generic plan: the server
        // otherwise re-plans some of them at every execution (the enqueue's plan statement took
        // 0.4 ms for one row that way), and with these settings no plan depends on the values.
        // The hot statements go further and are written so that no plan can read a table
        // whole: a lookup driven by another row is a `LATERAL (… LIMIT n)`, an `EXISTS (…
        // OFFSET 0)` (OFFSET keeps it a per-row subplan instead of a join) or an `id =
        // ANY(ARRAY(…))`, each an index probe whatever the statistics.
        // No JIT either: a plan that must pay a disabled plan type's cost penalty looks
        // expensive enough to be compiled, which took 112 ms on a 100-row table (the
        // liveness check, before its index) — on every execution.
        client.batch_execute(&format!(
            "SET search_path TO {}; SET enable_seqscan = off; SET enable_bitmapscan = off; \
             SET enable_hashjoin = off; SET enable_mergejoin = off; SET plan_cache_mode = force_generic_plan; \
             SET jit = off",
            self.opts.schema
        ))?;
        Ok(Conn {
            client,
            cache: HashMap::new(),
        })
    }

    fn init_schema(&self, conn: &mut Conn) -> Result<(), StoreError> {
        let mut tx = conn.client.transaction()?;
        // Serialise concurrent first connections to one schema.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext($1))",
            &[&self.channel],
        )?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS ol_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        )?;
        let found = tx.query_opt(
            "SELECT value FROM ol_meta WHERE key = 'schema_version'",
            &[],
        )?;
        match found {
            None => {
                // Created as version 2 and migrated at once: new and migrated databases
                // cannot differ.
                tx.execute(
                    "INSERT INTO ol_meta (key, value) VALUES ('schema_version', '2')",
                    &[],
                )?;
                tx.batch_execute(SCHEMA_V2)?;
                tx.batch_execute(MIGRATE_V2_TO_V3)?;
            }
            Some(row) => {
                let v: String = row.try_get(0)?;
                let found: u32 = v.parse().map_err(|_| {
                    StoreError::Database(format!("unreadable schema_version {v:?}"))
                })?;
                match found {
                    _ if found > SCHEMA_VERSION => {
                        return Err(StoreError::SchemaTooNew {
                            found,
                            supported: SCHEMA_VERSION,
                        });
                    }
                    1 => {
                        tracing::info!(target: "outbox_lanes::store", schema = %self.opts.schema, "migrating the schema from version 1 to 3");
                        tx.batch_execute(MIGRATE_V1_TO_V2)?;
                        tx.batch_execute(MIGRATE_V2_TO_V3)?;
                    }
                    2 => {
                        tracing::info!(target: "outbox_lanes::store", schema = %self.opts.schema, "migrating the schema from version 2 to 3");
                        tx.batch_execute(MIGRATE_V2_TO_V3)?;
                    }
                    3 => {}
                    _ => {
                        return Err(StoreError::Database(format!(
                            "unknown schema_version {found}"
                        )));
                    }
                }
            }
        }
        // Holders that keep a liveness lock (any schema version: a table of its own).
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS ol_live_holders (holder TEXT PRIMARY KEY); \
             CREATE INDEX IF NOT EXISTS ol_slots_holder ON ol_slots (holder) WHERE holder IS NOT NULL",
        )?;
        tx.commit()?;
        Ok(())
    }

    /// The advisory-lock name of `holder` in this schema.
    fn live_key(&self, holder: &str) -> String {
        format!("{}/{holder}", self.opts.schema)
    }

    /// Liveness beside the lease: `holder` holds a session advisory lock, on a connection of
    /// its own, for as long as this store lives. The server drops it when that session ends —
    /// the process died (even by SIGKILL) or lost its connection — and other relays then take
    /// its slots over at once (with new fencing tokens) instead of after their lease. Listed
    /// in `ol_live_holders`, so a holder of an older version (no lock) is never taken for
    /// dead. A failure here only means no liveness: the lease still bounds everything.
    fn register_holder(&self, holder: &str) {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if live.get(holder).is_some_and(|c| !c.is_closed()) {
            return;
        }
        let registered = (|| -> Result<bool, postgres::Error> {
            let mut client = self.tls.connect(&self.config)?;
            client.batch_execute(&format!("SET search_path TO {}", self.opts.schema))?;
            let got: bool = client
                .query_one(
                    "SELECT pg_try_advisory_lock($1, hashtext($2))",
                    &[&LIVE_LOCK, &self.live_key(holder)],
                )?
                .try_get(0)?;
            if got {
                client.execute(
                    "INSERT INTO ol_live_holders (holder) VALUES ($1) ON CONFLICT DO NOTHING",
                    &[&holder],
                )?;
                live.insert(holder.to_owned(), client);
            }
            Ok(got)
        })();
        match registered {
            Ok(true) => {}
            Ok(false) => tracing::warn!(target: "outbox_lanes::store", holder,
                "another live session holds this holder's lock (a holder name used twice?); its slots wait for their lease"),
            Err(e) => tracing::debug!(target: "outbox_lanes::store", holder, error = %e,
                "no liveness lock; slots of this holder wait for their lease"),
        }
    }

    /// Ends the leases of every slot of the dead holders (registered in `ol_live_holders`,
    /// their advisory lock free) among those holding `actor`'s slot, or any slot.
    fn expire_dead_holders(
        &self,
        t: &mut PgTx<'_>,
        us: &str,
        actor: Option<&ActorId>,
    ) -> Result<(), StoreError> {
        let candidates: Vec<String> = t
            .query_rows(
                &format!(
                    "SELECT h.holder FROM ol_live_holders h WHERE h.holder <> $1 AND EXISTS \
                     (SELECT 1 FROM ol_slots s WHERE s.holder = h.holder AND s.lease_expires > {NOW} \
                      AND ($2::text IS NULL OR s.actor = $2))"
                ),
                &[&us, &actor.map(ActorId::as_str)],
            )?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        for dead in candidates {
            let key = self.live_key(&dead);
            // Taken at once when nobody holds it: then the holder is gone; given back at once
            // (a session lock outlives the transaction).
            let free: bool = t
                .query_one_row(
                    "SELECT pg_try_advisory_lock($1, hashtext($2))",
                    &[&LIVE_LOCK, &key],
                )?
                .try_get(0)?;
            if !free {
                continue;
            }
            t.query_one_row(
                "SELECT pg_advisory_unlock($1, hashtext($2))",
                &[&LIVE_LOCK, &key],
            )?;
            let n = t.execute_sql(
                "UPDATE ol_slots SET lease_expires = 0 WHERE holder = $1",
                &[&dead],
            )?;
            t.execute_sql("DELETE FROM ol_live_holders WHERE holder = $1", &[&dead])?;
            tracing::info!(target: "outbox_lanes::store", holder = %dead, slots = n,
                "the holder of these drain slots is gone (its session ended): taken over without waiting for the lease");
        }
        Ok(())
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

    /// Runs `f` in a transaction and commits; retries once on a lost connection when safe
    /// (see the module docs).
    fn with_tx<T, E: From<StoreError> + Lost>(
        &self,
        idempotent: bool,
        mut f: impl FnMut(&mut PgTx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut conn = self.checkout()?;
            let (res, at_commit) = {
                let Conn { client, cache } = &mut conn;
                match client.transaction() {
                    Err(e) => (Err(E::from(pg_err(e))), false),
                    Ok(tx) => {
                        let mut t = PgTx { tx, cache };
                        match f(&mut t) {
                            Err(e) => (Err(e), false),
                            Ok(v) => match t.tx.commit() {
                                Ok(()) => (Ok(v), false),
                                Err(e) => (Err(E::from(pg_err(e))), true),
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
                Err(e) if e.lost() || conn.client.is_closed() => {
                    self.discard(conn);
                    let retry = attempt < 2 && (!at_commit || idempotent);
                    tracing::warn!(target: "outbox_lanes::store", at_commit, idempotent, retry, "postgres connection lost; dropped the pool's idle connections");
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
        actor: &ActorId,
        rows: &[NewRow],
    ) -> Result<(Vec<Enqueued>, PendingWake), EnqueueError> {
        let prepared = prepare(rows, &self.opts.common)?;
        let mut sp = tx.savepoint("ol_enqueue")?;
        let out = enqueue_tx(&mut sp, actor, &prepared, &self.channel)?;
        sp.commit()?;
        Ok((out, PendingWake::new(self.notifier.clone())))
    }

    /// The options the store connected with.
    pub fn options(&self) -> &PgOptions {
        &self.opts
    }

    /// Runs statements outside a transaction (no BEGIN/COMMIT round trips), each committed
    /// on its own: reads, and single idempotent write statements (the ack's), which are as
    /// safe to retry once on a fresh connection as a read.
    fn autocommit<T>(
        &self,
        mut f: impl FnMut(&mut PgConn<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut conn = self.checkout()?;
            let res = {
                let Conn { client, cache } = &mut conn;
                f(&mut PgConn { client, cache })
            };
            match res {
                Ok(v) => {
                    self.checkin(conn);
                    return Ok(v);
                }
                Err(e) if e.lost() || conn.client.is_closed() => {
                    self.discard(conn);
                    tracing::warn!(target: "outbox_lanes::store", retry = attempt < 2, "postgres connection lost outside a transaction; dropped the pool's idle connections");
                    if attempt < 2 {
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

    fn tx<T>(
        &self,
        idempotent: bool,
        f: impl FnMut(&mut PgTx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.with_tx(idempotent, f)
    }

    fn fenced<T>(
        &self,
        token: &SlotToken,
        idempotent: bool,
        mut f: impl FnMut(&mut PgTx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.tx(idempotent, |t| {
            slots::fence(t, token)?;
            f(t)
        })
    }
}

/// The drain-slot check as an SQL condition on `$1` (actor) and `$2` (fencing token), for
/// statements that fence themselves instead of spending a round trip on [`fence`].
const LIVE_SLOT: &str = "SELECT 1 FROM ol_slots WHERE actor = $1 AND token = $2 AND holder IS NOT NULL \
     AND lease_expires > (extract(epoch from clock_timestamp()) * 1000)::bigint";

/// A unique violation on a row id index (`ol_units_row_id` or `ol_rows`' `UNIQUE (actor,
/// row_id)`), mapped to the batch row it names: how the one-statement enqueue refuses a row id
/// already inline on a unit, and a safety net for the general path (whose plan checks both
/// places first, under the actor lock) against a writer that skipped the lock.
fn duplicate_of(e: &postgres::Error, rows: &[PreparedRow<'_>]) -> Option<EnqueueError> {
    let db = e.as_db_error()?;
    if *db.code() != SqlState::UNIQUE_VIOLATION
        || !matches!(
            db.constraint(),
            Some("ol_units_row_id" | "ol_rows_actor_row_id_key")
        )
    {
        return None;
    }
    // "Key (actor, row_id)=(alice, r1) already exists."
    let detail = db.detail().unwrap_or("");
    let row = rows
        .iter()
        .map(|p| p.row.id.as_str())
        .filter(|id| detail.contains(&format!(", {id})=")) || detail.contains(&format!(", {id}) ")))
        .max_by_key(|id| id.len())
        .or_else(|| rows.first().map(|p| p.row.id.as_str()))?;
    Some(EnqueueError::DuplicateRowId {
        row: row.to_string(),
    })
}

/// Whether [`enqueue_one_lane_rows`] can write this batch.
fn one_lane_rows(rows: &[PreparedRow<'_>]) -> bool {
    rows.iter()
        .all(|p| p.lanes.len() == 1 && p.row.dedup_key.is_none())
}

/// The hot path of [`enqueue_tx`]: every row has one recipient and no dedup key, so each row
/// is one unit with its payload inline, and one statement does it all: the actor's seqs, the
/// duplicate check against shared payloads (ol_rows), the lanes (created or their tail
/// advanced, by one upsert each), the units, and the wake-up. A row id already inline on a
/// unit is refused by the unique index `ol_units_row_id`.
///
/// The statement's snapshot is taken before it waits for the actor's row lock, so it cannot
/// judge the row ids against the shared payloads (ol_rows): a second statement does, after
/// it. Lanes are upserted, so one created meanwhile is found all the same; seqs still follow
/// commit order (the lock is held to commit).
fn enqueue_one_lane_rows(
    t: &mut impl PgExec,
    actor: &ActorId,
    rows: &[PreparedRow<'_>],
    channel: &str,
) -> Result<Vec<Enqueued>, EnqueueError> {
    let a = actor.as_str();
    let now = millis_of(Timestamp::from_system_time(std::time::SystemTime::now()));
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let n = count(rows.len());
    // The batch's lanes in key order (the upsert locks them in that order), each with the
    // 1-based index of its last row: the lane's new tail is the actor's base seq + that.
    let mut lanes: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for (k, p) in rows.iter().enumerate() {
        let key = p
            .lanes
            .first()
            .ok_or_else(|| StoreError::Database("row without a lane".into()))?;
        lanes.insert(
            (key.recipient(), key.ordering_key().unwrap_or("")),
            count(k + 1),
        );
    }
    let (mut l_rec, mut l_ok, mut l_last) = (vec![], vec![], vec![]);
    let mut ordinal: HashMap<(&str, &str), i64> = HashMap::with_capacity(lanes.len());
    for (k, (key, last)) in lanes.into_iter().enumerate() {
        l_rec.push(key.0);
        l_ok.push(key.1);
        l_last.push(last);
        ordinal.insert(key, count(k + 1));
    }
    let (mut r_id, mut r_lane, mut r_ct, mut r_body, mut r_len, mut r_hd) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for p in rows {
        let key = p
            .lanes
            .first()
            .ok_or_else(|| StoreError::Database("row without a lane".into()))?;
        r_id.push(p.row.id.as_str());
        r_lane.push(
            ordinal
                .get(&(key.recipient(), key.ordering_key().unwrap_or("")))
                .copied()
                .ok_or_else(|| StoreError::Database("lane missing from the batch".into()))?,
        );
        r_ct.push(p.row.content_type.as_str());
        r_body.push(p.row.body.as_slice());
        r_len.push(count(p.row.body.len()));
        r_hd.push(encode_headers(&p.row.headers));
    }
    // Each data-modifying part depends on `a`, which writes nothing when a duplicate was
    // found: a refused batch writes nothing. The probes of ol_rows are skipped altogether
    // when the actor has no shared payload (the common case: one probe instead of one per
    // row). The rows are unnested where they are inserted (a CTE read twice would copy every
    // payload into a temporary store). Rows name their lane by its 1-based position in
    // the lane arrays; `k` lists the upserted lanes' ids in that order. The NOTIFY is
    // delivered on commit only.
    let r = t
        .query_rows(
            "WITH a AS (INSERT INTO ol_actors AS a (actor, last_seq) SELECT $1::text, $2::bigint \
               ON CONFLICT (actor) DO UPDATE SET last_seq = a.last_seq + excluded.last_seq \
               RETURNING a.last_seq - $2::bigint AS base), \
             v AS (SELECT * FROM unnest($8::text[], $9::text[], $10::bigint[]) \
               WITH ORDINALITY AS v(recipient, ok, last_ix, lane)), \
             l AS (INSERT INTO ol_lanes AS l (actor, recipient, ordering_key, tail_seq) \
               SELECT $1, v.recipient, v.ok, a.base + v.last_ix FROM a, v ORDER BY v.lane \
               ON CONFLICT (actor, recipient, ordering_key) DO UPDATE \
               SET tail_seq = GREATEST(l.tail_seq, excluded.tail_seq) \
               RETURNING l.id, l.recipient, l.ordering_key), \
             k AS (SELECT array_agg(l.id ORDER BY v.lane) AS ids FROM v JOIN l \
               ON l.recipient = v.recipient AND l.ordering_key = v.ok), \
             u AS (INSERT INTO ol_units (actor, lane_id, seq, row_id, content_type, body, body_len, \
                 ordering_key, enqueued_at, headers) \
               SELECT $1, k.ids[r.lane], a.base + r.ix, r.row_id, r.ct, r.body, r.len, $9[r.lane], $11, r.hd \
               FROM a, k, unnest($3::text[], $4::bigint[], $5::text[], $6::bytea[], $7::bigint[], $13::text[]) \
                 WITH ORDINALITY AS r(row_id, lane, ct, body, len, hd, ix) RETURNING id, seq) \
             SELECT NULL::text[], (SELECT base FROM a), \
               (SELECT array_agg(id ORDER BY seq) FROM u), (SELECT pg_notify($12, $1) FROM a)",
            &[
                &a, &n, &r_id, &r_lane, &r_ct, &r_body, &r_len, &l_rec, &l_ok, &l_last, &now, &channel,
                &r_hd,
            ],
        )
        .map_err(|e| duplicate_of(&e, rows).unwrap_or_else(|| EnqueueError::from(e)))?
        .into_iter()
        .next()
        .ok_or_else(|| StoreError::Database("no row returned by the enqueue".into()))?;
    // The row ids against the shared payloads, in a statement of its own: its snapshot is
    // taken now that the actor's lock is held, so it sees every shared payload committed
    // before, including while the statement above waited for the lock (a concurrent fan-out
    // enqueue, a plain-SQL writer, a dead letter moving an inline payload to ol_rows: that one
    // also made the insert above wait for it through the unique index). No writer adds a
    // shared payload for this actor from now to the commit: they all take the actor's lock,
    // or (the dead letter) hold the inline row this batch would have collided with.
    // The caller's transaction (or savepoint) is rolled back on the error.
    if let Some(taken) = t
        .query_opt_row(
            "SELECT row_id FROM ol_rows WHERE actor = $1 AND row_id = ANY($2) LIMIT 1",
            &[&a, &r_id],
        )?
        .map(|r| r.try_get::<_, String>(0))
        .transpose()?
    {
        return Err(EnqueueError::DuplicateRowId { row: taken });
    }
    let base: i64 = r
        .try_get::<_, Option<i64>>(1)?
        .ok_or_else(|| StoreError::Database("no seq reserved".into()))?;
    let units: Vec<i64> = r.try_get::<_, Option<Vec<i64>>>(2)?.unwrap_or_default();
    if units.len() != rows.len() {
        return Err(StoreError::Database(format!(
            "{} units written for {} rows",
            units.len(),
            rows.len()
        ))
        .into());
    }
    Ok(rows
        .iter()
        .zip(units)
        .enumerate()
        .map(|(k, (p, unit))| Enqueued {
            row_id: p.row.id.clone(),
            seq: Seq(to_u64(base + count(k + 1))),
            units: vec![UnitId(to_u64(unit))],
            skipped: Vec::new(),
        })
        .collect())
}

/// Set-based: a fixed number of statements per batch whatever its size, because every
/// statement costs a round trip to the server.
fn enqueue_tx(
    t: &mut impl PgExec,
    actor: &ActorId,
    rows: &[PreparedRow<'_>],
    channel: &str,
) -> Result<Vec<Enqueued>, EnqueueError> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    if one_lane_rows(rows) {
        return enqueue_one_lane_rows(t, actor, rows, channel);
    }
    // The general case: several recipients, joined units, dedup keys.
    let a = actor.as_str();
    let now = millis_of(Timestamp::from_system_time(std::time::SystemTime::now()));
    let n = i64::try_from(rows.len()).unwrap_or(i64::MAX);
    // First: the actor row lock serialises this actor's enqueues (seq order = commit order),
    // and the plan below reads after it, so it sees every enqueue committed before.
    let first = units::alloc_seqs(t, a, n)?;

    // Everything the plan needs, in one round trip: row ids already taken (inline on a unit
    // or in ol_rows), the batch's known lanes, what is pending for its dedup keys, and enough
    // unit and shared-row ids (upper bounds: skipped recipients only leave gaps).
    let ids: Vec<&str> = rows.iter().map(|p| p.row.id.as_str()).collect();
    let mut recs: Vec<&str> = Vec::new();
    let mut oks: Vec<&str> = Vec::new();
    {
        let mut seen: HashSet<(&str, &str)> = HashSet::new();
        for p in rows {
            for k in &p.lanes {
                let pair = (k.recipient(), k.ordering_key().unwrap_or(""));
                if seen.insert(pair) {
                    recs.push(pair.0);
                    oks.push(pair.1);
                }
            }
        }
    }
    let dks: Vec<&str> = rows
        .iter()
        .filter_map(|p| p.row.dedup_key.as_deref())
        .collect();
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    // One ol_units row per (row, lane) at most; an ol_rows row per row split into several units.
    let max_units: i64 = rows.iter().map(|p| count(p.lanes.len())).sum();
    let max_shared: i64 = count(
        rows.iter()
            .filter(|p| !p.row.joined && p.lanes.len() > 1)
            .count(),
    );
    // Pending units for the dedup keys: inline heads by ol_units_dedup, shared rows by
    // ol_rows_dedup then ol_units_row; then each unit's rows still pending (the head's own
    // lane, or a joined unit's other lanes by ol_units_unit).
    // Every lookup driven by the batch is a LATERAL probe (LIMIT or OFFSET 0 keeps the planner
    // from flattening it into a join it could hash): `enqueue_in` runs on the caller's
    // connection, without the store's planner settings, and a hash join planned on stale
    // statistics would read every row id of the actor.
    // The serial sequences are named literally (`<table>_id_seq`, as BIGSERIAL names them):
    // `pg_get_serial_sequence` would be re-evaluated for every id drawn (a catalog search each).
    let plan_row = t.query_one_row(
        "SELECT dup.v, ln.ids, ln.recs, ln.oks, pend.dks, pend.recs, idr.v, idu.v FROM \
         (SELECT array_agg(k.row_id) AS v FROM unnest($2::text[]) AS k(row_id) CROSS JOIN LATERAL ( \
            SELECT 1 FROM ol_units u WHERE u.actor = $1 AND u.row_id = k.row_id \
            UNION ALL SELECT 1 FROM ol_rows r WHERE r.actor = $1 AND r.row_id = k.row_id LIMIT 1) x) dup, \
         (SELECT array_agg(l.id) AS ids, array_agg(k.recipient) AS recs, array_agg(k.ordering_key) AS oks \
            FROM unnest($3::text[], $4::text[]) AS k(recipient, ordering_key) CROSS JOIN LATERAL ( \
            SELECT l.id FROM ol_lanes l WHERE l.actor = $1 AND l.recipient = k.recipient \
            AND l.ordering_key = k.ordering_key LIMIT 1) l) ln, \
         (SELECT array_agg(x.dedup_key) AS dks, array_agg(x.recipient) AS recs FROM \
            (SELECT DISTINCT k.dk AS dedup_key, l.recipient FROM unnest($5::text[]) AS k(dk) \
             CROSS JOIN LATERAL ( \
               SELECT h.id FROM ol_units h WHERE h.actor = $1 AND h.dedup_key = k.dk AND h.unit_id IS NULL \
               UNION ALL \
               SELECT h.id FROM ol_rows r CROSS JOIN LATERAL (SELECT h.id FROM ol_units h \
                 WHERE h.row_ref = r.id AND h.unit_id IS NULL OFFSET 0) h \
                 WHERE r.actor = $1 AND r.dedup_key = k.dk OFFSET 0) p \
             CROSS JOIN LATERAL ( \
               SELECT d.lane_id FROM ol_units d WHERE d.id = p.id AND d.state = 0 \
               UNION ALL \
               SELECT d.lane_id FROM ol_units d WHERE d.unit_id = p.id AND d.state = 0 OFFSET 0) d \
             CROSS JOIN LATERAL (SELECT l.recipient FROM ol_lanes l WHERE l.id = d.lane_id LIMIT 1) l) x) pend, \
         (SELECT array_agg(nextval('ol_rows_id_seq')) AS v FROM generate_series(1::bigint, $6::bigint)) idr, \
         (SELECT array_agg(nextval('ol_units_id_seq')) AS v FROM generate_series(1::bigint, $7::bigint)) idu",
        &[&a, &ids, &recs, &oks, &dks, &max_shared, &max_units],
    )?;
    let taken: HashSet<String> = plan_row
        .try_get::<_, Option<Vec<String>>>(0)?
        .unwrap_or_default()
        .into_iter()
        .collect();
    if let Some(p) = rows.iter().find(|p| taken.contains(&p.row.id)) {
        return Err(EnqueueError::DuplicateRowId {
            row: p.row.id.clone(),
        });
    }
    let mut lane_ids: HashMap<(String, String), i64> = HashMap::new();
    if let (Some(i), Some(r), Some(o)) = (
        plan_row.try_get::<_, Option<Vec<i64>>>(1)?,
        plan_row.try_get::<_, Option<Vec<String>>>(2)?,
        plan_row.try_get::<_, Option<Vec<String>>>(3)?,
    ) {
        for ((id, rec), ok) in i.into_iter().zip(r).zip(o) {
            lane_ids.insert((rec, ok), id);
        }
    }
    let mut pending: HashSet<(String, String)> = HashSet::new();
    if let (Some(d), Some(r)) = (
        plan_row.try_get::<_, Option<Vec<String>>>(4)?,
        plan_row.try_get::<_, Option<Vec<String>>>(5)?,
    ) {
        pending.extend(d.into_iter().zip(r));
    }
    let shared_keys: Vec<i64> = plan_row
        .try_get::<_, Option<Vec<i64>>>(6)?
        .unwrap_or_default();
    let unit_keys: Vec<i64> = plan_row
        .try_get::<_, Option<Vec<i64>>>(7)?
        .unwrap_or_default();

    // Lanes used for the first time.
    if lane_ids.len() < recs.len() {
        let (mr, mo): (Vec<&str>, Vec<&str>) = recs
            .iter()
            .zip(&oks)
            .filter(|(r, o)| !lane_ids.contains_key(&((**r).to_string(), (**o).to_string())))
            .map(|(r, o)| (*r, *o))
            .unzip();
        for r in t.query_rows(
            "INSERT INTO ol_lanes (actor, recipient, ordering_key) SELECT $1, * FROM unnest($2::text[], $3::text[]) \
             ON CONFLICT (actor, recipient, ordering_key) DO NOTHING RETURNING id, recipient, ordering_key",
            &[&a, &mr, &mo],
        )? {
            lane_ids.insert((r.try_get(1)?, r.try_get(2)?), r.try_get(0)?);
        }
    }

    // The rows to write, as columns (one array per column, unnested by the insert):
    // heads with the payload inline, shared payloads, and rows without a payload (a joined
    // unit's other lanes, the heads of a shared payload's units).
    #[derive(Default)]
    struct Inline<'r> {
        id: Vec<i64>,
        lane: Vec<i64>,
        seq: Vec<i64>,
        n: Vec<i64>,
        row: Vec<&'r str>,
        ct: Vec<&'r str>,
        body: Vec<&'r [u8]>,
        len: Vec<i64>,
        dk: Vec<Option<&'r str>>,
        ok: Vec<&'r str>,
        hd: Vec<Option<String>>,
    }
    #[derive(Default)]
    struct Shared<'r> {
        id: Vec<i64>,
        row: Vec<&'r str>,
        seq: Vec<i64>,
        ct: Vec<&'r str>,
        body: Vec<&'r [u8]>,
        len: Vec<i64>,
        dk: Vec<Option<&'r str>>,
        ok: Vec<&'r str>,
        hd: Vec<Option<String>>,
    }
    #[derive(Default)]
    struct Bare {
        id: Vec<i64>,
        unit: Vec<Option<i64>>,
        lane: Vec<i64>,
        seq: Vec<i64>,
        row_ref: Vec<Option<i64>>,
    }
    let (mut inl, mut sh, mut bare) = (Inline::default(), Shared::default(), Bare::default());
    // Highest seq written per lane, in lane order (the tail update locks lanes in that order).
    let mut tails: BTreeMap<i64, i64> = BTreeMap::new();
    let (mut sk, mut uk) = (shared_keys.into_iter(), unit_keys.into_iter());
    let mut next_unit = || {
        uk.next()
            .ok_or_else(|| StoreError::Database("unit id allocation short".into()))
    };
    let mut out = Vec::with_capacity(rows.len());
    for (k, p) in rows.iter().enumerate() {
        let seq = first + count(k);
        let mut kept = Vec::with_capacity(p.lanes.len());
        let mut skipped = Vec::new();
        for key in &p.lanes {
            if let Some(dk) = &p.row.dedup_key {
                if !pending.insert((dk.clone(), key.recipient().to_string())) {
                    skipped.push(key.recipient().to_string());
                    continue;
                }
            }
            let id = lane_ids
                .get(&(
                    key.recipient().to_string(),
                    key.ordering_key().unwrap_or("").to_string(),
                ))
                .copied()
                .ok_or_else(|| StoreError::Database("lane vanished during enqueue".into()))?;
            kept.push(id);
            let tail = tails.entry(id).or_insert(seq);
            *tail = (*tail).max(seq);
        }
        let len = count(p.row.body.len());
        let mut units = Vec::new();
        if let [first_lane, others @ ..] = kept.as_slice() {
            if p.row.joined || others.is_empty() {
                // One unit: its head holds the payload; a joined unit's other lanes are rows
                // pointing at the head.
                let head = next_unit()?;
                inl.id.push(head);
                inl.lane.push(*first_lane);
                inl.seq.push(seq);
                inl.n.push(count(kept.len()));
                inl.row.push(p.row.id.as_str());
                inl.ct.push(p.row.content_type.as_str());
                inl.body.push(p.row.body.as_slice());
                inl.len.push(len);
                inl.dk.push(p.row.dedup_key.as_deref());
                inl.ok.push(p.ordering_key);
                inl.hd.push(encode_headers(&p.row.headers));
                for lane in others {
                    bare.id.push(next_unit()?);
                    bare.unit.push(Some(head));
                    bare.lane.push(*lane);
                    bare.seq.push(seq);
                    bare.row_ref.push(None);
                }
                units.push(UnitId(to_u64(head)));
            } else {
                // Several units: the payload once in ol_rows, one head per lane referring to it.
                let row_ref = sk
                    .next()
                    .ok_or_else(|| StoreError::Database("row id allocation short".into()))?;
                sh.id.push(row_ref);
                sh.row.push(p.row.id.as_str());
                sh.seq.push(seq);
                sh.ct.push(p.row.content_type.as_str());
                sh.body.push(p.row.body.as_slice());
                sh.len.push(len);
                sh.dk.push(p.row.dedup_key.as_deref());
                sh.ok.push(p.ordering_key);
                sh.hd.push(encode_headers(&p.row.headers));
                for lane in &kept {
                    let head = next_unit()?;
                    bare.id.push(head);
                    bare.unit.push(None);
                    bare.lane.push(*lane);
                    bare.seq.push(seq);
                    bare.row_ref.push(Some(row_ref));
                    units.push(UnitId(to_u64(head)));
                }
            }
        }
        out.push(Enqueued {
            row_id: p.row.id.clone(),
            seq: Seq(to_u64(seq)),
            units,
            skipped,
        });
    }
    if tails.is_empty() {
        // Every recipient was skipped by dedup: nothing to write but the wake-up (delivered
        // to listeners when, and only if, the transaction commits).
        t.execute_sql("SELECT pg_notify($1, $2)", &[&channel, &a])?;
        return Ok(out);
    }
    let (t_lane, t_seq): (Vec<i64>, Vec<i64>) = tails.into_iter().unzip();
    // One statement, one round trip: the tables have no foreign keys, so the order of the
    // inserts within it does not matter. The NOTIFY is delivered on commit only. The tails'
    // update is driven by the batch (`l.id = v.lane` alone: a nested loop probing the lanes'
    // primary key per tail). An extra `l.id = ANY($26)` made the planner drive it by the lanes
    // instead and rescan the batch for each: quadratic in one enqueue's lanes (20,000
    // recipients in one row: 4.9 s, now 0.38 s; one-recipient enqueues among 100,000 lanes:
    // 3.3 ms, now 0.64 millis_of).
    t.execute_sql(
        "WITH h AS (INSERT INTO ol_units (id, actor, lane_id, seq, lanes, pending, row_id, content_type, body, \
             body_len, dedup_key, ordering_key, enqueued_at, headers) \
           SELECT id, $1, lane, seq, n, n, row_id, ct, body, len, dk, ok, $2, hd FROM unnest($3::bigint[], $4::bigint[], \
             $5::bigint[], $6::bigint[], $7::text[], $8::text[], $9::bytea[], $10::bigint[], $11::text[], $12::text[], \
             $29::text[]) AS t(id, lane, seq, n, row_id, ct, body, len, dk, ok, hd)), \
         r AS (INSERT INTO ol_rows (id, actor, row_id, seq, content_type, body, body_len, dedup_key, ordering_key, \
             enqueued_at, headers) \
           SELECT id, $1, row_id, seq, ct, body, len, dk, ok, $2, hd FROM unnest($13::bigint[], $14::text[], \
             $15::bigint[], $16::text[], $17::bytea[], $18::bigint[], $19::text[], $20::text[], $30::text[]) \
             AS t(id, row_id, seq, ct, body, len, dk, ok, hd)), \
         o AS (INSERT INTO ol_units (id, unit_id, actor, lane_id, seq, row_ref) \
           SELECT id, uid, $1, lane, seq, rr FROM unnest($21::bigint[], $22::bigint[], $23::bigint[], \
             $24::bigint[], $25::bigint[]) AS t(id, uid, lane, seq, rr)), \
         l AS (UPDATE ol_lanes l SET tail_seq = GREATEST(l.tail_seq, v.seq) \
           FROM unnest($26::bigint[], $27::bigint[]) AS v(lane, seq) WHERE l.id = v.lane) \
         SELECT pg_notify($28, $1)",
        &[
            &a, &now, &inl.id, &inl.lane, &inl.seq, &inl.n, &inl.row, &inl.ct, &inl.body, &inl.len, &inl.dk,
            &inl.ok, &sh.id, &sh.row, &sh.seq, &sh.ct, &sh.body, &sh.len, &sh.dk, &sh.ok, &bare.id, &bare.unit,
            &bare.lane, &bare.seq, &bare.row_ref, &t_lane, &t_seq, &channel, &inl.hd, &sh.hd,
        ],
    )
    .map_err(|e| duplicate_of(&e, rows).unwrap_or_else(|| EnqueueError::from(e)))?;
    Ok(out)
}

/// In a claim, the head of lane row `d`: `d` itself, or the unit's head for another lane's row.
const HEAD_OF_D: &str = "FROM ol_units h WHERE h.id = coalesce(d.unit_id, d.id)";

impl Backend for PgStore {
    type Reader<'c> = PgConn<'c>;
    type Writer<'c> = PgTx<'c>;

    fn read<T>(
        &self,
        f: impl FnMut(&mut PgConn<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.autocommit(f)
    }

    fn write<T>(
        &self,
        idempotent: bool,
        f: impl FnMut(&mut PgTx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.tx(idempotent, f)
    }

    fn common(&self) -> &CommonOptions {
        &self.opts.common
    }

    fn notify(&self) {
        self.notifier.notify();
    }

    fn notify_others(&self, t: &mut PgTx<'_>, actors: &[ActorId]) -> Result<(), StoreError> {
        for a in actors {
            t.execute_sql("SELECT pg_notify($1, $2)", &[&self.channel, &a.as_str()])?;
        }
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
        // In a transaction even when it is one statement: a statement that fails before the
        // COMMIT is sent certainly did not commit, so it is retried on a new connection.
        let out = self.with_tx(false, |t| enqueue_tx(t, actor, &prepared, &self.channel))?;
        self.notifier.notify();
        Ok(out)
    }
}

impl DriverStore for PgStore {
    fn acquire_slot(
        &self,
        actor: &ActorId,
        holder: &str,
        lease: Duration,
    ) -> Result<SlotAcquisition, StoreError> {
        self.register_holder(holder);
        self.tx(false, |t| {
            slots::acquire(t, actor, holder, lease, |t| {
                self.expire_dead_holders(t, holder, Some(actor))
            })
        })
    }

    fn renew_slot(&self, token: &SlotToken, lease: Duration) -> Result<(), StoreError> {
        self.tx(true, |t| slots::renew(t, token, lease))
    }

    fn release_slot(&self, token: &SlotToken) -> Result<SlotRelease, StoreError> {
        self.tx(false, |t| slots::release(t, token))
    }

    fn lanes_with_work(
        &self,
        token: &SlotToken,
        since: u64,
    ) -> Result<(Vec<PendingLane>, u64), StoreError> {
        self.autocommit(|t| {
            // Fenced in the same statement (one round trip): the first column says whether the
            // token is live; a stale token reads no lane. A lane's rows are probed from its tail:
            // acked units leave dead index entries at its head until vacuum, and the tail holds
            // the newest units (kept a per-lane subplan, scanning backwards, by OFFSET 0).
            let rows = t.query_rows(
                &format!(
                    "SELECT f.live, l.id, l.recipient, l.ordering_key, l.not_before, l.backoff_level, l.strict, \
                     l.paused, l.tail_seq FROM (SELECT EXISTS ({LIVE_SLOT}) AS live) f \
                     LEFT JOIN LATERAL (SELECT * FROM ol_lanes l WHERE f.live AND l.actor = $1 AND l.tail_seq > $3 \
                     AND EXISTS (SELECT 1 FROM ol_units d WHERE d.lane_id = l.id \
                     ORDER BY d.lane_id DESC, d.seq DESC, d.id DESC LIMIT 1 OFFSET 0)) l ON TRUE ORDER BY l.id"
                ),
                &[&token.actor().as_str(), &to_i64(token.fencing()), &to_i64(since)],
            )?;
            if !rows.first().map(|r| r.try_get::<_, bool>(0)).transpose()?.unwrap_or(false) {
                return Err(slots::stale(token));
            }
            let mut mark = since;
            let mut out = Vec::with_capacity(rows.len());
            for r in rows {
                let Some(id) = r.try_get::<_, Option<i64>>(1)? else { continue };
                mark = mark.max(to_u64(r.try_get(8)?));
                out.push(PendingLane {
                    lane: StoreLaneId(id),
                    key: key_of(r.try_get(2)?, r.try_get(3)?),
                    not_before: r.try_get::<_, Option<i64>>(4)?.map(timestamp_of),
                    backoff_level: to_u32(r.try_get(5)?),
                    strict: r.try_get(6)?,
                    paused: r.try_get(7)?,
                });
            }
            Ok((out, mark))
        })
    }

    fn claim(
        &self,
        token: &SlotToken,
        lanes: &[ClaimRange],
    ) -> Result<Vec<ClaimedLane>, StoreError> {
        // One round trip whatever the number of lanes (and a second one only when joined units
        // are read): the fence, every lane's state and its heads (one index range scan per
        // lane, LIMITed) in one statement. A requested lane yields one row with its state and
        // no unit when it has none to give, and no row at all when it is unknown or another
        // actor's. A one-lane unit with its payload inline (the common case) is read whole from
        // its lane row; a joined unit's other lanes (`unit_id`) and shared payloads (`row_ref`)
        // need the head or ol_rows, looked up by subqueries that CASE and coalesce only run
        // when the lane row lacks the value (a join, even on a NULL key, costs a rescan per
        // unit).
        // Columns 1-8 are the unit (NULL when none), 9-13 the lane.
        self.autocommit(|t| {
            let actor = token.actor().as_str();
            let (mut k_lane, mut k_from, mut k_lim) = (vec![], vec![], vec![]);
            for req in lanes {
                k_lane.push(req.lane.0);
                k_from.push(to_i64(req.from.0));
                k_lim.push(i64::from(req.limit));
            }
            let rows = t.query_rows(
                &format!(
                    "SELECT f.live, d.unit, d.seq, d.attempts, d.state, d.row_id, d.len, d.at, d.lanes, \
                       l.ord, l.id, l.recipient, l.ordering_key, l.paused \
                     FROM (SELECT EXISTS ({LIVE_SLOT}) AS live) f \
                     LEFT JOIN LATERAL (SELECT k.ord, k.from_seq, k.lim, l.id, l.recipient, l.ordering_key, l.paused \
                       FROM unnest($3::bigint[], $4::bigint[], $5::bigint[]) WITH ORDINALITY AS k(lane, from_seq, lim, ord) \
                       CROSS JOIN LATERAL (SELECT l.id, l.recipient, l.ordering_key, l.paused FROM ol_lanes l \
                         WHERE l.id = k.lane AND l.actor = $1 LIMIT 1) l \
                       WHERE f.live) l ON TRUE \
                     LEFT JOIN LATERAL (SELECT coalesce(d.unit_id, d.id) AS unit, d.seq, d.id, d.attempts, d.state, \
                         CASE WHEN d.row_id IS NOT NULL THEN d.row_id ELSE (SELECT coalesce(h.row_id, \
                           (SELECT r.row_id FROM ol_rows r WHERE r.id = h.row_ref)) {HEAD_OF_D}) END AS row_id, \
                         CASE WHEN d.body_len IS NOT NULL THEN d.body_len ELSE (SELECT coalesce(h.body_len, \
                           (SELECT r.body_len FROM ol_rows r WHERE r.id = h.row_ref)) {HEAD_OF_D}) END AS len, \
                         CASE WHEN d.enqueued_at IS NOT NULL THEN d.enqueued_at ELSE (SELECT coalesce(h.enqueued_at, \
                           (SELECT r.enqueued_at FROM ol_rows r WHERE r.id = h.row_ref)) {HEAD_OF_D}) END AS at, \
                         CASE WHEN d.unit_id IS NULL THEN d.lanes \
                           ELSE (SELECT h.lanes FROM ol_units h WHERE h.id = d.unit_id) END AS lanes \
                       FROM ol_units d WHERE NOT l.paused AND d.lane_id = l.id AND d.seq >= l.from_seq \
                       ORDER BY d.lane_id, d.seq, d.id LIMIT l.lim) d ON TRUE \
                     ORDER BY l.ord, d.seq, d.id"
                ),
                &[&actor, &to_i64(token.fencing()), &k_lane, &k_from, &k_lim],
            )?;
            if !rows.first().map(|r| r.try_get::<_, bool>(0)).transpose()?.unwrap_or(false) {
                return Err(slots::stale(token));
            }
            let mut info: HashMap<i64, (LaneKey, bool)> = HashMap::new();
            let mut heads: Vec<Vec<Row>> = lanes.iter().map(|_| Vec::new()).collect();
            for r in rows {
                let Some(lane) = r.try_get::<_, Option<i64>>(10)? else { continue };
                if let std::collections::hash_map::Entry::Vacant(e) = info.entry(lane) {
                    e.insert((key_of(r.try_get(11)?, r.try_get(12)?), r.try_get(13)?));
                }
                if r.try_get::<_, Option<i64>>(1)?.is_none() {
                    continue;
                }
                let ord = usize::try_from(r.try_get::<_, i64>(9)?).unwrap_or(0);
                if let Some(v) = ord.checked_sub(1).and_then(|k| heads.get_mut(k)) {
                    v.push(r);
                }
            }
            let mut joined: Vec<i64> = Vec::new();
            for h in heads.iter().flatten() {
                if h.try_get::<_, i64>(8)? > 1 {
                    joined.push(h.try_get(1)?);
                }
            }
            let mut slots_of: HashMap<i64, Vec<ClaimedSlot>> = HashMap::new();
            if !joined.is_empty() {
                for r in t.query_rows(
                    "SELECT d.unit, d.lane_id, l.recipient, l.ordering_key, d.attempts, d.state FROM ( \
                       SELECT id AS unit, lane_id, attempts, state FROM ol_units \
                         WHERE id = ANY($1::bigint[]) AND unit_id IS NULL \
                       UNION ALL SELECT unit_id, lane_id, attempts, state FROM ol_units \
                         WHERE unit_id = ANY($1::bigint[])) d \
                     JOIN ol_lanes l ON l.id = d.lane_id ORDER BY d.unit, d.lane_id",
                    &[&joined],
                )? {
                    slots_of.entry(r.try_get(0)?).or_default().push(ClaimedSlot {
                        lane: StoreLaneId(r.try_get(1)?),
                        key: key_of(r.try_get(2)?, r.try_get(3)?),
                        attempts: to_u32(r.try_get(4)?),
                        served: r.try_get::<_, i64>(5)? != STATE_PENDING,
                    });
                }
            }
            let mut out = Vec::with_capacity(lanes.len());
            for (req, rows) in lanes.iter().zip(heads) {
                let Some((key, paused)) = info.get(&req.lane.0) else {
                    out.push(ClaimedLane { lane: req.lane, units: Vec::new(), exhausted: true });
                    continue;
                };
                let exhausted = *paused || rows.len() < req.limit as usize;
                let units = rows
                    .iter()
                    .map(|h| -> Result<ClaimedUnit, postgres::Error> {
                        let unit: i64 = h.try_get(1)?;
                        let slots = if h.try_get::<_, i64>(8)? > 1 {
                            slots_of.get(&unit).cloned().unwrap_or_default()
                        } else {
                            vec![ClaimedSlot {
                                lane: req.lane,
                                key: key.clone(),
                                attempts: to_u32(h.try_get(3)?),
                                served: h.try_get::<_, i64>(4)? != STATE_PENDING,
                            }]
                        };
                        Ok(ClaimedUnit {
                            id: UnitId(to_u64(unit)),
                            seq: Seq(to_u64(h.try_get(2)?)),
                            // A head written by hand without these reads as empty, as on
                            // SQLite: one odd row neither panics nor blocks the claim.
                            row_id: h.try_get::<_, Option<String>>(5)?.unwrap_or_default(),
                            bytes: to_u32(h.try_get::<_, Option<i64>>(6)?.unwrap_or(0)),
                            enqueued_at: timestamp_of(h.try_get::<_, Option<i64>>(7)?.unwrap_or(0)),
                            slots,
                            // Read when an attempt starts (`DriverStore::payloads`).
                            payload: None,
                        })
                    })
                    .collect::<Result<_, _>>()?;
                out.push(ClaimedLane { lane: req.lane, units, exhausted });
            }
            Ok(out)
        })
    }

    fn payload(&self, unit: UnitId) -> Result<Payload, StoreError> {
        self.autocommit(|t| {
            let r = t
                .query_opt_row(
                    "SELECT coalesce(h.row_id, r.row_id), coalesce(h.content_type, r.content_type), \
                     coalesce(h.body, r.body), CASE WHEN h.row_ref IS NULL THEN h.headers ELSE r.headers END \
                     FROM ol_units h \
                     LEFT JOIN LATERAL (SELECT r.row_id, r.content_type, r.body, r.headers FROM ol_rows r \
                       WHERE r.id = h.row_ref LIMIT 1) r ON TRUE \
                     WHERE h.id = $1 AND h.unit_id IS NULL AND h.acked_at IS NULL",
                    &[&to_i64(unit.0)],
                )?
                .ok_or(StoreError::NotFound { what: "unit" })?;
            match (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?) {
                (Some(row_id), Some(content_type), Some(body)) => Ok(Payload {
                    row_id,
                    content_type,
                    body,
                    headers: decode_headers(r.try_get(3)?),
                }),
                // A head referring to a payload row that is gone: the tables were edited.
                _ => Err(StoreError::Database(format!("unit {unit} has no payload"))),
            }
        })
    }

    fn ack(
        &self,
        token: &SlotToken,
        delivered: &[(UnitId, StoreLaneId)],
    ) -> Result<(), StoreError> {
        if delivered.is_empty() {
            return Ok(());
        }
        let retention = self.opts.common.ack_retention.is_some();
        let mut pairs = delivered.to_vec();
        pairs.sort();
        pairs.dedup();
        let units: Vec<i64> = pairs.iter().map(|(u, _)| to_i64(u.0)).collect();
        let lanes: Vec<i64> = pairs.iter().map(|(_, l)| l.0).collect();
        let actor = token.actor().as_str();
        // The common batch, one-lane units only, in ONE autocommitted statement (no BEGIN or
        // COMMIT round trip; an ack is idempotent, so it is safe to retry on a new connection
        // if the connection is lost). A one-lane unit is finished by its ack: its row (payload
        // included) is deleted outright, or with a retention taken out of its lane and stamped.
        // The statement writes nothing unless the token is live (the slot row locked FOR SHARE
        // to its commit, as `fence` does) and no acked unit is joined, so the batch stays one
        // transaction: a pending joined unit always has rows for its other lanes, found by the
        // small partial index ol_units_unit (not even probed per unit while it is empty). A
        // shared payload goes with its last unit; the statement's snapshot still shows the
        // units it deletes, so that check skips them by id.
        let finish = if retention {
            format!(
                "UPDATE ol_units d SET state = 1, pending = 0, acked_at = {NOW}, lane_id = NULL \
                 FROM unnest($3::bigint[], $4::bigint[]) AS a(id, lane) \
                 WHERE NOT (SELECT joined FROM j) AND EXISTS (SELECT 1 FROM f) \
                 AND d.id = a.id AND d.lane_id = a.lane AND d.unit_id IS NULL \
                 AND d.state = 0 AND d.lanes = 1 AND d.actor = $1 RETURNING d.id, NULL::bigint AS row_ref"
            )
        } else {
            "DELETE FROM ol_units d USING unnest($3::bigint[], $4::bigint[]) AS a(id, lane) \
             WHERE NOT (SELECT joined FROM j) AND EXISTS (SELECT 1 FROM f) \
             AND d.id = a.id AND d.lane_id = a.lane AND d.unit_id IS NULL \
             AND d.state = 0 AND d.lanes = 1 AND d.actor = $1 RETURNING d.id, d.row_ref"
                .to_string()
        };
        let fast = format!(
            "WITH f AS ({LIVE_SLOT} FOR SHARE), \
             j AS (SELECT CASE WHEN EXISTS (SELECT 1 FROM ol_units WHERE unit_id IS NOT NULL) \
               THEN EXISTS (SELECT 1 FROM ol_units x WHERE x.unit_id = ANY($3::bigint[])) ELSE FALSE END AS joined), \
             s AS ({finish}), \
             r AS (DELETE FROM ol_rows r WHERE r.id = ANY(ARRAY(SELECT row_ref FROM s WHERE row_ref IS NOT NULL)) \
               AND NOT EXISTS (SELECT 1 FROM ol_units x WHERE x.row_ref = r.id \
                 AND NOT (x.id = ANY(ARRAY(SELECT id FROM s))) OFFSET 0) \
               AND NOT EXISTS (SELECT 1 FROM ol_dead_letters x WHERE x.row_ref = r.id OFFSET 0)) \
             SELECT EXISTS (SELECT 1 FROM f), (SELECT joined FROM j)"
        );
        let r = self.autocommit(|t| {
            t.query_one_row(&fast, &[&actor, &to_i64(token.fencing()), &units, &lanes])
        })?;
        if !r.try_get::<_, bool>(0)? {
            return Err(slots::stale(token));
        }
        if !r.try_get::<_, bool>(1)? {
            return Ok(());
        }
        // Joined units (the statement above wrote nothing): in a transaction, fenced.
        self.tx(true, |t| {
            slots::fence(t, token)?;
            // Each statement writes a row once (Postgres does not let one statement update a
            // row twice): first the other lanes' rows, with a read of the heads acked on their
            // own lane (a one-lane unit's head is its only row)...
            let mut per_unit: BTreeMap<i64, (i64, Option<i64>)> = BTreeMap::new();
            for r in t.query_rows(
                "WITH a AS (SELECT * FROM unnest($1::bigint[], $2::bigint[]) AS a(unit, lane)), \
                 o AS (UPDATE ol_units d SET state = 1 FROM a \
                   WHERE d.unit_id = a.unit AND d.lane_id = a.lane AND d.state = 0 AND d.actor = $3 \
                   RETURNING d.unit_id) \
                 SELECT unit_id, NULL::bigint FROM o \
                 UNION ALL SELECT h.id, h.lane_id FROM a JOIN ol_units h ON h.id = a.unit AND h.lane_id = a.lane \
                   WHERE h.unit_id IS NULL AND h.state = 0 AND h.actor = $3",
                &[&units, &lanes, &actor],
            )? {
                let e = per_unit.entry(r.try_get(0)?).or_insert((0, None));
                match r.try_get::<_, Option<i64>>(1)? {
                    None => e.0 += 1,
                    own => e.1 = own,
                }
            }
            if per_unit.is_empty() {
                return Ok(());
            }
            // ...then each head once: served on its own lane (if still pending there) and
            // counted down; the units with nothing pending left are finished.
            let (mut h_id, mut h_n, mut h_lane) = (vec![], vec![], vec![]);
            for (unit, (n, own)) in per_unit {
                h_id.push(unit);
                h_n.push(n);
                h_lane.push(own);
            }
            let done: Vec<(i64, Option<i64>)> = t
                .query_rows(
                    "UPDATE ol_units h SET \
                       state = CASE WHEN h.lane_id = x.lane AND h.state = 0 THEN 1 ELSE h.state END, \
                       pending = h.pending - x.n - CASE WHEN h.lane_id = x.lane AND h.state = 0 THEN 1 ELSE 0 END \
                     FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS x(id, n, lane) \
                     WHERE h.id = x.id AND h.unit_id IS NULL RETURNING h.id, h.pending, h.row_ref",
                    &[&h_id, &h_n, &h_lane],
                )?
                .iter()
                .filter_map(|r| match r.try_get::<_, i64>(1) {
                    Ok(pending) if pending > 0 => None,
                    Ok(_) => Some(r.try_get(0).and_then(|id| Ok((id, r.try_get(2)?)))),
                    Err(e) => Some(Err(e)),
                })
                .collect::<Result<_, postgres::Error>>()?;
            if done.is_empty() {
                return Ok(());
            }
            let ids: Vec<i64> = done.iter().map(|d| d.0).collect();
            if retention {
                t.execute_sql(
                    &format!(
                        "WITH o AS (DELETE FROM ol_units d USING unnest($1::bigint[]) AS k(id) WHERE d.unit_id = k.id) \
                         UPDATE ol_units h SET acked_at = {NOW}, lane_id = NULL, pending = 0 \
                         FROM unnest($1::bigint[]) AS k(id) WHERE h.id = k.id"
                    ),
                    &[&ids],
                )?;
            } else {
                let rows: Vec<Option<i64>> = done.iter().map(|d| d.1).collect();
                // One round trip: the row delete runs on the statement's snapshot, which still
                // shows the finished units, so it skips them by id.
                t.execute_sql(
                    "WITH o AS (DELETE FROM ol_units d USING unnest($1::bigint[]) AS k(id) WHERE d.unit_id = k.id), \
                          h AS (DELETE FROM ol_units h USING unnest($1::bigint[]) AS k(id) WHERE h.id = k.id) \
                     DELETE FROM ol_rows r WHERE r.id = ANY($2::bigint[]) \
                     AND NOT EXISTS (SELECT 1 FROM ol_units x WHERE x.row_ref = r.id AND NOT (x.id = ANY($1)) OFFSET 0) \
                     AND NOT EXISTS (SELECT 1 FROM ol_dead_letters x WHERE x.row_ref = r.id OFFSET 0)",
                    &[&ids, &rows],
                )?;
            }
            Ok(())
        })
    }

    fn record_attempts(
        &self,
        token: &SlotToken,
        attempts: &[AttemptRecord],
    ) -> Result<(), StoreError> {
        // Rows locked in (lane, unit) order, so two writers of overlapping lanes cannot
        // deadlock each other (a deadlock the server breaks surfaces as StoreError::Busy).
        let mut sorted: Vec<&AttemptRecord> = attempts.iter().collect();
        sorted.sort_by_key(|a| (a.lane, a.unit));
        self.fenced(token, true, |t| {
            let actor = token.actor().as_str();
            // An enqueue takes the actor's row first and then its lanes, in an order of its
            // own (recipient order); this writes several lanes too. Taking the actor's row
            // first as well (shared: attempt writers do not wait for each other) orders the
            // two, instead of letting them lock two lanes crosswise and deadlock.
            t.execute_sql(
                "SELECT 1 FROM ol_actors WHERE actor = $1 FOR SHARE",
                &[&actor],
            )?;
            for a in &sorted {
                let status = a.status.map(i64::from);
                let n = t.execute_sql(
                    &format!(
                        "UPDATE ol_units SET attempts = $3, last_status = $4, last_error = $5, \
                         first_attempt_at = coalesce(first_attempt_at, $6), last_attempt_at = $6 \
                         WHERE id = ANY({ROW_OF_UNIT_IN_LANE}) AND lane_id = $2 AND actor = $7"
                    ),
                    &[
                        &to_i64(a.unit.0),
                        &a.lane.0,
                        &i64::from(a.attempts),
                        &status,
                        &a.error,
                        &millis_of(a.at),
                        &actor,
                    ],
                )?;
                if n == 1 {
                    t.execute_sql(
                        "UPDATE ol_lanes SET last_status = $2, last_error = $3 WHERE id = $1",
                        &[&a.lane.0, &status, &a.error],
                    )?;
                }
            }
            Ok(())
        })
    }

    fn dead_letter(&self, token: &SlotToken, dead: &DeadLetterRequest) -> Result<(), StoreError> {
        let retention = self.opts.common.ack_retention.is_some();
        self.fenced(token, true, |t| {
            dead_letters::dead_letter(t, token.actor().as_str(), dead, retention)?;
            Ok(())
        })
    }

    fn set_lane_state(
        &self,
        token: &SlotToken,
        lane: StoreLaneId,
        not_before: Option<Timestamp>,
        backoff_level: u32,
    ) -> Result<(), StoreError> {
        self.fenced(token, true, |t| {
            lanes::set_backoff(t, token.actor().as_str(), lane, not_before, backoff_level)
        })
    }

    fn block_lane(
        &self,
        token: &SlotToken,
        lane: StoreLaneId,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.fenced(token, true, |t| {
            lanes::block(t, token.actor().as_str(), lane, reason)
        })
    }

    fn retire_lane(
        &self,
        token: &SlotToken,
        lane: StoreLaneId,
        at: Timestamp,
    ) -> Result<u64, StoreError> {
        let retention = self.opts.common.ack_retention.is_some();
        self.fenced(token, false, |t| {
            dead_letters::dead_letter_lane(
                t,
                token.actor().as_str(),
                lane,
                DeadReason::LaneRetired,
                at,
                None,
                retention,
            )
            .map(|retired| retired.len() as u64)
        })
    }

    fn acquire_ready(
        &self,
        holder: &str,
        lease: Duration,
        now: Timestamp,
        max: usize,
    ) -> Result<Vec<SlotToken>, StoreError> {
        self.register_holder(holder);
        self.tx(false, |t| {
            slots::acquire_ready(t, holder, lease, now, max, |t| {
                self.expire_dead_holders(t, holder, None)
            })
        })
    }

    fn actors_with_work(&self, now: Timestamp) -> Result<ActorsDue, StoreError> {
        self.autocommit(|t| status::actors_with_work(t, now))
    }

    fn notifier(&self) -> Notifier {
        self.notifier.clone()
    }

    fn watch(&self) -> Result<Notifier, StoreError> {
        let mut w = self.watcher.lock().unwrap_or_else(PoisonError::into_inner);
        if w.is_none() {
            let mut client = self.new_conn(false)?.client;
            client.batch_execute(&format!("LISTEN {}", self.channel))?;
            let stop = Arc::new(AtomicBool::new(false));
            let stop2 = Arc::clone(&stop);
            let notifier = self.notifier.clone();
            let config = self.config.clone();
            let tls = self.tls.clone();
            let channel = self.channel.clone();
            let every = self.opts.watch_interval;
            let thread = std::thread::Builder::new()
                .name("outbox-lanes-pg-listen".into())
                .spawn(move || {
                    listen_loop(client, &config, &tls, &channel, &stop2, &notifier, every)
                })
                .map_err(|e| {
                    StoreError::Database(format!("cannot start the watcher thread: {e}"))
                })?;
            *w = Some(Watcher {
                stop,
                thread: Some(thread),
            });
        }
        Ok(self.notifier.clone())
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
