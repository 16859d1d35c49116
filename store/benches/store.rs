//! Store benchmarks: enqueue rows/s (one row per transaction, 100 per transaction) and the
//! claim+ack cost per unit, compared in the same run with a bare `INSERT` + `DELETE` of the
//! same rows on the same database (the floor of any durable queue).
//!
//! Run: `cargo bench -p outbox-lanes-store --all-features --bench store`
//! (set `OUTBOX_LANES_TEST_PG` to include Postgres). It prints figures; it asserts nothing.
#![allow(missing_docs, clippy::std_instead_of_core, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_lanes_core::{ActorId, Seq};
use outbox_lanes_store::*;

const SINGLE: usize = 1_000;
const BATCHED: usize = 20_000;
const BATCH: usize = 100;
const LANES: usize = 10;
const BODY: usize = 512;

fn rows(prefix: &str, n: usize, start: usize) -> Vec<NewRow> {
    (start..start + n)
        .map(|k| NewRow {
            id: format!("{prefix}-{k}"),
            body: vec![b'x'; BODY],
            content_type: "application/json".into(),
            recipients: vec![format!("https://host{}.example/inbox", k % LANES)],
            ..NewRow::default()
        })
        .collect()
}

fn per_sec(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn us_per(n: usize, d: Duration) -> f64 {
    d.as_secs_f64() * 1e6 / n as f64
}

struct Figures {
    enqueue_single: f64,
    enqueue_batched: f64,
    enqueue_us: f64,
    claim_ack_us: f64,
    bare_insert_us: f64,
    bare_delete_us: f64,
    bare_single: f64,
}

fn outbox(store: &dyn Store, tag: &str) -> Figures {
    let a = ActorId::new(format!("bench-{tag}"));
    let t0 = Instant::now();
    for row in rows("single", SINGLE, 0) {
        store.enqueue(&a, std::slice::from_ref(&row)).unwrap();
    }
    let single = t0.elapsed();

    // Drain the singles so the measured drain below sees exactly BATCHED units.
    drain(store, &a);

    let t0 = Instant::now();
    for k in (0..BATCHED).step_by(BATCH) {
        store.enqueue(&a, &rows("batched", BATCH, k)).unwrap();
    }
    let batched = t0.elapsed();

    let t0 = Instant::now();
    let n = drain(store, &a);
    let claim_ack = t0.elapsed();
    assert_eq!(n, BATCHED);
    Figures {
        enqueue_single: per_sec(SINGLE, single),
        enqueue_batched: per_sec(BATCHED, batched),
        enqueue_us: us_per(BATCHED, batched),
        claim_ack_us: us_per(BATCHED, claim_ack),
        bare_insert_us: 0.0,
        bare_delete_us: 0.0,
        bare_single: 0.0,
    }
}

/// One pass: claim BATCH/LANES units at the head of each lane, ack them in one transaction,
/// until nothing is left. Returns the units acked.
fn drain(store: &dyn Store, a: &ActorId) -> usize {
    let t = match store
        .acquire_slot(a, "bench", Duration::from_secs(600))
        .unwrap()
    {
        Acquire::Acquired(t) => t,
        Acquire::Held => panic!("slot held"),
    };
    let mut acked = 0;
    loop {
        let (lanes, _) = store.lanes_with_work(&t, 0).unwrap();
        if lanes.is_empty() {
            break;
        }
        let claims: Vec<LaneClaim> = lanes
            .iter()
            .map(|l| LaneClaim {
                lane: l.lane,
                from: Seq(0),
                limit: (BATCH / LANES) as u32,
            })
            .collect();
        // One ack transaction per claim round, as the group-committing AckWriter does:
        // BATCH units across the lanes, the same batch size as the bare DELETE below.
        let acks: Vec<_> = store
            .claim(&t, &claims)
            .unwrap()
            .iter()
            .flat_map(|lane| lane.units.iter().map(move |u| (u.id, lane.lane)))
            .collect();
        acked += acks.len();
        if !acks.is_empty() {
            store.ack(&t, &acks).unwrap();
        }
    }
    let _ = store.release_slot(&t).unwrap();
    acked
}

fn report(name: &str, f: &Figures) {
    let bare = f.bare_insert_us + f.bare_delete_us;
    println!("{name}:");
    println!(
        "  enqueue, 1 row per transaction:    {:>10.0} rows/s (bare INSERT, 1 per transaction: {:.0} rows/s)",
        f.enqueue_single, f.bare_single
    );
    println!(
        "  enqueue, {BATCH} rows per transaction:  {:>10.0} rows/s",
        f.enqueue_batched
    );
    println!(
        "  per unit: enqueue {:.1} us + claim+ack {:.1} us = {:.1} us",
        f.enqueue_us,
        f.claim_ack_us,
        f.enqueue_us + f.claim_ack_us
    );
    println!(
        "  bare INSERT {:.1} us + DELETE {:.1} us = {:.1} us per row ({BATCH} per transaction)",
        f.bare_insert_us, f.bare_delete_us, bare
    );
    println!(
        "  claim+ack vs bare DELETE: {:.2}x; enqueue+claim+ack vs bare INSERT+DELETE: {:.2}x",
        f.claim_ack_us / f.bare_delete_us,
        (f.enqueue_us + f.claim_ack_us) / bare
    );
}

fn sqlite(synchronous: Synchronous) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.db");
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(
            &path,
            SqliteOptions {
                synchronous,
                ..SqliteOptions::default()
            },
        )
        .unwrap(),
    );
    let mut f = outbox(&*store, "sqlite");
    // The floor on the same file with the same pragmas: a plain table, same rows, same batches.
    let mut c = outbox_lanes_store::sqlite::rusqlite::Connection::open(&path).unwrap();
    c.pragma_update(
        None,
        "synchronous",
        if synchronous == Synchronous::Full {
            "FULL"
        } else {
            "NORMAL"
        },
    )
    .unwrap();
    c.execute_batch("CREATE TABLE bare (id INTEGER PRIMARY KEY, actor TEXT NOT NULL, row_id TEXT NOT NULL, body BLOB NOT NULL)")
        .unwrap();
    let t0 = Instant::now();
    for r in rows("bare-single", SINGLE, 0) {
        c.execute(
            "INSERT INTO bare (actor, row_id, body) VALUES (?1, ?2, ?3)",
            outbox_lanes_store::sqlite::rusqlite::params!["bench", r.id, r.body],
        )
        .unwrap();
    }
    f.bare_single = per_sec(SINGLE, t0.elapsed());
    c.execute_batch("DELETE FROM bare").unwrap();
    let all = rows("bare", BATCHED, 0);
    let t0 = Instant::now();
    for chunk in all.chunks(BATCH) {
        let tx = c.transaction().unwrap();
        {
            let mut st = tx
                .prepare_cached("INSERT INTO bare (actor, row_id, body) VALUES (?1, ?2, ?3)")
                .unwrap();
            for r in chunk {
                st.execute(outbox_lanes_store::sqlite::rusqlite::params![
                    "bench", r.id, r.body
                ])
                .unwrap();
            }
        }
        tx.commit().unwrap();
    }
    f.bare_insert_us = us_per(BATCHED, t0.elapsed());
    let t0 = Instant::now();
    loop {
        let tx = c.transaction().unwrap();
        let ids: Vec<i64> = {
            let mut st = tx
                .prepare_cached("SELECT id FROM bare ORDER BY id LIMIT ?1")
                .unwrap();
            st.query_map([BATCH as i64], |r| r.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };
        if ids.is_empty() {
            break;
        }
        {
            let mut st = tx.prepare_cached("DELETE FROM bare WHERE id = ?1").unwrap();
            for id in ids {
                st.execute([id]).unwrap();
            }
        }
        tx.commit().unwrap();
    }
    f.bare_delete_us = us_per(BATCHED, t0.elapsed());
    report(&format!("SQLite file, synchronous={synchronous:?}"), &f);
}

