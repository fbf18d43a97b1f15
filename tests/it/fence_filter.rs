//! The filter half of the fence with real R (issue #9): from inside a
//! Shiny session the app tries what the fence refuses — `mount`, `strace
//! -p`, `unshare`, binding another port, signalling the daemon and the load
//! balancer, writing outside its places — and reports each outcome in its
//! log; the test reads the errno. The same session shows what must keep
//! working: the WebSocket, threads (clone3 falls back to clone), fork
//! (mclapply), writes to its scratch disk and its /tmp.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::helpers::*;

/// The app: on each session it runs the probes, logs `FENCE name=outcome`
/// lines and `FENCE done`, then serves the `live` output.
const FENCE_R: &str = r#"
library(shiny)
sh <- function(cmd) paste(suppressWarnings(system(paste("{", cmd, "; } 2>&1"), intern = TRUE)), collapse = " ")
probe <- function() {
  pids <- scan(file.path(Sys.getenv("SHINYCTL_SCRATCH"), "pids"), quiet = TRUE)
  lines <- c(
    paste0("mount-command=", sh("mount -t tmpfs x /mnt; echo rc=$?")),
    paste0("strace=", sh(sprintf("timeout 10 strace -qq -e trace=none -p %d; echo rc=$?", Sys.getpid()))),
    paste0("mclapply=", paste(unlist(parallel::mclapply(1:2, function(i) i * 2, mc.cores = 2)), collapse = ",")),
    system2("/usr/bin/python3", c("probe.py", pids[1], pids[2], tempdir()), stdout = TRUE, stderr = TRUE)
  )
  for (l in lines) message("FENCE ", l)
  message("FENCE done")
}
server <- function(input, output, session) {
  probe()
  output$live <- renderText(paste0("live-from-copy-", Sys.getenv("SHINYCTL_COPY")))
}
shinyApp(fluidPage(textOutput("live")), server)
"#;

/// The system-call probes, in Python for exact errnos: each prints
/// `name=ok` or `name=ERRNO` (`EPERM`, `EACCES`, …).
const PROBE_PY: &str = r#"
import ctypes, errno, os, socket, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
daemon, proxy, tmpdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

def show(name, f):
    try:
        r = f()
        ok = r is None or r >= 0
        print(f"{name}=" + ("ok" if ok else errno.errorcode.get(ctypes.get_errno(), "?")))
    except OSError as e:
        print(f"{name}=" + errno.errorcode.get(e.errno, "?"))

def write(path):
    with open(path, "w") as f:
        f.write("x")

def thread():
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()

show("mount", lambda: libc.mount(b"x", b"/mnt", b"tmpfs", 0, None))
show("unshare", lambda: libc.unshare(0x10000000))
show("clone3", lambda: libc.syscall(435, None, 0))
show("thread", thread)
show("bind-other", lambda: socket.socket().bind(("127.0.0.1", int(os.environ["OTHER_PORT"]))))
show("kill-daemon", lambda: os.kill(daemon, 0))
show("kill-proxy", lambda: os.kill(proxy, 0))
show("write-outside", lambda: write(os.path.join(os.environ["OUTSIDE"], "from-app")))
show("write-scratch", lambda: write(os.path.join(os.environ["SHINYCTL_SCRATCH"], "from-app")))
show("write-tmp", lambda: write(os.path.join(tmpdir, "from-app")))
"#;

/// A folder outside every place a copy may write (and outside /tmp and
/// /var/tmp, which a copy without a mount namespace may write), removed
/// when the test ends.
struct Outside(PathBuf);

