//! The HTTP delivery path against real HTTP servers on loopback (`outbox_lanes_test_support`).
//!
//! Only loopback addresses are ever used: 127.0.0.0/8, `[::1]` and `localhost`. The address
//! policy itself is unit-tested in core without traffic; here the default policy is shown
//! refusing loopback (which is what it does to private addresses too) and tests that need
//! traffic allow loopback explicitly.

#![allow(clippy::unwrap_used)] // a failing unwrap is a failing test

use std::io::{Read as _, Write as _};
use std::net::{Ipv6Addr, SocketAddr, TcpListener};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_lanes_blocking::http::{
    AttemptResult, Bytes, Delivery, Destination, HttpClient, HttpConfig, HttpError,
};
use outbox_lanes_blocking::sign::{SignError, SignRequest, Signer, StandardWebhooks};
use outbox_lanes_core::policy::{AddressPolicy, Classifier, StatusClass};
use outbox_lanes_core::{Outcome, UnitId};
use outbox_lanes_test_support::{Completion, Recipient, Reply, Response, Unanswered};

const BODY: &[u8] = br#"{"type":"Create","n":1}"#;
const CONTENT_TYPE: &str = "application/activity+json";
/// Bound on waiting for the recipient's record to settle; only ever reached on failure.
const WAIT: Duration = Duration::from_secs(10);

fn loopback_config() -> HttpConfig {
    HttpConfig {
        addresses: AddressPolicy::allow_loopback_only(),
        ..HttpConfig::default()
    }
}

fn client(cfg: HttpConfig) -> HttpClient {
    HttpClient::new(cfg, None).unwrap()
}

fn loopback_client() -> HttpClient {
    client(loopback_config())
}

fn post(client: &HttpClient, url: &str, unit: u64) -> AttemptResult {
    post_at(client, url, unit, SystemTime::now())
}

fn post_at(client: &HttpClient, url: &str, unit: u64, now: SystemTime) -> AttemptResult {
    client.deliver(
        &Delivery {
            actor: "actor",
            outbox: "0123abcd",
            unit: UnitId(unit),
            recipient: &Destination::parse(url),
            body: &Bytes::from_static(BODY),
            content_type: CONTENT_TYPE,
            headers: &[],
            attempt: 1,
        },
        now,
    )
}

/// A fixed attempt time, so HTTP-date Retry-Afters give exact delays.
fn fixed_now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn recipient() -> Recipient {
    Recipient::start().unwrap()
}

fn transient() -> Outcome {
    Outcome::Transient { retry_after: None }
}

#[test]
fn delivered_with_idempotency_key_user_agent_content_type_and_exact_body() {
    let r = recipient();
    let res = post(&loopback_client(), &r.url("/inbox"), 17);
    assert_eq!(
        res,
        AttemptResult {
            outcome: Outcome::Delivered,
            status: Some(200),
            error: None,
            body: None,
        }
    );
    let reqs = r.requests("/inbox");
    assert_eq!(reqs.len(), 1);
    let req = &reqs[0];
    assert_eq!(req.method, "POST");
    assert_eq!(req.header("idempotency-key"), Some("0123abcd-17"));
    assert_eq!(
        req.header("user-agent"),
        Some(concat!("outbox-lanes/", env!("CARGO_PKG_VERSION")))
    );
    assert_eq!(req.header_all("user-agent").len(), 1);
    assert_eq!(req.header("content-type"), Some(CONTENT_TYPE));
    assert_eq!(req.body, BODY);
    // No signer configured: no signature headers.
    assert_eq!(req.header("webhook-signature"), None);
}

#[test]
fn configured_user_agent_is_sent() {
    let r = recipient();
    let c = client(HttpConfig {
        user_agent: "relay-test/9".to_owned(),
        ..loopback_config()
    });
    assert_eq!(post(&c, &r.url("/ua"), 1).outcome, Outcome::Delivered);
    assert_eq!(
        r.requests("/ua")[0].header("user-agent"),
        Some("relay-test/9")
    );
}

