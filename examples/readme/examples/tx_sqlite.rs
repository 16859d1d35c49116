//! Transactional enqueue on SQLite: a note and its outbox rows commit together, or neither.
#![deny(warnings)]

use outbox_lanes::rusqlite::{Connection, TransactionBehavior}; // the store's rusqlite
use outbox_lanes::store::{NewRow, SqliteOptions, SqliteStore};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let store = SqliteStore::open("app.db", SqliteOptions::default())?; // the outbox's tables
    let mut db = Connection::open("app.db")?; // the service's own connection, same file
    db.execute_batch("CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, text TEXT)")?;
    let units = post_note(&store, &mut db, "n1", "hello")?;
    println!("note n1 written, {units} unit(s) enqueued");
    Ok(())
}

/// Writes a note and enqueues its activity, in one transaction.
pub fn post_note(store: &SqliteStore, db: &mut Connection, id: &str, text: &str) -> Result<usize> {
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute("INSERT INTO notes VALUES (?1, ?2)", (id, text))?; // your own write
    let note = serde_json::json!({"type": "Create", "content": text});
    let row = NewRow::json(format!("https://notes.example/notes/{id}"), &note)?
        .recipient("https://b.example/inbox");
    let (enqueued, wake) = store.enqueue_in(&tx, "https://notes.example/actor", &[row])?;
    tx.commit()?; // an error before this line rolls back both
    wake.fire(); // after the commit, never before: wakes this process's monitor
    Ok(enqueued[0].units.len())
}
