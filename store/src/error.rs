//! The store's error enums.
//!
//! A failure that came from the database library keeps that library's error as its
//! [`source()`](core::error::Error::source) (a [`Cause`]), so callers can walk down to the
//! driver's own error (`postgres::Error`, and below it the server's `DbError` with its
//! SQLSTATE); the variant's message already says what the driver said, in one line.

use core::fmt;
use std::sync::Arc;

use outbox_lanes_core::policy::url::UrlError;
use outbox_lanes_core::policy::{AddrClass, AddressPolicy};

/// The database library's error behind a [`StoreError`]: what its `source()` returns.
///
/// Shared (`Arc`) so the error stays `Clone`; two causes are equal when they say the same
/// thing, so errors still compare with `==`. It dereferences to the driver's error, which
/// `downcast_ref` recovers (`postgres::Error`, `rusqlite::Error`).
#[derive(Clone)]
pub struct Cause(Arc<dyn core::error::Error + Send + Sync + 'static>);

impl Cause {
    /// Keeps `e` as a cause.
    pub fn new(e: impl core::error::Error + Send + Sync + 'static) -> Cause {
        Cause(Arc::new(e))
    }
}

impl core::ops::Deref for Cause {
    type Target = dyn core::error::Error + Send + Sync + 'static;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Cause) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

impl Eq for Cause {}

/// Why a store operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The drain slot token is not the current one, or its lease expired (OL-12). Nothing was
    /// written; the pass must stop.
    #[error("drain slot token is stale (lease expired or slot taken over)")]
    StaleToken,
    /// The database stayed locked by another connection past the busy timeout (SQLite), or the
    /// server aborted the transaction to break a deadlock or serialization conflict (Postgres).
    /// Nothing was written; the operation can be retried.
    #[error("database is locked by another connection (busy timeout passed); nothing was written")]
    Busy,
    /// The named thing does not exist (a unit whose payload was asked for, a lane).
    #[error("{what} not found")]
    NotFound {
        /// What was looked for.
        what: &'static str,
    },
    /// The database (or its directory) cannot be written.
    #[error("database {path} is read-only or its directory is not writable")]
    ReadOnly {
        /// The database path.
        path: String,
    },
    /// The database could not be opened or connected to.
    #[error("cannot open database {target}: {reason}")]
    Open {
        /// The path or URL (without password) that was opened.
        target: String,
        /// What the database library (or the server) said, in one line.
        reason: String,
        /// The library's error, when it gave one.
        #[source]
        cause: Option<Cause>,
    },
    /// The database was written by a newer version of outbox-lanes; it is refused rather than
    /// misread.
    #[error(
        "database schema version {found} is newer than this build supports ({supported}); upgrade outbox-lanes"
    )]
    SchemaTooNew {
        /// The schema version found in the database.
        found: u32,
        /// The newest schema version this build understands.
        supported: u32,
    },
    /// The database's schema is older than this build's, and the store was opened without
    /// [`SchemaPolicy::Migrate`](crate::SchemaPolicy::Migrate): nothing was changed.
    #[error(
        "database schema version {found} is older than this build's ({supported}); run `outbox-lanes migrate` (as the schema's owner) to upgrade it"
    )]
    SchemaTooOld {
        /// The schema version found in the database.
        found: u32,
        /// The schema version this build writes.
        supported: u32,
    },
    /// The database has no outbox schema, and the store was opened with
    /// [`SchemaPolicy::Existing`](crate::SchemaPolicy::Existing): nothing was created.
    #[error(
        "no outbox schema in {target}; run `outbox-lanes migrate` (as the schema's owner), or open it once with a store that may create it (SqliteStore::open, PgStore::connect)"
    )]
    NoSchema {
        /// The path, or the Postgres schema, that was looked in.
        target: String,
    },
    /// The connection to the database was lost and the operation could not be retried safely;
    /// whether it took effect is unknown.
    #[error("database connection lost: {reason}")]
    ConnectionLost {
        /// What the database library said, in one line.
        reason: String,
        /// The library's error, when it gave one.
        #[source]
        cause: Option<Cause>,
    },
    /// The database library or server refused the operation.
    #[error("database error: {reason}")]
    Driver {
        /// What the library (or the server: message, SQLSTATE, detail, hint) said, in one line.
        reason: String,
        /// The library's error.
        #[source]
        cause: Cause,
    },
    /// The database file at the path the store opened was removed or replaced by another
    /// file since (SQLite): this process would go on serving the old file, which nobody else
    /// sees, and never the rows enqueued at that path now.
    #[error(
        "database file {path} was {what} since this process opened it; it serves the old file, which no other process sees (restart it to open the file now at that path)"
    )]
    Replaced {
        /// The database path, as opened.
        path: String,
        /// `removed` or `replaced by another file`.
        what: &'static str,
    },
    /// Any other database error (found by outbox-lanes itself, not reported by the library).
    #[error("database error: {0}")]
    Database(String),
}

