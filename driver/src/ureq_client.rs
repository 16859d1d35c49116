//! The blocking HTTP client (feature `ureq`): one POST per attempt over ureq, classified
//! into an [`Outcome`] with the shared policy of [`crate::http`].
//!
//! The attempt's requests (the double-knock) are [`crate::exchange::deliver`]'s, driven on
//! the calling thread through [`crate::exchange::deliver_blocking`].
//!
//! [`HttpClient::deliver`] never fails and never panics on input: whatever happens (a
//! status, a timeout, a reset, a refused destination) becomes an [`AttemptResult`] whose
//! [`Outcome`] the scheduler consumes. What it does (design.md §5, OL-4, OL-6, OL-9):
//!
//! - sends the request built by [`crate::request`] as it is: the method, the URL parsed once
//!   for the lane, every header (`User-Agent`, `Accept`, `Idempotency-Key`, `Content-Type`,
//!   the row's own after checking them again, the [`Signer`]'s, signed on every attempt with
//!   that attempt's time) and the body; ureq adds only `Host` and `Content-Length`;
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
//! - an IP-literal host is checked when the request is built, before anything is sent
//!   ([`RequestPolicy::build`]);
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
//! process-wide default), with the webpki root certificates. The tokio runtime uses hyper-util
//! with rustls and `ring` too, so the process carries one TLS implementation and one crypto
//! provider.
//!
//! [`Outcome`]: outbox_lanes_core::Outcome
//! [`Outcome::Refused`]: outbox_lanes_core::Outcome::Refused

use core::fmt;
use std::io::{self, Read as _};
use std::sync::Arc;
use std::time::SystemTime;

use outbox_lanes_core::policy::{AddressPolicy, DestinationRefused, TransportError};
use ureq::config::{AutoHeaderValue, Config};
use ureq::http::Uri;
use ureq::tls::TlsConfig;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};
use ureq::{Agent, Proxy, ProxyProtocol};

use crate::exchange::{self, Answer, Answers, Exchanged, GuardError, ProxyUrl};
use crate::http::{
    AttemptResult, Delivery, HttpConfig, HttpError, OutboxAddresses, invalid_request, io_kind,
};
use crate::job::Job;
use crate::request::{Request, RequestPolicy};
use crate::sign::Signer;
use crate::ticket::OriginTicket;

/// Idle connections kept per host. ureq's default (3) is below the delivery concurrency a
/// relay runs with; many workers delivering to one host (several actors' lanes, or a
/// benchmark's loopback recipients) would then open a connection per request and fill the
/// machine with TIME_WAIT sockets.
const IDLE_PER_HOST: usize = 64;
/// Idle connections kept in all (ureq's default is 10, for the same reason).
const IDLE_TOTAL: usize = 512;

/// A blocking HTTP client for deliveries: one ureq agent (and its connection pool), shared
/// by every clone and usable from many threads at once.
#[derive(Clone)]
pub struct HttpClient {
    agent: Agent,
    shared: Arc<Shared>,
}

/// What `deliver` needs besides the agent.
struct Shared {
    requests: RequestPolicy,
    answers: Answers,
}

impl HttpClient {
    /// Builds a client.
    ///
    /// # Errors
    /// [`HttpError`] when the proxy or the User-Agent is invalid.
    pub fn new(cfg: HttpConfig, signer: Option<Arc<dyn Signer>>) -> Result<Self, HttpError> {
        let requests = RequestPolicy::new(&cfg, signer)?;
        let proxy = match &cfg.proxy {
            None => None,
            // SOCKS needs a ureq feature we do not enable (one would fail every attempt),
            // and SOCKS4/5 resolve the target locally, which the guard would then filter:
            // only CONNECT proxies have one clear meaning here, and ProxyUrl admits no other.
            Some(p) => Some(ureq_proxy(&ProxyUrl::parse(p)?, p)?),
        };
        // ring's provider, as the tokio client's (deprecated by rustls 0.23.48 for lacking the
        // post-quantum key exchange; see runtime-tokio/src/http.rs for why it stays).
        #[allow(deprecated)]
        let provider = rustls::crypto::ring::default_provider();
        let tls = TlsConfig::builder()
            .unversioned_rustls_crypto_provider(Arc::new(provider))
            .build();
        let config = Config::builder()
            .http_status_as_error(false)
            .max_redirects(0)
            // Set explicitly: ureq's default is `Proxy::try_from_env()`, which would route
            // deliveries through whatever proxy the environment names, past the guard.
            .proxy(proxy)
            .timeout_global(Some(cfg.timeout))
            .timeout_connect(Some(cfg.connect_timeout.min(cfg.timeout)))
            .max_idle_connections(IDLE_TOTAL)
            .max_idle_connections_per_host(IDLE_PER_HOST)
            // Every header comes with the request (crate::request): ureq adds none of its own
            // beside the framing.
            .user_agent(AutoHeaderValue::None)
            .accept(AutoHeaderValue::None)
            .accept_encoding(AutoHeaderValue::None)
            .tls_config(tls)
            .build();
        let resolver = GuardedResolver {
            policy: cfg.addresses,
            outbox: cfg.outbox_addresses.clone(),
            inner: DefaultResolver::default(),
        };
        let agent = Agent::with_parts(config, DefaultConnector::new(), resolver);
        Ok(HttpClient {
            agent,
            shared: Arc::new(Shared {
                requests,
                answers: Answers::new(&cfg),
            }),
        })
    }

