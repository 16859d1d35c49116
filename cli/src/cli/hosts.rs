//! `outbox-lanes hosts`: the recipient hosts (origins) as the relays left them — connection
//! health, lanes, pending units, last connection error, next probe, signature scheme — and an
//! operator's `retry`, `block` and `unblock` of one.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use outbox_lanes_core::Timestamp;
use outbox_lanes_store::{HostBlock, HostFigures, HostStatus, origin_of};
use serde::Serialize;
use tracing::{info, warn};

use super::args::{HostAction, HostsArgs};
use super::backend::Backend;
use super::output::{table, time};
use super::{print, print_json, usage};

/// A host's state as `hosts` shows it.
pub(crate) fn state(h: &HostStatus, now: Timestamp) -> &'static str {
    let r = &h.record;
    match r.blocked {
        HostBlock::Hold => return "blocked",
        HostBlock::DeadLetter => return "blocked (dead letters)",
        HostBlock::Open => {}
    }
    if r.level > 0 {
        if r.not_before.is_some_and(|t| t > now) {
            "backoff"
        } else {
            "probing"
        }
    } else if r.failures > 0 {
        "failing"
    } else {
        "open"
    }
}

/// The canonical origin of what the operator typed: `https://host[:port]`, any URL on the
/// host, or a bare host (https).
pub(crate) fn parse_origin(text: &str) -> anyhow::Result<String> {
    let t = text.trim();
    let url = if t.contains("://") {
        t.to_owned()
    } else {
        format!("https://{t}")
    };
    // A bare origin has no path: the parse wants one.
    let with_path = match url.split_once("://") {
        Some((_, rest)) if !rest.contains('/') => format!("{url}/"),
        _ => url,
    };
    origin_of(&with_path)
        .ok_or_else(|| usage(format!("{text:?} is not a host: write https://host[:port]")))
}

#[derive(Serialize)]
struct HostJson<'a> {
    origin: &'a str,
    state: &'static str,
    lanes: u64,
    pending: u64,
    /// Its lanes whose head has been in flight for longer than 5 s (issue 39).
    in_flight_long: u64,
    failures: u32,
    backoff_level: u32,
    next_probe: Option<String>,
    failing_since: Option<String>,
    last_error: Option<&'a str>,
    signature_spec: Option<&'a str>,
    signature_spec_learned: Option<String>,
    blocked: &'static str,
    /// Its figures from the delivery log over the last hour (issue 39); `null` when the
    /// outbox keeps no log (`--delivery-log-retention 0s`).
    figures: Option<FiguresJson<'a>>,
}

/// The window `hosts` counts a host's figures over: the last hour.
pub(crate) const FIGURES_WINDOW: Duration = Duration::from_secs(3600);

#[derive(Serialize)]
struct LatencyJson {
    p50: u64,
    p95: u64,
    p99: u64,
}

#[derive(Serialize)]
struct FiguresJson<'a> {
    since: String,
    attempts: u64,
    outcomes: &'a BTreeMap<String, u64>,
    success_rate: Option<f64>,
    latency_ms: Option<LatencyJson>,
}

static NO_OUTCOMES: BTreeMap<String, u64> = BTreeMap::new();

/// A host's figures as JSON: zero attempts (and `null` rate and latency) for a host without
/// an entry in the window.
fn figures_json<'a>(f: Option<&'a HostFigures>, since: Timestamp) -> FiguresJson<'a> {
    match f {
        Some(f) => FiguresJson {
            since: time(f.since),
            attempts: f.attempts,
            outcomes: &f.outcomes,
            success_rate: f.success_rate(),
            latency_ms: f.latency_ms.map(|l| LatencyJson {
                p50: l.p50,
                p95: l.p95,
                p99: l.p99,
            }),
        },
        None => FiguresJson {
            since: time(since),
            attempts: 0,
            outcomes: &NO_OUTCOMES,
            success_rate: None,
            latency_ms: None,
        },
    }
}

/// The figures of `origin`, if the log has any.
fn figures_of<'a>(figures: Option<&'a [HostFigures]>, origin: &str) -> Option<&'a HostFigures> {
    figures?.iter().find(|f| f.origin == origin)
}

fn host_json<'a>(
    h: &'a HostStatus,
    now: Timestamp,
    figures: Option<&'a [HostFigures]>,
    since: Timestamp,
) -> HostJson<'a> {
    let r = &h.record;
    HostJson {
        origin: &r.origin,
        state: state(h, now),
        lanes: h.lanes,
        pending: h.pending,
        in_flight_long: h.in_flight_long,
        failures: r.failures,
        backoff_level: r.level,
        next_probe: r.not_before.filter(|_| r.level > 0).map(time),
        failing_since: r.failing_since.map(time),
        last_error: r.last_error.as_deref(),
        signature_spec: r.spec.as_deref(),
        signature_spec_learned: r.spec_at.map(time),
        blocked: r.blocked.as_str(),
        figures: figures.map(|all| figures_json(figures_of(Some(all), &r.origin), since)),
    }
}

/// The short kind of a connection error (`connection_refused`, `dns`, …): its stable code.
fn short(e: &str) -> &str {
    e.split(':').next().unwrap_or(e)
}

/// A success rate as a whole percentage (`99%`; `-` without an attempt).
fn percent(f: Option<&HostFigures>) -> String {
    f.and_then(HostFigures::success_rate)
        .map_or("-".into(), |r| format!("{:.0}%", r * 100.0))
}

