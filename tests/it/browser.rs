//! The example app in a real browser (headless Chromium through chromedriver).
//!
//! The page is opened through the load balancer, its `copy` output is
//! rendered over the Shiny WebSocket, and after the active copy is killed
//! the page's own script reloads it onto the spare.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::*;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// One request to chromedriver's W3C WebDriver HTTP API; returns the answer's
/// JSON (`{"value": ...}`), or an error for a transport failure or a body
/// that isn't JSON. WebDriver errors come back as JSON with `value.error`.
fn webdriver(port: u16, method: &str, path: &str, body: Option<&Value>) -> std::io::Result<Value> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nAccept: application/json\r\n");
    if method != "GET" {
        req.push_str("Content-Type: application/json; charset=utf-8\r\n");
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    s.write_all(req.as_bytes())?;

    // Read the head, then the body by Content-Length, chunks, or to the end.
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::Error::other(format!("chromedriver closed before a whole head: {:?}", String::from_utf8_lossy(&raw))));
        }
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let mut rest = raw[head_end + 4..].to_vec();
    let header = |name: &str| {
        head.lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
    };
    let body = if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        while rest.len() < len {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            rest.extend_from_slice(&buf[..n]);
        }
        rest.truncate(len);
        rest
    } else {
        let _ = s.read_to_end(&mut rest);
        if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            dechunk(&rest)
        } else {
            rest
        }
    };
    serde_json::from_slice(&body)
        .map_err(|e| std::io::Error::other(format!("{method} {path}: not JSON ({e}): {head}\n{}", String::from_utf8_lossy(&body))))
}

/// Decodes a chunked HTTP body.
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = b.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&b[..i]);
        let Ok(size) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else { break };
        if size == 0 || b.len() < i + 2 + size {
            break;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + size]);
        b = &b[(i + 2 + size + 2).min(b.len())..];
    }
    out
}

/// The WebDriver error in an answer, if any.
fn wd_error(v: &Value) -> Option<String> {
    let e = v["value"]["error"].as_str()?;
    Some(format!("{e}: {}", v["value"]["message"].as_str().unwrap_or("")))
}

/// chromedriver and the Chromium session it drives. Dropping it deletes the
/// session (which quits Chromium), then ends chromedriver and its process
/// group by PID and waits for it. It also keeps the test's files when the
/// test fails, since the `Env` removes its folder when it drops.
struct Browser<'a> {
    env: &'a Env,
    driver: Child,
    port: u16,
    session: Option<String>,
}

