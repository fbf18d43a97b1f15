//! PID 1 of a fenced copy's PID namespace: shinyctl's own small init, as
//! tini is. It finishes the copy's world (hostname, the mount namespace's
//! root), forks R, forwards SIGTERM, SIGINT and SIGHUP to it, reaps every
//! child, answers the copy's `bind` and `listen` (`ports.rs`: the process
//! that becomes R sends it the filter's listener), and when R ends tells
//! the host-side launcher how (R's wait status, through a pipe) and exits.
//! The kernel ends whatever is left in the namespace when it exits. It
//! ends R, and itself, when the launcher goes (`launcher_gone`).
//!
//! The process that becomes R sets its user (run-as), takes the filter's
//! fences (the marked spot in [`become_r`]), sends the fences to the
//! host-side launcher and execs R.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use super::mount;
use super::plan::RootPlan;
use super::sources::Sources;
use super::{CopyFolders, Launch, APP_DIR, EXIT_LAUNCH_FAILED, SCRATCH_DIR};
use crate::sys::users::Identity;
use crate::wire::launch::fences::{self, Fences};

/// What the init needs, as the host-side launcher left it before clone.
pub struct Init<'a> {
    /// The launcher's arguments.
    pub launch: &'a Launch,
    /// The copy's root.
    pub plan: &'a RootPlan,
    /// The fences so far (the namespaces the clone made).
    pub fences: Fences,
    /// The run-as user of a root daemon.
    pub who: Option<&'a Identity>,
    /// The app's folders are handed to `who` here (a launcher that is not
    /// root could not: see `super::hand_over`).
    pub hand_over: bool,
    /// The read end of the pipe the host side writes once the user
    /// namespace's ids are mapped.
    pub go: RawFd,
    /// The write end of the pipe the fences go through (closed by exec).
    pub ready: RawFd,
    /// The write end of the pipe R's end goes through.
    pub done: RawFd,
    /// The host side's ends, closed here first.
    pub theirs: [RawFd; 3],
}

/// What the process about to exec R tells the host-side launcher (over
/// the `ready` pipe, which exec closes): its fences, and why it refused to
/// start R, if it did.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Handoff {
    /// The copy's fences.
    pub fences: Fences,
    /// `mode: strict`'s refusal.
    pub refused: Option<String>,
}

/// Runs the init; never returns.
pub fn run(mut init: Init) -> ! {
    // SAFETY: prctl(PR_SET_PDEATHSIG) with a signal number: if the host-side
    // launcher is killed, the init goes, and the whole namespace with it.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    // The log and the pipe's read end are the launcher's: R could reach
    // the init's descriptors.
    super::log_pump::forget();
    for fd in init.theirs {
        let _ = nix::unistd::close(fd);
    }
    // SAFETY: these fds were inherited through clone and are the init's own.
    let (mut go, ready, done) =
        unsafe { (std::fs::File::from_raw_fd(init.go), OwnedFd::from_raw_fd(init.ready), OwnedFd::from_raw_fd(init.done)) };
    let mut byte = [0u8; 1];
    if go.read(&mut byte).ok() != Some(1) {
        // The host side is gone or could not map the ids: nothing to start.
        std::process::exit(EXIT_LAUNCH_FAILED);
    }
    drop(go);
    // Opened while the init is still the launcher's user, who can walk to
    // them (see `sources`).
    let seen = match Sources::open(init.plan)
        .map_err(|e| format!("{e:#}"))
        .and_then(|s| world(init.launch, init.plan, init.who, init.hand_over, &mut init.fences, s))
    {
        Ok(seen) => seen,
        Err(e) => {
            super::fail(&e);
            std::process::exit(EXIT_LAUNCH_FAILED);
        }
    };
    if !rearm_parent_death(done.as_fd()) {
        std::process::exit(EXIT_LAUNCH_FAILED);
    }
    // The way the listener of R's bind and listen comes back (`ports`).
    let (sup, sup_child) = match supervision_pair() {
        Ok(p) => p,
        Err(e) => {
            super::fail(&format!("no socket pair for the copy's init: {e}"));
            std::process::exit(EXIT_LAUNCH_FAILED);
        }
    };
    // SAFETY: the init is single-threaded (a clone of the single-threaded
    // launcher), so the child may do anything before exec.
    let r = match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            drop(sup);
            become_r(init.launch, init.who, seen, init.fences, ready, sup_child)
        }
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => {
            super::fail(&format!("cannot fork R: {e}"));
            std::process::exit(EXIT_LAUNCH_FAILED);
        }
    };
    drop((ready, sup_child));
    let listener = super::ports::receive(&sup);
    drop(sup);
    let end = wait_for(r, listener, init.launch.port, Some(done.as_fd()));
    let mut done = std::fs::File::from(done);
    let _ = done.write_all(end.as_bytes());
    std::process::exit(match end.split_once(' ') {
        Some(("exit", n)) => n.parse().unwrap_or(EXIT_LAUNCH_FAILED),
        Some((_, n)) => 128 + n.parse::<i32>().unwrap_or(0),
        None => EXIT_LAUNCH_FAILED,
    })
}

