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
use crate::job::{Completions, Done, Job};
use crate::outbox::OutboxCore;
use crate::pass::{PassCore, PassResult, RoundContext, now};

/// Completions taken in one wake-up, at most.
const BATCH: usize = 4096;
/// The longest the pass sleeps without an event: a safety net only.
const MAX_WAIT: Duration = Duration::from_secs(5);

struct TaskSink {
    tx: mpsc::UnboundedSender<Done>,
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
    let (tx, mut rx) = mpsc::unbounded::<Done>();
    let (waker, mut woken) = wake::pair();
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
            local: local.completed(),
        }),
        now(),
        lease_renewed,
    ));
    let mut batch: Vec<Done> = Vec::with_capacity(64);
    // The claim out, if any (one at a time), and its answer once it came.
    let mut claim: Option<oneshot::Receiver<ClaimAnswer>> = None;
    let mut answer: Option<ClaimAnswer> = None;
    loop {
        pass.set_slicing(control.slicing());
        if control.is_cancelled() {
            pass.handle_cancel(now());
        } else if control.is_stopped() || core.is_stopping() {
            pass.handle_shutdown(now());
        }
        // A round with nothing to read or write runs here; one that needs the store moves
        // where blocking is allowed (and goes on from where this one stopped).
        let inline = if rt.blocking_in_place() {
            None
        } else {
            pass.try_round_inline(round_context(core))
        };
        let jobs = match inline {
            Some(jobs) => jobs,
            None => {
                let c = Arc::clone(core);
                let round = unblock(&**rt, move || {
                    let jobs = pass.round(round_context(&c));
                    (pass, jobs)
                });
                // The pass's own deliveries go on while the round runs.
                let Some((p, jobs)) = local.drive(&mut batch, round).await else {
                    // The runtime dropped the round unrun (it is shutting down): the pass is
                    // gone with it. Nothing it claimed is lost: claims write nothing, and the
                    // slot's lease runs out.
                    return PassResult {
                        report: Default::default(),
                        end: PassEnd::Cancelled,
                        error: Some(shutting_down()),
                        lease_renewed,
                    };
                };
                pass = p;
                jobs
            }
        };
        local.capture(|| {
            for job in jobs {
                start(core, job, &mut pass);
            }
        });
        if pass.ended().is_some() {
            break;
        }
        if let Some(ranges) = pass.take_claim() {
            // The read goes where blocking is allowed; the pass goes on meanwhile.
            let (c, token) = (Arc::clone(core), pass.token().clone());
            let (tx, rx) = oneshot::channel();
            rt.spawn_blocking(Box::new(move || {
                let _ = tx.send(c.store().claim(&token, &ranges));
            }));
            claim = Some(rx);
        }
        if let Some(waiting) = pass.waiting_changed() {
            control.report_waiting(pass.actor(), waiting);
        }
        let t = now();
        let wait = pass
            .poll_timeout()
            .map_or(MAX_WAIT, |d| {
                Duration::from_millis(d.as_millis().saturating_sub(t.as_millis()))
            })
            .min(MAX_WAIT);
        {
            let mut sleep = rt.sleep(wait);
            poll_fn(|cx| {
                local.poll(cx, &mut batch);
                if let Some(Poll::Ready(a)) = claim.as_mut().map(|rx| Pin::new(rx).poll(cx)) {
                    claim = None;
                    // Dropped unrun: the runtime is shutting down.
                    answer = Some(a.unwrap_or_else(|_| Err(shutting_down())));
                }
                if answer.is_some()
                    || poll_batch(&mut rx, &mut batch, cx).is_ready()
                    || woken.poll_woken(cx).is_ready()
                    || sleep.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(());
                }
                Poll::Pending
            })
            .await;
        }
        // Whatever woke the pass, everything else that is ready is taken too: one round for
        // many completions.
        let t = now();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            for d in batch.drain(..) {
                pass.handle_done(d, core.hooks(), t);
            }
            if poll_batch(&mut rx, &mut batch, &mut cx).is_pending() {
                break;
            }
        }
        if let Some(a) = answer.take() {
            pass.handle_claim(a);
        }
        woken.take();
        if enqueued.swap(false, Ordering::SeqCst) {
            pass.handle_wake();
        }
        pass.handle_timeout(t);
    }
    // Attempts still in flight (the pass ended without them: cancelled, or its grace ran
    // out) finish on tasks of their own.
    drop(local);
    let c = Arc::clone(core);
    let end = pass.ended();
    match unblock(&**rt, move || pass.finish(round_context(&c))).await {
        Some(r) => r,
        None => PassResult {
            report: Default::default(),
            end: end.unwrap_or(PassEnd::Cancelled),
            error: Some(shutting_down()),
            lease_renewed,
        },
    }
}

/// What a claim read where blocking is allowed answers.
type ClaimAnswer = Result<Vec<ClaimedLane>, StoreError>;

fn start(core: &OutboxCore, job: Job, pass: &mut PassCore) {
    if let Err(job) = core.executor().execute(job) {
        // The executor stopped: the job reports NotSent as it is dropped; nothing new
        // starts.
        drop(job);
        pass.handle_shutdown(now());
    }
}
