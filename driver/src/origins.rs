//! Hosts (origins: scheme, host and port) as every lane and actor of a process sees them, and
//! through the store every relay on the database: connection health, the HTTP signature
//! scheme each accepted, and the operator's blocks (design.md, OL-21).
//!
//! # Origin health
//!
//! A connection-level failure — refused, reset or closed before an answer, name resolution,
//! TLS handshake, connect timeout — says the host is down, not that one recipient refused one
//! unit. So it is counted per origin, across lanes and actors, by [`OriginGate`], the
//! outermost [`Executor`] of an outbox:
//!
//! - An origin that has not answered yet in this process, or whose last attempts failed at the
//!   connection level, takes at most [`OriginConfig::first_contact`] (10) attempts in flight;
//!   the others wait in the origin's queue (holding no worker) for an answer. A host that
//!   answers is then open to every lane at once; a dead one with 200 lanes is tried by a
//!   handful. (A host that accepts connections and never answers keeps that limit until its
//!   attempts time out: its 11th lane waits for one of them; after a connection
//!   failure, the host takes no new attempt until those in flight are answered, unless none is.)
//! - After that many connection failures in a row the origin **backs off** (exponential from
//!   [`OriginConfig::backoff_base`], capped at [`OriginConfig::backoff_cap`], jittered,
//!   persisted in `ol_hosts`). Its attempts are not sent: each comes back
//!   [`Outcome::Deferred`] until the origin's next probe, so its lane holds with nothing
//!   counted and its own backoff level untouched. One attempt per interval goes through as
//!   the **probe**; an answer (any HTTP status) reopens the origin for every lane, a failure
//!   extends the backoff.
//! - With [`OriginConfig::unavailable_after`], the pending units of an origin that has failed
//!   at the connection level continuously for that long are dead-lettered as
//!   `host_unavailable` (Mastodon's rule of thumb is 7 days), as their lanes come up.
//! - HTTP answers (5xx, 429) stay per lane, as before.
//!
//! # Operator blocks
//!
//! `outbox-lanes hosts block` pauses the origin's lanes in the store (fenced, OL-14) and marks
//! the origin; a gate that sees the mark holds attempts of lanes enqueued later too
//! ([`Outcome::Deferred`]), or with `--dead-letter` sets them aside ([`Outcome::SetAside`],
//! reason `blocked`).
//!
//! # Signature schemes (the double-knock, OL-22)
//!
//! With [`SignatureMode::Auto`] and a signer of HTTP Signatures, an origin not known yet gets
//! RFC 9421 first; a refusal that means "signature not understood" (401, 403, 400; 5xx too
//! with [`HttpConfig::signature_fallback_on_5xx`](crate::http::HttpConfig)) is sent again at once with draft-cavage, inside the
//! same attempt ([`Knock`]): one attempt, one record, the lane's order kept. The scheme that
//! was accepted is remembered per origin and persisted, so later units, lanes and actors to
//! it go straight to it; a cavage origin is offered RFC 9421 again after
//! [`OriginConfig::spec_retry`] (7 days). A refusal carrying `Accept-Signature` (RFC 9421
//! §5) is answered first with an RFC 9421 signature of what it asks for.
//!
//! # Sharing through the store
//!
//! A thread of the gate writes each origin's row when its state changes and reads every row
//! back every [`OriginConfig::refresh`]: a relay restarted, or another relay on the same
//! database, starts from what was seen (a row written later than this process's own
//! observation wins), and an operator's block reaches running relays within that time.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use outbox_lanes_core::{DeadReason, Outcome, Timestamp};
use outbox_lanes_store::{DriverStore, HostBlock, HostRecord};
use tracing::{debug, info, warn};

use crate::http::{AttemptResult, not_sent};
use crate::job::{Executor, Job};
use crate::sign::SignatureSpec;

/// Which HTTP signature scheme an outbox signs with (`--signature-spec`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SignatureMode {
    /// RFC 9421 first for an origin not known yet, draft-cavage when it refuses, then what
    /// worked (the double-knock). The default.
    #[default]
    Auto,
    /// Always RFC 9421.
    Rfc9421,
    /// Always draft-cavage (what outbox-lanes signed before RFC 9421).
    Cavage,
}

impl SignatureMode {
    /// `auto`, `rfc9421` or `cavage`.
    pub fn as_str(self) -> &'static str {
        match self {
            SignatureMode::Auto => "auto",
            SignatureMode::Rfc9421 => "rfc9421",
            SignatureMode::Cavage => "cavage",
        }
    }

    /// The mode of a code [`SignatureMode::as_str`] gives.
    pub fn from_code(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(SignatureMode::Auto),
            "rfc9421" => Some(SignatureMode::Rfc9421),
            "cavage" => Some(SignatureMode::Cavage),
            _ => None,
        }
    }
}

/// The default [`OriginConfig::failures`].
pub const DEFAULT_HOST_FAILURES: u32 = 3;
/// The default [`OriginConfig::backoff_base`].
pub const DEFAULT_HOST_BACKOFF: Duration = Duration::from_secs(10);
/// The default [`OriginConfig::backoff_cap`].
pub const DEFAULT_HOST_BACKOFF_CAP: Duration = Duration::from_secs(3600);
/// The default [`OriginConfig::spec_retry`]: 7 days.
pub const DEFAULT_SPEC_RETRY: Duration = Duration::from_secs(7 * 24 * 3600);
/// The default [`OriginConfig::first_contact`].
pub const DEFAULT_FIRST_CONTACT: u32 = 10;
/// How long an attempt waits while its origin's probe is out, or while an operator holds it.
const PROBE_WAIT: Duration = Duration::from_secs(5);

