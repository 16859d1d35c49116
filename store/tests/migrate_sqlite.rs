//! Opening a schema version 1 SQLite database migrates it to version 2 and on to 3 (SCHEMA.md,
//! "Migrations"): the same units in the same lane order with their attempts and states, their
//! payloads, dead letters that replay, and unit ids that never come back. A version 2
//! database (built with the version 2 DDL and plain-SQL enqueue) migrates to 3 the same way;
//! versions 3, 4 and 6 each migrate with what their next version adds.
//!
//! The version 1 database is built with the version 1 DDL and the version 1 plain-SQL enqueue
//! (the statements SCHEMA.md documented for version 1), on a real file.
#![allow(missing_docs, clippy::std_instead_of_core)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use outbox_lanes_core::{ActorId, Seq, Timestamp, UnitId};
use outbox_lanes_store::sqlite::{SCHEMA_V1, SCHEMA_V2, rusqlite};
use outbox_lanes_store::*;
use rusqlite::{Connection, OptionalExtension, params};

const A: &str = "https://a.example/inbox";
const B: &str = "https://b.example/inbox";
const C: &str = "https://c.example/inbox";
const ALICE: &str = "alice";
/// The version 1 unit id sequence is pushed to here, as if units up to it had been enqueued
/// and deleted: no id up to it may be handed out again.
const ISSUED: i64 = 9_000;

/// A fresh version 1 database at `path`.
fn v1_database(path: &Path) -> Connection {
    let c = Connection::open(path).expect("open v1");
    c.execute_batch(SCHEMA_V1).expect("v1 DDL");
    c.execute_batch(
        "CREATE TABLE ol_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); \
         INSERT INTO ol_meta (key, value) VALUES ('schema_version', '1');",
    )
    .expect("v1 meta");
    c
}

/// The version 1 plain-SQL enqueue of one row: its `ol_rows` row, then one unit per recipient
/// (or one unit with every lane when `joined`), each with its deliveries. Returns the units.
fn v1_enqueue(c: &Connection, row_id: &str, to: &[&str], joined: bool) -> Vec<i64> {
    let seq: i64 = c
        .query_row(
            "INSERT INTO ol_actors AS a (actor, last_seq) VALUES (?1, 1) \
             ON CONFLICT (actor) DO UPDATE SET last_seq = a.last_seq + excluded.last_seq RETURNING last_seq",
            [ALICE],
            |r| r.get(0),
        )
        .expect("seq");
    let row_ref: i64 = c
        .query_row(
            "INSERT INTO ol_rows (actor, row_id, seq, content_type, body, body_len, dedup_key, ordering_key, \
             enqueued_at) VALUES (?1, ?2, ?3, 'text/plain', ?4, ?5, NULL, '', ?6) RETURNING id",
            params![
                ALICE,
                row_id,
                seq,
                body_of(row_id),
                body_of(row_id).len() as i64,
                1_000 + seq
            ],
            |r| r.get(0),
        )
        .expect("row");
    let lanes: Vec<i64> = to.iter().map(|url| v1_lane(c, url)).collect();
    let groups: Vec<Vec<i64>> = if joined {
        vec![lanes]
    } else {
        lanes.into_iter().map(|l| vec![l]).collect()
    };
    let mut units = Vec::new();
    for g in groups {
        let unit: i64 = c
            .query_row(
                "INSERT INTO ol_units (actor, row_ref, seq, lanes, pending) VALUES (?1, ?2, ?3, ?4, ?4) RETURNING id",
                params![ALICE, row_ref, seq, g.len() as i64],
                |r| r.get(0),
            )
            .expect("unit");
        for lane in g {
            c.execute(
                "INSERT INTO ol_deliveries (unit_id, lane_id, seq) VALUES (?1, ?2, ?3)",
                params![unit, lane, seq],
            )
            .expect("delivery");
            c.execute(
                "UPDATE ol_lanes SET tail_seq = max(tail_seq, ?2) WHERE id = ?1",
                params![lane, seq],
            )
            .expect("tail");
        }
        units.push(unit);
    }
    units
}

fn v1_lane(c: &Connection, url: &str) -> i64 {
    c.execute(
        "INSERT INTO ol_lanes (actor, recipient, ordering_key) VALUES (?1, ?2, '') \
         ON CONFLICT (actor, recipient, ordering_key) DO NOTHING",
        [ALICE, url],
    )
    .expect("lane");
    c.query_row(
        "SELECT id FROM ol_lanes WHERE actor = ?1 AND recipient = ?2 AND ordering_key = ''",
        [ALICE, url],
        |r| r.get(0),
    )
    .expect("lane id")
}

fn body_of(row_id: &str) -> Vec<u8> {
    format!("body of {row_id}").into_bytes()
}

/// Version 1's dead-lettering of one delivery (what its store did): the dead letter refers
/// to the row; the delivery is marked dead; the unit counts down and goes when it reaches 0.
fn v1_dead_letter(c: &Connection, unit: i64, lane: i64, attempts: i64) {
    c.execute(
        "INSERT INTO ol_dead_letters (unit_id, row_ref, row_id, actor, lane_id, recipient, ordering_key, reason, \
         last_status, last_error, attempts, first_attempt_at, last_attempt_at, seq, dead_at) \
         SELECT u.id, u.row_ref, r.row_id, u.actor, l.id, l.recipient, l.ordering_key, 'permanent', 404, \
         'not found', ?3, 10, 20, d.seq, 30 \
         FROM ol_units u JOIN ol_rows r ON r.id = u.row_ref JOIN ol_deliveries d ON d.unit_id = u.id \
         JOIN ol_lanes l ON l.id = d.lane_id WHERE u.id = ?1 AND d.lane_id = ?2",
        params![unit, lane, attempts],
    )
    .expect("dead letter");
    c.execute(
        "UPDATE ol_deliveries SET state = 2, attempts = ?3 WHERE unit_id = ?1 AND lane_id = ?2",
        params![unit, lane, attempts],
    )
    .expect("dead");
    let pending: i64 = c
        .query_row(
            "UPDATE ol_units SET pending = pending - 1 WHERE id = ?1 RETURNING pending",
            [unit],
            |r| r.get(0),
        )
        .expect("count down");
    if pending == 0 {
        c.execute("DELETE FROM ol_deliveries WHERE unit_id = ?1", [unit])
            .expect("deliveries");
        c.execute("DELETE FROM ol_units WHERE id = ?1", [unit])
            .expect("unit");
    }
}

