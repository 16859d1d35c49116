//! Quick start, blocking runtime: std threads and ureq, no async runtime.
#![deny(warnings)]

use std::{error::Error, sync::Arc, time::Duration};

use outbox_lanes::blocking::{Outbox, OutboxConfig, Stopped};
use outbox_lanes::store::{NewRow, SqliteOptions, SqliteStore};

fn main() -> Result<(), Box<dyn Error>> {
    let config = OutboxConfig::default(); // the test allows loopback, for its recorder
    run("outbox.db", "https://b.example/inbox", config)?;
    Ok(())
}

/// One row to `inbox`, delivered in the background; then the one stop.
pub fn run(db: &str, inbox: &str, config: OutboxConfig) -> Result<Stopped, Box<dyn Error>> {
    let store = Arc::new(SqliteStore::open(db, SqliteOptions::default())?);
    let outbox = Outbox::open(store, config)?;
    let _monitor = outbox.monitor()?; // drains every actor with work, woken on enqueue
    let activity = serde_json::json!({"type": "Create", "object": {"content": "hi"}});
    let row = NewRow::activity("https://example.com/activities/1", &activity)? // once per actor
        .recipients([inbox]) // one lane per recipient
        .header("Authorization", "Bearer t0k3n"); // sent with the row
    outbox.enqueue("https://example.com/users/alice", &[row])?; // durable on return
    for _ in 0..100 {
        // your service runs; deliveries go on in the background
        if outbox.status()?.iter().all(|s| s.pending == 0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(outbox.shutdown()) // the one stop: attempts in flight get the grace, the rest waits
}
