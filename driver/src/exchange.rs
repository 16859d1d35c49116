//! What both HTTP clients share around the wire: one attempt's requests under the
//! double-knock ([`deliver`]), the classification of an answer or a failure
//! ([`Answers`]), the guarded resolvers' error ([`GuardError`]) and the proxy URL, parsed
//! once ([`ProxyUrl`]).
//!
//! # One request path for both clients
//!
//! A client implements [`Exchange`] (or hands [`deliver_blocking`] a function): send one [`Request`] as it is and say what happened,
//! with the answer's `Accept-Signature` when it refused. [`deliver`] is the rest, once: it
//! builds each request with the shared [`RequestPolicy`], sends it through the exchange and
//! asks the knock ([`AttemptKnock`](crate::request::AttemptKnock)) whether to send it again.
//! `deliver` is an `async fn` generic over the exchange, so one loop serves both flavours:
//!
//! - the tokio runtime's hyper-util client awaits it, its exchange a real future;
//! - the blocking ureq client calls [`deliver_blocking`] with its transmission, which does
//!   its I/O before a ready future is made of its answer; `deliver` is driven by
//!   [`futures_executor::block_on`], which polls a future whose every await is ready once,
//!   on the calling thread: no runtime, no thread, no wait.
//!
//! Whatever a client learns from the answer's head (the status, `Retry-After`,
//! `Accept-Signature`) it classifies with [`Answers::answer`], and whatever fails it
//! classifies with [`Answers::failed`], [`Answers::timed_out`] and [`Answers::refused`], so
//! a dead letter reads the same whichever client delivered it.

use core::fmt;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use http::header::RETRY_AFTER;
use http::uri::Scheme;
use http::{HeaderMap, HeaderValue, StatusCode, Uri};
use outbox_lanes_core::policy::{
    Classifier, DestinationRefused, TransportError, parse_retry_after,
};
use outbox_lanes_core::{Outcome, Timestamp};

use crate::attempt::{
    AttemptResult, BODY_EXCERPT, answered_result, refusal_message, refused_result,
};
use crate::http::{Delivery, HttpConfig, HttpError};
use crate::request::{Request, RequestPolicy};
use crate::ticket::OriginTicket;

/// What one exchange came to: the attempt's result, with the answer's `Accept-Signature`
/// (RFC 9421 §5) if it refused.
pub type Exchanged = (AttemptResult, Option<String>);

/// One HTTP client's transmission of one request: what differs between the clients.
pub trait Exchange {
    /// Sends `request` as it is, under the client's transport rules (timeout, no redirect,
    /// capped answer, guarded resolver), and classifies what happened, with the answer's
    /// `Accept-Signature` (RFC 9421 §5) if it refused. `now` is the attempt's time, for an
    /// HTTP-date `Retry-After`. Never fails and never panics.
    fn exchange(
        &self,
        request: &Request<'_>,
        now: SystemTime,
    ) -> impl Future<Output = Exchanged> + Send;
}

/// One delivery attempt of `d` at `now` through `client`: the requests `policy` builds,
/// sent again while the double-knock (OL-22) says so, the scheme learned left on `ticket`.
///
/// Never fails: a request that cannot be built is the attempt's result (nothing sent).
pub async fn deliver<E: Exchange + Sync + ?Sized>(
    client: &E,
    policy: &RequestPolicy,
    d: &Delivery<'_>,
    ticket: Option<&OriginTicket>,
    now: SystemTime,
) -> AttemptResult {
    let mut knock = policy.attempt(ticket);
    loop {
        let request = match policy.build_with(d, now, knock.spec(), knock.challenge()) {
            Ok(request) => request,
            Err(result) => return result,
        };
        let (result, challenge) = client.exchange(&request, now).await;
        if !knock.again(policy, d, &result, challenge.as_deref()) {
            return result;
        }
    }
}