/// Sets the init's parent-death signal again once `world` has made it the
/// copy's user: a change of credentials clears it (prctl(2)), and without
/// it an init whose launcher (or, claimed, the zygote's fork) is killed
/// outright (the daemon's memory or disk watch, `kill -9`) would outlive
/// it, with nobody to end it. `false` when the launcher is already gone
/// (`link`: see [`launcher_gone`]): its end, and the fork's, came while the
/// signal was cleared, so none will come, and the init must end itself.
pub(super) fn rearm_parent_death(link: BorrowedFd) -> bool {
    // SAFETY: prctl with constant arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    // Set first, then looked: a launcher that ends after the look ends the
    // parent after the signal is set (the fork goes only once the
    // launcher has; a cold init's parent is the launcher).
    !launcher_gone(link)
}

/// Whether the copy's launcher has ended, however it ended: `link` is the
/// init's end of what joins them (a claimed copy's connection to its
/// launcher, a hang-up once the launcher's end is closed; a cold copy's
/// `done` pipe, broken once its one reader, the launcher, is gone).
pub(super) fn launcher_gone(link: BorrowedFd) -> bool {
    let mut pfd = libc::pollfd { fd: link.as_raw_fd(), events: 0, revents: 0 };
    // SAFETY: poll on one pollfd, without waiting.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

/// Makes the copy's world inside its new namespaces, in its PID 1 (the
/// init, or a claimed copy's init, `claim`): the run-as user (before the
/// mounts, so what is made is theirs), the hostname, and the root built
/// from `sources` (which it closes). Returns the folders as the copy sees
/// them; an error is a copy that must not start.
pub(super) fn world(
    launch: &Launch,
    plan: &RootPlan,
    who: Option<&Identity>,
    hand_over: bool,
    fences: &mut Fences,
    sources: Sources,
) -> Result<CopyFolders, String> {
    // A launcher that is not root could not give the app's own
    // (subordinate) uid its folders: done here, as the launcher's user,
    // with the capabilities this namespace gives over the ids mapped in it
    // (that user's and the app's).
    if let (Some(who), true) = (who, hand_over) {
        super::hand_over(launch, who)?;
    }
    // A root launcher maps the run-as user, not root: the init takes that
    // user now, before the mounts, so what it makes is theirs (with root
    // unmapped here, the change costs no capability in the namespace).
    if let (Some(who), true) = (who, fences.has(fences::USER_NS)) {
        crate::sys::users::set_user(who).map_err(|e| format!("cannot become {}: {e}", who.name))?;
    }
    if fences.has(fences::UTS_NS) {
        let name = launch.app.as_bytes();
        // SAFETY: a buffer and its length, alive for the call.
        if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } != 0 {
            let e = std::io::Error::last_os_error();
            fences.missing(fences::UTS_NS, &format!("the hostname cannot be set ({e})"), None);
        }
    }
    let built = mount::build(plan, &sources).map_err(|e| format!("{e:#}"))?;
    fences.in_force(fences::MOUNT_NS);
    if let Some(why) = built.host_proc {
        fences.missing(fences::PID_NS, &format!("/proc shows the host's processes: {why}"), None);
    }
    // The root is built; R must not hold the host's folders.
    drop(sources);
    Ok(CopyFolders { app_dir: APP_DIR.into(), scratch: SCRATCH_DIR.into(), tmpdir: None, r_libs_user: super::plan::r_libs_user(plan) })
}

