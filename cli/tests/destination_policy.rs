//! One destination policy per outbox (OL-24, issue 40 item 1), through the binary and the
//! library, on SQLite and Postgres: a process that admits loopback recipients (`enqueue
//! --allow-private-destinations`) and a second process that delivers with the default policy
//! (the binary without the flag, or the library with its default `OutboxConfig`) deliver
//! every unit, in order, and dead-letter none; an enqueue the outbox's policy refuses names
//! the flag and the command; an operator's `destinations set public` makes a pending loopback
//! unit a dead letter `destination_refused`, with the WARN naming the flag.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use outbox_lanes_test_support::Recipient;
use serde_json::Value;

const ROWS: usize = 12;

/// `args` with the flag given or not, whatever the tests' environment says.
fn run(db: &Db, args: &[&str], flag: bool, stdin: &str) -> Out {
    let mut c = db.command(args);
    c.env(
        "OUTBOX_LANES_ALLOW_PRIVATE_DESTINATIONS",
        if flag { "true" } else { "false" },
    );
    collect(c.spawn().unwrap(), stdin)
}

/// Rows `r0`… to `r`'s `/a` and, every third, `/b` too: two lanes, in order.
fn lines(r: &Recipient) -> String {
    (0..ROWS)
        .map(|i| {
            let to = if i % 3 == 0 {
                vec![r.url("/a"), r.url("/b")]
            } else {
                vec![r.url("/a")]
            };
            serde_json::json!({ "id": format!("r{i}"), "to": to, "body": { "n": format!("r{i}") } })
                .to_string()
                + "\n"
        })
        .collect()
}

fn expected(every: usize) -> Vec<String> {
    (0..ROWS)
        .filter(|i| i % every == 0)
        .map(|i| format!("r{i}"))
        .collect()
}

