//! HTTP delivery over hyper-util's pooled client, with the blocking client's policy
//! (design.md §5).
//!
//! [`AsyncHttpClient::deliver`] never fails and never panics on input: like
//! the blocking client (`ureq_client::HttpClient::deliver`) it turns whatever happens into an
//! [`AttemptResult`] with the same outcome, status and error codes (`destination_refused`,
//! `invalid_recipient`, `invalid_request`, a [`TransportError`] code, `status <code>`), so a
//! dead letter reads the same whichever runtime delivered it. Only the client call differs
//! (this client's [`Exchange`]); the double-knock loop ([`exchange::deliver`]), the
//! classification ([`Answers`]), Retry-After parsing, answer excerpts, refusal messages and
//! the proxy URL's parse ([`ProxyUrl`]) are the shared ones.
//!
//! - the request built by `outbox_lanes_driver::request`, sent as it is: the method, the URL
//!   parsed once for the lane, every header (`User-Agent`, `Accept`, `Idempotency-Key`,
//!   `Content-Type`, the row's own after checking them again, the [`Signer`]'s, signed on
//!   every attempt with that attempt's time) and the body, shared with the payload rather
//!   than copied; hyper adds only `Host` and `Content-Length`;
//! - HTTP/1.1 on pooled keep-alive connections (`TCP_NODELAY`), no redirect followed (hyper
//!   follows none): a 3xx is classified, by default as permanent;
//! - at most [`HttpConfig::max_response_body`] bytes of the answer read, then the
//!   connection is dropped;
//! - the whole exchange, the answer's body included, bounded by [`HttpConfig::timeout`];
//!   connecting by [`HttpConfig::connect_timeout`] as well.
//!
//! Why hyper-util and not reqwest (issue 23): reqwest is a layer over this same client, and
//! on this path its layer cost about as much CPU per delivery as the client under it (URL
//! parsing with IDNA per request, its own header map and timeout futures, a proxy matcher
//! per connection); what it adds that a relay needs (TLS, a guarded resolver, one proxy,
//! timeouts, a body cap) is the code below. BENCHMARKS.md has the measurement.
//!
//! # The SSRF guard
//!
//! hyper-util's connector never passes an IP-literal host to its resolver, so a literal is
//! checked against the [`AddressPolicy`] when the request is built ([`RequestPolicy::build`]),
//! before anything is sent. Names are resolved by the connector's own resolver
//! (`GuardedResolver`), which drops every address the policy refuses and fails when none is
//! left; the connector connects only to the addresses it returns, so the addresses checked
//! are the addresses used (no second lookup for DNS rebinding to exploit).
//!
//! System proxies are never read: `HTTP_PROXY` and friends are ignored, and a proxy is used
//! only when [`HttpConfig::proxy`] names one (`http://` or `https://`, credentials in its
//! URL sent as `Proxy-Authorization: Basic`): `http://` recipients are asked of the proxy in
//! absolute form, `https://` ones through a `CONNECT` tunnel with TLS to the recipient inside.
//! **The guard cannot see through a proxy**: the proxy resolves names and connects wherever
//! they point; the proxy's own address is exempt from the policy.
//!
//! # TLS
//!
//! rustls with the `ring` provider and the webpki roots, through hyper-rustls without its
//! default provider (aws-lc-rs), so the workspace carries one crypto provider.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::PROXY_AUTHORIZATION;
use http::{HeaderValue, Uri, uri::Scheme};
use http_body_util::{BodyExt, Full};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use outbox_lanes_core::policy::{AddressPolicy, TransportError};
use outbox_lanes_driver::exchange::{self, Answers, Exchange, Exchanged, GuardError, ProxyUrl};
use outbox_lanes_driver::http::{
    AttemptResult, Delivery, HttpConfig, OutboxAddresses, invalid_request, io_kind,
};
use outbox_lanes_driver::request::{Request, RequestPolicy};
use outbox_lanes_driver::sign::Signer;
use outbox_lanes_driver::{Job, OriginTicket, OutboxError};
use tower_service::Service;

/// Idle connections kept per host (bounded: a client's default keeps any number). Sized
/// for a relay with hundreds of attempts in flight to one host: a smaller pool closes the
/// connections it cannot keep, and every later request to that host pays a new connection.
const IDLE_PER_HOST: usize = 1024;

type BoxError = Box<dyn StdError + Send + Sync>;

/// A TCP connector, names resolved behind the guard.
type Tcp = HttpConnector<GuardedResolver>;

/// An async HTTP client for deliveries: one hyper-util client (and its connection pool),
/// shared by every clone. Must be used inside a tokio runtime.
#[derive(Clone)]
pub struct AsyncHttpClient {
    shared: Arc<Shared>,
}

