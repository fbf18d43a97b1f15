//! A copy listens only on its own port, on 127.0.0.1. Landlock checks only
//! the port of a TCP `bind()`: `listen()` on a socket never bound (the
//! kernel picks a port on 0.0.0.0), binding 0.0.0.0 or `::` on the copy's
//! own port, and UDP all pass it. So the process that becomes R installs a
//! seccomp filter that hands every `bind` and `listen` to the copy's init
//! ([`install`], with SECCOMP_FILTER_FLAG_NEW_LISTENER; the listener goes
//! to the init over a socket pair), and the init, R's parent and not under
//! the filter, answers each ([`answer`]): it takes the socket itself with
//! `pidfd_getfd`, reads the address once, decides ([`verdict`]) and, when
//! it allows the call, makes it on its duplicate of the socket, returning
//! its result. It never lets the call through
//! (SECCOMP_USER_NOTIF_FLAG_CONTINUE): the address in R's memory and the
//! socket behind R's descriptor could change between a check and the
//! kernel's own reading of them; a call made on what was checked cannot.
//!
//! Allowed: any `bind` and `listen` of a Unix or netlink socket; a TCP
//! `bind` to 127.0.0.1 on the copy's port; a `bind` to port 0 (a client
//! choosing its source address; such a socket still cannot listen); a
//! `listen` on a TCP socket bound to 127.0.0.1 on the copy's port. Refused
//! (EACCES, as Landlock refuses a port): everything else. Outbound
//! connections and UDP clients (glibc's DNS connects its socket) make no
//! `bind`. A UDP `sendto` on a socket never bound binds it to a port the
//! kernel picks, where it can then receive: a named gap (a port nobody
//! chose or can announce; see the README).

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `AUDIT_ARCH_*` of this build: a call of another architecture is left
/// to the other filters, which refuse it.
#[cfg(target_arch = "x86_64")]
pub(super) const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
pub(super) const AUDIT_ARCH: u32 = 0xC000_00B7;

/// The refusal's errno, as Landlock's for a port.
const REFUSED: i32 = libc::EACCES;

/// The filter: `bind` and `listen` go to the supervisor. Calls of another
/// architecture or ABI (x32 numbers, i386's `socketcall`), which would slip
/// past it, are refused (EPERM) whatever `syscalls` says. Every other call
/// is allowed (the other filters judge it). A filter of the copy's own with
/// a listener, which would take the calls first, the kernel refuses (EBUSY:
/// one listener per process's filters).
fn program() -> Vec<libc::sock_filter> {
    const LD: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const JGE: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    let op = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    // struct seccomp_data: nr at 0, arch at 4. Jumps count the
    // instructions skipped.
    vec![
        /* 0 */ op(LD, 0, 0, 4),
        /* 1 */ op(JEQ, 1, 0, AUDIT_ARCH),
        /* 2 */ op(RET, 0, 0, EPERM),
        /* 3 */ op(LD, 0, 0, 0),
        /* 4 */ op(JGE, 3, 0, 0x4000_0000),
        /* 5 */ op(JEQ, 3, 0, libc::SYS_bind as u32),
        /* 6 */ op(JEQ, 2, 0, libc::SYS_listen as u32),
        /* 7 */ op(RET, 0, 0, libc::SECCOMP_RET_ALLOW),
        /* 8 */ op(RET, 0, 0, EPERM),
        /* 9 */ op(RET, 0, 0, libc::SECCOMP_RET_USER_NOTIF),
    ]
}

/// Installs the filter in this process (the one about to exec R; it sets
/// no_new_privs, as an unprivileged caller must) and returns the listener
/// the supervisor answers on.
pub fn install() -> io::Result<OwnedFd> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let filter = program();
    let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
    // SAFETY: seccomp with a program that outlives the call.
    let fd = unsafe {
        libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, libc::SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog as *const _)
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor (close-on-exec).
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sends the listener to the init over `to` (one end of a socket pair).
pub fn send(to: &OwnedFd, listener: &OwnedFd) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let fds = [listener.as_raw_fd()];
    let iov = [io::IoSlice::new(b"l")];
    sendmsg::<()>(to.as_raw_fd(), &iov, &[ControlMessage::ScmRights(&fds)], MsgFlags::empty(), None)?;
    Ok(())
}