/// What a lane holds, read the way version 1's claim read it: (unit, seq, attempts, state)
/// in claim order.
type V1Lane = Vec<(i64, i64, i64, i64)>;

fn v1_lanes(c: &Connection, lanes: &[i64]) -> BTreeMap<i64, V1Lane> {
    let mut st = c
        .prepare(
            "SELECT unit_id, seq, attempts, state FROM ol_deliveries WHERE lane_id = ?1 \
             ORDER BY seq, unit_id",
        )
        .expect("prepare");
    lanes
        .iter()
        .map(|&l| {
            let rows = st
                .query_map([l], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                .expect("query")
                .collect::<Result<_, _>>()
                .expect("rows");
            (l, rows)
        })
        .collect()
}

fn schema_version(path: &Path) -> String {
    Connection::open(path)
        .expect("raw")
        .query_row(
            "SELECT value FROM ol_meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .expect("version")
}

fn table_exists(path: &Path, name: &str) -> bool {
    Connection::open(path)
        .expect("raw")
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [name],
            |r| r.get::<_, i64>(0),
        )
        .optional()
        .expect("sqlite_master")
        .is_some()
}

fn count(path: &Path, sql: &str) -> i64 {
    Connection::open(path)
        .expect("raw")
        .query_row(sql, [], |r| r.get(0))
        .expect("count")
}

fn claim_all(store: &dyn Store, t: &SlotToken, lane: i64) -> ClaimedLane {
    claim_lane(store, t, StoreLaneId(lane), 0, 100)
}

/// The scenario's version 1 units, by name.
struct V1 {
    lanes: [i64; 3],
    /// One lane (A), two attempts recorded.
    single: i64,
    /// Joined over A and B; B served.
    joined_served: i64,
    /// One lane (C), dead-lettered: the unit is gone, its row stays for the dead letter.
    dead: i64,
    /// One row to A and C (not joined): two units sharing one `ol_rows` row.
    fanned: [i64; 2],
    /// One lane (A), finished and kept by the ack retention (no deliveries left).
    retained: i64,
    /// Joined over B and C; C dead-lettered, B still pending.
    joined_dead: i64,
    /// One lane (B), enqueued after units up to 5000 were issued (and deleted).
    late: i64,
}

fn build_v1(c: &Connection) -> V1 {
    let single = v1_enqueue(c, "single", &[A], false)[0];
    let lanes = [v1_lane(c, A), v1_lane(c, B), v1_lane(c, C)];
    let [_, lb, lc] = lanes;
    c.execute(
        "UPDATE ol_deliveries SET attempts = 2, last_status = 503, last_error = 'busy', \
         first_attempt_at = 100, last_attempt_at = 200 WHERE unit_id = ?1",
        [single],
    )
    .expect("attempts");
    let joined_served = v1_enqueue(c, "joined-served", &[A, B], true)[0];
    c.execute(
        "UPDATE ol_deliveries SET state = 1, attempts = 1 WHERE unit_id = ?1 AND lane_id = ?2",
        params![joined_served, lb],
    )
    .expect("served");
    c.execute(
        "UPDATE ol_units SET pending = pending - 1 WHERE id = ?1",
        [joined_served],
    )
    .expect("count down");
    let dead = v1_enqueue(c, "dead", &[C], false)[0];
    v1_dead_letter(c, dead, lc, 5);
    let fanned = v1_enqueue(c, "fanned", &[A, C], false);
    let retained = v1_enqueue(c, "retained", &[A], false)[0];
    c.execute("DELETE FROM ol_deliveries WHERE unit_id = ?1", [retained])
        .expect("ack");
    c.execute(
        "UPDATE ol_units SET pending = 0, acked_at = 500 WHERE id = ?1",
        [retained],
    )
    .expect("retain");
    let joined_dead = v1_enqueue(c, "joined-dead", &[B, C], true)[0];
    v1_dead_letter(c, joined_dead, lc, 3);
    c.execute(
        "UPDATE sqlite_sequence SET seq = 5000 WHERE name = 'ol_units'",
        [],
    )
    .expect("issued");
    let late = v1_enqueue(c, "late", &[B], false)[0];
    assert_eq!(late, 5001, "AUTOINCREMENT continues after the issued ids");
    c.execute(
        "UPDATE sqlite_sequence SET seq = ?1 WHERE name = 'ol_units'",
        [ISSUED],
    )
    .expect("issued");
    V1 {
        lanes,
        single,
        joined_served,
        dead,
        fanned: [fanned[0], fanned[1]],
        retained,
        joined_dead,
        late,
    }
}

#[test]
fn v1_database_migrates_to_v2_and_keeps_every_unit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v1.db");
    let (v1, expected) = {
        let mut c = v1_database(&path);
        let tx = c.transaction().expect("tx");
        let v1 = build_v1(&tx);
        let expected = v1_lanes(&tx, &v1.lanes);
        tx.commit().expect("commit");
        (v1, expected)
    };
    let [la, lb, lc] = v1.lanes;
    // The scenario really is what it claims to be, on the version 1 side.
    assert_eq!(
        expected[&la].iter().map(|x| x.0).collect::<Vec<_>>(),
        [v1.single, v1.joined_served, v1.fanned[0]]
    );
    assert_eq!(
        expected[&lb].iter().map(|x| x.0).collect::<Vec<_>>(),
        [v1.joined_served, v1.joined_dead, v1.late]
    );
    assert_eq!(
        expected[&lc].iter().map(|x| x.0).collect::<Vec<_>>(),
        [v1.fanned[1], v1.joined_dead]
    );

    let store = SqliteStore::open(&path, SqliteOptions::default()).expect("open migrates");
    assert_eq!(schema_version(&path), SCHEMA_VERSION.to_string());
    assert!(!table_exists(&path, "ol_deliveries"));
    assert!(!table_exists(&path, "ol_units_v1"));
    // One row per (unit, lane): heads for the 7 units left (the dead one is gone), plus one
    // row each for the second lanes of the two joined units.
    assert_eq!(count(&path, "SELECT count(*) FROM ol_units"), 9);
    assert_eq!(
        count(&path, "SELECT count(*) FROM ol_units WHERE unit_id IS NULL"),
        7
    );
    // A joined unit's head is its lowest lane.
    assert_eq!(
        count(
            &path,
            &format!("SELECT lane_id FROM ol_units WHERE id = {}", v1.joined_dead)
        ),
        lb
    );
    // The other lanes' rows got ids after every id version 1 ever issued.
    assert!(
        count(
            &path,
            "SELECT min(id) FROM ol_units WHERE unit_id IS NOT NULL"
        ) > ISSUED
    );

    let s: &dyn Store = &store;
    let a = actor(ALICE);
    let t = acquire(s, &a, "h", LEASE);
    let (with_work, _) = s.lanes_with_work(&t, 0).expect("lanes");
    assert_eq!(
        with_work.iter().map(|l| l.lane.0).collect::<Vec<_>>(),
        [la, lb, lc]
    );
    // Every lane: the same units, in the same order, at the same seqs, with their attempts
    // and served flags.
    for (&lane, v1_rows) in &expected {
        let got = claim_all(s, &t, lane);
        assert!(got.exhausted);
        let got: Vec<(i64, i64, i64, bool)> = got
            .units
            .iter()
            .map(|u| {
                let slot = u
                    .slots
                    .iter()
                    .find(|sl| sl.lane.0 == lane)
                    .expect("the claimed lane is one of the unit's slots");
                (
                    u.id.0 as i64,
                    u.seq.0 as i64,
                    i64::from(slot.attempts),
                    slot.served,
                )
            })
            .collect();
        let want: Vec<(i64, i64, i64, bool)> = v1_rows
            .iter()
            .map(|&(unit, seq, attempts, state)| (unit, seq, attempts, state != 0))
            .collect();
        assert_eq!(got, want, "lane {lane}");
    }
    // Joined units still list every lane, with each lane's own state.
    let b = claim_all(s, &t, lb);
    let joined = &b.units[0];
    assert_eq!(joined.id, UnitId(v1.joined_served as u64));
    assert_eq!(
        joined
            .slots
            .iter()
            .map(|sl| (sl.lane.0, sl.served))
            .collect::<Vec<_>>(),
        [(la, false), (lb, true)]
    );
    assert_eq!(joined.row_id, "joined-served");
    assert_eq!(joined.bytes as usize, body_of("joined-served").len());
    assert_eq!(joined.enqueued_at, Timestamp::from_millis(1_000 + 2));
    let single = &claim_all(s, &t, la).units[0];
    assert_eq!(single.slots.len(), 1);
    assert_eq!(
        (single.slots[0].attempts, single.slots[0].served),
        (2, false)
    );

    // Payloads, from the shared rows version 1 kept them in.
    for (unit, row_id) in [
        (v1.single, "single"),
        (v1.joined_served, "joined-served"),
        (v1.fanned[0], "fanned"),
        (v1.fanned[1], "fanned"),
        (v1.joined_dead, "joined-dead"),
        (v1.late, "late"),
    ] {
        let p = s.payload(UnitId(unit as u64)).expect("payload");
        assert_eq!(
            (p.row_id.as_str(), p.content_type.as_str(), p.body),
            (row_id, "text/plain", body_of(row_id))
        );
    }
    // The retained unit is finished: no payload, not pending, purged by purge_acked.
    assert!(matches!(
        s.payload(UnitId(v1.retained as u64)),
        Err(StoreError::NotFound { .. })
    ));
    let status = s.status().expect("status");
    assert_eq!(status.len(), 1);
    assert_eq!((status[0].pending, status[0].dead_letters), (6, 2));
    let lanes = s.lanes(&a).expect("lanes");
    assert_eq!(
        lanes.iter().map(|l| l.depth).collect::<Vec<_>>(),
        [3, 2, 1],
        "pending deliveries per lane (B's served one and C's dead one do not count)"
    );
    assert_eq!(
        lanes[0].head_enqueued_at,
        Some(Timestamp::from_millis(1_000 + 1))
    );

    // Dead letters carried over as they were, and replay: the joined unit's dead lane rejoins
    // it in place (its seq in C unchanged); the finished unit comes back under its own id at
    // the tail of C.
    let dead = s.dead_letters(Some(&a)).expect("dead letters");
    assert_eq!(
        dead.iter()
            .map(|d| (d.unit.0 as i64, d.row_id.as_str(), d.attempts))
            .collect::<Vec<_>>(),
        [(v1.dead, "dead", 5), (v1.joined_dead, "joined-dead", 3)]
    );
    let replayed = s
        .replay_dead_letters(&DeadLetterSelection::Actor(a.clone()))
        .expect("replay");
    assert_eq!(
        replayed,
        [UnitId(v1.dead as u64), UnitId(v1.joined_dead as u64)]
    );
    assert!(s.dead_letters(Some(&a)).expect("dead letters").is_empty());
    let c_lane = claim_all(s, &t, lc);
    let joined_dead_seq = expected[&lc][1].1;
    assert_eq!(
        c_lane
            .units
            .iter()
            .map(|u| (u.id.0 as i64, u.slots.iter().any(|sl| sl.served)))
            .collect::<Vec<_>>(),
        [
            (v1.fanned[1], false),
            (v1.joined_dead, false),
            (v1.dead, false)
        ]
    );
    assert_eq!(c_lane.units[1].seq, Seq(joined_dead_seq as u64));
    assert!(c_lane.units[2].seq.0 as i64 > joined_dead_seq);
    assert_eq!(
        s.payload(UnitId(v1.dead as u64)).expect("replayed").body,
        body_of("dead")
    );

    // Acks finish everything; the payloads go with the units.
    for lane in [la, lb, lc] {
        let got = claim_all(s, &t, lane);
        let acks: Vec<_> = got
            .units
            .iter()
            .filter(|u| u.slots.iter().any(|sl| sl.lane.0 == lane && !sl.served))
            .map(|u| (u.id, StoreLaneId(lane)))
            .collect();
        s.ack(&t, &acks).expect("ack");
    }
    for lane in [la, lb, lc] {
        assert!(claim_all(s, &t, lane).units.is_empty(), "lane {lane}");
    }
    assert_eq!(
        s.purge_acked(Timestamp::from_millis(501)).expect("purge"),
        1
    );
    assert!(s.status().expect("status").iter().all(|st| st.pending == 0));
    assert_eq!(count(&path, "SELECT count(*) FROM ol_units"), 0);
    assert_eq!(count(&path, "SELECT count(*) FROM ol_rows"), 0);

    // A new unit's id is above every id version 1 handed out, and above the migrated rows'.
    let fresh = s
        .enqueue(&a, &[row("fresh", &[A])])
        .expect("enqueue after migration");
    assert!(fresh[0].units[0].0 as i64 > ISSUED + 2);
    assert_eq!(
        claim_all(s, &t, la)
            .units
            .iter()
            .map(|u| u.row_id.as_str())
            .collect::<Vec<_>>(),
        ["fresh"]
    );
    assert_eq!(s.release_slot(&t).expect("release"), SlotRelease::Released);
    drop(store);

    // Opening again is a no-op: already the current version, nothing moved.
    let again = SqliteStore::open(&path, SqliteOptions::default()).expect("reopen");
    assert_eq!(schema_version(&path), SCHEMA_VERSION.to_string());
    let t = acquire(&again, &a, "h2", LEASE);
    assert_eq!(row_ids(&claim_all(&again, &t, la)), ["fresh"]);
}

