//! The rig: a load balancer, the daemon's stand-in, backends; and a visitor.

use super::*;

/// A load balancer serving one app, `web`, and the daemon it talks to.
pub(crate) struct Rig {
    /// The load balancer.
    pub(crate) proxy: Proxy,
    /// The app's public port.
    pub(crate) port: u16,
    /// What the load balancer asks of the daemon.
    pub(crate) daemon: Daemon,
    /// A folder of this test's own (api.sock), removed when dropped.
    pub(crate) _dir: tempfile::TempDir,
}

/// Starts a load balancer with the table `of(port)` gives for its port.
pub(crate) async fn start(of: impl FnOnce(u16) -> ProxyTable) -> Rig {
    let dir = tempfile::Builder::new().prefix("shinyctl-inproc-").tempdir().unwrap();
    let api_sock = dir.path().join("api.sock");
    let daemon = Daemon::serve(&api_sock);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let proxy = Proxy::start(Settings { api_sock, key: KEY }, of(port), vec![listener]).await.unwrap();
    tokio::spawn(async {
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    Rig { proxy, port, daemon, _dir: dir }
}

/// The table of app `web` on `port`: its policy, whether it sleeps, its
/// request-timeout, and its copies (number, port, role).
pub(crate) fn table(port: u16, policy: LbPolicy, asleep: bool, request_timeout_ms: u64, copies: &[(u32, u16, Role)]) -> ProxyTable {
    ProxyTable {
        apps: vec![ProxyApp {
            name: "web".into(),
            route: shinyctl::manifest::RouteSpec {
                host: "127.0.0.1".parse().unwrap(),
                port,
                lb_policy: policy,
                request_timeout_ms,
                max_connections: 0,
                trusted_proxies: Vec::new(),
            },
            asleep,
            stopped: false,
            down: false,
            listening: true,
            max_sessions: None,
            max_replicas: 0,
            // The copies' "process" is this test's own: alive, so a copy
            // that drops a connection has not died (see `dying_backend`).
            copies: copies.iter().map(|&(copy, port, role)| ProxyCopy { copy, port, role, pid: std::process::id(), r_pid: None }).collect(),
        }],
    }
}

/// One request the load balancer made of the daemon, waiting for its answer.
pub(crate) struct Call {
    /// The route, `/v1/apps/web/wake`.
    pub(crate) path: String,
    /// The JSON body, if any.
    pub(crate) body: serde_json::Value,
    /// The status to answer with; dropping it answers 200.
    pub(crate) answer: oneshot::Sender<StatusCode>,
}

/// The daemon's `api.sock`, as the test plays it.
pub(crate) struct Daemon {
    /// Each request, as it comes.
    pub(crate) calls: mpsc::UnboundedReceiver<Call>,
}

impl Daemon {
    pub(crate) fn serve(sock: &Path) -> Daemon {
        let listener = tokio::net::UnixListener::bind(sock).unwrap();
        let (tx, calls) = mpsc::unbounded_channel();
        tokio::spawn(shinyctl::wire::uds::serve(listener, move |req: hyper::Request<hyper::body::Incoming>| {
            let tx = tx.clone();
            async move {
                let path = req.uri().path().to_string();
                let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let body = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                let (answer, status) = oneshot::channel();
                let _ = tx.send(Call { path, body, answer });
                let status = status.await.unwrap_or(StatusCode::OK);
                let mut resp = Response::new(Full::new(Bytes::from_static(b"{}")));
                *resp.status_mut() = status;
                resp
            }
        }));
        Daemon { calls }
    }

    /// The next request made of the daemon.
    pub(crate) async fn next(&mut self) -> Call {
        timeout(DEADLINE, self.calls.recv()).await.expect("the load balancer called the daemon").expect("the daemon's socket is served")
    }

    /// Fails if the daemon is asked anything within `d`.
    pub(crate) async fn nothing_within(&mut self, d: Duration) {
        if let Ok(Some(call)) = timeout(d, self.calls.recv()).await {
            panic!("the daemon was asked {} {} once more", call.path, call.body);
        }
    }
}

/// A copy: answers `copy=N;` to every request; counts them.
pub(crate) async fn backend(copy: u32) -> (u16, Arc<AtomicUsize>) {
    flaky_backend(copy, 0).await
}

/// A copy whose first `drop_first` connections are closed once a request
/// head has come in, unanswered (a copy dying mid-request); the rest are
/// answered as [`backend`] answers. Counts the requests it read.
pub(crate) async fn flaky_backend(copy: u32, drop_first: usize) -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        for n in 0.. {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            if n < drop_first {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(k) => head.extend_from_slice(&buf[..k]),
                    }
                }
                counter.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            let counter = counter.clone();
            let svc = hyper::service::service_fn(move |_req| {
                counter.fetch_add(1, Ordering::SeqCst);
                async move { Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(format!("copy={copy};"))))) }
            });
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc));
        }
    });
    (port, seen)
}

