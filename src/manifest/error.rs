//! A refused manifest: [`ManifestError`], and the context the checks word
//! their errors with ([`Doc`] for the document, [`KeyContext`] for one key). Every
//! line in a message is one the YAML parser gave (`yaml.rs`).

use std::path::{Path, PathBuf};

use super::yaml::{Fault, Value};

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
    /// The line the document's mapping starts on (1 for an empty file):
    /// where an error about a key that is not written points.
    pub start: usize,
    /// The top-level keys written, with their lines, as the parser read
    /// them.
    pub keys: super::KeyLines,
}

/// One top-level key being checked: the document and the key's name, so a
/// check's errors name the key and its line without repeating them. Its
/// readers of common kinds of value are in `value.rs`.
pub(super) struct KeyContext<'a> {
    /// The manifest.
    pub doc: &'a Doc<'a>,
    /// The key, as written; `parent.key` for a key nested under a
    /// top-level one (`sandbox.memory`).
    pub key: &'a str,
    /// The line the key is written on; none when it is not written (a
    /// default being checked).
    pub line: Option<usize>,
    /// True for a key nested under a top-level one.
    pub nested: bool,
}

impl<'a> Doc<'a> {
    /// The context for checking the top-level `key`, at its line when it
    /// is written.
    pub fn key(&'a self, key: &'a str) -> KeyContext<'a> {
        KeyContext { doc: self, key, line: self.line_of(key), nested: false }
    }

    /// The line of the top-level `key`, as the parser read it.
    pub fn line_of(&self, key: &str) -> Option<usize> {
        self.keys.line(key)
    }

    /// The context for checking a key nested under a top-level one: `key`
    /// is the full name (`sandbox.memory`), `line` where it is written.
    pub fn nested(&'a self, key: &'a str, line: usize) -> KeyContext<'a> {
        KeyContext { doc: self, key, line: Some(line), nested: true }
    }

    /// An error at an explicit line.
    pub fn at(&self, line: usize, key: Option<&str>, message: String) -> ManifestError {
        ManifestError { file: self.file.to_path_buf(), line: Some(line), key: key.map(str::to_string), message }
    }

    /// A text that is not one YAML document, at the line the parser gave.
    pub fn yaml_error(&self, fault: Fault) -> ManifestError {
        let not_yaml = |line: usize, what: String| {
            self.at(
                line,
                None,
                format!(
                    "not valid YAML: {what}; allowed: one YAML mapping of kebab-case keys, \
                     such as `app-name: hello` (indent with spaces, not tabs)"
                ),
            )
        };
        match fault {
            Fault::SecondDocument { line } => {
                self.at(line, None, "the file holds more than one YAML document (`---`); allowed: one app a file".to_string())
            }
            Fault::Duplicate { path, line } => self.at(line, Some(&path), "is given twice; allowed: each key once".to_string()),
            Fault::Syntax { info, line, col, .. } => not_yaml(line, format!("{info} at line {line} column {col}")),
            Fault::TooManyAliases { line } => not_yaml(line, format!("its aliases expand to too many values (at line {line})")),
        }
    }
}

impl KeyContext<'_> {
    /// An error about this key, at its line (or the document's first line
    /// when the key is not written, e.g. a default that fails).
    pub fn err(&self, message: String) -> ManifestError {
        let line = self.line.unwrap_or(self.doc.start);
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
        if let Some(s) = suggest(if self.nested { own } else { self.key }, keys) {
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
