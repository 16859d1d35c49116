//! Per-host figures through the binary (issue 39, item 3), with DEFAULT delivery settings:
//! two loopback recipients on two hosts, one answering `200` after ~50 ms, one answering
//! `500`; after `drain`, `hosts --json` shows each host's attempts (as many as the recipient
//! saw), outcomes, success rate and latency percentiles over the last hour, and the `hosts`
//! table its SUCCESS and P95 columns. `--delivery-log-retention 0s` leaves them out.
//!
//! Each test runs on SQLite and, as its `_on_postgres` twin, on a Postgres schema of its own
//! (skipped when `OUTBOX_LANES_TEST_PG` is not set). Times are asserted as lower bounds only.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{ALICE, Db, collect, host, on_postgres, origin, row};
use outbox_lanes_test_support::{Recipient, Reply};
use serde_json::Value;

fn drain(db: &Db, extra: &[&str]) {
    let mut args = vec!["drain"];
    args.extend_from_slice(extra);
    let out = collect(db.command(&args).spawn().unwrap(), "");
    assert_eq!(out.code(), Some(0), "drain: {}", out.stderr);
}

/// A slow host (200 after 50 ms) and a failing one (500), three rows each, drained.
fn two_hosts(db: &Db, extra: &[&str]) -> (Recipient, Recipient) {
    let slow = Recipient::start().unwrap();
    slow.set_server_default(Reply::Status(200).after(Duration::from_millis(50)));
    let failing = Recipient::start().unwrap();
    failing.set_server_default(Reply::Status(500));
    let mut lines = Vec::new();
    for i in 0..3 {
        lines.push(row(&format!("s{i}"), &slow.url("/inbox")));
        lines.push(row(&format!("f{i}"), &failing.url("/inbox")));
    }
    db.enqueue_lines(ALICE, &lines);
    drain(db, extra);
    (slow, failing)
}

fn figures_per_host(db: &Db) {
    let (slow, failing) = two_hosts(db, &[]);
    let hosts = db.json(&["hosts", "--json"]);
    eprintln!("hosts --json: {hosts}");

    let f = &host(&hosts, &origin(&slow))["figures"];
    let seen = slow.all_requests().len() as u64;
    assert_eq!(seen, 3, "{f}");
    assert_eq!(f["attempts"], seen, "{f}");
    assert_eq!(f["outcomes"]["2xx"], seen, "{f}");
    assert_eq!(f["success_rate"], 1.0, "{f}");
    assert!(f["latency_ms"]["p50"].as_u64().unwrap() >= 40, "{f}");
    assert!(f["latency_ms"]["p95"].as_u64().unwrap() >= 40, "{f}");
    assert!(f["latency_ms"]["p99"].as_u64().unwrap() >= 40, "{f}");
    assert!(f["since"].is_string(), "{f}");

    let f = &host(&hosts, &origin(&failing))["figures"];
    let seen = failing.all_requests().len() as u64;
    assert!(seen >= 1, "{f}");
    assert_eq!(f["attempts"], seen, "{f}");
    assert_eq!(f["outcomes"]["5xx"], seen, "{f}");
    assert_eq!(f["outcomes"].as_object().unwrap().len(), 1, "{f}");
    assert_eq!(f["success_rate"], 0.0, "{f}");
    assert!(f["latency_ms"]["p50"].is_u64(), "{f}");

    // The table: SUCCESS and P95 per host.
    let out = collect(db.command(&["hosts"]).spawn().unwrap(), "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let header = out.stdout.lines().next().unwrap();
    assert!(
        header.contains("SUCCESS") && header.contains("P95"),
        "{}",
        out.stdout
    );
    let line_of = |r: &Recipient| {
        out.stdout
            .lines()
            .find(|l| l.starts_with(&origin(r)))
            .unwrap_or_else(|| panic!("{}", out.stdout))
            .to_owned()
    };
    let s = line_of(&slow);
    assert!(s.contains(" 100% "), "{s}");
    assert!(s.trim_end().ends_with("ms"), "{s}");
    let l = line_of(&failing);
    assert!(l.contains(" 0% "), "{l}");
}

#[test]
fn hosts_show_success_rate_outcomes_and_latency_per_host() {
    figures_per_host(&Db::new());
}

#[test]
fn hosts_show_success_rate_outcomes_and_latency_per_host_on_postgres() {
    on_postgres("hf_figures", figures_per_host);
}

fn no_figures_without_the_log(db: &Db) {
    let off = ["--delivery-log-retention", "0s"];
    let (slow, _failing) = two_hosts(db, &off);
    assert_eq!(slow.all_requests().len(), 3);
    let mut args = vec!["hosts", "--json"];
    args.extend_from_slice(&off);
    let hosts = db.json(&args);
    let h: &Value = host(&hosts, &origin(&slow));
    assert!(h["figures"].is_null(), "{h}");
    let mut args = vec!["hosts"];
    args.extend_from_slice(&off);
    let out = collect(db.command(&args).spawn().unwrap(), "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with(&origin(&slow)))
        .unwrap_or_else(|| panic!("{}", out.stdout));
    assert!(
        line.trim_end().ends_with("-  -") || line.trim_end().ends_with('-'),
        "{line}"
    );
    assert!(!line.contains('%'), "{line}");
}

#[test]
fn hosts_show_no_figures_with_the_log_off() {
    no_figures_without_the_log(&Db::new());
}

#[test]
fn hosts_show_no_figures_with_the_log_off_on_postgres() {
    on_postgres("hf_off", no_figures_without_the_log);
}