struct Shared {
    /// The client and its connection pool, with the outbox policy's narrowings it was made
    /// after (OL-24): a narrowing starts a new one, so that no connection opened while the
    /// policy allowed more is used again.
    client: RwLock<(u64, Client<Connector, Full<Bytes>>)>,
    connector: Connector,
    outbox: OutboxAddresses,
    requests: RequestPolicy,
    answers: Answers,
    /// [`HttpConfig::timeout`], the exchange's deadline.
    timeout: Duration,
    /// The configured proxy's credentials, sent with a request asked in absolute form.
    proxy_auth: Option<HeaderValue>,
    proxied: bool,
}

impl fmt::Debug for AsyncHttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncHttpClient")
            .field("requests", &self.shared.requests)
            .finish_non_exhaustive()
    }
}

impl AsyncHttpClient {
    /// Builds a client.
    ///
    /// # Errors
    /// [`OutboxError::Http`] when the proxy or the User-Agent is invalid, or the client
    /// cannot be built.
    pub fn new(cfg: HttpConfig, signer: Option<Arc<dyn Signer>>) -> Result<Self, OutboxError> {
        let http_err = |e: String| OutboxError::Http(e);
        let requests = RequestPolicy::new(&cfg, signer).map_err(|e| http_err(e.to_string()))?;
        // rustls 0.23.48 deprecates ring's provider ("no support for post-quantum
        // algorithms"): the hybrid post-quantum key exchange is aws-lc-rs's. ring stays the one
        // provider of both HTTP clients and the Postgres store (it builds without cmake or
        // nasm); classical X25519 key exchange is what recipients accept.
        #[allow(deprecated)]
        let provider = rustls::crypto::ring::default_provider();
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| http_err(format!("TLS: {e}")))?
            .with_root_certificates(rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            })
            .with_no_client_auth();

        let proxy = match cfg.proxy.as_deref() {
            None => None,
            Some(text) => {
                let p = ProxyUrl::parse(text).map_err(|e| http_err(e.to_string()))?;
                let auth = p.basic_auth(text).map_err(|e| http_err(e.to_string()))?;
                Some((p, auth))
            }
        };
        let mut tcp = HttpConnector::new_with_resolver(GuardedResolver {
            policy: cfg.addresses,
            outbox: cfg.outbox_addresses.clone(),
            proxy_host: proxy.as_ref().map(|(p, _)| Arc::clone(p.host())),
        });
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(cfg.connect_timeout.min(cfg.timeout)));
        // ALPN offers only HTTP/1.1 (`enable_http1`; no `http2` feature is built).
        let direct = HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let (proxy_auth, via) = match proxy {
            None => (None, None),
            Some((p, auth)) => {
                let mut tunnel = Tunnel::new(p.uri().clone(), direct.clone());
                if let Some(auth) = &auth {
                    tunnel = tunnel.with_auth(auth.clone());
                }
                let tunnel = HttpsConnectorBuilder::new()
                    .with_tls_config(tls)
                    .https_or_http()
                    .enable_http1()
                    .wrap_connector(tunnel);
                let uri = p.uri().clone();
                (auth, Some(Via { uri, tunnel }))
            }
        };
        let proxied = via.is_some();
        let connector = Connector { direct, via };
        let outbox = cfg.outbox_addresses.clone();
        let client = RwLock::new((outbox.narrowings(), pooled(connector.clone())));
        Ok(AsyncHttpClient {
            shared: Arc::new(Shared {
                client,
                connector,
                outbox,
                requests,
                answers: Answers::new(&cfg),
                timeout: cfg.timeout,
                proxy_auth,
                proxied,
            }),
        })
    }

    /// The client to send with: the one made after the outbox policy's last narrowing (one
    /// read lock and a clone of an `Arc` when it did not move; a new pool when it did).
    fn client(&self) -> Client<Connector, Full<Bytes>> {
        let narrowings = self.shared.outbox.narrowings();
        {
            let c = self
                .shared
                .client
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            if c.0 == narrowings {
                return c.1.clone();
            }
        }
        let mut c = self
            .shared
            .client
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if c.0 != narrowings {
            *c = (narrowings, pooled(self.shared.connector.clone()));
        }
        c.1.clone()
    }

    /// Makes one delivery attempt at `now` and classifies what happened; see
    /// the blocking client (`ureq_client::HttpClient::deliver`), whose results this matches.
    /// The request is built by the shared [`RequestPolicy::build`], which may refuse to send
    /// anything, and then [sent](AsyncHttpClient::send).
    pub async fn deliver(&self, d: &Delivery<'_>, now: SystemTime) -> AttemptResult {
        self.deliver_under(d, None, now).await
    }

    /// [`AsyncHttpClient::deliver`] of a job: its origin's ticket ([`Job::origin`]) chooses
    /// the signature scheme and learns the one accepted (the double-knock,
    /// [`outbox_lanes_driver::origins`]).
    pub async fn deliver_job(&self, job: &Job, now: SystemTime) -> AttemptResult {
        self.deliver_under(&job.delivery(), job.origin(), now).await
    }

    /// The one double-knock loop ([`exchange::deliver`]), over this client's exchange.
    async fn deliver_under(
        &self,
        d: &Delivery<'_>,
        ticket: Option<&OriginTicket>,
        now: SystemTime,
    ) -> AttemptResult {
        exchange::deliver(self, &self.shared.requests, d, ticket, now).await
    }

    /// Sends `request` as it is — hyper adds only `Host` and `Content-Length` — under the
    /// client's transport rules (timeout, no redirect, capped answer, guarded resolver), and
    /// classifies what happened. `now` is the attempt's time, for an HTTP-date Retry-After.
    pub async fn send(&self, request: &Request<'_>, now: SystemTime) -> AttemptResult {
        self.transmit(request, now).await.0
    }

    /// [`AsyncHttpClient::send`], with the answer's `Accept-Signature` (RFC 9421 §5) if it
    /// refused.
    async fn transmit(&self, request: &Request<'_>, now: SystemTime) -> Exchanged {
        let uri = match Uri::try_from(request.url.as_str()) {
            Ok(uri) => uri,
            Err(e) => return (invalid_request(format!("invalid URL: {e}")), None),
        };
        let absolute_form = self.shared.proxied && uri.scheme() != Some(&Scheme::HTTPS);
        // The body's bytes are shared, not copied.
        let mut req = http::Request::new(Full::new(request.body.clone()));
        *req.method_mut() = request.method.clone();
        *req.uri_mut() = uri;
        let headers = req.headers_mut();
        headers.reserve(request.headers.len() + 1);
        for (name, value) in &request.headers {
            headers.append(name.clone(), value.clone());
        }
        if absolute_form && let Some(auth) = &self.shared.proxy_auth {
            headers.insert(PROXY_AUTHORIZATION, auth.clone());
        }
        // One deadline for the whole exchange: the answer's head, then its body. A body cut
        // by the deadline leaves the status to decide, as a body cut by the cap does.
        let deadline = tokio::time::Instant::now() + self.shared.timeout;
        let response = match tokio::time::timeout_at(deadline, self.client().request(req)).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => return (self.failed(&e), None),
            Err(_) => return (self.shared.answers.timed_out(), None),
        };
        self.answered(response, deadline, now).await
    }

    async fn answered(
        &self,
        response: http::Response<hyper::body::Incoming>,
        deadline: tokio::time::Instant,
        now: SystemTime,
    ) -> Exchanged {
        let answers = &self.shared.answers;
        let mut answer = answers.answer(response.status(), response.headers(), now);
        // Read at most the cap, keep the start; dropping the body early closes the
        // connection instead of pooling it. A read error or the deadline ends the read: the
        // status decided.
        let mut body = response.into_body();
        let mut read = 0usize;
        while read < answers.max_response_body() {
            match tokio::time::timeout_at(deadline, body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    let Some(chunk) = frame.data_ref() else {
                        continue;
                    };
                    read = read.saturating_add(chunk.len());
                    answer.keep(chunk);
                }
                Ok(None | Some(Err(_))) | Err(_) => break,
            }
        }
        drop(body);
        answer.finish()
    }

    fn failed(&self, e: &hyper_util::client::legacy::Error) -> AttemptResult {
        let mut kind = None;
        let mut source: Option<&(dyn StdError + 'static)> = Some(e);
        while let Some(s) = source {
            if let Some(g) = s.downcast_ref::<GuardError>() {
                match g.classified() {
                    Err(r) => return self.shared.answers.refused(&r),
                    Ok(k) => kind = kind.or(Some(k)),
                }
            } else if s.is::<rustls::Error>() {
                kind = kind.or(Some(TransportError::Tls));
            } else if let Some(io) = s.downcast_ref::<io::Error>() {
                kind = kind.or(io_chain_kind(io));
            } else if let Some(h) = s.downcast_ref::<hyper::Error>() {
                // The peer closed the connection before answering: what ureq reports as a
                // reset (an unexpected end of stream).
                if h.is_incomplete_message() {
                    kind = kind.or(Some(TransportError::ConnectionReset));
                }
            }
            source = s.source();
        }
        let kind = match kind {
            // The connector's own deadline ([`HttpConfig::connect_timeout`]).
            Some(TransportError::Timeout) if e.is_connect() => TransportError::ConnectTimeout,
            Some(kind) => kind,
            None => TransportError::Other,
        };
        self.shared.answers.failed(kind, chain(e))
    }
}

