//! The one module that talks to the outbox and its store.
//!
//! The binary runs on tokio with the async runtime's outbox (`outbox_lanes_tokio`): passes
//! and deliveries are tokio tasks (hyper), store calls run on tokio's blocking pool,
//! batched per round of a pass. The Postgres client owns a runtime of its own, so the store is
//! opened there too, and the outbox drops it there.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use anyhow::anyhow;

use super::UsageError;
use super::db_url::{db_url_secrets, is_postgres, mask_db_url_secrets};
use outbox_lanes_core::policy::AddressPolicy;
use outbox_lanes_core::{ActorId, DeadReason, LaneKey, Timestamp, UnitId};
use outbox_lanes_store::{
    ActorStatus, CommonOptions, DeadLetter, DeadLetterId, DeadLetterSelection, Enqueued,
    LaneStatus, NewRow, Payload, PendingHeads, PgOptions, PgStore, SchemaPolicy, SqliteOptions,
    SqliteStore, Store, StoreError,
};
use outbox_lanes_tokio::{
    Attempted, DeadLettered, Delivered, DrainControl, DrainOutcome, Hooks, LaneUnavailable,
    Monitor, Outbox, OutboxConfig, OutboxError, Signer, Started,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

/// Delivery latency buckets, in seconds.
const LATENCY: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Queue wait buckets, in seconds.
const QUEUE_WAIT: &[f64] = &[
    0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY.iter().copied())
}

/// How many hosts (origins) get series of their own in the per-host families: the first
/// this many that this process attempts; the attempts of every later one are counted under
/// [`OTHER_HOST`]. Chosen when a host is first seen, never moved afterwards, so that every
/// per-host counter only grows (a top-N picked at each scrape would move counts between
/// series, which `rate()` reads as resets).
pub(crate) const HOST_SERIES: usize = 50;

/// The `host` label of the hosts past [`HOST_SERIES`] (and of a recipient whose URL does not
/// parse): no origin is spelled so (an origin has a `://`).
pub(crate) const OTHER_HOST: &str = "other";

