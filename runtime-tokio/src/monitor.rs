//! The monitor task (OL-13): [`MonitorBook`] driven by an async loop on any
//! [`Runtime`](crate::Runtime).
//!
//! One task owns the book. It asks the store which actors are due (on the blocking pool),
//! starts each due actor's pass as a task of its own through [`Outbox::drain_with`] (at most
//! [`OutboxConfig::max_passes`](crate::OutboxConfig::max_passes) at once: the book enforces
//! it), and otherwise waits for the first of:
//!
//! - a stop request ([`Monitor::stop`], or the [`Monitor`] dropped);
//! - a pass ending (each pass task reports back on a channel, however it ends);
//! - a wake-up from the store's [`Notifier`](outbox_lanes_store::Notifier): an enqueue in
//!   this process (after its commit) or a change seen by the cross-process watcher;
//! - the book's [`MonitorBook::poll_timeout`]: the safety-net poll or the earliest lane
//!   `not_before`, on the runtime's timer.
//!
//! Only executor-independent primitives are used, so the loop runs unchanged on tokio,
//! async-std and smol: `tokio::sync` (`Notify`, `mpsc`, `oneshot`: plain wakers, no
//! reactor or timer behind them, already how this crate waits on the blocking pool), the
//! [`Runtime`](crate::Runtime)'s `spawn`, `spawn_blocking` and `sleep`, and a hand-written
//! race over [`std::future::poll_fn`] (no `futures` dependency).

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, SystemTime};

use outbox_lanes_core::{ActorId, MonitorAction, MonitorBook, Timestamp, Wake};
use outbox_lanes_store::Subscription;
use tokio::sync::{Notify, mpsc, oneshot};
use tracing::{debug, info, trace, warn};

use crate::{DrainControl, DrainOutcome, Outbox, OutboxError};

/// A running monitor task; see [`Outbox::monitor`]. Stop it with [`Monitor::stop`];
/// dropping it stops it in the background.
pub struct Monitor {
    /// Sending (or dropping) it asks the loop to stop.
    stop: Option<oneshot::Sender<()>>,
    /// Completes (or closes) when the loop has returned.
    done: Option<oneshot::Receiver<()>>,
    /// Set when a pass's shutdown grace ended with attempts in flight.
    grace_over: Arc<AtomicBool>,
}

/// How a [`Monitor::stop`] went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stopped {
    /// A pass's shutdown grace ended with attempts still in flight: they were handed back
    /// unanswered (their units are delivered again later).
    pub grace_over: bool,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("running", &self.stop.is_some())
            .finish_non_exhaustive()
    }
}

impl Monitor {
    /// Subscribes to the store's wake-ups and spawns the loop on the outbox's runtime.
    pub(crate) async fn start(outbox: Outbox) -> Result<Monitor, OutboxError> {
        // Starting the cross-process watcher opens a connection: blocking pool.
        let notifier = outbox.call(|ob| Ok(ob.store().watch()?)).await?;
        let wake = Arc::new(Notify::new());
        let w = Arc::clone(&wake);
        // Runs on the notifying thread (an enqueuer, the watcher): `notify_one` only stores a
        // permit and wakes the loop's waker, so it is short and never blocks. Coalescing:
        // any number of wake-ups before the loop looks are one wake-up.
        let subscription = notifier.subscribe(move || w.notify_one());
        let (stop_tx, stop_rx) = oneshot::channel();
        let (done_tx, done_rx) = oneshot::channel();
        let rt = Arc::clone(outbox.runtime());
        let grace_over = Arc::new(AtomicBool::new(false));
        let g = Arc::clone(&grace_over);
        rt.spawn(Box::pin(async move {
            run(outbox, wake, subscription, stop_rx, g).await;
            let _ = done_tx.send(());
        }));
        Ok(Monitor {
            stop: Some(stop_tx),
            done: Some(done_rx),
            grace_over,
        })
    }

