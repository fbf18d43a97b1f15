//! The fence's second round, tried from inside a real Shiny app: each page
//! lists R's own descriptors and runs a Python probe through `system2()`
//! (exact errnos), and the test reads the answers as `key=value;` lines.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::helpers::*;

/// The app: each page lists `/proc/self/fd` and `/proc/1/fd` (the
/// copy's init, when it has one) as R sees them (`fd~target`), and adds
/// the probe's lines.
const INSIDE_R: &str = r#"
library(shiny)
fds <- function(d) {
  n <- list.files(d)
  paste0(n, "~", Sys.readlink(file.path(d, n)), collapse = ",")
}
ui <- function(req) {
  lines <- c(paste0("fds=", fds("/proc/self/fd")), paste0("initfds=", fds("/proc/1/fd")),
             system2("/usr/bin/python3", c("probe.py", req$SERVER_PORT), stdout = TRUE, stderr = TRUE))
  tags$pre(paste0(lines, ";", collapse = "\n"))
}
shinyApp(ui, function(input, output) {})
"#;

/// The probes: each prints `name=ok`, `name=VALUE` or `name=ERRNO`. What
/// may touch the host is opened for writing and closed, never written.
const PROBE_PY: &str = r#"
import errno, os, socket, sys, tempfile
own = int(sys.argv[1])

def show(name, f):
    try:
        r = f()
        print(f"{name}=" + ("ok" if r is None or r is True else str(r)))
    except OSError as e:
        print(f"{name}=" + errno.errorcode.get(e.errno, "?"))

def opens(path):
    # Opened for writing and closed: never written.
    os.close(os.open(path, os.O_WRONLY))

def create(path):
    with open(path, "w") as f:
        f.write("x")

def devs():
    return " ".join(sorted(os.listdir("/dev")))

def pty():
    a, b = os.openpty()
    os.close(a)
    os.close(b)

def shm():
    create(f"/dev/shm/probe-{os.getpid()}")
    os.remove(f"/dev/shm/probe-{os.getpid()}")

def mounted(path):
    return "ro" if os.statvfs(path).f_flag & os.ST_RDONLY else "rw"

show("procsys", lambda: opens("/proc/sys/kernel/ns_last_pid"))
for p in ["/sys", "/sys/fs/cgroup", "/proc/sys", "/dev", "/proc", "/dev/shm", "/dev/null", "/dev/pts"]:
    show("mount" + p.replace("/", "-"), lambda: mounted(p))
show("sys", lambda: opens("/sys/kernel/mm/transparent_hugepage/enabled"))
show("kmsg", lambda: opens("/dev/kmsg"))
show("devcreate", lambda: create(f"/dev/probe-{os.getpid()}"))
show("devnull", lambda: create("/dev/null"))
show("urandom", lambda: len(open("/dev/urandom", "rb").read(8)))
show("pty", pty)
show("shm", shm)
show("devfd", lambda: len(os.listdir("/dev/fd")))
show("stdout", lambda: os.readlink("/dev/stdout"))
show("devs", devs)

def userbus():
    # The user's session bus, where one exists: systemd-run --user through it
    # would start anything as that user, outside the fence.
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        c.connect(f"/run/user/{os.getuid()}/bus")
    finally:
        c.close()

show("userbus", userbus)

def tcp(family=socket.AF_INET):
    return socket.socket(family, socket.SOCK_STREAM)

def udp():
    return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

def listen_unbound():
    s = tcp()
    s.listen()
    return s.getsockname()[1]

def bound_then_listen(addr):
    s = tcp()
    s.bind(addr)
    s.listen()

def udp_client():
    s = udp()
    s.connect(("127.0.0.1", 9))
    s.send(b"x")

def unix():
    os.chdir(tempfile.mkdtemp())
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind("probe.sock")
    s.listen()
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(os.path.abspath("probe.sock"))
    return oct(os.stat("probe.sock").st_mode & 0o777)

def own_listener():
    # A filter of the copy's own that allows everything, with a listener.
    import ctypes, platform
    libc = ctypes.CDLL(None, use_errno=True)
    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]
    allow = (Insn * 1)(Insn(0x06, 0, 0, 0x7FFF0000))
    nr = 317 if platform.machine() == "x86_64" else 277
    fd = libc.syscall(nr, 1, 8, ctypes.byref(Prog(1, allow)))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "seccomp")
    os.close(fd)

