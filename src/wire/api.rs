//! The types that cross a process boundary: the API between the command and
//! the daemon, the copies table the daemon pushes to the load balancer, the
//! load balancer's statistics, and the state the daemon records
//! (`state.json`; `registry.json` is `serve::record::Registry`, as it holds
//! the manifest's `AppSpec`).
//!
//! Everything here is plain data with serde derives; no I/O lives in this file.

use serde::{Deserialize, Serialize};

/// The policy the copies table carries ([`ProxyApp::policy`]); the manifest
/// owns it, as it is a manifest value first.
pub use crate::manifest::LbPolicy;

/// The build identity of this binary (the version and a hash of its
/// sources): a load balancer of another build is replaced on upgrade.
pub const BUILD: &str = concat!(env!("CARGO_PKG_VERSION"), "+", env!("SHINYCTL_BUILD_ID"));

/// How a copy is treated by the load balancer. Worked out anew on every
/// cycle and never stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// One of the oldest `replicas` ready copies: takes new visitors.
    Active,
    /// A ready spare: no new visitors while every active copy is up.
    Warm,
    /// Being replaced: keeps its visitors, gets no new ones.
    Draining,
}

impl Role {
    /// The word status prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Active => "active",
            Role::Warm => "warm",
            Role::Draining => "draining",
        }
    }
}

// ---------------------------------------------------------------------------
// The copies table: daemon → load balancer
// ---------------------------------------------------------------------------

/// The whole copies table for every app, pushed by the daemon to the load
/// balancer (`PUT /table` on `proxy/proxy.sock`) and swapped in memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProxyTable {
    /// One entry per app, each with its own listening port.
    pub apps: Vec<ProxyApp>,
}

/// One app as the load balancer sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxyApp {
    /// The app's name, used when telling the daemon about a stand-in.
    pub name: String,
    /// How visitors reach it: the app's route spec, its keys the table's
    /// (`host`, `port`, `policy`, `request_timeout_ms`, `max_connections`,
    /// `trusted_proxies`).
    #[serde(flatten)]
    pub route: crate::manifest::RouteSpec,
    /// The app sleeps: a request asks the daemon for a wake
    /// (`POST /v1/apps/<name>/wake` on api.sock, shared by the requests that
    /// arrive together) and is held until a copy is ready.
    #[serde(default)]
    pub asleep: bool,
    /// Its port is listened on. False for an app being deleted: it takes no
    /// new connection, while the ones it has (a Shiny session draining) are
    /// still carried and counted until its copies are gone.
    #[serde(default = "listening_by_default")]
    pub listening: bool,
    /// Stopped by `shinyctl stop`: every request gets the page that says
    /// so (503, Retry-After), at once; no wake.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
    /// `max-sessions`: the sessions that make a copy full; none: no limit
    /// (README, "Capacity").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u32>,
    /// `max-replicas` (at least `replicas`): while fewer copies are active,
    /// a visitor who finds every active copy full goes to the spare, or
    /// over `max-sessions`, never held.
    #[serde(default)]
    pub max_replicas: u32,
    /// The copies that may receive traffic: ready ones, each with its role.
    pub copies: Vec<ProxyCopy>,
}

#[cfg(test)]
impl ProxyApp {
    /// For the load balancer's own tests: app `name` on 127.0.0.1:8080 with
    /// `policy`, awake and listening, the default timeout, no caps.
    pub(crate) fn for_tests(name: &str, policy: LbPolicy, copies: Vec<ProxyCopy>) -> ProxyApp {
        ProxyApp {
            name: name.into(),
            route: crate::manifest::RouteSpec {
                host: std::net::Ipv4Addr::LOCALHOST.into(),
                port: 8080,
                lb_policy: policy,
                request_timeout_ms: 30_000,
                max_connections: 0,
                trusted_proxies: Vec::new(),
            },
            asleep: false,
            listening: true,
            stopped: false,
            max_sessions: None,
            max_replicas: 0,
            copies,
        }
    }
}

