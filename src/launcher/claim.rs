//! The host side of a claim from the pool (README, "Sleep and wake": the
//! pool; ARCHITECTURE.md, "The pool"): instead of starting a new R, the
//! launcher asks the pool's zygote (an R that has loaded shiny, `zygote`)
//! for a fork, and that fork makes the copy's world with the same steps a
//! cold copy's init takes. The launcher does from outside what only a
//! process outside can: it maps the fork's user namespace, moves it into
//! the copy's cgroups (so what it allocates from then on is the copy's),
//! and, as root, opens the folders the copy's root binds (the fork runs as
//! the pool's unprivileged uid, which cannot walk them). Then it stays the
//! copy's host-side parent as for a cold copy: it forwards SIGTERM, SIGINT
//! and SIGHUP to the copy's init, writes the report, and ends as R ended.
//!
//! The messages go over one `SOCK_SEQPACKET` connection, as JSON, with
//! the copy's log (and the opened folders) passed as descriptors; the
//! zygote's fork, its init and its R each hold the connection until their
//! part is done.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use super::init::Handoff;
use super::plan::RootPlan;
use super::signals;
use super::{host, Launch, EXIT_LAUNCH_FAILED};
use crate::sys::users::Identity;
use crate::wire::launch::fences::{self, Fences};
use crate::wire::launch::report::Writer;

/// The largest message (a claim with its environment and plan).
const MAX_MESSAGE: usize = 1 << 18;

/// How long the launcher waits for the zygote's answer before it starts
/// the copy cold.
const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// One message between the launcher and the zygote's side.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub(super) enum Msg {
    /// Launcher → zygote: the copy to fork for (with the copy's log).
    Claim(Box<Claim>),
    /// Zygote or its fork → launcher: no copy from this claim.
    Refused {
        /// Why, for the copy's log and status.
        why: String,
    },
    /// The fork → launcher: its namespaces are made; map its ids.
    Forked {
        /// The fork's PID.
        pid: u32,
        /// It joined the copy's cgroups itself (`join_by_tasks`); else the
        /// launcher moves it. Absent from a zygote of an earlier shinyctl.
        #[serde(default)]
        joined: bool,
    },
    /// Launcher → the fork: ids mapped, cgroups joined. With the folders
    /// the launcher opened in the fork's mount namespace (as descriptors,
    /// in this order), or none: the fork's init opens them itself.
    Go {
        /// The host paths of the descriptors sent.
        sources: Vec<PathBuf>,
    },
    /// The fork → launcher: the copy's init, by its host PID.
    Init {
        /// The init's PID.
        pid: u32,
    },
    /// The copy's R → launcher: its fences, before it returns to R.
    Handoff(Handoff),
    /// The copy's init (or the fork, if the init died) → launcher: how R
    /// ended, `exit N` or `signal N`.
    End {
        /// R's end.
        how: String,
    },
}

/// What the zygote's fork needs to make the copy.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Claim {
    /// The launcher's arguments (`Launch::args`).
    pub args: Vec<String>,
    /// The copy's environment (the launcher's own, as the daemon set it).
    pub env: Vec<(String, String)>,
    /// The copy's root.
    pub plan: RootPlan,
    /// The app's identity (a root daemon's).
    pub who: Option<Identity>,
    /// The fork hands the app's folders to `who` (a launcher that is not
    /// root could not: see `super::hand_over`).
    #[serde(default)]
    pub hand_over: bool,
    /// The fences so far, with the namespaces the fork makes.
    pub fences: Fences,
    /// What R runs once the copy is made ([`r_program`]).
    pub program: String,
}

/// Sends one message with descriptors.
pub(super) fn send(conn: RawFd, msg: &Msg, fds: &[RawFd]) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    let iov = [IoSlice::new(&bytes)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    sendmsg::<()>(conn, &iov, if fds.is_empty() { &[] } else { &cmsg }, MsgFlags::MSG_NOSIGNAL, None)?;
    Ok(())
}

