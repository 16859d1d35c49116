//! End-to-end figures on 127.0.0.1 against the strongest honest baseline (a bench binary
//! that prints them; `harness = false`).
//!
//! The recipients are a hyper server in a **child process** (this same binary with
//! `--serve`), so their CPU is not counted as ours. It answers every POST with 200 — at once,
//! or after the delay its path names (`/d100/...`: 100 ms) — and counts, per inbox (and per
//! ordering key the body names), order violations (an entry below one already seen) and
//! duplicates (an `Idempotency-Key` seen twice).
//!
//! Each case runs the outbox (SQLite file; tokio runtime, the `outbox-lanes` binary, and the
//! blocking runtime where noted) and two limits posting the same requests from memory at the
//! same concurrency, to the same server, in the same run:
//!
//! - **the same-client limit**: the HTTP client the outbox uses (`AsyncHttpClient` over
//!   hyper-util; `HttpClient` over ureq for the blocking runtime), which isolates what the
//!   outbox adds on top of its client;
//! - **the hyper limit** (tokio cases): a bare hyper-util client, one request in flight per
//!   worker, the plainest client that keeps per-recipient order; which also counts what the
//!   client layer itself costs.
//!
//! All report deliveries/s and CPU time per delivery (user + system from `getrusage` of this
//! process, or of the binary's process, around the drain; the enqueue before it is not
//! timed). Runs inside this process also report, per delivery, their allocations and bytes
//! allocated (the bench's global allocator is the system's behind `stats_alloc`, which
//! counts) and context switches (`getrusage`): what one delivery costs besides its request.
//!
//! - (a) 100 recipients answering at once, 2,000 rows each (200,000 deliveries), 100 in flight;
//!   also the `outbox-lanes drain --concurrency 100` binary on the same rows, against the
//!   hyper limit in `E2E_ROUNDS` (default 5) alternating rounds, its row the round of the
//!   median ratio;
//! - (p) the binary on Postgres against the binary on SQLite, 100 recipients answering at once,
//!   500 rows each, alternately `E2E_PG_ROUNDS` (default 2) times (when `OUTBOX_LANES_TEST_PG`
//!   names the server; the CPU is the relay process's, and the Postgres server's processes'
//!   CPU during the drain is printed beside it, read from `/proc`);
//! - (b) 1,000 recipients answering after 100 ms, 20 rows each, 1,000 in flight; also the
//!   `outbox-lanes drain --concurrency 1000` binary on the same rows;
//! - (c) 1 recipient answering at once, 2,000 rows (one lane: one in flight; the limits post
//!   them one at a time too); also the binary, against the hyper limit in `E2E_ROUNDS`
//!   (default 5) alternating rounds, its row the round of the median ratio;
//! - (d) one recipient 150 ms away, 1,000 rows over 100 ordering keys with a per-host cap of 8,
//!   against the same rows in one lane (shortened to 200 rows: a lane is capped at one row
//!   per round trip, 30 s for 200);
//! - (l) the delivery log's cost: the binary (`drain --concurrency 100`, the load of (a)) with
//!   the log on (the default) and off (`--delivery-log-retention 0s`), alternately,
//!   `E2E_ROUNDS` (default 5) rounds each, on SQLite and (when `OUTBOX_LANES_TEST_PG` is set)
//!   on Postgres; prints every round's CPU µs per delivery and deliveries/s, and the medians;
//! - (e) a backlog of `E2E_BACKLOG` (default 1,000,000) units over 1,000 recipients answering at
//!   once, drained with 1,000 in flight, in a child process of its own: deliveries/s and
//!   peak RSS;
//! - (w) one row to `E2E_WIDE` (default 100,000) recipients, distinct paths of the one server
//!   answering at once, through the binary: `enqueue` into a fresh SQLite file, then `drain
//!   --concurrency E2E_WIDE_CONCURRENCY` (default 256, the binary's default), each run under
//!   a wrapper process (this binary with `--measure`) whose `getrusage(RUSAGE_CHILDREN)` is
//!   that one child's: time, peak RSS and CPU (user + system) of the enqueue and of the drain;
//!   checks that every recipient got the row exactly once (requests, distinct paths, repeated
//!   `Idempotency-Key`s at the server); against the hyper limit with as many workers,
//!   `E2E_WIDE_ROUNDS` (default 1) alternating rounds. Not in the default set:
//!   `E2E_CASES=w`.
//!
//! `cargo bench --bench e2e`; `E2E_SCALE=0.1` shrinks (a)–(d), `E2E_BACKLOG=N` sizes (e),
//! `E2E_WIDE=N` sizes (w), `E2E_CASES=a,c` picks cases, `E2E_BIN` runs another build of the binary. It writes
//! `benches/e2e.svg` (deliveries/s as a fraction of the limit, and CPU µs per delivery,
//! outbox vs limit, per case): hand-written SVG, since a plotting crate would be compiled by
//! every `clippy --all-targets` run for one chart.
//! Every loop is bounded; all traffic stays on 127.0.0.1.

use std::collections::{HashMap, HashSet};
use std::error::Error;
use std::io::{BufRead as _, Read as _, Write as _};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use outbox_lanes::blocking::http::{Bytes, Destination};
use outbox_lanes::core::UnitId;
use outbox_lanes::store::{NewRow, SqliteOptions, SqliteStore, Store};

type Res<T> = Result<T, Box<dyn Error>>;

/// A size from the environment, or `default`.
fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------
// Measuring
// ---------------------------------------------------------------------------------------

/// CPU time (user + system) of this process so far, in µs.
fn cpu_us(who: nix::sys::resource::UsageWho) -> u64 {
    match nix::sys::resource::getrusage(who) {
        Ok(u) => {
            let us =
                |t: nix::sys::time::TimeVal| (t.tv_sec() as u64) * 1_000_000 + t.tv_usec() as u64;
            us(u.user_time()) + us(u.system_time())
        }
        Err(_) => 0,
    }
}

fn self_cpu() -> u64 {
    cpu_us(nix::sys::resource::UsageWho::RUSAGE_SELF)
}

/// Peak RSS of this process, KiB.
fn peak_rss_kib() -> u64 {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .map_or(0, |u| u.max_rss() as u64)
}

/// The bench's allocator: the system's, counting every allocation (`stats_alloc`: atomic
/// adds, paid alike by the outbox and the limits), so that a run can say what one delivery
/// allocates.
#[global_allocator]
static COUNTING: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

/// What this process has used so far: CPU (µs), allocations (with reallocations), bytes
/// asked for, and context switches (voluntary: a thread blocked, to be woken by another;
/// involuntary: preempted).
#[derive(Clone, Copy, Debug, Default)]
struct Hops {
    cpu_us: u64,
    allocs: u64,
    alloc_bytes: u64,
    voluntary: u64,
    involuntary: u64,
}

