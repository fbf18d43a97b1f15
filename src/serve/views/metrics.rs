//! `GET /v1/metrics` (Prometheus text: OpenMetrics, or the classic 0.0.4
//! format for a scraper whose `Accept` header prefers it, `exposition.rs`) and
//! `GET /v1/health`, on `api.sock` and, when the daemon's environment has
//! `SHINYCTL_METRICS=ADDR:PORT`, on that TCP address too (those two routes
//! only). The registry is built afresh for each scrape from the daemon's
//! state, its tallies and the load balancer's figures, so the series of a
//! copy that is gone go with it.
//!
//! The lock is held only to copy the state out; the load balancer is asked
//! after it is let go.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, StatusCode};
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use serde::Serialize;

use crate::home::Home;
use crate::wire::uds;
use crate::wire::{AppStatus, ProxyStats, LATENCY_BOUNDS};

use crate::serve::copies::tallies::{RestartReason, Tallies, WAKE_BOUNDS};
use crate::serve::now_ms;
use crate::serve::reply::{error, Reply};
use crate::serve::views::exposition::{self, Format};
use crate::serve::Shared;

/// The environment variable that names the metrics' TCP address.
pub const METRICS_ENV: &str = "SHINYCTL_METRICS";
/// How long a scrape waits for the load balancer.
const PROXY_TIMEOUT: Duration = Duration::from_millis(800);

/// Labels of one series.
type Labels = Vec<(&'static str, String)>;

/// One series' value.
#[derive(Debug, Clone)]
enum Value {
    /// A gauge.
    Gauge(f64),
    /// A counter.
    Counter(u64),
    /// A counter of a measure with a fraction (CPU seconds).
    RealCounter(f64),
    /// A histogram: per-bucket counts (not cumulative) by bound, and the sum.
    Histogram { buckets: Vec<(f64, u64)>, sum: f64 },
}

/// One metric family of one scrape: its type and its series.
#[derive(Debug)]
struct MetricFamily {
    /// Gauge, counter or histogram.
    kind: MetricType,
    /// Each series: its labels and value.
    rows: Vec<(Labels, Value)>,
}

impl EncodeMetric for MetricFamily {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, value) in &self.rows {
            let mut e = encoder.encode_family(labels)?;
            match value {
                // Whole numbers (bytes, counts) written as such.
                Value::Gauge(v) if v.fract() == 0.0 && v.abs() < 9e15 => e.encode_gauge(&(*v as i64))?,
                Value::Gauge(v) => e.encode_gauge(v)?,
                Value::Counter(v) => e.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(v, None)?,
                Value::RealCounter(v) => e.encode_counter::<prometheus_client::encoding::NoLabelSet, _, f64>(v, None)?,
                Value::Histogram { buckets, sum } => {
                    let count = buckets.iter().map(|(_, n)| n).sum();
                    e.encode_histogram::<prometheus_client::encoding::NoLabelSet>(*sum, count, buckets, None)?
                }
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        self.kind
    }
}

/// What a scrape copies out of the daemon under its lock.
pub struct View {
    /// Every app as status shows it.
    pub apps: Vec<AppStatus>,
    /// Seconds each app has been asleep (0 when awake), by the order of `apps`.
    pub asleep_secs: Vec<f64>,
    /// Restarts and wakes.
    pub tallies: Tallies,
    /// The home folder (for the load balancer's socket).
    pub home: Home,
}

/// Copies what a scrape needs out of the daemon, under its lock (what
/// /proc says of the copies is looked up before, with it released).
async fn view(shared: &Shared) -> View {
    let shown = crate::serve::views::status_view::look_up(shared, None).await;
    let d = shared.lock();
    let apps = crate::serve::views::status_view::report(&d, None, &shown).map(|r| r.apps).unwrap_or_default();
    let now = now_ms();
    let asleep_secs = apps
        .iter()
        .map(|a| {
            let since = d.apps.get(&a.name).and_then(|rt| rt.recorded.state.asleep_since_ms);
            since.map_or(0.0, |s| now.saturating_sub(s) as f64 / 1000.0)
        })
        .collect();
    View { apps, asleep_secs, tallies: d.tallies.clone(), home: d.home.clone() }
}

/// Asks the load balancer for its figures; `None` when it does not answer.
pub async fn proxy_metrics(home: &Home) -> Option<ProxyStats> {
    let (status, body) = uds::request(&home.proxy_sock(), Method::GET, "/metrics", None, PROXY_TIMEOUT).await.ok()?;
    status.is_success().then(|| serde_json::from_slice(&body).ok()).flatten()
}

/// `GET /v1/metrics`, in the format the request's `Accept` header asks for
/// (see `exposition.rs`).
pub async fn metrics(shared: &Shared, accept: Option<&str>) -> Reply {
    let view = view(shared).await;
    let proxy = proxy_metrics(&view.home).await;
    let format = exposition::negotiate(accept);
    let rendered = render(&view, proxy.as_ref()).map(|t| if format == Format::Classic { exposition::to_classic(&t) } else { t });
    match rendered {
        Ok(text) => hyper::Response::builder()
            .status(StatusCode::OK)
            .header("content-type", format.content_type())
            .body(Full::new(Bytes::from(text)))
            .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new()))),
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "cannot write the metrics"),
    }
}

