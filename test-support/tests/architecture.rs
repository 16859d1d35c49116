//! The repository's own map, checked against the code so that neither can drift from the
//! other (`docs/ARCHITECTURE.md`, "Docs that are checked"):
//!
//! - the code map of `docs/ARCHITECTURE.md` names every `src` file of every workspace crate,
//!   by its path from the repository root, and every path the document names exists;
//! - every rule `OL-n` cited anywhere in the repository is defined in `docs/design.md`, whose
//!   rules are numbered 1 to the highest without a gap, and no text restates "all the rules"
//!   as a range that ends below the highest;
//! - the `Outcome` and `Command` lists of `docs/design.md` name every variant of core's enums
//!   and nothing that is not one;
//! - `store/SCHEMA.md` is the schema of `SCHEMA_VERSION` (`store/src/lib.rs`);
//! - the modules of each crate import each other in no circle (their `use crate::…`,
//!   `super::…` and `self::…` paths, in `use` items, code and macro input, form a DAG).
//!
//! Everything is read from the files at test time; nothing is generated.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test-support lies in the repository root")
        .to_path_buf()
}

fn read(rel: &str) -> String {
    fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// The directories of the workspace's crates, from the root `Cargo.toml` (`""` is the facade
/// crate at the root).
fn crate_dirs() -> Vec<String> {
    let manifest: toml::Table = read("Cargo.toml").parse().unwrap();
    let members = manifest["workspace"]["members"].as_array().unwrap();
    let mut dirs: Vec<String> = members
        .iter()
        .map(|m| m.as_str().unwrap().trim_end_matches('/').to_owned())
        .collect();
    assert!(
        dirs.iter().all(|d| !d.contains('*')),
        "a glob among the workspace members: list the crates one by one"
    );
    if manifest.contains_key("package") {
        dirs.push(String::new());
    }
    dirs
}

fn join(dir: &str, rest: &str) -> String {
    if dir.is_empty() {
        rest.to_owned()
    } else {
        format!("{dir}/{rest}")
    }
}

/// Every `.rs` file under `dir` (relative to the root), as paths from the root, sorted.
fn rust_files(dir: &str) -> Vec<String> {
    fn walk(abs: &Path, rel: &str, out: &mut Vec<String>) {
        let Ok(entries) = fs::read_dir(abs) else {
            return;
        };
        for entry in entries {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            let rel = format!("{rel}/{name}");
            if entry.file_type().unwrap().is_dir() {
                walk(&entry.path(), &rel, out);
            } else if name.ends_with(".rs") {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join(dir), dir, &mut out);
    out.sort();
    out
}

/// The `src` files of every workspace crate.
fn src_files() -> Vec<String> {
    crate_dirs()
        .iter()
        .flat_map(|d| rust_files(&join(d, "src")))
        .collect()
}

/// The spans of `text` between backticks.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The text of the section `heading` (a `## ` line) up to the next `## ` heading.
fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let start = doc
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no `{heading}` section"));
    let body = &doc[start + heading.len() + 2..];
    body.find("\n## ").map_or(body, |end| &body[..end])
}

// ---------------------------------------------------------------------------------------------
// The code map

/// The files of `files` that the code map `map` does not name.
fn unnamed<'a>(map: &str, files: &'a [String]) -> Vec<&'a str> {
    let named: BTreeSet<&str> = code_spans(map).into_iter().collect();
    files
        .iter()
        .map(String::as_str)
        .filter(|f| !named.contains(f))
        .collect()
}

