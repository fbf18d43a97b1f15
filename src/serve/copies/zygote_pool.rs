//! The pool (README, "Sleep and wake": the pool): the daemon keeps a
//! zygote (an R that has loaded shiny and runs no app, waiting in the
//! shared library's `shinyctl_zygote`, see `launcher::zygote`), restarts
//! it when it ends and stops it with the daemon. A copy's launcher claims
//! a fork of it instead of starting R ([`route`] says whether, or why the
//! copy starts cold), so a wake costs a fork, not R's start.
//!
//! The zygote runs as an unprivileged user (a root daemon's is an id of
//! the identities range kept for the pool; otherwise the daemon's own),
//! with no_new_privs, in a cgroup of its own that bounds its memory
//! ([`POOL_MEMORY_ENV`]), in the host's namespaces: each claim's fork
//! makes the copy's namespaces from there.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::home::Home;
use crate::manifest::{AppSpec, SandboxMode};
use crate::sys::cgroup::Cgroups;
use crate::wire::launch::zygote;

/// The daemon's environment variable that switches the pool off (`off`).
pub const POOL_ENV: &str = "SHINYCTL_POOL";
/// The daemon's environment variable that bounds the zygote's memory (a
/// size such as `512M`; its cgroup's limit).
pub const POOL_MEMORY_ENV: &str = "SHINYCTL_POOL_MEMORY";
/// The zygote's memory bound when [`POOL_MEMORY_ENV`] is not set.
pub const DEFAULT_MEMORY: u64 = 1 << 30;
/// The R the zygote runs: an app with another `r-path` starts cold.
pub const POOL_R: &str = "R";
/// The shared library beside the binary that the zygote loads.
pub const LIBRARY: &str = "libshinyctl.so";

/// What an app's environment may not set for a claim: R reads these only
/// when it starts (its library paths, heap limit, locale, time zone, the
/// dynamic loader's path).
pub fn read_at_start(name: &str) -> bool {
    name.starts_with("R_LIBS")
        || name == "R_MAX_VSIZE"
        || name == "LANG"
        || name.starts_with("LC_")
        || name == "TZ"
        || name == "LD_LIBRARY_PATH"
}

/// The pool as the daemon runs it.
#[derive(Debug, Default)]
struct State {
    /// Why the pool is off, when it is.
    off: Option<String>,
    /// The zygote's socket.
    socket: PathBuf,
    /// The zygote that runs.
    zygote: Option<u32>,
    /// Its memory bound.
    memory_max: Option<u64>,
    /// How many times a zygote was started.
    starts: u32,
    /// Set when the daemon stops: the zygote is not started again.
    stopping: bool,
    /// The zygote's temporary folder ([`fresh_tmp`]), removed when it ends.
    tmp: Option<PathBuf>,
}

/// The daemon's one pool.
fn state() -> &'static Mutex<State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE.get_or_init(|| Mutex::new(State { off: Some("the daemon has not started it".into()), ..State::default() }))
}

/// Locks the pool's state (a poisoned lock still holds good figures).
fn lock() -> std::sync::MutexGuard<'static, State> {
    state().lock().unwrap_or_else(|e| e.into_inner())
}

/// Why the pool is off for the whole daemon, from its environment and
/// what is installed; none when it may run.
fn off_reason(library: &Path) -> Option<String> {
    if std::env::var(POOL_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("off") || v == "0" || v.eq_ignore_ascii_case("false")) {
        return Some(format!("the pool is off ({POOL_ENV}=off)"));
    }
    if !library.is_file() {
        return Some(format!("the pool's library {} is not beside the binary", library.display()));
    }
    None
}

/// The shared library beside this binary; in a cargo build tree, the
/// newer of that and `deps/`'s (`cargo test` builds the library there
/// without copying it up).
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let installed = exe.to_string_lossy();
    let beside = PathBuf::from(installed.strip_suffix(" (deleted)").unwrap_or(&installed)).with_file_name(LIBRARY);
    let built = beside.with_file_name("deps").join(LIBRARY);
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    match (mtime(&beside), mtime(&built)) {
        (Some(a), Some(b)) if b > a => built,
        (None, Some(_)) => built,
        _ => beside,
    }
}