/// The `Accept` header of a request, when it is text.
pub fn accept<B>(req: &Request<B>) -> Option<&str> {
    req.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok())
}

/// What `GET /v1/health` answers.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Health {
    /// `up` when the daemon and the load balancer both answer, else `down`.
    pub status: String,
    /// The daemon answers (it wrote this).
    pub daemon: bool,
    /// The load balancer answers on its socket.
    pub load_balancer: bool,
    /// The daemon's process ID.
    pub daemon_pid: u32,
    /// The load balancer's process ID, when it answers.
    pub load_balancer_pid: Option<u32>,
}

/// `GET /v1/health`: 200 when the daemon and the load balancer are up, 503
/// when the load balancer does not answer.
pub async fn health(shared: &Shared) -> Reply {
    let home = shared.lock().home.clone();
    let proxy = proxy_metrics(&home).await;
    let up = proxy.is_some();
    let health = Health {
        status: if up { "up" } else { "down" }.into(),
        daemon: true,
        load_balancer: up,
        daemon_pid: std::process::id(),
        load_balancer_pid: proxy.map(|p| p.pid),
    };
    uds::json_response(if up { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, &health)
}

/// Adds one family to the registry.
fn add(reg: &mut Registry, name: &str, help: &str, unit: Option<Unit>, kind: MetricType, rows: Vec<(Labels, Value)>) {
    let metric = MetricFamily { kind, rows };
    match unit {
        Some(unit) => reg.register_with_unit(name, help, unit, metric),
        None => reg.register(name, help, metric),
    }
}

/// Per-bucket counts paired with their bounds, the last one infinite.
fn buckets(bounds: &[f64], counts: &[u64]) -> Vec<(f64, u64)> {
    bounds.iter().copied().chain(std::iter::once(f64::INFINITY)).zip(counts.iter().copied()).collect()
}

/// The whole scrape, as Prometheus text.
pub fn render(view: &View, proxy: Option<&ProxyStats>) -> Result<String, std::fmt::Error> {
    let mut reg = Registry::with_prefix("shinyctl");
    add_copies(&mut reg, view, proxy);
    add_apps(&mut reg, view, proxy);
    add_capacity(&mut reg, view);
    let lb = |f: fn(&ProxyStats) -> f64| proxy.map(|p| vec![(Labels::new(), Value::Gauge(f(p)))]).unwrap_or_default();
    add(
        &mut reg,
        "load_balancer_up",
        "1 when the load balancer answers",
        None,
        MetricType::Gauge,
        vec![(Labels::new(), Value::Gauge(if proxy.is_some() { 1.0 } else { 0.0 }))],
    );
    add(
        &mut reg,
        "load_balancer_resident_memory",
        "The load balancer's resident memory",
        Some(Unit::Bytes),
        MetricType::Gauge,
        lb(|p| p.rss_bytes as f64),
    );
    add(
        &mut reg,
        "load_balancer_open_connections",
        "Visitors' connections the load balancer serves now",
        None,
        MetricType::Gauge,
        lb(|p| p.open_connections as f64),
    );
    add(
        &mut reg,
        "load_balancer_restarts",
        "Times the load balancer exited and the daemon started it again",
        None,
        MetricType::Counter,
        vec![(Labels::new(), Value::Counter(view.tallies.load_balancer_restarts))],
    );
    add_pool(&mut reg, &crate::serve::copies::zygote_pool::report());
    add(
        &mut reg,
        "build_info",
        "1, with this daemon's version and build as labels",
        None,
        MetricType::Gauge,
        vec![(vec![("version", env!("CARGO_PKG_VERSION").to_string()), ("build", crate::wire::BUILD.to_string())], Value::Gauge(1.0))],
    );
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg)?;
    Ok(out)
}

