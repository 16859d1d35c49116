//! The blocking runtime of outbox-lanes: std threads, ureq and a [`Store`].
//!
//! [`Outbox`] enqueues rows and drains an actor's outbox: one pass per actor at a time (in
//! this process through the core's drain-slot registry, across processes through the
//! store's fenced slot), each recipient's units delivered in enqueue order with one in
//! flight, distinct recipients concurrently on a bounded pool of worker threads
//! ([`OutboxConfig::concurrency`] of them, which is also the in-flight window of one pass).
//! [`Monitor`] drains every actor with work, woken on enqueue and by a safety-net poll.
//!
//! The pass itself is the shared driver's ([`outbox_lanes_driver::pass`]): this crate runs
//! its rounds on the calling thread, waits for completions (all that are waiting at once)
//! on a channel, and hands its jobs to the worker threads.
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
//!     headers: Vec::new(),
//! }])?;
//! outbox.drain("alice")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod monitor;
mod wake;

use std::fmt;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use outbox_lanes_core::{
    Acquire, ActorId, ActorResolver, DrainAction, DrainSession, IdentityResolver, SlotAnswer,
};
use outbox_lanes_driver::pass::{PassCore, PassResult, RoundContext, now};
pub use outbox_lanes_driver::{
    Attempted, DeadLettered, Delivered, DrainControl, DrainOutcome, Hooks, HostCaps, OutboxConfig,
    OutboxError, PassReport, Signer, Started,
};
use outbox_lanes_driver::{
    Completions, Done, Executor, Job, OutboxCore, drain_outcome, store_released,
};
pub use outbox_lanes_driver::{core, sign, store};
use outbox_lanes_store::{
    ActorStatus, DeadLetter, Enqueued, LaneStatus, NewRow, Store, StoreError,
};
use tracing::warn;

pub use crate::http::{HttpClient, HttpConfig};
pub use crate::monitor::Monitor;

/// HTTP delivery: the shared policy and the blocking ureq client.
pub mod http {
    pub use outbox_lanes_driver::http::*;
    pub use outbox_lanes_driver::ureq_client::*;
}

/// The longest a pass waits without an event: a safety net, since every event (a
/// completion, a wake-up, a stop or cancel request, a timer) wakes it by itself.
const MAX_WAIT: Duration = Duration::from_secs(5);

/// An actor outbox over a [`Store`], delivering over HTTP from a pool of worker threads.
///
/// Cloning is cheap; every clone shares the same workers and drain slots.
#[derive(Clone)]
pub struct Outbox {
    inner: Arc<OutboxCore>,
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("holder", &self.inner.holder())
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

impl fmt::Debug for OutboxBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl OutboxBuilder {
    /// Runs deliveries on `executor` instead of the built-in pool of worker threads. The
    /// HTTP settings and signer then belong to it.
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
        let executor: Arc<dyn Executor> = match self.executor {
            Some(e) => e,
            None => {
                let http = HttpClient::new(self.config.http.clone(), self.signer)
                    .map_err(|e| OutboxError::Http(e.to_string()))?;
                Arc::new(ThreadPool::start(http, self.config.concurrency)?)
            }
        };
        let core = OutboxCore::new(self.store, self.config, self.resolver, self.hooks, executor)?;
        Ok(Outbox {
            inner: Arc::new(core),
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
    /// Starts `threads` workers delivering with `http`.
    ///
    /// # Errors
    /// A thread could not be started.
    pub fn start(http: HttpClient, threads: usize) -> Result<ThreadPool, OutboxError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut workers = Vec::new();
        for i in 0..threads.max(1) {
            let rx = Arc::clone(&rx);
            let http = http.clone();
            let handle = std::thread::Builder::new()
                .name(format!("outbox-lanes-worker-{i}"))
                .spawn(move || worker(&rx, &http))
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

fn worker(rx: &Mutex<Receiver<Job>>, http: &HttpClient) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(PoisonError::into_inner);
            rx.recv()
        };
        match job {
            // Its pass ended and handed the unit back: dropping it sends nothing.
            Ok(job) if job.abandoned() => drop(job),
            Ok(job) => {
                let result = http.deliver(&job.delivery(), std::time::SystemTime::now());
                job.finish(result);
            }
            Err(_) => return,
        }
    }
}

/// A message to a running pass.
enum Msg {
    Done(Done),
    /// New rows were enqueued somewhere.
    Wake,
    /// A stop or cancel request (the pass reads the control's flags).
    Control,
}

/// The pass's end of its channel: completions from worker threads.
struct ChannelSink(Sender<Msg>);

impl Completions for ChannelSink {
    fn complete(&self, done: Done) {
        // A pass that is gone no longer cares.
        let _ = self.0.send(Msg::Done(done));
    }
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

