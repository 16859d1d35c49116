//! Deliveries as futures: the pass driver's [`Executor`] on an async [`Runtime`]. With the
//! async client, the first few attempts a pass has in flight run on the pass's own task
//! ([`spawn_delivery`](outbox_lanes_driver::engine::spawn_delivery)): one lane's next
//! request is written from the task that read the last response. The others, and every
//! attempt of the blocking client, are tasks of their own.
//!
//! A shutdown abandons the deliveries still running (their passes ended at the shutdown
//! grace and recorded them as interrupted): each delivery future returns at its next poll,
//! dropping its request (hyper closes the connection), instead of waiting for the answer up to
//! the HTTP timeout. A blocking client's exchange cannot be cut: its future returns, and the
//! exchange ends on the blocking pool within the HTTP timeout, its answer unread.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use outbox_lanes_driver::{Executor, Job};
use tokio::sync::{Notify, Semaphore};

use outbox_lanes_driver::engine::Runtime;
#[cfg(feature = "blocking-http")]
use outbox_lanes_driver::engine::unblock;

/// How a delivery is made.
#[derive(Clone, Debug)]
pub(crate) enum Transport {
    /// hyper-util's client on the tokio runtime.
    #[cfg(feature = "tokio")]
    Async(crate::http::AsyncHttpClient),
    /// The blocking ureq client on the runtime's blocking pool (async-std, smol, or any
    /// [`Runtime`]).
    #[cfg(feature = "blocking-http")]
    Blocking(outbox_lanes_driver::ureq_client::HttpClient),
}

/// Jobs started and not yet finished, for a shutdown that waits for them.
#[derive(Debug, Default)]
struct Running {
    count: Mutex<Count>,
    idle: Condvar,
}

#[derive(Debug, Default)]
struct Count {
    jobs: usize,
    /// A shutdown waits on `idle`: only then does the last job to end signal it (a signal
    /// is a system call, and one lane ends its only job at every delivery).
    awaited: bool,
}

/// Decrements [`Running`] when the delivery ends, however it ends (a panic, a dropped future).
struct RunningGuard(Arc<Running>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        let mut n = self.0.count.lock().unwrap_or_else(PoisonError::into_inner);
        n.jobs = n.jobs.saturating_sub(1);
        if n.jobs == 0 && n.awaited {
            self.0.idle.notify_all();
        }
    }
}

/// How long a shutdown waits for the deliveries it abandoned to let go of their jobs (each
/// returns at its next poll, which the abandonment wakes).
const LET_GO: Duration = Duration::from_secs(1);

/// Tells the deliveries in flight to return: set once, at shutdown.
#[derive(Debug, Default)]
struct Abandon {
    now: AtomicBool,
    notify: Notify,
}

impl Abandon {
    /// Runs `delivery` until it completes or the deliveries are abandoned.
    async fn unless_abandoned(&self, delivery: impl Future<Output = ()>) {
        let abandoned = self.notify.notified();
        let mut abandoned = pin!(abandoned);
        // Registered before the flag is read: an abandonment in between is not missed.
        abandoned.as_mut().enable();
        if self.now.load(Ordering::SeqCst) {
            return;
        }
        let mut delivery = pin!(delivery);
        poll_fn(|cx| {
            if abandoned.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            delivery.as_mut().poll(cx)
        })
        .await;
    }

    fn abandon(&self) {
        self.now.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }
}

/// Runs each job as a future, on its pass's task or a task of its own
/// ([`spawn_delivery`](outbox_lanes_driver::engine::spawn_delivery)), at most `concurrency`
/// attempts at once.
pub(crate) struct TaskExecutor {
    pub(crate) rt: Arc<dyn Runtime>,
    pub(crate) transport: Transport,
    pub(crate) permits: Arc<Semaphore>,
    open: AtomicBool,
    running: Arc<Running>,
    abandon: Arc<Abandon>,
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
        transport: Transport,
        concurrency: usize,
    ) -> TaskExecutor {
        TaskExecutor {
            rt,
            transport,
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            open: AtomicBool::new(true),
            running: Arc::default(),
            abandon: Arc::default(),
        }
    }
}

impl Executor for TaskExecutor {
    fn execute(&self, job: Job) -> Result<(), Job> {
        if !self.open.load(Ordering::SeqCst) {
            return Err(job);
        }
        self.running
            .count
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .jobs += 1;
        let guard = RunningGuard(Arc::clone(&self.running));
        #[cfg(feature = "blocking-http")]
        let rt = Arc::clone(&self.rt);
        let transport = self.transport.clone();
        let permits = Arc::clone(&self.permits);
        let abandon = Arc::clone(&self.abandon);
        let delivery = async move {
            // The semaphore is never closed; should it be, the job reports NotSent on drop.
            let Ok(_permit) = permits.acquire_owned().await else {
                return;
            };
            if job.abandoned() {
                // Its pass ended and handed the unit back: nobody waits for an answer.
                return;
            }
            match transport {
                #[cfg(feature = "tokio")]
                Transport::Async(http) => {
                    let result = http.deliver_job(&job, std::time::SystemTime::now()).await;
                    job.finish(result);
                }
                #[cfg(feature = "blocking-http")]
                Transport::Blocking(http) => {
                    // If the runtime drops this unrun, the job reports NotSent as it is dropped.
                    let _ = unblock(&*rt, move || {
                        let result = http.deliver_job(&job, std::time::SystemTime::now());
                        job.finish(result);
                    })
                    .await;
                }
            }
        };
        let run = Box::pin(async move {
            let _guard = guard;
            // Abandoned: the job is dropped here (its pass ended: nobody waits for it).
            abandon.unless_abandoned(delivery).await;
        });
        match self.transport {
            // On the pass's own task if it has room (see `spawn_delivery`), else a task of
            // its own.
            #[cfg(feature = "tokio")]
            Transport::Async(_) => outbox_lanes_driver::engine::spawn_delivery(&*self.rt, run),
            // Never on the pass's task: on a runtime that blocks in place the request would
            // block the pass, and elsewhere its completion comes from the blocking pool anyway.
            #[cfg(feature = "blocking-http")]
            Transport::Blocking(_) => self.rt.spawn(run),
        }
        Ok(())
    }

    fn shutdown(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.abandon.abandon();
        let deadline = Instant::now() + LET_GO;
        let mut n = self
            .running
            .count
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        n.awaited = true;
        while n.jobs > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    in_flight = n.jobs,
                    "deliveries abandoned at shutdown still hold their jobs; they let go when the runtime polls them"
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