/// A table from a daemon that did not send `listening` listens on every app.
fn listening_by_default() -> bool {
    true
}

/// One ready copy in the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyCopy {
    /// The copy number, what the sticky cookie names.
    pub copy: u32,
    /// The copy's own port on 127.0.0.1.
    pub port: u16,
    /// How the load balancer treats it.
    pub role: Role,
    /// The copy's process, so a cookie for a copy number that was restarted
    /// as another process is still honoured (same copy), while its
    /// connection counters start anew.
    pub pid: u32,
}

/// What the load balancer reports about itself (`GET /stats`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProxyStats {
    /// The load balancer's build ([`BUILD`]).
    pub build: String,
    /// Its process ID.
    pub pid: u32,
    /// Its resident memory, in bytes.
    pub rss_bytes: u64,
    /// One entry per app in its table.
    pub apps: Vec<AppTraffic>,
    /// Its fixed settings (the daemon writes them to proxy/settings.json).
    #[serde(default)]
    pub settings: ProxySettings,
}

/// The load balancer's own settings, the same for every app.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProxySettings {
    /// A visitor must send a request's head within this; an idle keep-alive
    /// connection is closed after it.
    pub header_timeout_ms: u64,
    /// The largest request head accepted, in bytes (431 beyond it).
    pub max_header_bytes: usize,
    /// Worker threads serving visitors.
    pub workers: usize,
    /// The longest a request is held while no copy can take it.
    pub hold_ms: u64,
    /// The longest a request is held while its app wakes.
    pub wake_hold_ms: u64,
    /// How long requests in flight may take once it is told to stop.
    pub shutdown_drain_ms: u64,
}

/// Traffic of one app.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AppTraffic {
    /// The app's name.
    pub name: String,
    /// Unix time in ms of the last request the app received, 0 if none.
    pub last_request_ms: u64,
    /// Open connections and sessions per copy.
    pub copies: Vec<CopyTraffic>,
    /// Requests answered 502 at once for a while: each was in flight when
    /// two copies died within a minute.
    #[serde(default)]
    pub refusing: Vec<Refusing>,
    /// Copies a push took out of the table while answers to them were
    /// still under way: the daemon waits for those before it stops the
    /// copy. Empty from a load balancer of a build without it.
    #[serde(default)]
    pub leaving: Vec<LeavingCopy>,
}

/// A copy no longer in the table with requests still in flight to it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeavingCopy {
    /// The copy number.
    pub copy: u32,
    /// Its process, as the table named it.
    pub pid: u32,
    /// Requests in flight to it (open WebSockets not counted).
    pub requests: u64,
}

/// A request the load balancer answers 502 at once for a while.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusing {
    /// Method, path and query: `GET /crash?x=1`.
    pub request: String,
    /// How much longer, in ms.
    pub for_ms: u64,
}

/// Open connections and sessions of one copy.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CopyTraffic {
    /// The copy number.
    pub copy: u32,
    /// Requests in flight plus open WebSockets.
    pub connections: u64,
    /// Open WebSockets (a Shiny session is one).
    pub sessions: u64,
    /// How long, in ms, a request has waited for the copy with no answer
    /// from it, once that makes it stalled (it gets no new visitors); 0
    /// while it answers.
    #[serde(default)]
    pub silent_ms: u64,
}

/// What the load balancer counts for metrics (`GET /metrics` on
/// `proxy.sock`): its own process, the traffic per copy, and the requests
/// per app since it started.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProxyMetrics {
    /// Its process ID.
    pub pid: u32,
    /// Its resident memory, in bytes.
    pub rss_bytes: u64,
    /// Visitors' connections it serves now: HTTP ones and WebSocket tunnels.
    pub open_connections: u64,
    /// Open connections and sessions per app and copy.
    pub traffic: Vec<AppTraffic>,
    /// Requests answered per app.
    pub requests: Vec<AppRequests>,
}

