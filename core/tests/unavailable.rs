//! Endpoints that fail for days (OL-8, issue 41): a run of failures across a lane's heads, the
//! lane found unavailable once it lasts longer than allowed (its units dead-lettered together),
//! its next unit starting a schedule of its own after an exhausted head, and the named retry
//! schedules — in virtual time, across passes, each pass knowing only what the store kept.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{T0, World, transcript_config};
use outbox_lanes_core::config::RetrySchedule;
use outbox_lanes_core::{Config, DeadReason, Outcome, Timestamp, UnitId};

fn hours(h: u64) -> Duration {
    Duration::from_secs(h * 3600)
}

/// The unit of a rendered `start u<N> <lane> #<k>`.
fn started(line: &str) -> Option<UnitId> {
    let rest = line.strip_prefix("start u")?;
    rest.split(' ').next()?.parse().ok().map(UnitId)
}

/// What happened to a lane whose recipient answers `answer(now)` to every attempt, pass after
/// pass (a new scheduler from the store's state whenever one is done), until `until`: every
/// rendered command with the time it came at.
fn run(
    w: &mut World,
    lane: &str,
    answer: &dyn Fn(Timestamp) -> Outcome,
    until: Timestamp,
) -> Vec<(Timestamp, String)> {
    let mut log = Vec::new();
    let mut seed = 1;
    for _ in 0..100_000 {
        let step = w.take();
        let starts: Vec<UnitId> = step.iter().filter_map(|l| started(l)).collect();
        log.extend(step.into_iter().map(|l| (w.now, l)));
        if w.now >= until {
            break;
        }
        if let Some(&unit) = starts.first() {
            w.outcome(unit, lane, answer(w.now));
            continue;
        }
        if w.s.poll_timeout().is_some() && !w.s.is_done(w.now) {
            w.jump_to_next_timeout();
            continue;
        }
        // The pass is over; the next one starts when the lane may be tried (or at once).
        w.end_pass();
        log.extend(w.take().into_iter().map(|l| (w.now, l)));
        if w.store.lanes_with_work().is_empty() {
            break;
        }
        let l = w.lane(lane);
        if let Some(t) = w.store.lane_info(l).not_before {
            w.now = w.now.max(t);
        }
        seed += 1;
        w.new_pass(seed);
    }
    log
}

fn count(log: &[(Timestamp, String)], what: &str) -> usize {
    log.iter().filter(|(_, l)| l.starts_with(what)).count()
}

