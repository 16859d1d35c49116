//! The relay's HTTP side, on axum (hyper): `relay --metrics-addr` (the probes) and
//! `relay --admin-addr` (the web dashboard, with the probes too).
//!
//! The probes answer as the relay always did:
//! - `/metrics`: the exposition text (`metrics.rs` encodes it); 503 if the store cannot be
//!   read; on `--metrics-addr` `/` too.
//! - `/healthz`: 200 while the process serves requests (liveness).
//! - `/readyz`: 200 if the store answers a query now, else 503 with the reason; 503 too once a
//!   SQLite file was removed or replaced under the process.
//! - GET and HEAD only (405 otherwise); anything else 404. Every answer closes its
//!   connection (`Connection: close`). A store that does not answer within
//!   [`STORE_WAIT`](super::metrics::STORE_WAIT) gets a 503: a probe never hangs on it.
//!
//! The dashboard (`pages.rs`, `actions.rs`) is server-rendered HTML (maud, which escapes
//! every value it is given: recipient URLs, response bodies and error texts arrive as text,
//! never as markup), no script. It reads the store through the same [`Backend`] calls as the
//! commands `status`, `lanes`, `hosts` and `dead-letters`, and acts through the same calls as
//! their actions, so the lane and host fences (OL-14, OL-21) hold for a click as for the
//! command. Who may act: `auth.rs`. The overview's per-minute charts: `ring.rs`.

mod actions;
mod auth;
mod pages;
mod ring;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::args::MetricsAddr;
use super::backend::{Backend, Counters};

pub(crate) use auth::read_token;

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct App {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    counters: Arc<Counters>,
    ring: ring::Ring,
    auth: auth::Auth,
}

impl App {
    fn new(backend: Backend, counters: Arc<Counters>, token: Option<Vec<u8>>) -> App {
        App {
            inner: Arc::new(Inner {
                backend,
                counters,
                ring: ring::Ring::default(),
                auth: auth::Auth::new(token),
            }),
        }
    }

    fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// Adds the counters' growth to the current minute.
    fn sample(&self) {
        self.inner.ring.sample(&self.inner.counters, minute_now());
    }
}

/// Minutes since the Unix epoch, now.
fn minute_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 60)
}

/// Binds the first of `addr`'s addresses that can be bound.
///
/// # Errors
/// None of the addresses can be bound (the last address's error).
async fn bind(addr: &MetricsAddr) -> std::io::Result<TcpListener> {
    let mut last = None;
    for a in &addr.addrs {
        match TcpListener::bind(a).await {
            Ok(l) => return Ok(l),
            Err(e) => {
                last = Some(std::io::Error::new(
                    e.kind(),
                    format!("cannot bind {a}: {e}"),
                ))
            }
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, "no address to bind")
    }))
}

/// Every answer closes its connection, as the relay's responder always did (a scraper
/// reading to the end of the stream gets it).
async fn close(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Serves `router` on `listener` until the task is aborted: one request per connection
/// (hyper's HTTP/1 server, keep-alive off, header names in title case, as the relay's
/// responder always answered), each connection a task of its own bounded by
/// [`CONNECTION_BOUND`].
fn spawn(listener: TcpListener, router: Router) -> JoinHandle<()> {
    let router = router.layer(axum::middleware::map_response(close));
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let service = hyper_util::service::TowerToHyperService::new(router.clone());
            tokio::spawn(async move {
                let conn = hyper::server::conn::http1::Builder::new()
                    .keep_alive(false)
                    .title_case_headers(true)
                    .header_read_timeout(Duration::from_secs(5))
                    .timer(hyper_util::rt::TokioTimer::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                match tokio::time::timeout(CONNECTION_BOUND, conn).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "HTTP request failed"),
                    Err(_) => {
                        tracing::debug!(%peer, "HTTP connection cut after {CONNECTION_BOUND:?}")
                    }
                }
            });
        }
    })
}

/// The longest one connection is served (a request and its answer).
const CONNECTION_BOUND: Duration = Duration::from_secs(60);

/// `--metrics-addr`: `/metrics` (and `/`), `/healthz`, `/readyz`, until the task is aborted.
///
/// # Errors
/// None of the addresses can be bound.
pub(crate) async fn serve_probes(
    addr: &MetricsAddr,
    backend: Backend,
    counters: Arc<Counters>,
) -> std::io::Result<JoinHandle<()>> {
    let listener = bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics, /healthz and /readyz");
    let app = App::new(backend, counters, None);
    Ok(spawn(
        listener,
        Router::new().fallback(probes_and_root).with_state(app),
    ))
}

