//! The store contract: the same test bodies against a SQLite file, SQLite in memory and
//! Postgres (when `OUTBOX_LANES_TEST_PG` is set), the latter on the blocking `postgres` client
//! and (feature `sqlx`) on a sqlx pool (`SqlxPgStore`).
#![allow(missing_docs, clippy::std_instead_of_core)]

#[macro_use]
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use outbox_lanes_core::{DeadReason, LaneKey, Seq, Timestamp, UnitId};
use outbox_lanes_store::*;

const A: &str = "https://a.example/inbox";
const B: &str = "https://b.example/inbox";
const C: &str = "https://c.example/inbox";

contract!(
    enqueue_order_and_claim_order,
    enqueue_refusals_name_the_row_and_write_nothing,
    canonical_spellings_are_one_lane,
    joined_unit_completes_per_recipient,
    lease_expiry_lets_another_holder_claim_again_in_order,
    ack_finishes_units,
    shared_payloads_go_with_their_last_ack,
    shared_payloads_stay_with_the_retention,
    attempts_persist_across_reopen,
    hand_back_keeps_positions,
    dead_letter_fields_and_replay_order,
    dedup_skips_pending_recipients,
    lane_backoff_persists,
    transactional_enqueue_rolled_back_leaves_nothing,
    drain_slot_exclusive_across_instances_with_look_again,
    free_slot_ignores_look_again,
    stale_token_is_refused_and_writes_nothing,
    deep_lane_does_not_slow_a_short_lane_claim,
    ids_unique_across_actors,
    dead_letter_durable_before_next_unit_is_claimable,
    dead_letter_returns_what_it_wrote_and_none_when_not_pending,
    dead_letters_of_one_call_are_one_transaction_in_request_order,
    retire_lane_dead_letters_only_that_recipient,
    a_lanes_run_of_failures_round_trips_and_operators_clear_it,
    a_clean_close_leaves_no_liveness_and_a_holder_cut_off_is_taken_over,
    retire_lane_with_lane_unavailable_dead_letters_every_pending_unit_in_order,
    operator_ops,
    operator_lane_purge_skip_and_retry,
    wake_ups_after_enqueue,
    watermark_finds_new_lanes,
    ack_retention_and_purge,
    row_ids_unique_across_payload_shapes,
    row_headers_round_trip_and_survive_dead_letters,
    bad_row_headers_are_refused_naming_the_row,
    one_lane_state_in_lanes_and_status,
    last_error_goes_stale_once_the_head_moves_on,
    one_lane_status_and_known_actors,
    lane_actions_move_the_control_generation_and_list_the_lanes_changed,
    purge_and_skip_head_dead_letters_keep_every_attempt_made,
    delivered_row_ids_stay_refused_for_the_window,
    the_outbox_id_is_made_once_per_database,
    hosts_share_health_and_schemes_and_operators_block_them,
    host_actions_move_a_generation_passes_read_and_pause_lanes_only_while_held,
    dead_letters_matching_a_time_range_recipient_and_reason,
    delivery_log_keeps_attempts_and_answers_rows,
    delivery_log_off_writes_nothing,
    delivery_log_batches_of_many_acks,
    delivery_log_counts_an_ack_sent_again_once,
);

/// `close_holder` after a clean stop (no slot held) leaves nothing of the holder's liveness
/// behind (Postgres: its row in `ol_live_holders`, which a relay's restarts used to leave one
/// each of); closed while it still holds a slot (a pass cut off at a shutdown grace), it is
/// found dead at once by another store, which takes the slot over without waiting for the
/// 10-minute lease, and is then forgotten; the same holder coming back registers again.
fn a_clean_close_leaves_no_liveness_and_a_holder_cut_off_is_taken_over(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        if !h.can_reopen() {
            return;
        }
        let s = &*h.store;
        let (alice, bob) = (actor("alice"), actor("bob"));
        let lease = Duration::from_secs(600);
        // Postgres: the holder's rows in `ol_live_holders` (None elsewhere).
        let listed = |holder: &str| -> Option<i64> {
            #[cfg(feature = "postgres")]
            if let Some((url, schema)) = h.pg() {
                let row = pg_client(&url, &schema)
                    .query_one(
                        "SELECT count(*) FROM ol_live_holders WHERE holder = $1",
                        &[&holder],
                    )
                    .expect("count");
                return Some(row.get(0));
            }
            let _ = holder;
            None
        };
        let t = acquire(s, &alice, "relay-1", lease);
        assert_eq!(listed("relay-1").unwrap_or(1), 1);
        let _ = s.release_slot(&t).expect("release");
        s.close_holder("relay-1");
        assert_eq!(
            listed("relay-1").unwrap_or(0),
            0,
            "a clean stop left its row"
        );

        let _cut = acquire(s, &bob, "relay-2", lease);
        s.close_holder("relay-2");
        assert_eq!(
            listed("relay-2").unwrap_or(1),
            1,
            "a holder with a slot stays listed"
        );
        let other = h.second();
        // Bounded (20 s), far below the lease: the session's lock is gone with its connection.
        let _taken = acquire_eventually(&*other, &bob, "relay-3", lease);
        assert_eq!(
            listed("relay-2").unwrap_or(0),
            0,
            "found dead, then forgotten"
        );

        let _back = acquire(s, &alice, "relay-1", lease);
        assert_eq!(listed("relay-1").unwrap_or(1), 1, "registered again");
    });
}

/// Issue 39: a batch of acks larger than SQLite's multi-row chunk keeps every entry, each
/// with its own fields.
fn delivery_log_batches_of_many_acks(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        let rows: Vec<NewRow> = (0..37).map(|i| row(&format!("m{i}"), &[C])).collect();
        s.enqueue(&a, &rows).expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let lc = lane_of(s, &a, C);
        let units = claim_lane(s, &t, lc, 0, 100).units;
        assert_eq!(units.len(), 37);
        let acks: Vec<_> = units.iter().map(|u| (u.id, lc)).collect();
        let log: Vec<_> = units
            .iter()
            .enumerate()
            .map(|(i, u)| DeliveryLogEntry {
                status: Some(200 + i as u16),
                delivered: true,
                duration_ms: i as u64,
                ..log_entry(u.id, lc, &u.row_id, 1)
            })
            .collect();
        s.ack_logged(&t, &acks, &log).expect("ack");
        // Sent again (a commit whose answer was lost): the units are gone, nothing more logged.
        s.ack_logged(&t, &acks, &log).expect("ack again");
        for (i, u) in units.iter().enumerate() {
            let got = s.delivery_log(&a, &u.row_id).expect("log");
            assert_eq!(got.len(), 1, "{}", u.row_id);
            assert_eq!(got[0].unit, u.id);
            assert_eq!(got[0].status, Some(200 + i as u16));
            assert_eq!(got[0].duration_ms, i as u64);
            assert!(got[0].delivered);
            assert_eq!(got[0].recipient, C);
        }
        let _ = s.release_slot(&t).expect("release");
    });
}

/// An ack sent again (a retried commit whose answer was lost, a pair handed over twice in one
/// batch) logs its deliveries once: one-lane units and a joined unit's lanes in one batch (the
/// joined path on Postgres), a unit set aside while its attempt was in flight.
fn delivery_log_counts_an_ack_sent_again_once(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        let joined = NewRow {
            joined: true,
            ..row("j", &[A, B])
        };
        s.enqueue(
            &a,
            &[row("m0", &[C]), row("m1", &[C]), joined, row("p", &[C])],
        )
        .expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let (la, lb, lc) = (lane_of(s, &a, A), lane_of(s, &a, B), lane_of(s, &a, C));
        let claimed = claim_lane(s, &t, lc, 0, 10);
        assert_eq!(row_ids(&claimed), ["m0", "m1", "p"]);
        let uc = claimed.units;
        let j = claim_lane(s, &t, la, 0, 10).units[0].id;
        let entry = |unit: UnitId, lane: StoreLaneId, row: &str| DeliveryLogEntry {
            status: Some(202),
            delivered: true,
            ..log_entry(unit, lane, row, 1)
        };
        let entries = |row: &str| s.delivery_log(&a, row).expect("log").len();

        let acks = [(uc[0].id, lc), (uc[1].id, lc), (j, la)];
        let log = [
            entry(uc[0].id, lc, "m0"),
            entry(uc[1].id, lc, "m1"),
            entry(j, la, "j"),
        ];
        for _ in 0..2 {
            s.ack_logged(&t, &acks, &log).expect("ack");
        }
        // Then m0 twice in one batch.
        s.ack_logged(&t, &[acks[0], acks[0]], &[log[0].clone(), log[0].clone()])
            .expect("ack");
        assert_eq!((entries("m0"), entries("m1"), entries("j")), (1, 1, 1));
        for _ in 0..2 {
            s.ack_logged(&t, &[(j, lb)], &[entry(j, lb, "j")])
                .expect("ack b");
        }
        let lanes: Vec<_> = s
            .delivery_log(&a, "j")
            .expect("log")
            .iter()
            .map(|e| e.lane)
            .collect();
        assert!(
            lanes.len() == 2 && lanes.contains(&la) && lanes.contains(&lb),
            "{lanes:?}"
        );

        // p set aside while in flight, then delivered (in a batch with a joined unit, k):
        // logged once, its dead letter says so.
        let joined = NewRow {
            joined: true,
            ..row("k", &[A, B])
        };
        s.enqueue(&a, &[joined]).expect("enqueue");
        let k = claim_lane(s, &t, la, 0, 10).units[0].id;
        assert_eq!(s.purge_lane(lc, now()).expect("purge"), 1);
        for _ in 0..2 {
            s.ack_logged(
                &t,
                &[(uc[2].id, lc), (k, la)],
                &[entry(uc[2].id, lc, "p"), entry(k, la, "k")],
            )
            .expect("ack p");
        }
        assert_eq!((entries("p"), entries("k")), (1, 1));
        s.ack_logged(&t, &[(k, lb)], &[entry(k, lb, "k")])
            .expect("ack k");
        let dead = s.dead_letters(Some(&a)).expect("dead letters");
        assert_eq!(
            (dead.len(), dead[0].attempts, dead[0].last_error.as_deref()),
            (1, 1, Some(DELIVERED_AFTER_SET_ASIDE))
        );

        // A new unit handed over twice in its first batch.
        s.enqueue(&a, &[row("q", &[C])]).expect("enqueue");
        let q = claim_lane(s, &t, lc, 0, 10).units[0].id;
        let e = entry(q, lc, "q");
        s.ack_logged(&t, &[(q, lc), (q, lc)], &[e.clone(), e])
            .expect("ack q");
        assert_eq!(entries("q"), 1);
        let _ = s.release_slot(&t).expect("release");
        let st = s.status().expect("status");
        assert!(st.iter().all(|a| a.pending == 0), "{st:?}");
    });
}

fn log_entry(unit: UnitId, lane: StoreLaneId, row: &str, attempt: u32) -> DeliveryLogEntry {
    DeliveryLogEntry {
        unit,
        lane,
        row_id: row.to_owned(),
        attempt,
        started_at: now(),
        duration_ms: 12,
        status: None,
        error_class: None,
        body: None,
        delivered: false,
    }
}

/// Issue 39: a failed attempt's entry goes with its record, a delivery's with its ack; a row
/// answers per recipient (delivered at T after N attempts, in flight since, dead letter) with
/// its history; the body excerpt is kept verbatim up to 1 KiB; the upkeep purges the log past
/// its window.
fn delivery_log_keeps_attempts_and_answers_rows(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        assert!(s.logs_deliveries());
        let a = actor("alice");
        s.enqueue(&a, &[row("r0", &[A, B]), row("r1", &[A])])
            .expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let (la, lb) = (lane_of(s, &a, A), lane_of(s, &a, B));
        let ua = claim_lane(s, &t, la, 0, 10).units;
        let ub = claim_lane(s, &t, lb, 0, 10).units;
        let (u0a, u1a, u0b) = (ua[0].id, ua[1].id, ub[0].id);
        let body = format!("<script>alert(1)</script>é{}", "x".repeat(2000));
        let failed = DeliveryLogEntry {
            status: Some(500),
            error_class: Some(error_class("status 500: <script>").to_owned()),
            body: Some(body.clone()),
            ..log_entry(u0a, la, "r0", 1)
        };
        s.record_attempts_logged(
            &t,
            &[AttemptRecord {
                unit: u0a,
                lane: la,
                attempts: 1,
                status: Some(500),
                error: Some("status 500: <script>".into()),
                at: now(),
            }],
            &[failed],
        )
        .expect("record");
        let ok = DeliveryLogEntry {
            status: Some(200),
            delivered: true,
            ..log_entry(u0a, la, "r0", 2)
        };
        let ok1 = DeliveryLogEntry {
            status: Some(204),
            delivered: true,
            ..log_entry(u1a, la, "r1", 1)
        };
        s.ack_logged(&t, &[(u0a, la), (u1a, la)], &[ok, ok1])
            .expect("ack");
        let since = now();
        s.mark_in_flight(&t, &[(lb, Some((u0b, since)))])
            .expect("mark");

        let rows = s.row_deliveries(&a, "r0").expect("row");
        assert_eq!(rows.len(), 2, "{rows:?}");
        let ra = rows.iter().find(|r| r.lane == la).expect("A");
        assert_eq!(ra.state, RowDeliveryState::Delivered);
        assert_eq!(ra.attempts, 2);
        assert!(ra.delivered_at.is_some());
        assert_eq!(ra.history.len(), 2);
        assert_eq!(ra.history[0].status, Some(500));
        assert_eq!(ra.history[0].error_class.as_deref(), Some("status 500"));
        let kept = ra.history[0].body.as_deref().expect("body");
        assert!(kept.starts_with("<script>alert(1)</script>é"), "{kept}");
        assert!(
            kept.len() <= LOG_BODY_EXCERPT && kept.len() > 1000,
            "{}",
            kept.len()
        );
        assert!(ra.history[1].delivered);
        let rb = rows.iter().find(|r| r.lane == lb).expect("B");
        assert_eq!(rb.state, RowDeliveryState::InFlight(since));
        assert_eq!(rb.recipient, B);
        let lanes = s.lanes(&a).expect("lanes");
        let l = lanes.iter().find(|l| l.lane == lb).expect("lane B");
        assert_eq!(
            (l.in_flight_since, l.in_flight_unit),
            (Some(since), Some(u0b))
        );
        let flying = s.lanes_in_flight().expect("in flight");
        assert_eq!(flying.len(), 1, "{flying:?}");
        assert_eq!(
            (flying[0].lane, flying[0].unit, flying[0].since),
            (lb, u0b, since)
        );
        assert_eq!(flying[0].key.recipient(), B);
        let hosts = s.host_list().expect("hosts");
        let count = |origin: &str| {
            hosts
                .iter()
                .find(|h| h.record.origin == origin)
                .map(|h| h.in_flight_long)
        };
        assert_eq!(count("https://b.example:443"), Some(1), "{hosts:?}");
        assert_eq!(count("https://a.example:443"), Some(0), "{hosts:?}");
        // Cleared: pending again.
        s.mark_in_flight(&t, &[(lb, None)]).expect("clear");
        let rows = s.row_deliveries(&a, "r0").expect("row");
        let rb = rows.iter().find(|r| r.lane == lb).expect("B");
        assert_eq!(rb.state, RowDeliveryState::Pending);
        let lanes = s.lanes(&a).expect("lanes");
        let l = lanes.iter().find(|l| l.lane == lb).expect("lane B");
        assert_eq!(l.in_flight_since, None);
        assert!(s.lanes_in_flight().expect("in flight").is_empty());
        // Dead-lettered: the dead letter's attempts, the log's history.
        s.record_attempts_logged(
            &t,
            &[AttemptRecord {
                unit: u0b,
                lane: lb,
                attempts: 1,
                status: Some(422),
                error: Some("status 422: no".into()),
                at: now(),
            }],
            &[DeliveryLogEntry {
                status: Some(422),
                error_class: Some("status 422".into()),
                body: Some("no".into()),
                ..log_entry(u0b, lb, "r0", 1)
            }],
        )
        .expect("record");
        s.write_dead_letters(
            &t,
            &[DeadLetterRequest {
                unit: u0b,
                lane: lb,
                reason: DeadReason::Permanent,
                status: Some(422),
                error: Some("status 422: no".into()),
                at: now(),
            }],
        )
        .expect("dead letter");
        let rows = s.row_deliveries(&a, "r0").expect("row");
        let rb = rows.iter().find(|r| r.lane == lb).expect("B");
        assert_eq!(rb.state, RowDeliveryState::DeadLetter);
        assert_eq!(rb.attempts, 1);
        assert_eq!(rb.history.len(), 1);
        assert_eq!(rb.history[0].body.as_deref(), Some("no"));
        assert_eq!(s.delivery_log(&a, "r1").expect("log").len(), 1);
        assert!(s.row_deliveries(&a, "nope").expect("none").is_empty());
        // A stale token writes no entry.
        let _ = s.release_slot(&t).expect("release");
        assert!(
            s.ack_logged(&t, &[(u0b, lb)], &[log_entry(u0b, lb, "r0", 9)])
                .is_err()
        );
        assert_eq!(s.delivery_log(&a, "r0").expect("log").len(), 3);
        // The upkeep purges entries past the window (7 days by default).
        s.upkeep(now().saturating_add(Duration::from_secs(8 * 86_400)))
            .expect("upkeep");
        assert!(s.delivery_log(&a, "r0").expect("log").is_empty());
        assert!(s.delivery_log(&a, "r1").expect("log").is_empty());
        // r0's dead letter remains; r1 is forgotten.
        let rows = s.row_deliveries(&a, "r0").expect("row");
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].state, RowDeliveryState::DeadLetter);
        assert!(s.row_deliveries(&a, "r1").expect("row").is_empty());
    });
}

