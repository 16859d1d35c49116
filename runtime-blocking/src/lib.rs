//! The blocking runtime of outbox-lanes: std threads, ureq and a [`Store`].
//!
//! [`Outbox`] enqueues rows and drains an actor's outbox: one pass per actor at a time (in
//! this process through the core's drain-slot registry, across processes through the
//! store's fenced slot), each recipient's units delivered in enqueue order with one in
//! flight, distinct recipients concurrently on a pool of worker threads started as attempts
//! need them (at most [`OutboxConfig::concurrency`], which is also the in-flight window of one
//! pass; idle ones end after a minute, two stay).
//! [`Monitor`] drains every actor with work, woken on enqueue and by a safety-net poll.
//!
//! The drain, its passes and the monitor are the engine's ([`outbox_lanes_driver::engine`]),
//! the same code the tokio runtime runs: this crate only provides the executor —
//! [`ThreadRuntime`], a thread per task with blocking calls in place (a drain runs on the
//! calling thread) — and the worker threads that transmit with ureq ([`ThreadPool`]).
//!
//! ```no_run
//! use std::sync::Arc;
//! use outbox_lanes_blocking::{Outbox, OutboxConfig};
//! use outbox_lanes_store::{NewRow, SqliteStore, SqliteOptions};
//!
//! let store = Arc::new(SqliteStore::open("outbox.db", SqliteOptions::default())?);
//! let outbox = Outbox::open(store, OutboxConfig::default())?;
//! let row = NewRow::new("activity-1")
//!     .body(r#"{"type":"Create"}"#)
//!     .content_type("application/activity+json")
//!     .recipient("https://b.example/inbox");
//! outbox.enqueue("alice", &[row])?;
//! outbox.drain("alice")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod pool;
mod thread;

use std::fmt;
use std::sync::Arc;

use outbox_lanes_core::ActorId;
pub use outbox_lanes_driver::engine::Stopped;
use outbox_lanes_driver::engine::{self, Runtime};
pub use outbox_lanes_driver::{
    Attempted, DeadLettered, Delivered, DrainControl, DrainOutcome, Hooks, HostCaps,
    LaneUnavailable, OriginConfig, OutboxConfig, OutboxError, PassReport, RateLimits, Reserve,
    SignatureMode, Signer, Started,
};
use outbox_lanes_driver::{Executor, OutboxCore, OutboxOptions};
pub use outbox_lanes_driver::{core, sign, store};
use outbox_lanes_store::{ActorStatus, DeadLetter, Enqueued, LaneStatus, NewRow, Store};

pub use crate::http::{HttpClient, HttpConfig};
pub use crate::pool::ThreadPool;
pub use crate::thread::{ThreadRuntime, block_on};

/// HTTP delivery: the shared policy and the blocking ureq client.
pub mod http {
    pub use outbox_lanes_driver::http::*;
    pub use outbox_lanes_driver::ureq_client::*;
}

/// An actor outbox over a [`Store`], delivering over HTTP from a pool of worker threads.
///
/// Cloning is cheap; every clone shares the same workers and drain slots.
#[derive(Clone)]
pub struct Outbox {
    inner: Arc<OutboxCore>,
    rt: Arc<dyn Runtime>,
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
    options: OutboxOptions,
    executor: Option<Arc<dyn Executor>>,
}

impl fmt::Debug for OutboxBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxBuilder")
            .field("options", &self.options)
            .field("executor", &self.executor.is_some())
            .finish()
    }
}

impl OutboxBuilder {
    /// Runs deliveries on `executor` instead of the built-in pool of worker threads. The
    /// HTTP settings and signer then belong to it.
    pub fn executor(mut self, executor: Arc<dyn Executor>) -> Self {
        self.executor = Some(executor);
        self
    }

    outbox_lanes_driver::outbox_builder_setters!();

