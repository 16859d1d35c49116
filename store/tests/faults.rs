//! Faults: a locked SQLite database, unusable paths, a newer schema, a Postgres connection
//! terminated mid-pass, an unreachable server.
#![allow(missing_docs, clippy::std_instead_of_core)]

mod common;

use std::time::Duration;

use common::*;
use outbox_lanes_store::sqlite::rusqlite;
use outbox_lanes_store::*;

const A: &str = "https://a.example/inbox";

#[test]
fn sqlite_locked_past_busy_timeout_is_typed_and_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("outbox.db");
    let opts = SqliteOptions {
        busy_timeout: Duration::from_millis(100),
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open(&path, opts).expect("open");
    let a = actor("alice");
    store.enqueue(&a, &[row("r0", &[A])]).expect("enqueue");

    let other = rusqlite::Connection::open(&path).expect("other connection");
    other.execute_batch("BEGIN EXCLUSIVE").expect("lock");
    assert_eq!(
        store.enqueue(&a, &[row("r1", &[A])]),
        Err(EnqueueError::Store(StoreError::Busy))
    );
    assert_eq!(store.acquire_slot(&a, "h", LEASE), Err(StoreError::Busy));
    other.execute_batch("COMMIT").expect("unlock");

    store
        .enqueue(&a, &[row("r1", &[A])])
        .expect("enqueue after release");
    let t = acquire(&store, &a, "h", LEASE);
    let lane = lane_of(&store, &a, A);
    assert_eq!(row_ids(&claim_lane(&store, &t, lane, 0, 10)), ["r0", "r1"]);
}

#[test]
fn missing_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("no-such-dir").join("outbox.db");
    let err = SqliteStore::open(&path, SqliteOptions::default()).expect_err("missing dir");
    assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("no-such-dir"), "{text}");
    assert!(text.contains("directory"), "{text}");
}

#[test]
fn read_only_location_is_a_clear_error() {
    // /proc refuses new files even to root, so this holds whoever runs the tests.
    let err = SqliteStore::open("/proc/outbox-lanes-test.db", SqliteOptions::default())
        .expect_err("read-only");
    assert!(
        matches!(err, StoreError::Open { .. } | StoreError::ReadOnly { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("/proc/outbox-lanes-test.db"),
        "{err}"
    );
}

#[test]
fn sqlite_schema_from_a_newer_version_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("outbox.db");
    drop(SqliteStore::open(&path, SqliteOptions::default()).expect("create"));
    let c = rusqlite::Connection::open(&path).expect("raw");
    c.execute(
        "UPDATE ol_meta SET value = '99' WHERE key = 'schema_version'",
        [],
    )
    .expect("bump");
    drop(c);
    let err = SqliteStore::open(&path, SqliteOptions::default()).expect_err("too new");
    assert_eq!(
        err,
        StoreError::SchemaTooNew {
            found: 99,
            supported: SCHEMA_VERSION
        }
    );
    assert!(err.to_string().contains("newer"), "{err}");
}

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use outbox_lanes_core::DeadReason;

    fn terminate(url: &str, app: &str) -> u64 {
        let mut c = ::postgres::Client::connect(url, ::postgres::NoTls).expect("admin");
        let rows = c
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                &[&app],
            )
            .expect("terminate");
        rows.len() as u64
    }

    fn drop_schema(url: &str, schema: &str) {
        if let Ok(mut c) = ::postgres::Client::connect(url, ::postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
        }
    }

    #[test]
    fn connection_terminated_mid_pass_reconnects_and_loses_nothing() {
        let Some(url) = pg_url() else {
            println!("skipped: OUTBOX_LANES_TEST_PG not set");
            return;
        };
        let schema = format!("ol_fault_{}", std::process::id());
        let opts = PgOptions {
            schema: schema.clone(),
            application_name: schema.clone(),
            ..PgOptions::default()
        };
        let store = PgStore::connect(&url, opts).expect("connect");
        let a = actor("alice");
        store
            .enqueue(&a, &[row("r0", &[A]), row("r1", &[A]), row("r2", &[A])])
            .expect("enqueue");
        let t = acquire(&store, &a, "relay", LEASE);
        let lane = lane_of(&store, &a, A);
        let c = claim_lane(&store, &t, lane, 0, 10);
        assert_eq!(row_ids(&c), ["r0", "r1", "r2"]);

        // The relay's connections are killed while r0 is "in flight".
        assert!(terminate(&url, &schema) >= 1);
        store
            .ack(&t, &[(c.units[0].id, lane)])
            .expect("ack after reconnect");
        assert!(terminate(&url, &schema) >= 1);
        store
            .dead_letter(
                &t,
                &DeadLetterRequest {
                    unit: c.units[1].id,
                    lane,
                    reason: DeadReason::Permanent,
                    status: Some(400),
                    error: None,
                    at: now(),
                },
            )
            .expect("dead letter after reconnect");
        assert!(terminate(&url, &schema) >= 1);
        store
            .enqueue(&a, &[row("r3", &[A])])
            .expect("enqueue after reconnect");
        assert!(terminate(&url, &schema) >= 1);
        let c2 = claim_lane(&store, &t, lane, 0, 10);
        assert_eq!(row_ids(&c2), ["r2", "r3"]);
        assert_eq!(store.dead_letters(None).expect("dl").len(), 1);
        assert_eq!(store.release_slot(&t), Ok(SlotRelease::Released));
        drop(store);
        drop_schema(&url, &schema);
    }

    #[test]
    fn pg_schema_from_a_newer_version_is_refused() {
        let Some(url) = pg_url() else {
            println!("skipped: OUTBOX_LANES_TEST_PG not set");
            return;
        };
        let schema = format!("ol_newer_{}", std::process::id());
        let opts = PgOptions {
            schema: schema.clone(),
            ..PgOptions::default()
        };
        drop(PgStore::connect(&url, opts.clone()).expect("create"));
        let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).expect("admin");
        c.batch_execute(&format!(
            "UPDATE {schema}.ol_meta SET value = '99' WHERE key = 'schema_version'"
        ))
        .expect("bump");
        let err = PgStore::connect(&url, opts).expect_err("too new");
        assert!(
            matches!(err, StoreError::SchemaTooNew { found: 99, .. }),
            "{err:?}"
        );
        drop_schema(&url, &schema);
    }

    #[test]
    fn unreachable_server_is_a_clear_error() {
        let opts = PgOptions {
            connect_timeout: Duration::from_secs(2),
            ..PgOptions::default()
        };
        let err = PgStore::connect("postgres://postgres:secret@127.0.0.1:1/test", opts)
            .expect_err("unreachable");
        assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("127.0.0.1"), "{text}");
        assert!(!text.contains("secret"), "password leaked: {text}");
    }
}

/// Processes starting at once on a database that does not exist yet (a relay starting while
/// the first enqueue creates the file) race to switch it to WAL and to create the tables;
/// SQLite answers the loser "busy" at once, without waiting. Every open must still succeed.
#[test]
fn stores_opening_a_new_database_at_once_all_open_it() {
    for round in 0..40 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.db");
        let start = std::sync::Arc::new(std::sync::Barrier::new(4));
        let opened: Vec<Result<SqliteStore, StoreError>> = (0..4)
            .map(|_| {
                let (path, start) = (path.clone(), std::sync::Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    SqliteStore::open(&path, SqliteOptions::default())
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        for r in &opened {
            assert!(r.is_ok(), "round {round}: {:?}", r.as_ref().err());
        }
    }
}
