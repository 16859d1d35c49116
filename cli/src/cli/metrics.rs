//! `relay --metrics-addr`: Prometheus text metrics and health probes from a small HTTP
//! responder.
//!
//! A hand-written responder rather than an HTTP server crate: it answers three GET paths
//! with `Connection: close`, and the binary otherwise needs no HTTP server.
//! - `/metrics` (and `/`): the exposition text; 503 if the store cannot be read.
//! - `/healthz`: 200 while the process serves requests (liveness: it checks nothing else).
//! - `/readyz`: 200 if the store answers a query now, else 503 with the reason (readiness).
//!
//! A store that does not answer within [`STORE_WAIT`] gets a 503 too: a probe or a scrape
//! never hangs on it.
//! - anything else: 404.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use outbox_lanes_core::{ActorId, Timestamp};
use outbox_lanes_store::ActorStatus;
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
    Ok(render(&status, &oldest, now, counters))
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
                Ok(text) => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", text),
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
                    format!(
                        "not ready: the store does not answer: {}\n",
                        super::message(&e)
                    ),
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

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The exposition text: `status` and `oldest` (each actor's oldest pending unit's enqueue
/// time) read from the store, ages taken at `now`.
pub(crate) fn render(
    status: &[ActorStatus],
    oldest: &[(ActorId, Timestamp)],
    now: Timestamp,
    counters: &Counters,
) -> String {
    let mut o = String::new();
    oldest_pending(&mut o, status.iter().map(|a| &a.actor), oldest, now);
    family(
        &mut o,
        "outbox_lanes_queue_depth",
        "gauge",
        "Units not yet finished, per actor.",
    );
    for a in status {
        let _ = writeln!(
            o,
            "outbox_lanes_queue_depth{{actor=\"{}\"}} {}",
            label(a.actor.as_str()),
            a.pending
        );
    }
    family(
        &mut o,
        "outbox_lanes_pass_running",
        "gauge",
        "1 while a pass (in any process) holds the actor's drain slot.",
    );
    for a in status {
        let _ = writeln!(
            o,
            "outbox_lanes_pass_running{{actor=\"{}\"}} {}",
            label(a.actor.as_str()),
            u8::from(a.in_flight)
        );
    }
    family(
        &mut o,
        "outbox_lanes_stalled_lanes",
        "gauge",
        "Lanes with pending units in backoff, per actor.",
    );
    for a in status {
        let _ = writeln!(
            o,
            "outbox_lanes_stalled_lanes{{actor=\"{}\"}} {}",
            label(a.actor.as_str()),
            a.lanes_in_backoff.len()
        );
    }
    family(
        &mut o,
        "outbox_lanes_dead_letters",
        "gauge",
        "Dead letters kept, per actor.",
    );
    for a in status {
        let _ = writeln!(
            o,
            "outbox_lanes_dead_letters{{actor=\"{}\"}} {}",
            label(a.actor.as_str()),
            a.dead_letters
        );
    }
    family(
        &mut o,
        "outbox_lanes_units_in_flight",
        "gauge",
        "Delivery attempts in flight in this process.",
    );
    let _ = writeln!(o, "outbox_lanes_units_in_flight {}", counters.in_flight());
    let d = counters.detail();
    family(
        &mut o,
        "outbox_lanes_delivered_total",
        "counter",
        "Recipients served by this process, per actor.",
    );
    for (actor, n) in &d.delivered_by_actor {
        let _ = writeln!(
            o,
            "outbox_lanes_delivered_total{{actor=\"{}\"}} {n}",
            label(actor)
        );
    }
    family(
        &mut o,
        "outbox_lanes_dead_lettered_total",
        "counter",
        "Recipients dead-lettered by this process, per reason.",
    );
    for (reason, n) in &d.dead_by_reason {
        let _ = writeln!(
            o,
            "outbox_lanes_dead_lettered_total{{reason=\"{}\"}} {n}",
            label(reason)
        );
    }
    family(
        &mut o,
        "outbox_lanes_attempts_total",
        "counter",
        "Delivery attempts finished by this process, per outcome.",
    );
    for (outcome, n) in &d.attempts {
        let _ = writeln!(
            o,
            "outbox_lanes_attempts_total{{outcome=\"{outcome}\"}} {n}"
        );
    }
    histogram(
        &mut o,
        "outbox_lanes_delivery_latency_seconds",
        "Attempt latency: payload read and HTTP exchange, every attempt.",
        &d.latency,
    );
    histogram(
        &mut o,
        "outbox_lanes_queue_wait_seconds",
        "From enqueue to the start of the attempt that delivered.",
        &d.queue_wait,
    );
    o
}

/// `outbox_lanes_oldest_pending_seconds` for each of `actors`: 0 for those not in `oldest`
/// (nothing pending), so that a series does not vanish when its backlog is gone.
fn oldest_pending<'a>(
    o: &mut String,
    actors: impl Iterator<Item = &'a ActorId>,
    oldest: &[(ActorId, Timestamp)],
    now: Timestamp,
) {
    family(
        o,
        "outbox_lanes_oldest_pending_seconds",
        "gauge",
        "Age of the actor's oldest pending unit (its oldest lane head), 0 with none pending.",
    );
    for actor in actors {
        let age = oldest
            .iter()
            .find(|(x, _)| x == actor)
            .map_or(0.0, |(_, t)| {
                now.saturating_duration_since(*t).as_secs_f64()
            });
        let _ = writeln!(
            o,
            "outbox_lanes_oldest_pending_seconds{{actor=\"{}\"}} {age}",
            label(actor.as_str())
        );
    }
}

fn histogram(o: &mut String, name: &str, help: &str, h: &Histogram) {
    family(o, name, "histogram", help);
    let mut cumulative = 0;
    for (bound, n) in h.bounds.iter().zip(&h.counts) {
        cumulative += n;
        let _ = writeln!(o, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let count = cumulative + h.over;
    let _ = writeln!(o, "{name}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(o, "{name}_sum {}", h.sum);
    let _ = writeln!(o, "{name}_count {count}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_format() {
        let c = Counters::default();
        let text = render(&[], &[], Timestamp::from_millis(0), &c);
        assert!(text.contains("# TYPE outbox_lanes_delivery_latency_seconds histogram"));
        assert!(text.contains("outbox_lanes_delivery_latency_seconds_bucket{le=\"0.005\"} 0"));
        assert!(text.contains("outbox_lanes_queue_wait_seconds_bucket{le=\"+Inf\"} 0"));
        assert!(text.contains("outbox_lanes_units_in_flight 0"));
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn oldest_pending_age_per_actor() {
        let (a, b) = (ActorId::new("a"), ActorId::new("b"));
        let mut text = String::new();
        oldest_pending(
            &mut text,
            [&a, &b].into_iter(),
            &[(a.clone(), Timestamp::from_millis(1_000))],
            Timestamp::from_millis(3_500),
        );
        assert!(text.contains("# TYPE outbox_lanes_oldest_pending_seconds gauge"));
        assert!(
            text.contains("outbox_lanes_oldest_pending_seconds{actor=\"a\"} 2.5\n"),
            "{text}"
        );
        assert!(
            text.contains("outbox_lanes_oldest_pending_seconds{actor=\"b\"} 0\n"),
            "{text}"
        );
    }
}
