//! The plain-SQL enqueue documented in SCHEMA.md works: rows written by another SQL library
//! (all three shapes: one recipient with its payload inline, a joined row, a row with several
//! recipients sharing one payload) are claimed by the store in order, on SQLite and Postgres;
//! the documented duplicate check and dedup query see what the store wrote.
#![allow(missing_docs, clippy::std_instead_of_core)]

mod common;

use common::*;
use outbox_lanes_core::UnitId;
use outbox_lanes_store::sqlite::rusqlite;
use outbox_lanes_store::*;

const A: &str = "https://a.example/inbox";
const B: &str = "https://b.example/inbox";

/// A value bound to a statement, whatever the driver.
#[derive(Clone, Debug)]
enum V {
    I(i64),
    T(String),
    B(Vec<u8>),
}

fn t(s: &str) -> V {
    V::T(s.to_string())
}

/// The statements of SCHEMA.md are written with `$n` placeholders; SQLite gets `?n`.
trait Raw {
    /// The first column of every row.
    fn ints(&mut self, sql: &str, p: &[V]) -> Vec<i64>;
    /// SQLite spells `GREATEST` as the two-argument `max`.
    fn greatest(&self) -> &'static str;
}

struct Lite<'a>(&'a rusqlite::Transaction<'a>);

impl Raw for Lite<'_> {
    fn ints(&mut self, sql: &str, p: &[V]) -> Vec<i64> {
        let sql = sql.replace('$', "?");
        let vals: Vec<rusqlite::types::Value> = p
            .iter()
            .map(|v| match v {
                V::I(i) => rusqlite::types::Value::Integer(*i),
                V::T(s) => rusqlite::types::Value::Text(s.clone()),
                V::B(b) => rusqlite::types::Value::Blob(b.clone()),
            })
            .collect();
        let mut st = self.0.prepare(&sql).expect("prepare");
        let n = st.column_count();
        st.query_map(rusqlite::params_from_iter(vals), |r| {
            if n == 0 { Ok(0) } else { r.get::<_, i64>(0) }
        })
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
    }

    fn greatest(&self) -> &'static str {
        "max"
    }
}

#[cfg(feature = "postgres")]
struct Pg<'a, 'b>(&'a mut ::postgres::Transaction<'b>);

#[cfg(feature = "postgres")]
impl Raw for Pg<'_, '_> {
    fn ints(&mut self, sql: &str, p: &[V]) -> Vec<i64> {
        let boxed: Vec<Box<dyn ::postgres::types::ToSql + Sync>> = p
            .iter()
            .map(|v| -> Box<dyn ::postgres::types::ToSql + Sync> {
                match v {
                    V::I(i) => Box::new(*i),
                    V::T(s) => Box::new(s.clone()),
                    V::B(b) => Box::new(b.clone()),
                }
            })
            .collect();
        let refs: Vec<&(dyn ::postgres::types::ToSql + Sync)> =
            boxed.iter().map(|b| b.as_ref()).collect();
        self.0
            .query(sql, &refs)
            .expect("query")
            .iter()
            .map(|r| {
                if r.is_empty() {
                    0
                } else {
                    // `SELECT 1` is an int4, ids are int8.
                    r.try_get::<_, i64>(0)
                        .or_else(|_| r.try_get::<_, i32>(0).map(i64::from))
                        .expect("an integer column")
                }
            })
            .collect()
    }

    fn greatest(&self) -> &'static str {
        "GREATEST"
    }
}

/// SCHEMA.md step 3: the lane of a recipient, created on first use.
fn lane(c: &mut dyn Raw, actor: &str, recipient: &str) -> i64 {
    c.ints(
        "INSERT INTO ol_lanes (actor, recipient, ordering_key) VALUES ($1, $2, '') \
         ON CONFLICT (actor, recipient, ordering_key) DO NOTHING",
        &[t(actor), t(recipient)],
    );
    c.ints(
        "SELECT id FROM ol_lanes WHERE actor = $1 AND recipient = $2 AND ordering_key = ''",
        &[t(actor), t(recipient)],
    )[0]
}