/// A per-host family's label set: `host`, and `outcome` for the attempts.
pub(crate) type HostLabels = Vec<(&'static str, String)>;

/// Per-host figures of this process (`outbox_lanes_host_*`), with prometheus-client's own
/// metric types: bounded to [`HOST_SERIES`] hosts plus [`OTHER_HOST`].
#[derive(Debug)]
pub(crate) struct HostFigures {
    /// The hosts with series of their own.
    named: Mutex<HashSet<String>>,
    /// Attempts finished, per host and outcome.
    pub(crate) attempts: Family<HostLabels, Counter>,
    /// Latency of the attempts that made a request (see [`sent`]), per host.
    pub(crate) latency: Family<HostLabels, Histogram, fn() -> Histogram>,
    /// Attempts in flight, per host.
    pub(crate) in_flight: Family<HostLabels, Gauge>,
}

impl Default for HostFigures {
    fn default() -> Self {
        HostFigures {
            named: Mutex::new(HashSet::new()),
            attempts: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            in_flight: Family::default(),
        }
    }
}

/// The origin of a recipient URL as `outbox_lanes_store::origin_of` spells it (`scheme://host:port`,
/// the port written out), read off a canonical URL (as the store keeps them) without parsing
/// it again: this runs twice per attempt. Anything else (user information, upper case, a
/// scheme other than `http`/`https`) goes through `origin_of`.
fn origin(url: &str) -> Option<String> {
    let fast = || {
        let (scheme, rest) = url.split_once("://")?;
        let default = match scheme {
            "https" => 443,
            "http" => 80,
            _ => return None,
        };
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        if authority.is_empty()
            || authority.contains('@')
            || authority.bytes().any(|b| b.is_ascii_uppercase())
        {
            return None;
        }
        let host_end = if authority.starts_with('[') {
            authority.find(']')? + 1
        } else {
            authority.find(':').unwrap_or(authority.len())
        };
        match &authority[host_end..] {
            "" => Some(format!("{scheme}://{authority}:{default}")),
            port => {
                let digits = port.strip_prefix(':')?;
                (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| format!("{scheme}://{authority}"))
            }
        }
    };
    fast().or_else(|| outbox_lanes_store::origin_of(url))
}

/// Whether an attempt of this outcome made a request (so its latency is a host's): the
/// others were decided before sending (refused address, not sent, deferred, held, set aside).
pub(crate) fn sent(outcome: &str) -> bool {
    matches!(
        outcome,
        "delivered" | "throttled" | "transient" | "permanent" | "gone"
    )
}

impl HostFigures {
    /// The `host` label of `recipient`: its origin while it has (or gets) a series of its
    /// own, else [`OTHER_HOST`].
    pub(crate) fn host(&self, recipient: &str) -> String {
        let Some(origin) = origin(recipient) else {
            return OTHER_HOST.to_owned();
        };
        let mut named = self.named.lock().unwrap_or_else(PoisonError::into_inner);
        if named.contains(&origin) {
            return origin;
        }
        if named.len() < HOST_SERIES {
            named.insert(origin.clone());
            return origin;
        }
        OTHER_HOST.to_owned()
    }

    pub(crate) fn started(&self, recipient: &str) {
        let labels = vec![("host", self.host(recipient))];
        self.in_flight.get_or_create(&labels).inc();
    }

    pub(crate) fn finished(&self, recipient: &str, outcome: &'static str, latency: Duration) {
        let host = self.host(recipient);
        let labels = vec![("host", host)];
        self.in_flight.get_or_create(&labels).dec();
        if sent(outcome) {
            self.latency
                .get_or_create(&labels)
                .observe(latency.as_secs_f64());
        }
        let mut labels = labels;
        labels.push(("outcome", outcome.to_owned()));
        self.attempts.get_or_create(&labels).inc();
    }
}

/// What the delivery hooks saw in this process.
#[derive(Debug)]
pub(crate) struct Counters {
    /// Recipients served.
    pub(crate) delivered: AtomicU64,
    /// Recipients dead-lettered.
    pub(crate) dead_lettered: AtomicU64,
    /// Attempts started (handed to the executor; the driver's `started` hook).
    pub(crate) started: AtomicU64,
    /// Attempts finished.
    pub(crate) finished: AtomicU64,
    /// The rest, under one lock (hooks run on pass threads, scrapes are rare).
    pub(crate) detail: Mutex<Detail>,
    /// Attempt latency (payload read and HTTP exchange), every attempt.
    pub(crate) latency: Histogram,
    /// Enqueue to the start of the attempt that delivered.
    pub(crate) queue_wait: Histogram,
    /// Per-host figures.
    pub(crate) hosts: HostFigures,
    /// `relay --on-dead-letter`: where the dead-letter hook also sends each dead letter.
    pub(crate) on_dead_letter: OnceLock<super::on_dead::Sink>,
    /// Delivering without `--allow-private-destinations`: the lanes (actor, recipient)
    /// already warned about for a refused address the flag would allow.
    private_refused: OnceLock<Mutex<HashSet<(String, String)>>>,
}

/// Labelled counters.
#[derive(Debug)]
pub(crate) struct Detail {
    /// Dead letters by reason code.
    pub(crate) dead_by_reason: BTreeMap<&'static str, u64>,
    /// Recipients served, by actor.
    pub(crate) delivered_by_actor: BTreeMap<String, u64>,
    /// Lanes found unavailable (once per run of failures), by actor.
    pub(crate) unavailable_by_actor: BTreeMap<String, u64>,
    /// Attempts by outcome.
    pub(crate) attempts: BTreeMap<&'static str, u64>,
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
                unavailable_by_actor: BTreeMap::new(),
                attempts: BTreeMap::new(),
            }),
            latency: latency_histogram(),
            queue_wait: Histogram::new(QUEUE_WAIT.iter().copied()),
            hosts: HostFigures::default(),
            on_dead_letter: OnceLock::new(),
            private_refused: OnceLock::new(),
        }
    }
}

impl Counters {
    /// Attempts in flight: handed to a worker and not yet finished.
    pub(crate) fn in_flight(&self) -> u64 {
        self.started
            .load(Ordering::Relaxed)
            .saturating_sub(self.finished.load(Ordering::Relaxed))
    }

    /// Warns, once per lane, of a unit dead-lettered `destination_refused` for an address
    /// that `--allow-private-destinations` allows (set when delivering without it).
    pub(crate) fn warn_private_refusals(&self) {
        let _ = self.private_refused.set(Mutex::new(HashSet::new()));
    }

