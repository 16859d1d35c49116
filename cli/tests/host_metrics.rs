//! The relay's `/metrics` through the binary (issue 39): per-host series (attempts per
//! outcome, latency, in flight) from real loopback recipients — one answering, one failing,
//! one hanging — capped at 50 hosts with the rest as `host="other"`; held lanes counted per
//! reason; and a lane in backoff or paused no longer raising the lag
//! (`outbox_lanes_oldest_pending_seconds`), on SQLite and Postgres.
//!
//! Every server is on 127.0.0.1 and stops with its test; every wait is bounded, and no
//! assertion is on how long anything took.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;

use common::{Db, Relay, collect, free_port, get_until, on_postgres, origin, row};
use outbox_lanes_test_support::{Recipient, Reply};

/// The value of the sample `name` (with its labels, as written) in an exposition.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The `host` label values of `family`'s samples.
fn hosts_of(text: &str, family: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter_map(|l| Some(l.split("host=\"").nth(1)?.split('"').next()?.to_owned()))
        .collect()
}

/// The sum of `family`'s samples whose labels contain `with`.
fn sum_of(text: &str, family: &str, with: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(with))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

fn ok(db: &Db, args: &[&str], stdin: &str) {
    let out = collect(db.command(args).spawn().unwrap(), stdin);
    assert_eq!(out.code(), Some(0), "{args:?}: {}", out.stderr);
}

/// Waits (bounded) until `/metrics` satisfies `done`; the exposition.
fn metrics_until(port: u16, done: impl Fn(&str) -> bool) -> String {
    let (code, text) = get_until(port, "/metrics", |c, t| c == 200 && done(t));
    assert_eq!(code, 200, "{text}");
    assert!(done(&text), "not reached in bounded time:\n{text}");
    text
}

#[test]
fn per_host_series_held_lanes_and_the_lag_on_sqlite() {
    scenario(&Db::new());
}

#[test]
fn per_host_series_held_lanes_and_the_lag_on_postgres() {
    on_postgres("host_metrics", scenario);
}