/// Receives the listener from the process that becomes R; none when it
/// sent none (it could not install the filter, or failed before).
pub fn receive(from: &OwnedFd) -> Option<OwnedFd> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(from.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC).ok()?;
    let fd = msg.cmsgs().ok()?.find_map(|c| match c {
        ControlMessageOwned::ScmRights(fds) => fds.first().copied(),
        _ => None,
    })?;
    // SAFETY: a descriptor the kernel just gave us.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A call the supervisor judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `bind` to this address (for AF_INET and AF_INET6: the port, and the
    /// IPv4 address when there is one; for AF_NETLINK, in `port`'s stead,
    /// nothing: its multicast groups are `groups`).
    Bind { port: u16, ipv4: Option<Ipv4Addr> },
    /// `bind` of a netlink socket that joins these multicast groups (the
    /// supervisor would join them with its own rights, not the copy's).
    NetlinkGroups(u32),
    /// `listen` on a socket bound to this address (IPv4 only; none
    /// otherwise or when unbound).
    Listen { bound: Option<SocketAddrV4> },
}

/// Whether the copy on `own` port may make `call` on a socket of `domain`
/// and `kind` (SO_TYPE): `Err` says why not.
pub fn verdict(call: Call, domain: i32, kind: i32, own: u16) -> Result<(), String> {
    let here = SocketAddrV4::new(Ipv4Addr::LOCALHOST, own);
    match (domain, call) {
        (libc::AF_NETLINK, Call::NetlinkGroups(g)) if g != 0 => Err(format!(
            "bind of a netlink socket to multicast groups {g:#x}: a copy joins none (they would be joined with its supervisor's rights)"
        )),
        (libc::AF_UNIX | libc::AF_NETLINK, _) => Ok(()),
        // Only a netlink socket's bind is read so (above).
        (_, Call::NetlinkGroups(_)) => Ok(()),
        (libc::AF_INET | libc::AF_INET6, Call::Bind { port: 0, .. }) => Ok(()),
        (libc::AF_INET, Call::Bind { port, ipv4: Some(ip) }) if kind == libc::SOCK_STREAM && port == own && ip == *here.ip() => Ok(()),
        (libc::AF_INET, Call::Listen { bound: Some(b) }) if kind == libc::SOCK_STREAM && b == here => Ok(()),
        (_, Call::Bind { port, ipv4 }) => {
            let at = ipv4.map_or_else(|| "an IPv6 address".to_string(), |ip| ip.to_string());
            Err(format!("bind to port {port} on {at}: a copy listens only on 127.0.0.1:{own}"))
        }
        (_, Call::Listen { bound }) => {
            let at = bound.map_or_else(|| "a socket not bound to it".to_string(), |b| b.to_string());
            Err(format!("listen on {at}: a copy listens only on 127.0.0.1:{own}"))
        }
    }
}

/// What answering one notification came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    /// A call was answered (or there was none to answer); more may come.
    Call,
    /// A `listen` was made: the copy now listens on its own port (the only
    /// TCP listen the fence allows), the moment the daemon waits for.
    Listening,
    /// The listener has nothing more to give (every process under the
    /// filter is gone).
    Gone,
}

