//! The pool's zygote (README, "Sleep and wake": the pool): an R that has
//! loaded shiny and no app code, waiting in [`shinyctl_zygote`] (called
//! through R's `.C`, from the shared library built from this crate) for
//! claims on the Unix socket the daemon made for it. Each claim forks it;
//! the zygote itself never runs anything of an app and never returns to R.
//!
//! The fork (single-threaded: fork copies only the calling thread, and it
//! is checked) makes the copy's namespaces and tells the launcher its PID;
//! once the launcher has mapped its ids and moved it into the copy's
//! cgroups, it forks the copy's init (PID 1 of the new PID namespace),
//! which builds the copy's root with the cold path's own code
//! (`init::world`) and forks the copy's R: the process that takes the
//! copy's user, fences and environment ([`super::finish`]) and returns to
//! R, which runs the app (`claim::r_program`). The fork stays the init's
//! parent and goes, killing the copy, if the launcher goes; the init also
//! watches the connection itself (`init::launcher_gone`), for a launcher
//! that goes while its parent-death signal is cleared.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use nix::sys::signal::{SigSet, SigmaskHow};
use nix::unistd::{fork, ForkResult, Pid};

use super::claim::{self, Claim, Msg};
use super::host;
use super::signals;
use super::sources::Sources;
use super::{Launch, EXIT_LAUNCH_FAILED};
use crate::sys::users::Identity;
use crate::wire::launch::fences::Fences;
use crate::wire::launch::zygote::{GIVEN_ENV, PROGRAM_ENV};

/// R's `.C` entry: waits for claims on the listening socket `*fd` (bound
/// by the daemon); returns only in a claimed copy's R, with its world made
/// and its environment set. A zygote that cannot wait exits.
///
/// # Safety
/// `fd` points to an R integer, as `.C` passes it.
#[no_mangle]
pub unsafe extern "C" fn shinyctl_zygote(fd: *mut libc::c_int) {
    // SAFETY: `.C` passes a valid pointer to its integer argument.
    let listen = unsafe { *fd };
    if let Err(e) = serve(listen) {
        super::log(&format!("--- shinyctl: the pool's zygote stops: {e} ---"));
        // SAFETY: ends the zygote without R's exit handlers.
        unsafe { libc::_exit(1) };
    }
}

/// Ends a process of the zygote's tree (not R): no exit handlers of R or of
/// the libraries it loaded run.
fn end(code: i32) -> ! {
    // SAFETY: _exit is always safe to call.
    unsafe { libc::_exit(code) }
}

/// The zygote's loop: accepts a claim, forks for it, reaps its forks.
/// Returns `Ok` only in a claimed copy's R.
fn serve(listen: RawFd) -> std::io::Result<()> {
    nix::sys::socket::listen(&unsafe_borrow(listen), nix::sys::socket::Backlog::new(64).unwrap_or(nix::sys::socket::Backlog::MAXCONN))?;
    super::log(&format!("--- shinyctl: the pool's zygote {} is ready ---", std::process::id()));
    let daemon = nix::unistd::getppid();
    loop {
        // Its daemon gone (the parent-death signal covers this, but not a
        // daemon that ended before the zygote could ask for it): no one
        // would claim from it or end it.
        if nix::unistd::getppid() != daemon {
            super::log("--- shinyctl: the pool's zygote stops: its daemon ended ---");
            end(0);
        }
        reap();
        let mut pfd = [libc::pollfd { fd: listen, events: libc::POLLIN, revents: 0 }];
        // SAFETY: poll on one pollfd; a timeout so forks that ended are reaped.
        if unsafe { libc::poll(pfd.as_mut_ptr(), 1, 1000) } <= 0 {
            continue;
        }
        // SAFETY: accept4 on our listening socket; the result is checked.
        let raw = unsafe { libc::accept4(listen, std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC) };
        if raw < 0 {
            continue;
        }
        // SAFETY: a descriptor accept4 just gave us.
        let conn = unsafe { OwnedFd::from_raw_fd(raw) };
        if let Some(child) = take(listen, conn)? {
            return child;
        }
    }
}

/// A borrowed fd for nix calls that want `AsFd`.
fn unsafe_borrow(fd: RawFd) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: the listening socket stays open for the zygote's life.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

/// Reaps the zygote's forks that have ended.
fn reap() {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    while let Ok(s) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if s == WaitStatus::StillAlive {
            break;
        }
    }
}

