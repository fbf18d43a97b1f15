//! What the load balancer reports about itself and its traffic, one type
//! for both routes of `proxy/proxy.sock` that give it: `GET /stats` (read by
//! the daemon every cycle: what is open on each copy, what is leaving) and
//! `GET /metrics` (the same, with the requests answered per app, for the
//! daemon's Prometheus series). A load balancer of an earlier build answers
//! each route with the fields it had then; the fields the other route had
//! default, so a new daemon reads both.

use serde::{Deserialize, Serialize};

use super::table::ProxySettings;

/// What the load balancer reports about itself: `GET /stats` and `GET
/// /metrics` on `proxy/proxy.sock` both answer it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProxyStats {
    /// The load balancer's build ([`super::BUILD`]). Empty from the
    /// `/metrics` of a load balancer of an earlier build.
    #[serde(default)]
    pub build: String,
    /// Its process ID.
    pub pid: u32,
    /// Its resident memory, in bytes.
    pub rss_bytes: u64,
    /// Open connections and sessions per app and copy: one entry per app in
    /// its table. (`traffic` in the `/metrics` of an earlier build.)
    #[serde(alias = "traffic")]
    pub apps: Vec<AppTraffic>,
    /// Its fixed settings (the daemon writes them to proxy/settings.json).
    #[serde(default)]
    pub settings: ProxySettings,
    /// Visitors' connections it serves now: HTTP ones and WebSocket tunnels.
    #[serde(default)]
    pub open_connections: u64,
    /// Requests answered per app since it started.
    #[serde(default)]
    pub requests: Vec<AppRequests>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answers_of_an_earlier_load_balancer_are_read() {
        // `GET /metrics` and `GET /stats` as the build before one type answered them.
        let metrics = r#"{"pid":7,"rss_bytes":9,"open_connections":3,"traffic":[{"name":"a","last_request_ms":1,"copies":[]}],
            "requests":[{"name":"a","classes":[0,2,0,0,0],"latency_counts":[],"latency_sum":0.5}]}"#;
        let m: ProxyStats = serde_json::from_str(metrics).expect("an earlier /metrics reads");
        assert_eq!((m.pid, m.open_connections, m.apps[0].name.as_str(), m.requests[0].classes[1]), (7, 3, "a", 2));
        assert_eq!(m.build, "", "/metrics named no build");
        let stats = r#"{"build":"0.9+x","pid":7,"rss_bytes":9,"apps":[{"name":"a","last_request_ms":1,"copies":[]}]}"#;
        let s: ProxyStats = serde_json::from_str(stats).expect("an earlier /stats reads");
        assert_eq!((s.build.as_str(), s.apps.len(), s.requests.len()), ("0.9+x", 1, 0));
    }
}