show("own-listener", own_listener)
show("port", lambda: own)
show("listen-unbound", listen_unbound)
show("bind-any-own", lambda: tcp().bind(("0.0.0.0", own)))
show("bind-v6-own", lambda: tcp(socket.AF_INET6).bind(("::", own)))
show("bind-other", lambda: tcp().bind(("127.0.0.1", own + 1)))
show("bind0-listen", lambda: bound_then_listen(("127.0.0.1", 0)))
show("udp-bind", lambda: udp().bind(("0.0.0.0", 9153)))
show("udp-client", udp_client)
show("udp-sendto", lambda: udp().sendto(b"x", ("127.0.0.1", 9)) and None)
show("connect-own", lambda: tcp().connect(("127.0.0.1", own)))
show("dns", lambda: len(socket.getaddrinfo("localhost", 80)) > 0)
show("unix", unix)
"#;

/// The fd number a daemon's starter leaks to it (as fd 251 reached R in
/// the first round).
const LEAKED_FD: i32 = 251;

/// A pipe whose write end the daemon gets as [`LEAKED_FD`], without
/// close-on-exec, as a careless supervisor would leave it.
struct Leak {
    /// Both ends, held for the test (the test's own are close-on-exec).
    _ends: (OwnedFd, OwnedFd),
    /// What `/proc/PID/fd/N` reads for either end: `pipe:[inode]`.
    target: String,
}

impl Leak {
    /// Makes the pipe and has `cmd` (the daemon, or a wrapper that execs
    /// it) start with its write end at [`LEAKED_FD`].
    fn into(cmd: &mut Command) -> Leak {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let target = std::fs::read_link(format!("/proc/self/fd/{}", w.as_raw_fd())).unwrap().to_string_lossy().into_owned();
        let raw = w.as_raw_fd();
        // SAFETY: dup2 alone between fork and exec; the copy it makes has
        // no close-on-exec flag.
        unsafe {
            cmd.pre_exec(move || if libc::dup2(raw, LEAKED_FD) == LEAKED_FD { Ok(()) } else { Err(std::io::Error::last_os_error()) });
        }
        Leak { _ends: (r, w), target }
    }
}

/// Starts `shinyctl serve` as root with the leak; returns it.
fn serve_leaking(env: &Env) -> Leak {
    let mut cmd = Command::new(bin());
    cmd.arg("serve");
    let leak = Leak::into(&mut cmd);
    env.start_daemon(cmd);
    leak
}

/// The two ways a copy starts (README, "Sleep and wake": the pool): cold
/// (the pool switched off) and claimed from the pool's zygote.
const STARTS: [bool; 2] = [false, true];

/// Readies `cmd` (a daemon's command) for copies that start cold
/// (`pool` false: SHINYCTL_POOL=off) or are claimed from the pool.
fn with_pool(cmd: &mut Command, pool: bool) {
    if !pool {
        cmd.env("SHINYCTL_POOL", "off");
    }
}

/// Once the daemon runs: for copies claimed from the pool, waits until its
/// zygote takes claims.
fn ready_for(env: &Env, pool: bool) {
    if pool {
        crate::pool::wait_pool_ready(env);
    }
}

/// Checks the copy of `app` started the way asked for.
fn assert_started(env: &Env, app: &str, pool: bool) {
    let start = crate::pool::start_of(env, app, 1);
    let want = if pool { "claimed from the pool" } else { "cold: the pool is off" };
    assert!(start.starts_with(want), "{app}: {want}: {start}");
}

/// Starts `shinyctl serve` where no namespace can be made (see
/// `launcher::serve_without_namespaces`: Landlock is the fence), with the
/// leak.
fn serve_leaking_without_namespaces(env: &Env) -> Leak {
    let script = "echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --bounding-set=-all --inh-caps=-all \"$@\"";
    let mut cmd = Command::new("unshare");
    cmd.args(["--user", "--map-root-user", "sh", "-c", script, "sh", bin(), "serve"]);
    let leak = Leak::into(&mut cmd);
    env.start_daemon(cmd);
    leak
}

/// Deploys the probe app `name` (`extra` manifest lines), waits for its
/// copy and returns its page's answers.
fn page_of(env: &Env, name: &str, extra: &str) -> BTreeMap<String, String> {
    let (manifest, port) = probe_app(env, name, extra);
    page_of_deployed(env, name, &manifest, port)
}

