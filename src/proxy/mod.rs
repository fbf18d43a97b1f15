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
//! keeps working with the table it has when the daemon is down
//! (`daemon.rs`).
//!
//! A request's way through the files: `listeners.rs` accepts the
//! connection and hands it to a worker (`workers.rs`); `forward.rs`
//! routes each request — the sticky cookie (`cookie.rs`, `table.rs`), else
//! the app's policy (`balance.rs`), holding it while no copy can take it;
//! `upstream.rs` sends it on a pooled or new connection (`pool.rs`), with
//! the header rules of `headers.rs`; the answer streams back as a
//! `body.rs` body, or is one of `pages.rs`; a WebSocket goes on in
//! `websocket.rs`. `control.rs` is what the daemon (and [`Proxy`]) reach.

mod balance;
mod body;
mod control;
mod cookie;
mod daemon;
mod forward;
mod handover;
mod headers;
mod listeners;
mod lock;
mod pages;
mod pool;
mod quickack;
mod shared;
mod table;
mod upstream;
mod websocket;
mod workers;

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::home::Home;
use crate::model::{AppTraffic, ProxyTable, BUILD};
use crate::uds;
use control::Control;
/// Length of the sticky cookie's key, `proxy/cookie.key`.
pub use cookie::KEY_LEN as COOKIE_KEY_LEN;
use workers::{start_worker, Worker, WORKERS};

/// How often listeners that could not be bound are tried again.
const RETRY_BIND: Duration = Duration::from_secs(5);

/// Runs the load balancer until SIGTERM, SIGINT or `POST /shutdown`.
pub fn run(home: Home) -> anyhow::Result<()> {
    let _ = crate::logging::init(io::stderr, true);
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

/// What an in-process load balancer ([`Proxy::start`]) is given.
pub struct Settings {
    /// The daemon's `api.sock`, where stand-ins are reported and wakes
    /// asked for.
    pub api_sock: PathBuf,
    /// The sticky cookie's HMAC key.
    pub key: [u8; COOKIE_KEY_LEN],
}

/// A load balancer running in the calling process, on the calling tokio
/// runtime: what `shinyctl proxy` runs, without its process (lock, control
/// socket, handover, signals) and with visitors' connections served on the
/// caller's runtime instead of worker threads. The tests start it in front
/// of backends of their own, with tokio's paused clock.
pub struct Proxy {
    /// The load balancer's state.
    control: Arc<Control>,
}

impl Proxy {
    /// Starts a load balancer with `table` in place, serving each app on the
    /// socket among `listeners` bound to its host and port (an app with none
    /// there is bound as `shinyctl proxy` binds it).
    pub async fn start(settings: Settings, table: ProxyTable, listeners: Vec<std::net::TcpListener>) -> io::Result<Proxy> {
        let mut inherited = handover::Inherited::new();
        for l in listeners {
            let addr = l.local_addr()?;
            inherited.insert((addr.ip().to_string(), addr.port()), l);
        }
        let daemon = daemon::DaemonLink { api_sock: settings.api_sock };
        let control = Control::new(daemon, settings.key, vec![Worker::current()], inherited);
        control.push(table).await;
        Ok(Proxy { control })
    }

    /// Swaps in a new table, as `PUT /table` does.
    pub async fn push(&self, table: ProxyTable) {
        self.control.push(table).await;
    }

    /// Connections and sessions per app and copy, as `GET /stats` has them.
    pub fn traffic(&self) -> Vec<AppTraffic> {
        self.control.shared.table.load().traffic()
    }

    /// Stops as on SIGTERM: no new connection, the open ones get up to 5 s.
    pub async fn stop(self) {
        self.control.stop_serving().await;
    }
}

async fn serve(home: Home, key: [u8; COOKIE_KEY_LEN], workers: Vec<Worker>, inherited: handover::Inherited) -> anyhow::Result<()> {
    let sock = home.proxy_sock();
    let (listener, ino) = bind_unix(&sock)?;
    let handover_sock = handover::path(&home);
    let (handover_listener, handover_ino) = bind_unix(&handover_sock)?;
    let control = Control::new(daemon::DaemonLink { api_sock: home.api_sock() }, key, workers, inherited);
    let ctl = control.clone();
    let control_task = tokio::spawn(uds::serve(listener, move |req| {
        let ctl = ctl.clone();
        async move { control::handle(req, &ctl).await }
    }));
    let handover_task = tokio::spawn(hand_over(handover_listener, control.clone()));
    let retry_task = tokio::spawn(retry_binds(control.clone()));

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
    tracing::info!("stopping ({why}): no new connections; requests in flight get up to {:?}", control::DRAIN);
    retry_task.abort();
    handover_task.abort();
    control.stop_serving().await;
    control_task.abort();
    remove_own(&sock, ino);
    remove_own(&handover_sock, handover_ino);
    tracing::info!("load balancer stopped");
    Ok(())
}

/// Hands the listening sockets to each newer load balancer that asks on
/// `handover.sock`.
async fn hand_over(listener: tokio::net::UnixListener, ctl: Arc<Control>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
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
}

/// Tries again, every [`RETRY_BIND`], the listeners that could not be bound.
async fn retry_binds(ctl: Arc<Control>) {
    let mut tick = tokio::time::interval(RETRY_BIND);
    loop {
        tick.tick().await;
        let mut listeners = ctl.listeners.lock().await;
        if listeners.has_failures() {
            listeners.apply(&ctl.shared.table.load(), &ctl.shared).await;
        }
    }
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
