//! Recipient URL canonicalisation (OL-19).
//!
//! A recipient names a lane, so two spellings of one inbox must give one canonical string,
//! and the canonical string must mean the same thing to every HTTP client a runtime uses
//! (WHATWG clients such as reqwest and browsers parse URLs one way, ureq and hyper the
//! RFC 3986 way). The parser is therefore strict: whatever the two could read differently
//! (backslashes, userinfo, percent-encoded hosts, shorthand IPv4 such as `127.1`) is refused
//! rather than guessed.
//!
//! The canonical form is `scheme://host[:port]/path[?query]`:
//! - the scheme and host are lower-cased;
//! - an internationalised host name (one with a non-ASCII character) goes through UTS #46
//!   `ToASCII` (the [`idna`] crate, non-transitional, as WHATWG clients do): it is mapped
//!   (case-folded, full-width forms narrowed, `。` read as `.`), normalised, checked (bidi,
//!   joiners, punycode) and written in punycode, so `Bücher.example` is
//!   `xn--bcher-kva.example`; a name UTS #46 refuses is [`UrlError::InvalidIdn`]. The
//!   result then passes the same checks as an ASCII host. All-ASCII hosts never go through
//!   UTS #46, so their canonical forms are exactly what they were before IDN support;
//! - the port is dropped when it is the scheme's default (80, 443), leading zeros removed;
//! - one trailing dot of a domain is dropped;
//! - IPv4 hosts must be dotted quads, IPv6 hosts are written in RFC 5952 compressed form;
//! - an empty path becomes `/`, the fragment is dropped;
//! - characters RFC 3986 does not allow in a path or query (non-ASCII, and `"` `<` `>` `[`
//!   `]` `^` `` ` `` `{` `|` `}`) are percent-encoded as UTF-8, which is what HTTP clients
//!   put on the wire anyway;
//! - in the path, escapes of unreserved characters (ALPHA, DIGIT, `-` `.` `_` `~`) are
//!   decoded (`%7Ealice` is `~alice`), the hex digits of the other escapes are upper-cased
//!   (`%c3%a9` is `%C3%A9`), and then dot segments are removed as RFC 3986 §5.2.4 says
//!   (`/a/../inbox`, `/./inbox` and `/%2E/inbox` are all `/inbox`; `/a/..` is `/`). WHATWG
//!   clients (reqwest, browsers) remove these segments, `%2e` ones included, before they send a
//!   request, so without this two lanes would post to one inbox at once, out of order.
//!   Malformed escapes (`%zz`, `%4`, a lone `%`) are kept as they are, and an escape is not
//!   decoded where its hex digit would turn such a `%` into an escape;
//! - the query is kept byte for byte (apart from the encoding above): no dot segments are
//!   removed there (they are not path segments), and its escapes are neither decoded nor
//!   upper-cased. A query is the receiver's own data, which some check byte for byte
//!   (pre-signed URLs, tokens), and HTTP clients send it as written, so two spellings of a
//!   query never reach one inbox as one request line; the cost is only that they are two
//!   lanes.
//!
//! A URL already in this form is its own canonical form, byte for byte, so stored lane keys
//! do not change when they are parsed again.
//!
//! # Why not a crate
//!
//! Host names use the [`idna`] crate (UTS #46 and punycode, `no_std` + `alloc`). The rest
//! stays hand-written although the `url` crate builds without std (2.5.4 and later): `url`
//! is a WHATWG parser, and its canonical form is not this one. It accepts what this parser
//! refuses (`127.1`, `0x7f.0.0.1`, backslashes read as slashes, `user:pass@`), keeps
//! `%7e` and `%c3%a9` as written where this form decodes and upper-cases them, and
//! percent-encodes a different set of characters. Canonical recipients are stored lane keys:
//! a canonical form that changed for a URL accepted before would split its lane in two
//! (two deliveries in flight to one inbox, out of order), and `tests/url_compat.rs` checks
//! that none does.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use core::str::FromStr;