#[test]
fn empty_v1_database_migrates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("empty.db");
    drop(v1_database(&path));
    let store = SqliteStore::open(&path, SqliteOptions::default()).expect("open");
    assert_eq!(schema_version(&path), SCHEMA_VERSION.to_string());
    let a = actor(ALICE);
    let out = store
        .enqueue(&a, &[row("r0", &[A]), row("r1", &[A, B])])
        .expect("enqueue");
    assert_eq!(
        out.iter().map(|e| e.units.len()).collect::<Vec<_>>(),
        [1, 2]
    );
    let t = acquire(&store, &a, "h", LEASE);
    assert_eq!(
        row_ids(&claim_lane(&store, &t, lane_of(&store, &a, A), 0, 10)),
        ["r0", "r1"]
    );
}

#[test]
fn failed_migration_leaves_the_v1_database_as_it_was() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v1.db");
    let v1 = {
        let c = v1_database(&path);
        let v1 = build_v1(&c);
        // A table squatting the name the migration renames the old units to: the migration
        // fails half-way, after it already dropped the old indexes.
        c.execute_batch("CREATE TABLE ol_units_v1 (x INTEGER)")
            .expect("squatter");
        v1
    };
    let before = count(&path, "SELECT count(*) FROM ol_deliveries");
    assert!(SqliteStore::open(&path, SqliteOptions::default()).is_err());
    assert_eq!(schema_version(&path), "1");
    assert!(table_exists(&path, "ol_deliveries"));
    assert_eq!(count(&path, "SELECT count(*) FROM ol_deliveries"), before);
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name IN ('ol_units_row', 'ol_units_acked')"
        ),
        2,
        "the dropped indexes came back with the rollback"
    );
    // Without the squatter it migrates, and the units are all there.
    Connection::open(&path)
        .expect("raw")
        .execute_batch("DROP TABLE ol_units_v1")
        .expect("drop squatter");
    let store = SqliteStore::open(&path, SqliteOptions::default()).expect("open");
    assert_eq!(schema_version(&path), SCHEMA_VERSION.to_string());
    let t = acquire(&store, &actor(ALICE), "h", LEASE);
    assert_eq!(
        unit_ids(&claim_all(&store, &t, v1.lanes[0])),
        [v1.single, v1.joined_served, v1.fanned[0]].map(|u| UnitId(u as u64))
    );
}

