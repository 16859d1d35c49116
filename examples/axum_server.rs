//! An axum service with a transactional outbox: the POST handler writes a business record
//! and enqueues the outgoing activity in the **same SQLite transaction**, then asks for a
//! drain without waiting for it. Either both are written or neither: a note whose write
//! fails never reaches a follower, and a note that is written always does (at least once,
//! in order per follower), even if the process dies right after the commit — the monitor
//! finds the row on the next start.
//!
//! ```text
//! POST /notes {"id": "n1", "author": "alice", "text": "hi", "followers": ["http://…/inbox"]}
//!   201 {"id": "n1", "units": 1}        written and enqueued
//!   409 {"error": …}                    the note exists: nothing written, nothing enqueued
//!   422 {"error": …}                    a follower URL refused: nothing written
//! ```
//!
//! Run: `cargo run --example axum_server --features tokio -- [DB] [ADDR]` (default
//! `./axum-outbox.db` and `127.0.0.1:3000`). Deliveries to loopback or private addresses are
//! refused by default (the SSRF guard); set `ALLOW_LOOPBACK=1` to try it against a local
//! receiver. Its test (`cargo test --example axum_server --features tokio`) starts it on
//! `127.0.0.1:0` and drives it over HTTP.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use outbox_lanes::core::ActorId;
use outbox_lanes::store::{EnqueueError, NewRow, SqliteOptions, SqliteStore, StoreError};
use outbox_lanes::tokio::{Monitor, Outbox, OutboxConfig};
use serde_json::{Value, json};

/// What the handlers share.
#[derive(Clone)]
struct App {
    store: Arc<SqliteStore>,
    outbox: Outbox,
}

/// Why a POST failed; every variant rolled the transaction back.
#[derive(Debug)]
enum WriteError {
    Store(StoreError),
    Sql(rusqlite::Error),
    Enqueue(EnqueueError),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Store(e) => write!(f, "store: {e}"),
            WriteError::Sql(e) => write!(f, "{e}"),
            WriteError::Enqueue(e) => write!(f, "{e}"),
        }
    }
}

impl From<StoreError> for WriteError {
    fn from(e: StoreError) -> Self {
        WriteError::Store(e)
    }
}

impl From<rusqlite::Error> for WriteError {
    fn from(e: rusqlite::Error) -> Self {
        WriteError::Sql(e)
    }
}

