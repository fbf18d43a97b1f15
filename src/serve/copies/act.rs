//! The act step: start an R copy, stop one, and watch processes for their
//! exit with a pidfd (so an exit is noticed the moment it happens, for our
//! own children and for adopted processes alike).

use std::fs::OpenOptions;
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc::UnboundedSender;

use crate::home::Home;
use crate::manifest::{AppSpec, SandboxMode};
use crate::sys::procfs;
use crate::wire::launch::Launch;
use crate::wire::{CopyRecord, Exit};

use crate::serve::Event;
use crate::sys::pidfd::Pidfd;

/// The copies' port range on 127.0.0.1.
pub const COPY_PORTS: std::ops::RangeInclusive<u16> = 20000..=29999;

/// How long a stopping copy gets after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

pub use crate::sys::clock::now_ms;

/// Picks the copy's port: the one it had if it is still free, else a free
/// one in 20000–29999 that no other copy holds.
pub fn pick_port(wanted: u16, taken: &[u16], seed: u64) -> Option<u16> {
    // Free: nobody listens where 127.0.0.1 reaches it (a socket on `::`
    // that lets 127.0.0.1 be bound beside it still takes the connections).
    let free = |p: u16| {
        !taken.contains(&p) && !procfs::listening(p).iter().any(|l| l.reaches_loopback) && TcpListener::bind(("127.0.0.1", p)).is_ok()
    };
    if wanted != 0 && free(wanted) {
        return Some(wanted);
    }
    let span = (*COPY_PORTS.end() - *COPY_PORTS.start()) as u64 + 1;
    // Start somewhere that depends on the app and copy, so two daemons (tests
    // side by side) rarely reach for the same port.
    (0..span).map(|i| *COPY_PORTS.start() + ((seed + i) % span) as u16).find(|&p| free(p))
}

/// A copy's launcher, ready to run: everything done but the fork and exec,
/// which wait on the scheduler (tens of milliseconds on a loaded machine)
/// and so happen with the daemon's lock released.
pub struct Launching {
    /// `shinyctl launch …`, with the copy's environment, session and log.
    cmd: Command,
    /// The read end of the pipe that is the launcher's standard input:
    /// the copy's init writes a byte to it the moment R listens on its port
    /// (the ports fence sees the `listen`), so readiness is asked at once.
    told: Option<OwnedFd>,
}

/// A launcher that runs.
pub struct Spawned {
    /// Its PID.
    pub pid: u32,
    /// Where it says R listens (see [`Launching`]).
    pub told: Option<OwnedFd>,
}

impl Launching {
    /// Runs the launcher; returns its PID. Blocking (fork, exec).
    pub fn spawn(mut self) -> anyhow::Result<Spawned> {
        let child = self.cmd.spawn().map_err(|e| anyhow::anyhow!("cannot run the copy launcher: {e}"))?;
        // The Child handle is dropped on purpose: the exit watcher reaps the
        // process by PID, the same way for children and adopted processes.
        // Dropping the Command closes the daemon's copy of the pipe's write
        // end: only the launcher's remains.
        drop(self.cmd);
        Ok(Spawned { pid: child.id(), told: self.told })
    }
}

