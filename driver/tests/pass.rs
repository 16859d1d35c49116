//! The pass driver against a real SQLite store, with completions fed by hand (no HTTP: the
//! recipient URL is never contacted). Each test pins one behaviour of a round or of the end
//! of a pass; the end-to-end tests of the runtimes cover the same paths over real HTTP.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_lanes_core::policy::AddressPolicy;
use outbox_lanes_core::{Outcome, PassEnd};
use outbox_lanes_driver::clock::{Clock, SystemClock};
use outbox_lanes_driver::http::AttemptResult;
use outbox_lanes_driver::pass::{PassCore, PassResult, RoundContext};
use outbox_lanes_driver::{
    AckWriter, AckWriterOptions, Completions, Done, Hooks, Job, OutboxConfig,
};
use outbox_lanes_store::{
    NewRow, ServiceStore, SlotAcquisition, SlotToken, SqliteOptions, SqliteStore, Store,
};

/// Never contacted: these tests feed completions by hand.
const TO: &str = "http://127.0.0.1:9/inbox";

#[derive(Default)]
struct Sink(Mutex<Vec<Done>>);

impl Completions for Sink {
    fn complete(&self, done: Done) {
        self.0.lock().expect("sink").push(done);
    }
}

impl Sink {
    fn take(&self) -> Vec<Done> {
        std::mem::take(&mut *self.0.lock().expect("sink"))
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    acks: AckWriter,
}

impl Fixture {
    /// What a round of a pass over this fixture's store and ack writer is given.
    fn cx<'a>(&'a self, hooks: &'a Hooks) -> RoundContext<'a> {
        RoundContext {
            store: &*self.store,
            acks: &self.acks,
            hooks,
            hosts: None,
        }
    }

    /// Another store on the same database file: what another process would see committed.
    fn second(&self) -> SqliteStore {
        SqliteStore::open(self.dir.path().join("outbox.db"), SqliteOptions::default())
            .expect("open sqlite again")
    }
}

/// The clock a pass of these tests reads: the system's.
fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

fn now() -> outbox_lanes_core::Timestamp {
    SystemClock.now()
}

fn new_row(id: &str, to: &str) -> NewRow {
    NewRow {
        id: id.into(),
        body: id.trim_start_matches(|c: char| !c.is_ascii_digit()).into(),
        content_type: "text/plain".into(),
        recipients: vec![to.into()],
        ..NewRow::default()
    }
}

fn fixture(rows: usize) -> Fixture {
    fixture_with((0..rows).map(|i| new_row(&format!("r{i}"), TO)).collect())
}

fn fixture_with(rows: Vec<NewRow>) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(dir.path().join("outbox.db"), SqliteOptions::default())
            .expect("open sqlite"),
    );
    // As an outbox opened with `allow_loopback` leaves it (OL-24): loopback rows are admitted.
    store
        .widen_destination_policy(AddressPolicy::allow_loopback_only())
        .expect("widen");
    store
        .enqueue(&outbox_lanes_core::ActorId::new("alice"), &rows)
        .expect("enqueue");
    let (threads, clock) = (outbox_lanes_store::StdThreads, Arc::new(SystemClock));
    let acks = AckWriter::spawn(
        Arc::clone(&store),
        AckWriterOptions::default(),
        &threads,
        clock,
    )
    .expect("acks");
    Fixture { dir, store, acks }
}

fn token(store: &dyn Store) -> SlotToken {
    match store
        .acquire_slot(
            &outbox_lanes_core::ActorId::new("alice"),
            "test",
            Duration::from_secs(30),
        )
        .expect("acquire")
    {
        SlotAcquisition::Acquired(t) => t,
        SlotAcquisition::Held => panic!("slot held"),
    }
}

fn config() -> OutboxConfig {
    let mut c = OutboxConfig::default().allow_loopback();
    c.scheduler.retry_delays = vec![Duration::from_millis(1)];
    c.scheduler.jitter_percent = 0;
    c.scheduler.max_attempts = 3;
    c.scheduler.pass_attempts = 100;
    c.seed = Some(7);
    c
}

fn result(outcome: Outcome) -> AttemptResult {
    AttemptResult {
        outcome,
        status: outcome.is_delivered().then_some(200),
        error: None,
        body: None,
    }
}

fn pending(store: &dyn Store) -> u64 {
    store
        .status()
        .expect("status")
        .first()
        .map_or(0, |s| s.pending)
}

/// Rounds until the pass starts something; returns those jobs.
fn started(pass: &mut PassCore, cx: RoundContext<'_>) -> Vec<Job> {
    for _ in 0..1000 {
        let jobs = pass.round(cx);
        if !jobs.is_empty() || pass.ended().is_some() {
            return jobs;
        }
        std::thread::sleep(Duration::from_millis(1));
        pass.handle_timeout(now());
    }
    panic!("nothing started within 1,000 rounds");
}

