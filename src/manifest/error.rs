//! A refused manifest: [`ManifestError`], the context the checks word their
//! errors with ([`Doc`] for the document, [`Cx`] for one key), and the
//! line-finding that puts the 1-based line of a key into every message.
//!
//! The line is searched in the text, as serde_yaml gives no positions for
//! the values of a mapping it has parsed.

use serde_yaml::Value;
use std::path::{Path, PathBuf};

/// A manifest that was refused: the message names the file, the line, the
/// key and what is allowed.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestError {
    /// The manifest file.
    pub file: PathBuf,
    /// The 1-based line, when known.
    pub line: Option<usize>,
    /// The key at fault, when there is one.
    pub key: Option<String>,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl std::fmt::Display for ManifestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": {key}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ManifestError {}

/// The manifest being read: what an error needs to name the file and find
/// a line, and the folder relative paths in it start from.
pub(super) struct Doc<'a> {
    /// The manifest's absolute path.
    pub file: &'a Path,
    /// The manifest's folder.
    pub dir: &'a Path,
    /// Its text (without a byte-order mark).
    pub text: &'a str,
}

/// One top-level key being checked: the document and the key's name, so a
/// check's errors name the key and its line without repeating them. Its
/// readers of common kinds of value are in `value.rs`.
pub(super) struct Cx<'a> {
    /// The manifest.
    pub doc: &'a Doc<'a>,
    /// The key, as written; `parent.key` for a key nested under a
    /// top-level one (`sandbox.memory`).
    pub key: &'a str,
    /// The line of a nested key (found by its parent); none for a
    /// top-level key, whose line is searched by its name.
    pub line: Option<usize>,
}

impl<'a> Doc<'a> {
    /// The context for checking `key`.
    pub fn key(&'a self, key: &'a str) -> Cx<'a> {
        Cx { doc: self, key, line: None }
    }

    /// The context for checking a key nested under a top-level one: `key`
    /// is the full name (`sandbox.memory`), `line` where it is written.
    pub fn nested(&'a self, key: &'a str, line: usize) -> Cx<'a> {
        Cx { doc: self, key, line: Some(line) }
    }

    /// An error at an explicit line.
    pub fn at(&self, line: usize, key: Option<&str>, message: String) -> ManifestError {
        ManifestError { file: self.file.to_path_buf(), line: Some(line), key: key.map(str::to_string), message }
    }

    /// A YAML syntax error (or a document serde_yaml refuses), at its line.
    pub fn yaml_error(&self, e: &serde_yaml::Error) -> ManifestError {
        let msg = e.to_string();
        if msg.contains("more than one document") {
            return self.at(
                second_document_line(self.text).unwrap_or(1),
                None,
                "the file holds more than one YAML document (`---`); allowed: one app a file".to_string(),
            );
        }
        if let Some(rest) = msg.strip_prefix("duplicate entry with key \"") {
            if let Some(key) = rest.split('"').next() {
                let second = self.text.lines().enumerate().filter(|(_, l)| line_of_key(l, key).is_some()).map(|(i, _)| i + 1).nth(1);
                let line = second.or_else(|| e.location().map(|l| l.line())).unwrap_or(1);
                return self.at(line, Some(key), "is given twice; allowed: each key once".to_string());
            }
        }
        let line = e.location().map(|l| l.line()).unwrap_or(1);
        self.at(
            line,
            None,
            format!(
                "not valid YAML: {msg}; allowed: one YAML mapping of kebab-case keys, \
                 such as `app-name: hello` (indent with spaces, not tabs)"
            ),
        )
    }
}

impl Cx<'_> {
    /// An error about this key, at its line (or the document's first line
    /// when the key is not written, e.g. a default that fails).
    pub fn err(&self, message: String) -> ManifestError {
        let line = self.line.or_else(|| key_line(self.doc.text, self.key)).unwrap_or_else(|| first_content_line(self.doc.text));
        self.doc.at(line, Some(self.key), message)
    }

    /// "X is not accepted; allowed: …"
    pub fn wrong_type(&self, v: &Value, allowed: &str) -> ManifestError {
        self.err(format!("{} is not accepted; allowed: {allowed}", describe(v)))
    }

    /// A key no manifest may hold, with the allowed `keys` and the closest
    /// one.
    pub fn unknown(&self, keys: &[&'static str]) -> ManifestError {
        let mut message = format!("unknown key; allowed keys: {}", keys.join(", "));
        let own = self.key.rsplit('.').next().unwrap_or(self.key);
        if let Some(s) = suggest(if self.line.is_some() { own } else { self.key }, keys) {
            message.push_str(&format!(" (did you mean {s}?)"));
        }
        self.err(message)
    }
}

/// How a YAML value is named in an error message.
pub(super) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "an empty value".to_string(),
        Value::Bool(b) => format!("{b} (true/false)"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("{s:?}"),
        Value::Sequence(_) => "a list".to_string(),
        Value::Mapping(_) => "a mapping".to_string(),
        Value::Tagged(t) => format!("a value tagged {}", t.tag),
    }
}