    /// The state shared with the driver.
    pub fn core(&self) -> &Arc<OutboxCore> {
        &self.inner
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        self.inner.store()
    }

    /// The canonical id of an actor spelling.
    ///
    /// # Errors
    /// [`OutboxError::UnknownActor`].
    pub fn resolve(&self, actor: &str) -> Result<ActorId, OutboxError> {
        self.inner.resolve(actor)
    }

    /// Enqueues rows for `actor`, all or nothing; the monitor is woken after the commit.
    ///
    /// # Errors
    /// [`OutboxError::Enqueue`] names the refused row; nothing was written.
    pub fn enqueue(&self, actor: &str, rows: &[NewRow]) -> Result<Vec<Enqueued>, OutboxError> {
        self.inner.enqueue(actor, rows)
    }

    /// Drains `actor`'s outbox: runs passes until nothing is admissible, unless a pass of
    /// this actor is already running, in which case it is told to look once more and this
    /// returns [`DrainOutcome::Merged`] without waiting (OL-12).
    ///
    /// # Errors
    /// A store failure; every unfinished unit was handed back first (OL-14).
    pub fn drain(&self, actor: &str) -> Result<DrainOutcome, OutboxError> {
        self.drain_with(actor, &Arc::new(DrainControl::default()))
    }

    /// [`Outbox::drain`] with a control another thread can use:
    /// [`DrainControl::request_stop`] ends the pass gracefully (nothing new starts, attempts
    /// in flight finish, the rest is handed back), [`DrainControl::request_cancel`] ends it
    /// at once (everything handed back, attempts in flight abandoned — their late answers
    /// ignored — and the slot released).
    ///
    /// # Errors
    /// As [`Outbox::drain`]; [`OutboxError::Cancelled`] after a cancellation.
    pub fn drain_with(
        &self,
        actor: &str,
        control: &Arc<DrainControl>,
    ) -> Result<DrainOutcome, OutboxError> {
        let actor = self.resolve(actor)?;
        drain_actor(&self.inner, &actor, control)
    }

    /// Status of every actor.
    ///
    /// # Errors
    /// A store failure.
    pub fn status(&self) -> Result<Vec<ActorStatus>, OutboxError> {
        self.inner.status()
    }

    /// The lanes of an actor.
    ///
    /// # Errors
    /// A store failure, or an unknown actor.
    pub fn lanes(&self, actor: &str) -> Result<Vec<LaneStatus>, OutboxError> {
        self.inner.lanes(actor)
    }

    /// Dead letters, of one actor or all.
    ///
    /// # Errors
    /// A store failure, or an unknown actor.
    pub fn dead_letters(&self, actor: Option<&str>) -> Result<Vec<DeadLetter>, OutboxError> {
        self.inner.dead_letters(actor)
    }

    /// Graceful shutdown: running passes stop starting units, let attempts in flight finish
    /// within the grace period and hand the rest back; then the workers stop. Nothing is lost
    /// if the grace period passes: unfinished units stay in the store.
    pub fn shutdown(&self) {
        // Woken by every slot release (no polling); subscribed before the stop so no release
        // is missed.
        let (tx, rx) = mpsc::channel();
        let _released = self.inner.slot_released().subscribe(move || {
            let _ = tx.send(());
        });
        self.inner.begin_shutdown();
        let deadline = std::time::Instant::now() + self.inner.config().shutdown_grace;
        while self.inner.slots().running() > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || rx.recv_timeout(left) == Err(RecvTimeoutError::Disconnected) {
                break;
            }
        }
        // A worker busy with an attempt finishes it within the HTTP timeout.
        self.inner.finish_shutdown();
    }