impl App {
    /// Opens the database (the outbox tables and the business table live in one file), the
    /// outbox on the current tokio runtime, and its monitor.
    async fn open(db: &Path, config: OutboxConfig) -> anyhow::Result<(App, Monitor)> {
        let db = db.to_owned();
        // Opening SQLite blocks: keep it off the async workers.
        let store = tokio::task::spawn_blocking(move || -> anyhow::Result<SqliteStore> {
            let store = SqliteStore::open(db, SqliteOptions::default())?;
            store
                .with_transaction(|tx| -> Result<(), WriteError> {
                    tx.execute_batch(
                        "CREATE TABLE IF NOT EXISTS notes (
                         id TEXT PRIMARY KEY,
                         author TEXT NOT NULL,
                         text TEXT NOT NULL CHECK (length(text) > 0)
                     )",
                    )?;
                    Ok(())
                })
                .map_err(|e| anyhow::anyhow!("creating the notes table: {e}"))?;
            Ok(store)
        })
        .await??;
        let store = Arc::new(store);
        let outbox = Outbox::open(store.clone(), config)?;
        let monitor = outbox.monitor().await?;
        Ok((App { store, outbox }, monitor))
    }

    fn router(self) -> Router {
        Router::new()
            .route("/notes", post(create_note))
            .with_state(self)
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
    let row = NewRow {
        id: format!("create-{id}"),
        body: activity.to_string().into_bytes(),
        content_type: "application/activity+json".into(),
        recipients: followers,
        dedup_key: None,
        ordering_key: None,
        joined: false,
        headers: Vec::new(),
    };
    let store = Arc::clone(&app.store);
    let actor = author.clone();
    // rusqlite blocks: the whole transaction runs on the blocking pool.
    let written = tokio::task::spawn_blocking(move || {
        store.with_transaction(|tx| -> Result<usize, WriteError> {
            tx.execute(
                "INSERT INTO notes (id, author, text) VALUES (?1, ?2, ?3)",
                (&id, &actor, &text),
            )?;
            if row.recipients.is_empty() {
                return Ok(0);
            }
            // Inside the caller's transaction; its wake-up is fired by with_transaction after
            // the commit (never before), so the PendingWake is not needed here.
            let (enqueued, _wake) = store
                .enqueue_in(
                    tx,
                    &ActorId::new(actor.as_str()),
                    std::slice::from_ref(&row),
                )
                .map_err(WriteError::Enqueue)?;
            Ok(enqueued.iter().map(|e| e.units.len()).sum())
        })
    })
    .await;
    match written {
        Ok(Ok(units)) => {
            if units > 0 {
                app.outbox.request_drain(&author);
            }
            (
                StatusCode::CREATED,
                Json(json!({"id": body["id"], "units": units})),
            )
        }
        Ok(Err(WriteError::Sql(e)))
            if e.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation) =>
        {
            error(StatusCode::CONFLICT, &format!("note not written: {e}"))
        }
        Ok(Err(WriteError::Enqueue(e))) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("activity refused, note not written: {e}"),
        ),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
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
    let (app, monitor) = App::open(Path::new(&db), config).await?;
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

    fn notes(store: &SqliteStore) -> Vec<String> {
        store
            .with_transaction(|tx| -> Result<Vec<String>, WriteError> {
                let mut q = tx.prepare("SELECT id FROM notes ORDER BY id")?;
                let ids = q
                    .query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<_, _>>()?;
                Ok(ids)
            })
            .expect("notes")
    }

    fn outbox_rows(store: &SqliteStore) -> i64 {
        store
            .with_transaction(|tx| -> Result<i64, WriteError> {
                // Units (a one-recipient row's payload is on its unit) and shared payloads.
                Ok(tx.query_row(
                    "SELECT (SELECT count(*) FROM ol_units) + (SELECT count(*) FROM ol_rows)",
                    [],
                    |r| r.get(0),
                )?)
            })
            .expect("rows")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_post_writes_and_enqueues_in_one_transaction() {
        let dir = tempfile::tempdir().expect("tempdir");
        let follower = Arc::new(Recipient::start().expect("recipient"));
        let inbox = follower.url("/inbox");
        let (app, monitor) = App::open(
            &dir.path().join("app.db"),
            OutboxConfig::default().allow_loopback(),
        )
        .await
        .expect("open");
        let store = Arc::clone(&app.store);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move { axum::serve(listener, app.router()).await });

        // Written and delivered.
        let (status, body) = post_json(
            addr,
            "/notes",
            json!({"id": "n1", "author": "alice", "text": "hello", "followers": [inbox]}),
        )
        .await;
        assert_eq!((status, body["units"].as_u64()), (201, Some(1)), "{body}");
        let f = Arc::clone(&follower);
        let arrived =
            tokio::task::spawn_blocking(move || f.wait_for("/inbox", 1, Duration::from_secs(20)))
                .await
                .expect("join");
        assert!(arrived, "the follower got the activity");
        let got: Value = serde_json::from_slice(&follower.bodies("/inbox")[0]).expect("json");
        assert_eq!(got["object"]["content"], "hello");
        assert_eq!(
            follower.requests("/inbox")[0].header("content-type"),
            Some("application/activity+json")
        );

        // Once its ack is durable the delivered row is gone from the outbox.
        assert!(pending_reaches_zero(&store).await);
        let rows_before = outbox_rows(&store);
        assert_eq!(rows_before, 0);

        // The business write fails (the note exists): no outbox row either.
        let (status, _) = post_json(
            addr,
            "/notes",
            json!({"id": "n1", "author": "alice", "text": "again", "followers": [follower.url("/inbox")]}),
        )
        .await;
        assert_eq!(status, 409);
        assert_eq!(
            outbox_rows(&store),
            rows_before,
            "no outbox row for a failed write"
        );

        // The outbox refuses the activity (a follower that is no URL): no note either.
        let (status, _) = post_json(
            addr,
            "/notes",
            json!({"id": "n2", "author": "alice", "text": "hi", "followers": ["not a url"]}),
        )
        .await;
        assert_eq!(status, 422);
        assert_eq!(notes(&store), ["n1"]);
        assert_eq!(outbox_rows(&store), rows_before);

        // Nothing else reaches the follower, and nothing is left pending.
        assert!(pending_reaches_zero(&store).await);
        assert_eq!(follower.count("/inbox"), 1);

        server.abort();
        monitor.stop().await;
    }

    /// Waits (bounded) until no unit is pending: acks are group-committed just after the
    /// delivery.
    async fn pending_reaches_zero(store: &Arc<SqliteStore>) -> bool {
        for _ in 0..500 {
            let store = Arc::clone(store);
            let pending: u64 = tokio::task::spawn_blocking(move || {
                outbox_lanes::store::Store::status(&*store)
                    .expect("status")
                    .iter()
                    .map(|s| s.pending)
                    .sum()
            })
            .await
            .expect("join");
            if pending == 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }
}
