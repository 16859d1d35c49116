//! The `outbox-lanes` binary, run as built, against a real SQLite file (and Postgres when
//! `OUTBOX_LANES_TEST_PG` is set) and real HTTP recipients on 127.0.0.1.
//!
//! Every wait is bounded; assertions are about outcomes and orders, never durations.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, get, get_until};
use outbox_lanes_test_support::{Recipient, Reply};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_outbox-lanes");
/// No single run of the binary in these tests takes anywhere near this long.
const RUN_BOUND: Duration = Duration::from_secs(120);

/// A fresh database: a SQLite file in a temporary directory, or a fresh Postgres schema.
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

    /// A fresh schema, or `None` (the test skips, loudly) without `OUTBOX_LANES_TEST_PG` —
    /// unless `CI` is set: there a missing server fails the test.
    fn postgres() -> Option<Db> {
        let url = outbox_lanes_test_support::pg_url()?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let schema = format!("ol_cli_{}_{nanos}", std::process::id());
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

struct Out {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Out {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }
}

fn command(db: &Db, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(db.args())
        .args(args)
        // Through the environment: every command may read these, only drain and relay take
        // them (and enqueue its own --allow-private-destinations).
        .env("OUTBOX_LANES_ALLOW_PRIVATE_DESTINATIONS", "true")
        .env("OUTBOX_LANES_TIMEOUT", "10s")
        .env("RUST_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Collects a child's output on threads, so a full pipe never blocks it.
fn collect(mut child: Child, stdin: &str) -> Out {
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_owned();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(stdin.as_bytes());
    });
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
    let status = wait_bounded(&mut child, RUN_BOUND);
    let _ = writer.join();
    Out {
        status,
        stdout: o.join().unwrap(),
        stderr: e.join().unwrap(),
    }
}

fn wait_bounded(child: &mut Child, bound: Duration) -> ExitStatus {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("outbox-lanes did not exit within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run(db: &Db, args: &[&str], stdin: &str) -> Out {
    collect(command(db, args).spawn().unwrap(), stdin)
}

fn ok(db: &Db, args: &[&str], stdin: &str) -> Out {
    let out = run(db, args, stdin);
    assert_eq!(
        out.code(),
        Some(0),
        "{args:?} failed\nstdout: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
    out
}

fn line(id: &str, to: &[String], body: &Value) -> String {
    serde_json::json!({ "id": id, "to": to, "body": body }).to_string()
}

fn rows(n: usize, to: &[String]) -> String {
    (0..n)
        .map(|i| line(&format!("row-{i}"), to, &serde_json::json!({ "n": i })) + "\n")
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

fn status(db: &Db) -> Value {
    ok(db, &["status", "--json"], "").json()
}

fn actor<'a>(status: &'a Value, name: &str) -> Option<&'a Value> {
    status["actors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["actor"] == name)
}

fn pending(db: &Db) -> u64 {
    status(db)["actors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["pending"].as_u64().unwrap())
        .sum()
}

#[test]
fn enqueue_then_drain_delivers_in_order() {
    enqueue_then_drain(&Db::sqlite());
}

#[test]
fn enqueue_then_drain_on_postgres() {
    let Some(db) = Db::postgres() else {
        return;
    };
    enqueue_then_drain(&db);
    replay_dead_letter(&db);
}

fn enqueue_then_drain(db: &Db) {
    let r = Recipient::start().unwrap();
    let to = vec![r.url("/a"), r.url("/b")];
    let out = ok(db, &["enqueue", "--actor", "alice"], &rows(20, &to));
    let results: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(results.len(), 20);
    let mut last_seq = 0;
    for (i, res) in results.iter().enumerate() {
        assert_eq!(res["id"], format!("row-{i}"));
        let seq = res["seq"].as_u64().unwrap();
        assert!(seq > last_seq);
        last_seq = seq;
        assert_eq!(res["units"].as_array().unwrap().len(), 2);
        assert_eq!(res["skipped"], serde_json::json!([]));
    }

    let st = status(db);
    let a = actor(&st, "alice").unwrap();
    assert_eq!(a["pending"], 40);
    assert_eq!(a["dead_letters"], 0);
    let lanes = ok(db, &["lanes", "--actor", "alice", "--json"], "").json();
    assert_eq!(lanes["actor"], "alice");
    let lanes = lanes["lanes"].as_array().unwrap();
    assert_eq!(lanes.len(), 2);
    for l in lanes {
        assert_eq!(l["depth"], 20);
        assert!(l["head_enqueued_at"].is_string());
        assert!(l["not_before"].is_null());
        assert!(to.iter().any(|u| l["recipient"] == u.as_str()), "{l}");
    }
    let table = ok(db, &["lanes", "--actor", "alice"], "").stdout;
    assert!(table.starts_with("LANE"), "{table}");

    let out = ok(db, &["drain"], "");
    assert!(out.stderr.contains("40 delivered"), "{}", out.stderr);
    let want: Vec<u64> = (0..20).collect();
    assert_eq!(served(&r, "/a"), want);
    assert_eq!(served(&r, "/b"), want);
    // Bodies are sent as their JSON text.
    assert_eq!(r.bodies("/a")[0], b"{\"n\":0}");
    assert_eq!(
        r.requests("/a")[0].header("content-type"),
        Some("application/json")
    );
    assert_eq!(pending(db), 0);
}

#[test]
fn dead_letter_is_listed_and_replay_delivers_it() {
    replay_dead_letter(&Db::sqlite());
}

fn replay_dead_letter(db: &Db) {
    let r = Recipient::start().unwrap();
    // The first request to /p is refused for good; afterwards /p answers 200.
    r.script("/p", [Reply::Status(422)]);
    let to = vec![r.url("/p"), r.url("/q")];
    ok(db, &["enqueue", "--actor", "bob"], &rows(3, &to));
    ok(db, &["drain", "--actor", "bob"], "");
    assert_eq!(served(&r, "/p"), [1, 2]);
    assert_eq!(served(&r, "/q"), [0, 1, 2]);

    let st = status(db);
    let b = actor(&st, "bob").unwrap();
    assert_eq!(b["pending"], 0);
    assert_eq!(b["dead_letters"], 1);
    let dead = ok(db, &["dead-letters", "list", "--json"], "").json();
    let dead = dead["dead_letters"].as_array().unwrap();
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(d["actor"], "bob");
    assert_eq!(d["row_id"], "row-0");
    assert_eq!(d["recipient"], r.url("/p"));
    assert_eq!(d["reason"], "permanent");
    assert_eq!(d["last_status"], 422);
    assert_eq!(d["attempts"], 1);
    assert!(d["dead_at"].is_string());
    // Its lane is listed (the actor is known through its dead letter) and empty.
    let lanes = ok(db, &["lanes", "--actor", "bob", "--json"], "").json();
    assert!(
        lanes["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["depth"] == 0)
    );

    let replay = ok(
        db,
        &["dead-letters", "replay", "--actor", "bob", "--json"],
        "",
    )
    .json();
    assert_eq!(replay["replayed"], 1);
    assert_eq!(pending(db), 1);
    ok(db, &["drain"], "");
    assert_eq!(served(&r, "/p"), [1, 2, 0]);
    assert_eq!(served(&r, "/q"), [0, 1, 2]);
    let dead = ok(db, &["dead-letters", "list", "--json"], "").json();
    assert_eq!(dead["dead_letters"], serde_json::json!([]));
    assert_eq!(pending(db), 0);
}

#[test]
fn purge_removes_dead_letters() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    r.set_default("/gone", Reply::Status(400));
    ok(
        &db,
        &["enqueue", "--actor", "carol"],
        &rows(2, &[r.url("/gone")]),
    );
    ok(&db, &["drain"], "");
    let dead = ok(&db, &["dead-letters", "list", "--json"], "").json();
    assert_eq!(dead["dead_letters"].as_array().unwrap().len(), 2);
    let first = dead["dead_letters"][0]["id"].as_i64().unwrap().to_string();
    let purged = ok(
        &db,
        &["dead-letters", "purge", "--id", &first, "--json"],
        "",
    )
    .json();
    assert_eq!(purged["purged"], 1);
    let purged = ok(
        &db,
        &["dead-letters", "purge", "--actor", "carol", "--json"],
        "",
    )
    .json();
    assert_eq!(purged["purged"], 1);
    let out = run(&db, &["dead-letters", "replay", "--id", "999999"], "");
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("no dead letter with id 999999"),
        "{}",
        out.stderr
    );
}

#[test]
fn bad_input_exits_2_and_leaves_the_database_as_it_was() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    let to = vec![r.url("/a")];
    ok(&db, &["enqueue", "--actor", "dave"], &rows(1, &to));
    assert_eq!(pending(&db), 1);

    let good = line("ok-1", &to, &serde_json::json!(1));
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "malformed JSON",
            format!("{good}\n{{\"id\": \"x\", \"to\": [\n"),
            vec!["line 2", "malformed JSON"],
        ),
        (
            "relative URL",
            format!(
                "{good}\n{}\n",
                line("x", &["/inbox".into()], &serde_json::json!(1))
            ),
            vec!["line 2", "\"/inbox\"", "absolute"],
        ),
        (
            "missing body",
            format!("{good}\n\n{}\n", serde_json::json!({ "id": "x", "to": to })),
            vec!["line 3", "missing \"body\""],
        ),
        (
            "unknown field",
            format!(
                "{}\n",
                serde_json::json!({ "id": "x", "to": to, "body": 1, "bdy": 2 })
            ),
            vec!["line 1", "unknown field `bdy`"],
        ),
        (
            "content type with CRLF",
            format!(
                "{good}\n{}\n",
                serde_json::json!({ "id": "x", "to": to, "body": 1, "content_type": "text/plain\r\nX-Evil: 1" })
            ),
            vec!["line 2", "not a valid HTTP header value"],
        ),
        (
            "empty id",
            format!("{}\n", line("", &to, &serde_json::json!(1))),
            vec!["line 1", "\"id\" is empty"],
        ),
        (
            "id already stored",
            format!("{good}\n{}\n", line("row-0", &to, &serde_json::json!(1))),
            vec!["line 2", "already used"],
        ),
        (
            "a header the client sets",
            format!(
                "{good}\n{}\n",
                serde_json::json!({ "id": "x", "to": to, "body": 1, "headers": {"X-Ok": "1", "Content-Type": "text/plain"} })
            ),
            vec!["line 2", "header \"Content-Type\" refused", "content type"],
        ),
        (
            "a header value with CRLF",
            format!(
                "{}\n",
                serde_json::json!({ "id": "x", "to": to, "body": 1, "headers": {"X-Evil": "1\r\nHost: a"} })
            ),
            vec!["line 1", "\"X-Evil\"", "not a valid HTTP header value"],
        ),
        (
            "a header value that is not a string",
            format!(
                "{}\n",
                serde_json::json!({ "id": "x", "to": to, "body": 1, "headers": {"X-N": 1} })
            ),
            vec!["line 1", "expected a string"],
        ),
        (
            "body and body_base64",
            format!(
                "{}\n",
                serde_json::json!({ "id": "x", "to": to, "body": 1, "body_base64": "AA==" })
            ),
            vec!["line 1", "both \"body\" and \"body_base64\""],
        ),
        (
            "bad base64",
            format!(
                "{good}\n{}\n",
                serde_json::json!({ "id": "x", "to": to, "body_base64": "not base64!" })
            ),
            vec!["line 2", "\"body_base64\" is not valid base64"],
        ),
    ];
    for (what, input, needles) in cases {
        let out = run(&db, &["enqueue", "--actor", "dave"], &input);
        assert_eq!(out.code(), Some(2), "{what}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "{what}: {}", out.stdout);
        let err = out
            .stderr
            .lines()
            .find(|l| l.starts_with("error: "))
            .unwrap_or_else(|| panic!("{what}: no error line in {}", out.stderr));
        for n in needles {
            assert!(err.contains(n), "{what}: {err:?} lacks {n:?}");
        }
        assert_eq!(pending(&db), 1, "{what} changed the database");
    }

    let out = run(&db, &["enqueue", "--actor", "dave", "--bogus"], &good);
    assert_eq!(out.code(), Some(2));
    assert!(out.stderr.contains("--bogus"), "{}", out.stderr);
    let out = run(&db, &["drain", "--timeout", "soon"], "");
    assert_eq!(out.code(), Some(2));
    assert!(out.stderr.contains("soon"), "{}", out.stderr);
    let out = run(&db, &["lanes", "--actor", "nobody"], "");
    assert_eq!(out.code(), Some(2));
    assert!(
        out.stderr.contains("unknown actor \"nobody\""),
        "{}",
        out.stderr
    );
    assert_eq!(pending(&db), 1);
    assert!(r.requests("/a").is_empty());
}

#[test]
fn unopenable_database_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir").join("outbox.db");
    let r = Recipient::start().unwrap();
    let input = rows(1, &[r.url("/a")]);
    for path in [missing.as_path(), dir.path()] {
        let out = collect(
            Command::new(BIN)
                .args(["--db", &path.display().to_string()])
                .args(["enqueue", "--actor", "erin", "--allow-private-destinations"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
            &input,
        );
        assert_eq!(out.code(), Some(2), "{}: {}", path.display(), out.stderr);
        assert!(
            out.stderr.starts_with("error: ") && out.stderr.contains("cannot open database"),
            "{}",
            out.stderr
        );
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    }
    assert!(!missing.parent().unwrap().exists());
    assert!(r.requests("/a").is_empty());
}

#[test]
fn postgres_refusal_shows_the_servers_message() {
    let Some(url) = outbox_lanes_test_support::pg_url() else {
        return;
    };
    // The test server, as a role that does not exist.
    let host = url.split_once('@').unwrap().1.split('/').next().unwrap();
    let db = format!("postgres://nobody_ol_cli@{host}/nodb");
    let out = collect(
        Command::new(BIN)
            .args(["--db", &db, "status"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.starts_with("error: cannot open database")
            && out
                .stderr
                .contains(r#"role "nobody_ol_cli" does not exist"#)
            && out.stderr.contains("SQLSTATE 28000"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("db error"), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
}

#[test]
fn bad_sslmode_exits_2_naming_the_values() {
    let out = collect(
        Command::new(BIN)
            .args([
                "--db",
                "postgres://postgres@127.0.0.1:1/x?sslmode=allow",
                "status",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains(r#"invalid sslmode "allow""#) && out.stderr.contains("verify-full"),
        "{}",
        out.stderr
    );
}

#[test]
fn database_failure_at_run_time_exits_1() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    ok(
        &db,
        &["enqueue", "--actor", "ivan"],
        &rows(2, &[r.url("/a")]),
    );
    let Db::Sqlite { path, .. } = &db else {
        unreachable!()
    };
    // The database opens (its schema version is fine) but a table the passes need is gone.
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch("DROP TABLE ol_units").unwrap();
    drop(conn);
    for args in [&["drain"][..], &["status", "--json"][..]] {
        let out = run(&db, args, "");
        assert_eq!(out.code(), Some(1), "{args:?}: {}", out.stderr);
        let err = out.stderr.lines().last().unwrap_or_default();
        assert!(
            err.starts_with("error: ") && err.contains("ol_units"),
            "{err}"
        );
    }
    assert!(r.requests("/a").is_empty());
}

fn sigterm(child: &Child) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
}

/// Removes consecutive repeats: at-least-once may resend the unit that was in flight when
/// the relay stopped, right before its successor.
fn first_deliveries(v: &[u64]) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    for &x in v {
        if out.last() != Some(&x) {
            out.push(x);
        }
    }
    out
}

fn relay_sigterm_then_drain(db: &Db) {
    const N: usize = 30;
    let r = Recipient::start().unwrap();
    r.set_default(
        "/slow",
        Reply::Status(200).after(Duration::from_millis(100)),
    );
    r.set_default("/fast", Reply::Status(200));
    ok(
        db,
        &["enqueue", "--actor", "frank"],
        &rows(N, &[r.url("/slow")]),
    );
    let relay = command(db, &["relay"]).spawn().unwrap();
    assert!(
        r.wait_for("/slow", 3, Duration::from_secs(60)),
        "the relay delivered nothing"
    );
    sigterm(&relay);
    let out = collect(relay, "");
    assert_eq!(out.code(), Some(0), "relay: {}", out.stderr);
    let before = served(&r, "/slow");
    assert!(before.len() < N, "the relay finished before the signal");
    // Nothing in flight is left behind: every answered request was acknowledged.
    assert_eq!(pending(db), (N - first_deliveries(&before).len()) as u64);

    ok(db, &["drain"], "");
    let want: Vec<u64> = (0..N as u64).collect();
    assert_eq!(first_deliveries(&served(&r, "/slow")), want);
    assert_eq!(pending(db), 0);
}

#[test]
fn sigterm_stops_relay_gracefully_and_drain_finishes_in_order() {
    relay_sigterm_then_drain(&Db::sqlite());
}

#[test]
fn sigterm_stops_drain_gracefully() {
    const N: usize = 30;
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    r.set_default(
        "/slow",
        Reply::Status(200).after(Duration::from_millis(100)),
    );
    ok(
        &db,
        &["enqueue", "--actor", "jo"],
        &rows(N, &[r.url("/slow")]),
    );
    let drain = command(&db, &["drain"]).spawn().unwrap();
    assert!(r.wait_for("/slow", 3, Duration::from_secs(60)));
    sigterm(&drain);
    let out = collect(drain, "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("stopped by a signal"), "{}", out.stderr);
    let before = served(&r, "/slow");
    assert!(before.len() < N);
    assert_eq!(pending(&db), (N - first_deliveries(&before).len()) as u64);
    ok(&db, &["drain"], "");
    let want: Vec<u64> = (0..N as u64).collect();
    assert_eq!(first_deliveries(&served(&r, "/slow")), want);
}

#[test]
fn relay_on_postgres() {
    let Some(db) = Db::postgres() else {
        return;
    };
    relay_sigterm_then_drain(&db);
}

#[test]
fn relay_delivers_new_rows_and_serves_metrics() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let relay = command(&db, &["relay", "--metrics-addr", &addr])
        .spawn()
        .unwrap();
    ok(
        &db,
        &["enqueue", "--actor", "gina"],
        &rows(5, &[r.url("/m")]),
    );
    if !r.wait_for("/m", 5, Duration::from_secs(60)) {
        sigterm(&relay);
        let out = collect(relay, "");
        panic!(
            "the relay delivered {:?} in 60 s; its stderr:\n{}",
            served(&r, "/m"),
            out.stderr
        );
    }
    // The recipient records a request when it arrives; the relay counts it once the answer
    // is back. Scrape until the counters caught up (bounded).
    let samples = [
        "outbox_lanes_delivered_total{actor=\"gina\"} 5",
        "outbox_lanes_attempts_total{outcome=\"delivered\"} 5",
        "outbox_lanes_delivery_latency_seconds_count 5",
        "outbox_lanes_queue_wait_seconds_count 5",
    ];
    let mut text = String::new();
    for _ in 0..200 {
        if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
            text.clear();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            s.read_to_string(&mut text).unwrap();
            if samples.iter().all(|x| text.lines().any(|l| l == *x)) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    sigterm(&relay);
    let out = collect(relay, "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains("\r\nContent-Type: application/openmetrics-text; version=1.0.0"),
        "{text}"
    );
    assert!(text.ends_with("\n# EOF\n"), "{text}");
    // OpenMetrics: a counter family is named without `_total`, its samples with it.
    for (family, kind) in [
        ("outbox_lanes_queue_depth", "gauge"),
        ("outbox_lanes_stalled_lanes", "gauge"),
        ("outbox_lanes_dead_letters", "gauge"),
        ("outbox_lanes_delivered", "counter"),
        ("outbox_lanes_dead_lettered", "counter"),
        ("outbox_lanes_units_in_flight", "gauge"),
        ("outbox_lanes_attempts", "counter"),
        ("outbox_lanes_delivery_latency_seconds", "histogram"),
        ("outbox_lanes_queue_wait_seconds", "histogram"),
    ] {
        assert!(
            text.lines().any(|l| l == format!("# TYPE {family} {kind}")),
            "{family} missing: {text}"
        );
    }
    assert_eq!(served(&r, "/m"), [0, 1, 2, 3, 4]);
    // The counters agree with the recipient.
    for sample in samples {
        assert!(
            text.lines().any(|l| l == sample),
            "{sample} missing: {text}"
        );
    }
}

#[test]
fn plain_output_is_a_table() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    ok(
        &db,
        &["enqueue", "--actor", "hal"],
        &rows(2, &[r.url("/t")]),
    );
    let out = ok(&db, &["status"], "").stdout;
    let mut lines = out.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with("ACTOR"), "{out}");
    let row = lines.next().unwrap();
    assert!(row.starts_with("hal "), "{out}");
    // Columns line up with the header.
    let col = header.find("PENDING").unwrap();
    assert_eq!(&row[col..col + 1], "2", "{out}");
}

#[test]
fn dedup_key_skips_recipients_with_a_pending_unit() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    let (a, b) = (r.url("/a"), r.url("/b"));
    let input = [
        serde_json::json!({ "id": "u1", "to": [&a], "body": 1, "dedup_key": "k" }),
        serde_json::json!({ "id": "u2", "to": [&a, &b], "body": 2, "dedup_key": "k",
            "content_type": "text/plain" }),
        serde_json::json!({ "id": "u3", "to": [&a, &b], "body": 3, "joined": true }),
    ]
    .iter()
    .map(|v| format!("{v}\n"))
    .collect::<String>();
    let out = ok(&db, &["enqueue", "--actor", "kim"], &input);
    let res: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(res[0]["skipped"], serde_json::json!([]));
    assert_eq!(res[0]["units"].as_array().unwrap().len(), 1);
    // u1's unit with the same key is still pending for /a.
    assert_eq!(res[1]["skipped"], serde_json::json!([a]));
    assert_eq!(res[1]["units"].as_array().unwrap().len(), 1);
    // A joined row is one unit for all its recipients.
    assert_eq!(res[2]["units"].as_array().unwrap().len(), 1);
    ok(&db, &["drain"], "");
    let bodies = |p: &str| -> Vec<String> {
        r.bodies(p)
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect()
    };
    assert_eq!(bodies("/a"), ["1", "3"]);
    assert_eq!(bodies("/b"), ["2", "3"]);
    assert_eq!(
        r.requests("/b")[0].header("content-type"),
        Some("text/plain")
    );
}

#[test]
fn delivery_flags_are_applied() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    r.set_default("/busy", Reply::Status(503));
    r.set_default("/hang", Reply::Hang);
    ok(
        &db,
        &["enqueue", "--actor", "lee"],
        &rows(1, &[r.url("/busy"), r.url("/hang")]),
    );
    ok(
        &db,
        &[
            "drain",
            "--timeout",
            "300ms",
            "--max-attempts",
            "2",
            "--pass-attempts",
            "5",
            "--concurrency",
            "2",
        ],
        "",
    );
    let dead = ok(&db, &["dead-letters", "list", "--json"], "").json();
    let dead = dead["dead_letters"].as_array().unwrap();
    assert_eq!(dead.len(), 2, "{dead:?}");
    for d in dead {
        assert_eq!(d["reason"], "exhausted");
        assert_eq!(d["attempts"], 2);
    }
    assert_eq!(r.count("/busy"), 2);
    assert_eq!(r.count("/hang"), 2);
    let hang = dead
        .iter()
        .find(|d| d["recipient"] == r.url("/hang").as_str())
        .unwrap();
    assert!(
        hang["last_error"].as_str().unwrap().contains("timeout")
            || hang["last_error"].as_str().unwrap().contains("timed out"),
        "{hang}"
    );
}

#[test]
fn per_host_concurrency_caps_one_host() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    // Slow enough that, uncapped, every lane's head would be in flight at once.
    r.set_server_default(Reply::Status(200).after(Duration::from_millis(50)));
    let to: Vec<String> = (0..4).map(|l| r.url(&format!("/i{l}"))).collect();
    ok(&db, &["enqueue", "--actor", "pat"], &rows(3, &to));
    ok(&db, &["drain", "--per-host-concurrency", "1"], "");
    for l in 0..4 {
        assert_eq!(served(&r, &format!("/i{l}")), [0, 1, 2]);
    }
    assert_eq!(r.max_in_progress(), 1, "one request at a time to the host");
    let out = run(&db, &["drain", "--per-host-concurrency", "0"], "");
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
}

/// Enqueued with the flag (the tests' environment sets it), then the outbox's destination
/// policy narrowed back to public by an operator (OL-24): a drain without the flag refuses the
/// loopback destination, and its JSON logs say so.
#[test]
fn loopback_destinations_are_refused_once_the_policy_is_narrowed() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    ok(
        &db,
        &["enqueue", "--actor", "max"],
        &rows(1, &[r.url("/a")]),
    );
    ok(&db, &["destinations", "set", "public"], "");
    let Db::Sqlite { path, .. } = &db else {
        unreachable!()
    };
    let out = collect(
        Command::new(BIN)
            .args(["--db", &path.display().to_string(), "--log-format", "json"])
            .arg("drain")
            .env("RUST_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    // Logs are JSON lines, the summary included.
    let logs = json_lines(&out.stderr);
    assert!(!logs.is_empty());
    for v in &logs {
        assert!(v["level"].is_string(), "{v}");
    }
    assert!(r.requests("/a").is_empty());
    let dead = ok(&db, &["dead-letters", "list", "--json"], "").json();
    assert_eq!(dead["dead_letters"][0]["reason"], "destination_refused");
}

#[test]
fn zero_timeout_is_refused() {
    let db = Db::sqlite();
    let Db::Sqlite { path, .. } = &db else {
        unreachable!()
    };
    for t in ["0", "0s", "0ms"] {
        let out = collect(
            Command::new(BIN)
                .args(db.args())
                .args(["drain", "--timeout", t])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
            "",
        );
        assert_eq!(out.code(), Some(2), "--timeout {t}: {}", out.stderr);
        assert!(
            out.stderr.contains("--timeout") && out.stderr.contains("more than zero"),
            "{}",
            out.stderr
        );
    }
    assert!(!path.exists());
}

#[test]
fn null_body_is_sent_as_json_null() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    let input = format!(
        "{}\n",
        serde_json::json!({ "id": "n", "to": [r.url("/a")], "body": null })
    );
    let out = ok(&db, &["enqueue", "--actor", "nina"], &input);
    assert!(out.stdout.contains("\"id\":\"n\""), "{}", out.stdout);
    ok(&db, &["drain"], "");
    assert_eq!(r.bodies("/a"), [b"null".to_vec()]);
    // A missing body is still refused.
    let input = format!(
        "{}\n",
        serde_json::json!({ "id": "m", "to": [r.url("/a")] })
    );
    let out = run(&db, &["enqueue", "--actor", "nina"], &input);
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("missing \"body\""), "{}", out.stderr);
}

#[test]
fn over_long_line_is_refused_by_number_and_loses_nothing() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    let to = vec![r.url("/a")];
    ok(&db, &["enqueue", "--actor", "olga"], &rows(2, &to));
    let good = line("g", &to, &serde_json::json!(1));
    let long = line("l", &to, &serde_json::json!("x".repeat(4096)));
    let input = format!(
        "{good}\n\n{long}\n{}\n",
        line("h", &to, &serde_json::json!(2))
    );
    let out = run(
        &db,
        &["enqueue", "--actor", "olga", "--max-line-bytes", "1024"],
        &input,
    );
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    let err = out
        .stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap();
    for needle in [
        "line 3",
        "longer than the limit of 1024 bytes",
        "nothing enqueued",
        "1 valid line(s)",
    ] {
        assert!(err.contains(needle), "{err:?} lacks {needle:?}");
    }
    // The rows enqueued before are all there, the refused input added nothing.
    assert_eq!(pending(&db), 2);
    // An endless line without a newline is refused too, not read whole.
    let endless = "{\"id\": \"e\", \"body\": \"".to_string() + &"y".repeat(1 << 20);
    let out = run(
        &db,
        &["enqueue", "--actor", "olga", "--max-line-bytes", "1024"],
        &endless,
    );
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("line 1: longer than"), "{}", out.stderr);
    assert_eq!(pending(&db), 2);
    // Under the default limit the long line goes in.
    ok(&db, &["enqueue", "--actor", "olga"], &input);
    assert_eq!(pending(&db), 5);
}

