//! `rows show --actor A --id ROW [--json]`: where a row stands per recipient (pending, in
//! flight, delivered, dead letter), with the delivery log's history of its attempts; and the
//! attempt history `dead-letters show` adds (issue 39).
//!
//! Everything a recipient controls (its answer's body, its error texts) is printed as text:
//! in a table, control characters become `\u{…}` escapes, so an answer cannot move the
//! terminal's cursor or colour it; JSON keeps it verbatim (as a JSON string).

use std::time::{Duration, SystemTime};

use outbox_lanes_core::{ActorId, Timestamp};
use outbox_lanes_store::{DeliveryLogRow, LaneInFlight, RowDelivery, RowDeliveryState};
use serde::Serialize;

use super::backend::Backend;
use super::output::{table, time};

fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

/// `text` on one line, every control character escaped (`\n`, `\u{1b}`…).
pub(crate) fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[derive(Serialize)]
pub(crate) struct AttemptJson<'a> {
    attempt: u32,
    started_at: String,
    duration_ms: u64,
    status: Option<u16>,
    error_class: Option<&'a str>,
    body: Option<&'a str>,
    delivered: bool,
}

/// The delivery log's entries as JSON.
pub(crate) fn history_json(h: &[DeliveryLogRow]) -> Vec<AttemptJson<'_>> {
    h.iter()
        .map(|e| AttemptJson {
            attempt: e.attempt,
            started_at: time(e.started_at),
            duration_ms: e.duration_ms,
            status: e.status,
            error_class: e.error_class.as_deref(),
            body: e.body.as_deref(),
            delivered: e.delivered,
        })
        .collect()
}

/// The delivery log's entries as a table, then each kept body on a line of its own.
pub(crate) fn history_text(h: &[DeliveryLogRow]) -> String {
    if h.is_empty() {
        return "(no attempt in the delivery log: none yet, the log is off, or past its window)\n"
            .to_owned();
    }
    let rows: Vec<Vec<String>> = h
        .iter()
        .map(|e| {
            vec![
                e.attempt.to_string(),
                time(e.started_at),
                format!("{} ms", e.duration_ms),
                e.status.map_or_else(|| "-".to_owned(), |s| s.to_string()),
                if e.delivered {
                    "delivered".to_owned()
                } else {
                    e.error_class
                        .as_deref()
                        .map_or_else(|| "-".to_owned(), one_line)
                },
            ]
        })
        .collect();
    let mut out = table(&["ATTEMPT", "STARTED", "TOOK", "STATUS", "OUTCOME"], &rows);
    for e in h {
        if let Some(b) = &e.body {
            out.push_str(&format!("body of attempt {}: {}\n", e.attempt, one_line(b)));
        }
    }
    out
}

#[derive(Serialize)]
struct RecipientJson<'a> {
    recipient: &'a str,
    unit: u64,
    state: &'static str,
    in_flight_since: Option<String>,
    in_flight_ms: Option<u64>,
    attempts: u32,
    last_status: Option<u16>,
    last_error: Option<&'a str>,
    delivered_at: Option<String>,
    attempt_history: Vec<AttemptJson<'a>>,
}

#[derive(Serialize)]
struct RowJson<'a> {
    actor: &'a str,
    row_id: &'a str,
    recipients: Vec<RecipientJson<'a>>,
}

fn since(t: Timestamp, now: Timestamp) -> Duration {
    now.saturating_duration_since(t)
}

fn row_json<'a>(actor: &'a str, row: &'a str, d: &'a [RowDelivery]) -> RowJson<'a> {
    let now = now();
    RowJson {
        actor,
        row_id: row,
        recipients: d
            .iter()
            .map(|r| {
                let flight = match r.state {
                    RowDeliveryState::InFlight(t) => Some(t),
                    _ => None,
                };
                RecipientJson {
                    recipient: &r.recipient,
                    unit: r.unit.0,
                    state: r.state.as_str(),
                    in_flight_since: flight.map(time),
                    in_flight_ms: flight.map(|t| since(t, now).as_millis() as u64),
                    attempts: r.attempts,
                    last_status: r.last_status,
                    last_error: r.last_error.as_deref(),
                    delivered_at: r.delivered_at.map(time),
                    attempt_history: history_json(&r.history),
                }
            })
            .collect(),
    }
}

