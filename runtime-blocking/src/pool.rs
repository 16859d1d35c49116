//! The blocking runtime's delivery workers: threads started as attempts need them, up to a
//! cap, that end after a minute without work.
//!
//! An outbox of the blocking runtime may have [`OutboxConfig::concurrency`] attempts in flight
//! (256 by default), each holding a thread for its HTTP exchange. Starting all of them at open
//! gave an idle service with three recipients some 260 threads. Here a job goes to a worker
//! waiting for one if there is any, and otherwise starts a new worker while fewer than the cap
//! run; a worker that waited [`IDLE_TIMEOUT`] for a job ends, except the last [`WARM`], which
//! stay for the next attempt. The process's in-flight budget
//! ([`FairShares`](outbox_lanes_driver::FairShares), in front of this executor) already keeps
//! the jobs at most `concurrency`, so the cap is a backstop.
//!
//! A shutdown does not wait for the workers: each one busy with an attempt finishes its HTTP
//! exchange (at most the HTTP timeout) and ends; its pass ended already, and recorded the
//! attempt as interrupted (OL-14). Jobs still queued are dropped unrun (their units were
//! handed back).
//!
//! Why our own rather than a crate: `rusty_pool` grows and shrinks the same way, but its
//! `Worker::start` panics when a thread cannot be started (`expect("could not spawn thread")`),
//! which would turn a process's thread limit into a panic inside a pass — here the job waits
//! for a worker that runs, or, with none, is dropped and reports `NotSent`; it also brings
//! `crossbeam-channel` and `num_cpus`. `blocking` (smol's) is one pool per process, capped by
//! an environment variable shared with every other user, whose idle threads end after a fixed
//! 500 ms (a new thread per attempt for a recipient written to every second), and brings an
//! async task layer to a runtime without one. `threadpool` starts every thread at creation.
//! What is needed is a queue under a mutex and a condition variable, below.
//!
//! [`OutboxConfig::concurrency`]: outbox_lanes_driver::OutboxConfig::concurrency

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use outbox_lanes_driver::{Executor, Job, OutboxError};
use tracing::warn;

use crate::http::HttpClient;

/// How long a worker waits for a job before it ends (unless it is one of the [`WARM`]).
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Workers kept when idle, once started: the next attempt needs no new thread.
pub(crate) const WARM: usize = 2;

/// The blocking runtime's executor: worker threads started as jobs need them, at most `max`
/// at once; idle ones end after a minute, except two kept for the next attempt. A shutdown
/// drops the jobs not started and does not wait for the HTTP exchanges in progress.
pub struct ThreadPool {
    workers: Workers<Job>,
}

impl fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.workers.fmt(f)
    }
}

impl ThreadPool {
    /// A pool delivering with `http` on at most `max` threads; none is started until a job
    /// comes.
    pub fn new(http: HttpClient, max: usize) -> ThreadPool {
        let run = move |job: Job| {
            // Its pass ended and handed the unit back: dropping it sends nothing.
            if job.abandoned() {
                return;
            }
            let result = http.deliver_job(&job, SystemTime::now());
            job.finish(result);
        };
        ThreadPool {
            workers: Workers::new(max, IDLE_TIMEOUT, run),
        }
    }

    /// A pool of at most `threads` workers delivering with `http`.
    ///
    /// # Errors
    /// None any more: no thread starts here.
    #[deprecated(
        since = "0.1.0",
        note = "use `ThreadPool::new`: workers start as jobs need them, so starting cannot fail"
    )]
    pub fn start(http: HttpClient, threads: usize) -> Result<ThreadPool, OutboxError> {
        Ok(ThreadPool::new(http, threads))
    }

    /// The workers running now, busy or waiting for a job.
    pub fn threads(&self) -> usize {
        self.workers.threads()
    }

    /// Stops taking jobs and drops those still queued (their passes handed their units back);
    /// returns at once. Workers busy with an attempt end when its HTTP exchange does (within
    /// the HTTP timeout); nobody waits for its answer.
    pub fn shutdown(&self) {
        self.workers.shutdown();
    }
}

impl Executor for ThreadPool {
    fn execute(&self, job: Job) -> Result<(), Job> {
        self.workers.execute(job)
    }

