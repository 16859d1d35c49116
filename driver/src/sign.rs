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

mod rfc9421;
mod webhook_secrets;
mod webhook_secrets_file;
mod webhooks;

use core::fmt;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::pkcs8::DecodePrivateKey as _;
use outbox_lanes_core::policy::Recipient;
use outbox_lanes_core::{ActorId, UnitId};
use rsa::pkcs1::DecodeRsaPrivateKey as _;
use rsa::pkcs1v15::SigningKey;
use rsa::pkcs8::{PrivateKeyInfo, SecretDocument};
use rsa::signature::{RandomizedSigner as _, SignatureEncoding as _};
use rsa::traits::PublicKeyParts as _;
use rsa::{RsaPrivateKey, sha2 as rsa_sha2};

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

/// The headers a draft-cavage [`HttpSignatures`] signature covers, in order (the `headers`
/// parameter).
pub const SIGNED_HEADERS: &str = "(request-target) host date digest";

/// The shortest RSA key [`ActorKey`] accepts, in bits: what ActivityPub servers generate,
/// and below which keys are breakable.
pub const MIN_KEY_BITS: usize = 2048;

/// One actor's HTTP Signatures key: the key id receivers fetch the public key from, and the
/// private key, RSA or Ed25519.
#[derive(Clone)]
pub struct ActorKey {
    key_id: String,
    key: PrivateKey,
}

#[derive(Clone)]
enum PrivateKey {
    Rsa(SigningKey<rsa_sha2::Sha256>),
    Ed25519(ed25519_dalek::SigningKey),
}

/// The algorithm of an [`ActorKey`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyAlgorithm {
    /// RSA: RSASSA-PKCS1-v1_5 with SHA-256.
    Rsa,
    /// Ed25519 (RFC 8032).
    Ed25519,
}

impl KeyAlgorithm {
    /// The RFC 9421 `alg` of signatures made with such a key: `rsa-v1_5-sha256` or
    /// `ed25519`.
    pub fn rfc9421_alg(self) -> &'static str {
        match self {
            KeyAlgorithm::Rsa => "rsa-v1_5-sha256",
            KeyAlgorithm::Ed25519 => "ed25519",
        }
    }

    /// The draft-cavage `algorithm` of signatures made with such a key: `rsa-sha256` or
    /// `hs2019`.
    pub fn cavage_algorithm(self) -> &'static str {
        match self {
            KeyAlgorithm::Rsa => "rsa-sha256",
            KeyAlgorithm::Ed25519 => "hs2019",
        }
    }
}

/// Why a key (or a keys file entry) was not accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The `key_id` is empty.
    EmptyKeyId,
    /// The `key_id` holds a `"`, a backslash, or a character other than visible ASCII and
    /// the space (a control character, a non-ASCII letter), which cannot be written in a
    /// signature header.
    BadKeyId,
    /// The PEM is a public key or a certificate, not a private key.
    NotPrivate,
    /// The PEM is an encrypted private key; decrypt it first (`openssl pkey -in K -out K2`).
    Encrypted,
    /// The PEM is not an RSA private key in PKCS#1 (`BEGIN RSA PRIVATE KEY`) or PKCS#8
    /// (`BEGIN PRIVATE KEY`) form, nor an Ed25519 one in PKCS#8; the text says what the
    /// parser found.
    Invalid(String),
    /// The key is shorter than [`MIN_KEY_BITS`].
    TooShort {
        /// The key's size in bits.
        bits: usize,
    },
    /// A PKCS#8 key of another algorithm than RSA and Ed25519 (an EC key, say).
    Unsupported {
        /// The algorithm's object identifier, dotted (`1.2.840.10045.2.1` for EC).
        oid: String,
    },
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::EmptyKeyId => f.write_str("key_id is empty"),
            KeyError::BadKeyId => f.write_str(
                "key_id holds a double quote, a backslash, or a character other than visible \
                     ASCII and the space",
            ),
            KeyError::NotPrivate => {
                f.write_str("the PEM is a public key or certificate, not a private key")
            }
            KeyError::Encrypted => f.write_str(
                "the private key is encrypted; give it decrypted (openssl pkey -in KEY -out KEY2)",
            ),
            KeyError::Invalid(e) => write!(
                f,
                "not an RSA or Ed25519 private key in PEM (PKCS#1 `BEGIN RSA PRIVATE KEY` or \
                 PKCS#8 `BEGIN PRIVATE KEY`): {e}"
            ),
            KeyError::TooShort { bits } => write!(
                f,
                "the RSA key has {bits} bits; at least {MIN_KEY_BITS} are needed"
            ),
            KeyError::Unsupported { oid } => write!(
                f,
                "the PKCS#8 key's algorithm (OID {oid}) is not RSA or Ed25519, the two that \
                 sign HTTP Signatures here"
            ),
        }
    }
}

impl std::error::Error for KeyError {}

