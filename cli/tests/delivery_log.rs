//! The delivery log and in-flight marks through the binary (issue 39, items 1 and 2), with
//! real loopback recipients: one answering `500` with `<script>` and more than 1 KiB in its
//! body, one that hangs, one that answers `200`. `lanes` shows the hanging lane in flight
//! while it hangs; `rows show` tells each recipient's state with the attempt history (the
//! body excerpt kept verbatim as text, cut at 1 KiB); `dead-letters show` adds the history;
//! `--delivery-log-retention 0s` turns the log off.
//!
//! Each test runs on SQLite and, as its `_on_postgres` twin, on a Postgres schema of its own
//! (skipped when `OUTBOX_LANES_TEST_PG` is not set). Every wait is bounded.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{ALICE, Db, Relay, collect, on_postgres};
use outbox_lanes_test_support::{Recipient, Reply, Response};
use serde_json::Value;

/// Polls `done` every 200 ms for up to `bound`.
fn poll_for(bound: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + bound;
    while Instant::now() < end {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    done()
}

/// `rows show --json` of `id`, or `None` if it failed.
fn row_json(db: &Db, id: &str) -> Option<Value> {
    let out = collect(
        db.command(&["rows", "show", "--actor", ALICE, "--id", id, "--json"])
            .spawn()
            .unwrap(),
        "",
    );
    (out.code() == Some(0)).then(|| serde_json::from_str(&out.stdout).unwrap())
}

/// The recipient of `row` whose URL ends with `path`.
fn recipient<'a>(row: &'a Value, path: &str) -> &'a Value {
    row["recipients"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["recipient"].as_str().unwrap().ends_with(path))
        .unwrap_or_else(|| panic!("no recipient {path} in {row}"))
}

fn the_body() -> String {
    format!("<script>alert('x')</script>\n{}", "y".repeat(3000))
}

