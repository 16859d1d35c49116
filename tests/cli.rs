//! The `outbox-lanes` binary, run as built, against a real SQLite file (and Postgres when
//! `OUTBOX_LANES_TEST_PG` is set) and real HTTP recipients on 127.0.0.1.
//!
//! Every wait is bounded; assertions are about outcomes and orders, never durations.
#![allow(missing_docs, clippy::unwrap_used)]

use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

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
                .args(["enqueue", "--actor", "erin"])
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
    assert!(r.wait_for("/m", 5, Duration::from_secs(60)));
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
    for family in [
        "outbox_lanes_queue_depth",
        "outbox_lanes_stalled_lanes",
        "outbox_lanes_dead_letters",
        "outbox_lanes_delivered_total",
        "outbox_lanes_dead_lettered_total",
        "outbox_lanes_units_in_flight",
        "outbox_lanes_attempts_total",
        "outbox_lanes_delivery_latency_seconds",
        "outbox_lanes_queue_wait_seconds",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family}")),
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

#[test]
fn loopback_destinations_are_refused_by_default() {
    let db = Db::sqlite();
    let r = Recipient::start().unwrap();
    ok(
        &db,
        &["enqueue", "--actor", "max"],
        &rows(1, &[r.url("/a")]),
    );
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
    // Logs are JSON lines; the summary is the one plain line.
    let logs: Vec<&str> = out.stderr.lines().filter(|l| l.starts_with('{')).collect();
    assert!(!logs.is_empty());
    for l in logs {
        let v: Value = serde_json::from_str(l).unwrap();
        assert!(v["level"].is_string(), "{l}");
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
        &["dead-letters", "purge"],
        &["dead-letters", "replay", "--actor", "x"],
        &["drain"],
    ];
    for args in commands {
        let out = run(&db, args, "");
        assert_eq!(out.code(), Some(2), "{args:?}: {}", out.stderr);
        let want = format!(
            "error: no outbox at {}; run enqueue or relay to create it",
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
    // A known actor without dead letters is not an error.
    ok(&db, &["dead-letters", "list", "--actor", "known"], "");
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
            .args(["enqueue", "--actor", "fay"])
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
