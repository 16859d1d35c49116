//! A fediverse-like delivery through the `outbox-lanes` binary (a bench binary that prints
//! its figures; `harness = false`).
//!
//! **The recipients** are a farm of real servers in a **child process** (this same binary with
//! `--serve`, so their CPU is not ours), M origins on M ports of 127.0.0.1 (an origin is
//! scheme + host + port), N inboxes spread over them by a Zipf law (a few big instances, a
//! long tail of small ones). Everything is drawn from one seeded RNG, so a seed replays the
//! same farm and the same latencies; the parent and the farm derive the plan from the seed
//! alone:
//! - every answer waits a latency drawn per (inbox, row) from a lognormal with median 150 ms
//!   and p99 2 s (sigma = ln(2000/150)/2.326), capped at 20 s (under the default 30 s
//!   timeout, so a healthy recipient never times out), then says 202;
//! - about 3 % of the origins are **dead**: they accept every connection and close it at once
//!   without answering (one of them drawn among the 2nd to 5th largest origins: a dead big
//!   instance is what costs connections); every accepted connection is counted, with its time;
//! - about 2 % of the inboxes on the other origins answer **410 Gone**;
//! - about 2 % of the origins **hang**: they accept, read, and never answer (drawn outside the
//!   ten largest, so a few lanes each; the default 30 s timeout applies);
//! - one **sharedInbox-like lane** on the largest origin gets 2,000 rows of its own (a big
//!   instance's shared inbox, median 10 ms, the same sigma), interleaved with the fan-out rows
//!   of 10 activities to every other inbox.
//!
//! The farm records each request's arrival and answer time per inbox (from its own clock,
//! zeroed just before the drain starts), its `Idempotency-Key` (a key seen twice is a
//! duplicate) and its entry number (one below an entry already seen at that inbox is an
//! order violation), and the accepted connections per origin.
//!
//! **The outbox** is the binary with its defaults, except `--allow-private-destinations` (to
//! reach 127.0.0.1) and `--concurrency 100` (a mid-sized instance's delivery budget): the rows
//! are enqueued by `outbox-lanes enqueue` into a fresh SQLite file (not timed), then one
//! `outbox-lanes drain` runs until it ends by itself or the deadline, when it gets SIGTERM
//! (and a second one 2 s later: stop at once).
//!
//! **Figures, per run**: for each healthy lane (a 202-answering inbox), its completion time
//! (the answer to its last row) against **the ideal**, the lane's serial bound: the sum of the
//! latencies the farm draws for its rows (one request in flight per lane, nothing else in the
//! way), as p50/p90/p99/max of actual/ideal (a lane not complete by the end ranks as
//! infinite); the sharedInbox lane's own ratio, and its rows answered by the end of the
//! fan-out; when the last other healthy lane was complete, against the work bound (every
//! answered row's latency over the 100 in flight, or `FEDI_CONCURRENCY`'s: no schedule
//! delivers the fan-out sooner);
//! the makespan against the largest ideal; until that last fan-out lane, where the places
//! went (requests to answering origins from arrival to answer, connections to hanging
//! origins for the 30 s timeout from accept, the rest idle or on dead origins), overall and
//! as the mean in flight per 20 s; connections spent on dead origins (total, per dead
//! origin, and within the first 15 s); deliveries, 410s, order violations (must be 0) and
//! duplicates among answered requests; the drain's length, CPU time (user + system, from
//! `getrusage(RUSAGE_CHILDREN)` around it) and peak RSS (its `VmHWM` in `/proc`, sampled every
//! 50 ms while it runs), and how long the untimed `enqueue` took.
//!
//! **Variants**: `before` runs the drain with `--host-failures 0` (origin health off),
//! `after` with nothing more (its default: on). A binary without that flag refuses it (exit
//! 2, "unexpected argument"): the variant is reported as not available and skipped, and
//! `after` (then the binary's behaviour without origin health) is labelled "no origin health".
//!
//! `cargo bench -p outbox-lanes-cli --bench fediverse`, with, from the environment:
//! - `FEDI_SCALE` (default 1): N = 1,000 × scale inboxes, M = 100 × scale origins, the
//!   sharedInbox lane 2,000 × scale rows; 10 fan-out rows whatever the scale;
//! - `FEDI_SEED` (default 1): the farm and every latency;
//! - `FEDI_ROUNDS` (default 1): rounds of the variants, alternating (before, after, before, …);
//! - `FEDI_VARIANTS` (default `before,after`);
//! - `FEDI_DEADLINE` (seconds, default 180): when a drain still running is stopped (at seed 1
//!   it ends by itself after about 130 s: the hanging lanes' four 30 s attempts);
//! - `FEDI_CONCURRENCY` (default 100): the drain's `--concurrency`, or `default` to pass none
//!   (the binary's default, read from its `drain --help`); the work bound divides by it;
//! - `FEDI_BIN`: another build of the binary, for an A/B of two builds;
//! - `FEDI_DRAIN_LOG` (a path): the drain logs at `info` and its log is kept there, the run's
//!   label appended (otherwise it logs at `warn` into a temporary directory).
//!
//! It writes `benches/fediverse.svg` (the CDF of healthy lanes' actual/ideal per run, and
//! the connections to dead origins per run): hand-written SVG, as `e2e.rs` does. Every loop
//! is bounded; all traffic stays on 127.0.0.1.

mod common;

use std::collections::HashSet;
use std::error::Error;
use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use common::{body, entry_of, env};

type Res<T> = Result<T, Box<dyn Error>>;

/// Fan-out rows: activities sent to every inbox but the shared one.
const FAN_OUT: usize = 10;
/// The latency median of every inbox but the shared one.
const MEDIAN_MS: f64 = 150.0;
/// The shared inbox's latency median: a big instance's well-provisioned endpoint.
const SHARED_MEDIAN_MS: f64 = 10.0;
/// No latency above this: under the default 30 s timeout.
const CAP_MS: f64 = 20_000.0;
/// The outbox's deliveries in flight unless `FEDI_CONCURRENCY` says otherwise.
const CONCURRENCY: usize = 100;
/// The early window for connections to dead origins.
const EARLY: Duration = Duration::from_secs(15);
/// The outbox's default request timeout: how long a connection to a hanging origin holds
/// one of its places.
const TIMEOUT_US: u64 = 30_000_000;
/// The buckets of the place timeline, seconds.
const BUCKET_S: f64 = 20.0;
const ACTOR: &str = "bench";

