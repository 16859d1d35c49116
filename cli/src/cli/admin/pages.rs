//! The dashboard's pages: server-rendered HTML (maud escapes every value), no script.
//!
//! Each reads the store through the [`Backend`](super::Backend) calls of the commands that
//! show the same: `status` (overview), `lanes`, `hosts`, `dead-letters list|show`.

use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use maud::{DOCTYPE, Markup, PreEscaped, html};
use outbox_lanes_core::policy::Recipient;
use outbox_lanes_core::{ActorId, DeadReason, LaneKey, Timestamp};
use outbox_lanes_store::{
    DeadLetter, DeadLetterFilter, DeadLetterId, DeadLetterSelection, DeliveryLogRow, HostBlock,
    LaneStatus, RowDeliveryState,
};
use serde::Deserialize;

use super::super::metrics::bounded;
use super::super::output::{lane_name, time};
use super::App;
use super::ring::Minute;

pub(super) fn routes() -> Router<App> {
    Router::new()
        .route("/", get(overview))
        .route("/lanes", get(lanes))
        .route("/lane", get(lane))
        .route("/hosts", get(hosts))
        .route("/dead-letters", get(dead_letters))
        .route("/dead-letters/preview", get(preview))
        .route("/dead-letters/{id}", get(dead_letter))
        .route("/row", get(row))
        .route("/login", get(login))
}

/// What every page needs to know of the request.
pub(super) struct Ctx {
    /// The session's CSRF token, when logged in.
    pub(super) csrf: Option<String>,
    /// Whether the relay takes actions at all (`--admin-token-file`).
    pub(super) actions: bool,
}

impl Ctx {
    pub(super) fn of(app: &App, headers: &HeaderMap) -> Ctx {
        Ctx {
            csrf: app.inner.auth.csrf(headers),
            actions: app.inner.auth.enabled(),
        }
    }
}

fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

/// A query-string value, percent-encoded (everything but unreserved characters).
pub(super) fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The link to a lane's page.
pub(super) fn lane_href(actor: &str, key: &LaneKey) -> String {
    let mut h = format!(
        "/lane?actor={}&recipient={}",
        enc(actor),
        enc(key.recipient())
    );
    if let Some(k) = key.ordering_key() {
        h.push_str(&format!("&ordering_key={}", enc(k)));
    }
    h
}

/// `1.5s`, `3m 2s`.
fn age(d: Duration) -> String {
    let d = if d >= Duration::from_secs(60) {
        Duration::from_secs(d.as_secs())
    } else {
        Duration::from_millis(d.as_millis() as u64 / 100 * 100)
    };
    humantime::format_duration(d).to_string()
}

fn opt_time(t: Option<Timestamp>) -> String {
    t.map_or_else(|| "-".to_owned(), time)
}

