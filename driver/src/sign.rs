//! Request signing: the [`Signer`] hook and the built-in [`StandardWebhooks`] signer.
//!
//! The HTTP client calls the signer on **every attempt**, with that attempt's time, so a
//! scheme that signs a fresh `Date` or timestamp (HTTP Signatures, Standard Webhooks) never
//! sends a stale one on a retry.

use core::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit as _, Mac as _};
use outbox_lanes_core::UnitId;
use sha2::Sha256;

/// What a [`Signer`] is given for one attempt.
#[derive(Clone, Copy, Debug)]
pub struct SignRequest<'a> {
    /// The unit being delivered; its id is also the `Idempotency-Key`.
    pub unit: UnitId,
    /// The canonical recipient URL the request is sent to.
    pub recipient: &'a str,
    /// The exact request body.
    pub body: &'a [u8],
    /// The request's `Content-Type`.
    pub content_type: &'a str,
    /// The time of this attempt.
    pub at: SystemTime,
    /// The attempt number, as the caller counts it.
    pub attempt: u32,
}

/// Signs a request: returns headers to add to it.
///
/// Called on every attempt, from the delivery worker threads (hence `Send + Sync`). The
/// headers must not repeat the ones the client sets itself (`Content-Type`,
/// `Idempotency-Key`, `User-Agent`): a duplicate would be sent twice. A header name or
/// value that is not valid HTTP makes the attempt fail as a permanent error, since
/// retrying would build the same bad request again.
pub trait Signer: Send + Sync {
    /// The headers (name, value) that sign this attempt.
    fn sign(&self, req: &SignRequest<'_>) -> Vec<(String, String)>;
}

/// The prefix of a Standard Webhooks secret in its textual form.
const WHSEC_PREFIX: &str = "whsec_";

/// The signature version the Standard Webhooks spec defines for HMAC-SHA256.
const V1: &str = "v1,";

/// An HMAC-SHA256 signer following the Standard Webhooks specification.
///
/// Adds three headers:
/// - `webhook-id`: the unit id (the same value as `Idempotency-Key`);
/// - `webhook-timestamp`: the attempt's time in Unix seconds;
/// - `webhook-signature`: `v1,` followed by the base64 of
///   HMAC-SHA256(secret, `"{webhook-id}.{webhook-timestamp}.{body}"`).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use outbox_lanes_driver::sign::{SignRequest, Signer, StandardWebhooks};
/// use outbox_lanes_core::UnitId;
///
/// let signer = StandardWebhooks::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// let at = SystemTime::now();
/// let req = SignRequest {
///     unit: UnitId(7), recipient: "https://example.com/hook", body: b"{}",
///     content_type: "application/json", at, attempt: 1,
/// };
/// let headers = signer.sign(&req);
/// let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
/// assert_eq!(get("webhook-id"), Some("7"));
/// // The receiving side:
/// let (id, ts, sig) = (get("webhook-id").unwrap(), get("webhook-timestamp").unwrap(),
///                      get("webhook-signature").unwrap());
/// signer.verify(id, ts, sig, b"{}", at, Duration::from_secs(300))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct StandardWebhooks {
    key: Vec<u8>,
}

/// Why a Standard Webhooks secret was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SecretError {
    /// The secret is empty.
    Empty,
    /// The text after `whsec_` is not standard base64.
    NotBase64,
}

impl fmt::Display for SecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretError::Empty => f.write_str("the webhook secret is empty"),
            SecretError::NotBase64 => {
                f.write_str("the webhook secret is not `whsec_` followed by standard base64")
            }
        }
    }
}

impl std::error::Error for SecretError {}

/// Why [`StandardWebhooks::verify`] rejected a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerifyError {
    /// `webhook-timestamp` is not a number of Unix seconds.
    BadTimestamp,
    /// The timestamp is further from `now` than the tolerance (a replay, or a skewed clock).
    Stale,
    /// No `v1` signature in `webhook-signature` matches.
    NoMatch,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VerifyError::BadTimestamp => "webhook-timestamp is not a number of Unix seconds",
            VerifyError::Stale => "webhook-timestamp is outside the tolerance",
            VerifyError::NoMatch => "no webhook-signature matches",
        })
    }
}

