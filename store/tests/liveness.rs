//! A drain slot whose holder process died is taken over at once, not after its lease: the
//! holder is a real child process (this test binary run again) killed with SIGKILL.
#![cfg(unix)]
#![allow(missing_docs)]

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use outbox_lanes_core::ActorId;
use outbox_lanes_store::{Acquire, SqliteOptions, SqliteStore, Store};

const CHILD: &str = "OUTBOX_LANES_LIVENESS_CHILD";
const LEASE: Duration = Duration::from_secs(600);

fn open(path: &std::path::Path) -> SqliteStore {
    SqliteStore::open(path, SqliteOptions::default()).expect("open")
}

/// The child: takes alice's and bob's slots with a 10-minute lease, says so, then waits to
/// be killed (and exits by itself after 60 s should nobody kill it).
fn child(path: &str) {
    let store = open(std::path::Path::new(path));
    let held = ["alice", "bob"].iter().all(|a| {
        matches!(
            store.acquire_slot(&ActorId::new(*a), "child-relay", LEASE),
            Ok(Acquire::Acquired(_))
        )
    });
    println!("{}", if held { "held" } else { "refused" });
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn a_slot_of_a_killed_holder_is_taken_over_at_once() {
    if let Ok(path) = std::env::var(CHILD) {
        child(&path);
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("outbox.db");
    let store = open(&path);
    let alice = ActorId::new("alice");
    for actor in ["alice", "bob"] {
        let row = outbox_lanes_store::NewRow {
            id: "r1".into(),
            body: b"{}".to_vec(),
            content_type: "application/json".into(),
            recipients: vec!["http://127.0.0.1:9/inbox".into()],
            ..Default::default()
        };
        store
            .enqueue(&ActorId::new(actor), &[row])
            .expect("enqueue");
    }
    let now = || outbox_lanes_core::Timestamp::from_system_time(std::time::SystemTime::now());

    let mut holder = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "a_slot_of_a_killed_holder_is_taken_over_at_once",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, &path)
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
    assert!(matches!(
        store
            .acquire_slot(&alice, "parent-relay", LEASE)
            .expect("acquire"),
        Acquire::Held
    ));
    assert!(
        store
            .acquire_ready("parent-relay", LEASE, now(), 10)
            .expect("ready")
            .is_empty(),
        "both actors have work, and a live holder"
    );

    holder.kill().expect("SIGKILL");
    holder.wait().expect("reaped");

    // Dead: its slots are free now, 10 minutes before their lease would end, with newer
    // tokens: one asked for by name, the other found by the monitor's pick-up.
    match store
        .acquire_slot(&alice, "parent-relay", LEASE)
        .expect("acquire")
    {
        Acquire::Acquired(t) => assert!(t.fencing() >= 2, "a new fencing token"),
        Acquire::Held => panic!("the dead holder's slot still waits for its lease"),
    }
    let ready = store
        .acquire_ready("parent-relay", LEASE, now(), 10)
        .expect("ready");
    let actors: Vec<&str> = ready.iter().map(|t| t.actor().as_str()).collect();
    assert_eq!(actors, ["bob"]);
    assert!(ready[0].fencing() >= 2);
}
