//! One listening socket per app, on the app's host and port, following the
//! table: a new app starts listening, a removed one stops (its open
//! connections finish), a changed host moves. Sockets are bound with
//! SO_REUSEADDR and SO_REUSEPORT so a load balancer of a newer build can
//! listen beside this one while it hands over.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::HeaderValue;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;

use super::forward::{self, Client};
use super::handover::Inherited;
use super::shared::{ErrorSource, Shared};
use super::table::Table;

/// Once told to stop, how long a connection may still bring a request (a
/// new connection's first one, or the next on a busy keep-alive one)
/// before an idle connection is closed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Accept queue length of each listening socket.
const BACKLOG: u32 = 1024;

/// The listening sockets, by public port.
#[derive(Default)]
pub struct Listeners {
    /// The accept loop of each port, with the host it is bound to.
    running: HashMap<u16, Running>,
    /// The last bind error of each port that has none running, so a
    /// retry that fails the same way does not log again.
    failed: HashMap<u16, String>,
    /// Set on shutdown: nothing starts listening any more.
    stopped: bool,
    /// Sockets handed over by the load balancer this one replaces, used
    /// instead of binding anew until the first table has been applied.
    inherited: Inherited,
}

/// One port's accept loop.
struct Running {
    /// The address it is bound to.
    host: String,
    /// The socket, shared with the accept loop (kept here so it can be
    /// handed over).
    listener: Arc<TcpListener>,
    /// The accept loop.
    task: JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listeners {
    /// Listeners that start on sockets handed over from the previous load
    /// balancer.
    pub fn inheriting(inherited: Inherited) -> Listeners {
        Listeners { inherited, ..Default::default() }
    }

    /// The listening sockets, for handing over.
    pub fn sockets(&self) -> Vec<(String, u16, RawFd)> {
        self.running.iter().map(|(port, r)| (r.host.clone(), *port, r.listener.as_raw_fd())).collect()
    }

    /// Makes the listening sockets match `table`. A port that cannot be
    /// bound is logged and tried again on the next call.
    pub async fn apply(&mut self, table: &Table, shared: &Arc<Shared>) {
        if self.stopped {
            return;
        }
        let want = table.listen_addrs();
        let gone: Vec<u16> = self.running.keys().filter(|p| !want.contains_key(p)).copied().collect();
        for port in gone {
            if let Some(r) = self.running.remove(&port) {
                tracing::info!(port, host = %r.host, "stopped listening on {}:{port}", r.host);
            }
        }
        self.failed.retain(|p, _| want.contains_key(p));
        for (port, host) in want {
            if self.running.get(&port).is_some_and(|r| r.host == host) {
                continue;
            }
            let socket = match self.inherited.remove(&(host.clone(), port)) {
                Some(s) => {
                    tracing::info!(port, %host, "listening on {host}:{port}, handed over");
                    s.set_nonblocking(true).and_then(|()| TcpListener::from_std(s))
                }
                None => bind(&host, port).await.inspect(|_| tracing::info!(port, %host, "listening on {host}:{port}")),
            };
            match socket {
                Ok(listener) => {
                    let listener = Arc::new(listener);
                    let task = tokio::spawn(accept_loop(listener.clone(), port, shared.clone()));
                    // Bound beside the old socket first (dropping it closes
                    // it), so a moved app refuses no connection in between.
                    self.running.insert(port, Running { host, listener, task });
                    self.failed.remove(&port);
                }
                Err(e) => {
                    let msg = e.to_string();
                    if self.failed.get(&port) != Some(&msg) {
                        tracing::error!(port, %host, "cannot listen on {host}:{port}: {msg}; trying again in a few seconds");
                    }
                    self.failed.insert(port, msg);
                }
            }
        }
        // What the table does not name is not ours to keep open.
        self.inherited.clear();
    }

    /// True when some app of the table could not be bound yet.
    pub fn has_failures(&self) -> bool {
        !self.failed.is_empty()
    }

    /// Closes every listening socket (open connections carry on).
    pub fn stop_all(&mut self) {
        self.stopped = true;
        self.running.clear();
        self.inherited.clear();
    }
}

/// A listening socket on `host:port` with SO_REUSEADDR and SO_REUSEPORT.
async fn bind(host: &str, port: u16) -> io::Result<TcpListener> {
    let host = match host.trim_start_matches('[').trim_end_matches(']') {
        "" | "*" => "0.0.0.0",
        h => h,
    };
    let addr = tokio::net::lookup_host((host, port))
        .await?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address")))?;
    let sock = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    sock.set_reuseaddr(true)?;
    sock.set_reuseport(true)?;
    sock.bind(addr)?;
    sock.listen(BACKLOG)
}

async fn accept_loop(listener: Arc<TcpListener>, port: u16, shared: Arc<Shared>) {
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
                let (index, worker) =
                    shared.workers.iter().enumerate().min_by_key(|(_, w)| w.open.load(Ordering::Relaxed)).expect("at least one worker");
                worker.open.fetch_add(1, Ordering::Relaxed);
                worker.handle.spawn(serve_client(stream, peer, port, shared.clone(), index));
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
struct Open(Arc<Shared>, usize);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.workers[self.1].open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one visitor's connection (already counted on `worker`) until it
/// closes, or until shutdown lets its request in flight finish.
async fn serve_client(stream: std::net::TcpStream, peer: SocketAddr, port: u16, shared: Arc<Shared>, worker: usize) {
    let _open = Open(shared.clone(), worker);
    let stream = match TcpStream::from_std(stream) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(source = %ErrorSource::Downstream, port, "cannot serve a connection: {e}");
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    let client = Arc::new(Client { shared: shared.clone(), port, xff: address_header(peer.ip()) });
    let svc = hyper::service::service_fn(move |req| forward::handle(req, client.clone()));
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

/// The visitor's address as a header value (IPv4 without the `::ffff:`
/// prefix a dual-stack socket gives it).
fn address_header(ip: IpAddr) -> HeaderValue {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(ip.to_canonical().to_string()))
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_written_plainly() {
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(address_header(mapped), "192.0.2.7");
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(address_header(v6), "2001:db8::1");
    }
}
