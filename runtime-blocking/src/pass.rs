//! One pass of one actor: the core's scheduler driven against a store and a pool of
//! delivery workers.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant, SystemTime};

use outbox_lanes_core::{
    Admit, AdmitSlot, Command, HoldReason, LaneChunk, LaneClaim, LaneId, LaneInfo, Outcome,
    Scheduler, Timestamp, UnitId,
};
use outbox_lanes_store::{
    AckWriter, AttemptRecord, ClaimedLane, DeadLetterRequest, SlotToken, Store, StoreError,
    StoreLaneId,
};
use tracing::{debug, info, trace, warn};

use crate::http::{AttemptResult, Delivery, HttpClient};
use crate::{Attempted, DeadLettered, Delivered, Hooks, OutboxConfig};

/// What an executor reports back to the pass that started the attempt.
#[derive(Debug)]
pub struct Done {
    /// The unit.
    pub unit: UnitId,
    /// The recipient's lane.
    pub lane: LaneId,
    /// What the attempt came to.
    pub result: AttemptResult,
    /// When the job was handed to the executor.
    pub started: Instant,
}

/// A message to a running pass.
#[derive(Debug)]
pub enum Msg {
    /// An attempt finished.
    Done(Done),
    /// New rows were enqueued somewhere: look for lanes with new units.
    Wake,
}

/// One attempt for an [`Executor`] to run: fetch the payload, deliver it, then
/// [`Job::finish`].
#[derive(Debug)]
pub struct Job {
    /// The unit (its id is the idempotency key).
    pub unit: UnitId,
    /// The recipient's lane in the pass.
    pub lane: LaneId,
    /// The recipient URL.
    pub recipient: String,
    /// The 1-based attempt number.
    pub attempt: u32,
    started: Instant,
    reply: Sender<Msg>,
    /// Cleared when the pass that started the job has ended.
    live: Arc<AtomicBool>,
    /// The job's place under its host's cap ([`crate::HostCaps`]), freed when it is dropped.
    pub(crate) permit: Option<crate::hosts::HostPermit>,
}

impl Job {
    pub(crate) fn new(
        unit: UnitId,
        lane: LaneId,
        recipient: String,
        attempt: u32,
        reply: Sender<Msg>,
        live: Arc<AtomicBool>,
    ) -> Job {
        Job {
            unit,
            lane,
            recipient,
            attempt,
            started: Instant::now(),
            reply,
            live,
            permit: None,
        }
    }

    /// Whether the pass that started this job has ended (it was cancelled, or its grace
    /// period ran out) and handed the unit back: nobody waits for the answer any more, and
    /// an executor that has not sent the request yet should drop the job instead, so the
    /// recipient does not get a unit that will be sent again anyway.
    pub fn abandoned(&self) -> bool {
        !self.live.load(Ordering::SeqCst)
    }

    /// Reports the result to the pass. A pass that is gone (interrupted, cancelled) no
    /// longer cares, and the result is dropped.
    pub fn finish(self, result: AttemptResult) {
        let _ = self.reply.send(Msg::Done(Done {
            unit: self.unit,
            lane: self.lane,
            result,
            started: self.started,
        }));
    }
}

/// Runs delivery jobs: a pool of threads (the blocking runtime) or tasks (an async one).
pub trait Executor: Send + Sync {
    /// Runs `job` and calls [`Job::finish`] when it is done.
    ///
    /// # Errors
    /// The executor is shut down; the job is returned unrun.
    fn execute(&self, job: Job) -> Result<(), Job>;

    /// Stops taking jobs; returns once the jobs in progress are done.
    fn shutdown(&self) {}
}

/// One blocking attempt: the payload from the store, then the POST. Never fails: a payload
/// the store cannot give (locked, gone) counts as a transient failure, which costs an
/// attempt but loses nothing.
pub fn attempt(store: &dyn Store, http: &HttpClient, job: &Job) -> AttemptResult {
    match store.payload(job.unit) {
        Ok(p) => {
            let d = Delivery {
                unit: job.unit,
                recipient: &job.recipient,
                body: &p.body,
                content_type: &p.content_type,
                attempt: job.attempt,
            };
            http.deliver(&d, SystemTime::now())
        }
        Err(e) => payload_failed(&e),
    }
}