#[test]
fn service_unavailable_with_retry_after_seconds_is_throttled() {
    let r = recipient();
    r.script(
        "/inbox",
        [Response::new(503).with_header("Retry-After", "7").into()],
    );
    let res = post(&loopback_client(), &r.url("/inbox"), 1);
    assert_eq!(
        res.outcome,
        Outcome::Throttled {
            retry_after: Some(Duration::from_secs(7))
        }
    );
    assert_eq!(res.status, Some(503));
    assert_eq!(res.error.as_deref(), Some("status 503"));
}

#[test]
fn internal_server_error_is_transient() {
    let r = recipient();
    r.script("/inbox", [Reply::Status(500)]);
    let res = post(&loopback_client(), &r.url("/inbox"), 1);
    assert_eq!(res.outcome, transient());
    assert_eq!(res.status, Some(500));
}

#[test]
fn too_many_requests_with_an_http_date_is_throttled_until_that_date() {
    let r = recipient();
    // 120 s after `fixed_now()` (Python: email.utils.formatdate(1700000120, usegmt=True)).
    r.script(
        "/inbox",
        [Response::new(429)
            .with_header("Retry-After", "Tue, 14 Nov 2023 22:15:20 GMT")
            .into()],
    );
    let res = post_at(&loopback_client(), &r.url("/inbox"), 1, fixed_now());
    assert_eq!(
        res.outcome,
        Outcome::Throttled {
            retry_after: Some(Duration::from_secs(120))
        }
    );
    assert_eq!(res.status, Some(429));
}

#[test]
fn retry_after_is_capped() {
    let r = recipient();
    let huge = || Reply::from(Response::new(503).with_header("Retry-After", "999999"));
    r.script("/inbox", [huge(), huge()]);
    let default = post(&loopback_client(), &r.url("/inbox"), 1);
    assert_eq!(
        default.outcome,
        Outcome::Throttled {
            retry_after: Some(Duration::from_secs(3600))
        }
    );
    let capped = client(HttpConfig {
        retry_after_cap: Duration::from_secs(60),
        ..loopback_config()
    });
    assert_eq!(
        post(&capped, &r.url("/inbox"), 1).outcome,
        Outcome::Throttled {
            retry_after: Some(Duration::from_secs(60))
        }
    );
}

#[test]
fn unparsable_retry_after_is_ignored() {
    let r = recipient();
    r.script(
        "/inbox",
        [Response::new(503).with_header("Retry-After", "soon").into()],
    );
    assert_eq!(
        post(&loopback_client(), &r.url("/inbox"), 1).outcome,
        transient()
    );
}

#[test]
fn gone_and_not_found() {
    let r = recipient();
    r.script("/gone", [Reply::Status(410)]);
    r.script(
        "/missing",
        [Response::new(404).with_body("no such inbox\r\n").into()],
    );
    let c = loopback_client();
    let gone = post(&c, &r.url("/gone"), 1);
    assert_eq!((gone.outcome, gone.status), (Outcome::Gone, Some(410)));
    let missing = post(&c, &r.url("/missing"), 2);
    assert_eq!(
        (missing.outcome, missing.status),
        (Outcome::Permanent, Some(404))
    );
    // The start of the answer is kept for the dead letter, control characters blanked.
    assert_eq!(missing.error.as_deref(), Some("status 404: no such inbox"));
}

#[test]
fn configured_classifier_is_used() {
    let r = recipient();
    r.script("/deploying", [Reply::Status(404)]);
    let c = client(HttpConfig {
        classifier: Classifier::default().with_override(404..=404, StatusClass::Transient),
        ..loopback_config()
    });
    assert_eq!(post(&c, &r.url("/deploying"), 1).outcome, transient());
}

#[test]
fn redirects_are_not_followed() {
    let r = recipient();
    let c = loopback_client();
    for status in [301, 302, 303, 307, 308] {
        let path = format!("/from-{status}");
        r.script(&path, [Reply::Redirect(status, r.url("/moved"))]);
        let res = post(&c, &r.url(&path), 1);
        assert_eq!(
            (res.outcome, res.status),
            (Outcome::Permanent, Some(status))
        );
        assert_eq!(r.count(&path), 1);
    }
    assert_eq!(r.count("/moved"), 0, "a redirect was followed");
}

