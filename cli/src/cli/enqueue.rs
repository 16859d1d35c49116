//! `enqueue`: JSON lines in, one JSON result per row out, all or nothing.
//!
//! A line is one row: its recipients, its body (a JSON value, sent as its JSON text for a
//! JSON content type and as the string's own bytes otherwise, or bytes in base64), its
//! content type and own headers, and its dedup and ordering keys. Everything the store would
//! refuse is refused here with the line's number, before the database is opened — except a
//! recipient the outbox's destination policy refuses (OL-24: the policy is the database's),
//! which the store refuses and [`Batch::explain`] names by its line.

use std::collections::HashMap;
use std::fmt;

use base64::Engine as _;
use outbox_lanes_core::LaneKey;
use outbox_lanes_core::policy::{AddrClass, AddressPolicy};
use outbox_lanes_store::{EnqueueError, Enqueued, NewRow};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// One input line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    id: Option<String>,
    to: Option<Vec<String>>,
    /// `None` only when the key is missing: `"body": null` is the JSON text `null`.
    #[serde(default, deserialize_with = "present")]
    body: Option<Box<RawValue>>,
    body_base64: Option<String>,
    content_type: Option<String>,
    #[serde(default, deserialize_with = "header_object")]
    headers: Vec<(String, String)>,
    dedup_key: Option<String>,
    ordering_key: Option<String>,
    joined: Option<bool>,
}

/// A field that is present, whatever its value (`null` included).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

/// `"headers": {"Name": "value", …}` in the line's order (a map type would sort them and
/// keep the last of a repeated name without a word; the store refuses repeats instead).
fn header_object<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<(String, String)>, D::Error> {
    struct Headers;
    impl<'de> serde::de::Visitor<'de> for Headers {
        type Value = Vec<(String, String)>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object of header names to string values")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
            while let Some(pair) = map.next_entry::<String, String>()? {
                out.push(pair);
            }
            Ok(out)
        }
    }
    d.deserialize_map(Headers)
}

/// Whether a content type's media type is JSON: `application/json` or any
/// `application/*+json` (`activity+json`, `ld+json`), parameters and case aside.
fn is_json(content_type: &str) -> bool {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    media == "application/json"
        || media
            .strip_prefix("application/")
            .is_some_and(|sub| sub.len() > "+json".len() && sub.ends_with("+json"))
}

/// A refused input line: its 1-based number and why.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct BadLine {
    pub(crate) line: usize,
    pub(crate) reason: String,
}

impl std::fmt::Display for BadLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

impl std::error::Error for BadLine {}

/// The rows of an input, each with its line number.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(crate) rows: Vec<NewRow>,
    lines: Vec<usize>,
}

/// serde_json reports positions within the one line it was given; keep the column only.
fn json_reason(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let msg = text
        .rsplit_once(" at line ")
        .map_or(text.as_str(), |(m, _)| m);
    let kind = match e.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            "malformed JSON: "
        }
        serde_json::error::Category::Data | serde_json::error::Category::Io => "",
    };
    format!("{kind}{msg} (column {})", e.column())
}

