//! RFC 9421 HTTP Message Signatures for [`HttpSignatures`](super::HttpSignatures): the
//! covered components and their values, the signature base (§2.5), `Content-Digest`
//! (RFC 9530) and the `Accept-Signature` challenge (§5.1).
//!
//! Structured fields (RFC 8941) are read and written with the `sfv` crate: parsing a
//! challenge and serialising `Signature-Input` and `Signature` (escapes, parameters, byte
//! sequences) is where hand-written code drifts from the grammar. The signature base itself
//! is assembled here, a line per component: the crates that build one (httpsig) build it
//! from their own request type and keys, and one of them is the tests' independent
//! verifier, which it could not be if the signer used it too.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sfv::{
    BareItem, DictSerializer, Dictionary, Integer, KeyRef, ListEntry, ListSerializer, Parser,
    RefBareItem, StringRef,
};
use sha2::{Digest as _, Sha256};

use super::{ActorKey, SignError, SignRequest, unix_secs};

/// The label of a signature made without a challenge.
const LABEL: &str = "sig1";

/// The components a signature made without a challenge covers, in order.
const DEFAULT_COMPONENTS: [Component; 3] = [
    Component::Method,
    Component::TargetUri,
    Component::ContentDigest,
];

/// How long after `created` a signature expires, when a challenge asks for `expires`. Every
/// attempt is signed afresh, so a signature only has to live as long as one request takes.
const EXPIRES_AFTER_SECS: u64 = 300;

/// A component the signer can cover: one whose value on the wire it knows exactly.
///
/// The derived components come from the recipient URL the request is sent to; the fields
/// are the ones the signer sets itself (`Content-Digest`, `Date`), the ones the request
/// builder sets from what the signer is given (`Content-Type`, `Idempotency-Key`), and the
/// two the transports add: `Content-Length` (both send the body's length, but for an empty
/// body only ureq sends `Content-Length: 0`, hyper sends none, so it is covered only for a
/// body that is not empty) and `Host` (the URL's host, with `:port` when the port is not the
/// scheme's default, the value draft-cavage signing relies on too). The request's other
/// headers (`User-Agent`, `Accept`, a row's own) are not known to the signer: a challenge
/// asking for one is not honoured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Component {
    Method,
    TargetUri,
    Authority,
    Scheme,
    Path,
    Query,
    RequestTarget,
    ContentDigest,
    ContentType,
    ContentLength,
    Date,
    Host,
    IdempotencyKey,
}

impl Component {
    const ALL: [Component; 13] = [
        Component::Method,
        Component::TargetUri,
        Component::Authority,
        Component::Scheme,
        Component::Path,
        Component::Query,
        Component::RequestTarget,
        Component::ContentDigest,
        Component::ContentType,
        Component::ContentLength,
        Component::Date,
        Component::Host,
        Component::IdempotencyKey,
    ];

    /// The component identifier (RFC 9421 §2: field names are lower case).
    fn name(self) -> &'static str {
        match self {
            Component::Method => "@method",
            Component::TargetUri => "@target-uri",
            Component::Authority => "@authority",
            Component::Scheme => "@scheme",
            Component::Path => "@path",
            Component::Query => "@query",
            Component::RequestTarget => "@request-target",
            Component::ContentDigest => "content-digest",
            Component::ContentType => "content-type",
            Component::ContentLength => "content-length",
            Component::Date => "date",
            Component::Host => "host",
            Component::IdempotencyKey => "idempotency-key",
        }
    }

    fn from_name(name: &str) -> Option<Component> {
        Component::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The component's value in this request (§2.1, §2.2).
    fn value(self, req: &SignRequest<'_>, date: &str, digest: &str) -> String {
        let url = req.recipient;
        let target = url.path_and_query();
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        match self {
            Component::Method => "POST".to_owned(),
            // The canonical URL is scheme://host[:port]/path[?query], the port only when
            // not the default: the URI the request line and Host header make up.
            Component::TargetUri => url.as_str().to_owned(),
            Component::Authority | Component::Host => authority(req),
            Component::Scheme => url.scheme().as_str().to_owned(),
            Component::Path => path.to_owned(),
            Component::Query => format!("?{query}"),
            Component::RequestTarget => target.to_owned(),
            Component::ContentDigest => digest.to_owned(),
            Component::ContentType => req.content_type.trim().to_owned(),
            Component::ContentLength => req.body.len().to_string(),
            Component::Date => date.to_owned(),
            Component::IdempotencyKey => req.idempotency_key.to_owned(),
        }
    }
}

