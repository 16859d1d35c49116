//! Throttling through the binary, with default settings, against real recipients on
//! 127.0.0.1 (issue 38, items 8 and 10):
//! - a `Retry-After` no longer than the ladder's delay for the failure is waited in the pass,
//!   whatever the jitter draws: a drain delivers everything, every time (OL-6);
//! - a recipient that throttles for ever is dead-lettered after a bounded number of requests,
//!   however long its `Retry-After` and however the drains are sliced (OL-5, OL-7).
//!
//! Each test runs on SQLite and, as its `_on_postgres` twin, on Postgres schemas of its own
//! (skipped when `OUTBOX_LANES_TEST_PG` is not set). Assertions are about requests and
//! counts, never durations; every wait is bounded.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use common::{Db, Out, collect, on_postgres};
use outbox_lanes_test_support::{Recipient, Reply, Response};
use serde_json::Value;

fn ok(db: &Db, args: &[&str], stdin: &str) -> Out {
    let out = collect(db.command(args).spawn().unwrap(), stdin);
    assert_eq!(
        out.code(),
        Some(0),
        "{args:?} failed\nstdout: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
    out
}

fn json(out: &Out) -> Value {
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", out.stdout))
}

fn rows(n: u64, to: &str) -> String {
    (0..n)
        .map(|i| {
            serde_json::json!({ "id": format!("row-{i}"), "to": [to], "body": { "n": i } })
                .to_string()
                + "\n"
        })
        .collect()
}

/// The `n` of each body the path answered with a 2xx, in arrival order.
fn served(r: &Recipient, path: &str) -> Vec<u64> {
    r.requests(path)
        .iter()
        .filter(|q| q.completion.status().is_some_and(|s| s < 300))
        .map(|q| {
            let v: Value = serde_json::from_slice(&q.body).unwrap();
            v["n"].as_u64().unwrap()
        })
        .collect()
}

fn throttle(seconds: &str, status: u16) -> Reply {
    Reply::Response(Response::new(status).with_header("Retry-After", seconds))
}

/// The `lanes --json` entry of `recipient`.
fn lane(db: &Db, actor: &str, recipient: &str) -> Value {
    let lanes = json(&ok(db, &["lanes", "--actor", actor, "--json"], ""));
    lanes["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["recipient"] == recipient)
        .cloned()
        .unwrap_or_else(|| panic!("no lane to {recipient}: {lanes}"))
}

/// The eight fresh databases: three rows each to a recipient that answers the first
/// request `503` with `Retry-After: 1`, then `200`. One second is the ladder's first delay,
/// so the drain waits it and delivers the three rows every time — never a coin flip between
/// that and ending with the lane throttled.
fn a_retry_after_is_waited(dbs: &[&Db; 8]) {
    let r = Recipient::start().unwrap();
    let results: Vec<(u64, usize)> = std::thread::scope(|s| {
        let drains: Vec<_> = dbs
            .iter()
            .enumerate()
            .map(|(i, &db)| {
                let path = format!("/inbox-{i}");
                r.script(&path, [throttle("1", 503)]);
                let to = r.url(&path);
                s.spawn(move || {
                    ok(db, &["enqueue", "--actor", "jo"], &rows(3, &to));
                    // Default settings: a fresh jitter seed per pass.
                    let out = ok(db, &["--log-format", "json", "drain"], "");
                    let summary = out
                        .stderr
                        .lines()
                        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                        .find(|v| v["fields"]["message"] == "drain summary")
                        .unwrap_or_else(|| panic!("no drain summary: {}", out.stderr));
                    let f = &summary["fields"];
                    let remaining = f["remaining"].as_u64().unwrap();
                    (f["delivered"].as_u64().unwrap(), remaining as usize)
                })
            })
            .collect();
        drains.into_iter().map(|d| d.join().unwrap()).collect()
    });
    assert_eq!(results, [(3, 0); 8], "(delivered, remaining) of each drain");
    for i in 0..8 {
        let path = format!("/inbox-{i}");
        assert_eq!(r.count(&path), 4, "{path}: the 503, its retry, two more");
        assert_eq!(served(&r, &path), [0, 1, 2], "{path}");
    }
}

#[test]
fn a_drain_waits_a_retry_after_within_the_ladder_step_and_delivers_every_time() {
    let dbs: [Db; 8] = std::array::from_fn(|_| Db::new());
    a_retry_after_is_waited(&dbs.each_ref());
}

/// Eight fresh Postgres schemas: `thr_wait0` (made by `on_postgres`, which skips the test
/// when `OUTBOX_LANES_TEST_PG` is not set) to `thr_wait7`.
#[test]
fn a_drain_waits_a_retry_after_within_the_ladder_step_and_delivers_every_time_on_postgres() {
    on_postgres("thr_wait0", |first| {
        let rest: [Db; 7] = std::array::from_fn(|i| {
            Db::postgres(&format!("thr_wait{}", i + 1)).expect("OUTBOX_LANES_TEST_PG is set")
        });
        let dbs: [&Db; 8] = std::array::from_fn(|i| if i == 0 { first } else { &rest[i - 1] });
        a_retry_after_is_waited(&dbs);
    });
}

/// The lane's time passes: its `not_before` moved into the past, in the SQLite file or in the
/// Postgres schema.
fn time_passes(db: &Db) {
    const MOVE: &str = "SET not_before = 1 WHERE not_before IS NOT NULL";
    match db.pg() {
        Some((url, schema)) => {
            postgres::Client::connect(url, postgres::NoTls)
                .unwrap()
                .execute(&format!("UPDATE {schema}.ol_lanes {MOVE}"), &[])
                .unwrap();
        }
        None => {
            rusqlite::Connection::open(db.file())
                .unwrap()
                .execute(&format!("UPDATE ol_lanes {MOVE}"), [])
                .unwrap();
        }
    }
}

/// A recipient that answers `429` with `Retry-After: 2` for ever. Each drain ends on the
/// throttle; between drains the lane's time is made to pass (its `not_before` moved into
/// the past), as the next drain after the wait would find it. The first throttle leaves the
/// lane throttled (level 0); the second in a row stalls it (level 1); from there every
/// throttle counts, and the unit is dead-lettered `exhausted` after 2 + `max_attempts` (12)
/// requests. Before, every drain found the lane at level 0 and nothing ever counted.
fn throttling_for_ever(db: &Db) {
    let r = Recipient::start().unwrap();
    r.set_default("/busy", throttle("2", 429));
    let to = r.url("/busy");
    ok(db, &["enqueue", "--actor", "jo"], &rows(1, &to));

    ok(db, &["drain"], "");
    let l = lane(db, "jo", &to);
    assert_eq!(
        (&l["state"], &l["backoff_level"]),
        (&"throttled".into(), &0.into()),
        "the first throttle: {l}"
    );
    time_passes(db);
    ok(db, &["drain"], "");
    let l = lane(db, "jo", &to);
    assert_eq!(
        (&l["state"], &l["backoff_level"]),
        (&"backoff".into(), &1.into()),
        "the second throttle in a row stalls the lane: {l}"
    );
    assert_eq!(r.count("/busy"), 2);

    let mut drains = 2;
    let dead = loop {
        let dead = json(&ok(db, &["dead-letters", "list", "--json"], ""));
        if !dead["dead_letters"].as_array().unwrap().is_empty() {
            break dead;
        }
        drains += 1;
        assert!(
            drains <= 30,
            "not dead-lettered after {} requests",
            r.count("/busy")
        );
        time_passes(db);
        ok(db, &["drain"], "");
    };
    let d = &dead["dead_letters"][0];
    assert_eq!(
        (&d["reason"], &d["attempts"], &d["row_id"]),
        (&"exhausted".into(), &12.into(), &"row-0".into()),
        "{dead}"
    );
    assert_eq!(r.count("/busy"), 14, "two free throttles, twelve counted");
    assert_eq!(drains, 14, "one request per drain");
}

#[test]
fn a_recipient_that_throttles_for_ever_is_dead_lettered_after_a_bounded_number_of_requests() {
    throttling_for_ever(&Db::new());
}

#[test]
fn a_recipient_that_throttles_for_ever_is_dead_lettered_after_a_bounded_number_of_requests_on_postgres()
 {
    on_postgres("thr_forever", throttling_for_ever);
}
