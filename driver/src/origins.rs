//! The origin gate: the executor of the core's [`HostBook`] (OL-21, OL-22), in front of an
//! outbox's executor, and the writer of `ol_hosts`.
//!
//! Every decision about a host — health and backoff, its share of the in-flight budget, the
//! operator's block, the signature scheme and the double-knock's plan — is the book's
//! ([`outbox_lanes_core::host`], transcript-tested in virtual time). The gate only executes
//! its answers for each [`Job`]:
//!
//! - [`HostAnswer::Go`]: the job carries an [`OriginTicket`] to the inner executor; its end
//!   goes back to the book, and jobs that waited for the host are asked about again.
//! - [`HostAnswer::Wait`]: the job waits in its host's queue, holding no worker or task.
//! - [`HostAnswer::Defer`], [`HostAnswer::Held`], [`HostAnswer::SetAside`]: the job is
//!   finished at once with [`Outcome::Deferred`], [`Outcome::Held`] or [`Outcome::SetAside`]
//!   (nothing sent), with an error that names the host.
//!
//! The gate reads no clock of its own (it is given one, [`Clock`]) and draws no random
//! number (the book's jitter is seeded).
//!
//! # Sharing through the store
//!
//! A thread of the gate writes each host's row when the book changed it, and reads every row
//! back every second, so relays on one database and a restarted relay start from what was
//! seen. An operator's `hosts block|unblock|retry` is **fenced** instead (OL-14 extended to
//! hosts): it bumps the operators' host-control generation, which every pass reads with its
//! lane controls before it starts attempts; a pass that sees it move reads the rows and gives
//! them to the book ([`OriginGate::apply_rows`]) before anything starts, and the action
//! returns only [`CONTROL_VALIDITY`](outbox_lanes_store::CONTROL_VALIDITY) after its commit.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use outbox_lanes_core::host::{
    Deferral, HostAnswer, HostBook, HostConfig, HostEnd, HostEvent, HostId, HostState, HostTicket,
    KnockReport,
};
use outbox_lanes_core::{DeadReason, MIN_DEFERRAL, Outcome, Timestamp};
use outbox_lanes_store::{DriverStore, HostRecord, HostRows};
use tracing::{debug, info, warn};

use crate::clock::Clock;
use crate::http::{AttemptResult, not_sent};
use crate::job::{Executor, Job};
use crate::sign::SignatureSpec;
use crate::ticket::{OriginTicket, TicketSink};

/// How hosts are judged: the host book's configuration. An outbox sets its
/// [`HostConfig::max_in_flight`] to its concurrency and its signing from its signer.
pub type OriginConfig = HostConfig;

/// How often the gate reads every host's row back from the store.
pub const HOST_REFRESH: Duration = Duration::from_secs(1);

/// The book and the jobs waiting for their host, under one lock.
struct Gate {
    book: HostBook,
    /// Per host (by [`HostId`]), the jobs waiting for its window.
    waiting: Vec<VecDeque<Job>>,
}

/// What becomes of a job the gate let go of (outside its lock).
enum Next {
    /// The book's answer: sent with a ticket, or finished with a result.
    Answer(HostAnswer),
    /// Its pass is gone: dropped, it reports itself not sent.
    Drop,
}

struct Shared {
    inner: Arc<dyn Executor>,
    clock: Arc<dyn Clock>,
    gate: Mutex<Gate>,
    /// Wakes the writer thread: a host changed, or the gate stops.
    changed: Condvar,
    stopped: AtomicBool,
    /// Where the state is shared ([`OriginGate::share_through`]).
    store: std::sync::OnceLock<Arc<dyn DriverStore>>,
    /// The writer thread, joined at shutdown: it holds the store, whose last reference must
    /// go before the process exits (a SQLite store removes its holder lock files on drop).
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The gate in front of an outbox's executor (see the [module documentation](self)); clones
/// share one book.
#[derive(Clone)]
pub struct OriginGate {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for OriginGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginGate").finish_non_exhaustive()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Gate {
    fn queue(&mut self, host: HostId) -> &mut VecDeque<Job> {
        if self.waiting.len() <= host.index() {
            self.waiting.resize_with(host.index() + 1, VecDeque::new);
        }
        &mut self.waiting[host.index()]
    }

