//! Deliveries as tasks: the pass driver's [`Executor`] on an async [`Runtime`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use outbox_lanes_blocking::HttpClient;
use outbox_lanes_blocking::http::AttemptResult;
use outbox_lanes_blocking::pass::{self, Executor, Job};
use outbox_lanes_store::{Store, StoreError};
use tokio::sync::Semaphore;

use crate::runtime::{Runtime, unblock};

/// How a task delivers.
#[derive(Clone, Debug)]
pub(crate) enum Transport {
    /// reqwest on the tokio runtime; the payload is read on the blocking pool.
    #[cfg(feature = "tokio")]
    Async(crate::http::AsyncHttpClient),
    /// The blocking ureq client, payload and POST together on the runtime's blocking pool
    /// (async-std, smol, or any [`Runtime`]).
    Blocking(HttpClient),
}

/// Jobs started and not yet finished, for a shutdown that waits for them.
#[derive(Debug, Default)]
struct Running {
    count: Mutex<usize>,
    idle: Condvar,
}

/// Decrements [`Running`] when the task ends, however it ends (a panic, a dropped task).
struct RunningGuard(Arc<Running>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        let mut n = self.0.count.lock().unwrap_or_else(PoisonError::into_inner);
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.0.idle.notify_all();
        }
    }
}

/// Owns a job until it is finished; a job dropped unfinished (its task panicked, or the
/// runtime dropped it while shutting down) is reported as a transient failure, so the pass
/// does not wait for it until its time slice ends.
struct FinishOnDrop(Option<Job>);

impl FinishOnDrop {
    fn job(&self) -> &Job {
        self.0.as_ref().expect("the job is only taken by finish")
    }

    fn finish(mut self, result: AttemptResult) {
        if let Some(job) = self.0.take() {
            job.finish(result);
        }
    }
}

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        if let Some(job) = self.0.take() {
            job.finish(AttemptResult {
                outcome: outbox_lanes_core::Outcome::Transient { retry_after: None },
                status: None,
                error: Some("other: the delivery task ended without an answer".into()),
            });
        }
    }
}

/// Spawns one task per job, at most `concurrency` attempts at once.
pub(crate) struct TaskExecutor {
    pub(crate) rt: Arc<dyn Runtime>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) transport: Transport,
    pub(crate) permits: Arc<Semaphore>,
    /// How long a shutdown waits for attempts in flight (the HTTP timeout and a margin).
    pub(crate) grace: Duration,
    open: AtomicBool,
    running: Arc<Running>,
}

impl std::fmt::Debug for TaskExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskExecutor")
            .field("rt", &self.rt)
            .field("transport", &self.transport)
            .finish_non_exhaustive()
    }
}

impl TaskExecutor {
    pub(crate) fn new(
        rt: Arc<dyn Runtime>,
        store: Arc<dyn Store>,
        transport: Transport,
        concurrency: usize,
        grace: Duration,
    ) -> TaskExecutor {
        TaskExecutor {
            rt,
            store,
            transport,
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            grace,
            open: AtomicBool::new(true),
            running: Arc::default(),
        }
    }
}

impl Executor for TaskExecutor {
    fn execute(&self, job: Job) -> Result<(), Job> {
        if !self.open.load(Ordering::SeqCst) {
            return Err(job);
        }
        *self
            .running
            .count
            .lock()
            .unwrap_or_else(PoisonError::into_inner) += 1;
        let guard = RunningGuard(Arc::clone(&self.running));
        let rt = Arc::clone(&self.rt);
        // Weak: a task never owns the store on an executor thread, where dropping the last
        // reference to a Postgres client would panic; it is upgraded on the blocking pool.
        let store = Arc::downgrade(&self.store);
        let transport = self.transport.clone();
        let permits = Arc::clone(&self.permits);
        let job = FinishOnDrop(Some(job));
        self.rt.spawn(Box::pin(async move {
            let _guard = guard;
            // The semaphore is never closed; should it be, the job reports a failure on drop.
            let Ok(_permit) = permits.acquire_owned().await else {
                return;
            };
            if job.job().abandoned() {
                // Its pass ended and handed the unit back: nobody waits for an answer.
                return;
            }
            deliver(&*rt, store, transport, job).await;
        }));
        Ok(())
    }

    fn shutdown(&self) {
        self.open.store(false, Ordering::SeqCst);
        let deadline = Instant::now() + self.grace;
        let mut n = self
            .running
            .count
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    in_flight = *n,
                    "delivery tasks still running at shutdown; their units are delivered again later"
                );
                return;
            }
            n = self
                .running
                .idle
                .wait_timeout(n, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// One attempt; reports to the pass through [`Job::finish`] (a pass that is gone ignores it).
async fn deliver(
    rt: &dyn Runtime,
    store: Weak<dyn Store>,
    transport: Transport,
    job: FinishOnDrop,
) {
    match transport {
        #[cfg(feature = "tokio")]
        Transport::Async(http) => {
            let unit = job.job().unit;
            let payload = unblock(rt, move || upgrade(&store)?.payload(unit)).await;
            let result = match payload {
                Some(Ok(p)) => {
                    let j = job.job();
                    let d = outbox_lanes_blocking::http::Delivery {
                        unit: j.unit,
                        recipient: &j.recipient,
                        body: &p.body,
                        content_type: &p.content_type,
                        attempt: j.attempt,
                    };
                    http.deliver(&d, std::time::SystemTime::now()).await
                }
                Some(Err(e)) => pass::payload_failed(&e),
                None => pass::payload_failed(&StoreError::Database(
                    "the runtime is shutting down".into(),
                )),
            };
            job.finish(result);
        }
        Transport::Blocking(http) => {
            // If the runtime drops this unrun, the job reports a failure as it is dropped.
            let _ = unblock(rt, move || {
                let result = match upgrade(&store) {
                    Ok(store) => pass::attempt(&*store, &http, job.job()),
                    Err(e) => pass::payload_failed(&e),
                };
                job.finish(result);
            })
            .await;
        }
    }
}

/// The store, while the outbox that owns it is alive.
fn upgrade(store: &Weak<dyn Store>) -> Result<Arc<dyn Store>, StoreError> {
    store
        .upgrade()
        .ok_or_else(|| StoreError::Database("the outbox was dropped".into()))
}