/// A socket pair (close-on-exec) between the init and the process that
/// becomes R.
pub fn supervision_pair() -> nix::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
}

/// Forwards signals to R, reaps every child until R ends and, with a
/// `listener`, answers the copy's `bind` and `listen` (`ports`, for the
/// copy on `port`); returns R's end as `exit N` or `signal N`. With a
/// `link` to the launcher (an init's, see [`launcher_gone`]), R is killed
/// once the launcher has ended: the init's parent-death signal alone may
/// never come (see [`rearm_parent_death`]), and a copy nobody supervises
/// must not run on.
pub fn wait_for(r: Pid, mut listener: Option<OwnedFd>, port: u16, link: Option<BorrowedFd>) -> String {
    let mut told = false;
    let set = super::signals::forwarded_signals();
    // Signals through a descriptor, so one poll waits for all.
    let signals = nix::sys::signalfd::SignalFd::with_flags(&set, nix::sys::signalfd::SfdFlags::SFD_CLOEXEC).ok();
    loop {
        let sig = match &signals {
            Some(sfd) => match ready(listener.as_ref(), sfd, link) {
                Ready::Call => {
                    if let Some(l) = &listener {
                        match super::ports::answer(l, port) {
                            super::ports::Answered::Gone => listener = None,
                            super::ports::Answered::Listening => tell_listening(&mut told),
                            super::ports::Answered::Call => {}
                        }
                    }
                    continue;
                }
                Ready::Gone => {
                    listener = None;
                    continue;
                }
                Ready::LauncherGone => return without_launcher(r),
                Ready::Signal => match sfd.read_signal() {
                    Ok(Some(info)) => match Signal::try_from(info.ssi_signo as i32) {
                        Ok(s) => s,
                        Err(_) => continue,
                    },
                    _ => continue,
                },
            },
            None => match wait_a_second(&set) {
                Some(s) => s,
                None if link.is_some_and(launcher_gone) => return without_launcher(r),
                None => continue,
            },
        };
        if sig != Signal::SIGCHLD {
            let _ = kill(r, sig);
            continue;
        }
        let mut end = None;
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == r => end = Some(format!("exit {code}")),
                Ok(WaitStatus::Signaled(pid, s, _)) if pid == r => end = Some(format!("signal {}", s as i32)),
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => {}
            }
        }
        if let Some(end) = end {
            return end;
        }
    }
}

/// Tells the daemon, once, that R listens on the copy's port: a byte on
/// the launcher's standard input, which the daemon gives it as a pipe's
/// write end (README, "Sleep": a wake answers as soon as R can). The daemon
/// then asks the port at once instead of at its next look. Anything else
/// there (`/dev/null`, a terminal) takes the byte or refuses it, harmlessly.
///
/// A daemon that is gone (an upgrade restarts it) has closed the pipe's
/// other end: the write fails with EPIPE and raises SIGPIPE, which must
/// not reach the process. A claimed copy's init is a fork of the zygote's
/// R, whose SIGPIPE handler would end it with "ignoring SIGPIPE signal"
/// and the copy with it; so SIGPIPE is blocked around the write and a
/// pending one taken.
fn tell_listening(told: &mut bool) {
    if *told {
        return;
    }
    *told = true;
    let _held = crate::sys::sigpipe::Held::new();
    // SAFETY: write(2) of one byte from a live buffer to fd 0.
    let _ = unsafe { libc::write(0, b"l".as_ptr().cast(), 1) };
}