fn parse_line(text: &str) -> Result<NewRow, String> {
    let line: Line = serde_json::from_str(text).map_err(|e| json_reason(&e))?;
    let id = match line.id {
        Some(id) if !id.trim().is_empty() => id,
        Some(_) => return Err("\"id\" is empty".into()),
        None => return Err("missing \"id\"".into()),
    };
    let to = line.to.ok_or("missing \"to\" (a list of recipient URLs)")?;
    if to.is_empty() {
        return Err("\"to\" names no recipient".into());
    }
    for url in &to {
        LaneKey::new(url, None)
            .map_err(|e| format!("recipient {url:?} is not an absolute http(s) URL: {e}"))?;
    }
    let content_type = line.content_type.unwrap_or_else(|| {
        if line.body_base64.is_some() {
            "application/octet-stream".into()
        } else {
            "application/json".into()
        }
    });
    if content_type.trim().is_empty() {
        return Err("\"content_type\" is empty".into());
    }
    if !content_type
        .bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        return Err(format!(
            "\"content_type\" {content_type:?} is not a valid HTTP header value \
             (visible ASCII, spaces and tabs only)"
        ));
    }
    let body = match (line.body, line.body_base64) {
        (Some(_), Some(_)) => {
            return Err("both \"body\" and \"body_base64\" are given: give one".into());
        }
        (None, None) => {
            return Err(
                "missing \"body\" (a JSON value) or \"body_base64\" (bytes in base64)".into(),
            );
        }
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| format!("\"body_base64\" is not valid base64: {e}"))?,
        // A JSON body is its JSON text; a string for another content type is its text.
        (Some(raw), None) if !is_json(&content_type) && raw.get().starts_with('"') => {
            serde_json::from_str::<String>(raw.get())
                .map_err(|e| json_reason(&e))?
                .into_bytes()
        }
        (Some(raw), None) => raw.get().as_bytes().to_vec(),
    };
    let row = NewRow {
        id,
        body,
        content_type,
        recipients: to,
        dedup_key: line.dedup_key.filter(|k| !k.is_empty()),
        ordering_key: line.ordering_key.filter(|k| !k.is_empty()),
        joined: line.joined.unwrap_or(false),
        headers: line.headers,
    };
    if let Err(e) = outbox_lanes_store::check_headers(&row) {
        return Err(match e {
            EnqueueError::BadHeader { name, reason, .. } => {
                format!("header {name:?} refused: {reason}")
            }
            other => other.to_string(),
        });
    }
    Ok(row)
}

/// Parses and validates lines one at a time; the first bad line refuses the whole input.
#[derive(Default)]
struct Parser {
    rows: Vec<NewRow>,
    lines: Vec<usize>,
    seen: HashMap<String, usize>,
}

impl Parser {
    /// Takes line number `line` (1-based, without its line ending). Blank lines are skipped.
    fn push(&mut self, line: usize, text: &str) -> Result<(), BadLine> {
        if text.trim().is_empty() {
            return Ok(());
        }
        let row = parse_line(text).map_err(|reason| BadLine { line, reason })?;
        if let Some(first) = self.seen.insert(row.id.clone(), line) {
            return Err(BadLine {
                line,
                reason: format!("id {:?} repeats line {first}", row.id),
            });
        }
        self.rows.push(row);
        self.lines.push(line);
        Ok(())
    }

    fn finish(self) -> Batch {
        Batch {
            rows: self.rows,
            lines: self.lines,
        }
    }
}

/// Parses and validates every line of `input`; the first bad line refuses the whole input.
#[cfg(test)]
pub(crate) fn parse(input: &str) -> Result<Batch, BadLine> {
    let mut p = Parser::default();
    for (i, text) in input.lines().enumerate() {
        p.push(i + 1, text)?;
    }
    Ok(p.finish())
}

/// Why an input could not be read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// A line is refused; `before` valid rows were read before it (none is enqueued).
    Bad { bad: BadLine, before: usize },
    /// Reading failed.
    Io(std::io::Error),
}

/// Reads and validates the input line by line, holding at most `max_line` bytes of text at a
/// time (plus the rows parsed so far): a line longer than that is refused without being read
/// whole. Lines may end in LF or CRLF.
///
/// # Errors
/// The first bad line (malformed, invalid, not UTF-8, too long, a refused header) refuses the
/// whole input.
pub(crate) async fn read(
    input: impl tokio::io::AsyncBufRead + Unpin,
    max_line: u64,
) -> Result<Batch, ReadError> {
    use tokio::io::AsyncBufReadExt as _;
    use tokio::io::AsyncReadExt as _;

    let mut input = input;
    let mut p = Parser::default();
    let mut buf = Vec::new();
    let mut line = 0;
    loop {
        buf.clear();
        // Room for the longest line and its CRLF: anything longer is refused unread.
        let n = (&mut input)
            .take(max_line.saturating_add(2))
            .read_until(b'\n', &mut buf)
            .await
            .map_err(ReadError::Io)?;
        if n == 0 {
            return Ok(p.finish());
        }
        line += 1;
        let mut text: &[u8] = &buf;
        if let Some(t) = text.strip_suffix(b"\n") {
            text = t.strip_suffix(b"\r").unwrap_or(t);
        }
        let bad = |reason: String, p: &Parser| ReadError::Bad {
            bad: BadLine { line, reason },
            before: p.rows.len(),
        };
        if text.len() as u64 > max_line {
            return Err(bad(
                format!("longer than the limit of {max_line} bytes (--max-line-bytes)"),
                &p,
            ));
        }
        let text = match std::str::from_utf8(text) {
            Ok(t) => t,
            Err(e) => return Err(bad(format!("not UTF-8 text: {e}"), &p)),
        };
        if let Err(e) = p.push(line, text) {
            let before = p.rows.len();
            return Err(ReadError::Bad { bad: e, before });
        }
    }
}

