//! What an executor runs: one attempt with its payload, and the report it sends back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bytes::Bytes;
use outbox_lanes_core::{ActorId, LaneId, UnitId};
use outbox_lanes_store::Payload;

use crate::http::{AttemptResult, Delivery, not_sent};
use crate::request::Destination;

/// What an executor reports back to the pass that started the attempt.
#[derive(Debug)]
pub struct Done {
    /// The unit.
    pub unit: UnitId,
    /// The recipient's lane.
    pub lane: LaneId,
    /// What the attempt came to.
    pub result: AttemptResult,
    /// When the job was handed to the executor, by the monotonic clock of the pass that
    /// started it.
    pub started: Instant,
}

/// An attempt that waits at its host's gate (the host's window is full, or its pace is not
/// due: [`OriginGate`](crate::OriginGate)), or goes after such a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostWait {
    /// The unit.
    pub unit: UnitId,
    /// The recipient's lane.
    pub lane: LaneId,
    /// The attempt's number ([`Job::attempt`]).
    pub attempt: u32,
    /// It waits (`true`), or goes (`false`).
    pub waits: bool,
}

/// Where a pass receives its completions: a channel whose receiving side the pass waits on
/// (completions of many jobs taken together, one wake-up for many), or, for the deliveries a
/// pass polls on its own task, straight into its batch.
pub trait Completions: Send + Sync {
    /// Reports one finished attempt. A pass that is gone ignores it.
    fn complete(&self, done: Done);

    /// Reports that an attempt waits at its host, or goes after that: while it waits it
    /// takes no place of the pass's in-flight bound, so another lane's attempt may start
    /// (`Scheduler::handle_host_wait`). A pass that is gone ignores it; a sink that ignores
    /// it keeps such attempts counted in its bound until their outcome.
    fn host_wait(&self, wait: HostWait) {
        let _ = wait;
    }
}

/// One attempt for an [`Executor`] to run: deliver [`Job::delivery`], then [`Job::finish`].
///
/// The payload was read by the pass that started it, in one batch with the other attempts
/// of its round, and is shared, not copied, by the attempts of the unit in that pass; the
/// recipient URL was parsed once for the lane. The client turns the delivery into its request
/// ([`RequestPolicy::build`](crate::request::RequestPolicy::build)) when it sends it. A job dropped unfinished reports [`Outcome::NotSent`](outbox_lanes_core::Outcome::NotSent):
/// the unit is retried without counting an attempt.
pub struct Job {
    /// The actor.
    pub actor: ActorId,
    /// The store's outbox id ([`DriverStore::outbox_id`](outbox_lanes_store::DriverStore::outbox_id)):
    /// with the unit id, the idempotency key.
    pub outbox: Arc<str>,
    /// The unit.
    pub unit: UnitId,
    /// The recipient's lane in the pass.
    pub lane: LaneId,
    /// The recipient URL, parsed once for the lane and shared by every attempt to it.
    pub recipient: Arc<Destination>,
    /// The 1-based attempt number.
    pub attempt: u32,
    /// The row's payload.
    pub payload: Arc<Payload>,
    /// The payload's body, as the request's body: the same bytes, not a copy.
    body: Bytes,
    /// When the pass handed it to the executor (the pass's monotonic clock).
    started: Instant,
    sink: Option<Arc<dyn Completions>>,
    /// Cleared when the pass that started the job has ended.
    live: Arc<AtomicBool>,
    /// The job's place under its host's cap ([`crate::HostCaps`]), freed when it is dropped.
    pub(crate) permit: Option<crate::ticket::HostPermit>,
    /// Its place in the process's in-flight budget, once [`FairShares`](crate::FairShares) gave it one.
    pub(crate) budget: Option<crate::ticket::BudgetPermit>,
    /// The job's place under its origin's gate ([`crate::OriginGate`]): its completion is
    /// counted for the origin's health.
    pub(crate) origin: Option<crate::ticket::OriginTicket>,
}

/// A payload's body as [`Bytes`] without copying it: the bytes stay in the payload, which
/// the [`Bytes`] keeps alive.
struct PayloadBody(Arc<Payload>);

