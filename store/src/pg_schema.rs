//! The Postgres schema of [`PgStore`](crate::PgStore) and `SqlxPgStore`, which the `sqlx`
//! module's enqueue checks too: the tables of `SCHEMA.md`, the migrations, the planner
//! settings of the store's sessions, opening a schema ([`current`], and under [`lock_ddl`]
//! [`create_or_migrate`], which creates or migrates it in a transaction), and the holders'
//! liveness locks ([`take_live_lock`], [`holder_is_dead`]).
//!
//! Any number of processes may open one schema at once, the first ones on a database where it
//! does not exist yet: the DDL lock serialises them, and the one that finds the schema made
//! under it runs no DDL. That finding needs a transaction begun *after* the lock was granted
//! (see [`lock_ddl`]).

use crate::db::{Db, Sql, args};
use crate::util::needs_ddl;
use crate::{SCHEMA_VERSION, SchemaPolicy, StoreError};

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
/// database (re-exported by the `postgres` module).
pub(crate) const SCHEMA_V1: &str = concat!(
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
pub(crate) const SCHEMA_V2: &str = concat!(
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

/// Version 2 to 3 (SCHEMA.md "Migrations"): the rows' own request headers.
const MIGRATE_V2_TO_V3: &str = "ALTER TABLE ol_units ADD COLUMN headers TEXT; \
     ALTER TABLE ol_rows ADD COLUMN headers TEXT; \
     UPDATE ol_meta SET value = '3' WHERE key = 'schema_version';";

/// Version 3 to 4 (SCHEMA.md "Migrations"): the lane-control generations (OL-14).
const MIGRATE_V3_TO_V4: &str = "ALTER TABLE ol_slots ADD COLUMN control BIGINT NOT NULL DEFAULT 0; \
     ALTER TABLE ol_lanes ADD COLUMN control BIGINT NOT NULL DEFAULT 0; \
     CREATE INDEX ol_lanes_control ON ol_lanes (actor, control) WHERE control > 0; \
     UPDATE ol_meta SET value = '4' WHERE key = 'schema_version';";

/// Version 4 to 5 (SCHEMA.md "Migrations"): the row-id ledger, the outbox id, the liveness table.
const MIGRATE_V4_TO_V5: &str = "CREATE TABLE ol_row_ids (actor TEXT NOT NULL, row_id TEXT NOT NULL, \
         enqueued_at BIGINT NOT NULL, PRIMARY KEY (actor, row_id)); \
     CREATE INDEX ol_row_ids_at ON ol_row_ids (enqueued_at); \
     INSERT INTO ol_row_ids (actor, row_id, enqueued_at) \
         SELECT actor, row_id, coalesce(enqueued_at, 0) FROM ol_units WHERE row_id IS NOT NULL \
         ON CONFLICT DO NOTHING; \
     INSERT INTO ol_row_ids (actor, row_id, enqueued_at) \
         SELECT actor, row_id, enqueued_at FROM ol_rows ON CONFLICT DO NOTHING; \
     CREATE TABLE IF NOT EXISTS ol_live_holders (holder TEXT PRIMARY KEY); \
     CREATE INDEX IF NOT EXISTS ol_slots_holder ON ol_slots (holder) WHERE holder IS NOT NULL; \
     INSERT INTO ol_meta (key, value) VALUES ('outbox_id', replace(gen_random_uuid()::text, '-', '')) \
         ON CONFLICT DO NOTHING; \
     UPDATE ol_meta SET value = '5' WHERE key = 'schema_version';";

/// Version 5 to 6 (SCHEMA.md "Migrations"): the hosts the relays share (`hosts.rs`).
const MIGRATE_V5_TO_V6: &str = "CREATE TABLE ol_hosts (origin TEXT PRIMARY KEY, \
         failures BIGINT NOT NULL DEFAULT 0, level BIGINT NOT NULL DEFAULT 0, not_before BIGINT, \
         failing_since BIGINT, last_error TEXT, blocked BIGINT NOT NULL DEFAULT 0, spec TEXT, \
         spec_at BIGINT, updated_at BIGINT NOT NULL); \
     UPDATE ol_meta SET value = '6' WHERE key = 'schema_version';";

/// Version 6 to 7 (SCHEMA.md "Migrations"): a lane's run of failures (issue 41).
const MIGRATE_V6_TO_V7: &str = "ALTER TABLE ol_lanes ADD COLUMN failing_since BIGINT; \
     ALTER TABLE ol_lanes ADD COLUMN unavailable_since BIGINT; \
     UPDATE ol_meta SET value = '7' WHERE key = 'schema_version';";

/// Version 7 to 8 (SCHEMA.md "Migrations"): the delivery log and the lanes' in-flight marks
/// (issue 39).
const MIGRATE_V7_TO_V8: &str = "CREATE TABLE ol_delivery_log (id BIGSERIAL PRIMARY KEY, \
         actor TEXT NOT NULL, row_id TEXT NOT NULL, unit_id BIGINT NOT NULL, \
         lane_id BIGINT NOT NULL, attempt BIGINT NOT NULL, started_at BIGINT NOT NULL, \
         duration_ms BIGINT NOT NULL, status BIGINT, error_class TEXT, body TEXT, \
         delivered BOOLEAN NOT NULL DEFAULT FALSE); \
     CREATE INDEX ol_delivery_log_row ON ol_delivery_log (actor, row_id); \
     ALTER TABLE ol_lanes ADD COLUMN in_flight_since BIGINT; \
     ALTER TABLE ol_lanes ADD COLUMN in_flight_unit BIGINT; \
     CREATE INDEX ol_lanes_in_flight ON ol_lanes (in_flight_since) \
         WHERE in_flight_since IS NOT NULL; \
     UPDATE ol_meta SET value = '8' WHERE key = 'schema_version';";

/// The migrations past version 2 and the version each reaches: a new schema runs them too.
const MIGRATIONS: [(u32, &str); 6] = [
    (3, MIGRATE_V2_TO_V3),
    (4, MIGRATE_V3_TO_V4),
    (5, MIGRATE_V4_TO_V5),
    (6, MIGRATE_V5_TO_V6),
    (7, MIGRATE_V6_TO_V7),
    (8, MIGRATE_V7_TO_V8),
];

/// A schema name the store accepts: lower-case letters, digits and `_`, not starting with a
/// digit, at most 48 bytes (it is written into SQL and into the wake-up channel's name).
pub(crate) fn valid_schema(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 48
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !s.as_bytes()[0].is_ascii_digit()
}

/// The wake-up channel of the store in `schema` (LISTEN/NOTIFY).
pub(crate) fn channel(schema: &str) -> String {
    format!("outbox_lanes_{schema}")
}

/// The settings every statement of the store runs under, as `SET` statements (`scope`: empty
/// for a session, `LOCAL` for one transaction): the schema first on the `search_path`, and a
/// planner that can only follow indexes.
///
/// Queue tables churn faster than their statistics follow: a plan made while a table looked
/// empty would scan it whole once it is deep (a hash join reading every row id of the actor to
/// check a batch of 100, say). Every statement of the store has an ordered index path, so its
/// own sessions plan no sequential or bitmap scans and join by index probes only (claims must
/// cost what they return, never a lane's depth, whatever the statistics say). Prepared
/// statements always run their generic plan: the server otherwise re-plans some of them at
/// every execution (the enqueue's plan statement took 0.4 ms for one row that way), and with
/// these settings no plan depends on the values. The hot statements go further and are
/// written so that no plan can read a table whole: a lookup driven by another row is a
/// `LATERAL (… LIMIT n)`, an `EXISTS (… OFFSET 0)` (OFFSET keeps it a per-row subplan instead
/// of a join) or an `id = ANY(ARRAY(…))`, each an index probe whatever the statistics.
/// No JIT either: a plan that must pay a disabled plan type's cost penalty looks expensive
/// enough to be compiled, which took 112 ms on a 100-row table (the liveness check, before its
/// index) — on every execution.
pub(crate) fn settings(scope: &str, schema: &str) -> String {
    format!(
        "SET {scope} search_path TO {schema}; SET {scope} enable_seqscan = off; \
         SET {scope} enable_bitmapscan = off; SET {scope} enable_hashjoin = off; \
         SET {scope} enable_mergejoin = off; SET {scope} plan_cache_mode = force_generic_plan; \
         SET {scope} jit = off"
    )
}

/// The lock that serialises DDL on one schema (`$1`: its wake-up channel), for the session.
/// Its key is the one processes of earlier versions take for their transaction, so they
/// exclude each other too.
static LOCK_DDL: Sql = Sql::new("SELECT pg_advisory_lock(hashtext($1))");
static UNLOCK_DDL: Sql = Sql::new("SELECT pg_advisory_unlock(hashtext($1))");
static HAS_META: Sql = Sql::new("SELECT to_regclass($1) IS NOT NULL");
/// The schema version (text), on either dialect.
pub(crate) static VERSION: Sql = Sql::new("SELECT value FROM ol_meta WHERE key = 'schema_version'");
static OUTBOX_ID: Sql = Sql::new("SELECT value FROM ol_meta WHERE key = 'outbox_id'");
static CREATED_AS_V2: Sql =
    Sql::new("INSERT INTO ol_meta (key, value) VALUES ('schema_version', '2')");

/// The schema version `schema` records, without writing anything: `None` when it has no
/// outbox schema.
pub(crate) fn version(db: &mut impl Db, schema: &str) -> Result<Option<u32>, StoreError> {
    let meta = format!("{schema}.ol_meta");
    if !db.query_one(&HAS_META, args![meta.as_str()], |r| r.flag(0))? {
        return Ok(None);
    }
    db.query_opt(&VERSION, &[], |r| r.text(0))?
        .as_deref()
        .map(crate::util::parse_version)
        .transpose()
}

/// The outbox id of `schema` (first on `db`'s `search_path`) if it is current, read without a
/// lock or a write, so a read-only role opens it; `None` when `policy` lets it be created or
/// migrated and it must be: then [`create_or_migrate`] under [`lock_ddl`].
///
/// # Errors
/// [`StoreError::SchemaTooNew`] for a database from a newer version;
/// [`StoreError::SchemaTooOld`] or [`StoreError::NoSchema`] when `policy` forbids the DDL it
/// would take; database failures.
pub(crate) fn current(
    db: &mut impl Db,
    schema: &str,
    policy: SchemaPolicy,
) -> Result<Option<String>, StoreError> {
    let target = || format!("Postgres schema {schema:?}");
    if needs_ddl(version(db, schema)?, policy, target)? {
        return Ok(None);
    }
    outbox_id(db).map(Some)
}

/// Takes the DDL lock of the schema whose wake-up channel is `channel` for `db`'s session
/// (outside a transaction), waiting for whoever holds it; [`unlock_ddl`] gives it back.
///
/// A session lock, not a transaction's, because whoever gets it must look at the schema again
/// in a transaction that begins after that: a Postgres backend's catalog caches (what
/// `to_regclass` reads, and the schema a name resolves to) catch up with other sessions'
/// commits when a transaction begins or when it locks a table, and taking an advisory lock
/// does neither. Inside the transaction that waited for the lock, a schema the holder created
/// and committed meanwhile still looks missing, and DDL run on that belief fails on the rows
/// and tables already there (`duplicate key value violates unique constraint "ol_meta_pkey"`).
///
/// # Errors
/// Database failures.
pub(crate) fn lock_ddl(db: &mut impl Db, channel: &str) -> Result<(), StoreError> {
    db.execute(&LOCK_DDL, args![channel]).map(drop)
}

/// Gives back the lock [`lock_ddl`] took.
///
/// # Errors
/// Database failures (the lock then goes with the session, which the caller closes).
pub(crate) fn unlock_ddl(db: &mut impl Db, channel: &str) -> Result<(), StoreError> {
    db.execute(&UNLOCK_DDL, args![channel]).map(drop)
}

/// Creates the tables in `schema` (first on `db`'s `search_path`), or migrates them to
/// [`SCHEMA_VERSION`], as `policy` allows, inside the caller's transaction, and returns the
/// outbox id. The transaction must have begun after [`lock_ddl`] (see there): it reads the
/// version again and runs no DDL when another process made or migrated the schema meanwhile.
///
/// # Errors
/// As [`current`]; database failures (a role without the privilege to create).
pub(crate) fn create_or_migrate(
    db: &mut impl Db,
    schema: &str,
    policy: SchemaPolicy,
) -> Result<String, StoreError> {
    let target = || format!("Postgres schema {schema:?}");
    let found = version(db, schema)?;
    if needs_ddl(found, policy, target)? {
        ddl(db, schema, found)?;
    }
    outbox_id(db)
}

/// The outbox id `ol_meta` records (made with the schema).
fn outbox_id(db: &mut impl Db) -> Result<String, StoreError> {
    db.query_opt(&OUTBOX_ID, &[], |r| r.text(0))?
        .ok_or_else(|| StoreError::Database("the schema has no outbox_id in ol_meta".into()))
}

/// Whether the schema `$1` exists.
static SCHEMA_EXISTS: Sql =
    Sql::new("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)");

/// Creates (`found` is `None`) or migrates the schema, under [`lock_ddl`].
fn ddl(db: &mut impl Db, schema: &str, found: Option<u32>) -> Result<(), StoreError> {
    match found {
        None => {
            // Created as version 2 and migrated at once: new and migrated databases
            // cannot differ. A schema that exists (a DBA made it, and gave it to this role)
            // is used as it is: `CREATE SCHEMA IF NOT EXISTS` would ask for `CREATE` on the
            // database first, even for a schema that exists.
            if !db.query_one(&SCHEMA_EXISTS, args![schema], |r| r.flag(0))? {
                db.batch(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))?;
            }
            db.batch(
                "CREATE TABLE IF NOT EXISTS ol_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            )?;
            db.execute(&CREATED_AS_V2, &[])?;
            db.batch(SCHEMA_V2)?;
            for (_, ddl) in MIGRATIONS {
                db.batch(ddl)?;
            }
        }
        Some(found) => {
            tracing::info!(target: "outbox_lanes::store", schema, from = found, to = SCHEMA_VERSION, "migrating the Postgres schema");
            if found < 2 {
                db.batch(MIGRATE_V1_TO_V2)?;
            }
            for (_, ddl) in MIGRATIONS.iter().filter(|(to, _)| found < *to) {
                db.batch(ddl)?;
            }
        }
    }
    Ok(())
}

/// Takes the session advisory lock of a registered holder if nobody holds it: `$1` is the
/// holder's [`live_key`], `$2` the holder. The first key is `'ol'` (0x6f6c), the second a hash
/// of the schema and the holder name. No row: the holder registered no liveness.
static TRY_LIVE_LOCK_OF: Sql = Sql::new(
    "SELECT pg_try_advisory_lock(28524, hashtext($1)) FROM ol_live_holders WHERE holder = $2",
);
static TRY_LIVE_LOCK: Sql = Sql::new("SELECT pg_try_advisory_lock(28524, hashtext($1))");
static LIVE_UNLOCK: Sql = Sql::new("SELECT pg_advisory_unlock(28524, hashtext($1))");
/// Registers a holder that keeps a liveness lock.
static REGISTER_HOLDER: Sql =
    Sql::new("INSERT INTO ol_live_holders (holder) VALUES ($1) ON CONFLICT DO NOTHING");
static FORGET_HOLDER: Sql = Sql::new("DELETE FROM ol_live_holders WHERE holder = $1");

/// The advisory-lock name of `holder` in `schema`.
fn live_key(schema: &str, holder: &str) -> String {
    format!("{schema}/{holder}")
}

/// Liveness beside the lease: on `db`, a session of its own that the store keeps open for as
/// long as it lives, `holder` takes its session advisory lock and is listed in
/// `ol_live_holders` (so that a holder of an older version, without a lock, is never taken for
/// dead). The server drops the lock when that session ends — the process died (even by
/// SIGKILL) or lost its connection — and other relays then take the holder's slots over at
/// once (with new fencing tokens) instead of after their lease. `false`: another live session
/// holds it.
///
/// # Errors
/// Database failures (then there is no liveness: the lease still bounds everything).
pub(crate) fn take_live_lock(
    db: &mut impl Db,
    schema: &str,
    holder: &str,
) -> Result<bool, StoreError> {
    let key = live_key(schema, holder);
    let got = db.query_one(&TRY_LIVE_LOCK, args![&key], |r| r.flag(0))?;
    if got {
        db.execute(&REGISTER_HOLDER, args![holder])?;
    }
    Ok(got)
}

/// Logs a holder's liveness lock that could not be taken: its slots wait for their lease.
pub(crate) fn log_no_live_lock(holder: &str, why: Option<&StoreError>) {
    match why {
        None => tracing::warn!(target: "outbox_lanes::store", holder,
            "another live session holds this holder's lock (a holder name used twice?); its slots wait for their lease"),
        Some(e) => tracing::debug!(target: "outbox_lanes::store", holder, error = %e,
            "no liveness lock; slots of this holder wait for their lease"),
    }
}

/// A holder's clean stop, on the session that holds its liveness lock (which the caller then
/// closes, freeing the lock): holding no drain slot any more, it leaves `ol_live_holders`, so
/// that a relay's restarts do not leave a row each behind. One that still holds a slot (a
/// pass cut off when a shutdown grace ended) stays listed: once its session is gone, other
/// relays find it dead and take its slots over at once. Whether it left.
///
/// # Errors
/// Database failures (the row then stays; it is harmless, and forgotten when another relay
/// finds the holder dead).
pub(crate) fn leave_live_holders(db: &mut impl Db, holder: &str) -> Result<bool, StoreError> {
    if crate::slots::holds_a_slot(db, holder)? {
        return Ok(false);
    }
    Ok(db.execute(&FORGET_HOLDER, args![holder])? > 0)
}

/// Whether `holder`, which holds a live slot, is dead: its lock, taken at once when nobody
/// holds it, is given back at once (a session lock outlives the transaction) and the holder
/// forgotten. Never for a holder that registered no liveness.
///
/// # Errors
/// Database failures.
pub(crate) fn holder_is_dead(
    db: &mut impl Db,
    schema: &str,
    holder: &str,
) -> Result<bool, StoreError> {
    let key = live_key(schema, holder);
    if db.query_opt(&TRY_LIVE_LOCK_OF, args![&key, holder], |r| r.flag(0))? != Some(true) {
        return Ok(false);
    }
    db.query_one(&LIVE_UNLOCK, args![&key], |r| r.flag(0))?;
    db.execute(&FORGET_HOLDER, args![holder])?;
    Ok(true)
}
