//! The manifest's YAML, read with saphyr's parser (`saphyr-parser`) into a
//! tree of [`Node`]s that each know the line they start on, so every error
//! names the line the parser saw, never one searched for in the text.
//!
//! The tree is built from the parser's events rather than with saphyr's own
//! loader: its mapping is a hash map, which keeps one of two duplicate keys
//! and, refusing a duplicate, says which line but not which key; here a
//! mapping is the list of its entries as written, so a duplicate is named
//! with its path (`env.A`) and line. Scalars are resolved as the manifest has
//! always read them (the YAML 1.2 core schema as serde_yaml applied it:
//! `0x`/`0o`/`0b` integers, a leading zero is text, `.inf`), and each keeps
//! its text as written (an env value `1.10` stays "1.10").

use saphyr_parser::{Event, Parser, ScalarStyle, ScanError, Tag};
use std::collections::BTreeMap;

/// A YAML value at a line of the manifest.
#[derive(Debug, Clone)]
pub(super) struct Node {
    /// The value.
    pub value: Value,
    /// The 1-based line it starts on.
    pub line: usize,
    /// A scalar's text as written (none for a list or a mapping).
    pub raw: Option<String>,
}

/// A YAML value, as the keys' checks read it.
#[derive(Debug, Clone)]
pub(super) enum Value {
    /// `~`, `null` or nothing.
    Null,
    /// true/false.
    Bool(bool),
    /// A number, with the text it was written as.
    Number(Number),
    /// Text.
    String(String),
    /// A list.
    Sequence(Seq),
    /// A mapping: its entries (key, value) in the order written.
    Mapping(Vec<(Node, Node)>),
    /// A value with a tag of the user's own (`!custom 8080`).
    Tagged(Box<Tagged>),
}

/// A value with a tag other than the core schema's.
#[derive(Debug, Clone)]
pub(super) struct Tagged {
    /// The tag as written (`!custom`).
    pub tag: String,
    /// The value it tags.
    pub value: Value,
}

/// A list's items, each with its line.
#[derive(Debug, Clone, Default)]
pub(super) struct Seq(pub Vec<Node>);

impl Seq {
    /// The items' values.
    pub fn iter(&self) -> impl Iterator<Item = &Value> {
        self.0.iter().map(|n| &n.value)
    }
}

/// A YAML number. Integers beyond 64 bits are kept as written (no key
/// takes one; the message shows it).
#[derive(Debug, Clone)]
pub(super) struct Number {
    /// Its value.
    kind: NumberKind,
    /// The text it was written as.
    pub raw: String,
}

#[derive(Debug, Clone, Copy)]
enum NumberKind {
    Pos(u64),
    Neg(i64),
    Float(f64),
    Big,
}

impl Number {
    /// A whole number ≥ 0.
    pub fn is_u64(&self) -> bool {
        matches!(self.kind, NumberKind::Pos(_))
    }

    /// A whole number that fits an i64.
    pub fn is_i64(&self) -> bool {
        matches!(self.kind, NumberKind::Neg(_)) || matches!(self.kind, NumberKind::Pos(n) if i64::try_from(n).is_ok())
    }

    /// The number as a u64, when it is a whole number ≥ 0.
    pub fn as_u64(&self) -> Option<u64> {
        match self.kind {
            NumberKind::Pos(n) => Some(n),
            _ => None,
        }
    }

    /// The number as an f64.
    pub fn as_f64(&self) -> Option<f64> {
        match self.kind {
            NumberKind::Pos(n) => Some(n as f64),
            NumberKind::Neg(n) => Some(n as f64),
            NumberKind::Float(x) => Some(x),
            NumberKind::Big => self.raw.parse().ok(),
        }
    }
}