    /// Makes one delivery attempt at `now` and classifies what happened.
    ///
    /// `now` is the attempt's time: the signer signs with it and an HTTP-date Retry-After
    /// is measured from it. The request is built by the shared
    /// [`RequestPolicy::build`] (which may refuse to send anything: an `invalid_recipient`,
    /// an `invalid_request` such as a refused row header, a refused IP literal, a request the
    /// signer could not sign) and then [sent](HttpClient::send). Never panics, never fails:
    /// transport failures are classified by the
    /// [`Classifier::transport`](outbox_lanes_core::policy::Classifier::transport) (transient),
    /// statuses by the configured classifier.
    pub fn deliver(&self, d: &Delivery<'_>, now: SystemTime) -> AttemptResult {
        self.deliver_under(d, None, now)
    }

    /// [`HttpClient::deliver`] of a job: its origin's ticket ([`Job::origin`]) chooses the
    /// signature scheme and learns the one accepted (the double-knock, [`crate::origins`]).
    pub fn deliver_job(&self, job: &Job, now: SystemTime) -> AttemptResult {
        self.deliver_under(&job.delivery(), job.origin(), now)
    }

    /// The one double-knock loop ([`exchange::deliver`]), driven on this thread over
    /// [`HttpClient::transmit`].
    fn deliver_under(
        &self,
        d: &Delivery<'_>,
        ticket: Option<&OriginTicket>,
        now: SystemTime,
    ) -> AttemptResult {
        let transmit = |request: &Request<'_>, now| self.transmit(request, now);
        exchange::deliver_blocking(transmit, &self.shared.requests, d, ticket, now)
    }

    /// Sends `request` as it is — ureq adds only `Host` and `Content-Length` — under the
    /// client's transport rules (timeout, no redirect, capped answer, guarded resolver), and
    /// classifies what happened. `now` is the attempt's time, for an HTTP-date Retry-After.
    pub fn send(&self, request: &Request<'_>, now: SystemTime) -> AttemptResult {
        self.transmit(request, now).0
    }

    /// [`HttpClient::send`], with the answer's `Accept-Signature` (RFC 9421 §5) if it
    /// refused.
    fn transmit(&self, request: &Request<'_>, now: SystemTime) -> Exchanged {
        let mut builder = ureq::http::Request::builder()
            .method(request.method.clone())
            .uri(request.url.as_str());
        for (name, value) in &request.headers {
            builder = builder.header(name, value);
        }
        let req = match builder.body(&request.body[..]) {
            Ok(req) => req,
            Err(e) => return (invalid_request(e), None),
        };
        match self.agent.run(req) {
            Ok(response) => {
                let answers = &self.shared.answers;
                let mut answer = answers.answer(response.status(), response.headers(), now);
                read_capped(
                    response.into_body(),
                    answers.max_response_body(),
                    &mut answer,
                );
                answer.finish()
            }
            Err(e) => (self.failed(&e), None),
        }
    }

    fn failed(&self, e: &ureq::Error) -> AttemptResult {
        let answers = &self.shared.answers;
        match error_kind(e) {
            // One error, one name: the async client's words, not ureq's "timeout: global".
            ErrorKind::Transport(TransportError::Timeout) => answers.timed_out(),
            ErrorKind::Transport(kind) => answers.failed(kind, e),
            ErrorKind::Refused(refused) => answers.refused(&refused),
            // The same request would be built again on every retry.
            ErrorKind::InvalidRequest => invalid_request(e),
        }
    }
}

/// `proxy` (configured as `text`) as ureq's.
fn ureq_proxy(proxy: &ProxyUrl, text: &str) -> Result<Proxy, HttpError> {
    let protocol = if proxy.is_https() {
        ProxyProtocol::Https
    } else {
        ProxyProtocol::Http
    };
    let mut builder = Proxy::builder(protocol)
        .host(proxy.uri().host().unwrap_or_default())
        .port(proxy.port());
    if let Some((user, pass)) = proxy.credentials() {
        builder = builder.username(user).password(pass);
    }
    builder.build().map_err(|_| HttpError::BadProxy {
        proxy: text.to_owned(),
    })
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient")
            .field("requests", &self.shared.requests)
            .finish_non_exhaustive()
    }
}

/// Reads at most `cap` bytes of the body into `answer`, which keeps their start for the
/// delivery log and the error.
///
/// The rest is never read: dropping the reader before the end closes the connection
/// instead of returning it to the pool. A read error (a timeout, a reset mid-body) is
/// ignored: the status already says what the recipient decided.
fn read_capped(body: ureq::Body, cap: usize, answer: &mut Answer) {
    let mut reader = body.into_reader();
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
                answer.keep(chunk.get(..n).unwrap_or_default());
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    drop(reader);
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
        E::Other(inner) => match inner
            .downcast_ref::<GuardError>()
            .map(GuardError::classified)
        {
            Some(Err(r)) => ErrorKind::Refused(r),
            Some(Ok(kind)) => ErrorKind::Transport(kind),
            None => ErrorKind::Transport(TransportError::Other),
        },
        E::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve) => {
            ErrorKind::Transport(TransportError::ConnectTimeout)
        }
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

/// ureq's system resolver, with every address the policy refuses taken out.
///
/// ureq connects only to the addresses a resolver returns, so filtering here checks the
/// addresses actually connected to. ureq also passes IP literals through the resolver,
/// which makes this a second check of them.
#[derive(Debug)]
struct GuardedResolver {
    policy: AddressPolicy,
    /// The outbox's stored policy, allowed too (OL-24): read at each lookup.
    outbox: OutboxAddresses,
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
        match self
            .outbox
            .allowing(self.policy)
            .admit(resolved.iter().copied(), |a| allowed.push(a))
        {
            Ok(()) => Ok(allowed),
            Err(Some(refused)) => Err(ureq::Error::Other(Box::new(GuardError::Refused(refused)))),
            // The inner resolver returns at least one address or an error.
            Err(None) => Err(ureq::Error::HostNotFound),
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
