//! The crash harness: the `relay` binary on a SQLite file (and two relays on one Postgres
//! schema, one of them killed at a time), recipients answering with random
//! 5xx, 429, 400, hangs, resets and closed connections, killed with SIGKILL at seeded random
//! moments and restarted. At the end nothing is lost (every unit delivered or dead-lettered),
//! first arrivals per recipient are in enqueue order, and duplicates are bounded by what can
//! be in flight or not yet acknowledged at each kill.
//!
//! `CRASH_SEED` (default 1) picks the faults and the moments; `CRASH_ROWS` (default 30) sizes
//! the backlog; `CRASH_KILLS` (default 4) bounds the kills (none once nothing is pending). CI
//! runs the defaults; a long run is e.g. `CRASH_ROWS=100 CRASH_KILLS=30 CRASH_SEED=7 cargo test
//! --all-features --test crash -- --nocapture --test-threads=1`.
//! It prints the kills, the duplicates and the time from each restart to the next delivery.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use common::BIN;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_lanes_test_support::{Recipient, Reply, Response};
use serde_json::Value;

const RECIPIENTS: usize = 3;
/// Each answer takes this long at least: a lane delivers at most one unit per 30 ms.
const LATENCY: Duration = Duration::from_millis(30);

/// A small deterministic generator (SplitMix64): the same seed, the same run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn fault(rng: &mut Rng) -> Reply {
    let r = match rng.below(100) {
        0..=74 => Reply::Status(200),
        75..=82 => Reply::Status(500),
        83..=86 => Reply::Response(Response {
            status: 429,
            headers: vec![("Retry-After".into(), "1".into())],
            body: Vec::new(),
        }),
        87..=91 => Reply::Reset,
        92..=94 => Reply::Hang,
        95..=96 => Reply::CloseWithoutResponse,
        _ => Reply::Status(400),
    };
    r.after(LATENCY)
}

fn relay(db: &[String]) -> Child {
    Command::new(BIN)
        .args(db)
        .args(["relay", "--allow-private-destinations", "--timeout", "2s"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn json(db: &[String], args: &[&str]) -> Value {
    let out = Command::new(BIN).args(db).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `(recipient path, n)` of every 2xx answer, in arrival order.
fn delivered(r: &Recipient) -> Vec<(String, u64)> {
    let mut all = r.all_requests();
    all.sort_by_key(|q| q.index);
    all.iter()
        .filter(|q| q.completion.status().is_some_and(|s| s < 300))
        .map(|q| {
            let n = serde_json::from_slice::<Value>(&q.body).unwrap()["n"]
                .as_u64()
                .unwrap();
            (q.path.clone(), n)
        })
        .collect()
}

#[test]
fn killed_and_restarted_relays_lose_nothing_and_keep_every_order() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("outbox.db").display().to_string();
    harness(&["--db".into(), db], 1);
}

/// Two relays on one Postgres schema; at each kill one of them (seeded) is killed and
/// restarted while the other goes on.
#[test]
fn killed_relays_on_postgres_lose_nothing_and_keep_every_order() {
    let Some(url) = outbox_lanes_test_support::pg_url() else {
        return;
    };
    let schema = format!("ol_crash_{}", std::process::id());
    harness(
        &[
            "--db".into(),
            url.clone(),
            "--pg-schema".into(),
            schema.clone(),
        ],
        2,
    );
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .unwrap();
}

/// The harness on the outbox `db` with `relays` relay processes.
fn harness(db: &[String], relays: usize) {
    let seed = env_u64("CRASH_SEED", 1);
    let rows = env_u64("CRASH_ROWS", 30) as usize;
    let kills = env_u64("CRASH_KILLS", 4);
    let mut rng = Rng(seed);
    let r = Recipient::start().unwrap();
    let paths: Vec<String> = (0..RECIPIENTS).map(|i| format!("/r{i}")).collect();
    for p in &paths {
        r.script(p, (0..3 * rows).map(|_| fault(&mut rng)));
        r.set_default(p, Reply::Status(200).after(LATENCY));
    }
    let to: Vec<String> = paths.iter().map(|p| r.url(p)).collect();
    let lines: String = (0..rows)
        .map(|i| {
            serde_json::json!({ "id": format!("row-{i}"), "to": to, "body": { "n": i } })
                .to_string()
                + "\n"
        })
        .collect();
    let enqueue = Command::new(BIN)
        .args(db)
        .args([
            "enqueue",
            "--actor",
            "crash",
            "--allow-private-destinations",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::collect(enqueue, &lines);
    assert_eq!(out.code(), Some(0), "enqueue: {}", out.stderr);

    let mut recoveries = Vec::new();
    let mut children: Vec<Child> = (0..relays).map(|_| relay(db)).collect();
    let pending = || {
        json(db, &["status", "--json"])["actors"][0]["pending"]
            .as_u64()
            .unwrap_or(0)
    };
    let mut killed = 0;
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(200 + rng.below(1000)));
        if pending() == 0 {
            // Everything is delivered: a kill now would measure nothing.
            break;
        }
        killed += 1;
        let victim = rng.below(relays as u64) as usize;
        let _ = children[victim].kill();
        let _ = children[victim].wait();
        let before = delivered(&r).len();
        let restarted = Instant::now();
        children[victim] = relay(db);
        // The time to the next delivery (bounded; reported, not asserted).
        while delivered(&r).len() == before && restarted.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
        recoveries.push(restarted.elapsed());
    }
    // The last relay runs until nothing is pending (bounded).
    let started = Instant::now();
    while pending() > 0 && started.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(200));
    }
    for mut child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_eq!(pending(), 0, "units left pending");

    let got = delivered(&r);
    let dead = json(db, &["dead-letters", "list", "--json"]);
    let dead: Vec<(String, u64)> = dead["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let url = d["recipient"].as_str().unwrap();
            let path = url.rsplit_once('/').map(|(_, p)| format!("/{p}")).unwrap();
            let n = d["row_id"]
                .as_str()
                .unwrap()
                .trim_start_matches("row-")
                .parse()
                .unwrap();
            (path, n)
        })
        .collect();
    let mut duplicates = HashMap::new();
    for p in &paths {
        let mut first: Vec<u64> = Vec::new();
        let mut twice = 0;
        for (_, n) in got.iter().filter(|(q, _)| q == p) {
            if first.contains(n) {
                twice += 1;
            } else {
                first.push(*n);
            }
        }
        assert!(
            first.windows(2).all(|w| w[0] < w[1]),
            "{p}: first arrivals out of order: {first:?}"
        );
        for n in 0..rows as u64 {
            let is_dead = dead.iter().any(|(q, m)| q == p && *m == n);
            assert!(
                first.contains(&n) || is_dead,
                "{p}: row {n} neither delivered nor dead-lettered (lost)"
            );
        }
        // Per kill, at most the unit in flight and the acks of the last 20 ms (one unit per
        // 30 ms) can be sent again.
        assert!(
            twice <= 2 * killed,
            "{p}: {twice} duplicates after {killed} kills"
        );
        duplicates.insert(p.clone(), twice);
    }
    println!(
        "crash harness: {relays} relay(s) on {}, seed {seed}, {rows} rows, {killed} kills, {} deliveries, {} dead letters, duplicates per recipient {duplicates:?}, restart to next delivery {recoveries:?}",
        if db[1].starts_with("postgres") {
            "Postgres"
        } else {
            "SQLite"
        },
        got.len(),
        dead.len()
    );
}
