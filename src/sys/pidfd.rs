//! Process handles that cannot be confused with a reused PID: a pidfd
//! (pidfd_open, pidfd_send_signal), raw syscalls through libc since nix 0.29
//! has neither. Where the kernel or the fd limit refuses a pidfd, callers
//! fall back to /proc with the process's start time.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::sys::procfs;

/// pidfd_send_signal's flag: signal the process group the pidfd's process
/// leads (Linux 6.9).
const PIDFD_SIGNAL_PROCESS_GROUP: libc::c_uint = 1 << 2;
/// pidfd_open's flag: a pidfd for one thread, readable once that thread
/// has exited (Linux 6.9; `O_EXCL`'s value).
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

/// A pidfd for one process, checked to be the process that started at a
/// given time.
pub struct Pidfd {
    /// The open pidfd (non-blocking: readable once the process exits).
    pub fd: OwnedFd,
}

impl Pidfd {
    /// Opens a pidfd for `pid`; with `start` (ticks since boot, field 22 of
    /// /proc/PID/stat), only when it is still that process. Opening first
    /// and checking after makes the check hold for the fd's life.
    pub fn open(pid: u32, start: Option<u64>) -> io::Result<Pidfd> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, libc::PIDFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just gave us this fd and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        if let Some(s) = start {
            if procfs::start_ticks(pid) != Some(s) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
        }
        Ok(Pidfd { fd })
    }

    /// Opens a pidfd for thread `tid` alone: readable once that thread has
    /// exited, while the rest of its process may still run. Refused
    /// (EINVAL) by kernels before 6.9.
    pub fn open_thread(tid: u32) -> io::Result<Pidfd> {
        // SAFETY: as in `open`; PIDFD_THREAD names a thread, not a process.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid as libc::c_int, libc::PIDFD_NONBLOCK | PIDFD_THREAD) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just gave us this fd and nothing else owns it.
        Ok(Pidfd { fd: unsafe { OwnedFd::from_raw_fd(fd as i32) } })
    }

    /// Sends `sig` to the process, or to the process group it leads.
    pub fn signal(&self, sig: i32, group: bool) -> io::Result<()> {
        let flags = if group { PIDFD_SIGNAL_PROCESS_GROUP } else { 0 };
        // SAFETY: a valid pidfd, a signal number, no siginfo, and flags.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, self.fd.as_raw_fd(), sig, std::ptr::null::<libc::siginfo_t>(), flags) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Signals the process group the process leads: through the pidfd where
    /// the kernel can, else the process itself through the pidfd and the
    /// group by its number (which no new process can take while the group
    /// has a member).
    pub fn signal_group(&self, pid: u32, sig: i32) {
        match self.signal(sig, true) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                let _ = self.signal(sig, false);
                // SAFETY: kill with a negative pid signals a process group.
                unsafe { libc::kill(-(pid as libc::pid_t), sig) };
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// True when the pidfd is readable within `ms`.
    fn readable(fd: &Pidfd, ms: i32) -> bool {
        let mut p = libc::pollfd { fd: fd.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    }

    #[test]
    fn a_threads_pidfd_turns_readable_when_the_thread_ends_and_the_process_is_not_ending() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no arguments.
            tid_tx.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        assert!(procfs::other_threads(std::process::id()).contains(&tid));
        let fd = match Pidfd::open_thread(tid) {
            Ok(fd) => fd,
            // A kernel before 6.9: the load balancer falls back to the process's pidfd.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return,
            Err(e) => panic!("pidfd for thread {tid}: {e}"),
        };
        assert!(!readable(&fd, 0), "the thread runs");
        drop(tx);
        t.join().unwrap();
        assert!(readable(&fd, 5000), "the thread ended");
        assert!(!procfs::is_ending(std::process::id()), "a thread that ends alone is not the process's end");
    }

    #[test]
    fn a_killed_process_is_ending() {
        let mut child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let pid = child.id();
        assert!(!procfs::is_ending(pid));
        // SAFETY: kill with a pid we started and have not reaped.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        let _ = child.wait();
        assert!(procfs::is_ending(pid), "gone counts as ending");
    }

    #[test]
    fn a_pidfd_signals_its_process_and_not_a_changed_one() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let start = procfs::start_ticks(pid);
        assert!(Pidfd::open(pid, start.map(|s| s + 1)).is_err(), "another start time is another process");
        let fd = Pidfd::open(pid, start).unwrap();
        fd.signal(libc::SIGKILL, false).unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(fd.signal(libc::SIGTERM, false).is_err(), "a reaped process is never signalled again");
    }
}