    fn shutdown(&self) {
        ThreadPool::shutdown(self);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Threads that run the tasks given to them (see the [module docs](self)).
pub(crate) struct Workers<T> {
    shared: Arc<Shared<T>>,
}

type Run<T> = Box<dyn Fn(T) + Send + Sync>;

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Signalled when a task is queued for a waiting worker, and at shutdown.
    work: Condvar,
    run: Run<T>,
    max: usize,
    idle_timeout: Duration,
}

struct State<T> {
    queue: VecDeque<T>,
    /// Workers running, busy or waiting.
    threads: usize,
    /// Workers waiting for a task (each takes one from the queue when it wakes).
    idle: usize,
    closed: bool,
    /// Numbers the workers' thread names.
    started: u64,
}

impl<T> fmt::Debug for Workers<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("ThreadPool")
            .field("max", &self.shared.max)
            .field("threads", &st.threads)
            .field("idle", &st.idle)
            .field("queued", &st.queue.len())
            .finish_non_exhaustive()
    }
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Send + 'static> Workers<T> {
    /// At most `max` workers running `run` on each task; idle ones past [`WARM`] end after
    /// `idle_timeout`.
    pub(crate) fn new(
        max: usize,
        idle_timeout: Duration,
        run: impl Fn(T) + Send + Sync + 'static,
    ) -> Workers<T> {
        Workers {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    threads: 0,
                    idle: 0,
                    closed: false,
                    started: 0,
                }),
                work: Condvar::new(),
                run: Box::new(run),
                max: max.max(1),
                idle_timeout,
            }),
        }
    }

    pub(crate) fn threads(&self) -> usize {
        self.shared.lock().threads
    }

    /// Queues `task` for a waiting worker, or starts one while fewer than `max` run.
    ///
    /// # Errors
    /// The pool is shut down: `task` comes back unrun.
    pub(crate) fn execute(&self, task: T) -> Result<(), T> {
        let number = {
            let mut st = self.shared.lock();
            if st.closed {
                return Err(task);
            }
            st.queue.push_back(task);
            if st.idle > 0 {
                self.shared.work.notify_one();
            }
            // Every waiting worker takes one task: start one more only for a task none takes.
            if st.queue.len() <= st.idle || st.threads >= self.shared.max {
                return Ok(());
            }
            st.threads += 1;
            st.started += 1;
            st.started
        };
        let shared = Arc::clone(&self.shared);
        let started = std::thread::Builder::new()
            .name(format!("outbox-lanes-worker-{number}"))
            .spawn(move || worker(&shared));
        if let Err(e) = started {
            warn!(error = %e, "cannot start a delivery worker thread; attempts wait for the workers running");
            let orphans = {
                let mut st = self.shared.lock();
                st.threads -= 1;
                // With no worker at all, nothing would ever run them: dropped, a delivery job
                // reports NotSent (never sent, not counted) and its pass retries it later.
                if st.threads == 0 {
                    std::mem::take(&mut st.queue)
                } else {
                    VecDeque::new()
                }
            };
            drop(orphans);
        }
        Ok(())
    }

    /// Stops taking tasks and drops those still queued; returns at once (busy workers end
    /// when their task does).
    pub(crate) fn shutdown(&self) {
        let queued = {
            let mut st = self.shared.lock();
            st.closed = true;
            std::mem::take(&mut st.queue)
        };
        self.shared.work.notify_all();
        // Outside the lock: a dropped delivery job reports to its pass.
        drop(queued);
    }
}

/// A worker: runs tasks until the pool closes, or until it waited the idle timeout while
/// more than [`WARM`] workers run.
fn worker<T>(shared: &Shared<T>) {
    let _counted = Counted(shared);
    while let Some(task) = next_task(shared) {
        (shared.run)(task);
    }
}

/// The next task, waiting for one; `None` when this worker ends (it is then no longer
/// counted).
fn next_task<T>(shared: &Shared<T>) -> Option<T> {
    let mut st = shared.lock();
    loop {
        if let Some(task) = st.queue.pop_front() {
            return Some(task);
        }
        if st.closed {
            break;
        }
        st.idle += 1;
        let (guard, waited) = shared
            .work
            .wait_timeout(st, shared.idle_timeout)
            .unwrap_or_else(PoisonError::into_inner);
        st = guard;
        st.idle -= 1;
        if waited.timed_out() && st.queue.is_empty() && st.threads > WARM {
            break;
        }
    }
    // Under the lock that decided it, so a task queued next starts a worker if it needs one.
    st.threads -= 1;
    None
}

