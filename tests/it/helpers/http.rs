//! A tiny HTTP client, and a visitor sending requests in a loop.

use super::*;

/// A whole HTTP answer.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first header with this name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The copy that served the test app's page (`copy=N;`).
    pub fn copy(&self) -> Option<u32> {
        between(&self.body, "copy=", ";")?.parse().ok()
    }

    /// The value of `lb_<port>` in Set-Cookie, as `lb_<port>=VALUE`.
    pub fn cookie(&self) -> Option<String> {
        let sc = self.header("set-cookie")?;
        Some(sc.split(';').next()?.trim().to_string())
    }
}

/// The text between `a` and the next `b`.
pub fn between<'a>(s: &'a str, a: &str, b: &str) -> Option<&'a str> {
    let start = s.find(a)? + a.len();
    let end = s[start..].find(b)? + start;
    Some(&s[start..end])
}

/// Sends one HTTP/1.0 request on a new connection and reads the answer.
pub fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> std::io::Result<Response> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| std::io::Error::other(format!("no HTTP head in {text:?}")))?;
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {status_line:?}")))?;
    let headers = lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect();
    Ok(Response { status, headers, body: body.to_string() })
}

/// GET a path.
pub fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> std::io::Result<Response> {
    http(port, "GET", path, headers)
}

/// Waits until the app answers 200 on its public port.
pub fn wait_http_ok(port: u16, timeout: Duration) -> Response {
    wait_until(timeout, &format!("port {port} to answer 200"), || get(port, "/", &[]).ok().filter(|r| r.status == 200))
}

/// A client sending a request every 10 ms until stopped; counts failures.
/// It stops when dropped too, so a test that panics leaves no loop hitting
/// whatever later gets its port.
pub struct Loop {
    pub(super) stop: Arc<AtomicBool>,
    pub(super) sent: Arc<AtomicU32>,
    /// The copy that served the last answer (0 before one).
    pub(super) last_copy: Arc<AtomicU32>,
    pub(super) handle: Option<std::thread::JoinHandle<Vec<String>>>,
}

impl Loop {
    /// Starts the loop against the port, as new visitors each time.
    pub fn start(port: u16) -> Loop {
        Loop::spawn(port, None)
    }

    /// Starts the loop as one visitor: it sends `cookie` and takes any new
    /// cookie it is given, as a browser does.
    pub fn sticky(port: u16, cookie: String) -> Loop {
        Loop::spawn(port, Some(cookie))
    }

    pub(super) fn spawn(port: u16, mut cookie: Option<String>) -> Loop {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU32::new(0));
        let last_copy = Arc::new(AtomicU32::new(0));
        let handle = {
            let (stop, sent, last_copy) = (stop.clone(), sent.clone(), last_copy.clone());
            std::thread::spawn(move || {
                let mut errors = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    sent.fetch_add(1, Ordering::SeqCst);
                    let headers: Vec<(&str, &str)> = cookie.as_deref().map(|c| ("Cookie", c)).into_iter().collect();
                    match get(port, "/", &headers) {
                        Ok(r) if r.status == 200 => {
                            last_copy.store(r.copy().unwrap_or(0), Ordering::SeqCst);
                            if let (Some(_), Some(new)) = (&cookie, r.cookie()) {
                                cookie = Some(new);
                            }
                        }
                        other => errors.push(format!("{:?}", other.map(|r| r.status))),
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                errors
            })
        };
        Loop { stop, sent, last_copy, handle: Some(handle) }
    }

    /// Requests sent so far.
    pub fn sent(&self) -> u32 {
        self.sent.load(Ordering::SeqCst)
    }

    /// The copy that served the last answer (0 before one).
    pub fn last_copy(&self) -> u32 {
        self.last_copy.load(Ordering::SeqCst)
    }

    /// Stops the loop; returns (sent, failures).
    pub fn finish(mut self) -> (u32, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        let errors = self.handle.take().map(|h| h.join().unwrap()).unwrap_or_default();
        (self.sent(), errors)
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// `2026-10-27T10:00:01+02:00` → unix seconds.
pub(super) fn parse_rfc3339(s: &str) -> Option<i64> {
    s.parse::<jiff::Timestamp>().ok().map(|t| t.as_second())
}