impl std::fmt::Display for Number {
    /// The value (not the text): `0x1F90` shows as 8080, `1e3` as 1000.0.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            NumberKind::Pos(n) => write!(f, "{n}"),
            NumberKind::Neg(n) => write!(f, "{n}"),
            NumberKind::Float(x) if x.is_nan() => f.write_str(".nan"),
            NumberKind::Float(x) if x.is_infinite() => f.write_str(if x < 0.0 { "-.inf" } else { ".inf" }),
            NumberKind::Float(x) => {
                let s = x.to_string();
                if s.contains(['.', 'e']) {
                    f.write_str(&s)
                } else {
                    write!(f, "{s}.0")
                }
            }
            NumberKind::Big => f.write_str(&self.raw),
        }
    }
}

/// Why a text is not one YAML document the manifest can be read from.
#[derive(Debug, PartialEq)]
pub(super) enum Fault {
    /// The parser refused it: what it says, at a line and column (1-based).
    Syntax { info: String, line: usize, col: usize, index: Option<usize> },
    /// A second document starts at this line.
    SecondDocument { line: usize },
    /// A key is given twice in one mapping: its path (`env.A`), and the
    /// line of its second use.
    Duplicate { path: String, line: usize },
    /// Aliases expand to more nodes than a manifest can hold.
    TooManyAliases { line: usize },
}

/// The most nodes aliases may expand to (a few nested anchors can otherwise
/// make an exponential tree).
const ALIAS_BUDGET: usize = 10_000;

/// One collection being read.
enum Frame {
    Seq { line: usize, items: Vec<Node>, anchor: usize, tag: Option<String> },
    Map { line: usize, entries: Vec<(Node, Node)>, key: Option<Node>, anchor: usize, tag: Option<String> },
}

/// Reads the one document of `text`: none when the stream holds no node
/// (an empty file, only comments).
///
/// A tab after a key's `:` (`port:<tab>8080`) is YAML's separating
/// whitespace, which saphyr refuses there; such a tab, where the parser
/// stops, is read as a space and the text read again (the positions stay
/// the same: one character for one).
pub(super) fn load(text: &str) -> Result<Option<Node>, Fault> {
    let mut text = std::borrow::Cow::Borrowed(text);
    // Each turn turns one tab into a space, so this ends.
    loop {
        let fault = match load_once(&text) {
            Ok(node) => return Ok(node),
            Err(fault) => fault,
        };
        let tab = match &fault {
            Fault::Syntax { index: Some(at), .. } => tab_after_colon(&text, *at),
            _ => None,
        };
        match tab {
            Some(tab) => text.to_mut().replace_range(tab..tab + 1, " "),
            None => return Err(fault),
        }
    }
}

/// The byte offset of a tab just before the character at `at` (counted in
/// characters), when a `:` (and maybe more tabs) stands before it.
fn tab_after_colon(text: &str, at: usize) -> Option<usize> {
    let (tab, c) = text.char_indices().nth(at.checked_sub(1)?)?;
    let before = text[..tab].trim_end_matches('\t');
    (c == '\t' && before.ends_with(':')).then_some(tab)
}

fn load_once(text: &str) -> Result<Option<Node>, Fault> {
    let mut b = Builder { stack: Vec::new(), anchors: BTreeMap::new(), root: None, budget: ALIAS_BUDGET, documents: 0 };
    let mut parser = Parser::new_from_str(text);
    while let Some(next) = parser.next_event() {
        let (event, span) = next.map_err(syntax)?;
        let line = span.start.line();
        match event {
            Event::DocumentStart(_) => {
                b.documents += 1;
                if b.documents > 1 {
                    return Err(Fault::SecondDocument { line });
                }
            }
            Event::Scalar(raw, style, anchor, tag) => {
                b.push(Node { value: scalar(&raw, style, tag.as_deref()), line, raw: Some(raw.into_owned()) }, anchor)?
            }
            Event::Alias(id) => {
                let node = b.anchors.get(&id).cloned().ok_or(Fault::Syntax { info: "unknown alias".into(), line, col: 1, index: None })?;
                let size = count(&node.value);
                b.budget = b.budget.checked_sub(size).ok_or(Fault::TooManyAliases { line })?;
                b.push(Node { line, ..node }, 0)?;
            }
            Event::SequenceStart(anchor, tag) => b.stack.push(Frame::Seq { line, items: Vec::new(), anchor, tag: own_tag(tag.as_deref()) }),
            Event::MappingStart(anchor, tag) => {
                b.stack.push(Frame::Map { line, entries: Vec::new(), key: None, anchor, tag: own_tag(tag.as_deref()) })
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (value, line, anchor, tag) = match b.stack.pop() {
                    Some(Frame::Seq { line, items, anchor, tag }) => (Value::Sequence(Seq(items)), line, anchor, tag),
                    Some(Frame::Map { line, entries, anchor, tag, .. }) => (Value::Mapping(entries), line, anchor, tag),
                    None => continue,
                };
                b.push(Node { value: tagged(value, tag), line, raw: None }, anchor)?;
            }
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => {}
        }
    }
    Ok(b.root)
}