/// Issue 39: `delivery_log_retention` zero turns the log off.
fn delivery_log_off_writes_nothing(b: Backend) {
    let common = CommonOptions {
        delivery_log_retention: Duration::ZERO,
        ..CommonOptions::default()
    };
    run(b, common, |h| {
        let s = &*h.store;
        assert!(!s.logs_deliveries());
        let a = actor("alice");
        s.enqueue(&a, &[row("r0", &[A])]).expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let la = lane_of(s, &a, A);
        let u = claim_lane(s, &t, la, 0, 10).units[0].id;
        let e = DeliveryLogEntry {
            delivered: true,
            ..log_entry(u, la, "r0", 1)
        };
        s.ack_logged(&t, &[(u, la)], &[e]).expect("ack");
        assert!(s.delivery_log(&a, "r0").expect("log").is_empty());
        assert!(s.row_deliveries(&a, "r0").expect("row").is_empty());
    });
}

/// OL-14 for hosts: every host action moves the operators' generation, which a pass's read of
/// its lane controls returns; a pass pauses a lane for a held host only while it is held (its
/// state after the write comes back either way); an attempt in flight when a block with dead
/// letters set its unit aside lands on the dead letter, as for `lanes purge`.
fn host_actions_move_a_generation_passes_read_and_pause_lanes_only_while_held(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(&a, &[row("r0", &[A]), row("r1", &[A]), row("r2", &[B])])
            .expect("enqueue");
        let origin = "https://a.example:443";
        let t = acquire(s, &a, "h", LEASE);
        assert_eq!(s.lane_controls(&t, 0).expect("controls").hosts, 0);
        let la = lane_of(s, &a, A);
        let u = unit_ids(&claim_lane(s, &t, la, 0, 10));

        // Block with dead letters while r0's attempt is in flight: both units set aside,
        // the generation moves, and the attempt's record and delivery land on r0's letter.
        assert_eq!(
            s.block_host(origin, HostBlock::DeadLetter, now())
                .expect("block"),
            2
        );
        let read = s.lane_controls(&t, 0).expect("controls");
        assert_eq!(read.hosts, 1);
        assert_eq!(DriverStore::hosts(s).expect("hosts").generation, 1);
        s.record_attempts(
            &t,
            &[AttemptRecord {
                unit: u[0],
                lane: la,
                attempts: 1,
                status: Some(503),
                error: Some("HTTP 503".into()),
                at: Timestamp::from_millis(1_000),
            }],
        )
        .expect("record");
        s.ack(&t, &[(u[0], la)]).expect("ack");
        let dead = s.dead_letters(Some(&a)).expect("dead letters");
        let r0 = dead.iter().find(|d| d.row_id == "r0").expect("r0");
        assert_eq!(r0.reason, DeadReason::Blocked);
        assert_eq!(
            (r0.attempts, r0.last_error.as_deref()),
            (2, Some(DELIVERED_AFTER_SET_ASIDE))
        );

        // A held host: a pass pauses a lane it meets for it; the state comes back.
        s.enqueue(&a, &[row("r3", &[C])]).expect("enqueue");
        let lc = lane_of(s, &a, C);
        let c = "https://c.example:443";
        s.block_host(c, HostBlock::Hold, now()).expect("hold");
        assert_eq!(s.lane_controls(&t, 0).expect("controls").hosts, 2);
        let lb = lane_of(s, &a, B);
        let states = s
            .pause_for_host(&t, &[(lb, "https://b.example:443".into()), (lc, c.into())])
            .expect("pause");
        let paused: Vec<(StoreLaneId, bool, bool)> = states
            .iter()
            .map(|cl| (cl.state.lane, cl.state.paused, cl.pending))
            .collect();
        assert_eq!(
            paused,
            [(lb, false, true), (lc, true, true)],
            "b.example is not held: its lane stays open"
        );
        let st = s.lane_status(lc).expect("status").expect("lane");
        assert_eq!(st.pause_reason.as_deref(), Some(hosts::HOST_BLOCKED_REASON));
        // Unblock resumes it with the lanes the block paused (none here).
        assert_eq!(s.block_host(c, HostBlock::Open, now()).expect("unblock"), 1);
        assert!(!s.lane_status(lc).expect("status").expect("lane").paused);
        // Once open, a pass's pause writes nothing.
        let states = s.pause_for_host(&t, &[(lc, c.into())]).expect("pause");
        assert!(!states[0].state.paused);
        assert_eq!(s.lane_controls(&t, 0).expect("controls").hosts, 3);
        // A stale token writes nothing.
        let _ = s.release_slot(&t).expect("release");
        assert!(matches!(
            s.pause_for_host(&t, &[(lc, c.into())]),
            Err(StoreError::StaleToken)
        ));
    });
}

/// `ol_hosts`: what relays write comes back; the operator's block pauses, dead-letters and
/// resumes the host's lanes (and a relay's write never clears it); retry forgets the health
/// and brings waiting lanes back; the list counts lanes and pending units per origin.
fn hosts_share_health_and_schemes_and_operators_block_them(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        const A2: &str = "https://a.example/users/bob/inbox";
        const A_OTHER_PORT: &str = "https://a.example:8443/inbox";
        s.enqueue(
            &a,
            &[
                row("r0", &[A]),
                row("r1", &[A2]),
                row("r2", &[B]),
                row("r3", &[A_OTHER_PORT]),
            ],
        )
        .expect("enqueue");
        let none = DriverStore::hosts(s).expect("hosts");
        assert!(none.hosts.is_empty());
        assert_eq!(none.generation, 0, "no operator acted on a host yet");
        let origin = "https://a.example:443";
        assert_eq!(origin_of(A).as_deref(), Some(origin));
        let t0 = now();
        let mut rec = HostRecord::new(origin, t0);
        rec.failures = 3;
        rec.level = 1;
        rec.not_before = Some(t0.saturating_add(Duration::from_secs(10)));
        rec.failing_since = Some(t0);
        rec.last_error = Some("connection_refused: refused".into());
        rec.spec = Some("cavage".into());
        rec.spec_at = Some(t0);
        s.write_hosts(std::slice::from_ref(&rec)).expect("write");
        assert_eq!(DriverStore::hosts(s).expect("hosts").hosts, [rec.clone()]);
        // A write older than the row (a relay's write on its way when another wrote) is lost.
        let mut older = rec.clone();
        older.failures = 1;
        older.updated_at = t0.saturating_sub(Duration::from_secs(1));
        s.write_hosts(std::slice::from_ref(&older)).expect("write");
        assert_eq!(DriverStore::hosts(s).expect("hosts").hosts, [rec.clone()]);

        let list = s.host_list().expect("list");
        let by = |o: &str| list.iter().find(|x| x.record.origin == o).cloned();
        let a_host = by(origin).expect("a");
        assert_eq!((a_host.lanes, a_host.pending), (2, 2));
        assert_eq!(a_host.record.failures, 3);
        let other = by("https://a.example:8443").expect("another port is another origin");
        assert_eq!((other.lanes, other.pending), (1, 1));
        assert_eq!(
            other.record.blocked,
            HostBlock::Open,
            "a host only lanes know is listed open"
        );
        assert_eq!(by("https://b.example:443").map(|x| x.lanes), Some(1));

        // Block (hold): both lanes of a.example:443 pause, nothing else does.
        assert_eq!(
            s.block_host(origin, HostBlock::Hold, now()).expect("block"),
            2
        );
        let lanes = s.lanes(&a).expect("lanes");
        let paused: Vec<&str> = lanes
            .iter()
            .filter(|l| l.paused)
            .map(|l| l.key.recipient())
            .collect();
        assert_eq!(paused, [A, A2]);
        assert!(
            lanes
                .iter()
                .filter(|l| l.paused)
                .all(|l| l.pause_reason.as_deref() == Some(hosts::HOST_BLOCKED_REASON))
        );
        // A relay's write keeps the operator's block.
        rec.failures = 0;
        rec.updated_at = now();
        s.write_hosts(std::slice::from_ref(&rec)).expect("write");
        let got = DriverStore::hosts(s).expect("hosts");
        assert_eq!(
            got.generation, 1,
            "the block moved the operators' generation"
        );
        assert_eq!(got.hosts[0].blocked, HostBlock::Hold);
        assert_eq!(got.hosts[0].failures, 0);
        // Unblock resumes what the block paused, not an operator's own pause.
        let l2 = lane_of(s, &a, A2);
        s.resume_lane(l2).expect("resume");
        s.pause_lane(l2, "maintenance").expect("pause");
        assert_eq!(
            s.block_host(origin, HostBlock::Open, now())
                .expect("unblock"),
            1
        );
        let lanes = s.lanes(&a).expect("lanes");
        let paused: Vec<(&str, Option<&str>)> = lanes
            .iter()
            .filter(|l| l.paused)
            .map(|l| (l.key.recipient(), l.pause_reason.as_deref()))
            .collect();
        assert_eq!(paused, [(A2, Some("maintenance"))]);
        s.resume_lane(l2).expect("resume");
        let got = DriverStore::hosts(s).expect("hosts");
        assert_eq!((got.generation, got.hosts[0].blocked), (2, HostBlock::Open));

        // Retry: the health and the scheme are forgotten, waiting lanes come back.
        let t = acquire(s, &a, "h", LEASE);
        let la = lane_of(s, &a, A);
        s.set_lane_state(
            &t,
            la,
            Some(now().saturating_add(Duration::from_secs(60))),
            0,
        )
        .expect("held for its host");
        let _ = s.release_slot(&t).expect("release");
        rec.failures = 4;
        rec.updated_at = now();
        s.write_hosts(std::slice::from_ref(&rec)).expect("write");
        assert_eq!(s.retry_host(origin, now()).expect("retry"), 1);
        let got = DriverStore::hosts(s).expect("hosts");
        assert_eq!(got.generation, 3);
        let got = &got.hosts[0];
        assert_eq!((got.failures, got.level, got.not_before), (0, 0, None));
        assert_eq!((got.spec.as_deref(), got.spec_at), (None, None));
        let st = s.lanes(&a).expect("lanes");
        let st = st.iter().find(|l| l.lane == la).expect("a");
        assert_eq!((st.not_before, st.backoff_level), (None, 0));

        // Block with dead letters: every pending unit of the host, reason `blocked`.
        assert_eq!(
            s.block_host(origin, HostBlock::DeadLetter, now())
                .expect("block"),
            2
        );
        let dl = s.dead_letters(Some(&a)).expect("dead");
        let mut blocked: Vec<&str> = dl
            .iter()
            .filter(|d| d.reason == DeadReason::Blocked)
            .map(|d| d.row_id.as_str())
            .collect();
        blocked.sort_unstable();
        assert_eq!(blocked, ["r0", "r1"]);
        assert_eq!(dl.len(), 2, "b.example and port 8443 keep theirs");
        let a_host = s
            .host_list()
            .expect("list")
            .into_iter()
            .find(|x| x.record.origin == origin)
            .expect("a");
        assert_eq!(a_host.record.blocked, HostBlock::DeadLetter);
        assert_eq!(a_host.pending, 0);
    });
}

/// The dedup window past delivery (`ol_row_ids`): a row id stays refused after its units
/// finished, until the window has passed; the purge forgets only what is past it.
fn delivered_row_ids_stay_refused_for_the_window(b: Backend) {
    let common = CommonOptions {
        row_id_retention: Duration::from_secs(3600),
        ..CommonOptions::default()
    };
    run(b, common, |h| {
        let s = &*h.store;
        let a = actor("alice");
        let joined = NewRow {
            joined: true,
            ..row("j", &[A, B])
        };
        s.enqueue(&a, &[row("m", &[A, B]), row("s", &[A]), joined])
            .expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let (la, lb) = (lane_of(s, &a, A), lane_of(s, &a, B));
        let on_a = claim_lane(s, &t, la, 0, 10).units;
        let on_b = claim_lane(s, &t, lb, 0, 10).units;
        let mut acks: Vec<(UnitId, StoreLaneId)> = on_a.iter().map(|u| (u.id, la)).collect();
        acks.extend(on_b.iter().map(|u| (u.id, lb)));
        s.ack(&t, &acks).expect("ack");
        assert!(claim_lane(s, &t, la, 0, 10).units.is_empty());
        assert_eq!(s.status().expect("status")[0].pending, 0);
        // Delivered, payloads gone: every shape of row keeps its id refused, alone or in a
        // batch (which is refused whole), for any recipient.
        for id in ["m", "s", "j"] {
            assert_eq!(
                s.enqueue(&a, &[row(id, &[C])]),
                Err(EnqueueError::DuplicateRowId { row: id.into() })
            );
            assert_eq!(
                s.enqueue(&a, &[row("fresh", &[C]), row(id, &[A, B])]),
                Err(EnqueueError::DuplicateRowId { row: id.into() })
            );
        }
        // Nothing was written by the refused batches.
        assert_eq!(s.status().expect("status")[0].pending, 0);
        // Another actor may use the same ids.
        s.enqueue(&actor("bob"), &[row("m", &[A])])
            .expect("bob's own id");
        // The purge keeps what is inside the window …
        assert_eq!(s.purge_row_ids(now()), Ok(0));
        assert!(s.enqueue(&a, &[row("s", &[A])]).is_err());
        // … and forgets what is past it: 3 of alice's ids and bob's one, an hour on.
        assert_eq!(
            s.purge_row_ids(now() + Duration::from_secs(3600 + 60)),
            Ok(4)
        );
        for id in ["m", "s", "j"] {
            s.enqueue(&a, &[row(id, &[C])])
                .expect("free after the window");
        }
        assert_eq!(
            row_ids(&claim_lane(s, &t, lane_of(s, &a, C), 0, 10)),
            ["m", "s", "j"]
        );
        // Those are in the window again, from their new enqueue.
        assert!(s.enqueue(&a, &[row("m", &[A])]).is_err());
    });
}

/// Every store opened on one database reports the same outbox id; another database another.
fn the_outbox_id_is_made_once_per_database(b: Backend) {
    let mut first = String::new();
    run(b, CommonOptions::default(), |h| {
        first = h.store.outbox_id().to_owned();
        assert_eq!(first.len(), 32, "{first}");
        assert!(
            first
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)),
            "{first}"
        );
        assert_eq!(h.second().outbox_id(), first);
    });
    run(b, CommonOptions::default(), |h| {
        if !first.is_empty() {
            assert_ne!(h.store.outbox_id(), first);
        }
    });
}

