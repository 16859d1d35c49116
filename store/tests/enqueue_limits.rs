//! Enqueue limits checked before any write (OL-4), on a SQLite file, SQLite in memory and
//! Postgres (when `OUTBOX_LANES_TEST_PG` is set).
#![allow(missing_docs, clippy::std_instead_of_core)]

#[macro_use]
mod common;

use common::*;
use outbox_lanes_store::*;

const A: &str = "https://a.example/inbox";

contract!(
    too_many_recipients_refuse_the_batch,
    content_type_must_be_a_header_value,
);

// On every store: Postgres too, since its tails' update is driven by the batch (it ran for
// more than 14 minutes with 200,000 lanes when it was quadratic).
#[test]
fn a_large_fan_out_enqueues_on_a_sqlite_file() {
    a_large_fan_out_enqueues(Backend::SqliteFile);
}

#[test]
fn a_large_fan_out_enqueues_in_memory() {
    a_large_fan_out_enqueues(Backend::SqliteMemory);
}

#[test]
fn a_large_fan_out_enqueues_on_postgres() {
    a_large_fan_out_enqueues(Backend::Postgres);
}

fn recipients(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("https://h{}.example/inbox/{i}", i % 97))
        .collect()
}

fn too_many_recipients_refuse_the_batch(b: Backend) {
    let common = CommonOptions {
        max_recipients: 10,
        ..CommonOptions::default()
    };
    run(b, common, |h| {
        let s = &*h.store;
        let a = actor("alice");
        let wide = NewRow {
            recipients: recipients(11),
            ..row("wide", &[])
        };
        let err = s
            .enqueue(&a, &[row("ok", &[A]), wide])
            .expect_err("refused");
        assert_eq!(
            err,
            EnqueueError::TooManyRecipients {
                row: "wide".into(),
                count: 11,
                max: 10
            }
        );
        assert!(err.to_string().contains("\"wide\""), "{err}");
        // Nothing of the batch was written, not even the good row before it.
        assert!(s.status().expect("status").is_empty());
        assert!(s.find_lane(&a, &key(A)).expect("find").is_none());
        // At the limit is fine.
        let done = s
            .enqueue(
                &a,
                &[NewRow {
                    recipients: recipients(10),
                    ..row("at-limit", &[])
                }],
            )
            .expect("at the limit");
        assert_eq!(done[0].units.len(), 10);
    });
}

/// One row of 200,000 recipients under a raised limit. With the quadratic duplicate check
/// this took minutes of CPU before the first write; the time is printed, never asserted.
fn a_large_fan_out_enqueues(b: Backend) {
    const N: usize = 200_000;
    let common = CommonOptions {
        max_recipients: N,
        ..CommonOptions::default()
    };
    run(b, common, |h| {
        let s = &*h.store;
        let a = actor("alice");
        let mut to = recipients(N);
        // The same inboxes spelled differently collapse to their lanes (OL-19).
        to.extend(
            to.clone()
                .into_iter()
                .take(5)
                .map(|u| u.replace("https://h", "HTTPS://H")),
        );
        let wide = NewRow {
            recipients: to,
            ..row("wide", &[])
        };
        let err = s
            .enqueue(&a, std::slice::from_ref(&wide))
            .expect_err("over the limit");
        assert!(matches!(err, EnqueueError::TooManyRecipients { count, .. } if count == N + 5));
        let mut wide = wide;
        wide.recipients.truncate(N - 5);
        wide.recipients.extend(
            recipients(5)
                .into_iter()
                .map(|u| u.replace("https://h", "HTTPS://H")),
        );
        let t = std::time::Instant::now();
        let done = s.enqueue(&a, &[wide]).expect("enqueue");
        println!(
            "{b:?}: enqueued one row of {N} recipients in {:?}",
            t.elapsed()
        );
        assert_eq!(done[0].units.len(), N - 5);
        let st = s.status().expect("status");
        assert_eq!(st[0].pending, (N - 5) as u64);
    });
}

