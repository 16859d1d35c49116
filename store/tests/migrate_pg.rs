//! Postgres: a schema version 1 database (units in `ol_rows` + `ol_units` + `ol_deliveries`),
//! written with version 1's plain-SQL enqueue, is migrated to version 2 when a store connects,
//! and reads and works as it did: the same units in the same order with their attempts and
//! served flags, payloads, acks, dead letters and replay, and unit ids never reused. A
//! version 2 database is migrated to version 3 (row headers) and keeps its units and order; a
//! version 3 database to version 4 (lane-control generations, OL-14); a version 4 database to
//! version 5 (the row-id ledger); a version 6 database to version 7 (a lane's run of
//! failures).
#![cfg(feature = "postgres")]
#![allow(missing_docs, clippy::std_instead_of_core)]

mod common;

use ::postgres::{Client, NoTls, Transaction};
use common::*;
use outbox_lanes_core::{DeadReason, Seq, Timestamp, UnitId};
use outbox_lanes_store::postgres::{SCHEMA_V1, SCHEMA_V2};
use outbox_lanes_store::*;

const A: &str = "https://a.example/inbox";
const B: &str = "https://b.example/inbox";
const C: &str = "https://c.example/inbox";

/// A schema that is dropped when the test ends, pass or fail.
struct Schema {
    url: String,
    name: String,
}

impl Schema {
    fn new(url: &str, tag: &str) -> Schema {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        Schema {
            url: url.to_string(),
            name: format!("ol_mig_{tag}_{}_{nanos}", std::process::id()),
        }
    }

    fn client(&self) -> Client {
        let mut c = Client::connect(&self.url, NoTls).expect("raw client");
        c.batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {0}; SET search_path TO {0}",
            self.name
        ))
        .expect("schema");
        c
    }

    fn store(&self, common: CommonOptions) -> PgStore {
        PgStore::connect(
            &self.url,
            PgOptions {
                schema: self.name.clone(),
                common,
                ..PgOptions::default()
            },
        )
        .expect("connect")
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::connect(&self.url, NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
        }
    }
}

/// A version 1 database, as a version 1 store created it.
fn create_v1(c: &mut Client) {
    c.batch_execute(
        "CREATE TABLE ol_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); \
         INSERT INTO ol_meta (key, value) VALUES ('schema_version', '1');",
    )
    .expect("meta");
    c.batch_execute(SCHEMA_V1).expect("v1 ddl");
}

fn lane(tx: &mut Transaction<'_>, recipient: &str) -> i64 {
    tx.execute(
        "INSERT INTO ol_lanes (actor, recipient, ordering_key) VALUES ('alice', $1, '') \
         ON CONFLICT (actor, recipient, ordering_key) DO NOTHING",
        &[&recipient],
    )
    .expect("lane");
    tx.query_one(
        "SELECT id FROM ol_lanes WHERE actor = 'alice' AND recipient = $1 AND ordering_key = ''",
        &[&recipient],
    )
    .expect("lane id")
    .get(0)
}

/// Version 1's plain-SQL enqueue (SCHEMA.md of version 1) of one row: the payload in ol_rows,
/// then one unit with k lanes (`joined`) or k units with one lane each. Returns the unit ids.
fn v1_enqueue(c: &mut Client, row_id: &str, to: &[&str], joined: bool) -> Vec<i64> {
    let mut tx = c.transaction().expect("tx");
    let seq: i64 = tx
        .query_one(
            "INSERT INTO ol_actors AS a (actor, last_seq) VALUES ('alice', 1) \
             ON CONFLICT (actor) DO UPDATE SET last_seq = a.last_seq + excluded.last_seq RETURNING last_seq",
            &[],
        )
        .expect("seq")
        .get(0);
    let body = format!("body of {row_id}").into_bytes();
    let len = body.len() as i64;
    let row_ref: i64 = tx
        .query_one(
            "INSERT INTO ol_rows (actor, row_id, seq, content_type, body, body_len, dedup_key, ordering_key, \
             enqueued_at) VALUES ('alice', $1, $2, 'text/plain', $3, $4, NULL, '', 1000) RETURNING id",
            &[&row_id, &seq, &body, &len],
        )
        .expect("row")
        .get(0);
    let lanes: Vec<i64> = to.iter().map(|r| lane(&mut tx, r)).collect();
    let groups: Vec<Vec<i64>> = if joined {
        vec![lanes]
    } else {
        lanes.into_iter().map(|l| vec![l]).collect()
    };
    let mut units = Vec::new();
    for group in groups {
        let k = group.len() as i64;
        let unit: i64 = tx
            .query_one(
                "INSERT INTO ol_units (actor, row_ref, seq, lanes, pending) VALUES ('alice', $1, $2, $3, $3) \
                 RETURNING id",
                &[&row_ref, &seq, &k],
            )
            .expect("unit")
            .get(0);
        for l in group {
            tx.execute(
                "INSERT INTO ol_deliveries (unit_id, lane_id, seq) VALUES ($1, $2, $3)",
                &[&unit, &l, &seq],
            )
            .expect("delivery");
            tx.execute(
                "UPDATE ol_lanes SET tail_seq = GREATEST(tail_seq, $2) WHERE id = $1",
                &[&l, &seq],
            )
            .expect("tail");
        }
        units.push(unit);
    }
    tx.commit().expect("commit");
    units
}

