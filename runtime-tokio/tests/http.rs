//! The hyper-util client against real HTTP servers on loopback, compared with the blocking ureq
//! client: for every scenario both clients must produce the same outcome, status and error
//! code (the text before the first `:`), so dead letters read the same whichever runtime
//! delivered. Only loopback addresses are used: 127.0.0.0/8, `[::1]` and `localhost`.
#![allow(missing_docs)]
#![cfg(feature = "tokio")]

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_lanes_core::policy::AddressPolicy;
use outbox_lanes_core::{Outcome, UnitId};
use outbox_lanes_driver::http::{AttemptResult, Bytes, Delivery, Destination};
use outbox_lanes_driver::ureq_client::HttpClient;
use outbox_lanes_test_support::{Completion, Recipient, Reply, Response, Unanswered};
use outbox_lanes_tokio::{AsyncHttpClient, HttpConfig};

const BODY: &[u8] = br#"{"type":"Create","n":1}"#;
const CONTENT_TYPE: &str = "application/activity+json";

fn loopback() -> HttpConfig {
    HttpConfig {
        addresses: AddressPolicy::allow_loopback_only(),
        timeout: Duration::from_millis(700),
        ..HttpConfig::default()
    }
}

/// A fixed attempt time, so HTTP-date Retry-Afters give exact delays.
fn fixed_now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

async fn post_async(c: &AsyncHttpClient, url: &str, content_type: &str) -> AttemptResult {
    c.deliver(
        &Delivery {
            actor: "actor",
            outbox: "0123abcd",
            unit: UnitId(7),
            recipient: &Destination::parse(url),
            body: &Bytes::from_static(BODY),
            content_type,
            headers: &[],
            attempt: 1,
        },
        fixed_now(),
    )
    .await
}

async fn post_blocking(c: &HttpClient, url: &str, content_type: &str) -> AttemptResult {
    let (c, url, content_type) = (c.clone(), url.to_owned(), content_type.to_owned());
    tokio::task::spawn_blocking(move || {
        c.deliver(
            &Delivery {
                actor: "actor",
                outbox: "0123abcd",
                unit: UnitId(7),
                recipient: &Destination::parse(&url),
                body: &Bytes::from_static(BODY),
                content_type: &content_type,
                headers: &[],
                attempt: 1,
            },
            fixed_now(),
        )
    })
    .await
    .expect("join")
}

fn code(r: &AttemptResult) -> Option<&str> {
    r.error.as_deref().map(|e| e.split(':').next().unwrap_or(e))
}

/// Delivers to `url` with both clients (built from `cfg`) and checks they agree; returns
/// the async client's result.
async fn both(cfg: HttpConfig, url: &str, content_type: &str) -> AttemptResult {
    let a = AsyncHttpClient::new(cfg.clone(), None).expect("async client");
    let b = HttpClient::new(cfg, None).expect("blocking client");
    let async_result = post_async(&a, url, content_type).await;
    let blocking_result = post_blocking(&b, url, content_type).await;
    assert_eq!(
        (
            async_result.outcome,
            async_result.status,
            code(&async_result)
        ),
        (
            blocking_result.outcome,
            blocking_result.status,
            code(&blocking_result)
        ),
        "{url}: async {async_result:?} vs blocking {blocking_result:?}"
    );
    async_result
}

