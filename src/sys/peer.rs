//! Who is on the other end of a control socket (`api.sock`,
//! `proxy/proxy.sock`, `proxy/handover.sock`): a copy of an app, or a
//! process started inside one, is refused whatever its uid (README, "The
//! fence": no copy reaches any shinyctl). Two marks, either enough:
//!
//! - **A PID namespace below ours.** A fenced copy runs in a PID namespace
//!   of its own, and nothing started inside it can leave it. The peer's
//!   `NSpid:` line (in `/proc/<pid>/status`, readable by anyone) has one
//!   entry per namespace level it is in; more levels than ours is a copy, or
//!   a container, and neither may steer this shinyctl.
//! - **A copy's launcher among its ancestors.** A copy without namespaces
//!   (the Landlock fallback, `sandbox.mode: off`) has its launcher as R's
//!   parent and a subreaper: an orphan inside it (`setsid` and a double
//!   fork) is given back to the launcher, not to the machine's init, so
//!   the chain of parents always passes through it.
//!
//! The PID the kernel gives for the peer (SO_PEERCRED) could be reused by
//! another process while this looks; a pidfd of the peer (SO_PEERPIDFD)
//! taken first, and checked to still name that PID after the look, rules
//! that out.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the peer, as it connected. Not
/// in the `libc` crate for every target yet; 77 on the generic ABIs.
const SO_PEERPIDFD: libc::c_int = 77;

/// How many parents are followed at most: a chain longer than this is not
/// a process tree a machine has.
const MAX_DEPTH: usize = 256;

/// Why the process `pid` (as this process sees PIDs) may not use a control
/// socket because it is a copy or inside one, or `None`. A peer whose
/// `/proc` entry cannot be read is refused too: nothing can be said of it.
pub fn copy_refusal(pid: u32) -> Option<String> {
    let own_depth = read_status(std::process::id()).and_then(|s| nspid_depth(&s));
    let Some(status) = read_status(pid) else {
        return Some(format!("the peer (pid {pid}) cannot be looked up in /proc"));
    };
    if let (Some(own), Some(theirs)) = (own_depth, nspid_depth(&status)) {
        if theirs > own {
            return Some(format!(
                "the peer (pid {pid}) runs in a PID namespace of its own: it is an app's copy, or runs inside one or in a container, and no copy may steer shinyctl"
            ));
        }
    }
    let mut at = pid;
    let mut status = status;
    for _ in 0..MAX_DEPTH {
        if is_launcher(&std::fs::read(format!("/proc/{at}/cmdline")).unwrap_or_default()) {
            return Some(format!(
                "the peer (pid {pid}) was started by an app's copy (its launcher is pid {at}), and no copy may steer shinyctl"
            ));
        }
        match parent(&status) {
            Some(p) if p > 1 => at = p,
            _ => return None,
        }
        status = read_status(at)?;
    }
    Some(format!("the peer (pid {pid}) has more than {MAX_DEPTH} ancestors"))
}

/// `/proc/<pid>/status`.
fn read_status(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status")).ok()
}

/// How many PID namespaces deep a process is, from its `NSpid:` line (one
/// entry per level, as seen from the reader's /proc's namespace down).
pub fn nspid_depth(status: &str) -> Option<usize> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    Some(line.split_whitespace().count()).filter(|&n| n > 0)
}

/// The parent's PID, from the `PPid:` line.
pub fn parent(status: &str) -> Option<u32> {
    status.lines().find_map(|l| l.strip_prefix("PPid:")).and_then(|v| v.trim().parse().ok())
}

/// True when a command line (`/proc/<pid>/cmdline`, NUL-separated) is a
/// copy's launcher or its init: shinyctl run as `shinyctl launch …`.
pub fn is_launcher(cmdline: &[u8]) -> bool {
    let mut args = cmdline.split(|&b| b == 0);
    let program = args.next().unwrap_or_default();
    let name = program.rsplit(|&b| b == b'/').next().unwrap_or_default();
    name == b"shinyctl" && args.next() == Some(b"launch".as_slice())
}