/// What a version 1 store's ack of a one-lane unit left: nothing of the unit or its row.
fn v1_finish(c: &mut Client, unit: i64) {
    c.batch_execute(&v1_finish_sql(unit)).expect("finish");
}

fn v1_finish_sql(unit: i64) -> String {
    format!(
        "DELETE FROM ol_deliveries WHERE unit_id = {unit}; \
         DELETE FROM ol_rows WHERE id = (SELECT row_ref FROM ol_units WHERE id = {unit}); \
         DELETE FROM ol_units WHERE id = {unit};"
    )
}

fn lane_id(c: &mut Client, recipient: &str) -> StoreLaneId {
    StoreLaneId(
        c.query_one(
            "SELECT id FROM ol_lanes WHERE actor = 'alice' AND recipient = $1",
            &[&recipient],
        )
        .expect("lane")
        .get(0),
    )
}

fn slot(c: &ClaimedUnit) -> Vec<(StoreLaneId, u32, bool)> {
    c.slots
        .iter()
        .map(|s| (s.lane, s.attempts, s.served))
        .collect()
}

#[test]
fn postgres_v1_database_is_migrated_and_keeps_working() {
    let Some(url) = pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let schema = Schema::new(&url, "full");
    let mut c = schema.client();
    create_v1(&mut c);

    // Lane ids in creation order: A < B < C.
    let [one] = v1_enqueue(&mut c, "one", &[A], false)[..] else {
        panic!("one unit")
    };
    // A joined unit on A and B whose delivery to A (its lowest lane: the v2 head) was served.
    let [joined] = v1_enqueue(&mut c, "joined", &[A, B], true)[..] else {
        panic!("one joined unit")
    };
    // A row with two recipients: two units sharing one payload row.
    let split = v1_enqueue(&mut c, "split", &[B, C], false);
    assert_eq!(split.len(), 2);
    let dead = v1_enqueue(&mut c, "dead", &[C], false)[0];
    // Units finished and deleted: their ids were handed out and must never come back.
    let mut gone = Vec::new();
    for k in 0..5 {
        gone.push(v1_enqueue(&mut c, &format!("gone{k}"), &[C], false)[0]);
    }
    let big = v1_enqueue(&mut c, "big", &[C], false)[0];
    let after = v1_enqueue(&mut c, "after", &[A], false)[0];
    // A finished unit kept by the ack retention (version 1 deleted its deliveries).
    let kept = v1_enqueue(&mut c, "kept", &[B], false)[0];
    let last_v1_id = v1_enqueue(&mut c, "last", &[A], false)[0];
    for u in gone.iter().chain([&after, &last_v1_id]) {
        v1_finish(&mut c, *u);
    }
    assert!(big > gone[4] && last_v1_id > big);
    c.batch_execute(&format!(
        "UPDATE ol_deliveries SET attempts = 3, last_status = 503, last_error = 'busy', \
           first_attempt_at = 1500, last_attempt_at = 2500 WHERE unit_id = {one}; \
         UPDATE ol_deliveries SET state = 1 WHERE unit_id = {joined} \
           AND lane_id = (SELECT min(lane_id) FROM ol_deliveries WHERE unit_id = {joined}); \
         UPDATE ol_deliveries SET attempts = 1 WHERE unit_id = {joined} \
           AND lane_id = (SELECT max(lane_id) FROM ol_deliveries WHERE unit_id = {joined}); \
         UPDATE ol_units SET pending = 1 WHERE id = {joined}; \
         DELETE FROM ol_deliveries WHERE unit_id = {kept}; \
         UPDATE ol_units SET pending = 0, acked_at = 3000 WHERE id = {kept}; \
         INSERT INTO ol_dead_letters (unit_id, row_ref, row_id, actor, lane_id, recipient, ordering_key, reason, \
           last_status, last_error, attempts, first_attempt_at, last_attempt_at, seq, dead_at) \
           SELECT u.id, u.row_ref, 'dead', 'alice', d.lane_id, '{C}', '', 'permanent', 410, 'gone', 7, 100, 200, \
           u.seq, 300 FROM ol_units u JOIN ol_deliveries d ON d.unit_id = u.id WHERE u.id = {dead}; \
         DELETE FROM ol_deliveries WHERE unit_id = {dead}; \
         DELETE FROM ol_units WHERE id = {dead};"
    ))
    .expect("v1 states");
    let (la, lb, lc) = (lane_id(&mut c, A), lane_id(&mut c, B), lane_id(&mut c, C));

    let retention = CommonOptions {
        ack_retention: Some(std::time::Duration::from_secs(3600)),
        ..CommonOptions::default()
    };
    let store = schema.store(retention.clone());

    // The version and the layout.
    let version: String = c
        .query_one(
            "SELECT value FROM ol_meta WHERE key = 'schema_version'",
            &[],
        )
        .expect("version")
        .get(0);
    assert_eq!(version, SCHEMA_VERSION.to_string());
    let deliveries: Option<String> = c
        .query_one("SELECT to_regclass('ol_deliveries')::text", &[])
        .expect("regclass")
        .get(0);
    assert_eq!(deliveries, None, "ol_deliveries is dropped");
    let owner: Option<String> = c
        .query_one("SELECT pg_get_serial_sequence('ol_units', 'id')", &[])
        .expect("owner")
        .get(0);
    assert_eq!(owner, Some(format!("{}.ol_units_id_seq", schema.name)));
    // One v2 row per (unit, lane) still there: one, joined x2, split x2, big, kept.
    let n: i64 = c
        .query_one("SELECT count(*) FROM ol_units", &[])
        .expect("count")
        .get(0);
    assert_eq!(n, 7);

    // Claims: the same units in the same order, with attempts and served flags.
    let s: &dyn Store = &store;
    let a = actor("alice");
    let t = acquire(s, &a, "h", LEASE);
    let (lanes, _) = s.lanes_with_work(&t, 0).expect("lanes");
    let mut with_work: Vec<StoreLaneId> = lanes.iter().map(|l| l.lane).collect();
    with_work.sort();
    assert_eq!(with_work, [la, lb, lc]);
    let ca = claim_lane(s, &t, la, 0, 10);
    assert_eq!(row_ids(&ca), ["one", "joined"]);
    assert_eq!(unit_ids(&ca), [UnitId(one as u64), UnitId(joined as u64)]);
    assert_eq!(slot(&ca.units[0]), [(la, 3, false)]);
    assert_eq!(slot(&ca.units[1]), [(la, 0, true), (lb, 1, false)]);
    assert_eq!(ca.units[0].bytes, "body of one".len() as u32);
    assert_eq!(ca.units[0].enqueued_at, Timestamp::from_millis(1000));
    let cb = claim_lane(s, &t, lb, 0, 10);
    assert_eq!(row_ids(&cb), ["joined", "split"]);
    assert_eq!(
        unit_ids(&cb),
        [UnitId(joined as u64), UnitId(split[0] as u64)]
    );
    assert_eq!(slot(&cb.units[1]), [(lb, 0, false)]);
    let cc = claim_lane(s, &t, lc, 0, 10);
    assert_eq!(row_ids(&cc), ["split", "big"]);
    assert_eq!(unit_ids(&cc), [UnitId(split[1] as u64), UnitId(big as u64)]);
    let seqs: Vec<Seq> = ca
        .units
        .iter()
        .chain(&cb.units)
        .chain(&cc.units)
        .map(|u| u.seq)
        .collect();
    assert_eq!(seqs, [Seq(1), Seq(2), Seq(2), Seq(3), Seq(3), Seq(10)]);

    // Payloads (all in ol_rows after the migration).
    for (unit, row) in [
        (one, "one"),
        (joined, "joined"),
        (split[1], "split"),
        (big, "big"),
    ] {
        let p = s.payload(UnitId(unit as u64)).expect("payload");
        assert_eq!(p.row_id, row);
        assert_eq!(p.body, format!("body of {row}").into_bytes());
        assert_eq!(p.content_type, "text/plain");
    }
    assert_eq!(
        s.payload(UnitId(kept as u64)),
        Err(StoreError::NotFound { what: "unit" }),
        "a unit kept by the retention has no payload to deliver"
    );

    // Status: five units pending (kept is finished), one dead letter.
    let st = s.status().expect("status");
    assert_eq!((st[0].pending, st[0].dead_letters), (5, 1));
    let dl = s.dead_letters(Some(&a)).expect("dead letters");
    assert_eq!(dl.len(), 1);
    assert_eq!(
        (
            dl[0].unit,
            dl[0].row_id.as_str(),
            dl[0].reason,
            dl[0].attempts,
            dl[0].last_status
        ),
        (
            UnitId(dead as u64),
            "dead",
            DeadReason::Permanent,
            7,
            Some(410)
        )
    );

    // Acks: the joined unit finishes with its last lane; one of the split units leaves the
    // shared payload to the other.
    s.ack(
        &t,
        &[
            (UnitId(one as u64), la),
            (UnitId(joined as u64), lb),
            (UnitId(split[0] as u64), lb),
        ],
    )
    .expect("ack");
    assert_eq!(row_ids(&claim_lane(s, &t, la, 0, 10)), Vec::<String>::new());
    assert_eq!(row_ids(&claim_lane(s, &t, lb, 0, 10)), Vec::<String>::new());
    assert_eq!(
        s.payload(UnitId(split[1] as u64))
            .expect("shared payload")
            .row_id,
        "split"
    );
    assert!(matches!(
        s.payload(UnitId(joined as u64)),
        Err(StoreError::NotFound { .. })
    ));
    // Kept by the retention: one, joined, split[0] and kept; all purged.
    assert_eq!(
        s.purge_acked(Timestamp::from_millis(u64::MAX / 2))
            .expect("purge"),
        4
    );

    // Replay: the dead letter comes back at the tail of C with its unit id and payload.
    assert_eq!(
        s.replay_dead_letters(&DeadLetterSelection::Actor(a.clone()))
            .expect("replay"),
        [UnitId(dead as u64)]
    );
    let cc = claim_lane(s, &t, lc, 0, 10);
    assert_eq!(row_ids(&cc), ["split", "big", "dead"]);
    assert_eq!(cc.units[2].id, UnitId(dead as u64));
    assert!(
        cc.units[2].seq > Seq(13),
        "replayed at the tail: {:?}",
        cc.units[2].seq
    );
    assert_eq!(
        s.payload(UnitId(dead as u64))
            .expect("replayed payload")
            .body,
        b"body of dead"
    );

    // New units get ids above every id version 1 ever handed out (deleted ones included).
    let joined_row = NewRow {
        joined: true,
        ..row("new-joined", &[A, C])
    };
    let out = s
        .enqueue(&a, &[row("new", &[A]), joined_row])
        .expect("enqueue");
    let new: Vec<u64> = out
        .iter()
        .flat_map(|e| e.units.iter().map(|u| u.0))
        .collect();
    assert_eq!(new.len(), 2, "a one-recipient unit and a joined unit");
    assert!(
        new.iter().all(|u| *u > last_v1_id as u64),
        "{new:?} vs {last_v1_id}"
    );
    assert_eq!(out[0].seq, Seq(15), "seqs continue after version 1's");
    let row_refused = s.enqueue(&a, &[row("big", &[A])]);
    assert_eq!(
        row_refused,
        Err(EnqueueError::DuplicateRowId { row: "big".into() }),
        "a version 1 row id (in ol_rows) is still taken"
    );

    // Everything drains.
    let mut acks = Vec::new();
    for l in [la, lb, lc] {
        for u in claim_lane(s, &t, l, 0, 10).units {
            acks.push((u.id, l));
        }
    }
    assert_eq!(acks.len(), 6, "{acks:?}");
    s.ack(&t, &acks).expect("drain");
    let (lanes, _) = s.lanes_with_work(&t, 0).expect("lanes");
    assert!(lanes.is_empty());
    assert_eq!(s.release_slot(&t), Ok(SlotRelease::Released));
    drop(store);

    // Opening again does not migrate again: the lanes and the retained units are there.
    let store = schema.store(retention);
    let depths: Vec<(StoreLaneId, u64)> = store
        .lanes(&a)
        .expect("lanes")
        .iter()
        .map(|l| (l.lane, l.depth))
        .collect();
    assert_eq!(depths, [(la, 0), (lb, 0), (lc, 0)]);
    assert_eq!(
        store
            .purge_acked(Timestamp::from_millis(u64::MAX / 2))
            .expect("purge"),
        5
    );
}