    /// Opens the outbox: starts the ack writer; delivery workers start as attempts need them.
    ///
    /// # Errors
    /// The ack writer's thread could not be started, or the HTTP client could not be built.
    pub fn open(self) -> Result<Outbox, OutboxError> {
        let executor: Arc<dyn Executor> = match self.executor {
            Some(e) => e,
            None => {
                let config = self.options.config();
                let http = HttpClient::new(config.http.clone(), self.options.signer.clone())
                    .map_err(|e| OutboxError::Http(e.to_string()))?;
                Arc::new(ThreadPool::new(http, config.concurrency))
            }
        };
        let rt = Arc::new(ThreadRuntime);
        let core = self.options.open(&*rt, executor)?;
        Ok(Outbox {
            inner: Arc::new(core),
            rt,
        })
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
            options: OutboxOptions::new(store, config),
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
    /// Every method naming an actor takes it as `impl Into<ActorId>` (`&str`, `String`,
    /// `&String`, `ActorId`, `&ActorId`), and resolves it here first: an `ActorId` too is a
    /// spelling to the outbox's resolver, which maps a canonical id to itself.
    ///
    /// # Errors
    /// [`OutboxError::UnknownActor`].
    pub fn resolve(&self, actor: impl Into<ActorId>) -> Result<ActorId, OutboxError> {
        self.inner.resolve(actor.into().as_str())
    }

    /// Enqueues rows for `actor`, all or nothing; the monitor is woken after the commit.
    ///
    /// # Errors
    /// [`OutboxError::Enqueue`] names the refused row; nothing was written.
    pub fn enqueue(
        &self,
        actor: impl Into<ActorId>,
        rows: &[NewRow],
    ) -> Result<Vec<Enqueued>, OutboxError> {
        self.inner.enqueue(actor.into().as_str(), rows)
    }

    /// Drains `actor`'s outbox: runs passes until nothing is admissible, unless a pass of
    /// this actor is already running, in which case it is told to look once more and this
    /// returns [`DrainOutcome::Merged`] without waiting (OL-12).
    ///
    /// # Errors
    /// A store failure; every unfinished unit was handed back first (OL-14).
    pub fn drain(&self, actor: impl Into<ActorId>) -> Result<DrainOutcome, OutboxError> {
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
        actor: impl Into<ActorId>,
        control: &Arc<DrainControl>,
    ) -> Result<DrainOutcome, OutboxError> {
        let actor = self.resolve(actor)?;
        block_on(engine::drain(&self.rt, &self.inner, &actor, control))
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
    pub fn lanes(&self, actor: impl Into<ActorId>) -> Result<Vec<LaneStatus>, OutboxError> {
        self.inner.lanes(actor.into().as_str())
    }

    /// Dead letters, of one actor or all.
    ///
    /// The actor is an `Option<&str>`, not an `impl Into<ActorId>`, so that `None` needs no
    /// type: pass `Some(id.as_str())` for an [`ActorId`].
    ///
    /// # Errors
    /// A store failure, or an unknown actor.
    pub fn dead_letters(&self, actor: Option<&str>) -> Result<Vec<DeadLetter>, OutboxError> {
        self.inner.dead_letters(actor)
    }

    /// Stops the outbox — the one stop, the same on every runtime, which [`Monitor::stop`]
    /// also is: every monitor of the outbox stops and new drains are refused; running passes
    /// start nothing new and their attempts in flight have
    /// [`shutdown_grace`](OutboxConfig::shutdown_grace) (10 s by default) to finish; past it
    /// they are abandoned, not waited for (recorded as interrupted, their units delivered
    /// again later: [`Stopped::grace_over`]); the acks waiting are committed, the drain slots
    /// released, and this process's holder lock file removed. Returns within the grace (plus
    /// the passes' last store writes). Nothing is lost: what was not delivered stays pending
    /// in the store. Calling it again returns at once.
    pub fn shutdown(&self) -> Stopped {
        block_on(engine::shutdown(&self.rt, &self.inner))
    }

    /// Starts a monitor thread draining every actor with work (OL-13).
    ///
    /// # Errors
    /// The store's cross-process watcher or the thread could not be started.
    pub fn monitor(&self) -> Result<Monitor, OutboxError> {
        let m = block_on(engine::Monitor::start(
            Arc::clone(&self.rt),
            Arc::clone(&self.inner),
        ))?;
        Ok(Monitor { inner: Some(m) })
    }
}

/// The monitor (the engine's, [`engine::Monitor`]) on a thread of its own: drains every
/// actor with work admissible now, woken on enqueue (in this process and, through the
/// store's watcher, in others), at the earliest lane `not_before`, and by a safety-net poll;
/// each pass on a thread of its own.
///
/// [`Monitor::stop`] is the stop of the outbox ([`Outbox::shutdown`]). Dropping the monitor
/// stops only the monitor, in the background (running passes start nothing new, finish their
/// attempts in flight and hand the rest back), and leaves the outbox open.
pub struct Monitor {
    inner: Option<engine::Monitor>,
}

impl fmt::Debug for Monitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Monitor").finish_non_exhaustive()
    }
}

impl Monitor {
    /// Stops the monitor and its outbox: the same as [`Outbox::shutdown`] (see there), then
    /// waits for the monitor's thread to end. Returns within the shutdown grace, with what it
    /// cut ([`Stopped`]).
    pub fn stop(mut self) -> Stopped {
        self.inner
            .take()
            .map(|m| block_on(m.stop()))
            .unwrap_or_default()
    }
}
