//! The delivery policy every HTTP client of the workspace shares (design.md §5): the
//! configuration, one attempt ([`Delivery`]), the clients' construction errors and the
//! outbox's address handle. An attempt's result and its constructors are
//! `attempt.rs`'s (re-exported here: [`AttemptResult`]), the request itself (URL, headers, body,
//! signature) is built in [`crate::request`], and the loop and classification around the
//! wire are [`crate::exchange`]'s.
//!
//! The clients themselves live beside it: `ureq_client::HttpClient` (blocking,
//! feature `ureq`) and the tokio runtime's hyper-util client. Both build every request and every
//! result through these modules, so they send the same request and dead letters read the same
//! whichever runtime delivered.

use core::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use outbox_lanes_core::UnitId;
use outbox_lanes_core::policy::{AddressPolicy, Classifier, DEFAULT_RETRY_AFTER_CAP};

pub use crate::attempt::{
    AttemptResult, BODY_EXCERPT, ERROR_EXCERPT, answered_result, invalid_recipient,
    invalid_request, io_kind, is_refusal, not_sent, refusal_message, refused_result,
};
pub use crate::destination::Destination;
pub use crate::request::{Request, RequestPolicy};
/// The shared bytes of a request's body ([`Delivery::body`]): cloning them copies nothing.
pub use bytes::Bytes;
pub use outbox_lanes_core::host::SignatureMode;

/// The default [`HttpConfig::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The default [`HttpConfig::max_response_body`]: 64 KiB.
pub const DEFAULT_MAX_RESPONSE_BODY: usize = 64 * 1024;
/// How the HTTP clients deliver.
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
    /// Which destination addresses this process may connect to. Default: public addresses
    /// only. Deliveries allow what it or the outbox's stored policy allows
    /// ([`HttpConfig::outbox_addresses`]), and an outbox opened with it widens the stored
    /// policy to allow it too (OL-24).
    pub addresses: AddressPolicy,
    /// The outbox's destination policy (OL-24) as this process last read it: set by the
    /// outbox when it opens and at the start of each pass, shared by clones of this
    /// `HttpConfig` and the HTTP clients built from them, which check every address they
    /// connect to against [`HttpConfig::allowed`]. Leave it at its default: a client built
    /// without an outbox allows [`HttpConfig::addresses`] alone.
    pub outbox_addresses: OutboxAddresses,
    /// An HTTP(S) CONNECT proxy (`http://host:port`, `https://host:port`, optionally with
    /// `user:pass@`, percent-encoded; `host:port` alone is `http://`), parsed once for both
    /// clients ([`ProxyUrl`](crate::exchange::ProxyUrl)). Default `None`: no proxy, **whatever the environment says** —
    /// `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` are ignored. The SSRF guard cannot see through
    /// a proxy (see the blocking client's docs).
    pub proxy: Option<String>,
    /// How statuses are classified. Default: the core's default policy.
    pub classifier: Classifier,
    /// Cap on a `Retry-After`. Default 1 h (OL-6).
    pub retry_after_cap: Duration,
    /// Which HTTP signature scheme a signer of HTTP Signatures signs with. Default
    /// [`SignatureMode::Auto`]: the double-knock ([`crate::origins`]).
    pub signature: SignatureMode,
    /// Whether a 5xx answer to an RFC 9421 request also makes the double-knock send it again
    /// with draft-cavage. Off by default: a 5xx says the server failed, not that it refused
    /// the signature, and re-sending on it would double the requests to every failing server;
    /// turn it on for servers known to answer a signature they do not understand with a 500.
    pub signature_fallback_on_5xx: bool,
    /// Bound on connecting (name resolution, TCP and TLS handshakes), within
    /// [`HttpConfig::timeout`]: a host that does not accept the connection in time fails as
    /// `connect_timeout`, which counts toward its origin's health. Default 10 s.
    pub connect_timeout: Duration,
}

