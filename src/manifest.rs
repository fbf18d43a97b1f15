//! The manifest: YAML (one app a file, kebab-case keys) → a validated
//! [`AppSpec`]. A bad manifest is refused whole, with the file, the line, the
//! key and what is allowed.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::model::{LbPolicy, RestartPolicy};

/// A validated app, as applied. Durations are in milliseconds, paths are
/// absolute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppSpec {
    /// `app-name`: `[a-z0-9][a-z0-9-]*`.
    pub name: String,
    /// `app-group`, default `default`.
    pub group: String,
    /// The manifest's absolute path.
    pub manifest: PathBuf,
    /// `working-dir`, absolute; default the manifest's folder.
    pub working_dir: PathBuf,
    /// `entrypoint-file`, default `app.R`, relative to working-dir.
    pub entrypoint: String,
    /// `port`: the load balancer listens here.
    pub port: u16,
    /// `host`, default `0.0.0.0`: the load balancer's listen address.
    pub host: String,
    /// `replicas`, default 1, at least 1.
    pub replicas: u32,
    /// `warm-replicas`, default 1.
    pub warm_replicas: u32,
    /// `lb-policy`, default least-conn.
    pub lb_policy: LbPolicy,
    /// `drain-timeout` in ms, default 15m.
    pub drain_timeout_ms: u64,
    /// `restart-policy`, default always.
    pub restart_policy: RestartPolicy,
    /// `env`: extra environment for the copies.
    pub env: BTreeMap<String, String>,
    /// `state-file`, absolute; default `state.json` beside the manifest.
    pub state_file: PathBuf,
    /// `idle-timeout` in ms, default 300s; 0 never sleeps.
    pub idle_timeout_ms: u64,
    /// `request-timeout` in ms, default 30s, at most 30s.
    pub request_timeout_ms: u64,
    /// `r-path`, default `R` (found on PATH).
    pub r_path: String,
}

impl AppSpec {
    /// The hash of everything that decides how a copy starts: env,
    /// working-dir, app-group, app-name, entrypoint-file, r-path. Copies
    /// started with another hash are outdated.
    pub fn settings_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for part in
            [self.name.as_str(), self.group.as_str(), &self.working_dir.to_string_lossy(), self.entrypoint.as_str(), self.r_path.as_str()]
        {
            h.update(part.as_bytes());
            h.update([0]);
        }
        for (k, v) in &self.env {
            h.update(k.as_bytes());
            h.update([b'=']);
            h.update(v.as_bytes());
            h.update([0]);
        }
        let digest = h.finalize();
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

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

/// Every key a manifest may hold, in the order the documentation lists them.
pub const KEYS: [&str; 16] = [
    "app-name",
    "app-group",
    "working-dir",
    "entrypoint-file",
    "port",
    "host",
    "replicas",
    "warm-replicas",
    "lb-policy",
    "drain-timeout",
    "restart-policy",
    "env",
    "state-file",
    "idle-timeout",
    "request-timeout",
    "r-path",
];

/// The longest `app-name` / `app-group` (a DNS label's limit; both end up in
/// file names).
pub const MAX_NAME_LEN: usize = 63;
/// The most `replicas`, and the most `warm-replicas` (a sanity limit: every
/// copy needs a port of its own in 20000-29999, and a redeploy runs old and
/// new copies side by side).
pub const MAX_COPIES: u64 = 1000;
/// The longest `drain-timeout` / `idle-timeout`: 365 days (so that adding
/// it to a clock can never overflow).
pub const MAX_LONG_DURATION_MS: u64 = 365 * 24 * 3600 * 1000;
/// The longest `request-timeout`: 30 s.
pub const MAX_REQUEST_TIMEOUT_MS: u64 = 30_000;

const NAME_ALLOWED: &str = "lowercase letters, digits and '-', starting with a letter or a digit \
     ([a-z0-9][a-z0-9-]*), at most 63 characters";
const PORT_ALLOWED: &str = "a whole number 1-65535, outside 20000-29999";
const DURATION_ALLOWED: &str = "a duration such as 500ms, 30s, 15m or 1h, or a whole number of seconds";
const HOST_ALLOWED: &str = "an IP address to listen on, such as 0.0.0.0 (every IPv4 address), \
     127.0.0.1 (this machine only) or :: (every address)";

/// Parses and validates a manifest's text. `path` is the manifest's absolute
/// path (relative paths inside it are relative to its folder; a relative
/// `path` is taken relative to the current folder).
///
/// Errors come in the order of the document: the first bad key wins, then a
/// missing required key, then the checks that need several keys (the
/// entrypoint file inside working-dir). Every error names the file, the
/// 1-based line, the key (when there is one) and what is allowed.
pub fn parse(path: &Path, text: &str) -> Result<AppSpec, ManifestError> {
    let manifest = absolute(path);
    let dir = manifest.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("/"));
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let cx = Cx { file: &manifest, text };

    let doc: serde_yaml::Value = match serde_yaml::from_str(text) {
        Ok(v) => v,
        Err(e) => return Err(cx.yaml_error(&e)),
    };
    let map = match doc {
        serde_yaml::Value::Mapping(m) => m,
        serde_yaml::Value::Null => {
            return Err(cx.at(
                first_content_line(text),
                None,
                "the manifest is empty; it needs at least app-name and port, \
                 such as `app-name: hello` and `port: 8080` on lines of their own"
                    .to_string(),
            ))
        }
        other => {
            return Err(cx.at(
                first_content_line(text),
                None,
                format!(
                    "the manifest must be a YAML mapping of keys (`app-name: hello`, `port: 8080`, ...), \
                     not {}; allowed keys: {}",
                    describe(&other),
                    KEYS.join(", ")
                ),
            ))
        }
    };

