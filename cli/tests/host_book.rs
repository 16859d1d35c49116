//! The host book through the binary, with its DEFAULT delivery settings (issue 38, items 5, 6
//! and 9): the signature double-knock re-learns a host that changed its scheme and knocks no
//! more than it must (OL-22), and a host that hangs takes a bounded share of the in-flight
//! budget, so another host's rows go at once (OL-21).
//!
//! Each test runs on SQLite and, as its `_on_postgres` twin, on a Postgres schema of its own
//! (skipped when `OUTBOX_LANES_TEST_PG` is not set): the learned scheme goes through
//! `ol_hosts` on either store. Every server is on 127.0.0.1 and stops with its test; every
//! wait is bounded. The hanging recipient really hangs until the relay's default 30 s
//! timeout, so that test (and its twin) takes about 31 s.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{
    ALICE, Db, Relay, collect, host, is_2xx, is_rfc9421, keys_file, n_of, on_postgres, origin, row,
    verifies_cavage, verifies_rfc9421,
};
use outbox_lanes_test_support::{Chooser, Completion, Recipient, Recorded, Reply, Response};
use serde_json::Value;

/// `drain` with alice's key and the default `--signature-spec` (auto).
fn drain(db: &Db, keys: &Path) {
    let keys = keys.to_str().unwrap();
    let out = collect(
        db.command(&["drain", "--signing-keys", keys])
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(out.code(), Some(0), "drain: {}", out.stderr);
}

/// The `hosts --json` entry of `r`'s origin.
fn host_of(db: &Db, r: &Recipient) -> Value {
    host(&db.json(&["hosts", "--json"]), &origin(r)).clone()
}

/// Every dead letter as (row id, reason, last status, attempts).
fn dead_letters(db: &Db) -> Vec<(String, String, Option<u64>, u64)> {
    let mut out: Vec<_> = db
        .dead_letters()
        .iter()
        .map(|d| {
            (
                d["row_id"].as_str().unwrap().to_owned(),
                d["reason"].as_str().unwrap().to_owned(),
                d["last_status"].as_u64(),
                d["attempts"].as_u64().unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// The body's `n` of each request answered 2xx, anywhere, in arrival order.
fn arrived(r: &Recipient) -> Vec<String> {
    r.all_requests()
        .iter()
        .filter(|q| is_2xx(q))
        .map(n_of)
        .collect()
}

/// `rfc9421` or `cavage`: the scheme a request was signed with.
fn scheme(q: &Recorded) -> &'static str {
    if is_rfc9421(q) { "rfc9421" } else { "cavage" }
}

/// Each request as (body `n`, scheme, status), in arrival order.
fn transcript(qs: &[Recorded]) -> Vec<(String, &'static str, Option<u16>)> {
    qs.iter()
        .map(|q| (n_of(q), scheme(q), q.completion.status()))
        .collect()
}

/// A host that takes draft-cavage only (verified with a verifier we did not write) until
/// `modern` is set, then RFC 9421 only; anything else gets 401.
fn switching_host(modern: Arc<AtomicBool>) -> Recipient {
    let r = Recipient::start().unwrap();
    r.set_server_default(Reply::Choose(Chooser::new(move |q: &Recorded| {
        let ok = if modern.load(Ordering::SeqCst) {
            verifies_rfc9421(q)
        } else {
            verifies_cavage(q)
        };
        if ok {
            Reply::Status(202)
        } else {
            Reply::Response(Response::new(401).with_body("signature not understood"))
        }
    })));
    r
}

/// Item 5: a host learned as draft-cavage that moves to RFC 9421 only is re-learned within
/// one attempt (cavage 401, then RFC 9421 202), not dead-lettered `permanent`.
fn relearned_within_one_attempt(db: &Db) {
    let keys = keys_file(&db.path("."));
    let modern = Arc::new(AtomicBool::new(false));
    let r = switching_host(Arc::clone(&modern));
    db.enqueue_lines(ALICE, &[row("c0", &r.url("/inbox"))]);
    drain(db, &keys);
    assert_eq!(
        transcript(&r.all_requests()),
        [
            ("c0".to_owned(), "rfc9421", Some(401)),
            ("c0".to_owned(), "cavage", Some(202))
        ],
        "the first contact knocks and learns draft-cavage"
    );
    assert_eq!(host_of(db, &r)["signature_spec"], "cavage");

    // The host now takes RFC 9421 only.
    modern.store(true, Ordering::SeqCst);
    let before = r.all_requests().len();
    db.enqueue_lines(
        ALICE,
        &[row("c1", &r.url("/inbox")), row("c2", &r.url("/inbox"))],
    );
    drain(db, &keys);
    let dead = dead_letters(db);
    assert!(
        dead.is_empty(),
        "units dead-lettered after the host moved to RFC 9421: {dead:?}"
    );
    assert_eq!(arrived(&r), ["c0", "c1", "c2"]);
    assert_eq!(
        transcript(&r.all_requests()[before..]),
        [
            ("c1".to_owned(), "cavage", Some(401)),
            ("c1".to_owned(), "rfc9421", Some(202)),
            ("c2".to_owned(), "rfc9421", Some(202))
        ],
        "c1: the learned scheme refused, the other one at once (one attempt); c2: RFC 9421"
    );
    let h = host_of(db, &r);
    assert_eq!(h["signature_spec"], "rfc9421", "{h}");
}

#[test]
fn a_cavage_host_that_moves_to_rfc9421_is_relearned_within_one_attempt() {
    relearned_within_one_attempt(&Db::new());
}

#[test]
fn a_cavage_host_that_moves_to_rfc9421_is_relearned_within_one_attempt_on_postgres() {
    on_postgres("hb_relearn", relearned_within_one_attempt);
}

/// Item 5: `hosts retry` forgets the learned scheme; the next unit knocks again.
fn retry_forgets_the_scheme(db: &Db) {
    let keys = keys_file(&db.path("."));
    let r = switching_host(Arc::new(AtomicBool::new(false)));
    db.enqueue_lines(ALICE, &[row("c0", &r.url("/inbox"))]);
    drain(db, &keys);
    assert_eq!(host_of(db, &r)["signature_spec"], "cavage");

    let out = db.json(&["hosts", "retry", &origin(&r), "--json"]);
    eprintln!("hosts retry: {out}");
    let h = host_of(db, &r);
    assert!(
        h["signature_spec"].is_null() && h["signature_spec_learned"].is_null(),
        "hosts retry kept the learned scheme: {h}"
    );

    // The binary forgot it too: the next unit starts with RFC 9421 again.
    let before = r.all_requests().len();
    db.enqueue_lines(ALICE, &[row("c1", &r.url("/inbox"))]);
    drain(db, &keys);
    assert_eq!(
        transcript(&r.all_requests()[before..]),
        [
            ("c1".to_owned(), "rfc9421", Some(401)),
            ("c1".to_owned(), "cavage", Some(202))
        ]
    );
    assert_eq!(host_of(db, &r)["signature_spec"], "cavage");
}

#[test]
fn hosts_retry_forgets_a_hosts_learned_scheme() {
    retry_forgets_the_scheme(&Db::new());
}

#[test]
fn hosts_retry_forgets_a_hosts_learned_scheme_on_postgres() {
    on_postgres("hb_retry", retry_forgets_the_scheme);
}

/// Item 6a: a host known for RFC 9421 that answers 400 refuses the payload, not the
/// signature: the payload goes once, and is dead-lettered `permanent`.
fn a_400_goes_once(db: &Db) {
    let keys = keys_file(&db.path("."));
    let r = Recipient::start().unwrap();
    r.set_server_default(Reply::Choose(Chooser::new(|q: &Recorded| {
        if !verifies_rfc9421(q) {
            Reply::Status(401)
        } else if n_of(q) == "bad" {
            Reply::Response(Response::new(400).with_body("no such object"))
        } else {
            Reply::Status(202)
        }
    })));
    db.enqueue_lines(ALICE, &[row("ok0", &r.url("/inbox"))]);
    drain(db, &keys);
    assert_eq!(
        transcript(&r.all_requests()),
        [("ok0".to_owned(), "rfc9421", Some(202))]
    );
    assert_eq!(host_of(db, &r)["signature_spec"], "rfc9421");

    let before = r.all_requests().len();
    db.enqueue_lines(ALICE, &[row("bad", &r.url("/inbox"))]);
    drain(db, &keys);
    assert_eq!(
        transcript(&r.all_requests()[before..]),
        [("bad".to_owned(), "rfc9421", Some(400))],
        "a 400 from a host known for RFC 9421 was knocked again"
    );
    assert_eq!(
        dead_letters(db),
        [("bad".to_owned(), "permanent".to_owned(), Some(400), 1)]
    );
    assert_eq!(host_of(db, &r)["signature_spec"], "rfc9421");
}

#[test]
fn a_host_known_for_rfc9421_answering_400_gets_the_payload_once() {
    a_400_goes_once(&Db::new());
}

#[test]
fn a_host_known_for_rfc9421_answering_400_gets_the_payload_once_on_postgres() {
    on_postgres("hb_400", a_400_goes_once);
}

/// Item 6b: a host refusing every signature with 401: the first unit costs two requests (both
/// schemes), every later one a single request.
fn refusing_everything(db: &Db) {
    let keys = keys_file(&db.path("."));
    let r = Recipient::start().unwrap();
    r.set_server_default(Reply::Status(401));
    // Two lanes of three units each.
    let mut lines = Vec::new();
    for i in 0..3 {
        lines.push(row(&format!("a{i}"), &r.url("/users/a/inbox")));
        lines.push(row(&format!("b{i}"), &r.url("/users/b/inbox")));
    }
    db.enqueue_lines(ALICE, &lines);
    drain(db, &keys);

    let all = r.all_requests();
    let mut per_unit: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
    for q in &all {
        let key = q.header("idempotency-key").unwrap().to_owned();
        per_unit.entry(key).or_default().push(scheme(q));
    }
    eprintln!(
        "a host answering 401 to everything: {} requests for {} units: {:?}",
        all.len(),
        per_unit.len(),
        transcript(&all)
    );
    assert_eq!(per_unit.len(), 6, "{per_unit:?}");
    let first = all[0].header("idempotency-key").unwrap();
    for (key, schemes) in &per_unit {
        if key == first {
            assert_eq!(schemes, &["rfc9421", "cavage"], "the first unit: {key}");
        } else {
            assert_eq!(
                schemes,
                &["rfc9421"],
                "unit {key} knocked again after both schemes were refused"
            );
        }
    }
    assert_eq!(all.len(), 6 + 1);
    let dead = dead_letters(db);
    assert_eq!(dead.len(), 6, "{dead:?}");
    assert!(
        dead.iter()
            .all(|(_, reason, status, attempts)| reason == "permanent"
                && *status == Some(401)
                && *attempts == 1),
        "{dead:?}"
    );
    assert!(host_of(db, &r)["signature_spec"].is_null());
}

#[test]
fn a_host_refusing_everything_costs_one_request_per_unit_after_the_first() {
    refusing_everything(&Db::new());
}

#[test]
fn a_host_refusing_everything_costs_one_request_per_unit_after_the_first_on_postgres() {
    on_postgres("hb_refuse", refusing_everything);
}

/// Item 6c: a 401 carrying an `Accept-Signature` the signer cannot honour (garbage) is not
/// answered by sending the identical request again: RFC 9421, then draft-cavage.
fn garbage_accept_signature(db: &Db) {
    let keys = keys_file(&db.path("."));
    let r = Recipient::start().unwrap();
    r.set_server_default(Reply::Choose(Chooser::new(|q: &Recorded| {
        if verifies_cavage(q) {
            Reply::Status(202)
        } else {
            Reply::Response(
                Response::new(401).with_header("Accept-Signature", "{garbage, not a dictionary"),
            )
        }
    })));
    db.enqueue_lines(ALICE, &[row("g0", &r.url("/inbox"))]);
    drain(db, &keys);
    let all = r.all_requests();
    for pair in all.windows(2) {
        assert_ne!(
            pair[0].header("signature"),
            pair[1].header("signature"),
            "the identical request was sent twice in a row: {:?}",
            transcript(&all)
        );
    }
    assert_eq!(
        transcript(&all),
        [
            ("g0".to_owned(), "rfc9421", Some(401)),
            ("g0".to_owned(), "cavage", Some(202))
        ]
    );
    assert!(dead_letters(db).is_empty());
    assert_eq!(host_of(db, &r)["signature_spec"], "cavage");
}

#[test]
fn a_garbage_accept_signature_is_ignored_and_no_request_is_sent_twice() {
    garbage_accept_signature(&Db::new());
}

#[test]
fn a_garbage_accept_signature_is_ignored_and_no_request_is_sent_twice_on_postgres() {
    on_postgres("hb_garbage", garbage_accept_signature);
}

/// The earliest time a request of `qs` ended without an answer (the client gave up).
fn first_close(qs: &[Recorded]) -> Option<Instant> {
    qs.iter()
        .filter_map(|q| match q.completion {
            Completion::Unanswered { at, .. } => Some(at),
            _ => None,
        })
        .min()
}

/// Item 9: a host that answers three requests and then hangs holds a bounded share of the
/// in-flight budget (its window), not the process's 256: another actor's rows to another host
/// all arrive while the hanging attempts are still unanswered.
fn hanging_host(db: &Db) {
    const A: &str = "https://example.com/users/a";
    const B: &str = "https://example.com/users/b";
    let hanging = Recipient::start().unwrap();
    hanging.script("/inbox", [200, 200, 200].map(Reply::Status));
    hanging.set_default("/inbox", Reply::Hang);
    let healthy = Recipient::start().unwrap();
    // 400 lanes of A to the hanging endpoint: one row each, each its own ordering key.
    let lines: Vec<String> = (0..400)
        .map(|i| {
            serde_json::json!({
                "id": format!("a{i}"),
                "to": [hanging.url("/inbox")],
                "ordering_key": format!("k{i}"),
                "body": { "n": format!("a{i}") },
            })
            .to_string()
        })
        .collect();
    db.enqueue_lines(A, &lines);

    let started = Instant::now();
    let relay = Relay::start(db, &[], &[]);
    assert!(
        hanging.wait_for("/inbox", 4, Duration::from_secs(30)),
        "the hanging endpoint got {} requests",
        hanging.count_all()
    );
    let hang_began = hanging.all_requests()[3].arrived_at;
    // Let A take what it can, then B's rows come.
    std::thread::sleep(
        (started + Duration::from_secs(6)).saturating_duration_since(Instant::now()),
    );
    let b_lines: Vec<String> = (0..10)
        .map(|i| row(&format!("b{i}"), &healthy.url("/inbox")))
        .collect();
    // From the start of the `enqueue` command: the relay may deliver before it has exited.
    let enqueued = Instant::now();
    db.enqueue_lines(B, &b_lines);
    let b_done = healthy.wait_until(Duration::from_secs(60), |log| {
        log.iter()
            .filter(|q| q.completion.status() == Some(200))
            .count()
            >= 10
    });
    let a_then = hanging.all_requests();
    let a_closed_then = a_then
        .iter()
        .filter(|q| matches!(q.completion, Completion::Unanswered { .. }))
        .count();
    assert!(
        b_done,
        "B's rows did not all arrive within 60 s of their enqueue: {:?}",
        arrived(&healthy)
    );
    let b_last = healthy
        .all_requests()
        .iter()
        .map(|q| q.arrived_at)
        .max()
        .unwrap();
    eprintln!(
        "B: enqueue (its command's start) to last arrival {:?}; A's endpoint had {} requests \
         then ({} hanging, {} already closed by the relay)",
        b_last.saturating_duration_since(enqueued),
        a_then.len(),
        a_then.iter().filter(|q| q.completion.is_pending()).count(),
        a_closed_then
    );
    let expected: Vec<String> = (0..10).map(|i| format!("b{i}")).collect();
    assert_eq!(arrived(&healthy), expected);

    // Now wait for the first of A's hanging attempts to end (the relay's 30 s timeout) and
    // compare: B was complete before it.
    assert!(
        hanging.wait_until(Duration::from_secs(45), |log| first_close(log).is_some()),
        "no hanging attempt of A ended within 45 s"
    );
    let a_all = hanging.all_requests();
    let closed = first_close(&a_all).unwrap();
    eprintln!(
        "A: the first hanging attempt ended {:?} after the hang began; A's endpoint received \
         {} requests by then",
        closed.saturating_duration_since(hang_began),
        a_all.len()
    );
    assert!(
        b_last < closed,
        "B's last row arrived {:?} after A's first hanging attempt timed out: B waited for \
         A's attempts ({} requests to A's endpoint when B completed)",
        b_last.saturating_duration_since(closed),
        a_then.len()
    );
    assert_eq!(
        a_closed_then, 0,
        "some of A's attempts were already closed when B completed"
    );
    drop(relay);
}

/// The same within ONE actor: its 400 lanes to a host that has never answered (it hangs from
/// the first request) and, 2 s later, its 10 lanes to a healthy host. The hanging host's
/// first contact (`--host-first-contact`) goes, and its other lanes' attempts wait at its
/// gate without taking a place of the pass's in-flight bound (256): the healthy host's rows
/// all arrive before the first hanging attempt times out. Before, those waiting attempts
/// held the pass's places until the host's timeouts backed it off, and the healthy rows
/// waited the whole 30 s. SQLite only: the gate and the pass decide it, not the store.
#[test]
fn a_hanging_host_does_not_hold_its_own_actors_places_for_other_hosts() {
    let db = Db::new();
    let hanging = Recipient::start().unwrap();
    hanging.set_default("/inbox", Reply::Hang);
    let healthy = Recipient::start().unwrap();
    let lines: Vec<String> = (0..400)
        .map(|i| {
            serde_json::json!({
                "id": format!("h{i}"),
                "to": [hanging.url("/inbox")],
                "ordering_key": format!("k{i}"),
                "body": { "n": format!("h{i}") },
            })
            .to_string()
        })
        .collect();
    db.enqueue_lines(ALICE, &lines);
    let relay = Relay::start(&db, &[], &[]);
    assert!(
        hanging.wait_for("/inbox", 1, Duration::from_secs(30)),
        "the hanging endpoint got no request"
    );
    let hang_began = hanging.all_requests()[0].arrived_at;
    std::thread::sleep(Duration::from_secs(2));
    let lines: Vec<String> = (0..10)
        .map(|i| {
            serde_json::json!({
                "id": format!("g{i}"),
                "to": [healthy.url(&format!("/inbox/{i}"))],
                "body": { "n": format!("g{i}") },
            })
            .to_string()
        })
        .collect();
    db.enqueue_lines(ALICE, &lines);
    let done = healthy.wait_until(Duration::from_secs(60), |log| {
        log.iter()
            .filter(|q| q.completion.status() == Some(200))
            .count()
            >= 10
    });
    assert!(
        done,
        "the healthy host's rows did not all arrive within 60 s"
    );
    let last = healthy
        .all_requests()
        .iter()
        .map(|q| q.arrived_at)
        .max()
        .unwrap();
    let waiting_then = hanging.count_all();
    assert!(
        hanging.wait_until(Duration::from_secs(45), |log| first_close(log).is_some()),
        "no hanging attempt ended within 45 s"
    );
    let closed = first_close(&hanging.all_requests()).unwrap();
    eprintln!(
        "the healthy host's last row arrived {:?} after the hang began; the first hanging \
         attempt ended {:?} after it; {waiting_then} requests to the hanging host by then",
        last.saturating_duration_since(hang_began),
        closed.saturating_duration_since(hang_began),
    );
    assert!(
        last < closed,
        "the healthy host's last row arrived {:?} after the first hanging attempt timed out: \
         the hanging host's waiting attempts held the pass's places",
        last.saturating_duration_since(closed)
    );
    assert!(
        waiting_then <= 10,
        "the hanging host got {waiting_then} attempts at once, more than its first contact"
    );
    drop(relay);
}

/// The same under `--per-host-concurrency 2`: one actor's 300 lanes to a host that answers
/// after 5 s, and 1 s later its 10 lanes to another host. The slow host's attempts past its
/// cap are parked without taking a place of the pass's in-flight bound (256), so the other
/// host's rows all arrive while the slow host has answered only its first few. Before, the
/// parked attempts held the pass's places and the other rows waited for the slow host's
/// 300 rows (150 rounds of 5 s).
#[test]
fn attempts_parked_under_a_per_host_cap_do_not_hold_the_actors_places() {
    let db = Db::new();
    let slow = Recipient::start().unwrap();
    slow.set_default(
        "/inbox",
        Reply::Delay(Duration::from_secs(5), Box::new(Reply::Status(200))),
    );
    let other = Recipient::start().unwrap();
    let lines: Vec<String> = (0..300)
        .map(|i| {
            serde_json::json!({
                "id": format!("s{i}"),
                "to": [slow.url("/inbox")],
                "ordering_key": format!("k{i}"),
                "body": { "n": format!("s{i}") },
            })
            .to_string()
        })
        .collect();
    db.enqueue_lines(ALICE, &lines);
    let relay = Relay::start(&db, &["--per-host-concurrency", "2"], &[]);
    assert!(
        slow.wait_for("/inbox", 1, Duration::from_secs(30)),
        "the slow endpoint got no request"
    );
    std::thread::sleep(Duration::from_secs(1));
    let lines: Vec<String> = (0..10)
        .map(|i| row(&format!("o{i}"), &other.url(&format!("/inbox/{i}"))))
        .collect();
    db.enqueue_lines(ALICE, &lines);
    let done = other.wait_until(Duration::from_secs(60), |log| {
        log.iter()
            .filter(|q| q.completion.status() == Some(200))
            .count()
            >= 10
    });
    let slow_then = slow.all_requests();
    let answered = slow_then
        .iter()
        .filter(|q| q.completion.status() == Some(200))
        .count();
    assert!(
        done,
        "the other host's rows did not all arrive within 60 s; the slow host answered {answered}"
    );
    assert!(
        slow_then.len() <= 10,
        "the other host's rows waited for the slow host's: it had {} requests ({answered} \
         answered) when they were complete",
        slow_then.len()
    );
    drop(relay);
}

#[test]
fn a_hanging_host_takes_a_bounded_share_and_another_hosts_rows_go_meanwhile() {
    hanging_host(&Db::new());
}

#[test]
fn a_hanging_host_takes_a_bounded_share_and_another_hosts_rows_go_meanwhile_on_postgres() {
    on_postgres("hb_hanging", hanging_host);
}