impl AsRef<[u8]> for PayloadBody {
    fn as_ref(&self) -> &[u8] {
        &self.0.body
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("actor", &self.actor)
            .field("unit", &self.unit)
            .field("lane", &self.lane)
            .field("recipient", &self.recipient)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

impl Job {
    /// A job the pass hands to the executor at `started` (the pass's monotonic clock: the
    /// attempt's latency is measured from it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        actor: ActorId,
        outbox: Arc<str>,
        unit: UnitId,
        lane: LaneId,
        recipient: Arc<Destination>,
        attempt: u32,
        payload: Arc<Payload>,
        started: Instant,
        sink: Arc<dyn Completions>,
        live: Arc<AtomicBool>,
    ) -> Job {
        let body = Bytes::from_owner(PayloadBody(Arc::clone(&payload)));
        Job {
            actor,
            outbox,
            unit,
            lane,
            recipient,
            attempt,
            payload,
            body,
            started,
            sink: Some(sink),
            live,
            permit: None,
            budget: None,
            origin: None,
        }
    }

    /// The attempt to make.
    pub fn delivery(&self) -> Delivery<'_> {
        Delivery {
            actor: self.actor.as_str(),
            outbox: &self.outbox,
            unit: self.unit,
            recipient: &self.recipient,
            body: &self.body,
            content_type: &self.payload.content_type,
            headers: &self.payload.headers,
            attempt: self.attempt,
        }
    }

    /// Whether the pass that started this job has ended (it was cancelled, or its grace
    /// period ran out) and handed the unit back: nobody waits for the answer any more, and
    /// an executor that has not sent the request yet should drop the job instead, so the
    /// recipient does not get a unit that will be sent again anyway.
    pub fn abandoned(&self) -> bool {
        !self.live.load(Ordering::SeqCst)
    }

    /// Tells the pass that this attempt waits at its host (`waits`), or goes after such a
    /// wait ([`Completions::host_wait`]).
    pub(crate) fn report_host_wait(&self, waits: bool) {
        if let Some(sink) = &self.sink {
            sink.host_wait(HostWait {
                unit: self.unit,
                lane: self.lane,
                attempt: self.attempt,
                waits,
            });
        }
    }

    /// Reports the result to the pass. A pass that is gone no longer cares.
    pub fn finish(mut self, result: AttemptResult) {
        self.report(result);
    }

    /// The job's place under its origin's gate, if an [`OriginGate`](crate::OriginGate) let
    /// it through: the client reads the double-knock's plan from it and leaves what the
    /// knock taught on it ([`RequestPolicy::attempt`](crate::RequestPolicy::attempt)).
    pub fn origin(&self) -> Option<&crate::ticket::OriginTicket> {
        self.origin.as_ref()
    }

    fn report(&mut self, result: AttemptResult) {
        if let Some(mut ticket) = self.origin.take() {
            ticket.finished(&result);
        }
        if let Some(sink) = self.sink.take() {
            sink.complete(Done {
                unit: self.unit,
                lane: self.lane,
                result,
                started: self.started,
            });
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // Dropped unrun (an executor shutting down, a task the runtime dropped): the
        // recipient never saw it, and the pass must not wait for it.
        self.report(not_sent("the attempt was dropped before it finished"));
    }
}

/// Runs delivery jobs: a pool of threads (the blocking runtime) or tasks (an async one).
pub trait Executor: Send + Sync {
    /// Runs `job` and calls [`Job::finish`] when it is done.
    ///
    /// # Errors
    /// The executor is shut down; the job is returned unrun.
    // The job comes back by value on the rare refusal; boxing it would cost an allocation
    // on every attempt.
    #[allow(clippy::result_large_err)]
    fn execute(&self, job: Job) -> Result<(), Job>;

    /// Stops taking jobs and drops those not started; returns without waiting for the HTTP
    /// exchanges in progress (at most briefly, to let go of them): the passes that started
    /// them ended already, and recorded them as interrupted (OL-14).
    fn shutdown(&self) {}
}