/// Starts the pool's keeper: a thread that runs the zygote and starts it
/// again when it ends (after a pause that grows while it keeps failing).
pub fn start(home: &Home, cgroups: &Cgroups) {
    let lib = library();
    let socket = home.root.join("pool").join("zygote.sock");
    {
        let mut s = lock();
        s.socket = socket.clone();
        s.off = off_reason(&lib);
        if let Some(why) = &s.off {
            tracing::info!("{why}: every copy starts cold");
            return;
        }
    }
    let (home, cgroups) = (home.clone(), cgroups.clone());
    let spawned = std::thread::Builder::new().name("pool".into()).spawn(move || keep(&home, &cgroups, &lib, &socket));
    if let Err(e) = spawned {
        lock().off = Some(format!("the pool's thread cannot start ({e})"));
    }
}

/// Runs the zygote until the daemon stops. The zygote's parent-death
/// signal is bound to this thread, which lives as long as the daemon.
fn keep(home: &Home, cgroups: &Cgroups, lib: &Path, socket: &Path) {
    let mut pause = Duration::from_millis(500);
    loop {
        if lock().stopping {
            return;
        }
        let began = Instant::now();
        match spawn(home, cgroups, lib, socket) {
            Ok(mut child) => {
                let status = child.wait();
                let tmp = {
                    let mut s = lock();
                    s.zygote = None;
                    s.tmp.take()
                };
                if let Some(tmp) = tmp {
                    let _ = std::fs::remove_dir_all(tmp);
                }
                if lock().stopping {
                    return;
                }
                tracing::warn!("the pool's zygote (pid {}) ended ({status:?}); starting another", child.id());
            }
            Err(_) if lock().stopping => return,
            Err(e) => {
                tracing::warn!("the pool's zygote cannot start: {e:#}");
                lock().off = Some(format!("the zygote cannot start: {e:#}"));
            }
        }
        pause =
            if began.elapsed() > Duration::from_secs(60) { Duration::from_millis(500) } else { (pause * 2).min(Duration::from_secs(30)) };
        std::thread::sleep(pause);
    }
}

/// Binds the zygote's socket (it listens once shiny is loaded: a claim
/// before then is refused at once and the copy starts cold) and starts the
/// zygote with it as fd 3, in the pool's cgroup where there is one.
fn spawn(home: &Home, cgroups: &Cgroups, lib: &Path, socket: &Path) -> anyhow::Result<std::process::Child> {
    let listener = bind(socket)?;
    let log_path = home.root.join("pool").join("zygote.log");
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
    let (given, uid) = environment(home)?;
    if let Some(uid) = uid {
        std::os::unix::fs::chown(&log_path, Some(uid), Some(uid))?;
    }
    let tmp = fresh_tmp(home, uid)?;
    let mut cmd = command(lib, given, &tmp, uid, listener.as_raw_fd(), log)?;
    let memory = std::env::var(POOL_MEMORY_ENV).ok().and_then(|v| crate::manifest::parse_size(&v)).unwrap_or(DEFAULT_MEMORY);
    let n = {
        let mut s = lock();
        s.starts += 1;
        s.starts
    };
    // Only on cgroup v2, where the launcher moves a claim's fork whole into
    // its copy's cgroup. Under v1 a copy without a memory limit has no
    // memory cgroup of its own, so its fork would stay in the pool's (its
    // memory the pool's, and a new daemon clearing the pool's leaf would
    // end it): there the zygote stays in the daemon's cgroups, as copies.
    let leaf = format!("pool-{n}");
    let cgroup = if cgroups.is_v2() { cgroups.prepare(&leaf, Some(memory), 4096) } else { Ok(Vec::new()) };
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(anyhow::anyhow!("cannot run {POOL_R}: {e}"));
        }
    };
    drop(listener);
    let bounded = match &cgroup {
        Ok(dirs) if !dirs.is_empty() => dirs.iter().all(|d| std::fs::write(d.join("cgroup.procs"), child.id().to_string()).is_ok()),
        _ => false,
    };
    let mut s = lock();
    if s.stopping {
        // `stop` ran while this zygote started, and found none to end.
        drop(s);
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&tmp);
        anyhow::bail!("the daemon is stopping");
    }
    s.zygote = Some(child.id());
    s.tmp = Some(tmp);
    s.memory_max = bounded.then_some(memory);
    s.off = None;
    tracing::info!(pid = child.id(), "the pool's zygote started");
    Ok(child)
}