impl Exchange for AsyncHttpClient {
    fn exchange(
        &self,
        request: &Request<'_>,
        now: SystemTime,
    ) -> impl Future<Output = Exchanged> + Send {
        self.transmit(request, now)
    }
}

/// A hyper-util client over `connector`, with a pool of its own.
fn pooled(connector: Connector) -> Client<Connector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(IDLE_PER_HOST)
        .pool_timer(TokioTimer::new())
        .build(connector)
}

/// The client's connector: straight to the recipient, or through the configured proxy.
#[derive(Clone)]
struct Connector {
    direct: HttpsConnector<Tcp>,
    via: Option<Via>,
}

/// The proxy: asked directly for `http://` recipients (absolute form), tunnelled through
/// for `https://` ones.
#[derive(Clone)]
struct Via {
    uri: Uri,
    tunnel: HttpsConnector<Tunnel<HttpsConnector<Tcp>>>,
}

impl Service<Uri> for Connector {
    type Response = Conn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Conn, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Each call readies the connector it uses.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let mut direct = self.direct.clone();
        let via = self.via.clone();
        Box::pin(async move {
            match via {
                None => Ok(Conn::new(connect(&mut direct, dst).await?, false)),
                Some(mut via) if dst.scheme() == Some(&Scheme::HTTPS) => {
                    Ok(Conn::new(connect(&mut via.tunnel, dst).await?, false))
                }
                Some(via) => Ok(Conn::new(connect(&mut direct, via.uri).await?, true)),
            }
        })
    }
}