/// Lognormal sigma for median 150 ms and p99 2 s (z of the 99th percentile: 2.326).
fn sigma() -> f64 {
    (2000.0_f64 / 150.0).ln() / 2.326
}

// ---------------------------------------------------------------------------------------
// The plan: origins, inboxes, rows and latencies, all from the seed
// ---------------------------------------------------------------------------------------

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1_u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Healthy,
    Dead,
    Hanging,
}

struct Inbox {
    origin: usize,
    gone: bool,
    /// Its rows' entry numbers, in enqueue order.
    entries: Vec<usize>,
}

struct Plan {
    seed: u64,
    kinds: Vec<Kind>,
    inboxes: Vec<Inbox>,
    /// The sharedInbox-like lane: the last inbox, on origin 0.
    shared: usize,
    rows: usize,
}

impl Plan {
    fn new(seed: u64, scale: f64) -> Plan {
        let n = ((1000.0 * scale).round() as usize).max(10);
        let m = ((100.0 * scale).round() as usize).clamp(4, n);
        let shared_rows = ((2000.0 * scale).round() as usize).max(10);
        let mut rng = Rng(seed);
        // Every origin has one inbox; the rest go by Zipf (weight 1/rank), so origin 0 is the
        // largest in expectation.
        let h: f64 = (1..=m).map(|r| 1.0 / r as f64).sum();
        let mut origin_of: Vec<usize> = (0..m).collect();
        for _ in m..n {
            let mut u = rng.unit() * h;
            let mut o = 0;
            while o + 1 < m {
                u -= 1.0 / (o + 1) as f64;
                if u < 0.0 {
                    break;
                }
                o += 1;
            }
            origin_of.push(o);
        }
        let mut kinds = vec![Kind::Healthy; m];
        let dead = ((0.03 * m as f64).round() as usize).max(1);
        let hanging = ((0.02 * m as f64).round() as usize).max(1);
        // One dead origin among the largest (not origin 0, which holds the shared inbox).
        kinds[1 + rng.below(4.min(m - 1))] = Kind::Dead;
        let mut pick = |kinds: &mut Vec<Kind>, from: usize, kind: Kind| {
            let free: Vec<usize> = (from..m).filter(|&o| kinds[o] == Kind::Healthy).collect();
            if !free.is_empty() {
                kinds[free[rng.below(free.len())]] = kind;
            }
        };
        for _ in 1..dead {
            pick(&mut kinds, 1, Kind::Dead);
        }
        for _ in 0..hanging {
            pick(&mut kinds, (m / 10).max(1), Kind::Hanging);
        }
        let mut inboxes: Vec<Inbox> = origin_of
            .iter()
            .map(|&origin| Inbox {
                origin,
                gone: kinds[origin] == Kind::Healthy && rng.unit() < 0.02,
                entries: Vec::new(),
            })
            .collect();
        if !inboxes.iter().any(|i| i.gone) {
            if let Some(i) = inboxes
                .iter_mut()
                .rev()
                .find(|i| kinds[i.origin] == Kind::Healthy)
            {
                i.gone = true;
            }
        }
        let shared = inboxes.len();
        inboxes.push(Inbox {
            origin: 0,
            gone: false,
            entries: Vec::new(),
        });
        // Fan-out row k is entry k * step; the entries between go to the shared inbox.
        let rows = FAN_OUT + shared_rows;
        let step = rows / FAN_OUT;
        for entry in 0..rows {
            if entry % step == 0 && entry / step < FAN_OUT {
                for i in &mut inboxes[..shared] {
                    i.entries.push(entry);
                }
            } else {
                inboxes[shared].entries.push(entry);
            }
        }
        Plan {
            seed,
            kinds,
            inboxes,
            shared,
            rows,
        }
    }

    /// The latency the farm answers `entry` at `inbox` after, in µs.
    fn latency_us(&self, inbox: usize, entry: usize) -> u64 {
        let median = if inbox == self.shared {
            SHARED_MEDIAN_MS
        } else {
            MEDIAN_MS
        };
        let mut r = Rng(mix(self.seed ^ mix(((inbox as u64) << 32) | entry as u64)));
        let u1 = 1.0 - r.unit();
        let u2 = r.unit();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        ((median * (sigma() * z).exp()).min(CAP_MS) * 1000.0) as u64
    }

    fn path(&self, inbox: usize) -> String {
        if inbox == self.shared {
            "/inbox".into()
        } else {
            format!("/users/u{inbox}/inbox")
        }
    }

    fn inbox_of(&self, path: &str) -> Option<usize> {
        if path == "/inbox" {
            return Some(self.shared);
        }
        let i: usize = path
            .strip_prefix("/users/u")?
            .strip_suffix("/inbox")?
            .parse()
            .ok()?;
        (i < self.shared).then_some(i)
    }

    /// A lane that is answered 202 to every row.
    fn healthy(&self, inbox: usize) -> bool {
        let i = &self.inboxes[inbox];
        self.kinds[i.origin] == Kind::Healthy && !i.gone
    }

    fn lanes_of(&self, origin: usize) -> usize {
        self.inboxes.iter().filter(|i| i.origin == origin).count()
    }

    fn origins_of(&self, kind: Kind) -> Vec<usize> {
        (0..self.kinds.len())
            .filter(|&o| self.kinds[o] == kind)
            .collect()
    }

    /// The `enqueue` input: one JSON line per row, in entry order.
    fn input(&self, ports: &[u16]) -> String {
        let url = |i: usize| {
            format!(
                "\"http://127.0.0.1:{}{}\"",
                ports[self.inboxes[i].origin],
                self.path(i)
            )
        };
        let fan_out: Vec<String> = (0..self.shared).map(url).collect();
        let fan_out = fan_out.join(",");
        let mut out = String::new();
        let mut shared = self.inboxes[self.shared].entries.iter().peekable();
        for entry in 0..self.rows {
            let to = if shared.peek() == Some(&&entry) {
                shared.next();
                url(self.shared)
            } else {
                fan_out.clone()
            };
            let _ = writeln!(
                out,
                "{{\"id\":\"e{entry}\",\"to\":[{to}],\"body\":{}}}",
                String::from_utf8_lossy(&body(entry))
            );
        }
        out
    }
}

