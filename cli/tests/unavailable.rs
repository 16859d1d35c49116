//! A lane (an endpoint) failing for longer than `--lane-unavailable-after`, through the binary
//! (issue 41, item 2; design.md OL-8; operator-guide "Endpoints that fail for days"): at its
//! next failure every pending unit of it is dead-lettered together (`lane_unavailable`), the
//! relay logs one WARN line and counts `outbox_lanes_lanes_unavailable_total{actor}`; a unit
//! enqueued for it later waits for the lane's next probe, and `lanes retry` brings it back at
//! once. Also: after a unit is dead-lettered `exhausted` the lane starts over, and
//! `--retry-schedule` refuses the flags it replaces (on the command line, from the
//! environment, and with the config file: there a setting is not silently dropped either).
//!
//! Default settings but the threshold (2 s instead of 7 days) and, for the restart test, a
//! short stall; `--allow-private-destinations` comes from the common environment. The main
//! scenario runs on SQLite and, as its `_on_postgres` twin, on a Postgres schema of its own
//! (skipped when `OUTBOX_LANES_TEST_PG` is not set). Every server is on 127.0.0.1 and stops
//! with its test; every wait is bounded; nothing asserts a wall-clock duration, only orders,
//! states and counts.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use common::{Db, Relay, collect, free_port, get_until, is_2xx, n_of, on_postgres, row};
use outbox_lanes_test_support::{Chooser, Recipient, Recorded, Reply};
use serde_json::Value;

const ACTOR: &str = "shop-1";
const WARN_TEXT: &str = "lane unavailable: failing for longer than allowed";

/// Polls `done` every 200 ms (each poll may run the binary) until it holds, for at most 60 s;
/// whether it came.
fn poll(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    done()
}

