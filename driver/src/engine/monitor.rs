//! The monitor (OL-13): the core's [`MonitorBook`] driven by one task on any [`Runtime`].
//!
//! One task owns the book, which decides everything: when to poll, which actors to drain,
//! when the upkeep runs, how the monitor stops. The task executes its commands — it asks the
//! store which actors are due (where blocking is allowed), starts each due actor's drain as
//! a task of its own (at most `max_passes` with work at once: the book enforces it; a pass
//! that only waits on attempts in flight is not counted), starts the upkeep, asks the passes
//! to stop — and otherwise waits for the first of the inputs it hands to the book:
//!
//! - a stop request ([`Monitor::stop`], or the [`Monitor`] dropped), or the stop of its outbox
//!   ([`shutdown`](super::shutdown), which `Monitor::stop` runs);
//! - a pass ending, or coming to only wait on its attempts in flight (each pass task reports
//!   on one channel, in order, however it ends);
//! - a wake-up from the store's [`Notifier`](outbox_lanes_store::Notifier): an enqueue in
//!   this process (after its commit) or a change seen by the cross-process watcher;
//! - the book's [`MonitorBook::poll_timeout`]: the safety-net poll, the earliest lane
//!   `not_before`, the next upkeep or the end of a stop's grace, on the runtime's timer;
//! - the store's upkeep ([`DriverStore::upkeep`](outbox_lanes_store::DriverStore::upkeep): row ids past their dedup window, finished
//!   units past the ack retention) ending, or coming due: at start, then every
//!   [`upkeep_interval`](crate::OutboxConfig::upkeep_interval), as a task of its own (one at a
//!   time, where blocking is allowed) so a long purge never delays a poll. A stop waits for
//!   a running upkeep, at most the shutdown grace from the stop's start.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::{Arc, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_channel::{mpsc, oneshot};
use futures_core::Stream;
use outbox_lanes_core::{
    ActorId, MonitorAction, MonitorBook, MonitorStop, TimeoutReason, Timestamp, Wake,
};
use outbox_lanes_store::{StoreError, Subscription};
use tracing::{debug, error, info, trace, warn};

use super::{BoxFuture, Runtime, Stopped, unblock, wake};
use crate::clock::Clock;
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
async fn upkeep(
    rt: Arc<dyn Runtime>,
    core: Arc<OutboxCore>,
    clock: Arc<dyn Clock>,
    done: UpkeepDone,
) {
    let c = Arc::clone(&core);
    match unblock(&*rt, move || c.store().upkeep(clock.now())).await {
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

/// The monitor's clocks, read only through its outbox's [`Clock`] (the runtime's). The book's
/// time is the wall time at the monitor's start plus the monotonic time since: it never steps
/// back, so a step of the wall clock stretches neither the upkeep interval nor the shutdown
/// grace, and it moves with the runtime's timer (tokio's can be paused). The store is asked
/// in wall-clock time (a lane's `not_before` is wall-clock).
struct Clocks {
    clock: Arc<dyn Clock>,
    wall_at_start: Timestamp,
    started: Instant,
}

/// One reading of the monitor's clocks.
#[derive(Clone, Copy)]
struct Now {
    /// The book's time.
    book: Timestamp,
    /// The wall-clock time.
    wall: Timestamp,
}

impl Clocks {
    fn new(clock: Arc<dyn Clock>) -> Clocks {
        let (wall_at_start, started) = (clock.now(), clock.instant());
        Clocks {
            clock,
            wall_at_start,
            started,
        }
    }

    fn now(&self) -> Now {
        let since = self.clock.instant().saturating_duration_since(self.started);
        Now {
            book: self.wall_at_start + since,
            wall: self.clock.now(),
        }
    }
}

impl Now {
    /// A wall-clock time (a lane's `not_before`) on the book's clock.
    fn on_book(self, wall: Timestamp) -> Timestamp {
        self.book + wall.saturating_duration_since(self.wall)
    }
}

/// The loop's inputs besides its timer.
struct Inputs {
    stop: Option<oneshot::Receiver<()>>,
    reports: mpsc::UnboundedReceiver<(ActorId, Report)>,
    upkeep: mpsc::UnboundedReceiver<()>,
    woken: wake::Woken,
}

impl Inputs {
    /// The first input to arrive, or [`Event::Timeout`] once `sleep` completes.
    async fn next(&mut self, mut sleep: BoxFuture<()>) -> Event {
        poll_fn(|cx| {
            if let Some(rx) = self.stop.as_mut() {
                if let Poll::Ready(asked) = Pin::new(rx).poll(cx) {
                    self.stop = None;
                    return Poll::Ready(Event::Stop(asked.is_ok()));
                }
            }
            if let Poll::Ready(Some((actor, report))) = Pin::new(&mut self.reports).poll_next(cx) {
                return Poll::Ready(Event::Report(actor, report));
            }
            if let Poll::Ready(Some(())) = Pin::new(&mut self.upkeep).poll_next(cx) {
                return Poll::Ready(Event::UpkeepDone);
            }
            if self.woken.poll_woken(cx).is_ready() {
                return Poll::Ready(Event::Woken);
            }
            if sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Event::Timeout);
            }
            Poll::Pending
        })
        .await
    }
}

