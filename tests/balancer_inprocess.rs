//! The load balancer in-process, as tokio-rs/mini-redis tests its server:
//! `proxy::Proxy` on a port of its own in front of small hyper backends and
//! a stand-in for the daemon's `api.sock`, all in this test's runtime, with
//! tokio's clock paused. No R and no other process: the hold, the stand-in,
//! retries and timeouts run in milliseconds.
//!
//! Paused time moves on its own only when every task waits; it then jumps
//! to the next timer. A task woken by a socket in that same instant sees
//! the jump too, so each test runs a metronome (a 10 ms timer, always
//! pending) that keeps every jump to 10 ms: times are then exact to a few
//! ticks, and a 15 s hold is 1,500 quick turns of the runtime.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{timeout, Instant};

use shinyctl::proxy::{Proxy, Settings};
use shinyctl::wire::{LbPolicy, ProxyApp, ProxyCopy, ProxyTable, Role};

/// Any wait in these tests: far above what any of them takes.
const DEADLINE: Duration = Duration::from_secs(120);
/// The sticky cookie's key.
const KEY: [u8; 32] = [7; 32];

// ---------------------------------------------------------------------------
// The rig: a load balancer, the daemon's stand-in, backends
// ---------------------------------------------------------------------------

/// A load balancer serving one app, `web`, and the daemon it talks to.
struct Rig {
    /// The load balancer.
    proxy: Proxy,
    /// The app's public port.
    port: u16,
    /// What the load balancer asks of the daemon.
    daemon: Daemon,
    /// A folder of this test's own (api.sock), removed when dropped.
    _dir: tempfile::TempDir,
}