// ----- Version 2 layout: a row id is unique per actor across inline heads and `ol_rows` -----
//
// (Not migration proper, but what the migrated layout must keep: SCHEMA.md, "A row id is
// unique per actor across both places".)

fn dup_err(s: &dyn Store, a: &ActorId, r: NewRow) -> EnqueueError {
    s.enqueue(a, &[row("fresh-in-batch", &[C]), r])
        .expect_err("duplicate refused")
}

fn row_ids_unique_across_both_places(b: Backend) {
    // Without the dedup window (the contract suite tests it): an id is free once its row is.
    let common = CommonOptions {
        row_id_retention: core::time::Duration::ZERO,
        ..CommonOptions::default()
    };
    run(b, common, |h| {
        let s = &*h.store;
        let a = actor(ALICE);
        // A fan-out row keeps its payload in `ol_rows`; the same id as a one-recipient row
        // (inline on its head) is refused, and the batch writes nothing.
        s.enqueue(&a, &[row("fan", &[A, B])]).expect("fan-out");
        assert_eq!(
            dup_err(s, &a, row("fan", &[A])),
            EnqueueError::DuplicateRowId { row: "fan".into() }
        );
        // An inline row's id is refused for a fan-out row, and for a joined one.
        s.enqueue(&a, &[row("one", &[A])]).expect("one recipient");
        assert_eq!(
            dup_err(s, &a, row("one", &[A, B])),
            EnqueueError::DuplicateRowId { row: "one".into() }
        );
        assert_eq!(
            dup_err(
                s,
                &a,
                NewRow {
                    joined: true,
                    ..row("one", &[A, B])
                }
            ),
            EnqueueError::DuplicateRowId { row: "one".into() }
        );
        assert!(s.find_lane(&a, &key(C)).expect("find").is_none());
        assert_eq!(s.status().expect("status")[0].pending, 3);

        // A dead-lettered inline unit's payload moves to `ol_rows`: its id stays taken until
        // the dead letter is purged, and the payload replays from there.
        s.enqueue(&a, &[row("dl", &[B])]).expect("enqueue");
        let t = acquire(s, &a, "h", LEASE);
        let lb = lane_of(s, &a, B);
        let dl = claim_lane(s, &t, lb, 0, 10)
            .units
            .into_iter()
            .find(|u| u.row_id == "dl")
            .expect("claimed");
        s.dead_letter(
            &t,
            &DeadLetterRequest {
                unit: dl.id,
                lane: lb,
                reason: outbox_lanes_core::DeadReason::Permanent,
                status: Some(404),
                error: None,
                at: now(),
            },
        )
        .expect("dead letter");
        assert!(matches!(s.payload(dl.id), Err(StoreError::NotFound { .. })));
        assert_eq!(
            dup_err(s, &a, row("dl", &[A])),
            EnqueueError::DuplicateRowId { row: "dl".into() }
        );
        let dead = s.dead_letters(Some(&a)).expect("dead letters");
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].row_id, "dl");
        assert_eq!(
            s.replay_dead_letters(&DeadLetterSelection::Ids(vec![dead[0].id]))
                .expect("replay"),
            [dl.id]
        );
        assert_eq!(
            s.payload(dl.id).expect("replayed").body,
            row("dl", &[B]).body
        );
        s.ack(&t, &[(dl.id, lb)]).expect("ack");
        // Finished: the id is free again.
        s.enqueue(&a, &[row("dl", &[A])]).expect("id free again");

        // A row whose every recipient is skipped (dedup) stores nothing, but its id must still
        // be new.
        let keyed = |id: &str| NewRow {
            dedup_key: Some("k".into()),
            ..row(id, &[C])
        };
        s.enqueue(&a, &[keyed("k1")]).expect("keyed");
        let skipped = s.enqueue(&a, &[keyed("k2")]).expect("skipped");
        assert!(skipped[0].units.is_empty());
        assert_eq!(
            s.enqueue(&a, &[keyed("fan")]).expect_err("taken"),
            EnqueueError::DuplicateRowId { row: "fan".into() }
        );
        assert_eq!(
            s.enqueue(&a, &[keyed("k1")]).expect_err("taken"),
            EnqueueError::DuplicateRowId { row: "k1".into() }
        );
        // k2 was not stored: its id is free.
        s.enqueue(&a, &[row("k2", &[A])]).expect("k2 free");
    });
}

