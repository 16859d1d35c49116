//! The one description of a delivery request, built in one place for every HTTP client.
//!
//! A pass parses each lane's recipient URL once, into a [`Destination`] that every attempt to
//! the lane shares (its [`Job`](crate::Job)s carry it; the per-host caps key on it too). Right
//! before sending, a client asks its [`RequestPolicy`] for the attempt's [`Request`]: the
//! method, the parsed URL, the final header list and the body. The clients (ureq in
//! `ureq_client`, hyper-util in the tokio runtime) only transmit it, under their transport rules:
//! the timeout, no redirects, the cap on the answer's body, and the SSRF guard's check of the
//! addresses a name resolves to. No client sets a header of its own, so both send the same
//! headers, in the same order, for the same attempt.
//!
//! # The headers, in order
//!
//! 1. `User-Agent`: [`HttpConfig::user_agent`];
//! 2. `Accept: */*`, unless the row sets its own `Accept`;
//! 3. `Idempotency-Key`: [`idempotency_key`], `<outbox id>-<unit id>`;
//! 4. `Content-Type`: the row's content type;
//! 5. the row's own headers ([`Payload::headers`](outbox_lanes_store::Payload::headers)), in
//!    the row's order, once they pass the check below;
//! 6. the [`Signer`]'s (`webhook-*`; or `Content-Digest`, `Signature-Input`, `Signature`
//!    for RFC 9421; or `Date`, `Digest`, `Signature` for draft-cavage): the signer is called on
//!    every attempt, here, with the attempt's time, the actor, the unit, the parsed URL and the
//!    signature scheme, so a retry never carries a stale `Date` or timestamp.
//!
//! The transports add only the framing: `Host` (from the URL) and `Content-Length`.
//!
//! # A row's headers are checked again on every attempt
//!
//! Enqueue refuses bad headers, but a row written with plain SQL (store/SCHEMA.md) never went
//! through enqueue. So the same check ([`validate_headers`]) runs again before anything is
//! sent. A header it refuses — a reserved one (`Host`, `Content-Length`, `Transfer-Encoding`,
//! `Connection`, `Keep-Alive`, `Upgrade`, `TE`, `Trailer(s)`, `Proxy-*`, `Expect`, a second
//! `Idempotency-Key` or `Content-Type`, `User-Agent`, the signer's `Date`, `Digest`,
//! `Content-Digest`, `Signature`, `Signature-Input`, `webhook-*`: refused whether or not a
//! signer is configured, as at enqueue), a
//! name that is not an HTTP token, a value that is not a header value, a repeated name, more
//! than [`MAX_HEADERS`](outbox_lanes_store::MAX_HEADERS) headers or
//! [`MAX_HEADER_BYTES`](outbox_lanes_store::MAX_HEADER_BYTES) — fails the attempt **without
//! sending anything**, as
//! [`Outcome::Permanent`](outbox_lanes_core::Outcome::Permanent) with the error
//! `invalid_request: refused stored header "Host": reserved (the HTTP client sets it itself)`.
//! The attempt is recorded and counts, and the unit is dead-lettered as `permanent` at once (a
//! strict lane blocks on it instead): every retry would build the same request. The header is
//! refused rather than dropped, because the rest of the request is not what the enqueuer
//! described without it. Replaying such a dead letter fails the same way; purge it and enqueue
//! the row again without the header.

use core::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::Method;
use http::header::{ACCEPT, CONTENT_TYPE, HeaderName, HeaderValue, USER_AGENT};
use outbox_lanes_core::policy::{AddressPolicy, Classifier, Recipient};
use outbox_lanes_store::validate_headers;

use crate::attempt::{AttemptResult, invalid_request};
/// The lane's parsed URL, re-exported where it always was.
pub use crate::destination::Destination;
use crate::http::{Delivery, HttpConfig, HttpError, OutboxAddresses, idempotency_key, unsigned};
use crate::sign::{SignRequest, SignatureSpec, Signer};
use crate::ticket::OriginTicket;
use outbox_lanes_core::host::{Challenge, Knock, KnockPlan, KnockStep, SignatureMode, Signing};

/// The `Idempotency-Key` header's name.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// One attempt's request, as it goes on the wire: see the [module documentation](self).
#[derive(Clone)]
pub struct Request<'a> {
    /// The method: `POST`.
    pub method: Method,
    /// The recipient URL, parsed once for the lane.
    pub url: &'a Recipient,
    /// Every header, in the order sent; the transport adds only `Host` and `Content-Length`.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body: the row's bytes, shared with the payload, never copied.
    pub body: Bytes,
}

