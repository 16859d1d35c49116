//! Wake-ups: "something changed in the outbox" (OL-13).
//!
//! A [`Notifier`] is a coalescing generation counter. Enqueues through the store fire it after
//! they commit; the cross-process watcher started by [`DriverStore::watch`](crate::DriverStore::watch)
//! fires it when another process changed the database. Waiters either block
//! ([`Notifier::wait_timeout`]) or register a callback ([`Notifier::subscribe`]) — an async
//! runtime bridges the callback to its own primitive (`tokio::sync::Notify::notify_one`)
//! without this crate depending on one.

use core::time::Duration;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

type Callback = Arc<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct State {
    generation: u64,
    next_sub: u64,
    subs: Vec<(u64, Callback)>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    cond: Condvar,
}

/// A coalescing wake-up shared by a store and its waiters. Cheap to clone.
#[derive(Clone, Default)]
pub struct Notifier {
    inner: Arc<Inner>,
}

impl core::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Notifier")
            .field("generation", &self.generation())
            .finish()
    }
}

impl Notifier {
    /// A notifier nobody waits on yet.
    pub fn new() -> Self {
        Notifier::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking subscriber must not disable wake-ups for everyone else.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The current generation: it increases on every notification.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Signals "something changed": wakes every waiter and calls every subscriber.
    pub fn notify(&self) {
        let subs: Vec<Callback> = {
            let mut s = self.lock();
            s.generation = s.generation.wrapping_add(1);
            s.subs.iter().map(|(_, f)| Arc::clone(f)).collect()
        };
        self.inner.cond.notify_all();
        // Called outside the lock so a callback may itself use the notifier.
        for f in subs {
            f();
        }
    }

    /// Blocks until the generation differs from `seen` or `timeout` passes; returns the
    /// generation then. Pass the value of [`Notifier::generation`] read before checking the
    /// store, so a change between the check and the wait is not missed.
    pub fn wait_timeout(&self, seen: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        while s.generation == seen {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            s = self
                .inner
                .cond
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        s.generation
    }

    /// Calls `f` on every notification until the returned [`Subscription`] is dropped.
    /// `f` runs on the notifying thread: keep it short and non-blocking.
    pub fn subscribe(&self, f: impl Fn() + Send + Sync + 'static) -> Subscription {
        let mut s = self.lock();
        let id = s.next_sub;
        s.next_sub += 1;
        s.subs.push((id, Arc::new(f)));
        Subscription {
            notifier: self.clone(),
            id,
        }
    }
}

/// Keeps a [`Notifier::subscribe`] callback registered while alive.
#[must_use = "the callback is unregistered when the subscription is dropped"]
pub struct Subscription {
    notifier: Notifier,
    id: u64,
}

impl core::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .finish()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let id = self.id;
        self.notifier.lock().subs.retain(|(i, _)| *i != id);
    }
}

/// A wake-up owed for an enqueue made inside the caller's transaction. Call
/// [`PendingWake::fire`] after the transaction COMMITS (never before: a woken pass would find
/// nothing). If it is dropped unfired (the transaction rolled back, or the caller forgot), the
/// cross-process watcher or the monitor's safety-net poll still finds committed rows.
#[derive(Debug)]
#[must_use = "fire it after the transaction commits"]
pub struct PendingWake {
    notifier: Notifier,
}

impl PendingWake {
    pub(crate) fn new(notifier: Notifier) -> Self {
        PendingWake { notifier }
    }

    /// Wakes the in-process waiters. Call after commit.
    pub fn fire(self) {
        self.notifier.notify();
    }
}