/// [`deliver`] for a blocking client: `transmit` sends one request on the calling thread and
/// says what happened, as [`Exchange::exchange`] would. The loop is driven by
/// [`futures_executor::block_on`]; every future it awaits is ready when made, so nothing
/// waits but `transmit` itself.
pub fn deliver_blocking<F>(
    transmit: F,
    policy: &RequestPolicy,
    d: &Delivery<'_>,
    ticket: Option<&OriginTicket>,
    now: SystemTime,
) -> AttemptResult
where
    F: Fn(&Request<'_>, SystemTime) -> Exchanged + Sync,
{
    futures_executor::block_on(deliver(&Blocking(transmit), policy, d, ticket, now))
}

/// A blocking client's transmission as an [`Exchange`] whose future is ready when made.
struct Blocking<F>(F);

impl<F> Exchange for Blocking<F>
where
    F: Fn(&Request<'_>, SystemTime) -> Exchanged + Sync,
{
    fn exchange(
        &self,
        request: &Request<'_>,
        now: SystemTime,
    ) -> impl Future<Output = Exchanged> + Send {
        std::future::ready((self.0)(request, now))
    }
}

/// How a client's answers and failures become [`AttemptResult`]s: the part of its
/// [`HttpConfig`] both clients classify with.
#[derive(Clone, Debug)]
pub struct Answers {
    classifier: Classifier,
    retry_after_cap: Duration,
    timeout: Duration,
    max_response_body: usize,
}

impl Answers {
    /// The classification of `cfg`.
    pub fn new(cfg: &HttpConfig) -> Self {
        Answers {
            classifier: cfg.classifier.clone(),
            retry_after_cap: cfg.retry_after_cap,
            timeout: cfg.timeout,
            max_response_body: cfg.max_response_body,
        }
    }

    /// [`HttpConfig::max_response_body`]: how much of an answer's body a client reads.
    pub fn max_response_body(&self) -> usize {
        self.max_response_body
    }

    /// What the head of an answer says, before its body is read: its status classified
    /// (with its `Retry-After`, measured from `now`, the attempt's time) and its
    /// `Accept-Signature` if it refused.
    pub fn answer(&self, status: StatusCode, headers: &HeaderMap, now: SystemTime) -> Answer {
        let retry_after = headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                parse_retry_after(v, Timestamp::from_system_time(now), self.retry_after_cap)
            });
        let challenge = (!status.is_success())
            .then(|| headers.get("accept-signature"))
            .flatten()
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Answer {
            status: status.as_u16(),
            outcome: self.classifier.status(status.as_u16(), retry_after),
            challenge,
            head: Vec::new(),
        }
    }

    /// A transport failure of `kind`: `<code>: <detail>`, the client's own words without
    /// the code again when they start with it.
    pub fn failed(&self, kind: TransportError, detail: impl fmt::Display) -> AttemptResult {
        let code = kind.to_string();
        let detail = detail.to_string();
        let detail = detail
            .strip_prefix(code.as_str())
            .and_then(|d| d.strip_prefix(": "))
            .unwrap_or(&detail);
        AttemptResult {
            outcome: self.classifier.transport(kind),
            status: None,
            error: Some(format!("{code}: {detail}")),
            body: None,
        }
    }

    /// The exchange outlasted [`HttpConfig::timeout`].
    pub fn timed_out(&self) -> AttemptResult {
        self.failed(
            TransportError::Timeout,
            format_args!("no answer within {:?}", self.timeout),
        )
    }

    /// The SSRF guard refused the destination.
    pub fn refused(&self, refused: &DestinationRefused) -> AttemptResult {
        refused_result(refused, &self.classifier)
    }
}

/// An answer's head classified ([`Answers::answer`]), gathering the start of its body.
#[derive(Debug)]
pub struct Answer {
    status: u16,
    outcome: Outcome,
    challenge: Option<String>,
    head: Vec<u8>,
}

impl Answer {
    /// Keeps what the log keeps of `chunk`, the next bytes of the body (the first
    /// [`BODY_EXCERPT`] of them all).
    pub fn keep(&mut self, chunk: &[u8]) {
        let room = BODY_EXCERPT.saturating_sub(self.head.len());
        self.head.extend(chunk.iter().take(room));
    }

    /// The attempt's result, with the `Accept-Signature` of a refusal.
    pub fn finish(self) -> Exchanged {
        (
            answered_result(self.outcome, self.status, &self.head),
            self.challenge,
        )
    }
}

/// A guarded resolver's own failure, carried through the client's error to its
/// classification ([`GuardError::classified`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum GuardError {
    /// Every address the name resolved to was refused by the policy (the first one here).
    Refused(DestinationRefused),
    /// The lookup itself failed.
    Resolve(io::Error),
}