/// Answers one notification from `listener` for the copy on port `own`.
pub fn answer(listener: &OwnedFd, own: u16) -> Answered {
    // SAFETY: plain data, zeroed as the kernel requires before RECV.
    let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: the ioctl fills `req`, which is of the size it names.
    if unsafe { libc::ioctl(listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_RECV as _, &mut req) } != 0 {
        let e = io::Error::last_os_error();
        // Interrupted, or the caller gave up (ENOENT): another will come.
        return match e.raw_os_error() {
            Some(libc::EINTR | libc::ENOENT) => Answered::Call,
            _ => Answered::Gone,
        };
    }
    let listen = req.data.nr as libc::c_long == libc::SYS_listen;
    let (val, error) = match judge(listener, &req, own) {
        Ok(v) => (v, 0),
        Err(errno) => (0, -errno),
    };
    let mut resp = libc::seccomp_notif_resp { id: req.id, val, error, flags: 0 };
    // SAFETY: the ioctl reads `resp`; its failure (the caller is gone) needs nothing.
    unsafe { libc::ioctl(listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_SEND as _, &mut resp) };
    if listen && error == 0 {
        Answered::Listening
    } else {
        Answered::Call
    }
}

/// Judges one call and, when allowed, makes it: its return value, or the
/// errno to answer.
fn judge(listener: &OwnedFd, req: &libc::seccomp_notif, own: u16) -> Result<i64, i32> {
    let tgid = tgid_of(req.pid).ok_or(libc::ESRCH)?;
    let pidfd = pidfd_open(tgid).map_err(errno)?;
    // The pidfd is of the caller only if the call still waits.
    still_waiting(listener, req.id)?;
    let sock = getfd(&pidfd, req.data.args[0] as RawFd).map_err(errno)?;
    let domain = sockopt(&sock, libc::SO_DOMAIN).map_err(errno)?;
    let kind = sockopt(&sock, libc::SO_TYPE).map_err(errno)?;
    let rc = if req.data.nr as libc::c_long == libc::SYS_bind {
        let len = req.data.args[2] as usize;
        if len > std::mem::size_of::<libc::sockaddr_storage>() {
            return Err(libc::EINVAL);
        }
        let addr = read_memory(tgid, req.data.args[1] as usize, len).map_err(errno)?;
        still_waiting(listener, req.id)?;
        check(verdict(bind_call(domain, &addr), domain, kind, own), tgid)?;
        do_bind(&sock, domain, &addr, tgid)
    } else {
        check(verdict(Call::Listen { bound: bound_v4(&sock) }, domain, kind, own), tgid)?;
        // SAFETY: listen on a descriptor we own.
        unsafe { libc::listen(sock.as_raw_fd(), req.data.args[1] as libc::c_int) }
    };
    if rc == 0 {
        Ok(0)
    } else {
        Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL))
    }
}

/// A refusal, said in the copy's log (the init's stderr is the copy's log).
fn check(v: Result<(), String>, pid: u32) -> Result<(), i32> {
    v.map_err(|why| {
        super::log(&format!("--- shinyctl: fence ports: refused process {pid} a {why} ---"));
        REFUSED
    })
}

/// What a `bind` asks, read as the kernel reads it for the socket's
/// family (an AF_INET socket takes the address's port and IPv4 whatever
/// its `sa_family` says).
fn bind_call(domain: i32, addr: &[u8]) -> Call {
    if domain == libc::AF_NETLINK {
        // struct sockaddr_nl: family, pad, pid, groups (native endian).
        let groups = addr.get(8..12).map_or(0, |g| u32::from_ne_bytes([g[0], g[1], g[2], g[3]]));
        return Call::NetlinkGroups(groups);
    }
    let port = addr.get(2..4).map_or(0, |p| u16::from_be_bytes([p[0], p[1]]));
    let ipv4 = match domain {
        libc::AF_INET => addr.get(4..8).map(|a| Ipv4Addr::new(a[0], a[1], a[2], a[3])),
        _ => None,
    };
    // Too short to hold a port: the kernel refuses it; keep it out of port 0.
    let port = if addr.len() < 4 && matches!(domain, libc::AF_INET | libc::AF_INET6) { u16::MAX } else { port };
    Call::Bind { port, ipv4 }
}