/// How hosts are treated (see the [module documentation](self)).
#[derive(Clone, Debug)]
pub struct OriginConfig {
    /// Connection-level failures in a row after which an origin backs off. `0` turns origin
    /// health off (every lane on its own, as before). Default 3.
    pub failures: u32,
    /// The first backoff of an origin; each failed probe doubles it. Default 10 s.
    pub backoff_base: Duration,
    /// The longest backoff of an origin. Default 1 h.
    pub backoff_cap: Duration,
    /// Pending units of an origin failing at the connection level for this long are
    /// dead-lettered as `host_unavailable`. Default `None`: never.
    pub unavailable_after: Option<Duration>,
    /// How long an origin known to take only draft-cavage is signed so before RFC 9421 is
    /// offered again. Default 7 days.
    pub spec_retry: Duration,
    /// Attempts in flight an origin takes while it has not answered (first contact in this
    /// process): the most a dead host gets at once before its failures back it off. Default
    /// 10: enough that a few lanes whose host hangs do not keep a healthy path of the same
    /// host waiting, few enough that 200 lanes to a dead host cost a handful of connections.
    /// After a connection failure, a host not proven takes no new attempt while one is in
    /// flight.
    pub first_contact: u32,
    /// How often the state is read back from the store. Default 1 s.
    pub refresh: Duration,
    /// Whether the double-knock applies (a signer of HTTP Signatures with
    /// [`SignatureMode::Auto`]; the runtimes' builders set it): then an origin whose scheme is
    /// not known takes one attempt at a time until it is, so one refused RFC 9421 request,
    /// not one per lane, teaches it.
    pub knock: bool,
}

impl Default for OriginConfig {
    fn default() -> Self {
        OriginConfig {
            failures: DEFAULT_HOST_FAILURES,
            backoff_base: DEFAULT_HOST_BACKOFF,
            backoff_cap: DEFAULT_HOST_BACKOFF_CAP,
            unavailable_after: None,
            spec_retry: DEFAULT_SPEC_RETRY,
            first_contact: DEFAULT_FIRST_CONTACT,
            refresh: Duration::from_secs(1),
            knock: false,
        }
    }
}

/// One origin's live state.
#[derive(Debug)]
struct Origin {
    failures: u32,
    level: u32,
    not_before: Option<Timestamp>,
    failing_since: Option<Timestamp>,
    last_error: Option<String>,
    blocked: HostBlock,
    spec: Option<(SignatureSpec, Timestamp)>,
    /// When this process last changed the state (or adopted the store's).
    updated_at: Timestamp,
    /// An HTTP answer came since the origin was last seen failing (in this process).
    answered: bool,
    in_flight: u32,
    probing: bool,
    parked: VecDeque<Job>,
    /// Changed since the last write.
    dirty: bool,
}

impl Origin {
    fn new(at: Timestamp) -> Origin {
        Origin {
            failures: 0,
            level: 0,
            not_before: None,
            failing_since: None,
            last_error: None,
            blocked: HostBlock::Open,
            spec: None,
            updated_at: at,
            answered: false,
            in_flight: 0,
            probing: false,
            parked: VecDeque::new(),
            dirty: false,
        }
    }

    fn record(&self, origin: &str) -> HostRecord {
        HostRecord {
            origin: origin.to_owned(),
            failures: self.failures,
            level: self.level,
            not_before: self.not_before,
            failing_since: self.failing_since,
            last_error: self.last_error.clone(),
            blocked: self.blocked,
            spec: self.spec.map(|(s, _)| s.as_str().to_owned()),
            spec_at: self.spec.map(|(_, at)| at),
            updated_at: self.updated_at,
        }
    }

    /// Takes the store's row: the operator's block always, the rest when it is newer.
    fn adopt(&mut self, r: &HostRecord) {
        self.blocked = r.blocked;
        if r.updated_at > self.updated_at && !self.dirty {
            let was_down = self.level > 0;
            self.failures = r.failures;
            self.level = r.level;
            self.not_before = r.not_before;
            self.failing_since = r.failing_since;
            self.last_error = r.last_error.clone();
            self.spec = r
                .spec
                .as_deref()
                .and_then(SignatureSpec::from_code)
                .map(|s| (s, r.spec_at.unwrap_or(r.updated_at)));
            self.updated_at = r.updated_at;
            if was_down && r.level == 0 {
                self.probing = false;
            }
        }
    }

    fn open(&self) -> bool {
        self.level == 0
    }

