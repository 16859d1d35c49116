//! 8 threads enqueue while 2 claimers (two store instances: two connections, as two relay
//! processes would have) take turns on the actors' drain slots, claim and ack: no unit lost,
//! none delivered twice, per-lane order intact, never two passes of one actor at once.
#![allow(missing_docs, clippy::std_instead_of_core)]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use outbox_lanes_core::{ActorId, Seq, UnitId};
use outbox_lanes_store::*;

const ENQUEUERS: usize = 8;
const ROWS_PER_THREAD: usize = 60;
const ACTORS: [&str; 2] = ["alice", "bob"];
const URLS: [&str; 4] = [
    "https://a.example/inbox",
    "https://b.example/inbox",
    "https://c.example/inbox",
    "https://d.example/inbox",
];

#[derive(Default)]
struct Seen {
    enqueued: HashSet<UnitId>,
    delivered: HashSet<UnitId>,
    /// Last delivered seq per (actor, lane).
    last: HashMap<(String, StoreLaneId), Seq>,
}

fn eight_enqueuers_two_claimers(b: Backend) {
    run(b, CommonOptions::default(), |h| {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let done = Arc::new(AtomicUsize::new(0));
        let acked = Arc::new(AtomicUsize::new(0));
        let in_pass: Arc<Vec<AtomicBool>> =
            Arc::new(ACTORS.iter().map(|_| AtomicBool::new(false)).collect());
        let claimers: Vec<Arc<dyn Store>> = vec![h.store.clone(), h.second()];
        std::thread::scope(|sc| {
            for t in 0..ENQUEUERS {
                let (store, seen, done, acked) =
                    (h.store.clone(), seen.clone(), done.clone(), acked.clone());
                sc.spawn(move || {
                    let mut k = 0;
                    while k < ROWS_PER_THREAD {
                        if k >= ROWS_PER_THREAD / 2 {
                            // Make the claimers overlap the enqueuers for sure (bounded wait,
                            // no timing asserted): half the rows go in only after a first ack.
                            for _ in 0..10_000 {
                                if acked.load(Ordering::SeqCst) > 0 {
                                    break;
                                }
                                std::thread::sleep(Duration::from_millis(1));
                            }
                        }
                        let batch = 1 + (k + t) % 4;
                        let rows: Vec<NewRow> = (k..(k + batch).min(ROWS_PER_THREAD))
                            .map(|n| {
                                let to = [URLS[(t + n) % 4], URLS[(t + 2 * n + 1) % 4]];
                                NewRow {
                                    joined: n % 7 == 0,
                                    ..row(&format!("t{t}-r{n}"), &to)
                                }
                            })
                            .collect();
                        k += rows.len();
                        let a = actor(ACTORS[(t + k) % 2]);
                        let out = loop {
                            match store.enqueue(&a, &rows) {
                                Ok(out) => break out,
                                Err(EnqueueError::Store(StoreError::Busy)) => continue,
                                Err(e) => panic!("enqueue: {e}"),
                            }
                        };
                        let mut s = seen.lock().expect("seen");
                        for e in out {
                            s.enqueued.extend(e.units);
                        }
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                });
            }
            for (ci, store) in claimers.iter().enumerate() {
                let (store, seen, done, in_pass, acked) = (
                    store.clone(),
                    seen.clone(),
                    done.clone(),
                    in_pass.clone(),
                    acked.clone(),
                );
                sc.spawn(move || {
                    let holder = format!("claimer-{ci}");
                    let mut idle_rounds = 0;
                    loop {
                        let finished = done.load(Ordering::SeqCst) == ENQUEUERS;
                        let mut worked = false;
                        for (ai, name) in ACTORS.iter().enumerate() {
                            let a = actor(name);
                            let token =
                                match store.acquire_slot(&a, &holder, Duration::from_secs(60)) {
                                    Ok(SlotAcquisition::Acquired(t)) => t,
                                    Ok(SlotAcquisition::Held) | Err(StoreError::Busy) => continue,
                                    Err(e) => panic!("acquire: {e}"),
                                };
                            assert!(
                                !in_pass[ai].swap(true, Ordering::SeqCst),
                                "two passes of {name} at once"
                            );
                            loop {
                                let did = pass(&*store, &token, &a, &seen);
                                if did {
                                    acked.fetch_add(1, Ordering::SeqCst);
                                }
                                worked |= did;
                                // Cleared before the release: once released, the other claimer
                                // may take the slot at once. Until then nobody else can.
                                in_pass[ai].store(false, Ordering::SeqCst);
                                match release(&*store, &token) {
                                    SlotRelease::LookAgain => {
                                        // Still ours.
                                        assert!(
                                            !in_pass[ai].swap(true, Ordering::SeqCst),
                                            "two passes of {name} at once"
                                        );
                                        continue;
                                    }
                                    SlotRelease::Released => break,
                                }
                            }
                        }
                        if finished && !worked {
                            idle_rounds += 1;
                            if idle_rounds > 3 {
                                break;
                            }
                        }
                        std::thread::yield_now();
                    }
                });
            }
        });
        // A final look by a single claimer picks up anything a LookAgain race left behind.
        for name in ACTORS {
            let a = actor(name);
            let t = acquire_eventually(&*h.store, &a, "final", LEASE);
            pass(&*h.store, &t, &a, &seen);
            let _ = h.store.release_slot(&t).expect("release");
        }
        let s = seen.lock().expect("seen");
        let expected_rows = ENQUEUERS * ROWS_PER_THREAD;
        assert!(
            s.enqueued.len() >= expected_rows,
            "{} units for {expected_rows} rows",
            s.enqueued.len()
        );
        assert_eq!(s.delivered, s.enqueued, "every unit delivered exactly once");
        let st = h.store.status().expect("status");
        assert!(st.iter().all(|a| a.pending == 0), "{st:?}");
    });
}

fn release(store: &dyn Store, t: &SlotToken) -> SlotRelease {
    loop {
        match store.release_slot(t) {
            Ok(r) => return r,
            Err(StoreError::Busy) => continue,
            Err(e) => panic!("release: {e}"),
        }
    }
}

/// Drains everything claimable for the actor; returns whether anything was delivered.
fn pass(store: &dyn Store, t: &SlotToken, a: &ActorId, seen: &Mutex<Seen>) -> bool {
    let mut any = false;
    loop {
        let lanes = match store.lanes_with_work(t, 0) {
            Ok((l, _)) => l,
            Err(StoreError::Busy) => continue,
            Err(e) => panic!("lanes: {e}"),
        };
        let claims: Vec<ClaimRange> = lanes
            .iter()
            .map(|l| ClaimRange {
                lane: l.lane,
                from: Seq(0),
                limit: 16,
            })
            .collect();
        let got = match store.claim(t, &claims) {
            Ok(g) => g,
            Err(StoreError::Busy) => continue,
            Err(e) => panic!("claim: {e}"),
        };
        let mut acks = Vec::new();
        {
            let mut s = seen.lock().expect("seen");
            for lane in &got {
                for unit in &lane.units {
                    let slot = unit
                        .slots
                        .iter()
                        .find(|x| x.lane == lane.lane)
                        .expect("own slot");
                    if slot.served {
                        continue;
                    }
                    let last = s
                        .last
                        .entry((a.as_str().to_string(), lane.lane))
                        .or_insert(Seq(0));
                    assert!(
                        unit.seq > *last,
                        "lane {:?} went back from {:?} to {:?}",
                        lane.lane,
                        last,
                        unit.seq
                    );
                    *last = unit.seq;
                    acks.push((unit.id, lane.lane));
                }
            }
        }
        if acks.is_empty() {
            return any;
        }
        loop {
            match store.ack(t, &acks) {
                Ok(()) => break,
                Err(StoreError::Busy) => continue,
                Err(e) => panic!("ack: {e}"),
            }
        }
        any = true;
        // A unit is delivered when no lane of it is pending any more: check by payload.
        let mut s = seen.lock().expect("seen");
        let units: HashSet<UnitId> = acks.iter().map(|(u, _)| *u).collect();
        for u in units {
            match store.payload(u) {
                Err(StoreError::NotFound { .. }) => {
                    assert!(s.delivered.insert(u), "unit {u} delivered twice");
                }
                Ok(_) => {}
                Err(e) => panic!("payload: {e}"),
            }
        }
    }
}

#[test]
fn sqlite_file_eight_enqueuers_two_claimers() {
    eight_enqueuers_two_claimers(Backend::SqliteFile);
}

#[test]
fn postgres_eight_enqueuers_two_claimers() {
    eight_enqueuers_two_claimers(Backend::Postgres);
}

#[test]
fn sqlite_memory_eight_enqueuers_two_claimers() {
    eight_enqueuers_two_claimers(Backend::SqliteMemory);
}

/// A one-recipient enqueue waiting for the actor's lock while another enqueue writes the same
/// row id with several recipients (its payload shared, not inline) must see that row once the
/// other commits: the id is refused, not stored twice.
#[cfg(feature = "postgres")]
#[test]
fn postgres_concurrent_enqueues_of_one_row_id_in_two_shapes() {
    run(Backend::Postgres, CommonOptions::default(), |h| {
        let (url, schema) = h.pg().expect("pg");
        let mine = PgStore::connect(
            &url,
            PgOptions {
                schema: schema.clone(),
                ..PgOptions::default()
            },
        )
        .expect("connect");
        let mut c = pg_client(&url, &schema);
        let a = actor("alice");
        // Some shared payload already there, so the hot path's look into ol_rows is not
        // skipped as pointless.
        h.store
            .enqueue(&a, &[row("old", &[URLS[0], URLS[1]])])
            .expect("enqueue");
        let mut tx = c.transaction().expect("tx");
        let (_, wake) = mine
            .enqueue_in(&mut tx, &a, &[row("x", &[URLS[0], URLS[1]])])
            .expect("enqueue in tx");
        let store = Arc::clone(&h.store);
        let a2 = a.clone();
        let waiter = std::thread::spawn(move || store.enqueue(&a2, &[row("x", &[URLS[2]])]));
        // Until the other enqueue waits for the lock `tx` holds.
        until_waiting_on_a_lock(&url, "ol_actors");
        tx.commit().expect("commit");
        wake.fire();
        let got = waiter.join().expect("thread");
        assert_eq!(got, Err(EnqueueError::DuplicateRowId { row: "x".into() }));
        let t = acquire(&*h.store, &a, "h", LEASE);
        let lane = lane_of(&*h.store, &a, URLS[0]);
        assert_eq!(
            row_ids(&claim_lane(&*h.store, &t, lane, 0, 10)),
            ["old", "x"]
        );
        assert!(
            h.store
                .find_lane(&a, &key(URLS[2]))
                .expect("find")
                .is_none()
        );
    });
}

/// A dead letter moving a one-recipient unit's inline payload to ol_rows while an enqueue of
/// the same row id waits for it: the enqueue must see the moved id once it may go on.
#[cfg(feature = "postgres")]
#[test]
fn postgres_enqueue_waiting_on_a_dead_letter_of_the_same_row_id() {
    run(Backend::Postgres, CommonOptions::default(), |h| {
        let (url, schema) = h.pg().expect("pg");
        let a = actor("alice");
        h.store
            .enqueue(&a, &[row("r1", &[URLS[0]])])
            .expect("enqueue");
        let t = acquire(&*h.store, &a, "h", LEASE);
        let lane = lane_of(&*h.store, &a, URLS[0]);
        let unit = claim_lane(&*h.store, &t, lane, 0, 10).units[0].id;
        // The store's dead letter, held open: its own connection, its own transaction. The
        // store runs it in one transaction too; holding it open is what a slow commit does.
        let mut c = pg_client(&url, &schema);
        let mut tx = c.transaction().expect("tx");
        tx.batch_execute(&format!(
            "WITH s AS (INSERT INTO ol_rows (actor, row_id, seq, content_type, body, body_len, dedup_key, \
               ordering_key, enqueued_at) \
             SELECT actor, row_id, seq, content_type, body, body_len, dedup_key, ordering_key, enqueued_at \
               FROM ol_units WHERE id = {u} RETURNING id) \
             UPDATE ol_units u SET row_ref = s.id, row_id = NULL, content_type = NULL, body = NULL, \
               body_len = NULL, dedup_key = NULL, ordering_key = NULL, enqueued_at = NULL \
             FROM s WHERE u.id = {u}",
            u = unit.0
        ))
        .expect("move the payload");
        let store = Arc::clone(&h.store);
        let a2 = a.clone();
        let waiter = std::thread::spawn(move || store.enqueue(&a2, &[row("r1", &[URLS[1]])]));
        until_waiting_on_a_lock(&url, "ol_actors");
        tx.commit().expect("commit");
        assert_eq!(
            waiter.join().expect("thread"),
            Err(EnqueueError::DuplicateRowId { row: "r1".into() })
        );
        assert!(
            h.store
                .find_lane(&a, &key(URLS[1]))
                .expect("find")
                .is_none()
        );
    });
}

#[test]
fn wait_returns_on_notify_and_subscribers_run() {
    let n = Notifier::new();
    let count = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&count);
    let sub = n.subscribe(move || {
        c.fetch_add(1, Ordering::SeqCst);
    });
    let seen = n.generation();
    let n2 = n.clone();
    let t = std::thread::spawn(move || n2.notify());
    let g = n.wait_timeout(seen, Duration::from_secs(30));
    t.join().expect("notifier thread");
    assert_ne!(g, seen);
    assert_eq!(count.load(Ordering::SeqCst), 1);
    drop(sub);
    n.notify();
    assert_eq!(count.load(Ordering::SeqCst), 1);
}
