//! The pass lifecycle in virtual time with the default settings: the scheduler and the pass
//! session driven together, pass after pass, against recipients that answer late, fail
//! slowly or hang, and the monitor's bound on passes with actors that only wait.
//!
//! A 25 s answer, a 30 s HTTP timeout, a 10 s time slice and hour-long lane backoffs run in
//! milliseconds: the clock jumps to the next answer, timer or session deadline. The HTTP
//! timeout is the runtime's (it turns a hang into a `Transient` outcome after 30 s); here
//! a hanging recipient is one whose answer is that outcome, 30 s later.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{T0, World, transcript_config};
use outbox_lanes_core::{
    ActorId, Command, DeadReason, LaneId, MonitorAction, MonitorBook, Outcome, PassEnd,
    PassSession, SessionAction, SessionConfig, StopReason, Timestamp, UnitId, Wake,
};

/// The runtime's defaults (driver `OutboxConfig`, HTTP client).
const TIME_SLICE: Duration = Duration::from_secs(10);
const LEASE: Duration = Duration::from_secs(30);
const GRACE: Duration = Duration::from_secs(10);
const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

fn session_config() -> SessionConfig {
    SessionConfig {
        time_slice: TIME_SLICE,
        lease: LEASE,
        shutdown_grace: GRACE,
    }
}

/// How a recipient answers its `n`-th request (1-based): after how long, and what.
type Behaviour = Box<dyn Fn(u32) -> (Duration, Outcome)>;

fn answers_after(d: Duration) -> Behaviour {
    Box::new(move |_| (d, Outcome::Delivered))
}

fn fails_after(d: Duration) -> Behaviour {
    Box::new(move |_| (d, Outcome::Transient { retry_after: None }))
}

/// Never answers: the runtime's HTTP timeout ends each attempt as a transient failure.
fn hangs() -> Behaviour {
    Box::new(|_| (HTTP_TIMEOUT, Outcome::Transient { retry_after: None }))
}

/// One actor's outbox driven pass after pass, as a drain and the monitor would.
struct Sim {
    w: World,
    behaviour: BTreeMap<String, Behaviour>,
    /// Answers on their way: when, to which attempt, what. Cleared when a pass hands its
    /// attempts in flight back (their answers are then ignored, as the runtime does).
    answers: Vec<(Timestamp, UnitId, LaneId, Outcome)>,
    /// Every request a recipient received: when, which unit.
    requests: BTreeMap<String, Vec<(Timestamp, UnitId)>>,
    /// How every pass ended, and when.
    ends: Vec<(Duration, PassEnd)>,
    seen: usize,
    /// Whether other actors wait for a pass (the time slice applies only then).
    contended: bool,
}

impl Sim {
    fn new() -> Self {
        Sim {
            w: World::new(transcript_config()),
            behaviour: BTreeMap::new(),
            answers: Vec::new(),
            requests: BTreeMap::new(),
            ends: Vec::new(),
            seen: 0,
            contended: true,
        }
    }

    fn recipient(&mut self, name: &str, b: Behaviour) {
        self.behaviour.insert(name.to_string(), b);
        self.w.lane(name);
    }

    fn requests(&self, name: &str) -> usize {
        self.requests.get(name).map_or(0, Vec::len)
    }

    fn at(&self) -> Duration {
        self.w.now.saturating_duration_since(T0)
    }

    /// Sends the requests the scheduler started since the last look.
    fn send_started(&mut self) {
        let new: Vec<Command> = self.w.log[self.seen..].to_vec();
        self.seen = self.w.log.len();
        for c in new {
            if let Command::Start { unit, lane, .. } = c {
                let name = self.w.names[&lane].clone();
                let list = self.requests.entry(name.clone()).or_default();
                list.push((self.w.now, unit));
                let n = u32::try_from(list.len()).expect("few requests");
                let (after, outcome) = self.behaviour[&name](n);
                self.answers.push((self.w.now + after, unit, lane, outcome));
            }
        }
    }