/// The recipient's host, with `:port` when it is not the scheme's default: `@authority`,
/// and the `Host` header the clients send.
fn authority(req: &SignRequest<'_>) -> String {
    let url = req.recipient;
    if url.port() == url.scheme().default_port() {
        url.host().to_string()
    } else {
        format!("{}:{}", url.host(), url.port())
    }
}

/// The `Content-Digest` value of `body` (RFC 9530): `sha-256=:<base64 of its SHA-256>:`.
fn content_digest(body: &[u8]) -> String {
    format!("sha-256=:{}:", BASE64.encode(Sha256::digest(body)))
}

/// What one signature covers and carries.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Plan {
    /// The label, an RFC 8941 key.
    label: String,
    components: Vec<Component>,
    /// Whether to send `expires` (`created` + [`EXPIRES_AFTER_SECS`]).
    expires: bool,
    nonce: Option<String>,
    tag: Option<String>,
}

impl Plan {
    /// The signature made without a challenge.
    fn default_plan() -> Plan {
        Plan {
            label: LABEL.to_owned(),
            components: DEFAULT_COMPONENTS.to_vec(),
            expires: false,
            nonce: None,
            tag: None,
        }
    }

    /// The signature an `Accept-Signature` value asks for (§5.1), if this key can make it:
    /// the first member that is an inner list of components this signer can cover, with
    /// no component parameters, and parameters among `created`, `expires` (both without a
    /// value), `nonce`, `tag`, `keyid` and `alg` (strings), a `keyid` or `alg` naming this
    /// key. `body_len` is the request body's length (an empty body has no `Content-Length`
    /// to cover).
    ///
    /// # Errors
    /// Why no member can be honoured (the first member's reason), in words.
    fn from_challenge(challenge: &str, key: &ActorKey, body_len: usize) -> Result<Plan, String> {
        let dict: Dictionary = Parser::new(challenge)
            .parse_dictionary()
            .map_err(|e| format!("not a structured-field dictionary: {e}"))?;
        let mut first_error = None;
        for (label, entry) in &dict {
            let planned = match entry {
                ListEntry::InnerList(list) => member_plan(label.as_str(), list, key, body_len),
                ListEntry::Item(_) => Err("not an inner list of components".to_owned()),
            };
            match planned {
                Ok(plan) => return Ok(plan),
                Err(e) => {
                    first_error.get_or_insert_with(|| format!("{label}: {e}"));
                }
            }
        }
        Err(first_error.unwrap_or_else(|| "no member".to_owned()))
    }
}

fn member_plan(
    label: &str,
    list: &sfv::InnerList,
    key: &ActorKey,
    body_len: usize,
) -> Result<Plan, String> {
    let mut components = Vec::with_capacity(list.items.len());
    for item in &list.items {
        let BareItem::String(name) = &item.bare_item else {
            return Err("a component identifier is not a string".to_owned());
        };
        let name = name.as_str();
        if !item.params.is_empty() {
            return Err(format!(
                "component parameters (\"{name}\";…) are not supported"
            ));
        }
        let c = Component::from_name(name).ok_or_else(|| {
            format!("cannot cover \"{name}\": not a component this signer knows the value of")
        })?;
        if c == Component::ContentLength && body_len == 0 {
            return Err(
                "cannot cover \"content-length\" of an empty body: not every HTTP \
                        client sends one (hyper does not)"
                    .to_owned(),
            );
        }
        if components.contains(&c) {
            return Err(format!("\"{name}\" is asked for twice"));
        }
        components.push(c);
    }
    let mut plan = Plan {
        label: label.to_owned(),
        components,
        expires: false,
        nonce: None,
        tag: None,
    };
    for (name, value) in &list.params {
        match (name.as_str(), value) {
            // `created` is always sent: asking for it changes nothing.
            ("created", BareItem::Boolean(_)) => {}
            ("expires", BareItem::Boolean(asked)) => plan.expires = *asked,
            ("nonce", BareItem::String(s)) => plan.nonce = Some(s.as_str().to_owned()),
            ("tag", BareItem::String(s)) => plan.tag = Some(s.as_str().to_owned()),
            ("keyid", BareItem::String(s)) if s.as_str() == key.key_id() => {}
            ("keyid", BareItem::String(s)) => {
                return Err(format!(
                    "asks for keyid {:?}, not this actor's key",
                    s.as_str()
                ));
            }
            ("alg", BareItem::String(s)) if s.as_str() == key.algorithm().rfc9421_alg() => {}
            ("alg", BareItem::String(s)) => {
                return Err(format!(
                    "asks for alg {:?}; this actor's key signs {}",
                    s.as_str(),
                    key.algorithm().rfc9421_alg()
                ));
            }
            (other, _) => {
                return Err(format!(
                    "parameter {other:?} is unknown or has a value of the wrong type"
                ));
            }
        }
    }
    Ok(plan)
}