/// SCHEMA.md step 2: does the actor already have this row id, in either place?
fn taken(c: &mut dyn Raw, actor: &str, row_id: &str) -> bool {
    !c.ints(
        "SELECT 1 FROM ol_units WHERE actor = $1 AND row_id = $2 \
         UNION ALL SELECT 1 FROM ol_rows WHERE actor = $1 AND row_id = $2",
        &[t(actor), t(row_id)],
    )
    .is_empty()
}

/// The documented dedup query: is a unit with this key pending for this recipient?
fn dedup_pending(c: &mut dyn Raw, actor: &str, dedup_key: &str, recipient: &str) -> bool {
    !c.ints(
        "SELECT 1 FROM ol_units h LEFT JOIN ol_rows r ON r.id = h.row_ref \
         JOIN ol_units d ON d.id = h.id OR d.unit_id = h.id \
         JOIN ol_lanes l ON l.id = d.lane_id \
         WHERE h.unit_id IS NULL AND h.actor = $1 AND coalesce(h.dedup_key, r.dedup_key) = $2 \
           AND l.recipient = $3 AND d.state = 0",
        &[t(actor), t(dedup_key), t(recipient)],
    )
    .is_empty()
}

/// Enqueues, with the SQL of SCHEMA.md, for actor `alice`:
/// `p0` to A (one recipient: payload inline), `p1` joined to A and B, `p2` to A and B (payload
/// shared in `ol_rows`). Returns the unit id of `p0`.
fn plain_enqueue(c: &mut dyn Raw) -> i64 {
    let last = c.ints(
        "INSERT INTO ol_actors AS a (actor, last_seq) VALUES ($1, $2) \
         ON CONFLICT (actor) DO UPDATE SET last_seq = a.last_seq + excluded.last_seq RETURNING last_seq",
        &[t("alice"), V::I(3)],
    )[0];
    let seq = |k: i64| last - 3 + 1 + k;
    for id in ["p0", "p1", "p2"] {
        assert!(!taken(c, "alice", id), "{id} is new");
    }
    let (la, lb) = (lane(c, "alice", A), lane(c, "alice", B));
    let head = "INSERT INTO ol_units (actor, lane_id, seq, lanes, pending, row_id, content_type, body, \
                body_len, dedup_key, ordering_key, enqueued_at, headers) \
                VALUES ($1, $2, $3, $4, $4, $5, 'text/plain', $6, $7, NULL, '', 0, $8) RETURNING id";
    // 4a: one recipient.
    let p0 = c.ints(
        head,
        &[
            t("alice"),
            V::I(la),
            V::I(seq(0)),
            V::I(1),
            t("p0"),
            V::B(b"zero".to_vec()),
            V::I(4),
            t("X-A: 1"),
        ],
    )[0];
    // 4b: joined, two lanes.
    let p1 = c.ints(
        head,
        &[
            t("alice"),
            V::I(la),
            V::I(seq(1)),
            V::I(2),
            t("p1"),
            V::B(b"one".to_vec()),
            V::I(3),
            t("Authorization: Bearer j"),
        ],
    )[0];
    c.ints(
        "INSERT INTO ol_units (unit_id, actor, lane_id, seq) VALUES ($1, $2, $3, $4)",
        &[V::I(p1), t("alice"), V::I(lb), V::I(seq(1))],
    );
    // 4c: two recipients, not joined.
    let row_ref = c.ints(
        "INSERT INTO ol_rows (actor, row_id, seq, content_type, body, body_len, dedup_key, ordering_key, \
         enqueued_at, headers) VALUES ($1, $2, $3, 'text/plain', $4, 3, NULL, '', 0, $5) RETURNING id",
        &[
            t("alice"),
            t("p2"),
            V::I(seq(2)),
            V::B(b"two".to_vec()),
            t("X-B: 2\nX-C:3"),
        ],
    )[0];
    for l in [la, lb] {
        c.ints(
            "INSERT INTO ol_units (actor, lane_id, seq, row_ref) VALUES ($1, $2, $3, $4)",
            &[t("alice"), V::I(l), V::I(seq(2)), V::I(row_ref)],
        );
    }
    // 5: the tails.
    let tail = format!(
        "UPDATE ol_lanes SET tail_seq = {}(tail_seq, $2) WHERE id = $1",
        c.greatest()
    );
    for l in [la, lb] {
        c.ints(&tail, &[V::I(l), V::I(seq(2))]);
    }
    p0
}

