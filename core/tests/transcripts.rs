//! Transcript tests: for each canonical scenario, the exact sequence of commands.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::{T0, World, transcript_config};
use outbox_lanes_core::config::MAX_BACKOFF_LEVEL;
use outbox_lanes_core::{
    Acquire, AliasResolver, Config, DrainSlots, LaneInfo, Outcome, Release, UnitId,
};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn concurrent_drain_requests_deliver_one_recipients_rows_in_order_one_in_flight() {
    let mut slots = DrainSlots::new();
    let actor = outbox_lanes_core::ActorId::new("https://a.example/actor");
    // Two drain requests arrive together: only one pass runs.
    assert_eq!(slots.try_acquire(&actor), Acquire::Acquired);
    assert_eq!(slots.try_acquire(&actor), Acquire::Merged);

    let mut w = World::new(transcript_config());
    let u: Vec<UnitId> = (0..3).map(|_| w.enqueue(&["p"], false)[0]).collect();
    w.discover();
    assert_eq!(w.take(), ["start u1 p #1"]);
    w.ok(u[0], "p");
    assert_eq!(w.take(), ["delivered u1 p", "start u2 p #1"]);
    w.ok(u[1], "p");
    assert_eq!(w.take(), ["delivered u2 p", "start u3 p #1"]);
    w.ok(u[2], "p");
    assert_eq!(w.take(), ["delivered u3 p"]);
    assert!(w.s.is_done(w.now));
    w.end_pass();
    assert!(w.take().is_empty());
    // The merged request made the holder look once more before releasing.
    assert_eq!(slots.release(&actor), Release::LookAgain);
    assert_eq!(slots.release(&actor), Release::Released);
}

#[test]
fn a_slow_recipient_does_not_delay_another() {
    let mut w = World::new(transcript_config());
    let slow = w.enqueue(&["slow"], false)[0];
    let f1 = w.enqueue(&["fast"], false)[0];
    let f2 = w.enqueue(&["fast"], false)[0];
    w.discover();
    assert_eq!(w.take(), ["start u1 slow #1", "start u2 fast #1"]);
    w.ok(f1, "fast");
    assert_eq!(w.take(), ["delivered u2 fast", "start u3 fast #1"]);
    w.ok(f2, "fast");
    assert_eq!(w.take(), ["delivered u3 fast"]);
    // The slow one is still in flight; the pass is not over.
    assert!(!w.s.is_done(w.now));
    w.advance(secs(25));
    w.ok(slow, "slow");
    assert_eq!(w.take(), ["delivered u1 slow"]);
    assert!(w.s.is_done(w.now));
}

#[test]
fn a_joined_row_waits_for_its_predecessor_in_a_and_delays_bs_successor() {
    let mut w = World::new(transcript_config());
    let a1 = w.enqueue(&["a"], false)[0];
    let j = w.enqueue(&["a", "b"], true)[0];
    let b2 = w.enqueue(&["b"], false)[0];
    w.discover();
    // Only a1 can start: j waits behind it in a, b2 waits behind j in b.
    assert_eq!(w.take(), ["start u1 a #1"]);
    w.ok(a1, "a");
    assert_eq!(
        w.take(),
        ["delivered u1 a", "start u2 a #1", "start u2 b #1"]
    );
    w.ok(j, "b");
    // Served for b, but j still occupies b until it is complete.
    assert_eq!(w.take(), ["delivered u2 b"]);
    w.ok(j, "a");
    assert_eq!(w.take(), ["delivered u2 a", "start u3 b #1"]);
    w.ok(b2, "b");
    assert_eq!(w.take(), ["delivered u3 b"]);
}

#[test]
fn a_unit_that_keeps_failing_stalls_and_its_lane_mate_is_never_started() {
    let mut w = World::new(transcript_config());
    let a1 = w.enqueue(&["a"], false)[0];
    let _a2 = w.enqueue(&["a"], false)[0];
    let b1 = w.enqueue(&["b"], false)[0];
    let b2 = w.enqueue(&["b"], false)[0];
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1", "start u3 b #1"]);
    w.fail(a1, "a");
    assert_eq!(w.take(), ["attempt u1 a 1", "failing a since +0s"]);
    w.ok(b1, "b");
    assert_eq!(w.take(), ["delivered u3 b", "start u4 b #1"]);
    assert_eq!(w.jump_to_next_timeout(), common::T0 + secs(1));
    assert_eq!(w.take(), ["start u1 a #2"]);
    w.fail(a1, "a");
    assert_eq!(w.take(), ["attempt u1 a 2"]);
    w.ok(b2, "b");
    assert_eq!(w.take(), ["delivered u4 b"]);
    w.jump_to_next_timeout();
    assert_eq!(w.take(), ["start u1 a #3"]);
    w.fail(a1, "a");
    assert_eq!(w.take(), ["attempt u1 a 3"]);
    w.jump_to_next_timeout();
    assert_eq!(w.take(), ["start u1 a #4"]);
    w.fail(a1, "a");
    // 1 + 2 + 4 s of in-pass retries; the 4th failure stalls it into a 30 s lane backoff.
    assert_eq!(
        w.take(),
        [
            "attempt u1 a 4",
            "backoff a until +37s level 1",
            "hold u1 a Stalled",
            "back u2",
        ]
    );
    assert!(w.s.is_done(w.now));
    w.end_pass();
    assert_eq!(w.take(), ["back u1"]);
}

#[test]
fn a_unit_enqueued_during_a_stall_goes_behind_the_stalled_ones() {
    let mut w = World::new(Config {
        pass_attempts: 1,
        ..transcript_config()
    });
    let a1 = w.enqueue(&["a"], false)[0];
    let a2 = w.enqueue(&["a"], false)[0];
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1"]);
    w.fail(a1, "a");
    assert_eq!(
        w.take(),
        [
            "attempt u1 a 1",
            "failing a since +0s",
            "backoff a until +30s level 1",
            "hold u1 a Stalled",
            "back u2"
        ]
    );
    // A producer enqueues while the lane is stalled; the pass hears of it.
    let a3 = w.enqueue(&["a"], false)[0];
    w.discover();
    assert!(w.take().is_empty(), "nothing starts in a stalled lane");
    w.end_pass();
    assert_eq!(w.take(), ["back u1"]);

    // The next pass, once the backoff is over: the probe, then the others in order.
    w.advance(secs(30));
    w.discover();
    assert_eq!(w.take(), ["start u1 a #2"]);
    w.ok(a1, "a");
    assert_eq!(
        w.take(),
        ["delivered u1 a", "answering a", "open a", "start u2 a #1"]
    );
    w.ok(a2, "a");
    assert_eq!(w.take(), ["delivered u2 a", "start u3 a #1"]);
    w.ok(a3, "a");
    assert_eq!(w.take(), ["delivered u3 a"]);
}

#[test]
fn a_unit_at_its_last_attempt_is_dead_lettered_once_and_releases_its_lane() {
    let mut w = World::new(transcript_config());
    let a1 = w.enqueue(&["a"], false)[0];
    let a2 = w.enqueue(&["a"], false)[0];
    // Eleven attempts were persisted by earlier passes.
    w.store.units.get_mut(&a1).expect("stored").admit.slots[0].attempts = 11;
    w.discover();
    assert_eq!(w.take(), ["start u1 a #12"]);
    w.fail(a1, "a");
    assert_eq!(
        w.take(),
        [
            "attempt u1 a 12",
            "failing a since +0s",
            "dead u1 a exhausted",
            "start u2 a #1"
        ]
    );
    w.ok(a2, "a");
    assert_eq!(w.take(), ["delivered u2 a", "answering a"]);
    assert_eq!(w.store.dead.len(), 1);
    // A late duplicate completion changes nothing.
    let l = w.lane("a");
    assert!(
        w.s.handle_outcome(a1, l, Outcome::Delivered, w.now)
            .is_err()
    );
    assert!(w.take().is_empty());
}