    /// Attempts this open origin may have in flight at once: one while its signature scheme
    /// is to be learned (the double-knock), `first_contact` while it has not answered (or just
    /// failed), any number once it answers.
    fn limit(&self, cfg: &OriginConfig, t: Timestamp) -> u32 {
        let learning = cfg.knock
            && match self.spec {
                None => true,
                Some((SignatureSpec::Cavage, at)) => {
                    t.saturating_duration_since(at) >= cfg.spec_retry
                }
                Some((SignatureSpec::Rfc9421, _)) => false,
            };
        if learning || (cfg.failures > 0 && self.failures > 0) {
            // After a connection failure, what is in flight tells first.
            1
        } else if cfg.failures == 0 || self.answered {
            u32::MAX
        } else {
            cfg.first_contact.max(1)
        }
    }
}

struct Shared {
    cfg: OriginConfig,
    inner: Arc<dyn Executor>,
    origins: Mutex<HashMap<Arc<str>, Origin>>,
    rng: Mutex<u64>,
    /// Wakes the writer thread: a state changed, or the gate stops.
    changed: Condvar,
    stopped: AtomicBool,
    /// Where the state is shared ([`OriginGate::share_through`]).
    store: std::sync::OnceLock<Arc<dyn DriverStore>>,
    /// The writer thread, joined at shutdown: it holds the store, whose last reference must
    /// go before the process exits (a SQLite store removes its holder lock files on drop).
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Origin>> {
        self.origins.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `d` ± 20 %.
    fn jittered(&self, d: Duration) -> Duration {
        let mut x = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
        // xorshift64*: enough to spread probes and deferrals apart.
        *x ^= *x >> 12;
        *x ^= *x << 25;
        *x ^= *x >> 27;
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
        let unit = (r as f64) / ((1u64 << 53) as f64);
        d.mul_f64(0.8 + 0.4 * unit)
    }

    fn backoff(&self, level: u32) -> Duration {
        let exp = level.saturating_sub(1).min(30);
        let d = self
            .cfg
            .backoff_base
            .saturating_mul(1u32 << exp)
            .min(self.cfg.backoff_cap);
        self.jittered(d)
    }
}

/// What the gate does with an attempt.
enum Admit {
    Send { probe: bool },
    Park,
    Answer(AttemptResult),
}

/// The gate in front of an outbox's executor (see the [module documentation](self)); clones
/// share one state.
#[derive(Clone)]
pub struct OriginGate {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for OriginGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginGate")
            .field("cfg", &self.shared.cfg)
            .finish_non_exhaustive()
    }
}

/// An attempt's place under its origin's gate, carried by the [`Job`]: its completion is
/// counted for the origin, and the client asks it which signature scheme to use.
pub struct OriginTicket {
    shared: Arc<Shared>,
    origin: Arc<str>,
    probe: bool,
    /// Set once the completion was counted.
    done: bool,
}

impl std::fmt::Debug for OriginTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginTicket")
            .field("origin", &self.origin)
            .field("probe", &self.probe)
            .finish()
    }
}

fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

/// Whether `r` is a connection-level failure (see the [module documentation](self)).
pub fn connection_failed(r: &AttemptResult) -> bool {
    if r.status.is_some() || !matches!(r.outcome, Outcome::Transient { .. }) {
        return false;
    }
    let code = r
        .error
        .as_deref()
        .and_then(|e| e.split(':').next())
        .unwrap_or("");
    matches!(
        code,
        "connection_refused" | "connection_reset" | "dns" | "tls" | "connect_timeout"
    )
}

