//! Throughput of the sans-IO scheduler: units per second streaming through the bounded
//! admission window, admit → start → complete, driven by a minimal runtime loop.
//!
//! Each timed iteration is one whole pass on a fresh scheduler whose lanes were interned
//! outside the timing (interning is benchmarked on its own in `lane_intern`). The pass
//! includes discovery (`handle_lane` for every lane), every claim the scheduler asks for,
//! the admission, start and completion of every unit, and `handle_pass_end`.
//!
//! The in-bench store hands out lane heads from per-lane lists built once per case, with a
//! per-lane cursor that only moves forward: a claim costs O(units returned), never a rescan.
//! Every recipient answers 2xx at once, so the figures are the scheduler's own cost.
//!
//! Before a case is measured it is driven once with full checks (every unit delivered
//! exactly once per lane, in `seq` order per lane, first attempt only); the timed passes
//! check the delivery count and an id checksum, so a broken scheduler cannot post a fast
//! figure.
#![allow(missing_docs)]

use std::collections::VecDeque;
use std::hint::black_box;
use std::mem;

use criterion::{
    BatchSize, BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use outbox_lanes_core::{
    Admit, Command, Config, LaneChunk, LaneClaim, LaneId, LaneInfo, LaneKey, Outcome, Scheduler,
    Seq, Timestamp, UnitId,
};

const NOW: Timestamp = Timestamp::from_secs(1_700_000_000);
const SEED: u64 = 7;

/// The units of one case: unit `i` has `seq = i + 1`, `id = i + 1`, and occupies `width`
/// lanes. Single-lane units go round-robin (lane `l`'s `k`-th unit is `i = k * lanes + l`);
/// joined units occupy `width` distinct lanes picked by a hash of `i`.
struct Workload {
    lanes: usize,
    width: usize,
    units: usize,
    /// Per lane, the indices of its units in `seq` order.
    per_lane: Vec<Vec<u32>>,
    keys: Vec<LaneKey>,
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Workload {
    fn new(lanes: usize, width: usize, units: usize) -> Self {
        assert!(
            width == 1 || (width == 3 && lanes >= 3),
            "widths 1 and 3 only"
        );
        assert!(u32::try_from(units).is_ok());
        let mut w = Workload {
            lanes,
            width,
            units,
            per_lane: vec![Vec::new(); lanes],
            keys: (0..lanes)
                .map(|l| LaneKey::from_canonical(format!("https://r{l}.example/inbox"), None))
                .collect(),
        };
        for i in 0..units {
            for l in w.lanes_of(i) {
                w.per_lane[l].push(i as u32);
            }
        }
        w
    }

    /// The lane numbers of unit `i` (lane number `n` is the `n`-th interned key).
    fn lanes_of(&self, i: usize) -> impl Iterator<Item = usize> + use<> {
        let l = self.lanes;
        let mut out = [0usize; 3];
        if self.width == 1 {
            out[0] = i % l;
        } else {
            let h = splitmix(i as u64);
            let a = (h % l as u64) as usize;
            let d1 = 1 + ((h >> 21) % (l as u64 - 1)) as usize;
            let mut d2 = 1 + ((h >> 42) % (l as u64 - 2)) as usize;
            if d2 >= d1 {
                d2 += 1;
            }
            out = [a, (a + d1) % l, (a + d2) % l];
        }
        out.into_iter().take(self.width)
    }

    /// `sum(ids)` over every (unit, lane) delivery.
    fn id_checksum(&self) -> u64 {
        let n = self.units as u64;
        (n * (n + 1) / 2).wrapping_mul(self.width as u64)
    }

    fn deliveries(&self) -> usize {
        self.units * self.width
    }
}

/// A fresh scheduler with every lane of `w` interned; `lanes[n]` is lane number `n`.
fn interned(w: &Workload, config: &Config) -> (Scheduler, Vec<LaneId>) {
    let mut sched = Scheduler::new(config.clone(), SEED);
    let lanes = w.keys.iter().map(|k| sched.lane(k)).collect();
    (sched, lanes)
}

/// The store's side of a pass: per-lane read cursors over the workload.
struct Store<'w> {
    w: &'w Workload,
    lanes: Vec<LaneId>,
    cursor: Vec<usize>,
}

impl<'w> Store<'w> {
    fn new(w: &'w Workload, lanes: Vec<LaneId>) -> Self {
        assert!(lanes.iter().enumerate().all(|(n, l)| l.index() == n));
        Store {
            w,
            lanes,
            cursor: vec![0; w.lanes],
        }
    }

    fn admit(&self, i: u32) -> Admit {
        let id = UnitId(u64::from(i) + 1);
        let seq = Seq(u64::from(i) + 1);
        if self.w.width == 1 {
            Admit::single(id, seq, self.lanes[i as usize % self.w.lanes])
        } else {
            let mut ls = [self.lanes[0]; 3];
            for (slot, n) in ls.iter_mut().zip(self.w.lanes_of(i as usize)) {
                *slot = self.lanes[n];
            }
            Admit::joined(id, seq, &ls[..self.w.width])
        }
    }

    /// Reads the next pending units of each claimed lane (`seq >= from`, at most `limit`).
    fn claim(&mut self, claims: &[LaneClaim]) -> Vec<LaneChunk> {
        claims
            .iter()
            .map(|c| {
                let n = c.lane.index();
                let list = &self.w.per_lane[n];
                let mut cur = self.cursor[n];
                // Without hand-backs `from` never goes back, so the cursor only moves on.
                assert!(
                    cur == 0 || u64::from(list[cur - 1]) + 1 < c.from.0,
                    "claim of lane {n} went back"
                );
                while cur < list.len() && u64::from(list[cur]) + 1 < c.from.0 {
                    cur += 1;
                }
                self.cursor[n] = cur;
                let end = (cur + c.limit as usize).min(list.len());
                LaneChunk {
                    lane: c.lane,
                    units: list[cur..end].iter().map(|&i| self.admit(i)).collect(),
                    exhausted: end - cur < c.limit as usize,
                }
            })
            .collect()
    }
}

/// Executes the commands queued by the last `handle_*` call: starts are collected for the
/// next round, deliveries go to `delivered`; nothing else may happen in a clean pass.
fn drain(
    sched: &mut Scheduler,
    starts: &mut Vec<(UnitId, LaneId)>,
    delivered: &mut impl FnMut(UnitId, LaneId),
) {
    while let Some(cmd) = sched.poll_command() {
        match cmd {
            Command::Start {
                unit,
                lane,
                attempt,
            } => {
                assert_eq!(attempt, 1, "a clean pass retries nothing");
                starts.push((unit, lane));
            }
            Command::Delivered { unit, lane } => delivered(unit, lane),
            Command::RecordAttempt { .. }
            | Command::Interrupted { .. }
            | Command::Hold { .. }
            | Command::LaneBackoff { .. }
            | Command::LaneOpen { .. }
            | Command::LaneFailing { .. }
            | Command::LaneRestart { .. }
            | Command::LaneUnavailable { .. }
            | Command::DeadLetter { .. }
            | Command::RetireLane { .. }
            | Command::HandBack { .. } => panic!("unexpected in a clean pass: {cmd:?}"),
        }
    }
}

/// One pass, as a runtime drives it: discover the lanes, then until done read what the
/// scheduler claims, and complete the attempts started in the previous round.
fn run_pass(
    sched: &mut Scheduler,
    store: &mut Store<'_>,
    mut delivered: impl FnMut(UnitId, LaneId),
) -> usize {
    let mut starts = Vec::new();
    let mut batch = Vec::new();
    let mut started = 0usize;
    for n in 0..store.lanes.len() {
        sched.handle_lane(store.lanes[n], LaneInfo::default(), NOW);
        drain(sched, &mut starts, &mut delivered);
    }
    // The iteration budget: a scheduler that stops making progress fails the bench.
    let mut budget = 4 * store.w.deliveries() + 1000;
    while !sched.is_done(NOW) {
        budget = budget.checked_sub(1).expect("the pass makes progress");
        if let Some(claims) = sched.poll_claim(NOW) {
            let chunks = store.claim(&claims);
            let report = sched.handle_claimed(chunks, NOW);
            assert!(report.refused.is_empty(), "refused: {:?}", report.refused);
            drain(sched, &mut starts, &mut delivered);
        }
        mem::swap(&mut starts, &mut batch);
        started += batch.len();
        for &(unit, lane) in &batch {
            sched
                .handle_outcome(unit, lane, Outcome::Delivered, NOW)
                .expect("the attempt is in flight");
            drain(sched, &mut starts, &mut delivered);
        }
        batch.clear();
    }
    sched.handle_pass_end(NOW);
    drain(sched, &mut starts, &mut delivered);
    assert!(starts.is_empty());
    started
}

/// Drives `w` once with full checks: every (unit, lane) delivered exactly once, in `seq`
/// order per lane, and started exactly once.
fn verify(w: &Workload, config: &Config) {
    let (mut sched, lanes) = interned(w, config);
    let mut store = Store::new(w, lanes);
    let mut count = vec![0u8; w.deliveries()];
    let mut last = vec![0u64; w.lanes];
    let started = run_pass(&mut sched, &mut store, |unit, lane| {
        let i = (unit.0 - 1) as usize;
        let n = lane.index();
        let pos = w
            .lanes_of(i)
            .position(|l| l == n)
            .expect("delivered to one of its lanes");
        count[i * w.width + pos] += 1;
        assert!(last[n] < unit.0, "lane {n} out of order");
        last[n] = unit.0;
    });
    assert_eq!(started, w.deliveries());
    assert!(
        count.iter().all(|&c| c == 1),
        "every (unit, lane) exactly once"
    );
    assert_eq!(sched.admitted(), 0);
}

fn bench_pass(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    id: BenchmarkId,
    w: &Workload,
    config: &Config,
) {
    g.throughput(Throughput::Elements(w.units as u64));
    let mut verified = false;
    g.bench_function(id, |b| {
        // Only for the cases the filter selects, once.
        if !verified {
            verify(w, config);
            verified = true;
        }
        b.iter_batched(
            || interned(w, config),
            |(mut sched, lanes)| {
                let mut store = Store::new(w, lanes);
                let (mut n, mut sum) = (0usize, 0u64);
                run_pass(&mut sched, &mut store, |unit, _| {
                    n += 1;
                    sum = sum.wrapping_add(unit.0);
                });
                assert_eq!((n, sum), (w.deliveries(), w.id_checksum()));
                sched
            },
            BatchSize::LargeInput,
        );
    });
}

/// The floor: as many units as the pass moves, each built as the store builds it, pushed
/// through a bare `VecDeque` and popped again.
fn bench_floor(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>, n: usize) {
    let lane = Scheduler::new(Config::default(), SEED).lane(&LaneKey::from_canonical(
        String::from("https://r0.example/inbox"),
        None,
    ));
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function(BenchmarkId::new("vecdeque_floor", n), |b| {
        b.iter(|| {
            let mut q: VecDeque<Admit> = VecDeque::new();
            for i in 0..n as u64 {
                q.push_back(black_box(Admit::single(UnitId(i + 1), Seq(i + 1), lane)));
            }
            let mut sum = 0u64;
            while let Some(a) = q.pop_front() {
                sum = sum.wrapping_add(black_box(a).id.0);
            }
            assert_eq!(sum, n as u64 * (n as u64 + 1) / 2);
            sum
        });
    });
}

/// Units/s by lane count (single-lane units), and for 3-lane joined units.
fn by_lanes(c: &mut Criterion) {
    const UNITS: usize = 100_000;
    let config = Config::default();
    let mut g = c.benchmark_group("scheduler_lanes");
    g.sample_size(10).sampling_mode(SamplingMode::Flat);
    for lanes in [1, 100, 10_000] {
        let w = Workload::new(lanes, 1, UNITS);
        bench_pass(&mut g, BenchmarkId::new("single", lanes), &w, &config);
    }
    let w = Workload::new(100, 3, UNITS);
    bench_pass(&mut g, BenchmarkId::new("joined3", 100), &w, &config);
    bench_floor(&mut g, UNITS);
    g.finish();
}

/// Joined units over many lanes: many joined units are reached by some of their lanes and
/// wait for the others, so a cost per finished unit that grows with them shows here.
fn by_joined_lanes(c: &mut Criterion) {
    const UNITS: usize = 20_000;
    let config = Config::default();
    let mut g = c.benchmark_group("scheduler_joined");
    g.sample_size(10).sampling_mode(SamplingMode::Flat);
    for lanes in [1_000, 10_000] {
        let w = Workload::new(lanes, 3, UNITS);
        bench_pass(&mut g, BenchmarkId::new("joined3", lanes), &w, &config);
    }
    g.finish();
}

/// Per-unit cost by pass size, at 100 lanes.
fn by_units(c: &mut Criterion) {
    let config = Config::default();
    let mut g = c.benchmark_group("scheduler_units");
    g.sample_size(10).sampling_mode(SamplingMode::Flat);
    for units in [1_000, 10_000, 100_000, 1_000_000] {
        let w = Workload::new(100, 1, units);
        bench_pass(
            &mut g,
            BenchmarkId::new("single_100_lanes", units),
            &w,
            &config,
        );
        bench_floor(&mut g, units);
    }
    g.finish();
}

/// Interning lane keys: first sight (a new scheduler) and lookups of known keys.
fn lane_intern(c: &mut Criterion) {
    const LANES: usize = 10_000;
    let w = Workload::new(LANES, 1, 0);
    let mut g = c.benchmark_group("lane_intern");
    g.sample_size(20);
    g.throughput(Throughput::Elements(LANES as u64));
    g.bench_function(BenchmarkId::new("new", LANES), |b| {
        b.iter_batched(
            || Scheduler::new(Config::default(), SEED),
            |mut sched| {
                for k in &w.keys {
                    black_box(sched.lane(k));
                }
                sched
            },
            BatchSize::LargeInput,
        );
    });
    let (mut sched, _) = interned(&w, &Config::default());
    g.bench_function(BenchmarkId::new("known", LANES), |b| {
        b.iter(|| {
            for k in &w.keys {
                black_box(sched.lane(k));
            }
        });
    });
    g.finish();
}

criterion_group!(benches, by_lanes, by_joined_lanes, by_units, lane_intern);
criterion_main!(benches);