#[test]
fn a_second_drain_request_while_one_runs_does_not_start_a_pass() {
    let mut slots = DrainSlots::new();
    let a = outbox_lanes_core::ActorId::new("alice");
    let b = outbox_lanes_core::ActorId::new("bob");
    assert_eq!(slots.try_acquire(&a), Acquire::Acquired);
    assert_eq!(slots.try_acquire(&a), Acquire::Merged);
    assert_eq!(slots.try_acquire(&a), Acquire::Merged);
    // Another actor is independent.
    assert_eq!(slots.try_acquire(&b), Acquire::Acquired);
    assert_eq!(slots.running(), 2);
    // Two merged requests cost one more look, not two.
    assert_eq!(slots.release(&a), Release::LookAgain);
    assert_eq!(slots.release(&a), Release::Released);
    assert_eq!(slots.release(&b), Release::Released);
    assert_eq!(slots.running(), 0);
}

#[test]
fn a_request_from_inside_a_running_pass_comes_back_later_and_the_holder_looks_again() {
    let mut slots = DrainSlots::new();
    let actor = outbox_lanes_core::ActorId::new("cm");
    let mut w = World::new(transcript_config());
    let u1 = w.enqueue(&["peer"], false)[0];
    assert_eq!(slots.try_acquire(&actor), Acquire::Acquired);
    w.discover();
    assert_eq!(w.take(), ["start u1 peer #1"]);
    // The recipient, while handling u1, makes the actor enqueue and drain again (a loopback
    // delivery re-entering the drain). The nested request must not wait for the slot.
    let u2 = w.enqueue(&["peer"], false)[0];
    assert_eq!(slots.try_acquire(&actor), Acquire::Merged);
    w.ok(u1, "peer");
    assert_eq!(w.take(), ["delivered u1 peer"]);
    assert!(w.s.is_done(w.now));
    w.end_pass();
    // The holder is told to look again and finds u2.
    assert_eq!(slots.release(&actor), Release::LookAgain);
    w.discover();
    assert_eq!(w.take(), ["start u2 peer #1"]);
    w.ok(u2, "peer");
    w.end_pass();
    assert_eq!(w.take(), ["delivered u2 peer"]);
    assert_eq!(slots.release(&actor), Release::Released);
}

#[test]
fn two_spellings_of_one_actor_share_one_slot() {
    let resolver = AliasResolver::new().actor("https://cm.example/actors/cm", &["cm"]);
    let mut slots = DrainSlots::new();
    let (a, first) = slots
        .try_acquire_spelled(&resolver, "https://cm.example/actors/cm")
        .expect("known");
    let (b, second) = slots
        .try_acquire_spelled(&resolver, "cm")
        .expect("known alias");
    assert_eq!(a, b);
    assert_eq!((first, second), (Acquire::Acquired, Acquire::Merged));
    assert!(slots.try_acquire_spelled(&resolver, "nobody").is_err());
    assert_eq!(slots.release(&a), Release::LookAgain);
}

#[test]
fn an_error_mid_pass_hands_back_every_unfinished_unit_in_enqueue_order() {
    let mut w = World::new(Config {
        pass_attempts: 1,
        ..transcript_config()
    });
    let a1 = w.enqueue(&["a"], false)[0];
    let _b1 = w.enqueue(&["b"], false)[0];
    let _a2 = w.enqueue(&["a"], false)[0];
    let _c1 = w.enqueue(&["c"], false)[0];
    let _c2 = w.enqueue(&["c"], false)[0];
    w.discover();
    assert_eq!(
        w.take(),
        ["start u1 a #1", "start u2 b #1", "start u4 c #1"]
    );
    w.fail(a1, "a");
    assert_eq!(
        w.take(),
        [
            "attempt u1 a 1",
            "failing a since +0s",
            "backoff a until +30s level 1",
            "hold u1 a Stalled",
            "back u3"
        ]
    );
    // The runtime hits an error: everything unfinished goes back, stalled and in flight too;
    // each attempt cut off in flight is recorded first, uncounted (OL-14).
    w.s.handle_interrupt(w.now);
    w.settle();
    assert_eq!(
        w.take(),
        [
            "interrupted u2 b 0",
            "interrupted u4 c 0",
            "back u1",
            "back u2",
            "back u4",
            "back u5"
        ]
    );
    assert_eq!(w.s.admitted(), 0);
    assert_eq!(w.store.units.len(), 5, "nothing was lost");
}

#[test]
fn a_joined_unit_stalled_on_a_keeps_bs_later_units_waiting_without_backoff_on_b() {
    let mut w = World::new(Config {
        pass_attempts: 2,
        ..transcript_config()
    });
    let j = w.enqueue(&["a", "b"], true)[0];
    let b2 = w.enqueue(&["b"], false)[0];
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1", "start u1 b #1"]);
    w.ok(j, "b");
    w.fail(j, "a");
    assert_eq!(
        w.take(),
        ["delivered u1 b", "attempt u1 a 1", "failing a since +0s"]
    );
    w.jump_to_next_timeout();
    // Only a is retried.
    assert_eq!(w.take(), ["start u1 a #2"]);
    w.fail(j, "a");
    assert_eq!(
        w.take(),
        [
            "attempt u1 a 2",
            "backoff a until +31s level 1",
            "hold u1 a Stalled"
        ]
    );
    // b2 waits behind j; b has no backoff.
    assert!(w.s.is_done(w.now));
    let b = w.lane("b");
    assert_eq!(w.store.lane_info(b).not_before, None);
    w.end_pass();
    assert_eq!(w.take(), ["back u1", "back u2"]);

    // Later: a is probed; only a, not b, gets j again; then b2 goes.
    w.advance(secs(31));
    w.discover();
    assert_eq!(w.take(), ["start u1 a #3"]);
    w.ok(j, "a");
    assert_eq!(
        w.take(),
        ["delivered u1 a", "answering a", "open a", "start u2 b #1"]
    );
    w.ok(b2, "b");
    assert_eq!(w.take(), ["delivered u2 b"]);
    assert_eq!(w.store.delivered.iter().filter(|(u, _)| *u == j).count(), 2);
}

#[test]
fn a_lane_in_backoff_is_probed_once_at_not_before_inside_a_busy_pass() {
    let mut w = World::new(Config {
        pass_attempts: 1,
        ..transcript_config()
    });
    let a1 = w.enqueue(&["a"], false)[0];
    w.enqueue(&["a"], false);
    let mut busy: Vec<UnitId> = (0..80).map(|_| w.enqueue(&["b"], false)[0]).collect();
    busy.reverse();
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1", "start u3 b #1"]);
    w.fail(a1, "a");
    assert_eq!(
        w.take(),
        [
            "attempt u1 a 1",
            "failing a since +0s",
            "backoff a until +30s level 1",
            "hold u1 a Stalled",
            "back u2"
        ]
    );
    // Lane b keeps the pass busy: one delivery per second.
    let mut probes = Vec::new();
    for _ in 0..70 {
        w.advance(secs(1));
        let b = busy.pop().expect("enough b units");
        w.ok(b, "b");
        for line in w.take() {
            if line.contains(" a ") || line.ends_with(" a") {
                probes.push((w.now.saturating_duration_since(common::T0).as_secs(), line));
            }
        }
        if w.now == common::T0 + secs(30) {
            // The probe fails: the backoff doubles, the unit stays held.
            w.fail(a1, "a");
            for line in w.take() {
                probes.push((30, line));
            }
        }
    }
    assert_eq!(
        probes,
        [
            (30, "start u1 a #2".to_string()),
            (30, "attempt u1 a 2".to_string()),
            (30, "backoff a until +90s level 2".to_string()),
            (30, "hold u1 a Stalled".to_string()),
        ]
    );
}

