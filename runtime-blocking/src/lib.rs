//! The blocking runtime of outbox-lanes: std threads, ureq and a [`Store`].
//!
//! [`Outbox`] enqueues rows and drains an actor's outbox: one pass per actor at a time (in
//! this process through the core's drain-slot registry, across processes through the
//! store's fenced slot), each recipient's units delivered in enqueue order with one in
//! flight, distinct recipients concurrently on a bounded pool of worker threads.
//! [`Monitor`] drains every actor with work, woken on enqueue and by a safety-net poll.
//!
//! ```no_run
//! use std::sync::Arc;
//! use outbox_lanes_blocking::{Outbox, OutboxConfig};
//! use outbox_lanes_store::{NewRow, SqliteStore, SqliteOptions};
//!
//! let store = Arc::new(SqliteStore::open("outbox.db", SqliteOptions::default())?);
//! let outbox = Outbox::open(store, OutboxConfig::default())?;
//! outbox.enqueue("alice", &[NewRow {
//!     id: "activity-1".into(),
//!     body: br#"{"type":"Create"}"#.to_vec(),
//!     content_type: "application/activity+json".into(),
//!     recipients: vec!["https://b.example/inbox".into()],
//!     dedup_key: None,
//!     ordering_key: None,
//!     joined: false,
//! }])?;
//! outbox.drain("alice")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod hosts;
pub mod http;
pub mod pass;
pub mod sign;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use outbox_lanes_core::policy::AddressPolicy;
use outbox_lanes_core::{
    Acquire, ActorId, ActorResolver, DeadReason, DrainSlots, IdentityResolver, MonitorAction,
    MonitorBook, Release, Timestamp, UnitId, UnknownActor, Wake,
};
pub use outbox_lanes_store as store;
use outbox_lanes_store::{
    AckWriter, AckWriterOptions, ActorStatus, DeadLetter, EnqueueError, Enqueued, LaneStatus,
    NewRow, Store, StoreError,
};
use tracing::{debug, info, warn};

pub use crate::hosts::HostCaps;
pub use crate::http::{HttpClient, HttpConfig};
pub use crate::pass::PassReport;
use crate::pass::{Executor, Job, Pass, PassError};
pub use crate::sign::Signer;

/// Configuration of an [`Outbox`].
#[derive(Clone, Debug)]
pub struct OutboxConfig {
    /// The scheduler's configuration (window, retries, backoff).
    pub scheduler: outbox_lanes_core::Config,
    /// HTTP delivery.
    pub http: HttpConfig,
    /// Delivery worker threads: attempts in flight at once in this process.
    pub concurrency: usize,
    /// At most this many attempts in flight at once to one host (`host:port`), from this
    /// process, whichever actors they come from; `None`: no cap but `concurrency`. Attempts
    /// past the cap wait in the host's queue without holding a worker, so other hosts are not
    /// held up ([`HostCaps`]).
    pub per_host: Option<usize>,
    /// The drain slot's lease; renewed every third of it while a pass runs.
    pub lease: Duration,
    /// A pass yields after this long so busy actors cannot starve the others (OL-13).
    pub time_slice: Duration,
    /// On shutdown or at the end of a time slice, how long attempts in flight may finish
    /// before they are handed back.
    pub shutdown_grace: Duration,
    /// The monitor's safety-net poll.
    pub poll_interval: Duration,
    /// Passes the monitor runs at once.
    pub max_passes: usize,
    /// The name this process holds drain slots under (default: host-pid-random).
    pub holder: Option<String>,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            scheduler: outbox_lanes_core::Config::default(),
            http: HttpConfig::default(),
            concurrency: 32,
            per_host: None,
            lease: Duration::from_secs(30),
            time_slice: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
            max_passes: 8,
            holder: None,
        }
    }
}

impl OutboxConfig {
    /// Allows loopback destinations (tests and demos on 127.0.0.1).
    pub fn allow_loopback(mut self) -> Self {
        self.http.addresses = AddressPolicy::allow_loopback_only();
        self
    }
}

/// A recipient was served.
#[derive(Clone, Debug)]
pub struct Delivered {
    /// The actor.
    pub actor: ActorId,
    /// The unit (its idempotency key).
    pub unit: UnitId,
    /// The row it came from.
    pub row_id: String,
    /// The recipient URL.
    pub recipient: String,
}