/// What the loop holds beside the book: what only its executor knows.
struct MonitorLoop<'a> {
    rt: &'a Arc<dyn Runtime>,
    core: &'a Arc<OutboxCore>,
    clocks: Clocks,
    book: MonitorBook,
    /// The running passes' controls: to ask them to stop, and to tell them whether other
    /// actors wait for a pass.
    passes: HashMap<ActorId, Arc<DrainControl>>,
    /// What the passes report (ends, waiting) on one channel: a pass's reports arrive in the
    /// order it sent them, so a stale "waiting" never lands on the actor's next pass.
    reports: mpsc::UnboundedSender<(ActorId, Report)>,
    upkeep_done: mpsc::UnboundedSender<()>,
    /// The database file was removed or replaced (see [`Monitor::ended`]).
    lost: Option<StoreError>,
}

impl<'a> MonitorLoop<'a> {
    fn new(
        rt: &'a Arc<dyn Runtime>,
        core: &'a Arc<OutboxCore>,
        reports: mpsc::UnboundedSender<(ActorId, Report)>,
        upkeep_done: mpsc::UnboundedSender<()>,
    ) -> Self {
        let config = core.config();
        let book = MonitorBook::new(config.max_passes, config.poll_interval)
            .with_upkeep_every(config.upkeep_interval)
            .with_shutdown_grace(config.shutdown_grace);
        info!(
            max_passes = config.max_passes,
            poll_interval_ms = config.poll_interval.as_millis() as u64,
            "monitor started"
        );
        MonitorLoop {
            rt,
            core,
            clocks: Clocks::new(Arc::clone(core.clock())),
            book,
            passes: HashMap::new(),
            reports,
            upkeep_done,
            lost: None,
        }
    }