#[test]
fn a_429_with_retry_after_moves_not_before_and_does_not_count() {
    let mut w = World::new(Config {
        max_attempts: 1,
        ..transcript_config()
    });
    let a1 = w.enqueue(&["a"], false)[0];
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1"]);
    w.outcome(
        a1,
        "a",
        Outcome::Throttled {
            retry_after: Some(secs(10)),
        },
    );
    assert_eq!(
        w.take(),
        ["attempt u1 a 0 uncounted", "backoff a until +10s level 0"]
    );
    w.advance(secs(9));
    assert!(w.take().is_empty(), "not before its not_before");
    w.advance(secs(1));
    // max_attempts is 1, yet the unit is attempted again: the 429 did not count.
    assert_eq!(w.take(), ["start u1 a #1"]);
    w.ok(a1, "a");
    // The answer ends the throttle: its not_before is cleared (OL-7).
    assert_eq!(w.take(), ["delivered u1 a", "open a"]);
}

#[test]
fn a_retry_after_of_zero_waits_the_ladder_delay_and_does_not_loop() {
    let mut w = World::new(transcript_config());
    let a1 = w.enqueue(&["a"], false)[0];
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1"]);
    // `Retry-After: 0` (or a date in the past): the ladder's 1 s still applies.
    w.outcome(
        a1,
        "a",
        Outcome::Throttled {
            retry_after: Some(Duration::ZERO),
        },
    );
    assert_eq!(w.take(), ["attempt u1 a 0 uncounted"]);
    w.advance(Duration::from_millis(999));
    assert!(w.take().is_empty(), "not before the ladder's first delay");
    w.advance(Duration::from_millis(1));
    assert_eq!(w.take(), ["start u1 a #1"]);
    // A 503 with a Retry-After shorter than the ladder's 2 s waits the 2 s.
    w.outcome(
        a1,
        "a",
        Outcome::Transient {
            retry_after: Some(secs(1)),
        },
    );
    assert_eq!(w.take(), ["attempt u1 a 1", "failing a since +1s"]);
    w.advance(Duration::from_millis(1_999));
    assert!(w.take().is_empty(), "not before the ladder's second delay");
    w.advance(Duration::from_millis(1));
    assert_eq!(w.take(), ["start u1 a #2"]);
    // A longer one still wins (OL-6).
    w.outcome(
        a1,
        "a",
        Outcome::Throttled {
            retry_after: Some(secs(10)),
        },
    );
    assert_eq!(
        w.take(),
        ["attempt u1 a 1 uncounted", "backoff a until +13s level 0"]
    );
    w.advance(secs(10));
    assert_eq!(w.take(), ["start u1 a #2"]);
    // The stall gets the lane backoff, not the Retry-After of 0.
    w.outcome(
        a1,
        "a",
        Outcome::Throttled {
            retry_after: Some(Duration::ZERO),
        },
    );
    assert_eq!(
        w.take(),
        [
            "attempt u1 a 1 uncounted",
            "backoff a until +43s level 1",
            "hold u1 a Stalled"
        ]
    );
    assert!(w.s.is_done(w.now), "the pass ends at the stall");
}

/// Answers every attempt with `outcome` until the unit is resolved, jumping from deadline to
/// deadline (a pass that other lanes keep busy), at most `bound` attempts. Returns the number
/// of attempts and the whole log.
fn answer_forever(
    w: &mut World,
    unit: UnitId,
    outcome: Outcome,
    bound: usize,
) -> (usize, Vec<String>) {
    let mut log = Vec::new();
    let mut attempts = 0;
    loop {
        let step = w.take();
        let started = step.iter().any(|c| c.starts_with("start "));
        let resolved = step
            .iter()
            .any(|c| c.starts_with("dead ") || c.starts_with("delivered "));
        log.extend(step);
        if resolved {
            return (attempts, log);
        }
        if attempts >= bound {
            panic!(
                "still not resolved after {attempts} attempts: {:?}",
                &log[log.len().saturating_sub(12)..]
            );
        }
        if started {
            attempts += 1;
            w.outcome(unit, "a", outcome);
        } else {
            w.jump_to_next_timeout();
        }
    }
}

#[test]
fn a_recipient_that_answers_429_retry_after_0_for_ever_dead_letters_the_unit() {
    let mut w = World::new(transcript_config());
    let a1 = w.enqueue(&["a"], false)[0];
    let a2 = w.enqueue(&["a"], false)[0];
    w.discover();
    let throttled = Outcome::Throttled {
        retry_after: Some(Duration::ZERO),
    };
    let (attempts, log) = answer_forever(&mut w, a1, throttled, 100);
    // The stall's throttled attempts are free (OL-5); the probes after it count, up to
    // max_attempts.
    let c = transcript_config();
    assert_eq!(attempts as u32, c.pass_attempts + c.max_attempts);
    assert_eq!(
        log[..13],
        [
            "start u1 a #1",
            "attempt u1 a 0 uncounted",
            "start u1 a #1",
            "attempt u1 a 0 uncounted",
            "start u1 a #1",
            "attempt u1 a 0 uncounted",
            "start u1 a #1",
            "attempt u1 a 0 uncounted",
            "backoff a until +37s level 1",
            "hold u1 a Stalled",
            "back u2",
            "start u1 a #1",
            "attempt u1 a 1",
        ]
    );
    assert_eq!(
        log[log.len() - 5..],
        [
            "attempt u1 a 12",
            "backoff a until +25417s level 13",
            "dead u1 a exhausted",
            "restart a",
            "start u2 a #1"
        ]
    );
    // One lane backoff per stall or failed probe, each at least 30 s (no tight loop).
    let backoffs = log.iter().filter(|c| c.starts_with("backoff")).count();
    assert_eq!(backoffs, c.max_attempts as usize + 1);
    // The lane starts over (OL-8): its follower is tried at once, on a schedule of its own,
    // not at the next probe of the unit before it.
    w.ok(a2, "a");
    assert_eq!(w.take(), ["delivered u2 a", "answering a"]);
}

#[test]
fn a_lane_backoff_level_stops_at_its_maximum() {
    let mut w = World::new(Config {
        max_throttled_level: u32::MAX,
        ..transcript_config()
    });
    let a1 = w.enqueue(&["a"], false)[0];
    w.discover();
    let throttled = Outcome::Throttled {
        retry_after: Some(Duration::ZERO),
    };
    let a = w.lane("a");
    let mut last = T0;
    let mut wait = None;
    for _ in 0..200 {
        let step = w.take();
        assert!(
            !step.iter().any(|c| c.starts_with("dead ")),
            "never counted, never dead"
        );
        if step.iter().any(|c| c.starts_with("start ")) {
            w.outcome(a1, "a", throttled);
            let next = w.s.poll_timeout();
            wait = next.map(|t| t.saturating_duration_since(w.now));
            assert!(
                wait >= Some(secs(1)),
                "a Retry-After of 0 made a tight loop"
            );
        } else {
            let t = w.jump_to_next_timeout();
            assert!(t > last, "time moves on between attempts");
            last = t;
        }
    }
    assert_eq!(w.store.lane_info(a).level, MAX_BACKOFF_LEVEL);
    assert_eq!(wait, Some(transcript_config().lane_backoff_cap));
}

#[test]
fn a_deep_lane_does_not_keep_the_lanes_behind_it_from_being_admitted() {
    let mut w = World::new(Config {
        max_units: 64,
        max_per_lane: 8,
        ..transcript_config()
    });
    let deep = w.lane("deep");
    for _ in 0..100_000 {
        w.store.enqueue(&[deep], false, 100, w.now);
    }
    let short = w.enqueue(&["short"], false)[0];
    let short2 = w.enqueue(&["short"], false)[0];
    w.discover();
    assert_eq!(w.take(), ["start u1 deep #1", "start u100001 short #1"]);
    assert!(
        w.s.admitted() <= 8 + 2,
        "the deep lane holds at most its per-lane share"
    );
    w.ok(short, "short");
    assert_eq!(
        w.take(),
        ["delivered u100001 short", "start u100002 short #1"]
    );
    w.ok(short2, "short");
    assert_eq!(w.take(), ["delivered u100002 short"]);
}