#[test]
fn a_cancelled_pass_still_acks_what_was_delivered_and_calls_the_hook() {
    let f = fixture(3);
    let delivered = Arc::new(AtomicUsize::new(0));
    let d = Arc::clone(&delivered);
    let hooks = Hooks {
        delivered: Some(Box::new(move |_| {
            d.fetch_add(1, Ordering::SeqCst);
        })),
        ..Hooks::default()
    };
    let cx = f.cx(&hooks);
    let sink = Arc::new(Sink::default());
    let t = token(&*f.store);
    let mut pass = PassCore::new(t.clone(), &config(), sink.clone(), clock(), now());
    assert_eq!(pass.seed(), 7, "the configured seed is the pass's");
    let jobs = started(&mut pass, cx);
    assert_eq!(jobs.len(), 1, "one lane: one in flight");
    let first = jobs[0].unit;
    jobs.into_iter()
        .for_each(|j| j.finish(result(Outcome::Delivered)));
    // The completion arrives, and the cancellation right behind it, before any round.
    for d in sink.take() {
        pass.handle_done(d, &hooks, now());
    }
    pass.handle_cancel(now());
    let r = pass.finish(cx);
    assert_eq!(r.end, PassEnd::Cancelled);
    assert!(r.error.is_none(), "{:?}", r.error);
    assert_eq!(r.report.delivered, 1);
    assert_eq!(
        delivered.load(Ordering::SeqCst),
        1,
        "the hook saw the delivery"
    );
    assert_eq!(
        pending(&*f.store),
        2,
        "the delivered unit is acked, durable"
    );
    // The next pass starts with the second unit, not the delivered one again.
    let _ = f.store.release_slot(&t).expect("release");
    let sink = Arc::new(Sink::default());
    let mut next = PassCore::new(token(&*f.store), &config(), sink, clock(), now());
    let jobs = started(&mut next, cx);
    assert_eq!(jobs.len(), 1);
    assert_ne!(jobs[0].unit, first);
}

#[test]
fn attempts_that_never_left_are_retried_without_counting() {
    let f = fixture(1);
    let hooks = Hooks::default();
    let cx = f.cx(&hooks);
    let sink = Arc::new(Sink::default());
    let mut pass = PassCore::new(token(&*f.store), &config(), sink.clone(), clock(), now());
    // Twenty attempts dropped before they were sent (a delivery task the runtime dropped):
    // with max_attempts 3, counting them would have dead-lettered the unit "exhausted".
    for _ in 0..20 {
        let jobs = started(&mut pass, cx);
        assert_eq!(jobs.len(), 1);
        drop(jobs);
        for d in sink.take() {
            assert_eq!(d.result.outcome, Outcome::NotSent);
            pass.handle_done(d, &hooks, now());
        }
    }
    let jobs = started(&mut pass, cx);
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].attempt, 1, "still the first attempt");
    jobs.into_iter()
        .for_each(|j| j.finish(result(Outcome::Delivered)));
    for d in sink.take() {
        pass.handle_done(d, &hooks, now());
    }
    for _ in 0..100 {
        let _ = pass.round(cx);
        if pass.ended().is_some() {
            break;
        }
    }
    let r = pass.finish(cx);
    assert_eq!(r.end, PassEnd::Drained);
    assert_eq!((r.report.delivered, r.report.dead_lettered), (1, 0));
    assert!(f.store.dead_letters(None).expect("dead letters").is_empty());
    assert_eq!(pending(&*f.store), 0);
}