impl<'a> Browser<'a> {
    /// Starts chromedriver on a free port and opens a headless Chromium
    /// session with a profile of its own under the test's folder.
    fn start(env: &'a Env) -> Browser<'a> {
        for (what, path) in [("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)] {
            assert!(
                Path::new(path).exists(),
                "{what} is missing at {path}: this test needs Debian's chromium and chromium-driver \
                 (apt-get install chromium chromium-driver; test.sh installs them)"
            );
        }
        let port = free_port();
        let log = std::fs::File::create(env.dir.join("chromedriver.log")).unwrap();
        // Chromium's temporary folders in the test's own, which goes with
        // it: one it had no time to remove as it quit stayed in /tmp.
        let tmp = env.dir.join("browser-tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .env("TMPDIR", &tmp)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            // Its own process group, so Chromium's processes can be ended with it.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start {CHROMEDRIVER}: {e}"));
        env.track(driver.id());
        let mut b = Browser { env, driver, port, session: None };

        wait_until(Duration::from_secs(20), "chromedriver to be ready", || {
            webdriver(port, "GET", "/status", None).ok().filter(|v| v["value"]["ready"] == true)
        });

        let profile = env.dir.join("chromium-profile");
        std::fs::create_dir_all(&profile).unwrap();
        let caps = json!({
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "pageLoadStrategy": "normal",
                    "goog:chromeOptions": {
                        "binary": CHROMIUM,
                        "args": [
                            "--headless=new",
                            "--no-sandbox",
                            "--disable-gpu",
                            "--disable-dev-shm-usage",
                            "--disable-quic",
                            "--no-first-run",
                            "--disable-background-networking",
                            "--disable-component-update",
                            "--disable-sync",
                            format!("--user-data-dir={}", profile.display()),
                        ]
                    }
                }
            }
        });
        let v = webdriver(port, "POST", "/session", Some(&caps)).expect("POST /session to chromedriver");
        if let Some(e) = wd_error(&v) {
            panic!("chromedriver could not start Chromium: {e}\nchromedriver.log:\n{}", read(&env.dir.join("chromedriver.log")));
        }
        let id = v["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no sessionId in {v}")).to_string();
        b.session = Some(id);
        b
    }

    fn path(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session.as_deref().unwrap())
    }

    /// Opens a URL (waits for the page to load).
    fn navigate(&self, url: &str) {
        let v = webdriver(self.port, "POST", &self.path("/url"), Some(&json!({ "url": url }))).expect("navigate");
        if let Some(e) = wd_error(&v) {
            panic!("navigating to {url} failed: {e}");
        }
    }

    /// Runs a script in the page; Err for a WebDriver error (for example
    /// while the page is being reloaded).
    fn execute(&self, script: &str) -> Result<Value, String> {
        let v = webdriver(self.port, "POST", &self.path("/execute/sync"), Some(&json!({ "script": script, "args": [] })))
            .map_err(|e| e.to_string())?;
        match wd_error(&v) {
            Some(e) => Err(e),
            None => Ok(v["value"].clone()),
        }
    }

    /// The text of the `copy` output, or "" if the element isn't there.
    fn copy_text(&self) -> Result<String, String> {
        self.execute("var e = document.getElementById('copy'); return e ? e.textContent : '';")
            .map(|v| v.as_str().unwrap_or("").trim().to_string())
    }

    /// Waits until the `copy` output reads `want`; panics with the last
    /// text seen and the page's state otherwise.
    fn wait_copy_text(&self, want: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.copy_text() {
                Ok(t) if t == want => return,
                other => other,
            };
            if Instant::now() > deadline {
                let page = self
                    .execute("return location.href + ' | title=' + document.title + ' | disconnected=' + !!document.getElementById('shiny-disconnected-overlay') + ' | body=' + document.body.innerText.slice(0, 400);")
                    .unwrap_or_else(Value::String);
                panic!("timed out after {timeout:?} waiting for the page's `copy` output to read {want:?}; last: {last:?}\npage: {page}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Browser<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.session.take() {
            // Quits Chromium.
            let _ = webdriver(self.port, "DELETE", &format!("/session/{id}"), None);
        }
        let pid = self.driver.id();
        signal(pid, 15);
        signal_group(pid, 15);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(self.driver.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        if matches!(self.driver.try_wait(), Ok(None)) {
            signal(pid, 9);
            signal_group(pid, 9);
        }
        let _ = self.driver.wait();
        // Anything left in chromedriver's group (Chromium's processes).
        signal_group(pid, 9);

        if std::thread::panicking() {
            keep_files(&self.env.dir);
        }
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| format!("({}: {e})", p.display()))
}

/// Copies the test's logs out of its folder (which `Env` removes) and
/// prints where they are.
fn keep_files(dir: &Path) {
    let keep = PathBuf::from(format!("{}-kept", dir.display()));
    let _ = std::fs::create_dir_all(&keep);
    let mut files = vec![dir.join("home").join("api.log"), dir.join("chromedriver.log")];
    if let Ok(rd) = std::fs::read_dir(dir.join("home").join("logs")) {
        files.extend(rd.flatten().map(|e| e.path()));
    }
    if let Ok(rd) = std::fs::read_dir(dir.join("apps").join("hello")) {
        files.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_file()));
    }
    for f in files {
        if let Some(name) = f.file_name() {
            let _ = std::fs::copy(&f, keep.join(name));
        }
    }
    eprintln!("browser test failed; its logs (api.log, chromedriver.log, the copies' logs, state.json) are kept in {}", keep.display());
}

#[test]
fn the_example_app_renders_in_chromium_and_reloads_onto_the_spare_when_its_copy_dies() {
    let env = Env::new("browser");
    eprintln!("browser test home: {}", env.home().display());

    // The real example app, in a folder of its own with a manifest for a
    // free port.
    let folder = env.dir.join("apps").join("hello");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/hello/app.R"), folder.join("app.R")).expect("copy examples/hello/app.R");
    let port = free_port();
    let manifest = folder.join("app.yaml");
    std::fs::write(&manifest, format!("app-name: hello\nport: {port}\nreplicas: 1\nwarm-replicas: 1\n")).unwrap();

    // Declared after `env`, so it drops first: Chromium quits and the logs
    // are kept before the Env ends the app and removes its folder.
    let browser = Browser::start(&env);

    env.apply(&manifest);
    env.wait_roles("hello", "1:active 2:warm", Duration::from_secs(60));
    let page = wait_until(Duration::from_secs(30), &format!("the load balancer on port {port} to answer 200"), || {
        get(port, "/", &[]).ok().filter(|r| r.status == 200)
    });
    assert!(page.body.contains("shiny:disconnected"), "the page served on port {port} is the example app's, with its reload script");

    // The page, through the load balancer; the `copy` output is empty in
    // the HTML and only filled in by the server over the WebSocket.
    browser.navigate(&format!("http://127.0.0.1:{port}/"));
    browser.wait_copy_text("copy 1", Duration::from_secs(30));

    // Mark this page, then kill the copy it is on.
    assert_eq!(browser.execute("window.__marker = 1; return window.__marker;").unwrap(), json!(1));
    let pid = env.pid_of("hello", 1);
    signal(pid, 9);

    // The page's script reloads it once the app answers again, and it lands
    // on the spare.
    browser.wait_copy_text("copy 2", Duration::from_secs(30));
    assert_eq!(
        browser.execute("return typeof window.__marker;").unwrap(),
        json!("undefined"),
        "the page was reloaded (the marker set before the kill is gone)"
    );
    assert_eq!(
        browser.execute("var n = performance.getEntriesByType('navigation')[0]; return n ? n.type : null;").unwrap(),
        json!("reload"),
        "the page was reloaded by its script, not navigated anew"
    );
    assert!(!pid_alive(pid), "the killed copy's process {pid} is gone");
}
