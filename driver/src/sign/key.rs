//! An actor's HTTP Signatures key ([`ActorKey`]): read from PEM (RSA in PKCS#1 or PKCS#8,
//! Ed25519 in PKCS#8), checked (an RSA key of at least [`MIN_KEY_BITS`]) and used to sign
//! the bytes the draft-cavage and RFC 9421 signers give it.

use core::fmt;

use ed25519_dalek::pkcs8::DecodePrivateKey as _;
use rsa::pkcs1::DecodeRsaPrivateKey as _;
use rsa::pkcs1v15::SigningKey;
use rsa::pkcs8::{PrivateKeyInfo, SecretDocument};
use rsa::signature::{RandomizedSigner as _, SignatureEncoding as _};
use rsa::traits::PublicKeyParts as _;
use rsa::{RsaPrivateKey, sha2 as rsa_sha2};

use super::SignError;

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
    pub(super) fn sign_bytes(&self, message: &[u8]) -> Result<Vec<u8>, SignError> {
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