#[test]
fn read_only_commands_create_no_database() {
    let db = Db::sqlite();
    let Db::Sqlite { path, .. } = &db else {
        unreachable!()
    };
    let commands: [&[&str]; 7] = [
        &["status"],
        &["status", "--json"],
        &["lanes", "--actor", "x"],
        &["dead-letters", "list"],
        &["dead-letters", "purge", "--all"],
        &["dead-letters", "replay", "--actor", "x"],
        &["drain"],
    ];
    for args in commands {
        let out = run(&db, args, "");
        assert_eq!(out.code(), Some(2), "{args:?}: {}", out.stderr);
        let want = format!(
            "error: no outbox at {}; run `outbox-lanes migrate` (or enqueue) to create it",
            path.display()
        );
        assert_eq!(out.stderr.trim_end(), want, "{args:?}");
        assert!(!path.exists(), "{args:?} created {}", path.display());
    }
    let r = Recipient::start().unwrap();
    ok(&db, &["enqueue", "--actor", "x"], &rows(1, &[r.url("/a")]));
    assert_eq!(pending(&db), 1);

    // A Postgres schema that does not exist (a typo) is not created either.
    let Some(pg) = Db::postgres() else {
        println!("skipped on Postgres: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let Db::Pg { url, schema } = &pg else {
        unreachable!()
    };
    for args in commands {
        let out = run(&pg, args, "");
        assert_eq!(out.code(), Some(2), "{args:?}: {}", out.stderr);
        assert!(
            out.stderr
                .contains(&format!("no outbox in Postgres schema {schema:?}")),
            "{args:?}: {}",
            out.stderr
        );
    }
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = $1",
            &[schema],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "schema {schema} was created");
    ok(&pg, &["enqueue", "--actor", "x"], &rows(1, &[r.url("/a")]));
    assert_eq!(pending(&pg), 1);
}