impl StoreError {
    /// A lost connection, with the library's error as the cause.
    #[cfg(any(feature = "postgres", feature = "sqlx"))]
    pub(crate) fn connection_lost(
        reason: String,
        e: impl core::error::Error + Send + Sync + 'static,
    ) -> StoreError {
        StoreError::ConnectionLost {
            reason,
            cause: Some(Cause::new(e)),
        }
    }

    /// A Postgres server's refusal with SQLSTATE `code`, from either driver: a connection the
    /// server ended or is not taking yet (class 08, `57P01`–`57P03`) is lost; a conflict it
    /// broke (serialization failure, deadlock, lock not available) is [`StoreError::Busy`]:
    /// nothing was written, retry; a read-only server is [`StoreError::ReadOnly`].
    #[cfg(any(feature = "postgres", feature = "sqlx"))]
    pub(crate) fn of_sqlstate(
        code: &str,
        reason: String,
        e: impl core::error::Error + Send + Sync + 'static,
    ) -> StoreError {
        match code {
            _ if code.starts_with("08") => StoreError::connection_lost(reason, e),
            "57P01" | "57P02" | "57P03" => StoreError::connection_lost(reason, e),
            "40001" | "40P01" | "55P03" => StoreError::Busy,
            "25006" => StoreError::ReadOnly {
                path: "(postgres)".into(),
            },
            _ => StoreError::driver(reason, e),
        }
    }

    /// A refusal by the library, with its error as the cause.
    pub(crate) fn driver(
        reason: String,
        e: impl core::error::Error + Send + Sync + 'static,
    ) -> StoreError {
        StoreError::Driver {
            reason,
            cause: Cause::new(e),
        }
    }

    /// The constraint and the detail (Postgres) of a unique-index refusal reported by any
    /// driver, if this is one: how an enqueue names the row id another row has.
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
    pub(crate) fn unique_violation(&self) -> Option<(String, String)> {
        let StoreError::Driver { cause, .. } = self else {
            return None;
        };
        #[cfg(feature = "sqlite")]
        if let Some(rusqlite::Error::SqliteFailure(f, _)) = cause.downcast_ref::<rusqlite::Error>()
        {
            return (f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE)
                .then(|| (String::new(), String::new()));
        }
        #[cfg(feature = "postgres")]
        if let Some(db) = cause
            .downcast_ref::<postgres::Error>()
            .and_then(postgres::Error::as_db_error)
        {
            return (*db.code() == postgres::error::SqlState::UNIQUE_VIOLATION).then(|| {
                (
                    db.constraint().unwrap_or("").to_owned(),
                    db.detail().unwrap_or("").to_owned(),
                )
            });
        }
        #[cfg(feature = "sqlx")]
        if let Some(db) = cause
            .downcast_ref::<::sqlx::Error>()
            .and_then(::sqlx::Error::as_database_error)
        {
            let detail = db
                .try_downcast_ref::<::sqlx::postgres::PgDatabaseError>()
                .and_then(|e| e.detail())
                .unwrap_or("");
            return db
                .is_unique_violation()
                .then(|| (db.constraint().unwrap_or("").to_owned(), detail.to_owned()));
        }
        None
    }