#[test]
fn a_lost_slot_ends_the_pass_before_anything_else_starts() {
    let f = fixture(5);
    let hooks = Hooks::default();
    let cx = f.cx(&hooks);
    let sink = Arc::new(Sink::default());
    let t = token(&*f.store);
    let mut pass = PassCore::new(t.clone(), &config(), sink.clone(), clock(), now());
    let jobs = started(&mut pass, cx);
    assert_eq!(jobs.len(), 1);
    // The slot is lost (another holder took it over): this pass's acks are refused.
    let _ = f.store.release_slot(&t).expect("release");
    let _other = token(&*f.store);
    jobs.into_iter()
        .for_each(|j| j.finish(result(Outcome::Delivered)));
    for d in sink.take() {
        pass.handle_done(d, &hooks, now());
    }
    // The ack goes to the group-committing writer; once its commit fails, the next round
    // starts nothing and ends the pass.
    let mut started_after = 0;
    for _ in 0..1000 {
        started_after += pass.round(cx).len();
        if pass.ended().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(pass.ended(), Some(PassEnd::StoreFailed));
    // The unit after the delivered one may have started in the round that queued the ack
    // (before its commit failed); nothing after that.
    assert!(
        started_after <= 1,
        "{started_after} attempts started after the ack failed"
    );
    let r = pass.finish(cx);
    assert_eq!(r.error, Some(outbox_lanes_store::StoreError::StaleToken));
}

/// The persisted attempt count of the unit with `row` in `t`'s only lane.
fn attempts_of(store: &dyn Store, t: &SlotToken, row: &str) -> u32 {
    let (lanes, _) = store.lanes_with_work(t, 0).expect("lanes");
    let claimed = store
        .claim(
            t,
            &[outbox_lanes_store::ClaimRange {
                lane: lanes[0].lane,
                from: outbox_lanes_core::Seq(0),
                limit: 100,
            }],
        )
        .expect("claim");
    let unit = claimed[0]
        .units
        .iter()
        .find(|u| u.row_id == row)
        .expect("the unit is pending");
    unit.slots[0].attempts
}

#[test]
fn a_round_that_needs_no_store_runs_inline_and_one_that_writes_does_not() {
    let f = fixture(3);
    let hooks = Hooks::default();
    let cx = f.cx(&hooks);
    let sink = Arc::new(Sink::default());
    let t = token(&*f.store);
    let mut pass = PassCore::new(t.clone(), &config(), sink.clone(), clock(), now());
    // The first round must look for lanes in the store.
    assert!(pass.try_round_inline(cx).is_none());
    let jobs = started(&mut pass, cx);
    assert_eq!(jobs.len(), 1, "one lane: one in flight");
    assert_eq!(jobs[0].payload.body, b"0");
    jobs.into_iter()
        .for_each(|j| j.finish(result(Outcome::Delivered)));
    for d in sink.take() {
        pass.handle_done(d, &hooks, now());
    }
    // A delivery and the next start, whose payload the claim brought: no store call.
    let jobs = pass
        .try_round_inline(cx)
        .expect("a delivery and the next start need no store");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].payload.body, b"1");
    // A failure must be recorded before anything else starts: the inline round stops, and
    // the blocking round writes the record.
    jobs.into_iter().for_each(|j| {
        j.finish(result(Outcome::Transient { retry_after: None }));
    });
    for d in sink.take() {
        pass.handle_done(d, &hooks, now());
    }
    assert!(pass.try_round_inline(cx).is_none(), "a record waits");
    assert_eq!(attempts_of(&*f.store, &t, "r1"), 0, "not written inline");
    let mut jobs = pass.round(cx);
    assert_eq!(attempts_of(&*f.store, &t, "r1"), 1);
    if jobs.is_empty() {
        // The retry comes after its delay, from the payload the pass kept: it needs no
        // store either.
        std::thread::sleep(Duration::from_millis(5));
        pass.handle_timeout(now());
        jobs = pass
            .try_round_inline(cx)
            .expect("a retry with a kept payload needs no store");
    }
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        (jobs[0].payload.body.as_slice(), jobs[0].attempt),
        (&b"1"[..], 2)
    );
    drop(jobs);
    for d in sink.take() {
        pass.handle_done(d, &hooks, now());
    }
    pass.handle_cancel(now());
    let r = pass.finish(cx);
    assert_eq!(r.report.delivered, 1);
    assert_eq!(pending(&*f.store), 2, "r0 acked; r1 and r2 pending");
}

/// A lane refilling its window does not hold back its next attempt for the read: an inline
/// round that reaches a claim hands the read to the runtime ([`PassCore::take_claim`]) and
/// goes on. Here the read answers only once the lane has sent everything it held: every
/// refill had attempts start, one at a time and in order, while it was out.
#[test]
fn a_lane_goes_on_while_its_refill_is_read() {
    let f = fixture(40);
    let hooks = Hooks::default();
    let cx = f.cx(&hooks);
    let sink = Arc::new(Sink::default());
    let mut c = config();
    c.scheduler.max_per_lane = 16;
    let mut pass = PassCore::new(token(&*f.store), &c, sink.clone(), clock(), now());
    let mut bodies = Vec::new();
    let mut out: Option<Vec<outbox_lanes_store::ClaimRange>> = None;
    let (mut claims, mut sent_while_out) = (0, 0);
    let mut jobs = started(&mut pass, cx);
    for _ in 0..10_000 {
        if let Some(j) = jobs.pop() {
            assert!(jobs.is_empty(), "one lane: one attempt at a time");
            bodies.push(String::from_utf8(j.payload.body.clone()).expect("utf-8"));
            if out.is_some() {
                sent_while_out += 1;
            }
            j.finish(result(Outcome::Delivered));
            for d in sink.take() {
                pass.handle_done(d, &hooks, now());
            }
        } else if let Some(ranges) = out.take() {
            // The lane sent all it held: now the read answers.
            pass.handle_claim(cx.store.claim(pass.token(), &ranges));
        } else if pass.ended().is_some() {
            break;
        } else {
            std::thread::sleep(Duration::from_millis(1));
            pass.handle_timeout(now());
        }
        // The store is needed for something else now and then (a stale read of the lane
        // controls, the end of the lane): then the blocking round.
        jobs = pass.try_round_inline(cx).unwrap_or_else(|| pass.round(cx));
        if let Some(ranges) = pass.take_claim() {
            assert!(out.is_none(), "a second claim while one is out");
            claims += 1;
            out = Some(ranges);
        }
    }
    assert!(pass.ended().is_some(), "the pass did not end");
    let expected: Vec<String> = (0..40).map(|i| i.to_string()).collect();
    assert_eq!(bodies, expected, "every unit once, in order");
    // 40 units, a lane depth of 16 refilled at half: refills after the first claim, each
    // read while the lane went on.
    assert!(claims >= 2, "{claims} claims handed to the runtime");
    assert!(
        sent_while_out >= claims,
        "{sent_while_out} attempts started while {claims} claims were out"
    );
    let r = pass.finish(cx);
    assert_eq!(r.report.delivered, 40);
    assert_eq!(pending(&*f.store), 0);
}

