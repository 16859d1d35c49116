//! The dashboard's actions: POST forms, each checked by `auth.rs` (a session from the admin
//! token, its CSRF token) and then done through the same [`Backend`](super::Backend) call as
//! the command: `lanes pause|resume|retry|strict|unstrict|purge|skip-head` (`lane_op`),
//! `hosts block|unblock|retry` (`host_block`, `host_retry`), `dead-letters replay|purge`
//! (`replay`, `purge` on the ids the preview listed). So an action returns once no relay
//! starts what it forbids, as the command does (the lane and host fences). Each is logged at
//! INFO, as the commands log theirs. A refused action answers 403 and changes nothing.

use axum::Form;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::post;
use maud::html;
use outbox_lanes_core::LaneKey;
use outbox_lanes_store::{DeadLetterId, DeadLetterSelection, HostBlock};
use serde::Deserialize;
use tracing::info;

use super::super::backend::LaneOp;
use super::super::output::lane_name;
use super::App;
use super::auth::{self, Refused};
use super::pages::{Ctx, enc, lane_href, page, respond};

pub(super) fn routes() -> Router<App> {
    Router::new()
        .route("/login", post(login))
        .route("/logout", post(logout))
        .route("/actions/lane", post(lane))
        .route("/actions/host", post(host))
        .route("/actions/dead-letters", post(dead_letters))
}

fn refused(app: &App, headers: &HeaderMap, why: Refused) -> Response {
    tracing::warn!(reason = why.text(), "dashboard action refused");
    let ctx = Ctx::of(app, headers);
    respond(
        StatusCode::FORBIDDEN,
        page(
            &ctx,
            "Refused",
            html! { p.refused id="refused" { (why.text()) } },
        ),
    )
}

fn failed(app: &App, headers: &HeaderMap, status: StatusCode, e: &anyhow::Error) -> Response {
    let ctx = Ctx::of(app, headers);
    respond(
        status,
        page(
            &ctx,
            "Not done",
            html! { p.err id="failed" { (super::super::message(e)) } },
        ),
    )
}