fn enqueue_order_and_claim_order(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        let rows: Vec<NewRow> = (0..5).map(|k| row(&format!("r{k}"), &[A, B])).collect();
        let out = s.enqueue(&a, &rows).expect("enqueue");
        assert_eq!(out.len(), 5);
        let seqs: Vec<Seq> = out.iter().map(|e| e.seq).collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "seq increases: {seqs:?}"
        );
        assert!(
            out.iter()
                .all(|e| e.units.len() == 2 && e.skipped.is_empty())
        );
        // A second call continues after the first.
        let more = s.enqueue(&a, &[row("r5", &[A])]).expect("enqueue");
        assert!(more[0].seq > seqs[4]);

        let t = acquire(s, &a, "h1", LEASE);
        let (lanes, mark) = s.lanes_with_work(&t, 0).expect("lanes");
        assert_eq!(lanes.len(), 2);
        assert_eq!(mark, more[0].seq.0);
        assert!(
            lanes
                .iter()
                .all(|l| !l.paused && !l.strict && l.not_before.is_none())
        );
        let la = lane_of(s, &a, A);
        // Each lane says how many units it holds (the scheduler's start order weighs them).
        let mut pending: Vec<(bool, u64)> =
            lanes.iter().map(|l| (l.lane == la, l.pending)).collect();
        pending.sort_unstable();
        assert_eq!(pending, [(false, 5), (true, 6)]);
        let all = claim_lane(s, &t, la, 0, 100);
        assert_eq!(row_ids(&all), ["r0", "r1", "r2", "r3", "r4", "r5"]);
        assert!(all.exhausted);
        let first2 = claim_lane(s, &t, la, 0, 2);
        assert_eq!(row_ids(&first2), ["r0", "r1"]);
        assert!(!first2.exhausted);
        // Streaming from the cursor: the next units after the last one seen.
        let next = claim_lane(s, &t, la, first2.units[1].seq.0 + 1, 2);
        assert_eq!(row_ids(&next), ["r2", "r3"]);
        let u0 = &all.units[0];
        assert_eq!(u0.seq, seqs[0]);
        assert_eq!(u0.slots.len(), 1);
        assert_eq!(u0.slots[0].key, key(A));
        assert_eq!(u0.slots[0].attempts, 0);
        assert!(u0.bytes > 0);
        let p = s.payload(u0.id).expect("payload");
        assert_eq!(p.row_id, "r0");
        assert_eq!(p.content_type, "application/json");
        assert_eq!(p.body, b"{\"id\":\"r0\"}");
        // SQLite reads a one-lane unit's payload with the claim, shared (r0 goes to two
        // recipients) or inline (r5 to one); a store that does not brings `None`.
        let r5 = all.units.last().expect("r5");
        if matches!(b, Backend::SqliteFile | Backend::SqliteMemory) {
            assert_eq!(u0.payload.as_ref(), Some(&p));
            assert_eq!(
                r5.payload.as_ref(),
                Some(&s.payload(r5.id).expect("payload"))
            );
        }
        for u in &all.units {
            if let Some(cp) = &u.payload {
                assert_eq!(cp, &s.payload(u.id).expect("payload"));
            }
        }
        // The two units of one row share the row's seq.
        let lb = lane_of(s, &a, B);
        let bl = claim_lane(s, &t, lb, 0, 100);
        assert_eq!(bl.units[0].seq, u0.seq);
        assert_ne!(bl.units[0].id, u0.id);
        // Both lanes in one claim: each unit of a fan-out row (its payload shared) says the
        // row's id, length and enqueue time, in seq order per lane, as the inline r5 does.
        let both = s
            .claim(
                &t,
                &[
                    ClaimRange {
                        lane: lb,
                        from: Seq(0),
                        limit: 100,
                    },
                    ClaimRange {
                        lane: la,
                        from: Seq(0),
                        limit: 100,
                    },
                ],
            )
            .expect("claim");
        assert_eq!(both.len(), 2);
        assert_eq!((both[0].lane, both[1].lane), (lb, la));
        assert_eq!(row_ids(&both[0]), ["r0", "r1", "r2", "r3", "r4"]);
        assert_eq!(row_ids(&both[1]), ["r0", "r1", "r2", "r3", "r4", "r5"]);
        for u in both.iter().flat_map(|l| &l.units) {
            let body = format!("{{\"id\":\"{}\"}}", u.row_id);
            assert_eq!(u.bytes as usize, body.len(), "{}", u.row_id);
            // Enqueued before r5 (or in its millisecond), and not left at zero.
            assert!(u.enqueued_at <= r5.enqueued_at, "{}", u.row_id);
            assert!(u.enqueued_at > Timestamp::from_millis(0), "{}", u.row_id);
        }
        let _ = s.release_slot(&t).expect("release");
    });
}

fn enqueue_refusals_name_the_row_and_write_nothing(b: Backend) {
    let common = CommonOptions {
        max_payload: 64,
        ..CommonOptions::default()
    };
    run(b, common, |h| {
        let s = &*h.store;
        let a = actor("alice");
        let good = row("ok", &[A]);
        let cases: Vec<(NewRow, &str)> = vec![
            (row("lonely", &[]), "lonely"),
            (row("badurl", &["ftp://x.example/inbox"]), "badurl"),
            (row("relative", &["/inbox"]), "relative"),
            (
                NewRow {
                    body: vec![b'x'; 65],
                    ..row("big", &[A])
                },
                "big",
            ),
        ];
        for (bad, name) in cases {
            let err = s.enqueue(&a, &[good.clone(), bad]).expect_err("refused");
            assert!(err.to_string().contains(name), "{err} names {name}");
            match (&err, name) {
                (EnqueueError::NoRecipients { row }, "lonely") => assert_eq!(row, "lonely"),
                (EnqueueError::BadRecipient { row, url, .. }, "badurl") => {
                    assert_eq!(row, "badurl");
                    assert_eq!(url, "ftp://x.example/inbox");
                }
                (EnqueueError::BadRecipient { row, .. }, "relative") => assert_eq!(row, "relative"),
                (
                    EnqueueError::PayloadTooLarge {
                        row,
                        size: 65,
                        max: 64,
                    },
                    "big",
                ) => assert_eq!(row, "big"),
                other => panic!("unexpected {other:?}"),
            }
        }
        let dup = s
            .enqueue(&a, &[row("d", &[A]), row("d", &[B])])
            .expect_err("dup in call");
        assert_eq!(dup, EnqueueError::DuplicateRowId { row: "d".into() });
        // Nothing was written by any refused batch.
        assert!(s.status().expect("status").is_empty());
        assert!(s.find_lane(&a, &key(A)).expect("find").is_none());
        // An id already stored is refused too, with the whole batch.
        s.enqueue(&a, &[row("x", &[A])]).expect("enqueue");
        let err = s
            .enqueue(&a, &[row("y", &[B]), row("x", &[A])])
            .expect_err("dup stored");
        assert_eq!(err, EnqueueError::DuplicateRowId { row: "x".into() });
        assert!(s.find_lane(&a, &key(B)).expect("find").is_none());
        let st = s.status().expect("status");
        assert_eq!(st.len(), 1);
        assert_eq!(st[0].pending, 1);
        // The same id under another actor is fine.
        s.enqueue(&actor("bob"), &[row("x", &[A])])
            .expect("other actor");
    });
}

fn canonical_spellings_are_one_lane(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        let out = s
            .enqueue(
                &a,
                &[row(
                    "r",
                    &["HTTP://Example.COM:80/inbox", "http://example.com/inbox"],
                )],
            )
            .expect("enqueue");
        assert_eq!(out[0].units.len(), 1);
        let lanes = s.lanes(&a).expect("lanes");
        assert_eq!(lanes.len(), 1);
        assert_eq!(lanes[0].key.recipient(), "http://example.com/inbox");
        assert_eq!(lanes[0].depth, 1);
        // An ordering key narrows the lane.
        let out = s
            .enqueue(
                &a,
                &[NewRow {
                    ordering_key: Some("conv-1".into()),
                    ..row("r2", &["http://example.com/inbox"])
                }],
            )
            .expect("enqueue");
        assert_eq!(out[0].units.len(), 1);
        assert_eq!(s.lanes(&a).expect("lanes").len(), 2);
        // Repeats collapse into the first spelling's lane, in first-seen order.
        let bob = actor("bob");
        let to = [
            B,
            "HTTPS://A.example:443/inbox",
            "https://B.EXAMPLE/inbox",
            A,
            C,
        ];
        let out = s.enqueue(&bob, &[row("r", &to)]).expect("enqueue");
        assert_eq!(out[0].units.len(), 3);
        let lanes = s.lanes(&bob).expect("lanes");
        let order: Vec<&str> = lanes.iter().map(|l| l.key.recipient()).collect();
        assert_eq!(order, [B, A, C]);
    });
}

fn joined_unit_completes_per_recipient(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        let out = s
            .enqueue(
                &a,
                &[
                    NewRow {
                        joined: true,
                        ..row("j", &[A, B])
                    },
                    row("after", &[A]),
                ],
            )
            .expect("enqueue");
        assert_eq!(out[0].units.len(), 1);
        let unit = out[0].units[0];
        let t = acquire(s, &a, "h", LEASE);
        let (la, lb) = (lane_of(s, &a, A), lane_of(s, &a, B));
        let ca = claim_lane(s, &t, la, 0, 10);
        assert_eq!(unit_ids(&ca)[0], unit);
        let slots = &ca.units[0].slots;
        assert_eq!(slots.len(), 2);
        assert!(slots.iter().all(|x| !x.served));
        s.ack(&t, &[(unit, la)]).expect("ack a");
        // Still pending for B: still heads lane A, with A reported served.
        let ca = claim_lane(s, &t, la, 0, 10);
        assert_eq!(unit_ids(&ca)[0], unit);
        let sa = ca.units[0]
            .slots
            .iter()
            .find(|x| x.lane == la)
            .expect("slot a");
        let sb = ca.units[0]
            .slots
            .iter()
            .find(|x| x.lane == lb)
            .expect("slot b");
        assert!(sa.served && !sb.served);
        let pending = |s: &dyn Store| s.status().expect("status")[0].pending;
        assert_eq!(
            pending(s),
            2,
            "the joined unit counts once, served or not, and 'after'"
        );
        let depth = |s: &dyn Store, lane: StoreLaneId| {
            s.lanes(&a)
                .expect("lanes")
                .into_iter()
                .find(|l| l.lane == lane)
                .expect("lane")
                .depth
        };
        assert_eq!(
            depth(s, la),
            1,
            "A: 'after' only, the joined unit is served there"
        );
        assert_eq!(depth(s, lb), 1, "B: the joined unit");
        s.payload(unit).expect("payload while pending");
        s.ack(&t, &[(unit, lb)]).expect("ack b");
        let ca = claim_lane(s, &t, la, 0, 10);
        assert_eq!(row_ids(&ca), ["after"]);
        assert!(claim_lane(s, &t, lb, 0, 10).units.is_empty());
        assert_eq!(s.payload(unit), Err(StoreError::NotFound { what: "unit" }));
        // A joined unit dead-lettered for one recipient names it.
        let out = s
            .enqueue(
                &a,
                &[NewRow {
                    joined: true,
                    ..row("j2", &[A, B])
                }],
            )
            .expect("enqueue");
        let j2 = out[0].units[0];
        s.dead_letter(
            &t,
            &DeadLetterRequest {
                unit: j2,
                lane: lb,
                reason: DeadReason::Permanent,
                status: Some(400),
                error: None,
                at: now(),
            },
        )
        .expect("dead letter b");
        let dl = s.dead_letters(Some(&a)).expect("dead letters");
        assert_eq!(dl.len(), 1);
        assert_eq!(dl[0].key, key(B));
        assert_eq!(dl[0].unit, j2);
        // Still pending for A.
        let ca = claim_lane(s, &t, la, 0, 10);
        assert_eq!(row_ids(&ca), ["after", "j2"]);
        assert_eq!(pending(s), 2, "'after' and j2 (dead for B, pending for A)");
        s.ack(&t, &[(j2, la)]).expect("ack");
        assert_eq!(pending(s), 1);
        assert_eq!(s.payload(j2), Err(StoreError::NotFound { what: "unit" }));
    });
}

fn lease_expiry_lets_another_holder_claim_again_in_order(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let a = actor("alice");
        h.store
            .enqueue(
                &a,
                &(0..4)
                    .map(|k| row(&format!("r{k}"), &[A]))
                    .collect::<Vec<_>>(),
            )
            .expect("enqueue");
        let other = h.second();
        let s = &*h.store;
        let t1 = acquire(s, &a, "crashing", Duration::from_millis(300));
        let la = lane_of(s, &a, A);
        let c1 = claim_lane(s, &t1, la, 0, 10);
        s.ack(&t1, &[(c1.units[0].id, la)]).expect("ack first");
        // The holder "crashes": no release. The other holder gets the slot once it expires.
        let t2 = acquire_eventually(&*other, &a, "successor", LEASE);
        assert!(t2.fencing() > t1.fencing());
        let c2 = claim_lane(&*other, &t2, la, 0, 10);
        assert_eq!(row_ids(&c2), ["r1", "r2", "r3"]);
        assert_eq!(unit_ids(&c2), unit_ids(&c1)[1..]);
        assert_eq!(s.claim(&t1, &[]), Err(StoreError::StaleToken));
        assert_eq!(other.release_slot(&t2), Ok(SlotRelease::Released));
    });
}

fn ack_finishes_units(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        let out = s
            .enqueue(&a, &[row("r0", &[A, B]), row("r1", &[A])])
            .expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let (la, lb) = (lane_of(s, &a, A), lane_of(s, &a, B));
        let ua = claim_lane(s, &t, la, 0, 10);
        s.ack(&t, &[(ua.units[0].id, la), (ua.units[1].id, la)])
            .expect("ack");
        assert!(claim_lane(s, &t, la, 0, 10).units.is_empty());
        // Acking again, or acking an unknown unit, is harmless.
        s.ack(&t, &[(ua.units[0].id, la), (UnitId(999_999), la)])
            .expect("re-ack");
        let st = s.status().expect("status");
        assert_eq!(st[0].pending, 1);
        assert!(st[0].in_flight);
        // B's unit of r0 is untouched, and r0's payload is still there for it.
        let ub = claim_lane(s, &t, lb, 0, 10);
        assert_eq!(ub.units[0].id, out[0].units[1]);
        assert_eq!(s.payload(ub.units[0].id).expect("payload").row_id, "r0");
        assert_eq!(payload_rows(h), Some(1).filter(|_| h.can_reopen()));
        s.ack(&t, &[(ub.units[0].id, lb)]).expect("ack");
        let _ = s.release_slot(&t).expect("release");
        let st = s.status().expect("status");
        assert!(st.is_empty(), "{st:?}");
        // r0's shared payload went with its last unit.
        assert_eq!(payload_rows(h), Some(0).filter(|_| h.can_reopen()));
    });
}

/// Shared payloads (rows to several recipients) go with their last unit's ack, whichever
/// batch it is in, and not before.
fn shared_payloads_go_with_their_last_ack(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(
            &a,
            &[row("r0", &[A, B]), row("r1", &[A, B, C]), row("r2", &[B])],
        )
        .expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let lanes = [lane_of(s, &a, A), lane_of(s, &a, B), lane_of(s, &a, C)];
        let [ua, ub, uc] = lanes.map(|l| claim_lane(s, &t, l, 0, 10).units);
        // A's units (r0, r1) and C's (r1) in one batch: both payloads still have B's units.
        let mut batch: Vec<_> = ua.iter().map(|u| (u.id, lanes[0])).collect();
        batch.push((uc[0].id, lanes[2]));
        s.ack(&t, &batch).expect("ack");
        let expect = |n| Some(n).filter(|_| h.can_reopen());
        assert_eq!(payload_rows(h), expect(2));
        // B's r0 and r2 (inline): r0's payload goes, r1's stays for B's r1.
        s.ack(&t, &[(ub[0].id, lanes[1]), (ub[2].id, lanes[1])])
            .expect("ack");
        assert_eq!(payload_rows(h), expect(1));
        s.ack(&t, &[(ub[1].id, lanes[1])]).expect("ack");
        assert_eq!(payload_rows(h), expect(0));
        let _ = s.release_slot(&t).expect("release");
        assert!(s.status().expect("status").is_empty());
    });
}

/// With the retention every acked head stays, and with it its shared payload, until the purge
/// takes the heads: the payload goes with the last of them.
fn shared_payloads_stay_with_the_retention(b: Backend) {
    let common = CommonOptions {
        ack_retention: Some(Duration::from_secs(3600)),
        ..CommonOptions::default()
    };
    run(b, common, |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(&a, &[row("r0", &[A, B])]).expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let (la, lb) = (lane_of(s, &a, A), lane_of(s, &a, B));
        let (ua, ub) = (claim_lane(s, &t, la, 0, 10), claim_lane(s, &t, lb, 0, 10));
        s.ack(&t, &[(ua.units[0].id, la), (ub.units[0].id, lb)])
            .expect("ack");
        let expect = |n| Some(n).filter(|_| h.can_reopen());
        assert_eq!(payload_rows(h), expect(1));
        let _ = s.release_slot(&t).expect("release");
        assert_eq!(s.purge_acked(now() + Duration::from_secs(60)), Ok(2));
        assert_eq!(payload_rows(h), expect(0));
    });
}

/// How many shared payloads `ol_rows` holds, on the backends a test can read with plain SQL
/// (those that can reopen: SQLite in memory cannot be reached from another connection).
fn payload_rows(h: &H) -> Option<i64> {
    if let Some(path) = h.sqlite_path() {
        let c = outbox_lanes_store::sqlite::rusqlite::Connection::open(path).expect("open");
        return Some(
            c.query_row("SELECT count(*) FROM ol_rows", [], |r| r.get(0))
                .expect("count"),
        );
    }
    #[cfg(feature = "postgres")]
    if let Some((url, schema)) = h.pg() {
        let row = pg_client(&url, &schema)
            .query_one(&format!("SELECT count(*) FROM {schema}.ol_rows"), &[])
            .expect("count");
        return Some(row.get(0));
    }
    None
}

