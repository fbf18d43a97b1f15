//! The load balancer: `shinyctl proxy`. A process of its own, started by
//! the daemon, that listens on every app's port and sends each request to
//! one of the app's copies.
//!
//! Everything it keeps is under `proxy/`: `lock` (held while it runs, with
//! its PID), `cookie.key` (the sticky cookie's HMAC key), `handover.sock`
//! (see [`handover`]) and `proxy.sock`, the control socket (HTTP/1.1 +
//! JSON):
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
mod cookie;
mod forward;
mod handover;
mod listeners;
mod pages;
mod table;
mod websocket;

use std::fs;
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::{watch, Mutex, Notify};

use crate::home::Home;
use crate::model::{ActionReply, ApiError, ProxySettings, ProxyStats, ProxyTable, BUILD};
use crate::uds;

/// How long requests in flight may take to finish once told to stop.
const DRAIN: Duration = Duration::from_secs(5);
/// Once told to stop, how long a connection may still bring a request (a
/// new connection's first one, or the next on a busy keep-alive one)
/// before an idle connection is closed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
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
    /// The same, read on every answer (cheaper than the channel): answers
    /// then carry `Connection: close`.
    pub stopping: AtomicBool,
    /// The threads that serve visitors' connections.
    pub workers: Vec<Worker>,
}

impl Shared {
    /// Visitors' connections being served, on all workers.
    pub fn open(&self) -> usize {
        self.workers.iter().map(|w| w.open.load(Ordering::Relaxed)).sum()
    }
}

/// Threads serving visitors. Each runs a single-threaded runtime, and a
/// connection lives on one worker with everything it causes (its
/// requests, the connections to copies, their answers), so no request
/// wakes another thread: in `bench/proxy.sh` this took about a fifth less
/// CPU per request than a work-stealing runtime.
pub const WORKERS: usize = 2;

/// One worker thread.
pub struct Worker {
    /// Where its connections are spawned.
    pub handle: tokio::runtime::Handle,
    /// Visitors' connections it serves; a new one goes to the worker with
    /// the fewest.
    pub open: AtomicUsize,
}

thread_local! {
    /// The index of the worker this thread is (0 on other threads).
    static WORKER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The index of the worker running the caller, so each worker keeps its
/// own idle connections to copies.
pub fn worker_index() -> usize {
    WORKER.with(|w| w.get())
}

fn start_worker(index: usize) -> io::Result<Worker> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let handle = rt.handle().clone();
    std::thread::Builder::new().name(format!("proxy-{index}")).spawn(move || {
        WORKER.with(|w| w.set(index));
        // Serves whatever is spawned on it until the process exits.
        rt.block_on(std::future::pending::<()>());
    })?;
    Ok(Worker { handle, open: AtomicUsize::new(0) })
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
    let _ = crate::logging::init(io::stderr, true);
    let dir = home.proxy_dir();
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => anyhow::bail!("cannot create {}: {e}", dir.display()),
    }
    // Everything created from here on (lock, key, socket) is private.
    // SAFETY: umask has no memory effects; this runs before any thread starts.
    unsafe { libc::umask(0o077) };
    let lock_path = home.proxy_lock();
    let (lock, inherited) = match take_lock(&lock_path)? {
        Lock::Taken(f) => (Some(f), handover::Inherited::new()),
        Lock::Held(pid) if handover::asked() => {
            // The daemon starts us beside the running one and stops it
            // once we answer; its sockets become ours right away.
            let inherited = handover::receive(&handover::path(&home)).unwrap_or_else(|e| {
                tracing::warn!("the running load balancer hands no socket over ({e}); binding beside it");
                handover::Inherited::new()
            });
            tracing::info!("taking over from the load balancer with pid {pid}; {} sockets handed over", inherited.len());
            wait_for_lock(lock_path.clone());
            (None, inherited)
        }
        Lock::Held(pid) => anyhow::bail!("another load balancer holds {} (pid {pid})", lock_path.display()),
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

/// What trying `proxy/lock` found.
enum Lock {
    /// Ours now, with our PID written in it.
    Taken(fs::File),
    /// Another load balancer holds it; its PID as written there.
    Held(String),
}

/// Tries `proxy/lock` (exclusive, non-blocking).
fn take_lock(path: &Path) -> anyhow::Result<Lock> {
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
            return Ok(Lock::Held(if pid.is_empty() { "unknown".into() } else { pid.into() }));
        }
        anyhow::bail!("cannot lock {}: {err}", path.display());
    }
    write_pid(&mut f)?;
    Ok(Lock::Taken(f))
}

fn write_pid(f: &mut fs::File) -> io::Result<()> {
    f.set_len(0)?;
    f.rewind()?;
    writeln!(f, "{}", std::process::id())
}

/// Takes `proxy/lock` once the load balancer we replace lets it go, on a
/// thread of its own, and holds it until we exit.
fn wait_for_lock(path: std::path::PathBuf) {
    std::thread::spawn(move || {
        let Ok(mut f) = fs::OpenOptions::new().read(true).write(true).open(&path) else {
            tracing::error!("cannot open {} to take it over", path.display());
            return;
        };
        // SAFETY: a blocking flock on a descriptor this thread owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            tracing::error!("cannot lock {}: {}", path.display(), io::Error::last_os_error());
            return;
        }
        let _ = write_pid(&mut f);
        tracing::info!("the replaced load balancer is gone; {} is ours", path.display());
        // Held, like the lock of a load balancer that started alone, until exit.
        std::mem::forget(f);
    });
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

async fn serve(home: Home, key: [u8; cookie::KEY_LEN], workers: Vec<Worker>, inherited: handover::Inherited) -> anyhow::Result<()> {
    let sock = home.proxy_sock();
    let (listener, ino) = bind_unix(&sock)?;
    let handover_sock = handover::path(&home);
    let (handover_listener, handover_ino) = bind_unix(&handover_sock)?;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT).max_header_size(MAX_HEAD).max_buf_size(MAX_HEAD);
    let shared = Arc::new(Shared {
        home,
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
                rss_bytes: rss_bytes(),
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