/// A host's 95th latency percentile (`120ms`; `-` without an attempt).
fn p95(f: Option<&HostFigures>) -> String {
    f.and_then(|f| f.latency_ms)
        .map_or("-".into(), |l| format!("{}ms", l.p95))
}

fn hosts_table(hosts: &[HostStatus], now: Timestamp, figures: Option<&[HostFigures]>) -> String {
    let rows: Vec<Vec<String>> = hosts
        .iter()
        .map(|h| {
            let r = &h.record;
            let f = figures_of(figures, &r.origin);
            vec![
                r.origin.clone(),
                state(h, now).to_owned(),
                h.lanes.to_string(),
                h.pending.to_string(),
                r.last_error
                    .as_deref()
                    .map_or("-".into(), |e| short(e).to_owned()),
                r.not_before
                    .filter(|_| r.level > 0)
                    .map_or("-".into(), time),
                r.spec.clone().unwrap_or_else(|| "-".into()),
                percent(f),
                p95(f),
            ]
        })
        .collect();
    table(
        &[
            "ORIGIN",
            "STATE",
            "LANES",
            "PENDING",
            "LAST ERROR",
            "NEXT PROBE",
            "SIGNATURE",
            "SUCCESS",
            "P95",
        ],
        &rows,
    )
}

/// `hosts`, `hosts list`, `hosts retry|block|unblock ORIGIN`.
pub(crate) async fn cmd_hosts(backend: &Backend, args: HostsArgs) -> anyhow::Result<()> {
    let now = Timestamp::from_system_time(SystemTime::now());
    let (name, origin, json, op) = match args.action {
        None => return list(backend, args.json, now).await,
        Some(HostAction::List { json }) => return list(backend, json || args.json, now).await,
        Some(HostAction::Retry { origin, json }) => ("retry", origin, json, None),
        Some(HostAction::Block {
            origin,
            dead_letter,
            json,
        }) => (
            "block",
            origin,
            json,
            Some(if dead_letter {
                HostBlock::DeadLetter
            } else {
                HostBlock::Hold
            }),
        ),
        Some(HostAction::Unblock { origin, json }) => {
            ("unblock", origin, json, Some(HostBlock::Open))
        }
    };
    let given = origin;
    let origin = parse_origin(&given)?;
    warn_if_unknown(backend, &given, &origin).await?;
    let n = match op {
        None => backend.host_retry(origin.clone()).await?,
        Some(block) => backend.host_block(origin.clone(), block).await?,
    };
    let what = match (name, op) {
        ("retry", _) => format!("{n} waiting lane(s) retried now"),
        (_, Some(HostBlock::Hold)) => format!("{n} lane(s) paused"),
        (_, Some(HostBlock::DeadLetter)) => {
            format!("{n} unit(s) dead-lettered (reason blocked)")
        }
        _ => format!("{n} lane(s) resumed"),
    };
    info!(action = name, origin = %origin, changed = n, "host action done");
    if json {
        print_json(&serde_json::json!({ "action": name, "origin": origin, "changed": n }))
    } else {
        print(&format!("{name}: {origin}: {what}\n"))
    }
}

/// Warns when no lane and no host row of the outbox has `origin`: the action is kept for it
/// (a block may come before the first row to a host), but a typo, or a host written without
/// its scheme that meant `http://`, would otherwise act on nothing without a word.
async fn warn_if_unknown(backend: &Backend, given: &str, origin: &str) -> anyhow::Result<()> {
    let known = backend.host_list().await?;
    if known.iter().any(|h| h.record.origin == origin) {
        return Ok(());
    }
    let hint = if given.contains("://") {
        String::new()
    } else {
        let http = origin.replacen("https://", "http://", 1);
        let http = http
            .strip_suffix(":443")
            .map_or(http.clone(), |h| format!("{h}:80"));
        if known.iter().any(|h| h.record.origin == http) {
            format!(" (a host written without a scheme means https://; did you mean {http}?)")
        } else {
            " (a host written without a scheme means https://)".to_owned()
        }
    };
    warn!(
        origin,
        "no lane or host of this outbox has this origin; the action is kept for it{hint}"
    );
    Ok(())
}

async fn list(backend: &Backend, json: bool, now: Timestamp) -> anyhow::Result<()> {
    let hosts = backend.host_list().await?;
    let since = Timestamp::from_millis(
        now.as_millis()
            .saturating_sub(u64::try_from(FIGURES_WINDOW.as_millis()).unwrap_or(u64::MAX)),
    );
    let figures = backend.host_figures(since).await?;
    let figures = figures.as_deref();
    if json {
        let v: Vec<HostJson<'_>> = hosts
            .iter()
            .map(|h| host_json(h, now, figures, since))
            .collect();
        print_json(&serde_json::json!({ "hosts": v }))
    } else if hosts.is_empty() {
        print("no hosts\n")
    } else {
        print(&hosts_table(&hosts, now, figures))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_is_written_as_a_url_or_a_bare_host() {
        assert_eq!(
            parse_origin("https://A.Example").unwrap(),
            "https://a.example:443"
        );
        assert_eq!(
            parse_origin("a.example:8443").unwrap(),
            "https://a.example:8443"
        );
        assert_eq!(
            parse_origin("http://127.0.0.1:9000/inbox?x").unwrap(),
            "http://127.0.0.1:9000"
        );
        assert!(parse_origin("ftp://a.example").is_err());
        assert!(parse_origin("").is_err());
    }
}
