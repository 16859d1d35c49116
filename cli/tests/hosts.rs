//! Hosts through the binary, with its DEFAULT delivery settings: origin health (a dead host
//! with 200 lanes costs a handful of connections while a healthy one is served, and `hosts`
//! names it), an operator's `hosts block|unblock`, and the signature double-knock (a host that
//! refuses RFC 9421, one that takes only RFC 9421, remembered across a restart).
//!
//! Every server is on 127.0.0.1 and stops with its test; every wait is bounded.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{
    ALICE, Db, Relay, arrived, collect, eventually, host, is_rfc9421, keys_file, origin, row,
    verifies_cavage, verifies_rfc9421,
};
use outbox_lanes_test_support::{Chooser, Recipient, Recorded, Reply, Response};

/// A host that accepts every connection and closes it at once, without reading or answering
/// (a dead instance behind a load balancer); it counts the connections it accepted, with the
/// time of each.
struct DeadHost {
    port: u16,
    accepted: Arc<std::sync::Mutex<Vec<Instant>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DeadHost {
    fn start() -> DeadHost {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (Arc::clone(&accepted), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        a.lock().unwrap().push(Instant::now());
                        drop(conn);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        DeadHost {
            port,
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    fn accepted_before(&self, t: Instant) -> usize {
        self.accepted
            .lock()
            .unwrap()
            .iter()
            .filter(|&&at| at < t)
            .count()
    }

    fn accepted(&self) -> usize {
        self.accepted.lock().unwrap().len()
    }
}

impl Drop for DeadHost {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn a_dead_host_with_200_lanes_costs_a_handful_of_connections_while_a_healthy_one_is_served() {
    let db = Db::new();
    let dead = DeadHost::start();
    let healthy = Recipient::start().unwrap();
    let mut lines: Vec<String> = (0..200)
        .map(|i| {
            row(
                &format!("d{i}"),
                &format!("http://127.0.0.1:{}/users/u{i}/inbox", dead.port),
            )
        })
        .collect();
    // The healthy recipient's rows come after the dead host's, for the same actor.
    lines.extend((0..10).map(|i| row(&format!("h{i}"), &healthy.url("/inbox"))));
    db.enqueue_lines(ALICE, &lines);

    let started = Instant::now();
    let relay = Relay::start(&db, &[], &[]);
    assert!(
        eventually(|| arrived(&healthy, "/inbox").len() == 10),
        "the healthy recipient was not served"
    );
    let expected: Vec<String> = (0..10).map(|i| format!("h{i}")).collect();
    assert_eq!(arrived(&healthy, "/inbox"), expected);
    // Wait out 15 s of the relay's life, then count what the dead host saw in them.
    let window = started + Duration::from_secs(15);
    while Instant::now() < window {
        std::thread::sleep(Duration::from_millis(100));
    }
    let in_window = dead.accepted_before(window);
    assert!(
        in_window <= 20,
        "{in_window} connections to the dead host in 15 s (200 lanes)"
    );
    assert!(in_window >= 1, "the dead host was never tried");

    let hosts = db.json(&["hosts", "--json"]);
    let origin = format!("http://127.0.0.1:{}", dead.port);
    let h = host(&hosts, &origin);
    assert_eq!(h["state"], "backoff", "{h}");
    assert_eq!(h["lanes"], 200, "{h}");
    assert_eq!(h["pending"], 200, "{h}");
    assert!(h["failures"].as_u64().unwrap() >= 3, "{h}");
    assert!(
        h["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("connection_")),
        "{h}"
    );
    assert!(h["next_probe"].is_string(), "{h}");
    let ok = host(&hosts, &common::origin(&healthy));
    assert_eq!(
        (ok["state"].as_str(), ok["pending"].as_u64()),
        (Some("open"), Some(0))
    );
    // The text table names it too.
    let out = collect(db.command(&["hosts"]).spawn().unwrap(), "");
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with(&origin))
        .unwrap_or_else(|| panic!("{}", out.stdout));
    assert!(line.contains("backoff") && line.contains("200"), "{line}");
    // No lane of it got a counted attempt of its own beyond what reached the host.
    let (_, lines) = relay.stop();
    assert!(
        lines.iter().any(|l| l.contains("host backing off")),
        "{}",
        lines.join("\n")
    );
    let total = dead.accepted();
    eprintln!(
        "dead host with 200 lanes: {in_window} connections in the first 15 s, {total} in all"
    );
    assert!(total <= in_window + 2, "{total} connections in all");
}

#[test]
fn with_host_failures_off_every_lane_tries_the_dead_host_on_its_own() {
    // The comparison that makes the test above mean something: the same 200 lanes, origin
    // health off, cost about a connection per lane in the same time.
    let db = Db::new();
    let dead = DeadHost::start();
    let lines: Vec<String> = (0..200)
        .map(|i| {
            row(
                &format!("d{i}"),
                &format!("http://127.0.0.1:{}/users/u{i}/inbox", dead.port),
            )
        })
        .collect();
    db.enqueue_lines(ALICE, &lines);
    let relay = Relay::start(&db, &["--host-failures", "0"], &[]);
    let started = Instant::now();
    assert!(
        eventually(|| dead.accepted() >= 200),
        "only {} connections with origin health off",
        dead.accepted()
    );
    eprintln!(
        "origin health off: {} connections to the dead host within {:?}",
        dead.accepted(),
        started.elapsed()
    );
    relay.stop();
}

#[test]
fn hosts_block_holds_a_hosts_units_and_unblock_delivers_them_in_order() {
    block_and_unblock(&Db::new());
}

#[test]
fn hosts_block_on_postgres() {
    common::on_postgres("hosts_block", block_and_unblock);
}

fn block_and_unblock(db: &Db) {
    let r = Recipient::start().unwrap();
    let other = Recipient::start().unwrap();
    let lines: Vec<String> = (0..5)
        .map(|i| row(&format!("b{i}"), &r.url("/inbox")))
        .chain(std::iter::once(row("o0", &other.url("/inbox"))))
        .collect();
    db.enqueue_lines(ALICE, &lines);
    let origin = origin(&r);
    let out = db.json(&["hosts", "block", &origin, "--json"]);
    assert_eq!(out["changed"], 1, "{out}");
    let relay = Relay::start(db, &[], &[]);
    assert!(other.wait_for("/inbox", 1, Duration::from_secs(30)));
    // A row enqueued for the blocked host meanwhile, on a new lane, is held too: the relay
    // pauses its lane for the host, as the block paused the others.
    db.enqueue_lines(ALICE, &[row("b-late", &r.url("/late"))]);
    let late = r.url("/late");
    let late_lane = |db: &Db| {
        let lanes = db.json(&["lanes", "--actor", ALICE, "--json"]);
        lanes["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["recipient"] == late.as_str())
            .cloned()
    };
    assert!(
        eventually(|| late_lane(db).is_some_and(|l| l["paused"] == true)),
        "the late lane was not paused for its host: {:?}",
        late_lane(db)
    );
    let l = late_lane(db).unwrap();
    assert_eq!(
        (l["state"].as_str(), l["pause_reason"].as_str()),
        (Some("paused"), Some("host blocked by an operator")),
        "{l}"
    );
    assert_eq!(r.count_all(), 0, "a blocked host got a request");
    let hosts = db.json(&["hosts", "--json"]);
    let h = host(&hosts, &origin);
    assert_eq!(
        (h["state"].as_str(), h["pending"].as_u64()),
        (Some("blocked"), Some(6))
    );

    // Unblock resumes both lanes; none of them waits for anything when it returns.
    let out = db.json(&["hosts", "unblock", &origin, "--json"]);
    assert_eq!(out["changed"], 2, "{out}");
    let l = late_lane(db).unwrap();
    assert_eq!(
        (l["paused"].as_bool(), l["not_before"].as_str()),
        (Some(false), None),
        "{l}"
    );
    assert!(eventually(|| arrived(&r, "/inbox").len() == 5));
    let expected: Vec<String> = (0..5).map(|i| format!("b{i}")).collect();
    assert_eq!(arrived(&r, "/inbox"), expected);
    assert!(eventually(|| arrived(&r, "/late").len() == 1));
    relay.stop();
}

#[test]
fn hosts_block_with_dead_letters_sets_a_hosts_units_aside_now_and_later() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    db.enqueue_lines(
        ALICE,
        &[row("x0", &r.url("/inbox")), row("x1", &r.url("/inbox"))],
    );
    let origin = origin(&r);
    let out = db.json(&["hosts", "block", &origin, "--dead-letter", "--json"]);
    assert_eq!(out["changed"], 2, "{out}");
    db.enqueue_lines(ALICE, &[row("x2", &r.url("/inbox"))]);
    let out = collect(db.command(&["drain"]).spawn().unwrap(), "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert_eq!(r.count_all(), 0);
    let mut reasons: Vec<(String, String)> = db
        .dead_letters()
        .iter()
        .map(|d| {
            (
                d["row_id"].as_str().unwrap().to_owned(),
                d["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            ("x0".to_owned(), "blocked".to_owned()),
            ("x1".to_owned(), "blocked".to_owned()),
            ("x2".to_owned(), "blocked".to_owned())
        ]
    );
}

/// A host that verifies draft-cavage signatures (with a verifier we did not write) and refuses
/// anything else with 401, as a server that does not know RFC 9421 does.
fn cavage_only() -> Recipient {
    let r = Recipient::start().unwrap();
    r.set_server_default(Reply::Choose(Chooser::new(|q: &Recorded| {
        if verifies_cavage(q) {
            Reply::Status(202)
        } else {
            Reply::Response(Response::new(401).with_body("signature not understood"))
        }
    })));
    r
}

/// A host that takes RFC 9421 signatures only, verified with a verifier we did not write (a
/// draft-cavage one is refused with 401).
fn rfc9421_only() -> Recipient {
    let r = Recipient::start().unwrap();
    r.set_server_default(Reply::Choose(Chooser::new(|q: &Recorded| {
        if verifies_rfc9421(q) {
            Reply::Status(202)
        } else {
            Reply::Status(401)
        }
    })));
    r
}

#[test]
fn the_double_knock_learns_each_hosts_scheme_once_and_remembers_it_across_a_restart() {
    let db = Db::new();
    let keys = keys_file(&db.path("."));
    let keys = keys.to_str().unwrap();
    let cavage = cavage_only();
    let modern = rfc9421_only();
    // Two lanes on the cavage-only host, one on the RFC 9421 host.
    let mut lines = Vec::new();
    for i in 0..4 {
        lines.push(row(&format!("a{i}"), &cavage.url("/users/a/inbox")));
        lines.push(row(&format!("b{i}"), &cavage.url("/users/b/inbox")));
        lines.push(row(&format!("m{i}"), &modern.url("/inbox")));
    }
    db.enqueue_lines(ALICE, &lines);
    let out = collect(
        db.command(&["drain", "--signing-keys", keys])
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let all = cavage.all_requests();
    let rfc = all.iter().filter(|q| is_rfc9421(q)).count();
    assert_eq!(rfc, 1, "one refused RFC 9421 request for the cavage host");
    assert_eq!(all.len(), 8 + 1, "8 rows and the one refused knock");
    let a: Vec<String> = (0..4).map(|i| format!("a{i}")).collect();
    let b: Vec<String> = (0..4).map(|i| format!("b{i}")).collect();
    let m: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
    assert_eq!(arrived(&cavage, "/users/a/inbox"), a);
    assert_eq!(arrived(&cavage, "/users/b/inbox"), b);
    assert_eq!(arrived(&modern, "/inbox"), m);
    assert!(
        modern.all_requests().iter().all(is_rfc9421),
        "the RFC 9421 host got a draft-cavage request"
    );
    // Every attempt was counted once: nothing was dead-lettered and no unit took two.
    let hosts = db.json(&["hosts", "--json"]);
    let c_origin = origin(&cavage);
    let m_origin = origin(&modern);
    assert_eq!(host(&hosts, &c_origin)["signature_spec"], "cavage");
    assert_eq!(host(&hosts, &m_origin)["signature_spec"], "rfc9421");

    // A new process (another drain) goes straight to what was learned.
    let before = cavage.all_requests().len();
    db.enqueue_lines(
        ALICE,
        &[
            row("a4", &cavage.url("/users/a/inbox")),
            row("c0", &cavage.url("/users/c/inbox")),
        ],
    );
    let out = collect(
        db.command(&["drain", "--signing-keys", keys])
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let after = cavage.all_requests();
    assert_eq!(after.len(), before + 2, "one request per row, no knock");
    assert!(after[before..].iter().all(|q| !is_rfc9421(q)));
}

#[test]
fn a_host_failing_longer_than_host_unavailable_after_has_its_units_dead_lettered() {
    let db = Db::new();
    let dead = DeadHost::start();
    let to = format!("http://127.0.0.1:{}/inbox", dead.port);
    let lines: Vec<String> = (0..3).map(|i| row(&format!("u{i}"), &to)).collect();
    db.enqueue_lines(ALICE, &lines);
    let relay = Relay::start(
        &db,
        &[
            "--host-unavailable-after",
            "2s",
            "--host-backoff-base",
            "1s",
        ],
        &[],
    );
    let reasons = || -> Vec<String> {
        db.dead_letters()
            .iter()
            .map(|d| d["reason"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(eventually(|| reasons().len() == 3), "{:?}", reasons());
    assert!(
        reasons().iter().all(|r| r == "host_unavailable"),
        "{:?}",
        reasons()
    );
    let shown = db.json(&["dead-letters", "list", "--json"]);
    let first = &shown["dead_letters"][0];
    assert!(
        first["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("host_unavailable: ")),
        "{first}"
    );
    relay.stop();
    assert!(dead.accepted() <= 6, "{} connections", dead.accepted());
}

#[test]
fn an_action_on_an_origin_no_lane_has_warns_and_names_the_http_one_meant() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    db.enqueue(ALICE, &r.url("/inbox"));
    let port = r.addr().port();
    // Written without a scheme: https://, which no lane has; the http:// lane is named.
    let out = collect(
        db.command(&["hosts", "block", &format!("127.0.0.1:{port}")])
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("no lane or host of this outbox has this origin")
            && out
                .stderr
                .contains(&format!("did you mean http://127.0.0.1:{port}?")),
        "{}",
        out.stderr
    );
    // The origin a lane has: no warning.
    let out = collect(
        db.command(&["hosts", "unblock", &origin(&r)])
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert!(!out.stderr.contains("no lane or host"), "{}", out.stderr);
}
