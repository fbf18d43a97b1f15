//! The load balancer: `shinyctl proxy`. A process of its own, started by
//! the daemon, that listens on every app's port and sends each request to
//! one of the app's copies.
//!
//! Everything it keeps is under `proxy/`: `lock` (held while it runs, with
//! its PID), `handover.sock` (see `handover.rs`) and `proxy.sock`, the
//! control socket (HTTP/1.1 + JSON). It reads `cookie.key`, the sticky
//! cookie's HMAC key, which only the daemon makes. The control socket:
//!
//! - `PUT /table` with a [`ProxyTable`]: swapped in at once, and listeners
//!   follow it; answers 200 `{"message": …}`.
//! - `GET /table`: the table it holds.
//! - `GET /stats`: a [`ProxyStats`].
//! - `POST /shutdown`: stops as on SIGTERM (no new connection, requests in
//!   flight get up to 5 s).
//!
//! It asks the daemon, on `api.sock`, `POST /v1/apps/<app>/stand-in`
//! ([`crate::model::StandIn`]) when a copy refuses a connection, and
//! `POST /v1/apps/<app>/wake` when a request comes for a sleeping app. It
//! keeps working with the table it has when the daemon is down.

mod balance;
mod body;
mod cookie;
mod daemon;
mod forward;
mod handover;
mod headers;
mod listeners;
mod lock;
mod pages;
mod pool;
mod shared;
mod table;
mod upstream;
mod websocket;
mod workers;

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::{watch, Mutex, Notify};

use crate::home::Home;
use crate::model::{ActionReply, ApiError, ProxySettings, ProxyStats, ProxyTable, BUILD};
use crate::uds;
/// Length of the sticky cookie's key, `proxy/cookie.key`.
pub use cookie::KEY_LEN as COOKIE_KEY_LEN;
use shared::Shared;
use workers::{start_worker, Worker, WORKERS};

/// How long requests in flight may take to finish once told to stop.
const DRAIN: Duration = Duration::from_secs(5);
/// A visitor must send a request's head within this (and an idle
/// keep-alive connection is closed after it).
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest request head accepted (request line and headers).
const MAX_HEAD: usize = 64 * 1024;
/// The largest table accepted on the control socket.
const MAX_TABLE: usize = 16 * 1024 * 1024;
/// How often listeners that could not be bound are tried again.
const RETRY_BIND: Duration = Duration::from_secs(5);

/// The control socket's state.
struct Control {
    /// Shared with the listeners.
    shared: Arc<Shared>,
    /// The listening sockets; the lock also keeps table pushes in order.
    listeners: Mutex<listeners::Listeners>,
    /// Woken by `POST /shutdown`.
    stop: Notify,
}

/// Runs the load balancer until SIGTERM, SIGINT or `POST /shutdown`.
pub fn run(home: Home) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt().with_writer(io::stderr).with_ansi(false).try_init();
    let dir = home.proxy_dir();
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => anyhow::bail!("cannot create {}: {e}", dir.display()),
    }
    // Everything created from here on (lock, sockets) is private.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let lock_path = home.proxy_lock();
    let (lock, inherited) = match lock::take(&lock_path)? {
        lock::Lock::Taken(f) => (Some(f), handover::Inherited::new()),
        lock::Lock::Held(pid) if handover::asked() => {
            // The daemon starts us beside the running one and stops it
            // once we answer; its sockets become ours right away.
            let inherited = handover::receive(&handover::path(&home)).unwrap_or_else(|e| {
                tracing::warn!("the running load balancer hands no socket over ({e}); binding beside it");
                handover::Inherited::new()
            });
            tracing::info!("taking over from the load balancer with pid {pid}; {} sockets handed over", inherited.len());
            lock::wait_for(lock_path.clone());
            (None, inherited)
        }
        lock::Lock::Held(pid) => anyhow::bail!("another load balancer holds {} (pid {pid})", lock_path.display()),
    };
    let key = read_key(&home.cookie_key())?;
    let workers = (0..WORKERS).map(start_worker).collect::<io::Result<Vec<_>>>()?;
    // The control socket, the listeners' accept loops, signals and the
    // drain on shutdown run here; visitors' connections on the workers.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let result = rt.block_on(serve(home, key, workers, inherited));
    rt.shutdown_timeout(Duration::from_millis(100));
    drop(lock);
    result
}

