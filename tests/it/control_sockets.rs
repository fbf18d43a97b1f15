//! No copy reaches any shinyctl's control socket, of any user (README,
//! "The fence"): tried from inside a real Shiny app, whose page runs a
//! Python probe that connects to a socket and asks what a person's
//! `shinyctl status` asks. `api.sock` and `proxy.sock` answer 403 with why,
//! `handover.sock` closes, and the daemon logs each refusal; a run-as
//! user's own `~/.shinyctl` is hidden from the copies run as them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::fence::UserHome;
use crate::helpers::*;

/// The probe, run by the app as `python3 probe.py SOCKET HOW`. HOW is
/// `http` (GET /v1/status: prints the status line and the body's start),
/// `handover` (the handover's `ask`: prints how many bytes came back
/// before the socket closed or was reset, a write to a closed socket being 0) or `escape` (as `http`, from a grandchild
/// that left its session and was orphaned, so the copy's own process is
/// not among its ancestors; it also prints its new parent's command line).
const PROBE_PY: &str = r#"
import os, socket, sys, time

def ask_http(path):
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(path)
        s.sendall(b"GET /v1/status HTTP/1.1\r\nHost: shinyctl\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            b = s.recv(4096)
            if not b:
                break
            data += b
        head, _, body = data.partition(b"\r\n\r\n")
        return head.split(b"\r\n")[0].decode() + " " + body.decode(errors="replace")[:400]
    except Exception as e:
        return "error " + type(e).__name__ + ": " + str(e)

def ask_handover(path):
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(path)
        n = 0
        try:
            s.sendall(b'{"v":1,"kind":"ask"}\n')
        except ConnectionError:
            return "bytes 0"
        while True:
            try:
                b = s.recv(4096)
            except ConnectionError:
                break
            if not b:
                break
            n += len(b)
        return "bytes " + str(n)
    except Exception as e:
        return "error " + type(e).__name__ + ": " + str(e)

def parent_cmdline():
    try:
        with open("/proc/%d/cmdline" % os.getppid(), "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except Exception as e:
        return "unknown " + str(e)

path, how = sys.argv[1], sys.argv[2]
if how == "escape":
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        middle = os.getpid()
        if os.fork() == 0:
            os.close(r)
            deadline = time.time() + 5
            while os.getppid() == middle and time.time() < deadline:
                time.sleep(0.02)
            out = "parent=[" + parent_cmdline() + "] " + ask_http(path)
            os.write(w, out.encode())
            os._exit(0)
        os._exit(0)
    os.close(w)
    os.wait()
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    print(b"".join(chunks).decode(errors="replace"))
elif how == "handover":
    print(ask_handover(path))
else:
    print(ask_http(path))
"#;

/// The app: `/?sock=PATH&how=HOW` runs the probe and shows its answer;
/// `/?list=DIR` shows what the copy sees in a folder.
const APP_R: &str = r#"
library(shiny)
ui <- function(req) {
  q <- parseQueryString(req$QUERY_STRING)
  out <- if (!is.null(q$sock)) {
    paste(suppressWarnings(system2("python3", c("probe.py", q$sock, q$how), stdout = TRUE, stderr = TRUE)), collapse = " ")
  } else if (!is.null(q$list)) {
    paste0("[", paste(sort(list.files(q$list, all.files = TRUE, no.. = TRUE)), collapse = ","), "]")
  } else "none"
  tags$pre(paste0("result=", out, ";"))
}
shinyApp(ui, function(input, output) {})
"#;

/// Writes the probe app into `folder` with a manifest of `lines`; returns
/// the manifest.
fn probe_app(folder: &Path, name: &str, port: u16, lines: &str) -> PathBuf {
    std::fs::create_dir_all(folder).unwrap();
    std::fs::write(folder.join("app.R"), APP_R).unwrap();
    std::fs::write(folder.join("probe.py"), PROBE_PY).unwrap();
    let manifest = folder.join("app.yaml");
    std::fs::write(&manifest, format!("app-name: {name}\nport: {port}\nwarm-replicas: 0\n{lines}")).unwrap();
    manifest
}

/// What the app's page says for `query`.
fn ask(port: u16, query: &str) -> String {
    let page = wait_http_ok_path(port, &format!("/?{query}"));
    between(&page, "result=", ";</pre>").unwrap_or_else(|| panic!("the probe's page: {page}")).replace("&quot;", "\"")
}

/// A page's body once it answers 200.
fn wait_http_ok_path(port: u16, path: &str) -> String {
    wait_until(Duration::from_secs(30), "the probe's page", || get(port, path, &[]).ok().filter(|r| r.status == 200).map(|r| r.body))
}

/// Asserts that an HTTP control socket refused the copy with a 403 and why.
fn assert_refused_http(answer: &str, what: &str) {
    assert!(answer.contains("HTTP/1.1 403") && answer.contains("no copy may steer shinyctl"), "{what} refuses the copy: {answer}");
}

/// Asks every control socket of the home `home` from the app on `port`,
/// as its copy and as an orphan that left the copy's session.
fn assert_every_socket_refuses(port: u16, home: &Path, what: &str) {
    let sock = |rel: &str| home.join(rel).display().to_string();
    assert_refused_http(&ask(port, &format!("sock={}&how=http", sock("api.sock"))), &format!("{what}: api.sock"));
    assert_refused_http(&ask(port, &format!("sock={}&how=http", sock("proxy/proxy.sock"))), &format!("{what}: proxy.sock"));
    let handover = ask(port, &format!("sock={}&how=handover", sock("proxy/handover.sock")));
    assert_eq!(handover, "bytes 0", "{what}: handover.sock closes on the copy");
    let escaped = ask(port, &format!("sock={}&how=escape", sock("api.sock")));
    assert!(escaped.contains("parent=[") && escaped.contains(" launch "), "{what}: the orphan is given back to the launcher: {escaped}");
    assert_refused_http(&escaped, &format!("{what}: api.sock, from an orphan in a session of its own"));
}

/// Without namespaces (the Landlock fallback) and with the fence off, a
/// copy sees its own daemon's home; it still gets nothing from any of its
/// sockets, nor does a process it starts that leaves its session and its
/// parent. The daemon logs each refusal, and still answers its user.
#[test]
fn a_copy_without_namespaces_gets_nothing_from_its_daemons_sockets() {
    let env = Env::new("sockland");
    crate::launcher::serve_without_namespaces(&env);
    for (name, lines) in [("sockland", ""), ("sockoff", "sandbox:\n  mode: off\n")] {
        let app = unique(name);
        let port = free_port();
        env.apply(&probe_app(&env.dir.join("apps").join(&app), &app, port, lines));
        env.wait_roles(&app, "1:active", Duration::from_secs(60));
        assert_every_socket_refuses(port, &env.home(), &app);
    }
    let status = env.status();
    let kinds: Vec<&str> =
        status["apps"].as_array().unwrap().iter().map(|a| a["copies"][0]["isolation"]["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"landlock") && kinds.contains(&"none"), "one copy under Landlock, one with the fence off: {kinds:?}");
    let log = std::fs::read_to_string(env.home().join("api.log")).unwrap();
    assert!(log.contains("api.sock refused: the peer") && log.contains("no copy may steer shinyctl"), "the refusal is logged: {log}");
}

/// A home of the test's below /var/tmp (which a fenced copy sees, where
/// /tmp is its own), whose processes are ended by PID when it drops.
struct OtherHome {
    path: PathBuf,
    /// The daemons and load balancers seen.
    pids: Vec<u32>,
    /// The homes of the daemons started: their copies carry it as `--home`.
    homes: Vec<PathBuf>,
}

impl OtherHome {
    fn new(name: &str) -> OtherHome {
        let path = PathBuf::from(format!("/var/tmp/shinyctl-cs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        OtherHome { path, pids: Vec::new(), homes: Vec::new() }
    }

    /// Starts `shinyctl serve` as `user` with this environment; waits until
    /// it answers on `home`.
    fn serve_as(&mut self, user: &TestUser, env: &[(&str, &Path)], home: &Path) {
        let (uid, gid) = (user.id("-u"), user.id("-g"));
        let mut child = Command::new("setpriv")
            .args([&format!("--reuid={uid}"), &format!("--regid={gid}"), "--init-groups"])
            .args([bin(), "serve"])
            .env_remove("SHINYCTL_HOME")
            .envs(env.iter().map(|(k, v)| (*k, *v)))
            .env("USER", &user.name)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("setpriv (util-linux)");
        self.pids.push(child.id());
        self.homes.push(home.to_path_buf());
        std::thread::spawn(move || child.wait());
        wait_until(Duration::from_secs(20), "the user's daemon to answer", || as_root(home, &["status"]).status.success().then_some(()));
    }
}

impl Drop for OtherHome {
    fn drop(&mut self) {
        // The daemons first (by the PIDs started), then what carries this
        // home: their load balancers and copies.
        for &pid in &self.pids {
            signal(pid, libc::SIGKILL);
        }
        for pid in self.homes.iter().flat_map(|h| pids_with_home(h)) {
            // A copy's launcher leads its group: R and all it started go with it.
            signal_group(pid, libc::SIGKILL);
            signal(pid, libc::SIGKILL);
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// `shinyctl ARGS` run by the test (root) against the home `home`.
fn as_root(home: &Path, args: &[&str]) -> Output {
    Command::new(bin()).args(args).env("SHINYCTL_HOME", home).output().unwrap()
}

/// Waits until copy 1 of `app` of the daemon of `home` is ready; tracks
/// its processes in `other` for the end.
fn wait_ready(other: &mut OtherHome, home: &Path, app: &str) {
    wait_until(Duration::from_secs(90), "the user's app to be ready", || {
        let v: Value = serde_json::from_slice(&as_root(home, &["status", "--json"]).stdout).ok()?;
        for key in ["daemon_pid", "proxy_pid"] {
            if let Some(p) = v[key].as_u64() {
                other.pids.push(p as u32);
            }
        }
        let a = v["apps"].as_array()?.iter().find(|a| a["name"] == app)?.clone();
        a["copies"].as_array()?.iter().any(|c| c["ready"] == true).then_some(())
    });
}

/// A user U runs two shinyctls of their own: one in the default home
/// (`~/.shinyctl`) and one in another. A root daemon's copy run as U
/// (`run-as`) does not see U's default home at all, and U's other home's
/// socket answers it 403 (it is root in its namespace only, and in a PID
/// namespace of its own). A copy of U's own daemon (a daemon that is not
/// root, fenced) is refused by U's other daemon the same way.
#[test]
fn fenced_copies_get_nothing_from_their_users_own_shinyctl() {
    // Made first, so they go last: after the test's processes have ended.
    let user_home = UserHome::new("sockuser");
    let user = TestUser::create(Some(&user_home.0));
    // Its own daemon's copies run as itself, so the sockets' own check is
    // what refuses them (with ids of their own, the sockets' modes do).
    user.without_subordinate_ids();
    let mut other = OtherHome::new("sockuser");
    let (uid, gid) = (user.id("-u"), user.id("-g"));
    let chown = |p: &Path| assert!(Command::new("chown").args(["-R", &format!("{uid}:{gid}")]).arg(p).status().unwrap().success());
    chown(&user_home.0);
    chown(&other.path);
    let default_home = user_home.0.join(".shinyctl");
    let second_home = other.path.join("home");
    other.serve_as(&user, &[("HOME", &user_home.0)], &default_home);
    other.serve_as(&user, &[("HOME", &user_home.0), ("SHINYCTL_HOME", &second_home)], &second_home);

    // U's own daemon (default home, not root) runs a fenced probe.
    let own = unique("sockown");
    let own_port = free_port();
    let folder = other.path.join("apps").join(&own);
    let manifest = probe_app(&folder, &own, own_port, "");
    chown(&other.path.join("apps"));
    let out = as_root(&default_home, &["apply", "-f", manifest.to_str().unwrap()]);
    assert!(out.status.success(), "apply to the user's daemon: {out:?}");
    wait_ready(&mut other, &default_home, &own);

    // A root daemon runs a probe as U.
    let f = crate::fence::Fenced::start("sockrunas");
    let runas = unique("sockrunas");
    let port = free_port();
    f.env.apply(&probe_app(&f.env.dir.join("apps").join(&runas), &runas, port, &format!("run-as: {}\n", user.name)));
    f.env.wait_roles(&runas, "1:active", Duration::from_secs(60));

    let seen = ask(port, &format!("list={}", default_home.display()));
    assert_eq!(seen, "[]", "the run-as user's ~/.shinyctl is hidden (an empty folder): {seen}");
    let gone = ask(port, &format!("sock={}&how=http", default_home.join("api.sock").display()));
    assert!(gone.starts_with("error FileNotFoundError"), "the run-as user's own api.sock is out of sight: {gone}");
    let answer = ask(port, &format!("sock={}&how=http", second_home.join("api.sock").display()));
    assert_refused_http(&answer, "the run-as user's other shinyctl, to a root daemon's copy");
    let answer = ask(own_port, &format!("sock={}&how=http", second_home.join("api.sock").display()));
    assert_refused_http(&answer, "the user's other shinyctl, to a copy of the user's own daemon");
    assert!(answer.contains("PID namespace of its own"), "{answer}");
    let log = std::fs::read_to_string(second_home.join("api.log")).unwrap();
    assert_eq!(log.matches("no copy may steer shinyctl").count(), 2, "each refusal is logged: {log}");
}
