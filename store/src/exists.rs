//! Whether an outbox exists, found without creating one: for tools that only read (status,
//! listings) and must not leave a new database behind at a mistyped path or schema.

#[cfg(feature = "sqlite")]
mod sqlite {
    use core::sync::atomic::AtomicBool;
    use std::path::Path;

    use crate::sqlite::{open_err, read_only_conn, schema_version};
    use crate::{SqliteStore, StoreError};

    impl SqliteStore {
        /// Whether the file at `path` exists and holds an outbox's tables. Creates nothing:
        /// the file is opened read-only, and only if it exists.
        ///
        /// # Errors
        /// As [`SqliteStore::schema_version`].
        pub fn exists(path: impl AsRef<Path>) -> Result<bool, StoreError> {
            Ok(SqliteStore::schema_version(path)?.is_some())
        }

        /// The schema version of the outbox in the file at `path`: `None` if the file does not
        /// exist or holds no outbox. Opens it read-only and writes nothing, so it needs only
        /// read permission (what `outbox-lanes migrate` shows before it upgrades).
        ///
        /// # Errors
        /// [`StoreError::Open`] if the file exists but cannot be read as a database (with a
        /// hint when SQLite cannot open it), [`StoreError::ReadOnly`] if SQLite calls it
        /// read-only even to a reader, [`StoreError::Busy`] if it stayed locked.
        pub fn schema_version(path: impl AsRef<Path>) -> Result<Option<u32>, StoreError> {
            let path = path.as_ref();
            if !path.exists() {
                return Ok(None);
            }
            let shown = path.display().to_string();
            let err = |e| open_err(&shown, e);
            let conn = read_only_conn(path, &AtomicBool::new(false)).map_err(err)?;
            conn.busy_timeout(core::time::Duration::from_secs(5))
                .map_err(err)?;
            schema_version(&conn)
        }
    }
}

#[cfg(feature = "postgres")]
mod pg {
    use crate::db::Db;
    use crate::pg_schema;
    use crate::postgres::{PgDb, config_of, pg_text};
    use crate::{PgOptions, PgStore, StoreError};

    impl PgStore {
        /// Whether the schema [`PgOptions::schema`] holds an outbox's tables on the database at
        /// `url`. Creates nothing (no schema, no table).
        ///
        /// # Errors
        /// As [`PgStore::schema_version`].
        pub fn exists(url: &str, opts: &PgOptions) -> Result<bool, StoreError> {
            Ok(PgStore::schema_version(url, opts)?.is_some())
        }

        /// The schema version of the outbox in the schema [`PgOptions::schema`] on the database
        /// at `url`: `None` if it holds none. Reads only (`SELECT` on `ol_meta`).
        ///
        /// # Errors
        /// [`StoreError::Open`] if the URL is malformed, the server unreachable or the schema
        /// name invalid; once connected, as any read of the store ([`StoreError::ConnectionLost`],
        /// or [`StoreError::Driver`] for a refusal such as a missing privilege).
        pub fn schema_version(url: &str, opts: &PgOptions) -> Result<Option<u32>, StoreError> {
            let (target, config, tls) = config_of(url, opts)?;
            let mut client = tls
                .connect(&config)
                .map_err(|e| StoreError::open(target, pg_text(&e), e))?;
            let mut db = PgDb::of_client(&mut client);
            db.batch(&format!("SET search_path TO {}", opts.schema))?;
            pg_schema::version(&mut db, &opts.schema)
        }
    }
}
