//! Quick start, tokio runtime: passes and deliveries as tasks, hyper.
#![deny(warnings)]

use std::sync::Arc;
use std::time::Duration;

use outbox_lanes::store::{NewRow, SqliteOptions, SqliteStore};
use outbox_lanes::tokio::{Outbox, OutboxConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(SqliteStore::open("outbox.db", SqliteOptions::default())?);
    let outbox = Outbox::open(store, OutboxConfig::default())?; // on the current runtime
    let monitor = outbox.monitor().await?; // drains every actor with work, woken on enqueue
    let activity = serde_json::json!({"type": "Create", "object": {"content": "hi"}});
    let row = NewRow::activity("https://example.com/activities/1", &activity)? // once per actor
        .recipients(["https://b.example/inbox"]) // one lane per recipient
        .header("Authorization", "Bearer t0k3n"); // sent with the row
    outbox
        .enqueue("https://example.com/users/alice", &[row])
        .await?; // durable on return
    tokio::time::sleep(Duration::from_secs(60)).await; // your service runs; deliveries go on
    let _ = monitor.stop().await; // attempts in flight finish, the rest waits in the store
    Ok(())
}
