//! `relay --metrics-addr`: Prometheus metrics and health probes from a small HTTP responder.
//!
//! The exposition is encoded by `prometheus-client` (OpenMetrics text, which Prometheus
//! scrapes): a [`Registry`] holding one [`Collector`] that encodes, per scrape, gauges read
//! from the store (per actor), this process's counters and histograms (see
//! `backend::Counters`). A collector rather than long-lived metric handles because every
//! value is a snapshot taken at scrape time; the crate does the names (`_total`, `_bucket`,
//! `_sum`, `_count`), number formatting, cumulative buckets and the `# EOF` line. It does not
//! escape label values, so [`label`] does.
//!
//! A hand-written responder rather than an HTTP server crate: it answers three GET paths
//! with `Connection: close`, and the binary otherwise needs no HTTP server (hyper comes only
//! as the tokio runtime's client, without its server half; axum is a dev-dependency of the examples).
//! - `/metrics` (and `/`): the exposition text; 503 if the store cannot be read.
//! - `/healthz`: 200 while the process serves requests (liveness: it checks nothing else).
//! - `/readyz`: 200 if the store answers a query now, else 503 with the reason (readiness);
//!   503 too once a SQLite file was removed or replaced under the process.
//!
//! A store that does not answer within [`STORE_WAIT`] gets a 503 too: a probe or a scrape
//! never hangs on it.
//! - anything else: 404.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use outbox_lanes_core::{ActorId, Timestamp};
use outbox_lanes_store::ActorStatus;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tracing::debug;

use super::args::MetricsAddr;
use super::backend::{Backend, Counters, Histogram};

/// Binds the first of `addr`'s addresses that can be bound and serves the paths of the
/// [module docs](self) until the task is aborted.
///
/// # Errors
/// None of the addresses can be bound (the last address's error).
pub(crate) async fn serve(
    addr: &MetricsAddr,
    backend: Backend,
    counters: Arc<Counters>,
) -> std::io::Result<JoinHandle<()>> {
    let mut last = None;
    let mut bound = None;
    for a in &addr.addrs {
        match TcpListener::bind(a).await {
            Ok(l) => {
                bound = Some(l);
                break;
            }
            Err(e) => {
                last = Some(std::io::Error::new(
                    e.kind(),
                    format!("cannot bind {a}: {e}"),
                ))
            }
        }
    }
    let listener = match (bound, last) {
        (Some(l), _) => l,
        (None, Some(e)) => return Err(e),
        (None, None) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrNotAvailable,
                "no address to bind",
            ));
        }
    };
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics, /healthz and /readyz");
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let backend = backend.clone();
            let counters = Arc::clone(&counters);
            tokio::spawn(async move {
                if let Err(e) = respond(stream, &backend, &counters).await {
                    debug!(%peer, error = %e, "metrics request failed");
                }
            });
        }
    }))
}

/// How long `/metrics` and `/readyz` wait for the store.
pub(crate) const STORE_WAIT: Duration = Duration::from_secs(5);

/// `f`, or an error if the store takes longer than [`STORE_WAIT`].
async fn bounded<T>(f: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::time::timeout(STORE_WAIT, f)
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {STORE_WAIT:?}")))
}

/// The exposition text, with what it needs from the store.
async fn metrics(backend: &Backend, counters: &Counters) -> anyhow::Result<String> {
    let status = bounded(backend.status()).await?;
    let oldest = bounded(backend.oldest_pending()).await?;
    let now = Timestamp::from_system_time(SystemTime::now());
    let hosts = host_states(&bounded(backend.host_list()).await?, now);
    Ok(render(&status, &oldest, &hosts, now, counters))
}

async fn respond(mut s: TcpStream, backend: &Backend, counters: &Counters) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request head"))??;
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    const TEXT: &str = "text/plain; charset=utf-8";
    let (status, ctype, body) = if method != "GET" && method != "HEAD" {
        ("405 Method Not Allowed", TEXT, "GET only\n".to_string())
    } else {
        match path {
            "/metrics" | "/" => match metrics(backend, counters).await {
                Ok(text) => (
                    "200 OK",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                ),
                Err(e) => (
                    "503 Service Unavailable",
                    TEXT,
                    format!("store: {}\n", super::message(&e)),
                ),
            },
            "/healthz" => ("200 OK", TEXT, "ok\n".to_string()),
            "/readyz" => match bounded(backend.ready()).await {
                Ok(()) => ("200 OK", TEXT, "ready\n".to_string()),
                Err(e) => (
                    "503 Service Unavailable",
                    TEXT,
                    match e.downcast_ref::<outbox_lanes_store::StoreError>() {
                        Some(replaced @ outbox_lanes_store::StoreError::Replaced { .. }) => {
                            format!("not ready: {replaced}\n")
                        }
                        _ => format!(
                            "not ready: the store does not answer: {}\n",
                            super::message(&e)
                        ),
                    },
                ),
            },
            _ => (
                "404 Not Found",
                TEXT,
                "not found; try /metrics, /healthz or /readyz\n".to_string(),
            ),
        }
    };
    let mut resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        resp.push_str(&body);
    }
    s.write_all(resp.as_bytes()).await?;
    s.shutdown().await
}

