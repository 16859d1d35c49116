//! HTTP Signatures over the blocking client (ureq) to a loopback recorder, checked by the
//! independent verifier of test-support (written from the draft-cavage spec).

#![allow(clippy::unwrap_used)] // a failing unwrap is a failing test

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use outbox_lanes_blocking::http::{Bytes, Delivery, Destination, HttpClient, HttpConfig};
use outbox_lanes_blocking::sign::{ActorKey, HttpSignatures};
use outbox_lanes_core::policy::AddressPolicy;
use outbox_lanes_core::{Outcome, UnitId};
use outbox_lanes_test_support::signatures::{
    ALICE_PRIVATE_PKCS8, ALICE_PUBLIC, verify_http_signature,
};
use outbox_lanes_test_support::{Recipient, Reply};

const ALICE: &str = "https://social.example/users/alice";

fn client() -> HttpClient {
    let mut keys = HttpSignatures::new();
    keys.insert(
        ALICE,
        ActorKey::from_pem(format!("{ALICE}#main-key"), ALICE_PRIVATE_PKCS8).unwrap(),
    );
    let cfg = HttpConfig {
        addresses: AddressPolicy::allow_loopback_only(),
        // The draft-cavage verifier of these tests (`auto` would sign RFC 9421 first).
        signature: outbox_lanes_blocking::SignatureMode::Cavage,
        ..HttpConfig::default()
    };
    HttpClient::new(cfg, Some(Arc::new(keys))).unwrap()
}

fn deliver(c: &HttpClient, actor: &str, url: &str, attempt: u32, at: SystemTime) -> Outcome {
    c.deliver(
        &Delivery {
            actor,
            outbox: "0123abcd",
            unit: UnitId(3),
            recipient: &Destination::parse(url),
            body: &Bytes::from_static(br#"{"type":"Create"}"#),
            content_type: "application/activity+json",
            headers: &[],
            attempt,
        },
        at,
    )
    .outcome
}

#[test]
fn each_attempt_is_signed_with_its_own_date_and_verifies() {
    let r = Recipient::start().unwrap();
    r.script("/users/bob/inbox", [Reply::Status(503)]);
    let c = client();
    // A non-canonical spelling: what is signed is what is sent.
    let url = r.url("/users/./bob/inbox").replace("http://", "HTTP://");
    let t1 = SystemTime::now();
    let t2 = t1 + Duration::from_secs(3);
    assert!(matches!(
        deliver(&c, ALICE, &url, 1, t1),
        Outcome::Transient { .. }
    ));
    assert_eq!(deliver(&c, ALICE, &url, 2, t2), Outcome::Delivered);
    let got = r.requests("/users/bob/inbox");
    assert_eq!(got.len(), 2);
    for (req, at) in got.iter().zip([t1, t2]) {
        let v = verify_http_signature(req, ALICE_PUBLIC).unwrap();
        assert_eq!(
            v.date,
            httpdate::fmt_http_date(at),
            "the attempt's own Date"
        );
        assert_eq!(req.header("host"), Some(r.addr().to_string().as_str()));
        let mut tampered = req.clone();
        tampered.body.push(b' ');
        assert!(verify_http_signature(&tampered, ALICE_PUBLIC).is_err());
    }
    assert_ne!(got[0].header("signature"), got[1].header("signature"));
}

#[test]
fn an_actor_without_a_key_sends_nothing() {
    let r = Recipient::start().unwrap();
    let c = client();
    let res = c.deliver(
        &Delivery {
            actor: "https://social.example/users/carol",
            outbox: "0123abcd",
            unit: UnitId(4),
            recipient: &Destination::parse(&r.url("/inbox")),
            body: &Bytes::from_static(b"{}"),
            content_type: "application/json",
            headers: &[],
            attempt: 1,
        },
        SystemTime::now(),
    );
    assert_eq!(res.outcome, Outcome::NotSent);
    let error = res.error.unwrap();
    assert!(
        error.starts_with(
            "not_sent: no signing key for actor \"https://social.example/users/carol\""
        ),
        "{error}"
    );
    // Bounded: a request would have been recorded before `deliver` returned.
    assert_eq!(r.count("/inbox"), 0);
}