/// Readies `svc` and connects it to `dst`.
async fn connect<S>(svc: &mut S, dst: Uri) -> Result<S::Response, BoxError>
where
    S: Service<Uri>,
    S::Error: Into<BoxError>,
{
    std::future::poll_fn(|cx| svc.poll_ready(cx))
        .await
        .map_err(Into::into)?;
    svc.call(dst).await.map_err(Into::into)
}

/// What a connection's stream must do, whichever way it was made.
trait Io: hyper::rt::Read + hyper::rt::Write + Send + Unpin {}
impl<T: hyper::rt::Read + hyper::rt::Write + Send + Unpin> Io for T {}

/// A connection: its stream, and whether it goes to the proxy (requests in absolute form).
struct Conn {
    io: Box<dyn Io>,
    proxied: bool,
}

impl Conn {
    fn new(io: impl Io + 'static, proxied: bool) -> Self {
        Conn {
            io: Box::new(io),
            proxied,
        }
    }
}

impl Connection for Conn {
    fn connected(&self) -> Connected {
        Connected::new().proxy(self.proxied)
    }
}

impl hyper::rt::Read for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

/// The classification of an I/O error and the I/O errors it wraps: hyper-rustls and
/// hyper-util nest a rustls error two `io::Error`s deep, where `source()` does not reach it.
fn io_chain_kind(io: &io::Error) -> Option<TransportError> {
    let mut io = io;
    let mut found = None;
    loop {
        let k = io_kind(io);
        if k == TransportError::Tls {
            return Some(k);
        }
        if k != TransportError::Other {
            found = found.or(Some(k));
        }
        match io.get_ref() {
            Some(inner) if inner.is::<rustls::Error>() => return Some(TransportError::Tls),
            Some(inner) => match inner.downcast_ref::<io::Error>() {
                Some(next) => io = next,
                None => return found,
            },
            None => return found,
        }
    }
}

/// The error and its sources, `: `-separated (the client's own message names only the step).
fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        source = s.source();
    }
    out
}

/// The system resolver (through tokio), with every address the policy refuses taken out.
#[derive(Clone)]
struct GuardedResolver {
    policy: AddressPolicy,
    /// The outbox's stored policy, allowed too (OL-24): read at each lookup.
    outbox: OutboxAddresses,
    /// The configured proxy's host, exempt from the policy.
    proxy_host: Option<Arc<str>>,
}

impl Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = GuardError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, GuardError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), GuardError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let policy = self.outbox.allowing(self.policy);
        let host = name.as_str().to_owned();
        let exempt = self
            .proxy_host
            .as_deref()
            .is_some_and(|p| p.eq_ignore_ascii_case(&host));
        Box::pin(async move {
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(GuardError::Resolve)?
                .collect();
            if exempt {
                return Ok(resolved.into_iter());
            }
            let mut allowed = Vec::with_capacity(resolved.len());
            match policy.admit(resolved, |a| allowed.push(a)) {
                Ok(()) => Ok(allowed.into_iter()),
                Err(Some(refused)) => Err(GuardError::Refused(refused)),
                Err(None) => Err(GuardError::Resolve(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{host} has no address"),
                ))),
            }
        })
    }
}
