//! What the binary's process-level tests share: a database (a SQLite file in a directory of
//! its own, or a Postgres schema of its own), running the binary with bounded waits, and a
//! relay whose stderr lines are read as they come.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_lanes_test_support::signatures::{ALICE_PRIVATE_PKCS8, ALICE_PUBLIC};
use outbox_lanes_test_support::{Recipient, Recorded, verifiers};
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_outbox-lanes");

/// The binary the tests run: [`BIN`], or the one `OUTBOX_LANES_TEST_BIN` names (an older
/// build, to show that a test fails on it).
pub fn bin() -> std::ffi::OsString {
    std::env::var_os("OUTBOX_LANES_TEST_BIN").unwrap_or_else(|| BIN.into())
}
/// No single run of the binary in these tests takes anywhere near this long.
pub const RUN_BOUND: Duration = Duration::from_secs(120);

/// A SQLite file in a directory of its own, which the tests also write their files to; or,
/// made by [`Db::postgres`], a Postgres schema of its own (dropped with it) and that directory.
pub struct Db {
    dir: tempfile::TempDir,
    /// The Postgres URL and schema.
    pg: Option<(String, String)>,
}

impl Db {
    pub fn new() -> Db {
        Db {
            dir: tempfile::tempdir().unwrap(),
            pg: None,
        }
    }

    /// A schema of its own on `OUTBOX_LANES_TEST_PG`, named after `test`; `None` (the test
    /// skips) when the variable is not set.
    pub fn postgres(test: &str) -> Option<Db> {
        let url = outbox_lanes_test_support::pg_url()?;
        let schema = format!("ol_{test}_{}", std::process::id());
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .unwrap();
        Some(Db {
            dir: tempfile::tempdir().unwrap(),
            pg: Some((url, schema)),
        })
    }

