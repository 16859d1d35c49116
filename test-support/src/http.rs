//! HTTP/1.1 message syntax: request heads, body framing and response encoding.
//!
//! Pure functions over byte slices; the socket work is in `server`.

use core::fmt::Write as _;

use crate::reply::Response;

/// A parsed request line and header section.
#[derive(Debug)]
pub(crate) struct Head {
    pub(crate) method: String,
    pub(crate) target: String,
    pub(crate) path: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub(crate) minor: u8,
    pub(crate) headers: Vec<(String, String)>,
}

/// How the request body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    None,
    Length(u64),
    Chunked,
}

impl Framing {
    pub(crate) fn has_body(self) -> bool {
        match self {
            Framing::None | Framing::Length(0) => false,
            Framing::Length(_) | Framing::Chunked => true,
        }
    }
}

impl Head {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Comma-separated list elements of every `name` header, trimmed.
    fn tokens<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.values(name)
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| !t.is_empty())
    }

    /// Whether the connection stays open after this exchange (RFC 9112 §9.3).
    pub(crate) fn keep_alive(&self) -> bool {
        if self
            .tokens("connection")
            .any(|t| t.eq_ignore_ascii_case("close"))
        {
            return false;
        }
        self.minor >= 1
            || self
                .tokens("connection")
                .any(|t| t.eq_ignore_ascii_case("keep-alive"))
    }

    pub(crate) fn expects_continue(&self) -> bool {
        self.minor >= 1
            && self
                .values("expect")
                .any(|v| v.eq_ignore_ascii_case("100-continue"))
    }

    /// The body framing (RFC 9112 §6.3): chunked wins over `Content-Length`; conflicting
    /// or malformed lengths and unknown final codings are errors.
    pub(crate) fn framing(&self) -> Result<Framing, String> {
        let codings: Vec<&str> = self.tokens("transfer-encoding").collect();
        if let Some(last) = codings.last() {
            return if last.eq_ignore_ascii_case("chunked") {
                Ok(Framing::Chunked)
            } else {
                Err(format!("unsupported transfer-encoding {last:?}"))
            };
        }
        let mut length = None;
        for v in self.tokens("content-length") {
            if v.is_empty() || v.len() > 19 || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("malformed content-length {v:?}"));
            }
            let n: u64 = v
                .parse()
                .map_err(|_| format!("malformed content-length {v:?}"))?;
            if length.is_some_and(|l| l != n) {
                return Err("conflicting content-length values".to_owned());
            }
            length = Some(n);
        }
        Ok(length.map_or(Framing::None, Framing::Length))
    }
}

/// Where the header section ends: `(head_len, consumed)`, the head being `buf[..head_len]`
/// (without the blank line) and `consumed` including it. Accepts bare LF line ends.
pub(crate) fn find_head_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut from = 0;
    while let Some(i) = buf[from..].iter().position(|&b| b == b'\n') {
        let p = from + i;
        let rest = &buf[p + 1..];
        if rest.first() == Some(&b'\n') {
            return Some((p, p + 2));
        }
        if rest.starts_with(b"\r\n") {
            return Some((p, p + 3));
        }
        from = p + 1;
    }
    None
}

