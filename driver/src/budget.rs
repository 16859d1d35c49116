//! Fair shares of the in-flight budget between actors: the executor of
//! [`BudgetBook`](outbox_lanes_core::budget::BudgetBook).
//!
//! [`FairShares`] wraps the runtime's executor, innermost: an attempt of an actor above its
//! share is **parked** in that actor's queue, holding no worker thread or task, and handed to
//! the inner executor when the book gives it a place (an attempt ended). So one customer with
//! a thousand slow endpoints cannot take every place from another, whose rows start at once
//! from the reserve. From the pass's point of view a parked attempt is in flight: its lane
//! stays busy, so per-lane order (OL-1) is untouched. It sits behind the origin gate, so an
//! attempt its host holds back never takes a place here.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use outbox_lanes_core::ActorId;
use outbox_lanes_core::budget::BudgetBook;

use crate::http::not_sent;
use crate::job::{Executor, Job};
use crate::ticket::{BudgetPermit, PermitSink};

/// How the in-flight budget is shared between actors ([`crate::OutboxConfig::reserve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reserve {
    /// A tenth of the budget, kept once a second actor was seen (a process serving one
    /// actor lends it the whole budget).
    #[default]
    Auto,
    /// This many places, kept from the start.
    Places(usize),
}

/// The in-flight budget of the process, shared fairly between actors (see the module docs).
pub struct FairShares {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Arc<dyn Executor>,
    book: Mutex<BudgetBook<Job>>,
}

impl std::fmt::Debug for FairShares {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let book = self.shared.lock();
        f.debug_struct("FairShares")
            .field("capacity", &book.capacity())
            .field("in_flight", &book.in_flight())
            .finish_non_exhaustive()
    }
}

impl FairShares {
    /// A budget of `capacity` attempts in flight through `inner`, keeping `reserve`.
    pub fn new(inner: Arc<dyn Executor>, capacity: usize, reserve: Reserve) -> FairShares {
        let book = match reserve {
            Reserve::Auto => BudgetBook::new(
                capacity,
                outbox_lanes_core::budget::default_reserve(capacity),
            ),
            Reserve::Places(n) => BudgetBook::new(capacity, n).keep_reserve(),
        };
        FairShares {
            shared: Arc::new(Shared {
                inner,
                book: Mutex::new(book),
            }),
        }
    }

    /// Attempts parked (waiting for a place) right now.
    pub fn parked(&self) -> usize {
        self.shared.lock().waiting()
    }

