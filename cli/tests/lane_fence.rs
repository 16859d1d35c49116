//! Operator lane actions reach a running relay (OL-14): once `lanes pause`, `lanes purge` or
//! `lanes skip-head` has returned, the `relay` (default settings, another process) starts no
//! unit of that lane; only an attempt already in flight may still arrive, and it is recorded.
//! Against real HTTP recipients on 127.0.0.1, on a SQLite file and on Postgres (when
//! `OUTBOX_LANES_TEST_PG` is set).
//!
//! Every wait is bounded; assertions are about which requests arrived after an action
//! returned, and about orders, never about durations.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

use std::io::Read as _;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use outbox_lanes_test_support::{Completion, Recipient, Recorded, Reply};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_outbox-lanes");
/// No single run of the binary in these tests takes anywhere near this long.
const RUN_BOUND: Duration = Duration::from_secs(120);
/// Rows per lane.
const N: u64 = 30;
/// How long the recipients of the controlled lanes take to answer.
const LATENCY: Duration = Duration::from_millis(300);
/// How long the test watches for requests after the actions returned: a relay that still
/// started units of those lanes from its window would send several in this time (one per
/// `LATENCY`, or a retry of the 503 head after its 1 s or 2 s delay).
const WATCH: Duration = Duration::from_secs(5);

/// A SQLite file in a temporary directory, or a fresh Postgres schema.
enum Db {
    Sqlite {
        _dir: tempfile::TempDir,
        path: PathBuf,
    },
    Pg {
        url: String,
        schema: String,
    },
}

impl Db {
    fn sqlite() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox.db");
        Db::Sqlite { _dir: dir, path }
    }

    fn postgres() -> Option<Db> {
        let url = outbox_lanes_test_support::pg_url()?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let schema = format!("ol_fence_{}_{nanos}", std::process::id());
        Some(Db::Pg { url, schema })
    }

    fn args(&self) -> Vec<String> {
        match self {
            Db::Sqlite { path, .. } => vec!["--db".into(), path.display().to_string()],
            Db::Pg { url, schema } => vec![
                "--db".into(),
                url.clone(),
                "--pg-schema".into(),
                schema.clone(),
            ],
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Db::Pg { url, schema } = self {
            if let Ok(mut c) = postgres::Client::connect(url, postgres::NoTls) {
                let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
            }
        }
    }
}

