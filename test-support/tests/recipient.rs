//! The recipient against a raw HTTP/1.1 client written on `TcpStream`.
//!
//! The assertions are about orders and outcomes. The only timeouts are bounds: a read timeout
//! that makes a missing answer observable, and generous limits that turn a bug into a failure
//! instead of a hung test.
#![allow(clippy::unwrap_used)]

use core::net::SocketAddr;
use core::time::Duration;
use std::io::{self, BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::sync::mpsc;
use std::thread;

use outbox_lanes_test_support::{
    Completion, DEFAULT_MAX_BODY, Recipient, Reply, Response, Unanswered,
};

/// A bound that only a bug reaches.
const LONG: Duration = Duration::from_secs(20);
/// How long a client waits to conclude that no answer is coming.
const SILENCE: Duration = Duration::from_millis(300);

struct Client {
    reader: BufReader<TcpStream>,
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Client {
    fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(LONG)).unwrap();
        stream.set_write_timeout(Some(LONG)).unwrap();
        Self {
            reader: BufReader::new(stream),
        }
    }

    fn stream(&self) -> &TcpStream {
        self.reader.get_ref()
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.reader.get_mut().write_all(bytes).unwrap();
    }

    fn send(&mut self, method: &str, target: &str, headers: &[(&str, &str)], body: &[u8]) {
        let mut head = format!("{method} {target} HTTP/1.1\r\nHost: test\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body);
        self.send_raw(&bytes);
    }

    fn post(&mut self, target: &str, body: &[u8]) -> Resp {
        self.send("POST", target, &[], body);
        self.read_response().unwrap()
    }

    fn line(&mut self) -> io::Result<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(line.trim_end().to_owned())
    }

    /// Reads one final response (skipping 1xx), its body framed by `Content-Length`.
    fn read_response(&mut self) -> io::Result<Resp> {
        loop {
            let status_line = self.line()?;
            let status: u16 = status_line
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| io::Error::other(format!("bad status line {status_line:?}")))?;
            let mut headers = Vec::new();
            loop {
                let line = self.line()?;
                if line.is_empty() {
                    break;
                }
                let (name, value) = line.split_once(':').unwrap();
                headers.push((name.to_owned(), value.trim().to_owned()));
            }
            if status < 200 {
                continue;
            }
            let mut resp = Resp {
                status,
                headers,
                body: Vec::new(),
            };
            let len: usize = resp
                .header("content-length")
                .map_or(0, |v| v.parse().unwrap());
            resp.body = vec![0; len];
            self.reader.read_exact(&mut resp.body)?;
            return Ok(resp);
        }
    }

    /// Reads what is left until end of file.
    fn read_rest(&mut self) -> io::Result<Vec<u8>> {
        let mut rest = Vec::new();
        self.reader.read_to_end(&mut rest)?;
        Ok(rest)
    }
}

/// Drops the recipient on another thread and fails the test if that does not finish.
fn drop_bounded(recipient: Recipient) {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        drop(recipient);
        let _ = tx.send(());
    });
    rx.recv_timeout(LONG)
        .expect("dropping the recipient did not finish");
}

fn statuses(recipient: &Recipient, path: &str) -> Vec<Option<u16>> {
    recipient
        .requests(path)
        .iter()
        .map(|r| r.completion.status())
        .collect()
}

