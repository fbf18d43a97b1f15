//! Shared helpers: a temporary SHINYCTL_HOME per test, the real binary, a
//! real R Shiny app, a tiny HTTP client, and waiting on conditions with a
//! deadline. Every process a test started is ended by PID when its `Env`
//! drops, once it is sure the PID still names that process; a test that
//! runs past `TEST_LIMIT` is ended with its processes and a clear message.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_shinyctl")
}

/// The variable that tells the suite the machine is loaded:
/// `SHINYCTL_TEST_SLOW=3` makes every deadline a test waits on three times
/// as long (`wait_until`, `wait_gone`, `wait_roles`, `wait_http_ok`, the
/// test's own limit). What a test asserts stays as it is: a window that
/// must hold, a bound the docs promise.
pub const SLOW_VAR: &str = "SHINYCTL_TEST_SLOW";

/// The factor [`SLOW_VAR`] sets (at least 1; 1 when unset or unreadable).
pub fn slow_factor() -> f64 {
    std::env::var(SLOW_VAR).ok().and_then(|v| v.parse::<f64>().ok()).filter(|f| f.is_finite() && *f >= 1.0).unwrap_or(1.0)
}

/// A deadline scaled for a loaded machine by [`SLOW_VAR`].
pub fn slow(d: Duration) -> Duration {
    d.mul_f64(slow_factor())
}

/// The opt-out for tests that need root: CI runs the suite as root, so
/// such a test fails when not root (`#[ignore]` would drop it from CI),
/// unless `SHINYCTL_TEST_NOT_ROOT=1` says this run knows; then it prints
/// SKIPPED and passes.
pub const NOT_ROOT_VAR: &str = "SHINYCTL_TEST_NOT_ROOT";

/// A user of the machine for one test (the suite runs as root), removed
/// with `userdel -f` when dropped (a process of theirs that has not quite
/// ended must not leave the user behind). The suite's one test-user type.
pub struct TestUser {
    /// Its name, unique to this test process and call.
    pub name: String,
}