fn row_text(actor: &str, row: &str, d: &[RowDelivery]) -> String {
    let now = now();
    let summary: Vec<Vec<String>> = d
        .iter()
        .map(|r| {
            let state = match r.state {
                RowDeliveryState::InFlight(t) => {
                    format!("in flight {} s", since(t, now).as_secs())
                }
                RowDeliveryState::Delivered => match r.delivered_at {
                    Some(t) => format!(
                        "delivered at {} after {} attempt{}",
                        time(t),
                        r.attempts,
                        if r.attempts == 1 { "" } else { "s" }
                    ),
                    None => "delivered".to_owned(),
                },
                s => s.as_str().to_owned(),
            };
            let last = match (r.last_status, r.last_error.as_deref()) {
                (Some(s), _) => s.to_string(),
                (None, Some(e)) => one_line(outbox_lanes_store::error_class(e)),
                (None, None) => "-".to_owned(),
            };
            vec![
                one_line(&r.recipient),
                r.unit.0.to_string(),
                state,
                r.attempts.to_string(),
                last,
            ]
        })
        .collect();
    let mut out = format!("row {} of actor {}\n\n", one_line(row), one_line(actor));
    out.push_str(&table(
        &["RECIPIENT", "UNIT", "STATE", "ATTEMPTS", "LAST"],
        &summary,
    ));
    for r in d {
        out.push_str(&format!(
            "\n{} (unit {})\n",
            one_line(&r.recipient),
            r.unit.0
        ));
        if let Some(e) = &r.last_error {
            out.push_str(&format!("last error: {}\n", one_line(e)));
        }
        out.push_str(&history_text(&r.history));
    }
    out
}

/// `rows show`.
pub(crate) async fn cmd_rows_show(
    backend: &Backend,
    actor: String,
    id: String,
    json: bool,
) -> anyhow::Result<()> {
    let a = ActorId::new(&actor);
    let store = backend.store();
    let (a2, id2) = (a.clone(), id.clone());
    let rows = tokio::task::spawn_blocking(move || store.row_deliveries(&a2, &id2)).await??;
    if rows.is_empty() {
        return Err(super::usage(format!(
            "actor {actor:?} has no row {id:?} (never enqueued, or finished and past the delivery log's window)"
        )));
    }
    if json {
        super::print_json(&row_json(a.as_str(), &id, &rows))
    } else {
        super::print(&row_text(a.as_str(), &id, &rows))
    }
}

#[derive(Serialize)]
pub(crate) struct InFlightJson<'a> {
    actor: &'a str,
    recipient: &'a str,
    ordering_key: Option<&'a str>,
    unit: u64,
    since: String,
    in_flight_ms: u64,
}

/// Every lane whose head a relay has had in flight for longer than 5 s, longest first.
pub(crate) async fn lanes_in_flight(backend: &Backend) -> anyhow::Result<Vec<LaneInFlight>> {
    let store = backend.store();
    Ok(tokio::task::spawn_blocking(move || store.lanes_in_flight()).await??)
}

/// `status --json`'s `lanes_in_flight`.
pub(crate) fn in_flight_json(v: &[LaneInFlight]) -> Vec<InFlightJson<'_>> {
    let now = now();
    v.iter()
        .map(|l| InFlightJson {
            actor: l.actor.as_str(),
            recipient: l.key.recipient(),
            ordering_key: l.key.ordering_key(),
            unit: l.unit.0,
            since: time(l.since),
            in_flight_ms: since(l.since, now).as_millis() as u64,
        })
        .collect()
}

/// `status`'s lines about lanes in flight for long (nothing when there is none).
pub(crate) fn in_flight_text(v: &[LaneInFlight]) -> String {
    if v.is_empty() {
        return String::new();
    }
    let now = now();
    let rows: Vec<Vec<String>> = v
        .iter()
        .map(|l| {
            vec![
                one_line(l.actor.as_str()),
                one_line(&super::output::lane_name(&l.key)),
                l.unit.0.to_string(),
                format!("{} s", since(l.since, now).as_secs()),
            ]
        })
        .collect();
    format!(
        "\n{} lane(s) with an attempt in flight for longer than 5 s:\n{}",
        v.len(),
        table(&["ACTOR", "LANE", "UNIT", "IN FLIGHT"], &rows)
    )
}

/// The attempt history of a dead letter (its unit and recipient), from the delivery log.
pub(crate) async fn dead_letter_history(
    backend: &Backend,
    d: &outbox_lanes_store::DeadLetter,
) -> anyhow::Result<Vec<DeliveryLogRow>> {
    let store = backend.store();
    let (actor, row) = (d.actor.clone(), d.row_id.clone());
    let log = tokio::task::spawn_blocking(move || store.delivery_log(&actor, &row)).await??;
    let recipient = d.key.recipient().to_owned();
    Ok(log
        .into_iter()
        .filter(|e| e.unit == d.unit && e.recipient == recipient)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_stay_on_one_line_without_control_characters() {
        assert_eq!(
            one_line("<script>\n\u{1b}[31mred"),
            "<script>\\n\\u{1b}[31mred"
        );
    }
}
