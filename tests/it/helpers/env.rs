//! One test's world (`Env`): its own SHINYCTL_HOME, the binary run in it,
//! status read from it, and every process it started remembered by PID.

use super::*;

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
    pub(super) pids: std::cell::RefCell<BTreeMap<u32, u64>>,
    /// The daemons among them: ended first, so none starts a new load
    /// balancer while the old one is being ended.
    pub(super) daemons: std::cell::RefCell<BTreeSet<u32>>,
    /// Dropping it tells the watchdog the test is over.
    pub(super) _watchdog: std::sync::mpsc::Sender<()>,
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
    pub(super) fn note_pids(&self) {
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

    /// A daemon that is not root: `user`'s, with this test's folder (its
    /// home and the apps written so far) given to it and `HOME` there, as
    /// `user` would start it. Returns its PID once its API answers.
    pub fn start_daemon_as(&self, user: &TestUser) -> u32 {
        let (uid, gid) = (user.id("-u"), user.id("-g"));
        assert!(Command::new("chown").args(["-R", &format!("{uid}:{gid}")]).arg(&self.dir).status().unwrap().success());
        let mut cmd = Command::new("setpriv");
        cmd.args([&format!("--reuid={uid}"), &format!("--regid={gid}"), "--init-groups"]).args([bin(), "serve"]).env("HOME", &self.dir);
        self.start_daemon(cmd)
    }

    /// [`Env::start_daemon`] with the daemon's stderr to a file.
    pub fn start_daemon_with_stderr(&self, cmd: Command, stderr: &Path) -> u32 {
        self.start_daemon_to(cmd, std::fs::File::create(stderr).unwrap().into())
    }

    pub(super) fn start_daemon_to(&self, mut cmd: Command, stderr: std::process::Stdio) -> u32 {
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
    pub(super) fn remember(&self, pid: u32) {
        if let Some(start) = shinyctl::sys::procfs::start_ticks(pid) {
            self.pids.borrow_mut().entry(pid).or_insert(start);
        }
    }

    /// The remembered processes that are still the same ones (same PID and
    /// start time) and alive.
    pub(super) fn still_ours(&self) -> Vec<u32> {
        self.pids.borrow().iter().filter(|(&pid, &start)| shinyctl::sys::procfs::is_alive(pid, start)).map(|(&pid, _)| pid).collect()
    }
}

impl Env {
    pub(super) fn status_quiet(&self) -> Option<()> {
        let out = Command::new(bin()).args(["status", "--json"]).env("SHINYCTL_HOME", self.home()).output().ok()?;
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        self.note_status_pids(&v);
        Some(())
    }

    /// Remembers the daemon's and the load balancer's PIDs from a status.
    pub(super) fn note_status_pids(&self, v: &Value) {
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
