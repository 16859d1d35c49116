//! Several relay processes on one Postgres database (a bench binary that prints its figures;
//! `harness = false`).
//!
//! Many actors (one pass per actor is the rule, so a single actor cannot scale out) fan out to
//! loopback recorders answering after 5 ms. The same backlog is drained, in one run, by:
//! 1. one `outbox-lanes relay` process with `--concurrency 32`;
//! 2. two relay processes with `--concurrency 16` each (the same in-flight budget: what the
//!    coordination through the database costs);
//! 3. two relay processes with `--concurrency 32` each (the scale-out; on a 2-core machine the
//!    gain is bounded by the cores, reported, not promised).
//!
//! For each: deliveries/s from the first relay's start until the recorders have every unit,
//! and what the recorders saw: order violations per recipient, duplicates, losses.
//!
//! `OUTBOX_LANES_TEST_PG=postgres://postgres@127.0.0.1:5432/test cargo bench --bench relays`
//! (sizes: `RELAYS_ACTORS`, default 100; `RELAYS_ENTRIES`, default 50 per actor,
//! each to 4 recipients). Every wait is bounded; all traffic stays on 127.0.0.1.

mod common;

use common::{body, entry_of, env};
use std::collections::HashMap;
use std::error::Error;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_lanes::core::ActorId;
use outbox_lanes::store::{NewRow, PgOptions, PgStore, ServiceStore};
use outbox_lanes_test_support::{Recipient, Reply};

const RECIPIENTS: usize = 4;
const LATENCY: Duration = Duration::from_millis(5);
/// Bound on one run: far above what the backlog needs, so a stuck run fails instead of hanging.
const RUN_LIMIT: Duration = Duration::from_secs(600);

struct Outcome {
    per_sec: f64,
    violations: usize,
    duplicates: usize,
    missing: usize,
}

fn sigterm(child: &Child) -> Result<(), Box<dyn Error>> {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id())?);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
    Ok(())
}

fn relay(url: &str, schema: &str, concurrency: usize) -> Result<Child, Box<dyn Error>> {
    Ok(Command::new(env!("CARGO_BIN_EXE_outbox-lanes"))
        .args(["--db", url, "--pg-schema", schema])
        .arg("relay")
        .args(["--concurrency", &concurrency.to_string()])
        .args(["--timeout", "5s", "--allow-private-destinations"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?)
}

fn run(
    url: &str,
    tag: &str,
    relays: usize,
    concurrency: usize,
    actors: usize,
    entries: usize,
) -> Result<Outcome, Box<dyn Error>> {
    let schema = format!("ol_relays_{}_{tag}", std::process::id());
    let store = PgStore::connect(
        url,
        PgOptions {
            schema: schema.clone(),
            ..PgOptions::default()
        },
    )?;
    let r = Recipient::start()?;
    r.set_server_default(Reply::Status(200).after(LATENCY));
    let paths: Vec<Vec<String>> = (0..actors)
        .map(|a| (0..RECIPIENTS).map(|k| format!("/a{a}/r{k}")).collect())
        .collect();
    for (a, ps) in paths.iter().enumerate() {
        let to: Vec<String> = ps.iter().map(|p| r.url(p)).collect();
        let rows: Vec<NewRow> = (0..entries)
            .map(|e| NewRow {
                id: format!("e{e}"),
                body: body(e),
                content_type: "application/json".into(),
                recipients: to.clone(),
                ..NewRow::default()
            })
            .collect();
        store.enqueue(&ActorId::new(format!("actor-{a}")), &rows)?;
    }
    let total = actors * entries * RECIPIENTS;
    let start = Instant::now();
    let mut children = Vec::new();
    for _ in 0..relays {
        children.push(relay(url, &schema, concurrency)?);
    }
    let done = r.wait_until(RUN_LIMIT, |seen| seen.len() >= total);
    let secs = start.elapsed().as_secs_f64();
    // Let anything still in flight land before counting duplicates, then stop the relays.
    std::thread::sleep(Duration::from_millis(200));
    for c in &children {
        sigterm(c)?;
    }
    for mut c in children {
        c.wait()?;
    }
    let (mut violations, mut duplicates, mut missing) = (0, 0, 0);
    for p in paths.iter().flatten() {
        let got: Vec<usize> = r.bodies(p).iter().filter_map(|b| entry_of(b)).collect();
        let mut seen: HashMap<usize, usize> = HashMap::new();
        let mut max = None;
        for &e in &got {
            *seen.entry(e).or_default() += 1;
            if max.is_some_and(|m| e < m) {
                violations += 1;
            }
            max = max.max(Some(e));
        }
        duplicates += seen.values().map(|n| n - 1).sum::<usize>();
        missing += (0..entries).filter(|e| !seen.contains_key(e)).count();
    }
    drop(store);
    let mut c = postgres::Client::connect(url, postgres::NoTls)?;
    c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))?;
    if !done {
        return Err(format!("{tag}: not every unit arrived within {RUN_LIMIT:?}").into());
    }
    Ok(Outcome {
        per_sec: total as f64 / secs,
        violations,
        duplicates,
        missing,
    })
}

fn main() -> Result<(), Box<dyn Error>> {
    let Some(url) = std::env::var("OUTBOX_LANES_TEST_PG")
        .ok()
        .filter(|u| !u.is_empty())
        .map(|url| outbox_lanes_test_support::pg_url_without_tls(&url))
    else {
        println!("relays bench: skipped (OUTBOX_LANES_TEST_PG not set)");
        return Ok(());
    };
    let actors = env("RELAYS_ACTORS", 100);
    let entries = env("RELAYS_ENTRIES", 50);
    println!(
        "several relays on Postgres: {actors} actors x {entries} entries x {RECIPIENTS} recipients = {} deliveries, recipients answer after {} ms",
        actors * entries * RECIPIENTS,
        LATENCY.as_millis()
    );
    // Alternating, twice: a disk or a neighbour that slows down weighs on every side alike.
    let sides: [(&str, usize, usize); 3] = [
        ("one relay, --concurrency 32", 1, 32),
        ("two relays, --concurrency 16 each", 2, 16),
        ("two relays, --concurrency 32 each", 2, 32),
    ];
    let mut results: Vec<Vec<Outcome>> = sides.iter().map(|_| Vec::new()).collect();
    for round in 0..2 {
        for (k, (_, relays, conc)) in sides.iter().enumerate() {
            let tag = format!("r{round}s{k}");
            results[k].push(run(&url, &tag, *relays, *conc, actors, entries)?);
        }
    }
    let base: f64 = results[0].iter().map(|o| o.per_sec).sum::<f64>() / 2.0;
    println!(
        "| run | deliveries/s (round 1, round 2) | vs one relay | order violations | duplicates | lost |"
    );
    println!("|---|---|---|---|---|---|");
    for ((name, _, _), rs) in sides.iter().zip(&results) {
        let mean = rs.iter().map(|o| o.per_sec).sum::<f64>() / rs.len() as f64;
        println!(
            "| {name} | {:.0}, {:.0} | {:.2}x | {} | {} | {} |",
            rs[0].per_sec,
            rs[1].per_sec,
            mean / base,
            rs.iter().map(|o| o.violations).sum::<usize>(),
            rs.iter().map(|o| o.duplicates).sum::<usize>(),
            rs.iter().map(|o| o.missing).sum::<usize>(),
        );
    }
    Ok(())
}