#[test]
fn a_permanent_failure_is_dead_lettered_at_once_and_a_strict_lane_blocks_instead() {
    let mut w = World::new(transcript_config());
    let a1 = w.enqueue(&["a"], false)[0];
    let a2 = w.enqueue(&["a"], false)[0];
    w.discover();
    w.outcome(a1, "a", Outcome::Permanent);
    assert_eq!(
        w.take(),
        [
            "start u1 a #1",
            "attempt u1 a 1",
            "dead u1 a permanent",
            "start u2 a #1"
        ]
    );
    w.ok(a2, "a");
    w.take();

    let mut w = World::new(transcript_config());
    let s1 = w.enqueue(&["s"], false)[0];
    w.enqueue(&["s"], false);
    let s = w.lane("s");
    w.store.lane_state.insert(
        s,
        outbox_lanes_core::LaneInfo {
            strict: true,
            ..Default::default()
        },
    );
    w.discover();
    w.outcome(s1, "s", Outcome::Permanent);
    assert_eq!(
        w.take(),
        [
            "start u1 s #1",
            "attempt u1 s 1",
            "hold u1 s Blocked",
            "back u2"
        ]
    );
    assert!(w.s.is_done(w.now));
}

#[test]
fn gone_retires_the_lane_when_configured() {
    let mut w = World::new(Config {
        retire_on_gone: true,
        ..transcript_config()
    });
    let g1 = w.enqueue(&["g"], false)[0];
    w.enqueue(&["g"], false);
    w.enqueue(&["g", "h"], true);
    let h = w.enqueue(&["h"], false)[0];
    w.discover();
    w.outcome(g1, "g", Outcome::Gone);
    // The joined unit u3 lost its g recipient and now only needs h.
    assert_eq!(
        w.take(),
        [
            "start u1 g #1",
            "attempt u1 g 1",
            "dead u1 g gone",
            "retire g",
            "start u3 h #1",
        ]
    );
    w.ok(UnitId(3), "h");
    assert_eq!(w.take(), ["delivered u3 h", "start u4 h #1"]);
    w.ok(h, "h");
    assert!(w.store.units.is_empty());
}

/// Found by the scheduler fuzz target (`fuzz/regressions/scheduler/`): retiring a lane
/// dead-letters the units behind its head, which frees room in the window, which admits a
/// joined unit that waited for room at once — it must already know that it lost this lane's
/// recipient, or it is started on the retired lane.
#[test]
fn a_joined_unit_admitted_while_its_lane_retires_is_not_started_on_it() {
    let mut w = World::new(Config {
        retire_on_gone: true,
        // Room for two units of 100 bytes: u3 is read but waits for room.
        max_bytes: 250,
        ..transcript_config()
    });
    let u1 = w.enqueue(&["g", "h"], true)[0];
    w.enqueue(&["g"], false);
    w.enqueue(&["g", "h"], true);
    w.discover();
    assert_eq!(w.take(), ["start u1 g #1", "start u1 h #1"]);
    w.outcome(u1, "h", Outcome::Gone);
    assert_eq!(w.take(), ["attempt u1 h 1", "dead u1 h gone", "retire h"]);
    // u2 is dead-lettered with the lane, its room admits u3 (waiting for it): u3 lost both
    // its recipients, so nothing starts.
    w.outcome(u1, "g", Outcome::Gone);
    assert_eq!(w.take(), ["attempt u1 g 1", "dead u1 g gone", "retire g"]);
    assert!(w.store.units.is_empty());
}

#[test]
fn bad_input_gets_typed_errors_and_changes_nothing() {
    use outbox_lanes_core::{Admit, AdmitError, EventError, LaneChunk, Seq};
    let mut w = World::new(transcript_config());
    let a1 = w.enqueue(&["a"], false)[0];
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1"]);
    let a = w.lane("a");
    // A chunk nobody asked for is refused whole.
    let report = w.s.handle_claimed(
        vec![LaneChunk {
            lane: a,
            units: vec![Admit::single(UnitId(99), Seq(50), a)],
            exhausted: true,
        }],
        w.now,
    );
    assert_eq!(report.refused, [AdmitError::Unclaimed(a)]);
    assert_eq!(report.admitted, 0);
    // A unit admitted twice: the store answers a claim with a unit already admitted.
    w.enqueue(&["a"], false);
    w.s.handle_lane(a, Default::default(), w.now);
    let claims = w.s.poll_claim(w.now).expect("a has more");
    let report = w.s.handle_claimed(
        vec![LaneChunk {
            lane: claims[0].lane,
            units: vec![Admit::single(a1, Seq(1), a)],
            exhausted: true,
        }],
        w.now,
    );
    assert!(
        matches!(report.refused[..], [AdmitError::Duplicate(u)] if u == a1),
        "{report:?}"
    );
    // Completions for unknown units, unknown lanes and units not in flight.
    assert_eq!(
        w.s.handle_outcome(UnitId(77), a, Outcome::Delivered, w.now),
        Err(EventError::UnknownUnit(UnitId(77)))
    );
    let b = w.lane("b");
    assert_eq!(
        w.s.handle_outcome(a1, b, Outcome::Delivered, w.now),
        Err(EventError::UnknownLane(a1, b))
    );
    // Time going backwards is clamped: nothing fires early, nothing panics.
    w.s.handle_timeout(common::T0.saturating_sub(secs(3600)));
    assert!(w.s.poll_command().is_none());
    w.ok(a1, "a");
    assert_eq!(w.take(), ["delivered u1 a"]);
    assert_eq!(
        w.s.handle_outcome(a1, a, Outcome::Delivered, w.now),
        Err(EventError::UnknownUnit(a1)),
        "a second completion of a finished unit"
    );
}

#[test]
fn attempts_that_never_left_are_retried_and_never_counted() {
    // max_attempts 3: twenty counted failures would have dead-lettered the unit.
    let mut w = World::new(Config {
        max_attempts: 3,
        ..transcript_config()
    });
    let u = w.enqueue(&["a"], false)[0];
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1"]);
    for _ in 0..20 {
        w.outcome(u, "a", Outcome::NotSent);
        assert!(w.take().is_empty(), "nothing recorded, nothing held");
        w.jump_to_next_timeout();
        assert_eq!(
            w.take(),
            ["start u1 a #1"],
            "retried, still the first attempt"
        );
    }
    w.ok(u, "a");
    assert_eq!(w.take(), ["delivered u1 a"]);
    assert!(w.s.is_done(w.now));
}

#[test]
fn an_attempt_that_never_left_does_not_extend_a_lanes_backoff() {
    let mut w = World::new(Config {
        pass_attempts: 1,
        ..transcript_config()
    });
    let a1 = w.enqueue(&["a"], false)[0];
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1"]);
    w.fail(a1, "a");
    assert_eq!(
        w.take(),
        [
            "attempt u1 a 1",
            "failing a since +0s",
            "backoff a until +30s level 1",
            "hold u1 a Stalled"
        ]
    );
    // The probe at not_before never leaves: no new level, no new not_before; it is tried
    // again after the in-pass delay.
    w.jump_to_next_timeout();
    assert_eq!(w.take(), ["start u1 a #2"]);
    w.outcome(a1, "a", Outcome::NotSent);
    assert!(w.take().is_empty(), "no backoff, no record");
    w.jump_to_next_timeout();
    assert_eq!(w.take(), ["start u1 a #2"]);
    w.ok(a1, "a");
    assert_eq!(w.take(), ["delivered u1 a", "answering a", "open a"]);
}

#[test]
fn the_window_holds_every_lanes_head_before_any_lanes_depth() {
    // Four lanes with three units each, a window of four units, up to 16 per lane: each lane
    // gets its head (four attempts in flight), not lane a all four (one in flight).
    let mut w = World::new(Config {
        max_units: 4,
        max_per_lane: 16,
        ..transcript_config()
    });
    let mut units = std::collections::BTreeMap::new();
    for _ in 0..3 {
        for lane in ["a", "b", "c", "d"] {
            units
                .entry(lane)
                .or_insert_with(Vec::new)
                .push(w.enqueue(&[lane], false)[0]);
        }
    }
    w.discover();
    assert_eq!(
        w.take(),
        [
            "start u1 a #1",
            "start u2 b #1",
            "start u3 c #1",
            "start u4 d #1"
        ]
    );
    // The room a's delivery frees goes to a's next unit: every lane already has its head.
    w.ok(units["a"][0], "a");
    assert_eq!(w.take(), ["delivered u1 a", "start u5 a #1"]);
}

