//! The one check of a row's own request headers, made at enqueue ([`check_headers`]) and
//! again before every delivery attempt (the driver's request builder): a row written with
//! plain SQL never went through enqueue, and what it stored must not reach the wire unchecked.
//!
//! [`check_headers`]: crate::check_headers

use std::collections::HashSet;

/// At most this many headers per row.
pub const MAX_HEADERS: usize = 64;

/// At most this many bytes of header names and values together per row (8 KiB): well inside
/// what servers accept for a whole request head (often 8–16 KiB, with the client's own
/// headers and a signature beside them).
pub const MAX_HEADER_BYTES: usize = 8 * 1024;

/// Why a row's header cannot be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderProblem {
    /// The name is not an HTTP token.
    #[error("not a valid HTTP header name")]
    BadName,
    /// `Content-Type`: the row's content type is sent instead.
    #[error("reserved (set the row's content type instead)")]
    ContentType,
    /// The HTTP client sets it itself: the body's framing (`Content-Length`,
    /// `Transfer-Encoding`), `Host`, `Idempotency-Key`, `User-Agent`.
    #[error("reserved (the HTTP client sets it itself)")]
    SetByClient,
    /// The signer sets it: `Date`, `Digest`, `Content-Digest`, `Signature`,
    /// `Signature-Input`, `webhook-*`.
    #[error("reserved (the signer sets it itself)")]
    SetBySigner,
    /// A hop-by-hop or proxy header (`Connection`, `Keep-Alive`, `Proxy-*`, `TE`,
    /// `Trailer(s)`, `Upgrade`, `Expect`): it would change how the request is framed,
    /// forwarded or answered.
    #[error(
        "reserved (a hop-by-hop or proxy header: it would change how the request is framed or \
         forwarded)"
    )]
    HopByHop,
    /// The value is not visible ASCII, spaces and tabs (a CR or LF would split the header).
    #[error("the value is not a valid HTTP header value (visible ASCII, spaces and tabs only)")]
    BadValue,
    /// The value starts or ends with whitespace, which HTTP drops.
    #[error("the value has leading or trailing whitespace (HTTP drops it)")]
    Whitespace,
    /// The name was given before (names compare case-insensitively).
    #[error("given twice")]
    Repeated,
    /// The row has more than [`MAX_HEADERS`] headers; this is the first one past the limit.
    #[error("more than {MAX_HEADERS} headers")]
    TooMany,
    /// The names and values of the row's headers take more than [`MAX_HEADER_BYTES`]; this
    /// is the header that goes past the limit.
    #[error("more than {MAX_HEADER_BYTES} bytes of header names and values")]
    TooLarge,
}

impl HeaderProblem {
    /// Whether the name is refused whatever its value: one the client, the signer or a hop
    /// between them sets.
    pub fn is_reserved(self) -> bool {
        matches!(
            self,
            HeaderProblem::ContentType
                | HeaderProblem::SetByClient
                | HeaderProblem::SetBySigner
                | HeaderProblem::HopByHop
        )
    }
}

/// A row's header that cannot be sent: its name as given, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("header {name:?} refused: {problem}")]
pub struct RefusedHeader {
    /// The header's name, as given.
    pub name: String,
    /// Why it is refused.
    pub problem: HeaderProblem,
}

/// Whether `s` can be sent as an HTTP header value as it is: visible ASCII, spaces and tabs
/// only. A CR or LF would split the header (or be refused by the HTTP client at every
/// attempt, dead-lettering the unit long after the enqueue that could have said so).
pub(crate) fn is_header_value(s: &str) -> bool {
    s.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
}

/// Why a lower-case header name is reserved, if it is. Every name of
/// [`RESERVED_HEADERS`](crate::RESERVED_HEADERS) has a reason here, and `webhook-*`.
fn reserved(lower: &str) -> Option<HeaderProblem> {
    Some(match lower {
        "content-type" => HeaderProblem::ContentType,
        "content-length" | "transfer-encoding" | "host" | "idempotency-key" | "user-agent" => {
            HeaderProblem::SetByClient
        }
        "date" | "digest" | "content-digest" | "signature" | "signature-input" => {
            HeaderProblem::SetBySigner
        }
        "connection"
        | "keep-alive"
        | "proxy-connection"
        | "proxy-authorization"
        | "proxy-authenticate"
        | "te"
        | "trailer"
        | "trailers"
        | "upgrade"
        | "expect" => HeaderProblem::HopByHop,
        _ if lower.starts_with("webhook-") => HeaderProblem::SetBySigner,
        _ => return None,
    })
}

/// Checks a row's own request headers: what enqueue refuses, and what a delivery attempt
/// refuses to send (a row written with plain SQL skipped enqueue).
///
/// Each name is an HTTP token, given once (case-insensitively), and not one the HTTP client,
/// the signer or a hop sets ([`RESERVED_HEADERS`](crate::RESERVED_HEADERS), `webhook-*`); each
/// value is visible ASCII, spaces and tabs, without whitespace around it; at most
/// [`MAX_HEADERS`] headers and [`MAX_HEADER_BYTES`] of names and values in all.
///
/// # Errors
/// The first header that breaks a rule, with the rule.
pub fn validate_headers(headers: &[(String, String)]) -> Result<(), RefusedHeader> {
    let refuse = |name: &str, problem| RefusedHeader {
        name: name.to_owned(),
        problem,
    };
    let mut seen = HashSet::with_capacity(headers.len());
    let mut bytes = 0usize;
    for (i, (name, value)) in headers.iter().enumerate() {
        if i >= MAX_HEADERS {
            return Err(refuse(name, HeaderProblem::TooMany));
        }
        bytes = bytes.saturating_add(name.len()).saturating_add(value.len());
        if bytes > MAX_HEADER_BYTES {
            return Err(refuse(name, HeaderProblem::TooLarge));
        }
        let parsed = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| refuse(name, HeaderProblem::BadName))?;
        if let Some(problem) = reserved(parsed.as_str()) {
            return Err(refuse(name, problem));
        }
        if !is_header_value(value) {
            return Err(refuse(name, HeaderProblem::BadValue));
        }
        if value.trim_matches([' ', '\t']).len() != value.len() {
            return Err(refuse(name, HeaderProblem::Whitespace));
        }
        if !seen.insert(parsed) {
            return Err(refuse(name, HeaderProblem::Repeated));
        }
    }
    Ok(())
}