    /// An open failure, with the library's error as the cause.
    pub(crate) fn open(
        target: impl Into<String>,
        reason: String,
        e: impl core::error::Error + Send + Sync + 'static,
    ) -> StoreError {
        StoreError::Open {
            target: target.into(),
            reason,
            cause: Some(Cause::new(e)),
        }
    }
}

/// Why an enqueue was refused. Every variant about a row names it; the whole batch was
/// refused and nothing was written (OL-4).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnqueueError {
    /// The row names no recipient.
    #[error("row {row:?} names no recipient")]
    NoRecipients {
        /// The row id.
        row: String,
    },
    /// A recipient is not an absolute http(s) URL.
    #[error("row {row:?}: recipient {url:?} refused: {reason}")]
    BadRecipient {
        /// The row id.
        row: String,
        /// The recipient as given.
        url: String,
        /// Why it was refused.
        reason: UrlError,
    },
    /// The row id appears twice in the batch, is already stored for the actor, or was
    /// enqueued by the actor within the row-id retention
    /// ([`CommonOptions::row_id_retention`](crate::CommonOptions::row_id_retention)).
    #[error(
        "row id {row:?} is already used by this actor (stored, or enqueued within the row-id retention)"
    )]
    DuplicateRowId {
        /// The row id.
        row: String,
    },
    /// The row id is empty.
    #[error("row #{index} has an empty id")]
    EmptyRowId {
        /// The row's index in the batch.
        index: usize,
    },
    /// The payload is larger than the configured limit.
    #[error("row {row:?}: payload of {size} bytes exceeds the limit of {max} bytes")]
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
    #[error("row {row:?}: {count} recipients exceed the limit of {max} per row")]
    TooManyRecipients {
        /// The row id.
        row: String,
        /// The recipients it names (before duplicates collapse).
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The content type is empty, or cannot be sent as an HTTP header value: it holds a
    /// control character (CR, LF, NUL, …) or a byte that is not visible ASCII (spaces and
    /// tabs are allowed).
    #[error(
        "row {row:?}: content type {content_type:?} is empty or not a valid HTTP header value \
         (visible ASCII, spaces and tabs only)"
    )]
    BadContentType {
        /// The row id.
        row: String,
        /// The content type as given.
        content_type: String,
    },
    /// One of the row's headers cannot be sent ([`validate_headers`](crate::validate_headers)):
    /// its name is not an HTTP token, its value is not a valid header value, the name
    /// repeats, the client, the signer or a hop sets it
    /// ([`RESERVED_HEADERS`](crate::RESERVED_HEADERS)), or the row has too many headers or
    /// too many bytes of them.
    #[error("row {row:?}: header {name:?} refused: {reason}")]
    BadHeader {
        /// The row id.
        row: String,
        /// The header name as given.
        name: String,
        /// Why it is refused.
        reason: String,
    },
    /// A recipient's address is known without a lookup (an IP literal, `localhost`) and the
    /// outbox's destination policy refuses it (OL-24): delivery would dead-letter it
    /// `destination_refused` at its first attempt. The policy is the outbox's, stored in the
    /// database and read by every process; its `hint` says how to widen it (an outbox opened
    /// with `OutboxConfig::allow_loopback()` or `allow_private()`, the binary's
    /// `--allow-private-destinations`, or `outbox-lanes destinations set`), or that nothing
    /// does (cloud metadata, multicast, documentation, reserved space).
    #[error("row {row:?}: recipient {recipient:?} is a {class} address, which {hint}")]
    DestinationRefused {
        /// The row id.
        row: String,
        /// The recipient as given.
        recipient: String,
        /// Its address class.
        class: AddrClass,
        /// The outbox's destination policy that refused it; `None` when no policy allows
        /// the class (it is refused before the policy is read).
        policy: Option<AddressPolicy>,
        /// What refuses it and how to allow it, if anything does.
        hint: String,
    },
    /// The database failed; nothing was written.
    #[error("enqueue failed, nothing written: {0}")]
    Store(#[from] StoreError),
}