impl Hops {
    fn now() -> Hops {
        let (voluntary, involuntary) = nix::sys::resource::getrusage(
            nix::sys::resource::UsageWho::RUSAGE_SELF,
        )
        .map_or((0, 0), |u| {
            (
                u.voluntary_context_switches() as u64,
                u.involuntary_context_switches() as u64,
            )
        });
        let stats = COUNTING.stats();
        Hops {
            cpu_us: self_cpu(),
            allocs: (stats.allocations + stats.reallocations) as u64,
            alloc_bytes: stats.bytes_allocated as u64,
            voluntary,
            involuntary,
        }
    }

    fn since(self, before: Hops) -> Hops {
        Hops {
            cpu_us: self.cpu_us.saturating_sub(before.cpu_us),
            allocs: self.allocs.saturating_sub(before.allocs),
            alloc_bytes: self.alloc_bytes.saturating_sub(before.alloc_bytes),
            voluntary: self.voluntary.saturating_sub(before.voluntary),
            involuntary: self.involuntary.saturating_sub(before.involuntary),
        }
    }
}

/// One measured run.
#[derive(Clone, Debug, Default)]
struct Run {
    deliveries: usize,
    secs: f64,
    cpu_us: u64,
    violations: u64,
    duplicates: u64,
    /// The Postgres server's CPU (all its processes) during the drain, µs; 0 on SQLite.
    server_cpu_us: u64,
    /// An in-process run's allocations and context switches (none for a child process).
    hops: Option<Hops>,
}

impl Run {
    fn rate(&self) -> f64 {
        self.deliveries as f64 / self.secs.max(1e-9)
    }
    fn cpu_per(&self) -> f64 {
        self.cpu_us as f64 / self.deliveries.max(1) as f64
    }
    fn server_cpu_per(&self) -> f64 {
        self.server_cpu_us as f64 / self.deliveries.max(1) as f64
    }
}

/// CPU time (user + system) of every `postgres` process on this machine so far, in µs, with
/// what the reaped backends used (the postmaster's `cutime` + `cstime`); from `/proc`. A
/// backend that ends between two readings moves its time from its own entry to its parent's.
fn postgres_cpu_us() -> u64 {
    // `/proc` counts in USER_HZ, which Linux fixes at 100 for user space.
    const TICK: u64 = 100;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut ticks = 0;
    for e in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: fields after the command's closing parenthesis.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if !head.ends_with("(postgres") {
            continue;
        }
        let f: Vec<u64> = rest
            .split_whitespace()
            .skip(11)
            .take(4)
            .filter_map(|x| x.parse().ok())
            .collect();
        ticks += f.iter().sum::<u64>();
    }
    ticks * 1_000_000 / TICK
}

// ---------------------------------------------------------------------------------------
// The recipients: a hyper server in a child process
// ---------------------------------------------------------------------------------------

#[derive(Default)]
struct Tally {
    requests: u64,
    violations: u64,
    duplicates: u64,
    last: HashMap<String, u64>,
    keys: HashSet<String>,
    cpu_base: u64,
}

/// `{"entry":N}` or `{"entry":N,"lane":"K"}`.
fn parse_body(b: &[u8]) -> (Option<u64>, Option<String>) {
    let s = String::from_utf8_lossy(b);
    let entry = s.split("\"entry\":").nth(1).and_then(|r| {
        r.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .ok()
    });
    let lane = s
        .split("\"lane\":\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .map(str::to_owned);
    (entry, lane)
}

/// `/d150/inbox` answers after 150 ms.
fn delay_of(path: &str) -> Duration {
    path.strip_prefix("/d")
        .and_then(|r| r.split('/').next())
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::ZERO, Duration::from_millis)
}

async fn handle(
    tally: Arc<Mutex<Tally>>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<http_body_util::Full<hyper::body::Bytes>>, std::convert::Infallible> {
    use http_body_util::BodyExt as _;
    let path = req.uri().path().to_owned();
    let text =
        |s: String| hyper::Response::new(http_body_util::Full::new(hyper::body::Bytes::from(s)));
    if path == "/stats" {
        let t = tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let cpu = self_cpu().saturating_sub(t.cpu_base);
        return Ok(text(format!(
            "{} {} {} {} {}",
            t.requests,
            t.violations,
            t.duplicates,
            cpu,
            t.last.len()
        )));
    }
    if path == "/reset" {
        let mut t = tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *t = Tally {
            cpu_base: self_cpu(),
            ..Tally::default()
        };
        return Ok(text(String::new()));
    }
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => hyper::body::Bytes::new(),
    };
    let (entry, lane) = parse_body(&body);
    {
        let mut t = tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        t.requests += 1;
        if let Some(k) = key {
            if !t.keys.insert(k) {
                t.duplicates += 1;
            }
        }
        if let Some(e) = entry {
            let order_key = match lane {
                Some(l) => format!("{path}#{l}"),
                None => path.clone(),
            };
            let last = t.last.entry(order_key).or_insert(0);
            let violated = e < *last;
            *last = (*last).max(e);
            if violated {
                t.violations += 1;
            }
        }
    }
    let d = delay_of(&path);
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
    Ok(text(String::new()))
}