/// Reads the cookie key (`proxy/cookie.key`, [`COOKIE_KEY_LEN`] bytes).
/// Only the daemon makes it, before it starts a load balancer: one that
/// found none and made its own would place visitors with a key the next
/// one does not know.
fn read_key(path: &Path) -> anyhow::Result<[u8; COOKIE_KEY_LEN]> {
    let bytes = fs::read(path).map_err(|e| {
        anyhow::anyhow!(
            "cannot read the cookie key {}: {e}; the daemon (shinyctl serve) makes it before it starts the load balancer",
            path.display()
        )
    })?;
    <[u8; COOKIE_KEY_LEN]>::try_from(bytes.as_slice()).map_err(|_| {
        anyhow::anyhow!(
            "the cookie key {} is {} bytes, not {COOKIE_KEY_LEN}; the daemon (shinyctl serve) makes a new one when it starts the load balancer",
            path.display(),
            bytes.len()
        )
    })
}

/// Binds a Unix socket under `proxy/` (mode 0600), removing a stale one,
/// and returns its inode so only our own socket is removed on exit.
fn bind_unix(path: &Path) -> anyhow::Result<(tokio::net::UnixListener, u64)> {
    // Either we hold the lock, so no live load balancer uses this socket,
    // or we take over from the one that does, and the daemon talks to us.
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("cannot remove the stale {}: {e}", path.display()),
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(|e| anyhow::anyhow!("cannot bind {}: {e}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    let ino = fs::metadata(path)?.ino();
    Ok((listener, ino))
}

/// Removes a socket we bound, unless another load balancer has bound its
/// own at that path since.
fn remove_own(path: &Path, ino: u64) {
    if fs::metadata(path).is_ok_and(|m| m.ino() == ino) {
        let _ = fs::remove_file(path);
    }
}

async fn serve(home: Home, key: [u8; COOKIE_KEY_LEN], workers: Vec<Worker>, inherited: handover::Inherited) -> anyhow::Result<()> {
    let sock = home.proxy_sock();
    let (listener, ino) = bind_unix(&sock)?;
    let handover_sock = handover::path(&home);
    let (handover_listener, handover_ino) = bind_unix(&handover_sock)?;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT).max_header_size(MAX_HEAD).max_buf_size(MAX_HEAD);
    let shared = Arc::new(Shared {
        daemon: daemon::DaemonLink { api_sock: home.api_sock() },
        key,
        table: table::LiveTable::default(),
        http,
        shutdown: watch::Sender::new(false),
        stopping: AtomicBool::new(false),
        workers,
    });
    let control = Arc::new(Control {
        shared: shared.clone(),
        listeners: Mutex::new(listeners::Listeners::inheriting(inherited)),
        stop: Notify::new(),
    });

    let ctl = control.clone();
    let control_task = tokio::spawn(uds::serve(listener, move |req| {
        let ctl = ctl.clone();
        async move { handle_control(req, &ctl).await }
    }));
    let ctl = control.clone();
    let handover_task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = handover_listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            // Held while sending, so no socket handed over closes meanwhile.
            let listeners = ctl.listeners.lock().await;
            match handover::send(&stream, &listeners.sockets()) {
                Ok(n) => tracing::info!("handed {n} listening sockets to a new load balancer"),
                Err(e) => tracing::warn!("cannot hand the listening sockets over: {e}"),
            }
        }
    });
    let ctl = control.clone();
    let retry_task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(RETRY_BIND);
        loop {
            tick.tick().await;
            let mut listeners = ctl.listeners.lock().await;
            if listeners.has_failures() {
                listeners.apply(&ctl.shared.table.load(), &ctl.shared).await;
            }
        }
    });

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    // Not a reason to stop: the daemon starts us in a session of our own.
    let _hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    tracing::info!(pid = std::process::id(), build = BUILD, "load balancer started on {}", sock.display());
    let why = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        _ = control.stop.notified() => "POST /shutdown",
    };
    tracing::info!("stopping ({why}): no new connections; requests in flight get up to {DRAIN:?}");
    retry_task.abort();
    handover_task.abort();
    control.listeners.lock().await.stop_all();
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
    control_task.abort();
    remove_own(&sock, ino);
    remove_own(&handover_sock, handover_ino);
    tracing::info!("load balancer stopped");
    Ok(())
}

