//! The manifest: YAML (one app a file, kebab-case keys) → a validated
//! [`AppSpec`]. A bad manifest is refused whole, with the file, the line, the
//! key and what is allowed.
//!
//! How it is read: [`parse`] loads the YAML and hands each key to a
//! [`draft::Draft`], which looks the key up in its table and runs that key's
//! own check (`keys.rs`: one function per key, such as
//! `fn port(cx: &Cx, v: &Value) -> Result<u16, ManifestError>`). Once every
//! key is in, `Draft::finish` fills the defaults and runs the checks that need
//! several keys. `yaml.rs` reads the YAML (saphyr's parser) into values
//! that know their line; `error.rs` holds the error type; `value.rs` reads
//! the kinds of value keys share (text, whole numbers, durations).
//!
//! An [`AppSpec`] is the app's identity and bookkeeping (name, group, the
//! manifest, state-file, keep-releases) around the settings split by who
//! uses them, each travelling as one value: [`StartSpec`] (how a copy
//! starts: a release keeps it, the launcher gets it whole, its hash tells an
//! outdated copy) and [`RouteSpec`] (how visitors reach the copies: the
//! load balancer gets it in the copies table) and [`ScaleSpec`] (how many
//! copies run and how they come and go: `reconcile::decide` reads it).
//!
//! Adding a key: its check function in `keys.rs`, a field in `Draft` and its
//! line in `draft::TAKE` (which also lists it in [`KEYS`] and in the "did you
//! mean" suggestions), and its field, with its default from
//! `Draft::finish`, in the part of the spec whose user reads it. A start key
//! then needs nothing else but the one place that uses it (the launcher):
//! the release keeps it, the hash covers it and the launcher receives it
//! with the rest of the start spec. Give it `#[serde(default,
//! skip_serializing_if = …)]` so that at its default it is left out of the
//! files and the hash (no existing app is redeployed).

mod draft;
mod env;
mod error;
mod fence;
mod keys;
mod net;
mod policy;
mod route;
mod sandbox;
mod scale;
mod start;
mod value;
mod yaml;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_corpus;
#[cfg(test)]
mod tests_fence;

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use error::{describe, Doc};
use yaml::{Node, Value};

pub use draft::KEYS;
pub use error::ManifestError;
pub use fence::SANDBOX_KEYS;
pub use net::Cidr;
pub use policy::{LbPolicy, RestartPolicy};
pub use route::RouteSpec;
pub use sandbox::{parse_size, Disk, Sandbox, SandboxMode, Syscalls, DEFAULT_OPEN_FILES, DEFAULT_TASKS};
pub use scale::ScaleSpec;
pub use start::{settings_hash, StartSpec};
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
    /// How a copy starts: the settings a release is deployed with.
    #[serde(flatten)]
    pub start: StartSpec,
    /// How visitors reach the copies: what the load balancer reads.
    #[serde(flatten)]
    pub route: RouteSpec,
    /// How many copies run and how they come and go: what the cycle reads.
    #[serde(flatten)]
    pub scale: ScaleSpec,
    /// `state-file`, absolute; default `state.json` beside the manifest.
    pub state_file: PathBuf,
    /// `keep-releases`, default [`DEFAULT_KEEP_RELEASES`]: the releases kept
    /// on disk, the current one included (and any a copy still runs).
    #[serde(default = "default_keep_releases")]
    pub keep_releases: u32,
    /// `pool`: copies are claimed from the pool (false: always cold). Not
    /// part of how a copy starts in the settings hash: a claimed and a cold
    /// copy run the same app the same way, so changing it restarts none.
    #[serde(default = "pool_default")]
    pub pool: bool,
}

impl AppSpec {
    /// The hash of the app's name, group and start spec
    /// ([`start::settings_hash`]). Copies started with another hash are
    /// outdated.
    pub fn settings_hash(&self) -> String {
        start::settings_hash(&self.name, &self.group, &self.start)
    }

