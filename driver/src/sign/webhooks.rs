//! Standard Webhooks (<https://www.standardwebhooks.com/>): [`StandardWebhooks`], one secret
//! or several signing side by side, its secrets' textual form and the receiving side's
//! [`StandardWebhooks::verify`].
//!
//! Several secrets are how a receiver moves to a new one without a moment where either side
//! refuses the other: the sender signs with the old and the new secret, one `v1,<base64>`
//! per secret in the one `webhook-signature` header (space-separated, as the specification
//! writes it), and a receiver that knows either secret finds a signature it can check. Once
//! every receiver has the new secret, the old one is dropped.

use core::fmt;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::Sha256;

use super::{SignError, SignRequest, Signer, unix_secs};

/// The shortest secret [`StandardWebhooks::from_whsec`] takes, in bytes (after base64): the
/// Standard Webhooks specification's lower bound (192 bits).
pub const MIN_SECRET_BYTES: usize = 24;

/// The longest secret [`StandardWebhooks::from_whsec`] takes, in bytes (after base64): the
/// specification's upper bound (512 bits, HMAC-SHA256's block size).
pub const MAX_SECRET_BYTES: usize = 64;

/// The prefix of a Standard Webhooks secret in its textual form.
const WHSEC_PREFIX: &str = "whsec_";

/// The signature version the Standard Webhooks spec defines for HMAC-SHA256.
const V1: &str = "v1,";

/// The base64 of a secret's text: the standard alphabet, its padding optional (generators
/// and other implementations write it either way).
const SECRET_BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// An HMAC-SHA256 signer following the Standard Webhooks specification, with one secret or
/// several (a rotation).
///
/// Adds three headers:
/// - `webhook-id`: the request's idempotency key, `<outbox id>-<unit id>` (the same value as
///   `Idempotency-Key`: unique across outboxes, as the specification asks of a message id);
/// - `webhook-timestamp`: the attempt's time in Unix seconds;
/// - `webhook-signature`: for each secret, in order, `v1,` followed by the base64 of
///   HMAC-SHA256(secret, `"{webhook-id}.{webhook-timestamp}.{body}"`), separated by one
///   space (`v1,<a> v1,<b>` while rotating from secret a to secret b).
///
/// One signer signs every actor's requests alike; [`WebhookSecrets`](super::WebhookSecrets)
/// gives each actor (customer), or each endpoint, secrets of its own.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use outbox_lanes_driver::sign::{SignRequest, SignatureSpec, Signer, StandardWebhooks};
/// use outbox_lanes_core::UnitId;
/// use outbox_lanes_core::policy::Recipient;
///
/// let signer = StandardWebhooks::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// // The time of the attempt (the driver passes its clock's; here a fixed one).
/// let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
/// let recipient = Recipient::parse("https://example.com/hook")?;
/// let req = SignRequest {
///     actor: "alice", unit: UnitId(7), idempotency_key: "3f1c0b5e9a7d4c2e-7",
///     recipient: &recipient, body: b"{}", content_type: "application/json", at, attempt: 1,
///     spec: SignatureSpec::Rfc9421, challenge: None,
/// };
/// let headers = signer.sign(&req)?;
/// let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
/// assert_eq!(get("webhook-id"), Some("3f1c0b5e9a7d4c2e-7"));
/// // The receiving side:
/// let (id, ts, sig) = (get("webhook-id").unwrap(), get("webhook-timestamp").unwrap(),
///                      get("webhook-signature").unwrap());
/// signer.verify(id, ts, sig, b"{}", at, Duration::from_secs(300))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct StandardWebhooks {
    /// Never empty; each key non-empty.
    keys: Vec<Vec<u8>>,
}

/// Why a Standard Webhooks secret was not accepted. Its text never holds the secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SecretError {
    /// The secret is empty.
    Empty,
    /// The text after `whsec_` is not standard base64.
    NotBase64,
    /// The secret is not written `whsec_<base64>`: a bare base64 secret is not taken, so a
    /// value meant for something else is not signed with by mistake. Putting `whsec_` in
    /// front of a bare secret keeps its key.
    NoPrefix,
    /// The secret is shorter than [`MIN_SECRET_BYTES`] or longer than [`MAX_SECRET_BYTES`]
    /// once decoded.
    Length {
        /// Its length in bytes.
        bytes: usize,
    },
}