impl ActorKey {
    /// A key from its key id (usually `https://host/users/NAME#main-key`) and its PEM private
    /// key: RSA in PKCS#1 (`-----BEGIN RSA PRIVATE KEY-----`) or PKCS#8
    /// (`-----BEGIN PRIVATE KEY-----`), or Ed25519 in PKCS#8 (`BEGIN PRIVATE KEY` too, as
    /// `openssl genpkey -algorithm ed25519` writes it). A PKCS#8 key's algorithm is read from
    /// the key itself.
    ///
    /// # Errors
    /// [`KeyError`] when the key id cannot be sent or the PEM is not an unencrypted RSA
    /// private key of at least [`MIN_KEY_BITS`] or an unencrypted Ed25519 private key.
    pub fn from_pem(key_id: impl Into<String>, pem: &str) -> Result<Self, KeyError> {
        let key_id = key_id.into();
        if key_id.trim().is_empty() {
            return Err(KeyError::EmptyKeyId);
        }
        if key_id
            .chars()
            .any(|c| c == '"' || c == '\\' || !(c == ' ' || c.is_ascii_graphic()))
        {
            return Err(KeyError::BadKeyId);
        }
        let pem = pem.trim();
        let invalid = |e: &dyn fmt::Display| KeyError::Invalid(e.to_string());
        let key = if pem.contains("-----BEGIN RSA PRIVATE KEY-----") {
            PrivateKey::rsa(RsaPrivateKey::from_pkcs1_pem(pem).map_err(|e| invalid(&e))?)?
        } else if pem.contains("-----BEGIN PRIVATE KEY-----") {
            let (_, doc) = SecretDocument::from_pem(pem).map_err(|e| invalid(&e))?;
            let info = PrivateKeyInfo::try_from(doc.as_bytes()).map_err(|e| invalid(&e))?;
            let oid = info.algorithm.oid;
            if oid == rsa::pkcs1::ALGORITHM_OID {
                PrivateKey::rsa(RsaPrivateKey::try_from(info).map_err(|e| invalid(&e))?)?
            } else if oid == ed25519_dalek::pkcs8::ALGORITHM_OID {
                PrivateKey::Ed25519(
                    ed25519_dalek::SigningKey::from_pkcs8_der(doc.as_bytes())
                        .map_err(|e| invalid(&e))?,
                )
            } else {
                return Err(KeyError::Unsupported {
                    oid: oid.to_string(),
                });
            }
        } else if pem.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----") {
            return Err(KeyError::Encrypted);
        } else if pem.contains("PUBLIC KEY-----") || pem.contains("CERTIFICATE-----") {
            return Err(KeyError::NotPrivate);
        } else {
            return Err(KeyError::Invalid(
                "no PEM private key block found".to_owned(),
            ));
        };
        Ok(ActorKey { key_id, key })
    }

    /// The key id sent with every signature (`keyId` in draft-cavage, `keyid` in RFC 9421).
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The key's algorithm.
    pub fn algorithm(&self) -> KeyAlgorithm {
        match self.key {
            PrivateKey::Rsa(_) => KeyAlgorithm::Rsa,
            PrivateKey::Ed25519(_) => KeyAlgorithm::Ed25519,
        }
    }

    /// The signature of `message`: RSASSA-PKCS1-v1_5 with SHA-256 (blinded with fresh OS
    /// randomness), or Ed25519.
    fn sign_bytes(&self, message: &[u8]) -> Result<Vec<u8>, SignError> {
        match &self.key {
            PrivateKey::Rsa(key) => key
                .try_sign_with_rng(&mut rsa::rand_core::OsRng, message)
                .map(|s| s.to_vec())
                .map_err(|e| SignError::Failed(e.to_string())),
            PrivateKey::Ed25519(key) => Ok(ed25519_dalek::Signer::sign(key, message)
                .to_bytes()
                .to_vec()),
        }
    }
}

impl PrivateKey {
    /// An RSA key, if it is long enough.
    fn rsa(key: RsaPrivateKey) -> Result<PrivateKey, KeyError> {
        let bits = key.size() * 8;
        if bits < MIN_KEY_BITS {
            return Err(KeyError::TooShort { bits });
        }
        Ok(PrivateKey::Rsa(SigningKey::new(key)))
    }
}

impl fmt::Debug for ActorKey {
    /// The key id and algorithm only, never the private key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActorKey")
            .field("key_id", &self.key_id)
            .field("algorithm", &self.algorithm())
            .finish_non_exhaustive()
    }
}

/// An HTTP Signatures signer with a key per actor (RSA or Ed25519), in the scheme each
/// request asks for ([`SignRequest::spec`]): RFC 9421 or draft-cavage.
///
/// Under [`SignatureSpec::Rfc9421`] it adds `Content-Digest`, `Signature-Input` and
/// `Signature` (see the [module documentation](self) for what is covered, and the
/// `Accept-Signature` challenge).
///
/// Under [`SignatureSpec::Cavage`] (draft-cavage-http-signatures-12, as Mastodon verifies it)
/// it adds three headers ([`HttpSignatures::headers`]):
/// - `Date`: the attempt's time as an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`), fresh on
///   every retry (receivers refuse dates more than a few minutes off, Mastodon 12 hours,
///   GoToSocial 30 seconds);
/// - `Digest`: `SHA-256=` and the base64 of the body's SHA-256;
/// - `Signature`: `keyId="…",algorithm="rsa-sha256",headers="(request-target) host date
///   digest",signature="…"` (`algorithm="hs2019"` with an Ed25519 key), the signature being
///   the base64 of the RSASSA-PKCS1-v1_5 SHA-256 (or Ed25519) signature of the signing
///   string
///   ```text
///   (request-target): post /inbox
///   host: example.com
///   date: Sun, 06 Nov 1994 08:49:37 GMT
///   digest: SHA-256=47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=
///   ```
///   (lines joined by `\n`), where the request target is the recipient's path and query and
///   `host` is exactly the `Host` header the clients send: the host, with `:port` when the
///   port is not the scheme's default.
///
/// The key is picked by [`SignRequest::actor`]; an actor without a key is a
/// [`SignError::NoKey`] and the request is not sent (see the [module documentation](self)).
///
/// Build it from Rust with [`HttpSignatures::insert`], or from a TOML keys file with
/// [`HttpSignatures::from_keys_file`]:
///
/// ```toml
/// [actors."https://example.com/users/alice"]
/// key_id = "https://example.com/users/alice#main-key"
/// private_key_file = "alice.pem"      # relative to the keys file's directory
///
/// [actors."https://example.com/users/bob"]
/// key_id = "https://example.com/users/bob#main-key"
/// private_key_pem = """
/// -----BEGIN PRIVATE KEY-----
/// ...
/// -----END PRIVATE KEY-----
/// """
/// ```
///
/// A key is RSA (PKCS#1 or PKCS#8) or Ed25519 (PKCS#8, `BEGIN PRIVATE KEY`): the key itself
/// says which, so the file names no algorithm.
///
/// The RSA private-key operation is blinded with fresh randomness from the OS on every
/// signature (RSA blinding, against timing attacks on the key).
#[derive(Clone, Default)]
pub struct HttpSignatures {
    keys: BTreeMap<String, ActorKey>,
}

