//! Hostile clients at scale for `bench/hostile.sh`: other visitors'
//! latency before and during thousands of idle connections, slow headers,
//! slowly sent bodies, huge headers and malformed WebSocket upgrades; then,
//! from an address that is not loopback (so the per-address cap applies),
//! what a flood of connections gets.
//!
//! `hostile_client PORT IDLE [OTHER_ADDRESS [FLOOD [ODD_ROUNDS]]]`
//!
//! A batch of visitors first warms the path up (its figures are printed,
//! not compared). The run fails (exit status 1, a `FAILED:` line each) when
//! a visitor is not answered 200, a hostile connection cannot be opened,
//! huge headers get anything but 431, a malformed upgrade gets a tunnel
//! (101), or the flood from the other address gets more than the
//! per-address cap of 200s, none at all, or nothing refused.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Visitors measured in each batch (warm-up, before and during).
const VISITORS: usize = 300;
/// Slow-header and slow-body connections.
const SLOW: usize = 200;
/// Open connections one address that is not loopback may hold (the load
/// balancer's `PER_ADDRESS_MAX`).
const PER_ADDRESS_MAX: usize = 256;

/// The run's settings, from the command line.
struct Config {
    /// The app's port (the load balancer).
    port: u16,
    /// Idle connections held from loopback.
    idle: usize,
    /// An address of this machine that is not loopback, for the flood.
    other: Option<String>,
    /// Connections of the flood from `other`.
    flood: usize,
    /// Rounds of huge headers and malformed upgrades.
    odd_rounds: usize,
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let cfg = Config {
        port: args.next().and_then(|p| p.parse().ok()).unwrap_or(18992),
        idle: args.next().and_then(|n| n.parse().ok()).unwrap_or(5000),
        other: args.next().filter(|a| !a.is_empty()),
        flood: args.next().and_then(|n| n.parse().ok()).unwrap_or(1000),
        odd_rounds: args.next().and_then(|n| n.parse().ok()).unwrap_or(50),
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let failures = rt.block_on(run(&cfg))?;
    for f in &failures {
        println!("FAILED: {f}");
    }
    if !failures.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

/// The run; returns what went wrong.
async fn run(cfg: &Config) -> std::io::Result<Vec<String>> {
    let port = cfg.port;
    let mut failures = Vec::new();
    let warm = visitors(port).await;
    println!("warm-up: {}", warm.line());
    let before = visitors(port).await;
    println!("before:  {}", before.line());

    let mut held = Vec::new();
    for _ in 0..cfg.idle {
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
            if s.write_all(start).await.is_ok() {
                held.push(s);
            }
        }
    }
    let slow_open = held.len() - idle_open;
    println!("held:    {} connections", held.len());
    // One byte a second on every slow connection while the rest goes on.
    let trickle = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            for s in held.iter_mut().skip(idle_open) {
                let _ = s.write_all(b"a").await;
            }
        }
    });
    let odd = tokio::spawn(odd_requests(port, cfg.odd_rounds));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = visitors(port).await;
    println!(
        "during:  {}   ({idle_open} idle, {slow_open} slow headers/bodies open; huge headers and bad upgrades sent meanwhile)",
        during.line()
    );
    println!(
        "ratio during/before: p50 {:.2}, p99 {:.2}",
        during.p(50).as_secs_f64() / before.p(50).as_secs_f64(),
        during.p(99).as_secs_f64() / before.p(99).as_secs_f64()
    );
    let (huge, upgrades) = odd.await.unwrap_or_default();
    println!("huge headers got: {}; malformed upgrades got: {}", tally(&huge), tally(&upgrades));
    trickle.abort();
    for (name, b) in [("warm-up", &warm), ("before", &before), ("during", &during)] {
        if b.failed > 0 {
            failures.push(format!("{} of {VISITORS} visitors {name} were not answered 200", b.failed));
        }
    }
    if idle_open < cfg.idle || slow_open < SLOW {
        failures.push(format!("only {idle_open} of {} idle and {slow_open} of {SLOW} slow connections opened", cfg.idle));
    }
    if huge.keys().any(|c| *c != 431) {
        failures.push(format!("huge headers got {} (431 expected)", tally(&huge)));
    }
    if upgrades.contains_key(&101) {
        failures.push(format!("a malformed upgrade got a tunnel: {}", tally(&upgrades)));
    }
    if let Some(addr) = &cfg.other {
        let got = flood(addr, port, cfg.flood).await;
        println!("{} connections at once from {addr} (not loopback: capped per address): {}", cfg.flood, tally(&got));
        failures.extend(flood_failures(&got, cfg.flood));
    }
    Ok(failures)
}

/// What is wrong with a flood's outcome: more 200s than one address may
/// have open, none, or none refused although the flood is past the cap.
fn flood_failures(got: &BTreeMap<u16, usize>, n: usize) -> Vec<String> {
    let ok = got.get(&200).copied().unwrap_or(0);
    let mut out = Vec::new();
    if ok == 0 || ok > PER_ADDRESS_MAX {
        out.push(format!("the flood got {ok} answers 200 (1 to {PER_ADDRESS_MAX} expected): {}", tally(got)));
    }
    if n > PER_ADDRESS_MAX && ok == n {
        out.push(format!("the flood of {n} was not capped: {}", tally(got)));
    }
    if got.keys().any(|c| ![0, 200, 503].contains(c)) {
        out.push(format!("the flood got answers other than 200, 503 or a close: {}", tally(got)));
    }
    out
}

/// `3× 200, 1× closed or no answer`.
fn tally(codes: &BTreeMap<u16, usize>) -> String {
    codes
        .iter()
        .map(|(c, n)| if *c == 0 { format!("{n}× closed or no answer") } else { format!("{n}× {c}") })
        .collect::<Vec<_>>()
        .join(", ")
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

/// Huge headers and malformed upgrades, `rounds` rounds: the codes each
/// kind got (0: closed or no answer).
async fn odd_requests(port: u16, rounds: usize) -> (BTreeMap<u16, usize>, BTreeMap<u16, usize>) {
    let huge = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Huge: {}\r\n\r\n", "a".repeat(100 * 1024));
    let odd: [&[u8]; 3] = [
        b"GET /websocket/ HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nConnection: close\r\nUpgrade: websocket\r\n\r\n",
        b"GET /websocket/ HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, close\r\nUpgrade: websocket\r\nSec-WebSocket-Key: !!\r\nSec-WebSocket-Version: 99\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, close\r\nUpgrade: h2c, websocket\r\nContent-Length: 5\r\n\r\nhello",
    ];
    let (mut huge_codes, mut odd_codes) = (BTreeMap::new(), BTreeMap::new());
    for _ in 0..rounds {
        *huge_codes.entry(status_of(port, "127.0.0.1", huge.as_bytes()).await).or_default() += 1;
        for raw in odd {
            let code = tokio::time::timeout(Duration::from_secs(5), status_of(port, "127.0.0.1", raw)).await.unwrap_or(0);
            *odd_codes.entry(code).or_default() += 1;
        }
    }
    (huge_codes, odd_codes)
}

/// `n` connections from `addr`, each held, then each sends a GET: how
/// many got 200, 503, or were closed.
async fn flood(addr: &str, port: u16, n: usize) -> BTreeMap<u16, usize> {
    let mut conns = Vec::new();
    for _ in 0..n {
        if let Ok(s) = TcpStream::connect((addr, port)).await {
            conns.push(s);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut codes = BTreeMap::<u16, usize>::new();
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
}