/// A recipient's unit became a dead letter.
#[derive(Clone, Debug)]
pub struct DeadLettered {
    /// The actor.
    pub actor: ActorId,
    /// The unit.
    pub unit: UnitId,
    /// The row it came from.
    pub row_id: String,
    /// The recipient URL.
    pub recipient: String,
    /// Why.
    pub reason: DeadReason,
    /// The last HTTP status, if any.
    pub status: Option<u16>,
    /// The last error, if any.
    pub error: Option<String>,
}

/// An attempt finished, whatever its outcome (for metrics: latency, queue wait, outcomes).
#[derive(Clone, Debug)]
pub struct Attempted {
    /// The actor.
    pub actor: ActorId,
    /// The unit.
    pub unit: UnitId,
    /// The recipient URL.
    pub recipient: String,
    /// What the attempt came to.
    pub outcome: outbox_lanes_core::Outcome,
    /// The HTTP status, if a response came back.
    pub status: Option<u16>,
    /// From handing the attempt to a worker to its result (payload read and HTTP exchange).
    pub latency: Duration,
    /// From the row's enqueue to the start of this attempt.
    pub queued: Duration,
}

type Hook<T> = Box<dyn Fn(&T) + Send + Sync>;

/// Delivery hooks for the embedding service; called on the pass's thread, keep them short.
#[derive(Default)]
pub struct Hooks {
    /// Called for every recipient served.
    pub delivered: Option<Hook<Delivered>>,
    /// Called for every dead letter.
    pub dead_lettered: Option<Hook<DeadLettered>>,
    /// Called for every finished attempt, before the outcome is acted on.
    pub attempted: Option<Hook<Attempted>>,
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("delivered", &self.delivered.is_some())
            .field("dead_lettered", &self.dead_lettered.is_some())
            .field("attempted", &self.attempted.is_some())
            .finish()
    }
}

/// Why an [`Outbox`] operation failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum OutboxError {
    /// The actor id names no known actor.
    UnknownActor(UnknownActor),
    /// The store failed.
    Store(StoreError),
    /// Enqueue refused the batch; nothing was written.
    Enqueue(EnqueueError),
    /// A thread could not be started.
    Spawn(std::io::Error),
    /// The HTTP client could not be built (a bad proxy URL or user agent).
    Http(String),
    /// The outbox is shutting down.
    ShuttingDown,
    /// The drain was cancelled (its caller went away); every unfinished unit was handed
    /// back and the slot released.
    Cancelled,
}

impl fmt::Display for OutboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutboxError::UnknownActor(e) => e.fmt(f),
            OutboxError::Store(e) => write!(f, "store: {e}"),
            OutboxError::Enqueue(e) => write!(f, "enqueue refused: {e}"),
            OutboxError::Spawn(e) => write!(f, "cannot start a thread: {e}"),
            OutboxError::Http(e) => write!(f, "HTTP client: {e}"),
            OutboxError::ShuttingDown => f.write_str("the outbox is shutting down"),
            OutboxError::Cancelled => f.write_str("the drain was cancelled"),
        }
    }
}

impl std::error::Error for OutboxError {}

impl From<StoreError> for OutboxError {
    fn from(e: StoreError) -> Self {
        OutboxError::Store(e)
    }
}

/// Stops or cancels a running drain from another thread or task.
#[derive(Debug, Default)]
pub struct DrainControl {
    /// Graceful: nothing new starts, attempts in flight finish, the rest is handed back.
    pub stop: AtomicBool,
    /// At once: everything is handed back and the slot released; attempts in flight are
    /// abandoned.
    pub cancel: AtomicBool,
    /// Return when a pass reaches its time slice with work left (the monitor does, to let
    /// other actors run: OL-13). Otherwise the drain goes on with another pass at once, so
    /// a direct drain returns only when nothing is admissible.
    pub yield_at_slice: AtomicBool,
}

/// What a drain request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainOutcome {
    /// This call ran the passes; their totals.
    Ran(PassReport),
    /// A pass of this actor was already running (here or in another process); it was told
    /// to look once more, and this call returned at once (OL-12).
    Merged,
}

struct Inner {
    store: Arc<dyn Store>,
    config: OutboxConfig,
    resolver: Box<dyn ActorResolver + Send + Sync>,
    hooks: Hooks,
    slots: Mutex<DrainSlots>,
    acks: AckWriter,
    executor: Arc<dyn Executor>,
    holder: String,
    stopping: AtomicBool,
}