/// The tree being built from the parser's events.
struct Builder {
    /// The collections open, outermost first.
    stack: Vec<Frame>,
    /// The nodes anchored so far, by the parser's anchor id.
    anchors: BTreeMap<usize, Node>,
    /// The document's node, once read.
    root: Option<Node>,
    /// The nodes aliases may still expand to.
    budget: usize,
    /// The documents started.
    documents: usize,
}

impl Builder {
    /// Puts a finished node in the collection open (as a mapping's key or
    /// value, or a list's item), or makes it the document's.
    fn push(&mut self, node: Node, anchor: usize) -> Result<(), Fault> {
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
        }
        let path = self.path();
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map { entries, key, .. }) => match key.take() {
                None => {
                    if entries.iter().any(|(k, _)| same_key(&k.value, &node.value)) {
                        let name = key_text(&node.value);
                        let path = if path.is_empty() { name } else { format!("{path}.{name}") };
                        return Err(Fault::Duplicate { path, line: node.line });
                    }
                    *key = Some(node);
                }
                Some(k) => entries.push((k, node)),
            },
        }
        Ok(())
    }

    /// The keys of the mappings open, outer first, joined by '.'
    /// (`sandbox`): where a key being read sits.
    fn path(&self) -> String {
        let mut parts = Vec::new();
        for frame in &self.stack[..self.stack.len().saturating_sub(1)] {
            if let Frame::Map { key: Some(k), .. } = frame {
                parts.push(key_text(&k.value));
            }
        }
        parts.join(".")
    }
}

/// A key as shown in a path: text as is, another scalar as it reads.
pub(super) fn key_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.raw.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "~".to_string(),
        Value::Sequence(_) => "[…]".to_string(),
        Value::Mapping(_) => "{…}".to_string(),
        Value::Tagged(t) => t.tag.clone(),
    }
}

/// Two keys that are the same key: equal scalars of the same kind.
fn same_key(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Number(x), Value::Number(y)) => x.to_string() == y.to_string(),
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Null, Value::Null) => true,
        _ => false,
    }
}

/// The nodes in a value (what an alias to it costs).
fn count(v: &Value) -> usize {
    1 + match v {
        Value::Sequence(s) => s.0.iter().map(|n| count(&n.value)).sum(),
        Value::Mapping(m) => m.iter().map(|(k, v)| count(&k.value) + count(&v.value)).sum(),
        Value::Tagged(t) => count(&t.value),
        _ => 0,
    }
}

fn syntax(e: ScanError) -> Fault {
    let at = e.marker();
    Fault::Syntax { info: e.info().to_string(), line: at.line().max(1), col: at.col() + 1, index: Some(at.index()) }
}

/// A tag that is not the core schema's, as written (`!custom`); core tags
/// (`!!map`, `!!str`) say nothing a check needs.
fn own_tag(tag: Option<&Tag>) -> Option<String> {
    tag.filter(|t| !t.is_yaml_core_schema()).map(|t| t.to_string())
}

fn tagged(value: Value, tag: Option<String>) -> Value {
    match tag {
        Some(tag) => Value::Tagged(Box::new(Tagged { tag, value })),
        None => value,
    }
}