#[test]
fn unknown_actor_is_refused_alike_by_every_command() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    ok(
        &db,
        &["enqueue", "--actor", "known"],
        &rows(1, &[r.url("/a")]),
    );
    let commands: [&[&str]; 5] = [
        &["drain", "--actor", "nobody"],
        &["lanes", "--actor", "nobody"],
        &["dead-letters", "list", "--actor", "nobody"],
        &["dead-letters", "replay", "--actor", "nobody"],
        &["dead-letters", "purge", "--actor", "nobody"],
    ];
    for args in commands {
        let out = run(&db, args, "");
        assert_eq!(out.code(), Some(2), "{args:?}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "{args:?}: {}", out.stdout);
        assert_eq!(
            out.stderr.lines().last().unwrap_or_default(),
            "error: unknown actor \"nobody\": no pending units, lanes or dead letters",
            "{args:?}"
        );
    }
    // A known actor without dead letters is not an error, however it is spelled (the
    // resolver trims it, as enqueue did).
    ok(&db, &["dead-letters", "list", "--actor", "known"], "");
    ok(&db, &["dead-letters", "list", "--actor", " known "], "");
    ok(&db, &["dead-letters", "purge", "--actor", "known"], "");
    assert_eq!(pending(&db), 1);
    assert!(r.requests("/a").is_empty());
}

/// Each `: `-separated part of an error line once: no cause printed twice.
fn said_once(err: &str) {
    let parts: Vec<&str> = err.split(": ").collect();
    for (i, p) in parts.iter().enumerate() {
        assert!(!parts[i + 1..].contains(p), "{p:?} repeated in {err:?}");
    }
}

#[test]
fn locked_database_exits_1() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    ok(
        &db,
        &["enqueue", "--actor", "lou"],
        &rows(1, &[r.url("/a")]),
    );
    let Db::Sqlite { path, .. } = &db else {
        unreachable!()
    };
    // Another process holds the database's write lock, past the busy timeout.
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(
        "PRAGMA locking_mode = EXCLUSIVE; BEGIN EXCLUSIVE; \
         INSERT INTO ol_meta (key, value) VALUES ('held', '1');",
    )
    .unwrap();
    for args in [&["status"][..], &["enqueue", "--actor", "lou"][..]] {
        let out = run(&db, args, &line("x", &[r.url("/a")], &serde_json::json!(1)));
        assert_eq!(out.code(), Some(1), "{args:?}: {}", out.stderr);
        let err = out.stderr.lines().last().unwrap_or_default();
        assert!(
            err.starts_with("error: ") && err.contains("locked"),
            "{err}"
        );
        said_once(err);
    }
    conn.execute_batch("ROLLBACK").unwrap();
    drop(conn);
    assert_eq!(pending(&db), 1);
}