    /// The WARN of [`Counters::warn_private_refusals`], for `d` if it is such a refusal and
    /// its lane was not warned about yet.
    fn private_refusal(&self, d: &DeadLettered) {
        let Some(seen) = self.private_refused.get() else {
            return;
        };
        if d.reason != DeadReason::DestinationRefused {
            return;
        }
        // `destination_refused: <address> is <class>` (the HTTP policy's refusal message).
        let Some((addr, class)) = d
            .error
            .as_deref()
            .and_then(|e| e.strip_prefix("destination_refused: "))
            .and_then(|e| e.split_once(" is "))
        else {
            return;
        };
        let Ok(ip) = addr.parse::<std::net::IpAddr>() else {
            return;
        };
        if super::address_policy(true).check(ip).is_err() {
            // Refused with the flag too (link-local, cloud metadata): nothing to suggest.
            return;
        }
        let first = seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((d.actor.as_str().to_owned(), d.recipient.clone()));
        if first {
            tracing::warn!(
                actor = %d.actor,
                recipient = %d.recipient,
                address = addr,
                class,
                "this lane's units are dead-lettered destination_refused: its recipient is a {class} address, which is delivered to only with --allow-private-destinations or while the outbox's destination policy allows it (`outbox-lanes destinations` shows it: an operator may have narrowed it since these units were enqueued); widen it with `outbox-lanes destinations set private` or restart with the flag, and run `dead-letters replay --reason destination_refused` (said once per lane)"
            );
        }
    }

    /// The detail, even if a hook panicked while holding it.
    pub(crate) fn detail(&self) -> std::sync::MutexGuard<'_, Detail> {
        self.detail.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn hooks(self: &Arc<Self>) -> Hooks {
        let on_delivered = Arc::clone(self);
        let on_dead = Arc::clone(self);
        let on_attempt = Arc::clone(self);
        let on_start = Arc::clone(self);
        let on_unavailable = Arc::clone(self);
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
                on_dead.private_refusal(d);
                *on_dead
                    .detail()
                    .dead_by_reason
                    .entry(d.reason.as_str())
                    .or_default() += 1;
                if let Some(sink) = on_dead.on_dead_letter.get() {
                    sink.send(d);
                }
            })),
            attempted: Some(Box::new(move |a: &Attempted| {
                on_attempt.finished.fetch_add(1, Ordering::Relaxed);
                let outcome = a.outcome.as_str();
                *on_attempt.detail().attempts.entry(outcome).or_default() += 1;
                on_attempt.latency.observe(a.latency.as_secs_f64());
                if a.outcome.is_delivered() {
                    on_attempt.queue_wait.observe(a.queued.as_secs_f64());
                }
                on_attempt.hosts.finished(&a.recipient, outcome, a.latency);
            })),
            started: Some(Box::new(move |s: &Started<'_>| {
                on_start.started.fetch_add(1, Ordering::Relaxed);
                on_start.hosts.started(s.recipient);
            })),
            lane_unavailable: Some(Box::new(move |l: &LaneUnavailable| {
                *on_unavailable
                    .detail()
                    .unavailable_by_actor
                    .entry(l.actor.as_str().to_owned())
                    .or_default() += 1;
            })),
        }
    }
}

/// Why the database could not be opened: the caller's input (exit 2) if it names what cannot
/// be opened, a failure at run time (exit 1) if the database is locked, full or unreachable
/// mid-way (see [`OpenError::is_input`]).
///
/// Its text has the secrets of the database URL masked (the store masks the userinfo
/// password, not a `?password=` parameter); the store's error is not its source, only that
/// error's cause, so that no chain of errors prints the URL unmasked.
pub(crate) struct OpenError {
    error: StoreError,
    text: String,
}

impl OpenError {
    /// `error`, from opening `db`.
    fn new(error: StoreError, db: &str) -> OpenError {
        let text = mask_db_url_secrets(&error.to_string(), &db_url_secrets(db));
        OpenError { error, text }
    }

    /// Whether the caller's input is at fault (a path, URL or schema that cannot be an outbox)
    /// rather than the database at run time (locked, full, connection lost).
    pub(crate) fn is_input(&self) -> bool {
        matches!(
            self.error,
            StoreError::Open { .. }
                | StoreError::ReadOnly { .. }
                | StoreError::SchemaTooNew { .. }
                | StoreError::SchemaTooOld { .. }
                | StoreError::NoSchema { .. }
        )
    }
}

