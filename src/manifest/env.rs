//! The `env` key: a mapping of variable names to text, each entry checked
//! on its own and refused at its own line as `env.NAME`.

use std::collections::BTreeMap;

use super::error::{describe, shown_scalar, KeyContext};
use super::yaml::{Node, Value};
use super::ManifestError;

const ALLOWED: &str = "a mapping of variable names to text, such as `env: {DB_HOST: db.local}` \
                       or one `NAME: value` a line, indented under env";

/// `env`: a mapping of variable names to text. Numbers and true/false are
/// taken as written (`PORT: 8080` → "8080"); lists, mappings and empty
/// values are refused. An empty `env:` is no env.
pub(super) fn env(cx: &KeyContext, v: &Value) -> Result<BTreeMap<String, String>, ManifestError> {
    let map = match v {
        Value::Null => return Ok(BTreeMap::new()),
        Value::Mapping(m) => m,
        other => return Err(cx.wrong_type(other, ALLOWED)),
    };
    let mut out = BTreeMap::new();
    for (k, val) in map {
        let name = match &k.value {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            other => {
                return Err(cx.doc.at(k.line, Some(cx.key), format!("{} is not a variable name; allowed: {ALLOWED}", describe(other))))
            }
        };
        let value = entry(cx, k.line, &name, val)?;
        out.insert(name, value);
    }
    Ok(out)
}

/// One entry `name: val` of env, written at `line`: its value as text.
fn entry(cx: &KeyContext, line: usize, name: &str, val: &Node) -> Result<String, ManifestError> {
    let full = format!("{}.{name}", cx.key);
    let refuse = |message: String| cx.doc.at(line, Some(&full), message);
    if !valid_env_name(name) {
        return Err(refuse(format!(
            "{name:?} is not a valid variable name; allowed: letters, digits and '_', \
             not starting with a digit ([A-Za-z_][A-Za-z0-9_]*)"
        )));
    }
    if name == "SHINYCTL_COPY" || name == "SHINYCTL_SCRATCH" {
        return Err(refuse("is set by shinyctl for each copy; allowed: any other variable name".to_string()));
    }
    let value = match &val.value {
        Value::String(s) => s.clone(),
        // Kept as written: `1.10` stays "1.10", `True` "True".
        Value::Number(_) | Value::Bool(_) => val.raw.clone().unwrap_or_else(|| shown_scalar(&val.value)),
        Value::Null => return Err(refuse("has no value; allowed: text (write \"\" for an empty value)".to_string())),
        other => return Err(refuse(format!("{} is not accepted; allowed: text, a number or true/false", describe(other)))),
    };
    if value.contains('\0') {
        return Err(refuse("holds a NUL character; allowed: text without NUL".to_string()));
    }
    Ok(value)
}

/// `[A-Za-z_][A-Za-z0-9_]*`.
fn valid_env_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && (b[0].is_ascii_alphabetic() || b[0] == b'_') && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}