    /// Starts a monitor thread draining every actor with work (OL-13).
    ///
    /// # Errors
    /// The store's cross-process watcher or the thread could not be started.
    pub fn monitor(&self) -> Result<Monitor, OutboxError> {
        Monitor::start(self.clone())
    }
}

/// Runs `actor`'s drain: the core's [`DrainSession`] decides, this executes.
pub(crate) fn drain_actor(
    core: &Arc<OutboxCore>,
    actor: &ActorId,
    control: &Arc<DrainControl>,
) -> Result<DrainOutcome, OutboxError> {
    if core.is_stopping() {
        return Err(OutboxError::ShuttingDown);
    }
    if core.slots().try_acquire(actor) == Acquire::Merged {
        return Ok(DrainOutcome::Merged);
    }
    let store = core.store();
    let config = core.config();
    let mut session = DrainSession::new(
        control
            .yield_at_slice
            .load(std::sync::atomic::Ordering::SeqCst),
    );
    let mut token = None;
    let mut total = PassReport::default();
    let mut error: Option<StoreError> = None;
    // When the slot's lease was acquired or last renewed; handed from pass to pass.
    let mut lease_renewed = now();
    while let Some(action) = session.poll_action() {
        match action {
            DrainAction::AcquireStoreSlot => {
                // Read before asking: the lease runs from the database's acquisition, later.
                let asked = now();
                match store.acquire_slot(actor, core.holder(), config.lease) {
                    Ok(outbox_lanes_store::SlotAcquisition::Acquired(t)) => {
                        token = Some(t);
                        lease_renewed = asked;
                        session.handle_store_acquire(SlotAnswer::Acquired);
                    }
                    Ok(outbox_lanes_store::SlotAcquisition::Held) => {
                        session.handle_store_acquire(SlotAnswer::Held);
                    }
                    Err(e) => {
                        error.get_or_insert(e);
                        session.handle_failed();
                    }
                }
            }
            DrainAction::RunPass => {
                let t = token
                    .clone()
                    .expect("the session runs a pass only after acquiring the store's slot");
                let result = run_pass(core, t, control, lease_renewed);
                lease_renewed = result.lease_renewed;
                total.add(&result.report);
                if let Some(e) = result.error {
                    error.get_or_insert(e);
                }
                session.handle_pass_end(result.end);
            }
            DrainAction::ReleaseStoreSlot => {
                let Some(t) = &token else {
                    session.handle_failed();
                    continue;
                };
                store_released(&mut session, actor, store.release_slot(t));
            }
            DrainAction::ReleaseLocalSlot | DrainAction::ForceReleaseLocalSlot => {
                core.local_slot_action(actor, &action, &mut session);
            }
            DrainAction::Finish(end) => {
                return drain_outcome(end, total, error, || OutboxError::ShuttingDown);
            }
        }
    }
    Err(OutboxError::Store(StoreError::Database(
        "the drain session ended without finishing".into(),
    )))
}

/// One pass on this thread: rounds, then waits for completions and wake-ups.
fn run_pass(
    core: &OutboxCore,
    token: outbox_lanes_store::SlotToken,
    control: &Arc<DrainControl>,
    lease_renewed: outbox_lanes_core::Timestamp,
) -> PassResult {
    let (tx, rx) = mpsc::channel();
    let wake = tx.clone();
    let woken = wake::Coalesced::default();
    let w = woken.clone();
    let _enqueues = core.store().notifier().subscribe(move || {
        w.wake(&wake, || Msg::Wake);
    });
    let ctl = tx.clone();
    let _control = control.subscribe(move || {
        let _ = ctl.send(Msg::Control);
    });
    let ctl = tx.clone();
    let _shutdown = core.shutdown_signal().subscribe(move || {
        let _ = ctl.send(Msg::Control);
    });
    let mut pass = PassCore::new(
        token,
        core.config(),
        Arc::new(ChannelSink(tx)),
        now(),
        lease_renewed,
    );
    let cx = RoundContext {
        store: &**core.store(),
        acks: core.acks(),
        hooks: core.hooks(),
    };
    loop {
        if control.is_cancelled() {
            pass.handle_cancel(now());
        } else if control.is_stopped() || core.is_stopping() {
            pass.handle_shutdown(now());
        }
        let jobs = pass.round(cx);
        for job in jobs {
            if let Err(job) = core.executor().execute(job) {
                // The workers stopped: the job reports NotSent as it is dropped.
                drop(job);
                pass.handle_shutdown(now());
            }
        }
        if pass.ended().is_some() {
            break;
        }
        if let Some(waiting) = pass.waiting_changed() {
            control.report_waiting(pass.actor(), waiting);
        }
        let t = now();
        let wait = pass
            .poll_timeout()
            .map_or(MAX_WAIT, |d| {
                Duration::from_millis(d.as_millis().saturating_sub(t.as_millis()))
            })
            .min(MAX_WAIT);
        match rx.recv_timeout(wait) {
            Ok(msg) => handle(&mut pass, core, msg, &woken),
            Err(RecvTimeoutError::Timeout) => pass.handle_timeout(now()),
            Err(RecvTimeoutError::Disconnected) => pass.handle_cancel(now()),
        }
        // Everything already waiting, before the next round: one round for many events.
        while let Ok(msg) = rx.try_recv() {
            handle(&mut pass, core, msg, &woken);
        }
        pass.handle_timeout(now());
    }
    let result = pass.finish(cx);
    if let Some(e) = &result.error {
        warn!(error = %e, end = ?result.end, "pass ended on a store failure");
    }
    result
}

fn handle(pass: &mut PassCore, core: &OutboxCore, msg: Msg, woken: &wake::Coalesced) {
    match msg {
        Msg::Done(d) => pass.handle_done(d, core.hooks(), now()),
        Msg::Wake => {
            woken.taken();
            pass.handle_wake();
        }
        // Read at the top of the loop.
        Msg::Control => {}
    }
}