/// Writes the probe app `name` (`extra` manifest lines); returns its
/// manifest and port.
fn probe_app(env: &Env, name: &str, extra: &str) -> (PathBuf, u16) {
    let port = free_port();
    let manifest = env.app_running(INSIDE_R, name, port, &format!("warm-replicas: 0\n{extra}"));
    std::fs::write(manifest.with_file_name("probe.py"), PROBE_PY).unwrap();
    (manifest, port)
}

/// Deploys the probe app written by [`probe_app`] and returns its page's
/// answers.
fn page_of_deployed(env: &Env, name: &str, manifest: &std::path::Path, port: u16) -> BTreeMap<String, String> {
    env.apply(manifest);
    env.wait_roles(name, "1:active", Duration::from_secs(60));
    let page = wait_http_ok(port, Duration::from_secs(10)).body;
    let body = between(&page, "<pre>", "</pre>").unwrap_or_else(|| panic!("the probe's page: {page}"));
    body.lines().filter_map(|l| l.trim().trim_end_matches(';').split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Descriptors from the page (`key`: `fds` for R's, `initfds` for PID
/// 1's): number → what it is.
/// `/run/user/UID/bus` of a test user, listening, as systemd makes it;
/// removed on drop.
struct SessionBus {
    dir: PathBuf,
    _listening: std::os::unix::net::UnixListener,
}

impl SessionBus {
    fn listen(user: &TestUser) -> SessionBus {
        let uid = user.id("-u");
        let dir = PathBuf::from(format!("/run/user/{uid}"));
        std::fs::create_dir_all(&dir).unwrap();
        let bus = std::os::unix::net::UnixListener::bind(dir.join("bus")).unwrap();
        std::os::unix::fs::chown(&dir, Some(uid), Some(user.id("-g"))).unwrap();
        std::os::unix::fs::chown(dir.join("bus"), Some(uid), Some(user.id("-g"))).unwrap();
        SessionBus { dir, _listening: bus }
    }
}

impl Drop for SessionBus {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fds_of(a: &BTreeMap<String, String>, key: &str) -> BTreeMap<i32, String> {
    let list = a.get(key).unwrap_or_else(|| panic!("no {key} on the page: {a:?}"));
    list.split(',').filter_map(|e| e.split_once('~')).map(|(n, t)| (n.parse().unwrap(), t.to_string())).collect()
}

/// Checks that R has 0, 1 and 2 (its output a pipe) and nothing of the leak.
fn assert_only_stdio_inherited(a: &BTreeMap<String, String>, leak: &Leak, what: &str) {
    let fds = fds_of(a, "fds");
    for n in 0..3 {
        assert!(fds.contains_key(&n), "{what}: R has fd {n}: {fds:?}");
    }
    // The launcher's pipe, never the log file (README, "Logs").
    for n in [1, 2] {
        assert!(fds[&n].starts_with("pipe:["), "{what}: R's fd {n} is a pipe the launcher reads: {fds:?}");
    }
    assert!(!fds.contains_key(&LEAKED_FD), "{what}: fd {LEAKED_FD} does not reach R: {fds:?}");
    assert!(!fds.values().any(|t| *t == leak.target), "{what}: the leaked pipe {} is not in R: {fds:?}", leak.target);
}

#[test]
fn only_0_1_and_2_reach_r_fenced_under_landlock_and_with_mode_off() {
    let env = Env::new("fds");
    let leak = serve_leaking(&env);
    let daemon_fds: Vec<PathBuf> =
        std::fs::read_dir(format!("/proc/{}/fd", env.status()["daemon_pid"])).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(daemon_fds.iter().any(|p| p.ends_with(LEAKED_FD.to_string())), "the daemon got the leak: {daemon_fds:?}");
    let fenced = page_of(&env, "fdsfenced", "");
    assert_only_stdio_inherited(&fenced, &leak, "a fenced copy");
    // Nor the copy's init, whose descriptors R might open through
    // /proc/1/fd (as the app's own uid it cannot even list them now, so
    // they are looked at from the host).
    let launcher = env.status()["apps"].as_array().unwrap().iter().find(|a| a["name"] == "fdsfenced").unwrap()["copies"][0]["launcher_pid"]
        .as_u64()
        .expect("the copy's launcher") as u32;
    let init_pid: u32 = std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children"))
        .unwrap()
        .split_whitespace()
        .next()
        .expect("the launcher's child, the init")
        .parse()
        .unwrap();
    let init: BTreeMap<i32, String> = std::fs::read_dir(format!("/proc/{init_pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, std::fs::read_link(e.path()).ok()?.display().to_string())))
        .collect();
    assert!(!init.is_empty() && !init.contains_key(&LEAKED_FD), "the init holds no leak: {init:?}");
    assert!(!init.values().any(|t| *t == leak.target), "the init holds no leak: {init:?}");
    let off = page_of(&env, "fdsoff", "sandbox:\n  mode: off\n");
    assert_only_stdio_inherited(&off, &leak, "mode: off");

    let env = Env::new("fdslandlock");
    let leak = serve_leaking_without_namespaces(&env);
    let landlock = page_of(&env, "fdslandlock", "");
    let v = env.status();
    assert_eq!(v["apps"][0]["copies"][0]["isolation"]["kind"], "landlock", "the Landlock fallback: {v}");
    assert_only_stdio_inherited(&landlock, &leak, "the Landlock fallback");
    // The launcher stays R's parent there and answers its bind and listen.
    assert_listens_only_on_its_port(&landlock, "the Landlock fallback");
    let fences = v["apps"][0]["copies"][0]["isolation"]["fences"].as_array().unwrap().clone();
    let ports = fences.iter().find(|f| f["name"] == "ports").expect("the ports fence");
    assert_eq!(ports["state"], "in-force", "{ports}");
}

/// The devices a fenced copy's `/dev` holds, and nothing else (but what
/// the probe's own look adds: none).
const DEV: &str = "fd full mqueue null ptmx pts random shm stderr stdin stdout tty urandom zero";

/// Checks a fenced copy's /proc, /sys and /dev from its page: nothing of
/// the host writable (EROFS: the mount, whatever the user's rights), the
/// devices R needs working.
fn assert_read_only_host(a: &BTreeMap<String, String>, what: &str) {
    let got = |k: &str| a.get(k).map(String::as_str).unwrap_or_else(|| panic!("{what}: no {k} on the page: {a:?}"));
    assert_eq!(got("procsys"), "EROFS", "{what}: /proc/sys is read-only: {a:?}");
    // A file of root's: EACCES for another user before the mount is asked.
    assert!(["EROFS", "ENOENT", "EACCES"].contains(&got("sys")), "{what}: /sys is read-only: {a:?}");
    for ro in ["-sys", "-sys-fs-cgroup", "-proc-sys", "-dev"] {
        assert_eq!(got(&format!("mount{ro}")), "ro", "{what}: {} is mounted read-only: {a:?}", ro.replace('-', "/"));
    }
    // Where the copy writes, and its own /proc (/proc/self).
    for rw in ["-proc", "-dev-shm", "-dev-null", "-dev-pts"] {
        assert_eq!(got(&format!("mount{rw}")), "rw", "{what}: {} is writable: {a:?}", rw.replace('-', "/"));
    }
    assert_eq!(got("kmsg"), "ENOENT", "{what}: /dev has no kmsg: {a:?}");
    assert_eq!(got("devcreate"), "EROFS", "{what}: nothing is made in /dev: {a:?}");
    assert_eq!(got("devs"), DEV, "{what}: /dev holds only what R needs: {a:?}");
    for k in ["devnull", "pty", "shm"] {
        assert_eq!(got(k), "ok", "{what}: {k} works: {a:?}");
    }
    assert_eq!(got("urandom"), "8", "{what}: {a:?}");
    assert!(got("devfd").parse::<u32>().is_ok_and(|n| n >= 3), "{what}: /dev/fd lists the probe's own: {a:?}");
    assert_eq!(got("stdout"), "/proc/self/fd/1", "{what}: {a:?}");
}

/// Under a root daemon (given a leaked descriptor by its starter), its
/// copy and a run-as copy: only 0, 1 and 2 inherited, nothing of the host
/// writable through /proc, /sys or /dev, listening only on its own port.
#[test]
fn a_root_daemons_copy_writes_nothing_of_the_host_and_listens_only_on_its_port() {
    for pool in STARTS {
        let env = Env::new(if pool { "rofspool" } else { "rofs" });
        let mut cmd = Command::new(bin());
        cmd.arg("serve");
        with_pool(&mut cmd, pool);
        let leak = Leak::into(&mut cmd);
        env.start_daemon(cmd);
        ready_for(&env, pool);
        let a = page_of(&env, "rofs", "");
        assert_started(&env, "rofs", pool);
        assert_only_stdio_inherited(&a, &leak, "a root daemon's copy");
        assert_read_only_host(&a, "a root daemon's copy");
        assert_listens_only_on_its_port(&a, "a root daemon's copy");
        let log = std::fs::read_to_string(env.home().join("logs/default-rofs.log")).unwrap();
        assert!(log.contains("--- shinyctl: fence ports: refused process "), "the refusal names the fence: {log}");
        assert!(log.contains("listen on 0.0.0.0:0: a copy listens only on 127.0.0.1:"), "{log}");
        // Root's own file, which a copy running as root could open for writing
        // before; the copy runs as the app's own uid now, and the mount is
        // read-only whatever the user.
        assert!(["EROFS", "ENOENT", "EACCES"].contains(&a["sys"].as_str()), "/sys is read-only to a root daemon's copy: {a:?}");
        if pool {
            // A run-as copy starts cold (R keeps the HOME it started with).
            continue;
        }

        // Made first, so they go last: after the test's processes have ended.
        let home = crate::fence::UserHome::new("rofsrunas");
        let user = TestUser::create(Some(&home.0));
        // The user's session bus, as a logged-in (or lingering) user has one.
        let bus = SessionBus::listen(&user);
        let a = page_of(&env, "rofsrunas", &format!("run-as: {}\n", user.name));
        assert_eq!(a["userbus"], "ENOENT", "a run-as copy cannot reach its user's session bus: {a:?}");
        drop(bus);
        assert_only_stdio_inherited(&a, &leak, "a run-as copy");
        assert_read_only_host(&a, "a run-as copy");
        assert_listens_only_on_its_port(&a, "a run-as copy");
    }
}

/// The same under a daemon that is not root (nobody).
#[test]
fn an_unprivileged_daemons_copy_writes_nothing_of_the_host_and_listens_only_on_its_port() {
    for pool in STARTS {
        let env = Env::new(if pool { "rofsuserpool" } else { "rofsuser" });
        let (manifest, port) = probe_app(&env, "rofsuser", "");
        // All the daemon's (nobody's), as its home and the app's state file must be.
        let chown = Command::new("chown").args(["-R", "65534:65534"]).arg(&env.dir).status().unwrap();
        assert!(chown.success());
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", bin(), "serve"]);
        with_pool(&mut cmd, pool);
        let leak = Leak::into(&mut cmd);
        env.start_daemon(cmd);
        ready_for(&env, pool);
        let a = page_of_deployed(&env, "rofsuser", &manifest, port);
        assert_started(&env, "rofsuser", pool);
        assert_only_stdio_inherited(&a, &leak, "an unprivileged daemon's copy");
        assert_read_only_host(&a, "an unprivileged daemon's copy");
        assert_listens_only_on_its_port(&a, "an unprivileged daemon's copy");
        // nobody has no subordinate ids: status says its copies run as itself, with the fix.
        let own = env.status()["own_user"].as_str().unwrap_or_default().to_string();
        assert!(own.contains("nobody has no subordinate ids") && own.contains("usermod --add-subuids"), "{own}");
        assert!(env.ok(&["status"]).contains(&own), "and under the table");
    }
}

/// The same under a daemon that is not root whose user has subordinate ids
/// (README, "Identities"): the copy runs as one of them, cold or claimed.
#[test]
fn a_subordinate_ids_daemons_copy_writes_nothing_of_the_host_and_listens_only_on_its_port() {
    if !needs_root("it makes a user with subordinate ids") {
        return;
    }
    let home = crate::fence::UserHome::new("rofssub");
    let user = TestUser::create(Some(&home.0));
    let ranges = user.subordinate_ids();
    for pool in STARTS {
        let env = Env::new(if pool { "rofssubpool" } else { "rofssub" });
        let (manifest, port) = probe_app(&env, "rofssub", "");
        for dir in [&env.dir, &home.0] {
            assert!(Command::new("chown").arg("-R").arg(format!("{0}:{0}", user.name)).arg(dir).status().unwrap().success());
        }
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid", &user.name, "--regid", &user.name, "--clear-groups", bin(), "serve"])
            .env("HOME", &home.0)
            .env_remove("SHINYCTL_IDS");
        with_pool(&mut cmd, pool);
        let leak = Leak::into(&mut cmd);
        env.start_daemon(cmd);
        ready_for(&env, pool);
        let a = page_of_deployed(&env, "rofssub", &manifest, port);
        assert_started(&env, "rofssub", pool);
        let uid = env.status()["apps"][0]["uid"].as_u64().expect("the app's own uid") as u32;
        assert!(ranges.iter().any(|r| (r.0..=r.1).contains(&uid)), "one of the user's subordinate ids {ranges:?}: {uid}");
        assert_only_stdio_inherited(&a, &leak, "a subordinate id's copy");
        assert_read_only_host(&a, "a subordinate id's copy");
        assert_listens_only_on_its_port(&a, "a subordinate id's copy");
    }
}

/// Checks from a fenced copy's page that it may listen only on its own
/// port on 127.0.0.1, and that clients, UDP clients, DNS and Unix sockets
/// work.
fn assert_listens_only_on_its_port(a: &BTreeMap<String, String>, what: &str) {
    let got = |k: &str| a.get(k).map(String::as_str).unwrap_or_else(|| panic!("{what}: no {k} on the page: {a:?}"));
    assert!(got("port").parse::<u16>().is_ok_and(|p| p >= 20000), "{what}: the copy's port: {a:?}");
    for k in ["listen-unbound", "bind-any-own", "bind-v6-own", "bind-other", "bind0-listen", "udp-bind"] {
        assert_eq!(got(k), "EACCES", "{what}: {k} is refused: {a:?}");
    }
    // Its own listener would take its calls before the init's: the kernel
    // allows one listener per process's filters.
    assert_eq!(got("own-listener"), "EBUSY", "{what}: a filter of its own with a listener is refused: {a:?}");
    for k in ["udp-client", "udp-sendto", "connect-own", "dns"] {
        assert_eq!(got(k), "ok", "{what}: {k} works: {a:?}");
    }
    // Made in R's working folder, with R's umask (0022 in Rscript).
    assert_eq!(got("unix"), "0o755", "{what}: a Unix socket: {a:?}");
}

/// The app the allow list is tried with: a page, a Shiny session with an
/// upload; on the upload it reads the file, forks (`mclapply`), runs
/// `sh -c`, renders an R Markdown document and runs the probes of calls
/// off the list, logging `ALLOW name=outcome` lines and `ALLOW done`.
const WHOLE_R: &str = r#"
library(shiny)
ui <- fluidPage(fileInput("file1", "a file"), textOutput("live"))
server <- function(input, output, session) {
  output$live <- renderText(paste0("live-from-copy-", Sys.getenv("SHINYCTL_COPY")))
  observeEvent(input$file1, {
    say <- function(k, v) message("ALLOW ", k, "=", v)
    say("upload", paste(readLines(input$file1$datapath), collapse = ""))
    say("mclapply", paste(unlist(parallel::mclapply(1:2, function(i) i * 2, mc.cores = 2)), collapse = ","))
    say("sh", paste(system("sh -c 'echo from-sh; exit 0'", intern = TRUE), collapse = ""))
    rmd <- file.path(tempdir(), "doc.Rmd")
    writeLines(c("---", "title: doc", "---", "", "Two is `r 1 + 1`."), rmd)
    out <- tryCatch(rmarkdown::render(rmd, output_format = "html_document", quiet = TRUE), error = function(e) conditionMessage(e))
    say("render", if (file.exists(out) && any(grepl("Two is 2", readLines(out)))) "ok" else out)
    for (l in system2("/usr/bin/python3", "calls.py", stdout = TRUE, stderr = TRUE)) message("ALLOW ", l)
    message("ALLOW done")
  })
}
shinyApp(ui, server)
"#;

/// Calls off the list and newer than it, from a child of R.
const CALLS_PY: &str = r#"
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
def show(name, nr, *args):
    r = libc.syscall(nr, *args)
    print(f"{name}=" + ("ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")))
mode = ctypes.c_int(0)
show("get_mempolicy", 239, ctypes.byref(mode), None, 0, None, 0)
show("newer", 499)
show("getpid", 39)
"#;

/// A Shiny session over the app's port, with its session id.
struct ShinySession {
    socket: tungstenite::WebSocket<std::net::TcpStream>,
    /// Shiny's session token, which names the upload's URL.
    id: String,
}

impl ShinySession {
    fn open(port: u16) -> ShinySession {
        use tungstenite::client::IntoClientRequest;
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let req = format!("ws://127.0.0.1:{port}/websocket/").into_client_request().unwrap();
        let (mut socket, _) = tungstenite::client(req, stream).expect("the WebSocket handshake");
        socket.send(tungstenite::Message::text(r#"{"method":"init","data":{".clientdata_output_live_hidden":false}}"#)).unwrap();
        let mut id = None;
        loop {
            let text = socket.read().expect("a message from Shiny").into_text().unwrap_or_default().to_string();
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                if let Some(s) = v["config"]["sessionId"].as_str() {
                    id = Some(s.to_string());
                }
            }
            if text.contains("live-from-copy-") {
                break;
            }
        }
        ShinySession { socket, id: id.expect("the session's id in its config") }
    }

    /// Sends a request (`method`, `args`) and returns its answer's value.
    fn request(&mut self, tag: u32, method: &str, args: serde_json::Value) -> serde_json::Value {
        let msg = serde_json::json!({ "method": method, "tag": tag, "args": args });
        self.socket.send(tungstenite::Message::text(msg.to_string())).unwrap();
        loop {
            let text = self.socket.read().expect("Shiny's answer").into_text().unwrap_or_default().to_string();
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
            if v["response"]["tag"] == tag {
                return v["response"]["value"].clone();
            }
        }
    }

    /// Uploads `body` as the file of `input`, as Shiny's `fileInput` does.
    fn upload(&mut self, port: u16, input: &str, body: &str) {
        let job = self.request(1, "uploadInit", serde_json::json!([[{"name": "up.txt", "size": body.len(), "type": "text/plain"}]]));
        let (id, url) = (job["jobId"].as_str().expect("a job id"), job["uploadUrl"].as_str().expect("an upload URL"));
        assert!(url.contains(&self.id), "the upload's URL names the session: {url}");
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let head = format!(
            "POST /{url} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        c.write_all(format!("{head}{body}").as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = c.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "the upload is taken: {answer}");
        self.request(2, "uploadEnd", serde_json::json!([id, input]));
    }
}

#[test]
fn under_the_allow_list_an_app_serves_pages_a_session_an_upload_forks_sh_and_rmarkdown() {
    for pool in STARTS {
        let env = Env::new(if pool { "allowpool" } else { "allow" });
        let mut cmd = Command::new(bin());
        cmd.arg("serve");
        with_pool(&mut cmd, pool);
        env.start_daemon(cmd);
        ready_for(&env, pool);
        let port = free_port();
        let manifest = env.app_running(WHOLE_R, "allow", port, "warm-replicas: 0\n");
        std::fs::write(manifest.with_file_name("calls.py"), CALLS_PY).unwrap();
        env.apply(&manifest);
        env.wait_roles("allow", "1:active", Duration::from_secs(60));
        assert_started(&env, "allow", pool);
        let page = wait_http_ok(port, Duration::from_secs(10)).body;
        assert!(page.contains("file1"), "the page: {page}");
        let mut session = ShinySession::open(port);
        session.upload(port, "file1", "uploaded!");
        let log_path = env.home().join("logs/default-allow.log");
        let log = wait_until(Duration::from_secs(90), "the app's work after the upload", || {
            std::fs::read_to_string(&log_path).ok().filter(|t| t.contains("ALLOW done"))
        });
        let got: BTreeMap<&str, &str> = log.lines().filter_map(|l| l.strip_prefix("ALLOW ")?.split_once('=')).collect();
        assert_eq!(got.get("upload"), Some(&"uploaded!"), "{log}");
        assert_eq!(got.get("mclapply"), Some(&"2,4"), "{log}");
        assert_eq!(got.get("sh"), Some(&"from-sh"), "{log}");
        assert_eq!(got.get("render"), Some(&"ok"), "{log}");
        assert_eq!(got.get("getpid"), Some(&"ok"), "{log}");
        assert_eq!(got.get("get_mempolicy"), Some(&"EPERM"), "a call off the list: {log}");
        assert_eq!(got.get("newer"), Some(&"ENOSYS"), "a call newer than the list: {log}");
        assert!(log.contains("--- shinyctl: fence: seccomp filter"), "{log}");
    }
}
