//! The host side of a fenced copy's launcher: the process the daemon
//! started, recorded, watches (pidfd), stops (its process group) and
//! adopts. It clones the init into new user, mount, PID, IPC and UTS
//! namespaces, maps the user namespace's ids from outside (only a process
//! outside may map root, or another user, to itself), reports the fences
//! and R's PID as the host sees it, forwards SIGTERM, SIGINT and SIGHUP
//! inward, and ends the way R ended: R's exit status, or R's signal (so
//! restart-policy, crash counts and backoff see what they saw before).

use std::io::{Read, Write};
use std::os::fd::OwnedFd;

use anyhow::Context;
use nix::sched::CloneFlags;
use nix::sys::signal::{kill, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use super::init::{self, Init};
use super::plan::RootPlan;
use super::signals::{block_signals, forwarded_signals, unblock_signals};
use super::{Launch, EXIT_LAUNCH_FAILED};
use crate::sys::users::Identity;
use crate::wire::launch::fences::{self, Fences};
use crate::wire::launch::report::Writer;

/// The namespaces a fenced copy gets.
pub(super) fn all_namespaces() -> CloneFlags {
    CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWIPC | CloneFlags::CLONE_NEWUTS
}

/// The three pipes between the launcher and its init.
struct Pipes {
    /// The launcher says "go" once the ids are mapped.
    go: (OwnedFd, OwnedFd),
    /// The process about to exec R sends the fences; closed at exec.
    ready: (OwnedFd, OwnedFd),
    /// The init sends R's end.
    done: (OwnedFd, OwnedFd),
}

impl Pipes {
    fn new() -> nix::Result<Pipes> {
        let p = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC);
        Ok(Pipes { go: p()?, ready: p()?, done: p()? })
    }
}

/// Starts a fenced copy (`fences`: what is had so far): clones the init
/// into its namespaces, or, where none can be made, goes on without them
/// (`super::direct`). Returns only
/// the launcher's own exit status on failure; otherwise it ends as R did.
pub fn run(launch: &Launch, report: Option<Writer>, plan: RootPlan, who: Option<Identity>, mut fences: Fences) -> i32 {
    block_signals();
    let pipes = match Pipes::new() {
        Ok(p) => p,
        Err(e) => return super::fail(&format!("no pipe for the copy's init: {e}")),
    };
    let (child, flags) = match clone_init(launch, &plan, who.as_ref(), &pipes, &mut fences) {
        Ok(v) => v,
        Err(()) => {
            unblock_signals();
            return super::direct(launch, report, fences, who.as_ref());
        }
    };
    super::log_pump::start();
    let Pipes { go, ready, done } = pipes;
    drop((go.0, ready.1, done.1));
    if flags.contains(CloneFlags::CLONE_NEWUSER) {
        if let Err(e) = map_ids(child, who.as_ref()) {
            let _ = kill(child, Signal::SIGKILL);
            return super::fail(&format!("{e:#}"));
        }
    }
    let _ = std::fs::File::from(go.1).write_all(b"g");
    let mut bytes = Vec::new();
    let _ = std::fs::File::from(ready.0).read_to_end(&mut bytes);
    if let (Some(report), Ok(told)) = (report, serde_json::from_slice::<init::Handoff>(&bytes)) {
        let isolation = super::isolation_of(&told.fences, launch.start.sandbox.mode, user_name(who.as_ref()));
        report.write(&isolation, only_child(child), told.refused.as_deref());
    }
    let end = wait_for(child);
    let mut told = String::new();
    let _ = std::fs::File::from(done.0).read_to_string(&mut told);
    mirror(&told, end)
}

