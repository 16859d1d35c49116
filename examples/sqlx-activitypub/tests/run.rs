//! The example run whole against a real Postgres (`OUTBOX_LANES_TEST_PG`) and three recorders
//! on 127.0.0.1: the note is written, each inbox receives the `Create` once, signed by alice's
//! key as verifiers we did not write (httpsig-hyper) check it, and nothing stays pending.
#![allow(missing_docs)]

use std::process::Command;

use outbox_lanes::core::policy::AddressPolicy;
use outbox_lanes::sqlx::{self, Connection as _, PgConnection};
use outbox_lanes::store::ServiceStore as _;
use outbox_lanes::store::sqlx::{SqlxPgOptions, SqlxPgStore};
use outbox_lanes_test_support::signatures::{ALICE_PRIVATE_PKCS8, ALICE_PUBLIC};
use outbox_lanes_test_support::{Recipient, pg_url, verifiers};

/// `url` with its database replaced by `db`.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, ""), |(b, q)| (b, q));
    let (server, _) = base.rsplit_once('/').expect("a database in the URL");
    if query.is_empty() {
        format!("{server}/{db}")
    } else {
        format!("{server}/{db}?{query}")
    }
}

#[test]
fn the_example_delivers_its_signed_create_to_three_inboxes() {
    let Some(url) = pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // A database of its own: the example uses the default schema and a `notes` table.
    let db = format!("ol_example_sqlx_ap_{}", std::process::id());
    let db_url = with_database(&url, &db);
    rt.block_on(async {
        let mut admin = PgConnection::connect(&url).await.expect("admin connection");
        let stale = format!("DROP DATABASE IF EXISTS {db}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(stale))
            .execute(&mut admin)
            .await
            .expect("drop");
        let create = format!("CREATE DATABASE {db}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(create))
            .execute(&mut admin)
            .await
            .expect("create");
        // The operator's step (`outbox-lanes destinations set loopback`): the recorders are
        // on 127.0.0.1, which the outbox's default policy refuses; the example's default
        // config follows the outbox's policy (OL-24).
        let pool = sqlx::PgPool::connect(&db_url).await.expect("pool");
        let store = SqlxPgStore::new(pool.clone(), SqlxPgOptions::default())
            .await
            .expect("store");
        store
            .widen_destination_policy(AddressPolicy::allow_loopback_only())
            .expect("loopback allowed");
        drop(store); // never blocks: its background tasks are aborted
        pool.close().await;
    });

    let recorders: Vec<Recipient> = (0..3)
        .map(|_| Recipient::start().expect("recorder"))
        .collect();
    let inboxes: Vec<String> = recorders.iter().map(|r| r.url("/inbox")).collect();
    let dir = std::env::temp_dir().join(format!("ol-example-sqlx-ap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("key dir");
    let key = dir.join("alice.pem");
    std::fs::write(&key, ALICE_PRIVATE_PKCS8).expect("key file");

    let out = Command::new(env!("CARGO_BIN_EXE_sqlx_activitypub"))
        .env("DATABASE_URL", &db_url)
        .env("KEY_FILE", &key)
        .env("INBOXES", inboxes.join(","))
        .output()
        .expect("the example runs");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "the example failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    for r in &recorders {
        let q = r.requests("/inbox");
        assert_eq!(q.len(), 1, "one Create per inbox");
        let body: serde_json::Value = serde_json::from_slice(&q[0].body).expect("JSON");
        assert_eq!(body["type"], "Create");
        assert_eq!(body["object"]["id"], "https://notes.example/notes/1");
        assert_eq!(
            q[0].header("content-type"),
            Some("application/activity+json")
        );
        // `auto`: RFC 9421 first, to a host whose scheme is not known yet.
        let v = verifiers::rfc9421(&q[0], ALICE_PUBLIC).expect("signed by alice's key");
        assert_eq!(
            v.keyid.as_deref(),
            Some("https://notes.example/users/alice#main-key")
        );
    }

    rt.block_on(async {
        let mut conn = PgConnection::connect(&db_url).await.expect("connection");
        let notes: i64 = sqlx::query_scalar("SELECT count(*) FROM notes")
            .fetch_one(&mut conn)
            .await
            .expect("notes");
        assert_eq!(notes, 1, "the service's row committed with its deliveries");
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox_lanes.ol_units WHERE state <> 1")
                .fetch_one(&mut conn)
                .await
                .expect("units");
        assert_eq!(pending, 0, "nothing left pending or dead-lettered");
        conn.close().await.expect("close");
        let mut admin = PgConnection::connect(&url).await.expect("admin connection");
        let gone = format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)");
        sqlx::raw_sql(sqlx::AssertSqlSafe(gone))
            .execute(&mut admin)
            .await
            .expect("drop");
    });
}