/// A stop asked for with a grace of zero while a lane's refill is out: nothing more is sent,
/// and the pass ends without waiting for the read's answer.
#[test]
fn a_stop_without_grace_ends_the_pass_with_a_claim_out() {
    let f = fixture(40);
    let hooks = Hooks::default();
    let cx = f.cx(&hooks);
    let sink = Arc::new(Sink::default());
    let mut c = config();
    c.shutdown_grace = Duration::ZERO;
    c.scheduler.max_per_lane = 16;
    let mut pass = PassCore::new(token(&*f.store), &c, sink.clone(), clock(), now());
    let mut sent = 0;
    let mut out = None;
    let mut jobs = started(&mut pass, cx);
    // The first claim brought 16 units (the lane's depth); the refill goes out once 8 are
    // left. The stop comes while it is out, and the read never answers.
    while let Some(j) = jobs.pop() {
        sent += 1;
        j.finish(result(Outcome::Delivered));
        for d in sink.take() {
            pass.handle_done(d, &hooks, now());
        }
        if out.is_some() {
            pass.handle_shutdown(now());
        }
        jobs = pass
            .try_round_inline(cx)
            .unwrap_or_else(|| started(&mut pass, cx));
        if out.is_none() {
            out = pass.take_claim();
        } else {
            assert!(
                jobs.is_empty(),
                "an attempt was sent after a stop without grace"
            );
            break;
        }
    }
    assert!(out.is_some(), "no refill went out");
    for _ in 0..100 {
        assert!(pass.round(cx).is_empty());
        if pass.ended().is_some() {
            break;
        }
    }
    assert!(
        pass.ended().is_some(),
        "the pass waits for a read it no longer needs"
    );
    let r = pass.finish(cx);
    assert_eq!(r.report.delivered, sent);
    assert_eq!(pending(&*f.store), 40 - sent);
}

/// A lane's recipient URL is parsed once per pass: every job to the lane, each unit and each
/// retry, carries the same parsed URL (one allocation, shared), and the clients take it
/// parsed ([`outbox_lanes_driver::Delivery::recipient`] is a `Destination`), so no attempt
/// parses it again. Each job's body is its payload's bytes, and a retry in the same pass
/// shares the payload: no copy of the body.
#[test]
fn a_lanes_url_is_parsed_once_per_pass_and_bodies_are_not_copied() {
    let f = fixture(3);
    let hooks = Hooks::default();
    let cx = f.cx(&hooks);
    let sink = Arc::new(Sink::default());
    let mut pass = PassCore::new(token(&*f.store), &config(), sink.clone(), clock(), now());
    let mut seen = Vec::new();
    // Each unit fails once (a retry), then is delivered: six attempts in all.
    for _ in 0..6 {
        let jobs = started(&mut pass, cx);
        assert_eq!(jobs.len(), 1, "one lane: one attempt at a time");
        for j in jobs {
            let d = j.delivery();
            assert!(std::ptr::eq(d.body.as_ptr(), j.payload.body.as_ptr()));
            assert_eq!(d.recipient.as_str(), TO);
            let outcome = match seen.iter().find(|(u, _, _)| *u == j.unit) {
                Some((_, _, first)) => {
                    assert!(
                        Arc::ptr_eq(first, &j.payload),
                        "the retry shares the payload"
                    );
                    Outcome::Delivered
                }
                None => Outcome::Transient { retry_after: None },
            };
            seen.push((j.unit, Arc::clone(&j.recipient), Arc::clone(&j.payload)));
            j.finish(result(outcome));
        }
        for d in sink.take() {
            pass.handle_done(d, &hooks, now());
        }
    }
    assert_eq!(seen.len(), 6);
    assert!(
        seen.iter().all(|(_, r, _)| Arc::ptr_eq(r, &seen[0].1)),
        "every attempt shares the lane's one parsed URL"
    );
    for _ in 0..100 {
        let _ = pass.round(cx);
        if pass.ended().is_some() {
            break;
        }
    }
    let r = pass.finish(cx);
    assert_eq!(r.report.delivered, 3);
}

/// OL-14: the pass claimed the lane's next units before an operator paused it; once the pause
/// has returned, none of them starts. The attempt in flight finishes and is acked; the rest
/// goes back, and starts in order once the lane is resumed.
#[test]
fn a_lane_paused_mid_pass_starts_nothing_more_and_its_units_go_back() {
    let f = fixture(5);
    let hooks = Hooks::default();
    let cx = f.cx(&hooks);
    let alice = outbox_lanes_core::ActorId::new("alice");
    let key = outbox_lanes_core::LaneKey::new(TO, None).expect("key");
    let lane = f
        .store
        .find_lane(&alice, &key)
        .expect("find")
        .expect("lane");
    let sink = Arc::new(Sink::default());
    let t = token(&*f.store);
    let mut pass = PassCore::new(t.clone(), &config(), sink.clone(), clock(), now());
    let jobs = started(&mut pass, cx);
    assert_eq!(jobs.len(), 1);
    let first = jobs[0].unit;

    f.store.pause_lane(lane, "maintenance").expect("pause");
    // The attempt in flight ends; nothing of the lane starts after it.
    jobs.into_iter()
        .for_each(|j| j.finish(result(Outcome::Delivered)));
    for _ in 0..100 {
        for d in sink.take() {
            pass.handle_done(d, &hooks, now());
        }
        let jobs = pass.round(cx);
        assert!(
            jobs.is_empty(),
            "{:?} started after the pause returned",
            jobs.iter().map(|j| j.unit).collect::<Vec<_>>()
        );
        if pass.ended().is_some() {
            break;
        }
        pass.handle_timeout(now());
    }
    let r = pass.finish(cx);
    assert_eq!(r.end, PassEnd::Drained);
    assert_eq!((r.report.delivered, r.report.handed_back), (1, 4));
    assert_eq!(pending(&*f.store), 4);

    // Resumed: the next pass goes on with the second unit.
    let _ = f.store.release_slot(&t).expect("release");
    f.store.resume_lane(lane).expect("resume");
    let sink = Arc::new(Sink::default());
    let mut next = PassCore::new(token(&*f.store), &config(), sink, clock(), now());
    let jobs = started(&mut next, cx);
    assert_eq!(jobs.len(), 1);
    assert_ne!(jobs[0].unit, first);
    assert_eq!(jobs[0].payload.row_id, "r1");
}