fn attempts_persist_across_reopen(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let a = actor("alice");
        h.store.enqueue(&a, &[row("r0", &[A])]).expect("enqueue");
        let la = lane_of(&*h.store, &a, A);
        let t = acquire(&*h.store, &a, "h", LEASE);
        let unit = claim_lane(&*h.store, &t, la, 0, 1).units[0].id;
        let t0 = Timestamp::from_millis(1_700_000_000_000);
        h.store
            .record_attempts(
                &t,
                &[AttemptRecord {
                    unit,
                    lane: la,
                    attempts: 1,
                    status: Some(503),
                    error: Some("unavailable".into()),
                    at: t0,
                }],
            )
            .expect("record");
        h.store
            .record_attempts(
                &t,
                &[AttemptRecord {
                    unit,
                    lane: la,
                    attempts: 2,
                    status: None,
                    error: Some("connection refused".into()),
                    at: Timestamp::from_millis(1_700_000_001_000),
                }],
            )
            .expect("record");
        h.reopen();
        let s = &*h.store;
        let c = claim_lane(s, &t, la, 0, 1);
        assert_eq!(c.units[0].slots[0].attempts, 2);
        let lanes = s.lanes(&a).expect("lanes");
        assert_eq!(lanes[0].last_status, None);
        assert_eq!(lanes[0].last_error.as_deref(), Some("connection refused"));
        // The dead letter keeps the first and last attempt times.
        s.dead_letter(
            &t,
            &DeadLetterRequest {
                unit,
                lane: la,
                reason: DeadReason::Exhausted,
                status: None,
                error: None,
                at: Timestamp::from_millis(1_700_000_002_000),
            },
        )
        .expect("dead");
        let dl = &s.dead_letters(None).expect("dl")[0];
        assert_eq!(dl.attempts, 2);
        assert_eq!(dl.first_attempt_at, Some(t0));
        assert_eq!(
            dl.last_attempt_at,
            Some(Timestamp::from_millis(1_700_000_001_000))
        );
        assert_eq!(dl.last_error.as_deref(), Some("connection refused"));
    });
}

fn hand_back_keeps_positions(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(
            &a,
            &(0..4)
                .map(|k| row(&format!("r{k}"), &[A]))
                .collect::<Vec<_>>(),
        )
        .expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let la = lane_of(s, &a, A);
        let c = claim_lane(s, &t, la, 0, 10);
        s.ack(&t, &[(c.units[0].id, la)]).expect("ack");
        // r1..r3 are "handed back": no write; a unit enqueued meanwhile goes behind them.
        s.enqueue(&a, &[row("r4", &[A])]).expect("enqueue");
        let again = claim_lane(s, &t, la, 0, 10);
        assert_eq!(row_ids(&again), ["r1", "r2", "r3", "r4"]);
        let seqs: Vec<Seq> = again.units.iter().map(|u| u.seq).collect();
        assert_eq!(
            seqs[..3],
            c.units[1..].iter().map(|u| u.seq).collect::<Vec<_>>()[..]
        );
        // And after the slot is released and taken again.
        assert_eq!(s.release_slot(&t), Ok(SlotRelease::Released));
        let t2 = acquire(s, &a, "h2", LEASE);
        assert_eq!(
            row_ids(&claim_lane(s, &t2, la, 0, 10)),
            ["r1", "r2", "r3", "r4"]
        );
    });
}

fn dead_letter_fields_and_replay_order(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(
            &a,
            &(0..4)
                .map(|k| row(&format!("r{k}"), &[A]))
                .collect::<Vec<_>>(),
        )
        .expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let la = lane_of(s, &a, A);
        let c = claim_lane(s, &t, la, 0, 10);
        let (u0, u1) = (c.units[0].id, c.units[1].id);
        s.record_attempts(
            &t,
            &[AttemptRecord {
                unit: u0,
                lane: la,
                attempts: 12,
                status: Some(500),
                error: Some("boom".into()),
                at: Timestamp::from_millis(5_000),
            }],
        )
        .expect("attempts");
        let mut written = Vec::new();
        for (u, reason, status) in [
            (u0, DeadReason::Exhausted, Some(500)),
            (u1, DeadReason::Permanent, Some(404)),
        ] {
            let id = s
                .dead_letter(
                    &t,
                    &DeadLetterRequest {
                        unit: u,
                        lane: la,
                        reason,
                        status,
                        error: None,
                        at: Timestamp::from_millis(9_000),
                    },
                )
                .expect("dead");
            written.push(id.expect("a pending delivery is dead-lettered"));
        }
        let dl = s.dead_letters(Some(&a)).expect("dl");
        assert_eq!(dl.len(), 2);
        // The ids returned are the ones listed.
        assert_eq!(
            dl.iter().map(|d| d.id).collect::<Vec<_>>(),
            written.iter().map(|w| w.id).collect::<Vec<_>>()
        );
        assert_eq!(dl[0].unit, u0);
        assert_eq!(dl[0].row_id, "r0");
        assert_eq!(dl[0].actor, a);
        assert_eq!(dl[0].key, key(A));
        assert_eq!(dl[0].reason, DeadReason::Exhausted);
        assert_eq!(dl[0].last_status, Some(500));
        assert_eq!(dl[0].last_error.as_deref(), Some("boom"));
        assert_eq!(dl[0].attempts, 12);
        assert_eq!(dl[0].first_attempt_at, Some(Timestamp::from_millis(5_000)));
        assert_eq!(dl[0].seq, c.units[0].seq);
        assert_eq!(dl[0].dead_at, Timestamp::from_millis(9_000));
        assert_eq!(dl[1].unit, u1);
        assert_eq!(dl[1].reason, DeadReason::Permanent);
        assert_eq!(dl[1].last_status, Some(404));
        assert_eq!(dl[1].attempts, 0);
        assert_eq!(row_ids(&claim_lane(s, &t, la, 0, 10)), ["r2", "r3"]);
        let st = s.status().expect("status");
        assert_eq!(st[0].dead_letters, 2);
        assert_eq!(st[0].pending, 2);

        let replayed = s
            .replay_dead_letters(&DeadLetterSelection::Actor(a.clone()))
            .expect("replay");
        assert_eq!(replayed, [u0, u1]);
        assert!(s.dead_letters(None).expect("dl").is_empty());
        let c2 = claim_lane(s, &t, la, 0, 10);
        assert_eq!(row_ids(&c2), ["r2", "r3", "r0", "r1"]);
        assert_eq!(unit_ids(&c2)[2..], [u0, u1]);
        assert!(c2.units[2].seq > c2.units[1].seq);
        assert_eq!(c2.units[2].slots[0].attempts, 0);
        assert_eq!(s.payload(u0).expect("payload").row_id, "r0");
        // Replay by id, and purge: a replayed unit's new dead letter has a new id.
        let again = s
            .dead_letter(
                &t,
                &DeadLetterRequest {
                    unit: u0,
                    lane: la,
                    reason: DeadReason::Gone,
                    status: Some(410),
                    error: None,
                    at: now(),
                },
            )
            .expect("dead")
            .expect("pending again after the replay");
        let id = s.dead_letters(None).expect("dl")[0].id;
        assert_eq!(again.id, id);
        assert!(!written.iter().any(|w| w.id == id));
        assert_eq!(
            s.purge_dead_letters(&DeadLetterSelection::Ids(vec![id])),
            Ok(1)
        );
        assert!(s.dead_letters(None).expect("dl").is_empty());
        assert_eq!(row_ids(&claim_lane(s, &t, la, 0, 10)), ["r2", "r3", "r1"]);
        assert_eq!(s.payload(u0), Err(StoreError::NotFound { what: "unit" }));
    });
}

fn dedup_skips_pending_recipients(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        let with_key = |id: &str, to: &[&str]| NewRow {
            dedup_key: Some("entry-7".into()),
            ..row(id, to)
        };
        let first = s.enqueue(&a, &[with_key("r0", &[A, B])]).expect("enqueue");
        assert!(first[0].skipped.is_empty());
        let second = s.enqueue(&a, &[with_key("r1", &[A, C])]).expect("enqueue");
        assert_eq!(second[0].skipped, [key(A).recipient().to_string()]);
        assert_eq!(second[0].units.len(), 1);
        // Within one call, the second row sees the first.
        let third = s
            .enqueue(
                &a,
                &[
                    with_key("r2", &[C]),
                    with_key("r3", &["https://d.example/inbox"]),
                ],
            )
            .expect("e");
        assert_eq!(third[0].skipped.len(), 1);
        assert!(third[1].skipped.is_empty());
        // Another actor's pending unit does not count.
        let other = s
            .enqueue(&actor("bob"), &[with_key("r0", &[A])])
            .expect("e");
        assert!(other[0].skipped.is_empty());
        // Once A's unit is finished, A is no longer skipped.
        let t = acquire(s, &a, "h", LEASE);
        let la = lane_of(s, &a, A);
        s.ack(&t, &[(first[0].units[0], la)]).expect("ack");
        let fourth = s.enqueue(&a, &[with_key("r4", &[A, B])]).expect("enqueue");
        assert_eq!(fourth[0].skipped, [key(B).recipient().to_string()]);
        // A dead-lettered unit does not revive what it made skip, and no longer blocks.
        let lb = lane_of(s, &a, B);
        s.dead_letter(
            &t,
            &DeadLetterRequest {
                unit: first[0].units[1],
                lane: lb,
                reason: DeadReason::Permanent,
                status: Some(400),
                error: None,
                at: now(),
            },
        )
        .expect("dead");
        assert!(claim_lane(s, &t, lb, 0, 10).units.is_empty());
        let fifth = s.enqueue(&a, &[with_key("r5", &[B])]).expect("enqueue");
        assert!(fifth[0].skipped.is_empty());
        // Every recipient skipped: no unit, and the row id is not kept.
        let all_skipped = s.enqueue(&a, &[with_key("r6", &[B])]).expect("enqueue");
        assert!(all_skipped[0].units.is_empty());
    });
}

fn lane_backoff_persists(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let a = actor("alice");
        h.store
            .enqueue(&a, &[row("r0", &[A]), row("r1", &[B])])
            .expect("enqueue");
        let la = lane_of(&*h.store, &a, A);
        let t = acquire(&*h.store, &a, "h", LEASE);
        let later = now() + Duration::from_secs(3600);
        h.store
            .set_lane_state(&t, la, Some(later), 3)
            .expect("backoff");
        h.reopen();
        let s = &*h.store;
        let (lanes, _) = s.lanes_with_work(&t, 0).expect("lanes");
        let info = lanes.iter().find(|l| l.lane == la).expect("lane a");
        assert_eq!(info.not_before, Some(later));
        assert_eq!(info.backoff_level, 3);
        let due = s.actors_with_work(now()).expect("due");
        assert_eq!(due.ready, std::slice::from_ref(&a), "lane B is still open");
        assert_eq!(due.next_not_before, Some(later));
        let st = s.status().expect("status");
        assert_eq!(
            st[0].lanes_in_backoff,
            [LaneSummary {
                key: key(A),
                state: LaneState::Backoff(3),
                next_attempt: Some(later),
            }]
        );
        // Only lane A left: the actor is not ready until `later`.
        let lb = lane_of(s, &a, B);
        let u = claim_lane(s, &t, lb, 0, 1).units[0].id;
        s.ack(&t, &[(u, lb)]).expect("ack");
        let due = s.actors_with_work(now()).expect("due");
        assert!(due.ready.is_empty());
        assert_eq!(due.next_not_before, Some(later));
        assert_eq!(
            s.actors_with_work(later).expect("due").ready,
            std::slice::from_ref(&a)
        );
        // Operator retry-now clears the backoff.
        s.retry_lane_now(la).expect("retry now");
        let l = &s.lanes(&a).expect("lanes")[0];
        assert_eq!((l.not_before, l.backoff_level), (None, 0));
        assert_eq!(s.actors_with_work(now()).expect("due").ready, [a]);
    });
}

fn transactional_enqueue_rolled_back_leaves_nothing(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let a = actor("alice");
        h.enqueue_rolled_back(&a, &[row("r0", &[A]), row("r1", &[B])]);
        let s = &*h.store;
        assert!(s.status().expect("status").is_empty());
        assert!(s.lanes(&a).expect("lanes").is_empty());
        let seen = s.notifier().generation();
        let out = h.enqueue_committed_in_tx(&a, &[row("r0", &[A])]);
        assert_eq!(out[0].units.len(), 1);
        assert!(h.store.notifier().generation() != seen || h.backend != Backend::SqliteMemory);
        assert_eq!(h.store.status().expect("status")[0].pending, 1);
        // The id was free: the rolled-back rows left nothing behind.
        let t = acquire(&*h.store, &a, "h", LEASE);
        let la = lane_of(&*h.store, &a, A);
        assert_eq!(row_ids(&claim_lane(&*h.store, &t, la, 0, 10)), ["r0"]);
    });
}

/// A holder that will not look again (its drain stops or yields) frees its slot even when
/// someone asked for a look again: the slot is free at once, not held until the lease ends.
fn free_slot_ignores_look_again(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let a = actor("alice");
        let one = h.store.clone();
        let two = h.second();
        let t1 = acquire(&*one, &a, "relay-1", LEASE);
        assert_eq!(
            two.acquire_slot(&a, "relay-2", LEASE),
            Ok(SlotAcquisition::Held),
            "asks for a look again"
        );
        assert_eq!(one.free_slot(&t1), Ok(()));
        let t2 = acquire(&*two, &a, "relay-2", LEASE);
        assert!(t2.fencing() > t1.fencing());
        assert_eq!(one.free_slot(&t1), Err(StoreError::StaleToken));
        assert_eq!(two.free_slot(&t2), Ok(()));
        assert_eq!(
            two.free_slot(&t2),
            Err(StoreError::StaleToken),
            "freed already"
        );
    });
}

fn drain_slot_exclusive_across_instances_with_look_again(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let a = actor("alice");
        let one = h.store.clone();
        let two = h.second();
        let t1 = acquire(&*one, &a, "relay-1", LEASE);
        assert_eq!(
            two.acquire_slot(&a, "relay-2", LEASE),
            Ok(SlotAcquisition::Held)
        );
        assert_eq!(
            one.acquire_slot(&a, "relay-1-again", LEASE),
            Ok(SlotAcquisition::Held)
        );
        // Another actor's slot is independent.
        let tb = acquire(&*two, &actor("bob"), "relay-2", LEASE);
        // The running pass must look again before it lets go.
        assert_eq!(one.release_slot(&t1), Ok(SlotRelease::LookAgain));
        assert_eq!(
            two.acquire_slot(&a, "relay-2", LEASE),
            Ok(SlotAcquisition::Held),
            "kept after look-again"
        );
        assert_eq!(one.release_slot(&t1), Ok(SlotRelease::LookAgain));
        assert_eq!(one.release_slot(&t1), Ok(SlotRelease::Released));
        let t2 = acquire(&*two, &a, "relay-2", LEASE);
        assert!(t2.fencing() > t1.fencing());
        assert_eq!(t2.holder(), "relay-2");
        assert_eq!(one.release_slot(&t1), Err(StoreError::StaleToken));
        two.renew_slot(&t2, LEASE).expect("renew");
        assert_eq!(two.release_slot(&t2), Ok(SlotRelease::Released));
        assert_eq!(two.release_slot(&tb), Ok(SlotRelease::Released));
        // Concurrent acquirers on two instances: exactly one wins.
        let winners: Vec<bool> = std::thread::scope(|sc| {
            let hs: Vec<_> = [one.clone(), two.clone()]
                .into_iter()
                .enumerate()
                .map(|(k, st)| {
                    let a = a.clone();
                    sc.spawn(move || {
                        matches!(
                            st.acquire_slot(&a, &format!("r{k}"), LEASE),
                            Ok(SlotAcquisition::Acquired(_))
                        )
                    })
                })
                .collect();
            hs.into_iter().map(|j| j.join().expect("join")).collect()
        });
        assert_eq!(winners.iter().filter(|w| **w).count(), 1);
    });
}

fn stale_token_is_refused_and_writes_nothing(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(&a, &[row("r0", &[A]), row("r1", &[A])])
            .expect("enqueue");
        let la = lane_of(s, &a, A);
        let t1 = acquire(s, &a, "paused-relay", Duration::from_millis(200));
        let c = claim_lane(s, &t1, la, 0, 10);
        let u0 = c.units[0].id;
        let t2 = acquire_eventually(s, &a, "successor", LEASE);
        let stale = |r: Result<(), StoreError>| assert_eq!(r, Err(StoreError::StaleToken));
        stale(s.ack(&t1, &[(u0, la)]));
        stale(s.record_attempts(
            &t1,
            &[AttemptRecord {
                unit: u0,
                lane: la,
                attempts: 5,
                status: Some(500),
                error: Some("x".into()),
                at: now(),
            }],
        ));
        assert_eq!(
            s.dead_letter(
                &t1,
                &DeadLetterRequest {
                    unit: u0,
                    lane: la,
                    reason: DeadReason::Exhausted,
                    status: None,
                    error: None,
                    at: now(),
                },
            ),
            Err(StoreError::StaleToken)
        );
        stale(s.set_lane_state(&t1, la, Some(now() + Duration::from_secs(60)), 1));
        stale(s.block_lane(&t1, la, "strict"));
        assert_eq!(
            s.retire_lane(&t1, la, now(), DeadReason::LaneRetired),
            Err(StoreError::StaleToken)
        );
        assert_eq!(s.claim(&t1, &[]), Err(StoreError::StaleToken));
        assert_eq!(s.lanes_with_work(&t1, 0), Err(StoreError::StaleToken));
        stale(s.renew_slot(&t1, LEASE));
        assert_eq!(s.release_slot(&t1), Err(StoreError::StaleToken));
        // Nothing was written.
        let c2 = claim_lane(s, &t2, la, 0, 10);
        assert_eq!(unit_ids(&c2), unit_ids(&c));
        assert_eq!(c2.units[0].slots[0].attempts, 0);
        assert!(s.dead_letters(None).expect("dl").is_empty());
        let l = &s.lanes(&a).expect("lanes")[0];
        assert_eq!((l.not_before, l.paused, l.last_status), (None, false, None));
        // The live token works.
        s.ack(&t2, &[(u0, la)]).expect("ack");
    });
}