/// Starts a load balancer with the table `of(port)` gives for its port.
async fn start(of: impl FnOnce(u16) -> ProxyTable) -> Rig {
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
fn table(port: u16, policy: LbPolicy, asleep: bool, request_timeout_ms: u64, copies: &[(u32, u16, Role)]) -> ProxyTable {
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
struct Call {
    /// The route, `/v1/apps/web/wake`.
    path: String,
    /// The JSON body, if any.
    body: serde_json::Value,
    /// The status to answer with; dropping it answers 200.
    answer: oneshot::Sender<StatusCode>,
}

/// The daemon's `api.sock`, as the test plays it.
struct Daemon {
    /// Each request, as it comes.
    calls: mpsc::UnboundedReceiver<Call>,
}

impl Daemon {
    fn serve(sock: &Path) -> Daemon {
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
    async fn next(&mut self) -> Call {
        timeout(DEADLINE, self.calls.recv()).await.expect("the load balancer called the daemon").expect("the daemon's socket is served")
    }

    /// Fails if the daemon is asked anything within `d`.
    async fn nothing_within(&mut self, d: Duration) {
        if let Ok(Some(call)) = timeout(d, self.calls.recv()).await {
            panic!("the daemon was asked {} {} once more", call.path, call.body);
        }
    }
}

/// A copy: answers `copy=N;` to every request; counts them.
async fn backend(copy: u32) -> (u16, Arc<AtomicUsize>) {
    flaky_backend(copy, 0).await
}

/// A copy whose first `drop_first` connections are closed once a request
/// head has come in, unanswered (a copy dying mid-request); the rest are
/// answered as [`backend`] answers. Counts the requests it read.
async fn flaky_backend(copy: u32, drop_first: usize) -> (u16, Arc<AtomicUsize>) {
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
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A port nothing listens on: a copy there refuses every connection.
fn dead_port() -> u16 {
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
struct Answer {
    status: u16,
    /// Header lines, as sent.
    head: Vec<String>,
    body: String,
}

impl Answer {
    /// The value of header `name`.
    fn header(&self, name: &str) -> Option<&str> {
        self.head.iter().find_map(|l| l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()))
    }

    /// The `lb_<port>=…` pair the load balancer placed the visitor with.
    fn placed(&self) -> Option<String> {
        self.header("set-cookie").map(|v| v.split(';').next().unwrap_or("").to_string())
    }

    /// The copy that answered (`copy=N;` in the body).
    fn copy(&self) -> u32 {
        let digits = self.body.split("copy=").nth(1).and_then(|r| r.split(';').next());
        digits.and_then(|d| d.parse().ok()).unwrap_or_else(|| panic!("not a copy's answer: {self:?}"))
    }
}

/// `method /` on the load balancer with `cookie` (a `name=value` pair) and
/// `body`, on a connection of its own.
async fn request(port: u16, method: &str, cookie: Option<&str>, body: &str) -> Answer {
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
async fn get(port: u16, cookie: Option<&str>) -> Answer {
    request(port, "GET", cookie, "").await
}

// ---------------------------------------------------------------------------
// Sticky sessions
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_sticky_cookie_keeps_a_visitor_on_its_copy() {
    let (one, _) = backend(1).await;
    let (two, _) = backend(2).await;
    let rig = start(|port| table(port, LbPolicy::RoundRobin, false, 30_000, &[(1, one, Role::Active), (2, two, Role::Active)])).await;
    // New visitors alternate, so only the cookie can keep one in place.
    let first = get(rig.port, None).await;
    let second = get(rig.port, None).await;
    assert_ne!(first.copy(), second.copy(), "round-robin places new visitors on both copies");
    let cookie = first.placed().expect("a new visitor is placed");
    assert!(cookie.starts_with(&format!("lb_{}={}.", rig.port, first.copy())), "{cookie}");
    for attr in ["HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(first.header("set-cookie").unwrap().contains(attr), "{attr} in {first:?}");
    }
    for _ in 0..10 {
        let again = get(rig.port, Some(&cookie)).await;
        assert_eq!(again.copy(), first.copy(), "the visitor stays on its copy");
        assert_eq!(again.placed(), None, "a placed visitor is not placed again");
    }
}

#[tokio::test(start_paused = true)]
async fn a_forged_cookie_is_replaced_by_a_genuine_one() {
    let (one, _) = backend(1).await;
    let (two, _) = backend(2).await;
    let copies = [(1, one, Role::Active), (2, two, Role::Active)];
    let rig = start(|port| table(port, LbPolicy::RoundRobin, false, 30_000, &copies)).await;
    let mut genuine = [get(rig.port, None).await, get(rig.port, None).await];
    genuine.sort_by_key(|a| a.copy());
    let [for_one, for_two] = genuine.map(|a| a.placed().expect("placed"));
    // From now on a new visitor always gets copy 1: a cookie that moves
    // anyone to copy 2 was honoured.
    rig.proxy.push(table(rig.port, LbPolicy::First, false, 30_000, &copies)).await;
    let honoured = get(rig.port, Some(&for_two)).await;
    assert_eq!((honoured.copy(), honoured.placed()), (2, None), "a genuine cookie for copy 2 is honoured");

    let mac_of_one = for_one.split_once('.').unwrap().1;
    let name = format!("lb_{}", rig.port);
    for forged in [
        format!("{name}=2.{mac_of_one}"),
        format!("{name}=2.{}", "0".repeat(64)),
        format!("{name}=2.x"),
        format!("{name}=02.{}", for_two.split_once('.').unwrap().1),
    ] {
        let a = get(rig.port, Some(&forged)).await;
        assert_eq!(a.copy(), 1, "{forged} is not honoured");
        assert_eq!(a.placed().as_deref(), Some(for_one.as_str()), "{forged} is replaced by a genuine cookie");
    }
}

// ---------------------------------------------------------------------------
// Stand-ins and retries
// ---------------------------------------------------------------------------

// The real clock: with real sockets a paused one jumps to the next timer
// whenever the runtime waits on them, which a loaded machine makes likely.
#[tokio::test]
async fn a_refused_connect_goes_at_once_to_the_warm_copy_and_the_daemon_is_told() {
    let (warm, warm_seen) = backend(2).await;
    let mut rig =
        start(|port| table(port, LbPolicy::LeastConn, false, 30_000, &[(1, dead_port(), Role::Active), (2, warm, Role::Warm)])).await;
    let t = Instant::now();
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.copy()), (200, 2), "{a:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "sent on at once, not held 15 s: {:?}", t.elapsed());
    assert!(a.placed().unwrap().starts_with(&format!("lb_{}=2.", rig.port)), "the visitor is placed on the stand-in");
    let call = rig.daemon.next().await;
    assert_eq!(call.path, "/v1/apps/web/stand-in");
    assert_eq!(call.body, serde_json::json!({"down": 1, "stand_in": 2}));
    drop(call);

    // Copy 1 is marked down: the next visitor goes straight to the warm
    // copy, and the daemon is not told twice.
    let b = get(rig.port, None).await;
    assert_eq!(b.copy(), 2);
    assert_eq!(warm_seen.load(Ordering::SeqCst), 2);
    rig.daemon.nothing_within(Duration::from_secs(2)).await;
}

#[tokio::test(start_paused = true)]
async fn a_request_lost_on_a_dying_connection_is_sent_again_unless_it_had_a_body() {
    let (port, seen) = flaky_backend(1, 1).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, port, Role::Active)])).await;
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.copy()), (200, 1), "{a:?}");
    assert_eq!(seen.load(Ordering::SeqCst), 2, "lost once, then answered");

    let (port, seen) = flaky_backend(1, 1).await;
    rig.proxy.push(table(rig.port, LbPolicy::First, false, 30_000, &[(1, port, Role::Active)])).await;
    let b = request(rig.port, "POST", None, "x=1").await;
    assert_eq!(b.status, 502, "a body cannot be sent twice: {b:?}");
    assert_eq!(seen.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------
// Holding a request
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn with_no_copy_up_a_request_is_held_until_a_table_brings_one() {
    let rig = start(|port| table(port, LbPolicy::LeastConn, false, 30_000, &[])).await;
    let (one, _) = backend(1).await;
    let t = Instant::now();
    let held = tokio::spawn(get(rig.port, None));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!held.is_finished(), "held while no copy can take it");
    rig.proxy.push(table(rig.port, LbPolicy::LeastConn, false, 30_000, &[(1, one, Role::Active)])).await;
    let a = held.await.unwrap();
    assert_eq!((a.status, a.copy()), (200, 1), "{a:?}");
    assert!(t.elapsed() < Duration::from_millis(10_500), "answered as the table came: {:?}", t.elapsed());
}