/// Makes the `bind` on our duplicate of the socket. A Unix socket's path is
/// made where R would make it and as R would: relative to R's working
/// directory, with R's umask, and, when R is another user than the
/// supervisor (a root launcher's or init's copy runs as its own user), in a
/// child that takes R's ids first, so the file is made with R's rights, not
/// the supervisor's.
fn do_bind(sock: &OwnedFd, domain: i32, addr: &[u8], pid: u32) -> libc::c_int {
    if domain != libc::AF_UNIX {
        // SAFETY: bind with a buffer and its length.
        return unsafe { libc::bind(sock.as_raw_fd(), addr.as_ptr().cast(), addr.len() as libc::socklen_t) };
    }
    match ids_of(pid) {
        Some(ids) if ids.0 != nix::unistd::geteuid().as_raw() => as_caller(ids, || unix_bind(sock, addr, pid)),
        _ => unix_bind(sock, addr, pid),
    }
}

/// The caller's filesystem uid, gid and groups (`/proc/PID/status`).
fn ids_of(pid: u32) -> Option<(u32, u32, Vec<u32>)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
    };
    let uid = field("Uid:")?.get(3)?.parse().ok()?;
    let gid = field("Gid:")?.get(3)?.parse().ok()?;
    let groups = field("Groups:").unwrap_or_default().iter().filter_map(|g| g.parse().ok()).collect();
    Some((uid, gid, groups))
}

/// Runs `f` in a child with the caller's ids (`ids`), and returns its
/// result as a system call does (-1 with errno set on failure). The
/// supervisor is single-threaded, so the child may run anything.
fn as_caller(ids: (u32, u32, Vec<u32>), f: impl FnOnce() -> libc::c_int) -> libc::c_int {
    use nix::unistd::{fork, ForkResult, Gid, Uid};
    // SAFETY: single-threaded (see above); the child exits at once.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let groups: Vec<Gid> = ids.2.iter().map(|&g| Gid::from_raw(g)).collect();
            let became = nix::unistd::setgroups(&groups)
                .and_then(|()| nix::unistd::setgid(Gid::from_raw(ids.1)))
                .and_then(|()| nix::unistd::setuid(Uid::from_raw(ids.0)));
            let code = match became {
                Err(e) => e as i32,
                Ok(()) if f() == 0 => 0,
                Ok(()) => io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL),
            };
            // SAFETY: ends the child without running the parent's exit code.
            unsafe { libc::_exit(code) }
        }
        Ok(ForkResult::Parent { child }) => {
            let code = match nix::sys::wait::waitpid(child, None) {
                Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => code,
                _ => libc::EPERM,
            };
            if code != 0 {
                // SAFETY: sets this thread's errno, read by the caller.
                unsafe { *libc::__errno_location() = code };
                return -1;
            }
            0
        }
        Err(e) => {
            // SAFETY: as above.
            unsafe { *libc::__errno_location() = e as i32 };
            -1
        }
    }
}

/// A Unix socket's `bind` in R's working directory with R's umask.
fn unix_bind(sock: &OwnedFd, addr: &[u8], pid: u32) -> libc::c_int {
    let call = || unsafe {
        // SAFETY: bind with a buffer and its length.
        libc::bind(sock.as_raw_fd(), addr.as_ptr().cast(), addr.len() as libc::socklen_t)
    };
    let Ok(cwd) = std::fs::File::open(format!("/proc/{pid}/cwd")) else { return call() };
    let mask = umask_of(pid).unwrap_or(0o022);
    // SAFETY: fchdir to a directory we hold, umask with a mode; both are
    // put back at once (the init has no other thread).
    unsafe {
        libc::fchdir(cwd.as_raw_fd());
        let before = libc::umask(mask);
        let rc = call();
        let e = io::Error::last_os_error();
        libc::umask(before);
        libc::chdir(c"/".as_ptr());
        if rc != 0 {
            // The errno the caller reads is bind's, not chdir's.
            *libc::__errno_location() = e.raw_os_error().unwrap_or(libc::EINVAL);
        }
        rc
    }
}

