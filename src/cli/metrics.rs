//! `relay --metrics-addr`: Prometheus text metrics from a small HTTP responder.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use outbox_lanes_store::ActorStatus;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tracing::debug;

use super::backend::{Backend, Counters, Histogram};

/// Binds `addr` and serves `GET /metrics` until the task is aborted.
///
/// # Errors
/// The address cannot be bound.
pub(crate) async fn serve(
    addr: SocketAddr,
    backend: Backend,
    counters: Arc<Counters>,
) -> std::io::Result<JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "serving metrics at /metrics");
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
    let (status, ctype, body) = if method != "GET" && method != "HEAD" {
        (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_string(),
        )
    } else if path == "/metrics" || path == "/" {
        match backend.status().await {
            Ok(st) => (
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                render(&st, counters),
            ),
            Err(e) => (
                "503 Service Unavailable",
                "text/plain",
                format!("store: {}\n", super::message(&e)),
            ),
        }
    } else {
        ("404 Not Found", "text/plain", "try /metrics\n".to_string())
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

/// The exposition text.
pub(crate) fn render(status: &[ActorStatus], counters: &Counters) -> String {
    let mut o = String::new();
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
        let text = render(&[], &c);
        assert!(text.contains("# TYPE outbox_lanes_delivery_latency_seconds histogram"));
        assert!(text.contains("outbox_lanes_delivery_latency_seconds_bucket{le=\"0.005\"} 0"));
        assert!(text.contains("outbox_lanes_queue_wait_seconds_bucket{le=\"+Inf\"} 0"));
        assert!(text.contains("outbox_lanes_units_in_flight 0"));
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
