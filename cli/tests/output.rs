//! What the binary tells the operator, and that telling cannot crash it: a delivery without
//! `--allow-private-destinations` to rows that `enqueue --allow-private-destinations`
//! accepted warns once per lane, naming the flag; no command panics (exit 101) when stdout
//! or stderr cannot be written (a full disk).
//!
//! Real SQLite files, real recipients on 127.0.0.1. Every wait is bounded; assertions are
//! about outcomes, never durations.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::process::Stdio;

use common::{Db, Relay, collect, eventually};
use outbox_lanes_test_support::Recipient;
use serde_json::Value;

fn dead_letters(db: &Db) -> Vec<Value> {
    let child = db
        .command(&["dead-letters", "list", "--json"])
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    match v {
        Value::Array(a) => a,
        other => other["dead_letters"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
    }
}

#[test]
fn a_relay_without_the_flag_warns_once_per_private_lane_naming_it() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    // Enqueued with the flag (the tests' environment sets it): two lanes, five units.
    let (a, b) = (r.url("/a"), r.url("/b"));
    let lines: String = (0..3)
        .map(|i| {
            serde_json::json!({ "id": format!("r{i}"), "to": if i == 0 { vec![&a] } else { vec![&a, &b] }, "body": {} })
                .to_string()
                + "\n"
        })
        .collect();
    let out = collect(
        db.command(&["enqueue", "--actor", "ann"]).spawn().unwrap(),
        &lines,
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    // An operator narrows the outbox's destination policy the enqueue widened (OL-24).
    let out = collect(
        db.command(&["destinations", "set", "public"])
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let relay = Relay::start(
        &db,
        &[],
        &[("OUTBOX_LANES_ALLOW_PRIVATE_DESTINATIONS", "false")],
    );
    assert!(
        eventually(|| dead_letters(&db).len() == 5),
        "every unit is dead-lettered, as before"
    );
    let (status, lines) = relay.stop();
    let log = lines.join("\n");
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(
        dead_letters(&db)
            .iter()
            .all(|d| d["reason"] == "destination_refused"),
        "{log}"
    );
    let warns: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("WARN") && l.contains("--allow-private-destinations"))
        .collect();
    assert_eq!(warns.len(), 2, "one WARN per lane:\n{log}");
    for url in [&a, &b] {
        assert_eq!(
            warns.iter().filter(|l| l.contains(url.as_str())).count(),
            1,
            "{url}:\n{log}"
        );
    }
    assert!(r.requests("/a").is_empty() && r.requests("/b").is_empty());
}

#[test]
fn no_command_panics_when_stdout_or_stderr_is_full() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: no /dev/full");
        return;
    };
    let db = Db::new();
    db.enqueue("ann", "https://social.example/inbox");
    let row = r#"{"id":"r1","to":["https://social.example/inbox"],"body":{}}"#;
    // (arguments, stdin, whether stdout is full too, the exit code expected)
    let cases: &[(&[&str], &str, bool, i32)] = &[
        (&["enqueue", "--actor", "ann"], row, false, 0),
        (&["enqueue", "--actor", "ann"], "{\"id\": 1}", false, 2),
        (&["status"], "", true, 1),
        (&["status", "--bogus"], "", false, 2),
        (&["dead-letters", "list", "--actor", "nobody"], "", false, 2),
        (&["lanes", "--actor", "ann"], "", true, 1),
        (&["completions", "bash"], "", true, 1),
        (
            &["drain", "--no-progress", "--actor", "nobody"],
            "",
            false,
            2,
        ),
    ];
    for (args, stdin, stdout_full, code) in cases {
        let mut c = db.command(args);
        c.stderr(Stdio::from(full.try_clone().unwrap()));
        if *stdout_full {
            c.stdout(Stdio::from(full.try_clone().unwrap()));
        }
        let mut child = c.spawn().unwrap();
        if let Some(mut input) = child.stdin.take() {
            use std::io::Write as _;
            let _ = input.write_all(stdin.as_bytes());
        }
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(*code),
            "{args:?} (stdout full: {stdout_full}): 101 is a panic"
        );
    }
}

