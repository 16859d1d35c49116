//! HTTP Signatures over the blocking client (ureq) to a loopback recorder: draft-cavage
//! checked by test-support's verifier (written from the draft) and by `sigh` (OpenSSL), RFC
//! 9421 by `httpsig-hyper`; the last two are verifiers we did not write.

#![allow(clippy::unwrap_used)] // a failing unwrap is a failing test

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_lanes_blocking::http::{
    Bytes, Delivery, Destination, HttpClient, HttpConfig, RequestPolicy, SignatureMode,
};
use outbox_lanes_blocking::sign::{ActorKey, HttpSignatures, SignatureSpec};
use outbox_lanes_core::policy::AddressPolicy;
use outbox_lanes_core::{Outcome, UnitId};
use outbox_lanes_test_support::signatures::{
    ALICE_PRIVATE_PKCS8, ALICE_PUBLIC, BOB_PUBLIC, CAROL_ED25519_PRIVATE, CAROL_ED25519_PUBLIC,
    verify_http_signature,
};
use outbox_lanes_test_support::{Recipient, Recorded, Reply, verifiers};

const ALICE: &str = "https://social.example/users/alice";
const CAROL: &str = "https://social.example/users/carol";

fn keys() -> Arc<HttpSignatures> {
    let mut keys = HttpSignatures::new();
    keys.insert(
        ALICE,
        ActorKey::from_pem(format!("{ALICE}#main-key"), ALICE_PRIVATE_PKCS8).unwrap(),
    );
    keys.insert(
        CAROL,
        ActorKey::from_pem(format!("{CAROL}#ed25519-key"), CAROL_ED25519_PRIVATE).unwrap(),
    );
    Arc::new(keys)
}

fn cfg() -> HttpConfig {
    HttpConfig {
        addresses: AddressPolicy::allow_loopback_only(),
        ..HttpConfig::default()
    }
}

/// A client that signs draft-cavage (`deliver` would double-knock, RFC 9421 first).
fn client() -> HttpClient {
    let cfg = HttpConfig {
        signature: SignatureMode::Cavage,
        ..cfg()
    };
    HttpClient::new(cfg, Some(keys())).unwrap()
}

/// Builds the attempt's request in `spec` (with `challenge`) and sends it with the ureq
/// client, as the double-knock does.
fn send_signed(
    actor: &str,
    url: &str,
    body: &'static [u8],
    attempt: u32,
    at: SystemTime,
    spec: SignatureSpec,
    challenge: Option<&str>,
) -> Outcome {
    let policy = RequestPolicy::new(&cfg(), Some(keys())).unwrap();
    let to = Destination::parse(url);
    let body = Bytes::from_static(body);
    let d = Delivery {
        actor,
        outbox: "0123abcd",
        unit: UnitId(3),
        recipient: &to,
        body: &body,
        content_type: "application/activity+json",
        headers: &[],
        attempt,
    };
    let request = policy.build_with(&d, at, spec, challenge).unwrap();
    HttpClient::new(cfg(), None)
        .unwrap()
        .send(&request, at)
        .outcome
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn with_body(req: &Recorded, body: &[u8]) -> Recorded {
    let mut r = req.clone();
    r.body = body.to_vec();
    r
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
            actor: "https://social.example/users/dave",
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
            "not_sent: no signing key for actor \"https://social.example/users/dave\""
        ),
        "{error}"
    );
    // Bounded: a request would have been recorded before `deliver` returned.
    assert_eq!(r.count("/inbox"), 0);
}

