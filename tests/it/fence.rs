//! The fence, tried from inside a real R app: each copy in its own user,
//! mount, PID, IPC and UTS namespaces, with shinyctl's init as PID 1, a
//! private /tmp, SHINYCTL_HOME and ~/.ssh hidden, the release read-only
//! and a clean environment; the daemon records the launcher and shows R's
//! PID. The app reports what it got on its page.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::helpers::*;

/// The probe: at start it tries what a hostile app would (signals to the
/// daemon and the load balancer, a write into its release) and leaves a
/// file in its scratch disk and in /tmp; each page says what it can see
/// now (shinyctl's sockets and key, the other copy's files, ~/.ssh), its
/// environment, PID 1 and its hostname, as `key=value;` lines.
const PROBE_R: &str = r#"
library(shiny)
h <- Sys.getenv("PROBE_HOME")
me <- Sys.getenv("SHINYCTL_COPY")
other <- if (me == "1") "2" else "1"
scratch <- Sys.getenv("SHINYCTL_SCRATCH")
kept <- if (file.exists(file.path(scratch, "marker"))) "kept" else "empty"
writeLines("x", file.path(scratch, "marker"))
writeLines(me, file.path("/tmp", paste0("mine-", me)))
yes <- function(x) if (isTRUE(x)) "yes" else "no"
readable <- function(p) yes(tryCatch(length(readBin(p, "raw", 1)) >= 0, error = function(e) FALSE, warning = function(w) FALSE))
killed <- function(pid) yes(suppressWarnings(tools::pskill(as.integer(pid), tools::SIGTERM)))
kills <- c(daemon = killed(Sys.getenv("DAEMON_PID")), proxy = killed(Sys.getenv("PROXY_PID")))
release <- yes(suppressWarnings(tryCatch(file.create("in-release.txt"), error = function(e) FALSE)))
writable <- Sys.getenv("WRITABLE")
hidden <- Sys.getenv("HIDDEN")
wrote_writable <- if (nzchar(writable)) yes(tryCatch(file.create(file.path(writable, paste0("from-copy-", me))), error = function(e) FALSE)) else "-"
ipcns <- Sys.readlink("/proc/self/ns/ipc")
status_of <- function(key) sub(".*:\\s*", "", grep(paste0("^", key, ":"), readLines("/proc/self/status"), value = TRUE))
nofile <- local({
  l <- grep("^Max open files", readLines("/proc/self/limits"), value = TRUE)
  strsplit(trimws(sub("^Max open files", "", l)), "\\s+")[[1]][1]
})
pid1 <- local({
  r <- tryCatch(readBin("/proc/1/cmdline", "raw", 4096), error = function(e) raw())
  r[r == as.raw(0)] <- as.raw(32)
  rawToChar(r)
})
ui <- function(req) {
  others_tmp <- setdiff(list.files("/tmp", pattern = "^mine-"), paste0("mine-", me))
  lines <- c(
    paste0("copy=", me), paste0("scratch=", kept),
    paste0("api=", yes(file.exists(file.path(h, "api.sock")))),
    paste0("proxysock=", yes(file.exists(file.path(h, "proxy", "proxy.sock")))),
    paste0("handover=", yes(file.exists(file.path(h, "proxy", "handover.sock")))),
    paste0("cookie=", readable(file.path(h, "proxy", "cookie.key"))),
    paste0("killdaemon=", kills[["daemon"]]), paste0("killproxy=", kills[["proxy"]]),
    paste0("otherscratch=", yes(file.exists(file.path(h, "scratch", paste0("default-", Sys.getenv("PROBE_APP")), other, "marker")))),
    paste0("othertmp=", length(others_tmp)),
    paste0("ssh=", readable(file.path(Sys.getenv("HOME"), ".ssh", "id_rsa"))),
    paste0("release=", release), paste0("writable=", wrote_writable),
    paste0("hidden=", if (nzchar(hidden)) readable(file.path(hidden, "secret")) else "-"),
    paste0("env=", paste(sort(names(Sys.getenv())), collapse = ",")),
    paste0("pid=", Sys.getpid()), paste0("pid1=", pid1),
    paste0("host=", Sys.info()[["nodename"]]),
    paste0("ipcns=", ipcns), paste0("nnp=", status_of("NoNewPrivs")), paste0("nofile=", nofile)
  )
  tags$pre(paste0(lines, ";", collapse = "\n"))
}
shinyApp(ui, function(input, output) {})
"#;

