//! `dead-letters list|replay|purge --since T --until T` through the binary (issue 41, item 4):
//! "replay everything that failed for this endpoint since the outage began" without ids.
//!
//! Dead letters are made at two times a couple of seconds apart (a recipient answering 422
//! dead-letters at once, `permanent`); a time between them selects the later ones with
//! `--since` (inclusive) and the earlier ones with `--until` (exclusive), as an RFC 3339 time
//! (UTC or with an offset) or a duration ago, from a flag or the environment, combined with
//! `--recipient`. A `--since` not before `--until` is refused (exit 2, one `error:` line)
//! before anything is read or changed.
//!
//! The test runs on SQLite and, as its `_on_postgres` twin, on a Postgres schema of its own
//! (skipped when `OUTBOX_LANES_TEST_PG` is not set). The recipients are on 127.0.0.1.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::{Duration, SystemTime};

use common::{Db, Out, arrived, collect, on_postgres, row};
use outbox_lanes_test_support::{Recipient, Reply};
use serde_json::Value;

fn run(db: &Db, args: &[&str]) -> Out {
    collect(db.command(args).spawn().unwrap(), "")
}

fn drain(db: &Db) {
    let out = run(db, &["drain"]);
    assert_eq!(out.code(), Some(0), "drain: {}", out.stderr);
}

/// The (actor, row id) of each dead letter `dead-letters list ARGS --json` lists, in order.
fn listed(db: &Db, args: &[&str]) -> Vec<(String, String)> {
    let mut all = vec!["dead-letters", "list"];
    all.extend_from_slice(args);
    all.push("--json");
    rows_of(&db.json(&all)["dead_letters"])
}

