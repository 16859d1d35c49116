//! Rows enqueued inside a caller's sqlx transaction are delivered by `Outbox::drain` (the
//! blocking runtime on a store opened the usual way) to loopback recipients, in order per
//! recipient, with their headers: on a SQLite file and on Postgres. (In this package because
//! it needs sqlx and tokio, which the facade's own dev-dependencies leave out.)
#![allow(missing_docs)]

use std::sync::Arc;

use outbox_lanes::blocking::{Outbox, OutboxConfig};
use outbox_lanes::core::ActorId;
use outbox_lanes::sqlx;
use outbox_lanes::store::sqlx::SqlxOutbox;
use outbox_lanes::store::{NewRow, PgOptions, PgStore, SqliteOptions, SqliteStore, Store};
use outbox_lanes_test_support::{Recipient, pg_url};
use sqlx::Connection as _;

fn row(id: &str, to: &[&str]) -> NewRow {
    NewRow {
        id: id.into(),
        body: id.as_bytes().to_vec(),
        content_type: "text/plain".into(),
        recipients: to.iter().map(|s| s.to_string()).collect(),
        ..NewRow::default()
    }
}

/// Enqueues through sqlx on `conn`, drains with the blocking runtime, checks what arrived.
fn enqueue_then_drain<C>(
    rt: &tokio::runtime::Runtime,
    store: Arc<dyn Store>,
    conn: &mut C,
    outbox: &SqlxOutbox,
) where
    C: sqlx::Connection + outbox_lanes::store::sqlx::SqlxConnection,
{
    let (a, b) = (
        Recipient::start().expect("a"),
        Recipient::start().expect("b"),
    );
    let (ia, ib) = (a.url("/inbox"), b.url("/inbox"));
    let mut r2 = row("r2", &[&ia]);
    r2.headers = vec![("X-Trace".into(), "42".into())];
    let mut r3 = row("r3", &[&ia, &ib]);
    r3.joined = true;
    let r4 = row("r4", &[&ib]);
    // The relay opens first: allowing loopback, it widens the outbox's destination policy
    // (OL-24), which the service's enqueue below is judged by.
    let relay =
        Outbox::open(store.clone(), OutboxConfig::default().allow_loopback()).expect("outbox");
    // The runtime the connection was opened on (its socket is registered there).
    rt.block_on(async {
        let actor = ActorId::new("alice");
        // Two transactions: the order across them is the commit order.
        let mut tx = conn.begin().await.expect("begin");
        outbox
            .enqueue(&mut *tx, &actor, &[row("r1", &[&ia, &ib]), r2])
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        let mut tx = conn.begin().await.expect("begin");
        outbox
            .enqueue(&mut *tx, &actor, &[r3, r4])
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
    });
    relay.drain("alice").expect("drain");
    let got = |r: &Recipient| -> Vec<String> {
        r.bodies("/inbox")
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect()
    };
    assert_eq!(got(&a), ["r1", "r2", "r3"]);
    assert_eq!(got(&b), ["r1", "r3", "r4"]);
    assert_eq!(a.requests("/inbox")[1].header("x-trace"), Some("42"));
    let pending: u64 = store
        .status()
        .expect("status")
        .iter()
        .map(|s| s.pending)
        .sum();
    assert_eq!(pending, 0);
}

#[test]
fn sqlite_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("outbox.db");
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&path, SqliteOptions::default()).expect("store"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(&path);
    let mut conn = rt
        .block_on(sqlx::SqliteConnection::connect_with(&opts))
        .expect("sqlx");
    enqueue_then_drain(&rt, store, &mut conn, &SqlxOutbox::new());
}

#[test]
fn postgres() {
    let Some(url) = pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let schema = format!("ol_sqlx_drain_{}", std::process::id());
    let opts = PgOptions {
        schema: schema.clone(),
        ..PgOptions::default()
    };
    let store: Arc<dyn Store> = Arc::new(PgStore::connect(&url, opts).expect("store"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut conn = rt
        .block_on(sqlx::PgConnection::connect(&url))
        .expect("sqlx");
    let outbox = SqlxOutbox::new().with_schema(&schema).expect("schema");
    enqueue_then_drain(&rt, store, &mut conn, &outbox);
    rt.block_on(
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
            .execute(&mut conn),
    )
    .expect("drop schema");
}