    let mut name: Option<String> = None;
    let mut group: Option<String> = None;
    let mut working_dir: Option<PathBuf> = None;
    let mut entrypoint: Option<String> = None;
    let mut port: Option<u16> = None;
    let mut host: Option<String> = None;
    let mut replicas: Option<u32> = None;
    let mut warm_replicas: Option<u32> = None;
    let mut lb_policy: Option<LbPolicy> = None;
    let mut drain_timeout_ms: Option<u64> = None;
    let mut restart_policy: Option<RestartPolicy> = None;
    let mut env: Option<BTreeMap<String, String>> = None;
    let mut state_file: Option<PathBuf> = None;
    let mut idle_timeout_ms: Option<u64> = None;
    let mut request_timeout_ms: Option<u64> = None;
    let mut r_path: Option<String> = None;

    for (k, v) in &map {
        let key = match k {
            serde_yaml::Value::String(s) => s.as_str(),
            other => {
                let shown = describe(other);
                let line = match other {
                    serde_yaml::Value::Number(n) => key_line(text, &n.to_string()),
                    serde_yaml::Value::Bool(b) => key_line(text, &b.to_string()),
                    _ => None,
                };
                return Err(cx.at(
                    line.unwrap_or_else(|| first_content_line(text)),
                    Some(&shown),
                    format!("keys must be text; allowed keys: {}", KEYS.join(", ")),
                ));
            }
        };
        match key {
            "app-name" => name = Some(cx.name(key, v)?),
            "app-group" => group = Some(cx.name(key, v)?),
            "working-dir" => {
                let s = cx.nonempty_string(key, v, "an existing folder, absolute or relative to the manifest's folder")?;
                let p = resolve(&dir, &s);
                cx.check_dir(key, &p, &dir)?;
                working_dir = Some(p);
            }
            "entrypoint-file" => {
                let allowed = "a file in working-dir, such as app.R";
                let s = cx.nonempty_string(key, v, allowed)?;
                let p = Path::new(s.trim());
                if p.is_absolute() {
                    return Err(cx.err(key, format!("{s:?} is an absolute path; allowed: {allowed} (a path relative to working-dir)")));
                }
                let rel: PathBuf = p.components().filter(|c| !matches!(c, std::path::Component::CurDir)).collect();
                if rel.as_os_str().is_empty() {
                    return Err(cx.err(key, format!("{s:?} names no file; allowed: {allowed}")));
                }
                entrypoint = Some(rel.to_string_lossy().into_owned());
            }
            "port" => {
                let n = cx.uint(key, v, PORT_ALLOWED)?;
                if n == 0 || n > 65535 {
                    return Err(cx.err(key, format!("{n} is not a port number; allowed: {PORT_ALLOWED}")));
                }
                if (20000..=29999).contains(&n) {
                    return Err(
                        cx.err(key, format!("{n} is in 20000-29999, which is kept for the copies' own ports; allowed: {PORT_ALLOWED}"))
                    );
                }
                port = Some(n as u16);
            }
            "host" => {
                let s = cx.nonempty_string(key, v, HOST_ALLOWED)?;
                let t = s.trim();
                let t = t.strip_prefix('[').and_then(|x| x.strip_suffix(']')).unwrap_or(t);
                match t.parse::<std::net::IpAddr>() {
                    Ok(ip) => host = Some(ip.to_string()),
                    Err(_) => return Err(cx.err(key, format!("{s:?} is not an IP address; allowed: {HOST_ALLOWED}"))),
                }
            }
            "replicas" => {
                let allowed = format!("a whole number, at least 1 (and at most {MAX_COPIES})");
                let n = cx.uint(key, v, &allowed)?;
                if n < 1 {
                    return Err(cx.err(key, format!("{n} copies would serve nobody; allowed: {allowed}")));
                }
                if n > MAX_COPIES {
                    return Err(cx.err(key, format!("{n} is too many; allowed: {allowed}")));
                }
                replicas = Some(n as u32);
            }
            "warm-replicas" => {
                let allowed = format!("a whole number, 0 or more (and at most {MAX_COPIES})");
                let n = cx.uint(key, v, &allowed)?;
                if n > MAX_COPIES {
                    return Err(cx.err(key, format!("{n} is too many; allowed: {allowed}")));
                }
                warm_replicas = Some(n as u32);
            }
            "lb-policy" => {
                let allowed = format!("one of {}", LbPolicy::ALLOWED);
                let s = cx.string(key, v, &allowed)?;
                match LbPolicy::parse(s.trim()) {
                    Some(p) => lb_policy = Some(p),
                    None => return Err(cx.err(key, format!("{s:?} is not a policy; allowed: {allowed}"))),
                }
            }
            "restart-policy" => {
                let allowed = format!("one of {}", RestartPolicy::ALLOWED);
                let s = cx.string(key, v, &allowed)?;
                match RestartPolicy::parse(s.trim()) {
                    Some(p) => restart_policy = Some(p),
                    None => return Err(cx.err(key, format!("{s:?} is not a policy; allowed: {allowed}"))),
                }
            }
            "drain-timeout" => drain_timeout_ms = Some(cx.long_duration(key, v)?),
            "idle-timeout" => idle_timeout_ms = Some(cx.long_duration(key, v)?),
            "request-timeout" => {
                let allowed = format!("more than 0 and at most 30s: {DURATION_ALLOWED}");
                let ms = cx.duration(key, v, &allowed)?;
                if ms == 0 {
                    return Err(cx.err(key, format!("0 would never wait for the app; allowed: {allowed}")));
                }
                if ms > MAX_REQUEST_TIMEOUT_MS {
                    return Err(cx.err(key, format!("{} is longer than 30s; allowed: {allowed}", shown_scalar(v))));
                }
                request_timeout_ms = Some(ms);
            }
            "env" => env = Some(cx.env(key, v)?),
            "state-file" => {
                let allowed = "a file path for the app's state.json, absolute or relative to the manifest's folder";
                let s = cx.nonempty_string(key, v, allowed)?;
                let p = resolve(&dir, &s);
                cx.check_state_file(key, &p, allowed)?;
                state_file = Some(p);
            }
            "r-path" => {
                let allowed = "the R executable: a name found on PATH, such as R, or a path to it \
                               (relative to the manifest's folder)";
                let s = cx.nonempty_string(key, v, allowed)?;
                let s = s.trim();
                if s.contains('/') || s.starts_with('~') {
                    let p = resolve(&dir, s);
                    if !p.is_file() {
                        let what = if p.exists() { "is not a file" } else { "does not exist" };
                        return Err(cx.err(key, format!("{} {what}; allowed: {allowed}", p.display())));
                    }
                    r_path = Some(p.to_string_lossy().into_owned());
                } else {
                    r_path = Some(s.to_string());
                }
            }
            other => return Err(cx.unknown(other)),
        }
    }