/// An actor outbox over a [`Store`], delivering over HTTP from a pool of worker threads.
///
/// Cloning is cheap; every clone shares the same workers and drain slots.
#[derive(Clone)]
pub struct Outbox {
    inner: Arc<Inner>,
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("holder", &self.inner.holder)
            .finish_non_exhaustive()
    }
}

/// Builder for an [`Outbox`] with hooks, a signer or an actor resolver.
pub struct OutboxBuilder {
    store: Arc<dyn Store>,
    config: OutboxConfig,
    resolver: Box<dyn ActorResolver + Send + Sync>,
    hooks: Hooks,
    signer: Option<Arc<dyn Signer>>,
    executor: Option<Arc<dyn Executor>>,
}

impl OutboxBuilder {
    /// Runs deliveries on `executor` instead of the built-in pool of worker threads (an
    /// async runtime runs them as tasks). The HTTP settings and signer then belong to it.
    pub fn executor(mut self, executor: Arc<dyn Executor>) -> Self {
        self.executor = Some(executor);
        self
    }

    /// Maps actor aliases to canonical ids (two spellings of one actor share one slot).
    pub fn resolver(mut self, r: impl ActorResolver + Send + Sync + 'static) -> Self {
        self.resolver = Box::new(r);
        self
    }

    /// Delivery hooks.
    pub fn hooks(mut self, hooks: Hooks) -> Self {
        self.hooks = hooks;
        self
    }

    /// Signs every attempt.
    pub fn signer(mut self, signer: Arc<dyn Signer>) -> Self {
        self.signer = Some(signer);
        self
    }

    /// Starts the worker pool and the ack writer.
    ///
    /// # Errors
    /// A thread could not be started, or the HTTP client could not be built.
    pub fn open(self) -> Result<Outbox, OutboxError> {
        let acks = AckWriter::spawn(
            Arc::clone(&self.store),
            AckWriterOptions {
                max_batch: 256,
                max_delay: Duration::from_millis(5),
            },
        )
        .map_err(OutboxError::Spawn)?;
        let executor: Arc<dyn Executor> = match self.executor {
            Some(e) => e,
            None => {
                let http = HttpClient::new(self.config.http.clone(), self.signer)
                    .map_err(|e| OutboxError::Http(e.to_string()))?;
                Arc::new(ThreadPool::start(
                    Arc::clone(&self.store),
                    http,
                    self.config.concurrency,
                )?)
            }
        };
        let executor: Arc<dyn Executor> = match self.config.per_host {
            Some(cap) => Arc::new(HostCaps::new(executor, cap)),
            None => executor,
        };
        let holder = self.config.holder.clone().unwrap_or_else(default_holder);
        Ok(Outbox {
            inner: Arc::new(Inner {
                store: self.store,
                config: self.config,
                resolver: self.resolver,
                hooks: self.hooks,
                slots: Mutex::new(DrainSlots::new()),
                acks,
                executor,
                holder,
                stopping: AtomicBool::new(false),
            }),
        })
    }
}

/// The blocking runtime's executor: a bounded pool of worker threads (not one per unit).
pub struct ThreadPool {
    tx: Mutex<Option<Sender<Job>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadPool").finish_non_exhaustive()
    }
}

impl ThreadPool {
    /// Starts `threads` workers delivering with `http`, payloads read from `store`.
    ///
    /// # Errors
    /// A thread could not be started.
    pub fn start(
        store: Arc<dyn Store>,
        http: HttpClient,
        threads: usize,
    ) -> Result<ThreadPool, OutboxError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut workers = Vec::new();
        for i in 0..threads.max(1) {
            let rx = Arc::clone(&rx);
            let store = Arc::clone(&store);
            let http = http.clone();
            let handle = std::thread::Builder::new()
                .name(format!("outbox-lanes-worker-{i}"))
                .spawn(move || worker(&rx, &*store, &http))
                .map_err(OutboxError::Spawn)?;
            workers.push(handle);
        }
        Ok(ThreadPool {
            tx: Mutex::new(Some(tx)),
            workers: Mutex::new(workers),
        })
    }

    /// Stops taking jobs and waits for the workers (each finishes its attempt in progress,
    /// within the HTTP timeout).
    pub fn shutdown(&self) {
        self.tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let workers =
            std::mem::take(&mut *self.workers.lock().unwrap_or_else(PoisonError::into_inner));
        for w in workers {
            let _ = w.join();
        }
    }
}