#[test]
fn the_code_map_names_every_src_file() {
    let doc = read("docs/ARCHITECTURE.md");
    let files = src_files();
    assert!(
        files.len() > 100 && files.iter().any(|f| f == "src/lib.rs"),
        "only {} src files found: the walk is broken",
        files.len()
    );
    let missing = unnamed(section(&doc, "## Code map"), &files);
    assert!(
        missing.is_empty(),
        "docs/ARCHITECTURE.md's code map does not name these src files; add each, by its path \
         from the repository root in backticks (`core/src/lib.rs`), with what lives there, \
         under its crate's heading:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn the_code_map_check_sees_a_file_left_out() {
    let files = ["a/src/lib.rs", "a/src/x/mod.rs", "a/src/x/y.rs"].map(String::from);
    let map = "- `a/src/lib.rs` — the root. `a/src/x/mod.rs`: x; `y.rs` alone is no path.";
    assert_eq!(unnamed(map, &files), ["a/src/x/y.rs"]);
    assert!(unnamed(&format!("{map} `a/src/x/y.rs`"), &files).is_empty());
}

/// A code span that reads as a path of the repository: a file with one of these extensions,
/// or a directory (a trailing `/`).
fn repo_path(span: &str) -> bool {
    const EXTENSIONS: [&str; 7] = [".rs", ".md", ".toml", ".sh", ".json", ".yml", ".sql"];
    !span.is_empty()
        && span.contains('/')
        && !span.contains([' ', '*', '<', '>', '{', '(', '|', ':', '$', '=', '…'])
        && !span.starts_with(['/', '-', '.', '#'])
        && (span.ends_with('/') || EXTENSIONS.iter().any(|e| span.ends_with(e)))
}

#[test]
fn every_path_architecture_names_exists() {
    let doc = read("docs/ARCHITECTURE.md");
    let stale: Vec<&str> = code_spans(&doc)
        .into_iter()
        .filter(|s| repo_path(s) && !root().join(s).exists())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert!(
        stale.is_empty(),
        "docs/ARCHITECTURE.md names paths that do not exist (write them from the repository \
         root; a file moved or gone goes from the map too): {stale:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The rules OL-n

/// The rule numbers `docs/design.md` defines (a line opening with `**OL-n**`), in order.
fn defined_rules(design: &str) -> Vec<u32> {
    design
        .lines()
        .filter_map(|l| l.strip_prefix("**OL-"))
        .filter_map(|l| l.split_once("**"))
        .map(|(n, _)| n.parse().unwrap())
        .collect()
}

/// Every `OL-n` in `text` (not inside a longer word), with its line number and the text that
/// follows it on the line.
fn cited_rules(text: &str) -> Vec<(usize, u32, &str)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut from = 0;
        while let Some(at) = line[from..].find("OL-") {
            let start = from + at;
            from = start + 3;
            if line[..start]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
            {
                continue;
            }
            let digits: String = line[from..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if let Ok(n) = digits.parse() {
                out.push((i + 1, n, &line[from + digits.len()..]));
            }
        }
    }
    out
}

/// The text files of the repository: everything but `.git`, build output and binary files.
fn text_files() -> Vec<(String, String)> {
    fn walk(abs: &Path, rel: &str, out: &mut Vec<(String, String)>) {
        for entry in fs::read_dir(abs).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            let rel = join(rel, &name);
            if entry.file_type().unwrap().is_dir() {
                if name != ".git" && name != "target" && name != "node_modules" {
                    walk(&entry.path(), &rel, out);
                }
            } else if entry.file_type().unwrap().is_file() {
                if let Ok(text) = fs::read_to_string(entry.path()) {
                    out.push((rel, text));
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(&root(), "", &mut out);
    out
}

#[test]
fn every_rule_cited_is_defined_in_the_design() {
    let design = read("docs/design.md");
    let defined = defined_rules(&design);
    let highest = *defined.iter().max().expect("design.md defines no rule");
    let mut sorted = defined.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (1..=highest).collect::<Vec<_>>(),
        "docs/design.md defines each rule OL-1 … OL-{highest} once (a line opening with `**OL-n**`)"
    );
    let files = text_files();
    assert!(
        files.iter().any(|(f, _)| f == "core/src/scheduler/mod.rs"),
        "the walk missed the sources"
    );
    let mut undefined = Vec::new();
    let mut whole_ranges = Vec::new();
    for (file, text) in &files {
        for (line, n, after) in cited_rules(text) {
            if !defined.contains(&n) {
                undefined.push(format!("{file}:{line}: OL-{n}"));
            }
            // "OL-1 … OL-n": all the rules, which goes stale when a rule is added.
            let range_end = after
                .trim_start_matches([' ', '…', '.', '–', '-'])
                .strip_prefix("OL-")
                .map(|r| {
                    r.chars()
                        .take_while(char::is_ascii_digit)
                        .collect::<String>()
                });
            if n == 1 && file != "docs/design.md" {
                if let Some(end) = range_end.and_then(|e| e.parse::<u32>().ok()) {
                    if end != highest {
                        whole_ranges.push(format!("{file}:{line}: OL-1 … OL-{end}"));
                    }
                }
            }
        }
    }
    assert!(
        undefined.is_empty(),
        "rules cited but not defined in docs/design.md (highest: OL-{highest}):\n{}",
        undefined.join("\n")
    );
    assert!(
        whole_ranges.is_empty(),
        "these restate the whole range of rules, and it is OL-1 … OL-{highest}; say \"the rules \
         of docs/design.md\" instead of a range:\n{}",
        whole_ranges.join("\n")
    );
}

#[test]
fn rules_are_read_from_the_design_not_assumed() {
    // (The range is split in the source, or this file would restate one.)
    let text = concat!(
        "**OL-1** one\n\n**OL-2** two\nsee OL-2 and TOOL-9, OL-1 … O",
        "L-2\n"
    );
    assert_eq!(defined_rules(text), vec![1, 2]);
    let cited: Vec<(usize, u32)> = cited_rules(text).iter().map(|c| (c.0, c.1)).collect();
    assert_eq!(cited, vec![(1, 1), (3, 2), (4, 2), (4, 1), (4, 2)]);
}

// ---------------------------------------------------------------------------------------------
// The lists of design.md, the schema version

fn parse(rel: &str) -> syn::File {
    syn::parse_file(&read(rel)).unwrap_or_else(|e| panic!("parsing {rel}: {e}"))
}

/// The variants of `enum name` in the file `rel`.
fn variants(rel: &str, name: &str) -> Vec<String> {
    parse(rel)
        .items
        .iter()
        .find_map(|i| match i {
            syn::Item::Enum(e) if e.ident == name => {
                Some(e.variants.iter().map(|v| v.ident.to_string()).collect())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no enum {name} in {rel}"))
}

/// The names of the types core defines.
fn core_types() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for file in rust_files("core/src") {
        for item in parse(&file).items {
            let ident = match item {
                syn::Item::Enum(i) => i.ident,
                syn::Item::Struct(i) => i.ident,
                syn::Item::Trait(i) => i.ident,
                syn::Item::Type(i) => i.ident,
                _ => continue,
            };
            names.insert(ident.to_string());
        }
    }
    names
}

/// The bullet of design.md that opens with "- `name`" (up to the next bullet or heading).
fn bullet<'a>(design: &'a str, name: &str) -> &'a str {
    let open = format!("- `{name}`");
    let start = design
        .find(&format!("\n{open}"))
        .unwrap_or_else(|| panic!("docs/design.md has no bullet opening with `{name}`"))
        + 1;
    let rest = &design[start + open.len()..];
    let end = ["\n- ", "\n#", "\n\n"]
        .iter()
        .filter_map(|e| rest.find(e))
        .min()
        .unwrap_or(rest.len());
    &design[start..start + open.len() + end]
}

fn check_list(name: &str, rel: &str) {
    let design = read("docs/design.md");
    let text = bullet(&design, name);
    let spans: BTreeSet<&str> = code_spans(text).into_iter().collect();
    let variants = variants(rel, name);
    let missing: Vec<&String> = variants
        .iter()
        .filter(|v| !spans.contains(v.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/design.md's `{name}` list (§4) lacks {missing:?}, variants of {name} in {rel}"
    );
    // A name that looks like a variant but is none (a variant removed or renamed).
    let types = core_types();
    let stale: Vec<&str> = spans
        .iter()
        .copied()
        .filter(|s| {
            s.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                && s.chars().all(|c| c.is_ascii_alphanumeric())
                && !variants.iter().any(|v| v == s)
                && !types.contains(*s)
        })
        .collect();
    assert!(
        stale.is_empty(),
        "docs/design.md's `{name}` list names {stale:?}, which are neither variants of {name} \
         ({rel}) nor types of core"
    );
}

#[test]
fn the_design_lists_every_outcome() {
    check_list("Outcome", "core/src/outcome.rs");
}

#[test]
fn the_design_lists_every_command() {
    check_list("Command", "core/src/scheduler/types.rs");
}

#[test]
fn the_schema_document_is_of_the_current_version() {
    let lib = parse("store/src/lib.rs");
    let version: u32 = lib
        .items
        .iter()
        .find_map(|i| match i {
            syn::Item::Const(c) if c.ident == "SCHEMA_VERSION" => match &*c.expr {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(n),
                    ..
                }) => Some(n.base10_parse().unwrap()),
                _ => None,
            },
            _ => None,
        })
        .expect("store/src/lib.rs defines `SCHEMA_VERSION` as a number");
    let schema = read("store/SCHEMA.md");
    let title = schema.lines().next().unwrap();
    assert_eq!(
        title,
        format!("# outbox-lanes store schema (version {version})"),
        "store/SCHEMA.md's title names the version of SCHEMA_VERSION (store/src/lib.rs)"
    );
    let upgrade = format!("Version {} → {version} ", version - 1);
    assert!(
        schema.contains(&upgrade),
        "store/SCHEMA.md says what `{upgrade}` changes"
    );
    // The design does not restate the number (it would go stale): it points here.
    let design = read("docs/design.md");
    let (_, said) = design
        .split_once("The schema is versioned (")
        .expect("docs/design.md says that the schema is versioned");
    let said = &said[..said.find(')').unwrap_or(said.len())];
    assert!(
        !said.contains(|c: char| c.is_ascii_digit()),
        "docs/design.md names the schema's version ({said}): point to `SCHEMA_VERSION` and \
         store/SCHEMA.md instead"
    );
}

// ---------------------------------------------------------------------------------------------
// Import circles

/// One crate's modules: each file is a module, named by its path in the crate.
struct Crate {
    /// The module path of each file.
    files: BTreeMap<Vec<String>, String>,
    /// The `use` items of each module (inline ones included), by the name they bind: the
    /// absolute path they stand for.
    uses: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
    /// The inline modules (`mod name { … }`).
    inline: BTreeSet<Vec<String>>,
}

/// The module path of a file of `src` (relative to `src`).
fn module_of(rel: &str) -> Vec<String> {
    let rel = rel.trim_end_matches(".rs");
    let mut path: Vec<String> = rel.split('/').map(str::to_owned).collect();
    if matches!(
        path.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        path.pop();
    }
    path
}

fn cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item;
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The paths a `use` tree stands for, each with the name it binds (`None` for a glob).
fn flatten(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                out.push((prefix.clone(), prefix.last().cloned()));
            } else {
                let mut p = prefix.clone();
                p.push(name.clone());
                out.push((p, Some(name)));
            }
        }
        syn::UseTree::Rename(r) => {
            let mut p = prefix.clone();
            if r.ident != "self" {
                p.push(r.ident.to_string());
            }
            out.push((p, Some(r.rename.to_string())));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), None)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten(t, prefix, out);
            }
        }
    }
}