fn transient() -> Outcome {
    Outcome::Transient { retry_after: None }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_classify_like_the_blocking_client() {
    let r = Recipient::start().expect("recipient");
    r.set_default("/ok", Reply::Status(200));
    r.set_default("/accepted", Reply::Status(202));
    r.set_default("/error", Reply::Status(500));
    r.set_default(
        "/busy",
        Response::new(503).with_header("Retry-After", "7").into(),
    );
    r.set_default(
        "/dated",
        Response::new(429)
            .with_header("Retry-After", "Tue, 14 Nov 2023 22:14:20 GMT")
            .into(),
    );
    r.set_default("/gone", Reply::Status(410));
    r.set_default("/missing", Reply::Status(404));
    r.set_default(
        "/refusal",
        Response::new(422).with_body("bad\r\nactivity\0").into(),
    );
    r.set_default("/moved", Reply::Redirect(302, r.url("/ok")));
    let cases: [(&str, Outcome, u16); 9] = [
        ("/ok", Outcome::Delivered, 200),
        ("/accepted", Outcome::Delivered, 202),
        ("/error", transient(), 500),
        (
            "/busy",
            Outcome::Throttled {
                retry_after: Some(Duration::from_secs(7)),
            },
            503,
        ),
        (
            "/dated",
            Outcome::Throttled {
                retry_after: Some(Duration::from_secs(60)),
            },
            429,
        ),
        ("/gone", Outcome::Gone, 410),
        ("/missing", Outcome::Permanent, 404),
        ("/refusal", Outcome::Permanent, 422),
        ("/moved", Outcome::Permanent, 302),
    ];
    for (path, outcome, status) in cases {
        let res = both(loopback(), &r.url(path), CONTENT_TYPE).await;
        assert_eq!((res.outcome, res.status), (outcome, Some(status)), "{path}");
    }
    // The excerpt is sanitised the same way as the blocking client's.
    let res = both(loopback(), &r.url("/refusal"), CONTENT_TYPE).await;
    assert_eq!(res.error.as_deref(), Some("status 422: bad  activity"));
    // The redirect was not followed.
    assert_eq!(r.count("/ok"), 2);
    // Every request carried the idempotency key, the user agent and the content type.
    for q in r.all_requests() {
        assert_eq!(q.header("idempotency-key"), Some("0123abcd-7"));
        assert_eq!(
            q.header("user-agent"),
            Some(concat!("outbox-lanes/", env!("CARGO_PKG_VERSION")))
        );
        assert_eq!(q.header_all("user-agent").len(), 1);
        assert_eq!(q.header("content-type"), Some(CONTENT_TYPE));
        assert_eq!(q.body, BODY);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_failures_classify_like_the_blocking_client() {
    let r = Recipient::start().expect("recipient");
    r.set_default("/hang", Reply::Hang);
    r.set_default("/reset", Reply::Reset);
    r.set_default("/close", Reply::CloseWithoutResponse);
    let res = both(loopback(), &r.url("/hang"), CONTENT_TYPE).await;
    assert_eq!((res.outcome, code(&res)), (transient(), Some("timeout")));
    let res = both(loopback(), &r.url("/reset"), CONTENT_TYPE).await;
    assert_eq!(res.outcome, transient(), "{res:?}");
    let res = both(loopback(), &r.url("/close"), CONTENT_TYPE).await;
    assert_eq!(res.outcome, transient(), "{res:?}");

    // A port that was just listened on and is closed now.
    let closed = {
        let gone = Recipient::start().expect("recipient");
        gone.url("/inbox")
    };
    let res = both(loopback(), &closed, CONTENT_TYPE).await;
    assert_eq!(
        (res.outcome, code(&res)),
        (transient(), Some("connection_refused"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_to_a_plain_http_server_is_a_tls_error() {
    // A bare loopback socket answers the ClientHello with plain HTTP, the way a
    // misconfigured recipient would; one connection per client.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = thread::spawn(move || {
        for _ in 0..2 {
            let (mut stream, _) = listener.accept().expect("accept");
            let mut hello = [0u8; 512];
            let _ = stream.read(&mut hello);
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let res = both(loopback(), &format!("https://{addr}/inbox"), CONTENT_TYPE).await;
    server.join().expect("server");
    assert_eq!(
        (res.outcome, res.status, code(&res)),
        (transient(), None, Some("tls"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_read_only_up_to_the_cap() {
    let r = Recipient::start().expect("recipient");
    r.set_default(
        "/huge",
        Response::new(503).with_body(vec![b'x'; 32 << 20]).into(),
    );
    let res = both(loopback(), &r.url("/huge"), CONTENT_TYPE).await;
    assert_eq!((res.outcome, res.status), (transient(), Some(503)));
    let err = res.error.expect("error");
    assert!(
        err.starts_with("status 503: xxx") && err.len() < 300,
        "{err}"
    );
    // The async client dropped the connection rather than read 32 MiB.
    assert!(
        r.wait_until(Duration::from_secs(10), |log| matches!(
            log[0].completion,
            Completion::Unanswered {
                reason: Unanswered::WriteFailed,
                ..
            }
        )),
        "{:?}",
        r.requests("/huge")[0].completion
    );
    // A body slower than the timeout still counts by its status.
    r.set_default(
        "/slow-gone",
        Reply::SlowBody {
            status: 410,
            chunk: b"g".to_vec(),
            interval: Duration::from_millis(100),
            chunks: 100,
        },
    );
    let res = both(loopback(), &r.url("/slow-gone"), CONTENT_TYPE).await;
    assert_eq!((res.outcome, res.status), (Outcome::Gone, Some(410)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_policy_refuses_loopback_literals_and_names_without_traffic() {
    let r4 = Recipient::start_on("127.0.0.2:0".parse().expect("addr")).expect("recipient");
    let r6 = Recipient::start_on("[::1]:0".parse().expect("addr"));
    let mut urls = vec![
        r4.url("/inbox"),
        format!("http://localhost:{}/inbox", r4.addr().port()),
    ];
    if let Ok(r6) = &r6 {
        urls.push(r6.url("/inbox"));
    }
    for url in &urls {
        let res = both(HttpConfig::default(), url, CONTENT_TYPE).await;
        assert_eq!(res.outcome, Outcome::Refused, "{url}: {res:?}");
        assert_eq!(code(&res), Some("destination_refused"), "{url}");
    }
    assert_eq!(r4.count_all(), 0);
    if let Ok(r6) = &r6 {
        assert_eq!(r6.count_all(), 0);
    }
    // With loopback allowed, the literals and a name resolving to loopback are delivered to.
    let r1 = Recipient::start().expect("recipient");
    let mut allowed = vec![
        r4.url("/inbox"),
        format!("http://localhost:{}/inbox", r1.addr().port()),
    ];
    if let Ok(r6) = &r6 {
        allowed.push(r6.url("/inbox"));
    }
    for url in &allowed {
        let res = both(loopback(), url, CONTENT_TYPE).await;
        assert_eq!(res.outcome, Outcome::Delivered, "{url}: {res:?}");
    }
    assert_eq!(
        (r4.count_all(), r1.count_all()),
        (2, 2),
        "one request per client"
    );
    if let Ok(r6) = &r6 {
        assert_eq!(r6.count_all(), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_permanent_and_send_nothing() {
    let r = Recipient::start().expect("recipient");
    let res = both(loopback(), "ftp://example.invalid/inbox", CONTENT_TYPE).await;
    assert_eq!(
        (res.outcome, code(&res)),
        (Outcome::Permanent, Some("invalid_recipient"))
    );
    let res = both(loopback(), &r.url("/inbox"), "text/plain\r\nX: y").await;
    assert_eq!(
        (res.outcome, code(&res)),
        (Outcome::Permanent, Some("invalid_request"))
    );
    assert_eq!(r.count_all(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_proxy_is_used_and_literals_are_still_checked() {
    // The proxy is on loopback and the policy is the default (loopback refused): the proxy's
    // own address is exempt, and the recipient's name goes to the proxy unresolved.
    let proxy = Recipient::start().expect("recipient");
    let target = Recipient::start().expect("recipient");
    let c = AsyncHttpClient::new(
        HttpConfig {
            proxy: Some(format!("http://{}", proxy.addr())),
            ..HttpConfig::default()
        },
        None,
    )
    .expect("client");
    let name = format!("http://localhost:{}/inbox", target.addr().port());
    let res = post_async(&c, &name, CONTENT_TYPE).await;
    assert_eq!(res.outcome, Outcome::Delivered, "{res:?}");
    let seen = proxy.all_requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "POST");
    assert_eq!(target.count_all(), 0, "only the proxy was connected to");
    // IP literals are still checked before the proxy is asked.
    let res = post_async(&c, &target.url("/inbox"), CONTENT_TYPE).await;
    assert_eq!(res.outcome, Outcome::Refused);
    assert_eq!(proxy.count_all(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxys_credentials_are_sent_decoded_and_the_request_is_in_absolute_form() {
    let proxy = Recipient::start().expect("recipient");
    let c = AsyncHttpClient::new(
        HttpConfig {
            proxy: Some(format!("http://al%40ice:s%3Acret@{}", proxy.addr())),
            ..HttpConfig::default()
        },
        None,
    )
    .expect("client");
    let res = post_async(&c, "http://inbox.test:8080/inbox?x=1", CONTENT_TYPE).await;
    assert_eq!(res.outcome, Outcome::Delivered, "{res:?}");
    let seen = proxy.all_requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].target, "http://inbox.test:8080/inbox?x=1");
    assert_eq!(seen[0].header("host"), Some("inbox.test:8080"));
    // base64("al@ice:s:cret")
    assert_eq!(
        seen[0].header("proxy-authorization"),
        Some("Basic YWxAaWNlOnM6Y3JldA==")
    );
    assert_eq!(seen[0].body, BODY);
}

/// A `CONNECT` proxy on loopback for one connection: records the request head it was
/// asked, then relays bytes both ways to `target`.
fn connect_proxy(
    target: std::net::SocketAddr,
) -> (std::net::SocketAddr, thread::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    listener.set_nonblocking(true).expect("nonblocking");
    let handle = thread::spawn(move || {
        // Bounded: a client that never comes ends the proxy after 10 s.
        let mut waited = 0;
        let mut client = loop {
            match listener.accept() {
                Ok((client, _)) => break client,
                Err(_) if waited < 1000 => {
                    waited += 1;
                    thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return format!("no connection: {e}"),
            }
        };
        client.set_nonblocking(false).expect("blocking");
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
            match client.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => break,
            }
        }
        let upstream = std::net::TcpStream::connect(target).expect("target");
        client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .expect("answer");
        let (mut c2, mut u2) = (
            client.try_clone().expect("clone"),
            upstream.try_clone().expect("clone"),
        );
        let up = thread::spawn(move || {
            let _ = std::io::copy(&mut c2, &mut u2);
            let _ = u2.shutdown(std::net::Shutdown::Write);
        });
        let (mut u, mut c) = (upstream, client);
        let _ = std::io::copy(&mut u, &mut c);
        let _ = c.shutdown(std::net::Shutdown::Both);
        let _ = up.join();
        String::from_utf8_lossy(&head).into_owned()
    });
    (addr, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_recipient_is_reached_through_a_connect_tunnel() {
    // The tunnel leads to a plain-HTTP server: the TLS handshake with the recipient runs
    // inside the tunnel and fails there (`tls`), which shows both that the proxy was asked
    // to CONNECT and that TLS was spoken to the recipient, not to the proxy.
    let plain = TcpListener::bind("127.0.0.1:0").expect("bind");
    let target = plain.local_addr().expect("addr");
    let server = thread::spawn(move || {
        let (mut stream, _) = plain.accept().expect("accept");
        let mut hello = [0u8; 512];
        let _ = stream.read(&mut hello);
        let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    });
    let (proxy, asked) = connect_proxy(target);
    let c = AsyncHttpClient::new(
        HttpConfig {
            proxy: Some(format!("http://bob:pw@{proxy}")),
            timeout: Duration::from_secs(10),
            ..HttpConfig::default()
        },
        None,
    )
    .expect("client");
    let res = post_async(&c, "https://inbox.test/inbox", CONTENT_TYPE).await;
    assert_eq!(code(&res), Some("tls"), "{res:?}");
    server.join().expect("server");
    let head = asked.join().expect("proxy");
    let first = head.lines().next().unwrap_or("");
    assert_eq!(first, "CONNECT inbox.test:443 HTTP/1.1", "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("proxy-authorization: basic ym9ionb3"),
        "{head}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn construction_errors() {
    let err = |cfg: HttpConfig| {
        AsyncHttpClient::new(cfg, None)
            .expect_err("refused")
            .to_string()
    };
    let e = err(HttpConfig {
        proxy: Some("socks5://user:secret@127.0.0.1:1080".into()),
        ..HttpConfig::default()
    });
    assert!(
        e.contains("unsupported proxy") && !e.contains("secret"),
        "{e}"
    );
    let e = err(HttpConfig {
        user_agent: "bad\nagent".into(),
        ..HttpConfig::default()
    });
    assert!(e.contains("User-Agent"), "{e}");
}

/// A row's own headers, sent by both clients after their own; one they cannot send is a
/// permanent `invalid_request` on both, with nothing sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_headers_are_sent_by_both_clients() {
    let r = Recipient::start().expect("recipient");
    let a = AsyncHttpClient::new(loopback(), None).expect("async client");
    let b = HttpClient::new(loopback(), None).expect("blocking client");
    let good = vec![
        ("Authorization".to_owned(), "Bearer t0k3n".to_owned()),
        ("X-Trace".to_owned(), "a, b".to_owned()),
    ];
    let bad = vec![("X Bad".to_owned(), "1".to_owned())];
    for (client, path) in [("async", "/async"), ("blocking", "/blocking")] {
        for (headers, sub) in [(&good, "good"), (&bad, "bad")] {
            let (headers, url2) = (headers.clone(), r.url(&format!("{path}/{sub}")));
            let res = if client == "async" {
                a.deliver(
                    &Delivery {
                        actor: "actor",
                        outbox: "0123abcd",
                        unit: UnitId(7),
                        recipient: &Destination::parse(&url2),
                        body: &Bytes::from_static(BODY),
                        content_type: CONTENT_TYPE,
                        headers: &headers,
                        attempt: 1,
                    },
                    fixed_now(),
                )
                .await
            } else {
                let b = b.clone();
                tokio::task::spawn_blocking(move || {
                    b.deliver(
                        &Delivery {
                            actor: "actor",
                            outbox: "0123abcd",
                            unit: UnitId(7),
                            recipient: &Destination::parse(&url2),
                            body: &Bytes::from_static(BODY),
                            content_type: CONTENT_TYPE,
                            headers: &headers,
                            attempt: 1,
                        },
                        fixed_now(),
                    )
                })
                .await
                .expect("join")
            };
            let path = format!("{path}/{sub}");
            if sub == "good" {
                assert_eq!(res.outcome, Outcome::Delivered, "{client}: {res:?}");
                let q = r.requests(&path);
                assert_eq!(q.len(), 1, "{client}");
                assert_eq!(
                    q[0].header("authorization"),
                    Some("Bearer t0k3n"),
                    "{client}"
                );
                assert_eq!(q[0].header("x-trace"), Some("a, b"), "{client}");
                assert_eq!(q[0].header("content-type"), Some(CONTENT_TYPE), "{client}");
                assert_eq!(
                    q[0].header("idempotency-key"),
                    Some("0123abcd-7"),
                    "{client}"
                );
            } else {
                assert_eq!(res.outcome, Outcome::Permanent, "{client}: {res:?}");
                assert_eq!(code(&res), Some("invalid_request"), "{client}: {res:?}");
                assert_eq!(r.count(&path), 0, "{client}");
            }
        }
    }
}

/// Both clients put the same headers, with the same values in the same order, on the same
/// attempt of the same unit (signed, with row headers): they come from one place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_clients_send_the_same_headers() {
    use outbox_lanes_driver::sign::StandardWebhooks;
    let r = Recipient::start().expect("recipient");
    let signer = std::sync::Arc::new(
        StandardWebhooks::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("secret"),
    );
    let a = AsyncHttpClient::new(loopback(), Some(signer.clone())).expect("async client");
    let b = HttpClient::new(loopback(), Some(signer)).expect("blocking client");
    let headers = vec![
        ("Authorization".to_owned(), "Bearer t0k3n".to_owned()),
        ("X-Trace".to_owned(), "a, b".to_owned()),
    ];
    let url = r.url("/inbox");
    let res = a
        .deliver(
            &Delivery {
                actor: "actor",
                outbox: "0123abcd",
                unit: UnitId(7),
                recipient: &Destination::parse(&url),
                body: &Bytes::from_static(BODY),
                content_type: CONTENT_TYPE,
                headers: &headers,
                attempt: 1,
            },
            fixed_now(),
        )
        .await;
    assert_eq!(res.outcome, Outcome::Delivered, "{res:?}");
    let (h, u) = (headers.clone(), url.clone());
    let res = tokio::task::spawn_blocking(move || {
        b.deliver(
            &Delivery {
                actor: "actor",
                outbox: "0123abcd",
                unit: UnitId(7),
                recipient: &Destination::parse(&u),
                body: &Bytes::from_static(BODY),
                content_type: CONTENT_TYPE,
                headers: &h,
                attempt: 1,
            },
            fixed_now(),
        )
    })
    .await
    .expect("join");
    assert_eq!(res.outcome, Outcome::Delivered, "{res:?}");
    let q = r.requests("/inbox");
    assert_eq!(q.len(), 2);
    // The transports add the framing (`Host`, `Content-Length`), each where it likes; every
    // other header comes from the one request description, in its order. The attempt time
    // is fixed, so even the signature's values agree.
    let framing = |name: &str| ["host", "content-length"].contains(&name);
    let split = |q: &outbox_lanes_test_support::Recorded| {
        let (mut framed, ours): (Vec<_>, Vec<_>) =
            q.headers.iter().cloned().partition(|(n, _)| framing(n));
        framed.sort();
        (ours, framed)
    };
    let (async_headers, async_framing) = split(&q[0]);
    let (blocking_headers, blocking_framing) = split(&q[1]);
    assert_eq!(
        async_headers, blocking_headers,
        "async first, blocking second"
    );
    assert_eq!(async_framing, blocking_framing);
    assert_eq!(async_framing.len(), 2, "{async_framing:?}");
    let names: Vec<&str> = async_headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "user-agent",
            "accept",
            "idempotency-key",
            "content-type",
            "authorization",
            "x-trace",
            "webhook-id",
            "webhook-timestamp",
            "webhook-signature"
        ]
    );
    assert_eq!(q[0].body, q[1].body);
}

/// Enqueues one row for one recipient with plain SQL, as store/SCHEMA.md ("Enqueue with plain
/// SQL", steps 1, 3, 4a and 5) tells a service enqueueing from its own SQL library: nothing
/// checks the `headers` column on that path.
fn enqueue_with_plain_sql(db: &std::path::Path, row_id: &str, recipient: &str, headers: &str) {
    let mut c = rusqlite::Connection::open(db).expect("open");
    c.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    let tx = c.transaction().expect("transaction");
    let seq: i64 = tx
        .query_row(
            "INSERT INTO ol_actors AS a (actor, last_seq) VALUES ('actor', 1) \
             ON CONFLICT (actor) DO UPDATE SET last_seq = a.last_seq + excluded.last_seq \
             RETURNING last_seq",
            [],
            |r| r.get(0),
        )
        .expect("seq");
    tx.execute(
        "INSERT INTO ol_lanes (actor, recipient, ordering_key) VALUES ('actor', ?1, '') \
         ON CONFLICT (actor, recipient, ordering_key) DO NOTHING",
        [recipient],
    )
    .expect("lane");
    let lane: i64 = tx
        .query_row(
            "SELECT id FROM ol_lanes WHERE actor = 'actor' AND recipient = ?1 AND ordering_key = ''",
            [recipient],
            |r| r.get(0),
        )
        .expect("lane id");
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    tx.execute(
        "INSERT INTO ol_units (actor, lane_id, seq, row_id, content_type, body, body_len, \
         dedup_key, ordering_key, enqueued_at, headers) \
         VALUES ('actor', ?1, ?2, ?3, 'application/json', ?4, ?5, NULL, '', ?6, ?7)",
        rusqlite::params![lane, seq, row_id, BODY, BODY.len() as i64, now_ms, headers],
    )
    .expect("unit");
    tx.execute(
        "UPDATE ol_lanes SET tail_seq = max(tail_seq, ?1) WHERE id = ?2",
        rusqlite::params![seq, lane],
    )
    .expect("tail");
    tx.commit().expect("commit");
}

/// A row written with plain SQL bypasses enqueue's header check. Its `Host` or
/// `Content-Length` is never sent: the unit is dead-lettered (`permanent`) on its first
/// attempt with an error naming the header, and the recipient sees nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_headers_the_client_sets_itself_are_never_sent() {
    use outbox_lanes_core::DeadReason;
    use outbox_lanes_store::{SqliteOptions, SqliteStore};
    use outbox_lanes_tokio::Outbox;

    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("outbox.db");
    let store =
        std::sync::Arc::new(SqliteStore::open(&db, SqliteOptions::default()).expect("open"));
    let r = Recipient::start().expect("recipient");
    enqueue_with_plain_sql(&db, "host", &r.url("/host"), "Host: evil.internal");
    enqueue_with_plain_sql(
        &db,
        "length",
        &r.url("/length"),
        "X-Ok: 1\nContent-Length: 0",
    );
    let mut cfg = outbox_lanes_tokio::OutboxConfig::default().allow_loopback();
    cfg.http.timeout = Duration::from_secs(2);
    let outbox = Outbox::open(store, cfg).expect("outbox");
    outbox.drain("actor").await.expect("drain");
    assert_eq!(r.count_all(), 0, "sent: {:?}", r.all_requests());
    let mut letters = outbox
        .dead_letters(Some("actor"))
        .await
        .expect("dead letters");
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

/// Issue 39: both clients keep the first 1 KiB of a non-2xx answer's body for the delivery
/// log, verbatim (a `<script>`, a multi-byte character; cut on a character boundary), none of
/// a 2xx; and a body that never ends is cut by the request's timeout with what arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_clients_keep_the_first_kib_of_a_failed_answer() {
    let r = Recipient::start().expect("recipient");
    let body = format!("<script>alert(1)</script>\né{}", "y".repeat(3000));
    r.set_default(
        "/fail",
        Response::new(500)
            .with_body(body.clone().into_bytes())
            .into(),
    );
    r.set_default("/ok", Response::new(200).with_body(b"fine".to_vec()).into());
    let a = AsyncHttpClient::new(loopback(), None).expect("async client");
    let b = HttpClient::new(loopback(), None).expect("blocking client");
    for res in [
        post_async(&a, &r.url("/fail"), CONTENT_TYPE).await,
        post_blocking(&b, &r.url("/fail"), CONTENT_TYPE).await,
    ] {
        let kept = res.body.expect("a body excerpt");
        assert!(kept.len() <= 1024 && kept.len() >= 1020, "{}", kept.len());
        assert!(body.starts_with(&kept), "{kept}");
        assert!(kept.starts_with("<script>alert(1)</script>\né"), "{kept}");
    }
    for res in [
        post_async(&a, &r.url("/ok"), CONTENT_TYPE).await,
        post_blocking(&b, &r.url("/ok"), CONTENT_TYPE).await,
    ] {
        assert_eq!((res.status, res.body), (Some(200), None));
    }
    // A body that never ends: the timeout cuts it, the status decides, what came is kept.
    r.set_default(
        "/endless",
        Reply::SlowBody {
            status: 502,
            chunk: b"z".repeat(100),
            interval: Duration::from_millis(300),
            chunks: 1000,
        },
    );
    let cfg = HttpConfig {
        timeout: Duration::from_secs(1),
        ..loopback()
    };
    let a = AsyncHttpClient::new(cfg.clone(), None).expect("async client");
    let b = HttpClient::new(cfg, None).expect("blocking client");
    for res in [
        post_async(&a, &r.url("/endless"), CONTENT_TYPE).await,
        post_blocking(&b, &r.url("/endless"), CONTENT_TYPE).await,
    ] {
        assert_eq!(res.status, Some(502), "{res:?}");
        let kept = res.body.unwrap_or_default();
        assert!(kept.len() <= 1024, "{}", kept.len());
        assert!(kept.chars().all(|c| c == 'z'), "{kept}");
    }
}

/// OL-24: both clients check literals and resolved names against their configuration's policy
/// or the outbox's, read from the handle they were built with at each attempt: a widening set
/// after they were built (as an outbox does at each pass) reaches them, and so does a
/// narrowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_clients_follow_the_outboxs_policy_set_after_they_were_built() {
    use outbox_lanes_core::policy::AddressPolicy;
    let r = Recipient::start().expect("recipient");
    let cfg = HttpConfig::default();
    let a = AsyncHttpClient::new(cfg.clone(), None).expect("async client");
    let b = HttpClient::new(cfg.clone(), None).expect("blocking client");
    let urls = [
        r.url("/inbox"),
        format!("http://localhost:{}/inbox", r.addr().port()),
    ];
    for (policy, outcome) in [
        (AddressPolicy::allow_loopback_only(), Outcome::Delivered),
        (AddressPolicy::public_only(), Outcome::Refused),
    ] {
        cfg.outbox_addresses.set(policy);
        for url in &urls {
            let (x, y) = (
                post_async(&a, url, CONTENT_TYPE).await,
                post_blocking(&b, url, CONTENT_TYPE).await,
            );
            assert_eq!(
                (x.outcome, y.outcome),
                (outcome, outcome),
                "{url}: {x:?} {y:?}"
            );
        }
    }
    assert_eq!(
        r.count_all(),
        4,
        "two per client while loopback was allowed"
    );
}
