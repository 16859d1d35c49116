//! The monitor task on tokio (OL-13): woken by enqueues, it drains several actors at once,
//! at most `max_passes` of them, without any drain call.
#![allow(missing_docs)]
#![cfg(feature = "tokio")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{fixture, monitor_drains_two_actors, overlap, wake_only_config};
use outbox_lanes_test_support::{Recipient, Reply};
use outbox_lanes_tokio::{DrainOutcome, Outbox};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_task_drains_two_actors_concurrently_on_enqueue_wake_ups() {
    let f = fixture();
    let r = Arc::new(Recipient::start().expect("recipient"));
    let outbox = Outbox::open(Arc::clone(&f.store), wake_only_config(8)).expect("outbox");
    let spans = monitor_drains_two_actors(&outbox, &r).await;
    assert!(
        overlap(spans),
        "the two actors' passes ran at once: {spans:?}"
    );
}

/// `max_passes` bounds passes with work (`MonitorBook`'s own tests check the bound): a pass
/// that only waits on its attempts in flight (150 ms recipients here) does not count
/// against it, so with `max_passes` 1 the other actor is drained meanwhile (OL-13). Before,
/// the second actor waited for the first one's whole pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_max_passes_1_a_pass_waiting_on_its_attempts_keeps_no_other_actor_waiting() {
    let f = fixture();
    let r = Arc::new(Recipient::start().expect("recipient"));
    let outbox = Outbox::open(Arc::clone(&f.store), wake_only_config(1)).expect("outbox");
    let spans = monitor_drains_two_actors(&outbox, &r).await;
    assert!(
        overlap(spans),
        "the second actor's pass ran while the first waited: {spans:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_monitor_stops_in_the_background_and_frees_its_slots() {
    let f = fixture();
    let r = Arc::new(Recipient::start().expect("recipient"));
    r.set_default("/slow", Reply::Status(200).after(Duration::from_millis(50)));
    let outbox = Outbox::open(Arc::clone(&f.store), wake_only_config(8)).expect("outbox");
    let monitor = outbox.monitor().await.expect("monitor");
    for i in 0..20 {
        outbox
            .enqueue("actor", &[common::row(&format!("e{i}"), &[r.url("/slow")])])
            .await
            .expect("enqueue");
    }
    assert!(common::wait_on(outbox.runtime(), &r, "/slow", 2).await);
    drop(monitor);
    // The pass stops gracefully in the background (attempts in flight finish, the rest is
    // handed back); until it has, a drain merges into it. The first drain that runs a pass
    // of its own finds work left: the dropped monitor did not go on draining.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match outbox.drain("actor").await.expect("drain") {
            DrainOutcome::Ran(rep) => {
                assert!(rep.delivered > 0, "the monitor stopped early: {rep:?}");
                break;
            }
            DrainOutcome::Merged => {
                assert!(Instant::now() < deadline, "the monitor's pass never ended");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert_eq!(common::dedup_bodies(&r, "/slow"), common::ids(20));
    common::one_in_flight(&r, "/slow");
}

/// A lane stalls and backs off (its `not_before` in the future): the pass ends, and the
/// monitor looks again when the backoff runs out, though no wake-up comes (nothing is
/// written meanwhile) and its safety-net poll is ten minutes away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_comes_back_at_the_lane_not_before_without_a_wake_up() {
    let f = fixture();
    let r = Arc::new(Recipient::start().expect("recipient"));
    r.script("/flaky", [Reply::Status(503), Reply::Status(503)]);
    r.set_default("/flaky", Reply::Status(200));
    let mut config = wake_only_config(8);
    // Two failures in a pass stall the unit; the lane backs off 300 ms.
    config.scheduler.pass_attempts = 2;
    config.scheduler.lane_backoff_base = Duration::from_millis(300);
    let outbox = Outbox::open(Arc::clone(&f.store), config).expect("outbox");
    let monitor = outbox.monitor().await.expect("monitor");
    outbox
        .enqueue("actor", &[common::row("e0", &[r.url("/flaky")])])
        .await
        .expect("enqueue");
    assert!(common::wait_on(outbox.runtime(), &r, "/flaky", 3).await);
    monitor.stop().await;
    let got: Vec<Option<u16>> = r
        .requests("/flaky")
        .iter()
        .map(|q| q.completion.status())
        .collect();
    assert_eq!(got, vec![Some(503), Some(503), Some(200)]);
    let status = outbox.status().await.expect("status");
    assert!(status.iter().all(|s| s.pending == 0), "{status:?}");
}

