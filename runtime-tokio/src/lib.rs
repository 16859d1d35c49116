//! The async runtime of outbox-lanes: tokio (async-std/smol by feature), hyper and a Store.
//!
//! [`Outbox`] runs the relay engine ([`outbox_lanes_driver::engine`]: drains, passes and the
//! monitor, the same code the blocking runtime runs) on an async executor. This crate only
//! provides the executor's side:
//!
//! - a [`Runtime`] per executor (tokio, async-std, smol): tasks, the blocking pool, timers.
//!   Each pass is a task that takes completions in batches (one wake-up for many) and runs
//!   each round of store work on the blocking pool in one hop, never one round trip per
//!   unit; every store call (enqueue, status, lanes, dead letters too) stays on the blocking
//!   pool, so the Postgres client is only ever used and dropped there;
//! - deliveries as tasks (a pass's first four in flight on the pass's own task:
//!   [`spawn_delivery`](outbox_lanes_driver::engine::spawn_delivery)), at most
//!   [`OutboxConfig::concurrency`] at once (default 256; it is also one pass's in-flight
//!   window), POSTing with hyper-util's client (`AsyncHttpClient`, the blocking client's
//!   policy and results) on tokio, or with the blocking ureq client on the blocking pool of
//!   any other [`Runtime`] (feature `blocking-http`, implied by `smol` and `async-std`);
//! - cancellation safety: dropping or aborting a [`Outbox::drain`] future, or a
//!   `tokio::time::timeout` around it, cancels the pass — a token that wakes it at once, not
//!   a poll — which hands every unfinished unit back and releases the drain slot (OL-14):
//!   nothing stays claimed until a lease runs out, and the next drain of that actor runs a
//!   pass of its own. Attempts in flight are abandoned, not aborted: they are recorded as
//!   interrupted, their answers ignored and the units sent again later (delivery is
//!   at-least-once, and every request carries the unit's idempotency key);
//! - [`Outbox::monitor`]: the engine's [`Monitor`] as a task, running the passes of several
//!   actors at once as tasks.
//!
//! Executors, by feature: `tokio` (default; `TokioRuntime`, hyper-util), `smol`
//! (`SmolRuntime`) and `async-std` (`AsyncStdRuntime`; async-std is discontinued
//! upstream, smol is its successor). The last two run the same driver with HTTP through
//! ureq on their blocking pools. [`Outbox::open`] opens on the executor the caller runs on
//! (tokio inside a tokio runtime, async-std inside an async-std task, else smol), the same
//! call on each; [`OutboxBuilder::open_on`] names one. [`Outbox::shutdown`] (or
//! [`Monitor::stop`], the same stop) stops it, on each executor alike.
//!
//! ```no_run
//! use std::sync::Arc;
//! use outbox_lanes_tokio::{Outbox, OutboxConfig};
//! use outbox_lanes_tokio::store::{NewRow, SqliteOptions, SqliteStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(SqliteStore::open("outbox.db", SqliteOptions::default())?);
//! let outbox = Outbox::open(store, OutboxConfig::default())?;
//! let row = NewRow::new("activity-1")
//!     .body(r#"{"type":"Create"}"#)
//!     .content_type("application/activity+json")
//!     .recipient("https://b.example/inbox");
//! outbox.enqueue("alice", &[row]).await?;
//! outbox.drain("alice").await?;
//! # Ok(()) }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod cancel;
mod executor;
#[cfg(feature = "tokio")]
pub mod http;
pub mod runtime;

use std::fmt;
use std::sync::Arc;

pub use outbox_lanes_core as core;
use outbox_lanes_core::ActorId;
pub use outbox_lanes_driver::fmt::rfc3339;
pub use outbox_lanes_driver::sign::{self, Signer};
pub use outbox_lanes_driver::store;
pub use outbox_lanes_driver::{
    Attempted, DeadLettered, Delivered, DrainControl, DrainOutcome, Hooks, HttpConfig,
    LaneUnavailable, OriginConfig, OutboxConfig, OutboxError, PassReport, RateLimits, Reserve,
    SignatureMode, Started,
};
use outbox_lanes_driver::{Executor, OutboxCore, OutboxOptions};
use outbox_lanes_store::{ActorStatus, DeadLetter, Enqueued, LaneStatus, NewRow, Store};
use tracing::warn;

