//! Plain tables and JSON for `status`, `lanes` and `dead-letters` (`show` included).
//!
//! The table renderer is ours: a fixed, border-less format (left-aligned columns two spaces
//! apart, trailing spaces trimmed) that people read and scripts `awk`, in a dozen lines; a
//! table crate (comfy-table, tabled) would bring a layout engine for it. Cell widths come from
//! `unicode-width`, so actor names and recipients outside ASCII still line up.

use std::time::{Duration, SystemTime};

use outbox_lanes_core::{LaneKey, Timestamp};
use outbox_lanes_store::{ActorStatus, DeadLetter, LaneState, LaneStatus, LaneSummary, Payload};
use serde::Serialize;
use unicode_width::UnicodeWidthStr as _;

/// RFC 3339 in UTC with milliseconds: the logs' format, from one definition.
pub(crate) use outbox_lanes_tokio::rfc3339 as time;

fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

/// `1.5s`, `3m 2s`, rounded to what a person reads.
fn age(d: Duration) -> String {
    let d = if d >= Duration::from_secs(60) {
        Duration::from_secs(d.as_secs())
    } else {
        Duration::from_millis(d.as_millis() as u64 / 100 * 100)
    };
    humantime::format_duration(d).to_string()
}

/// Left-aligned columns, two spaces apart.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.width()).collect();
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.width());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, c) in cells.enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            l.push_str(c);
            let pad = width.get(i).copied().unwrap_or(0).saturating_sub(c.width());
            l.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
    out
}

/// The last status and error in one cell, without saying the status twice.
fn last_error(status: Option<u16>, error: Option<&str>) -> String {
    match (status, error) {
        (Some(s), Some(e)) if e == format!("status {s}") => s.to_string(),
        (Some(s), Some(e)) => format!("{s} {e}"),
        (Some(s), None) => s.to_string(),
        (None, Some(e)) => e.to_owned(),
        (None, None) => "-".into(),
    }
}

/// The last failure as a short kind for a table cell: the status (`503`), or the error's
/// stable code (`timeout`, `connection_refused`, `interrupted`, …). The whole text is in
/// `--json` and `dead-letters show`.
fn short_error(status: Option<u16>, error: Option<&str>) -> String {
    match (status, error) {
        (Some(s), _) => s.to_string(),
        (None, Some(e)) => {
            let code = e.split(':').next().unwrap_or(e).trim();
            if code.is_empty() || code.len() > 40 || code.contains(' ') {
                e.chars().take(40).collect()
            } else {
                code.to_owned()
            }
        }
        (None, None) => "-".into(),
    }
}

pub(crate) fn lane_name(k: &LaneKey) -> String {
    match k.ordering_key() {
        Some(o) => format!("{} [{o}]", k.recipient()),
        None => k.recipient().to_owned(),
    }
}

/// A lane that is not open, in `status --json`.
#[derive(Serialize)]
struct WaitingLaneJson<'a> {
    recipient: &'a str,
    ordering_key: Option<&'a str>,
    /// `throttled`, `backoff`, `paused`, `strict_blocked` or `unavailable`.
    state: &'static str,
    /// The backoff level, for `backoff`.
    backoff_level: Option<u32>,
    /// RFC 3339, for `throttled` and `backoff`, and an `unavailable` lane's next probe.
    next_attempt: Option<String>,
}

/// The holder of the drain slot.
#[derive(Serialize)]
struct SlotJson<'a> {
    holder: &'a str,
    lease_expires: String,
}

#[derive(Serialize)]
struct ActorJson<'a> {
    actor: &'a str,
    pending: u64,
    in_flight: bool,
    slot: Option<SlotJson<'a>>,
    lanes_in_backoff: Vec<WaitingLaneJson<'a>>,
    lanes_paused: Vec<WaitingLaneJson<'a>>,
    dead_letters: u64,
}

#[derive(Serialize)]
struct StatusJson<'a> {
    actors: Vec<ActorJson<'a>>,
}

