//! One error, one name (issue 39): a recipient that never answers within the timeout reads
//! the same, word for word, from both HTTP clients — `timeout: no answer within 700ms`, the
//! error class first and the detail after a colon — so the demo (blocking, ureq), the relay's
//! log (tokio, hyper) and the class the tables show (`timeout`) agree.
#![allow(missing_docs)]
#![cfg(feature = "tokio")]

use std::time::{Duration, SystemTime};

use outbox_lanes_core::UnitId;
use outbox_lanes_core::policy::AddressPolicy;
use outbox_lanes_driver::http::{AttemptResult, Bytes, Delivery, Destination};
use outbox_lanes_driver::ureq_client::HttpClient;
use outbox_lanes_test_support::{Recipient, Reply};
use outbox_lanes_tokio::{AsyncHttpClient, HttpConfig};

const TIMEOUT: Duration = Duration::from_millis(700);

fn delivery<'a>(url: &'a Destination, body: &'a Bytes) -> Delivery<'a> {
    Delivery {
        actor: "actor",
        outbox: "0123abcd",
        unit: UnitId(7),
        recipient: url,
        body,
        content_type: "application/json",
        headers: &[],
        attempt: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_reads_the_same_from_both_clients() {
    let r = Recipient::start().expect("recipient");
    r.set_default("/hang", Reply::Hang);
    let cfg = HttpConfig {
        addresses: AddressPolicy::allow_loopback_only(),
        timeout: TIMEOUT,
        ..HttpConfig::default()
    };
    let url = Destination::parse(&r.url("/hang"));
    let a = AsyncHttpClient::new(cfg.clone(), None).expect("async client");
    let body = Bytes::from_static(b"{}");
    let async_result: AttemptResult = a.deliver(&delivery(&url, &body), SystemTime::now()).await;
    let b = HttpClient::new(cfg, None).expect("blocking client");
    let blocking_result = tokio::task::spawn_blocking(move || {
        let body = Bytes::from_static(b"{}");
        b.deliver(&delivery(&url, &body), SystemTime::now())
    })
    .await
    .expect("join");
    let want = format!("timeout: no answer within {TIMEOUT:?}");
    assert_eq!(async_result.error.as_deref(), Some(want.as_str()));
    assert_eq!(blocking_result.error.as_deref(), Some(want.as_str()));
}
