//! The blocking runtime's monitor thread (OL-13), driven by the core's [`MonitorBook`].

use std::fmt;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use outbox_lanes_core::{ActorId, MonitorAction, MonitorBook, Timestamp, Wake};
use tracing::{debug, info, warn};

use crate::{DrainControl, DrainOutcome, Outbox, OutboxError, drain_actor};

enum MonitorMsg {
    Wake,
    PassDone(ActorId, bool),
    /// A pass only waits on attempts in flight (`true`), or has work again.
    Waiting(ActorId, bool),
    Stop,
}

/// The monitor thread: drains every actor with work admissible now, woken on enqueue (in
/// this process and, through the store's watcher, in others), at the earliest lane
/// `not_before`, and by a safety-net poll. Stopped by [`Monitor::stop`] or on drop.
pub struct Monitor {
    tx: Sender<MonitorMsg>,
    thread: Option<JoinHandle<()>>,
    outbox: Outbox,
}

impl fmt::Debug for Monitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Monitor").finish_non_exhaustive()
    }
}

impl Monitor {
    pub(crate) fn start(outbox: Outbox) -> Result<Monitor, OutboxError> {
        let (tx, rx) = mpsc::channel();
        let notifier = outbox.inner.store().watch()?;
        let wake = tx.clone();
        let woken = crate::wake::Coalesced::default();
        let w = woken.clone();
        let subscription = notifier.subscribe(move || {
            w.wake(&wake, || MonitorMsg::Wake);
        });
        let ob = outbox.clone();
        let done_tx = tx.clone();
        let thread = std::thread::Builder::new()
            .name("outbox-lanes-monitor".into())
            .spawn(move || {
                let _subscription = subscription;
                monitor_loop(&ob, &rx, &done_tx, &woken);
            })
            .map_err(OutboxError::Spawn)?;
        Ok(Monitor {
            tx,
            thread: Some(thread),
            outbox,
        })
    }

    /// Stops the monitor: running passes finish or hand back (graceful), then it returns.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        let _ = self.tx.send(MonitorMsg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = &self.outbox;
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

fn monitor_loop(
    outbox: &Outbox,
    rx: &Receiver<MonitorMsg>,
    tx: &Sender<MonitorMsg>,
    woken: &crate::wake::Coalesced,
) {
    let cfg = outbox.inner.config();
    let mut book = MonitorBook::new(cfg.max_passes, cfg.poll_interval);
    let mut passes: Vec<JoinHandle<()>> = Vec::new();
    let mut stopping = false;
    let control = Arc::new(DrainControl::yielding());
    let waiting = tx.clone();
    control.on_waiting(move |actor, w| {
        let _ = waiting.send(MonitorMsg::Waiting(actor.clone(), w));
    });
    loop {
        let now = Timestamp::from_system_time(SystemTime::now());
        if !stopping {
            while let Some(action) = book.poll_action(now) {
                match action {
                    MonitorAction::Poll => match outbox.inner.store().actors_with_work(now) {
                        Ok(due) => book.handle_due(due.ready, due.next_not_before, now),
                        Err(e) => {
                            warn!(error = %e, "monitor poll failed; retrying at the next tick");
                            book.handle_poll_failed(now);
                        }
                    },
                    MonitorAction::Drain(actor) => {
                        let core = Arc::clone(&outbox.inner);
                        let done = tx.clone();
                        let control = Arc::clone(&control);
                        let spawned = std::thread::Builder::new()
                            .name("outbox-lanes-pass".into())
                            .spawn(move || {
                                let more = match drain_actor(&core, &actor, &control) {
                                    Ok(DrainOutcome::Ran(r)) => r.yielded,
                                    Ok(DrainOutcome::Merged) => false,
                                    Err(e) => {
                                        warn!(%actor, error = %e, "pass failed");
                                        false
                                    }
                                };
                                let _ = done.send(MonitorMsg::PassDone(actor, more));
                            });
                        match spawned {
                            Ok(h) => passes.push(h),
                            Err(e) => warn!(error = %e, "cannot start a pass thread"),
                        }
                    }
                }
            }
        }
        passes.retain(|h| !h.is_finished());
        if stopping && passes.is_empty() {
            info!("monitor stopped");
            return;
        }
        let wait = book
            .poll_timeout()
            .map_or(cfg.poll_interval, |t| {
                Duration::from_millis(t.as_millis().saturating_sub(now.as_millis()))
            })
            .clamp(Duration::from_millis(1), cfg.poll_interval);
        match rx.recv_timeout(wait) {
            Ok(MonitorMsg::Wake) => {
                woken.taken();
                book.handle_wake(Wake::StoreChanged, now);
            }
            Ok(MonitorMsg::PassDone(actor, more)) => book.handle_pass_done(&actor, more, now),
            Ok(MonitorMsg::Waiting(actor, w)) => {
                debug!(%actor, waiting = w, "a pass only waits on attempts in flight: not counted against max_passes");
                book.handle_pass_waiting(&actor, w, now);
            }
            Ok(MonitorMsg::Stop) => {
                // Running passes stop starting units, finish what is in flight and hand the
                // rest back; the outbox itself stays usable.
                stopping = true;
                control.request_stop();
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}
