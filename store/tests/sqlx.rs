//! The sqlx route (`outbox_lanes_store::sqlx`): a batch enqueued inside a caller's sqlx
//! transaction ends up exactly as `Store::enqueue` leaves it (lanes, seqs, payloads, headers,
//! joined units, dedup skips), on a SQLite file and on Postgres; a rolled-back transaction
//! leaves nothing; a refused batch leaves the caller's transaction usable; a database the store
//! never opened is refused with a clear error. (A private in-memory SQLite database cannot be
//! reached by a second library: the sqlx route is for files and servers.)
#![allow(missing_docs, clippy::std_instead_of_core)]

mod common;

use ::sqlx::{AnyConnection, Connection as _, PgConnection, SqliteConnection};
use common::*;
use outbox_lanes_store::sqlx::SqlxOutbox;
use outbox_lanes_store::*;

const A: &str = "https://a.example/inbox";
const B: &str = "https://B.EXAMPLE:443/inbox";
const C: &str = "https://c.example/inbox";

/// A caller's connection to the database of `h`, whatever the backend.
enum Conn {
    Lite(SqliteConnection),
    Pg(PgConnection),
    /// sqlx's `Any`, to either (it binds no arrays).
    Any(AnyConnection),
}

async fn connect(h: &H) -> Conn {
    connect_as(h, false).await
}

async fn connect_as(h: &H, any: bool) -> Conn {
    if any {
        ::sqlx::any::install_default_drivers();
        let url = match h.sqlite_path() {
            Some(path) => format!("sqlite://{}", path.display()),
            None => h.pg().expect("postgres").0,
        };
        return Conn::Any(AnyConnection::connect(&url).await.expect("any"));
    }
    if let Some(path) = h.sqlite_path() {
        let opts = ::sqlx::sqlite::SqliteConnectOptions::new().filename(path);
        Conn::Lite(SqliteConnection::connect_with(&opts).await.expect("sqlite"))
    } else {
        let (url, _) = h.pg().expect("postgres");
        Conn::Pg(PgConnection::connect(&url).await.expect("postgres"))
    }
}

fn outbox(h: &H) -> SqlxOutbox {
    match h.pg() {
        Some((_, schema)) => SqlxOutbox::new().with_schema(&schema).expect("schema"),
        None => SqlxOutbox::new(),
    }
}

/// Enqueues in a transaction of the caller's, with a business row beside it; commits or
/// rolls back.
async fn enqueue_in_tx(
    h: &H,
    rows: &[NewRow],
    commit: bool,
) -> Result<Vec<Enqueued>, EnqueueError> {
    enqueue_in_tx_as(h, rows, commit, false).await
}