/// Takes one claim: only from root or the zygote's own user (the daemon's
/// launchers), and only a well-formed one. `Ok(Some(..))` is the fork's
/// end: in a claimed copy's R, `Ok(Some(Ok(())))`.
fn take(listen: RawFd, conn: OwnedFd) -> std::io::Result<Option<std::io::Result<()>>> {
    use nix::sys::socket::{getsockopt, sockopt};
    let me = nix::unistd::geteuid().as_raw();
    match getsockopt(&conn, sockopt::PeerCredentials) {
        Ok(c) if c.uid() == 0 || c.uid() == me => {}
        _ => return Ok(None),
    }
    let _ = nix::sys::socket::setsockopt(&conn, sockopt::ReceiveTimeout, &nix::sys::time::TimeVal::new(5, 0));
    let (claim, mut fds) = match claim::recv(conn.as_raw_fd()) {
        Ok(Some((Msg::Claim(c), fds))) if (1..=2).contains(&fds.len()) => (c, fds),
        _ => return Ok(None),
    };
    let log = fds.remove(0);
    let told = fds.pop();
    // SAFETY: the zygote's own thread forks; the child runs only this
    // crate's code (async-signal-safety is kept by glibc's fork handlers
    // for malloc, as for `parallel::mcfork`).
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            first(listen, conn, *claim, log, told);
            Ok(Some(Ok(())))
        }
        Ok(ForkResult::Parent { .. }) => Ok(None),
        Err(e) => {
            let _ = claim::send(conn.as_raw_fd(), &Msg::Refused { why: format!("the zygote cannot fork ({e})") }, &[]);
            Ok(None)
        }
    }
}

/// How many threads this process has (`/proc/self/status`).
fn threads() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|v| v.trim().parse().ok())
}

/// The zygote's fork: checks it has one thread, makes the copy's
/// namespaces, waits for the launcher's go, forks the copy's init and
/// stays its parent. Returns only in the copy's R.
fn first(listen: RawFd, conn: OwnedFd, claim: Claim, log: OwnedFd, told: Option<OwnedFd>) {
    let _ = nix::unistd::close(listen);
    // The copy's output is its log, from here on; its stdin the launcher's,
    // where the copy's init says R listens.
    let _ = nix::unistd::dup2(log.as_raw_fd(), 1);
    let _ = nix::unistd::dup2(log.as_raw_fd(), 2);
    drop(log);
    if let Some(told) = told {
        let _ = nix::unistd::dup2(told.as_raw_fd(), 0);
    }
    let refuse = |why: String| -> ! {
        let _ = claim::send(conn.as_raw_fd(), &Msg::Refused { why }, &[]);
        end(0)
    };
    match threads() {
        Some(1) => {}
        Some(n) => refuse(format!("the zygote's fork has {n} threads, not 1 (Landlock and seccomp bind only the thread that takes them)")),
        None => refuse("the zygote's fork cannot count its threads".into()),
    }
    let launch = match Launch::parse(&claim.args.iter().map(Into::into).collect::<Vec<_>>()) {
        Ok(l) => l,
        Err(e) => refuse(format!("bad arguments: {e}")),
    };
    // The copy's cgroups joined here, with one thread and the host's view
    // still: moved from outside, by the launcher, it would wait for the
    // kernel's lock on every fork (`super::join_by_tasks`).
    let joined = launch.start.sandbox.mode != crate::manifest::SandboxMode::Off && super::join_by_tasks(&launch.cgroups);
    // Out of R's session and process group: the zygote's signals are not
    // the copy's.
    let _ = nix::unistd::setsid();
    let mut r_mask = SigSet::empty();
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&signals::forwarded_signals()), Some(&mut r_mask));
    if let Err(e) = nix::sched::unshare(host::all_namespaces()) {
        refuse(format!("the copy's namespaces cannot be made from the zygote ({e})"));
    }
    if claim::send(conn.as_raw_fd(), &Msg::Forked { pid: std::process::id(), joined }, &[]).is_err() {
        end(0);
    }
    let _ = nix::sys::socket::setsockopt(&conn, nix::sys::socket::sockopt::ReceiveTimeout, &nix::sys::time::TimeVal::new(0, 0));
    let sources = match claim::recv(conn.as_raw_fd()) {
        Ok(Some((Msg::Go { sources }, fds))) if sources.len() == fds.len() => sources.into_iter().zip(fds).collect::<Vec<_>>(),
        _ => end(0),
    };
    // SAFETY: single-threaded (checked above).
    match unsafe { fork() } {
        Ok(ForkResult::Child) => init(conn, claim, launch, sources, r_mask),
        Ok(ForkResult::Parent { child }) => {
            drop(sources);
            let _ = claim::send(conn.as_raw_fd(), &Msg::Init { pid: child.as_raw() as u32 }, &[]);
            stay(conn, child)
        }
        Err(e) => {
            super::fail(&format!("cannot fork the copy's init: {e}"));
            let _ = claim::send(conn.as_raw_fd(), &Msg::End { how: format!("exit {EXIT_LAUNCH_FAILED}") }, &[]);
            end(EXIT_LAUNCH_FAILED)
        }
    }
}

