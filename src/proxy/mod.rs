//! The load balancer: `shinyctl proxy`. A process of its own, started by
//! the daemon, that listens on every app's port and sends each request to
//! one of the app's copies.
//!
//! Everything it keeps is under `proxy/`: `lock` (held while it runs, with
//! its PID), `handover.sock` (see `wire/handover.rs`) and `proxy.sock`, the
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
//! ([`crate::wire::StandIn`]) when a copy refuses a connection, and
//! `POST /v1/apps/<app>/wake` when a request comes for a sleeping app. It
//! keeps working with the table it has when the daemon is down
//! (`daemon_link.rs`).
//!
//! A request's way through the files: `visitors/listeners.rs` accepts the
//! connection and hands it to a worker (`workers.rs`);
//! `requests/forward.rs` routes each request — the sticky cookie
//! (`visitors/cookie.rs`, `copies/table.rs`), else the app's policy
//! (`copies/balance.rs`), holding it while no copy can take it;
//! `requests/upstream.rs` sends it on a pooled or new connection
//! (`copies/idle_connections.rs`), with the header rules of
//! `visitors/headers.rs`; the answer streams back as a `requests/body.rs`
//! body, or is one of `visitors/pages.rs`; a WebSocket goes on in
//! `tunnels/websocket.rs`. `control.rs` is what the daemon (and [`Proxy`])
//! reach.
//!
//! Against hostile clients: `visitors/client.rs` takes each connection
//! under the caps of `visitors/caps.rs`; `requests/progress.rs` cuts bodies
//! that stop moving; `requests/attempt.rs` and `copies/retry.rs` decide what
//! a failed send becomes (a request of death costs at most two copies);
//! `copies/stall.rs` watches a copy that stops answering.

mod control;
mod copies;
mod counters;
mod daemon_link;
mod error_source;
mod listeners;
mod lock;
mod progress;
mod requests;
mod shared;
mod tunnel_handover;
mod tunnels;
mod visitors;
mod workers;

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::home::Home;
use crate::wire::lb_start::{COOKIE_KEY_LEN, TAKEOVER_ENV};
use crate::wire::{handover, uds};
use crate::wire::{AppTraffic, ProxyTable, BUILD};
use control::Control;
use workers::{start_worker, Worker, WORKERS};

/// True when this process was asked to take over from a running one.
fn takeover_asked() -> bool {
    std::env::var_os(TAKEOVER_ENV).is_some_and(|v| v == "1")
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
    // Everything created from here on (lock, sockets) is private.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let lock_path = home.proxy_lock();
    let lock = match lock::take(&lock_path)? {
        lock::Lock::Taken(f) => Some(f),
        lock::Lock::Held(pid) if takeover_asked() => {
            // The daemon starts us beside the running one, gives us the
            // listening sockets it holds (the same ones the old one
            // listens on) and stops the old one once we answer.
            tracing::info!("taking over from the load balancer with pid {pid}");
            lock::wait_for(lock_path.clone());
            None
        }
        lock::Lock::Held(pid) => anyhow::bail!("another load balancer holds {} (pid {pid})", lock_path.display()),
    };
    let key = read_key(&home.cookie_key())?;
    // Every visitor's connection is a descriptor, and most one more to a copy.
    match visitors::caps::raise_open_files() {
        Ok(n) => tracing::info!("open files: up to {n}, so up to {} visitors' connections", visitors::caps::connection_budget(n)),
        Err(e) => tracing::warn!("cannot raise the open-files limit: {e}"),
    }
    let workers = (0..WORKERS).map(start_worker).collect::<io::Result<Vec<_>>>()?;
    // The control socket, the listeners' accept loops, signals and the
    // drain on shutdown run here; visitors' connections on the workers.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let result = rt.block_on(serve(home, key, workers));
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

pub use tunnel_handover::Handed;

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
    /// there is not listened on: the load balancer binds nothing itself).
    pub async fn start(settings: Settings, table: ProxyTable, listeners: Vec<std::net::TcpListener>) -> io::Result<Proxy> {
        let mut given = handover::Sockets::new();
        for l in listeners {
            let addr = l.local_addr()?;
            given.insert((addr.ip().to_string(), addr.port()), l);
        }
        let daemon = daemon_link::DaemonLink { api_sock: settings.api_sock };
        let control = Control::new(daemon, settings.key, vec![Worker::current()], given, false);
        control.push(table).await;
        Ok(Proxy { control })
    }

    /// Swaps in a new table, as `PUT /table` does.
    pub async fn push(&self, table: ProxyTable) {
        self.control.push(table).await;
    }

    /// Visitors' connections admitted and open, as `GET /metrics` counts
    /// them (WebSockets aside).
    pub fn open_connections(&self) -> usize {
        self.control.shared.open()
    }

    /// Connections and sessions per app and copy, as `GET /stats` has them.
    pub fn traffic(&self) -> Vec<AppTraffic> {
        self.control.shared.table.load().traffic()
    }

    /// Hands every open WebSocket tunnel to `to`, as a load balancer does
    /// to the next one when it stops (the same message, over a socket pair):
    /// returns how many went and with how many bytes read but not yet
    /// written. Tunnels that open here afterwards are handed over at once,
    /// and lost (this is the last thing a load balancer does).
    pub async fn hand_tunnels_over(&self, to: &Proxy) -> io::Result<Handed> {
        let (ours, theirs) = tokio::net::UnixStream::pair()?;
        let reader = tokio::spawn(tunnel_handover::take_in(theirs, to.control.shared.clone()));
        let tunnels = self.control.shared.pump.take_all(Duration::from_secs(1)).await;
        let handed = Handed::of(&tunnels);
        tunnel_handover::send(&ours, tunnels, tunnel_handover::PER_FRAME).await?;
        drop(ours);
        reader.await.map_err(io::Error::other)?;
        Ok(handed)
    }

    /// Stops as on SIGTERM: no new connection, the open ones get up to 5 s.
    pub async fn stop(self) {
        self.control.stop_serving().await;
    }
}