/// The default [`HttpConfig::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            timeout: DEFAULT_TIMEOUT,
            user_agent: concat!("outbox-lanes/", env!("CARGO_PKG_VERSION")).to_owned(),
            max_response_body: DEFAULT_MAX_RESPONSE_BODY,
            addresses: AddressPolicy::public_only(),
            outbox_addresses: OutboxAddresses::default(),
            proxy: None,
            classifier: Classifier::default(),
            retry_after_cap: DEFAULT_RETRY_AFTER_CAP,
            signature: SignatureMode::Auto,
            signature_fallback_on_5xx: false,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
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
            .field("outbox_addresses", &self.outbox_addresses)
            .field("proxy", &self.proxy.as_deref().map(redact_userinfo))
            .field("classifier", &self.classifier)
            .field("retry_after_cap", &self.retry_after_cap)
            .field("signature", &self.signature)
            .field("signature_fallback_on_5xx", &self.signature_fallback_on_5xx)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl HttpConfig {
    /// The destinations a delivery may reach now: what [`HttpConfig::addresses`] or the
    /// outbox's stored policy ([`HttpConfig::outbox_addresses`]) allows.
    pub fn allowed(&self) -> AddressPolicy {
        self.outbox_addresses.allowing(self.addresses)
    }
}

/// The outbox's stored destination policy as a process last read it (OL-24): a handle the
/// outbox sets and its passes and HTTP clients read (one atomic load), so that a widening
/// by another process on the database reaches the clients' checks of the addresses they
/// connect to at this process's next pass.
///
/// Clones share it: the clients an outbox builds from its [`HttpConfig`] see what the outbox
/// sets. A cloned `OutboxConfig` gets a handle of its own
/// ([`OutboxAddresses::detached`]), so two outboxes opened from one configuration on two
/// databases never share one.
#[derive(Clone, Default)]
pub struct OutboxAddresses(Arc<Handle>);

#[derive(Default)]
struct Handle {
    bits: AtomicU8,
    /// How many times a `set` took away a class: a client that keeps connections opened under
    /// the wider policy starts a new pool when it moved ([`OutboxAddresses::narrowings`]).
    narrowings: AtomicU64,
}

const LOOPBACK: u8 = 1;
const PRIVATE: u8 = 2;
const LINK_LOCAL: u8 = 4;

fn bits_of(p: AddressPolicy) -> u8 {
    let bit = |on: bool, bit: u8| if on { bit } else { 0 };
    bit(p.allow_loopback, LOOPBACK)
        | bit(p.allow_private, PRIVATE)
        | bit(p.allow_link_local, LINK_LOCAL)
}

impl OutboxAddresses {
    /// The policy last set (public only until an outbox sets it).
    pub fn get(&self) -> AddressPolicy {
        let bits = self.0.bits.load(Ordering::Relaxed);
        AddressPolicy {
            allow_loopback: bits & LOOPBACK != 0,
            allow_private: bits & PRIVATE != 0,
            allow_link_local: bits & LINK_LOCAL != 0,
        }
    }

    /// Sets the policy every holder of the handle reads from now on.
    pub fn set(&self, p: AddressPolicy) {
        let bits = bits_of(p);
        let before = self.0.bits.swap(bits, Ordering::Relaxed);
        if before & !bits != 0 {
            self.0.narrowings.fetch_add(1, Ordering::Release);
        }
    }

    /// How many times [`OutboxAddresses::set`] narrowed the policy: a client whose pooled
    /// connections were opened before the last narrowing must not reuse them (one was
    /// allowed when it was opened, and may not be now).
    pub fn narrowings(&self) -> u64 {
        self.0.narrowings.load(Ordering::Acquire)
    }

    /// What `own` or this policy allows.
    pub fn allowing(&self, own: AddressPolicy) -> AddressPolicy {
        outbox_lanes_store::widest(own, self.get())
    }

    /// A handle of its own with the same policy, shared with nothing.
    pub fn detached(&self) -> OutboxAddresses {
        let h = OutboxAddresses::default();
        h.set(self.get());
        h
    }
}

impl fmt::Debug for OutboxAddresses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&outbox_lanes_store::policy_name(self.get()))
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