#[test]
fn sqlite_file_row_ids_unique_across_both_places() {
    row_ids_unique_across_both_places(Backend::SqliteFile);
}

#[test]
fn sqlite_memory_row_ids_unique_across_both_places() {
    row_ids_unique_across_both_places(Backend::SqliteMemory);
}

/// A fresh version 2 database at `path`.
fn v2_database(path: &Path) -> Connection {
    let c = Connection::open(path).expect("open v2");
    c.execute_batch(SCHEMA_V2).expect("v2 DDL");
    c.execute_batch(
        "CREATE TABLE ol_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); \
         INSERT INTO ol_meta (key, value) VALUES ('schema_version', '2');",
    )
    .expect("v2 meta");
    c
}

/// Version 2's plain-SQL enqueue of one row (SCHEMA.md of version 2, steps 1-5): one
/// recipient inline (4a), several in `ol_rows` (4c). It names its columns, as a service
/// written against version 2 does, so it also runs against version 3.
fn v2_enqueue(c: &Connection, row_id: &str, to: &[&str]) {
    let seq: i64 = c
        .query_row(
            "INSERT INTO ol_actors AS a (actor, last_seq) VALUES (?1, 1) \
             ON CONFLICT (actor) DO UPDATE SET last_seq = a.last_seq + excluded.last_seq RETURNING last_seq",
            [ALICE],
            |r| r.get(0),
        )
        .expect("seq");
    let lanes: Vec<i64> = to.iter().map(|u| v1_lane(c, u)).collect();
    let body = body_of(row_id);
    let len = body.len() as i64;
    if let [lane] = lanes[..] {
        c.execute(
            "INSERT INTO ol_units (actor, lane_id, seq, row_id, content_type, body, body_len, dedup_key, \
             ordering_key, enqueued_at) VALUES (?1, ?2, ?3, ?4, 'text/plain', ?5, ?6, NULL, '', 1)",
            params![ALICE, lane, seq, row_id, body, len],
        )
        .expect("inline unit");
    } else {
        let row_ref: i64 = c
            .query_row(
                "INSERT INTO ol_rows (actor, row_id, seq, content_type, body, body_len, dedup_key, \
                 ordering_key, enqueued_at) VALUES (?1, ?2, ?3, 'text/plain', ?4, ?5, NULL, '', 1) RETURNING id",
                params![ALICE, row_id, seq, body, len],
                |r| r.get(0),
            )
            .expect("shared row");
        for &lane in &lanes {
            c.execute(
                "INSERT INTO ol_units (actor, lane_id, seq, row_ref) VALUES (?1, ?2, ?3, ?4)",
                params![ALICE, lane, seq, row_ref],
            )
            .expect("unit");
        }
    }
    for &lane in &lanes {
        c.execute(
            "UPDATE ol_lanes SET tail_seq = max(tail_seq, ?2) WHERE id = ?1",
            params![lane, seq],
        )
        .expect("tail");
    }
}