/// Clones the init with every namespace, or, for a root launcher where user
/// namespaces are refused, with all but the user namespace. The fences
/// record what was made, and why not, also when no namespace can be had
/// (`Err`).
fn clone_init(
    launch: &Launch,
    plan: &RootPlan,
    who: Option<&Identity>,
    pipes: &Pipes,
    fences: &mut Fences,
) -> Result<(Pid, CloneFlags), ()> {
    let mut flags = all_namespaces();
    let root = nix::unistd::geteuid().is_root();
    loop {
        let mut made = fences.clone();
        for (flag, name) in [
            (CloneFlags::CLONE_NEWUSER, fences::USER_NS),
            (CloneFlags::CLONE_NEWPID, fences::PID_NS),
            (CloneFlags::CLONE_NEWIPC, fences::IPC_NS),
            (CloneFlags::CLONE_NEWUTS, fences::UTS_NS),
        ] {
            if flags.contains(flag) {
                made.in_force(name);
            }
        }
        let init = Init {
            launch,
            plan,
            fences: made,
            who,
            hand_over: !root && who.is_some(),
            go: init::raw(&pipes.go.0),
            ready: init::raw(&pipes.ready.1),
            done: init::raw(&pipes.done.1),
            theirs: [init::raw(&pipes.go.1), init::raw(&pipes.ready.0), init::raw(&pipes.done.0)],
        };
        let mut init = Some(init);
        // Copied (not shared) by clone, as by fork; untouched pages cost nothing.
        let mut stack = vec![0u8; 2 << 20];
        let cb = Box::new(move || -> isize { init::run(init.take().expect("the init runs once")) });
        // SAFETY: the launcher is single-threaded; the child runs on its own
        // copy of `stack`, large enough for the init's work.
        match unsafe { nix::sched::clone(cb, &mut stack, flags, Some(libc::SIGCHLD)) } {
            Ok(pid) => return Ok((pid, flags)),
            Err(e) if flags.contains(CloneFlags::CLONE_NEWUSER) => {
                let (why, fix) = userns_refused(e);
                for n in fences::NAMESPACES {
                    fences.missing(n, &why, Some(fix));
                }
                if !root {
                    return Err(());
                }
                flags.remove(CloneFlags::CLONE_NEWUSER);
            }
            Err(e) => {
                // The user namespace's refusal is the cause: say it first.
                let first = fences.list.iter().find(|f| f.name == fences::USER_NS).and_then(|f| f.reason.clone()).unwrap_or_default();
                let why = format!("{first}; without one, none can be made either ({e})");
                for n in &fences::NAMESPACES[1..] {
                    fences.missing(n, &why, None);
                }
                return Err(());
            }
        }
    }
}

/// Why the kernel refused a user namespace, and the fix.
fn userns_refused(e: nix::errno::Errno) -> (String, &'static str) {
    match e {
        nix::errno::Errno::ENOSPC => {
            ("user namespaces are switched off here (user.max_user_namespaces is 0)".to_string(), fences::FIX_USERNS_ENOSPC)
        }
        nix::errno::Errno::EPERM => (
            "user namespaces are not allowed here (kernel.unprivileged_userns_clone, or an AppArmor/SELinux rule)".to_string(),
            fences::FIX_USERNS_EPERM,
        ),
        e => (format!("a user namespace cannot be made ({e})"), fences::FIX_USERNS_EPERM),
    }
}

/// Maps the ids of the init's user namespace. A root launcher maps root to
/// root, or the run-as user (and their groups) to themselves; another user
/// maps only itself (its one uid and gid, setgroups denied), as the kernel
/// allows.
pub(super) fn map_ids(child: Pid, who: Option<&Identity>) -> anyhow::Result<()> {
    let proc = format!("/proc/{child}");
    let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
    let (uids, gids) = match (uid, who) {
        (0, Some(w)) => (format!("{0} {0} 1\n", w.uid), w.groups.iter().map(|g| format!("{g} {g} 1\n")).collect()),
        (0, None) => ("0 0 1\n".to_string(), "0 0 1\n".to_string()),
        // The app's own uid out of the daemon user's subordinate ids: only
        // the setuid helpers may map it (as podman's rootless mode does).
        (_, Some(w)) => return map_subordinate(child, (uid, gid), w),
        _ => {
            std::fs::write(format!("{proc}/setgroups"), "deny").context("cannot write the copy's setgroups")?;
            (format!("{uid} {uid} 1\n"), format!("{gid} {gid} 1\n"))
        }
    };
    std::fs::write(format!("{proc}/uid_map"), uids).context("cannot map the copy's uid")?;
    std::fs::write(format!("{proc}/gid_map"), gids).context("cannot map the copy's gids")?;
    Ok(())
}