    /// Runs one of the book's commands; `Break` once the monitor is done.
    async fn execute(&mut self, action: MonitorAction, now: Now) -> ControlFlow<()> {
        match action {
            MonitorAction::Upkeep => {
                let done = UpkeepDone(self.upkeep_done.clone());
                let (rt, core) = (Arc::clone(self.rt), Arc::clone(self.core));
                let clock = Arc::clone(&self.clocks.clock);
                self.rt.spawn(Box::pin(upkeep(rt, core, clock, done)));
            }
            MonitorAction::Poll => self.poll(now).await,
            MonitorAction::Drain(actor) => self.start_pass(actor),
            MonitorAction::StopPasses => {
                for control in self.passes.values() {
                    control.request_stop();
                }
            }
            MonitorAction::Stopped { upkeep_left } => {
                if upkeep_left {
                    warn!(
                        "the store's upkeep still runs past the shutdown grace: it finishes in the background"
                    );
                }
                info!("monitor stopped");
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    /// Asks the store which actors are due, where blocking is allowed.
    async fn poll(&mut self, now: Now) {
        let c = Arc::clone(self.core);
        // The file check is one `stat`, on every poll (wake-ups and the safety net), never
        // per unit.
        let due = unblock(&**self.rt, move || {
            c.store().check_database()?;
            c.store().actors_with_work(now.wall)
        })
        .await;
        match due {
            Some(Err(e @ StoreError::Replaced { .. })) => {
                error!(error = %e, running = self.passes.len(),
                    "the database file is gone: this relay stops claiming (no new pass; running passes finish their attempts in flight and hand the rest back)");
                self.lost = Some(e);
                self.core.stop_record().note_database_lost();
                self.book.handle_stop(MonitorStop::DatabaseLost, now.book);
            }
            Some(Ok(due)) => {
                trace!(
                    ready = due.ready.len(),
                    next_not_before = due.next_not_before.map(crate::fmt::rfc3339),
                    "monitor poll"
                );
                let next_not_before = due.next_not_before.map(|t| now.on_book(t));
                self.book.handle_due(due.ready, next_not_before, now.book);
            }
            Some(Err(e)) => {
                warn!(error = %e, "monitor poll failed; retrying at the next tick");
                self.book.handle_poll_failed(now.book);
            }
            None => self.book.handle_poll_failed(now.book),
        }
    }

    /// Starts `actor`'s drain as a task of its own, which reports its end however it ends.
    fn start_pass(&mut self, actor: ActorId) {
        debug!(%actor, running = self.passes.len() + 1, "monitor starts a pass");
        // Back to the queue at the end of a time slice, behind the others.
        let control = Arc::new(DrainControl::yielding());
        let waiting = self.reports.clone();
        control.on_waiting(move |actor, w| {
            let _ = waiting.unbounded_send((actor.clone(), Report::Waiting(w)));
        });
        self.passes.insert(actor.clone(), Arc::clone(&control));
        let report = PassDone {
            actor: Some(actor),
            more: false,
            tx: self.reports.clone(),
        };
        let (r, c) = (Arc::clone(self.rt), Arc::clone(self.core));
        self.rt.spawn(Box::pin(async move {
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

    /// How long to wait for an input: until the book's deadline, at least a millisecond and
    /// at most a poll interval (the loop looks again then, whatever the timer did), and why.
    fn wait(&self) -> (Duration, Option<TimeoutReason>) {
        let interval = self.core.config().poll_interval;
        let now = self.clocks.now().book;
        let timeout = self.book.timeout();
        let wait = timeout.map_or(interval, |(at, _)| at - now).clamp(
            Duration::from_millis(1),
            interval.max(Duration::from_millis(1)),
        );
        (wait, timeout.map(|(_, why)| why))
    }

    /// Hands what ended the wait to the book.
    fn handle(&mut self, event: Event, wait: Duration, why: Option<TimeoutReason>) {
        let now = self.clocks.now().book;
        match event {
            Event::Stop(asked) => {
                debug!(
                    reason = if asked { "stop" } else { "monitor_dropped" },
                    running = self.passes.len(),
                    "monitor woken: stopping (passes finish attempts in flight, hand the rest back)"
                );
                self.book.handle_stop(MonitorStop::Asked, now);
            }
            Event::Report(actor, Report::Done(more)) => {
                debug!(reason = "pass_done", %actor, more, "monitor woken: a pass ended");
                self.passes.remove(&actor);
                self.book.handle_pass_done(&actor, more, now);
            }
            Event::Report(actor, Report::Waiting(w)) => {
                debug!(reason = "pass_waiting", %actor, waiting = w,
                    "monitor woken: a pass only waits on attempts in flight (not counted against max_passes), or has work again");
                self.book.handle_pass_waiting(&actor, w, now);
            }
            Event::UpkeepDone => {
                trace!(
                    reason = "upkeep_done",
                    "monitor woken: the store's upkeep ended"
                );
                self.book.handle_upkeep_done(now);
            }
            Event::Woken if self.book.stopping() => trace!(
                reason = "store_changed",
                "monitor woken while stopping: ignored"
            ),
            Event::Woken => {
                debug!(reason = "store_changed", "monitor woken: the store changed");
                self.book.handle_wake(Wake::StoreChanged, now);
            }
            // The book acts next if a deadline passed; it says nothing if the timer merely
            // fired early (a clamped or coarse sleep).
            Event::Timeout => log_timeout(why, wait),
        }
    }
}

fn log_timeout(why: Option<TimeoutReason>, wait: Duration) {
    let wait_ms = wait.as_millis() as u64;
    match why {
        Some(TimeoutReason::NotBefore) => debug!(
            reason = "not_before",
            wait_ms, "monitor timeout: a lane is due"
        ),
        Some(TimeoutReason::Upkeep) => {
            trace!(
                reason = "upkeep",
                wait_ms, "monitor timeout: the upkeep is due"
            )
        }
        Some(TimeoutReason::GraceOver) => debug!(
            reason = "grace_over",
            wait_ms, "monitor timeout: the shutdown grace for the upkeep is over"
        ),
        Some(TimeoutReason::Poll) | None => {
            trace!(reason = "safety_net_poll", wait_ms, "monitor timeout")
        }
    }
}

/// The loop: runs the book's commands, then waits for the first input or its deadline and
/// hands it to the book.
async fn run(
    rt: &Arc<dyn Runtime>,
    core: &Arc<OutboxCore>,
    woken: wake::Woken,
    subscription: Subscription,
    stop_rx: oneshot::Receiver<()>,
) -> Option<StoreError> {
    // Unsubscribed when the loop returns.
    let _subscription = subscription;
    let (reports, report_rx) = mpsc::unbounded();
    let (upkeep_done, upkeep_rx) = mpsc::unbounded();
    let mut inputs = Inputs {
        stop: Some(stop_rx),
        reports: report_rx,
        upkeep: upkeep_rx,
        woken,
    };
    let mut m = MonitorLoop::new(rt, core, reports, upkeep_done);
    loop {
        let now = m.clocks.now();
        if core.is_stopping() && !m.book.stopping() {
            debug!(
                reason = "outbox_stopping",
                running = m.passes.len(),
                "monitor stopping: its outbox stops"
            );
            m.book.handle_stop(MonitorStop::OutboxStops, now.book);
        }
        while let Some(action) = m.book.poll_action(now.book) {
            if m.execute(action, now).await.is_break() {
                return m.lost;
            }
        }
        // Running passes yield at their time slice only while other actors wait for one.
        let contended = m.book.queued() > 0;
        for control in m.passes.values() {
            control.set_contended(contended);
        }
        let (wait, why) = m.wait();
        let event = inputs.next(rt.sleep(wait)).await;
        m.handle(event, wait, why);
    }
}
