//! Store benchmarks: enqueue rows/s (one row per transaction, 100 per transaction) and the
//! claim+ack cost per unit, compared in the same run with a bare `INSERT` + `DELETE` of the
//! same rows on the same database (the floor of any durable queue).
//!
//! The outbox and the bare table are measured in alternating steps (one enqueue, one bare
//! insert; one claim+ack round, one bare delete batch…), so a disk that slows down or speeds
//! up during the run (a shared machine) weighs on both sides alike.
//!
//! A third side, measured in the same alternation, is the *one-table floor*: the bare table
//! plus the lane and seq of each row and the two indexes that any lane-ordered outbox refusing
//! duplicate row ids must keep (`UNIQUE (actor, row_id)`, and `(lane, seq, id)` for lane-head
//! reads), still one `INSERT` and one `DELETE` per row. It shows how much of the gap to the
//! bare table no schema can close.
//!
//! Both sides batch alike: one transaction per 100 rows (or per single row) on the insert
//! side, one transaction per claim+ack round of 100 units and per 100-row bare delete.
//!
//! Run: `cargo bench -p outbox-lanes-store --all-features --bench store`
//! (set `OUTBOX_LANES_TEST_PG` to include Postgres; `OUTBOX_LANES_BENCH_ONLY=full,normal,pg,sqlx`
//! picks a subset; `OUTBOX_LANES_BENCH_ROUNDS=n` runs the chosen cases n times, alternating,
//! e.g. PgStore and SqlxPgStore one after the other, n times). It prints figures; it asserts
//! nothing.
#![allow(missing_docs, clippy::unwrap_used)]

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

/// The floor: a plain table with the same rows, inserted and deleted in the same batches.
trait Bare {
    fn insert(&mut self, rows: &[NewRow]);
    /// Deletes up to `n` rows from the head; returns how many.
    fn delete_head(&mut self, n: usize) -> usize;
}

#[derive(Default)]
struct Times {
    enqueue_single: Duration,
    bare_single: Duration,
    enqueue_batched: Duration,
    bare_insert: Duration,
    claim_ack: Duration,
    bare_delete: Duration,
    floor_insert: Duration,
    floor_delete: Duration,
    /// Per 100-unit step, for medians: a burst of disk latency on a shared machine moves a
    /// sum a lot and a median little.
    steps: Steps,
}

#[derive(Default)]
struct Steps {
    enqueue: Vec<Duration>,
    bare_insert: Vec<Duration>,
    floor_insert: Vec<Duration>,
    claim_ack: Vec<Duration>,
    bare_delete: Vec<Duration>,
    floor_delete: Vec<Duration>,
}

/// Median per-unit time of full 100-unit steps, in microseconds.
fn median_us(steps: &[Duration]) -> f64 {
    let mut v: Vec<Duration> = steps.to_vec();
    v.sort();
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2].as_secs_f64() * 1e6 / BATCH as f64
}

fn measure(store: &dyn Store, bare: &mut dyn Bare, floor: &mut dyn Bare, tag: &str) -> Times {
    let a = ActorId::new(format!("bench-{tag}"));
    let mut t = Times::default();
    for (k, row) in rows("single", SINGLE, 0).into_iter().enumerate() {
        let t0 = Instant::now();
        store.enqueue(&a, std::slice::from_ref(&row)).unwrap();
        t.enqueue_single += t0.elapsed();
        let bare_row = NewRow {
            id: format!("bare-single-{k}"),
            ..row
        };
        let t0 = Instant::now();
        bare.insert(std::slice::from_ref(&bare_row));
        t.bare_single += t0.elapsed();
    }
    // Empty both, untimed, so the measured drain sees exactly BATCHED units.
    let slot = acquire(store, &a);
    while claim_ack_round(store, &slot, &mut Cursors::default()) > 0 {}
    while bare.delete_head(BATCH) > 0 {}

    for k in (0..BATCHED).step_by(BATCH) {
        let batch = rows("batched", BATCH, k);
        let t0 = Instant::now();
        store.enqueue(&a, &batch).unwrap();
        t.enqueue_batched += t0.elapsed();
        t.steps.enqueue.push(t0.elapsed());
        let batch = rows("bare", BATCH, k);
        let t0 = Instant::now();
        bare.insert(&batch);
        t.bare_insert += t0.elapsed();
        t.steps.bare_insert.push(t0.elapsed());
        let batch = rows("floor", BATCH, k);
        let t0 = Instant::now();
        floor.insert(&batch);
        t.floor_insert += t0.elapsed();
        t.steps.floor_insert.push(t0.elapsed());
    }
    let (mut acked, mut deleted, mut floored) = (0, 0, 0);
    let mut cursors = Cursors::default();
    loop {
        let t0 = Instant::now();
        let n = claim_ack_round(store, &slot, &mut cursors);
        let d = t0.elapsed();
        t.claim_ack += d;
        if n == BATCH {
            t.steps.claim_ack.push(d);
        }
        let t0 = Instant::now();
        let m = bare.delete_head(BATCH);
        let d = t0.elapsed();
        t.bare_delete += d;
        if m == BATCH {
            t.steps.bare_delete.push(d);
        }
        let t0 = Instant::now();
        let f = floor.delete_head(BATCH);
        let d = t0.elapsed();
        t.floor_delete += d;
        if f == BATCH {
            t.steps.floor_delete.push(d);
        }
        acked += n;
        deleted += m;
        floored += f;
        if n == 0 && m == 0 && f == 0 {
            break;
        }
    }
    assert_eq!((acked, deleted, floored), (BATCHED, BATCHED, BATCHED));
    let _ = store.release_slot(&slot).unwrap();
    t
}