#[test]
fn postgres_migrated_schema_matches_a_fresh_one() {
    let Some(url) = pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let migrated = Schema::new(&url, "m");
    let mut c = migrated.client();
    create_v1(&mut c);
    v1_enqueue(&mut c, "r0", &[A, B], true);
    drop(migrated.store(CommonOptions::default()));
    let fresh = Schema::new(&url, "f");
    drop(fresh.store(CommonOptions::default()));

    // Outside both schemas, so names are qualified alike in both descriptions.
    c.batch_execute("SET search_path TO public").expect("path");
    let mut describe = |schema: &str| -> Vec<String> {
        let mut out: Vec<String> = c
            .query(
                "SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' \
                 || coalesce(column_default, '') FROM information_schema.columns WHERE table_schema = $1 \
                 ORDER BY table_name, ordinal_position",
                &[&schema],
            )
            .expect("columns")
            .iter()
            .map(|r| r.get::<_, String>(0).replace(schema, "S"))
            .collect();
        out.extend(
            c.query(
                "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 ORDER BY indexname",
                &[&schema],
            )
            .expect("indexes")
            .iter()
            .map(|r| r.get::<_, String>(0).replace(schema, "S")),
        );
        out
    };
    let m = describe(&migrated.name);
    assert!(m.iter().any(|l| l.contains("ol_units_lane")), "{m:#?}");
    assert!(!m.iter().any(|l| l.contains("ol_deliveries")), "{m:#?}");
    assert_eq!(m, describe(&fresh.name));
    // The fresh schema is what SCHEMA_V2 says.
    assert!(SCHEMA_V2.contains("CREATE UNIQUE INDEX ol_units_row_id"));
}