impl fmt::Debug for Request<'_> {
    /// The header names without their values, which may hold credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("url", &self.url.as_str())
            .field(
                "headers",
                &self
                    .headers
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("body_len", &self.body.len())
            .finish()
    }
}

/// One attempt's requests under the double-knock (OL-22, [`outbox_lanes_core::host::knock`]):
/// both HTTP clients run the same loop, [`crate::exchange::deliver`] — build the request with [`AttemptKnock::spec`] and
/// [`AttemptKnock::challenge`], send it, and send again while [`AttemptKnock::again`] says so.
/// When the attempt is over, what the knock taught is left on the origin's ticket for the
/// host book.
#[derive(Debug)]
pub struct AttemptKnock<'t> {
    ticket: Option<&'t OriginTicket>,
    knock: Knock,
    challenge: Option<String>,
}

impl AttemptKnock<'_> {
    /// The scheme of the next request.
    pub fn spec(&self) -> SignatureSpec {
        self.knock.spec()
    }

    /// The `Accept-Signature` the next request answers, if any.
    pub fn challenge(&self) -> Option<&str> {
        self.challenge.as_deref()
    }

    /// The answer to the last request of `d` (`accept_signature`: its `Accept-Signature`, if
    /// it refused): whether to send it again, with [`AttemptKnock::spec`] and
    /// [`AttemptKnock::challenge`] changed. A challenge `policy`'s signer cannot honour is
    /// ignored.
    pub fn again(
        &mut self,
        policy: &RequestPolicy,
        d: &Delivery<'_>,
        result: &AttemptResult,
        accept_signature: Option<&str>,
    ) -> bool {
        let challenge = match (accept_signature, &policy.signer) {
            (None, _) => Challenge::None,
            (Some(c), Some(s)) if s.honours_challenge(d.actor, c, d.body.len()) => {
                Challenge::Usable
            }
            (Some(_), _) => Challenge::Unusable,
        };
        match self.knock.answered(result.status, challenge) {
            KnockStep::Again { spec, challenge } => {
                tracing::debug!(
                    status = result.status,
                    spec = spec.as_str(),
                    challenge,
                    "signature refused; sending the attempt again"
                );
                self.challenge = accept_signature.filter(|_| challenge).map(str::to_owned);
                true
            }
            KnockStep::Done => {
                if let Some(t) = self.ticket {
                    t.knocked(self.knock.report());
                }
                false
            }
        }
    }
}

/// What turns an attempt into its [`Request`]: the configured `User-Agent`, the signer and
/// the checks made before anything is sent. Every HTTP client holds one, built from its
/// [`HttpConfig`].
#[derive(Clone)]
pub struct RequestPolicy {
    user_agent: HeaderValue,
    signer: Option<Arc<dyn Signer>>,
    addresses: AddressPolicy,
    /// The outbox's stored policy, allowed too (OL-24).
    outbox_addresses: OutboxAddresses,
    classifier: Classifier,
    signature: SignatureMode,
    fallback_on_5xx: bool,
}

impl fmt::Debug for RequestPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestPolicy")
            .field("user_agent", &self.user_agent)
            .field("signed", &self.signer.is_some())
            .field("addresses", &self.addresses)
            .finish_non_exhaustive()
    }
}

impl RequestPolicy {
    /// The policy of `cfg`, signing with `signer` if given.
    ///
    /// # Errors
    /// [`HttpError::BadUserAgent`] when the User-Agent is not a header value.
    pub fn new(cfg: &HttpConfig, signer: Option<Arc<dyn Signer>>) -> Result<Self, HttpError> {
        let user_agent =
            HeaderValue::from_str(&cfg.user_agent).map_err(|_| HttpError::BadUserAgent)?;
        Ok(RequestPolicy {
            user_agent,
            signer,
            addresses: cfg.addresses,
            outbox_addresses: cfg.outbox_addresses.clone(),
            classifier: cfg.classifier.clone(),
            signature: cfg.signature,
            fallback_on_5xx: cfg.signature_fallback_on_5xx,
        })
    }

