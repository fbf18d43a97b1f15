//! One listening socket per app, on the app's host and port, following the
//! table: a new app starts listening, a removed one stops (its open
//! connections finish), a changed host moves. Sockets are bound with
//! SO_REUSEADDR and SO_REUSEPORT so a load balancer of a newer build can
//! listen beside this one while it hands over.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::HeaderValue;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;

use super::forward::{self, Client};
use super::table::Table;
use super::{ErrorSource, Shared};

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
}

/// One port's accept loop.
struct Running {
    /// The address it is bound to.
    host: String,
    /// The accept loop; aborting it closes the socket.
    task: JoinHandle<()>,
}

impl Listeners {
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
                r.task.abort();
                tracing::info!(port, host = %r.host, "stopped listening on {}:{port}", r.host);
            }
        }
        self.failed.retain(|p, _| want.contains_key(p));
        for (port, host) in want {
            if self.running.get(&port).is_some_and(|r| r.host == host) {
                continue;
            }
            match bind(&host, port).await {
                Ok(listener) => {
                    let task = tokio::spawn(accept_loop(listener, port, shared.clone()));
                    tracing::info!(port, %host, "listening on {host}:{port}");
                    // Bound beside the old socket first, so a moved app
                    // refuses no connection in between.
                    if let Some(old) = self.running.insert(port, Running { host, task }) {
                        old.task.abort();
                    }
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
    }

    /// True when some app of the table could not be bound yet.
    pub fn has_failures(&self) -> bool {
        !self.failed.is_empty()
    }

    /// Closes every listening socket (open connections carry on).
    pub fn stop_all(&mut self) {
        self.stopped = true;
        for (_, r) in self.running.drain() {
            r.task.abort();
        }
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

async fn accept_loop(listener: TcpListener, port: u16, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                tokio::spawn(serve_client(stream, peer, port, shared.clone()));
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

/// Counts a client connection while it is served.
struct Open(Arc<Shared>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one visitor's connection until it closes, or until shutdown
/// lets its request in flight finish.
async fn serve_client(stream: TcpStream, peer: SocketAddr, port: u16, shared: Arc<Shared>) {
    shared.open.fetch_add(1, Ordering::Relaxed);
    let _open = Open(shared.clone());
    let _ = stream.set_nodelay(true);
    let client = Arc::new(Client { shared: shared.clone(), port, xff: address_header(peer.ip()) });
    let svc = hyper::service::service_fn(move |req| forward::handle(req, client.clone()));
    let conn = shared.http.serve_connection(TokioIo::new(stream), svc).with_upgrades();
    tokio::pin!(conn);
    let mut shutdown = shared.shutdown.subscribe();
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = async { drop(shutdown.wait_for(|stop| *stop).await) } => {
            conn.as_mut().graceful_shutdown();
            conn.await
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