#[test]
fn a_lane_with_nothing_admitted_gets_the_room_before_a_lane_that_refills() {
    // A window of eight units shared by four lanes: two each.
    let mut w = World::new(Config {
        max_units: 8,
        max_per_lane: 16,
        ..transcript_config()
    });
    let mut units = std::collections::BTreeMap::new();
    for _ in 0..4 {
        for lane in ["a", "b", "c", "d"] {
            units
                .entry(lane)
                .or_insert_with(Vec::new)
                .push(w.enqueue(&[lane], false)[0]);
        }
    }
    w.discover();
    assert_eq!(
        w.take(),
        [
            "start u1 a #1",
            "start u2 b #1",
            "start u3 c #1",
            "start u4 d #1"
        ]
    );
    // A new lane is discovered while the window is full.
    let e = w.enqueue(&["e"], false)[0];
    w.discover();
    assert!(w.take().is_empty(), "the window is full");
    // a's delivery frees one unit of room: a still has u5 admitted and starts it; the room
    // goes to e, which has nothing, not to a's refill.
    w.ok(units["a"][0], "a");
    assert_eq!(
        w.take(),
        ["delivered u1 a", "start u5 a #1", "start u17 e #1"]
    );
    // Once e is served, a refills.
    w.ok(e, "e");
    assert_eq!(w.take(), ["delivered u17 e"]);
    w.ok(units["a"][1], "a");
    assert_eq!(w.take(), ["delivered u5 a", "start u9 a #1"]);
}

#[test]
fn complete_joined_units_waiting_for_room_go_in_as_units_leave_in_completion_order() {
    // Room for two units of 100 bytes: x1 and x2 fill it, and the joined units j1 (a, b),
    // j2 (c, d), j3 (e, f) and j4 (g, h) are reached by all their lanes but wait for room,
    // complete in that order.
    let mut w = World::new(Config {
        max_bytes: 200,
        ..transcript_config()
    });
    let x1 = w.enqueue(&["x"], false)[0];
    let x2 = w.enqueue(&["x"], false)[0];
    let j: Vec<UnitId> = [["a", "b"], ["c", "d"], ["e", "f"], ["g", "h"]]
        .iter()
        .map(|lanes| w.enqueue(lanes, true)[0])
        .collect();
    w.discover();
    assert_eq!(w.take(), ["start u1 x #1"]);
    assert_eq!(w.s.admitted(), 2);
    // x1 leaves: j1, complete first, takes its room; the others still do not fit.
    w.ok(x1, "x");
    assert_eq!(
        w.take(),
        [
            "delivered u1 x",
            "start u2 x #1",
            "start u3 a #1",
            "start u3 b #1"
        ]
    );
    assert_eq!(w.s.admitted(), 2);
    w.ok(x2, "x");
    assert_eq!(
        w.take(),
        ["delivered u2 x", "start u4 c #1", "start u4 d #1"]
    );
    w.ok(j[0], "a");
    w.ok(j[0], "b");
    assert_eq!(
        w.take(),
        [
            "delivered u3 a",
            "delivered u3 b",
            "start u5 e #1",
            "start u5 f #1"
        ]
    );
    w.ok(j[1], "c");
    w.ok(j[1], "d");
    assert_eq!(
        w.take(),
        [
            "delivered u4 c",
            "delivered u4 d",
            "start u6 g #1",
            "start u6 h #1"
        ]
    );
    for (u, l) in [(j[2], "e"), (j[2], "f"), (j[3], "g"), (j[3], "h")] {
        w.ok(u, l);
    }
    assert_eq!(w.take().len(), 4);
    assert!(w.s.is_done(w.now));
}

#[test]
fn is_done_is_a_query_a_due_retry_fires_only_on_handle_timeout() {
    let mut w = World::new(transcript_config());
    let a1 = w.enqueue(&["a"], false)[0];
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1"]);
    w.fail(a1, "a");
    assert_eq!(w.take(), ["attempt u1 a 1", "failing a since +0s"]);
    let due = w.s.poll_timeout().expect("the in-pass retry");
    // Past the retry's deadline the pass is not over, and asking changes nothing.
    assert!(!w.s.is_done(due + secs(5)));
    assert!(!w.s.is_done(due + secs(5)));
    assert_eq!(w.s.poll_command(), None);
    assert_eq!(w.s.poll_timeout(), Some(due));
    w.now = due;
    w.s.handle_timeout(w.now);
    w.settle();
    assert_eq!(w.take(), ["start u1 a #2"]);
    w.ok(a1, "a");
    assert_eq!(w.take(), ["delivered u1 a", "answering a"]);
    assert!(w.s.is_done(w.now));
}

// Operator actions reaching a running pass (OL-14): `World::control` is the runtime telling
// the scheduler a lane's state after an operator changed it in the store.

#[test]
fn a_lane_paused_mid_pass_hands_its_window_back_and_starts_nothing_until_resumed() {
    let mut w = World::new(transcript_config());
    let p: Vec<UnitId> = (0..3).map(|_| w.enqueue(&["p"], false)[0]).collect();
    let q1 = w.enqueue(&["q"], false)[0];
    w.discover();
    assert_eq!(w.take(), ["start u1 p #1", "start u4 q #1"]);
    // Paused while u1 is out: what waited goes back at once.
    let pl = w.lane("p");
    w.store.paused.insert(pl);
    w.control("p");
    assert_eq!(w.take(), ["back u2", "back u3"]);
    // The attempt in flight finishes and is recorded; nothing of p starts after it.
    w.ok(p[0], "p");
    assert_eq!(w.take(), ["delivered u1 p"]);
    w.ok(q1, "q");
    assert_eq!(w.take(), ["delivered u4 q"]);
    assert!(w.s.is_done(w.now));
    // Resumed: p is read again, where it stopped.
    w.store.paused.remove(&pl);
    w.control("p");
    assert_eq!(w.take(), ["start u2 p #1"]);
    w.ok(p[1], "p");
    assert_eq!(w.take(), ["delivered u2 p", "start u3 p #1"]);
}

#[test]
fn an_attempt_in_flight_when_its_lane_is_paused_is_recorded_and_its_unit_handed_back() {
    let mut w = World::new(transcript_config());
    let p1 = w.enqueue(&["p"], false)[0];
    w.enqueue(&["p"], false);
    w.discover();
    assert_eq!(w.take(), ["start u1 p #1"]);
    let pl = w.lane("p");
    w.store.paused.insert(pl);
    w.control("p");
    assert_eq!(w.take(), ["back u2"]);
    // It failed: recorded, not retried.
    w.fail(p1, "p");
    assert_eq!(
        w.take(),
        ["attempt u1 p 1", "failing p since +0s", "back u1"]
    );
    assert_eq!(w.s.poll_timeout(), None);
    assert!(w.s.is_done(w.now));
    assert_eq!(w.store.attempts(p1, pl), Some(1));
}

#[test]
fn a_start_the_runtime_did_not_send_is_reported_not_sent_before_the_control() {
    let mut w = World::new(transcript_config());
    let p1 = w.enqueue(&["p"], false)[0];
    w.enqueue(&["p"], false);
    w.discover();
    assert_eq!(w.take(), ["start u1 p #1"]);
    // The runtime learns of the pause before sending u1.
    let pl = w.lane("p");
    w.store.paused.insert(pl);
    w.outcome(p1, "p", Outcome::NotSent);
    w.control("p");
    assert_eq!(w.take(), ["back u1", "back u2"]);
    assert_eq!(w.s.poll_timeout(), None);
    assert!(w.s.is_done(w.now));
}

