//! The copies table the daemon pushes to the load balancer (`PUT /table`
//! on `proxy/proxy.sock`, and `proxy/table.json` for a load balancer that
//! starts), and the load balancer's own settings (`proxy/settings.json`).

use serde::{Deserialize, Serialize};

/// The policy the copies table carries ([`ProxyApp::policy`]); the manifest
/// owns it, as it is a manifest value first.
pub use crate::manifest::LbPolicy;

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
    /// Every copy is left down (its restart-policy started it no more, or
    /// the fence refused it), and nothing will start one until an operator
    /// does: a request gets the page that says so (503) at once, not the
    /// hold for a copy that comes back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub down: bool,
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
            down: false,
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
    /// Its R process as the host sees it (the launcher's child, or a fork
    /// from the pool), once known: the load balancer watches its threads,
    /// whose end tells R's before its sockets close (README, "Staying
    /// up"). None from a daemon of an earlier build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r_pid: Option<u32>,
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
