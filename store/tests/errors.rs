//! Store errors keep their cause: the driver's error is the `source()`, and the message says
//! what the server said (not only the driver's "db error").
#![allow(missing_docs, clippy::unwrap_used)]

use core::error::Error as _;

use outbox_lanes_store::*;

#[cfg(feature = "postgres")]
#[test]
fn postgres_open_error_shows_the_server_message_and_chains_to_the_driver_error() {
    let Some(url) = outbox_lanes_test_support::pg_url() else {
        return;
    };
    // The test server's address with a role that does not exist.
    let (_, hostpart) = url.split_once('@').expect("user@host in the test URL");
    let host = hostpart.split('/').next().unwrap();
    let target = format!("postgres://nobody_ol_test@{host}/nodb");
    let err = PgStore::connect(&target, PgOptions::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(r#"role "nobody_ol_test" does not exist"#) && text.contains("SQLSTATE 28000"),
        "{text}"
    );
    assert!(!text.contains("db error"), "{text}");
    assert!(!text.contains('\n'), "one line: {text}");
    let pg = err
        .source()
        .and_then(|s| s.downcast_ref::<::postgres::Error>())
        .expect("source() is the postgres::Error");
    let db = pg.as_db_error().expect("a server error");
    assert_eq!(db.code().code(), "28000");
    // And below it the server's DbError, as the driver chains it.
    assert!(
        pg.source()
            .is_some_and(|s| s.is::<::postgres::error::DbError>())
    );
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_unreachable_server_names_the_os_error() {
    let opts = PgOptions {
        connect_timeout: core::time::Duration::from_secs(2),
        ..PgOptions::default()
    };
    let err =
        PgStore::connect("postgres://postgres@127.0.0.1:1/test?sslmode=disable", opts).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("error connecting to server") && text.contains("refused"),
        "{text}"
    );
    assert!(
        err.source().is_some_and(|s| s.is::<::postgres::Error>()),
        "{err:?}"
    );
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_bad_sslmode_is_an_open_error_without_a_connection() {
    let err = PgStore::connect(
        "postgres://postgres@127.0.0.1:1/test?sslmode=allow",
        PgOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
    assert!(
        err.to_string().contains(r#"invalid sslmode "allow""#),
        "{err}"
    );
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_errors_chain_to_the_rusqlite_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = SqliteStore::open(
        dir.path().join("missing").join("x.db"),
        SqliteOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
    assert!(
        err.source().is_some_and(|s| s.is::<rusqlite::Error>()),
        "{err:?}"
    );
}

/// A caller's own constraint violation inside [`SqliteStore::with_transaction`], turned into
/// a `StoreError` by `?`, is still its driver's error one `source()` down: the caller can tell
/// its own UNIQUE refusal from the store's. Nothing of the transaction is written.
#[cfg(feature = "sqlite")]
#[test]
fn a_callers_own_unique_violation_in_with_transaction_reaches_the_rusqlite_error() {
    let store = SqliteStore::in_memory().unwrap();
    store
        .with_transaction(|tx| -> Result<(), StoreError> {
            tx.execute_batch("CREATE TABLE notes (id TEXT PRIMARY KEY)")?;
            Ok(())
        })
        .unwrap();
    let row = NewRow {
        id: "note-1".into(),
        body: b"{}".to_vec(),
        recipients: vec!["https://b.example/inbox".into()],
        ..NewRow::default()
    };
    let err = store
        .with_transaction(|tx| -> Result<(), StoreError> {
            // The actor as text: `enqueue_in` takes anything `Into<ActorId>`.
            let (_, _wake) = store.enqueue_in(tx, "alice", &[row]).unwrap();
            tx.execute("INSERT INTO notes VALUES ('n1')", [])?;
            tx.execute("INSERT INTO notes VALUES ('n1')", [])?; // the caller's own refusal
            Ok(())
        })
        .unwrap_err();
    assert!(matches!(err, StoreError::Driver { .. }), "{err:?}");
    let sqlite = err
        .source()
        .and_then(|s| s.downcast_ref::<rusqlite::Error>())
        .expect("source() is the rusqlite::Error");
    assert_eq!(
        sqlite.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ConstraintViolation),
        "{sqlite:?}"
    );
    // Rolled back: neither the note nor the row.
    let notes: i64 = store
        .with_transaction(|tx| -> Result<i64, StoreError> {
            Ok(tx.query_row("SELECT count(*) FROM notes", [], |r| r.get(0))?)
        })
        .unwrap();
    assert_eq!(notes, 0);
    let status = store.status().unwrap();
    assert!(status.is_empty(), "{status:?}");
}

#[test]
fn errors_with_causes_still_compare_by_what_they_say() {
    let io = || std::io::Error::other("disk on fire");
    let a = StoreError::Open {
        target: "x".into(),
        reason: "r".into(),
        cause: Some(Cause::new(io())),
    };
    let b = StoreError::Open {
        target: "x".into(),
        reason: "r".into(),
        cause: Some(Cause::new(io())),
    };
    assert_eq!(a, b);
    let c = StoreError::Open {
        target: "x".into(),
        reason: "r".into(),
        cause: Some(Cause::new(std::io::Error::other("flood"))),
    };
    assert_ne!(a, c);
    assert!(a.source().is_some_and(|s| s.is::<std::io::Error>()));
    assert_eq!(a.clone(), a);
}

/// A column whose type is not the one the store reads (a table edited by hand) is an error
/// naming the column, not a panic: every Postgres row is read with `try_get`.
#[cfg(feature = "postgres")]
#[test]
fn postgres_column_of_the_wrong_type_is_an_error_not_a_panic() {
    let Some(url) = outbox_lanes_test_support::pg_url() else {
        return;
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let schema = format!("ol_errors_{}_{nanos}", std::process::id());
    let opts = PgOptions {
        schema: schema.clone(),
        ..PgOptions::default()
    };
    let store = PgStore::connect(&url, opts).unwrap();
    let actor = outbox_lanes_core::ActorId::new("a");
    let row = NewRow {
        id: "r".into(),
        body: b"{}".to_vec(),
        content_type: "application/json".into(),
        recipients: vec!["https://a.example/inbox".into()],
        ..NewRow::default()
    };
    store.enqueue(&actor, &[row]).unwrap();
    assert_eq!(store.lanes(&actor).unwrap().len(), 1);
    let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
    c.batch_execute(&format!(
        "ALTER TABLE {schema}.ol_lanes ALTER COLUMN backoff_level TYPE text USING backoff_level::text"
    ))
    .unwrap();
    // A fresh connection: its statements are prepared against the edited table (the first
    // store's cached plans would be refused by the server before any row is read).
    drop(store);
    let store = PgStore::connect(
        &url,
        PgOptions {
            schema: schema.clone(),
            ..PgOptions::default()
        },
    )
    .unwrap();
    let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| store.lanes(&actor)));
    let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
    let err = got
        .expect("reading a mistyped column panicked")
        .unwrap_err();
    assert!(err.to_string().contains("column"), "{err}");
}