/// Receives one message and its descriptors; `None` when the other side
/// hung up.
pub(super) fn recv(conn: RawFd) -> std::io::Result<Option<(Msg, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; 32]);
    let msg = loop {
        match recvmsg::<()>(conn, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other?,
        }
    };
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(got) = c {
            // SAFETY: descriptors the kernel just gave us.
            fds.extend(got.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let n = msg.bytes;
    if n == 0 {
        return Ok(None);
    }
    let parsed = serde_json::from_slice(&buf[..n]).map_err(std::io::Error::other)?;
    Ok(Some((parsed, fds)))
}

/// The R a claimed copy runs once its world is made, in place of R's own
/// start for the app (the zygote started with no user profile or
/// environment file and in `/`): its own random numbers (the zygote's
/// seed, and shiny's own, are dropped: R seeds anew from the time at first
/// use, so no two copies share session tokens), the app folder as working
/// directory,
/// `tempdir()` made again under the copy's own /tmp, the user environment
/// file (`R_ENVIRON_USER`, else the app folder's `.Renviron`, else
/// `~/.Renviron`) and profile (`R_PROFILE_USER`, else `.Rprofile`, else
/// `~/.Rprofile`, which is where renv activates), `.First`, then the
/// same expression a cold copy runs ([`super::run_app_expr`]).
pub fn r_program(app_dir: &Path, entrypoint: &str, port: u16) -> String {
    let dir = super::r_string(&app_dir.to_string_lossy());
    format!(
        "local({{ if (exists('.Random.seed', envir = globalenv(), inherits = FALSE)) rm('.Random.seed', envir = globalenv()); \
         g <- get('.globals', envir = asNamespace('shiny')); g$ownSeed <- NULL; \
         setwd({dir}); invisible(tempdir(check = TRUE)); \
         home <- Sys.getenv('HOME'); \
         env <- Sys.getenv('R_ENVIRON_USER'); \
         if (!nzchar(env)) env <- if (file.exists('.Renviron')) '.Renviron' else file.path(home, '.Renviron'); \
         if (file.exists(env)) readRenviron(env); \
         prof <- Sys.getenv('R_PROFILE_USER'); \
         if (!nzchar(prof)) prof <- if (file.exists('.Rprofile')) '.Rprofile' else file.path(home, '.Rprofile'); \
         if (file.exists(prof)) sys.source(prof, envir = globalenv()) }}); \
         if (exists('.First', envir = globalenv(), mode = 'function', inherits = FALSE)) .First(); \
         {}",
        super::run_app_expr(app_dir, entrypoint, port)
    )
}

/// A claim the zygote took: the fork is in the copy's cgroups, its ids
/// mapped, and it is making the copy.
pub(super) struct Claimed {
    /// The connection to the fork, its init and R.
    conn: OwnedFd,
    /// The zygote's fork.
    fork: u32,
}

/// Claims a copy from the zygote at `socket`; `Err` says why the copy must
/// start cold instead (nothing of the claim is left running then).
pub(super) fn claim(launch: &Launch, plan: &RootPlan, who: Option<&Identity>, fences: &Fences, socket: &Path) -> Result<Claimed, String> {
    if let Some(user) = &launch.start.run_as {
        return Err(format!("run-as {user}: R keeps the HOME it started with, and the pool's is not {user}'s"));
    }
    // A fork that could not leave the pool's cgroup would stay charged to
    // it (and go with it).
    if !launch.cgroups.is_empty() && !fences.has(fences::CGROUP) {
        return Err("the copy's cgroup cannot be joined".into());
    }
    let conn = connect(socket).map_err(|e| format!("no zygote is ready ({e})"))?;
    let mut made = fences.clone();
    for name in [fences::USER_NS, fences::PID_NS, fences::IPC_NS, fences::UTS_NS] {
        made.in_force(name);
    }
    let claim = Claim {
        args: launch.args().iter().map(|a| a.to_string_lossy().into_owned()).collect(),
        env: std::env::vars_os().map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned())).collect(),
        plan: plan.clone(),
        who: who.cloned(),
        hand_over: who.is_some() && !nix::unistd::geteuid().is_root(),
        fences: made,
        program: r_program(Path::new(super::APP_DIR), &launch.start.entrypoint, launch.port),
    };
    // The copy's log is the launcher's stderr: the fork writes there. Its
    // stdin is where the copy's init says R listens (`init::wait_for`): the
    // fork's becomes it.
    send(conn.as_raw_fd(), &Msg::Claim(Box::new(claim)), &[2, 0]).map_err(|e| format!("the zygote took no claim ({e})"))?;
    let (fork, joined) = match recv(conn.as_raw_fd()) {
        Ok(Some((Msg::Forked { pid, joined }, _))) => (pid, joined),
        Ok(Some((Msg::Refused { why }, _))) => return Err(format!("the zygote refused the claim: {why}")),
        Ok(_) => return Err("the zygote hung up".into()),
        Err(e) => return Err(format!("no answer from the zygote ({e})")),
    };
    let ready = || -> Result<(), String> {
        host::map_ids(Pid::from_raw(fork as i32), who).map_err(|e| format!("{e:#}"))?;
        if fences.has(fences::CGROUP) && !joined {
            for dir in &launch.cgroups {
                std::fs::write(dir.join("cgroup.procs"), fork.to_string())
                    .map_err(|e| format!("cannot move the zygote's fork into {}: {e}", dir.display()))?;
            }
        }
        if nix::unistd::geteuid().is_root() {
            sources_in(fork, plan, conn.as_raw_fd())
        } else {
            send(conn.as_raw_fd(), &Msg::Go { sources: vec![] }, &[]).map_err(|e| format!("the zygote's fork is gone ({e})"))
        }
    };
    if let Err(why) = ready() {
        let _ = kill(Pid::from_raw(fork as i32), Signal::SIGKILL);
        return Err(why);
    }
    Ok(Claimed { conn, fork })
}