use crate::cancel::WindingDown;
use crate::executor::{TaskExecutor, Transport};
#[cfg(feature = "tokio")]
pub use crate::http::AsyncHttpClient;
#[cfg(feature = "async-std")]
pub use crate::runtime::AsyncStdRuntime;
#[cfg(feature = "smol")]
pub use crate::runtime::SmolRuntime;
#[cfg(feature = "tokio")]
pub use crate::runtime::TokioRuntime;
use outbox_lanes_driver::engine::{self, unblock};
pub use outbox_lanes_driver::engine::{BoxFuture, Runtime};
pub use outbox_lanes_driver::engine::{Monitor, Stopped};

struct Inner {
    /// `Some` until dropped; taken by `Drop` to drop it on the blocking pool.
    core: Option<Arc<OutboxCore>>,
    rt: Arc<dyn Runtime>,
    winding: Arc<WindingDown>,
}

impl Inner {
    fn core(&self) -> &Arc<OutboxCore> {
        self.core
            .as_ref()
            .expect("the outbox core is only taken when Inner is dropped")
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last reference to the store may go with it (a Postgres client must not be
        // dropped on an executor thread), and the ack writer's thread is joined.
        if let Some(core) = self.core.take() {
            engine::drop_where_blocking(&*self.rt, core);
        }
    }
}

/// An actor outbox over a [`Store`], driven from async code; see the [crate docs](crate).
///
/// Cloning is cheap; every clone shares the same delivery tasks and drain slots.
#[derive(Clone)]
pub struct Outbox {
    inner: Arc<Inner>,
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("runtime", &self.inner.rt)
            .finish_non_exhaustive()
    }
}

/// Builder for an [`Outbox`] with hooks, a signer or an actor resolver.
#[derive(Debug)]
pub struct OutboxBuilder {
    options: OutboxOptions,
}

impl OutboxBuilder {
    outbox_lanes_driver::outbox_builder_setters!();

    /// Opens the outbox on the executor the caller runs on, among this crate's features: a
    /// tokio runtime (feature `tokio`, delivering with hyper-util's client), else an async-std
    /// task (feature `async-std`), else smol's global executor (feature `smol`) — those two
    /// delivering with the blocking ureq client on their blocking pools. So with several
    /// features (a workspace unifies them), tokio wins inside a tokio runtime, and a smol or
    /// async-std program still gets its own. Another executor: [`OutboxBuilder::open_on`].
    ///
    /// # Errors
    /// Called where none of the enabled executors runs (with `tokio` alone: outside a tokio
    /// runtime), [`OutboxError::Spawn`] naming what to do; the HTTP client could not be built
    /// ([`OutboxError::Http`]); the ack writer's thread could not be started.
    #[cfg(any(feature = "tokio", feature = "async-std", feature = "smol"))]
    pub fn open(self) -> Result<Outbox, OutboxError> {
        #[cfg(feature = "tokio")]
        if let Ok(rt) = TokioRuntime::current() {
            let http = AsyncHttpClient::new(
                self.options.config().http.clone(),
                self.options.signer.clone(),
            )?;
            return self.finish(Arc::new(rt), Transport::Async(http));
        }
        #[cfg(feature = "async-std")]
        if async_std::task::try_current().is_some() || cfg!(not(feature = "smol")) {
            return self.open_on(Arc::new(AsyncStdRuntime));
        }
        #[cfg(feature = "smol")]
        {
            self.open_on(Arc::new(SmolRuntime))
        }
        #[cfg(not(feature = "smol"))]
        {
            Err(OutboxError::Spawn(std::io::Error::other(
                "no tokio runtime here: open the outbox inside one (in `#[tokio::main]`, or under `Runtime::enter`), or on another executor with `OutboxBuilder::open_on`",
            )))
        }
    }

