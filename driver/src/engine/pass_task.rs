//! One pass as a task: the pass's rounds on the task or where blocking is allowed,
//! completions taken in batches.
//!
//! The loop waits for the first of: completions (every one waiting is taken at once: one
//! wake-up for many), a wake-up (an enqueue, a stop or cancel request, the outbox shutting
//! down — one coalesced wake-up, kept when it comes while the pass is busy), or the pass's
//! next deadline on the runtime's timer, while polling the few deliveries it runs itself
//! (their completions need no wake-up), or the answer to its claim. Then it runs one round:
//! on the task itself when the round needs no store (acks go to the ack writer, the next
//! starts' payloads came with the claims, a claim is read where blocking is allowed while the
//! pass goes on), or else where blocking is allowed — every store call of the round (records,
//! dead letters, payloads not yet read) in that one hop — and hands the round's jobs to
//! the executor, whose first few delivery futures the pass keeps and polls itself
//! ([`spawn_delivery`](super::spawn_delivery)): one lane's completion and next request then
//! never leave the pass's task. After each round it tells the drain's control whether the
//! pass only waits on attempts in flight (the monitor does not count such a pass against its
//! bound, OL-13).

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use futures_channel::{mpsc, oneshot};
use futures_core::Stream;
use outbox_lanes_core::{PassEnd, Timestamp};
use outbox_lanes_store::{ClaimedLane, SlotToken, StoreError};

use super::local::{Completed, Local};
use super::{Runtime, shutting_down, unblock, wake};
use crate::control::DrainControl;
use crate::job::{Completions, Done, HostWait, Job};
use crate::outbox::OutboxCore;
use crate::pass::{PassCore, PassResult, RoundContext};

/// Completions taken in one wake-up, at most.
const BATCH: usize = 4096;
/// The longest the pass sleeps without an event: a safety net only.
const MAX_WAIT: Duration = Duration::from_secs(5);

struct TaskSink {
    tx: mpsc::UnboundedSender<Done>,
    /// Attempts that wait at their host, or go after that.
    waits: mpsc::UnboundedSender<HostWait>,
    /// The pass takes its own deliveries' completions as it polls them.
    local: Arc<Completed>,
}

impl Completions for TaskSink {
    fn complete(&self, done: Done) {
        if let Some(done) = Completed::keep(&self.local, done) {
            // A pass that is gone no longer cares.
            let _ = self.tx.unbounded_send(done);
        }
    }

    fn host_wait(&self, wait: HostWait) {
        let _ = self.waits.unbounded_send(wait);
    }
}

fn round_context(core: &OutboxCore) -> RoundContext<'_> {
    RoundContext {
        store: &**core.store(),
        acks: core.acks(),
        hooks: core.hooks(),
        hosts: Some(core.hosts()),
    }
}

/// Takes every completion waiting, up to [`BATCH`]; ready once there is at least one.
fn poll_batch(
    rx: &mut mpsc::UnboundedReceiver<Done>,
    batch: &mut Vec<Done>,
    cx: &mut std::task::Context<'_>,
) -> Poll<()> {
    while batch.len() < BATCH {
        match Pin::new(&mut *rx).poll_next(cx) {
            Poll::Ready(Some(d)) => batch.push(d),
            // The pass holds a sender itself: the channel never closes while it runs.
            Poll::Ready(None) | Poll::Pending => break,
        }
    }
    if batch.is_empty() {
        Poll::Pending
    } else {
        Poll::Ready(())
    }
}

