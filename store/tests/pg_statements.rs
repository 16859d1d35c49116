//! Statements on the delivery path, counted on the wire: the store talks to the real Postgres
//! server through a loopback proxy that reads the frontend protocol (simple `Query`, and
//! `Parse`/`Bind`/`Execute` of prepared statements) and records the SQL of every statement
//! executed. A round's payloads are one statement whatever the number of units, on both
//! Postgres stores (`PgStore`, and `SqlxPgStore` with feature `sqlx`).
#![allow(missing_docs, clippy::unwrap_used, clippy::std_instead_of_core)]
#![cfg(feature = "postgres")]

mod common;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::thread;

use common::*;
use outbox_lanes_core::UnitId;
use outbox_lanes_store::*;
use outbox_lanes_test_support::pg_url_without_tls;

/// SQL texts of the statements executed through the proxy, in order.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// A proxy in front of the Postgres server at `upstream`, on a loopback port of its own.
struct Proxy {
    addr: std::net::SocketAddr,
    log: Log,
}

impl Proxy {
    fn start(upstream: std::net::SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Log::default();
        let l = log.clone();
        // Accepts for the test process's life; each connection ends when either side closes.
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                thread::spawn(move || {
                    let _ = io::copy(&mut &s2, &mut &c2);
                    let _ = c2.shutdown(Shutdown::Both);
                });
                let l = l.clone();
                thread::spawn(move || {
                    let _ = forward(&client, &server, &l);
                    let _ = server.shutdown(Shutdown::Both);
                });
            }
        });
        Proxy { addr, log }
    }
}

fn read_exact_vec(r: &mut impl Read, n: usize) -> io::Result<Vec<u8>> {
    let mut v = vec![0; n];
    r.read_exact(&mut v)?;
    Ok(v)
}

fn cstr(b: &[u8]) -> (String, &[u8]) {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    (
        String::from_utf8_lossy(&b[..end]).into_owned(),
        b.get(end + 1..).unwrap_or(&[]),
    )
}

/// Client to server: the untyped start-up messages (an `SSLRequest` or `GSSENCRequest`, then
/// the start-up message), then typed messages, each recorded and passed on unchanged.
fn forward(client: &TcpStream, server: &TcpStream, log: &Log) -> io::Result<()> {
    let (mut c, mut s) = (client, server);
    loop {
        let len = read_exact_vec(&mut c, 4)?;
        let n = u32::from_be_bytes(len[..4].try_into().unwrap()) as usize;
        let body = read_exact_vec(&mut c, n - 4)?;
        s.write_all(&len)?;
        s.write_all(&body)?;
        let code = u32::from_be_bytes(body[..4].try_into().unwrap());
        // SSLRequest and GSSENCRequest are followed by another untyped message.
        if code != 80_877_103 && code != 80_877_104 {
            break;
        }
    }
    let mut prepared: HashMap<String, String> = HashMap::new();
    let mut bound = String::new();
    loop {
        let head = read_exact_vec(&mut c, 5)?;
        let n = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
        let body = read_exact_vec(&mut c, n - 4)?;
        match head[0] {
            b'Q' => log.0.lock().unwrap().push(cstr(&body).0),
            b'P' => {
                let (name, rest) = cstr(&body);
                prepared.insert(name, cstr(rest).0);
            }
            b'B' => {
                let (_portal, rest) = cstr(&body);
                bound = prepared.get(&cstr(rest).0).cloned().unwrap_or_default();
            }
            b'E' => log.0.lock().unwrap().push(bound.clone()),
            _ => {}
        }
        s.write_all(&head)?;
        s.write_all(&body)?;
    }
}