    let Some(name) = name else {
        return Err(cx.at(first_content_line(text), Some("app-name"), format!("missing; it is required: the app's name, {NAME_ALLOWED}")));
    };
    let Some(port) = port else {
        return Err(cx.at(
            first_content_line(text),
            Some("port"),
            format!("missing; it is required: the port the app is served on, {PORT_ALLOWED}"),
        ));
    };
    let working_dir = match working_dir {
        Some(p) => p,
        None => {
            cx.check_dir("working-dir", &dir, &dir)?;
            dir.clone()
        }
    };
    let entrypoint = entrypoint.unwrap_or_else(|| "app.R".to_string());
    let entry_path = working_dir.join(&entrypoint);
    if !entry_path.is_file() {
        let what = if entry_path.is_dir() { "is a folder, not a file" } else { "does not exist" };
        return Err(cx.err(
            "entrypoint-file",
            format!(
                "missing entrypoint file {} ({what}); allowed: a file in working-dir {} \
                 (entrypoint-file, default app.R)",
                entry_path.display(),
                working_dir.display()
            ),
        ));
    }
    let state_file = match state_file {
        Some(p) => p,
        None => dir.join("state.json"),
    };

    Ok(AppSpec {
        name,
        group: group.unwrap_or_else(|| "default".to_string()),
        manifest,
        working_dir,
        entrypoint,
        port,
        host: host.unwrap_or_else(|| "0.0.0.0".to_string()),
        replicas: replicas.unwrap_or(1),
        warm_replicas: warm_replicas.unwrap_or(1),
        lb_policy: lb_policy.unwrap_or_default(),
        drain_timeout_ms: drain_timeout_ms.unwrap_or(15 * 60 * 1000),
        restart_policy: restart_policy.unwrap_or_default(),
        env: env.unwrap_or_default(),
        state_file,
        idle_timeout_ms: idle_timeout_ms.unwrap_or(300 * 1000),
        request_timeout_ms: request_timeout_ms.unwrap_or(30 * 1000),
        r_path: r_path.unwrap_or_else(|| "R".to_string()),
    })
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

/// What a check needs to word its errors: the file and its text.
struct Cx<'a> {
    file: &'a Path,
    text: &'a str,
}

