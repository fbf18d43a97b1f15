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

use crate::wire::{AppRequests, LATENCY_BOUNDS};

/// One app's counters; atomics, so a request counts without a lock.
#[derive(Default)]
pub struct AppCounters {
    /// Answers by status class (1xx … 5xx).
    classes: [AtomicU64; 5],
    /// Answers 502, 503 and 504 (also counted in 5xx).
    gateway: [AtomicU64; 3],
    /// WebSocket sessions opened.
    sessions_opened: AtomicU64,
    /// Bytes read from visitors' connections.
    pub bytes_in: AtomicU64,
    /// Bytes written to visitors' connections.
    pub bytes_out: AtomicU64,
    /// Answers per latency bucket ([`LATENCY_BOUNDS`], then the rest).
    buckets: [AtomicU64; LATENCY_BOUNDS.len() + 1],
    /// The sum of the latencies, in microseconds.
    sum_us: AtomicU64,
}

impl AppCounters {
    /// Counts one answer with `status`, `took` after the request came.
    pub fn count(&self, status: StatusCode, took: Duration) {
        let class = (status.as_u16() / 100).clamp(1, 5) as usize - 1;
        self.classes[class].fetch_add(1, Ordering::Relaxed);
        if let Some(i) = [502, 503, 504].iter().position(|c| *c == status.as_u16()) {
            self.gateway[i].fetch_add(1, Ordering::Relaxed);
        }
        let secs = took.as_secs_f64();
        let bucket = LATENCY_BOUNDS.iter().position(|b| secs <= *b).unwrap_or(LATENCY_BOUNDS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(took.as_micros().min(u64::MAX as u128) as u64, Ordering::Relaxed);
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
        self.of(app).sessions_opened.fetch_add(1, Ordering::Relaxed);
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
        let mut out: Vec<AppRequests> = apps
            .iter()
            .map(|(name, c)| AppRequests {
                name: name.clone(),
                classes: std::array::from_fn(|i| c.classes[i].load(Ordering::Relaxed)),
                latency_counts: c.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect(),
                latency_sum: c.sum_us.load(Ordering::Relaxed) as f64 / 1e6,
                gateway: std::array::from_fn(|i| c.gateway[i].load(Ordering::Relaxed)),
                sessions_opened: c.sessions_opened.load(Ordering::Relaxed),
                bytes_in: c.bytes_in.load(Ordering::Relaxed),
                bytes_out: c.bytes_out.load(Ordering::Relaxed),
            })
            .collect();
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
        r.of("b").bytes_in.fetch_add(10, Ordering::Relaxed);
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
