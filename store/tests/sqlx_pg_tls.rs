//! Which sqlx pools `SqlxPgStore` takes: it refuses, before it connects, a pool whose connect
//! options ask for `verify-ca` / `verify-full` or carry a root certificate (sqlx's TLS does
//! not verify as libpq does), naming `PgStore::connect`; it takes `disable`, `allow`, `prefer`
//! and `require` without one. A pool too small for the store's `LISTEN` is refused too.
#![allow(missing_docs, clippy::unwrap_used, clippy::std_instead_of_core)]
#![cfg(feature = "sqlx")]

use std::time::Duration;

use outbox_lanes_store::sqlx::sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use outbox_lanes_store::sqlx::{SqlxPgOptions, SqlxPgStore};
use outbox_lanes_store::{ServiceStore as _, StoreError};

/// A pool that has not connected, and will not before its first use, to a closed loopback
/// port: any connection attempt fails.
fn lazy(options: PgConnectOptions) -> outbox_lanes_store::sqlx::sqlx::PgPool {
    PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(options.host("127.0.0.1").port(1))
}

fn refusal(e: &StoreError) -> bool {
    e.to_string().contains("SqlxPgStore refuses")
}

#[tokio::test]
async fn a_pool_that_verifies_the_server_is_refused_before_connecting_naming_pgstore() {
    let cases = [
        (
            PgConnectOptions::new_without_pgpass().ssl_mode(PgSslMode::VerifyFull),
            "sslmode=verify-full",
        ),
        (
            PgConnectOptions::new_without_pgpass().ssl_mode(PgSslMode::VerifyCa),
            "sslmode=verify-ca",
        ),
        (
            PgConnectOptions::new_without_pgpass()
                .ssl_mode(PgSslMode::Require)
                .ssl_root_cert("/nonexistent/ca.pem"),
            "a root certificate",
        ),
    ];
    for (options, what) in cases {
        let pool = lazy(options);
        let e = SqlxPgStore::new(pool.clone(), SqlxPgOptions::default())
            .await
            .expect_err("refused");
        let text = e.to_string();
        assert!(matches!(e, StoreError::Open { .. }), "{e:?}");
        assert!(text.contains("PgStore::connect(url, PgOptions)"), "{text}");
        assert!(text.contains(what), "{text}");
        assert!(
            text.contains("sqlx pool ") && text.contains("@127.0.0.1:1/"),
            "{text}"
        );
        // Refused from the options alone: the pool never opened a connection.
        assert_eq!(pool.size(), 0, "{what}");
    }
}

#[tokio::test]
async fn a_pool_of_one_connection_is_refused_before_connecting() {
    // The store's LISTEN would hold it: every transaction would wait for the pool in vain.
    let pool = PgPoolOptions::new().max_connections(1).connect_lazy_with(
        PgConnectOptions::new_without_pgpass()
            .host("127.0.0.1")
            .port(1),
    );
    let e = SqlxPgStore::new(pool.clone(), SqlxPgOptions::default())
        .await
        .expect_err("refused");
    assert!(matches!(e, StoreError::Open { .. }), "{e:?}");
    assert!(e.to_string().contains("max_connections 1"), "{e}");
    assert_eq!(pool.size(), 0);
}

#[tokio::test]
async fn require_without_a_root_certificate_passes_the_rule() {
    // Nothing listens on 127.0.0.1:1: the store gets as far as connecting, and fails there.
    let pool = lazy(PgConnectOptions::new_without_pgpass().ssl_mode(PgSslMode::Require));
    let e = SqlxPgStore::new(pool, SqlxPgOptions::default())
        .await
        .expect_err("nothing listens on 127.0.0.1:1");
    assert!(!refusal(&e), "{e}");
    assert!(
        matches!(e, StoreError::ConnectionLost { .. }),
        "a connection failure: {e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_prefer_pools_carry_the_store() {
    let Some(url) = outbox_lanes_test_support::pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    for mode in [PgSslMode::Disable, PgSslMode::Allow, PgSslMode::Prefer] {
        let options: PgConnectOptions = url.parse().expect("the test server's URL");
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options.ssl_mode(mode))
            .await
            .expect("pool");
        let schema = format!(
            "ol_t_sqlx_tls_{}_{}",
            std::process::id(),
            format!("{mode:?}").to_lowercase()
        );
        let opts = SqlxPgOptions {
            schema: schema.clone(),
            ..SqlxPgOptions::default()
        };
        let store = SqlxPgStore::new(pool.clone(), opts).await.expect("store");
        let status = tokio::task::spawn_blocking(move || store.status())
            .await
            .expect("join")
            .expect("status");
        assert!(status.is_empty(), "a new outbox: {status:?}");
        outbox_lanes_store::sqlx::sqlx::raw_sql(outbox_lanes_store::sqlx::sqlx::AssertSqlSafe(
            format!("DROP SCHEMA {schema} CASCADE"),
        ))
        .execute(&pool)
        .await
        .expect("drop schema");
        pool.close().await;
    }
}
