//! The origin gate: the executor of the core's [`HostBook`] (OL-21, OL-22, OL-23), in front
//! of an outbox's executor, and the writer of `ol_hosts`.
//!
//! Every decision about a host — health and backoff, its share of the in-flight budget, the
//! operator's block, the signature scheme and the double-knock's plan — is the book's
//! ([`outbox_lanes_core::host`], transcript-tested in virtual time). The gate only executes
//! its answers for each [`Job`]:
//!
//! - [`HostAnswer::Go`]: the job carries an [`OriginTicket`] to the inner executor; its end
//!   goes back to the book, and jobs that waited for the host are asked about again.
//! - [`HostAnswer::Wait`]: the job waits in its host's queue, holding no worker or task,
//!   until an attempt of the host ends or, for a paced host, until its pace lets it go. Its
//!   pass is told (through [`Completions::host_wait`](crate::Completions::host_wait)), and when it
//!   goes: meanwhile it takes no place of the pass's in-flight bound, so a host that holds
//!   back its lanes' attempts (one not answered yet, or hanging) does not keep the pass
//!   from starting other hosts' lanes.
//! - [`HostAnswer::Defer`], [`HostAnswer::Held`], [`HostAnswer::SetAside`]: the job is
//!   finished at once with [`Outcome::Deferred`], [`Outcome::Held`] or [`Outcome::SetAside`]
//!   (nothing sent), with an error that names the host.
//!
//! The gate reads no clock of its own (it is given one, [`Clock`]) and draws no random
//! number (the book's jitter is seeded).
//!
//! # Pacing
//!
//! A host with a requests-per-second limit (OL-23) ([`HostConfig::paces`], filled from
//! [`RateLimits::hosts`](crate::RateLimits::hosts) by
//! [`OutboxConfig::host_book`](crate::OutboxConfig::host_book)) is paced by the book: its
//! attempt starts are spaced at least `1 / rate` apart, whichever lanes and actors they come
//! from, and an attempt that comes sooner waits in the host's queue like one its window
//! holds back, holding no worker, no place in the budget and no place under a per-host cap.
//! Since no attempt's end may come to let it go, a gate with paced hosts runs a small
//! *pacer* thread: it sleeps until the book's earliest pace deadline
//! ([`HostBook::poll_timeout`]; woken sooner when a job that waits makes an earlier one), then
//! asks the book again about the waiting jobs of the hosts due ([`HostBook::poll_due`]) and
//! sends those that go. It reads the time from the gate's [`Clock`], runs only while paces
//! are configured, and ends when the gate is shut down or dropped. The pace holds the
//! starts of attempts, not their ends: a paced host's window, health and the operator's
//! control still apply (a held or backing-off host answers as ever; its probe is paced too).
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
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use outbox_lanes_core::host::{
    Deferral, HostAnswer, HostBook, HostConfig, HostEnd, HostEvent, HostId, HostState, HostTicket,
    KnockReport,
};
use outbox_lanes_core::{DeadReason, MIN_DEFERRAL, Outcome, Timestamp};
use outbox_lanes_store::{DriverStore, HostRecord, HostRows, SpawnThread};
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
    /// Where the gate starts its threads (the runtime's).
    threads: Arc<dyn SpawnThread>,
    gate: Mutex<Gate>,
    /// Wakes the writer thread: a host changed, or the gate stops.
    changed: Condvar,
    stopped: AtomicBool,
    /// Where the state is shared ([`OriginGate::share_through`]).
    store: std::sync::OnceLock<Arc<dyn DriverStore>>,
    /// The writer thread, joined at shutdown: it holds the store, whose last reference must
    /// go before the process exits (a SQLite store removes its holder lock files on drop).
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The pacer thread's alarm, while hosts are paced (see the module documentation).
    alarm: Option<Arc<Alarm>>,
    /// The pacer thread, joined at shutdown.
    pacer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The pacer holds the gate only while it sends; asleep, it is told here.
        if let Some(alarm) = &self.alarm {
            alarm.stop();
        }
    }
}

/// When the pacer thread wakes: the book's earliest pace deadline it was told of, unless the
/// gate stopped.
#[derive(Debug, Default)]
struct Alarm {
    state: Mutex<AlarmState>,
    rang: Condvar,
}

#[derive(Debug, Default)]
struct AlarmState {
    at: Option<Timestamp>,
    stopped: bool,
}