fn deep_lane_does_not_slow_a_short_lane_claim(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        const DEEP: usize = 100_000;
        for chunk in 0..(DEEP / 5_000) {
            let rows: Vec<NewRow> = (0..5_000)
                .map(|k| NewRow {
                    body: vec![b'x'; 8],
                    ..row(&format!("deep-{}", chunk * 5_000 + k), &[A])
                })
                .collect();
            s.enqueue(&a, &rows).expect("enqueue deep");
        }
        s.enqueue(
            &a,
            &[
                row("short-0", &[B]),
                row("short-1", &[B]),
                row("short-2", &[B]),
            ],
        )
        .expect("enqueue short");
        let t = acquire(s, &a, "h", LEASE);
        let (la, lb) = (lane_of(s, &a, A), lane_of(s, &a, B));
        let got = s
            .claim(
                &t,
                &[
                    ClaimRange {
                        lane: la,
                        from: Seq(0),
                        limit: 4,
                    },
                    ClaimRange {
                        lane: lb,
                        from: Seq(0),
                        limit: 4,
                    },
                ],
            )
            .expect("claim");
        assert_eq!(row_ids(&got[0]), ["deep-0", "deep-1", "deep-2", "deep-3"]);
        assert!(!got[0].exhausted);
        assert_eq!(row_ids(&got[1]), ["short-0", "short-1", "short-2"]);
        assert!(got[1].exhausted);
        let lanes = s.lanes(&a).expect("lanes");
        assert_eq!(
            lanes.iter().find(|l| l.lane == la).expect("a").depth,
            DEEP as u64
        );
        // A cursor deep into the lane reads from there.
        let mid = claim_lane(s, &t, la, got[0].units[0].seq.0 + 50_000, 2);
        assert_eq!(row_ids(&mid), ["deep-50000", "deep-50001"]);
    });
}

fn ids_unique_across_actors(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let mut seen = std::collections::HashSet::new();
        let mut lanes = std::collections::HashSet::new();
        for name in ["alice", "bob", "carol"] {
            let a = actor(name);
            let out = s
                .enqueue(&a, &[row("same-id", &[A, B]), row("two", &[A])])
                .expect("enqueue");
            for e in out {
                for u in e.units {
                    assert!(seen.insert(u), "unit id {u} reused");
                }
            }
            for l in s.lanes(&a).expect("lanes") {
                assert!(lanes.insert(l.lane), "lane id reused");
            }
        }
        assert_eq!(seen.len(), 9);
        // Ids are not reused after units finish either.
        let a = actor("alice");
        let t = acquire(s, &a, "h", LEASE);
        let la = lane_of(s, &a, A);
        let c = claim_lane(s, &t, la, 0, 10);
        s.ack(&t, &c.units.iter().map(|u| (u.id, la)).collect::<Vec<_>>())
            .expect("ack");
        let out = s.enqueue(&a, &[row("three", &[A])]).expect("enqueue");
        assert!(seen.insert(out[0].units[0]));
    });
}

fn dead_letter_durable_before_next_unit_is_claimable(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let a = actor("alice");
        h.store
            .enqueue(&a, &[row("r0", &[A]), row("r1", &[A])])
            .expect("enqueue");
        let la = lane_of(&*h.store, &a, A);
        let t = acquire(&*h.store, &a, "h", LEASE);
        let u0 = claim_lane(&*h.store, &t, la, 0, 1).units[0].id;
        h.store
            .dead_letter(
                &t,
                &DeadLetterRequest {
                    unit: u0,
                    lane: la,
                    reason: DeadReason::Permanent,
                    status: Some(422),
                    error: Some("refused".into()),
                    at: now(),
                },
            )
            .expect("dead letter");
        // Right after it returns, a fresh store on the database sees it.
        h.reopen();
        let s = &*h.store;
        let dl = s.dead_letters(Some(&a)).expect("dl");
        assert_eq!(dl.len(), 1);
        assert_eq!(dl[0].unit, u0);
        assert_eq!(row_ids(&claim_lane(s, &t, la, 0, 10)), ["r1"]);
    });
}

fn dead_letter_returns_what_it_wrote_and_none_when_not_pending(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(&a, &[row("r0", &[A]), row("r1", &[A]), row("r2", &[A])])
            .expect("enqueue");
        let la = lane_of(s, &a, A);
        let t = acquire(s, &a, "h", LEASE);
        let c = claim_lane(s, &t, la, 0, 10);
        let req = |unit, reason| DeadLetterRequest {
            unit,
            lane: la,
            reason,
            status: Some(422),
            error: None,
            at: Timestamp::from_millis(8_000),
        };
        // Two attempts persisted earlier (by an earlier pass, say): the dead letter returned
        // carries them, not only what this request knows.
        s.record_attempts(
            &t,
            &[AttemptRecord {
                unit: c.units[0].id,
                lane: la,
                attempts: 2,
                status: Some(503),
                error: None,
                at: Timestamp::from_millis(7_000),
            }],
        )
        .expect("attempts");
        let first = req(c.units[0].id, DeadReason::Permanent);
        let written = s.dead_letter(&t, &first).expect("dead").expect("written");
        let listed = &s.dead_letters(Some(&a)).expect("dl")[0];
        assert_eq!(
            written,
            WrittenDeadLetter {
                id: listed.id,
                unit: listed.unit,
                row_id: "r0".into(),
                seq: listed.seq,
                attempts: 2,
                last_status: Some(422),
                last_error: None,
                dead_at: Timestamp::from_millis(8_000),
            }
        );
        assert_eq!(
            (listed.attempts, listed.last_status, listed.dead_at),
            (2, Some(422), Timestamp::from_millis(8_000))
        );
        // The same request again (a store retrying a commit it lost track of) returns the
        // dead letter it wrote; nothing new is written.
        assert_eq!(s.dead_letter(&t, &first), Ok(Some(written)));
        assert_eq!(s.dead_letters(Some(&a)).expect("dl").len(), 1);
        // Another request for a delivery that is no longer pending writes nothing.
        assert_eq!(
            s.dead_letter(&t, &req(c.units[0].id, DeadReason::Exhausted)),
            Ok(None)
        );
        s.ack(&t, &[(c.units[1].id, la)]).expect("ack");
        assert_eq!(
            s.dead_letter(&t, &req(c.units[1].id, DeadReason::Permanent)),
            Ok(None)
        );
        // A unit the operator skipped while its attempt was in flight: the skip's dead
        // letter stands, the pass's request writes none.
        let skipped = s.skip_lane_head(la, now()).expect("skip");
        assert_eq!(skipped, Some(c.units[2].id));
        assert_eq!(
            s.dead_letter(&t, &req(c.units[2].id, DeadReason::Permanent)),
            Ok(None)
        );
        let dl = s.dead_letters(Some(&a)).expect("dl");
        assert_eq!(
            dl.iter()
                .map(|d| (d.row_id.as_str(), d.reason))
                .collect::<Vec<_>>(),
            [("r0", DeadReason::Permanent), ("r2", DeadReason::Skipped)]
        );
    });
}

/// Makes every later insert of a dead letter for row `row_id` fail inside the database (a
/// trigger), on the backends a test can reach with plain SQL; false on SQLite in memory.
fn fail_dead_letters_of(h: &H, row_id: &str) -> bool {
    if let Some(path) = h.sqlite_path() {
        let c = outbox_lanes_store::sqlite::rusqlite::Connection::open(path).expect("open");
        c.execute_batch(&format!(
            "CREATE TRIGGER test_fail_dead BEFORE INSERT ON ol_dead_letters \
             WHEN NEW.row_id = '{row_id}' BEGIN SELECT RAISE(ABORT, 'injected failure'); END;"
        ))
        .expect("trigger");
        return true;
    }
    #[cfg(feature = "postgres")]
    if let Some((url, schema)) = h.pg() {
        pg_client(&url, &schema)
            .batch_execute(&format!(
                "CREATE FUNCTION {schema}.test_fail_dead() RETURNS trigger AS $$ BEGIN \
                 IF NEW.row_id = '{row_id}' THEN RAISE EXCEPTION 'injected failure'; END IF; \
                 RETURN NEW; END $$ LANGUAGE plpgsql; \
                 CREATE TRIGGER test_fail_dead BEFORE INSERT ON {schema}.ol_dead_letters \
                 FOR EACH ROW EXECUTE FUNCTION {schema}.test_fail_dead();"
            ))
            .expect("trigger");
        return true;
    }
    false
}

fn dead_letters_of_one_call_are_one_transaction_in_request_order(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        let rows: Vec<NewRow> = (0..3)
            .flat_map(|k| [row(&format!("a{k}"), &[A]), row(&format!("b{k}"), &[B])])
            .collect();
        s.enqueue(&a, &rows).expect("enqueue");
        let (la, lb) = (lane_of(s, &a, A), lane_of(s, &a, B));
        let t = acquire(s, &a, "h", LEASE);
        let ca = claim_lane(s, &t, la, 0, 10);
        let cb = claim_lane(s, &t, lb, 0, 10);
        let req = |unit, lane, k: u64| DeadLetterRequest {
            unit,
            lane,
            reason: DeadReason::DestinationRefused,
            status: None,
            error: Some(format!("refused {k}")),
            at: Timestamp::from_millis(9_000 + k),
        };
        // An earlier pass's attempts: the dead letter keeps the persisted count.
        s.record_attempts(
            &t,
            &[AttemptRecord {
                unit: ca.units[1].id,
                lane: la,
                attempts: 3,
                status: Some(503),
                error: None,
                at: Timestamp::from_millis(8_000),
            }],
        )
        .expect("attempts");
        s.ack(&t, &[(cb.units[1].id, lb)]).expect("ack");
        // A batch over both lanes, as a round makes it: in each lane in lane order, with a
        // delivery that is no longer pending (served) among them.
        let batch = [
            req(ca.units[0].id, la, 0),
            req(cb.units[0].id, lb, 1),
            req(ca.units[1].id, la, 2),
            req(cb.units[1].id, lb, 3),
            req(ca.units[2].id, la, 4),
        ];
        assert_eq!(s.write_dead_letters(&t, &[]), Ok(Vec::new()));
        // A stale token writes none of them.
        let other = actor("bob");
        s.enqueue(&other, &[row("x", &[A])]).expect("enqueue");
        let t_stale = acquire(s, &other, "h", Duration::from_millis(100));
        let _taken = acquire_eventually(s, &other, "successor", LEASE);
        assert_eq!(
            s.write_dead_letters(&t_stale, &batch),
            Err(StoreError::StaleToken)
        );
        assert!(s.dead_letters(None).expect("dl").is_empty());

        let written = s.write_dead_letters(&t, &batch).expect("dead letters");
        assert_eq!(written.len(), batch.len());
        assert!(
            written[3].is_none(),
            "a served delivery is not dead-lettered"
        );
        let w: Vec<&WrittenDeadLetter> = written.iter().flatten().collect();
        assert_eq!(
            w.iter().map(|d| d.row_id.as_str()).collect::<Vec<_>>(),
            ["a0", "b0", "a1", "a2"]
        );
        assert!(
            w.windows(2).all(|p| p[0].id < p[1].id),
            "ids ascend in request order: {w:?}"
        );
        assert_eq!(
            w.iter().map(|d| d.attempts).collect::<Vec<_>>(),
            [0, 0, 3, 0]
        );
        let listed = s.dead_letters(Some(&a)).expect("dl");
        assert_eq!(
            listed
                .iter()
                .map(|d| (d.id, d.row_id.as_str(), d.last_error.as_deref()))
                .collect::<Vec<_>>(),
            [
                (w[0].id, "a0", Some("refused 0")),
                (w[1].id, "b0", Some("refused 1")),
                (w[2].id, "a1", Some("refused 2")),
                (w[3].id, "a2", Some("refused 4")),
            ]
        );
        // The same batch again (a commit retried after its outcome was lost) returns the
        // same dead letters and writes nothing new.
        assert_eq!(s.write_dead_letters(&t, &batch), Ok(written));
        assert_eq!(s.dead_letters(Some(&a)).expect("dl").len(), 4);
        let pending = |s: &dyn Store| {
            let st = s.status().expect("status");
            st.iter().find(|x| x.actor == a).map_or(0, |x| x.pending)
        };
        assert_eq!(pending(s), 1, "b2 only");

        // A failure in the middle of a batch writes none of it.
        s.enqueue(&a, &[row("a3", &[A]), row("a4", &[A]), row("a5", &[A])])
            .expect("enqueue");
        let c = claim_lane(s, &t, la, 0, 10);
        assert_eq!(row_ids(&c), ["a3", "a4", "a5"]);
        if fail_dead_letters_of(h, "a4") {
            let batch: Vec<DeadLetterRequest> = (0..3)
                .map(|k| req(c.units[k].id, la, 10 + k as u64))
                .collect();
            assert!(s.write_dead_letters(&t, &batch).is_err());
            assert_eq!(s.dead_letters(Some(&a)).expect("dl").len(), 4);
            assert_eq!(
                row_ids(&claim_lane(s, &t, la, 0, 10)),
                ["a3", "a4", "a5"],
                "nothing of the failed batch was written"
            );
        }
    });
}

fn retire_lane_dead_letters_only_that_recipient(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        let out = s
            .enqueue(
                &a,
                &[
                    row("r0", &[A]),
                    NewRow {
                        joined: true,
                        ..row("j", &[A, B])
                    },
                    row("r1", &[A, B]),
                ],
            )
            .expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let (la, lb) = (lane_of(s, &a, A), lane_of(s, &a, B));
        // r0 failed before: its dead letter keeps that, and so does what retire returns.
        s.record_attempts(
            &t,
            &[AttemptRecord {
                unit: out[0].units[0],
                lane: la,
                attempts: 3,
                status: Some(503),
                error: Some("status 503".into()),
                at: Timestamp::from_millis(4_000),
            }],
        )
        .expect("attempts");
        let at = Timestamp::from_millis(7_000);
        let retired = s
            .retire_lane(&t, la, at, DeadReason::LaneRetired)
            .expect("retire");
        let dl = s.dead_letters(Some(&a)).expect("dl");
        assert_eq!(dl.len(), 3);
        assert!(
            dl.iter()
                .all(|d| d.reason == DeadReason::LaneRetired && d.key == key(A))
        );
        assert_eq!(
            dl.iter().map(|d| d.row_id.as_str()).collect::<Vec<_>>(),
            ["r0", "j", "r1"]
        );
        // Retire returns the dead letters it wrote, in lane order, as they are listed.
        let listed: Vec<WrittenDeadLetter> = dl
            .iter()
            .map(|d| WrittenDeadLetter {
                id: d.id,
                unit: d.unit,
                row_id: d.row_id.clone(),
                seq: d.seq,
                attempts: d.attempts,
                last_status: d.last_status,
                last_error: d.last_error.clone(),
                dead_at: d.dead_at,
            })
            .collect();
        assert_eq!(retired, listed);
        assert_eq!(
            retired.iter().map(|d| d.unit).collect::<Vec<_>>(),
            [out[0].units[0], out[1].units[0], out[2].units[0]]
        );
        assert_eq!(
            (retired[0].attempts, retired[0].last_status),
            (3, Some(503))
        );
        assert_eq!(retired[0].last_error.as_deref(), Some("status 503"));
        assert!(retired.iter().all(|d| d.dead_at == at));
        // Nothing pending is left to retire.
        assert_eq!(
            s.retire_lane(&t, la, now(), DeadReason::LaneRetired),
            Ok(Vec::new())
        );
        // The joined unit, still pending for B, stays listed in A with A no longer to serve.
        let ca = claim_lane(s, &t, la, 0, 10);
        assert_eq!(row_ids(&ca), ["j"]);
        assert!(
            ca.units[0]
                .slots
                .iter()
                .find(|x| x.lane == la)
                .expect("slot a")
                .served
        );
        let cb = claim_lane(s, &t, lb, 0, 10);
        assert_eq!(row_ids(&cb), ["j", "r1"]);
        assert_eq!(cb.units[0].id, out[1].units[0]);
    });
}

