//! Signing end to end: the tokio runtime on a real SQLite file, delivering with reqwest to
//! loopback recorders, every request checked by an independent HTTP Signatures verifier
//! (test-support's, written from the draft-cavage spec). Tests assert relations between the
//! recorded times, never durations.
#![allow(missing_docs)]
#![cfg(feature = "tokio")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::{config, fixture, row};
use outbox_lanes_core::Outcome;
use outbox_lanes_test_support::signatures::{
    ALICE_PRIVATE_PKCS8, ALICE_PUBLIC, BOB_PRIVATE_PKCS1, BOB_PUBLIC, verify_http_signature,
};
use outbox_lanes_test_support::{Recipient, Reply};
use outbox_lanes_tokio::sign::{ActorKey, HttpSignatures};
use outbox_lanes_tokio::{DrainControl, DrainOutcome, Hooks, Outbox};

const ALICE: &str = "https://social.example/users/alice";
const BOB: &str = "https://social.example/users/bob";

fn signer() -> Arc<HttpSignatures> {
    let mut s = HttpSignatures::new();
    s.insert(
        ALICE,
        ActorKey::from_pem(format!("{ALICE}#main-key"), ALICE_PRIVATE_PKCS8).expect("alice"),
    );
    s.insert(
        BOB,
        ActorKey::from_pem(format!("{BOB}#main-key"), BOB_PRIVATE_PKCS1).expect("bob"),
    );
    Arc::new(s)
}

/// The `Date` header as Unix seconds.
fn date_secs(date: &str) -> u64 {
    httpdate::parse_http_date(date)
        .expect("an HTTP date")
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attempt_verifies_and_a_retry_carries_a_fresh_date() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    // Alice's first attempt is refused once: its retry must be signed again, with a new Date.
    r.script("/inbox/a", [Reply::Status(503)]);
    let mut cfg = config();
    // Over a second, so the two attempts' Dates (whole seconds) differ.
    cfg.scheduler.retry_delays = vec![Duration::from_millis(1500)];
    cfg.scheduler.jitter_percent = 0;
    let outbox = Outbox::builder(Arc::clone(&f.store), cfg)
        .signer(signer())
        .open()
        .expect("outbox");
    outbox
        .enqueue(ALICE, vec![row("a0", &[r.url("/inbox/a")])])
        .await
        .expect("enqueue");
    outbox
        .enqueue(BOB, vec![row("b0", &[r.url("/inbox/b")])])
        .await
        .expect("enqueue");
    let before = SystemTime::now();
    for actor in [ALICE, BOB] {
        let out = outbox.drain(actor).await.expect("drain");
        assert!(
            matches!(out, DrainOutcome::Ran(rep) if rep.delivered == 1),
            "{out:?}"
        );
    }
    let after = SystemTime::now();

    let a = r.requests("/inbox/a");
    assert_eq!(a.len(), 2, "alice: 503, then 200");
    let mut dates = Vec::new();
    for req in &a {
        let v = verify_http_signature(req, ALICE_PUBLIC).expect("alice's signature verifies");
        assert_eq!(v.key_id, format!("{ALICE}#main-key"));
        assert!(
            verify_http_signature(req, BOB_PUBLIC).is_err(),
            "not bob's key"
        );
        let d = date_secs(&v.date);
        assert!(
            unix_secs(before) <= d && d <= unix_secs(after),
            "the Date is the attempt's"
        );
        dates.push(d);
    }
    assert!(
        dates[0] < dates[1],
        "the retry is signed with a fresh Date: {dates:?}"
    );
    let b = r.requests("/inbox/b");
    assert_eq!(b.len(), 1);
    let v = verify_http_signature(&b[0], BOB_PUBLIC).expect("bob's signature verifies");
    assert_eq!(v.key_id, format!("{BOB}#main-key"));

    // What the verifier refuses: another body, another Date, another path.
    let mut tampered = a[1].clone();
    tampered.body = b"{\"id\":\"evil\"}".to_vec();
    let err = verify_http_signature(&tampered, ALICE_PUBLIC).expect_err("tampered body");
    assert!(err.contains("Digest"), "{err}");
    let mut tampered = a[1].clone();
    for (name, value) in &mut tampered.headers {
        if name.eq_ignore_ascii_case("date") {
            *value = httpdate::fmt_http_date(SystemTime::UNIX_EPOCH);
        }
    }
    assert!(
        verify_http_signature(&tampered, ALICE_PUBLIC).is_err(),
        "tampered Date"
    );
    let mut tampered = a[1].clone();
    tampered.target = "/inbox/b".to_owned();
    assert!(
        verify_http_signature(&tampered, ALICE_PUBLIC).is_err(),
        "another inbox"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_without_a_key_is_not_sent_and_loses_nothing() {
    let f = fixture();
    let r = Recipient::start().expect("recipient");
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let control = Arc::new(DrainControl::default());
    let (seen, stop) = (Arc::clone(&outcomes), Arc::clone(&control));
    let carol = "https://social.example/users/carol";
    let outbox = Outbox::builder(Arc::clone(&f.store), config())
        .signer(signer())
        .hooks(Hooks {
            attempted: Some(Box::new(move |a| {
                let mut seen = seen.lock().expect("lock");
                seen.push(a.outcome);
                // Retried, never counted: a drain would go on; stop it after a few.
                if seen.len() == 3 {
                    stop.request_stop();
                }
            })),
            ..Hooks::default()
        })
        .open()
        .expect("outbox");
    outbox
        .enqueue(carol, vec![row("c0", &[r.url("/inbox/c")])])
        .await
        .expect("enqueue");
    let out = outbox.drain_with(carol, control).await.expect("drain");
    assert!(
        matches!(out, DrainOutcome::Ran(rep) if rep.delivered == 0 && rep.dead_lettered == 0),
        "{out:?}"
    );
    assert_eq!(r.count("/inbox/c"), 0, "nothing was sent unsigned");
    let outcomes = outcomes.lock().expect("lock").clone();
    assert!(outcomes.len() >= 3, "{outcomes:?}");
    assert!(
        outcomes.iter().all(|o| *o == Outcome::NotSent),
        "{outcomes:?}"
    );
    let lanes = outbox.lanes(carol).await.expect("lanes");
    assert_eq!(lanes.len(), 1);
    assert_eq!(
        (lanes[0].depth, lanes[0].backoff_level),
        (1, 0),
        "kept, no backoff"
    );
    outbox.shutdown().await;

    // With carol's key the unit goes out, signed, at its first counted attempt.
    let mut keys = HttpSignatures::new();
    keys.insert(
        carol,
        ActorKey::from_pem(format!("{carol}#main-key"), BOB_PRIVATE_PKCS1).expect("key"),
    );
    let outbox = Outbox::builder(Arc::clone(&f.store), config())
        .signer(Arc::new(keys))
        .open()
        .expect("outbox");
    let out = outbox.drain(carol).await.expect("drain");
    assert!(
        matches!(out, DrainOutcome::Ran(rep) if rep.delivered == 1),
        "{out:?}"
    );
    let got = r.requests("/inbox/c");
    assert_eq!(got.len(), 1);
    verify_http_signature(&got[0], BOB_PUBLIC).expect("verifies");
    assert!(outbox.dead_letters(None).await.expect("dl").is_empty());
}
