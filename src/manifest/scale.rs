//! The scale spec: how many copies an app runs and how they come and go,
//! as one value. The cycle's `reconcile::decide` reads it (the table carries
//! `max-sessions` and the most active copies too); changing any of it
//! restarts no copy.

use serde::{Deserialize, Serialize};

use super::RestartPolicy;
#[cfg(doc)]
use super::{DEFAULT_SCALE_AT, DEFAULT_SCALE_DOWN_AFTER_MS, DEFAULT_START_TIMEOUT_MS};

/// How many copies run, the spares, drains, sleep, restarts and growth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleSpec {
    /// `replicas`, default 1, at least 1.
    pub replicas: u32,
    /// `warm-replicas`, default 1.
    pub warm_replicas: u32,
    /// `drain-timeout` in ms, default 15m.
    pub drain_timeout_ms: u64,
    /// `restart-policy`, default always.
    pub restart_policy: RestartPolicy,
    /// `idle-timeout` in ms, default 300s; 0 never sleeps.
    pub idle_timeout_ms: u64,
    /// `start-timeout` in ms, default [`DEFAULT_START_TIMEOUT_MS`]: a copy
    /// not ready by then is stopped and counted as a crash (Shiny Server's
    /// `app_init_timeout`). Changing it restarts no copy.
    #[serde(default = "super::default_start_timeout")]
    pub start_timeout_ms: u64,
    /// `max-sessions`: the Shiny sessions (open WebSockets) a copy takes
    /// before it counts as full; none: no limit, and the app never grows.
    /// Like every capacity key, read by the cycle and the table: changing it
    /// restarts no copy.
    #[serde(default)]
    pub max_sessions: Option<u32>,
    /// `max-replicas`: the most active copies the app may grow to; as
    /// written, the manifest's `replicas` when not given. 0 (an app recorded
    /// before it existed) reads as `replicas`: see [`ScaleSpec::max_active`].
    #[serde(default)]
    pub max_replicas: u32,
    /// `scale-at`, default [`DEFAULT_SCALE_AT`]: the share of the active
    /// copies' capacity their open sessions reach when the app grows.
    #[serde(default = "super::default_scale_at")]
    pub scale_at: f64,
    /// `scale-down-after` in ms, default [`DEFAULT_SCALE_DOWN_AFTER_MS`]:
    /// how long the load must stay low before a grown copy leaves.
    #[serde(default = "super::default_scale_down_after")]
    pub scale_down_after_ms: u64,
}

impl ScaleSpec {
    /// The most active copies: `max-replicas`, never fewer than `replicas`
    /// (an app recorded before `max-replicas`, or scaled past it, does not
    /// shrink below what it is told).
    pub fn max_active(&self) -> u32 {
        self.max_replicas.max(self.replicas)
    }
}
