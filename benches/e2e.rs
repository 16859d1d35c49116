//! End-to-end figures on 127.0.0.1 (a bench binary that prints them; `harness = false`).
//!
//! In one run, against fresh loopback recorders each time:
//! 1. throughput (recipients answering after 5 ms): the outbox (SQLite file, blocking runtime,
//!    then the tokio runtime) delivering a fan-out, against the
//!    same HTTP client at the same concurrency posting the same requests from memory with no
//!    outbox at all (the limit), one serial drain (option A of the decision record), and
//!    unconstrained concurrent drains (the original fault) with their order violations;
//! 2. head-of-line: 50 healthy recipients and one that never answers, against the same run
//!    without it;
//! 3. memory: peak RSS of the process while it drains a large backlog.
//!
//! `cargo bench --bench e2e` (sizes: `E2E_UNITS`, default 20000; `E2E_BACKLOG`, default
//! 200000). Every loop is bounded; all traffic stays on 127.0.0.1.

mod common;

use common::{body, entry_of, env};
use std::error::Error;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use outbox_lanes::blocking::http::Delivery;
use outbox_lanes::blocking::{HttpClient, Outbox, OutboxConfig};
use outbox_lanes::core::UnitId;
use outbox_lanes::store::{NewRow, SqliteOptions, SqliteStore, Store};
use outbox_lanes_test_support::{Recipient, Reply};

const CONCURRENCY: usize = 32;
const LANES: usize = 64;
/// Every recipient answers after this long, as a real one would: with instant answers the
/// loopback recorder, not the client, would set every figure.
const LATENCY: Duration = Duration::from_millis(5);

fn config() -> OutboxConfig {
    let mut c = OutboxConfig::default().allow_loopback();
    c.concurrency = CONCURRENCY;
    c.http.timeout = Duration::from_secs(2);
    c.scheduler.retry_delays = vec![Duration::from_millis(100)];
    c.time_slice = Duration::from_secs(3600);
    c
}

/// Order violations at a recipient: arrivals whose entry is below one already received.
fn violations(r: &Recipient, path: &str) -> usize {
    let mut max = None;
    let mut v = 0;
    for b in r.bodies(path) {
        let Some(e) = entry_of(&b) else { continue };
        if max.is_some_and(|m| e < m) {
            v += 1;
        }
        max = max.max(Some(e));
    }
    v
}

fn rows(entries: std::ops::Range<usize>, to: &[String]) -> Vec<NewRow> {
    entries
        .map(|i| NewRow {
            id: format!("e{i}"),
            body: body(i),
            content_type: "application/json".into(),
            recipients: to.to_vec(),
            dedup_key: None,
            ordering_key: None,
            joined: false,
        })
        .collect()
}

fn open(dir: &tempfile::TempDir) -> Result<Arc<dyn Store>, Box<dyn Error>> {
    Ok(Arc::new(SqliteStore::open(
        dir.path().join("outbox.db"),
        SqliteOptions::default(),
    )?))
}

fn paths(n: usize) -> Vec<String> {
    (0..n).map(|l| format!("/r{l}")).collect()
}

fn outbox_run(units: usize) -> Result<(f64, usize), Box<dyn Error>> {
    let r = Recipient::start()?;
    r.set_server_default(Reply::Status(200).after(LATENCY));
    let to: Vec<String> = paths(LANES).iter().map(|p| r.url(p)).collect();
    let dir = tempfile::tempdir()?;
    let store = open(&dir)?;
    let outbox = Outbox::open(Arc::clone(&store), config())?;
    for chunk in rows(0..units / LANES, &to).chunks(500) {
        outbox.enqueue("bench", chunk)?;
    }
    let start = Instant::now();
    outbox.drain("bench")?;
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(r.count_all(), units, "every unit delivered once");
    let v = paths(LANES).iter().map(|p| violations(&r, p)).sum();
    outbox.shutdown();
    Ok((units as f64 / secs, v))
}