/// `--admin-addr`: the dashboard and the probes, until the task is aborted. `token`: the
/// admin token (`None`: read-only).
///
/// # Errors
/// None of the addresses can be bound.
pub(crate) async fn serve_admin(
    addr: &MetricsAddr,
    backend: Backend,
    counters: Arc<Counters>,
    token: Option<Vec<u8>>,
) -> std::io::Result<JoinHandle<()>> {
    let listener = bind(addr).await?;
    let local: SocketAddr = listener.local_addr()?;
    let writable = token.is_some();
    if !local.ip().is_loopback() {
        tracing::warn!(addr = %local, "the dashboard is served on an address that is not loopback: \
            anyone who reaches it reads the outbox (payloads included); put it behind a proxy \
            with TLS and authentication");
    }
    tracing::info!(addr = %local, actions = writable,
        "serving the dashboard, /metrics, /healthz and /readyz");
    let app = App::new(backend, counters, token);
    let router = pages::routes()
        .merge(actions::routes())
        .layer(axum::middleware::map_response(page_headers))
        .layer(axum::middleware::from_fn(local_host))
        .fallback(probes)
        .with_state(app.clone());
    let server = spawn(listener, router);
    Ok(tokio::spawn(async move {
        // The charts' sampler beside the server: both go when the task is aborted.
        let sampler = async {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                app.sample();
            }
        };
        struct AbortOnDrop(JoinHandle<()>);
        impl Drop for AbortOnDrop {
            fn drop(&mut self) {
                self.0.abort();
            }
        }
        let server = AbortOnDrop(server);
        sampler.await;
        drop(server);
    }))
}

/// The dashboard's pages are never framed (its buttons act in one click), never cached, run
/// no script (even one that slipped through escaping would not run) and post forms only to
/// themselves.
async fn page_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Refuses a dashboard request whose `Host` is a name other than `localhost`: a page of
/// another site that made its own name resolve to this address (DNS rebinding) would
/// otherwise read the dashboard as its own origin. An IP address (`127.0.0.1:9188`, what a
/// reverse proxy sends by default) or `localhost` passes.
async fn local_host(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if host_allowed(host) {
        next.run(req).await
    } else {
        text(
            StatusCode::MISDIRECTED_REQUEST,
            "the dashboard answers to an IP address or localhost only (Host header)\n".into(),
        )
    }
}

/// Whether a `Host` header names this machine by address or as `localhost`.
fn host_allowed(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        // [v6]:port
        Some(rest) => {
            return rest
                .split_once(']')
                .is_some_and(|(a, _)| a.parse::<std::net::Ipv6Addr>().is_ok());
        }
        None => host.rsplit_once(':').map_or(host, |(n, _)| n),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// The probes, with `/` as `/metrics` (`--metrics-addr`).
async fn probes_and_root(State(app): State<App>, method: Method, uri: Uri) -> Response {
    probe(&app, &method, uri.path(), true).await
}

/// The probes (`--admin-addr`, where `/` is the overview).
async fn probes(State(app): State<App>, method: Method, uri: Uri) -> Response {
    probe(&app, &method, uri.path(), false).await
}

const TEXT: &str = "text/plain; charset=utf-8";

fn text(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, TEXT)], body).into_response()
}

async fn probe(app: &App, method: &Method, path: &str, root: bool) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match path {
        "/metrics" => metrics(app).await,
        "/" if root => metrics(app).await,
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => match super::metrics::bounded(app.backend().ready()).await {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(e) => text(
                StatusCode::SERVICE_UNAVAILABLE,
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
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /healthz or /readyz\n".into(),
        ),
    }
}

async fn metrics(app: &App) -> Response {
    match super::metrics::metrics(app.backend(), app.counters()).await {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("store: {}\n", super::message(&e)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dashboard_answers_to_addresses_and_localhost_only() {
        for ok in [
            "127.0.0.1:9188",
            "127.0.0.1",
            "localhost:9188",
            "LOCALHOST",
            "[::1]:9188",
            "10.0.0.7:80",
        ] {
            assert!(host_allowed(ok), "{ok}");
        }
        for bad in [
            "evil.example:9188",
            "evil.example",
            "",
            "127.0.0.1.evil.example:80",
            "[::1",
            "localhost.evil:1",
        ] {
            assert!(!host_allowed(bad), "{bad}");
        }
    }
}