/// A path written in module `at`, made absolute if it starts with `crate`, `self` or `super`
/// (or with a module of `known` under `at`); `None` for a path outside the crate.
fn absolute(
    at: &[String],
    path: &[String],
    known: &dyn Fn(&[String]) -> bool,
) -> Option<Vec<String>> {
    let first = path.first()?;
    let mut base: Vec<String> = match first.as_str() {
        "crate" => Vec::new(),
        "self" => at.to_vec(),
        "super" => {
            let mut base = at.to_vec();
            let supers = path.iter().take_while(|s| *s == "super").count();
            for _ in 0..supers {
                base.pop()?;
            }
            base.extend(path[supers..].iter().cloned());
            return Some(base);
        }
        _ => {
            // Rust 2018: a path may start with a module declared in `at`.
            let mut child = at.to_vec();
            child.push(first.clone());
            if !known(&child) {
                return None;
            }
            at.to_vec()
        }
    };
    let skip = usize::from(matches!(first.as_str(), "crate" | "self"));
    base.extend(path[skip..].iter().cloned());
    Some(base)
}

/// Collects the `use` items and inline modules of a crate's files.
struct Collect {
    module: Vec<String>,
    raw_uses: Vec<(Vec<String>, Vec<String>, Option<String>)>,
    inline: BTreeSet<Vec<String>>,
}

