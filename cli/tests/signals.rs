//! The signal contract of `drain` and `relay`, with one recipient that never answers (an
//! attempt in flight that cannot finish): a first SIGINT or SIGTERM stops admission and
//! waits for attempts in flight within the grace; a second signal cancels at once and exits
//! 1. Whatever the sequence, nothing is lost: every row is still pending or was delivered.
//!
//! Every wait is bounded; the checks are on exit statuses and the store, not on durations.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use common::BIN;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use outbox_lanes_test_support::{Recipient, Reply};

const N: usize = 5;

fn command(db: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(["--db", db])
        .args(args)
        .env("OUTBOX_LANES_ALLOW_PRIVATE_DESTINATIONS", "true")
        .env("OUTBOX_LANES_TIMEOUT", "20s")
        .env("OUTBOX_LANES_SHUTDOWN_GRACE", "3s")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

fn send(child: &Child, sig: Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, sig).unwrap();
}

/// The exit code, waiting at most 15 s (then the child is killed and `None` returned).
fn exit_code(mut child: Child) -> Option<i32> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn pending(db: &str) -> u64 {
    let out = Command::new(BIN)
        .args(["--db", db, "status", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["actors"][0]["pending"].as_u64().unwrap()
}

/// Enqueues `lines` (JSON rows) for actor `sig`.
fn enqueue(db: &str, lines: &str) {
    let enqueue = command(db, &["enqueue", "--actor", "sig"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::collect(enqueue, lines);
    assert_eq!(out.code(), Some(0), "enqueue: {}", out.stderr);
}

/// `cmd` (drain or relay) with a hanging recipient, then `signals` with `gap` between them:
/// its exit code, the units still pending, and its stderr.
fn run(cmd: &str, signals: &[Signal], gap: Duration) -> (Option<i32>, u64, String) {
    let r = Recipient::start().unwrap();
    r.set_default("/hang", Reply::Hang);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("outbox.db").display().to_string();
    let lines: String = (0..N)
        .map(|i| {
            format!(
                "{{\"id\":\"row-{i}\",\"to\":[\"{}\"],\"body\":{i}}}\n",
                r.url("/hang")
            )
        })
        .collect();
    enqueue(&db, &lines);
    // Into a file: read once the process is gone, it cannot fill a pipe meanwhile.
    let log = dir.path().join("stderr.log");
    let child = command(&db, &[cmd])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    assert!(
        r.wait_for("/hang", 1, Duration::from_secs(30)),
        "{cmd}: no attempt started"
    );
    for (i, sig) in signals.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(gap);
        }
        send(&child, *sig);
    }
    let code = exit_code(child);
    (code, pending(&db), std::fs::read_to_string(&log).unwrap())
}

#[test]
fn a_second_signal_exits_1_at_once_and_loses_nothing() {
    for cmd in ["drain", "relay"] {
        for (first, second, gap_ms) in [
            (Signal::SIGINT, Signal::SIGINT, 2000),
            (Signal::SIGTERM, Signal::SIGTERM, 2000),
            (Signal::SIGINT, Signal::SIGINT, 500),
            (Signal::SIGTERM, Signal::SIGINT, 100),
        ] {
            let (code, pending, _) = run(cmd, &[first, second], Duration::from_millis(gap_ms));
            assert_eq!(
                code,
                Some(1),
                "{cmd}: {first:?} then {second:?} {gap_ms} ms apart"
            );
            assert_eq!(pending, N as u64, "{cmd}: nothing lost, nothing delivered");
        }
    }
}

#[test]
fn a_grace_that_ends_with_an_attempt_in_flight_exits_1_and_loses_nothing() {
    // One signal; the hanging attempt outlives the grace (--shutdown-grace 3s).
    for cmd in ["drain", "relay"] {
        let (code, pending, stderr) = run(cmd, &[Signal::SIGTERM], Duration::ZERO);
        assert_eq!(code, Some(1), "{cmd}: {stderr}");
        assert_eq!(pending, N as u64, "{cmd}");
        // The one lane's head was the only attempt in flight: the message counts it.
        assert!(
            stderr.contains("the shutdown grace ended with 1 attempt(s) in flight"),
            "{cmd}: {stderr}"
        );
    }
}

/// Issue 43 (noticed at the fediverse bench's deadline): the last line of a drain stopped by
/// a second signal counts what its interrupted pass delivered, not only passes that returned.
#[test]
fn a_second_signal_reports_what_the_interrupted_pass_delivered() {
    const FAST: usize = 3;
    let r = Recipient::start().unwrap();
    r.set_default("/hang", Reply::Hang);
    r.set_default("/ok", Reply::Status(202));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("outbox.db").display().to_string();
    let mut lines = format!(
        "{{\"id\":\"hang\",\"to\":[\"{}\"],\"body\":0}}\n",
        r.url("/hang")
    );
    for i in 0..FAST {
        lines.push_str(&format!(
            "{{\"id\":\"ok-{i}\",\"to\":[\"{}\"],\"body\":{i}}}\n",
            r.url("/ok")
        ));
    }
    enqueue(&db, &lines);
    let child = command(&db, &["drain"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        r.wait_for("/hang", 1, Duration::from_secs(30)),
        "no attempt"
    );
    assert!(
        r.wait_for("/ok", FAST, Duration::from_secs(30)),
        "the other lane's rows were not delivered"
    );
    // The hanging attempt keeps the pass running: wait until the deliveries are acknowledged.
    let start = Instant::now();
    while pending(&db) != 1 && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(pending(&db), 1, "the fast rows were acknowledged");
    send(&child, Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(200));
    send(&child, Signal::SIGTERM);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "stopped at once by a second signal: {FAST} delivered"
        )),
        "{stderr}"
    );
}
