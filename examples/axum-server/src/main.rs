//! An axum service with a transactional outbox on **sqlx**: the POST handler enqueues the
//! outgoing activity and writes the note in the **same sqlx transaction** (SQLite by default,
//! Postgres when given a URL), then asks for a drain without waiting for it. The relay runs in
//! the same process on the same database: on SQLite a `SqliteStore` of the file, on Postgres a
//! `SqlxPgStore` on the service's own sqlx pool (one Postgres client in the process; it takes
//! `sslmode` `disable`, `prefer` or `require`, and names `PgStore::connect` for `verify-ca` /
//! `verify-full`). Either both are written or neither: a note whose write fails never reaches
//! a follower, and a note that is written always does (at least once, in order per follower),
//! even if the process dies right after the commit — the monitor finds the row on the next
//! start.
//!
//! ```text
//! POST /notes {"id": "n1", "author": "alice", "text": "hi", "followers": ["http://…/inbox"]}
//!   201 {"id": "n1", "units": 1}        written and enqueued
//!   409 {"error": …}                    the note exists: nothing written, nothing enqueued
//!   422 {"error": …}                    a follower URL (or the text) refused: nothing written
//! ```
//!
//! Run: `cargo run -p outbox-lanes-example-axum -- [DB] [ADDR]` (default `./axum-outbox.db`
//! and `127.0.0.1:3000`; DB may be a `postgres://` URL). Deliveries to loopback or private
//! addresses are refused by default (the SSRF guard); set `ALLOW_LOOPBACK=1` to try it
//! against a local receiver. Its test (`cargo test -p outbox-lanes-example-axum`) starts it
//! on `127.0.0.1:0` on SQLite and on Postgres and drives it over HTTP.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use outbox_lanes::core::ActorId;
// sqlx as the facade re-exports it (feature `sqlx`): the store's version, no dependency of
// its own.
use outbox_lanes::sqlx;
use outbox_lanes::store::sqlx::{SqlxConnection, SqlxOutbox, SqlxPgOptions, SqlxPgStore};
use outbox_lanes::store::{EnqueueError, NewRow, SqliteOptions, SqliteStore, Store};
use outbox_lanes::tokio::{Monitor, Outbox, OutboxConfig};
use serde_json::{Value, json};
use sqlx::{PgPool, SqlitePool};

/// The service's pool: on Postgres the relay shares it.
#[derive(Clone)]
enum Db {
    Pg(PgPool),
    Sqlite(SqlitePool),
}

/// What the handlers share.
#[derive(Clone)]
struct App {
    db: Db,
    outbox: Outbox,
    enqueue: SqlxOutbox,
}

/// Why a POST failed; every variant rolled the transaction back.
#[derive(Debug)]
enum WriteError {
    Sql(sqlx::Error),
    Enqueue(EnqueueError),
}

impl From<sqlx::Error> for WriteError {
    fn from(e: sqlx::Error) -> Self {
        WriteError::Sql(e)
    }
}

impl From<EnqueueError> for WriteError {
    fn from(e: EnqueueError) -> Self {
        WriteError::Enqueue(e)
    }
}

impl App {
    /// The service's sqlx pool (SQLite file or Postgres URL), the outbox's store on the same
    /// database (on Postgres, on that very pool; it creates the outbox tables), the outbox on
    /// the current tokio runtime and its monitor.
    async fn open(db: &str, config: OutboxConfig) -> anyhow::Result<(App, Monitor)> {
        let (db, store): (Db, Arc<dyn Store>) = if db.starts_with("postgres") {
            let pool = PgPool::connect(db).await?;
            let store = SqlxPgStore::new(pool.clone(), SqlxPgOptions::default()).await?;
            (Db::Pg(pool), Arc::new(store))
        } else {
            let path = db.to_owned();
            let store = tokio::task::spawn_blocking(move || {
                SqliteStore::open(&path, SqliteOptions::default())
            })
            .await??;
            (
                Db::Sqlite(SqlitePool::connect(&format!("sqlite://{db}")).await?),
                Arc::new(store),
            )
        };
        let notes = "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, author TEXT NOT NULL, \
             text TEXT NOT NULL CHECK (length(text) > 0))";
        match &db {
            Db::Pg(p) => sqlx::query(notes).execute(p).await.map(drop)?,
            Db::Sqlite(p) => sqlx::query(notes).execute(p).await.map(drop)?,
        }
        let outbox = Outbox::open(store, config)?;
        let monitor = outbox.monitor().await?;
        let enqueue = SqlxOutbox::new();
        Ok((
            App {
                db,
                outbox,
                enqueue,
            },
            monitor,
        ))
    }

    fn router(self) -> Router {
        Router::new()
            .route("/notes", post(create_note))
            .with_state(self)
    }

    /// The activity and the note in one sqlx transaction.
    async fn write(&self, author: &str, text: &str, row: NewRow) -> Result<usize, WriteError> {
        match &self.db {
            Db::Pg(pool) => self.write_in(pool, author, text, row).await,
            Db::Sqlite(pool) => self.write_in(pool, author, text, row).await,
        }
    }

