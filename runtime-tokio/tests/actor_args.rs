//! Every method of the async outbox that names an actor takes it the same way,
//! `impl Into<ActorId>`: `&str`, `String`, `&String`, `ActorId` and `&ActorId` all compile and
//! name the same outbox, on a real in-memory SQLite store delivering over HTTP to a recorder on
//! loopback.
#![allow(missing_docs)]
#![cfg(feature = "tokio")]

use std::sync::Arc;
use std::time::Duration;

use outbox_lanes_test_support::Recipient;
use outbox_lanes_tokio::core::ActorId;
use outbox_lanes_tokio::store::{NewRow, SqliteStore};
use outbox_lanes_tokio::{DrainControl, DrainOutcome, Outbox, OutboxConfig};

fn delivered(out: &DrainOutcome) -> u64 {
    match out {
        DrainOutcome::Ran(r) => r.delivered,
        other => panic!("a drain of its own was expected: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_an_actor_names_one_outbox() {
    let r = Arc::new(Recipient::start().expect("recipient"));
    let store = Arc::new(SqliteStore::in_memory().expect("in-memory store"));
    let outbox = Outbox::open(store, OutboxConfig::default().allow_loopback()).expect("outbox");
    let owned = String::from("alice");
    let id = ActorId::new("alice");
    let row = |n: u32| {
        NewRow::new(format!("r{n}"))
            .body(n.to_string())
            .recipient(r.url("/in"))
    };

    // Five rows, one by each form: one outbox holds them.
    outbox.enqueue("alice", &[row(1)]).await.expect("&str");
    outbox
        .enqueue(owned.clone(), &[row(2)])
        .await
        .expect("String");
    outbox.enqueue(&owned, &[row(3)]).await.expect("&String");
    outbox
        .enqueue(id.clone(), &[row(4)])
        .await
        .expect("ActorId");
    outbox.enqueue(&id, &[row(5)]).await.expect("&ActorId");
    let status = outbox.status().await.expect("status");
    assert_eq!(status.len(), 1, "one outbox: {status:?}");
    assert_eq!((&status[0].actor, status[0].pending), (&id, 5));
    let out = outbox.drain("alice").await.expect("drain &str");
    assert_eq!(delivered(&out), 5);

    // Each drain form delivers a row another form enqueued.
    outbox.enqueue(&id, &[row(6)]).await.expect("&ActorId");
    let out = outbox.drain(owned.clone()).await.expect("drain String");
    assert_eq!(delivered(&out), 1);
    outbox.enqueue("alice", &[row(7)]).await.expect("&str");
    let out = outbox.drain(&owned).await.expect("drain &String");
    assert_eq!(delivered(&out), 1);
    outbox
        .enqueue(owned.clone(), &[row(8)])
        .await
        .expect("String");
    let out = outbox.drain(id.clone()).await.expect("drain ActorId");
    assert_eq!(delivered(&out), 1);
    outbox.enqueue(&owned, &[row(9)]).await.expect("&String");
    let control = Arc::new(DrainControl::default());
    let out = outbox
        .drain_with(&id, control)
        .await
        .expect("drain &ActorId");
    assert_eq!(delivered(&out), 1);

    // request_drain takes every form too: each delivers the row enqueued before it.
    let mut n = 9;
    for ask in [
        Box::new(|o: &Outbox| o.request_drain("alice")) as Box<dyn Fn(&Outbox)>,
        Box::new(|o: &Outbox| o.request_drain(String::from("alice"))),
        Box::new(|o: &Outbox| o.request_drain(&owned)),
        Box::new(|o: &Outbox| o.request_drain(id.clone())),
        Box::new(|o: &Outbox| o.request_drain(&id)),
    ] {
        n += 1;
        outbox.enqueue("alice", &[row(n)]).await.expect("enqueue");
        ask(&outbox);
        let rec = Arc::clone(&r);
        let want = n as usize;
        let arrived =
            tokio::task::spawn_blocking(move || rec.wait_for("/in", want, Duration::from_secs(30)))
                .await
                .expect("wait");
        assert!(arrived, "row {n} delivered by its requested drain");
    }
    let got: Vec<String> = r
        .bodies("/in")
        .into_iter()
        .map(|b| String::from_utf8(b).expect("utf-8"))
        .collect();
    let want: Vec<String> = (1..=14).map(|n| n.to_string()).collect();
    assert_eq!(got, want, "in order, once each");

    // The reads take every form too, and see the same lane (its depth may still move: the
    // last acks are group-committed after the answers came).
    let lane = |lanes: Vec<outbox_lanes_tokio::store::LaneStatus>| -> Vec<_> {
        lanes.into_iter().map(|l| (l.lane, l.key)).collect()
    };
    let lanes = lane(outbox.lanes(&id).await.expect("lanes"));
    assert_eq!(lanes.len(), 1);
    assert_eq!(lane(outbox.lanes("alice").await.expect("lanes")), lanes);
    assert_eq!(
        lane(outbox.lanes(owned.clone()).await.expect("lanes")),
        lanes
    );
    assert_eq!(lane(outbox.lanes(&owned).await.expect("lanes")), lanes);
    assert_eq!(lane(outbox.lanes(id.clone()).await.expect("lanes")), lanes);
    for resolved in [
        outbox.resolve(" alice ").expect("&str"),
        outbox.resolve(owned.clone()).expect("String"),
        outbox.resolve(&owned).expect("&String"),
        outbox.resolve(id.clone()).expect("ActorId"),
        outbox.resolve(&id).expect("&ActorId"),
    ] {
        assert_eq!(resolved, id);
    }
    outbox.shutdown().await;
}
