//! The recipient URL canonicaliser as it was before IDN support (commit dc6cd36,
//! core/src/policy/url.rs without its tests), kept verbatim so `url_compat` can check that
//! every URL it accepted keeps its canonical form byte for byte. Do not edit.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::all)]

// Recipient URL canonicalisation (OL-19).
//
// A recipient names a lane, so two spellings of one inbox must give one canonical string,
// and the canonical string must mean the same thing to every HTTP client a runtime uses
// (reqwest parses URLs the WHATWG way, ureq the RFC 3986 way). The parser is therefore
// strict: whatever the two could read differently (backslashes, userinfo, percent-encoded
// or non-ASCII hosts, shorthand IPv4 such as `127.1`) is refused rather than guessed.
//
// The canonical form is `scheme://host[:port]/path[?query]`:
// - the scheme and host are lower-cased (hosts are ASCII only: use punycode for IDNs);
// - the port is dropped when it is the scheme's default (80, 443), leading zeros removed;
// - one trailing dot of a domain is dropped;
// - IPv4 hosts must be dotted quads, IPv6 hosts are written in RFC 5952 compressed form;
// - an empty path becomes `/`, the fragment is dropped;
// - characters RFC 3986 does not allow in a path or query (non-ASCII, and `"` `<` `>` `[`
//   `]` `^` `` ` `` `{` `|` `}`) are percent-encoded as UTF-8, which is what HTTP clients
//   put on the wire anyway;
// - in the path, escapes of unreserved characters (ALPHA, DIGIT, `-` `.` `_` `~`) are
//   decoded (`%7Ealice` is `~alice`), the hex digits of the other escapes are upper-cased
//   (`%c3%a9` is `%C3%A9`), and then dot segments are removed as RFC 3986 §5.2.4 says
//   (`/a/../inbox`, `/./inbox` and `/%2E/inbox` are all `/inbox`; `/a/..` is `/`). WHATWG
//   clients (reqwest) remove these segments, `%2e` ones included, before they send a
//   request, so without this two lanes would post to one inbox at once, out of order.
//   Malformed escapes (`%zz`, `%4`, a lone `%`) are kept as they are, and an escape is not
//   decoded where its hex digit would turn such a `%` into an escape;
// - the query is kept byte for byte (apart from the encoding above): no dot segments are
//   removed there (they are not path segments), and its escapes are neither decoded nor
//   upper-cased. A query is the receiver's own data, which some check byte for byte
//   (pre-signed URLs, tokens), and HTTP clients send it as written, so two spellings of a
//   query never reach one inbox as one request line; the cost is only that they are two
//   lanes.
//
// A URL already in this form is its own canonical form, byte for byte, so stored lane keys
// do not change when they are parsed again.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use core::str::FromStr;

/// URL scheme of a recipient.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `http`
    Http,
    /// `https`
    Https,
}

impl Scheme {
    /// The scheme's lower-case name, without `://`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    /// The port used when the URL names none: 80 for http, 443 for https.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The host of a recipient URL.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name: ASCII, lower-case, without a trailing dot.
    Domain(String),
    /// An IPv4 literal (a strict dotted quad in the URL).
    Ipv4(Ipv4Addr),
    /// An IPv6 literal (written in brackets in the URL).
    Ipv6(Ipv6Addr),
}

impl Host {
    /// The address of an IP-literal host (which the SSRF guard checks before any request,
    /// since no resolver sees it), or `None` for a domain.
    pub fn ip_addr(&self) -> Option<IpAddr> {
        match self {
            Host::Domain(_) => None,
            Host::Ipv4(a) => Some(IpAddr::V4(*a)),
            Host::Ipv6(a) => Some(IpAddr::V6(*a)),
        }
    }
}

impl fmt::Display for Host {
    /// The host as it appears in the canonical URL (IPv6 in brackets).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Domain(d) => f.write_str(d),
            Host::Ipv4(a) => write!(f, "{a}"),
            Host::Ipv6(a) => write!(f, "[{a}]"),
        }
    }
}

/// A canonical absolute http(s) recipient URL.
///
/// Built only by [`Recipient::parse`]; see the [module documentation](self) for the
/// canonical form. Equality and hashing follow the canonical form, so two spellings of one
/// inbox compare equal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Recipient {
    canonical: String,
    scheme: Scheme,
    host: Host,
    port: u16,
    /// Byte offset of the path (its leading `/`) in `canonical`.
    path_start: usize,
}