impl Outside {
    fn new(name: &str) -> Outside {
        let dir = PathBuf::from(format!("/var/lib/shinyctl-it-{}-{}", std::process::id(), unique(name)));
        std::fs::create_dir_all(&dir).unwrap();
        Outside(dir)
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts the probe app with `extra` manifest lines, opens a session (the
/// probes run in its server) and returns the outcomes by name.
fn probe(env: &Env, name: &str, extra: &str, outside: &Path) -> BTreeMap<String, String> {
    for tool in ["/usr/bin/python3", "/usr/bin/strace", "/usr/bin/mount"] {
        assert!(Path::new(tool).exists(), "{tool} is needed by this test");
    }
    let manifest = env.app(
        name,
        free_port(),
        &format!("warm-replicas: 0\nenv: {{ OTHER_PORT: \"{}\", OUTSIDE: \"{}\" }}\n{extra}", free_port(), outside.display()),
    );
    let folder = manifest.parent().unwrap();
    std::fs::write(folder.join("app.R"), FENCE_R).unwrap();
    std::fs::write(folder.join("probe.py"), PROBE_PY).unwrap();
    env.apply(&manifest);
    env.wait_roles(name, "1:active", Duration::from_secs(60));
    let status = env.status();
    let port = status["apps"].as_array().unwrap().iter().find(|a| a["name"] == name).unwrap()["port"].as_u64().unwrap() as u16;
    let (daemon, proxy) = (status["daemon_pid"].as_u64().unwrap(), status["proxy_pid"].as_u64().expect("a load balancer runs"));
    // The copy's own disk carries the PIDs to it: it sees nothing else of
    // the daemon's.
    std::fs::write(env.home().join(format!("scratch/default-{name}/1/pids")), format!("{daemon} {proxy}\n")).unwrap();

    let session = Session::open(port, "");
    assert_eq!(session.copy, 1, "the session is served after the probes: the WebSocket works under the fence");
    session.close();

    let log_path = env.home().join(format!("logs/default-{name}.log"));
    let log = wait_until(Duration::from_secs(30), "the probes' end in the copy's log", || {
        std::fs::read_to_string(&log_path).ok().filter(|t| t.contains("FENCE done"))
    });
    log.lines()
        .filter_map(|l| l.strip_prefix("FENCE "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The outcome of one probe.
fn got<'a>(outcomes: &'a BTreeMap<String, String>, name: &str) -> &'a str {
    outcomes.get(name).map(String::as_str).unwrap_or_else(|| panic!("no outcome for {name}: {outcomes:?}"))
}

#[test]
fn a_fenced_copy_is_refused_mount_ptrace_other_ports_signals_and_outside_writes_and_still_serves() {
    let env = Env::new("fence-filter");
    let outside = Outside::new("filter");
    let o = probe(&env, "filtered", "", &outside.0);

    assert_eq!(got(&o, "mount"), "EPERM", "{o:?}");
    let mount = got(&o, "mount-command");
    // (As the app's own uid, the command may refuse before it asks.)
    assert!(
        (mount.contains("permission denied") || mount.contains("must be superuser")) && !mount.contains("rc=0"),
        "the mount command fails: {mount}"
    );
    let strace = got(&o, "strace");
    assert!(strace.contains("Operation not permitted") && !strace.contains("rc=0"), "strace -p cannot attach: {strace}");
    assert_eq!(got(&o, "unshare"), "EPERM", "{o:?}");
    assert_eq!(got(&o, "bind-other"), "EACCES", "{o:?}");
    // In its PID namespace the daemon and the load balancer do not exist
    // for the copy (ESRCH); without one, Landlock's scope refuses (EPERM).
    assert!(["ESRCH", "EPERM"].contains(&got(&o, "kill-daemon")), "{o:?}");
    assert!(["ESRCH", "EPERM"].contains(&got(&o, "kill-proxy")), "{o:?}");
    // The mount namespace's read-only root (EROFS), or Landlock (EACCES).
    assert!(["EROFS", "EACCES"].contains(&got(&o, "write-outside")), "{o:?}");
    assert!(std::fs::read_dir(&outside.0).unwrap().next().is_none(), "nothing was written outside");

    assert_eq!(got(&o, "clone3"), "ENOSYS", "clone3 answers ENOSYS: {o:?}");
    assert_eq!(got(&o, "thread"), "ok", "threads start through clone: {o:?}");
    assert_eq!(got(&o, "mclapply"), "2,4", "fork works: {o:?}");
    assert_eq!(got(&o, "write-scratch"), "ok", "{o:?}");
    assert_eq!(got(&o, "write-tmp"), "ok", "{o:?}");
    let log = std::fs::read_to_string(env.home().join("logs/default-filtered.log")).unwrap();
    assert!(log.contains("--- shinyctl: fence: seccomp filter, Landlock ABI"), "the launcher said what it applied: {log}");
}

#[test]
fn syscalls_unconfined_lets_the_calls_through_and_keeps_landlock() {
    let env = Env::new("fence-unconfined");
    let outside = Outside::new("unconfined");
    let o = probe(&env, "unconfined", "sandbox:\n  syscalls: unconfined\n", &outside.0);

    assert_eq!(got(&o, "clone3"), "EINVAL", "clone3 reaches the kernel: {o:?}");
    assert_ne!(got(&o, "unshare"), "EPERM", "{o:?}");
    assert_eq!(got(&o, "thread"), "ok", "{o:?}");
    assert!(["EROFS", "EACCES"].contains(&got(&o, "write-outside")), "writes are still limited: {o:?}");
    assert_eq!(got(&o, "bind-other"), "EACCES", "and binding: {o:?}");
    let log = std::fs::read_to_string(env.home().join("logs/default-unconfined.log")).unwrap();
    assert!(log.contains("missing: seccomp: syscalls: unconfined"), "{log}");
}

/// Where no namespace can be made, the copy shares the host's PID
/// namespace: the daemon and the load balancer exist for it, so only
/// Landlock's signal scope refuses the signal (EPERM; ESRCH would be the
/// namespace), and its rules refuse the write outside (EACCES, not a
/// read-only mount's EROFS) and the bind (EACCES).
#[test]
fn without_namespaces_landlock_is_what_refuses_signals_writes_and_binds() {
    let env = Env::new("fence-landlock");
    crate::launcher::serve_without_namespaces(&env);
    let outside = Outside::new("landlock");
    let o = probe(&env, "landlocked", "", &outside.0);
    let iso = &env.status()["apps"][0]["copies"][0]["isolation"];
    assert_eq!(iso["kind"], "landlock", "no namespace here: {iso}");
    assert_eq!(got(&o, "kill-daemon"), "EPERM", "Landlock's signal scope: {o:?}");
    assert_eq!(got(&o, "kill-proxy"), "EPERM", "{o:?}");
    assert_eq!(got(&o, "write-outside"), "EACCES", "{o:?}");
    assert!(std::fs::read_dir(&outside.0).unwrap().next().is_none(), "nothing was written outside");
    assert_eq!(got(&o, "bind-other"), "EACCES", "{o:?}");
    assert_eq!(got(&o, "write-scratch"), "ok", "{o:?}");
    assert_eq!(got(&o, "thread"), "ok", "{o:?}");
}

/// An app that, on each session, asks for a vector far past its memory
/// limit and logs what R said.
const GREEDY_R: &str = r#"
library(shiny)
server <- function(input, output, session) {
  got <- tryCatch({ x <- numeric(1e8); "allocated" }, error = function(e) conditionMessage(e))
  message("GREEDY ", got)
  output$live <- renderText(paste0("live-from-copy-", Sys.getenv("SHINYCTL_COPY")))
}
shinyApp(fluidPage(textOutput("live")), server)
"#;

#[test]
fn with_memory_300m_r_starts_and_a_vector_past_the_limit_is_refused() {
    let env = Env::new("fence-data");
    let port = free_port();
    let manifest = env.app("greedy", port, "warm-replicas: 0\nsandbox:\n  memory: 300M\n");
    std::fs::write(manifest.parent().unwrap().join("app.R"), GREEDY_R).unwrap();
    env.apply(&manifest);
    env.wait_roles("greedy", "1:active", Duration::from_secs(60));
    Session::open(port, "").close();
    let log_path = env.home().join("logs/default-greedy.log");
    let log = wait_until(Duration::from_secs(30), "the allocation's outcome", || {
        std::fs::read_to_string(&log_path).ok().filter(|t| t.contains("GREEDY "))
    });
    assert!(log.contains("GREEDY cannot allocate vector of size 762.9 Mb"), "{log}");
    assert!(log.contains("RLIMIT_DATA 556M"), "{log}");
    assert_eq!(Session::open(port, "").copy, 1, "the copy goes on serving");
}