async fn serve(home: Home, key: [u8; COOKIE_KEY_LEN], workers: Vec<Worker>) -> anyhow::Result<()> {
    // handover.sock first: once proxy.sock answers with our PID, the daemon
    // gives its sockets on handover.sock, which must be ours by then.
    let handover_sock = handover::path(&home);
    let (handover_listener, handover_ino) = bind_unix(&handover_sock)?;
    let sock = home.proxy_sock();
    let (listener, ino) = bind_unix(&sock)?;
    let control = Control::new(daemon_link::DaemonLink { api_sock: home.api_sock() }, key, workers, handover::Sockets::new(), true);
    let ctl = control.clone();
    let control_task = tokio::spawn(uds::serve(listener, move |req| {
        let ctl = ctl.clone();
        async move { control::handle(req, &ctl).await }
    }));
    let handover_task = tokio::spawn(hand_over(handover_listener, control.clone()));

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
    handover_task.abort();
    control.stop_serving().await;
    tunnel_handover::pass_on(&handover_sock, handover_ino, &control.shared).await;
    control_task.abort();
    remove_own(&sock, ino);
    remove_own(&handover_sock, handover_ino);
    tracing::info!("load balancer stopped");
    Ok(())
}

/// Serves `handover.sock`: the daemon gives the listening sockets, or asks
/// for them back (see `wire/handover.rs`); a load balancer that stops sends its
/// open tunnels (tunnel_handover.rs).
async fn hand_over(listener: tokio::net::UnixListener, ctl: Arc<Control>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if let Some(why) = uds::peer_refused(&stream) {
            tracing::warn!("handover.sock {why}");
            continue;
        }
        let stream = match stream.into_std().and_then(|s| s.set_nonblocking(false).map(|()| s)) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("handover: {e}");
                continue;
            }
        };
        if let Err(e) = hand_over_one(stream, &ctl).await {
            tracing::warn!("handover: {e}");
        }
    }
}

/// One exchange on `handover.sock`. Reading waits on the peer, so it runs
/// on a blocking thread, with the handover's time limit.
async fn hand_over_one(stream: std::os::unix::net::UnixStream, ctl: &Control) -> io::Result<()> {
    use handover::{Message, Received};
    stream.set_read_timeout(Some(handover::TIMEOUT))?;
    stream.set_write_timeout(Some(handover::TIMEOUT))?;
    let (stream, first) = tokio::task::spawn_blocking(move || {
        let first = handover::receive(&stream);
        (stream, first)
    })
    .await
    .map_err(io::Error::other)?;
    match first {
        Ok(Received::Message(Message::Ask, _)) => {
            // Held while sending, so no socket handed back closes meanwhile.
            let listeners = ctl.listeners.lock().await;
            let held = listeners.sockets();
            handover::send_listeners(&stream, &held)?;
            tracing::info!("handed {} listening sockets back", held.len());
            Ok(())
        }
        Ok(first @ Received::Message(Message::Listeners { .. }, _)) => {
            let (stream, sockets) = tokio::task::spawn_blocking(move || {
                let sockets = handover::receive_listeners(&stream, first);
                (stream, sockets)
            })
            .await
            .map_err(io::Error::other)?;
            let sockets = sockets?;
            tracing::info!("given {} listening sockets", sockets.len());
            ctl.give(sockets).await;
            handover::send(&stream, &Message::Ack { pid: std::process::id() }, &[])
        }
        Ok(Received::Message(Message::Tunnels { version }, _)) if version == tunnel_handover::VERSION => {
            handover::send(&stream, &Message::Ack { pid: std::process::id() }, &[])?;
            stream.set_nonblocking(true)?;
            tokio::spawn(tunnel_handover::take_in(tokio::net::UnixStream::from_std(stream)?, ctl.shared.clone()));
            Ok(())
        }
        Ok(other) => {
            let reason = match other {
                Received::Message(m, _) => format!("not a request here: {m:?}"),
                Received::Legacy(..) => "a version-0 list is not a request".to_string(),
            };
            handover::send(&stream, &Message::Refused { reason: reason.clone() }, &[])?;
            Err(io::Error::other(reason))
        }
        Err(e) => {
            let _ = handover::send(&stream, &Message::Refused { reason: e.to_string() }, &[]);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_short_cookie_key_is_a_clear_error_and_none_is_made() {
        let tmp_dir = tempfile::tempdir().unwrap();
        let dir = tmp_dir.path().to_path_buf();
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
    }
}