/// A relay of version 1 still acking while a version 2 store connects: the migration waits
/// for that transaction and copies what it committed (the acked unit stays gone, the lane
/// stays readable).
#[test]
fn postgres_migration_waits_for_version_1_writers() {
    let Some(url) = pg_url() else {
        println!("skipped: {PG_ENV} not set");
        return;
    };
    let schema = Schema::new(&url, "race");
    let mut c = schema.client();
    create_v1(&mut c);
    let one = v1_enqueue(&mut c, "one", &[A], false);
    v1_enqueue(&mut c, "two", &[A], false);
    let mut old = schema.client();
    let mut tx = old.transaction().expect("tx");
    // Version 1's ack of "one", not committed yet.
    tx.batch_execute(&v1_finish_sql(one[0])).expect("v1 ack");
    let (url2, name) = (url.clone(), schema.name.clone());
    let migrating = std::thread::spawn(move || {
        PgStore::connect(
            &url2,
            PgOptions {
                schema: name,
                ..PgOptions::default()
            },
        )
    });
    until_waiting_on_a_lock(&url, "LOCK TABLE ol_actors");
    tx.commit().expect("commit v1 ack");
    let store = migrating.join().expect("join").expect("connect");
    let a = actor("alice");
    let t = acquire(&store, &a, "h", LEASE);
    let claimed = claim_lane(&store, &t, lane_id(&mut c, A), 0, 10);
    assert_eq!(row_ids(&claimed), ["two"], "the acked unit is not back");
    store.payload(claimed.units[0].id).expect("payload");
}