    /// Runs one pass until its session ends it; returns how.
    fn pass(&mut self) -> PassEnd {
        let mut session = PassSession::new(session_config(), self.w.now);
        session.set_slicing(self.contended);
        self.w.discover();
        loop {
            self.send_started();
            let now = self.w.now;
            session.handle_tick(now, self.w.s.in_flight(), self.w.s.is_done(now));
            while let Some(a) = session.poll_action() {
                match a {
                    SessionAction::RenewLease => session.handle_lease_renewed(now),
                    SessionAction::StopStarting(_) => {
                        self.w.s.handle_stop(now);
                        self.w.settle();
                    }
                    SessionAction::End(end) => {
                        if end.hands_back_in_flight() {
                            self.w.s.handle_interrupt(now);
                            self.answers.clear();
                        } else {
                            self.w.s.handle_pass_end(now);
                        }
                        self.w.settle();
                        self.seen = self.w.log.len();
                        self.ends.push((self.at(), end));
                        return end;
                    }
                }
            }
            // The clock jumps to the next answer, scheduler timer or session deadline.
            let next = [
                self.answers.iter().map(|a| a.0).min(),
                self.w.s.poll_timeout(),
                session.poll_timeout(),
            ]
            .into_iter()
            .flatten()
            .min()
            .expect("a pass that is not over waits for something");
            self.w.now = self.w.now.max(next);
            let now = self.w.now;
            let (due, later): (Vec<_>, Vec<_>) = self.answers.drain(..).partition(|a| a.0 <= now);
            self.answers = later;
            for (_, unit, lane, outcome) in due {
                self.w
                    .s
                    .handle_outcome(unit, lane, outcome, now)
                    .expect("an answer to an attempt in flight");
                self.w.settle();
            }
            self.w.s.handle_timeout(now);
            self.w.settle();
        }
    }

    /// Runs passes, as the monitor would, until nothing is pending or `horizon` is reached:
    /// a yielded pass is followed at once, a drained one at its lanes' earliest
    /// `not_before`.
    fn run_until(&mut self, horizon: Duration) {
        while self.at() < horizon && !self.w.store.units.is_empty() {
            let end = self.pass();
            if end == PassEnd::Drained {
                let next = self
                    .w
                    .store
                    .lanes_with_work()
                    .into_iter()
                    .filter_map(|l| self.w.store.lane_info(l).not_before)
                    .min();
                match next {
                    Some(t) if t > self.w.now => self.w.now = t,
                    Some(_) => {}
                    None if self.w.store.units.is_empty() => {}
                    None => panic!("a drained pass left work that nothing will wake"),
                }
            }
        }
    }

    fn dead(&self) -> Vec<DeadReason> {
        self.w.store.dead.iter().map(|d| d.2).collect()
    }

    /// The gaps between a recipient's requests.
    fn gaps(&self, name: &str) -> Vec<Duration> {
        self.requests[name]
            .windows(2)
            .map(|p| p[1].0.saturating_duration_since(p[0].0))
            .collect()
    }
}

#[test]
fn a_recipient_answering_after_25_s_gets_one_request_and_its_unit() {
    let mut sim = Sim::new();
    sim.recipient("slow", answers_after(Duration::from_secs(25)));
    let u = sim.w.enqueue(&["slow"], false)[0];
    sim.run_until(Duration::from_secs(600));
    assert_eq!(
        sim.requests("slow"),
        1,
        "one request, not one per slice: {:?}",
        sim.requests
    );
    let slow = sim.w.lane("slow");
    assert_eq!(sim.w.store.delivered, [(u, slow)]);
    // The slice stopped the pass at 10 s; it waited for the answer at 25 s and yielded.
    assert_eq!(
        sim.ends.first(),
        Some(&(
            Duration::from_secs(25),
            PassEnd::Yielded(StopReason::TimeSlice)
        ))
    );
    assert!(
        !sim.w.log.iter().any(|c| matches!(
            c,
            Command::Interrupted { .. } | Command::RecordAttempt { .. }
        )),
        "nothing was cut off or failed"
    );
}

#[test]
fn slow_failures_reach_the_lane_backoff_after_pass_attempts_however_passes_are_sliced() {
    let mut sim = Sim::new();
    // 503 after 4 s: only two or three fit in a 10 s slice.
    sim.recipient("flaky", fails_after(Duration::from_secs(4)));
    sim.w.enqueue(&["flaky"], false);
    sim.w.enqueue(&["flaky"], false);
    sim.run_until(Duration::from_secs(60));
    let lane = sim.w.lane("flaky");
    let cfg = transcript_config();
    // The first backoff comes after exactly `pass_attempts` requests, across passes.
    let first_backoff = sim
        .w
        .log
        .iter()
        .position(|c| matches!(c, Command::LaneBackoff { lane: l, level: 1, .. } if *l == lane))
        .expect("the lane reached its backoff");
    let attempts_before = sim.w.log[..first_backoff]
        .iter()
        .filter(|c| matches!(c, Command::Start { .. }))
        .count();
    assert_eq!(attempts_before, cfg.pass_attempts as usize);
    assert!(
        sim.ends.len() >= 2,
        "the failures spanned several passes: {:?}",
        sim.ends
    );
    // Only the head was tried: its follower waits unattempted behind it (OL-7).
    let first = sim.requests["flaky"][0].1;
    assert!(sim.requests["flaky"].iter().all(|r| r.1 == first));
}

