//! The ledger fan-out of the decision record, end to end on 127.0.0.1.
//!
//! An actor appends entries 0…N, each addressed to four participants: one healthy, one
//! slow, one flaky (every third request answers 503) and one that hangs. The entries go into
//! an embedded SQLite outbox and are drained by the blocking runtime. The same fan-out is
//! then delivered by the two designs the decision record rejected — one serial drain, and
//! unconstrained concurrent drains — against fresh recipients, and the three are compared:
//! per recipient, entries received, whether in order, duplicates, and time to the last entry.
//!
//! Run: `cargo run --release --example fanout` (all traffic stays on 127.0.0.1).

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use outbox_lanes::blocking::http::{Bytes, Delivery, Destination};
use outbox_lanes::blocking::{HttpClient, Outbox, OutboxConfig};
use outbox_lanes::core::UnitId;
use outbox_lanes::store::{NewRow, SqliteOptions, SqliteStore, Store};
use outbox_lanes_test_support::{Recipient, Reply};

const ENTRIES: usize = 40;
const PARTICIPANTS: [&str; 4] = ["healthy", "slow", "flaky", "hanging"];
/// Serial and unconstrained deliveries get this long; the outbox drain is not cut short.
const BASELINE_BUDGET: Duration = Duration::from_secs(6);

fn recipients() -> Result<Recipient, Box<dyn Error>> {
    let r = Recipient::start()?;
    r.set_default("/slow", Reply::Status(202).after(Duration::from_millis(30)));
    let mut flaky = Vec::new();
    for i in 0..(ENTRIES * 4) {
        flaky.push(if i % 3 == 2 {
            Reply::Status(503)
        } else {
            Reply::Status(202)
        });
    }
    r.script("/flaky", flaky);
    r.set_default("/hanging", Reply::Hang);
    Ok(r)
}

fn config() -> OutboxConfig {
    let mut c = OutboxConfig::default().allow_loopback();
    c.http.timeout = Duration::from_secs(1);
    c.scheduler.retry_delays = vec![
        Duration::from_millis(100),
        Duration::from_millis(200),
        Duration::from_millis(400),
    ];
    c.concurrency = 16;
    c
}

/// What one recipient saw.
struct Seen {
    received: usize,
    distinct: usize,
    in_order: bool,
    violations: usize,
    last: Option<Duration>,
}

fn seen(r: &Recipient, path: &str, start: Instant) -> Seen {
    let reqs: Vec<_> = r
        .requests(path)
        .into_iter()
        .filter(|q| q.completion.status().is_some_and(|s| s < 300))
        .collect();
    let entries: Vec<usize> = reqs
        .iter()
        .filter_map(|q| {
            let body = q.body_text()?;
            body.split("\"entry\":")
                .nth(1)?
                .trim_end_matches('}')
                .parse()
                .ok()
        })
        .collect();
    let mut distinct = entries.clone();
    distinct.sort_unstable();
    distinct.dedup();
    // First deliveries only: a resend of an entry already held is a duplicate, not disorder.
    let mut held = std::collections::BTreeSet::new();
    let mut violations = 0;
    let mut max = None;
    for &e in &entries {
        if held.insert(e) {
            if max.is_some_and(|m| e < m) {
                violations += 1;
            }
            max = max.max(Some(e));
        }
    }
    Seen {
        received: entries.len(),
        distinct: distinct.len(),
        in_order: violations == 0,
        violations,
        last: reqs
            .last()
            .map(|q| q.arrived_at.saturating_duration_since(start)),
    }
}

fn body(entry: usize) -> Vec<u8> {
    format!("{{\"type\":\"Announce\",\"entry\":{entry}}}").into_bytes()
}

fn report(name: &str, r: &Recipient, start: Instant, total: Duration) {
    println!("\n{name} (finished after {:.2} s)", total.as_secs_f64());
    println!(
        "  {:<9} {:>8} {:>8} {:>10} {:>11} {:>14}",
        "recipient", "received", "distinct", "in order", "violations", "last entry at"
    );
    for p in PARTICIPANTS {
        let s = seen(r, &format!("/{p}"), start);
        println!(
            "  {:<9} {:>8} {:>8} {:>10} {:>11} {:>14}",
            p,
            s.received,
            s.distinct,
            if s.in_order { "yes" } else { "NO" },
            s.violations,
            s.last
                .map_or("-".to_string(), |d| format!("{:.2} s", d.as_secs_f64()))
        );
    }
}

