//! A drain slot whose holder process died is taken over at once, not after its lease: the
//! holder is a real child process (this test binary run again) killed with SIGKILL. On a
//! SQLite file (the holder's lock file) and on Postgres (the holder's session lock).
#![cfg(unix)]
#![allow(missing_docs)]

mod common;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_lanes_core::ActorId;
use outbox_lanes_store::{NewRow, SlotAcquisition, SqliteOptions, SqliteStore, Store};

const CHILD: &str = "OUTBOX_LANES_LIVENESS_CHILD";
const LEASE: Duration = Duration::from_secs(600);

/// Where the child connects: `sqlite:<path>` or `pg:<schema>`.
fn open(target: &str) -> Arc<dyn Store> {
    if let Some(path) = target.strip_prefix("sqlite:") {
        return Arc::new(SqliteStore::open(path, SqliteOptions::default()).expect("open"));
    }
    #[cfg(feature = "postgres")]
    if let Some(schema) = target.strip_prefix("pg:") {
        let url = common::pg_url().expect("the parent had a server");
        let opts = outbox_lanes_store::PgOptions {
            schema: schema.to_owned(),
            ..Default::default()
        };
        return Arc::new(outbox_lanes_store::PgStore::connect(&url, opts).expect("connect"));
    }
    panic!("unknown target {target}")
}

/// The child: takes alice's and bob's slots with a 10-minute lease, says so, then waits to
/// be killed (and exits by itself after 60 s should nobody kill it).
fn child(target: &str) {
    let store = open(target);
    let held = ["alice", "bob"].iter().all(|a| {
        matches!(
            store.acquire_slot(&ActorId::new(*a), "child-relay", LEASE),
            Ok(SlotAcquisition::Acquired(_))
        )
    });
    println!("{}", if held { "held" } else { "refused" });
    std::thread::sleep(Duration::from_secs(60));
}

#[cfg(feature = "postgres")]
fn now() -> outbox_lanes_core::Timestamp {
    outbox_lanes_core::Timestamp::from_system_time(std::time::SystemTime::now())
}

/// The scenario on the store at `target`.
fn killed_holder_is_taken_over(target: &str, test_name: &str) {
    let store = open(target);
    let (alice, bob) = (ActorId::new("alice"), ActorId::new("bob"));
    for actor in ["alice", "bob"] {
        let row = NewRow {
            id: "r1".into(),
            body: b"{}".to_vec(),
            content_type: "application/json".into(),
            recipients: vec!["https://a.example/inbox".into()],
            ..Default::default()
        };
        store
            .enqueue(&ActorId::new(actor), &[row])
            .expect("enqueue");
    }

    let mut holder = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(CHILD, target)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the holder");
    let out = holder.stdout.take().expect("stdout");
    // (The test harness prints the test's name on the same line, before it.)
    let said = BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.ends_with("held") || l.ends_with("refused"));
    assert!(
        said.as_deref().is_some_and(|l| l.ends_with("held")),
        "the child took the slots: {said:?}"
    );

    // Alive: its leases hold, whoever asks.
    for actor in [&alice, &bob] {
        assert!(matches!(
            store
                .acquire_slot(actor, "parent-relay", LEASE)
                .expect("acquire"),
            SlotAcquisition::Held
        ));
    }

    holder.kill().expect("SIGKILL");
    holder.wait().expect("reaped");
    let killed = Instant::now();

    // Dead: its slots are free within 3 s (the server sees the session end), 10 minutes
    // before their lease would end, with newer tokens.
    for actor in [&alice, &bob] {
        let token = loop {
            match store
                .acquire_slot(actor, "parent-relay", LEASE)
                .expect("acquire")
            {
                SlotAcquisition::Acquired(t) => break t,
                SlotAcquisition::Held if killed.elapsed() < Duration::from_secs(3) => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                SlotAcquisition::Held => {
                    panic!("the dead holder's slot of {actor} still waits for its lease")
                }
            }
        };
        assert!(token.fencing() >= 2, "a new fencing token");
    }
    println!("taken over {:?} after the kill", killed.elapsed());
}

#[test]
fn sqlite_a_slot_of_a_killed_holder_is_taken_over_at_once() {
    if let Ok(target) = std::env::var(CHILD) {
        return child(&target);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let target = format!("sqlite:{}", dir.path().join("outbox.db").display());
    killed_holder_is_taken_over(
        &target,
        "sqlite_a_slot_of_a_killed_holder_is_taken_over_at_once",
    );
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_a_slot_of_a_killed_holder_is_taken_over_at_once() {
    if let Ok(target) = std::env::var(CHILD) {
        return child(&target);
    }
    let Some(url) = common::pg_url() else {
        return;
    };
    let schema = format!(
        "ol_live_{}_{}",
        std::process::id(),
        now().as_millis() % 1_000_000
    );
    killed_holder_is_taken_over(
        &format!("pg:{schema}"),
        "postgres_a_slot_of_a_killed_holder_is_taken_over_at_once",
    );
    let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).expect("client");
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .expect("drop the test schema");
}