/// The fork, once the init runs: waits for the init to end (then says how,
/// in case the init could not) or for the launcher to go (then ends, and
/// the init with it: its parent-death signal).
fn stay(conn: OwnedFd, init: Pid) -> ! {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let sfd = nix::sys::signalfd::SignalFd::with_flags(&signals::forwarded_signals(), nix::sys::signalfd::SfdFlags::SFD_CLOEXEC).ok();
    loop {
        let mut fds = [
            libc::pollfd { fd: conn.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: sfd.as_ref().map_or(-1, |s| s.as_raw_fd()), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: poll on the two pollfds of the array.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if fds[0].revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            end(0);
        }
        if let Some(s) = &sfd {
            let _ = s.read_signal();
        }
        match waitpid(init, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => {
                let _ = claim::send(conn.as_raw_fd(), &Msg::End { how: format!("exit {code}") }, &[]);
                end(0)
            }
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                let _ = claim::send(conn.as_raw_fd(), &Msg::End { how: format!("signal {}", sig as i32) }, &[]);
                end(0)
            }
            Ok(_) => {}
            Err(_) => end(0),
        }
    }
}

/// The copy's init (PID 1 of its PID namespace): builds the copy's world
/// with the cold path's code, forks the copy's R, then supervises it as a
/// cold copy's init does. Returns only in the copy's R.
fn init(conn: OwnedFd, claim: Claim, launch: Launch, sources: Vec<(PathBuf, OwnedFd)>, r_mask: SigSet) {
    // SAFETY: prctl with constant arguments: the init goes with the fork.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let fail = |why: &str| -> ! {
        super::fail(why);
        let _ = claim::send(conn.as_raw_fd(), &Msg::End { how: format!("exit {EXIT_LAUNCH_FAILED}") }, &[]);
        end(EXIT_LAUNCH_FAILED)
    };
    let mut fences = claim.fences.clone();
    let sources = match sources.is_empty() {
        false => Ok(Sources::from_parts(sources)),
        true => Sources::open(&claim.plan).map_err(|e| format!("{e:#}")),
    };
    let seen = match sources.and_then(|s| super::init::world(&launch, &claim.plan, claim.who.as_ref(), claim.hand_over, &mut fences, s)) {
        Ok(seen) => seen,
        Err(e) => fail(&e),
    };
    // The launcher gone while the world was made (the disk or memory
    // watch's kill, soon after a start): its fork went without a signal
    // to the init, and nothing else would end this copy.
    if !super::init::rearm_parent_death(conn.as_fd()) {
        end(EXIT_LAUNCH_FAILED);
    }
    let (sup, sup_child) = match super::init::supervision_pair() {
        Ok(p) => p,
        Err(e) => fail(&format!("no socket pair for the copy's init: {e}")),
    };
    // SAFETY: single-threaded, as its parent.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            drop(sup);
            become_app(conn, &claim, &launch, seen, fences, sup_child, r_mask)
        }
        Ok(ForkResult::Parent { child }) => {
            drop(sup_child);
            let listener = super::ports::receive(&sup);
            drop(sup);
            let how = super::init::wait_for(child, listener, launch.port, Some(conn.as_fd()));
            let _ = claim::send(conn.as_raw_fd(), &Msg::End { how: how.clone() }, &[]);
            end(match how.split_once(' ') {
                Some(("exit", n)) => n.parse().unwrap_or(EXIT_LAUNCH_FAILED),
                Some((_, n)) => 128 + n.parse::<i32>().unwrap_or(0),
                None => EXIT_LAUNCH_FAILED,
            })
        }
        Err(e) => fail(&format!("cannot fork R: {e}")),
    }
}