impl Cx<'_> {
    /// An error at an explicit line.
    fn at(&self, line: usize, key: Option<&str>, message: String) -> ManifestError {
        ManifestError { file: self.file.to_path_buf(), line: Some(line), key: key.map(str::to_string), message }
    }

    /// An error about a top-level key, at its line (or the document's first
    /// line when the key is not written, e.g. a default that fails).
    fn err(&self, key: &str, message: String) -> ManifestError {
        let line = key_line(self.text, key).unwrap_or_else(|| first_content_line(self.text));
        self.at(line, Some(key), message)
    }

    /// "X is not accepted; allowed: …"
    fn wrong_type(&self, key: &str, v: &serde_yaml::Value, allowed: &str) -> ManifestError {
        self.err(key, format!("{} is not accepted; allowed: {allowed}", describe(v)))
    }

    fn unknown(&self, key: &str) -> ManifestError {
        let mut message = format!("unknown key; allowed keys: {}", KEYS.join(", "));
        if let Some(s) = suggest(key) {
            message.push_str(&format!(" (did you mean {s}?)"));
        }
        self.err(key, message)
    }

    /// A YAML syntax error (or a document serde_yaml refuses), at its line.
    fn yaml_error(&self, e: &serde_yaml::Error) -> ManifestError {
        let msg = e.to_string();
        if msg.contains("more than one document") {
            // The line of the `---` that starts the second document.
            let mut seen_content = false;
            let mut line = None;
            for (i, l) in self.text.lines().enumerate() {
                if l.starts_with("---") {
                    if seen_content {
                        line = Some(i + 1);
                        break;
                    }
                    seen_content = true;
                } else if !is_blank_or_comment(l) {
                    seen_content = true;
                }
            }
            return self.at(
                line.unwrap_or(1),
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

    /// Text: a string, or a whole number written bare (`app-group: 2024`).
    fn string(&self, key: &str, v: &serde_yaml::Value, allowed: &str) -> Result<String, ManifestError> {
        match v {
            serde_yaml::Value::String(s) => Ok(s.clone()),
            serde_yaml::Value::Number(n) if n.is_u64() || n.is_i64() => Ok(n.to_string()),
            other => Err(self.wrong_type(key, other, allowed)),
        }
    }

    fn nonempty_string(&self, key: &str, v: &serde_yaml::Value, allowed: &str) -> Result<String, ManifestError> {
        let s = self.string(key, v, allowed)?;
        if s.trim().is_empty() {
            return Err(self.err(key, format!("is empty; allowed: {allowed}")));
        }
        Ok(s)
    }

    /// `app-name` / `app-group`.
    fn name(&self, key: &str, v: &serde_yaml::Value) -> Result<String, ManifestError> {
        let s = self.string(key, v, NAME_ALLOWED)?;
        if !valid_name(&s) {
            return Err(self.err(key, format!("{s:?} is not a valid name; allowed: {NAME_ALLOWED}")));
        }
        Ok(s)
    }

    /// A whole number ≥ 0: a YAML integer, or a string of digits.
    fn uint(&self, key: &str, v: &serde_yaml::Value, allowed: &str) -> Result<u64, ManifestError> {
        let n = match v {
            serde_yaml::Value::Number(n) => n.as_u64(),
            serde_yaml::Value::String(s) => {
                let t = s.trim();
                if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
                    t.parse().ok()
                } else {
                    None
                }
            }
            _ => None,
        };
        n.ok_or_else(|| self.wrong_type(key, v, allowed))
    }

    /// A duration in ms: a bare whole number of seconds, or a string
    /// [`parse_duration`] accepts.
    fn duration(&self, key: &str, v: &serde_yaml::Value, allowed: &str) -> Result<u64, ManifestError> {
        let ms = match v {
            serde_yaml::Value::Number(n) => n.as_u64().and_then(|s| s.checked_mul(1000)),
            serde_yaml::Value::String(s) => parse_duration(s),
            _ => None,
        };
        ms.ok_or_else(|| self.wrong_type(key, v, allowed))
    }

    /// `drain-timeout`, `idle-timeout`: any duration up to a year.
    fn long_duration(&self, key: &str, v: &serde_yaml::Value) -> Result<u64, ManifestError> {
        let allowed = format!("{DURATION_ALLOWED}, at most 8760h (a year)");
        let ms = self.duration(key, v, &allowed)?;
        if ms > MAX_LONG_DURATION_MS {
            return Err(self.err(key, format!("{} is too long; allowed: {allowed}", shown_scalar(v))));
        }
        Ok(ms)
    }

    fn check_dir(&self, key: &str, p: &Path, manifest_dir: &Path) -> Result<(), ManifestError> {
        if p.is_dir() {
            return Ok(());
        }
        let what = if p.exists() { "is not a folder" } else { "does not exist" };
        Err(self.err(
            key,
            format!(
                "{} {what}; allowed: an existing folder, absolute or relative to the manifest's folder {}",
                p.display(),
                manifest_dir.display()
            ),
        ))
    }

    fn check_state_file(&self, key: &str, p: &Path, allowed: &str) -> Result<(), ManifestError> {
        if p.is_dir() {
            return Err(self.err(key, format!("{} is a folder; allowed: {allowed}", p.display())));
        }
        if let Some(parent) = p.parent() {
            if !parent.is_dir() {
                return Err(
                    self.err(key, format!("the folder {} does not exist; allowed: {allowed}, in an existing folder", parent.display()))
                );
            }
        }
        Ok(())
    }

    /// `env`: a mapping of variable names to text. Numbers and true/false
    /// are taken as written (`PORT: 8080` → "8080"); lists, mappings and
    /// empty values are refused.
    fn env(&self, key: &str, v: &serde_yaml::Value) -> Result<BTreeMap<String, String>, ManifestError> {
        let allowed = "a mapping of variable names to text, such as `env: {DB_HOST: db.local}` \
                       or one `NAME: value` a line, indented under env";
        let map = match v {
            serde_yaml::Value::Null => return Ok(BTreeMap::new()),
            serde_yaml::Value::Mapping(m) => m,
            other => return Err(self.wrong_type(key, other, allowed)),
        };
        let env_line = key_line(self.text, key).unwrap_or_else(|| first_content_line(self.text));
        let mut out = BTreeMap::new();
        for (k, val) in map {
            let name = match k {
                serde_yaml::Value::String(s) => s.clone(),
                serde_yaml::Value::Number(n) => n.to_string(),
                serde_yaml::Value::Bool(b) => b.to_string(),
                other => {
                    return Err(self.at(env_line, Some(key), format!("{} is not a variable name; allowed: {allowed}", describe(other))))
                }
            };
            let line = nested_key_line(self.text, env_line, &name).unwrap_or(env_line);
            let full = format!("{key}.{name}");
            if !valid_env_name(&name) {
                return Err(self.at(
                    line,
                    Some(&full),
                    format!(
                        "{name:?} is not a valid variable name; allowed: letters, digits and '_', \
                         not starting with a digit ([A-Za-z_][A-Za-z0-9_]*)"
                    ),
                ));
            }
            if name == "SHINYCTL_COPY" || name == "SHINYCTL_SCRATCH" {
                return Err(self.at(line, Some(&full), "is set by shinyctl for each copy; allowed: any other variable name".to_string()));
            }
            let value = match val {
                serde_yaml::Value::String(s) => s.clone(),
                serde_yaml::Value::Number(_) | serde_yaml::Value::Bool(_) => {
                    // Keep the value as written (`1.10` stays "1.10"), when it
                    // can be found on its line; else as serde_yaml prints it.
                    let as_written = self
                        .text
                        .lines()
                        .nth(line - 1)
                        .and_then(|l| raw_value_after_key(l, &name))
                        .filter(|raw| serde_yaml::from_str::<serde_yaml::Value>(raw).ok().as_ref() == Some(val));
                    as_written.unwrap_or_else(|| shown_scalar(val))
                }
                serde_yaml::Value::Null => {
                    return Err(self.at(line, Some(&full), "has no value; allowed: text (write \"\" for an empty value)".to_string()))
                }
                other => {
                    return Err(self.at(
                        line,
                        Some(&full),
                        format!("{} is not accepted; allowed: text, a number or true/false", describe(other)),
                    ))
                }
            };
            if value.contains('\0') {
                return Err(self.at(line, Some(&full), "holds a NUL character; allowed: text without NUL".to_string()));
            }
            out.insert(name, value);
        }
        Ok(out)
    }
}

/// How a YAML value is named in an error message.
fn describe(v: &serde_yaml::Value) -> String {
    match v {
        serde_yaml::Value::Null => "an empty value".to_string(),
        serde_yaml::Value::Bool(b) => format!("{b} (true/false)"),
        serde_yaml::Value::Number(n) => format!("the number {n}"),
        serde_yaml::Value::String(s) => format!("{s:?}"),
        serde_yaml::Value::Sequence(_) => "a list".to_string(),
        serde_yaml::Value::Mapping(_) => "a mapping".to_string(),
        serde_yaml::Value::Tagged(t) => format!("a value tagged {}", t.tag),
    }
}

/// A scalar as the user wrote it, for "X is too long".
fn shown_scalar(v: &serde_yaml::Value) -> String {
    match v {
        serde_yaml::Value::String(s) => s.trim().to_string(),
        serde_yaml::Value::Number(n) => n.to_string(),
        serde_yaml::Value::Bool(b) => b.to_string(),
        other => describe(other),
    }
}

/// `[a-z0-9][a-z0-9-]*`, at most [`MAX_NAME_LEN`] characters.
fn valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NAME_LEN
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// `[A-Za-z_][A-Za-z0-9_]*`.
fn valid_env_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && (b[0].is_ascii_alphabetic() || b[0] == b'_') && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// The closest allowed key to a misspelt one, if any is close.
fn suggest(key: &str) -> Option<&'static str> {
    let k = key.trim().to_ascii_lowercase().replace(['_', ' '], "-");
    if let Some(exact) = KEYS.iter().find(|x| **x == k) {
        return Some(exact);
    }
    let suffix = format!("-{k}");
    let ends: Vec<&&str> = KEYS.iter().filter(|x| x.ends_with(&suffix)).collect();
    if ends.len() == 1 {
        return Some(ends[0]);
    }
    KEYS.iter().map(|x| (levenshtein(&k, x), *x)).filter(|(d, _)| *d <= 2).min_by_key(|(d, _)| *d).map(|(_, x)| x)
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

/// The first line that is not blank, a comment or a document marker: where
/// the document's mapping starts (1 for an empty file).
fn first_content_line(text: &str) -> usize {
    text.lines().position(|l| !is_blank_or_comment(l) && !l.starts_with("---") && !l.starts_with('%')).map(|i| i + 1).unwrap_or(1)
}

/// The 1-based line of a top-level key: bare at column 0 ([`line_of_key`]),
/// quoted at column 0, or else anywhere on a line (a flow mapping such as
/// `{app-name: x, port: 1}`).
fn key_line(text: &str, key: &str) -> Option<usize> {
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
fn nested_key_line(text: &str, parent_line: usize, key: &str) -> Option<usize> {
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
fn raw_value_after_key(l: &str, key: &str) -> Option<String> {
    let pos = key_token_at(l, key)?;
    let mut rest = &l[pos..];
    if let Some(i) = rest.find(" #").or_else(|| rest.find("\t#")) {
        rest = &rest[..i];
    }
    let rest = rest.trim().trim_end_matches(['}', ',']).trim();
    (!rest.is_empty()).then(|| rest.to_string())
}

/// `path` made absolute (against the current folder) without `.` parts.
fn absolute(path: &Path) -> PathBuf {
    let p = if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")).join(path) };
    clean(&p)
}

/// A path from the manifest: `~/…` is under $HOME, relative is relative to
/// the manifest's folder. `.` parts are dropped; `..` parts are kept, so a
/// symlinked folder resolves as the system resolves it.
fn resolve(base: &Path, s: &str) -> PathBuf {
    let s = s.trim();
    let p = match (s == "~" || s.starts_with("~/"), std::env::var_os("HOME")) {
        (true, Some(h)) if !h.is_empty() => PathBuf::from(h).join(s[1..].trim_start_matches('/')),
        _ => PathBuf::from(s),
    };
    clean(&if p.is_absolute() { p } else { base.join(p) })
}

fn clean(p: &Path) -> PathBuf {
    p.components().filter(|c| !matches!(c, std::path::Component::CurDir)).collect()
}

/// The 1-based line where top-level `key:` stands in `text`, if it does.
pub fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines().position(|l| l.strip_prefix(key).map(|rest| rest.trim_start().starts_with(':')).unwrap_or(false)).map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A temporary folder of its own, removed at the end of the test.
    struct TestDir(PathBuf);

    impl TestDir {
        fn new() -> TestDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
            let p = std::env::temp_dir().join(format!(
                "shinyctl-manifest-test-{}-{}-{nanos}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            fs::create_dir_all(&p).unwrap();
            fs::write(p.join("app.R"), "library(shiny)\n").unwrap();
            TestDir(p)
        }
        fn manifest(&self) -> PathBuf {
            self.0.join("hello.yaml")
        }
        fn parse(&self, text: &str) -> Result<AppSpec, ManifestError> {
            parse(&self.manifest(), text)
        }
        /// Asserts `text` is refused at `line` for `key`, with each of `wants`
        /// in the message; returns the message.
        fn refused(&self, text: &str, line: usize, key: &str, wants: &[&str]) -> String {
            let e = self.parse(text).expect_err("should be refused");
            let shown = e.to_string();
            let prefix = format!("{}:{line}: {key}: ", self.manifest().display());
            assert!(shown.starts_with(&prefix), "{shown:?} does not start with {prefix:?}");
            assert_eq!(e.line, Some(line), "{shown}");
            assert_eq!(e.key.as_deref(), Some(key), "{shown}");
            for w in wants {
                assert!(shown.contains(w), "{shown:?} lacks {w:?}");
            }
            shown
        }
    }

    use std::fs;

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    const MIN: &str = "app-name: hello\nport: 8080\n";

    #[test]
    fn defaults_are_filled() {
        let d = TestDir::new();
        let s = d.parse(MIN).unwrap();
        assert_eq!(s.name, "hello");
        assert_eq!(s.group, "default");
        assert_eq!(s.manifest, d.manifest());
        assert_eq!(s.working_dir, d.0);
        assert_eq!(s.entrypoint, "app.R");
        assert_eq!(s.port, 8080);
        assert_eq!(s.host, "0.0.0.0");
        assert_eq!(s.replicas, 1);
        assert_eq!(s.warm_replicas, 1);
        assert_eq!(s.lb_policy, LbPolicy::LeastConn);
        assert_eq!(s.drain_timeout_ms, 15 * 60 * 1000);
        assert_eq!(s.restart_policy, RestartPolicy::Always);
        assert!(s.env.is_empty());
        assert_eq!(s.state_file, d.0.join("state.json"));
        assert_eq!(s.idle_timeout_ms, 300_000);
        assert_eq!(s.request_timeout_ms, 30_000);
        assert_eq!(s.r_path, "R");
    }

    #[test]
    fn every_key_is_parsed() {
        let d = TestDir::new();
        fs::create_dir_all(d.0.join("src/www")).unwrap();
        fs::write(d.0.join("src/main.R"), "").unwrap();
        fs::create_dir_all(d.0.join("var")).unwrap();
        fs::create_dir_all(d.0.join("bin")).unwrap();
        fs::write(d.0.join("bin/R"), "#!/bin/sh\n").unwrap();
        let text = "\
# a comment
app-name: sales-2
app-group: team-a
working-dir: ./src
entrypoint-file: main.R
port: 8765
host: 127.0.0.1
replicas: 3
warm-replicas: 0
lb-policy: round-robin
drain-timeout: 1h
restart-policy: on-failure
env:
  DB_HOST: db.local
  WORKERS: 4
  VERSION: 1.10
  DEBUG: true
  EMPTY: \"\"
state-file: var/sales.json
idle-timeout: 0
request-timeout: 500ms
r-path: bin/R
";
        let s = d.parse(text).unwrap();
        assert_eq!(s.name, "sales-2");
        assert_eq!(s.group, "team-a");
        assert_eq!(s.working_dir, d.0.join("src"));
        assert_eq!(s.entrypoint, "main.R");
        assert_eq!(s.port, 8765);
        assert_eq!(s.host, "127.0.0.1");
        assert_eq!(s.replicas, 3);
        assert_eq!(s.warm_replicas, 0);
        assert_eq!(s.lb_policy, LbPolicy::RoundRobin);
        assert_eq!(s.drain_timeout_ms, 3_600_000);
        assert_eq!(s.restart_policy, RestartPolicy::OnFailure);
        let env: Vec<(&str, &str)> = s.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(env, vec![("DB_HOST", "db.local"), ("DEBUG", "true"), ("EMPTY", ""), ("VERSION", "1.10"), ("WORKERS", "4")]);
        assert_eq!(s.state_file, d.0.join("var/sales.json"));
        assert_eq!(s.idle_timeout_ms, 0);
        assert_eq!(s.request_timeout_ms, 500);
        assert_eq!(s.r_path, d.0.join("bin/R").to_string_lossy());
    }

    #[test]
    fn other_spellings_are_accepted() {
        let d = TestDir::new();
        let s = d
            .parse(
                "\"app-name\": hello\nport: 9000\nhost: '::'\nenv: {A: 1, B: x}\nidle-timeout: 90\n\
                 drain-timeout: 30s\nlb-policy: first\nrestart-policy: never\nreplicas: \"2\"\n\
                 working-dir: ",
            )
            .map(|_| ())
            .expect_err("empty working-dir");
        assert_eq!(s.key.as_deref(), Some("working-dir"));
        let wd = d.0.to_string_lossy().into_owned();
        let s = d
            .parse(&format!(
                "\"app-name\": hello\nport: 9000\nhost: '::'\nenv: {{A: 1, B: x}}\nidle-timeout: 90\n\
                 drain-timeout: 30s\nlb-policy: first\nrestart-policy: never\nreplicas: \"2\"\n\
                 working-dir: {wd}\nstate-file: {wd}/s.json\n"
            ))
            .unwrap();
        assert_eq!(s.host, "::");
        assert_eq!(s.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(s.idle_timeout_ms, 90_000);
        assert_eq!(s.drain_timeout_ms, 30_000);
        assert_eq!(s.lb_policy, LbPolicy::First);
        assert_eq!(s.restart_policy, RestartPolicy::Never);
        assert_eq!(s.replicas, 2);
        assert_eq!(s.working_dir, d.0);
        assert_eq!(s.state_file, d.0.join("s.json"));
        // An empty env is no env.
        assert!(d.parse("app-name: a\nport: 1\nenv:\n").unwrap().env.is_empty());
    }

    #[test]
    fn unknown_key() {
        let d = TestDir::new();
        let msg = d.refused(
            "app-name: hello\nport: 8080\nreplica: 2\n",
            3,
            "replica",
            &["unknown key", "allowed keys", "app-name", "warm-replicas", "r-path", "did you mean replicas?"],
        );
        assert!(msg.contains("request-timeout"));
        d.refused("app-name: hello\nport: 8080\n\nworking_dir: .\n", 4, "working_dir", &["did you mean working-dir?"]);
        d.refused("name: hello\nport: 8080\n", 1, "name", &["did you mean app-name?"]);
    }

    #[test]
    fn wrong_types() {
        let d = TestDir::new();
        d.refused(
            "app-name: hello\nport: 8080\nreplicas: two\n",
            3,
            "replicas",
            &["\"two\"", "whole number", "at least 1", "at most 1000"],
        );
        d.refused("app-name: hello\nport: \"abc\"\n", 2, "port", &["\"abc\"", "1-65535", "20000-29999"]);
        d.refused("app-name: hello\nport: 80.5\n", 2, "port", &["80.5", "1-65535"]);
        d.refused("app-name: hello\nport: 8080\nhost:\n  - a\n  - b\n", 3, "host", &["a list", "IP address"]);
        d.refused("app-name: [a]\nport: 8080\n", 1, "app-name", &["a list", "[a-z0-9][a-z0-9-]*"]);
        d.refused("app-name: hello\nport: 8080\nenv: [A, B]\n", 3, "env", &["a list", "mapping of variable names"]);
        d.refused("app-name: hello\nport: 8080\nwarm-replicas: -1\n", 3, "warm-replicas", &["-1", "0 or more"]);
        d.refused("app-name: hello\nport: 8080\nlb-policy: 3\n", 3, "lb-policy", &["least-conn, round-robin, random, first"]);
        d.refused("app-name: hello\nport: 8080\ndrain-timeout: true\n", 3, "drain-timeout", &["true", "500ms", "30s", "15m", "1h"]);
        d.refused("app-name: hello\nport: 8080\nr-path:\n", 3, "r-path", &["empty value", "R executable"]);
    }

    #[test]
    fn env_entries() {
        let d = TestDir::new();
        let base = "app-name: hello\nport: 8080\nenv:\n  GOOD: 1\n";
        d.refused(&format!("{base}  BAD-NAME: x\n"), 5, "env.BAD-NAME", &["[A-Za-z_][A-Za-z0-9_]*"]);
        d.refused(&format!("{base}  # note\n  NESTED:\n    a: 1\n"), 6, "env.NESTED", &["a mapping", "text"]);
        d.refused(&format!("{base}  LIST: [1, 2]\n"), 5, "env.LIST", &["a list", "text"]);
        d.refused(&format!("{base}  NOTHING:\n"), 5, "env.NOTHING", &["no value", "\"\""]);
        d.refused(&format!("{base}  SHINYCTL_COPY: 3\n"), 5, "env.SHINYCTL_COPY", &["set by shinyctl"]);
        d.refused("app-name: hello\nport: 8080\nenv: {A: 1, 9X: 2}\n", 3, "env.9X", &["variable name"]);
    }

    #[test]
    fn ports() {
        let d = TestDir::new();
        for (p, what) in [("20000", "20000-29999"), ("29999", "kept for the copies"), ("0", "not a port"), ("70000", "not a port")] {
            d.refused(&format!("app-name: hello\n\nport: {p}\n"), 3, "port", &[what, "1-65535", p]);
        }
        assert_eq!(d.parse("app-name: hello\nport: 19999\n").unwrap().port, 19999);
        assert_eq!(d.parse("app-name: hello\nport: 65535\n").unwrap().port, 65535);
        assert_eq!(d.parse("app-name: hello\nport: 30000\n").unwrap().port, 30000);
    }

    #[test]
    fn replicas_zero() {
        let d = TestDir::new();
        d.refused("app-name: hello\nport: 8080\nreplicas: 0\n", 3, "replicas", &["0", "at least 1"]);
        d.refused("app-name: hello\nport: 8080\nreplicas: 5000\n", 3, "replicas", &["too many", "at most 1000"]);
        assert_eq!(d.parse("app-name: hello\nport: 8080\nwarm-replicas: 0\n").unwrap().warm_replicas, 0);
    }

    #[test]
    fn bad_durations() {
        let d = TestDir::new();
        for bad in ["15 minutes", "1.5s", "-1", "10d", "s", "1h30m", "1.5"] {
            d.refused(
                &format!("app-name: hello\nport: 8080\ndrain-timeout: {bad}\n"),
                3,
                "drain-timeout",
                &["500ms", "30s", "15m", "1h", "whole number of seconds"],
            );
        }
        d.refused("app-name: hello\nport: 8080\nidle-timeout: 9000h\n", 3, "idle-timeout", &["too long", "8760h"]);
    }

    #[test]
    fn request_timeout_limits() {
        let d = TestDir::new();
        d.refused("app-name: hello\nport: 8080\nrequest-timeout: 45s\n", 3, "request-timeout", &["45s", "longer than 30s", "at most 30s"]);
        d.refused("app-name: hello\nport: 8080\nrequest-timeout: 31\n", 3, "request-timeout", &["at most 30s"]);
        d.refused("app-name: hello\nport: 8080\nrequest-timeout: 0\n", 3, "request-timeout", &["more than 0"]);
        assert_eq!(d.parse("app-name: hello\nport: 8080\nrequest-timeout: 30\n").unwrap().request_timeout_ms, 30_000);
    }

    #[test]
    fn bad_policies() {
        let d = TestDir::new();
        d.refused("app-name: hello\nport: 8080\nlb-policy: fastest\n", 3, "lb-policy", &["\"fastest\"", LbPolicy::ALLOWED]);
        d.refused(
            "app-name: hello\nport: 8080\nrestart-policy: sometimes\n",
            3,
            "restart-policy",
            &["\"sometimes\"", RestartPolicy::ALLOWED],
        );
    }

    #[test]
    fn bad_host() {
        let d = TestDir::new();
        d.refused("app-name: hello\nport: 8080\nhost: localhost\n", 3, "host", &["not an IP address", "0.0.0.0", "127.0.0.1"]);
    }

    #[test]
    fn missing_entrypoint_file() {
        let d = TestDir::new();
        let want = d.0.join("main.R").display().to_string();
        d.refused("app-name: hello\nport: 8080\nentrypoint-file: main.R\n", 3, "entrypoint-file", &["missing entrypoint file", &want]);
        fs::remove_file(d.0.join("app.R")).unwrap();
        let want = d.0.join("app.R").display().to_string();
        d.refused("app-name: hello\nport: 8080\n", 1, "entrypoint-file", &["missing entrypoint file", &want, "default app.R"]);
        d.refused(
            "app-name: hello\nport: 8080\nentrypoint-file: /etc/passwd\n",
            3,
            "entrypoint-file",
            &["absolute", "relative to working-dir"],
        );
    }

    #[test]
    fn missing_or_bad_folders() {
        let d = TestDir::new();
        let want = d.0.join("nope").display().to_string();
        d.refused("app-name: hello\nport: 8080\nworking-dir: nope\n", 3, "working-dir", &[&want, "does not exist", "existing folder"]);
        d.refused("app-name: hello\nport: 8080\nworking-dir: app.R\n", 3, "working-dir", &["is not a folder"]);
        d.refused("app-name: hello\nport: 8080\nstate-file: nope/state.json\n", 3, "state-file", &[&want, "does not exist"]);
        d.refused("app-name: hello\nport: 8080\nstate-file: .\n", 3, "state-file", &["is a folder"]);
        d.refused("app-name: hello\nport: 8080\nr-path: ./nope/R\n", 3, "r-path", &["does not exist", "R executable"]);
    }

    #[test]
    fn bad_app_names() {
        let d = TestDir::new();
        for bad in ["Hello", "hello_world", "-hello", "hé", "\"\""] {
            d.refused(&format!("port: 8080\napp-name: {bad}\n"), 2, "app-name", &["not a valid name", "[a-z0-9][a-z0-9-]*"]);
        }
        d.refused(&format!("port: 8080\napp-name: {}\n", "a".repeat(64)), 2, "app-name", &["at most 63"]);
        d.refused("app-name: ok\nport: 8080\napp-group: Team A\n", 3, "app-group", &["not a valid name"]);
        assert_eq!(d.parse("app-name: 2048\nport: 8080\n").unwrap().name, "2048");
    }

    #[test]
    fn missing_required_keys() {
        let d = TestDir::new();
        d.refused("# hello\nport: 8080\n", 2, "app-name", &["missing", "required", "[a-z0-9][a-z0-9-]*"]);
        d.refused("app-name: hello\n", 1, "port", &["missing", "required", "1-65535"]);
    }

    #[test]
    fn bad_documents() {
        let d = TestDir::new();
        let file = d.manifest().display().to_string();
        for (text, line, want) in [
            ("", 1, "empty"),
            ("# only a comment\n", 1, "empty"),
            ("- app-name: hello\n", 1, "not a list"),
            ("hello\n", 1, "mapping"),
            ("app-name: hello\nport: 8080\n  bad: indent\n", 3, "not valid YAML"),
            ("app-name: hello\nport: [8080\n", 3, "not valid YAML"),
            ("app-name: hello\n\tport: 8080\n", 2, "not valid YAML"),
            ("app-name: a\nport: 1\n---\napp-name: b\nport: 2\n", 3, "one app a file"),
        ] {
            let e = d.parse(text).expect_err(text);
            let shown = e.to_string();
            assert!(shown.starts_with(&format!("{file}:{line}: ")), "{text:?}: {shown}");
            assert!(shown.contains(want), "{text:?}: {shown}");
        }
        d.refused("app-name: hello\nport: 8080\nport: 8081\n", 3, "port", &["twice"]);
        let e = d.parse("app-name: hello\nport: 8080\n1: x\n").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.to_string().contains("allowed keys"), "{e}");
    }

    #[test]
    fn relative_manifest_path_is_made_absolute() {
        let d = TestDir::new();
        let cwd = std::env::current_dir().unwrap();
        let rel = Path::new("some/where/hello.yaml");
        let e = parse(rel, MIN).unwrap_err();
        // The folder does not exist there, but the error names the absolute path.
        assert_eq!(e.file, cwd.join(rel));
        drop(d);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Some(500));
        assert_eq!(parse_duration("30s"), Some(30_000));
        assert_eq!(parse_duration("15m"), Some(900_000));
        assert_eq!(parse_duration("1h"), Some(3_600_000));
        assert_eq!(parse_duration("0"), Some(0));
        assert_eq!(parse_duration("45"), Some(45_000));
        assert_eq!(parse_duration(" 2s "), Some(2000));
        for bad in ["", "ms", "1.5s", "-1", "+1", "1 s", "1d", "1h30m", "99999999999999999999", "18446744073709551615h"] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn key_lines() {
        let text = "# c\n\"port\": 1\nenv: {A: 1}\nx: {app-name: y}\n";
        assert_eq!(key_line(text, "port"), Some(2));
        assert_eq!(key_line(text, "env"), Some(3));
        assert_eq!(key_line(text, "app-name"), Some(4));
        assert_eq!(key_line(text, "host"), None);
        assert_eq!(key_line("é: 1\n", "é"), Some(1));
        assert_eq!(raw_value_after_key("  V: 1.10 # the version", "V").as_deref(), Some("1.10"));
    }
}