    /// The double-knock of one attempt (OL-22): the scheme each of its requests is signed
    /// with and whether a refusal is sent again — under the plan its origin's `ticket` carries
    /// (the host book's, from what the host accepted), or without one as for a host nothing is
    /// known about.
    pub fn attempt<'t>(&self, ticket: Option<&'t OriginTicket>) -> AttemptKnock<'t> {
        let plan = ticket.map_or_else(
            || KnockPlan::unknown(self.signing(), self.fallback_on_5xx),
            OriginTicket::plan,
        );
        AttemptKnock {
            ticket,
            knock: Knock::new(plan),
            challenge: None,
        }
    }

    /// What signs this policy's requests, as far as the double-knock is concerned.
    pub fn signing(&self) -> Signing {
        let http = self.signer.as_ref().is_some_and(|s| s.http_signatures());
        Signing::of(self.signature, http)
    }

    /// Whether requests are signed.
    pub fn is_signed(&self) -> bool {
        self.signer.is_some()
    }

    /// The request of attempt `d` at `now` (the signer signs with that time), HTTP
    /// Signatures in draft-cavage: [`RequestPolicy::build_with`] with
    /// [`SignatureSpec::Cavage`] and no challenge.
    ///
    /// # Errors
    /// As [`RequestPolicy::build_with`].
    pub fn build<'a>(
        &self,
        d: &Delivery<'a>,
        now: SystemTime,
    ) -> Result<Request<'a>, AttemptResult> {
        self.build_with(d, now, SignatureSpec::Cavage, None)
    }

    /// The request of attempt `d` at `now` (the signer signs with that time), signed in the
    /// scheme `spec` (a signer of HTTP Signatures honours it, others ignore it) and, when a
    /// refusal of this attempt's previous request asked for a signature, with its
    /// `Accept-Signature` value as `challenge` (see [`SignRequest::challenge`]).
    ///
    /// Checked first, before the signer runs: [`Destination::check`], the URL parsed and an
    /// IP-literal host allowed by the address policy (the configuration's or the outbox's,
    /// [`HttpConfig::allowed`]; resolvers never see literals, so this
    /// is the guard's check of them; names are checked by the clients' resolvers, on the
    /// addresses they connect to).
    ///
    /// # Errors
    /// The attempt's result when nothing may be sent: an `invalid_recipient` or
    /// `invalid_request` [`Outcome::Permanent`](outbox_lanes_core::Outcome::Permanent) (a
    /// refused row header among them, see the [module documentation](self)), a refused
    /// destination, or [`not_sent`](crate::http::not_sent) when the signer could not sign.
    pub fn build_with<'a>(
        &self,
        d: &Delivery<'a>,
        now: SystemTime,
        spec: SignatureSpec,
        challenge: Option<&str>,
    ) -> Result<Request<'a>, AttemptResult> {
        let allowed = self.outbox_addresses.allowing(self.addresses);
        let url = d.recipient.check(&allowed, &self.classifier)?;
        let content_type = HeaderValue::from_str(d.content_type)
            .map_err(|_| invalid_request("the content type is not a header value"))?;
        validate_headers(d.headers).map_err(|r| {
            invalid_request(format_args!(
                "refused stored header {:?}: {}",
                r.name, r.problem
            ))
        })?;

        let mut headers = Vec::with_capacity(4 + d.headers.len() + 3);
        headers.push((USER_AGENT, self.user_agent.clone()));
        if !d
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("accept"))
        {
            headers.push((ACCEPT, HeaderValue::from_static("*/*")));
        }
        let key = idempotency_key(d.outbox, d.unit);
        headers.push((
            IDEMPOTENCY_KEY,
            HeaderValue::from_str(&key)
                .map_err(|_| invalid_request("the outbox id is not a header value"))?,
        ));
        headers.push((CONTENT_TYPE, content_type));
        for (name, value) in d.headers {
            headers.push(header(name, value).ok_or_else(|| {
                // validate_headers accepts only what converts; kept total all the same.
                invalid_request(format_args!("refused stored header {name:?}: not valid"))
            })?);
        }
        if let Some(signer) = &self.signer {
            let signed = signer.sign(&SignRequest {
                actor: d.actor,
                unit: d.unit,
                idempotency_key: &key,
                recipient: url,
                body: d.body,
                content_type: d.content_type,
                at: now,
                attempt: d.attempt,
                spec,
                challenge,
            });
            // Unsigned, the request would only be refused: not sent, retried uncounted.
            let signed = signed.map_err(|e| unsigned(d, &e))?;
            for (name, value) in signed {
                // The same request would be built again on every retry: permanent.
                headers.push(header(&name, &value).ok_or_else(|| {
                    invalid_request(format_args!("the signer's header {name:?} is not valid"))
                })?);
            }
        }
        Ok(Request {
            method: Method::POST,
            url,
            headers,
            body: d.body.clone(),
        })
    }
}