#[test]
fn arrival_order_is_recorded_on_one_connection_and_across_connections() {
    let recipient = Recipient::start().unwrap();
    let mut kept = Client::connect(recipient.addr());
    for body in ["1", "2", "3"] {
        assert_eq!(kept.post("/inbox/a", body.as_bytes()).status, 200);
    }
    for body in ["4", "5"] {
        let mut once = Client::connect(recipient.addr());
        once.send(
            "POST",
            "/inbox/a",
            &[("Connection", "close")],
            body.as_bytes(),
        );
        let resp = once.read_response().unwrap();
        assert_eq!(resp.status, 200);
        assert_eq!(resp.header("connection"), Some("close"));
        assert_eq!(once.read_rest().unwrap(), b"");
    }
    assert_eq!(kept.post("/inbox/b", b"6").status, 200);
    assert_eq!(kept.post("/inbox/a?page=2", b"7").status, 200);

    let a = recipient.requests("/inbox/a");
    let bodies: Vec<&[u8]> = a.iter().map(|r| r.body.as_slice()).collect();
    assert_eq!(bodies, [&b"1"[..], b"2", b"3", b"4", b"5", b"7"]);
    assert_eq!(
        recipient.bodies("/inbox/a"),
        a.iter().map(|r| r.body.clone()).collect::<Vec<_>>()
    );
    let connections: Vec<u64> = a.iter().map(|r| r.connection).collect();
    assert_eq!(connections, [0, 0, 0, 1, 2, 0]);
    assert_eq!(recipient.count("/inbox/b"), 1);
    assert_eq!(recipient.count("/inbox/a?page=2"), 1);
    assert_eq!(
        recipient.requests("/inbox/a?page=2")[0].query(),
        Some("page=2")
    );

    let all = recipient.all_requests();
    assert_eq!(all.len(), 7);
    assert_eq!(recipient.count_all(), 7);
    for (i, pair) in all.windows(2).enumerate() {
        assert_eq!(pair[0].index, i as u64);
        assert!(pair[0].arrived_at <= pair[1].arrived_at);
        // Each request was sent after the previous response was read: arrivals and
        // completions interleave in that order.
        let Completion::Answered { status: 200, at } = pair[0].completion else {
            panic!("not answered: {:?}", pair[0]);
        };
        assert!(at <= pair[1].arrived_at);
    }
    assert!(recipient.protocol_errors().is_empty());
}

#[test]
fn a_script_is_served_in_order_then_the_default() {
    let recipient = Recipient::start().unwrap();
    recipient.script(
        "/inbox/a",
        [
            Response::new(503)
                .with_header("Retry-After", "7")
                .with_body("busy")
                .into(),
            Reply::Status(503),
        ],
    );
    recipient.script("/inbox/a", [Reply::Status(200)]);
    let mut client = Client::connect(recipient.addr());
    let first = client.post("/inbox/a", b"x");
    assert_eq!(first.status, 503);
    assert_eq!(first.header("retry-after"), Some("7"));
    assert_eq!(first.body, b"busy");
    let rest: Vec<u16> = (0..4)
        .map(|_| client.post("/inbox/a", b"x").status)
        .collect();
    assert_eq!(rest, [503, 200, 200, 200]);
    assert_eq!(
        statuses(&recipient, "/inbox/a"),
        [Some(503), Some(503), Some(200), Some(200), Some(200)]
    );

    recipient.script("/inbox/a", [Reply::Status(500), Reply::Status(502)]);
    recipient.clear_script("/inbox/a");
    assert_eq!(client.post("/inbox/a", b"x").status, 200);
}

#[test]
fn defaults_apply_by_path_then_prefix_then_server() {
    let recipient = Recipient::start().unwrap();
    recipient.set_server_default(Reply::Status(204));
    recipient.set_prefix_default("/gone/", Reply::Status(410));
    recipient.set_prefix_default("/gone/but/", Reply::Status(404));
    recipient.set_default("/gone/exact", Reply::Status(202));
    recipient.script("/gone/exact", [Reply::Status(500)]);
    let mut client = Client::connect(recipient.addr());
    let got: Vec<u16> = [
        "/other",
        "/gone/x",
        "/gone/but/y",
        "/gone/exact",
        "/gone/exact?q=1",
    ]
    .iter()
    .map(|path| client.post(path, b"").status)
    .collect();
    assert_eq!(got, [204, 410, 404, 500, 202]);
}

#[test]
fn hang_does_not_answer_and_the_recipient_still_drops() {
    let recipient = Recipient::start().unwrap();
    recipient.script("/slow", [Reply::Hang]);
    let mut client = Client::connect(recipient.addr());
    client.send("POST", "/slow", &[], b"payload");
    client.stream().set_read_timeout(Some(SILENCE)).unwrap();
    let err = client.read_response().unwrap_err();
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{err:?}"
    );
    assert!(recipient.wait_for("/slow", 1, LONG));
    let recorded = recipient.requests("/slow");
    assert_eq!(recorded[0].body, b"payload");
    assert_eq!(recorded[0].completion, Completion::Pending);

    drop_bounded(recipient);
    client.stream().set_read_timeout(Some(LONG)).unwrap();
    // Released by the drop: the connection ends, still without a byte of response.
    assert!(client.read_rest().is_ok_and(|rest| rest.is_empty()));
}

