//! The one module that talks to the outbox and its store.
//!
//! The binary runs on tokio; the outbox it drives today is the blocking runtime's, so every
//! call goes through `spawn_blocking` here and nowhere else. The Postgres client owns a
//! runtime of its own, so the store is also opened and dropped on a blocking thread. Moving
//! to the async runtime's `Outbox` changes this module only.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use anyhow::anyhow;
use outbox_lanes_blocking::pass::{Executor, Job};
use outbox_lanes_blocking::{
    Attempted, DeadLettered, Delivered, DrainControl, DrainOutcome, Hooks, HttpClient, Monitor,
    Outbox, OutboxConfig, OutboxError, ThreadPool,
};
use outbox_lanes_core::{ActorId, Outcome, Timestamp, UnitId};
use outbox_lanes_store::{
    ActorStatus, DeadLetter, DeadLetterSelection, Enqueued, LaneStatus, NewRow, PgOptions, PgStore,
    SqliteOptions, SqliteStore, Store, StoreError,
};

/// A Prometheus histogram: cumulative counts per upper bound, a sum and a count.
#[derive(Debug)]
pub(crate) struct Histogram {
    /// Upper bounds in seconds, ascending (`+Inf` is implied).
    pub(crate) bounds: &'static [f64],
    /// Observations at or below each bound (not cumulative; summed when rendered).
    pub(crate) counts: Vec<u64>,
    /// Observations above the last bound.
    pub(crate) over: u64,
    /// Sum of the observations in seconds.
    pub(crate) sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            over: 0,
            sum: 0.0,
        }
    }

    fn observe(&mut self, d: Duration) {
        let secs = d.as_secs_f64();
        self.sum += secs;
        match self.bounds.iter().position(|&b| secs <= b) {
            Some(i) => self.counts[i] += 1,
            None => self.over += 1,
        }
    }
}

/// Delivery latency buckets, in seconds.
const LATENCY: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Queue wait buckets, in seconds.
const QUEUE_WAIT: &[f64] = &[
    0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0,
];

/// What the delivery hooks saw in this process.
#[derive(Debug)]
pub(crate) struct Counters {
    /// Recipients served.
    pub(crate) delivered: AtomicU64,
    /// Recipients dead-lettered.
    pub(crate) dead_lettered: AtomicU64,
    /// Attempts handed to the delivery workers.
    pub(crate) started: AtomicU64,
    /// Attempts finished.
    pub(crate) finished: AtomicU64,
    /// The rest, under one lock (hooks run on pass threads, scrapes are rare).
    pub(crate) detail: Mutex<Detail>,
}

/// Labelled counters and histograms.
#[derive(Debug)]
pub(crate) struct Detail {
    /// Dead letters by reason code.
    pub(crate) dead_by_reason: BTreeMap<&'static str, u64>,
    /// Recipients served, by actor.
    pub(crate) delivered_by_actor: BTreeMap<String, u64>,
    /// Attempts by outcome.
    pub(crate) attempts: BTreeMap<&'static str, u64>,
    /// Attempt latency (payload read and HTTP exchange), every attempt.
    pub(crate) latency: Histogram,
    /// Enqueue to the start of the attempt that delivered.
    pub(crate) queue_wait: Histogram,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            delivered: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            started: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            detail: Mutex::new(Detail {
                dead_by_reason: BTreeMap::new(),
                delivered_by_actor: BTreeMap::new(),
                attempts: BTreeMap::new(),
                latency: Histogram::new(LATENCY),
                queue_wait: Histogram::new(QUEUE_WAIT),
            }),
        }
    }
}

fn outcome_label(o: &Outcome) -> &'static str {
    match o {
        Outcome::Delivered => "delivered",
        Outcome::Throttled { .. } => "throttled",
        Outcome::Transient { .. } => "transient",
        Outcome::Permanent => "permanent",
        Outcome::Gone => "gone",
        Outcome::Refused => "refused",
    }
}

impl Counters {
    /// Attempts in flight: handed to a worker and not yet finished.
    pub(crate) fn in_flight(&self) -> u64 {
        self.started
            .load(Ordering::Relaxed)
            .saturating_sub(self.finished.load(Ordering::Relaxed))
    }

