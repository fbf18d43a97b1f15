//! What every connection of the load balancer shares: the table, the
//! settings visitors' connections are served with, the stop signal, the
//! worker threads that serve them; and which side an error came from.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use super::workers::Worker;
use crate::proxy::copies::table;
use crate::proxy::daemon_link::DaemonLink;
use crate::proxy::tunnels::pump::Pump;
use crate::proxy::visitors::caps::CapCounters;

/// What every connection of the load balancer shares.
pub struct BalancerState {
    /// Where stand-ins are reported and wakes asked for.
    pub daemon: DaemonLink,
    /// The sticky cookie's HMAC key.
    pub key: [u8; crate::wire::lb_start::COOKIE_KEY_LEN],
    /// The live copies table.
    pub table: table::LiveTable,
    /// How visitors' connections are served (timeouts, limits).
    pub http: hyper::server::conn::http1::Builder,
    /// Turns true once the load balancer stops.
    pub shutdown: watch::Sender<bool>,
    /// The same, read on every answer (cheaper than the channel): answers
    /// then carry `Connection: close`.
    pub stopping: AtomicBool,
    /// The threads that serve visitors' connections.
    pub workers: Vec<Worker>,
    /// The open WebSocket tunnels.
    pub pump: Arc<Pump>,
    /// Answers counted per app, for metrics.
    pub requests: crate::proxy::counters::Requests,
    /// Visitors' connections counted under the caps that span apps.
    pub gate: CapCounters,
}

impl BalancerState {
    /// Visitors' connections being served, on all workers.
    pub fn open(&self) -> usize {
        self.workers.iter().map(|w| w.open.load(Ordering::Relaxed)).sum()
    }
}