    /// This spec with `start` (a release's) in place of its own.
    pub fn with_start(&self, start: &StartSpec) -> AppSpec {
        AppSpec { start: start.clone(), ..self.clone() }
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
pub(crate) fn default_start_timeout() -> u64 {
    DEFAULT_START_TIMEOUT_MS
}

/// `scale-at`'s default, as Posit Connect's load factor.
pub const DEFAULT_SCALE_AT: f64 = 0.8;

/// `scale-down-after`'s default: 5 minutes.
pub const DEFAULT_SCALE_DOWN_AFTER_MS: u64 = 5 * 60 * 1000;

/// The most `max-sessions` (a sanity limit).
pub const MAX_SESSIONS: u64 = 100_000;

/// For an app recorded before `scale-at` existed.
pub(crate) fn default_scale_at() -> f64 {
    DEFAULT_SCALE_AT
}

/// For an app recorded before `scale-down-after` existed.
pub(crate) fn default_scale_down_after() -> u64 {
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
    parse_with_lines(path, text).map(|(spec, _)| spec)
}

/// [`parse`], with the lines of the manifest's top-level keys as the
/// parser read them: for the errors found once the manifest is read, such
/// as a port another app holds.
pub fn parse_with_lines(path: &Path, text: &str) -> Result<(AppSpec, KeyLines), ManifestError> {
    let file = keys::absolute(path);
    let dir = file.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("/"));
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut doc = Doc { file: &file, dir: &dir, start: 1, keys: KeyLines::default() };

    let entries = mapping(&mut doc, text)?;
    let mut draft = draft::Draft::default();
    for (k, v) in &entries {
        draft.take(&doc.key(key_text(&doc, k)?), &v.value)?;
    }
    draft.finish(&doc).map(|spec| (spec, doc.keys))
}

/// The top-level keys of a manifest with the lines they are written on.
#[derive(Debug, Default, Clone)]
pub struct KeyLines(Vec<(String, usize)>);

impl KeyLines {
    /// The 1-based line of `key`, when it is written.
    pub fn line(&self, key: &str) -> Option<usize> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, line)| *line)
    }
}

/// The document's top-level mapping's entries; an empty document, another
/// kind of value or YAML that does not parse is refused. Sets where the
/// mapping starts and its keys' lines in `doc`.
fn mapping(doc: &mut Doc, text: &str) -> Result<Vec<(Node, Node)>, ManifestError> {
    let root = yaml::load(text).map_err(|f| doc.yaml_error(f))?;
    let Some(root) = root else { return Err(empty(doc, 1)) };
    // An empty document after `---` starts past the last line.
    doc.start = root.line.min(text.lines().count().max(1));
    match root.value {
        Value::Mapping(m) => {
            doc.keys.0 =
                m.iter().filter_map(|(k, _)| if let Value::String(s) = &k.value { Some((s.clone(), k.line)) } else { None }).collect();
            Ok(m)
        }
        Value::Null => Err(empty(doc, doc.start)),
        other => Err(doc.at(
            root.line,
            None,
            format!(
                "the manifest must be a YAML mapping of keys (`app-name: hello`, `port: 8080`, ...), \
                 not {}; allowed keys: {}",
                describe(&other),
                KEYS.join(", ")
            ),
        )),
    }
}

/// The refusal of a manifest with no keys.
fn empty(doc: &Doc, line: usize) -> ManifestError {
    doc.at(
        line,
        None,
        "the manifest is empty; it needs at least app-name and port, \
         such as `app-name: hello` and `port: 8080` on lines of their own"
            .to_string(),
    )
}

/// A top-level key as text; a key that is a number, true/false, a list or a
/// mapping is refused at its line.
fn key_text<'v>(doc: &Doc, k: &'v Node) -> Result<&'v str, ManifestError> {
    match &k.value {
        Value::String(s) => Ok(s.as_str()),
        other => Err(doc.at(k.line, Some(&describe(other)), format!("keys must be text; allowed keys: {}", KEYS.join(", ")))),
    }
}

/// `pool`'s default: on.
fn pool_default() -> bool {
    true
}
