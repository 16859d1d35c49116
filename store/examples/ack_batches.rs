//! What an ack costs on a file store, by the size of the ack writer's batches: 200,000 units
//! (2,000 rows to 100 recipients, so payloads are shared), claimed lane by lane five at a
//! time as a pass does, their payloads read, and acked in batches of 70, 500 and 2,000. Each
//! batch size gets a fresh database. It prints µs per unit; it asserts nothing.
//!
//! Run: `cargo run --release -p outbox-lanes-store --example ack_batches [RECIPIENTS]`.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use outbox_lanes_core::{ActorId, Seq, UnitId};
use outbox_lanes_store::{
    ClaimRange, DriverStore, NewRow, ServiceStore, SlotAcquisition, SqliteOptions, SqliteStore,
    StoreLaneId,
};

const UNITS: usize = 200_000;

fn main() {
    let recipients: usize = std::env::args()
        .nth(1)
        .map_or(100, |s| s.parse().expect("RECIPIENTS is a number"));
    for batch in [70, 500, 2000] {
        run(recipients, batch);
    }
}

fn run(recipients: usize, batch: usize) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("outbox.db"), SqliteOptions::default()).unwrap();
    let actor = ActorId::new("bench");
    let to: Vec<String> = (0..recipients)
        .map(|r| format!("http://127.0.0.1:1/r{r}"))
        .collect();
    let rows = UNITS / recipients;
    for k in (0..rows).step_by(20) {
        let chunk: Vec<NewRow> = (k..(k + 20).min(rows))
            .map(|i| NewRow {
                id: format!("e{i}"),
                body: vec![b'x'; 200],
                content_type: "application/json".into(),
                recipients: to.clone(),
                ..NewRow::default()
            })
            .collect();
        store.enqueue(&actor, &chunk).unwrap();
    }
    let SlotAcquisition::Acquired(slot) = store
        .acquire_slot(&actor, "bench", Duration::from_secs(3600))
        .unwrap()
    else {
        panic!("the slot is free")
    };
    let (lanes, _) = store.lanes_with_work(&slot, 0).unwrap();
    let mut cursors: Vec<(StoreLaneId, Seq)> = lanes.iter().map(|l| (l.lane, Seq(0))).collect();
    let (mut claim, mut payloads, mut ack) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut acked = 0;
    let mut waiting: Vec<(UnitId, StoreLaneId)> = Vec::new();
    while !cursors.is_empty() || !waiting.is_empty() {
        let claims: Vec<ClaimRange> = cursors
            .iter()
            .map(|&(lane, from)| ClaimRange {
                lane,
                from,
                limit: 5,
            })
            .collect();
        let t0 = Instant::now();
        let claimed = if claims.is_empty() {
            Vec::new()
        } else {
            store.claim(&slot, &claims).unwrap()
        };
        claim += t0.elapsed();
        let mut ids = Vec::new();
        for lane in &claimed {
            for u in &lane.units {
                ids.push(u.id);
                waiting.push((u.id, lane.lane));
            }
            if let (Some(c), Some(last)) = (
                cursors.iter_mut().find(|c| c.0 == lane.lane),
                lane.units.last(),
            ) {
                c.1 = Seq(last.seq.0 + 1);
            }
        }
        cursors.retain(|c| !claimed.iter().any(|l| l.lane == c.0 && l.exhausted));
        let t0 = Instant::now();
        for chunk in ids.chunks(20) {
            for p in store.payloads(chunk) {
                p.unwrap();
            }
        }
        payloads += t0.elapsed();
        if waiting.len() < batch && !cursors.is_empty() {
            continue;
        }
        for chunk in waiting.chunks(batch) {
            let t0 = Instant::now();
            store.ack(&slot, chunk).unwrap();
            ack += t0.elapsed();
            acked += chunk.len();
        }
        waiting.clear();
    }
    assert_eq!(acked, UNITS / recipients * recipients);
    let us = |d: Duration| d.as_secs_f64() * 1e6 / acked as f64;
    println!(
        "{recipients} recipient(s), {acked} units, acks in batches of {batch}: ack {:.2} µs/unit (claim {:.2}, payload read {:.2})",
        us(ack),
        us(claim),
        us(payloads)
    );
}
