//! Request signing: the [`Signer`] hook and the built-in signers, [`StandardWebhooks`] and
//! [`WebhookSecrets`] (HMAC-SHA256, for webhooks) and [`HttpSignatures`] (RSA or Ed25519, for
//! ActivityPub inboxes).
//!
//! The HTTP client calls the signer on **every attempt**, with that attempt's time, so a
//! scheme that signs a fresh `Date` or timestamp (HTTP Signatures, Standard Webhooks) never
//! sends a stale one on a retry. The signer is told the actor whose unit is sent
//! ([`SignRequest::actor`]), so one process can sign for many actors, each with its own key.
//!
//! # Which signer
//!
//! - [`StandardWebhooks`]: one secret for every actor, or several signing side by side (a
//!   rotation); the receiver checks an HMAC of the unit id, the attempt's Unix time and the
//!   body (<https://www.standardwebhooks.com/>). Secrets are written `whsec_<base64>`, of
//!   24 to 64 bytes (`sign/webhooks.rs`).
//! - [`WebhookSecrets`]: Standard Webhooks with secrets per actor (a customer) and per
//!   endpoint, so no customer holds a secret that signs another's webhooks;
//!   [`WebhookSecretsFile`] reads them from a TOML file and reads it again when it changes
//!   (`sign/webhook_secrets.rs`, `sign/webhook_secrets_file.rs`).
//! - [`HttpSignatures`]: a private key per actor (RSA, or Ed25519); the receiver fetches the
//!   actor's public key by its key id and checks a signature over the method, the target
//!   URL and a digest of the body. Mastodon, Lemmy, GoToSocial and Misskey refuse unsigned
//!   POSTs to an inbox. It signs in the scheme [`SignRequest::spec`] names
//!   ([`SignatureSpec`]):
//!   - [`SignatureSpec::Rfc9421`], RFC 9421 HTTP Message Signatures (below), which Mastodon
//!     4.5 and later verify and Fedify sends first;
//!   - [`SignatureSpec::Cavage`], draft-cavage-http-signatures-12 as every ActivityPub
//!     server verifies it: `(request-target) host date digest`, `rsa-sha256` with an RSA
//!     key, `hs2019` with an Ed25519 key.
//!
//! # RFC 9421: what is signed, and why
//!
//! Three headers: `Content-Digest` (RFC 9530, `sha-256=:<base64>:`), `Signature-Input` and
//! `Signature`, under the label `sig1`:
//!
//! ```text
//! Content-Digest: sha-256=:RBNvo1WzZ4oRRq0W9+hknpT7T8If536DEMBg9hyq/4o=:
//! Signature-Input: sig1=("@method" "@target-uri" "content-digest");created=1700000000;alg="rsa-v1_5-sha256";keyid="https://example.com/users/alice#main-key"
//! Signature: sig1=:<base64>:
//! ```
//!
//! - `@method` and `@target-uri` bind the signature to this POST to this inbox: the target
//!   URI is the whole canonical URL (scheme, host, port when not the default, path and
//!   query), so a signature made for one inbox is not valid at another;
//! - `content-digest` binds the body: a changed body no longer matches its digest;
//! - `created` is the attempt's time, so every attempt and retry carries a fresh signature
//!   (receivers refuse old ones), `keyid` names the actor's key (the receiver fetches its
//!   public key by it) and `alg` the algorithm (`rsa-v1_5-sha256` for an RSA key, `ed25519`
//!   for an Ed25519 key), so no verifier guesses it from the key.
//!
//! No `Date` header is sent: `created` says when the request was signed.
//!
//! ## `Accept-Signature`
//!
//! A server may say which signature it wants (RFC 9421 §5.1): [`SignRequest::challenge`]
//! carries the `Accept-Signature` of its refusal. When one of its members can be made with
//! the actor's key, the signature covers exactly the components it lists, under its label:
//! a challenge's `alg` and `keyid` must name this key, `nonce` and `tag` are sent as given,
//! `expires` (asked without a value) is `created` plus five minutes, and `created`, `keyid`
//! and `alg` are always sent. The components this signer can cover are those whose value on
//! the wire it knows: `@method`, `@target-uri`, `@authority`, `@scheme`, `@path`, `@query`,
//! `@request-target`, `content-digest`, `content-type`, `content-length` (the body's length,
//! when the body is not empty: both HTTP clients send it then, but hyper sends no
//! `Content-Length` for an empty body), `host` (the URL's host, with `:port` when not the
//! default: the `Host` both clients send), `idempotency-key`, and `date` (then a `Date`
//! header with the attempt's time is sent too). A challenge that is not a structured-field
//! dictionary, or asks for another key or algorithm, another component (`user-agent`, a
//! row's own header), component parameters (`;sf`, `;key`, `;bs`, `;req`, `;name`) or an
//! unknown parameter, is not honoured: the default signature is sent (and the reason logged
//! at DEBUG).
//!
//! ## Ed25519 under draft-cavage
//!
//! An Ed25519 key signs draft-cavage as `algorithm="hs2019"` (the draft's "derive the
//! algorithm from the key"), over the same signing string, with Ed25519 itself: what
//! GoToSocial's and other go-fed/httpsig receivers verify. Refusing would keep an Ed25519
//! actor's units to a draft-cavage-only server unsent forever (a failure on our side is
//! retried without end); signing lets the server answer, and one that holds only RSA keys
//! refuses it as it refuses any signature it cannot check.
//!
//! # Why these crates
//!
//! RSA is the `rsa` crate (PKCS#1 v1.5 with SHA-256, blinded), Ed25519 `ed25519-dalek`
//! (PKCS#8 keys read with the `pkcs8` crate `rsa` uses, the algorithm told by the key's OID),
//! structured fields `sfv`. The RFC 9421 signature base is assembled here (`sign/rfc9421.rs`
//! says why).
//!
//! # When a request cannot be signed
//!
//! [`Signer::sign`] may fail: [`HttpSignatures`] has no key for the actor, or the key
//! refused to sign; [`WebhookSecrets`] has no secret for the actor (or its endpoint). The
//! request is then **not sent** (an unsigned POST would only be refused, and a webhook must
//! not go out with another customer's signature) and the attempt is
//! [`Outcome::NotSent`](outbox_lanes_core::Outcome::NotSent), the outcome
//! of failures on our side: the unit is retried later, no attempt is counted, it never
//! moves toward a dead letter and its lane gets no backoff. Add the key (and restart, or
//! with a [`WebhookSecretsFile`] just save the file) and the units go out in order, nothing
//! lost. The clients log each such attempt at `warn`.

