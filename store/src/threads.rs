//! Who starts the library's long-lived threads: a store's watcher, and above the store the
//! driver's ack writer and host writer. The runtime an outbox runs on owns them (the driver's
//! `Runtime::threads`); the store sits below the driver and knows no runtime, so it takes the
//! runtime's spawner as this small trait ([`DriverStore::use_threads`](crate::DriverStore::use_threads)).

use std::fmt;
use std::io;
use std::thread::JoinHandle;

/// Starts a dedicated thread that runs for a long time (a watcher, a writer): one that would
/// hold a place of a blocking pool for the life of the outbox.
///
/// A runtime implements it to own every thread the library starts: to name them its way,
/// count them, or run them where it wants. [`StdThreads`] is the system's.
pub trait SpawnThread: Send + Sync + fmt::Debug {
    /// Starts `f` on a new thread named `name`; its handle joins it.
    ///
    /// # Errors
    /// The thread could not be started.
    fn spawn_thread(
        &self,
        name: &str,
        f: Box<dyn FnOnce() + Send + 'static>,
    ) -> io::Result<JoinHandle<()>>;
}

/// The system's threads (`std::thread::Builder`): what a store starts its watcher on until an
/// outbox gives it its runtime's, and what a runtime that has no threads of its own hands out.
#[derive(Clone, Copy, Debug, Default)]
pub struct StdThreads;

impl SpawnThread for StdThreads {
    fn spawn_thread(
        &self,
        name: &str,
        f: Box<dyn FnOnce() + Send + 'static>,
    ) -> io::Result<JoinHandle<()>> {
        std::thread::Builder::new().name(name.into()).spawn(f)
    }
}
