//! The monitor's bookkeeping (OL-13): which actors to drain after a wake-up or a poll tick,
//! with a bound on concurrent passes; when the store's upkeep runs; and how the monitor stops.

use alloc::collections::{BTreeSet, VecDeque};
use core::time::Duration;

use crate::ids::ActorId;
use crate::time::Timestamp;

/// What the monitor should do next.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum MonitorAction {
    /// Start the store's upkeep (as a task of its own: a long purge never delays a poll), then
    /// call [`MonitorBook::handle_upkeep_done`] when it ends, however it ends.
    Upkeep,
    /// Ask the store which actors have work admissible now (and the earliest `not_before`),
    /// then call [`MonitorBook::handle_due`].
    Poll,
    /// Run a pass for this actor, then call [`MonitorBook::handle_pass_done`].
    Drain(ActorId),
    /// Ask every running pass to stop: nothing new starts, attempts in flight finish within
    /// the shutdown grace, the rest is handed back. Each still ends with
    /// [`MonitorBook::handle_pass_done`].
    StopPasses,
    /// The monitor is done: no pass runs and no upkeep is waited for. `upkeep_left`: the
    /// store's upkeep still runs past the shutdown grace and finishes in the background (each
    /// of its deletes is a transaction of its own). Nothing follows.
    Stopped {
        /// The upkeep was still running when the grace ran out.
        upkeep_left: bool,
    },
}

/// Why the monitor woke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wake {
    /// Rows were enqueued for this actor in this process.
    Enqueued(ActorId),
    /// Something changed in the store, actor unknown (another process, LISTEN/NOTIFY,
    /// SQLite's `data_version`).
    StoreChanged,
}

/// Why the monitor stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MonitorStop {
    /// The monitor was asked to stop (or its handle dropped): it asks its passes to stop.
    Asked,
    /// Its outbox stops: the outbox's stop stops the passes, the monitor starts no new one.
    OutboxStops,
    /// The database file was removed or replaced: no new pass, ever; it asks the running
    /// ones to stop.
    DatabaseLost,
}

impl MonitorStop {
    fn asks_passes(self) -> bool {
        match self {
            MonitorStop::Asked | MonitorStop::DatabaseLost => true,
            MonitorStop::OutboxStops => false,
        }
    }
}

/// What [`MonitorBook::poll_timeout`] waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeoutReason {
    /// The safety-net poll.
    Poll,
    /// The earliest lane `not_before` the last poll saw.
    NotBefore,
    /// The store's next upkeep.
    Upkeep,
    /// The end of the shutdown grace, while the monitor waits for a running upkeep.
    GraceOver,
}

/// The monitor's state: no threads, no clock.
///
/// `now` is one clock that never steps back, in milliseconds (a [`Timestamp`]); deadlines
/// are absolute on it. The upkeep interval and the shutdown grace are lengths of time on it,
/// so a caller whose wall clock may step passes a monotonic count (the driver: the wall
/// time at the monitor's start plus its monotonic time since), and hands the store's lane
/// `not_before` in on that clock.
///
/// After every input (`handle_*`), drain [`MonitorBook::poll_action`] until `None`, then
/// wait for the next input or [`MonitorBook::poll_timeout`], whichever is first:
///
/// ```
/// use core::time::Duration;
/// use outbox_lanes_core::{ActorId, MonitorAction, MonitorBook, MonitorStop, Timestamp};
///
/// let mut book = MonitorBook::new(4, Duration::from_secs(1))
///     .with_upkeep_every(Duration::from_secs(600))
///     .with_shutdown_grace(Duration::from_secs(10));
/// let now = Timestamp::from_secs(100);
/// let mut done = Vec::new();
/// while let Some(action) = book.poll_action(now) {
///     match action {
///         MonitorAction::Upkeep => book.handle_upkeep_done(now),
///         MonitorAction::Poll => book.handle_due([ActorId::new("alice")], None, now),
///         MonitorAction::Drain(actor) => done.push(actor),
///         MonitorAction::StopPasses => {}
///         MonitorAction::Stopped { .. } => unreachable!("not asked to stop"),
///     }
/// }
/// assert_eq!(done, [ActorId::new("alice")]);
/// assert_eq!(book.poll_timeout(), Some(now + Duration::from_secs(1)));
/// book.handle_stop(MonitorStop::Asked, now);
/// assert_eq!(book.poll_action(now), Some(MonitorAction::StopPasses));
/// book.handle_pass_done(&done[0], false, now);
/// assert_eq!(
///     book.poll_action(now),
///     Some(MonitorAction::Stopped { upkeep_left: false })
/// );
/// ```
#[derive(Clone, Debug)]
pub struct MonitorBook {
    max_passes: usize,
    poll_interval: Duration,
    running: BTreeSet<ActorId>,
    /// Running passes that only wait on attempts in flight: not counted against
    /// `max_passes` (OL-13).
    waiting: BTreeSet<ActorId>,
    queued: BTreeSet<ActorId>,
    queue: VecDeque<ActorId>,
    /// Actors asked for while their pass ran: drained again when it ends.
    again: BTreeSet<ActorId>,
    poll_due: bool,
    poll_in_flight: bool,
    next_poll: Timestamp,
    next_not_before: Option<Timestamp>,
    /// `None`: no upkeep.
    upkeep_every: Option<Duration>,
    /// When the next upkeep is due, counted from the start of the last one.
    upkeep_at: Timestamp,
    upkeep_running: bool,
    grace: Duration,
    /// When the monitor began to stop: a running upkeep is waited for at most the grace
    /// from then.
    stop_began: Option<Timestamp>,
    /// The running passes were asked to stop, or are to be ([`MonitorAction::StopPasses`]).
    passes_asked: bool,
    stop_passes_due: bool,
    stopped: bool,
}

