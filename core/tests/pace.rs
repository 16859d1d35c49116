//! Rate-limited endpoints (OL-23, issue 41): a lane with a pace starts its attempts at least
//! that far apart — first attempts, retries and probes alike, across passes — while lanes
//! beside it are not slowed. In virtual time.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{T0, World, transcript_config};
use outbox_lanes_core::{Config, Timestamp, UnitId};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The units of the `start` lines of `log`.
fn starts(log: &[String]) -> Vec<UnitId> {
    log.iter()
        .filter_map(|l| l.strip_prefix("start u"))
        .filter_map(|r| r.split(' ').next()?.parse().ok().map(UnitId))
        .collect()
}

fn paced(w: &mut World, lane: &str, pace: Duration) {
    let l = w.lane(lane);
    w.store.lane_state.entry(l).or_default().pace = Some(pace);
}

#[test]
fn a_paced_lane_starts_no_sooner_than_its_pace() {
    let mut w = World::new(transcript_config());
    paced(&mut w, "a", ms(100));
    let units: Vec<UnitId> = (0..3).map(|_| w.enqueue(&["a"], false)[0]).collect();
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1"]);
    w.ok(units[0], "a");
    // Answered at once: the next waits for the pace, and the pass is not over.
    assert_eq!(w.take(), ["delivered u1 a"]);
    assert!(!w.s.is_done(w.now));
    assert_eq!(w.s.poll_timeout(), Some(T0 + ms(100)));
    w.advance(ms(99));
    assert_eq!(w.take(), Vec::<String>::new());
    w.advance(ms(1));
    assert_eq!(w.take(), ["start u2 a #1"]);
    // An answer slower than the pace: the next starts at once.
    w.advance(ms(250));
    w.ok(units[1], "a");
    assert_eq!(w.take(), ["delivered u2 a", "start u3 a #1"]);
    w.ok(units[2], "a");
    assert!(w.s.is_done(w.now));
}

#[test]
fn ten_per_second_for_a_minute_is_six_hundred_starts() {
    let mut w = World::new(transcript_config());
    paced(&mut w, "a", ms(100));
    for _ in 0..1000 {
        w.enqueue(&["a"], false);
    }
    w.discover();
    let end = T0 + Duration::from_secs(60);
    let mut times: Vec<Timestamp> = Vec::new();
    for _ in 0..100_000 {
        let s = starts(&w.take());
        times.extend(s.iter().map(|_| w.now));
        if let Some(&u) = s.first() {
            // The recipient answers in 30 ms.
            w.advance(ms(30));
            w.ok(u, "a");
            continue;
        }
        let t = w.s.poll_timeout().expect("a paced head waits");
        if t >= end {
            break;
        }
        w.jump_to_next_timeout();
    }
    assert_eq!(times.len(), 600);
    for pair in times.windows(2) {
        assert!(pair[1].saturating_duration_since(pair[0]) >= ms(100));
    }
}

#[test]
fn a_lane_beside_a_paced_one_is_not_slowed() {
    let mut w = World::new(transcript_config());
    paced(&mut w, "slow", Duration::from_secs(1));
    let a: Vec<UnitId> = (0..5).map(|_| w.enqueue(&["slow"], false)[0]).collect();
    let b: Vec<UnitId> = (0..5).map(|_| w.enqueue(&["fast"], false)[0]).collect();
    w.discover();
    w.take();
    for &u in &b {
        w.ok(u, "fast");
    }
    w.ok(a[0], "slow");
    let delivered = w.store.delivered.len();
    assert_eq!(
        delivered, 6,
        "every fast unit and the first slow one, at T0"
    );
    assert_eq!(w.now, T0);
}

#[test]
fn a_retry_waits_for_the_pace_too() {
    let mut w = World::new(Config {
        retry_delays: vec![Duration::from_secs(1)],
        ..transcript_config()
    });
    paced(&mut w, "a", Duration::from_secs(5));
    let u = w.enqueue(&["a"], false)[0];
    w.discover();
    w.take();
    w.fail(u, "a");
    w.take();
    // Due after 1 s, but its lane's pace is 5 s.
    w.advance(Duration::from_secs(1));
    assert!(starts(&w.take()).is_empty());
    assert_eq!(w.jump_to_next_timeout(), T0 + Duration::from_secs(5));
    assert_eq!(starts(&w.take()), [u]);
}

#[test]
fn a_new_pass_keeps_the_pace_of_the_last_one() {
    let mut w = World::new(transcript_config());
    paced(&mut w, "a", ms(500));
    let u = w.enqueue(&["a"], false)[0];
    let l = w.lane("a");
    // The runtime remembers the last start of the earlier pass: not before T0 + 300 ms.
    w.store.lane_state.entry(l).or_default().paced_until = Some(T0 + ms(300));
    w.discover();
    assert!(w.take().is_empty());
    assert!(!w.s.is_done(w.now));
    assert_eq!(w.jump_to_next_timeout(), T0 + ms(300));
    assert_eq!(starts(&w.take()), [u]);
}

#[test]
fn a_joined_unit_starts_when_its_paced_lane_may() {
    let mut w = World::new(transcript_config());
    paced(&mut w, "a", ms(200));
    let first = w.enqueue(&["a"], false)[0];
    let joined = w.enqueue(&["a", "b"], true)[0];
    w.discover();
    assert_eq!(starts(&w.take()), [first]);
    w.ok(first, "a");
    // It heads both lanes, b is idle, but a's pace holds the unit whole (OL-1).
    assert!(starts(&w.take()).is_empty());
    assert_eq!(w.jump_to_next_timeout(), T0 + ms(200));
    assert_eq!(w.take(), ["start u2 a #1", "start u2 b #1"]);
    w.ok(joined, "a");
    w.ok(joined, "b");
    assert!(w.s.is_done(w.now));
}

#[test]
fn a_pass_that_stops_hands_back_a_head_waiting_for_its_pace() {
    let mut w = World::new(transcript_config());
    paced(&mut w, "a", Duration::from_secs(10));
    let units: Vec<UnitId> = (0..2).map(|_| w.enqueue(&["a"], false)[0]).collect();
    w.discover();
    w.take();
    w.ok(units[0], "a");
    w.take();
    w.end_pass();
    assert_eq!(w.take(), ["back u2"]);
    assert!(w.s.is_done(w.now));
}