/// The IPv4 address a socket is bound to, if it is one.
fn bound_v4(sock: &OwnedFd) -> Option<SocketAddrV4> {
    // SAFETY: plain data, filled by getsockname up to the length given.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: getsockname into a sockaddr_in of the length given.
    let rc = unsafe { libc::getsockname(sock.as_raw_fd(), (&mut sin as *mut libc::sockaddr_in).cast(), &mut len) };
    (rc == 0 && sin.sin_family as i32 == libc::AF_INET)
        .then(|| SocketAddrV4::new(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)), u16::from_be(sin.sin_port)))
}

/// An int socket option.
fn sockopt(sock: &OwnedFd, opt: libc::c_int) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into an int of the length given.
    let rc = unsafe { libc::getsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, opt, (&mut v as *mut libc::c_int).cast(), &mut len) };
    if rc == 0 {
        Ok(v)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Fails with ENOENT unless the notification `id` still waits for its
/// answer (its caller is alive and in the call).
fn still_waiting(listener: &OwnedFd, id: u64) -> Result<(), i32> {
    let mut id = id;
    // SAFETY: the ioctl reads a u64.
    match unsafe { libc::ioctl(listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_ID_VALID as _, &mut id) } {
        0 => Ok(()),
        _ => Err(libc::ENOENT),
    }
}

/// The process (thread group) of thread `tid`, from its status: R's
/// sockets are often made by a thread (httpuv's).
fn tgid_of(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Tgid:"))?.trim().parse().ok()
}

/// R's umask, from its status.
fn umask_of(pid: u32) -> Option<libc::mode_t> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    libc::mode_t::from_str_radix(status.lines().find_map(|l| l.strip_prefix("Umask:"))?.trim(), 8).ok()
}

/// `pidfd_open(pid, 0)`.
fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: a system call with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `pidfd_getfd(pidfd, fd, 0)`: our own duplicate (close-on-exec) of the
/// caller's descriptor.
fn getfd(pidfd: &OwnedFd, fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: a system call with integer arguments.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(got as RawFd) })
}

