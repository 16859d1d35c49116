//! The group-committing ack writer against real databases (a SQLite file, SQLite in memory,
//! Postgres when `OUTBOX_LANES_TEST_PG` is set): acks handed over from several threads are
//! committed by a flush, and a stale pass's acks are refused and reported to that pass alone.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use outbox_lanes_core::{ActorId, Seq, UnitId};
use outbox_lanes_driver::clock::SystemClock;
use outbox_lanes_driver::{AckWriter, AckWriterOptions};
use outbox_lanes_store::{
    ClaimRange, NewRow, PgOptions, PgStore, SlotAcquisition, SlotToken, SqliteOptions, SqliteStore,
    StdThreads, Store, StoreError, StoreLaneId,
};

const A: &str = "https://a.example/inbox";
const B: &str = "https://b.example/inbox";
const LEASE: Duration = Duration::from_secs(60);

fn row(id: &str, to: &[&str]) -> NewRow {
    NewRow {
        id: id.into(),
        body: id.as_bytes().to_vec(),
        content_type: "text/plain".into(),
        recipients: to.iter().map(|s| (*s).to_owned()).collect(),
        ..NewRow::default()
    }
}

fn acquire(store: &dyn Store, actor: &ActorId) -> SlotToken {
    match store.acquire_slot(actor, "h", LEASE).expect("acquire") {
        SlotAcquisition::Acquired(t) => t,
        SlotAcquisition::Held => panic!("slot of {actor} held"),
    }
}

fn lane(store: &dyn Store, actor: &ActorId, url: &str) -> StoreLaneId {
    let key = outbox_lanes_core::LaneKey::new(url, None).expect("url");
    store
        .find_lane(actor, &key)
        .expect("find_lane")
        .expect("lane")
}

fn units(store: &dyn Store, t: &SlotToken, lane: StoreLaneId) -> Vec<UnitId> {
    let range = ClaimRange {
        lane,
        from: Seq(0),
        limit: 1000,
    };
    let claimed = store.claim(t, &[range]).expect("claim");
    claimed[0].units.iter().map(|u| u.id).collect()
}

fn group_commits(s: Arc<dyn Store>) {
    let a = ActorId::new("alice");
    let rows: Vec<NewRow> = (0..300).map(|k| row(&format!("r{k}"), &[A, B])).collect();
    s.enqueue(&a, &rows).expect("enqueue");
    let t = acquire(&*s, &a);
    let (la, lb) = (lane(&*s, &a, A), lane(&*s, &a, B));
    let (opts, clock) = (AckWriterOptions::default(), Arc::new(SystemClock));
    let writer = Arc::new(AckWriter::spawn(s.clone(), opts, &StdThreads, clock).expect("spawn"));
    std::thread::scope(|sc| {
        for l in [la, lb] {
            let (s, t, w) = (s.clone(), t.clone(), writer.clone());
            sc.spawn(move || {
                for u in units(&*s, &t, l) {
                    w.ack(&t, u, l);
                }
            });
        }
    });
    writer.flush(&t).expect("flush");
    assert_eq!(s.status().expect("status")[0].pending, 0);
    // A stale pass's acks are refused and reported to that pass alone: another pass (another
    // actor's, with a live token) sharing the writer flushes clean.
    s.enqueue(&a, &[row("late", &[A])]).expect("enqueue");
    let u = units(&*s, &t, la)[0];
    let _ = s.release_slot(&t).expect("release");
    let b = ActorId::new("bob");
    s.enqueue(&b, &[row("b1", &[A])]).expect("enqueue");
    let tb = acquire(&*s, &b);
    let lbob = lane(&*s, &b, A);
    let ub = units(&*s, &tb, lbob)[0];
    writer.ack(&t, u, la);
    writer.ack(&tb, ub, lbob);
    writer
        .flush(&tb)
        .expect("the live pass's acks are committed");
    assert_eq!(writer.failure(&t), Some(StoreError::StaleToken));
    assert_eq!(writer.failure(&tb), None);
    assert_eq!(writer.flush(&t), Err(StoreError::StaleToken));
    writer.flush(&t).expect("errors are reported once");
    let _ = s.release_slot(&tb).expect("release");
}

#[test]
fn group_commits_on_a_sqlite_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("outbox.db"), SqliteOptions::default());
    group_commits(Arc::new(store.expect("open")));
}

#[test]
fn group_commits_on_sqlite_in_memory() {
    group_commits(Arc::new(SqliteStore::in_memory().expect("open")));
}

#[test]
fn group_commits_on_postgres() {
    let Some(url) = outbox_lanes_test_support::pg_url() else {
        return;
    };
    let schema = format!("ol_acks_{}", std::process::id());
    let opts = PgOptions {
        schema: schema.clone(),
        ..PgOptions::default()
    };
    group_commits(Arc::new(PgStore::connect(&url, opts).expect("connect")));
    let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("client");
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .expect("drop schema");
}