    /// Stops the monitor gracefully: running passes start nothing new, attempts in flight
    /// finish, the rest is handed back and the slots released; returns once every pass has
    /// ended. The outbox stays usable.
    pub async fn stop(mut self) -> Stopped {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            // Closed without a value: the runtime dropped the loop (it is shutting down).
            let _ = done.await;
        }
        Stopped {
            grace_over: self.grace_over.load(Ordering::SeqCst),
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        // Dropping the sender closes the loop's stop channel: it stops the same way,
        // in the background.
        self.stop.take();
    }
}

/// What ended a wait of the loop.
enum Event {
    /// `true`: [`Monitor::stop`]; `false`: the [`Monitor`] was dropped.
    Stop(bool),
    PassDone(ActorId, bool),
    /// A pass only waits on attempts in flight (`true`), or has work again.
    Waiting(ActorId, bool),
    Woken,
    Timeout,
}

/// Reports a pass's end to the loop however the pass task ends: normally, by a panic, or
/// dropped unrun by a runtime that is shutting down (then as "no more work").
struct PassDone {
    actor: Option<ActorId>,
    more: bool,
    tx: mpsc::UnboundedSender<(ActorId, Report)>,
}

/// What a pass task tells the loop.
enum Report {
    /// It ended; `true`: with work left.
    Done(bool),
    /// It only waits on attempts in flight (`true`), or has work again.
    Waiting(bool),
}

impl PassDone {
    fn finish(mut self, more: bool) {
        self.more = more;
        // Dropped here, telling the loop.
    }
}

impl Drop for PassDone {
    fn drop(&mut self) {
        if let Some(actor) = self.actor.take() {
            let _ = self.tx.send((actor, Report::Done(self.more)));
        }
    }
}

fn wall_now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