/// Readies a copy's process: the launcher (`shinyctl launch`, which makes
/// the copy's world and execs R) in its own process group, output appended
/// straight to its log file. Picks the copy's port and records it; the
/// PID is recorded once [`Launching::spawn`] has run ([`started`]).
/// `dir` is the folder it runs (on the host; the launcher mounts it
/// read-only): its release, or working-dir for a copy from before releases.
/// `cgroups`: the copy's cgroups, which the launcher joins first.
pub fn prepare_start(
    home: &Home,
    spec: &AppSpec,
    rec: &mut CopyRecord,
    dir: &Path,
    taken_ports: &[u16],
    cgroups: Vec<std::path::PathBuf>,
    uid: Option<u32>,
) -> anyhow::Result<Launching> {
    let seed = spec.name.bytes().fold(rec.copy as u64 * 7919, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    // Other copies' ports are taken; this copy's own is what it wants back.
    let taken: Vec<u16> = taken_ports.iter().copied().filter(|&p| p != rec.port).collect();
    let port = pick_port(rec.port, &taken, seed).ok_or_else(|| anyhow::anyhow!("no free port in 20000-29999"))?;
    let log_path = home.copy_log(&spec.group, &spec.name, rec.copy);
    let scratch = home.scratch_dir(&spec.group, &spec.name, rec.copy);
    std::fs::create_dir_all(&scratch)?;
    let mut log = OpenOptions::new().create(true).append(true).open(&log_path)?;
    // A root daemon's run-as user writes its scratch disk and its log.
    // The app's own uid takes its disk whole in the launcher (a disk from
    // before it had one is handed over there, off the daemon's lock).
    let owned: Vec<&std::path::PathBuf> = if uid.is_some() { vec![&log_path] } else { vec![&scratch, &log_path] };
    for p in owned {
        crate::sys::users::give_to(p, spec.start.run_as.as_deref(), uid)
            .map_err(|e| anyhow::anyhow!("cannot give {} to the copy's user: {e}", p.display()))?;
    }
    {
        use std::io::Write;
        let _ = writeln!(
            log,
            "--- shinyctl: copy {} of {} (revision {}) starting on 127.0.0.1:{port} at {} ---",
            rec.copy,
            spec.name,
            rec.revision,
            procfs::local_rfc3339(now_ms())
        );
    }
    let launch = Launch {
        home: home.root.clone(),
        app: spec.name.clone(),
        copy: rec.copy,
        port,
        app_dir: dir.to_path_buf(),
        scratch,
        uid,
        cgroups,
        start: spec.start.clone(),
        pool: None,
        cold: None,
    };
    let mut launch = launch;
    match crate::serve::copies::zygote_pool::route(spec, dir) {
        Ok(socket) => launch.pool = Some(socket),
        Err(why) => launch.cold = Some(why.to_string()),
    }
    let mut cmd = launch.command()?;
    // A fenced copy gets a clean environment: only what R needs of the
    // daemon's (crate::sys::users::kept), then the manifest's env.
    if spec.start.sandbox.mode != SandboxMode::Off {
        cmd.env_clear().envs(crate::sys::users::kept_env(std::env::vars_os()));
    }
    // A fenced copy's init says when R listens: the launcher gets a pipe's
    // write end as its stdin (both ends close-on-exec). With the fence off
    // nothing would say it.
    let (told, stdin) = match spec.start.sandbox.mode {
        SandboxMode::Off => (None, Stdio::null()),
        _ => {
            let (told, tell) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
            (Some(told), Stdio::from(tell))
        }
    };
    cmd.envs(&spec.start.env).env("SHINYCTL_COPY", rec.copy.to_string()).stdin(stdin).stdout(log.try_clone()?).stderr(log);
    // Its own process group, which every stop signals (README, "Status").
    // Not its own session by `setsid` in `pre_exec`: a closure there makes
    // the standard library fork the daemon (page tables and all, 1-3 ms of
    // every copy's start for a daemon of tens of MB) where a process group
    // is set by posix_spawn (a vfork) itself. The session stays the
    // daemon's: one of its own with no terminal under `serve -d` and
    // systemd; a daemon run in a terminal shares the terminal's, and its
    // copies, in groups of their own, get none of its job-control signals.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    rec.port = port;
    Ok(Launching { cmd, told })
}

/// True when the app's copies run as its own uid (README, "Identities"):
/// fenced, without `run-as`, under a daemon that has ids to give (root, or
/// a user with subordinate ids).
pub fn runs_as_own_uid(spec: &AppSpec) -> bool {
    spec.start.run_as.is_none() && spec.start.sandbox.mode != SandboxMode::Off && crate::sys::ids::Scheme::current().range().is_some()
}

/// Records in a copy's record the launcher that [`Launching::spawn`] ran.
pub fn started(rec: &mut CopyRecord, pid: u32) {
    rec.pid = Some(pid);
    rec.pid_start = procfs::start_ticks(pid);
    rec.started_ms = Some(now_ms());
    rec.left_down = None;
    // A new process: held to start-timeout until it is ready once.
    rec.ever_ready = false;
}

/// Stops a process and its group: SIGTERM, then SIGKILL after the grace
/// period if it is still there. Signals go through a pidfd opened while the
/// process is the one that started at `start`, so a reused PID is never
/// signalled; without a pidfd (refused, EMFILE) the start time is checked
/// before each signal.
pub fn stop_process(pid: u32, start: Option<u64>) {
    let alive = move || start.map_or(procfs::start_ticks(pid).is_some(), |s| procfs::is_alive(pid, s));
    if !alive() {
        return;
    }
    let handle = Pidfd::open(pid, start).ok();
    let signal_group = move |handle: &Option<Pidfd>, sig: i32| match handle {
        Some(h) => h.signal_group(pid, sig),
        None => {
            // SAFETY: kill with a negative pid signals a process group.
            unsafe { libc::kill(-(pid as libc::pid_t), sig) };
        }
    };
    signal_group(&handle, libc::SIGTERM);
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + STOP_GRACE;
        while tokio::time::Instant::now() < deadline {
            if !alive() {
                // The leader is gone; anything left in its group goes too
                // (by number: the group outlives its leader's pidfd).
                // SAFETY: kill with a negative pid signals a process group.
                unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        signal_group(&handle, libc::SIGKILL);
    });
}

/// Stops a process and its group as [`stop_process`] does, and returns only
/// once it is gone (SIGKILL after the grace period): for `shutdown --all`,
/// whose daemon ends right after, taking any timer with it. Blocking.
pub fn stop_and_wait(pid: u32, start: Option<u64>) {
    let alive = move || start.map_or(procfs::start_ticks(pid).is_some(), |s| procfs::is_alive(pid, s));
    if !alive() {
        return;
    }
    let handle = Pidfd::open(pid, start).ok();
    let signal_group = |sig: i32| match &handle {
        Some(h) => h.signal_group(pid, sig),
        // SAFETY: kill with a negative pid signals a process group.
        None => unsafe {
            libc::kill(-(pid as libc::pid_t), sig);
        },
    };
    signal_group(libc::SIGTERM);
    let deadline = std::time::Instant::now() + STOP_GRACE;
    while alive() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    // What is left of its group goes too (by number: the group outlives
    // its leader's pidfd).
    signal_group(libc::SIGKILL);
    // SAFETY: as above.
    unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
    let gone_by = std::time::Instant::now() + Duration::from_secs(2);
    while alive() && std::time::Instant::now() < gone_by {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reaps `pid` if it is our child and says how it ended; `None` for a
/// process that is not ours (adopted) or not gone yet.
pub fn reap(pid: u32) -> Option<(Option<i32>, Option<i32>)> {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    match waitpid(nix::unistd::Pid::from_raw(pid as i32), Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::Exited(_, code)) => Some((Some(code), None)),
        Ok(WaitStatus::Signaled(_, sig, _)) => Some((None, Some(sig as i32))),
        _ => None,
    }
}

/// How often a process without a pidfd is looked for in /proc.
const EXIT_POLL: Duration = Duration::from_millis(100);

/// Watches a process and sends `Event::Exit` the moment it ends. Works for
/// our children (reaped, with their exit status) and for adopted processes
/// (status unknown). Where no pidfd can be had, /proc is polled (the start
/// time tells a reused PID), so an exit is never reported for a process
/// that is alive.
pub fn watch_exit(app: String, pid: u32, events: UnboundedSender<Event>) {
    let start = procfs::start_ticks(pid);
    tokio::spawn(async move {
        let watched = match Pidfd::open(pid, start) {
            // SAFETY: the AsyncFd owns the OwnedFd, which stays open and the
            // same until the AsyncFd drops.
            Ok(h) => unsafe { AsyncFd::register_with_interest(h.fd, tokio::io::Interest::READABLE) }.ok(),
            Err(e) => {
                tracing::debug!(pid, "no pidfd ({e}); watching /proc");
                None
            }
        };
        match watched {
            // A pidfd turns readable when the process exits.
            Some(afd) => drop(afd.readable().await),
            None => gone_from_proc(pid, start).await,
        }
        // A zombie child is readable at once; give the kernel a moment in
        // the rare case reaping races the exit.
        let mut status = reap(pid);
        for _ in 0..5 {
            if status.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            status = reap(pid);
        }
        let (code, signal) = status.unwrap_or((None, None));
        let _ = events.send(Event::Exit {
            app,
            pid,
            exit: Exit { at_ms: now_ms(), code, signal, memory: None, start_timeout_ms: None, disk: None },
        });
    });
}

/// Returns once the process that started at `start` is gone or a zombie,
/// looking in /proc every [`EXIT_POLL`].
async fn gone_from_proc(pid: u32, start: Option<u64>) {
    while start.is_some_and(|s| procfs::is_alive(pid, s)) {
        tokio::time::sleep(EXIT_POLL).await;
    }
}

/// What the daemon may hear of a starting copy besides its port's answer.
#[derive(Debug, Default)]
pub struct Heard {
    /// The read end of the launcher's stdin pipe, on which the copy's init
    /// writes a byte the moment R listens (see [`Launching`]); none for a
    /// copy that cannot say (adopted, or with the fence off).
    pub told: Option<OwnedFd>,
    /// The copy starts for a wake, with visitors' requests held for it.
    /// Then the word and a listening socket of the copy's own are enough:
    /// the held request is what asks R first, as a visitor of R alone
    /// does, rather than waiting behind a probe R answers only once its
    /// loop runs (README, "Sleep").
    pub waking: bool,
}

/// How often the port is asked when no word can come that R listens (a
/// copy with the fence off, one adopted from a daemon before).
const READY_POLL: Duration = Duration::from_millis(100);

/// How often it is asked while the word is awaited: only in case none
/// comes (a kernel without seccomp notifications gives the copy no ports
/// fence, and so no word).
const READY_POLL_TOLD: Duration = Duration::from_secs(1);

/// Sends `Event::Ready` once the copy's port answers HTTP from a socket of
/// its own process tree, or, for a wake, once the init's word came and
/// R's socket is seen ([`Heard`]); gives up when the process is gone. On
/// the word the port is asked at once (and then every [`READY_POLL`]);
/// until it comes, every [`READY_POLL_TOLD`].
pub fn probe_ready(app: String, pid: u32, start: u64, port: u16, scratch: std::path::PathBuf, events: UnboundedSender<Event>, says: Heard) {
    let Heard { told, waking } = says;
    tokio::spawn(async move {
        let mut listening_ms = None;
        let mut told = told.and_then(|fd| {
            use std::os::fd::AsRawFd;
            nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).ok()?;
            // SAFETY: the AsyncFd owns the OwnedFd, which stays open and the
            // same until the AsyncFd drops.
            unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()
        });
        loop {
            if !procfs::is_alive(pid, start) {
                return;
            }
            let (http, mut own) = tokio::join!(answers_http(port), own_socket(&scratch, pid, port));
            // The look can be done before R's `listen` returns (the init's
            // word comes as it lets the call through, and netlink answers in
            // a tenth of a millisecond): once the port has answered, the
            // socket is there, so look again now rather than a poll later.
            if http && own.is_none() {
                own = own_socket(&scratch, pid, port).await;
            }
            if let (true, Some(r)) = (http, own) {
                tracing::debug!(app, pid, "ready");
                let _ = events.send(Event::Ready { app, pid, listening_ms, r_pid: r.pid, r_started_ms: r.started_ms });
                return;
            }
            let word = async {
                match &told {
                    Some(afd) => heard(afd).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                got = word => {
                    // The one word came (or the pipe closed): ask now, then poll.
                    tracing::debug!(app, pid, listening = got, "the copy's init says R listens");
                    told = None;
                    listening_ms = got.then(now_ms);
                    if got && waking {
                        if let Some(r) = listens_soon(&scratch, pid, port).await {
                            tracing::debug!(app, pid, "ready on the init's word: a wake's held requests go to it");
                            let _ = events.send(Event::Ready { app, pid, listening_ms, r_pid: r.pid, r_started_ms: r.started_ms });
                            return;
                        }
                    }
                }
                _ = tokio::time::sleep(if told.is_some() { READY_POLL_TOLD } else { READY_POLL }) => {}
            }
        }
    });
}

/// A copy's R process as its launcher's report names it.
#[derive(Debug, Clone, Copy, Default)]
struct RProcess {
    /// Its PID (for the copies table).
    pid: Option<u32>,
    /// When (Unix ms) it started (for a wake's steps).
    started_ms: Option<u64>,
}

/// `Some` when a socket of the copy's own listens on `port`, with its R
/// process as the launcher's report names it. The report names R (looked
/// at before the whole tree) and a claimed copy's processes' root
/// (`procfs::adopt`). Off the runtime: it reads the report and /proc.
async fn own_socket(scratch: &std::path::Path, pid: u32, port: u16) -> Option<RProcess> {
    let scratch = scratch.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let report = crate::wire::launch::report::read_report(&scratch, pid);
        let r = RProcess { pid: report.as_ref().and_then(|r| r.r_pid), started_ms: report.and_then(|r| r.r_started_ms) };
        (procfs::owner_among(&procfs::listening(port), pid, r.pid) == procfs::PortOwner::Ours).then_some(r)
    })
    .await
    .ok()
    .flatten()
}

