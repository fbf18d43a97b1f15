//! The manifest: YAML (one app a file, kebab-case keys) → a validated
//! [`AppSpec`]. A bad manifest is refused whole, with the file, the line, the
//! key and what is allowed.
//!
//! How it is read: [`parse`] loads the YAML and hands each key to a
//! [`draft::Draft`], which looks the key up in its table and runs that key's
//! own check (`keys.rs`: one function per key, such as
//! `fn port(cx: &Cx, v: &Value) -> Result<u16, ManifestError>`). Once every
//! key is in, `Draft::finish` fills the defaults and runs the checks that need
//! several keys. `error.rs` holds the error type and finds the line of a key;
//! `value.rs` reads the kinds of value keys share (text, whole numbers,
//! durations).
//!
//! Adding a key: its check function in `keys.rs`, a field in `Draft` and its
//! line in `draft::TAKE` (which also lists it in [`KEYS`] and in the "did you
//! mean" suggestions), its field in [`AppSpec`] with its default in
//! `Draft::finish`.

mod draft;
mod env;
mod error;
mod fence;
mod keys;
mod net;
mod policy;
mod sandbox;
mod value;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_fence;

use serde::{Deserialize, Serialize};
use serde_yaml::{Mapping, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use error::{describe, first_content_line, Doc};

pub use draft::KEYS;
pub use error::{line_of_key, ManifestError};
pub use fence::SANDBOX_KEYS;
pub use net::Cidr;
pub use policy::{LbPolicy, RestartPolicy};
pub use sandbox::{parse_size, show_size, Sandbox, SandboxMode, Syscalls, DEFAULT_OPEN_FILES, DEFAULT_TASKS};
pub use value::parse_duration;

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
    /// `start-timeout` in ms, default [`DEFAULT_START_TIMEOUT_MS`]: a copy
    /// not ready by then is stopped and counted as a crash (Shiny Server's
    /// `app_init_timeout`). Changing it restarts no copy.
    #[serde(default = "default_start_timeout")]
    pub start_timeout_ms: u64,
    /// `keep-releases`, default [`DEFAULT_KEEP_RELEASES`]: the releases kept
    /// on disk, the current one included (and any a copy still runs).
    #[serde(default = "default_keep_releases")]
    pub keep_releases: u32,
    /// `r-path`, default `R` (found on PATH).
    pub r_path: String,
    /// `max-connections`, default [`DEFAULT_MAX_CONNECTIONS`]: the most
    /// visitors' connections the load balancer keeps open for the app at
    /// once; past it a visitor gets a 503 with Retry-After. The load
    /// balancer reads it from the table: changing it restarts no copy.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// `trusted-proxies`, default none: addresses and CIDR ranges (in the
    /// form [`Cidr`] prints) of proxies in front, whose `X-Forwarded-For` is
    /// appended to and `X-Forwarded-Proto` kept, and whose connections no
    /// per-address cap limits. In the table too, like `max-connections`.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// `sandbox`: how each copy is fenced (defaults when absent).
    #[serde(default)]
    pub sandbox: Sandbox,
    /// `run-as`: the user copies run as when the daemon is root; none: the
    /// daemon's own user.
    #[serde(default)]
    pub run_as: Option<String>,
    /// `pool`: copies are claimed from the pool (false: always cold).
    #[serde(default = "pool_default")]
    pub pool: bool,
    /// `max-sessions`: the Shiny sessions (open WebSockets) a copy takes
    /// before it counts as full; none: no limit, and the app never grows.
    /// Like every capacity key, read by the cycle and the table: changing it
    /// restarts no copy.
    #[serde(default)]
    pub max_sessions: Option<u32>,
    /// `max-replicas`: the most active copies the app may grow to; as
    /// written, the manifest's `replicas` when not given. 0 (an app recorded
    /// before it existed) reads as `replicas`: see [`AppSpec::max_active`].
    #[serde(default)]
    pub max_replicas: u32,
    /// `scale-at`, default [`DEFAULT_SCALE_AT`]: the share of the active
    /// copies' capacity their open sessions reach when the app grows.
    #[serde(default = "default_scale_at")]
    pub scale_at: f64,
    /// `scale-down-after` in ms, default [`DEFAULT_SCALE_DOWN_AFTER_MS`]:
    /// how long the load must stay low before a grown copy leaves.
    #[serde(default = "default_scale_down_after")]
    pub scale_down_after_ms: u64,
}

impl AppSpec {
    /// The most active copies: `max-replicas`, never fewer than `replicas`
    /// (an app recorded before `max-replicas`, or scaled past it, does not
    /// shrink below what it is told).
    pub fn max_active(&self) -> u32 {
        self.max_replicas.max(self.replicas)
    }