mod http_signatures;
mod key;
mod key_file;
mod rfc9421;
mod webhook_secrets;
mod webhook_secrets_file;
mod webhooks;

use core::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use outbox_lanes_core::UnitId;
use outbox_lanes_core::policy::Recipient;

pub use http_signatures::{HttpSignatures, KeysFileError, SIGNED_HEADERS};
pub use key::{ActorKey, KeyAlgorithm, KeyError, MIN_KEY_BITS};
pub use key_file::read_regular_file;

/// Which HTTP signature scheme signs a request (the host book's, which learns it per host).
pub use outbox_lanes_core::host::SignatureSpec;
pub use webhook_secrets::{SecretsFileError, WebhookSecrets};
pub use webhook_secrets_file::WebhookSecretsFile;
pub use webhooks::{
    MAX_SECRET_BYTES, MIN_SECRET_BYTES, SecretError, StandardWebhooks, VerifyError,
};

/// What a [`Signer`] is given for one attempt.
#[derive(Clone, Copy, Debug)]
pub struct SignRequest<'a> {
    /// The canonical id of the actor whose unit this is (after the resolver): the signer
    /// picks the actor's key by it.
    pub actor: &'a str,
    /// The unit being delivered.
    pub unit: UnitId,
    /// The request's `Idempotency-Key` ([`idempotency_key`](crate::http::idempotency_key):
    /// `<outbox id>-<unit id>`), unique across outboxes and the same on every attempt: what a
    /// signer sends as a message id.
    pub idempotency_key: &'a str,
    /// The recipient URL the request is sent to, canonical and parsed (once for its lane:
    /// its host, port and path are what the request line and `Host` carry).
    pub recipient: &'a Recipient,
    /// The exact request body.
    pub body: &'a [u8],
    /// The request's `Content-Type`.
    pub content_type: &'a str,
    /// The time of this attempt.
    pub at: SystemTime,
    /// The attempt number, as the caller counts it.
    pub attempt: u32,
    /// The HTTP signature scheme to sign with. [`HttpSignatures`] honours it; signers of
    /// other schemes ([`StandardWebhooks`], most custom ones) ignore it.
    pub spec: SignatureSpec,
    /// The raw `Accept-Signature` value (RFC 9421 §5.1) of a refusal of the previous request
    /// of this attempt, asking for a particular signature; `None` normally.
    /// [`HttpSignatures`] honours it under [`SignatureSpec::Rfc9421`] when it can (see the
    /// [module documentation](self)).
    pub challenge: Option<&'a str>,
}