/// The defaults, without `allow_loopback`, on `store` whose destination policy an operator
/// narrowed back to public after the rows were enqueued (OL-24: `outbox-lanes destinations
/// set public`): the tests' 127.0.0.x recipients are refused by the SSRF guard, as rows
/// enqueued with `--allow-private-destinations` are by a relay without it after such a
/// narrowing.
fn refusing(store: &dyn Store) -> OutboxConfig {
    store
        .set_destination_policy(AddressPolicy::public_only())
        .expect("narrow");
    refusing_config()
}

/// The defaults, without `allow_loopback`.
fn refusing_config() -> OutboxConfig {
    let mut c = OutboxConfig::default();
    c.scheduler.retry_delays = vec![Duration::from_millis(1)];
    c.scheduler.jitter_percent = 0;
    c.seed = Some(7);
    c
}

/// A pass of the fixture's actor with [`refusing_config`], and the sink its jobs report to.
fn refusing_pass(store: &dyn Store) -> (PassCore, Arc<Sink>) {
    let sink = Arc::new(Sink::default());
    let pass = PassCore::new(token(store), &refusing(store), sink.clone(), clock(), now());
    (pass, sink)
}

/// What an HTTP client answers for a job to a refused loopback destination.
fn refused() -> AttemptResult {
    AttemptResult {
        outcome: Outcome::Refused,
        status: None,
        error: Some("destination_refused: 127.0.0.1 is loopback".into()),
        body: None,
    }
}

/// Rounds until the pass ends; every job handed out is answered with `answer` at once, as
/// an executor would. Returns the number of jobs handed out.
fn drive(
    pass: &mut PassCore,
    cx: RoundContext<'_>,
    sink: &Sink,
    answer: impl Fn() -> AttemptResult,
) -> usize {
    let mut jobs = 0;
    for _ in 0..10_000 {
        for j in pass.round(cx) {
            jobs += 1;
            j.finish(answer());
        }
        for d in sink.take() {
            pass.handle_done(d, cx.hooks, now());
        }
        if pass.ended().is_some() {
            return jobs;
        }
        std::thread::sleep(Duration::from_millis(1));
        pass.handle_timeout(now());
    }
    panic!("the pass did not end within 10,000 rounds");
}

/// Drives a [`refusing_pass`] of `f`'s actor with `hooks` to its end, every job answered
/// [`refused`]: the jobs handed out, and the pass's result.
fn run_refused(f: &Fixture, hooks: &Hooks) -> (usize, PassResult) {
    let cx = f.cx(hooks);
    let (mut pass, sink) = refusing_pass(&*f.store);
    let jobs = drive(&mut pass, cx, &sink, refused);
    (jobs, pass.finish(cx))
}

/// What the dead-letter hook was told, with how many dead letters another connection saw
/// committed when it was called.
#[derive(Debug)]
struct Told {
    id: outbox_lanes_store::DeadLetterId,
    row: String,
    recipient: String,
    attempts: u32,
    reason: outbox_lanes_core::DeadReason,
    committed: usize,
}

fn telling_hooks(second: SqliteStore, told: &Arc<Mutex<Vec<Told>>>) -> Hooks {
    let t = Arc::clone(told);
    Hooks {
        dead_lettered: Some(Box::new(move |d| {
            let committed = second.dead_letters(None).expect("dead letters").len();
            t.lock().expect("told").push(Told {
                id: d.id,
                row: d.row_id.clone(),
                recipient: d.recipient.clone(),
                attempts: d.attempts,
                reason: d.reason,
                committed,
            });
        })),
        ..Hooks::default()
    }
}