// The real clock, as above.
#[tokio::test]
async fn a_request_that_reaches_an_app_being_deleted_is_answered_by_its_draining_copy() {
    // `delete` (with or without --now): the port closes, the copies drain
    // for a moment at least. A request on a connection accepted before
    // that (a keep-alive one here) is answered, not held for a copy that
    // will never come.
    let (one, _) = backend(1).await;
    let rig = start(|port| table(port, LbPolicy::LeastConn, false, 30_000, &[(1, one, Role::Active)])).await;
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", rig.port)).await.unwrap();
    stream.write_all(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("copy=1;") {
        let mut buf = [0u8; 4096];
        let n = timeout(DEADLINE, stream.read(&mut buf)).await.expect("an answer").unwrap();
        assert!(n > 0, "the first answer: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let mut deleting = table(rig.port, LbPolicy::LeastConn, false, 30_000, &[(1, one, Role::Draining)]);
    deleting.apps[0].listening = false;
    rig.proxy.push(deleting).await;
    let t = Instant::now();
    stream.write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut raw = Vec::new();
    timeout(DEADLINE, stream.read_to_end(&mut raw)).await.expect("an answer").unwrap();
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.starts_with("HTTP/1.1 200") && raw.contains("copy=1;"), "{raw}");
    assert!(t.elapsed() < Duration::from_secs(5), "at once, not after a 15 s hold: {:?}", t.elapsed());
    // While the app listens, a draining copy still gets no new visitor.
    let (two, _) = backend(2).await;
    rig.proxy.push(table(rig.port, LbPolicy::LeastConn, false, 30_000, &[(1, one, Role::Draining), (2, two, Role::Active)])).await;
    assert_eq!(get(rig.port, None).await.copy(), 2);
}

#[tokio::test(start_paused = true)]
async fn past_the_15_s_hold_a_request_gets_the_restarting_page() {
    // README, "Staying up": "a request waits up to 15 seconds".
    let mut rig = start(|port| table(port, LbPolicy::LeastConn, false, 30_000, &[(1, dead_port(), Role::Active)])).await;
    let t = Instant::now();
    let held = tokio::spawn(get(rig.port, None));
    let call = rig.daemon.next().await;
    assert_eq!((call.path.as_str(), &call.body), ("/v1/apps/web/stand-in", &serde_json::json!({"down": 1, "stand_in": null})));
    tokio::time::sleep_until(t + Duration::from_millis(14_800)).await;
    assert!(!held.is_finished(), "still held at 14.8 s");
    let a = held.await.unwrap();
    assert_eq!(a.status, 503, "{a:?}");
    assert!(a.body.contains("web is restarting"), "{a:?}");
    assert_eq!(a.header("retry-after"), Some("5"));
    assert!(t.elapsed() < Duration::from_millis(15_500), "answered at 15 s: {:?}", t.elapsed());
}

// ---------------------------------------------------------------------------
// Waking a sleeping app
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn requests_for_a_sleeping_app_share_one_wake() {
    let mut rig = start(|port| table(port, LbPolicy::LeastConn, true, 30_000, &[])).await;
    let held: Vec<_> = (0..4).map(|_| tokio::spawn(get(rig.port, None))).collect();
    let wake = rig.daemon.next().await;
    assert_eq!(wake.path, "/v1/apps/web/wake");
    // All four arrive and join the wake before it ends.
    until("the four visitors to be taken in", || rig.proxy.open_connections() == 4).await;
    assert!(held.iter().all(|h| !h.is_finished()), "held while the app wakes");
    let (one, seen) = backend(1).await;
    rig.proxy.push(table(rig.port, LbPolicy::LeastConn, false, 30_000, &[(1, one, Role::Active)])).await;
    wake.answer.send(StatusCode::OK).unwrap();
    for h in held {
        let a = h.await.unwrap();
        assert_eq!((a.status, a.copy()), (200, 1), "{a:?}");
    }
    assert_eq!(seen.load(Ordering::SeqCst), 4);
    rig.daemon.nothing_within(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn a_wake_slower_than_the_request_timeout_is_a_504_and_the_wait_is_capped_at_30_s() {
    // README, "Sleep": held up to the request-timeout, 30 seconds at
    // most.
    for (request_timeout_ms, waited) in [(5_000, Duration::from_secs(5)), (60_000, Duration::from_secs(30))] {
        let mut rig = start(|port| table(port, LbPolicy::LeastConn, true, request_timeout_ms, &[])).await;
        let t = Instant::now();
        let held = tokio::spawn(get(rig.port, None));
        // Never answered while the request waits.
        let _wake = rig.daemon.next().await;
        tokio::time::sleep_until(t + waited - Duration::from_millis(200)).await;
        assert!(!held.is_finished(), "still waiting for the wake ({request_timeout_ms} ms)");
        let a = held.await.unwrap();
        assert_eq!(a.status, 504, "{a:?}");
        assert!(a.body.contains("web is still waking up"), "{a:?}");
        assert!(t.elapsed() < waited + Duration::from_millis(500), "answered at {waited:?}: {:?}", t.elapsed());
    }
}

#[tokio::test(start_paused = true)]
async fn a_wake_that_fails_is_a_503() {
    let mut rig = start(|port| table(port, LbPolicy::LeastConn, true, 30_000, &[])).await;
    let held = tokio::spawn(get(rig.port, None));
    let wake = rig.daemon.next().await;
    assert_eq!(wake.path, "/v1/apps/web/wake");
    wake.answer.send(StatusCode::SERVICE_UNAVAILABLE).unwrap();
    let a = held.await.unwrap();
    assert_eq!(a.status, 503, "{a:?}");
    assert!(a.body.contains("web did not start"), "{a:?}");
}

// ---------------------------------------------------------------------------
// Bounded under hostile clients (issue 8): retries and deaths, forwarded
// headers, connection caps, limits by progress, stalled copies
// ---------------------------------------------------------------------------

/// Sends `raw` (a whole request, head and body) on a new connection and
/// reads the answer to the end.
async fn raw_request(port: u16, raw: &str) -> Answer {
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
async fn get_path(port: u16, path: &str, extra: &str) -> Answer {
    raw_request(port, &format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n{extra}\r\n")).await
}

/// A copy that answers `copy=N;` and then the request's header lines, one
/// a line, as it got them.
async fn echo_backend(copy: u32) -> u16 {
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
async fn freezable_backend(copy: u32) -> (u16, Arc<std::sync::atomic::AtomicBool>, Arc<AtomicUsize>) {
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
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
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

#[tokio::test(start_paused = true)]
async fn a_lost_get_is_sent_once_to_another_copy_and_a_post_never() {
    let (one, one_seen) = flaky_backend(1, 1).await;
    let (two, two_seen) = backend(2).await;
    let copies = [(1, one, Role::Active), (2, two, Role::Active)];
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &copies)).await;
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.copy()), (200, 2), "{a:?}");
    assert_eq!((one_seen.load(Ordering::SeqCst), two_seen.load(Ordering::SeqCst)), (1, 1), "lost on copy 1, answered by copy 2");

    let (one, one_seen) = flaky_backend(1, usize::MAX).await;
    rig.proxy.push(table(rig.port, LbPolicy::First, false, 30_000, &[(1, one, Role::Active), (2, two, Role::Active)])).await;
    for method in ["POST", "PUT", "DELETE"] {
        let before = two_seen.load(Ordering::SeqCst);
        let b = request(rig.port, method, None, "").await;
        assert_eq!(b.status, 502, "{method}: {b:?}");
        assert_eq!(two_seen.load(Ordering::SeqCst), before, "{method} is never sent again");
    }
    let lost_twice = get(rig.port, None).await;
    assert_eq!(lost_twice.copy(), 2);
    assert_eq!(one_seen.load(Ordering::SeqCst), 4, "each request reached copy 1 once");
}

#[tokio::test(start_paused = true)]
async fn a_request_in_flight_at_two_copy_deaths_is_answered_502_at_once_for_a_minute() {
    // Copies 1 and 2 die with every request (their process is gone: a pid
    // no process has); copy 3 is healthy.
    let (one, one_seen) = flaky_backend(1, usize::MAX).await;
    let (two, two_seen) = flaky_backend(2, usize::MAX).await;
    let (three, three_seen) = backend(3).await;
    let deaths = |p| {
        let mut t = table(p, LbPolicy::First, false, 30_000, &[(1, one, Role::Active), (2, two, Role::Warm), (3, three, Role::Active)]);
        for c in t.apps[0].copies.iter_mut().filter(|c| c.copy != 3) {
            c.pid = u32::MAX - 1;
        }
        t
    };
    let rig = start(deaths).await;
    let a = get_path(rig.port, "/crash?x=1", "").await;
    assert_eq!(a.status, 502, "{a:?}");
    assert_eq!((one_seen.load(Ordering::SeqCst), two_seen.load(Ordering::SeqCst)), (1, 1), "it cost two copies");
    // Measured on the real clock: the paused one jumps while real sockets are waited on.
    let t = std::time::Instant::now();
    let again = get_path(rig.port, "/crash?x=1", "").await;
    assert_eq!(again.status, 502, "{again:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "at once: {:?}", t.elapsed());
    assert_eq!(one_seen.load(Ordering::SeqCst) + two_seen.load(Ordering::SeqCst) + three_seen.load(Ordering::SeqCst), 2, "no copy saw it");
    let other = get_path(rig.port, "/crash?x=2", "").await;
    assert_eq!((other.status, other.copy()), (200, 3), "the app keeps answering other requests");
    let refusing = &rig.proxy.traffic()[0].refusing;
    assert_eq!(refusing.len(), 1);
    assert_eq!(refusing[0].request, "GET /crash?x=1");
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert!(rig.proxy.traffic()[0].refusing.is_empty(), "a minute later it is no longer refused");
}

#[tokio::test(start_paused = true)]
async fn a_visitors_forwarded_headers_never_reach_the_copy_and_a_trusted_proxys_do() {
    let one = echo_backend(1).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, one, Role::Active)])).await;
    let spoof = "Forwarded: for=6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Host: evil\r\n\
                 X-Forwarded-Port: 1\r\nX-Forwarded-Proto: https\r\nConnection: keep-alive\r\nConnection: X-Secret\r\nX-Secret: 1\r\n";
    let a = get_path(rig.port, "/", spoof).await;
    assert!(!a.body.contains("6.6.6.6") && !a.body.contains("evil") && !a.body.contains("x-secret"), "{}", a.body);
    for line in ["x-forwarded-for: 127.0.0.1", "x-real-ip: 127.0.0.1", "x-forwarded-proto: http"] {
        assert!(a.body.contains(line), "{line} in {}", a.body);
    }
    let mut trusting = table(rig.port, LbPolicy::First, false, 30_000, &[(1, one, Role::Active)]);
    trusting.apps[0].route.trusted_proxies = vec![shinyctl::manifest::Cidr::parse("127.0.0.0/8").unwrap()];
    rig.proxy.push(trusting).await;
    let b = get_path(rig.port, "/", "X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\n").await;
    assert!(b.body.contains("x-forwarded-for: 203.0.113.9, 127.0.0.1"), "{}", b.body);
    assert!(b.body.contains("x-forwarded-proto: https"), "{}", b.body);
}

#[tokio::test(start_paused = true)]
async fn past_max_connections_a_visitor_gets_a_plain_503_with_retry_after() {
    let (one, _) = backend(1).await;
    let mut capped = table(0, LbPolicy::First, false, 30_000, &[(1, one, Role::Active)]);
    capped.apps[0].route.max_connections = 2;
    let rig = start(|p| {
        capped.apps[0].route.port = p;
        capped
    })
    .await;
    let idle: Vec<_> = [0, 1].map(|_| std::net::TcpStream::connect(("127.0.0.1", rig.port)).unwrap()).into_iter().collect();
    // Accepted and counted in the load balancer's own time.
    until("the two idle connections to be counted", || rig.proxy.open_connections() == 2).await;
    let over = get(rig.port, None).await;
    assert_eq!(over.status, 503, "{over:?}");
    assert_eq!(over.header("retry-after"), Some("5"), "{over:?}");
    drop(idle);
    until("the two idle connections to be let go", || rig.proxy.open_connections() == 0).await;
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.copy()), (200, 1), "room again once they closed: {a:?}");
}