/// Connects to the zygote's socket.
fn connect(path: &Path) -> nix::Result<OwnedFd> {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    let conn = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)?;
    connect(conn.as_raw_fd(), &UnixAddr::new(path)?)?;
    let timeout = nix::sys::time::TimeVal::new(ANSWER_WITHIN.as_secs() as libc::time_t, 0);
    nix::sys::socket::setsockopt(&conn, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)?;
    Ok(conn)
}

/// As root: opens the folders the copy's root binds inside the fork's new
/// mount namespace (a bind's source must be in the namespace it is made
/// in), in a child of the launcher that enters it, and sends them to the
/// fork with its go.
fn sources_in(fork: u32, plan: &RootPlan, conn: RawFd) -> Result<(), String> {
    use nix::unistd::{fork as fork_process, ForkResult};
    let ns = std::fs::File::open(format!("/proc/{fork}/ns/mnt")).map_err(|e| format!("cannot open the fork's mount namespace: {e}"))?;
    // SAFETY: the launcher is single-threaded; the child only enters the
    // namespace, opens paths, sends them and exits.
    match unsafe { fork_process() } {
        Ok(ForkResult::Child) => {
            let code = (|| -> Result<(), String> {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNS).map_err(|e| format!("cannot enter it: {e}"))?;
                let parts = super::sources::Sources::open(plan).map_err(|e| format!("{e:#}"))?.into_parts();
                let paths = parts.iter().map(|(p, _)| p.clone()).collect();
                let fds: Vec<RawFd> = parts.iter().map(|(_, fd)| fd.as_raw_fd()).collect();
                send(conn, &Msg::Go { sources: paths }, &fds).map_err(|e| e.to_string())
            })();
            if let Err(e) = code {
                super::log(&format!("--- shinyctl: the copy's folders cannot be opened for the pool's fork: {e} ---"));
                // SAFETY: ends this child without the parent's exit handlers.
                unsafe { libc::_exit(1) };
            }
            // SAFETY: as above.
            unsafe { libc::_exit(0) }
        }
        Ok(ForkResult::Parent { child }) => match nix::sys::wait::waitpid(child, None) {
            Ok(WaitStatus::Exited(_, 0)) => Ok(()),
            _ => Err("the copy's folders could not be opened for the pool's fork (see the log)".into()),
        },
        Err(e) => Err(format!("cannot fork to open the copy's folders: {e}")),
    }
}