/// A pidfd of the peer of a connected Unix socket, where the kernel gives
/// one (Linux 6.5 and later).
pub fn peer_pidfd(sock: RawFd) -> Option<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`, an int.
    let rc = unsafe { libc::getsockopt(sock, libc::SOL_SOCKET, SO_PEERPIDFD, (&mut fd as *mut libc::c_int).cast(), &mut len) };
    // SAFETY: on success the kernel gave us a new descriptor of our own.
    (rc == 0 && fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The PID a pidfd names now (its `Pid:` in fdinfo), `None` once that
/// process is gone (the kernel shows -1).
pub fn pidfd_pid(pidfd: &OwnedFd) -> Option<u32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    info.lines().find_map(|l| l.strip_prefix("Pid:")).and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_depth_counts_nspid_entries() {
        assert_eq!(nspid_depth("Name:\tR\nNSpid:\t4573\n"), Some(1));
        assert_eq!(nspid_depth("Name:\tR\nNSpid:\t4573\t2\n"), Some(2));
        assert_eq!(nspid_depth("Name:\tR\n"), None, "a kernel without the line says nothing");
        assert_eq!(parent("PPid:\t812\nTracerPid:\t0\n"), Some(812));
    }

    #[test]
    fn a_launcher_is_shinyctl_launch_by_any_path() {
        assert!(is_launcher(b"/usr/local/bin/shinyctl\0launch\0--app-dir\0/x\0"));
        assert!(is_launcher(b"shinyctl\0launch\0"));
        assert!(!is_launcher(b"/usr/local/bin/shinyctl\0serve\0"));
        assert!(!is_launcher(b"/usr/bin/rocket\0launch\0"), "another program's launch subcommand");
        assert!(!is_launcher(b"/usr/lib/R/bin/exec/R\0--no-echo\0"));
        assert!(!is_launcher(b""));
    }

    /// This test process is no copy: it passes, and so does its pidfd check.
    #[test]
    fn this_process_is_not_a_copy() {
        assert_eq!(copy_refusal(std::process::id()), None);
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        if let Some(fd) = peer_pidfd(a.as_raw_fd()) {
            assert_eq!(pidfd_pid(&fd), Some(std::process::id()));
        }
        drop(b);
    }

    /// A process whose parent runs as `shinyctl launch` (bash under the
    /// name shinyctl, running a script named launch) is refused, and the
    /// reason names the launcher.
    #[test]
    fn a_descendant_of_a_launcher_is_refused() {
        let tmp_dir = tempfile::tempdir().unwrap();
        let dir = tmp_dir.path().to_path_buf();
        let _ = std::fs::remove_file(dir.join("shinyctl"));
        std::os::unix::fs::symlink("/bin/bash", dir.join("shinyctl")).unwrap();
        std::fs::write(dir.join("launch"), "sleep 30 & wait\n").unwrap();
        let mut launcher = std::process::Command::new(dir.join("shinyctl")).arg("launch").current_dir(&dir).spawn().unwrap();
        let pid = launcher.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let child = loop {
            let kids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
            // Once it is sleep (before its exec it is a fork of the launcher).
            let kid = kids.split_whitespace().next().and_then(|k| k.parse::<u32>().ok());
            if let Some(k) = kid.filter(|k| std::fs::read(format!("/proc/{k}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep\0"))) {
                break k;
            }
            assert!(std::time::Instant::now() < deadline, "the stand-in's child never started");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let why = copy_refusal(child).expect("a launcher's child is refused");
        assert!(why.contains(&format!("its launcher is pid {pid}")), "{why}");
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child as i32), nix::sys::signal::Signal::SIGKILL);
        let _ = launcher.kill();
        let _ = launcher.wait();
    }
}