    /// Asks the book again about `host`'s waiting jobs, in order, until one must wait again:
    /// what goes and what is answered, to be dispatched outside the lock.
    fn readmit(&mut self, host: HostId, now: Timestamp, out: &mut Vec<(Job, Next)>) {
        while let Some(job) = self.queue(host).pop_front() {
            if job.abandoned() {
                // Its pass ended and handed the unit back: dropped (outside the lock) unsent.
                out.push((job, Next::Drop));
                continue;
            }
            match self.book.handle_attempt(host, now) {
                HostAnswer::Wait => {
                    self.queue(host).push_front(job);
                    return;
                }
                answer => out.push((job, Next::Answer(answer))),
            }
        }
    }

    /// Logs what the book found worth it.
    fn log_events(&mut self) {
        while let Some(e) = self.book.poll_event() {
            match e {
                HostEvent::BackedOff {
                    host,
                    failures,
                    wait,
                } => {
                    let s = self.book.state(host);
                    warn!(
                        origin = self.book.origin(host),
                        failures,
                        error = s.last_error.as_deref(),
                        next_probe_in_ms = millis(wait),
                        "host backing off after connection failures in a row"
                    );
                }
                HostEvent::ProbeFailed { host, level, wait } => {
                    let s = self.book.state(host);
                    info!(
                        origin = self.book.origin(host),
                        level,
                        error = s.last_error.as_deref(),
                        next_probe_in_ms = millis(wait),
                        "host probe failed; backoff extended"
                    );
                }
                HostEvent::Reopened { host, level } => {
                    info!(
                        origin = self.book.origin(host),
                        after_level = level,
                        "host answered again"
                    );
                }
                HostEvent::SchemeLearned { host, spec } => {
                    info!(
                        origin = self.book.origin(host),
                        spec = spec.as_str(),
                        "signature scheme learned"
                    );
                }
                HostEvent::WindowShrunk { host, window } => {
                    info!(
                        origin = self.book.origin(host),
                        window, "attempt timed out; the host's share of attempts in flight shrinks"
                    );
                }
            }
        }
    }