impl OriginGate {
    /// A gate in front of `inner`, with no store (nothing persisted or shared).
    pub fn new(inner: Arc<dyn Executor>, cfg: OriginConfig) -> OriginGate {
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0x9E37_79B9, |d| d.as_nanos() as u64)
            | 1;
        OriginGate {
            shared: Arc::new(Shared {
                cfg,
                inner,
                origins: Mutex::new(HashMap::new()),
                rng: Mutex::new(seed),
                changed: Condvar::new(),
                stopped: AtomicBool::new(false),
                store: std::sync::OnceLock::new(),
                writer: Mutex::new(None),
            }),
        }
    }

    /// Starts the thread that writes changes and reads the rows back every
    /// [`OriginConfig::refresh`], and waits for its first read of what `store` knows of the
    /// hosts.
    ///
    /// The store is read on that thread, never on the caller's: an async runtime opens its
    /// outbox on an executor thread, where a blocking Postgres client must not run.
    ///
    /// # Errors
    /// The thread could not be started, or it panicked at its first read. A store that cannot
    /// be read is logged and retried.
    pub fn share_through(&self, store: Arc<dyn DriverStore>) -> std::io::Result<()> {
        let _ = self.shared.store.set(Arc::clone(&store));
        // Weak: the thread ends once the gate is gone (the outbox dropped).
        let shared = Arc::downgrade(&self.shared);
        let (loaded, first_read) = std::sync::mpsc::sync_channel(1);
        let handle = std::thread::Builder::new()
            .name("outbox-lanes-hosts".into())
            .spawn(move || {
                if let Some(s) = shared.upgrade() {
                    refresh(&s, &*store);
                }
                let _ = loaded.send(());
                writer(&shared, &*store);
            })?;
        // An error means the thread ended before its first read (it panicked): no thread
        // writes or reads the hosts, which open must not hide.
        first_read
            .recv()
            .map_err(|_| std::io::Error::other("the hosts thread ended at its first read"))?;
        *self
            .shared
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(handle);
        Ok(())
    }

    /// The configuration.
    pub fn config(&self) -> &OriginConfig {
        &self.shared.cfg
    }

    /// The origins this process knows, as their store rows, for metrics and tests.
    pub fn snapshot(&self) -> Vec<HostRecord> {
        let map = self.shared.lock();
        let mut v: Vec<HostRecord> = map.iter().map(|(o, s)| s.record(o)).collect();
        v.sort_by(|a, b| a.origin.cmp(&b.origin));
        v
    }

    fn admit(&self, origin: &Arc<str>, job_done: &mut Option<Job>) -> Admit {
        let cfg = &self.shared.cfg;
        let t = now();
        let mut map = self.shared.lock();
        let o = map
            .entry(Arc::clone(origin))
            .or_insert_with(|| Origin::new(t));
        match o.blocked {
            HostBlock::Hold => {
                return Admit::Answer(deferred(
                    PROBE_WAIT.saturating_mul(6),
                    format!("host_blocked: {origin} is blocked by an operator"),
                ));
            }
            HostBlock::DeadLetter => {
                return Admit::Answer(AttemptResult {
                    outcome: Outcome::SetAside {
                        reason: DeadReason::Blocked,
                    },
                    status: None,
                    error: Some(format!(
                        "host_blocked: {origin} is blocked by an operator, with dead letters"
                    )),
                });
            }
            HostBlock::Open => {}
        }
        if cfg.failures > 0 && !o.open() {
            if let (Some(after), Some(since)) = (cfg.unavailable_after, o.failing_since)
                && t.saturating_duration_since(since) >= after
            {
                return Admit::Answer(AttemptResult {
                    outcome: Outcome::SetAside {
                        reason: DeadReason::HostUnavailable,
                    },
                    status: None,
                    error: Some(format!(
                        "host_unavailable: {origin} failed at the connection level for {} \
                         (last: {})",
                        humantime::format_duration(Duration::from_secs(
                            t.saturating_duration_since(since).as_secs()
                        )),
                        o.last_error.as_deref().unwrap_or("unknown")
                    )),
                });
            }
            let due = o.not_before.is_none_or(|nb| nb <= t);
            if due && !o.probing {
                o.probing = true;
                o.in_flight += 1;
                return Admit::Send { probe: true };
            }
            let wait = match o.not_before {
                Some(nb) if nb > t => nb.saturating_duration_since(t),
                _ => PROBE_WAIT,
            };
            let wait = self.shared.jittered(wait).max(wait);
            return Admit::Answer(deferred(
                wait,
                format!(
                    "host_unavailable: {origin} is backing off after {} connection failures \
                     in a row (last: {})",
                    o.failures,
                    o.last_error.as_deref().unwrap_or("unknown")
                ),
            ));
        }
        if o.in_flight < o.limit(cfg, t) {
            o.in_flight += 1;
            return Admit::Send { probe: false };
        }
        if let Some(job) = job_done.take() {
            o.parked.push_back(job);
        }
        Admit::Park
    }
}

fn deferred(wait: Duration, error: String) -> AttemptResult {
    AttemptResult {
        outcome: Outcome::Deferred { retry_after: wait },
        status: None,
        error: Some(error),
    }
}

impl Executor for OriginGate {
    fn execute(&self, job: Job) -> Result<(), Job> {
        let origin = Arc::clone(job.recipient.origin());
        let mut slot = Some(job);
        match self.admit(&origin, &mut slot) {
            Admit::Park => Ok(()),
            Admit::Answer(result) => {
                if let Some(job) = slot {
                    job.finish(result);
                }
                Ok(())
            }
            Admit::Send { probe } => {
                let Some(mut job) = slot else { return Ok(()) };
                job.origin = Some(OriginTicket {
                    shared: Arc::clone(&self.shared),
                    origin,
                    probe,
                    done: false,
                });
                self.shared.inner.execute(job).map_err(|mut job| {
                    // Unrun: its place is given back, nothing counted.
                    if let Some(mut t) = job.origin.take() {
                        t.release(None);
                    }
                    job
                })
            }
        }
    }

    fn shutdown(&self) {
        let parked: Vec<Job> = self
            .shared
            .lock()
            .values_mut()
            .flat_map(|o| o.parked.drain(..))
            .collect();
        drop(parked);
        self.shared.inner.shutdown();
        // What the last attempts taught is written before the process goes.
        if let Some(store) = self.shared.store.get() {
            flush(&self.shared, &**store);
        }
        {
            // Under the lock the writer checks it under, so its wake-up is not lost.
            let _map = self.shared.lock();
            self.shared.stopped.store(true, Ordering::SeqCst);
        }
        self.shared.changed.notify_all();
        // Its store reference goes with it, now, not when the process exits under it.
        let writer = self
            .shared
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(w) = writer.filter(|w| w.thread().id() != std::thread::current().id()) {
            let _ = w.join();
        }
    }
}