/// The pool's series: its zygotes ready, their memory and its bound.
fn add_pool(reg: &mut Registry, pool: &crate::wire::PoolReport) {
    let ready = pool.zygotes.iter().filter(|z| z.ready).count() as f64;
    let rss = pool.zygotes.iter().map(|z| z.rss_bytes).sum::<u64>() as f64;
    let one = |v: f64| vec![(Labels::new(), Value::Gauge(v))];
    add(reg, "pool_zygotes_ready", "Zygotes of the pool that take claims now", None, MetricType::Gauge, one(ready));
    add(reg, "pool_resident_memory", "The pool's zygotes' resident memory", Some(Unit::Bytes), MetricType::Gauge, one(rss));
    let bound = pool.memory_max_bytes.map(|b| one(b as f64)).unwrap_or_default();
    add(reg, "pool_memory_limit", "The bound on a zygote's memory (its cgroup's limit)", Some(Unit::Bytes), MetricType::Gauge, bound);
}

/// The series per copy: role, state, ready, memory and its limit, CPU
/// time, crashes, start time, sessions, open connections. Sessions and
/// connections are the load balancer's figures of this moment when it
/// answers, else the daemon's last ones.
fn add_copies(reg: &mut Registry, view: &View, proxy: Option<&ProxyStats>) {
    let mut f = CopyFamilies::default();
    for a in &view.apps {
        let traffic = proxy.and_then(|p| p.apps.iter().find(|t| t.name == a.name));
        for c in &a.copies {
            let labels = || -> Labels { vec![("app", a.name.clone()), ("copy", c.copy.to_string())] };
            let with = |k: &'static str, v: &str| -> Labels { labels().into_iter().chain([(k, v.to_string())]).collect() };
            f.role.push((with("role", c.role.map_or("none", |r| r.as_str())), Value::Gauge(1.0)));
            f.state.push((with("state", &c.status), Value::Gauge(1.0)));
            f.ready.push((labels(), Value::Gauge(if c.ready { 1.0 } else { 0.0 })));
            f.crashes.push((labels(), Value::Gauge(c.crashes as f64)));
            let t = traffic.and_then(|t| t.copies.iter().find(|t| t.copy == c.copy));
            f.sessions.push((labels(), Value::Gauge(t.map_or(c.sessions, |t| t.sessions) as f64)));
            f.conns.push((labels(), Value::Gauge(t.map_or(0, |t| t.connections) as f64)));
            let some = |rows: &mut Vec<(Labels, Value)>, v: Option<Value>| rows.extend(v.map(|v| (labels(), v)));
            some(&mut f.mem, c.mem_bytes.map(|b| Value::Gauge(b as f64)));
            some(&mut f.limit, c.memory_limit_bytes.map(|b| Value::Gauge(b as f64)));
            some(&mut f.disk, c.disk_bytes.map(|b| Value::Gauge(b as f64)));
            some(&mut f.cpu, c.cpu_secs.map(Value::RealCounter));
            some(&mut f.start, c.started_ms.map(|ms| Value::Gauge(ms as f64 / 1000.0)));
        }
    }
    let (g, bytes, secs) = (MetricType::Gauge, Some(Unit::Bytes), Some(Unit::Seconds));
    add(reg, "copy_role", "1 for each copy, its role as a label (none while it starts or is down)", None, g, f.role);
    add(reg, "copy_state", "1 for each copy, its status column as a label (alive, starting, crash-looping, asleep, ...)", None, g, f.state);
    add(reg, "copy_ready", "1 when the copy is ready to take visitors", None, g, f.ready);
    add(reg, "copy_resident_memory", "Memory of the copy's process tree: proportional set size, as status's MEM", bytes.clone(), g, f.mem);
    add(reg, "copy_memory_limit", "The memory limit the copy runs under (sandbox.memory)", bytes.clone(), g, f.limit);
    add(reg, "copy_disk_size", "The size of the copy's disk: scratch, /tmp and /dev/shm together (sandbox.disk)", bytes, g, f.disk);
    add(reg, "copy_cpu", "CPU time used by the copy's process tree", secs.clone(), MetricType::Counter, f.cpu);
    add(reg, "copy_crashes", "Crashes of the copy since it last stayed up for a minute", None, g, f.crashes);
    add(reg, "copy_start_time", "When the copy's process started, in Unix time", secs, g, f.start);
    add(reg, "copy_sessions", "Open WebSocket sessions (Shiny sessions) to the copy", None, g, f.sessions);
    add(reg, "copy_open_connections", "Requests in flight plus open WebSockets to the copy", None, g, f.conns);
}

