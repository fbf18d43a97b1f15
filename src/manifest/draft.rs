//! The keys of a manifest as they are read: [`Draft`] takes each key through
//! its check (the table [`TAKE`]), and `finish` fills the defaults and runs
//! the checks that need several keys.

use super::yaml::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

use super::error::{Doc, KeyContext};
use super::keys::{self, NAME_ALLOWED, PORT_ALLOWED};
use super::{
    env, fence, AppSpec, LbPolicy, ManifestError, RestartPolicy, RouteSpec, Sandbox, ScaleSpec, StartSpec, DEFAULT_KEEP_RELEASES,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_SCALE_AT, DEFAULT_SCALE_DOWN_AFTER_MS, DEFAULT_START_TIMEOUT_MS,
};

/// A manifest being read. One field per key, named as in [`AppSpec`]: the
/// key's checked value, none while the key has not been read.
#[derive(Default)]
pub(super) struct Draft {
    name: Option<String>,
    group: Option<String>,
    working_dir: Option<PathBuf>,
    entrypoint: Option<String>,
    port: Option<u16>,
    host: Option<std::net::IpAddr>,
    replicas: Option<u32>,
    warm_replicas: Option<u32>,
    lb_policy: Option<LbPolicy>,
    drain_timeout_ms: Option<u64>,
    restart_policy: Option<RestartPolicy>,
    env: Option<BTreeMap<String, String>>,
    state_file: Option<PathBuf>,
    idle_timeout_ms: Option<u64>,
    request_timeout_ms: Option<u64>,
    start_timeout_ms: Option<u64>,
    keep_releases: Option<u32>,
    r_path: Option<String>,
    max_connections: Option<u32>,
    trusted_proxies: Option<Vec<super::Cidr>>,
    sandbox: Option<Sandbox>,
    run_as: Option<String>,
    max_sessions: Option<u32>,
    max_replicas: Option<u32>,
    scale_at: Option<f64>,
    scale_down_after_ms: Option<u64>,
    pool: Option<bool>,
}

/// Runs a key's check and keeps its value in the draft.
type Take = fn(&mut Draft, &KeyContext, &Value) -> Result<(), ManifestError>;

/// Every key a manifest may hold, in the order the documentation lists
/// them, with what takes it in: a new key's check in `keys.rs` is wired
/// in here, by one line.
const TAKE: [(&str, Take); 27] = [
    ("app-name", |d, cx, v| keys::app_name(cx, v).map(|x| d.name = Some(x))),
    ("app-group", |d, cx, v| keys::app_group(cx, v).map(|x| d.group = Some(x))),
    ("working-dir", |d, cx, v| keys::working_dir(cx, v).map(|x| d.working_dir = Some(x))),
    ("entrypoint-file", |d, cx, v| keys::entrypoint_file(cx, v).map(|x| d.entrypoint = Some(x))),
    ("port", |d, cx, v| keys::port(cx, v).map(|x| d.port = Some(x))),
    ("host", |d, cx, v| keys::host(cx, v).map(|x| d.host = Some(x))),
    ("replicas", |d, cx, v| keys::replicas(cx, v).map(|x| d.replicas = Some(x))),
    ("warm-replicas", |d, cx, v| keys::warm_replicas(cx, v).map(|x| d.warm_replicas = Some(x))),
    ("max-replicas", |d, cx, v| keys::max_replicas(cx, v).map(|x| d.max_replicas = Some(x))),
    ("max-sessions", |d, cx, v| keys::max_sessions(cx, v).map(|x| d.max_sessions = Some(x))),
    ("scale-at", |d, cx, v| keys::scale_at(cx, v).map(|x| d.scale_at = Some(x))),
    ("scale-down-after", |d, cx, v| keys::scale_down_after(cx, v).map(|x| d.scale_down_after_ms = Some(x))),
    ("lb-policy", |d, cx, v| keys::lb_policy(cx, v).map(|x| d.lb_policy = Some(x))),
    ("drain-timeout", |d, cx, v| keys::drain_timeout(cx, v).map(|x| d.drain_timeout_ms = Some(x))),
    ("restart-policy", |d, cx, v| keys::restart_policy(cx, v).map(|x| d.restart_policy = Some(x))),
    ("env", |d, cx, v| env::env(cx, v).map(|x| d.env = Some(x))),
    ("state-file", |d, cx, v| keys::state_file(cx, v).map(|x| d.state_file = Some(x))),
    ("idle-timeout", |d, cx, v| keys::idle_timeout(cx, v).map(|x| d.idle_timeout_ms = Some(x))),
    ("request-timeout", |d, cx, v| keys::request_timeout(cx, v).map(|x| d.request_timeout_ms = Some(x))),
    ("start-timeout", |d, cx, v| keys::start_timeout(cx, v).map(|x| d.start_timeout_ms = Some(x))),
    ("keep-releases", |d, cx, v| keys::keep_releases(cx, v).map(|x| d.keep_releases = Some(x))),
    ("r-path", |d, cx, v| keys::r_path(cx, v).map(|x| d.r_path = Some(x))),
    ("max-connections", |d, cx, v| keys::max_connections(cx, v).map(|x| d.max_connections = Some(x))),
    ("trusted-proxies", |d, cx, v| keys::trusted_proxies(cx, v).map(|x| d.trusted_proxies = Some(x))),
    ("sandbox", |d, cx, v| fence::sandbox(cx, v).map(|x| d.sandbox = Some(x))),
    ("run-as", |d, cx, v| fence::run_as(cx, v).map(|x| d.run_as = Some(x))),
    ("pool", |d, cx, v| keys::pool(cx, v).map(|x| d.pool = Some(x))),
];