// ---------------------------------------------------------------------------------------
// The farm: the recipients, in a child process
// ---------------------------------------------------------------------------------------

/// Place-seconds until the last fan-out lane was complete (see [`Figures::places`]).
struct Places {
    end_s: f64,
    answering: f64,
    hanging: f64,
    /// Mean requests in flight to answering origins per [`BUCKET_S`] from 0.
    timeline: Vec<f64>,
    /// Mean connections held by hanging origins per [`BUCKET_S`] from 0.
    hanging_timeline: Vec<f64>,
}

struct Req {
    inbox: u32,
    entry: u32,
    arrived_us: u64,
    /// When the answer left (its planned time until then).
    done_us: u64,
    status: u16,
    answered: bool,
    dup: bool,
}

struct Farm {
    t0: Instant,
    /// Bumped by every reset: an answer of an earlier run does not touch this one's records.
    generation: u64,
    conns: Vec<(u32, u64)>,
    reqs: Vec<Req>,
    keys: HashSet<String>,
    stray: u64,
}

impl Farm {
    fn us(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }
}

type Shared = Arc<Mutex<Farm>>;

fn lock(farm: &Shared) -> std::sync::MutexGuard<'_, Farm> {
    farm.lock().unwrap_or_else(PoisonError::into_inner)
}

type Reply = hyper::Response<http_body_util::Full<hyper::body::Bytes>>;

async fn answer(
    plan: Arc<Plan>,
    farm: Shared,
    origin: usize,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<Reply, std::convert::Infallible> {
    use http_body_util::BodyExt as _;
    let reply = |status: u16| {
        let mut r = hyper::Response::new(http_body_util::Full::new(hyper::body::Bytes::new()));
        *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or_default();
        r
    };
    let inbox = plan.inbox_of(req.uri().path());
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => hyper::body::Bytes::new(),
    };
    let (inbox, entry) = match (inbox, entry_of(&bytes)) {
        (Some(i), Some(e)) if plan.inboxes[i].origin == origin => (i, e),
        _ => {
            lock(&farm).stray += 1;
            return Ok(reply(404));
        }
    };
    let latency = plan.latency_us(inbox, entry);
    let status = if plan.inboxes[inbox].gone { 410 } else { 202 };
    let (generation, index) = {
        let mut f = lock(&farm);
        let now = f.us();
        let dup = key.is_some_and(|k| !f.keys.insert(k));
        f.reqs.push(Req {
            inbox: inbox as u32,
            entry: entry as u32,
            arrived_us: now,
            done_us: now + latency,
            status,
            answered: false,
            dup,
        });
        (f.generation, f.reqs.len() - 1)
    };
    tokio::time::sleep(Duration::from_micros(latency)).await;
    {
        let mut f = lock(&farm);
        if f.generation == generation {
            let now = f.us();
            let r = &mut f.reqs[index];
            r.done_us = now;
            r.answered = true;
        }
    }
    Ok(reply(status))
}

/// Holds a connection without answering until the client gives up (or 10 minutes pass).
async fn hang(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt as _;
    let mut buf = vec![0_u8; 16 * 1024];
    let _ = tokio::time::timeout(Duration::from_secs(600), async {
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

async fn accept_loop(
    plan: Arc<Plan>,
    farm: Shared,
    origin: usize,
    listener: tokio::net::TcpListener,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                // Out of descriptors, say: do not spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        {
            let mut f = lock(&farm);
            let now = f.us();
            f.conns.push((origin as u32, now));
        }
        match plan.kinds[origin] {
            Kind::Dead => drop(stream),
            Kind::Hanging => {
                tokio::spawn(hang(stream));
            }
            Kind::Healthy => {
                let _ = stream.set_nodelay(true);
                let (plan, farm) = (Arc::clone(&plan), Arc::clone(&farm));
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        answer(Arc::clone(&plan), Arc::clone(&farm), origin, req)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
}

/// Everything recorded since the last reset, one record a line, then `end`.
fn dump(farm: &Shared) -> String {
    let f = lock(farm);
    let mut out = String::with_capacity(64 * (f.reqs.len() + f.conns.len()));
    for (o, t) in &f.conns {
        let _ = writeln!(out, "c {o} {t}");
    }
    for r in &f.reqs {
        let _ = writeln!(
            out,
            "r {} {} {} {} {} {} {}",
            r.inbox,
            r.entry,
            r.arrived_us,
            r.done_us,
            r.status,
            u8::from(r.answered),
            u8::from(r.dup)
        );
    }
    let _ = writeln!(out, "s {}", f.stray);
    out.push_str("end\n");
    out
}

/// The child: binds one port per origin, prints them, then takes `reset` and `stats` on
/// stdin until it closes (or an hour passes).
fn serve(seed: u64, scale: f64) -> Res<()> {
    let plan = Arc::new(Plan::new(seed, scale));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(3600));
        std::process::exit(0);
    });
    let farm: Shared = Arc::new(Mutex::new(Farm {
        t0: Instant::now(),
        generation: 0,
        conns: Vec::new(),
        reqs: Vec::new(),
        keys: HashSet::new(),
        stray: 0,
    }));
    rt.block_on(async {
        let mut ports = Vec::new();
        for origin in 0..plan.kinds.len() {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            ports.push(listener.local_addr()?.port().to_string());
            tokio::spawn(accept_loop(
                Arc::clone(&plan),
                Arc::clone(&farm),
                origin,
                listener,
            ));
        }
        println!("ports {}", ports.join(" "));
        std::io::stdout().flush()?;
        let control = Arc::clone(&farm);
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                let out = match line.trim() {
                    "reset" => {
                        let mut f = lock(&control);
                        f.t0 = Instant::now();
                        f.generation += 1;
                        f.conns.clear();
                        f.reqs.clear();
                        f.keys.clear();
                        f.stray = 0;
                        "ok\n".to_owned()
                    }
                    "stats" => dump(&control),
                    other => format!("unknown {other}\n"),
                };
                let mut stdout = std::io::stdout().lock();
                if stdout.write_all(out.as_bytes()).is_err() || stdout.flush().is_err() {
                    break;
                }
            }
            std::process::exit(0);
        });
        std::future::pending::<()>().await;
        Ok::<_, Box<dyn Error>>(())
    })
}

/// The parent's handle on the farm.
struct FarmProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    ports: Vec<u16>,
}

struct Dump {
    conns: Vec<(usize, u64)>,
    reqs: Vec<Req>,
    stray: u64,
}