/// One attempt to deliver one unit to one recipient, before it is a [`Request`]: what a
/// [`Job`](crate::Job) hands its client ([`Job::delivery`](crate::Job::delivery)). The
/// client's [`RequestPolicy`] turns it into the request it sends.
///
/// [`Request`]: crate::request::Request
/// [`RequestPolicy`]: crate::request::RequestPolicy
#[derive(Clone, Copy, Debug)]
pub struct Delivery<'a> {
    /// The canonical id of the actor whose unit this is, passed to the signer (which picks
    /// the actor's key by it).
    pub actor: &'a str,
    /// The store's outbox id ([`DriverStore::outbox_id`](outbox_lanes_store::DriverStore::outbox_id)).
    pub outbox: &'a str,
    /// The unit. The request's `Idempotency-Key` is `<outbox>-<unit>` ([`idempotency_key`]).
    pub unit: UnitId,
    /// The recipient URL, parsed once for its lane (a pass shares one [`Destination`] among
    /// every attempt to the lane).
    pub recipient: &'a Destination,
    /// The request body, shared with the row's payload (cloning it copies no bytes).
    pub body: &'a Bytes,
    /// The request's `Content-Type`.
    pub content_type: &'a str,
    /// The row's own headers ([`Payload::headers`](outbox_lanes_store::Payload::headers)),
    /// checked again and sent after the client's own; usually empty.
    pub headers: &'a [(String, String)],
    /// The attempt number, passed to the signer.
    pub attempt: u32,
}

/// A unit's idempotency key: `<outbox id>-<unit id>`, e.g.
/// `3f1c0b5e9a7d4c2e8b6a1d0f9e8c7b6a-42`. Unique across outboxes (the outbox id is random,
/// made with the schema) and stable for the unit: every attempt, retry, pass, restart and
/// replay of a dead letter sends the same one. Sent as `Idempotency-Key` and, by the
/// Standard Webhooks signer, as `webhook-id`.
pub fn idempotency_key(outbox: &str, unit: UnitId) -> String {
    format!("{outbox}-{}", unit.0)
}

/// Why an HTTP client could not be built.
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

/// The result of an attempt whose request the signer could not sign: [`not_sent`] (a
/// local configuration fault, never the recipient's), logged at `warn` with the actor, unit
/// and recipient.
pub fn unsigned(d: &Delivery<'_>, e: &crate::sign::SignError) -> AttemptResult {
    tracing::warn!(actor = d.actor, unit = %d.unit, recipient = d.recipient.as_str(), error = %e,
        "request not sent: it could not be signed");
    not_sent(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outbox_policy_handle_is_shared_by_clones_and_counts_narrowings() {
        let h = OutboxAddresses::default();
        assert_eq!(h.get(), AddressPolicy::public_only());
        let clone = h.clone();
        let wide = AddressPolicy {
            allow_loopback: true,
            allow_private: true,
            allow_link_local: true,
        };
        clone.set(wide);
        assert_eq!(h.get(), wide, "one handle");
        assert_eq!(h.narrowings(), 0, "a widening is no narrowing");
        h.set(wide);
        assert_eq!(h.narrowings(), 0, "nor is setting what is set");
        h.set(AddressPolicy::allow_loopback_only());
        assert_eq!(clone.narrowings(), 1);
        let own = h.detached();
        own.set(AddressPolicy::public_only());
        assert_eq!(h.get(), AddressPolicy::allow_loopback_only(), "detached");
        assert_eq!((h.narrowings(), own.narrowings()), (1, 1));
        let private = AddressPolicy {
            allow_private: true,
            ..AddressPolicy::public_only()
        };
        assert_eq!(
            h.allowing(private),
            AddressPolicy {
                allow_loopback: true,
                allow_private: true,
                allow_link_local: false,
            }
        );
        let cfg = HttpConfig {
            addresses: private,
            ..HttpConfig::default()
        };
        cfg.outbox_addresses
            .set(AddressPolicy::allow_loopback_only());
        assert_eq!(cfg.allowed(), h.allowing(private));
    }

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