/// The signature parameters of a signature (§2.3), `keyid` always among them.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Params<'a> {
    created: u64,
    expires: Option<u64>,
    keyid: &'a str,
    alg: Option<&'a str>,
    nonce: Option<&'a str>,
    tag: Option<&'a str>,
}

/// The `@signature-params` value: the inner list of component identifiers with the
/// parameters, serialised as RFC 8941 writes it (the same text `Signature-Input` carries
/// after its label).
///
/// The parameters go in the order `created`, `expires`, `nonce`, `alg`, `keyid`, `tag`.
/// RFC 9421 §2.3 has a verifier sign over the `Signature-Input` text it received, in
/// whatever order; some verifiers instead write the parameters again in an order of their
/// own (httpsig, in this one), and a signature in another order fails with them. Sent in
/// this order it verifies with both.
///
/// # Errors
/// A string (a component name, `keyid`, `nonce`, `tag`) that a structured field cannot
/// carry, or a time past RFC 8941's integers.
fn signature_params(names: &[&str], p: &Params<'_>) -> Result<String, String> {
    fn string<'v>(what: &str, v: &'v str) -> Result<&'v StringRef, String> {
        StringRef::from_str(v)
            .map_err(|e| format!("{what} {v:?} cannot be sent in a structured field: {e}"))
    }
    fn int(what: &str, t: u64) -> Result<Integer, String> {
        Integer::try_from(t).map_err(|_| format!("{what} {t} is past RFC 8941 integers"))
    }
    let names = names
        .iter()
        .map(|n| string("the component", n))
        .collect::<Result<Vec<_>, _>>()?;
    let created = int("created", p.created)?;
    let expires = p.expires.map(|t| int("expires", t)).transpose()?;
    let mut strings = Vec::with_capacity(4);
    for (name, v) in [
        ("nonce", p.nonce),
        ("alg", p.alg),
        ("keyid", Some(p.keyid)),
        ("tag", p.tag),
    ] {
        if let Some(v) = v {
            strings.push((KeyRef::constant(name), string(name, v)?));
        }
    }

    let mut ser = ListSerializer::new();
    {
        let mut list = ser.inner_list();
        for name in names {
            let _ = list.bare_item(RefBareItem::String(name));
        }
        let mut params = list
            .finish()
            .parameter(KeyRef::constant("created"), RefBareItem::Integer(created));
        if let Some(expires) = expires {
            params = params.parameter(KeyRef::constant("expires"), RefBareItem::Integer(expires));
        }
        for (name, v) in strings {
            params = params.parameter(name, RefBareItem::String(v));
        }
    }
    ser.finish()
        .ok_or_else(|| "no signature parameters were written".to_owned())
}

/// The signature base (§2.5): a line `"<component>": <value>` per covered component, in
/// order, then `"@signature-params": <params>`, joined by `\n` with none at the end.
fn signature_base(lines: &[(&str, String)], params: &str) -> String {
    let mut base = String::new();
    for (name, value) in lines {
        base.push('"');
        base.push_str(name);
        base.push_str("\": ");
        base.push_str(value);
        base.push('\n');
    }
    base.push_str("\"@signature-params\": ");
    base.push_str(params);
    base
}