/// A test's world with a daemon started by hand: HOME is a folder of the
/// test's with a private key in `.ssh`, and the daemon's environment
/// carries variables no copy may see.
pub(crate) struct Fenced {
    pub env: Env,
    /// The daemon's HOME: outside /tmp (the copy has its own), so only its
    /// hiding keeps ~/.ssh out of reach.
    pub user_home: UserHome,
    pub daemon: u32,
    pub proxy: u32,
}

/// A home folder with a private key in `.ssh`, below /var/tmp (which a
/// copy sees, read-only), removed at the end.
pub(crate) struct UserHome(pub PathBuf);

impl UserHome {
    pub fn new(name: &str) -> UserHome {
        let dir = PathBuf::from(format!("/var/tmp/shinyctl-it-{}-{name}", std::process::id()));
        std::fs::create_dir_all(dir.join(".ssh")).unwrap();
        std::fs::write(dir.join(".ssh/id_rsa"), "PRIVATE KEY").unwrap();
        UserHome(dir)
    }
}

impl Drop for UserHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The variables the daemon gets that no fenced copy may see.
const LEAKS: [(&str, &str); 2] = [("FENCE_MARKER", "leaked"), ("SSH_AUTH_SOCK", "/nowhere/agent.sock")];

impl Fenced {
    pub fn start(name: &str) -> Fenced {
        let env = Env::new(name);
        let user_home = UserHome::new(name);
        let out = Command::new(bin())
            .args(["serve", "-d"])
            .env("SHINYCTL_HOME", env.home())
            .env("HOME", &user_home.0)
            .envs(LEAKS)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "serve -d: {out:?}");
        let status = env.status();
        let daemon = status["daemon_pid"].as_u64().expect("the daemon's PID") as u32;
        let proxy = wait_until(Duration::from_secs(20), "the load balancer", || env.status()["proxy_pid"].as_u64()) as u32;
        Fenced { env, user_home, daemon, proxy }
    }

    /// Writes the probe app `name` with `extra` manifest lines and its env
    /// (the home, the PIDs to try, and `more_env` lines); returns the
    /// manifest and the port.
    fn probe(&self, name: &str, extra: &str, more_env: &str) -> (PathBuf, u16) {
        let port = free_port();
        let env_lines = format!(
            "env:\n  PROBE_APP: \"{name}\"\n  PROBE_HOME: \"{}\"\n  DAEMON_PID: \"{}\"\n  PROXY_PID: \"{}\"\n{more_env}",
            self.env.home().display(),
            self.daemon,
            self.proxy
        );
        let manifest = self.env.app(name, port, &format!("{extra}{env_lines}"));
        std::fs::write(manifest.parent().unwrap().join("app.R"), PROBE_R).unwrap();
        (manifest, port)
    }
}

impl Fenced {
    /// Deploys the probe app `name` (see [`Fenced::probe`]) and waits for
    /// `roles`; returns its port.
    fn deployed(&self, name: &str, extra: &str, more_env: &str, roles: &str) -> u16 {
        let (manifest, port) = self.probe(name, extra, more_env);
        self.env.apply(&manifest);
        self.env.wait_roles(name, roles, Duration::from_secs(60));
        port
    }
}