/// [`enqueue_in_tx`], on an `Any` connection if `any`.
async fn enqueue_in_tx_as(
    h: &H,
    rows: &[NewRow],
    commit: bool,
    any: bool,
) -> Result<Vec<Enqueued>, EnqueueError> {
    let ob = outbox(h);
    let a = actor("alice");
    match connect_as(h, any).await {
        Conn::Lite(mut c) => {
            ::sqlx::query("CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY)")
                .execute(&mut c)
                .await
                .expect("notes");
            let mut tx = c.begin().await.expect("begin");
            ::sqlx::query("INSERT INTO notes (id) VALUES ($1)")
                .bind(&rows[0].id)
                .execute(&mut *tx)
                .await
                .expect("note");
            let out = ob.enqueue(&mut *tx, &a, rows).await?;
            if commit {
                tx.commit().await.expect("commit");
            } else {
                tx.rollback().await.expect("rollback");
            }
            Ok(out)
        }
        Conn::Pg(mut c) => {
            let mut tx = c.begin().await.expect("begin");
            let out = ob.enqueue(&mut *tx, &a, rows).await?;
            if commit {
                tx.commit().await.expect("commit");
            } else {
                tx.rollback().await.expect("rollback");
            }
            Ok(out)
        }
        Conn::Any(mut c) => {
            let mut tx = c.begin().await.expect("begin");
            let out = ob.enqueue(&mut *tx, &a, rows).await?;
            if commit {
                tx.commit().await.expect("commit");
            } else {
                tx.rollback().await.expect("rollback");
            }
            Ok(out)
        }
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Everything a relay sees of alice's outbox: per lane (in key order) its depth and its
/// units with their seq, row id, lanes, and payload.
fn snapshot(store: &dyn Store) -> Vec<String> {
    let a = actor("alice");
    let mut lanes = store.lanes(&a).expect("lanes");
    lanes.sort_by(|x, y| x.key.cmp(&y.key));
    let t = acquire(store, &a, "snapshot", LEASE);
    let mut out = Vec::new();
    for l in &lanes {
        out.push(format!("lane {:?} depth {}", l.key, l.depth));
        for unit in claim_lane(store, &t, l.lane, 0, 100).units {
            let p = store.payload(unit.id).expect("payload");
            let mut keys: Vec<String> = unit
                .slots
                .iter()
                .map(|s| s.key.recipient().to_owned())
                .collect();
            keys.sort();
            out.push(format!(
                "  seq {} row {} bytes {} lanes {keys:?} ct {} body {:?} headers {:?}",
                unit.seq.0,
                unit.row_id,
                unit.bytes,
                p.content_type,
                String::from_utf8_lossy(&p.body),
                p.headers
            ));
        }
    }
    let _ = store.release_slot(&t).expect("release");
    out
}

/// Without the units' ids (they come from sequences: equal here, but not the point).
fn shape(v: &[Enqueued]) -> Vec<(String, u64, usize, Vec<String>)> {
    v.iter()
        .map(|e| (e.row_id.clone(), e.seq.0, e.units.len(), e.skipped.clone()))
        .collect()
}

fn batch() -> Vec<NewRow> {
    let mut headers = row("one-with-headers", &[A]);
    headers.headers = vec![
        ("X-Trace".into(), "42".into()),
        ("Authorization".into(), "Bearer t".into()),
    ];
    let mut joined = row("joined", &[A, B, C]);
    joined.joined = true;
    let mut dedup = row("dedup-1", &[A, B]);
    dedup.dedup_key = Some("k".into());
    let mut ordered = row("ordered", &[C]);
    ordered.ordering_key = Some("thread-1".into());
    vec![
        headers,
        row("fan-out", &[A, B, "https://b.example/inbox", C]),
        joined,
        dedup,
        ordered,
    ]
}

fn batch2() -> Vec<NewRow> {
    // The same dedup key: skipped for A and B (still pending there), written for C.
    let mut again = row("dedup-2", &[A, B, C]);
    again.dedup_key = Some("k".into());
    vec![again, row("last", &[B])]
}

fn same_outcome_as_store_enqueue(backend: Backend, any: bool) {
    let (Some(by_store), Some(by_sqlx)) = (
        H::open(backend, CommonOptions::default()),
        H::open(backend, CommonOptions::default()),
    ) else {
        println!("skipped: OUTBOX_LANES_TEST_PG not set");
        return;
    };
    let a = actor("alice");
    let rt = rt();
    let mut expected = Vec::new();
    let mut got = Vec::new();
    for b in [batch(), batch2()] {
        expected.push(shape(
            &by_store.store.enqueue(&a, &b).expect("store enqueue"),
        ));
        got.push(shape(
            &rt.block_on(enqueue_in_tx_as(&by_sqlx, &b, true, any))
                .expect("sqlx enqueue"),
        ));
    }
    assert_eq!(got, expected);
    assert_eq!(got[1][0].3.len(), 2, "dedup skipped A and B: {got:?}");
    let (want, have) = (snapshot(&*by_store.store), snapshot(&*by_sqlx.store));
    assert!(want.len() > 8, "{want:#?}");
    assert_eq!(have, want);
    // What the store writes next follows on from the sqlx rows (seqs, lanes).
    let more = [row("after", &[A])];
    assert_eq!(
        shape(&by_sqlx.store.enqueue(&a, &more).expect("after")),
        shape(&by_store.store.enqueue(&a, &more).expect("after"))
    );
    assert_eq!(snapshot(&*by_sqlx.store), snapshot(&*by_store.store));
}

#[test]
fn same_outcome_as_store_enqueue_sqlite_file() {
    same_outcome_as_store_enqueue(Backend::SqliteFile, false);
}

#[test]
fn same_outcome_as_store_enqueue_postgres() {
    same_outcome_as_store_enqueue(Backend::Postgres, false);
}

/// Through sqlx's `Any`, which binds no arrays: the statement-by-statement enqueue, on both
/// dialects, with the same outcome.
#[test]
fn same_outcome_as_store_enqueue_through_any() {
    same_outcome_as_store_enqueue(Backend::SqliteFile, true);
    same_outcome_as_store_enqueue(Backend::Postgres, true);
}

fn rollback_and_refusals(backend: Backend) {
    run(backend, CommonOptions::default(), |h| {
        let a = actor("alice");
        let rt = rt();
        // Rolled back: nothing, not even the actor's seqs.
        rt.block_on(enqueue_in_tx(h, &[row("r1", &[A, B])], false))
            .expect("enqueue");
        assert!(
            h.store
                .lanes(&a)
                .expect("lanes")
                .iter()
                .all(|l| l.depth == 0)
        );
        assert!(h.store.status().expect("status").is_empty());
        let first = rt
            .block_on(enqueue_in_tx(h, &[row("r1", &[A])], true))
            .expect("enqueue");
        assert_eq!(first[0].seq.0, 1, "the rolled-back batch used no seq");
        // A row id the actor has, inline or shared, refuses the batch.
        h.store
            .enqueue(&a, &[row("shared", &[A, B])])
            .expect("shared");
        for dup in ["r1", "shared"] {
            let e = rt.block_on(enqueue_in_tx(h, &[row("new", &[A]), row(dup, &[C])], true));
            assert_eq!(e, Err(EnqueueError::DuplicateRowId { row: dup.into() }));
        }
        // Refused before any SQL: the store's own validation.
        let e = rt.block_on(enqueue_in_tx(h, &[row("x", &["not a url"])], true));
        assert!(matches!(e, Err(EnqueueError::BadRecipient { .. })), "{e:?}");
        let mut bad = row("x", &[A]);
        bad.headers = vec![("Host".into(), "evil".into())];
        let e = rt.block_on(enqueue_in_tx(h, &[bad], true));
        assert!(matches!(e, Err(EnqueueError::BadHeader { .. })), "{e:?}");
        // A refused batch leaves the caller's transaction usable: its own write commits.
        rt.block_on(async {
            let ob = outbox(h);
            match connect(h).await {
                Conn::Lite(mut c) => {
                    let mut tx = c.begin().await.expect("begin");
                    let e = ob.enqueue(&mut *tx, &a, &[row("r1", &[A])]).await;
                    assert!(matches!(e, Err(EnqueueError::DuplicateRowId { .. })));
                    ob.enqueue(&mut *tx, &a, &[row("r2", &[A])])
                        .await
                        .expect("then r2");
                    tx.commit().await.expect("commit");
                }
                Conn::Pg(mut c) => {
                    let mut tx = c.begin().await.expect("begin");
                    let path = "SELECT current_setting('search_path')";
                    let before: String = ::sqlx::query_scalar(path)
                        .fetch_one(&mut *tx)
                        .await
                        .expect("search_path");
                    let e = ob.enqueue(&mut *tx, &a, &[row("r1", &[A])]).await;
                    assert!(matches!(e, Err(EnqueueError::DuplicateRowId { .. })));
                    ob.enqueue(&mut *tx, &a, &[row("r2", &[A])])
                        .await
                        .expect("then r2");
                    // The enqueue's schema was on the search_path for its statements only.
                    let after: String = ::sqlx::query_scalar(path)
                        .fetch_one(&mut *tx)
                        .await
                        .expect("search_path");
                    assert_eq!(after, before);
                    tx.commit().await.expect("commit");
                }
                Conn::Any(_) => unreachable!("connect gives a driver's own connection"),
            }
        });
        let t = acquire(&*h.store, &a, "t", LEASE);
        let lane = lane_of(&*h.store, &a, A);
        assert_eq!(
            row_ids(&claim_lane(&*h.store, &t, lane, 0, 10)),
            ["r1", "shared", "r2"]
        );
    });
}

#[test]
fn rollback_and_refusals_sqlite_file() {
    rollback_and_refusals(Backend::SqliteFile);
}

#[test]
fn rollback_and_refusals_postgres() {
    rollback_and_refusals(Backend::Postgres);
}

/// `SqlxOutbox::enqueue` refuses a recipient the outbox's destination policy refuses (OL-24)
/// with the stores' error, writes nothing and leaves the caller's transaction as it was;
/// once the policy is widened it enqueues it.
fn destinations_refused_as_the_stores_refuse_them(backend: Backend, any: bool) {
    run(backend, CommonOptions::default(), |h| {
        let a = actor("alice");
        let rt = rt();
        let loopback = "http://127.0.0.1:9/inbox";
        let rows = [row("ok", &[A]), row("lo", &[loopback])];
        let by_store = h
            .store
            .enqueue(&a, &rows)
            .expect_err("refused by the store");
        let by_sqlx = rt
            .block_on(enqueue_in_tx_as(h, &rows, true, any))
            .expect_err("refused through sqlx");
        assert_eq!(by_sqlx, by_store);
        assert!(
            matches!(
                &by_sqlx,
                EnqueueError::DestinationRefused { row, class: outbox_lanes_core::policy::AddrClass::Loopback, .. }
                    if row == "lo"
            ),
            "{by_sqlx:?}"
        );
        for named in [
            "OutboxConfig::allow_loopback()",
            "--allow-private-destinations",
        ] {
            assert!(by_sqlx.to_string().contains(named), "{by_sqlx}");
        }
        assert!(
            h.store.status().expect("status").is_empty(),
            "nothing written"
        );
        h.store
            .widen_destination_policy(
                outbox_lanes_core::policy::AddressPolicy::allow_loopback_only(),
            )
            .expect("widen");
        let done = rt
            .block_on(enqueue_in_tx_as(h, &rows, true, any))
            .expect("allowed now");
        assert_eq!(done[0].seq.0, 1, "the refused batches took no seq");
        let t = acquire(&*h.store, &a, "t", LEASE);
        let lane = lane_of(&*h.store, &a, loopback);
        assert_eq!(row_ids(&claim_lane(&*h.store, &t, lane, 0, 10)), ["lo"]);
    });
}

#[test]
fn destinations_refused_as_the_stores_refuse_them_sqlite_file() {
    destinations_refused_as_the_stores_refuse_them(Backend::SqliteFile, false);
}

#[test]
fn destinations_refused_as_the_stores_refuse_them_postgres() {
    destinations_refused_as_the_stores_refuse_them(Backend::Postgres, false);
}

#[test]
fn destinations_refused_as_the_stores_refuse_them_through_any() {
    destinations_refused_as_the_stores_refuse_them(Backend::SqliteFile, true);
    destinations_refused_as_the_stores_refuse_them(Backend::Postgres, true);
}

/// A database the store never opened, or a Postgres schema that does not exist, is refused
/// with an error saying what to do, and the caller's transaction stays usable.
#[test]
fn a_missing_schema_is_refused_clearly() {
    let rt = rt();
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = ::sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("plain.db"))
        .create_if_missing(true);
    rt.block_on(async {
        let mut c = SqliteConnection::connect_with(&opts).await.expect("sqlite");
        let mut tx = c.begin().await.expect("begin");
        let e = SqlxOutbox::new()
            .enqueue(&mut *tx, &actor("alice"), &[row("r", &[A])])
            .await
            .expect_err("no schema");
        assert!(e.to_string().contains("SqliteStore::open"), "{e}");
        ::sqlx::query("SELECT 1")
            .execute(&mut *tx)
            .await
            .expect("tx still usable");
    });
    let Some(url) = pg_url() else {
        println!("skipped (Postgres part): OUTBOX_LANES_TEST_PG not set");
        return;
    };
    rt.block_on(async {
        let mut c = PgConnection::connect(&url).await.expect("postgres");
        let mut tx = c.begin().await.expect("begin");
        let ob = SqlxOutbox::new()
            .with_schema("ol_no_such_schema")
            .expect("schema");
        let e = ob
            .enqueue(&mut *tx, &actor("alice"), &[row("r", &[A])])
            .await
            .expect_err("no schema");
        assert!(e.to_string().contains("\"ol_no_such_schema\""), "{e}");
        ::sqlx::query("SELECT 1")
            .execute(&mut *tx)
            .await
            .expect("tx still usable");
    });
    assert!(SqlxOutbox::new().with_schema("Bad-Name").is_err());
}

/// The wake-up on Postgres: a relay LISTENing on the store's channel gets it at the commit.
#[test]
fn postgres_wakes_the_relays_at_commit() {
    run(Backend::Postgres, CommonOptions::default(), |h| {
        let n = h.store.watch().expect("watch");
        let rt = rt();
        let seen = n.generation();
        rt.block_on(enqueue_in_tx(h, &[row("r2", &[A])], true))
            .expect("enqueue");
        assert!(
            n.wait_timeout(seen, std::time::Duration::from_secs(20)) > seen,
            "woken by the NOTIFY"
        );
    });
}

/// SQLite held by another writer past the caller's busy timeout: `StoreError::Busy` (nothing
/// written, retry), as the store reports it, and the caller's transaction is still usable.
#[test]
fn a_locked_sqlite_database_is_busy() {
    run(Backend::SqliteFile, CommonOptions::default(), |h| {
        let path = h.sqlite_path().expect("file");
        let holder = outbox_lanes_store::sqlite::rusqlite::Connection::open(&path).expect("holder");
        holder.execute_batch("BEGIN IMMEDIATE").expect("write lock");
        let rt = rt();
        rt.block_on(async {
            let opts = ::sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&path)
                .busy_timeout(std::time::Duration::from_millis(20));
            let mut c = SqliteConnection::connect_with(&opts).await.expect("sqlite");
            let mut tx = c.begin().await.expect("begin");
            let e = SqlxOutbox::new()
                .enqueue(&mut *tx, &actor("alice"), &[row("r", &[A])])
                .await;
            assert_eq!(e, Err(EnqueueError::Store(StoreError::Busy)));
            ::sqlx::query("SELECT 1")
                .execute(&mut *tx)
                .await
                .expect("tx still usable");
        });
        holder.execute_batch("ROLLBACK").expect("release");
        assert!(h.store.status().expect("status").is_empty());
    });
}
