//! The one stop of an outbox, with the default settings, on tokio, async-std and smol: an
//! attempt hanging past the default shutdown grace (10 s) is abandoned at the grace instead of
//! waited for up to the HTTP timeout (30 s), its unit stays pending, and no holder lock file
//! is left. `Outbox::open` opens on the executor it is called on.
#![allow(missing_docs)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use outbox_lanes_store::{NewRow, SqliteOptions, SqliteStore};
use outbox_lanes_test_support::{Recipient, Reply};
use outbox_lanes_tokio::{Outbox, OutboxConfig, OutboxError};

/// The holder lock files beside the database at `db` (`<db>-holders/*.lock`).
fn lock_files(db: &Path) -> Vec<String> {
    let mut dir = db.as_os_str().to_owned();
    dir.push("-holders");
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".lock"))
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn row(id: &str, to: &str) -> NewRow {
    NewRow {
        id: id.into(),
        body: b"{}".to_vec(),
        recipients: vec![to.to_owned()],
        ..NewRow::default()
    }
}

/// On the executor this is polled on: opens an outbox with `Outbox::open` and the default
/// settings (loopback allowed), starts its monitor, enqueues a row to a recipient that hangs
/// and one to a recipient that answers, stops while the first hangs, and checks what the
/// stop says and leaves. `runtime` is what the outbox's `Debug` names.
async fn stop_with_a_hanging_attempt(runtime: &str, stop_with_monitor: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("outbox.db");
    let store = Arc::new(SqliteStore::open(&db, SqliteOptions::default()).expect("open"));
    let r = Recipient::start().expect("recipient");
    r.set_default("/hang", Reply::Hang);
    let config = OutboxConfig::default().allow_loopback();
    assert_eq!(
        config.shutdown_grace,
        Duration::from_secs(10),
        "the default grace"
    );
    assert_eq!(
        config.http.timeout,
        Duration::from_secs(30),
        "the default timeout"
    );
    let outbox = Outbox::open(store, config).expect("outbox");
    assert!(
        format!("{outbox:?}").contains(runtime),
        "opened on the caller's executor: {outbox:?}"
    );
    let monitor = outbox.monitor().await.expect("monitor");
    outbox
        .enqueue(
            "alice",
            &[row("a1", &r.url("/hang")), row("a2", &r.url("/ok"))],
        )
        .await
        .expect("enqueue");
    // The recipient's waits block: on a thread of their own, not the executor's.
    let r = Arc::new(r);
    let waiting = Arc::clone(&r);
    let arrived = std::thread::spawn(move || {
        waiting.wait_for("/hang", 1, Duration::from_secs(20))
            && waiting.wait_for("/ok", 1, Duration::from_secs(20))
    });
    while !arrived.is_finished() {
        outbox_sleep(&outbox, Duration::from_millis(10)).await;
    }
    assert!(arrived.join().expect("join"), "both attempts were sent");
    assert_eq!(
        lock_files(&db).len(),
        1,
        "the running relay holds its lock file"
    );

    let stopped = if stop_with_monitor {
        monitor.stop().await
    } else {
        let stopped = outbox.shutdown().await;
        drop(monitor);
        stopped
    };

    assert!(
        stopped.grace_over,
        "the grace ran out with the attempt in flight: {stopped:?}"
    );
    assert_eq!(
        stopped.interrupted, 1,
        "the one attempt cut off: {stopped:?}"
    );
    assert!(
        lock_files(&db).is_empty(),
        "a clean stop leaves no holder lock file: {:?}",
        lock_files(&db)
    );
    let pending: u64 = outbox
        .status()
        .await
        .expect("status")
        .iter()
        .map(|s| s.pending)
        .sum();
    assert_eq!(
        pending, 1,
        "the hanging unit is still pending, the other delivered"
    );
    let lanes = outbox.lanes("alice").await.expect("lanes");
    let hang = lanes
        .iter()
        .find(|l| l.key.recipient().ends_with("/hang"))
        .expect("the hanging lane");
    assert!(
        hang.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("interrupted")),
        "recorded as an interrupted attempt: {:?}",
        hang.last_error
    );
    assert!(
        matches!(outbox.drain("alice").await, Err(OutboxError::ShuttingDown)),
        "a stopped outbox runs no pass"
    );
    assert_eq!(
        outbox.shutdown().await,
        stopped,
        "stopping again answers the same"
    );
}

/// Sleeps on the outbox's own runtime.
async fn outbox_sleep(outbox: &Outbox, d: Duration) {
    outbox.runtime().sleep(d).await;
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_the_monitors_stop_abandons_a_hanging_attempt_at_the_default_grace() {
    stop_with_a_hanging_attempt("TokioRuntime", true).await;
}

#[cfg(feature = "async-std")]
#[test]
fn async_std_the_outboxs_stop_abandons_a_hanging_attempt_at_the_default_grace() {
    async_std::task::block_on(stop_with_a_hanging_attempt("AsyncStdRuntime", false));
}

#[cfg(feature = "smol")]
#[test]
fn smol_the_monitors_stop_abandons_a_hanging_attempt_at_the_default_grace() {
    smol::block_on(stop_with_a_hanging_attempt("SmolRuntime", true));
}
