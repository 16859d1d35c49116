//! `deploy/grafana-dashboard.json` (issue 39): valid JSON, a well-formed Grafana dashboard,
//! and every series its queries (and the alerting rules of the operator guide and the README)
//! name is one a running relay exports — read from the
//! relay's own `/metrics` after it delivered to real loopback recipients (one answering,
//! one failing, one refusing for good), not from a list kept beside the test.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::collections::{BTreeSet, HashSet};

use common::{Db, Relay, collect, free_port, get_until, row};
use outbox_lanes_test_support::{Recipient, Reply};
use serde_json::Value;

const DASHBOARD: &str = include_str!("../../deploy/grafana-dashboard.json");
const GUIDE: &str = include_str!("../../docs/operator-guide.md");
const README: &str = include_str!("../../README.md");

/// Every string under a key `key`, anywhere in `v`.
fn strings_under<'a>(v: &'a Value, key: &str, out: &mut Vec<&'a str>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match x {
                    Value::String(s) if k == key => out.push(s),
                    _ => strings_under(x, key, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| strings_under(x, key, out)),
        _ => {}
    }
}

/// The `outbox_lanes_*` names in a PromQL expression.
fn series_in(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("outbox_lanes_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

fn dashboard() -> Value {
    serde_json::from_str(DASHBOARD).unwrap_or_else(|e| panic!("not JSON: {e}"))
}

#[test]
fn the_dashboard_is_a_grafana_dashboard() {
    let d = dashboard();
    assert_eq!(d["title"], "outbox-lanes");
    assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(d["schemaVersion"].as_u64().is_some());
    let panels = d["panels"].as_array().unwrap();
    let mut ids = HashSet::new();
    let mut queries = 0;
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "id twice: {p}");
        assert!(p["title"].as_str().is_some_and(|t| !t.is_empty()), "{p}");
        for k in ["h", "w", "x", "y"] {
            assert!(p["gridPos"][k].as_u64().is_some(), "{k}: {p}");
        }
        if p["type"] == "row" {
            continue;
        }
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{p}");
        let mut refs = HashSet::new();
        for t in targets {
            assert!(refs.insert(t["refId"].as_str().unwrap()), "{p}");
            assert!(t["expr"].as_str().is_some_and(|e| !e.is_empty()), "{p}");
            queries += 1;
        }
    }
    assert!(queries >= 10, "{queries}");
    // What the issue asks to see.
    let mut exprs = Vec::new();
    strings_under(&d, "expr", &mut exprs);
    let all = exprs.join("\n");
    for wanted in [
        "outbox_lanes_delivered_total",
        "outbox_lanes_attempts_total",
        "outbox_lanes_dead_lettered_total",
        "outbox_lanes_oldest_pending_seconds",
        "outbox_lanes_lanes_held",
        "histogram_quantile(0.5, sum by (host, le) (rate(outbox_lanes_host_latency_seconds_bucket",
        "histogram_quantile(0.95, sum by (host, le) (rate(outbox_lanes_host_latency_seconds_bucket",
        "outbox_lanes_host_attempts_total{host=~\"$host\",outcome=\"delivered\"}",
        "outbox_lanes_host_in_flight",
    ] {
        assert!(all.contains(wanted), "{wanted} not in the dashboard");
    }
}

#[test]
fn every_series_the_dashboard_names_is_exported_by_the_relay() {
    let d = dashboard();
    let mut queries = Vec::new();
    strings_under(&d, "expr", &mut queries);
    strings_under(&d, "definition", &mut queries);
    // The alerting rules of the operator guide and the README too.
    for doc in [GUIDE, README] {
        queries.extend(
            doc.lines()
                .filter_map(|l| l.trim_start().strip_prefix("expr: ")),
        );
    }
    let named: BTreeSet<String> = queries.iter().flat_map(|q| series_in(q)).collect();
    for rule in [
        "outbox_lanes_lanes_held",
        "outbox_lanes_dead_lettered_total",
    ] {
        assert!(named.contains(rule), "{rule}: {named:?}");
    }
    assert!(named.len() >= 10, "{named:?}");

    // A relay that delivered, failed and dead-lettered, so that every family has samples.
    let db = Db::new();
    let r = Recipient::start().unwrap();
    r.set_default("/fail", Reply::Status(500));
    r.set_default("/refuse", Reply::Status(422));
    let lines = [
        row("ok", &r.url("/ok")),
        row("fail", &r.url("/fail")),
        row("refuse", &r.url("/refuse")),
    ];
    let out = collect(
        db.command(&["enqueue", "--actor", "alice"])
            .spawn()
            .unwrap(),
        &(lines.join("\n") + "\n"),
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let port = free_port();
    let relay = Relay::start(
        &db,
        &[
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "--pass-attempts",
            "1",
            "--backoff-base",
            "1h",
        ],
        &[],
    );
    let (code, text) = get_until(port, "/metrics", |c, t| {
        c == 200
            && t.contains("outbox_lanes_dead_lettered_total{reason=\"permanent\"} 1")
            && t.contains("outbox_lanes_lanes_held{actor=\"alice\",reason=\"backoff\"} 1")
            && t.contains("outbox_lanes_host_latency_seconds_bucket{")
    });
    let _ = relay.stop();
    assert_eq!(code, 200, "{text}");
    let exported: BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    for name in &named {
        assert!(
            exported.contains(name.as_str()),
            "the dashboard names {name}, which the relay does not export:\n{text}"
        );
    }
}