/// Splits `raw` into lines, dropping a trailing CR from each.
fn lines(raw: &[u8]) -> impl Iterator<Item = &[u8]> {
    raw.split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses one `name: value` field line (headers and trailers).
pub(crate) fn parse_field(line: &[u8]) -> Result<(String, String), String> {
    if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
        return Err("obsolete line folding in header section".to_owned());
    }
    let colon = line
        .iter()
        .position(|&b| b == b':')
        .ok_or_else(|| format!("header line without colon: {:?}", lossy(line)))?;
    let name = &line[..colon];
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
        return Err(format!("malformed header name {:?}", lossy(name)));
    }
    let value = line[colon + 1..].trim_ascii();
    Ok((lossy(name), lossy(value)))
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Parses a request head (request line and header lines, without the blank line).
pub(crate) fn parse_head(raw: &[u8]) -> Result<Head, String> {
    let mut lines = lines(raw);
    let request_line = lines.next().unwrap_or_default();
    let request_line =
        core::str::from_utf8(request_line).map_err(|_| "request line is not UTF-8".to_owned())?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("malformed request line {request_line:?}"));
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(format!("malformed method {method:?}"));
    }
    if target.is_empty() {
        return Err("empty request target".to_owned());
    }
    let minor = match version {
        "HTTP/1.1" => 1,
        "HTTP/1.0" => 0,
        other => return Err(format!("unsupported version {other:?}")),
    };
    let headers = lines.map(parse_field).collect::<Result<Vec<_>, _>>()?;
    Ok(Head {
        method: method.to_owned(),
        target: target.to_owned(),
        path: path_of(target).to_owned(),
        minor,
        headers,
    })
}

/// The path of a request target: the query dropped, and for an absolute-form target
/// (`http://host/p`) the scheme and authority too.
pub(crate) fn path_of(target: &str) -> &str {
    let without_query = target.split_once('?').map_or(target, |(p, _)| p);
    for scheme in ["http://", "https://"] {
        if let Some(rest) = without_query.strip_prefix(scheme) {
            return rest.find('/').map_or("/", |i| &rest[i..]);
        }
    }
    without_query
}

/// Parses a chunk-size line (`1a;ext=1`), returning the size.
pub(crate) fn parse_chunk_size(line: &[u8]) -> Result<u64, String> {
    let size = line
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    if size.is_empty() || size.len() > 15 || !size.iter().all(u8::is_ascii_hexdigit) {
        return Err(format!("malformed chunk size {:?}", lossy(line)));
    }
    let text = core::str::from_utf8(size).map_err(|_| "malformed chunk size".to_owned())?;
    u64::from_str_radix(text, 16).map_err(|_| format!("malformed chunk size {text:?}"))
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Content",
        425 => "Too Early",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    }
}

/// Statuses whose responses never have a body (RFC 9110 §6.4.1).
pub(crate) fn bodyless(status: u16) -> bool {
    status < 200 || status == 204 || status == 304
}

/// The status line and header section of a response, with `Content-Length: body_len` added
/// unless the caller framed the body itself or the status has no body, and
/// `Connection: close` added when `close` and not already present.
pub(crate) fn encode_head(
    status: u16,
    headers: &[(String, String)],
    body_len: usize,
    close: bool,
) -> Vec<u8> {
    let has = |name: &str| headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    let mut out = String::with_capacity(128);
    // Writing into a String cannot fail.
    let _ = write!(out, "HTTP/1.1 {status} {}\r\n", reason(status));
    for (name, value) in headers {
        let _ = write!(out, "{name}: {value}\r\n");
    }
    if !bodyless(status) && !has("content-length") && !has("transfer-encoding") {
        let _ = write!(out, "Content-Length: {body_len}\r\n");
    }
    if close && !closes(headers) {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    out.into_bytes()
}

/// Whether these response headers ask to close the connection.
pub(crate) fn closes(headers: &[(String, String)]) -> bool {
    headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("connection")
            && v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close"))
    })
}