impl MonitorBook {
    /// At most `max_passes` passes at once; a safety-net poll every `poll_interval`. No
    /// upkeep and no shutdown grace until [`MonitorBook::with_upkeep_every`] and
    /// [`MonitorBook::with_shutdown_grace`].
    pub fn new(max_passes: usize, poll_interval: Duration) -> Self {
        MonitorBook {
            max_passes: max_passes.max(1),
            poll_interval,
            running: BTreeSet::new(),
            waiting: BTreeSet::new(),
            queued: BTreeSet::new(),
            queue: VecDeque::new(),
            again: BTreeSet::new(),
            poll_due: true,
            poll_in_flight: false,
            next_poll: Timestamp::EPOCH,
            next_not_before: None,
            upkeep_every: None,
            upkeep_at: Timestamp::EPOCH,
            upkeep_running: false,
            grace: Duration::ZERO,
            stop_began: None,
            passes_asked: false,
            stop_passes_due: false,
            stopped: false,
        }
    }

    /// The store's upkeep at the first [`MonitorBook::poll_action`], then `every` (at least
    /// a millisecond) from the start of the last one; never two at once, none while
    /// stopping.
    pub fn with_upkeep_every(mut self, every: Duration) -> Self {
        self.upkeep_every = Some(every.max(Duration::from_millis(1)));
        self
    }

    /// How long a stop waits for a running upkeep once no pass runs, counted from the stop.
    pub fn with_shutdown_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// A wake-up. Ignored while stopping.
    pub fn handle_wake(&mut self, wake: Wake, _now: Timestamp) {
        if self.stopping() {
            return;
        }
        match wake {
            Wake::Enqueued(actor) => self.want(actor),
            Wake::StoreChanged => self.poll_due = true,
        }
    }

    /// The store's answer to [`MonitorAction::Poll`]: actors with work admissible now, and
    /// the earliest future lane `not_before`.
    pub fn handle_due(
        &mut self,
        ready: impl IntoIterator<Item = ActorId>,
        next_not_before: Option<Timestamp>,
        now: Timestamp,
    ) {
        self.poll_in_flight = false;
        self.next_poll = now + self.poll_interval;
        self.next_not_before = next_not_before;
        for actor in ready {
            self.want(actor);
        }
    }

    /// The poll failed (the store is unreachable): try again at the next tick.
    pub fn handle_poll_failed(&mut self, now: Timestamp) {
        self.poll_in_flight = false;
        self.next_poll = now + self.poll_interval;
    }

    /// A pass ended. `more` is true when it yielded with work left (its time slice ran out,
    /// or its drain slot said look again): the actor goes to the back of the queue so busy
    /// actors cannot starve the others.
    pub fn handle_pass_done(&mut self, actor: &ActorId, more: bool, _now: Timestamp) {
        self.running.remove(actor);
        self.waiting.remove(actor);
        let again = self.again.remove(actor);
        if more || again {
            self.want(actor.clone());
        }
    }