#[test]
fn v2_database_migrates_to_v4_and_keeps_every_unit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v2.db");
    let c = v2_database(&path);
    for (id, to) in [
        ("r0", &[A][..]),
        ("fan", &[A, B][..]),
        ("r1", &[A][..]),
        ("r2", &[B][..]),
    ] {
        v2_enqueue(&c, id, to);
    }
    drop(c);

    let store = SqliteStore::open(&path, SqliteOptions::default()).expect("open");
    assert_eq!(schema_version(&path), SCHEMA_VERSION.to_string());
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM ol_units WHERE headers IS NOT NULL"
        ),
        0
    );
    let a = actor(ALICE);
    let t = acquire(&store, &a, "h", LEASE);
    let (la, lb) = (lane_of(&store, &a, A).0, lane_of(&store, &a, B).0);
    let ca = claim_all(&store, &t, la);
    assert_eq!(row_ids(&ca), ["r0", "fan", "r1"]);
    assert_eq!(row_ids(&claim_all(&store, &t, lb)), ["fan", "r2"]);
    for u in &ca.units {
        let p = store.payload(u.id).expect("payload");
        assert_eq!(p.body, body_of(&u.row_id));
        assert_eq!(p.content_type, "text/plain");
        assert!(p.headers.is_empty());
    }

    // New rows carry headers; a version 2 plain-SQL writer still works, and its rows
    // queue behind, without headers.
    let h = vec![("X-New".to_owned(), "1".to_owned())];
    let out = store
        .enqueue(
            &a,
            &[NewRow {
                headers: h.clone(),
                ..row("new", &[A])
            }],
        )
        .expect("enqueue");
    assert_eq!(store.payload(out[0].units[0]).expect("payload").headers, h);
    v2_enqueue(&Connection::open(&path).expect("raw"), "late", &[A]);
    let ca = claim_all(&store, &t, la);
    assert_eq!(row_ids(&ca), ["r0", "fan", "r1", "new", "late"]);
    assert!(
        store
            .payload(ca.units[4].id)
            .expect("payload")
            .headers
            .is_empty()
    );
    assert_eq!(
        store.release_slot(&t).expect("release"),
        SlotRelease::Released
    );
    drop(store);

    // Opening again is a no-op.
    let again = SqliteStore::open(&path, SqliteOptions::default()).expect("reopen");
    assert_eq!(schema_version(&path), SCHEMA_VERSION.to_string());
    let t = acquire(&again, &a, "h2", LEASE);
    assert_eq!(claim_all(&again, &t, la).units.len(), 5);
}

/// Version 3 → 4: the lane-control generations (OL-14) start at 0 on existing slots and
/// lanes, the lanes' index is there, and the first operator action after the migration reaches
/// the holder of the slot.
#[test]
fn v3_database_migrates_to_v4_with_control_generations() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v3.db");
    let c = v2_database(&path);
    c.execute_batch(
        "ALTER TABLE ol_units ADD COLUMN headers TEXT; ALTER TABLE ol_rows ADD COLUMN headers TEXT; \
         UPDATE ol_meta SET value = '3' WHERE key = 'schema_version';",
    )
    .expect("v3");
    v2_enqueue(&c, "r0", &[A]);
    c.execute_batch(
        "UPDATE ol_lanes SET paused = 1, pause_reason = 'before'; \
         INSERT INTO ol_slots (actor, token) VALUES ('alice', 7);",
    )
    .expect("v3 state");
    drop(c);

    let store = SqliteStore::open(&path, SqliteOptions::default()).expect("open");
    assert_eq!(schema_version(&path), SCHEMA_VERSION.to_string());
    assert_eq!(
        count(&path, "SELECT count(*) FROM ol_slots WHERE control = 0"),
        1
    );
    assert_eq!(
        count(&path, "SELECT count(*) FROM ol_lanes WHERE control = 0"),
        1
    );
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'ol_lanes_control'"
        ),
        1
    );
    let a = actor(ALICE);
    let t = acquire(&store, &a, "h", LEASE);
    assert_eq!(t.control().generation, 0);
    let la = lane_of(&store, &a, A);
    assert!(claim_all(&store, &t, la.0).units.is_empty(), "paused");
    store.resume_lane(la).expect("resume");
    let c = store.lane_controls(&t, 0).expect("controls");
    assert_eq!(c.read.generation, 1);
    assert_eq!(c.changed.len(), 1);
    assert_eq!(
        (
            c.changed[0].state.lane,
            c.changed[0].state.paused,
            c.changed[0].pending
        ),
        (la, false, true)
    );
    assert_eq!(row_ids(&claim_all(&store, &t, la.0)), ["r0"]);
}

