//! The threads of an idle service: delivery workers start as attempts need them, not all at
//! open. One test in this binary, so that no other test's threads are counted.
//!
//! `cargo test -p outbox-lanes-blocking --test threads -- --nocapture` prints the figures of
//! BENCHMARKS.md ("Threads of the blocking runtime").

use std::sync::Arc;
use std::time::Duration;

use outbox_lanes_blocking::{Outbox, OutboxConfig};
use outbox_lanes_store::{NewRow, SqliteOptions, SqliteStore};
use outbox_lanes_test_support::Recipient;

/// The threads of this process whose name starts with `prefix` (Linux: `/proc/self/task`).
fn threads(prefix: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// The names of the library's threads, for a failure's message.
fn names() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut names: Vec<String> = tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_owned())
        .filter(|n| n.starts_with("outbox-lanes"))
        .collect();
    names.sort();
    names
}

/// Waits (bounded: 30 s, as long as a loaded machine may take to start a thread) until
/// `pred` holds of the library's thread count; the last count.
fn settle(pred: impl Fn(usize) -> bool) -> usize {
    let mut n = threads("outbox-lanes");
    for _ in 0..3_000 {
        if pred(n) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        n = threads("outbox-lanes");
    }
    n
}

#[cfg(target_os = "linux")]
#[test]
fn an_idle_service_runs_a_handful_of_threads_and_workers_start_as_attempts_need_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store =
        SqliteStore::open(dir.path().join("outbox.db"), SqliteOptions::default()).expect("open");
    let r = Recipient::start().expect("recipient");
    assert_eq!(
        threads("outbox-lanes"),
        0,
        "nothing of the library runs yet"
    );
    let process_before = threads("");

    let config = OutboxConfig::default().allow_loopback();
    assert_eq!(config.concurrency, 256, "the default cap");
    let outbox = Outbox::open(Arc::new(store), config).expect("outbox");
    let at_open = threads("outbox-lanes");
    let monitor = outbox.monitor().expect("monitor");
    // The monitor's task and the store's watcher.
    let with_monitor =
        settle(|_| threads("outbox-lanes-ta") == 1 && threads("outbox-lanes-sq") == 1);

    let recipients: Vec<String> = (1..=3).map(|i| r.url(&format!("/inbox{i}"))).collect();
    let row = NewRow {
        id: "activity-1".into(),
        body: b"{}".to_vec(),
        recipients: recipients.clone(),
        ..NewRow::default()
    };
    outbox.enqueue("alice", &[row]).expect("enqueue");
    for i in 1..=3 {
        assert!(
            r.wait_for(&format!("/inbox{i}"), 1, Duration::from_secs(20)),
            "delivered to /inbox{i}"
        );
    }
    let workers = settle(|_| threads("outbox-lanes-wo") > 0 && threads("outbox-lanes-ta") <= 1);
    let worker_threads = threads("outbox-lanes-wo");
    let process_after = threads("");
    println!(
        "library threads: {at_open} at open, {with_monitor} with the monitor, {workers} idle after \
         delivering to 3 recipients ({worker_threads} of them delivery workers); the process: \
         {process_before} threads before open, {process_after} after (the test harness and the \
         recipient's threads included)"
    );
    assert!(
        at_open <= 3,
        "at open only the ack writer and the hosts' writer run, no delivery worker: {at_open}"
    );
    assert!(
        (1..=3).contains(&worker_threads),
        "one worker per attempt in flight at most, 3 recipients: {worker_threads}"
    );
    assert!(
        workers <= with_monitor + 3,
        "the pass ended; only the workers were added: {workers} vs {with_monitor}: {:?}",
        names()
    );
    let stopped = monitor.stop();
    assert!(!stopped.grace_over, "{stopped:?}");
    drop(outbox);
    assert_eq!(
        settle(|n| n == 0),
        0,
        "stopped and dropped, the outbox leaves no thread behind (idle workers end with the pool)"
    );
}
