//! One pass as an async task: the shared driver's rounds on the task or on the blocking pool,
//! completions taken in batches on the executor.
//!
//! The loop waits for the first of: completions (every one waiting is taken at once: one
//! wake-up for many), a wake-up (an enqueue, a stop or cancel request, the outbox shutting
//! down — all through one [`Notify`], which keeps a wake-up that comes while the pass is busy),
//! or the pass's next deadline on the runtime's timer. Nothing is polled. Then it runs one
//! round: on the task itself when the round needs no store (acks go to the ack writer, the
//! next starts' payloads came with the claims), or else on the blocking pool — every store
//! call of the round (records, dead letters, claims, payloads not yet read) in that one hop —
//! and spawns the round's jobs as delivery tasks. (One recipient answering at once costs one
//! round per delivery: the hop, when every round took it, was most of the CPU per delivery.)

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use outbox_lanes_core::PassEnd;
use outbox_lanes_driver::pass::{PassCore, PassResult, RoundContext, now};
use outbox_lanes_driver::{Completions, Done, DrainControl, Job, OutboxCore};
use outbox_lanes_store::{SlotToken, StoreError};
use tokio::sync::{Notify, mpsc};

use crate::runtime::{Runtime, unblock};

/// Completions taken in one wake-up, at most.
const BATCH: usize = 4096;
/// The longest the pass sleeps without an event: a safety net only.
const MAX_WAIT: Duration = Duration::from_secs(5);

struct TaskSink(mpsc::UnboundedSender<Done>);

impl Completions for TaskSink {
    fn complete(&self, done: Done) {
        // A pass that is gone no longer cares.
        let _ = self.0.send(done);
    }
}

enum Event {
    Done,
    Notified,
    Timeout,
}

fn round_context(core: &OutboxCore) -> RoundContext<'_> {
    RoundContext {
        store: &**core.store(),
        acks: core.acks(),
        hooks: core.hooks(),
    }
}

/// Runs one pass of the actor `token` names.
pub(crate) async fn run_pass(
    rt: &Arc<dyn Runtime>,
    core: &Arc<OutboxCore>,
    token: SlotToken,
    control: &Arc<DrainControl>,
    lease_renewed: outbox_lanes_core::Timestamp,
) -> PassResult {
    let (tx, mut rx) = mpsc::unbounded_channel::<Done>();
    let events = Arc::new(Notify::new());
    let woken = Arc::new(AtomicBool::new(false));
    let (e, w) = (Arc::clone(&events), Arc::clone(&woken));
    let _enqueues = core.store().notifier().subscribe(move || {
        w.store(true, Ordering::SeqCst);
        e.notify_one();
    });
    let e = Arc::clone(&events);
    let _control = control.subscribe(move || e.notify_one());
    let e = Arc::clone(&events);
    let _shutdown = core.shutdown_signal().subscribe(move || e.notify_one());

    let mut pass = Box::new(PassCore::new(
        token,
        core.config(),
        Arc::new(TaskSink(tx)),
        now(),
        lease_renewed,
    ));
    let mut batch: Vec<Done> = Vec::with_capacity(BATCH);
    loop {
        if control.is_cancelled() {
            pass.handle_cancel(now());
        } else if control.is_stopped() || core.is_stopping() {
            pass.handle_shutdown(now());
        }
        // A round with nothing to read or write runs here; one that needs the store moves
        // to the blocking pool (and goes on from where this one stopped).
        if let Some(jobs) = pass.try_round_inline(round_context(core)) {
            for job in jobs {
                start(core, job, &mut pass);
            }
        } else {
            let c = Arc::clone(core);
            let Some((p, jobs)) = unblock(&**rt, move || {
                let jobs = pass.round(round_context(&c));
                (pass, jobs)
            })
            .await
            else {
                // The runtime dropped the round unrun (it is shutting down): the pass is gone
                // with it. Nothing it claimed is lost: claims write nothing, and the slot's lease
                // runs out.
                return PassResult {
                    report: Default::default(),
                    end: PassEnd::Cancelled,
                    error: Some(StoreError::Database("the runtime is shutting down".into())),
                    lease_renewed,
                };
            };
            pass = p;
            for job in jobs {
                start(core, job, &mut pass);
            }
        }
        if pass.ended().is_some() {
            break;
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
        let event = {
            let mut sleep = rt.sleep(wait);
            let mut notified = pin!(events.notified());
            poll_fn(|cx| {
                if let Poll::Ready(n) = rx.poll_recv_many(cx, &mut batch, BATCH) {
                    if n > 0 {
                        return Poll::Ready(Event::Done);
                    }
                }
                if notified.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Event::Notified);
                }
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Event::Timeout);
                }
                Poll::Pending
            })
            .await
        };
        // Whatever woke the pass (`event` says what), everything else that is ready is taken
        // too: one round for many completions.
        let _ = event;
        let t = now();
        loop {
            for d in batch.drain(..) {
                pass.handle_done(d, core.hooks(), t);
            }
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(d) => batch.push(d),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                break;
            }
        }
        if woken.swap(false, Ordering::SeqCst) {
            pass.handle_wake();
        }
        pass.handle_timeout(t);
    }
    let c = Arc::clone(core);
    let end = pass.ended();
    match unblock(&**rt, move || pass.finish(round_context(&c))).await {
        Some(r) => r,
        None => PassResult {
            report: Default::default(),
            end: end.unwrap_or(PassEnd::Cancelled),
            error: Some(StoreError::Database("the runtime is shutting down".into())),
            lease_renewed,
        },
    }
}

fn start(core: &OutboxCore, job: Job, pass: &mut PassCore) {
    if let Err(job) = core.executor().execute(job) {
        // The executor stopped: the job reports NotSent as it is dropped; nothing new
        // starts.
        drop(job);
        pass.handle_shutdown(now());
    }
}
