//! Issue 39: per-host figures from the delivery log (`ServiceStore::host_figures`): attempts
//! per outcome class, success rate and latency percentiles per origin since a time, against
//! a SQLite file, SQLite in memory and Postgres (when `OUTBOX_LANES_TEST_PG` is set).
#![allow(missing_docs, clippy::std_instead_of_core)]

#[macro_use]
mod common;

use std::time::Duration;

use common::*;
use outbox_lanes_core::Timestamp;
use outbox_lanes_store::*;

/// Two recipients on one host (their lanes count together), one on another.
const A1: &str = "https://a.example/inbox";
const A2: &str = "https://a.example/users/x/inbox";
const B: &str = "http://b.example:8080/inbox";

contract!(
    host_figures_count_outcomes_per_origin_since_a_time,
    host_figures_are_empty_with_the_log_off,
);

/// An entry; `outcome` is (duration in ms, status, error class).
fn entry(
    unit: outbox_lanes_core::UnitId,
    lane: StoreLaneId,
    row: &str,
    attempt: u32,
    started_at: Timestamp,
    outcome: (u64, Option<u16>, Option<&str>),
) -> DeliveryLogEntry {
    let (duration_ms, status, class) = outcome;
    DeliveryLogEntry {
        unit,
        lane,
        row_id: row.to_owned(),
        attempt,
        started_at,
        duration_ms,
        status,
        error_class: class.map(str::to_owned),
        body: None,
        delivered: status.is_some_and(|s| (200..300).contains(&s)),
    }
}

fn attempt(
    unit: outbox_lanes_core::UnitId,
    lane: StoreLaneId,
    n: u32,
    status: Option<u16>,
) -> AttemptRecord {
    AttemptRecord {
        unit,
        lane,
        attempts: n,
        status,
        error: Some("failed".into()),
        at: now(),
    }
}

fn host_figures_count_outcomes_per_origin_since_a_time(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        assert!(s.host_figures(now()).expect("figures").is_empty());
        s.enqueue(&a, &[row("r0", &[A1, A2, B]), row("r1", &[A1])])
            .expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let (la1, la2, lb) = (lane_of(s, &a, A1), lane_of(s, &a, A2), lane_of(s, &a, B));
        let u1 = claim_lane(s, &t, la1, 0, 10).units;
        let u2 = claim_lane(s, &t, la2, 0, 10).units;
        let ub = claim_lane(s, &t, lb, 0, 10).units;
        let t0 = now();
        let old = Timestamp::from_millis(t0.as_millis() - 2 * 3600 * 1000);
        // A: a 503 two hours ago (outside the window), a timeout, then three deliveries.
        s.record_attempts_logged(
            &t,
            &[attempt(u1[0].id, la1, 2, None)],
            &[
                entry(
                    u1[0].id,
                    la1,
                    "r0",
                    1,
                    old,
                    (900, Some(503), Some("status 503")),
                ),
                entry(u1[0].id, la1, "r0", 2, t0, (30_000, None, Some("timeout"))),
            ],
        )
        .expect("record");
        s.ack_logged(
            &t,
            &[(u1[0].id, la1), (u1[1].id, la1), (u2[0].id, la2)],
            &[
                entry(u1[0].id, la1, "r0", 3, t0, (10, Some(200), None)),
                entry(u1[1].id, la1, "r1", 1, t0, (20, Some(202), None)),
                entry(u2[0].id, la2, "r0", 1, t0, (40, Some(204), None)),
            ],
        )
        .expect("ack");
        // B: a 410 and a connection refused.
        s.record_attempts_logged(
            &t,
            &[attempt(ub[0].id, lb, 2, Some(410))],
            &[
                entry(
                    ub[0].id,
                    lb,
                    "r0",
                    1,
                    t0,
                    (5, None, Some("connection_refused")),
                ),
                entry(
                    ub[0].id,
                    lb,
                    "r0",
                    2,
                    t0,
                    (7, Some(410), Some("status 410")),
                ),
            ],
        )
        .expect("record");

        let since = Timestamp::from_millis(t0.as_millis() - 3600 * 1000);
        let f = s.host_figures(since).expect("figures");
        assert_eq!(f.len(), 2, "{f:?}");
        // In origin order.
        let (fb, fa) = (&f[0], &f[1]);
        assert_eq!(fa.origin, "https://a.example:443");
        assert_eq!(fb.origin, "http://b.example:8080");
        assert_eq!(fa.since, since);
        assert_eq!(fa.attempts, 4);
        assert_eq!(fa.delivered, 3);
        assert_eq!(
            fa.outcomes
                .iter()
                .map(|(k, v)| (k.as_str(), *v))
                .collect::<Vec<_>>(),
            [("2xx", 3), ("timeout", 1)]
        );
        assert_eq!(fa.success_rate(), Some(0.75));
        let l = fa.latency_ms.expect("latency");
        assert_eq!((l.p50, l.p95, l.p99), (20, 30_000, 30_000));
        assert_eq!(fb.attempts, 2);
        assert_eq!(fb.delivered, 0);
        assert_eq!(fb.success_rate(), Some(0.0));
        assert_eq!(
            fb.outcomes
                .iter()
                .map(|(k, v)| (k.as_str(), *v))
                .collect::<Vec<_>>(),
            [("4xx", 1), ("connection_refused", 1)]
        );
        let l = fb.latency_ms.expect("latency");
        assert_eq!((l.p50, l.p95, l.p99), (5, 7, 7));

        // The old 503 counts once the window reaches it.
        let f = s.host_figures(old).expect("figures");
        assert_eq!(f[1].attempts, 5);
        assert_eq!(f[1].outcomes.get("5xx"), Some(&1));
        // Nothing since later.
        let later = Timestamp::from_millis(t0.as_millis() + 60_000);
        assert!(s.host_figures(later).expect("figures").is_empty());
        let _ = s.release_slot(&t).expect("release");
    });
}

fn host_figures_are_empty_with_the_log_off(b: Backend) {
    let common = CommonOptions {
        delivery_log_retention: Duration::ZERO,
        ..CommonOptions::default()
    };
    run(b, common, |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(&a, &[row("r0", &[A1])]).expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let la = lane_of(s, &a, A1);
        let u = claim_lane(s, &t, la, 0, 10).units;
        let t0 = now();
        s.ack_logged(
            &t,
            &[(u[0].id, la)],
            &[entry(u[0].id, la, "r0", 1, t0, (10, Some(200), None))],
        )
        .expect("ack");
        let since = Timestamp::from_millis(t0.as_millis() - 3600 * 1000);
        assert!(s.host_figures(since).expect("figures").is_empty());
        let _ = s.release_slot(&t).expect("release");
    });
}
