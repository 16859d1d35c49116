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
//! The HTTP side (`--metrics-addr`, `--admin-addr`) is axum on hyper, in `admin/`: it calls
//! [`metrics`] for `/metrics` and answers `/healthz` and `/readyz` itself.

use std::time::{Duration, SystemTime};

use outbox_lanes_core::Timestamp;
use outbox_lanes_store::{ActorStatus, LaneHold, PendingHeads};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tracing::debug;

use super::backend::{Backend, Counters, HostLabels};

/// How long `/metrics` and `/readyz` wait for the store.
pub(crate) const STORE_WAIT: Duration = Duration::from_secs(5);

/// `f`, or an error if the store takes longer than [`STORE_WAIT`].
pub(crate) async fn bounded<T>(f: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::time::timeout(STORE_WAIT, f)
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {STORE_WAIT:?}")))
}

/// The exposition text, with what it needs from the store.
pub(crate) async fn metrics(backend: &Backend, counters: &Counters) -> anyhow::Result<String> {
    let status = bounded(backend.status()).await?;
    let now = Timestamp::from_system_time(SystemTime::now());
    let heads = bounded(backend.pending_heads(now)).await?;
    let hosts = host_states(&bounded(backend.host_list()).await?, now);
    Ok(render(&status, &heads, &hosts, now, counters))
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
    /// Age of the oldest head of the actor's open lanes in seconds (held lanes left out), 0
    /// with none.
    oldest_pending: f64,
    /// Lanes with pending units per hold, in the order of [`LaneHold::HELD`].
    held: [u64; LaneHold::HELD.len()],
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
    latency: Histogram,
    queue_wait: Histogram,
    host_attempts: Family<HostLabels, Counter>,
    host_latency: Family<HostLabels, Histogram, fn() -> Histogram>,
    host_in_flight: Family<HostLabels, Gauge>,
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
            "Age of the oldest head of the actor's open lanes (lanes held by a backoff, a \
             throttle, a pause or a block left out), 0 with none.",
            MetricType::Gauge,
            "actor",
            self.actors
                .iter()
                .map(|a| (a.actor.clone(), a.oldest_pending)),
            gauge,
        )?;
        let mut m = e.encode_descriptor(
            "outbox_lanes_lanes_held",
            "Lanes with pending units held on purpose, per actor and reason: throttled, \
             backoff, paused, host_blocked, strict_blocked.",
            None,
            MetricType::Gauge,
        )?;
        for a in &self.actors {
            for (hold, n) in LaneHold::HELD.iter().zip(a.held) {
                let labels = [("actor", a.actor.as_str()), ("reason", hold.as_str())];
                gauge(n, m.encode_family(&labels)?)?;
            }
        }
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
            h.encode(e.encode_descriptor(name, help, None, MetricType::Histogram)?)?;
        }
        self.host_attempts.encode(e.encode_descriptor(
            "outbox_lanes_host_attempts",
            "Delivery attempts finished by this process, per host (origin; the first 50 hosts, \
             the others as host=\"other\") and outcome.",
            None,
            MetricType::Counter,
        )?)?;
        self.host_latency.encode(e.encode_descriptor(
            "outbox_lanes_host_latency_seconds",
            "Attempt latency per host, attempts that made a request (delivered, throttled, \
             transient, permanent, gone).",
            None,
            MetricType::Histogram,
        )?)?;
        self.host_in_flight.encode(e.encode_descriptor(
            "outbox_lanes_host_in_flight",
            "Delivery attempts in flight in this process, per host.",
            None,
            MetricType::Gauge,
        )?)?;
        Ok(())
    }
}

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