impl<'ast> Visit<'ast> for Collect {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if cfg_test(item_attrs(item)) {
            return;
        }
        syn::visit::visit_item(self, item);
    }
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.module.push(m.ident.to_string());
            self.inline.insert(self.module.clone());
            syn::visit::visit_item_mod(self, m);
            self.module.pop();
        }
    }
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut out = Vec::new();
        flatten(&u.tree, &mut Vec::new(), &mut out);
        for (path, name) in out {
            self.raw_uses.push((self.module.clone(), path, name));
        }
    }
}

impl Crate {
    fn read(src: &str) -> Crate {
        let mut files = BTreeMap::new();
        for file in rust_files(src) {
            let rel = &file[src.len() + 1..];
            files.insert(module_of(rel), file.clone());
        }
        let mut c = Crate {
            files,
            uses: BTreeMap::new(),
            inline: BTreeSet::new(),
        };
        let mut raw = Vec::new();
        for (module, file) in &c.files {
            let mut v = Collect {
                module: module.clone(),
                raw_uses: Vec::new(),
                inline: BTreeSet::new(),
            };
            v.visit_file(&parse(file));
            raw.extend(v.raw_uses);
            c.inline.extend(v.inline);
        }
        for (module, path, name) in raw {
            let Some(name) = name else { continue };
            if let Some(abs) = absolute(&module, &path, &|p| c.is_module(p)) {
                c.uses.entry(module).or_default().insert(name, abs);
            }
        }
        c
    }