#[test]
fn a_purged_lane_never_starts_the_units_it_had_admitted() {
    let mut w = World::new(transcript_config());
    let a1 = w.enqueue(&["a"], false)[0];
    w.enqueue(&["a"], false);
    w.enqueue(&["a"], false);
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1"]);
    w.fail(a1, "a");
    assert_eq!(w.take(), ["attempt u1 a 1", "failing a since +0s"]);
    // Purged while u1 waits for its retry.
    let al = w.lane("a");
    assert_eq!(w.store.operator_dead_letters(al, None).len(), 3);
    w.control("a");
    assert_eq!(w.take(), ["back u1", "back u2", "back u3"]);
    w.advance(secs(10));
    assert!(w.take().is_empty());
    assert!(w.s.is_done(w.now));
    // A unit enqueued after the purge goes.
    w.enqueue(&["a"], false);
    w.discover();
    assert_eq!(w.take(), ["start u4 a #1"]);
}

#[test]
fn a_skipped_stalled_head_is_never_sent_again_and_its_followers_go() {
    let mut w = World::new(Config {
        pass_attempts: 2,
        ..transcript_config()
    });
    let a1 = w.enqueue(&["a"], false)[0];
    let a2 = w.enqueue(&["a"], false)[0];
    w.discover();
    w.fail(a1, "a");
    w.jump_to_next_timeout();
    w.fail(a1, "a");
    assert_eq!(
        w.take(),
        [
            "start u1 a #1",
            "attempt u1 a 1",
            "failing a since +0s",
            "start u1 a #2",
            "attempt u1 a 2",
            "backoff a until +31s level 1",
            "hold u1 a Stalled",
            "back u2"
        ]
    );
    // skip-head: the head is a dead letter, the backoff cleared; the pass reads a again.
    let al = w.lane("a");
    assert_eq!(w.store.operator_dead_letters(al, Some(1)), [a1]);
    w.control("a");
    assert_eq!(w.take(), ["back u1", "start u2 a #1"]);
    w.ok(a2, "a");
    assert_eq!(w.take(), ["delivered u2 a", "answering a"]);
    w.advance(secs(60));
    assert!(w.take().is_empty());
}

#[test]
fn a_head_skipped_while_in_flight_is_recorded_and_not_retried() {
    let mut w = World::new(transcript_config());
    let a1 = w.enqueue(&["a"], false)[0];
    w.enqueue(&["a"], false);
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1"]);
    let al = w.lane("a");
    w.store.operator_dead_letters(al, Some(1));
    w.control("a");
    assert_eq!(w.take(), ["back u2"]);
    w.fail(a1, "a");
    assert_eq!(
        w.take(),
        [
            "attempt u1 a 1",
            "failing a since +0s",
            "back u1",
            "start u2 a #1"
        ]
    );
}

#[test]
fn a_lane_made_strict_mid_pass_blocks_on_its_head_instead_of_dead_lettering_it() {
    let mut w = World::new(transcript_config());
    let s1 = w.enqueue(&["s"], false)[0];
    w.enqueue(&["s"], false);
    w.discover();
    assert_eq!(w.take(), ["start u1 s #1"]);
    let s = w.lane("s");
    w.store.lane_state.entry(s).or_default().strict = true;
    w.control("s");
    assert_eq!(w.take(), ["back u2"]);
    w.outcome(s1, "s", Outcome::Permanent);
    assert_eq!(w.take(), ["attempt u1 s 1", "hold u1 s Blocked", "back u1"]);
    assert!(w.s.is_done(w.now));
}

#[test]
fn pausing_a_lane_hands_back_a_joined_unit_and_whatever_waits_behind_it() {
    let mut w = World::new(transcript_config());
    let a1 = w.enqueue(&["a"], false)[0];
    w.enqueue(&["a", "b"], true);
    w.enqueue(&["b"], false);
    w.enqueue(&["a"], false);
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1"]);
    let b = w.lane("b");
    w.store.paused.insert(b);
    w.control("b");
    assert_eq!(w.take(), ["back u2", "back u3", "back u4"]);
    // a reads up to the joined unit again and waits there: b, which it occupies, is paused.
    w.ok(a1, "a");
    assert_eq!(w.take(), ["delivered u1 a"]);
    assert!(w.s.is_done(w.now));
    w.store.paused.remove(&b);
    w.control("b");
    assert_eq!(w.take(), ["start u2 a #1", "start u2 b #1"]);
}

#[test]
fn a_deferred_head_holds_its_lane_without_an_attempt_or_a_level_and_comes_back() {
    let mut w = World::new(transcript_config());
    let a1 = w.enqueue(&["a"], false)[0];
    let _a2 = w.enqueue(&["a"], false)[0];
    let b1 = w.enqueue(&["b"], false)[0];
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1", "start u3 b #1"]);
    // Its host is backing off: nothing was sent, nothing is counted, the level stays 0.
    w.outcome(
        a1,
        "a",
        Outcome::Deferred {
            retry_after: secs(20),
        },
    );
    assert_eq!(
        w.take(),
        [
            "backoff a until +20s level 0",
            "hold u1 a Stalled",
            "back u2"
        ]
    );
    w.ok(b1, "b");
    assert_eq!(w.take(), ["delivered u3 b"]);
    assert!(w.s.is_done(w.now), "a deferred lane keeps no pass alive");
    // Within the pass, the lane's time brings its head back: the same attempt number.
    assert_eq!(w.jump_to_next_timeout(), T0 + secs(20));
    assert_eq!(w.take(), ["start u1 a #1"]);
    w.ok(a1, "a");
    // The lane is open again (its not_before cleared) and reads its handed-back unit.
    assert_eq!(w.take(), ["delivered u1 a", "open a", "start u2 a #1"]);
}

#[test]
fn a_zero_deferral_still_waits_and_a_set_aside_unit_is_dead_lettered_uncounted() {
    let mut w = World::new(transcript_config());
    let a1 = w.enqueue(&["a"], false)[0];
    let a2 = w.enqueue(&["a"], false)[0];
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1"]);
    w.outcome(
        a1,
        "a",
        Outcome::Deferred {
            retry_after: Duration::ZERO,
        },
    );
    assert_eq!(
        w.take(),
        [
            "backoff a until +0.1s level 0",
            "hold u1 a Stalled",
            "back u2"
        ]
    );
    assert_eq!(
        w.jump_to_next_timeout(),
        T0 + outbox_lanes_core::MIN_DEFERRAL,
        "never a retry at once"
    );
    assert_eq!(w.take(), ["start u1 a #1"]);
    // The host is set aside: a dead letter, no attempt recorded; the lane moves on.
    w.outcome(
        a1,
        "a",
        Outcome::SetAside {
            reason: outbox_lanes_core::DeadReason::Blocked,
        },
    );
    // The handed-back u2 is read again and starts at once: the lane was never in backoff.
    assert_eq!(w.take(), ["dead u1 a blocked", "start u2 a #1"]);
    w.ok(a2, "a");
    // The answer clears the deferral's not_before, which no answer had ended (OL-7).
    assert_eq!(w.take(), ["delivered u2 a", "open a"]);
    let a = w.lane("a");
    assert_eq!(
        w.store.dead,
        [(a1, a, outbox_lanes_core::DeadReason::Blocked)]
    );
    assert_eq!(
        w.store.attempts(a1, a),
        None,
        "no attempt was ever recorded"
    );
}

#[test]
fn a_lane_known_only_through_a_joined_unit_waits_for_its_discovery_and_keeps_its_backoff() {
    let mut w = World::new(transcript_config());
    let (a, b) = (w.lane("a"), w.lane("b"));
    // b is in backoff in the store (an earlier pass's stall), for 30 s more.
    w.store.lane_state.insert(
        b,
        LaneInfo {
            not_before: Some(T0 + secs(30)),
            level: 1,
            ..LaneInfo::default()
        },
    );
    w.enqueue(&["a", "b"], true);
    // Only a is discovered (b's discovery is still to come): a reads up to the joined unit and
    // waits there; b is not read with default state, so nothing starts.
    let info = w.store.lane_info(a);
    w.s.handle_lane(a, info, w.now);
    w.settle();
    assert_eq!(w.take(), Vec::<String>::new());
    // b's discovery brings its backoff: still nothing before its not_before…
    let info = w.store.lane_info(b);
    w.s.handle_lane(b, info, w.now);
    w.settle();
    assert_eq!(w.take(), Vec::<String>::new());
    // …and at it, the joined unit starts on both lanes.
    assert_eq!(w.jump_to_next_timeout(), T0 + secs(30));
    assert_eq!(w.take(), ["start u1 a #1", "start u1 b #1"]);
}

