//! Slow and silent recipients, in real time, through the binary with its DEFAULT settings:
//! no `--timeout`, `--time-slice`, `--shutdown-grace` or retry flag, and no `OUTBOX_LANES_*`
//! variable inherited from the caller's environment. The only flags beyond `--db` are
//! `--allow-private-destinations` (the recipients are on 127.0.0.1) and the subcommands'.
//!
//! The defaults that matter here (cli/src/cli/args.rs, driver/src/config.rs,
//! core/src/config.rs):
//!
//! - HTTP timeout per attempt: 30 s;
//! - time slice of a pass: 10 s (it stops starting attempts; those in flight finish or time
//!   out); shutdown grace: 10 s;
//! - `pass_attempts` 4, in-pass retry delays 1 s, 2 s, 4 s (the last repeats), jitter ±20 %;
//! - lane backoff base 30 s (±20 %), doubling per stall up to 1 h;
//! - `max_attempts` 12.
//!
//! So a recipient that takes 25 s answers within the timeout, but after the slice and the
//! 10 s grace a slice used to have; and one that never answers is cut off by the timeout
//! (30 s), also after both. An attempt must not be cut short, handed back unrecorded and
//! sent again because a pass reached its slice: each test fails if it is.
//!
//! Each test takes about a minute. Every child process is killed by a bound; each waits
//! on a wall clock, and the assertions are about how many requests arrived and what the
//! store says, read from the recipient's record and from `status`/`lanes --json`.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;
use outbox_lanes_test_support::{Completion, Recipient, Recorded, Reply};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_outbox-lanes");
/// A short command (enqueue, status, lanes, dead-letters) never takes this long.
const SHORT_BOUND: Duration = Duration::from_secs(60);
/// The 25 s answer of test 1 and a drain's own work fit well within this; a drain still
/// running then is killed (and the test fails).
const DRAIN_BOUND: Duration = Duration::from_secs(90);
/// When test 2 looks first: past the first attempt's timeout (30 s) and the earliest
/// in-pass retry after it (30 s + 0.8 s), short of a third attempt (see the test).
const RELAY_WINDOW: Duration = Duration::from_secs(45);
/// The hanging lane's 4th timeout, which stalls it into backoff, comes at about 4 × 30 s plus
/// the delays between (≈ 1 + 2 + 4 s, ± 20 %): ≈ 127 s. Test 2 waits this long at most.
const BACKOFF_BOUND: Duration = Duration::from_secs(200);
/// After SIGTERM, how long the relay may take to exit (the grace, and the wait for
/// delivery tasks, at most timeout + grace = 40 s) before it is killed.
const STOP_BOUND: Duration = Duration::from_secs(60);

/// A command of the binary on `db` with its defaults: every `OUTBOX_LANES_*` variable of
/// this process is removed (a developer's `OUTBOX_LANES_TIMEOUT` must not shorten a test),
/// and so is any config file given through the environment.
fn command(db: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("OUTBOX_LANES_") {
            c.env_remove(&name);
        }
    }
    c.arg("--db")
        .arg(db)
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// A long-running `drain` or `relay`, its stderr collected on a thread. Dropping it kills
/// the process if it still runs; when the test is failing (panicking), the stderr is printed
/// then, so the failure shows what the binary logged.
struct Proc {
    name: &'static str,
    child: Child,
    started: Instant,
    stderr: Arc<Mutex<String>>,
    reader: Option<JoinHandle<()>>,
    exit: Option<ExitStatus>,
    killed: bool,
}

