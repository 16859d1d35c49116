//! HTTP signature verifiers from crates we did not write (feature `verifiers`), for tests
//! of the requests a recipient really received.
//!
//! - [`rfc9421`]: RFC 9421 HTTP Message Signatures with `httpsig-hyper` (the httpsig-rs
//!   project): it rebuilds the signature base from the received request (the derived
//!   components from its method and URI, the fields from its headers), checks
//!   `Content-Digest` against the received body (RFC 9530), and verifies `rsa-v1_5-sha256`
//!   (with the `rsa` 0.10 crate) or `ed25519` (with `ed25519-compact`).
//! - [`cavage`]: draft-cavage-http-signatures-12 with `sigh` (an ActivityPub relay's
//!   signatures), over OpenSSL: `rsa-sha256`, and `hs2019` with an Ed25519 key.
//!
//! Both are handed the request as it arrived: its method, the URI
//! `http://<Host header><request target>` (what a server behind no proxy reconstructs), the
//! headers verbatim and the body. Neither shares code with the signer under test, nor its
//! crypto crates.

use bytes::Bytes;
use http_body_util::Full;
use httpsig_hyper::prelude::{AlgorithmName, PublicKey};
use httpsig_hyper::{
    MessageSignature as _, MessageSignatureReq as _, MessageSignatureReqSync as _,
    RequestContentDigest as _,
};
use rsa::sha2::{Digest as _, Sha256};
use sigh::Key as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::Recorded;

/// What an RFC 9421 signature that verified says about itself: its `Signature-Input`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rfc9421Verified {
    /// The label of the signature that verified.
    pub label: String,
    /// The covered components, in order, as written (`"@method"`, `"content-digest"`).
    pub components: Vec<String>,
    /// `created`.
    pub created: Option<u64>,
    /// `expires`.
    pub expires: Option<u64>,
    /// `keyid`.
    pub keyid: Option<String>,
    /// `alg`.
    pub alg: Option<String>,
    /// `nonce`.
    pub nonce: Option<String>,
    /// `tag`.
    pub tag: Option<String>,
}

/// The received request as an `http::Request`, its URI rebuilt from `Host` and the target.
fn to_http(req: &Recorded) -> Result<http::Request<Full<Bytes>>, String> {
    let host = req.header("host").ok_or("no Host header")?;
    let mut builder = http::Request::builder()
        .method(req.method.as_str())
        .uri(format!("http://{host}{}", req.target));
    for (name, value) in &req.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    builder
        .body(Full::new(Bytes::from(req.body.clone())))
        .map_err(|e| format!("not an HTTP request: {e}"))
}

/// Verifies the RFC 9421 signature of a received request with `public_key_pem` (SPKI PEM of
/// an RSA key, verified as `rsa-v1_5-sha256`, or of an Ed25519 key): `Content-Digest` must
/// be the received body's, and one signature must verify over the base rebuilt from the
/// received request. What it covers is returned for the caller to check.
///
/// # Errors
/// Why the request does not verify, in words.
pub fn rfc9421(req: &Recorded, public_key_pem: &str) -> Result<Rfc9421Verified, String> {
    let request = to_http(req)?;
    let request = futures_executor::block_on(request.verify_content_digest())
        .map_err(|e| format!("Content-Digest: {e}"))?;
    let key = PublicKey::from_pem(&AlgorithmName::Ed25519, public_key_pem)
        .or_else(|_| PublicKey::from_pem(&AlgorithmName::RsaV1_5Sha256, public_key_pem))
        .map_err(|e| format!("public key: {e}"))?;
    let label = request
        .verify_message_signature_sync(&key, None)
        .map_err(|e| {
            // The bases the verifier rebuilt, to compare with what was signed.
            let bases = request
                .extract_signatures()
                .map(|m| {
                    m.values()
                        .map(|(base, _)| format!("{:?}", base.to_string()))
                        .collect::<Vec<_>>()
                        .join("; ")
                })
                .unwrap_or_default();
            format!("signature: {e} (over {bases})")
        })?;
    let params = request
        .get_signature_params()
        .map_err(|e| format!("Signature-Input: {e}"))?;
    let p = params
        .get(&label)
        .ok_or_else(|| format!("no Signature-Input for {label}"))?;
    Ok(Rfc9421Verified {
        components: p
            .covered_components
            .iter()
            .map(ToString::to_string)
            .collect(),
        created: p.created,
        expires: p.expires,
        keyid: p.keyid.clone(),
        alg: p.alg.clone(),
        nonce: p.nonce.clone(),
        tag: p.tag.clone(),
        label,
    })
}

/// What a draft-cavage signature that verified says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CavageVerified {
    /// `keyId`.
    pub key_id: String,
    /// `headers`: the covered headers, in order.
    pub headers: Vec<String>,
    /// The `Date` header received.
    pub date: String,
}

/// Verifies the draft-cavage `Signature` of a received request with `public_key_pem` (SPKI
/// PEM, RSA or Ed25519) with `sigh`, which checks the signature over the signing string it
/// rebuilds from the received request; this function adds what `sigh` leaves to its caller:
/// the signature covers `(request-target) host date digest`, and `Digest` is the SHA-256
/// of the received body.
///
/// # Errors
/// Why the request does not verify, in words.
pub fn cavage(req: &Recorded, public_key_pem: &str) -> Result<CavageVerified, String> {
    let request = to_http(req)?;
    let signature = sigh::Signature::from(&request);
    let key_id = signature.key_id().ok_or("no keyId")?.to_owned();
    let headers: Vec<String> = signature
        .headers()
        .ok_or("no headers parameter")?
        .into_iter()
        .map(str::to_ascii_lowercase)
        .collect();
    for needed in ["(request-target)", "host", "date", "digest"] {
        if !headers.iter().any(|h| h == needed) {
            return Err(format!("{needed} is not covered by the signature"));
        }
    }
    let digest = req.header("digest").ok_or("no Digest header")?;
    let want = format!("SHA-256={}", BASE64.encode(Sha256::digest(&req.body)));
    if digest != want {
        return Err(format!(
            "Digest {digest:?} is not the received body's ({want})"
        ));
    }
    let key = sigh::PublicKey::from_pem(public_key_pem.as_bytes())
        .map_err(|e| format!("public key: {e}"))?;
    match signature.verify(&key) {
        Ok(true) => Ok(CavageVerified {
            key_id,
            headers,
            date: req.header("date").unwrap_or_default().to_owned(),
        }),
        Ok(false) => Err("the signature does not verify".to_owned()),
        Err(e) => Err(format!("signature: {e}")),
    }
}
