//! The load balancer's core as its callers see it: the state every
//! connection shares, the listeners that follow the table, and what can be
//! asked of them — the routes on `proxy.sock` for the daemon, and the same
//! steps for an in-process load balancer (`Proxy` in mod.rs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::{watch, Mutex, Notify};

use super::shared::BalancerState;
use super::workers::{Worker, WORKERS};
use crate::proxy::copies::idle_connections;
use crate::proxy::copies::table;
use crate::proxy::daemon_link::DaemonLink;
use crate::proxy::listeners::Listeners;
use crate::proxy::visitors::caps::{self, CapCounters};
use crate::wire::handover::Sockets;
use crate::wire::lb_start::COOKIE_KEY_LEN;
use crate::wire::uds;
use crate::wire::{ActionReply, ApiError, ProxySettings, ProxyStats, ProxyTable, BUILD};

/// How long requests in flight may take to finish once told to stop.
pub const DRAIN: Duration = Duration::from_secs(5);
/// A visitor must send a request's head within this (and an idle
/// keep-alive connection is closed after it).
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest request head accepted (request line and headers).
const MAX_HEAD: usize = 64 * 1024;
/// The largest table accepted on the control socket.
const MAX_TABLE: usize = 16 * 1024 * 1024;

/// Every so often, closes the idle connections to copies that expired
/// ([`idle_connections::POOL_IDLE`]), so a quiet app holds none; ends with the load
/// balancer.
async fn expire_pools(control: std::sync::Weak<Control>) {
    let mut tick = tokio::time::interval(idle_connections::POOL_IDLE / 3);
    loop {
        tick.tick().await;
        let Some(control) = control.upgrade() else { return };
        for app in &control.shared.table.load().apps {
            for copy in &app.copies {
                copy.state.pool.expire();
            }
        }
    }
}

/// A load balancer's state, as its control socket and callers reach it.
pub struct Control {
    /// Shared with the listeners and every connection.
    pub shared: Arc<BalancerState>,
    /// The listening sockets; the lock also keeps table pushes in order.
    pub listeners: Mutex<Listeners>,
    /// Woken by `POST /shutdown`.
    pub stop: Notify,
    /// Watches each copy's process and marks it gone when it exits
    /// (`liveness.rs`), and warms spares (`warm.rs`); off in process for
    /// tables of made-up PIDs.
    watch_copies: bool,
}