impl Batch {
    /// Refuses, before the database is opened, a recipient that `policy` refuses without a
    /// lookup (an IP literal, `localhost`): the destination policy of an outbox that does not
    /// exist yet (the one this command will make), or every class one can allow, so that
    /// only what the outbox's own policy decides is left to the store.
    ///
    /// # Errors
    /// The first refused recipient, as its line.
    pub(crate) fn check_destinations(&self, policy: &AddressPolicy) -> Result<(), BadLine> {
        for row in &self.rows {
            if let Err(e) = outbox_lanes_store::check_destinations(row, policy) {
                return Err(self.explain(&e).unwrap_or(BadLine {
                    line: self.line_of(&row.id).unwrap_or(0),
                    reason: e.to_string(),
                }));
            }
        }
        Ok(())
    }

    /// Whether a row names a recipient outside public space known without a lookup: the
    /// outbox's destination policy decides it.
    pub(crate) fn names_private_destinations(&self) -> bool {
        let public = AddressPolicy::public_only();
        self.rows
            .iter()
            .any(|r| outbox_lanes_store::check_destinations(r, &public).is_err())
    }

    fn line_of(&self, row: &str) -> Option<usize> {
        self.rows
            .iter()
            .position(|r| r.id == row)
            .and_then(|i| self.lines.get(i).copied())
    }

    /// The store's refusal of a row, as the input line it came from; `None` if the refusal
    /// is not about the input (a database failure).
    pub(crate) fn explain(&self, e: &EnqueueError) -> Option<BadLine> {
        let (row, reason) = match e {
            EnqueueError::NoRecipients { row } => (row.as_str(), "names no recipient".to_string()),
            EnqueueError::BadRecipient { row, url, reason } => {
                (row.as_str(), format!("recipient {url:?} refused: {reason}"))
            }
            EnqueueError::DuplicateRowId { row } => (
                row.as_str(),
                format!(
                    "id {row:?} is already used by this actor (stored, or enqueued within --row-id-retention)"
                ),
            ),
            EnqueueError::PayloadTooLarge { row, size, max } => (
                row.as_str(),
                format!("body of {size} bytes exceeds the limit of {max} bytes"),
            ),
            EnqueueError::TooManyRecipients { row, count, max } => (
                row.as_str(),
                format!("{count} recipients exceed the limit of {max} per row"),
            ),
            EnqueueError::BadContentType { row, content_type } => (
                row.as_str(),
                format!("\"content_type\" {content_type:?} is not a valid HTTP header value"),
            ),
            EnqueueError::BadHeader { row, name, reason } => {
                (row.as_str(), format!("header {name:?} refused: {reason}"))
            }
            EnqueueError::DestinationRefused {
                row,
                recipient,
                class,
                policy: Some(policy),
                ..
            } if opens(*class) => (
                row.as_str(),
                format!(
                    "recipient {recipient:?} is a {class} address, which this outbox's \
                     destination policy ({}) refuses (SSRF guard): pass \
                     --allow-private-destinations (to enqueue, drain or relay; it widens the \
                     policy for every process on the database), or run `outbox-lanes \
                     destinations set {}`",
                    outbox_lanes_store::policy_name(*policy),
                    if *class == AddrClass::Loopback {
                        "loopback"
                    } else {
                        "private"
                    }
                ),
            ),
            EnqueueError::DestinationRefused {
                row,
                recipient,
                class,
                ..
            } => (
                row.as_str(),
                format!(
                    "recipient {recipient:?} is a {class} address, which delivery refuses \
                     whatever the binary's flags say (SSRF guard)"
                ),
            ),
            EnqueueError::EmptyRowId { index } => {
                return Some(BadLine {
                    line: self.lines.get(*index).copied().unwrap_or(0),
                    reason: "\"id\" is empty".into(),
                });
            }
            // A database failure is not the input's fault.
            _ => return None,
        };
        Some(BadLine {
            line: self.line_of(row).unwrap_or(0),
            reason,
        })
    }
}

