//! How a relay stops and what it leaves behind: a clean stop frees every drain slot it held
//! and removes its lock files at once (`status` right after shows no slot held).
//!
//! Real SQLite files and Postgres schemas, real recipients on 127.0.0.1. Every wait is
//! bounded; assertions are about outcomes, never durations.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Db, Relay, eventually};
use outbox_lanes_test_support::{Recipient, Reply};
use serde_json::Value;

/// `status --json`.
fn status(db: &Db) -> Value {
    let child = db.command(&["status", "--json"]).spawn().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
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
    assert_eq!(held_slots(db).len(), actors.len(), "the passes hold their slots");
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
