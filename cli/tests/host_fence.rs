//! Operators' host controls are fenced like lane controls (issue 38, items 1-4): once `hosts
//! block|unblock|retry` has returned, every running relay acts on it before it starts anything
//! — a unit enqueued for a blocked host right after is held or dead-lettered, never sent; an
//! attempt in flight when a `--dead-letter` block committed is recorded on its dead letter (and
//! `dead-letters replay --all` leaves it out: its recipient has it); a replay right after an
//! unblock is delivered; the lanes an unblock or a retry releases come
//! back at once.
//!
//! Through the binary with its DEFAULT delivery settings (`relay` started plainly), against
//! recipients on 127.0.0.1, on a SQLite file (one relay) and on Postgres (two relays, both
//! fenced; skipped when `OUTBOX_LANES_TEST_PG` is not set). Every wait is bounded; assertions
//! are about what arrived, orders, counts and states, never about durations (the latencies
//! from an unblock or a retry to the deliveries are printed).
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use common::{Db, Relay, collect, eventually, is_2xx, n_of, on_postgres, origin, row};
use outbox_lanes_test_support::{Recipient, Reply};
use serde_json::Value;

/// Two actors, so that on Postgres each of the two relays may hold a pass of its own.
const ACTORS: [&str; 2] = ["alice", "bob"];
const HOST_BLOCKED: &str = "host blocked by an operator";
const DELIVERED_AFTER_SET_ASIDE: &str =
    "delivered: the attempt in flight when an operator set this unit aside succeeded";
/// How long the busy recipients take to answer.
const SLOW: Duration = Duration::from_millis(300);

// ---------------------------------------------------------------------------------------------
// Helpers