#[cfg(unix)]
#[test]
fn full_disk_exits_1_and_says_each_cause_once() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    ok(
        &db,
        &["enqueue", "--actor", "fay"],
        &rows(1, &[r.url("/a")]),
    );
    // The file size limit (in 512- or 1024-byte blocks, by shell) stops the write-ahead log
    // long before it holds the 900 kB body: the writes fail as on a full disk.
    let big = line(
        "big",
        &[r.url("/a")],
        &serde_json::json!("z".repeat(900_000)),
    );
    let out = collect(
        Command::new("sh")
            .arg("-c")
            .arg("ulimit -f 300; trap '' XFSZ; exec \"$0\" \"$@\"")
            .arg(BIN)
            .args(db.args())
            .args(["enqueue", "--actor", "fay", "--allow-private-destinations"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        &big,
    );
    assert_eq!(out.code(), Some(1), "{}", out.stderr);
    let err = out.stderr.lines().last().unwrap_or_default();
    assert!(err.starts_with("error: nothing enqueued"), "{err}");
    said_once(err);
    assert_eq!(pending(&db), 1);
}

/// The state column of one lane in `lanes --json`.
fn lane_json(db: &Db, actor: &str, recipient: &str) -> Value {
    let lanes = ok(db, &["lanes", "--actor", actor, "--json"], "").json();
    lanes["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["recipient"] == recipient)
        .cloned()
        .unwrap_or_else(|| panic!("no lane to {recipient}: {lanes}"))
}

fn lane_op(db: &Db, op: &str, actor: &str, recipient: &str) -> Value {
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
        "",
    )
    .json()
}

#[test]
fn lane_controls_pause_resume_retry_purge() {
    lane_controls(&Db::sqlite());
}

#[test]
fn lane_controls_on_postgres() {
    match Db::postgres() {
        Some(db) => lane_controls(&db),
        None => eprintln!("skipped: OUTBOX_LANES_TEST_PG is not set"),
    }
}

fn lane_controls(db: &Db) {
    let r = Recipient::start().unwrap();
    let (p, q) = (r.url("/p"), r.url("/q"));
    ok(
        db,
        &["enqueue", "--actor", "a"],
        &rows(4, &[p.clone(), q.clone()]),
    );

    // A paused lane receives nothing while the others flow...
    let out = lane_op(db, "pause", "a", &p);
    assert_eq!(out["lane"]["paused"], true, "{out}");
    ok(db, &["drain"], "");
    assert_eq!(served(&r, "/q"), [0, 1, 2, 3]);
    assert!(r.requests("/p").is_empty());
    assert_eq!(lane_json(db, "a", &p)["depth"], 4);
    // ...and resumes in order.
    lane_op(db, "resume", "a", &p);
    ok(db, &["drain"], "");
    assert_eq!(served(&r, "/p"), [0, 1, 2, 3]);

    // Retry probes a lane in backoff at once: after one failure (--pass-attempts 1) the lane
    // backs off (30 s at level 1), so a drain right after delivers nothing; after retry it does.
    r.script("/p", [Reply::Status(503)]);
    ok(
        db,
        &["enqueue", "--actor", "a"],
        &line(
            "b0",
            std::slice::from_ref(&p),
            &serde_json::json!({ "n": 10 }),
        ),
    );
    ok(db, &["drain", "--pass-attempts", "1"], "");
    assert_eq!(lane_json(db, "a", &p)["backoff_level"], 1);
    ok(db, &["drain"], "");
    assert_eq!(
        served(&r, "/p"),
        [0, 1, 2, 3],
        "delivered during the backoff"
    );
    let out = lane_op(db, "retry", "a", &p);
    assert_eq!(out["lane"]["backoff_level"], 0, "{out}");
    ok(db, &["drain"], "");
    assert_eq!(served(&r, "/p"), [0, 1, 2, 3, 10]);

    // Purge dead-letters only that lane's pending units, in order.
    ok(
        db,
        &["enqueue", "--actor", "a"],
        &rows(3, &[p.clone(), q.clone()]).replace("row-", "c-"),
    );
    lane_op(db, "pause", "a", &p);
    let out = lane_op(db, "purge", "a", &p);
    assert_eq!(out["dead_lettered"], 3, "{out}");
    let dead = ok(db, &["dead-letters", "list", "--actor", "a", "--json"], "").json();
    let dead = dead["dead_letters"].as_array().unwrap();
    assert_eq!(
        dead.iter()
            .map(|d| (
                d["row_id"].as_str().unwrap(),
                d["reason"].as_str().unwrap(),
                d["recipient"].as_str().unwrap()
            ))
            .collect::<Vec<_>>(),
        [
            ("c-0", "purged", p.as_str()),
            ("c-1", "purged", p.as_str()),
            ("c-2", "purged", p.as_str())
        ]
    );
    lane_op(db, "resume", "a", &p);
    ok(db, &["drain"], "");
    assert_eq!(served(&r, "/q"), [0, 1, 2, 3, 0, 1, 2]);
    assert_eq!(
        served(&r, "/p"),
        [0, 1, 2, 3, 10],
        "a purged unit was delivered"
    );

    // A lane that does not exist, or a bad URL: usage errors naming it.
    let out = run(
        db,
        &[
            "lanes",
            "pause",
            "--actor",
            "a",
            "--recipient",
            &r.url("/none"),
        ],
        "",
    );
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("has no lane to"), "{}", out.stderr);
    let out = run(
        db,
        &["lanes", "retry", "--actor", "a", "--recipient", "not a url"],
        "",
    );
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--recipient"), "{}", out.stderr);
    let out = run(
        db,
        &["lanes", "retry", "--actor", "nobody", "--recipient", &p],
        "",
    );
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
}

#[test]
fn strict_lane_holds_its_followers_until_retry_or_skip_head() {
    strict_lane(&Db::sqlite());
}

#[test]
fn strict_lane_on_postgres() {
    match Db::postgres() {
        Some(db) => strict_lane(&db),
        None => eprintln!("skipped: OUTBOX_LANES_TEST_PG is not set"),
    }
}

fn strict_lane(db: &Db) {
    let r = Recipient::start().unwrap();
    let (p, q) = (r.url("/p"), r.url("/q"));
    ok(
        db,
        &["enqueue", "--actor", "s"],
        &rows(3, &[p.clone(), q.clone()]),
    );
    let out = lane_op(db, "strict", "s", &p);
    assert_eq!(out["lane"]["strict"], true, "{out}");

    // The head is refused for good: a strict lane blocks instead of dead-lettering it, and
    // holds its followers; the other lane flows.
    r.script("/p", [Reply::Status(422)]);
    ok(db, &["drain"], "");
    assert_eq!(served(&r, "/q"), [0, 1, 2]);
    assert_eq!(r.requests("/p").len(), 1);
    let l = lane_json(db, "s", &p);
    assert_eq!(
        (l["paused"].clone(), l["depth"].clone()),
        (Value::Bool(true), 3.into()),
        "{l}"
    );
    ok(db, &["drain"], "");
    assert_eq!(r.requests("/p").len(), 1, "a blocked lane was attempted");
    assert_eq!(pending(db), 3);
    // Retry probes the head again (now accepted) and the lane resumes in order.
    lane_op(db, "retry", "s", &p);
    ok(db, &["drain"], "");
    assert_eq!(served(&r, "/p"), [0, 1, 2]);

    // Blocked again; skip-head sets the head aside and the followers go on in order.
    ok(
        db,
        &["enqueue", "--actor", "s"],
        &rows(3, std::slice::from_ref(&p)).replace("row-", "d-"),
    );
    r.script("/p", [Reply::Status(422)]);
    ok(db, &["drain"], "");
    assert_eq!(lane_json(db, "s", &p)["paused"], true);
    let out = lane_op(db, "skip-head", "s", &p);
    assert_eq!(out["dead_lettered"], 1, "{out}");
    assert_eq!(out["lane"]["paused"], false, "{out}");
    ok(db, &["drain"], "");
    assert_eq!(served(&r, "/p"), [0, 1, 2, 1, 2]);
    let dead = ok(db, &["dead-letters", "list", "--actor", "s", "--json"], "").json();
    let dead = dead["dead_letters"].as_array().unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0]["row_id"].as_str(), dead[0]["reason"].as_str()),
        (Some("d-0"), Some("skipped"))
    );
    // skip-head on an empty lane says so and sets nothing aside.
    let out = lane_op(db, "skip-head", "s", &p);
    assert_eq!(out["dead_lettered"], 0, "{out}");
}

/// The settings precedence: a flag over its environment variable over the `--config` file
/// over the built-in default, seen by the recipient (User-Agent) and in the outcome (a single
/// attempt dead-letters when the file sets max-attempts = 1).
#[test]
fn config_file_env_and_flags_in_that_order() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("outbox-lanes.toml");
    std::fs::write(
        &file,
        "user-agent = \"from-file/1\"\nmax_attempts = 1\npass-attempts = 1\nretry-delays = [\"10ms\"]\n",
    )
    .unwrap();
    let cfg = file.display().to_string();
    let ua = |n: usize| {
        r.requests("/a")
            .get(n)
            .and_then(|q| q.header("user-agent").map(str::to_owned))
    };
    let drain = |extra_env: Option<(&str, &str)>, args: &[&str]| {
        ok(
            &db,
            &["enqueue", "--actor", "c"],
            &rows(1, &[r.url("/a")]).replace("row-", &format!("x{}-", r.requests("/a").len())),
        );
        let mut c = command(&db, &[&["drain", "--config", &cfg], args].concat());
        if let Some((k, v)) = extra_env {
            c.env(k, v);
        }
        let out = collect(c.spawn().unwrap(), "");
        assert_eq!(out.code(), Some(0), "{}", out.stderr);
    };
    drain(None, &[]);
    assert_eq!(ua(0).as_deref(), Some("from-file/1"));
    drain(Some(("OUTBOX_LANES_USER_AGENT", "from-env/1")), &[]);
    assert_eq!(ua(1).as_deref(), Some("from-env/1"));
    drain(
        Some(("OUTBOX_LANES_USER_AGENT", "from-env/1")),
        &["--user-agent", "from-flag/1"],
    );
    assert_eq!(ua(2).as_deref(), Some("from-flag/1"));

    // max_attempts = 1 from the file: one refused attempt (503) is a dead letter at once.
    r.script("/a", [Reply::Status(503)]);
    drain(None, &[]);
    let dead = ok(&db, &["dead-letters", "list", "--json"], "").json();
    assert_eq!(dead["dead_letters"][0]["reason"], "exhausted", "{dead}");
    assert_eq!(dead["dead_letters"][0]["attempts"], 1, "{dead}");

    // A key that names no flag is refused before anything runs.
    std::fs::write(&file, "concurency = 4\n").unwrap();
    let out = run(&db, &["drain", "--config", &cfg], "");
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("concurency"), "{}", out.stderr);
}