/// A scalar's value: quoted and block scalars are text; a plain one is
/// resolved as the manifest has always read it; a core tag (`!!str`,
/// `!!int`, …) says how.
fn scalar(raw: &str, style: ScalarStyle, tag: Option<&Tag>) -> Value {
    if let Some(t) = tag {
        if !t.is_yaml_core_schema() {
            return tagged(plain_or_text(raw, style), own_tag(Some(t)));
        }
        let forced = match t.suffix.as_str() {
            "str" => Some(Value::String(raw.to_string())),
            "null" => (raw.is_empty() || matches!(raw, "~" | "null" | "Null" | "NULL")).then_some(Value::Null),
            "bool" => parse_bool(raw).map(Value::Bool),
            "int" => int(raw).map(Value::Number),
            "float" => float(raw).or_else(|| int(raw).and_then(|n| n.as_f64())).map(|x| number(raw, NumberKind::Float(x))),
            _ => None,
        };
        if let Some(v) = forced {
            return v;
        }
    }
    plain_or_text(raw, style)
}

fn plain_or_text(raw: &str, style: ScalarStyle) -> Value {
    if style != ScalarStyle::Plain {
        return Value::String(raw.to_string());
    }
    if raw.is_empty() || matches!(raw, "~" | "null" | "Null" | "NULL") {
        return Value::Null;
    }
    if let Some(b) = parse_bool(raw) {
        return Value::Bool(b);
    }
    if let Some(n) = int(raw) {
        return Value::Number(n);
    }
    if !digits_but_not_number(raw) {
        if let Some(x) = float(raw) {
            return number(raw, NumberKind::Float(x));
        }
    }
    Value::String(raw.to_string())
}

fn number(raw: &str, kind: NumberKind) -> Value {
    Value::Number(Number { kind, raw: raw.to_string() })
}

fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// An integer: decimal, `0x`, `0o` or `0b`, signed; `+` allowed; a
/// leading zero (`010`) is text, as the YAML 1.2 core schema says.
fn int(s: &str) -> Option<Number> {
    let (negative, body) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (digits, radix) = match body.get(..2) {
        Some("0x") => (&body[2..], 16),
        Some("0o") => (&body[2..], 8),
        Some("0b") => (&body[2..], 2),
        _ if digits_but_not_number(s) => return None,
        _ => (body, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let raw = s.to_string();
    let kind = match (u128::from_str_radix(digits, radix), negative) {
        (Ok(0), _) => NumberKind::Pos(0),
        (Ok(n), false) => u64::try_from(n).map(NumberKind::Pos).unwrap_or(NumberKind::Big),
        (Ok(n), true) => i64::try_from(n).ok().and_then(|n| n.checked_neg()).map(NumberKind::Neg).unwrap_or(NumberKind::Big),
        (Err(_), _) => NumberKind::Big,
    };
    Some(Number { kind, raw })
}

/// A float: `1.5`, `1e3`, `.inf`, `-.inf`, `.nan` (and their capitalised
/// forms).
fn float(s: &str) -> Option<f64> {
    let unsigned = s.strip_prefix('+').unwrap_or(s);
    if unsigned.starts_with(['+', '-']) && s.starts_with('+') {
        return None;
    }
    match unsigned {
        ".inf" | ".Inf" | ".INF" => return Some(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return Some(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Some(f64::NAN),
        _ => {}
    }
    // Rust reads `inf` and `nan` as floats; YAML does not.
    if unsigned.trim_start_matches('-').starts_with(|c: char| c.is_ascii_alphabetic()) {
        return None;
    }
    unsigned.parse::<f64>().ok().filter(|x| x.is_finite())
}

/// Leading zeros followed by digits (`007`): text in YAML 1.2.
fn digits_but_not_number(s: &str) -> bool {
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    s.len() > 1 && s.starts_with('0') && s[1..].bytes().all(|b| b.is_ascii_digit())
}