/// Signs a request: returns headers to add to it.
///
/// Called on every attempt, from the delivery worker threads (hence `Send + Sync`). The
/// headers must not repeat the ones the client sets itself (`Content-Type`,
/// `Idempotency-Key`, `User-Agent`, `Host`): a duplicate would be sent twice. A header name
/// or value that is not valid HTTP makes the attempt fail as a permanent error, since
/// retrying would build the same bad request again.
pub trait Signer: Send + Sync {
    /// The headers (name, value) that sign this attempt.
    ///
    /// # Errors
    /// [`SignError`] when this request cannot be signed (no key for the actor): the client
    /// then sends nothing and reports the attempt as not sent, retried without counting it
    /// (see the [module documentation](self)).
    fn sign(&self, req: &SignRequest<'_>) -> Result<Vec<(String, String)>, SignError>;

    /// Whether this signer signs HTTP Signatures whose scheme follows
    /// [`SignRequest::spec`] (true for [`HttpSignatures`]): only then can a request refused
    /// in one scheme be signed in the other. `false` by default.
    fn http_signatures(&self) -> bool {
        false
    }

    /// Whether an `Accept-Signature` challenge (RFC 9421 §5.1) asking `actor`'s signature of
    /// a `body_len`-byte body can be signed as asked ([`SignRequest::challenge`]). A challenge
    /// that cannot be honoured is ignored: the double-knock never sends the same request
    /// again for it. `false` by default.
    fn honours_challenge(&self, actor: &str, challenge: &str, body_len: usize) -> bool {
        let _ = (actor, challenge, body_len);
        false
    }
}

/// What an outbox builder's `signer(..)` takes: a signer by value ([`HttpSignatures`],
/// [`StandardWebhooks`], [`WebhookSecrets`], [`WebhookSecretsFile`] or one of your own), or
/// one already shared in an `Arc` (an `Arc<dyn Signer>`, or an `Arc<WebhookSecretsFile>` whose
/// clone you keep to call [`reload`](WebhookSecretsFile::reload)).
///
/// ```
/// use std::sync::Arc;
/// use outbox_lanes_driver::sign::{IntoSigner, Signer, StandardWebhooks};
///
/// let by_value = StandardWebhooks::from_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// let shared: Arc<dyn Signer> = Arc::new(by_value.clone());
/// let kept = Arc::new(by_value.clone());
/// for signer in [by_value.into_signer(), shared.into_signer(), kept.into_signer()] {
///     assert!(!signer.http_signatures());
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait IntoSigner {
    /// The signer, shared (the HTTP client and the outbox's settings both hold it).
    fn into_signer(self) -> Arc<dyn Signer>;
}

impl<S: Signer + 'static> IntoSigner for S {
    fn into_signer(self) -> Arc<dyn Signer> {
        Arc::new(self)
    }
}

impl<S: Signer + 'static> IntoSigner for Arc<S> {
    fn into_signer(self) -> Arc<dyn Signer> {
        self
    }
}

impl IntoSigner for Arc<dyn Signer> {
    fn into_signer(self) -> Arc<dyn Signer> {
        self
    }
}

/// Why a [`Signer`] could not sign a request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SignError {
    /// The signer has no key for this actor (or, with [`WebhookSecrets`], none for this
    /// actor's recipient either).
    NoKey {
        /// The actor, as given in [`SignRequest::actor`].
        actor: String,
    },
    /// The recipient URL does not suit the signing scheme. The built-in signers never return
    /// it (the URL comes parsed); a custom signer may.
    BadRecipient(String),
    /// The signing itself failed.
    Failed(String),
}

impl fmt::Display for SignError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignError::NoKey { actor } => write!(
                f,
                "no signing key for actor {actor:?}: not sent unsigned (add the actor to the \
                 signing keys or webhook secrets)"
            ),
            SignError::BadRecipient(e) => write!(f, "cannot sign for this recipient URL: {e}"),
            SignError::Failed(e) => write!(f, "signing failed: {e}"),
        }
    }
}

impl std::error::Error for SignError {}

/// Unix seconds of `t`; a time before 1970 (a badly set clock) counts as 0 rather than
/// failing the attempt.
fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