/// Shell completions and the man page come from the command definition, without a database.
#[test]
fn completions_and_man_page() {
    let db = Db::sqlite();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = ok(&db, &["completions", shell], "");
        for sub in [
            "enqueue",
            "drain",
            "relay",
            "lanes",
            "skip-head",
            "dead-letters",
        ] {
            assert!(out.stdout.contains(sub), "{shell} completions lack {sub}");
        }
    }
    let man = ok(&db, &["man"], "");
    assert!(man.stdout.contains(".TH outbox-lanes 1"), "{}", man.stdout);
    assert!(man.stdout.contains("dead\\-letters"), "{}", man.stdout);
    let Db::Sqlite { path, .. } = &db else {
        unreachable!()
    };
    assert!(!path.exists(), "a database was created");
    let out = run(&db, &["completions", "tcsh"], "");
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
}

/// The one request a path received (each row of these tests has paths of its own).
fn only_request(r: &Recipient, path: &str) -> outbox_lanes_test_support::Recorded {
    let mut got = r.requests(path);
    assert_eq!(got.len(), 1, "{path}: {} requests", got.len());
    got.remove(0)
}

/// A row's body goes out as given: a string for a content type that is not JSON as its own
/// text, JSON content types as JSON text, `body_base64` as its bytes; a row's headers go out
/// with every delivery, to every recipient, and again after a dead letter is replayed.
fn rows_are_sent_as_given(db: &Db) {
    let r = Recipient::start().unwrap();
    r.script("/dead-once", [Reply::Status(400)]);
    let input = [
        serde_json::json!({"id": "text", "to": [r.url("/text")], "body": "hello \"you\"\n", "content_type": "text/plain; charset=utf-8"}),
        serde_json::json!({"id": "json", "to": [r.url("/json")], "body": "hello"}),
        serde_json::json!({"id": "activity", "to": [r.url("/activity")], "body": "hi", "content_type": "Application/Activity+JSON; profile=x"}),
        serde_json::json!({"id": "object", "to": [r.url("/object")], "body": {"a": [1, 2]}, "content_type": "text/plain"}),
        serde_json::json!({"id": "b64", "to": [r.url("/b64")], "body_base64": "AAEC/w=="}),
        serde_json::json!({"id": "headers", "to": [r.url("/h1"), r.url("/h2")], "body": 1,
            "headers": {"Authorization": "Bearer t0k3n", "X-Trace": "42"}}),
        serde_json::json!({"id": "dead", "to": [r.url("/dead-once")], "body": "again", "content_type": "text/plain",
            "headers": {"X-Replayed": "yes"}}),
    ]
    .iter()
    .map(|l| l.to_string() + "\n")
    .collect::<String>();
    ok(db, &["enqueue", "--actor", "rita"], &input);
    ok(db, &["drain"], "");

    let text = only_request(&r, "/text");
    assert_eq!(text.body, b"hello \"you\"\n");
    assert_eq!(
        text.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(only_request(&r, "/json").body, b"\"hello\"");
    assert_eq!(only_request(&r, "/activity").body, b"\"hi\"");
    assert_eq!(only_request(&r, "/object").body, b"{\"a\":[1,2]}");
    let b64 = only_request(&r, "/b64");
    assert_eq!(b64.body, [0u8, 1, 2, 255]);
    assert_eq!(b64.header("content-type"), Some("application/octet-stream"));
    for path in ["/h1", "/h2"] {
        let q = only_request(&r, path);
        assert_eq!(q.header("authorization"), Some("Bearer t0k3n"), "{path}");
        assert_eq!(q.header("x-trace"), Some("42"), "{path}");
        assert_eq!(q.header("content-type"), Some("application/json"), "{path}");
        assert!(q.header("idempotency-key").is_some(), "{path}");
    }
    assert!(only_request(&r, "/text").header("authorization").is_none());

    // Dead-lettered at the 400, replayed: sent again with its headers.
    ok(db, &["dead-letters", "replay", "--actor", "rita"], "");
    ok(db, &["drain"], "");
    let again = r.requests("/dead-once");
    assert_eq!(again.len(), 2);
    for q in &again {
        assert_eq!(q.body, b"again");
        assert_eq!(q.header("x-replayed"), Some("yes"));
    }
    assert_eq!(again[1].completion.status(), Some(200));
}

#[test]
fn rows_are_sent_as_given_sqlite() {
    rows_are_sent_as_given(&Db::sqlite());
}

#[test]
fn rows_are_sent_as_given_postgres() {
    let Some(db) = Db::postgres() else { return };
    rows_are_sent_as_given(&db);
}

/// `command` without the `--allow-private-destinations` every other test passes.
fn run_strict(db: &Db, args: &[&str], stdin: &str) -> Out {
    let mut c = Command::new(BIN);
    c.args(db.args())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    collect(c.spawn().unwrap(), stdin)
}

#[test]
fn enqueue_refuses_destinations_delivery_would_refuse() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    let public = line(
        "pub",
        &["https://example.org/inbox".into()],
        &serde_json::json!(1),
    );
    for (to, class) in [
        (r.url("/a"), "loopback"),
        ("http://localhost:9/inbox".to_owned(), "loopback"),
        ("http://[::1]:9/inbox".to_owned(), "loopback"),
        ("http://10.0.0.7/inbox".to_owned(), "private"),
    ] {
        let input = format!(
            "{public}\n{}\n",
            line("x", std::slice::from_ref(&to), &serde_json::json!(1))
        );
        let out = run_strict(&db, &["enqueue", "--actor", "sam"], &input);
        assert_eq!(out.code(), Some(2), "{to}: {}", out.stderr);
        for needle in [
            "line 2",
            &to,
            class,
            "--allow-private-destinations",
            "outbox-lanes destinations set",
            "nothing enqueued",
        ] {
            assert!(
                out.stderr.contains(needle),
                "{to}: {:?} lacks {needle:?}",
                out.stderr
            );
        }
    }
    // Nothing was enqueued by any of them (not even the good first line).
    assert!(!matches!(&db, Db::Sqlite { path, .. } if path.exists()));

    // Cloud metadata stays refused with the flag, and the message does not offer it.
    let meta = line(
        "m",
        &["http://169.254.169.254/latest".into()],
        &serde_json::json!(1),
    );
    let out = run_strict(
        &db,
        &["enqueue", "--actor", "sam", "--allow-private-destinations"],
        &meta,
    );
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("whatever the binary's flags say"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("pass --allow"), "{}", out.stderr);

    // With the flag on enqueue itself the loopback recipient is accepted, and delivered by a
    // drain that allows it too.
    let input = format!("{}\n", line("x", &[r.url("/a")], &serde_json::json!(1)));
    let out = run_strict(
        &db,
        &["enqueue", "--actor", "sam", "--allow-private-destinations"],
        &input,
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    ok(&db, &["drain"], "");
    assert_eq!(r.count("/a"), 1);
}

#[test]
fn enqueue_help_shows_the_line_format() {
    let out = run_strict(&Db::sqlite(), &["enqueue", "--help"], "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    for needle in [
        "body_base64",
        "content_type",
        "headers",
        "dedup_key",
        "ordering_key",
        "joined",
        "Example:",
        "{\"id\": \"n-1\"",
        "--allow-private-destinations",
    ] {
        assert!(
            out.stdout.contains(needle),
            "help lacks {needle:?}:\n{}",
            out.stdout
        );
    }
}

/// Every stderr line of a run, parsed as JSON: the test fails on the first line that is not.
fn json_lines(stderr: &str) -> Vec<Value> {
    stderr
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n{stderr}"))
        })
        .collect()
}

/// The events whose message is `message`.
fn events<'a>(logs: &'a [Value], message: &str) -> Vec<&'a Value> {
    logs.iter()
        .filter(|v| v["fields"]["message"] == message)
        .collect()
}

/// No field holds Rust debug text of an absent or wrapped value.
fn assert_typed(logs: &[Value]) {
    for v in logs {
        for (k, f) in v["fields"].as_object().unwrap() {
            if let Some(s) = f.as_str() {
                let raw_millis = s
                    .strip_suffix("ms")
                    .is_some_and(|n| n.parse::<u64>().is_ok());
                assert!(
                    !s.starts_with("Some(") && s != "None" && !raw_millis,
                    "{k} is debug text: {v}"
                );
            }
        }
    }
}

fn rfc3339(v: &Value) -> std::time::SystemTime {
    let s = v.as_str().unwrap_or_else(|| panic!("not a string: {v}"));
    humantime::parse_rfc3339(s).unwrap_or_else(|e| panic!("not RFC 3339 ({e}): {s}"))
}

