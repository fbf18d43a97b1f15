//! What the load balancer counts for metrics: answers per app by status
//! class (and 502, 503, 504 apart), a histogram of the time until an
//! answer's head, WebSocket sessions opened, and the bytes visitors sent
//! and got (counted on their sockets, see `visitors/counted.rs`). The daemon
//! reads them with `GET /metrics` on `proxy.sock` and turns them into
//! Prometheus series; the counts start at zero with each load balancer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hyper::StatusCode;

use crate::proxy::workers::{worker_index, WORKERS};
use crate::wire::{AppRequests, LATENCY_BOUNDS};

/// One app's counters; atomics, so a request counts without a lock, one
/// set per worker ([`Shard`]), summed when read.
#[derive(Default)]
pub struct AppCounters {
    /// Per worker: each counts on its own cache lines, as both count every
    /// request (a line both write moves between the cores each time).
    shards: [Shard; WORKERS],
}

/// The counts one worker made (a thread that is no worker counts in the
/// first). Aligned so two never share a cache line.
#[derive(Default)]
#[repr(align(128))]
struct Shard {
    /// Answers by status class (1xx … 5xx).
    classes: [AtomicU64; 5],
    /// Answers 502, 503 and 504 (also counted in 5xx).
    gateway: [AtomicU64; 3],
    /// WebSocket sessions opened.
    sessions_opened: AtomicU64,
    /// Bytes read from visitors' connections.
    bytes_in: AtomicU64,
    /// Bytes written to visitors' connections.
    bytes_out: AtomicU64,
    /// Answers per latency bucket ([`LATENCY_BOUNDS`], then the rest).
    buckets: [AtomicU64; LATENCY_BOUNDS.len() + 1],
    /// The sum of the latencies, in microseconds.
    sum_us: AtomicU64,
}

impl AppCounters {
    /// The running worker's counts.
    fn mine(&self) -> &Shard {
        &self.shards[worker_index() % WORKERS]
    }

    /// One counter summed over the workers.
    fn sum(&self, counter: impl Fn(&Shard) -> &AtomicU64) -> u64 {
        self.shards.iter().map(|s| counter(s).load(Ordering::Relaxed)).sum()
    }

    /// Counts one answer with `status`, `took` after the request came.
    pub fn count(&self, status: StatusCode, took: Duration) {
        let shard = self.mine();
        let class = (status.as_u16() / 100).clamp(1, 5) as usize - 1;
        shard.classes[class].fetch_add(1, Ordering::Relaxed);
        if let Some(i) = [502, 503, 504].iter().position(|c| *c == status.as_u16()) {
            shard.gateway[i].fetch_add(1, Ordering::Relaxed);
        }
        let secs = took.as_secs_f64();
        let bucket = LATENCY_BOUNDS.iter().position(|b| secs <= *b).unwrap_or(LATENCY_BOUNDS.len());
        shard.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        shard.sum_us.fetch_add(took.as_micros().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// Counts `n` bytes read from a visitor, or written to one when `written`.
    pub fn add_bytes(&self, written: bool, n: u64) {
        let shard = self.mine();
        (if written { &shard.bytes_out } else { &shard.bytes_in }).fetch_add(n, Ordering::Relaxed);
    }

    /// Bytes read from visitors and written to them so far.
    pub fn bytes(&self) -> (u64, u64) {
        (self.sum(|s| &s.bytes_in), self.sum(|s| &s.bytes_out))
    }

    /// Counts a WebSocket session opened.
    fn session_opened(&self) {
        self.mine().sessions_opened.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far, as the daemon reads them.
    fn report(&self, name: &str) -> AppRequests {
        let (bytes_in, bytes_out) = self.bytes();
        AppRequests {
            name: name.to_string(),
            classes: std::array::from_fn(|i| self.sum(|s| &s.classes[i])),
            latency_counts: (0..=LATENCY_BOUNDS.len()).map(|i| self.sum(|s| &s.buckets[i])).collect(),
            latency_sum: self.sum(|s| &s.sum_us) as f64 / 1e6,
            gateway: std::array::from_fn(|i| self.sum(|s| &s.gateway[i])),
            sessions_opened: self.sum(|s| &s.sessions_opened),
            bytes_in,
            bytes_out,
        }
    }
}

/// Request counters per app name, kept across table pushes (an app keeps
/// its counts when its copies or its port change).
#[derive(Default)]
pub struct Requests {
    /// By app name; written only the first time an app answers.
    apps: RwLock<HashMap<String, Arc<AppCounters>>>,
}

impl Requests {
    /// The counters of `app`, made the first time it is asked for.
    pub fn of(&self, app: &str) -> Arc<AppCounters> {
        let counters = self.apps.read().unwrap_or_else(|e| e.into_inner()).get(app).cloned();
        match counters {
            Some(c) => c,
            None => self.apps.write().unwrap_or_else(|e| e.into_inner()).entry(app.to_string()).or_default().clone(),
        }
    }

    /// Counts a WebSocket session of `app` opened.
    pub fn session_opened(&self, app: &str) {
        self.of(app).session_opened();
    }

    /// Counts one answer of `app` with `status`, `took` after the request came.
    #[cfg(test)]
    pub fn count(&self, app: &str, status: StatusCode, took: Duration) {
        self.of(app).count(status, took);
    }

    /// The counts of the apps in `keep` (others are forgotten: deleted apps
    /// leave no series behind).
    pub fn report(&self, keep: &[String]) -> Vec<AppRequests> {
        let mut apps = self.apps.write().unwrap_or_else(|e| e.into_inner());
        apps.retain(|name, _| keep.contains(name));
        let mut out: Vec<AppRequests> = apps.iter().map(|(name, c)| c.report(name)).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_count_by_class_and_latency_bucket_and_deleted_apps_go() {
        let r = Requests::default();
        r.count("a", StatusCode::OK, Duration::from_millis(3));
        r.count("a", StatusCode::NOT_FOUND, Duration::from_millis(30));
        r.count("a", StatusCode::BAD_GATEWAY, Duration::from_secs(60));
        r.count("b", StatusCode::SWITCHING_PROTOCOLS, Duration::from_millis(7));
        r.count("a", StatusCode::GATEWAY_TIMEOUT, Duration::from_millis(7));
        r.count("a", StatusCode::INTERNAL_SERVER_ERROR, Duration::from_millis(7));
        r.session_opened("b");
        r.of("b").add_bytes(false, 10);
        let all = r.report(&["a".into(), "b".into()]);
        assert_eq!(all[0].name, "a");
        assert_eq!(all[0].classes, [0, 1, 0, 1, 3]);
        assert_eq!(all[0].gateway, [1, 0, 1], "502 and 504 apart; a 500 is none of them");
        assert_eq!((all[1].sessions_opened, all[1].bytes_in, all[1].bytes_out), (1, 10, 0));
        assert_eq!(all[0].latency_counts[0], 1, "3 ms is in the 5 ms bucket");
        assert_eq!(all[0].latency_counts[3], 1, "30 ms is in the 50 ms bucket");
        assert_eq!(all[0].latency_counts[LATENCY_BOUNDS.len()], 1, "60 s is above every bound");
        assert!((all[0].latency_sum - 60.047).abs() < 1e-6);
        assert_eq!(all[1].classes, [1, 0, 0, 0, 0]);
        let kept = r.report(&["b".into()]);
        assert_eq!(kept.len(), 1, "an app no longer in the table leaves no series");
        assert_eq!(kept[0].name, "b");
    }
}