/// The binary with the database and nothing else configured (no delivery settings from the
/// environment: the relay runs with its defaults).
fn command(db: &Db, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(db.args())
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("OUTBOX_LANES_TIMEOUT")
        .env_remove("OUTBOX_LANES_MAX_ATTEMPTS")
        .env_remove("OUTBOX_LANES_PASS_ATTEMPTS")
        .env_remove("OUTBOX_LANES_CONCURRENCY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

struct Out {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Collects a child's output on threads, so a full pipe never blocks it.
fn collect(mut child: Child) -> Out {
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + RUN_BOUND;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("outbox-lanes did not exit within {RUN_BOUND:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Out {
        status,
        stdout: o.join().unwrap(),
        stderr: e.join().unwrap(),
    }
}

fn ok_with(db: &Db, args: &[&str], stdin: &str) -> Out {
    let mut c = command(db, args);
    c.stdin(Stdio::piped());
    let mut child = c.spawn().unwrap();
    {
        use std::io::Write as _;
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.as_bytes()).unwrap();
    }
    let out = collect(child);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?} failed\nstdout: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
    out
}

fn ok(db: &Db, args: &[&str]) -> Value {
    let out = ok_with(db, args, "");
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout of {args:?} is not JSON ({e}): {}", out.stdout))
}

fn rows(n: u64, to: &[String]) -> String {
    (0..n)
        .map(|i| {
            serde_json::json!({ "id": format!("row-{i}"), "to": to, "body": { "n": i } })
                .to_string()
                + "\n"
        })
        .collect()
}

/// Runs `lanes <op>` on one lane; returns when the binary has exited (its `Instant`).
fn lane_op(db: &Db, op: &str, actor: &str, recipient: &str) -> Instant {
    ok(
        db,
        &[
            "lanes",
            op,
            "--actor",
            actor,
            "--recipient",
            recipient,
            "--json",
        ],
    );
    Instant::now()
}

fn n_of(q: &Recorded) -> u64 {
    serde_json::from_slice::<Value>(&q.body).unwrap()["n"]
        .as_u64()
        .unwrap()
}

/// The `n` of each body `path` answered with a 2xx, in arrival order.
fn served(r: &Recipient, path: &str) -> Vec<u64> {
    r.requests(path)
        .iter()
        .filter(|q| q.completion.status().is_some_and(|s| s < 300))
        .map(n_of)
        .collect()
}

/// The requests to `path` that arrived after `t`.
fn after(r: &Recipient, path: &str, t: Instant) -> Vec<u64> {
    r.requests(path)
        .iter()
        .filter(|q| q.arrived_at > t)
        .map(n_of)
        .collect()
}

/// How many requests to `path` were in flight at `t`: arrived, not yet answered.
fn in_flight_at(r: &Recipient, path: &str, t: Instant) -> usize {
    r.requests(path)
        .iter()
        .filter(|q| q.arrived_at <= t)
        .filter(|q| match q.completion {
            Completion::Pending => true,
            Completion::Answered { at, .. } | Completion::Unanswered { at, .. } => at > t,
        })
        .count()
}

/// Removes consecutive repeats: at-least-once may send the unit that was in flight when the
/// lane was paused once more when it resumes.
fn first_deliveries(v: &[u64]) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    for &x in v {
        if out.last() != Some(&x) {
            out.push(x);
        }
    }
    out
}

fn sigterm(child: &Child) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
}

