//! The tokio runtime on a caller's sqlx pool (`SqlxPgStore`): no blocking Postgres client in
//! the process, the store's calls on tokio's blocking pool. Rows enqueued inside the service's
//! own sqlx transactions reach a real recipient on loopback, in order, woken by the store's
//! LISTEN; rows enqueued through the outbox go the same way. And what a relay adds to the
//! server's connections beside the service's pool, on `SqlxPgStore` and on `PgStore`, counted
//! in `pg_stat_activity` by `application_name`.
#![allow(missing_docs)]
#![cfg(feature = "tokio")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use outbox_lanes_store::Store;
use outbox_lanes_store::core_types::ActorId;
use outbox_lanes_store::sqlx::{SqlxOutbox, SqlxPgOptions, SqlxPgStore, sqlx};
use outbox_lanes_test_support::Recipient;
use outbox_lanes_tokio::{Monitor, Outbox};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// The service's pool: at most 4 connections, named `app` in `pg_stat_activity`.
async fn service_pool(url: &str, app: &str) -> PgPool {
    let options: PgConnectOptions = url.parse().expect("the test server's URL");
    PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.application_name(app))
        .await
        .expect("pool")
}

async fn drop_schema(pool: &PgPool, schema: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE"
    )))
    .execute(pool)
    .await
    .expect("drop schema");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_runs_on_the_services_sqlx_pool() {
    let Some(url) = outbox_lanes_test_support::pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let schema = format!("ol_tokio_sqlx_{}", std::process::id());
    let pool = service_pool(&url, "ol_t_sqlx_relay").await;
    let opts = SqlxPgOptions {
        schema: schema.clone(),
        ..SqlxPgOptions::default()
    };
    // On the executor: the schema's work goes to the blocking pool by itself.
    let store = SqlxPgStore::new(pool.clone(), opts).await.expect("store");
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
                ActorId::new("alice"),
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

    let _ = monitor.stop().await;
    let _ = outbox.shutdown().await;
    // The acks are durable: nothing is pending.
    let status = outbox.status().await.expect("status");
    assert!(status.iter().all(|s| s.pending == 0), "{status:?}");
    drop(outbox);
    drop_schema(&pool, &schema).await;
}

/// The server's connections whose `application_name` is `app`.
async fn connections(admin: &PgPool, app: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
        .bind(app)
        .fetch_one(admin)
        .await
        .expect("pg_stat_activity")
}

/// A relay on `store` delivers 6 rows of 2 actors through its monitor; returns, the monitor
/// still running (its LISTEN held, as in a running service), once they are delivered and
/// acked.
async fn deliver_six(store: Arc<dyn Store>) -> (Outbox, Monitor, Arc<Recipient>) {
    let r = Arc::new(Recipient::start().expect("recipient"));
    let outbox = Outbox::open(store, common::wake_only_config(usize::MAX)).expect("outbox");
    let monitor = outbox.monitor().await.expect("monitor");
    for i in 0..6 {
        let actor = if i % 2 == 0 { "alice" } else { "bob" };
        outbox
            .enqueue(actor, &[common::row(&format!("e{i}"), &[r.url("/inbox")])])
            .await
            .expect("enqueue");
    }
    assert!(common::wait_on(outbox.runtime(), &r, "/inbox", 6).await);
    for _ in 0..500 {
        let status = outbox.status().await.expect("status");
        if status.iter().all(|s| s.pending == 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (outbox, monitor, r)
}

async fn stop(relay: (Outbox, Monitor, Arc<Recipient>)) {
    let (outbox, monitor, _r) = relay;
    let _ = monitor.stop().await;
    let _ = outbox.shutdown().await;
}

/// Counts, bounded, until `want(n)` or the last reading.
async fn settled(admin: &PgPool, app: &str, want: impl Fn(i64) -> bool) -> i64 {
    let mut n = connections(admin, app).await;
    for _ in 0..200 {
        if want(n) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        n = connections(admin, app).await;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_on_the_pool_adds_one_connection_outside_it() {
    let Some(url) = outbox_lanes_test_support::pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let pid = std::process::id();
    let app = format!("ol_t_svc_sqlx_{pid}");
    let schema = format!("ol_tokio_sqlx_conns_{pid}");
    let admin = service_pool(&url, &format!("ol_t_admin_{pid}")).await;
    let pool = service_pool(&url, &app).await;
    let opts = SqlxPgOptions {
        schema: schema.clone(),
        ..SqlxPgOptions::default()
    };
    let store = SqlxPgStore::new(pool.clone(), opts).await.expect("store");
    let relay = deliver_six(Arc::new(store)).await;
    // The pool's own (the service's queries, the store's transactions and its LISTEN, at most
    // max_connections) and one outside it: the holder's liveness session.
    let in_pool = i64::from(pool.size());
    let n = settled(&admin, &app, |n| n == in_pool + 1).await;
    println!(
        "SqlxPgStore beside a pool of 4: {n} connections named {app} ({in_pool} in the pool, \
         {} outside it)",
        n - in_pool
    );
    assert!(in_pool <= 4, "the pool keeps to its size: {in_pool}");
    assert_eq!(n, in_pool + 1, "one liveness connection outside the pool");
    stop(relay).await;
    drop_schema(&admin, &schema).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_on_pgstore_opens_its_own_connections() {
    use outbox_lanes_store::{PgOptions, PgStore};
    let Some(url) = outbox_lanes_test_support::pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let pid = std::process::id();
    let (app, relay_app) = (format!("ol_t_svc_pg_{pid}"), format!("ol_t_relay_pg_{pid}"));
    let schema = format!("ol_tokio_pg_conns_{pid}");
    let admin = service_pool(&url, &format!("ol_t_admin_pg_{pid}")).await;
    let pool = service_pool(&url, &app).await;
    let opts = PgOptions {
        schema: schema.clone(),
        application_name: relay_app.clone(),
        ..PgOptions::default()
    };
    let pg_url = outbox_lanes_test_support::pg_url_without_tls(&url);
    let store = tokio::task::spawn_blocking(move || PgStore::connect(&pg_url, opts))
        .await
        .expect("join")
        .expect("connect");
    let relay = deliver_six(Arc::new(store)).await;
    let services = settled(&admin, &app, |n| n == i64::from(pool.size())).await;
    // Its pool (up to `pool_size`, 4), its LISTEN and the holder's liveness session.
    let relays = settled(&admin, &relay_app, |n| n >= 3).await;
    println!(
        "PgStore beside a pool of 4: {services} connections named {app} (the service's pool), \
         {relays} named {relay_app} (the relay's own)"
    );
    assert!(
        (3..=6).contains(&relays),
        "pool, LISTEN and liveness: {relays}"
    );
    stop(relay).await;
    drop_schema(&admin, &schema).await;
}
