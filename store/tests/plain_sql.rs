//! The plain-SQL enqueue documented in SCHEMA.md works: rows written by another SQL library
//! are claimed by the store in order, on SQLite and Postgres.
#![allow(missing_docs, clippy::std_instead_of_core)]

mod common;

use common::*;
use outbox_lanes_store::sqlite::rusqlite;
use outbox_lanes_store::*;

const A: &str = "https://a.example/inbox";

#[test]
fn sqlite_plain_sql_enqueue_is_claimed_in_order() {
    run(Backend::SqliteFile, CommonOptions::default(), |h| {
        let path = h.sqlite_path().expect("file");
        let mut c = rusqlite::Connection::open(&path).expect("raw");
        let tx = c.transaction().expect("tx");
        let last: i64 = tx
            .query_row(
                "INSERT INTO ol_actors AS a (actor, last_seq) VALUES (?1, ?2) \
                 ON CONFLICT (actor) DO UPDATE SET last_seq = a.last_seq + excluded.last_seq RETURNING last_seq",
                rusqlite::params!["alice", 2],
                |r| r.get(0),
            )
            .expect("seq");
        for (k, id) in ["p0", "p1"].iter().enumerate() {
            let seq = last - 2 + 1 + k as i64;
            let row_ref: i64 = tx
                .query_row(
                    "INSERT INTO ol_rows (actor, row_id, seq, content_type, body, body_len, dedup_key, ordering_key, \
                     enqueued_at) VALUES ('alice', ?1, ?2, 'text/plain', ?3, 2, NULL, '', 0) RETURNING id",
                    rusqlite::params![id, seq, b"hi".to_vec()],
                    |r| r.get(0),
                )
                .expect("row");
            tx.execute(
                "INSERT INTO ol_lanes (actor, recipient, ordering_key) VALUES ('alice', ?1, '') \
                 ON CONFLICT (actor, recipient, ordering_key) DO NOTHING",
                [A],
            )
            .expect("lane");
            let lane: i64 = tx
                .query_row(
                    "SELECT id FROM ol_lanes WHERE actor = 'alice' AND recipient = ?1 AND ordering_key = ''",
                    [A],
                    |r| r.get(0),
                )
                .expect("lane id");
            let unit: i64 = tx
                .query_row(
                    "INSERT INTO ol_units (actor, row_ref, seq, lanes, pending) VALUES ('alice', ?1, ?2, 1, 1) RETURNING id",
                    rusqlite::params![row_ref, seq],
                    |r| r.get(0),
                )
                .expect("unit");
            tx.execute(
                "INSERT INTO ol_deliveries (unit_id, lane_id, seq) VALUES (?1, ?2, ?3)",
                rusqlite::params![unit, lane, seq],
            )
            .expect("delivery");
            tx.execute(
                "UPDATE ol_lanes SET tail_seq = max(tail_seq, ?2) WHERE id = ?1",
                rusqlite::params![lane, seq],
            )
            .expect("tail");
        }
        tx.commit().expect("commit");
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(&a, &[row("after", &[A])])
            .expect("store enqueue after");
        let t = acquire(s, &a, "h", LEASE);
        let (lanes, _) = s.lanes_with_work(&t, 0).expect("lanes");
        assert_eq!(lanes.len(), 1);
        let c = claim_lane(s, &t, lanes[0].lane, 0, 10);
        assert_eq!(row_ids(&c), ["p0", "p1", "after"]);
        assert_eq!(s.payload(c.units[0].id).expect("payload").body, b"hi");
    });
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_plain_sql_enqueue_is_claimed_in_order_and_wakes() {
    run(Backend::Postgres, CommonOptions::default(), |h| {
        let (url, schema) = h.pg().expect("pg");
        let w = h.store.watch().expect("watch");
        let seen = w.generation();
        let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).expect("raw");
        c.batch_execute(&format!("SET search_path TO {schema}"))
            .expect("path");
        let mut tx = c.transaction().expect("tx");
        let last: i64 = tx
            .query_one(
                "INSERT INTO ol_actors AS a (actor, last_seq) VALUES ($1, $2) \
                 ON CONFLICT (actor) DO UPDATE SET last_seq = a.last_seq + excluded.last_seq RETURNING last_seq",
                &[&"alice", &1i64],
            )
            .expect("seq")
            .get(0);
        let row_ref: i64 = tx
            .query_one(
                "INSERT INTO ol_rows (actor, row_id, seq, content_type, body, body_len, dedup_key, ordering_key, enqueued_at) \
                 VALUES ('alice', 'p0', $1, 'text/plain', $2, 2, NULL, '', 0) RETURNING id",
                &[&last, &b"hi".to_vec()],
            )
            .expect("row")
            .get(0);
        tx.execute(
            "INSERT INTO ol_lanes (actor, recipient, ordering_key) VALUES ('alice', $1, '') \
             ON CONFLICT (actor, recipient, ordering_key) DO NOTHING",
            &[&A],
        )
        .expect("lane");
        let lane: i64 = tx
            .query_one(
                "SELECT id FROM ol_lanes WHERE actor = 'alice' AND recipient = $1 AND ordering_key = ''",
                &[&A],
            )
            .expect("lane id")
            .get(0);
        let unit: i64 = tx
            .query_one(
                "INSERT INTO ol_units (actor, row_ref, seq, lanes, pending) VALUES ('alice', $1, $2, 1, 1) RETURNING id",
                &[&row_ref, &last],
            )
            .expect("unit")
            .get(0);
        tx.execute(
            "INSERT INTO ol_deliveries (unit_id, lane_id, seq) VALUES ($1, $2, $3)",
            &[&unit, &lane, &last],
        )
        .expect("delivery");
        tx.execute(
            "UPDATE ol_lanes SET tail_seq = GREATEST(tail_seq, $2) WHERE id = $1",
            &[&lane, &last],
        )
        .expect("tail");
        tx.execute(
            "SELECT pg_notify('outbox_lanes_' || $1, 'alice')",
            &[&schema],
        )
        .expect("notify");
        tx.commit().expect("commit");
        assert_ne!(
            w.wait_timeout(seen, std::time::Duration::from_secs(10)),
            seen,
            "NOTIFY from plain SQL wakes the store's watcher"
        );
        let s = &*h.store;
        let a = actor("alice");
        s.enqueue(&a, &[row("after", &[A])])
            .expect("store enqueue after");
        let t = acquire(s, &a, "h", LEASE);
        let c = claim_lane(s, &t, outbox_lanes_store::StoreLaneId(lane), 0, 10);
        assert_eq!(row_ids(&c), ["p0", "after"]);
        // The store's sequence for explicit ids must not collide with plain-SQL ids.
        assert_ne!(c.units[0].id, c.units[1].id);
    });
}
