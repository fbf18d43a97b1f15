//! HTTP/1.1 with JSON bodies over a Unix socket: the one way the processes
//! talk (command → `api.sock`, daemon → `proxy/proxy.sock`, load balancer →
//! `api.sock`).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use std::path::Path;
use std::time::Duration;

/// Nothing listens on a socket: there is no socket file, or no process
/// accepts on it (one left by a process that ended). Any other failure to
/// talk to it is not this.
#[derive(Debug)]
pub struct NotListening(pub std::io::Error);

impl std::fmt::Display for NotListening {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "nothing listens on the socket: {}", self.0)
    }
}

impl std::error::Error for NotListening {}

/// A request's body over the limit [`read_body`] was given.
#[derive(Debug)]
pub struct TooLarge {
    /// The limit, in bytes.
    pub limit: usize,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request's body is over this API's limit of {} bytes", self.limit)
    }
}

impl std::error::Error for TooLarge {}

/// Sends one request and reads the whole answer, within `timeout`. A
/// socket nothing listens on is a [`NotListening`] error.
pub async fn request(
    sock: &Path,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    timeout: Duration,
) -> anyhow::Result<(StatusCode, Bytes)> {
    let fut = async {
        let stream = tokio::net::UnixStream::connect(sock).await.map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => anyhow::Error::new(NotListening(e)),
            _ => anyhow::anyhow!("cannot connect to {}: {e}", sock.display()),
        })?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "shinyctl")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, bytes))
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => anyhow::bail!("{} did not answer within {:?}", sock.display(), timeout),
    }
}

/// Like [`request`], from code that is not async (the command): runs it on
/// a small runtime of its own.
pub fn request_blocking(
    sock: &Path,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    timeout: Duration,
) -> anyhow::Result<(StatusCode, Bytes)> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // The command dies of SIGPIPE on its own output (see main.rs); a daemon
    // that closes the connection early (restarting) is an error to say.
    let _held = crate::sys::sigpipe::Held::new();
    rt.block_on(request(sock, method, path, body, timeout))
}

/// A JSON response with the given status.
pub fn json_response<T: serde::Serialize>(status: StatusCode, value: &T) -> hyper::Response<Full<Bytes>> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new())))
}

/// A bound listener [`serve`] takes connections from: `api.sock`, or the
/// metrics' TCP address.
pub trait Accept: Send + 'static {
    /// A connection.
    type Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    /// The next connection.
    fn next(&self) -> impl std::future::Future<Output = std::io::Result<Self::Stream>> + Send;
}

/// A control socket: a peer of another user ([`peer_refused`]) is answered
/// with a 403 on a task of its own and never handed on.
impl Accept for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn next(&self) -> std::io::Result<Self::Stream> {
        loop {
            let (stream, _) = self.accept().await?;
            match peer_refused(&stream) {
                None => return Ok(stream),
                Some(why) => {
                    let path = self.local_addr().ok().and_then(|a| a.as_pathname().map(|p| p.display().to_string()));
                    tracing::warn!("{} {why}", path.as_deref().unwrap_or("a control socket"));
                    tokio::spawn(async move { refuse(stream, &why).await });
                }
            }
        }
    }
}

impl Accept for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn next(&self) -> std::io::Result<Self::Stream> {
        self.accept().await.map(|(s, _)| s)
    }
}

