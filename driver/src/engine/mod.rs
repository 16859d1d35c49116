//! The relay engine: the drain-slot protocol, the pass loop and the monitor, written once
//! for every runtime.
//!
//! A runtime provides only an executor, the [`Runtime`] trait (quinn's `Runtime` over
//! quinn-proto, in small): spawn a task, sleep, run a blocking store call, its clock, and
//! the dedicated threads the library starts.
//! Waiting for a store wake-up or a completion uses runtime-free primitives
//! (`futures-channel`), and transmitting one HTTP request is the [`Executor`](crate::Executor)
//! the runtime hands to [`OutboxCore`]. Everything that decides — the core's
//! [`DrainSession`], [`PassSession`](outbox_lanes_core::PassSession),
//! [`Scheduler`](outbox_lanes_core::Scheduler) and [`MonitorBook`](outbox_lanes_core::MonitorBook)
//! — is driven from here:
//!
//! - [`drain`]: one actor's drain: the in-process slot, the store's fenced slot, passes,
//!   look-again (OL-12);
//! - [`pass_task`]: one pass as a task: rounds on the task when they need no store, on the
//!   blocking side when they do, completions taken in batches (one wake-up for many), and
//!   the first few attempts in flight polled on the pass's own task ([`spawn_delivery`]);
//! - [`Monitor`]: drains every actor with work (OL-13), passes of several actors at once up
//!   to `max_passes` — passes that only wait on attempts in flight not counted;
//! - [`shutdown`]: the one stop of an outbox (its monitors, passes, executor and holder lock
//!   file), within the shutdown grace: [`Stopped`] says what it cut.
//!
//! The tokio runtime implements [`Runtime`] over tokio (or async-std, smol); the blocking
//! runtime over std threads, where each task owns a thread and blocking calls run in place
//! ([`Runtime::blocking_in_place`]).

mod local;
mod monitor;
pub mod pass_task;
mod wake;

use std::sync::Arc;
use std::time::Duration;

use outbox_lanes_core::{Acquire, ActorId, DrainAction, DrainSession, SlotAnswer, Timestamp};
use outbox_lanes_store::{SlotAcquisition, SlotRelease, SlotToken, Store, StoreError};
use tracing::warn;

pub use self::local::spawn_delivery;
pub use self::monitor::Monitor;
use crate::control::DrainControl;
use crate::error::OutboxError;
use crate::outbox::{DrainOutcome, OutboxCore, drain_outcome, store_released};
use crate::pass::PassReport;
pub use crate::runtime::{BoxFuture, Runtime, SpawnThread, StdThreads};

/// Runs `f` where blocking is allowed and waits for its value.
///
/// `None` if the runtime dropped the work unrun (it is shutting down) or `f` panicked.
pub async fn unblock<T, F>(rt: &dyn Runtime, f: F) -> Option<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    if rt.blocking_in_place() {
        return Some(f());
    }
    let (tx, rx) = futures_channel::oneshot::channel();
    rt.spawn_blocking(Box::new(move || {
        let _ = tx.send(f());
    }));
    rx.await.ok()
}

/// Drops `value` — a reference to the core or to the store — where blocking is allowed: it
/// may be the last one, and the store may go with it (a Postgres client panics when dropped
/// on an executor thread).
pub fn drop_where_blocking<T: Send + 'static>(rt: &dyn Runtime, value: T) {
    if rt.blocking_in_place() {
        drop(value);
    } else {
        rt.spawn_blocking(Box::new(move || drop(value)));
    }
}

fn shutting_down() -> StoreError {
    StoreError::Database("the runtime is shutting down".into())
}