const STYLE: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}
header{background:#1f2d3d;color:#fff;padding:.5em 1em;display:flex;gap:1.2em;align-items:center}
header a{color:#fff;text-decoration:none}header .who{margin-left:auto}
main{padding:1em}
table{border-collapse:collapse;margin:.5em 0 1.2em}
th,td{border-bottom:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4}
td.n{text-align:right}
.err{color:#a00;max-width:40em;overflow-wrap:anywhere}
.flash{background:#eef8ee;border:1px solid #9c9;padding:.5em;margin-bottom:1em}
.refused{background:#fbeaea;border:1px solid #c99;padding:.5em;margin-bottom:1em}
.charts{display:flex;flex-wrap:wrap;gap:1.5em}
figure{margin:0}
pre.body{margin:0;padding:.2em;max-width:40em;max-height:8em}
pre{background:#f7f7f7;padding:.6em;max-width:80em;overflow:auto;white-space:pre-wrap;overflow-wrap:anywhere}
form.inline{display:inline}
button{margin:.1em}
.muted{color:#777}
";

/// The page around `body`.
pub(super) fn page(ctx: &Ctx, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="referrer" content="no-referrer";
                title { (title) " — outbox-lanes" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    strong { "outbox-lanes" }
                    a href="/" { "Overview" }
                    a href="/lanes" { "Lanes" }
                    a href="/hosts" { "Hosts" }
                    a href="/dead-letters" { "Dead letters" }
                    a href="/row" { "Rows" }
                    span.who {
                        @if let Some(csrf) = &ctx.csrf {
                            form.inline method="post" action="/logout" {
                                input type="hidden" name="csrf" value=(csrf);
                                button type="submit" { "Log out" }
                            }
                        } @else if ctx.actions {
                            a href="/login" { "Log in to act" }
                        } @else {
                            span.muted { "read-only" }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

pub(super) fn respond(status: StatusCode, m: Markup) -> Response {
    (status, Html(m.into_string())).into_response()
}

/// A page saying the store could not answer.
fn store_error(ctx: &Ctx, e: &anyhow::Error) -> Response {
    respond(
        StatusCode::SERVICE_UNAVAILABLE,
        page(
            ctx,
            "Store unavailable",
            html! { p.err { (super::super::message(e)) } },
        ),
    )
}

fn flash(done: Option<&str>) -> Markup {
    html! {
        @if let Some(d) = done {
            div.flash id="done" { (d) }
        }
    }
}

/// A bar chart of one series over the hour.
fn chart(title: &str, color: &str, minutes: &[Minute], f: fn(&Minute) -> u64) -> Markup {
    const W: u64 = 6;
    const H: u64 = 80;
    let max = minutes.iter().map(f).max().unwrap_or(0).max(1);
    let total: u64 = minutes.iter().map(f).sum();
    let width = W * minutes.len() as u64;
    html! {
        figure {
            figcaption { strong { (title) } " per minute, last hour: " (total) " (peak " (max) ")" }
            svg xmlns="http://www.w3.org/2000/svg" width=(width) height=(H + 14)
                role="img" aria-label=(format!("{title} per minute")) {
                rect x="0" y="0" width=(width) height=(H) fill="#fafafa" stroke="#ddd" {}
                @for (i, m) in minutes.iter().enumerate() {
                    @let h = f(m) * H / max;
                    rect x=(i as u64 * W) y=(H - h) width=(W - 1) height=(h) fill=(color) {
                        title { (format!("{} min ago: {}", minutes.len() - 1 - i, f(m))) }
                    }
                }
                text x="0" y=(H + 12) font-size="10" { "-60 min" }
                text x=(width - 20) y=(H + 12) font-size="10" { "now" }
            }
        }
    }
}

/// The overview lists the lanes in flight of at most this many actors.
const IN_FLIGHT_ACTORS: usize = 50;

async fn overview(State(app): State<App>, headers: HeaderMap) -> Response {
    let ctx = Ctx::of(&app, &headers);
    app.sample();
    let b = app.backend();
    let (status, hosts) = match (bounded(b.status()).await, bounded(b.host_list()).await) {
        (Ok(s), Ok(h)) => (s, h),
        (Err(e), _) | (_, Err(e)) => return store_error(&ctx, &e),
    };
    // The lanes whose head has been in flight for a while, of the actors a pass holds.
    let mut in_flight = Vec::new();
    for a in status.iter().filter(|a| a.in_flight).take(IN_FLIGHT_ACTORS) {
        match bounded(b.lanes(a.actor.as_str().to_owned())).await {
            Ok(lanes) => in_flight.extend(
                lanes
                    .into_iter()
                    .filter(|l| l.in_flight_since.is_some())
                    .map(|l| (a.actor.as_str().to_owned(), l)),
            ),
            Err(e) => return store_error(&ctx, &e),
        }
    }
    let now = now();
    let minutes = app.inner.ring.last_hour(super::minute_now());
    let host_states = super::super::metrics::host_states(&hosts, now);
    // The relays alive, as far as the store can tell: those whose lease on a drain slot runs.
    let mut holders: Vec<&str> = status
        .iter()
        .filter_map(|a| a.slot.as_ref().map(|s| s.holder.as_str()))
        .collect();
    holders.sort_unstable();
    holders.dedup();
    let pending: u64 = status.iter().map(|a| a.pending).sum();
    let backoff: usize = status.iter().map(|a| a.lanes_in_backoff.len()).sum();
    let paused: usize = status.iter().map(|a| a.lanes_paused.len()).sum();
    let dead: u64 = status.iter().map(|a| a.dead_letters).sum();
    let body = html! {
        div.charts {
            (chart("Deliveries", "#3a7", &minutes, |m| m.delivered))
            (chart("Failed attempts", "#d80", &minutes, |m| m.failed))
            (chart("Dead letters", "#c33", &minutes, |m| m.dead))
        }
        p.muted { "Counted by this relay since it started (other relays count their own)." }
        table {
            tr { th { "pending units" } td.n id="pending" { (pending) } }
            tr { th { "attempts in flight in this relay" } td.n { (app.counters().in_flight()) } }
            tr { th { "lanes waiting (throttled, in backoff or unavailable)" } td.n { (backoff) } }
            tr { th { "lanes paused or strict blocked" } td.n { (paused) } }
            tr { th { "dead letters kept" } td.n { (dead) } }
        }
        h2 { "In flight now" }
        @if in_flight.is_empty() {
            p.muted { "No lane's attempt has been in flight for longer than a few seconds." }
        } @else {
            table id="in-flight" {
                tr { th { "actor" } th { "lane" } th { "unit" } th { "in flight since" } th { "for" } th { "state" } }
                @for (actor, l) in &in_flight {
                    tr {
                        td { (actor) }
                        td { a href=(lane_href(actor, &l.key)) { (lane_name(&l.key)) } }
                        td.n { (l.in_flight_unit.map_or_else(|| "-".to_owned(), |u| u.0.to_string())) }
                        td { (opt_time(l.in_flight_since)) }
                        td { (l.in_flight_since.map_or_else(|| "-".to_owned(), |t| age(now.saturating_duration_since(t)))) }
                        td { (lane_state(l, now)) }
                    }
                }
            }
        }
        h2 { "Relays" }
        @if holders.is_empty() {
            p.muted { "No relay holds a drain slot now (an idle relay holds none)." }
        } @else {
            p id="relays" {
                (holders.len()) " relay(s) running passes now: "
                @for (i, h) in holders.iter().enumerate() {
                    @if i > 0 { ", " }
                    code { (h) }
                }
            }
        }
        h2 { "Actors" }
        table {
            tr { th { "actor" } th { "pending" } th { "pass held by" } th { "lease ends" }
                 th { "lanes waiting" } th { "lanes paused" } th { "dead letters" } }
            @for a in &status {
                tr {
                    td { a href=(format!("/lanes?actor={}", enc(a.actor.as_str()))) { (a.actor.as_str()) } }
                    td.n { (a.pending) }
                    td { (a.slot.as_ref().map_or("-", |s| s.holder.as_str())) }
                    td { (a.slot.as_ref().map_or_else(|| "-".to_owned(), |s| time(s.lease_expires))) }
                    td.n { (a.lanes_in_backoff.len()) }
                    td.n { (a.lanes_paused.len()) }
                    td.n { a href=(format!("/dead-letters?actor={}", enc(a.actor.as_str()))) { (a.dead_letters) } }
                }
            }
        }
        h2 { "Hosts by state" }
        table {
            tr { @for (state, _) in &host_states { th { (state) } } }
            tr { @for (_, n) in &host_states { td.n { (n) } } }
        }
    };
    respond(StatusCode::OK, page(&ctx, "Overview", body))
}

#[derive(Deserialize, Default)]
struct LanesQuery {
    actor: Option<String>,
    state: Option<String>,
    done: Option<String>,
}

/// A lane's state as `lanes` shows it: with its pause's reason, and `in flight N s` while
/// its head's attempt has been in flight for longer than the relay's threshold.
fn lane_state(l: &LaneStatus, now: Timestamp) -> String {
    let state = l.state(now);
    let shown = match (state.name(), l.pause_reason.as_deref()) {
        ("paused", Some(r)) => format!("{state} ({r})"),
        _ => state.to_string(),
    };
    match l.in_flight_since {
        Some(t) if state.name() == "open" => {
            format!("in flight {} s", now.saturating_duration_since(t).as_secs())
        }
        Some(t) => format!(
            "in flight {} s ({shown})",
            now.saturating_duration_since(t).as_secs()
        ),
        None => shown,
    }
}

async fn lanes(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<LanesQuery>,
) -> Response {
    let ctx = Ctx::of(&app, &headers);
    let b = app.backend();
    let status = match bounded(b.status()).await {
        Ok(s) => s,
        Err(e) => return store_error(&ctx, &e),
    };
    let actor = q
        .actor
        .filter(|a| !a.is_empty())
        .or_else(|| status.first().map(|a| a.actor.as_str().to_owned()));
    let lanes = match &actor {
        Some(a) => match bounded(b.lanes(a.clone())).await {
            Ok(l) => l,
            Err(e) => return store_error(&ctx, &e),
        },
        None => Vec::new(),
    };
    let now = now();
    let mut states: Vec<&'static str> = lanes.iter().map(|l| l.state(now).name()).collect();
    states.sort_unstable();
    states.dedup();
    let want = q.state.filter(|s| !s.is_empty());
    let shown: Vec<&LaneStatus> = lanes
        .iter()
        .filter(|l| want.as_deref().is_none_or(|w| l.state(now).name() == w))
        .collect();
    let actor_name = actor.clone().unwrap_or_default();
    let body = html! {
        (flash(q.done.as_deref()))
        form method="get" action="/lanes" {
            label { "actor " select name="actor" {
                @for a in &status {
                    option value=(a.actor.as_str()) selected[Some(a.actor.as_str()) == actor.as_deref()] { (a.actor.as_str()) }
                }
            } }
            " "
            label { "state " select name="state" {
                option value="" { "any" }
                @for s in &states {
                    option value=(s) selected[want.as_deref() == Some(*s)] { (s) }
                }
            } }
            " " button type="submit" { "Filter" }
        }
        p { (shown.len()) " of " (lanes.len()) " lane(s) of " strong { (actor_name) }
            @if shown.len() > ROWS_SHOWN { " (the first " (ROWS_SHOWN) " shown)" } }
        table id="lanes" {
            tr { th { "lane" } th { "depth" } th { "head age" } th { "last error" }
                 th { "not before" } th { "state" } th { "mode" } }
            @for l in shown.iter().take(ROWS_SHOWN) {
                tr {
                    td { a href=(lane_href(&actor_name, &l.key)) { (lane_name(&l.key)) } }
                    td.n { (l.depth) }
                    td { (l.head_enqueued_at.map_or_else(|| "-".to_owned(), |t| age(now.saturating_duration_since(t)))) }
                    td.err { (last_error_short(l)) }
                    td { (opt_time(l.not_before)) }
                    td.state { (lane_state(l, now)) }
                    td { @if l.strict { "strict" } @else { "-" } }
                }
            }
        }
    };
    respond(StatusCode::OK, page(&ctx, "Lanes", body))
}

/// The last status and error, cut for a table cell (the lane's page has it whole).
fn last_error_short(l: &LaneStatus) -> String {
    let mut s = match (l.last_status, l.last_error.as_deref()) {
        (_, Some(e)) => e.chars().take(120).collect(),
        (Some(s), None) => s.to_string(),
        (None, None) => "-".to_owned(),
    };
    if l.last_error_stale {
        s.push_str(" (stale)");
    }
    s
}

#[derive(Deserialize)]
struct LaneQuery {
    actor: String,
    recipient: String,
    ordering_key: Option<String>,
    done: Option<String>,
}

/// A lane's action button.
fn action(ctx: &Ctx, actor: &str, key: &LaneKey, op: &str, label: &str, extra: Markup) -> Markup {
    html! {
        @if let Some(csrf) = &ctx.csrf {
            form.inline method="post" action="/actions/lane" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="actor" value=(actor);
                input type="hidden" name="recipient" value=(key.recipient());
                @if let Some(k) = key.ordering_key() {
                    input type="hidden" name="ordering_key" value=(k);
                }
                input type="hidden" name="op" value=(op);
                (extra)
                button type="submit" id=(format!("lane-{op}")) { (label) }
            }
        }
    }
}

fn not_logged_in(ctx: &Ctx) -> Markup {
    html! {
        @if ctx.csrf.is_none() {
            @if ctx.actions {
                p.muted { a href="/login" { "Log in" } " with the admin token to act." }
            } @else {
                p.muted { "Read-only: the relay runs without --admin-token-file." }
            }
        }
    }
}

async fn lane(State(app): State<App>, headers: HeaderMap, Query(q): Query<LaneQuery>) -> Response {
    let ctx = Ctx::of(&app, &headers);
    let key = match LaneKey::new(
        &q.recipient,
        q.ordering_key.as_deref().filter(|k| !k.is_empty()),
    ) {
        Ok(k) => k,
        Err(e) => {
            return respond(
                StatusCode::BAD_REQUEST,
                page(
                    &ctx,
                    "No such lane",
                    html! { p.err { (q.recipient) ": " (e) } },
                ),
            );
        }
    };
    let lanes = match bounded(app.backend().lanes(q.actor.clone())).await {
        Ok(l) => l,
        Err(e) => return store_error(&ctx, &e),
    };
    let Some(l) = lanes.into_iter().find(|l| l.key == key) else {
        return respond(
            StatusCode::NOT_FOUND,
            page(
                &ctx,
                "No such lane",
                html! { p { "Actor " (q.actor) " has no lane " (lane_name(&key)) "." } },
            ),
        );
    };
    let now = now();
    let actor = q.actor.as_str();
    let body = html! {
        (flash(q.done.as_deref()))
        table id="lane" {
            tr { th { "actor" } td { (actor) } }
            tr { th { "recipient" } td { (l.key.recipient()) } }
            @if let Some(k) = l.key.ordering_key() { tr { th { "ordering key" } td { (k) } } }
            tr { th { "state" } td.state id="state" { (lane_state(&l, now)) } }
            tr { th { "mode" } td { @if l.strict { "strict" } @else { "-" } } }
            tr { th { "pending units" } td.n { (l.depth) } }
            tr { th { "head enqueued" } td { (opt_time(l.head_enqueued_at)) } }
            tr { th { "last status" } td { (l.last_status.map_or_else(|| "-".to_owned(), |s| s.to_string())) } }
            tr { th { "last error" } td.err id="last-error" {
                (l.last_error.as_deref().unwrap_or("-"))
                @if l.last_error_stale { " (stale: the lane moved on)" }
            } }
            tr { th { "not before" } td { (opt_time(l.not_before)) } }
            tr { th { "backoff level" } td.n { (l.backoff_level) } }
            tr { th { "failing since" } td { (opt_time(l.failing_since)) } }
            tr { th { "unavailable since" } td { (opt_time(l.unavailable_since)) } }
            tr { th { "head in flight since" } td id="in-flight" {
                (opt_time(l.in_flight_since))
                @if let Some(u) = l.in_flight_unit { " (unit " (u.0) ")" }
            } }
        }
        h2 { "Actions" }
        (not_logged_in(&ctx))
        p {
            (action(&ctx, actor, &l.key, "pause", "Pause", html! {
                input type="text" name="reason" placeholder="reason" value="paused by an operator";
            }))
            (action(&ctx, actor, &l.key, "resume", "Resume", html! {}))
            (action(&ctx, actor, &l.key, "retry", "Retry now", html! {}))
            @if l.strict {
                (action(&ctx, actor, &l.key, "unstrict", "Unstrict", html! {}))
            } @else {
                (action(&ctx, actor, &l.key, "strict", "Strict", html! {}))
            }
            (action(&ctx, actor, &l.key, "skip-head", "Skip head (dead-letter it)", html! {}))
            (action(&ctx, actor, &l.key, "purge", "Purge (dead-letter every pending unit)", html! {}))
        }
        p { a href=(format!("/dead-letters?actor={}&recipient={}", enc(actor), enc(l.key.recipient()))) { "Dead letters of this recipient" } }
    };
    respond(StatusCode::OK, page(&ctx, "Lane", body))
}

#[derive(Deserialize)]
struct DoneQuery {
    done: Option<String>,
}

async fn hosts(State(app): State<App>, headers: HeaderMap, Query(q): Query<DoneQuery>) -> Response {
    let ctx = Ctx::of(&app, &headers);
    let hosts = match bounded(app.backend().host_list()).await {
        Ok(h) => h,
        Err(e) => return store_error(&ctx, &e),
    };
    let now = now();
    let host_action = |origin: &str, op: &str, label: &str| -> Markup {
        html! {
            @if let Some(csrf) = &ctx.csrf {
                form.inline method="post" action="/actions/host" {
                    input type="hidden" name="csrf" value=(csrf);
                    input type="hidden" name="origin" value=(origin);
                    input type="hidden" name="op" value=(op);
                    button type="submit" data-op=(op) { (label) }
                }
            }
        }
    };
    let body = html! {
        (flash(q.done.as_deref()))
        (not_logged_in(&ctx))
        table id="hosts" {
            tr { th { "origin" } th { "state" } th { "lanes" } th { "pending" } th { "failures" }
                 th { "last connection error" } th { "next probe" } th { "signature scheme" }
                 th title="attempts this relay finished to the host since it started" { "attempts" }
                 th title="delivered among the attempts that made a request" { "success" }
                 th { "in flight" }
                 th title="lanes whose attempt has been in flight for more than 5 s" { "in flight long" }
                 th { "actions" } }
            @for h in &hosts {
                @let r = &h.record;
                tr {
                    td { (r.origin) }
                    td { (super::super::hosts::state(h, now)) }
                    td.n { (h.lanes) }
                    td.n { (h.pending) }
                    td.n { (r.failures) }
                    td.err { (r.last_error.as_deref().unwrap_or("-")) }
                    td { (opt_time(r.not_before.filter(|_| r.level > 0))) }
                    td { (r.spec.as_deref().unwrap_or("-")) }
                    @let f = figures(app.counters(), &r.origin);
                    td.n { (f.attempts) }
                    td.n { (Some(f.sent).filter(|&n| n > 0).map_or_else(|| "-".to_owned(), |n| format!("{:.1} %", f.delivered as f64 * 100.0 / n as f64))) }
                    td.n { (f.in_flight) }
                    td.n { (h.in_flight_long) }
                    td {
                        @if r.blocked == HostBlock::Open {
                            (host_action(&r.origin, "block", "Block"))
                            (host_action(&r.origin, "block-dead-letter", "Block, dead-letter"))
                        } @else {
                            (host_action(&r.origin, "unblock", "Unblock"))
                        }
                        (host_action(&r.origin, "retry", "Retry"))
                    }
                }
            }
        }
    };
    respond(StatusCode::OK, page(&ctx, "Hosts", body))
}

/// A host's figures in this relay (the per-host series of `/metrics`; a host past their
/// cap has none of its own, and shows zeros).
#[derive(Default)]
struct Figures {
    attempts: u64,
    sent: u64,
    delivered: u64,
    in_flight: i64,
}

/// Attempt outcomes, as the per-host series label them.
const OUTCOMES: &[&str] = &[
    "delivered",
    "throttled",
    "transient",
    "permanent",
    "gone",
    "refused",
    "not_sent",
    "deferred",
    "held",
    "set_aside",
];

fn figures(c: &super::super::backend::Counters, origin: &str) -> Figures {
    let h = &c.hosts;
    let host = vec![("host", origin.to_owned())];
    let mut f = Figures::default();
    for o in OUTCOMES {
        let mut labels = host.clone();
        labels.push(("outcome", (*o).to_owned()));
        let n = h.attempts.get(&labels).map_or(0, |c| c.get());
        f.attempts += n;
        if super::super::backend::sent(o) {
            f.sent += n;
        }
        if *o == "delivered" {
            f.delivered += n;
        }
    }
    f.in_flight = h.in_flight.get(&host).map_or(0, |g| g.get());
    f
}

#[derive(Deserialize, Default, Clone)]
pub(super) struct DeadQuery {
    pub(super) actor: Option<String>,
    pub(super) reason: Option<String>,
    pub(super) recipient: Option<String>,
    pub(super) done: Option<String>,
}

impl DeadQuery {
    /// The store's filter; an error names the field that does not parse.
    pub(super) fn filter(&self) -> Result<DeadLetterFilter, String> {
        let some = |s: &Option<String>| {
            s.as_deref()
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        Ok(DeadLetterFilter {
            actor: some(&self.actor).map(ActorId::new),
            recipient: some(&self.recipient)
                .map(|r| Recipient::parse(&r).map_err(|e| format!("recipient {r:?}: {e}")))
                .transpose()?,
            reason: some(&self.reason)
                .map(|r| DeadReason::from_code(&r).ok_or_else(|| format!("no reason {r:?}")))
                .transpose()?,
            since: None,
            until: None,
        })
    }

    fn query(&self) -> String {
        let mut parts = Vec::new();
        for (k, v) in [
            ("actor", &self.actor),
            ("reason", &self.reason),
            ("recipient", &self.recipient),
        ] {
            if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
                parts.push(format!("{k}={}", enc(v)));
            }
        }
        parts.join("&")
    }
}

const REASONS: &[&str] = &[
    "exhausted",
    "permanent",
    "gone",
    "lane_retired",
    "expired",
    "destination_refused",
    "lane_unavailable",
    "host_unavailable",
    "skipped",
    "purged",
    "blocked",
];

/// A page lists at most this many lanes or dead letters (a preview still acts on every one
/// it counts).
const ROWS_SHOWN: usize = 1000;

fn dead_table(list: &[DeadLetter]) -> Markup {
    html! {
        table id="dead-letters" {
            tr { th { "id" } th { "actor" } th { "row" } th { "recipient" } th { "reason" }
                 th { "last" } th { "attempts" } th { "dead at" } }
            @for d in list.iter().take(ROWS_SHOWN) {
                tr {
                    td { a href=(format!("/dead-letters/{}", d.id.0)) { (d.id.0) } }
                    td { (d.actor.as_str()) }
                    td { a href=(row_href(d.actor.as_str(), &d.row_id)) { (d.row_id) } }
                    td { (lane_name(&d.key)) }
                    td { (d.reason.as_str()) }
                    td.err { (last_of(d).chars().take(120).collect::<String>()) }
                    td.n { (d.attempts) }
                    td { (time(d.dead_at)) }
                }
            }
        }
    }
}

fn last_of(d: &DeadLetter) -> String {
    match (d.last_status, d.last_error.as_deref()) {
        (_, Some(e)) => e.to_owned(),
        (Some(s), None) => s.to_string(),
        (None, None) => "-".to_owned(),
    }
}

async fn select(
    app: &App,
    q: &DeadQuery,
) -> Result<Vec<DeadLetter>, Result<String, anyhow::Error>> {
    let filter = q.filter().map_err(Ok)?;
    bounded(
        app.backend()
            .select_dead_letters(DeadLetterSelection::Matching(filter)),
    )
    .await
    .map_err(Err)
}

async fn dead_letters(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<DeadQuery>,
) -> Response {
    let ctx = Ctx::of(&app, &headers);
    let list = match select(&app, &q).await {
        Ok(l) => l,
        Err(Ok(bad)) => {
            return respond(
                StatusCode::BAD_REQUEST,
                page(&ctx, "Dead letters", html! { p.err { (bad) } }),
            );
        }
        Err(Err(e)) => return store_error(&ctx, &e),
    };
    let query = q.query();
    let body = html! {
        (flash(q.done.as_deref()))
        form method="get" action="/dead-letters" {
            label { "actor " input type="text" name="actor" value=(q.actor.as_deref().unwrap_or("")); }
            " "
            label { "reason " select name="reason" {
                option value="" { "any" }
                @for r in REASONS { option value=(r) selected[q.reason.as_deref() == Some(*r)] { (r) } }
            } }
            " "
            label { "recipient " input type="text" name="recipient" size="40" value=(q.recipient.as_deref().unwrap_or("")); }
            " " button type="submit" { "Filter" }
        }
        p { (list.len()) " dead letter(s)"
            @if list.len() > ROWS_SHOWN { " (the first " (ROWS_SHOWN) " shown; narrow the filter)" } }
        @if !list.is_empty() && ctx.csrf.is_some() {
            p {
                a href=(format!("/dead-letters/preview?op=replay&{query}")) { "Replay these…" }
                " · "
                a href=(format!("/dead-letters/preview?op=purge&{query}")) { "Purge these…" }
                span.muted { " (a preview lists what would change first)" }
            }
        }
        (not_logged_in(&ctx))
        (dead_table(&list))
    };
    respond(StatusCode::OK, page(&ctx, "Dead letters", body))
}

#[derive(Deserialize)]
struct PreviewQuery {
    op: String,
    #[serde(flatten)]
    which: DeadQuery,
}

/// What a replay or purge of the filter would act on, and the form that does it on exactly
/// those ids (as `dead-letters replay|purge --dry-run` then without it).
async fn preview(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<PreviewQuery>,
) -> Response {
    let ctx = Ctx::of(&app, &headers);
    let verb = match q.op.as_str() {
        "replay" => "Replay",
        "purge" => "Purge",
        _ => {
            return respond(
                StatusCode::BAD_REQUEST,
                page(&ctx, "Preview", html! { p.err { "op is replay or purge" } }),
            );
        }
    };
    let mut list = match select(&app, &q.which).await {
        Ok(l) => l,
        Err(Ok(bad)) => {
            return respond(
                StatusCode::BAD_REQUEST,
                page(&ctx, "Preview", html! { p.err { (bad) } }),
            );
        }
        Err(Err(e)) => return store_error(&ctx, &e),
    };
    // A replay leaves out what the recipients already have (as `dead-letters replay` does).
    let skipped = if verb == "Replay" {
        super::super::leave_out_delivered(&mut list)
    } else {
        0
    };
    let ids: Vec<String> = list.iter().map(|d| d.id.0.to_string()).collect();
    let body = html! {
        p { "Would " (q.op) " " strong id="count" { (list.len()) } " dead letter(s); nothing changed yet." }
        @if skipped > 0 {
            p id="skipped" {
                "Left out: " strong { (skipped) } " dead letter(s) their recipients already have (an attempt in \
                 flight when the unit was set aside delivered it). Each one's page can replay it; \
                 `dead-letters replay --include-delivered` replays them all."
            }
        }
        (not_logged_in(&ctx))
        @if let Some(csrf) = &ctx.csrf {
            @if !list.is_empty() {
                form method="post" action="/actions/dead-letters" {
                    input type="hidden" name="csrf" value=(csrf);
                    input type="hidden" name="op" value=(q.op);
                    input type="hidden" name="ids" value=(ids.join(","));
                    button type="submit" id="confirm" { (verb) " these " (list.len()) }
                }
            }
        }
        (dead_table(&list))
    };
    respond(
        StatusCode::OK,
        page(&ctx, &format!("{verb}: preview"), body),
    )
}

/// Whether a header's name says its value is a credential.
pub(super) fn credential_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "authorization",
        "cookie",
        "token",
        "secret",
        "key",
        "password",
        "passwd",
        "auth",
        "signature",
        "credential",
        "session",
    ]
    .iter()
    .any(|w| n.contains(w))
}

async fn dead_letter(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Query(q): Query<DoneQuery>,
) -> Response {
    let ctx = Ctx::of(&app, &headers);
    let b = app.backend();
    let found = match bounded(
        b.select_dead_letters(DeadLetterSelection::Ids(vec![DeadLetterId(id)])),
    )
    .await
    {
        Ok(l) => l.into_iter().next(),
        Err(e) => return store_error(&ctx, &e),
    };
    let missing = || {
        respond(
            StatusCode::NOT_FOUND,
            page(
                &ctx,
                "Dead letter",
                html! { p { "No dead letter " (id) " (replayed or purged?)." } },
            ),
        )
    };
    let Some(d) = found else { return missing() };
    let payload = match bounded(b.dead_letter_payload(DeadLetterId(id))).await {
        Ok(p) => p,
        Err(e)
            if e.downcast_ref::<outbox_lanes_store::StoreError>()
                .is_some_and(|e| matches!(e, outbox_lanes_store::StoreError::NotFound { .. })) =>
        {
            return missing();
        }
        Err(e) => return store_error(&ctx, &e),
    };
    let history = match bounded(super::super::rows::dead_letter_history(b, &d)).await {
        Ok(h) => h,
        Err(e) => return store_error(&ctx, &e),
    };
    let body_text = std::str::from_utf8(&payload.body).ok();
    let act = |op: &str, label: &str| -> Markup {
        html! {
            @if let Some(csrf) = &ctx.csrf {
                form.inline method="post" action="/actions/dead-letters" {
                    input type="hidden" name="csrf" value=(csrf);
                    input type="hidden" name="op" value=(op);
                    input type="hidden" name="ids" value=(id);
                    button type="submit" id=(format!("dead-{op}")) { (label) }
                }
            }
        }
    };
    let body = html! {
        (flash(q.done.as_deref()))
        table id="dead-letter" {
            tr { th { "id" } td { (d.id.0) } }
            tr { th { "actor" } td { (d.actor.as_str()) } }
            tr { th { "row" } td { a href=(row_href(d.actor.as_str(), &d.row_id)) { (d.row_id) } } }
            tr { th { "unit" } td { (d.unit.0) } }
            tr { th { "recipient" } td { a href=(lane_href(d.actor.as_str(), &d.key)) { (lane_name(&d.key)) } } }
            tr { th { "reason" } td { (d.reason.as_str()) } }
            tr { th { "last status" } td { (d.last_status.map_or_else(|| "-".to_owned(), |s| s.to_string())) } }
            tr { th { "last error" } td.err id="last-error" { (d.last_error.as_deref().unwrap_or("-")) } }
            tr { th { "attempts" } td.n { (d.attempts) } }
            tr { th { "first attempt" } td { (opt_time(d.first_attempt_at)) } }
            tr { th { "last attempt" } td { (opt_time(d.last_attempt_at)) } }
            tr { th { "dead at" } td { (time(d.dead_at)) } }
            tr { th { "content type" } td { (payload.content_type) } }
            tr { th { "bytes" } td.n { (payload.body.len()) } }
        }
        @if !payload.headers.is_empty() {
            h2 { "Row headers" }
            table id="headers" {
                @for (k, v) in &payload.headers {
                    tr { th { (k) } td { @if credential_header(k) { span.muted { "(masked)" } } @else { (v) } } }
                }
            }
        }
        h2 { "Attempts" }
        (history_table(&history))
        h2 { "Payload" }
        @match body_text {
            Some(t) => pre id="payload" { (t) },
            None => p.muted { "(not UTF-8 text; `dead-letters show --json` shows it in base64)" },
        }
        h2 { "Actions" }
        (not_logged_in(&ctx))
        @if d.delivered_after_set_aside() {
            p.err id="delivered" { "Its recipient already has it: a replay sends it a second time." }
        }
        p { (act("replay", "Replay")) (act("purge", "Purge")) }
    };
    respond(
        StatusCode::OK,
        page(&ctx, &format!("Dead letter {id}"), body),
    )
}

/// An attempt's duration: `42 ms`, `1.2 s`.
fn took(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// The link to a row's page.
fn row_href(actor: &str, row: &str) -> String {
    format!("/row?actor={}&id={}", enc(actor), enc(row))
}

/// The attempts the delivery log keeps, oldest first.
fn history_table(h: &[DeliveryLogRow]) -> Markup {
    html! {
        @if h.is_empty() {
            p.muted { "No attempt in the delivery log (none finished yet, the log is off, or past --delivery-log-retention)." }
        } @else {
            table.history {
                tr { th { "attempt" } th { "started" } th { "took" } th { "status" } th { "error" }
                     th { "answer's body (first KiB)" } }
                @for e in h {
                    tr {
                        td.n { (e.attempt) }
                        td { (time(e.started_at)) }
                        td.n { (took(e.duration_ms)) }
                        td { (e.status.map_or_else(|| "-".to_owned(), |s| s.to_string())) }
                        td { @if e.delivered { "delivered" } @else { (e.error_class.as_deref().unwrap_or("-")) } }
                        td.err { @if let Some(b) = &e.body { pre.body { (b) } } @else { "-" } }
                    }
                }
            }
        }
    }
}

#[derive(Deserialize)]
struct RowQuery {
    #[serde(default)]
    actor: String,
    #[serde(default)]
    id: String,
}

/// A row's delivery per recipient (as `rows show`): pending, in flight, delivered or dead
/// letter, with the attempts the delivery log keeps.
async fn row(State(app): State<App>, headers: HeaderMap, Query(q): Query<RowQuery>) -> Response {
    let ctx = Ctx::of(&app, &headers);
    let form = html! {
        form method="get" action="/row" {
            label { "actor " input type="text" name="actor" value=(q.actor); }
            " "
            label { "row id " input type="text" name="id" value=(q.id); }
            " " button type="submit" { "Show" }
        }
    };
    if q.actor.is_empty() || q.id.is_empty() {
        return respond(StatusCode::OK, page(&ctx, "Row", form));
    }
    let store = app.backend().store();
    let (actor, id) = (ActorId::new(q.actor.trim()), q.id.clone());
    let found = bounded(async move {
        Ok(tokio::task::spawn_blocking(move || store.row_deliveries(&actor, &id)).await??)
    })
    .await;
    let rows = match found {
        Ok(r) => r,
        Err(e) => return store_error(&ctx, &e),
    };
    let now = now();
    let body = html! {
        (form)
        @if rows.is_empty() {
            p id="none" { "Actor " (q.actor) " has no row " (q.id) " (never enqueued, or finished and past the delivery log's window)." }
        } @else {
            table id="row" {
                tr { th { "recipient" } th { "unit" } th { "state" } th { "attempts" } th { "last status" } th { "last error" } }
                @for r in &rows {
                    tr {
                        td { a href=(format!("/lane?actor={}&recipient={}", enc(&q.actor), enc(&r.recipient))) { (r.recipient) } }
                        td.n { (r.unit.0) }
                        td.state { (match r.state {
                            RowDeliveryState::InFlight(t) => format!("in flight {} s", now.saturating_duration_since(t).as_secs()),
                            RowDeliveryState::Delivered => r.delivered_at.map_or_else(
                                || "delivered".to_owned(),
                                |t| format!("delivered at {} after {} attempt(s)", time(t), r.attempts)),
                            s => s.as_str().to_owned(),
                        }) }
                        td.n { (r.attempts) }
                        td { (r.last_status.map_or_else(|| "-".to_owned(), |s| s.to_string())) }
                        td.err { (r.last_error.as_deref().unwrap_or("-")) }
                    }
                }
            }
            @for r in &rows {
                h2 { (r.recipient) }
                (history_table(&r.history))
            }
        }
    };
    respond(StatusCode::OK, page(&ctx, "Row", body))
}

async fn login(State(app): State<App>, headers: HeaderMap) -> Response {
    let ctx = Ctx::of(&app, &headers);
    let body = html! {
        @if !ctx.actions {
            p { "The dashboard is read-only: the relay runs without --admin-token-file." }
        } @else if ctx.csrf.is_some() {
            p { "Logged in." }
        } @else {
            form method="post" action="/login" {
                label { "Admin token " input type="password" name="token" id="token" autocomplete="current-password"; }
                " " button type="submit" id="login" { "Log in" }
            }
            p.muted { "The token of the relay's --admin-token-file. A session lasts 12 hours, in this relay's memory." }
        }
    };
    respond(StatusCode::OK, page(&ctx, "Log in", body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(
            enc("http://a.example/x?y=1&z"),
            "http%3A%2F%2Fa.example%2Fx%3Fy%3D1%26z"
        );
        assert_eq!(enc("a-b_c.d~"), "a-b_c.d~");
    }

    #[test]
    fn credential_headers_are_recognised() {
        for h in [
            "Authorization",
            "cookie",
            "X-Api-Key",
            "X-Auth-Token",
            "client_secret",
            "Proxy-Authorization",
        ] {
            assert!(credential_header(h), "{h}");
        }
        for h in ["Accept", "X-Request-Id", "Content-Language"] {
            assert!(!credential_header(h), "{h}");
        }
    }

    #[test]
    fn text_from_recipients_is_escaped() {
        let ctx = Ctx {
            csrf: None,
            actions: false,
        };
        let m = page(
            &ctx,
            "<b>t</b>",
            html! { p.err { "status 500: <script>alert(1)</script>" } },
        );
        let s = m.into_string();
        assert!(!s.contains("<script>"), "{s}");
        assert!(s.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{s}");
        assert!(s.contains("&lt;b&gt;t&lt;/b&gt;"), "{s}");
    }
}