/// Why a string is not a recipient URL.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UrlError {
    /// The string is empty.
    Empty,
    /// The string has no scheme: it is a relative URL or a bare host name.
    Relative,
    /// The scheme is not `http` or `https` (`ftp:`, `mailto:`, …).
    NotHttp,
    /// The scheme is not followed by `//` (as in `http:example.com`).
    MissingAuthority,
    /// The URL names no host (`http:///inbox`, `http://:80/`).
    MissingHost,
    /// The URL carries a user name or password (`user:pass@`), which would leak into lane
    /// keys, logs and the dead-letter list.
    UserInfo,
    /// The port is not a number from 1 to 65535.
    BadPort,
    /// The host contains non-ASCII characters.
    NonAsciiHost,
    /// A whitespace or control character, or a backslash, appears in the URL.
    InvalidChar {
        /// The offending character.
        ch: char,
        /// Its byte offset in the input.
        index: usize,
    },
    /// A character that is not allowed in a host name (letters, digits, `-`, `_` and `.`).
    BadHostChar {
        /// The offending character.
        ch: char,
    },
    /// A host name has an empty label (`a..b`, `.a`).
    EmptyLabel,
    /// A host name label is longer than 63 bytes.
    LabelTooLong,
    /// A host name is longer than 253 bytes.
    HostTooLong,
    /// A numeric host that is not a strict dotted quad: shorthand (`127.1`), a single number,
    /// octal (`010.0.0.1`), hexadecimal (`0x7f.0.0.1`) or out-of-range parts. Clients read
    /// these forms differently, so they are refused rather than guessed.
    BadIpv4,
    /// A bracketed host that is not a valid IPv6 address (or is an unsupported `IPvFuture`).
    BadIpv6,
    /// An IPv6 literal carries a zone id (`%25eth0`), which only means something on the
    /// sending machine.
    Ipv6ZoneId,
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UrlError::Empty => f.write_str("empty URL; expected an absolute http(s) URL"),
            UrlError::Relative => f.write_str(
                "relative URL; a recipient must be an absolute URL starting with http:// or https://",
            ),
            UrlError::NotHttp => f.write_str(
                "unsupported scheme; a recipient must start with http:// or https://",
            ),
            UrlError::MissingAuthority => {
                f.write_str("expected `//` and a host after the scheme (http://host/...)")
            }
            UrlError::MissingHost => f.write_str("the URL has no host"),
            UrlError::UserInfo => f.write_str(
                "credentials (user:pass@) are not allowed in a recipient URL; \
                 use a signer or header instead",
            ),
            UrlError::BadPort => f.write_str("the port must be a number from 1 to 65535"),
            UrlError::NonAsciiHost => f.write_str(
                "the host contains non-ASCII characters; write internationalised names in \
                 punycode (xn--...)",
            ),
            UrlError::InvalidChar { ch, index } => write!(
                f,
                "invalid character {ch:?} at byte {index}: whitespace, control characters and \
                 backslashes are not allowed in a URL"
            ),
            UrlError::BadHostChar { ch } => write!(
                f,
                "invalid character {ch:?} in host; a host name may contain only letters, \
                 digits, '-', '_' and '.'"
            ),
            UrlError::EmptyLabel => f.write_str("the host name has an empty label (`..`)"),
            UrlError::LabelTooLong => {
                f.write_str("a label of the host name is longer than 63 bytes")
            }
            UrlError::HostTooLong => f.write_str("the host name is longer than 253 bytes"),
            UrlError::BadIpv4 => f.write_str(
                "numeric host is not a dotted-quad IPv4 address (a.b.c.d, each 0-255 in decimal \
                 without leading zeros)",
            ),
            UrlError::BadIpv6 => f.write_str("the bracketed host is not a valid IPv6 address"),
            UrlError::Ipv6ZoneId => f.write_str("IPv6 zone ids (%25...) are not allowed"),
        }
    }
}

impl core::error::Error for UrlError {}

impl Recipient {
    /// Parses and canonicalises a recipient URL.
    ///
    /// ```
    /// use outbox_lanes_core::policy::Recipient;
    /// let a = Recipient::parse("HTTP://Example.COM:80/inbox#top")?;
    /// assert_eq!(a.as_str(), "http://example.com/inbox");
    /// assert_eq!(a, Recipient::parse("http://example.com/inbox")?);
    /// # Ok::<(), outbox_lanes_core::policy::UrlError>(())
    /// ```
    ///
    /// # Errors
    /// [`UrlError`] when the string is not an absolute http(s) URL, or uses a form this
    /// parser refuses (see its variants).
    pub fn parse(input: &str) -> Result<Self, UrlError> {
        if input.is_empty() {
            return Err(UrlError::Empty);
        }
        if let Some((index, ch)) = input
            .char_indices()
            .find(|&(_, c)| c.is_control() || c.is_whitespace() || c == '\\')
        {
            return Err(UrlError::InvalidChar { ch, index });
        }

        let (scheme, rest) = split_scheme(input)?;
        let rest = rest.strip_prefix("//").ok_or(UrlError::MissingAuthority)?;
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, after) = rest.split_at(authority_end);
        if authority.contains('@') {
            return Err(UrlError::UserInfo);
        }
        let (host, port) = parse_authority(authority, scheme)?;

