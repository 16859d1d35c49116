//! Quick start, blocking runtime: std threads and ureq, no async runtime.
#![deny(warnings)]

use std::sync::Arc;
use std::time::Duration;

use outbox_lanes::blocking::{Outbox, OutboxConfig};
use outbox_lanes::store::{NewRow, SqliteOptions, SqliteStore};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(SqliteStore::open("outbox.db", SqliteOptions::default())?);
    let outbox = Outbox::open(store, OutboxConfig::default())?;
    let monitor = outbox.monitor()?; // drains every actor with work, woken on enqueue
    let activity = serde_json::json!({"type": "Create", "object": {"content": "hi"}});
    let row = NewRow::activity("https://example.com/activities/1", &activity)? // once per actor
        .recipients(["https://b.example/inbox"]) // one lane per recipient
        .header("Authorization", "Bearer t0k3n"); // sent with the row
    outbox.enqueue("https://example.com/users/alice", &[row])?; // durable on return
    std::thread::sleep(Duration::from_secs(60)); // your service runs; deliveries go on
    let _ = monitor.stop(); // attempts in flight finish, the rest waits in the store
    Ok(())
}