#[test]
fn hang_is_released_when_the_client_closes() {
    let recipient = Recipient::start().unwrap();
    recipient.script("/slow", [Reply::Hang]);
    let mut client = Client::connect(recipient.addr());
    client.send("POST", "/slow", &[], b"");
    assert!(recipient.wait_for("/slow", 1, LONG));
    drop(client);
    assert!(recipient.wait_until(LONG, |log| matches!(
        log[0].completion,
        Completion::Unanswered {
            reason: Unanswered::Hung,
            ..
        }
    )));
}

#[test]
fn reset_makes_the_client_read_fail() {
    let recipient = Recipient::start().unwrap();
    recipient.script("/reset", [Reply::Reset]);
    let mut client = Client::connect(recipient.addr());
    client.send("POST", "/reset", &[], b"payload");
    let err = client.read_response().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err:?}");
    let recorded = recipient.requests("/reset");
    assert_eq!(recorded[0].body, b"payload");
    assert!(matches!(
        recorded[0].completion,
        Completion::Unanswered {
            reason: Unanswered::Reset,
            ..
        }
    ));
    // The script is used up: a new connection gets the default.
    assert_eq!(
        Client::connect(recipient.addr()).post("/reset", b"").status,
        200
    );
}

#[test]
fn close_without_response_ends_the_stream_before_a_status_line() {
    let recipient = Recipient::start().unwrap();
    recipient.script("/close", [Reply::CloseWithoutResponse]);
    let mut client = Client::connect(recipient.addr());
    client.send("POST", "/close", &[], b"");
    let err = client.read_response().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err:?}");
    assert!(matches!(
        recipient.requests("/close")[0].completion,
        Completion::Unanswered {
            reason: Unanswered::Closed,
            ..
        }
    ));
}

#[test]
fn delay_slow_body_and_redirect_answer_as_scripted() {
    let recipient = Recipient::start().unwrap();
    recipient.script(
        "/inbox",
        [
            Reply::Status(201).after(Duration::from_millis(20)),
            Reply::SlowBody {
                status: 200,
                chunk: b"ab".to_vec(),
                interval: Duration::from_millis(5),
                chunks: 3,
            },
            Reply::Redirect(308, "http://127.0.0.1:1/elsewhere".to_owned()),
        ],
    );
    let mut client = Client::connect(recipient.addr());
    assert_eq!(client.post("/inbox", b"").status, 201);
    let slow = client.post("/inbox", b"");
    assert_eq!((slow.status, slow.body.as_slice()), (200, &b"ababab"[..]));
    let redirect = client.post("/inbox", b"");
    assert_eq!(redirect.status, 308);
    assert_eq!(
        redirect.header("location"),
        Some("http://127.0.0.1:1/elsewhere")
    );
    assert_eq!(
        statuses(&recipient, "/inbox"),
        [Some(201), Some(200), Some(308)]
    );
}

#[test]
fn chunked_request_bodies_are_decoded() {
    let recipient = Recipient::start().unwrap();
    let mut client = Client::connect(recipient.addr());
    client.send_raw(
        b"POST /inbox HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n\
          5\r\nhello\r\n1;ext=1\r\n \r\nA\r\nfrom chunk\r\n0\r\nDigest: sha-256=x\r\n\r\n",
    );
    assert_eq!(client.read_response().unwrap().status, 200);
    // The connection is still usable after a chunked body.
    assert_eq!(client.post("/inbox", b"next").status, 200);
    let recorded = recipient.requests("/inbox");
    assert_eq!(recorded[0].body, b"hello from chunk");
    assert_eq!(
        recorded[0].trailers,
        [("Digest".to_owned(), "sha-256=x".to_owned())]
    );
    assert_eq!(recorded[1].body, b"next");
}

