//! outbox-lanes: per-recipient ordered outbox delivery.
//!
//! A service appends outgoing activities to a persistent outbox; outbox-lanes delivers them
//! over HTTP so that every recipient receives its rows in enqueue order, one in flight per
//! recipient, while distinct recipients proceed concurrently and one slow or dead recipient
//! delays nobody else.
//!
//! # Quick start
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
let row = NewRow {
    id: "https://example.com/activities/1".into(), // used once per actor
    body: br#"{"type":"Create"}"#.to_vec(),
    content_type: "application/activity+json".into(),
    recipients: vec!["https://b.example/inbox".into()], // one lane per recipient
    ..NewRow::default()
};
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