#[tokio::test(start_paused = true)]
async fn a_request_body_that_stops_moving_is_cut_after_60_s_not_before() {
    let (one, _frozen, open) = freezable_backend(1).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, one, Role::Active)])).await;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", rig.port)).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789").await.unwrap();
    // A slow visitor: ten bytes every 50 s is progress, for minutes.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(50)).await;
        s.write_all(b"0123456789").await.unwrap();
    }
    assert_eq!(open.load(Ordering::SeqCst), 1, "the copy still has the slow upload after 150 s");
    let t = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(75)).await, "a body stalled for 60 s is cut");
    assert!(t.elapsed() >= Duration::from_secs(59), "not before 60 s without a byte: {:?}", t.elapsed());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(open.load(Ordering::SeqCst), 0, "and the copy's connection is freed");
}

#[tokio::test(start_paused = true)]
async fn slow_headers_and_idle_keep_alive_connections_are_closed() {
    let (one, _) = backend(1).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, one, Role::Active)])).await;
    let mut slow = tokio::net::TcpStream::connect(("127.0.0.1", rig.port)).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n").await.unwrap();
    let t = Instant::now();
    assert!(closed_within(&mut slow, Duration::from_secs(40)).await, "a head not sent within 30 s closes the connection");
    assert!(t.elapsed() >= Duration::from_secs(29), "{:?}", t.elapsed());

    let mut kept = tokio::net::TcpStream::connect(("127.0.0.1", rig.port)).await.unwrap();
    kept.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").await.unwrap();
    let t = Instant::now();
    assert!(closed_within(&mut kept, Duration::from_secs(40)).await, "an idle keep-alive connection is closed");
    assert!(t.elapsed() >= Duration::from_secs(29), "{:?}", t.elapsed());
}

