//! A std-only HTTP service embedding the blocking runtime: no async runtime anywhere.
//!
//! `POST /notes` writes a note and enqueues its activity to every follower in the **same
//! SQLite transaction** (the transactional outbox), on the service's own connection to the
//! outbox's file; the monitor thread, woken after the commit, delivers it — per follower in
//! order, at least once. `GET /status` shows the outbox.
//!
//! ```text
//! POST /notes {"id": "n1", "text": "hi", "followers": ["http://…/inbox"]}
//!   201 {"id":"n1","units":1}     written and enqueued
//!   409 {"error":…}               the note exists: nothing written, nothing enqueued
//!   422 {"error":…}               bad JSON or a follower URL refused: nothing written
//! GET /status
//!   200 [{"actor":"…","pending":…,"dead_letters":…}]
//! ```
//!
//! Run: `cargo run --example blocking_server -- [DB] [ADDR]` (default
//! `./blocking-outbox.db` and `127.0.0.1:3001`). Loopback and private destinations are refused
//! by the SSRF guard unless `ALLOW_LOOPBACK=1`. Its test starts it on `127.0.0.1:0`.

use std::error::Error;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use outbox_lanes::blocking::{Monitor, Outbox, OutboxConfig};
use outbox_lanes::core::ActorId;
// rusqlite as the facade re-exports it: the store's version, no dependency of its own.
use outbox_lanes::rusqlite::{self, Connection, TransactionBehavior};
use outbox_lanes::store::{EnqueueError, NewRow, SqliteOptions, SqliteStore, Store};
use serde_json::{Value, json};

const ACTOR: &str = "https://notes.example/actor";
const MAX_BODY: usize = 1 << 20;

/// What every request handler shares.
#[derive(Clone)]
struct App {
    store: Arc<SqliteStore>,
    /// The service's own connection to the outbox's file, for its notes.
    db: Arc<Mutex<Connection>>,
    outbox: Outbox,
    actor: ActorId,
}

/// A service listening on a loopback or public address, with its monitor running.
struct Service {
    addr: SocketAddr,
    _monitor: Monitor,
}

fn start(
    db: &std::path::Path,
    addr: &str,
    allow_loopback: bool,
) -> Result<Service, Box<dyn Error>> {
    let store = Arc::new(SqliteStore::open(db, SqliteOptions::default())?);
    let shared: Arc<dyn Store> = store.clone();
    let mut config = OutboxConfig::default();
    if allow_loopback {
        config = config.allow_loopback();
    }
    let outbox = Outbox::open(shared, config)?;
    let actor = outbox.resolve(ACTOR)?;
    let conn = Connection::open(db)?;
    // The store's connections write too: wait for them rather than fail with SQLITE_BUSY.
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, text TEXT NOT NULL)",
    )?;
    let monitor = outbox.monitor()?;
    let listener = TcpListener::bind(addr)?;
    let addr = listener.local_addr()?;
    let app = App {
        store,
        db: Arc::new(Mutex::new(conn)),
        outbox,
        actor,
    };
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let app = app.clone();
            std::thread::spawn(move || {
                if let Err(e) = serve(&app, conn) {
                    eprintln!("connection: {e}");
                }
            });
        }
    });
    Ok(Service {
        addr,
        _monitor: monitor,
    })
}

/// One request per connection: enough for a demo, and it keeps the parser small.
fn serve(app: &App, conn: TcpStream) -> Result<(), Box<dyn Error>> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = h.split_once(':') {
            if name.trim().eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(usize::MAX);
            }
        }
    }
    let (status, body) = if length > MAX_BODY {
        (413, json!({"error": "body too large"}))
    } else {
        let mut buf = vec![0; length];
        reader.read_exact(&mut buf)?;
        match (method, path) {
            ("POST", "/notes") => post_note(app, &buf),
            ("GET", "/status") => status(app),
            _ => (404, json!({"error": "not found"})),
        }
    };
    let text = body.to_string();
    let reason = match status {
        200 => "OK",
        201 => "Created",
        404 => "Not Found",
        409 => "Conflict",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        _ => "Internal Server Error",
    };
    let mut out = conn;
    write!(
        out,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    )?;
    Ok(())
}

/// Why a note was not written; every case rolled its transaction back.
#[derive(Debug)]
enum WriteError {
    Sql(rusqlite::Error),
    Enqueue(EnqueueError),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Sql(e) => write!(f, "{e}"),
            WriteError::Enqueue(e) => write!(f, "{e}"),
        }
    }
}

impl From<EnqueueError> for WriteError {
    fn from(e: EnqueueError) -> Self {
        WriteError::Enqueue(e)
    }
}

impl From<rusqlite::Error> for WriteError {
    fn from(e: rusqlite::Error) -> Self {
        WriteError::Sql(e)
    }
}

