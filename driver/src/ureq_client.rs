//! HTTP delivery over ureq: one POST per attempt, classified into an [`Outcome`].
//!
//! [`HttpClient::deliver`] never fails and never panics on input: whatever happens (a
//! status, a timeout, a reset, a refused destination) becomes an [`AttemptResult`] whose
//! [`Outcome`] the scheduler consumes. What it does (design.md §5, OL-4, OL-6, OL-9):
//!
//! - POSTs the body with its `Content-Type`, an `Idempotency-Key` (the unit id), the
//!   configured `User-Agent` and the [`Signer`]'s headers, the signer being called on every
//!   attempt with that attempt's time;
//! - follows no redirect (a 3xx is classified, by default as permanent) and turns no status
//!   into an error;
//! - reads at most [`HttpConfig::max_response_body`] bytes of the answer, then drops the
//!   connection, so a recipient cannot make a worker read forever;
//! - honours `Retry-After` (seconds or HTTP date, relative to the attempt's time, capped);
//! - bounds the whole exchange (resolve, connect, TLS, send, response, body) by
//!   [`HttpConfig::timeout`].
//!
//! # The SSRF guard
//!
//! Recipient URLs come from outside, so the client refuses to connect to addresses the
//! [`AddressPolicy`] does not allow (by default everything but public addresses):
//! - an IP-literal host is checked before anything else happens;
//! - a name is resolved by the client's own resolver, which drops every address the policy
//!   refuses and fails when none is left. The addresses it returns are the only ones ureq
//!   connects to, so the addresses checked are the addresses used: a name that resolves to a
//!   public address at check time and to `127.0.0.1` at connect time (DNS rebinding) cannot
//!   slip through, because there is no second lookup.
//!
//! Either refusal is [`Outcome::Refused`] with the error
//! `destination_refused: <addr> is <class>`, which the runtime dead-letters as
//! `destination_refused`.
//!
//! Proxies: ureq's default configuration reads `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`
//! (and their lower-case forms) from the environment. This client never does: it uses a
//! proxy only when [`HttpConfig::proxy`] names one. **The guard cannot see through a
//! proxy**: with a proxy, names are resolved by the proxy, which connects wherever they
//! point, so a proxy must enforce its own destination policy. IP-literal hosts are still
//! checked here, and the proxy's own address is exempt from the policy (the operator chose
//! it; proxies usually live on private networks).
//!
//! # TLS
//!
//! rustls with the `ring` crypto provider, pinned on the agent (not taken from a
//! process-wide default), with the webpki root certificates. The tokio runtime uses reqwest
//! with rustls and `ring` too, so the process carries one TLS implementation and one crypto
//! provider.

use core::fmt;
use std::io::{self, Read as _};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use outbox_lanes_core::policy::{
    AddressPolicy, Classifier, DEFAULT_RETRY_AFTER_CAP, DestinationRefused, Recipient,
    TransportError, parse_retry_after,
};
use outbox_lanes_core::{Outcome, Timestamp, UnitId};
use ureq::config::Config;
use ureq::http::{HeaderValue, Uri};
use ureq::tls::TlsConfig;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};
use ureq::{Agent, Proxy, ProxyProtocol};

use crate::sign::{SignRequest, Signer};

/// The default [`HttpConfig::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The default [`HttpConfig::max_response_body`]: 64 KiB.
pub const DEFAULT_MAX_RESPONSE_BODY: usize = 64 * 1024;
/// How much of a non-2xx answer's body goes into [`AttemptResult::error`]: enough for a
/// recipient's one-line reason, not enough to fill the dead-letter table.
pub const ERROR_EXCERPT: usize = 200;
/// Idle connections kept per host. ureq's default (3) is below the delivery concurrency a
/// relay runs with; many workers delivering to one host (several actors' lanes, or a
/// benchmark's loopback recipients) would then open a connection per request and fill the
/// machine with TIME_WAIT sockets.
const IDLE_PER_HOST: usize = 64;
/// Idle connections kept in all (ureq's default is 10, for the same reason).
const IDLE_TOTAL: usize = 512;