impl std::fmt::Debug for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("OpenError").field(&self.text).finish()
    }
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

/// What an operator does to one lane (`outbox-lanes lanes <action>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LaneOp {
    /// Stop claiming the lane, with this reason.
    Pause(String),
    /// Claim it again.
    Resume,
    /// Clear its backoff (and a strict block): the head is attempted at once.
    Retry,
    /// Strict mode on or off.
    Strict(bool),
    /// Dead-letter every pending unit.
    Purge,
    /// Dead-letter the head, lift a strict block.
    SkipHead,
}

/// What a [`LaneOp`] did.
#[derive(Debug, Default)]
pub(crate) struct LaneOpDone {
    /// The lane afterwards (`None` if nothing is left of it to list).
    pub(crate) lane: Option<LaneStatus>,
    /// Units dead-lettered (purge, skip-head).
    pub(crate) dead_lettered: u64,
    /// The unit skip-head set aside.
    pub(crate) skipped: Option<UnitId>,
}

/// Runs `f` on tokio's blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| anyhow!("a blocking task failed: {e}"))
}

/// What a command may do to the database, least first: what it opens the store with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// `status`, `lanes` (a listing), `dead-letters list|show`: reads only. A SQLite file is
    /// opened read-only; no DDL runs (the schema must be current).
    Read,
    /// `drain`, the lane actions, `dead-letters replay|purge`: writes rows, runs no DDL.
    Write,
    /// `enqueue`, `relay`: writes rows, and creates the schema in a database that has none
    /// (the embedded default just works); never upgrades one.
    Create,
    /// `migrate`: creates or upgrades the schema.
    Migrate,
}

impl Access {
    /// The store's schema policy for it.
    fn policy(self) -> SchemaPolicy {
        match self {
            Access::Read | Access::Write => SchemaPolicy::Existing,
            Access::Create => SchemaPolicy::Create,
            Access::Migrate => SchemaPolicy::Migrate,
        }
    }

    /// Whether it may create an outbox where there is none.
    fn creates(self) -> bool {
        matches!(self, Access::Create | Access::Migrate)
    }
}

/// The async runtime's outbox over the chosen store. Cheap to clone; [`Backend::close`]
/// shuts it down.
///
/// The outbox runs its store calls on tokio's blocking pool and drops the store there (the
/// Postgres client must not be dropped on an async thread), whichever clone goes last. The
/// few store calls it has no method for (replay, purge, actors with work) go through
/// [`blocking`] here, the same way.
#[derive(Clone)]
pub(crate) struct Backend {
    outbox: Outbox,
}

impl Backend {
    /// Deliveries in flight at once (`--concurrency`).
    pub(crate) fn concurrency(&self) -> usize {
        self.outbox.core().config().concurrency
    }

    /// How long a stop lets what runs finish (`--shutdown-grace`).
    pub(crate) fn shutdown_grace(&self) -> Duration {
        self.outbox.core().config().shutdown_grace
    }

    /// Opens the store named by `db` and an outbox over it, delivering as tokio tasks, with
    /// what `access` allows (see [`Access`]).
    ///
    /// # Errors
    /// [`OpenError`] if the database cannot be opened or created; anything else is a runtime
    /// failure. A database or schema without an outbox is a [`UsageError`] unless `access`
    /// may create one, and nothing is created.
    pub(crate) async fn open(
        db: String,
        pg_schema: String,
        access: Access,
        common: CommonOptions,
        config: OutboxConfig,
        signer: Option<Arc<dyn Signer>>,
        counters: Arc<Counters>,
    ) -> anyhow::Result<Backend> {
        // On the blocking pool (still on this runtime, which the outbox delivers on): the
        // Postgres client connects with a runtime of its own, and a store that fails to
        // become an outbox is dropped here too.
        blocking(move || -> anyhow::Result<Backend> {
            const CREATE: &str = "run `outbox-lanes migrate` (or enqueue) to create it";
            let common = CommonOptions {
                schema: access.policy(),
                ..common
            };
            let store: Arc<dyn Store> = if is_postgres(&db) {
                let opts = PgOptions {
                    schema: pg_schema,
                    application_name: "outbox-lanes-cli".into(),
                    common,
                    ..PgOptions::default()
                };
                if !access.creates()
                    && !PgStore::exists(&db, &opts).map_err(|e| OpenError::new(e, &db))?
                {
                    return Err(UsageError(format!(
                        "no outbox in Postgres schema {:?} (--pg-schema); {CREATE}",
                        opts.schema
                    ))
                    .into());
                }
                Arc::new(PgStore::connect(&db, opts).map_err(|e| OpenError::new(e, &db))?)
            } else {
                if !access.creates()
                    && !SqliteStore::exists(&db).map_err(|e| OpenError::new(e, &db))?
                {
                    return Err(UsageError(format!("no outbox at {db}; {CREATE}")).into());
                }
                let opts = SqliteOptions {
                    common,
                    ..SqliteOptions::default()
                };
                Arc::new(
                    if access == Access::Read {
                        SqliteStore::open_read_only(&db, opts)
                    } else {
                        SqliteStore::open(&db, opts)
                    }
                    .map_err(|e| OpenError::new(e, &db))?,
                )
            };
            let mut builder = Outbox::builder(store, config).hooks(counters.hooks());
            if let Some(signer) = signer {
                builder = builder.signer(signer);
            }
            let outbox = builder.open()?;
            Ok(Backend { outbox })
        })
        .await?
    }

