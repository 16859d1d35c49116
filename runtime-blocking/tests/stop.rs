//! The one stop of an outbox with the default settings: a recipient that hangs past the
//! default shutdown grace (10 s) is abandoned at the grace instead of waited for up to the
//! HTTP timeout (30 s); the unit stays pending; no holder lock file is left.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use outbox_lanes_blocking::{DrainOutcome, Outbox, OutboxConfig, OutboxError};
use outbox_lanes_store::{NewRow, SqliteOptions, SqliteStore};
use outbox_lanes_test_support::{Completion, Recipient, Reply};

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

/// `monitor.stop()` is the outbox's stop: with the default grace and HTTP timeout, the
/// attempt hanging at the stop is abandoned when the grace ends — the stop returns while the
/// client still waits for the answer (the HTTP timeout had not come) — recorded as
/// interrupted, its unit still pending; the other recipient was served; the lock file is gone.
#[test]
fn the_stop_abandons_an_attempt_hanging_past_the_default_grace_and_leaves_no_lock_file() {
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
    let outbox = Outbox::open(store.clone(), config).expect("outbox");
    let monitor = outbox.monitor().expect("monitor");
    outbox
        .enqueue(
            "alice",
            &[row("a1", &r.url("/hang")), row("a2", &r.url("/ok"))],
        )
        .expect("enqueue");
    assert!(
        r.wait_for("/hang", 1, Duration::from_secs(20)),
        "the attempt hangs"
    );
    assert!(
        r.wait_for("/ok", 1, Duration::from_secs(20)),
        "the other lane goes on"
    );
    assert_eq!(
        lock_files(&db).len(),
        1,
        "the running relay holds its lock file"
    );

    let stopped = monitor.stop();

    assert!(
        stopped.grace_over,
        "the grace ran out with the attempt in flight: {stopped:?}"
    );
    assert_eq!(
        stopped.interrupted, 1,
        "the one attempt cut off: {stopped:?}"
    );
    assert_eq!(
        r.requests("/hang")[0].completion,
        Completion::Pending,
        "the stop returned before the client gave up on the answer: it did not wait for the HTTP timeout"
    );
    assert!(
        lock_files(&db).is_empty(),
        "a clean stop leaves no holder lock file: {:?}",
        lock_files(&db)
    );
    let pending: u64 = outbox
        .status()
        .expect("status")
        .iter()
        .map(|s| s.pending)
        .sum();
    assert_eq!(
        pending, 1,
        "the hanging unit is still pending, the other delivered"
    );
    let lanes = outbox.lanes("alice").expect("lanes");
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
    assert_eq!(hang.depth, 1);
    assert!(
        matches!(outbox.drain("alice"), Err(OutboxError::ShuttingDown)),
        "a stopped outbox runs no pass"
    );
    assert_eq!(
        outbox.shutdown(),
        stopped,
        "stopping again answers the same"
    );

    // The next relay on the database delivers the unit again (at-least-once).
    r.set_default("/hang", Reply::Status(200));
    let next = Outbox::open(store, OutboxConfig::default().allow_loopback()).expect("outbox");
    match next.drain("alice").expect("drain") {
        DrainOutcome::Ran(rep) => assert_eq!(rep.delivered, 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.count("/hang"), 2, "sent again after the stop");
    let stopped = next.shutdown();
    assert!(!stopped.grace_over, "nothing was in flight: {stopped:?}");
    assert_eq!(stopped.interrupted, 0, "{stopped:?}");
    assert!(lock_files(&db).is_empty(), "{:?}", lock_files(&db));
}
