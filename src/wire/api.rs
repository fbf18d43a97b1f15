//! The API of `api.sock`, between the command (and the load balancer's
//! calls) and the daemon: the requests' bodies and the replies, status's
//! report among them. Plain data with serde derives; the routes and
//! the client are [`super::api_client`].

use serde::{Deserialize, Serialize};

use super::table::Role;

/// The load balancer tells the daemon that a copy refused a connection and
/// a warm copy stood in (`POST /v1/apps/<app>/stand-in` on `api.sock`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StandIn {
    /// The copy that refused; none when no copy is down but every active
    /// one is full (`full`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down: Option<u32>,
    /// The warm copy that took the request, if there was one.
    pub stand_in: Option<u32>,
    /// Every active copy was full (`max-sessions`), so a new visitor went to
    /// the warm copy: the daemon makes it active and starts a new spare.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub full: bool,
}

// ---------------------------------------------------------------------------
// Files the daemon records
// ---------------------------------------------------------------------------

/// `POST /v1/apply`: the manifest as the user wrote it; the daemon parses
/// and validates it, so the same rules hold however it is reached.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApplyRequest {
    /// The manifest's absolute path.
    pub path: String,
    /// Its text.
    pub text: String,
    /// Stop what is replaced or removed at once, without draining.
    #[serde(default)]
    pub now: bool,
    /// A rolled-back app whose manifest is unchanged stays on its
    /// rolled-back release (`reload`: an unchanged app is left as it is);
    /// `apply` deploys the manifest again.
    #[serde(default)]
    pub keep_rollback: bool,
}

impl ApplyRequest {
    /// The most bytes the API takes in an apply request's JSON body: room
    /// for a manifest with a large `env`, and a bound on what one request
    /// makes the daemon hold.
    pub const MAX_BODY: usize = 1 << 20;

    /// Refuses a request whose body, `body_len` bytes of JSON, is over
    /// [`Self::MAX_BODY`], naming the manifest and the limit.
    pub fn check_size(&self, body_len: usize) -> Result<(), TooLarge> {
        if body_len <= Self::MAX_BODY {
            return Ok(());
        }
        Err(TooLarge { path: self.path.clone(), text_len: self.text.len(), body_len })
    }
}

/// An apply request over [`ApplyRequest::MAX_BODY`]: its text names the
/// manifest, its size and the limit.
#[derive(Debug, thiserror::Error)]
#[error(
    "{path}: the manifest is too large to apply: {} ({} as the API's request), and the API takes at most {} ({} bytes). \
     A manifest holds settings; keep data in the app's folder.",
    show(*text_len),
    show(*body_len),
    show(ApplyRequest::MAX_BODY),
    ApplyRequest::MAX_BODY
)]
pub struct TooLarge {
    /// The manifest's path.
    pub path: String,
    /// The manifest's length in bytes.
    pub text_len: usize,
    /// The request body's length in bytes.
    pub body_len: usize,
}

fn show(n: usize) -> String {
    crate::sys::fmt::size(n as u64, crate::sys::fmt::SizeStyle::Manifest)
}

/// `POST /v1/reload`: what became of each registered app's manifest.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReloadReply {
    /// One entry per app, by name.
    pub apps: Vec<Reloaded>,
}

/// One app's manifest applied again from its path, or why not.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reloaded {
    /// The app's name before the reload.
    pub app: String,
    /// The manifest's path, as it was applied from.
    pub manifest: String,
    /// Applied (changed or not); false leaves the app as it was.
    pub ok: bool,
    /// apply's message, or why the manifest was not applied.
    pub message: String,
}

/// What a command that changes things answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ActionReply {
    /// One line for the person who ran the command.
    pub message: String,
    /// The revision a deploy started (apply that changes how the app
    /// starts, restart, rollback), what `--wait` waits for; none when no
    /// copy restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
}

/// `GET /v1/apps/NAME/releases`: one kept release, oldest deploy first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseRow {
    /// Its id.
    pub id: String,
    /// Unix ms when it was taken.
    pub taken_ms: u64,
    /// The size of its files, in bytes.
    pub bytes: u64,
    /// A copy of it has been ready; false: never (no rollback target); none:
    /// recorded before this was kept.
    pub served: Option<bool>,
    /// It is the release new copies run.
    pub current: bool,
    /// It never served and its copies each ended before they were ready (a
    /// failed deploy; the release before still serves).
    #[serde(default)]
    pub failed: bool,
    /// The copies that run it now.
    pub running: Vec<u32>,
}

/// `GET /v1/apps/NAME/rollout?revision=N`: how a deploy is going.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutReply {
    /// Where it stands.
    pub state: RolloutState,
    /// One line for a person: what is starting, what serves, or why it failed.
    pub message: String,
    /// Whether a version before this deploy serves the app (awake: a copy
    /// of it is active; asleep: its sleeping copies are kept), so a failed
    /// deploy can say what visitors get. None from a daemon before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_serves: Option<bool>,
}

