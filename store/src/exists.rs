//! Whether an outbox exists, found without creating one: for tools that only read (status,
//! listings) and must not leave a new database behind at a mistyped path or schema.

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::path::Path;

    use rusqlite::{Connection, ErrorCode, OpenFlags};

    use crate::{SqliteStore, StoreError};

    impl SqliteStore {
        /// Whether the file at `path` exists and holds an outbox's tables. Creates nothing:
        /// the file is opened without `SQLITE_OPEN_CREATE`, and only if it exists.
        ///
        /// # Errors
        /// [`StoreError::Open`] if the file exists but cannot be read as a database,
        /// [`StoreError::Busy`] if it stayed locked.
        pub fn exists(path: impl AsRef<Path>) -> Result<bool, StoreError> {
            let path = path.as_ref();
            if !path.exists() {
                return Ok(false);
            }
            let shown = path.display().to_string();
            let err = |e: rusqlite::Error| match &e {
                rusqlite::Error::SqliteFailure(f, _)
                    if matches!(f.code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) =>
                {
                    StoreError::Busy
                }
                _ => StoreError::open(shown.clone(), e.to_string(), e),
            };
            let conn = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(err)?;
            conn.busy_timeout(core::time::Duration::from_secs(5))
                .map_err(err)?;
            conn.query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ol_meta')",
                [],
                |r| r.get(0),
            )
            .map_err(err)
        }
    }
}

#[cfg(feature = "postgres")]
mod pg {
    use crate::postgres::{checked_target, parse_url, pg_text};
    use crate::{PgOptions, PgStore, StoreError};

    impl PgStore {
        /// Whether the schema [`PgOptions::schema`] holds an outbox's tables on the database at
        /// `url`. Creates nothing (no schema, no table).
        ///
        /// # Errors
        /// [`StoreError::Open`] if the URL is malformed, the server unreachable or the schema
        /// name invalid; [`StoreError::ConnectionLost`] if the query failed.
        pub fn exists(url: &str, opts: &PgOptions) -> Result<bool, StoreError> {
            let target = checked_target(url, opts)?;
            let (mut config, tls) = parse_url(url, &target, opts)?;
            config.application_name(&opts.application_name);
            config.connect_timeout(opts.connect_timeout);
            let mut client = tls
                .connect(&config)
                .map_err(|e| StoreError::open(target, pg_text(&e), e))?;
            let found: bool = client
                .query_one(
                    "SELECT to_regclass($1) IS NOT NULL",
                    &[&format!("{}.ol_meta", opts.schema)],
                )
                .and_then(|r| r.try_get(0))
                .map_err(|e| StoreError::connection_lost(pg_text(&e), e))?;
            Ok(found)
        }
    }
}