/// The result of an attempt whose payload the store could not give (locked, gone): a
/// transient failure, which costs an attempt but loses nothing.
pub fn payload_failed(e: &StoreError) -> AttemptResult {
    AttemptResult {
        outcome: Outcome::Transient { retry_after: None },
        status: None,
        error: Some(format!("payload: {e}")),
    }
}

/// Why a pass stopped early.
#[derive(Debug)]
pub(crate) enum PassError {
    Store(StoreError),
    /// The caller went away (a dropped future): everything was handed back.
    Cancelled,
}

impl From<StoreError> for PassError {
    fn from(e: StoreError) -> Self {
        PassError::Store(e)
    }
}

/// How a pass ended.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    /// Recipients served.
    pub delivered: u64,
    /// Recipients dead-lettered.
    pub dead_lettered: u64,
    /// Units handed back at the end (stalled, waiting behind a stall, in backoff).
    pub handed_back: u64,
    /// The pass stopped at its time slice or for shutdown with work left.
    pub yielded: bool,
}

/// Per-unit facts the pass keeps for tracing and hooks.
struct UnitInfo {
    row_id: String,
    enqueued_at: Timestamp,
    /// Recipients not yet delivered or dead-lettered in this pass.
    open: usize,
}

pub(crate) struct Pass<'a> {
    pub(crate) store: &'a Arc<dyn Store>,
    pub(crate) acks: &'a AckWriter,
    pub(crate) executor: &'a dyn Executor,
    pub(crate) config: &'a OutboxConfig,
    pub(crate) hooks: &'a Hooks,
    /// Stop starting units, finish what is in flight (shutdown, time slice).
    pub(crate) stop: &'a dyn Fn() -> bool,
    /// Stop now and hand everything back (the caller is gone).
    pub(crate) cancel: &'a dyn Fn() -> bool,
    pub(crate) token: SlotToken,
}

fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

struct State {
    sched: Scheduler,
    lanes: HashMap<StoreLaneId, LaneId>,
    store_lanes: Vec<StoreLaneId>,
    recipients: Vec<String>,
    units: HashMap<UnitId, UnitInfo>,
    last: HashMap<(UnitId, LaneId), AttemptResult>,
    watermark: u64,
    /// Shared with every job this pass started; cleared when the pass ends.
    live: Arc<AtomicBool>,
    /// A wake-up arrived: look for new lanes once the waiting messages are handled (a burst
    /// of enqueues costs one look, not one per enqueue).
    woken: bool,
    in_flight: usize,
    report: PassReport,
}

impl State {
    fn lane(&mut self, id: StoreLaneId, key: &outbox_lanes_core::LaneKey) -> LaneId {
        if let Some(l) = self.lanes.get(&id) {
            return *l;
        }
        let l = self.sched.lane(key);
        self.lanes.insert(id, l);
        if self.store_lanes.len() <= l.index() {
            self.store_lanes.resize(l.index() + 1, StoreLaneId(0));
            self.recipients.resize(l.index() + 1, String::new());
        }
        self.store_lanes[l.index()] = id;
        self.recipients[l.index()] = key.recipient().to_string();
        l
    }
}

