//! outbox-lanes: per-recipient ordered outbox delivery.
//!
//! A service appends outgoing activities to a persistent outbox; outbox-lanes delivers them
//! over HTTP so that every recipient receives its rows in enqueue order, one in flight per
//! recipient, while distinct recipients proceed concurrently and one slow or dead recipient
//! delays nobody else.
//!
//! # Quick start
//!
//! A whole sqlx service on Postgres (features `tokio` and `sqlx`): one transaction writes the
//! service's note and enqueues its ActivityPub `Create`, built from a JSON value and signed
//! with the actor's key, to three inboxes; the relay runs in the same process on the
//! service's own pool. It is `examples/sqlx-activitypub/src/main.rs` in the source (not a
//! doctest here: it needs tokio's `main` macro, which this crate's tests do not build), which
//! CI compiles, runs against Postgres and three recipients, and whose signatures it checks
//! with verifiers we did not write; a test keeps this copy the same text.
//!
#![cfg_attr(
    all(feature = "tokio", feature = "sqlx"),
    doc = r##"```ignore
use outbox_lanes::sqlx::{self, PgPool};
use outbox_lanes::store::{NewRow, sqlx::SqlxOutbox, sqlx::SqlxPgOptions, sqlx::SqlxPgStore};
use outbox_lanes::tokio::{Outbox, OutboxConfig, sign::HttpSignatures};
use serde_json::json;
use std::{env, error::Error, fs, sync::Arc, time::Duration};