/// The monitor's upkeep deletes what the store keeps only for a while: the row ids past their
/// dedup window and the finished units past the ack retention. A service that embeds the
/// monitor calls nothing for it (before, only the binary's relay forgot row ids, and nothing
/// deleted the units kept for an ack retention). With retentions of an hour, the same upkeep
/// (every 20 ms, ten times over) keeps everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_upkeep_forgets_row_ids_and_acked_units_past_their_retention() {
    use outbox_lanes_store::{CommonOptions, SqliteOptions, SqliteStore};
    let count = |path: &std::path::Path, sql: &str| -> i64 {
        let c = rusqlite::Connection::open(path).expect("open");
        c.query_row(sql, [], |r| r.get(0)).expect(sql)
    };
    for (retention, kept) in [
        (Duration::from_millis(1), false),
        (Duration::from_secs(3600), true),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("outbox.db");
        let opts = SqliteOptions {
            common: CommonOptions {
                row_id_retention: retention,
                ack_retention: Some(retention),
                ..CommonOptions::default()
            },
            ..SqliteOptions::default()
        };
        let store = SqliteStore::open(&path, opts).expect("open sqlite");
        let r = Arc::new(Recipient::start().expect("recipient"));
        let mut config = common::wake_only_config(8);
        config.upkeep_interval = Duration::from_millis(20);
        let outbox = Outbox::open(Arc::new(store), config).expect("outbox");
        let monitor = outbox.monitor().await.expect("monitor");
        for i in 0..5 {
            outbox
                .enqueue("actor", &[common::row(&format!("e{i}"), &[r.url("/u")])])
                .await
                .expect("enqueue");
        }
        assert!(common::wait_on(outbox.runtime(), &r, "/u", 5).await);
        let deadline = Instant::now() + Duration::from_secs(20);
        let (acked, ids) = loop {
            let acked = count(
                &path,
                "SELECT count(*) FROM ol_units WHERE acked_at IS NOT NULL",
            );
            let ids = count(&path, "SELECT count(*) FROM ol_row_ids");
            let settled = if kept {
                acked == 5
            } else {
                acked == 0 && ids == 0
            };
            if settled || Instant::now() > deadline {
                break (acked, ids);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if kept {
            // Ten upkeeps later, still there.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let acked = count(
                &path,
                "SELECT count(*) FROM ol_units WHERE acked_at IS NOT NULL",
            );
            let ids = count(&path, "SELECT count(*) FROM ol_row_ids");
            assert_eq!((acked, ids), (5, 5), "kept within the retention");
        } else {
            assert_eq!((acked, ids), (0, 0), "deleted by the upkeep");
        }
        monitor.stop().await;
    }
}

/// A stop waits for a running upkeep at most the shutdown grace: an upkeep that cannot get
/// the database's write lock (another connection holds it, and the store would wait two
/// minutes for it) is left to finish in the background, and the stop returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_waits_for_a_blocked_upkeep_at_most_the_shutdown_grace() {
    use outbox_lanes_store::{SqliteOptions, SqliteStore};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("outbox.db");
    let opts = SqliteOptions {
        busy_timeout: Duration::from_secs(120),
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open(&path, opts).expect("open sqlite");
    let mut config = common::wake_only_config(8);
    config.shutdown_grace = Duration::from_millis(200);
    // Opened first: opening widens the outbox's destination policy (a write, OL-24).
    let outbox = Outbox::open(Arc::new(store), config).expect("outbox");
    let holder = rusqlite::Connection::open(&path).expect("open");
    holder.execute_batch("BEGIN IMMEDIATE").expect("write lock");
    let monitor = outbox.monitor().await.expect("monitor");
    // Its first upkeep, at start, now waits for the lock.
    let stopped = tokio::time::timeout(Duration::from_secs(30), monitor.stop()).await;
    holder.execute_batch("ROLLBACK").expect("unlock");
    assert!(
        stopped.is_ok(),
        "the stop waited for the upkeep past the shutdown grace"
    );
}