    /// The detail, even if a hook panicked while holding it.
    pub(crate) fn detail(&self) -> std::sync::MutexGuard<'_, Detail> {
        self.detail.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn hooks(self: &Arc<Self>) -> Hooks {
        let on_delivered = Arc::clone(self);
        let on_dead = Arc::clone(self);
        let on_attempt = Arc::clone(self);
        Hooks {
            delivered: Some(Box::new(move |d: &Delivered| {
                on_delivered.delivered.fetch_add(1, Ordering::Relaxed);
                *on_delivered
                    .detail()
                    .delivered_by_actor
                    .entry(d.actor.as_str().to_owned())
                    .or_default() += 1;
            })),
            dead_lettered: Some(Box::new(move |d: &DeadLettered| {
                on_dead.dead_lettered.fetch_add(1, Ordering::Relaxed);
                *on_dead
                    .detail()
                    .dead_by_reason
                    .entry(d.reason.as_str())
                    .or_default() += 1;
            })),
            attempted: Some(Box::new(move |a: &Attempted| {
                on_attempt.finished.fetch_add(1, Ordering::Relaxed);
                let mut d = on_attempt.detail();
                *d.attempts.entry(outcome_label(&a.outcome)).or_default() += 1;
                d.latency.observe(a.latency);
                if a.outcome.is_delivered() {
                    d.queue_wait.observe(a.queued);
                }
            })),
        }
    }
}

/// The blocking runtime's worker pool, counting the attempts handed to it.
struct Counting {
    pool: ThreadPool,
    counters: Arc<Counters>,
}

impl Executor for Counting {
    fn execute(&self, job: Job) -> Result<(), Job> {
        self.pool.execute(job)?;
        self.counters.started.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn shutdown(&self) {
        self.pool.shutdown();
    }
}

/// Why the database could not be opened: the caller's input (exit 2).
#[derive(Debug)]
pub(crate) struct OpenError(pub(crate) StoreError);

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for OpenError {}

/// Runs `f` on tokio's blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| anyhow!("a blocking task failed: {e}"))
}