/// The child process: serves on 127.0.0.1 until its stdin closes (or an hour passes).
fn serve() -> Res<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::spawn(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        std::process::exit(0);
    });
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(3600));
        std::process::exit(0);
    });
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("{}", listener.local_addr()?.port());
        std::io::stdout().flush()?;
        let tally = Arc::new(Mutex::new(Tally {
            cpu_base: self_cpu(),
            ..Tally::default()
        }));
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let tally = Arc::clone(&tally);
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req| handle(Arc::clone(&tally), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

struct Server {
    child: std::process::Child,
    port: u16,
}

struct Stats {
    requests: u64,
    violations: u64,
    duplicates: u64,
    /// The recipients' own CPU since the last reset.
    cpu_us: u64,
    /// Distinct inboxes (and ordering keys) that got a request since the last reset.
    paths: u64,
}

impl Server {
    fn start() -> Res<Server> {
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .arg("--serve")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let mut port = String::new();
        std::io::BufReader::new(child.stdout.take().ok_or("child stdout")?).read_line(&mut port)?;
        Ok(Server {
            port: port.trim().parse()?,
            child,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn get(&self, path: &str) -> Res<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned())
    }

    fn reset(&self) -> Res<()> {
        self.get("/reset").map(|_| ())
    }

    fn stats(&self) -> Res<Stats> {
        let body = self.get("/stats")?;
        let n: Vec<u64> = body
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        match n[..] {
            [requests, violations, duplicates, cpu_us, paths] => Ok(Stats {
                requests,
                violations,
                duplicates,
                cpu_us,
                paths,
            }),
            _ => Err(format!("bad stats: {body:?}").into()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// Workloads
// ---------------------------------------------------------------------------------------

/// A case's rows (the outbox's input) and the same requests flattened (the limit's), their
/// URLs parsed and bodies shared ahead, as a pass has them.
struct Load {
    rows: Vec<NewRow>,
    requests: Vec<(Arc<Destination>, Bytes)>,
    /// The same requests' URLs as hyper's parsed `Uri`s, for the bare hyper client.
    uris: Vec<hyper::Uri>,
}

fn body(entry: usize, lane: Option<&str>) -> Vec<u8> {
    match lane {
        Some(l) => format!("{{\"entry\":{entry},\"lane\":\"{l}\"}}").into_bytes(),
        None => format!("{{\"entry\":{entry}}}").into_bytes(),
    }
}

/// `rows` rows, each to every one of `to`; with `keys`, row i carries ordering key `k{i % keys}`.
fn load(to: &[String], rows: usize, keys: Option<usize>) -> Load {
    let mut out = Load {
        rows: Vec::with_capacity(rows),
        requests: Vec::with_capacity(rows * to.len()),
        uris: Vec::with_capacity(rows * to.len()),
    };
    let destinations: Vec<Arc<Destination>> =
        to.iter().map(|r| Arc::new(Destination::parse(r))).collect();
    let uris: Vec<hyper::Uri> = to
        .iter()
        .map(|r| r.parse().expect("a bench URL parses"))
        .collect();
    for i in 0..rows {
        let key = keys.map(|k| format!("k{}", i % k));
        let b = body(i, key.as_deref());
        let shared = Bytes::from(b.clone());
        for (d, u) in destinations.iter().zip(&uris) {
            out.requests.push((Arc::clone(d), shared.clone()));
            out.uris.push(u.clone());
        }
        out.rows.push(NewRow {
            id: format!("e{i}"),
            body: b,
            content_type: "application/json".into(),
            recipients: to.to_vec(),
            ordering_key: key,
            ..NewRow::default()
        });
    }
    out
}

fn config(concurrency: usize, per_host: Option<usize>) -> outbox_lanes::tokio::OutboxConfig {
    let mut c = outbox_lanes::tokio::OutboxConfig::default().allow_loopback();
    c.concurrency = concurrency;
    c.per_host = per_host;
    c.http.timeout = Duration::from_secs(10);
    c.time_slice = Duration::from_secs(3600);
    c
}

fn open_store(dir: &tempfile::TempDir) -> Res<Arc<dyn Store>> {
    Ok(Arc::new(SqliteStore::open(
        dir.path().join("outbox.db"),
        SqliteOptions::default(),
    )?))
}

/// [`finish`] for a run in this process, with what it allocated and switched.
fn finish_in_process(server: &Server, deliveries: usize, secs: f64, hops: Hops) -> Res<Run> {
    let mut run = finish(server, deliveries, secs, hops.cpu_us)?;
    run.hops = Some(hops);
    Ok(run)
}

fn finish(server: &Server, deliveries: usize, secs: f64, cpu_us: u64) -> Res<Run> {
    let st = server.stats()?;
    if st.requests < deliveries as u64 {
        return Err(format!("{} of {deliveries} requests arrived", st.requests).into());
    }
    Ok(Run {
        deliveries,
        secs,
        cpu_us,
        violations: st.violations,
        duplicates: st.duplicates,
        server_cpu_us: 0,
        hops: None,
    })
}

/// The outbox on the tokio runtime: enqueue (untimed), then one drain, timed.
fn tokio_outbox(
    server: &Server,
    l: &Load,
    concurrency: usize,
    per_host: Option<usize>,
) -> Res<Run> {
    let dir = tempfile::tempdir()?;
    let store = open_store(&dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let units = l.requests.len();
    let (secs, cpu) = rt.block_on(async {
        let outbox =
            outbox_lanes::tokio::Outbox::open(Arc::clone(&store), config(concurrency, per_host))?;
        let per_chunk = (2000 / l.rows[0].recipients.len()).max(1);
        for chunk in l.rows.chunks(per_chunk) {
            outbox.enqueue("bench", chunk).await?;
        }
        server.reset()?;
        let (h0, t0) = (Hops::now(), Instant::now());
        outbox.drain("bench").await?;
        let r = (t0.elapsed().as_secs_f64(), Hops::now().since(h0));
        outbox.shutdown().await;
        Ok::<_, Box<dyn Error>>(r)
    })?;
    finish_in_process(server, units, secs, cpu)
}

/// The limit on tokio: the outbox's own client, the same requests from memory,
/// `concurrency` in flight.
fn tokio_limit(server: &Server, l: &Load, concurrency: usize) -> Res<Run> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let requests = Arc::new(l.requests.clone());
    let (secs, cpu) = rt.block_on(async {
        let http = outbox_lanes::tokio::AsyncHttpClient::new(config(concurrency, None).http, None)?;
        server.reset()?;
        let next = Arc::new(AtomicUsize::new(0));
        let (h0, t0) = (Hops::now(), Instant::now());
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..concurrency.min(requests.len()) {
            let (http, requests, next) = (http.clone(), Arc::clone(&requests), Arc::clone(&next));
            tasks.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((to, b)) = requests.get(i) else {
                        return Ok::<(), String>(());
                    };
                    let d = outbox_lanes::blocking::http::Delivery {
                        actor: "bench",
                        outbox: "0123abcd",
                        unit: UnitId(i as u64 + 1),
                        recipient: to,
                        body: b,
                        content_type: "application/json",
                        headers: &[],
                        attempt: 1,
                    };
                    let r = http.deliver(&d, SystemTime::now()).await;
                    if !r.outcome.is_delivered() {
                        return Err(format!("{r:?}"));
                    }
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r??;
        }
        Ok::<_, Box<dyn Error>>((t0.elapsed().as_secs_f64(), Hops::now().since(h0)))
    })?;
    finish_in_process(server, requests.len(), secs, cpu)
}

/// The strong limit: a bare hyper-util client (HTTP/1.1, pooled keep-alive connections, no
/// proxy, no redirects, no TLS set-up), the same requests from memory with the headers the
/// outbox sends (`Content-Type`, `Idempotency-Key`, `User-Agent`), `concurrency` in flight,
/// each worker one request at a time. The plainest client that keeps per-recipient order.
fn hyper_limit(server: &Server, l: &Load, concurrency: usize) -> Res<Run> {
    use http_body_util::BodyExt as _;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let requests = Arc::new(
        l.uris
            .iter()
            .zip(&l.requests)
            .map(|(u, (_, b))| (u.clone(), hyper::body::Bytes::from(b.to_vec())))
            .collect::<Vec<_>>(),
    );
    let (secs, cpu) = rt.block_on(async {
        let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
        connector.set_nodelay(true);
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_max_idle_per_host(usize::MAX)
                .build::<_, http_body_util::Full<hyper::body::Bytes>>(connector);
        server.reset()?;
        let next = Arc::new(AtomicUsize::new(0));
        let (h0, t0) = (Hops::now(), Instant::now());
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..concurrency.min(requests.len()) {
            let (client, requests, next) =
                (client.clone(), Arc::clone(&requests), Arc::clone(&next));
            tasks.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((uri, b)) = requests.get(i) else {
                        return Ok::<(), String>(());
                    };
                    let req = hyper::Request::post(uri.clone())
                        .header("content-type", "application/json")
                        .header("idempotency-key", format!("0123abcd-{}", i + 1))
                        .header("user-agent", "outbox-lanes-bench")
                        .body(http_body_util::Full::new(b.clone()))
                        .map_err(|e| e.to_string())?;
                    let res = client.request(req).await.map_err(|e| e.to_string())?;
                    let status = res.status();
                    res.into_body().collect().await.map_err(|e| e.to_string())?;
                    if !status.is_success() {
                        return Err(format!("status {status}"));
                    }
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r??;
        }
        Ok::<_, Box<dyn Error>>((t0.elapsed().as_secs_f64(), Hops::now().since(h0)))
    })?;
    finish_in_process(server, requests.len(), secs, cpu)
}

/// The outbox on the blocking runtime.
fn blocking_outbox(server: &Server, l: &Load, concurrency: usize) -> Res<Run> {
    let dir = tempfile::tempdir()?;
    let store = open_store(&dir)?;
    let outbox = outbox_lanes::blocking::Outbox::open(store, config(concurrency, None))?;
    let per_chunk = (2000 / l.rows[0].recipients.len()).max(1);
    for chunk in l.rows.chunks(per_chunk) {
        outbox.enqueue("bench", chunk)?;
    }
    server.reset()?;
    let (h0, t0) = (Hops::now(), Instant::now());
    outbox.drain("bench")?;
    let (secs, hops) = (t0.elapsed().as_secs_f64(), Hops::now().since(h0));
    outbox.shutdown();
    finish_in_process(server, l.requests.len(), secs, hops)
}

/// The limit of the blocking runtime: its ureq client, `concurrency` threads.
fn blocking_limit(server: &Server, l: &Load, concurrency: usize) -> Res<Run> {
    let http = outbox_lanes::blocking::HttpClient::new(config(concurrency, None).http, None)?;
    server.reset()?;
    let requests = &l.requests;
    let next = AtomicUsize::new(0);
    let (h0, t0) = (Hops::now(), Instant::now());
    std::thread::scope(|s| {
        for _ in 0..concurrency.min(requests.len()) {
            let (http, next) = (http.clone(), &next);
            s.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((to, b)) = requests.get(i) else {
                        return;
                    };
                    let d = outbox_lanes::blocking::http::Delivery {
                        actor: "bench",
                        outbox: "0123abcd",
                        unit: UnitId(i as u64 + 1),
                        recipient: to,
                        body: b,
                        content_type: "application/json",
                        headers: &[],
                        attempt: 1,
                    };
                    let _ = http.deliver(&d, SystemTime::now());
                }
            });
        }
    });
    let (secs, hops) = (t0.elapsed().as_secs_f64(), Hops::now().since(h0));
    finish_in_process(server, requests.len(), secs, hops)
}

/// The `outbox-lanes` binary: `enqueue`, then `drain --concurrency N`, timed; its CPU from
/// `getrusage(RUSAGE_CHILDREN)`.
fn binary_drain(server: &Server, l: &Load, concurrency: usize) -> Res<Run> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("outbox.db");
    binary_drain_on(server, l, concurrency, &[db.to_str().ok_or("path")?])
}

/// [`binary_drain`] on the Postgres database at `url`, in a schema of its own (dropped after).
fn binary_drain_pg(server: &Server, l: &Load, concurrency: usize, url: &str) -> Res<Run> {
    let schema = format!("ol_bench_e2e_{}", std::process::id());
    let url = outbox_lanes_test_support::pg_url_without_tls(url);
    let run = binary_drain_on(server, l, concurrency, &[&url, "--pg-schema", &schema]);
    let mut c = postgres::Client::connect(&url, postgres::NoTls)?;
    c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))?;
    run
}