/// Every key a manifest may hold, in the order the documentation lists them.
pub const KEYS: [&str; TAKE.len()] = key_names(&TAKE);

/// The keys of [`TAKE`], in its order.
const fn key_names<const N: usize>(take: &[(&'static str, Take); N]) -> [&'static str; N] {
    let mut names = [""; N];
    let mut i = 0;
    while i < N {
        names[i] = take[i].0;
        i += 1;
    }
    names
}

impl Draft {
    /// Checks the key `cx` is for and keeps its value; a key no manifest
    /// may hold is refused.
    pub fn take(&mut self, cx: &KeyContext, v: &Value) -> Result<(), ManifestError> {
        match TAKE.iter().find(|(key, _)| *key == cx.key) {
            Some((_, take)) => take(self, cx, v),
            None => Err(cx.unknown(&KEYS)),
        }
    }

    /// The spec, once every key is read: a missing required key is refused,
    /// the defaults are filled in, then the checks that need several keys
    /// run (the entrypoint file inside working-dir).
    pub fn finish(self, doc: &Doc) -> Result<AppSpec, ManifestError> {
        let first_line = doc.start;
        let Some(name) = self.name else {
            return Err(doc.at(first_line, Some("app-name"), format!("missing; it is required: the app's name, {NAME_ALLOWED}")));
        };
        let Some(port) = self.port else {
            return Err(doc.at(
                first_line,
                Some("port"),
                format!("missing; it is required: the port the app is served on, {PORT_ALLOWED}"),
            ));
        };
        let working_dir = match self.working_dir {
            Some(p) => p,
            None => {
                keys::check_dir(&doc.key("working-dir"), doc.dir)?;
                doc.dir.to_path_buf()
            }
        };
        let entrypoint = keys::entrypoint(&doc.key("entrypoint-file"), &working_dir, self.entrypoint)?;
        let replicas = self.replicas.unwrap_or(1);
        let max_replicas = keys::max_replicas_over_replicas(&doc.key("max-replicas"), self.max_replicas, replicas)?;

        Ok(AppSpec {
            name,
            group: self.group.unwrap_or_else(|| "default".to_string()),
            manifest: doc.file.to_path_buf(),
            start: StartSpec {
                working_dir,
                entrypoint,
                r_path: self.r_path.unwrap_or_else(|| "R".to_string()),
                env: self.env.unwrap_or_default(),
                sandbox: self.sandbox.unwrap_or_default(),
                run_as: self.run_as,
            },
            route: RouteSpec {
                host: self.host.unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
                port,
                lb_policy: self.lb_policy.unwrap_or_default(),
                request_timeout_ms: self.request_timeout_ms.unwrap_or(30 * 1000),
                max_connections: self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS),
                trusted_proxies: self.trusted_proxies.unwrap_or_default(),
            },
            scale: ScaleSpec {
                replicas,
                warm_replicas: self.warm_replicas.unwrap_or(1),
                drain_timeout_ms: self.drain_timeout_ms.unwrap_or(15 * 60 * 1000),
                restart_policy: self.restart_policy.unwrap_or_default(),
                idle_timeout_ms: self.idle_timeout_ms.unwrap_or(300 * 1000),
                start_timeout_ms: self.start_timeout_ms.unwrap_or(DEFAULT_START_TIMEOUT_MS),
                max_sessions: self.max_sessions,
                max_replicas,
                scale_at: self.scale_at.unwrap_or(DEFAULT_SCALE_AT),
                scale_down_after_ms: self.scale_down_after_ms.unwrap_or(DEFAULT_SCALE_DOWN_AFTER_MS),
            },
            state_file: self.state_file.unwrap_or_else(|| doc.dir.join("state.json")),
            keep_releases: self.keep_releases.unwrap_or(DEFAULT_KEEP_RELEASES),
            pool: self.pool.unwrap_or(true),
        })
    }
}