/// Issue 41's numbers: 100 events queued behind an endpoint that answers 500 for ever. Each
/// unit gets its own schedule (about 2 h 04 min, never 12 h), and once the run of failures is
/// older than the threshold every unit left goes at once: no event waits longer than the
/// threshold plus one schedule, and the lane is reported unavailable once.
#[test]
fn a_hundred_events_behind_a_dead_endpoint_wait_no_longer_than_the_threshold_and_one_schedule() {
    let mut w = World::new(transcript_config());
    let units: Vec<UnitId> = (0..100).map(|_| w.enqueue(&["a"], false)[0]).collect();
    w.discover();
    let failing = |_| Outcome::Transient { retry_after: None };
    let log = run(
        &mut w,
        "a",
        &failing,
        T0 + Duration::from_secs(30 * 24 * 3600),
    );
    let dead: Vec<(Timestamp, UnitId, DeadReason)> = w
        .store
        .dead
        .iter()
        .map(|&(u, _, r)| {
            let at = log
                .iter()
                .find(|(_, l)| l.starts_with(&format!("dead {u:?} ")) || l.starts_with("retire a"))
                .map(|(t, _)| *t)
                .unwrap();
            (at, u, r)
        })
        .collect();
    assert_eq!(dead.len(), units.len(), "every unit is dead-lettered");
    let threshold = Config::default().lane_unavailable_after.unwrap();
    let exhausted: Vec<&(Timestamp, UnitId, DeadReason)> = dead
        .iter()
        .filter(|d| d.2 == DeadReason::Exhausted)
        .collect();
    let together = dead
        .iter()
        .filter(|d| d.2 == DeadReason::LaneUnavailable)
        .count();
    assert_eq!(exhausted.len() + together, units.len());
    // Each exhausted unit took its own schedule: 12 attempts over about 2 h 04 min.
    let mut last = T0;
    for d in &exhausted {
        let took = d.0.saturating_duration_since(last);
        assert!(
            took <= hours(3),
            "{:?} took {took:?} after the one before",
            d.1
        );
        last = d.0;
    }
    assert!(together > 0, "the rest went together");
    let end = dead.iter().map(|d| d.0).max().unwrap();
    assert!(
        end <= T0 + threshold + Duration::from_secs(2 * 3600 + 4 * 60 + 60),
        "the last unit went {:?} after the first failure",
        end.saturating_duration_since(T0)
    );
    eprintln!(
        "100 units behind a dead endpoint: {} exhausted one by one, {together} together; the \
         last after {:?}",
        exhausted.len(),
        end.saturating_duration_since(T0)
    );
    // The unavailable lane is reported once, with when its run began.
    assert_eq!(
        count(&log, "unavailable a"),
        1,
        "{:?}",
        &log[log.len() - 6..]
    );
    assert_eq!(count(&log, "failing a since +0s"), 1, "one run of failures");
    assert_eq!(count(&log, "retire a lane_unavailable"), 1);
}

/// After the lane is found unavailable, a unit enqueued later waits for the lane's next probe:
/// a failure sets it aside too (no second report), an answer makes the lane available again,
/// and a failure after that begins a new run, not an unavailable lane.
#[test]
fn an_unavailable_lane_sets_later_units_aside_at_its_probes_until_it_answers() {
    let config = Config {
        lane_unavailable_after: Some(hours(1)),
        ..transcript_config()
    };
    let mut w = World::new(config);
    w.enqueue(&["a"], false);
    w.enqueue(&["a"], false);
    w.discover();
    let healthy = std::cell::Cell::new(false);
    let answer = |_: Timestamp| {
        if healthy.get() {
            Outcome::Delivered
        } else {
            Outcome::Transient { retry_after: None }
        }
    };
    // Fail until the run passes the hour: both units go together.
    let log = run(&mut w, "a", &answer, T0 + hours(2));
    assert_eq!(count(&log, "unavailable a"), 1);
    assert_eq!(w.store.dead.len(), 2);
    assert!(
        w.store
            .dead
            .iter()
            .all(|d| d.2 == DeadReason::LaneUnavailable || d.2 == DeadReason::Exhausted)
    );
    let a = w.lane("a");
    assert!(w.store.lane_info(a).unavailable);
    // A unit enqueued meanwhile waits for the probe, fails, and goes too: no second report.
    let late = w.enqueue(&["a"], false)[0];
    w.end_pass();
    w.take();
    w.new_pass(50);
    let log = run(&mut w, "a", &answer, T0 + hours(6));
    assert_eq!(
        count(&log, "unavailable a"),
        0,
        "reported once per run: {log:?}"
    );
    assert!(
        w.store
            .dead
            .iter()
            .any(|&(u, _, r)| u == late && r == DeadReason::LaneUnavailable),
        "{:?}",
        w.store.dead
    );
    // It answers again: the next unit is delivered at the probe, and the lane is available.
    healthy.set(true);
    let back = w.enqueue(&["a"], false)[0];
    w.end_pass();
    w.take();
    w.new_pass(60);
    let log = run(&mut w, "a", &answer, T0 + hours(12));
    assert!(
        log.iter()
            .any(|(_, l)| *l == format!("delivered {back:?} a")),
        "{log:?}"
    );
    assert_eq!(count(&log, "answering a"), 1);
    let info = w.store.lane_info(a);
    assert!(
        !info.unavailable && info.failing_since.is_none(),
        "{info:?}"
    );
}

