//! `PgStore::connect_async` on a tokio current-thread runtime: the connect runs on a thread of
//! its own, so the one executor thread never blocks (the blocking `PgStore::connect` there
//! would start the client's runtime inside tokio's). A future dropped before it is ready
//! leaves the store to that thread, which closes it. Real Postgres (`OUTBOX_LANES_TEST_PG`).
#![cfg(feature = "postgres")]
#![allow(missing_docs)]

use std::time::Duration;

use ::postgres::{Client, NoTls};
use outbox_lanes_core::ActorId;
use outbox_lanes_store::{NewRow, PgOptions, PgStore, ServiceStore};
use outbox_lanes_test_support::pg_url;

/// A schema of its own, dropped when the test ends, pass or fail.
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
        Schema {
            url: url.to_owned(),
            name: format!("ol_async_{tag}_{}_{nanos}", std::process::id()),
        }
    }

    /// Options naming the schema and an `application_name` no other test uses.
    fn opts(&self) -> PgOptions {
        PgOptions {
            schema: self.name.clone(),
            application_name: self.name.clone(),
            ..PgOptions::default()
        }
    }

    fn count(&self, sql: &str) -> i64 {
        let mut c = Client::connect(&self.url, NoTls).expect("raw client");
        c.query_one(sql, &[&self.name]).expect("count").get(0)
    }

    /// Waits (bounded) until `sql` counts `want`; whether it did.
    fn until(&self, sql: &str, want: i64) -> bool {
        for _ in 0..400 {
            if self.count(sql) == want {
                return true;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        false
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::connect(&self.url, NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
        }
    }
}

const SCHEMAS: &str = "SELECT count(*) FROM information_schema.tables \
    WHERE table_schema = $1 AND table_name = 'ol_meta'";
const SESSIONS: &str = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1";

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn connect_async_works_on_a_current_thread_runtime() {
    let Some(url) = pg_url() else { return };
    let schema = Schema::new(&url, "ok");
    let opts = schema.opts();
    let status = current_thread().block_on(async move {
        let store = PgStore::connect_async(&url, opts)
            .await
            .expect("connect_async");
        // A PgStore is used, and dropped, where blocking is allowed.
        tokio::task::spawn_blocking(move || {
            let row = NewRow::new("r1").recipient("https://b.example/inbox");
            store
                .enqueue(&ActorId::new("alice"), &[row])
                .expect("enqueue");
            store.status().expect("status")
        })
        .await
        .expect("blocking call")
    });
    assert_eq!(status.len(), 1, "{status:?}");
    assert_eq!(status[0].pending, 1);
    assert_eq!(schema.count(SCHEMAS), 1, "the schema was created");
    assert!(
        schema.until(SESSIONS, 0),
        "the store's connections were closed when it was dropped"
    );
}

#[test]
fn connect_async_fails_with_the_connects_error() {
    let Some(url) = pg_url() else { return };
    let opts = PgOptions {
        schema: "not a schema".into(),
        ..PgOptions::default()
    };
    let e = current_thread()
        .block_on(PgStore::connect_async(&url, opts))
        .expect_err("an invalid schema name is refused");
    assert!(e.to_string().contains("schema"), "{e}");
}

/// Dropped after its first poll, the future leaves the store to the connecting thread, which
/// finishes the connect (the schema is made) and then closes the store there: no panic on the
/// executor thread, no connection left open.
#[test]
fn a_dropped_connect_async_closes_the_store_off_the_executor() {
    let Some(url) = pg_url() else { return };
    let schema = Schema::new(&url, "drop");
    let opts = schema.opts();
    current_thread().block_on(async move {
        let connecting = PgStore::connect_async(&url, opts);
        tokio::select! {
            biased;
            early = connecting => {
                // The connect won the race to the first poll: close it where blocking is
                // allowed, as any PgStore.
                let store = early.expect("connect_async");
                tokio::task::spawn_blocking(move || drop(store)).await.expect("drop");
            }
            () = std::future::ready(()) => {}
        }
    });
    assert!(
        schema.until(SCHEMAS, 1),
        "the connecting thread finished the connect"
    );
    assert!(
        schema.until(SESSIONS, 0),
        "the connecting thread closed the store it could not hand over"
    );
}
