//! The monitor (OL-13): the core's [`MonitorBook`] driven by one task on any [`Runtime`].
//!
//! One task owns the book. It asks the store which actors are due (where blocking is
//! allowed), starts each due actor's drain as a task of its own (at most `max_passes` with
//! work at once: the book enforces it; a pass that only waits on attempts in flight is not
//! counted), and otherwise waits for the first of:
//!
//! - a stop request ([`Monitor::stop`], or the [`Monitor`] dropped), or the stop of its outbox
//!   ([`shutdown`](super::shutdown), which `Monitor::stop` runs);
//! - a pass ending, or coming to only wait on its attempts in flight (each pass task reports
//!   on one channel, in order, however it ends);
//! - a wake-up from the store's [`Notifier`](outbox_lanes_store::Notifier): an enqueue in
//!   this process (after its commit) or a change seen by the cross-process watcher;
//! - the book's [`MonitorBook::poll_timeout`]: the safety-net poll or the earliest lane
//!   `not_before`, on the runtime's timer;
//! - the store's upkeep ([`DriverStore::upkeep`](outbox_lanes_store::DriverStore::upkeep): row ids past their dedup window, finished
//!   units past the ack retention) ending, or coming due: at start, then every
//!   [`upkeep_interval`](crate::OutboxConfig::upkeep_interval), as a task of its own (one at a
//!   time, where blocking is allowed) so a long purge never delays a poll. A stop waits for
//!   a running upkeep, at most the shutdown grace from the stop's start.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, PoisonError};
use std::task::Poll;
use std::time::{Duration, SystemTime};

use futures_channel::{mpsc, oneshot};
use futures_core::Stream;
use outbox_lanes_core::{ActorId, MonitorAction, MonitorBook, Timestamp, Wake};
use outbox_lanes_store::{StoreError, Subscription};
use tracing::{debug, error, info, trace, warn};

use super::{Runtime, Stopped, unblock, wake};
use crate::control::DrainControl;
use crate::error::OutboxError;
use crate::outbox::{DrainOutcome, OutboxCore};

/// A running monitor; see [`Monitor::start`]. [`Monitor::stop`] is the stop of its outbox
/// (the same as [`shutdown`](super::shutdown)); dropping it stops only the monitor, in the
/// background (running passes start nothing new, finish their attempts in flight and hand the
/// rest back), and leaves the outbox open.
pub struct Monitor {
    rt: Arc<dyn Runtime>,
    /// The outbox it drains; `None` once stopped or dropped (let go of where blocking is
    /// allowed: it may hold the last reference to the store).
    core: Option<Arc<OutboxCore>>,
    /// Sending (or dropping) it asks the loop to stop.
    stop: Option<oneshot::Sender<()>>,
    /// Completes (or closes) when the loop has returned.
    done: Option<oneshot::Receiver<()>>,
    /// Why the loop stopped by itself: the database was replaced or removed.
    lost: Arc<std::sync::Mutex<Option<StoreError>>>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("running", &self.stop.is_some())
            .finish_non_exhaustive()
    }
}

impl Monitor {
    /// Subscribes to the store's wake-ups (starting its cross-process watcher) and spawns
    /// the monitor's loop on `rt`.
    ///
    /// # Errors
    /// The store's watcher could not be started.
    pub async fn start(
        rt: Arc<dyn Runtime>,
        core: Arc<OutboxCore>,
    ) -> Result<Monitor, OutboxError> {
        // Starting the cross-process watcher opens a connection: blocking.
        let c = Arc::clone(&core);
        let notifier = unblock(&*rt, move || c.store().watch())
            .await
            .ok_or(OutboxError::ShuttingDown)??;
        let (waker, woken) = wake::pair();
        // The outbox's stop wakes the loop as a store change does; the loop then sees it.
        let w = waker.clone();
        let stopping = core.shutdown_signal().subscribe(move || w.wake());
        // Runs on the notifying thread (an enqueuer, the watcher): short, never blocks; any
        // number of wake-ups before the loop looks are one.
        let subscription = notifier.subscribe(move || waker.wake());
        let (stop_tx, stop_rx) = oneshot::channel();
        let (done_tx, done_rx) = oneshot::channel();
        let lost = Arc::new(std::sync::Mutex::new(None));
        let l = Arc::clone(&lost);
        let (r, c) = (Arc::clone(&rt), Arc::clone(&core));
        rt.spawn(Box::pin(async move {
            let _stopping = stopping;
            let why = run(&r, &c, woken, subscription, stop_rx).await;
            *l.lock().unwrap_or_else(PoisonError::into_inner) = why;
            super::drop_where_blocking(&*r, c);
            let _ = done_tx.send(());
        }));
        Ok(Monitor {
            rt,
            core: Some(core),
            stop: Some(stop_tx),
            done: Some(done_rx),
            lost,
        })
    }