/// `url` with its host and port replaced by `addr`; the server's own address.
fn through(url: &str, addr: std::net::SocketAddr) -> (String, std::net::SocketAddr) {
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (user, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let hostport = if hostport.contains(':') {
        hostport.to_owned()
    } else {
        format!("{hostport}:5432")
    };
    let upstream = hostport.to_socket_addrs().unwrap().next().unwrap();
    (
        pg_url_without_tls(&format!("{scheme}://{user}{addr}{path}")),
        upstream,
    )
}

const N: usize = 40;

/// Units of `N` one-lane rows (their payload inline), a fan-out row (payload shared in
/// ol_rows) and a joined row, claimed; returns the token and the claimed units' ids.
fn claimed(store: &dyn Store) -> (SlotToken, Vec<UnitId>) {
    let a = actor("alice");
    let mut rows: Vec<NewRow> = (0..N)
        .map(|i| row(&format!("r{i}"), &[&format!("http://l{i}.test/inbox")]))
        .collect();
    let fan: Vec<String> = (0..4).map(|i| format!("http://l{i}.test/inbox")).collect();
    let fan: Vec<&str> = fan.iter().map(String::as_str).collect();
    rows.push(row("fan", &fan));
    let mut joined = row("joined", &["http://l5.test/inbox", "http://l6.test/inbox"]);
    joined.joined = true;
    rows.push(joined);
    store.enqueue(&a, &rows).expect("enqueue");
    let t = acquire(store, &a, "h1", LEASE);
    let ranges: Vec<ClaimRange> = (0..N)
        .map(|i| ClaimRange {
            lane: lane_of(store, &a, &format!("http://l{i}.test/inbox")),
            from: outbox_lanes_core::Seq(0),
            limit: 3,
        })
        .collect();
    let mut units: Vec<UnitId> = Vec::new();
    for lane in store.claim(&t, &ranges).expect("claim") {
        for u in lane.units {
            if !units.contains(&u.id) {
                units.push(u.id);
            }
        }
    }
    // The N one-lane units, 4 of the fan-out row, the joined one.
    assert_eq!(units.len(), N + 4 + 1, "claimed units");
    (t, units)
}

fn check(store: &dyn Store, log: &Log) {
    let (t, units) = claimed(store);
    log.take();
    let payloads = store.payloads(&units);
    let statements = log.take();
    assert_eq!(payloads.len(), units.len());
    for p in &payloads {
        let p = p.as_ref().expect("payload");
        assert_eq!(p.body, format!("{{\"id\":\"{}\"}}", p.row_id).into_bytes());
    }
    let reads: Vec<&String> = statements
        .iter()
        .filter(|s| s.contains("FROM ol_units h"))
        .collect();
    assert_eq!(
        reads.len(),
        1,
        "payload statements for {} units: {statements:#?}",
        units.len()
    );
    assert!(
        statements.len() <= 3,
        "statements for one payload read: {statements:#?}"
    );

    // A unit served meanwhile is NotFound in its place; the others are read all the same.
    let first = units[0];
    let lane = lane_of(store, &actor("alice"), "http://l0.test/inbox");
    store.ack(&t, &[(first, lane)]).expect("ack");
    log.take();
    let again = store.payloads(&[first, units[1]]);
    assert!(
        matches!(again[0], Err(StoreError::NotFound { .. })),
        "{:?}",
        again[0]
    );
    assert!(again[1].is_ok(), "{:?}", again[1]);
    assert_eq!(
        log.take()
            .iter()
            .filter(|s| s.contains("FROM ol_units h"))
            .count(),
        1
    );

    // A unit asked for twice (a joined unit starts once per member lane) is read each time.
    let twice = store.payloads(&[units[2], units[1], units[2]]);
    assert_eq!(twice.len(), 3);
    for p in &twice {
        assert!(p.is_ok(), "{p:?}");
    }
    assert_eq!(twice[0], twice[2]);
    assert_ne!(twice[0], twice[1]);
}

#[test]
fn a_rounds_payloads_are_one_statement_on_pgstore() {
    let Some(url) = pg_url() else { return };
    let (_, upstream) = through(&url, "127.0.0.1:1".parse().unwrap());
    let proxy = Proxy::start(upstream);
    let (proxied, _) = through(&url, proxy.addr);
    let schema = format!("ol_t_stmts_{}", std::process::id());
    let store = PgStore::connect(
        &proxied,
        PgOptions {
            schema: schema.clone(),
            ..PgOptions::default()
        },
    )
    .expect("connect through the proxy");
    check(&store, &proxy.log);
    drop(store);
    let _ = pg_client(&url, "public").batch_execute(&format!("DROP SCHEMA {schema} CASCADE"));
}

#[cfg(feature = "sqlx")]
#[test]
fn a_rounds_payloads_are_one_statement_on_the_sqlx_store() {
    use outbox_lanes_store::sqlx::{SqlxPgOptions, SqlxPgStore, sqlx};
    let Some(url) = pg_url() else { return };
    let (_, upstream) = through(&url, "127.0.0.1:1".parse().unwrap());
    let proxy = Proxy::start(upstream);
    let (proxied, _) = through(&url, proxy.addr);
    let schema = format!("ol_t_stmts_sqlx_{}", std::process::id());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let pool = rt
        .block_on(
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(2)
                .connect(&proxied),
        )
        .expect("sqlx pool through the proxy");
    let opts = SqlxPgOptions {
        schema: schema.clone(),
        ..SqlxPgOptions::default()
    };
    let store = rt
        .block_on(SqlxPgStore::new(pool.clone(), opts))
        .expect("sqlx store");
    check(&store, &proxy.log);
    drop(store);
    rt.block_on(pool.close());
    let _ = pg_client(&url, "public").batch_execute(&format!("DROP SCHEMA {schema} CASCADE"));
}
