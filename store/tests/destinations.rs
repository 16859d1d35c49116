//! One destination policy per outbox (OL-24), on every backend: enqueue refuses a recipient
//! the stored policy refuses without a lookup, with an error naming the row and how to widen
//! it, and writes nothing; widening is a union that never narrows; an operator's `set` may
//! narrow it and marks that for the next widening; the caller's-transaction entry points
//! refuse alike and leave the caller's transaction usable.
#![allow(missing_docs, clippy::std_instead_of_core, clippy::unwrap_used)]

#[macro_use]
mod common;

use common::*;
use outbox_lanes_core::policy::{AddrClass, AddressPolicy};
use outbox_lanes_store::*;

const A: &str = "https://a.example/inbox";
const LOOPBACK: &str = "http://127.0.0.1:8080/inbox";
const LOCALHOST: &str = "http://localhost:8080/inbox";
const PRIVATE: &str = "http://10.1.2.3/inbox";
const LINK_LOCAL: &str = "http://[fe80::1]/inbox";
const METADATA: &str = "http://169.254.169.254/latest/meta-data/";

contract!(
    a_private_recipient_is_refused_until_the_policy_allows_it,
    widening_is_a_union_and_never_narrows,
    set_may_narrow_and_the_next_widening_says_it_undid_that,
    concurrent_widenings_keep_what_each_added,
);

fn loopback() -> AddressPolicy {
    AddressPolicy::allow_loopback_only()
}

fn private() -> AddressPolicy {
    AddressPolicy {
        allow_loopback: true,
        allow_private: true,
        allow_link_local: false,
    }
}

/// The refusal of `rows` under the stored policy: its row, recipient, class and policy.
fn refusal(
    store: &dyn Store,
    rows: &[NewRow],
) -> (String, String, AddrClass, Option<AddressPolicy>, String) {
    let e = store
        .enqueue(&actor("alice"), rows)
        .expect_err("a refused destination");
    let text = e.to_string();
    match e {
        EnqueueError::DestinationRefused {
            row,
            recipient,
            class,
            policy,
            ..
        } => (row, recipient, class, policy, text),
        other => panic!("not a refused destination: {other:?}"),
    }
}

fn a_private_recipient_is_refused_until_the_policy_allows_it(backend: Backend) {
    run(backend, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        assert_eq!(
            s.destination_policy().unwrap(),
            AddressPolicy::public_only()
        );
        for (to, class) in [
            (LOOPBACK, AddrClass::Loopback),
            (LOCALHOST, AddrClass::Loopback),
            (PRIVATE, AddrClass::Private),
        ] {
            let (row, recipient, c, policy, text) =
                refusal(s, &[row("ok", &[A]), row("private", &[A, to])]);
            assert_eq!(
                (row.as_str(), recipient.as_str(), c),
                ("private", to, class)
            );
            assert_eq!(policy, Some(AddressPolicy::public_only()));
            // The message names both ways to widen it: the library's and the binary's.
            for named in [
                "destination policy (public)",
                "OutboxConfig::allow_",
                "--allow-private-destinations",
                "outbox-lanes destinations set",
            ] {
                assert!(text.contains(named), "{named:?} in {text}");
            }
        }
        // Nothing was written: no actor, no lane, no seq taken.
        assert!(s.status().unwrap().is_empty());
        assert!(s.lanes(&a).unwrap().is_empty());
        // What no policy allows is refused without reading it, the same on every store.
        let (_, _, class, policy, text) = refusal(s, &[row("m", &[METADATA])]);
        assert_eq!((class, policy), (AddrClass::CloudMetadata, None));
        assert!(text.contains("always refuses"), "{text}");

        let change = s.widen_destination_policy(loopback()).unwrap();
        assert_eq!(
            change,
            PolicyChange {
                before: AddressPolicy::public_only(),
                after: loopback(),
                undid_narrowing: false,
            }
        );
        let done = s
            .enqueue(&a, &[row("r1", &[A]), row("r2", &[LOOPBACK, LOCALHOST])])
            .expect("loopback allowed now");
        assert_eq!(done[0].seq.0, 1, "the refused batches took no seq");
        let (_, _, class, policy, text) = refusal(s, &[row("r3", &[PRIVATE])]);
        assert_eq!((class, policy), (AddrClass::Private, Some(loopback())));
        assert!(text.contains("(loopback)"), "{text}");

        s.widen_destination_policy(private()).unwrap();
        s.enqueue(&a, &[row("r3", &[PRIVATE])])
            .expect("private allowed now");
        let (_, _, class, _, text) = refusal(s, &[row("r4", &[LINK_LOCAL])]);
        assert_eq!(class, AddrClass::LinkLocal);
        assert!(text.contains("allow_link_local"), "{text}");
        s.widen_destination_policy(AddressPolicy {
            allow_link_local: true,
            ..AddressPolicy::public_only()
        })
        .unwrap();
        s.enqueue(&a, &[row("r4", &[LINK_LOCAL])])
            .expect("link-local allowed now");
        let (_, _, class, policy, _) = refusal(s, &[row("r5", &[METADATA])]);
        assert_eq!((class, policy), (AddrClass::CloudMetadata, None));
        let t = acquire(s, &a, "t", LEASE);
        assert_eq!(
            row_ids(&claim_lane(s, &t, lane_of(s, &a, LOOPBACK), 0, 10)),
            ["r2"]
        );
    });
}