fn waiting_json(l: &LaneSummary) -> WaitingLaneJson<'_> {
    WaitingLaneJson {
        recipient: l.key.recipient(),
        ordering_key: l.key.ordering_key(),
        state: l.state.name(),
        backoff_level: match l.state {
            LaneState::Backoff(n) => Some(n),
            _ => None,
        },
        next_attempt: l.next_attempt.map(time),
    }
}

/// `status --json`.
pub(crate) fn status_json(s: &[ActorStatus]) -> impl Serialize + '_ {
    StatusJson {
        actors: s
            .iter()
            .map(|a| ActorJson {
                actor: a.actor.as_str(),
                pending: a.pending,
                in_flight: a.in_flight,
                slot: a.slot.as_ref().map(|h| SlotJson {
                    holder: &h.holder,
                    lease_expires: time(h.lease_expires),
                }),
                lanes_in_backoff: a.lanes_in_backoff.iter().map(waiting_json).collect(),
                lanes_paused: a.lanes_paused.iter().map(waiting_json).collect(),
                dead_letters: a.dead_letters,
            })
            .collect(),
    }
}

fn count(n: usize) -> String {
    if n == 0 { "-".into() } else { n.to_string() }
}

/// `status`.
pub(crate) fn status_table(s: &[ActorStatus]) -> String {
    if s.is_empty() {
        return "no actor has pending units or dead letters\n".into();
    }
    let mut rows = Vec::new();
    for a in s {
        rows.push(vec![
            a.actor.as_str().to_owned(),
            a.pending.to_string(),
            a.slot.as_ref().map_or("-".into(), |h| h.holder.clone()),
            a.slot
                .as_ref()
                .map_or("-".into(), |h| time(h.lease_expires)),
            count(a.lanes_in_backoff.len()),
            count(a.lanes_paused.len()),
            a.dead_letters.to_string(),
        ]);
    }
    let mut out = table(
        &[
            "ACTOR",
            "PENDING",
            "PASS HELD BY",
            "LEASE ENDS",
            "LANES IN BACKOFF",
            "LANES PAUSED",
            "DEAD LETTERS",
        ],
        &rows,
    );
    let waiting: Vec<Vec<String>> = s
        .iter()
        .flat_map(|a| {
            a.lanes_in_backoff.iter().chain(&a.lanes_paused).map(|l| {
                vec![
                    a.actor.as_str().to_owned(),
                    lane_name(&l.key),
                    l.state.to_string(),
                    l.next_attempt.map_or("-".into(), time),
                ]
            })
        })
        .collect();
    if !waiting.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &["ACTOR", "LANE NOT OPEN", "STATE", "NEXT ATTEMPT"],
            &waiting,
        ));
    }
    out
}

#[derive(Serialize)]
struct LaneJson<'a> {
    lane: i64,
    recipient: &'a str,
    ordering_key: Option<&'a str>,
    depth: u64,
    head_enqueued_at: Option<String>,
    head_age_ms: Option<u64>,
    last_status: Option<u16>,
    last_error: Option<&'a str>,
    last_error_stale: bool,
    state: &'static str,
    not_before: Option<String>,
    backoff_level: u32,
    failing_since: Option<String>,
    unavailable_since: Option<String>,
    strict: bool,
    paused: bool,
    pause_reason: Option<&'a str>,
    /// Since when the head has been in flight (marked after 5 s in flight; issue 39).
    in_flight_since: Option<String>,
    in_flight_ms: Option<u64>,
    in_flight_unit: Option<u64>,
}

#[derive(Serialize)]
struct LanesJson<'a> {
    actor: &'a str,
    lanes: Vec<LaneJson<'a>>,
}

fn head_age(l: &LaneStatus, now: Timestamp) -> Option<Duration> {
    l.head_enqueued_at.map(|t| now.saturating_duration_since(t))
}