#[test]
fn json_logs_are_json_on_every_stderr_line() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    // /gone refuses its first unit for good; /slow is throttled once for 2 s (longer than the
    // first in-pass delay, so the Retry-After sets the lane's next attempt). /ok answers
    // slowly: its lane keeps the pass running until the throttle is over (a pass with only
    // throttled lanes left would end and hand them back), and past the first progress report.
    r.set_default("/ok", Reply::Status(200).after(Duration::from_millis(1500)));
    r.script("/gone", [Reply::Status(422)]);
    r.script(
        "/slow",
        [Reply::Response(
            outbox_lanes_test_support::Response::new(429).with_header("Retry-After", "2"),
        )],
    );
    let to = [r.url("/ok"), r.url("/gone"), r.url("/slow")];
    ok(&db, &["enqueue", "--actor", "jo"], &rows(3, &to));
    let out = ok(&db, &["--log-format", "json", "drain"], "");
    let logs = json_lines(&out.stderr);
    assert_typed(&logs);
    for v in &logs {
        assert!(v["level"].is_string(), "{v}");
        rfc3339(&v["timestamp"]);
    }

    let dead = events(&logs, "dead-lettered");
    assert_eq!(dead.len(), 1, "{}", out.stderr);
    let f = &dead[0]["fields"];
    assert_eq!(f["actor"], "jo");
    assert_eq!(f["recipient"], r.url("/gone"));
    assert_eq!(f["status"], 422, "a number: {f}");
    assert_eq!(f["reason"], "permanent");
    assert_eq!(f["row"], "row-0");
    assert!(f["unit"].is_u64(), "a number: {f}");

    let throttled = events(&logs, "lane throttled by Retry-After");
    assert_eq!(throttled.len(), 1, "{}", out.stderr);
    let f = &throttled[0]["fields"];
    assert_eq!(f["actor"], "jo");
    assert_eq!(f["recipient"], r.url("/slow"));
    assert_eq!(f["status"], 429);
    assert!(f.get("level").is_none(), "absent, not null: {f}");
    assert!(rfc3339(&f["next_attempt"]) > rfc3339(&throttled[0]["timestamp"]));
    let recovered = events(&logs, "lane recovered");
    assert_eq!(recovered.len(), 1, "{}", out.stderr);
    assert_eq!(recovered[0]["fields"]["recipient"], r.url("/slow"));

    let progress = events(&logs, "drain progress");
    assert!(!progress.is_empty(), "{}", out.stderr);
    for p in progress {
        assert!(p["fields"]["delivered"].is_u64(), "{p}");
        assert!(p["fields"]["lanes_in_backoff"].is_u64(), "{p}");
    }
    let summary = events(&logs, "drain summary");
    assert_eq!(summary.len(), 1, "{}", out.stderr);
    let f = &summary[0]["fields"];
    assert_eq!(
        (&f["delivered"], &f["dead_lettered"], &f["remaining"]),
        (&8.into(), &1.into(), &0.into()),
        "{f}"
    );
    assert_eq!(served(&r, "/slow"), [0, 1, 2]);
    // The delivery that ended the throttle cleared it.
    let slow_lane = || {
        ok(&db, &["lanes", "--actor", "jo", "--json"], "").json()["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["recipient"] == r.url("/slow"))
            .unwrap()
            .clone()
    };
    let l = slow_lane();
    assert_eq!(
        (&l["state"], &l["not_before"]),
        (&"open".into(), &Value::Null),
        "{l}"
    );

    // --no-progress: the same run has no progress events, and still its summary.
    r.set_default("/ok", Reply::Status(200));
    r.script(
        "/slow",
        [Reply::Response(
            outbox_lanes_test_support::Response::new(429).with_header("Retry-After", "2"),
        )],
    );
    ok(
        &db,
        &["enqueue", "--actor", "jo"],
        &line("late", &[r.url("/slow")], &serde_json::json!({ "n": 3 })),
    );
    let out = ok(&db, &["--log-format", "json", "drain", "--no-progress"], "");
    let logs = json_lines(&out.stderr);
    assert_eq!(events(&logs, "lane throttled by Retry-After").len(), 1);
    assert!(events(&logs, "drain progress").is_empty(), "{}", out.stderr);
    assert_eq!(events(&logs, "drain summary").len(), 1, "{}", out.stderr);
    // The pass ended with the lane throttled; once its Retry-After is over, the next drain
    // delivers, logs the recovery and clears the throttle.
    assert_eq!(slow_lane()["state"], "throttled");
    let deadline = Instant::now() + Duration::from_secs(30);
    while slow_lane()["state"] != "open" {
        assert!(Instant::now() < deadline, "the throttle never ended");
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = ok(&db, &["--log-format", "json", "drain", "--no-progress"], "");
    let logs = json_lines(&out.stderr);
    let recovered = events(&logs, "lane recovered");
    assert_eq!(recovered.len(), 1, "{}", out.stderr);
    assert_eq!(recovered[0]["fields"]["after_level"], 0);
    assert_eq!(slow_lane()["not_before"], Value::Null);
    assert_eq!(served(&r, "/slow"), [0, 1, 2, 3]);

    // A run-time failure's message is a JSON line too.
    let out = run(
        &db,
        &["--log-format", "json", "lanes", "--actor", "nobody"],
        "",
    );
    assert_eq!(out.code(), Some(2));
    let logs = json_lines(&out.stderr);
    assert_eq!(logs.last().unwrap()["level"], "ERROR", "{}", out.stderr);
}

#[test]
fn info_lines_follow_a_lane_through_backoff_probe_and_recovery() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    // /flaky fails once; with --pass-attempts 1 that failure stalls its lane into backoff.
    r.script("/flaky", [Reply::Status(503)]);
    let (flaky, steady) = (r.url("/flaky"), r.url("/steady"));
    ok(
        &db,
        &["enqueue", "--actor", "kim"],
        &rows(2, &[flaky.clone(), steady.clone()]),
    );
    let out = ok(
        &db,
        &["--log-format", "json", "drain", "--pass-attempts", "1"],
        "",
    );
    let logs = json_lines(&out.stderr);
    let entered = events(&logs, "lane entered backoff");
    assert_eq!(entered.len(), 1, "{}", out.stderr);
    let f = &entered[0]["fields"];
    assert_eq!(f["actor"], "kim");
    assert_eq!(f["recipient"], flaky);
    assert_eq!(f["status"], 503);
    assert_eq!(f["level"], 1);
    let next = rfc3339(&f["next_attempt"]);
    assert!(next > rfc3339(&entered[0]["timestamp"]));
    let summary = &events(&logs, "drain summary")[0]["fields"];
    assert_eq!(summary["lanes_in_backoff"], 1, "{summary}");
    assert_eq!(summary["remaining"], 2, "{summary}");
    assert_eq!(served(&r, "/steady"), [0, 1]);

    // `lanes` and `status` say the same thing about the lane.
    let lanes = ok(&db, &["lanes", "--actor", "kim", "--json"], "").json();
    let lane = |lanes: &Value, url: &str| {
        lanes["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["recipient"] == url)
            .unwrap()
            .clone()
    };
    let l = lane(&lanes, &flaky);
    assert_eq!(
        (&l["state"], &l["backoff_level"]),
        (&"backoff".into(), &1.into())
    );
    assert_eq!(
        (&l["last_status"], &l["last_error_stale"]),
        (&503.into(), &false.into())
    );
    assert_eq!(rfc3339(&l["not_before"]), next);
    assert_eq!(lane(&lanes, &steady)["state"], "open");
    let st = status(&db);
    let k = actor(&st, "kim").unwrap();
    let waiting = k["lanes_in_backoff"].as_array().unwrap();
    assert_eq!(waiting.len(), 1, "{k}");
    assert_eq!(waiting[0]["recipient"], flaky);
    assert_eq!(waiting[0]["state"], "backoff");
    assert_eq!(waiting[0]["backoff_level"], 1);
    assert_eq!(rfc3339(&waiting[0]["next_attempt"]), next);
    assert_eq!(k["lanes_paused"], serde_json::json!([]));
    assert!(k["slot"].is_null(), "no pass runs: {k}");
    let table = ok(&db, &["status"], "").stdout;
    assert!(table.contains("backoff 1"), "{table}");
    let table = ok(&db, &["lanes", "--actor", "kim"], "").stdout;
    assert!(
        table.contains("backoff 1") && table.contains("503"),
        "{table}"
    );

    // The backoff's time passes (the lane's next attempt is moved into the past).
    let Db::Sqlite { path, .. } = &db else {
        unreachable!()
    };
    rusqlite::Connection::open(path)
        .unwrap()
        .execute(
            "UPDATE ol_lanes SET not_before = 1 WHERE backoff_level > 0",
            [],
        )
        .unwrap();
    let out = ok(&db, &["--log-format", "json", "drain"], "");
    let logs = json_lines(&out.stderr);
    let probed = events(&logs, "lane probed: one attempt at its head");
    assert_eq!(probed.len(), 1, "{}", out.stderr);
    assert_eq!(probed[0]["fields"]["recipient"], flaky);
    assert_eq!(probed[0]["fields"]["level"], 1);
    let recovered = events(&logs, "lane recovered");
    assert_eq!(recovered.len(), 1, "{}", out.stderr);
    assert_eq!(recovered[0]["fields"]["recipient"], flaky);
    assert_eq!(recovered[0]["fields"]["after_level"], 1);
    let order: Vec<&str> = logs
        .iter()
        .filter_map(|v| v["fields"]["message"].as_str())
        .filter(|m| m.starts_with("lane "))
        .collect();
    assert_eq!(
        order,
        ["lane probed: one attempt at its head", "lane recovered"]
    );
    assert_eq!(served(&r, "/flaky"), [0, 1]);
    let l = lane(
        &ok(&db, &["lanes", "--actor", "kim", "--json"], "").json(),
        &flaky,
    );
    assert_eq!(l["state"], "open");
    assert_eq!(
        (&l["last_status"], &l["last_error_stale"]),
        (&503.into(), &true.into())
    );
    let table = ok(&db, &["lanes", "--actor", "kim"], "").stdout;
    assert!(table.contains("(stale)"), "{table}");
}

#[test]
fn status_shows_the_slot_holder_while_a_pass_runs() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    r.set_default("/hang", Reply::Hang);
    ok(
        &db,
        &["enqueue", "--actor", "ray"],
        &rows(1, &[r.url("/hang")]),
    );
    // The attempt hangs until its timeout, then the unit is a dead letter and the drain ends.
    let drain = command(&db, &["drain", "--timeout", "5s", "--max-attempts", "1"])
        .spawn()
        .unwrap();
    let pid = drain.id();
    assert!(
        r.wait_for("/hang", 1, RUN_BOUND),
        "the attempt never arrived"
    );
    let st = status(&db);
    let a = actor(&st, "ray").unwrap();
    assert_eq!(a["in_flight"], true, "{a}");
    let holder = a["slot"]["holder"].as_str().unwrap();
    assert!(holder.starts_with(&format!("pid{pid}-")), "{a}");
    assert!(
        rfc3339(&a["slot"]["lease_expires"]) > std::time::SystemTime::now(),
        "{a}"
    );
    let table = ok(&db, &["status"], "").stdout;
    assert!(table.contains(holder), "{table}");
    let out = collect(drain, "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let a = status(&db);
    let a = actor(&a, "ray").unwrap();
    assert!(a["slot"].is_null(), "{a}");
}

fn dead_ids(db: &Db, filter: &[&str]) -> Vec<i64> {
    let mut args = vec!["dead-letters", "list", "--json"];
    args.extend_from_slice(filter);
    ok(db, &args, "").json()["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_i64().unwrap())
        .collect()
}

/// Dead letters of two reasons, two recipients and two actors; returns the recipient.
fn four_dead_letters(db: &Db) -> Recipient {
    let r = Recipient::start().unwrap();
    r.set_default("/bad", Reply::Status(422));
    r.set_default("/gone", Reply::Status(410));
    let (bad, gone) = (r.url("/bad"), r.url("/gone"));
    let dora = line(
        "d0",
        &[bad.clone(), gone.clone()],
        &serde_json::json!({ "n": 0 }),
    ) + "\n"
        + &line(
            "d1",
            std::slice::from_ref(&bad),
            &serde_json::json!({ "n": 1 }),
        );
    ok(db, &["enqueue", "--actor", "dora"], &dora);
    ok(
        db,
        &["enqueue", "--actor", "emma"],
        &line("e0", &[bad], &serde_json::json!({ "n": 2 })),
    );
    ok(db, &["drain"], "");
    assert_eq!(dead_ids(db, &[]).len(), 4);
    r
}

fn dead_letter_operations(db: &Db) {
    let r = four_dead_letters(db);
    let (bad, gone) = (r.url("/bad"), r.url("/gone"));

    // Filters, alone and combined; a recipient is compared in its canonical spelling.
    let gone_ids = dead_ids(db, &["--reason", "gone"]);
    assert_eq!(gone_ids.len(), 1);
    assert_eq!(dead_ids(db, &["--reason", "permanent"]).len(), 3);
    assert_eq!(dead_ids(db, &["--recipient", &bad]).len(), 3);
    let shouted = bad.replace("http://", "HTTP://");
    assert_eq!(dead_ids(db, &["--recipient", &shouted]).len(), 3);
    assert_eq!(
        dead_ids(db, &["--actor", "dora", "--recipient", &bad]).len(),
        2
    );
    assert_eq!(dead_ids(db, &["--recipient", &gone]), gone_ids);
    assert_eq!(dead_ids(db, &["--older-than", "0s"]).len(), 4);
    assert!(dead_ids(db, &["--older-than", "1h"]).is_empty());
    let out = run(db, &["dead-letters", "list", "--reason", "late"], "");
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("lane_retired"), "{}", out.stderr);

    // show: the dead letter with its payload, in JSON and as text.
    let id = gone_ids[0].to_string();
    let shown = ok(db, &["dead-letters", "show", "--id", &id, "--json"], "").json();
    assert_eq!(shown["id"], gone_ids[0]);
    assert_eq!(shown["actor"], "dora");
    assert_eq!(shown["row_id"], "d0");
    assert_eq!(shown["recipient"], gone);
    assert_eq!(shown["reason"], "gone");
    assert_eq!(shown["last_status"], 410);
    assert_eq!(shown["payload"]["content_type"], "application/json");
    assert_eq!(shown["payload"]["body"], serde_json::json!({ "n": 0 }));
    let text = ok(db, &["dead-letters", "show", "--id", &id], "").stdout;
    assert!(text.contains(&gone) && text.contains("gone"), "{text}");
    assert!(text.lines().any(|l| l == r#"{"n":0}"#), "{text}");
    let out = run(db, &["dead-letters", "show", "--id", "999999"], "");
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("no dead letter with id 999999"),
        "{}",
        out.stderr
    );

    // Dry runs print what they would do and change nothing.
    let dry = ok(
        db,
        &[
            "dead-letters",
            "replay",
            "--reason",
            "gone",
            "--dry-run",
            "--json",
        ],
        "",
    )
    .json();
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["would_replay"], 1);
    assert_eq!(dry["dead_letters"][0]["id"], gone_ids[0]);
    let dry = ok(
        db,
        &[
            "dead-letters",
            "purge",
            "--actor",
            "dora",
            "--recipient",
            &bad,
            "--dry-run",
        ],
        "",
    )
    .stdout;
    assert!(
        dry.starts_with("dry run: would purge 2 dead letter(s)"),
        "{dry}"
    );
    assert_eq!(dead_ids(db, &[]).len(), 4);
    assert_eq!(pending(db), 0);

    // Purge and replay with no selector are refused, naming --all; --all takes no selector.
    for args in [
        &["dead-letters", "purge"][..],
        &["dead-letters", "purge", "--json"][..],
        &["dead-letters", "purge", "--dry-run"][..],
        &["dead-letters", "replay"][..],
        &["dead-letters", "replay", "--dry-run"][..],
    ] {
        let out = run(db, args, "");
        assert_eq!(out.code(), Some(2), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("--all"), "{}", out.stderr);
    }
    let out = run(
        db,
        &["dead-letters", "purge", "--all", "--actor", "dora"],
        "",
    );
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert_eq!(dead_ids(db, &[]).len(), 4);
    // The three take the same selectors: `list --all` is every one, `replay --all --dry-run`
    // would put every one back.
    let listed = ok(db, &["dead-letters", "list", "--all", "--json"], "").json();
    assert_eq!(listed["dead_letters"].as_array().map(Vec::len), Some(4));
    let dry = ok(
        db,
        &["dead-letters", "replay", "--all", "--dry-run", "--json"],
        "",
    )
    .json();
    assert_eq!(dry["would_replay"], 4);
    for (sub, word) in [("list", "purged"), ("list", "skipped"), ("replay", "--all")] {
        let help = ok(db, &["dead-letters", sub, "--help"], "");
        assert!(help.stdout.contains(word), "{sub} --help: {}", help.stdout);
    }

    // The filters select what replay and purge act on.
    let purged = ok(
        db,
        &[
            "dead-letters",
            "purge",
            "--actor",
            "dora",
            "--reason",
            "permanent",
            "--json",
        ],
        "",
    )
    .json();
    assert_eq!(purged["purged"], 2);
    let replayed = ok(
        db,
        &["dead-letters", "replay", "--reason", "gone", "--json"],
        "",
    )
    .json();
    assert_eq!(replayed["replayed"], 1);
    assert_eq!(pending(db), 1);
    assert_eq!(dead_ids(db, &[]).len(), 1);
    // --dry-run from the environment, in any of the usual spellings.
    for yes in ["1", "true", "yes"] {
        let out = collect(
            command(db, &["dead-letters", "purge", "--all"])
                .env("OUTBOX_LANES_DRY_RUN", yes)
                .spawn()
                .unwrap(),
            "",
        );
        assert_eq!(out.code(), Some(0), "{yes}: {}", out.stderr);
        assert!(
            out.stdout.starts_with("dry run: would purge 1"),
            "{}",
            out.stdout
        );
    }
    assert_eq!(dead_ids(db, &[]).len(), 1);
    let purged = ok(db, &["dead-letters", "purge", "--all", "--json"], "").json();
    assert_eq!(purged["purged"], 1);
    assert!(dead_ids(db, &[]).is_empty());
}

#[test]
fn dead_letters_show_filter_dry_run_and_purge_all() {
    dead_letter_operations(&Db::sqlite());
}

#[test]
fn dead_letters_show_filter_dry_run_and_purge_all_on_postgres() {
    let Some(db) = Db::postgres() else {
        return;
    };
    dead_letter_operations(&db);
}

fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn relay_serves_health_readiness_and_the_oldest_pending_age() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    // Never served: the backlog stays, its lane in backoff.
    r.set_default("/down", Reply::Status(503));
    ok(
        &db,
        &["enqueue", "--actor", "hank"],
        &rows(3, &[r.url("/down")]),
    );
    let port = free_port();
    // A host name, given through the environment.
    let relay = command(&db, &["relay"])
        .env("OUTBOX_LANES_METRICS_ADDR", format!("localhost:{port}"))
        .spawn()
        .unwrap();
    assert!(r.wait_for("/down", 1, Duration::from_secs(60)));
    let (code, body) = get_until(port, "/healthz", |c, _| c == 200);
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let (code, body) = get_until(port, "/readyz", |c, _| c == 200);
    assert_eq!((code, body.as_str()), (200, "ready\n"));
    let (code, _) = get_until(port, "/nope", |_, _| true);
    assert_eq!(code, 404);
    let name = "outbox_lanes_oldest_pending_seconds{actor=\"hank\"}";
    let (code, text) = get_until(port, "/metrics", |_, t| {
        sample(t, name).is_some_and(|age| age > 0.0)
    });
    assert_eq!(code, 200, "{text}");
    assert!(
        text.contains("# TYPE outbox_lanes_oldest_pending_seconds gauge"),
        "{text}"
    );
    assert!(sample(&text, name).is_some_and(|age| age > 0.0), "{text}");
    sigterm(&relay);
    let out = collect(relay, "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert_eq!(pending(&db), 3);
}

#[test]
fn readyz_is_503_with_the_reason_when_the_store_cannot_answer() {
    let db = Db::sqlite();
    let Db::Sqlite { path, .. } = &db else {
        unreachable!()
    };
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = command(&db, &["relay", "--metrics-addr", &addr])
        .spawn()
        .unwrap();
    let (code, _) = get_until(port, "/readyz", |c, _| c == 200);
    assert_eq!(code, 200);
    // The lanes table goes: the store can no longer answer the probe.
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch("DROP TABLE ol_lanes").unwrap();
    drop(conn);
    let (code, body) = get_until(port, "/readyz", |c, _| c != 200);
    assert_eq!(code, 503, "{body}");
    assert!(
        body.starts_with("not ready: ") && body.contains("ol_lanes"),
        "{body}"
    );
    // Alive all the same.
    assert_eq!(get(port, "/healthz").map(|a| a.0), Some(200));
    sigterm(&relay);
    let _ = collect(relay, "");
}

#[test]
fn bad_metrics_addresses_exit_2() {
    let db = Db::sqlite();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    for (addr, says) in [
        ("9187", "no valid port"),
        ("127.0.0.1:http", "no valid port"),
        (taken.as_str(), "cannot bind"),
    ] {
        let out = run(&db, &["relay", "--metrics-addr", addr], "");
        assert_eq!(out.code(), Some(2), "{addr}: {}", out.stderr);
        assert!(
            out.stderr.contains("--metrics-addr") && out.stderr.contains(says),
            "{addr}: {}",
            out.stderr
        );
    }
}

#[test]
fn on_dead_letter_runs_the_command_with_the_dead_letter_on_stdin() {
    let db = Db::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let r = Recipient::start().unwrap();
    r.set_default("/bad", Reply::Status(422));
    r.set_default("/ok", Reply::Status(200));
    r.set_default("/gone", Reply::Status(410));
    // Each run writes its own file, then fails: logged, and nothing else changes.
    let cmd = format!("cat > {}/dead-$$.json; exit 3", dir.path().display());
    let relay = command(
        &db,
        &["relay", "--retire-on-gone", "--on-dead-letter", &cmd],
    )
    .spawn()
    .unwrap();
    ok(
        &db,
        &["enqueue", "--actor", "ivy"],
        &rows(2, &[r.url("/bad"), r.url("/ok"), r.url("/gone")]),
    );
    assert!(r.wait_for("/ok", 2, Duration::from_secs(60)));
    let mut seen: Vec<Value> = Vec::new();
    for _ in 0..600 {
        seen = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.unwrap().path()).ok())
            .filter_map(|t| serde_json::from_str(&t).ok())
            .collect();
        if seen.len() == 4 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(seen.len(), 4, "{seen:?}");
    seen.sort_by_key(|v| {
        (
            v["recipient"].as_str().unwrap().to_owned(),
            v["row_id"].as_str().unwrap().to_owned(),
        )
    });
    let (bad, gone) = seen.split_at(2);
    for (i, v) in bad.iter().enumerate() {
        assert_eq!(v["actor"], "ivy");
        assert_eq!(v["recipient"], r.url("/bad"));
        assert_eq!(v["row_id"], format!("row-{i}"));
        assert_eq!(v["reason"], "permanent");
        assert_eq!(v["status"], 422);
        assert_eq!(v["attempts"], 1);
        assert!(v["unit"].is_u64() && v["dead_at"].is_string(), "{v}");
    }
    // The 410 dead-letters row-0 and retires the lane: row-1 is dead-lettered unattempted,
    // and the command runs for it too.
    assert_eq!(gone[0]["recipient"], r.url("/gone"));
    assert_eq!(
        (&gone[0]["row_id"], &gone[0]["reason"], &gone[0]["status"]),
        (
            &Value::from("row-0"),
            &Value::from("gone"),
            &Value::from(410)
        )
    );
    assert_eq!(gone[1]["recipient"], r.url("/gone"));
    assert_eq!(
        (&gone[1]["row_id"], &gone[1]["reason"], &gone[1]["attempts"]),
        (
            &Value::from("row-1"),
            &Value::from("lane_retired"),
            &Value::from(0)
        )
    );
    assert_eq!(r.requests("/gone").len(), 1);
    sigterm(&relay);
    let out = collect(relay, "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("--on-dead-letter: the command failed"),
        "{}",
        out.stderr
    );
    assert_eq!(served(&r, "/ok"), [0, 1]);
    // Each command was told the id `dead-letters list` shows for its dead letter.
    let listed = ok(&db, &["dead-letters", "list", "--json"], "").json();
    let mut listed: Vec<(i64, String, String)> = listed["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let text = |k: &str| d[k].as_str().unwrap().to_owned();
            (d["id"].as_i64().unwrap(), text("recipient"), text("row_id"))
        })
        .collect();
    listed.sort();
    let mut told: Vec<(i64, String, String)> = seen
        .iter()
        .map(|v| {
            let id = v["id"].as_i64().unwrap_or_else(|| panic!("an id: {v}"));
            let text = |k: &str| v[k].as_str().unwrap().to_owned();
            (id, text("recipient"), text("row_id"))
        })
        .collect();
    told.sort();
    assert_eq!(told, listed);
    let out = run(&db, &["relay", "--on-dead-letter", " "], "");
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
}