/// How the [`HttpClient`] delivers.
#[derive(Clone)]
pub struct HttpConfig {
    /// Bound on one whole attempt: resolve, connect, TLS, sending, the response head and
    /// the (capped) body. Default 30 s.
    pub timeout: Duration,
    /// The `User-Agent` header. Default `outbox-lanes/<version>`.
    pub user_agent: String,
    /// At most this many bytes of an answer's body are read; then the connection is dropped
    /// (not reused). Default 64 KiB.
    pub max_response_body: usize,
    /// Which destination addresses may be connected to. Default: public addresses only.
    pub addresses: AddressPolicy,
    /// An HTTP(S) CONNECT proxy (`http://host:port`, `https://host:port`, optionally with
    /// `user:pass@`). Default `None`: no proxy, **whatever the environment says** —
    /// `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` are ignored. The SSRF guard cannot see through
    /// a proxy (see the [module docs](self)).
    pub proxy: Option<String>,
    /// How statuses are classified. Default: the core's default policy.
    pub classifier: Classifier,
    /// Cap on a `Retry-After`. Default 1 h (OL-6).
    pub retry_after_cap: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            timeout: DEFAULT_TIMEOUT,
            user_agent: concat!("outbox-lanes/", env!("CARGO_PKG_VERSION")).to_owned(),
            max_response_body: DEFAULT_MAX_RESPONSE_BODY,
            addresses: AddressPolicy::public_only(),
            proxy: None,
            classifier: Classifier::default(),
            retry_after_cap: DEFAULT_RETRY_AFTER_CAP,
        }
    }
}

impl fmt::Debug for HttpConfig {
    /// Like a derived `Debug`, but without the proxy's credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpConfig")
            .field("timeout", &self.timeout)
            .field("user_agent", &self.user_agent)
            .field("max_response_body", &self.max_response_body)
            .field("addresses", &self.addresses)
            .field("proxy", &self.proxy.as_deref().map(redact_userinfo))
            .field("classifier", &self.classifier)
            .field("retry_after_cap", &self.retry_after_cap)
            .finish()
    }
}

/// The proxy URL with any `user:pass@` replaced by `***@`.
pub fn redact_userinfo(url: &str) -> String {
    let authority_start = url.find("://").map_or(0, |i| i + 3);
    let rest = url.get(authority_start..).unwrap_or("");
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest.get(..authority_end).and_then(|a| a.rfind('@')) {
        Some(at) => format!(
            "{}***{}",
            url.get(..authority_start).unwrap_or(""),
            rest.get(at..).unwrap_or("")
        ),
        None => url.to_owned(),
    }
}

/// One attempt to deliver one unit to one recipient.
#[derive(Clone, Copy, Debug)]
pub struct Delivery<'a> {
    /// The unit; its id is sent as `Idempotency-Key`.
    pub unit: UnitId,
    /// The recipient URL (validated at enqueue; parsed again here, see
    /// [`HttpClient::deliver`]).
    pub recipient: &'a str,
    /// The request body.
    pub body: &'a [u8],
    /// The request's `Content-Type`.
    pub content_type: &'a str,
    /// The attempt number, passed to the signer.
    pub attempt: u32,
}

/// What one attempt came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptResult {
    /// The classified outcome, for the scheduler.
    pub outcome: Outcome,
    /// The HTTP status, when the recipient answered with one.
    pub status: Option<u16>,
    /// What went wrong, for logs and the dead letter's last error: `None` when delivered.
    /// Starts with a stable code: `destination_refused`, `invalid_recipient`,
    /// `invalid_request`, a [`TransportError`] code (`timeout`, `connection_reset`, …), or
    /// `status <code>` followed by the start of the answer's body.
    pub error: Option<String>,
}

/// Why an [`HttpClient`] could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HttpError {
    /// [`HttpConfig::proxy`] is not a proxy URL.
    BadProxy {
        /// The proxy as configured.
        proxy: String,
    },
    /// [`HttpConfig::proxy`] is a SOCKS proxy; only HTTP(S) CONNECT proxies are supported.
    UnsupportedProxy {
        /// The proxy as configured.
        proxy: String,
    },
    /// [`HttpConfig::user_agent`] is not a valid header value (control characters).
    BadUserAgent,
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::BadProxy { proxy } => {
                write!(f, "invalid proxy URL {:?}", redact_userinfo(proxy))
            }
            HttpError::UnsupportedProxy { proxy } => write!(
                f,
                "unsupported proxy {:?}: only http:// and https:// (CONNECT) proxies are supported",
                redact_userinfo(proxy)
            ),
            HttpError::BadUserAgent => {
                f.write_str("the User-Agent contains characters not allowed in a header")
            }
        }
    }
}

impl std::error::Error for HttpError {}

/// A blocking HTTP client for deliveries: one ureq agent (and its connection pool), shared
/// by every clone and usable from many threads at once.
#[derive(Clone)]
pub struct HttpClient {
    agent: Agent,
    shared: Arc<Shared>,
}

