//! Why an `Outbox` operation failed.

use std::fmt;

use outbox_lanes_core::UnknownActor;
use outbox_lanes_store::{EnqueueError, StoreError};

/// Why an `Outbox` operation failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum OutboxError {
    /// The actor id names no known actor.
    UnknownActor(UnknownActor),
    /// The store failed.
    Store(StoreError),
    /// Enqueue refused the batch; nothing was written.
    Enqueue(EnqueueError),
    /// A thread could not be started.
    Spawn(std::io::Error),
    /// The HTTP client could not be built (a bad proxy URL or user agent).
    Http(String),
    /// The outbox is shutting down.
    ShuttingDown,
    /// The drain was cancelled (its caller went away); every unfinished unit was handed
    /// back and the slot released.
    Cancelled,
}

impl fmt::Display for OutboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutboxError::UnknownActor(e) => e.fmt(f),
            OutboxError::Store(e) => write!(f, "store: {e}"),
            OutboxError::Enqueue(e) => write!(f, "enqueue refused: {e}"),
            OutboxError::Spawn(e) => write!(f, "cannot start a thread: {e}"),
            OutboxError::Http(e) => write!(f, "HTTP client: {e}"),
            OutboxError::ShuttingDown => f.write_str("the outbox is shutting down"),
            OutboxError::Cancelled => f.write_str("the drain was cancelled"),
        }
    }
}

impl std::error::Error for OutboxError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OutboxError::Store(e) => Some(e),
            OutboxError::Enqueue(e) => Some(e),
            OutboxError::Spawn(e) => Some(e),
            OutboxError::UnknownActor(_)
            | OutboxError::Http(_)
            | OutboxError::ShuttingDown
            | OutboxError::Cancelled => None,
        }
    }
}

impl From<StoreError> for OutboxError {
    fn from(e: StoreError) -> Self {
        OutboxError::Store(e)
    }
}