/// Runs `actor`'s drain on `rt`: the core's [`DrainSession`] decides, this executes — the
/// in-process slot, the store's fenced slot, passes and look-again (OL-12). Returns
/// [`DrainOutcome::Merged`] at once if a pass of the actor already runs.
///
/// # Errors
/// [`OutboxError::ShuttingDown`] once the outbox stops; a store failure (every unfinished
/// unit was handed back first, OL-14).
pub async fn drain(
    rt: &Arc<dyn Runtime>,
    core: &Arc<OutboxCore>,
    actor: &ActorId,
    control: &Arc<DrainControl>,
) -> Result<DrainOutcome, OutboxError> {
    if core.is_stopping() {
        return Err(OutboxError::ShuttingDown);
    }
    if core.slots().try_acquire(actor) == Acquire::Merged {
        return Ok(DrainOutcome::Merged);
    }
    // A stop that began meanwhile saw no pass of this actor running, and goes on to remove
    // this holder's lock file: no slot is taken after it.
    if core.is_stopping() {
        core.force_release_slot(actor);
        return Err(OutboxError::ShuttingDown);
    }
    let yield_at_slice = control
        .yield_at_slice
        .load(std::sync::atomic::Ordering::SeqCst);
    let mut session = DrainSession::new(yield_at_slice);
    let mut token = None;
    let mut total = PassReport::default();
    let mut error: Option<StoreError> = None;
    // When the slot's lease was acquired or last renewed; handed from pass to pass.
    let mut lease_renewed = core.clock().now();
    while let Some(action) = session.poll_action() {
        match action {
            DrainAction::AcquireStoreSlot => {
                let (asked, got) = acquire_store_slot(rt, core, actor).await;
                match got {
                    Ok(SlotAcquisition::Acquired(t)) => {
                        token = Some(t);
                        lease_renewed = asked;
                        session.handle_store_acquire(SlotAnswer::Acquired);
                    }
                    Ok(SlotAcquisition::Held) => session.handle_store_acquire(SlotAnswer::Held),
                    Err(e) => {
                        error.get_or_insert(e);
                        session.handle_failed();
                    }
                }
            }
            DrainAction::RunPass => {
                let t = token
                    .clone()
                    .expect("the session runs a pass only after acquiring the store's slot");
                let result = pass_task::run_pass(rt, core, t, control, lease_renewed).await;
                lease_renewed = result.lease_renewed;
                if result.report.grace_over && core.is_stopping() {
                    core.stop_record().note_grace_over();
                    core.stop_record()
                        .note_interrupted(result.report.interrupted);
                }
                total.add(&result.report);
                if let Some(e) = result.error {
                    warn!(%actor, error = %e, end = %result.end, "pass ended on a store failure");
                    error.get_or_insert(e);
                }
                session.handle_pass_end(result.end);
            }
            DrainAction::ReleaseStoreSlot => {
                end_store_slot(rt, core, actor, token.clone(), &mut session, |s, t| {
                    s.release_slot(t)
                })
                .await;
            }
            DrainAction::FreeStoreSlot => {
                end_store_slot(rt, core, actor, token.clone(), &mut session, |s, t| {
                    s.free_slot(t).map(|()| SlotRelease::Released)
                })
                .await;
            }
            DrainAction::ReleaseLocalSlot | DrainAction::ForceReleaseLocalSlot => {
                core.local_slot_action(actor, &action, &mut session);
            }
            DrainAction::Finish(end) => {
                return drain_outcome(end, total, error, || OutboxError::ShuttingDown);
            }
        }
    }
    Err(OutboxError::Store(StoreError::Database(
        "the drain session ended without finishing".into(),
    )))
}

/// Asks the store for `actor`'s slot, where blocking is allowed; with the time read before
/// asking (the lease runs from the database's acquisition, later).
async fn acquire_store_slot(
    rt: &Arc<dyn Runtime>,
    core: &Arc<OutboxCore>,
    actor: &ActorId,
) -> (Timestamp, Result<SlotAcquisition, StoreError>) {
    let asked = core.clock().now();
    let (c, a) = (Arc::clone(core), actor.clone());
    let got = unblock(&**rt, move || {
        c.store().acquire_slot(&a, c.holder(), c.config().lease)
    })
    .await
    .unwrap_or_else(|| Err(shutting_down()));
    (asked, got)
}

/// Ends the store's slot `token` with `end` (`release_slot` or `free_slot`), where blocking is
/// allowed, telling `session` how it went. Without a token (the session never acquired one)
/// it fails.
async fn end_store_slot(
    rt: &Arc<dyn Runtime>,
    core: &Arc<OutboxCore>,
    actor: &ActorId,
    token: Option<SlotToken>,
    session: &mut DrainSession,
    end: fn(&dyn Store, &SlotToken) -> Result<SlotRelease, StoreError>,
) {
    let Some(t) = token else {
        session.handle_failed();
        return;
    };
    let c = Arc::clone(core);
    let ended = unblock(&**rt, move || end(&**c.store(), &t))
        .await
        .unwrap_or_else(|| Err(shutting_down()));
    store_released(session, actor, ended);
}

