//! Per-host concurrency caps: at most N attempts in flight to one host from this process,
//! whichever actors and passes they come from.
//!
//! [`HostCaps`] wraps any [`Executor`]. An attempt to a host at its cap is **parked** in that
//! host's queue, holding no worker thread or task, and handed to the inner executor when an
//! attempt to the same host finishes; attempts to other hosts go straight through. So a slow
//! or huge host cannot take every worker, and a small server is not hit by more than N
//! requests at once from here. From the pass's point of view a parked attempt is in flight:
//! its lane stays busy, so per-lane order (OL-1) is untouched; but it is told that the
//! attempt waits ([`Completions::host_wait`](crate::Completions::host_wait)), so the attempt takes no place of the pass's
//! in-flight bound until it goes, and other hosts' lanes start meanwhile.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use crate::http::{AttemptResult, not_sent};
use crate::job::{Executor, Job};
use crate::ticket::{HostPermit, PermitSink};

/// Caps attempts in flight per host: the canonical `host:port` of the recipient URL (one
/// host, one spelling, default port included), as the pass parsed it for the lane
/// ([`Destination::host_port`](crate::request::Destination::host_port)). A recipient that
/// does not parse is its own key (its attempt fails as `invalid_recipient`).
pub struct HostCaps {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Arc<dyn Executor>,
    cap: usize,
    hosts: Mutex<HashMap<String, Host>>,
}

#[derive(Default)]
struct Host {
    running: usize,
    parked: VecDeque<Job>,
}

impl core::fmt::Debug for HostCaps {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("HostCaps")
            .field("cap", &self.shared.cap)
            .finish_non_exhaustive()
    }
}