#[tokio::test(start_paused = true)]
async fn idle_connections_to_copies_expire() {
    let (one, _frozen, open) = freezable_backend(1).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, one, Role::Active)])).await;
    for _ in 0..3 {
        assert_eq!(get(rig.port, None).await.copy(), 1);
    }
    assert_eq!(open.load(Ordering::SeqCst), 1, "one pooled connection, reused");
    tokio::time::sleep(Duration::from_secs(45)).await;
    assert_eq!(open.load(Ordering::SeqCst), 0, "closed after 30 s idle (swept every 10 s)");
    assert_eq!(get(rig.port, None).await.copy(), 1, "a new one is opened when needed");
}

#[tokio::test(start_paused = true)]
async fn a_stalled_copy_keeps_its_visitors_gets_no_new_ones_and_is_used_again_once_it_answers() {
    let (one, frozen, _) = freezable_backend(1).await;
    let (two, _) = backend(2).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, one, Role::Active), (2, two, Role::Active)])).await;
    let placed = get(rig.port, None).await;
    assert_eq!(placed.copy(), 1);
    let cookie = placed.placed().unwrap();
    let rig_port = rig.port;
    frozen.store(true, Ordering::SeqCst);
    let stuck = tokio::spawn(get(rig.port, None));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!stuck.is_finished(), "the frozen copy holds its request");
    let early = tokio::spawn(get(rig.port, None));
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    // Measured on the real clock: the paused one jumps while real sockets are waited on.
    let t = std::time::Instant::now();
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.copy()), (200, 2), "past 5 s without an answer, new visitors go elsewhere: {a:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "at once, not waiting on the stalled copy: {:?}", t.elapsed());
    let silent = rig.proxy.traffic()[0].copies.iter().find(|c| c.copy == 1).unwrap().silent_ms;
    assert!((5_000..7_000).contains(&silent), "the daemon learns it: {silent} ms");
    // Its own visitor stays (and waits with it).
    let own = tokio::spawn(async move { get(rig_port, Some(&cookie)).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!own.is_finished(), "a placed visitor stays on its copy");
    frozen.store(false, Ordering::SeqCst);
    for h in [stuck, early, own] {
        assert_eq!(h.await.unwrap().copy(), 1, "answered once it runs again");
    }
    // The probe (or those answers) clears it: new visitors come back.
    until("copy 1 to be heard again", || rig.proxy.traffic()[0].copies[0].silent_ms == 0).await;
    assert_eq!(get(rig.port, None).await.copy(), 1, "used again once it answers");
    assert_eq!(rig.proxy.traffic()[0].copies[0].silent_ms, 0);
}