impl Executor for ThreadPool {
    fn execute(&self, job: Job) -> Result<(), Job> {
        let tx = self.tx.lock().unwrap_or_else(PoisonError::into_inner);
        match tx.as_ref() {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        }
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

fn worker(rx: &Mutex<Receiver<Job>>, store: &dyn Store, http: &HttpClient) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(PoisonError::into_inner);
            rx.recv()
        };
        match job {
            Ok(job) if job.abandoned() => {}
            Ok(job) => {
                let result = pass::attempt(store, http, &job);
                job.finish(result);
            }
            Err(_) => return,
        }
    }
}

fn default_holder() -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("pid{}-{nanos:08x}", std::process::id())
}

impl Outbox {
    /// An outbox over `store` with the default resolver and no hooks.
    ///
    /// # Errors
    /// See [`OutboxBuilder::open`].
    pub fn open(store: Arc<dyn Store>, config: OutboxConfig) -> Result<Outbox, OutboxError> {
        Outbox::builder(store, config).open()
    }

    /// A builder, for hooks, a signer or an actor resolver.
    pub fn builder(store: Arc<dyn Store>, config: OutboxConfig) -> OutboxBuilder {
        OutboxBuilder {
            store,
            config,
            resolver: Box::new(IdentityResolver),
            hooks: Hooks::default(),
            signer: None,
            executor: None,
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The canonical id of an actor spelling.
    ///
    /// # Errors
    /// [`OutboxError::UnknownActor`].
    pub fn resolve(&self, actor: &str) -> Result<ActorId, OutboxError> {
        self.inner
            .resolver
            .resolve(actor)
            .map_err(OutboxError::UnknownActor)
    }

    /// Enqueues rows for `actor`, all or nothing; the monitor is woken after the commit.
    ///
    /// # Errors
    /// [`OutboxError::Enqueue`] names the refused row; nothing was written.
    pub fn enqueue(&self, actor: &str, rows: &[NewRow]) -> Result<Vec<Enqueued>, OutboxError> {
        let actor = self.resolve(actor)?;
        let done = self
            .inner
            .store
            .enqueue(&actor, rows)
            .map_err(OutboxError::Enqueue)?;
        debug!(%actor, rows = rows.len(), "enqueued");
        Ok(done)
    }

    /// Drains `actor`'s outbox: runs passes until nothing is admissible, unless a pass of
    /// this actor is already running, in which case it is told to look once more and this
    /// returns [`DrainOutcome::Merged`] without waiting (OL-12).
    ///
    /// # Errors
    /// A store failure; every unfinished unit was handed back first (OL-14).
    pub fn drain(&self, actor: &str) -> Result<DrainOutcome, OutboxError> {
        self.drain_with(actor, &DrainControl::default())
    }

    /// [`Outbox::drain`] with a control another thread or task can use: `stop` ends the
    /// pass gracefully (nothing new starts, attempts in flight finish, the rest is handed
    /// back), `cancel` ends it at once (everything handed back, attempts in flight
    /// abandoned — their late answers ignored — and the slot released).
    ///
    /// # Errors
    /// As [`Outbox::drain`]; [`OutboxError::Cancelled`] after a cancellation.
    pub fn drain_with(
        &self,
        actor: &str,
        control: &DrainControl,
    ) -> Result<DrainOutcome, OutboxError> {
        let actor = self.resolve(actor)?;
        self.drain_actor(&actor, control)
    }

    fn lock_slots(&self) -> std::sync::MutexGuard<'_, DrainSlots> {
        self.inner
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn drain_actor(
        &self,
        actor: &ActorId,
        control: &DrainControl,
    ) -> Result<DrainOutcome, OutboxError> {
        if self.is_stopping() {
            return Err(OutboxError::ShuttingDown);
        }
        if self.lock_slots().try_acquire(actor) == Acquire::Merged {
            return Ok(DrainOutcome::Merged);
        }
        let result = self.drain_held(actor, control);
        if result.is_err() {
            let asked = self.lock_slots().force_release(actor);
            if asked {
                debug!(%actor, "a drain was asked during a failed pass; the monitor will retry");
            }
        }
        result
    }

    /// Runs passes while this process holds `actor`'s in-process slot.
    fn drain_held(
        &self,
        actor: &ActorId,
        control: &DrainControl,
    ) -> Result<DrainOutcome, OutboxError> {
        let inner = &self.inner;
        let mut token = match inner
            .store
            .acquire_slot(actor, &inner.holder, inner.config.lease)?
        {
            outbox_lanes_store::Acquire::Acquired(t) => t,
            outbox_lanes_store::Acquire::Held => {
                // Another process runs a pass; it was told to look again.
                let _ = self.lock_slots().force_release(actor);
                return Ok(DrainOutcome::Merged);
            }
        };
        let mut total = PassReport::default();
        loop {
            let stop = || self.is_stopping() || control.stop.load(Ordering::SeqCst);
            let cancel = || control.cancel.load(Ordering::SeqCst);
            let pass = Pass {
                store: &inner.store,
                acks: &inner.acks,
                executor: &*inner.executor,
                config: &inner.config,
                hooks: &inner.hooks,
                stop: &stop,
                cancel: &cancel,
                token: token.clone(),
            };
            let report = match pass.run() {
                Ok(r) => r,
                Err(e) => {
                    // Best effort: the lease expires anyway if this fails. A look-again
                    // asked meanwhile is left to the monitor's next poll.
                    let _ = inner.store.release_slot(&token);
                    return Err(match e {
                        PassError::Store(e) => e.into(),
                        PassError::Cancelled => OutboxError::Cancelled,
                    });
                }
            };
            total.delivered += report.delivered;
            total.dead_lettered += report.dead_lettered;
            total.handed_back += report.handed_back;
            if report.yielded {
                let stopped = self.is_stopping() || control.stop.load(Ordering::SeqCst);
                if stopped || control.yield_at_slice.load(Ordering::SeqCst) {
                    total.yielded = true;
                    let _ = inner.store.release_slot(&token)?;
                    let _ = self.lock_slots().force_release(actor);
                    return Ok(DrainOutcome::Ran(total));
                }
                // The time slice ran out on a direct drain: go on with a fresh pass, still
                // holding the slot (the pass renews its lease).
                debug!(%actor, "time slice over; next pass");
                continue;
            }
            if inner.store.release_slot(&token)? == outbox_lanes_store::Release::LookAgain {
                debug!(%actor, "look again (another process asked)");
                continue;
            }
            if self.lock_slots().release(actor) == Release::Released {
                return Ok(DrainOutcome::Ran(total));
            }
            debug!(%actor, "look again (asked in this process)");
            token = match inner
                .store
                .acquire_slot(actor, &inner.holder, inner.config.lease)?
            {
                outbox_lanes_store::Acquire::Acquired(t) => t,
                outbox_lanes_store::Acquire::Held => {
                    let _ = self.lock_slots().force_release(actor);
                    return Ok(DrainOutcome::Ran(total));
                }
            };
        }
    }

    /// Status of every actor.
    ///
    /// # Errors
    /// A store failure.
    pub fn status(&self) -> Result<Vec<ActorStatus>, OutboxError> {
        Ok(self.inner.store.status()?)
    }

    /// The lanes of an actor.
    ///
    /// # Errors
    /// A store failure, or an unknown actor.
    pub fn lanes(&self, actor: &str) -> Result<Vec<LaneStatus>, OutboxError> {
        let actor = self.resolve(actor)?;
        Ok(self.inner.store.lanes(&actor)?)
    }

    /// Dead letters, of one actor or all.
    ///
    /// # Errors
    /// A store failure, or an unknown actor.
    pub fn dead_letters(&self, actor: Option<&str>) -> Result<Vec<DeadLetter>, OutboxError> {
        let actor = actor.map(|a| self.resolve(a)).transpose()?;
        Ok(self.inner.store.dead_letters(actor.as_ref())?)
    }

    fn is_stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::SeqCst)
    }

