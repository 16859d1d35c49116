//! How closely the relay holds requests-per-second limits (OL-23), over a minute (a bench
//! binary that prints its figures; `harness = false`).
//!
//! One `outbox-lanes relay` on a SQLite file with `--rate-limits` and default settings
//! otherwise, against loopback recipients that answer 200 at once, with a backlog far larger
//! than a minute can send:
//!
//! - **endpoint**: one endpoint of actor `shop-1` limited to `RATE_ENDPOINT` (default 10)
//!   requests per second;
//! - **host**: 20 endpoints of actor `shop-2` on one origin limited to `RATE_HOST` (default
//!   25) per second, whichever endpoint the requests are for;
//! - **unlimited**: one endpoint of actor `shop-3` without a limit, beside them (the baseline:
//!   what the relay sends when nothing limits it; its backlog of 20,000 rows goes in a few
//!   seconds, so its rate is its arrivals over the time they took).
//!
//! Counted at the recipients: arrivals within `RATE_SECONDS` (default 60) from each group's
//! first arrival, and the rate that makes; the limits must hold within 10 %.
//!
//! `cargo bench -p outbox-lanes-cli --bench rate_limits`. All traffic stays on 127.0.0.1.

#[allow(dead_code)]
mod common;

use std::error::Error;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::env;
use outbox_lanes::core::ActorId;
use outbox_lanes::store::{NewRow, ServiceStore, SqliteOptions, SqliteStore, Synchronous};
use outbox_lanes_test_support::{Recipient, Recorded, Reply};

fn row(id: String, to: String) -> NewRow {
    NewRow {
        id,
        body: b"{}".to_vec(),
        content_type: "application/json".into(),
        recipients: vec![to],
        ..NewRow::default()
    }
}

/// Arrivals within `window` of the first one, of the requests `pick` selects.
fn counted(all: &[Recorded], window: Duration, pick: impl Fn(&Recorded) -> bool) -> usize {
    let mine: Vec<&Recorded> = all.iter().filter(|q| pick(q)).collect();
    let Some(first) = mine.first().map(|q| q.arrived_at) else {
        return 0;
    };
    mine.iter()
        .filter(|q| q.arrived_at.duration_since(first) < window)
        .count()
}

fn main() -> Result<(), Box<dyn Error>> {
    let seconds = env("RATE_SECONDS", 60) as u64;
    let endpoint_rate = env("RATE_ENDPOINT", 10) as f64;
    let host_rate = env("RATE_HOST", 25) as f64;
    let window = Duration::from_secs(seconds);
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("outbox.db");
    let paced = Recipient::start()?;
    let host = Recipient::start()?;
    let free = Recipient::start()?;
    for r in [&paced, &host, &free] {
        r.set_server_default(Reply::Status(200));
    }
    // Backlogs: twice what the minute can send at the limits.
    let need_endpoint = (endpoint_rate * seconds as f64 * 2.0) as usize + 10;
    let need_host = (host_rate * seconds as f64 * 2.0) as usize / 20 + 10;
    {
        let store = SqliteStore::open(
            &db,
            SqliteOptions {
                synchronous: Synchronous::Normal,
                ..SqliteOptions::default()
            },
        )?;
        let rows: Vec<NewRow> = (0..need_endpoint)
            .map(|i| row(format!("e{i}"), paced.url("/paced")))
            .collect();
        store.enqueue(&ActorId::new("shop-1"), &rows)?;
        let rows: Vec<NewRow> = (0..need_host * 20)
            .map(|i| row(format!("h{i}"), host.url(&format!("/ep{}", i % 20))))
            .collect();
        store.enqueue(&ActorId::new("shop-2"), &rows)?;
        let rows: Vec<NewRow> = (0..20_000)
            .map(|i| row(format!("f{i}"), free.url("/free")))
            .collect();
        store.enqueue(&ActorId::new("shop-3"), &rows)?;
    }
    let file = dir.path().join("rates.toml");
    std::fs::write(
        &file,
        format!(
            "[actors.\"shop-1\".recipients.\"{}\"]\nper_second = {endpoint_rate}\n\n\
             [hosts.\"http://127.0.0.1:{}\"]\nper_second = {host_rate}\n",
            paced.url("/paced"),
            host.addr().port()
        ),
    )?;
    let bin =
        std::env::var_os("RATE_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_outbox-lanes").into());
    let mut child = Command::new(bin)
        .arg("--db")
        .arg(&db)
        .arg("relay")
        .arg("--allow-private-destinations")
        .arg("--rate-limits")
        .arg(&file)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let started = Instant::now();
    // The window, from the first arrivals (within a second or so of the start), and a margin.
    std::thread::sleep(window + Duration::from_secs(3));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id())?),
        nix::sys::signal::Signal::SIGTERM,
    );
    child.wait()?;
    let ran = started.elapsed();
    let e = counted(&paced.all_requests(), window, |_| true);
    let h = counted(&host.all_requests(), window, |_| true);
    let f = free.count_all();
    let secs = window.as_secs_f64();
    let report = |name: &str, n: usize, l: f64| {
        let rate = n as f64 / secs;
        println!(
            "{name:<10} {n:>7} requests in {secs:.0} s = {rate:>8.2}/s, limit {l}/s: {:+.1} %",
            (rate - l) / l * 100.0
        );
    };
    println!(
        "rate limits over {secs:.0} s (relay ran {:.1} s)",
        ran.as_secs_f64()
    );
    report("endpoint", e, endpoint_rate);
    report("host", h, host_rate);
    // The unlimited endpoint's whole backlog may go within the window: its rate is its
    // arrivals over the time they took.
    let all = free.all_requests();
    let span = match (all.first(), all.last()) {
        (Some(a), Some(b)) => b.arrived_at.duration_since(a.arrived_at).as_secs_f64(),
        _ => 0.0,
    };
    println!(
        "{:<10} {f:>7} requests in {span:.1} s = {:>8.0}/s, no limit (its backlog: 20000)",
        "unlimited",
        f as f64 / span.max(0.001)
    );
    let off = |n: usize, l: f64| ((n as f64 / secs) - l).abs() / l;
    if off(e, endpoint_rate) > 0.10 || off(h, host_rate) > 0.10 {
        return Err("a limit was not held within 10 %".into());
    }
    Ok(())
}