#[test]
fn a_hang_past_the_client_timeout_is_a_transient_timeout() {
    let r = recipient();
    r.script("/inbox", [Reply::Hang]);
    let c = client(HttpConfig {
        timeout: Duration::from_millis(300),
        ..loopback_config()
    });
    let res = post(&c, &r.url("/inbox"), 1);
    assert_eq!(res.outcome, transient());
    assert_eq!(res.status, None);
    let err = res.error.unwrap();
    assert!(err.starts_with("timeout: "), "{err}");
    assert!(
        !err.starts_with("timeout: timeout"),
        "the code is not repeated: {err}"
    );
    // The request did arrive; the recipient never answered it.
    assert_eq!(r.count("/inbox"), 1);
}

#[test]
fn a_reset_is_transient() {
    let r = recipient();
    r.script("/inbox", [Reply::Reset]);
    let res = post(&loopback_client(), &r.url("/inbox"), 1);
    assert_eq!(res.outcome, transient());
    assert_eq!(res.status, None);
    let err = res.error.unwrap();
    assert!(err.starts_with("connection_reset: "), "{err}");
}

#[test]
fn a_close_without_response_is_transient() {
    let r = recipient();
    r.script("/inbox", [Reply::CloseWithoutResponse]);
    let res = post(&loopback_client(), &r.url("/inbox"), 1);
    assert_eq!(res.outcome, transient());
    assert_eq!(res.status, None);
    assert!(res.error.is_some());
}

#[test]
fn a_refused_connection_is_transient() {
    // A port that was just listened on and is closed now (loopback only).
    let addr = {
        let r = recipient();
        r.addr()
    };
    let res = post(&loopback_client(), &format!("http://{addr}/inbox"), 1);
    assert_eq!(res.outcome, transient());
    let err = res.error.unwrap();
    assert!(err.starts_with("connection_refused: "), "{err}");
}

#[test]
fn a_slow_endless_body_is_capped_and_classified_by_status() {
    let r = recipient();
    // 2,000 chunks of 16 KiB, one every 20 ms: 40 s to send in full, 32 MiB in all.
    r.script(
        "/inbox",
        [Reply::SlowBody {
            status: 200,
            chunk: vec![b'x'; 16 * 1024],
            interval: Duration::from_millis(20),
            chunks: 2000,
        }],
    );
    let res = post(&loopback_client(), &r.url("/inbox"), 1);
    assert_eq!(
        (res.outcome, res.status, res.error),
        (Outcome::Delivered, Some(200), None)
    );
    // The client returned with the body still being trickled, and dropped the connection.
    assert_ne!(
        r.requests("/inbox")[0].completion.status(),
        Some(200),
        "the client read the whole body"
    );
    assert!(
        r.wait_until(WAIT, |log| matches!(
            log[0].completion,
            Completion::Unanswered {
                reason: Unanswered::WriteFailed,
                ..
            }
        )),
        "the client did not drop the connection: {:?}",
        r.requests("/inbox")[0].completion
    );
}

#[test]
fn a_body_slower_than_the_timeout_still_counts_by_its_status() {
    let r = recipient();
    // Under the size cap, but 100 one-byte chunks 100 ms apart outlast the 300 ms timeout.
    r.script(
        "/inbox",
        [Reply::SlowBody {
            status: 410,
            chunk: b"g".to_vec(),
            interval: Duration::from_millis(100),
            chunks: 100,
        }],
    );
    let c = client(HttpConfig {
        timeout: Duration::from_millis(300),
        ..loopback_config()
    });
    let res = post(&c, &r.url("/inbox"), 1);
    assert_eq!((res.outcome, res.status), (Outcome::Gone, Some(410)));
}