/// A refused destination is a property of the lane: the round that starts its head finds
/// the refusal without handing anything to the executor, and the scheduler's next starts of
/// the lane follow in the same round, so one write commits many of its dead letters. Each
/// dead letter keeps what it did (one counted attempt, the refusal as its error, ids in lane
/// order), and the hook is called once per dead letter, in lane order, after its commit.
#[test]
fn a_refused_lane_is_dead_lettered_in_batches_without_a_job_each_reported_after_its_commit() {
    const OTHER: &str = "http://127.0.0.2:9/inbox";
    let rows = (0..40)
        .map(|i| new_row(&format!("r{i}"), TO))
        .chain((0..10).map(|i| new_row(&format!("o{i}"), OTHER)))
        .collect();
    let f = fixture_with(rows);
    let told = Arc::new(Mutex::new(Vec::new()));
    let mut hooks = telling_hooks(f.second(), &told);
    let (started_n, attempted_n) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let s = Arc::clone(&started_n);
    hooks.started = Some(Box::new(move |_| {
        s.fetch_add(1, Ordering::SeqCst);
    }));
    let a = Arc::clone(&attempted_n);
    hooks.attempted = Some(Box::new(move |at| {
        assert_eq!(at.outcome, Outcome::Refused);
        a.fetch_add(1, Ordering::SeqCst);
    }));
    let (jobs, r) = run_refused(&f, &hooks);
    assert_eq!(
        jobs, 0,
        "nothing is handed to the executor for a refused destination"
    );
    assert_eq!(r.end, PassEnd::Drained);
    assert_eq!(r.report.dead_lettered, 50);
    assert_eq!(pending(&*f.store), 0);
    // Each attempt is still reported as started and finished (metrics), once.
    assert_eq!(started_n.load(Ordering::SeqCst), 50);
    assert_eq!(attempted_n.load(Ordering::SeqCst), 50);

    let listed = f.store.dead_letters(None).expect("dead letters");
    assert_eq!(listed.len(), 50);
    for d in &listed {
        assert_eq!(d.reason, outbox_lanes_core::DeadReason::DestinationRefused);
        assert_eq!(d.attempts, 1, "{d:?}");
        assert_eq!(
            d.last_error.as_deref(),
            Some(if d.key.recipient() == TO {
                "destination_refused: 127.0.0.1 is loopback"
            } else {
                "destination_refused: 127.0.0.2 is loopback"
            })
        );
    }
    let told = told.lock().expect("told");
    assert_eq!(told.len(), 50, "one call per dead letter");
    for (lane, prefix) in [(TO, "r"), (OTHER, "o")] {
        let calls: Vec<&Told> = told.iter().filter(|t| t.recipient == lane).collect();
        let rows: Vec<String> = calls.iter().map(|t| t.row.clone()).collect();
        let expected: Vec<String> = (0..calls.len()).map(|i| format!("{prefix}{i}")).collect();
        assert_eq!(rows, expected, "hook calls in lane order");
        assert!(
            calls.windows(2).all(|w| w[0].id < w[1].id),
            "ids in lane order"
        );
    }
    for (i, t) in told.iter().enumerate() {
        assert_eq!(
            (t.attempts, t.reason),
            (1, outbox_lanes_core::DeadReason::DestinationRefused)
        );
        let l = listed
            .iter()
            .find(|d| d.id == t.id)
            .expect("the hook's id is listed");
        assert_eq!(l.row_id, t.row);
        assert!(
            t.committed > i,
            "call {i} came before its dead letter was committed ({} visible)",
            t.committed
        );
    }
    assert!(
        told[0].committed > 1,
        "the first commit wrote several dead letters, not one: {} visible at the first call",
        told[0].committed
    );
}

/// A host name (not an IP literal) whose every address the guard refuses: the pass cannot
/// know before a job resolves it, but once one job of the lane comes back refused, the
/// lane's later starts are refused in their rounds like an IP literal's (for a minute), and
/// dead-lettered in batches, without a job (and a resolution) each. Before, each of the 50
/// units was a job of its own.
#[test]
fn a_host_name_refused_once_is_refused_for_a_while_without_a_job_each() {
    const NAMED: &str = "http://localhost:9/inbox";
    let f = fixture_with((0..50).map(|i| new_row(&format!("n{i}"), NAMED)).collect());
    // Every job is answered as the HTTP client's guarded resolver answers for `localhost`.
    let (jobs, r) = run_refused(&f, &Hooks::default());
    assert_eq!(
        jobs, 1,
        "one job resolved the name; the rest were refused in their rounds"
    );
    assert_eq!(r.end, PassEnd::Drained);
    assert_eq!(r.report.dead_lettered, 50);
    let listed = f.store.dead_letters(None).expect("dead letters");
    assert_eq!(listed.len(), 50);
    let rows: Vec<&str> = listed.iter().map(|d| d.row_id.as_str()).collect();
    let expected: Vec<String> = (0..50).map(|i| format!("n{i}")).collect();
    assert_eq!(rows, expected, "in lane order");
    assert!(listed.iter().all(|d| {
        d.reason == outbox_lanes_core::DeadReason::DestinationRefused
            && d.last_error.as_deref() == Some("destination_refused: 127.0.0.1 is loopback")
    }));
}