/// Runs the binary with `args`; its stdout (it must exit 0).
fn text_of(db: &Db, args: &[&str]) -> String {
    let out = collect(db.command(args).spawn().unwrap(), "");
    assert_eq!(
        out.code(),
        Some(0),
        "{args:?}\nstdout: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
    out.stdout
}

fn json_of(db: &Db, args: &[&str]) -> Value {
    let out = text_of(db, args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

fn migrate(db: &Db) {
    text_of(db, &["migrate"]);
}

/// `hosts ACTION ORIGIN [extra] --json`; returns its `changed`.
fn host_action(db: &Db, action: &str, origin: &str, extra: &[&str]) -> u64 {
    let out = json_of(
        db,
        &[&["hosts", action, origin], extra, &["--json"]].concat(),
    );
    out["changed"]
        .as_u64()
        .unwrap_or_else(|| panic!("hosts {action}: {out}"))
}

/// The rows `path` answered with a 2xx, in arrival order, a row answered twice (at least
/// once) counted once.
fn delivered(r: &Recipient, path: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for q in r.requests(path) {
        if is_2xx(&q) {
            let n = n_of(&q);
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    out
}

/// The 2xx answers of `r`, anywhere, in arrival order: (arrival, path, row).
fn answered(r: &Recipient) -> Vec<(Instant, String, String)> {
    r.all_requests()
        .iter()
        .filter(|q| is_2xx(q))
        .map(|q| (q.arrived_at, q.path.clone(), n_of(q)))
        .collect()
}

/// Every lane of `actor` (`lanes --json`); none when the actor is unknown yet.
fn lanes(db: &Db, actor: &str) -> Vec<Value> {
    let out = collect(
        db.command(&["lanes", "--actor", actor, "--json"])
            .spawn()
            .unwrap(),
        "",
    );
    if out.code() == Some(2) {
        return Vec::new();
    }
    assert_eq!(out.code(), Some(0), "lanes: {}", out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    v["lanes"].as_array().unwrap().clone()
}

/// The lanes of every actor whose recipient is on `r`.
fn lanes_on(db: &Db, r: &Recipient) -> Vec<Value> {
    let prefix = r.url("/");
    ACTORS
        .iter()
        .flat_map(|a| lanes(db, a))
        .filter(|l| l["recipient"].as_str().unwrap().starts_with(&prefix))
        .collect()
}

fn dead_letters(db: &Db) -> Vec<Value> {
    json_of(db, &["dead-letters", "list", "--json"])["dead_letters"]
        .as_array()
        .unwrap()
        .clone()
}

/// Whether a lane's `not_before` is later than now.
fn waits(lane: &Value) -> bool {
    lane["not_before"].as_str().is_some_and(|t| {
        humantime::parse_rfc3339(t).unwrap_or_else(|e| panic!("{t}: {e}")) > SystemTime::now()
    })
}

/// Whether a lane is held in one way or another: paused, or waiting for a time.
fn held(lane: &Value) -> bool {
    lane["paused"] == true || waits(lane)
}

fn start_relays(db: &Db, n: usize) -> Vec<Relay> {
    let relays: Vec<Relay> = (0..n).map(|_| Relay::start(db, &[], &[])).collect();
    for r in &relays {
        r.wait_for_line("relay running");
    }
    relays
}

fn stop_all(relays: Vec<Relay>) {
    for relay in relays {
        let (status, lines) = relay.stop();
        assert!(status.success(), "relay: {status}\n{}", lines.join("\n"));
    }
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// The path of a recipient URL on `r`.
fn path_of<'a>(r: &Recipient, url: &'a str) -> &'a str {
    &url[origin(r).len()..]
}

// ---------------------------------------------------------------------------------------------
// 1. A block reaches relays busy with the host: rows enqueued right after it returns are never
//    sent.

/// Two rounds, one host each: each actor has a lane being delivered to the host (20 rows, each
/// answered after 300 ms); `hosts block --dead-letter` returns; 5 rows are enqueued for the
/// host right after, on those lanes and on new ones. None reaches the host; all 5 are dead
/// letters `blocked`.
fn dead_letter_block_reaches_busy_relays(db: &Db, relays: usize) {
    let hosts = [Recipient::start().unwrap(), Recipient::start().unwrap()];
    for r in &hosts {
        r.set_server_default(Reply::Status(200).after(SLOW));
    }
    for a in ACTORS {
        let lines: Vec<String> = hosts
            .iter()
            .enumerate()
            .flat_map(|(k, r)| {
                (0..20).map(move |i| row(&format!("busy-{k}-{i}"), &r.url(&format!("/busy-{a}"))))
            })
            .collect();
        db.enqueue_lines(a, &lines);
    }
    let running = start_relays(db, relays);
    for (k, r) in hosts.iter().enumerate() {
        let busy = r.wait_until(Duration::from_secs(60), |log| {
            ACTORS
                .iter()
                .all(|a| log.iter().any(|q| q.path == format!("/busy-{a}")))
        });
        assert!(busy, "the relays did not start on host {k}");
        let o = origin(r);
        let asked = Instant::now();
        let changed = host_action(db, "block", &o, &["--dead-letter"]);
        let took = asked.elapsed();
        // Right after: on the lanes being delivered, and on new lanes.
        let late = |i: u32| format!("late-{k}-{i}");
        db.enqueue_lines(
            "alice",
            &[
                row(&late(0), &r.url("/busy-alice")),
                row(&late(1), &r.url("/new-alice")),
                row(&late(2), &r.url("/new-alice")),
            ],
        );
        db.enqueue_lines(
            "bob",
            &[
                row(&late(3), &r.url("/busy-bob")),
                row(&late(4), &r.url("/new-bob")),
            ],
        );
        let is_late = |n: &str| n.starts_with(&format!("late-{k}-"));
        let late_sent = || {
            r.all_requests()
                .iter()
                .filter(|q| is_late(&n_of(q)))
                .map(|q| format!("{} {}", q.path, n_of(q)))
                .collect::<Vec<_>>()
        };
        let late_dead = || {
            dead_letters(db)
                .into_iter()
                .filter(|d| is_late(d["row_id"].as_str().unwrap()))
                .collect::<Vec<_>>()
        };
        eventually(|| late_dead().len() == 5 || !late_sent().is_empty());
        let sent = late_sent();
        let dead = late_dead();
        eprintln!(
            "host {k}: block --dead-letter changed {changed} (the command took {}); late rows \
             sent {sent:?}; late dead letters {}",
            ms(took),
            dead.len()
        );
        assert!(
            sent.is_empty(),
            "host {k}: rows enqueued after `hosts block --dead-letter` returned reached the \
             host: {sent:?}"
        );
        assert_eq!(dead.len(), 5, "host {k}: {dead:?}");
        for d in &dead {
            assert_eq!(d["reason"], "blocked", "{d}");
            assert_eq!(d["attempts"], 0, "{d}");
        }
    }
    stop_all(running);
}

#[test]
fn dead_letter_block_reaches_a_busy_relay_on_sqlite() {
    dead_letter_block_reaches_busy_relays(&Db::new(), 1);
}

#[test]
fn dead_letter_block_reaches_two_busy_relays_on_postgres() {
    on_postgres("hf_dl_busy", |db| {
        dead_letter_block_reaches_busy_relays(db, 2)
    });
}

/// Two rounds, one host each, while the relays are busy with another host (`busy`: a pass
/// runs) or have nothing to do (a pass starts on the rows): a plain `hosts block` of a host
/// with no lanes yet; rows enqueued for it right after are not sent, and their lanes read
/// paused, "host blocked by an operator". `hosts unblock` then delivers them in order.
fn plain_block_holds_lanes_met_later(db: &Db, relays: usize, busy: bool) {
    migrate(db);
    let other = Recipient::start().unwrap();
    other.set_server_default(Reply::Status(200).after(SLOW));
    let hosts = [Recipient::start().unwrap(), Recipient::start().unwrap()];
    if busy {
        for a in ACTORS {
            let lines: Vec<String> = (0..20)
                .map(|i| row(&format!("busy-{i}"), &other.url(&format!("/busy-{a}"))))
                .collect();
            db.enqueue_lines(a, &lines);
        }
    }
    let running = start_relays(db, relays);
    if busy {
        let started = other.wait_until(Duration::from_secs(60), |log| {
            ACTORS
                .iter()
                .all(|a| log.iter().any(|q| q.path == format!("/busy-{a}")))
        });
        assert!(started, "the relays did not start");
    }
    for (k, r) in hosts.iter().enumerate() {
        let changed = host_action(db, "block", &origin(r), &[]);
        assert_eq!(changed, 0, "host {k} has no lanes yet");
        db.enqueue_lines(
            "alice",
            &(0..3)
                .map(|i| row(&format!("h{k}-{i}"), &r.url("/alice")))
                .collect::<Vec<_>>(),
        );
        db.enqueue_lines(
            "bob",
            &(0..2)
                .map(|i| row(&format!("h{k}-{i}"), &r.url("/bob")))
                .collect::<Vec<_>>(),
        );
        eventually(|| {
            let l = lanes_on(db, r);
            (l.len() == 2 && l.iter().all(held)) || r.count_all() > 0
        });
        assert_eq!(
            r.count_all(),
            0,
            "host {k}: rows enqueued after `hosts block` returned reached it: {:?}",
            r.all_requests().iter().map(n_of).collect::<Vec<_>>()
        );
        let l = lanes_on(db, r);
        assert_eq!(l.len(), 2, "{l:?}");
        for lane in &l {
            assert_eq!(
                (
                    lane["state"].as_str(),
                    lane["paused"].as_bool(),
                    lane["pause_reason"].as_str()
                ),
                (Some("paused"), Some(true), Some(HOST_BLOCKED)),
                "host {k}: {lane}"
            );
        }
    }
    for (k, r) in hosts.iter().enumerate() {
        let changed = host_action(db, "unblock", &origin(r), &[]);
        assert_eq!(changed, 2, "host {k}: two lanes resumed");
        assert!(
            eventually(|| delivered(r, "/alice").len() == 3 && delivered(r, "/bob").len() == 2),
            "host {k} after unblock: {:?} {:?}",
            delivered(r, "/alice"),
            delivered(r, "/bob")
        );
        let want = |n: u32| (0..n).map(|i| format!("h{k}-{i}")).collect::<Vec<_>>();
        assert_eq!(delivered(r, "/alice"), want(3));
        assert_eq!(delivered(r, "/bob"), want(2));
    }
    stop_all(running);
}

#[test]
fn plain_block_reaches_a_busy_relay_on_sqlite() {
    plain_block_holds_lanes_met_later(&Db::new(), 1, true);
}

#[test]
fn plain_block_reaches_two_busy_relays_on_postgres() {
    on_postgres("hf_hold_busy", |db| {
        plain_block_holds_lanes_met_later(db, 2, true)
    });
}

#[test]
fn plain_block_reaches_an_idle_relay_on_sqlite() {
    plain_block_holds_lanes_met_later(&Db::new(), 1, false);
}

#[test]
fn plain_block_reaches_two_idle_relays_on_postgres() {
    on_postgres("hf_hold_idle", |db| {
        plain_block_holds_lanes_met_later(db, 2, false)
    });
}

// ---------------------------------------------------------------------------------------------
// 2. Attempts in flight when a `--dead-letter` block commits are recorded on their dead
//    letters.

/// 10 lanes (5 per actor) of 10 rows to a host answering 200 after 300 ms; `hosts block
/// --dead-letter` while attempts are out. Every unit the host answered 200 that is now a dead
/// letter says so (the delivered-after-set-aside marker, attempts ≥ 1), and no other does;
/// every dead letter counts the requests its unit really made.
fn in_flight_attempts_are_recorded_on_their_dead_letters(db: &Db, relays: usize) {
    let r = Recipient::start().unwrap();
    r.set_server_default(Reply::Status(200).after(SLOW));
    const LANES: usize = 10;
    const ROWS: usize = 10;
    for (a, actor) in ACTORS.iter().enumerate() {
        let lines: Vec<String> = (0..LANES / 2)
            .flat_map(|l| {
                let lane = a * LANES / 2 + l;
                let to = r.url(&format!("/lane-{lane}"));
                (0..ROWS).map(move |i| row(&format!("l{lane}-{i}"), &to))
            })
            .collect();
        db.enqueue_lines(actor, &lines);
    }
    let running = start_relays(db, relays);
    let busy = r.wait_until(Duration::from_secs(60), |log| {
        let lanes: BTreeSet<&str> = log.iter().map(|q| q.path.as_str()).collect();
        lanes.len() == LANES && log.iter().filter(|q| q.completion.is_pending()).count() >= 3
    });
    assert!(busy, "the relays did not start every lane");
    let asked = Instant::now();
    let changed = host_action(db, "block", &origin(&r), &["--dead-letter"]);
    let took = asked.elapsed();
    let flying = r
        .all_requests()
        .iter()
        .filter(|q| q.completion.is_pending())
        .count();
    // Every request the host got is answered, then the relays stop (recording what they got).
    assert!(
        r.wait_until(Duration::from_secs(60), |log| log
            .iter()
            .all(|q| !q.completion.is_pending())),
        "requests still pending"
    );
    stop_all(running);

    // (path, row) → the requests of that unit, and whether one was answered 200.
    let mut requests: BTreeMap<(String, String), (u64, bool)> = BTreeMap::new();
    for q in r.all_requests() {
        let e = requests.entry((q.path.clone(), n_of(&q))).or_default();
        e.0 += 1;
        e.1 |= q.completion.status() == Some(200);
    }
    let dead = dead_letters(db);
    let mut dead_units = BTreeSet::new();
    let mut marked = BTreeSet::new();
    let mut answered_dead = BTreeSet::new();
    for d in &dead {
        assert_eq!(d["reason"], "blocked", "{d}");
        let key = (
            path_of(&r, d["recipient"].as_str().unwrap()).to_owned(),
            d["row_id"].as_str().unwrap().to_owned(),
        );
        let (made, ok) = requests.get(&key).copied().unwrap_or_default();
        assert_eq!(
            d["attempts"].as_u64(),
            Some(made),
            "{key:?}: {made} request(s) reached the host, its dead letter says otherwise: {d}"
        );
        if ok {
            answered_dead.insert(key.clone());
        }
        if d["last_error"] == DELIVERED_AFTER_SET_ASIDE {
            assert!(d["attempts"].as_u64().unwrap() >= 1, "{d}");
            marked.insert(key.clone());
        }
        dead_units.insert(key);
    }
    eprintln!(
        "block --dead-letter: changed {changed} (the command took {}), {flying} request(s) \
         pending at the host when it returned, {} dead letters, {} answered 200 after they were \
         set aside, {} marked",
        ms(took),
        dead.len(),
        answered_dead.len(),
        marked.len()
    );
    assert!(
        !answered_dead.is_empty(),
        "no attempt was in flight at the block"
    );
    assert_eq!(
        answered_dead, marked,
        "units the host answered 200 that are dead letters vs dead letters marked `{DELIVERED_AFTER_SET_ASIDE}`"
    );
    // Every unit was delivered (answered 200, no dead letter) or is a dead letter.
    for lane in 0..LANES {
        for i in 0..ROWS {
            let key = (format!("/lane-{lane}"), format!("l{lane}-{i}"));
            let ok = requests.get(&key).is_some_and(|e| e.1);
            assert!(ok || dead_units.contains(&key), "{key:?}: lost");
        }
    }

    // A replay of every dead letter leaves out the marked ones (their recipient has them):
    // after it and a drain, every unit was answered 200 exactly once, and the marked dead
    // letters are still listed.
    host_action(db, "unblock", &origin(&r), &[]);
    let dry = json_of(
        db,
        &["dead-letters", "replay", "--all", "--dry-run", "--json"],
    );
    assert_eq!(
        dry["skipped_delivered"].as_u64(),
        Some(marked.len() as u64),
        "{dry}"
    );
    let to_replay = (dead.len() - marked.len()) as u64;
    assert_eq!(dry["would_replay"].as_u64(), Some(to_replay), "{dry}");
    let text = text_of(db, &["dead-letters", "replay", "--all", "--dry-run"]);
    assert!(
        text.contains(&format!("skipped {} dead letter(s)", marked.len())),
        "{text}"
    );
    let done = json_of(db, &["dead-letters", "replay", "--all", "--json"]);
    assert_eq!(
        done["skipped_delivered"].as_u64(),
        Some(marked.len() as u64),
        "{done}"
    );
    text_of(db, &["drain"]);
    let mut oks: BTreeMap<(String, String), u64> = BTreeMap::new();
    for q in r.all_requests() {
        if q.completion.status() == Some(200) {
            *oks.entry((q.path.clone(), n_of(&q))).or_default() += 1;
        }
    }
    for lane in 0..LANES {
        for i in 0..ROWS {
            let key = (format!("/lane-{lane}"), format!("l{lane}-{i}"));
            assert_eq!(
                oks.get(&key),
                Some(&1),
                "{key:?}: answered 200 this many times"
            );
        }
    }
    let left: BTreeSet<(String, String)> = dead_letters(db)
        .iter()
        .map(|d| {
            assert_eq!(d["last_error"], DELIVERED_AFTER_SET_ASIDE, "{d}");
            (
                path_of(&r, d["recipient"].as_str().unwrap()).to_owned(),
                d["row_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(left, marked, "the dead letters the replay left");
    // Named by id, one is skipped too; --include-delivered would replay every one.
    let id = dead_letters(db)[0]["id"].as_i64().unwrap().to_string();
    let by_id = json_of(
        db,
        &["dead-letters", "replay", "--id", &id, "--dry-run", "--json"],
    );
    assert_eq!(
        (
            by_id["would_replay"].as_u64(),
            by_id["skipped_delivered"].as_u64()
        ),
        (Some(0), Some(1)),
        "{by_id}"
    );
    let all = json_of(
        db,
        &[
            "dead-letters",
            "replay",
            "--all",
            "--include-delivered",
            "--dry-run",
            "--json",
        ],
    );
    assert_eq!(
        (
            all["would_replay"].as_u64(),
            all["skipped_delivered"].as_u64()
        ),
        (Some(marked.len() as u64), Some(0)),
        "{all}"
    );
}

#[test]
fn in_flight_attempts_are_recorded_on_their_dead_letters_on_sqlite() {
    in_flight_attempts_are_recorded_on_their_dead_letters(&Db::new(), 1);
}

#[test]
fn in_flight_attempts_are_recorded_on_their_dead_letters_with_two_relays_on_postgres() {
    on_postgres("hf_in_flight", |db| {
        in_flight_attempts_are_recorded_on_their_dead_letters(db, 2)
    });
}

// ---------------------------------------------------------------------------------------------
// 3. A replay right after an unblock is delivered.

/// A host blocked with `--dead-letter` before the relays start; 5 rows for it (both actors)
/// become dead letters `blocked`; `hosts unblock`, then at once `dead-letters replay --all`:
/// every replayed unit is delivered, in order per lane, none is dead-lettered again.
fn replay_right_after_unblock_is_delivered(db: &Db, relays: usize) {
    migrate(db);
    let r = Recipient::start().unwrap();
    let o = origin(&r);
    assert_eq!(host_action(db, "block", &o, &["--dead-letter"]), 0);
    let running = start_relays(db, relays);
    db.enqueue_lines(
        "alice",
        &(0..3)
            .map(|i| row(&format!("a{i}"), &r.url("/a")))
            .collect::<Vec<_>>(),
    );
    db.enqueue_lines(
        "bob",
        &(0..2)
            .map(|i| row(&format!("b{i}"), &r.url("/b")))
            .collect::<Vec<_>>(),
    );
    eventually(|| dead_letters(db).len() == 5 || r.count_all() > 0);
    assert_eq!(r.count_all(), 0, "the blocked host got a request");
    let dead = dead_letters(db);
    assert_eq!(dead.len(), 5, "{dead:?}");
    assert!(dead.iter().all(|d| d["reason"] == "blocked"), "{dead:?}");

    assert_eq!(host_action(db, "unblock", &o, &[]), 0);
    let replayed = json_of(db, &["dead-letters", "replay", "--all", "--json"]);
    assert_eq!(replayed["replayed"], 5, "{replayed}");
    let done = || delivered(&r, "/a").len() == 3 && delivered(&r, "/b").len() == 2;
    eventually(|| done() || !dead_letters(db).is_empty());
    let again = dead_letters(db);
    assert!(
        again.is_empty(),
        "replayed right after `hosts unblock`, dead-lettered again: {again:?}"
    );
    assert!(
        eventually(done),
        "{:?} {:?}",
        delivered(&r, "/a"),
        delivered(&r, "/b")
    );
    assert_eq!(delivered(&r, "/a"), ["a0", "a1", "a2"]);
    assert_eq!(delivered(&r, "/b"), ["b0", "b1"]);
    assert!(dead_letters(db).is_empty());
    stop_all(running);
}

#[test]
fn replay_right_after_unblock_is_delivered_on_sqlite() {
    replay_right_after_unblock_is_delivered(&Db::new(), 1);
}

#[test]
fn replay_right_after_unblock_is_delivered_with_two_relays_on_postgres() {
    on_postgres("hf_replay", |db| {
        replay_right_after_unblock_is_delivered(db, 2)
    });
}

// ---------------------------------------------------------------------------------------------
// 4. The lanes an unblock or a retry releases come back at once.

/// Prints how long after `t` the first and the last of the host's deliveries arrived.
fn print_latencies(what: &str, r: &Recipient, t: Instant) {
    let after: Vec<Instant> = answered(r)
        .iter()
        .map(|(at, ..)| *at)
        .filter(|at| *at > t)
        .collect();
    if let (Some(first), Some(last)) = (after.iter().min(), after.iter().max()) {
        eprintln!(
            "{what}: first delivery {} after it returned, last ({} deliveries) {}",
            ms(*first - t),
            after.len(),
            ms(*last - t)
        );
    }
}

/// 50 lanes (25 per actor, 2 rows each) enqueued while their host is blocked: each reads
/// paused, "host blocked by an operator" (`lanes --json` and the `lanes` table), `status
/// --json` counts them as paused, not in backoff; right after `hosts unblock` returns none is
/// paused or waits for a time, and all 100 rows are delivered in order per lane.
fn unblock_releases_50_held_lanes_at_once(db: &Db, relays: usize) {
    migrate(db);
    let r = Recipient::start().unwrap();
    let o = origin(&r);
    assert_eq!(host_action(db, "block", &o, &[]), 0);
    let running = start_relays(db, relays);
    for a in ACTORS {
        let lines: Vec<String> = (0..25)
            .flat_map(|l| {
                let to = r.url(&format!("/{a}/{l}"));
                (0..2).map(move |i| row(&format!("{l}-{i}"), &to))
            })
            .collect();
        db.enqueue_lines(a, &lines);
    }
    eventually(|| {
        let l = lanes_on(db, &r);
        (l.len() == 50 && l.iter().all(held)) || r.count_all() > 0
    });
    assert_eq!(r.count_all(), 0, "the blocked host got a request");
    let held_lanes = lanes_on(db, &r);
    assert_eq!(held_lanes.len(), 50);
    for lane in &held_lanes {
        assert_eq!(
            (lane["state"].as_str(), lane["pause_reason"].as_str()),
            (Some("paused"), Some(HOST_BLOCKED)),
            "{lane}"
        );
    }
    for a in ACTORS {
        // The table says why.
        let table = text_of(db, &["lanes", "--actor", a]);
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with(&o)).collect();
        assert_eq!(rows.len(), 25, "{table}");
        for line in rows {
            assert!(
                line.contains(&format!("paused ({HOST_BLOCKED})")),
                "{line}\n{table}"
            );
        }
    }
    // `status --json`: paused, not in backoff.
    let status = json_of(db, &["status", "--json"]);
    for a in ACTORS {
        let s = status["actors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["actor"] == a)
            .unwrap_or_else(|| panic!("{a} in {status}"));
        let on_host = |key: &str| -> Vec<Value> {
            s[key]
                .as_array()
                .unwrap()
                .iter()
                .filter(|l| l["recipient"].as_str().unwrap().starts_with(&o))
                .cloned()
                .collect()
        };
        assert_eq!(on_host("lanes_in_backoff"), Vec::<Value>::new(), "{s}");
        let paused = on_host("lanes_paused");
        assert_eq!(paused.len(), 25, "{s}");
        assert!(paused.iter().all(|l| l["state"] == "paused"), "{s}");
    }
    let h = json_of(db, &["hosts", "--json"]);
    let h = h["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["origin"] == o.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{o} in {h}"));
    assert_eq!(
        (
            h["state"].as_str(),
            h["lanes"].as_u64(),
            h["pending"].as_u64()
        ),
        (Some("blocked"), Some(50), Some(100)),
        "{h}"
    );

    let asked = Instant::now();
    let changed = host_action(db, "unblock", &o, &[]);
    let unblocked = Instant::now();
    eprintln!("hosts unblock of 50 lanes took {}", ms(unblocked - asked));
    let now = lanes_on(db, &r);
    assert_eq!(changed, 50);
    let still: Vec<&Value> = now.iter().filter(|l| held(l)).collect();
    assert!(
        still.is_empty(),
        "right after `hosts unblock` returned, lanes still held: {still:?}"
    );
    assert!(
        eventually(|| answered(&r).len() >= 100),
        "only {} of 100 rows delivered",
        answered(&r).len()
    );
    print_latencies(
        &format!("hosts unblock, 50 lanes, {relays} relay(s)"),
        &r,
        unblocked,
    );
    for a in ACTORS {
        for l in 0..25 {
            assert_eq!(
                delivered(&r, &format!("/{a}/{l}")),
                [format!("{l}-0"), format!("{l}-1")]
            );
        }
    }
    stop_all(running);
}

#[test]
fn unblock_releases_50_held_lanes_at_once_on_sqlite() {
    unblock_releases_50_held_lanes_at_once(&Db::new(), 1);
}

#[test]
fn unblock_releases_50_held_lanes_at_once_with_two_relays_on_postgres() {
    on_postgres("hf_unblock", |db| {
        unblock_releases_50_held_lanes_at_once(db, 2)
    });
}

/// 50 lanes (25 per actor, 2 rows each) to a host that resets every connection: it backs off
/// and its lanes wait for a time. The host comes back; `hosts retry`: right after it returns
/// the host reads open, its failures and last error forgotten, and none of its lanes waits;
/// none is made to wait again before everything is delivered, and all 100 rows are delivered
/// in order per lane.
fn retry_brings_a_returned_hosts_lanes_back_at_once(db: &Db, relays: usize) {
    let r = Recipient::start().unwrap();
    r.set_server_default(Reply::Reset);
    let o = origin(&r);
    for a in ACTORS {
        let lines: Vec<String> = (0..25)
            .flat_map(|l| {
                let to = r.url(&format!("/{a}/{l}"));
                (0..2).map(move |i| row(&format!("{l}-{i}"), &to))
            })
            .collect();
        db.enqueue_lines(a, &lines);
    }
    let running = start_relays(db, relays);
    let host = || {
        let h = json_of(db, &["hosts", "--json"]);
        h["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["origin"] == o.as_str())
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert!(
        eventually(|| host()["state"] == "backoff" && lanes_on(db, &r).iter().all(waits)),
        "the host did not back off with every lane waiting: {} {:?}",
        host(),
        lanes_on(db, &r)
    );
    let tried = r.count_all();
    // The host is back.
    r.set_server_default(Reply::Status(200));
    let asked = Instant::now();
    let changed = host_action(db, "retry", &o, &[]);
    let retried = Instant::now();
    eprintln!("hosts retry of 50 lanes took {}", ms(retried - asked));
    let now = lanes_on(db, &r);
    let h = host();
    eprintln!("hosts retry: changed {changed}; {tried} connection(s) reset before");
    // Its failures are forgotten: no failure, no last error, no probe planned.
    assert_eq!(
        (
            h["state"].as_str(),
            h["failures"].as_u64(),
            h["backoff_level"].as_u64(),
            &h["last_error"],
            &h["next_probe"]
        ),
        (Some("open"), Some(0), Some(0), &Value::Null, &Value::Null),
        "right after `hosts retry`: {h}"
    );
    let waiting: Vec<&Value> = now.iter().filter(|l| waits(l)).collect();
    assert!(
        waiting.is_empty(),
        "right after `hosts retry` returned, lanes still wait: {waiting:?}"
    );
    // Until everything is delivered, no lane of the host is made to wait again.
    let mut rewaited: Vec<Value> = Vec::new();
    let all = eventually(|| {
        rewaited.extend(lanes_on(db, &r).into_iter().filter(waits));
        answered(&r).len() >= 100
    });
    assert!(
        rewaited.is_empty(),
        "lanes made to wait again after `hosts retry`: {rewaited:?}"
    );
    assert!(all, "only {} of 100 rows delivered", answered(&r).len());
    print_latencies(
        &format!("hosts retry, 50 lanes, {relays} relay(s)"),
        &r,
        retried,
    );
    for a in ACTORS {
        for l in 0..25 {
            assert_eq!(
                delivered(&r, &format!("/{a}/{l}")),
                [format!("{l}-0"), format!("{l}-1")]
            );
        }
    }
    let h = host();
    assert_eq!(
        (h["state"].as_str(), h["failures"].as_u64()),
        (Some("open"), Some(0)),
        "{h}"
    );
    stop_all(running);
}

#[test]
fn retry_brings_a_returned_hosts_lanes_back_at_once_on_sqlite() {
    retry_brings_a_returned_hosts_lanes_back_at_once(&Db::new(), 1);
}

#[test]
fn retry_brings_a_returned_hosts_lanes_back_at_once_with_two_relays_on_postgres() {
    on_postgres("hf_retry", |db| {
        retry_brings_a_returned_hosts_lanes_back_at_once(db, 2)
    });
}