/// Uncounts a worker whose task panicked (one that ends normally was uncounted by
/// [`next_task`]); a delivery job dropped by the unwinding reports `NotSent`.
struct Counted<'a, T>(&'a Shared<T>);

impl<T> Drop for Counted<'_, T> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.lock().threads -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    use super::*;

    type Task = Box<dyn FnOnce() + Send>;

    fn pool(max: usize, idle: Duration) -> Workers<Task> {
        Workers::new(max, idle, |task: Task| task())
    }

    /// Waits (bounded) until `pred` holds.
    fn eventually(mut pred: impl FnMut() -> bool) -> bool {
        for _ in 0..1000 {
            if pred() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn no_worker_starts_before_a_task_and_tasks_beyond_the_cap_wait_their_turn() {
        let workers = pool(3, IDLE_TIMEOUT);
        assert_eq!(workers.threads(), 0, "nothing at creation");
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..5 {
            let (released, done) = (Arc::clone(&released), Arc::clone(&done));
            workers
                .execute(Box::new(move || {
                    let _ = released.lock().expect("lock").recv();
                    done.fetch_add(1, Ordering::SeqCst);
                }))
                .unwrap_or_else(|_| panic!("the pool is open"));
        }
        assert_eq!(workers.threads(), 3, "five tasks, three workers at most");
        for _ in 0..5 {
            release.send(()).expect("a task waits");
        }
        assert!(
            eventually(|| done.load(Ordering::SeqCst) == 5),
            "all five ran"
        );
        assert_eq!(
            workers.threads(),
            3,
            "the workers wait for more, within the idle timeout"
        );
    }

    #[test]
    fn idle_workers_end_after_the_idle_timeout_but_the_warm_ones() {
        let workers = pool(8, Duration::from_millis(20));
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        for _ in 0..6 {
            let released = Arc::clone(&released);
            workers
                .execute(Box::new(move || {
                    let _ = released.lock().expect("lock").recv();
                }))
                .unwrap_or_else(|_| panic!("the pool is open"));
        }
        assert_eq!(workers.threads(), 6, "one worker per task waiting");
        for _ in 0..6 {
            release.send(()).expect("a task waits");
        }
        assert!(
            eventually(|| workers.threads() == WARM),
            "idle, all but {WARM} ended: {}",
            workers.threads()
        );
        // A new task goes to a warm worker: no thread starts.
        let (tx, rx) = mpsc::channel();
        workers
            .execute(Box::new(move || tx.send(()).expect("the test waits")))
            .unwrap_or_else(|_| panic!("the pool is open"));
        rx.recv().expect("ran");
        assert_eq!(workers.threads(), WARM);
    }

    #[test]
    fn a_shutdown_drops_queued_tasks_and_does_not_wait_for_a_busy_worker() {
        struct Dropped(Arc<AtomicUsize>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let workers = pool(1, IDLE_TIMEOUT);
        let (release, released) = mpsc::channel::<()>();
        let (started_tx, started) = mpsc::channel::<()>();
        workers
            .execute(Box::new(move || {
                started_tx.send(()).expect("the test waits");
                let _ = released.recv();
            }))
            .unwrap_or_else(|_| panic!("the pool is open"));
        started.recv().expect("the first task runs");
        let (dropped, ran) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (d, r) = (Dropped(Arc::clone(&dropped)), Arc::clone(&ran));
        workers
            .execute(Box::new(move || {
                let _d = d;
                r.fetch_add(1, Ordering::SeqCst);
            }))
            .unwrap_or_else(|_| panic!("the pool is open"));
        // Returns with the first task still running.
        workers.shutdown();
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "the queued task was dropped"
        );
        assert_eq!(ran.load(Ordering::SeqCst), 0, "and never ran");
        assert_eq!(workers.threads(), 1, "the busy worker still runs its task");
        assert!(
            workers.execute(Box::new(|| ())).is_err(),
            "a closed pool takes nothing"
        );
        release.send(()).expect("the first task waits");
        assert!(
            eventually(|| workers.threads() == 0),
            "it ended after its task"
        );
    }
}