/// The upper bounds, in seconds, of the buckets of the load balancer's
/// latency histogram (time until an answer's head).
pub const LATENCY_BOUNDS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The requests one app's visitors got answers to, since the load balancer
/// started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AppRequests {
    /// The app's name.
    pub name: String,
    /// Answers by status class: 1xx, 2xx, 3xx, 4xx, 5xx.
    pub classes: [u64; 5],
    /// Time until the answer's head: how many fell in each bucket alone, by
    /// [`LATENCY_BOUNDS`], then one more for those above the last bound.
    pub latency_counts: Vec<u64>,
    /// The sum of those times, in seconds.
    pub latency_sum: f64,
    /// Answers 502, 503 and 504, in that order (also in `classes`' 5xx).
    #[serde(default)]
    pub gateway: [u64; 3],
    /// WebSocket sessions (Shiny sessions) opened.
    #[serde(default)]
    pub sessions_opened: u64,
    /// Bytes read from visitors' connections to the app's port.
    #[serde(default)]
    pub bytes_in: u64,
    /// Bytes written to visitors' connections to the app's port.
    #[serde(default)]
    pub bytes_out: u64,
}

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

/// An app's `state.json`: what happened, never what should happen.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AppState {
    /// The app's name when this was written.
    pub app: String,
    /// Raised by `restart`; copies started before it are outdated.
    pub revision: u64,
    /// The number the next new copy gets; copy numbers are never reused.
    pub next_copy: u32,
    /// Set by `restart --now` (or `apply --now`): outdated and removed copies
    /// stop as soon as the new ones are ready, without draining.
    #[serde(default)]
    pub stop_now: bool,
    /// Unix ms when the app was put to sleep (idle-timeout); none while it
    /// is awake. Asleep, its copies keep their numbers, ports and disks.
    #[serde(default)]
    pub asleep_since_ms: Option<u64>,
    /// Unix ms when the app was last seen coming up: deployed, woken, or a
    /// copy on its first start (not crash-looping). The earliest it can fall
    /// asleep is idle-timeout after this. None while asleep.
    #[serde(default)]
    pub awake_since_ms: Option<u64>,
    /// Every copy the daemon knows of, running or not.
    pub copies: Vec<CopyRecord>,
    /// The releases kept on disk, oldest first: the current one, the one
    /// before it, and any other a copy still runs.
    #[serde(default)]
    pub releases: Vec<Release>,
    /// The id of the release new copies run; none for an app deployed
    /// before releases existed (its copies run working-dir).
    #[serde(default)]
    pub release: Option<String>,
    /// The id of the release deployed before the current one: what
    /// `rollback` goes back to.
    #[serde(default)]
    pub previous_release: Option<String>,
    /// The current release came from `rollback`, so the manifest differs
    /// from what runs; cleared by the next apply or restart.
    #[serde(default)]
    pub rolled_back: bool,
    /// Unix ms when `shinyctl stop` stopped the app: it runs no copy and
    /// its port answers that it is stopped, until `shinyctl start`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_since_ms: Option<u64>,
    /// The app's own uid (and gid) on the machine, which its copies run as
    /// under a root daemon without `run-as` (README, "Identities"); given at
    /// its first copy's start, kept for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// The active copies wanted now, between `replicas` and `max-replicas`
    /// (README, "Capacity"); none: `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_wanted: Option<u32>,
    /// Unix ms when the app last grew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grew_at_ms: Option<u64>,
    /// Unix ms when the app last shrank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shrank_at_ms: Option<u64>,
    /// Unix ms since when the open sessions would stay below `scale-at`
    /// with one active copy fewer; none while they would not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_since_ms: Option<u64>,
    /// Why the app does not grow although its load asks for it: the memory
    /// bound (a line under status); none otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by_memory: Option<String>,
    /// How many times the app grew (metrics).
    #[serde(default)]
    pub grows: u64,
    /// How many times the app shrank, a sleep's included (metrics).
    #[serde(default)]
    pub shrinks: u64,
}

