//! HTTP delivery over reqwest, with the blocking client's policy (design.md §5).
//!
//! [`AsyncHttpClient::deliver`] never fails and never panics on input: like
//! the blocking client (`ureq_client::HttpClient::deliver`) it turns whatever happens into an
//! [`AttemptResult`] with the same outcome, status and error codes (`destination_refused`,
//! `invalid_recipient`, `invalid_request`, a [`TransportError`] code, `status <code>`), so a
//! dead letter reads the same whichever runtime delivered it. Only the client call differs;
//! the classification, Retry-After parsing, answer excerpts and refusal messages are the
//! shared ones.
//!
//! - the request built by `outbox_lanes_driver::request`, sent as it is: the method, the URL
//!   parsed once for the lane, every header (`User-Agent`, `Accept`, `Idempotency-Key`,
//!   `Content-Type`, the row's own after checking them again, the [`Signer`]'s, signed on
//!   every attempt with that attempt's time) and the body, shared with the payload rather
//!   than copied; reqwest adds only `Host` and `Content-Length`;
//! - no redirect followed (`redirect::Policy::none()`): a 3xx is classified, by default as
//!   permanent;
//! - at most [`HttpConfig::max_response_body`] bytes of the answer read, then the
//!   connection is dropped;
//! - the whole exchange bounded by [`HttpConfig::timeout`] (reqwest's total timeout covers
//!   the body too).
//!
//! # The SSRF guard
//!
//! reqwest (hyper) never passes an IP-literal host to its resolver, so a literal is checked
//! against the [`AddressPolicy`] when the request is built ([`RequestPolicy::build`]), before
//! anything is sent. Names are resolved by
//! the client's own [`reqwest::dns::Resolve`], which drops every address the policy refuses
//! and fails when none is left; hyper connects only to the addresses it returns, so the
//! addresses checked are the addresses used (no second lookup for DNS rebinding to exploit).
//!
//! System proxies are off (`no_proxy()`): `HTTP_PROXY` and friends are ignored, and a proxy
//! is used only when [`HttpConfig::proxy`] names one. **The guard cannot see through a
//! proxy**: the proxy resolves names and connects wherever they point; the proxy's own
//! address is exempt from the policy.
//!
//! # TLS
//!
//! rustls with the `ring` provider and the webpki roots, handed to reqwest as a
//! preconfigured `ClientConfig`: reqwest's own default provider (aws-lc-rs) is not built,
//! so the workspace carries one crypto provider.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use outbox_lanes_core::Timestamp;
use outbox_lanes_core::policy::{
    AddressPolicy, Classifier, DestinationRefused, Recipient, TransportError, parse_retry_after,
};
use outbox_lanes_driver::http::{
    AttemptResult, Delivery, HttpConfig, answered_result, invalid_request, io_kind,
    redact_userinfo, refusal_message, refused_result,
};
use outbox_lanes_driver::request::{Request, RequestPolicy};
use outbox_lanes_driver::sign::Signer;
use outbox_lanes_driver::{Job, OriginTicket, OutboxError};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Idle connections kept per host (reqwest keeps unlimited by default; bounded here). Sized
/// for a relay with hundreds of attempts in flight to one host: a smaller pool closes the
/// connections it cannot keep, and every later request to that host pays a new connection.
const IDLE_PER_HOST: usize = 1024;

/// An async HTTP client for deliveries: one reqwest client (and its connection pool),
/// shared by every clone. Must be used inside a tokio runtime.
#[derive(Clone)]
pub struct AsyncHttpClient {
    client: reqwest::Client,
    shared: Arc<Shared>,
}