#[tokio::test(start_paused = true)]
async fn when_every_copy_is_stalled_new_visitors_go_to_the_one_that_answered_last() {
    let (one, frozen_one, _) = freezable_backend(1).await;
    let (two, frozen_two, _) = freezable_backend(2).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, one, Role::Active), (2, two, Role::Active)])).await;
    frozen_one.store(true, Ordering::SeqCst);
    let _stuck_one = tokio::spawn(get(rig.port, None));
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(get(rig.port, None).await.copy(), 2, "copy 2 answers");
    frozen_two.store(true, Ordering::SeqCst);
    let _stuck_two = tokio::spawn(get(rig.port, None));
    tokio::time::sleep(Duration::from_secs(6)).await;
    let next = tokio::spawn(get(rig.port, None));
    tokio::time::sleep(Duration::from_millis(100)).await;
    frozen_two.store(false, Ordering::SeqCst);
    assert_eq!(next.await.unwrap().copy(), 2, "both stalled: the one that answered most recently");
}

// ---------------------------------------------------------------------------
// Capacity (README, "Capacity")
// ---------------------------------------------------------------------------

/// [`table`] with `max-sessions` and `max-replicas`.
fn capacity_table(port: u16, max_sessions: u32, max_replicas: u32, request_timeout_ms: u64, copies: &[(u32, u16, Role)]) -> ProxyTable {
    let mut t = table(port, LbPolicy::LeastConn, false, request_timeout_ms, copies);
    t.apps[0].max_sessions = Some(max_sessions);
    t.apps[0].max_replicas = max_replicas;
    t
}