/// A label value as the text format wants it (prometheus-client writes values as given).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One actor's gauges, read from the store.
#[derive(Debug)]
struct ActorRow {
    /// The `actor` label value, escaped.
    actor: String,
    pending: u64,
    pass_running: u8,
    stalled_lanes: u64,
    paused_lanes: u64,
    dead_letters: u64,
    /// Age of the oldest pending unit in seconds, 0 with none pending.
    oldest_pending: f64,
}

/// A histogram as prometheus-client encodes it: per-bucket (not cumulative) counts, the last
/// bucket's bound `f64::MAX` (`+Inf`).
#[derive(Debug)]
struct HistogramRow {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl From<&Histogram> for HistogramRow {
    fn from(h: &Histogram) -> Self {
        let mut buckets: Vec<(f64, u64)> = h
            .bounds
            .iter()
            .copied()
            .zip(h.counts.iter().copied())
            .collect();
        buckets.push((f64::MAX, h.over));
        HistogramRow {
            sum: h.sum,
            count: buckets.iter().map(|(_, n)| n).sum(),
            buckets,
        }
    }
}

/// Everything one scrape shows, taken at scrape time; encoded by [`Collector::encode`].
#[derive(Debug)]
struct Snapshot {
    actors: Vec<ActorRow>,
    hosts: Vec<(String, u64)>,
    in_flight: u64,
    delivered: Vec<(String, u64)>,
    dead_lettered: Vec<(String, u64)>,
    lanes_unavailable: Vec<(String, u64)>,
    attempts: Vec<(String, u64)>,
    latency: HistogramRow,
    queue_wait: HistogramRow,
}

/// A family of gauges or counters labelled `key`: one sample per `(label value, value)`.
fn family<V>(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    kind: MetricType,
    key: &str,
    samples: impl Iterator<Item = (String, V)>,
    encode: impl Fn(V, prometheus_client::encoding::MetricEncoder<'_>) -> std::fmt::Result,
) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, kind)?;
    for (value, v) in samples {
        let labels = [(key, value)];
        encode(v, m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauge<V: prometheus_client::encoding::EncodeGaugeValue + Send + Sync + std::fmt::Debug>(
    v: V,
    e: prometheus_client::encoding::MetricEncoder<'_>,
) -> std::fmt::Result {
    ConstGauge::new(v).encode(e)
}

fn counter(v: u64, e: prometheus_client::encoding::MetricEncoder<'_>) -> std::fmt::Result {
    ConstCounter::new(v).encode(e)
}

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> std::fmt::Result {
        let per_actor =
            |f: fn(&ActorRow) -> u64| self.actors.iter().map(move |a| (a.actor.clone(), f(a)));
        family(
            &mut e,
            "outbox_lanes_oldest_pending_seconds",
            "Age of the actor's oldest pending unit (its oldest lane head), 0 with none pending.",
            MetricType::Gauge,
            "actor",
            self.actors
                .iter()
                .map(|a| (a.actor.clone(), a.oldest_pending)),
            gauge,
        )?;
        family(
            &mut e,
            "outbox_lanes_queue_depth",
            "Units not yet finished, per actor.",
            MetricType::Gauge,
            "actor",
            per_actor(|a| a.pending),
            gauge,
        )?;
        family(
            &mut e,
            "outbox_lanes_pass_running",
            "1 while a pass (in any process) holds the actor's drain slot.",
            MetricType::Gauge,
            "actor",
            per_actor(|a| u64::from(a.pass_running)),
            gauge,
        )?;
        family(
            &mut e,
            "outbox_lanes_stalled_lanes",
            "Lanes with pending units in backoff, per actor.",
            MetricType::Gauge,
            "actor",
            per_actor(|a| a.stalled_lanes),
            gauge,
        )?;
        family(
            &mut e,
            "outbox_lanes_paused_lanes",
            "Lanes with pending units paused, by an operator or for their host's block, per actor.",
            MetricType::Gauge,
            "actor",
            per_actor(|a| a.paused_lanes),
            gauge,
        )?;
        family(
            &mut e,
            "outbox_lanes_dead_letters",
            "Dead letters kept, per actor.",
            MetricType::Gauge,
            "actor",
            per_actor(|a| a.dead_letters),
            gauge,
        )?;
        family(
            &mut e,
            "outbox_lanes_hosts",
            "Recipient hosts (origins) known to the store, per state: open, failing, backoff, \
             probing, blocked, blocked_dead_letter.",
            MetricType::Gauge,
            "state",
            self.hosts.iter().cloned(),
            gauge,
        )?;
        let m = e.encode_descriptor(
            "outbox_lanes_units_in_flight",
            "Delivery attempts in flight in this process.",
            None,
            MetricType::Gauge,
        )?;
        gauge(self.in_flight, m)?;
        family(
            &mut e,
            "outbox_lanes_delivered",
            "Recipients served by this process, per actor.",
            MetricType::Counter,
            "actor",
            self.delivered.iter().cloned(),
            counter,
        )?;
        family(
            &mut e,
            "outbox_lanes_lanes_unavailable",
            "Lanes this process found failing for longer than --lane-unavailable-after (once per \
             run of failures), per actor.",
            MetricType::Counter,
            "actor",
            self.lanes_unavailable.iter().cloned(),
            counter,
        )?;
        family(
            &mut e,
            "outbox_lanes_dead_lettered",
            "Recipients dead-lettered by this process, per reason.",
            MetricType::Counter,
            "reason",
            self.dead_lettered.iter().cloned(),
            counter,
        )?;
        family(
            &mut e,
            "outbox_lanes_attempts",
            "Delivery attempts finished by this process, per outcome.",
            MetricType::Counter,
            "outcome",
            self.attempts.iter().cloned(),
            counter,
        )?;
        for (name, help, h) in [
            (
                "outbox_lanes_delivery_latency_seconds",
                "Attempt latency: payload read and HTTP exchange, every attempt.",
                &self.latency,
            ),
            (
                "outbox_lanes_queue_wait_seconds",
                "From enqueue to the start of the attempt that delivered.",
                &self.queue_wait,
            ),
        ] {
            let mut m = e.encode_descriptor(name, help, None, MetricType::Histogram)?;
            m.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)?;
        }
        Ok(())
    }
}

/// The exposition text: `status` and `oldest` (each actor's oldest pending unit's enqueue
/// time) read from the store, ages taken at `now`. An actor with nothing pending shows an
/// age of 0, so that its series does not vanish when its backlog is gone.
/// Hosts per state (every state, 0 included, so no series vanishes).
pub(crate) fn host_states(
    hosts: &[outbox_lanes_store::HostStatus],
    now: Timestamp,
) -> Vec<(&'static str, u64)> {
    const STATES: [(&str, &str); 6] = [
        ("open", "open"),
        ("failing", "failing"),
        ("backoff", "backoff"),
        ("probing", "probing"),
        ("blocked", "blocked"),
        ("blocked (dead letters)", "blocked_dead_letter"),
    ];
    STATES
        .iter()
        .map(|&(shown, code)| {
            let n = hosts
                .iter()
                .filter(|h| super::hosts::state(h, now) == shown)
                .count();
            (code, n as u64)
        })
        .collect()
}

pub(crate) fn render(
    status: &[ActorStatus],
    oldest: &[(ActorId, Timestamp)],
    hosts: &[(&'static str, u64)],
    now: Timestamp,
    counters: &Counters,
) -> String {
    let actors = status
        .iter()
        .map(|a| ActorRow {
            actor: label(a.actor.as_str()),
            pending: a.pending,
            pass_running: u8::from(a.in_flight),
            stalled_lanes: a.lanes_in_backoff.len() as u64,
            paused_lanes: a.lanes_paused.len() as u64,
            dead_letters: a.dead_letters,
            oldest_pending: oldest
                .iter()
                .find(|(x, _)| *x == a.actor)
                .map_or(0.0, |(_, t)| {
                    now.saturating_duration_since(*t).as_secs_f64()
                }),
        })
        .collect();
    let d = counters.detail();
    let snapshot = Snapshot {
        actors,
        hosts: hosts.iter().map(|&(k, n)| (k.to_owned(), n)).collect(),
        in_flight: counters.in_flight(),
        delivered: d
            .delivered_by_actor
            .iter()
            .map(|(k, n)| (label(k), *n))
            .collect(),
        dead_lettered: d
            .dead_by_reason
            .iter()
            .map(|(k, n)| (label(k), *n))
            .collect(),
        lanes_unavailable: d
            .unavailable_by_actor
            .iter()
            .map(|(k, n)| (label(k), *n))
            .collect(),
        attempts: d.attempts.iter().map(|(k, n)| (label(k), *n)).collect(),
        latency: HistogramRow::from(&d.latency),
        queue_wait: HistogramRow::from(&d.queue_wait),
    };
    drop(d);
    let mut registry = Registry::default();
    registry.register_collector(Box::new(snapshot));
    let mut text = String::new();
    // Writing to a String does not fail; a collector error would be a bug of ours.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &registry) {
        debug!(error = %e, "metrics encoding failed");
    }
    text
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// The exposition parsed: `# TYPE` and `# HELP` per family, the value per sample (name
    /// with its labels, as written).
    #[derive(Debug, Default)]
    struct Parsed {
        types: BTreeMap<String, String>,
        helps: BTreeMap<String, String>,
        samples: BTreeMap<String, f64>,
        eof: bool,
    }

    fn parse(text: &str) -> Parsed {
        let mut p = Parsed::default();
        for line in text.lines() {
            if line == "# EOF" {
                p.eof = true;
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE line");
                p.types.insert(name.into(), kind.into());
            } else if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("HELP line");
                p.helps.insert(name.into(), help.into());
            } else {
                let (sample, value) = line.rsplit_once(' ').expect("sample line");
                let value = value.parse().unwrap_or_else(|e| panic!("{line}: {e}"));
                assert!(
                    p.samples.insert(sample.into(), value).is_none(),
                    "twice: {line}"
                );
            }
        }
        p
    }

    fn status(actor: &str, pending: u64, dead_letters: u64) -> ActorStatus {
        ActorStatus {
            actor: ActorId::new(actor),
            pending,
            in_flight: true,
            slot: None,
            lanes_in_backoff: Vec::new(),
            lanes_paused: Vec::new(),
            dead_letters,
        }
    }

    /// Every family keeps its name, type and help text (dashboards and alerts use them).
    #[test]
    fn exposition_families() {
        let c = Counters::default();
        let p = parse(&render(&[], &[], &[], Timestamp::from_millis(0), &c));
        let want = [
            (
                "outbox_lanes_oldest_pending_seconds",
                "gauge",
                "Age of the actor's oldest pending unit (its oldest lane head), 0 with none pending.",
            ),
            (
                "outbox_lanes_queue_depth",
                "gauge",
                "Units not yet finished, per actor.",
            ),
            (
                "outbox_lanes_pass_running",
                "gauge",
                "1 while a pass (in any process) holds the actor's drain slot.",
            ),
            (
                "outbox_lanes_stalled_lanes",
                "gauge",
                "Lanes with pending units in backoff, per actor.",
            ),
            (
                "outbox_lanes_paused_lanes",
                "gauge",
                "Lanes with pending units paused, by an operator or for their host's block, per actor.",
            ),
            (
                "outbox_lanes_dead_letters",
                "gauge",
                "Dead letters kept, per actor.",
            ),
            (
                "outbox_lanes_hosts",
                "gauge",
                "Recipient hosts (origins) known to the store, per state: open, failing, backoff, probing, blocked, blocked_dead_letter.",
            ),
            (
                "outbox_lanes_units_in_flight",
                "gauge",
                "Delivery attempts in flight in this process.",
            ),
            (
                "outbox_lanes_delivered",
                "counter",
                "Recipients served by this process, per actor.",
            ),
            (
                "outbox_lanes_lanes_unavailable",
                "counter",
                "Lanes this process found failing for longer than --lane-unavailable-after (once per run of failures), per actor.",
            ),
            (
                "outbox_lanes_dead_lettered",
                "counter",
                "Recipients dead-lettered by this process, per reason.",
            ),
            (
                "outbox_lanes_attempts",
                "counter",
                "Delivery attempts finished by this process, per outcome.",
            ),
            (
                "outbox_lanes_delivery_latency_seconds",
                "histogram",
                "Attempt latency: payload read and HTTP exchange, every attempt.",
            ),
            (
                "outbox_lanes_queue_wait_seconds",
                "histogram",
                "From enqueue to the start of the attempt that delivered.",
            ),
        ];
        for (name, kind, help) in want {
            assert_eq!(p.types.get(name).map(String::as_str), Some(kind), "{name}");
            assert_eq!(p.helps.get(name).map(String::as_str), Some(help), "{name}");
        }
        assert_eq!(p.types.len(), want.len(), "{:?}", p.types);
        assert!(p.eof);
        assert_eq!(p.samples["outbox_lanes_units_in_flight"], 0.0);
        assert_eq!(
            p.samples["outbox_lanes_delivery_latency_seconds_bucket{le=\"0.005\"}"],
            0.0
        );
        assert_eq!(
            p.samples["outbox_lanes_queue_wait_seconds_bucket{le=\"+Inf\"}"],
            0.0
        );
        assert_eq!(p.samples["outbox_lanes_queue_wait_seconds_count"], 0.0);
    }

    /// Counters and histograms from this process: `_total` samples with their labels,
    /// cumulative buckets, `+Inf` equal to the count.
    #[test]
    fn exposition_counters_and_histograms() {
        let c = Counters::default();
        {
            let mut d = c.detail();
            d.delivered_by_actor.insert("al\"ice".into(), 3);
            d.dead_by_reason.insert("gone", 1);
            d.attempts.insert("delivered", 3);
            d.latency.counts[0] = 2; // <= 0.005
            d.latency.counts[7] = 1; // <= 1.0
            d.latency.over = 1;
            d.latency.sum = 42.5;
        }
        let p = parse(&render(&[], &[], &[], Timestamp::from_millis(0), &c));
        assert_eq!(
            p.samples["outbox_lanes_delivered_total{actor=\"al\\\"ice\"}"],
            3.0
        );
        assert_eq!(
            p.samples["outbox_lanes_dead_lettered_total{reason=\"gone\"}"],
            1.0
        );
        assert_eq!(
            p.samples["outbox_lanes_attempts_total{outcome=\"delivered\"}"],
            3.0
        );
        let h = "outbox_lanes_delivery_latency_seconds";
        assert_eq!(p.samples[&format!("{h}_bucket{{le=\"0.005\"}}")], 2.0);
        assert_eq!(p.samples[&format!("{h}_bucket{{le=\"0.5\"}}")], 2.0);
        assert_eq!(p.samples[&format!("{h}_bucket{{le=\"1.0\"}}")], 3.0);
        assert_eq!(p.samples[&format!("{h}_bucket{{le=\"30.0\"}}")], 3.0);
        assert_eq!(p.samples[&format!("{h}_bucket{{le=\"+Inf\"}}")], 4.0);
        assert_eq!(p.samples[&format!("{h}_count")], 4.0);
        assert_eq!(p.samples[&format!("{h}_sum")], 42.5);
    }

    #[test]
    fn label_values_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn per_actor_gauges_and_oldest_pending_age() {
        let c = Counters::default();
        let text = render(
            &[status("a", 4, 1), status("b", 0, 0)],
            &[(ActorId::new("a"), Timestamp::from_millis(1_000))],
            &[("open", 2), ("backoff", 1)],
            Timestamp::from_millis(3_500),
            &c,
        );
        let p = parse(&text);
        assert_eq!(
            p.samples["outbox_lanes_oldest_pending_seconds{actor=\"a\"}"], 2.5,
            "{text}"
        );
        assert_eq!(
            p.samples["outbox_lanes_oldest_pending_seconds{actor=\"b\"}"], 0.0,
            "{text}"
        );
        assert_eq!(p.samples["outbox_lanes_queue_depth{actor=\"a\"}"], 4.0);
        assert_eq!(p.samples["outbox_lanes_queue_depth{actor=\"b\"}"], 0.0);
        assert_eq!(p.samples["outbox_lanes_pass_running{actor=\"a\"}"], 1.0);
        assert_eq!(p.samples["outbox_lanes_dead_letters{actor=\"a\"}"], 1.0);
        assert_eq!(p.samples["outbox_lanes_stalled_lanes{actor=\"b\"}"], 0.0);
        assert_eq!(p.samples["outbox_lanes_paused_lanes{actor=\"b\"}"], 0.0);
        assert_eq!(p.samples["outbox_lanes_hosts{state=\"open\"}"], 2.0);
        assert_eq!(p.samples["outbox_lanes_hosts{state=\"backoff\"}"], 1.0);
    }
}