/// Whether `db` names a Postgres database rather than a SQLite file.
pub(crate) fn is_postgres(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

/// The outbox and its store.
struct Handles {
    outbox: Outbox,
    store: Arc<dyn Store>,
}

/// Owns the handles; whoever drops the last clone of a [`Backend`] on an async thread hands
/// them to a plain thread, because the Postgres client must not be dropped on one.
struct Owned(Option<Handles>);

impl Drop for Owned {
    fn drop(&mut self) {
        let Some(h) = self.0.take() else { return };
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        if let Err(e) = std::thread::Builder::new()
            .name("outbox-lanes-drop".into())
            .spawn(move || drop(h))
        {
            tracing::warn!(error = %e, "cannot start a thread to close the store");
        }
    }
}

/// The outbox over the chosen store. Cheap to clone; [`Backend::close`] shuts it down.
#[derive(Clone)]
pub(crate) struct Backend {
    inner: Arc<Owned>,
}

impl Backend {
    /// Opens the store named by `db` and an outbox over it.
    ///
    /// # Errors
    /// [`OpenError`] if the database cannot be opened or created; anything else is a runtime
    /// failure.
    pub(crate) async fn open(
        db: String,
        pg_schema: String,
        config: OutboxConfig,
        counters: Arc<Counters>,
    ) -> anyhow::Result<Backend> {
        blocking(move || -> anyhow::Result<Backend> {
            let store: Arc<dyn Store> = if is_postgres(&db) {
                let opts = PgOptions {
                    schema: pg_schema,
                    application_name: "outbox-lanes-cli".into(),
                    ..PgOptions::default()
                };
                Arc::new(PgStore::connect(&db, opts).map_err(OpenError)?)
            } else {
                Arc::new(SqliteStore::open(&db, SqliteOptions::default()).map_err(OpenError)?)
            };
            let http = HttpClient::new(config.http.clone(), None)
                .map_err(|e| anyhow!("HTTP client: {e}"))?;
            let pool = ThreadPool::start(Arc::clone(&store), http, config.concurrency)?;
            let executor = Counting {
                pool,
                counters: Arc::clone(&counters),
            };
            let outbox = Outbox::builder(Arc::clone(&store), config)
                .executor(Arc::new(executor))
                .hooks(counters.hooks())
                .open()?;
            Ok(Backend {
                inner: Arc::new(Owned(Some(Handles { outbox, store }))),
            })
        })
        .await?
    }

    /// Enqueues `rows` for `actor` in one transaction.
    pub(crate) async fn enqueue(
        &self,
        actor: String,
        rows: Vec<NewRow>,
    ) -> anyhow::Result<Result<Vec<Enqueued>, OutboxError>> {
        let outbox = self.h().outbox.clone();
        blocking(move || outbox.enqueue(&actor, &rows)).await
    }

    /// Runs passes of `actor` until nothing is admissible (or `control` stops it).
    pub(crate) async fn drain(
        &self,
        actor: String,
        control: Arc<DrainControl>,
    ) -> anyhow::Result<Result<DrainOutcome, OutboxError>> {
        let outbox = self.h().outbox.clone();
        blocking(move || outbox.drain_with(&actor, &control)).await
    }

    /// Actors with work admissible now.
    pub(crate) async fn actors_ready(&self) -> anyhow::Result<Vec<ActorId>> {
        let store = Arc::clone(&self.h().store);
        let due = blocking(move || {
            store.actors_with_work(Timestamp::from_system_time(SystemTime::now()))
        })
        .await??;
        Ok(due.ready)
    }

    /// Every actor at a glance.
    pub(crate) async fn status(&self) -> anyhow::Result<Vec<ActorStatus>> {
        let outbox = self.h().outbox.clone();
        Ok(blocking(move || outbox.status()).await??)
    }

    /// An actor's lanes.
    pub(crate) async fn lanes(&self, actor: String) -> anyhow::Result<Vec<LaneStatus>> {
        let outbox = self.h().outbox.clone();
        Ok(blocking(move || outbox.lanes(&actor)).await??)
    }

    /// Dead letters of one actor or all.
    pub(crate) async fn dead_letters(
        &self,
        actor: Option<String>,
    ) -> anyhow::Result<Vec<DeadLetter>> {
        let outbox = self.h().outbox.clone();
        Ok(blocking(move || outbox.dead_letters(actor.as_deref())).await??)
    }

    /// Replays dead letters; returns the units re-enqueued.
    pub(crate) async fn replay(
        &self,
        which: Vec<DeadLetterSelection>,
    ) -> anyhow::Result<Vec<UnitId>> {
        let store = Arc::clone(&self.h().store);
        blocking(move || {
            let mut units = Vec::new();
            for w in &which {
                units.extend(store.replay_dead_letters(w)?);
            }
            // Wake a relay in this process; others see the commit through their watcher.
            store.notifier().notify();
            Ok(units)
        })
        .await?
    }

    /// Purges dead letters; returns how many.
    pub(crate) async fn purge(&self, which: Vec<DeadLetterSelection>) -> anyhow::Result<u64> {
        let store = Arc::clone(&self.h().store);
        blocking(move || {
            let mut n = 0;
            for w in &which {
                n += store.purge_dead_letters(w)?;
            }
            Ok(n)
        })
        .await?
    }

    /// Starts the monitor.
    pub(crate) async fn start_monitor(&self) -> anyhow::Result<Relay> {
        let outbox = self.h().outbox.clone();
        let monitor = blocking(move || outbox.monitor()).await??;
        Ok(Relay { monitor })
    }

    fn h(&self) -> &Handles {
        self.inner
            .0
            .as_ref()
            .expect("the handles are taken only when the last clone drops")
    }

    /// Stops the outbox gracefully (attempts in flight finish, acks are flushed) and drops
    /// the store off the async executor.
    pub(crate) async fn close(self) -> anyhow::Result<()> {
        blocking(move || {
            let inner = self.inner;
            if let Some(h) = inner.0.as_ref() {
                h.outbox.shutdown();
            }
            // The last clone drops here, on a blocking thread: Owned::drop takes the
            // handles and spawns a thread to drop them, so take them first when we can.
            if let Ok(mut owned) = Arc::try_unwrap(inner) {
                drop(owned.0.take());
            }
        })
        .await
    }
}

/// A running monitor.
pub(crate) struct Relay {
    monitor: Monitor,
}

impl Relay {
    /// Stops the monitor: passes stop starting units, attempts in flight finish, the rest
    /// is handed back.
    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        blocking(move || self.monitor.stop()).await
    }
}
