//! The [`Runtime`] trait: what the engine needs from an executor, and what a runtime crate
//! implements (quinn's `Runtime` over quinn-proto, in small). Its own module, below both the
//! engine that drives it and [`OutboxCore`](crate::OutboxCore), which asks it for its clocks
//! and threads when an outbox opens.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use outbox_lanes_store::{SpawnThread, StdThreads};

/// A boxed, sendable future, as the [`Runtime`] trait takes and returns them.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What the engine needs from an executor. Object-safe: used as `Arc<dyn Runtime>`.
///
/// Every method may be called from any thread, including threads that are not the
/// executor's own.
pub trait Runtime: Send + Sync + fmt::Debug + 'static {
    /// Runs `future` to completion in the background.
    fn spawn(&self, future: BoxFuture<()>);

    /// Runs `f` where blocking is allowed (store calls, the blocking HTTP client).
    fn spawn_blocking(&self, f: Box<dyn FnOnce() + Send + 'static>);

    /// A future that completes after `duration`.
    fn sleep(&self, duration: Duration) -> BoxFuture<()>;

    /// The clocks the driver reads through this runtime (the wall clock and the monotonic
    /// one): the system's unless the runtime runs in virtual time. Asked once, when an outbox
    /// opens.
    fn clock(&self) -> Arc<dyn crate::clock::Clock> {
        Arc::new(crate::clock::SystemClock)
    }

    /// Where the library starts its long-lived threads — the ack writer, the origin gate's
    /// writer and pacer, the store's watcher — which would hold a place of the blocking pool
    /// for the life of the outbox: the system's ([`StdThreads`]) unless the runtime starts
    /// threads its own way. Asked once, when an outbox opens; the store is given them too
    /// ([`DriverStore::use_threads`](outbox_lanes_store::DriverStore::use_threads)).
    fn threads(&self) -> Arc<dyn SpawnThread> {
        Arc::new(StdThreads)
    }

    /// Whether a task may run blocking calls in place (each task owns a thread: the
    /// blocking runtime), instead of handing them to [`Runtime::spawn_blocking`].
    fn blocking_in_place(&self) -> bool {
        false
    }
}