use crate::policy::addr::{AddrClass, classify_addr};

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

    /// The address class the host is known to have without a lookup: an IP literal's
    /// ([`classify_addr`]), and [`AddrClass::Loopback`] for `localhost` and names under
    /// `.localhost` (RFC 6761 reserves them for loopback). `None` for any other name: only
    /// the addresses it resolves to tell, and they are checked when it is resolved.
    ///
    /// For checks made ahead of delivery (at enqueue), with
    /// [`AddressPolicy::allows`](crate::policy::AddressPolicy::allows), so that a destination delivery would refuse is
    /// refused early.
    pub fn known_class(&self) -> Option<AddrClass> {
        match self {
            Host::Domain(d) if d == "localhost" || d.ends_with(".localhost") => {
                Some(AddrClass::Loopback)
            }
            Host::Domain(_) => None,
            Host::Ipv4(_) | Host::Ipv6(_) => self.ip_addr().map(classify_addr),
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
    /// The host contains non-ASCII characters. No longer returned: such hosts are
    /// internationalised names, accepted or refused with [`UrlError::InvalidIdn`]. Kept so
    /// that code matching on it still compiles.
    #[deprecated(note = "internationalised hosts are accepted; see UrlError::InvalidIdn")]
    NonAsciiHost,
    /// A host with non-ASCII characters that is not a valid internationalised domain name
    /// under UTS #46: a disallowed character (`☃︎` is fine, U+FFFD is not), one that maps to
    /// an ASCII character a host may not contain (full-width `／` to `/`), invalid punycode in
    /// an `xn--` label, or a label breaking the bidi or joiner rules.
    InvalidIdn,
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
            #[allow(deprecated)]
            UrlError::NonAsciiHost => f.write_str("the host contains non-ASCII characters"),
            UrlError::InvalidIdn => f.write_str(
                "the host is not a valid internationalised domain name (UTS #46): it has a \
                 disallowed character, invalid punycode (xn--...) or breaks the bidi or \
                 joiner rules",
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
    if raw.is_ascii() && !has_punycode_label(raw) {
        parse_ascii_host(raw)
    } else {
        // A name with an `xn--` label is checked as UTS #46 reads it too: `xn--a.example`,
        // whose label is not valid punycode, is refused, not sent to a resolver.
        let ascii = idn_to_ascii(raw)?;
        parse_ascii_host(&ascii)
    }
}

/// Whether a label of the (ASCII) host starts with the ACE prefix `xn--`.
fn has_punycode_label(raw: &str) -> bool {
    raw.split('.')
        .any(|l| l.len() >= 4 && l.as_bytes()[..4].eq_ignore_ascii_case(b"xn--"))
}

/// The ASCII characters a host may contain besides letters and digits.
fn allowed_in_host(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
}

/// UTS #46 `ToASCII` of a host with non-ASCII characters: non-transitional, hyphens
/// allowed (as WHATWG clients do), lengths left to [`parse_ascii_host`]. An ASCII character
/// the ASCII rules refuse is refused as such; a non-ASCII one that maps to such a character
/// (`／` to `/`) makes the name invalid.
fn idn_to_ascii(raw: &str) -> Result<String, UrlError> {
    use idna::uts46::{AsciiDenyList, DnsLength, Hyphens, Uts46};
    /// Every visible ASCII character but letters, digits, `-`, `_` and `.`, plus space and
    /// controls: what [`allowed_in_host`] refuses.
    const DENY: AsciiDenyList = AsciiDenyList::new(true, "!\"#$%&'()*+,/:;<=>?@[\\]^`{|}~");
    if let Some(ch) = raw
        .chars()
        .find(|&c| c.is_ascii() && !allowed_in_host(c as u8))
    {
        return Err(UrlError::BadHostChar { ch });
    }
    Uts46::new()
        .to_ascii(raw.as_bytes(), DENY, Hyphens::Allow, DnsLength::Ignore)
        .map(String::from)
        .map_err(|_| UrlError::InvalidIdn)
}

/// An all-ASCII host: a domain (lower-cased, one trailing dot dropped) or a dotted quad.
fn parse_ascii_host(raw: &str) -> Result<Host, UrlError> {
    let name = raw.strip_suffix('.').unwrap_or(raw);
    if name.is_empty() {
        return Err(UrlError::MissingHost);
    }
    if let Some(ch) = name
        .chars()
        .find(|&c| !(c.is_ascii() && allowed_in_host(c as u8)))
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

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failing unwrap is a failing test
mod tests {
    use super::*;
    use alloc::format;

    fn canon(s: &str) -> String {
        match Recipient::parse(s) {
            Ok(r) => String::from(r.as_str()),
            Err(e) => panic!("{s:?} refused: {e}"),
        }
    }

    #[test]
    fn known_class_of_hosts() {
        let class = |u: &str| Recipient::parse(u).unwrap().host().known_class();
        assert_eq!(class("http://127.0.0.1:8080/i"), Some(AddrClass::Loopback));
        assert_eq!(class("http://[::1]/i"), Some(AddrClass::Loopback));
        assert_eq!(class("http://LOCALHOST./i"), Some(AddrClass::Loopback));
        assert_eq!(class("http://app.localhost/i"), Some(AddrClass::Loopback));
        assert_eq!(class("http://10.1.2.3/i"), Some(AddrClass::Private));
        assert_eq!(
            class("http://169.254.169.254/i"),
            Some(AddrClass::CloudMetadata)
        );
        assert_eq!(class("https://93.184.215.14/i"), Some(AddrClass::Public));
        assert_eq!(class("https://notlocalhost.example/i"), None);
        assert_eq!(class("https://localhost.example/i"), None);
    }

    fn err(s: &str) -> UrlError {
        match Recipient::parse(s) {
            Ok(r) => panic!("{s:?} accepted as {r}"),
            Err(e) => e,
        }
    }

    #[test]
    fn two_spellings_are_one_recipient() {
        let a = Recipient::parse("HTTP://Example.COM:80/inbox").unwrap();
        let b = Recipient::parse("http://example.com/inbox").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.as_str(), "http://example.com/inbox");
        assert_eq!(
            canon("hTTpS://EXAMPLE.com.:443/inbox#frag"),
            "https://example.com/inbox"
        );
    }

    #[test]
    fn default_ports_are_dropped_and_others_kept() {
        let r = Recipient::parse("https://a.test:443").unwrap();
        assert_eq!(r.as_str(), "https://a.test/");
        assert_eq!(r.port(), 443);
        assert_eq!(r.scheme(), Scheme::Https);
        assert_eq!(r.host(), &Host::Domain(String::from("a.test")));
        assert_eq!(canon("http://a.test:443/"), "http://a.test:443/");
        assert_eq!(canon("https://a.test:80/"), "https://a.test:80/");
        assert_eq!(canon("http://a.test:0080/"), "http://a.test/");
        assert_eq!(canon("http://a.test:/x"), "http://a.test/x");
        let r = Recipient::parse("http://a.test:8080").unwrap();
        assert_eq!((r.as_str(), r.port()), ("http://a.test:8080/", 8080));
        assert_eq!(Recipient::parse("http://a.test").unwrap().port(), 80);
        assert_eq!(canon("http://a.test:65535/"), "http://a.test:65535/");
    }

    #[test]
    fn ipv6_literals_are_canonical() {
        let r = Recipient::parse("http://[::1]:8080/x").unwrap();
        assert_eq!(r.as_str(), "http://[::1]:8080/x");
        assert_eq!(r.host(), &Host::Ipv6(Ipv6Addr::LOCALHOST));
        assert_eq!(r.port(), 8080);
        assert_eq!(
            canon("http://[2001:0DB8:0000:0000:0000:0000:0000:0001]/"),
            "http://[2001:db8::1]/"
        );
        assert_eq!(canon("https://[0:0:0:0:0:0:0:1]:443"), "https://[::1]/");
        assert_eq!(
            canon("http://[::FFFF:10.0.0.1]/"),
            "http://[::ffff:10.0.0.1]/"
        );
        assert_eq!(err("http://[fe80::1%25eth0]/"), UrlError::Ipv6ZoneId);
        assert_eq!(err("http://[fe80::1%eth0]/"), UrlError::Ipv6ZoneId);
        assert_eq!(err("http://[::1/"), UrlError::BadIpv6);
        assert_eq!(err("http://[::1]x/"), UrlError::BadIpv6);
        assert_eq!(err("http://[1.2.3.4]/"), UrlError::BadIpv6);
        assert_eq!(err("http://[v1.fe]/"), UrlError::BadIpv6);
        assert_eq!(err("http://[::g]/"), UrlError::BadIpv6);
        assert_eq!(err("http://[]/"), UrlError::MissingHost);
        assert_eq!(err("http://::1/"), UrlError::MissingHost);
    }

    #[test]
    fn empty_port_is_the_default_port() {
        assert_eq!(canon("http://[::1]:/"), "http://[::1]/");
    }

    #[test]
    fn ipv4_must_be_a_dotted_quad() {
        let r = Recipient::parse("http://127.0.0.1:8080/in").unwrap();
        assert_eq!(r.host(), &Host::Ipv4(Ipv4Addr::LOCALHOST));
        assert_eq!(canon("http://10.0.0.255./x"), "http://10.0.0.255/x");
        assert_eq!(canon("http://0.0.0.0/"), "http://0.0.0.0/");
        for bad in [
            "http://127.1/",
            "http://2130706433/",
            "http://0x7f.0.0.1/",
            "http://0x7f000001/",
            "http://127.0.0.01/",
            "http://010.0.0.1/",
            "http://256.0.0.1/",
            "http://1.2.3.4.5/",
            "http://1.2.3/",
            "http://1..2.3/",
            "http://example.123/",
            "http://foo.0x/",
            "http://foo.0XaB/",
            "http://1.2.3.0004/",
        ] {
            assert_eq!(err(bad), UrlError::BadIpv4, "{bad}");
        }
        // A last label that only starts like a number is a name.
        assert_eq!(canon("http://1.2.3.4a/"), "http://1.2.3.4a/");
        assert_eq!(canon("http://foo.0xg/"), "http://foo.0xg/");
    }

    #[test]
    fn paths_and_queries_are_kept() {
        assert_eq!(canon("http://a.test"), "http://a.test/");
        assert_eq!(canon("http://a.test?x=1"), "http://a.test/?x=1");
        assert_eq!(canon("http://a.test#f"), "http://a.test/");
        assert_eq!(canon("http://a.test/?"), "http://a.test/?");
        assert_eq!(
            canon("http://a.test/Users/~alice/In%2Fbox?a=%20b&C=D;e=f"),
            "http://a.test/Users/~alice/In%2Fbox?a=%20b&C=D;e=f"
        );
        assert_eq!(canon("http://a.test/100%/x%zz"), "http://a.test/100%/x%zz");
        assert_eq!(canon("http://a.test/b/c//d"), "http://a.test/b/c//d");
        assert_eq!(
            canon("http://a.test/x?q=a:b@c/d?e"),
            "http://a.test/x?q=a:b@c/d?e"
        );
        assert_eq!(canon("http://a.test/x?y#a{b}#c"), "http://a.test/x?y");
        let r = Recipient::parse("http://a.test:81/p?q").unwrap();
        assert_eq!(r.path_and_query(), "/p?q");
        assert_eq!(
            Recipient::parse("http://a.test").unwrap().path_and_query(),
            "/"
        );
    }

    #[test]
    fn dot_segments_are_removed_from_the_path() {
        // One inbox, however its path is spelt: one lane.
        for spelling in [
            "http://a.test/inbox",
            "http://a.test/./inbox",
            "http://a.test/a/../inbox",
            "http://a.test/../inbox",
            "http://a.test/../../inbox",
            "http://a.test/a/b/../../inbox",
            "http://a.test/a/./../inbox",
            "http://a.test/%2E/inbox",
            "http://a.test/%2e/inbox",
            "http://a.test/a/%2E%2E/inbox",
            "http://a.test/a/.%2e/inbox",
            "http://a.test/a/%2e./inbox",
            "http://a.test/a/%2e%2E/inbox",
            "http://a.test/%69nbox",
            "http://a.test/a/../%69%6E%62%6F%78",
        ] {
            assert_eq!(canon(spelling), "http://a.test/inbox", "{spelling}");
        }
        // RFC 3986 §5.2.4, examples and edge cases.
        for (input, output) in [
            ("http://a.test/a/b/c/./../../g", "http://a.test/a/g"),
            ("http://a.test/mid/content=5/../6", "http://a.test/mid/6"),
            ("http://a.test/a/b/..", "http://a.test/a/"),
            ("http://a.test/a/b/.", "http://a.test/a/b/"),
            ("http://a.test/a/..", "http://a.test/"),
            ("http://a.test/..", "http://a.test/"),
            ("http://a.test/.", "http://a.test/"),
            ("http://a.test/a/../b/./c//d", "http://a.test/b/c//d"),
            ("http://a.test/a//../b", "http://a.test/a/b"),
            ("http://a.test//../b", "http://a.test/b"),
            ("http://a.test/a/%2E%2E", "http://a.test/"),
            ("http://a.test/a/..?x", "http://a.test/?x"),
            (
                "https://a.test:8443/a/./b/../c#f",
                "https://a.test:8443/a/c",
            ),
            // Not dot segments: kept.
            (
                "http://a.test/.../a..b/.c/c./",
                "http://a.test/.../a..b/.c/c./",
            ),
            ("http://a.test/%2E%2E%2E/x", "http://a.test/.../x"),
            ("http://a.test/a%2F../b", "http://a.test/a%2F../b"),
        ] {
            assert_eq!(canon(input), output, "{input}");
        }
        let r = Recipient::parse("http://a.test:81/x/../p?q").unwrap();
        assert_eq!(r.path_and_query(), "/p?q");
    }

    #[test]
    fn the_query_keeps_its_dots_and_escapes() {
        assert_eq!(
            canon("http://a.test/x?next=/a/../b/./c"),
            "http://a.test/x?next=/a/../b/./c"
        );
        assert_eq!(
            canon("http://a.test/x/..?a=%7e&b=%2E&c=%c3%a9"),
            "http://a.test/?a=%7e&b=%2E&c=%c3%a9"
        );
        assert_eq!(canon("http://a.test/?.."), "http://a.test/?..");
    }

    #[test]
    fn unreserved_escapes_are_decoded_and_the_others_upper_cased() {
        assert_eq!(
            canon("http://a.test/%7Ealice/%7ebob/%41%5a%61%7A%30%39%2D%2E%5F"),
            "http://a.test/~alice/~bob/AZaz09-._"
        );
        assert_eq!(canon("http://a.test/jos%c3%a9"), "http://a.test/jos%C3%A9");
        assert_eq!(
            canon("http://a.test/a%2fb%3a%20%25"),
            "http://a.test/a%2Fb%3A%20%25"
        );
        assert_eq!(
            Recipient::parse("http://a.test/Jos%c3%a9").unwrap(),
            Recipient::parse("http://a.test/J%6fs%C3%A9").unwrap()
        );
        // Malformed escapes stay as they are.
        for kept in [
            "http://a.test/%zz",
            "http://a.test/%4",
            "http://a.test/%",
            "http://a.test/a%/b",
            "http://a.test/%%",
            "http://a.test/%g1",
            "http://a.test/%1g",
        ] {
            assert_eq!(canon(kept), kept);
        }
        // A decoded hex digit never completes an escape with a malformed `%` before it.
        assert_eq!(canon("http://a.test/%%34%31"), "http://a.test/%%341");
        assert_eq!(canon("http://a.test/%4%31"), "http://a.test/%4%31");
        assert_eq!(canon("http://a.test/%%7E"), "http://a.test/%~");
        assert_eq!(canon("http://a.test/%zz%41"), "http://a.test/%zzA");
        assert_eq!(canon("http://a.test/%/%41"), "http://a.test/%/A");
    }

    #[test]
    fn canonical_urls_are_kept_byte_for_byte() {
        for url in [
            "http://a.test/",
            "https://mastodon.example/inbox",
            "https://mastodon.example/users/alice/inbox",
            "https://hooks.example:8443/v1/hooks/42?token=abc%2Bdef&x=1",
            "http://127.0.0.1:8080/hooks/1",
            "https://[2001:db8::1]:8443/in",
            "https://a.test/jos%C3%A9/%E2%9C%93",
            "https://a.test/In%2Fbox/a%20b/%25",
            "https://a.test/~alice/.well-known/webfinger",
            "https://a.test/a..b/.../.x/x./",
            "https://a.test/c//d/",
            "https://a.test/100%/x%zz/%4",
            "https://a.test/p?q=%7e&r=a/../b&s=./c&t=%c3%a9",
            "https://a.test/p?",
            "http://xn--bcher-kva.example/users/b%C3%BCcher",
        ] {
            assert_eq!(canon(url), url);
            let r = Recipient::parse(url).unwrap();
            assert_eq!(Recipient::parse(r.as_str()).unwrap(), r);
        }
    }

    #[test]
    fn characters_outside_rfc3986_are_percent_encoded() {
        assert_eq!(canon("http://a.test/josé"), "http://a.test/jos%C3%A9");
        assert_eq!(
            canon("http://a.test/x?a[]=1|2"),
            "http://a.test/x?a%5B%5D=1%7C2"
        );
        assert_eq!(
            canon("http://a.test/\"<>^`{}"),
            "http://a.test/%22%3C%3E%5E%60%7B%7D"
        );
        assert_eq!(canon("http://a.test/jos%C3%A9"), "http://a.test/jos%C3%A9");
    }

    #[test]
    fn not_absolute_http_is_refused() {
        assert_eq!(err(""), UrlError::Empty);
        assert_eq!(err("/inbox"), UrlError::Relative);
        assert_eq!(err("inbox"), UrlError::Relative);
        assert_eq!(err("//example.com/inbox"), UrlError::Relative);
        assert_eq!(err("example.com/inbox"), UrlError::Relative);
        assert_eq!(err("1http://example.com/"), UrlError::Relative);
        assert_eq!(err(":"), UrlError::Relative);
        assert_eq!(err("ftp://example.com/"), UrlError::NotHttp);
        assert_eq!(err("mailto:a@example.com"), UrlError::NotHttp);
        assert_eq!(err("httpx://example.com/"), UrlError::NotHttp);
        assert_eq!(err("example.com:8080/inbox"), UrlError::NotHttp);
        assert_eq!(err("http:example.com"), UrlError::MissingAuthority);
        assert_eq!(err("http:/example.com"), UrlError::MissingAuthority);
        assert_eq!(err("http:"), UrlError::MissingAuthority);
        assert_eq!(err("http://"), UrlError::MissingHost);
        assert_eq!(err("http:///inbox"), UrlError::MissingHost);
        assert_eq!(err("http://:80/"), UrlError::MissingHost);
        assert_eq!(err("http://./"), UrlError::MissingHost);
        assert_eq!(err("http://?x"), UrlError::MissingHost);
    }

    #[test]
    fn dangerous_forms_are_refused() {
        assert_eq!(err("http://user:pass@example.com/"), UrlError::UserInfo);
        assert_eq!(err("http://user@example.com/"), UrlError::UserInfo);
        assert_eq!(err("http://@example.com/"), UrlError::UserInfo);
        assert_eq!(err("http://a.test@evil.test/"), UrlError::UserInfo);
        assert_eq!(
            err("http://evil.test\\@good.test/"),
            UrlError::InvalidChar {
                ch: '\\',
                index: 16
            }
        );
        assert_eq!(
            err(" http://a.test/"),
            UrlError::InvalidChar { ch: ' ', index: 0 }
        );
        assert_eq!(
            err("http://a.test/\n"),
            UrlError::InvalidChar {
                ch: '\n',
                index: 14
            }
        );
        assert_eq!(
            err("http://a.test/a b"),
            UrlError::InvalidChar { ch: ' ', index: 15 }
        );
        assert_eq!(
            err("http://a\u{0}.test/"),
            UrlError::InvalidChar { ch: '\0', index: 8 }
        );
        assert_eq!(
            err("http://a.test/\u{a0}"),
            UrlError::InvalidChar {
                ch: '\u{a0}',
                index: 14
            }
        );
        assert_eq!(
            err("http://ex%61mple.com/"),
            UrlError::BadHostChar { ch: '%' }
        );
        assert_eq!(err("http://a!b.test/"), UrlError::BadHostChar { ch: '!' });
        assert_eq!(err("http://a.test:8o/"), UrlError::BadPort);
        assert_eq!(err("http://a.test:0/"), UrlError::BadPort);
        assert_eq!(err("http://a.test:65536/"), UrlError::BadPort);
        assert_eq!(err("http://a.test:-1/"), UrlError::BadPort);
        assert_eq!(err("http://a.test:+80/"), UrlError::BadPort);
        assert_eq!(err("http://a.test:1:2/"), UrlError::BadPort);
        assert_eq!(
            err("http://a.test:99999999999999999999999/"),
            UrlError::BadPort
        );
        assert_eq!(err("http://a..test/"), UrlError::EmptyLabel);
        assert_eq!(err("http://.a.test/"), UrlError::EmptyLabel);
        assert_eq!(err("http://a.test../"), UrlError::EmptyLabel);
        let long_label = "a".repeat(64);
        assert_eq!(
            err(&format!("http://{long_label}.test/")),
            UrlError::LabelTooLong
        );
        let ok_label = "a".repeat(63);
        assert!(Recipient::parse(&format!("http://{ok_label}.test/")).is_ok());
        let long_host = ["abcdefghi"; 26].join(".");
        assert_eq!(err(&format!("http://{long_host}/")), UrlError::HostTooLong);
    }

    #[test]
    fn host_names_are_lower_cased() {
        assert_eq!(
            canon("http://My_Host-1.Example/"),
            "http://my_host-1.example/"
        );
        assert_eq!(canon("http://LOCALHOST:3000/"), "http://localhost:3000/");
        assert_eq!(
            canon("http://xn--bcher-kva.example/"),
            "http://xn--bcher-kva.example/"
        );
    }

    #[test]
    fn internationalised_hosts_are_canonicalised_to_punycode() {
        for (input, output) in [
            (
                "https://Bücher.example/inbox",
                "https://xn--bcher-kva.example/inbox",
            ),
            // UTS #46 mapping: case folding, full-width forms, the ideographic full stop.
            ("https://BÜCHER.EXAMPLE/", "https://xn--bcher-kva.example/"),
            (
                "https://ｂüｃｈｅｒ．example/",
                "https://xn--bcher-kva.example/",
            ),
            (
                "https://bücher。example./x",
                "https://xn--bcher-kva.example/x",
            ),
            ("https://ＥＸＡＭＰＬＥ.com/", "https://example.com/"),
            // Non-transitional: ß and ς stay themselves, not ss and σ.
            ("http://faß.de/", "http://xn--fa-hia.de/"),
            (
                "http://ελληνικά.example:8080/a",
                "http://xn--hxargifdar.example:8080/a",
            ),
            ("http://日本語.jp/", "http://xn--wgv71a119e.jp/"),
            (
                "http://münchen.de/ä?ö",
                "http://xn--mnchen-3ya.de/%C3%A4?%C3%B6",
            ),
            // An xn-- label next to a Unicode one is checked and lower-cased.
            (
                "http://XN--BCHER-KVA.bücher.example/",
                "http://xn--bcher-kva.xn--bcher-kva.example/",
            ),
            // Full-width digits map to a dotted quad, which is an IPv4 host.
            ("http://１２７．０．０．１:8080/", "http://127.0.0.1:8080/"),
        ] {
            assert_eq!(canon(input), output, "{input}");
            let r = Recipient::parse(input).unwrap();
            assert_eq!(Recipient::parse(output).unwrap(), r, "{input}");
        }
        assert_eq!(
            Recipient::parse("https://Bücher.example/inbox")
                .unwrap()
                .host(),
            &Host::Domain(String::from("xn--bcher-kva.example"))
        );
        assert_eq!(
            Recipient::parse("http://１２７．０．０．１/")
                .unwrap()
                .host(),
            &Host::Ipv4(Ipv4Addr::LOCALHOST)
        );
    }

    #[test]
    fn invalid_internationalised_hosts_are_refused() {
        for bad in [
            "http://a\u{fffd}b.example/",       // disallowed code point
            "http://bücher／evil.example/",     // full-width solidus maps to `/`
            "http://bücher＠evil.example/",     // full-width commercial at maps to `@`
            "http://ü\u{200d}.example/",        // ZERO WIDTH JOINER outside a joining context
            "http://\u{0301}bücher.example/",   // a label starting with a combining mark
            "http://xn--a-ecp.bücher.example/", // an xn-- label that is not valid punycode
            "https://xn--a.example/",           // the same in an all-ASCII name
            "https://XN--A.example/",
            "http://ab\u{5d0}.bücher.example/", // left-to-right and right-to-left in one label
        ] {
            assert_eq!(err(bad), UrlError::InvalidIdn, "{bad}");
        }
        // ASCII characters a host may not contain are refused as before.
        assert_eq!(
            err("http://bü%63her.example/"),
            UrlError::BadHostChar { ch: '%' }
        );
        assert_eq!(
            err("http://bü!cher.example/"),
            UrlError::BadHostChar { ch: '!' }
        );
        // The punycode form obeys the ASCII limits.
        assert_eq!(err("http://bücher..example/"), UrlError::EmptyLabel);
        let long = "ü".repeat(60);
        assert_eq!(
            err(&format!("http://{long}.example/")),
            UrlError::LabelTooLong
        );
        assert!(format!("{}", UrlError::InvalidIdn).contains("UTS #46"));
    }

    #[test]
    fn display_and_from_str_round_trip() {
        let r: Recipient = "HTTPS://[::1]:8443/a?b".parse().unwrap();
        assert_eq!(format!("{r}"), "https://[::1]:8443/a?b");
        assert_eq!(Recipient::parse(r.as_str()).unwrap(), r);
        assert_eq!(format!("{}", r.host()), "[::1]");
        assert_eq!(r.host().ip_addr(), Some(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        let v4 = Recipient::parse("http://10.0.0.1/").unwrap();
        assert_eq!(
            v4.host().ip_addr(),
            Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)))
        );
        assert_eq!(
            Recipient::parse("http://a.test/").unwrap().host().ip_addr(),
            None
        );
        assert!(!format!("{}", UrlError::InvalidIdn).is_empty());
    }

    /// Tiny deterministic generator so the fuzz loop needs no dependency.
    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn arbitrary_input_never_panics_and_canonical_form_is_a_fixed_point() {
        let alphabet: Vec<char> =
            "hH:tTpPsS/[]@.?#%:0123456789abcdefxX-_ \\\u{0}\u{e9}\u{1F600}!{|%%%2eE~..//"
                .chars()
                .collect();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..20_000 {
            let len = (xorshift(&mut seed) % 24) as usize;
            let mut s = String::new();
            if xorshift(&mut seed) % 2 == 0 {
                s.push_str(["http://", "https://", "HTTP://["][(xorshift(&mut seed) % 3) as usize]);
            }
            for _ in 0..len {
                let i = (xorshift(&mut seed) % alphabet.len() as u64) as usize;
                s.push(alphabet[i]);
            }
            if let Ok(r) = Recipient::parse(&s) {
                let again = Recipient::parse(r.as_str())
                    .unwrap_or_else(|e| panic!("canonical {r} of {s:?} refused: {e}"));
                assert_eq!(again, r, "{s:?}");
            }
        }
    }
}
