//! How long another actor's row waits beside a flooder holding the in-flight budget (a bench
//! binary that prints its figures; `harness = false`).
//!
//! One `outbox-lanes relay` process with its default settings (`--concurrency 256`, the
//! default actor reserve; only `--allow-private-destinations` for the loopback servers), on a
//! SQLite file. Customer A floods three servers (three origins, so the host book's
//! half-the-budget share per host does not bound it) with 150 lanes each, every request
//! answered after the flooder's response time (200 ms, 3 s, 20 s; under the 30 s HTTP
//! timeout) — enough rows to keep A's share of the budget full for the whole run. A warm-up
//! row per server (answered at once) opens each host's share first, and one row of customer
//! B makes the process see a second actor. Then, once A holds the budget, B enqueues
//! `FAIR_B_ROWS` rows (default 10) one at a time, `FAIR_SPACING_MS` apart (default 500), each
//! in a lane of its own on B's server, which answers at once. Measured for each B row: from
//! the start of its `enqueue` command until its arrival at B's server (so it includes the
//! command's start-up and the relay's wake-up: the `idle` row, without a flood, shows that
//! floor). Printed: the median and the max per flooder response time, and the number of A's
//! requests open at B's enqueues.
//!
//! `cargo bench -p outbox-lanes-cli --bench fair_shares`. `FAIR_BIN=/path/to/outbox-lanes`
//! runs another build (e.g. the parent commit's, before fair shares) in the same run,
//! alternating with this one, and prints both side by side. About a minute with `FAIR_BIN`.
//! Every wait is bounded; all traffic stays on 127.0.0.1.

#[allow(dead_code)] // body, entry_of: for the other benches
mod common;

use std::error::Error;
use std::ffi::OsString;
use std::io::Write as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::env;
use outbox_lanes_test_support::{Recipient, Reply};

/// The default `--concurrency`, and the default reserve (a tenth of it).
const BUDGET: usize = 256;
const RESERVE: usize = BUDGET / 10;
/// A's servers (origins) and its lanes on each.
const A_SERVERS: usize = 3;
const A_LANES: usize = 150;
/// Bound on one command (enqueue), and on the warm-up.
const STEP_LIMIT: Duration = Duration::from_secs(60);
/// How long to wait for A to hold its share before measuring anyway.
const FILL_LIMIT: Duration = Duration::from_secs(15);

type Res<T> = Result<T, Box<dyn Error>>;

fn command(bin: &OsString, db: &Path) -> Command {
    let mut c = Command::new(bin);
    c.arg("--db").arg(db);
    // Defaults: nothing of the caller's environment (OUTBOX_LANES_CONCURRENCY, ...).
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("OUTBOX_LANES_") {
            c.env_remove(name);
        }
    }
    c.env("RUST_LOG", "warn");
    c
}

/// Enqueues `lines` (JSON rows) for `actor` with the binary under test.
fn enqueue(bin: &OsString, db: &Path, actor: &str, lines: &[String]) -> Res<()> {
    let mut child = command(bin, db)
        .args(["enqueue", "--allow-private-destinations", "--actor", actor])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut input = child.stdin.take().ok_or("no stdin")?;
    let text = lines.join("\n") + "\n";
    let writer = std::thread::spawn(move || input.write_all(text.as_bytes()));
    let deadline = Instant::now() + STEP_LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("enqueue did not exit".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    writer.join().map_err(|_| "the writer panicked")??;
    if !status.success() {
        return Err(format!("enqueue for {actor}: {status}").into());
    }
    Ok(())
}

fn row(id: &str, to: &str) -> String {
    serde_json::json!({ "id": id, "to": [to], "body": { "n": id } }).to_string()
}

/// A relay killed when dropped (a bench needs no clean stop: held responses would make
/// SIGTERM wait for the shutdown grace).
struct Relay(Child);

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Requests to A's servers (beyond the warm-up) not answered yet.
fn open(servers: &[Recipient]) -> usize {
    servers
        .iter()
        .map(|r| {
            r.all_requests()
                .iter()
                .filter(|q| q.path != "/warm" && q.completion.is_pending())
                .count()
        })
        .sum()
}

fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}

struct Run {
    /// Each B row's delay, enqueue (command start) to arrival.
    delays: Vec<f64>,
    /// A's open requests at each of B's enqueues.
    a_open: Vec<usize>,
}

