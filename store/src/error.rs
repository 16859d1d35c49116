//! The store's error enums.

use core::fmt;

use outbox_lanes_core::policy::url::UrlError;

/// Why a store operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The drain slot token is not the current one, or its lease expired (OL-12). Nothing was
    /// written; the pass must stop.
    StaleToken,
    /// The database stayed locked by another connection past the busy timeout (SQLite), or the
    /// server aborted the transaction to break a deadlock or serialization conflict (Postgres).
    /// Nothing was written; the operation can be retried.
    Busy,
    /// The named thing does not exist (a unit whose payload was asked for, a lane).
    NotFound {
        /// What was looked for.
        what: &'static str,
    },
    /// The database (or its directory) cannot be written.
    ReadOnly {
        /// The database path.
        path: String,
    },
    /// The database could not be opened or connected to.
    Open {
        /// The path or URL (without password) that was opened.
        target: String,
        /// What the database library said.
        reason: String,
    },
    /// The database was written by a newer version of outbox-lanes; it is refused rather than
    /// misread.
    SchemaTooNew {
        /// The schema version found in the database.
        found: u32,
        /// The newest schema version this build understands.
        supported: u32,
    },
    /// The connection to the database was lost and the operation could not be retried safely;
    /// whether it took effect is unknown.
    ConnectionLost(String),
    /// Any other database error.
    Database(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::StaleToken => f.write_str("drain slot token is stale (lease expired or slot taken over)"),
            StoreError::Busy => f.write_str("database is locked by another connection (busy timeout passed); nothing was written"),
            StoreError::NotFound { what } => write!(f, "{what} not found"),
            StoreError::ReadOnly { path } => write!(f, "database {path} is read-only or its directory is not writable"),
            StoreError::Open { target, reason } => write!(f, "cannot open database {target}: {reason}"),
            StoreError::SchemaTooNew { found, supported } => write!(
                f,
                "database schema version {found} is newer than this build supports ({supported}); upgrade outbox-lanes"
            ),
            StoreError::ConnectionLost(e) => write!(f, "database connection lost: {e}"),
            StoreError::Database(e) => write!(f, "database error: {e}"),
        }
    }
}

impl core::error::Error for StoreError {}

/// Why an enqueue was refused. Every variant about a row names it; the whole batch was
/// refused and nothing was written (OL-4).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EnqueueError {
    /// The row names no recipient.
    NoRecipients {
        /// The row id.
        row: String,
    },
    /// A recipient is not an absolute http(s) URL.
    BadRecipient {
        /// The row id.
        row: String,
        /// The recipient as given.
        url: String,
        /// Why it was refused.
        reason: UrlError,
    },
    /// The row id appears twice in the batch, or is already stored for the actor.
    DuplicateRowId {
        /// The row id.
        row: String,
    },
    /// The row id is empty.
    EmptyRowId {
        /// The row's index in the batch.
        index: usize,
    },
    /// The payload is larger than the configured limit.
    PayloadTooLarge {
        /// The row id.
        row: String,
        /// The payload size in bytes.
        size: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The row names more recipients than the configured limit
    /// ([`CommonOptions::max_recipients`](crate::CommonOptions::max_recipients)).
    TooManyRecipients {
        /// The row id.
        row: String,
        /// The recipients it names (before duplicates collapse).
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The content type cannot be sent as an HTTP header value: it holds a control character
    /// (CR, LF, NUL, …) or a byte that is not visible ASCII (spaces and tabs are allowed).
    BadContentType {
        /// The row id.
        row: String,
        /// The content type as given.
        content_type: String,
    },
    /// One of the row's headers cannot be sent: its name is not an HTTP token, its value is
    /// not a valid header value, the name repeats, or the client sets it itself
    /// ([`RESERVED_HEADERS`](crate::RESERVED_HEADERS)).
    BadHeader {
        /// The row id.
        row: String,
        /// The header name as given.
        name: String,
        /// Why it is refused.
        reason: String,
    },
    /// The database failed; nothing was written.
    Store(StoreError),
}

impl fmt::Display for EnqueueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnqueueError::NoRecipients { row } => write!(f, "row {row:?} names no recipient"),
            EnqueueError::BadRecipient { row, url, reason } => {
                write!(f, "row {row:?}: recipient {url:?} refused: {reason}")
            }
            EnqueueError::DuplicateRowId { row } => {
                write!(f, "row id {row:?} is already used by this actor")
            }
            EnqueueError::EmptyRowId { index } => write!(f, "row #{index} has an empty id"),
            EnqueueError::PayloadTooLarge { row, size, max } => {
                write!(
                    f,
                    "row {row:?}: payload of {size} bytes exceeds the limit of {max} bytes"
                )
            }
            EnqueueError::TooManyRecipients { row, count, max } => write!(
                f,
                "row {row:?}: {count} recipients exceed the limit of {max} per row"
            ),
            EnqueueError::BadContentType { row, content_type } => write!(
                f,
                "row {row:?}: content type {content_type:?} is not a valid HTTP header value \
                 (visible ASCII, spaces and tabs only)"
            ),
            EnqueueError::BadHeader { row, name, reason } => {
                write!(f, "row {row:?}: header {name:?} refused: {reason}")
            }
            EnqueueError::Store(e) => write!(f, "enqueue failed, nothing written: {e}"),
        }
    }
}

impl core::error::Error for EnqueueError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            EnqueueError::Store(e) => Some(e),
            _ => None,
        }
    }
}

impl From<StoreError> for EnqueueError {
    fn from(e: StoreError) -> Self {
        EnqueueError::Store(e)
    }
}