/// Issue 41: a lane's run of failures (`failing_since`) and the unavailability found in it
/// (`unavailable_since`) come back wherever a pass or an operator reads the lane; the first
/// unavailability is kept, an answer (`None`) clears both, and so do the operator actions
/// that bring a lane back; a stale token writes nothing.
fn a_lanes_run_of_failures_round_trips_and_operators_clear_it(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(&a, &[row("r0", &[A]), row("r1", &[B])])
            .expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let (la, lb) = (lane_of(s, &a, A), lane_of(s, &a, B));
        let ms = Timestamp::from_millis;
        type Run = (StoreLaneId, Option<Timestamp>, Option<Timestamp>);
        let with_work = || -> Vec<Run> {
            let (lanes, _) = s.lanes_with_work(&t, 0).expect("lanes with work");
            lanes
                .iter()
                .map(|l| (l.lane, l.failing_since, l.unavailable_since))
                .collect()
        };
        let listed = || -> Vec<Run> {
            s.lanes(&a)
                .expect("lanes")
                .iter()
                .map(|l| (l.lane, l.failing_since, l.unavailable_since))
                .collect()
        };
        assert_eq!(with_work(), [(la, None, None), (lb, None, None)]);
        assert_eq!(listed(), with_work());

        // Written twice (a retried write): the same; the first unavailability is kept.
        for _ in 0..2 {
            s.set_lane_failing(&t, la, Some(ms(1_000)))
                .expect("failing");
            s.set_lane_unavailable(&t, la, ms(5_000))
                .expect("unavailable");
        }
        s.set_lane_unavailable(&t, la, ms(6_000))
            .expect("unavailable again");
        let marked = [(la, Some(ms(1_000)), Some(ms(5_000))), (lb, None, None)];
        assert_eq!(with_work(), marked);
        assert_eq!(listed(), marked);
        let st = s.lane_status(la).expect("status").expect("lane");
        assert_eq!(
            (st.failing_since, st.unavailable_since),
            (Some(ms(1_000)), Some(ms(5_000)))
        );
        assert_eq!(st.state(now()), LaneState::Unavailable);
        // `status` shows it unavailable, among the lanes waiting for a time (its next probe).
        let status = s.status().expect("status");
        let mine = status
            .iter()
            .find(|x| x.actor == a)
            .expect("alice's status");
        let waiting: Vec<(LaneKey, LaneState)> = mine
            .lanes_in_backoff
            .iter()
            .map(|l| (l.key.clone(), l.state))
            .collect();
        assert_eq!(waiting, [(key(A), LaneState::Unavailable)]);
        assert!(mine.lanes_paused.is_empty());
        assert_eq!(st.state(now()).name(), "unavailable");
        assert_eq!(st.state(now()).to_string(), "unavailable");
        let other = s.lane_status(lb).expect("status").expect("lane");
        assert_eq!(other.state(now()), LaneState::Open);
        // A later failing time (a run written again) keeps the unavailability.
        s.set_lane_failing(&t, la, Some(ms(2_000)))
            .expect("failing");
        assert_eq!(with_work()[0], (la, Some(ms(2_000)), Some(ms(5_000))));

        // An operator's pause: the changed lane carries the marks; a pause wins in the state.
        let seen = t.control().generation;
        s.pause_lane(la, "look").expect("pause");
        let c = s.lane_controls(&t, seen).expect("controls");
        let changed: Vec<(Run, bool)> = c
            .changed
            .iter()
            .map(|cl| {
                let l = &cl.state;
                ((l.lane, l.failing_since, l.unavailable_since), l.paused)
            })
            .collect();
        assert_eq!(changed, [((la, Some(ms(2_000)), Some(ms(5_000))), true)]);
        let st = s.lane_status(la).expect("status").expect("lane");
        assert_eq!(st.state(now()), LaneState::Paused);
        // Resume: a new run of failures starts.
        s.resume_lane(la).expect("resume");
        let c = s.lane_controls(&t, c.read.generation).expect("controls");
        assert_eq!(c.changed.len(), 1);
        let l = &c.changed[0].state;
        assert_eq!(
            (l.lane, l.paused, l.failing_since, l.unavailable_since),
            (la, false, None, None)
        );
        assert_eq!(listed(), [(la, None, None), (lb, None, None)]);

        // `lanes retry` clears both, with the backoff.
        s.set_lane_failing(&t, la, Some(ms(1_000)))
            .expect("failing");
        s.set_lane_unavailable(&t, la, ms(5_000))
            .expect("unavailable");
        s.set_lane_state(&t, la, Some(now() + Duration::from_secs(60)), 3)
            .expect("backoff");
        s.retry_lane_now(la).expect("retry");
        let l = s.lane_status(la).expect("status").expect("lane");
        assert_eq!(
            (
                l.failing_since,
                l.unavailable_since,
                l.not_before,
                l.backoff_level
            ),
            (None, None, None, 0)
        );

        // An answer (`None`) clears both.
        s.set_lane_failing(&t, lb, Some(ms(3_000)))
            .expect("failing");
        s.set_lane_unavailable(&t, lb, ms(4_000))
            .expect("unavailable");
        s.set_lane_failing(&t, lb, None).expect("delivered");
        s.set_lane_failing(&t, lb, None).expect("delivered again");
        assert_eq!(listed(), [(la, None, None), (lb, None, None)]);

        // A lane a pass reads for a held host carries the marks too.
        s.set_lane_failing(&t, lb, Some(ms(3_000)))
            .expect("failing");
        let origin_b = "https://b.example:443";
        assert_eq!(
            s.block_host(origin_b, HostBlock::Hold, now())
                .expect("hold"),
            1
        );
        let states = s
            .pause_for_host(&t, &[(lb, origin_b.into())])
            .expect("pause for host");
        let l = &states[0].state;
        assert_eq!(
            (l.lane, l.paused, l.failing_since, l.unavailable_since),
            (lb, true, Some(ms(3_000)), None)
        );
        s.block_host(origin_b, HostBlock::Open, now())
            .expect("unblock");
        // The unblock forgets the run, as a resume does: the held time is not a failure.
        assert_eq!(listed(), [(la, None, None), (lb, None, None)]);
        let l = s.lane_status(lb).expect("status").expect("lane");
        assert_eq!((l.paused, l.state(now())), (false, LaneState::Open));

        // `hosts retry` clears the runs of the host's lanes, and counts a failing lane.
        s.set_lane_unavailable(&t, lb, ms(4_000))
            .expect("unavailable");
        s.set_lane_failing(&t, la, Some(ms(1_000)))
            .expect("failing");
        assert_eq!(s.retry_host(origin_b, now()).expect("retry host"), 1);
        assert_eq!(listed(), [(la, Some(ms(1_000)), None), (lb, None, None)]);

        // Another actor's lane is not the token's.
        let bob = actor("bob");
        s.enqueue(&bob, &[row("b0", &[A])]).expect("enqueue");
        let bob_lane = lane_of(s, &bob, A);
        assert_eq!(
            s.set_lane_failing(&t, bob_lane, Some(ms(1_000))),
            Err(StoreError::NotFound { what: "lane" })
        );
        assert_eq!(
            s.set_lane_unavailable(&t, bob_lane, ms(1_000)),
            Err(StoreError::NotFound { what: "lane" })
        );
        let bl = s.lane_status(bob_lane).expect("status").expect("lane");
        assert_eq!((bl.failing_since, bl.unavailable_since), (None, None));

        // A stale token writes nothing.
        let _ = s.release_slot(&t).expect("release");
        assert_eq!(
            s.set_lane_failing(&t, lb, Some(ms(9_000))),
            Err(StoreError::StaleToken)
        );
        assert_eq!(
            s.set_lane_failing(&t, la, None),
            Err(StoreError::StaleToken)
        );
        assert_eq!(
            s.set_lane_unavailable(&t, la, ms(9_000)),
            Err(StoreError::StaleToken)
        );
        assert_eq!(
            s.retire_lane(&t, la, now(), DeadReason::LaneUnavailable),
            Err(StoreError::StaleToken)
        );
        assert_eq!(listed(), [(la, Some(ms(1_000)), None), (lb, None, None)]);
        assert!(s.dead_letters(None).expect("dead letters").is_empty());

        // A `--dead-letter` block pauses nothing, yet its unblock forgets the runs of the
        // host's lanes too (the lane to the other host keeps its own).
        let t = acquire(s, &a, "h", LEASE);
        s.set_lane_failing(&t, lb, Some(ms(3_000)))
            .expect("failing");
        s.set_lane_unavailable(&t, lb, ms(4_000))
            .expect("unavailable");
        assert_eq!(
            s.block_host(origin_b, HostBlock::DeadLetter, now())
                .expect("block --dead-letter"),
            1
        );
        assert_eq!(
            listed(),
            [
                (la, Some(ms(1_000)), None),
                (lb, Some(ms(3_000)), Some(ms(4_000)))
            ]
        );
        s.block_host(origin_b, HostBlock::Open, now())
            .expect("unblock");
        assert_eq!(listed(), [(la, Some(ms(1_000)), None), (lb, None, None)]);
    });
}

/// Issue 41: a lane found unavailable is retired with reason `lane_unavailable`: every pending
/// unit of it, in lane order (a joined unit for this recipient only), and nothing of the
/// other lanes; retiring is no delivery, so the lane keeps its marks.
fn retire_lane_with_lane_unavailable_dead_letters_every_pending_unit_in_order(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        let out = s
            .enqueue(
                &a,
                &[
                    row("r0", &[A]),
                    NewRow {
                        joined: true,
                        ..row("j", &[A, B])
                    },
                    row("r1", &[A, B]),
                    row("r2", &[B]),
                    row("r3", &[A]),
                ],
            )
            .expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let (la, lb) = (lane_of(s, &a, A), lane_of(s, &a, B));
        let ms = Timestamp::from_millis;
        s.set_lane_failing(&t, la, Some(ms(1_000)))
            .expect("failing");
        s.set_lane_unavailable(&t, la, ms(6_000))
            .expect("unavailable");
        let at = ms(7_000);
        let retired = s
            .retire_lane(&t, la, at, DeadReason::LaneUnavailable)
            .expect("retire");
        assert_eq!(
            retired.iter().map(|d| d.unit).collect::<Vec<_>>(),
            [
                out[0].units[0],
                out[1].units[0],
                out[2].units[0],
                out[4].units[0]
            ]
        );
        assert!(retired.iter().all(|d| d.dead_at == at));
        let dl = s.dead_letters(Some(&a)).expect("dead letters");
        assert_eq!(
            dl.iter()
                .map(|d| (d.row_id.as_str(), d.reason, d.key.clone()))
                .collect::<Vec<_>>(),
            [
                ("r0", DeadReason::LaneUnavailable, key(A)),
                ("j", DeadReason::LaneUnavailable, key(A)),
                ("r1", DeadReason::LaneUnavailable, key(A)),
                ("r3", DeadReason::LaneUnavailable, key(A)),
            ]
        );
        assert_eq!(
            dl.iter().map(|d| d.id).collect::<Vec<_>>(),
            retired.iter().map(|d| d.id).collect::<Vec<_>>()
        );
        assert_eq!(DeadReason::LaneUnavailable.as_str(), "lane_unavailable");
        // B's lane is untouched.
        assert_eq!(row_ids(&claim_lane(s, &t, lb, 0, 10)), ["j", "r1", "r2"]);
        // The lane keeps its marks and has nothing left to retire.
        let l = s.lane_status(la).expect("status").expect("lane");
        assert_eq!(
            (l.depth, l.failing_since, l.unavailable_since),
            (0, Some(ms(1_000)), Some(ms(6_000)))
        );
        assert_eq!(
            s.retire_lane(&t, la, now(), DeadReason::LaneUnavailable),
            Ok(Vec::new())
        );
    });
}

fn operator_ops(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(&a, &[row("r0", &[A]), row("r1", &[A, B])])
            .expect("enqueue");
        let (la, lb) = (lane_of(s, &a, A), lane_of(s, &a, B));
        s.pause_lane(la, "maintenance").expect("pause");
        let t = acquire(s, &a, "h", LEASE);
        let c = claim_lane(s, &t, la, 0, 10);
        assert!(c.units.is_empty());
        let (lanes, _) = s.lanes_with_work(&t, 0).expect("lanes");
        assert!(lanes.iter().find(|l| l.lane == la).expect("a").paused);
        let l = s.lanes(&a).expect("lanes");
        let la_status = l.iter().find(|x| x.lane == la).expect("a");
        assert_eq!(la_status.depth, 2);
        assert!(la_status.paused);
        assert_eq!(la_status.pause_reason.as_deref(), Some("maintenance"));
        assert!(la_status.head_enqueued_at.is_some());
        // Only lane B has admissible work.
        assert_eq!(
            s.actors_with_work(now()).expect("due").ready,
            std::slice::from_ref(&a)
        );
        let ub = claim_lane(s, &t, lb, 0, 10).units[0].id;
        s.ack(&t, &[(ub, lb)]).expect("ack");
        assert!(s.actors_with_work(now()).expect("due").ready.is_empty());
        s.resume_lane(la).expect("resume");
        assert_eq!(row_ids(&claim_lane(s, &t, la, 0, 10)), ["r0", "r1"]);
        // Strict lanes are blocked by the pass, resumed by an operator.
        s.set_lane_strict(la, true).expect("strict");
        s.block_lane(&t, la, "head failed on a strict lane")
            .expect("block");
        let l = &s.lanes(&a).expect("lanes")[0];
        assert!(l.strict && l.paused);
        assert!(s.actors_with_work(now()).expect("due").ready.is_empty());
        s.resume_lane(la).expect("resume");
        assert_eq!(
            s.pause_lane(StoreLaneId(987_654), "x"),
            Err(StoreError::NotFound { what: "lane" })
        );
        let st = s.status().expect("status");
        assert_eq!(st.len(), 1);
        assert_eq!(st[0].actor, a);
        assert_eq!(st[0].pending, 2);
        assert!(st[0].in_flight);
        let _ = s.release_slot(&t).expect("release");
        assert!(!s.status().expect("status")[0].in_flight);
    });
}

fn operator_lane_purge_skip_and_retry(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        let mut j = row("j", &[A, B]);
        j.joined = true;
        s.enqueue(
            &a,
            &[
                row("r0", &[A]),
                row("r1", &[A]),
                j,
                row("r2", &[A]),
                row("b0", &[B]),
            ],
        )
        .expect("enqueue");
        let (la, lb) = (lane_of(s, &a, A), lane_of(s, &a, B));
        let t = acquire(s, &a, "h", LEASE);

        // A strict lane blocked on its head: retry lifts the block and clears the backoff...
        s.set_lane_strict(la, true).expect("strict");
        s.set_lane_state(
            &t,
            la,
            Some(now().saturating_add(Duration::from_secs(60))),
            3,
        )
        .expect("backoff");
        s.block_lane(&t, la, STRICT_BLOCKED_REASON).expect("block");
        s.retry_lane_now(la).expect("retry");
        let l = s.lanes(&a).expect("lanes");
        let st = l.iter().find(|x| x.lane == la).expect("a");
        assert!(!st.paused && st.pause_reason.is_none(), "{st:?}");
        assert_eq!((st.not_before, st.backoff_level), (None, 0));
        // ...but an operator's pause stays.
        s.pause_lane(la, "maintenance").expect("pause");
        s.retry_lane_now(la).expect("retry");
        assert!(
            s.lanes(&a)
                .expect("lanes")
                .iter()
                .any(|x| x.lane == la && x.paused)
        );
        s.resume_lane(la).expect("resume");

        // skip-head: only the head goes aside, the block lifts, the rest keeps its order.
        s.block_lane(&t, la, STRICT_BLOCKED_REASON).expect("block");
        let skipped = s.skip_lane_head(la, now()).expect("skip");
        assert!(skipped.is_some());
        let dl = s.dead_letters(Some(&a)).expect("dead");
        assert_eq!(dl.len(), 1);
        assert_eq!(
            (dl[0].row_id.as_str(), dl[0].reason),
            ("r0", DeadReason::Skipped)
        );
        assert_eq!(Some(dl[0].unit), skipped);
        assert!(!s.lanes(&a).expect("lanes").iter().any(|x| x.paused));
        assert_eq!(row_ids(&claim_lane(s, &t, la, 0, 10)), ["r1", "j", "r2"]);

        // purge: every pending unit of lane A, in order; B keeps its share of the joined unit.
        assert_eq!(s.purge_lane(la, now()).expect("purge"), 3);
        let dl = s.dead_letters(Some(&a)).expect("dead");
        let purged: Vec<&str> = dl
            .iter()
            .filter(|d| d.reason == DeadReason::Purged)
            .map(|d| d.row_id.as_str())
            .collect();
        assert_eq!(purged, ["r1", "j", "r2"]);
        assert!(dl.iter().all(|d| d.key == key(A)));
        // The joined unit stays listed in A, with A no longer to serve, until B is served.
        let ca = claim_lane(s, &t, la, 0, 10);
        assert_eq!(row_ids(&ca), ["j"]);
        assert!(ca.units[0].slots.iter().any(|x| x.lane == la && x.served));
        let cb = claim_lane(s, &t, lb, 0, 10);
        assert_eq!(row_ids(&cb), ["j", "b0"]);
        let done: Vec<_> = cb.units.iter().map(|u| (u.id, lb)).collect();
        s.ack(&t, &done).expect("ack");
        assert!(claim_lane(s, &t, la, 0, 10).units.is_empty());
        // An empty lane: nothing to skip or purge; an unknown lane is an error.
        assert_eq!(s.skip_lane_head(la, now()).expect("skip"), None);
        assert_eq!(s.purge_lane(la, now()).expect("purge"), 0);
        assert_eq!(
            s.purge_lane(StoreLaneId(987_654), now()),
            Err(StoreError::NotFound { what: "lane" })
        );
        assert_eq!(
            s.skip_lane_head(StoreLaneId(987_654), now()),
            Err(StoreError::NotFound { what: "lane" })
        );
        // Replay puts them back at the tail, in their order.
        s.replay_dead_letters(&DeadLetterSelection::Actor(a.clone()))
            .expect("replay");
        assert_eq!(
            row_ids(&claim_lane(s, &t, la, 0, 10)),
            ["r0", "r1", "j", "r2"]
        );
    });
}

