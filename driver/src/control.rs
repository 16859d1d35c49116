//! Stopping or cancelling a running drain from another thread or task, [`Signal`], the list
//! of wake-up callbacks both use, and [`StopRecord`], what an outbox's stop cut.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use outbox_lanes_core::ActorId;

type Waker = Arc<dyn Fn() + Send + Sync>;
type WaitingHook = Arc<dyn Fn(&ActorId, bool) + Send + Sync>;

/// Stops or cancels a running drain from another thread or task.
///
/// Use [`DrainControl::request_stop`] and [`DrainControl::request_cancel`]: they set the
/// flag and wake the pass at once. (Setting the public flags directly works too, but the
/// pass then sees them only at its next event.)
#[derive(Default)]
pub struct DrainControl {
    /// Graceful: nothing new starts, attempts in flight finish, the rest is handed back.
    pub stop: AtomicBool,
    /// At once: everything is handed back and the slot released; attempts in flight are
    /// abandoned.
    pub cancel: AtomicBool,
    /// Return when a pass reaches its time slice with work left (the monitor does, to let
    /// other actors run: OL-13). Otherwise the drain goes on with another pass at once, so
    /// a direct drain returns only when nothing is admissible.
    pub yield_at_slice: AtomicBool,
    /// Other actors wait for a pass (set by the monitor): only then does a yielding drain's
    /// pass stop at its time slice.
    contended: AtomicBool,
    signal: Arc<Signal>,
    waiting: Mutex<Option<WaitingHook>>,
}

impl std::fmt::Debug for DrainControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrainControl")
            .field("stop", &self.stop)
            .field("cancel", &self.cancel)
            .field("yield_at_slice", &self.yield_at_slice)
            .finish_non_exhaustive()
    }
}

impl DrainControl {
    /// A control whose drains yield at the end of a time slice (the monitor's).
    pub fn yielding() -> Self {
        let c = DrainControl::default();
        c.yield_at_slice.store(true, Ordering::SeqCst);
        c
    }

    /// Graceful stop: nothing new starts, attempts in flight finish (within the grace
    /// period), the rest is handed back.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// Cancel at once: everything is handed back and the slot released.
    pub fn request_cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// Tells a yielding drain whether other actors wait for a pass; a pass that is past its
    /// slice is woken to stop when they start to.
    pub fn set_contended(&self, contended: bool) {
        let was = self.contended.swap(contended, Ordering::SeqCst);
        if contended && !was {
            self.wake();
        }
    }

    /// Whether the drain's passes stop at their time slice: a yielding drain's (the
    /// monitor's) while other actors wait for a pass. A direct drain's never do: nobody waits
    /// for its slot in this process, and stopping would only make its lanes wait for its
    /// slowest attempt in flight.
    pub fn slicing(&self) -> bool {
        self.yield_at_slice.load(Ordering::SeqCst) && self.contended.load(Ordering::SeqCst)
    }

    /// Whether a stop was asked.
    pub fn is_stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Whether a cancellation was asked.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// Calls `f` on every later stop or cancel request, until the subscription is dropped.
    pub fn subscribe(&self, f: impl Fn() + Send + Sync + 'static) -> ControlSubscription {
        self.signal.subscribe(f)
    }

    fn wake(&self) {
        self.signal.notify();
    }

    /// Calls `f` whenever a pass of this drain comes to only wait on attempts in flight or
    /// in-pass retries (`true`), or has work again (`false`). A monitor uses it to count
    /// only passes with work against its bound (OL-13,
    /// [`MonitorBook::handle_pass_waiting`](outbox_lanes_core::MonitorBook::handle_pass_waiting)).
    /// Replaces any earlier hook.
    pub fn on_waiting(&self, f: impl Fn(&ActorId, bool) + Send + Sync + 'static) {
        *self.waiting.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(f));
    }

    /// Tells the [`DrainControl::on_waiting`] hook, if any, that `actor`'s pass waits or not.
    pub fn report_waiting(&self, actor: &ActorId, waiting: bool) {
        let hook = self
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(f) = hook {
            f(actor, waiting);
        }
    }
}

/// What the stop of an outbox cut, noted as its passes and monitors end: read by the stop
/// ([`crate::engine::shutdown`]) into its [`Stopped`](crate::engine::Stopped).
#[derive(Debug, Default)]
pub struct StopRecord {
    grace_over: AtomicBool,
    database_lost: AtomicBool,
    interrupted: AtomicU64,
}

impl StopRecord {
    /// A pass of the stopping outbox ended because the shutdown grace ran out with attempts
    /// in flight.
    pub fn note_grace_over(&self) {
        self.grace_over.store(true, Ordering::SeqCst);
    }

    /// A pass of the stopping outbox cut off `n` attempts in flight (recorded as interrupted).
    pub fn note_interrupted(&self, n: u64) {
        self.interrupted.fetch_add(n, Ordering::SeqCst);
    }

    /// The attempts [`StopRecord::note_interrupted`] counted.
    pub fn interrupted(&self) -> u64 {
        self.interrupted.load(Ordering::SeqCst)
    }

    /// Whether [`StopRecord::note_grace_over`] was called.
    pub fn grace_over(&self) -> bool {
        self.grace_over.load(Ordering::SeqCst)
    }

    /// A monitor of the outbox stopped by itself: its database file was removed or replaced.
    pub fn note_database_lost(&self) {
        self.database_lost.store(true, Ordering::SeqCst);
    }

    /// Whether [`StopRecord::note_database_lost`] was called.
    pub fn database_lost(&self) -> bool {
        self.database_lost.load(Ordering::SeqCst)
    }
}

/// Callbacks called on every [`Signal::notify`]: how a thread or a task waiting for
/// something (a stop request, a drain slot released) is woken without polling.
#[derive(Default)]
pub struct Signal {
    wakers: Mutex<Vec<(u64, Waker)>>,
    next: AtomicU64,
}

impl std::fmt::Debug for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signal").finish_non_exhaustive()
    }
}

impl Signal {
    /// Calls `f` on every later [`Signal::notify`], until the subscription is dropped.
    pub fn subscribe(
        self: &Arc<Self>,
        f: impl Fn() + Send + Sync + 'static,
    ) -> ControlSubscription {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        self.lock().push((id, Arc::new(f)));
        ControlSubscription {
            signal: Arc::clone(self),
            id,
        }
    }

    /// Calls every subscribed callback.
    pub fn notify(&self) {
        // Called outside the lock: a waker may subscribe or drop a subscription.
        let wakers: Vec<Waker> = self.lock().iter().map(|(_, w)| Arc::clone(w)).collect();
        for w in wakers {
            w();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Waker)>> {
        self.wakers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Keeps a [`Signal::subscribe`] (or [`DrainControl::subscribe`]) callback registered;
/// dropping it unregisters it.
pub struct ControlSubscription {
    signal: Arc<Signal>,
    id: u64,
}

impl std::fmt::Debug for ControlSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlSubscription")
            .field("id", &self.id)
            .finish()
    }
}

impl Drop for ControlSubscription {
    fn drop(&mut self) {
        self.signal.lock().retain(|(id, _)| *id != self.id);
    }
}
