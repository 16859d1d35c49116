//! Quick start, smol: passes and deliveries as tasks, ureq on smol's blocking pool (no tokio).
#![deny(warnings)]

use std::{error::Error, sync::Arc, time::Duration};

use outbox_lanes::smol::{Outbox, OutboxConfig, Stopped};
use outbox_lanes::store::{NewRow, SqliteOptions, SqliteStore};

fn main() -> Result<(), Box<dyn Error>> {
    let config = OutboxConfig::default(); // the test allows loopback, for its recorder
    smol::block_on(run("outbox.db", "https://b.example/inbox", config))?;
    Ok(())
}

/// One row to `inbox`, delivered in the background; then the one stop.
pub async fn run(db: &str, inbox: &str, config: OutboxConfig) -> Result<Stopped, Box<dyn Error>> {
    let store = Arc::new(SqliteStore::open(db, SqliteOptions::default())?);
    let outbox = Outbox::open(store, config)?; // on smol, which this runs on
    let _monitor = outbox.monitor().await?; // drains every actor with work, woken on enqueue
    let activity = serde_json::json!({"type": "Create", "object": {"content": "hi"}});
    let row = NewRow::activity("https://example.com/activities/1", &activity)? // once per actor
        .recipients([inbox]) // one lane per recipient
        .header("Authorization", "Bearer t0k3n"); // sent with the row
    outbox
        .enqueue("https://example.com/users/alice", &[row])
        .await?; // durable on return
    for _ in 0..100 {
        // your service runs; deliveries go on in the background
        if outbox.status().await?.iter().all(|s| s.pending == 0) {
            break;
        }
        smol::Timer::after(Duration::from_millis(100)).await;
    }
    Ok(outbox.shutdown().await) // the one stop: attempts in flight get the grace, the rest waits
}
