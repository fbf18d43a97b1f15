//! The WebSocket pump in-process (tests/balancer_inprocess/'s style):
//! `proxy::Proxy` in front of a copy played by the test on a raw socket,
//! a visitor on a raw socket too, so every byte, close and half-close is
//! seen as it is. No R, no other process, real time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

use shinyctl::proxy::{Proxy, Settings};
use shinyctl::wire::{LbPolicy, ProxyApp, ProxyCopy, ProxyTable, Role};

/// Any wait in these tests: far above what any of them takes.
const DEADLINE: Duration = Duration::from_secs(60);

/// A load balancer serving app `web`, whose one copy is played by the test.
struct Rig {
    proxy: Proxy,
    /// The load balancer's public port.
    port: u16,
    /// The test's folder (the daemon's api.sock would be there), removed when dropped.
    _dir: tempfile::TempDir,
}

/// A load balancer in front of copy 1 on `copy_port`.
async fn start(copy_port: u16) -> Rig {
    let dir = tempfile::Builder::new().prefix("shinyctl-tunnels-").tempdir().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let table = ProxyTable {
        apps: vec![ProxyApp {
            name: "web".into(),
            route: shinyctl::manifest::RouteSpec {
                host: "127.0.0.1".parse().unwrap(),
                port,
                lb_policy: LbPolicy::First,
                request_timeout_ms: 30_000,
                max_connections: 0,
                trusted_proxies: Vec::new(),
            },
            asleep: false,
            stopped: false,
            down: false,
            listening: true,
            max_sessions: None,
            max_replicas: 0,
            copies: vec![ProxyCopy { copy: 1, port: copy_port, role: Role::Active, pid: std::process::id(), r_pid: None }],
        }],
    };
    let settings = Settings { api_sock: dir.path().join("api.sock"), key: [7; 32] };
    let proxy = Proxy::start(settings, table, vec![listener]).await.unwrap();
    Rig { proxy, port, _dir: dir }
}

impl Rig {
    /// Open sessions on copy 1, as `GET /stats` reports them.
    fn sessions(&self) -> u64 {
        self.proxy.traffic().iter().flat_map(|a| a.copies.iter()).filter(|c| c.copy == 1).map(|c| c.sessions).sum()
    }
}

/// The copy: answers each WebSocket upgrade with 101 and `greeting` in the
/// same write, then hands the socket to the test.
async fn copy(greeting: &'static [u8]) -> (u16, mpsc::UnboundedReceiver<TcpStream>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let head = read_head(&mut s).await;
            assert!(head.0.to_ascii_lowercase().contains("upgrade: websocket"), "{}", head.0);
            assert!(head.1.is_empty(), "the load balancer sends nothing past the head before the switch");
            let mut answer = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n".to_vec();
            answer.extend_from_slice(greeting);
            s.write_all(&answer).await.unwrap();
            let _ = tx.send(s);
        }
    });
    (port, rx)
}

/// Reads an HTTP head; returns it and whatever came after it.
async fn read_head(s: &mut TcpStream) -> (String, Vec<u8>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = got.split_off(i + 4);
            return (String::from_utf8_lossy(&got).into_owned(), rest);
        }
        let n = timeout(DEADLINE, s.read(&mut buf)).await.expect("a head in time").unwrap();
        assert!(n > 0, "closed before a whole head: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
}

/// A visitor's WebSocket through the load balancer, with `early` bytes sent
/// right behind the upgrade request; returns the socket and what came past
/// the 101 head.
async fn visitor(port: u16, early: &[u8]) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut req = b"GET /websocket/ HTTP/1.1\r\nHost: test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        .to_vec();
    req.extend_from_slice(early);
    s.write_all(&req).await.unwrap();
    let (head, rest) = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    (s, rest)
}

/// Reads exactly `n` bytes.
async fn read_n(s: &mut (impl tokio::io::AsyncRead + Unpin), n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    timeout(DEADLINE, s.read_exact(&mut buf)).await.expect("bytes in time").unwrap();
    buf
}

/// Reads until the peer closes; returns what came.
async fn read_to_end(s: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    timeout(DEADLINE, s.read_to_end(&mut all)).await.expect("a close in time").unwrap();
    all
}

/// Waits until `cond` holds.
async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn bytes_go_both_ways_and_a_half_close_is_passed_on() {
    let (copy_port, mut copies) = copy(b"hello-from-copy").await;
    let rig = start(copy_port).await;
    let (mut v, greeting) = visitor(rig.port, b"early").await;
    let mut c = timeout(DEADLINE, copies.recv()).await.unwrap().unwrap();
    // What came with each head (read by hyper along with it) arrives first.
    let mut greeting = greeting;
    greeting.extend(read_n(&mut v, b"hello-from-copy".len() - greeting.len()).await);
    assert_eq!(greeting, b"hello-from-copy");
    assert_eq!(read_n(&mut c, 5).await, b"early");
    assert_eq!(rig.sessions(), 1, "counted as a session");

    for i in 0..50 {
        v.write_all(format!("up-{i:03}").as_bytes()).await.unwrap();
        assert_eq!(read_n(&mut c, 6).await, format!("up-{i:03}").as_bytes());
        c.write_all(format!("dn-{i:03}").as_bytes()).await.unwrap();
        assert_eq!(read_n(&mut v, 6).await, format!("dn-{i:03}").as_bytes());
    }
    // A megabyte each way at once, more than one buffer.
    let big: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    {
        let ((mut vr, mut vw), (mut cr, mut cw)) = (v.split(), c.split());
        let (_, up, _, down) = tokio::join!(vw.write_all(&big), read_n(&mut cr, big.len()), cw.write_all(&big), read_n(&mut vr, big.len()));
        assert!(up == big && down == big, "a megabyte each way, whole and in order");
    }

    // The visitor closes its sending half: the copy sees the end, and can
    // still answer until it closes too.
    v.shutdown().await.unwrap();
    assert_eq!(read_to_end(&mut c).await, b"", "the visitor's close is passed on");
    c.write_all(b"last-words").await.unwrap();
    assert_eq!(read_n(&mut v, 10).await, b"last-words");
    assert_eq!(rig.sessions(), 1, "half closed, still a session");
    drop(c);
    assert_eq!(read_to_end(&mut v).await, b"", "the copy's close is passed on");
    wait_for("the session to be uncounted", || rig.sessions() == 0).await;
}