/// What every backend must show after `plain_enqueue` committed.
fn check(h: &H, p0: i64) {
    let s = &*h.store;
    let a = actor("alice");
    // The store refuses the plain-SQL row ids, inline or shared.
    for id in ["p0", "p2"] {
        assert_eq!(
            s.enqueue(&a, &[row(id, &[A])]).expect_err("duplicate"),
            EnqueueError::DuplicateRowId { row: id.into() }
        );
    }
    s.enqueue(&a, &[row("after", &[A])])
        .expect("store enqueue after");
    let t = acquire(s, &a, "h", LEASE);
    let ca = claim_lane(s, &t, lane_of(s, &a, A), 0, 10);
    assert_eq!(row_ids(&ca), ["p0", "p1", "p2", "after"]);
    assert_eq!(ca.units[0].id, UnitId(p0 as u64));
    assert_eq!(ca.units[1].slots.len(), 2, "p1 is one unit on two lanes");
    let cb = claim_lane(s, &t, lane_of(s, &a, B), 0, 10);
    assert_eq!(row_ids(&cb), ["p1", "p2"]);
    assert_eq!(cb.units[0].id, ca.units[1].id, "the joined unit's id");
    assert_ne!(cb.units[1].id, ca.units[2].id, "p2: one unit per recipient");
    let bodies: Vec<Vec<u8>> = ca
        .units
        .iter()
        .map(|u| s.payload(u.id).expect("payload").body)
        .collect();
    assert_eq!(
        bodies[..3],
        [b"zero".to_vec(), b"one".to_vec(), b"two".to_vec()]
    );
    // The headers column in the documented format.
    let headers: Vec<Vec<(String, String)>> = ca
        .units
        .iter()
        .map(|u| s.payload(u.id).expect("payload").headers)
        .collect();
    let h = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    };
    assert_eq!(
        headers,
        [
            h(&[("X-A", "1")]),
            h(&[("Authorization", "Bearer j")]),
            h(&[("X-B", "2"), ("X-C", "3")]),
            h(&[]),
        ]
    );
    // Plain-SQL ids and the store's own never collide.
    let mut ids: Vec<UnitId> = ca.units.iter().chain(&cb.units).map(|u| u.id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 5);
}