impl HostCaps {
    /// At most `cap` (at least 1) attempts in flight per host through `inner`.
    pub fn new(inner: Arc<dyn Executor>, cap: usize) -> HostCaps {
        HostCaps {
            shared: Arc::new(Shared {
                inner,
                cap: cap.max(1),
                hosts: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Attempts parked (waiting for their host's cap) right now, for tests and metrics.
    pub fn parked(&self) -> usize {
        lock(&self.shared.hosts)
            .values()
            .map(|h| h.parked.len())
            .sum()
    }
}

fn lock(m: &Mutex<HashMap<String, Host>>) -> std::sync::MutexGuard<'_, HashMap<String, Host>> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a parked job reports when the inner executor stopped before it could run: not
/// sent, so retried without counting an attempt. It loses nothing.
fn stopped() -> AttemptResult {
    not_sent("delivery workers stopped")
}

impl Executor for HostCaps {
    fn execute(&self, mut job: Job) -> Result<(), Job> {
        let host = job.recipient.host_port().to_owned();
        {
            let mut hosts = lock(&self.shared.hosts);
            let h = hosts.entry(host.clone()).or_default();
            if h.running >= self.shared.cap {
                // It takes no place of its pass's in-flight bound while it is parked.
                job.report_host_wait(true);
                h.parked.push_back(job);
                return Ok(());
            }
            h.running += 1;
        }
        job.permit = Some(HostPermit::new(
            Arc::clone(&self.shared) as Arc<dyn PermitSink<String>>,
            host,
        ));
        self.shared.inner.execute(job).map_err(|mut job| {
            // Unrun: give the place back (the drop of the permit does, and starts the next
            // parked job if the inner executor still takes jobs).
            job.permit = None;
            job
        })
    }

    fn shutdown(&self) {
        // Attempts still parked never started: dropped, they cost no attempt, and their
        // passes (stopping by now) hand the units back (nothing is lost). First, so that the
        // attempts finishing during the inner shutdown do not start them.
        let parked: Vec<Job> = lock(&self.shared.hosts)
            .values_mut()
            .flat_map(|h| h.parked.drain(..))
            .collect();
        drop(parked);
        self.shared.inner.shutdown();
    }
}

/// Places freed and not passed on yet: (the caps, the host).
type Freed = Option<Vec<(Arc<Shared>, String)>>;

thread_local! {
    /// Places freed on this thread while it is already passing one on: an inner executor
    /// that drops a job at once (its runtime is gone) frees the place again from inside
    /// `execute`; queued here and handled by the outer loop, so a long queue of parked jobs
    /// cannot nest one drop per job on the stack.
    static FREED: core::cell::RefCell<Freed> = const { core::cell::RefCell::new(None) };
}

impl PermitSink<String> for Shared {
    fn release(self: Arc<Self>, host: String) {
        let freed = (self, host);
        let outer = FREED.with(|f| {
            let mut f = f.borrow_mut();
            match f.as_mut() {
                Some(queue) => {
                    queue.push(freed.clone());
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
        let mut next = Some(freed);
        while let Some((shared, host)) = next {
            pass_on(&shared, &host);
            next = FREED.with(|f| f.borrow_mut().as_mut().and_then(Vec::pop));
        }
        FREED.with(|f| *f.borrow_mut() = None);
    }
}

/// A place under `host`'s cap is free: it goes to the next parked job of the host, if any; a
/// job the inner executor refuses (it stopped) is finished as not sent and the
/// place passes on again.
fn pass_on(shared: &Arc<Shared>, host: &str) {
    loop {
        let next = {
            let mut hosts = lock(&shared.hosts);
            let Some(h) = hosts.get_mut(host) else {
                return;
            };
            match h.parked.pop_front() {
                Some(job) => job,
                None => {
                    h.running = h.running.saturating_sub(1);
                    if h.running == 0 {
                        hosts.remove(host);
                    }
                    return;
                }
            }
        };
        let mut job = next;
        if job.abandoned() {
            // Its pass ended and handed the unit back: not sent, and the place passes on.
            continue;
        }
        job.report_host_wait(false);
        job.permit = Some(HostPermit::new(
            Arc::clone(shared) as Arc<dyn PermitSink<String>>,
            host.to_string(),
        ));
        match shared.inner.execute(job) {
            Ok(()) => return,
            Err(mut job) => {
                // Keep the place for the loop: disarm this job's permit before finishing.
                if let Some(mut p) = job.permit.take() {
                    p.disarm();
                }
                job.finish(stopped());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use outbox_lanes_core::Outcome;

    use super::*;
    use crate::testing::{Held, job};

    #[test]
    fn parks_past_the_cap_and_starts_in_order_as_places_free() {
        let held = Arc::new(Held::default());
        let caps = HostCaps::new(Arc::clone(&held) as Arc<dyn Executor>, 2);
        let (tx, rx) = mpsc::channel();
        for (u, to) in [
            (1, "https://a.example/1"),
            (2, "https://a.example/2"),
            (3, "https://a.example/3"),
            (4, "https://b.example/1"),
            (5, "https://a.example/4"),
        ] {
            assert!(caps.execute(job(u, to, &tx)).is_ok());
        }
        // a.example is at its cap of 2: 3 and 5 wait; b.example is not held up.
        assert_eq!(held.running(), [1, 2, 4]);
        assert_eq!(caps.parked(), 2);
        held.deliver(2);
        assert_eq!(held.running(), [1, 4, 3]);
        held.deliver(4);
        assert_eq!(held.running(), [1, 3], "b's place frees nothing of a's");
        held.deliver(1);
        held.deliver(3);
        assert_eq!(held.running(), [5]);
        held.deliver(5);
        assert_eq!(caps.parked(), 0);
        assert!(lock(&caps.shared.hosts).is_empty(), "no host left behind");
        let done: Vec<u64> = rx.try_iter().map(|d| d.unit.0).collect();
        assert_eq!(done, [2, 4, 1, 3, 5]);
    }

    #[test]
    fn a_stopped_executor_reports_parked_jobs_not_sent_and_frees_the_place() {
        let held = Arc::new(Held::default());
        let caps = HostCaps::new(Arc::clone(&held) as Arc<dyn Executor>, 1);
        let (tx, rx) = mpsc::channel();
        for u in 1..=3 {
            assert!(caps.execute(job(u, "https://a.example/i", &tx)).is_ok());
        }
        assert_eq!(held.running(), [1]);
        held.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        held.deliver(1);
        let got: Vec<(u64, Outcome)> = rx
            .try_iter()
            .map(|d| (d.unit.0, d.result.outcome))
            .collect();
        assert_eq!(
            got,
            [
                (1, Outcome::Delivered),
                (2, Outcome::NotSent),
                (3, Outcome::NotSent),
            ]
        );
        assert!(lock(&caps.shared.hosts).is_empty());
        // A job refused outright comes back to the caller, and its place is not kept.
        let refused = caps.execute(job(4, "https://a.example/i", &tx));
        assert!(refused.is_err());
        assert!(lock(&caps.shared.hosts).is_empty());
    }

    #[test]
    fn a_long_queue_drained_by_an_executor_that_drops_jobs_does_not_nest() {
        const PARKED: u64 = 200_000;
        let held = Arc::new(Held::default());
        let caps = HostCaps::new(Arc::clone(&held) as Arc<dyn Executor>, 1);
        let (tx, rx) = mpsc::channel();
        for u in 0..=PARKED {
            assert!(caps.execute(job(u, "https://a.example/i", &tx)).is_ok());
        }
        assert_eq!(caps.parked(), PARKED as usize);
        held.dropping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Each parked job is dropped inside `execute`, which frees the place again: handled
        // one after another, not one drop inside the next (that would overflow the stack).
        held.deliver(0);
        assert_eq!(caps.parked(), 0);
        assert!(lock(&caps.shared.hosts).is_empty());
        let (mut delivered, mut not_sent) = (0, 0);
        for d in rx.try_iter() {
            match d.result.outcome {
                Outcome::Delivered => delivered += 1,
                Outcome::NotSent => not_sent += 1,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(delivered, 1, "only the job that ran was sent");
        assert_eq!(not_sent, PARKED, "every dropped job told its pass");
    }
}
