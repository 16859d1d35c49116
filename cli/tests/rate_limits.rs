//! Requests-per-second limits through the binary (issue 41, item 3; design.md OL-23):
//! `--endpoint-rate` and `--rate-limits FILE` space an endpoint's requests at least 1/N s
//! apart, per actor or per recipient, and a host's whichever endpoints and actors they are for, while an unlimited endpoint beside it is not slowed; a
//! wrong file stops drain and relay with exit 2, naming the entry, before anything is sent.
//!
//! Default settings but the limits; `--allow-private-destinations` comes from the common
//! environment. Recipients are on 127.0.0.1 and answer at once; every wait is bounded.
//! Assertions are about order and the least spacing between two arrivals (a lower bound the
//! limit guarantees: arrivals can come later than their starts, never sooner than the pace
//! allows, up to the network's few milliseconds), never an upper bound on time.
#![cfg(unix)]
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Db, collect, is_2xx, row};
use outbox_lanes_test_support::{Recipient, Recorded};

/// Slack for the network between the relay's start of a request and its arrival: two
/// arrivals of a lane paced at `pace` come at least `pace - SLACK` apart.
const SLACK: Duration = Duration::from_millis(15);

fn arrivals(r: &Recipient, path: &str) -> Vec<Recorded> {
    r.requests(path).into_iter().filter(is_2xx).collect()
}

/// The least gap between two consecutive arrivals.
fn least_gap(q: &[Recorded]) -> Duration {
    q.windows(2)
        .map(|w| w[1].arrived_at.duration_since(w[0].arrived_at))
        .min()
        .unwrap_or(Duration::MAX)
}

fn rows(prefix: &str, n: usize, to: &str) -> Vec<String> {
    (0..n).map(|i| row(&format!("{prefix}-{i}"), to)).collect()
}

fn drain(db: &Db, actor: &str, extra: &[&str]) -> common::Out {
    let args = [&["drain", "--actor", actor][..], extra].concat();
    collect(db.command(&args).spawn().unwrap(), "")
}

#[test]
fn an_endpoint_rate_spaces_requests_and_leaves_other_endpoints_alone() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rates.toml");
    // shop-1's "slow" endpoint at 8 per second; "fast" has no limit.
    std::fs::write(
        &file,
        format!(
            "[actors.\"shop-1\".recipients.\"{}\"]\nper_second = 8\n",
            r.url("/slow")
        ),
    )
    .unwrap();
    let mut lines = rows("slow", 16, &r.url("/slow"));
    lines.extend(rows("fast", 40, &r.url("/fast")));
    db.enqueue_lines("shop-1", &lines);
    let out = drain(&db, "shop-1", &["--rate-limits", file.to_str().unwrap()]);
    assert_eq!(out.code(), Some(0), "drain: {}", out.stderr);
    let slow = arrivals(&r, "/slow");
    let fast = arrivals(&r, "/fast");
    assert_eq!((slow.len(), fast.len()), (16, 40));
    // In order, and never closer than the pace allows.
    let order: Vec<String> = slow.iter().map(common::n_of).collect();
    let want: Vec<String> = (0..16).map(|i| format!("slow-{i}")).collect();
    assert_eq!(order, want);
    let pace = Duration::from_millis(125);
    assert!(
        least_gap(&slow) + SLACK >= pace,
        "two requests to the paced endpoint {:?} apart",
        least_gap(&slow)
    );
    // The unlimited endpoint was served while the paced one waited: all of it before the
    // paced endpoint's third request.
    assert!(
        fast.last().unwrap().index < slow[2].index,
        "the unlimited endpoint was slowed by the paced one"
    );
}

#[test]
fn endpoint_rate_paces_every_endpoint_and_a_file_entry_overrides_it() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rates.toml");
    // Every endpoint at 20/s by the flag; shop-2's at 5/s by the file.
    std::fs::write(&file, "[actors.\"shop-2\"]\nper_endpoint = 5\n").unwrap();
    db.enqueue_lines("shop-1", &rows("a", 10, &r.url("/a")));
    db.enqueue_lines("shop-2", &rows("b", 6, &r.url("/b")));
    for actor in ["shop-1", "shop-2"] {
        let out = drain(
            &db,
            actor,
            &[
                "--endpoint-rate",
                "20",
                "--rate-limits",
                file.to_str().unwrap(),
            ],
        );
        assert_eq!(out.code(), Some(0), "drain {actor}: {}", out.stderr);
    }
    let a = arrivals(&r, "/a");
    let b = arrivals(&r, "/b");
    assert_eq!((a.len(), b.len()), (10, 6));
    assert!(
        least_gap(&a) + SLACK >= Duration::from_millis(50),
        "{:?}",
        least_gap(&a)
    );
    assert!(
        least_gap(&b) + SLACK >= Duration::from_millis(200),
        "{:?}",
        least_gap(&b)
    );
}