impl FarmProcess {
    fn start(seed: u64, scale: f64) -> Res<FarmProcess> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["--serve", &seed.to_string(), &scale.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().ok_or("farm stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let ports = line
            .strip_prefix("ports ")
            .ok_or_else(|| format!("farm said {line:?}"))?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<Vec<u16>, _>>()?;
        Ok(FarmProcess {
            child,
            stdin,
            stdout,
            ports,
        })
    }

    fn ask(&mut self, what: &str) -> Res<()> {
        let stdin = self.stdin.as_mut().ok_or("farm stdin")?;
        stdin.write_all(format!("{what}\n").as_bytes())?;
        stdin.flush()?;
        Ok(())
    }

    fn reset(&mut self) -> Res<()> {
        self.ask("reset")?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        if line.trim() != "ok" {
            return Err(format!("farm reset: {line:?}").into());
        }
        Ok(())
    }

    fn stats(&mut self) -> Res<Dump> {
        self.ask("stats")?;
        let mut d = Dump {
            conns: Vec::new(),
            reqs: Vec::new(),
            stray: 0,
        };
        let mut line = String::new();
        loop {
            line.clear();
            if self.stdout.read_line(&mut line)? == 0 {
                return Err("farm closed its output".into());
            }
            let f: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|w| w.parse().ok())
                .collect();
            match (line.split_whitespace().next(), &f[..]) {
                (Some("end"), _) => return Ok(d),
                (Some("c"), &[o, t]) => d.conns.push((o as usize, t)),
                (Some("r"), &[inbox, entry, arrived_us, done_us, status, answered, dup]) => {
                    d.reqs.push(Req {
                        inbox: inbox as u32,
                        entry: entry as u32,
                        arrived_us,
                        done_us,
                        status: status as u16,
                        answered: answered == 1,
                        dup: dup == 1,
                    });
                }
                (Some("s"), &[stray]) => d.stray = stray,
                _ => return Err(format!("farm line {line:?}").into()),
            }
        }
    }
}

impl Drop for FarmProcess {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// One run
// ---------------------------------------------------------------------------------------

/// How the drain runs: its deadline and its `--concurrency`.
struct Settings {
    deadline: Duration,
    /// The `--concurrency` passed, or `None`: the binary's default.
    concurrency: Option<usize>,
    /// Deliveries in flight at most: the work bound's divisor.
    in_flight: usize,
}

impl Settings {
    fn describe(&self) -> String {
        match self.concurrency {
            Some(c) => format!("--concurrency {c}"),
            None => format!("default --concurrency ({})", self.in_flight),
        }
    }
}

/// The binary's default `--concurrency`, from its `drain --help` (`[default: N]`).
fn default_concurrency() -> Res<usize> {
    let out = Command::new(binary()).args(["drain", "--help"]).output()?;
    let help = String::from_utf8_lossy(&out.stdout);
    let after = help
        .split("--concurrency <")
        .nth(1)
        .ok_or("drain --help names no --concurrency")?;
    let n = after
        .split("[default: ")
        .nth(1)
        .and_then(|r| r.split(']').next())
        .ok_or("drain --help gives no default --concurrency")?;
    Ok(n.trim().parse()?)
}

/// The high-water mark of a live process's resident set (`VmHWM`), KiB.
fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// CPU time (user + system) of the waited-for children so far, in seconds.
fn children_cpu() -> f64 {
    match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN) {
        Ok(u) => {
            let s = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            s(u.user_time()) + s(u.system_time())
        }
        Err(_) => 0.0,
    }
}

/// The binary under test: this build's, or the one `FEDI_BIN` names (an A/B of two builds).
fn binary() -> String {
    std::env::var("FEDI_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_outbox-lanes").into())
}

/// Whether `outbox-lanes drain --help` names `flag`.
fn drain_has_flag(flag: &str) -> Res<bool> {
    let out = Command::new(binary()).args(["drain", "--help"]).output()?;
    Ok(String::from_utf8_lossy(&out.stdout).contains(flag))
}

fn sigterm(child: &Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
}

struct DeadOrigin {
    origin: usize,
    lanes: usize,
    conns: usize,
    early: usize,
}

/// What one run measured.
struct Figures {
    label: String,
    variant: String,
    secs: f64,
    ended: String,
    cpu: f64,
    /// The drain's peak RSS, KiB (`VmHWM` sampled every 50 ms while it ran).
    peak_rss_kib: u64,
    /// The untimed `enqueue` before it, seconds.
    enqueue_secs: f64,
    /// Deliveries in flight at most (the work bound's divisor).
    in_flight: usize,
    /// Per healthy lane: (ideal, actual) in seconds, actual `None` if not complete.
    lanes: Vec<(f64, Option<f64>)>,
    shared: (f64, Option<f64>),
    work_bound: f64,
    /// When the last healthy lane but the shared one was complete.
    fan_out_done: Option<f64>,
    /// The shared lane's rows answered by then.
    shared_by_then: usize,
    dead: Vec<DeadOrigin>,
    /// Per hanging origin: (origin, lanes, connections).
    hanging: Vec<(usize, usize, usize)>,
    /// Connections accepted by the answering origins (the client's reuse shows here).
    healthy_conns: usize,
    /// Until the last fan-out lane was complete: where the places went, as place-seconds
    /// (in flight x seconds) of requests to answering origins, and of connections to
    /// hanging origins (each held for the default timeout from its accept, cut at the end).
    places: Option<Places>,
    deliveries: usize,
    gone: usize,
    violations: usize,
    duplicates: usize,
    stray: u64,
    summary: String,
}

impl Figures {
    /// Healthy lanes' actual/ideal, ascending; an incomplete lane is infinite.
    fn ratios(&self) -> Vec<f64> {
        let mut r: Vec<f64> = self
            .lanes
            .iter()
            .map(|&(ideal, actual)| actual.map_or(f64::INFINITY, |a| a / ideal.max(1e-6)))
            .collect();
        r.sort_by(f64::total_cmp);
        r
    }
    fn complete(&self) -> usize {
        self.lanes.iter().filter(|l| l.1.is_some()).count()
    }
    fn makespan(&self) -> Option<f64> {
        self.lanes
            .iter()
            .map(|l| l.1)
            .try_fold(0.0_f64, |m, a| a.map(|a| m.max(a)))
    }
    fn max_ideal(&self) -> f64 {
        self.lanes.iter().map(|l| l.0).fold(0.0, f64::max)
    }
    fn dead_conns(&self) -> (usize, usize) {
        (
            self.dead.iter().map(|d| d.conns).sum(),
            self.dead.iter().map(|d| d.early).sum(),
        )
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn fmt_ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}")
    } else {
        "incomplete".into()
    }
}