/// How long a stop waits, past the shutdown grace, for its passes to end: each ends by itself
/// when the grace runs out (the core decides it), then hands back and releases its slot —
/// store writes only, its attempts in flight were cut. A pass whose store does not answer
/// within it is left to end in the background, its holder's lock file kept (unlocked: other
/// relays take its slots over at once).
pub const HAND_BACK_WAIT: Duration = Duration::from_secs(5);

/// How a stop of an outbox went: what [`shutdown`] (the runtimes' `Outbox::shutdown`) and
/// [`Monitor::stop`] return.
///
/// Whatever it says, nothing was lost: every unit not delivered is still pending in the store
/// and is delivered by the next pass of any relay (at-least-once, with the same
/// `Idempotency-Key`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stopped {
    /// The shutdown grace ([`OutboxConfig::shutdown_grace`](crate::OutboxConfig::shutdown_grace),
    /// 10 s by default) ran out with attempts still in flight, and the stop abandoned them
    /// instead of waiting for their answers (up to the HTTP timeout, 30 s by default). Each
    /// was recorded as an *interrupted* attempt — last error `interrupted: …`, not counted
    /// toward `max_attempts` (OL-14) — and its unit stays pending: the recipient may or may
    /// not have received it, and gets it again. `false`: every attempt in flight at the stop
    /// was answered within the grace.
    pub grace_over: bool,
    /// The attempts the stop abandoned in flight when the grace ran out (each recorded as
    /// interrupted, its unit pending again), as the passes that ended by then counted them:
    /// 0 when none was, or when `grace_over` comes only from a pass still writing its
    /// hand-back when the stop stopped waiting (its count is not known yet).
    pub interrupted: u64,
    /// A monitor of this outbox had stopped by itself before: its database file was removed
    /// or replaced ([`Monitor::ended`] says which).
    pub database_lost: bool,
}

/// The one stop of an outbox, the same on every runtime: nothing new starts (new drains are
/// refused, every monitor of the outbox stops); running passes start nothing new, and their
/// attempts in flight have the shutdown grace to finish; when it runs out, the attempts still
/// in flight are abandoned (recorded as interrupted, their units handed back, to be delivered
/// again later) instead of waited for up to the HTTP timeout; each pass hands back what it did
/// not finish, commits its acks and releases its drain slot; then the executor stops, the acks
/// still waiting are committed, and this process's holder lock file (SQLite:
/// `<database>-holders/<holder>.lock`) is removed. Returns within the grace, plus the time the
/// passes take to write their hand-back (at most [`HAND_BACK_WAIT`] more).
///
/// Calling it again (or after [`Monitor::stop`]) returns at once with the same answer. The
/// outbox still enqueues and reads afterwards; drains are refused
/// ([`OutboxError::ShuttingDown`]).
pub async fn shutdown(rt: &Arc<dyn Runtime>, core: &Arc<OutboxCore>) -> Stopped {
    // Woken by every slot release (no polling); subscribed before the stop so no release
    // is missed.
    let (released, mut waiting) = wake::pair();
    let _released = core.slot_released().subscribe(move || released.wake());
    core.begin_shutdown();
    // The passes end by themselves at the grace; this only bounds a store that hangs.
    let mut timeout = rt.sleep(core.config().shutdown_grace + HAND_BACK_WAIT);
    while core.slots().running() > 0 {
        let timed_out = std::future::poll_fn(|cx| {
            if waiting.poll_woken(cx).is_ready() {
                return std::task::Poll::Ready(false);
            }
            timeout.as_mut().poll(cx).map(|()| true)
        })
        .await;
        if timed_out {
            let running = core.slots().running();
            if running > 0 {
                warn!(
                    running,
                    "passes still writing their hand-back past the shutdown grace: they end in the background (their slots end with their lease, or at once for relays that see this one gone)"
                );
                core.stop_record().note_grace_over();
            }
            break;
        }
    }
    let c = Arc::clone(core);
    let _ = unblock(&**rt, move || {
        c.finish_shutdown();
        c.store().close_holder(c.holder());
    })
    .await;
    Stopped {
        grace_over: core.stop_record().grace_over(),
        interrupted: core.stop_record().interrupted(),
        database_lost: core.stop_record().database_lost(),
    }
}