    /// A running pass now only waits on attempts in flight (`true`: nothing startable,
    /// nothing to read — a hanging recipient, say), or has work again (`false`). Each
    /// waiting pass holds an attempt in flight, so the runtime's bound on deliveries in
    /// flight bounds them. A waiting
    /// pass does not count against `max_passes`, so actors waiting on hanging recipients
    /// keep no other actor from a pass (OL-13). The bound is on passes with work: one that
    /// has work again counts again, and no new pass starts until the count is below it.
    pub fn handle_pass_waiting(&mut self, actor: &ActorId, waiting: bool, _now: Timestamp) {
        if !self.running.contains(actor) {
            return;
        }
        if waiting {
            self.waiting.insert(actor.clone());
        } else {
            self.waiting.remove(actor);
        }
    }

    /// The store's upkeep ended (however it ended: a failed one is tried again at the next).
    pub fn handle_upkeep_done(&mut self, _now: Timestamp) {
        self.upkeep_running = false;
    }

    /// Stop: no upkeep, poll or pass starts from now on; the running passes are asked to stop
    /// unless the outbox stops them itself; once none runs, the monitor waits for a running
    /// upkeep at most the shutdown grace from the first stop, then ends
    /// ([`MonitorAction::Stopped`]). Any number of stops are one.
    pub fn handle_stop(&mut self, why: MonitorStop, now: Timestamp) {
        if self.stopped {
            return;
        }
        self.stop_began.get_or_insert(now);
        if why.asks_passes() && !self.passes_asked {
            self.passes_asked = true;
            self.stop_passes_due = true;
        }
    }

    fn want(&mut self, actor: ActorId) {
        if self.running.contains(&actor) {
            self.again.insert(actor);
        } else if self.queued.insert(actor.clone()) {
            self.queue.push_back(actor);
        }
    }

    /// The next thing to do now, if any. Call until `None`.
    pub fn poll_action(&mut self, now: Timestamp) -> Option<MonitorAction> {
        if self.stopped {
            return None;
        }
        if let Some(began) = self.stop_began {
            return self.poll_stop(began, now);
        }
        let upkeep_due = !self.upkeep_running && now >= self.upkeep_at;
        if let Some(every) = self.upkeep_every.filter(|_| upkeep_due) {
            self.upkeep_running = true;
            self.upkeep_at = now + every;
            return Some(MonitorAction::Upkeep);
        }
        let tick = now >= self.next_poll || self.next_not_before.is_some_and(|t| t <= now);
        // A wake-up polls only once the queue is empty: what a poll finds goes to the back of
        // the queue anyway, so polling while it still holds actors adds nothing but a scan of
        // every actor with work — per commit, since a relay's own acks wake it through
        // SQLite's `data_version` (quadratic in actors). The tick still polls on time, so a
        // wake-up waits at most `poll_interval` (or for the queue ahead of it).
        let woken = self.poll_due && self.queue.is_empty();
        if (woken || tick) && !self.poll_in_flight {
            self.poll_due = false;
            self.poll_in_flight = true;
            self.next_not_before = None;
            return Some(MonitorAction::Poll);
        }
        if self.running.len() - self.waiting.len() >= self.max_passes {
            return None;
        }
        let actor = self.queue.pop_front()?;
        self.queued.remove(&actor);
        self.running.insert(actor.clone());
        Some(MonitorAction::Drain(actor))
    }

    /// While stopping: ask the passes once, wait for them, then for a running upkeep within
    /// the grace.
    fn poll_stop(&mut self, began: Timestamp, now: Timestamp) -> Option<MonitorAction> {
        if self.stop_passes_due {
            self.stop_passes_due = false;
            if !self.running.is_empty() {
                return Some(MonitorAction::StopPasses);
            }
        }
        if !self.running.is_empty() || (self.upkeep_running && now < began + self.grace) {
            return None;
        }
        self.stopped = true;
        Some(MonitorAction::Stopped {
            upkeep_left: self.upkeep_running,
        })
    }