impl Control {
    /// A load balancer with an empty table, serving visitors on `workers`,
    /// reporting to `daemon`, signing cookies with `key`, listening on the
    /// `given` sockets for the apps they were bound for.
    /// With `watch_copies`, a copy whose process exits gets no visitor.
    pub fn new(daemon: DaemonLink, key: [u8; COOKIE_KEY_LEN], workers: Vec<Worker>, given: Sockets, watch_copies: bool) -> Arc<Control> {
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT).max_header_size(MAX_HEAD).max_buf_size(MAX_HEAD);
        let shared = Arc::new(BalancerState {
            daemon,
            key,
            table: table::LiveTable::default(),
            http,
            shutdown: watch::Sender::new(false),
            stopping: AtomicBool::new(false),
            workers,
            pump: Arc::default(),
            requests: Default::default(),
            gate: CapCounters::new(caps::connection_budget(caps::open_files_limit())),
        });
        let control = Arc::new(Control { shared, listeners: Mutex::new(Listeners::with(given)), stop: Notify::new(), watch_copies });
        tokio::spawn(expire_pools(Arc::downgrade(&control)));
        control
    }

    /// Swaps in `table` when it differs from the one held, and makes the
    /// listening sockets follow it.
    pub async fn push(&self, table: ProxyTable) {
        let shared = &self.shared;
        let mut listeners = self.listeners.lock().await;
        let current = shared.table.load();
        if current.source != table {
            tracing::info!("new table: {}", table::describe(&table));
            let next = table::Table::build(table, &shared.key, &current);
            shared.table.swap(next);
            let live = shared.table.load();
            if self.watch_copies {
                crate::proxy::copies::liveness::watch(&live);
                crate::proxy::copies::warm::warm(&live);
            }
            listeners.apply(&live, shared).await;
        }
    }

    /// Takes in the whole set of listening sockets the daemon holds and
    /// listens on those the table names.
    pub async fn give(&self, sockets: Sockets) {
        let mut listeners = self.listeners.lock().await;
        listeners.give(sockets);
        listeners.apply(&self.shared.table.load(), &self.shared).await;
    }

    /// Stops taking connections and lets the open ones finish for up to
    /// [`DRAIN`]: answers carry `Connection: close` from now on.
    pub async fn stop_serving(&self) {
        let shared = &self.shared;
        self.listeners.lock().await.stop_all();
        shared.stopping.store(true, Ordering::Relaxed);
        shared.shutdown.send_replace(true);
        let deadline = tokio::time::Instant::now() + DRAIN;
        while shared.open() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = shared.open();
        if left > 0 {
            tracing::warn!("{left} connections still open after {DRAIN:?}; closing them");
        }
    }

    /// What `GET /stats` and `GET /metrics` answer.
    fn stats(&self) -> ProxyStats {
        let table = self.shared.table.load();
        let names: Vec<String> = table.source.apps.iter().map(|a| a.name.clone()).collect();
        let apps = table.traffic();
        // An upgraded connection (a WebSocket) has left hyper's count and is a
        // session of its copy.
        let tunnels: u64 = apps.iter().flat_map(|a| &a.copies).map(|c| c.sessions).sum();
        ProxyStats {
            build: BUILD.to_string(),
            pid: std::process::id(),
            rss_bytes: crate::sys::procfs::rss_bytes(std::process::id()).unwrap_or(0),
            open_connections: self.shared.open() as u64 + tunnels,
            requests: self.shared.requests.report(&names),
            apps,
            settings: ProxySettings {
                header_timeout_ms: HEADER_TIMEOUT.as_millis() as u64,
                max_header_bytes: MAX_HEAD,
                workers: WORKERS,
                hold_ms: table::MAX_HOLD.as_millis() as u64,
                wake_hold_ms: table::MAX_WAKE_HOLD.as_millis() as u64,
                shutdown_drain_ms: DRAIN.as_millis() as u64,
            },
        }
    }
}

/// Answers one request on `proxy.sock`.
pub async fn handle(req: Request<hyper::body::Incoming>, ctl: &Control) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::PUT, "/table") => {
            let body = match uds::read_body(req.into_body(), MAX_TABLE).await {
                Ok(b) => b,
                Err(e) => return error(StatusCode::BAD_REQUEST, format!("{e:#}")),
            };
            let table: ProxyTable = match serde_json::from_slice(&body) {
                Ok(t) => t,
                Err(e) => return error(StatusCode::BAD_REQUEST, format!("not a copies table: {e}")),
            };
            let apps = table.apps.len();
            ctl.push(table).await;
            uds::json_response(StatusCode::OK, &ActionReply { message: format!("table of {apps} apps in place"), revision: None })
        }
        (&Method::GET, "/table") => uds::json_response(StatusCode::OK, &ctl.shared.table.load().source),
        (&Method::GET, "/stats" | "/metrics") => uds::json_response(StatusCode::OK, &ctl.stats()),
        (&Method::POST, "/shutdown") => {
            ctl.stop.notify_one();
            uds::json_response(StatusCode::OK, &ActionReply { message: "stopping".into(), revision: None })
        }
        (_, "/table" | "/stats" | "/metrics" | "/shutdown") => {
            error(StatusCode::METHOD_NOT_ALLOWED, format!("{} is not allowed here", req.method()))
        }
        (_, path) => error(StatusCode::NOT_FOUND, format!("no such route: {path}")),
    }
}

fn error(status: StatusCode, error: String) -> Response<Full<Bytes>> {
    uds::json_response(status, &ApiError { error })
}