/// Serves HTTP/1.1 on a bound listener, one task per connection, until the
/// task is dropped.
pub async fn serve<L, F, Fut>(listener: L, handler: F)
where
    L: Accept,
    F: Fn(Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = hyper::Response<Full<Bytes>>> + Send + 'static,
{
    loop {
        match listener.next().await {
            Ok(stream) => serve_connection(stream, handler.clone()),
            // Out of descriptors, for one: try again shortly.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Serves one connection on a task of its own; a request's head must come
/// within 30 s.
fn serve_connection<S, F, Fut>(stream: S, handler: F)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = hyper::Response<Full<Bytes>>> + Send + 'static,
{
    tokio::spawn(async move {
        let io = hyper_util::rt::TokioIo::new(stream);
        let svc = hyper::service::service_fn(move |req| {
            let handler = handler.clone();
            async move { Ok::<_, std::convert::Infallible>(handler(req).await) }
        });
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(Duration::from_secs(30));
        let _ = http.serve_connection(io, svc).await;
    });
}

/// Why a peer on a control socket (api.sock, proxy.sock, handover.sock) is
/// refused, or none. Only processes of this process's own user, and root,
/// may talk to it (SO_PEERCRED, the credentials at connect); and never an
/// app's copy or a process inside one, whatever its uid ([`crate::sys::peer`]):
/// a root daemon's copy, or a `run-as` copy of a user who runs a shinyctl
/// of their own, would otherwise pass the uid check. The sockets' modes and
/// the copies' mount namespaces keep others away first; this holds where
/// no namespace can hide them.
pub fn peer_refused(stream: &tokio::net::UnixStream) -> Option<String> {
    use std::os::fd::AsRawFd;
    let own = nix::unistd::geteuid().as_raw();
    // Taken first: it pins the peer, so its PID cannot name another
    // process by the time /proc is read.
    let pidfd = crate::sys::peer::peer_pidfd(stream.as_raw_fd());
    let cred = match stream.peer_cred() {
        Ok(cred) => cred,
        Err(e) => return Some(format!("refused: the peer's credentials cannot be read: {e}")),
    };
    let pid = cred.pid().and_then(|p| u32::try_from(p).ok()).filter(|&p| p > 0);
    if !peer_allowed(cred.uid(), own) {
        return Some(format!(
            "refused: this socket is for uid {own} (and root) only, and the peer (pid {}) runs as uid {}",
            pid.map_or("unknown".to_string(), |p| p.to_string()),
            cred.uid()
        ));
    }
    let Some(pid) = pid else {
        return Some("refused: the peer's process is not visible from here (another PID namespace)".to_string());
    };
    if let Some(why) = crate::sys::peer::copy_refusal(pid) {
        return Some(format!("refused: {why}"));
    }
    match pidfd.map(|fd| crate::sys::peer::pidfd_pid(&fd)) {
        Some(Some(now)) if now != pid => Some(format!("refused: the peer (pid {pid}) is gone")),
        Some(None) => Some(format!("refused: the peer (pid {pid}) is gone")),
        _ => None,
    }
}

/// True when a peer of uid `peer` may use the control sockets of a process
/// of uid `own`: the same user, or root.
pub fn peer_allowed(peer: u32, own: u32) -> bool {
    peer == own || peer == 0
}

/// Answers a refused peer with a 403 and the reason, then closes. Its
/// request head is read first (16 KiB and 1 s at most): a client still
/// sending when the socket closes would see a broken pipe, not the reason.
async fn refuse(mut stream: tokio::net::UnixStream, why: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while head.len() < 16 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let body = serde_json::json!({ "error": why }).to_string();
    let head =
        format!("HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(format!("{head}{body}").as_bytes())).await;
}

/// Reads a whole request body, refusing more than `limit` bytes (a
/// [`TooLarge`] error).
pub async fn read_body(body: hyper::body::Incoming, limit: usize) -> anyhow::Result<Bytes> {
    let limited = http_body_util::Limited::new(body, limit);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(TooLarge { limit }.into()),
        Err(e) => anyhow::bail!("request body: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_user_and_root_may_talk() {
        assert!(peer_allowed(1000, 1000));
        assert!(peer_allowed(0, 1000), "root");
        assert!(!peer_allowed(1001, 1000));
        assert!(!peer_allowed(1000, 0), "a root daemon takes no other user");
    }

    /// A client of another uid (`setpriv` to nobody, as root runs the
    /// tests) gets a 403 with the reason; one of ours gets the answer. The
    /// socket is made world-writable here, so that only SO_PEERCRED stands
    /// in the way.
    #[test]
    fn a_peer_of_another_uid_is_refused() {
        assert!(nix::unistd::geteuid().is_root(), "this test needs root, to run a client as another user");
        let sock = std::env::temp_dir().join(format!("shinyctl-peercred-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&sock);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let listener = rt.block_on(async { tokio::net::UnixListener::bind(&sock) }).unwrap();
        std::fs::set_permissions(&sock, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        let server = rt.spawn(serve(listener, |_req| async { json_response(StatusCode::OK, &"hello") }));
        let curl = |as_nobody: bool| {
            let mut cmd = std::process::Command::new(if as_nobody { "setpriv" } else { "curl" });
            if as_nobody {
                cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "curl"]);
            }
            cmd.args(["-s", "-w", " %{http_code}", "--max-time", "5", "--unix-socket"]).arg(&sock).arg("http://shinyctl/");
            let out = rt.block_on(async { tokio::task::spawn_blocking(move || cmd.output()).await }).unwrap().expect("curl runs");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert_eq!(curl(false), "\"hello\" 200");
        let refused = curl(true);
        assert!(refused.ends_with(" 403") && refused.contains("runs as uid 65534") && refused.contains("root) only"), "{refused}");
        server.abort();
        let _ = std::fs::remove_file(&sock);
    }
}