/// The exposition text: `status` and `heads` (each actor's lanes with pending units per
/// hold, see `ServiceStore::pending_heads`) read from the store, ages taken at `now`. An
/// actor with no open lane pending shows an age of 0 and its held lanes as 0, so that its
/// series do not vanish when its backlog is gone.
pub(crate) fn render(
    status: &[ActorStatus],
    heads: &[PendingHeads],
    hosts: &[(&'static str, u64)],
    now: Timestamp,
    counters: &Counters,
) -> String {
    let actors = status
        .iter()
        .map(|a| {
            let mine = || heads.iter().filter(|h| h.actor == a.actor);
            ActorRow {
                actor: label(a.actor.as_str()),
                pending: a.pending,
                pass_running: u8::from(a.in_flight),
                stalled_lanes: a.lanes_in_backoff.len() as u64,
                paused_lanes: a.lanes_paused.len() as u64,
                dead_letters: a.dead_letters,
                oldest_pending: mine().find(|h| h.hold == LaneHold::Open).map_or(0.0, |h| {
                    now.saturating_duration_since(h.oldest).as_secs_f64()
                }),
                held: LaneHold::HELD
                    .map(|hold| mine().filter(|h| h.hold == hold).map(|h| h.lanes).sum()),
            }
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
        latency: counters.latency.clone(),
        queue_wait: counters.queue_wait.clone(),
        host_attempts: counters.hosts.attempts.clone(),
        host_latency: counters.hosts.latency.clone(),
        host_in_flight: counters.hosts.in_flight.clone(),
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

    use outbox_lanes_core::ActorId;

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
                "Age of the oldest head of the actor's open lanes (lanes held by a backoff, a throttle, a pause or a block left out), 0 with none.",
            ),
            (
                "outbox_lanes_lanes_held",
                "gauge",
                "Lanes with pending units held on purpose, per actor and reason: throttled, backoff, paused, host_blocked, strict_blocked.",
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
            (
                "outbox_lanes_host_attempts",
                "counter",
                "Delivery attempts finished by this process, per host (origin; the first 50 hosts, the others as host=\"other\") and outcome.",
            ),
            (
                "outbox_lanes_host_latency_seconds",
                "histogram",
                "Attempt latency per host, attempts that made a request (delivered, throttled, transient, permanent, gone).",
            ),
            (
                "outbox_lanes_host_in_flight",
                "gauge",
                "Delivery attempts in flight in this process, per host.",
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
        }
        for secs in [0.001, 0.002, 0.75, 41.75] {
            c.latency.observe(secs);
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
        assert_eq!(p.samples[&format!("{h}_sum")], 42.503);
    }

    /// Per-host series: attempts per outcome, latency of the attempts that made a request,
    /// in flight; the first `HOST_SERIES` hosts by name, the later ones as `other`.
    #[test]
    fn per_host_series_capped() {
        use super::super::backend::HOST_SERIES;
        let c = Counters::default();
        let h = &c.hosts;
        let url = |i: usize| format!("https://h{i}.example/inbox");
        h.started(&url(0));
        h.started(&url(0));
        h.finished(&url(0), "delivered", Duration::from_millis(20));
        h.started(&url(0));
        h.finished(&url(0), "transient", Duration::from_millis(700));
        h.started(&url(0));
        h.finished(&url(0), "deferred", Duration::from_millis(1));
        for i in 1..HOST_SERIES + 5 {
            h.started(&url(i));
            h.finished(&url(i), "delivered", Duration::from_millis(3));
        }
        let p = parse(&render(&[], &[], &[], Timestamp::from_millis(0), &c));
        let h0 = "https://h0.example:443";
        assert_eq!(
            p.samples[&format!(
                "outbox_lanes_host_attempts_total{{host=\"{h0}\",outcome=\"delivered\"}}"
            )],
            1.0
        );
        assert_eq!(
            p.samples[&format!(
                "outbox_lanes_host_attempts_total{{host=\"{h0}\",outcome=\"deferred\"}}"
            )],
            1.0
        );
        // Two requests made (the deferral made none), one still in flight.
        assert_eq!(
            p.samples[&format!("outbox_lanes_host_latency_seconds_count{{host=\"{h0}\"}}")],
            2.0
        );
        assert_eq!(
            p.samples[&format!(
                "outbox_lanes_host_latency_seconds_bucket{{le=\"0.025\",host=\"{h0}\"}}"
            )],
            1.0
        );
        assert_eq!(
            p.samples[&format!("outbox_lanes_host_in_flight{{host=\"{h0}\"}}")],
            1.0
        );
        let hosts: std::collections::BTreeSet<&str> = p
            .samples
            .keys()
            .filter(|k| k.starts_with("outbox_lanes_host_attempts_total"))
            .filter_map(|k| k.split("host=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(hosts.len(), HOST_SERIES + 1, "{hosts:?}");
        assert!(hosts.contains("other"), "{hosts:?}");
        assert_eq!(
            p.samples["outbox_lanes_host_attempts_total{host=\"other\",outcome=\"delivered\"}"],
            5.0
        );
        assert_eq!(
            p.samples["outbox_lanes_host_in_flight{host=\"other\"}"],
            0.0
        );
    }

    #[test]
    fn label_values_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn per_actor_gauges_and_oldest_pending_age() {
        let c = Counters::default();
        let heads = |hold, lanes, at| PendingHeads {
            actor: ActorId::new("a"),
            hold,
            lanes,
            oldest: Timestamp::from_millis(at),
        };
        // Lanes in backoff and paused since before the open lanes' head: not the lag.
        let text = render(
            &[status("a", 4, 1), status("b", 0, 0)],
            &[
                heads(LaneHold::Open, 3, 1_000),
                heads(LaneHold::Backoff, 2, 10),
                heads(LaneHold::Paused, 1, 20),
            ],
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
        let held = |actor: &str, reason: &str| {
            p.samples[&format!("outbox_lanes_lanes_held{{actor=\"{actor}\",reason=\"{reason}\"}}")]
        };
        assert_eq!(held("a", "backoff"), 2.0);
        assert_eq!(held("a", "paused"), 1.0);
        for reason in ["throttled", "host_blocked", "strict_blocked"] {
            assert_eq!(held("a", reason), 0.0);
        }
        for reason in LaneHold::HELD {
            assert_eq!(held("b", reason.as_str()), 0.0);
        }
    }

    /// Every outcome the attempt hook can report, every dead-letter reason a relay makes
    /// and every hold is in docs/cli.md's metrics tables (issue 39: `deferred` was not).
    #[test]
    fn every_exported_label_value_is_documented() {
        use outbox_lanes_core::{DeadReason, Outcome};
        let docs = include_str!("../../../docs/cli.md");
        let every = [
            Outcome::Delivered,
            Outcome::Throttled { retry_after: None },
            Outcome::Transient { retry_after: None },
            Outcome::Permanent,
            Outcome::Gone,
            Outcome::Refused,
            Outcome::NotSent,
            Outcome::Deferred {
                retry_after: Duration::ZERO,
            },
            Outcome::Held,
            Outcome::SetAside {
                reason: DeadReason::Blocked,
            },
        ];
        for o in every {
            // A new outcome fails to compile here until it is listed above (and documented).
            match o {
                Outcome::Delivered
                | Outcome::Throttled { .. }
                | Outcome::Transient { .. }
                | Outcome::Permanent
                | Outcome::Gone
                | Outcome::Refused
                | Outcome::NotSent
                | Outcome::Deferred { .. }
                | Outcome::Held
                | Outcome::SetAside { .. } => {}
            }
            assert!(
                docs.contains(&format!("\n| `{}` | ", o.as_str())),
                "outcome {} is not in docs/cli.md's outcome table",
                o.as_str()
            );
        }
        let row = |metric: &str| {
            docs.lines()
                .find(|l| l.starts_with(&format!("| `{metric}` |")))
                .unwrap_or_else(|| panic!("no row for {metric} in docs/cli.md"))
        };
        let dead = row("outbox_lanes_dead_lettered_total{reason}");
        for r in DeadReason::ALL {
            assert!(dead.contains(&format!("`{}`", r.as_str())), "{r:?}: {dead}");
        }
        let held = row("outbox_lanes_lanes_held{actor,reason}");
        for h in LaneHold::HELD {
            assert!(held.contains(&format!("`{}`", h.as_str())), "{h:?}: {held}");
        }
        let hosts = row("outbox_lanes_hosts{state}");
        for (state, _) in host_states(&[], Timestamp::from_millis(0)) {
            assert!(hosts.contains(&format!("`{state}`")), "{state}: {hosts}");
        }
    }
}