/// The series of the per-copy families of one scrape, each named for its
/// family in [`add_copies`].
#[derive(Default)]
struct CopyFamilies {
    /// `copy_role`.
    role: Vec<(Labels, Value)>,
    /// `copy_state`.
    state: Vec<(Labels, Value)>,
    /// `copy_ready`.
    ready: Vec<(Labels, Value)>,
    /// `copy_resident_memory_bytes`.
    mem: Vec<(Labels, Value)>,
    /// `copy_memory_limit_bytes`.
    limit: Vec<(Labels, Value)>,
    /// `copy_disk_size_bytes`.
    disk: Vec<(Labels, Value)>,
    /// `copy_cpu_seconds_total`.
    cpu: Vec<(Labels, Value)>,
    /// `copy_crashes`.
    crashes: Vec<(Labels, Value)>,
    /// `copy_start_time_seconds`.
    start: Vec<(Labels, Value)>,
    /// `copy_sessions`.
    sessions: Vec<(Labels, Value)>,
    /// `copy_open_connections`.
    conns: Vec<(Labels, Value)>,
}

/// The series per app: requests, latency, restarts, wakes, time asleep.
fn add_apps(reg: &mut Registry, view: &View, proxy: Option<&ProxyStats>) {
    let app = |name: &str| -> Labels { vec![("app", name.to_string())] };
    let known = |name: &str| view.apps.iter().any(|a| a.name == name);
    let requests = proxy.map(|p| p.requests.iter().filter(|r| known(&r.name)).collect::<Vec<_>>()).unwrap_or_default();
    let classes = ["1xx", "2xx", "3xx", "4xx", "5xx"];
    let by_class = requests
        .iter()
        .flat_map(|r| {
            classes.iter().zip(r.classes).map(|(c, n)| (vec![("app", r.name.clone()), ("class", c.to_string())], Value::Counter(n)))
        })
        .collect();
    add(reg, "requests", "Answers the load balancer gave, by status class", None, MetricType::Counter, by_class);
    let latency = requests
        .iter()
        .map(|r| (app(&r.name), Value::Histogram { buckets: buckets(&LATENCY_BOUNDS, &r.latency_counts), sum: r.latency_sum }))
        .collect();
    add(reg, "request_duration", "Time until the answer's head, at the load balancer", Some(Unit::Seconds), MetricType::Histogram, latency);
    add_balancer_counts(reg, &requests);
    let mut wanted = Vec::new();
    let mut state = Vec::new();
    for a in &view.apps {
        wanted.push((app(&a.name), Value::Gauge(a.replicas as f64)));
        for s in APP_STATES {
            state.push((vec![("app", a.name.clone()), ("state", s.to_string())], Value::Gauge(if a.state == s { 1.0 } else { 0.0 })));
        }
    }
    add(reg, "app_desired_replicas", "Active copies the manifest asks for (replicas)", None, MetricType::Gauge, wanted);
    add(reg, "app_state", "1 for the state the app is in, 0 for the others", None, MetricType::Gauge, state);
    let mut restarts = Vec::new();
    let mut wakes = Vec::new();
    let mut wake_failures = Vec::new();
    let mut wake_secs = Vec::new();
    let mut asleep = Vec::new();
    for (a, secs) in view.apps.iter().zip(&view.asleep_secs) {
        let counts = view.tallies.restarts.get(&a.name).copied().unwrap_or_default();
        for (reason, n) in RestartReason::ALL.iter().zip(counts) {
            restarts.push((vec![("app", a.name.clone()), ("reason", reason.as_str().to_string())], Value::Counter(n)));
        }
        let w = view.tallies.wakes.get(&a.name).cloned().unwrap_or_default();
        wakes.push((app(&a.name), Value::Counter(w.count)));
        wake_failures.push((app(&a.name), Value::Counter(w.failed)));
        wake_secs.push((app(&a.name), Value::Histogram { buckets: buckets(&WAKE_BOUNDS, &w.buckets), sum: w.sum_secs }));
        asleep.push((app(&a.name), Value::Gauge(*secs)));
    }
    add(reg, "restarts", "Copies started again, by reason", None, MetricType::Counter, restarts);
    add(reg, "wakes", "Wakes of a sleeping app begun", None, MetricType::Counter, wakes);
    add(reg, "wake_failures", "Wakes that failed: the requests held for them got a 503", None, MetricType::Counter, wake_failures);
    add(reg, "wake_duration", "From a request asking for a wake to an active copy", Some(Unit::Seconds), MetricType::Histogram, wake_secs);
    add(reg, "asleep", "How long the app has been asleep now (0 when awake)", Some(Unit::Seconds), MetricType::Gauge, asleep);
}

