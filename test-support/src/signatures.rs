//! An HTTP Signatures verifier for tests, written from the spec (draft-cavage-http-signatures-12
//! §2, as Mastodon verifies it), independent of the signer under test, and the test keys.
//!
//! [`verify_http_signature`] rebuilds the signing string from the request as the recipient
//! **received** it (method, target, the header values on the wire), checks the `Digest`
//! against the received body, and verifies the RSASSA-PKCS1-v1_5 SHA-256 signature with the
//! actor's public key. Nothing of the sender's code is reused, so a signer that signs
//! something other than what it sends fails here.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use rsa::RsaPublicKey;
use rsa::pkcs1v15::{Signature, VerifyingKey};
use rsa::pkcs8::DecodePublicKey as _;
use rsa::sha2::{Digest as _, Sha256};
use rsa::signature::Verifier as _;

use crate::Recorded;

/// Alice's RSA-2048 private key, PKCS#8 PEM (`BEGIN PRIVATE KEY`). A test key only.
pub const ALICE_PRIVATE_PKCS8: &str = include_str!("../keys/alice.pkcs8.pem");
/// Alice's public key (SPKI PEM).
pub const ALICE_PUBLIC: &str = include_str!("../keys/alice.pub.pem");
/// Bob's RSA-2048 private key, PKCS#1 PEM (`BEGIN RSA PRIVATE KEY`). A test key only.
pub const BOB_PRIVATE_PKCS1: &str = include_str!("../keys/bob.pkcs1.pem");
/// Bob's public key (SPKI PEM).
pub const BOB_PUBLIC: &str = include_str!("../keys/bob.pub.pem");
/// Carol's Ed25519 private key, PKCS#8 PEM (`BEGIN PRIVATE KEY`). A test key only.
pub const CAROL_ED25519_PRIVATE: &str = include_str!("../keys/carol.ed25519.pem");
/// Carol's Ed25519 public key (SPKI PEM).
pub const CAROL_ED25519_PUBLIC: &str = include_str!("../keys/carol.ed25519.pub.pem");
/// A P-256 EC private key in PKCS#8 PEM: a key of an algorithm the signer refuses.
pub const P256_PRIVATE_PKCS8: &str = include_str!("../keys/p256.pkcs8.pem");

/// The parameters of a verified `Signature` header.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verified {
    /// `keyId`.
    pub key_id: String,
    /// `headers`: the covered headers, in order.
    pub headers: Vec<String>,
    /// The `Date` header received.
    pub date: String,
}

/// Verifies the draft-cavage `Signature` of a received request with `public_key_pem` (SPKI
/// PEM): `algorithm` is `rsa-sha256` (or absent, `hs2019` as Mastodon reads it), the
/// signature covers at least `(request-target) host date digest`, `Digest` is the SHA-256
/// of the received body, and the signature verifies over the signing string rebuilt from
/// the received request.
///
/// # Errors
/// Why the request does not verify, in words.
pub fn verify_http_signature(req: &Recorded, public_key_pem: &str) -> Result<Verified, String> {
    let header = req.header("signature").ok_or("no Signature header")?;
    let params = parse_params(header)?;
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let key_id = get("keyId").ok_or("no keyId")?.to_owned();
    match get("algorithm") {
        None | Some("rsa-sha256" | "hs2019") => {}
        Some(other) => return Err(format!("algorithm {other:?} is not rsa-sha256")),
    }
    // §2.1.3: without `headers`, only `date` is signed.
    let covered: Vec<String> = get("headers")
        .unwrap_or("date")
        .split(' ')
        .filter(|h| !h.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    for needed in ["(request-target)", "host", "date", "digest"] {
        if !covered.iter().any(|h| h == needed) {
            return Err(format!("{needed} is not covered by the signature"));
        }
    }
    let signature = BASE64
        .decode(get("signature").ok_or("no signature parameter")?)
        .map_err(|e| format!("signature is not base64: {e}"))?;

    // RFC 3230 Digest: the received body's SHA-256.
    let digest = req.header("digest").ok_or("no Digest header")?;
    let want = format!("SHA-256={}", BASE64.encode(Sha256::digest(&req.body)));
    if digest != want {
        return Err(format!(
            "Digest {digest:?} is not the received body's ({want})"
        ));
    }

    // §2.3: one line per covered header, `name: value`, joined by "\n".
    let mut lines = Vec::with_capacity(covered.len());
    for h in &covered {
        if h == "(request-target)" {
            lines.push(format!(
                "(request-target): {} {}",
                req.method.to_ascii_lowercase(),
                req.target
            ));
        } else {
            let values = req.header_all(h);
            if values.is_empty() {
                return Err(format!("the signed header {h} was not received"));
            }
            lines.push(format!("{h}: {}", values.join(", ")));
        }
    }
    let signing_string = lines.join("\n");

    let public = RsaPublicKey::from_public_key_pem(public_key_pem)
        .map_err(|e| format!("public key: {e}"))?;
    let signature =
        Signature::try_from(signature.as_slice()).map_err(|e| format!("signature: {e}"))?;
    VerifyingKey::<Sha256>::new(public)
        .verify(signing_string.as_bytes(), &signature)
        .map_err(|_| format!("the signature does not verify over {signing_string:?}"))?;
    Ok(Verified {
        key_id,
        headers: covered,
        date: req.header("date").unwrap_or_default().to_owned(),
    })
}

/// `k1="v1",k2="v2"` as (name, value) pairs; values are quoted strings without escapes
/// (draft-cavage §2.1).
fn parse_params(header: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut rest = header.trim();
    while !rest.is_empty() {
        let (name, after) = rest
            .split_once('=')
            .ok_or_else(|| format!("no `=` in {rest:?}"))?;
        let after = after
            .strip_prefix('"')
            .ok_or_else(|| format!("{name} is not a quoted string"))?;
        let (value, after) = after
            .split_once('"')
            .ok_or_else(|| format!("{name} has no closing quote"))?;
        out.push((name.trim().to_owned(), value.to_owned()));
        rest = after.trim_start().trim_start_matches(',').trim_start();
    }
    Ok(out)
}