fn content_type_must_be_a_header_value(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        for bad in [
            "text/plain\r\nX-Injected: 1",
            "text/plain\n",
            "text/\rplain",
            "text/plain\0",
            "text/plain\x07",
            "text/plain\x7f",
            "text/pläin",
            "",
            "  ",
        ] {
            let wrong = NewRow {
                content_type: bad.into(),
                ..row("wrong", &[A])
            };
            let err = s
                .enqueue(&a, &[row("ok", &[A]), wrong])
                .expect_err("refused");
            assert_eq!(
                err,
                EnqueueError::BadContentType {
                    row: "wrong".into(),
                    content_type: bad.into()
                },
                "{bad:?}"
            );
            assert!(err.to_string().contains("\"wrong\""), "{err}");
        }
        // Nothing of any refused batch was written.
        assert!(s.status().expect("status").is_empty());
        // A default row is JSON: never an empty Content-Type.
        assert_eq!(NewRow::default().content_type, "application/json");
        assert!(s.find_lane(&a, &key(A)).expect("find").is_none());
        let fine = NewRow {
            content_type:
                "application/ld+json; profile=\"https://www.w3.org/ns/activitystreams\"\t".into(),
            ..row("fine", &[A])
        };
        s.enqueue(&a, std::slice::from_ref(&fine))
            .expect("a valid header value");
        let t = acquire(s, &a, "t", std::time::Duration::from_secs(30));
        let unit = claim_lane(s, &t, lane_of(s, &a, A), 0, 10).units[0].id;
        assert_eq!(
            s.payload(unit).expect("payload").content_type,
            fine.content_type
        );
    });
}

// The header rules (`validate_headers`) need no store.

fn one(name: &str, value: &str) -> Vec<(String, String)> {
    vec![(name.to_owned(), value.to_owned())]
}

fn problem(headers: &[(String, String)]) -> Option<HeaderProblem> {
    validate_headers(headers).err().map(|r| r.problem)
}

#[test]
fn every_reserved_name_has_its_reason_whatever_its_case() {
    for name in RESERVED_HEADERS {
        let upper = name.to_ascii_uppercase();
        let p = problem(&one(&upper, "x")).unwrap();
        assert!(p.is_reserved(), "{name}: {p:?}");
    }
    for name in [
        "Proxy-Authorization",
        "Proxy-Authenticate",
        "Trailer",
        "Trailers",
        "TE",
        "Keep-Alive",
        "Upgrade",
        "Connection",
    ] {
        assert_eq!(
            problem(&one(name, "x")),
            Some(HeaderProblem::HopByHop),
            "{name}"
        );
    }
    for name in [
        "Host",
        "Content-Length",
        "Transfer-Encoding",
        "Idempotency-Key",
    ] {
        assert_eq!(problem(&one(name, "x")), Some(HeaderProblem::SetByClient));
    }
    for name in [
        "webhook-id",
        "Webhook-Signature",
        "Signature",
        "Digest",
        "Date",
    ] {
        assert_eq!(problem(&one(name, "x")), Some(HeaderProblem::SetBySigner));
    }
    // Names that merely start like a reserved one are the row's own.
    for name in ["Hostname", "X-Host", "Dates", "Webhook", "Proxy"] {
        assert_eq!(problem(&one(name, "x")), None, "{name}");
    }
}

#[test]
fn bad_names_values_and_repeats() {
    assert_eq!(problem(&one("X Bad", "1")), Some(HeaderProblem::BadName));
    assert_eq!(problem(&one("", "1")), Some(HeaderProblem::BadName));
    for bad in [
        "1\r\nHost: a",
        "a\nb",
        "a\rb",
        "a\0b",
        "a\x7fb",
        "a\x1bb",
        "tëxt/plain",
    ] {
        assert_eq!(
            problem(&one("X-V", bad)),
            Some(HeaderProblem::BadValue),
            "{bad:?}"
        );
    }
    for ok in ["text/plain; charset=utf-8", "a\tb", ""] {
        assert_eq!(problem(&one("X-V", ok)), None, "{ok:?}");
    }
    assert_eq!(
        problem(&one("X-Pad", " 1")),
        Some(HeaderProblem::Whitespace)
    );
    let twice = [one("X-A", "1"), one("x-a", "2")].concat();
    let err = validate_headers(&twice).unwrap_err();
    assert_eq!(
        (err.name.as_str(), err.problem),
        ("x-a", HeaderProblem::Repeated)
    );
    assert_eq!(err.to_string(), "header \"x-a\" refused: given twice");
}

#[test]
fn count_and_size_are_bounded() {
    let many: Vec<(String, String)> = (0..=MAX_HEADERS)
        .map(|i| (format!("X-{i}"), "1".to_owned()))
        .collect();
    assert_eq!(validate_headers(&many[..MAX_HEADERS]), Ok(()));
    let err = validate_headers(&many).unwrap_err();
    assert_eq!(
        (err.name, err.problem),
        (format!("X-{MAX_HEADERS}"), HeaderProblem::TooMany)
    );
    let big = "v".repeat(MAX_HEADER_BYTES / 2);
    let fits = [one("A", &big[1..]), one("B", &big[1..])].concat();
    assert_eq!(validate_headers(&fits), Ok(()));
    let over = [one("A", &big[1..]), one("B", &big)].concat();
    let err = validate_headers(&over).unwrap_err();
    assert_eq!(
        (err.name.as_str(), err.problem),
        ("B", HeaderProblem::TooLarge)
    );
}
