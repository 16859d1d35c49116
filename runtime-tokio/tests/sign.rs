//! Signing end to end: the tokio runtime on a real SQLite file, delivering with hyper-util to
//! loopback recorders, every request checked by independent HTTP Signatures verifiers:
//! test-support's (written from the draft-cavage spec), and two we did not write, `sigh`
//! (draft-cavage, over OpenSSL) and `httpsig-hyper` (RFC 9421). Tests assert relations
//! between the recorded times, never durations.
#![allow(missing_docs)]
#![cfg(feature = "tokio")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::{config, fixture, row};
use outbox_lanes_core::Outcome;
use outbox_lanes_driver::http::{Bytes, Delivery, Destination, HttpConfig, RequestPolicy};
use outbox_lanes_test_support::signatures::{
    ALICE_PRIVATE_PKCS8, ALICE_PUBLIC, BOB_PRIVATE_PKCS1, BOB_PUBLIC, CAROL_ED25519_PRIVATE,
    CAROL_ED25519_PUBLIC, verify_http_signature,
};
use outbox_lanes_test_support::{Recipient, Reply, verifiers};
use outbox_lanes_tokio::http::AsyncHttpClient;
use outbox_lanes_tokio::sign::{ActorKey, HttpSignatures, SignatureSpec};
use outbox_lanes_tokio::{DrainControl, DrainOutcome, Hooks, Outbox, SignatureMode};

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
    // draft-cavage (the default double-knocks, RFC 9421 first).
    cfg.http.signature = SignatureMode::Cavage;
    // Over a second, so the two attempts' Dates (whole seconds) differ.
    cfg.scheduler.retry_delays = vec![Duration::from_millis(1500)];
    cfg.scheduler.jitter_percent = 0;
    let outbox = Outbox::builder(Arc::clone(&f.store), cfg)
        .signer(signer())
        .open()
        .expect("outbox");
    outbox
        .enqueue(ALICE, &[row("a0", &[r.url("/inbox/a")])])
        .await
        .expect("enqueue");
    outbox
        .enqueue(BOB, &[row("b0", &[r.url("/inbox/b")])])
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
        let theirs = verifiers::cavage(req, ALICE_PUBLIC).expect("sigh verifies it too");
        assert_eq!(theirs.date, v.date);
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
    verifiers::cavage(&b[0], BOB_PUBLIC).expect("sigh verifies bob's");
    assert!(verifiers::cavage(&b[0], ALICE_PUBLIC).is_err());

    // What the verifier refuses: another body, another Date, another path.
    let mut tampered = a[1].clone();
    tampered.body = b"{\"id\":\"evil\"}".to_vec();
    let err = verify_http_signature(&tampered, ALICE_PUBLIC).expect_err("tampered body");
    assert!(err.contains("Digest"), "{err}");
    let err = verifiers::cavage(&tampered, ALICE_PUBLIC).expect_err("tampered body");
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
        .enqueue(carol, &[row("c0", &[r.url("/inbox/c")])])
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

    // With carol's key the unit goes out, signed, at its first counted attempt (the signer
    // given by value).
    let keys = HttpSignatures::from_pem(carol, format!("{carol}#main-key"), BOB_PRIVATE_PKCS1)
        .expect("key");
    let outbox = Outbox::builder(Arc::clone(&f.store), config())
        .signer(keys)
        .open()
        .expect("outbox");
    let out = outbox.drain(carol).await.expect("drain");
    assert!(
        matches!(out, DrainOutcome::Ran(rep) if rep.delivered == 1),
        "{out:?}"
    );
    let got = r.requests("/inbox/c");
    assert_eq!(got.len(), 1);
    // The default double-knocks: RFC 9421 first, which this recipient accepts.
    let v = verifiers::rfc9421(&got[0], BOB_PUBLIC).expect("verifies");
    assert_eq!(v.keyid, Some(format!("{carol}#main-key")));
    assert!(outbox.dead_letters(None).await.expect("dl").is_empty());
}

const CAROL: &str = "https://social.example/users/carol";

fn http_config() -> HttpConfig {
    HttpConfig {
        addresses: outbox_lanes_core::policy::AddressPolicy::allow_loopback_only(),
        ..HttpConfig::default()
    }
}