fn destinations(db: &Db) -> Value {
    let out = run(db, &["destinations", "--json"], false, "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap()
}

/// Process 1 admits loopback recipients; process 2, the binary without the flag (the
/// default policy), delivers every one of them in order and dead-letters none.
fn two_processes_deliver_what_the_first_admitted(db: &Db) {
    let r = Recipient::start().unwrap();
    let out = run(
        db,
        &["enqueue", "--actor", "ann", "--allow-private-destinations"],
        true,
        &lines(&r),
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("widened the outbox's destination policy"),
        "said at INFO: {}",
        out.stderr
    );
    assert_eq!(destinations(db)["destinations"], "loopback+private");

    let out = run(db, &["drain", "--no-progress"], false, "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert_eq!(arrived(&r, "/a"), expected(1), "every unit, in order");
    assert_eq!(arrived(&r, "/b"), expected(3), "every unit, in order");
    assert!(db.dead_letters().is_empty(), "{}", out.stderr);
    assert!(
        !out.stderr.contains("destination_refused"),
        "nothing refused: {}",
        out.stderr
    );
}

#[test]
fn two_processes_deliver_what_the_first_admitted_sqlite() {
    two_processes_deliver_what_the_first_admitted(&Db::new());
}

#[test]
fn two_processes_deliver_what_the_first_admitted_postgres() {
    on_postgres(
        "two_processes_policy",
        two_processes_deliver_what_the_first_admitted,
    );
}

/// The same with the library as process 2: an outbox opened with the default
/// `OutboxConfig` (no `allow_loopback`) on the database the binary enqueued into.
#[test]
fn the_library_with_its_default_config_delivers_what_the_binary_admitted() {
    use outbox_lanes::blocking::{Outbox, OutboxConfig};
    use outbox_lanes::store::{SqliteOptions, SqliteStore};

    let db = Db::new();
    let r = Recipient::start().unwrap();
    let out = run(
        &db,
        &["enqueue", "--actor", "ann", "--allow-private-destinations"],
        true,
        &lines(&r),
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let store = SqliteStore::open(db.file(), SqliteOptions::default()).unwrap();
    let outbox = Outbox::open(Arc::new(store), OutboxConfig::default()).unwrap();
    outbox.drain("ann").unwrap();
    assert_eq!(arrived(&r, "/a"), expected(1));
    assert_eq!(arrived(&r, "/b"), expected(3));
    assert!(outbox.dead_letters(None).unwrap().is_empty());
    // Its own enqueue is judged by the outbox's policy too.
    let row = outbox_lanes::store::NewRow {
        id: "lib".into(),
        body: b"{\"n\":\"lib\"}".to_vec(),
        content_type: "application/json".into(),
        recipients: vec![r.url("/a")],
        ..Default::default()
    };
    outbox.enqueue("ann", &[row]).unwrap();
    outbox.drain("ann").unwrap();
    assert_eq!(arrived(&r, "/a").last().map(String::as_str), Some("lib"));
}

/// An outbox at the default policy: `enqueue` of a loopback recipient without the flag is
/// refused, naming its line, the flag and the command, and writes nothing; where there was
/// no outbox, none is made.
fn enqueue_without_the_flag_is_refused_naming_it(db: &Db) {
    let r = Recipient::start().unwrap();
    let input = format!(
        "{}\n{}\n",
        row("p0", "https://a.example/inbox"),
        row("p1", &r.url("/a"))
    );
    for exists in [false, true] {
        let out = run(db, &["enqueue", "--actor", "ann"], false, &input);
        assert_eq!(out.code(), Some(2), "{}", out.stderr);
        for named in [
            "line 2",
            "loopback",
            "(public)",
            "--allow-private-destinations",
            "outbox-lanes destinations set loopback",
        ] {
            assert!(out.stderr.contains(named), "{named:?}: {}", out.stderr);
        }
        assert!(out.stdout.is_empty(), "{}", out.stdout);
        if !exists {
            if db.pg().is_none() {
                assert!(!db.file().exists(), "no outbox made for a refused input");
            }
            // An outbox that exists, at the default policy.
            let out = run(
                db,
                &["enqueue", "--actor", "ann"],
                false,
                &row("x", "https://a.example/inbox"),
            );
            assert_eq!(out.code(), Some(0), "{}", out.stderr);
        }
    }
    let status = db.json(&["status", "--json"]);
    assert_eq!(status["actors"][0]["pending"], 1, "only x: {status}");
    assert_eq!(destinations(db)["destinations"], "public");
}

#[test]
fn enqueue_without_the_flag_is_refused_naming_it_sqlite() {
    enqueue_without_the_flag_is_refused_naming_it(&Db::new());
}

#[test]
fn enqueue_without_the_flag_is_refused_naming_it_postgres() {
    on_postgres(
        "enqueue_refused_policy",
        enqueue_without_the_flag_is_refused_naming_it,
    );
}

/// After `destinations set public`, a pending loopback unit is dead-lettered
/// `destination_refused` by a drain without the flag, with the WARN naming it; a drain with
/// the flag widens the policy again, at WARN, since it undoes the narrowing.
fn a_narrowing_dead_letters_pending_loopback_units(db: &Db) {
    let r = Recipient::start().unwrap();
    let out = run(
        db,
        &["enqueue", "--actor", "ann", "--allow-private-destinations"],
        true,
        &format!("{}\n", row("r0", &r.url("/a"))),
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);

    let out = run(db, &["destinations", "set", "public", "--json"], false, "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let set: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        (&set["destinations"], &set["before"], &set["changed"]),
        (&"public".into(), &"loopback+private".into(), &true.into()),
        "{set}"
    );
    assert!(
        out.stderr.contains("WARN") && out.stderr.contains("narrowed"),
        "{}",
        out.stderr
    );
    let out = run(db, &["destinations"], false, "");
    assert_eq!(out.stdout, "destinations: public (public addresses only)\n");

    let out = run(db, &["drain", "--no-progress"], false, "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let dead = db.dead_letters();
    assert_eq!(dead.len(), 1, "{}", out.stderr);
    assert_eq!(dead[0]["reason"], "destination_refused");
    let warns: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("--allow-private-destinations"))
        .collect();
    assert_eq!(warns.len(), 1, "one WARN for the lane:\n{}", out.stderr);
    assert!(warns[0].contains(&r.url("/a")), "{}", warns[0]);
    assert!(r.requests("/a").is_empty(), "nothing sent");

    // A process still started with the flag widens it again, and says it undid a narrowing.
    let out = run(db, &["dead-letters", "replay", "--all"], false, "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let out = run(
        db,
        &["drain", "--no-progress", "--allow-private-destinations"],
        true,
        "",
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert!(
        out.stderr
            .lines()
            .any(|l| l.contains("WARN") && l.contains("undoing an operator's narrowing")),
        "{}",
        out.stderr
    );
    assert_eq!(arrived(&r, "/a"), ["r0"]);
    assert_eq!(destinations(db)["destinations"], "loopback+private");
}

#[test]
fn a_narrowing_dead_letters_pending_loopback_units_sqlite() {
    a_narrowing_dead_letters_pending_loopback_units(&Db::new());
}

#[test]
fn a_narrowing_dead_letters_pending_loopback_units_postgres() {
    on_postgres(
        "narrowing_policy",
        a_narrowing_dead_letters_pending_loopback_units,
    );
}

#[test]
fn destinations_shows_and_sets_the_policy() {
    let db = Db::new();
    // No outbox: nothing to show (exit 2), and none is made.
    let out = run(&db, &["destinations"], false, "");
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(!db.file().exists());
    let out = run(&db, &["migrate"], false, "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert_eq!(
        destinations(&db),
        serde_json::json!({ "destinations": "public", "loopback": false, "private": false, "link_local": false })
    );
    for (arg, name, text) in [
        (
            "loopback",
            "loopback",
            "destinations: loopback (public and loopback addresses; was public)\n",
        ),
        (
            "private",
            "loopback+private",
            "destinations: loopback+private (public, loopback and private-range addresses; was loopback)\n",
        ),
        (
            "private",
            "loopback+private",
            "destinations: loopback+private (public, loopback and private-range addresses; unchanged)\n",
        ),
        (
            "public",
            "public",
            "destinations: public (public addresses only; was loopback+private)\n",
        ),
    ] {
        let out = run(&db, &["destinations", "set", arg], false, "");
        assert_eq!(out.code(), Some(0), "{}", out.stderr);
        assert_eq!(out.stdout, text);
        assert_eq!(destinations(&db)["destinations"], name);
    }
    let out = run(&db, &["destinations", "set", "everything"], false, "");
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("public, loopback, private"),
        "{}",
        out.stderr
    );
}
