//! Test harness: one fresh database per test, on every backend.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::std_instead_of_core)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_lanes_core::{ActorId, LaneKey, Seq, Timestamp, UnitId};
use outbox_lanes_store::*;

/// The same test bodies against every backend: `contract!(a, b)` makes, for each name, a test
/// in the modules `sqlite_file`, `sqlite_memory`, `postgres` and (feature `sqlx`)
/// `sqlx_postgres` calling `name(Backend::…)`. A test file takes it with
/// `#[macro_use] mod common;`.
#[allow(unused_macros)]
macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod sqlite_file {
            $( #[test] fn $name() { super::$name(super::Backend::SqliteFile) } )*
        }
        mod sqlite_memory {
            $( #[test] fn $name() { super::$name(super::Backend::SqliteMemory) } )*
        }
        mod postgres {
            $( #[test] fn $name() { super::$name(super::Backend::Postgres) } )*
        }
        #[cfg(feature = "sqlx")]
        mod sqlx_postgres {
            $( #[test] fn $name() { super::$name(super::Backend::SqlxPostgres) } )*
        }
    };
}

/// Which database a test body runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    SqliteFile,
    SqliteMemory,
    Postgres,
    /// Postgres through `SqlxPgStore`, on a sqlx pool.
    SqlxPostgres,
}

/// The test server's URL (skipped loudly without it, a failure under `CI`): the same check
/// as every process-level test of the workspace. (Each test crate uses what it needs.)
#[allow(unused_imports)]
pub use outbox_lanes_test_support::{PG_ENV, pg_url};

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn unique_name() -> String {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("ol_t_{}_{}_{}", std::process::id(), n, nanos)
}

enum Kind {
    File {
        _dir: tempfile::TempDir,
        path: PathBuf,
        opts: SqliteOptions,
    },
    Memory,
    #[cfg(feature = "postgres")]
    Pg {
        url: String,
        schema: String,
        opts: PgOptions,
    },
    /// The pool's runtime lives as long as the harness; the store's calls come from the test
    /// thread (outside the runtime, as from a blocking thread).
    #[cfg(feature = "sqlx")]
    SqlxPg {
        url: String,
        schema: String,
        opts: outbox_lanes_store::sqlx::SqlxPgOptions,
        pool: outbox_lanes_store::sqlx::sqlx::PgPool,
        rt: tokio::runtime::Runtime,
    },
}

/// A fresh database and a store on it.
pub struct H {
    pub store: Arc<dyn Store>,
    pub backend: Backend,
    kind: Kind,
    memory: Option<Arc<SqliteStore>>,
}

/// Runs `body` on a fresh database of `backend`, or prints the skip line for Postgres when
/// no server is configured.
pub fn run(backend: Backend, common: CommonOptions, body: impl FnOnce(&mut H)) {
    let Some(mut h) = H::open(backend, common) else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    body(&mut h);
}

impl H {
    pub fn open(backend: Backend, common: CommonOptions) -> Option<H> {
        match backend {
            Backend::SqliteFile => {
                let dir = tempfile::tempdir().expect("tempdir");
                let path = dir.path().join("outbox.db");
                let opts = SqliteOptions {
                    common,
                    ..SqliteOptions::default()
                };
                let store =
                    Arc::new(SqliteStore::open(&path, opts.clone()).expect("open sqlite file"));
                Some(H {
                    store,
                    backend,
                    kind: Kind::File {
                        _dir: dir,
                        path,
                        opts,
                    },
                    memory: None,
                })
            }
            Backend::SqliteMemory => {
                let store = Arc::new(
                    SqliteStore::in_memory_with(SqliteOptions {
                        common,
                        ..SqliteOptions::default()
                    })
                    .expect("open in-memory"),
                );
                Some(H {
                    store: store.clone(),
                    backend,
                    kind: Kind::Memory,
                    memory: Some(store),
                })
            }
            Backend::Postgres => Self::open_pg(common),
            Backend::SqlxPostgres => Self::open_sqlx_pg(common),
        }
    }

    #[cfg(feature = "sqlx")]
    fn open_sqlx_pg(common: CommonOptions) -> Option<H> {
        use outbox_lanes_store::sqlx::{SqlxPgOptions, SqlxPgStore, sqlx};
        let url = pg_url()?;
        let schema = unique_name();
        let opts = SqlxPgOptions {
            schema: schema.clone(),
            common,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let pool = rt
            .block_on(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(8)
                    .connect(&url),
            )
            .expect("sqlx pool");
        let store = rt
            .block_on(SqlxPgStore::new(pool.clone(), opts.clone()))
            .expect("sqlx store");
        Some(H {
            store: Arc::new(store),
            backend: Backend::SqlxPostgres,
            kind: Kind::SqlxPg {
                url,
                schema,
                opts,
                pool,
                rt,
            },
            memory: None,
        })
    }

    #[cfg(not(feature = "sqlx"))]
    fn open_sqlx_pg(_common: CommonOptions) -> Option<H> {
        None
    }

    #[cfg(feature = "postgres")]
    fn open_pg(common: CommonOptions) -> Option<H> {
        let url = pg_url()?;
        let schema = unique_name();
        let opts = PgOptions {
            schema: schema.clone(),
            common,
            ..PgOptions::default()
        };
        let store = Arc::new(PgStore::connect(&url, opts.clone()).expect("connect postgres"));
        Some(H {
            store,
            backend: Backend::Postgres,
            kind: Kind::Pg { url, schema, opts },
            memory: None,
        })
    }

    #[cfg(not(feature = "postgres"))]
    fn open_pg(_common: CommonOptions) -> Option<H> {
        None
    }

    /// Whether the database outlives its store (not for a private in-memory database).
    pub fn can_reopen(&self) -> bool {
        !matches!(self.kind, Kind::Memory)
    }

    /// Another store instance on the same database (the same store for in-memory).
    pub fn second(&self) -> Arc<dyn Store> {
        match &self.kind {
            Kind::File { path, opts, .. } => {
                Arc::new(SqliteStore::open(path, opts.clone()).expect("reopen"))
            }
            Kind::Memory => self.store.clone(),
            #[cfg(feature = "postgres")]
            Kind::Pg { url, opts, .. } => {
                Arc::new(PgStore::connect(url, opts.clone()).expect("reconnect"))
            }
            #[cfg(feature = "sqlx")]
            Kind::SqlxPg { pool, opts, rt, .. } => Arc::new(
                rt.block_on(outbox_lanes_store::sqlx::SqlxPgStore::new(
                    pool.clone(),
                    opts.clone(),
                ))
                .expect("second sqlx store"),
            ),
        }
    }

    /// Drops the store and opens the database again (no-op for in-memory).
    pub fn reopen(&mut self) {
        if self.can_reopen() {
            let second = self.second();
            self.store = second;
        }
    }

    /// Enqueues inside a caller-owned transaction, then rolls it back.
    pub fn enqueue_rolled_back(&self, actor: &ActorId, rows: &[NewRow]) -> Vec<Enqueued> {
        match &self.kind {
            Kind::File { path, .. } => {
                let store = SqliteStore::open(path, SqliteOptions::default()).expect("open");
                let mut conn = outbox_lanes_store::sqlite::rusqlite::Connection::open(path)
                    .expect("caller conn");
                conn.busy_timeout(Duration::from_secs(5)).expect("busy");
                let tx = conn.transaction().expect("tx");
                tx.execute_batch("CREATE TABLE IF NOT EXISTS business (x INTEGER)")
                    .expect("biz");
                let (out, wake) = store.enqueue_in(&tx, actor, rows).expect("enqueue_in");
                drop(wake);
                tx.rollback().expect("rollback");
                out
            }
            Kind::Memory => {
                let store = self.memory.as_ref().expect("memory store");
                let r: Result<Vec<Enqueued>, StoreError> = store.with_transaction(|tx| {
                    let (out, _wake) = store.enqueue_in(tx, actor, rows).map_err(|e| match e {
                        EnqueueError::Store(s) => s,
                        other => StoreError::Database(other.to_string()),
                    })?;
                    assert!(!out.is_empty());
                    // The caller's business write fails: everything rolls back.
                    Err(StoreError::Database("business rule refused".into()))
                });
                assert!(r.is_err());
                Vec::new()
            }
            #[cfg(feature = "postgres")]
            Kind::Pg { url, schema, opts } => {
                let store = PgStore::connect(url, opts.clone()).expect("connect");
                let mut client = pg_client(url, schema);
                let mut tx = client.transaction().expect("tx");
                let (out, _wake) = store.enqueue_in(&mut tx, actor, rows).expect("enqueue_in");
                tx.rollback().expect("rollback");
                out
            }
            #[cfg(feature = "sqlx")]
            Kind::SqlxPg { .. } => self.sqlx_enqueue(actor, rows, false),
        }
    }

    /// Enqueues inside a caller-owned transaction and commits it, then fires the wake-up.
    pub fn enqueue_committed_in_tx(&self, actor: &ActorId, rows: &[NewRow]) -> Vec<Enqueued> {
        match &self.kind {
            Kind::File { path, .. } => {
                let mut conn = outbox_lanes_store::sqlite::rusqlite::Connection::open(path)
                    .expect("caller conn");
                conn.busy_timeout(Duration::from_secs(5)).expect("busy");
                let tx = conn.transaction().expect("tx");
                let sqlite = SqliteStore::open(path, SqliteOptions::default()).expect("open");
                let (out, wake) = sqlite.enqueue_in(&tx, actor, rows).expect("enqueue_in");
                tx.commit().expect("commit");
                wake.fire();
                out
            }
            Kind::Memory => {
                let store = self.memory.as_ref().expect("memory store");
                store
                    .with_transaction(|tx| {
                        store
                            .enqueue_in(tx, actor, rows)
                            .map(|(o, _)| o)
                            .map_err(|e| match e {
                                EnqueueError::Store(s) => s,
                                other => StoreError::Database(other.to_string()),
                            })
                    })
                    .expect("with_transaction")
            }
            #[cfg(feature = "postgres")]
            Kind::Pg { url, schema, opts } => {
                let store = PgStore::connect(url, opts.clone()).expect("connect");
                let mut client = pg_client(url, schema);
                let mut tx = client.transaction().expect("tx");
                let (out, wake) = store.enqueue_in(&mut tx, actor, rows).expect("enqueue_in");
                tx.commit().expect("commit");
                wake.fire();
                out
            }
            #[cfg(feature = "sqlx")]
            Kind::SqlxPg { .. } => self.sqlx_enqueue(actor, rows, true),
        }
    }

    /// Enqueues inside a transaction of the sqlx pool (`SqlxOutbox`), then commits or rolls
    /// it back.
    #[cfg(feature = "sqlx")]
    fn sqlx_enqueue(&self, actor: &ActorId, rows: &[NewRow], commit: bool) -> Vec<Enqueued> {
        let Kind::SqlxPg {
            schema, pool, rt, ..
        } = &self.kind
        else {
            panic!("not a sqlx store");
        };
        let outbox = outbox_lanes_store::sqlx::SqlxOutbox::new()
            .with_schema(schema)
            .expect("schema");
        rt.block_on(async {
            let mut tx = pool.begin().await.expect("begin");
            let out = outbox
                .enqueue(&mut *tx, actor.clone(), rows)
                .await
                .expect("enqueue");
            if commit {
                tx.commit().await.expect("commit");
            } else {
                tx.rollback().await.expect("rollback");
            }
            out
        })
    }

    /// The path of a SQLite file database.
    pub fn sqlite_path(&self) -> Option<PathBuf> {
        match &self.kind {
            Kind::File { path, .. } => Some(path.clone()),
            _ => None,
        }
    }

    /// Postgres URL and schema.
    pub fn pg(&self) -> Option<(String, String)> {
        match &self.kind {
            #[cfg(feature = "postgres")]
            Kind::Pg { url, schema, .. } => Some((url.clone(), schema.clone())),
            #[cfg(feature = "sqlx")]
            Kind::SqlxPg { url, schema, .. } => Some((url.clone(), schema.clone())),
            _ => None,
        }
    }
}

/// A connection to `url` with `schema` on its search path.
#[cfg(feature = "postgres")]
pub fn pg_client(url: &str, schema: &str) -> ::postgres::Client {
    let mut c = ::postgres::Client::connect(url, ::postgres::NoTls).expect("postgres client");
    c.batch_execute(&format!("SET search_path TO {schema}"))
        .expect("search_path");
    c
}

impl Drop for H {
    fn drop(&mut self) {
        #[cfg(feature = "sqlx")]
        if let Kind::SqlxPg {
            schema, pool, rt, ..
        } = &self.kind
        {
            self.store = Arc::new(SqliteStore::in_memory().expect("placeholder"));
            let drop_schema = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
            rt.block_on(async {
                let _ = outbox_lanes_store::sqlx::sqlx::raw_sql(
                    outbox_lanes_store::sqlx::sqlx::AssertSqlSafe(drop_schema),
                )
                .execute(pool)
                .await;
                pool.close().await;
            });
        }
        #[cfg(feature = "postgres")]
        if let Kind::Pg { url, schema, .. } = &self.kind {
            // Drop the store first: its connections must not hold locks on the schema.
            self.store = Arc::new(SqliteStore::in_memory().expect("placeholder"));
            if let Ok(mut c) = ::postgres::Client::connect(url, ::postgres::NoTls) {
                let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
            }
        }
    }
}

// ----- helpers -----

pub fn actor(s: &str) -> ActorId {
    ActorId::new(s)
}

pub fn row(id: &str, to: &[&str]) -> NewRow {
    NewRow {
        id: id.to_string(),
        body: format!("{{\"id\":\"{id}\"}}").into_bytes(),
        content_type: "application/json".into(),
        recipients: to.iter().map(|s| s.to_string()).collect(),
        ..NewRow::default()
    }
}

pub fn key(url: &str) -> LaneKey {
    LaneKey::new(url, None).expect("valid url")
}

pub fn now() -> Timestamp {
    Timestamp::from_system_time(std::time::SystemTime::now())
}

pub const LEASE: Duration = Duration::from_secs(60);

pub fn acquire(store: &dyn Store, a: &ActorId, holder: &str, lease: Duration) -> SlotToken {
    match store.acquire_slot(a, holder, lease).expect("acquire") {
        SlotAcquisition::Acquired(t) => t,
        SlotAcquisition::Held => panic!("slot of {a} unexpectedly held"),
    }
}

/// Acquires, retrying until a held slot's lease expires (bounded).
pub fn acquire_eventually(
    store: &dyn Store,
    a: &ActorId,
    holder: &str,
    lease: Duration,
) -> SlotToken {
    for _ in 0..2000 {
        if let SlotAcquisition::Acquired(t) = store.acquire_slot(a, holder, lease).expect("acquire")
        {
            return t;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("slot of {a} never became free");
}

pub fn lane_of(store: &dyn Store, a: &ActorId, url: &str) -> StoreLaneId {
    store
        .find_lane(a, &key(url))
        .expect("find_lane")
        .expect("lane exists")
}

/// Claims one lane from `from`, returning (unit, seq, row id).
pub fn claim_lane(
    store: &dyn Store,
    t: &SlotToken,
    lane: StoreLaneId,
    from: u64,
    limit: u32,
) -> ClaimedLane {
    let mut v = store
        .claim(
            t,
            &[ClaimRange {
                lane,
                from: Seq(from),
                limit,
            }],
        )
        .expect("claim");
    assert_eq!(v.len(), 1);
    v.remove(0)
}

pub fn row_ids(c: &ClaimedLane) -> Vec<String> {
    c.units.iter().map(|u| u.row_id.clone()).collect()
}

pub fn unit_ids(c: &ClaimedLane) -> Vec<UnitId> {
    c.units.iter().map(|u| u.id).collect()
}

/// Waits (bounded) until some Postgres backend waits for a lock while running a statement
/// containing `marker`. If none is seen in time the caller goes on: its test still checks the
/// outcome, only less sharply (the interleaving it wanted may not have happened).
#[cfg(feature = "postgres")]
pub fn until_waiting_on_a_lock(url: &str, marker: &str) {
    let mut probe = ::postgres::Client::connect(url, ::postgres::NoTls).expect("probe");
    for _ in 0..500 {
        let n: i64 = probe
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND strpos(query, $1) > 0",
                &[&marker],
            )
            .expect("activity")
            .get(0);
        if n > 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