struct Shared {
    requests: RequestPolicy,
    max_response_body: usize,
    classifier: Classifier,
    retry_after_cap: Duration,
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
        let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| http_err(format!("TLS: {e}")))?
        .with_root_certificates(rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        })
        .with_no_client_auth();
        // Only HTTP/1.1 is built in (no `http2` feature).
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];

        let mut proxy_host = None;
        let mut builder = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .http1_only()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(cfg.timeout)
            .connect_timeout(cfg.connect_timeout.min(cfg.timeout))
            // No User-Agent here: it comes with the request (crate::request), like every
            // header. reqwest's one default header, `Accept: */*`, is always overridden by the
            // request's own.
            .pool_max_idle_per_host(IDLE_PER_HOST);
        match &cfg.proxy {
            None => builder = builder.no_proxy(),
            Some(p) => {
                let scheme = p.split("://").next().unwrap_or("").to_ascii_lowercase();
                if !p.contains("://") || !matches!(scheme.as_str(), "http" | "https") {
                    return Err(http_err(format!(
                        "unsupported proxy {:?}: only http:// and https:// (CONNECT) proxies are supported",
                        redact_userinfo(p)
                    )));
                }
                let proxy = reqwest::Proxy::all(p.as_str())
                    .map_err(|_| http_err(format!("invalid proxy URL {:?}", redact_userinfo(p))))?;
                proxy_host = Recipient::parse(p)
                    .ok()
                    .map(|r| r.host().to_string().trim_matches(['[', ']']).to_owned());
                builder = builder.proxy(proxy);
            }
        }
        let client = builder
            .dns_resolver(GuardedResolver {
                policy: cfg.addresses,
                proxy_host,
            })
            .build()
            .map_err(|e| http_err(format!("cannot build the client: {e}")))?;
        Ok(AsyncHttpClient {
            client,
            shared: Arc::new(Shared {
                requests,
                max_response_body: cfg.max_response_body,
                classifier: cfg.classifier,
                retry_after_cap: cfg.retry_after_cap,
            }),
        })
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

    async fn deliver_under(
        &self,
        d: &Delivery<'_>,
        ticket: Option<&OriginTicket>,
        now: SystemTime,
    ) -> AttemptResult {
        let mut knock = self.shared.requests.knock(ticket);
        loop {
            let request =
                match self
                    .shared
                    .requests
                    .build_with(d, now, knock.spec(), knock.challenge())
                {
                    Ok(request) => request,
                    Err(result) => return result,
                };
            let (result, challenge) = self.exchange(&request, now).await;
            if !knock.again(&result, challenge.as_deref()) {
                return result;
            }
        }
    }

    /// Sends `request` as it is — reqwest adds only `Host` and `Content-Length` — under the
    /// client's transport rules (timeout, no redirect, capped answer, guarded resolver), and
    /// classifies what happened. `now` is the attempt's time, for an HTTP-date Retry-After.
    pub async fn send(&self, request: &Request<'_>, now: SystemTime) -> AttemptResult {
        self.exchange(request, now).await.0
    }

    /// [`AsyncHttpClient::send`], with the answer's `Accept-Signature` (RFC 9421 §5) if it
    /// refused.
    async fn exchange(
        &self,
        request: &Request<'_>,
        now: SystemTime,
    ) -> (AttemptResult, Option<String>) {
        let mut req = self
            .client
            .request(request.method.clone(), request.url.as_str());
        for (name, value) in &request.headers {
            req = req.header(name, value);
        }
        // The body's bytes are shared, not copied.
        match req.body(request.body.clone()).send().await {
            Ok(response) => {
                let challenge = (!response.status().is_success())
                    .then(|| response.headers().get("accept-signature"))
                    .flatten()
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                (self.answered(response, now).await, challenge)
            }
            Err(e) => (self.failed(&e), None),
        }
    }

    async fn answered(&self, mut response: reqwest::Response, now: SystemTime) -> AttemptResult {
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                parse_retry_after(
                    v,
                    Timestamp::from_system_time(now),
                    self.shared.retry_after_cap,
                )
            });
        let outcome = self.shared.classifier.status(status, retry_after);
        // Read at most the cap, keep the start; dropping the response early closes the
        // connection instead of pooling it. A read error is ignored: the status decided.
        let mut head = Vec::new();
        let mut read = 0usize;
        while read < self.shared.max_response_body {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    read = read.saturating_add(chunk.len());
                    let room = outbox_lanes_driver::http::ERROR_EXCERPT.saturating_sub(head.len());
                    head.extend(chunk.iter().take(room));
                }
                Ok(None) | Err(_) => break,
            }
        }
        drop(response);
        answered_result(outcome, status, &head)
    }

    fn failed(&self, e: &reqwest::Error) -> AttemptResult {
        if e.is_builder() {
            return invalid_request(chain(e));
        }
        let mut kind = None;
        let mut source: Option<&(dyn StdError + 'static)> = Some(e);
        while let Some(s) = source {
            if let Some(g) = s.downcast_ref::<GuardError>() {
                match g {
                    GuardError::Refused(r) => return self.refused(r),
                    GuardError::Resolve(_) => kind = kind.or(Some(TransportError::Dns)),
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
        let kind = if e.is_timeout() && e.is_connect() {
            TransportError::ConnectTimeout
        } else if e.is_timeout() {
            TransportError::Timeout
        } else {
            kind.unwrap_or(TransportError::Other)
        };
        AttemptResult {
            outcome: self.shared.classifier.transport(kind),
            status: None,
            error: Some(format!("{kind}: {}", chain(e))),
        }
    }

    fn refused(&self, refused: &DestinationRefused) -> AttemptResult {
        refused_result(refused, &self.shared.classifier)
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

/// The error and its sources, `: `-separated (reqwest's own message names only the URL).
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

/// The resolver's own failures, found again in reqwest's error chain.
#[derive(Debug)]
enum GuardError {
    /// Every address the name resolved to was refused by the policy (the first one here).
    Refused(DestinationRefused),
    /// The lookup itself failed.
    Resolve(io::Error),
}

impl fmt::Display for GuardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GuardError::Refused(r) => f.write_str(&refusal_message(r)),
            GuardError::Resolve(e) => write!(f, "name resolution failed: {e}"),
        }
    }
}

impl StdError for GuardError {}

/// The system resolver (through tokio), with every address the policy refuses taken out.
struct GuardedResolver {
    policy: AddressPolicy,
    /// The configured proxy's host, exempt from the policy.
    proxy_host: Option<String>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy;
        let host = name.as_str().to_owned();
        let exempt = self
            .proxy_host
            .as_deref()
            .is_some_and(|p| p.eq_ignore_ascii_case(&host));
        Box::pin(async move {
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|e| Box::new(GuardError::Resolve(e)))?
                .collect();
            if exempt {
                let addrs: Addrs = Box::new(resolved.into_iter());
                return Ok(addrs);
            }
            let mut allowed = Vec::with_capacity(resolved.len());
            let mut first_refused = None;
            for addr in resolved {
                match policy.check(addr.ip()) {
                    Ok(()) => allowed.push(addr),
                    Err(refused) => {
                        first_refused.get_or_insert(refused);
                    }
                }
            }
            if allowed.is_empty() {
                let err: Box<dyn StdError + Send + Sync> = match first_refused {
                    Some(refused) => Box::new(GuardError::Refused(refused)),
                    None => Box::new(GuardError::Resolve(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{host} has no address"),
                    ))),
                };
                return Err(err);
            }
            let addrs: Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}