/// Whether `--allow-private-destinations` opens `class`.
fn opens(class: AddrClass) -> bool {
    super::address_policy(true).allows(class)
}

/// One output line.
#[derive(Debug, Serialize)]
pub(crate) struct Output<'a> {
    id: &'a str,
    seq: u64,
    units: Vec<u64>,
    skipped: &'a [String],
}

/// The output line of an enqueued row.
pub(crate) fn output(e: &Enqueued) -> Output<'_> {
    Output {
        id: &e.row_id,
        seq: e.seq.0,
        units: e.units.iter().map(|u| u.0).collect(),
        skipped: &e.skipped,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn read_all(input: &[u8], max: u64) -> Result<Batch, ReadError> {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(read(input, max))
    }

    #[test]
    fn lines_are_read_within_the_limit() {
        let a = "{\"id\":\"a\",\"to\":[\"https://x.example/\"],\"body\":null}";
        let b = "{\"id\":\"b\",\"to\":[\"https://x.example/\"],\"body\":\"x\"}";
        let max = a.len().max(b.len()) as u64;
        let input = format!("{a}\r\n\n{b}");
        let batch = read_all(input.as_bytes(), max)
            .map_err(|e| format!("{e:?}"))
            .unwrap();
        assert_eq!(batch.lines, [1, 3]);
        assert_eq!(batch.rows[0].body, b"null");
        match read_all(input.as_bytes(), max - 1) {
            Err(ReadError::Bad { bad, before: 0 }) => {
                assert_eq!(bad.line, 1);
                assert!(bad.reason.contains("longer than"), "{bad}");
            }
            other => panic!("{other:?}"),
        }
        let input = format!("{a}\n{b}xxxxxxxxxxxxxxxxxxxxxxxx\n{a}");
        match read_all(input.as_bytes(), max) {
            Err(ReadError::Bad { bad, before: 1 }) => assert_eq!(bad.line, 2),
            other => panic!("{other:?}"),
        }
        match read_all(b"\xff\xfe\n", max) {
            Err(ReadError::Bad { bad, .. }) => assert!(bad.reason.contains("UTF-8"), "{bad}"),
            other => panic!("{other:?}"),
        }
    }

    fn bad(input: &str) -> BadLine {
        parse(input).expect_err("refused")
    }

    #[test]
    fn good_lines() {
        let b = parse(
            "{\"id\":\"a\",\"to\":[\"https://x.example/inbox\"],\"body\":{\"k\": [1, 2]}}\n\n\
             {\"id\":\"b\",\"to\":[\"http://y.example/i\"],\"body\":\"s\",\"content_type\":\"text/plain\",\
             \"dedup_key\":\"d\",\"ordering_key\":\"o\",\"joined\":true}\n",
        )
        .expect("parsed");
        assert_eq!(b.rows.len(), 2);
        assert_eq!(b.rows[0].body, b"{\"k\": [1, 2]}");
        assert_eq!(b.rows[0].content_type, "application/json");
        // A string for a content type that is not JSON is its text, without quotes.
        assert_eq!(b.rows[1].body, b"s");
        assert!(b.rows[1].joined);
        assert_eq!(b.lines, [1, 3]);
    }

    #[test]
    fn json_content_types() {
        for ct in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/activity+json",
            "application/ld+json; profile=\"https://www.w3.org/ns/activitystreams\"",
        ] {
            assert!(is_json(ct), "{ct}");
        }
        for ct in [
            "text/plain",
            "application/+json",
            "text/json",
            "application/jsonx",
            "",
        ] {
            assert!(!is_json(ct), "{ct}");
        }
    }

    #[test]
    fn bodies_and_headers() {
        let row = |fields: &str| {
            let b = parse(&format!(
                "{{\"id\":\"a\",\"to\":[\"https://x.example/\"],{fields}}}"
            ))
            .map_err(|e| e.to_string())
            .unwrap();
            b.rows.into_iter().next().unwrap()
        };
        let r = row("\"body\":\"a\\\"b\\u00e9\",\"content_type\":\"text/plain\"");
        assert_eq!(r.body, "a\"b\u{e9}".as_bytes());
        let r = row("\"body\":\"a\",\"content_type\":\"application/activity+json\"");
        assert_eq!(r.body, b"\"a\"");
        let r = row("\"body\":[1, \"x\"],\"content_type\":\"text/plain\"");
        assert_eq!(r.body, b"[1, \"x\"]");
        let r = row("\"body_base64\":\"AAEC/w==\"");
        assert_eq!(r.body, [0, 1, 2, 255]);
        assert_eq!(r.content_type, "application/octet-stream");
        let r = row("\"body\":1,\"headers\":{\"X-B\":\"2\",\"X-A\":\"1\"}");
        let names: Vec<&str> = r.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["X-B", "X-A"], "kept in the line's order");
        assert!(row("\"body\":1").headers.is_empty());
    }

    #[test]
    fn destinations_are_refused_by_line_with_what_widens_them() {
        let line =
            |id: &str, url: &str| format!("{{\"id\":\"{id}\",\"to\":[\"{url}\"],\"body\":1}}");
        let open = super::super::address_policy(true);
        for url in [
            "http://127.0.0.1:1/",
            "http://localhost/",
            "http://192.168.1.2/",
        ] {
            let input = format!("{}\n{}", line("a", "https://x.example/"), line("b", url));
            let batch = parse(&input).map_err(|e| e.to_string()).unwrap();
            assert!(batch.names_private_destinations(), "{url}");
            let e = batch
                .check_destinations(&AddressPolicy::default())
                .expect_err(url);
            assert_eq!(e.line, 2, "{e}");
            assert!(e.reason.contains("--allow-private-destinations"), "{e}");
            assert!(e.reason.contains("outbox-lanes destinations set"), "{e}");
            assert!(batch.check_destinations(&open).is_ok(), "{url}");
        }
        for url in ["http://[fe80::1]/", "http://169.254.169.254/"] {
            let batch = parse(&line("a", url)).unwrap();
            let e = batch.check_destinations(&open).expect_err(url);
            assert!(e.reason.contains("whatever the binary's flags say"), "{e}");
        }
        let batch = parse(&line("a", "https://example.org/")).unwrap();
        assert!(!batch.names_private_destinations());
        assert!(batch.check_destinations(&AddressPolicy::default()).is_ok());
    }

    #[test]
    fn bad_lines_name_their_line() {
        let ok = "{\"id\":\"a\",\"to\":[\"https://x.example/\"],\"body\":1}\n";
        let e = bad(&format!("{ok}{{\"id\":\"b\",\n"));
        assert_eq!(e.line, 2);
        assert!(e.reason.starts_with("malformed JSON"), "{e}");
        let e = bad(&format!(
            "{ok}{{\"id\":\"b\",\"to\":[\"/inbox\"],\"body\":1}}"
        ));
        assert!(e.reason.contains("absolute"), "{e}");
        let e = bad(&format!(
            "{ok}{{\"id\":\"b\",\"to\":[\"https://x.example/\"]}}"
        ));
        assert!(e.reason.contains("missing \"body\""), "{e}");
        let e = bad(&format!(
            "{ok}{{\"id\":\"\",\"to\":[\"https://x.example/\"],\"body\":1}}"
        ));
        assert!(e.reason.contains("empty"), "{e}");
        let e = bad(&format!("{ok}{{\"id\":\"b\",\"to\":[],\"body\":1}}"));
        assert!(e.reason.contains("no recipient"), "{e}");
        let e = bad(&format!(
            "{ok}{{\"id\":\"b\",\"to\":[\"https://x.example/\"],\"body\":1,\"extra\":2}}"
        ));
        assert!(e.reason.contains("unknown field `extra`"), "{e}");
        let e = bad(&format!("{ok}{ok}"));
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("repeats line 1"), "{e}");
        let e = bad("{\"id\":\"b\",\"to\":[\"ftp://x.example/\"],\"body\":1}");
        assert_eq!(e.line, 1);
        let e = bad(&format!(
            "{ok}{{\"id\":\"b\",\"to\":[\"https://x.example/\"],\"body\":1,\"content_type\":\"a\\r\\nX: 1\"}}"
        ));
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("not a valid HTTP header value"), "{e}");
    }
}