/// A scalar as the user wrote it, for "X is too long".
pub(super) fn shown_scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.trim().to_string(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => describe(other),
    }
}

/// The closest of `keys` to a misspelt key, if any is close.
fn suggest(key: &str, keys: &[&'static str]) -> Option<&'static str> {
    let k = key.trim().to_ascii_lowercase().replace(['_', ' '], "-");
    if let Some(exact) = keys.iter().find(|x| **x == k) {
        return Some(exact);
    }
    let suffix = format!("-{k}");
    let ends: Vec<&&str> = keys.iter().filter(|x| x.ends_with(&suffix)).collect();
    if ends.len() == 1 {
        return Some(ends[0]);
    }
    keys.iter().map(|x| (levenshtein(&k, x), *x)).filter(|(d, _)| *d <= 2).min_by_key(|(d, _)| *d).map(|(_, x)| x)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn is_blank_or_comment(l: &str) -> bool {
    let t = l.trim();
    t.is_empty() || t.starts_with('#')
}

/// The line of the `---` that starts a second document, if there is one.
fn second_document_line(text: &str) -> Option<usize> {
    let mut seen_content = false;
    for (i, l) in text.lines().enumerate() {
        if l.starts_with("---") {
            if seen_content {
                return Some(i + 1);
            }
            seen_content = true;
        } else if !is_blank_or_comment(l) {
            seen_content = true;
        }
    }
    None
}

/// The first line that is not blank, a comment or a document marker: where
/// the document's mapping starts (1 for an empty file).
pub(super) fn first_content_line(text: &str) -> usize {
    text.lines().position(|l| !is_blank_or_comment(l) && !l.starts_with("---") && !l.starts_with('%')).map(|i| i + 1).unwrap_or(1)
}

/// The 1-based line of a top-level key: bare at column 0 ([`line_of_key`]),
/// quoted at column 0, or else anywhere on a line (a flow mapping such as
/// `{app-name: x, port: 1}`).
pub(super) fn key_line(text: &str, key: &str) -> Option<usize> {
    line_of_key(text, key)
        .or_else(|| line_of_key(text, &format!("\"{key}\"")))
        .or_else(|| line_of_key(text, &format!("'{key}'")))
        .or_else(|| text.lines().position(|l| !l.trim_start().starts_with('#') && key_token_at(l, key).is_some()).map(|i| i + 1))
}

/// Where the text after `key:` begins on line `l`, when `l` holds `key`
/// (bare or quoted) as a mapping key: at the start of the line (after
/// blanks) or after `{` or `,`.
fn key_token_at(l: &str, key: &str) -> Option<usize> {
    let step = key.chars().next()?.len_utf8();
    let mut from = 0;
    while let Some(off) = l[from..].find(key) {
        let start = from + off;
        let end = start + key.len();
        from = start + step;
        let before = l[..start].trim_end();
        let before = before.strip_suffix(['"', '\'']).map(str::trim_end).unwrap_or(before);
        if !(before.is_empty() || before.ends_with('{') || before.ends_with(',')) {
            continue;
        }
        let mut after = &l[end..];
        if let Some(a) = after.strip_prefix(['"', '\'']) {
            after = a;
        }
        let trimmed = after.trim_start();
        if let Some(rest) = trimmed.strip_prefix(':') {
            return Some(l.len() - rest.len());
        }
    }
    None
}

/// The line of `key` nested under the top-level key at `parent_line`
/// (1-based): the indented lines that follow it, or the parent's own line
/// for a flow mapping.
pub(super) fn nested_key_line(text: &str, parent_line: usize, key: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let parent = lines.get(parent_line.checked_sub(1)?)?;
    // A flow mapping on the parent's own line: `env: {A: 1, B: x}`.
    if let Some(colon) = parent.find(':') {
        let rest = &parent[colon + 1..];
        if let Some(brace) = rest.find('{') {
            if key_token_at(&rest[brace..], key).is_some() {
                return Some(parent_line);
            }
        }
    }
    for (i, l) in lines.iter().enumerate().skip(parent_line) {
        if !l.is_empty() && !l.starts_with([' ', '\t']) && !l.trim_start().starts_with('#') {
            break;
        }
        if key_token_at(l, key).is_some() {
            return Some(i + 1);
        }
    }
    None
}

/// The scalar written after `key:` on a line, without a trailing comment.
pub(super) fn raw_value_after_key(l: &str, key: &str) -> Option<String> {
    let pos = key_token_at(l, key)?;
    let mut rest = &l[pos..];
    if let Some(i) = rest.find(" #").or_else(|| rest.find("\t#")) {
        rest = &rest[..i];
    }
    let rest = rest.trim().trim_end_matches(['}', ',']).trim();
    (!rest.is_empty()).then(|| rest.to_string())
}

/// The 1-based line where top-level `key:` stands in `text`, if it does.
pub fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines().position(|l| l.strip_prefix(key).map(|rest| rest.trim_start().starts_with(':')).unwrap_or(false)).map(|i| i + 1)
}