impl Claimed {
    /// Stays the copy's host-side parent until its R ends: forwards
    /// SIGTERM, SIGINT and SIGHUP to the copy's init, writes the report
    /// once R's fences are in, and ends the way R ended.
    pub(super) fn wait(self, launch: &Launch, mut report: Option<Writer>, who: Option<&Identity>) -> ! {
        use nix::sys::signalfd::{SfdFlags, SignalFd};
        super::log_pump::start();
        if let Some(r) = report.as_mut() {
            r.claimed(self.fork);
        }
        let sfd = SignalFd::with_flags(&signals::forwarded_signals(), SfdFlags::SFD_CLOEXEC).ok();
        let (mut init, mut pending, mut end) = (None::<Pid>, None::<Signal>, None::<String>);
        let _ = nix::sys::socket::setsockopt(&self.conn, nix::sys::socket::sockopt::ReceiveTimeout, &nix::sys::time::TimeVal::new(0, 0));
        loop {
            let mut fds = [
                libc::pollfd { fd: self.conn.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: sfd.as_ref().map_or(-1, |s| s.as_raw_fd()), events: libc::POLLIN, revents: 0 },
            ];
            // SAFETY: poll on the two pollfds of the array.
            if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
                continue;
            }
            if fds[1].revents & libc::POLLIN != 0 {
                if let Some(Ok(Some(info))) = sfd.as_ref().map(|s| s.read_signal()) {
                    match Signal::try_from(info.ssi_signo as i32) {
                        Ok(Signal::SIGCHLD) | Err(_) => {}
                        Ok(sig) => match init {
                            Some(pid) => drop(kill(pid, sig)),
                            None => pending = Some(sig),
                        },
                    }
                }
            }
            if fds[0].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) == 0 {
                continue;
            }
            match recv(self.conn.as_raw_fd()) {
                Ok(Some((Msg::Init { pid }, _))) => {
                    let pid = Pid::from_raw(pid as i32);
                    init = Some(pid);
                    if let Some(sig) = pending.take() {
                        let _ = kill(pid, sig);
                    }
                }
                Ok(Some((Msg::Handoff(told), _))) => {
                    if let Some(report) = report.take() {
                        let isolation = super::isolation_of(&told.fences, launch.start.sandbox.mode, host::user_name(who));
                        report.write(&isolation, init.and_then(host::only_child), told.refused.as_deref());
                    }
                }
                Ok(Some((Msg::End { how }, _))) => {
                    end = Some(how);
                    break;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        host::mirror(end.as_deref().unwrap_or(""), WaitStatus::Exited(Pid::from_raw(0), EXIT_LAUNCH_FAILED))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_and_its_descriptors_cross_the_socket() {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let (a, b) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        send(a.as_raw_fd(), &Msg::Go { sources: vec!["/srv/app".into()] }, &[file.as_raw_fd()]).unwrap();
        let (msg, fds) = recv(b.as_raw_fd()).unwrap().unwrap();
        assert!(matches!(msg, Msg::Go { ref sources } if sources == &[PathBuf::from("/srv/app")]), "{msg:?}");
        assert_eq!(fds.len(), 1);
        drop(a);
        assert!(recv(b.as_raw_fd()).unwrap().is_none(), "a hang-up is the end");
    }

    #[test]
    fn the_program_reads_the_apps_profile_then_runs_it_as_a_cold_copy_does() {
        let p = r_program(Path::new(super::super::APP_DIR), "app.R", 20001);
        assert!(p.starts_with("local({ if (exists('.Random.seed'"), "the zygote's seed is dropped first: {p}");
        assert!(p.contains("g$ownSeed <- NULL") && p.contains("setwd('/shinyctl/app'); invisible(tempdir(check = TRUE));"), "{p}");
        let (env, prof, run) = (p.find("readRenviron").unwrap(), p.find("sys.source").unwrap(), p.find("shiny::runApp").unwrap());
        assert!(env < prof && prof < run, "environment, then profile, then the app: {p}");
        assert!(p.ends_with(&super::super::run_app_expr(Path::new(super::super::APP_DIR), "app.R", 20001)), "{p}");
    }
}
