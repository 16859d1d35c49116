//! The same driver on the other executors (features `smol` and `async-std`): HTTP through
//! the blocking ureq client on their blocking pools. The core scenario: ordered fan-out with
//! a slow participant, and a cancelled drain.
#![allow(missing_docs)]
#![cfg(any(feature = "smol", feature = "async-std"))]

mod common;

use std::sync::Arc;
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
            .enqueue("case-manager", vec![row(&format!("e{i}"), &to)])
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
        .enqueue("case-manager", vec![row("late", &[r.url("/finder")])])
        .await
        .expect("enqueue");
    let rr = &r;
    let arrived = rr.wait_for("/finder", 21, Duration::from_secs(20));
    assert!(arrived);
    monitor.stop().await;
    outbox.shutdown().await;
}

#[cfg(feature = "smol")]
#[test]
fn ordered_fan_out_on_smol() {
    smol::block_on(fan_out_in_order(Arc::new(outbox_lanes_tokio::SmolRuntime)));
}

#[cfg(feature = "async-std")]
#[test]
fn ordered_fan_out_on_async_std() {
    async_std::task::block_on(fan_out_in_order(Arc::new(
        outbox_lanes_tokio::AsyncStdRuntime,
    )));
}