    /// [`App::write`] on either pool. The note goes last: a note the database refuses rolls
    /// back the enqueued activity too.
    async fn write_in<DB>(
        &self,
        pool: &sqlx::Pool<DB>,
        author: &str,
        text: &str,
        row: NewRow,
    ) -> Result<usize, WriteError>
    where
        DB: sqlx::Database,
        DB::Connection: SqlxConnection,
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
        for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        DB::Arguments: sqlx::IntoArguments<DB>,
    {
        let mut tx = pool.begin().await?;
        let mut units = 0;
        if !row.recipients.is_empty() {
            let actor = ActorId::new(author);
            let enqueued = self
                .enqueue
                .enqueue(&mut *tx, &actor, std::slice::from_ref(&row))
                .await?;
            units = enqueued.iter().map(|e| e.units.len()).sum();
        }
        let id = row.id.trim_start_matches("create-");
        sqlx::query("INSERT INTO notes (id, author, text) VALUES ($1, $2, $3)")
            .bind(id)
            .bind(author)
            .bind(text)
            .execute(&mut *tx)
            .await?;
        // Relays are woken by the commit (Postgres NOTIFY, SQLite data_version).
        tx.commit().await?;
        Ok(units)
    }
}

/// The handler: one transaction for the note and its activity, then a non-waiting drain.
async fn create_note(State(app): State<App>, Json(body): Json<Value>) -> (StatusCode, Json<Value>) {
    let field = |k: &str| body.get(k).and_then(Value::as_str).map(str::to_owned);
    let (Some(id), Some(author), Some(text)) = (field("id"), field("author"), field("text")) else {
        return error(StatusCode::BAD_REQUEST, "id, author and text are required");
    };
    let followers: Vec<String> = body
        .get("followers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let activity = json!({
        "type": "Create",
        "actor": author,
        "object": {"type": "Note", "id": id, "content": text},
    });
    let row = NewRow::activity(format!("create-{id}"), &activity)
        .expect("a serde_json::Value always serializes")
        .recipients(followers);
    match app.write(&author, &text, row).await {
        Ok(units) => {
            if units > 0 {
                app.outbox.request_drain(&author);
            }
            (
                StatusCode::CREATED,
                Json(json!({"id": body["id"], "units": units})),
            )
        }
        Err(WriteError::Sql(sqlx::Error::Database(e))) if e.is_unique_violation() => {
            error(StatusCode::CONFLICT, &format!("note not written: {e}"))
        }
        Err(WriteError::Enqueue(EnqueueError::DuplicateRowId { .. })) => error(
            StatusCode::CONFLICT,
            "note not written: its activity exists",
        ),
        Err(WriteError::Sql(sqlx::Error::Database(e))) if e.is_check_violation() => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("note refused, activity not enqueued: {e}"),
        ),
        Err(WriteError::Enqueue(e @ EnqueueError::Store(_))) => {
            error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string())
        }
        Err(WriteError::Enqueue(e)) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("activity refused, note not written: {e}"),
        ),
        Err(WriteError::Sql(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

fn error(status: StatusCode, message: &str) -> (StatusCode, Json<Value>) {
    (status, Json(json!({ "error": message })))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let db = args.next().unwrap_or_else(|| "axum-outbox.db".into());
    let addr: SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:3000".into())
        .parse()?;
    let mut config = OutboxConfig::default();
    if std::env::var_os("ALLOW_LOOPBACK").is_some() {
        config = config.allow_loopback();
    }
    let (app, monitor) = App::open(&db, config).await?;
    let outbox = app.outbox.clone();
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app.router())
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // Graceful: passes finish what is in flight and hand the rest back.
    monitor.stop().await;
    outbox.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::time::Duration;

    use outbox_lanes_test_support::Recipient;

    use super::*;

    /// One POST over a fresh connection; the status and the body.
    async fn post_json(addr: SocketAddr, path: &'static str, body: Value) -> (u16, Value) {
        tokio::task::spawn_blocking(move || {
            let body = body.to_string();
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            write!(
                s,
                "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .expect("write");
            let mut answer = String::new();
            s.read_to_string(&mut answer).expect("read");
            let status = answer
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .expect("status line");
            let json = answer
                .split_once("\r\n\r\n")
                .and_then(|(_, b)| serde_json::from_str(b).ok())
                .unwrap_or(Value::Null);
            (status, json)
        })
        .await
        .expect("join")
    }

    /// The notes, read through the service's own pool.
    async fn notes(app: &App) -> Vec<String> {
        let sql = "SELECT id FROM notes ORDER BY id";
        match &app.db {
            Db::Pg(p) => sqlx::query_scalar(sql).fetch_all(p).await,
            Db::Sqlite(p) => sqlx::query_scalar(sql).fetch_all(p).await,
        }
        .expect("notes")
    }

    /// Outbox entries: units (a one-recipient row's payload is on its unit) and shared
    /// payloads, in the store's tables (Postgres: schema `outbox_lanes`).
    async fn outbox_rows(app: &App, pg: bool) -> i64 {
        let p = if pg { "outbox_lanes." } else { "" };
        let sql = format!(
            "SELECT (SELECT count(*) FROM {p}ol_units) + (SELECT count(*) FROM {p}ol_rows)"
        );
        match &app.db {
            Db::Pg(p) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                    .fetch_one(p)
                    .await
            }
            Db::Sqlite(p) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                    .fetch_one(p)
                    .await
            }
        }
        .expect("rows")
    }

    /// Through the example's router on 127.0.0.1: the note and its activity commit together
    /// and are delivered in order; a failed write (the note refused after its activity was
    /// enqueued, or the activity refused) leaves neither.
    async fn one_transaction(db: &str, pg: bool) {
        let follower = Arc::new(Recipient::start().expect("recipient"));
        let inbox = follower.url("/inbox");
        let (app, monitor) = App::open(db, OutboxConfig::default().allow_loopback())
            .await
            .expect("open");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(axum::serve(listener, app.clone().router()).into_future());

        // Written and delivered, in order.
        for (id, text) in [("n1", "hello"), ("n2", "again"), ("n3", "and again")] {
            let (status, body) = post_json(
                addr,
                "/notes",
                json!({"id": id, "author": "alice", "text": text, "followers": [inbox]}),
            )
            .await;
            assert_eq!((status, body["units"].as_u64()), (201, Some(1)), "{body}");
        }
        let f = Arc::clone(&follower);
        let arrived =
            tokio::task::spawn_blocking(move || f.wait_for("/inbox", 3, Duration::from_secs(20)))
                .await
                .expect("join");
        assert!(arrived, "the follower got the activities");
        let contents: Vec<Value> = follower
            .bodies("/inbox")
            .iter()
            .map(|b| serde_json::from_slice::<Value>(b).expect("json")["object"]["content"].clone())
            .collect();
        assert_eq!(
            contents,
            [json!("hello"), json!("again"), json!("and again")]
        );
        assert_eq!(
            follower.requests("/inbox")[0].header("content-type"),
            Some("application/activity+json")
        );
        // Once the acks are durable the delivered rows are gone from the outbox.
        assert!(outbox_empties(&app, pg).await);

        // The note exists: refused after its activity was enqueued, which rolls back too.
        let (status, _) = post_json(
            addr,
            "/notes",
            json!({"id": "n1", "author": "alice", "text": "twice", "followers": [inbox]}),
        )
        .await;
        assert_eq!(status, 409);
        assert_eq!(
            outbox_rows(&app, pg).await,
            0,
            "no outbox row for a failed write"
        );
        // The same for an empty text (the notes table's CHECK).
        let (status, _) = post_json(
            addr,
            "/notes",
            json!({"id": "n4", "author": "alice", "text": "", "followers": [inbox]}),
        )
        .await;
        assert_eq!(status, 422);
        assert_eq!(outbox_rows(&app, pg).await, 0);
        // The outbox refuses the activity (a follower that is no URL): no note either.
        let (status, _) = post_json(
            addr,
            "/notes",
            json!({"id": "n5", "author": "alice", "text": "hi", "followers": ["not a url"]}),
        )
        .await;
        assert_eq!(status, 422);
        assert_eq!(notes(&app).await, ["n1", "n2", "n3"]);
        assert_eq!(outbox_rows(&app, pg).await, 0);
        assert_eq!(follower.count("/inbox"), 3);

        server.abort();
        monitor.stop().await;
        app.outbox.shutdown().await;
        match &app.db {
            Db::Pg(p) => p.close().await,
            Db::Sqlite(p) => p.close().await,
        }
        // A SQLite store joins its watcher when dropped: off the async workers.
        tokio::task::spawn_blocking(move || drop(app))
            .await
            .expect("drop");
    }

    /// Waits (bounded) until the outbox holds nothing: acks are group-committed just after
    /// the deliveries.
    async fn outbox_empties(app: &App, pg: bool) -> bool {
        for _ in 0..500 {
            if outbox_rows(app, pg).await == 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_note_and_activity_commit_together() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("app.db");
        one_transaction(db.to_str().expect("utf-8 path"), false).await;
    }

    /// On a database of its own (created and dropped here): the example uses the store's
    /// default schema and a `notes` table.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_note_and_activity_commit_together() {
        let Some(url) = outbox_lanes_test_support::pg_url() else {
            println!("skipped: OUTBOX_LANES_TEST_PG not set");
            return;
        };
        let name = format!("ol_axum_{}", std::process::id());
        let (base, _) = url.rsplit_once('/').expect("a database in the URL");
        let admin = |sql: String| async {
            let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
                .await
                .expect("admin");
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut c)
                .await
                .expect("admin statement");
        };
        admin(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
        admin(format!("CREATE DATABASE {name}")).await;
        one_transaction(&format!("{base}/{name}"), true).await;
        admin(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
    }
}