impl OriginTicket {
    /// The origin (`scheme://host:port`).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The signature scheme for this attempt's first request: the configured one, or with
    /// [`SignatureMode::Auto`] what the origin accepted last (RFC 9421 when nothing is known,
    /// or when draft-cavage was learned longer than [`OriginConfig::spec_retry`] ago).
    pub fn spec(&self, mode: SignatureMode) -> SignatureSpec {
        let cfg = &self.shared.cfg;
        match mode {
            SignatureMode::Rfc9421 => SignatureSpec::Rfc9421,
            SignatureMode::Cavage => SignatureSpec::Cavage,
            SignatureMode::Auto => {
                let map = self.shared.lock();
                match map.get(&self.origin).and_then(|o| o.spec) {
                    Some((SignatureSpec::Cavage, at))
                        if now().saturating_duration_since(at) < cfg.spec_retry =>
                    {
                        SignatureSpec::Cavage
                    }
                    _ => SignatureSpec::Rfc9421,
                }
            }
        }
    }

    /// The origin accepted a request signed with `spec`: remembered (and persisted) when it
    /// is news.
    pub fn learned(&self, spec: SignatureSpec, mode: SignatureMode) {
        let t = now();
        let mut map = self.shared.lock();
        let Some(o) = map.get_mut(&self.origin) else {
            return;
        };
        let news = match o.spec {
            Some((known, _)) if known == spec => {
                // A cavage origin that took cavage again after an RFC 9421 trial: the trial
                // is over for another period.
                spec == SignatureSpec::Cavage && mode == SignatureMode::Auto
            }
            _ => true,
        };
        if news {
            if o.spec.map(|(s, _)| s) != Some(spec) {
                info!(origin = %self.origin, spec = spec.as_str(), "signature scheme learned");
            }
            o.spec = Some((spec, t));
            o.updated_at = t;
            o.dirty = true;
            drop(map);
            self.shared.changed.notify_all();
        }
    }

    /// Counts the completion for the origin (once; a ticket dropped without it counts nothing
    /// but frees its place).
    pub(crate) fn finished(&mut self, result: &AttemptResult) {
        self.release(Some(result));
    }

    fn release(&mut self, result: Option<&AttemptResult>) {
        if self.done {
            return;
        }
        self.done = true;
        let cfg = &self.shared.cfg;
        let t = now();
        let mut resume: Vec<Job> = Vec::new();
        let mut refused: Vec<Job> = Vec::new();
        let dirty;
        {
            let mut map = self.shared.lock();
            let Some(o) = map.get_mut(&self.origin) else {
                return;
            };
            o.in_flight = o.in_flight.saturating_sub(1);
            if self.probe {
                o.probing = false;
            }
            match result {
                Some(r) if cfg.failures > 0 && connection_failed(r) => {
                    o.failures = o.failures.saturating_add(1);
                    o.answered = false;
                    o.failing_since.get_or_insert(t);
                    o.last_error = r.error.clone();
                    let back_off = self.probe || (o.open() && o.failures >= cfg.failures);
                    if back_off {
                        o.level = o.level.saturating_add(1);
                        let wait = self.shared.backoff(o.level);
                        o.not_before = Some(t + wait);
                        if o.level == 1 {
                            warn!(origin = %self.origin, failures = o.failures,
                                error = r.error.as_deref(), next_probe_in_ms = wait.as_millis() as u64,
                                "host backing off after connection failures in a row");
                        } else {
                            info!(origin = %self.origin, level = o.level,
                                error = r.error.as_deref(), next_probe_in_ms = wait.as_millis() as u64,
                                "host probe failed; backoff extended");
                        }
                    }
                    o.updated_at = t;
                    o.dirty = true;
                    if !o.open() {
                        refused.extend(o.parked.drain(..));
                    }
                }
                Some(r) if r.status.is_some() => {
                    if o.failures > 0 || o.level > 0 || o.failing_since.is_some() {
                        if o.level > 0 {
                            info!(origin = %self.origin, after_level = o.level, "host answered again");
                        }
                        o.failures = 0;
                        o.level = 0;
                        o.not_before = None;
                        o.failing_since = None;
                        o.updated_at = t;
                        o.dirty = true;
                    }
                    o.answered = true;
                }
                _ => {}
            }
            dirty = o.dirty;
            if o.open() {
                let limit = o.limit(cfg, t);
                while let Some(job) = o.parked.front() {
                    if job.abandoned() {
                        o.parked.pop_front();
                        continue;
                    }
                    if o.in_flight >= limit {
                        break;
                    }
                    if let Some(job) = o.parked.pop_front() {
                        o.in_flight += 1;
                        resume.push(job);
                    }
                }
            }
        }
        if dirty {
            self.shared.changed.notify_all();
        }
        let wait = if refused.is_empty() {
            PROBE_WAIT
        } else {
            let map = self.shared.lock();
            map.get(&self.origin)
                .and_then(|o| o.not_before)
                .map_or(PROBE_WAIT, |nb| nb.saturating_duration_since(t))
        };
        for job in refused {
            job.finish(deferred(
                wait.max(outbox_lanes_core::MIN_DEFERRAL),
                format!(
                    "host_unavailable: {} is backing off after connection failures",
                    self.origin
                ),
            ));
        }
        for mut job in resume {
            job.origin = Some(OriginTicket {
                shared: Arc::clone(&self.shared),
                origin: Arc::clone(&self.origin),
                probe: false,
                done: false,
            });
            if let Err(mut job) = self.shared.inner.execute(job) {
                if let Some(mut t) = job.origin.take() {
                    t.release(None);
                }
                job.finish(not_sent("delivery workers stopped"));
            }
        }
    }
}