fn wake_ups_after_enqueue(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let a = actor("alice");
        let n = h.store.notifier();
        let seen = n.generation();
        let fired = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let f2 = fired.clone();
        let _sub = n.subscribe(move || {
            f2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        h.store.enqueue(&a, &[row("r0", &[A])]).expect("enqueue");
        assert_ne!(n.wait_timeout(seen, Duration::from_secs(10)), seen);
        assert!(fired.load(std::sync::atomic::Ordering::SeqCst) >= 1);
        // Across instances (processes): the second store's watcher sees the first's enqueue.
        let other = h.second();
        let w = other.watch().expect("watch");
        let mut woke = false;
        for k in 0..50 {
            let seen = w.generation();
            h.store
                .enqueue(&a, &[row(&format!("x{k}"), &[A])])
                .expect("enqueue");
            if w.wait_timeout(seen, Duration::from_millis(200)) != seen {
                woke = true;
                break;
            }
        }
        assert!(woke, "cross-instance wake-up never arrived");
    });
}

fn watermark_finds_new_lanes(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(&a, &[row("r0", &[A]), row("r1", &[B])])
            .expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let (lanes, mark) = s.lanes_with_work(&t, 0).expect("lanes");
        assert_eq!(lanes.len(), 2);
        let (none, same) = s.lanes_with_work(&t, mark).expect("lanes");
        assert!(none.is_empty());
        assert_eq!(same, mark);
        s.enqueue(&a, &[row("r2", &[C]), row("r3", &[A])])
            .expect("enqueue");
        let (new, mark2) = s.lanes_with_work(&t, mark).expect("lanes");
        let keys: Vec<_> = new.iter().map(|l| l.key.clone()).collect();
        assert_eq!(keys, [key(A), key(C)]);
        assert!(mark2 > mark);
        // Other actors' lanes never show.
        s.enqueue(&actor("bob"), &[row("b0", &[A])])
            .expect("enqueue");
        assert!(s.lanes_with_work(&t, mark2).expect("lanes").0.is_empty());
    });
}

fn ack_retention_and_purge(b: Backend) {
    // No dedup window: the id comes back with the purge of the retained unit.
    let common = CommonOptions {
        ack_retention: Some(Duration::from_secs(3600)),
        row_id_retention: Duration::ZERO,
        ..CommonOptions::default()
    };
    run(b, common, |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(&a, &[row("r0", &[A]), row("r1", &[A])])
            .expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let la = lane_of(s, &a, A);
        let c = claim_lane(s, &t, la, 0, 10);
        s.ack(&t, &[(c.units[0].id, la)]).expect("ack");
        assert_eq!(row_ids(&claim_lane(s, &t, la, 0, 10)), ["r1"]);
        assert_eq!(s.status().expect("status")[0].pending, 1);
        // Kept: the row id is still taken.
        assert!(matches!(
            s.enqueue(&a, &[row("r0", &[A])]),
            Err(EnqueueError::DuplicateRowId { .. })
        ));
        assert_eq!(s.purge_acked(Timestamp::from_millis(1)), Ok(0));
        assert_eq!(s.purge_acked(now() + Duration::from_secs(60)), Ok(1));
        s.enqueue(&a, &[row("r0", &[A])])
            .expect("id free after purge");
    });
}

/// A row's payload lives inline on its unit (one recipient, or joined) or once in a shared
/// place (several recipients), and moves when its unit is dead-lettered: a row id stays taken
/// in every shape, for as long as any unit or dead letter of the row remains, and every shape
/// reads back its own bytes.
fn row_ids_unique_across_payload_shapes(b: Backend) {
    // No dedup window here: what frees an id is its row's last unit finishing
    // (`delivered_row_ids_stay_refused_for_the_window` has the window).
    let common = CommonOptions {
        row_id_retention: Duration::ZERO,
        ..CommonOptions::default()
    };
    run(b, common, |h| {
        let s = &*h.store;
        let a = actor("alice");
        let joined = NewRow {
            joined: true,
            ..row("j", &[A, B])
        };
        s.enqueue(&a, &[row("m", &[A, B]), row("s", &[A]), joined])
            .expect("enqueue");
        let dup = |id: &str, to: &[&str]| {
            assert_eq!(
                s.enqueue(&a, &[row(id, to)]),
                Err(EnqueueError::DuplicateRowId { row: id.into() }),
                "{id} to {to:?}"
            );
        };
        for id in ["m", "s", "j"] {
            dup(id, &[C]);
            dup(id, &[B, C]);
        }
        let t = acquire(s, &a, "h", LEASE);
        let (la, lb) = (lane_of(s, &a, A), lane_of(s, &a, B));
        let ca = claim_lane(s, &t, la, 0, 10);
        assert_eq!(row_ids(&ca), ["m", "s", "j"]);
        for u in &ca.units {
            let p = s.payload(u.id).expect("payload");
            assert_eq!(p.body, format!("{{\"id\":\"{}\"}}", u.row_id).into_bytes());
            assert_eq!(p.content_type, "application/json");
            assert_eq!(p.row_id, u.row_id);
        }
        let (m_a, s_a, j) = (ca.units[0].id, ca.units[1].id, ca.units[2].id);
        // Dead-lettering moves the one-recipient row's payload; the id stays taken and the
        // bytes come back on replay.
        s.dead_letter(
            &t,
            &DeadLetterRequest {
                unit: s_a,
                lane: la,
                reason: DeadReason::Permanent,
                status: Some(400),
                error: None,
                at: now(),
            },
        )
        .expect("dead");
        dup("s", &[C]);
        assert_eq!(
            s.replay_dead_letters(&DeadLetterSelection::Actor(a.clone())),
            Ok(vec![s_a])
        );
        assert_eq!(
            s.payload(s_a).expect("payload after replay").body,
            b"{\"id\":\"s\"}".to_vec()
        );
        // Finishing every unit of a row frees its id; a row with units left keeps it.
        let m_b = claim_lane(s, &t, lb, 0, 10).units[0].id;
        s.ack(&t, &[(m_a, la), (s_a, la), (j, la), (j, lb)])
            .expect("ack");
        dup("m", &[C]);
        s.ack(&t, &[(m_b, lb)]).expect("ack");
        for id in ["m", "s", "j"] {
            s.enqueue(&a, &[row(id, &[C])]).expect("id free again");
        }
        assert_eq!(
            row_ids(&claim_lane(s, &t, lane_of(s, &a, C), 0, 10)),
            ["m", "s", "j"]
        );
        assert!(claim_lane(s, &t, la, 0, 10).units.is_empty());
        assert!(claim_lane(s, &t, lb, 0, 10).units.is_empty());
    });
}

fn hdrs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
}

fn with_headers(r: NewRow, pairs: &[(&str, &str)]) -> NewRow {
    NewRow {
        headers: hdrs(pairs),
        ..r
    }
}

/// Headers come back with the payload in every payload shape (inline, shared by a fan-out,
/// a joined unit), through both enqueue paths (one-lane rows; rows with dedup keys and
/// fan-outs), in claims that carry the payload, and after a dead letter is replayed.
fn row_headers_round_trip_and_survive_dead_letters(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        let one = [("Authorization", "Bearer t0k"), ("X-Trace", "a: b\tc")];
        let first = s
            .enqueue(
                &a,
                &[with_headers(row("inline", &[A]), &one), row("plain", &[A])],
            )
            .expect("enqueue");
        let fan_h = [("x-fan", "1")];
        let second = s
            .enqueue(
                &a,
                &[
                    with_headers(row("fan", &[B, C]), &fan_h),
                    NewRow {
                        joined: true,
                        ..with_headers(row("joined", &[B, C]), &[("X-Joined", "yes")])
                    },
                    NewRow {
                        dedup_key: Some("k".into()),
                        ..with_headers(row("dedup", &[C]), &[("X-Dedup", "2")])
                    },
                ],
            )
            .expect("enqueue");
        let payload = |u: UnitId| s.payload(u).expect("payload");
        assert_eq!(payload(first[0].units[0]).headers, hdrs(&one));
        assert!(payload(first[1].units[0]).headers.is_empty());
        for u in &second[0].units {
            assert_eq!(payload(*u).headers, hdrs(&fan_h));
        }
        assert_eq!(
            payload(second[1].units[0]).headers,
            hdrs(&[("X-Joined", "yes")])
        );
        assert_eq!(
            payload(second[2].units[0]).headers,
            hdrs(&[("X-Dedup", "2")])
        );

        // A claim that carries the payload carries its headers.
        let t = acquire(s, &a, "h", LEASE);
        let la = lane_of(s, &a, A);
        let c = claim_lane(s, &t, la, 0, 10);
        assert_eq!(row_ids(&c), ["inline", "plain"]);
        if let Some(p) = &c.units[0].payload {
            assert_eq!(p.headers, hdrs(&one));
        }
        if let Some(p) = &c.units[1].payload {
            assert!(p.headers.is_empty());
        }

        // Dead-lettered (its inline payload moves aside) and replayed: the headers stay.
        let u = first[0].units[0];
        s.dead_letter(
            &t,
            &DeadLetterRequest {
                unit: u,
                lane: la,
                reason: DeadReason::Permanent,
                status: Some(400),
                error: None,
                at: now(),
            },
        )
        .expect("dead");
        assert_eq!(
            s.replay_dead_letters(&DeadLetterSelection::Actor(a.clone())),
            Ok(vec![u])
        );
        assert_eq!(payload(u).headers, hdrs(&one));
        let c = claim_lane(s, &t, la, 0, 10);
        assert_eq!(row_ids(&c), ["plain", "inline"]);
        if let Some(p) = &c.units[1].payload {
            assert_eq!(p.headers, hdrs(&one));
        }
    });
}

fn bad_row_headers_are_refused_naming_the_row(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        let good = with_headers(row("ok", &[A]), &[("X-Ok", "1")]);
        for (pairs, name, why) in [
            (
                &[("Content-Type", "text/plain")][..],
                "Content-Type",
                "content type",
            ),
            (
                &[("content-length", "3")][..],
                "content-length",
                "sets it itself",
            ),
            (
                &[("Idempotency-Key", "k")][..],
                "Idempotency-Key",
                "sets it itself",
            ),
            (&[("webhook-id", "k")][..], "webhook-id", "sets it itself"),
            (&[("Signature", "s")][..], "Signature", "sets it itself"),
            (&[("Date", "d")][..], "Date", "sets it itself"),
            (
                &[("Proxy-Authorization", "Basic eDp5")][..],
                "Proxy-Authorization",
                "hop-by-hop or proxy",
            ),
            (&[("Trailers", "x")][..], "Trailers", "hop-by-hop or proxy"),
            (
                &[("X Bad", "1")][..],
                "X Bad",
                "not a valid HTTP header name",
            ),
            (&[("", "1")][..], "", "not a valid HTTP header name"),
            (
                &[("X-Evil", "a\r\nHost: x")][..],
                "X-Evil",
                "not a valid HTTP header value",
            ),
            (
                &[("X-Utf", "caf\u{e9}")][..],
                "X-Utf",
                "not a valid HTTP header value",
            ),
            (&[("X-Pad", " 1")][..], "X-Pad", "whitespace"),
            (&[("X-A", "1"), ("x-a", "2")][..], "x-a", "twice"),
        ] {
            let bad = with_headers(row("bad", &[B]), pairs);
            let err = s.enqueue(&a, &[good.clone(), bad]).expect_err("refused");
            match &err {
                EnqueueError::BadHeader {
                    row,
                    name: n,
                    reason,
                } => {
                    assert_eq!(row, "bad");
                    assert_eq!(n, name);
                    assert!(reason.contains(why), "{reason:?} says {why:?}");
                }
                other => panic!("{pairs:?}: unexpected {other:?}"),
            }
            assert!(err.to_string().contains("\"bad\""), "{err}");
            assert_eq!(
                check_headers(&with_headers(row("bad", &[B]), pairs)),
                Err(err)
            );
        }
        // Nothing was written by any refused batch.
        assert!(s.status().expect("status").is_empty());
        assert!(s.find_lane(&a, &key(A)).expect("find").is_none());
        s.enqueue(&a, &[good]).expect("a good header is fine");
    });
}

/// `lanes` and `status` agree on every lane's state: a Retry-After throttle (level 0, future
/// `not_before`) is `throttled` in both, a paused lane is not "in backoff", and the slot's
/// holder and lease end are shown.
fn one_lane_state_in_lanes_and_status(b: Backend) {
    const D: &str = "https://d.example/inbox";
    const E: &str = "https://e.example/inbox";
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(&a, &[row("r0", &[A, B, C, D, E])])
            .expect("enqueue");
        let [la, lb, lc, ld] = [A, B, C, D].map(|u| lane_of(s, &a, u));
        let t = acquire(s, &a, "host-1:42", LEASE);
        let later = now() + Duration::from_secs(3600);
        s.set_lane_state(&t, la, Some(later), 0).expect("throttle");
        s.set_lane_state(&t, lb, Some(later), 2).expect("backoff");
        s.pause_lane(lc, "maintenance").expect("pause");
        s.set_lane_strict(ld, true).expect("strict");
        s.block_lane(&t, ld, "head failed").expect("block");
        let n = now();
        let states: Vec<(String, LaneState)> = s
            .lanes(&a)
            .expect("lanes")
            .iter()
            .map(|l| (l.key.recipient().to_owned(), l.state(n)))
            .collect();
        assert_eq!(
            states,
            [
                (A.to_owned(), LaneState::Throttled),
                (B.to_owned(), LaneState::Backoff(2)),
                (C.to_owned(), LaneState::Paused),
                (D.to_owned(), LaneState::StrictBlocked),
                (E.to_owned(), LaneState::Open),
            ]
        );
        let st = s.status().expect("status");
        assert_eq!(st.len(), 1);
        let waiting: Vec<(LaneKey, LaneState, Option<Timestamp>)> = st[0]
            .lanes_in_backoff
            .iter()
            .map(|l| (l.key.clone(), l.state, l.next_attempt))
            .collect();
        assert_eq!(
            waiting,
            [
                (key(A), LaneState::Throttled, Some(later)),
                (key(B), LaneState::Backoff(2), Some(later)),
            ]
        );
        let paused: Vec<(LaneKey, LaneState)> = st[0]
            .lanes_paused
            .iter()
            .map(|l| (l.key.clone(), l.state))
            .collect();
        assert_eq!(
            paused,
            [
                (key(C), LaneState::Paused),
                (key(D), LaneState::StrictBlocked)
            ]
        );
        let slot = st[0].slot.as_ref().expect("the slot is held");
        assert_eq!(slot.holder, "host-1:42");
        assert!(slot.lease_expires > n && slot.lease_expires <= n + LEASE + Duration::from_secs(5));
        assert_eq!(LaneState::Backoff(2).to_string(), "backoff 2");
        assert_eq!(LaneState::StrictBlocked.to_string(), "strict blocked");
        // A throttle that has passed needs no probe: the lane is open again.
        assert_eq!(
            LaneState::of(Some(n), 0, false, None, n + Duration::from_secs(1)),
            LaneState::Open
        );
        let _ = s.release_slot(&t).expect("release");
        let st = s.status().expect("status");
        assert_eq!(st[0].slot, None);
        assert!(!st[0].in_flight);
    });
}

/// The lane's last error describes its head while the head is the unit that failed; once the
/// lane delivers it the error is marked stale, and a new failure makes it current again.
fn last_error_goes_stale_once_the_head_moves_on(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(&a, &[row("r0", &[A]), row("r1", &[A])])
            .expect("enqueue");
        let la = lane_of(s, &a, A);
        let t = acquire(s, &a, "h", LEASE);
        let units = unit_ids(&claim_lane(s, &t, la, 0, 2));
        let fail = |unit: UnitId, attempts: u32| {
            s.record_attempts(
                &t,
                &[AttemptRecord {
                    unit,
                    lane: la,
                    attempts,
                    status: Some(503),
                    error: Some("status 503".into()),
                    at: now(),
                }],
            )
            .expect("record");
        };
        let lane = |s: &dyn Store| s.lanes(&a).expect("lanes").remove(0);
        assert!(!lane(s).last_error_stale, "no error yet");
        fail(units[0], 1);
        let l = lane(s);
        assert_eq!(l.last_status, Some(503));
        assert!(!l.last_error_stale, "the head is the unit that failed");
        s.ack(&t, &[(units[0], la)]).expect("ack");
        let l = lane(s);
        assert_eq!(l.last_status, Some(503), "kept for the operator");
        assert!(l.last_error_stale, "the lane delivered past it");
        fail(units[1], 1);
        assert!(!lane(s).last_error_stale);
        s.ack(&t, &[(units[1], la)]).expect("ack");
        let l = lane(s);
        assert_eq!(l.depth, 0);
        assert!(l.last_error_stale);
    });
}