async fn run(
    outbox: Outbox,
    wake: Arc<Notify>,
    subscription: Subscription,
    stop_rx: oneshot::Receiver<()>,
    grace_over: Arc<AtomicBool>,
) {
    // Unsubscribed when the loop returns.
    let _subscription = subscription;
    let rt = Arc::clone(outbox.runtime());
    let poll_interval = outbox.inner.poll_interval;
    let max_passes = outbox.inner.max_passes;
    let mut book = MonitorBook::new(max_passes, poll_interval);
    // Both what the passes report (ends, waiting) on one channel: a pass's reports arrive in
    // the order it sent them, so a stale "waiting" never lands on the actor's next pass.
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(ActorId, Report)>();
    // The running passes' controls, for a graceful stop.
    let mut running: HashMap<ActorId, Arc<DrainControl>> = HashMap::new();
    let mut stop_rx = Some(stop_rx);
    let mut stopping = false;
    // The earliest lane `not_before` of the last poll, to name why a timeout fired.
    let mut next_not_before: Option<Timestamp> = None;
    info!(
        max_passes,
        poll_interval_ms = poll_interval.as_millis() as u64,
        "monitor started"
    );
    loop {
        let now = wall_now();
        if !stopping {
            while let Some(action) = book.poll_action(now) {
                match action {
                    MonitorAction::Poll => {
                        let due = outbox
                            .call(move |ob| Ok(ob.store().actors_with_work(now)?))
                            .await;
                        match due {
                            Ok(due) => {
                                trace!(
                                    ready = due.ready.len(),
                                    next_not_before =
                                        due.next_not_before.map(outbox_lanes_driver::fmt::rfc3339),
                                    "monitor poll"
                                );
                                next_not_before = due.next_not_before;
                                book.handle_due(due.ready, due.next_not_before, now);
                            }
                            Err(e) => {
                                warn!(error = %e, "monitor poll failed; retrying at the next tick");
                                book.handle_poll_failed(now);
                            }
                        }
                    }
                    MonitorAction::Drain(actor) => {
                        debug!(%actor, running = running.len() + 1, "monitor starts a pass");
                        let control = Arc::new(DrainControl::yielding());
                        let waiting = done_tx.clone();
                        control.on_waiting(move |actor, w| {
                            let _ = waiting.send((actor.clone(), Report::Waiting(w)));
                        });
                        // Back to the queue at the end of a time slice, behind the others.
                        running.insert(actor.clone(), Arc::clone(&control));
                        let ob = outbox.clone();
                        let report = PassDone {
                            actor: Some(actor),
                            more: false,
                            tx: done_tx.clone(),
                        };
                        let grace_over = Arc::clone(&grace_over);
                        rt.spawn(Box::pin(async move {
                            let Some(actor) = report.actor.clone() else {
                                return;
                            };
                            let more = match ob.drain_with(actor.as_str(), control).await {
                                Ok(DrainOutcome::Ran(r)) => {
                                    if r.grace_over {
                                        grace_over.store(true, Ordering::SeqCst);
                                    }
                                    r.yielded
                                }
                                Ok(DrainOutcome::Merged) => false,
                                Err(e) => {
                                    warn!(%actor, error = %e, "pass failed");
                                    false
                                }
                            };
                            report.finish(more);
                        }));
                    }
                }
            }
        }
        if stopping && running.is_empty() {
            info!("monitor stopped");
            return;
        }
        // Wall-clock deadlines (lane `not_before` is wall-clock), slept on the runtime's timer.
        let deadline = book.poll_timeout();
        let wait = deadline
            .map_or(poll_interval, |t| {
                Duration::from_millis(t.as_millis().saturating_sub(now.as_millis()))
            })
            .clamp(
                Duration::from_millis(1),
                poll_interval.max(Duration::from_millis(1)),
            );
        let event = {
            let mut sleep = rt.sleep(wait);
            let mut notified = pin!(wake.notified());
            poll_fn(|cx| {
                if let Some(rx) = stop_rx.as_mut() {
                    if let Poll::Ready(asked) = Pin::new(rx).poll(cx) {
                        stop_rx = None;
                        return Poll::Ready(Event::Stop(asked.is_ok()));
                    }
                }
                if let Poll::Ready(Some((actor, report))) = done_rx.poll_recv(cx) {
                    return Poll::Ready(match report {
                        Report::Done(more) => Event::PassDone(actor, more),
                        Report::Waiting(w) => Event::Waiting(actor, w),
                    });
                }
                if notified.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Event::Woken);
                }
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Event::Timeout);
                }
                Poll::Pending
            })
            .await
        };
        let now = wall_now();
        match event {
            Event::Stop(asked) => {
                debug!(
                    reason = if asked { "stop" } else { "monitor_dropped" },
                    running = running.len(),
                    "monitor woken: stopping (passes finish attempts in flight, hand the rest back)"
                );
                stopping = true;
                for control in running.values() {
                    control.request_stop();
                }
            }
            Event::PassDone(actor, more) => {
                debug!(reason = "pass_done", %actor, more, "monitor woken: a pass ended");
                running.remove(&actor);
                book.handle_pass_done(&actor, more, now);
            }
            Event::Waiting(actor, w) => {
                debug!(reason = "pass_waiting", %actor, waiting = w,
                    "monitor woken: a pass only waits on attempts in flight (not counted against max_passes), or has work again");
                book.handle_pass_waiting(&actor, w, now);
            }
            Event::Woken => {
                if stopping {
                    trace!(
                        reason = "store_changed",
                        "monitor woken while stopping: ignored"
                    );
                } else {
                    debug!(reason = "store_changed", "monitor woken: the store changed");
                    book.handle_wake(Wake::StoreChanged, now);
                }
            }
            Event::Timeout => {
                // The book polls the store next if a deadline passed; it says nothing if the
                // timer merely fired early (a clamped or coarse sleep).
                match (next_not_before, deadline) {
                    (Some(nb), Some(d)) if nb <= d => {
                        debug!(
                            reason = "not_before",
                            wait_ms = wait.as_millis() as u64,
                            "monitor timeout: a lane is due"
                        );
                    }
                    _ => trace!(
                        reason = "safety_net_poll",
                        wait_ms = wait.as_millis() as u64,
                        "monitor timeout"
                    ),
                }
            }
        }
    }
}