#[tokio::test(start_paused = true)]
async fn a_visitor_past_every_active_copys_max_sessions_goes_to_the_spare_at_once_and_the_daemon_is_told_once() {
    let (one, _) = backend(1).await;
    let (two, _) = backend(2).await;
    let mut rig = start(|port| capacity_table(port, 2, 3, 30_000, &[(1, one, Role::Active), (2, two, Role::Warm)])).await;
    // Two page loads fill copy 1: each counts until its WebSocket opens.
    let first = get(rig.port, None).await;
    let second = get(rig.port, None).await;
    assert_eq!((first.copy(), second.copy()), (1, 1));
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.copy()), (200, 2), "the spare takes the third at once: {a:?}");
    assert!(a.placed().unwrap().starts_with(&format!("lb_{}=2.", rig.port)), "and it is placed there");
    let call = rig.daemon.next().await;
    assert_eq!(call.path, "/v1/apps/web/stand-in");
    assert_eq!(call.body, serde_json::json!({"stand_in": 2, "full": true}));
    drop(call);
    // A visitor with a cookie keeps its full copy.
    let back = get(rig.port, first.placed().as_deref()).await;
    assert_eq!(back.copy(), 1, "a sticky visitor keeps its copy, full or not");
    let b = get(rig.port, None).await;
    assert_eq!(b.copy(), 2);
    rig.daemon.nothing_within(Duration::from_secs(2)).await;
    // With the spare full too and none ready behind it, the least full
    // active copy takes the visitor over max-sessions: never held while the
    // app can grow.
    let t = Instant::now();
    let c = get(rig.port, None).await;
    assert_eq!((c.status, c.copy()), (200, 1), "{c:?}");
    assert!(t.elapsed() < Duration::from_millis(500), "not held: {:?}", t.elapsed());
}

#[tokio::test(start_paused = true)]
async fn at_max_replicas_with_every_copy_full_a_visitor_is_held_for_a_free_place_then_gets_the_busy_page() {
    let (one, _) = backend(1).await;
    let (two, _) = backend(2).await;
    let rig = start(|port| capacity_table(port, 1, 1, 5_000, &[(1, one, Role::Active), (2, two, Role::Warm)])).await;
    assert_eq!(get(rig.port, None).await.copy(), 1);
    let t = Instant::now();
    let busy = get(rig.port, None).await;
    let held = t.elapsed();
    assert_eq!(busy.status, 503, "{busy:?}");
    assert!(busy.header("retry-after").is_some(), "{busy:?}");
    assert!(busy.body.contains("web is busy") && busy.body.contains("http-equiv=\"refresh\""), "a page that reloads itself: {busy:?}");
    assert!(held >= Duration::from_secs(5) && held < Duration::from_secs(6), "held for request-timeout: {held:?}");
    // The first visitor's place counts 30 s at most without its WebSocket:
    // a visitor held as it frees gets in then, not at its request-timeout.
    tokio::time::sleep_until(t + Duration::from_secs(27)).await;
    let t = Instant::now();
    let late = get(rig.port, None).await;
    assert_eq!((late.status, late.copy()), (200, 1), "{late:?}");
    let waited = t.elapsed();
    assert!(waited >= Duration::from_secs(2) && waited < Duration::from_secs(4), "held until the place freed: {waited:?}");
}

/// A copy that answers each request with what it got of its body: its
/// length, how it was framed, and the body itself.
async fn body_backend() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = hyper::service::service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                let chunked = req.headers().get("transfer-encoding").is_some_and(|v| v == "chunked");
                let got = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let body = format!("{} bytes, chunked: {chunked}, {}", got.len(), String::from_utf8_lossy(&got));
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(body))))
            });
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc));
        }
    });
    port
}