/// Environment variables, names and values, in order.
type Vars = Vec<(std::ffi::OsString, std::ffi::OsString)>;

/// The zygote's environment, with the identity it runs as: what R needs of
/// the daemon's (as a copy gets), no user environment file (a claimed copy
/// reads the app's), and under a root daemon the pool's own uid with its
/// `HOME`, `USER` and `LOGNAME` (README, "Identities"), so R's HOME is the
/// claimed copy's.
fn environment(home: &Home) -> anyhow::Result<(Vars, Option<u32>)> {
    let mut given: Vars = crate::sys::users::kept_env(std::env::vars_os());
    given.push(("R_ENVIRON_USER".into(), "/nonexistent".into()));
    if !nix::unistd::geteuid().is_root() {
        return Ok((given, None));
    }
    let ids = crate::sys::ids::ids_file();
    let uid = crate::sys::ids::of_app(&ids, (crate::sys::ids::FIRST, crate::sys::ids::LAST), &home.root, ".pool", "zygote")?;
    let who = crate::sys::users::of_app(uid);
    given.retain(|(k, _)| !matches!(k.to_str(), Some("HOME" | "USER" | "LOGNAME")));
    given.extend([
        ("HOME".into(), who.home.into_os_string()),
        ("USER".into(), who.name.clone().into()),
        ("LOGNAME".into(), who.name.into()),
    ]);
    Ok((given, Some(uid)))
}

/// The zygote's command: R with the zygote's expression, `given` alone as
/// its environment (and `TMPDIR` = `tmp`), its output to `log`, the
/// socket `fd` as its fd 3 and nothing else of the daemon's open; in a
/// session of its own, ended with the daemon, with no new privileges.
fn command(
    lib: &Path,
    mut given: Vars,
    tmp: &Path,
    uid: Option<u32>,
    fd: std::os::fd::RawFd,
    log: std::fs::File,
) -> anyhow::Result<Command> {
    given.retain(|(k, _)| k != "TMPDIR");
    given.push(("TMPDIR".into(), tmp.as_os_str().to_owned()));
    let names: Vec<String> = given.iter().map(|(k, _)| k.to_string_lossy().into_owned()).collect();
    let mut cmd = Command::new(POOL_R);
    cmd.args(["--no-echo", "--no-restore", "--no-init-file", "-e", &zygote::r_expr(lib)])
        .env_clear()
        .envs(given)
        .env(zygote::GIVEN_ENV, names.join(","))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    let daemon = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls (dup2, close_range, setsid, prctl, getppid).
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Nothing else the daemon holds (or was given by its starter)
            // reaches the zygote, and so no copy claimed from it.
            if libc::syscall(libc::SYS_close_range, 4 as libc::c_uint, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::setsid();
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // A daemon that ended between the fork and the line above sent
            // no signal: a zygote would be left with no one to end it.
            if libc::getppid() != daemon {
                return Err(std::io::Error::other("the daemon ended"));
            }
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            Ok(())
        });
    }
    Ok(cmd)
}