    fn is_module(&self, path: &[String]) -> bool {
        path.is_empty() || self.files.contains_key(path) || self.inline.contains(path)
    }

    /// The file of the module that defines what the absolute `path` names: modules are
    /// walked down, and a name a module only imports (a re-export) is followed to its source.
    fn resolve(&self, path: &[String], depth: usize) -> Vec<String> {
        let mut module: Vec<String> = Vec::new();
        for (i, seg) in path.iter().enumerate() {
            let mut child = module.clone();
            child.push(seg.clone());
            if self.is_module(&child) {
                module = child;
                continue;
            }
            if depth < 8 {
                if let Some(target) = self.uses.get(&module).and_then(|u| u.get(seg)) {
                    let mut next = target.clone();
                    next.extend(path[i + 1..].iter().cloned());
                    return self.resolve(&next, depth + 1);
                }
            }
            break;
        }
        self.file_module(&module)
    }

    /// The module of the file that holds `module` (an inline module is part of its file).
    fn file_module(&self, module: &[String]) -> Vec<String> {
        let mut m = module.to_vec();
        while !self.files.contains_key(&m) && !m.is_empty() {
            m.pop();
        }
        m
    }

    /// Each import of a module by another: (from, to) → the names used (see [`Paths`]). A
    /// module's use of its own descendants is left out (a parent owns its children: `mod.rs` declaring and
    /// using them is no circle; the children must not tie each other, or their parent, into
    /// one).
    fn edges(&self) -> BTreeMap<(String, String), BTreeSet<String>> {
        let mut edges: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for (module, file) in &self.files {
            let mut paths = Paths {
                module: module.clone(),
                found: Vec::new(),
                idents: BTreeSet::new(),
            };
            paths.visit_file(&parse(file));
            for (at, path, handed_on) in paths.found {
                if handed_on.is_some_and(|name| !paths.idents.contains(&name)) {
                    continue;
                }
                let Some(abs) = absolute(&at, &path, &|p| self.is_module(p)) else {
                    continue;
                };
                let to = self.resolve(&abs, 0);
                if to.starts_with(module) {
                    continue;
                }
                let name = path.last().cloned().unwrap_or_default();
                edges
                    .entry((file.clone(), self.files[&to].clone()))
                    .or_default()
                    .insert(name);
            }
        }
        edges
    }
}

