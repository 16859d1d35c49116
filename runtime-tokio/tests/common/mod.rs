//! Fixtures shared by the async runtime's end-to-end tests: a real SQLite file and real
//! loopback recorders.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use outbox_lanes_store::{SqliteOptions, SqliteStore, Store};
use outbox_lanes_test_support::{Completion, Recipient};
use outbox_lanes_tokio::OutboxConfig;
use outbox_lanes_tokio::store::NewRow;

pub struct Fixture {
    _dir: tempfile::TempDir,
    pub store: Arc<dyn Store>,
}

pub fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("outbox.db"), SqliteOptions::default())
        .expect("open sqlite");
    Fixture {
        _dir: dir,
        store: Arc::new(store),
    }
}

pub fn config() -> OutboxConfig {
    let mut c = OutboxConfig::default().allow_loopback();
    c.scheduler.retry_delays = vec![Duration::from_millis(20), Duration::from_millis(40)];
    c.scheduler.lane_backoff_base = Duration::from_secs(60);
    c.http.timeout = Duration::from_secs(2);
    c.concurrency = 8;
    c
}

pub fn row(id: &str, to: &[String]) -> NewRow {
    NewRow {
        id: id.to_string(),
        body: format!("{{\"id\":\"{id}\"}}").into_bytes(),
        content_type: "application/json".to_string(),
        recipients: to.to_vec(),
        dedup_key: None,
        ordering_key: None,
        joined: false,
    }
}

pub fn bodies(r: &Recipient, path: &str) -> Vec<String> {
    r.bodies(path)
        .into_iter()
        .map(|b| String::from_utf8(b).expect("utf-8"))
        .collect()
}

pub fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{{\"id\":\"e{i}\"}}")).collect()
}

/// Each request to `path` arrived after the previous one was answered: one in flight.
pub fn one_in_flight(r: &Recipient, path: &str) {
    let reqs = r.requests(path);
    for w in reqs.windows(2) {
        match w[0].completion {
            Completion::Answered { at, .. } | Completion::Unanswered { at, .. } => {
                assert!(w[1].arrived_at >= at, "two requests in flight on {path}")
            }
            Completion::Pending => panic!("a request to {path} is still pending"),
        }
    }
}

/// What `path` received with consecutive resends collapsed (at-least-once: a unit whose
/// answer was abandoned is sent again right after).
pub fn dedup_bodies(r: &Recipient, path: &str) -> Vec<String> {
    let mut got = bodies(r, path);
    got.dedup();
    got
}
