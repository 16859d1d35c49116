//! Stores opened at once on a database without an outbox (issue 38, item 7): every opening
//! succeeds, the schema is made once and every store sees the same outbox id. On Postgres the
//! schema itself does not exist yet, so `CREATE SCHEMA` races too; an older schema upgraded
//! by several openers at once is migrated once. Threads released together by a barrier, on
//! a fresh SQLite file or Postgres schema each round; several rounds, because one round only
//! sometimes lands the openers on the race.
//!
//! Real databases (`OUTBOX_LANES_TEST_PG` for Postgres); nothing asserts on a duration.
#![allow(missing_docs, clippy::std_instead_of_core)]

use std::sync::Barrier;

use outbox_lanes_store::*;

/// Stores opened at once in a round.
const OPENERS: usize = 6;
/// Rounds per case.
const ROUNDS: usize = 6;

/// The policy of opener `i`: what `enqueue` and `relay` open with, and what `migrate` does.
fn policy(i: usize) -> SchemaPolicy {
    if i % 2 == 0 {
        SchemaPolicy::Create
    } else {
        SchemaPolicy::Migrate
    }
}

/// Runs `open` for each of [`OPENERS`] policies on threads released at once; the outbox id
/// each store saw, or its error.
fn at_once<S: DriverStore>(
    policies: impl Fn(usize) -> SchemaPolicy + Sync,
    open: impl Fn(SchemaPolicy) -> Result<S, StoreError> + Sync,
) -> Vec<Result<String, StoreError>> {
    let barrier = Barrier::new(OPENERS);
    std::thread::scope(|s| {
        let openers: Vec<_> = (0..OPENERS)
            .map(|i| {
                let (barrier, open, policies) = (&barrier, &open, &policies);
                s.spawn(move || {
                    barrier.wait();
                    open(policies(i)).map(|store| store.outbox_id().to_owned())
                })
            })
            .collect();
        openers
            .into_iter()
            .map(|o| o.join().expect("an opener panicked"))
            .collect()
    })
}

/// Every opener succeeded and saw one outbox id, which it returns.
fn one_outbox(ids: Vec<Result<String, StoreError>>, round: &str) -> String {
    let ids: Vec<String> = ids
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or_else(|e| panic!("{round}: opener {i}: {e}")))
        .collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{round}: {ids:?}");
    ids[0].clone()
}

/// `ol_meta` made once: the outbox id every store saw and the current version.
fn expect_meta(meta: Vec<(String, String)>, id: &str, round: &str) {
    assert_eq!(
        meta,
        [
            ("outbox_id".to_owned(), id.to_owned()),
            ("schema_version".to_owned(), SCHEMA_VERSION.to_string())
        ],
        "{round}"
    );
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_stores_opened_at_once_on_a_new_file_make_one_schema() {
    for i in 0..ROUNDS {
        let round = format!("SQLite round {i}");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("outbox.db");
        let ids = at_once(policy, |schema| {
            SqliteStore::open(
                &path,
                SqliteOptions {
                    common: CommonOptions {
                        schema,
                        ..CommonOptions::default()
                    },
                    ..SqliteOptions::default()
                },
            )
        });
        let id = one_outbox(ids, &round);
        let c = rusqlite::Connection::open(&path).expect("open");
        let meta = c
            .prepare("SELECT key, value FROM ol_meta ORDER BY key")
            .and_then(|mut st| {
                st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<Vec<_>, _>>()
            })
            .expect("ol_meta");
        expect_meta(meta, &id, &round);
    }
}

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use ::postgres::{Client, NoTls};

    /// A schema name nobody uses, dropped (if it was made) when the test ends, pass or fail.
    struct Schema {
        url: String,
        name: String,
    }

    impl Schema {
        fn new(url: &str, tag: &str) -> Schema {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let s = Schema {
                url: url.to_owned(),
                name: format!("ol_race_{tag}_{}_{nanos}", std::process::id()),
            };
            s.client()
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", s.name))
                .expect("drop");
            s
        }

        fn client(&self) -> Client {
            Client::connect(&self.url, NoTls).expect("raw client")
        }

        fn open(&self, schema: SchemaPolicy) -> Result<PgStore, StoreError> {
            PgStore::connect(
                &self.url,
                PgOptions {
                    schema: self.name.clone(),
                    common: CommonOptions {
                        schema,
                        ..CommonOptions::default()
                    },
                    ..PgOptions::default()
                },
            )
        }

        fn meta(&self) -> Vec<(String, String)> {
            self.client()
                .query(
                    &format!("SELECT key, value FROM {}.ol_meta ORDER BY key", self.name),
                    &[],
                )
                .expect("ol_meta")
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect()
        }
    }

    impl Drop for Schema {
        fn drop(&mut self) {
            if let Ok(mut c) = Client::connect(&self.url, NoTls) {
                let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
            }
        }
    }

    #[test]
    fn postgres_stores_opened_at_once_on_a_new_schema_make_one_schema() {
        let Some(url) = outbox_lanes_test_support::pg_url() else {
            return;
        };
        for i in 0..ROUNDS {
            let round = format!("Postgres round {i}");
            let schema = Schema::new(&url, &format!("new{i}"));
            let id = one_outbox(at_once(policy, |p| schema.open(p)), &round);
            expect_meta(schema.meta(), &id, &round);
        }
    }

    /// A schema at version 6 (the current one without `ol_lanes.failing_since` and
    /// `unavailable_since`, version 7's one change, nor version 8's delivery log and in-flight
    /// columns), upgraded by several `migrate`s at once:
    /// each succeeds and it is migrated once.
    #[test]
    fn postgres_stores_migrating_at_once_migrate_once() {
        let Some(url) = outbox_lanes_test_support::pg_url() else {
            return;
        };
        for i in 0..ROUNDS {
            let round = format!("Postgres upgrade round {i}");
            let schema = Schema::new(&url, &format!("up{i}"));
            let made = schema.open(SchemaPolicy::Create).expect("create");
            let id = made.outbox_id().to_owned();
            drop(made);
            schema
                .client()
                .batch_execute(&format!(
                    "SET search_path TO {}; ALTER TABLE ol_lanes DROP COLUMN failing_since, \
                     DROP COLUMN unavailable_since, DROP COLUMN in_flight_since, \
                     DROP COLUMN in_flight_unit; DROP TABLE ol_delivery_log; \
                     UPDATE ol_meta SET value = '6' WHERE key = 'schema_version'",
                    schema.name
                ))
                .expect("back to version 6");
            let ids = at_once(|_| SchemaPolicy::Migrate, |p| schema.open(p));
            assert_eq!(one_outbox(ids, &round), id, "{round}");
            expect_meta(schema.meta(), &id, &round);
            let failing: i64 = schema
                .client()
                .query_one(
                    &format!(
                        "SELECT count(*) FROM {}.ol_lanes WHERE failing_since IS NOT NULL \
                         OR unavailable_since IS NOT NULL",
                        schema.name
                    ),
                    &[],
                )
                .expect("the new columns")
                .get(0);
            assert_eq!(failing, 0, "{round}");
        }
    }
}
