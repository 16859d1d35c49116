//! Per-host concurrency caps, end to end: the blocking runtime on a real SQLite file against
//! two recorders on 127.0.0.1 (two hosts: one port each). Tests assert counts and orders,
//! never durations.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use outbox_lanes_blocking::{DrainOutcome, Outbox, OutboxConfig, store::NewRow};
use outbox_lanes_store::{SqliteOptions, SqliteStore};
use outbox_lanes_test_support::{Recipient, Reply};

const LANES: usize = 6;
const ENTRIES: usize = 4;

/// Drains `ENTRIES` entries to `LANES` inboxes on each of two hosts; returns the two
/// recipients once everything is delivered.
fn drain_two_hosts(per_host: Option<usize>) -> (Recipient, Recipient) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("outbox.db"), SqliteOptions::default())
        .expect("open sqlite");
    let hosts = [
        Recipient::start().expect("recipient"),
        Recipient::start().expect("recipient"),
    ];
    for h in &hosts {
        // Slow enough that every lane's head is sent before the first answer comes back.
        h.set_server_default(Reply::Status(200).after(Duration::from_millis(100)));
    }
    let to: Vec<String> = hosts
        .iter()
        .flat_map(|h| (0..LANES).map(move |l| h.url(&format!("/inbox{l}"))))
        .collect();
    let rows: Vec<NewRow> = (0..ENTRIES)
        .map(|e| NewRow {
            id: format!("e{e}"),
            body: format!("{e}").into_bytes(),
            content_type: "text/plain".into(),
            recipients: to.clone(),
            ..NewRow::default()
        })
        .collect();
    let mut config = OutboxConfig::default().allow_loopback();
    config.concurrency = 16;
    config.per_host = per_host;
    config.http.timeout = Duration::from_secs(10);
    let outbox = Outbox::open(Arc::new(store), config).expect("outbox");
    outbox.enqueue("alice", &rows).expect("enqueue");
    match outbox.drain("alice").expect("drain") {
        DrainOutcome::Ran(r) => assert_eq!(r.delivered, (2 * LANES * ENTRIES) as u64),
        other => panic!("{other:?}"),
    }
    outbox.shutdown();
    let [a, b] = hosts;
    for h in [&a, &b] {
        for l in 0..LANES {
            let got: Vec<Vec<u8>> = h.bodies(&format!("/inbox{l}"));
            let want: Vec<Vec<u8>> = (0..ENTRIES).map(|e| format!("{e}").into_bytes()).collect();
            assert_eq!(got, want, "every entry once, in order");
        }
    }
    (a, b)
}

#[test]
fn a_host_never_sees_more_than_its_cap_and_other_hosts_go_on() {
    let (a, b) = drain_two_hosts(Some(2));
    assert!(a.max_in_progress() <= 2, "host a: {}", a.max_in_progress());
    assert!(b.max_in_progress() <= 2, "host b: {}", b.max_in_progress());
    // Each host had its cap's worth at once: one host's cap did not hold the other up.
    assert_eq!(a.max_in_progress(), 2);
    assert_eq!(b.max_in_progress(), 2);
}

#[test]
fn without_a_cap_a_host_gets_one_attempt_per_lane_at_once() {
    // The control: the recorders do see several requests at once when nothing caps them.
    let (a, b) = drain_two_hosts(None);
    assert!(a.max_in_progress() > 2, "host a: {}", a.max_in_progress());
    assert!(b.max_in_progress() > 2, "host b: {}", b.max_in_progress());
}