/// [`own_socket`]'s answer once a socket of the copy's own listens on
/// `port`, looked for every [`LISTEN_LOOK`] for up to [`LISTEN_LOOK_FOR`]:
/// the init's word comes as it lets R's `listen` through, a moment before
/// the socket is in the kernel's table. None after that (the HTTP probe
/// decides then).
async fn listens_soon(scratch: &std::path::Path, pid: u32, port: u16) -> Option<RProcess> {
    let deadline = tokio::time::Instant::now() + LISTEN_LOOK_FOR;
    loop {
        if let Some(r) = own_socket(scratch, pid, port).await {
            return Some(r);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(LISTEN_LOOK).await;
    }
}

/// How often the port's owner is looked at after the init's word.
const LISTEN_LOOK: Duration = Duration::from_millis(2);

/// How long after the init's word a wake's copy may take to be seen
/// listening before its readiness is left to the HTTP probe.
const LISTEN_LOOK_FOR: Duration = Duration::from_millis(200);

/// Waits for the launcher's byte on `afd`; true when it came, false when
/// the pipe closed or failed without it.
async fn heard(afd: &AsyncFd<OwnedFd>) -> bool {
    loop {
        let Ok(mut guard) = afd.readable().await else { return false };
        let mut byte = [0u8; 1];
        match guard.try_io(|fd| {
            use std::os::fd::AsRawFd;
            nix::unistd::read(fd.get_ref().as_raw_fd(), &mut byte).map_err(std::io::Error::from)
        }) {
            Ok(Ok(n)) => return n == 1,
            Ok(Err(_)) => return false,
            Err(_would_block) => continue,
        }
    }
}

/// The request the readiness probe sends: a path no app serves, so the
/// answer (any status: a 404 from shiny) costs R no page. A `GET /` made R
/// render the app's page for the probe, and again for the woken copy's
/// held request right after (27–50 ms of a wake on this 2-core machine).
const PROBE_REQUEST: &[u8] = b"GET /shinyctl-ready HTTP/1.0\r\nHost: 127.0.0.1\r\nUser-Agent: shinyctl-probe\r\n\r\n";

/// True when `127.0.0.1:port` answers an HTTP request (whatever its
/// status) with an HTTP status line.
async fn answers_http(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        s.write_all(PROBE_REQUEST).await.ok()?;
        let mut buf = [0u8; 12];
        let mut n = 0;
        while n < 5 {
            let m = s.read(&mut buf[n..]).await.ok()?;
            if m == 0 {
                break;
            }
            n += m;
        }
        Some(buf[..n].starts_with(b"HTTP/"))
    };
    matches!(tokio::time::timeout(Duration::from_secs(2), attempt).await, Ok(Some(true)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_a_pidfd_an_exit_is_found_in_proc_and_never_early() {
        let mut child = Command::new("sleep").arg("0.5").spawn().unwrap();
        let pid = child.id();
        let start = procfs::start_ticks(pid);
        let watch = tokio::spawn(gone_from_proc(pid, start));
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(!watch.is_finished(), "reported gone while alive");
        tokio::time::timeout(Duration::from_secs(5), watch).await.expect("found gone").unwrap();
        assert!(child.try_wait().unwrap().is_some(), "it had really ended");
    }

    #[tokio::test]
    async fn the_probe_asks_for_no_page_and_takes_any_status() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut head = Vec::new();
            let mut b = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut b).await.unwrap();
                assert!(n > 0, "the probe's request ended before its head did");
                head.extend_from_slice(&b[..n]);
            }
            s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n").await.unwrap();
            String::from_utf8_lossy(&head).into_owned()
        });
        assert!(answers_http(port).await, "a 404 is an HTTP answer");
        let head = server.await.unwrap();
        let path = head.split(' ').nth(1).unwrap_or_default();
        assert!(head.starts_with("GET ") && path != "/" && path.len() > 1, "the probe must not ask for the app's page: {head}");
    }

    #[test]
    fn pick_port_keeps_a_free_port_and_avoids_taken_ones() {
        let p = pick_port(0, &[], 12345).expect("a free port");
        assert!(COPY_PORTS.contains(&p));
        assert_eq!(pick_port(p, &[], 1), Some(p), "its own port again when free");
        let q = pick_port(p, &[p], 12345).expect("another port");
        assert_ne!(p, q);
        let held = TcpListener::bind(("127.0.0.1", q)).expect("bind");
        assert_ne!(pick_port(q, &[], 1), Some(q), "a port another program holds is not used");
        drop(held);
    }
}