#[test]
fn oversized_bodies_get_413() {
    let recipient = Recipient::start().unwrap();
    let mut client = Client::connect(recipient.addr());
    // Announced by Content-Length: refused before the body is sent.
    let too_long = (DEFAULT_MAX_BODY + 1).to_string();
    client.send_raw(
        format!("POST /big HTTP/1.1\r\nHost: test\r\nContent-Length: {too_long}\r\n\r\n")
            .as_bytes(),
    );
    let resp = client.read_response().unwrap();
    assert_eq!(resp.status, 413);
    assert_eq!(resp.header("connection"), Some("close"));
    assert_eq!(client.read_rest().unwrap(), b"");
    let recorded = recipient.requests("/big");
    assert_eq!(recorded.len(), 1);
    assert!(recorded[0].body.is_empty());
    assert_eq!(recorded[0].completion.status(), Some(413));

    // Found while decoding chunks, with a small limit.
    let small = Recipient::builder().max_body(16).start().unwrap();
    small.script("/big", [Reply::Status(500), Reply::Status(202)]);
    let mut client = Client::connect(small.addr());
    assert_eq!(client.post("/big", &[b'x'; 16]).status, 500);
    let mut client = Client::connect(small.addr());
    client.send_raw(
        b"POST /big HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n\
          a\r\n0123456789\r\na\r\n0123456789\r\n0\r\n\r\n",
    );
    assert_eq!(client.read_response().unwrap().status, 413);
    let mut client = Client::connect(small.addr());
    assert_eq!(client.post("/big", &[b'x'; 17]).status, 413);
    assert_eq!(client.read_rest().unwrap(), b"");
    // Refusals do not consume the script.
    assert_eq!(Client::connect(small.addr()).post("/big", b"x").status, 202);
    assert_eq!(
        statuses(&small, "/big"),
        [Some(500), Some(413), Some(413), Some(202)]
    );
}

#[test]
fn wait_for_returns_false_when_too_few_requests_come() {
    let recipient = Recipient::start().unwrap();
    Client::connect(recipient.addr()).post("/inbox", b"");
    assert!(recipient.wait_for("/inbox", 1, LONG));
    assert!(!recipient.wait_for("/inbox", 2, SILENCE));
    assert!(!recipient.wait_for("/elsewhere", 1, SILENCE));
    assert!(!recipient.wait_until(Duration::ZERO, |log| log.len() > 1));
}