#[tokio::test]
async fn a_reset_on_either_side_ends_the_session() {
    let (copy_port, mut copies) = copy(b"").await;
    let rig = start(copy_port).await;
    let (v, _) = visitor(rig.port, b"").await;
    let mut c = timeout(DEADLINE, copies.recv()).await.unwrap().unwrap();
    assert_eq!(rig.sessions(), 1);
    // SO_LINGER 0: the close is a reset.
    socket2::SockRef::from(&v).set_linger(Some(Duration::ZERO)).unwrap();
    drop(v);
    let end = timeout(DEADLINE, c.read(&mut [0u8; 16])).await.expect("the copy's side ends");
    assert!(matches!(end, Ok(0) | Err(_)), "{end:?}");
    wait_for("the session to be uncounted", || rig.sessions() == 0).await;
}

#[tokio::test]
async fn a_tunnel_handed_over_keeps_its_bytes_in_flight_and_delivers_each_once() {
    let (copy_port, mut copies) = copy(b"").await;
    let old = start(copy_port).await;
    let new = start(copy_port).await;
    let (v, _) = visitor(old.port, b"").await;
    let mut c = timeout(DEADLINE, copies.recv()).await.unwrap().unwrap();
    let (mut v_read, mut v_write) = v.into_split();

    // The copy stops reading; the visitor keeps writing a numbered stream
    // until every buffer on the way is full and the pump holds a read it
    // cannot write.
    const TOTAL: usize = 64 << 20;
    let written = Arc::new(AtomicUsize::new(0));
    let w = written.clone();
    let writer = tokio::spawn(async move {
        let chunk: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
        let mut sent = 0;
        while sent < TOTAL {
            v_write.write_all(&chunk).await.unwrap();
            sent += chunk.len();
            w.store(sent, Ordering::SeqCst);
        }
        v_write
    });
    let mut last = 0;
    let mut still = 0;
    wait_for("the visitor's writes to stall", || {
        let now = written.load(Ordering::SeqCst);
        still = if now == last && now > 0 { still + 1 } else { 0 };
        last = now;
        still >= 40
    })
    .await;
    c.write_all(b"before").await.unwrap();

    let handed = old.proxy.hand_tunnels_over(&new.proxy).await.unwrap();
    assert_eq!(handed.tunnels, 1);
    assert!(handed.pending_bytes > 0, "the pump held bytes it had read and not written: {handed:?}");
    wait_for("the session to move", || old.sessions() == 0 && new.sessions() == 1).await;

    // Now the copy reads everything: the numbered stream whole, nothing
    // lost, nothing twice.
    let reader = tokio::spawn(async move {
        let mut got = 0usize;
        let mut buf = vec![0u8; 256 * 1024];
        while got < TOTAL {
            let n = timeout(DEADLINE, c.read(&mut buf)).await.expect("bytes in time").unwrap();
            assert!(n > 0, "closed after {got} bytes");
            for (k, b) in buf[..n].iter().enumerate() {
                let at = got + k;
                assert_eq!(*b, ((at % (64 * 1024)) % 251) as u8, "byte {at}");
            }
            got += n;
        }
        c
    });
    let mut v_write = timeout(DEADLINE, writer).await.expect("the visitor's writes finish").unwrap();
    let mut c = timeout(DEADLINE, reader).await.expect("the copy reads them all").unwrap();
    let mut first = [0u8; 6];
    timeout(DEADLINE, v_read.read_exact(&mut first)).await.unwrap().unwrap();
    assert_eq!(&first, b"before", "the copy's bytes sent before the handover arrive once");

    // Both ways through the new load balancer, then a close from each side.
    c.write_all(b"after").await.unwrap();
    let mut after = [0u8; 5];
    timeout(DEADLINE, v_read.read_exact(&mut after)).await.unwrap().unwrap();
    assert_eq!(&after, b"after");
    v_write.shutdown().await.unwrap();
    assert_eq!(read_to_end(&mut c).await, b"");
    drop(c);
    let mut rest = Vec::new();
    timeout(DEADLINE, v_read.read_to_end(&mut rest)).await.unwrap().unwrap();
    assert!(rest.is_empty());
    wait_for("the session to end on the new load balancer", || new.sessions() == 0).await;
}