/// The drain: three units to a recipient that answers the first attempt `503` with
/// `Retry-After: 1` (throttled) and then `200`. The Retry-After is no longer than the
/// ladder's first delay (1 s before jitter), so it is waited in the pass whatever the jitter
/// draws: the same transcript for every seed, the three units delivered (OL-6).
#[test]
fn a_retry_after_within_the_ladder_step_is_waited_in_the_pass_for_every_seed() {
    for seed in 0..256 {
        let mut w = World::with_seed(Config::default(), seed);
        let u: Vec<UnitId> = (0..3).map(|_| w.enqueue(&["a"], false)[0]).collect();
        w.discover();
        assert_eq!(w.take(), ["start u1 a #1"], "seed {seed}");
        w.outcome(
            u[0],
            "a",
            Outcome::Throttled {
                retry_after: Some(secs(1)),
            },
        );
        assert_eq!(w.take(), ["attempt u1 a 0 uncounted"], "seed {seed}");
        assert!(
            !w.s.is_done(w.now),
            "seed {seed}: the pass waits for the retry"
        );
        let throttled_at = w.now;
        let t = w.jump_to_next_timeout();
        let waited = t.saturating_duration_since(throttled_at);
        // The longer of the Retry-After and the jittered ladder delay (1 s ± 20 %).
        assert!(
            waited >= secs(1) && waited <= Duration::from_millis(1200),
            "seed {seed}: waited {waited:?}"
        );
        assert_eq!(w.take(), ["start u1 a #1"], "seed {seed}");
        w.ok(u[0], "a");
        assert_eq!(w.take(), ["delivered u1 a", "start u2 a #1"], "seed {seed}");
        w.ok(u[1], "a");
        assert_eq!(w.take(), ["delivered u2 a", "start u3 a #1"], "seed {seed}");
        w.ok(u[2], "a");
        assert_eq!(w.take(), ["delivered u3 a"], "seed {seed}");
        assert!(w.s.is_done(w.now), "seed {seed}");
    }
}

/// Both sides of the boundary at each step of the ladder (1 s, 2 s, 4 s before jitter): a
/// Retry-After equal to the step is waited in the pass, one a millisecond longer throttles
/// the lane at once — for every seed, whatever the jitter draws (OL-6).
#[test]
fn a_retry_after_longer_than_the_ladder_step_throttles_the_lane_for_every_seed() {
    let ladder = Config::default().retry_delays;
    for seed in 0..128 {
        for (step, &base) in ladder.iter().enumerate() {
            for beyond in [false, true] {
                let mut w = World::with_seed(Config::default(), seed);
                let u1 = w.enqueue(&["a"], false)[0];
                w.discover();
                assert_eq!(w.take(), ["start u1 a #1"]);
                // Earlier failures of the ladder: throttles without a Retry-After.
                for _ in 0..step {
                    w.outcome(u1, "a", Outcome::Throttled { retry_after: None });
                    assert_eq!(w.take(), ["attempt u1 a 0 uncounted"]);
                    w.jump_to_next_timeout();
                    assert_eq!(w.take(), ["start u1 a #1"]);
                }
                let ra = if beyond {
                    base + Duration::from_millis(1)
                } else {
                    base
                };
                w.outcome(
                    u1,
                    "a",
                    Outcome::Throttled {
                        retry_after: Some(ra),
                    },
                );
                let case = format!("seed {seed}, failure {}, Retry-After {ra:?}", step + 1);
                if beyond {
                    let until = (w.now + ra).saturating_duration_since(T0).as_secs_f64();
                    assert_eq!(
                        w.take(),
                        [
                            "attempt u1 a 0 uncounted".to_string(),
                            format!("backoff a until +{until}s level 0"),
                        ],
                        "{case}"
                    );
                    assert!(w.s.is_done(w.now), "{case}: the pass may end");
                } else {
                    assert_eq!(w.take(), ["attempt u1 a 0 uncounted"], "{case}");
                    assert!(!w.s.is_done(w.now), "{case}: the pass waits");
                    let next = w.s.poll_timeout().expect("the retry");
                    let wait = next.saturating_duration_since(w.now);
                    assert!(wait >= ra && wait <= base * 6 / 5, "{case}: {wait:?}");
                }
            }
        }
    }
}

/// Answers every attempt of lane a's head with `outcome`, pass after pass — each a new
/// scheduler started at the lane's persisted `not_before`, as the next drain or the
/// monitor's next pass would — until the head is resolved, at most `bound` attempts. With
/// `slice`, a pass is stopped (its time slice is over) after that many attempts. Returns
/// the attempts and the log of each pass.
fn answer_across_passes(
    w: &mut World,
    unit: UnitId,
    outcome: Outcome,
    (seed, slice): (u64, Option<usize>),
    bound: usize,
) -> (usize, Vec<Vec<String>>) {
    let a = w.lane("a");
    let mut passes = Vec::new();
    let mut attempts = 0;
    for pass in 0..bound as u64 {
        let mut log = Vec::new();
        let mut in_pass = 0;
        loop {
            let step = w.take();
            let started = step.iter().any(|c| c.starts_with("start "));
            let resolved = step
                .iter()
                .any(|c| c.starts_with("dead ") || c.starts_with("delivered "));
            log.extend(step);
            if resolved {
                passes.push(log);
                return (attempts, passes);
            }
            if started {
                attempts += 1;
                in_pass += 1;
                assert!(
                    attempts <= bound,
                    "still not resolved after {attempts} attempts: {:?}",
                    &passes[passes.len().saturating_sub(3)..]
                );
                w.outcome(unit, "a", outcome);
                if slice == Some(in_pass) {
                    w.s.handle_stop(w.now);
                    w.settle();
                }
            } else if w.s.is_done(w.now) {
                break;
            } else {
                w.jump_to_next_timeout();
            }
        }
        passes.push(log);
        w.end_pass();
        if let Some(t) = w.store.lane_info(a).not_before {
            w.now = w.now.max(t);
        }
        w.new_pass(seed.wrapping_add(pass + 1));
    }
    panic!("still not resolved after {bound} passes");
}