impl std::error::Error for VerifyError {}

impl StandardWebhooks {
    /// A signer with this raw secret (the bytes, not their base64).
    ///
    /// # Errors
    /// [`SecretError::Empty`] for an empty secret, which would sign with no key at all.
    pub fn new(secret: impl Into<Vec<u8>>) -> Result<Self, SecretError> {
        let key = secret.into();
        if key.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(StandardWebhooks { key })
    }

    /// A signer from the textual form `whsec_<base64>` used by Standard Webhooks
    /// implementations. The prefix may be left out, as those implementations also accept.
    ///
    /// # Errors
    /// [`SecretError`] when the text is empty or not base64.
    pub fn from_whsec(secret: &str) -> Result<Self, SecretError> {
        let b64 = secret
            .trim()
            .strip_prefix(WHSEC_PREFIX)
            .unwrap_or(secret.trim());
        let key = BASE64.decode(b64).map_err(|_| SecretError::NotBase64)?;
        StandardWebhooks::new(key)
    }

    /// The `webhook-signature` value (`v1,<base64>`) for this id, timestamp and body.
    pub fn signature(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let mac = self.mac(id, &timestamp.to_string(), body);
        let mut out = String::from(V1);
        BASE64.encode_string(mac.finalize().into_bytes(), &mut out);
        out
    }

    /// Checks a received request: `id`, `timestamp` and `signatures` are the values of
    /// `webhook-id`, `webhook-timestamp` and `webhook-signature`, `body` the raw body.
    ///
    /// `signatures` may hold several space-separated signatures (senders list several while
    /// rotating secrets); one matching `v1` signature is enough. The comparison is constant
    /// time. The timestamp must be within `tolerance` of `now` either way, which is what
    /// stops an old request from being replayed (the spec suggests five minutes).
    ///
    /// # Errors
    /// [`VerifyError`] saying why the request is refused.
    pub fn verify(
        &self,
        id: &str,
        timestamp: &str,
        signatures: &str,
        body: &[u8],
        now: SystemTime,
        tolerance: Duration,
    ) -> Result<(), VerifyError> {
        let ts = timestamp
            .trim()
            .parse::<u64>()
            .map_err(|_| VerifyError::BadTimestamp)?;
        let now = unix_secs(now);
        if now.abs_diff(ts) > tolerance.as_secs() {
            return Err(VerifyError::Stale);
        }
        let matched = signatures
            .split_ascii_whitespace()
            .filter_map(|s| s.strip_prefix(V1))
            .filter_map(|b64| BASE64.decode(b64).ok())
            .any(|candidate| {
                // `verify_slice` compares in constant time.
                self.mac(id, timestamp.trim(), body)
                    .verify_slice(&candidate)
                    .is_ok()
            });
        if matched {
            Ok(())
        } else {
            Err(VerifyError::NoMatch)
        }
    }