/// A copy that answers every request with bytes that are no HTTP answer.
async fn garbage_backend() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut b = [0; 4096];
                if stream.read(&mut b).await.unwrap_or(0) > 0 {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let _ = stream.write_all(b"SPDY/9 what\r\n\r\n").await;
                }
            });
        }
    });
    (port, seen)
}

#[tokio::test]
async fn request_bodies_reach_the_copy_whole_by_length_or_chunked() {
    let copy = body_backend().await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, copy, Role::Active)])).await;
    let by_length = request(rig.port, "POST", None, "hello, copy").await;
    assert_eq!((by_length.status, by_length.body.as_str()), (200, "11 bytes, chunked: false, hello, copy"), "{by_length:?}");
    let chunked = raw_request(
        rig.port,
        "POST / HTTP/1.1\r\nHost: test\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!((chunked.status, chunked.body.as_str()), (200, "12 bytes, chunked: true, hello, world"), "{chunked:?}");
    let empty = request(rig.port, "POST", None, "").await;
    assert_eq!((empty.status, empty.body.as_str()), (200, "0 bytes, chunked: false, "), "{empty:?}");
}

#[tokio::test]
async fn a_copy_whose_answer_does_not_read_is_passed_over_for_a_get_and_a_post_gets_a_502() {
    let (bad, bad_seen) = garbage_backend().await;
    let (good, good_seen) = backend(2).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, bad, Role::Active), (2, good, Role::Active)])).await;
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.copy()), (200, 2), "a GET is sent once more, to the other copy: {a:?}");
    assert_eq!((bad_seen.load(Ordering::SeqCst), good_seen.load(Ordering::SeqCst)), (1, 1));
    let b = request(rig.port, "POST", None, "x").await;
    assert_eq!(b.status, 502, "a POST is never sent twice: {b:?}");
    assert_eq!((bad_seen.load(Ordering::SeqCst), good_seen.load(Ordering::SeqCst)), (2, 1));
}

/// A copy that answers every request with a head declaring `declared`
/// bytes and only the first `sent` of them, then closes the connection
/// (`hold: false`: a copy killed between httpuv's two writes) or keeps it
/// open and silent for a minute (`hold: true`: a long answer still coming).
/// Counts the requests it read.
async fn cut_backend(declared: usize, sent: usize, hold: bool) -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => head.extend_from_slice(&buf[..k]),
                    }
                }
                counter.fetch_add(1, Ordering::SeqCst);
                let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {declared}\r\n\r\n{}", "x".repeat(sent));
                let _ = stream.write_all(answer.as_bytes()).await;
                if hold {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
            });
        }
    });
    (port, seen)
}

#[tokio::test]
async fn a_get_whose_short_answer_breaks_off_is_answered_whole_by_another_copy() {
    let (cut, cut_seen) = cut_backend(10, 4, false).await;
    let (good, good_seen) = backend(2).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, cut, Role::Active), (2, good, Role::Active)])).await;
    let a = get(rig.port, None).await;
    assert_eq!((a.status, a.body.as_str()), (200, "copy=2;"), "the visitor gets none of the cut answer: {a:?}");
    assert_eq!((cut_seen.load(Ordering::SeqCst), good_seen.load(Ordering::SeqCst)), (1, 1));
    // A POST is never sent twice: its answer streams, cut as it is.
    let mut post = tokio::net::TcpStream::connect(("127.0.0.1", rig.port)).await.unwrap();
    post.write_all(b"POST / HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx").await.unwrap();
    let mut got = Vec::new();
    let _ = timeout(DEADLINE, post.read_to_end(&mut got)).await.expect("the POST's connection ends");
    let got = String::from_utf8_lossy(&got);
    assert!(!got.contains("copy=2"), "a POST went to a second copy: {got:?}");
    assert_eq!((cut_seen.load(Ordering::SeqCst), good_seen.load(Ordering::SeqCst)), (1 + 1, 1));
}

#[tokio::test]
async fn a_get_whose_answer_is_long_gets_its_head_before_the_body_is_whole() {
    let (slow, _) = cut_backend(300 * 1024, 1024, true).await;
    let rig = start(|p| table(p, LbPolicy::First, false, 30_000, &[(1, slow, Role::Active)])).await;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", rig.port)).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // The copy holds the rest of its answer for a minute: the head and the
    // first KiB come now, streamed, not held until the answer is whole.
    timeout(Duration::from_secs(10), async {
        while got.len() < 1024 || !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the answer ended: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the long answer's head and first bytes, before its end");
    assert!(got.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&got));
}