fn outbox_run() -> Result<(), Box<dyn Error>> {
    let r = recipients()?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("outbox.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path, SqliteOptions::default())?);
    let outbox = Outbox::open(Arc::clone(&store), config())?;
    let to: Vec<String> = PARTICIPANTS
        .iter()
        .map(|p| r.url(&format!("/{p}")))
        .collect();
    let rows: Vec<NewRow> = (0..ENTRIES)
        .map(|i| {
            NewRow::new(format!("entry-{i}"))
                .body(body(i))
                .content_type("application/activity+json")
                .recipients(&to)
        })
        .collect();
    outbox.enqueue("case-manager", &rows)?;
    println!(
        "enqueued {ENTRIES} entries x {} participants into {}",
        PARTICIPANTS.len(),
        path.display()
    );
    let start = Instant::now();
    let out = outbox.drain("case-manager")?;
    let total = start.elapsed();
    report("outbox-lanes (per-recipient lanes)", &r, start, total);
    println!("  drain: {out}");
    for lane in outbox.lanes("case-manager")? {
        println!(
            "  lane {}: {} pending, backoff level {}, last error {:?}",
            lane.key.recipient(),
            lane.depth,
            lane.backoff_level,
            lane.last_error.as_deref().unwrap_or("-")
        );
    }
    println!("  dead letters: {}", outbox.dead_letters(None)?.len());
    outbox.shutdown();
    Ok(())
}

/// Option A of the decision record: one drain delivering rows one at a time.
fn serial_run(http: &HttpClient) -> Result<(), Box<dyn Error>> {
    let r = recipients()?;
    let start = Instant::now();
    'rows: for i in 0..ENTRIES {
        for p in PARTICIPANTS {
            if start.elapsed() > BASELINE_BUDGET {
                break 'rows;
            }
            let url = Destination::parse(&r.url(&format!("/{p}")));
            let b = Bytes::from(body(i));
            http.deliver(
                &Delivery {
                    actor: "fanout",
                    outbox: "fanout",
                    unit: UnitId((i * 4) as u64),
                    recipient: &url,
                    body: &b,
                    content_type: "application/activity+json",
                    headers: &[],
                    attempt: 1,
                },
                SystemTime::now(),
            );
        }
    }
    report(
        &format!(
            "serial drain (one at a time; stopped after {} s)",
            BASELINE_BUDGET.as_secs()
        ),
        &r,
        start,
        start.elapsed(),
    );
    Ok(())
}

/// The original fault: every row posted at once by concurrent drains, failures retried
/// from the tail.
fn unconstrained_run(http: &HttpClient) -> Result<(), Box<dyn Error>> {
    let r = recipients()?;
    let start = Instant::now();
    let mut threads = Vec::new();
    for i in 0..ENTRIES {
        for p in PARTICIPANTS {
            let url = Destination::parse(&r.url(&format!("/{p}")));
            let http = http.clone();
            threads.push(std::thread::spawn(move || {
                let b = Bytes::from(body(i));
                // Retry at the tail until delivered or out of budget.
                while start.elapsed() < BASELINE_BUDGET {
                    let a = http.deliver(
                        &Delivery {
                            actor: "fanout",
                            outbox: "fanout",
                            unit: UnitId((i * 4) as u64),
                            recipient: &url,
                            body: &b,
                            content_type: "application/activity+json",
                            headers: &[],
                            attempt: 1,
                        },
                        SystemTime::now(),
                    );
                    if a.outcome.is_delivered() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }));
        }
    }
    for t in threads {
        let _ = t.join();
    }
    report(
        "unconstrained concurrent drains",
        &r,
        start,
        start.elapsed(),
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    outbox_run()?;
    let http = HttpClient::new(config().http, None)?;
    serial_run(&http)?;
    unconstrained_run(&http)?;
    println!(
        "\nThe hanging recipient costs the others nothing with lanes; with one serial drain it \
         blocks everyone behind it; unconstrained drains deliver out of order."
    );
    Ok(())
}
