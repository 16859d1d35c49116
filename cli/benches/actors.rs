//! What a relay costs per actor as the number of actors grows (a bench binary that prints
//! its figures; `harness = false`).
//!
//! `N` actors with one row each, to one loopback recipient that answers 200 at once, on a
//! SQLite file; one `outbox-lanes relay` process delivers them all. Measured from the spawn
//! of the relay until the recipient has every row: the wall time, and the relay's CPU time
//! (user + system of all its threads, from `/proc/<pid>/stat` at that moment, in clock
//! ticks of 10 ms), then per actor. A relay started on an empty outbox and stopped once it
//! serves is the baseline (start-up), reported beside them. The sizes alternate, `RUNS`
//! times each; the median of each is printed.
//!
//! `cargo bench -p outbox-lanes-cli --bench actors` (sizes: `ACTORS_SMALL`, default 400;
//! `ACTORS_LARGE`, default 4000; `RUNS`, default 3). All traffic stays on 127.0.0.1.

#[allow(dead_code)] // body, entry_of: for the other benches
mod common;

use std::error::Error;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::env;
use outbox_lanes::core::ActorId;
use outbox_lanes::store::{NewRow, ServiceStore, SqliteOptions, SqliteStore, Synchronous};
use outbox_lanes_test_support::{Recipient, Reply};

/// Bound on one run: far above what the backlog needs, so a stuck run fails instead of hanging.
const RUN_LIMIT: Duration = Duration::from_secs(600);
/// Clock ticks per second of `/proc/<pid>/stat` (`getconf CLK_TCK`; 100 on Linux).
const TICKS: f64 = 100.0;

fn sigterm(child: &Child) -> Result<(), Box<dyn Error>> {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id())?);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
    Ok(())
}

fn relay(db: &Path) -> Result<Child, Box<dyn Error>> {
    Ok(Command::new(env!("CARGO_BIN_EXE_outbox-lanes"))
        .arg("--db")
        .arg(db)
        .arg("relay")
        .args(["--timeout", "5s", "--allow-private-destinations"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?)
}

/// User + system CPU seconds of the process so far (every thread).
fn cpu_seconds(pid: u32) -> Result<f64, Box<dyn Error>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // After the command name, which may hold spaces: field 3 is the state; 14 utime, 15 stime.
    let rest = stat.rsplit_once(')').ok_or("no ) in stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11).ok_or("no utime")?.parse()?;
    let stime: f64 = fields.get(12).ok_or("no stime")?.parse()?;
    Ok((utime + stime) / TICKS)
}

struct Run {
    wall: f64,
    cpu: f64,
}

fn run(actors: usize) -> Result<Run, Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("outbox.db");
    let r = Recipient::start()?;
    r.set_server_default(Reply::Status(200));
    {
        // Enqueued before the relay starts (not measured): one transaction per actor, with
        // synchronous=NORMAL to keep the set-up short.
        let store = SqliteStore::open(
            &db,
            SqliteOptions {
                synchronous: Synchronous::Normal,
                ..SqliteOptions::default()
            },
        )?;
        let to = vec![r.url("/inbox")];
        for a in 0..actors {
            let row = NewRow {
                id: "r0".into(),
                body: b"{}".to_vec(),
                content_type: "application/json".into(),
                recipients: to.clone(),
                ..NewRow::default()
            };
            store.enqueue(&ActorId::new(format!("actor-{a}")), &[row])?;
        }
    }
    let start = Instant::now();
    let child = relay(&db)?;
    let done = if actors == 0 {
        // Serving: its start-up is over once it answers nothing on an empty outbox; give it
        // the time the monitor needs for its first poll.
        std::thread::sleep(Duration::from_millis(300));
        true
    } else {
        r.wait_until(RUN_LIMIT, |seen| seen.len() >= actors)
    };
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(child.id())?;
    sigterm(&child)?;
    let mut child = child;
    child.wait()?;
    if !done {
        return Err(format!("{actors} actors: not every row arrived within {RUN_LIMIT:?}").into());
    }
    let got = r.requests("/inbox").len();
    if got != actors {
        return Err(format!("{actors} actors: {got} requests").into());
    }
    Ok(Run { wall, cpu })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn Error>> {
    let small = env("ACTORS_SMALL", 400);
    let large = env("ACTORS_LARGE", 4000);
    let runs = env("RUNS", 3).max(1);
    let sizes = [0, small, large];
    let mut results: Vec<Vec<Run>> = sizes.iter().map(|_| Vec::new()).collect();
    for i in 0..runs {
        for (k, &n) in sizes.iter().enumerate() {
            let r = run(n)?;
            eprintln!(
                "run {i}: {n:>6} actors: wall {:.3} s, cpu {:.2} s",
                r.wall, r.cpu
            );
            results[k].push(r);
        }
    }
    println!(
        "relay, one row per actor, SQLite, loopback recipient answering at once; median of {runs}"
    );
    println!(
        "{:>7}  {:>8}  {:>7}  {:>13}  {:>12}  {:>22}",
        "actors", "wall s", "cpu s", "wall ms/actor", "cpu ms/actor", "cpu ms/actor - start-up"
    );
    let base_cpu = median(results[0].iter().map(|r| r.cpu).collect());
    let mut per_actor = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        let wall = median(results[k].iter().map(|r| r.wall).collect());
        let cpu = median(results[k].iter().map(|r| r.cpu).collect());
        if n == 0 {
            println!(
                "{:>7}  {wall:>8.3}  {cpu:>7.2}  {:>13}  {:>12}  {:>22}",
                "0", "-", "-", "(start-up)"
            );
            continue;
        }
        let per = |x: f64| x * 1000.0 / n as f64;
        println!(
            "{n:>7}  {wall:>8.3}  {cpu:>7.2}  {:>13.3}  {:>12.3}  {:>22.3}",
            per(wall),
            per(cpu),
            per(cpu - base_cpu)
        );
        per_actor.push((n, per(wall), per(cpu), per(cpu - base_cpu)));
    }
    if let [(_, w1, c1, d1), (_, w2, c2, d2)] = per_actor[..] {
        println!(
            "large / small per actor: wall {:.2}x, cpu {:.2}x, cpu without start-up {:.2}x",
            w2 / w1,
            c2 / c1,
            d2 / d1
        );
    }
    Ok(())
}
