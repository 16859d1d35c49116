//! The operator's reads: a dead letter's payload by id, and the oldest pending unit per
//! actor, against a SQLite file, SQLite in memory and Postgres (when `OUTBOX_LANES_TEST_PG`
//! is set).
#![allow(missing_docs, clippy::std_instead_of_core)]

#[macro_use]
mod common;

use common::*;
use outbox_lanes_core::{DeadReason, Timestamp};
use outbox_lanes_store::*;

const A: &str = "https://a.example/inbox";
const B: &str = "https://b.example/inbox";

contract!(
    dead_letter_payload_by_id,
    oldest_pending_is_the_oldest_lane_head,
);

fn dead(s: &dyn Store, t: &SlotToken, unit: outbox_lanes_core::UnitId, lane: StoreLaneId) {
    s.dead_letter(
        t,
        &DeadLetterRequest {
            unit,
            lane,
            reason: DeadReason::Permanent,
            status: Some(422),
            error: None,
            at: now(),
        },
    )
    .expect("dead letter");
}

fn dead_letter_payload_by_id(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        // r0: one recipient (its payload inline until dead-lettered); r1: two recipients
        // sharing one payload row, the other recipient served afterwards.
        let mut r1 = row("r1", &[A, B]);
        r1.content_type = "application/activity+json".into();
        r1.body = b"{\"shared\":true}".to_vec();
        s.enqueue(&a, &[row("r0", &[A]), r1]).expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let (la, lb) = (lane_of(s, &a, A), lane_of(s, &a, B));
        let ca = claim_lane(s, &t, la, 0, 10);
        dead(s, &t, ca.units[0].id, la);
        dead(s, &t, ca.units[1].id, la);
        let cb = claim_lane(s, &t, lb, 0, 10);
        s.ack(&t, &[(cb.units[0].id, lb)]).expect("ack");
        let dl = s.dead_letters(Some(&a)).expect("list");
        assert_eq!(dl.len(), 2);

        let p0 = s.dead_letter_payload(dl[0].id).expect("payload 0");
        assert_eq!(p0.row_id, "r0");
        assert_eq!(p0.content_type, "application/json");
        assert_eq!(p0.body, b"{\"id\":\"r0\"}");
        let p1 = s.dead_letter_payload(dl[1].id).expect("payload 1");
        assert_eq!(p1.row_id, "r1");
        assert_eq!(p1.content_type, "application/activity+json");
        assert_eq!(p1.body, b"{\"shared\":true}");

        let unknown = DeadLetterId(dl.iter().map(|d| d.id.0).max().unwrap_or(0) + 1000);
        assert_eq!(
            s.dead_letter_payload(unknown),
            Err(StoreError::NotFound {
                what: "dead letter"
            })
        );
        assert_eq!(
            s.purge_dead_letters(&DeadLetterSelection::Ids(vec![dl[0].id])),
            Ok(1)
        );
        assert_eq!(
            s.dead_letter_payload(dl[0].id),
            Err(StoreError::NotFound {
                what: "dead letter"
            })
        );
        assert_eq!(s.dead_letter_payload(dl[1].id), Ok(p1));
    });
}

/// A timestamp strictly later than `t` (bounded wait on the system clock, in milliseconds).
fn after(t: Timestamp) -> Timestamp {
    for _ in 0..1000 {
        let n = now();
        if n > t {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    panic!("the clock did not move past {t:?}");
}

fn oldest_pending_is_the_oldest_lane_head(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let (a, bob) = (actor("alice"), actor("bob"));
        assert_eq!(s.oldest_pending(), Ok(vec![]));

        let before = now();
        s.enqueue(&a, &[row("r0", &[A])]).expect("enqueue r0");
        let t0 = now();
        after(t0);
        s.enqueue(&a, &[row("r1", &[B]), row("r2", &[A])])
            .expect("enqueue r1");
        s.enqueue(&bob, &[row("b0", &[B])]).expect("enqueue b0");
        let t1 = now();

        let o = s.oldest_pending().expect("oldest");
        assert_eq!(o.len(), 2, "{o:?}");
        assert_eq!(o[0].0, a);
        assert!(before <= o[0].1 && o[0].1 <= t0, "{o:?} {before:?} {t0:?}");
        assert_eq!(o[1].0, bob);
        assert!(t0 < o[1].1 && o[1].1 <= t1, "{o:?}");

        // r0 served: alice's oldest is now a later row's (lane A's r2 and lane B's r1 were
        // enqueued together, after r0).
        let t = acquire(s, &a, "h", LEASE);
        let la = lane_of(s, &a, A);
        let ca = claim_lane(s, &t, la, 0, 10);
        s.ack(&t, &[(ca.units[0].id, la)]).expect("ack r0");
        let o = s.oldest_pending().expect("oldest");
        assert_eq!(o[0].0, a);
        assert!(t0 < o[0].1 && o[0].1 <= t1, "{o:?}");

        // A dead letter is not pending: alice keeps only lane B's r1.
        dead(s, &t, ca.units[1].id, la);
        let lb = lane_of(s, &a, B);
        let cb = claim_lane(s, &t, lb, 0, 10);
        s.ack(&t, &[(cb.units[0].id, lb)]).expect("ack r1");
        let o = s.oldest_pending().expect("oldest");
        assert_eq!(o.len(), 1, "{o:?}");
        assert_eq!(o[0].0, bob);
    });
}
