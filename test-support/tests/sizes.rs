//! The driver stays a room one can live in (`docs/ARCHITECTURE.md`, "Docs that are checked"):
//! in `driver/src`, tests aside, no function is longer than [`MAX_FN_LINES`] lines, no file
//! longer than [`MAX_FILE_LINES`], and the pass's executor (`PassCore`) has at most
//! [`MAX_PASS_FIELDS`] fields. A function or file that grows past a bound is split, not the
//! bound raised.
//!
//! Lines are counted on the text: a `#[cfg(test)] mod … { … }` block is left out, and a
//! function runs from its `fn` line to the line of its body's closing brace, found by
//! counting braces outside comments, strings and character literals.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};

const MAX_FN_LINES: usize = 100;
const MAX_FILE_LINES: usize = 1000;
const MAX_PASS_FIELDS: usize = 15;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Each line's brace depth change, outside comments, strings and character literals.
fn brace_deltas(text: &str) -> Vec<i32> {
    #[derive(PartialEq)]
    enum In {
        Code,
        Line,
        Block(u32),
        Str,
        Raw(usize),
    }
    let chars: Vec<char> = text.chars().collect();
    let mut deltas = vec![0i32];
    let mut state = In::Code;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            deltas.push(0);
            if state == In::Line {
                state = In::Code;
            }
            i += 1;
            continue;
        }
        match state {
            In::Code => match c {
                '/' if next == Some('/') => state = In::Line,
                '/' if next == Some('*') => {
                    state = In::Block(1);
                    i += 1;
                }
                '"' => state = In::Str,
                'r' if matches!(next, Some('"' | '#'))
                    && (i == 0
                        || chars[i - 1] == 'b'
                        || !chars[i - 1].is_alphanumeric() && chars[i - 1] != '_') =>
                {
                    let mut j = i + 1;
                    while chars.get(j) == Some(&'#') {
                        j += 1;
                    }
                    if chars.get(j) == Some(&'"') {
                        state = In::Raw(j - i - 1);
                        i = j;
                    }
                }
                '\'' => {
                    // A character literal ('{', '\'', '\u{7b}'), not a lifetime ('a).
                    if next == Some('\\') {
                        let mut j = i + 3;
                        while j < chars.len() && chars[j] != '\'' {
                            j += 1;
                        }
                        i = j;
                    } else if chars.get(i + 2) == Some(&'\'') {
                        i += 2;
                    }
                }
                '{' => *deltas.last_mut().unwrap() += 1,
                '}' => *deltas.last_mut().unwrap() -= 1,
                _ => {}
            },
            In::Line => {}
            In::Block(depth) => {
                if c == '*' && next == Some('/') {
                    state = if depth == 1 {
                        In::Code
                    } else {
                        In::Block(depth - 1)
                    };
                    i += 1;
                } else if c == '/' && next == Some('*') {
                    state = In::Block(depth + 1);
                    i += 1;
                }
            }
            In::Str => {
                if c == '\\' && next != Some('\n') {
                    i += 1;
                } else if c == '"' {
                    state = In::Code;
                }
            }
            In::Raw(hashes) => {
                if c == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
                    state = In::Code;
                    i += hashes;
                }
            }
        }
        i += 1;
    }
    deltas
}

/// The line after the one that closes the block opened at or after `from`.
fn block_end(deltas: &[i32], from: usize) -> usize {
    let mut depth = 0;
    let mut opened = false;
    for (n, d) in deltas.iter().enumerate().skip(from) {
        depth += d;
        opened |= *d > 0 || depth > 0;
        if opened && depth <= 0 {
            return n + 1;
        }
    }
    deltas.len()
}

fn is_fn_line(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let name = rest.strip_prefix("fn ")?;
    Some(name.split(['(', '<']).next().unwrap_or(name))
}

/// The file's lines with its `#[cfg(test)] mod` blocks left out, and its functions'
/// (name, first line, length) among those.
fn measure(text: &str) -> (usize, Vec<(String, usize, usize)>) {
    let lines: Vec<&str> = text.lines().collect();
    let deltas = brace_deltas(text);
    let mut kept = 0;
    let mut fns = Vec::new();
    let mut n = 0;
    while n < lines.len() {
        let line = lines[n].trim();
        if line == "#[cfg(test)]"
            && lines.get(n + 1).is_some_and(|l| {
                let l = l.trim_start();
                l.starts_with("mod ") || l.starts_with("pub(crate) mod ")
            })
            && !lines[n + 1].trim_end().ends_with(';')
        {
            n = block_end(&deltas, n + 1);
            continue;
        }
        kept += 1;
        if let Some(name) = is_fn_line(lines[n]) {
            // A declaration without a body (a trait's) ends at its `;`.
            let body = (n..lines.len())
                .find(|&k| lines[k].contains('{') || lines[k].trim_end().ends_with(';'))
                .unwrap_or(n);
            if !lines[body].trim_end().ends_with(';') || lines[body].contains('{') {
                let end = block_end(&deltas, n);
                fns.push((name.to_owned(), n + 1, end - n));
            }
        }
        n += 1;
    }
    (kept, fns)
}

#[test]
fn no_driver_function_or_file_is_too_long() {
    let mut files = Vec::new();
    rust_files(&root().join("driver/src"), &mut files);
    assert!(files.len() > 20, "driver/src read: {} files", files.len());
    let mut over = Vec::new();
    for path in files {
        let rel = path.strip_prefix(root()).unwrap().display().to_string();
        let (lines, fns) = measure(&fs::read_to_string(&path).unwrap());
        if lines > MAX_FILE_LINES {
            over.push(format!("{rel}: {lines} lines (at most {MAX_FILE_LINES})"));
        }
        for (name, at, len) in fns {
            if len > MAX_FN_LINES {
                over.push(format!(
                    "{rel}:{at}: fn {name} is {len} lines (at most {MAX_FN_LINES})"
                ));
            }
        }
    }
    assert!(over.is_empty(), "split these:\n{}", over.join("\n"));
}

#[test]
fn the_pass_executor_has_few_fields() {
    let text = fs::read_to_string(root().join("driver/src/pass/mod.rs")).unwrap();
    let file = syn::parse_file(&text).unwrap();
    let fields = file
        .items
        .iter()
        .find_map(|item| match item {
            syn::Item::Struct(s) if s.ident == "PassCore" => Some(s.fields.len()),
            _ => None,
        })
        .expect("struct PassCore in driver/src/pass/mod.rs");
    assert!(
        fields <= MAX_PASS_FIELDS,
        "PassCore has {fields} fields (at most {MAX_PASS_FIELDS})"
    );
}

#[test]
fn the_measure_sees_what_it_bounds() {
    let text = r#"
fn short() {
    let s = "}}}"; // }
    let c = '{';
    let long = "a \
        }";
    let q = '\'';
    let r = br"{";
}

#[cfg(test)]
mod tests {
    fn hidden() {
        a();
        b();
    }
}

pub(crate) fn three<'a>(x: &'a str) -> &'a str {
    /* { */ x
}
"#;
    let (lines, fns) = measure(text);
    assert_eq!(
        fns,
        vec![("short".to_owned(), 2, 8), ("three".to_owned(), 19, 3)]
    );
    assert_eq!(lines, text.lines().count() - 7);
}