/// A version 4 database at `path` (version 2's DDL and the hand-written steps to 4), with a
/// pending row `p` and a delivered row's id nowhere.
fn v4_database(path: &Path) -> Connection {
    let c = v2_database(path);
    c.execute_batch(
        "ALTER TABLE ol_units ADD COLUMN headers TEXT; ALTER TABLE ol_rows ADD COLUMN headers TEXT; \
         ALTER TABLE ol_slots ADD COLUMN control INTEGER NOT NULL DEFAULT 0; \
         ALTER TABLE ol_lanes ADD COLUMN control INTEGER NOT NULL DEFAULT 0; \
         CREATE INDEX ol_lanes_control ON ol_lanes (actor, control) WHERE control > 0; \
         UPDATE ol_meta SET value = '4' WHERE key = 'schema_version';",
    )
    .expect("v4");
    v2_enqueue(&c, "p", &[A]);
    c
}

/// Version 4 → 5: the row-id ledger holds the ids stored before, and the outbox id is made
/// once (the same at every later open).
#[test]
fn v4_database_migrates_to_v5_with_a_ledger_and_an_outbox_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v4.db");
    drop(v4_database(&path));
    let store = SqliteStore::open(&path, SqliteOptions::default()).expect("open");
    assert_eq!(schema_version(&path), SCHEMA_VERSION.to_string());
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM ol_row_ids WHERE actor = 'alice' AND row_id = 'p'"
        ),
        1
    );
    let id = store.outbox_id().to_owned();
    assert_eq!(id.len(), 32);
    let a = actor(ALICE);
    assert_eq!(
        store.enqueue(&a, &[row("p", &[B])]),
        Err(EnqueueError::DuplicateRowId { row: "p".into() })
    );
    store.enqueue(&a, &[row("q", &[A])]).expect("a new id");
    drop(store);
    let again = SqliteStore::open(&path, SqliteOptions::default()).expect("reopen");
    assert_eq!(again.outbox_id(), id);
}

/// A version 6 database at `path` (version 4's, and the hand-written steps to 6) with a
/// pending row `p` in a lane in backoff, a row id in the ledger and a host's row.
fn v6_database(path: &Path) -> Connection {
    let c = v4_database(path);
    c.execute_batch(
        "CREATE TABLE ol_row_ids (actor TEXT NOT NULL, row_id TEXT NOT NULL, \
             enqueued_at INTEGER NOT NULL, PRIMARY KEY (actor, row_id)) WITHOUT ROWID; \
         CREATE INDEX ol_row_ids_at ON ol_row_ids (enqueued_at); \
         INSERT INTO ol_row_ids (actor, row_id, enqueued_at) VALUES ('alice', 'p', 1); \
         INSERT INTO ol_meta (key, value) VALUES ('outbox_id', lower(hex(randomblob(16)))); \
         CREATE TABLE ol_hosts (origin TEXT PRIMARY KEY, failures INTEGER NOT NULL DEFAULT 0, \
             level INTEGER NOT NULL DEFAULT 0, not_before INTEGER, failing_since INTEGER, \
             last_error TEXT, blocked INTEGER NOT NULL DEFAULT 0, spec TEXT, spec_at INTEGER, \
             updated_at INTEGER NOT NULL) WITHOUT ROWID; \
         INSERT INTO ol_hosts (origin, failures, updated_at) VALUES ('https://a.example:443', 2, 5); \
         UPDATE ol_lanes SET not_before = 9000, backoff_level = 2; \
         UPDATE ol_meta SET value = '6' WHERE key = 'schema_version';",
    )
    .expect("v6");
    c
}

/// Version 6 → 7: every lane gets `failing_since` and `unavailable_since`, `NULL`; the
/// units, the lanes' backoff, the ledger, the outbox id and the hosts stay as they were, and
/// a pass writes the new columns at once.
#[test]
fn v6_database_migrates_to_v7_with_a_lanes_run_of_failures() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v6.db");
    let c = v6_database(&path);
    let id: String = c
        .query_row(
            "SELECT value FROM ol_meta WHERE key = 'outbox_id'",
            [],
            |r| r.get(0),
        )
        .expect("outbox id");
    drop(c);
    let store = SqliteStore::open(&path, SqliteOptions::default()).expect("open");
    assert_eq!(schema_version(&path), SCHEMA_VERSION.to_string());
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM ol_lanes WHERE failing_since IS NULL AND unavailable_since IS NULL"
        ),
        1
    );
    assert_eq!(store.outbox_id(), id);
    let a = actor(ALICE);
    let l = &store.lanes(&a).expect("lanes")[0];
    assert_eq!(
        (
            l.not_before,
            l.backoff_level,
            l.depth,
            l.failing_since,
            l.unavailable_since
        ),
        (Some(Timestamp::from_millis(9_000)), 2, 1, None, None)
    );
    assert_eq!(
        store.enqueue(&a, &[row("p", &[B])]),
        Err(EnqueueError::DuplicateRowId { row: "p".into() })
    );
    let hosts = DriverStore::hosts(&store).expect("hosts").hosts;
    assert_eq!(
        hosts
            .iter()
            .map(|h| (h.origin.as_str(), h.failures))
            .collect::<Vec<_>>(),
        [("https://a.example:443", 2)]
    );
    let t = acquire(&store, &a, "h", LEASE);
    let la = lane_of(&store, &a, A);
    assert_eq!(row_ids(&claim_all(&store, &t, la.0)), ["p"]);
    let since = Timestamp::from_millis(1_000);
    store
        .set_lane_failing(&t, la, Some(since))
        .expect("failing");
    store
        .set_lane_unavailable(&t, la, Timestamp::from_millis(2_000))
        .expect("unavailable");
    let (lanes, _) = store.lanes_with_work(&t, 0).expect("lanes with work");
    assert_eq!(
        (lanes[0].failing_since, lanes[0].unavailable_since),
        (Some(since), Some(Timestamp::from_millis(2_000)))
    );
    let _ = store.release_slot(&t).expect("release");
    drop(store);

    // Opening again is a no-op and keeps what was written.
    let again = SqliteStore::open(&path, SqliteOptions::default()).expect("reopen");
    assert_eq!(schema_version(&path), SCHEMA_VERSION.to_string());
    let l = &again.lanes(&a).expect("lanes")[0];
    assert_eq!(
        (l.failing_since, l.unavailable_since),
        (Some(since), Some(Timestamp::from_millis(2_000)))
    );
}