/// What `deliver` needs besides the agent.
struct Shared {
    user_agent: String,
    max_response_body: usize,
    addresses: AddressPolicy,
    classifier: Classifier,
    retry_after_cap: Duration,
    signer: Option<Arc<dyn Signer>>,
}

impl HttpClient {
    /// Builds a client.
    ///
    /// # Errors
    /// [`HttpError`] when the proxy or the User-Agent is invalid.
    pub fn new(cfg: HttpConfig, signer: Option<Arc<dyn Signer>>) -> Result<Self, HttpError> {
        // ureq unwraps the configured User-Agent into a header value on every request, so a
        // bad one would panic there: refuse it here.
        if HeaderValue::from_str(&cfg.user_agent).is_err() {
            return Err(HttpError::BadUserAgent);
        }
        let proxy = match &cfg.proxy {
            None => None,
            Some(p) => {
                let proxy = Proxy::new(p).map_err(|_| HttpError::BadProxy { proxy: p.clone() })?;
                // SOCKS needs a ureq feature we do not enable (one would fail every attempt),
                // and SOCKS4/5 resolve the target locally, which the guard would then
                // filter: only CONNECT proxies have one clear meaning here.
                if !matches!(proxy.protocol(), ProxyProtocol::Http | ProxyProtocol::Https) {
                    return Err(HttpError::UnsupportedProxy { proxy: p.clone() });
                }
                Some(proxy)
            }
        };
        let tls = TlsConfig::builder()
            .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .build();
        let config = Config::builder()
            .http_status_as_error(false)
            .max_redirects(0)
            // Set explicitly: ureq's default is `Proxy::try_from_env()`, which would route
            // deliveries through whatever proxy the environment names, past the guard.
            .proxy(proxy)
            .timeout_global(Some(cfg.timeout))
            .max_idle_connections(IDLE_TOTAL)
            .max_idle_connections_per_host(IDLE_PER_HOST)
            .user_agent(cfg.user_agent.as_str())
            .tls_config(tls)
            .build();
        let resolver = GuardedResolver {
            policy: cfg.addresses,
            inner: DefaultResolver::default(),
        };
        let agent = Agent::with_parts(config, DefaultConnector::new(), resolver);
        Ok(HttpClient {
            agent,
            shared: Arc::new(Shared {
                user_agent: cfg.user_agent,
                max_response_body: cfg.max_response_body,
                addresses: cfg.addresses,
                classifier: cfg.classifier,
                retry_after_cap: cfg.retry_after_cap,
                signer,
            }),
        })
    }

    /// Makes one delivery attempt at `now` and classifies what happened.
    ///
    /// `now` is the attempt's time: the signer signs with it and an HTTP-date Retry-After
    /// is measured from it. Never panics, never fails: a recipient URL that does not parse
    /// (enqueue validates them, so this means a bug or a tampered store) is
    /// [`Outcome::Permanent`] with an `invalid_recipient` error; a refused destination is
    /// [`Outcome::Refused`]; transport failures are classified by the
    /// [`Classifier::transport`] (transient); statuses by the configured classifier.
    pub fn deliver(&self, d: &Delivery<'_>, now: SystemTime) -> AttemptResult {
        // A literal is checked here, before anything is sent; the resolver checks it again.
        let recipient = match precheck(d.recipient, &self.shared.addresses, &self.shared.classifier)
        {
            Ok(r) => r,
            Err(result) => return result,
        };

        let mut req = self
            .agent
            .post(recipient.as_str())
            .header("Content-Type", d.content_type)
            .header("Idempotency-Key", d.unit.to_string())
            .header("User-Agent", self.shared.user_agent.as_str());
        if let Some(signer) = &self.shared.signer {
            let headers = signer.sign(&SignRequest {
                unit: d.unit,
                recipient: recipient.as_str(),
                body: d.body,
                content_type: d.content_type,
                at: now,
                attempt: d.attempt,
            });
            for (name, value) in headers {
                req = req.header(name, value);
            }
        }

        match req.send(d.body) {
            Ok(response) => self.answered(response, now),
            Err(e) => self.failed(&e),
        }
    }