/// `lanes --json`.
pub(crate) fn lanes_json<'a>(actor: &'a str, lanes: &'a [LaneStatus]) -> impl Serialize + 'a {
    let now = now();
    LanesJson {
        actor,
        lanes: lanes
            .iter()
            .map(|l| LaneJson {
                lane: l.lane.0,
                recipient: l.key.recipient(),
                ordering_key: l.key.ordering_key(),
                depth: l.depth,
                head_enqueued_at: l.head_enqueued_at.map(time),
                head_age_ms: head_age(l, now).map(|d| d.as_millis() as u64),
                last_status: l.last_status,
                last_error: l.last_error.as_deref(),
                last_error_stale: l.last_error_stale,
                state: l.state(now).name(),
                not_before: l.not_before.map(time),
                backoff_level: l.backoff_level,
                failing_since: l.failing_since.map(time),
                unavailable_since: l.unavailable_since.map(time),
                strict: l.strict,
                paused: l.paused,
                pause_reason: l.pause_reason.as_deref(),
                in_flight_since: l.in_flight_since.map(time),
                in_flight_ms: l
                    .in_flight_since
                    .map(|t| now.saturating_duration_since(t).as_millis() as u64),
                in_flight_unit: l.in_flight_unit.map(|u| u.0),
            })
            .collect(),
    }
}

/// `lanes`.
pub(crate) fn lanes_table(lanes: &[LaneStatus]) -> String {
    let now = now();
    let rows: Vec<Vec<String>> = lanes
        .iter()
        .map(|l| {
            let state = l.state(now);
            let state = match (state, l.pause_reason.as_deref(), l.in_flight_since) {
                (LaneState::Paused, Some(r), _) => format!("{state} ({r})"),
                // Its head has been in flight for longer than the relay's threshold (5 s).
                (LaneState::Open, _, Some(t)) => {
                    format!("in flight {} s", now.saturating_duration_since(t).as_secs())
                }
                // A probe hanging in a lane in backoff: in flight, and why it probes.
                (_, _, Some(t)) => format!(
                    "in flight {} s ({state})",
                    now.saturating_duration_since(t).as_secs()
                ),
                // Nothing pending: the backoff only applies to the lane's next row, if one comes.
                (LaneState::Backoff(_) | LaneState::Throttled, _, None) if l.depth == 0 => {
                    format!("idle ({state})")
                }
                _ => state.to_string(),
            };
            let mut last = short_error(l.last_status, l.last_error.as_deref());
            if l.last_error_stale {
                last.push_str(" (stale)");
            }
            vec![
                lane_name(&l.key),
                l.depth.to_string(),
                head_age(l, now).map_or("-".into(), age),
                last,
                l.not_before.map_or("-".into(), time),
                state,
                if l.strict { "strict" } else { "-" }.into(),
            ]
        })
        .collect();
    table(
        &[
            "LANE",
            "DEPTH",
            "HEAD AGE",
            "LAST ERROR",
            "NOT BEFORE",
            "STATE",
            "MODE",
        ],
        &rows,
    )
}

#[derive(Serialize)]
struct DeadJson<'a> {
    id: i64,
    unit: u64,
    row_id: &'a str,
    actor: &'a str,
    recipient: &'a str,
    ordering_key: Option<&'a str>,
    reason: &'static str,
    last_status: Option<u16>,
    last_error: Option<&'a str>,
    attempts: u32,
    first_attempt_at: Option<String>,
    last_attempt_at: Option<String>,
    seq: u64,
    dead_at: String,
}

#[derive(Serialize)]
struct DeadListJson<'a> {
    dead_letters: Vec<DeadJson<'a>>,
}

/// `dead-letters list --json`.
pub(crate) fn dead_json(d: &[DeadLetter]) -> impl Serialize + '_ {
    DeadListJson {
        dead_letters: d.iter().map(dead_one).collect(),
    }
}