/// OL-16 with dead letters written together: outcomes that arrive together (both lanes'
/// heads refused by their recipients at once) are dead-lettered in one write, and no later
/// unit of either lane is handed out before that write committed.
#[test]
fn a_later_unit_is_handed_out_only_once_the_dead_letters_before_it_are_committed() {
    const B: &str = "http://127.0.0.1:9/b";
    let rows = (0..3)
        .flat_map(|i| [new_row(&format!("a{i}"), TO), new_row(&format!("b{i}"), B)])
        .collect();
    let f = fixture_with(rows);
    let second = f.second();
    let told = Arc::new(Mutex::new(Vec::new()));
    let hooks = telling_hooks(f.second(), &told);
    let cx = f.cx(&hooks);
    let sink = Arc::new(Sink::default());
    let mut pass = PassCore::new(token(&*f.store), &config(), sink.clone(), clock(), now());
    let mut sent = Vec::new();
    let mut jobs = started(&mut pass, cx);
    for _ in 0..100 {
        if jobs.is_empty() && pass.ended().is_some() {
            break;
        }
        // Handed out: every earlier unit of its lane is delivered or its dead letter is
        // committed (another connection sees it).
        let committed: Vec<String> = second
            .dead_letters(None)
            .expect("dead letters")
            .into_iter()
            .map(|d| d.row_id)
            .collect();
        for j in &jobs {
            let row = &j.payload.row_id;
            let (lane, n) = row.split_at(1);
            let n: usize = n.parse().expect("row number");
            for k in 0..n {
                let earlier = format!("{lane}{k}");
                assert!(
                    committed.contains(&earlier),
                    "{row} handed out before the dead letter of {earlier} was committed"
                );
            }
            sent.push(row.clone());
        }
        // Both heads at once: 422 each, the first two rows of each lane.
        for j in jobs.drain(..) {
            j.finish(AttemptResult {
                outcome: Outcome::Permanent,
                status: Some(422),
                error: Some("status 422".into()),
                body: None,
            });
        }
        for d in sink.take() {
            pass.handle_done(d, &hooks, now());
        }
        jobs = pass.round(cx);
        pass.handle_timeout(now());
    }
    sent.sort();
    assert_eq!(sent, ["a0", "a1", "a2", "b0", "b1", "b2"]);
    let r = pass.finish(cx);
    assert_eq!(r.report.dead_lettered, 6);
    let told = told.lock().expect("told");
    assert_eq!(told.len(), 6);
    assert!(
        told.iter().enumerate().all(|(i, t)| t.committed > i),
        "a hook call before its commit: {told:?}"
    );
    // The two heads' outcomes came in one round: one write for both.
    assert_eq!(told[0].committed, 2, "{told:?}");
}

/// A dead-letter write that fails (here inside the database, at the fourth unit) writes
/// none of the round's dead letters and reports none: no hook call, nothing counted, the
/// pass ends and every unit is pending as before, in order.
#[test]
fn a_failed_dead_letter_write_writes_and_reports_none_of_its_dead_letters() {
    let f = fixture(8);
    let c = outbox_lanes_store::sqlite::rusqlite::Connection::open(f.dir.path().join("outbox.db"))
        .expect("open");
    c.execute_batch(
        "CREATE TRIGGER test_fail_dead BEFORE INSERT ON ol_dead_letters \
         WHEN NEW.row_id = 'r3' BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
    )
    .expect("trigger");
    let told = Arc::new(Mutex::new(Vec::new()));
    let hooks = telling_hooks(f.second(), &told);
    let cx = f.cx(&hooks);
    let sink = Arc::new(Sink::default());
    let t = token(&*f.store);
    let mut pass = PassCore::new(
        t.clone(),
        &refusing(&*f.store),
        sink.clone(),
        clock(),
        now(),
    );
    let _ = drive(&mut pass, cx, &sink, refused);
    let r = pass.finish(cx);
    assert_eq!(r.end, PassEnd::StoreFailed);
    assert!(r.error.is_some());
    assert_eq!(r.report.dead_lettered, 0);
    assert!(told.lock().expect("told").is_empty(), "no hook call");
    assert!(f.store.dead_letters(None).expect("dead letters").is_empty());
    assert_eq!(pending(&*f.store), 8);
    assert_eq!(
        attempts_of(&*f.store, &t, "r0"),
        1,
        "the attempt record stands"
    );
}

/// A pass whose slot was taken over while it decided (here: from the hook of its first
/// start) writes no dead letter and reports none.
#[test]
fn a_stale_token_dead_letters_nothing() {
    let f = fixture(8);
    let told = Arc::new(Mutex::new(Vec::new()));
    let mut hooks = telling_hooks(f.second(), &told);
    let t = token(&*f.store);
    let (store, t2) = (Arc::clone(&f.store), t.clone());
    let taken = Arc::new(Mutex::new(None));
    let tk = Arc::clone(&taken);
    hooks.started = Some(Box::new(move |_| {
        let mut taken = tk.lock().expect("taken");
        if taken.is_none() {
            let _ = store.release_slot(&t2).expect("release");
            *taken = Some(token(&*store));
        }
    }));
    let cx = f.cx(&hooks);
    let sink = Arc::new(Sink::default());
    let mut pass = PassCore::new(t, &refusing(&*f.store), sink.clone(), clock(), now());
    let _ = drive(&mut pass, cx, &sink, refused);
    let r = pass.finish(cx);
    assert_eq!(r.end, PassEnd::StoreFailed);
    assert_eq!(r.error, Some(outbox_lanes_store::StoreError::StaleToken));
    assert_eq!(r.report.dead_lettered, 0);
    assert!(told.lock().expect("told").is_empty(), "no hook call");
    assert!(f.store.dead_letters(None).expect("dead letters").is_empty());
    assert_eq!(pending(&*f.store), 8);
}