    /// The schema version of the outbox at `db` before anything opens it (`None`: no outbox).
    pub(crate) async fn schema_version(
        db: String,
        pg_schema: String,
    ) -> anyhow::Result<Option<u32>> {
        blocking(move || {
            if is_postgres(&db) {
                let opts = PgOptions {
                    schema: pg_schema,
                    application_name: "outbox-lanes-cli".into(),
                    ..PgOptions::default()
                };
                PgStore::schema_version(&db, &opts).map_err(|e| OpenError::new(e, &db).into())
            } else {
                SqliteStore::schema_version(&db).map_err(|e| OpenError::new(e, &db).into())
            }
        })
        .await?
    }

    /// The store's outbox id.
    pub(crate) fn outbox_id(&self) -> String {
        self.outbox.store().outbox_id().to_owned()
    }

    /// Enqueues `rows` for `actor` in one transaction.
    pub(crate) async fn enqueue(
        &self,
        actor: &str,
        rows: &[NewRow],
    ) -> Result<Vec<Enqueued>, OutboxError> {
        self.outbox.enqueue(actor, rows).await
    }

    /// Runs passes of `actor` until nothing is admissible (or `control` stops it).
    ///
    /// Cancellation-safe: dropping the future cancels the pass, which hands every
    /// unfinished unit back.
    pub(crate) async fn drain(
        &self,
        actor: String,
        control: Arc<DrainControl>,
    ) -> Result<DrainOutcome, OutboxError> {
        self.outbox.drain_with(&actor, control).await
    }

    /// Actors with work admissible now.
    pub(crate) async fn actors_ready(&self) -> anyhow::Result<Vec<ActorId>> {
        let store = Arc::clone(self.outbox.store());
        let due = blocking(move || {
            store.actors_with_work(Timestamp::from_system_time(SystemTime::now()))
        })
        .await??;
        Ok(due.ready)
    }

    /// Every actor at a glance.
    pub(crate) async fn status(&self) -> anyhow::Result<Vec<ActorStatus>> {
        Ok(self.outbox.status().await?)
    }

    /// An actor's lanes.
    pub(crate) async fn lanes(&self, actor: String) -> anyhow::Result<Vec<LaneStatus>> {
        Ok(self.outbox.lanes(&actor).await?)
    }

