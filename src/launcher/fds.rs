//! Only 0, 1 and 2 reach R. Whatever started the daemon may have left it
//! descriptors without close-on-exec (a pipe, a socket of a supervisor), and
//! `std::process::Command` passes those on to every child: the launcher
//! closes them the moment it starts ([`close_inherited`]), so neither the
//! copy's init (whose `/proc/1/fd` R could otherwise open) nor R gets them,
//! and the process that execs R marks everything above 2 close-on-exec
//! just before ([`cloexec_above_stdio`]), for what the launcher itself
//! opened on the way.

use std::os::fd::RawFd;

/// Closes every descriptor above 2. Called first thing in the launcher,
/// before it opens anything of its own: nothing in this process owns one
/// yet, so none is closed under an owner's feet.
pub fn close_inherited() {
    if close_range(0).is_err() {
        for fd in open_above_stdio() {
            // SAFETY: a descriptor this process holds and nothing owns yet.
            unsafe { libc::close(fd) };
        }
    }
}

/// Marks every descriptor above 2 close-on-exec, so exec leaves R only
/// 0, 1 and 2; the launcher's own (the pipe that reports the fences) stay
/// usable until then.
pub fn cloexec_above_stdio() {
    if close_range(libc::CLOSE_RANGE_CLOEXEC).is_err() {
        for fd in open_above_stdio() {
            // SAFETY: F_SETFD on a descriptor number; an fd closed since
            // the listing gets EBADF, which is harmless.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }
}

/// `close_range(3, ~0, flags)` (Linux 5.9; CLOSE_RANGE_CLOEXEC 5.11).
fn close_range(flags: libc::c_uint) -> std::io::Result<()> {
    // SAFETY: close_range with a range and flags; no memory is passed.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The descriptors above 2 this process holds, from `/proc/self/fd` (the
/// fallback for a kernel without close_range). The listing's own
/// descriptor is closed by the time this returns; it may be named, which
/// costs nothing but an EBADF.
fn open_above_stdio() -> Vec<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    let fds: Vec<RawFd> = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).filter(|&fd| fd > 2).collect();
    fds
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    /// Both kinds, in a child (closing in the test process would close
    /// what the test harness holds).
    #[test]
    fn above_stdio_is_closed_or_marked_and_stdio_is_kept() {
        let (r, w) = nix::unistd::pipe().unwrap();
        let (r, w) = (r.into_raw_fd(), w.into_raw_fd());
        let flags = |fd: RawFd| unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_eq!(flags(r) & libc::FD_CLOEXEC, 0, "a pipe made without O_CLOEXEC");
        // SAFETY: the child only makes system calls and exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                cloexec_above_stdio();
                let marked = flags(r) & libc::FD_CLOEXEC != 0 && flags(w) & libc::FD_CLOEXEC != 0;
                close_inherited();
                let closed = flags(r) == -1 && flags(w) == -1;
                let stdio = flags(2) != -1;
                unsafe { libc::_exit(if marked && closed && stdio { 0 } else { 1 }) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0), "marked, then closed, stdio kept");
            }
        }
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }
}