fn dead_one(d: &DeadLetter) -> DeadJson<'_> {
    DeadJson {
        id: d.id.0,
        unit: d.unit.0,
        row_id: &d.row_id,
        actor: d.actor.as_str(),
        recipient: d.key.recipient(),
        ordering_key: d.key.ordering_key(),
        reason: d.reason.as_str(),
        last_status: d.last_status,
        last_error: d.last_error.as_deref(),
        attempts: d.attempts,
        first_attempt_at: d.first_attempt_at.map(time),
        last_attempt_at: d.last_attempt_at.map(time),
        seq: d.seq.0,
        dead_at: time(d.dead_at),
    }
}

/// `dead-letters list`.
pub(crate) fn dead_table(d: &[DeadLetter]) -> String {
    if d.is_empty() {
        return "no dead letters\n".into();
    }
    let rows: Vec<Vec<String>> = d
        .iter()
        .map(|d| {
            let last = short_error(d.last_status, d.last_error.as_deref());
            vec![
                d.id.0.to_string(),
                d.actor.as_str().to_owned(),
                d.row_id.clone(),
                lane_name(&d.key),
                d.reason.as_str().to_owned(),
                last,
                d.attempts.to_string(),
                time(d.dead_at),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "ACTOR",
            "ROW",
            "RECIPIENT",
            "REASON",
            "LAST",
            "ATTEMPTS",
            "DEAD AT",
        ],
        &rows,
    )
}

#[derive(Serialize)]
struct DryRunJson<'a> {
    dry_run: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    would_replay: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    would_purge: Option<usize>,
    /// A replay's: the selected dead letters left out because their recipients have them.
    #[serde(skip_serializing_if = "Option::is_none")]
    skipped_delivered: Option<usize>,
    dead_letters: Vec<DeadJson<'a>>,
}

/// `dead-letters replay|purge --dry-run --json`: what would be replayed (`replay`, with the
/// count of those skipped as delivered) or purged (`None`), each dead letter as `list --json`
/// has it.
pub(crate) fn dead_dry_run_json(replay: Option<usize>, d: &[DeadLetter]) -> impl Serialize + '_ {
    DryRunJson {
        dry_run: true,
        would_replay: replay.map(|_| d.len()),
        would_purge: replay.is_none().then_some(d.len()),
        skipped_delivered: replay,
        dead_letters: d.iter().map(dead_one).collect(),
    }
}

/// What a replay says of the dead letters it left out as delivered (empty when none).
pub(crate) fn skipped_delivered_text(skipped: usize) -> String {
    if skipped == 0 {
        return String::new();
    }
    format!(
        "skipped {skipped} dead letter(s) their recipients already have (an attempt in flight \
         when the unit was set aside delivered it); --include-delivered replays them too\n"
    )
}

/// A payload in JSON: `body` when it is JSON text (what `enqueue` stores), else `body_text`
/// when it is UTF-8, else `body_base64`.
#[derive(Serialize)]
struct PayloadJson<'a> {
    content_type: &'a str,
    bytes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body_text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
}

#[derive(Serialize)]
struct ShowJson<'a> {
    #[serde(flatten)]
    dead_letter: DeadJson<'a>,
    payload: PayloadJson<'a>,
}

/// `dead-letters show --json`: the dead letter as `list --json` has it, and its payload.
pub(crate) fn dead_show_json<'a>(d: &'a DeadLetter, p: &'a Payload) -> impl Serialize + 'a {
    let text = std::str::from_utf8(&p.body).ok();
    let body = text.and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok());
    ShowJson {
        dead_letter: dead_one(d),
        payload: PayloadJson {
            content_type: &p.content_type,
            bytes: p.body.len(),
            body_text: if body.is_none() { text } else { None },
            body_base64: text.is_none().then(|| {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD.encode(&p.body)
            }),
            body,
        },
    }
}

