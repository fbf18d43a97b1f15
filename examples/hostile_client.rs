//! Hostile clients at scale for `bench/hostile.sh`: other visitors'
//! latency before and during thousands of idle connections, slow headers,
//! slowly sent bodies, huge headers and malformed WebSocket upgrades; then,
//! from an address that is not loopback (so the per-address cap applies),
//! what a flood of connections gets.
//!
//! `cargo run --release --example hostile_client -- PORT IDLE [OTHER_ADDRESS]`

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Visitors measured before and during.
const VISITORS: usize = 300;
/// Slow-header and slow-body connections.
const SLOW: usize = 200;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(18992);
    let idle: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(5000);
    let other: Option<String> = args.next().filter(|a| !a.is_empty());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(run(port, idle, other))
}

async fn run(port: u16, idle: usize, other: Option<String>) -> std::io::Result<()> {
    let before = visitors(port).await;
    println!("before:  {}", before.line());

    let mut held = Vec::new();
    for _ in 0..idle {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)).await {
            held.push(s);
        }
    }
    let idle_open = held.len();
    for i in 0..SLOW {
        let start: &[u8] = if i % 2 == 0 {
            b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: "
        } else {
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n"
        };
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)).await {
            let _ = s.write_all(start).await;
            held.push(s);
        }
    }
    // One byte a second on every slow connection while the rest goes on.
    let trickle = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            for s in held.iter_mut().skip(idle_open) {
                let _ = s.write_all(b"a").await;
            }
        }
    });
    let odd = tokio::spawn(odd_requests(port));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = visitors(port).await;
    println!(
        "during:  {}   ({idle_open} idle, {SLOW} slow headers/bodies open; huge headers and bad upgrades sent meanwhile)",
        during.line()
    );
    println!(
        "ratio during/before: p50 {:.2}, p99 {:.2}",
        during.p(50).as_secs_f64() / before.p(50).as_secs_f64(),
        during.p(99).as_secs_f64() / before.p(99).as_secs_f64()
    );
    let answers = odd.await.unwrap_or_default();
    println!("huge headers / malformed upgrades got: {answers}");
    trickle.abort();
    if let Some(addr) = other {
        println!("from {addr} (not loopback: capped per address): {}", flood(&addr, port, 1000).await);
    }
    Ok(())
}

/// Latencies of one batch of visitors, each a GET on a new connection.
struct Batch {
    took: Vec<Duration>,
    failed: usize,
}

impl Batch {
    fn p(&self, pct: usize) -> Duration {
        let mut t = self.took.clone();
        t.sort();
        t.get((t.len().saturating_sub(1)) * pct / 100).copied().unwrap_or_default()
    }

    fn line(&self) -> String {
        format!(
            "{} visitors, p50 {:.2} ms, p99 {:.2} ms, {} failed",
            self.took.len() + self.failed,
            ms(self.p(50)),
            ms(self.p(99)),
            self.failed
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn visitors(port: u16) -> Batch {
    let mut b = Batch { took: Vec::new(), failed: 0 };
    for _ in 0..VISITORS {
        let t = Instant::now();
        match tokio::time::timeout(
            Duration::from_secs(10),
            status_of(port, "127.0.0.1", b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        )
        .await
        {
            Ok(200) => b.took.push(t.elapsed()),
            _ => b.failed += 1,
        }
    }
    b
}

/// The status code the answer to `raw` starts with (0: none).
async fn status_of(port: u16, addr: &str, raw: &[u8]) -> u16 {
    let Ok(mut s) = TcpStream::connect((addr, port)).await else { return 0 };
    if s.write_all(raw).await.is_err() {
        return 0;
    }
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got).await;
    String::from_utf8_lossy(&got).split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// Huge headers and malformed upgrades, 50 rounds; the codes they got.
async fn odd_requests(port: u16) -> String {
    let huge = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Huge: {}\r\n\r\n", "a".repeat(100 * 1024));
    let odd: [&[u8]; 3] = [
        b"GET /websocket/ HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nConnection: close\r\nUpgrade: websocket\r\n\r\n",
        b"GET /websocket/ HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, close\r\nUpgrade: websocket\r\nSec-WebSocket-Key: !!\r\nSec-WebSocket-Version: 99\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, close\r\nUpgrade: h2c, websocket\r\nContent-Length: 5\r\n\r\nhello",
    ];
    let mut codes = std::collections::BTreeMap::<u16, usize>::new();
    for _ in 0..50 {
        *codes.entry(status_of(port, "127.0.0.1", huge.as_bytes()).await).or_default() += 1;
        for raw in odd {
            let code = tokio::time::timeout(Duration::from_secs(5), status_of(port, "127.0.0.1", raw)).await.unwrap_or(0);
            *codes.entry(code).or_default() += 1;
        }
    }
    codes
        .iter()
        .map(|(c, n)| if *c == 0 { format!("{n}× closed or no answer") } else { format!("{n}× {c}") })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `n` connections from `addr`, each held, then each sends a GET: how
/// many got 200, 503, or were closed.
async fn flood(addr: &str, port: u16, n: usize) -> String {
    let mut conns = Vec::new();
    for _ in 0..n {
        if let Ok(s) = TcpStream::connect((addr, port)).await {
            conns.push(s);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut codes = std::collections::BTreeMap::<u16, usize>::new();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                if s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.is_err() {
                    return 0;
                }
                let mut got = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
                String::from_utf8_lossy(&got).split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
            })
        })
        .collect();
    for t in tasks {
        *codes.entry(t.await.unwrap_or(0)).or_default() += 1;
    }
    codes
        .iter()
        .map(|(c, n)| if *c == 0 { format!("{n}× closed or no answer") } else { format!("{n}× {c}") })
        .collect::<Vec<_>>()
        .join(", ")
}