impl Alarm {
    fn lock(&self) -> MutexGuard<'_, AlarmState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the pacer at `at`, if that is sooner than it would wake.
    fn set(&self, at: Timestamp) {
        let mut s = self.lock();
        if s.at.is_none_or(|t| at < t) {
            s.at = Some(at);
            self.rang.notify_all();
        }
    }

    /// Ends the pacer.
    fn stop(&self) {
        self.lock().stopped = true;
        self.rang.notify_all();
    }

    /// Sleeps until the alarm's time by `clock` (`true`) or the stop (`false`).
    fn wait(&self, clock: &dyn Clock) -> bool {
        let mut s = self.lock();
        loop {
            if s.stopped {
                return false;
            }
            s = match s.at {
                None => self.rang.wait(s).unwrap_or_else(PoisonError::into_inner),
                Some(at) => {
                    let now = clock.now();
                    if at <= now {
                        s.at = None;
                        return true;
                    }
                    self.rang
                        .wait_timeout(s, at - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }
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

    /// The book's earliest pace deadline (read under the lock, `g`), if the gate paces.
    fn pace_deadline(&self, g: &Gate) -> Option<Timestamp> {
        self.alarm.as_ref().and_then(|_| g.book.poll_timeout())
    }

    /// Tells the pacer of the deadline `at` (read under the lock; told outside it).
    fn wake_pacer(&self, at: Option<Timestamp>) {
        if let (Some(alarm), Some(at)) = (&self.alarm, at) {
            alarm.set(at);
        }
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
                        "host backing off after failures in a row (connections, or timeouts of a host that has not answered)"
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
            body: None,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl OriginGate {
    /// A gate in front of `inner` with a book of `cfg`, jitter seeded with `seed`, the time
    /// from `clock`, its threads started on `threads` (an outbox's: its runtime's); with no
    /// store (nothing persisted or shared) until [`OriginGate::share_through`]. With
    /// [`HostConfig::paces`], it starts its pacer thread (see [Pacing](self#pacing)); should
    /// that thread not start, the paces are logged and dropped rather than leave jobs waiting
    /// for a pace that nothing would let go.
    pub fn new(
        inner: Arc<dyn Executor>,
        cfg: HostConfig,
        seed: u64,
        clock: Arc<dyn Clock>,
        threads: Arc<dyn SpawnThread>,
    ) -> OriginGate {
        let pacer = !cfg.paces.is_empty();
        OriginGate::build(inner, cfg, seed, clock, threads, pacer)
    }

    /// [`OriginGate::new`], with the pacer thread only if `pacer` (a test drives
    /// [`pace`] by hand instead).
    fn build(
        inner: Arc<dyn Executor>,
        mut cfg: HostConfig,
        seed: u64,
        clock: Arc<dyn Clock>,
        threads: Arc<dyn SpawnThread>,
        pacer: bool,
    ) -> OriginGate {
        let shared = Arc::new_cyclic(|weak: &Weak<Shared>| {
            // Paced hosts need the alarm; the thread wakes at it (a test rings it by hand).
            let alarm = (!cfg.paces.is_empty()).then(|| Arc::new(Alarm::default()));
            let mut thread = None;
            if let Some(alarm) = alarm.as_ref().filter(|_| pacer) {
                let (weak, alarm, clock) = (weak.clone(), Arc::clone(alarm), Arc::clone(&clock));
                // It upgrades `weak` only once an alarm the gate set rang.
                let run = move || pacer_thread(&weak, &alarm, &*clock);
                match threads.spawn_thread("outbox-lanes-pacer", Box::new(run)) {
                    Ok(handle) => thread = Some(handle),
                    Err(e) => {
                        warn!(
                            error = %e,
                            hosts = cfg.paces.len(),
                            "the pacer thread did not start; hosts are not paced"
                        );
                        cfg.paces.clear();
                    }
                }
            }
            Shared {
                inner,
                clock,
                threads,
                alarm: alarm.filter(|_| !cfg.paces.is_empty()),
                gate: Mutex::new(Gate {
                    book: HostBook::new(cfg, seed),
                    waiting: Vec::new(),
                }),
                changed: Condvar::new(),
                stopped: AtomicBool::new(false),
                store: std::sync::OnceLock::new(),
                writer: Mutex::new(None),
                pacer: Mutex::new(thread),
            }
        });
        OriginGate { shared }
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
        let run = move || {
            if let Some(s) = shared.upgrade() {
                refresh(&s, &*store);
            }
            let _ = loaded.send(());
            writer(&shared, &*store);
        };
        let handle = self
            .shared
            .threads
            .spawn_thread("outbox-lanes-hosts", Box::new(run))?;
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
                // It waited (only a job that waited is let go from here): it takes its
                // pass's place again.
                job.report_host_wait(false);
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
        let (dirty, deadline) = {
            let mut g = self.lock();
            match end {
                Some((end, error, knock)) => g.book.handle_end(ticket, end, error, knock, now),
                None => g.book.handle_unsent(ticket),
            }
            g.readmit(ticket.host(), now, &mut out);
            g.log_events();
            (g.book.has_dirty(), self.pace_deadline(&g))
        };
        if dirty {
            self.changed.notify_all();
        }
        self.wake_pacer(deadline);
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
                // It takes no place of its pass's in-flight bound while it waits.
                job.report_host_wait(true);
                g.queue(host).push_back(job);
                let deadline = self.shared.pace_deadline(&g);
                drop(g);
                self.shared.wake_pacer(deadline);
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
        // The pacer first: nothing it lets go after the waiting jobs are dropped.
        if let Some(alarm) = &self.shared.alarm {
            alarm.stop();
        }
        let pacer = self
            .shared
            .pacer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(p) = pacer.filter(|p| p.thread().id() != std::thread::current().id()) {
            let _ = p.join();
        }
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
    let deadline = {
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
        shared.pace_deadline(&g)
    };
    shared.wake_pacer(deadline);
    dispatch(shared, out, now);
}

/// The pacer thread: at each alarm, [`pace`]; ends once the gate is shut down or dropped.
fn pacer_thread(shared: &Weak<Shared>, alarm: &Alarm, clock: &dyn Clock) {
    while alarm.wait(clock) {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        pace(&shared);
    }
}

/// The book's pace deadline came: the waiting jobs of every host due are asked about again,
/// in order, until one must wait again, and sent or answered (outside the lock); the pacer is
/// told of the next deadline.
fn pace(shared: &Arc<Shared>) {
    let now = shared.clock.now();
    let mut out = Vec::new();
    let deadline = {
        let mut g = shared.lock();
        while let Some(host) = g.book.poll_due(now) {
            g.readmit(host, now, &mut out);
        }
        g.log_events();
        shared.pace_deadline(&g)
    };
    shared.wake_pacer(deadline);
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

    use outbox_lanes_store::StdThreads;

    use super::*;
    use crate::job::Done;
    use crate::testing::{Held, ManualClock, answered, job};

    fn refused() -> AttemptResult {
        AttemptResult {
            outcome: Outcome::Transient { retry_after: None },
            status: None,
            error: Some("connection_refused: Connection refused (os error 111)".into()),
            body: None,
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
            Arc::new(StdThreads),
        );
        (g, held, clock)
    }

    const PACED: &str = "https://p.example:443";

    /// `PACED` paced at `interval`, with a first contact of ten: the pace, not the window,
    /// holds back the jobs of these tests (none of them answers).
    fn paced(interval: Duration) -> HostConfig {
        HostConfig {
            paces: vec![(PACED.to_owned(), interval)],
            first_contact: 10,
            ..HostConfig::default()
        }
    }

    /// The deadline the gate told its pacer of.
    fn alarm(g: &OriginGate) -> Option<Timestamp> {
        g.shared.alarm.as_ref().expect("paced").lock().at
    }

    /// What the pacer thread does when its alarm rings.
    fn ring(g: &OriginGate) {
        g.shared.alarm.as_ref().expect("paced").lock().at = None;
        pace(&g.shared);
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

    #[test]
    fn a_paced_host_s_waiting_jobs_go_one_per_interval_when_the_pacer_rings() {
        let held = Arc::new(Held::default());
        let clock = ManualClock::at(Timestamp::from_secs(1_700_000_000));
        let t0 = clock.now();
        // No thread: the test rings the pacer by hand.
        let g = OriginGate::build(
            Arc::clone(&held) as Arc<dyn Executor>,
            paced(Duration::from_millis(100)),
            7,
            Arc::clone(&clock) as Arc<dyn Clock>,
            Arc::new(StdThreads),
            false,
        );
        let (tx, rx) = mpsc::channel();
        for u in 1..=5 {
            assert!(g.execute(job(u, "https://p.example/inbox", &tx)).is_ok());
        }
        // An unpaced host beside it is not slowed.
        for u in 6..=8 {
            assert!(g.execute(job(u, "https://q.example/inbox", &tx)).is_ok());
        }
        assert_eq!(held.running(), [1, 6, 7, 8]);
        assert_eq!(alarm(&g), Some(t0 + Duration::from_millis(100)));
        // Early: nothing is due, the alarm is set again.
        ring(&g);
        assert_eq!(held.running(), [1, 6, 7, 8]);
        assert_eq!(alarm(&g), Some(t0 + Duration::from_millis(100)));
        // No attempt ends; the pace alone lets the next go.
        clock.advance(Duration::from_millis(100));
        ring(&g);
        assert_eq!(held.running(), [1, 6, 7, 8, 2]);
        assert_eq!(alarm(&g), Some(t0 + Duration::from_millis(200)));
        // An attempt's end asks again too, and the pace still holds.
        held.deliver(1);
        assert_eq!(held.running(), [6, 7, 8, 2]);
        // A late ring lets one go, no more (no burst), and the next is an interval on.
        clock.advance(Duration::from_millis(250));
        ring(&g);
        assert_eq!(held.running(), [6, 7, 8, 2, 3]);
        assert_eq!(alarm(&g), Some(t0 + Duration::from_millis(450)));
        // A new job while others wait for the pace waits too.
        assert!(g.execute(job(9, "https://p.example/other", &tx)).is_ok());
        assert_eq!(held.running(), [6, 7, 8, 2, 3]);
        for _ in 0..3 {
            clock.advance(Duration::from_millis(100));
            ring(&g);
        }
        assert_eq!(held.running(), [6, 7, 8, 2, 3, 4, 5, 9]);
        assert_eq!(outcomes(&rx), [(1, Outcome::Delivered)]);
        assert_eq!(g.shared.lock().book.poll_timeout(), None);
    }

    #[test]
    fn a_paced_host_held_by_an_operator_answers_its_waiting_jobs_at_once() {
        let held = Arc::new(Held::default());
        let clock = ManualClock::at(Timestamp::from_secs(1_700_000_000));
        let g = OriginGate::build(
            Arc::clone(&held) as Arc<dyn Executor>,
            paced(Duration::from_secs(60)),
            7,
            Arc::clone(&clock) as Arc<dyn Clock>,
            Arc::new(StdThreads),
            false,
        );
        let (tx, rx) = mpsc::channel();
        for u in 1..=3 {
            assert!(g.execute(job(u, "https://p.example/inbox", &tx)).is_ok());
        }
        assert_eq!(held.running(), [1]);
        let mut row = HostRecord::new(PACED, Timestamp::from_secs(1));
        row.blocked = HostControl::Hold;
        g.apply_rows(&HostRows {
            generation: 1,
            hosts: vec![row],
        });
        assert_eq!(outcomes(&rx), [(2, Outcome::Held), (3, Outcome::Held)]);
        // The pacer rings for nothing.
        clock.advance(Duration::from_secs(60));
        ring(&g);
        assert_eq!(held.running(), [1]);
    }

    #[test]
    fn the_host_book_paces_the_hosts_of_the_rate_limits() {
        let mut c = crate::OutboxConfig::default();
        assert!(c.host_book().paces.is_empty());
        c.rates = crate::RateLimits::none()
            .with_host("https://Hooks.Example", 50.0)
            .expect("rate");
        assert_eq!(
            c.host_book().paces,
            [(
                "https://hooks.example:443".to_owned(),
                Duration::from_millis(20)
            )]
        );
        // Unpaced, a gate starts no pacer.
        let g = OriginGate::new(
            Arc::new(Held::default()),
            HostConfig::default(),
            7,
            Arc::new(crate::clock::SystemClock),
            Arc::new(StdThreads),
        );
        assert!(g.shared.alarm.is_none());
        assert!(g.shared.pacer.lock().expect("lock").is_none());
    }

    #[test]
    fn the_pacer_thread_runs_on_the_clock_it_is_given() {
        let held = Arc::new(Held::default());
        let clock = ManualClock::at(Timestamp::from_secs(1_700_000_000));
        let threads = Arc::new(crate::testing::NamedThreads::default());
        let interval = Duration::from_millis(20);
        let g = OriginGate::new(
            Arc::clone(&held) as Arc<dyn Executor>,
            paced(interval),
            7,
            Arc::clone(&clock) as Arc<dyn Clock>,
            Arc::clone(&threads) as Arc<dyn SpawnThread>,
        );
        assert_eq!(threads.names(), ["outbox-lanes-pacer"]);
        let (tx, _rx) = mpsc::channel();
        for u in 1..=3 {
            assert!(g.execute(job(u, "https://p.example/inbox", &tx)).is_ok());
        }
        assert_eq!(held.running(), [1]);
        // The wall clock runs past the interval many times; the gate's clock stands still,
        // so the pace holds the next job.
        std::thread::sleep(interval * 5);
        assert_eq!(held.running(), [1]);
        // Each time the clock moves by the interval, the thread lets one more go.
        for running in [vec![1, 2], vec![1, 2, 3]] {
            clock.advance(interval);
            // A guard against a hang (about a minute), not a bound on the time.
            for waited in 0.. {
                if held.running() == running {
                    break;
                }
                assert!(waited < 60_000, "the pacer let the next job go");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        g.shutdown();
        assert!(g.shared.pacer.lock().expect("lock").is_none());
    }

    /// Records when each job reached it, on the system's monotonic clock, and holds it.
    #[derive(Default)]
    struct Stamped {
        started: Mutex<Vec<(u64, std::time::Instant)>>,
        jobs: Mutex<Vec<Job>>,
        tx: Mutex<Option<mpsc::Sender<()>>>,
    }

    impl Executor for Stamped {
        fn execute(&self, job: Job) -> Result<(), Job> {
            let at = crate::clock::SystemClock.instant();
            self.started.lock().expect("lock").push((job.unit.0, at));
            self.jobs.lock().expect("lock").push(job);
            if let Some(tx) = self.tx.lock().expect("lock").as_ref() {
                let _ = tx.send(());
            }
            Ok(())
        }
    }

    #[test]
    fn on_the_wall_clock_the_pacer_sends_waiting_jobs_spaced_and_ends_with_the_gate() {
        let (started, starts) = mpsc::channel();
        let inner = Arc::new(Stamped {
            tx: Mutex::new(Some(started)),
            ..Stamped::default()
        });
        let g = OriginGate::new(
            Arc::clone(&inner) as Arc<dyn Executor>,
            paced(Duration::from_millis(20)),
            7,
            Arc::new(crate::clock::SystemClock),
            Arc::new(StdThreads),
        );
        let alarm = Arc::clone(g.shared.alarm.as_ref().expect("paced"));
        let (tx, _rx) = mpsc::channel();
        let before = crate::clock::SystemClock.instant();
        for u in 1..=5 {
            assert!(g.execute(job(u, "https://p.example/inbox", &tx)).is_ok());
        }
        for _ in 0..5 {
            // A guard against a hang, not a bound on the time.
            starts
                .recv_timeout(Duration::from_secs(60))
                .expect("every waiting job went");
        }
        let got = inner.started.lock().expect("lock").clone();
        assert_eq!(got.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        // Four intervals at least from before the first to the last (less the clock's
        // millisecond), and each start well apart from the one before.
        let span = got[4].1.duration_since(before);
        assert!(span >= Duration::from_millis(79), "{span:?}");
        for w in got.windows(2) {
            let gap = w[1].1.duration_since(w[0].1);
            assert!(gap >= Duration::from_millis(5), "{gap:?}");
        }
        // Shut down: the pacer is stopped and joined.
        g.shutdown();
        assert!(g.shared.pacer.lock().expect("lock").is_none());
        assert_eq!(Arc::strong_count(&alarm), 2, "the gate's and this test's");

        // A gate dropped with jobs waiting ends its pacer too.
        let inner = Arc::new(Stamped::default());
        let g = OriginGate::new(
            Arc::clone(&inner) as Arc<dyn Executor>,
            paced(Duration::from_secs(3600)),
            7,
            Arc::new(crate::clock::SystemClock),
            Arc::new(StdThreads),
        );
        let alarm = Arc::clone(g.shared.alarm.as_ref().expect("paced"));
        for u in 1..=2 {
            assert!(g.execute(job(u, "https://p.example/inbox", &tx)).is_ok());
        }
        drop(g);
        // The job in flight holds its ticket, hence the gate: it goes first.
        drop(std::mem::take(&mut *inner.jobs.lock().expect("lock")));
        // A guard against a hang (about a minute), not a bound on the time.
        for waited in 0.. {
            if Arc::strong_count(&alarm) == 1 {
                break;
            }
            assert!(waited < 60_000, "the pacer thread ended");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