impl Drop for OriginTicket {
    fn drop(&mut self) {
        self.release(None);
    }
}

fn refresh(shared: &Shared, store: &dyn DriverStore) {
    match store.hosts() {
        Ok(rows) => {
            let mut map = shared.lock();
            for r in &rows {
                let o = map
                    .entry(Arc::from(r.origin.as_str()))
                    .or_insert_with(|| Origin::new(Timestamp::from_millis(0)));
                o.adopt(r);
            }
        }
        Err(e) => debug!(error = %e, "host states not read; tried again"),
    }
}

fn take_dirty(map: &mut HashMap<Arc<str>, Origin>) -> Vec<HostRecord> {
    map.iter_mut()
        .filter(|(_, o)| o.dirty)
        .map(|(k, o)| {
            o.dirty = false;
            o.record(k)
        })
        .collect()
}

fn write_dirty(shared: &Shared, store: &dyn DriverStore, dirty: &[HostRecord]) {
    if !dirty.is_empty()
        && let Err(e) = store.write_hosts(dirty)
    {
        warn!(error = %e, hosts = dirty.len(), "host states not written; written again later");
        let mut map = shared.lock();
        for r in dirty {
            if let Some(o) = map.get_mut(r.origin.as_str()) {
                o.dirty = true;
            }
        }
    }
}

/// Writes every changed origin now.
fn flush(shared: &Shared, store: &dyn DriverStore) {
    let dirty = take_dirty(&mut shared.lock());
    write_dirty(shared, store, &dirty);
}

/// The writer thread: writes changed origins, reads every row back each refresh period, and
/// ends once the gate is dropped or shut down.
fn writer(shared: &std::sync::Weak<Shared>, store: &dyn DriverStore) {
    let mut last_refresh = std::time::Instant::now();
    loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let shared = &*shared;
        let dirty: Vec<HostRecord> = {
            let mut map = shared.lock();
            if !map.values().any(|o| o.dirty) && !shared.stopped.load(Ordering::SeqCst) {
                let left = shared.cfg.refresh.saturating_sub(last_refresh.elapsed());
                map = shared
                    .changed
                    .wait_timeout(map, left.max(Duration::from_millis(10)))
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            take_dirty(&mut map)
        };
        write_dirty(shared, store, &dirty);
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        if last_refresh.elapsed() >= shared.cfg.refresh {
            refresh(shared, store);
            last_refresh = std::time::Instant::now();
        }
    }
}

/// The double-knock of one attempt (see the [module documentation](self)): which scheme
/// signs each request, and whether a refusal is sent again.
#[derive(Debug)]
pub struct Knock<'a> {
    ticket: Option<&'a OriginTicket>,
    mode: SignatureMode,
    fallback_on_5xx: bool,
    signed: bool,
    spec: SignatureSpec,
    challenge: Option<String>,
    challenged: bool,
    requests: u8,
}

