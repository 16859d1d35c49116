//! Why an `Outbox` operation failed.

use outbox_lanes_core::UnknownActor;
use outbox_lanes_store::{EnqueueError, StoreError};

/// Why an `Outbox` operation failed. The store's and the enqueue's errors are its
/// [`source()`](std::error::Error::source), and chain on down to the database driver's.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The actor id names no known actor.
    #[error("{0}")]
    UnknownActor(UnknownActor),
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// Enqueue refused the batch; nothing was written.
    #[error("enqueue refused: {0}")]
    Enqueue(#[source] EnqueueError),
    /// Opening the outbox could not read its destination policy, or widen it to what the
    /// configuration allows (OL-24): most often a database role that may not write `ol_meta`
    /// (the enqueuer role of `docs/privileges.md`). Nothing was changed.
    #[error(
        "cannot read the outbox's destination policy, or widen it to {wanted} (what this \
         process's HttpConfig::addresses allows: OutboxConfig::allow_loopback or \
         allow_private, --allow-private-destinations): {source}; widen it once as a role that \
         may write ol_meta (`outbox-lanes destinations set`, or a relay started with the \
         setting), or open without asking for more"
    )]
    DestinationPolicy {
        /// The policy the configuration asked for, by name (`loopback+private`).
        wanted: String,
        /// The store's failure.
        #[source]
        source: StoreError,
    },
    /// A thread could not be started.
    #[error("cannot start a thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// The HTTP client could not be built (a bad proxy URL or user agent).
    #[error("HTTP client: {0}")]
    Http(String),
    /// The outbox is shutting down.
    #[error("the outbox is shutting down")]
    ShuttingDown,
    /// The drain was cancelled (its caller went away); every unfinished unit was handed
    /// back and the slot released.
    #[error("the drain was cancelled")]
    Cancelled,
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use outbox_lanes_store::{Cause, StoreError};

    use super::OutboxError;

    #[test]
    fn the_source_chain_reaches_the_drivers_error() {
        let e = OutboxError::from(StoreError::Open {
            target: "db".into(),
            reason: "disk on fire".into(),
            cause: Some(Cause::new(std::io::Error::other("disk on fire"))),
        });
        assert_eq!(
            e.to_string(),
            "store: cannot open database db: disk on fire"
        );
        let store = e.source().expect("the store error");
        assert!(store.is::<StoreError>());
        assert!(store.source().expect("the cause").is::<std::io::Error>());
    }
}