/// The states of an app, as `status --json` names them.
const APP_STATES: [&str; 5] = ["running", "asleep", "stopped", "rolled-back", "being-deleted"];

/// The load balancer's counts per app beside its requests by class: 502,
/// 503 and 504 apart, sessions opened, bytes in and out.
fn add_balancer_counts(reg: &mut Registry, requests: &[&crate::wire::AppRequests]) {
    let app = |name: &str| -> Labels { vec![("app", name.to_string())] };
    let mut gateway = Vec::new();
    for r in requests {
        for (code, n) in ["502", "503", "504"].iter().zip(r.gateway) {
            gateway.push((vec![("app", r.name.clone()), ("code", code.to_string())], Value::Counter(n)));
        }
    }
    let per_app = |f: fn(&crate::wire::AppRequests) -> u64| requests.iter().map(|r| (app(&r.name), Value::Counter(f(r)))).collect();
    let c = MetricType::Counter;
    add(reg, "gateway_errors", "Answers 502, 503 and 504 apart (also in requests' 5xx)", None, c, gateway);
    add(
        reg,
        "sessions_opened",
        "WebSocket sessions (Shiny sessions) opened through the load balancer",
        None,
        c,
        per_app(|r| r.sessions_opened),
    );
    add(reg, "received", "Bytes read from visitors' connections to the app's port", Some(Unit::Bytes), c, per_app(|r| r.bytes_in));
    add(reg, "sent", "Bytes written to visitors' connections to the app's port", Some(Unit::Bytes), c, per_app(|r| r.bytes_out));
}

/// The series per app of its capacity (README, "Capacity"): the active
/// copies wanted and active, the open sessions and the room for them, and
/// how many times it grew and shrank.
fn add_capacity(reg: &mut Registry, view: &View) {
    let of = |f: fn(&crate::wire::CapacityStatus) -> Option<Value>| -> Vec<(Labels, Value)> {
        view.apps.iter().filter_map(|a| Some((vec![("app", a.name.clone())], f(a.capacity.as_ref()?)?))).collect()
    };
    let gauge = MetricType::Gauge;
    add(
        reg,
        "active_copies_wanted",
        "Active copies wanted now, replicas to max-replicas",
        None,
        gauge,
        of(|c| Some(Value::Gauge(c.active_wanted.into()))),
    );
    add(reg, "active_copies", "Copies active now", None, gauge, of(|c| Some(Value::Gauge(c.active.into()))));
    add(
        reg,
        "app_sessions",
        "Open Shiny sessions on the app's copies that serve",
        None,
        gauge,
        of(|c| Some(Value::Gauge(c.sessions as f64))),
    );
    add(
        reg,
        "app_session_capacity",
        "Active copies wanted times max-sessions (apps with max-sessions)",
        None,
        gauge,
        of(|c| c.capacity.map(|n| Value::Gauge(n as f64))),
    );
    add(reg, "grows", "Times the app grew by visitors' load", None, MetricType::Counter, of(|c| Some(Value::Counter(c.grows))));
    add(reg, "shrinks", "Times the app shrank (a sleep's included)", None, MetricType::Counter, of(|c| Some(Value::Counter(c.shrinks))));
}