fn with_policy(schema: SchemaPolicy) -> SqliteOptions {
    SqliteOptions {
        common: CommonOptions {
            schema,
            ..CommonOptions::default()
        },
        ..SqliteOptions::default()
    }
}

/// What each schema policy does with an older schema, a missing one, and a current one: only
/// `Migrate` upgrades, `Existing` creates nothing, and neither writes to a database it refuses.
#[test]
fn schema_policies_refuse_what_they_may_not_change() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = dir.path().join("v4.db");
    drop(v4_database(&old));
    for policy in [SchemaPolicy::Create, SchemaPolicy::Existing] {
        assert_eq!(
            SqliteStore::open(&old, with_policy(policy)).map(drop),
            Err(StoreError::SchemaTooOld {
                found: 4,
                supported: SCHEMA_VERSION
            }),
            "{policy:?}"
        );
        assert_eq!(schema_version(&old), "4");
    }
    assert!(
        SqliteStore::open_read_only(&old, SqliteOptions::default())
            .map(drop)
            .is_err_and(|e| e.to_string().contains("outbox-lanes migrate"))
    );

    let empty = dir.path().join("empty.db");
    drop(Connection::open(&empty).expect("an empty database"));
    assert!(matches!(
        SqliteStore::open(&empty, with_policy(SchemaPolicy::Existing)),
        Err(StoreError::NoSchema { .. })
    ));
    assert_eq!(
        count(&empty, "SELECT count(*) FROM sqlite_master"),
        0,
        "nothing created"
    );
    let created = SqliteStore::open(&empty, with_policy(SchemaPolicy::Create)).expect("create");
    let a = actor(ALICE);
    created.enqueue(&a, &[row("r", &[A])]).expect("enqueue");
    drop(created);
    // A current schema opens under every policy, and read-only.
    for policy in [
        SchemaPolicy::Migrate,
        SchemaPolicy::Create,
        SchemaPolicy::Existing,
    ] {
        SqliteStore::open(&empty, with_policy(policy)).expect("current schema");
    }
    let ro = SqliteStore::open_read_only(&empty, SqliteOptions::default()).expect("read-only");
    assert_eq!(ro.status().expect("status")[0].pending, 1);
    assert!(matches!(
        ro.enqueue(&a, &[row("s", &[A])]),
        Err(EnqueueError::Store(StoreError::ReadOnly { .. }))
    ));
    assert!(!dir.path().join("empty.db-holders").exists());
}

/// Version 7 → 8 (issue 39): the delivery log appears, empty, lanes get `NULL` in-flight
/// marks; the pending row stays, and a pass logs its delivery at once.
#[test]
fn v7_database_migrates_to_v8_with_a_delivery_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v7.db");
    let c = v6_database(&path);
    c.execute_batch(
        "ALTER TABLE ol_lanes ADD COLUMN failing_since INTEGER; \
         ALTER TABLE ol_lanes ADD COLUMN unavailable_since INTEGER; \
         UPDATE ol_meta SET value = '7' WHERE key = 'schema_version';",
    )
    .expect("v7");
    drop(c);
    assert!(!table_exists(&path, "ol_delivery_log"));
    let store = SqliteStore::open(&path, SqliteOptions::default()).expect("open");
    assert_eq!(schema_version(&path), SCHEMA_VERSION.to_string());
    assert_eq!(count(&path, "SELECT count(*) FROM ol_delivery_log"), 0);
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM ol_lanes WHERE in_flight_since IS NULL AND in_flight_unit IS NULL"
        ),
        1
    );
    let a = actor(ALICE);
    let t = acquire(&store, &a, "h", LEASE);
    let la = lane_of(&store, &a, A);
    let u = claim_all(&store, &t, la.0).units[0].id;
    let entry = DeliveryLogEntry {
        unit: u,
        lane: la,
        row_id: "p".into(),
        attempt: 1,
        started_at: Timestamp::from_millis(5_000),
        duration_ms: 3,
        status: Some(200),
        error_class: None,
        body: None,
        delivered: true,
    };
    store.ack_logged(&t, &[(u, la)], &[entry]).expect("ack");
    let rows = store.row_deliveries(&a, "p").expect("row");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].state, RowDeliveryState::Delivered);
    let _ = store.release_slot(&t).expect("release");
}