/// A release: a snapshot of working-dir taken by a deploy, which its copies
/// run from (read-only), with the settings it was deployed with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Release {
    /// Its id, time-sortable (`YYYYMMDDTHHMMSS-xxxx`, UTC), not the revision.
    pub id: String,
    /// Its folder, `$SHINYCTL_HOME/releases/<app-group>/<app-name>/<id>`.
    pub dir: std::path::PathBuf,
    /// Unix ms when it was taken.
    pub taken_ms: u64,
    /// The size of its files, in bytes.
    pub bytes: u64,
    /// How many files and symlinks it holds.
    pub files: u64,
    /// How long taking it took, in ms.
    pub took_ms: u64,
    /// The start spec it was deployed with: what `rollback` redeploys it with.
    pub deployed: crate::manifest::StartSpec,
    /// Every copy that has run it: their logs go when it is deleted and
    /// they no longer exist.
    #[serde(default)]
    pub copies: Vec<u32>,
    /// Whether a copy of it has been ready (served): `Some(false)` until
    /// then; none for a release recorded before this was kept (taken to
    /// have served). One that never served is no rollback target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served: Option<bool>,
}

/// How a `left_down` reason begins when `sandbox.mode: strict` refused the
/// copy (status shows such a copy as `refused`).
pub const REFUSED: &str = "refused: ";

/// The `left_down` reason of a copy refused for `why`.
pub fn refused(why: &str) -> String {
    format!("{REFUSED}{why}")
}

/// One copy's identity and history.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CopyRecord {
    /// The copy number, from 1.
    pub copy: u32,
    /// Its process, while it has one.
    pub pid: Option<u32>,
    /// The process's start time in clock ticks since boot (field 22 of
    /// `/proc/<pid>/stat`), so a reused PID is never taken for the copy.
    pub pid_start: Option<u64>,
    /// Its port on 127.0.0.1 (kept while it is down, so it comes back there).
    pub port: u16,
    /// The revision it runs.
    pub revision: u64,
    /// The hash of the settings it was started with.
    pub settings: String,
    /// Unix ms when its current process started.
    pub started_ms: Option<u64>,
    /// Crashes since it last stayed up for a minute.
    pub crashes: u32,
    /// How its last process ended.
    pub last_exit: Option<Exit>,
    /// Unix ms when it began to drain.
    pub drain_started_ms: Option<u64>,
    /// Unix ms when it was told to stop; it is forgotten once its process is gone.
    pub stop_started_ms: Option<u64>,
    /// Why it is left down on purpose (restart-policy, or `mode: strict`'s
    /// refusal: see [`refused`]), shown under status.
    pub left_down: Option<String>,
    /// The id of the release it runs; none for a copy started before
    /// releases existed (it runs working-dir).
    #[serde(default)]
    pub release: Option<String>,
    /// The port it is moving away from: another program listens there, so
    /// its process is stopped and started again on another port (not a
    /// crash). None otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving_from: Option<u16>,
    /// It drains because of `--now` (or `delete --now`): it stops once no
    /// request is in flight to it, not when its sessions end. Kept on the
    /// copy, so a later apply or restart without `--now` does not slow its
    /// stop down again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hurried: bool,
    /// It checks a version deployed while the app slept: one copy starts,
    /// and only once it has been ready does the app give up the sleeping
    /// copies of the version before (a broken version never takes over,
    /// asleep or awake). Cleared once it has been ready.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checking: bool,
    /// It was told to stop for not being ready within `start-timeout` (that
    /// many ms): its end is a crash, said so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timed_out: Option<u64>,
    /// Its current process has been ready once. Only a process that never
    /// was is held to `start-timeout`: one that lost its readiness later,
    /// or one a restarted daemon adopts before its probe answers, is not.
    /// A record from before this was kept reads as ready once.
    #[serde(default = "ready_once_by_default")]
    pub ever_ready: bool,
}

/// For a copy recorded before `CopyRecord::ever_ready` was kept.
fn ready_once_by_default() -> bool {
    true
}

