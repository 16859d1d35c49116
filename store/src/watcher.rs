//! A store's watcher thread: what wakes this process when another one enqueues.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crate::StoreError;

/// A store's watcher thread (SQLite's `data_version` poll, Postgres's `LISTEN`), told to stop
/// and joined when dropped.
pub(crate) struct WatcherThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl WatcherThread {
    /// Starts thread `name` running `watch` until its stop flag is set.
    pub(crate) fn spawn(
        name: &str,
        watch: impl FnOnce(&AtomicBool) + Send + 'static,
    ) -> Result<WatcherThread, StoreError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || watch(&flag))
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
