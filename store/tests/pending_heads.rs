//! `ServiceStore::pending_heads` (issue 39): each actor's lanes with pending units counted
//! and their oldest head per hold (open, throttled, backoff, paused, host blocked, strict
//! blocked), against a SQLite file, SQLite in memory and Postgres (when
//! `OUTBOX_LANES_TEST_PG` is set).
#![allow(missing_docs, clippy::std_instead_of_core)]

#[macro_use]
mod common;

use std::time::Duration;

use common::*;
use outbox_lanes_core::ActorId;
use outbox_lanes_store::*;

const OPEN: &str = "https://open.example/inbox";
const BACKOFF: &str = "https://backoff.example/inbox";
const THROTTLED: &str = "https://throttled.example/inbox";
const PAUSED: &str = "https://paused.example/inbox";
const STRICT: &str = "https://strict.example/inbox";
const BLOCKED: &str = "https://blocked.example/inbox";

contract!(pending_heads_tell_held_lanes_apart);

fn pending_heads_tell_held_lanes_apart(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let (a, bob) = (actor("alice"), actor("bob"));
        assert_eq!(s.pending_heads(now()), Ok(vec![]));

        // The held lanes' rows first: they are older than the open lane's head.
        let first = now();
        s.enqueue(
            &a,
            &[
                row("r0", &[BACKOFF, THROTTLED, PAUSED, STRICT, BLOCKED]),
                row("r1", &[BACKOFF]),
            ],
        )
        .expect("enqueue held");
        std::thread::sleep(Duration::from_millis(5));
        let second = now();
        s.enqueue(&a, &[row("r2", &[OPEN])]).expect("enqueue open");
        s.enqueue(&bob, &[row("b0", &[OPEN])]).expect("enqueue bob");

        let later = now() + Duration::from_secs(600);
        let t = acquire(s, &a, "h", LEASE);
        s.set_lane_state(&t, lane_of(s, &a, BACKOFF), Some(later), 2)
            .expect("backoff");
        s.set_lane_state(&t, lane_of(s, &a, THROTTLED), Some(later), 0)
            .expect("throttle");
        s.block_lane(&t, lane_of(s, &a, STRICT), "status 422")
            .expect("strict block");
        let _ = s.release_slot(&t).expect("release");
        s.pause_lane(lane_of(s, &a, PAUSED), "maintenance")
            .expect("pause");
        s.block_host("https://blocked.example:443", HostBlock::Hold, now())
            .expect("block host");

        let got = s.pending_heads(now()).expect("pending heads");
        let find = |who: &ActorId, hold: LaneHold| {
            got.iter()
                .find(|p| &p.actor == who && p.hold == hold)
                .unwrap_or_else(|| panic!("{who:?} {hold:?} in {got:?}"))
        };
        assert_eq!(got.len(), 7, "{got:?}");
        for hold in LaneHold::HELD {
            let p = find(&a, hold);
            assert_eq!(p.lanes, 1, "{p:?}");
            assert!(first <= p.oldest && p.oldest < second, "{p:?}");
        }
        let open = find(&a, LaneHold::Open);
        assert_eq!(open.lanes, 1, "{open:?}");
        assert!(second <= open.oldest, "{open:?} {second:?}");
        assert_eq!(find(&bob, LaneHold::Open).lanes, 1);

        // A throttle whose time has passed holds nothing; a backoff holds until its probe
        // succeeds.
        let got = s
            .pending_heads(later + Duration::from_secs(1))
            .expect("later");
        let a_open: Vec<_> = got
            .iter()
            .filter(|p| p.actor == a && p.hold == LaneHold::Open)
            .collect();
        assert_eq!(a_open.len(), 1, "{got:?}");
        assert_eq!(a_open[0].lanes, 2, "{got:?}");
        assert!(a_open[0].oldest < second, "{got:?}");
        assert!(
            got.iter()
                .any(|p| p.actor == a && p.hold == LaneHold::Backoff),
            "{got:?}"
        );
        assert!(
            !got.iter().any(|p| p.hold == LaneHold::Throttled),
            "{got:?}"
        );

        // The oldest head over every hold is `oldest_pending`'s.
        let oldest = s.oldest_pending().expect("oldest");
        let min = got.iter().filter(|p| p.actor == a).map(|p| p.oldest).min();
        assert_eq!(oldest[0], (a.clone(), min.expect("alice")));
    });
}