    /// The SQLite file (or, on Postgres, a file nobody uses).
    pub fn file(&self) -> PathBuf {
        self.path("outbox.db")
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn command(&self, args: &[&str]) -> Command {
        self.with(Command::new(bin()), args)
    }

    /// The binary on the SQLite file at `file` instead (in this directory or not), with
    /// `args` and the same environment as [`Db::command`].
    pub fn command_at(&self, file: &std::path::Path, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.arg("--db").arg(file);
        self.env(c, args)
    }

    /// `c` (the binary, or what runs it) with this database, `args` and a clean environment.
    pub fn with(&self, mut c: Command, args: &[&str]) -> Command {
        match &self.pg {
            Some((url, schema)) => c.args(["--db", url, "--pg-schema", schema]),
            None => c.arg("--db").arg(self.file()),
        };
        self.env(c, args)
    }

    fn env(&self, mut c: Command, args: &[&str]) -> Command {
        c.args(args)
            .env("OUTBOX_LANES_ALLOW_PRIVATE_DESTINATIONS", "true")
            .env("RUST_LOG", "info")
            .env_remove("OUTBOX_LANES_WEBHOOK_SECRET")
            .env_remove("OUTBOX_LANES_SIGNING_KEYS")
            .env_remove("OUTBOX_LANES_DB")
            .env_remove("OUTBOX_LANES_CONFIG")
            .env_remove("OUTBOX_LANES_LOG_FORMAT")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Enqueues one row for `actor` to `to`.
    pub fn enqueue(&self, actor: &str, to: &str) {
        let line = serde_json::json!({ "id": "r0", "to": [to], "body": {} }).to_string();
        let out = collect(
            self.command(&["enqueue", "--actor", actor])
                .spawn()
                .unwrap(),
            &line,
        );
        assert_eq!(out.code(), Some(0), "enqueue: {}", out.stderr);
    }

    /// Enqueues `lines` (JSON rows, one a line) for `actor`.
    pub fn enqueue_lines(&self, actor: &str, lines: &[String]) {
        let out = collect(
            self.command(&["enqueue", "--actor", actor])
                .spawn()
                .unwrap(),
            &(lines.join("\n") + "\n"),
        );
        assert_eq!(out.code(), Some(0), "enqueue: {}", out.stderr);
    }

    /// Runs the binary with `args`; its stdout as JSON (it must exit 0).
    pub fn json(&self, args: &[&str]) -> Value {
        let out = collect(self.command(args).spawn().unwrap(), "");
        assert_eq!(out.code(), Some(0), "{args:?}: {}", out.stderr);
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
    }

    /// Every dead letter (`dead-letters list --json`).
    pub fn dead_letters(&self) -> Vec<Value> {
        self.json(&["dead-letters", "list", "--json"])["dead_letters"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// Runs `sql` on the database directly (a state a test needs and cannot make quickly
    /// through the binary; another test makes it the real way).
    pub fn sql(&self, sql: &str) {
        match &self.pg {
            Some((url, schema)) => {
                let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
                c.batch_execute(&format!("SET search_path TO {schema}; {sql}"))
                    .unwrap();
            }
            None => rusqlite::Connection::open(self.file())
                .unwrap()
                .execute_batch(sql)
                .unwrap(),
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Some((url, schema)) = &self.pg {
            if let Ok(mut c) = postgres::Client::connect(url, postgres::NoTls) {
                let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
            }
        }
    }
}

pub struct Out {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// Feeds `stdin`, collects stdout and stderr on threads (so a full pipe never blocks the child), waits
/// for the exit within [`RUN_BOUND`].
pub fn collect(mut child: Child, stdin: &str) -> Out {
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_owned();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(stdin.as_bytes());
    });
    let mut out = child.stdout.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let mut err = child.stderr.take().unwrap();
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = wait_bounded(&mut child);
    let _ = writer.join();
    Out {
        status,
        stdout: o.join().unwrap(),
        stderr: e.join().unwrap(),
    }
}

pub fn wait_bounded(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + RUN_BOUND;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("outbox-lanes did not exit within {RUN_BOUND:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (bounded) for `done`; whether it came.
pub fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}

/// A child that is killed if the test ends without waiting for it (a failed assertion).
pub struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child asked to stop (SIGTERM) when the test is done with it, and killed if it has not
/// exited within [`RUN_BOUND`].
pub struct Stopped(pub Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0.id()) {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
        let deadline = Instant::now() + RUN_BOUND;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running relay whose stderr lines are read as they come.
pub struct Relay {
    child: Reaped,
    lines: Arc<Mutex<Vec<String>>>,
    reader: std::thread::JoinHandle<()>,
}

impl Relay {
    pub fn start(db: &Db, args: &[&str], env: &[(&str, &str)]) -> Relay {
        let mut child = db
            .command(&[&["relay"], args].concat())
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let into = Arc::clone(&lines);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                into.lock().unwrap().push(line);
            }
        });
        Relay {
            child: Reaped(child),
            lines,
            reader,
        }
    }

    /// Waits (bounded) for a stderr line that contains `text`.
    pub fn wait_for_line(&self, text: &str) {
        assert!(
            eventually(|| self.lines.lock().unwrap().iter().any(|l| l.contains(text))),
            "no stderr line with {text:?}:\n{}",
            self.lines.lock().unwrap().join("\n")
        );
    }

    /// Waits (bounded) for the relay to exit by itself; its exit status and every stderr line.
    pub fn exited(mut self) -> (ExitStatus, Vec<String>) {
        let status = wait_bounded(&mut self.child.0);
        let rest = Stderr {
            lines: self.lines,
            reader: self.reader,
        };
        (status, rest.lines())
    }

    /// SIGTERM, then the exit status and every stderr line.
    pub fn stop(self) -> (ExitStatus, Vec<String>) {
        let (status, rest) = self.signal();
        (status, rest.lines())
    }

    /// SIGTERM, then the exit status.
    pub fn signal(mut self) -> (ExitStatus, Stderr) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.0.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = wait_bounded(&mut self.child.0);
        (
            status,
            Stderr {
                lines: self.lines,
                reader: self.reader,
            },
        )
    }
}

/// The stderr of a relay that exited: complete once whatever inherited it is gone too.
pub struct Stderr {
    lines: Arc<Mutex<Vec<String>>>,
    reader: std::thread::JoinHandle<()>,
}

impl Stderr {
    pub fn lines(self) -> Vec<String> {
        self.reader.join().unwrap();
        std::mem::take(&mut *self.lines.lock().unwrap())
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` on 127.0.0.1:`port`: the status line's code and the body, or `None` if the
/// server does not answer (yet).
pub fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_owned();
    Some((code, body))
}

/// Retries `GET path` until `done` accepts the answer (bounded); returns the last answer.
pub fn get_until(port: u16, path: &str, done: impl Fn(u16, &str) -> bool) -> (u16, String) {
    let mut last = None;
    for _ in 0..600 {
        if let Some((code, body)) = get(port, path) {
            if done(code, &body) {
                return (code, body);
            }
            last = Some((code, body));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    last.unwrap_or_else(|| panic!("nothing answered GET {path} on port {port}"))
}

impl Db {
    /// The Postgres URL and schema of a database made by [`Db::postgres`].
    pub fn pg(&self) -> Option<(&str, &str)> {
        self.pg
            .as_ref()
            .map(|(url, schema)| (url.as_str(), schema.as_str()))
    }
}

/// Runs `test` on a Postgres schema of its own, named after `name`; skips it (and says so)
/// when `OUTBOX_LANES_TEST_PG` is not set.
pub fn on_postgres(name: &str, test: impl FnOnce(&Db)) {
    match Db::postgres(name) {
        Some(db) => test(&db),
        None => eprintln!("skipped: OUTBOX_LANES_TEST_PG is not set"),
    }
}

/// An `enqueue` line: the row `id` to `to`, its body's `n` the id.
pub fn row(id: &str, to: &str) -> String {
    serde_json::json!({ "id": id, "to": [to], "body": { "n": id } }).to_string()
}

/// The origin of a recipient.
pub fn origin(r: &Recipient) -> String {
    format!("http://127.0.0.1:{}", r.addr().port())
}

/// The entry of `origin` in a `hosts --json`.
pub fn host<'a>(hosts: &'a Value, origin: &str) -> &'a Value {
    hosts["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["origin"] == origin)
        .unwrap_or_else(|| panic!("no {origin} in {hosts}"))
}

/// The body's `n` of a request.
pub fn n_of(q: &Recorded) -> String {
    let v: Value = serde_json::from_slice(&q.body).unwrap();
    v["n"].as_str().unwrap().to_owned()
}

/// Whether a request was answered with a 2xx.
pub fn is_2xx(q: &Recorded) -> bool {
    q.completion
        .status()
        .is_some_and(|s| (200..300).contains(&s))
}

/// The body's `n` of each request to `path` answered 2xx, in arrival order.
pub fn arrived(r: &Recipient, path: &str) -> Vec<String> {
    r.requests(path)
        .iter()
        .filter(|q| is_2xx(q))
        .map(n_of)
        .collect()
}

/// The actor whose key [`keys_file`] holds.
pub const ALICE: &str = "https://example.com/users/alice";

/// A keys file with alice's RSA key (mode 0600, as the binary wants it).
pub fn keys_file(dir: &std::path::Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let file = dir.join("signing-keys.toml");
    std::fs::write(
        &file,
        format!(
            "[actors.\"{ALICE}\"]\nkey_id = \"{ALICE}#main-key\"\nprivate_key_pem = \"\"\"\n{ALICE_PRIVATE_PKCS8}\"\"\"\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    file
}

/// Whether a request is signed with RFC 9421 (else draft-cavage, or not at all).
pub fn is_rfc9421(q: &Recorded) -> bool {
    q.header("signature-input").is_some()
}

/// Whether a request carries an RFC 9421 signature of alice's (checked with a verifier we did
/// not write).
pub fn verifies_rfc9421(q: &Recorded) -> bool {
    is_rfc9421(q) && verifiers::rfc9421(q, ALICE_PUBLIC).is_ok()
}

/// Whether a request carries a draft-cavage signature of alice's (checked with a verifier we
/// did not write).
pub fn verifies_cavage(q: &Recorded) -> bool {
    !is_rfc9421(q) && verifiers::cavage(q, ALICE_PUBLIC).is_ok()
}