/// Where a deploy stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RolloutState {
    /// Its copies are starting; the version before still serves.
    Starting,
    /// Its copies serve (or, deployed while asleep, one of them was ready
    /// and the app sleeps on it).
    Serving,
    /// A copy of it ended before it was ready, or another deploy replaced
    /// it: the version before still serves.
    Failed,
}

/// An error answer from the API (any non-2xx status).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiError {
    /// What went wrong and what to do next.
    pub error: String,
}

/// `GET /v1/status`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StatusReport {
    /// The daemon's process ID.
    pub daemon_pid: u32,
    /// The load balancer's process ID, when it runs.
    pub proxy_pid: Option<u32>,
    /// The load balancer's resident memory, in bytes.
    pub proxy_rss_bytes: Option<u64>,
    /// Every app, by name.
    pub apps: Vec<AppStatus>,
    /// How the copies' memory and tasks limits are kept on this machine.
    #[serde(default)]
    pub limits: Option<LimitsReport>,
    /// Why fenced copies run as the daemon's own user rather than their
    /// app's own uid (a daemon that is not root, without subordinate ids),
    /// with the fix; none when every such copy has an id of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_user: Option<String>,
    /// The pool of R processes copies are claimed from.
    #[serde(default)]
    pub pool: Option<PoolReport>,
}

/// The pool (README, "Sleep and wake"): its zygotes and their memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolReport {
    /// Copies are claimed from it.
    pub on: bool,
    /// Why not, when it is off.
    pub off: Option<String>,
    /// How many zygotes it keeps.
    pub size: u32,
    /// The bound on a zygote's memory (its cgroup's limit), when kept.
    pub memory_max_bytes: Option<u64>,
    /// The zygotes that run.
    pub zygotes: Vec<ZygoteReport>,
}

/// One zygote of the pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ZygoteReport {
    /// Its PID.
    pub pid: u32,
    /// Its resident memory, in bytes.
    pub rss_bytes: u64,
    /// Its proportional share of that (as a copy's MEM: the pages its
    /// claimed copies still share with it are split among them), in bytes.
    #[serde(default)]
    pub mem_bytes: u64,
    /// It has loaded shiny and takes claims.
    pub ready: bool,
}

/// How the copies' limits are kept: what `status --json` says, so that a
/// missing cgroup and its fix are seen without reading api.log.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LimitsReport {
    /// `cgroup v2`, `cgroup v1` or `watch` (the daemon's own, every 250 ms).
    pub memory: String,
    /// `cgroup v2`, `cgroup v1` or `not kept`.
    pub tasks: String,
    /// What is missing, why, and the fix; none when both have a cgroup.
    pub missing: Option<String>,
}

/// One app in status.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AppStatus {
    /// The app's name.
    pub name: String,
    /// Its group.
    pub group: String,
    /// Its public port.
    pub port: u16,
    /// Its current revision.
    pub revision: u64,
    /// The release new copies run, when it has one.
    #[serde(default)]
    pub release: Option<String>,
    /// The release before it (what `rollback` goes back to).
    #[serde(default)]
    pub previous_release: Option<String>,
    /// Why its public port is not listened on, when it is not (taken by
    /// another program, not permitted): the app is not all ready, however
    /// ready its copies are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_listening: Option<String>,
    /// Its copies, by copy number.
    pub copies: Vec<CopyStatus>,
    /// Lines a person must know (draining, a copy that doesn't start, …).
    pub notes: Vec<String>,
    /// How a root daemon runs the copies of an app without `run-as`: as
    /// root, and in what (with the fix). Said here and in the README, not
    /// under every status table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs_as_root: Option<String>,
    /// The app's own uid (and gid) its copies run as, under a root daemon
    /// without `run-as` (README, "Identities").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Where the app stands: `running`, `asleep`, `stopped`, `rolled-back`
    /// (it runs a release `rollback` went back to) or `being-deleted`.
    #[serde(default)]
    pub state: String,
    /// `replicas`: the active copies wanted.
    #[serde(default)]
    pub replicas: u32,
    /// The manifest it was applied from (what `restart` reads).
    #[serde(default)]
    pub manifest: String,
    /// Its capacity: the keys as applied and where it stands (README,
    /// "Capacity"); none from a daemon before capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityStatus>,
}

/// An app's capacity in status: its keys as applied, and how many copies
/// are active for how many sessions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CapacityStatus {
    /// `max-sessions`; none: no limit.
    pub max_sessions: Option<u32>,
    /// `max-replicas` (at least `replicas`).
    pub max_replicas: u32,
    /// `scale-at`.
    pub scale_at: f64,
    /// `scale-down-after`, in ms.
    pub scale_down_after_ms: u64,
    /// The active copies wanted now, `replicas` to `max-replicas`.
    pub active_wanted: u32,
    /// The copies active now (ready, in the table).
    pub active: u32,
    /// Open Shiny sessions on its copies that serve (draining ones aside).
    pub sessions: u64,
    /// `active_wanted × max-sessions`; none with no limit.
    pub capacity: Option<u64>,
    /// Unix ms of its last grow, if it grew.
    pub grew_at_ms: Option<u64>,
    /// Unix ms of its last shrink, if it shrank.
    pub shrank_at_ms: Option<u64>,
    /// How many times it grew, since it was deployed.
    pub grows: u64,
    /// How many times it shrank (a sleep included), since it was deployed.
    pub shrinks: u64,
}