impl fmt::Display for SecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretError::Empty => f.write_str("the webhook secret is empty"),
            SecretError::NotBase64 => {
                f.write_str("the webhook secret is not `whsec_` followed by standard base64")
            }
            SecretError::NoPrefix => f.write_str(
                "the webhook secret is not written `whsec_<base64>` (a bare base64 secret: put \
                 `whsec_` in front of it, the key stays the same)",
            ),
            SecretError::Length { bytes } => write!(
                f,
                "the webhook secret is {bytes} bytes long once decoded; Standard Webhooks \
                 secrets are {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes (make one with \
                 `echo whsec_$(openssl rand -base64 32)`)"
            ),
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
    /// Only an empty key is refused here: a receiver verifies with whatever key its sender
    /// chose. A sender's secret should be [`MIN_SECRET_BYTES`] to [`MAX_SECRET_BYTES`]
    /// random bytes, which [`StandardWebhooks::from_whsec`] requires.
    ///
    /// # Errors
    /// [`SecretError::Empty`] for an empty secret, which would sign with no key at all.
    pub fn new(secret: impl Into<Vec<u8>>) -> Result<Self, SecretError> {
        let key = secret.into();
        if key.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(StandardWebhooks { keys: vec![key] })
    }

    /// A signer from the textual form of Standard Webhooks secrets: `whsec_<base64>`, or
    /// several of them separated by spaces or commas (`whsec_<old> whsec_<new>`), which all
    /// sign, in order (a rotation). Each must decode to [`MIN_SECRET_BYTES`] to
    /// [`MAX_SECRET_BYTES`] bytes; its base64 padding is optional. A secret given twice
    /// signs once.
    ///
    /// # Errors
    /// [`SecretError`] for the first secret that is empty, lacks the `whsec_` prefix, is not
    /// base64 or has a length outside the bounds.
    pub fn from_whsec(secrets: &str) -> Result<Self, SecretError> {
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for text in secrets.split(|c: char| c == ',' || c.is_whitespace()) {
            if text.is_empty() {
                continue;
            }
            let key = decode_whsec(text)?;
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        if keys.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(StandardWebhooks { keys })
    }

    /// This signer with `next`'s secrets after its own: both sign, side by side.
    #[must_use]
    pub fn and(mut self, next: StandardWebhooks) -> StandardWebhooks {
        for key in next.keys {
            if !self.keys.contains(&key) {
                self.keys.push(key);
            }
        }
        self
    }

    /// How many secrets sign (one signature each).
    pub fn secret_count(&self) -> usize {
        self.keys.len()
    }

    /// The `webhook-signature` value for this id, timestamp and body: `v1,<base64>` for each
    /// secret, separated by spaces.
    pub fn signature(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let timestamp = timestamp.to_string();
        let mut out = String::with_capacity(self.keys.len() * 48);
        for key in &self.keys {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(V1);
            BASE64.encode_string(
                mac(key, id, &timestamp, body).finalize().into_bytes(),
                &mut out,
            );
        }
        out
    }

    /// Checks a received request: `id`, `timestamp` and `signatures` are the values of
    /// `webhook-id`, `webhook-timestamp` and `webhook-signature`, `body` the raw body.
    ///
    /// `signatures` may hold several space-separated signatures (senders list several while
    /// rotating secrets), and this verifier may hold several secrets: one matching `v1`
    /// signature of any of them is enough. The comparison is constant time. The timestamp
    /// must be within `tolerance` of `now` either way, which is what stops an old request
    /// from being replayed (the spec suggests five minutes).
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
        if unix_secs(now).abs_diff(ts) > tolerance.as_secs() {
            return Err(VerifyError::Stale);
        }
        let candidates: Vec<Vec<u8>> = signatures
            .split_ascii_whitespace()
            .filter_map(|s| s.strip_prefix(V1))
            .filter_map(|b64| BASE64.decode(b64).ok())
            .collect();
        let matched = self.keys.iter().any(|key| {
            candidates.iter().any(|candidate| {
                // `verify_slice` compares in constant time.
                mac(key, id, timestamp.trim(), body)
                    .verify_slice(candidate)
                    .is_ok()
            })
        });
        if matched {
            Ok(())
        } else {
            Err(VerifyError::NoMatch)
        }
    }
}

