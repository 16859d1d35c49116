//! Store benchmarks of the cold path: the operator's and the monitor's calls (status, the
//! lane listing, dead letters listed, replayed and purged, lane controls, the lag and the
//! monitor's "who has work"), not the pass's enqueue/claim/ack (see `store.rs`).
//!
//! The outbox holds, per backend: one actor (`cold-a`) with 200 lanes × 5 pending units, and
//! a second actor (`cold-dead`) with 200 dead letters on one lane. Each figure is the median
//! time of one call over a fixed number of calls (`OUTBOX_LANES_COLD_REPS`, default 200).
//! The calls are taken round-robin (one of each, then again) so that a machine that slows
//! down or speeds up during the run weighs on every figure alike. The replay and purge of
//! the 200 dead letters run once every 5 rounds; the state is restored after each (untimed:
//! the replayed units are dead-lettered again by `retire_lane`, the purged ones enqueued again
//! under fresh row ids and dead-lettered the same way).
//!
//! Only the public API (`use outbox_lanes_store::*` brings `Store`, or `DriverStore` and
//! `ServiceStore`, into scope). Before `lane_status` and `knows_actor` existed (the store's
//! trait split, commit 127d71e, built this file without them), their two figures were not
//! there: remove them to build the file against an older store.
//!
//! Run: `cargo bench -p outbox-lanes-store --all-features --bench cold`
//! (set `OUTBOX_LANES_TEST_PG` to include Postgres, on a fresh schema dropped afterwards;
//! `OUTBOX_LANES_COLD_ONLY=memory,file,pg` picks a subset). It prints figures; it asserts
//! nothing.
#![allow(missing_docs, clippy::unwrap_used)]

use std::time::{Duration, Instant, SystemTime};

use outbox_lanes_core::{ActorId, DeadReason, LaneKey, Timestamp};
use outbox_lanes_store::*;

const LANES: usize = 200;
const PER_LANE: usize = 5;
const DEAD: usize = 200;
const BODY: usize = 512;
/// Replay and purge run once every this many rounds.
const HEAVY_EVERY: usize = 5;

fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

fn recipient(k: usize) -> String {
    format!("https://host{k}.example/inbox")
}

fn row(id: String, recipients: Vec<String>) -> NewRow {
    NewRow {
        id,
        body: vec![b'x'; BODY],
        content_type: "application/json".into(),
        recipients,
        ..NewRow::default()
    }
}

/// The per-call times of one figure.
#[derive(Default)]
struct Figure {
    name: &'static str,
    calls: Vec<Duration>,
}

impl Figure {
    fn new(name: &'static str) -> Self {
        Figure {
            name,
            calls: Vec::new(),
        }
    }

    fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let out = f();
        self.calls.push(t0.elapsed());
        out
    }

    fn report(&self) {
        let mut v = self.calls.clone();
        v.sort();
        if v.is_empty() {
            println!("  {:<28} skipped", self.name);
            return;
        }
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        println!(
            "  {:<28} median {:>10.1} us   (p10 {:.1}, p90 {:.1}, n={})",
            self.name,
            us(at(0.5)),
            us(at(0.1)),
            us(at(0.9)),
            v.len()
        );
    }
}

struct Setup {
    a: ActorId,
    dead: ActorId,
    /// `cold-a`'s lanes (id and key), in the order `lanes()` listed them.
    lanes: Vec<(StoreLaneId, LaneKey)>,
    /// `cold-dead`'s one lane and the drain slot held for it (lease: an hour), with which
    /// the replayed units are dead-lettered again.
    dead_lane: StoreLaneId,
    dead_slot: SlotToken,
    /// Row ids already used by `cold-dead` (a purge round enqueues fresh ones).
    next_dead_row: usize,
}

/// Enqueues `DEAD` rows to `cold-dead`'s one lane under fresh ids and dead-letters them.
fn refill_dead(store: &dyn Store, s: &mut Setup) {
    let rows: Vec<NewRow> = (s.next_dead_row..s.next_dead_row + DEAD)
        .map(|k| row(format!("dead-{k}"), vec![recipient(999_999)]))
        .collect();
    s.next_dead_row += DEAD;
    store.enqueue(&s.dead, &rows).unwrap();
    let _ = store
        .retire_lane(&s.dead_slot, s.dead_lane, now(), DeadReason::LaneRetired)
        .unwrap();
}

