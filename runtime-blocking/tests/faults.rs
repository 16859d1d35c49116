//! The blocking runtime when the store cannot write: a real SQLite file locked by another
//! connection (as another process would) in the middle of a drain, against a recorder on
//! 127.0.0.1. Tests assert counts and orders, never durations.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_lanes_blocking::{Hooks, Outbox, OutboxConfig, OutboxError, store::NewRow};
use outbox_lanes_store::{SqliteOptions, SqliteStore, StoreError};
use outbox_lanes_test_support::{Recipient, Reply};

const ROWS: usize = 150;
/// The delivery after which the database is locked.
const LOCK_AT: usize = 10;

#[test]
fn a_store_that_cannot_write_stops_new_attempts_at_once_and_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("outbox.db");
    let opts = SqliteOptions {
        busy_timeout: Duration::from_millis(50),
        ..SqliteOptions::default()
    };
    let store = Arc::new(SqliteStore::open(&path, opts).expect("open sqlite"));
    let r = Arc::new(Recipient::start().expect("recipient"));
    // One lane, one attempt at a time, a short round trip: the pass would run far ahead of
    // a store that records nothing.
    r.set_server_default(Reply::Status(200).after(Duration::from_millis(20)));
    let to = r.url("/inbox");
    let rows: Vec<NewRow> = (0..ROWS)
        .map(|i| NewRow {
            id: format!("e{i}"),
            body: format!("{i}").into_bytes(),
            content_type: "text/plain".into(),
            recipients: vec![to.clone()],
            ..NewRow::default()
        })
        .collect();

    // Another connection takes the write lock on the LOCK_AT-th delivery, and keeps it.
    let locker: Arc<Mutex<Option<rusqlite::Connection>>> = Arc::default();
    let seen_at_lock = Arc::new(AtomicUsize::new(0));
    // Units the recipient answered whose acks were not yet durable when the lock was taken
    // (the hook fires when an ack is queued; acks are written in batches): they are sent
    // again too, and how many depends on the batching, so the test reads it.
    let unacked_at_lock = Arc::new(AtomicUsize::new(0));
    let delivered = Arc::new(AtomicUsize::new(0));
    let (l, seen, d, rec, unacked) = (
        Arc::clone(&locker),
        Arc::clone(&seen_at_lock),
        Arc::clone(&delivered),
        Arc::clone(&r),
        Arc::clone(&unacked_at_lock),
    );
    let lock_path = path.clone();
    let hooks = Hooks {
        delivered: Some(Box::new(move |_| {
            if d.fetch_add(1, Ordering::SeqCst) + 1 == LOCK_AT {
                let c = rusqlite::Connection::open(&lock_path).expect("second connection");
                c.busy_timeout(Duration::from_secs(10))
                    .expect("busy timeout");
                c.execute_batch("BEGIN IMMEDIATE")
                    .expect("take the write lock");
                seen.store(rec.count("/inbox"), Ordering::SeqCst);
                let pending: i64 = c
                    .query_row(
                        "SELECT count(*) FROM ol_units WHERE unit_id IS NULL AND state = 0",
                        [],
                        |r| r.get(0),
                    )
                    .expect("pending units");
                let durable = ROWS.saturating_sub(usize::try_from(pending).unwrap_or(0));
                unacked.store(LOCK_AT.saturating_sub(durable), Ordering::SeqCst);
                *l.lock().expect("locker") = Some(c);
            }
        })),
        ..Hooks::default()
    };
    let mut config = OutboxConfig::default().allow_loopback();
    config.http.timeout = Duration::from_secs(5);
    config.time_slice = Duration::from_secs(3600);
    // The failed pass could not release its slot either (the database was locked): the
    // next drain waits out this lease.
    config.lease = Duration::from_millis(600);
    let outbox = Outbox::builder(Arc::clone(&store) as _, config.clone())
        .hooks(hooks)
        .open()
        .expect("outbox");
    outbox.enqueue("alice", &rows).expect("enqueue");

    let first = outbox.drain("alice");
    assert!(
        matches!(first, Err(OutboxError::Store(StoreError::Busy))),
        "the drain ends on the store failure: {first:?}"
    );
    let at_lock = seen_at_lock.load(Ordering::SeqCst);
    let sent_while_locked = r.count("/inbox") - at_lock;
    // Without the fix the pass went on until its time slice ended, sending the whole
    // backlog (140 requests) with nothing recorded, and a later pass sent it all again.
    assert!(
        sent_while_locked < 60,
        "{sent_while_locked} attempts were sent while nothing could be recorded"
    );

    // The lock goes away: once the failed pass's lease has run out, a later drain delivers
    // everything, each unit first seen in order. It runs with the default lease: the short
    // one above was only there to expire soon, and a 600 ms lease renewed every 200 ms is
    // lost for real on a machine that stalls the relay longer than that (StaleToken).
    drop(locker.lock().expect("locker").take());
    outbox.shutdown();
    config.lease = OutboxConfig::default().lease;
    let outbox = Outbox::open(store, config).expect("second outbox");
    let mut ran = false;
    for _ in 0..100 {
        match outbox.drain("alice").expect("second drain") {
            outbox_lanes_blocking::DrainOutcome::Ran(_) => {
                ran = true;
                break;
            }
            outbox_lanes_blocking::DrainOutcome::Merged => {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    assert!(ran, "the slot never came free");
    let bodies: Vec<usize> = r
        .bodies("/inbox")
        .iter()
        .map(|b| String::from_utf8_lossy(b).parse().expect("entry"))
        .collect();
    let mut firsts = Vec::new();
    for b in &bodies {
        if !firsts.contains(b) {
            firsts.push(*b);
        }
    }
    assert_eq!(
        firsts,
        (0..ROWS).collect::<Vec<_>>(),
        "every unit, first seen in order"
    );
    let duplicates = bodies.len() - ROWS;
    let unacked = unacked_at_lock.load(Ordering::SeqCst);
    // Sent again: what was sent while locked, the answered units whose acks were not yet
    // durable, and the attempt in flight when the lock was taken.
    assert!(
        duplicates <= sent_while_locked + unacked + 1,
        "{duplicates} duplicates for {sent_while_locked} sent while locked and {unacked} \
         answered but not yet acknowledged"
    );
    let pending: u64 = outbox
        .status()
        .expect("status")
        .iter()
        .map(|a| a.pending)
        .sum();
    assert_eq!(pending, 0);
    eprintln!("sent while locked: {sent_while_locked}; duplicates: {duplicates}");
    outbox.shutdown();
}