/// The copy's R, before it returns to R: its user, the fences (the cold
/// path's [`super::finish`]), the report through the launcher, R's signal
/// mask back, and the copy's environment alone with its program.
fn become_app(
    conn: OwnedFd,
    claim: &Claim,
    launch: &Launch,
    mut seen: super::CopyFolders,
    mut fences: Fences,
    sup: OwnedFd,
    r_mask: SigSet,
) {
    if let Some(who) = &claim.who {
        if let Err(e) = crate::sys::users::set_user(who) {
            super::fail(&format!("cannot become {}: {e}", who.name));
            end(EXIT_LAUNCH_FAILED);
        }
    }
    // A change of user makes a process undumpable until its next exec,
    // and this R has none: undumpable, its init could not take its
    // sockets to answer its bind (`ports`). A cold R is dumpable after exec.
    // SAFETY: prctl with constant arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1) };
    super::init::hand_over_ports(&sup, &mut fences);
    drop(sup);
    let sent = super::finish(launch, &mut seen, &mut fences, |f, refused| {
        let handoff = super::init::Handoff { fences: f.clone(), refused: refused.map(str::to_string) };
        let _ = claim::send(conn.as_raw_fd(), &Msg::Handoff(handoff), &[]);
    });
    if let Err(code) = sent {
        end(code);
    }
    drop(conn);
    // R's stdin is at its end, as a cold R's once it has read its run
    // expression (its init keeps the word).
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
    }
    show_as_cold();
    set_env(claim, &seen, claim.who.as_ref());
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&r_mask), None);
}

/// Shows the copy as a cold copy's R shows (`ps`, `/proc/N/cmdline`: its
/// R, then [`super::R_ARGS`]) instead of the zygote's command line:
/// written over this process's argument area (`arg_start`..`arg_end` of
/// `/proc/self/stat`), which R copied when it started (`commandArgs()`
/// reads its copy); cut to fit.
fn show_as_cold() {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(") ").map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    // Fields 48 and 49 of stat; `fields` starts at field 3.
    let (Some(start), Some(end)) =
        (fields.get(45).and_then(|v| v.parse::<usize>().ok()), fields.get(46).and_then(|v| v.parse::<usize>().ok()))
    else {
        return;
    };
    if end <= start + 1 {
        return;
    }
    let cmdline = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let r = cmdline.split(|b| *b == 0).next().unwrap_or(b"R");
    let mut bytes: Vec<u8> = Vec::with_capacity(end - start);
    for part in std::iter::once(r).chain(super::R_ARGS.map(str::as_bytes)) {
        bytes.extend_from_slice(part);
        bytes.push(0);
    }
    bytes.resize(end - start, 0);
    // The last byte stays a NUL: the area reads as whole arguments.
    if let Some(last) = bytes.last_mut() {
        *last = 0;
    }
    // SAFETY: start..end is this process's own argument area, mapped and
    // writable for its whole life; nothing reads it but the kernel (R keeps
    // copies), and the process is single-threaded here.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), start as *mut u8, bytes.len()) };
}

/// The copy's environment alone (the zygote's is cleared), as a cold copy
/// gets it, with the program R runs next.
fn set_env(claim: &Claim, seen: &super::CopyFolders, who: Option<&Identity>) {
    // What the daemon gave the zygote goes (R's own variables, which a
    // cold R sets too, stay); then the copy's. Single-threaded here, so
    // the changes race with nothing.
    let given = std::env::var(GIVEN_ENV).unwrap_or_default();
    for k in given.split(',').filter(|k| !k.is_empty()).chain([GIVEN_ENV]) {
        std::env::remove_var(k);
    }
    for (k, v) in &claim.env {
        std::env::set_var(k, v);
    }
    std::env::set_var("SHINYCTL_SCRATCH", &seen.scratch);
    if let Some(tmp) = &seen.tmpdir {
        std::env::set_var("TMPDIR", tmp);
    }
    if let Some(who) = who {
        std::env::set_var("HOME", &who.home);
        std::env::set_var("USER", &who.name);
        std::env::set_var("LOGNAME", &who.name);
    }
    std::env::set_var(PROGRAM_ENV, &claim.program);
}