/// Why a keys file was not accepted.
#[derive(Debug)]
#[non_exhaustive]
pub enum KeysFileError {
    /// The file could not be read.
    Read {
        /// The keys file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The file is not valid TOML, or not a table of `[actors."<actor>"]` tables.
    Syntax {
        /// The keys file.
        path: PathBuf,
        /// What the parser said (with the line and column).
        message: String,
    },
    /// The file names no actor at all: nothing could ever be signed.
    NoActors {
        /// The keys file.
        path: PathBuf,
    },
    /// Some entries are wrong: each with its actor and why, in the file's order of actors.
    Entries {
        /// The keys file.
        path: PathBuf,
        /// `(actor, what is wrong)` for every bad entry.
        errors: Vec<(String, String)>,
    },
}

impl fmt::Display for KeysFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeysFileError::Read { path, error } => {
                write!(
                    f,
                    "cannot read the signing keys file {}: {error}",
                    path.display()
                )
            }
            KeysFileError::Syntax { path, message } => write!(
                f,
                "the signing keys file {} is not valid: {}",
                path.display(),
                message.trim_end()
            ),
            KeysFileError::NoActors { path } => write!(
                f,
                "the signing keys file {} has no [actors.\"<actor>\"] entry",
                path.display()
            ),
            KeysFileError::Entries { path, errors } => {
                write!(
                    f,
                    "the signing keys file {} has bad entries:",
                    path.display()
                )?;
                for (actor, why) in errors {
                    write!(f, "\n  [actors.{actor:?}]: {why}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for KeysFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KeysFileError::Read { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl HttpSignatures {
    /// A signer with no keys yet.
    pub fn new() -> Self {
        HttpSignatures::default()
    }

    /// A signer with one actor's key, read from its key id and PEM private key as
    /// [`ActorKey::from_pem`] reads it; [`with_key`](HttpSignatures::with_key) adds more:
    ///
    /// ```no_run
    /// # use outbox_lanes_driver::sign::HttpSignatures;
    /// # let (alice_pem, bob_pem) = (String::new(), String::new());
    /// let keys = HttpSignatures::from_pem(
    ///     "https://example.com/users/alice",
    ///     "https://example.com/users/alice#main-key",
    ///     &alice_pem,
    /// )?
    /// .with_key(
    ///     "https://example.com/users/bob",
    ///     "https://example.com/users/bob#main-key",
    ///     &bob_pem,
    /// )?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`ActorKey::from_pem`].
    pub fn from_pem(
        actor: impl Into<ActorId>,
        key_id: impl Into<String>,
        pem: &str,
    ) -> Result<Self, KeyError> {
        HttpSignatures::new().with_key(actor, key_id, pem)
    }

    /// This signer with `actor`'s key (the canonical actor id, as the outbox's resolver gives
    /// it) read from its key id and PEM private key as [`ActorKey::from_pem`] reads it,
    /// replacing a key the actor had.
    ///
    /// # Errors
    /// As [`ActorKey::from_pem`].
    pub fn with_key(
        mut self,
        actor: impl Into<ActorId>,
        key_id: impl Into<String>,
        pem: &str,
    ) -> Result<Self, KeyError> {
        self.insert(actor, ActorKey::from_pem(key_id, pem)?);
        Ok(self)
    }

    /// Sets `actor`'s key (the canonical actor id, as the outbox's resolver gives it);
    /// returns the key it replaces.
    pub fn insert(&mut self, actor: impl Into<ActorId>, key: ActorKey) -> Option<ActorKey> {
        self.keys.insert(Into::<ActorId>::into(actor).into(), key)
    }

    /// The key of `actor`, if it has one.
    pub fn key(&self, actor: &str) -> Option<&ActorKey> {
        self.keys.get(actor)
    }

    /// The actors with a key, in order.
    pub fn actors(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// Loads a TOML keys file (see the [type documentation](HttpSignatures) for its
    /// format). A `private_key_file` is read relative to the keys file's directory.
    ///
    /// # Errors
    /// [`KeysFileError`]: the file cannot be read, is not TOML of the expected shape, names
    /// no actor, or has bad entries (every one of them is listed, with its actor).
    pub fn from_keys_file(path: impl AsRef<Path>) -> Result<Self, KeysFileError> {
        let path = path.as_ref();
        let text = read_key_file(path).map_err(|error| KeysFileError::Read {
            path: path.to_owned(),
            error,
        })?;
        let dir = path.parent().unwrap_or_else(|| Path::new("."));
        HttpSignatures::from_toml(&text, path, dir)
    }

    /// Parses the text of a keys file; `path` is only used in errors, `dir` is where
    /// relative `private_key_file` paths are read from.
    ///
    /// # Errors
    /// As [`HttpSignatures::from_keys_file`], except reading the file itself.
    pub fn from_toml(text: &str, path: &Path, dir: &Path) -> Result<Self, KeysFileError> {
        let syntax = |message: String| KeysFileError::Syntax {
            path: path.to_owned(),
            message,
        };
        let table: toml::Table = toml::from_str(text).map_err(|e| syntax(e.to_string()))?;
        if let Some(other) = table.keys().find(|k| *k != "actors") {
            return Err(syntax(format!(
                "unknown key {other:?} at the top level (only [actors.\"<actor>\"] tables)"
            )));
        }
        let actors = match table.get("actors") {
            None => {
                return Err(KeysFileError::NoActors {
                    path: path.to_owned(),
                });
            }
            Some(toml::Value::Table(t)) => t,
            Some(_) => {
                return Err(syntax(
                    "`actors` must be tables: [actors.\"<actor>\"]".to_owned(),
                ));
            }
        };
        if actors.is_empty() {
            return Err(KeysFileError::NoActors {
                path: path.to_owned(),
            });
        }
        let mut signer = HttpSignatures::new();
        let mut errors = Vec::new();
        // One bad entry does not hide the others: every one is checked and reported.
        for (actor, entry) in actors {
            match entry_key(actor, entry, dir) {
                Ok(key) => {
                    signer.insert(actor.clone(), key);
                }
                Err(why) => errors.push((actor.clone(), why)),
            }
        }
        if errors.is_empty() {
            Ok(signer)
        } else {
            Err(KeysFileError::Entries {
                path: path.to_owned(),
                errors,
            })
        }
    }

    /// The draft-cavage `Date`, `Digest` and `Signature` headers for a POST of `body` to
    /// `recipient` at `at`, signed with `key` (`rsa-sha256`, or `hs2019` with an Ed25519
    /// key).
    ///
    /// # Errors
    /// [`SignError::Failed`] when the RSA operation fails.
    pub fn headers(
        key: &ActorKey,
        url: &Recipient,
        body: &[u8],
        at: SystemTime,
    ) -> Result<Vec<(String, String)>, SignError> {
        let mut host = url.host().to_string();
        if url.port() != url.scheme().default_port() {
            host.push(':');
            host.push_str(&url.port().to_string());
        }
        let date = httpdate::fmt_http_date(at);
        let digest = format!(
            "SHA-256={}",
            BASE64.encode(<rsa_sha2::Sha256 as rsa_sha2::Digest>::digest(body))
        );
        let signing_string = format!(
            "(request-target): post {}\nhost: {host}\ndate: {date}\ndigest: {digest}",
            url.path_and_query()
        );
        let signature = key.sign_bytes(signing_string.as_bytes())?;
        let signature = format!(
            "keyId=\"{}\",algorithm=\"{}\",headers=\"{SIGNED_HEADERS}\",signature=\"{}\"",
            key.key_id,
            key.algorithm().cavage_algorithm(),
            BASE64.encode(signature)
        );
        Ok(vec![
            ("Date".to_owned(), date),
            ("Digest".to_owned(), digest),
            ("Signature".to_owned(), signature),
        ])
    }
}

/// A key file (a keys file, a `private_key_file`) holds at most this many bytes.
const MAX_KEY_FILE: u64 = 1 << 20;

/// The text of the file at `path` if it is a regular file of at most `max` bytes (a device
/// or a pipe given by mistake would be read without end), with the metadata of what was
/// opened. Checked before opening (opening a FIFO waits for a writer) and again on the opened
/// file, in case the path changed in between. The binary reads its `--config` with it too.
///
/// # Errors
/// The file cannot be read, is not a regular file, is larger than `max` or is not UTF-8.
pub fn read_regular_file(path: &Path, max: u64) -> std::io::Result<(String, std::fs::Metadata)> {
    use std::io::{Error, ErrorKind, Read as _};
    let not_regular = || Error::new(ErrorKind::InvalidInput, "not a regular file");
    if !std::fs::metadata(path)?.is_file() {
        return Err(not_regular());
    }
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular());
    }
    let mut text = String::new();
    file.take(max + 1).read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("larger than {} KiB", max / 1024),
        ));
    }
    Ok((text, meta))
}