const ALICE: &str = "https://notes.example/users/alice";
const NOTE: &str = "https://notes.example/notes/1";

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let pool = PgPool::connect(&env::var("DATABASE_URL")?).await?; // the service's own pool
    let store = Arc::new(SqlxPgStore::new(pool.clone(), SqlxPgOptions::default()).await?);
    let pem = fs::read_to_string(env::var("KEY_FILE")?)?; // alice's private key
    let keys = HttpSignatures::from_pem(ALICE, format!("{ALICE}#main-key"), &pem)?;
    let config = OutboxConfig::default();
    let outbox = Outbox::builder(store, config).signer(keys).open()?; // the relay, on the pool
    let _monitor = outbox.monitor().await?; // delivers in the background, woken by the commit
    let ddl = "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, content TEXT NOT NULL)";
    sqlx::query(ddl).execute(&pool).await?;
    let create = json!({"@context": "https://www.w3.org/ns/activitystreams", "type": "Create",
        "actor": ALICE, "object": {"id": NOTE, "type": "Note", "content": "hello"}});
    let inboxes = env::var("INBOXES")?; // three inbox URLs, comma-separated
    let row = NewRow::activity(format!("{NOTE}/create"), &create)?.recipients(inboxes.split(','));
    let mut tx = pool.begin().await?;
    let insert = sqlx::query("INSERT INTO notes VALUES ($1, 'hello')");
    insert.bind(NOTE).execute(&mut *tx).await?; // the service's own row
    SqlxOutbox::new().enqueue(&mut *tx, ALICE, &[row]).await?; // and its deliveries
    tx.commit().await?; // both, or neither
    for _ in 0..300 {
        if outbox.status().await?.iter().all(|s| s.pending == 0) {
            break; // delivered (a service would go on serving)
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    outbox.shutdown().await; // the one stop: in-flight attempts get the grace
    Ok(())
}
```"##
)]
//!
//! An outbox on a SQLite file, a monitor that delivers in the background, one row to one
//! recipient — with the default features (`sqlite`, `blocking`):
//!
#![cfg_attr(
    all(feature = "blocking", feature = "sqlite"),
    doc = r##"```no_run
use std::sync::Arc;

use outbox_lanes::blocking::{Outbox, OutboxConfig};
use outbox_lanes::store::{NewRow, SqliteOptions, SqliteStore};

# fn main() -> Result<(), Box<dyn std::error::Error>> {
let store = Arc::new(SqliteStore::open("outbox.db", SqliteOptions::default())?);
let outbox = Outbox::open(store, OutboxConfig::default())?;
let _monitor = outbox.monitor()?; // drains every actor with work, woken on enqueue
let row = NewRow::new("https://example.com/activities/1") // used once per actor
    .content_type("application/activity+json")
    .body(br#"{"type":"Create"}"#)
    .recipient("https://b.example/inbox"); // one lane per recipient
outbox.enqueue("https://example.com/users/alice", &[row])?; // durable on return
// ... your service runs; deliveries go on in the background ...
outbox.shutdown(); // the one stop: attempts in flight get the grace, the rest waits in the store
# Ok(())
# }
```"##
)]
//!
//! The same on tokio, smol and async-std (`Outbox::open` and `outbox.shutdown()` alike on
//! each), signing (HTTP Signatures, Standard Webhooks), enqueueing inside your
//! own transaction (rusqlite, postgres, sqlx) and the settings: the library guide
//! (`docs/library-guide.md` in the source) and the runnable programs of
//! `examples/readme/examples/`.
//!
//! This facade re-exports the sans-IO [`core`] and, by feature, a store ([`store`]: `sqlite`,
//! the default, `postgres`, and `sqlx`: the relay's Postgres store on your own sqlx pool) and
//! a runtime ([`blocking`]: the `blocking` feature; [`tokio`](mod@crate::tokio), also named
//! `smol` and `async_std`: the `tokio`, `smol` and `async-std` features).
//!
//! The default features (`sqlite`, `blocking`) are the library's: they bring in no async
//! runtime, no Postgres client and no command-line parser. The `outbox-lanes` binary is its own
//! package, `outbox-lanes-cli`.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use outbox_lanes_core as core;

#[cfg(feature = "blocking")]
pub use outbox_lanes_blocking as blocking;

/// The async runtime on tokio (feature `tokio`): `Outbox::open` inside a tokio runtime opens
/// on it, delivering with hyper-util's client.
#[cfg(any(feature = "tokio", feature = "async-std", feature = "smol"))]
pub use outbox_lanes_tokio as tokio;

/// The async runtime on smol (feature `smol`, no tokio runtime or hyper): the same crate as
/// [`tokio`](mod@crate::tokio); `Outbox::open` called outside a tokio runtime and an
/// async-std task opens on smol's global executor, delivering with ureq on its blocking pool.
#[cfg(feature = "smol")]
pub use outbox_lanes_tokio as smol;

/// The async runtime on async-std (feature `async-std`; discontinued upstream, smol is its
/// successor): the same crate as [`tokio`](mod@crate::tokio); `Outbox::open` inside an
/// async-std task opens on async-std's executor, delivering with ureq on its blocking pool.
#[cfg(feature = "async-std")]
pub use outbox_lanes_tokio as async_std;

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "sqlx"))]
pub use outbox_lanes_store as store;

/// The SQLite driver the store is built on (feature `sqlite`), at the version the store uses:
/// a connection of your own to the store's file, for
/// [`SqliteStore::enqueue_in`](store::SqliteStore::enqueue_in) inside your own transaction.
#[cfg(feature = "sqlite")]
pub use outbox_lanes_store::sqlite::rusqlite;

/// The blocking Postgres client the store is built on (feature `postgres`), at the version the
/// store uses: a transaction of your own for [`PgStore::enqueue_in`](store::PgStore::enqueue_in).
#[cfg(feature = "postgres")]
pub use outbox_lanes_store::postgres::postgres;

/// sqlx as the store uses it (feature `sqlx`): a transaction of your own for
/// [`SqlxOutbox::enqueue`](store::sqlx::SqlxOutbox::enqueue), and the pool of
/// [`SqlxPgStore`](store::sqlx::SqlxPgStore), the relay's store on your own pool.
#[cfg(feature = "sqlx")]
pub use outbox_lanes_store::sqlx::sqlx;