/// A recipient that answers `429` with a long Retry-After for ever: each throttle ends the
/// pass, and the next pass starts from the store alone. The throttle is the persisted mark
/// (the lane's `not_before` at level 0): the second throttle in a row stalls the lane, and
/// from level 1 on every throttle counts, so the unit is dead-lettered `exhausted` after
/// 2 + `max_attempts` requests whatever the Retry-After (OL-5, OL-7).
#[test]
fn a_recipient_that_throttles_for_ever_with_a_long_retry_after_dead_letters_the_unit_across_passes()
{
    let c = transcript_config();
    for ra in [secs(30), secs(3600)] {
        let mut w = World::new(transcript_config());
        let a1 = w.enqueue(&["a"], false)[0];
        w.enqueue(&["a"], false);
        w.discover();
        let throttled = Outcome::Throttled {
            retry_after: Some(ra),
        };
        let (attempts, passes) = answer_across_passes(&mut w, a1, throttled, (1, None), 100);
        assert_eq!(attempts as u32, 2 + c.max_attempts, "Retry-After {ra:?}");
        let r = ra.as_secs();
        assert_eq!(
            passes[0],
            [
                "start u1 a #1".to_string(),
                "attempt u1 a 0 uncounted".to_string(),
                format!("backoff a until +{r}s level 0"),
            ]
        );
        // The lane is still throttled (no answer since): this throttle stalls it. The
        // lane backoff (30 s at level 1) or the Retry-After, whichever is longer.
        let level1 = r + r.max(30);
        assert_eq!(
            passes[1],
            [
                "back u1".to_string(),
                "back u2".to_string(),
                "start u1 a #1".to_string(),
                "attempt u1 a 0 uncounted".to_string(),
                format!("backoff a until +{level1}s level 1"),
                "hold u1 a Stalled".to_string(),
                "back u2".to_string(),
            ]
        );
        // In probe mode the throttles count (max_throttled_level 1).
        let level2 = level1 + r.max(60);
        assert_eq!(
            passes[2],
            [
                "back u1".to_string(),
                "start u1 a #1".to_string(),
                "attempt u1 a 1".to_string(),
                format!("failing a since +{level1}s"),
                format!("backoff a until +{level2}s level 2"),
                "hold u1 a Stalled".to_string(),
            ]
        );
        let last = passes.last().expect("passes");
        assert_eq!(last.len(), 7, "{last:?}");
        assert_eq!(last[..3], ["back u1", "start u1 a #12", "attempt u1 a 12"]);
        // The unit goes; the lane starts over and its follower goes at once (OL-8).
        assert_eq!(
            last[4..],
            ["dead u1 a exhausted", "restart a", "start u2 a #1"],
            "Retry-After {ra:?}: {last:?}"
        );
        let counted: Vec<&String> = passes
            .iter()
            .flatten()
            .filter(|c| c.starts_with("attempt ") && !c.ends_with("uncounted"))
            .collect();
        assert_eq!(counted.len() as u32, c.max_attempts);
    }
    // With jitter, the same count for every seed.
    for seed in 0..32 {
        let mut w = World::with_seed(Config::default(), seed);
        let a1 = w.enqueue(&["a"], false)[0];
        w.discover();
        let throttled = Outcome::Throttled {
            retry_after: Some(secs(30)),
        };
        let (attempts, passes) = answer_across_passes(&mut w, a1, throttled, (seed, None), 100);
        assert_eq!(attempts as u32, 2 + c.max_attempts, "seed {seed}");
        let last = passes.last().expect("passes");
        assert_eq!(
            last[last.len() - 2..],
            ["dead u1 a exhausted", "restart a"],
            "seed {seed}"
        );
    }
}

/// An answer ends a throttle: the next unit's long Retry-After throttles the lane again
/// (level 0), it does not stall it. A throttle persisted by an earlier pass is one the next
/// pass knows: the lane stalls at its next throttle, even one with a Retry-After the pass
/// would wait for (OL-6, OL-7).
#[test]
fn an_answer_ends_a_throttle_and_a_persisted_one_carries_into_the_next_pass() {
    let mut w = World::new(transcript_config());
    let a1 = w.enqueue(&["a"], false)[0];
    let a2 = w.enqueue(&["a"], false)[0];
    w.discover();
    assert_eq!(w.take(), ["start u1 a #1"]);
    let long = Outcome::Throttled {
        retry_after: Some(secs(10)),
    };
    w.outcome(a1, "a", long);
    assert_eq!(
        w.take(),
        ["attempt u1 a 0 uncounted", "backoff a until +10s level 0"]
    );
    // Within the pass (other lanes would keep it busy), the throttle ends…
    w.jump_to_next_timeout();
    assert_eq!(w.take(), ["start u1 a #1"]);
    // …and the answer clears it.
    w.ok(a1, "a");
    assert_eq!(w.take(), ["delivered u1 a", "open a", "start u2 a #1"]);
    w.outcome(a2, "a", long);
    assert_eq!(
        w.take(),
        ["attempt u2 a 0 uncounted", "backoff a until +20s level 0"],
        "a first throttle again"
    );
    assert!(w.s.is_done(w.now));
    // The next pass, from the store: the lane is still throttled, so its next throttle
    // stalls it (the lane backoff, 30 s, being longer than the Retry-After).
    w.end_pass();
    w.now = T0 + secs(20);
    w.new_pass(2);
    assert_eq!(w.take(), ["back u2", "start u2 a #1"]);
    w.outcome(
        a2,
        "a",
        Outcome::Throttled {
            retry_after: Some(secs(1)),
        },
    );
    assert_eq!(
        w.take(),
        [
            "attempt u2 a 0 uncounted",
            "backoff a until +50s level 1",
            "hold u2 a Stalled"
        ]
    );
    // Its probe is answered: the lane is open, the next throttle a first one.
    w.end_pass();
    w.now = T0 + secs(50);
    w.new_pass(3);
    assert_eq!(w.take(), ["back u2", "start u2 a #1"]);
    w.ok(a2, "a");
    assert_eq!(w.take(), ["delivered u2 a", "open a"]);
    let a = w.lane("a");
    assert_eq!(w.store.lane_info(a), LaneInfo::default());
}

/// Throttles waited in the pass are counted only in the pass's memory. A pass stopped (its
/// time slice over) while the head waits for such a retry leaves the lane's throttle mark,
/// so the next pass's first throttle stalls the lane: however the passes are sliced, the
/// unit is dead-lettered after `pass_attempts` + `max_attempts` requests, as in one pass
/// (OL-7).
#[test]
fn throttles_waited_in_the_pass_count_however_the_passes_are_sliced() {
    let c = transcript_config();
    let mut w = World::new(transcript_config());
    let a1 = w.enqueue(&["a"], false)[0];
    w.discover();
    let throttled = Outcome::Throttled { retry_after: None };
    let (attempts, passes) = answer_across_passes(&mut w, a1, throttled, (1, Some(3)), 100);
    assert_eq!(attempts as u32, c.pass_attempts + c.max_attempts);
    assert_eq!(
        passes[0],
        [
            "start u1 a #1",
            "attempt u1 a 0 uncounted",
            "start u1 a #1",
            "attempt u1 a 0 uncounted",
            "start u1 a #1",
            "attempt u1 a 0 uncounted",
        ]
    );
    // 1 + 2 s waited; the third retry was due 4 s later when the slice ended: the mark.
    assert_eq!(
        passes[1],
        [
            "backoff a until +7s level 0",
            "back u1",
            "start u1 a #1",
            "attempt u1 a 0 uncounted",
            "backoff a until +37s level 1",
            "hold u1 a Stalled",
        ]
    );
    assert_eq!(
        passes[2],
        [
            "back u1",
            "start u1 a #1",
            "attempt u1 a 1",
            "failing a since +37s",
            "backoff a until +97s level 2",
            "hold u1 a Stalled",
        ]
    );
    let last = passes.last().expect("passes");
    assert_eq!(last[last.len() - 2..], ["dead u1 a exhausted", "restart a"]);
}

/// In one pass that other lanes keep busy, a long Retry-After throttles the lane and the
/// pass takes the head up again when it ends: these throttles count in the pass like any
/// failure, and the `pass_attempts`-th stalls the lane (OL-7).
#[test]
fn long_retry_afters_in_one_busy_pass_stall_the_lane_at_pass_attempts() {
    let c = transcript_config();
    for ra in [secs(30), secs(3600)] {
        let mut w = World::new(transcript_config());
        let a1 = w.enqueue(&["a"], false)[0];
        w.discover();
        let throttled = Outcome::Throttled {
            retry_after: Some(ra),
        };
        let (attempts, log) = answer_forever(&mut w, a1, throttled, 100);
        assert_eq!(attempts as u32, c.pass_attempts + c.max_attempts);
        let r = ra.as_secs();
        assert_eq!(
            log[..8],
            [
                "start u1 a #1".to_string(),
                "attempt u1 a 0 uncounted".to_string(),
                format!("backoff a until +{r}s level 0"),
                "start u1 a #1".to_string(),
                "attempt u1 a 0 uncounted".to_string(),
                format!("backoff a until +{}s level 0", 2 * r),
                "start u1 a #1".to_string(),
                "attempt u1 a 0 uncounted".to_string(),
            ]
        );
        assert_eq!(log[log.len() - 2..], ["dead u1 a exhausted", "restart a"]);
    }
}