/// OL-14 on the refused path: a refused lane paused while its units are being dead-lettered
/// (here from the hook of its second start, so the pause has returned before the pass goes
/// on) dead-letters nothing after that start; the rest stays pending, in order.
#[test]
fn a_refused_lane_paused_mid_round_dead_letters_nothing_after_the_pause() {
    let f = fixture(8);
    let alice = outbox_lanes_core::ActorId::new("alice");
    let key = outbox_lanes_core::LaneKey::new(TO, None).expect("key");
    let lane = f
        .store
        .find_lane(&alice, &key)
        .expect("find")
        .expect("lane");
    let told = Arc::new(Mutex::new(Vec::new()));
    let mut hooks = telling_hooks(f.second(), &told);
    let store = Arc::clone(&f.store);
    let starts = Arc::new(AtomicUsize::new(0));
    let n = Arc::clone(&starts);
    hooks.started = Some(Box::new(move |_| {
        if n.fetch_add(1, Ordering::SeqCst) == 1 {
            // Returns 50 ms after its commit, as a pass holds the slot.
            store.pause_lane(lane, "maintenance").expect("pause");
        }
    }));
    let cx = f.cx(&hooks);
    let (mut pass, sink) = refusing_pass(&*f.store);
    let _ = drive(&mut pass, cx, &sink, refused);
    let r = pass.finish(cx);
    assert_eq!(r.end, PassEnd::Drained);
    let rows: Vec<String> = f
        .store
        .dead_letters(None)
        .expect("dead letters")
        .into_iter()
        .map(|d| d.row_id)
        .collect();
    assert_eq!(
        rows,
        ["r0", "r1"],
        "the start under way finishes; nothing after it"
    );
    assert_eq!(starts.load(Ordering::SeqCst), 2);
    assert_eq!(told.lock().expect("told").len(), 2);
    assert_eq!(pending(&*f.store), 6);
}

/// A deep refused lane does not keep one round going for as long as it is deep: a round
/// resolves a bounded number of its starts (1,024), then returns, due again at once, so the
/// runtime takes completions, stops and cancellations in between; the next rounds go on.
#[test]
fn a_deep_refused_lane_is_dead_lettered_over_bounded_rounds() {
    let f = fixture(3000);
    let hooks = Hooks::default();
    let cx = f.cx(&hooks);
    let (mut pass, _sink) = refusing_pass(&*f.store);
    assert!(pass.round(cx).is_empty());
    let dead = f.store.dead_letters(None).expect("dead letters").len();
    assert!(
        (1..=1024).contains(&dead),
        "{dead} dead letters after the first round"
    );
    assert_eq!(pass.ended(), None);
    assert!(
        pass.poll_timeout().is_some_and(|t| t <= now()),
        "the next round is due at once"
    );
    let mut rounds = 1;
    while pass.ended().is_none() {
        assert!(pass.round(cx).is_empty(), "never a job");
        rounds += 1;
        assert!(rounds < 100, "the lane was not finished within 100 rounds");
    }
    assert!(rounds >= 3, "3,000 units in {rounds} rounds");
    let r = pass.finish(cx);
    assert_eq!((r.end, r.report.dead_lettered), (PassEnd::Drained, 3000));
    assert_eq!(pending(&*f.store), 0);
}

/// OL-24: a pass delivers to what the outbox's stored destination policy allows beyond its
/// own configuration, read when the pass begins into the handle the HTTP clients share, so
/// that a change by another process (here an operator's narrowing) reaches the next pass.
#[test]
fn each_pass_reads_the_outboxs_destination_policy_when_it_begins() {
    let f = fixture(1);
    let own = refusing_config();
    let clients = own.http.outbox_addresses.clone();
    assert_eq!(own.http.allowed(), AddressPolicy::public_only());
    let hooks = Hooks::default();
    let cx = f.cx(&hooks);
    let sink = Arc::new(Sink::default());
    let t = token(&*f.store);
    let mut pass = PassCore::new(t.clone(), &own, sink.clone(), clock(), now());
    let jobs = drive(&mut pass, cx, &sink, || result(Outcome::Delivered));
    let r = pass.finish(cx);
    let _ = f.store.release_slot(&t).expect("release");
    assert_eq!((jobs, r.report.delivered), (1, 1), "sent, not refused");
    assert_eq!(r.report.dead_lettered, 0);
    assert_eq!(clients.get(), AddressPolicy::allow_loopback_only());

    f.store
        .enqueue(
            &outbox_lanes_core::ActorId::new("alice"),
            &[new_row("r1", TO)],
        )
        .expect("enqueue");
    f.store
        .set_destination_policy(AddressPolicy::public_only())
        .expect("narrow");
    let mut pass = PassCore::new(token(&*f.store), &own, sink.clone(), clock(), now());
    let jobs = drive(&mut pass, cx, &sink, || result(Outcome::Delivered));
    let r = pass.finish(cx);
    assert_eq!(jobs, 0, "refused in its round, without a job");
    assert_eq!((r.report.delivered, r.report.dead_lettered), (0, 1));
    assert_eq!(clients.get(), AddressPolicy::public_only());
    let dead = f.store.dead_letters(None).expect("dead letters");
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].reason,
        outbox_lanes_core::DeadReason::DestinationRefused
    );
}