/// One lane's status is the row `lanes` lists for it, whatever the lane's state; an unknown id
/// is none. An actor is known once it enqueued, and stays unknown until then.
fn one_lane_status_and_known_actors(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let (a, bob) = (actor("alice"), actor("bob"));
        assert!(!s.knows_actor(&a).expect("knows alice"));
        s.enqueue(&a, &[row("r0", &[A, B, C]), row("r1", &[C])])
            .expect("enqueue");
        assert!(s.knows_actor(&a).expect("knows alice"));
        assert!(!s.knows_actor(&bob).expect("knows bob"));
        let t = acquire(s, &a, "host-1:42", LEASE);
        s.set_lane_state(
            &t,
            lane_of(s, &a, A),
            Some(now() + Duration::from_secs(60)),
            1,
        )
        .expect("backoff");
        s.pause_lane(lane_of(s, &a, B), "maintenance")
            .expect("pause");
        let listed = s.lanes(&a).expect("lanes");
        assert_eq!(listed.len(), 3);
        for l in &listed {
            assert_eq!(s.lane_status(l.lane).expect("lane").as_ref(), Some(l));
        }
        let depths: Vec<(&str, u64)> = listed
            .iter()
            .map(|l| (l.key.recipient(), l.depth))
            .collect();
        assert_eq!(depths, [(A, 1), (B, 1), (C, 2)]);
        let unknown = StoreLaneId(listed.iter().map(|l| l.lane.0).max().unwrap_or(0) + 1_000);
        assert_eq!(s.lane_status(unknown).expect("unknown lane"), None);
    });
}

/// OL-14: every operator action on a lane moves its actor's control generation in its own
/// transaction, and a pass that saw generation `g` reads exactly the lanes changed since, as
/// they are now; other actors' actions do not move it. A read taken before a pausing action
/// is no longer fresh once the action has returned.
fn lane_actions_move_the_control_generation_and_list_the_lanes_changed(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let (a, bob) = (actor("alice"), actor("bob"));
        s.enqueue(&a, &[row("r0", &[A, B]), row("r1", &[A])])
            .expect("enqueue");
        s.enqueue(&bob, &[row("b0", &[A])]).expect("enqueue");
        let (la, lb, bob_a) = (lane_of(s, &a, A), lane_of(s, &a, B), lane_of(s, &bob, A));
        let t = acquire(s, &a, "h", LEASE);
        let g0 = t.control().generation;
        let read = s.lane_controls(&t, g0).expect("controls");
        assert_eq!((read.read.generation, read.changed.len()), (g0, 0));

        let changed = |seen: u64| {
            let c = s.lane_controls(&t, seen).expect("controls");
            let lanes: Vec<(StoreLaneId, bool, bool, bool)> = c
                .changed
                .iter()
                .map(|l| (l.state.lane, l.state.paused, l.state.strict, l.pending))
                .collect();
            (c.read.generation, lanes)
        };
        // A read taken before the pause is stale once the pause has returned: the pass
        // holding the slot starts nothing on it any more.
        let before = s.lane_controls(&t, g0).expect("controls").read;
        s.pause_lane(la, "maintenance").expect("pause");
        assert!(!before.fresh_at(std::time::Instant::now()));
        let (g1, lanes) = changed(g0);
        assert!(g1 > g0);
        assert_eq!(lanes, [(la, true, false, true)]);
        assert_eq!(changed(g1), (g1, vec![]));
        // Each action moves it again; the lanes changed since an older generation are all
        // listed, in lane order, as they are now.
        s.set_lane_strict(lb, true).expect("strict");
        let (g2, lanes) = changed(g1);
        assert!(g2 > g1);
        assert_eq!(lanes, [(lb, false, true, true)]);
        assert_eq!(
            changed(g0).1,
            [(la, true, false, true), (lb, false, true, true)]
        );
        s.purge_lane(lb, now()).expect("purge");
        let (g3, lanes) = changed(g2);
        assert!(g3 > g2);
        assert_eq!(lanes, [(lb, false, true, false)]);
        s.skip_lane_head(la, now()).expect("skip");
        let (g4, lanes) = changed(g3);
        assert!(g4 > g3);
        assert_eq!(lanes, [(la, true, false, true)]);
        let mut g = g4;
        for action in ["resume", "retry", "unstrict"] {
            match action {
                "resume" => s.resume_lane(la),
                "retry" => s.retry_lane_now(la),
                _ => s.set_lane_strict(lb, false),
            }
            .expect("action");
            let (next, lanes) = changed(g);
            assert!(next > g, "{action}");
            assert_eq!(lanes.len(), 1, "{action}");
            g = next;
        }
        assert_eq!(
            changed(g4).1,
            [(la, false, false, true), (lb, false, false, false)]
        );

        // Another actor's actions are its own: alice's generation stays.
        s.pause_lane(bob_a, "other").expect("pause bob");
        assert_eq!(changed(g), (g, vec![]));
        let tb = acquire(s, &bob, "h", LEASE);
        assert!(tb.control().generation > 0);
        assert!(
            s.lane_controls(&tb, 0)
                .expect("bob")
                .changed
                .iter()
                .all(|l| l.state.lane == bob_a)
        );
        // An unknown lane is an error and moves nothing.
        assert_eq!(
            s.pause_lane(StoreLaneId(987_654), "x"),
            Err(StoreError::NotFound { what: "lane" })
        );
        assert_eq!(changed(g), (g, vec![]));

        // The next holder starts from the generation its acquisition read.
        assert_eq!(s.release_slot(&t).expect("release"), SlotRelease::Released);
        assert_eq!(s.lane_controls(&t, g), Err(StoreError::StaleToken));
        let t2 = acquire(s, &a, "h2", LEASE);
        assert_eq!(t2.control().generation, g);
    });
}

/// OL-14, OL-18: a purged or skipped unit's dead letter keeps the attempts, status and error
/// persisted for it; an attempt that was in flight when the operator set it aside finishes
/// and is recorded on that dead letter, a failure with its count and status, a delivery as
/// one attempt more that says it was delivered (once, however often the ack is sent).
fn purge_and_skip_head_dead_letters_keep_every_attempt_made(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(
            &a,
            &(0..4)
                .map(|k| row(&format!("r{k}"), &[A]))
                .collect::<Vec<_>>(),
        )
        .expect("enqueue");
        let la = lane_of(s, &a, A);
        let t = acquire(s, &a, "h", LEASE);
        let u = unit_ids(&claim_lane(s, &t, la, 0, 10));
        let record = |unit: UnitId, attempts: u32, status: u16, ms: u64| {
            s.record_attempts(
                &t,
                &[AttemptRecord {
                    unit,
                    lane: la,
                    attempts,
                    status: Some(status),
                    error: Some(format!("HTTP {status}")),
                    at: Timestamp::from_millis(ms),
                }],
            )
            .expect("attempts");
        };
        let dead = |row: &str| {
            s.dead_letters(Some(&a))
                .expect("dead letters")
                .into_iter()
                .find(|d| d.row_id == row)
                .unwrap_or_else(|| panic!("no dead letter of {row}"))
        };
        record(u[0], 2, 503, 1_000);
        record(u[1], 1, 500, 2_000);

        // skip-head: the head's two attempts and its last status.
        s.skip_lane_head(la, now()).expect("skip");
        let d = dead("r0");
        assert_eq!(d.reason, DeadReason::Skipped);
        assert_eq!((d.attempts, d.last_status), (2, Some(503)));
        assert_eq!(d.last_error.as_deref(), Some("HTTP 503"));
        // The attempt that was in flight ends: a third failure, recorded on the dead letter.
        record(u[0], 3, 502, 3_000);
        let d = dead("r0");
        assert_eq!((d.attempts, d.last_status), (3, Some(502)));
        assert_eq!(d.last_attempt_at, Some(Timestamp::from_millis(3_000)));
        // A record sent again (a retried write) counts nothing more.
        record(u[0], 3, 502, 3_000);
        assert_eq!(dead("r0").attempts, 3);

        // purge: each unit with its own attempts (none made: 0).
        assert_eq!(s.purge_lane(la, now()).expect("purge"), 3);
        let (d1, d2) = (dead("r1"), dead("r2"));
        assert_eq!(
            (d1.reason, d1.attempts, d1.last_status),
            (DeadReason::Purged, 1, Some(500))
        );
        assert_eq!(
            (d2.attempts, d2.last_status, d2.last_error),
            (0, None, None)
        );
        // r2 was in flight and delivered: the dead letter says so, once.
        for _ in 0..2 {
            s.ack(&t, &[(u[2], la)]).expect("ack");
            let d = dead("r2");
            assert_eq!((d.attempts, d.last_status), (1, None));
            assert_eq!(d.last_error.as_deref(), Some(DELIVERED_AFTER_SET_ASIDE));
        }
        // A group commit holding it twice (an ack handed over again) records it once.
        s.ack(&t, &[(u[3], la), (u[3], la)]).expect("ack");
        let d = dead("r3");
        assert_eq!(
            (d.attempts, d.last_error.as_deref()),
            (1, Some(DELIVERED_AFTER_SET_ASIDE))
        );
        // Nothing else changed: r1 kept its record.
        assert_eq!(dead("r1").attempts, 1);
    });
}

#[test]
fn lane_state_precedence_and_names() {
    let now = Timestamp::from_millis(10_000);
    let later = Some(Timestamp::from_millis(20_000));
    let past = Some(Timestamp::from_millis(5_000));
    let blocked = format!("{STRICT_BLOCKED_REASON}: head failed");
    let cases = [
        (None, 0, false, None, LaneState::Open, "open"),
        (past, 0, false, None, LaneState::Open, "open"),
        (later, 0, false, None, LaneState::Throttled, "throttled"),
        (later, 3, false, None, LaneState::Backoff(3), "backoff 3"),
        // A backoff whose probe is due is still a backoff until the probe answers.
        (past, 1, false, None, LaneState::Backoff(1), "backoff 1"),
        // A pause wins over a backoff; the reason tells a strict block from it.
        (
            later,
            2,
            true,
            Some("maintenance"),
            LaneState::Paused,
            "paused",
        ),
        (
            None,
            0,
            true,
            Some(blocked.as_str()),
            LaneState::StrictBlocked,
            "strict blocked",
        ),
    ];
    for (nb, level, paused, reason, want, text) in cases {
        let got = LaneState::of(nb, level, paused, reason, now);
        assert_eq!(got, want, "{nb:?} {level} {paused} {reason:?}");
        assert_eq!(got.to_string(), text);
    }
    assert_eq!(LaneState::StrictBlocked.name(), "strict_blocked");
}

/// `DeadLetterSelection::Matching`: the database selects dead letters by dead-letter time
/// (`since` inclusive, `until` exclusive), recipient (in any spelling, any ordering key),
/// reason and actor, combined; listing, replay and purge take the same selection.
fn dead_letters_matching_a_time_range_recipient_and_reason(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let (alice, bob) = (actor("alice"), actor("bob"));
        s.enqueue(
            &alice,
            &[
                row("r0", &[A]),
                row("r1", &[A]),
                row("r2", &[B]),
                row("r3", &[A]),
            ],
        )
        .expect("enqueue");
        s.enqueue(&bob, &[row("b0", &[A]), row("b1", &[C])])
            .expect("enqueue");
        // Each (actor, row, lane) dead at a known time, for a reason.
        let mut unit_of = std::collections::HashMap::new();
        for (a, dead) in [
            (
                &alice,
                &[
                    ("r0", A, 1_000, DeadReason::Permanent),
                    ("r1", A, 2_000, DeadReason::Permanent),
                    ("r2", B, 2_000, DeadReason::Exhausted),
                    ("r3", A, 3_000, DeadReason::Gone),
                ][..],
            ),
            (
                &bob,
                &[
                    ("b0", A, 2_500, DeadReason::Permanent),
                    ("b1", C, 2_999, DeadReason::Permanent),
                ][..],
            ),
        ] {
            let t = acquire(s, a, "h", LEASE);
            for &(id, to, at, reason) in dead {
                let lane = lane_of(s, a, to);
                let c = claim_lane(s, &t, lane, 0, 10);
                let unit = c.units.iter().find(|u| u.row_id == id).expect("claimed").id;
                unit_of.insert(id, unit);
                let req = DeadLetterRequest {
                    unit,
                    lane,
                    reason,
                    status: Some(422),
                    error: None,
                    at: Timestamp::from_millis(at),
                };
                assert!(s.dead_letter(&t, &req).expect("dead letter").is_some());
            }
            s.free_slot(&t).expect("free");
        }
        let ms = |t| Some(Timestamp::from_millis(t));
        let url = |u: &str| Some(outbox_lanes_core::policy::Recipient::parse(u).expect("url"));
        let rows_of = |f: DeadLetterFilter| -> Vec<String> {
            let which = DeadLetterSelection::Matching(f);
            s.select_dead_letters(&which)
                .expect("select")
                .into_iter()
                .map(|d| d.row_id)
                .collect()
        };
        let f = DeadLetterFilter::default;

        // No criterion: every dead letter, as `dead_letters` lists them.
        assert_eq!(rows_of(f()), ["r0", "r1", "r2", "r3", "b0", "b1"]);
        assert_eq!(
            s.select_dead_letters(&DeadLetterSelection::Matching(f())),
            s.dead_letters(None)
        );
        // The range is half-open: `since` is in it, `until` is not.
        let since = |t| DeadLetterFilter {
            since: ms(t),
            ..f()
        };
        let until = |t| DeadLetterFilter {
            until: ms(t),
            ..f()
        };
        assert_eq!(rows_of(since(2_000)), ["r1", "r2", "r3", "b0", "b1"]);
        assert_eq!(rows_of(since(2_001)), ["r3", "b0", "b1"]);
        assert_eq!(rows_of(until(2_000)), ["r0"]);
        assert_eq!(rows_of(until(2_001)), ["r0", "r1", "r2"]);
        let range = |from, to| DeadLetterFilter {
            since: ms(from),
            until: ms(to),
            ..f()
        };
        assert_eq!(rows_of(range(2_000, 3_000)), ["r1", "r2", "b0", "b1"]);
        assert_eq!(rows_of(range(3_000, 3_001)), ["r3"]);
        assert!(rows_of(range(2_000, 2_000)).is_empty());
        assert!(rows_of(range(3_000, 1_000)).is_empty());
        // With a recipient (in another spelling), a reason, an actor.
        let to_a = |from| DeadLetterFilter {
            since: ms(from),
            recipient: url("HTTPS://A.example:443/inbox"),
            ..f()
        };
        assert_eq!(rows_of(to_a(2_000)), ["r1", "r3", "b0"]);
        assert_eq!(
            rows_of(DeadLetterFilter {
                until: ms(3_000),
                ..to_a(2_000)
            }),
            ["r1", "b0"]
        );
        assert_eq!(
            rows_of(DeadLetterFilter {
                actor: Some(alice.clone()),
                ..to_a(2_000)
            }),
            ["r1", "r3"]
        );
        assert_eq!(
            rows_of(DeadLetterFilter {
                reason: Some(DeadReason::Permanent),
                ..range(2_000, 3_000)
            }),
            ["r1", "b0", "b1"]
        );
        assert_eq!(
            rows_of(DeadLetterFilter {
                actor: Some(bob.clone()),
                ..range(1_000, 2_999)
            }),
            ["b0"]
        );
        assert!(
            rows_of(DeadLetterFilter {
                recipient: url("https://nobody.example/inbox"),
                ..f()
            })
            .is_empty()
        );

        // Replay and purge act on what the same selection lists.
        let replayed = s
            .replay_dead_letters(&DeadLetterSelection::Matching(DeadLetterFilter {
                until: ms(3_000),
                ..to_a(2_000)
            }))
            .expect("replay");
        assert_eq!(replayed, [unit_of["r1"], unit_of["b0"]]);
        assert_eq!(rows_of(f()), ["r0", "r2", "r3", "b1"]);
        let t = acquire(s, &alice, "h", LEASE);
        let la = lane_of(s, &alice, A);
        assert_eq!(row_ids(&claim_lane(s, &t, la, 0, 10)), ["r1"]);
        assert_eq!(
            s.purge_dead_letters(&DeadLetterSelection::Matching(until(2_000))),
            Ok(1)
        );
        assert_eq!(rows_of(f()), ["r2", "r3", "b1"]);
        assert_eq!(
            s.purge_dead_letters(&DeadLetterSelection::Matching(since(2_999))),
            Ok(2)
        );
        assert_eq!(rows_of(f()), ["r2"]);
    });
}