    /// The hash of everything that decides how a copy starts: env,
    /// working-dir, app-group, app-name, entrypoint-file, r-path, and the
    /// fence (`sandbox`, `run-as`) when it is not the default. Copies
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
        // Only a fence that differs from the default counts, so the apps
        // deployed before the fence keep their hash (and their copies).
        if self.sandbox != Sandbox::default() {
            h.update(b"sandbox=");
            h.update(serde_json::to_vec(&self.sandbox).unwrap_or_default());
            h.update([0]);
        }
        if let Some(user) = &self.run_as {
            h.update(b"run-as=");
            h.update(user.as_bytes());
            h.update([0]);
        }
        let digest = h.finalize();
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// `start-timeout`'s default: 60 s, as Shiny Server's `app_init_timeout`.
pub const DEFAULT_START_TIMEOUT_MS: u64 = 60_000;

/// `keep-releases`' default.
pub const DEFAULT_KEEP_RELEASES: u32 = 3;

/// For an app recorded before `keep-releases` existed.
fn default_keep_releases() -> u32 {
    DEFAULT_KEEP_RELEASES
}

/// For an app recorded before `start-timeout` existed.
fn default_start_timeout() -> u64 {
    DEFAULT_START_TIMEOUT_MS
}

/// `scale-at`'s default, as Posit Connect's load factor.
pub const DEFAULT_SCALE_AT: f64 = 0.8;

/// `scale-down-after`'s default: 5 minutes.
pub const DEFAULT_SCALE_DOWN_AFTER_MS: u64 = 5 * 60 * 1000;

/// The most `max-sessions` (a sanity limit).
pub const MAX_SESSIONS: u64 = 100_000;

/// For an app recorded before `scale-at` existed.
fn default_scale_at() -> f64 {
    DEFAULT_SCALE_AT
}

/// For an app recorded before `scale-down-after` existed.
fn default_scale_down_after() -> u64 {
    DEFAULT_SCALE_DOWN_AFTER_MS
}

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
/// The default `max-connections`: enough for a busy app's visitors (a
/// browser opens up to six connections, a Shiny session keeps one), and
/// under what one load balancer can hold with the hard open-files limit of
/// most systems (each visitor's connection may need one to a copy too).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10_000;
/// The most `max-connections` (a sanity limit, far past what one machine
/// can hold open).
pub const MAX_CONNECTIONS: u64 = 1_000_000;

/// A spec written before `max-connections` existed gets the default.
fn default_max_connections() -> u32 {
    DEFAULT_MAX_CONNECTIONS
}

/// The longest `request-timeout`: 30 s.
pub const MAX_REQUEST_TIMEOUT_MS: u64 = 30_000;

/// Parses and validates a manifest's text. `path` is the manifest's absolute
/// path (relative paths inside it are relative to its folder; a relative
/// `path` is taken relative to the current folder).
///
/// Errors come in the order of the document: the first bad key wins, then a
/// missing required key, then the checks that need several keys (the
/// entrypoint file inside working-dir). Every error names the file, the
/// 1-based line, the key (when there is one) and what is allowed.
pub fn parse(path: &Path, text: &str) -> Result<AppSpec, ManifestError> {
    let file = keys::absolute(path);
    let dir = file.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("/"));
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let doc = Doc { file: &file, dir: &dir, text };

    let mut draft = draft::Draft::default();
    for (k, v) in &mapping(&doc)? {
        let key = key_text(&doc, k)?;
        draft.take(&doc.key(key), v)?;
    }
    draft.finish(&doc)
}

/// The document's top-level mapping; an empty document, another kind of
/// value or YAML that does not parse is refused.
fn mapping(doc: &Doc) -> Result<Mapping, ManifestError> {
    let text = doc.text;
    match serde_yaml::from_str(text) {
        Ok(Value::Mapping(m)) => Ok(m),
        Ok(Value::Null) => Err(doc.at(
            first_content_line(text),
            None,
            "the manifest is empty; it needs at least app-name and port, \
             such as `app-name: hello` and `port: 8080` on lines of their own"
                .to_string(),
        )),
        Ok(other) => Err(doc.at(
            first_content_line(text),
            None,
            format!(
                "the manifest must be a YAML mapping of keys (`app-name: hello`, `port: 8080`, ...), \
                 not {}; allowed keys: {}",
                describe(&other),
                KEYS.join(", ")
            ),
        )),
        Err(e) => Err(doc.yaml_error(&e)),
    }
}

/// A top-level key as text; a key that is a number, true/false, a list or a
/// mapping is refused.
fn key_text<'v>(doc: &Doc, k: &'v Value) -> Result<&'v str, ManifestError> {
    match k {
        Value::String(s) => Ok(s.as_str()),
        other => {
            let shown = describe(other);
            let line = match other {
                Value::Number(n) => error::key_line(doc.text, &n.to_string()),
                Value::Bool(b) => error::key_line(doc.text, &b.to_string()),
                _ => None,
            };
            Err(doc.at(
                line.unwrap_or_else(|| first_content_line(doc.text)),
                Some(&shown),
                format!("keys must be text; allowed keys: {}", KEYS.join(", ")),
            ))
        }
    }
}

/// `pool`'s default: on.
fn pool_default() -> bool {
    true
}