async fn handle_control(req: Request<hyper::body::Incoming>, ctl: &Control) -> Response<Full<Bytes>> {
    let shared = &ctl.shared;
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
            let mut listeners = ctl.listeners.lock().await;
            let current = shared.table.load();
            if current.source != table {
                tracing::info!("new table: {}", table::describe(&table));
                let next = table::Table::build(table, &shared.key, &current);
                shared.table.swap(next);
                listeners.apply(&shared.table.load(), shared).await;
            }
            uds::json_response(StatusCode::OK, &ActionReply { message: format!("table of {apps} apps in place") })
        }
        (&Method::GET, "/table") => uds::json_response(StatusCode::OK, &shared.table.load().source),
        (&Method::GET, "/stats") => {
            let stats = ProxyStats {
                build: BUILD.to_string(),
                pid: std::process::id(),
                rss_bytes: crate::procfs::rss_bytes(std::process::id()).unwrap_or(0),
                apps: shared.table.load().traffic(),
                settings: ProxySettings {
                    header_timeout_ms: HEADER_TIMEOUT.as_millis() as u64,
                    max_header_bytes: MAX_HEAD,
                    workers: WORKERS,
                    hold_ms: table::MAX_HOLD.as_millis() as u64,
                    wake_hold_ms: table::MAX_WAKE_HOLD.as_millis() as u64,
                    shutdown_drain_ms: DRAIN.as_millis() as u64,
                },
            };
            uds::json_response(StatusCode::OK, &stats)
        }
        (&Method::POST, "/shutdown") => {
            ctl.stop.notify_one();
            uds::json_response(StatusCode::OK, &ActionReply { message: "stopping".into() })
        }
        (_, "/table" | "/stats" | "/shutdown") => error(StatusCode::METHOD_NOT_ALLOWED, format!("{} is not allowed here", req.method())),
        (_, path) => error(StatusCode::NOT_FOUND, format!("no such route: {path}")),
    }
}

fn error(status: StatusCode, error: String) -> Response<Full<Bytes>> {
    uds::json_response(status, &ApiError { error })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_short_cookie_key_is_a_clear_error_and_none_is_made() {
        let dir = std::env::temp_dir().join(format!("shinyctl-readkey-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cookie.key");
        let _ = fs::remove_file(&path);
        let missing = read_key(&path).unwrap_err().to_string();
        assert!(missing.contains("cannot read the cookie key") && missing.contains("shinyctl serve"), "{missing}");
        assert!(!path.exists(), "the load balancer makes no key of its own");
        fs::write(&path, [1u8; 5]).unwrap();
        let short = read_key(&path).unwrap_err().to_string();
        assert!(short.contains("is 5 bytes, not 32"), "{short}");
        fs::write(&path, [9u8; COOKIE_KEY_LEN]).unwrap();
        assert_eq!(read_key(&path).unwrap(), [9u8; COOKIE_KEY_LEN]);
        let _ = fs::remove_dir_all(&dir);
    }
}