/// `len` bytes of process `pid`'s memory at `at`.
fn read_memory(pid: u32, at: usize, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let local = [io::IoSliceMut::new(&mut buf)];
    let remote = [nix::sys::uio::RemoteIoVec { base: at, len }];
    let mut local = local;
    let n = nix::sys::uio::process_vm_readv(nix::unistd::Pid::from_raw(pid as i32), &mut local, &remote)?;
    if n != len {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    Ok(buf)
}

/// An io::Error as the errno to answer.
fn errno(e: io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: u16 = 20001;

    fn bind(domain: i32, kind: i32, ip: [u8; 4], port: u16) -> Result<(), String> {
        verdict(Call::Bind { port, ipv4: (domain == libc::AF_INET).then(|| Ipv4Addr::from(ip)) }, domain, kind, OWN)
    }

    #[test]
    fn only_its_own_port_on_127_0_0_1_may_be_bound_and_listened_on() {
        let (inet, inet6, tcp, udp) = (libc::AF_INET, libc::AF_INET6, libc::SOCK_STREAM, libc::SOCK_DGRAM);
        assert!(bind(inet, tcp, [127, 0, 0, 1], OWN).is_ok(), "its own port");
        assert!(bind(inet, tcp, [0, 0, 0, 0], OWN).is_err(), "0.0.0.0, even on its own port");
        assert!(bind(inet, tcp, [127, 0, 0, 1], OWN + 1).is_err(), "another port");
        assert!(bind(inet6, tcp, [0; 4], OWN).is_err(), ":: on its own port");
        assert!(bind(inet, udp, [127, 0, 0, 1], OWN).is_err(), "UDP on a port");
        assert!(bind(inet, udp, [0, 0, 0, 0], 0).is_ok(), "a UDP client's bind to port 0");
        assert!(bind(inet, tcp, [10, 0, 0, 1], 0).is_ok(), "a TCP client choosing its source address");
        assert!(bind(libc::AF_UNIX, tcp, [0; 4], 0).is_ok() && bind(libc::AF_NETLINK, udp, [0; 4], 7).is_ok());
        assert!(bind(libc::AF_PACKET, udp, [0; 4], 0).is_err(), "another family");
        let listen = |bound: Option<SocketAddrV4>, kind| verdict(Call::Listen { bound }, inet, kind, OWN);
        assert!(listen(Some(SocketAddrV4::new(Ipv4Addr::LOCALHOST, OWN)), tcp).is_ok());
        assert!(listen(Some(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)), tcp).is_err(), "listen without bind");
        assert!(listen(Some(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)), tcp).is_err(), "bound to port 0 first");
        assert!(verdict(Call::Listen { bound: None }, inet6, tcp, OWN).is_err(), "IPv6");
        assert!(verdict(Call::Listen { bound: None }, libc::AF_UNIX, tcp, OWN).is_ok(), "a Unix socket");
        let e = bind(inet, tcp, [0, 0, 0, 0], OWN).unwrap_err();
        assert_eq!(e, "bind to port 20001 on 0.0.0.0: a copy listens only on 127.0.0.1:20001");
        // A netlink socket joins no multicast group (the audit log, uevents):
        // the supervisor would join it with its own rights.
        let mut nl = [0u8; 12];
        nl[0..2].copy_from_slice(&(libc::AF_NETLINK as u16).to_ne_bytes());
        assert!(verdict(bind_call(libc::AF_NETLINK, &nl), libc::AF_NETLINK, udp, OWN).is_ok(), "no group");
        nl[8..12].copy_from_slice(&1u32.to_ne_bytes());
        assert!(verdict(bind_call(libc::AF_NETLINK, &nl), libc::AF_NETLINK, udp, OWN).is_err(), "a group");
    }

    #[test]
    fn a_bind_is_read_as_the_kernel_reads_it() {
        let mut sin = [0u8; 16];
        sin[0..2].copy_from_slice(&(libc::AF_UNSPEC as u16).to_ne_bytes());
        sin[2..4].copy_from_slice(&9153u16.to_be_bytes());
        assert_eq!(bind_call(libc::AF_INET, &sin), Call::Bind { port: 9153, ipv4: Some(Ipv4Addr::UNSPECIFIED) }, "AF_UNSPEC is 0.0.0.0");
        assert_eq!(bind_call(libc::AF_INET, &sin[..2]), Call::Bind { port: u16::MAX, ipv4: None }, "too short is no port 0");
        assert_eq!(bind_call(libc::AF_INET6, &sin), Call::Bind { port: 9153, ipv4: None });
    }

    /// Runs the program on one call, as the kernel would (the few opcodes
    /// it uses).
    fn run(arch: u32, nr: u32) -> u32 {
        let p = program();
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = p[pc];
            pc += 1;
            match (i.code as u32) & 0x07 {
                libc::BPF_LD => acc = if i.k == 0 { nr } else { arch },
                libc::BPF_JMP => {
                    let taken = if i.code as u32 & 0xf0 == libc::BPF_JGE { acc >= i.k } else { acc == i.k };
                    pc += if taken { i.jt } else { i.jf } as usize;
                }
                _ => return i.k,
            }
        }
    }

    #[test]
    fn the_program_sends_bind_and_listen_and_refuses_other_abis() {
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let nr = |n: libc::c_long| n as u32;
        assert_eq!(run(AUDIT_ARCH, nr(libc::SYS_bind)), libc::SECCOMP_RET_USER_NOTIF);
        assert_eq!(run(AUDIT_ARCH, nr(libc::SYS_listen)), libc::SECCOMP_RET_USER_NOTIF);
        assert_eq!(run(AUDIT_ARCH, nr(libc::SYS_connect)), libc::SECCOMP_RET_ALLOW);
        assert_eq!(run(AUDIT_ARCH, nr(libc::SYS_seccomp)), libc::SECCOMP_RET_ALLOW);
        assert_eq!(run(AUDIT_ARCH, 0x4000_0000 | nr(libc::SYS_bind)), eperm, "x32");
        assert_eq!(run(0x4000_0003, 102), eperm, "i386");
    }
}
