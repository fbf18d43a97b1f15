//! The route spec: what the load balancer reads of an app, as one value. It
//! travels in the copies table (each [`crate::wire::ProxyApp`] flattens it,
//! so the table keeps its keys); changing any of it restarts no copy.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

use super::{Cidr, LbPolicy, DEFAULT_MAX_CONNECTIONS};

/// How visitors reach the app's copies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteSpec {
    /// `host`, default `0.0.0.0`: the load balancer's listen address.
    pub host: IpAddr,
    /// `port`: the load balancer listens here; the sticky cookie is
    /// `lb_<port>`.
    pub port: u16,
    /// `lb-policy`, default least-conn: how new visitors are spread over the
    /// active copies. `policy` in the files and the table (`lb_policy` in a
    /// registry.json written before the split).
    #[serde(rename = "policy", alias = "lb_policy")]
    pub lb_policy: LbPolicy,
    /// `request-timeout` in ms, default 30s, at most 30s: how long a request
    /// may be held while no copy can take it.
    pub request_timeout_ms: u64,
    /// `max-connections`, default [`DEFAULT_MAX_CONNECTIONS`]: the most
    /// visitors' connections the load balancer keeps open for the app at
    /// once; past it a visitor gets a 503 with Retry-After.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// `trusted-proxies`, default none: the addresses and ranges of proxies
    /// in front, whose `X-Forwarded-For` is appended to and
    /// `X-Forwarded-Proto` kept, and whose connections no per-address cap
    /// limits. Written as [`Cidr`] prints them.
    #[serde(default)]
    pub trusted_proxies: Vec<Cidr>,
}

/// For an app recorded (or a table sent) before `max-connections` existed.
fn default_max_connections() -> u32 {
    DEFAULT_MAX_CONNECTIONS
}
