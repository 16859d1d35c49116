//! Transactional enqueue on Postgres: a note and its outbox rows commit together, or neither.
#![deny(warnings)]

use outbox_lanes::postgres::{Client, NoTls}; // the store's postgres client
use outbox_lanes::store::{NewRow, PgOptions, PgStore};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let url = std::env::var("DATABASE_URL")?; // postgres://user@host/db
    let store = PgStore::connect(&url, PgOptions::default())?; // the schema outbox_lanes
    let mut db = Client::connect(&url, NoTls)?; // the service's own connection
    db.batch_execute("CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, text TEXT)")?;
    let units = post_note(&store, &mut db, "n1", "hello")?;
    println!("note n1 written, {units} unit(s) enqueued");
    Ok(())
}

pub(crate) fn post_note(store: &PgStore, db: &mut Client, id: &str, text: &str) -> Result<usize> {
    let mut tx = db.transaction()?;
    tx.execute("INSERT INTO notes VALUES ($1, $2)", &[&id, &text])?; // your own write
    let schema = &store.options().schema; // enqueue_in finds the outbox on the search path
    tx.batch_execute(&format!("SET LOCAL search_path TO {schema}, public"))?;
    let note = serde_json::json!({"type": "Create", "content": text});
    let row = NewRow::json(format!("https://notes.example/notes/{id}"), &note)?
        .recipient("https://b.example/inbox");
    let (enqueued, wake) = store.enqueue_in(&mut tx, "https://notes.example/actor", &[row])?;
    tx.commit()?; // the NOTIFY to other processes goes with the commit
    wake.fire(); // after the commit, never before: wakes this process's monitor
    Ok(enqueued[0].units.len())
}