#[test]
fn refused_units_are_dead_lettered_in_lane_order_with_one_hook_run_each() {
    refused_units_dead_lettered(&Db::sqlite());
}

#[test]
fn refused_units_are_dead_lettered_in_lane_order_on_postgres() {
    let Some(db) = Db::postgres() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    refused_units_dead_lettered(&db);
}

/// Rows that `enqueue --allow-private-destinations` accepted, drained by a relay without the
/// flag after an operator narrowed the outbox's destination policy to public: every unit is dead-lettered `destination_refused` (nothing is sent), one lane deep
/// and four shallow ones, and `--on-dead-letter` runs once per dead letter, each lane's in
/// lane order, with the id `dead-letters list` shows.
fn refused_units_dead_lettered(db: &Db) {
    let dir = tempfile::tempdir().unwrap();
    let told = dir.path().join("told.jsonl");
    let deep = "http://127.0.0.1:9/deep".to_owned();
    let shallow: Vec<String> = (0..4).map(|i| format!("http://127.0.0.1:9/s{i}")).collect();
    let mut input = String::new();
    for i in 0..30 {
        input += &(line(
            &format!("d{i}"),
            std::slice::from_ref(&deep),
            &serde_json::json!({ "n": i }),
        ) + "\n");
        if i < 5 {
            for (k, to) in shallow.iter().enumerate() {
                let id = format!("s{k}-{i}");
                input += &(line(
                    &id,
                    std::slice::from_ref(to),
                    &serde_json::json!({ "n": i }),
                ) + "\n");
            }
        }
    }
    ok(db, &["enqueue", "--actor", "rex"], &input);
    ok(db, &["destinations", "set", "public"], "");
    let cmd = format!("cat >> {0}; echo >> {0}", told.display());
    let mut relay = command(
        db,
        &[
            "relay",
            "--on-dead-letter",
            &cmd,
            "--on-dead-letter-concurrency",
            "1",
        ],
    );
    relay.env_remove("OUTBOX_LANES_ALLOW_PRIVATE_DESTINATIONS");
    let relay = relay.spawn().unwrap();
    let read = || -> Vec<Value> {
        std::fs::read_to_string(&told)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    };
    for _ in 0..1200 {
        if read().len() >= 50 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    sigterm(&relay);
    let out = collect(relay, "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let seen = read();
    assert_eq!(seen.len(), 50, "one run per dead letter: {seen:?}");
    // The library says so itself, at WARN, once per lane and pass (not once per unit).
    let warned: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("dead-lettering this lane's units") && l.contains("WARN"))
        .collect();
    for to in std::iter::once(&deep).chain(&shallow) {
        assert!(
            warned
                .iter()
                .any(|l| l.contains(to.as_str()) && l.contains("destination_refused")),
            "no WARN for {to}:\n{}",
            out.stderr
        );
    }
    assert!(warned.len() <= 10, "a WARN per unit: {warned:#?}");
    let listed = ok(db, &["dead-letters", "list", "--json"], "").json();
    let listed = listed["dead_letters"].as_array().unwrap();
    assert_eq!(listed.len(), 50);
    for v in &seen {
        assert_eq!(v["reason"], "destination_refused", "{v}");
        assert_eq!(v["attempts"], 1, "{v}");
        let l = listed
            .iter()
            .find(|d| d["id"] == v["id"])
            .unwrap_or_else(|| panic!("told an id not listed: {v}"));
        assert_eq!(l["row_id"], v["row_id"]);
    }
    let lanes = std::iter::once((deep.clone(), 30, "d".to_owned())).chain(
        shallow
            .iter()
            .enumerate()
            .map(|(k, to)| (to.clone(), 5, format!("s{k}-"))),
    );
    for (to, n, prefix) in lanes {
        let runs: Vec<&Value> = seen
            .iter()
            .filter(|v| v["recipient"] == to.as_str())
            .collect();
        let rows: Vec<&str> = runs.iter().map(|v| v["row_id"].as_str().unwrap()).collect();
        let expected: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
        assert_eq!(rows, expected, "runs for {to} in lane order");
        let ids: Vec<i64> = runs.iter().map(|v| v["id"].as_i64().unwrap()).collect();
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "ids in lane order: {ids:?}"
        );
    }
    assert_eq!(pending(db), 0);
}