/// Case (l): the binary with the delivery log on and off, alternately, `E2E_ROUNDS` rounds;
/// `pg`: on that Postgres server instead of a SQLite file. Prints each round and the medians
/// of CPU µs per delivery and deliveries/s.
fn delivery_log_rounds(server: &Server, l: &Load, pg: Option<&str>) -> Res<()> {
    let rounds = env("E2E_ROUNDS", 5).max(1);
    let on_db = |extra: &[&str]| -> Res<Run> {
        match pg {
            None => {
                let dir = tempfile::tempdir()?;
                let db = dir.path().join("outbox.db");
                let mut args = vec![db.to_str().ok_or("path")?];
                args.extend_from_slice(extra);
                binary_drain_on(server, l, 100, &args)
            }
            Some(url) => {
                let schema = format!("ol_bench_log_{}", std::process::id());
                let url = outbox_lanes_test_support::pg_url_without_tls(url);
                let mut args = vec![url.as_str(), "--pg-schema", schema.as_str()];
                args.extend_from_slice(extra);
                let run = binary_drain_on(server, l, 100, &args);
                let mut c = postgres::Client::connect(&url, postgres::NoTls)?;
                c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))?;
                run
            }
        }
    };
    let (mut on, mut off) = (Vec::new(), Vec::new());
    let store = if pg.is_some() { "Postgres" } else { "SQLite" };
    for round in 0..rounds {
        // Alternate which goes first, so that neither always runs on a warmer machine.
        let order: [bool; 2] = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for log in order {
            let run = if log {
                on_db(&[])?
            } else {
                on_db(&["--delivery-log-retention", "0s"])?
            };
            println!(
                "(l) {store} round {round}: log {}: {:.1} us CPU per delivery{}, {:.0} deliveries/s",
                if log { "on " } else { "off" },
                run.cpu_per(),
                if pg.is_some() {
                    format!(" (the Postgres server's {:.1} us)", run.server_cpu_per())
                } else {
                    String::new()
                },
                run.rate()
            );
            if log { &mut on } else { &mut off }.push(run);
        }
    }
    let median = |v: &mut Vec<Run>, f: fn(&Run) -> f64| {
        let mut x: Vec<f64> = v.iter().map(f).collect();
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    let (cpu_on, cpu_off) = (
        median(&mut on, Run::cpu_per),
        median(&mut off, Run::cpu_per),
    );
    let (rate_on, rate_off) = (median(&mut on, Run::rate), median(&mut off, Run::rate));
    println!(
        "(l) {store}, {} deliveries a round, medians of {rounds} rounds: log on {cpu_on:.1} us CPU per delivery ({rate_on:.0}/s), off {cpu_off:.1} ({rate_off:.0}/s): {:+.1} % CPU per delivery",
        l.requests.len(),
        (cpu_on / cpu_off - 1.0) * 100.0
    );
    Ok(())
}

/// The binary's `enqueue` input for `l`'s rows: one JSON line a row.
fn enqueue_input(l: &Load) -> String {
    let mut lines = String::new();
    for r in &l.rows {
        let to: Vec<String> = r.recipients.iter().map(|u| format!("\"{u}\"")).collect();
        lines.push_str(&format!(
            "{{\"id\":\"{}\",\"to\":[{}],\"body\":{}}}\n",
            r.id,
            to.join(","),
            String::from_utf8_lossy(&r.body)
        ));
    }
    lines
}