/// The same drain on the async runtime: tokio tasks POSTing with reqwest, `CONCURRENCY` at
/// once (the passes themselves run on tokio's blocking pool).
fn tokio_run(units: usize) -> Result<(f64, usize), Box<dyn Error>> {
    let r = Recipient::start()?;
    r.set_server_default(Reply::Status(200).after(LATENCY));
    let to: Vec<String> = paths(LANES).iter().map(|p| r.url(p)).collect();
    let dir = tempfile::tempdir()?;
    let store = open(&dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let secs = rt.block_on(async {
        let outbox = outbox_lanes::tokio::Outbox::open(Arc::clone(&store), config())?;
        for chunk in rows(0..units / LANES, &to).chunks(500) {
            outbox.enqueue("bench", chunk.to_vec()).await?;
        }
        let start = Instant::now();
        outbox.drain("bench").await?;
        let secs = start.elapsed().as_secs_f64();
        outbox.shutdown().await;
        Ok::<f64, Box<dyn Error>>(secs)
    })?;
    assert_eq!(r.count_all(), units, "every unit delivered once");
    let v = paths(LANES).iter().map(|p| violations(&r, p)).sum();
    Ok((units as f64 / secs, v))
}

/// The same requests from memory, `threads` at a time, in the given order per worker pull.
fn direct_run(units: usize, threads: usize, lanes: usize) -> Result<(f64, usize), Box<dyn Error>> {
    let r = Recipient::start()?;
    r.set_server_default(Reply::Status(200).after(LATENCY));
    let http = HttpClient::new(config().http, None)?;
    let urls: Vec<String> = paths(lanes).iter().map(|p| r.url(p)).collect();
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (http, urls, next) = (http.clone(), urls.clone(), Arc::clone(&next));
            std::thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= units {
                        return;
                    }
                    let b = body(i / lanes);
                    let a = http.deliver(
                        &Delivery {
                            unit: UnitId(i as u64),
                            recipient: &urls[i % lanes],
                            body: &b,
                            content_type: "application/json",
                            attempt: 1,
                        },
                        SystemTime::now(),
                    );
                    assert!(a.outcome.is_delivered(), "{a:?}");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().map_err(|_| "worker panicked")?;
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(r.count_all(), units);
    let v = paths(lanes).iter().map(|p| violations(&r, p)).sum();
    Ok((units as f64 / secs, v))
}

/// Time until every healthy recipient has all its units, with and without a hanging one.
fn head_of_line(with_dead: bool) -> Result<f64, Box<dyn Error>> {
    const HEALTHY: usize = 50;
    const ENTRIES: usize = 20;
    let r = Recipient::start()?;
    r.set_default("/dead", Reply::Hang);
    let mut to: Vec<String> = paths(HEALTHY).iter().map(|p| r.url(p)).collect();
    if with_dead {
        to.push(r.url("/dead"));
    }
    let dir = tempfile::tempdir()?;
    let store = open(&dir)?;
    let outbox = Outbox::open(Arc::clone(&store), config())?;
    outbox.enqueue("hol", &rows(0..ENTRIES, &to))?;
    let start = Instant::now();
    let done: Arc<Mutex<Option<Duration>>> = Arc::default();
    let ob = outbox.clone();
    let drain = std::thread::spawn(move || ob.drain("hol"));
    let healthy_done = r.wait_until(Duration::from_secs(120), |all| {
        all.iter()
            .filter(|q| q.path != "/dead" && q.completion.status().is_some())
            .count()
            == HEALTHY * ENTRIES
    });
    assert!(healthy_done, "healthy recipients finished");
    *done.lock().map_err(|_| "lock")? = Some(start.elapsed());
    drain.join().map_err(|_| "drain panicked")??;
    outbox.shutdown();
    let d = done.lock().map_err(|_| "lock")?.ok_or("not done")?;
    Ok(d.as_secs_f64())
}

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The recipients of the backlog run live in a child process, so that what they record does
/// not count in this process's peak RSS.
fn recipient_child() -> Result<(), Box<dyn Error>> {
    let r = Recipient::start()?;
    r.set_server_default(Reply::Status(204));
    println!("{}", r.addr().port());
    // Serve until the parent closes our stdin.
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink)? > 0 {
        sink.clear();
    }
    Ok(())
}