/// A drain killed (SIGKILL) while it dead-letters a deep refused lane loses and duplicates
/// nothing: what was committed is a prefix of the lane, in lane order, and the rest is
/// pending; a second drain dead-letters the rest, each unit once, in lane order.
#[test]
fn a_drain_killed_while_dead_lettering_leaves_a_prefix_and_the_rest_pending() {
    let db = Db::sqlite();
    let to = "http://127.0.0.1:9/deep".to_owned();
    let input: String = (0..3000)
        .map(|i| {
            line(
                &format!("d{i}"),
                std::slice::from_ref(&to),
                &serde_json::json!({ "n": i }),
            ) + "\n"
        })
        .collect();
    ok(&db, &["enqueue", "--actor", "kit"], &input);
    // Refused from now on (OL-24): an operator narrowed the policy the enqueue widened.
    ok(&db, &["destinations", "set", "public"], "");
    let mut drain = command(&db, &["drain", "--no-progress"]);
    drain
        .env_remove("OUTBOX_LANES_ALLOW_PRIVATE_DESTINATIONS")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut drain = drain.spawn().unwrap();
    // Killed once some dead letters are committed (or after the drain ended: then the
    // checks below hold all the same).
    for _ in 0..2400 {
        let dead = actor(&status(&db), "kit").map_or(0, |a| a["dead_letters"].as_u64().unwrap());
        if dead > 0 || drain.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = drain.kill();
    let _ = drain.wait();
    let rows = |db: &Db| -> Vec<(i64, String)> {
        let listed = ok(db, &["dead-letters", "list", "--json"], "").json();
        listed["dead_letters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["id"].as_i64().unwrap(),
                    d["row_id"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let first = rows(&db);
    println!("killed with {} of 3000 dead-lettered", first.len());
    let prefix: Vec<String> = (0..first.len()).map(|i| format!("d{i}")).collect();
    assert_eq!(
        first.iter().map(|r| r.1.clone()).collect::<Vec<_>>(),
        prefix,
        "committed dead letters are a prefix of the lane"
    );
    assert_eq!(pending(&db) as usize, 3000 - first.len());
    let mut again = command(&db, &["drain", "--no-progress"]);
    again.env_remove("OUTBOX_LANES_ALLOW_PRIVATE_DESTINATIONS");
    let out = collect(again.spawn().unwrap(), "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let all = rows(&db);
    let lane: Vec<String> = (0..3000).map(|i| format!("d{i}")).collect();
    assert_eq!(all.iter().map(|r| r.1.clone()).collect::<Vec<_>>(), lane);
    assert!(all.windows(2).all(|w| w[0].0 < w[1].0), "ids in lane order");
    assert_eq!(
        &all[..first.len()],
        &first[..],
        "the first drain's dead letters stand"
    );
    assert_eq!(pending(&db), 0);
}

/// Each command's help lists only its flags; a usage error under `--log-format json` is one
/// JSON line on stderr, like every other error.
#[test]
fn help_lists_each_commands_own_flags_and_usage_errors_follow_the_log_format() {
    let db = Db::sqlite();
    let drain = ok(&db, &["drain", "--help"], "");
    for relay_only in ["--max-passes", "--poll-interval", "--metrics-addr"] {
        assert!(
            !drain.stdout.contains(relay_only),
            "drain --help: {relay_only}"
        );
    }
    let relay = ok(&db, &["relay", "--help"], "");
    for flag in [
        "--max-passes",
        "--poll-interval",
        "--host-failures",
        "--signature-spec",
    ] {
        assert!(relay.stdout.contains(flag), "relay --help lacks {flag}");
    }
    for args in [
        &["--log-format", "json", "drain", "--no-such-flag"][..],
        &[
            "--log-format=json",
            "dead-letters",
            "list",
            "--reason",
            "late",
        ][..],
        &["--log-format", "json", "dead-letters", "purge"][..],
    ] {
        let out = run(&db, args, "");
        assert_eq!(out.code(), Some(2), "{args:?}: {}", out.stderr);
        let lines: Vec<&str> = out.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: {}", out.stderr);
        let v: Value = serde_json::from_str(lines[0]).expect("a JSON line");
        assert_eq!(v["level"], "ERROR", "{v}");
        assert_eq!(v["fields"]["exit_code"], 2, "{v}");
    }
    // As text, clap's own usage error.
    let out = run(&db, &["drain", "--no-such-flag"], "");
    assert_eq!(out.code(), Some(2));
    assert!(
        out.stderr.starts_with("error: unexpected argument"),
        "{}",
        out.stderr
    );
}

/// `--proxy`: every delivery goes to the proxy, an `http://` recipient in absolute form with
/// the URL's credentials decoded. The recipient's own port is closed, so only the proxy can
/// have answered; without the flag the same rows fail there.
#[test]
fn a_proxy_carries_every_delivery() {
    let db = Db::sqlite();
    let proxy = Recipient::start().unwrap();
    let inbox = format!("http://127.0.0.1:{}/inbox", free_port());
    ok(
        &db,
        &["enqueue", "--actor", "alice"],
        &rows(3, std::slice::from_ref(&inbox)),
    );
    let via = proxy
        .url("")
        .replacen("http://", "http://us%65r:p%40ss@", 1);
    ok(&db, &["drain", "--proxy", &via], "");
    let asked = proxy.all_requests();
    assert_eq!(asked.len(), 3, "{asked:?}");
    for (n, q) in asked.iter().enumerate() {
        assert_eq!(q.target, inbox);
        assert_eq!(q.header("proxy-authorization"), Some("Basic dXNlcjpwQHNz"));
        let body: Value = serde_json::from_slice(&q.body).unwrap();
        assert_eq!(body["n"], n as u64);
    }
    assert_eq!(pending(&db), 0);

    ok(&db, &["enqueue", "--actor", "bob"], &rows(1, &[inbox]));
    let out = run(&db, &["drain", "--max-attempts", "1"], "");
    assert_eq!(
        proxy.all_requests().len(),
        3,
        "no proxy: nothing reached it"
    );
    let dead = ok(&db, &["dead-letters", "list", "--json"], "").json();
    assert_eq!(
        dead["dead_letters"].as_array().map(Vec::len),
        Some(1),
        "{}",
        out.stderr
    );
}