/// Version 2's plain-SQL enqueue (SCHEMA.md of version 2) of one row: inline with one
/// recipient (4a), else the payload in ol_rows and one unit per recipient (4c). It names its
/// columns, as a service written against version 2 does, so it also runs against version 3.
fn v2_enqueue(c: &mut Client, row_id: &str, to: &[&str]) {
    let mut tx = c.transaction().expect("tx");
    let seq: i64 = tx
        .query_one(
            "INSERT INTO ol_actors AS a (actor, last_seq) VALUES ('alice', 1) \
             ON CONFLICT (actor) DO UPDATE SET last_seq = a.last_seq + excluded.last_seq RETURNING last_seq",
            &[],
        )
        .expect("seq")
        .get(0);
    let lanes: Vec<i64> = to.iter().map(|r| lane(&mut tx, r)).collect();
    let body = format!("body of {row_id}").into_bytes();
    let len = body.len() as i64;
    if let [l] = lanes[..] {
        tx.execute(
            "INSERT INTO ol_units (actor, lane_id, seq, row_id, content_type, body, body_len, dedup_key, \
             ordering_key, enqueued_at) VALUES ('alice', $1, $2, $3, 'text/plain', $4, $5, NULL, '', 1)",
            &[&l, &seq, &row_id, &body, &len],
        )
        .expect("inline unit");
    } else {
        let row_ref: i64 = tx
            .query_one(
                "INSERT INTO ol_rows (actor, row_id, seq, content_type, body, body_len, dedup_key, \
                 ordering_key, enqueued_at) VALUES ('alice', $1, $2, 'text/plain', $3, $4, NULL, '', 1) \
                 RETURNING id",
                &[&row_id, &seq, &body, &len],
            )
            .expect("shared row")
            .get(0);
        for l in &lanes {
            tx.execute(
                "INSERT INTO ol_units (actor, lane_id, seq, row_ref) VALUES ('alice', $1, $2, $3)",
                &[l, &seq, &row_ref],
            )
            .expect("unit");
        }
    }
    for l in &lanes {
        tx.execute(
            "UPDATE ol_lanes SET tail_seq = GREATEST(tail_seq, $2) WHERE id = $1",
            &[l, &seq],
        )
        .expect("tail");
    }
    tx.commit().expect("commit");
}

