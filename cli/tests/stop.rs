//! How a relay stops and what it leaves behind: a clean stop frees every drain slot it held
//! and removes its lock files at once (`status` right after shows no slot held); a relay
//! whose SQLite file is replaced under it stops claiming, turns unready and exits 1.
//!
//! Real SQLite files and Postgres schemas, real recipients on 127.0.0.1. Every wait is
//! bounded; assertions are about outcomes, never durations.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Db, Relay, collect, eventually, free_port, get};
use outbox_lanes_test_support::{Recipient, Reply};
use serde_json::Value;

/// `status --json`.
fn status(db: &Db) -> Value {
    let child = db.command(&["status", "--json"]).spawn().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The actors whose drain slot is held, with their holders.
fn held_slots(db: &Db) -> Vec<(String, String)> {
    status(db)["actors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| !a["slot"].is_null())
        .map(|a| {
            (
                a["actor"].as_str().unwrap().to_owned(),
                a["slot"]["holder"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The lock files of the SQLite file's holders.
fn lock_files(db: &Db) -> Vec<String> {
    let mut dir = db.file().into_os_string();
    dir.push("-holders");
    match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Two relays drain four actors whose recipient answers 503 (each pass waits 30 s to retry,
/// so the passes hold their slots when the stop comes, and each relay's monitor marks the
/// other's slots "look again" on every poll). Both are stopped with SIGTERM: right after,
/// no slot is held and no lock file is left.
fn a_clean_stop_frees_every_slot(db: &Db, sqlite: bool) {
    let r = Recipient::start().unwrap();
    r.set_default("/busy", Reply::Status(503));
    let actors = ["a1", "a2", "a3", "a4"];
    for actor in actors {
        db.enqueue(actor, &r.url("/busy"));
    }
    let args = ["--retry-delays", "30s", "--poll-interval", "100ms"];
    let a = Relay::start(db, &args, &[]);
    let b = Relay::start(db, &args, &[]);
    assert!(
        eventually(|| r.requests("/busy").len() >= actors.len()),
        "every actor's pass attempted once"
    );
    assert_eq!(
        held_slots(db).len(),
        actors.len(),
        "the passes hold their slots"
    );
    if sqlite {
        assert_eq!(lock_files(db).len(), 2, "one lock file per relay");
    }
    // Several polls of each monitor see the other's slots held (and mark them).
    std::thread::sleep(Duration::from_millis(500));
    let (sa, la) = a.stop();
    let (sb, lb) = b.stop();
    let logs = [la, lb].concat().join("\n");
    assert_eq!((sa.code(), sb.code()), (Some(0), Some(0)), "{logs}");
    assert_eq!(
        held_slots(db),
        Vec::<(String, String)>::new(),
        "a clean stop frees its slots at once:\n{logs}"
    );
    if sqlite {
        assert_eq!(
            lock_files(db),
            Vec::<String>::new(),
            "and removes its lock files"
        );
    }
    let pending: u64 = status(db)["actors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["pending"].as_u64().unwrap())
        .sum();
    assert_eq!(pending, actors.len() as u64, "nothing was lost");
}

#[test]
fn a_clean_stop_of_two_relays_on_sqlite_frees_their_slots_and_lock_files() {
    a_clean_stop_frees_every_slot(&Db::new(), true);
}

#[test]
fn a_clean_stop_of_two_relays_on_postgres_frees_their_slots() {
    let Some(db) = Db::postgres("stop_slots") else {
        return;
    };
    a_clean_stop_frees_every_slot(&db, false);
}

/// The file a running relay serves is moved away and a new database is created at its path
/// (what a restore or a removed directory does): on its next poll the relay logs an ERROR
/// naming the path, `/readyz` says why it is not ready, it starts no new pass — a row
/// enqueued into the file it still serves is not delivered — and once its running pass
/// ended it exits 1, so that a supervisor starts a relay on the file now at the path, which
/// delivers the row enqueued there.
#[test]
fn a_relay_whose_sqlite_file_is_replaced_stops_claiming_is_unready_and_exits_1() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    // In flight while the file is replaced: the process stays up until it is answered.
    r.set_default("/slow", Reply::Status(200).after(Duration::from_secs(4)));
    r.set_default("/fast", Reply::Status(200));
    db.enqueue("ann", &r.url("/slow"));
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = Relay::start(
        &db,
        &["--metrics-addr", &addr, "--poll-interval", "100ms"],
        &[],
    );
    assert!(
        r.wait_for("/slow", 1, Duration::from_secs(60)),
        "ann's pass started"
    );
    assert_eq!(get(port, "/readyz").map(|a| a.0), Some(200));
    let old = db.path("old.db");
    for suffix in ["", "-wal", "-shm"] {
        let from = format!("{}{suffix}", db.file().display());
        if std::path::Path::new(&from).exists() {
            std::fs::rename(&from, format!("{}{suffix}", old.display())).unwrap();
        }
    }
    db.enqueue("bob", &r.url("/fast"));
    let path = db.file().display().to_string();
    relay.wait_for_line("ERROR");
    let (code, body) = get(port, "/readyz").expect("the relay still runs its pass");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains(&path) && body.contains("replaced"), "{body}");
    // Into the file the relay still serves: seen by its watcher, claimed by no new pass.
    let line = serde_json::json!({ "id": "r0", "to": [r.url("/fast")], "body": {} }).to_string();
    let mut into_old = db.command_at(&old, &["enqueue", "--actor", "carol"]);
    let out = collect(into_old.spawn().unwrap(), &line);
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let (status, lines) = relay.exited();
    let lines = lines.join("\n");
    assert_eq!(status.code(), Some(1), "{lines}");
    let errors: Vec<&str> = lines.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one ERROR line:\n{lines}");
    assert!(
        errors[0].contains(&path),
        "it names the path: {}",
        errors[0]
    );
    assert!(
        r.requests("/fast").is_empty(),
        "no pass started after the file was replaced:\n{lines}"
    );
    // Restarted, a relay serves the file now at the path.
    let again = Relay::start(&db, &[], &[]);
    assert!(
        r.wait_for("/fast", 1, Duration::from_secs(60)),
        "bob's row, enqueued at the path, is delivered by the restarted relay"
    );
    let (status, lines) = again.stop();
    assert_eq!(status.code(), Some(0), "{}", lines.join("\n"));
}
