//! `enqueue`: JSON lines in, one JSON result per row out, all or nothing.

use std::collections::HashMap;

use outbox_lanes_core::LaneKey;
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
    content_type: Option<String>,
    dedup_key: Option<String>,
    ordering_key: Option<String>,
    joined: Option<bool>,
}

/// A field that is present, whatever its value (`null` included).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
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
    let body = line
        .body
        .ok_or("missing \"body\" (any JSON value, sent as its JSON text)")?;
    let content_type = line
        .content_type
        .unwrap_or_else(|| "application/json".into());
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
    Ok(NewRow {
        id,
        body: body.get().as_bytes().to_vec(),
        content_type,
        recipients: to,
        dedup_key: line.dedup_key.filter(|k| !k.is_empty()),
        ordering_key: line.ordering_key.filter(|k| !k.is_empty()),
        joined: line.joined.unwrap_or(false),
        headers: Vec::new(),
    })
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
/// The first bad line (malformed, invalid, not UTF-8, too long) refuses the whole input.
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
                format!("id {row:?} is already used by this actor"),
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
        assert_eq!(b.rows[1].body, b"\"s\"");
        assert!(b.rows[1].joined);
        assert_eq!(b.lines, [1, 3]);
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