/// A new temporary folder for the zygote's R (its `TMPDIR`, mode 0700,
/// the zygote's), named for the home: `shinyctl-pool-<home tag>-XXXXXX` in
/// the system's. R makes its `tempdir()` in it and, ended by a signal as a
/// zygote always is, leaves it behind: in the shared /tmp that was one
/// empty folder for every zygote ever started. The zygote's is removed when
/// it ends ([`stop`], [`keep`]); one a daemon killed with its zygote left
/// is removed here, at the next start. A claimed copy's R makes its own
/// under the copy's /tmp (the claim drops what the daemon gave the zygote,
/// `TMPDIR` with it).
fn fresh_tmp(home: &Home, uid: Option<u32>) -> anyhow::Result<PathBuf> {
    let system = std::env::temp_dir();
    let prefix = format!("shinyctl-pool-{}-", crate::sys::cgroup::home_tag(&home.root));
    let owner = uid.unwrap_or_else(|| nix::unistd::geteuid().as_raw());
    if let Ok(entries) = std::fs::read_dir(&system) {
        use std::os::unix::fs::MetadataExt;
        for e in entries.flatten() {
            let ours = e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix));
            // Only a folder of the zygote's owner: one someone else made
            // with the name is not ours to remove.
            if ours && e.metadata().is_ok_and(|m| m.is_dir() && m.uid() == owner) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let made = nix::unistd::mkdtemp(&system.join(format!("{prefix}XXXXXX")))
        .map_err(|e| anyhow::anyhow!("cannot make the zygote's temporary folder in {}: {e}", system.display()))?;
    if let Some(uid) = uid {
        std::os::unix::fs::chown(&made, Some(uid), Some(uid))?;
    }
    Ok(made)
}

/// Binds the zygote's socket afresh (mode 0600 in a folder of mode 0700).
fn bind(path: &Path) -> anyhow::Result<OwnedFd> {
    use nix::sys::socket::{bind, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::unix::fs::DirBuilderExt;
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let fd = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)?;
    bind(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    Ok(fd)
}

/// Stops the zygote (the daemon stops). Copies claimed from it run on.
pub fn stop() {
    let mut s = lock();
    s.stopping = true;
    if let Some(pid) = s.zygote.take() {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
    }
    // Here rather than once the keeper has reaped it: the daemon may exit
    // first. A SIGKILLed R writes nothing more.
    if let Some(tmp) = s.tmp.take() {
        let _ = std::fs::remove_dir_all(tmp);
    }
}

/// Why a copy starts cold instead of from the pool ([`route`]); its text
/// is what status and the copy's log say after "cold: ".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ColdStart {
    /// The pool is off for the whole daemon (the text says why).
    #[error("{0}")]
    PoolOff(String),
    /// The app's manifest has `pool: false`.
    #[error("pool: false in its manifest")]
    OffInManifest,
    /// The app runs with the fence off; a claimed copy is always fenced.
    #[error("sandbox mode off (a claimed copy is always fenced)")]
    FenceOff,
    /// The app runs another R than the zygote's.
    #[error("r-path {0} is not the pool's R ({POOL_R})")]
    OtherR(String),
    /// The app's env sets a variable R reads only at its start.
    #[error("its env sets {0}, which R reads only when it starts")]
    ReadAtStart(String),
    /// The `.Renviron` the copy reads sets a variable R reads only when it
    /// starts (R would not take it from a claim's reading of the file).
    #[error("its .Renviron sets {0}, which R reads only when it starts")]
    RenvironSets(String),
    /// The app uses renv.
    #[error("it uses renv, whose library may hold another shiny than the pool's")]
    Renv,
    /// The zygote is not running (being restarted).
    #[error("no zygote runs")]
    NoZygote,
}