/// Serves `GET /metrics`, `GET /v1/metrics` and `GET /v1/health` on the
/// address in `SHINYCTL_METRICS`, when it is set. A value that is not an
/// address, or one that cannot be bound, is a line in api.log; the daemon
/// runs on without it.
pub async fn serve_tcp_from_env(shared: Shared) {
    let Ok(value) = std::env::var(METRICS_ENV) else { return };
    let addr: std::net::SocketAddr = match value.trim().parse() {
        Ok(a) => a,
        Err(_) => {
            tracing::error!("{METRICS_ENV}={value:?} is not an ADDR:PORT (such as 127.0.0.1:9108); metrics are on api.sock only");
            return;
        }
    };
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("{METRICS_ENV}={value}: cannot listen there ({e}); metrics are on api.sock only");
            return;
        }
    };
    tracing::info!("metrics on http://{addr}/metrics");
    uds::serve(listener, move |req: Request<hyper::body::Incoming>| {
        let shared = shared.clone();
        async move {
            match (req.method(), req.uri().path()) {
                (&Method::GET, "/metrics" | "/v1/metrics") => metrics(&shared, accept(&req)).await,
                (&Method::GET, "/v1/health") => health(&shared).await,
                _ => error(StatusCode::NOT_FOUND, "only GET /metrics and GET /v1/health are served here"),
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{AppRequests, AppTraffic, CopyStatus, CopyTraffic, Role};

    #[test]
    fn a_scrape_has_a_series_per_copy_and_app_and_none_for_what_is_gone() {
        let copy = |n, role| CopyStatus {
            copy: n,
            role,
            ready: role.is_some(),
            mem_bytes: Some(1000 * n as u64),
            status: "alive".into(),
            crashes: n - 3,
            cpu_secs: Some(1.25),
            started_ms: Some(1_700_000_000_000),
            memory_limit_bytes: Some(1 << 20),
            disk_bytes: Some(1 << 30),
            ..Default::default()
        };
        let copies = vec![copy(3, Some(Role::Active)), copy(4, None)];
        let app = AppStatus { name: "web".into(), copies, replicas: 2, state: "running".into(), ..Default::default() };
        let mut tallies = Tallies::default();
        tallies.restarted("web", RestartReason::Crash);
        tallies.restarted("gone", RestartReason::Crash);
        tallies.wake_failed("web");
        tallies.load_balancer_restarts = 2;
        let view = View { apps: vec![app], asleep_secs: vec![0.0], tallies, home: Home { root: "/nonexistent".into() } };
        let mut classes = [0; 5];
        classes[1] = 7;
        let mut latency_counts = vec![0; LATENCY_BOUNDS.len() + 1];
        latency_counts[0] = 7;
        let proxy = ProxyStats {
            pid: 1,
            rss_bytes: 5,
            open_connections: 2,
            apps: vec![AppTraffic {
                name: "web".into(),
                last_request_ms: 0,
                refusing: Vec::new(),
                leaving: Vec::new(),
                copies: vec![CopyTraffic { copy: 3, connections: 2, sessions: 1, silent_ms: 0 }],
            }],
            requests: vec![
                AppRequests {
                    name: "web".into(),
                    classes,
                    latency_counts: latency_counts.clone(),
                    latency_sum: 0.01,
                    gateway: [1, 2, 3],
                    sessions_opened: 4,
                    bytes_in: 500,
                    bytes_out: 600,
                },
                AppRequests { name: "old".into(), classes, latency_counts, latency_sum: 0.01, ..Default::default() },
            ],
            ..ProxyStats::default()
        };
        let text = render(&view, Some(&proxy)).unwrap();
        for line in [
            r#"shinyctl_copy_role{app="web",copy="3",role="active"} 1"#,
            r#"shinyctl_copy_role{app="web",copy="4",role="none"} 1"#,
            r#"shinyctl_copy_ready{app="web",copy="4"} 0"#,
            r#"shinyctl_copy_resident_memory_bytes{app="web",copy="3"} 3000"#,
            r#"shinyctl_copy_sessions{app="web",copy="3"} 1"#,
            r#"shinyctl_copy_open_connections{app="web",copy="3"} 2"#,
            r#"shinyctl_requests_total{app="web",class="2xx"} 7"#,
            r#"shinyctl_request_duration_seconds_bucket{le="0.005",app="web"} 7"#,
            r#"shinyctl_request_duration_seconds_bucket{le="10.0",app="web"} 7"#,
            r#"shinyctl_request_duration_seconds_bucket{le="+Inf",app="web"} 7"#,
            r#"shinyctl_restarts_total{app="web",reason="crash"} 1"#,
            r#"shinyctl_restarts_total{app="web",reason="memory-limit"} 0"#,
            r#"shinyctl_wakes_total{app="web"} 0"#,
            r#"shinyctl_asleep_seconds{app="web"} 0"#,
            "shinyctl_load_balancer_resident_memory_bytes 5",
            "shinyctl_load_balancer_open_connections 2",
            "shinyctl_load_balancer_up 1",
            "shinyctl_load_balancer_restarts_total 2",
            r#"shinyctl_copy_state{app="web",copy="4",state="alive"} 1"#,
            r#"shinyctl_copy_crashes{app="web",copy="4"} 1"#,
            r#"shinyctl_copy_cpu_seconds_total{app="web",copy="3"} 1.25"#,
            r#"shinyctl_copy_memory_limit_bytes{app="web",copy="3"} 1048576"#,
            r#"shinyctl_copy_disk_size_bytes{app="web",copy="3"} 1073741824"#,
            r#"shinyctl_copy_start_time_seconds{app="web",copy="3"} 1700000000"#,
            r#"shinyctl_app_desired_replicas{app="web"} 2"#,
            r#"shinyctl_app_state{app="web",state="running"} 1"#,
            r#"shinyctl_app_state{app="web",state="asleep"} 0"#,
            r#"shinyctl_gateway_errors_total{app="web",code="502"} 1"#,
            r#"shinyctl_gateway_errors_total{app="web",code="504"} 3"#,
            r#"shinyctl_sessions_opened_total{app="web"} 4"#,
            r#"shinyctl_received_bytes_total{app="web"} 500"#,
            r#"shinyctl_sent_bytes_total{app="web"} 600"#,
            r#"shinyctl_wake_failures_total{app="web"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        assert!(!text.contains("\"gone\"") && !text.contains("\"old\""), "apps that are gone have no series:\n{text}");
        assert!(text.lines().any(|l| l.starts_with("shinyctl_build_info{version=\"") && l.ends_with("} 1")), "{text}");
        let classic = exposition::to_classic(&text);
        assert!(classic.contains("# TYPE shinyctl_copy_cpu_seconds_total counter\n"), "{classic}");
        assert!(!classic.contains("# EOF") && !classic.contains("# UNIT"), "{classic}");
        let down = render(&view, None).unwrap();
        assert!(down.contains("shinyctl_load_balancer_up 0"), "{down}");
    }

    #[test]
    fn an_apps_capacity_has_its_series() {
        let capacity = crate::wire::CapacityStatus {
            max_sessions: Some(20),
            max_replicas: 6,
            active_wanted: 4,
            active: 3,
            sessions: 71,
            capacity: Some(80),
            grows: 3,
            shrinks: 1,
            ..Default::default()
        };
        let app = AppStatus { name: "hello".into(), capacity: Some(capacity), ..Default::default() };
        let view =
            View { apps: vec![app], asleep_secs: vec![0.0], tallies: Tallies::default(), home: Home { root: "/nonexistent".into() } };
        let text = render(&view, None).unwrap();
        for line in [
            r#"shinyctl_active_copies_wanted{app="hello"} 4"#,
            r#"shinyctl_active_copies{app="hello"} 3"#,
            r#"shinyctl_app_sessions{app="hello"} 71"#,
            r#"shinyctl_app_session_capacity{app="hello"} 80"#,
            r#"shinyctl_grows_total{app="hello"} 3"#,
            r#"shinyctl_shrinks_total{app="hello"} 1"#,
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
    }
}