fn delivery_log_and_in_flight(db: &Db) {
    let r = Recipient::start().unwrap();
    r.set_default(
        "/fail",
        Reply::Response(Response::new(500).with_body(the_body())),
    );
    r.set_default("/hang", Reply::Hang);
    // In flight for 9 s, then delivered: its mark is cleared.
    r.set_default(
        "/slow",
        Reply::Delay(Duration::from_secs(9), Box::new(Reply::Status(200))),
    );
    r.set_default("/ok", Reply::Status(200));
    let line = serde_json::json!({
        "id": "r1",
        "to": [r.url("/fail"), r.url("/hang"), r.url("/ok"), r.url("/slow")],
        "body": { "n": 1 },
    })
    .to_string();
    db.enqueue_lines(ALICE, &[line]);

    let relay = Relay::start(
        db,
        &[
            "--timeout",
            "30s",
            "--shutdown-grace",
            "1s",
            "--max-attempts",
            "2",
            "--retry-delays",
            "100ms",
        ],
        &[],
    );

    // The hanging lane reads "in flight" while it hangs (marked after 5 s in flight).
    let lanes_json = || db.json(&["lanes", "--actor", ALICE, "--json"]);
    let hang_lane = |v: &Value| {
        v["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["recipient"].as_str().unwrap().ends_with("/hang"))
            .cloned()
    };
    let marked = poll_for(Duration::from_secs(15), || {
        hang_lane(&lanes_json()).is_some_and(|l| l["in_flight_since"].is_string())
    });
    if !marked {
        let (status, lines) = relay.stop();
        panic!(
            "the hanging lane was never shown in flight: {}\nrelay {status:?}:\n{}",
            lanes_json(),
            lines.join("\n")
        );
    }
    let l = hang_lane(&lanes_json()).unwrap();
    assert!(l["in_flight_ms"].as_u64().unwrap() >= 5_000, "{l}");
    let table = collect(
        db.command(&["lanes", "--actor", ALICE]).spawn().unwrap(),
        "",
    );
    assert!(
        table
            .stdout
            .lines()
            .any(|line| line.contains("/hang") && line.contains("in flight")),
        "{}",
        table.stdout
    );

    // `status` counts it.
    let status = db.json(&["status", "--json"]);
    let flying = status["lanes_in_flight"].as_array().unwrap();
    let hanging = flying
        .iter()
        .find(|l| l["recipient"].as_str().unwrap().ends_with("/hang"))
        .unwrap_or_else(|| panic!("{status}"));
    assert!(hanging["in_flight_ms"].as_u64().unwrap() >= 5_000);
    let text = collect(db.command(&["status"]).spawn().unwrap(), "");
    assert!(
        text.stdout
            .contains("lane(s) with an attempt in flight for longer than 5 s"),
        "{}",
        text.stdout
    );

    // `hosts --json` counts the loopback host's lanes in flight for long.
    let hosts = db.json(&["hosts", "--json"]);
    let here = format!("http://127.0.0.1:{}", r.addr().port());
    let host = hosts["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["origin"] == here.as_str())
        .unwrap_or_else(|| panic!("{hosts}"));
    assert!(host["in_flight_long"].as_u64().unwrap() >= 1, "{host}");

    // The row: the failing recipient dead-lettered after 2 attempts with their bodies, the
    // good one delivered after 1, the hanging one in flight.
    let done = poll_for(Duration::from_secs(15), || {
        row_json(db, "r1").is_some_and(|v| {
            recipient(&v, "/fail")["state"] == "dead letter"
                && recipient(&v, "/ok")["state"] == "delivered"
        })
    });
    assert!(done, "{:?}", row_json(db, "r1"));
    let v = row_json(db, "r1").unwrap();
    let ok = recipient(&v, "/ok");
    assert_eq!(ok["attempts"], 1, "{ok}");
    assert!(ok["delivered_at"].is_string(), "{ok}");
    assert_eq!(ok["attempt_history"][0]["status"], 200);
    assert_eq!(ok["attempt_history"][0]["delivered"], true);
    let fail = recipient(&v, "/fail");
    assert_eq!(fail["attempts"], 2, "{fail}");
    let history = fail["attempt_history"].as_array().unwrap();
    assert_eq!(history.len(), 2, "{fail}");
    for (i, a) in history.iter().enumerate() {
        assert_eq!(a["attempt"], i + 1);
        assert_eq!(a["status"], 500);
        assert_eq!(a["error_class"], "status 500");
        let body = a["body"].as_str().unwrap();
        assert!(body.starts_with("<script>alert('x')</script>\ny"), "{body}");
        assert_eq!(body.len(), 1024, "cut at 1 KiB");
        assert!(a["duration_ms"].is_u64() && a["started_at"].is_string());
    }
    let hang = recipient(&v, "/hang");
    assert_eq!(hang["state"], "in flight", "{hang}");
    assert!(hang["in_flight_ms"].as_u64().unwrap() >= 5_000);

    // The table keeps the body as text, on one line (its newline escaped).
    let text = collect(
        db.command(&["rows", "show", "--actor", ALICE, "--id", "r1"])
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(text.code(), Some(0), "{}", text.stderr);
    assert!(
        text.stdout
            .contains("body of attempt 1: <script>alert('x')</script>\\nyyy"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("dead letter"), "{}", text.stdout);
    assert!(text.stdout.contains("in flight"), "{}", text.stdout);
    assert!(text.stdout.contains("delivered at"), "{}", text.stdout);

    // `dead-letters show` has the attempt history.
    let dead = db.dead_letters();
    assert_eq!(dead.len(), 1, "{dead:?}");
    let id = dead[0]["id"].as_i64().unwrap().to_string();
    let shown = db.json(&["dead-letters", "show", "--id", &id, "--json"]);
    let h = shown["attempt_history"].as_array().unwrap();
    assert_eq!(h.len(), 2, "{shown}");
    assert_eq!(h[1]["error_class"], "status 500");
    let shown = collect(
        db.command(&["dead-letters", "show", "--id", &id])
            .spawn()
            .unwrap(),
        "",
    );
    assert!(
        shown.stdout.contains("attempt history (delivery log)")
            && shown.stdout.contains("body of attempt 2: <script>"),
        "{}",
        shown.stdout
    );

    // The slow recipient: marked while in flight, delivered after 9 s, its mark cleared.
    let delivered = poll_for(Duration::from_secs(20), || {
        row_json(db, "r1").is_some_and(|v| recipient(&v, "/slow")["state"] == "delivered")
    });
    assert!(delivered, "{:?}", row_json(db, "r1"));
    let v = row_json(db, "r1").unwrap();
    let slow = recipient(&v, "/slow");
    assert!(
        slow["attempt_history"][0]["duration_ms"].as_u64().unwrap() >= 9_000,
        "{slow}"
    );
    let cleared = poll_for(Duration::from_secs(5), || {
        lanes_json()["lanes"].as_array().unwrap().iter().any(|l| {
            l["recipient"].as_str().unwrap().ends_with("/slow") && l["in_flight_since"].is_null()
        })
    });
    assert!(cleared, "{}", lanes_json());
    let _ = relay.stop();
}

#[test]
fn rows_show_history_and_lanes_in_flight() {
    delivery_log_and_in_flight(&Db::new());
}

#[test]
fn rows_show_history_and_lanes_in_flight_on_postgres() {
    on_postgres("dlog_flight", delivery_log_and_in_flight);
}

fn retention_zero_turns_the_log_off(db: &Db) {
    let r = Recipient::start().unwrap();
    r.set_default("/ok", Reply::Status(204));
    let row =
        |id: &str| serde_json::json!({ "id": id, "to": [r.url("/ok")], "body": {} }).to_string();
    db.enqueue_lines(ALICE, &[row("off")]);
    let out = collect(
        db.command(&["drain", "--delivery-log-retention", "0s"])
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert_eq!(r.count("/ok"), 1);
    // Delivered, and nothing kept: the row is unknown.
    let missing = collect(
        db.command(&["rows", "show", "--actor", ALICE, "--id", "off"])
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(missing.code(), Some(2), "{}", missing.stdout);
    assert!(missing.stderr.contains("has no row"), "{}", missing.stderr);

    // The default keeps it: "delivered at T after 1 attempt".
    db.enqueue_lines(ALICE, &[row("on")]);
    let out = collect(db.command(&["drain"]).spawn().unwrap(), "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let v = row_json(db, "on").unwrap();
    let ok = recipient(&v, "/ok");
    assert_eq!(ok["state"], "delivered");
    assert_eq!(ok["attempts"], 1);
    assert_eq!(ok["attempt_history"][0]["status"], 204);
    assert!(ok["attempt_history"][0]["body"].is_null());
}

#[test]
fn delivery_log_retention_zero_turns_it_off() {
    retention_zero_turns_the_log_off(&Db::new());
}

#[test]
fn delivery_log_retention_zero_turns_it_off_on_postgres() {
    on_postgres("dlog_off", retention_zero_turns_the_log_off);
}