#[test]
fn postgres_v2_database_is_migrated_to_v4_and_keeps_working() {
    let Some(url) = pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let schema = Schema::new(&url, "v2");
    let mut c = schema.client();
    c.batch_execute(
        "CREATE TABLE ol_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); \
         INSERT INTO ol_meta (key, value) VALUES ('schema_version', '2');",
    )
    .expect("meta");
    c.batch_execute(SCHEMA_V2).expect("v2 ddl");
    for (id, to) in [
        ("r0", &[A][..]),
        ("fan", &[A, B][..]),
        ("r1", &[A][..]),
        ("r2", &[B][..]),
    ] {
        v2_enqueue(&mut c, id, to);
    }

    let store = schema.store(CommonOptions::default());
    let version: String = c
        .query_one(
            "SELECT value FROM ol_meta WHERE key = 'schema_version'",
            &[],
        )
        .expect("version")
        .get(0);
    assert_eq!(version, SCHEMA_VERSION.to_string());
    let a = actor("alice");
    let t = acquire(&store, &a, "h", LEASE);
    let (la, lb) = (lane_id(&mut c, A), lane_id(&mut c, B));
    let ca = claim_lane(&store, &t, la, 0, 100);
    assert_eq!(row_ids(&ca), ["r0", "fan", "r1"]);
    assert_eq!(row_ids(&claim_lane(&store, &t, lb, 0, 100)), ["fan", "r2"]);
    for u in &ca.units {
        let p = store.payload(u.id).expect("payload");
        assert_eq!(p.body, format!("body of {}", u.row_id).into_bytes());
        assert_eq!(p.content_type, "text/plain");
        assert!(p.headers.is_empty());
    }

    // New rows carry headers; a version 2 plain-SQL writer still works, without headers.
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
    v2_enqueue(&mut c, "late", &[A]);
    let ca = claim_lane(&store, &t, la, 0, 100);
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

    // Connecting again is a no-op.
    let again = schema.store(CommonOptions::default());
    let t = acquire(&again, &a, "h2", LEASE);
    assert_eq!(claim_lane(&again, &t, la, 0, 100).units.len(), 5);
}

/// Version 3 → 4: the lane-control generations (OL-14) start at 0 on existing slots and
/// lanes, the lanes' index is there, and the first operator action after the migration reaches
/// the holder of the slot.
#[test]
fn postgres_v3_database_is_migrated_to_v4_with_control_generations() {
    let Some(url) = pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let schema = Schema::new(&url, "v3");
    let mut c = schema.client();
    c.batch_execute(
        "CREATE TABLE ol_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); \
         INSERT INTO ol_meta (key, value) VALUES ('schema_version', '3');",
    )
    .expect("meta");
    c.batch_execute(SCHEMA_V2).expect("v2 ddl");
    c.batch_execute(
        "ALTER TABLE ol_units ADD COLUMN headers TEXT; ALTER TABLE ol_rows ADD COLUMN headers TEXT;",
    )
    .expect("v3 ddl");
    v2_enqueue(&mut c, "r0", &[A]);
    c.batch_execute(
        "UPDATE ol_lanes SET paused = TRUE, pause_reason = 'before'; \
         INSERT INTO ol_slots (actor, token) VALUES ('alice', 7);",
    )
    .expect("v3 state");

    let store = schema.store(CommonOptions::default());
    let one = |c: &mut Client, sql: &str| -> i64 { c.query_one(sql, &[]).expect(sql).get(0) };
    let version: String = c
        .query_one(
            "SELECT value FROM ol_meta WHERE key = 'schema_version'",
            &[],
        )
        .expect("version")
        .get(0);
    assert_eq!(version, SCHEMA_VERSION.to_string());
    assert_eq!(
        one(&mut c, "SELECT count(*) FROM ol_slots WHERE control = 0"),
        1
    );
    assert_eq!(
        one(&mut c, "SELECT count(*) FROM ol_lanes WHERE control = 0"),
        1
    );
    assert_eq!(
        one(
            &mut c,
            "SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema() \
             AND indexname = 'ol_lanes_control'"
        ),
        1
    );
    let a = actor("alice");
    let t = acquire(&store, &a, "h", LEASE);
    assert_eq!(t.control().generation, 0);
    let la = lane_id(&mut c, A);
    assert!(
        claim_lane(&store, &t, la, 0, 100).units.is_empty(),
        "paused"
    );
    store.resume_lane(la).expect("resume");
    let got = store.lane_controls(&t, 0).expect("controls");
    assert_eq!(got.read.generation, 1);
    assert_eq!(got.changed.len(), 1);
    assert_eq!(
        (
            got.changed[0].state.lane,
            got.changed[0].state.paused,
            got.changed[0].pending
        ),
        (la, false, true)
    );
    assert_eq!(row_ids(&claim_lane(&store, &t, la, 0, 100)), ["r0"]);
}

/// A version 4 schema (version 2's DDL and the hand-written steps to 4) with a pending row `p`.
fn v4_schema(schema: &Schema) -> Client {
    let mut c = schema.client();
    c.batch_execute(
        "CREATE TABLE ol_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); \
         INSERT INTO ol_meta (key, value) VALUES ('schema_version', '4');",
    )
    .expect("meta");
    c.batch_execute(SCHEMA_V2).expect("v2 ddl");
    c.batch_execute(
        "ALTER TABLE ol_units ADD COLUMN headers TEXT; ALTER TABLE ol_rows ADD COLUMN headers TEXT; \
         ALTER TABLE ol_slots ADD COLUMN control BIGINT NOT NULL DEFAULT 0; \
         ALTER TABLE ol_lanes ADD COLUMN control BIGINT NOT NULL DEFAULT 0; \
         CREATE INDEX ol_lanes_control ON ol_lanes (actor, control) WHERE control > 0;",
    )
    .expect("v4 ddl");
    v2_enqueue(&mut c, "p", &[A]);
    c
}

