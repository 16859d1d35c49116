//! The tokio runtime on a caller's sqlx pool (`SqlxPgStore`): no blocking Postgres client in
//! the process, the store's calls on tokio's blocking pool. Rows enqueued inside the service's
//! own sqlx transactions reach a real recipient on loopback, in order, woken by the store's
//! LISTEN; rows enqueued through the outbox go the same way.
#![allow(missing_docs)]

mod common;

use std::sync::Arc;

use outbox_lanes_store::core_types::ActorId;
use outbox_lanes_store::sqlx::{SqlxOutbox, SqlxPgOptions, SqlxPgStore, sqlx};
use outbox_lanes_test_support::Recipient;
use outbox_lanes_tokio::Outbox;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_runs_on_the_services_sqlx_pool() {
    let Some(url) = outbox_lanes_test_support::pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let schema = format!("ol_tokio_sqlx_{}", std::process::id());
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .expect("pool");
    let opts = SqlxPgOptions {
        schema: schema.clone(),
        ..SqlxPgOptions::default()
    };
    let p = pool.clone();
    // Making the store creates the schema: it blocks, off the async workers.
    let store = tokio::task::spawn_blocking(move || SqlxPgStore::new(p, opts))
        .await
        .expect("join")
        .expect("store");
    let r = Arc::new(Recipient::start().expect("recipient"));
    let outbox =
        Outbox::open(Arc::new(store), common::wake_only_config(usize::MAX)).expect("outbox");
    let monitor = outbox.monitor().await.expect("monitor");

    // The service's own transaction: nothing wakes this process but the commit's NOTIFY.
    let enqueue = SqlxOutbox::new().with_schema(&schema).expect("schema");
    let mut tx = pool.begin().await.expect("begin");
    for i in 0..3 {
        enqueue
            .enqueue(
                &mut *tx,
                &ActorId::new("alice"),
                &[common::row(&format!("e{i}"), &[r.url("/inbox")])],
            )
            .await
            .expect("enqueue in tx");
    }
    tx.commit().await.expect("commit");
    assert!(common::wait_on(outbox.runtime(), &r, "/inbox", 3).await);
    // Through the outbox too.
    for i in 3..6 {
        outbox
            .enqueue(
                "alice",
                &[common::row(&format!("e{i}"), &[r.url("/inbox")])],
            )
            .await
            .expect("enqueue");
    }
    assert!(common::wait_on(outbox.runtime(), &r, "/inbox", 6).await);
    assert_eq!(
        common::bodies(&r, "/inbox"),
        common::ids(6),
        "in order, once"
    );
    common::one_in_flight(&r, "/inbox");

    monitor.stop().await;
    outbox.shutdown().await;
    // The acks are durable: nothing is pending.
    let status = outbox.status().await.expect("status");
    assert!(status.iter().all(|s| s.pending == 0), "{status:?}");
    drop(outbox);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE"
    )))
    .execute(&pool)
    .await
    .expect("drop schema");
}