/// The binary under test: this build's, or `E2E_BIN`.
fn bin_path() -> String {
    std::env::var("E2E_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_outbox-lanes").into())
}

/// What one child process used, as its wrapper (`--measure`) saw it.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    /// From its start to its exit.
    secs: f64,
    /// Its peak resident set (`ru_maxrss`), KiB.
    peak_rss_kib: u64,
    user_us: u64,
    sys_us: u64,
}

impl Usage {
    fn cpu_us(&self) -> u64 {
        self.user_us + self.sys_us
    }
}

/// `--measure BIN ARGS...` (a child of the bench): runs `BIN ARGS...` (stdin and stderr
/// inherited, stdout discarded), waits for it, and prints `measure <exit code> <wall µs>
/// <peak RSS KiB> <user µs> <system µs>`. This process has no other child, so its
/// `getrusage(RUSAGE_CHILDREN)` is that one command's: its own peak RSS, not the largest of
/// every child the bench ever waited for.
fn measure_child(cmd: &[String]) -> Res<()> {
    let (bin, args) = cmd.split_first().ok_or("--measure: no command")?;
    let t0 = Instant::now();
    let status = std::process::Command::new(bin)
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()?;
    let wall = t0.elapsed().as_micros();
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)?;
    let us = |t: nix::sys::time::TimeVal| (t.tv_sec() as u64) * 1_000_000 + t.tv_usec() as u64;
    println!(
        "measure {} {wall} {} {} {}",
        status.code().unwrap_or(-1),
        u.max_rss(),
        us(u.user_time()),
        us(u.system_time())
    );
    Ok(())
}

/// Runs `bin args` under [`measure_child`], `input` on its stdin, its stderr into `log`;
/// an error if it fails (its log's last lines in the message).
fn measured(bin: &str, args: &[&str], input: Option<&[u8]>, log: &std::path::Path) -> Res<Usage> {
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .arg("--measure")
        .arg(bin)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(if input.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(log)?)
        .spawn()?;
    if let Some(input) = input {
        let mut stdin = child.stdin.take().ok_or("stdin")?;
        stdin.write_all(input)?;
    }
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<u64> = text
        .strip_prefix("measure ")
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let tail = || {
        let log = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    };
    match f[..] {
        [0, wall_us, peak_rss_kib, user_us, sys_us] => Ok(Usage {
            secs: wall_us as f64 / 1e6,
            peak_rss_kib,
            user_us,
            sys_us,
        }),
        [code, ..] => Err(format!("{} exited with {code}: {}", args.join(" "), tail()).into()),
        _ => Err(format!("{}: no measure ({text:?}): {}", args.join(" "), tail()).into()),
    }
}

/// Case (w): one row to `E2E_WIDE` (default 100,000) recipients, every one a distinct path
/// of the recipients' server (one host on 127.0.0.1, answering at once), through the binary:
/// `enqueue` into a fresh SQLite file, then `drain --concurrency E2E_WIDE_CONCURRENCY`
/// (default 256, the binary's default), each under [`measure_child`] (its time, peak RSS and
/// CPU); every recipient must get the row exactly once (the server counts the requests, the
/// distinct paths and the repeated `Idempotency-Key`s). Against the hyper limit posting the
/// same requests with as many workers, alternately, `E2E_WIDE_ROUNDS` (default 1) rounds.
fn wide(server: &Server) -> Res<()> {
    let n = env("E2E_WIDE", 100_000).max(1);
    let concurrency = env("E2E_WIDE_CONCURRENCY", 256).max(1);
    let rounds = env("E2E_WIDE_ROUNDS", 1).max(1);
    let to: Vec<String> = (0..n).map(|r| server.url(&format!("/w{r}"))).collect();
    let l = load(&to, 1, None);
    let input = enqueue_input(&l);
    let bin = bin_path();
    println!(
        "\n(w) one row to {n} recipients (distinct paths of one host on 127.0.0.1, answering at once), the binary: enqueue, then drain --concurrency {concurrency}; enqueue input {} bytes",
        input.len()
    );
    let once = |what: &str| -> Res<String> {
        let st = server.stats()?;
        let ok = st.requests == n as u64 && st.paths == n as u64 && st.duplicates == 0;
        if !ok {
            println!(
                "(w) {what}: NOT exactly once: {} requests, {} distinct recipients, {} duplicates (want {n}, {n}, 0)",
                st.requests, st.paths, st.duplicates
            );
        }
        Ok(format!(
            "{} requests to {} distinct recipients, {} duplicates: {}",
            st.requests,
            st.paths,
            st.duplicates,
            if ok {
                "each exactly once"
            } else {
                "NOT exactly once"
            }
        ))
    };
    for round in 1..=rounds {
        let hyper = hyper_limit(server, &l, concurrency)?;
        let hyper_once = once("hyper limit")?;
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("outbox.db");
        let db = db.to_str().ok_or("path")?;
        server.reset()?;
        let enq = measured(
            &bin,
            &[
                "--db",
                db,
                "enqueue",
                "--actor",
                "bench",
                "--allow-private-destinations",
            ],
            Some(input.as_bytes()),
            &dir.path().join("enqueue.log"),
        )?;
        let enqueued = server.stats()?.requests;
        server.reset()?;
        let log = dir.path().join("drain.log");
        let drain = measured(
            &bin,
            &[
                "--db",
                db,
                "drain",
                "--actor",
                "bench",
                "--concurrency",
                &concurrency.to_string(),
                "--allow-private-destinations",
                "--timeout",
                "10s",
            ],
            None,
            &log,
        )?;
        let drain_once = once("binary")?;
        let size = |p: &str| std::fs::metadata(p).map_or(0, |m| m.len());
        let last = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .rev()
            .find(|x| !x.trim().is_empty())
            .unwrap_or_default()
            .to_owned();
        let mib = |kib: u64| kib as f64 / 1024.0;
        println!(
            "(w) round {round}:\n\
             \x20   enqueue: {:.2} s, peak RSS {:.1} MiB, CPU {:.2} s (user {:.2} + sys {:.2}); requests during it: {enqueued}\n\
             \x20   drain: {:.2} s, {:.0} deliveries/s, peak RSS {:.1} MiB, CPU {:.2} s (user {:.2} + sys {:.2}), {:.1} us per delivery; {drain_once}\n\
             \x20   SQLite file after the drain {:.1} MiB (WAL {:.1} MiB); drain's last stderr line: {last}\n\
             \x20   hyper limit ({concurrency} workers): {:.2} s, {:.0} deliveries/s, {:.1} us CPU per delivery; {hyper_once}\n\
             \x20   binary drain / hyper limit: {:.2}x the throughput, {:.2}x the CPU per delivery",
            enq.secs,
            mib(enq.peak_rss_kib),
            enq.cpu_us() as f64 / 1e6,
            enq.user_us as f64 / 1e6,
            enq.sys_us as f64 / 1e6,
            drain.secs,
            n as f64 / drain.secs.max(1e-9),
            mib(drain.peak_rss_kib),
            drain.cpu_us() as f64 / 1e6,
            drain.user_us as f64 / 1e6,
            drain.sys_us as f64 / 1e6,
            drain.cpu_us() as f64 / n as f64,
            size(db) as f64 / 1048576.0,
            size(&format!("{db}-wal")) as f64 / 1048576.0,
            hyper.secs,
            hyper.rate(),
            hyper.cpu_per(),
            (n as f64 / drain.secs.max(1e-9)) / hyper.rate(),
            (drain.cpu_us() as f64 / n as f64) / hyper.cpu_per().max(1e-9),
        );
    }
    Ok(())
}