/// One secret's key from its text, `whsec_<base64>`.
fn decode_whsec(text: &str) -> Result<Vec<u8>, SecretError> {
    let b64 = text
        .strip_prefix(WHSEC_PREFIX)
        .ok_or(SecretError::NoPrefix)?;
    let key = SECRET_BASE64
        .decode(b64)
        .map_err(|_| SecretError::NotBase64)?;
    match key.len() {
        0 => Err(SecretError::Empty),
        n if (MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&n) => Ok(key),
        bytes => Err(SecretError::Length { bytes }),
    }
}

/// The HMAC of a message, fed but not finalised.
fn mac(key: &[u8], id: &str, timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

impl Signer for StandardWebhooks {
    /// Never fails: these secrets sign for every actor.
    fn sign(&self, req: &SignRequest<'_>) -> Result<Vec<(String, String)>, SignError> {
        let id = req.idempotency_key.to_owned();
        let ts = unix_secs(req.at);
        let signature = self.signature(&id, ts, req.body);
        Ok(vec![
            ("webhook-id".to_owned(), id),
            ("webhook-timestamp".to_owned(), ts.to_string()),
            ("webhook-signature".to_owned(), signature),
        ])
    }
}

impl fmt::Debug for StandardWebhooks {
    /// The number of secrets, never a secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StandardWebhooks")
            .field("secrets", &self.keys.len())
            .finish()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failing unwrap is a failing test
mod tests {
    use super::*;
    use crate::sign::SignatureSpec;
    use outbox_lanes_core::UnitId;
    use outbox_lanes_core::policy::Recipient;
    use std::time::UNIX_EPOCH;

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

    /// Our own vector, with `42` as the message id. Computed with Python:
    /// `base64.b64encode(hmac.new(b"outbox-lanes test secret", b'42.1700000000.{"n":1}',
    ///  hashlib.sha256).digest())` gives `Dx/tpP0EeGTT4nxf/qJtCJtR10fMveqliDgBEigk0Og=`, and
    /// `"whsec_" + base64.b64encode(b"outbox-lanes test secret")` is the whsec form.
    #[test]
    fn signer_headers_match_a_hand_computed_vector() {
        let raw = StandardWebhooks::new(&b"outbox-lanes test secret"[..]).unwrap();
        let text = StandardWebhooks::from_whsec("whsec_b3V0Ym94LWxhbmVzIHRlc3Qgc2VjcmV0").unwrap();
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_900);
        let recipient = Recipient::parse("https://example.com/hook").unwrap();
        let req = SignRequest {
            actor: "alice",
            unit: UnitId(42),
            idempotency_key: "42",
            recipient: &recipient,
            body: br#"{"n":1}"#,
            content_type: "application/json",
            at,
            attempt: 3,
            spec: SignatureSpec::Rfc9421,
            challenge: None,
        };
        let want = vec![
            ("webhook-id".to_owned(), "42".to_owned()),
            ("webhook-timestamp".to_owned(), "1700000000".to_owned()),
            (
                "webhook-signature".to_owned(),
                "v1,Dx/tpP0EeGTT4nxf/qJtCJtR10fMveqliDgBEigk0Og=".to_owned(),
            ),
        ];
        assert_eq!(raw.sign(&req), Ok(want.clone()));
        assert_eq!(text.sign(&req), Ok(want));
    }

    /// Two secrets sign side by side, in the order given, in one header: the spec vector's
    /// signature and our own vector's key's signature of the same message (Python:
    /// `base64.b64encode(hmac.new(b"outbox-lanes test secret",
    ///  b'msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330.{"test": 2432232314}',
    ///  hashlib.sha256).digest())` gives `KOQsc8NrcEKf2Crq4FKkwhKRm2USqyE+ZzNOLeN3CJo=`).
    #[test]
    fn a_rotation_signs_with_every_secret_in_one_header() {
        let old = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let new = "whsec_b3V0Ym94LWxhbmVzIHRlc3Qgc2VjcmV0";
        let want = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= \
                    v1,KOQsc8NrcEKf2Crq4FKkwhKRm2USqyE+ZzNOLeN3CJo=";
        let (id, ts, body) = (
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        for text in [
            format!("{old} {new}"),
            format!("{old},{new}"),
            format!("  {old} ,\n{new}  {old} "),
        ] {
            let s = StandardWebhooks::from_whsec(&text).unwrap();
            assert_eq!(s.secret_count(), 2, "{text}");
            assert_eq!(s.signature(id, ts, body), want);
        }
        let joined = StandardWebhooks::from_whsec(old)
            .unwrap()
            .and(StandardWebhooks::from_whsec(new).unwrap());
        assert_eq!(joined.signature(id, ts, body), want);
        // A receiver with either secret, or both, accepts the pair; one with neither does not.
        let now = UNIX_EPOCH + Duration::from_secs(ts);
        let tol = Duration::from_secs(300);
        for receiver in [old, new, &format!("{new} {old}")] {
            let r = StandardWebhooks::from_whsec(receiver).unwrap();
            assert_eq!(
                r.verify(id, &ts.to_string(), want, body, now, tol),
                Ok(()),
                "{receiver}"
            );
        }
        let other = StandardWebhooks::new(&b"a third secret, of 24 bytes"[..]).unwrap();
        assert_eq!(
            other.verify(id, &ts.to_string(), want, body, now, tol),
            Err(VerifyError::NoMatch)
        );
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
    fn bad_secrets_are_refused_without_showing_them() {
        let whsec = |bytes: usize| format!("whsec_{}", BASE64.encode(vec![7u8; bytes]));
        let cases = [
            ("whsec_***", SecretError::NotBase64),
            ("whsec_", SecretError::Empty),
            ("", SecretError::Empty),
            (" , ", SecretError::Empty),
            // A bare base64 secret (the spec's example without its prefix).
            ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", SecretError::NoPrefix),
            (
                "WHSEC_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                SecretError::NoPrefix,
            ),
            // Five bytes, and one byte short of or past the bounds.
            ("whsec_aGVsbG8=", SecretError::Length { bytes: 5 }),
            (&whsec(23), SecretError::Length { bytes: 23 }),
            (&whsec(65), SecretError::Length { bytes: 65 }),
            // The second of a rotation is checked as the first is.
            (
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw whsec_aGVsbG8=",
                SecretError::Length { bytes: 5 },
            ),
        ];
        for (text, want) in cases {
            let err = StandardWebhooks::from_whsec(text).unwrap_err();
            assert_eq!(err, want, "{text:?}");
            let shown = err.to_string();
            assert!(
                !shown.contains("aGVsbG8") && !shown.contains("MfKQ"),
                "{shown}"
            );
        }
        assert!(SecretError::NoPrefix.to_string().contains("whsec_"));
        assert!(
            SecretError::Length { bytes: 5 }
                .to_string()
                .contains("5 bytes long once decoded; Standard Webhooks secrets are 24 to 64")
        );
        for bytes in [MIN_SECRET_BYTES, 32, MAX_SECRET_BYTES] {
            assert!(
                StandardWebhooks::from_whsec(&whsec(bytes)).is_ok(),
                "{bytes}"
            );
        }
        // Unpadded base64 of 32 bytes (`=` left off) is the same key.
        let padded = whsec(32);
        let unpadded = padded.trim_end_matches('=');
        assert_ne!(padded, unpadded);
        assert_eq!(
            StandardWebhooks::from_whsec(unpadded)
                .unwrap()
                .signature("i", 1, b""),
            StandardWebhooks::from_whsec(&padded)
                .unwrap()
                .signature("i", 1, b"")
        );
        assert_eq!(
            StandardWebhooks::new(Vec::new()).unwrap_err(),
            SecretError::Empty
        );
        assert_eq!(
            format!("{:?}", StandardWebhooks::new(&b"secret"[..]).unwrap()),
            "StandardWebhooks { secrets: 1 }"
        );
    }
}