    /// When the monitor must look again even without an input: the next safety-net poll,
    /// the earliest lane `not_before`, the next upkeep or, while stopping, the end of the
    /// grace for a running upkeep, whichever is first. `None`: only an input can move it.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.timeout().map(|(at, _)| at)
    }

    /// [`MonitorBook::poll_timeout`] and what it waits for.
    pub fn timeout(&self) -> Option<(Timestamp, TimeoutReason)> {
        if self.stopped {
            return None;
        }
        if let Some(began) = self.stop_began {
            // Running passes wake the monitor when they end.
            return (self.running.is_empty() && self.upkeep_running)
                .then(|| (began + self.grace, TimeoutReason::GraceOver));
        }
        let poll = match self.next_not_before {
            _ if self.poll_in_flight => None,
            Some(t) if t <= self.next_poll => Some((t, TimeoutReason::NotBefore)),
            _ => Some((self.next_poll, TimeoutReason::Poll)),
        };
        let upkeep = match self.upkeep_every {
            Some(_) if !self.upkeep_running => Some((self.upkeep_at, TimeoutReason::Upkeep)),
            _ => None,
        };
        match (poll, upkeep) {
            (Some(p), Some(u)) => Some(if u.0 < p.0 { u } else { p }),
            (p, u) => p.or(u),
        }
    }

    /// Whether the monitor is stopping (or stopped): it starts nothing new.
    pub fn stopping(&self) -> bool {
        self.stop_began.is_some()
    }

    /// Passes running now, waiting ones included.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Actors waiting for a pass.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Running passes that only wait on attempts in flight.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use alloc::vec::Vec;

    fn drains(m: &mut MonitorBook, now: Timestamp) -> Vec<MonitorAction> {
        core::iter::from_fn(|| m.poll_action(now)).collect()
    }

    #[test]
    fn bounded_passes_and_requeue_while_running() {
        let t = Timestamp::from_secs(100);
        let mut m = MonitorBook::new(2, Duration::from_secs(1));
        assert_eq!(m.poll_action(t), Some(MonitorAction::Poll));
        let (a, b, c) = (ActorId::new("a"), ActorId::new("b"), ActorId::new("c"));
        m.handle_due(vec![a.clone(), b.clone(), c.clone()], None, t);
        assert_eq!(
            drains(&mut m, t),
            vec![
                MonitorAction::Drain(a.clone()),
                MonitorAction::Drain(b.clone())
            ]
        );
        // A wake for a running actor does not start a second pass of it.
        m.handle_wake(Wake::Enqueued(a.clone()), t);
        assert_eq!(drains(&mut m, t), vec![]);
        m.handle_pass_done(&a, false, t);
        // c was waiting; a comes back after it because it was asked for while running.
        assert_eq!(drains(&mut m, t), vec![MonitorAction::Drain(c.clone())]);
        m.handle_pass_done(&b, false, t);
        assert_eq!(drains(&mut m, t), vec![MonitorAction::Drain(a.clone())]);
        assert_eq!(m.running(), 2);
    }

    #[test]
    fn poll_tick_and_not_before() {
        let t = Timestamp::from_secs(100);
        let mut m = MonitorBook::new(4, Duration::from_secs(1));
        assert_eq!(m.poll_action(t), Some(MonitorAction::Poll));
        assert_eq!(m.poll_timeout(), None);
        m.handle_due(vec![], Some(t + Duration::from_millis(300)), t);
        assert_eq!(m.poll_timeout(), Some(t + Duration::from_millis(300)));
        assert_eq!(m.poll_action(t), None);
        assert_eq!(
            m.poll_action(t + Duration::from_millis(300)),
            Some(MonitorAction::Poll)
        );
        m.handle_due(vec![], None, t + Duration::from_millis(300));
        assert_eq!(m.poll_timeout(), Some(t + Duration::from_millis(1300)));
        m.handle_wake(Wake::StoreChanged, t);
        assert_eq!(
            m.poll_action(t + Duration::from_millis(301)),
            Some(MonitorAction::Poll)
        );
    }
    #[test]
    fn a_store_wake_up_polls_once_the_queue_is_empty_or_at_the_tick() {
        let t = Timestamp::from_secs(100);
        let mut m = MonitorBook::new(1, Duration::from_secs(1));
        assert_eq!(m.poll_action(t), Some(MonitorAction::Poll));
        let (a, b, c) = (ActorId::new("a"), ActorId::new("b"), ActorId::new("c"));
        m.handle_due(vec![a.clone(), b.clone(), c.clone()], None, t);
        assert_eq!(drains(&mut m, t), vec![MonitorAction::Drain(a.clone())]);
        // b and c are queued: a wake-up (a's own commits, through data_version) does not
        // scan every actor with work again.
        m.handle_wake(Wake::StoreChanged, t);
        assert_eq!(drains(&mut m, t), vec![]);
        m.handle_pass_done(&a, false, t);
        assert_eq!(drains(&mut m, t), vec![MonitorAction::Drain(b.clone())]);
        m.handle_pass_done(&b, false, t);
        // The queue is empty now: the wake-up's poll runs.
        assert_eq!(
            drains(&mut m, t),
            vec![MonitorAction::Drain(c.clone()), MonitorAction::Poll]
        );
        m.handle_due(vec![c.clone()], None, t);
        // While c runs and something is queued, the safety-net tick still polls on time.
        m.handle_due(vec![a.clone()], None, t);
        m.handle_wake(Wake::StoreChanged, t);
        assert_eq!(drains(&mut m, t), vec![]);
        assert_eq!(
            drains(&mut m, t + Duration::from_secs(1)),
            vec![MonitorAction::Poll]
        );
    }

    // Transcripts: for each scenario of the monitor's upkeep, stop and wake-ups, the exact
    // commands each step gives and when the book wakes next.

    use alloc::format;
    use alloc::string::String;

    const T0: Timestamp = Timestamp::from_secs(1_000);

    /// The book and its clock, in milliseconds after `T0`.
    struct Run {
        m: MonitorBook,
        now: Timestamp,
    }

    impl Run {
        /// Polls every `poll` ms, runs the upkeep every `upkeep` ms, waits `grace` ms for it
        /// on a stop; at most two passes.
        fn new(poll: u64, upkeep: u64, grace: u64) -> Run {
            let m = MonitorBook::new(2, Duration::from_millis(poll))
                .with_upkeep_every(Duration::from_millis(upkeep))
                .with_shutdown_grace(Duration::from_millis(grace));
            Run { m, now: T0 }
        }

        /// Moves the clock to `ms` after `T0` and drains the book's commands.
        fn at(&mut self, ms: u64) -> Vec<String> {
            self.now = T0 + Duration::from_millis(ms);
            self.step()
        }

        /// Drains the book's commands now.
        fn step(&mut self) -> Vec<String> {
            let now = self.now;
            core::iter::from_fn(|| self.m.poll_action(now))
                .map(|a| match a {
                    MonitorAction::Upkeep => "upkeep".into(),
                    MonitorAction::Poll => "poll".into(),
                    MonitorAction::Drain(actor) => format!("drain {actor}"),
                    MonitorAction::StopPasses => "stop passes".into(),
                    MonitorAction::Stopped { upkeep_left: false } => "stopped".into(),
                    MonitorAction::Stopped { upkeep_left: true } => "stopped, upkeep left".into(),
                })
                .collect()
        }

        /// When the book wakes next, in ms after `T0`, and why.
        fn wakes(&self) -> Option<(u64, TimeoutReason)> {
            let (at, why) = self.m.timeout()?;
            Some(((at - T0).as_millis() as u64, why))
        }

        fn due(&mut self, actors: &[&str]) {
            let ready = actors.iter().map(|a| ActorId::new(*a));
            self.m.handle_due(ready, None, self.now);
        }

        fn done(&mut self, actor: &str, more: bool) {
            self.m
                .handle_pass_done(&ActorId::new(actor), more, self.now);
        }

        fn upkeep_done(&mut self) {
            self.m.handle_upkeep_done(self.now);
        }

        fn stop(&mut self, why: MonitorStop) {
            self.m.handle_stop(why, self.now);
        }

        fn store_changed(&mut self) {
            self.m.handle_wake(Wake::StoreChanged, self.now);
        }
    }

    #[test]
    fn transcript_upkeep_at_start_then_every_interval() {
        let mut r = Run::new(60_000, 10_000, 5_000);
        assert_eq!(r.step(), ["upkeep", "poll"]);
        r.due(&[]);
        // The upkeep runs: the next safety-net poll is what the book waits for.
        assert_eq!(r.wakes(), Some((60_000, TimeoutReason::Poll)));
        assert_eq!(r.at(300), Vec::<String>::new());
        r.upkeep_done();
        assert_eq!(r.wakes(), Some((10_000, TimeoutReason::Upkeep)));
        assert_eq!(r.at(9_999), Vec::<String>::new());
        // Counted from the start of the last one, not its end.
        assert_eq!(r.at(10_000), ["upkeep"]);
        r.upkeep_done();
        assert_eq!(r.wakes(), Some((20_000, TimeoutReason::Upkeep)));
        assert_eq!(r.at(20_000), ["upkeep"]);
        r.upkeep_done();
        assert_eq!(r.wakes(), Some((30_000, TimeoutReason::Upkeep)));
        // Both overdue: the upkeep first, then the poll.
        assert_eq!(r.at(60_000), ["upkeep", "poll"]);
    }

    #[test]
    fn transcript_upkeep_never_overlaps_itself() {
        let mut r = Run::new(1_000, 1_000, 5_000);
        assert_eq!(r.step(), ["upkeep", "poll"]);
        r.due(&[]);
        // A long upkeep: the next one, due at 1 s, waits for its end; the polls go on.
        assert_eq!(r.at(1_000), ["poll"]);
        r.due(&[]);
        assert_eq!(r.wakes(), Some((2_000, TimeoutReason::Poll)));
        assert_eq!(r.at(2_000), ["poll"]);
        r.due(&[]);
        assert_eq!(r.at(2_500), Vec::<String>::new());
        r.upkeep_done();
        // Overdue: it starts at once, and the next is due an interval from now.
        assert_eq!(r.step(), ["upkeep"]);
        r.upkeep_done();
        assert_eq!(r.wakes(), Some((3_000, TimeoutReason::Poll)));
        assert_eq!(r.at(3_000), ["poll"]);
        r.due(&[]);
        assert_eq!(r.wakes(), Some((3_500, TimeoutReason::Upkeep)));
        assert_eq!(r.at(3_500), ["upkeep"]);
    }

    #[test]
    fn transcript_stop_with_passes_running_asks_them_and_waits_for_their_ends() {
        let mut r = Run::new(1_000, 600_000, 10_000);
        assert_eq!(r.step(), ["upkeep", "poll"]);
        r.upkeep_done();
        r.due(&["a", "b", "c"]);
        assert_eq!(r.step(), ["drain a", "drain b"]);
        r.stop(MonitorStop::Asked);
        assert_eq!(r.at(100), ["stop passes"]);
        // Only the passes' ends move it now: no timeout, no poll, no upkeep, no new pass.
        assert_eq!(r.wakes(), None);
        r.store_changed();
        assert_eq!(r.at(700_000), Vec::<String>::new());
        r.done("a", true);
        assert_eq!(r.step(), Vec::<String>::new());
        // However long they take: each pass keeps its own grace for its attempts.
        assert_eq!(r.at(900_000), Vec::<String>::new());
        r.done("b", false);
        assert_eq!(r.step(), ["stopped"]);
        assert_eq!(r.step(), Vec::<String>::new());
        assert_eq!(r.wakes(), None);
    }

    #[test]
    fn transcript_stop_waits_for_a_running_upkeep_within_the_grace() {
        let mut r = Run::new(1_000, 600_000, 10_000);
        assert_eq!(r.step(), ["upkeep", "poll"]);
        r.due(&["a"]);
        assert_eq!(r.step(), ["drain a"]);
        r.now = T0 + Duration::from_millis(1_000);
        r.stop(MonitorStop::Asked);
        assert_eq!(r.step(), ["stop passes"]);
        assert_eq!(r.wakes(), None);
        r.done("a", false);
        // No pass runs, the upkeep does: the grace counts from the stop (1 s).
        assert_eq!(r.at(3_000), Vec::<String>::new());
        assert_eq!(r.wakes(), Some((11_000, TimeoutReason::GraceOver)));
        assert_eq!(r.at(5_000), Vec::<String>::new());
        r.upkeep_done();
        assert_eq!(r.step(), ["stopped"]);
    }

    #[test]
    fn transcript_grace_over_leaves_the_upkeep_in_the_background() {
        let mut r = Run::new(1_000, 600_000, 10_000);
        assert_eq!(r.step(), ["upkeep", "poll"]);
        r.due(&[]);
        r.now = T0 + Duration::from_millis(2_000);
        r.stop(MonitorStop::Asked);
        assert_eq!(r.step(), Vec::<String>::new());
        assert_eq!(r.wakes(), Some((12_000, TimeoutReason::GraceOver)));
        assert_eq!(r.at(11_999), Vec::<String>::new());
        assert_eq!(r.at(12_000), ["stopped, upkeep left"]);
        // Its end comes later and changes nothing.
        r.upkeep_done();
        assert_eq!(r.at(13_000), Vec::<String>::new());
    }

    #[test]
    fn transcript_stop_while_idle_ends_at_once() {
        let mut r = Run::new(1_000, 600_000, 10_000);
        assert_eq!(r.step(), ["upkeep", "poll"]);
        r.upkeep_done();
        r.due(&[]);
        r.stop(MonitorStop::Asked);
        assert_eq!(r.at(10), ["stopped"]);
        assert_eq!(r.wakes(), None);
        // Nothing moves it again.
        r.stop(MonitorStop::Asked);
        r.store_changed();
        assert_eq!(r.at(2_000_000), Vec::<String>::new());
    }

    #[test]
    fn transcript_the_outbox_stops_its_passes_itself_a_later_ask_asks_them_once() {
        let mut r = Run::new(1_000, 600_000, 10_000);
        assert_eq!(r.step(), ["upkeep", "poll"]);
        r.due(&["a"]);
        assert_eq!(r.step(), ["drain a"]);
        r.now = T0 + Duration::from_millis(1_000);
        r.stop(MonitorStop::OutboxStops);
        assert_eq!(r.step(), Vec::<String>::new());
        r.stop(MonitorStop::OutboxStops);
        assert_eq!(r.at(4_000), Vec::<String>::new());
        r.stop(MonitorStop::Asked);
        assert_eq!(r.step(), ["stop passes"]);
        r.stop(MonitorStop::Asked);
        r.stop(MonitorStop::DatabaseLost);
        assert_eq!(r.step(), Vec::<String>::new());
        r.done("a", false);
        // The grace counts from the first stop (1 s), not the ask (4 s).
        assert_eq!(r.wakes(), Some((11_000, TimeoutReason::GraceOver)));
        assert_eq!(r.at(11_000), ["stopped, upkeep left"]);
    }

    #[test]
    fn transcript_database_lost_during_a_poll() {
        let mut r = Run::new(1_000, 600_000, 10_000);
        assert_eq!(r.step(), ["upkeep", "poll"]);
        r.upkeep_done();
        r.due(&["a"]);
        assert_eq!(r.step(), ["drain a"]);
        assert_eq!(r.at(1_000), ["poll"]);
        // The poll found the database file replaced: it never answers.
        r.stop(MonitorStop::DatabaseLost);
        assert_eq!(r.step(), ["stop passes"]);
        r.done("a", true);
        assert_eq!(r.step(), ["stopped"]);
    }

    #[test]
    fn transcript_wake_ups_merge() {
        let mut r = Run::new(1_000, 600_000, 10_000);
        assert_eq!(r.step(), ["upkeep", "poll"]);
        r.upkeep_done();
        // Wake-ups while a poll is in flight are one poll after its answer.
        r.store_changed();
        r.store_changed();
        assert_eq!(r.step(), Vec::<String>::new());
        r.due(&[]);
        assert_eq!(r.step(), ["poll"]);
        r.due(&["a"]);
        assert_eq!(r.step(), ["drain a"]);
        // Three wake-ups before the book looks are one poll.
        r.store_changed();
        r.store_changed();
        r.store_changed();
        assert_eq!(r.at(10), ["poll"]);
        r.due(&["a"]);
        assert_eq!(r.step(), Vec::<String>::new());
        // a was asked for while its pass ran: one more pass when it ends, not two.
        r.done("a", true);
        assert_eq!(r.step(), ["drain a"]);
        r.done("a", false);
        assert_eq!(r.step(), Vec::<String>::new());
        assert_eq!(r.wakes(), Some((1_010, TimeoutReason::Poll)));
    }

    #[test]
    fn transcript_the_earliest_deadline_wins() {
        let mut r = Run::new(1_000, 1_500, 10_000);
        assert_eq!(r.step(), ["upkeep", "poll"]);
        r.m.handle_due(Vec::new(), Some(T0 + Duration::from_millis(400)), r.now);
        assert_eq!(r.wakes(), Some((400, TimeoutReason::NotBefore)));
        assert_eq!(r.at(400), ["poll"]);
        // While a poll is in flight only the upkeep could wake it; it runs.
        assert_eq!(r.wakes(), None);
        r.due(&[]);
        r.upkeep_done();
        assert_eq!(r.wakes(), Some((1_400, TimeoutReason::Poll)));
        assert_eq!(r.at(1_400), ["poll"]);
        r.due(&[]);
        assert_eq!(r.wakes(), Some((1_500, TimeoutReason::Upkeep)));
        assert_eq!(r.at(1_500), ["upkeep"]);
    }
}
