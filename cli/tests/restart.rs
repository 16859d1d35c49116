//! A relay killed with SIGKILL does not hold its actors for the rest of its lease (30 s): a
//! restarted relay on the same SQLite file, or the other relay on the same Postgres schema,
//! takes them over at once and delivers every row, first arrivals in enqueue order.
//!
//! No assertion is about a duration: the waits are bounded at 20 s, shorter than the lease, so
//! a relay that had to wait the lease out fails them.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_lanes_test_support::{Recipient, Reply};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_outbox-lanes");
const N: usize = 40;
/// Shorter than the default lease (30 s).
const BOUND: Duration = Duration::from_secs(20);

fn command(db: &[String], args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(db)
        .args(args)
        .env("OUTBOX_LANES_ALLOW_PRIVATE_DESTINATIONS", "true")
        .env("OUTBOX_LANES_TIMEOUT", "10s")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

fn enqueue(db: &[String], to: &str) {
    let mut child = command(db, &["enqueue", "--actor", "ann"]).spawn().unwrap();
    let lines: String = (0..N)
        .map(|i| {
            serde_json::json!({ "id": format!("row-{i}"), "to": [to], "body": { "n": i } })
                .to_string()
                + "\n"
        })
        .collect();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "enqueue failed");
}

/// The `n` of each body answered with a 2xx, in arrival order, repeats collapsed.
fn first_arrivals(r: &Recipient) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    for q in r.requests("/slow") {
        if q.completion.status().is_some_and(|s| s < 300) {
            let n = serde_json::from_slice::<Value>(&q.body).unwrap()["n"]
                .as_u64()
                .unwrap();
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    out
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Relay A delivers a few rows and is killed; relay B (started before the kill when
/// `b_first`, after it otherwise) must deliver the rest well within the lease.
fn killed_relay_is_taken_over(db: &[String], b_first: bool) {
    let r = Recipient::start().unwrap();
    r.set_default("/slow", Reply::Status(200).after(Duration::from_millis(50)));
    enqueue(db, &r.url("/slow"));
    let a = command(db, &["relay"]).spawn().unwrap();
    assert!(
        r.wait_for("/slow", 3, Duration::from_secs(60)),
        "relay A delivered nothing"
    );
    let b = b_first.then(|| command(db, &["relay"]).spawn().unwrap());
    stop(a);
    let b = b.unwrap_or_else(|| command(db, &["relay"]).spawn().unwrap());
    let killed = Instant::now();
    while first_arrivals(&r).len() < N && killed.elapsed() < BOUND {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop(b);
    let got = first_arrivals(&r);
    assert_eq!(
        got,
        (0..N as u64).collect::<Vec<_>>(),
        "relay B must take the actor over before A's lease ends, and keep the order"
    );
}

#[test]
fn a_relay_restarted_after_sigkill_on_sqlite_goes_on_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("outbox.db");
    killed_relay_is_taken_over(&["--db".into(), path.display().to_string()], false);
}

#[test]
fn the_other_relay_on_postgres_takes_over_a_killed_one_at_once() {
    let Some(url) = outbox_lanes_test_support::pg_url() else {
        return;
    };
    let schema = format!("ol_restart_{}", std::process::id());
    killed_relay_is_taken_over(
        &[
            "--db".into(),
            url.clone(),
            "--pg-schema".into(),
            schema.clone(),
        ],
        true,
    );
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .unwrap();
}