/// Builds the attempt's request in `spec` (with `challenge`) and sends it with the tokio client, as
/// the double-knock does.
async fn send_signed(
    actor: &str,
    url: &str,
    body: &'static [u8],
    at: SystemTime,
    spec: SignatureSpec,
    challenge: Option<&str>,
) -> Outcome {
    let mut keys = HttpSignatures::new();
    keys.insert(
        ALICE,
        ActorKey::from_pem(format!("{ALICE}#main-key"), ALICE_PRIVATE_PKCS8).expect("alice"),
    );
    keys.insert(
        CAROL,
        ActorKey::from_pem(format!("{CAROL}#ed25519-key"), CAROL_ED25519_PRIVATE).expect("carol"),
    );
    let policy = RequestPolicy::new(&http_config(), Some(Arc::new(keys))).expect("policy");
    let to = Destination::parse(url);
    let body = Bytes::from_static(body);
    let d = Delivery {
        actor,
        outbox: "0123abcd",
        unit: outbox_lanes_core::UnitId(5),
        recipient: &to,
        body: &body,
        content_type: "application/activity+json",
        headers: &[],
        attempt: 1,
    };
    let request = policy
        .build_with(&d, at, spec, challenge)
        .expect("a request");
    AsyncHttpClient::new(http_config(), None)
        .expect("client")
        .send(&request, at)
        .await
        .outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rfc9421_over_hyper_verifies_with_httpsig_rsa_and_ed25519() {
    let r = Recipient::start().expect("recipient");
    for (actor, public, alg) in [
        (ALICE, ALICE_PUBLIC, "rsa-v1_5-sha256"),
        (CAROL, CAROL_ED25519_PUBLIC, "ed25519"),
    ] {
        let path = format!("/inbox/{alg}");
        r.script(&path, [Reply::Status(503)]);
        let t1 = SystemTime::now();
        let t2 = t1 + Duration::from_secs(2);
        let body = br#"{"type":"Announce"}"#;
        let url = r.url(&path);
        let first = send_signed(actor, &url, body, t1, SignatureSpec::Rfc9421, None).await;
        assert!(matches!(first, Outcome::Transient { .. }), "{first:?}");
        let second = send_signed(actor, &url, body, t2, SignatureSpec::Rfc9421, None).await;
        assert_eq!(second, Outcome::Delivered);
        let got = r.requests(&path);
        assert_eq!(got.len(), 2);
        let mut created = Vec::new();
        for (req, at) in got.iter().zip([t1, t2]) {
            let v = verifiers::rfc9421(req, public).expect("httpsig verifies it");
            assert_eq!(
                v.components,
                ["\"@method\"", "\"@target-uri\"", "\"content-digest\""]
            );
            assert_eq!(v.alg.as_deref(), Some(alg));
            assert_eq!(v.created, Some(unix_secs(at)));
            assert!(v.keyid.as_deref().is_some_and(|k| k.starts_with(actor)));
            created.push(v.created);
            let mut tampered = req.clone();
            tampered.body = b"{\"type\":\"Delete\"}".to_vec();
            let err = verifiers::rfc9421(&tampered, public).expect_err("a changed body");
            assert!(err.contains("Content-Digest"), "{err}");
        }
        assert!(created[0] < created[1], "{created:?}");
    }
}

/// hyper's `Host` and `Content-Length` are the values the signer covers when a challenge
/// asks for them. For an empty body hyper sends no `Content-Length`, and the signer does
/// not claim one: the challenge is not honoured, the default signature is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_challenge_is_signed_over_what_hyper_really_sends() {
    let r = Recipient::start().expect("recipient");
    let challenge = "req=(\"@method\" \"@authority\" \"@path\" \"@query\" \"host\" \
                     \"content-length\" \"content-type\" \"content-digest\" \"date\");\
                     created;nonce=\"abc\"";
    for (i, body) in [&b"{\"n\":1}"[..], b""].into_iter().enumerate() {
        let path = format!("/inbox/{i}");
        let at = SystemTime::now();
        let url = format!("{}?q=1", r.url(&path));
        let out = send_signed(
            CAROL,
            &url,
            body,
            at,
            SignatureSpec::Rfc9421,
            Some(challenge),
        )
        .await;
        assert_eq!(out, Outcome::Delivered);
        let got = r.requests(&path);
        assert_eq!(got.len(), 1);
        let length = (!body.is_empty()).then(|| body.len().to_string());
        assert_eq!(got[0].header("content-length"), length.as_deref());
        let v = verifiers::rfc9421(&got[0], CAROL_ED25519_PUBLIC).expect("verifies");
        if body.is_empty() {
            assert_eq!((v.label.as_str(), v.components.len()), ("sig1", 3));
        } else {
            assert_eq!(v.label, "req");
            assert_eq!(v.components.len(), 9);
            assert_eq!(v.nonce.as_deref(), Some("abc"));
        }
    }
}