fn setup(store: &dyn Store) -> Setup {
    let t0 = Instant::now();
    let a = ActorId::new("cold-a");
    let dead = ActorId::new("cold-dead");
    // The dead letters' actor first: its slot, and a lane of dead letters to list.
    let rows: Vec<NewRow> = (0..DEAD)
        .map(|k| row(format!("dead-{k}"), vec![recipient(999_999)]))
        .collect();
    store.enqueue(&dead, &rows).unwrap();
    let SlotAcquisition::Acquired(dead_slot) = store
        .acquire_slot(&dead, "cold-bench", Duration::from_secs(3600))
        .unwrap()
    else {
        panic!("the slot of cold-dead is free");
    };
    let dead_lane = store
        .find_lane(&dead, &LaneKey::new(&recipient(999_999), None).unwrap())
        .unwrap()
        .expect("cold-dead's lane");
    let _ = store
        .retire_lane(&dead_slot, dead_lane, now(), DeadReason::LaneRetired)
        .unwrap();
    // 200 lanes × 5 units: 5 rows to the 200 recipients, one unit per recipient each.
    let all: Vec<String> = (0..LANES).map(recipient).collect();
    let rows: Vec<NewRow> = (0..PER_LANE)
        .map(|k| row(format!("a-{k}"), all.clone()))
        .collect();
    store.enqueue(&a, &rows).unwrap();
    let lanes: Vec<(StoreLaneId, LaneKey)> = store
        .lanes(&a)
        .unwrap()
        .into_iter()
        .map(|l| (l.lane, l.key))
        .collect();
    let status = store.status().unwrap();
    let pending: u64 = status.iter().map(|s| s.pending).sum();
    let dls = store.dead_letters(None).unwrap().len();
    println!(
        "  setup: {} ms; {} lanes of cold-a, {} actors in status, {} pending, {} dead letters",
        t0.elapsed().as_millis(),
        lanes.len(),
        status.len(),
        pending,
        dls
    );
    Setup {
        a,
        dead,
        lanes,
        dead_lane,
        dead_slot,
        next_dead_row: DEAD,
    }
}

fn measure(store: &dyn Store, reps: usize) {
    let mut s = setup(store);
    let mut status = Figure::new("status()");
    let mut lanes = Figure::new("lanes(actor)");
    let mut dead_letters = Figure::new("dead_letters(None)");
    let mut oldest = Figure::new("oldest_pending()");
    let mut actors = Figure::new("actors_with_work(now)");
    let mut pause_resume = Figure::new("pause_lane+resume_lane");
    let mut retry = Figure::new("retry_lane_now");
    let mut find = Figure::new("find_lane");
    let mut find_again = Figure::new("find_lane, again");
    let mut one_lane = Figure::new("lane_status(lane)");
    let mut known = Figure::new("knows_actor");
    let mut replay = Figure::new("replay_dead_letters(200)");
    let mut purge = Figure::new("purge_dead_letters(200)");
    let which = DeadLetterSelection::Actor(s.dead.clone());
    // Warm-up: every call a few times (statement caches, plans), untimed.
    for k in 0..3 {
        let _ = store.status().unwrap();
        let _ = store.lanes(&s.a).unwrap();
        let _ = store.dead_letters(None).unwrap();
        let _ = store.oldest_pending().unwrap();
        let _ = store.actors_with_work(now()).unwrap();
        let (lane, key) = &s.lanes[k];
        store.pause_lane(*lane, "bench").unwrap();
        store.resume_lane(*lane).unwrap();
        store.retry_lane_now(*lane).unwrap();
        let _ = store.find_lane(&s.a, key).unwrap();
    }
    let (mut replayed, mut purged) = (0usize, 0u64);
    for k in 0..reps {
        let (lane, key) = s.lanes[k % s.lanes.len()].clone();
        let _ = status.time(|| store.status().unwrap());
        let _ = lanes.time(|| store.lanes(&s.a).unwrap());
        let _ = dead_letters.time(|| store.dead_letters(None).unwrap());
        let _ = oldest.time(|| store.oldest_pending().unwrap());
        let t = now();
        let _ = actors.time(|| store.actors_with_work(t).unwrap());
        pause_resume.time(|| {
            store.pause_lane(lane, "bench").unwrap();
            store.resume_lane(lane).unwrap();
        });
        retry.time(|| store.retry_lane_now(lane).unwrap());
        let _ = find.time(|| store.find_lane(&s.a, &key).unwrap());
        // The same call with no write since the last read: on a SQLite file, a reader
        // connection drops its page cache when another connection has written since its last
        // read transaction, so the first figure includes re-reading those pages.
        let _ = find_again.time(|| store.find_lane(&s.a, &key).unwrap());
        // What the binary's lane actions and `--actor` checks read (instead of `lanes(actor)`).
        let _ = one_lane.time(|| store.lane_status(lane).unwrap());
        let _ = known.time(|| store.knows_actor(&s.a).unwrap());
        if k % HEAVY_EVERY == HEAVY_EVERY - 1 {
            replayed = replay
                .time(|| store.replay_dead_letters(&which).unwrap())
                .len();
            // Back to 200 dead letters (untimed).
            let _ = store
                .retire_lane(&s.dead_slot, s.dead_lane, now(), DeadReason::LaneRetired)
                .unwrap();
            purged = purge.time(|| store.purge_dead_letters(&which).unwrap());
            refill_dead(store, &mut s);
        }
    }
    for f in [
        &status,
        &lanes,
        &dead_letters,
        &oldest,
        &actors,
        &pause_resume,
        &retry,
        &find,
        &find_again,
        &one_lane,
        &known,
        &replay,
        &purge,
    ] {
        f.report();
    }
    println!("  (last replay: {replayed} units; last purge: {purged} dead letters)");
    let _ = store.release_slot(&s.dead_slot);
}

