//! Cancellation of a drain whose future is dropped, and the bookkeeping that lets the next
//! drain of the same actor wait for the cancelled pass instead of merging into it.
//!
//! A dropped drain future cannot wait for its pass: the pass runs on the blocking pool and
//! sees the cancellation at its next wake-up (within a few milliseconds), then hands every
//! unfinished unit back and releases the slot. A drain asked for in that window would find
//! the slot held and return `Merged` — correct, but surprising right after a cancellation,
//! since the pass it merged into is ending without looking again. So a cancelled pass is
//! counted as *winding down* until its blocking call returns, and a new drain of the same
//! actor in this outbox first waits for that (a few milliseconds), then runs a pass itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use outbox_lanes_core::ActorId;
use outbox_lanes_driver::DrainControl;
use tokio::sync::Notify;

/// Passes cancelled by a dropped future and not yet returned, per actor.
#[derive(Debug, Default)]
pub(crate) struct WindingDown {
    counts: Mutex<HashMap<ActorId, usize>>,
    done: Notify,
}

/// What one drain call shares between its future (the guard) and its blocking call.
#[derive(Debug, Default)]
struct CallState {
    /// The blocking call returned.
    finished: bool,
    /// The guard counted this call as winding down.
    counted: bool,
}

impl WindingDown {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ActorId, usize>> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until no cancelled pass of `actor` is winding down.
    pub(crate) async fn wait(&self, actor: &ActorId) {
        loop {
            let notified = self.done.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a wake-up between the two is not lost.
            notified.as_mut().enable();
            if self.lock().get(actor).copied().unwrap_or(0) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Starts tracking one drain call of `actor` controlled by `control`.
    pub(crate) fn start(
        self: &Arc<Self>,
        actor: ActorId,
        control: Arc<DrainControl>,
    ) -> (CancelOnDrop, CallDone) {
        let state = Arc::new(Mutex::new(CallState::default()));
        (
            CancelOnDrop {
                armed: Some(Armed {
                    winding: Arc::clone(self),
                    actor: actor.clone(),
                    control,
                    state: Arc::clone(&state),
                }),
            },
            CallDone {
                winding: Arc::clone(self),
                actor,
                state,
            },
        )
    }
}

/// Held by the drain future: dropped before [`CancelOnDrop::disarm`], it cancels the pass
/// and counts it as winding down.
pub(crate) struct CancelOnDrop {
    armed: Option<Armed>,
}

struct Armed {
    winding: Arc<WindingDown>,
    actor: ActorId,
    control: Arc<DrainControl>,
    state: Arc<Mutex<CallState>>,
}

impl CancelOnDrop {
    /// The drain returned normally.
    pub(crate) fn disarm(mut self) {
        self.armed = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(Armed {
            winding,
            actor,
            control,
            state,
        }) = self.armed.take()
        else {
            return;
        };
        control.request_cancel();
        // Both locks in the same order as CallDone::drop: counts, then the call's state.
        let mut counts = winding.lock();
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        if !state.finished {
            state.counted = true;
            *counts.entry(actor).or_insert(0) += 1;
        }
    }
}

/// Moved into the blocking call; dropped when it returns (or when the runtime drops it
/// unrun), which ends the winding down it may have been counted for.
pub(crate) struct CallDone {
    winding: Arc<WindingDown>,
    actor: ActorId,
    state: Arc<Mutex<CallState>>,
}

impl Drop for CallDone {
    fn drop(&mut self) {
        let mut counts = self.winding.lock();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.finished = true;
        if state.counted {
            if let Some(n) = counts.get_mut(&self.actor) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(&self.actor);
                }
            }
            drop(state);
            drop(counts);
            self.winding.done.notify_waiters();
        }
    }
}
