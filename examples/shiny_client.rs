//! The client of `bench/shiny.sh`: measures what a visitor of a real Shiny
//! app waits for, against any address (R directly, HAProxy, shinyctl).
//!
//! ```text
//! shiny_client gets PORT N     N GETs of /, each on a new connection
//! shiny_client page PORT N     N page loads: / and every script and
//!                              stylesheet it names, in order, over one
//!                              keep-alive connection, as a browser's first
//!                              connection does
//! shiny_client ws PORT N       one Shiny session, N input→output round trips
//! shiny_client hold PORT N     opens N Shiny sessions, prints "open", and
//!                              holds them until its standard input closes
//! shiny_client ramp PORT N     opens N Shiny sessions one by one over
//!                              RAMP_SECS (default 30), holds them HOLD_SECS
//!                              more (default 30); each sends an input every
//!                              second (after its last answer) and times the
//!                              output (bench/capacity.sh)
//! ```
//!
//! `ramp` prints one line a 10-second window, `window FROM-TOs p50_ms p95_ms
//! samples`, then `all p50_ms p95_ms samples`.
//!
//! Each measuring mode prints one line: `p50_ms p99_ms`. The app must have a
//! numeric input `n` and a text output `out` showing `n * 2` (bench/shiny.sh
//! writes it).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: shiny_client gets|page|ws|hold|ramp PORT N";
    let (mode, port, n) = match &args[1..] {
        [m, p, n] => (m.as_str(), p.parse::<u16>()?, n.parse::<usize>()?),
        _ => return Err(usage.into()),
    };
    match mode {
        "gets" => report((0..n).map(|_| timed(|| single_get(port))).collect()),
        "page" => report((0..n).map(|_| timed(|| page_load(port))).collect()),
        "ws" => report(round_trips(port, n)?),
        "hold" => hold(port, n),
        "ramp" => ramp(port, n),
        _ => Err(usage.into()),
    }
}

/// Runs `f` and returns how long it took, in ms; a failure ends the run.
fn timed(f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

/// Prints the p50 and p99 of the samples.
fn report(samples: Vec<Result<f64>>) -> Result<()> {
    let mut ms: Vec<f64> = samples.into_iter().collect::<Result<_>>()?;
    ms.sort_by(f64::total_cmp);
    let pick = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
    println!("{:.2} {:.2}", pick(0.50), pick(0.99));
    Ok(())
}

fn connect(port: u16) -> Result<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    // Browsers set TCP_NODELAY too.
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(s)
}

/// One HTTP/1.1 keep-alive connection with the cookies it was given.
struct Conn {
    reader: BufReader<TcpStream>,
    cookies: Vec<String>,
}

impl Conn {
    fn open(port: u16) -> Result<Conn> {
        Ok(Conn { reader: BufReader::new(connect(port)?), cookies: Vec::new() })
    }

    /// GET `path`; returns the body. Fails on anything but 200.
    fn get(&mut self, path: &str) -> Result<Vec<u8>> {
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n");
        if !self.cookies.is_empty() {
            req.push_str(&format!("Cookie: {}\r\n", self.cookies.join("; ")));
        }
        req.push_str("\r\n");
        self.reader.get_mut().write_all(req.as_bytes())?;
        let mut status = String::new();
        self.reader.read_line(&mut status)?;
        if status.split_whitespace().nth(1) != Some("200") {
            return Err(format!("GET {path}: {}", status.trim()).into());
        }
        let (mut length, mut chunked) = (None, false);
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line)?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (k, v) = line.split_once(':').ok_or("bad header")?;
            match k.to_ascii_lowercase().as_str() {
                "content-length" => length = Some(v.trim().parse::<usize>()?),
                "transfer-encoding" => chunked = v.to_ascii_lowercase().contains("chunked"),
                "set-cookie" => self.cookies.push(v.trim().split(';').next().unwrap_or("").to_string()),
                _ => {}
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let mut size = String::new();
                self.reader.read_line(&mut size)?;
                let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)?;
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        } else {
            body.resize(length.ok_or("no length")?, 0);
            self.reader.read_exact(&mut body)?;
        }
        Ok(body)
    }
}

fn single_get(port: u16) -> Result<()> {
    Conn::open(port)?.get("/").map(drop)
}

/// Every `src="…"` and `href="…"` of a script or stylesheet in the page.
fn assets(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (tag, attr) in [("<script src=\"", ""), ("<link href=\"", "stylesheet")] {
        let mut rest = page;
        while let Some(i) = rest.find(tag) {
            rest = &rest[i + tag.len()..];
            let end = rest.find('"').unwrap_or(0);
            let line_end = rest.find('>').unwrap_or(rest.len());
            if attr.is_empty() || rest[..line_end].contains(attr) {
                out.push(format!("/{}", &rest[..end]));
            }
        }
    }
    out
}