impl Pass<'_> {
    /// Runs the pass to its end. On an error the scheduler is interrupted: every unfinished
    /// unit is handed back (OL-14) before the error is returned.
    pub(crate) fn run(&self) -> Result<PassReport, PassError> {
        let (tx, rx) = mpsc::channel();
        let wake_tx = tx.clone();
        let _subscription = self.store.notifier().subscribe(move || {
            let _ = wake_tx.send(Msg::Wake);
        });
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut st = State {
            sched: Scheduler::new(self.config.scheduler.clone(), seed),
            lanes: HashMap::new(),
            store_lanes: Vec::new(),
            recipients: Vec::new(),
            units: HashMap::new(),
            last: HashMap::new(),
            watermark: 0,
            live: Arc::new(AtomicBool::new(true)),
            woken: false,
            in_flight: 0,
            report: PassReport::default(),
        };
        let result = self.drive(&mut st, &tx, &rx);
        // Jobs not yet sent (queued behind busy workers, or parked under a host cap) are
        // dropped from now on: their units are handed back below.
        st.live.store(false, Ordering::SeqCst);
        match &result {
            Ok(()) => st.sched.handle_pass_end(now()),
            Err(e) => {
                warn!(actor = %self.token.actor(), error = ?e, "pass interrupted; handing every unfinished unit back");
                st.sched.handle_interrupt(now());
            }
        }
        // Hand-backs write nothing (a claim wrote nothing); they are only counted and traced.
        while let Some(cmd) = st.sched.poll_command() {
            if let Command::HandBack { unit } = cmd {
                st.report.handed_back += 1;
                trace!(%unit, "handed back");
            }
        }
        // Acks are durable before the slot is released: the next pass must not resend them.
        let flushed = self.acks.flush();
        result?;
        flushed?;
        Ok(st.report)
    }

    fn drive(&self, st: &mut State, tx: &Sender<Msg>, rx: &Receiver<Msg>) -> Result<(), PassError> {
        let started = Instant::now();
        let renew_every = self.config.lease / 3;
        let mut renewed = Instant::now();
        self.discover(st)?;
        let mut stopping = false;
        loop {
            if (self.cancel)() {
                return Err(PassError::Cancelled);
            }
            let t = now();
            self.execute(st, tx)?;
            if let Some(claims) = st.sched.poll_claim(t) {
                self.claim(st, &claims)?;
                continue;
            }
            if st.sched.is_done(t) && st.in_flight == 0 {
                return Ok(());
            }
            if !stopping && ((self.stop)() || started.elapsed() >= self.config.time_slice) {
                // Shutdown or the end of the time slice: nothing new starts, what is in flight
                // finishes, the rest goes back (and the monitor comes back for it).
                debug!(actor = %self.token.actor(), "pass stopping: time slice or shutdown");
                stopping = true;
                st.report.yielded = true;
                st.sched.handle_stop(t);
                continue;
            }
            if renewed.elapsed() >= renew_every {
                self.store.renew_slot(&self.token, self.config.lease)?;
                renewed = Instant::now();
            }
            let deadline = st.sched.poll_timeout();
            let mut wait = renew_every.saturating_sub(renewed.elapsed());
            if let Some(d) = deadline {
                wait = wait.min(Duration::from_millis(
                    d.as_millis().saturating_sub(t.as_millis()),
                ));
            }
            if !stopping {
                wait = wait.min(self.config.time_slice.saturating_sub(started.elapsed()));
            }
            if stopping && st.in_flight > 0 {
                // Wait for what is in flight, but not past the grace period.
                if started.elapsed() >= self.config.time_slice + self.config.shutdown_grace {
                    warn!(actor = %self.token.actor(), in_flight = st.in_flight, "grace period over; handing in-flight units back");
                    return Ok(());
                }
            }
            // Bounded so a cancellation is seen promptly even while nothing happens.
            let wait = wait.clamp(Duration::from_millis(1), Duration::from_millis(50));
            match rx.recv_timeout(wait) {
                Ok(msg) => self.handle(st, msg)?,
                Err(RecvTimeoutError::Timeout) => st.sched.handle_timeout(now()),
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
            // Take everything already waiting before the next round of commands.
            while let Ok(msg) = rx.try_recv() {
                self.handle(st, msg)?;
            }
            if core::mem::take(&mut st.woken) {
                self.discover(st)?;
            }
        }
    }

    fn handle(&self, st: &mut State, msg: Msg) -> Result<(), StoreError> {
        match msg {
            Msg::Wake => {
                st.woken = true;
                Ok(())
            }
            Msg::Done(d) => {
                st.in_flight -= 1;
                let t = now();
                let outcome = d.result.outcome;
                trace!(unit = %d.unit, lane = ?d.lane, ?outcome, status = ?d.result.status,
                    error = ?d.result.error, took_ms = d.started.elapsed().as_millis() as u64, "attempt finished");
                if let Some(hook) = &self.hooks.attempted {
                    let latency = d.started.elapsed();
                    let queued = st.units.get(&d.unit).map_or(Duration::ZERO, |u| {
                        t.saturating_sub(latency)
                            .saturating_duration_since(u.enqueued_at)
                    });
                    hook(&Attempted {
                        actor: self.token.actor().clone(),
                        unit: d.unit,
                        recipient: st.recipients[d.lane.index()].clone(),
                        outcome,
                        status: d.result.status,
                        latency,
                        queued,
                    });
                }
                st.last.insert((d.unit, d.lane), d.result);
                if let Err(e) = st.sched.handle_outcome(d.unit, d.lane, outcome, t) {
                    debug!(error = %e, "late completion ignored");
                }
                Ok(())
            }
        }
    }

    /// Tells the scheduler about lanes that got new units since the last look.
    fn discover(&self, st: &mut State) -> Result<(), StoreError> {
        let (infos, watermark) = self.store.lanes_with_work(&self.token, st.watermark)?;
        st.watermark = st.watermark.max(watermark);
        let t = now();
        for info in infos {
            if info.paused {
                continue;
            }
            let lane = st.lane(info.lane, &info.key);
            st.sched.handle_lane(
                lane,
                LaneInfo {
                    not_before: info.not_before,
                    level: info.backoff_level,
                    strict: info.strict,
                },
                t,
            );
        }
        Ok(())
    }

    fn claim(&self, st: &mut State, claims: &[LaneClaim]) -> Result<(), StoreError> {
        let req: Vec<outbox_lanes_store::LaneClaim> = claims
            .iter()
            .map(|c| outbox_lanes_store::LaneClaim {
                lane: st.store_lanes[c.lane.index()],
                from: c.from,
                limit: c.limit,
            })
            .collect();
        let answer = match self.store.claim(&self.token, &req) {
            Ok(a) => a,
            Err(e) => {
                st.sched.handle_claim_failed(now());
                return Err(e);
            }
        };
        let chunks: Vec<LaneChunk> = answer
            .into_iter()
            .filter_map(|cl: ClaimedLane| {
                // Only lanes this pass asked for come back.
                let lane = st.lanes.get(&cl.lane).copied()?;
                let units = cl
                    .units
                    .into_iter()
                    .map(|u| {
                        let slots = u
                            .slots
                            .iter()
                            .map(|s| AdmitSlot {
                                lane: st.lane(s.lane, &s.key),
                                attempts: s.attempts,
                                served: s.served,
                            })
                            .collect();
                        st.units.entry(u.id).or_insert(UnitInfo {
                            row_id: u.row_id.clone(),
                            enqueued_at: u.enqueued_at,
                            open: u.slots.iter().filter(|s| !s.served).count(),
                        });
                        Admit {
                            id: u.id,
                            seq: u.seq,
                            bytes: u.bytes,
                            enqueued_at: u.enqueued_at,
                            slots,
                        }
                    })
                    .collect();
                Some(LaneChunk {
                    lane,
                    units,
                    exhausted: cl.exhausted,
                })
            })
            .collect();
        let read: usize = chunks.iter().map(|c| c.units.len()).sum();
        let report = st.sched.handle_claimed(chunks, now());
        trace!(actor = %self.token.actor(), lanes = claims.len(), read, admitted = report.admitted, "claimed");
        for e in report.refused {
            warn!(actor = %self.token.actor(), error = %e, "store answer refused by the scheduler");
        }
        Ok(())
    }

    /// Executes every pending command, in order.
    fn execute(&self, st: &mut State, tx: &Sender<Msg>) -> Result<(), StoreError> {
        while let Some(cmd) = st.sched.poll_command() {
            match cmd {
                Command::Start {
                    unit,
                    lane,
                    attempt,
                } => {
                    if let Some(info) = st.units.get(&unit) {
                        trace!(%unit, row = %info.row_id, ?lane, attempt,
                            queued_ms = now().saturating_duration_since(info.enqueued_at).as_millis() as u64,
                            "started");
                    }
                    st.in_flight += 1;
                    let job = Job::new(
                        unit,
                        lane,
                        st.recipients[lane.index()].clone(),
                        attempt,
                        tx.clone(),
                        Arc::clone(&st.live),
                    );
                    if self.executor.execute(job).is_err() {
                        return Err(StoreError::Database("delivery workers stopped".into()));
                    }
                }
                Command::Delivered { unit, lane } => {
                    let store_lane = st.store_lanes[lane.index()];
                    self.acks.ack(&self.token, unit, store_lane);
                    st.report.delivered += 1;
                    let row = st.resolved(unit, lane);
                    trace!(%unit, %row, ?lane, "delivered");
                    if let Some(hook) = &self.hooks.delivered {
                        hook(&Delivered {
                            actor: self.token.actor().clone(),
                            unit,
                            row_id: row,
                            recipient: st.recipients[lane.index()].clone(),
                        });
                    }
                }
                Command::RecordAttempt {
                    unit,
                    lane,
                    attempts,
                    counted,
                } => {
                    // The detail stays in `last` for a dead letter that may follow.
                    let (status, error) = st
                        .last
                        .get(&(unit, lane))
                        .map_or((None, None), |r| (r.status, r.error.clone()));
                    debug!(%unit, ?lane, attempts, counted, ?status, ?error, "attempt failed");
                    self.store.record_attempts(
                        &self.token,
                        &[AttemptRecord {
                            unit,
                            lane: st.store_lanes[lane.index()],
                            attempts,
                            status,
                            error,
                            at: now(),
                        }],
                    )?;
                }
                Command::Hold { unit, lane, reason } => match reason {
                    HoldReason::Stalled => debug!(%unit, ?lane, "stalled: lane in backoff"),
                    HoldReason::Blocked => {
                        warn!(%unit, ?lane, "strict lane blocked on its head until an operator acts");
                        self.store.block_lane(
                            &self.token,
                            st.store_lanes[lane.index()],
                            "strict lane: head failed",
                        )?;
                    }
                },
                Command::LaneBackoff {
                    lane,
                    not_before,
                    level,
                } => {
                    debug!(?lane, level, not_before = %not_before, "lane backoff");
                    self.store.set_lane_state(
                        &self.token,
                        st.store_lanes[lane.index()],
                        Some(not_before),
                        level,
                    )?;
                }
                Command::LaneOpen { lane } => {
                    debug!(?lane, "lane reopened");
                    self.store.set_lane_state(
                        &self.token,
                        st.store_lanes[lane.index()],
                        None,
                        0,
                    )?;
                }
                Command::DeadLetter { unit, lane, reason } => {
                    let last = st.last.remove(&(unit, lane));
                    let (status, error) = last.map_or((None, None), |r| (r.status, r.error));
                    info!(%unit, ?lane, %reason, ?status, ?error, "dead-lettered");
                    self.store.dead_letter(
                        &self.token,
                        &DeadLetterRequest {
                            unit,
                            lane: st.store_lanes[lane.index()],
                            reason,
                            status,
                            error: error.clone(),
                            at: now(),
                        },
                    )?;
                    st.report.dead_lettered += 1;
                    let row = st.resolved(unit, lane);
                    if let Some(hook) = &self.hooks.dead_lettered {
                        hook(&DeadLettered {
                            actor: self.token.actor().clone(),
                            unit,
                            row_id: row,
                            recipient: st.recipients[lane.index()].clone(),
                            reason,
                            status,
                            error,
                        });
                    }
                }
                Command::RetireLane { lane } => {
                    let n =
                        self.store
                            .retire_lane(&self.token, st.store_lanes[lane.index()], now())?;
                    info!(?lane, units = n, "lane retired (410 Gone)");
                }
                Command::HandBack { unit } => {
                    st.units.remove(&unit);
                    st.report.handed_back += 1;
                    trace!(%unit, "handed back");
                }
            }
        }
        Ok(())
    }
}

impl State {
    /// One recipient of `unit` is resolved; forget the unit once all are.
    fn resolved(&mut self, unit: UnitId, lane: LaneId) -> String {
        self.last.remove(&(unit, lane));
        let Some(info) = self.units.get_mut(&unit) else {
            return String::new();
        };
        info.open = info.open.saturating_sub(1);
        let row = info.row_id.clone();
        if info.open == 0 {
            self.units.remove(&unit);
        }
        row
    }
}