/// R's end when the launcher is gone: killed at once (the init's exit, as
/// its PID namespace's PID 1, would end it too).
fn without_launcher(r: Pid) -> String {
    let _ = kill(r, Signal::SIGKILL);
    format!("signal {}", Signal::SIGKILL as i32)
}

/// Waits up to a second for one of `set` (blocked), where no signalfd
/// could be had: `None` when none came, so the launcher is looked at.
fn wait_a_second(set: &nix::sys::signal::SigSet) -> Option<Signal> {
    let timeout = libc::timespec { tv_sec: 1, tv_nsec: 0 };
    // SAFETY: sigtimedwait with a valid set, no info wanted, and a timeout.
    let n = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &timeout) };
    Signal::try_from(n).ok()
}

/// What woke the init.
enum Ready {
    /// A `bind` or `listen` waits for its answer.
    Call,
    /// A signal came.
    Signal,
    /// No process is under the filter any more.
    Gone,
    /// The launcher has ended (see [`launcher_gone`]).
    LauncherGone,
}

/// Waits until the listener (if any), the signals or the link to the
/// launcher (if any) have something.
fn ready(listener: Option<&OwnedFd>, signals: &nix::sys::signalfd::SignalFd, link: Option<BorrowedFd>) -> Ready {
    // poll skips an entry whose fd is negative.
    let mut fds = [
        libc::pollfd { fd: listener.map_or(-1, |l| l.as_raw_fd()), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: signals.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: link.map_or(-1, |l| l.as_raw_fd()), events: 0, revents: 0 },
    ];
    loop {
        // SAFETY: poll on the pollfds of the array passed.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            continue;
        }
        // Signals first: R's end must not wait behind a stream of calls.
        if fds[1].revents & libc::POLLIN != 0 {
            return Ready::Signal;
        }
        if fds[2].revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            return Ready::LauncherGone;
        }
        if fds[0].revents & libc::POLLIN != 0 {
            return Ready::Call;
        }
        if fds[0].revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            return Ready::Gone;
        }
    }
}

/// In the child that becomes R: its user, the filter's fences (the
/// listener of its `bind` and `listen` sent to the init over `sup`), the
/// report of the fences to the host side, and exec. Never returns.
fn become_r(launch: &Launch, who: Option<&Identity>, mut seen: CopyFolders, mut fences: Fences, ready: OwnedFd, sup: OwnedFd) -> ! {
    super::signals::unblock_signals();
    if let Some(who) = who {
        if let Err(e) = crate::sys::users::set_user(who) {
            super::fail(&format!("cannot become {}: {e}", who.name));
            std::process::exit(EXIT_LAUNCH_FAILED);
        }
    }
    hand_over_ports(&sup, &mut fences);
    drop(sup);
    let code = super::finish_and_exec(launch, &mut seen, &mut fences, who, |f, refused| {
        let handoff = Handoff { fences: f.clone(), refused: refused.map(str::to_string) };
        if let Ok(bytes) = serde_json::to_vec(&handoff) {
            let _ = std::fs::File::from(ready).write_all(&bytes);
        }
    });
    std::process::exit(code)
}

/// In the process about to become R: installs the `bind`/`listen`
/// notification filter and sends its listener over `sup` to the process
/// that answers them (the init, or the launcher without namespaces); the
/// fences say whether it is in force.
pub fn hand_over_ports(sup: &OwnedFd, fences: &mut Fences) {
    match super::ports::install().and_then(|l| super::ports::send(sup, &l)) {
        Ok(()) => fences.in_force(fences::PORTS),
        Err(e) => {
            fences.missing(fences::PORTS, &format!("bind and listen cannot be handed to the copy's init ({e})"), Some("Linux 5.9 or later"))
        }
    }
}

/// The raw fd of an owned fd, for the init's arguments.
pub fn raw(fd: &OwnedFd) -> RawFd {
    fd.as_raw_fd()
}