fn page_load(port: u16) -> Result<()> {
    let mut conn = Conn::open(port)?;
    let page = String::from_utf8(conn.get("/")?)?;
    let assets = assets(&page);
    if assets.is_empty() {
        return Err("the page names no script or stylesheet".into());
    }
    for path in assets {
        conn.get(&path)?;
    }
    Ok(())
}

/// A Shiny session over its WebSocket.
fn session(port: u16) -> Result<tungstenite::WebSocket<TcpStream>> {
    use tungstenite::client::IntoClientRequest;
    let mut conn = Conn::open(port)?;
    conn.get("/")?;
    let mut req = format!("ws://127.0.0.1:{port}/websocket/").into_client_request()?;
    if !conn.cookies.is_empty() {
        req.headers_mut().insert("Cookie", conn.cookies.join("; ").parse()?);
    }
    let (mut ws, _) = tungstenite::client(req, connect(port)?)?;
    ws.send(tungstenite::Message::text(r#"{"method":"init","data":{"n":1,".clientdata_output_out_hidden":false}}"#))?;
    wait_for(&mut ws, "\"out\":\"2\"")?;
    Ok(ws)
}

fn wait_for(ws: &mut tungstenite::WebSocket<TcpStream>, needle: &str) -> Result<()> {
    loop {
        let text = ws.read()?.into_text().unwrap_or_default();
        if text.contains(needle) {
            return Ok(());
        }
    }
}

fn round_trips(port: u16, n: usize) -> Result<Vec<Result<f64>>> {
    let mut ws = session(port)?;
    Ok((0..n)
        .map(|i| {
            let v = 2 + i;
            timed(|| {
                ws.send(tungstenite::Message::text(format!(r#"{{"method":"update","data":{{"n":{v}}}}}"#)))?;
                wait_for(&mut ws, &format!("\"out\":\"{}\"", v * 2))
            })
        })
        .collect())
}

fn hold(port: u16, n: usize) -> Result<()> {
    let sessions: Vec<_> = (0..n).map(|_| session(port)).collect::<Result<_>>()?;
    println!("open");
    std::io::stdout().flush()?;
    let mut sink = Vec::new();
    std::io::stdin().read_to_end(&mut sink)?;
    drop(sessions);
    Ok(())
}

/// `ramp`: N sessions opened evenly over RAMP_SECS, all held HOLD_SECS more,
/// each timing one input→output round trip a second.
fn ramp(port: u16, n: usize) -> Result<()> {
    let secs = |var: &str, default: u64| std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (ramp, hold) = (Duration::from_secs(secs("RAMP_SECS", 30)), Duration::from_secs(secs("HOLD_SECS", 30)));
    let start = Instant::now();
    let end = start + ramp + hold;
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let opens = start + ramp.mul_f64(i as f64 / n.max(1) as f64);
            std::thread::spawn(move || -> std::result::Result<Vec<(f64, f64)>, String> {
                std::thread::sleep(opens.saturating_duration_since(Instant::now()));
                let mut ws = session(port).map_err(|e| format!("session {i}: {e}"))?;
                let mut samples = Vec::new();
                let mut v = 2;
                while Instant::now() < end {
                    let sent = Instant::now();
                    let ms = timed(|| {
                        ws.send(tungstenite::Message::text(format!(r#"{{"method":"update","data":{{"n":{v}}}}}"#)))?;
                        wait_for(&mut ws, &format!("\"out\":\"{}\"", v * 2))
                    })
                    .map_err(|e| format!("session {i}: {e}"))?;
                    samples.push((sent.duration_since(start).as_secs_f64(), ms));
                    v += 1;
                    std::thread::sleep(Duration::from_secs(1).saturating_sub(sent.elapsed()));
                }
                Ok(samples)
            })
        })
        .collect();
    let mut all: Vec<(f64, f64)> = Vec::new();
    for t in threads {
        all.extend(t.join().map_err(|_| "a session's thread panicked")??);
    }
    let summary = |mut ms: Vec<f64>| -> String {
        if ms.is_empty() {
            return "- - 0".to_string();
        }
        ms.sort_by(f64::total_cmp);
        let pick = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
        format!("{:.0} {:.0} {}", pick(0.50), pick(0.95), ms.len())
    };
    let total = (ramp + hold).as_secs_f64();
    let mut from = 0.0;
    while from < total {
        let window = all.iter().filter(|(t, _)| *t >= from && *t < from + 10.0).map(|(_, ms)| *ms).collect();
        println!("window {from:.0}-{:.0}s {}", (from + 10.0).min(total), summary(window));
        from += 10.0;
    }
    println!("all {}", summary(all.into_iter().map(|(_, ms)| ms).collect()));
    Ok(())
}
