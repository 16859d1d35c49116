//! The tokio runtime on `PgStore`, opened where an async service opens it: on an executor
//! thread. The blocking Postgres client owns a runtime of its own and panics when used on one;
//! the outbox must touch the store only on its blocking pool and its own threads.
#![allow(missing_docs)]
#![cfg(all(feature = "tokio", feature = "postgres"))]

mod common;

use std::sync::Arc;

use common::{bodies, ids, row};
use outbox_lanes_store::postgres::postgres;
use outbox_lanes_store::{PgOptions, PgStore, Store};
use outbox_lanes_test_support::{Recipient, pg_url};
use outbox_lanes_tokio::{DrainOutcome, Outbox};

/// Opens a store on a schema of its own, delivers 10 rows in order by a drain and 5 more by
/// the monitor, reads status, lanes and dead letters, shuts down and drops the outbox, all
/// from an executor thread of `rt`.
fn opens_and_delivers_on_an_executor_thread(rt: tokio::runtime::Runtime, name: &str) {
    let Some(url) = pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let url = outbox_lanes_test_support::pg_url_without_tls(&url);
    let schema = format!("ol_t_tokio_{name}_{}", std::process::id());
    let opts = PgOptions {
        schema: schema.clone(),
        ..PgOptions::default()
    };
    let r = Recipient::start().expect("recipient");
    let to = vec![r.url("/inbox")];
    let connect = url.clone();
    rt.block_on(async {
        let store = tokio::task::spawn_blocking(move || PgStore::connect(&connect, opts))
            .await
            .expect("join")
            .expect("connect");
        let store: Arc<dyn Store> = Arc::new(store);
        // On the executor thread: it reads the store's host records (on a thread of its own).
        let outbox = Outbox::open(store, common::config()).expect("open on an executor thread");
        let rows: Vec<_> = (0..10).map(|i| row(&format!("e{i}"), &to)).collect();
        outbox.enqueue("alice", &rows).await.expect("enqueue");
        let out = outbox.drain("alice").await.expect("drain");
        assert!(
            matches!(out, DrainOutcome::Ran(r) if r.delivered == 10),
            "{out:?}"
        );
        // The rest of the async surface, each touching the store.
        let monitor = outbox.monitor().await.expect("monitor");
        let more: Vec<_> = (10..15).map(|i| row(&format!("e{i}"), &to)).collect();
        outbox.enqueue("alice", &more).await.expect("enqueue");
        // Delivered, then acked: acks are group-committed a little after the deliveries.
        let mut status = Vec::new();
        for _ in 0..500 {
            status = outbox.status().await.expect("status");
            if r.count("/inbox") == 15 && status.iter().all(|s| s.pending == 0) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(status.iter().all(|s| s.pending == 0), "{status:?}");
        assert_eq!(outbox.lanes("alice").await.expect("lanes").len(), 1);
        assert!(
            outbox
                .dead_letters(None)
                .await
                .expect("dead letters")
                .is_empty()
        );
        monitor.stop().await;
        outbox.shutdown().await;
        // The last handle, dropped here: the store goes on the blocking pool.
        drop(outbox);
    });
    drop(rt);
    assert_eq!(
        bodies(&r, "/inbox"),
        ids(15),
        "delivered once each, in order"
    );
    let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("admin");
    c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .expect("drop schema");
}

#[test]
fn a_pg_outbox_opens_on_a_current_thread_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    opens_and_delivers_on_an_executor_thread(rt, "current");
}

#[test]
fn a_pg_outbox_opens_on_a_multi_thread_runtime() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    opens_and_delivers_on_an_executor_thread(rt, "multi");
}
