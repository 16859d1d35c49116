//! Model-based test: random sequences of enqueue / ack-head / dead-letter-head / replay, checked
//! after every step against an obviously-correct model (per-lane FIFO of units, nothing lost,
//! dead letters aside), on SQLite in memory, a SQLite file and Postgres.
#![allow(missing_docs, clippy::std_instead_of_core)]

mod common;

use std::collections::BTreeMap;

use common::*;
use outbox_lanes_core::{ActorId, DeadReason, Seq, UnitId};
use outbox_lanes_store::*;
use proptest::prelude::*;

const URLS: [&str; 3] = [
    "https://a.example/inbox",
    "https://b.example/inbox",
    "https://c.example/inbox",
];
const ACTORS: [&str; 2] = ["alice", "bob"];

#[derive(Clone, Debug)]
enum Op {
    /// Rows for an actor: each a non-empty recipient mask and a joined flag.
    Enqueue(usize, Vec<(u8, bool)>),
    AckHead(usize, usize),
    DeadHead(usize, usize),
    Replay(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..ACTORS.len(), prop::collection::vec((1u8..8, any::<bool>()), 1..4)).prop_map(|(a, r)| Op::Enqueue(a, r)),
        3 => (0..ACTORS.len(), 0..URLS.len()).prop_map(|(a, l)| Op::AckHead(a, l)),
        2 => (0..ACTORS.len(), 0..URLS.len()).prop_map(|(a, l)| Op::DeadHead(a, l)),
        1 => (0..ACTORS.len()).prop_map(Op::Replay),
    ]
}

/// One unit as the model sees it in one lane.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    unit: UnitId,
    served: bool,
}

#[derive(Default)]
struct Model {
    /// (actor, lane index) -> units in order.
    lanes: BTreeMap<(usize, usize), Vec<Entry>>,
    /// unit -> (actor, lanes still pending, all lanes)
    units: BTreeMap<UnitId, (usize, Vec<usize>, Vec<usize>)>,
    /// actor -> dead (unit, lane) in (original order of dead-lettering by seq) — kept with seq.
    dead: BTreeMap<usize, Vec<(Seq, UnitId, usize)>>,
    /// unit -> current seq
    seqs: BTreeMap<UnitId, Seq>,
    /// actor -> last seq handed out (rows and replay groups share the counter)
    last_seq: BTreeMap<usize, u64>,
    rows: usize,
}

impl Model {
    fn finish_if_done(&mut self, unit: UnitId) {
        let (a, pending, all) = self.units.get(&unit).cloned().expect("known unit");
        if pending.is_empty() {
            for l in all {
                if let Some(v) = self.lanes.get_mut(&(a, l)) {
                    v.retain(|e| e.unit != unit);
                }
            }
            self.units.remove(&unit);
        }
    }

    fn settle(&mut self, unit: UnitId, lane: usize) {
        let (a, pending, _) = self.units.get_mut(&unit).expect("known unit");
        pending.retain(|l| *l != lane);
        let a = *a;
        if let Some(e) = self
            .lanes
            .get_mut(&(a, lane))
            .and_then(|v| v.iter_mut().find(|e| e.unit == unit))
        {
            e.served = true;
        }
        self.finish_if_done(unit);
    }
}