fn sqlite_memory(reps: usize) {
    println!("SQLite in-memory:");
    let store = SqliteStore::in_memory().unwrap();
    measure(&store, reps);
}

fn sqlite_file(reps: usize) {
    let dir = tempfile::tempdir().unwrap();
    let opts = SqliteOptions::default();
    println!("SQLite file, synchronous={:?}:", opts.synchronous);
    let store = SqliteStore::open(dir.path().join("cold.db"), opts).unwrap();
    measure(&store, reps);
}

#[cfg(feature = "postgres")]
fn postgres(url: &str, reps: usize) {
    /// Drops the bench's schema when it goes out of scope, panic or not.
    struct DropSchema<'a> {
        url: &'a str,
        schema: String,
    }
    impl Drop for DropSchema<'_> {
        fn drop(&mut self) {
            match ::postgres::Client::connect(self.url, ::postgres::NoTls) {
                Ok(mut c) => {
                    if let Err(e) =
                        c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema))
                    {
                        eprintln!("could not drop schema {}: {e}", self.schema);
                    }
                }
                Err(e) => eprintln!("could not drop schema {}: {e}", self.schema),
            }
        }
    }
    println!("Postgres (127.0.0.1):");
    let schema = format!("ol_cold_{}", std::process::id());
    let _guard = DropSchema {
        url,
        schema: schema.clone(),
    };
    let store = PgStore::connect(
        url,
        PgOptions {
            schema,
            ..PgOptions::default()
        },
    )
    .unwrap();
    measure(&store, reps);
    // The store's connections go before the schema does.
    drop(store);
}

fn main() {
    let reps: usize = std::env::var("OUTBOX_LANES_COLD_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    println!(
        "outbox-lanes-store cold-path bench: {LANES} lanes x {PER_LANE} pending units (one actor), {DEAD} dead letters \
         (another actor), {reps} calls per figure (median), replay and purge every {HEAVY_EVERY} rounds"
    );
    // OUTBOX_LANES_COLD_ONLY=memory,file,pg runs a subset (default: all three).
    let only = std::env::var("OUTBOX_LANES_COLD_ONLY").unwrap_or_default();
    let wanted = |name: &str| only.is_empty() || only.split(',').any(|w| w.trim() == name);
    if wanted("memory") {
        sqlite_memory(reps);
    }
    if wanted("file") {
        sqlite_file(reps);
    }
    #[cfg(feature = "postgres")]
    if wanted("pg") {
        match std::env::var("OUTBOX_LANES_TEST_PG") {
            Ok(url) if !url.is_empty() => {
                postgres(&outbox_lanes_test_support::pg_url_without_tls(&url), reps)
            }
            _ => println!("Postgres: skipped (OUTBOX_LANES_TEST_PG not set)"),
        }
    }
}