impl Proc {
    fn spawn(name: &'static str, db: &Path, args: &[&str]) -> Proc {
        let mut child = command(db, args).stderr(Stdio::piped()).spawn().unwrap();
        let mut err = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let reader = std::thread::spawn(move || {
            let mut buf = [0_u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Proc {
            name,
            child,
            started: Instant::now(),
            stderr,
            reader: Some(reader),
            exit: None,
            killed: false,
        }
    }

    /// The exit status if the process has exited by now.
    fn poll(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().unwrap();
        }
        self.exit
    }

    /// Waits until the process exits or `bound` has passed since it started; then it is
    /// killed. `None`: it had to be killed.
    fn wait_or_kill(&mut self, bound: Duration) -> Option<ExitStatus> {
        let deadline = self.started + bound;
        while Instant::now() < deadline {
            if let Some(s) = self.poll() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.poll().or_else(|| {
            self.kill();
            None
        })
    }

    /// SIGTERM, then waits up to `bound` for the exit; killed after that. `None`: it had to
    /// be killed (or had exited before the signal: see [`Proc::poll`] first).
    fn terminate(&mut self, bound: Duration) -> Option<ExitStatus> {
        if self.poll().is_some() {
            return None;
        }
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + bound;
        while Instant::now() < deadline {
            if let Some(s) = self.poll() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.poll().or_else(|| {
            self.kill();
            None
        })
    }

    fn kill(&mut self) {
        if self.poll().is_none() {
            let _ = self.child.kill();
            self.exit = self.child.wait().ok();
            self.killed = true;
        }
    }

    /// How it ended so far, for messages.
    fn describe(&mut self) -> String {
        let age = self.started.elapsed().as_secs_f64();
        match (self.poll(), self.killed) {
            (_, true) => format!(
                "{} was killed (still running {age:.1} s after its start)",
                self.name
            ),
            (Some(s), false) => format!("{} exited: {s}", self.name),
            (None, false) => format!("{} is still running ({age:.1} s)", self.name),
        }
    }

    /// Everything it wrote on stderr so far.
    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        if std::thread::panicking() {
            eprintln!(
                "----- stderr of {} -----\n{}----- end of {} stderr -----",
                self.name,
                self.stderr(),
                self.name
            );
        }
    }
}

struct Out {
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
}

/// Runs a short command, bounded; panics unless it exits 0.
fn ok(db: &Path, args: &[&str], stdin: &str) -> Out {
    let mut child = command(db, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_owned();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(stdin.as_bytes());
    });
    let mut o = child.stdout.take().unwrap();
    let mut e = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = o.read_to_string(&mut s);
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = e.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + SHORT_BOUND;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = writer.join();
    let out = Out {
        status,
        stdout: o.join().unwrap(),
        stderr: e.join().unwrap(),
    };
    assert!(
        out.status.is_some_and(|s| s.success()),
        "{args:?}: {:?} (None: killed after {SHORT_BOUND:?})\nstdout: {}\nstderr: {}",
        out.status,
        out.stdout,
        out.stderr
    );
    out
}

fn json(out: &Out) -> Value {
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", out.stdout))
}

fn row(id: &str, to: &str, body: &Value) -> String {
    serde_json::json!({ "id": id, "to": [to], "body": body }).to_string() + "\n"
}

fn enqueue(db: &Path, actor: &str, lines: &str) {
    ok(
        db,
        &["enqueue", "--actor", actor, "--allow-private-destinations"],
        lines,
    );
}

/// The requests to `path`, one line each: arrival and completion relative to `t0`, and the
/// status — for failure messages.
fn timeline(requests: &[Recorded], t0: Instant) -> Vec<String> {
    let rel = |t: Instant| t.saturating_duration_since(t0).as_secs_f64();
    requests
        .iter()
        .map(|q| {
            let body = String::from_utf8_lossy(&q.body);
            let end = match q.completion {
                Completion::Pending => "still pending".to_owned(),
                Completion::Answered { status, at } => {
                    format!("answered {status} at {:.1} s", rel(at))
                }
                Completion::Unanswered { reason, at } => {
                    format!("unanswered ({reason:?}) at {:.1} s", rel(at))
                }
            };
            format!(
                "#{} {body} arrived at {:.1} s on connection {}, {end}",
                q.index,
                rel(q.arrived_at),
                q.connection
            )
        })
        .collect()
}

/// A fresh SQLite database in a temporary directory.
fn database() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("outbox.db");
    (dir, path)
}

/// Every failed expectation of a test, reported together: a failure names all that is wrong,
/// not only the first.
#[derive(Default)]
struct Expect(Vec<String>);

impl Expect {
    fn that(&mut self, holds: bool, what: impl Into<String>) {
        if !holds {
            self.0.push(what.into());
        }
    }