#[test]
fn https_to_a_plain_http_server_is_a_transient_tls_error() {
    // Exercises the rustls + ring client. The test recipient waits for a whole HTTP head,
    // which a ClientHello never completes, so a bare loopback socket answers the handshake
    // with plain HTTP instead, the way a misconfigured recipient would.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut hello = [0u8; 512];
        let _ = stream.read(&mut hello);
        let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    });
    let res = post(&loopback_client(), &format!("https://{addr}/inbox"), 1);
    server.join().unwrap();
    assert_eq!(res.outcome, transient(), "{res:?}");
    assert_eq!(res.status, None);
    let err = res.error.unwrap();
    assert!(err.starts_with("tls: "), "{err}");
}

#[test]
fn a_huge_body_is_capped_the_connection_dropped_and_the_status_classified() {
    let r = recipient();
    r.script(
        "/inbox",
        [
            Reply::Status(200),
            Response::new(503).with_body(vec![b'x'; 32 << 20]).into(),
            Reply::Status(200),
        ],
    );
    let c = loopback_client();
    assert_eq!(post(&c, &r.url("/inbox"), 1).outcome, Outcome::Delivered);
    let res = post(&c, &r.url("/inbox"), 2);
    assert_eq!((res.outcome, res.status), (transient(), Some(503)));
    let err = res.error.unwrap();
    assert!(err.starts_with("status 503: xxx"), "{err}");
    assert!(err.len() < 300, "the excerpt is bounded");
    assert_eq!(post(&c, &r.url("/inbox"), 3).outcome, Outcome::Delivered);

    let reqs = r.requests("/inbox");
    assert_eq!(reqs.len(), 3);
    // A fully read answer leaves the connection in the pool; a capped one drops it.
    assert_eq!(reqs[0].connection, reqs[1].connection, "keep-alive reuse");
    assert_ne!(
        reqs[1].connection, reqs[2].connection,
        "capped connection reused"
    );
    assert!(
        r.wait_until(WAIT, |log| matches!(
            log[1].completion,
            Completion::Unanswered {
                reason: Unanswered::WriteFailed,
                ..
            }
        )),
        "the 32 MiB answer was read in full: {:?}",
        r.requests("/inbox")[1].completion
    );
}

#[test]
fn default_policy_refuses_a_loopback_ipv4_literal() {
    // 127.0.0.2 is loopback on Linux: a recipient listens there and must see nothing.
    let r = Recipient::start_on(SocketAddr::from(([127, 0, 0, 2], 0))).unwrap();
    let res = post(&client(HttpConfig::default()), &r.url("/inbox"), 1);
    assert_eq!(
        res,
        AttemptResult {
            outcome: Outcome::Refused,
            status: None,
            error: Some("destination_refused: 127.0.0.2 is loopback".to_owned()),
            body: None,
        }
    );
    assert_eq!(r.count_all(), 0);
    assert!(r.protocol_errors().is_empty(), "{:?}", r.protocol_errors());
    // The same recipient is reachable once loopback is allowed.
    assert_eq!(
        post(&loopback_client(), &r.url("/inbox"), 1).outcome,
        Outcome::Delivered
    );
}

#[test]
fn default_policy_refuses_the_ipv6_loopback_literal() {
    let r = match Recipient::start_on(SocketAddr::from((Ipv6Addr::LOCALHOST, 0))) {
        Ok(r) => r,
        Err(e) => {
            println!("skipped: cannot bind [::1] on this machine: {e}");
            return;
        }
    };
    let res = post(&client(HttpConfig::default()), &r.url("/inbox"), 1);
    assert_eq!(res.outcome, Outcome::Refused);
    assert_eq!(
        res.error.as_deref(),
        Some("destination_refused: ::1 is loopback")
    );
    assert_eq!(r.count_all(), 0);
    assert!(r.protocol_errors().is_empty(), "{:?}", r.protocol_errors());
    assert_eq!(
        post(&loopback_client(), &r.url("/inbox"), 1).outcome,
        Outcome::Delivered
    );
}

