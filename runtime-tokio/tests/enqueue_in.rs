//! `Outbox::enqueue_in`: the transactional outbox on SQLite from async code — the caller's
//! write and the rows in one transaction on the runtime's blocking pool, committed together
//! (or neither), and the monitor woken after the commit.
#![allow(missing_docs)]
#![cfg(all(feature = "tokio", feature = "sqlite"))]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use outbox_lanes_store::{
    DriverStore, NewRow, ServiceStore, SqliteOptions, SqliteStore, StoreError,
};
use outbox_lanes_test_support::Recipient;
use outbox_lanes_tokio::{Outbox, OutboxConfig};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Writes a note and enqueues its row to `inbox`, in one transaction on the blocking pool.
async fn post_note(
    outbox: &Outbox,
    store: &Arc<SqliteStore>,
    id: &str,
    inbox: &str,
) -> Result<usize, Error> {
    let (id, inbox) = (id.to_owned(), inbox.to_owned());
    outbox
        .enqueue_in(store, move |store, tx| {
            tx.execute("INSERT INTO notes (id) VALUES (?1)", [&id])?;
            let row = NewRow {
                id: format!("https://notes.example/notes/{id}"),
                body: b"{}".to_vec(),
                recipients: vec![inbox],
                ..NewRow::default()
            };
            let (enqueued, _wake) = store.enqueue_in(tx, "notes", &[row])?;
            Ok::<_, Error>(enqueued[0].units.len())
        })
        .await
}

/// The notes, read on a connection of the test's own.
fn notes(db: &Path) -> i64 {
    rusqlite::Connection::open(db)
        .and_then(|c| c.query_row("SELECT count(*) FROM notes", [], |r| r.get(0)))
        .expect("count the notes")
}

fn pending(store: &SqliteStore) -> u64 {
    store
        .status()
        .expect("status")
        .iter()
        .map(|s| s.pending)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_in_commits_the_callers_write_and_the_rows_together_and_wakes_the_monitor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("app.db");
    let store = Arc::new(SqliteStore::open(&db, SqliteOptions::default()).expect("open"));
    store
        .with_transaction(|tx| {
            tx.execute_batch("CREATE TABLE notes (id TEXT PRIMARY KEY)")
                .map_err(StoreError::from)
        })
        .expect("the service's table");
    let r = Recipient::start().expect("recipient");
    let outbox =
        Outbox::open(store.clone(), OutboxConfig::default().allow_loopback()).expect("outbox");
    let wakes = Arc::new(AtomicUsize::new(0));
    let w = Arc::clone(&wakes);
    let _counting = store.notifier().subscribe(move || {
        w.fetch_add(1, Ordering::SeqCst);
    });

    // Committed together; no monitor yet, so the row waits.
    let units = post_note(&outbox, &store, "n1", &r.url("/inbox"))
        .await
        .expect("n1");
    assert_eq!(units, 1);
    assert_eq!((notes(&db), pending(&store)), (1, 1));
    assert_eq!(
        wakes.load(Ordering::SeqCst),
        1,
        "woken once, after the commit"
    );

    // The caller's write fails (the note exists): the rows roll back with it.
    assert!(
        post_note(&outbox, &store, "n1", &r.url("/inbox"))
            .await
            .is_err()
    );
    assert_eq!((notes(&db), pending(&store)), (1, 1));
    // The rows are refused (a recipient that is not a URL): the note rolls back with them.
    let refused = post_note(&outbox, &store, "n2", "not a url").await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!((notes(&db), pending(&store)), (1, 1));
    assert_eq!(
        wakes.load(Ordering::SeqCst),
        1,
        "nothing committed, nothing woken"
    );

    // A running monitor is woken by the commit and delivers both rows.
    let monitor = outbox.monitor().await.expect("monitor");
    post_note(&outbox, &store, "n3", &r.url("/inbox"))
        .await
        .expect("n3");
    let r = Arc::new(r);
    let waiting = Arc::clone(&r);
    let delivered =
        tokio::task::spawn_blocking(move || waiting.wait_for("/inbox", 2, Duration::from_secs(20)))
            .await
            .expect("join");
    assert!(delivered, "both notes' rows were delivered");
    let stopped = monitor.stop().await;
    assert!(!stopped.grace_over, "{stopped:?}");
    assert_eq!(pending(&store), 0);
}
