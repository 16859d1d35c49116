//! Schema creation by processes started at once (issue 38, item 7): on a database without an
//! outbox, a `relay`, two `enqueue`s and a `migrate` started together all succeed, and the
//! schema is made once. Each round starts them on a new SQLite file or a new Postgres schema
//! (one that does not exist yet, so creating the schema itself races too), several rounds per
//! backend, because one round only sometimes lands the processes on the race.
//!
//! Real SQLite files and Postgres (`OUTBOX_LANES_TEST_PG`), a real HTTP recipient on
//! 127.0.0.1. Every wait is bounded; nothing asserts on a duration.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use common::{Db, Out, collect, eventually, wait_bounded};
use outbox_lanes_test_support::Recipient;
use serde_json::Value;

/// Rounds per backend: on the unfixed code about half the Postgres rounds failed.
const ROUNDS: usize = 6;

/// The stderr lines of a relay that says it opened (or created) the outbox.
const RELAY_OPENED: [&str; 2] = [
    "relay opened the outbox",
    "relay created a new, empty outbox",
];

/// A relay started in a round: its child and the stderr lines read so far.
struct RelayRun {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<JoinHandle<()>>,
}

impl RelayRun {
    fn start(db: &Db) -> RelayRun {
        let mut child = db
            .command(&["relay"])
            .stdin(Stdio::null())
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
        RelayRun {
            child,
            lines,
            reader: Some(reader),
        }
    }

    fn text(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Waits (bounded) until the relay says it opened the outbox, asks it to stop (SIGTERM)
    /// and waits (bounded) for its exit; panics unless it opened the outbox and exited 0.
    fn opened_then_stopped(mut self, round: &str) {
        let opened = eventually(|| {
            self.lines
                .lock()
                .unwrap()
                .iter()
                .any(|l| RELAY_OPENED.iter().any(|t| l.contains(t)))
                || self.child.try_wait().unwrap().is_some()
        });
        assert!(
            opened,
            "{round}: the relay neither opened the outbox nor exited"
        );
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        // It may have exited already (a failure, reported below with its stderr).
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let status = wait_bounded(&mut self.child);
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        let text = self.text();
        assert!(
            RELAY_OPENED.iter().any(|t| text.contains(t)),
            "{round}: the relay did not open the outbox ({status}):\n{text}"
        );
        assert_eq!(status.code(), Some(0), "{round}: relay:\n{text}");
    }
}

impl Drop for RelayRun {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One round on `db`, which has no outbox yet: starts a relay, two enqueues (actors `a` and
/// `b`, one row each to `to`) and a migrate together, and checks each succeeded. Returns the
/// outbox id `migrate --json` reported.
fn round(db: &Db, to: &str, round: &str) -> String {
    let row = serde_json::json!({ "id": "r0", "to": [to], "body": {} }).to_string();
    // Every child is spawned before any is waited for; the waits run on threads, so a child
    // that reads its stdin first does not wait for another to finish.
    let relay = RelayRun::start(db);
    let children = [
        db.command(&["enqueue", "--actor", "a"]),
        db.command(&["enqueue", "--actor", "b"]),
        db.command(&["migrate", "--json"]),
    ]
    .map(|mut c| c.spawn().unwrap());
    let waits: Vec<JoinHandle<Out>> = children
        .into_iter()
        .map(|child| {
            let row = row.clone();
            std::thread::spawn(move || collect(child, &row))
        })
        .collect();
    let outs: Vec<Out> = waits.into_iter().map(|w| w.join().unwrap()).collect();
    for (out, what) in outs.iter().zip(["enqueue a", "enqueue b", "migrate"]) {
        assert_eq!(out.code(), Some(0), "{round}: {what}:\n{}", out.stderr);
    }
    relay.opened_then_stopped(round);
    let migrated: Value = serde_json::from_str(&outs[2].stdout).unwrap();
    assert_eq!(
        migrated["schema_version"],
        outbox_lanes_store::SCHEMA_VERSION,
        "{round}: {migrated}"
    );
    migrated["outbox_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{round}: no outbox id: {migrated}"))
        .to_owned()
}

/// What `ol_meta` holds after a round, and the actors in the row-id ledger (a row the relay
/// delivered meanwhile is gone from the units, not from the ledger): the schema was made once,
/// with the outbox id `migrate` saw, the destination policy the processes' flag asked for
/// (OL-24), and both enqueues' rows went into it.
fn expect_made_once(meta: Vec<(String, String)>, actors: Vec<String>, id: &str, round: &str) {
    let version = outbox_lanes_store::SCHEMA_VERSION.to_string();
    assert_eq!(
        meta,
        [
            ("destinations".to_owned(), "loopback+private".to_owned()),
            ("outbox_id".to_owned(), id.to_owned()),
            ("schema_version".to_owned(), version)
        ],
        "{round}"
    );
    assert_eq!(actors, ["a", "b"], "{round}");
}

#[test]
fn processes_started_at_once_on_a_new_sqlite_file_all_succeed() {
    let r = Recipient::start().unwrap();
    for i in 0..ROUNDS {
        let name = format!("SQLite round {i}");
        let db = Db::new();
        let id = round(&db, &r.url("/hook"), &name);
        let c = rusqlite::Connection::open(db.file()).unwrap();
        let meta = c
            .prepare("SELECT key, value FROM ol_meta ORDER BY key")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let actors = c
            .prepare("SELECT DISTINCT actor FROM ol_row_ids ORDER BY actor")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        expect_made_once(meta, actors, &id, &name);
    }
}

#[test]
fn processes_started_at_once_on_a_new_postgres_schema_all_succeed() {
    let r = Recipient::start().unwrap();
    for i in 0..ROUNDS {
        let name = format!("Postgres round {i}");
        // A schema name that does not exist yet: `Db::postgres` drops it first.
        let Some(db) = Db::postgres(&format!("schema_race{i}")) else {
            return;
        };
        let id = round(&db, &r.url("/hook"), &name);
        let (url, schema) = db.pg().unwrap();
        let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
        let meta = c
            .query(
                &format!("SELECT key, value FROM {schema}.ol_meta ORDER BY key"),
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let actors = c
            .query(
                &format!("SELECT DISTINCT actor FROM {schema}.ol_row_ids ORDER BY actor"),
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        expect_made_once(meta, actors, &id, &name);
    }
}