fn rows_of(v: &Value) -> Vec<(String, String)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["actor"].as_str().unwrap().to_owned(),
                d["row_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn rows(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, r)| ((*a).to_owned(), (*r).to_owned()))
        .collect()
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// A usage error: exit 2, one line on stderr, starting `error: `.
fn refused(out: &Out) -> &str {
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    assert!(lines[0].starts_with("error: "), "{}", out.stderr);
    lines[0]
}

fn since_and_until(db: &Db) {
    let r = Recipient::start().unwrap();
    r.set_default("/refuses", Reply::Status(422));
    r.set_default("/other", Reply::Status(422));
    let (refuses, other) = (r.url("/refuses"), r.url("/other"));

    // Before the outage began: three dead letters.
    db.enqueue_lines(
        "alice",
        &[row("e0", &refuses), row("e1", &refuses), row("e2", &other)],
    );
    drain(db);
    std::thread::sleep(Duration::from_secs(1));
    let began = SystemTime::now();
    std::thread::sleep(Duration::from_secs(1));
    // Since: four more, one of them another actor's.
    db.enqueue_lines(
        "alice",
        &[row("l0", &refuses), row("l1", &refuses), row("l2", &other)],
    );
    db.enqueue_lines("bob", &[row("b0", &refuses)]);
    drain(db);

    let early = rows(&[("alice", "e0"), ("alice", "e1"), ("alice", "e2")]);
    let later = rows(&[
        ("alice", "l0"),
        ("alice", "l1"),
        ("alice", "l2"),
        ("bob", "b0"),
    ]);
    let every = db.dead_letters();
    assert_eq!(every.len(), 7);
    // The premise: each dead letter is dead on its side of `began`.
    for d in &every {
        let at = humantime::parse_rfc3339(d["dead_at"].as_str().unwrap()).unwrap();
        let is_later = !d["row_id"].as_str().unwrap().starts_with('e');
        assert_eq!(at > began, is_later, "{d}");
        assert_eq!(d["reason"], "permanent", "{d}");
    }

    // An RFC 3339 time in UTC, or with an offset (the same instant an hour east).
    let utc = rfc3339(began);
    let east = rfc3339(began + Duration::from_secs(3_600)).replace('Z', "+01:00");
    assert_eq!(listed(db, &["--since", &utc]), later);
    assert_eq!(listed(db, &["--since", &east]), later);
    assert_eq!(listed(db, &["--until", &utc]), early);
    assert_eq!(listed(db, &["--until", &east]), early);
    // A duration ago; every dead letter is younger than an hour.
    let ago = format!("{}ms", began.elapsed().unwrap().as_millis());
    assert_eq!(listed(db, &["--since", &ago]), later);
    assert_eq!(listed(db, &["--until", &ago]), early);
    assert_eq!(listed(db, &["--since", "1h"]).len(), 7);
    assert!(listed(db, &["--until", "1h"]).is_empty());
    // Both, and with the other selectors.
    assert_eq!(listed(db, &["--since", "1h", "--until", &utc]), early);
    let refused_since = rows(&[("alice", "l0"), ("alice", "l1"), ("bob", "b0")]);
    assert_eq!(
        listed(db, &["--since", &utc, "--recipient", &refuses]),
        refused_since
    );
    assert_eq!(
        listed(
            db,
            &["--since", &utc, "--recipient", &refuses, "--actor", "bob"]
        ),
        rows(&[("bob", "b0")])
    );
    assert_eq!(
        listed(db, &["--until", &utc, "--recipient", &other]),
        rows(&[("alice", "e2")])
    );
    assert_eq!(
        listed(db, &["--since", &utc, "--reason", "permanent"]),
        later
    );
    assert!(listed(db, &["--since", &utc, "--reason", "gone"]).is_empty());
    // From the environment, as the other selectors.
    let out = collect(
        db.command(&["dead-letters", "list", "--json"])
            .env("OUTBOX_LANES_SINCE", &utc)
            .env("OUTBOX_LANES_UNTIL", "0s")
            .spawn()
            .unwrap(),
        "",
    );
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(rows_of(&v["dead_letters"]), later);

    // A range that holds nothing, a time that does not parse, --all with a time: refused,
    // nothing changed.
    for (since, until) in [
        (utc.as_str(), utc.as_str()),
        ("1s", "1h"),
        (east.as_str(), "1h"),
    ] {
        for sub in ["list", "replay", "purge"] {
            let out = run(
                db,
                &["dead-letters", sub, "--since", since, "--until", until],
            );
            let line = refused(&out);
            assert!(
                line.contains("--since") && line.contains("is not before --until"),
                "{line}"
            );
        }
    }
    for bad in ["yesterday", "2026-12-06", "2026-12-06T10:00:00"] {
        let out = run(db, &["dead-letters", "replay", "--since", bad]);
        assert_eq!(out.code(), Some(2), "{bad}: {}", out.stderr);
        assert!(out.stderr.contains("RFC 3339"), "{bad}: {}", out.stderr);
    }
    let out = run(db, &["dead-letters", "purge", "--all", "--until", "1h"]);
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert_eq!(db.dead_letters().len(), 7);

    // A time alone is a selector for replay and purge.
    let dry = db.json(&[
        "dead-letters",
        "purge",
        "--until",
        "1h",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(dry["would_purge"], 0);
    let dry = db.json(&[
        "dead-letters",
        "replay",
        "--since",
        &utc,
        "--recipient",
        &refuses,
        "--dry-run",
        "--json",
    ]);
    assert_eq!(dry["would_replay"], 3);
    assert_eq!(rows_of(&dry["dead_letters"]), refused_since);

    // The endpoint is back: replay what failed for it since the outage began, and only that.
    r.set_default("/refuses", Reply::Status(202));
    let replayed = db.json(&[
        "dead-letters",
        "replay",
        "--since",
        &utc,
        "--recipient",
        &refuses,
        "--json",
    ]);
    assert_eq!(replayed["replayed"], 3);
    drain(db);
    let mut delivered = arrived(&r, "/refuses");
    delivered.sort();
    assert_eq!(delivered, ["b0", "l0", "l1"]);
    assert_eq!(
        listed(db, &[]),
        rows(&[
            ("alice", "e0"),
            ("alice", "e1"),
            ("alice", "e2"),
            ("alice", "l2")
        ])
    );

    // Purge what died before it: the earlier ones only.
    let purged = db.json(&["dead-letters", "purge", "--until", &east, "--json"]);
    assert_eq!(purged["purged"], 3);
    assert_eq!(listed(db, &[]), rows(&[("alice", "l2")]));
    let purged = db.json(&["dead-letters", "purge", "--since", "1h", "--json"]);
    assert_eq!(purged["purged"], 1);
    assert!(db.dead_letters().is_empty());

    // The help says what the code does.
    for sub in ["list", "replay", "purge"] {
        let out = run(db, &["dead-letters", sub, "--help"]);
        assert_eq!(out.code(), Some(0), "{}", out.stderr);
        for word in [
            "--since <T>",
            "--until <T>",
            "RFC 3339",
            "that long ago",
            "T included",
            "T excluded",
            "OUTBOX_LANES_SINCE",
            "OUTBOX_LANES_UNTIL",
        ] {
            assert!(
                out.stdout.contains(word),
                "{sub} --help: {word}: {}",
                out.stdout
            );
        }
    }
}

#[test]
fn dead_letters_since_and_until_select_by_dead_letter_time() {
    since_and_until(&Db::new());
}

#[test]
fn dead_letters_since_and_until_select_by_dead_letter_time_on_postgres() {
    on_postgres("dl_since", since_and_until);
}