fn lane_actions_reach_a_running_relay(db: &Db) {
    let r = Recipient::start().unwrap();
    let slow = Reply::Status(200).after(LATENCY);
    r.set_default("/paused", slow.clone());
    r.set_default("/purged", slow);
    r.set_default("/skipped", Reply::Status(503).after(LATENCY));
    let (paused, purged, skipped) = (r.url("/paused"), r.url("/purged"), r.url("/skipped"));
    // Each controlled lane shares its actor with a healthy lane, which must go on.
    ok_with(
        db,
        &["enqueue", "--actor", "pia", "--allow-private-destinations"],
        &rows(N, &[paused.clone(), r.url("/pia-ok")]),
    );
    ok_with(
        db,
        &["enqueue", "--actor", "pete", "--allow-private-destinations"],
        &rows(N, &[purged.clone(), r.url("/pete-ok")]),
    );
    ok_with(
        db,
        &["enqueue", "--actor", "sam", "--allow-private-destinations"],
        &rows(1, std::slice::from_ref(&skipped)),
    );

    let relay = command(db, &["relay", "--allow-private-destinations"])
        .spawn()
        .unwrap();
    // A few units of each lane went out (the skipped head failed twice: it is being retried
    // in the pass).
    let started = r.wait_until(Duration::from_secs(60), |log| {
        let count = |p: &str| log.iter().filter(|q| q.path == p).count();
        count("/paused") >= 3 && count("/purged") >= 3 && count("/skipped") >= 2
    });
    assert!(started, "the relay did not start: {:?}", r.all_requests());

    let paused_at = lane_op(db, "pause", "pia", &paused);
    let purged_at = lane_op(db, "purge", "pete", &purged);
    let skipped_at = lane_op(db, "skip-head", "sam", &skipped);
    std::thread::sleep(WATCH);

    // After each action returned, no attempt of its lane started. A lane has one attempt in
    // flight at a time: if one was out when the action returned, nothing arrives after it (its
    // successor or retry would have started later); if none was, one may still arrive, handed
    // to the executor on a read of the lane's state taken just before the action committed.
    let late: Vec<(&str, usize, Vec<u64>)> = [
        ("/paused", paused_at),
        ("/purged", purged_at),
        ("/skipped", skipped_at),
    ]
    .into_iter()
    .map(|(path, t)| (path, in_flight_at(&r, path, t), after(&r, path, t)))
    .filter(|(_, flying, late)| flying + late.len() > 1)
    .collect();
    assert!(
        late.is_empty(),
        "(lane, attempts in flight at the action's return, rows that arrived after it): {late:?}"
    );
    // The healthy lanes were not held up.
    let want: Vec<u64> = (0..N).collect();
    assert!(
        r.wait_until(Duration::from_secs(60), |log| {
            ["/pia-ok", "/pete-ok"]
                .iter()
                .all(|p| log.iter().filter(|q| q.path == *p).count() >= N as usize)
        }),
        "the healthy lanes did not finish"
    );
    assert_eq!(served(&r, "/pia-ok"), want);
    assert_eq!(served(&r, "/pete-ok"), want);

    // Every purged or skipped unit the recipient saw is a dead letter that says so: its
    // attempts include the ones really made, the in-flight one too.
    let dead = ok(db, &["dead-letters", "list", "--json"]);
    let dead = dead["dead_letters"].as_array().unwrap().clone();
    let seen = |path: &str, n: u64| r.requests(path).iter().any(|q| n_of(q) == n);
    let mut purged_rows = Vec::new();
    for d in &dead {
        let n: u64 = d["row_id"].as_str().unwrap()["row-".len()..]
            .parse()
            .unwrap();
        let (path, reason) = match d["actor"].as_str().unwrap() {
            "pete" => ("/purged", "purged"),
            "sam" => ("/skipped", "skipped"),
            other => panic!("a dead letter of {other}: {d}"),
        };
        assert_eq!(d["reason"], reason, "{d}");
        if path == "/purged" {
            purged_rows.push(n);
        }
        if seen(path, n) {
            assert!(
                d["attempts"].as_u64().unwrap() >= 1,
                "row {n} was sent to {path}, its dead letter says otherwise: {d}"
            );
        }
    }
    let sam: Vec<&Value> = dead.iter().filter(|d| d["actor"] == "sam").collect();
    assert_eq!(sam.len(), 1, "{dead:?}");
    let tries = r.requests("/skipped").len() as u64;
    assert_eq!(sam[0]["attempts"], tries, "{:?}", sam[0]);
    assert_eq!(sam[0]["last_status"], 503, "{:?}", sam[0]);
    // Purged: everything not delivered before the purge, in order; delivered: a prefix.
    let delivered = first_deliveries(&served(&r, "/purged"));
    assert!(!purged_rows.is_empty());
    purged_rows.sort_unstable();
    let mut all: Vec<u64> = delivered.clone();
    all.extend(purged_rows.iter().filter(|n| !delivered.contains(n)));
    assert_eq!(all, want, "delivered {delivered:?}, purged {purged_rows:?}");

    // The paused lane resumes where it stopped: every row, in order (the one in flight at the
    // pause may come twice, at-least-once).
    lane_op(db, "resume", "pia", &paused);
    assert!(
        r.wait_until(Duration::from_secs(60), |log| {
            log.iter()
                .filter(|q| q.path == "/paused")
                .any(|q| n_of(q) == N - 1 && q.completion.status() == Some(200))
        }),
        "the paused lane did not finish after resume: {:?}",
        served(&r, "/paused")
    );
    assert_eq!(first_deliveries(&served(&r, "/paused")), want);

    sigterm(&relay);
    let out = collect(relay);
    assert_eq!(out.status.code(), Some(0), "relay: {}", out.stderr);
}

#[test]
fn lane_actions_reach_a_running_relay_on_sqlite() {
    lane_actions_reach_a_running_relay(&Db::sqlite());
}

#[test]
fn lane_actions_reach_a_running_relay_on_postgres() {
    match Db::postgres() {
        Some(db) => lane_actions_reach_a_running_relay(&db),
        None => eprintln!("skipped: OUTBOX_LANES_TEST_PG is not set"),
    }
}
