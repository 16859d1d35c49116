//! Cancellation safety (OL-14): a drain future dropped, a drain cut by a timeout, a monitor
//! stopped mid-pass. In each case every unit comes back in order, nothing stays claimed
//! until a lease runs out, and a later drain delivers the rest, each lane in order
//! (at-least-once: an abandoned attempt may be resent right after, so consecutive resends
//! are collapsed before comparing). Tests assert orders and relations, never durations.
#![allow(missing_docs)]
#![cfg(feature = "tokio")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{config, dedup_bodies, fixture, ids, one_in_flight, row};
use outbox_lanes_test_support::{Recipient, Reply};
use outbox_lanes_tokio::{DrainOutcome, Outbox, OutboxConfig};

/// A lease far longer than any test: a slot freed by its lease running out instead of by
/// the cancelled pass would make `drain_runs_a_pass` fail.
fn long_lease() -> OutboxConfig {
    let mut c = config();
    c.lease = Duration::from_secs(600);
    c
}

/// The slot is free for a new drain at once: it runs a pass of its own (after the
/// cancelled pass finished handing back), neither merging into the cancelled pass nor
/// waiting for the (long) lease.
async fn drain_runs_a_pass(outbox: &Outbox) -> DrainOutcome {
    outbox.drain("actor").await.expect("drain")
}

async fn wait_for(r: &Arc<Recipient>, path: &'static str, n: usize) {
    let r = Arc::clone(r);
    let arrived = tokio::task::spawn_blocking(move || r.wait_for(path, n, Duration::from_secs(20)))
        .await
        .expect("join");
    assert!(arrived, "{n} requests reached {path}");
}

async fn enqueue_fan_out(outbox: &Outbox, r: &Recipient, n: usize) {
    let to = vec![r.url("/slow"), r.url("/other")];
    for i in 0..n {
        outbox
            .enqueue("actor", &[row(&format!("e{i}"), &to)])
            .await
            .expect("enqueue");
    }
}

async fn everything_arrived_in_order(outbox: &Outbox, r: &Recipient, n: usize) {
    for p in ["/slow", "/other"] {
        assert_eq!(dedup_bodies(r, p), ids(n), "{p}: every entry, in order");
    }
    let status = outbox.status().await.expect("status");
    assert!(
        status.iter().all(|s| s.pending == 0 && s.dead_letters == 0),
        "{status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_drain_future_hands_everything_back_and_frees_the_slot() {
    let f = fixture();
    let r = Arc::new(Recipient::start().expect("recipient"));
    r.set_default("/slow", Reply::Status(200).after(Duration::from_millis(50)));
    let outbox = Outbox::open(Arc::clone(&f.store), long_lease()).expect("outbox");
    enqueue_fan_out(&outbox, &r, 30).await;

    let ob = outbox.clone();
    let task = tokio::spawn(async move { ob.drain("actor").await });
    // Units are in flight on /slow and others wait behind them.
    wait_for(&r, "/slow", 2).await;
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
    let cut_at = r.count("/slow");
    assert!(cut_at < 30, "the drain was cut before it was done");

    let again = drain_runs_a_pass(&outbox).await;
    assert!(matches!(again, DrainOutcome::Ran(_)), "{again:?}");
    everything_arrived_in_order(&outbox, &r, 30).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_cut_by_a_timeout_hands_everything_back_and_frees_the_slot() {
    let f = fixture();
    let r = Arc::new(Recipient::start().expect("recipient"));
    // 20 units at 100 ms each on one lane: far more than the timeout below.
    r.set_default(
        "/slow",
        Reply::Status(200).after(Duration::from_millis(100)),
    );
    let outbox = Outbox::open(Arc::clone(&f.store), long_lease()).expect("outbox");
    enqueue_fan_out(&outbox, &r, 20).await;

    let cut = tokio::time::timeout(Duration::from_millis(300), outbox.drain("actor")).await;
    assert!(cut.is_err(), "the timeout cut the drain: {cut:?}");
    assert!(r.count("/slow") < 20);

    let again = drain_runs_a_pass(&outbox).await;
    assert!(matches!(again, DrainOutcome::Ran(_)), "{again:?}");
    everything_arrived_in_order(&outbox, &r, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_select_that_drops_the_drain_is_a_cancellation_too() {
    let f = fixture();
    let r = Arc::new(Recipient::start().expect("recipient"));
    r.set_default("/slow", Reply::Status(200).after(Duration::from_millis(50)));
    let outbox = Outbox::open(Arc::clone(&f.store), long_lease()).expect("outbox");
    enqueue_fan_out(&outbox, &r, 20).await;

    let rr = Arc::clone(&r);
    let first_arrived = async move { wait_for(&rr, "/slow", 1).await };
    tokio::select! {
        out = outbox.drain("actor") => panic!("the drain finished first: {out:?}"),
        () = first_arrived => {}
    }
    let again = drain_runs_a_pass(&outbox).await;
    assert!(matches!(again, DrainOutcome::Ran(_)), "{again:?}");
    everything_arrived_in_order(&outbox, &r, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_stopped_mid_pass_hands_back_and_the_next_outbox_takes_over_at_once() {
    let f = fixture();
    let r = Arc::new(Recipient::start().expect("recipient"));
    r.set_default("/slow", Reply::Status(200).after(Duration::from_millis(50)));
    let outbox = Outbox::open(Arc::clone(&f.store), long_lease()).expect("outbox");
    let monitor = outbox.monitor().await.expect("monitor");
    enqueue_fan_out(&outbox, &r, 30).await;
    wait_for(&r, "/slow", 3).await;
    // Graceful: attempts in flight finish, the rest is handed back, the slot released.
    let stopped = monitor.stop().await;
    assert!(
        !stopped.grace_over,
        "answered within the grace: {stopped:?}"
    );
    let first = r.count("/slow");
    assert!(first < 30, "the monitor's pass was stopped early");

    // The monitor's stop is the outbox's: the next outbox on the store finds the slot free
    // at once (the stop waited for its passes; the lease is long).
    let outbox = Outbox::open(Arc::clone(&f.store), long_lease()).expect("outbox");
    let again = outbox.drain("actor").await.expect("drain");
    assert!(
        matches!(again, DrainOutcome::Ran(rep) if rep.delivered > 0),
        "{again:?}"
    );
    everything_arrived_in_order(&outbox, &r, 30).await;
    // Nothing was abandoned in flight: one request at a time on /slow throughout.
    one_in_flight(&r, "/slow");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_drains_several_actors_on_enqueue() {
    let f = fixture();
    let r = Arc::new(Recipient::start().expect("recipient"));
    let outbox = Outbox::open(Arc::clone(&f.store), config()).expect("outbox");
    let monitor = outbox.monitor().await.expect("monitor");
    for i in 0..5 {
        outbox
            .enqueue("a1", &[row(&format!("e{i}"), &[r.url("/one")])])
            .await
            .expect("enqueue");
        outbox
            .enqueue("a2", &[row(&format!("e{i}"), &[r.url("/two")])])
            .await
            .expect("enqueue");
    }
    wait_for(&r, "/one", 5).await;
    wait_for(&r, "/two", 5).await;
    monitor.stop().await;
    assert_eq!(common::bodies(&r, "/one"), ids(5));
    assert_eq!(common::bodies(&r, "/two"), ids(5));
}
