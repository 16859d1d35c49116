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
        headers: Vec::new(),
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

/// When a recorded request ended (answered or not).
fn ended_at(r: &outbox_lanes_test_support::Recorded) -> std::time::Instant {
    match r.completion {
        Completion::Answered { at, .. } | Completion::Unanswered { at, .. } => at,
        Completion::Pending => panic!("a request to {} is still pending", r.path),
    }
}

/// From the first request to `path` arriving to the last one ending.
pub fn span(r: &Recipient, path: &str) -> (std::time::Instant, std::time::Instant) {
    let reqs = r.requests(path);
    let first = reqs.first().expect("a request").arrived_at;
    let last = reqs.iter().map(ended_at).max().expect("a request");
    (first, last)
}

/// Waits on `rt`'s blocking pool until `path` got `n` requests (20 s at most).
pub async fn wait_on(
    rt: &Arc<dyn outbox_lanes_tokio::Runtime>,
    r: &Arc<Recipient>,
    path: &'static str,
    n: usize,
) -> bool {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let r = Arc::clone(r);
    rt.spawn_blocking(Box::new(move || {
        let _ = tx.send(r.wait_for(path, n, Duration::from_secs(20)));
    }));
    rx.await.unwrap_or(false)
}

/// A configuration whose monitor only moves on wake-ups: its safety-net poll (after the one
/// at start) would come long after any test ended.
pub fn wake_only_config(max_passes: usize) -> OutboxConfig {
    let mut c = config();
    c.poll_interval = Duration::from_secs(600);
    c.max_passes = max_passes;
    c
}

/// Two actors, each with a slow recipient of its own, enqueued while the monitor runs and no
/// drain is ever called: the monitor, woken by the enqueues, delivers everything in order.
/// Returns the two actors' delivery spans (first request arrived, last one ended).
pub async fn monitor_drains_two_actors(
    outbox: &outbox_lanes_tokio::Outbox,
    r: &Arc<Recipient>,
) -> [(std::time::Instant, std::time::Instant); 2] {
    use outbox_lanes_test_support::Reply;
    let n = 4;
    for p in ["/a1", "/a2"] {
        r.set_default(p, Reply::Status(200).after(Duration::from_millis(150)));
    }
    let monitor = outbox.monitor().await.expect("monitor");
    for i in 0..n {
        for (actor, p) in [("a1", "/a1"), ("a2", "/a2")] {
            outbox
                .enqueue(actor, &[row(&format!("e{i}"), &[r.url(p)])])
                .await
                .expect("enqueue");
        }
    }
    let rt = outbox.runtime();
    assert!(wait_on(rt, r, "/a1", n).await, "a1 drained by the monitor");
    assert!(wait_on(rt, r, "/a2", n).await, "a2 drained by the monitor");
    monitor.stop().await;
    for p in ["/a1", "/a2"] {
        assert_eq!(bodies(r, p), ids(n), "{p}: every entry, in order, once");
        one_in_flight(r, p);
    }
    let status = outbox.status().await.expect("status");
    assert!(status.iter().all(|s| s.pending == 0), "{status:?}");
    [span(r, "/a1"), span(r, "/a2")]
}

/// The two spans overlap: the two passes ran at the same time.
pub fn overlap(s: [(std::time::Instant, std::time::Instant); 2]) -> bool {
    let [(a0, a1), (b0, b1)] = s;
    a0.max(b0) < a1.min(b1)
}