fn scenario(db: &Db) {
    let good = Recipient::start().unwrap();
    let failing = Recipient::start().unwrap();
    failing.set_server_default(Reply::Status(500));
    let slow = Recipient::start().unwrap();
    slow.set_server_default(Reply::Hang);
    let (good_o, failing_o, slow_o) = (origin(&good), origin(&failing), origin(&slow));

    // alice: three rows to the good host, one to the hanging one (in flight: the lag).
    let mut lines: Vec<String> = (0..3)
        .map(|i| row(&format!("a{i}"), &good.url("/a")))
        .collect();
    lines.push(row("s0", &slow.url("/s")));
    ok(
        db,
        &["enqueue", "--actor", "alice"],
        &(lines.join("\n") + "\n"),
    );
    // bob: one row to the failing host: its lane goes into backoff at its first failure.
    ok(
        db,
        &["enqueue", "--actor", "bob"],
        &(row("b0", &failing.url("/f")) + "\n"),
    );
    // carol: one row to the good host, its lane paused by an operator before the relay runs.
    ok(
        db,
        &["enqueue", "--actor", "carol"],
        &(row("c0", &good.url("/paused")) + "\n"),
    );
    ok(
        db,
        &[
            "lanes",
            "pause",
            "--actor",
            "carol",
            "--recipient",
            &good.url("/paused"),
        ],
        "",
    );

    let port = free_port();
    let relay = Relay::start(
        db,
        &[
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "--pass-attempts",
            "1",
            "--backoff-base",
            "1h",
            "--timeout",
            "120s",
        ],
        &[],
    );

    let attempts = |host: &str, outcome: &str| {
        format!("outbox_lanes_host_attempts_total{{host=\"{host}\",outcome=\"{outcome}\"}}")
    };
    let in_flight = |host: &str| format!("outbox_lanes_host_in_flight{{host=\"{host}\"}}");
    let held = |actor: &str, reason: &str| {
        format!("outbox_lanes_lanes_held{{actor=\"{actor}\",reason=\"{reason}\"}}")
    };
    let lag = |actor: &str| format!("outbox_lanes_oldest_pending_seconds{{actor=\"{actor}\"}}");
    let text = metrics_until(port, |t| {
        sample(t, &attempts(&good_o, "delivered")) == Some(3.0)
            && sample(t, &attempts(&failing_o, "transient")) >= Some(1.0)
            && sample(t, &in_flight(&slow_o)) == Some(1.0)
            && sample(t, &held("bob", "backoff")) == Some(1.0)
    });

    // Per host: requests per outcome, latency of each request, in flight now.
    assert_eq!(
        sample(
            &text,
            &format!("outbox_lanes_host_latency_seconds_count{{host=\"{good_o}\"}}")
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            &format!("outbox_lanes_host_latency_seconds_bucket{{le=\"+Inf\",host=\"{good_o}\"}}")
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(sample(&text, &in_flight(&good_o)), Some(0.0), "{text}");
    assert_eq!(sample(&text, &in_flight(&failing_o)), Some(0.0), "{text}");
    assert_eq!(
        sample(&text, &attempts(&failing_o, "delivered")),
        None,
        "{text}"
    );
    // The process-wide outcome counter agrees with the per-host ones.
    assert_eq!(
        sample(&text, "outbox_lanes_attempts_total{outcome=\"delivered\"}"),
        Some(3.0),
        "{text}"
    );

    // bob's only lane is in backoff: held, not lag (its row is still pending).
    assert_eq!(
        sample(&text, "outbox_lanes_queue_depth{actor=\"bob\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, &lag("bob")), Some(0.0), "{text}");
    // carol's only lane is paused: held, not lag.
    assert_eq!(sample(&text, &held("carol", "paused")), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, &held("carol", "backoff")),
        Some(0.0),
        "{text}"
    );
    assert_eq!(sample(&text, &lag("carol")), Some(0.0), "{text}");
    // alice's head hanging in flight is lag: its lane is open.
    assert!(
        sample(&text, &lag("alice")).is_some_and(|s| s > 0.0),
        "{text}"
    );
    for reason in [
        "throttled",
        "backoff",
        "paused",
        "host_blocked",
        "strict_blocked",
    ] {
        assert_eq!(sample(&text, &held("alice", reason)), Some(0.0), "{text}");
    }

    // The cap: 50 more hosts (one row each, for dave) come after the three above, which
    // already have series; 47 of them get series of their own, the last 3 go to "other".
    let more: Vec<Recipient> = (0..50).map(|_| Recipient::start().unwrap()).collect();
    let lines: Vec<String> = more
        .iter()
        .enumerate()
        .map(|(i, r)| row(&format!("d{i}"), &r.url("/d")))
        .collect();
    ok(
        db,
        &["enqueue", "--actor", "dave"],
        &(lines.join("\n") + "\n"),
    );
    let text = metrics_until(port, |t| {
        sum_of(
            t,
            "outbox_lanes_host_attempts_total",
            "outcome=\"delivered\"",
        ) == 53.0
    });
    // Every host that started an attempt has an in-flight series (the hanging one has no
    // finished attempt yet).
    let hosts = hosts_of(&text, "outbox_lanes_host_in_flight");
    assert_eq!(hosts.len(), 51, "{hosts:?}");
    let finished = hosts_of(&text, "outbox_lanes_host_attempts_total");
    assert_eq!(finished.len(), 50, "{finished:?}");
    assert!(!finished.contains(&slow_o), "{finished:?}");
    assert!(hosts.contains("other"), "{hosts:?}");
    for o in [&good_o, &failing_o, &slow_o] {
        assert!(hosts.contains(o.as_str()), "{o} {hosts:?}");
    }
    assert_eq!(
        sample(&text, &attempts("other", "delivered")),
        Some(3.0),
        "{text}"
    );
    for family in [
        "outbox_lanes_host_latency_seconds_count",
        "outbox_lanes_host_in_flight",
    ] {
        assert!(hosts_of(&text, family).len() <= 51, "{family}: {text}");
    }
    assert_eq!(sample(&text, &in_flight(&slow_o)), Some(1.0), "{text}");

    // The hanging recipient goes first, so that the stop waits for nothing.
    drop(slow);
    let (_status, _lines) = relay.stop();
}

/// With the default delivery settings (1 s, 2 s, 4 s in the pass, then backoff): once a
/// recipient that keeps failing has stalled its lane, the lane is counted as held and the
/// lag of its actor falls to 0, while its row stays pending.
#[test]
fn a_lane_in_backoff_leaves_the_lag_with_default_settings() {
    let db = Db::new();
    let down = Recipient::start().unwrap();
    down.set_server_default(Reply::Status(503));
    ok(
        &db,
        &["enqueue", "--actor", "erin"],
        &(row("e0", &down.url("/down")) + "\n"),
    );
    let port = free_port();
    let relay = Relay::start(&db, &["--metrics-addr", &format!("127.0.0.1:{port}")], &[]);
    let text = metrics_until(port, |t| {
        sample(
            t,
            "outbox_lanes_lanes_held{actor=\"erin\",reason=\"backoff\"}",
        ) == Some(1.0)
    });
    assert_eq!(
        sample(&text, "outbox_lanes_oldest_pending_seconds{actor=\"erin\"}"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "outbox_lanes_queue_depth{actor=\"erin\"}"),
        Some(1.0),
        "{text}"
    );
    let origin = origin(&down);
    // The default --pass-attempts (4) stalled it: four requests, each with a latency.
    let name =
        format!("outbox_lanes_host_attempts_total{{host=\"{origin}\",outcome=\"transient\"}}");
    assert!(sample(&text, &name) >= Some(4.0), "{text}");
    let _ = relay.stop();
}