/// [`binary_drain`] with `db` as the `--db` value and the options after it.
fn binary_drain_on(server: &Server, l: &Load, concurrency: usize, db: &[&str]) -> Res<Run> {
    // `E2E_BIN`: another build of the binary, for an A/B of two builds in one run.
    let bin = bin_path();
    let bin = bin.as_str();
    let lines = enqueue_input(l);
    let mut enq = std::process::Command::new(bin)
        .arg("--db")
        .args(db)
        .args([
            "enqueue",
            "--actor",
            "bench",
            "--allow-private-destinations",
        ])
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()?;
    enq.stdin
        .take()
        .ok_or("stdin")?
        .write_all(lines.as_bytes())?;
    if !enq.wait()?.success() {
        return Err("enqueue failed".into());
    }
    server.reset()?;
    let children = || cpu_us(nix::sys::resource::UsageWho::RUSAGE_CHILDREN);
    let on_pg = db.first().is_some_and(|d| d.starts_with("postgres"));
    let pg_cpu = || if on_pg { postgres_cpu_us() } else { 0 };
    let s0 = pg_cpu();
    let (c0, t0) = (children(), Instant::now());
    let status = std::process::Command::new(bin)
        .arg("--db")
        .args(db)
        .args([
            "drain",
            "--actor",
            "bench",
            "--concurrency",
            &concurrency.to_string(),
            "--allow-private-destinations",
            "--timeout",
            "10s",
        ])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()?;
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), children() - c0);
    let server_cpu_us = pg_cpu().saturating_sub(s0);
    if !status.success() {
        return Err(format!("drain: {status}").into());
    }
    let mut run = finish(server, l.requests.len(), secs, cpu)?;
    run.server_cpu_us = server_cpu_us;
    Ok(run)
}

/// The binary (`drain --concurrency {concurrency}`) against the hyper limit (`workers` in
/// flight), alternately, `E2E_ROUNDS` (default 5) times; prints every round's ratios and
/// returns the number of rounds and the pair whose throughput ratio is the median, the
/// binary's order violations and duplicates summed over every round.
fn median_rounds(
    case: &str,
    server: &Server,
    l: &Load,
    workers: usize,
    concurrency: usize,
) -> Res<(usize, (Run, Run))> {
    let rounds = env("E2E_ROUNDS", 5).max(1);
    let mut pairs = Vec::with_capacity(rounds);
    while pairs.len() < rounds {
        let h = hyper_limit(server, l, workers)?;
        pairs.push((h, binary_drain(server, l, concurrency)?));
    }
    let ratio = |(h, b): &(Run, Run)| b.rate() / h.rate();
    let cpu = |(h, b): &(Run, Run)| b.cpu_per() / h.cpu_per().max(1e-9);
    let list = |f: &dyn Fn(&(Run, Run)) -> f64| {
        let v: Vec<String> = pairs.iter().map(|p| format!("{:.2}", f(p))).collect();
        v.join(", ")
    };
    println!(
        "{case} the binary against the hyper limit, {} alternating rounds: throughput ratio {}; CPU per delivery ratio {}",
        pairs.len(),
        list(&ratio),
        list(&cpu)
    );
    // The row's order violations and duplicates are every round's, not the median one's.
    let violations = pairs.iter().map(|(_, b)| b.violations).sum();
    let duplicates = pairs.iter().map(|(_, b)| b.duplicates).sum();
    pairs.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
    let (hyper, binary) = pairs.swap_remove(pairs.len() / 2);
    let binary = Run {
        violations,
        duplicates,
        ..binary
    };
    Ok((rounds, (hyper, binary)))
}