/// An operator's retry (`lanes retry`) clears the run in the store: the pass, told of it, takes
/// the next failure as the first of a new run.
#[test]
fn an_operators_retry_starts_a_new_run() {
    let config = Config {
        lane_unavailable_after: Some(hours(1)),
        ..transcript_config()
    };
    let mut w = World::new(config);
    let u1 = w.enqueue(&["a"], false)[0];
    w.discover();
    let a = w.lane("a");
    // The store says the lane has been failing for two hours and is unavailable.
    {
        let e = w.store.lane_state.entry(a).or_default();
        e.failing_since = Some(T0);
        e.unavailable = true;
    }
    w.now = T0 + hours(2);
    w.control("a");
    // The operator retried it: the store's run is cleared.
    {
        let e = w.store.lane_state.entry(a).or_default();
        e.failing_since = None;
        e.unavailable = false;
    }
    w.control("a");
    w.take();
    w.fail(u1, "a");
    assert_eq!(w.take()[..2], ["attempt u1 a 1", "failing a since +7200s"]);
}

/// After a unit is dead-lettered `exhausted`, its lane starts over: the next unit is tried at
/// once, with the in-pass ladder, not at the probes its predecessor had reached.
#[test]
fn after_an_exhausted_head_the_next_unit_starts_a_schedule_of_its_own() {
    let mut w = World::new(transcript_config());
    let u1 = w.enqueue(&["a"], false)[0];
    let u2 = w.enqueue(&["a"], false)[0];
    let a = w.lane("a");
    // u1 is at its last attempt, the lane deep in backoff (level 9) and due.
    w.store.units.get_mut(&u1).unwrap().admit.slots[0].attempts = 11;
    {
        let e = w.store.lane_state.entry(a).or_default();
        e.level = 9;
        e.not_before = Some(T0);
        e.failing_since = Some(T0);
    }
    w.discover();
    assert_eq!(w.take(), ["start u1 a #12"]);
    w.fail(u1, "a");
    let got = w.take();
    assert_eq!(
        &got[got.len() - 3..],
        ["dead u1 a exhausted", "restart a", "start u2 a #1"]
    );
    assert_eq!(
        (w.store.lane_info(a).level, w.store.lane_info(a).not_before),
        (0, None)
    );
    // Its failures follow the ladder again: retried in the pass after 1 s.
    w.fail(u2, "a");
    assert_eq!(w.take(), ["attempt u2 a 1"]);
    assert_eq!(w.jump_to_next_timeout(), T0 + Duration::from_secs(1));
}

/// The `svix` schedule: attempts 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and 10 h apart, then the
/// dead letter.
#[test]
fn the_svix_schedule_tries_at_its_times_and_gives_up_after_eight_attempts() {
    let mut config = transcript_config();
    RetrySchedule::Svix.apply(&mut config);
    config.lane_unavailable_after = None;
    let mut w = World::new(config);
    w.enqueue(&["a"], false);
    w.discover();
    let failing = |_| Outcome::Transient { retry_after: None };
    let log = run(&mut w, "a", &failing, T0 + hours(100));
    let starts: Vec<u64> = log
        .iter()
        .filter(|(_, l)| l.starts_with("start "))
        .map(|(t, _)| t.saturating_duration_since(T0).as_secs())
        .collect();
    let m = 60;
    let h = 3600;
    let mut want = vec![0, 5];
    for d in [5 * m, 30 * m, 2 * h, 5 * h, 10 * h, 10 * h] {
        want.push(want.last().unwrap() + d);
    }
    assert_eq!(starts, want);
    assert_eq!(w.store.dead.len(), 1);
    assert_eq!(w.store.dead[0].2, DeadReason::Exhausted);
    assert_eq!(RetrySchedule::from_code("svix"), Some(RetrySchedule::Svix));
    assert_eq!(RetrySchedule::Standard.as_str(), "standard");
}