impl GuardError {
    /// The refusal, or the transport error the failure is.
    ///
    /// # Errors
    /// The refused destination, for [`Answers::refused`].
    pub fn classified(&self) -> Result<TransportError, DestinationRefused> {
        match self {
            GuardError::Refused(r) => Err(*r),
            GuardError::Resolve(_) => Ok(TransportError::Dns),
        }
    }
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

/// [`HttpConfig::proxy`], parsed once by [`http::Uri`]: an HTTP(S) CONNECT proxy, where it
/// is and its credentials. Both clients connect through it as this says.
#[derive(Clone)]
pub struct ProxyUrl {
    uri: Uri,
    host: Arc<str>,
    port: u16,
    https: bool,
    credentials: Option<(String, String)>,
}

impl ProxyUrl {
    /// Parses `proxy`: `http://` or `https://` (a URL without a scheme is `http://`), a host,
    /// an optional port (80 or 443 by default) and optional `user:pass@` credentials,
    /// percent-decoded.
    ///
    /// # Errors
    /// [`HttpError::UnsupportedProxy`] for another scheme (SOCKS), [`HttpError::BadProxy`]
    /// for what is not a proxy URL.
    pub fn parse(proxy: &str) -> Result<Self, HttpError> {
        let bad = || HttpError::BadProxy {
            proxy: proxy.to_owned(),
        };
        let text = if proxy.contains("://") {
            proxy.to_owned()
        } else {
            format!("http://{proxy}")
        };
        let uri: Uri = text.parse().map_err(|_| bad())?;
        let https = match uri.scheme() {
            Some(s) if *s == Scheme::HTTP => false,
            Some(s) if *s == Scheme::HTTPS => true,
            _ => {
                return Err(HttpError::UnsupportedProxy {
                    proxy: proxy.to_owned(),
                });
            }
        };
        let authority = uri.authority().ok_or_else(bad)?;
        let host = authority.host();
        if host.is_empty() {
            return Err(bad());
        }
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let credentials = match authority.as_str().rsplit_once('@') {
            None => None,
            Some((userinfo, _)) => {
                let (user, pass) = userinfo.split_once(':').unwrap_or((userinfo, ""));
                let decode = |s: &str| {
                    percent_encoding::percent_decode_str(s)
                        .decode_utf8()
                        .map(|s| s.into_owned())
                        .map_err(|_| bad())
                };
                Some((decode(user)?, decode(pass)?))
            }
        };
        let scheme = if https { "https" } else { "http" };
        let bare: Uri = format!("{scheme}://{host}:{port}")
            .parse()
            .map_err(|_| bad())?;
        Ok(ProxyUrl {
            uri: bare,
            host: host.trim_matches(['[', ']']).into(),
            port,
            https,
            credentials,
        })
    }

    /// `scheme://host:port`, without the credentials.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// The host, IPv6 without brackets: exempt from the address policy.
    pub fn host(&self) -> &Arc<str> {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the proxy is spoken to over TLS (`https://`).
    pub fn is_https(&self) -> bool {
        self.https
    }

    /// The user and password, percent-decoded (an empty password when none was given).
    pub fn credentials(&self) -> Option<(&str, &str)> {
        self.credentials
            .as_ref()
            .map(|(u, p)| (u.as_str(), p.as_str()))
    }

    /// The credentials as a `Proxy-Authorization: Basic` value (marked sensitive).
    ///
    /// # Errors
    /// [`HttpError::BadProxy`] naming `proxy` (the configured text) when they make no header
    /// value.
    pub fn basic_auth(&self, proxy: &str) -> Result<Option<HeaderValue>, HttpError> {
        let Some((user, pass)) = self.credentials() else {
            return Ok(None);
        };
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        let mut value =
            HeaderValue::try_from(format!("Basic {token}")).map_err(|_| HttpError::BadProxy {
                proxy: proxy.to_owned(),
            })?;
        value.set_sensitive(true);
        Ok(Some(value))
    }
}

impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyUrl")
            .field("uri", &self.uri)
            .field("credentials", &self.credentials.is_some())
            .finish()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_url_is_parsed_once_into_its_parts() {
        let p = ProxyUrl::parse("http://al%40ice:s%3Acret@127.0.0.1:3128").unwrap();
        assert_eq!(p.uri().to_string(), "http://127.0.0.1:3128/");
        assert_eq!(&**p.host(), "127.0.0.1");
        assert_eq!(p.port(), 3128);
        assert!(!p.is_https());
        assert_eq!(p.credentials(), Some(("al@ice", "s:cret")));
        let auth = p.basic_auth("x").unwrap().unwrap();
        assert!(auth.is_sensitive());

        let p = ProxyUrl::parse("HTTPS://[::1]").unwrap();
        assert!(p.is_https());
        assert_eq!((&**p.host(), p.port()), ("::1", 443));
        assert_eq!(p.credentials(), None);
        assert_eq!(ProxyUrl::parse("proxy:8080").unwrap().port(), 8080);
    }

    #[test]
    fn a_proxy_url_that_is_no_connect_proxy_is_refused_by_name() {
        assert!(matches!(
            ProxyUrl::parse("socks5://user:secret@127.0.0.1:1080"),
            Err(HttpError::UnsupportedProxy { .. })
        ));
        for bad in ["http://[::1", "http://", "http://al%FFice@host:1"] {
            assert!(
                matches!(ProxyUrl::parse(bad), Err(HttpError::BadProxy { .. })),
                "{bad}"
            );
        }
    }
}