fn backlog(units: usize) -> Result<(f64, u64, u64), Box<dyn Error>> {
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .arg("--recipient-child")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut port = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().ok_or("child stdout")?),
        &mut port,
    )?;
    let port: u16 = port.trim().parse()?;
    let to: Vec<String> = (0..4)
        .map(|l| format!("http://127.0.0.1:{port}/r{l}"))
        .collect();
    let dir = tempfile::tempdir()?;
    let store = open(&dir)?;
    let outbox = Outbox::open(Arc::clone(&store), config())?;
    // Built chunk by chunk, so the backlog's rows never sit in this process's memory at once.
    let entries = units / to.len();
    for first in (0..entries).step_by(1000) {
        let chunk = rows(first..entries.min(first + 1000), &to);
        outbox.enqueue("backlog", &chunk)?;
    }
    let before = peak_rss_kib().unwrap_or(0);
    let start = Instant::now();
    let out = outbox.drain("backlog")?;
    let rate = units as f64 / start.elapsed().as_secs_f64();
    let after = peak_rss_kib().unwrap_or(0);
    outbox.shutdown();
    drop(child.stdin.take());
    child.wait()?;
    match out {
        outbox_lanes::blocking::DrainOutcome::Ran(r) if r.delivered == units as u64 => {}
        other => return Err(format!("backlog drain: {other:?}").into()),
    }
    Ok((rate, before, after))
}

fn main() -> Result<(), Box<dyn Error>> {
    if std::env::args().any(|a| a == "--recipient-child") {
        return recipient_child();
    }
    let units = env("E2E_UNITS", 20_000) / LANES * LANES;
    println!(
        "end to end on 127.0.0.1: {units} deliveries over {LANES} recipients, concurrency {CONCURRENCY}"
    );
    let (limit, limit_v) = direct_run(units, CONCURRENCY, LANES)?;
    let (ours, ours_v) = outbox_run(units)?;
    let (ours_async, ours_async_v) = tokio_run(units)?;
    let serial_units = (units / 10).max(LANES);
    let (serial, _) = direct_run(serial_units, 1, LANES)?;
    // The original fault: concurrent drains posting to few recipients at once.
    let (wild, wild_v) = direct_run(units / 4, CONCURRENCY, 4)?;
    println!("| run | deliveries/s | vs limit | order violations |");
    println!("|---|---|---|---|");
    println!(
        "| same HTTP client, {CONCURRENCY} at once, no outbox (the limit) | {limit:.0} | 1.00x | {limit_v} |"
    );
    println!(
        "| outbox-lanes, SQLite file, blocking runtime | {ours:.0} | {:.2}x | {ours_v} |",
        ours / limit
    );
    println!(
        "| outbox-lanes, SQLite file, tokio runtime (reqwest) | {ours_async:.0} | {:.2}x | {ours_async_v} |",
        ours_async / limit
    );
    println!(
        "| one serial drain, option A ({serial_units} units) | {serial:.0} | {:.2}x | 0 |",
        serial / limit
    );
    println!(
        "| unconstrained concurrent drains to 4 recipients ({} units) | {wild:.0} | {:.2}x | {wild_v} |",
        units / 4,
        wild / limit
    );

    let clean = head_of_line(false)?;
    let dead = head_of_line(true)?;
    println!("\nhead-of-line: 50 healthy recipients x 20 entries");
    println!("| run | healthy recipients done after |");
    println!("|---|---|");
    println!("| no faulty recipient | {clean:.2} s |");
    println!("| plus one that never answers | {dead:.2} s |");

    let n = env("E2E_BACKLOG", 200_000) / 4 * 4;
    let (rate, before, after) = backlog(n)?;
    println!("\nbacklog: {n} units over 4 recipients, drained at {rate:.0} deliveries/s");
    println!(
        "peak RSS of the outbox process: {before} KiB after enqueueing, {after} KiB after draining (recipients in a child process)"
    );
    Ok(())
}