#[test]
fn a_slow_failing_recipient_then_costs_one_probe_per_interval_until_its_maximum() {
    let mut sim = Sim::new();
    sim.recipient("flaky", fails_after(Duration::from_secs(4)));
    sim.w.enqueue(&["flaky"], false);
    sim.run_until(Duration::from_secs(6 * 3600));
    let cfg = transcript_config();
    assert_eq!(sim.dead(), [DeadReason::Exhausted]);
    assert_eq!(sim.requests("flaky"), cfg.max_attempts as usize);
    // After the stall, each probe waits for the lane backoff of its level (30 s, 60 s, …).
    let gaps = sim.gaps("flaky");
    let probes = &gaps[cfg.pass_attempts as usize - 1..];
    for (i, gap) in probes.iter().enumerate() {
        let level = u32::try_from(i).expect("few") + 1;
        assert!(
            *gap >= cfg.lane_backoff(level),
            "probe {} after {gap:?}, before the level {level} backoff {:?}",
            i + 1,
            cfg.lane_backoff(level)
        );
    }
}

#[test]
fn a_hanging_recipient_times_out_into_the_backoff_ladder_over_hours() {
    let mut sim = Sim::new();
    sim.recipient("hang", hangs());
    sim.recipient("ok", answers_after(Duration::from_millis(50)));
    sim.w.enqueue(&["hang", "ok"], false);
    sim.w.enqueue(&["ok"], false);
    sim.run_until(Duration::from_secs(4 * 3600));
    let hang = sim.w.lane("hang");
    let cfg = transcript_config();
    // Every request was answered by the timeout and recorded: none was cut off and sent
    // again as if new.
    assert!(
        !sim.w
            .log
            .iter()
            .any(|c| matches!(c, Command::Interrupted { .. })),
        "an attempt was cut off by a slice"
    );
    let recorded: Vec<u32> = sim
        .w
        .log
        .iter()
        .filter_map(|c| match c {
            Command::RecordAttempt { lane, attempts, .. } if *lane == hang => Some(*attempts),
            _ => None,
        })
        .collect();
    assert_eq!(recorded, (1..=cfg.max_attempts).collect::<Vec<_>>());
    assert_eq!(sim.requests("hang"), cfg.max_attempts as usize);
    assert_eq!(sim.dead(), [DeadReason::Exhausted]);
    // The backoff ladder: the lane's levels go up one per failed probe.
    let levels: Vec<u32> = sim
        .w
        .log
        .iter()
        .filter_map(|c| match c {
            Command::LaneBackoff { lane, level, .. } if *lane == hang => Some(*level),
            _ => None,
        })
        .collect();
    // Level 1 at the stall (the 4th timeout), one more per failed probe, the last one
    // with the dead letter.
    assert_eq!(
        levels,
        (1..=cfg.max_attempts - cfg.pass_attempts + 1).collect::<Vec<_>>()
    );
    // The healthy recipient of the same actor had its rows meanwhile.
    assert_eq!(sim.requests("ok"), 2);
}

#[test]
fn a_shutdown_past_its_grace_records_the_cut_attempt_uncounted_and_hands_it_back() {
    let mut w = World::new(transcript_config());
    let u = w.enqueue(&["hang"], false)[0];
    let hang = w.lane("hang");
    let mut session = PassSession::new(session_config(), w.now);
    w.discover();
    session.handle_tick(w.now, w.s.in_flight(), w.s.is_done(w.now));
    assert_eq!(session.poll_action(), None);
    let t = w.now + Duration::from_secs(5);
    session.handle_shutdown(t);
    assert_eq!(
        session.poll_action(),
        Some(SessionAction::StopStarting(StopReason::Shutdown))
    );
    let t = t + GRACE;
    session.handle_tick(t, w.s.in_flight(), w.s.is_done(t));
    let end = session.poll_action();
    assert_eq!(
        end,
        Some(SessionAction::End(PassEnd::GraceOver(StopReason::Shutdown)))
    );
    w.now = t;
    w.s.handle_interrupt(t);
    w.settle();
    assert_eq!(
        w.take(),
        ["start u1 hang #1", "interrupted u1 hang 0", "back u1"]
    );
    assert_eq!(w.store.attempts(u, hang), Some(0), "not counted");
}