#[test]
fn default_policy_refuses_a_name_that_resolves_to_loopback() {
    let r = recipient();
    let url = format!("http://localhost:{}/inbox", r.addr().port());
    let res = post(&client(HttpConfig::default()), &url, 1);
    assert_eq!(res.outcome, Outcome::Refused);
    assert_eq!(res.status, None);
    let err = res.error.unwrap();
    assert!(
        err.starts_with("destination_refused: ") && err.ends_with(" is loopback"),
        "{err}"
    );
    assert_eq!(r.count_all(), 0);
    assert!(r.protocol_errors().is_empty(), "{:?}", r.protocol_errors());
    // The resolver passes allowed addresses through.
    assert_eq!(
        post(&loopback_client(), &url, 2).outcome,
        Outcome::Delivered
    );
    assert_eq!(r.count("/inbox"), 1);
}

/// Set in the child process of `environment_proxies_are_ignored`: the URL to deliver to.
const CHILD_TARGET: &str = "OUTBOX_LANES_TEST_CHILD_TARGET";
/// Set in the child process: a `localhost` URL the default policy must refuse.
const CHILD_REFUSED: &str = "OUTBOX_LANES_TEST_CHILD_REFUSED";

#[test]
fn environment_proxies_are_ignored() {
    // The proxy the environment names: a recipient that must see nothing, not even a
    // CONNECT.
    let proxy = recipient();
    let target = recipient();
    let proxy_url = format!("http://{}", proxy.addr());
    // The workspace forbids unsafe code, and setting the environment is unsafe in Rust
    // 2024: run the delivery in a child process of this test binary instead.
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([
        "--exact",
        "proxy_env_child",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    for var in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        cmd.env(var, &proxy_url);
    }
    cmd.env_remove("NO_PROXY").env_remove("no_proxy");
    cmd.env(CHILD_TARGET, target.url("/inbox"));
    cmd.env(
        CHILD_REFUSED,
        format!("http://localhost:{}/refused", target.addr().port()),
    );
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(
        stdout.contains("1 passed"),
        "the child test did not run\n{stdout}"
    );
    assert_eq!(proxy.count_all(), 0, "the environment's proxy was used");
    assert!(
        proxy.protocol_errors().is_empty(),
        "{:?}",
        proxy.protocol_errors()
    );
    assert_eq!(target.count("/inbox"), 1, "the delivery did not go direct");
    assert_eq!(target.count("/refused"), 0);
}

#[test]
#[ignore = "run by environment_proxies_are_ignored in a child process with proxy variables set"]
fn proxy_env_child() {
    let (Ok(target), Ok(refused)) = (std::env::var(CHILD_TARGET), std::env::var(CHILD_REFUSED))
    else {
        println!("nothing to do: run by environment_proxies_are_ignored");
        return;
    };
    // The variables are set, and ureq's default configuration would use them.
    assert!(ureq::Proxy::try_from_env().is_some());
    let res = post(&loopback_client(), &target, 1);
    assert_eq!(res.outcome, Outcome::Delivered, "{res:?}");
    // Nor does the environment's proxy carry a refused destination past the guard.
    let res = post(&client(HttpConfig::default()), &refused, 2);
    assert_eq!(res.outcome, Outcome::Refused, "{res:?}");
}

#[test]
fn a_configured_proxy_is_used_and_the_guard_cannot_see_through_it() {
    // The proxy is on loopback and the policy is the default (loopback refused): the proxy's
    // own address is exempt, and the recipient's name goes to the proxy unresolved.
    let proxy = recipient();
    let target = recipient();
    let c = client(HttpConfig {
        proxy: Some(format!("http://{}", proxy.addr())),
        timeout: Duration::from_secs(5),
        ..HttpConfig::default()
    });
    let target_authority = format!("localhost:{}", target.addr().port());
    let res = post(&c, &format!("http://{target_authority}/inbox"), 1);
    // The recipient playing the proxy answers the CONNECT with 200, so ureq takes the
    // connection for a tunnel and sends the POST down it, to the same recipient. Without
    // the proxy this name would have been refused; through it, the guard never saw it.
    assert_eq!(res.outcome, Outcome::Delivered, "{res:?}");
    let seen: Vec<_> = proxy
        .all_requests()
        .iter()
        .map(|q| (q.method.clone(), q.target.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            ("CONNECT".to_owned(), target_authority.clone()),
            ("POST".to_owned(), "/inbox".to_owned()),
        ]
    );
    assert_eq!(target.count_all(), 0);
    // IP literals are still checked before the proxy is asked.
    let res = post(&c, &target.url("/inbox"), 2);
    assert_eq!(res.outcome, Outcome::Refused);
}

#[test]
fn construction_errors() {
    let with_proxy = |p: &str| {
        HttpClient::new(
            HttpConfig {
                proxy: Some(p.to_owned()),
                ..HttpConfig::default()
            },
            None,
        )
        .unwrap_err()
    };
    assert_eq!(
        with_proxy("socks5://127.0.0.1:1080"),
        HttpError::UnsupportedProxy {
            proxy: "socks5://127.0.0.1:1080".to_owned()
        }
    );
    assert!(matches!(
        with_proxy("http://[::1"),
        HttpError::BadProxy { .. }
    ));
    let bad_ua = HttpClient::new(
        HttpConfig {
            user_agent: "a\nb".to_owned(),
            ..HttpConfig::default()
        },
        None,
    )
    .unwrap_err();
    assert_eq!(bad_ua, HttpError::BadUserAgent);
    assert!(!bad_ua.to_string().is_empty());
}

#[test]
fn an_invalid_recipient_is_permanent_without_traffic() {
    let c = loopback_client();
    for url in [
        "",
        "ftp://127.0.0.1/x",
        "http://127.1/x",
        "http://u:p@127.0.0.1/",
    ] {
        let res = post(&c, url, 1);
        assert_eq!(res.outcome, Outcome::Permanent, "{url}");
        assert!(
            res.error
                .as_deref()
                .unwrap()
                .starts_with("invalid_recipient: "),
            "{res:?}"
        );
    }
}

#[test]
fn an_invalid_header_is_permanent_and_sends_nothing() {
    let r = recipient();
    let res = loopback_client().deliver(
        &Delivery {
            actor: "actor",
            outbox: "0123abcd",
            unit: UnitId(1),
            recipient: &Destination::parse(&r.url("/inbox")),
            body: &Bytes::from_static(BODY),
            content_type: "text/plain\r\nX-Injected: 1",
            headers: &[],
            attempt: 1,
        },
        SystemTime::now(),
    );
    assert_eq!(res.outcome, Outcome::Permanent);
    assert!(
        res.error
            .as_deref()
            .unwrap()
            .starts_with("invalid_request: "),
        "{res:?}"
    );
    assert_eq!(r.count_all(), 0);
}

#[test]
fn standard_webhooks_signatures_verify_on_the_receiving_side() {
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let r = recipient();
    let signer = Arc::new(StandardWebhooks::from_whsec(SECRET).unwrap());
    let c = HttpClient::new(loopback_config(), Some(signer)).unwrap();
    let first = SystemTime::now();
    let retry = first + Duration::from_secs(10);
    assert_eq!(
        post_at(&c, &r.url("/hook"), 99, first).outcome,
        Outcome::Delivered
    );
    assert_eq!(
        post_at(&c, &r.url("/hook"), 99, retry).outcome,
        Outcome::Delivered
    );

    let receiver = StandardWebhooks::from_whsec(SECRET).unwrap();
    let reqs = r.requests("/hook");
    assert_eq!(reqs.len(), 2);
    let mut stamps = Vec::new();
    for (req, at) in reqs.iter().zip([first, retry]) {
        let id = req.header("webhook-id").unwrap();
        let ts = req.header("webhook-timestamp").unwrap();
        let sig = req.header("webhook-signature").unwrap();
        assert_eq!(id, "0123abcd-99");
        assert_eq!(req.header("idempotency-key"), Some(id));
        receiver
            .verify(id, ts, sig, &req.body, at, Duration::from_secs(300))
            .unwrap();
        // The signature covers the body: a changed body does not verify.
        assert!(
            receiver
                .verify(id, ts, sig, b"{}", at, Duration::from_secs(300))
                .is_err()
        );
        stamps.push(ts.parse::<u64>().unwrap());
    }
    // Signed afresh on every attempt, with that attempt's time.
    assert_eq!(stamps[1] - stamps[0], 10);
    let wrong = StandardWebhooks::new(&b"not the secret"[..]).unwrap();
    let req = &reqs[0];
    assert!(
        wrong
            .verify(
                req.header("webhook-id").unwrap(),
                req.header("webhook-timestamp").unwrap(),
                req.header("webhook-signature").unwrap(),
                &req.body,
                first,
                Duration::from_secs(300),
            )
            .is_err()
    );
}

/// What a [`RecordingSigner`] was asked to sign.
#[derive(Debug, PartialEq)]
struct Seen {
    actor: String,
    unit: UnitId,
    recipient: String,
    body: Vec<u8>,
    content_type: String,
    at: SystemTime,
    attempt: u32,
}

#[derive(Default)]
struct RecordingSigner {
    seen: Mutex<Vec<Seen>>,
}

impl Signer for RecordingSigner {
    fn sign(&self, req: &SignRequest<'_>) -> Result<Vec<(String, String)>, SignError> {
        self.seen.lock().unwrap().push(Seen {
            actor: req.actor.to_owned(),
            unit: req.unit,
            recipient: req.recipient.as_str().to_owned(),
            body: req.body.to_vec(),
            content_type: req.content_type.to_owned(),
            at: req.at,
            attempt: req.attempt,
        });
        Ok(vec![("X-Attempt".to_owned(), req.attempt.to_string())])
    }
}

#[test]
fn the_signer_is_called_on_every_attempt_with_its_time() {
    let r = recipient();
    r.script("/inbox", [Reply::Status(503)]);
    let signer = Arc::new(RecordingSigner::default());
    let c = HttpClient::new(loopback_config(), Some(signer.clone())).unwrap();
    // A non-canonical spelling of the recipient: the signer sees the canonical URL sent.
    let url = r.url("/inbox").replace("http://", "HTTP://");
    let t1 = fixed_now();
    let t2 = t1 + Duration::from_secs(2);
    for (attempt, at) in [(1, t1), (2, t2)] {
        c.deliver(
            &Delivery {
                actor: "actor",
                outbox: "0123abcd",
                unit: UnitId(5),
                recipient: &Destination::parse(&url),
                body: &Bytes::from_static(BODY),
                content_type: CONTENT_TYPE,
                headers: &[],
                attempt,
            },
            at,
        );
    }
    let canonical = r.url("/inbox");
    let seen = signer.seen.lock().unwrap();
    let want = |attempt, at| Seen {
        actor: "actor".to_owned(),
        unit: UnitId(5),
        recipient: canonical.clone(),
        body: BODY.to_vec(),
        content_type: CONTENT_TYPE.to_owned(),
        at,
        attempt,
    };
    assert_eq!(*seen, [want(1, t1), want(2, t2)]);
    let attempts: Vec<_> = r
        .requests("/inbox")
        .iter()
        .map(|q| q.header("x-attempt").map(str::to_owned))
        .collect();
    assert_eq!(attempts, [Some("1".to_owned()), Some("2".to_owned())]);
}

#[test]
fn one_client_is_shared_by_many_threads() {
    fn assert_shareable<T: Clone + Send + Sync + 'static>() {}
    assert_shareable::<HttpClient>();

    let r = Arc::new(recipient());
    let c = loopback_client();
    let workers: Vec<_> = (0..4u64)
        .map(|w| {
            let c = c.clone();
            let r = Arc::clone(&r);
            thread::spawn(move || {
                (0..5u64)
                    .map(|i| post(&c, &r.url(&format!("/w{w}")), w * 100 + i).outcome)
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for w in workers {
        assert!(w.join().unwrap().iter().all(Outcome::is_delivered));
    }
    assert_eq!(r.count_all(), 20);
    for w in 0..4u64 {
        let keys: Vec<_> = r
            .requests(&format!("/w{w}"))
            .iter()
            .map(|q| q.header("idempotency-key").unwrap().to_owned())
            .collect();
        let want: Vec<_> = (0..5u64)
            .map(|i| format!("0123abcd-{}", w * 100 + i))
            .collect();
        assert_eq!(keys, want, "each worker's deliveries arrive in its order");
    }
}

/// Enqueues one row for one recipient with plain SQL, as store/SCHEMA.md ("Enqueue with plain
/// SQL", steps 1, 3, 4a and 5) tells a service enqueueing from its own SQL library: nothing
/// checks the `headers` column on that path.
fn enqueue_with_plain_sql(db: &std::path::Path, row_id: &str, recipient: &str, headers: &str) {
    let mut c = rusqlite::Connection::open(db).unwrap();
    c.busy_timeout(Duration::from_secs(5)).unwrap();
    let tx = c.transaction().unwrap();
    let seq: i64 = tx
        .query_row(
            "INSERT INTO ol_actors AS a (actor, last_seq) VALUES ('actor', 1) \
             ON CONFLICT (actor) DO UPDATE SET last_seq = a.last_seq + excluded.last_seq \
             RETURNING last_seq",
            [],
            |r| r.get(0),
        )
        .unwrap();
    tx.execute(
        "INSERT INTO ol_lanes (actor, recipient, ordering_key) VALUES ('actor', ?1, '') \
         ON CONFLICT (actor, recipient, ordering_key) DO NOTHING",
        [recipient],
    )
    .unwrap();
    let lane: i64 = tx
        .query_row(
            "SELECT id FROM ol_lanes WHERE actor = 'actor' AND recipient = ?1 AND ordering_key = ''",
            [recipient],
            |r| r.get(0),
        )
        .unwrap();
    tx.execute(
        "INSERT INTO ol_units (actor, lane_id, seq, row_id, content_type, body, body_len, \
         dedup_key, ordering_key, enqueued_at, headers) \
         VALUES ('actor', ?1, ?2, ?3, 'application/json', ?4, ?5, NULL, '', ?6, ?7)",
        rusqlite::params![
            lane,
            seq,
            row_id,
            BODY,
            BODY.len() as i64,
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64,
            headers
        ],
    )
    .unwrap();
    tx.execute(
        "UPDATE ol_lanes SET tail_seq = max(tail_seq, ?1) WHERE id = ?2",
        rusqlite::params![seq, lane],
    )
    .unwrap();
    tx.commit().unwrap();
}

/// A row written with plain SQL bypasses enqueue's header check. Its `Host` or
/// `Content-Length` is never sent: the unit is dead-lettered (`permanent`) on its first
/// attempt with an error naming the header, and the recipient sees nothing of it.
#[test]
fn stored_headers_the_client_sets_itself_are_never_sent() {
    use outbox_lanes_blocking::{Outbox, OutboxConfig};
    use outbox_lanes_core::DeadReason;
    use outbox_lanes_store::{SqliteOptions, SqliteStore};

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("outbox.db");
    let store = Arc::new(SqliteStore::open(&db, SqliteOptions::default()).unwrap());
    let r = recipient();
    enqueue_with_plain_sql(&db, "host", &r.url("/host"), "Host: evil.internal");
    enqueue_with_plain_sql(
        &db,
        "length",
        &r.url("/length"),
        "X-Ok: 1\nContent-Length: 0",
    );
    let mut cfg = OutboxConfig::default().allow_loopback();
    cfg.http.timeout = Duration::from_secs(2);
    let outbox = Outbox::open(store, cfg).unwrap();
    outbox.drain("actor").unwrap();
    assert_eq!(r.count_all(), 0, "sent: {:?}", r.all_requests());
    let mut letters = outbox.dead_letters(Some("actor")).unwrap();
    letters.sort_by(|a, b| a.row_id.cmp(&b.row_id));
    let got: Vec<_> = letters
        .iter()
        .map(|d| {
            (
                d.row_id.as_str(),
                d.reason,
                d.attempts,
                d.last_status,
                d.last_error.as_deref().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "host",
                DeadReason::Permanent,
                1,
                None,
                "invalid_request: refused stored header \"Host\": reserved (the HTTP client sets it itself)"
            ),
            (
                "length",
                DeadReason::Permanent,
                1,
                None,
                "invalid_request: refused stored header \"Content-Length\": reserved (the HTTP client sets it itself)"
            ),
        ]
    );
}