    /// Opens the outbox on `runtime`, delivering with the blocking ureq client on its
    /// blocking pool (async-std, smol, or a runtime of your own; feature `blocking-http`).
    ///
    /// # Errors
    /// The HTTP client could not be built ([`OutboxError::Http`]); the ack writer's thread
    /// could not be started.
    #[cfg(feature = "blocking-http")]
    pub fn open_on(self, runtime: Arc<dyn Runtime>) -> Result<Outbox, OutboxError> {
        let http = outbox_lanes_driver::ureq_client::HttpClient::new(
            self.options.config().http.clone(),
            self.options.signer.clone(),
        )
        .map_err(|e| OutboxError::Http(e.to_string()))?;
        self.finish(runtime, Transport::Blocking(http))
    }

    fn finish(self, rt: Arc<dyn Runtime>, transport: Transport) -> Result<Outbox, OutboxError> {
        let executor: Arc<dyn Executor> = Arc::new(TaskExecutor::new(
            Arc::clone(&rt),
            transport,
            self.options.config().concurrency,
        ));
        let core = self.options.open(&*rt, executor)?;
        Ok(Outbox {
            inner: Arc::new(Inner {
                core: Some(Arc::new(core)),
                rt,
                winding: Arc::default(),
            }),
        })
    }
}

impl Outbox {
    /// An outbox with the default resolver and no hooks, on the executor the caller runs on:
    /// tokio's (feature `tokio`), async-std's (`async-std`) or smol's (`smol`); see
    /// [`OutboxBuilder::open`]. Another executor: [`OutboxBuilder::open_on`].
    ///
    /// # Errors
    /// See [`OutboxBuilder::open`].
    #[cfg(any(feature = "tokio", feature = "async-std", feature = "smol"))]
    pub fn open(store: Arc<dyn Store>, config: OutboxConfig) -> Result<Outbox, OutboxError> {
        Outbox::builder(store, config).open()
    }

    /// A builder, for hooks, a signer, an actor resolver or another runtime.
    pub fn builder(store: Arc<dyn Store>, config: OutboxConfig) -> OutboxBuilder {
        OutboxBuilder {
            options: OutboxOptions::new(store, config),
        }
    }

    /// The state shared with the driver; its methods block (call them on a blocking thread).
    pub fn core(&self) -> &Arc<OutboxCore> {
        self.inner.core()
    }

    /// The runtime the outbox runs on.
    pub fn runtime(&self) -> &Arc<dyn Runtime> {
        &self.inner.rt
    }

    /// The store. Its methods block: call them through the runtime's blocking pool.
    pub fn store(&self) -> &Arc<dyn Store> {
        self.inner.core().store()
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
        self.inner.core().resolve(actor.into().as_str())
    }

    /// Runs `f` with the shared core on the blocking pool.
    async fn call<T, F>(&self, f: F) -> Result<T, OutboxError>
    where
        T: Send + 'static,
        F: FnOnce(&OutboxCore) -> Result<T, OutboxError> + Send + 'static,
    {
        let core = Arc::clone(self.inner.core());
        unblock(&*self.inner.rt, move || f(&core))
            .await
            .unwrap_or(Err(OutboxError::ShuttingDown))
    }

    /// Enqueues rows for `actor`, all or nothing; the monitor is woken after the commit.
    ///
    /// The blocking runtime's `Outbox::enqueue` with `async`: the same arguments. The rows are
    /// copied for the blocking pool, where the store writes them.
    ///
    /// # Errors
    /// [`OutboxError::Enqueue`] names the refused row; nothing was written.
    pub async fn enqueue(
        &self,
        actor: impl Into<ActorId>,
        rows: &[NewRow],
    ) -> Result<Vec<Enqueued>, OutboxError> {
        let (actor, rows): (ActorId, _) = (actor.into(), rows.to_vec());
        self.call(move |core| core.enqueue(actor.as_str(), &rows))
            .await
    }