#[test]
fn headers_are_recorded_verbatim() {
    let recipient = Recipient::start().unwrap();
    let mut client = Client::connect(recipient.addr());
    let headers = [
        ("webhook-id", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"),
        ("webhook-timestamp", "1674087231"),
        (
            "webhook-signature",
            "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4= v1,other",
        ),
        ("Idempotency-Key", "unit-42"),
        ("X-Multi", "one"),
        ("x-multi", "two"),
        ("Content-Type", "application/activity+json"),
    ];
    client.send("POST", "/hooks", &headers, br#"{"type":"Create"}"#);
    assert_eq!(client.read_response().unwrap().status, 200);
    let r = &recipient.requests("/hooks")[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.target, "/hooks");
    let sent: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect();
    // Host first, Content-Length last: the rest exactly as sent.
    assert_eq!(r.headers[1..=headers.len()], sent[..]);
    assert_eq!(
        r.header("WEBHOOK-ID"),
        Some("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W")
    );
    assert_eq!(r.header("idempotency-key"), Some("unit-42"));
    assert_eq!(r.header_all("X-MULTI"), ["one", "two"]);
    assert_eq!(r.body_text(), Some(r#"{"type":"Create"}"#));
}

#[test]
fn expect_continue_and_pipelined_requests_are_served_in_order() {
    let recipient = Recipient::start().unwrap();
    let mut client = Client::connect(recipient.addr());
    client.send_raw(
        b"POST /p HTTP/1.1\r\nHost: test\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
    );
    assert_eq!(client.line().unwrap(), "HTTP/1.1 100 Continue");
    assert_eq!(client.line().unwrap(), "");
    client.send_raw(b"ok");
    assert_eq!(client.read_response().unwrap().status, 200);

    recipient.script("/p", [Reply::Status(201), Reply::Status(202)]);
    client.send_raw(
        b"POST /p HTTP/1.1\r\nContent-Length: 1\r\n\r\naPOST /p HTTP/1.1\r\nContent-Length: 1\r\n\r\nb",
    );
    assert_eq!(client.read_response().unwrap().status, 201);
    assert_eq!(client.read_response().unwrap().status, 202);
    assert_eq!(
        recipient.bodies("/p"),
        [b"ok".to_vec(), b"a".to_vec(), b"b".to_vec()]
    );
}

#[test]
fn malformed_requests_get_400_and_are_not_recorded() {
    let recipient = Recipient::start().unwrap();
    let mut client = Client::connect(recipient.addr());
    client.send_raw(b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab");
    let resp = client.read_response().unwrap();
    assert_eq!(resp.status, 400);
    assert_eq!(resp.header("connection"), Some("close"));
    assert_eq!(recipient.count_all(), 0);
    assert_eq!(recipient.protocol_errors().len(), 1);
}

#[test]
fn new_connections_wait_while_the_connection_cap_is_reached() {
    let recipient = Recipient::builder().max_connections(1).start().unwrap();
    let mut first = Client::connect(recipient.addr());
    assert_eq!(first.post("/inbox", b"1").status, 200);
    let mut second = Client::connect(recipient.addr());
    second.send("POST", "/inbox", &[], b"2");
    assert!(!recipient.wait_for("/inbox", 2, SILENCE));
    drop(first);
    assert_eq!(second.read_response().unwrap().status, 200);
    let connections: Vec<u64> = recipient
        .requests("/inbox")
        .iter()
        .map(|r| r.connection)
        .collect();
    assert_eq!(connections, [0, 1]);
}

#[test]
fn drop_ends_delays_slow_bodies_and_idle_connections() {
    let recipient = Recipient::start().unwrap();
    recipient.script(
        "/d",
        [
            Reply::Status(200).after(Duration::from_secs(3600)),
            Reply::SlowBody {
                status: 200,
                chunk: b"x".to_vec(),
                interval: Duration::from_secs(3600),
                chunks: 2,
            },
        ],
    );
    let mut delayed = Client::connect(recipient.addr());
    delayed.send("POST", "/d", &[], b"");
    // Two connections race for the script: let the first take the delay.
    assert!(recipient.wait_for("/d", 1, LONG));
    let mut trickled = Client::connect(recipient.addr());
    trickled.send("POST", "/d", &[], b"");
    let mut idle = Client::connect(recipient.addr());
    assert_eq!(idle.post("/idle", b"").status, 200);
    assert!(recipient.wait_for("/d", 2, LONG));

    drop_bounded(recipient);
    assert_eq!(delayed.read_rest().unwrap(), b"");
    let err = trickled.read_response().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err:?}");
    assert_eq!(idle.read_rest().unwrap(), b"");
}

#[test]
fn binds_other_loopback_addresses_and_refuses_the_rest() {
    let other_v4 = Recipient::start_on("127.0.0.2:0".parse().unwrap()).unwrap();
    assert!(other_v4.url("inbox").starts_with("http://127.0.0.2:"));
    assert!(other_v4.url("/inbox").ends_with("/inbox"));
    assert_eq!(
        Client::connect(other_v4.addr()).post("/inbox", b"").status,
        200
    );

    match Recipient::start_on("[::1]:0".parse().unwrap()) {
        Ok(v6) => {
            assert!(v6.url("/inbox").starts_with("http://[::1]:"));
            assert_eq!(Client::connect(v6.addr()).post("/inbox", b"").status, 200);
        }
        // A machine without IPv6 loopback.
        Err(e) => assert_eq!(e.kind(), io::ErrorKind::AddrNotAvailable, "{e:?}"),
    }

    for refused in ["0.0.0.0:0", "[::]:0", "192.0.2.1:0"] {
        let err = Recipient::start_on(refused.parse().unwrap()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}

#[test]
fn max_in_progress_counts_requests_held_at_once() {
    let recipient = Recipient::start().unwrap();
    // One client after another: each answer is recorded before it is written, so the next
    // request can only arrive after the previous one completed.
    let mut client = Client::connect(recipient.addr());
    for _ in 0..3 {
        assert_eq!(client.post("/fast", b"x").status, 200);
    }
    assert_eq!(recipient.max_in_progress(), 1);
    // Three requests that hang are all held at once.
    recipient.set_default("/slow", Reply::Hang);
    let clients: Vec<Client> = (0..3)
        .map(|_| {
            let mut c = Client::connect(recipient.addr());
            c.send("POST", "/slow", &[], b"");
            c
        })
        .collect();
    assert!(recipient.wait_for("/slow", 3, LONG));
    assert_eq!(recipient.max_in_progress(), 3);
    drop(clients);
    drop_bounded(recipient);
}