        let path_query = after.split_once('#').map_or(after, |(pq, _)| pq);

        let mut canonical = String::with_capacity(input.len() + 1);
        canonical.push_str(scheme.as_str());
        canonical.push_str("://");
        push_display(&mut canonical, &host);
        if port != scheme.default_port() {
            canonical.push(':');
            push_display(&mut canonical, &port);
        }
        let path_start = canonical.len();
        let (path, query) = path_query.split_at(path_query.find('?').unwrap_or(path_query.len()));
        let mut decoded = String::with_capacity(path.len());
        push_path_escapes(&mut decoded, path);
        push_without_dot_segments(&mut canonical, &decoded);
        push_encoded(&mut canonical, query);

        Ok(Recipient {
            canonical,
            scheme,
            host,
            port,
            path_start,
        })
    }

    /// The canonical form.
    pub fn as_str(&self) -> &str {
        &self.canonical
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The effective port (default port of the scheme when absent).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The path and query, starting with `/` (the request target of an HTTP/1.1 request).
    pub fn path_and_query(&self) -> &str {
        self.canonical.get(self.path_start..).unwrap_or("/")
    }
}

impl fmt::Display for Recipient {
    /// Writes the canonical form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical)
    }
}

impl FromStr for Recipient {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<Self, UrlError> {
        Recipient::parse(s)
    }
}

impl AsRef<str> for Recipient {
    fn as_ref(&self) -> &str {
        &self.canonical
    }
}

/// Splits `scheme:` off the input and checks it is http or https.
fn split_scheme(input: &str) -> Result<(Scheme, &str), UrlError> {
    let (name, rest) = input.split_once(':').ok_or(UrlError::Relative)?;
    let mut chars = name.chars();
    let well_formed = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !well_formed {
        return Err(UrlError::Relative);
    }
    let scheme = if name.eq_ignore_ascii_case("http") {
        Scheme::Http
    } else if name.eq_ignore_ascii_case("https") {
        Scheme::Https
    } else {
        return Err(UrlError::NotHttp);
    };
    Ok((scheme, rest))
}

/// Parses `host[:port]` (no userinfo) into the host and the effective port.
fn parse_authority(authority: &str, scheme: Scheme) -> Result<(Host, u16), UrlError> {
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (literal, after) = bracketed.split_once(']').ok_or(UrlError::BadIpv6)?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or(UrlError::BadIpv6)?),
        };
        (Host::Ipv6(parse_ipv6(literal)?), port)
    } else {
        let (host, port) = match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        (parse_domain_or_ipv4(host)?, port)
    };
    let port = match port {
        None | Some("") => scheme.default_port(),
        Some(p) => parse_port(p)?,
    };
    Ok((host, port))
}

fn parse_port(p: &str) -> Result<u16, UrlError> {
    let mut value: u32 = 0;
    for b in p.bytes() {
        if !b.is_ascii_digit() {
            return Err(UrlError::BadPort);
        }
        value = value * 10 + u32::from(b - b'0');
        if value > u32::from(u16::MAX) {
            return Err(UrlError::BadPort);
        }
    }
    match u16::try_from(value) {
        Ok(0) | Err(_) => Err(UrlError::BadPort),
        Ok(port) => Ok(port),
    }
}

fn parse_ipv6(literal: &str) -> Result<Ipv6Addr, UrlError> {
    if literal.contains('%') {
        return Err(UrlError::Ipv6ZoneId);
    }
    if literal.is_empty() {
        return Err(UrlError::MissingHost);
    }
    literal.parse::<Ipv6Addr>().map_err(|_| UrlError::BadIpv6)
}

fn parse_domain_or_ipv4(raw: &str) -> Result<Host, UrlError> {
    if raw.is_empty() {
        return Err(UrlError::MissingHost);
    }
    if !raw.is_ascii() {
        return Err(UrlError::NonAsciiHost);
    }
    let name = raw.strip_suffix('.').unwrap_or(raw);
    if name.is_empty() {
        return Err(UrlError::MissingHost);
    }
    if let Some(ch) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(UrlError::BadHostChar { ch });
    }
    // WHATWG parsers read any host whose last label looks like a number as IPv4 (`127.1`,
    // `0x7f.1`, `2130706433`), while RFC 3986 parsers and resolvers may read them as names
    // or differently again: only the one form everyone agrees on is accepted.
    let last = name.rsplit('.').next().unwrap_or(name);
    if looks_numeric(last) {
        return parse_dotted_quad(name).map(Host::Ipv4);
    }
    if name.len() > 253 {
        return Err(UrlError::HostTooLong);
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(UrlError::EmptyLabel);
        }
        if label.len() > 63 {
            return Err(UrlError::LabelTooLong);
        }
    }
    Ok(Host::Domain(name.to_ascii_lowercase()))
}