    /// Runs `f` — your own writes and [`SqliteStore::enqueue_in`] — in one transaction on
    /// `store`'s writer connection, on the runtime's blocking pool (tokio, async-std or smol:
    /// the outbox's [`Runtime`]), commits it, then wakes the monitor: the transactional outbox
    /// (OL-15) from async code, without blocking the executor. `store` is the store this outbox
    /// was opened on; your tables live in its database file. If `f` fails, nothing is written.
    ///
    /// Inside `f`, use only `enqueue_in` and your own SQL on the transaction: any other method
    /// of the store waits for the connection `f` holds. Drop the [`PendingWake`] that
    /// `enqueue_in` returns: the wake-up fires after the commit.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use outbox_lanes_tokio::{Outbox, OutboxConfig};
    /// use outbox_lanes_tokio::store::{NewRow, SqliteOptions, SqliteStore};
    ///
    /// type Error = Box<dyn std::error::Error + Send + Sync>;
    ///
    /// # async fn run() -> Result<(), Error> {
    /// let store = Arc::new(SqliteStore::open("app.db", SqliteOptions::default())?);
    /// let outbox = Outbox::open(store.clone(), OutboxConfig::default())?;
    /// let units = outbox
    ///     .enqueue_in(&store, |store, tx| {
    ///         tx.execute("INSERT INTO notes VALUES (?1, ?2)", ("n1", "hello"))?; // your write
    ///         let row = NewRow {
    ///             id: "https://notes.example/notes/n1".into(),
    ///             body: br#"{"type":"Create"}"#.to_vec(),
    ///             recipients: vec!["https://b.example/inbox".into()],
    ///             ..NewRow::default()
    ///         };
    ///         let (enqueued, _wake) = store.enqueue_in(tx, "https://notes.example/actor", &[row])?;
    ///         Ok::<_, Error>(enqueued[0].units.len())
    ///     })
    ///     .await?; // committed: the note and its row, or neither
    /// # Ok(()) }
    /// ```
    ///
    /// [`SqliteStore::enqueue_in`]: outbox_lanes_store::SqliteStore::enqueue_in
    /// [`PendingWake`]: outbox_lanes_store::PendingWake
    ///
    /// # Errors
    /// `f`'s error (the transaction rolled back), the commit's; a runtime that is shutting
    /// down and dropped the work unrun ([`StoreError::Database`](outbox_lanes_store::StoreError::Database)).
    #[cfg(feature = "sqlite")]
    pub async fn enqueue_in<T, E, F>(
        &self,
        store: &Arc<outbox_lanes_store::SqliteStore>,
        f: F,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<outbox_lanes_store::StoreError> + Send + 'static,
        F: FnOnce(
                &outbox_lanes_store::SqliteStore,
                &outbox_lanes_store::sqlite::rusqlite::Transaction<'_>,
            ) -> Result<T, E>
            + Send
            + 'static,
    {
        let store = Arc::clone(store);
        unblock(&*self.inner.rt, move || {
            store.with_transaction(|tx| f(&store, tx))
        })
        .await
        .unwrap_or_else(|| {
            Err(E::from(outbox_lanes_store::StoreError::Database(
                "the runtime is shutting down: the transaction did not run".into(),
            )))
        })
    }

    /// Drains `actor`'s outbox: runs passes until nothing is admissible, unless a pass of
    /// this actor is already running, in which case it is told to look once more and this
    /// returns [`DrainOutcome::Merged`] without waiting (OL-12).
    ///
    /// Cancellation-safe: dropping the future (an abort, a `select!`, a timeout) cancels the
    /// pass, which hands every unfinished unit back and releases the drain slot within a
    /// few milliseconds; attempts in flight are abandoned (their late answers ignored; a
    /// recipient may see such a unit again: delivery is at-least-once). A drain of the same
    /// actor on this outbox started after the drop waits for that hand-back and then runs a
    /// pass of its own (it does not return [`DrainOutcome::Merged`] because of it).
    ///
    /// # Errors
    /// A store failure; every unfinished unit was handed back first (OL-14).
    pub async fn drain(&self, actor: impl Into<ActorId>) -> Result<DrainOutcome, OutboxError> {
        self.drain_with(actor, Arc::new(DrainControl::default()))
            .await
    }

    /// [`Outbox::drain`] with a control another task can use: `stop` ends the pass
    /// gracefully (nothing new starts, attempts in flight finish, the rest is handed back),
    /// `cancel` ends it at once. Dropping the future sets `cancel`.
    ///
    /// # Errors
    /// As [`Outbox::drain`]; [`OutboxError::Cancelled`] after a cancellation.
    pub async fn drain_with(
        &self,
        actor: impl Into<ActorId>,
        control: Arc<DrainControl>,
    ) -> Result<DrainOutcome, OutboxError> {
        let id = self.resolve(actor)?;
        // A pass of this actor cancelled a moment ago is still handing back: wait for it
        // rather than merge into a pass that is ending (see the `cancel` module).
        self.inner.winding.wait(&id).await;
        let (guard, done) = self.inner.winding.start(id.clone(), Arc::clone(&control));
        // The drain is a task of its own: dropping this future cancels it (the guard), and
        // the task still hands back and releases the slot.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let rt = Arc::clone(&self.inner.rt);
        let core = Arc::clone(self.inner.core());
        self.inner.rt.spawn(Box::pin(async move {
            let _done = done;
            let result = engine::drain(&rt, &core, &id, &control).await;
            let _ = tx.send(result);
            engine::drop_where_blocking(&*rt, core);
        }));
        let result = rx.await.unwrap_or(Err(OutboxError::ShuttingDown));
        guard.disarm();
        result
    }

    /// Asks for a drain of `actor` without waiting for it: a task runs it (or merges into
    /// the running pass, OL-12) and logs a failure. For request handlers that enqueue.
    pub fn request_drain(&self, actor: impl Into<ActorId>) {
        let ob = self.clone();
        let actor: ActorId = actor.into();
        self.inner.rt.spawn(Box::pin(async move {
            if let Err(e) = ob.drain(&actor).await {
                warn!(%actor, error = %e, "requested drain failed; the monitor retries");
            }
        }));
    }

    /// Status of every actor.
    ///
    /// # Errors
    /// A store failure.
    pub async fn status(&self) -> Result<Vec<ActorStatus>, OutboxError> {
        self.call(|core| core.status()).await
    }

    /// The lanes of an actor.
    ///
    /// # Errors
    /// A store failure, or an unknown actor.
    pub async fn lanes(&self, actor: impl Into<ActorId>) -> Result<Vec<LaneStatus>, OutboxError> {
        let actor: ActorId = actor.into();
        self.call(move |core| core.lanes(actor.as_str())).await
    }

    /// Dead letters, of one actor or all.
    ///
    /// The actor is an `Option<&str>`, not an `impl Into<ActorId>`, so that `None` needs no
    /// type: pass `Some(id.as_str())` for an [`ActorId`].
    ///
    /// # Errors
    /// A store failure, or an unknown actor.
    pub async fn dead_letters(&self, actor: Option<&str>) -> Result<Vec<DeadLetter>, OutboxError> {
        let actor = actor.map(str::to_owned);
        self.call(move |core| core.dead_letters(actor.as_deref()))
            .await
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
    pub async fn shutdown(&self) -> Stopped {
        engine::shutdown(&self.inner.rt, self.inner.core()).await
    }

    /// Stops at once, for a process about to exit (a second signal): nothing new starts,
    /// running passes are told to stop, the acks waiting are committed, and attempts in
    /// flight are not waited for — their units are delivered again later (at-least-once).
    pub async fn shutdown_now(&self) {
        let _ = self
            .call(|core| {
                core.abort();
                Ok(())
            })
            .await;
    }

    /// Starts a monitor draining every actor with work (OL-13): woken on enqueue (in this
    /// process and, through the store's watcher, in others), at the earliest lane
    /// `not_before`, and by a safety-net poll ([`OutboxConfig::poll_interval`]); passes of
    /// several actors at once, at most [`OutboxConfig::max_passes`].
    ///
    /// The monitor is the engine's ([`outbox_lanes_driver::engine`]): a task on the outbox's
    /// runtime; each pass is a task of its own (its rounds of store work on the blocking
    /// pool, its first four deliveries in flight on its own task, the others this outbox's
    /// tasks). It works the same on tokio, async-std and smol. A pass that only waits on
    /// attempts in flight does not count against `max_passes`. [`Monitor::stop`] stops it
    /// and the outbox ([`Outbox::shutdown`]); dropping it stops only the monitor, in the
    /// background.
    ///
    /// # Errors
    /// The store's cross-process watcher could not be started.
    pub async fn monitor(&self) -> Result<Monitor, OutboxError> {
        Monitor::start(Arc::clone(&self.inner.rt), Arc::clone(self.inner.core())).await
    }
}

#[cfg(all(test, feature = "tokio"))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use outbox_lanes_store::{SqliteOptions, SqliteStore};
    use outbox_lanes_test_support::Recipient;

    use super::*;

    /// The tokio runtime, counting what it is asked to spawn.
    #[derive(Debug)]
    struct Counting {
        inner: TokioRuntime,
        spawned: AtomicUsize,
    }

    impl Runtime for Counting {
        fn spawn(&self, future: BoxFuture<()>) {
            self.spawned.fetch_add(1, Ordering::SeqCst);
            self.inner.spawn(future);
        }
        fn spawn_blocking(&self, f: Box<dyn FnOnce() + Send + 'static>) {
            self.inner.spawn_blocking(f);
        }
        fn sleep(&self, duration: Duration) -> BoxFuture<()> {
            self.inner.sleep(duration)
        }
    }

    /// One lane's attempts run on its pass's task: 40 rows to one recipient are delivered in
    /// order with a handful of tasks in all (the pass, its drain), not a task per attempt.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_lanes_attempts_run_on_its_pass_task() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::open(dir.path().join("outbox.db"), SqliteOptions::default())
                .expect("open sqlite"),
        );
        let r = Recipient::start().expect("recipient");
        let to = vec![r.url("/one")];
        let rt = Arc::new(Counting {
            inner: TokioRuntime::current().expect("tokio"),
            spawned: AtomicUsize::new(0),
        });
        let config = OutboxConfig::default().allow_loopback();
        let http = AsyncHttpClient::new(config.http.clone(), None).expect("client");
        let outbox = Outbox::builder(Arc::clone(&store), config)
            .finish(Arc::clone(&rt) as Arc<dyn Runtime>, Transport::Async(http))
            .expect("outbox");
        let rows: Vec<NewRow> = (0..40)
            .map(|i| NewRow {
                id: format!("e{i}"),
                body: format!("{i}").into_bytes(),
                content_type: "text/plain".into(),
                recipients: to.clone(),
                ..NewRow::default()
            })
            .collect();
        outbox.enqueue("alice", &rows).await.expect("enqueue");
        let before = rt.spawned.load(Ordering::SeqCst);
        let out = outbox.drain("alice").await.expect("drain");
        let spawned = rt.spawned.load(Ordering::SeqCst) - before;
        assert!(
            matches!(out, DrainOutcome::Ran(ref r) if r.delivered == 40),
            "{out:?}"
        );
        let got: Vec<String> = r
            .bodies("/one")
            .into_iter()
            .map(|b| String::from_utf8(b).expect("utf-8"))
            .collect();
        let want: Vec<String> = (0..40).map(|i| i.to_string()).collect();
        assert_eq!(got, want, "in order, once each");
        assert!(
            spawned < 10,
            "{spawned} tasks spawned for 40 attempts of one lane"
        );
        outbox.shutdown().await;
    }
}