    /// Graceful shutdown: running passes stop starting units, let attempts in flight finish
    /// within the grace period and hand the rest back; then the workers stop. Nothing is lost
    /// if the grace period passes: unfinished units stay in the store.
    pub fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        let deadline = std::time::Instant::now() + self.inner.config.shutdown_grace;
        while self.lock_slots().running() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        // A worker busy with an attempt finishes it within the HTTP timeout.
        self.inner.executor.shutdown();
        if let Err(e) = self.inner.acks.flush() {
            warn!(error = %e, "acks not flushed at shutdown; those units will be delivered again");
        }
    }

    /// Starts a monitor thread draining every actor with work (OL-13).
    ///
    /// # Errors
    /// The store's cross-process watcher or the thread could not be started.
    pub fn monitor(&self) -> Result<Monitor, OutboxError> {
        Monitor::start(self.clone())
    }
}

enum MonitorMsg {
    Wake,
    PassDone(ActorId, bool),
    Stop,
}

/// The monitor thread: drains every actor with work admissible now, woken on enqueue (in
/// this process and, through the store's watcher, in others), at the earliest lane
/// `not_before`, and by a safety-net poll. Stopped by [`Monitor::stop`] or on drop.
pub struct Monitor {
    tx: Sender<MonitorMsg>,
    thread: Option<JoinHandle<()>>,
    outbox: Outbox,
}