/// One copy in status: one row of the table.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CopyStatus {
    /// The copy number.
    pub copy: u32,
    /// Its role; none while it starts or is down.
    pub role: Option<Role>,
    /// Its own port on 127.0.0.1.
    pub copy_port: u16,
    /// Its R process as the host sees it, when it has one (the PID column).
    pub pid: Option<u32>,
    /// alive, stopping, crash-looping, exited, asleep.
    pub status: String,
    /// Ready to take visitors.
    pub ready: bool,
    /// Resident memory of its process tree, in bytes.
    pub mem_bytes: Option<u64>,
    /// Open WebSocket sessions through the load balancer.
    pub sessions: u64,
    /// Crashes since it last stayed up for a minute.
    pub crashes: u32,
    /// When its process started, RFC 3339 in local time.
    pub started: Option<String>,
    /// Runs another revision or other settings than the manifest.
    pub outdated: bool,
    /// Its log file.
    pub log: String,
    /// The id of the release it runs; none when it runs working-dir (a copy
    /// started before releases existed).
    #[serde(default)]
    pub release: Option<String>,
    /// The PID the daemon records, watches, stops and adopts: the copy's
    /// launcher (`pid` is R's, which the launcher reports; the same process
    /// when the launcher exec'd R).
    #[serde(default)]
    pub launcher_pid: Option<u32>,
    /// What isolation its launcher made (mount namespace, Landlock, none,
    /// and why not more); none for a copy that is not running or was
    /// started before the launcher existed.
    #[serde(default)]
    pub isolation: Option<Isolation>,
    /// When its process started, in Unix ms (`started` as a number).
    #[serde(default)]
    pub started_ms: Option<u64>,
    /// Seconds since its process started, while it runs.
    #[serde(default)]
    pub uptime_secs: Option<u64>,
    /// CPU time its process tree has used, in seconds, while it runs.
    #[serde(default)]
    pub cpu_secs: Option<f64>,
    /// The share of one core its process tree used over the last few
    /// seconds, in percent (100 is one core); none until read twice.
    #[serde(default)]
    pub cpu_percent: Option<f64>,
    /// The memory limit it runs under (`sandbox.memory`), in bytes.
    #[serde(default)]
    pub memory_limit_bytes: Option<u64>,
    /// The size of its disk (`sandbox.disk`: scratch, /tmp and /dev/shm
    /// together), in bytes; none for `unlimited` or with the fence off.
    #[serde(default)]
    pub disk_bytes: Option<u64>,
    /// True when the kernel keeps that size (a filesystem of the copy's
    /// own, under a root daemon); false when the daemon watches it.
    #[serde(default)]
    pub disk_own_filesystem: bool,
}

/// How a copy is isolated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IsolationKind {
    /// Its own mount namespace: the app folder is a read-only mount.
    MountNamespace,
    /// No namespace; Landlock limits where it writes.
    Landlock,
    /// Neither could be had: it runs as a plain process.
    None,
}

/// What a copy got, and why not more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Isolation {
    /// The isolation in force.
    pub kind: IsolationKind,
    /// Why it is not a mount namespace (none when it is).
    pub reason: Option<String>,
    /// Each fence of the copy, in force or not and why (empty for a copy
    /// started by a launcher from before the fence).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fences: Vec<Fence>,
    /// The user the copy runs as on the host (its name, or the uid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// How the copy's R started: claimed from the pool, or cold and why
    /// (README, "Sleep and wake": the pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
}

impl Isolation {
    /// The fences that are missing (asked for, not had).
    pub fn missing(&self) -> impl Iterator<Item = &Fence> {
        self.fences.iter().filter(|f| f.state == FenceState::Missing)
    }
}

/// Whether one fence is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FenceState {
    /// In force for this copy.
    InForce,
    /// Wanted but this machine (or this daemon) could not give it.
    Missing,
    /// Not wanted: `sandbox.mode: off`, or not applied by this build.
    Off,
}

/// One fence of a copy: `user-ns`, `mount-ns`, `pid-ns`, `ipc-ns`,
/// `uts-ns`, `landlock`, `seccomp`, `cgroup`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// Its name.
    pub name: String,
    /// In force, missing or off.
    pub state: FenceState,
    /// Why it is missing or off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What would give it (a sysctl, a unit setting), when missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// `GET /v1/apps/<app>/logs?copy=N`: where a copy's log is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogsReply {
    /// The log file's path (of the copy asked for with `?copy=N`, else of
    /// the first copy listed).
    pub path: String,
    /// Every copy's log: the app's copies first (running, starting or
    /// asleep), oldest start first, then the logs of copies that ended.
    #[serde(default)]
    pub copies: Vec<CopyLogFile>,
}

/// One copy's log file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyLogFile {
    /// The copy number.
    pub copy: u32,
    /// The log file's path.
    pub path: String,
    /// The copy is one of the app's now (it may be asleep); false for a
    /// copy that ended for good (its log is kept until its release goes).
    pub live: bool,
}
