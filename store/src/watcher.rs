//! A store's watcher thread: what wakes this process when another one enqueues.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crate::{SpawnThread, StoreError};

/// A store's watcher thread (SQLite's `data_version` poll, Postgres's `LISTEN`), told to stop
/// and joined when dropped.
pub(crate) struct WatcherThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl WatcherThread {
    /// Starts thread `name` on `threads` (the runtime's, once an outbox gave them), running
    /// `watch` until its stop flag is set.
    pub(crate) fn spawn(
        threads: &dyn SpawnThread,
        name: &str,
        watch: impl FnOnce(&AtomicBool) + Send + 'static,
    ) -> Result<WatcherThread, StoreError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = threads
            .spawn_thread(name, Box::new(move || watch(&flag)))
            .map_err(|e| StoreError::Database(format!("cannot start the watcher thread: {e}")))?;
        Ok(WatcherThread {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for WatcherThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