/// Whether the error is the caller's (a lane that does not exist) rather than the store's.
fn status_of(e: &anyhow::Error) -> StatusCode {
    if e.chain().any(|c| c.is::<super::super::UsageError>()) {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(app): State<App>, headers: HeaderMap, Form(f): Form<LoginForm>) -> Response {
    if let Err(why) = auth::cross_site(&headers) {
        return refused(&app, &headers, why);
    }
    if !app.inner.auth.enabled() {
        return refused(&app, &headers, Refused::ReadOnly);
    }
    match app.inner.auth.login(&f.token) {
        Some((sid, _)) => {
            info!("dashboard login");
            let mut r = Redirect::to("/").into_response();
            if let Ok(v) = HeaderValue::from_str(&auth::set_cookie(&sid)) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        None => {
            tracing::warn!("dashboard login refused: wrong token");
            let ctx = Ctx::of(&app, &headers);
            respond(
                StatusCode::FORBIDDEN,
                page(
                    &ctx,
                    "Log in",
                    html! {
                        p.refused id="refused" { "Wrong token." }
                        p { a href="/login" { "Try again" } }
                    },
                ),
            )
        }
    }
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn logout(State(app): State<App>, headers: HeaderMap, Form(f): Form<CsrfForm>) -> Response {
    if let Err(why) = app.inner.auth.authorize(&headers, &f.csrf) {
        return refused(&app, &headers, why);
    }
    app.inner.auth.logout(&headers);
    let mut r = Redirect::to("/").into_response();
    if let Ok(v) = HeaderValue::from_str(&auth::clear_cookie()) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

#[derive(Deserialize)]
struct LaneForm {
    #[serde(default)]
    csrf: String,
    actor: String,
    recipient: String,
    #[serde(default)]
    ordering_key: String,
    op: String,
    #[serde(default)]
    reason: String,
}

async fn lane(State(app): State<App>, headers: HeaderMap, Form(f): Form<LaneForm>) -> Response {
    if let Err(why) = app.inner.auth.authorize(&headers, &f.csrf) {
        return refused(&app, &headers, why);
    }
    let bad = |text: String| {
        failed(
            &app,
            &headers,
            StatusCode::BAD_REQUEST,
            &anyhow::anyhow!(text),
        )
    };
    let op = match f.op.as_str() {
        "pause" => {
            let reason = f.reason.trim();
            LaneOp::Pause(if reason.is_empty() {
                "paused by an operator".to_owned()
            } else {
                reason.to_owned()
            })
        }
        "resume" => LaneOp::Resume,
        "retry" => LaneOp::Retry,
        "strict" => LaneOp::Strict(true),
        "unstrict" => LaneOp::Strict(false),
        "purge" => LaneOp::Purge,
        "skip-head" => LaneOp::SkipHead,
        other => return bad(format!("no lane action {other:?}")),
    };
    let ordering_key = Some(f.ordering_key.as_str()).filter(|k| !k.is_empty());
    let key = match LaneKey::new(&f.recipient, ordering_key) {
        Ok(k) => k,
        Err(e) => return bad(format!("recipient {:?}: {e}", f.recipient)),
    };
    let b = app.backend();
    match b.knows_actor(f.actor.clone()).await {
        Ok(true) => {}
        Ok(false) => return bad(format!("unknown actor {:?}", f.actor)),
        Err(e) => return failed(&app, &headers, StatusCode::SERVICE_UNAVAILABLE, &e),
    }
    let done = match b.lane_op(f.actor.clone(), key.clone(), op).await {
        Ok(d) => d,
        Err(e) => return failed(&app, &headers, status_of(&e), &e),
    };
    info!(
        action = f.op.as_str(),
        actor = %f.actor,
        recipient = key.recipient(),
        ordering_key = key.ordering_key(),
        dead_lettered = done.dead_lettered,
        via = "dashboard",
        "lane action done"
    );
    let what = match (f.op.as_str(), done.skipped) {
        ("skip-head", Some(u)) => format!("unit {} dead-lettered (reason skipped)", u.0),
        ("skip-head", None) => "nothing pending, nothing skipped".to_owned(),
        ("purge", _) => format!(
            "{} unit(s) dead-lettered (reason purged)",
            done.dead_lettered
        ),
        _ => "done".to_owned(),
    };
    let msg = format!("{}: {}: {what}", f.op, lane_name(&key));
    Redirect::to(&format!("{}&done={}", lane_href(&f.actor, &key), enc(&msg))).into_response()
}

#[derive(Deserialize)]
struct HostForm {
    #[serde(default)]
    csrf: String,
    origin: String,
    op: String,
}

async fn host(State(app): State<App>, headers: HeaderMap, Form(f): Form<HostForm>) -> Response {
    if let Err(why) = app.inner.auth.authorize(&headers, &f.csrf) {
        return refused(&app, &headers, why);
    }
    let origin = match super::super::hosts::parse_origin(&f.origin) {
        Ok(o) => o,
        Err(e) => return failed(&app, &headers, StatusCode::BAD_REQUEST, &e),
    };
    let b = app.backend();
    let done = match f.op.as_str() {
        "block" => b
            .host_block(origin.clone(), HostBlock::Hold)
            .await
            .map(|n| format!("{n} lane(s) paused")),
        "block-dead-letter" => b
            .host_block(origin.clone(), HostBlock::DeadLetter)
            .await
            .map(|n| format!("{n} unit(s) dead-lettered (reason blocked)")),
        "unblock" => b
            .host_block(origin.clone(), HostBlock::Open)
            .await
            .map(|n| format!("{n} lane(s) resumed")),
        "retry" => b
            .host_retry(origin.clone())
            .await
            .map(|n| format!("{n} lane(s) back")),
        other => Err(anyhow::Error::new(super::super::UsageError(format!(
            "no host action {other:?}"
        )))),
    };
    match done {
        Ok(what) => {
            info!(action = f.op.as_str(), origin = %origin, via = "dashboard", "host action done");
            let msg = format!("{}: {origin}: {what}", f.op);
            Redirect::to(&format!("/hosts?done={}", enc(&msg))).into_response()
        }
        Err(e) => failed(&app, &headers, status_of(&e), &e),
    }
}

#[derive(Deserialize)]
struct DeadForm {
    #[serde(default)]
    csrf: String,
    op: String,
    /// The ids the preview (or the dead letter's page) listed, comma-separated.
    ids: String,
}

async fn dead_letters(
    State(app): State<App>,
    headers: HeaderMap,
    Form(f): Form<DeadForm>,
) -> Response {
    if let Err(why) = app.inner.auth.authorize(&headers, &f.csrf) {
        return refused(&app, &headers, why);
    }
    let ids: Result<Vec<DeadLetterId>, _> = f
        .ids
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<i64>().map(DeadLetterId))
        .collect();
    let Ok(ids) = ids else {
        return failed(
            &app,
            &headers,
            StatusCode::BAD_REQUEST,
            &anyhow::anyhow!("ids: not a list of numbers"),
        );
    };
    let n = ids.len();
    let which = vec![DeadLetterSelection::Ids(ids)];
    let b = app.backend();
    let done = match f.op.as_str() {
        "replay" if n > 0 => b.replay(which).await.map(|u| {
            format!(
                "replayed {} dead letter(s) to the tail of their lanes",
                u.len()
            )
        }),
        "purge" if n > 0 => b
            .purge(which)
            .await
            .map(|k| format!("purged {k} dead letter(s)")),
        "replay" | "purge" => Ok("nothing selected".to_owned()),
        other => Err(anyhow::Error::new(super::super::UsageError(format!(
            "no dead-letter action {other:?}"
        )))),
    };
    match done {
        Ok(msg) => {
            info!(
                action = f.op.as_str(),
                selected = n,
                via = "dashboard",
                "dead-letter action done"
            );
            Redirect::to(&format!("/dead-letters?done={}", enc(&msg))).into_response()
        }
        Err(e) => failed(&app, &headers, status_of(&e), &e),
    }
}