#[test]
fn a_host_rate_spaces_the_requests_of_every_endpoint_and_actor_on_it() {
    let db = Db::new();
    let limited = Recipient::start().unwrap();
    let other = Recipient::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rates.toml");
    // The host at 10 per second, whichever of its endpoints and actors.
    std::fs::write(
        &file,
        format!(
            "[hosts.\"http://127.0.0.1:{}\"]\nper_second = 10\n",
            limited.addr().port()
        ),
    )
    .unwrap();
    for actor in ["shop-1", "shop-2"] {
        let mut lines = Vec::new();
        for ep in 0..3 {
            lines.extend(rows(
                &format!("{actor}-{ep}"),
                3,
                &limited.url(&format!("/{actor}/{ep}")),
            ));
        }
        lines.extend(rows(
            &format!("{actor}-other"),
            10,
            &other.url(&format!("/{actor}")),
        ));
        db.enqueue_lines(actor, &lines);
    }
    let relay = common::Relay::start(&db, &["--rate-limits", file.to_str().unwrap()], &[]);
    let all_in = limited.wait_until(Duration::from_secs(60), |q| q.len() >= 18)
        && other.wait_until(Duration::from_secs(60), |q| q.len() >= 20);
    assert!(
        all_in,
        "the limited host got {} of 18, the other {} of 20",
        limited.count_all(),
        other.count_all()
    );
    let (status, lines) = relay.stop();
    assert!(status.success(), "relay: {}", lines.join("\n"));
    let got: Vec<Recorded> = limited.all_requests();
    assert_eq!(got.len(), 18);
    assert!(
        least_gap(&got) + SLACK >= Duration::from_millis(100),
        "two requests to the paced host {:?} apart",
        least_gap(&got)
    );
    // The other host was not slowed: all of it before the limited host's fourth request.
    let others = other.all_requests();
    assert_eq!(others.len(), 20);
    assert!(
        others.iter().map(|q| q.arrived_at).max().unwrap() < got[3].arrived_at,
        "the unlimited host was slowed by the paced one"
    );
}

#[test]
fn a_wrong_rates_file_or_rate_is_refused_before_anything_is_sent() {
    let db = Db::new();
    let r = Recipient::start().unwrap();
    db.enqueue_lines("shop-1", &rows("a", 2, &r.url("/a")));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rates.toml");
    for (text, want) in [
        (
            "[actors.\"shop-1\"]\nper_endpoint = -3\n",
            "actors.\"shop-1\".per_endpoint: expected a number of requests per second above 0",
        ),
        (
            "[hosts.\"hooks.example\"]\nper_second = 3\n",
            "hosts.\"hooks.example\": write the host as https://host[:port]",
        ),
        ("[limits]\n", "unknown section [limits]"),
    ] {
        std::fs::write(&file, text).unwrap();
        let out = drain(&db, "shop-1", &["--rate-limits", file.to_str().unwrap()]);
        assert_eq!(out.code(), Some(2), "{text:?}: {}", out.stderr);
        assert!(out.stderr.contains(want), "{text:?}: {}", out.stderr);
        assert!(out.stderr.contains("nothing delivered"), "{}", out.stderr);
    }
    let out = drain(&db, "shop-1", &["--rate-limits", "/nonexistent/rates.toml"]);
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("/nonexistent/rates.toml"),
        "{}",
        out.stderr
    );
    let out = drain(&db, "shop-1", &["--endpoint-rate", "0"]);
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("is not a rate"), "{}", out.stderr);
    assert_eq!(r.count_all(), 0, "something was sent");
    // The rows are still there: a good run delivers them.
    let out = drain(&db, "shop-1", &["--endpoint-rate", "50"]);
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert_eq!(arrivals(&r, "/a").len(), 2);
}
