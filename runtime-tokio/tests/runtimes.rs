//! The same driver on the other executors (features `smol` and `async-std`): HTTP through
//! the blocking ureq client on their blocking pools. The core scenario: ordered fan-out with
//! a slow participant, the monitor, and a dropped drain future.
#![allow(missing_docs)]
#![cfg(any(feature = "smol", feature = "async-std"))]

mod common;

use std::future::Future as _;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use common::{bodies, config, fixture, ids, one_in_flight, row};
use outbox_lanes_test_support::{Recipient, Reply};
use outbox_lanes_tokio::{DrainOutcome, Outbox, Runtime};

async fn fan_out_in_order(rt: Arc<dyn Runtime>) {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    r.set_default("/slow", Reply::Status(202).after(Duration::from_millis(20)));
    let to = vec![r.url("/finder"), r.url("/vendor"), r.url("/slow")];
    let outbox = Outbox::builder(Arc::clone(&f.store), config())
        .open_on(rt)
        .expect("outbox");
    for i in 0..20 {
        outbox
            .enqueue("case-manager", &[row(&format!("e{i}"), &to)])
            .await
            .expect("enqueue");
    }
    let out = outbox.drain("case-manager").await.expect("drain");
    assert!(
        matches!(out, DrainOutcome::Ran(r) if r.delivered == 60),
        "{out:?}"
    );
    for p in ["/finder", "/vendor", "/slow"] {
        assert_eq!(bodies(&r, p), ids(20), "{p} got its entries in order, once");
        one_in_flight(&r, p);
    }
    // The monitor works on this executor too.
    let monitor = outbox.monitor().await.expect("monitor");
    outbox
        .enqueue("case-manager", &[row("late", &[r.url("/finder")])])
        .await
        .expect("enqueue");
    let rr = &r;
    let arrived = rr.wait_for("/finder", 21, Duration::from_secs(20));
    assert!(arrived);
    monitor.stop().await;
    outbox.shutdown().await;
}

/// A drain future dropped while units are in flight and others wait; the next drain runs a
/// pass and delivers the rest, each lane in order.
async fn cancel_then_drain(rt: Arc<dyn Runtime>) {
    let f = fixture();
    let r = Arc::new(Recipient::start().expect("recipient"));
    r.set_default("/slow", Reply::Status(200).after(Duration::from_millis(50)));
    let to = vec![r.url("/slow"), r.url("/other")];
    let outbox = Outbox::builder(Arc::clone(&f.store), config())
        .open_on(Arc::clone(&rt))
        .expect("outbox");
    for i in 0..20 {
        outbox
            .enqueue("actor", &[row(&format!("e{i}"), &to)])
            .await
            .expect("enqueue");
    }
    // Waits on the runtime's blocking pool for the first request to /slow.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let rr = Arc::clone(&r);
    rt.spawn_blocking(Box::new(move || {
        let _ = tx.send(rr.wait_for("/slow", 1, Duration::from_secs(20)));
    }));
    {
        let mut drain = std::pin::pin!(outbox.drain("actor"));
        let mut arrived = std::pin::pin!(rx);
        let arrived = std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = drain.as_mut().poll(cx) {
                panic!("the drain finished first: {out:?}");
            }
            arrived.as_mut().poll(cx)
        })
        .await;
        assert_eq!(arrived, Ok(true));
        // The drain future is dropped here.
    }
    let again = outbox.drain("actor").await.expect("drain");
    assert!(matches!(again, DrainOutcome::Ran(_)), "{again:?}");
    for p in ["/slow", "/other"] {
        assert_eq!(common::dedup_bodies(&r, p), ids(20), "{p}");
    }
}

/// The monitor task on this executor: woken by enqueues, it drains two actors at once
/// without any drain call.
async fn monitor_drains_two_actors_at_once(rt: Arc<dyn Runtime>) {
    let f = fixture();
    let r = Arc::new(Recipient::start().expect("recipient"));
    let outbox = Outbox::builder(Arc::clone(&f.store), common::wake_only_config(8))
        .open_on(rt)
        .expect("outbox");
    let spans = common::monitor_drains_two_actors(&outbox, &r).await;
    assert!(
        common::overlap(spans),
        "the two passes ran at once: {spans:?}"
    );
    outbox.shutdown().await;
}

#[cfg(feature = "smol")]
#[test]
fn the_monitor_task_on_smol() {
    smol::block_on(monitor_drains_two_actors_at_once(Arc::new(
        outbox_lanes_tokio::SmolRuntime,
    )));
}

#[cfg(feature = "async-std")]
#[test]
fn the_monitor_task_on_async_std() {
    async_std::task::block_on(monitor_drains_two_actors_at_once(Arc::new(
        outbox_lanes_tokio::AsyncStdRuntime,
    )));
}

#[cfg(feature = "smol")]
#[test]
fn ordered_fan_out_on_smol() {
    smol::block_on(fan_out_in_order(Arc::new(outbox_lanes_tokio::SmolRuntime)));
}

#[cfg(feature = "smol")]
#[test]
fn a_dropped_drain_on_smol() {
    smol::block_on(cancel_then_drain(Arc::new(outbox_lanes_tokio::SmolRuntime)));
}

#[cfg(feature = "async-std")]
#[test]
fn ordered_fan_out_on_async_std() {
    async_std::task::block_on(fan_out_in_order(Arc::new(
        outbox_lanes_tokio::AsyncStdRuntime,
    )));
}

#[cfg(feature = "async-std")]
#[test]
fn a_dropped_drain_on_async_std() {
    async_std::task::block_on(cancel_then_drain(Arc::new(
        outbox_lanes_tokio::AsyncStdRuntime,
    )));
}