impl TestUser {
    /// Makes one with `useradd` (no home folder made); `home`: the home
    /// folder it is given, if any.
    pub fn create(home: Option<&Path>) -> TestUser {
        // One per call: two tests of this binary may make one at once.
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!("shy{}x{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
        let mut cmd = Command::new("useradd");
        cmd.arg("--no-create-home").args(["--shell", "/bin/sh"]);
        if let Some(home) = home {
            cmd.arg("--home-dir").arg(home);
        }
        let out = cmd.arg(&name).output().expect("useradd (the suite runs as root)");
        assert!(out.status.success(), "useradd: {}", String::from_utf8_lossy(&out.stderr));
        TestUser { name }
    }

    /// Its uid (`-u`) or gid (`-g`).
    pub fn id(&self, flag: &str) -> u32 {
        let out = Command::new("id").args([flag, &self.name]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    /// Its subordinate uid ranges (`/etc/subuid`, the same in `/etc/subgid`):
    /// those useradd gave it, or, where it gave none, one added with
    /// usermod, far from others'.
    pub fn subordinate_ids(&self) -> Vec<(u32, u32)> {
        let ranges = || -> Vec<(u32, u32)> {
            let text = std::fs::read_to_string("/etc/subuid").unwrap_or_default();
            text.lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split(':').collect();
                    let (first, count): (u32, u32) = (f.get(1)?.parse().ok()?, f.get(2)?.parse().ok()?);
                    (f[0] == self.name).then(|| (first, first + count - 1))
                })
                .collect()
        };
        if ranges().is_empty() {
            // usermod refuses the flags when the files are missing (a
            // container image may lack what Debian's login package makes).
            for file in ["/etc/subuid", "/etc/subgid"] {
                if !Path::new(file).exists() {
                    std::fs::write(file, "").unwrap();
                }
            }
            let first = 1_500_000_000 + (std::process::id() % 1000) * 70_000;
            let range = format!("{first}-{}", first + 65_535);
            let out = Command::new("usermod").args(["--add-subuids", &range, "--add-subgids", &range, &self.name]).output().unwrap();
            assert!(out.status.success(), "usermod: {}", String::from_utf8_lossy(&out.stderr));
        }
        ranges()
    }

    /// Takes away the subordinate ids useradd gave it, so its daemon's
    /// copies run as itself (README, "Identities").
    pub fn without_subordinate_ids(&self) {
        for (file, flag) in [("/etc/subuid", "--del-subuids"), ("/etc/subgid", "--del-subgids")] {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            for l in text.lines().filter(|l| l.split(':').next() == Some(self.name.as_str())) {
                let f: Vec<u64> = l.split(':').skip(1).filter_map(|n| n.parse().ok()).collect();
                let range = format!("{}-{}", f[0], f[0] + f[1] - 1);
                let out = Command::new("usermod").args([flag, &range, &self.name]).output().unwrap();
                assert!(out.status.success(), "usermod: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
    }

    /// Runs the binary under test as this user, with `home` as SHINYCTL_HOME.
    pub fn run(&self, home: &Path, args: &[&str]) -> Output {
        Command::new("setpriv")
            .args(["--reuid", &self.name, "--regid", &self.name, "--clear-groups", "--"])
            .arg(bin())
            .args(args)
            .env("SHINYCTL_HOME", home)
            .output()
            .expect("setpriv")
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        // Its daemons' pool folders: its homes are the test's own, so
        // they are found by their owner.
        use std::os::unix::fs::MetadataExt;
        let uid = self.id("-u");
        remove_pool_folders(|e| e.metadata().is_ok_and(|m| m.uid() == uid));
        let _ = Command::new("userdel").args(["-f", &self.name]).output();
    }
}

/// True when the tests run as root.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// For a test that needs root (`why`): true when it runs as root; false,
/// after printing SKIPPED, when not and [`NOT_ROOT_VAR`] is set; panics
/// otherwise.
pub fn needs_root(why: &str) -> bool {
    if is_root() {
        return true;
    }
    let opted_out = std::env::var(NOT_ROOT_VAR).is_ok_and(|v| v == "1");
    assert!(opted_out, "this test needs root ({why}); CI runs the suite as root. Set {NOT_ROOT_VAR}=1 to skip it knowingly");
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    // Straight to stderr, so it shows even when cargo captures the output.
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: not root ({why}) and {NOT_ROOT_VAR}=1");
    false
}

/// Waits until `cond` holds, polling every 50 ms, or panics with `what`
/// after `timeout` (scaled by [`SLOW_VAR`]).
pub fn wait_until<T>(timeout: Duration, what: &str, mut cond: impl FnMut() -> Option<T>) -> T {
    let timeout = slow(timeout);
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = cond() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Checks `cond` every 50 ms for `window` and panics with `what` the first
/// time it does not hold: for what must stay true, such as a copy left down.
pub fn holds_for(window: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + window;
    while Instant::now() < end {
        assert!(cond(), "no longer true: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Unix time in ms, as the daemon records it.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Waits until the wall clock reaches `unix_ms`.
pub fn wait_clock(unix_ms: u64) {
    while now_ms() < unix_ms {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the process is gone, or panics with `what` after `timeout`.
pub fn wait_gone(pid: u32, timeout: Duration, what: &str) {
    wait_until(timeout, what, || (!pid_alive(pid)).then_some(()));
}

/// An app name no other test run on this machine uses at the same time
/// (`name` and this process's ID). Copy ports are seeded from the app
/// name, so a test that checks a copy keeps its port, or finds its first
/// start's disk empty, must not share its name with another suite's test
/// running beside it.
pub fn unique(name: &str) -> String {
    format!("{name}{}", std::process::id())
}

/// A free TCP port for an app, between 10000 and 19999: below the copies'
/// 20000–29999 and the kernel's ephemeral range (32768 and up), so no
/// outgoing connection is given it between now and the daemon's bind (as
/// one from `bind(0)` could be); bindable now on 0.0.0.0, and never handed
/// out twice by this test process. Each process starts at its own place.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<BTreeSet<u16>> = std::sync::Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let start = (std::process::id() as usize * 7919 + now_ms() as usize) % 10_000;
    (0..10_000)
        .map(|i| 10_000 + ((start + i * 7) % 10_000) as u16)
        .find(|&p| !given.contains(&p) && std::net::TcpListener::bind(("0.0.0.0", p)).is_ok())
        .inspect(|&p| {
            given.insert(p);
        })
        .expect("a free port between 10000 and 19999")
}

/// True while a process with this PID exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit_once(')').and_then(|(_, r)| r.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

/// The command line of a process, arguments joined by spaces.
pub fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).split('\0').filter(|s| !s.is_empty()).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// True when process `pid` is a copy's R: R's binary run as the launcher
/// runs it (its run expression on its standard input), cold or claimed.
pub fn is_copy_r(pid: u32) -> bool {
    let cmd = cmdline(pid);
    cmd.ends_with(&format!("/R {}", shinyctl::launcher::R_ARGS.join(" ")))
}

/// Sends a signal to a process by PID.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a PID this test started.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Sends a signal to a process group (copies lead their own).
pub fn signal_group(pgid: u32, sig: i32) {
    // SAFETY: kill(2) on a group this test started.
    unsafe {
        libc::kill(-(pgid as i32), sig);
    }
}

/// The app every test runs: its page says which copy served it, the
/// X-Forwarded-For it saw, and it has two reactive outputs over the
/// WebSocket: `live` (which copy, and its R's start time in clock ticks
/// since boot, field 22 of /proc/self/stat: the same inside the copy's PID
/// namespace and on the host, where its PID is not) and `echo` (input `n`
/// answered with the same), which [`Session`] reads.
pub const APP_R: &str = r#"
library(shiny)
if (Sys.getenv("BROKEN") == "yes") stop("this version is broken")
# The copy's own disk: was it empty when this process started?
marker <- file.path(Sys.getenv("SHINYCTL_SCRATCH"), "marker")
scratch <- if (file.exists(marker)) "kept" else "empty"
writeLines("x", marker)
started <- strsplit(sub(".*\\) ", "", readLines("/proc/self/stat", warn = FALSE)), " ")[[1]][20]
me <- paste0(Sys.getenv("SHINYCTL_COPY"), "-r-", started, "-end")
ui <- function(req) {
  fluidPage(
    tags$p(id = "scratch", paste0("scratch=", scratch, ";")),
    tags$p(id = "who", paste0("copy=", Sys.getenv("SHINYCTL_COPY"), ";")),
    tags$p(id = "xff", paste0("xff=", req$HTTP_X_FORWARDED_FOR, ";")),
    tags$p(id = "greeting", paste0("greeting=", Sys.getenv("GREETING"), ";")),
    textOutput("live"),
    textOutput("echo")
  )
}
server <- function(input, output, session) {
  output$live <- renderText(paste0("live-from-copy-", me))
  output$echo <- renderText(paste0("echo-", input$n, "-copy-", me))
}
shinyApp(ui, server)
"#;

/// A Shiny session: a WebSocket through the load balancer, initialised,
/// with the first value of the `live` output read. The one session opener
/// of the suite.
pub struct Session {
    socket: tungstenite::WebSocket<std::net::TcpStream>,
    /// The copy the `live` output came from.
    pub copy: u32,
    /// Its R's start time in clock ticks, for an app that says it
    /// ([`APP_R`]: `live-from-copy-N-r-TICKS-end`); 0 otherwise.
    pub r_start: u64,
}

/// `N` or `N-r-TICKS-end` after a marker: the copy and its R's start.
fn copy_and_r(after: &str) -> Option<(u32, u64)> {
    let digits: String = after.chars().take_while(|c| c.is_ascii_digit()).collect();
    let copy = digits.parse().ok()?;
    let r = after[digits.len()..].strip_prefix("-r-").and_then(|t| t.split_once("-end")).and_then(|(t, _)| t.parse().ok());
    Some((copy, r.unwrap_or(0)))
}

/// The next message's text from a WebSocket. A read that a signal
/// interrupted is tried again: a socket with a read timeout is never
/// restarted by the kernel (EINTR, whatever the handler's flags), and it
/// failed a session once so.
pub fn next_text(socket: &mut tungstenite::WebSocket<std::net::TcpStream>) -> Result<String, String> {
    loop {
        match socket.read() {
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.to_string()),
            Ok(m) => return Ok(m.into_text().unwrap_or_default().to_string()),
        }
    }
}

impl Session {
    /// Opens a session with this cookie header (may be empty); panics when
    /// it does not open.
    pub fn open(port: u16, cookie: &str) -> Session {
        Session::try_open(port, cookie).unwrap_or_else(|e| panic!("a Shiny session through the load balancer: {e}"))
    }

    /// Opens a session with this cookie header (may be empty): the
    /// handshake (101), then the first `live` output, within 20 s.
    pub fn try_open(port: u16, cookie: &str) -> Result<Session, String> {
        use tungstenite::client::IntoClientRequest;
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
        stream.set_read_timeout(Some(Duration::from_secs(20))).map_err(|e| e.to_string())?;
        let mut req = format!("ws://127.0.0.1:{port}/websocket/").into_client_request().map_err(|e| e.to_string())?;
        if !cookie.is_empty() {
            req.headers_mut().insert("Cookie", cookie.parse().map_err(|_| format!("a bad cookie header {cookie:?}"))?);
        }
        let (mut socket, resp) = tungstenite::client(req, stream).map_err(|e| format!("handshake: {e}"))?;
        if resp.status() != 101 {
            return Err(format!("handshake answered {}", resp.status()));
        }
        let init = r#"{"method":"init","data":{".clientdata_output_live_hidden":false,".clientdata_output_echo_hidden":false}}"#;
        socket.send(tungstenite::Message::text(init)).map_err(|e| format!("init: {e}"))?;
        loop {
            let text = next_text(&mut socket).map_err(|e| format!("first output: {e}"))?;
            if let Some((copy, r_start)) = text.split_once("live-from-copy-").and_then(|(_, a)| copy_and_r(a)) {
                return Ok(Session { socket, copy, r_start });
            }
        }
    }

    /// Sends input `n` and waits for its echo (20 s at most): the session
    /// still works end to end. Returns the copy and R start that answered.
    pub fn echo(&mut self, n: u64) -> Result<(u32, u64), String> {
        let update = format!(r#"{{"method":"update","data":{{"n":{n}}}}}"#);
        self.socket.send(tungstenite::Message::text(update)).map_err(|e| format!("send: {e}"))?;
        let want = format!("echo-{n}-copy-");
        loop {
            let text = next_text(&mut self.socket).map_err(|e| format!("read: {e}"))?;
            if let Some(found) = text.split_once(&want).and_then(|(_, a)| copy_and_r(a)) {
                return Ok(found);
            }
        }
    }

    /// Panics unless input `n` is echoed by the copy the session opened on.
    pub fn still_on_its_copy(&mut self, n: u64) {
        let answered = self.echo(n).unwrap_or_else(|e| panic!("the session on copy {} still works: {e}", self.copy));
        assert_eq!(answered.0, self.copy, "the session is still answered by its own copy");
        if self.r_start != 0 {
            assert_eq!(answered.1, self.r_start, "by the same R process");
        }
    }

    /// Closes the session.
    pub fn close(mut self) {
        let _ = self.socket.close(None);
        let _ = self.socket.flush();
    }
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The longest one test may run, however it waits: cargo test has no
/// per-test time limit, so each `Env` carries one. The slowest test (a
/// minute up, on a loaded machine) takes about two minutes.
pub const TEST_LIMIT: Duration = Duration::from_secs(6 * 60);

/// One test's world: its own SHINYCTL_HOME and app folder.
pub struct Env {
    /// The test's folder; SHINYCTL_HOME is `home/` under it.
    pub dir: PathBuf,
    /// Every process seen that this test started (daemon, load balancer,
    /// copies): PID → start time (field 22 of /proc/PID/stat), so a PID the
    /// kernel has since given to another process is never signalled.
    pids: std::cell::RefCell<BTreeMap<u32, u64>>,
    /// The daemons among them: ended first, so none starts a new load
    /// balancer while the old one is being ended.
    daemons: std::cell::RefCell<BTreeSet<u32>>,
    /// Dropping it tells the watchdog the test is over.
    _watchdog: std::sync::mpsc::Sender<()>,
}

impl Env {
    /// A fresh folder with a home and nothing running.
    pub fn new(name: &str) -> Env {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("shinyctl-it-{}-{n}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("home")).unwrap();
        let _watchdog = watchdog(dir.join("home"));
        Env { dir, pids: Default::default(), daemons: Default::default(), _watchdog }
    }

    /// Writes an executable shell script in the test's folder (a stand-in
    /// for R as an app's r-path); returns its path.
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// SHINYCTL_HOME.
    pub fn home(&self) -> PathBuf {
        self.dir.join("home")
    }

    /// [`Env::app`] with an app.R of the test's own.
    pub fn app_running(&self, app_r: &str, name: &str, port: u16, extra: &str) -> PathBuf {
        let manifest = self.app(name, port, extra);
        std::fs::write(manifest.with_file_name("app.R"), app_r).unwrap();
        manifest
    }

    /// Writes an app folder `apps/<name>/` with app.R and app.yaml
    /// (`app-name`, `port` and then `extra` lines). Returns the manifest.
    pub fn app(&self, name: &str, port: u16, extra: &str) -> PathBuf {
        let folder = self.dir.join("apps").join(name);
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("app.R"), APP_R).unwrap();
        let manifest = folder.join("app.yaml");
        std::fs::write(&manifest, format!("app-name: {name}\nport: {port}\n{extra}")).unwrap();
        manifest
    }

    /// Starts an app on a free port with `extra` manifest lines, waits for
    /// `roles` and for its port to answer 200; returns the port.
    pub fn started(&self, name: &str, extra: &str, roles: &str) -> u16 {
        let port = free_port();
        self.apply(&self.app(name, port, extra));
        self.wait_roles(name, roles, Duration::from_secs(60));
        wait_http_ok(port, Duration::from_secs(10));
        port
    }

    /// Runs `shinyctl ARGS` with this home and returns its output.
    pub fn run(&self, args: &[&str]) -> Output {
        self.run_binary(Path::new(bin()), args)
    }

    /// Runs another shinyctl binary (another build) with this home.
    pub fn run_binary(&self, binary: &Path, args: &[&str]) -> Output {
        let out = output_when_not_busy(Command::new(binary).args(args).env("SHINYCTL_HOME", self.home()));
        self.note_pids();
        out
    }

    /// Runs `shinyctl ARGS` and panics unless it succeeds; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "shinyctl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `apply -f manifest`.
    pub fn apply(&self, manifest: &Path) -> String {
        self.ok(&["apply", "-f", manifest.to_str().unwrap()])
    }

    /// `status --json`, parsed.
    pub fn status(&self) -> Value {
        let out = self.ok(&["status", "--json"]);
        let v: Value = serde_json::from_str(&out).expect("status --json is JSON");
        self.note_status_pids(&v);
        for app in v["apps"].as_array().into_iter().flatten() {
            for c in app["copies"].as_array().into_iter().flatten() {
                if let Some(p) = c["pid"].as_u64() {
                    self.remember(p as u32);
                }
            }
        }
        v
    }

    /// One app's copies from status, as (copy, role, pid, ready) rows.
    pub fn copies(&self, app: &str) -> Vec<Copy> {
        let v = self.status();
        let Some(a) = v["apps"].as_array().into_iter().flatten().find(|a| a["name"] == app) else { return vec![] };
        a["copies"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| Copy {
                copy: c["copy"].as_u64().unwrap() as u32,
                role: c["role"].as_str().unwrap_or("-").to_string(),
                pid: c["pid"].as_u64().map(|p| p as u32),
                ready: c["ready"].as_bool().unwrap_or(false),
                status: c["status"].as_str().unwrap_or("").to_string(),
                sessions: c["sessions"].as_u64().unwrap_or(0),
                crashes: c["crashes"].as_u64().unwrap_or(0),
                copy_port: c["copy_port"].as_u64().unwrap_or(0) as u16,
            })
            .collect()
    }

    /// The roles of the ready copies, as `2:active 1:warm 3:draining`:
    /// active, then warm, then draining, each by copy number.
    pub fn roles(&self, app: &str) -> String {
        let rank = |r: &str| ["active", "warm", "draining"].iter().position(|x| *x == r).unwrap_or(3);
        let mut copies: Vec<Copy> = self.copies(app).into_iter().filter(|c| c.ready && c.role != "-").collect();
        copies.sort_by_key(|c| (rank(&c.role), c.copy));
        copies.iter().map(|c| format!("{}:{}", c.copy, c.role)).collect::<Vec<_>>().join(" ")
    }

    /// Waits until the app's roles read exactly `want`.
    pub fn wait_roles(&self, app: &str, want: &str, timeout: Duration) {
        let what = format!("{app} roles to be '{want}'");
        let deadline = Instant::now() + slow(timeout);
        loop {
            let last = self.roles(app);
            if last == want {
                return;
            }
            if Instant::now() > deadline {
                panic!("timed out waiting for {what}; last: '{last}'\n{}", self.ok(&["status"]));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every copy of the app (at least one) is asleep, with no
    /// process; returns the copies as status shows them. The suite's one
    /// "wait until asleep".
    pub fn wait_asleep(&self, app: &str, timeout: Duration) -> Vec<Copy> {
        wait_until(timeout, &format!("{app} to sleep"), || {
            let copies = self.copies(app);
            (!copies.is_empty() && copies.iter().all(|c| c.status == "asleep" && c.pid.is_none())).then_some(copies)
        })
    }

    /// `shinyctl status` as text: of one app, or of all.
    pub fn status_text(&self, app: Option<&str>) -> String {
        match app {
            Some(app) => self.ok(&["status", app]),
            None => self.ok(&["status"]),
        }
    }

    /// One copy's record in the app's state.json (beside its manifest),
    /// when there is one.
    pub fn record(&self, app: &str, copy: u32) -> Option<Value> {
        let state: Value = serde_json::from_slice(&std::fs::read(self.dir.join("apps").join(app).join("state.json")).ok()?).ok()?;
        state["copies"].as_array()?.iter().find(|c| c["copy"] == copy).cloned()
    }

    /// The PID of the copy with this number.
    pub fn pid_of(&self, app: &str, copy: u32) -> u32 {
        self.copies(app).iter().find(|c| c.copy == copy).and_then(|c| c.pid).unwrap_or_else(|| panic!("copy {copy} has a PID"))
    }

    /// Remembers the daemon's and every recorded copy's PID, so they are
    /// ended when the test ends.
    fn note_pids(&self) {
        let Ok(reg) = std::fs::read(self.home().join("registry.json")) else { return };
        let Ok(reg) = serde_json::from_slice::<Value>(&reg) else { return };
        for app in reg["apps"].as_object().into_iter().flat_map(|m| m.values()) {
            let Some(state) = app["state_file"].as_str() else { continue };
            let Ok(s) = std::fs::read(state) else { continue };
            let Ok(s) = serde_json::from_slice::<Value>(&s) else { continue };
            for c in s["copies"].as_array().into_iter().flatten() {
                if let Some(p) = c["pid"].as_u64() {
                    self.remember(p as u32);
                }
            }
        }
    }

    /// The start times (unix seconds) of a copy's processes, from its log.
    pub fn starts(&self, log: &str) -> Vec<i64> {
        let text = std::fs::read_to_string(self.home().join("logs").join(log)).unwrap_or_default();
        text.lines()
            // A start's line, not an end's (`--- shinyctl: copy 2 (R's PID …) ended at …`).
            .filter(|l| l.starts_with("--- shinyctl: copy") && l.contains(" starting on "))
            .filter_map(|l| l.split(" at ").nth(1))
            .filter_map(|t| parse_rfc3339(t.trim_end_matches(" ---")))
            .collect()
    }

    /// Starts a daemon for this test's home with `cmd` (`shinyctl serve`,
    /// or a wrapper that execs it), its output dropped; ends it by PID with
    /// the test and reaps it when it ends. Returns its PID once its API
    /// answers.
    pub fn start_daemon(&self, cmd: Command) -> u32 {
        self.start_daemon_to(cmd, std::process::Stdio::null())
    }

    /// [`Env::start_daemon`] with the daemon's stderr to a file.
    pub fn start_daemon_with_stderr(&self, cmd: Command, stderr: &Path) -> u32 {
        self.start_daemon_to(cmd, std::fs::File::create(stderr).unwrap().into())
    }

    fn start_daemon_to(&self, mut cmd: Command, stderr: std::process::Stdio) -> u32 {
        let mut child = cmd
            .env("SHINYCTL_HOME", self.home())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("the daemon's command {cmd:?} runs: {e}"));
        let pid = child.id();
        self.track(pid);
        // Reaped when it ends, so its end is seen as an end.
        std::thread::spawn(move || child.wait());
        wait_until(Duration::from_secs(20), "the daemon to answer", || self.run(&["status"]).status.success().then_some(()));
        pid
    }

    /// Remembers a PID to end at the end of the test.
    pub fn track(&self, pid: u32) {
        self.remember(pid);
    }

    /// Remembers a running process with its start time; the first start
    /// time seen for a PID is the one this test started.
    fn remember(&self, pid: u32) {
        if let Some(start) = shinyctl::sys::procfs::start_ticks(pid) {
            self.pids.borrow_mut().entry(pid).or_insert(start);
        }
    }

    /// The remembered processes that are still the same ones (same PID and
    /// start time) and alive.
    fn still_ours(&self) -> Vec<u32> {
        self.pids.borrow().iter().filter(|(&pid, &start)| shinyctl::sys::procfs::is_alive(pid, start)).map(|(&pid, _)| pid).collect()
    }
}

/// Starts the thread that ends a test running past `TEST_LIMIT`: it kills
/// the processes of the test's home and aborts the test binary with the
/// test's name (a hung test would otherwise hold the suite forever).
fn watchdog(home: PathBuf) -> std::sync::mpsc::Sender<()> {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(slow(TEST_LIMIT)) {
            // Straight to stderr: eprintln! would be captured with the test's output and lost in the abort.
            let _ = writeln!(std::io::stderr(), "\n{test} ran past its limit of {TEST_LIMIT:?}: ending its processes and the test run");
            // The daemon first, so it starts nothing while the rest end.
            let mut pids = pids_with_home(&home);
            pids.sort_by_key(|&p| !cmdline(p).ends_with(" serve"));
            for pid in pids {
                signal_group(pid, 9);
                signal(pid, 9);
            }
            if let Some(dir) = home.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
            std::process::abort();
        }
    });
    tx
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.status_quiet();
        self.note_pids();
        // The daemons first, and wait for them: a daemon still running
        // would start a new load balancer when it sees the old one end.
        let daemons: Vec<u32> = self.still_ours().into_iter().filter(|p| self.daemons.borrow().contains(p)).collect();
        for &pid in &daemons {
            signal(pid, 15);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && daemons.iter().any(|&p| pid_alive(p)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        // Copies lead their own process group: end the group.
        for pid in self.still_ours() {
            signal(pid, 15);
            signal_group(pid, 15);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && !self.still_ours().is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
        for pid in self.still_ours() {
            signal(pid, 9);
            signal_group(pid, 9);
        }
        // Anything else this test's home started (a load balancer started
        // in the instant its daemon was ended): found by its environment.
        for pid in pids_with_home(&self.home()) {
            signal_group(pid, 9);
            signal(pid, 9);
        }
        // SHINYCTL_KEEP_FAILED=DIR keeps a failed test's logs there.
        if let (true, Some(keep)) = (std::thread::panicking(), std::env::var_os("SHINYCTL_KEEP_FAILED")) {
            let to = Path::new(&keep).join(self.dir.file_name().unwrap_or_default());
            let _ = std::fs::create_dir_all(&to);
            let _ = Command::new("cp").arg("-r").arg(self.home().join("logs")).arg(self.home().join("api.log")).arg(&to).status();
        }
        remove_cgroups(&self.home());
        remove_pool_tmp(&self.home());
        // A root daemon's copies' disks of their own outlive the daemon (as
        // they do a restart): unmounted here, which frees their loop devices.
        shinyctl::sys::disk::detach_below(&self.dir).into_iter().for_each(|t| drop(t.join()));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The tags a daemon of `home` names its cgroups and its pool's folder by
/// (`shinyctl::sys::cgroup::home_tag`): of the home as it sees it, which
/// for a home reached through a symbolic link (the quick start's
/// `~/.shinyctl`) is where the link leads, and of the home as given.
fn home_tags(home: &Path) -> Vec<String> {
    let tag = shinyctl::sys::cgroup::home_tag;
    [Some(tag(home)), std::fs::canonicalize(home).ok().map(|h| tag(&h))].into_iter().flatten().collect()
}

/// Removes the pool's zygote's temporary folders (`shinyctl-pool-<tag>-…`
/// in the system's temporary folder) that `ours` picks. A daemon ended by
/// SIGKILL leaves its own (one ended by SIGTERM removes it; a later daemon
/// of the same home would too).
fn remove_pool_folders(ours: impl Fn(&std::fs::DirEntry) -> bool) {
    for e in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().starts_with("shinyctl-pool-") && ours(&e) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Removes this home's pool's folder ([`remove_pool_folders`]), found by
/// the home's tags.
fn remove_pool_tmp(home: &Path) {
    let prefixes: Vec<String> = home_tags(home).iter().map(|t| format!("shinyctl-pool-{t}-")).collect();
    remove_pool_folders(|e| prefixes.iter().any(|p| e.file_name().to_string_lossy().starts_with(p.as_str())));
    remove_old_zygote_r_tmp(home);
}

/// Removes the `Rtmp…` folders in /tmp of this home's zygote's uid (under
/// a root daemon, from the ids file): a zygote of a build from before the
/// pool had a temporary folder of its own (the upgrade tests' previous
/// build) kept R's tempdir() in /tmp, and R ended by a signal leaves it.
fn remove_old_zygote_r_tmp(home: &Path) {
    use std::os::unix::fs::MetadataExt;
    let ids: Value = std::fs::read(shinyctl::sys::ids::ids_file()).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
    let Some(uid) = ids["apps"][format!("{}:.pool/zygote", home.display())].as_u64() else { return };
    for e in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
        let r_tmp = e.file_name().to_string_lossy().starts_with("Rtmp");
        if r_tmp && e.metadata().is_ok_and(|m| m.is_dir() && u64::from(m.uid()) == uid) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Removes the cgroups a daemon of this home made for its copies
/// (`shinyctl-<tag>` folders, up to five levels below /sys/fs/cgroup, by
/// [`home_tags`]), once the copies are ended: the daemon, ended first,
/// could not. A cgroup is removable once the kernel has let go of its last
/// process, which may take a moment after a SIGKILL: tried for up to 5 s.
fn remove_cgroups(home: &Path) {
    let names: Vec<String> = home_tags(home).iter().map(|t| format!("shinyctl-{t}")).collect();
    let mut found = Vec::new();
    let mut level = vec![PathBuf::from("/sys/fs/cgroup")];
    for _ in 0..5 {
        let mut next = Vec::new();
        for dir in &level {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
                if names.iter().any(|n| e.file_name().to_string_lossy() == n.as_str()) {
                    found.push(e.path());
                } else {
                    next.push(e.path());
                }
            }
        }
        level = next;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !found.is_empty() && Instant::now() < deadline {
        for dir in &found {
            // A cgroup's files go with it; its children first.
            for child in std::fs::read_dir(dir).into_iter().flatten().flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
                let _ = std::fs::remove_dir(child.path());
            }
            let _ = std::fs::remove_dir(dir);
        }
        found.retain(|d| d.exists());
        if !found.is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Env {
    fn status_quiet(&self) -> Option<()> {
        let out = Command::new(bin()).args(["status", "--json"]).env("SHINYCTL_HOME", self.home()).output().ok()?;
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        self.note_status_pids(&v);
        Some(())
    }

    /// Remembers the daemon's and the load balancer's PIDs from a status.
    fn note_status_pids(&self, v: &Value) {
        if let Some(p) = v["daemon_pid"].as_u64() {
            self.daemons.borrow_mut().insert(p as u32);
            self.remember(p as u32);
        }
        if let Some(p) = v["proxy_pid"].as_u64() {
            self.remember(p as u32);
        }
    }
}

/// A folder's entry names, sorted (none when it cannot be read), but for
/// the state-file the daemon keeps in an app folder, its second name
/// (README, "Files") and their temporary files caught mid-write.
pub fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !["state.json", "state.json.synced"].contains(&n.as_str()) && !n.starts_with(".state.json."))
        .collect();
    names.sort();
    names
}

/// The processes of this SHINYCTL_HOME: those whose environment names it
/// (the daemon, the load balancer, an unfenced copy) and the copy
/// launchers that carry it as `--home` (a fenced copy's environment is
/// clean; its R runs in the launcher's process group).
pub fn pids_with_home(home: &Path) -> Vec<u32> {
    let needle = format!("SHINYCTL_HOME={}", home.display());
    let mark = format!("\0--home\0{}\0", home.display());
    let Ok(dir) = std::fs::read_dir("/proc") else { return vec![] };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let in_env = std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
                .unwrap_or(false);
            let marked =
                std::fs::read(format!("/proc/{pid}/cmdline")).map(|c| c.windows(mark.len()).any(|w| w == mark.as_bytes())).unwrap_or(false);
            in_env || marked
        })
        .collect()
}

/// One copy as status shows it.
#[derive(Debug, Clone)]
pub struct Copy {
    pub copy: u32,
    pub role: String,
    pub pid: Option<u32>,
    pub ready: bool,
    pub status: String,
    pub sessions: u64,
    pub crashes: u64,
    pub copy_port: u16,
}

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
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU32>,
    /// The copy that served the last answer (0 before one).
    last_copy: Arc<AtomicU32>,
    handle: Option<std::thread::JoinHandle<Vec<String>>>,
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

    fn spawn(port: u16, mut cookie: Option<String>) -> Loop {
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
fn parse_rfc3339(s: &str) -> Option<i64> {
    s.parse::<jiff::Timestamp>().ok().map(|t| t.as_second())
}

/// The build of the release before this one (`SHINYCTL_PREVIOUS_BUILD`,
/// which `./test.sh` builds from git into `target/previous`): a build whose
/// code really differs, for an upgrade.
pub fn previous_build() -> PathBuf {
    let path = std::env::var_os("SHINYCTL_PREVIOUS_BUILD").map(PathBuf::from).unwrap_or_else(|| {
        panic!(
            "SHINYCTL_PREVIOUS_BUILD is not set: run the tests through ./test.sh, which builds the previous release into target/previous"
        )
    });
    assert!(path.is_file(), "the previous build {} is missing: ./test.sh builds it", path.display());
    path
}

/// Runs `cmd` to its end. A binary this process has just written (another
/// build, a copy) can be busy for a moment (ETXTBSY): a child that another
/// test forked while the file was open for writing holds the descriptor
/// until it execs. Tried again for up to a second.
fn output_when_not_busy(cmd: &mut Command) -> Output {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            result => return result.expect("run shinyctl"),
        }
    }
}

/// A copy of the binary under test that says it is another build: the
/// build identity (`0.1.0+<16 hex digits>`) is rewritten in its bytes.
pub fn another_build(dir: &Path) -> PathBuf {
    let version = String::from_utf8(std::process::Command::new(bin()).arg("version").output().unwrap().stdout).unwrap();
    let build = version.trim().strip_prefix("shinyctl ").unwrap().to_string();
    let (_, id) = build.split_once('+').unwrap();
    assert_eq!(id.len(), 16);
    let other: String = id.chars().map(|c| if c == '0' { '1' } else { '0' }).collect();
    let bytes = std::fs::read(bin()).unwrap();
    let (from, to) = (build.as_bytes(), format!("{}+{other}", build.split_once('+').unwrap().0).into_bytes());
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    let mut replaced = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(from) {
            out.extend_from_slice(&to);
            i += from.len();
            replaced += 1;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    assert!(replaced > 0, "the build identity is in the binary");
    let path = dir.join("old-build").join("shinyctl");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, out).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// README, "The fence": an R ended by a signal leaves its `tempdir()` in
/// its copy's /tmp (kept through restarts), and the copy's next R removes
/// it. Kills copy 1's R (`r`, with one `Rtmp*` folder in the copy's /tmp),
/// waits until the copy has started again and is active, and checks that
/// only the new R's folder is there.
pub fn killed_r_leaves_no_tempdir(env: &Env, app: &str, r: u32) {
    let tmp = env.home().join(format!("scratch/default-{app}/1.tmp"));
    let r_tmp = || -> Vec<String> {
        let names = std::fs::read_dir(&tmp).map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect());
        names.unwrap_or_else(|_: std::io::Error| Vec::new()).into_iter().filter(|n| n.starts_with("Rtmp")).collect()
    };
    let before = r_tmp();
    assert_eq!(before.len(), 1, "one R, one tempdir() in {}: {before:?}", tmp.display());
    signal(r, libc::SIGKILL);
    wait_until(Duration::from_secs(60), "copy 1 started again", || {
        env.copies(app).iter().find(|c| c.copy == 1).and_then(|c| c.pid).filter(|&p| p != r).map(|_| ())
    });
    env.wait_roles(app, "1:active", Duration::from_secs(60));
    let now = r_tmp();
    assert!(now.len() == 1 && now != before, "only the new R's tempdir() is left in {}: {now:?} (before {before:?})", tmp.display());
}