/// `enqueue` whose stdout cannot take its results has still committed the rows: it exits 1
/// saying so, not in words that read as a failed enqueue, and the rows are there.
#[test]
fn an_enqueue_whose_stdout_is_full_says_its_rows_are_enqueued() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: no /dev/full");
        return;
    };
    let db = Db::new();
    db.enqueue("ann", "https://social.example/inbox");
    let rows = "{\"id\":\"r2\",\"to\":[\"https://social.example/inbox\"],\"body\":{}}\n\
                {\"id\":\"r3\",\"to\":[\"https://social.example/inbox\"],\"body\":{}}\n";
    let mut c = db.command(&["enqueue", "--actor", "ann"]);
    c.stdout(Stdio::from(full));
    let mut child = c.spawn().unwrap();
    if let Some(mut input) = child.stdin.take() {
        use std::io::Write as _;
        input.write_all(rows.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "the 2 row(s) are enqueued (committed), but their results could not be written"
        ),
        "{stderr}"
    );
    let status = collect(db.command(&["status", "--json"]).spawn().unwrap(), "");
    let v: Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(v["actors"][0]["pending"], 3, "{}", status.stdout);
}

/// A relay names the database it opened, and warns when it had to create a new one (started
/// in the wrong directory, it would otherwise idle on an empty `./outbox.db`).
#[test]
fn a_relay_names_its_database_and_warns_when_it_created_it() {
    let db = Db::new();
    let relay = Relay::start(&db, &[], &[]);
    relay.wait_for_line("relay created a new, empty outbox");
    let (_, lines) = relay.stop();
    let file = db.file().display().to_string();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("WARN") && l.contains("created a new") && l.contains(&file)),
        "{}",
        lines.join("\n")
    );
    let relay = Relay::start(&db, &[], &[]);
    relay.wait_for_line("relay opened the outbox");
    let (_, lines) = relay.stop();
    assert!(
        !lines.iter().any(|l| l.contains("created a new")),
        "{}",
        lines.join("\n")
    );
    let version = format!("schema_version={}", outbox_lanes_store::SCHEMA_VERSION);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("relay opened the outbox") && l.contains(&version)),
        "{}",
        lines.join("\n")
    );
}

/// The relay's upkeep deletes what `--row-id-retention` and `--ack-retention` keep, once they
/// have passed (here 1 ms, every 100 ms): the delivered unit and its row id go.
#[test]
fn a_relay_deletes_what_its_retentions_let_go() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    let line = serde_json::json!({ "id": "r0", "to": [r.url("/in")], "body": {} }).to_string();
    let out = collect(
        db.command(&["enqueue", "--actor", "ann", "--allow-private-destinations"])
            .spawn()
            .unwrap(),
        &line,
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let relay = Relay::start(
        &db,
        &[
            "--allow-private-destinations",
            "--ack-retention",
            "1ms",
            "--row-id-retention",
            "1ms",
            "--upkeep-interval",
            "100ms",
        ],
        &[],
    );
    assert!(eventually(|| r.count("/in") == 1), "not delivered");
    let count = |sql: &str| -> i64 {
        let c = rusqlite::Connection::open(db.file()).unwrap();
        c.query_row(sql, [], |row| row.get(0)).unwrap()
    };
    assert!(
        eventually(|| count("SELECT count(*) FROM ol_units") == 0
            && count("SELECT count(*) FROM ol_row_ids") == 0),
        "kept: {} unit(s), {} row id(s)",
        count("SELECT count(*) FROM ol_units"),
        count("SELECT count(*) FROM ol_row_ids")
    );
    let (status, _) = relay.stop();
    assert!(status.success());
}