/// Whether `challenge` can be signed with `key` as it asks, for a `body_len`-byte body.
pub(super) fn honours(challenge: &str, key: &ActorKey, body_len: usize) -> bool {
    Plan::from_challenge(challenge, key, body_len).is_ok()
}

/// The headers that sign `req` with `key` under RFC 9421, in order: `Date` (only when the
/// signature covers it), `Content-Digest`, `Signature-Input`, `Signature`.
///
/// # Errors
/// [`SignError::Failed`] when a value cannot be written in a structured field (none of the
/// key ids [`ActorKey`] accepts) or the private-key operation fails.
pub(super) fn headers(
    key: &ActorKey,
    req: &SignRequest<'_>,
) -> Result<Vec<(String, String)>, SignError> {
    let plan = match req.challenge {
        None => Plan::default_plan(),
        Some(challenge) => {
            Plan::from_challenge(challenge, key, req.body.len()).unwrap_or_else(|why| {
                tracing::debug!(
                    actor = req.actor,
                    unit = %req.unit,
                    recipient = req.recipient.as_str(),
                    reason = %why,
                    "Accept-Signature not honoured: signing the default components"
                );
                Plan::default_plan()
            })
        }
    };
    sign_plan(key, req, &plan)
}

/// The headers of the signature `plan` describes.
fn sign_plan(
    key: &ActorKey,
    req: &SignRequest<'_>,
    plan: &Plan,
) -> Result<Vec<(String, String)>, SignError> {
    let created = unix_secs(req.at);
    let date = httpdate::fmt_http_date(req.at);
    let digest = content_digest(req.body);
    let lines: Vec<(&str, String)> = plan
        .components
        .iter()
        .map(|c| (c.name(), c.value(req, &date, &digest)))
        .collect();
    let names: Vec<&str> = lines.iter().map(|(n, _)| *n).collect();
    let params = signature_params(
        &names,
        &Params {
            created,
            expires: plan
                .expires
                .then(|| created.saturating_add(EXPIRES_AFTER_SECS)),
            keyid: key.key_id(),
            alg: Some(key.algorithm().rfc9421_alg()),
            nonce: plan.nonce.as_deref(),
            tag: plan.tag.as_deref(),
        },
    )
    .map_err(SignError::Failed)?;
    let base = signature_base(&lines, &params);
    let signature = key.sign_bytes(base.as_bytes())?;
    let label = KeyRef::from_str(&plan.label)
        .map_err(|e| SignError::Failed(format!("label {:?}: {e}", plan.label)))?;

    let input = format!("{}={params}", label.as_str());
    let mut ser = DictSerializer::new();
    let _ = ser.bare_item(label, RefBareItem::ByteSequence(&signature));
    let signature = ser
        .finish()
        .ok_or_else(|| SignError::Failed("no Signature member was written".to_owned()))?;

    let mut out = Vec::with_capacity(4);
    if plan.components.contains(&Component::Date) {
        out.push(("Date".to_owned(), date));
    }
    out.push(("Content-Digest".to_owned(), digest));
    out.push(("Signature-Input".to_owned(), input));
    out.push(("Signature".to_owned(), signature));
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failing unwrap is a failing test
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use ed25519_dalek::pkcs8::DecodePublicKey as _;
    use ed25519_dalek::{Signature as EdSignature, Verifier as _, VerifyingKey as EdVerifyingKey};
    use outbox_lanes_core::UnitId;
    use outbox_lanes_core::policy::Recipient;
    use outbox_lanes_test_support::signatures::{
        ALICE_PRIVATE_PKCS8, ALICE_PUBLIC, CAROL_ED25519_PRIVATE, CAROL_ED25519_PUBLIC,
    };
    use rsa::pkcs1v15::{Signature as RsaSignature, VerifyingKey as RsaVerifyingKey};

    use super::*;
    use crate::sign::{HttpSignatures, SignatureSpec, Signer as _};

    /// RFC 9421 Appendix B.1.4, test-key-ed25519.
    const RFC_ED25519_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\n\
        MC4CAQAwBQYDK2VwBCIEIJ+DYvh6SEqVTm50DFtMDoQikTmiCqirVv9mWG9qfSnF\n\
        -----END PRIVATE KEY-----\n";
    const RFC_ED25519_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\n\
        MCowBQYDK2VwAyEAJrQLj5P/89iXES9+vFgrIy29clF9CC/oPPsw3c5D0bs=\n\
        -----END PUBLIC KEY-----\n";
    /// RFC 9421 Appendix B.2.6: the signature base and signature over the B.2 request.
    const B26_BASE: &str = "\"date\": Tue, 20 Apr 2021 02:07:55 GMT\n\
        \"@method\": POST\n\
        \"@path\": /foo\n\
        \"@authority\": example.com\n\
        \"content-type\": application/json\n\
        \"content-length\": 18\n\
        \"@signature-params\": (\"date\" \"@method\" \"@path\" \"@authority\" \
        \"content-type\" \"content-length\");created=1618884473;keyid=\"test-key-ed25519\"";
    const B26_SIGNATURE: &str =
        "wqcAqbmYJ2ji2glfAMaRy4gruYYnx2nEFN2HN6jrnDnQCK1u02Gb04v9EDgwUPiu4A0w6vuQv5lIp5WPpBKRCw==";
    /// The body of the RFC's B.2 request.
    const B2_BODY: &[u8] = br#"{"hello": "world"}"#;

    const ALICE: &str = "https://example.com/users/alice";
    const CAROL: &str = "https://example.com/users/carol";

    fn signer() -> HttpSignatures {
        let mut s = HttpSignatures::new();
        s.insert(
            ALICE,
            ActorKey::from_pem(format!("{ALICE}#main-key"), ALICE_PRIVATE_PKCS8).unwrap(),
        );
        s.insert(
            CAROL,
            ActorKey::from_pem(format!("{CAROL}#ed25519-key"), CAROL_ED25519_PRIVATE).unwrap(),
        );
        s.insert(
            "rfc",
            ActorKey::from_pem("test-key-ed25519", RFC_ED25519_PRIVATE).unwrap(),
        );
        s
    }

    fn req<'a>(
        actor: &'a str,
        to: &'a Recipient,
        body: &'a [u8],
        at_secs: u64,
        challenge: Option<&'a str>,
    ) -> SignRequest<'a> {
        SignRequest {
            actor,
            unit: UnitId(9),
            idempotency_key: "0123abcd-9",
            recipient: to,
            body,
            content_type: "application/json",
            at: UNIX_EPOCH + Duration::from_millis(at_secs * 1000 + 700),
            attempt: 1,
            spec: SignatureSpec::Rfc9421,
            challenge,
        }
    }

    fn get<'h>(headers: &'h [(String, String)], name: &str) -> &'h str {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no {name} in {headers:?}"))
    }

    /// The signature bytes of `label` in a `Signature` value, read with sfv.
    fn signature_of(header: &str, label: &str) -> Vec<u8> {
        let dict: Dictionary = Parser::new(header).parse_dictionary().unwrap();
        match dict.get(label) {
            Some(ListEntry::Item(item)) => match &item.bare_item {
                BareItem::ByteSequence(b) => b.clone(),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    fn ed25519_verifies(public: &str, base: &str, signature: &[u8]) -> bool {
        let key = EdVerifyingKey::from_public_key_pem(public).unwrap();
        let Ok(sig) = EdSignature::from_slice(signature) else {
            return false;
        };
        key.verify(base.as_bytes(), &sig).is_ok()
    }

    fn rsa_verifies(public: &str, base: &str, signature: &[u8]) -> bool {
        let key = rsa::RsaPublicKey::from_public_key_pem(public).unwrap();
        let sig = RsaSignature::try_from(signature).unwrap();
        RsaVerifyingKey::<rsa::sha2::Sha256>::new(key)
            .verify(base.as_bytes(), &sig)
            .is_ok()
    }

    /// RFC 9530's own example (§2, `{"hello": "world"}`), and the empty body; both checked
    /// with Python's hashlib on this machine.
    #[test]
    fn content_digest_is_rfc_9530_sha_256() {
        assert_eq!(
            content_digest(B2_BODY),
            "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:"
        );
        assert_eq!(
            content_digest(b""),
            "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:"
        );
    }

    /// The signature base and the (deterministic) Ed25519 signature of RFC 9421 B.2.6,
    /// byte for byte, from the component values of the RFC's B.2 request.
    #[test]
    fn reproduces_the_rfc_ed25519_vector() {
        let lines = [
            ("date", "Tue, 20 Apr 2021 02:07:55 GMT".to_owned()),
            ("@method", "POST".to_owned()),
            ("@path", "/foo".to_owned()),
            ("@authority", "example.com".to_owned()),
            ("content-type", "application/json".to_owned()),
            ("content-length", "18".to_owned()),
        ];
        let names: Vec<&str> = lines.iter().map(|(n, _)| *n).collect();
        let params = signature_params(
            &names,
            &Params {
                created: 1_618_884_473,
                expires: None,
                keyid: "test-key-ed25519",
                alg: None,
                nonce: None,
                tag: None,
            },
        )
        .unwrap();
        let base = signature_base(&lines, &params);
        assert_eq!(base, B26_BASE);
        let key = ActorKey::from_pem("test-key-ed25519", RFC_ED25519_PRIVATE).unwrap();
        assert_eq!(key.algorithm().rfc9421_alg(), "ed25519");
        let sig = key.sign_bytes(base.as_bytes()).unwrap();
        assert_eq!(BASE64.encode(&sig), B26_SIGNATURE);
        assert!(ed25519_verifies(RFC_ED25519_PUBLIC, &base, &sig));
    }

    /// The B.2.6 covered components asked for by a challenge, on the RFC's B.2 request: the
    /// values the signer derives from the request are the RFC's (the Date is the attempt's,
    /// `created` too, and `alg` is always sent).
    #[test]
    fn a_challenge_for_the_rfc_components_derives_the_rfc_values() {
        let s = signer();
        let to = Recipient::parse("https://example.com/foo?param=Value&Pet=dog").unwrap();
        let challenge = "sig-b26=(\"date\" \"@method\" \"@path\" \"@authority\" \
                         \"content-type\" \"content-length\");created;keyid=\"test-key-ed25519\"";
        // 02:07:55, the Date of the RFC's request.
        let h = s
            .sign(&req("rfc", &to, B2_BODY, 1_618_884_475, Some(challenge)))
            .unwrap();
        let names: Vec<&str> = h.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["Date", "Content-Digest", "Signature-Input", "Signature"]
        );
        assert_eq!(get(&h, "Date"), "Tue, 20 Apr 2021 02:07:55 GMT");
        let params = "(\"date\" \"@method\" \"@path\" \"@authority\" \"content-type\" \
                      \"content-length\");created=1618884475;alg=\"ed25519\";keyid=\"test-key-ed25519\"";
        assert_eq!(get(&h, "Signature-Input"), format!("sig-b26={params}"));
        let want_base = B26_BASE.replace(
            ";created=1618884473;keyid=\"test-key-ed25519\"",
            ";created=1618884475;alg=\"ed25519\";keyid=\"test-key-ed25519\"",
        );
        assert!(want_base.ends_with(params), "{want_base}");
        let sig = signature_of(get(&h, "Signature"), "sig-b26");
        assert!(ed25519_verifies(RFC_ED25519_PUBLIC, &want_base, &sig));
        assert!(!ed25519_verifies(
            RFC_ED25519_PUBLIC,
            &want_base.replace("/foo", "/bar"),
            &sig
        ));
    }

    /// The default signature, with the base written out by hand, for an RSA key (a port that
    /// is not the default, a query) and an Ed25519 key (default port).
    #[test]
    fn the_default_signature_covers_method_target_uri_and_content_digest() {
        let s = signer();
        let cases = [
            (
                ALICE,
                ALICE_PUBLIC,
                "https://inbox.example:8443/users/x/inbox?a=1",
                "rsa-v1_5-sha256",
                "#main-key",
            ),
            (
                CAROL,
                CAROL_ED25519_PUBLIC,
                "https://inbox.example/inbox",
                "ed25519",
                "#ed25519-key",
            ),
        ];
        for (actor, public, url, alg, fragment) in cases {
            let to = Recipient::parse(url).unwrap();
            let h = s
                .sign(&req(actor, &to, b"{}", 1_700_000_000, None))
                .unwrap();
            let names: Vec<&str> = h.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, ["Content-Digest", "Signature-Input", "Signature"]);
            let digest = "sha-256=:RBNvo1WzZ4oRRq0W9+hknpT7T8If536DEMBg9hyq/4o=:";
            assert_eq!(get(&h, "Content-Digest"), digest);
            let params = format!(
                "(\"@method\" \"@target-uri\" \"content-digest\");created=1700000000;\
                 alg=\"{alg}\";keyid=\"{actor}{fragment}\""
            );
            assert_eq!(get(&h, "Signature-Input"), format!("sig1={params}"));
            let base = format!(
                "\"@method\": POST\n\"@target-uri\": {url}\n\"content-digest\": {digest}\n\
                 \"@signature-params\": {params}"
            );
            let sig = signature_of(get(&h, "Signature"), "sig1");
            let verifies = |base: &str| {
                if alg == "ed25519" {
                    ed25519_verifies(public, base, &sig)
                } else {
                    rsa_verifies(public, base, &sig)
                }
            };
            assert!(verifies(&base), "{actor}");
            assert!(!verifies(&base.replace("RBNvo", "XBNvo")), "{actor}");
            // A later attempt is signed afresh.
            let later = s
                .sign(&req(actor, &to, b"{}", 1_700_000_009, None))
                .unwrap();
            assert!(get(&later, "Signature-Input").contains(";created=1700000009;"));
        }
    }

    #[test]
    fn a_challenge_sets_label_components_and_the_asked_parameters() {
        let s = signer();
        let to = Recipient::parse("http://127.0.0.1:8080/inbox?x=%2F").unwrap();
        let body = br#"{"n":1}"#;
        let challenge = "other=(\"user-agent\"), \
             proof=(\"@method\" \"@authority\" \"@scheme\" \"@path\" \"@query\" \
             \"@request-target\" \"host\" \"content-length\" \"content-type\" \
             \"idempotency-key\" \"content-digest\");created;expires;nonce=\"n-1\";\
             tag=\"app\";keyid=\"https://example.com/users/alice#main-key\";\
             alg=\"rsa-v1_5-sha256\"";
        let h = s
            .sign(&req(ALICE, &to, body, 1_700_000_000, Some(challenge)))
            .unwrap();
        let names: Vec<&str> = h.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["Content-Digest", "Signature-Input", "Signature"]);
        let params = "(\"@method\" \"@authority\" \"@scheme\" \"@path\" \"@query\" \
             \"@request-target\" \"host\" \"content-length\" \"content-type\" \
             \"idempotency-key\" \"content-digest\");created=1700000000;expires=1700000300;\
             nonce=\"n-1\";alg=\"rsa-v1_5-sha256\";\
             keyid=\"https://example.com/users/alice#main-key\";tag=\"app\"";
        assert_eq!(get(&h, "Signature-Input"), format!("proof={params}"));
        let digest = get(&h, "Content-Digest");
        let base = format!(
            "\"@method\": POST\n\"@authority\": 127.0.0.1:8080\n\"@scheme\": http\n\
             \"@path\": /inbox\n\"@query\": ?x=%2F\n\"@request-target\": /inbox?x=%2F\n\
             \"host\": 127.0.0.1:8080\n\"content-length\": 7\n\
             \"content-type\": application/json\n\"idempotency-key\": 0123abcd-9\n\
             \"content-digest\": {digest}\n\"@signature-params\": {params}"
        );
        let sig = signature_of(get(&h, "Signature"), "proof");
        assert!(rsa_verifies(ALICE_PUBLIC, &base, &sig));

        // No query: `@query` is `?`; the default port is not in `@authority`.
        let to = Recipient::parse("https://inbox.example:443/i").unwrap();
        let h = s
            .sign(&req(
                CAROL,
                &to,
                b"",
                1_700_000_000,
                Some("a=(\"@query\" \"@authority\" \"@target-uri\")"),
            ))
            .unwrap();
        let params = format!(
            "(\"@query\" \"@authority\" \"@target-uri\");created=1700000000;\
             alg=\"ed25519\";keyid=\"{CAROL}#ed25519-key\""
        );
        assert_eq!(get(&h, "Signature-Input"), format!("a={params}"));
        let base = format!(
            "\"@query\": ?\n\"@authority\": inbox.example\n\
             \"@target-uri\": https://inbox.example/i\n\"@signature-params\": {params}"
        );
        let sig = signature_of(get(&h, "Signature"), "a");
        assert!(ed25519_verifies(CAROL_ED25519_PUBLIC, &base, &sig));
    }

    /// Every challenge that cannot be honoured signs the default components, and says why.
    #[test]
    fn a_challenge_that_cannot_be_honoured_is_ignored() {
        let s = signer();
        let key = s.key(ALICE).unwrap();
        let to = Recipient::parse("https://inbox.example/inbox").unwrap();
        let default = s
            .sign(&req(ALICE, &to, b"{}", 1_700_000_000, None))
            .unwrap();
        for (challenge, why) in [
            ("", "no member"),
            ("sig1=(\"@method\"", "not a structured-field dictionary"),
            ("(((", "not a structured-field dictionary"),
            ("sig1=\"@method\"", "not an inner list"),
            ("sig1=(\"user-agent\")", "cannot cover \"user-agent\""),
            ("sig1=(\"accept\")", "cannot cover \"accept\""),
            ("sig1=(\"Content-Type\")", "cannot cover \"Content-Type\""),
            ("sig1=(\"@query-param\";name=\"a\")", "component parameters"),
            ("sig1=(\"content-digest\";sf)", "component parameters"),
            ("sig1=(method)", "not a string"),
            ("sig1=(\"@method\" \"@method\")", "asked for twice"),
            (
                "sig1=(\"@method\");alg=\"ed25519\"",
                "asks for alg \"ed25519\"",
            ),
            ("sig1=(\"@method\");alg=\"rsa-pss-sha512\"", "asks for alg"),
            (
                "sig1=(\"@method\");keyid=\"other\"",
                "asks for keyid \"other\"",
            ),
            ("sig1=(\"@method\");keyid=1", "wrong type"),
            ("sig1=(\"@method\");nonce=1", "wrong type"),
            ("sig1=(\"@method\");foo=\"bar\"", "\"foo\" is unknown"),
        ] {
            let err = Plan::from_challenge(challenge, key, 2).unwrap_err();
            assert!(err.contains(why), "{challenge:?}: {err}");
            let h = s
                .sign(&req(ALICE, &to, b"{}", 1_700_000_000, Some(challenge)))
                .unwrap();
            assert_eq!(get(&h, "Signature-Input"), get(&default, "Signature-Input"));
            assert_eq!(get(&h, "Content-Digest"), get(&default, "Content-Digest"));
        }
        // An empty body has no Content-Length to cover.
        let err = Plan::from_challenge("a=(\"content-length\")", key, 0).unwrap_err();
        assert!(err.contains("empty body"), "{err}");
        assert!(Plan::from_challenge("a=(\"content-length\")", key, 1).is_ok());
        // The first member that can be honoured is.
        let plan = Plan::from_challenge(
            "a=(\"user-agent\"), b=(\"@method\");keyid=\"other\", c=(\"@path\"), d=(\"@method\")",
            key,
            2,
        )
        .unwrap();
        assert_eq!(plan.label, "c");
        assert_eq!(plan.components, [Component::Path]);
    }

    #[test]
    fn a_value_a_structured_field_cannot_carry_is_refused() {
        let p = |keyid| Params {
            created: 1,
            expires: None,
            keyid,
            alg: None,
            nonce: None,
            tag: None,
        };
        let err = signature_params(&["@method"], &p("https://\u{e9}.example/k")).unwrap_err();
        assert!(err.contains("keyid"), "{err}");
        let err = signature_params(&["caf\u{e9}"], &p("k")).unwrap_err();
        assert!(err.contains("component"), "{err}");
        let mut late = p("k");
        late.created = 1_000_000_000_000_000;
        assert!(
            signature_params(&[], &late)
                .unwrap_err()
                .contains("created")
        );
        // An empty list of components is a valid signature (only its parameters signed).
        assert_eq!(
            signature_params(&[], &p("k")).unwrap(),
            "();created=1;keyid=\"k\""
        );
        // The keys a signer holds never carry such a key id.
        assert_eq!(
            ActorKey::from_pem("https://\u{e9}.example/k", ALICE_PRIVATE_PKCS8).unwrap_err(),
            crate::sign::KeyError::BadKeyId
        );
    }
}