/// Whether a label is what the WHATWG IPv4 parser treats as a number.
fn looks_numeric(label: &str) -> bool {
    if !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    match label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"))
    {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => false,
    }
}

/// A strict `a.b.c.d`: four decimal parts, each 0-255, no leading zeros.
fn parse_dotted_quad(s: &str) -> Result<Ipv4Addr, UrlError> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for octet in &mut octets {
        let part = parts.next().ok_or(UrlError::BadIpv4)?;
        let well_formed = !part.is_empty()
            && part.len() <= 3
            && part.bytes().all(|b| b.is_ascii_digit())
            && (part == "0" || !part.starts_with('0'));
        if !well_formed {
            return Err(UrlError::BadIpv4);
        }
        *octet = part.parse::<u8>().map_err(|_| UrlError::BadIpv4)?;
    }
    if parts.next().is_some() {
        return Err(UrlError::BadIpv4);
    }
    Ok(Ipv4Addr::from(octets))
}

/// Whether RFC 3986 allows `b` unescaped in a path or query (`%` is kept as given).
fn allowed_in_path_or_query(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
                | b'/'
                | b'?'
                | b'%'
        )
}

fn push_encoded(out: &mut String, s: &str) {
    for b in s.bytes() {
        push_encoded_byte(out, b);
    }
}

fn push_encoded_byte(out: &mut String, b: u8) {
    if allowed_in_path_or_query(b) {
        out.push(char::from(b));
    } else {
        push_escape(out, b);
    }
}

/// `%XY` with upper-case hex digits.
fn push_escape(out: &mut String, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(b >> 4)]));
    out.push(char::from(HEX[usize::from(b & 0x0f)]));
}

/// RFC 3986 §2.3 unreserved characters: their escapes mean the same as they do.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Whether `out` ends in a `%` that starts no escape, or such a `%` and one hex digit: a hex
/// digit appended now would make an escape of it. (Every escape written to `out` is three
/// characters ending in a hex digit, so a `%` in the last two is always such a `%`.)
fn ends_in_lone_percent(out: &str) -> bool {
    let b = out.as_bytes();
    match b {
        [.., b'%'] => true,
        [.., b'%', h] => h.is_ascii_hexdigit(),
        _ => false,
    }
}

/// Writes a path with escapes of unreserved characters decoded, the other escapes'
/// hex digits upper-cased, malformed escapes kept, and what RFC 3986 does not allow encoded.
fn push_path_escapes(out: &mut String, path: &str) {
    let b = path.as_bytes();
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        let escaped = match (c, b.get(i + 1), b.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) => hex_value(h).zip(hex_value(l)).map(|(h, l)| h << 4 | l),
            _ => None,
        };
        match escaped {
            Some(v) => {
                // A decoded hex digit must not complete an escape with a malformed `%`
                // before it: `%%34` is `%` and `4`, not `%4` (and `%%341` never `%A`).
                if is_unreserved(v) && !(v.is_ascii_hexdigit() && ends_in_lone_percent(out)) {
                    out.push(char::from(v));
                } else {
                    push_escape(out, v);
                }
                i += 3;
            }
            None => {
                push_encoded_byte(out, c);
                i += 1;
            }
        }
    }
}

/// Writes `path` (empty, or starting with `/`) without its dot segments, per RFC 3986
/// §5.2.4: `.` is dropped, `..` drops the segment before it (none above the root), and a
/// path that ended in either ends in `/`. An empty path is `/`.
fn push_without_dot_segments(out: &mut String, path: &str) {
    let mut kept: Vec<&str> = Vec::new();
    let mut ends_in_dir = false;
    for segment in path.strip_prefix('/').unwrap_or(path).split('/') {
        ends_in_dir = matches!(segment, "." | "..");
        match segment {
            "." => {}
            ".." => {
                kept.pop();
            }
            _ => kept.push(segment),
        }
    }
    for segment in &kept {
        out.push('/');
        out.push_str(segment);
    }
    if ends_in_dir || kept.is_empty() {
        out.push('/');
    }
}

fn push_display(out: &mut String, value: &dyn fmt::Display) {
    use core::fmt::Write as _;
    // Writing into a String cannot fail.
    let _ = write!(out, "{value}");
}
