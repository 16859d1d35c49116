//! Every method of the outbox that names an actor takes it the same way, `impl Into<ActorId>`:
//! `&str`, `String`, `&String`, `ActorId` and `&ActorId` all compile and name the same outbox,
//! on a real in-memory SQLite store delivering over HTTP to a recorder on loopback.
#![allow(missing_docs)]

use std::sync::Arc;

use outbox_lanes_blocking::core::{ActorId, AliasResolver};
use outbox_lanes_blocking::store::{NewRow, SqliteStore};
use outbox_lanes_blocking::{DrainControl, DrainOutcome, Outbox, OutboxConfig};
use outbox_lanes_test_support::Recipient;

fn outbox() -> Outbox {
    let store = Arc::new(SqliteStore::in_memory().expect("in-memory store"));
    Outbox::open(store, OutboxConfig::default().allow_loopback()).expect("outbox")
}

fn delivered(out: &DrainOutcome) -> u64 {
    match out {
        DrainOutcome::Ran(r) => r.delivered,
        other => panic!("a drain of its own was expected: {other:?}"),
    }
}

#[test]
fn every_spelling_of_an_actor_names_one_outbox() {
    let r = Recipient::start().expect("recipient");
    let outbox = outbox();
    let owned = String::from("alice");
    let id = ActorId::new("alice");
    let row = |n: u32| {
        NewRow::new(format!("r{n}"))
            .body(n.to_string())
            .recipient(r.url("/in"))
    };

    // Five rows, one by each form: one outbox holds them.
    outbox.enqueue("alice", &[row(1)]).expect("&str");
    outbox.enqueue(owned.clone(), &[row(2)]).expect("String");
    outbox.enqueue(&owned, &[row(3)]).expect("&String");
    outbox.enqueue(id.clone(), &[row(4)]).expect("ActorId");
    outbox.enqueue(&id, &[row(5)]).expect("&ActorId");
    let status = outbox.status().expect("status");
    assert_eq!(status.len(), 1, "one outbox: {status:?}");
    assert_eq!((&status[0].actor, status[0].pending), (&id, 5));
    assert_eq!(delivered(&outbox.drain("alice").expect("drain &str")), 5);

    // Each drain form delivers a row another form enqueued.
    outbox.enqueue(&id, &[row(6)]).expect("&ActorId");
    assert_eq!(
        delivered(&outbox.drain(owned.clone()).expect("drain String")),
        1
    );
    outbox.enqueue("alice", &[row(7)]).expect("&str");
    assert_eq!(delivered(&outbox.drain(&owned).expect("drain &String")), 1);
    outbox.enqueue(owned.clone(), &[row(8)]).expect("String");
    assert_eq!(
        delivered(&outbox.drain(id.clone()).expect("drain ActorId")),
        1
    );
    outbox.enqueue(&owned, &[row(9)]).expect("&String");
    let control = Arc::new(DrainControl::default());
    assert_eq!(
        delivered(&outbox.drain_with(&id, &control).expect("drain &ActorId")),
        1
    );
    let got: Vec<String> = r
        .bodies("/in")
        .into_iter()
        .map(|b| String::from_utf8(b).expect("utf-8"))
        .collect();
    assert_eq!(
        got,
        ["1", "2", "3", "4", "5", "6", "7", "8", "9"],
        "in order, once each"
    );

    // The reads take every form too, and see the same lane.
    let lanes = outbox.lanes(&id).expect("lanes");
    assert_eq!(lanes.len(), 1);
    assert_eq!(outbox.lanes("alice").expect("lanes"), lanes);
    assert_eq!(outbox.lanes(owned.clone()).expect("lanes"), lanes);
    assert_eq!(outbox.lanes(&owned).expect("lanes"), lanes);
    assert_eq!(outbox.lanes(id.clone()).expect("lanes"), lanes);
    for resolved in [
        outbox.resolve(" alice ").expect("&str"),
        outbox.resolve(owned.clone()).expect("String"),
        outbox.resolve(&owned).expect("&String"),
        outbox.resolve(id.clone()).expect("ActorId"),
        outbox.resolve(&id).expect("&ActorId"),
    ] {
        assert_eq!(resolved, id);
    }
}

/// An `ActorId` is a spelling to the resolver like any other: an alias given as an `ActorId`
/// names its canonical outbox, and the canonical id names itself.
#[test]
fn an_actor_id_is_resolved_like_a_str() {
    let r = Recipient::start().expect("recipient");
    let store = Arc::new(SqliteStore::in_memory().expect("in-memory store"));
    let outbox = Outbox::builder(store, OutboxConfig::default().allow_loopback())
        .resolver(AliasResolver::new().actor("https://example.com/users/alice", &["alice"]))
        .open()
        .expect("outbox");
    let alias = ActorId::new("alice");
    let canonical = ActorId::new("https://example.com/users/alice");
    assert_eq!(outbox.resolve(&alias).expect("alias"), canonical);
    assert_eq!(outbox.resolve(&canonical).expect("canonical"), canonical);
    let row = NewRow::new("r1").body("1").recipient(r.url("/in"));
    outbox.enqueue(&alias, &[row]).expect("enqueue by alias");
    let status = outbox.status().expect("status");
    assert_eq!(status.len(), 1, "{status:?}");
    assert_eq!(status[0].actor, canonical);
    assert_eq!(delivered(&outbox.drain(&canonical).expect("drain")), 1);
    assert_eq!(r.count("/in"), 1);
    assert!(
        outbox.resolve(ActorId::new("bob")).is_err(),
        "unknown actor"
    );
}
