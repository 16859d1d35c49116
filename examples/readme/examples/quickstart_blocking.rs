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
    let row = NewRow {
        id: "https://example.com/activities/1".into(), // used once per actor
        body: br#"{"type":"Create"}"#.to_vec(),
        content_type: "application/activity+json".into(), // default: application/json
        recipients: vec!["https://b.example/inbox".into()], // one lane per recipient
        headers: vec![("Authorization".into(), "Bearer t0k3n".into())], // sent with the row
        ..NewRow::default()
    };
    outbox.enqueue("https://example.com/users/alice", &[row])?; // durable on return
    std::thread::sleep(Duration::from_secs(60)); // your service runs; deliveries go on
    let _ = monitor.stop(); // attempts in flight finish, the rest waits in the store
    Ok(())
}
