//! The load balancer: `shinyctl proxy`. A process of its own, started by
//! the daemon, that listens on every app's port and sends each request to
//! one of the app's copies.
//!
//! Everything it keeps is under `proxy/`: `lock` (held while it runs, with
//! its PID), `cookie.key` (the sticky cookie's HMAC key) and `proxy.sock`,
//! the control socket (HTTP/1.1 + JSON):
//!
//! - `PUT /table` with a [`ProxyTable`]: swapped in at once, and listeners
//!   follow it; answers 200 `{"message": …}`.
//! - `GET /table`: the table it holds.
//! - `GET /stats`: a [`ProxyStats`].
//! - `POST /shutdown`: stops as on SIGTERM (no new connection, requests in
//!   flight get up to 5 s).
//!
//! When a copy refuses a connection it tells the daemon with
//! `POST /v1/apps/<app>/stand-in` ([`crate::model::StandIn`]) on `api.sock`,
//! and keeps working with the table it has when the daemon is down.

mod balance;
mod cookie;
mod forward;
mod listeners;
mod pages;
mod table;
mod websocket;

use std::fs;
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::{watch, Mutex, Notify};

use crate::home::Home;
use crate::model::{ActionReply, ApiError, ProxyStats, ProxyTable, BUILD};
use crate::uds;

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

/// Which side of the load balancer an error came from, for the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorSource {
    /// A copy (connect, send, its answer).
    Upstream,
    /// A visitor (its connection, its request).
    Downstream,
}

impl std::fmt::Display for ErrorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorSource::Upstream => "upstream",
            ErrorSource::Downstream => "downstream",
        })
    }
}

/// What every connection of the load balancer shares.
pub struct Shared {
    /// The home, for `api.sock`.
    pub home: Home,
    /// The sticky cookie's HMAC key.
    pub key: [u8; cookie::KEY_LEN],
    /// The live copies table.
    pub table: table::LiveTable,
    /// How visitors' connections are served (timeouts, limits).
    pub http: hyper::server::conn::http1::Builder,
    /// Turns true once the load balancer stops.
    pub shutdown: watch::Sender<bool>,
    /// Visitors' connections being served.
    pub open: AtomicUsize,
}

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
    // Everything created from here on (lock, key, socket) is private.
    // SAFETY: umask has no memory effects; this runs before any thread starts.
    unsafe { libc::umask(0o077) };
    let lock = take_lock(&home.proxy_lock())?;
    let key = read_key(&home.cookie_key())?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("proxy").enable_all().build()?;
    let result = rt.block_on(serve(home, key));
    rt.shutdown_timeout(Duration::from_millis(100));
    drop(lock);
    result
}

/// Takes `proxy/lock` (exclusive, non-blocking) and writes our PID in it.
fn take_lock(path: &Path) -> anyhow::Result<fs::File> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let mut pid = String::new();
            let _ = f.read_to_string(&mut pid);
            let pid = pid.trim();
            let who = if pid.is_empty() { String::new() } else { format!(" (pid {pid})") };
            anyhow::bail!("another load balancer holds {}{who}", path.display());
        }
        anyhow::bail!("cannot lock {}: {err}", path.display());
    }
    f.set_len(0)?;
    f.rewind()?;
    writeln!(f, "{}", std::process::id())?;
    Ok(f)
}

/// Reads the 32-byte cookie key, creating it (mode 0600) if there is none
/// or it is not 32 bytes.
fn read_key(path: &Path) -> anyhow::Result<[u8; cookie::KEY_LEN]> {
    if let Ok(bytes) = fs::read(path) {
        if let Ok(key) = <[u8; cookie::KEY_LEN]>::try_from(bytes.as_slice()) {
            return Ok(key);
        }
        tracing::warn!("{} is not {} bytes; making a new key (visitors are placed anew)", path.display(), cookie::KEY_LEN);
    }
    let mut key = [0u8; cookie::KEY_LEN];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .map_err(|e| anyhow::anyhow!("cannot read /dev/urandom: {e}"))?;
    crate::home::write_atomic(path, &key, 0o600).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    Ok(key)
}

/// Binds `proxy/proxy.sock` (mode 0600), removing a stale one, and
/// returns its inode so only our own socket is removed on exit.
fn bind_control(path: &Path) -> anyhow::Result<(tokio::net::UnixListener, u64)> {
    // We hold the lock, so no live load balancer uses this socket.
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

async fn serve(home: Home, key: [u8; cookie::KEY_LEN]) -> anyhow::Result<()> {
    let sock = home.proxy_sock();
    let (listener, ino) = bind_control(&sock)?;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT).max_buf_size(MAX_HEAD);
    let shared = Arc::new(Shared {
        home,
        key,
        table: table::LiveTable::default(),
        http,
        shutdown: watch::Sender::new(false),
        open: AtomicUsize::new(0),
    });
    let control = Arc::new(Control { shared: shared.clone(), listeners: Mutex::new(Default::default()), stop: Notify::new() });

    let ctl = control.clone();
    let control_task = tokio::spawn(uds::serve(listener, move |req| {
        let ctl = ctl.clone();
        async move { handle_control(req, &ctl).await }
    }));
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
    control.listeners.lock().await.stop_all();
    shared.shutdown.send_replace(true);
    let deadline = tokio::time::Instant::now() + DRAIN;
    while shared.open.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = shared.open.load(Ordering::Relaxed);
    if left > 0 {
        tracing::warn!("{left} connections still open after {DRAIN:?}; closing them");
    }
    control_task.abort();
    // A newer load balancer may have bound its own socket at this path.
    if fs::metadata(&sock).is_ok_and(|m| m.ino() == ino) {
        let _ = fs::remove_file(&sock);
    }
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
            let next = table::Table::build(table, &shared.key, &shared.table.load());
            shared.table.swap(next);
            listeners.apply(&shared.table.load(), shared).await;
            uds::json_response(StatusCode::OK, &ActionReply { message: format!("table of {apps} apps in place") })
        }
        (&Method::GET, "/table") => uds::json_response(StatusCode::OK, &shared.table.load().source),
        (&Method::GET, "/stats") => {
            let stats = ProxyStats {
                build: BUILD.to_string(),
                pid: std::process::id(),
                rss_bytes: rss_bytes(),
                apps: shared.table.load().traffic(),
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

/// Our resident memory, from `/proc/self/statm`.
fn rss_bytes() -> u64 {
    let pages = fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}