    fn answered(
        &self,
        response: ureq::http::Response<ureq::Body>,
        now: SystemTime,
    ) -> AttemptResult {
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(ureq::http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                parse_retry_after(
                    v,
                    Timestamp::from_system_time(now),
                    self.shared.retry_after_cap,
                )
            });
        let outcome = self.shared.classifier.status(status, retry_after);
        let head = read_capped(response.into_body(), self.shared.max_response_body);
        answered_result(outcome, status, &head)
    }

    fn failed(&self, e: &ureq::Error) -> AttemptResult {
        let kind = match error_kind(e) {
            ErrorKind::Transport(kind) => kind,
            ErrorKind::Refused(refused) => return self.refused(&refused),
            ErrorKind::InvalidRequest => {
                // The same request would be built again on every retry.
                return AttemptResult {
                    outcome: Outcome::Permanent,
                    status: None,
                    error: Some(format!("invalid_request: {e}")),
                };
            }
        };
        // The stable code first; the client's own words after it, without repeating the code
        // when they start with it (ureq says "timeout: global").
        let code = kind.to_string();
        let detail = e.to_string();
        let detail = detail
            .strip_prefix(code.as_str())
            .and_then(|d| d.strip_prefix(": "))
            .unwrap_or(&detail);
        AttemptResult {
            outcome: self.shared.classifier.transport(kind),
            status: None,
            error: Some(format!("{code}: {detail}")),
        }
    }

    fn refused(&self, refused: &DestinationRefused) -> AttemptResult {
        refused_result(refused, &self.shared.classifier)
    }
}

/// What every client checks before sending anything: the recipient parses as an absolute
/// http(s) URL, and an IP-literal host is allowed by the address policy (resolvers never see
/// literals, so this is the check they get). `Err` carries the attempt's result.
///
/// # Errors
/// An `invalid_recipient` [`Outcome::Permanent`], or a refused destination.
pub fn precheck(
    recipient: &str,
    addresses: &AddressPolicy,
    classifier: &Classifier,
) -> Result<Recipient, AttemptResult> {
    let parsed = Recipient::parse(recipient).map_err(|e| AttemptResult {
        outcome: Outcome::Permanent,
        status: None,
        error: Some(format!("invalid_recipient: {e}")),
    })?;
    if let Some(ip) = parsed.host().ip_addr() {
        addresses
            .check(ip)
            .map_err(|refused| refused_result(&refused, classifier))?;
    }
    Ok(parsed)
}

/// The result of an attempt whose destination the SSRF guard refused.
pub fn refused_result(refused: &DestinationRefused, classifier: &Classifier) -> AttemptResult {
    AttemptResult {
        outcome: classifier.transport(TransportError::DestinationRefused),
        status: None,
        error: Some(refusal_message(refused)),
    }
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient")
            .field("user_agent", &self.shared.user_agent)
            .field("addresses", &self.shared.addresses)
            .field("signed", &self.shared.signer.is_some())
            .finish_non_exhaustive()
    }
}

/// The error of a refused destination: `destination_refused: <addr> is <class>`.
pub fn refusal_message(r: &DestinationRefused) -> String {
    format!("destination_refused: {} is {}", r.addr, r.class)
}

/// The result of an attempt the recipient answered with `status`, classified as `outcome`;
/// `head` is the start of the answer's body (at most [`ERROR_EXCERPT`] bytes are used).
/// Every HTTP client of the workspace builds its answers here, so dead letters read the
/// same whichever runtime delivered.
pub fn answered_result(outcome: Outcome, status: u16, head: &[u8]) -> AttemptResult {
    let head = head.get(..ERROR_EXCERPT).unwrap_or(head);
    let excerpt = String::from_utf8_lossy(head)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned();
    let error = if outcome.is_delivered() {
        None
    } else if excerpt.is_empty() {
        Some(format!("status {status}"))
    } else {
        Some(format!("status {status}: {excerpt}"))
    };
    AttemptResult {
        outcome,
        status: Some(status),
        error,
    }
}