/// Every path of a file that starts with `crate`, `self` or `super`: in `use` items, in code
/// and types, and in the tokens of macro calls (`concat!(crate::m::sql!(), …)`). A `pub use`
/// that only hands a name on ties nothing (who uses the name is led to its source); one whose
/// name the file's own code uses does.
struct Paths {
    module: Vec<String>,
    /// (module, path, the name a `pub use` hands on).
    found: Vec<(Vec<String>, Vec<String>, Option<String>)>,
    /// The identifiers of the file's code (its `use` items aside).
    idents: BTreeSet<String>,
}

impl Paths {
    fn tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id)
                    if !matches!(id.to_string().as_str(), "crate" | "self" | "super") =>
                {
                    self.idents.insert(id.to_string());
                }
                TokenTree::Ident(id) => {
                    let mut path = vec![id.to_string()];
                    let mut j = i + 1;
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(n)),
                    ) = (tokens.get(j), tokens.get(j + 1), tokens.get(j + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        path.push(n.to_string());
                        j += 3;
                    }
                    if path.len() > 1 {
                        self.idents.extend(path[1..].iter().cloned());
                        self.found.push((self.module.clone(), path, None));
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if cfg_test(item_attrs(item)) {
            return;
        }
        syn::visit::visit_item(self, item);
    }
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.module.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.module.pop();
        }
    }
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let public = !matches!(u.vis, syn::Visibility::Inherited);
        let mut out = Vec::new();
        flatten(&u.tree, &mut Vec::new(), &mut out);
        for (path, name) in out {
            let handed_on = if public { name } else { None };
            self.found.push((self.module.clone(), path, handed_on));
        }
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segs.len() > 1 && matches!(segs[0].as_str(), "crate" | "self" | "super") {
            self.found.push((self.module.clone(), segs, None));
        }
        syn::visit::visit_path(self, p);
    }
    fn visit_ident(&mut self, i: &'ast proc_macro2::Ident) {
        self.idents.insert(i.to_string());
    }
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }
}