#[test]
fn sqlite_plain_sql_enqueue_is_claimed_in_order() {
    run(Backend::SqliteFile, CommonOptions::default(), |h| {
        let path = h.sqlite_path().expect("file");
        let mut conn = rusqlite::Connection::open(&path).expect("raw");
        let tx = conn.transaction().expect("tx");
        let p0 = plain_enqueue(&mut Lite(&tx));
        tx.commit().expect("commit");
        check(h, p0);
        // The documented checks see what the store wrote (inline and shared).
        let s = &*h.store;
        let mut with_key = row("k", &[A]);
        with_key.dedup_key = Some("key".into());
        s.enqueue(&actor("alice"), &[with_key]).expect("enqueue");
        let tx = conn.transaction().expect("tx");
        let mut c = Lite(&tx);
        assert!(taken(&mut c, "alice", "after"));
        assert!(taken(&mut c, "alice", "p2"));
        assert!(!taken(&mut c, "alice", "nope"));
        assert!(!taken(&mut c, "bob", "after"));
        assert!(dedup_pending(&mut c, "alice", "key", A));
        assert!(!dedup_pending(&mut c, "alice", "key", B));
        assert!(!dedup_pending(&mut c, "alice", "other", A));
    });
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_plain_sql_enqueue_is_claimed_in_order_and_wakes() {
    run(Backend::Postgres, CommonOptions::default(), |h| {
        let (url, schema) = h.pg().expect("pg");
        let w = h.store.watch().expect("watch");
        let seen = w.generation();
        let mut conn = pg_client(&url, &schema);
        let mut tx = conn.transaction().expect("tx");
        let p0 = plain_enqueue(&mut Pg(&mut tx));
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
        check(h, p0);
        let s = &*h.store;
        let mut with_key = row("k", &[A, B]);
        with_key.dedup_key = Some("key".into());
        s.enqueue(&actor("alice"), &[with_key]).expect("enqueue");
        let mut tx = conn.transaction().expect("tx");
        let mut c = Pg(&mut tx);
        assert!(taken(&mut c, "alice", "after"));
        assert!(taken(&mut c, "alice", "k"));
        assert!(!taken(&mut c, "alice", "nope"));
        assert!(dedup_pending(&mut c, "alice", "key", A));
        assert!(dedup_pending(&mut c, "alice", "key", B));
        assert!(!dedup_pending(&mut c, "alice", "other", A));
    });
}

/// A head written by hand with only the columns SQL makes mandatory (no row id, length or
/// time): the store claims it without failing (or panicking), and can dead-letter it.
fn sparse_head(h: &H, c: &mut dyn Raw) {
    let s = &*h.store;
    let a = actor("alice");
    s.enqueue(&a, &[row("first", &[A])]).expect("enqueue");
    let la = lane_of(s, &a, A);
    c.ints(
        "INSERT INTO ol_units (actor, lane_id, seq, content_type, body) \
         VALUES ('alice', $1, 99, 'text/plain', $2)",
        &[V::I(la.0), V::B(b"hand".to_vec())],
    );
    let t = acquire(s, &a, "h", LEASE);
    let claimed = claim_lane(s, &t, la, 0, 10);
    assert_eq!(claimed.units.len(), 2);
    let sparse = &claimed.units[1];
    assert_eq!(sparse.row_id, "");
    s.dead_letter(
        &t,
        &DeadLetterRequest {
            unit: sparse.id,
            lane: la,
            reason: outbox_lanes_core::DeadReason::Permanent,
            status: Some(400),
            error: None,
            at: now(),
        },
    )
    .expect("dead letter");
    let dl = s.dead_letters(Some(&a)).expect("dead letters");
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].row_id, format!("unit-{}", sparse.id.0));
    assert_eq!(row_ids(&claim_lane(s, &t, la, 0, 10)), ["first"]);
}

#[test]
fn sqlite_sparse_hand_written_head() {
    run(Backend::SqliteFile, CommonOptions::default(), |h| {
        let path = h.sqlite_path().expect("file");
        // Each statement committed on its own, so the store sees it at once.
        struct Auto(rusqlite::Connection);
        impl Raw for Auto {
            fn ints(&mut self, sql: &str, p: &[V]) -> Vec<i64> {
                let tx = self.0.transaction().expect("tx");
                let out = Lite(&tx).ints(sql, p);
                tx.commit().expect("commit");
                out
            }
            fn greatest(&self) -> &'static str {
                "max"
            }
        }
        let conn = rusqlite::Connection::open(&path).expect("raw");
        sparse_head(h, &mut Auto(conn));
    });
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_sparse_hand_written_head() {
    run(Backend::Postgres, CommonOptions::default(), |h| {
        let (url, schema) = h.pg().expect("pg");
        let conn = pg_client(&url, &schema);
        // Autocommitted statements: a transaction of one statement each.
        struct Auto(::postgres::Client);
        impl Raw for Auto {
            fn ints(&mut self, sql: &str, p: &[V]) -> Vec<i64> {
                let mut tx = self.0.transaction().expect("tx");
                let out = Pg(&mut tx).ints(sql, p);
                tx.commit().expect("commit");
                out
            }
            fn greatest(&self) -> &'static str {
                "GREATEST"
            }
        }
        sparse_head(h, &mut Auto(conn));
    });
}