#[cfg(feature = "postgres")]
fn postgres(url: &str) {
    let schema = format!("ol_bench_{}", std::process::id());
    let store: Arc<dyn Store> = Arc::new(
        PgStore::connect(
            url,
            PgOptions {
                schema: schema.clone(),
                ..PgOptions::default()
            },
        )
        .unwrap(),
    );
    let mut f = outbox(&*store, "pg");
    let mut c = ::postgres::Client::connect(url, ::postgres::NoTls).unwrap();
    c.batch_execute(&format!(
        "SET search_path TO {schema}; CREATE TABLE bare (id BIGSERIAL PRIMARY KEY, actor TEXT NOT NULL, row_id TEXT NOT NULL, body BYTEA NOT NULL)"
    ))
    .unwrap();
    let single = c
        .prepare("INSERT INTO bare (actor, row_id, body) VALUES ('bench', $1, $2)")
        .unwrap();
    let t0 = Instant::now();
    for r in rows("bare-single", SINGLE, 0) {
        c.execute(&single, &[&r.id, &r.body]).unwrap();
    }
    f.bare_single = per_sec(SINGLE, t0.elapsed());
    c.batch_execute("DELETE FROM bare").unwrap();
    let all = rows("bare", BATCHED, 0);
    let ins = c.prepare("INSERT INTO bare (actor, row_id, body) SELECT 'bench', * FROM unnest($1::text[], $2::bytea[])").unwrap();
    let t0 = Instant::now();
    for chunk in all.chunks(BATCH) {
        let ids: Vec<&str> = chunk.iter().map(|r| r.id.as_str()).collect();
        let bodies: Vec<&[u8]> = chunk.iter().map(|r| r.body.as_slice()).collect();
        let mut tx = c.transaction().unwrap();
        tx.execute(&ins, &[&ids, &bodies]).unwrap();
        tx.commit().unwrap();
    }
    f.bare_insert_us = us_per(BATCHED, t0.elapsed());
    let sel = c
        .prepare("SELECT id FROM bare ORDER BY id LIMIT $1")
        .unwrap();
    let del = c.prepare("DELETE FROM bare WHERE id = ANY($1)").unwrap();
    let t0 = Instant::now();
    loop {
        let mut tx = c.transaction().unwrap();
        let ids: Vec<i64> = tx
            .query(&sel, &[&(BATCH as i64)])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        if ids.is_empty() {
            break;
        }
        tx.execute(&del, &[&ids]).unwrap();
        tx.commit().unwrap();
    }
    f.bare_delete_us = us_per(BATCHED, t0.elapsed());
    report("Postgres (127.0.0.1)", &f);
    drop(store);
    let _ = c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"));
}

fn main() {
    println!(
        "outbox-lanes-store bench: {SINGLE} single-row enqueues, {BATCHED} units ({BATCH} per transaction, {LANES} lanes, {BODY}-byte payloads)"
    );
    sqlite(Synchronous::Full);
    sqlite(Synchronous::Normal);
    #[cfg(feature = "postgres")]
    match std::env::var("OUTBOX_LANES_TEST_PG") {
        Ok(url) if !url.is_empty() => postgres(&url),
        _ => println!("Postgres: skipped (OUTBOX_LANES_TEST_PG not set)"),
    }
}