fn run_ops(b: Backend, ops: Vec<Op>) {
    run(b, CommonOptions::default(), |h| {
        let s = &*h.store;
        let actors: Vec<ActorId> = ACTORS.iter().map(|a| actor(a)).collect();
        let tokens: Vec<SlotToken> = actors
            .iter()
            .map(|a| acquire(s, a, "model", LEASE))
            .collect();
        let mut m = Model::default();
        for op in ops {
            match op {
                Op::Enqueue(a, rows) => {
                    let new: Vec<NewRow> = rows
                        .iter()
                        .map(|(mask, joined)| {
                            m.rows += 1;
                            let to: Vec<&str> = (0..URLS.len())
                                .filter(|k| mask & (1 << k) != 0)
                                .map(|k| URLS[k])
                                .collect();
                            NewRow {
                                joined: *joined,
                                ..row(&format!("r{}", m.rows), &to)
                            }
                        })
                        .collect();
                    let out = s.enqueue(&actors[a], &new).expect("enqueue");
                    for ((mask, joined), e) in rows.iter().zip(out) {
                        m.last_seq.insert(a, e.seq.0);
                        let lanes: Vec<usize> =
                            (0..URLS.len()).filter(|k| mask & (1 << k) != 0).collect();
                        let groups: Vec<Vec<usize>> = if *joined {
                            vec![lanes]
                        } else {
                            lanes.into_iter().map(|l| vec![l]).collect()
                        };
                        assert_eq!(groups.len(), e.units.len());
                        for (g, unit) in groups.into_iter().zip(e.units) {
                            for l in &g {
                                m.lanes.entry((a, *l)).or_default().push(Entry {
                                    unit,
                                    served: false,
                                });
                            }
                            m.units.insert(unit, (a, g.clone(), g));
                            m.seqs.insert(unit, e.seq);
                        }
                    }
                }
                Op::AckHead(a, l) | Op::DeadHead(a, l) => {
                    let Some(head) = m
                        .lanes
                        .get(&(a, l))
                        .and_then(|v| v.iter().find(|e| !e.served))
                        .cloned()
                    else {
                        continue;
                    };
                    let lane = lane_of(s, &actors[a], URLS[l]);
                    let multi = m.units[&head.unit].2.len() > 1;
                    if matches!(op, Op::DeadHead(..)) && !multi {
                        s.dead_letter(
                            &tokens[a],
                            &DeadLetterRequest {
                                unit: head.unit,
                                lane,
                                reason: DeadReason::Permanent,
                                status: Some(400),
                                error: None,
                                at: now(),
                            },
                        )
                        .expect("dead letter");
                        m.dead
                            .entry(a)
                            .or_default()
                            .push((m.seqs[&head.unit], head.unit, l));
                    } else {
                        s.ack(&tokens[a], &[(head.unit, lane)]).expect("ack");
                    }
                    m.settle(head.unit, l);
                }
                Op::Replay(a) => {
                    let mut dead = m.dead.remove(&a).unwrap_or_default();
                    dead.sort();
                    let got = s
                        .replay_dead_letters(&DeadLetterSelection::Actor(actors[a].clone()))
                        .expect("replay");
                    let want: Vec<UnitId> = dead.iter().map(|d| d.1).collect();
                    assert_eq!(got, want, "replayed in original order");
                    let mut prev: Option<Seq> = None;
                    for (seq, unit, l) in dead {
                        if prev != Some(seq) {
                            *m.last_seq.entry(a).or_default() += 1;
                            prev = Some(seq);
                        }
                        m.seqs.insert(unit, Seq(m.last_seq[&a]));
                        m.lanes.entry((a, l)).or_default().push(Entry {
                            unit,
                            served: false,
                        });
                        m.units.insert(unit, (a, vec![l], vec![l]));
                    }
                }
            }
            // The store agrees with the model in every lane, and on the dead letters.
            for (a, act) in actors.iter().enumerate() {
                for (l, url) in URLS.iter().enumerate() {
                    let want: Vec<Entry> = m.lanes.get(&(a, l)).cloned().unwrap_or_default();
                    let got: Vec<Entry> = match s.find_lane(act, &key(url)).expect("find") {
                        None => Vec::new(),
                        Some(lane) => claim_lane(s, &tokens[a], lane, 0, 10_000)
                            .units
                            .iter()
                            .map(|u| Entry {
                                unit: u.id,
                                served: u
                                    .slots
                                    .iter()
                                    .find(|x| x.lane == lane)
                                    .expect("own slot")
                                    .served,
                            })
                            .collect(),
                    };
                    assert_eq!(got, want, "lane {url} of {act}");
                }
                let mut dl: Vec<(UnitId, String)> = s
                    .dead_letters(Some(act))
                    .expect("dl")
                    .into_iter()
                    .map(|d| (d.unit, d.key.recipient().to_string()))
                    .collect();
                dl.sort();
                let mut want: Vec<(UnitId, String)> = m
                    .dead
                    .get(&a)
                    .map(|v| {
                        v.iter()
                            .map(|(_, u, l)| (*u, key(URLS[*l]).recipient().to_string()))
                            .collect()
                    })
                    .unwrap_or_default();
                want.sort();
                assert_eq!(dl, want);
            }
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn sqlite_memory_matches_the_model(ops in prop::collection::vec(op(), 1..40)) {
        run_ops(Backend::SqliteMemory, ops);
    }
}

// Every case creates a fresh file database or Postgres schema (DDL and fsyncs): 64 cases
// took about eight minutes of CI. The same operations run 64 times on the in-memory store
// above; these check that the file and Postgres SQL agree with the model on fewer cases.
proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn sqlite_file_matches_the_model(ops in prop::collection::vec(op(), 1..25)) {
        run_ops(Backend::SqliteFile, ops);
    }

    #[test]
    fn postgres_matches_the_model(ops in prop::collection::vec(op(), 1..25)) {
        run_ops(Backend::Postgres, ops);
    }
}