/// How a process ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    /// Unix ms when the exit was seen.
    pub at_ms: u64,
    /// The exit status, when the process exited.
    pub code: Option<i32>,
    /// The signal that ended it, when it was killed.
    pub signal: Option<i32>,
    /// It was stopped for going over its memory limit (by the kernel in
    /// its cgroup, or by the daemon's watch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStop>,
    /// It was stopped because it was not ready within `start-timeout`
    /// (that many ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timeout_ms: Option<u64>,
    /// It was stopped by the daemon's watch for writing more than its disk
    /// holds (`sandbox.disk`, where the kernel does not keep it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskStop>,
}

/// A copy stopped for its disk: what its scratch, /tmp and /dev/shm held
/// together and `sandbox.disk`, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskStop {
    /// What the three folders held when it was stopped.
    pub used: u64,
    /// `sandbox.disk`.
    pub limit: u64,
}

impl DiskStop {
    /// "its disk held 70M of its 64M (sandbox.disk)".
    pub fn describe(&self) -> String {
        let show = |b| crate::sys::fmt::size(b, crate::sys::fmt::SizeStyle::Manifest);
        format!("its disk (scratch, /tmp, /dev/shm) held {} of its {} (sandbox.disk)", show(self.used), show(self.limit))
    }
}

/// A copy stopped for its memory: what it used and its limit, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStop {
    /// Its memory when it was stopped: the resident memory of its process
    /// tree (the daemon's watch) or its cgroup's peak (the kernel's limit).
    pub used: u64,
    /// `sandbox.memory`.
    pub limit: u64,
}

impl Exit {
    /// True for a clean exit with status 0. An exit whose status is unknown
    /// (an adopted process), or a copy stopped for its memory, counts as a
    /// failure.
    pub fn success(&self) -> bool {
        self.code == Some(0) && self.signal.is_none() && self.memory.is_none() && self.start_timeout_ms.is_none() && self.disk.is_none()
    }

    /// "exited with status 1", "was killed by signal 9", …
    pub fn describe(&self) -> String {
        if let Some(m) = self.memory {
            return format!("was stopped: {}", m.describe());
        }
        if let Some(d) = self.disk {
            return format!("was stopped: {}", d.describe());
        }
        if let Some(limit) = self.start_timeout_ms {
            return format!(
                "was stopped: not ready within start-timeout {}",
                crate::sys::fmt::duration(std::time::Duration::from_millis(limit), crate::sys::fmt::DurationStyle::Span)
            );
        }
        match (self.code, self.signal) {
            (_, Some(sig)) => format!("was killed by signal {sig}"),
            (Some(code), None) => format!("exited with status {code}"),
            (None, None) => "exited".to_string(),
        }
    }
}

impl MemoryStop {
    /// "2.1G, over its memory limit of 2G".
    pub fn describe(&self) -> String {
        use crate::sys::fmt::{size, SizeStyle::Manifest};
        format!("{}, over its memory limit of {}", size(self.used, Manifest), size(self.limit, Manifest))
    }
}

// ---------------------------------------------------------------------------
// The API: command ↔ daemon
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
}

impl ApplyRequest {
    /// The most bytes the API takes in an apply request's JSON body: room
    /// for a manifest with a large `env`, and a bound on what one request
    /// makes the daemon hold.
    pub const MAX_BODY: usize = 1 << 20;

    /// Refuses a request whose body, `body_len` bytes of JSON, is over
    /// [`Self::MAX_BODY`], naming the manifest and the limit.
    pub fn check_size(&self, body_len: usize) -> Result<(), String> {
        if body_len <= Self::MAX_BODY {
            return Ok(());
        }
        let show = |n: usize| crate::sys::fmt::size(n as u64, crate::sys::fmt::SizeStyle::Manifest);
        Err(format!(
            "{}: the manifest is too large to apply: {} ({} as the API's request), and the API takes at most {} ({} bytes). \
             A manifest holds settings; keep data in the app's folder.",
            self.path,
            show(self.text.len()),
            show(body_len),
            show(Self::MAX_BODY),
            Self::MAX_BODY
        ))
    }
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