/// Case (e), in a child process of its own (`--backlog N PORT`): prints
/// `deliveries/s rss_after_enqueue_kib peak_rss_kib`.
fn backlog_child(units: usize, port: u16) -> Res<()> {
    const RECIPIENTS: usize = 1000;
    let to: Vec<String> = (0..RECIPIENTS)
        .map(|r| format!("http://127.0.0.1:{port}/r{r}"))
        .collect();
    let dir = tempfile::tempdir()?;
    let store = open_store(&dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let rows = units / RECIPIENTS;
    let out = rt.block_on(async {
        let outbox = outbox_lanes::tokio::Outbox::open(Arc::clone(&store), config(1000, None))?;
        // Built two rows at a time: the backlog never sits in this process's memory at once.
        for first in (0..rows).step_by(2) {
            let chunk: Vec<NewRow> = (first..(first + 2).min(rows))
                .map(|i| NewRow {
                    id: format!("e{i}"),
                    body: body(i, None),
                    content_type: "application/json".into(),
                    recipients: to.clone(),
                    ..NewRow::default()
                })
                .collect();
            outbox.enqueue("backlog", &chunk).await?;
        }
        let before = peak_rss_kib();
        let t0 = Instant::now();
        let done = outbox.drain("backlog").await?;
        let rate = (rows * RECIPIENTS) as f64 / t0.elapsed().as_secs_f64();
        outbox.shutdown().await;
        match done {
            outbox_lanes::tokio::DrainOutcome::Ran(r)
                if r.delivered == (rows * RECIPIENTS) as u64 => {}
            other => return Err(format!("backlog drain: {other:?}").into()),
        }
        Ok::<_, Box<dyn Error>>(format!("{rate:.0} {before} {}", peak_rss_kib()))
    })?;
    println!("{out}");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------

struct Row {
    case: String,
    outbox: Run,
    /// The same client as the outbox's, from memory.
    limit: Run,
    /// The bare hyper client, from memory (the tokio cases).
    hyper: Option<Run>,
}

impl Row {
    /// The strongest limit this case measured.
    fn strongest(&self) -> &Run {
        self.hyper.as_ref().unwrap_or(&self.limit)
    }
}

fn print_rows(rows: &[Row]) {
    println!(
        "\n| case | outbox deliveries/s | same-client limit deliveries/s | ratio | hyper limit deliveries/s | ratio to hyper | outbox CPU µs/delivery | same-client CPU µs/delivery | hyper CPU µs/delivery | CPU vs hyper | violations (outbox / limit) | duplicates (outbox / limit) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "—".into());
    for r in rows {
        let h = r.hyper.as_ref();
        println!(
            "| {} | {:.0} | {:.0} | {:.2}x | {} | {} | {:.1} | {:.1} | {} | {} | {} / {} | {} / {} |",
            r.case,
            r.outbox.rate(),
            r.limit.rate(),
            r.outbox.rate() / r.limit.rate(),
            or_dash(h.map(|h| format!("{:.0}", h.rate()))),
            or_dash(h.map(|h| format!("{:.2}x", r.outbox.rate() / h.rate()))),
            r.outbox.cpu_per(),
            r.limit.cpu_per(),
            or_dash(h.map(|h| format!("{:.1}", h.cpu_per()))),
            or_dash(h.map(|h| format!("{:.1}x", r.outbox.cpu_per() / h.cpu_per().max(1e-9)))),
            r.outbox.violations,
            r.limit.violations,
            r.outbox.duplicates,
            r.limit.duplicates
        );
    }
    println!(
        "\nPer delivery, in-process runs (the bench's allocator counts; context switches from \
         getrusage):\n\n| case | run | allocations | bytes allocated | voluntary context switches | involuntary |\n|---|---|---|---|---|---|"
    );
    for r in rows.iter().filter(|r| r.outbox.hops.is_some()) {
        let runs = [
            ("outbox", Some(&r.outbox)),
            ("same client", Some(&r.limit)),
            ("hyper", r.hyper.as_ref()),
        ];
        for (name, run) in runs {
            let Some((run, h)) = run.and_then(|run| run.hops.map(|h| (run, h))) else {
                continue;
            };
            let per = |x: u64| x as f64 / run.deliveries.max(1) as f64;
            println!(
                "| {} | {name} | {:.1} | {:.0} | {:.2} | {:.2} |",
                r.case,
                per(h.allocs),
                per(h.alloc_bytes),
                per(h.voluntary),
                per(h.involuntary)
            );
        }
    }
}

/// Two panels: deliveries/s as a fraction of the strongest limit measured (the hyper client
/// where a case has it, else the same client), and CPU µs per delivery.
fn svg(rows: &[Row]) -> String {
    let (w, bar, gap, left) = (960.0, 14.0, 10.0, 300.0);
    let h = 60.0 + rows.len() as f64 * (2.0 * bar + gap) + 40.0;
    let panel = (w - left - 40.0) / 2.0;
    let max_cpu = rows
        .iter()
        .flat_map(|r| [r.outbox.cpu_per(), r.strongest().cpu_per()])
        .fold(1.0_f64, f64::max);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"20\" font-weight=\"bold\">deliveries/s, fraction of the limit (bare hyper where measured, else the same client)</text>\n\
         <text x=\"{}\" y=\"20\" font-weight=\"bold\">CPU µs per delivery</text>\n\
         <rect x=\"{left}\" y=\"30\" width=\"12\" height=\"10\" fill=\"#2a6fb0\"/><text x=\"{}\" y=\"39\">outbox-lanes</text>\n\
         <rect x=\"{}\" y=\"30\" width=\"12\" height=\"10\" fill=\"#bbbbbb\"/><text x=\"{}\" y=\"39\">limit: no outbox</text>\n",
        left + panel + 20.0,
        left + 16.0,
        left + 110.0,
        left + 126.0
    );
    for (i, r) in rows.iter().enumerate() {
        let y = 55.0 + i as f64 * (2.0 * bar + gap);
        let ratio = r.outbox.rate() / r.strongest().rate();
        s.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
            left - 8.0,
            y + bar + 4.0,
            r.case.replace('&', "&amp;").replace('<', "&lt;")
        ));
        let x2 = left + panel + 20.0;
        for (k, (frac, cpu, color)) in [
            (ratio.min(1.5), r.outbox.cpu_per(), "#2a6fb0"),
            (1.0, r.strongest().cpu_per(), "#bbbbbb"),
        ]
        .into_iter()
        .enumerate()
        {
            let yy = y + k as f64 * bar;
            let bw = frac / 1.5 * (panel - 60.0);
            let cw = cpu / max_cpu * (panel - 60.0);
            s.push_str(&format!(
                "<rect x=\"{left}\" y=\"{yy}\" width=\"{bw:.1}\" height=\"{}\" fill=\"{color}\"/>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\">{:.2}x</text>\n\
                 <rect x=\"{x2}\" y=\"{yy}\" width=\"{cw:.1}\" height=\"{}\" fill=\"{color}\"/>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\">{cpu:.1}</text>\n",
                bar - 2.0,
                left + bw + 4.0,
                yy + bar - 3.0,
                frac,
                bar - 2.0,
                x2 + cw + 4.0,
                yy + bar - 3.0
            ));
        }
    }
    s.push_str("</svg>\n");
    s
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|a| a == "--measure") {
        return measure_child(&args[2..]);
    }
    if args.iter().any(|a| a == "--serve") {
        return serve();
    }
    if let Some(i) = args.iter().position(|a| a == "--backlog") {
        let units = args.get(i + 1).ok_or("units")?.parse()?;
        let port = args.get(i + 2).ok_or("port")?.parse()?;
        return backlog_child(units, port);
    }
    let scale: f64 = std::env::var("E2E_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let n = |x: usize| ((x as f64 * scale) as usize).max(1);
    let cases = std::env::var("E2E_CASES").unwrap_or_else(|_| "a,p,b,c,d,e".into());
    let want = |c: &str| cases.split(',').any(|x| x.trim() == c);
    let server = Server::start()?;
    let mut rows = Vec::new();
    println!(
        "end to end on 127.0.0.1, recipients: hyper in a child process (port {})",
        server.port
    );

    if want("a") {
        let to: Vec<String> = (0..100).map(|r| server.url(&format!("/r{r}"))).collect();
        let l = load(&to, n(2000), None);
        // For a profiler: `E2E_ONLY=outbox`, `E2E_ONLY=limit` or `E2E_ONLY=hyper` runs that side of (a) alone;
        // `E2E_ONLY=blocking` the blocking runtime's outbox on (a)'s load, `blocking-c` on (c)'s.
        if let Ok(only) = std::env::var("E2E_ONLY") {
            let run = match only.as_str() {
                "outbox" => tokio_outbox(&server, &l, 100, None)?,
                "blocking" => blocking_outbox(&server, &l, 100)?,
                "blocking-c" => {
                    let one = vec![server.url("/one")];
                    blocking_outbox(&server, &load(&one, n(2000), None), 32)?
                }
                "hyper" => hyper_limit(&server, &l, 100)?,
                _ => tokio_limit(&server, &l, 100)?,
            };
            println!(
                "{only}: {:.0}/s, {:.1} us CPU per delivery",
                run.rate(),
                run.cpu_per()
            );
            return Ok(());
        }
        let hyper = hyper_limit(&server, &l, 100)?;
        let limit = tokio_limit(&server, &l, 100)?;
        let outbox = tokio_outbox(&server, &l, 100, None)?;
        rows.push(Row {
            case: format!(
                "(a) 100 recipients at once, {} rows, 100 in flight, tokio",
                l.rows.len()
            ),
            outbox,
            limit: limit.clone(),
            hyper: Some(hyper.clone()),
        });
        let (rounds, (hyper, binary)) = median_rounds("(a)", &server, &l, 100, 100)?;
        rows.push(Row {
            case: format!(
                "(a) same, the binary: drain --concurrency 100 (median of {rounds} rounds)"
            ),
            outbox: binary,
            limit,
            hyper: Some(hyper),
        });
        let limit = blocking_limit(&server, &l, 100)?;
        let outbox = blocking_outbox(&server, &l, 100)?;
        rows.push(Row {
            case: "(a) same, blocking runtime (ureq, 100 threads)".into(),
            outbox,
            limit,
            hyper: None,
        });
        print_rows(&rows[rows.len() - 3..]);
    }
    if want("l") {
        let to: Vec<String> = (0..100).map(|r| server.url(&format!("/r{r}"))).collect();
        let l = load(&to, n(2000), None);
        delivery_log_rounds(&server, &l, None)?;
        if let Ok(url) = std::env::var("OUTBOX_LANES_TEST_PG") {
            delivery_log_rounds(&server, &l, Some(&url))?;
        }
    }
    if want("p") {
        match std::env::var("OUTBOX_LANES_TEST_PG") {
            Err(_) => println!("(p) skipped: OUTBOX_LANES_TEST_PG is not set"),
            Ok(url) => {
                // The binary on SQLite and on Postgres, alternately, the same load as (a); the
                // CPU is the relay process's (the Postgres server's own is not in it).
                let to: Vec<String> = (0..100).map(|r| server.url(&format!("/r{r}"))).collect();
                let l = load(&to, n(500), None);
                for round in 1..=env("E2E_PG_ROUNDS", 2) {
                    let sqlite = binary_drain(&server, &l, 100)?;
                    let pg = binary_drain_pg(&server, &l, 100, &url)?;
                    println!(
                        "(p) round {round}, 100 lanes x {} rows, instant, drain --concurrency 100: \
                         SQLite {:.0}/s at {:.1} us CPU per delivery, Postgres {:.0}/s at {:.1} us \
                         (the Postgres server's {:.1} us): \
                         Postgres {:.2}x SQLite; order violations {} / {}, duplicates {} / {}",
                        l.rows.len(),
                        sqlite.rate(),
                        sqlite.cpu_per(),
                        pg.rate(),
                        pg.cpu_per(),
                        pg.server_cpu_per(),
                        pg.rate() / sqlite.rate(),
                        sqlite.violations,
                        pg.violations,
                        sqlite.duplicates,
                        pg.duplicates,
                    );
                }
            }
        }
    }
    if want("b") {
        let to: Vec<String> = (0..1000)
            .map(|r| server.url(&format!("/d100/r{r}")))
            .collect();
        let l = load(&to, n(20), None);
        let hyper = hyper_limit(&server, &l, 1000)?;
        let limit = tokio_limit(&server, &l, 1000)?;
        let outbox = tokio_outbox(&server, &l, 1000, None)?;
        rows.push(Row {
            case: format!(
                "(b) 1,000 recipients 100 ms away, {} rows, 1,000 in flight, tokio",
                l.rows.len()
            ),
            outbox,
            limit: limit.clone(),
            hyper: Some(hyper.clone()),
        });
        let binary = binary_drain(&server, &l, 1000)?;
        rows.push(Row {
            case: "(b) same, the binary: drain --concurrency 1000".into(),
            outbox: binary,
            limit,
            hyper: Some(hyper),
        });
        print_rows(&rows[rows.len() - 2..]);
    }
    if want("c") {
        let to = vec![server.url("/one")];
        let l = load(&to, n(2000), None);
        let hyper = hyper_limit(&server, &l, 1)?;
        let limit = tokio_limit(&server, &l, 1)?;
        let outbox = tokio_outbox(&server, &l, 256, None)?;
        rows.push(Row {
            case: format!(
                "(c) 1 recipient at once, {} rows (1 in flight), tokio",
                l.rows.len()
            ),
            outbox,
            limit: limit.clone(),
            hyper: Some(hyper),
        });
        // One lane's rate moves by half from one run to the next on a shared 2-core machine,
        // so one pair says little.
        let (rounds, (hyper, binary)) = median_rounds("(c)", &server, &l, 1, 100)?;
        rows.push(Row {
            case: format!(
                "(c) same, the binary: drain --concurrency 100 (median of {rounds} rounds)"
            ),
            outbox: binary,
            limit,
            hyper: Some(hyper),
        });
        let limit = blocking_limit(&server, &l, 1)?;
        let outbox = blocking_outbox(&server, &l, 32)?;
        rows.push(Row {
            case: "(c) same, blocking runtime".into(),
            outbox,
            limit,
            hyper: None,
        });
        print_rows(&rows[rows.len() - 3..]);
    }
    if want("d") {
        let to = vec![server.url("/d150/inbox")];
        let keyed = load(&to, n(1000), Some(100));
        let limit = tokio_limit(&server, &keyed, 8)?;
        let outbox = tokio_outbox(&server, &keyed, 256, Some(8))?;
        let one_lane = load(&to, n(200), None);
        let lane = tokio_outbox(&server, &one_lane, 256, Some(8))?;
        println!(
            "\n(d) one recipient 150 ms away, per-host cap 8: {} rows over 100 ordering keys {:.1}/s; {} rows in one lane {:.1}/s; {:.1}x",
            keyed.rows.len(),
            outbox.rate(),
            one_lane.rows.len(),
            lane.rate(),
            outbox.rate() / lane.rate()
        );
        rows.push(Row {
            case: format!(
                "(d) 1 recipient 150 ms away, 100 keys, cap 8 ({:.1}x one lane)",
                outbox.rate() / lane.rate()
            ),
            outbox,
            limit,
            hyper: None,
        });
        print_rows(&rows[rows.len() - 1..]);
    }
    if want("w") {
        wide(&server)?;
    }
    if want("e") {
        server.reset()?;
        let units = env("E2E_BACKLOG", 1_000_000) / 1000 * 1000;
        let out = std::process::Command::new(std::env::current_exe()?)
            .args(["--backlog", &units.to_string(), &server.port.to_string()])
            .stderr(std::process::Stdio::inherit())
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let f: Vec<&str> = text.split_whitespace().collect();
        match f[..] {
            [rate, before, peak] => println!(
                "\n(e) backlog of {units} units over 1,000 recipients at once, 1,000 in flight (tokio, child process): {rate} deliveries/s; peak RSS {before} KiB after enqueueing, {peak} KiB after draining"
            ),
            _ => return Err(format!("backlog child: {text:?} ({})", out.status).into()),
        }
        let st = server.stats()?;
        println!(
            "    recipients: {} requests, {} order violations, {} duplicates, {:.1} µs of their CPU per request",
            st.requests,
            st.violations,
            st.duplicates,
            st.cpu_us as f64 / st.requests.max(1) as f64
        );
    }
    if !rows.is_empty() {
        println!("\nall cases:");
        print_rows(&rows);
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/e2e.svg");
        std::fs::write(path, svg(&rows))?;
        println!("\nchart: {path}");
    }
    Ok(())
}