fn widening_is_a_union_and_never_narrows(backend: Backend) {
    run(backend, CommonOptions::default(), |h| {
        let s = &*h.store;
        let only_private = AddressPolicy {
            allow_private: true,
            ..AddressPolicy::public_only()
        };
        s.widen_destination_policy(loopback()).unwrap();
        let asked_less = s
            .widen_destination_policy(AddressPolicy::public_only())
            .unwrap();
        assert!(!asked_less.changed(), "{asked_less:?}");
        assert_eq!(asked_less.after, loopback());
        let union = s.widen_destination_policy(only_private).unwrap();
        assert_eq!((union.before, union.after), (loopback(), private()));
        assert!(!union.undid_narrowing);
        // Another store on the database reads what this one stored.
        let other = h.second();
        assert_eq!(other.destination_policy().unwrap(), private());
        assert!(
            !other
                .widen_destination_policy(loopback())
                .unwrap()
                .changed()
        );
        assert_eq!(s.destination_policy().unwrap(), private());
    });
}

fn set_may_narrow_and_the_next_widening_says_it_undid_that(backend: Backend) {
    run(backend, CommonOptions::default(), |h| {
        let s = &*h.store;
        let a = actor("alice");
        s.widen_destination_policy(private()).unwrap();
        s.enqueue(&a, &[row("before", &[LOOPBACK])]).unwrap();
        let narrowed = s
            .set_destination_policy(AddressPolicy::public_only())
            .unwrap();
        assert_eq!(
            (narrowed.before, narrowed.after),
            (private(), AddressPolicy::public_only())
        );
        assert_eq!(
            s.destination_policy().unwrap(),
            AddressPolicy::public_only()
        );
        // The unit admitted before stays (delivery dead-letters it); new ones are refused.
        assert_eq!(s.lanes(&a).unwrap()[0].depth, 1);
        refusal(s, &[row("after", &[LOOPBACK])]);
        // A process still asking for more widens it again, and is told it undid a narrowing
        // (once: the mark goes with it).
        let again = s.widen_destination_policy(loopback()).unwrap();
        assert!(again.changed() && again.undid_narrowing, "{again:?}");
        let more = s.widen_destination_policy(private()).unwrap();
        assert!(more.changed() && !more.undid_narrowing, "{more:?}");
        // An operator's set that widens leaves no mark.
        s.set_destination_policy(AddressPolicy::public_only())
            .unwrap();
        let widened = s.set_destination_policy(loopback()).unwrap();
        assert_eq!(widened.after, loopback());
        let then = s.widen_destination_policy(private()).unwrap();
        assert!(then.changed() && !then.undid_narrowing, "{then:?}");
        // Setting what is stored changes nothing.
        assert!(!s.set_destination_policy(private()).unwrap().changed());
    });
}

fn concurrent_widenings_keep_what_each_added(backend: Backend) {
    run(backend, CommonOptions::default(), |h| {
        let only_private = AddressPolicy {
            allow_private: true,
            ..AddressPolicy::public_only()
        };
        let (one, two) = (h.store.clone(), h.second());
        for round in 0..20 {
            one.set_destination_policy(AddressPolicy::public_only())
                .unwrap();
            let go = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                s.spawn(|| {
                    go.wait();
                    one.widen_destination_policy(loopback()).unwrap();
                });
                s.spawn(|| {
                    go.wait();
                    two.widen_destination_policy(only_private).unwrap();
                });
            });
            assert_eq!(
                one.destination_policy().unwrap(),
                private(),
                "round {round}"
            );
        }
    });
}