    fn check(self, context: &str) {
        assert!(
            self.0.is_empty(),
            "{} expectation(s) failed:\n- {}\n{context}",
            self.0.len(),
            self.0.join("\n- ")
        );
    }
}

/// A recipient that answers 200 after 25 s: inside the HTTP timeout (30 s), but after the
/// pass's time slice (10 s) and the grace that follows it (10 s). Its attempt must be waited
/// for and recorded, not abandoned at slice + grace and sent again by the next pass (which
/// would repeat every 20 s, for ever, as no attempt ever gets its 25 s).
#[test]
fn a_recipient_answering_after_25s_gets_one_request_and_is_delivered() {
    let r = Recipient::start().unwrap();
    r.set_default("/slow", Reply::Status(200).after(Duration::from_secs(25)));
    let (_dir, db) = database();
    enqueue(
        &db,
        "patient",
        &row("slow-0", &r.url("/slow"), &serde_json::json!({ "n": 0 })),
    );

    let t0 = Instant::now();
    let mut drain = Proc::spawn("drain", &db, &["drain", "--allow-private-destinations"]);
    let exit = drain.wait_or_kill(DRAIN_BOUND);
    let how = drain.describe();
    let requests = r.requests("/slow");

    let st = json(&ok(&db, &["status", "--json"], ""));
    let actors = st["actors"].as_array().unwrap();
    let pending: u64 = actors.iter().map(|a| a["pending"].as_u64().unwrap()).sum();
    let dead: u64 = actors
        .iter()
        .map(|a| a["dead_letters"].as_u64().unwrap())
        .sum();
    let dead_list = json(&ok(&db, &["dead-letters", "list", "--json"], ""));

    let mut e = Expect::default();
    e.that(
        requests.len() == 1,
        format!(
            "exactly 1 request to /slow, got {} (an attempt handed back at slice + grace and \
             sent again?)",
            requests.len()
        ),
    );
    e.that(
        requests.first().and_then(|q| q.completion.status()) == Some(200),
        "the first request was answered 200 (the client waited the 25 s for it)",
    );
    e.that(
        exit.is_some(),
        format!("drain exited by itself within {DRAIN_BOUND:?}"),
    );
    e.that(
        exit.and_then(|s| s.code()) == Some(0),
        format!("drain exited 0, got {exit:?}"),
    );
    e.that(pending == 0, format!("nothing pending, got {pending}"));
    e.that(dead == 0, format!("no dead letter in status, got {dead}"));
    e.that(
        dead_list["dead_letters"] == serde_json::json!([]),
        format!(
            "dead-letters list is empty, got {}",
            dead_list["dead_letters"]
        ),
    );
    e.that(
        drain.stderr().contains("1 delivered"),
        "drain's summary says 1 delivered",
    );
    e.check(&format!(
        "{how}\nrequests to /slow (times from the drain's start):\n  {}\nstatus --json: {st}",
        timeline(&requests, t0).join("\n  ")
    ));
}

/// A recipient that never answers, next to a healthy one of the same actor. With the
/// defaults, the relay's first attempt to it times out after 30 s — past the slice (10 s):
/// the attempt must be kept to its timeout, recorded as failed with a timeout, retried on the
/// in-pass ladder, and after `pass_attempts` (4) timeouts in a row the lane must back off —
/// instead of being abandoned at 20 s and sent again for ever, never recorded.
///
/// The bound on requests in the first 45 s, from the defaults: attempt 1 at t ≈ 0 times out
/// at t ≈ 30 s. The earliest next attempt is an in-pass retry after the first delay of the
/// ladder, 1 s − 20 % jitter = 0.8 s, at t ≈ 30.8 s. That attempt cannot end before its own
/// timeout, t ≈ 60.8 s. So at most 2 requests can arrive within 45 s; a third means an
/// attempt was sent again without waiting for its answer or timeout.
#[test]
fn a_hanging_recipient_times_out_and_backs_off() {
    let r = Recipient::start().unwrap();
    // Never answers; released (the connection closed) when `r` is dropped.
    r.set_default("/hang", Reply::Hang);
    let (_dir, db) = database();
    let hang = r.url("/hang");
    let good = r.url("/ok");
    // The hanging lane's head is enqueued first, and has a follower; five rows for the
    // healthy lane in between.
    let mut lines = row("hang-0", &hang, &serde_json::json!({ "h": 0 }));
    for i in 0..5 {
        lines += &row(&format!("ok-{i}"), &good, &serde_json::json!({ "n": i }));
    }
    lines += &row("hang-1", &hang, &serde_json::json!({ "h": 1 }));
    enqueue(&db, "mixed", &lines);

    let t0 = Instant::now();
    let mut relay = Proc::spawn("relay", &db, &["relay", "--allow-private-destinations"]);
    while t0.elapsed() < RELAY_WINDOW && relay.poll().is_none() {
        std::thread::sleep(Duration::from_millis(200));
    }
    // The first snapshot, the relay still running: one timeout recorded.
    let running = relay.poll().is_none();
    let early_requests = r.requests("/hang").len();
    let early = json(&ok(&db, &["lanes", "--actor", "mixed", "--json"], ""));
    // Then until the lane backs off (its 4th timeout), bounded.
    let mut lanes = early.clone();
    while t0.elapsed() < BACKOFF_BOUND && relay.poll().is_none() {
        lanes = json(&ok(&db, &["lanes", "--actor", "mixed", "--json"], ""));
        let backoff = lanes["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["recipient"] == hang && l["state"] == "backoff");
        if backoff {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let hang_requests = r.requests("/hang");
    let ok_requests = r.requests("/ok");
    let now = SystemTime::now();
    let stopped = relay.terminate(STOP_BOUND);
    let how = match stopped {
        Some(s) => format!("relay was running at the end; after SIGTERM: {s}"),
        None => relay.describe(),
    };

    let lane_in = |lanes: &Value, url: &str| {
        lanes["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["recipient"] == url)
            .cloned()
            .unwrap_or_else(|| panic!("no lane {url} in {lanes}"))
    };
    let first = lane_in(&early, &hang);
    let h = lane_in(&lanes, &hang);
    let g = lane_in(&lanes, &good);
    let served: Vec<u64> = ok_requests
        .iter()
        .filter(|q| q.completion.status().is_some_and(|s| s < 300))
        .map(|q| {
            serde_json::from_slice::<Value>(&q.body).unwrap()["n"]
                .as_u64()
                .unwrap()
        })
        .collect();
    let is_timeout = |l: &Value| {
        let e = l["last_error"].as_str().unwrap_or_default().to_lowercase();
        e.contains("timeout") || e.contains("timed out")
    };
    let not_before = h["not_before"]
        .as_str()
        .map(|t| humantime::parse_rfc3339_weak(t).unwrap());

    let mut e = Expect::default();
    e.that(running, "the relay was still running at 45 s");
    e.that(
        served == [0, 1, 2, 3, 4],
        format!("the healthy recipient got its rows in order meanwhile, got {served:?}"),
    );
    e.that(
        g["depth"] == 0,
        format!("the healthy lane is empty, got depth {}", g["depth"]),
    );
    e.that(
        (1..=2).contains(&early_requests),
        format!(
            "1 or 2 requests to /hang within {RELAY_WINDOW:?} (attempt 1 and at most one \
             retry), got {early_requests}"
        ),
    );
    e.that(
        is_timeout(&first),
        format!(
            "at 45 s the hanging lane's last_error is a timeout, got {} (last_status {})",
            first["last_error"], first["last_status"]
        ),
    );
    e.that(
        hang_requests.len() == 4,
        format!(
            "4 requests to /hang (pass_attempts timeouts in a row) before the backoff, got {}",
            hang_requests.len()
        ),
    );
    e.that(
        hang_requests.iter().all(|q| q.body == b"{\"h\":0}"),
        "only the hanging lane's head was attempted (its follower waits behind it)",
    );
    e.that(
        is_timeout(&h),
        format!("the last error is still a timeout, got {}", h["last_error"]),
    );
    e.that(
        h["state"] == "backoff",
        format!(
            "the hanging lane is in backoff within {BACKOFF_BOUND:?}, got state {}",
            h["state"]
        ),
    );
    e.that(
        h["backoff_level"].as_u64().is_some_and(|l| l >= 1),
        format!("backoff_level at least 1, got {}", h["backoff_level"]),
    );
    e.that(
        not_before.is_some_and(|t| t > now),
        format!(
            "the hanging lane's not_before is in the future, got {}",
            h["not_before"]
        ),
    );
    e.that(
        h["depth"] == 2,
        format!(
            "both units of the hanging lane still pending, got depth {}",
            h["depth"]
        ),
    );
    e.check(&format!(
        "{how}\nrequests to /hang (times from the relay's start):\n  {}\nlanes --json at \
         the end: {lanes}",
        timeline(&hang_requests, t0).join("\n  ")
    ));
}

/// Eight actors each waiting on a hanging recipient fill the default `--max-passes 8`; a
/// ninth, healthy actor's row must still be delivered while all eight attempts hang: a pass
/// that only waits on attempts in flight does not count against the bound (OL-13). Before,
/// the healthy row waited for a slice and its grace (about 20 s), again and again.
///
/// No duration is asserted: the relation is that the healthy row arrived while every
/// hanging request was still unanswered (they hang until the 30 s timeout). Each hanging
/// recipient is a host of its own: on one host that has not answered yet, the host's first
/// contact (`--host-first-contact`, 3) would hold back the others' attempts (OL-21), which
/// is not what this test is about.
#[test]
fn hanging_recipients_of_eight_actors_keep_a_healthy_actor_from_nothing() {
    let r = Recipient::start().unwrap();
    r.set_default("/ok", Reply::Status(200));
    let stuck: Vec<Recipient> = (0..8)
        .map(|_| {
            let s = Recipient::start().unwrap();
            s.set_prefix_default("/hang", Reply::Hang);
            s
        })
        .collect();
    let (_dir, db) = database();
    for (i, s) in stuck.iter().enumerate() {
        enqueue(
            &db,
            &format!("stuck-{i}"),
            &row(
                &format!("h-{i}"),
                &s.url(&format!("/hang/{i}")),
                &serde_json::json!({ "i": i }),
            ),
        );
    }
    let t0 = Instant::now();
    let mut relay = Proc::spawn("relay", &db, &["relay", "--allow-private-destinations"]);
    // Every stuck actor's pass has its attempt out.
    let all_hanging = stuck
        .iter()
        .all(|s| s.wait_until(Duration::from_secs(20), |reqs| !reqs.is_empty()));
    // Then the healthy actor enqueues.
    enqueue(
        &db,
        "healthy",
        &row("ok-0", &r.url("/ok"), &serde_json::json!({ "ok": true })),
    );
    let delivered = r.wait_for("/ok", 1, Duration::from_secs(25));
    let hanging: Vec<Recorded> = stuck.iter().flat_map(|s| s.all_requests()).collect();
    let still_hanging = hanging
        .iter()
        .filter(|q| q.path.starts_with("/hang"))
        .filter(|q| q.completion.is_pending())
        .count();
    let how = relay.describe();
    let mut e = Expect::default();
    e.that(all_hanging, "8 hanging requests arrived");
    e.that(delivered, "the healthy actor's row arrived");
    e.that(
        still_hanging == 8,
        format!(
            "it arrived while all 8 hanging requests were unanswered, got {still_hanging} \
             still pending"
        ),
    );
    e.check(&format!(
        "{how}\nrequests (times from the relay's start):\n  {}",
        timeline(&hanging, t0).join("\n  ")
    ));
}

/// A relay stopped (SIGTERM) while its attempt to a hanging recipient is in flight: the
/// shutdown grace (10 s) ends first, and the attempt is recorded as interrupted — the lane
/// shows it as its last error, not counted toward the maximum (the recipient may have the
/// unit; the cut was ours) — then handed back, and the relay exits 1. Nothing is lost: the
/// unit is still pending.
#[test]
fn a_shutdown_past_its_grace_records_the_cut_attempt_as_interrupted() {
    let r = Recipient::start().unwrap();
    r.set_default("/hang", Reply::Hang);
    let (_dir, db) = database();
    let hang = r.url("/hang");
    enqueue(
        &db,
        "cut",
        &row("h-0", &hang, &serde_json::json!({ "h": 0 })),
    );
    let t0 = Instant::now();
    let mut relay = Proc::spawn("relay", &db, &["relay", "--allow-private-destinations"]);
    let sent = r.wait_for("/hang", 1, Duration::from_secs(20));
    let stopped = relay.terminate(STOP_BOUND);
    let how = relay.describe();
    let lanes = json(&ok(&db, &["lanes", "--actor", "cut", "--json"], ""));
    let lane = lanes["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["recipient"] == hang)
        .cloned()
        .unwrap_or_default();
    let requests = r.requests("/hang");
    let mut e = Expect::default();
    e.that(sent, "the attempt was sent");
    e.that(
        stopped.and_then(|s| s.code()) == Some(1),
        format!("the relay exited 1 after its grace, got {stopped:?}"),
    );
    e.that(
        lane["last_error"]
            .as_str()
            .is_some_and(|s| s.contains("interrupted")),
        format!(
            "the lane's last error says interrupted, got {}",
            lane["last_error"]
        ),
    );
    e.that(
        lane["depth"] == 1,
        format!("the unit is still pending, got depth {}", lane["depth"]),
    );
    e.that(
        requests.len() == 1,
        format!("one request, got {}", requests.len()),
    );
    e.check(&format!(
        "{how}\nrequests:\n  {}\nlanes --json: {lanes}",
        timeline(&requests, t0).join("\n  ")
    ));
}