fn schema_version_of(c: &mut Client) -> String {
    c.query_one(
        "SELECT value FROM ol_meta WHERE key = 'schema_version'",
        &[],
    )
    .expect("version")
    .get(0)
}

/// Version 4 → 5: the row-id ledger holds the ids stored before, the outbox id is made once,
/// and the liveness table is part of the schema.
#[test]
fn postgres_v4_database_is_migrated_to_v5_with_a_ledger_and_an_outbox_id() {
    let Some(url) = pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let schema = Schema::new(&url, "v4");
    let mut c = v4_schema(&schema);
    let store = schema.store(CommonOptions::default());
    assert_eq!(schema_version_of(&mut c), SCHEMA_VERSION.to_string());
    let one = |c: &mut Client, sql: &str| -> i64 { c.query_one(sql, &[]).expect(sql).get(0) };
    assert_eq!(
        one(
            &mut c,
            "SELECT count(*) FROM ol_row_ids WHERE actor = 'alice' AND row_id = 'p'"
        ),
        1
    );
    assert_eq!(one(&mut c, "SELECT count(*) FROM ol_live_holders"), 0);
    let id = store.outbox_id().to_owned();
    assert_eq!(id.len(), 32, "{id}");
    let a = actor("alice");
    assert_eq!(
        store.enqueue(&a, &[row("p", &[B])]),
        Err(EnqueueError::DuplicateRowId { row: "p".into() })
    );
    store.enqueue(&a, &[row("q", &[A])]).expect("a new id");
    drop(store);
    assert_eq!(schema.store(CommonOptions::default()).outbox_id(), id);
}

/// A version 6 schema (version 4's, and the hand-written steps to 6) with a pending row `p` in
/// a lane in backoff, a row id in the ledger and a host's row.
fn v6_schema(schema: &Schema) -> Client {
    let mut c = v4_schema(schema);
    c.batch_execute(
        "CREATE TABLE ol_row_ids (actor TEXT NOT NULL, row_id TEXT NOT NULL, \
             enqueued_at BIGINT NOT NULL, PRIMARY KEY (actor, row_id)); \
         CREATE INDEX ol_row_ids_at ON ol_row_ids (enqueued_at); \
         INSERT INTO ol_row_ids (actor, row_id, enqueued_at) VALUES ('alice', 'p', 1); \
         CREATE TABLE ol_live_holders (holder TEXT PRIMARY KEY); \
         CREATE INDEX ol_slots_holder ON ol_slots (holder) WHERE holder IS NOT NULL; \
         INSERT INTO ol_meta (key, value) VALUES ('outbox_id', 'fedcba98765432100123456789abcdef'); \
         CREATE TABLE ol_hosts (origin TEXT PRIMARY KEY, \
             failures BIGINT NOT NULL DEFAULT 0, level BIGINT NOT NULL DEFAULT 0, not_before BIGINT, \
             failing_since BIGINT, last_error TEXT, blocked BIGINT NOT NULL DEFAULT 0, spec TEXT, \
             spec_at BIGINT, updated_at BIGINT NOT NULL); \
         INSERT INTO ol_hosts (origin, failures, updated_at) VALUES ('https://a.example:443', 2, 5); \
         UPDATE ol_lanes SET not_before = 9000, backoff_level = 2; \
         UPDATE ol_meta SET value = '6' WHERE key = 'schema_version';",
    )
    .expect("v6");
    c
}