/// A whole response, ready to write. `is_head` drops the body but keeps its length.
pub(crate) fn encode(response: &Response, close: bool, is_head: bool) -> Vec<u8> {
    let mut out = encode_head(
        response.status,
        &response.headers,
        response.body.len(),
        close,
    );
    if !is_head && !bodyless(response.status) {
        out.extend_from_slice(&response.body);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn head_end_accepts_crlf_and_lf() {
        assert_eq!(
            find_head_end(b"GET / HTTP/1.1\r\nA: b\r\n\r\nrest"),
            Some((21, 24))
        );
        assert_eq!(
            find_head_end(b"GET / HTTP/1.1\nA: b\n\nrest"),
            Some((19, 21))
        );
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\nA: b\r\n"), None);
    }

    #[test]
    fn head_keeps_headers_verbatim() {
        let head =
            parse_head(b"POST /inbox/a?x=1 HTTP/1.1\r\nWebhook-Id: msg_1\r\nX:  padded \r\nx: 2")
                .unwrap();
        assert_eq!(head.method, "POST");
        assert_eq!(head.target, "/inbox/a?x=1");
        assert_eq!(head.path, "/inbox/a");
        assert_eq!(
            head.headers,
            [
                ("Webhook-Id".to_owned(), "msg_1".to_owned()),
                ("X".to_owned(), "padded".to_owned()),
                ("x".to_owned(), "2".to_owned()),
            ]
        );
    }

    #[test]
    fn malformed_heads_are_refused() {
        for raw in [
            &b"GET /"[..],
            b"GET / HTTP/2.0",
            b"GET  / HTTP/1.1",
            b"GET / HTTP/1.1\r\nno colon",
            b"GET / HTTP/1.1\r\nA: b\r\n folded",
            b"GET / HTTP/1.1\r\nBad Name: b",
        ] {
            assert!(
                parse_head(raw).is_err(),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    fn framing(headers: &str) -> Result<Framing, String> {
        parse_head(format!("POST / HTTP/1.1\r\n{headers}").as_bytes())
            .unwrap()
            .framing()
    }

    #[test]
    fn framing_rules() {
        assert_eq!(framing("A: b"), Ok(Framing::None));
        assert_eq!(framing("Content-Length: 5"), Ok(Framing::Length(5)));
        assert_eq!(
            framing("Content-Length: 5\r\ncontent-length: 5"),
            Ok(Framing::Length(5))
        );
        assert!(framing("Content-Length: 5\r\nContent-Length: 6").is_err());
        assert!(framing("Content-Length: -1").is_err());
        assert!(framing("Content-Length: +1").is_err());
        assert_eq!(
            framing("Transfer-Encoding: gzip, chunked\r\nContent-Length: 3"),
            Ok(Framing::Chunked)
        );
        assert!(framing("Transfer-Encoding: gzip").is_err());
    }

    #[test]
    fn connection_semantics() {
        let h = |raw: &str| parse_head(raw.as_bytes()).unwrap();
        assert!(h("GET / HTTP/1.1").keep_alive());
        assert!(!h("GET / HTTP/1.1\r\nConnection: Close").keep_alive());
        assert!(!h("GET / HTTP/1.0").keep_alive());
        assert!(h("GET / HTTP/1.0\r\nConnection: keep-alive").keep_alive());
        assert!(h("GET / HTTP/1.1\r\nExpect: 100-continue").expects_continue());
    }

    #[test]
    fn paths() {
        assert_eq!(path_of("/a/b?c=d"), "/a/b");
        assert_eq!(path_of("http://h:1/a?x"), "/a");
        assert_eq!(path_of("http://h:1"), "/");
    }

    #[test]
    fn chunk_sizes() {
        assert_eq!(parse_chunk_size(b"1a"), Ok(26));
        assert_eq!(parse_chunk_size(b"0;ext=\"x\""), Ok(0));
        assert_eq!(parse_chunk_size(b"A ; ext"), Ok(10));
        assert!(parse_chunk_size(b"").is_err());
        assert!(parse_chunk_size(b"-1").is_err());
        assert!(parse_chunk_size(b"ffffffffffffffffff").is_err());
    }

    #[test]
    fn responses() {
        let r = Response::new(503)
            .with_header("Retry-After", "2")
            .with_body("busy");
        assert_eq!(
            encode(&r, false, false),
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nContent-Length: 4\r\n\r\nbusy"
        );
        assert_eq!(
            encode(&Response::new(204), true, false),
            b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(
            encode(&r, false, true),
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nContent-Length: 4\r\n\r\n"
        );
    }
}
