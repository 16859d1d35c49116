//! What the driver's unit tests share: an inner executor that holds the jobs it is given
//! until the test finishes them, and jobs to give it (`hosts.rs`, `origins.rs`); a clock the
//! test moves by hand ([`ManualClock`]) and threads that remember their names
//! ([`NamedThreads`]), to run the ack writer, the gate and an outbox's opening in virtual time
//! on threads the test sees.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};

use outbox_lanes_core::{ActorId, Config, LaneKey, Outcome, Scheduler, UnitId};
use outbox_lanes_store::Payload;

use crate::http::AttemptResult;
use crate::job::{Completions, Done, Executor, Job};

/// Sends each completion down a channel.
struct Chan(Mutex<mpsc::Sender<Done>>);

impl Completions for Chan {
    fn complete(&self, done: Done) {
        let _ = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(done);
    }
}

/// Holds the jobs it is given until the test finishes them.
#[derive(Default)]
pub(crate) struct Held {
    jobs: Mutex<Vec<Job>>,
    /// Refuses every job (a stopped runtime does).
    pub(crate) stopped: AtomicBool,
    /// Takes every job and drops it unrun at once (a runtime that is gone does).
    pub(crate) dropping: AtomicBool,
}

impl Executor for Held {
    fn execute(&self, job: Job) -> Result<(), Job> {
        if self.stopped.load(Ordering::SeqCst) {
            return Err(job);
        }
        if self.dropping.load(Ordering::SeqCst) {
            drop(job);
            return Ok(());
        }
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(job);
        Ok(())
    }
}

impl Held {
    /// The units running, in the order they were started.
    pub(crate) fn running(&self) -> Vec<u64> {
        let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        jobs.iter().map(|j| j.unit.0).collect()
    }

    /// Takes `unit`'s job out; panics if it is not running.
    pub(crate) fn take(&self, unit: u64) -> Job {
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        let k = jobs.iter().position(|j| j.unit.0 == unit).expect("running");
        jobs.remove(k)
    }

    /// Finishes `unit`'s job with `result`.
    pub(crate) fn finish(&self, unit: u64, result: AttemptResult) {
        self.take(unit).finish(result);
    }

    /// Finishes `unit`'s job as delivered (200).
    pub(crate) fn deliver(&self, unit: u64) {
        self.finish(unit, answered(200));
    }
}

/// An answer with `status`: delivered below 300, transient above.
pub(crate) fn answered(status: u16) -> AttemptResult {
    AttemptResult {
        outcome: if status < 300 {
            Outcome::Delivered
        } else {
            Outcome::Transient { retry_after: None }
        },
        status: Some(status),
        error: None,
        body: None,
    }
}

/// A job for `unit` to `recipient` whose completion goes to `reply`.
pub(crate) fn job(unit: u64, recipient: &str, reply: &mpsc::Sender<Done>) -> Job {
    // Any lane id will do: the executors never look at it.
    let lane = Scheduler::new(Config::default(), 0)
        .lane(&LaneKey::new("https://lane.example/", None).expect("url"));
    Job::new(
        ActorId::new("alice"),
        Arc::from("0123abcd"),
        UnitId(unit),
        lane,
        Arc::new(crate::request::Destination::parse(recipient)),
        1,
        Arc::new(Payload {
            row_id: format!("r{unit}"),
            content_type: "text/plain".into(),
            body: Vec::new(),
            headers: Vec::new(),
        }),
        crate::clock::Clock::instant(&crate::clock::SystemClock),
        Arc::new(Chan(Mutex::new(reply.clone()))),
        Arc::new(AtomicBool::new(true)),
    )
}

/// A clock the test moves by hand: its wall clock starts where it is told, its monotonic
/// clock where the system's was when it was made; both move only with [`ManualClock::advance`].
#[derive(Debug)]
pub(crate) struct ManualClock {
    millis: std::sync::atomic::AtomicU64,
    base: std::time::Instant,
    start: u64,
}

impl ManualClock {
    /// A clock at `at`.
    pub(crate) fn at(at: outbox_lanes_core::Timestamp) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            millis: std::sync::atomic::AtomicU64::new(at.as_millis()),
            base: crate::clock::Clock::instant(&crate::clock::SystemClock),
            start: at.as_millis(),
        })
    }

    /// Moves it `d` on.
    pub(crate) fn advance(&self, d: std::time::Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.millis.fetch_add(ms, Ordering::SeqCst);
    }
}

impl crate::clock::Clock for ManualClock {
    fn now(&self) -> outbox_lanes_core::Timestamp {
        outbox_lanes_core::Timestamp::from_millis(self.millis.load(Ordering::SeqCst))
    }

    fn instant(&self) -> std::time::Instant {
        let moved = self
            .millis
            .load(Ordering::SeqCst)
            .saturating_sub(self.start);
        self.base + std::time::Duration::from_millis(moved)
    }
}

/// Starts threads as the system does, and remembers their names: a runtime's threads, to
/// show which threads an outbox starts and that each goes through them.
#[derive(Debug, Default)]
pub(crate) struct NamedThreads(Mutex<Vec<String>>);

impl NamedThreads {
    /// The names of the threads started so far, in order.
    pub(crate) fn names(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl outbox_lanes_store::SpawnThread for NamedThreads {
    fn spawn_thread(
        &self,
        name: &str,
        f: Box<dyn FnOnce() + Send + 'static>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(name.to_owned());
        outbox_lanes_store::StdThreads.spawn_thread(name, f)
    }
}