/// Runs one pass of the actor `token` names.
pub async fn run_pass(
    rt: &Arc<dyn Runtime>,
    core: &Arc<OutboxCore>,
    token: SlotToken,
    control: &Arc<DrainControl>,
    lease_renewed: Timestamp,
) -> PassResult {
    let (tx, rx) = mpsc::unbounded::<Done>();
    let (waits, waits_rx) = mpsc::unbounded::<HostWait>();
    let (waker, woken) = wake::pair();
    let enqueued = Arc::new(AtomicBool::new(false));
    let (w, e) = (waker.clone(), Arc::clone(&enqueued));
    let _enqueues = core.store().notifier().subscribe(move || {
        e.store(true, Ordering::SeqCst);
        w.wake();
    });
    let w = waker.clone();
    let _control = control.subscribe(move || w.wake());
    let w = waker;
    let _shutdown = core.shutdown_signal().subscribe(move || w.wake());

    let mut local = Local::new(Arc::clone(rt));
    let mut pass = Box::new(PassCore::new(
        token,
        core.config(),
        Arc::new(TaskSink {
            tx,
            waits,
            local: local.completed(),
        }),
        Arc::clone(core.clock()),
        lease_renewed,
    ));
    let mut events = Events {
        rx,
        waits: waits_rx,
        host_waits: Vec::new(),
        batch: Vec::with_capacity(64),
        woken,
        enqueued,
        claim: None,
        answer: None,
    };
    loop {
        apply_control(&mut pass, core, control);
        let Some((p, jobs)) = round(rt, core, pass, &mut local, &mut events.batch).await else {
            // The runtime dropped the round unrun (it is shutting down): the pass is gone
            // with it. Nothing it claimed is lost: claims write nothing, and the slot's lease
            // runs out.
            return gone(None, lease_renewed);
        };
        pass = p;
        local.capture(|| {
            for job in jobs {
                start(core, job, &mut pass);
            }
        });
        if pass.ended().is_some() {
            break;
        }
        if let Some(claim) = send_claim(rt, core, &mut pass) {
            events.claim = Some(claim);
        }
        if let Some(waiting) = pass.waiting_changed() {
            control.report_waiting(pass.actor(), waiting);
        }
        let wait = next_wait(&mut pass);
        events.wait(&**rt, &mut local, wait).await;
        events.hand_to(&mut pass, core);
    }
    finish(rt, core, pass, local, lease_renewed).await
}

/// Tells the pass what the drain's control and the outbox ask: slicing, a cancel, a stop.
fn apply_control(pass: &mut PassCore, core: &OutboxCore, control: &DrainControl) {
    pass.set_slicing(control.slicing());
    if control.is_cancelled() {
        pass.handle_cancel(pass.now());
    } else if control.is_stopped() || core.is_stopping() {
        pass.handle_shutdown(pass.now());
    }
}

/// One round of the pass, and the jobs it starts. A round with nothing to read or write runs
/// here; one that needs the store moves where blocking is allowed (and goes on from where
/// this one stopped), the pass's own deliveries going on meanwhile. `None`: the runtime
/// dropped the round unrun (it is shutting down), and the pass with it.
async fn round(
    rt: &Arc<dyn Runtime>,
    core: &Arc<OutboxCore>,
    mut pass: Box<PassCore>,
    local: &mut Local,
    batch: &mut Vec<Done>,
) -> Option<(Box<PassCore>, Vec<Job>)> {
    let inline = if rt.blocking_in_place() {
        None
    } else {
        pass.try_round_inline(round_context(core))
    };
    if let Some(jobs) = inline {
        return Some((pass, jobs));
    }
    let c = Arc::clone(core);
    let round = unblock(&**rt, move || {
        let jobs = pass.round(round_context(&c));
        (pass, jobs)
    });
    local.drive(batch, round).await
}

/// The claim the pass asks for, if any, read where blocking is allowed: the pass goes on
/// meanwhile, and takes the answer from the receiver.
fn send_claim(
    rt: &Arc<dyn Runtime>,
    core: &Arc<OutboxCore>,
    pass: &mut PassCore,
) -> Option<oneshot::Receiver<ClaimAnswer>> {
    let ranges = pass.take_claim()?;
    let (c, token) = (Arc::clone(core), pass.token().clone());
    let (tx, rx) = oneshot::channel();
    rt.spawn_blocking(Box::new(move || {
        let _ = tx.send(c.store().claim(&token, &ranges));
    }));
    Some(rx)
}

/// How long the pass may wait for an event: until its next deadline, at most [`MAX_WAIT`].
fn next_wait(pass: &mut PassCore) -> Duration {
    let t = pass.now();
    pass.poll_timeout()
        .map_or(MAX_WAIT, |d| {
            Duration::from_millis(d.as_millis().saturating_sub(t.as_millis()))
        })
        .min(MAX_WAIT)
}

/// Ends the pass: attempts still in flight (the pass ended without them: cancelled, or its
/// grace ran out) finish on tasks of their own, and the pass's last store calls run where
/// blocking is allowed.
async fn finish(
    rt: &Arc<dyn Runtime>,
    core: &Arc<OutboxCore>,
    pass: Box<PassCore>,
    local: Local,
    lease_renewed: Timestamp,
) -> PassResult {
    drop(local);
    let c = Arc::clone(core);
    let end = pass.ended();
    match unblock(&**rt, move || pass.finish(round_context(&c))).await {
        Some(r) => r,
        None => gone(end, lease_renewed),
    }
}