fn header(name: &str, value: &str) -> Option<(HeaderName, HeaderValue)> {
    Some((
        HeaderName::from_bytes(name.as_bytes()).ok()?,
        HeaderValue::from_str(value).ok()?,
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use outbox_lanes_core::policy::UrlError;
    use outbox_lanes_core::{Outcome, UnitId};

    use super::*;
    use crate::sign::StandardWebhooks;

    /// The time every request of these tests is built at: a fixed one, so no test reads a clock.
    fn at() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    fn policy(signer: Option<Arc<dyn Signer>>) -> RequestPolicy {
        let cfg = HttpConfig {
            addresses: AddressPolicy::allow_loopback_only(),
            user_agent: "ua/1".to_owned(),
            ..HttpConfig::default()
        };
        RequestPolicy::new(&cfg, signer).unwrap()
    }

    fn delivery<'a>(
        to: &'a Destination,
        body: &'a Bytes,
        headers: &'a [(String, String)],
    ) -> Delivery<'a> {
        Delivery {
            actor: "alice",
            outbox: "5ca1ab1e",
            unit: UnitId(42),
            recipient: to,
            body,
            content_type: "application/json",
            headers,
            attempt: 1,
        }
    }

    fn names(r: &Request<'_>) -> Vec<String> {
        r.headers
            .iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
            .collect()
    }

    fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_headers_in_their_order_with_the_signers_last() {
        let to = Destination::parse("HTTP://127.0.0.1:8080/inbox");
        let body = Bytes::from_static(br#"{"n":1}"#);
        let row = owned(&[("Authorization", "Bearer t"), ("X-Trace", "1")]);
        let signer = StandardWebhooks::new(&b"secret"[..]).unwrap();
        let p = policy(Some(Arc::new(signer)));
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let req = p.build(&delivery(&to, &body, &row), at).unwrap();
        assert_eq!(req.method, Method::POST);
        assert_eq!(req.url.as_str(), "http://127.0.0.1:8080/inbox");
        let mut want = vec![
            "user-agent: ua/1".to_owned(),
            "accept: */*".to_owned(),
            "idempotency-key: 5ca1ab1e-42".to_owned(),
            "content-type: application/json".to_owned(),
            "authorization: Bearer t".to_owned(),
            "x-trace: 1".to_owned(),
            "webhook-id: 5ca1ab1e-42".to_owned(),
            "webhook-timestamp: 1700000000".to_owned(),
        ];
        let got = names(&req);
        assert_eq!(got[..want.len()], want[..]);
        assert!(
            got[want.len()].starts_with("webhook-signature: v1,"),
            "{got:?}"
        );
        // The body is the caller's bytes, not a copy of them.
        assert_eq!(req.body.as_ptr(), body.as_ptr());
        // A row's own Accept replaces the default one.
        let row = owned(&[("Accept", "application/json")]);
        let req = policy(None).build(&delivery(&to, &body, &row), at).unwrap();
        want.truncate(4);
        want.remove(1);
        want.push("accept: application/json".to_owned());
        assert_eq!(names(&req), want);
        assert!(!format!("{req:?}").contains("application/json\""));
    }

    #[test]
    fn a_refused_stored_header_fails_the_attempt_naming_it() {
        let to = Destination::parse("http://127.0.0.1:8080/inbox");
        let body = Bytes::from_static(b"{}");
        for (row, error) in [
            (
                owned(&[("Host", "evil.internal")]),
                "invalid_request: refused stored header \"Host\": reserved (the HTTP client sets it itself)",
            ),
            (
                owned(&[("X-Ok", "1"), ("content-length", "0")]),
                "invalid_request: refused stored header \"content-length\": reserved (the HTTP client sets it itself)",
            ),
            (
                owned(&[("Proxy-Authorization", "Basic eDp5")]),
                "invalid_request: refused stored header \"Proxy-Authorization\": reserved (a hop-by-hop or proxy header: it would change how the request is framed or forwarded)",
            ),
            (
                owned(&[("Date", "Tue, 14 Nov 2023 22:13:20 GMT")]),
                "invalid_request: refused stored header \"Date\": reserved (the signer sets it itself)",
            ),
            (
                owned(&[("Idempotency-Key", "other")]),
                "invalid_request: refused stored header \"Idempotency-Key\": reserved (the HTTP client sets it itself)",
            ),
            (
                owned(&[("X-A", "1"), ("x-a", "2")]),
                "invalid_request: refused stored header \"x-a\": given twice",
            ),
            (
                owned(&[("broken", "")]),
                // A line without a colon decodes to an empty value: a valid header.
                "",
            ),
            (
                owned(&[("X Bad", "1")]),
                "invalid_request: refused stored header \"X Bad\": not a valid HTTP header name",
            ),
        ] {
            let res = policy(None).build(&delivery(&to, &body, &row), at());
            if error.is_empty() {
                assert!(res.is_ok(), "{row:?}");
                continue;
            }
            let res = res.unwrap_err();
            assert_eq!(res.outcome, Outcome::Permanent, "{row:?}");
            assert_eq!(res.error.as_deref(), Some(error), "{row:?}");
        }
    }

    #[test]
    fn checks_before_the_signer_runs() {
        struct Panics;
        impl Signer for Panics {
            fn sign(
                &self,
                _: &SignRequest<'_>,
            ) -> Result<Vec<(String, String)>, crate::sign::SignError> {
                panic!("signed a request that is not sent")
            }
        }
        let p = policy(Some(Arc::new(Panics)));
        let body = Bytes::new();
        let bad = Destination::parse("ftp://x.example/i");
        let res = p.build(&delivery(&bad, &body, &[]), at());
        let res = res.unwrap_err();
        assert_eq!(res.outcome, Outcome::Permanent);
        assert!(res.error.unwrap().starts_with("invalid_recipient: "));
        // A literal the policy refuses (loopback only is allowed here).
        let private = Destination::parse("http://10.0.0.1/i");
        let res = p.build(&delivery(&private, &body, &[]), at());
        assert_eq!(res.unwrap_err().outcome, Outcome::Refused);
        let to = Destination::parse("http://127.0.0.1/i");
        let row = owned(&[("Host", "x")]);
        let res = p.build(&delivery(&to, &body, &row), at());
        assert_eq!(res.unwrap_err().outcome, Outcome::Permanent);
    }

    #[test]
    fn build_signs_cavage_and_build_with_passes_the_spec_and_challenge_on() {
        use std::sync::Mutex;
        #[derive(Default)]
        struct Seen(Mutex<Vec<(SignatureSpec, Option<String>)>>);
        impl Signer for Seen {
            fn sign(
                &self,
                req: &SignRequest<'_>,
            ) -> Result<Vec<(String, String)>, crate::sign::SignError> {
                let mut seen = self.0.lock().unwrap();
                seen.push((req.spec, req.challenge.map(str::to_owned)));
                Ok(vec![("X-Signed".to_owned(), req.spec.as_str().to_owned())])
            }
        }
        let seen = Arc::new(Seen::default());
        let p = policy(Some(Arc::clone(&seen) as Arc<dyn Signer>));
        let to = Destination::parse("http://127.0.0.1:8080/inbox");
        let body = Bytes::from_static(b"{}");
        let d = delivery(&to, &body, &[]);
        let at = at();
        let last = |r: Request<'_>| names(&r).pop().unwrap();
        assert_eq!(last(p.build(&d, at).unwrap()), "x-signed: cavage");
        let challenge = "sig1=(\"@method\");created";
        let r = p
            .build_with(&d, at, SignatureSpec::Rfc9421, Some(challenge))
            .unwrap();
        assert_eq!(last(r), "x-signed: rfc9421");
        assert_eq!(
            *seen.0.lock().unwrap(),
            [
                (SignatureSpec::Cavage, None),
                (SignatureSpec::Rfc9421, Some(challenge.to_owned()))
            ]
        );
    }

    #[test]
    fn a_destination_is_parsed_once_and_keys_its_host() {
        let d = Destination::parse("https://A.example/inbox");
        assert_eq!(d.as_str(), "https://a.example/inbox");
        assert_eq!(d.host_port(), "a.example:443");
        assert_eq!(
            Destination::parse("http://127.0.0.1:8080/x?y#z").host_port(),
            "127.0.0.1:8080"
        );
        assert_eq!(
            Destination::parse("https://[::1]:9/i").host_port(),
            "[::1]:9"
        );
        // Refused by the parser (user info): its own key, and its attempts fail.
        let bad = Destination::parse("https://u:p@b.example");
        assert_eq!(bad.host_port(), "https://u:p@b.example");
        assert_eq!(bad.as_str(), "https://u:p@b.example");
        assert_eq!(bad.url(), Err(&UrlError::UserInfo));
    }
}