fn post_note(app: &App, body: &[u8]) -> (u16, Value) {
    let Ok(note) = serde_json::from_slice::<Value>(body) else {
        return (422, json!({"error": "malformed JSON"}));
    };
    let (Some(id), Some(text), Some(followers)) = (
        note["id"].as_str(),
        note["text"].as_str(),
        note["followers"].as_array(),
    ) else {
        return (422, json!({"error": "expected id, text and followers"}));
    };
    let activity = json!({"type": "Create", "actor": ACTOR, "object": {"id": id, "content": text}});
    let row = NewRow::activity(id, &activity)
        .expect("a serde_json::Value always serializes")
        .recipients(followers.iter().filter_map(Value::as_str));
    // The note and its outbox row commit together or not at all; the wake-up is fired
    // after the commit, and the monitor delivers.
    let written = (|| -> Result<usize, WriteError> {
        let mut db = app.db.lock().unwrap_or_else(PoisonError::into_inner);
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute("INSERT INTO notes (id, text) VALUES (?1, ?2)", (id, text))?;
        let (done, wake) = app.store.enqueue_in(&tx, &app.actor, &[row])?;
        tx.commit()?;
        wake.fire();
        Ok(done.iter().map(|e| e.units.len()).sum())
    })();
    match written {
        Ok(units) => (201, json!({"id": id, "units": units})),
        Err(WriteError::Sql(e)) if is_unique_violation(&e) => {
            (409, json!({"error": format!("note {id} exists")}))
        }
        Err(WriteError::Enqueue(e)) => (422, json!({"error": e.to_string()})),
        Err(e) => (500, json!({"error": e.to_string()})),
    }
}

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::ConstraintViolation)
}

fn status(app: &App) -> (u16, Value) {
    match app.outbox.status() {
        Ok(all) => (
            200,
            Value::Array(
                all.iter()
                    .map(|s| {
                        json!({"actor": s.actor.as_str(), "pending": s.pending, "dead_letters": s.dead_letters})
                    })
                    .collect(),
            ),
        ),
        Err(e) => (500, json!({"error": e.to_string()})),
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let db = args.next().unwrap_or_else(|| "blocking-outbox.db".into());
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:3001".into());
    let allow = std::env::var("ALLOW_LOOPBACK").is_ok_and(|v| v == "1");
    let service = start(std::path::Path::new(&db), &addr, allow)?;
    println!(
        "listening on http://{} (outbox in {db}); Ctrl-C to stop",
        service.addr
    );
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_lanes_test_support::Recipient;

    fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut s = TcpStream::connect(addr).expect("connect");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        let status = out
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("status");
        let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        (status, body)
    }

    #[test]
    fn a_note_is_written_and_delivered_and_a_failed_write_enqueues_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let follower = Recipient::start().expect("recipient");
        let service = start(&dir.path().join("o.db"), "127.0.0.1:0", true).expect("start");
        let inbox = follower.url("/inbox");
        let note = json!({"id": "n1", "text": "hello", "followers": [inbox]}).to_string();
        let (code, body) = request(service.addr, "POST", "/notes", &note);
        assert_eq!((code, body.as_str()), (201, r#"{"id":"n1","units":1}"#));
        assert!(follower.wait_for("/inbox", 1, Duration::from_secs(20)));
        let got = String::from_utf8(follower.bodies("/inbox").remove(0)).expect("utf-8");
        assert!(got.contains("\"hello\""), "{got}");
        // The same id again: the business write fails, so nothing is enqueued.
        let again = json!({"id": "n1", "text": "twice", "followers": [inbox]}).to_string();
        assert_eq!(request(service.addr, "POST", "/notes", &again).0, 409);
        // A refused follower URL: the note is not written either.
        let bad = json!({"id": "n2", "text": "x", "followers": ["/relative"]}).to_string();
        assert_eq!(request(service.addr, "POST", "/notes", &bad).0, 422);
        let ok = json!({"id": "n2", "text": "second", "followers": [inbox]}).to_string();
        assert_eq!(request(service.addr, "POST", "/notes", &ok).0, 201);
        assert!(follower.wait_for("/inbox", 2, Duration::from_secs(20)));
        // Acks are group-committed: wait (bounded) until the outbox shows nothing pending.
        let mut status = Value::Null;
        for _ in 0..200 {
            let (code, body) = request(service.addr, "GET", "/status", "");
            assert_eq!(code, 200);
            status = serde_json::from_str(&body).expect("json");
            // An actor with nothing pending and no dead letter is not listed at all.
            if status
                .as_array()
                .is_some_and(|a| a.iter().all(|s| s["pending"] == 0))
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            status
                .as_array()
                .is_some_and(|a| a.iter().all(|s| s["pending"] == 0)),
            "{status}"
        );
        // Exactly two activities arrived and nothing is pending: the failed writes enqueued
        // nothing.
        assert_eq!(follower.count("/inbox"), 2);
        assert!(request(service.addr, "GET", "/nope", "").0 == 404);
    }
}