/// The text of a key file: a regular file of at most [`MAX_KEY_FILE`] bytes
/// ([`read_regular_file`]). Logs a warning, once per file, if it is readable by its group or
/// others (unix).
fn read_key_file(path: &Path) -> std::io::Result<String> {
    let (text, meta) = read_regular_file(path, MAX_KEY_FILE)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        static WARNED: std::sync::Mutex<std::collections::BTreeSet<PathBuf>> =
            std::sync::Mutex::new(std::collections::BTreeSet::new());
        let mode = meta.permissions().mode();
        let first = || {
            let mut warned = WARNED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            warned.insert(path.to_owned())
        };
        if mode & 0o077 != 0 && first() {
            tracing::warn!(
                file = %path.display(),
                mode = %format_args!("{:o}", mode & 0o777),
                "a signing key file is readable by its group or others; chmod 600 it"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = meta;
    Ok(text)
}

/// One `[actors."<actor>"]` entry's key, or what is wrong with it.
fn entry_key(actor: &str, entry: &toml::Value, dir: &Path) -> Result<ActorKey, String> {
    if actor.trim().is_empty() {
        return Err("the actor id is empty".to_owned());
    }
    let Some(entry) = entry.as_table() else {
        return Err("must be a table with key_id and private_key_pem or private_key_file".into());
    };
    if let Some(other) = entry.keys().find(|k| {
        !matches!(
            k.as_str(),
            "key_id" | "private_key_pem" | "private_key_file"
        )
    }) {
        return Err(format!(
            "unknown key {other:?} (expected key_id, private_key_pem or private_key_file)"
        ));
    }
    let text = |name: &str| -> Result<Option<&str>, String> {
        match entry.get(name) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(format!("{name} must be a string")),
        }
    };
    let key_id = text("key_id")?.ok_or("key_id is missing")?;
    let pem = match (text("private_key_pem")?, text("private_key_file")?) {
        (Some(pem), None) => pem.to_owned(),
        (None, Some(file)) => {
            let file = dir.join(file);
            read_key_file(&file)
                .map_err(|e| format!("cannot read private_key_file {}: {e}", file.display()))?
        }
        (Some(_), Some(_)) => {
            return Err("give private_key_pem or private_key_file, not both".to_owned());
        }
        (None, None) => return Err("private_key_pem or private_key_file is missing".to_owned()),
    };
    ActorKey::from_pem(key_id, &pem).map_err(|e| e.to_string())
}

impl Signer for HttpSignatures {
    fn sign(&self, req: &SignRequest<'_>) -> Result<Vec<(String, String)>, SignError> {
        let key = self.keys.get(req.actor).ok_or_else(|| SignError::NoKey {
            actor: req.actor.to_owned(),
        })?;
        match req.spec {
            SignatureSpec::Rfc9421 => rfc9421::headers(key, req),
            SignatureSpec::Cavage => HttpSignatures::headers(key, req.recipient, req.body, req.at),
        }
    }

    fn http_signatures(&self) -> bool {
        true
    }

    fn honours_challenge(&self, actor: &str, challenge: &str, body_len: usize) -> bool {
        self.keys
            .get(actor)
            .is_some_and(|key| rfc9421::honours(challenge, key, body_len))
    }
}

impl fmt::Debug for HttpSignatures {
    /// The actors and key ids, never the private keys.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.keys.iter().map(|(a, k)| (a, &k.key_id)))
            .finish()
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
    mod http_signatures {
        use super::super::*;
        use outbox_lanes_test_support::signatures::{
            ALICE_PRIVATE_PKCS8, ALICE_PUBLIC, BOB_PRIVATE_PKCS1, BOB_PUBLIC,
            CAROL_ED25519_PRIVATE, CAROL_ED25519_PUBLIC, P256_PRIVATE_PKCS8,
        };
        use rsa::pkcs1v15::{Signature, VerifyingKey};
        use rsa::pkcs8::DecodePublicKey as _;
        use rsa::signature::Verifier as _;
        use std::time::Duration;

        const ALICE: &str = "https://example.com/users/alice";
        const BOB: &str = "https://example.com/users/bob";

        fn signer() -> HttpSignatures {
            let mut s = HttpSignatures::new();
            s.insert(
                ALICE,
                ActorKey::from_pem(format!("{ALICE}#main-key"), ALICE_PRIVATE_PKCS8).unwrap(),
            );
            s.insert(
                BOB,
                ActorKey::from_pem(format!("{BOB}#main-key"), BOB_PRIVATE_PKCS1).unwrap(),
            );
            s
        }

        fn req<'a>(actor: &'a str, recipient: &'a Recipient, body: &'a [u8]) -> SignRequest<'a> {
            SignRequest {
                actor,
                unit: UnitId(9),
                idempotency_key: "0123abcd-9",
                recipient,
                body,
                content_type: "application/activity+json",
                at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_500),
                attempt: 1,
                spec: SignatureSpec::Cavage,
                challenge: None,
            }
        }

        fn verify(public: &str, signing_string: &str, signature_header: &str) -> bool {
            let b64 = signature_header
                .rsplit_once("signature=\"")
                .unwrap()
                .1
                .trim_end_matches('"');
            let sig = Signature::try_from(BASE64.decode(b64).unwrap().as_slice()).unwrap();
            let key = rsa::RsaPublicKey::from_public_key_pem(public).unwrap();
            VerifyingKey::<rsa_sha2::Sha256>::new(key)
                .verify(signing_string.as_bytes(), &sig)
                .is_ok()
        }

        /// The headers and signing string written out by hand from draft-cavage §2.3, for a
        /// PKCS#8 key (non-default port: `host` carries it) and a PKCS#1 key (default port).
        #[test]
        fn signs_the_cavage_string_with_each_actors_key() {
            let s = signer();
            let cases = [
                (
                    ALICE,
                    ALICE_PUBLIC,
                    "https://inbox.example:8443/users/x/inbox?a=1",
                    "inbox.example:8443",
                    "/users/x/inbox?a=1",
                ),
                (
                    BOB,
                    BOB_PUBLIC,
                    "https://inbox.example/inbox",
                    "inbox.example",
                    "/inbox",
                ),
            ];
            for (actor, public, url, host, target) in cases {
                let url = Recipient::parse(url).unwrap();
                let headers = s.sign(&req(actor, &url, b"{}")).unwrap();
                let names: Vec<_> = headers.iter().map(|(n, _)| n.as_str()).collect();
                assert_eq!(names, ["Date", "Digest", "Signature"]);
                let date = "Tue, 14 Nov 2023 22:13:20 GMT";
                let digest = "SHA-256=RBNvo1WzZ4oRRq0W9+hknpT7T8If536DEMBg9hyq/4o=";
                assert_eq!(headers[0].1, date);
                assert_eq!(headers[1].1, digest);
                let sig = &headers[2].1;
                assert!(
                    sig.starts_with(&format!(
                        "keyId=\"{actor}#main-key\",algorithm=\"rsa-sha256\",\
                         headers=\"(request-target) host date digest\",signature=\""
                    )),
                    "{sig}"
                );
                let string = format!(
                    "(request-target): post {target}\nhost: {host}\ndate: {date}\ndigest: {digest}"
                );
                assert!(verify(public, &string, sig), "{actor}");
                // Another body, host or key does not verify.
                assert!(!verify(
                    public,
                    &string.replace("{}", "[]").replace("post", "get"),
                    sig
                ));
                let other = if public == ALICE_PUBLIC {
                    BOB_PUBLIC
                } else {
                    ALICE_PUBLIC
                };
                assert!(!verify(other, &string, sig));
            }
            // http on 80 and an IPv6 literal: the Host header forms the clients send.
            let h = HttpSignatures::headers(
                s.key(ALICE).unwrap(),
                &Recipient::parse("http://[::1]:8080/i").unwrap(),
                b"",
                UNIX_EPOCH,
            )
            .unwrap();
            let string = format!(
                "(request-target): post /i\nhost: [::1]:8080\ndate: {}\ndigest: {}",
                h[0].1, h[1].1
            );
            assert!(verify(ALICE_PUBLIC, &string, &h[2].1));
        }

        #[test]
        fn an_actor_without_a_key_is_an_error_not_an_unsigned_request() {
            let s = signer();
            let to = Recipient::parse("https://x.example/i").unwrap();
            let err = s.sign(&req("https://example.com/users/carol", &to, b"{}"));
            assert_eq!(
                err,
                Err(SignError::NoKey {
                    actor: "https://example.com/users/carol".to_owned()
                })
            );
            assert!(err.unwrap_err().to_string().contains("users/carol"));
        }

        #[test]
        fn keys_file_with_inline_and_relative_file_keys() {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir(dir.path().join("keys")).unwrap();
            std::fs::write(dir.path().join("keys/bob.pem"), BOB_PRIVATE_PKCS1).unwrap();
            let file = dir.path().join("signing.toml");
            std::fs::write(
                &file,
                format!(
                    "[actors.\"{ALICE}\"]\nkey_id = \"{ALICE}#main-key\"\n\
                     private_key_pem = \"\"\"\n{ALICE_PRIVATE_PKCS8}\"\"\"\n\n\
                     [actors.\"{BOB}\"]\nkey_id = \"{BOB}#main-key\"\n\
                     private_key_file = \"keys/bob.pem\"\n"
                ),
            )
            .unwrap();
            let s = HttpSignatures::from_keys_file(&file).unwrap();
            assert_eq!(s.actors().collect::<Vec<_>>(), [ALICE, BOB]);
            assert_eq!(s.key(BOB).unwrap().key_id(), format!("{BOB}#main-key"));
            let debug = format!("{s:?}");
            assert!(
                debug.contains("#main-key") && !debug.contains("PRIVATE"),
                "{debug}"
            );
        }

        #[test]
        fn every_bad_entry_of_a_keys_file_is_named() {
            let short = include_str!("../../test-support/keys/short1024.pkcs1.pem");
            let text = format!(
                "[actors.a]\nprivate_key_pem = \"x\"\n\
                 [actors.b]\nkey_id = \"k\"\n\
                 [actors.c]\nkey_id = \"k\"\nprivate_key_pem = \"\"\"{ALICE_PUBLIC}\"\"\"\n\
                 [actors.d]\nkey_id = \"k\"\nprivate_key_file = \"missing.pem\"\n\
                 [actors.e]\nkey_id = \"k\"\nprivate_key_pem = \"\"\"{short}\"\"\"\n\
                 [actors.f]\nkey_id = \"k\"\nprivate_key_pem = \"x\"\nprivate_key_file = \"y\"\n\
                 [actors.g]\nkey_id = \"k\"\nprivate_key = \"x\"\n\
                 [actors.h]\nkey_id = 'a\"b'\nprivate_key_pem = \"\"\"{ALICE_PRIVATE_PKCS8}\"\"\"\n\
                 [actors.i]\nkey_id = \"k\"\nprivate_key_pem = \"not a key\"\n\
                 [actors.ok]\nkey_id = \"k\"\nprivate_key_pem = \"\"\"{ALICE_PRIVATE_PKCS8}\"\"\"\n"
            );
            let dir = tempfile::tempdir().unwrap();
            let err =
                HttpSignatures::from_toml(&text, Path::new("keys.toml"), dir.path()).unwrap_err();
            let KeysFileError::Entries { errors, .. } = &err else {
                panic!("{err}")
            };
            let actors: Vec<_> = errors.iter().map(|(a, _)| a.as_str()).collect();
            assert_eq!(actors, ["a", "b", "c", "d", "e", "f", "g", "h", "i"]);
            let why = |a: &str| &errors.iter().find(|(x, _)| x == a).unwrap().1;
            assert!(why("a").contains("key_id is missing"));
            assert!(why("b").contains("missing"));
            assert!(why("c").contains("public key"));
            assert!(why("d").contains("missing.pem"));
            assert!(why("e").contains("1024 bits"));
            assert!(why("f").contains("not both"));
            assert!(why("g").contains("unknown key \"private_key\""));
            assert!(why("h").contains("double quote"));
            assert!(why("i").contains("no PEM private key"));
            let text = err.to_string();
            assert!(text.starts_with("the signing keys file keys.toml has bad entries:"));
            assert!(
                text.contains("[actors.\"e\"]: the RSA key has 1024 bits"),
                "{text}"
            );
        }

        #[test]
        fn a_keys_file_of_the_wrong_shape_is_refused() {
            let p = Path::new("k.toml");
            let d = Path::new(".");
            let syntax = |t: &str| match HttpSignatures::from_toml(t, p, d) {
                Err(KeysFileError::Syntax { message, .. }) => message,
                other => panic!("{other:?}"),
            };
            assert!(syntax("[actors.a\n").contains("line 1"));
            assert!(syntax("actor = 1\n").contains("unknown key \"actor\""));
            assert!(syntax("actors = 1\n").contains("[actors."));
            for empty in ["", "[actors]\n"] {
                assert!(matches!(
                    HttpSignatures::from_toml(empty, p, d),
                    Err(KeysFileError::NoActors { .. })
                ));
            }
            let missing = HttpSignatures::from_keys_file("/nonexistent/keys.toml").unwrap_err();
            assert!(
                missing.to_string().contains("/nonexistent/keys.toml"),
                "{missing}"
            );
        }

        #[test]
        fn key_errors() {
            assert_eq!(
                ActorKey::from_pem(" ", ALICE_PRIVATE_PKCS8).unwrap_err(),
                KeyError::EmptyKeyId
            );
            assert_eq!(
                ActorKey::from_pem("k\n", ALICE_PRIVATE_PKCS8).unwrap_err(),
                KeyError::BadKeyId
            );
            assert_eq!(
                ActorKey::from_pem(
                    "k",
                    "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----"
                )
                .unwrap_err(),
                KeyError::Encrypted
            );
            assert!(matches!(
                ActorKey::from_pem("k", &ALICE_PRIVATE_PKCS8.replace("MII", "XII")),
                Err(KeyError::Invalid(_))
            ));
        }

        /// One call per actor: `from_pem` and `with_key` read the key as `ActorKey::from_pem`
        /// does, take the actor in any form, and sign as keys inserted one by one do.
        #[test]
        fn keys_by_value_in_one_call_each() {
            const CAROL: &str = "https://example.com/users/carol";
            let bob = ActorId::new(BOB);
            let carol = String::from(CAROL);
            let s =
                HttpSignatures::from_pem(ALICE, format!("{ALICE}#main-key"), ALICE_PRIVATE_PKCS8)
                    .unwrap()
                    .with_key(&bob, format!("{BOB}#main-key"), BOB_PRIVATE_PKCS1)
                    .unwrap()
                    .with_key(&carol, "carol-key", CAROL_ED25519_PRIVATE)
                    .unwrap();
            assert_eq!(s.actors().collect::<Vec<_>>(), [ALICE, BOB, CAROL]);
            assert_eq!(s.key(BOB).unwrap().key_id(), format!("{BOB}#main-key"));
            assert_eq!(s.key(CAROL).unwrap().algorithm(), KeyAlgorithm::Ed25519);
            let url = Recipient::parse("https://b.example/inbox").unwrap();
            for actor in [ALICE, BOB] {
                assert_eq!(
                    s.sign(&req(actor, &url, b"{}")).unwrap(),
                    signer().sign(&req(actor, &url, b"{}")).unwrap(),
                    "{actor}"
                );
            }
            // A key replaced by a later one for the same actor.
            let s = s.with_key(BOB, "bob-2", BOB_PRIVATE_PKCS1).unwrap();
            assert_eq!(s.key(BOB).unwrap().key_id(), "bob-2");
            // A refused key is the key's error.
            assert_eq!(
                HttpSignatures::from_pem(ALICE, " ", ALICE_PRIVATE_PKCS8).unwrap_err(),
                KeyError::EmptyKeyId
            );
            assert!(matches!(
                s.with_key("dave", "k", P256_PRIVATE_PKCS8),
                Err(KeyError::Unsupported { .. })
            ));
        }

        #[test]
        fn an_ed25519_key_signs_cavage_as_hs2019() {
            use ed25519_dalek::Verifier as _;
            use ed25519_dalek::pkcs8::DecodePublicKey as _;
            const CAROL: &str = "https://example.com/users/carol";
            let key = ActorKey::from_pem(format!("{CAROL}#key"), CAROL_ED25519_PRIVATE).unwrap();
            assert_eq!(key.algorithm(), KeyAlgorithm::Ed25519);
            assert_eq!(key.algorithm().cavage_algorithm(), "hs2019");
            assert!(format!("{key:?}").contains("Ed25519"));
            let mut s = HttpSignatures::new();
            s.insert(CAROL, key);
            let url = Recipient::parse("http://[::1]:8080/i").unwrap();
            let h = s.sign(&req(CAROL, &url, b"{}")).unwrap();
            let names: Vec<_> = h.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, ["Date", "Digest", "Signature"]);
            let prefix = format!(
                "keyId=\"{CAROL}#key\",algorithm=\"hs2019\",\
                 headers=\"(request-target) host date digest\",signature=\""
            );
            let b64 = h[2]
                .1
                .strip_prefix(&prefix)
                .and_then(|r| r.strip_suffix('"'))
                .unwrap_or_else(|| panic!("{}", h[2].1));
            let sig = ed25519_dalek::Signature::from_slice(&BASE64.decode(b64).unwrap()).unwrap();
            let public =
                ed25519_dalek::VerifyingKey::from_public_key_pem(CAROL_ED25519_PUBLIC).unwrap();
            let string = format!(
                "(request-target): post /i\nhost: [::1]:8080\ndate: {}\ndigest: {}",
                h[0].1, h[1].1
            );
            assert!(public.verify(string.as_bytes(), &sig).is_ok());
            assert!(
                public
                    .verify(string.replace("/i", "/j").as_bytes(), &sig)
                    .is_err()
            );
        }

        #[test]
        fn the_key_tells_its_algorithm() {
            for (pem, alg) in [
                (ALICE_PRIVATE_PKCS8, KeyAlgorithm::Rsa),
                (BOB_PRIVATE_PKCS1, KeyAlgorithm::Rsa),
                (CAROL_ED25519_PRIVATE, KeyAlgorithm::Ed25519),
            ] {
                assert_eq!(ActorKey::from_pem("k", pem).unwrap().algorithm(), alg);
            }
            assert_eq!(KeyAlgorithm::Rsa.rfc9421_alg(), "rsa-v1_5-sha256");
            assert_eq!(KeyAlgorithm::Ed25519.rfc9421_alg(), "ed25519");
            assert_eq!(KeyAlgorithm::Rsa.cavage_algorithm(), "rsa-sha256");
            let err = ActorKey::from_pem("k", P256_PRIVATE_PKCS8).unwrap_err();
            assert_eq!(
                err,
                KeyError::Unsupported {
                    oid: "1.2.840.10045.2.1".to_owned()
                }
            );
            assert!(err.to_string().contains("not RSA or Ed25519"), "{err}");
            // A PKCS#8 block whose content is no key at all, and an Ed25519 key cut short.
            for bad in [
                "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----",
                "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIIVMcfUANtQiOi/ngTDljDyr\n\
                 -----END PRIVATE KEY-----",
                "-----BEGIN PRIVATE KEY-----\n\u{e9}\n-----END PRIVATE KEY-----",
            ] {
                assert!(
                    matches!(ActorKey::from_pem("k", bad), Err(KeyError::Invalid(_))),
                    "{bad}"
                );
            }
        }

        #[test]
        fn a_keys_file_takes_ed25519_keys_as_they_are() {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("carol.pem"), CAROL_ED25519_PRIVATE).unwrap();
            let text = format!(
                "[actors.carol]\nkey_id = \"https://example.com/users/carol#key\"\n\
                 private_key_file = \"carol.pem\"\n\
                 [actors.alice]\nkey_id = \"k\"\nprivate_key_pem = \"\"\"{ALICE_PRIVATE_PKCS8}\"\"\"\n\
                 [actors.ec]\nkey_id = \"k\"\nprivate_key_pem = \"\"\"{P256_PRIVATE_PKCS8}\"\"\"\n"
            );
            let err =
                HttpSignatures::from_toml(&text, Path::new("keys.toml"), dir.path()).unwrap_err();
            assert!(
                err.to_string().contains(
                    "[actors.\"ec\"]: the PKCS#8 key's algorithm (OID 1.2.840.10045.2.1)"
                ),
                "{err}"
            );
            let text = text.split("[actors.ec]").next().unwrap();
            let s = HttpSignatures::from_toml(text, Path::new("keys.toml"), dir.path()).unwrap();
            assert_eq!(s.key("carol").unwrap().algorithm(), KeyAlgorithm::Ed25519);
            assert_eq!(s.key("alice").unwrap().algorithm(), KeyAlgorithm::Rsa);
        }

        #[test]
        fn the_spec_picks_the_scheme_and_has_a_code() {
            let s = signer();
            assert!(s.http_signatures());
            assert!(!StandardWebhooks::new(&b"k"[..]).unwrap().http_signatures());
            let url = Recipient::parse("https://inbox.example/inbox").unwrap();
            let mut r = req(ALICE, &url, b"{}");
            let names =
                |h: Vec<(String, String)>| h.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
            assert_eq!(names(s.sign(&r).unwrap()), ["Date", "Digest", "Signature"]);
            r.spec = SignatureSpec::Rfc9421;
            assert_eq!(
                names(s.sign(&r).unwrap()),
                ["Content-Digest", "Signature-Input", "Signature"]
            );
            // A challenge means nothing to draft-cavage.
            r.spec = SignatureSpec::Cavage;
            r.challenge = Some("sig1=(\"date\")");
            assert_eq!(names(s.sign(&r).unwrap()), ["Date", "Digest", "Signature"]);
            for spec in [SignatureSpec::Rfc9421, SignatureSpec::Cavage] {
                assert_eq!(SignatureSpec::from_code(spec.as_str()), Some(spec));
            }
            assert_eq!(SignatureSpec::Rfc9421.as_str(), "rfc9421");
            assert_eq!(SignatureSpec::Cavage.as_str(), "cavage");
            for other in ["", "RFC9421", "auto", "cavage "] {
                assert_eq!(SignatureSpec::from_code(other), None);
            }
        }
    }
}