    /// Whether the outbox has seen `actor` (it enqueued at least once), spelled as every
    /// command takes it (the outbox's resolver: surrounding spaces do not count).
    pub(crate) async fn knows_actor(&self, actor: String) -> anyhow::Result<bool> {
        let id = match self.outbox.resolve(&actor) {
            Ok(id) => id,
            Err(OutboxError::UnknownActor(_)) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let store = Arc::clone(self.outbox.store());
        Ok(blocking(move || store.knows_actor(&id)).await??)
    }

    /// Applies an operator's `op` to the lane of `actor` keyed `key`, and returns the lane as
    /// it is afterwards.
    ///
    /// # Errors
    /// A [`UsageError`] if the actor has no such lane; database failures.
    pub(crate) async fn lane_op(
        &self,
        actor: String,
        key: LaneKey,
        op: LaneOp,
    ) -> anyhow::Result<LaneOpDone> {
        let store = Arc::clone(self.outbox.store());
        let id = self.outbox.resolve(&actor)?;
        blocking(move || -> anyhow::Result<LaneOpDone> {
            let Some(lane) = store.find_lane(&id, &key)? else {
                let ok = key
                    .ordering_key()
                    .map(|k| format!(" and ordering key {k:?}"))
                    .unwrap_or_default();
                return Err(UsageError(format!(
                    "actor {actor:?} has no lane to {}{ok}; `outbox-lanes lanes --actor {actor}` \
                     lists its lanes",
                    key.recipient()
                ))
                .into());
            };
            let at = Timestamp::from_system_time(SystemTime::now());
            let mut done = LaneOpDone::default();
            match op {
                LaneOp::Pause(ref reason) => store.pause_lane(lane, reason)?,
                LaneOp::Resume => store.resume_lane(lane)?,
                LaneOp::Retry => store.retry_lane_now(lane)?,
                LaneOp::Strict(strict) => store.set_lane_strict(lane, strict)?,
                LaneOp::Purge => done.dead_lettered = store.purge_lane(lane, at)?,
                LaneOp::SkipHead => {
                    done.skipped = store.skip_lane_head(lane, at)?;
                    done.dead_lettered = u64::from(done.skipped.is_some());
                }
            }
            // Wake a relay in this process; others see the commit through their watcher.
            store.notifier().notify();
            done.lane = store.lane_status(lane)?;
            Ok(done)
        })
        .await?
    }

    /// Every host with a row or a lane (`hosts`).
    pub(crate) async fn host_list(&self) -> anyhow::Result<Vec<outbox_lanes_store::HostStatus>> {
        let store = Arc::clone(self.outbox.store());
        blocking(move || Ok(store.host_list()?)).await?
    }

    /// Per-host figures from the delivery log since `since` (`hosts`); `None` when this
    /// outbox keeps no log (`--delivery-log-retention 0s`).
    pub(crate) async fn host_figures(
        &self,
        since: Timestamp,
    ) -> anyhow::Result<Option<Vec<outbox_lanes_store::HostFigures>>> {
        let store = Arc::clone(self.outbox.store());
        blocking(move || {
            if !store.logs_deliveries() {
                return Ok(None);
            }
            Ok(Some(store.host_figures(since)?))
        })
        .await?
    }

    /// `hosts block|unblock`: how many lanes or units it changed.
    pub(crate) async fn host_block(
        &self,
        origin: String,
        block: outbox_lanes_store::HostBlock,
    ) -> anyhow::Result<u64> {
        let store = Arc::clone(self.outbox.store());
        blocking(move || {
            let at = Timestamp::from_system_time(SystemTime::now());
            let n = store.block_host(&origin, block, at)?;
            store.notifier().notify();
            Ok(n)
        })
        .await?
    }

    /// `hosts retry`: how many waiting lanes came back.
    pub(crate) async fn host_retry(&self, origin: String) -> anyhow::Result<u64> {
        let store = Arc::clone(self.outbox.store());
        blocking(move || {
            let at = Timestamp::from_system_time(SystemTime::now());
            let n = store.retry_host(&origin, at)?;
            store.notifier().notify();
            Ok(n)
        })
        .await?
    }

    /// The outbox's destination policy (`destinations`, OL-24).
    pub(crate) async fn destination_policy(&self) -> anyhow::Result<AddressPolicy> {
        let store = Arc::clone(self.outbox.store());
        Ok(blocking(move || store.destination_policy()).await??)
    }

    /// `destinations set`: the operator's policy, narrower or wider; what it changed.
    pub(crate) async fn set_destination_policy(
        &self,
        policy: AddressPolicy,
    ) -> anyhow::Result<outbox_lanes_store::PolicyChange> {
        let store = Arc::clone(self.outbox.store());
        Ok(blocking(move || store.set_destination_policy(policy)).await??)
    }

    /// Dead letters of one actor or all.
    pub(crate) async fn dead_letters(
        &self,
        actor: Option<String>,
    ) -> anyhow::Result<Vec<DeadLetter>> {
        Ok(self.outbox.dead_letters(actor.as_deref()).await?)
    }

    /// The dead letters a selection names, as the store selects them.
    pub(crate) async fn select_dead_letters(
        &self,
        which: DeadLetterSelection,
    ) -> anyhow::Result<Vec<DeadLetter>> {
        let store = Arc::clone(self.outbox.store());
        Ok(blocking(move || store.select_dead_letters(&which)).await??)
    }

    /// Replays dead letters; returns the units re-enqueued.
    pub(crate) async fn replay(
        &self,
        which: Vec<DeadLetterSelection>,
    ) -> anyhow::Result<Vec<UnitId>> {
        let store = Arc::clone(self.outbox.store());
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
        let store = Arc::clone(self.outbox.store());
        blocking(move || {
            let mut n = 0;
            for w in &which {
                n += store.purge_dead_letters(w)?;
            }
            Ok(n)
        })
        .await?
    }

    /// The store, for reads a command runs on the blocking pool itself (`rows.rs`).
    pub(crate) fn store(&self) -> Arc<dyn Store> {
        Arc::clone(self.outbox.store())
    }

    /// A dead letter's payload.
    pub(crate) async fn dead_letter_payload(&self, id: DeadLetterId) -> anyhow::Result<Payload> {
        let store = Arc::clone(self.outbox.store());
        Ok(blocking(move || store.dead_letter_payload(id)).await??)
    }

    /// Per actor and lane hold at `now`, the lanes with pending units and their oldest head
    /// (the lag metric and the held lanes).
    pub(crate) async fn pending_heads(&self, now: Timestamp) -> anyhow::Result<Vec<PendingHeads>> {
        let store = Arc::clone(self.outbox.store());
        Ok(blocking(move || store.pending_heads(now)).await??)
    }

    /// Whether the store answers a query: one probe of the lanes' unique index (for an empty
    /// actor and recipient; what it finds does not matter), the cheapest read of a table;
    /// and whether its database file is still the one at its path (a SQLite file removed or
    /// replaced since it was opened: the monitor stopped claiming).
    pub(crate) async fn ready(&self) -> anyhow::Result<()> {
        let store = Arc::clone(self.outbox.store());
        blocking(move || {
            store.check_database()?;
            let key = LaneKey::from_canonical(String::new(), None);
            store.find_lane(&ActorId::new(""), &key).map(drop)
        })
        .await??;
        Ok(())
    }

    /// Starts the monitor.
    pub(crate) async fn start_monitor(&self) -> anyhow::Result<Relay> {
        let monitor = self.outbox.monitor().await?;
        Ok(Relay { monitor })
    }

    /// Stops the outbox gracefully: running passes hand back what they did not start,
    /// delivery tasks in flight finish (within the HTTP timeout) and acks are flushed. The
    /// store goes with the last clone, on the blocking pool.
    pub(crate) async fn close(self) {
        self.outbox.shutdown().await;
    }

    /// Stops at once (a second signal, or a grace that ended): commits the acks waiting and
    /// does not wait for attempts in flight; their units are delivered again later.
    pub(crate) async fn close_now(self) {
        self.outbox.shutdown_now().await;
    }
}

/// A running monitor.
pub(crate) struct Relay {
    monitor: Monitor,
}

impl Relay {
    /// Stops the monitor: passes stop starting units, attempts in flight finish, the rest
    /// is handed back.
    /// Whether a pass's grace ended with attempts in flight (handed back unanswered), and
    /// how many, in its [`Stopped`](outbox_lanes_tokio::Stopped).
    pub(crate) async fn stop(self) -> outbox_lanes_tokio::Stopped {
        self.monitor.stop().await
    }

    /// Completes when the monitor stopped by itself: its database file was removed or
    /// replaced (logged at ERROR); see `Monitor::ended`. Cancellation-safe.
    pub(crate) async fn ended(&mut self) -> StoreError {
        self.monitor.ended().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-host label's origin is the store's, read faster.
    #[test]
    fn origin_is_the_stores() {
        for url in [
            "https://b.example/inbox",
            "https://b.example",
            "https://b.example?x=1",
            "http://127.0.0.1:8080/x/y",
            "http://h.example:80/",
            "https://[::1]/a",
            "https://[::1]:8443/a",
            "https://xn--bcher-kva.example/inbox",
            "https://B.Example:443/x",
            "https://user:pw@b.example/x",
            "https://b.example:/x",
            "ftp://b.example/x",
            "not a url",
        ] {
            assert_eq!(origin(url), outbox_lanes_store::origin_of(url), "{url}");
        }
    }
}