    /// The result of an attempt the book answered without sending it.
    fn result(&self, host: HostId, answer: HostAnswer, now: Timestamp) -> AttemptResult {
        let origin = self.book.origin(host);
        let s = self.book.state(host);
        let last = s.last_error.as_deref().unwrap_or("unknown");
        let (outcome, error) = match answer {
            HostAnswer::Defer { wait, why } => (
                Outcome::Deferred {
                    retry_after: wait.max(MIN_DEFERRAL),
                },
                match why {
                    Deferral::BackingOff => format!(
                        "host_unavailable: {origin} is backing off after {} connection \
                         failures in a row (last: {last})",
                        s.failures
                    ),
                    Deferral::ProbeOut => format!(
                        "host_unavailable: {origin} is backing off; its probe is out \
                         (last: {last})"
                    ),
                },
            ),
            HostAnswer::Held => (
                Outcome::Held,
                format!("host_blocked: {origin} is blocked by an operator"),
            ),
            HostAnswer::SetAside {
                reason: DeadReason::Blocked,
            } => (
                Outcome::SetAside {
                    reason: DeadReason::Blocked,
                },
                format!("host_blocked: {origin} is blocked by an operator, with dead letters"),
            ),
            HostAnswer::SetAside { reason } => {
                let failing = s
                    .failing_since
                    .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
                (
                    Outcome::SetAside { reason },
                    format!(
                        "host_unavailable: {origin} failed at the connection level for {} \
                         (last: {last})",
                        humantime::format_duration(Duration::from_secs(failing.as_secs()))
                    ),
                )
            }
            HostAnswer::Go(_) | HostAnswer::Wait => (
                Outcome::NotSent,
                "not_sent: the host gate was stopped".to_owned(),
            ),
        };
        AttemptResult {
            outcome,
            status: None,
            error: Some(error),
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl OriginGate {
    /// A gate in front of `inner` with a book of `cfg`, jitter seeded with `seed`, the time
    /// from `clock`; with no store (nothing persisted or shared) until
    /// [`OriginGate::share_through`].
    pub fn new(
        inner: Arc<dyn Executor>,
        cfg: HostConfig,
        seed: u64,
        clock: Arc<dyn Clock>,
    ) -> OriginGate {
        OriginGate {
            shared: Arc::new(Shared {
                inner,
                clock,
                gate: Mutex::new(Gate {
                    book: HostBook::new(cfg, seed),
                    waiting: Vec::new(),
                }),
                changed: Condvar::new(),
                stopped: AtomicBool::new(false),
                store: std::sync::OnceLock::new(),
                writer: Mutex::new(None),
            }),
        }
    }

    /// Starts the thread that writes changes and reads the rows back every
    /// [`HOST_REFRESH`], and waits for its first read of what `store` knows of the hosts.
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

    /// The book's configuration.
    pub fn config(&self) -> HostConfig {
        self.shared.lock().book.config().clone()
    }

    /// The operators' host-control generation the book last applied.
    pub fn generation(&self) -> u64 {
        self.shared.lock().book.generation()
    }

    /// Rows read from the store after the operators' host-control generation
    /// `rows.generation` (OL-14 for hosts): given to the book, and the jobs waiting for a
    /// host whose answer changed (a block, an unblock) are answered now. A pass calls it on
    /// the read of the generation it starts attempts on, before it starts them.
    pub fn apply_rows(&self, rows: &HostRows) {
        apply(&self.shared, rows);
    }

    /// The hosts this process knows, as their store rows, for metrics and tests.
    pub fn snapshot(&self) -> Vec<HostRecord> {
        let g = self.shared.lock();
        let mut v: Vec<HostRecord> = g
            .book
            .hosts()
            .map(|h| record(g.book.origin(h), g.book.state(h)))
            .collect();
        v.sort_by(|a, b| a.origin.cmp(&b.origin));
        v
    }

    /// Per host: (origin, attempts in flight, window), for metrics and tests.
    pub fn load(&self) -> Vec<(String, u32, u32)> {
        let g = self.shared.lock();
        g.book
            .hosts()
            .map(|h| {
                let (in_flight, window) = g.book.load(h);
                (g.book.origin(h).to_owned(), in_flight, window)
            })
            .collect()
    }
}

/// Executes what the book answered for `jobs` (outside the lock): sends those that go, and
/// finishes the others with their result. A job the inner executor refuses (it stopped)
/// gives its place back and is finished as not sent.
fn dispatch(shared: &Arc<Shared>, jobs: Vec<(Job, Next)>, now: Timestamp) {
    if jobs.is_empty() {
        return;
    }
    // An inner executor that finishes or drops a job inside `execute` ends its ticket, which
    // lets the host's next waiting job go from inside this loop: queued for the outer loop,
    // so a long queue never nests one call per job on the stack.
    let outer = DISPATCHING.with(|d| {
        let mut d = d.borrow_mut();
        match d.as_mut() {
            Some(queue) => {
                queue.push((Arc::clone(shared), jobs.into(), now));
                None
            }
            None => {
                *d = Some(Vec::new());
                Some(jobs)
            }
        }
    });
    let Some(jobs) = outer else { return };
    let mut next = Some((Arc::clone(shared), VecDeque::from(jobs), now));
    while let Some((shared, jobs, now)) = next {
        dispatch_now(&shared, jobs, now);
        next = DISPATCHING.with(|d| d.borrow_mut().as_mut().and_then(Vec::pop));
    }
    DISPATCHING.with(|d| *d.borrow_mut() = None);
}

/// Batches of jobs to dispatch, queued while this thread is already dispatching.
type Batches = Option<Vec<(Arc<Shared>, VecDeque<(Job, Next)>, Timestamp)>>;

thread_local! {
    static DISPATCHING: std::cell::RefCell<Batches> = const { std::cell::RefCell::new(None) };
}

fn dispatch_now(shared: &Arc<Shared>, jobs: VecDeque<(Job, Next)>, now: Timestamp) {
    for (job, next) in jobs {
        match next {
            Next::Answer(HostAnswer::Go(ticket)) => {
                if let Err(job) = send(shared, job, ticket) {
                    job.finish(not_sent("delivery workers stopped"));
                }
            }
            Next::Drop => drop(job),
            Next::Answer(other) => {
                let result = {
                    let mut g = shared.lock();
                    let host = g.book.host(job.recipient.origin());
                    g.result(host, other, now)
                };
                job.finish(result);
            }
        }
    }
}

/// Hands `job` to the inner executor under `ticket`. A job it refuses (it stopped) comes back
/// unrun: its place is given back to the book, nothing counted (and, unlike a ticket's end,
/// no waiting job is let go from here: the caller decides what becomes of this one).
// The job comes back by value on the rare refusal, as from `Executor::execute`.
#[allow(clippy::result_large_err)]
fn send(shared: &Arc<Shared>, mut job: Job, ticket: HostTicket) -> Result<(), Job> {
    job.origin = Some(OriginTicket::new(
        Arc::clone(shared) as Arc<dyn TicketSink>,
        ticket,
        Arc::clone(job.recipient.origin()),
    ));
    shared.inner.execute(job).map_err(|mut job| {
        if let Some(t) = job.origin.take() {
            let t = t.disarm();
            shared.lock().book.handle_unsent(t);
        }
        job
    })
}

impl TicketSink for Shared {
    fn ended(
        self: Arc<Self>,
        ticket: HostTicket,
        end: Option<(HostEnd, Option<&str>, Option<KnockReport>)>,
    ) {
        let now = self.clock.now();
        let mut out = Vec::new();
        let dirty = {
            let mut g = self.lock();
            match end {
                Some((end, error, knock)) => g.book.handle_end(ticket, end, error, knock, now),
                None => g.book.handle_unsent(ticket),
            }
            g.readmit(ticket.host(), now, &mut out);
            g.log_events();
            g.book.has_dirty()
        };
        if dirty {
            self.changed.notify_all();
        }
        dispatch(&self, out, now);
    }
}

impl Executor for OriginGate {
    fn execute(&self, job: Job) -> Result<(), Job> {
        let now = self.shared.clock.now();
        let answer = {
            let mut g = self.shared.lock();
            let host = g.book.host(job.recipient.origin());
            let answer = g.book.handle_attempt(host, now);
            if answer == HostAnswer::Wait {
                g.queue(host).push_back(job);
                return Ok(());
            }
            answer
        };
        let HostAnswer::Go(ticket) = answer else {
            dispatch(&self.shared, vec![(job, Next::Answer(answer))], now);
            return Ok(());
        };
        send(&self.shared, job, ticket)
    }

    fn shutdown(&self) {
        let waiting: Vec<Job> = self
            .shared
            .lock()
            .waiting
            .iter_mut()
            .flat_map(|q| q.drain(..))
            .collect();
        drop(waiting);
        self.shared.inner.shutdown();
        // What the last attempts taught is written before the process goes.
        if let Some(store) = self.shared.store.get() {
            write_dirty(&self.shared, &**store);
        }
        {
            // Under the lock the writer checks it under, so its wake-up is not lost.
            let _g = self.shared.lock();
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

/// A host's state as its store row.
fn record(origin: &str, s: &HostState) -> HostRecord {
    HostRecord {
        origin: origin.to_owned(),
        failures: s.failures,
        level: s.level,
        not_before: s.not_before,
        failing_since: s.failing_since,
        last_error: s.last_error.clone(),
        blocked: s.control,
        spec: s.spec.map(|(spec, _)| spec.as_str().to_owned()),
        spec_at: s.spec.map(|(_, at)| at),
        updated_at: s.updated_at,
    }
}

/// A store row as the book's state.
fn state(r: &HostRecord) -> HostState {
    HostState {
        failures: r.failures,
        level: r.level,
        not_before: r.not_before,
        failing_since: r.failing_since,
        last_error: r.last_error.clone(),
        control: r.blocked,
        spec: r
            .spec
            .as_deref()
            .and_then(SignatureSpec::from_code)
            .map(|s| (s, r.spec_at.unwrap_or(r.updated_at))),
        updated_at: r.updated_at,
    }
}

/// Gives `rows` to the book; the jobs waiting for any host are asked about again.
fn apply(shared: &Arc<Shared>, rows: &HostRows) {
    let now = shared.clock.now();
    let mut out = Vec::new();
    {
        let mut g = shared.lock();
        let before = g.book.generation();
        g.book.handle_rows(
            rows.generation,
            rows.hosts.iter().map(|r| (r.origin.as_str(), state(r))),
        );
        if g.book.generation() > before {
            debug!(
                generation = rows.generation,
                hosts = rows.hosts.len(),
                "an operator acted on hosts; their rows are the book's"
            );
        }
        let hosts: Vec<HostId> = g.book.hosts().collect();
        for h in hosts {
            g.readmit(h, now, &mut out);
        }
        g.log_events();
    }
    dispatch(shared, out, now);
}

fn refresh(shared: &Arc<Shared>, store: &dyn DriverStore) {
    match store.hosts() {
        Ok(rows) => apply(shared, &rows),
        Err(e) => debug!(error = %e, "host states not read; tried again"),
    }
}

/// Writes every host the book changed; a failed write is tried again later.
fn write_dirty(shared: &Shared, store: &dyn DriverStore) {
    let (ids, rows): (Vec<HostId>, Vec<HostRecord>) = {
        let mut g = shared.lock();
        let ids = g.book.take_dirty();
        let rows = ids
            .iter()
            .map(|&h| record(g.book.origin(h), g.book.state(h)))
            .collect();
        (ids, rows)
    };
    if rows.is_empty() {
        return;
    }
    if let Err(e) = store.write_hosts(&rows) {
        warn!(error = %e, hosts = rows.len(), "host states not written; written again later");
        let mut g = shared.lock();
        for h in ids {
            g.book.mark_dirty(h);
        }
    }
}

/// The writer thread: writes changed hosts, reads every row back each [`HOST_REFRESH`], and
/// ends once the gate is dropped or shut down.
fn writer(shared: &std::sync::Weak<Shared>, store: &dyn DriverStore) {
    let mut next_refresh = match shared.upgrade() {
        Some(s) => s.clock.now() + HOST_REFRESH,
        None => return,
    };
    loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        {
            let g = shared.lock();
            let left = next_refresh.saturating_duration_since(shared.clock.now());
            if !g.book.has_dirty() && !shared.stopped.load(Ordering::SeqCst) && !left.is_zero() {
                // Woken early by a change (or the stop); the refresh keeps its time.
                let _ = shared
                    .changed
                    .wait_timeout(g, left)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }
        write_dirty(&shared, store);
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        let now = shared.clock.now();
        if now >= next_refresh {
            refresh(&shared, store);
            next_refresh = now + HOST_REFRESH;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use outbox_lanes_core::host::HostControl;

    use super::*;
    use crate::job::Done;
    use crate::testing::{Held, ManualClock, answered, job};

    fn refused() -> AttemptResult {
        AttemptResult {
            outcome: Outcome::Transient { retry_after: None },
            status: None,
            error: Some("connection_refused: Connection refused (os error 111)".into()),
        }
    }

    fn gate(cfg: HostConfig) -> (OriginGate, Arc<Held>, Arc<ManualClock>) {
        let held = Arc::new(Held::default());
        let clock = ManualClock::at(Timestamp::from_secs(1_700_000_000));
        let g = OriginGate::new(
            Arc::clone(&held) as Arc<dyn Executor>,
            cfg,
            7,
            Arc::clone(&clock) as Arc<dyn Clock>,
        );
        (g, held, clock)
    }

    fn outcomes(rx: &mpsc::Receiver<Done>) -> Vec<(u64, Outcome)> {
        rx.try_iter()
            .map(|d| (d.unit.0, d.result.outcome))
            .collect()
    }

    #[test]
    fn a_dead_host_gets_its_window_then_backs_off_and_defers_what_waits() {
        let (g, held, clock) = gate(HostConfig {
            first_contact: 4,
            ..HostConfig::default()
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
        // Failing: what is in flight tells first; nothing new goes.
        assert_eq!(held.running(), [3, 4, 99]);
        held.finish(3, refused());
        // The third failure in a row: the jobs that waited are deferred, nothing sent.
        let got = outcomes(&rx);
        let deferred: Vec<u64> = got
            .iter()
            .filter(|(_, o)| matches!(o, Outcome::Deferred { .. }))
            .map(|&(u, _)| u)
            .collect();
        assert_eq!(deferred, (5..=20).collect::<Vec<_>>());
        let dead = g
            .snapshot()
            .into_iter()
            .find(|h| h.origin == "https://dead.example:443")
            .expect("dead");
        assert_eq!((dead.failures, dead.level), (3, 1));
        // Ten seconds on (± 20 %), the next attempt is the probe.
        clock.advance(Duration::from_secs(13));
        assert!(g.execute(job(21, "https://dead.example/x", &tx)).is_ok());
        assert_eq!(held.running(), [4, 99, 21]);
        assert!(held.take(21).origin().expect("ticket").probe());
    }

    #[test]
    fn held_and_dead_lettered_hosts_answer_without_sending_and_name_the_host() {
        let (g, held, _) = gate(HostConfig::default());
        let (tx, rx) = mpsc::channel();
        let mut row = HostRecord::new("https://b.example:443", Timestamp::from_secs(1));
        row.blocked = HostControl::Hold;
        g.apply_rows(&HostRows {
            generation: 1,
            hosts: vec![row.clone()],
        });
        assert!(g.execute(job(1, "https://b.example/a", &tx)).is_ok());
        row.blocked = HostControl::DeadLetter;
        g.apply_rows(&HostRows {
            generation: 2,
            hosts: vec![row],
        });
        assert!(g.execute(job(2, "https://b.example/a", &tx)).is_ok());
        assert!(held.running().is_empty(), "nothing reached a blocked host");
        let got: Vec<Done> = rx.try_iter().collect();
        assert_eq!(got[0].result.outcome, Outcome::Held);
        assert_eq!(
            got[1].result.outcome,
            Outcome::SetAside {
                reason: DeadReason::Blocked
            }
        );
        assert!(
            got[1]
                .result
                .error
                .as_deref()
                .is_some_and(|e| e
                    .starts_with("host_blocked: https://b.example:443 is blocked by an operator")),
            "{:?}",
            got[1].result.error
        );
    }

    #[test]
    fn a_block_answers_the_jobs_waiting_for_the_host_and_an_unblock_lets_them_go() {
        let (g, held, _) = gate(HostConfig {
            first_contact: 1,
            ..HostConfig::default()
        });
        let (tx, rx) = mpsc::channel();
        for u in 1..=3 {
            assert!(g.execute(job(u, "https://c.example/i", &tx)).is_ok());
        }
        assert_eq!(held.running(), [1]);
        let mut row = HostRecord::new("https://c.example:443", Timestamp::from_secs(1));
        row.blocked = HostControl::DeadLetter;
        g.apply_rows(&HostRows {
            generation: 1,
            hosts: vec![row.clone()],
        });
        // The waiting jobs are set aside at once; the attempt in flight finishes.
        assert_eq!(
            outcomes(&rx),
            [
                (
                    2,
                    Outcome::SetAside {
                        reason: DeadReason::Blocked
                    }
                ),
                (
                    3,
                    Outcome::SetAside {
                        reason: DeadReason::Blocked
                    }
                )
            ]
        );
        held.deliver(1);
        assert_eq!(outcomes(&rx), [(1, Outcome::Delivered)]);
        row.blocked = HostControl::Open;
        g.apply_rows(&HostRows {
            generation: 2,
            hosts: vec![row],
        });
        assert!(g.execute(job(4, "https://c.example/i", &tx)).is_ok());
        assert_eq!(held.running(), [4]);
    }

    #[test]
    fn answers_widen_a_host_and_a_refused_or_dropped_job_gives_its_place_back() {
        let (g, held, _) = gate(HostConfig {
            first_contact: 2,
            max_in_flight: 8,
            ..HostConfig::default()
        });
        let (tx, rx) = mpsc::channel();
        for u in 1..=4 {
            assert!(g.execute(job(u, "https://d.example/i", &tx)).is_ok());
        }
        assert_eq!(held.running(), [1, 2]);
        // The first answer opens the window to half the budget (4).
        held.finish(1, answered(503));
        assert_eq!(held.running(), [2, 3, 4]);
        // A job dropped unrun frees its place without teaching anything.
        drop(held.take(2));
        assert_eq!(outcomes(&rx).last().map(|d| d.1), Some(Outcome::NotSent));
        assert_eq!(g.load(), [("https://d.example:443".to_owned(), 2, 4)]);
        // A stopped executor refuses: the job comes back, its place is given back.
        held.stopped.store(true, Ordering::SeqCst);
        assert!(g.execute(job(5, "https://d.example/i", &tx)).is_err());
        assert_eq!(g.load(), [("https://d.example:443".to_owned(), 2, 4)]);
    }
}