    /// Places `actor` holds now.
    pub fn running(&self, actor: &ActorId) -> usize {
        self.shared.lock().running(actor)
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, BudgetBook<Job>> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Executor for FairShares {
    fn execute(&self, job: Job) -> Result<(), Job> {
        let actor = job.actor.clone();
        let Some(mut job) = self.shared.lock().handle_job(&actor, job) else {
            return Ok(());
        };
        job.budget = Some(BudgetPermit::new(
            Arc::clone(&self.shared) as Arc<dyn PermitSink<ActorId>>,
            actor,
        ));
        // Refused (the inner executor stopped): the job comes back with its permit, whose
        // drop frees the place.
        self.shared.inner.execute(job)
    }

    fn shutdown(&self) {
        // Parked attempts never started: dropped, they cost no attempt, and their passes
        // (stopping by now) hand the units back. First, so that attempts finishing during the
        // inner shutdown do not start them.
        let parked = self.shared.lock().take_waiting();
        drop(parked);
        self.shared.inner.shutdown();
    }
}

/// Places freed and not handed out yet: (the budget, the actor that held the place).
type Freed = Option<Vec<(Arc<Shared>, ActorId)>>;

thread_local! {
    /// Places freed on this thread while it is already handing places out (a job refused
    /// by a stopped inner executor frees its place from inside the loop): queued here and
    /// handled by the outer loop, so a long queue cannot nest one release per job.
    static FREED: core::cell::RefCell<Freed> = const { core::cell::RefCell::new(None) };
}

impl PermitSink<ActorId> for Shared {
    fn release(self: Arc<Self>, actor: ActorId) {
        let outer = FREED.with(|f| {
            let mut f = f.borrow_mut();
            match f.as_mut() {
                Some(queue) => {
                    queue.push((Arc::clone(&self), actor.clone()));
                    false
                }
                None => {
                    *f = Some(Vec::new());
                    true
                }
            }
        });
        if !outer {
            return;
        }
        let mut next = Some((self, actor));
        while let Some((shared, actor)) = next {
            shared.lock().handle_end(&actor);
            shared.hand_out();
            next = FREED.with(|f| f.borrow_mut().as_mut().and_then(Vec::pop));
        }
        FREED.with(|f| *f.borrow_mut() = None);
    }
}

impl Shared {
    /// Runs every parked job the book lets go now. A job whose pass ended meanwhile, or that
    /// the inner executor refuses (it stopped), gives its place back and is finished as not
    /// sent: it costs no attempt and loses nothing.
    fn hand_out(self: &Arc<Self>) {
        loop {
            let Some((actor, mut job)) = self.lock().poll_go() else {
                return;
            };
            if job.abandoned() {
                self.lock().handle_end(&actor);
                continue;
            }
            job.budget = Some(BudgetPermit::new(
                Arc::clone(self) as Arc<dyn PermitSink<ActorId>>,
                actor.clone(),
            ));
            if let Err(mut job) = self.inner.execute(job) {
                if let Some(mut p) = job.budget.take() {
                    p.disarm();
                }
                self.lock().handle_end(&actor);
                job.finish(not_sent("delivery workers stopped"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::testing::{Held, answered, job};

    fn of(actor: &str, unit: u64, reply: &mpsc::Sender<crate::job::Done>) -> Job {
        let mut j = job(unit, "https://a.example/inbox", reply);
        j.actor = ActorId::new(actor);
        j
    }

    #[test]
    fn a_flooders_jobs_park_and_a_newcomer_runs_at_once() {
        let held = Arc::new(Held::default());
        let fair = FairShares::new(
            Arc::clone(&held) as Arc<dyn Executor>,
            10,
            Reserve::Places(2),
        );
        let (tx, rx) = mpsc::channel();
        let flood = |h: &Held| h.running().iter().filter(|&&u| u < 100).count();
        for u in 0..20 {
            fair.execute(of("flood", u, &tx)).unwrap();
        }
        // Its share counts the actor that comes next; past it, it leaves the reserve free.
        assert_eq!(flood(&held), 8);
        assert_eq!(fair.parked(), 12);
        fair.execute(of("quiet", 100, &tx)).unwrap();
        assert!(held.running().contains(&100), "the newcomer waited");
        // 9 in flight: a place the flooder frees is the reserve again, and stays free.
        let first = held.running()[0];
        held.deliver(first);
        assert_eq!(flood(&held), 7);
        assert_eq!(fair.running(&ActorId::new("flood")), 7);
        // Three free: one goes to the flooder's next parked job.
        let next = held.running()[0];
        held.deliver(next);
        assert_eq!(flood(&held), 7);
        assert_eq!(fair.parked(), 11);
        // The newcomer is done: the flooder's share is back, less the reserve.
        held.deliver(100);
        assert_eq!(flood(&held), 8);
        assert_eq!(rx.try_iter().count(), 3);
        // A job whose inner executor stopped gives its place back and reports not sent.
        held.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let next = held.running()[0];
        held.finish(next, answered(500));
        assert_eq!(fair.running(&ActorId::new("flood")), 7);
        // So does every parked job after it: each is refused in turn.
        let done: Vec<_> = rx.try_iter().collect();
        assert_eq!(done.len(), 11, "the finished job and the ten refused");
        assert!(
            done[1..]
                .iter()
                .all(|d| d.result.error.as_deref().unwrap_or("").contains("stopped"))
        );
        assert_eq!(fair.parked(), 0);
        assert_eq!(fair.running(&ActorId::new("flood")), 7);
    }

    #[test]
    fn a_shutdown_drops_the_parked_jobs_as_not_sent() {
        let held = Arc::new(Held::default());
        let fair = FairShares::new(Arc::clone(&held) as Arc<dyn Executor>, 2, Reserve::Auto);
        let (tx, rx) = mpsc::channel();
        for u in 0..5 {
            fair.execute(of("x", u, &tx)).unwrap();
        }
        assert_eq!(held.running(), [0, 1]);
        fair.shutdown();
        assert_eq!(fair.parked(), 0);
        let done: Vec<_> = rx.try_iter().map(|d| d.unit.0).collect();
        assert_eq!(done, [2, 3, 4]);
        // The running ones end later; their places free nothing more.
        held.deliver(0);
        held.deliver(1);
        assert_eq!(fair.running(&ActorId::new("x")), 0);
    }
}