    /// Completes when the monitor stopped by itself, which it does only when its database
    /// file was removed or replaced ([`StoreError::Replaced`], logged at ERROR): it then
    /// started no new pass, asked the running ones to stop (attempts in flight finish, the
    /// rest is handed back) and returned once they ended. Pending forever otherwise, until
    /// [`Monitor::stop`]. Cancellation-safe.
    pub async fn ended(&mut self) -> StoreError {
        loop {
            if let Some(e) = self.lost() {
                return e;
            }
            match self.done.as_mut() {
                Some(done) => {
                    // Closed without a value: the runtime dropped the loop.
                    let _ = done.await;
                    self.done = None;
                }
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn lost(&self) -> Option<StoreError> {
        self.lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops the monitor and its outbox: the outbox's one stop
    /// ([`shutdown`](super::shutdown), which also stops every other monitor of the outbox),
    /// then waits for the monitor's loop to return. Within the shutdown grace, attempts in
    /// flight finish; past it they are abandoned and their units delivered again later
    /// ([`Stopped::grace_over`]). Calling the outbox's `shutdown` as well is harmless.
    pub async fn stop(mut self) -> Stopped {
        let mut stopped = match self.core.take() {
            Some(core) => {
                let stopped = super::shutdown(&self.rt, &core).await;
                super::drop_where_blocking(&*self.rt, core);
                stopped
            }
            None => Stopped::default(),
        };
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            // Closed without a value: the runtime dropped the loop (it is shutting down).
            let _ = done.await;
        }
        stopped.database_lost |= self.lost().is_some();
        stopped
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        // Dropping the sender closes the loop's stop channel: it stops the same way, in the
        // background.
        self.stop.take();
        if let Some(core) = self.core.take() {
            super::drop_where_blocking(&*self.rt, core);
        }
    }
}

/// What ended a wait of the loop.
enum Event {
    /// `true`: [`Monitor::stop`]; `false`: the [`Monitor`] was dropped.
    Stop(bool),
    Report(ActorId, Report),
    /// The store's upkeep ended.
    UpkeepDone,
    Woken,
    Timeout,
}

/// Tells the loop that the upkeep ended however its task ends (like [`PassDone`]).
struct UpkeepDone(mpsc::UnboundedSender<()>);

impl Drop for UpkeepDone {
    fn drop(&mut self) {
        let _ = self.0.unbounded_send(());
    }
}

/// Runs the store's upkeep where blocking is allowed, and logs what it did.
async fn upkeep(rt: Arc<dyn Runtime>, core: Arc<OutboxCore>, done: UpkeepDone) {
    let c = Arc::clone(&core);
    match unblock(&*rt, move || c.store().upkeep(wall_now())).await {
        Some(Ok((0, 0))) => trace!(reason = "upkeep", "store upkeep: nothing to delete"),
        Some(Ok((forgotten, purged))) => info!(
            forgotten,
            purged,
            "store upkeep: row ids past the row-id retention forgotten, finished units past the ack retention deleted"
        ),
        Some(Err(e)) => {
            warn!(error = %e, "store upkeep failed; trying again at the next one")
        }
        None => {}
    }
    super::drop_where_blocking(&*rt, core);
    drop(done);
}

/// What a pass task tells the loop.
enum Report {
    /// It ended; `true`: with work left.
    Done(bool),
    /// It only waits on attempts in flight (`true`), or has work again.
    Waiting(bool),
}

/// Reports a pass's end to the loop however the pass task ends: normally, by a panic, or
/// dropped unrun by a runtime that is shutting down (then as "no more work").
struct PassDone {
    actor: Option<ActorId>,
    more: bool,
    tx: mpsc::UnboundedSender<(ActorId, Report)>,
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
            let _ = self.tx.unbounded_send((actor, Report::Done(self.more)));
        }
    }
}

fn wall_now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

async fn run(
    rt: &Arc<dyn Runtime>,
    core: &Arc<OutboxCore>,
    mut woken: wake::Woken,
    subscription: Subscription,
    stop_rx: oneshot::Receiver<()>,
) -> Option<StoreError> {
    // Unsubscribed when the loop returns.
    let _subscription = subscription;
    let poll_interval = core.config().poll_interval;
    let max_passes = core.config().max_passes;
    let mut book = MonitorBook::new(max_passes, poll_interval);
    // What the passes report (ends, waiting) on one channel: a pass's reports arrive in the
    // order it sent them, so a stale "waiting" never lands on the actor's next pass.
    let (report_tx, mut report_rx) = mpsc::unbounded::<(ActorId, Report)>();
    // The running passes' controls, for a graceful stop.
    let mut running: HashMap<ActorId, Arc<DrainControl>> = HashMap::new();
    let mut stop_rx = Some(stop_rx);
    let mut stopping = false;
    // The earliest lane `not_before` of the last poll, to name why a timeout fired.
    let mut next_not_before: Option<Timestamp> = None;
    // The database file was removed or replaced: no new pass, ever (see `Monitor::ended`).
    let mut lost: Option<StoreError> = None;
    // The store's upkeep: when it is next due, and whether one runs.
    let upkeep_every = core.config().upkeep_interval.max(Duration::from_millis(1));
    // `None`: never again (an interval past what a clock can hold).
    let mut upkeep_at = Some(rt.now());
    let mut upkeep_running = false;
    // When the loop began to stop: a running upkeep is waited for at most the shutdown grace
    // from then.
    let mut stop_began: Option<std::time::Instant> = None;
    let grace = core.config().shutdown_grace;
    let (upkeep_tx, mut upkeep_rx) = mpsc::unbounded::<()>();
    info!(
        max_passes,
        poll_interval_ms = poll_interval.as_millis() as u64,
        "monitor started"
    );
    loop {
        let now = wall_now();
        if !stopping && core.is_stopping() {
            debug!(
                reason = "outbox_stopping",
                running = running.len(),
                "monitor stopping: its outbox stops"
            );
            stopping = true;
        }
        if stopping {
            stop_began.get_or_insert_with(|| rt.now());
        }
        if !stopping && !upkeep_running && upkeep_at.is_some_and(|t| rt.now() >= t) {
            upkeep_running = true;
            upkeep_at = rt.now().checked_add(upkeep_every);
            let done = UpkeepDone(upkeep_tx.clone());
            rt.spawn(Box::pin(upkeep(Arc::clone(rt), Arc::clone(core), done)));
        }
        if !stopping {
            while let Some(action) = book.poll_action(now) {
                match action {
                    MonitorAction::Poll => {
                        let c = Arc::clone(core);
                        // The file check is one `stat`, on every poll (wake-ups and the
                        // safety net), never per unit.
                        let due = unblock(&**rt, move || {
                            c.store().check_database()?;
                            c.store().actors_with_work(now)
                        })
                        .await;
                        match due {
                            Some(Err(e @ StoreError::Replaced { .. })) => {
                                error!(error = %e, running = running.len(),
                                    "the database file is gone: this relay stops claiming (no new pass; running passes finish their attempts in flight and hand the rest back)");
                                lost = Some(e);
                                core.stop_record().note_database_lost();
                                stopping = true;
                                for control in running.values() {
                                    control.request_stop();
                                }
                                break;
                            }
                            Some(Ok(due)) => {
                                trace!(
                                    ready = due.ready.len(),
                                    next_not_before = due.next_not_before.map(crate::fmt::rfc3339),
                                    "monitor poll"
                                );
                                next_not_before = due.next_not_before;
                                book.handle_due(due.ready, due.next_not_before, now);
                            }
                            Some(Err(e)) => {
                                warn!(error = %e, "monitor poll failed; retrying at the next tick");
                                book.handle_poll_failed(now);
                            }
                            None => book.handle_poll_failed(now),
                        }
                    }
                    MonitorAction::Drain(actor) => {
                        debug!(%actor, running = running.len() + 1, "monitor starts a pass");
                        // Back to the queue at the end of a time slice, behind the others.
                        let control = Arc::new(DrainControl::yielding());
                        let waiting = report_tx.clone();
                        control.on_waiting(move |actor, w| {
                            let _ = waiting.unbounded_send((actor.clone(), Report::Waiting(w)));
                        });
                        running.insert(actor.clone(), Arc::clone(&control));
                        let report = PassDone {
                            actor: Some(actor),
                            more: false,
                            tx: report_tx.clone(),
                        };
                        let (r, c) = (Arc::clone(rt), Arc::clone(core));
                        rt.spawn(Box::pin(async move {
                            let Some(actor) = report.actor.clone() else {
                                return;
                            };
                            let more = match super::drain(&r, &c, &actor, &control).await {
                                Ok(DrainOutcome::Ran(rep)) => rep.yielded,
                                Ok(DrainOutcome::Merged) => false,
                                Err(e) => {
                                    warn!(%actor, error = %e, "pass failed");
                                    false
                                }
                            };
                            super::drop_where_blocking(&*r, c);
                            report.finish(more);
                        }));
                    }
                }
            }
        }
        if stopping && running.is_empty() {
            // A running upkeep is waited for at most the shutdown grace; past it, it finishes
            // in the background (each of its deletes is a transaction of its own).
            let since = *stop_began.get_or_insert_with(|| rt.now());
            let over = rt.now().saturating_duration_since(since) >= grace;
            if over && upkeep_running {
                warn!(
                    "the store's upkeep still runs past the shutdown grace: it finishes in the background"
                );
            }
            if !upkeep_running || over {
                info!("monitor stopped");
                return lost;
            }
        }
        // Running passes yield at their time slice only while other actors wait for one.
        let contended = book.queued() > 0;
        for control in running.values() {
            control.set_contended(contended);
        }
        // Wall-clock deadlines (lane `not_before` is wall-clock), slept on the runtime's timer.
        let deadline = book.poll_timeout();
        let until_upkeep =
            upkeep_at.map_or(Duration::MAX, |t| t.saturating_duration_since(rt.now()));
        let wait = deadline
            .map_or(poll_interval, |t| {
                Duration::from_millis(t.as_millis().saturating_sub(now.as_millis()))
            })
            .min(if upkeep_running || stopping {
                Duration::MAX
            } else {
                until_upkeep
            })
            .min(match (stopping && running.is_empty(), stop_began) {
                (true, Some(since)) => {
                    grace.saturating_sub(rt.now().saturating_duration_since(since))
                }
                _ => Duration::MAX,
            })
            .clamp(
                Duration::from_millis(1),
                poll_interval.max(Duration::from_millis(1)),
            );
        let event = {
            let mut sleep = rt.sleep(wait);
            poll_fn(|cx| {
                if let Some(rx) = stop_rx.as_mut() {
                    if let Poll::Ready(asked) = Pin::new(rx).poll(cx) {
                        stop_rx = None;
                        return Poll::Ready(Event::Stop(asked.is_ok()));
                    }
                }
                if let Poll::Ready(Some((actor, report))) = Pin::new(&mut report_rx).poll_next(cx) {
                    return Poll::Ready(Event::Report(actor, report));
                }
                if let Poll::Ready(Some(())) = Pin::new(&mut upkeep_rx).poll_next(cx) {
                    return Poll::Ready(Event::UpkeepDone);
                }
                if woken.poll_woken(cx).is_ready() {
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
            Event::Report(actor, Report::Done(more)) => {
                debug!(reason = "pass_done", %actor, more, "monitor woken: a pass ended");
                running.remove(&actor);
                book.handle_pass_done(&actor, more, now);
            }
            Event::Report(actor, Report::Waiting(w)) => {
                debug!(reason = "pass_waiting", %actor, waiting = w,
                    "monitor woken: a pass only waits on attempts in flight (not counted against max_passes), or has work again");
                book.handle_pass_waiting(&actor, w, now);
            }
            Event::UpkeepDone => {
                trace!(
                    reason = "upkeep_done",
                    "monitor woken: the store's upkeep ended"
                );
                upkeep_running = false;
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
