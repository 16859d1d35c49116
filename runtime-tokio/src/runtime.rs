//! The executors: one implementation of the engine's [`Runtime`] trait per executor
//! (quinn's pattern), so the same engine runs on tokio, async-std or smol.

use std::time::Duration;

pub use outbox_lanes_driver::engine::{BoxFuture, Runtime};

/// tokio: tasks on a runtime [`Handle`](tokio::runtime::Handle), `spawn_blocking`, tokio's timer
/// and monotonic clock. The library's long-lived threads (ack writer, host writer, the store's
/// watcher) are std threads ([`Runtime::threads`]' default): on the blocking pool each would
/// hold one of its threads for the outbox's life.
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

    fn clock(&self) -> std::sync::Arc<dyn outbox_lanes_driver::clock::Clock> {
        std::sync::Arc::new(TokioClock(self.handle.clone()))
    }
}

/// tokio's monotonic clock (paused and advanced in tests with `tokio::time::pause`) and the
/// system's wall clock.
#[derive(Debug)]
struct TokioClock(tokio::runtime::Handle);

impl outbox_lanes_driver::clock::Clock for TokioClock {
    fn now(&self) -> outbox_lanes_core::Timestamp {
        outbox_lanes_driver::clock::Clock::now(&outbox_lanes_driver::clock::SystemClock)
    }

    fn instant(&self) -> std::time::Instant {
        let _guard = self.0.enter();
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