fn acquire(store: &dyn Store, a: &ActorId) -> SlotToken {
    match store
        .acquire_slot(a, "bench", Duration::from_secs(3600))
        .unwrap()
    {
        SlotAcquisition::Acquired(t) => t,
        SlotAcquisition::Held => panic!("slot held"),
    }
}

/// What a pass keeps between claims: the lanes it is reading and, per lane, the cursor its
/// next claim starts from (a pass's scheduler advances it past what it admitted; it lists the
/// lanes with work once, and again only when every lane it knows is exhausted).
#[derive(Default)]
struct Cursors {
    lanes: Vec<(StoreLaneId, Seq)>,
}

/// One round of a pass: BATCH/LANES units at the head of each lane, from its cursor, acked in
/// one transaction (as the group-committing AckWriter does). Returns the units acked.
fn claim_ack_round(store: &dyn Store, slot: &SlotToken, cur: &mut Cursors) -> usize {
    if cur.lanes.is_empty() {
        let (lanes, _) = store.lanes_with_work(slot, 0).unwrap();
        cur.lanes = lanes.iter().map(|l| (l.lane, Seq(0))).collect();
        if cur.lanes.is_empty() {
            return 0;
        }
    }
    let claims: Vec<ClaimRange> = cur
        .lanes
        .iter()
        .map(|&(lane, from)| ClaimRange {
            lane,
            from,
            limit: (BATCH / LANES) as u32,
        })
        .collect();
    let claimed = store.claim(slot, &claims).unwrap();
    let mut acks = Vec::new();
    for lane in &claimed {
        acks.extend(lane.units.iter().map(|u| (u.id, lane.lane)));
        if let Some(c) = cur.lanes.iter_mut().find(|c| c.0 == lane.lane) {
            if let Some(last) = lane.units.last() {
                c.1 = Seq(last.seq.0 + 1);
            }
        }
    }
    let exhausted: Vec<StoreLaneId> = claimed
        .iter()
        .filter(|l| l.exhausted)
        .map(|l| l.lane)
        .collect();
    cur.lanes.retain(|c| !exhausted.contains(&c.0));
    if !acks.is_empty() {
        store.ack(slot, &acks).unwrap();
    }
    acks.len()
}

fn us_per(n: usize, d: Duration) -> f64 {
    d.as_secs_f64() * 1e6 / n as f64
}

