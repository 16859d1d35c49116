//! The executor abstraction: a small [`Runtime`] trait with one implementation per executor
//! (quinn's pattern), so the same driver runs on tokio, async-std or smol.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

/// A boxed, sendable future, as the [`Runtime`] trait takes and returns them.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What the outbox needs from an async executor. Object-safe: used as `Arc<dyn Runtime>`.
///
/// Every method may be called from any thread, including threads that are not the
/// executor's own (the pass driver runs on the blocking pool and spawns deliveries from
/// there).
pub trait Runtime: Send + Sync + fmt::Debug + 'static {
    /// Runs `future` to completion in the background.
    fn spawn(&self, future: BoxFuture<()>);

    /// Runs `f` on the executor's pool for blocking work (store calls, the pass loop, the
    /// blocking HTTP client).
    fn spawn_blocking(&self, f: Box<dyn FnOnce() + Send + 'static>);

    /// A future that completes after `duration`.
    fn sleep(&self, duration: Duration) -> BoxFuture<()>;

    /// The executor's clock (tokio's can be paused and advanced in tests).
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// Runs `f` on `rt`'s blocking pool and waits for its value.
///
/// `None` if the runtime dropped the work unrun (it is shutting down) or `f` panicked.
pub(crate) async fn unblock<T, F>(rt: &dyn Runtime, f: F) -> Option<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    rt.spawn_blocking(Box::new(move || {
        let _ = tx.send(f());
    }));
    rx.await.ok()
}

/// tokio: tasks on a runtime [`Handle`](tokio::runtime::Handle), `spawn_blocking`, tokio's timer.
#[cfg(feature = "tokio")]
#[derive(Clone, Debug)]
pub struct TokioRuntime {
    handle: tokio::runtime::Handle,
}

#[cfg(feature = "tokio")]
impl TokioRuntime {
    /// The runtime the caller runs on.
    ///
    /// # Errors
    /// Called outside a tokio runtime.
    pub fn current() -> Result<TokioRuntime, tokio::runtime::TryCurrentError> {
        tokio::runtime::Handle::try_current().map(TokioRuntime::new)
    }

    /// The runtime behind `handle`.
    pub fn new(handle: tokio::runtime::Handle) -> TokioRuntime {
        TokioRuntime { handle }
    }

    /// The runtime's handle.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

#[cfg(feature = "tokio")]
impl Runtime for TokioRuntime {
    fn spawn(&self, future: BoxFuture<()>) {
        drop(self.handle.spawn(future));
    }

    fn spawn_blocking(&self, f: Box<dyn FnOnce() + Send + 'static>) {
        drop(self.handle.spawn_blocking(f));
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<()> {
        // The timer registers with the runtime when first polled, so it must be created
        // inside its context.
        let _guard = self.handle.enter();
        Box::pin(tokio::time::sleep(duration))
    }

    fn now(&self) -> Instant {
        let _guard = self.handle.enter();
        tokio::time::Instant::now().into_std()
    }
}

/// async-std: its global executor and blocking pool.
///
/// async-std is discontinued upstream; its authors point to smol, its successor
/// (`SmolRuntime`, feature `smol`). This is kept for services that still run on it.
#[cfg(feature = "async-std")]
#[derive(Clone, Copy, Debug, Default)]
pub struct AsyncStdRuntime;

#[cfg(feature = "async-std")]
impl Runtime for AsyncStdRuntime {
    fn spawn(&self, future: BoxFuture<()>) {
        drop(async_std::task::spawn(future));
    }

    fn spawn_blocking(&self, f: Box<dyn FnOnce() + Send + 'static>) {
        drop(async_std::task::spawn_blocking(f));
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<()> {
        Box::pin(async_std::task::sleep(duration))
    }
}

/// smol: its global executor (`smol::spawn`) and blocking pool (`smol::unblock`).
#[cfg(feature = "smol")]
#[derive(Clone, Copy, Debug, Default)]
pub struct SmolRuntime;

#[cfg(feature = "smol")]
impl Runtime for SmolRuntime {
    fn spawn(&self, future: BoxFuture<()>) {
        smol::spawn(future).detach();
    }

    fn spawn_blocking(&self, f: Box<dyn FnOnce() + Send + 'static>) {
        smol::spawn(smol::unblock(f)).detach();
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<()> {
        Box::pin(async move {
            smol::Timer::after(duration).await;
        })
    }
}