/// Version 6 → 7: every lane gets `failing_since` and `unavailable_since`, `NULL`; the units,
/// the lanes' backoff, the ledger, the outbox id and the hosts stay as they were, and a pass
/// writes the new columns at once.
#[test]
fn postgres_v6_database_is_migrated_to_v7_with_a_lanes_run_of_failures() {
    let Some(url) = pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let schema = Schema::new(&url, "v6");
    let mut c = v6_schema(&schema);
    let store = schema.store(CommonOptions::default());
    assert_eq!(schema_version_of(&mut c), SCHEMA_VERSION.to_string());
    let one = |c: &mut Client, sql: &str| -> i64 { c.query_one(sql, &[]).expect(sql).get(0) };
    assert_eq!(
        one(
            &mut c,
            "SELECT count(*) FROM ol_lanes WHERE failing_since IS NULL AND unavailable_since IS NULL"
        ),
        1
    );
    assert_eq!(store.outbox_id(), "fedcba98765432100123456789abcdef");
    let a = actor("alice");
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
    assert_eq!(row_ids(&claim_lane(&store, &t, la, 0, 100)), ["p"]);
    let (since, at) = (Timestamp::from_millis(1_000), Timestamp::from_millis(2_000));
    store
        .set_lane_failing(&t, la, Some(since))
        .expect("failing");
    store.set_lane_unavailable(&t, la, at).expect("unavailable");
    let (lanes, _) = store.lanes_with_work(&t, 0).expect("lanes with work");
    assert_eq!(
        (lanes[0].failing_since, lanes[0].unavailable_since),
        (Some(since), Some(at))
    );
    let _ = store.release_slot(&t).expect("release");
    drop(store);

    // Connecting again is a no-op and keeps what was written.
    let again = schema.store(CommonOptions::default());
    assert_eq!(schema_version_of(&mut c), SCHEMA_VERSION.to_string());
    let l = &again.lanes(&a).expect("lanes")[0];
    assert_eq!(
        (l.failing_since, l.unavailable_since),
        (Some(since), Some(at))
    );
}

/// What each schema policy does on Postgres: only `Migrate` upgrades; `Existing` creates
/// nothing, not even the schema; neither changes what it refuses.
#[test]
fn postgres_schema_policies_refuse_what_they_may_not_change() {
    let Some(url) = pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let policy = |schema: SchemaPolicy| CommonOptions {
        schema,
        ..CommonOptions::default()
    };
    let connect = |name: &str, common: CommonOptions| {
        PgStore::connect(
            &url,
            PgOptions {
                schema: name.to_owned(),
                common,
                ..PgOptions::default()
            },
        )
        .map(drop)
    };
    // What `outbox-lanes migrate` reads first: the version, without creating anything.
    let version = |name: &str| {
        let opts = PgOptions {
            schema: name.to_owned(),
            ..PgOptions::default()
        };
        PgStore::schema_version(&url, &opts)
    };
    let old = Schema::new(&url, "pol4");
    let mut c = v4_schema(&old);
    assert_eq!(version(&old.name), Ok(Some(4)));
    for p in [SchemaPolicy::Create, SchemaPolicy::Existing] {
        assert_eq!(
            connect(&old.name, policy(p)),
            Err(StoreError::SchemaTooOld {
                found: 4,
                supported: SCHEMA_VERSION
            }),
            "{p:?}"
        );
        assert_eq!(schema_version_of(&mut c), "4");
    }
    let fresh = Schema::new(&url, "polnew");
    assert_eq!(version(&fresh.name), Ok(None));
    assert!(matches!(
        connect(&fresh.name, policy(SchemaPolicy::Existing)),
        Err(StoreError::NoSchema { .. })
    ));
    let mut raw = Client::connect(&url, NoTls).expect("raw client");
    let exists: bool = raw
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[&fresh.name],
        )
        .expect("namespace")
        .get(0);
    assert!(!exists, "Existing or schema_version created the schema");
    connect(&fresh.name, policy(SchemaPolicy::Create)).expect("create");
    assert_eq!(version(&fresh.name), Ok(Some(SCHEMA_VERSION)));
    for p in [
        SchemaPolicy::Migrate,
        SchemaPolicy::Create,
        SchemaPolicy::Existing,
    ] {
        connect(&fresh.name, policy(p)).expect("current schema");
    }
}

/// Version 7 → 8 (issue 39): the delivery log appears, empty, lanes get `NULL` in-flight
/// marks; the pending row stays, and a pass logs its delivery at once.
#[test]
fn postgres_v7_database_is_migrated_to_v8_with_a_delivery_log() {
    let Some(url) = pg_url() else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let schema = Schema::new(&url, "v7");
    let mut c = v6_schema(&schema);
    c.batch_execute(
        "ALTER TABLE ol_lanes ADD COLUMN failing_since BIGINT; \
         ALTER TABLE ol_lanes ADD COLUMN unavailable_since BIGINT; \
         UPDATE ol_meta SET value = '7' WHERE key = 'schema_version';",
    )
    .expect("v7");
    let store = schema.store(CommonOptions::default());
    assert_eq!(schema_version_of(&mut c), SCHEMA_VERSION.to_string());
    let one = |c: &mut Client, sql: &str| -> i64 { c.query_one(sql, &[]).expect(sql).get(0) };
    assert_eq!(one(&mut c, "SELECT count(*) FROM ol_delivery_log"), 0);
    assert_eq!(
        one(
            &mut c,
            "SELECT count(*) FROM ol_lanes WHERE in_flight_since IS NULL AND in_flight_unit IS NULL"
        ),
        1
    );
    let a = actor("alice");
    let t = acquire(&store, &a, "h", LEASE);
    let la = lane_of(&store, &a, A);
    let u = claim_lane(&store, &t, la, 0, 100).units[0].id;
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
