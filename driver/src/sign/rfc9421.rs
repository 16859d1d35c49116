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
pub(super) const LABEL: &str = "sig1";

/// The components a signature made without a challenge covers, in order.
pub(super) const DEFAULT_COMPONENTS: [Component; 3] = [
    Component::Method,
    Component::TargetUri,
    Component::ContentDigest,
];

/// How long after `created` a signature expires, when a challenge asks for `expires`. Every
/// attempt is signed afresh, so a signature only has to live as long as one request takes.
pub(super) const EXPIRES_AFTER_SECS: u64 = 300;

/// A component the signer can cover: one whose value on the wire it knows exactly.
///
/// The derived components come from the recipient URL the request is sent to; the fields
/// are the ones the signer sets itself (`Content-Digest`, `Date`), the ones the request
/// builder sets from what the signer is given (`Content-Type`, `Idempotency-Key`), and the
/// two the transports add: `Content-Length` (both send the body's length) and `Host` (the
/// URL's host, with `:port` when the port is not the scheme's default, the value draft-cavage
/// signing relies on too). The request's other headers (`User-Agent`, `Accept`, a row's
/// own) are not known to the signer: a challenge asking for one is not honoured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Component {
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
    pub(super) fn name(self) -> &'static str {
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
pub(super) fn authority(req: &SignRequest<'_>) -> String {
    let url = req.recipient;
    if url.port() == url.scheme().default_port() {
        url.host().to_string()
    } else {
        format!("{}:{}", url.host(), url.port())
    }
}

/// The `Content-Digest` value of `body` (RFC 9530): `sha-256=:<base64 of its SHA-256>:`.
pub(super) fn content_digest(body: &[u8]) -> String {
    format!("sha-256=:{}:", BASE64.encode(Sha256::digest(body)))
}

/// What one signature covers and carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Plan {
    /// The label, an RFC 8941 key.
    pub(super) label: String,
    pub(super) components: Vec<Component>,
    /// Whether to send `expires` (`created` + [`EXPIRES_AFTER_SECS`]).
    pub(super) expires: bool,
    pub(super) nonce: Option<String>,
    pub(super) tag: Option<String>,
}

impl Plan {
    /// The signature made without a challenge.
    pub(super) fn default_plan() -> Plan {
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
    /// key.
    ///
    /// # Errors
    /// Why no member can be honoured (the first member's reason), in words.
    pub(super) fn from_challenge(challenge: &str, key: &ActorKey) -> Result<Plan, String> {
        let dict: Dictionary = Parser::new(challenge)
            .parse_dictionary()
            .map_err(|e| format!("not a structured-field dictionary: {e}"))?;
        let mut first_error = None;
        for (label, entry) in &dict {
            let planned = match entry {
                ListEntry::InnerList(list) => member_plan(label.as_str(), list, key),
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

fn member_plan(label: &str, list: &sfv::InnerList, key: &ActorKey) -> Result<Plan, String> {
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
        let c = Component::from_name(name)
            .ok_or_else(|| format!("cannot cover \"{name}\": not a component this signer knows the value of"))?;
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
            // Always sent: a request for them only needs no answer.
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

/// The signature parameters of a signature (§2.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Params<'a> {
    pub(super) created: u64,
    pub(super) expires: Option<u64>,
    pub(super) keyid: &'a str,
    pub(super) alg: Option<&'a str>,
    pub(super) nonce: Option<&'a str>,
    pub(super) tag: Option<&'a str>,
}

/// The `@signature-params` value: the inner list of component identifiers with the
/// parameters, serialised as RFC 8941 writes it (the same text `Signature-Input` carries
/// after its label).
///
/// # Errors
/// A string (a component name, `keyid`, `nonce`, `tag`) that a structured field cannot
/// carry, or a time past RFC 8941's integers.
pub(super) fn signature_params(names: &[&str], p: &Params<'_>) -> Result<String, String> {
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
    let keyid = string("keyid", p.keyid)?;
    let mut strings = Vec::with_capacity(3);
    for (name, v) in [("alg", p.alg), ("nonce", p.nonce), ("tag", p.tag)] {
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
        params = params.parameter(KeyRef::constant("keyid"), RefBareItem::String(keyid));
        for (name, v) in strings {
            params = params.parameter(name, RefBareItem::String(v));
        }
    }
    ser.finish()
        .ok_or_else(|| "no signature parameters were written".to_owned())
}

/// The signature base (§2.5): a line `"<component>": <value>` per covered component, in
/// order, then `"@signature-params": <params>`, joined by `\n` with none at the end.
pub(super) fn signature_base(lines: &[(&str, String)], params: &str) -> String {
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

/// The headers that sign `req` with `key` under RFC 9421, in order: `Date` (only when the
/// signature covers it), `Content-Digest`, `Signature-Input`, `Signature`.
///
/// # Errors
/// [`SignError::Failed`] when the key id cannot be written in a structured field or the
/// private-key operation fails.
pub(super) fn headers(
    key: &ActorKey,
    req: &SignRequest<'_>,
) -> Result<Vec<(String, String)>, SignError> {
    let plan = match req.challenge {
        None => Plan::default_plan(),
        Some(challenge) => Plan::from_challenge(challenge, key).unwrap_or_else(|why| {
            tracing::debug!(
                actor = req.actor,
                unit = %req.unit,
                recipient = req.recipient.as_str(),
                reason = %why,
                "Accept-Signature not honoured: signing the default components"
            );
            Plan::default_plan()
        }),
    };
    sign_plan(key, req, &plan)
}

/// The headers of the signature `plan` describes.
pub(super) fn sign_plan(
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