/// Reads at most `cap` bytes of the body and returns the first [`ERROR_EXCERPT`] of them.
///
/// The rest is never read: dropping the reader before the end closes the connection
/// instead of returning it to the pool. A read error (a timeout, a reset mid-body) is
/// ignored: the status already says what the recipient decided.
fn read_capped(body: ureq::Body, cap: usize) -> Vec<u8> {
    let mut reader = body.into_reader();
    let mut head = Vec::new();
    let mut buf = [0u8; 8 * 1024];
    let mut left = cap;
    while left > 0 {
        let want = left.min(buf.len());
        let Some(chunk) = buf.get_mut(..want) else {
            break;
        };
        match reader.read(chunk) {
            Ok(0) => break,
            Ok(n) => {
                left = left.saturating_sub(n);
                if head.len() < ERROR_EXCERPT {
                    let room = ERROR_EXCERPT - head.len();
                    head.extend(chunk.iter().take(n.min(room)));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    drop(reader);
    head
}

/// How a ureq error is classified.
enum ErrorKind {
    Transport(TransportError),
    Refused(DestinationRefused),
    /// The request could not be built (a bad header from the caller or the signer).
    InvalidRequest,
}

fn error_kind(e: &ureq::Error) -> ErrorKind {
    use ureq::Error as E;
    match e {
        E::Other(inner) => match inner.downcast_ref::<GuardError>() {
            Some(GuardError::Refused(r)) => ErrorKind::Refused(*r),
            Some(GuardError::Resolve(_)) => ErrorKind::Transport(TransportError::Dns),
            None => ErrorKind::Transport(TransportError::Other),
        },
        E::Timeout(_) => ErrorKind::Transport(TransportError::Timeout),
        E::HostNotFound => ErrorKind::Transport(TransportError::Dns),
        E::Io(io) => ErrorKind::Transport(io_kind(io)),
        E::Tls(_) | E::Pem(_) | E::Rustls(_) | E::TlsRequired => {
            ErrorKind::Transport(TransportError::Tls)
        }
        E::Http(_) | E::BadUri(_) => ErrorKind::InvalidRequest,
        _ => ErrorKind::Transport(TransportError::Other),
    }
}

/// How an I/O error of a delivery is classified (a rustls error carried in it is `tls`).
pub fn io_kind(e: &io::Error) -> TransportError {
    use io::ErrorKind as K;
    // rustls reports handshake and record failures through the stream as I/O errors.
    if e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) {
        return TransportError::Tls;
    }
    match e.kind() {
        K::TimedOut | K::WouldBlock => TransportError::Timeout,
        K::ConnectionRefused => TransportError::ConnectionRefused,
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => {
            TransportError::ConnectionReset
        }
        _ => TransportError::Other,
    }
}

/// The resolver's own failures, carried through ureq in `Error::Other`.
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

impl std::error::Error for GuardError {}

/// ureq's system resolver, with every address the policy refuses taken out.
///
/// ureq connects only to the addresses a resolver returns, so filtering here checks the
/// addresses actually connected to. ureq also passes IP literals through the resolver,
/// which makes this a second check of them.
#[derive(Debug)]
struct GuardedResolver {
    policy: AddressPolicy,
    inner: DefaultResolver,
}

impl Resolver for GuardedResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let resolved = self
            .inner
            .resolve(uri, config, timeout)
            .map_err(|e| match e {
                ureq::Error::Io(io) => ureq::Error::Other(Box::new(GuardError::Resolve(io))),
                other => other,
            })?;
        if is_the_proxy(uri, config) {
            return Ok(resolved);
        }
        let mut allowed = self.empty();
        let mut first_refused = None;
        for addr in resolved.iter() {
            match self.policy.check(addr.ip()) {
                Ok(()) => allowed.push(*addr),
                Err(refused) => {
                    first_refused.get_or_insert(refused);
                }
            }
        }
        match first_refused {
            Some(refused) if allowed.is_empty() => {
                Err(ureq::Error::Other(Box::new(GuardError::Refused(refused))))
            }
            // The inner resolver returns at least one address or an error.
            None if allowed.is_empty() => Err(ureq::Error::HostNotFound),
            _ => Ok(allowed),
        }
    }
}

/// Whether ureq is resolving the configured proxy rather than a recipient.
///
/// With a CONNECT proxy configured (the only kind we accept) and no `NO_PROXY` list (a
/// `Proxy` built from a URL has none), ureq never resolves a recipient locally: it sends
/// the name to the proxy. So a lookup of the proxy's own URI is the proxy.
fn is_the_proxy(uri: &Uri, config: &Config) -> bool {
    config.proxy().is_some_and(|p| uri == p.uri())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_credentials_stay_out_of_debug_and_errors() {
        assert_eq!(
            redact_userinfo("http://user:pw@proxy:3128"),
            "http://***@proxy:3128"
        );
        assert_eq!(redact_userinfo("u:p@proxy:1"), "***@proxy:1");
        assert_eq!(
            redact_userinfo("http://proxy:3128/a@b"),
            "http://proxy:3128/a@b"
        );
        assert_eq!(redact_userinfo("http://proxy"), "http://proxy");
        let cfg = HttpConfig {
            proxy: Some("http://user:secret@proxy:3128".to_owned()),
            ..HttpConfig::default()
        };
        assert!(!format!("{cfg:?}").contains("secret"));
        let err = HttpError::UnsupportedProxy {
            proxy: "socks5://user:secret@proxy".to_owned(),
        };
        assert!(!err.to_string().contains("secret"));
    }
}