impl<'a> Knock<'a> {
    /// The knock of an attempt under `ticket` (none: no origin memory, `mode` alone decides),
    /// for a request policy whose signer `signed` HTTP Signatures.
    pub fn new(
        ticket: Option<&'a OriginTicket>,
        mode: SignatureMode,
        fallback_on_5xx: bool,
        signed: bool,
    ) -> Knock<'a> {
        let spec = match (ticket, mode) {
            (Some(t), _) => t.spec(mode),
            (None, SignatureMode::Cavage) => SignatureSpec::Cavage,
            (None, _) => SignatureSpec::Rfc9421,
        };
        Knock {
            ticket,
            mode,
            fallback_on_5xx,
            signed,
            spec,
            challenge: None,
            challenged: false,
            requests: 0,
        }
    }

    /// The scheme of the next request.
    pub fn spec(&self) -> SignatureSpec {
        self.spec
    }

    /// The `Accept-Signature` the next request answers, if any.
    pub fn challenge(&self) -> Option<&str> {
        self.challenge.as_deref()
    }

    /// The answer to the last request: whether to send it again (with [`Knock::spec`] and
    /// [`Knock::challenge`] changed). `accept_signature` is the answer's `Accept-Signature`.
    pub fn again(&mut self, result: &AttemptResult, accept_signature: Option<&str>) -> bool {
        self.requests += 1;
        if !self.signed {
            return false;
        }
        let Some(status) = result.status else {
            return false;
        };
        if (200..300).contains(&status) {
            if let Some(t) = self.ticket {
                t.learned(self.spec, self.mode);
            }
            return false;
        }
        let refused = matches!(status, 400 | 401 | 403)
            || (self.fallback_on_5xx && (500..600).contains(&status));
        if !refused || self.requests >= 3 {
            return false;
        }
        if let Some(challenge) = accept_signature
            && !self.challenged
            && self.mode != SignatureMode::Cavage
        {
            // The server said what it wants (RFC 9421 §5): answer that once.
            debug!(
                status,
                challenge, "signature challenged; signing what it asks"
            );
            self.challenged = true;
            self.challenge = Some(challenge.to_owned());
            self.spec = SignatureSpec::Rfc9421;
            return true;
        }
        if self.mode == SignatureMode::Auto && self.spec == SignatureSpec::Rfc9421 {
            debug!(
                status,
                "RFC 9421 signature refused; sending again with draft-cavage"
            );
            self.spec = SignatureSpec::Cavage;
            self.challenge = None;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::job::Done;
    use crate::testing::{Held, answered, job};

    fn refused() -> AttemptResult {
        AttemptResult {
            outcome: Outcome::Transient { retry_after: None },
            status: None,
            error: Some("connection_refused: Connection refused (os error 111)".into()),
        }
    }

    fn gate(cfg: OriginConfig) -> (OriginGate, Arc<Held>) {
        let held = Arc::new(Held::default());
        (
            OriginGate::new(Arc::clone(&held) as Arc<dyn Executor>, cfg),
            held,
        )
    }

    fn outcomes(rx: &mpsc::Receiver<Done>) -> Vec<(u64, &'static str)> {
        rx.try_iter()
            .map(|d| (d.unit.0, d.result.outcome.as_str()))
            .collect()
    }

    #[test]
    fn a_dead_host_gets_first_contact_attempts_then_backs_off_and_defers_the_rest() {
        let (g, held) = gate(OriginConfig {
            first_contact: 4,
            ..OriginConfig::default()
        });
        let (tx, rx) = mpsc::channel();
        for u in 1..=20 {
            let to = format!("https://dead.example/users/u{u}/inbox");
            assert!(g.execute(job(u, &to, &tx)).is_ok());
        }
        // Another host is not held up by the dead one.
        assert!(g.execute(job(99, "https://up.example/inbox", &tx)).is_ok());
        assert_eq!(held.running(), [1, 2, 3, 4, 99]);
        held.finish(1, refused());
        held.finish(2, refused());
        assert!(outcomes(&rx).iter().all(|&(_, o)| o == "transient"));
        // Still open after 2 failures, but what is in flight tells first: nothing new goes.
        assert_eq!(held.running(), [3, 4, 99]);
        held.finish(3, refused());
        // The 3rd failure in a row: backoff; every parked job is deferred, nothing sent.
        let got = outcomes(&rx);
        assert!(got.contains(&(3, "transient")), "{got:?}");
        let deferred: Vec<u64> = got
            .iter()
            .filter(|&&(_, o)| o == "deferred")
            .map(|&(u, _)| u)
            .collect();
        assert_eq!(deferred, (5..=20).collect::<Vec<_>>());
        let snap = g.snapshot();
        let dead = snap
            .iter()
            .find(|h| h.origin == "https://dead.example:443")
            .expect("dead");
        assert_eq!((dead.failures, dead.level), (3, 1));
        assert!(dead.not_before.is_some());
        assert!(
            dead.last_error
                .as_deref()
                .is_some_and(|e| e.starts_with("connection_refused"))
        );
        // A new attempt waits for the next probe: deferred by about the backoff (10 s ± 20 %).
        assert!(g.execute(job(21, "https://dead.example/x", &tx)).is_ok());
        let d = rx.try_recv().expect("answered at once");
        match d.result.outcome {
            Outcome::Deferred { retry_after } => {
                assert!(retry_after >= Duration::from_secs(7), "{retry_after:?}");
                assert!(retry_after <= Duration::from_secs(15), "{retry_after:?}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(held.running(), [4, 99], "nothing new was sent");
    }

    #[test]
    fn one_probe_per_interval_and_an_answer_reopens_the_host_for_every_lane() {
        let (g, held) = gate(OriginConfig {
            failures: 1,
            first_contact: 1,
            backoff_base: Duration::from_millis(1),
            backoff_cap: Duration::from_millis(1),
            ..OriginConfig::default()
        });
        let (tx, rx) = mpsc::channel();
        assert!(g.execute(job(1, "https://h.example/a", &tx)).is_ok());
        held.finish(1, refused());
        std::thread::sleep(Duration::from_millis(5));
        // Due: the first attempt is the probe, the next one waits for it.
        assert!(g.execute(job(2, "https://h.example/b", &tx)).is_ok());
        assert!(g.execute(job(3, "https://h.example/c", &tx)).is_ok());
        assert_eq!(held.running(), [2]);
        let _ = outcomes(&rx);
        // The probe fails: the backoff is extended (level 2).
        held.finish(2, refused());
        assert_eq!(g.snapshot()[0].level, 2);
        std::thread::sleep(Duration::from_millis(5));
        assert!(g.execute(job(4, "https://h.example/d", &tx)).is_ok());
        assert_eq!(held.running(), [4]);
        // Any HTTP answer, a 503 too, says the host is up: open, and proven.
        held.finish(4, answered(503));
        let h = &g.snapshot()[0];
        assert_eq!(
            (h.failures, h.level, h.not_before, h.failing_since),
            (0, 0, None, None)
        );
        for u in 5..=9 {
            assert!(g.execute(job(u, "https://h.example/e", &tx)).is_ok());
        }
        assert_eq!(
            held.running(),
            [5, 6, 7, 8, 9],
            "no limit on a host that answers"
        );
    }

    #[test]
    fn blocked_hosts_hold_or_set_aside_and_a_long_failure_makes_units_unavailable() {
        let (g, held) = gate(OriginConfig {
            failures: 1,
            unavailable_after: Some(Duration::ZERO),
            ..OriginConfig::default()
        });
        let (tx, rx) = mpsc::channel();
        assert!(g.execute(job(1, "https://b.example/a", &tx)).is_ok());
        held.finish(1, answered(200));
        let origin: Arc<str> = Arc::from("https://b.example:443");
        g.shared.lock().get_mut(&origin).expect("known").blocked = HostBlock::Hold;
        assert!(g.execute(job(2, "https://b.example/a", &tx)).is_ok());
        g.shared.lock().get_mut(&origin).expect("known").blocked = HostBlock::DeadLetter;
        assert!(g.execute(job(3, "https://b.example/a", &tx)).is_ok());
        let got: Vec<(u64, Outcome)> = rx
            .try_iter()
            .map(|d| (d.unit.0, d.result.outcome))
            .collect();
        assert_eq!(got[0], (1, Outcome::Delivered));
        assert!(matches!(got[1], (2, Outcome::Deferred { .. })), "{got:?}");
        assert_eq!(
            got[2],
            (
                3,
                Outcome::SetAside {
                    reason: DeadReason::Blocked
                }
            )
        );
        assert!(held.running().is_empty(), "nothing reached a blocked host");
        // A host failing at the connection level longer than allowed: its units are set aside.
        assert!(g.execute(job(4, "https://gone.example/a", &tx)).is_ok());
        held.finish(4, refused());
        assert!(g.execute(job(5, "https://gone.example/a", &tx)).is_ok());
        let last = rx.try_iter().last().expect("answered");
        assert_eq!(
            (last.unit.0, last.result.outcome),
            (
                5,
                Outcome::SetAside {
                    reason: DeadReason::HostUnavailable
                }
            )
        );
        assert!(
            last.result
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with("host_unavailable: https://gone.example:443")),
            "{:?}",
            last.result.error
        );
    }

    #[test]
    fn an_unknown_scheme_is_learned_with_one_attempt_at_a_time_and_tried_again_after_a_while() {
        let (g, held) = gate(OriginConfig {
            knock: true,
            spec_retry: Duration::from_millis(30),
            ..OriginConfig::default()
        });
        let (tx, rx) = mpsc::channel();
        for u in 1..=3 {
            assert!(g.execute(job(u, "https://k.example/a", &tx)).is_ok());
        }
        assert_eq!(held.running(), [1], "one knock at a time");
        let first = held.take(1);
        let ticket = first.origin().expect("a ticket");
        assert_eq!(ticket.spec(SignatureMode::Auto), SignatureSpec::Rfc9421);
        assert_eq!(ticket.spec(SignatureMode::Cavage), SignatureSpec::Cavage);
        // The knock: RFC 9421 refused, draft-cavage taken.
        let mut knock = Knock::new(Some(ticket), SignatureMode::Auto, false, true);
        assert_eq!(knock.spec(), SignatureSpec::Rfc9421);
        assert!(knock.again(&answered(401), None));
        assert_eq!(knock.spec(), SignatureSpec::Cavage);
        assert!(!knock.again(&answered(202), None));
        first.finish(answered(202));
        assert_eq!(held.running(), [2, 3], "the scheme is known: the others go");
        let t2 = held.take(2);
        assert_eq!(
            t2.origin().expect("ticket").spec(SignatureMode::Auto),
            SignatureSpec::Cavage
        );
        assert_eq!(g.snapshot()[0].spec.as_deref(), Some("cavage"));
        // After the retry period, RFC 9421 is offered again.
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(
            t2.origin().expect("ticket").spec(SignatureMode::Auto),
            SignatureSpec::Rfc9421
        );
        drop(t2);
        let _ = rx.try_iter().count();
    }

    #[test]
    fn the_knock_answers_a_challenge_once_then_falls_back_and_leaves_5xx_alone() {
        let mut k = Knock::new(None, SignatureMode::Auto, false, true);
        let challenge = r#"sig1=("@method" "@target-uri" "content-digest");alg="rsa-v1_5-sha256""#;
        assert!(k.again(&answered(401), Some(challenge)));
        assert_eq!(
            (k.spec(), k.challenge()),
            (SignatureSpec::Rfc9421, Some(challenge))
        );
        assert!(
            k.again(&answered(401), Some(challenge)),
            "then draft-cavage"
        );
        assert_eq!((k.spec(), k.challenge()), (SignatureSpec::Cavage, None));
        assert!(
            !k.again(&answered(401), None),
            "refused both ways: that is the answer"
        );
        // A 5xx is the server's failure, not a refusal of the signature (unless asked).
        let mut k = Knock::new(None, SignatureMode::Auto, false, true);
        assert!(!k.again(&answered(503), None));
        let mut k = Knock::new(None, SignatureMode::Auto, true, true);
        assert!(k.again(&answered(500), None));
        // Fixed schemes and unsigned requests never knock twice.
        let mut k = Knock::new(None, SignatureMode::Rfc9421, false, true);
        assert!(!k.again(&answered(401), None));
        let mut k = Knock::new(None, SignatureMode::Auto, false, false);
        assert!(!k.again(&answered(401), None));
        // A connection failure is no answer at all.
        let mut k = Knock::new(None, SignatureMode::Auto, false, true);
        assert!(!k.again(&refused(), None));
    }
}