/// The probe's answers on a page, by key.
fn answers(page: &str) -> std::collections::BTreeMap<String, String> {
    let body = between(page, "<pre>", "</pre>").unwrap_or_else(|| panic!("the probe's page: {page}"));
    body.lines().filter_map(|l| l.trim().trim_end_matches(';').split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Pages from the app until both copies have answered; their answers.
fn from_both(port: u16) -> [std::collections::BTreeMap<String, String>; 2] {
    let mut got: [Option<std::collections::BTreeMap<String, String>>; 2] = [None, None];
    wait_until(Duration::from_secs(30), "a page from each copy", || {
        let a = answers(&get(port, "/", &[]).ok().filter(|r| r.status == 200)?.body);
        let i = if a["copy"] == "1" { 0 } else { 1 };
        got[i] = Some(a);
        got.iter().all(Option::is_some).then_some(())
    });
    got.map(|a| a.unwrap())
}

/// The fences of copy `copy` of the app in `status --json`, as name → state.
fn fences(env: &Env, app: &str, copy: u32) -> std::collections::BTreeMap<String, String> {
    let v = env.status();
    let a = v["apps"].as_array().unwrap().iter().find(|a| a["name"] == app).cloned().expect("the app in status");
    let c = a["copies"].as_array().unwrap().iter().find(|c| c["copy"] == copy).cloned().expect("the copy");
    c["isolation"]["fences"]
        .as_array()
        .unwrap_or_else(|| panic!("fences in {c}"))
        .iter()
        .map(|f| (f["name"].as_str().unwrap().to_string(), f["state"].as_str().unwrap().to_string()))
        .collect()
}

const NAMESPACES: [&str; 5] = ["user-ns", "mount-ns", "pid-ns", "ipc-ns", "uts-ns"];

#[test]
fn a_fenced_copy_reaches_nothing_of_shinyctl_nor_of_the_other_copy() {
    let app = unique("fence");
    let f = Fenced::start("fence");
    let port = f.deployed(&app, "replicas: 2\nwarm-replicas: 0\nlb-policy: round-robin\n", "", "1:active 2:active");
    for (i, a) in from_both(port).iter().enumerate() {
        let who = format!("copy {}: {a:?}", i + 1);
        for key in ["api", "proxysock", "handover", "cookie"] {
            assert_eq!(a[key], "no", "{key} is out of reach: {who}");
        }
        assert_eq!((a["killdaemon"].as_str(), a["killproxy"].as_str()), ("no", "no"), "kill fails: {who}");
        assert_eq!((a["otherscratch"].as_str(), a["othertmp"].as_str()), ("no", "0"), "the other copy's files: {who}");
        assert_eq!(a["ssh"], "no", "~/.ssh is hidden: {who}");
        assert_eq!(a["release"], "no", "the release is read-only: {who}");
        assert_eq!(a["host"], app, "the hostname is the app's name: {who}");
        assert!(a["pid1"].contains("launch") && a["pid1"].contains("--home"), "PID 1 is shinyctl's init: {who}");
        assert!(a["pid"].parse::<u32>().unwrap() < 10, "R's PID in its own namespace is small: {who}");
        let names: Vec<&str> = a["env"].split(',').collect();
        for (leak, _) in LEAKS.iter().chain(&[("SHINYCTL_HOME", "")]) {
            assert!(!names.contains(leak), "{leak} is not in the copy's environment: {who}");
        }
        assert!(names.contains(&"SHINYCTL_COPY") && names.contains(&"PROBE_HOME"), "the copy's own and the manifest's env: {who}");
        // Seen from inside R, not from the launcher's report.
        let host_ipc = std::fs::read_link("/proc/self/ns/ipc").unwrap().to_string_lossy().into_owned();
        assert!(a["ipcns"].starts_with("ipc:[") && a["ipcns"] != host_ipc, "an IPC namespace of its own: {who}");
        assert_eq!(a["nnp"], "1", "no_new_privs is set on R: {who}");
        assert_eq!(a["nofile"], "4096", "open-files (its default) is R's limit: {who}");
    }
    let both = from_both(port);
    assert_ne!(both[0]["ipcns"], both[1]["ipcns"], "each copy has its own IPC namespace");
    assert!(pid_alive(f.daemon) && pid_alive(f.proxy), "the daemon and the load balancer are untouched");
    for copy in [1, 2] {
        let got = fences(&f.env, &app, copy);
        for ns in NAMESPACES {
            assert_eq!(got[ns], "in-force", "copy {copy}'s {ns}: {got:?}");
        }
        // Each copy's /tmp is a folder of its own on the disk, beside its scratch.
        let tmp = f.env.home().join(format!("scratch/default-{app}/{copy}.tmp/mine-{copy}"));
        assert_eq!(std::fs::read_to_string(&tmp).unwrap().trim(), copy.to_string(), "{}", tmp.display());
    }
    assert!(f.user_home.0.join(".ssh/id_rsa").exists());
}

#[test]
fn the_daemon_records_the_launcher_and_shows_r_and_a_stop_ends_the_whole_copy() {
    let app = unique("fencepid");
    let f = Fenced::start("fencepid");
    let port = f.deployed(&app, "warm-replicas: 0\n", "", "1:active");
    wait_http_ok(port, Duration::from_secs(10));
    let v = f.env.status();
    let c = &v["apps"][0]["copies"][0];
    let (r, launcher) = (c["pid"].as_u64().unwrap() as u32, c["launcher_pid"].as_u64().unwrap() as u32);
    assert!(is_copy_r(r), "the PID column is R's: {}", cmdline(r));
    assert!(cmdline(launcher).contains(" launch ") && cmdline(launcher).contains(&format!("--home {}", f.env.home().display())));
    let state: Value = serde_json::from_slice(&std::fs::read(f.env.dir.join("apps").join(&app).join("state.json")).unwrap()).unwrap();
    assert_eq!(state["copies"][0]["pid"].as_u64(), Some(launcher as u64), "state.json records the launcher");
    let text = f.env.ok(&["status"]);
    assert!(text.lines().nth(1).unwrap().split_whitespace().nth(4) == Some(&r.to_string()), "{text}");

    // R killed: the launcher ends by the same signal, counted as a crash,
    // and the copy comes back.
    signal(r, 9);
    wait_gone(launcher, Duration::from_secs(10), "the launcher to follow R");
    wait_until(Duration::from_secs(60), "the copy back after its crash", || {
        f.env.copies(&app).into_iter().find(|c| c.ready && c.crashes == 1 && c.pid != Some(r))
    });
    let log = std::fs::read_to_string(f.env.home().join("api.log")).unwrap();
    assert!(log.contains("was killed by signal 9"), "the exit is R's signal: {log}");

    // delete --now: SIGTERM to the group, forwarded by the init; nothing
    // of the copy is left.
    let v = f.env.status();
    let c = &v["apps"][0]["copies"][0];
    let (r, launcher) = (c["pid"].as_u64().unwrap() as u32, c["launcher_pid"].as_u64().unwrap() as u32);
    f.env.ok(&["delete", &app, "--now"]);
    wait_gone(r, Duration::from_secs(15), "R to stop");
    wait_gone(launcher, Duration::from_secs(15), "the launcher to stop");
    assert!(!pids_with_home(&f.env.home()).iter().any(|&p| cmdline(p).contains(" launch ")), "no launcher left");
}

#[test]
fn a_fenced_copy_keeps_its_own_scratch_disk_through_a_sleep() {
    let app = unique("fencesleep");
    let f = Fenced::start("fencesleep");
    let port = f.deployed(&app, "warm-replicas: 0\nidle-timeout: 20s\n", "", "1:active");
    assert_eq!(answers(&wait_http_ok(port, Duration::from_secs(10)).body)["scratch"], "empty");
    let before = f.env.copies(&app)[0].pid.unwrap();
    f.env.wait_asleep(&app, Duration::from_secs(60));
    wait_gone(before, Duration::from_secs(20), "the copy to be stopped");
    let page = wait_http_ok(port, Duration::from_secs(30)).body;
    assert_eq!(answers(&page)["scratch"], "kept", "woken with its own disk: {page}");
}

#[test]
fn an_unprivileged_daemon_serves_a_fenced_copy() {
    // Made first, so they go last: after the test's processes have ended.
    let home = UserHome::new("fenceuser");
    let user = TestUser::create(Some(&home.0));
    let env = Env::new("fenceuser");
    let app = unique("fenceuser");
    let (uid, gid) = (user.id("-u"), user.id("-g"));
    let ranges = user.subordinate_ids();
    let port = free_port();
    let manifest = env.app(&app, port, "warm-replicas: 0\n");
    for dir in [&env.dir, &home.0] {
        let chown = Command::new("chown").args(["-R", &format!("{uid}:{gid}")]).arg(dir).status().unwrap();
        assert!(chown.success());
    }
    let mut child = Command::new("setpriv")
        .args([&format!("--reuid={uid}"), &format!("--regid={gid}"), "--init-groups"])
        .args([bin(), "serve"])
        .env("SHINYCTL_HOME", env.home())
        .env("HOME", &home.0)
        .env("USER", &user.name)
        .env("LOGNAME", &user.name)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("setpriv (util-linux)");
    env.track(child.id());
    std::thread::spawn(move || child.wait());
    wait_until(Duration::from_secs(20), "the daemon to answer", || env.run(&["status"]).status.success().then_some(()));
    env.apply(&manifest);
    env.wait_roles(&app, "1:active", Duration::from_secs(60));
    assert_eq!(wait_http_ok(port, Duration::from_secs(10)).status, 200, "the fenced copy serves");
    let r = env.pid_of(&app, 1);
    let status = std::fs::read_to_string(format!("/proc/{r}/status")).unwrap();
    let host_uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap().split_whitespace().nth(1).unwrap().to_string();
    let own: u32 = host_uid.parse().unwrap();
    assert!(
        own != uid && ranges.iter().any(|r| (r.0..=r.1).contains(&own)),
        "R runs as one of the daemon user's subordinate ids {ranges:?}, not as it: {own}"
    );
    assert_eq!(env.status()["apps"][0]["uid"].as_u64(), Some(own as u64), "the app's own uid, in status --json");
    let got = fences(&env, &app, 1);
    for ns in NAMESPACES {
        assert_eq!(got[ns], "in-force", "{ns} for an unprivileged daemon: {got:?}");
    }
}

#[test]
fn writable_and_hidden_paths_and_mode_off_turns_the_fence_off() {
    let app = unique("fenceoff");
    let f = Fenced::start("fenceoff");
    let writable = f.env.dir.join("data");
    std::fs::create_dir_all(&writable).unwrap();
    // Writable by the app's own uid, as status would tell its operator.
    std::fs::set_permissions(&writable, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    // Below /var/tmp, which a copy otherwise sees.
    let hidden = f.user_home.0.join("secrets");
    std::fs::create_dir_all(&hidden).unwrap();
    std::fs::write(hidden.join("secret"), "s").unwrap();
    // The second writable path holds the hidden one: bound after the
    // cover, it would show it, so it is left out.
    let extra = format!(
        "warm-replicas: 0\nsandbox:\n  writable-paths: [\"{}\", \"{}\"]\n  hidden-paths: [\"{}\"]\n",
        writable.display(),
        f.user_home.0.display(),
        hidden.display()
    );
    let more_env = format!("  WRITABLE: \"{}\"\n  HIDDEN: \"{}\"\n", writable.display(), hidden.display());
    let port = f.deployed(&app, &extra, &more_env, "1:active");
    let a = answers(&wait_http_ok(port, Duration::from_secs(10)).body);
    assert_eq!((a["writable"].as_str(), a["release"].as_str(), a["hidden"].as_str()), ("yes", "no", "no"), "{a:?}");
    assert!(writable.join("from-copy-1").exists(), "written on the host");
    let log = std::fs::read_to_string(f.env.home().join(format!("logs/default-{app}.log"))).unwrap();
    // (It holds the secrets' cover too, `.ssh`, found first.)
    let left_out = format!("the writable path {} is left out: it is in or holds {}/", f.user_home.0.display(), f.user_home.0.display());
    assert!(log.contains(&left_out), "{log}");
    // One in shinyctl's home is refused at apply, naming the line.
    let in_home = f.env.app(
        &unique("fenceinhome"),
        free_port(),
        &format!("sandbox:\n  writable-paths: [\"{}\"]\n", f.env.home().join("proxy").display()),
    );
    let out = f.env.run(&["apply", "-f", in_home.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("app.yaml:3: sandbox: writable-paths: ") && said.contains("/proxy is in shinyctl's home"),
        "{said}"
    );

    // mode: off: a plain process, as before the fence. Nothing is killed:
    // the PIDs it is given are ones the test made for it.
    let mut decoy = Command::new("sleep").arg("600").spawn().unwrap();
    f.env.track(decoy.id());
    let port2 = free_port();
    let plain = unique("fenceplain");
    let manifest = f.env.app(
        &plain,
        port2,
        &format!(
            "warm-replicas: 0\nsandbox:\n  mode: off\nenv:\n  PROBE_HOME: \"{}\"\n  DAEMON_PID: \"{}\"\n  PROXY_PID: \"{}\"\n",
            f.env.home().display(),
            decoy.id(),
            decoy.id()
        ),
    );
    std::fs::write(manifest.parent().unwrap().join("app.R"), PROBE_R).unwrap();
    f.env.apply(&manifest);
    f.env.wait_roles(&plain, "1:active", Duration::from_secs(60));
    let a = answers(&wait_http_ok(port2, Duration::from_secs(10)).body);
    assert_eq!((a["api"].as_str(), a["proxysock"].as_str(), a["cookie"].as_str()), ("yes", "yes", "yes"), "{a:?}");
    assert_eq!((a["ssh"].as_str(), a["killdaemon"].as_str()), ("yes", "yes"), "{a:?}");
    assert!(a["env"].split(',').any(|n| n == "FENCE_MARKER"), "the daemon's environment: {a:?}");
    assert_ne!(a["host"], plain);
    let got = fences(&f.env, &plain, 1);
    assert!(got.values().all(|s| s == "off"), "{got:?}");
    let _ = decoy.kill();
    let _ = decoy.wait();
    // With the fence off the probe's /tmp is the host's: its file goes.
    let _ = std::fs::remove_file("/tmp/mine-1");
}

#[test]

fn a_root_daemon_runs_a_copy_as_its_run_as_user() {
    // Made first, so they go last: after the test's processes have ended.
    let home = UserHome::new("fencerunas");
    let user = TestUser::create(Some(&home.0));
    let f = Fenced::start("fencerunas");
    let app = unique("fencerunas");
    let port = f.deployed(&app, &format!("warm-replicas: 0\nrun-as: {}\n", user.name), "", "1:active");
    let a = answers(&wait_http_ok(port, Duration::from_secs(10)).body);
    assert_eq!(a["release"], "no", "{a:?}");
    let r = f.env.pid_of(&app, 1);
    let status = std::fs::read_to_string(format!("/proc/{r}/status")).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap().split_whitespace().nth(1).unwrap().to_string();
    assert_eq!(uid, user.id("-u").to_string(), "R runs as the run-as user on the host");
    let environ = std::fs::read(format!("/proc/{r}/environ")).unwrap();
    for want in [format!("USER={}", user.name), format!("LOGNAME={}", user.name), format!("HOME={}", home.0.display())] {
        assert!(environ.split(|b| *b == 0).any(|kv| kv == want.as_bytes()), "{want} in R's environment");
    }
    // The probe wrote its scratch disk and /tmp at start; the fence holds
    // for the run-as user as for any other.
    assert_eq!(a["scratch"], "empty", "{a:?}");
    assert_eq!((a["api"].as_str(), a["cookie"].as_str(), a["ssh"].as_str()), ("no", "no", "no"), "{a:?}");
    assert_eq!((a["killdaemon"].as_str(), a["killproxy"].as_str()), ("no", "no"), "{a:?}");
    use std::os::unix::fs::MetadataExt;
    let scratch = std::fs::metadata(f.env.home().join(format!("scratch/default-{app}/1"))).unwrap();
    assert_eq!(scratch.uid(), user.id("-u"), "the scratch disk is theirs");
    let log = f.env.home().join(format!("logs/default-{app}.log"));
    assert_eq!(std::fs::metadata(&log).unwrap().uid(), user.id("-u"), "the log is theirs");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("cannot") && !text.contains("left out"), "the copy's root was built whole: {text}");
    assert!(!f.env.ok(&["status"]).contains("copies run as root"), "no root line with run-as");
    // The next R, as the run-as user, removes the tempdir() of this one.
    killed_r_leaves_no_tempdir(&f.env, &app, r);
}

/// `run-as` with the fence off under a root daemon: the copy would run as
/// the user with no mount namespace, and the user cannot enter the
/// daemon's home (0700, root's) where its release is. apply refuses it,
/// naming the line and what works, and starts nothing (it used to accept
/// it and crash-loop on "cannot enter the app folder").
#[test]
fn a_root_daemon_refuses_run_as_with_the_fence_off_and_says_what_works() {
    if !needs_root("only a root daemon runs copies as a run-as user") {
        return;
    }
    let user = TestUser::create(None);
    let env = Env::new("fencerunasoff");
    let app = unique("runasoff");
    let manifest = env.app(&app, free_port(), &format!("warm-replicas: 0\nrun-as: {}\nsandbox:\n  mode: off\n", user.name));
    let out = env.run(&["apply", "-f", manifest.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused: {err}");
    let want = format!("{}:4: run-as: {} with sandbox.mode: off cannot work under a root daemon", manifest.display(), user.name);
    assert!(err.contains(&want) && err.contains("use sandbox.mode: on (the default)"), "{err}");
    assert!(!env.ok(&["list"]).contains(&app), "nothing was deployed");
    // With the fence on, the same user works (a_root_daemon_runs_a_copy_as_its_run_as_user).
    std::fs::write(&manifest, format!("app-name: {app}\nport: {}\nwarm-replicas: 0\nrun-as: {}\n", free_port(), user.name)).unwrap();
    env.ok(&["apply", "-f", manifest.to_str().unwrap(), "--wait=60s"]);
}

#[test]
fn strict_mode_refuses_a_copy_without_the_whole_fence() {
    let env = Env::new("fencestrict");
    crate::launcher::serve_without_namespaces(&env);
    let app = unique("fencestrict");
    let manifest = env.app(&app, free_port(), "warm-replicas: 0\nsandbox:\n  mode: strict\n");
    env.apply(&manifest);
    let log = env.home().join(format!("logs/default-{app}.log"));
    let line = wait_until(Duration::from_secs(60), "the launcher's refusal in the copy's log", || {
        std::fs::read_to_string(&log).ok()?.lines().find(|l| l.contains("could not be launched")).map(str::to_string)
    });
    // The daemon refuses first when the cgroups are missing (an unprivileged
    // daemon here has none); the launcher when the namespaces are.
    assert!(line.contains("sandbox mode strict and fences are missing: "), "{line}");
    assert!(!std::fs::read_to_string(&log).unwrap().contains("Listening on"), "R never started");
    wait_until(Duration::from_secs(30), "the refusal under the status table", || {
        env.ok(&["status"]).contains("sandbox mode strict and fences are missing").then_some(())
    });
    assert_refused_not_retried(&env, &app);
}

/// A copy `mode: strict` refused is not a crash: status shows it as
/// `refused`, with what is missing under the table, no crash is counted,
/// and it is not started again.
fn assert_refused_not_retried(env: &Env, app: &str) {
    let copy = wait_until(Duration::from_secs(30), "the copy shown as refused", || {
        env.copies(app).into_iter().find(|c| c.copy == 1 && c.status == "refused")
    });
    assert_eq!((copy.crashes, copy.pid), (0, None), "{copy:?}");
    let text = env.ok(&["status"]);
    assert!(text.contains("copy 1 is left down: refused: sandbox mode strict and fences are missing: "), "{text}");
    assert!(!text.contains("crash-looping"), "{text}");
    let log = format!("default-{app}.log");
    let starts = env.starts(&log).len();
    // Past the first backoff (2 s), a crash would have been retried.
    holds_for(Duration::from_secs(4), "the refused copy is not started again", || {
        env.starts(&log).len() == starts && env.copies(app).iter().all(|c| c.status == "refused" && c.crashes == 0)
    });
}

/// Starts `shinyctl serve` (as root, the suite's user) under a system-call
/// filter that refuses user namespaces, as an AppArmor rule or
/// `kernel.unprivileged_userns_clone=0` does on some machines: `clone` and
/// `unshare` with CLONE_NEWUSER get EPERM, `clone3` ENOSYS (its flags are
/// out of a filter's reach; glibc then falls back to `clone`). Everything
/// else is there, the cgroups included. Returns the daemon's PID once it
/// answers.
fn serve_without_user_namespaces(env: &Env) -> u32 {
    use seccompiler::{BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule};
    use std::os::unix::process::CommandExt;
    let arch: seccompiler::TargetArch = std::env::consts::ARCH.try_into().expect("a seccomp architecture");
    let newuser = libc::CLONE_NEWUSER as u64;
    let with_newuser = || {
        let cond = SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(newuser), newuser).unwrap();
        vec![SeccompRule::new(vec![cond]).unwrap()]
    };
    let refuse: BpfProgram = SeccompFilter::new(
        [(libc::SYS_clone, with_newuser()), (libc::SYS_unshare, with_newuser())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .unwrap()
    .try_into()
    .unwrap();
    let no_clone3: BpfProgram = SeccompFilter::new(
        [(libc::SYS_clone3, vec![])].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .unwrap()
    .try_into()
    .unwrap();
    let mut cmd = Command::new(bin());
    cmd.arg("serve");
    // SAFETY: only the two filters are applied between fork and exec (prctl
    // and seccomp system calls; the programs were built before the fork).
    unsafe {
        cmd.pre_exec(move || {
            seccompiler::apply_filter(&refuse).map_err(std::io::Error::other)?;
            seccompiler::apply_filter(&no_clone3).map_err(std::io::Error::other)
        });
    }
    env.start_daemon(cmd)
}

/// Where the cgroups are (a root daemon here) but user namespaces are
/// refused: `mode: strict` has the launcher refuse to start R, naming the
/// missing fence and why; with `mode: on` the same machine runs the copy
/// with every fence it can have (the other namespaces, which root makes
/// without a user namespace), and `status --json` says the user namespace
/// is missing and why.
#[test]
fn strict_mode_refuses_a_copy_when_the_launcher_cannot_make_a_user_namespace() {
    let env = Env::new("fencestrict-userns");
    serve_without_user_namespaces(&env);
    let strict = unique("strictns");
    env.apply(&env.app(&strict, free_port(), "warm-replicas: 0\nsandbox:\n  mode: strict\n"));
    let log = env.home().join(format!("logs/default-{strict}.log"));
    let line = wait_until(Duration::from_secs(60), "the launcher's refusal in the copy's log", || {
        std::fs::read_to_string(&log).ok()?.lines().find(|l| l.contains("fences are missing")).map(str::to_string)
    });
    assert!(
        line.contains("sandbox mode strict and fences are missing: user-ns") && line.contains("user namespaces are not allowed here"),
        "the launcher refuses for the user namespace alone: {line}"
    );
    assert!(!line.contains("cgroup"), "the daemon had its cgroups: {line}");
    assert!(!std::fs::read_to_string(&log).unwrap().contains("Listening on"), "R never started");
    assert_refused_not_retried(&env, &strict);

    let relaxed = unique("onns");
    let port = free_port();
    env.apply(&env.app(&relaxed, port, "warm-replicas: 0\n"));
    env.wait_roles(&relaxed, "1:active", Duration::from_secs(60));
    assert_eq!(wait_http_ok(port, Duration::from_secs(10)).status, 200);
    let status = env.status();
    let copy = &status["apps"].as_array().unwrap().iter().find(|a| a["name"] == relaxed.as_str()).unwrap()["copies"][0];
    let fences = copy["isolation"]["fences"].as_array().unwrap();
    let state = |name: &str| fences.iter().find(|f| f["name"] == name).map(|f| f["state"].as_str().unwrap_or("").to_string());
    assert_eq!(state("user-ns").as_deref(), Some("missing"), "{fences:?}");
    assert_eq!(state("mount-ns").as_deref(), Some("in-force"), "{fences:?}");
    assert_eq!(state("pid-ns").as_deref(), Some("in-force"), "{fences:?}");
    assert_eq!(state("ports").as_deref(), Some("in-force"), "the init answers bind and listen: {fences:?}");
}
