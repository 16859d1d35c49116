//! The monitor's bookkeeping (OL-13): which actors to drain after a wake-up or a poll tick,
//! with a bound on concurrent passes.

use alloc::collections::{BTreeSet, VecDeque};
use core::time::Duration;

use crate::ids::ActorId;
use crate::time::Timestamp;

/// What the monitor should do next.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum MonitorAction {
    /// Ask the store which actors have work admissible now (and the earliest `not_before`),
    /// then call [`MonitorBook::handle_due`].
    Poll,
    /// Run a pass for this actor, then call [`MonitorBook::handle_pass_done`].
    Drain(ActorId),
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

/// The monitor's state: no threads, no clock.
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
}

impl MonitorBook {
    /// At most `max_passes` passes at once; a safety-net poll every `poll_interval`.
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
        }
    }

    /// A wake-up.
    pub fn handle_wake(&mut self, wake: Wake, _now: Timestamp) {
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

    fn want(&mut self, actor: ActorId) {
        if self.running.contains(&actor) {
            self.again.insert(actor);
        } else if self.queued.insert(actor.clone()) {
            self.queue.push_back(actor);
        }
    }

    /// The next thing to do now, if any. Call until `None`.
    pub fn poll_action(&mut self, now: Timestamp) -> Option<MonitorAction> {
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

    /// When the monitor must look again even without a wake-up: the next safety-net poll or
    /// the earliest lane `not_before`, whichever is first.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        if self.poll_in_flight {
            return None;
        }
        Some(match self.next_not_before {
            Some(t) => t.min(self.next_poll),
            None => self.next_poll,
        })
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
}