/// One run of `bin`; `latency`: the flooder's response time, `None` for no flood.
fn run(bin: &OsString, latency: Option<Duration>, b_rows: usize, spacing: Duration) -> Res<Run> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("outbox.db");
    let a_servers = (0..A_SERVERS)
        .map(|_| {
            let r = Recipient::start()?;
            r.set_default("/warm", Reply::Status(200));
            r.set_server_default(Reply::Status(200).after(latency.unwrap_or_default()));
            Ok(r)
        })
        .collect::<Res<Vec<Recipient>>>()?;
    let b_server = Recipient::start()?;

    // Warm-up: each of A's hosts answers once; B is seen (the default reserve is kept).
    let warm: Vec<String> = a_servers
        .iter()
        .enumerate()
        .map(|(s, r)| row(&format!("warm-a{s}"), &r.url("/warm")))
        .collect();
    enqueue(bin, &db, "customer-a", &warm)?;
    enqueue(
        bin,
        &db,
        "customer-b",
        &[row("warm-b", &b_server.url("/warm"))],
    )?;
    let relay = Relay(
        command(bin, &db)
            .args(["relay", "--allow-private-destinations"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?,
    );
    if !wait_for(STEP_LIMIT, || {
        a_servers.iter().all(|r| r.count("/warm") == 1) && b_server.count("/warm") == 1
    }) {
        return Err("the warm-up rows did not arrive".into());
    }

    let measured = b_rows as f64 * spacing.as_secs_f64();
    if let Some(latency) = latency {
        // Enough rows to keep A's share full while B's rows go, and for B's last one to wait
        // a whole response time: the budget turns over once per response time.
        let window = 5.0 + measured + latency.as_secs_f64();
        let rows = BUDGET as f64 * (window / latency.as_secs_f64() + 1.0) * 1.5;
        let depth = ((rows / (A_SERVERS * A_LANES) as f64).ceil() as usize).clamp(2, 60);
        let mut flood = Vec::with_capacity(depth * A_SERVERS * A_LANES);
        for k in 0..depth {
            for i in 0..A_LANES {
                for (s, r) in a_servers.iter().enumerate() {
                    flood.push(row(&format!("a{s}-{i}-{k}"), &r.url(&format!("/lane-{i}"))));
                }
            }
        }
        enqueue(bin, &db, "customer-a", &flood)?;
        let full = BUDGET - RESERVE - 5;
        if !wait_for(FILL_LIMIT, || open(&a_servers) >= full) {
            eprintln!(
                "  (A reached only {} open requests of the {full} wanted; measuring anyway)",
                open(&a_servers)
            );
        }
    }

    let start = Instant::now();
    let mut enqueued = Vec::with_capacity(b_rows);
    let mut a_open = Vec::with_capacity(b_rows);
    for i in 0..b_rows {
        let slot = start + spacing * u32::try_from(i)?;
        std::thread::sleep(slot.saturating_duration_since(Instant::now()));
        a_open.push(open(&a_servers));
        let at = Instant::now();
        enqueue(
            bin,
            &db,
            "customer-b",
            &[row(&format!("b{i}"), &b_server.url(&format!("/b-{i}")))],
        )?;
        enqueued.push(at);
    }
    let limit = latency.unwrap_or_default() + Duration::from_secs(40);
    if !wait_for(limit, || {
        (0..b_rows).all(|i| b_server.count(&format!("/b-{i}")) >= 1)
    }) {
        return Err(format!("B's rows did not all arrive within {limit:?}").into());
    }
    let delays = (0..b_rows)
        .map(|i| {
            let first = b_server.requests(&format!("/b-{i}"))[0].arrived_at;
            first.saturating_duration_since(enqueued[i]).as_secs_f64()
        })
        .collect();
    drop(relay);
    Ok(Run { delays, a_open })
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

fn main() -> Res<()> {
    let b_rows = env("FAIR_B_ROWS", 10).max(1);
    let spacing = Duration::from_millis(env("FAIR_SPACING_MS", 500) as u64);
    let this: OsString = env!("CARGO_BIN_EXE_outbox-lanes").into();
    let mut bins = vec![("this", this)];
    if let Some(other) = std::env::var_os("FAIR_BIN") {
        bins.push(("FAIR_BIN", other));
    }
    let latencies = [
        None,
        Some(Duration::from_millis(200)),
        Some(Duration::from_secs(3)),
        Some(Duration::from_secs(20)),
    ];
    let label = |l: Option<Duration>| l.map_or_else(|| "idle".to_owned(), |d| format!("{d:?}"));
    // results[latency][binary]
    let mut results: Vec<Vec<Run>> = Vec::new();
    for &latency in &latencies {
        let mut row = Vec::new();
        for (name, bin) in &bins {
            let r = run(bin, latency, b_rows, spacing)?;
            eprintln!(
                "{:>6} {name:>8}: B delays {:?}",
                label(latency),
                r.delays
                    .iter()
                    .map(|d| format!("{d:.3}"))
                    .collect::<Vec<_>>()
            );
            row.push(r);
        }
        results.push(row);
    }

    println!(
        "B's rows ({b_rows}, one every {spacing:?}, each its own lane) beside a flooder A \
         holding the budget (--concurrency {BUDGET}, defaults; A on {A_SERVERS} origins x \
         {A_LANES} lanes): seconds from B's enqueue (command start) to arrival"
    );
    for (name, bin) in &bins {
        println!("  {name}: {}", bin.to_string_lossy());
    }
    print!("{:>12}", "A answers");
    for (name, _) in &bins {
        print!("  {:>22}", format!("{name}: median / max"));
        print!("  {:>12}", "A open");
    }
    println!();
    for (k, &latency) in latencies.iter().enumerate() {
        print!("{:>12}", label(latency));
        for r in &results[k] {
            let open = r.a_open.iter().sum::<usize>() / r.a_open.len().max(1);
            print!(
                "  {:>22}",
                format!("{:.3} / {:.3}", median(&r.delays), max(&r.delays))
            );
            print!("  {open:>12}");
        }
        println!();
    }
    Ok(())
}