/// Eight actors each wait on a hanging recipient; with `max_passes` 8 a ninth, healthy
/// actor still gets a pass at once: a pass that only waits on attempts in flight does not
/// count against the bound (OL-13).
#[test]
fn passes_that_only_wait_on_hanging_attempts_keep_no_actor_from_a_pass() {
    let t = T0;
    let mut m = MonitorBook::new(8, Duration::from_secs(1));
    assert_eq!(m.poll_action(t), Some(MonitorAction::Poll));
    let hanging: Vec<ActorId> = (0..8).map(|i| ActorId::new(format!("h{i}"))).collect();
    let healthy = ActorId::new("healthy");
    m.handle_due(hanging.iter().cloned(), None, t);
    let mut drains = Vec::new();
    while let Some(a) = m.poll_action(t) {
        drains.push(a);
    }
    assert_eq!(drains.len(), 8);
    // Each pass starts its attempt; the recipient hangs: the pass only waits now.
    for a in &hanging {
        let mut w = World::new(transcript_config());
        w.enqueue(&["hang"], false);
        w.discover();
        assert_eq!(w.s.in_flight(), 1);
        assert!(w.s.only_waits(w.now) && !w.s.is_done(w.now));
        m.handle_pass_waiting(a, true, t);
    }
    // The healthy actor's rows are enqueued 100 ms later: its pass starts at once.
    let t1 = t + Duration::from_millis(100);
    m.handle_wake(Wake::Enqueued(healthy.clone()), t1);
    assert_eq!(
        m.poll_action(t1),
        Some(MonitorAction::Drain(healthy.clone()))
    );
    assert_eq!((m.running(), m.waiting()), (9, 8));
    // Waiting passes that have work again count again: nothing new starts until fewer
    // than 8 have work.
    for a in &hanging {
        m.handle_pass_waiting(a, false, t1);
    }
    let other = ActorId::new("other");
    m.handle_wake(Wake::Enqueued(other.clone()), t1);
    assert_eq!(m.poll_action(t1), None);
    m.handle_pass_done(&healthy, false, t1);
    assert_eq!(m.poll_action(t1), None, "8 passes with work");
    m.handle_pass_done(&hanging[0], false, t1);
    assert_eq!(m.poll_action(t1), Some(MonitorAction::Drain(other)));
}

/// A pass with a busy healthy lane and a hanging one: the slice stops it starting at 10 s,
/// but the hanging attempt is waited for and recorded at its timeout (30 s) instead of being
/// cut off and sent again; the healthy lane goes on in order in the next pass. (Between the
/// stop and the timeout the healthy lane waits: the cost of never abandoning an attempt.)
#[test]
fn a_slice_stop_waits_for_the_hanging_attempt_and_the_next_pass_starts_at_its_answer() {
    let mut sim = Sim::new();
    sim.recipient("hang", hangs());
    sim.recipient("ok", answers_after(Duration::from_millis(200)));
    sim.w.enqueue(&["hang"], false);
    for _ in 0..100 {
        sim.w.enqueue(&["ok"], false);
    }
    sim.run_until(Duration::from_secs(40));
    // The first pass stopped starting at 10 s, and ended when the hanging attempt timed out
    // at 30 s, recorded.
    assert_eq!(
        sim.ends.first(),
        Some(&(HTTP_TIMEOUT, PassEnd::Yielded(StopReason::TimeSlice)))
    );
    assert!(
        sim.w
            .log
            .iter()
            .any(|c| matches!(c, Command::RecordAttempt { attempts: 1, .. })),
        "the timeout was recorded"
    );
    let ok: Vec<UnitId> = sim.requests["ok"].iter().map(|r| r.1).collect();
    let mut sorted = ok.clone();
    sorted.sort();
    assert_eq!(ok, sorted, "the healthy lane in order");
}

/// The same hanging lane next to a busy healthy one, with nobody waiting for a pass (a
/// direct drain, or a monitor with no actor queued): the slice does not stop the pass, so
/// the healthy lane never waits for the hanging attempt.
#[test]
fn uncontended_the_healthy_lane_never_waits_for_the_hanging_attempt() {
    let mut sim = Sim::new();
    sim.contended = false;
    sim.recipient("hang", hangs());
    sim.recipient("ok", answers_after(Duration::from_millis(200)));
    sim.w.enqueue(&["hang"], false);
    for _ in 0..200 {
        sim.w.enqueue(&["ok"], false);
    }
    sim.run_until(Duration::from_secs(60));
    // 200 rows 200 ms apart: one after another, no gap for the hanging attempt's 30 s.
    let gaps = sim.gaps("ok");
    assert_eq!(gaps.len(), 199);
    assert!(
        gaps.iter().all(|g| *g == Duration::from_millis(200)),
        "the healthy lane paused: {:?}",
        gaps.iter().max()
    );
    assert!(
        sim.ends
            .iter()
            .all(|e| e.1 == PassEnd::Drained || e.0 > Duration::from_secs(40))
    );
}