/// The circles of a graph: its strongly connected components of more than one node
/// (Tarjan's algorithm).
fn circles(edges: &BTreeMap<(String, String), BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        next: BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.next.get(v).cloned().unwrap_or_default() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                loop {
                    let w = self.stack.pop().expect("v is on the stack");
                    self.on_stack.remove(w);
                    scc.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        next: BTreeMap::new(),
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for (from, to) in edges.keys() {
        t.next.entry(from).or_default().push(to);
        t.next.entry(to).or_default();
    }
    let nodes: Vec<&str> = t.next.keys().copied().collect();
    for v in nodes {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

/// The circles of the crate in `src` (from the repository root, or absolute): the files of
/// each, and what ties it (file -> file: names).
fn import_circles(src: &str) -> Vec<(Vec<String>, String)> {
    let edges = Crate::read(src).edges();
    circles(&edges)
        .into_iter()
        .map(|scc| {
            let ties: Vec<String> = edges
                .iter()
                .filter(|((a, b), _)| scc.contains(a) && scc.contains(b))
                .map(|((a, b), names)| {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    format!("    {a} -> {b}: {}", names.join(", "))
                })
                .collect();
            let text = format!("  {}:\n{}", scc.join(", "), ties.join("\n"));
            (scc, text)
        })
        .collect()
}

/// Circles left for now, each with why. The test fails when another circle appears, when one
/// of these takes in more files, and when one is gone (then delete its entry).
const KNOWN_CIRCLES: &[(&[&str], &str)] = &[];

#[test]
fn no_crate_has_an_import_circle() {
    let mut found = Vec::new();
    let mut known: Vec<&[&str]> = Vec::new();
    let mut crates = 0;
    for dir in crate_dirs() {
        let src = join(&dir, "src");
        if root().join(&src).is_dir() {
            crates += 1;
            for (files, text) in import_circles(&src) {
                match KNOWN_CIRCLES.iter().find(|(k, _)| *k == files.as_slice()) {
                    Some((k, _)) => known.push(k),
                    None => found.push(text),
                }
            }
        }
    }
    assert!(crates >= 9, "only {crates} crates read");
    assert!(
        found.is_empty(),
        "modules that import each other in a circle; move what they share to the module it \
         belongs to, or to a small module of its own (not behind a longer path: the check \
         reads those too):\n{}",
        found.join("\n")
    );
    let gone: Vec<&[&str]> = KNOWN_CIRCLES
        .iter()
        .map(|(k, _)| *k)
        .filter(|k| !known.contains(k))
        .collect();
    assert!(
        gone.is_empty(),
        "these circles are gone: delete them from KNOWN_CIRCLES (and from \
         docs/ARCHITECTURE.md): {gone:?}"
    );
}

#[test]
fn the_import_check_sees_circles_through_groups_super_and_code() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("m")).unwrap();
    let files = [
        (
            "lib.rs",
            "mod a; mod b; mod c; mod d; mod f; mod g; mod h; mod k; mod m; pub use a::A;",
        ),
        // A grouped import; a name used through the root's re-export, followed to its source.
        ("a.rs", "use crate::{b::B, d::D, m::{self}};\npub struct A;"),
        // A path in code, not in a `use`.
        ("b.rs", "pub struct B;\nfn f() { let _ = crate::c::C; }"),
        // A path in a macro's input.
        ("c.rs", "pub const C: &str = concat!(crate::A::x!());"),
        // A name handed on (`pub use`) and not used ties nothing; one used does.
        ("f.rs", "pub use crate::g::G;\npub struct F;"),
        ("g.rs", "use crate::f::F;\npub struct G;"),
        ("h.rs", "pub use crate::k::K;\npub struct H(K);"),
        ("k.rs", "use crate::h::H;\npub struct K;"),
        // super:: from a child module; its parent's use of it is no circle.
        ("m/mod.rs", "mod k; use k::K; use self::k::L;"),
        (
            "m/k.rs",
            "pub struct K; pub struct L; use super::super::b::B;",
        ),
        // Test code is left out.
        (
            "d.rs",
            "pub struct D;\n#[cfg(test)]\nmod tests { use crate::a::A; }",
        ),
    ];
    for (name, text) in files {
        fs::write(src.join(name), text).unwrap();
    }
    let src = src.to_str().unwrap();
    let circles = import_circles(src);
    let files =
        |names: &[&str]| -> Vec<String> { names.iter().map(|f| format!("{src}/{f}")).collect() };
    assert_eq!(
        circles.iter().map(|c| c.0.clone()).collect::<Vec<_>>(),
        [files(&["a.rs", "b.rs", "c.rs"]), files(&["h.rs", "k.rs"])],
        "{circles:?}"
    );
    // What ties c.rs to a.rs: the macro `x` it reaches through the root's `pub use a::A`.
    assert!(
        circles[0]
            .1
            .contains(&format!("{src}/c.rs -> {src}/a.rs: x")),
        "{}",
        circles[0].1
    );
}
