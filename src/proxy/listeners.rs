//! One listening socket per app, on the app's host and port, following the
//! table: a new app starts listening, a removed one stops (its open
//! connections finish), a changed host moves. The load balancer never
//! binds a socket itself: the daemon binds each app's socket at `apply`,
//! holds it, and gives the whole set over `handover.sock` (see
//! `handover.rs`); a port is listened on while both the table and that set
//! name it. So a load balancer that dies leaves every socket open in the
//! daemon, and the connections that arrive meanwhile wait in the kernel's
//! accept queue for the next one.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::proxy::copies::table::Table;
use crate::proxy::error_source::ErrorSource;
use crate::proxy::requests::forward::{self, VisitorConnection};
use crate::proxy::shared::BalancerState;
use crate::wire::handover::Sockets;

/// Once told to stop, how long a connection may still bring a request (a
/// new connection's first one, or the next on a busy keep-alive one)
/// before an idle connection is closed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// The listening sockets, by public port.
#[derive(Default)]
pub struct Listeners {
    /// The accept loop of each port, with the host it is bound to.
    running: HashMap<u16, Running>,
    /// Set on shutdown: nothing starts listening any more.
    stopped: bool,
    /// The sockets the daemon gave, by host and port: the only ones this
    /// load balancer may listen on.
    given: Sockets,
}

/// One port's accept loop.
struct Running {
    /// The address it is bound to.
    host: String,
    /// The socket's inode, so a socket given anew for the same address
    /// (the daemon bound another) replaces it.
    inode: u64,
    /// The accept loop, which owns this process's copy of the socket.
    task: JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The inode of a socket, which names it across processes.
fn inode_of(fd: &impl AsRawFd) -> u64 {
    // /proc/self/fd/N links to `socket:[inode]`; its metadata is the socket's.
    std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).map(|m| m.ino()).unwrap_or(0)
}

impl Listeners {
    /// Listeners on `given` sockets (none yet for `shinyctl proxy`, which
    /// is given them over `handover.sock`).
    pub fn with(given: Sockets) -> Listeners {
        Listeners { given, ..Default::default() }
    }

    /// The listening sockets given and not closed, for handing them back
    /// (to a daemon that restarted).
    pub fn sockets(&self) -> Vec<(String, u16, RawFd)> {
        self.given.iter().map(|((host, port), s)| (host.clone(), *port, s.as_raw_fd())).collect()
    }

    /// Takes in the whole set of sockets the daemon holds: a socket not in
    /// it is closed once [`Listeners::apply`] runs.
    pub fn give(&mut self, sockets: Sockets) {
        if !self.stopped {
            self.given = sockets;
        }
    }

    /// Makes the listening sockets match `table` and the sockets given.
    pub async fn apply(&mut self, table: &Table, shared: &Arc<BalancerState>) {
        if self.stopped {
            return;
        }
        let want = table.listen_addrs();
        let given = &self.given;
        // Gone from the table, moved to another host, or no longer given
        // (or given anew as another socket): stop, and close our copy.
        self.running.retain(|port, r| {
            let keep = want.get(port) == Some(&r.host) && given.get(&(r.host.clone(), *port)).is_some_and(|s| inode_of(s) == r.inode);
            if !keep {
                tracing::info!(port, host = %r.host, "stopped listening on {}:{port}", r.host);
            }
            keep
        });
        for (port, host) in want {
            if self.running.contains_key(&port) {
                continue;
            }
            let Some(socket) = self.given.get(&(host.clone(), port)) else {
                tracing::debug!(port, %host, "no socket for {host}:{port} from the daemon yet");
                continue;
            };
            let inode = inode_of(socket);
            match socket.try_clone().and_then(|s| s.set_nonblocking(true).map(|()| s)).and_then(TcpListener::from_std) {
                Ok(listener) => {
                    tracing::info!(port, %host, "listening on {host}:{port}");
                    let task = tokio::spawn(accept_loop(Arc::new(listener), port, shared.clone()));
                    self.running.insert(port, Running { host, inode, task });
                }
                Err(e) => tracing::error!(port, %host, "cannot listen on the socket given for {host}:{port}: {e}"),
            }
        }
    }

    /// Closes every listening socket (open connections carry on). The
    /// daemon still holds them, so connections keep queueing for the next
    /// load balancer.
    pub fn stop_all(&mut self) {
        self.stopped = true;
        self.running.clear();
        self.given.clear();
    }
}

async fn accept_loop(listener: Arc<TcpListener>, port: u16, shared: Arc<BalancerState>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                // Handed over as a plain socket, so the worker's own event
                // loop watches it.
                let stream = match stream.into_std() {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(source = %ErrorSource::Downstream, port, "accept: {e}");
                        continue;
                    }
                };
                // Far past a cap: dropped here, which closes it.
                let Some(client) = VisitorConnection::admit(peer, port, &shared) else { continue };
                let (index, worker) =
                    shared.workers.iter().enumerate().min_by_key(|(_, w)| w.open.load(Ordering::Relaxed)).expect("at least one worker");
                worker.open.fetch_add(1, Ordering::Relaxed);
                worker.handle.spawn(serve_client(stream, client, peer, port, shared.clone(), index));
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
            Err(e) => {
                // Out of file descriptors or memory: pause rather than spin.
                tracing::warn!(source = %ErrorSource::Downstream, port, "accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Counts a client connection on its worker while it is served.
struct Open(Arc<BalancerState>, usize);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.workers[self.1].open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one visitor's connection (admitted, and counted on `worker`)
/// until it closes, or until shutdown lets its request in flight finish.
async fn serve_client(
    stream: std::net::TcpStream,
    client: Arc<VisitorConnection>,
    peer: SocketAddr,
    port: u16,
    shared: Arc<BalancerState>,
    worker: usize,
) {
    let _open = Open(shared.clone(), worker);
    let stream = match TcpStream::from_std(stream) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(source = %ErrorSource::Downstream, port, "cannot serve a connection: {e}");
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    crate::proxy::visitors::caps::watch_socket(&stream);
    let counters = client.stats.clone();
    let svc = hyper::service::service_fn(move |req| forward::handle(req, client.clone()));
    let stream = crate::proxy::visitors::counted::Counted::new(stream, counters);
    let conn = shared.http.serve_connection(TokioIo::new(stream), svc).with_upgrades();
    tokio::pin!(conn);
    let mut shutdown = shared.shutdown.subscribe();
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = async { drop(shutdown.wait_for(|stop| *stop).await) } => {
            // Closing at once would drop a request already on its way (one
            // accepted but not yet read, or racing onto a keep-alive
            // connection). Such requests are answered, with Connection:
            // close; a connection still idle after the grace is closed.
            match tokio::time::timeout(SHUTDOWN_GRACE, conn.as_mut()).await {
                Ok(r) => r,
                Err(_) => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            }
        }
    };
    if let Err(e) = result {
        // Visitors that go away, send garbage or stall are routine.
        tracing::debug!(source = %ErrorSource::Downstream, port, %peer, "{e}");
    }
}