enum Outcome {
    Ran(Box<Figures>),
    /// The binary refused the variant's flag.
    Unsupported(String),
}

fn run(
    plan: &Plan,
    farm: &mut FarmProcess,
    input: &str,
    variant: &str,
    label: String,
    settings: &Settings,
) -> Res<Outcome> {
    let deadline = settings.deadline;
    let bin = binary();
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("outbox.db");
    let db = db.to_str().ok_or("path")?;
    let enqueue_t0 = Instant::now();
    let mut enq = Command::new(&bin)
        .args(["--db", db, "enqueue", "--actor", ACTOR])
        .arg("--allow-private-destinations")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()?;
    enq.stdin
        .take()
        .ok_or("enqueue stdin")?
        .write_all(input.as_bytes())?;
    if !enq.wait()?.success() {
        return Err("enqueue failed".into());
    }
    let enqueue_secs = enqueue_t0.elapsed().as_secs_f64();
    let log = dir.path().join("drain.log");
    let mut args: Vec<String> = ["--db", db, "drain", "--actor", ACTOR]
        .into_iter()
        .map(str::to_owned)
        .collect();
    if let Some(c) = settings.concurrency {
        args.extend(["--concurrency".into(), c.to_string()]);
    }
    args.push("--allow-private-destinations".into());
    if variant == "before" {
        args.extend(["--host-failures".into(), "0".into()]);
    }
    farm.reset()?;
    let cpu0 = children_cpu();
    let t0 = Instant::now();
    // `FEDI_DRAIN_LOG=path`: the drain logs at `info` (each lane's backoff, probe and
    // recovery, each pass's end) and its log is kept at that path (the run's label added),
    // to see why a drain ended when it did.
    let keep_log = std::env::var("FEDI_DRAIN_LOG").ok();
    let mut child = Command::new(&bin)
        .args(&args)
        .env("RUST_LOG", if keep_log.is_some() { "info" } else { "warn" })
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    // Polled every 50 ms: the deadline, then SIGTERM, a second SIGTERM 2 s later (stop at
    // once), SIGKILL 10 s after the first.
    let tick = Duration::from_millis(50);
    let bound = (deadline + Duration::from_secs(12)).as_millis() / tick.as_millis() + 1;
    let mut stopped: Option<Instant> = None;
    let mut second = false;
    let mut status = None;
    let mut peak_rss_kib = 0;
    for _ in 0..bound {
        if let Some(k) = vm_hwm_kib(child.id()) {
            peak_rss_kib = peak_rss_kib.max(k);
        }
        if let Some(s) = child.try_wait()? {
            status = Some(s);
            break;
        }
        match stopped {
            None if t0.elapsed() >= deadline => {
                sigterm(&child);
                stopped = Some(Instant::now());
            }
            Some(at) if !second && at.elapsed() >= Duration::from_secs(2) => {
                sigterm(&child);
                second = true;
            }
            Some(at) if at.elapsed() >= Duration::from_secs(10) => {
                let _ = child.kill();
            }
            _ => {}
        }
        std::thread::sleep(tick);
    }
    let status = match status {
        Some(s) => s,
        None => {
            let _ = child.kill();
            child.wait()?
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    let cpu = children_cpu() - cpu0;
    if let Some(keep) = &keep_log {
        let to = format!("{keep}-{}", label.replace([' ', '/'], "-"));
        std::fs::copy(&log, &to)?;
        println!("  the drain's log: {to}");
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if status.code() == Some(2) && text.contains("unexpected argument") {
        let why = text
            .lines()
            .find(|l| l.contains("unexpected argument"))
            .unwrap_or_default()
            .trim()
            .to_owned();
        return Ok(Outcome::Unsupported(why));
    }
    let ended = match stopped {
        None => format!("ended by itself ({status})"),
        Some(_) => format!(
            "stopped at the {} s deadline ({status})",
            deadline.as_secs()
        ),
    };
    let summary = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
        .to_owned();
    let d = farm.stats()?;
    let mut f = figures(
        plan,
        &d,
        label,
        variant,
        secs,
        ended,
        cpu,
        summary,
        settings.in_flight,
    );
    f.peak_rss_kib = peak_rss_kib;
    f.enqueue_secs = enqueue_secs;
    Ok(Outcome::Ran(Box::new(f)))
}

#[allow(clippy::too_many_arguments)]
fn figures(
    plan: &Plan,
    d: &Dump,
    label: String,
    variant: &str,
    secs: f64,
    ended: String,
    cpu: f64,
    summary: String,
    in_flight: usize,
) -> Figures {
    let n = plan.inboxes.len();
    let mut max_seen: Vec<Option<u32>> = vec![None; n];
    let mut done: Vec<Vec<Option<u64>>> = plan
        .inboxes
        .iter()
        .map(|i| vec![None; i.entries.len()])
        .collect();
    let (mut violations, mut duplicates, mut deliveries, mut gone) = (0, 0, 0, 0);
    let mut work_us = 0_u64;
    for r in &d.reqs {
        let i = r.inbox as usize;
        if max_seen[i].is_some_and(|m| r.entry < m) {
            violations += 1;
        }
        max_seen[i] = max_seen[i].max(Some(r.entry));
        duplicates += usize::from(r.dup);
        if !r.answered {
            continue;
        }
        match r.status {
            202 => deliveries += 1,
            410 => gone += 1,
            _ => {}
        }
        if !r.dup {
            work_us += plan.latency_us(i, r.entry as usize);
        }
        if let Ok(k) = plan.inboxes[i].entries.binary_search(&(r.entry as usize)) {
            let slot = &mut done[i][k];
            *slot = Some(slot.map_or(r.done_us, |t| t.min(r.done_us)));
        }
    }
    let lane = |i: usize| {
        let ideal_us: u64 = plan.inboxes[i]
            .entries
            .iter()
            .map(|&e| plan.latency_us(i, e))
            .sum();
        let actual = done[i]
            .iter()
            .try_fold(0_u64, |m, t| t.map(|t| m.max(t)))
            .map(|us| us as f64 / 1e6);
        (ideal_us as f64 / 1e6, actual)
    };
    let lanes: Vec<(f64, Option<f64>)> = (0..n).filter(|&i| plan.healthy(i)).map(lane).collect();
    let fan_out_done = (0..plan.shared)
        .filter(|&i| plan.healthy(i))
        .map(|i| lane(i).1)
        .try_fold(0.0_f64, |m, a| a.map(|a| m.max(a)));
    let shared_by_then = fan_out_done.map_or(0, |t| {
        done[plan.shared]
            .iter()
            .filter(|d| d.is_some_and(|us| us as f64 / 1e6 <= t))
            .count()
    });
    let dead = plan
        .origins_of(Kind::Dead)
        .into_iter()
        .map(|origin| {
            let times: Vec<u64> = d
                .conns
                .iter()
                .filter(|c| c.0 == origin)
                .map(|c| c.1)
                .collect();
            DeadOrigin {
                origin,
                lanes: plan.lanes_of(origin),
                conns: times.len(),
                early: times
                    .iter()
                    .filter(|&&t| t < EARLY.as_micros() as u64)
                    .count(),
            }
        })
        .collect();
    let hanging = plan.origins_of(Kind::Hanging);
    let places = fan_out_done.map(|end_s| places(plan, d, end_s));
    Figures {
        places,
        label,
        variant: variant.to_owned(),
        secs,
        ended,
        cpu,
        peak_rss_kib: 0,
        enqueue_secs: 0.0,
        in_flight,
        lanes,
        shared: lane(plan.shared),
        work_bound: work_us as f64 / 1e6 / in_flight.max(1) as f64,
        fan_out_done,
        shared_by_then,
        dead,
        hanging: hanging
            .iter()
            .map(|&o| {
                let conns = d.conns.iter().filter(|c| c.0 == o).count();
                (o, plan.lanes_of(o), conns)
            })
            .collect(),
        healthy_conns: d
            .conns
            .iter()
            .filter(|c| plan.kinds[c.0] == Kind::Healthy)
            .count(),
        deliveries,
        gone,
        violations,
        duplicates,
        stray: d.stray,
        summary,
    }
}

/// Where the places went until `end_s`: each request to an answering origin holds one from
/// its arrival to its answer (or `end_s`), each connection to a hanging origin one for the
/// outbox's timeout from its accept.
fn places(plan: &Plan, d: &Dump, end_s: f64) -> Places {
    let end = (end_s * 1e6) as u64;
    let buckets = (end_s / BUCKET_S).ceil().max(1.0) as usize;
    let bucket = (BUCKET_S * 1e6) as u64;
    let mut timeline = vec![0.0_f64; buckets];
    let held = |from: u64, to: u64, timeline: &mut Vec<f64>| -> f64 {
        let (from, to) = (from.min(end), to.min(end));
        if to <= from {
            return 0.0;
        }
        for (b, slot) in timeline.iter_mut().enumerate() {
            let (lo, hi) = (b as u64 * bucket, (b as u64 + 1) * bucket);
            *slot += to.min(hi).saturating_sub(from.max(lo)) as f64 / 1e6;
        }
        (to - from) as f64 / 1e6
    };
    let mut answering = 0.0;
    for r in &d.reqs {
        let o = plan.inboxes[r.inbox as usize].origin;
        if plan.kinds[o] == Kind::Healthy {
            let to = if r.answered { r.done_us } else { end };
            answering += held(r.arrived_us, to, &mut timeline);
        }
    }
    let mut hanging_timeline = vec![0.0_f64; buckets];
    let hanging = d
        .conns
        .iter()
        .filter(|c| plan.kinds[c.0] == Kind::Hanging)
        .map(|c| held(c.1, c.1 + TIMEOUT_US, &mut hanging_timeline))
        .sum();
    for line in [&mut timeline, &mut hanging_timeline] {
        for (b, slot) in line.iter_mut().enumerate() {
            let width = (end_s - b as f64 * BUCKET_S).min(BUCKET_S);
            *slot /= width.max(1e-9);
        }
    }
    Places {
        end_s,
        answering,
        hanging,
        timeline,
        hanging_timeline,
    }
}

// ---------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------

fn print_run(f: &Figures) {
    let r = f.ratios();
    println!(
        "\n{}: {:.1} s, drain {}; drain CPU {:.1} s ({:.0} % of one core, {:.1} µs per answered request), peak RSS {:.1} MiB (VmHWM sampled every 50 ms); enqueue before it (untimed) {:.1} s",
        f.label,
        f.secs,
        f.ended,
        f.cpu,
        f.cpu / f.secs.max(1e-9) * 100.0,
        f.cpu * 1e6 / (f.deliveries + f.gone).max(1) as f64,
        f.peak_rss_kib as f64 / 1024.0,
        f.enqueue_secs
    );
    println!("  drain's last line: {}", f.summary);
    println!(
        "  healthy lanes complete: {} of {}; actual/ideal p50 {} p90 {} p99 {} max {}",
        f.complete(),
        f.lanes.len(),
        fmt_ratio(quantile(&r, 0.5)),
        fmt_ratio(quantile(&r, 0.9)),
        fmt_ratio(quantile(&r, 0.99)),
        fmt_ratio(quantile(&r, 1.0)),
    );
    println!(
        "  last fan-out lane complete at {} s, work bound {:.1} s (every answered row's latency / {} in flight); makespan {} s, largest ideal {:.1} s",
        secs(f.fan_out_done),
        f.work_bound,
        f.in_flight,
        secs(f.makespan()),
        f.max_ideal()
    );
    if let Some(p) = &f.places {
        let all = p.end_s * f.in_flight as f64;
        println!(
            "  places until then ({} x {:.1} s): answering origins' requests {:.1} %, hanging origins' connections {:.1} %, the rest (idle, dead origins) {:.1} %; mean in flight per {BUCKET_S} s to answering origins: {}; to hanging origins: {}",
            f.in_flight,
            p.end_s,
            p.answering / all * 100.0,
            p.hanging / all * 100.0,
            (all - p.answering - p.hanging) / all * 100.0,
            timeline(&p.timeline),
            timeline(&p.hanging_timeline),
        );
    }
    println!(
        "  sharedInbox lane: ideal {:.1} s, actual {} s, ratio {}; {} of its rows answered when the last fan-out lane was complete",
        f.shared.0,
        f.shared.1.map_or("-".into(), |a| format!("{a:.1}")),
        fmt_ratio(f.shared.1.map_or(f64::INFINITY, |a| a / f.shared.0)),
        f.shared_by_then
    );
    let (total, early) = f.dead_conns();
    println!(
        "  connections to dead origins: {total} ({early} in the first {} s); per dead origin (lanes: connections, first {} s): {}",
        EARLY.as_secs(),
        EARLY.as_secs(),
        f.dead
            .iter()
            .map(|d| format!(
                "#{} ({} lanes: {}, {})",
                d.origin, d.lanes, d.conns, d.early
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
    println!(
        "  hanging origins (lanes: connections): {}; answering origins: {} connections; deliveries (202) {}; 410s {}; order violations {}; duplicates {}; stray requests {}",
        f.hanging
            .iter()
            .map(|(o, lanes, conns)| format!("#{o} ({lanes} lanes: {conns})"))
            .collect::<Vec<_>>()
            .join("; "),
        f.healthy_conns,
        f.deliveries,
        f.gone,
        f.violations,
        f.duplicates,
        f.stray
    );
}

fn timeline(means: &[f64]) -> String {
    means
        .iter()
        .map(|m| format!("{m:.0}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn secs(t: Option<f64>) -> String {
    t.map_or("-".into(), |t| format!("{t:.1}"))
}

fn print_table(runs: &[Figures]) {
    println!(
        "\n| run | healthy lanes complete | actual/ideal p50 | p90 | p99 | max | sharedInbox actual/ideal | last fan-out lane, s (work bound) | makespan, s (largest ideal) | connections to dead origins (first 15 s) | deliveries | order violations | duplicates | drain, s | drain CPU, s | peak RSS, MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for f in runs {
        let r = f.ratios();
        let (total, early) = f.dead_conns();
        println!(
            "| {} | {} / {} | {} | {} | {} | {} | {} | {} ({:.1}) | {} ({:.1}) | {total} ({early}) | {} | {} | {} | {:.0} | {:.1} | {:.0} |",
            f.label,
            f.complete(),
            f.lanes.len(),
            fmt_ratio(quantile(&r, 0.5)),
            fmt_ratio(quantile(&r, 0.9)),
            fmt_ratio(quantile(&r, 0.99)),
            fmt_ratio(quantile(&r, 1.0)),
            fmt_ratio(f.shared.1.map_or(f64::INFINITY, |a| a / f.shared.0)),
            secs(f.fan_out_done),
            f.work_bound,
            secs(f.makespan()),
            f.max_ideal(),
            f.deliveries,
            f.violations,
            f.duplicates,
            f.secs,
            f.cpu,
            f.peak_rss_kib as f64 / 1024.0
        );
    }
}

fn color(variant: &str) -> &'static str {
    match variant {
        "before" => "#c0392b",
        _ => "#2a6fb0",
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;")
}

/// Two panels: the CDF of healthy lanes' actual/ideal (log scale), and the connections to
/// dead origins per run.
fn svg(runs: &[Figures], title: &str) -> String {
    let (w, h) = (1040.0, 420.0);
    let (x0, y0, pw, ph) = (60.0, 50.0, 480.0, 300.0);
    let finite = runs
        .iter()
        .flat_map(|f| f.ratios())
        .filter(|r| r.is_finite())
        .fold(1.0_f64, f64::max);
    let decades = finite.log10().ceil().max(1.0);
    let x = |r: f64| x0 + (r.max(1.0).log10() / decades).min(1.0) * pw;
    let y = |q: f64| y0 + ph - q * ph;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{x0}\" y=\"20\" font-weight=\"bold\">{}</text>\n\
         <text x=\"{x0}\" y=\"40\">healthy lanes: completion / ideal (serial bound), CDF; a variant's later rounds dashed</text>\n\
         <rect x=\"{x0}\" y=\"{y0}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#999\"/>\n",
        esc(title)
    );
    let ticks = (0..=(decades as i32))
        .flat_map(|k| [1.0, 2.0, 5.0].map(|m| m * 10_f64.powi(k)))
        .filter(|&r| r <= 10_f64.powf(decades));
    for r in ticks {
        let xx = x(r);
        let _ = write!(
            s,
            "<line x1=\"{xx:.1}\" y1=\"{y0}\" x2=\"{xx:.1}\" y2=\"{}\" stroke=\"#ddd\"/>\n\
             <text x=\"{xx:.1}\" y=\"{}\" text-anchor=\"middle\">{r}x</text>\n",
            y0 + ph,
            y0 + ph + 16.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">actual / ideal (log scale)</text>",
        x0 + pw / 2.0,
        y0 + ph + 34.0
    );
    for q in [0.0, 0.5, 0.9, 1.0] {
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{q}</text>",
            x0 - 6.0,
            y(q) + 4.0
        );
    }
    for (k, f) in runs.iter().enumerate() {
        let r = f.ratios();
        let n = r.len().max(1) as f64;
        let mut pts = format!("{:.1},{:.1}", x(1.0), y(0.0));
        for (i, v) in r.iter().enumerate().filter(|(_, v)| v.is_finite()) {
            let _ = write!(
                pts,
                " {:.1},{:.1} {:.1},{:.1}",
                x(*v),
                y(i as f64 / n),
                x(*v),
                y((i + 1) as f64 / n)
            );
        }
        // A variant's later rounds are dashed.
        let dash = if runs[..k].iter().any(|e| e.variant == f.variant) {
            " stroke-dasharray=\"5,3\""
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "<polyline points=\"{pts}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{dash}/>\n\
             <text x=\"{}\" y=\"{:.1}\" fill=\"{}\" text-anchor=\"end\">{}</text>",
            color(&f.variant),
            x0 + pw - 8.0,
            y0 + ph - 10.0 - 14.0 * k as f64,
            color(&f.variant),
            esc(&f.label)
        );
    }
    // The bars.
    let bx = x0 + pw + 170.0;
    let bw = w - bx - 110.0;
    let max = runs
        .iter()
        .map(|f| f.dead_conns().0)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let _ = writeln!(
        s,
        "<text x=\"{bx}\" y=\"40\">connections to dead origins (light: first {} s)</text>",
        EARLY.as_secs()
    );
    let bar = (ph / runs.len().max(1) as f64).min(30.0);
    for (k, f) in runs.iter().enumerate() {
        let (total, early) = f.dead_conns();
        let yy = y0 + k as f64 * bar;
        let (tw, ew) = (total as f64 / max * bw, early as f64 / max * bw);
        let c = color(&f.variant);
        let _ = writeln!(
            s,
            "<rect x=\"{bx}\" y=\"{yy:.1}\" width=\"{tw:.1}\" height=\"{:.1}\" fill=\"{c}\"/>\n\
             <rect x=\"{bx}\" y=\"{yy:.1}\" width=\"{ew:.1}\" height=\"{:.1}\" fill=\"white\" fill-opacity=\"0.5\"/>\n\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n\
             <text x=\"{:.1}\" y=\"{:.1}\">{total} ({early})</text>",
            bar - 4.0,
            bar - 4.0,
            bx - 6.0,
            yy + bar / 2.0 + 4.0,
            esc(&f.label),
            bx + tw + 4.0,
            yy + bar / 2.0 + 4.0
        );
    }
    s.push_str("</svg>\n");
    s
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--serve") {
        let seed = args.get(i + 1).ok_or("seed")?.parse()?;
        let scale = args.get(i + 2).ok_or("scale")?.parse()?;
        return serve(seed, scale);
    }
    // `cargo bench` passes `--bench`; nothing else is taken from the command line.
    let scale: f64 = std::env::var("FEDI_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s: &f64| *s > 0.0)
        .unwrap_or(1.0);
    let seed = env("FEDI_SEED", 1) as u64;
    let rounds = env("FEDI_ROUNDS", 1).max(1);
    let deadline = Duration::from_secs(env("FEDI_DEADLINE", 180) as u64);
    // `FEDI_CONCURRENCY`: a number, or `default` (no `--concurrency`: the binary's default).
    let settings = match std::env::var("FEDI_CONCURRENCY")
        .ok()
        .as_deref()
        .map(str::trim)
    {
        Some("default") => Settings {
            deadline,
            concurrency: None,
            in_flight: default_concurrency()?,
        },
        Some(c) => {
            let c: usize = c
                .parse()
                .map_err(|e| format!("FEDI_CONCURRENCY {c:?}: {e}"))?;
            Settings {
                deadline,
                concurrency: Some(c),
                in_flight: c,
            }
        }
        None => Settings {
            deadline,
            concurrency: Some(CONCURRENCY),
            in_flight: CONCURRENCY,
        },
    };
    let variants: Vec<String> = std::env::var("FEDI_VARIANTS")
        .unwrap_or_else(|_| "before,after".into())
        .split(',')
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect();
    if let Some(v) = variants.iter().find(|v| *v != "before" && *v != "after") {
        return Err(format!("FEDI_VARIANTS: {v:?} is neither before nor after").into());
    }
    let plan = Plan::new(seed, scale);
    let mut farm = FarmProcess::start(seed, scale)?;
    let dead = plan.origins_of(Kind::Dead);
    let hanging = plan.origins_of(Kind::Hanging);
    let healthy_lanes = (0..plan.inboxes.len()).filter(|&i| plan.healthy(i)).count();
    println!(
        "fediverse simulation, seed {seed}, scale {scale}: {} inboxes over {} origins (127.0.0.1, ports {}..), {} rows ({FAN_OUT} to every inbox but the shared one, {} to the sharedInbox lane), {} units",
        plan.inboxes.len(),
        plan.kinds.len(),
        farm.ports.first().copied().unwrap_or_default(),
        plan.rows,
        plan.inboxes[plan.shared].entries.len(),
        plan.inboxes.iter().map(|i| i.entries.len()).sum::<usize>()
    );
    println!(
        "  latency lognormal median {MEDIAN_MS} ms (sharedInbox {SHARED_MEDIAN_MS} ms), sigma {:.3}, cap {CAP_MS} ms; largest origin {} lanes",
        sigma(),
        plan.lanes_of(0)
    );
    println!(
        "  {healthy_lanes} healthy lanes; dead origins {:?} with {:?} lanes; hanging origins {:?} with {:?} lanes; {} inboxes answer 410",
        dead,
        dead.iter().map(|&o| plan.lanes_of(o)).collect::<Vec<_>>(),
        hanging,
        hanging
            .iter()
            .map(|&o| plan.lanes_of(o))
            .collect::<Vec<_>>(),
        plan.inboxes.iter().filter(|i| i.gone).count()
    );
    println!(
        "  outbox: `outbox-lanes drain {}--allow-private-destinations` ({}; other settings default; `before` adds `--host-failures 0`), SQLite file; deadline {} s; variants {variants:?} x {rounds} round(s)",
        settings
            .concurrency
            .map_or(String::new(), |c| format!("--concurrency {c} ")),
        settings.describe(),
        deadline.as_secs()
    );
    let health = drain_has_flag("--host-failures")?;
    if !health {
        println!(
            "  this binary's `drain --help` has no `--host-failures`: it has no origin health, so `after` is today's behaviour"
        );
    }
    let input = plan.input(&farm.ports);
    let mut runs = Vec::new();
    let mut unsupported: Vec<String> = Vec::new();
    for round in 1..=rounds {
        for v in &variants {
            if unsupported.contains(v) {
                continue;
            }
            // Without the flag, `after` is the binary as it is: say so on every figure.
            let name = if v == "after" && !health {
                "no origin health"
            } else {
                v.as_str()
            };
            let label = if rounds > 1 {
                format!("{name} {round}")
            } else {
                name.to_owned()
            };
            match run(&plan, &mut farm, &input, v, label, &settings)? {
                Outcome::Ran(f) => {
                    print_run(&f);
                    runs.push(*f);
                }
                Outcome::Unsupported(why) => {
                    println!(
                        "\n{v}: not available: this binary refuses `--host-failures` ({why}); origin health is not in it, so `before` is skipped and `after` is today's behaviour"
                    );
                    unsupported.push(v.clone());
                }
            }
        }
    }
    if runs.is_empty() {
        return Ok(());
    }
    print_table(&runs);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/fediverse.svg");
    let title = format!(
        "{} inboxes over {} origins, seed {seed}, drain {}",
        plan.inboxes.len(),
        plan.kinds.len(),
        settings.describe()
    );
    std::fs::write(path, svg(&runs, &title))?;
    println!("\nchart: {path}");
    Ok(())
}
