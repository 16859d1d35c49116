//! An sqlx service: a note and its signed ActivityPub `Create` to three inboxes, in one commit.

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