    fn mac(&self, id: &str, timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC accepts keys of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

impl Signer for StandardWebhooks {
    fn sign(&self, req: &SignRequest<'_>) -> Vec<(String, String)> {
        let id = req.unit.to_string();
        let ts = unix_secs(req.at);
        let signature = self.signature(&id, ts, req.body);
        vec![
            ("webhook-id".to_owned(), id),
            ("webhook-timestamp".to_owned(), ts.to_string()),
            ("webhook-signature".to_owned(), signature),
        ]
    }
}

impl fmt::Debug for StandardWebhooks {
    /// Never prints the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StandardWebhooks").finish_non_exhaustive()
    }
}

/// Unix seconds of `t`; a time before 1970 (a badly set clock) counts as 0 rather than
/// failing the attempt.
fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failing unwrap is a failing test
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification, checked on this machine with
    /// Python:
    /// `base64.b64encode(hmac.new(base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    ///  b'msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330.{"test": 2432232314}',
    ///  hashlib.sha256).digest())`
    /// gives `g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=`.
    #[test]
    fn spec_vector() {
        let s = StandardWebhooks::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            s.signature(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    /// Our own vector, with a unit id as the message id. Computed with Python:
    /// `base64.b64encode(hmac.new(b"outbox-lanes test secret", b'42.1700000000.{"n":1}',
    ///  hashlib.sha256).digest())` gives `Dx/tpP0EeGTT4nxf/qJtCJtR10fMveqliDgBEigk0Og=`, and
    /// `"whsec_" + base64.b64encode(b"outbox-lanes test secret")` is the whsec form.
    #[test]
    fn signer_headers_match_a_hand_computed_vector() {
        let raw = StandardWebhooks::new(&b"outbox-lanes test secret"[..]).unwrap();
        let text = StandardWebhooks::from_whsec("whsec_b3V0Ym94LWxhbmVzIHRlc3Qgc2VjcmV0").unwrap();
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_900);
        let req = SignRequest {
            unit: UnitId(42),
            recipient: "https://example.com/hook",
            body: br#"{"n":1}"#,
            content_type: "application/json",
            at,
            attempt: 3,
        };
        let want = vec![
            ("webhook-id".to_owned(), "42".to_owned()),
            ("webhook-timestamp".to_owned(), "1700000000".to_owned()),
            (
                "webhook-signature".to_owned(),
                "v1,Dx/tpP0EeGTT4nxf/qJtCJtR10fMveqliDgBEigk0Og=".to_owned(),
            ),
        ];
        assert_eq!(raw.sign(&req), want);
        assert_eq!(text.sign(&req), want);
    }

    #[test]
    fn verify_accepts_the_right_signature_and_refuses_the_rest() {
        let s = StandardWebhooks::new(&b"outbox-lanes test secret"[..]).unwrap();
        let sig = "v1,Dx/tpP0EeGTT4nxf/qJtCJtR10fMveqliDgBEigk0Og=";
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_100);
        let tol = Duration::from_secs(300);
        let body = br#"{"n":1}"#;
        assert_eq!(s.verify("42", "1700000000", sig, body, now, tol), Ok(()));
        // Among several signatures (secret rotation), one match is enough.
        let several = format!("v1,AAAA v2,whatever {sig}");
        assert_eq!(
            s.verify("42", "1700000000", &several, body, now, tol),
            Ok(())
        );
        assert_eq!(
            s.verify("43", "1700000000", sig, body, now, tol),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            s.verify("42", "1700000000", sig, b"{\"n\":2}", now, tol),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            s.verify("42", "1700000000", "v1,not base64!", body, now, tol),
            Err(VerifyError::NoMatch)
        );
        let other = StandardWebhooks::new(&b"another secret"[..]).unwrap();
        assert_eq!(
            other.verify("42", "1700000000", sig, body, now, tol),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            s.verify("42", "1700000000", sig, body, now, Duration::from_secs(60)),
            Err(VerifyError::Stale)
        );
        assert_eq!(
            s.verify("42", "17e8", sig, body, now, tol),
            Err(VerifyError::BadTimestamp)
        );
    }

    #[test]
    fn bad_secrets_are_refused() {
        assert_eq!(
            StandardWebhooks::from_whsec("whsec_***").unwrap_err(),
            SecretError::NotBase64
        );
        assert_eq!(
            StandardWebhooks::from_whsec("whsec_").unwrap_err(),
            SecretError::Empty
        );
        assert_eq!(
            StandardWebhooks::new(Vec::new()).unwrap_err(),
            SecretError::Empty
        );
        // Without the prefix, as other implementations accept.
        assert!(StandardWebhooks::from_whsec("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_ok());
        assert_eq!(
            format!("{:?}", StandardWebhooks::new(&b"secret"[..]).unwrap()),
            "StandardWebhooks { .. }"
        );
    }
}