/// Where a copy of `spec` (running `dir`) is claimed from: the zygote's
/// socket, or why it starts cold.
pub fn route(spec: &AppSpec, dir: &Path) -> Result<PathBuf, ColdStart> {
    let s = lock();
    if let Some(why) = &s.off {
        return Err(ColdStart::PoolOff(why.clone()));
    }
    if !spec.pool {
        return Err(ColdStart::OffInManifest);
    }
    if spec.start.sandbox.mode == SandboxMode::Off {
        return Err(ColdStart::FenceOff);
    }
    if spec.start.r_path != POOL_R {
        return Err(ColdStart::OtherR(spec.start.r_path.clone()));
    }
    if let Some(name) = spec.start.env.keys().find(|k| read_at_start(k)) {
        return Err(ColdStart::ReadAtStart(name.clone()));
    }
    if dir.join("renv.lock").exists() || dir.join("renv").is_dir() {
        return Err(ColdStart::Renv);
    }
    if let Some(name) = renviron_of(dir).as_deref().and_then(renviron_sets) {
        return Err(ColdStart::RenvironSets(name));
    }
    if s.zygote.is_none() {
        return Err(ColdStart::NoZygote);
    }
    Ok(s.socket.clone())
}

/// The `.Renviron` a claimed copy reads (`claim::r_program`, as R does):
/// the app folder's, else the home's of the daemon's user.
fn renviron_of(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join(".Renviron"))
        .ok()
        .or_else(|| std::fs::read_to_string(Path::new(&std::env::var_os("HOME")?).join(".Renviron")).ok())
}

/// The first variable R reads only at its start ([`read_at_start`]) that an
/// `.Renviron` sets (`NAME=value` lines; `#` comments).
pub fn renviron_sets(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('=').map(|(name, _)| name.trim()))
        .find(|name| read_at_start(name))
        .map(str::to_string)
}

/// The pool as status and metrics show it.
pub fn report() -> crate::wire::PoolReport {
    let s = lock();
    let zygotes: Vec<crate::wire::ZygoteReport> = s
        .zygote
        .iter()
        .map(|&pid| crate::wire::ZygoteReport {
            pid,
            rss_bytes: crate::sys::procfs::rss_bytes(pid).unwrap_or(0),
            mem_bytes: crate::sys::procfs::mem_bytes(pid).unwrap_or(0),
            ready: listening(&s.socket),
        })
        .collect();
    crate::wire::PoolReport { on: s.off.is_none(), off: s.off.clone(), size: 1, memory_max_bytes: s.memory_max, zygotes }
}

/// True when the Unix socket at `path` listens (the zygote has loaded
/// shiny and waits for claims): its `/proc/net/unix` line has the
/// accepting flag (`__SO_ACCEPTCON`, 0x10000).
fn listening(path: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let want = path.to_string_lossy();
    text.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 8 && f[7] == want && u32::from_str_radix(f[3], 16).is_ok_and(|flags| flags & 0x10000 != 0)
    })
}

/// The zygote's memory counted in capacity's memory bound: its
/// proportional share, as the copies' (`procfs::mem_bytes`), so the pages
/// it shares with its claimed copies are counted once in the sum. About
/// 1 ms: read by the CPU sampler off the daemon's lock, not in a cycle.
pub fn memory_used() -> u64 {
    let pid = lock().zygote;
    pid.and_then(crate::sys::procfs::mem_bytes).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_r_reads_only_at_start_is_known() {
        for name in ["R_LIBS", "R_LIBS_USER", "R_LIBS_SITE", "R_MAX_VSIZE", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "LD_LIBRARY_PATH"] {
            assert!(read_at_start(name), "{name}");
        }
        for name in ["HOME", "DB_URL", "R_CONFIG_ACTIVE", "LANGUAGE_X"] {
            assert!(!read_at_start(name), "{name}");
        }
    }

    #[test]
    fn an_renviron_that_sets_what_r_reads_at_start_is_found() {
        assert_eq!(renviron_sets("# a comment\nDB_URL=x\n  R_LIBS_USER = /var/tmp/lib\nTZ=Asia/Tokyo\n").as_deref(), Some("R_LIBS_USER"));
        assert_eq!(renviron_sets("DB_URL=postgres://x?a=b\n#TZ=UTC\nnot a line\n"), None);
    }
}