#[test]
fn rfc9421_attempts_verify_with_httpsig_and_each_is_signed_afresh() {
    let r = Recipient::start().unwrap();
    for (actor, public, key_id, alg) in [
        (
            ALICE,
            ALICE_PUBLIC,
            format!("{ALICE}#main-key"),
            "rsa-v1_5-sha256",
        ),
        (
            CAROL,
            CAROL_ED25519_PUBLIC,
            format!("{CAROL}#ed25519-key"),
            "ed25519",
        ),
    ] {
        let path = format!("/inbox/{alg}");
        r.script(&path, [Reply::Status(503)]);
        let url = r.url(&path);
        let t1 = SystemTime::now();
        let t2 = t1 + Duration::from_secs(3);
        let body = br#"{"type":"Create"}"#;
        let first = send_signed(actor, &url, body, 1, t1, SignatureSpec::Rfc9421, None);
        assert!(matches!(first, Outcome::Transient { .. }), "{first:?}");
        let second = send_signed(actor, &url, body, 2, t2, SignatureSpec::Rfc9421, None);
        assert_eq!(second, Outcome::Delivered);
        let got = r.requests(&path);
        assert_eq!(got.len(), 2);
        for (req, at) in got.iter().zip([t1, t2]) {
            let v = verifiers::rfc9421(req, public).unwrap();
            assert_eq!(v.label, "sig1");
            assert_eq!(
                v.components,
                ["\"@method\"", "\"@target-uri\"", "\"content-digest\""]
            );
            assert_eq!(v.created, Some(unix_secs(at)), "the attempt's own time");
            assert_eq!(v.keyid.as_deref(), Some(key_id.as_str()));
            assert_eq!(v.alg.as_deref(), Some(alg));
            assert_eq!(req.header("date"), None, "no Date: created says when");
            // A changed body no longer matches its Content-Digest.
            let err =
                verifiers::rfc9421(&with_body(req, br#"{"type":"Delete"}"#), public).unwrap_err();
            assert!(err.contains("Content-Digest"), "{err}");
            // Another inbox, or another key, does not verify.
            let mut elsewhere = req.clone();
            elsewhere.target = "/inbox/other".to_owned();
            assert!(verifiers::rfc9421(&elsewhere, public).is_err());
            let other = if public == ALICE_PUBLIC {
                BOB_PUBLIC
            } else {
                ALICE_PUBLIC
            };
            assert!(verifiers::rfc9421(req, other).is_err());
        }
        assert_ne!(got[0].header("signature"), got[1].header("signature"));
    }
}

#[test]
fn cavage_attempts_verify_with_sigh_rsa_sha256_and_hs2019() {
    let r = Recipient::start().unwrap();
    let c = client();
    let at = SystemTime::now();
    for (actor, public, path) in [
        (ALICE, ALICE_PUBLIC, "/inbox/rsa"),
        (CAROL, CAROL_ED25519_PUBLIC, "/inbox/ed25519"),
    ] {
        assert_eq!(deliver(&c, actor, &r.url(path), 1, at), Outcome::Delivered);
        let got = r.requests(path);
        assert_eq!(got.len(), 1);
        let v = verifiers::cavage(&got[0], public).unwrap();
        assert!(v.key_id.starts_with(actor), "{}", v.key_id);
        assert_eq!(v.headers, ["(request-target)", "host", "date", "digest"]);
        assert_eq!(v.date, httpdate::fmt_http_date(at));
        let err = verifiers::cavage(&with_body(&got[0], b"{}"), public).unwrap_err();
        assert!(err.contains("Digest"), "{err}");
        let mut elsewhere = got[0].clone();
        elsewhere.target = "/inbox/other".to_owned();
        assert!(verifiers::cavage(&elsewhere, public).is_err());
    }
    let rsa = &r.requests("/inbox/rsa")[0];
    assert!(
        rsa.header("signature")
            .unwrap()
            .contains("algorithm=\"rsa-sha256\"")
    );
    verify_http_signature(rsa, ALICE_PUBLIC).unwrap();
    let ed = &r.requests("/inbox/ed25519")[0];
    assert!(
        ed.header("signature")
            .unwrap()
            .contains("algorithm=\"hs2019\"")
    );
    assert!(verifiers::cavage(ed, ALICE_PUBLIC).is_err());
}

/// A challenge for every component the signer can cover: the values it signs are the ones
/// ureq puts on the wire (`Host`, `Content-Length`, the request target). For an empty body
/// ureq sends `Content-Length: 0`, but hyper (the tokio runtime) sends none, so the signer does not cover it
/// there: the challenge without `content-length` is honoured.
#[test]
fn a_challenge_is_signed_over_what_the_transport_really_sends() {
    let r = Recipient::start().unwrap();
    let components = [
        "@method",
        "@target-uri",
        "@authority",
        "@scheme",
        "@path",
        "@query",
        "@request-target",
        "host",
        "content-length",
        "content-type",
        "content-digest",
        "idempotency-key",
        "date",
    ];
    for (i, body) in [&br#"{"type":"Follow"}"#[..], b""].into_iter().enumerate() {
        let components: Vec<&str> = components
            .into_iter()
            .filter(|c| !body.is_empty() || *c != "content-length")
            .collect();
        let list: Vec<String> = components.iter().map(|c| format!("\"{c}\"")).collect();
        let challenge = format!(
            "proof=({});created;expires;nonce=\"n-42\";tag=\"inbox\";alg=\"ed25519\"",
            list.join(" ")
        );
        let url = r.url(&format!("/users/./bob/inbox{i}?page=1&x=%2F"));
        let at = SystemTime::now();
        let out = send_signed(
            CAROL,
            &url,
            body,
            1,
            at,
            SignatureSpec::Rfc9421,
            Some(&challenge),
        );
        assert_eq!(out, Outcome::Delivered);
        let got = r.requests(&format!("/users/bob/inbox{i}"));
        assert_eq!(got.len(), 1);
        let req = &got[0];
        assert_eq!(
            req.header("content-length"),
            Some(body.len().to_string().as_str())
        );
        assert_eq!(req.header("host"), Some(r.addr().to_string().as_str()));
        assert_eq!(
            req.header("date"),
            Some(httpdate::fmt_http_date(at).as_str())
        );
        let v = verifiers::rfc9421(req, CAROL_ED25519_PUBLIC).unwrap();
        assert_eq!(v.label, "proof");
        assert_eq!(v.components, list);
        let created = unix_secs(at);
        assert_eq!(v.created, Some(created));
        assert_eq!(v.expires, Some(created + 300));
        assert_eq!(v.nonce.as_deref(), Some("n-42"));
        assert_eq!(v.tag.as_deref(), Some("inbox"));
        assert_eq!(v.alg.as_deref(), Some("ed25519"));
    }
    // Asked of an RSA key, `alg="ed25519"` cannot be honoured: the default signature.
    let challenge = "proof=(\"@method\");alg=\"ed25519\"";
    let url = r.url("/inbox/rsa");
    let out = send_signed(
        ALICE,
        &url,
        b"{}",
        1,
        SystemTime::now(),
        SignatureSpec::Rfc9421,
        Some(challenge),
    );
    assert_eq!(out, Outcome::Delivered);
    let v = verifiers::rfc9421(&r.requests("/inbox/rsa")[0], ALICE_PUBLIC).unwrap();
    assert_eq!(
        (v.label.as_str(), v.components.len(), v.nonce),
        ("sig1", 3, None)
    );
}