/// `SqliteStore::enqueue_in` on a caller's rusqlite transaction (a file) and in
/// `with_transaction` (in memory), `PgStore::enqueue_in` on a caller's `postgres`
/// transaction: refused as `enqueue` refuses, the caller's own write still commits.
#[test]
fn enqueue_in_refuses_as_enqueue_does_sqlite_file() {
    use outbox_lanes_store::sqlite::rusqlite::Connection;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("outbox.db");
    let store = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
    let mut conn = Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE notes (id TEXT)").unwrap();
    let enqueue = |conn: &mut Connection, id: &str| {
        let tx = conn.transaction().unwrap();
        tx.execute("INSERT INTO notes (id) VALUES (?1)", [id])
            .unwrap();
        let r = store.enqueue_in(&tx, actor("alice"), &[row(id, &[LOOPBACK])]);
        tx.commit().unwrap();
        r.map(|(v, wake)| {
            wake.fire();
            v
        })
    };
    let e = enqueue(&mut conn, "n1").expect_err("refused");
    assert!(
        matches!(e, EnqueueError::DestinationRefused { .. }),
        "{e:?}"
    );
    store.widen_destination_policy(loopback()).unwrap();
    enqueue(&mut conn, "n2").expect("allowed now");
    let notes: i64 = conn
        .query_row("SELECT count(*) FROM notes", [], |r| r.get(0))
        .unwrap();
    assert_eq!(notes, 2, "the caller's writes commit either way");
    let a = actor("alice");
    let t = acquire(&store, &a, "t", LEASE);
    let lane = lane_of(&store, &a, LOOPBACK);
    assert_eq!(row_ids(&claim_lane(&store, &t, lane, 0, 10)), ["n2"]);
}

#[test]
fn enqueue_in_refuses_as_enqueue_does_sqlite_memory() {
    let store = SqliteStore::in_memory().unwrap();
    let sql = |e: outbox_lanes_store::sqlite::rusqlite::Error| StoreError::Database(e.to_string());
    let attempt = |id: &str| {
        store.with_transaction(|tx| {
            tx.execute_batch("CREATE TABLE IF NOT EXISTS notes (id TEXT)")
                .map_err(sql)?;
            tx.execute("INSERT INTO notes (id) VALUES (?1)", [id])
                .map_err(sql)?;
            let enqueued = store
                .enqueue_in(tx, actor("alice"), &[row(id, &[LOOPBACK])])
                .map(drop);
            Ok::<_, StoreError>(enqueued)
        })
    };
    let refused = attempt("n1").expect("the caller's transaction commits");
    assert!(
        matches!(refused, Err(EnqueueError::DestinationRefused { .. })),
        "{refused:?}"
    );
    store.widen_destination_policy(loopback()).unwrap();
    attempt("n2").unwrap().expect("allowed now");
    let a = actor("alice");
    let t = acquire(&store, &a, "t", LEASE);
    let lane = lane_of(&store, &a, LOOPBACK);
    assert_eq!(row_ids(&claim_lane(&store, &t, lane, 0, 10)), ["n2"]);
}

#[cfg(feature = "postgres")]
#[test]
fn enqueue_in_refuses_as_enqueue_does_postgres() {
    run(Backend::Postgres, CommonOptions::default(), |h| {
        let (url, schema) = h.pg().unwrap();
        let store = PgStore::connect(
            &url,
            PgOptions {
                schema: schema.clone(),
                ..PgOptions::default()
            },
        )
        .unwrap();
        let mut client = pg_client(&url, &schema);
        client
            .batch_execute("CREATE TABLE notes (id TEXT)")
            .unwrap();
        let mut enqueue = |id: &str| {
            let mut tx = client.transaction().unwrap();
            tx.execute("INSERT INTO notes (id) VALUES ($1)", &[&id])
                .unwrap();
            let r = store.enqueue_in(&mut tx, actor("alice"), &[row(id, &[PRIVATE])]);
            tx.commit().unwrap();
            r.map(|(v, wake)| {
                wake.fire();
                v
            })
        };
        let e = enqueue("n1").expect_err("refused");
        assert!(
            matches!(
                e,
                EnqueueError::DestinationRefused {
                    class: AddrClass::Private,
                    ..
                }
            ),
            "{e:?}"
        );
        h.store.widen_destination_policy(private()).unwrap();
        enqueue("n2").expect("allowed now");
        let notes: i64 = client
            .query_one("SELECT count(*) FROM notes", &[])
            .unwrap()
            .get(0);
        assert_eq!(notes, 2, "the caller's writes commit either way");
        let s = &*h.store;
        let a = actor("alice");
        let t = acquire(s, &a, "t", LEASE);
        assert_eq!(
            row_ids(&claim_lane(s, &t, lane_of(s, &a, PRIVATE), 0, 10)),
            ["n2"]
        );
    });
}
