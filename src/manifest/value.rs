//! The kinds of value several keys share: text, whole numbers and
//! durations, each read from a YAML value with its refusal worded for the
//! key at hand.

use super::yaml::Value;

use super::error::KeyContext;
use super::ManifestError;

impl KeyContext<'_> {
    /// Text: a string, or a whole number written bare (`app-group: 2024`).
    pub fn string(&self, v: &Value, allowed: &str) -> Result<String, ManifestError> {
        match v {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) if n.is_u64() || n.is_i64() => Ok(n.to_string()),
            other => Err(self.wrong_type(other, allowed)),
        }
    }

    /// Text with something in it other than blanks.
    pub fn nonempty_string(&self, v: &Value, allowed: &str) -> Result<String, ManifestError> {
        let s = self.string(v, allowed)?;
        if s.trim().is_empty() {
            return Err(self.err(format!("is empty; allowed: {allowed}")));
        }
        Ok(s)
    }

    /// A whole number ≥ 0: a YAML integer, or a string of digits.
    pub fn uint(&self, v: &Value, allowed: &str) -> Result<u64, ManifestError> {
        let n = match v {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => {
                let t = s.trim();
                if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
                    t.parse().ok()
                } else {
                    None
                }
            }
            _ => None,
        };
        n.ok_or_else(|| self.wrong_type(v, allowed))
    }

    /// A duration in ms: a bare whole number of seconds, or a string
    /// [`parse_duration`] accepts.
    pub fn duration(&self, v: &Value, allowed: &str) -> Result<u64, ManifestError> {
        let ms = match v {
            Value::Number(n) => n.as_u64().and_then(|s| s.checked_mul(1000)),
            Value::String(s) => parse_duration(s),
            _ => None,
        };
        ms.ok_or_else(|| self.wrong_type(v, allowed))
    }
}

/// Parses a duration: `500ms`, `30s`, `15m`, `1h`, or a bare number of
/// seconds (so `0` works). Returns milliseconds. Surrounding blanks are
/// ignored; anything else (signs, fractions, spaces before the unit, other
/// units, several units) is refused, and so is a value that overflows.
pub fn parse_duration(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, unit_ms) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60 * 1000)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600 * 1000)
    } else {
        (s, 1000)
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(unit_ms)
}
