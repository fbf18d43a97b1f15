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
        for part in [
            self.name.as_str(),
            self.group.as_str(),
            &self.working_dir.to_string_lossy(),
            self.entrypoint.as_str(),
            self.r_path.as_str(),
        ] {
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

/// Parses and validates a manifest's text. `path` is the manifest's absolute
/// path (relative paths inside it are relative to its folder).
pub fn parse(path: &Path, text: &str) -> Result<AppSpec, ManifestError> {
    let _ = (path, text);
    todo!("manifest::parse")
}

/// Parses a duration: `500ms`, `30s`, `15m`, `1h`, or a bare number of
/// seconds (so `0` works). Returns milliseconds.
pub fn parse_duration(s: &str) -> Option<u64> {
    let _ = s;
    todo!("manifest::parse_duration")
}

/// The 1-based line where top-level `key:` stands in `text`, if it does.
pub fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            l.strip_prefix(key)
                .map(|rest| rest.trim_start().starts_with(':'))
                .unwrap_or(false)
        })
        .map(|i| i + 1)
}