/// Every dead letter as (row id, reason, attempts), sorted.
fn dead_letters(db: &Db) -> Vec<(String, String, u64)> {
    let mut out: Vec<_> = db
        .dead_letters()
        .iter()
        .map(|d| {
            (
                d["row_id"].as_str().unwrap().to_owned(),
                d["reason"].as_str().unwrap().to_owned(),
                d["attempts"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    out.sort();
    out
}

/// The `lanes --actor ACTOR --json` entry of the lane to `to`.
fn lane(db: &Db, to: &str) -> Value {
    let all = db.json(&["lanes", "--actor", ACTOR, "--json"]);
    all["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["recipient"] == to)
        .unwrap_or_else(|| panic!("no lane to {to} in {all}"))
        .clone()
}

/// An RFC 3339 time of `lanes --json`.
fn time(v: &Value) -> SystemTime {
    let s = v
        .as_str()
        .unwrap_or_else(|| panic!("not an RFC 3339 time: {v}"));
    humantime::parse_rfc3339(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

/// A sample's value in a Prometheus text: the line `name value`.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The body's `n` of each request, in arrival order, with its status.
fn transcript(qs: &[Recorded]) -> Vec<(String, Option<u16>)> {
    qs.iter()
        .map(|q| (n_of(q), q.completion.status()))
        .collect()
}

/// A recipient answering 500 to everything until `up` is set, then 202.
fn switching_recipient(up: Arc<AtomicBool>) -> Recipient {
    let r = Recipient::start().unwrap();
    r.set_server_default(Reply::Choose(Chooser::new(move |_: &Recorded| {
        if up.load(Ordering::SeqCst) {
            Reply::Status(202)
        } else {
            Reply::Status(500)
        }
    })));
    r
}

/// Items 1 and 2: a dead endpoint's lane becomes unavailable and sets its 5 units aside
/// together after its head's third failure; a unit enqueued later waits for the next probe;
/// `lanes retry` (the endpoint back) delivers it at once and ends the run of failures.
fn unavailable_lane(db: &Db) {
    let up = Arc::new(AtomicBool::new(false));
    let r = switching_recipient(Arc::clone(&up));
    let to = r.url("/hook");
    let rows: Vec<String> = (0..5).map(|i| row(&format!("u{i}"), &to)).collect();
    db.enqueue_lines(ACTOR, &rows);

    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = Relay::start(
        db,
        &["--lane-unavailable-after", "2s", "--metrics-addr", &addr],
        &[],
    );

    // With the default ladder (1 s, 2 s, ±20 %) the head's run passes 2 s at its 3rd failure:
    // the head and the 4 units behind it are dead-lettered together.
    if !poll(|| db.dead_letters().len() >= 5) {
        let (dead, sent) = (dead_letters(db), transcript(&r.all_requests()));
        let (status, lines) = relay.stop();
        panic!(
            "not 5 dead letters: {dead:?}\nrequests: {sent:?}\nrelay {status:?}:\n{}",
            lines.join("\n")
        );
    }
    let dead = dead_letters(db);
    let reasons: Vec<(&str, &str)> = dead
        .iter()
        .map(|(id, reason, _)| (id.as_str(), reason.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("u0", "lane_unavailable"),
            ("u1", "lane_unavailable"),
            ("u2", "lane_unavailable"),
            ("u3", "lane_unavailable"),
            ("u4", "lane_unavailable"),
        ],
        "{dead:?}"
    );

    // Only the head was ever sent: about 3 attempts (2 if a slow machine let the second
    // failure come after 2 s), all answered 500; the units behind it were set aside unsent.
    let sent = transcript(&r.all_requests());
    assert!(
        (2..=3).contains(&sent.len()) && sent.iter().all(|(n, s)| n == "u0" && *s == Some(500)),
        "requests: {sent:?}"
    );
    assert_eq!(
        dead[0].2,
        sent.len() as u64,
        "the head's attempts are its requests: {dead:?}"
    );
    for (id, _, attempts) in &dead[1..] {
        assert_eq!(*attempts, 0, "{id} was never attempted: {dead:?}");
    }

    // Counted once for the actor, and the 5 dead letters by reason.
    let counter = format!("outbox_lanes_lanes_unavailable_total{{actor=\"{ACTOR}\"}}");
    let dead_counter = "outbox_lanes_dead_lettered_total{reason=\"lane_unavailable\"}";
    let (code, text) = get_until(port, "/metrics", |c, t| {
        c == 200 && sample(t, &counter).is_some() && sample(t, dead_counter) == Some(5.0)
    });
    assert_eq!(code, 200, "{text}");
    assert_eq!(sample(&text, &counter), Some(1.0), "{counter}:\n{text}");
    assert_eq!(sample(&text, dead_counter), Some(5.0), "{text}");

    // `lanes --json`: unavailable since the run passed the threshold, nothing pending.
    let l = lane(db, &to);
    assert_eq!(l["state"], "unavailable", "{l}");
    assert_eq!(l["depth"], 0, "{l}");
    assert!(
        time(&l["failing_since"]) <= time(&l["unavailable_since"]),
        "{l}"
    );
    assert!(!l["not_before"].is_null(), "no next probe: {l}");

    // Item 2: a unit enqueued now waits for the lane's next probe, not sent at once.
    let before = r.all_requests().len();
    db.enqueue_lines(ACTOR, &[row("late", &to)]);
    let l = lane(db, &to);
    assert_eq!(l["depth"], 1, "{l}");
    assert_eq!(l["state"], "unavailable", "{l}");
    assert!(
        time(&l["not_before"]) > time(&l["head_enqueued_at"]),
        "the next probe is not after the new unit's enqueue: {l}"
    );
    // A poll interval and a half (the relay's default poll is 1 s): nothing is sent.
    assert!(
        !r.wait_until(Duration::from_millis(1500), |log| log.len() > before),
        "sent at once to an unavailable lane: {:?}",
        transcript(&r.all_requests())
    );
    assert_eq!(
        dead_letters(db).len(),
        5,
        "the late unit set aside without a probe"
    );
    // `status` shows the lane as unavailable (among the lanes waiting for a time: its next
    // probe), in JSON and in its table; it said `backoff N` before.
    let st = db.json(&["status", "--json"]);
    let me = st["actors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["actor"] == ACTOR)
        .unwrap_or_else(|| panic!("{st}"));
    let waiting = me["lanes_in_backoff"].as_array().unwrap();
    assert_eq!(waiting.len(), 1, "{st}");
    assert_eq!(waiting[0]["recipient"], to.as_str(), "{st}");
    assert_eq!(waiting[0]["state"], "unavailable", "{st}");
    // Its next probe (none once that time passed; a later one after a probe failed).
    let next = &waiting[0]["next_attempt"];
    assert!(
        next.is_null() || time(next) >= time(&l["not_before"]),
        "{st}"
    );
    let out = collect(db.command(&["status"]).spawn().unwrap(), "");
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let table: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect();
    assert_eq!(table[0][4], "LANES IN BACKOFF", "{}", out.stdout);
    let row = table.iter().find(|r| r[0] == ACTOR).unwrap();
    assert_eq!(row[4], "1", "{}", out.stdout);
    assert!(
        table
            .iter()
            .any(|r| r.len() >= 3 && r[1] == to && r[2] == "unavailable"),
        "the lane's line:\n{}",
        out.stdout
    );

    // The endpoint is back; `lanes retry` brings the lane back at once.
    up.store(true, Ordering::SeqCst);
    let out = db.json(&[
        "lanes",
        "retry",
        "--actor",
        ACTOR,
        "--recipient",
        &to,
        "--json",
    ]);
    eprintln!("lanes retry: {out}");
    assert!(
        r.wait_until(Duration::from_secs(60), |log| log
            .iter()
            .any(|q| n_of(q) == "late" && is_2xx(q))),
        "the late unit not delivered after lanes retry: {:?}",
        transcript(&r.all_requests())
    );
    assert_eq!(
        transcript(&r.all_requests()[before..]),
        [("late".to_owned(), Some(202))],
        "after the retry: one attempt, delivered"
    );
    assert!(
        poll(|| {
            let l = lane(db, &to);
            l["depth"] == 0 && l["failing_since"].is_null() && l["unavailable_since"].is_null()
        }),
        "the run of failures not over: {}",
        lane(db, &to)
    );
    let l = lane(db, &to);
    assert_eq!(l["state"], "open", "{l}");
    assert_eq!(dead_letters(db).len(), 5);

    let (status, lines) = relay.stop();
    assert!(status.success(), "relay: {status:?}\n{}", lines.join("\n"));
    let warns: Vec<&String> = lines.iter().filter(|l| l.contains(WARN_TEXT)).collect();
    assert_eq!(
        warns.len(),
        1,
        "one WARN line per run of failures:\n{}",
        lines.join("\n")
    );
    assert!(
        warns[0].contains("WARN") && warns[0].contains(ACTOR) && warns[0].contains(&to),
        "{}",
        warns[0]
    );
}

#[test]
fn a_lane_failing_longer_than_allowed_is_dead_lettered_together_and_comes_back_on_retry() {
    unavailable_lane(&Db::new());
}

#[test]
fn a_lane_failing_longer_than_allowed_is_dead_lettered_together_and_comes_back_on_retry_on_postgres()
 {
    on_postgres("unavail", unavailable_lane);
}

/// The WARN line's message reads as one sentence: no run of blanks inside it (a string
/// literal broken over two source lines without `\` keeps the second line's indentation).
#[test]
fn the_lane_unavailable_warn_line_reads_as_one_sentence() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    r.set_server_default(Reply::Status(500));
    db.enqueue_lines(ACTOR, &[row("u0", &r.url("/hook"))]);
    let relay = Relay::start(&db, &["--lane-unavailable-after", "2s"], &[]);
    let done = poll(|| !db.dead_letters().is_empty());
    let (status, lines) = relay.stop();
    assert!(
        done && status.success(),
        "relay {status:?}:\n{}",
        lines.join("\n")
    );
    let warn = lines
        .iter()
        .find(|l| l.contains(WARN_TEXT))
        .unwrap_or_else(|| panic!("no WARN line:\n{}", lines.join("\n")));
    let message = warn
        .split_once("lane unavailable:")
        .and_then(|(_, m)| m.split_once(" actor="))
        .map_or(warn.as_str(), |(m, _)| m);
    assert!(
        !message.contains("  "),
        "a run of blanks in the WARN message: {warn:?}"
    );
}

/// After a unit is dead-lettered `exhausted` the lane starts over: its next unit gets a
/// schedule of its own at once, not the probe the dead head had reached. With
/// `--pass-attempts 1 --max-attempts 2 --backoff-base 2s`: u0 fails (stall, level 1), its
/// probe fails (exhausted); then the lane is at level 0 (or, once u1's first attempt failed,
/// at level 1 again), never at the level 2 the failed probe would have put it at.
#[test]
fn after_an_exhausted_head_the_lane_starts_over() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    r.set_server_default(Reply::Status(500));
    let to = r.url("/hook");
    db.enqueue_lines(ACTOR, &[row("u0", &to), row("u1", &to)]);
    let relay = Relay::start(
        &db,
        &[
            "--pass-attempts",
            "1",
            "--max-attempts",
            "2",
            "--backoff-base",
            "2s",
        ],
        &[],
    );
    if !poll(|| !db.dead_letters().is_empty()) {
        let sent = transcript(&r.all_requests());
        let (status, lines) = relay.stop();
        panic!(
            "u0 not dead-lettered; requests: {sent:?}\nrelay {status:?}:\n{}",
            lines.join("\n")
        );
    }
    let l = lane(&db, &to);
    // Read after the lane: the requests the lane's state may already reflect.
    let sent = r.all_requests().len();
    let level = l["backoff_level"].as_u64().unwrap();
    assert!(
        (level == 0 && l["not_before"].is_null()) || (level == 1 && sent >= 3),
        "the lane did not start over after its head was exhausted: {l} ({sent} requests)"
    );

    assert!(
        poll(|| db.dead_letters().len() >= 2),
        "u1 not dead-lettered: {:?}",
        transcript(&r.all_requests())
    );
    assert_eq!(
        dead_letters(&db),
        [
            ("u0".to_owned(), "exhausted".to_owned(), 2),
            ("u1".to_owned(), "exhausted".to_owned(), 2)
        ]
    );
    let sent: Vec<String> = r.all_requests().iter().map(n_of).collect();
    assert_eq!(sent, ["u0", "u0", "u1", "u1"]);
    let (status, lines) = relay.stop();
    assert!(status.success(), "relay: {status:?}\n{}", lines.join("\n"));
    assert!(
        !lines.iter().any(|l| l.contains(WARN_TEXT)),
        "{}",
        lines.join("\n")
    );
}

/// `drain` with `args` (nothing to deliver) and `env`: its exit code and stderr.
fn drain(db: &Db, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = collect(
        db.command(&[&["drain"], args].concat())
            .envs(env.iter().copied())
            .spawn()
            .unwrap(),
        "",
    );
    (out.code(), out.stderr)
}

/// Item 3: `--retry-schedule` replaces the flags it conflicts with: combining them is a usage
/// error (exit 2, one `error:` line); so is an unknown schedule. Alone, both names are taken.
#[test]
fn retry_schedule_takes_the_settings_given_one_by_one_and_refuses_bad_values() {
    let db = Db::new();
    let out = collect(db.command(&["migrate"]).spawn().unwrap(), "");
    assert_eq!(out.code(), Some(0), "migrate: {}", out.stderr);
    for name in ["svix", "standard"] {
        let (code, err) = drain(&db, &["--retry-schedule", name], &[]);
        assert_eq!(code, Some(0), "--retry-schedule {name}: {err}");
    }
    let (code, err) = drain(
        &db,
        &[
            "--lane-unavailable-after",
            "off",
            "--retry-schedule",
            "svix",
        ],
        &[],
    );
    assert_eq!(code, Some(0), "--lane-unavailable-after off: {err}");

    let refused = |args: &[&str], env: &[(&str, &str)], names: &[&str]| {
        let (code, err) = drain(&db, args, env);
        assert_eq!(code, Some(2), "{args:?} {env:?}: {err}");
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{args:?} {env:?}: {err}");
        for name in names {
            assert!(errors[0].contains(name), "{args:?} {env:?}: {err}");
        }
    };
    // The settings a schedule sets, given one by one, change its values (from the command
    // line or the environment alike): accepted.
    for (flag, value) in [
        ("--max-attempts", "3"),
        ("--retry-delays", "1s,2s"),
        ("--pass-attempts", "2"),
        ("--backoff-base", "10s"),
        ("--backoff-cap", "10m"),
    ] {
        let (code, err) = drain(&db, &["--retry-schedule", "svix", flag, value], &[]);
        assert_eq!(code, Some(0), "--retry-schedule svix {flag} {value}: {err}");
    }
    let (code, err) = drain(
        &db,
        &["--max-attempts", "3"],
        &[("OUTBOX_LANES_RETRY_SCHEDULE", "svix")],
    );
    assert_eq!(
        code,
        Some(0),
        "OUTBOX_LANES_RETRY_SCHEDULE=svix --max-attempts 3: {err}"
    );
    refused(&["--retry-schedule", "bogus"], &[], &["bogus"]);
    refused(&["--lane-unavailable-after", "soon"], &[], &["soon"]);
}

/// A config file with `content` in the test's directory; its path.
fn config_file(db: &Db, name: &str, content: &str) -> String {
    let file = db.path(name);
    std::fs::write(&file, content).unwrap();
    file.to_str().unwrap().to_owned()
}

/// `--retry-schedule` from the config file and `--max-attempts 1` on the command line: the
/// flag wins over the file (operator-guide, "From the binary"), or the two are refused as
/// combined (exit 2). Not: the file's schedule silently replacing the command line's attempts.
#[test]
fn a_command_line_flag_is_not_overridden_by_a_retry_schedule_from_the_config_file() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    r.set_server_default(Reply::Status(500));
    db.enqueue_lines(ACTOR, &[row("u0", &r.url("/hook"))]);
    let file = config_file(&db, "svix.toml", "retry-schedule = \"svix\"\n");
    let (code, err) = drain(&db, &["--config", &file, "--max-attempts", "1"], &[]);
    let sent = transcript(&r.all_requests());
    let dead = dead_letters(&db);
    assert!(
        code == Some(2)
            || (code == Some(0)
                && sent.len() == 1
                && dead == [("u0".to_owned(), "exhausted".to_owned(), 1)]),
        "--max-attempts 1 under a config file's retry-schedule = \"svix\": exit {code:?}, \
         requests {sent:?}, dead letters {dead:?}\n{err}"
    );
}

/// `retry-schedule` and a setting it sets, in one config file: the setting changes the
/// schedule's value, as on the command line (`svix` with one attempt: one request, then the
/// dead letter), not one of them silently dropped.
#[test]
fn a_retry_schedule_and_a_setting_of_it_in_one_config_file_both_apply() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    r.set_server_default(Reply::Status(500));
    db.enqueue_lines(ACTOR, &[row("u0", &r.url("/hook"))]);
    let file = config_file(
        &db,
        "both.toml",
        "retry-schedule = \"svix\"\nmax-attempts = 1\n",
    );
    let (code, err) = drain(&db, &["--config", &file], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(transcript(&r.all_requests()).len(), 1, "{err}");
    assert_eq!(
        dead_letters(&db),
        [("u0".to_owned(), "exhausted".to_owned(), 1)],
        "{err}"
    );
}