/// `dead-letters show`: one field a line, a blank line, and the payload as text (or a note
/// that it is not UTF-8).
pub(crate) fn dead_show_text(d: &DeadLetter, p: &Payload) -> String {
    let opt_time = |t: Option<Timestamp>| t.map_or_else(|| "-".to_owned(), time);
    let mut rows = vec![
        vec!["id".to_owned(), d.id.0.to_string()],
        vec!["actor".to_owned(), d.actor.as_str().to_owned()],
        vec!["row".to_owned(), d.row_id.clone()],
        vec!["unit".to_owned(), d.unit.0.to_string()],
        vec!["recipient".to_owned(), d.key.recipient().to_owned()],
    ];
    if let Some(k) = d.key.ordering_key() {
        rows.push(vec!["ordering key".to_owned(), k.to_owned()]);
    }
    rows.extend([
        vec!["reason".to_owned(), d.reason.as_str().to_owned()],
        vec![
            "last".to_owned(),
            last_error(d.last_status, d.last_error.as_deref()),
        ],
        vec!["attempts".to_owned(), d.attempts.to_string()],
        vec!["first attempt".to_owned(), opt_time(d.first_attempt_at)],
        vec!["last attempt".to_owned(), opt_time(d.last_attempt_at)],
        vec!["dead at".to_owned(), time(d.dead_at)],
        vec!["content type".to_owned(), p.content_type.clone()],
        vec!["bytes".to_owned(), p.body.len().to_string()],
    ]);
    let mut out = String::new();
    for r in &rows {
        out.push_str(&format!("{:<14}{}\n", r[0], r[1]));
    }
    out.push('\n');
    match std::str::from_utf8(&p.body) {
        Ok(t) => {
            out.push_str(t);
            if !t.ends_with('\n') {
                out.push('\n');
            }
        }
        Err(_) => out.push_str("(not UTF-8 text; --json shows it in base64)\n"),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_with_nothing_pending_reads_idle_beside_its_backoff() {
        let lane = |depth: u64| LaneStatus {
            lane: outbox_lanes_store::StoreLaneId(1),
            key: outbox_lanes_core::LaneKey::new("https://b.example/inbox", None).unwrap(),
            depth,
            head_enqueued_at: None,
            last_status: Some(503),
            last_error: None,
            last_error_stale: false,
            not_before: Some(now().saturating_add(std::time::Duration::from_secs(600))),
            backoff_level: 3,
            strict: false,
            paused: false,
            pause_reason: None,
            failing_since: None,
            unavailable_since: None,
            in_flight_since: None,
            in_flight_unit: None,
        };
        let t = lanes_table(&[lane(0)]);
        assert!(t.contains("idle (backoff 3)"), "{t}");
        let t = lanes_table(&[lane(2)]);
        assert!(t.contains("backoff 3") && !t.contains("idle"), "{t}");
    }

    #[test]
    fn tables_align() {
        let t = table(
            &["A", "BB"],
            &[
                vec!["long cell".into(), "x".into()],
                vec!["s".into(), "".into()],
            ],
        );
        assert_eq!(t, "A          BB\nlong cell  x\ns\n");
        // Wide characters take two columns: the next column still lines up.
        let t = table(
            &["WHO", "N"],
            &[
                vec!["日本".into(), "1".into()],
                vec!["ab".into(), "2".into()],
            ],
        );
        assert_eq!(t, "WHO   N\n日本  1\nab    2\n");
    }

    #[test]
    fn a_table_cell_holds_the_failures_short_kind() {
        assert_eq!(
            short_error(Some(503), Some("status 503: Service Unavailable")),
            "503"
        );
        assert_eq!(
            short_error(
                None,
                Some(
                    "timeout: error sending request for url (http://127.0.0.1:1/): operation timed out"
                )
            ),
            "timeout"
        );
        assert_eq!(
            short_error(
                None,
                Some("connection_refused: tcp connect error: Connection refused")
            ),
            "connection_refused"
        );
        assert_eq!(short_error(None, None), "-");
        let long = "a free-form text someone wrote into the table by hand, far too long";
        assert_eq!(short_error(None, Some(long)).chars().count(), 40);
    }

    #[test]
    fn times() {
        assert_eq!(
            time(Timestamp::from_millis(1_500)),
            "1970-01-01T00:00:01.500Z"
        );
        assert_eq!(age(Duration::from_millis(1_234)), "1s 200ms");
    }
}