impl fmt::Debug for Monitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Monitor").finish_non_exhaustive()
    }
}

impl Monitor {
    fn start(outbox: Outbox) -> Result<Monitor, OutboxError> {
        let (tx, rx) = mpsc::channel();
        let notifier = outbox.inner.store.watch()?;
        let wake = tx.clone();
        let subscription = notifier.subscribe(move || {
            let _ = wake.send(MonitorMsg::Wake);
        });
        let ob = outbox.clone();
        let done_tx = tx.clone();
        let thread = std::thread::Builder::new()
            .name("outbox-lanes-monitor".into())
            .spawn(move || {
                let _subscription = subscription;
                monitor_loop(&ob, &rx, &done_tx);
            })
            .map_err(OutboxError::Spawn)?;
        Ok(Monitor {
            tx,
            thread: Some(thread),
            outbox,
        })
    }

    /// Stops the monitor: running passes finish or hand back (graceful), then it returns.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        let _ = self.tx.send(MonitorMsg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = &self.outbox;
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

fn monitor_loop(outbox: &Outbox, rx: &Receiver<MonitorMsg>, tx: &Sender<MonitorMsg>) {
    let cfg = &outbox.inner.config;
    let mut book = MonitorBook::new(cfg.max_passes, cfg.poll_interval);
    let mut passes: Vec<JoinHandle<()>> = Vec::new();
    let mut stopping = false;
    let control = Arc::new(DrainControl::default());
    control.yield_at_slice.store(true, Ordering::SeqCst);
    loop {
        let now = Timestamp::from_system_time(SystemTime::now());
        if !stopping {
            while let Some(action) = book.poll_action(now) {
                match action {
                    MonitorAction::Poll => match outbox.inner.store.actors_with_work(now) {
                        Ok(due) => book.handle_due(due.ready, due.next_not_before, now),
                        Err(e) => {
                            warn!(error = %e, "monitor poll failed; retrying at the next tick");
                            book.handle_poll_failed(now);
                        }
                    },
                    MonitorAction::Drain(actor) => {
                        let ob = outbox.clone();
                        let done = tx.clone();
                        let control = Arc::clone(&control);
                        let spawned = std::thread::Builder::new()
                            .name("outbox-lanes-pass".into())
                            .spawn(move || {
                                let more = match ob.drain_actor(&actor, &control) {
                                    Ok(DrainOutcome::Ran(r)) => r.yielded,
                                    Ok(DrainOutcome::Merged) => false,
                                    Err(e) => {
                                        warn!(%actor, error = %e, "pass failed");
                                        false
                                    }
                                };
                                let _ = done.send(MonitorMsg::PassDone(actor, more));
                            });
                        match spawned {
                            Ok(h) => passes.push(h),
                            Err(e) => warn!(error = %e, "cannot start a pass thread"),
                        }
                    }
                }
            }
        }
        passes.retain(|h| !h.is_finished());
        if stopping && passes.is_empty() {
            info!("monitor stopped");
            return;
        }
        let wait = book
            .poll_timeout()
            .map_or(cfg.poll_interval, |t| {
                Duration::from_millis(t.as_millis().saturating_sub(now.as_millis()))
            })
            .clamp(Duration::from_millis(1), cfg.poll_interval);
        match rx.recv_timeout(wait) {
            Ok(MonitorMsg::Wake) => book.handle_wake(Wake::StoreChanged, now),
            Ok(MonitorMsg::PassDone(actor, more)) => book.handle_pass_done(&actor, more, now),
            Ok(MonitorMsg::Stop) => {
                // Running passes stop starting units, finish what is in flight and hand the
                // rest back; the outbox itself stays usable.
                stopping = true;
                control.stop.store(true, Ordering::SeqCst);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}