/// Waits until `cond` holds, looking again each millisecond of the
/// runtime's clock (which a paused clock advances) and failing after 10 s
/// of the real one: what a test waits for on real sockets, instead of a
/// sleep it hopes is long enough.
pub(crate) async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A port nothing listens on: a copy there refuses every connection.
pub(crate) fn dead_port() -> u16 {
    // Bound and never listening: a connection is refused, as by a dead
    // copy, and no other socket takes the port while the tests run (the
    // socket is kept open for the life of the test process).
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
    let port = s.local_addr().unwrap().as_socket().unwrap().port();
    std::mem::forget(s);
    port
}

// ---------------------------------------------------------------------------
// A visitor
// ---------------------------------------------------------------------------

/// An answer as the visitor got it.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    /// Header lines, as sent.
    pub(crate) head: Vec<String>,
    pub(crate) body: String,
}

impl Answer {
    /// The value of header `name`.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.head.iter().find_map(|l| l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()))
    }

    /// The `lb_<port>=…` pair the load balancer placed the visitor with.
    pub(crate) fn placed(&self) -> Option<String> {
        self.header("set-cookie").map(|v| v.split(';').next().unwrap_or("").to_string())
    }

    /// The copy that answered (`copy=N;` in the body).
    pub(crate) fn copy(&self) -> u32 {
        let digits = self.body.split("copy=").nth(1).and_then(|r| r.split(';').next());
        digits.and_then(|d| d.parse().ok()).unwrap_or_else(|| panic!("not a copy's answer: {self:?}"))
    }
}

/// `method /` on the load balancer with `cookie` (a `name=value` pair) and
/// `body`, on a connection of its own.
pub(crate) async fn request(port: u16, method: &str, cookie: Option<&str>, body: &str) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut req = format!("{method} / HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    if let Some(c) = cookie {
        req.push_str(&format!("Cookie: {c}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    timeout(DEADLINE, stream.read_to_end(&mut raw)).await.expect("an answer").unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP answer: {raw:?}"));
    let mut lines = head.lines();
    let status =
        lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("status line: {raw:?}"));
    Answer { status, head: lines.map(String::from).collect(), body: body.to_string() }
}

/// `GET /` with `cookie`.
pub(crate) async fn get(port: u16, cookie: Option<&str>) -> Answer {
    request(port, "GET", cookie, "").await
}

// Raw requests and backends the hostile-client tests (and capacity) use.

/// Sends `raw` (a whole request, head and body) on a new connection and
/// reads the answer to the end.
pub(crate) async fn raw_request(port: u16, raw: &str) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream.write_all(raw.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    timeout(DEADLINE, stream.read_to_end(&mut got)).await.expect("an answer").unwrap();
    let got = String::from_utf8_lossy(&got).into_owned();
    let (head, body) = got.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP answer: {got:?}"));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).unwrap_or(0);
    Answer { status, head: lines.map(String::from).collect(), body: body.to_string() }
}

/// `GET path` with `Connection: close` and the extra header lines `extra`.
pub(crate) async fn get_path(port: u16, path: &str, extra: &str) -> Answer {
    raw_request(port, &format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n{extra}\r\n")).await
}

/// A copy that answers `copy=N;` and then the request's header lines, one
/// a line, as it got them.
pub(crate) async fn echo_backend(copy: u32) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| async move {
                let mut body = format!("copy={copy};\n");
                for (name, value) in req.headers() {
                    body.push_str(&format!("{name}: {}\n", value.to_str().unwrap_or("?")));
                }
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(body))))
            });
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc));
        }
    });
    port
}

/// A copy that answers as [`backend`] does, except while `frozen` is set:
/// then requests wait (a copy whose kernel accepts while R does not run).
/// Also counts its open connections.
pub(crate) async fn freezable_backend(copy: u32) -> (u16, Arc<std::sync::atomic::AtomicBool>, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let frozen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let open = Arc::new(AtomicUsize::new(0));
    let (f, o) = (frozen.clone(), open.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let f = f.clone();
            let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let f = f.clone();
                async move {
                    // The whole body first, as a Shiny upload is read.
                    let _ = req.into_body().collect().await;
                    while f.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(format!("copy={copy};")))))
                }
            });
            let o = o.clone();
            o.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                o.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (port, frozen, open)
}

/// True once the load balancer has closed `stream` (a read gives EOF or an
/// error), within `within`.
pub(crate) async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let mut buf = vec![0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // An answer (a 408 or the like) before the close.
            Ok(Ok(_)) => continue,
        }
    }
}

/// A copy of raw sockets: each connection is served by `serve` on a task
/// of its own, with the counter it may count requests with (returned).
pub(crate) async fn raw_backend<F, Fut>(serve: F) -> (u16, Arc<AtomicUsize>)
where
    F: Fn(tokio::net::TcpStream, Arc<AtomicUsize>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, counter.clone()));
        }
    });
    (port, seen)
}