/// Maps the launcher's own ids and the app's own subordinate uid and gid
/// `w` into the init's user namespace with `newuidmap` and `newgidmap`
/// (both ids mapped: the init works as the launcher's user first, then
/// hands the app's folders to `w` and takes it).
fn map_subordinate(child: Pid, (uid, gid): (u32, u32), w: &Identity) -> anyhow::Result<()> {
    for (tool, own, app) in [(crate::sys::users::NEWUIDMAP, uid, w.uid), (crate::sys::users::NEWGIDMAP, gid, w.gid)] {
        let out = std::process::Command::new(tool)
            .arg(child.to_string())
            .args([own, own, 1, app, app, 1].map(|n| n.to_string()))
            .stdin(std::process::Stdio::null())
            .output()
            .with_context(|| format!("cannot run {tool}"))?;
        if !out.status.success() {
            anyhow::bail!("{tool} refused to map the app's own id {app}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
    }
    Ok(())
}

/// The user a copy runs as, for the report.
pub fn user_name(who: Option<&Identity>) -> String {
    who.map(|w| w.name.clone())
        .or_else(|| crate::sys::users::current_user().map(|u| u.name))
        .unwrap_or_else(|| nix::unistd::geteuid().to_string())
}

/// The PID (as the host sees it) of the init's one child, R.
pub(super) fn only_child(init: Pid) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Waits for the init to end, forwarding SIGTERM, SIGINT and SIGHUP to it.
fn wait_for(child: Pid) -> WaitStatus {
    let set = forwarded_signals();
    loop {
        match waitpid(child, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(s @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) => return s,
            Ok(_) => {}
            Err(_) => return WaitStatus::Exited(child, EXIT_LAUNCH_FAILED),
        }
        if let Ok(sig) = set.wait() {
            if sig != Signal::SIGCHLD {
                let _ = kill(child, sig);
            }
        }
    }
}

/// Once R has ended (no PID namespace: the launcher is R's parent and a
/// subreaper), kills what it left running and reaps it, as the end of a
/// PID namespace's init would: nothing of the copy outlives it or loses
/// the launcher as its ancestor.
pub fn end_orphans() {
    use nix::sys::wait::WaitPidFlag;
    loop {
        let left = children();
        for orphan in &left {
            let _ = kill(*orphan, Signal::SIGKILL);
        }
        // Reaps what has ended without waiting: a killed child's own
        // children are given back to us alive, and are killed next round.
        let mut reaped = false;
        loop {
            match waitpid(None, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) => reaped = true,
                Err(_) if left.is_empty() => return,
                Err(_) => break,
            }
        }
        if !reaped {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

/// This (single-threaded) process's children.
fn children() -> Vec<Pid> {
    let me = std::process::id();
    let text = std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")).unwrap_or_default();
    text.split_whitespace().filter_map(|p| p.parse().ok()).map(Pid::from_raw).collect()
}

/// Ends this process the way R ended (`told` by the init: `exit N` or
/// `signal N`), else the way the init ended.
pub fn mirror(told: &str, init_end: WaitStatus) -> ! {
    super::log_pump::finish(super::log_pump::FINISH_WAIT);
    let (code, sig) = match (told.split_once(' '), init_end) {
        (Some(("exit", n)), _) => (n.parse().ok(), None),
        (Some(("signal", n)), _) => (None, n.parse().ok()),
        (_, WaitStatus::Signaled(_, s, _)) => (None, Some(s as i32)),
        (_, WaitStatus::Exited(_, c)) => (Some(c), None),
        _ => (Some(EXIT_LAUNCH_FAILED), None),
    };
    if let Some(sig) = sig.and_then(|s| Signal::try_from(s).ok()) {
        die_by(sig);
    }
    std::process::exit(code.unwrap_or(EXIT_LAUNCH_FAILED))
}

/// Dies by `sig` (its default action, no core file of the launcher); a
/// signal whose default is not to end the process ends it with 128 + sig.
fn die_by(sig: Signal) -> ! {
    let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: setrlimit and signal with constant arguments; raise ends us.
    unsafe {
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(sig as i32, libc::SIG_DFL);
    }
    let mut only = SigSet::empty();
    only.add(sig);
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&only), None);
    let _ = nix::sys::signal::raise(sig);
    std::process::exit(128 + sig as i32)
}