fn per_sec(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn report(name: &str, t: &Times) {
    let enq = us_per(BATCHED, t.enqueue_batched);
    let ca = us_per(BATCHED, t.claim_ack);
    let bi = us_per(BATCHED, t.bare_insert);
    let bd = us_per(BATCHED, t.bare_delete);
    println!("{name}:");
    println!(
        "  1 row per transaction:    enqueue {:>7.0} rows/s   bare INSERT {:>7.0} rows/s   ({:.2}x the time)",
        per_sec(SINGLE, t.enqueue_single),
        per_sec(SINGLE, t.bare_single),
        t.enqueue_single.as_secs_f64() / t.bare_single.as_secs_f64()
    );
    println!(
        "  {BATCH} rows per transaction:  enqueue {:>7.0} rows/s   bare INSERT {:>7.0} rows/s",
        per_sec(BATCHED, t.enqueue_batched),
        per_sec(BATCHED, t.bare_insert)
    );
    println!(
        "  per unit ({BATCH} per transaction): enqueue {enq:.1} us + claim+ack {ca:.1} us = {:.1} us;  bare INSERT {bi:.1} us + DELETE {bd:.1} us = {:.1} us",
        enq + ca,
        bi + bd
    );
    println!(
        "  claim+ack vs bare DELETE: {:.2}x;  enqueue+claim+ack vs bare INSERT+DELETE: {:.2}x",
        ca / bd,
        (enq + ca) / (bi + bd)
    );
    let fi = us_per(BATCHED, t.floor_insert);
    let fd = us_per(BATCHED, t.floor_delete);
    println!(
        "  one-table floor (bare table + UNIQUE (actor, row_id) + (lane, seq, id) index): INSERT {fi:.1} us + DELETE {fd:.1} us = {:.1} us = {:.2}x bare",
        fi + fd,
        (fi + fd) / (bi + bd)
    );
    let st = &t.steps;
    let (me, mc) = (median_us(&st.enqueue), median_us(&st.claim_ack));
    let (mbi, mbd) = (median_us(&st.bare_insert), median_us(&st.bare_delete));
    let (mfi, mfd) = (median_us(&st.floor_insert), median_us(&st.floor_delete));
    println!(
        "  medians of 100-unit steps: outbox {me:.1} + {mc:.1} = {:.1} us;  bare {mbi:.1} + {mbd:.1} = {:.1} us;  floor {mfi:.1} + {mfd:.1} = {:.1} us",
        me + mc,
        mbi + mbd,
        mfi + mfd
    );
    println!(
        "  median ratios: enqueue+claim+ack vs bare INSERT+DELETE {:.2}x;  floor vs bare {:.2}x;  outbox vs floor {:.2}x",
        (me + mc) / (mbi + mbd),
        (mfi + mfd) / (mbi + mbd),
        (me + mc) / (mfi + mfd)
    );
}

/// A plain table on its own connection. `laned`: the one-table floor, which also stores the
/// row's lane and seq and keeps the two indexes any lane-ordered outbox that refuses duplicate
/// row ids needs (UNIQUE (actor, row_id), and (lane, seq, id) for lane-head reads).
struct SqliteBare {
    c: outbox_lanes_store::sqlite::rusqlite::Connection,
    table: &'static str,
    laned: bool,
    lanes: std::collections::HashMap<String, i64>,
    seq: i64,
}

impl SqliteBare {
    fn new(
        path: &std::path::Path,
        synchronous: Synchronous,
        table: &'static str,
        laned: bool,
    ) -> SqliteBare {
        let c = outbox_lanes_store::sqlite::rusqlite::Connection::open(path).unwrap();
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
        if laned {
            c.execute_batch(&format!(
                "CREATE TABLE {table} (id INTEGER PRIMARY KEY, actor TEXT NOT NULL, row_id TEXT NOT NULL, \
                 lane_id INTEGER NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL, UNIQUE (actor, row_id)); \
                 CREATE INDEX {table}_lane ON {table} (lane_id, seq, id);"
            ))
            .unwrap();
        } else {
            c.execute_batch(&format!(
                "CREATE TABLE {table} (id INTEGER PRIMARY KEY, actor TEXT NOT NULL, row_id TEXT NOT NULL, body BLOB NOT NULL)"
            ))
            .unwrap();
        }
        SqliteBare {
            c,
            table,
            laned,
            lanes: std::collections::HashMap::new(),
            seq: 0,
        }
    }
}

impl Bare for SqliteBare {
    fn insert(&mut self, rows: &[NewRow]) {
        use outbox_lanes_store::sqlite::rusqlite::params;
        let table = self.table;
        let tx = self.c.transaction().unwrap();
        if self.laned {
            let mut st = tx
                .prepare_cached(&format!(
                    "INSERT INTO {table} (actor, row_id, lane_id, seq, body) VALUES (?1, ?2, ?3, ?4, ?5)"
                ))
                .unwrap();
            for r in rows {
                let n = self.lanes.len() as i64;
                let lane = *self.lanes.entry(r.recipients[0].clone()).or_insert(n);
                self.seq += 1;
                st.execute(params!["bench", r.id, lane, self.seq, r.body])
                    .unwrap();
            }
        } else {
            let mut st = tx
                .prepare_cached(&format!(
                    "INSERT INTO {table} (actor, row_id, body) VALUES (?1, ?2, ?3)"
                ))
                .unwrap();
            for r in rows {
                st.execute(params!["bench", r.id, r.body]).unwrap();
            }
        }
        tx.commit().unwrap();
    }

    fn delete_head(&mut self, n: usize) -> usize {
        let table = self.table;
        let tx = self.c.transaction().unwrap();
        let ids: Vec<i64> = {
            let mut st = tx
                // `+?1`: SQLite re-prepares a statement whose LIMIT is a bare parameter on every
                // rebind; the store's claims avoid that the same way.
                .prepare_cached(&format!("SELECT id FROM {table} ORDER BY id LIMIT +?1"))
                .unwrap();
            st.query_map([n as i64], |r| r.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };
        {
            let mut st = tx
                .prepare_cached(&format!("DELETE FROM {table} WHERE id = ?1"))
                .unwrap();
            for id in &ids {
                st.execute([id]).unwrap();
            }
        }
        tx.commit().unwrap();
        ids.len()
    }
}

fn sqlite(synchronous: Synchronous) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.db");
    let store = SqliteStore::open(
        &path,
        SqliteOptions {
            synchronous,
            ..SqliteOptions::default()
        },
    )
    .unwrap();
    // The same file, the same pragmas.
    let mut bare = SqliteBare::new(&path, synchronous, "bare", false);
    let mut floor = SqliteBare::new(&path, synchronous, "floor", true);
    let t = measure(&store, &mut bare, &mut floor, "sqlite");
    report(&format!("SQLite file, synchronous={synchronous:?}"), &t);
}

#[cfg(feature = "postgres")]
struct PgBare {
    client: ::postgres::Client,
    ins: ::postgres::Statement,
    sel: ::postgres::Statement,
    del: ::postgres::Statement,
    /// The one-table floor: lanes and seqs stored too (see `SqliteBare`).
    laned: bool,
    lanes: std::collections::HashMap<String, i64>,
    seq: i64,
}

#[cfg(feature = "postgres")]
impl PgBare {
    fn new(url: &str, schema: &str, table: &str, laned: bool) -> PgBare {
        let mut client = ::postgres::Client::connect(url, ::postgres::NoTls).unwrap();
        let (cols, ins) = if laned {
            (
                format!(
                    "lane_id BIGINT NOT NULL, seq BIGINT NOT NULL, body BYTEA NOT NULL, UNIQUE (actor, row_id)); \
                     CREATE INDEX {table}_lane ON {table} (lane_id, seq, id)"
                ),
                format!(
                    "INSERT INTO {table} (actor, row_id, lane_id, seq, body) SELECT 'bench', * \
                     FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bytea[])"
                ),
            )
        } else {
            (
                "body BYTEA NOT NULL)".to_string(),
                format!(
                    "INSERT INTO {table} (actor, row_id, body) SELECT 'bench', * FROM unnest($1::text[], $2::bytea[])"
                ),
            )
        };
        client
            .batch_execute(&format!(
                "SET search_path TO {schema}; CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, actor TEXT NOT NULL, \
                 row_id TEXT NOT NULL, {cols}"
            ))
            .unwrap();
        let ins = client.prepare(&ins).unwrap();
        let sel = client
            .prepare(&format!("SELECT id FROM {table} ORDER BY id LIMIT $1"))
            .unwrap();
        let del = client
            .prepare(&format!("DELETE FROM {table} WHERE id = ANY($1)"))
            .unwrap();
        PgBare {
            client,
            ins,
            sel,
            del,
            laned,
            lanes: std::collections::HashMap::new(),
            seq: 0,
        }
    }
}

#[cfg(feature = "postgres")]
impl Bare for PgBare {
    fn insert(&mut self, rows: &[NewRow]) {
        let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        let bodies: Vec<&[u8]> = rows.iter().map(|r| r.body.as_slice()).collect();
        let (mut lanes, mut seqs) = (Vec::new(), Vec::new());
        if self.laned {
            for r in rows {
                let n = self.lanes.len() as i64;
                lanes.push(*self.lanes.entry(r.recipients[0].clone()).or_insert(n));
                self.seq += 1;
                seqs.push(self.seq);
            }
        }
        let mut tx = self.client.transaction().unwrap();
        if self.laned {
            tx.execute(&self.ins, &[&ids, &lanes, &seqs, &bodies])
                .unwrap();
        } else {
            tx.execute(&self.ins, &[&ids, &bodies]).unwrap();
        }
        tx.commit().unwrap();
    }

    fn delete_head(&mut self, n: usize) -> usize {
        let mut tx = self.client.transaction().unwrap();
        let ids: Vec<i64> = tx
            .query(&self.sel, &[&(n as i64)])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        if !ids.is_empty() {
            tx.execute(&self.del, &[&ids]).unwrap();
        }
        tx.commit().unwrap();
        ids.len()
    }
}

#[cfg(feature = "postgres")]
fn postgres(url: &str, round: usize) {
    let schema = format!("ol_bench_{}_{round}", std::process::id());
    let store = PgStore::connect(
        url,
        PgOptions {
            schema: schema.clone(),
            ..PgOptions::default()
        },
    )
    .unwrap();
    let mut bare = PgBare::new(url, &schema, "bare", false);
    let mut floor = PgBare::new(url, &schema, "floor", true);
    let t = measure(&store, &mut bare, &mut floor, "pg");
    report("Postgres (PgStore, 127.0.0.1)", &t);
    drop(store);
    drop(floor);
    let _ = bare
        .client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"));
}

/// The same bench on [`SqlxPgStore`](outbox_lanes_store::sqlx::SqlxPgStore): the Postgres
/// store on a sqlx pool (sqlx's default size, 10), its statements waited on the pool's
/// runtime from this (non-async) thread, as a runtime's blocking pool calls it.
#[cfg(all(feature = "postgres", feature = "sqlx"))]
fn postgres_sqlx(url: &str, round: usize) {
    use outbox_lanes_store::sqlx::{SqlxPgOptions, SqlxPgStore, sqlx::PgPool};
    let schema = format!("ol_bench_sqlx_{}_{round}", std::process::id());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let pool = rt.block_on(PgPool::connect(url)).unwrap();
    let opts = SqlxPgOptions {
        schema: schema.clone(),
        ..SqlxPgOptions::default()
    };
    let store = rt.block_on(SqlxPgStore::new(pool, opts)).unwrap();
    let mut bare = PgBare::new(url, &schema, "bare", false);
    let mut floor = PgBare::new(url, &schema, "floor", true);
    let t = measure(&store, &mut bare, &mut floor, "pgsqlx");
    report("Postgres through sqlx (SqlxPgStore, 127.0.0.1)", &t);
    drop(store);
    drop(floor);
    let _ = bare
        .client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"));
}

fn main() {
    println!(
        "outbox-lanes-store bench: {SINGLE} single-row enqueues, {BATCHED} units ({BATCH} per transaction, \
         {LANES} lanes, {BODY}-byte payloads), outbox and bare table measured in alternating steps"
    );
    // OUTBOX_LANES_BENCH_ONLY=full,normal,pg,sqlx runs a subset (default: all), each case
    // OUTBOX_LANES_BENCH_ROUNDS times (default 1), the cases alternating within a round.
    let only = std::env::var("OUTBOX_LANES_BENCH_ONLY").unwrap_or_default();
    let wanted = |name: &str| only.is_empty() || only.split(',').any(|w| w.trim() == name);
    let rounds: usize = std::env::var("OUTBOX_LANES_BENCH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    #[cfg(feature = "postgres")]
    let pg = std::env::var("OUTBOX_LANES_TEST_PG")
        .ok()
        .filter(|u| !u.is_empty())
        .map(|u| outbox_lanes_test_support::pg_url_without_tls(&u));
    for round in 0..rounds {
        if rounds > 1 {
            println!("--- round {} of {rounds}", round + 1);
        }
        if wanted("full") {
            sqlite(Synchronous::Full);
        }
        if wanted("normal") {
            sqlite(Synchronous::Normal);
        }
        #[cfg(feature = "postgres")]
        if wanted("pg") {
            match &pg {
                Some(url) => postgres(url, round),
                None => println!("Postgres: skipped (OUTBOX_LANES_TEST_PG not set)"),
            }
        }
        #[cfg(all(feature = "postgres", feature = "sqlx"))]
        if wanted("sqlx") {
            match &pg {
                Some(url) => postgres_sqlx(url, round),
                None => println!("Postgres through sqlx: skipped (OUTBOX_LANES_TEST_PG not set)"),
            }
        }
    }
}