/// The result of a pass the runtime dropped unrun (it is shutting down): `end`, or
/// cancelled.
fn gone(end: Option<PassEnd>, lease_renewed: Timestamp) -> PassResult {
    PassResult {
        report: Default::default(),
        end: end.unwrap_or(PassEnd::Cancelled),
        error: Some(shutting_down()),
        lease_renewed,
    }
}

/// What the pass waits for between rounds.
struct Events {
    /// Completions the executor sends.
    rx: mpsc::UnboundedReceiver<Done>,
    /// Attempts that wait at their host, or go after that (the origin gate sends them).
    waits: mpsc::UnboundedReceiver<HostWait>,
    /// Host-wait reports taken, not yet handed to the pass.
    host_waits: Vec<HostWait>,
    /// Completions taken, not yet handed to the pass.
    batch: Vec<Done>,
    /// Wake-ups: an enqueue, a stop or cancel request, the outbox shutting down.
    woken: wake::Woken,
    /// Set by an enqueue.
    enqueued: Arc<AtomicBool>,
    /// The claim out, if any (one at a time), and its answer once it came.
    claim: Option<oneshot::Receiver<ClaimAnswer>>,
    answer: Option<ClaimAnswer>,
}

impl Events {
    /// Waits for the first of: completions (every one waiting is taken at once), a wake-up,
    /// the claim's answer, or `wait`, while polling the pass's own deliveries.
    async fn wait(&mut self, rt: &dyn Runtime, local: &mut Local, wait: Duration) {
        let mut sleep = rt.sleep(wait);
        poll_fn(|cx| {
            local.poll(cx, &mut self.batch);
            if let Some(Poll::Ready(a)) = self.claim.as_mut().map(|rx| Pin::new(rx).poll(cx)) {
                self.claim = None;
                // Dropped unrun: the runtime is shutting down.
                self.answer = Some(a.unwrap_or_else(|_| Err(shutting_down())));
            }
            if self.answer.is_some()
                || poll_batch(&mut self.rx, &mut self.batch, cx).is_ready()
                || poll_waits(&mut self.waits, &mut self.host_waits, cx)
                || self.woken.poll_woken(cx).is_ready()
                || sleep.as_mut().poll(cx).is_ready()
            {
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await;
    }

    /// Hands the pass everything that is ready, whatever woke it: one round for many
    /// completions.
    fn hand_to(&mut self, pass: &mut PassCore, core: &OutboxCore) {
        let t = pass.now();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        // Before the completions, as they were sent (a report that comes after its
        // attempt's outcome is ignored).
        poll_waits(&mut self.waits, &mut self.host_waits, &mut cx);
        for w in self.host_waits.drain(..) {
            pass.handle_host_wait(w, t);
        }
        loop {
            for d in self.batch.drain(..) {
                pass.handle_done(d, core.hooks(), t);
            }
            if poll_batch(&mut self.rx, &mut self.batch, &mut cx).is_pending() {
                break;
            }
        }
        if let Some(a) = self.answer.take() {
            pass.handle_claim(a);
        }
        self.woken.take();
        if self.enqueued.swap(false, Ordering::SeqCst) {
            pass.handle_wake();
        }
        pass.handle_timeout(t);
    }
}

/// Takes every host-wait report waiting; ready once there is at least one.
fn poll_waits(
    rx: &mut mpsc::UnboundedReceiver<HostWait>,
    taken: &mut Vec<HostWait>,
    cx: &mut std::task::Context<'_>,
) -> bool {
    // The pass holds a sender itself: the channel never closes while it runs.
    while let Poll::Ready(Some(w)) = Pin::new(&mut *rx).poll_next(cx) {
        taken.push(w);
    }
    !taken.is_empty()
}

/// What a claim read where blocking is allowed answers.
type ClaimAnswer = Result<Vec<ClaimedLane>, StoreError>;

fn start(core: &OutboxCore, job: Job, pass: &mut PassCore) {
    if let Err(job) = core.executor().execute(job) {
        // The executor stopped: the job reports NotSent as it is dropped; nothing new
        // starts.
        drop(job);
        pass.handle_shutdown(pass.now());
    }
}
