//! The stores' transactional entry point takes the actor as `impl Into<ActorId>`: `&str`,
//! `String`, `&String`, `ActorId` and `&ActorId` all compile and enqueue into one outbox, on a
//! real in-memory SQLite store.
#![allow(missing_docs)]
#![cfg(feature = "sqlite")]

use outbox_lanes_core::ActorId;
use outbox_lanes_store::{EnqueueError, NewRow, ServiceStore, SqliteStore};

#[test]
fn enqueue_in_takes_every_spelling_of_an_actor() {
    let store = SqliteStore::in_memory().expect("in-memory store");
    let owned = String::from("alice");
    let id = ActorId::new("alice");
    let row = |n: u32| NewRow::new(format!("r{n}")).recipient("https://b.example/inbox");
    let enqueued = store
        .with_transaction(|tx| {
            let mut rows = Vec::new();
            for (n, done) in [
                (1, store.enqueue_in(tx, "alice", &[row(1)])),
                (2, store.enqueue_in(tx, owned.clone(), &[row(2)])),
                (3, store.enqueue_in(tx, &owned, &[row(3)])),
                (4, store.enqueue_in(tx, id.clone(), &[row(4)])),
                (5, store.enqueue_in(tx, &id, &[row(5)])),
            ] {
                let (done, wake) = done?;
                drop(wake); // with_transaction wakes after its commit
                rows.push((n, done));
            }
            Ok::<_, EnqueueError>(rows)
        })
        .expect("enqueue");
    for (n, done) in &enqueued {
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].row_id, format!("r{n}"));
    }
    // Sequence numbers follow one another: one actor's outbox.
    let seqs: Vec<u64> = enqueued.iter().map(|(_, d)| d[0].seq.0).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    let status = store.status().expect("status");
    assert_eq!(status.len(), 1, "one outbox: {status:?}");
    assert_eq!((&status[0].actor, status[0].pending), (&id, 5));
}
