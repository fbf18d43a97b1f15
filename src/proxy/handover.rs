//! Upgrading the load balancer without losing a connection. A load balancer
//! started with `SHINYCTL_PROXY_TAKEOVER=1` while another one holds
//! `proxy/lock` does not give up: it asks the running one for its
//! listening sockets over `proxy/handover.sock` (SCM_RIGHTS), serves on
//! those very sockets (so the connections queued on them are not lost when
//! the old process closes its copies), replaces `proxy.sock` so the daemon
//! now talks to it, and takes the lock once the old one exits (the daemon
//! stops it, by PID, once the new one answers).
//!
//! Every load balancer serves `handover.sock`, so any newer build can take
//! over from it. One that cannot (an older build) is replaced all the same:
//! the new one binds its own sockets beside it with SO_REUSEPORT.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::home::Home;

/// The environment variable that asks a new load balancer to take over
/// from a running one instead of exiting.
pub const TAKEOVER_ENV: &str = "SHINYCTL_PROXY_TAKEOVER";

/// The most sockets handed over (SCM_MAX_FD is 253 on Linux).
const MAX_FDS: usize = 253;

/// Listening sockets received from the previous load balancer, by host and
/// port as its table named them.
pub type Inherited = HashMap<(String, u16), std::net::TcpListener>;

/// `proxy/handover.sock`.
pub fn path(home: &Home) -> PathBuf {
    home.proxy_dir().join("handover.sock")
}

/// True when this process was asked to take over from a running one.
pub fn asked() -> bool {
    std::env::var_os(TAKEOVER_ENV).is_some_and(|v| v == "1")
}

/// Asks the load balancer serving `path` for its listening sockets.
pub fn receive(path: &Path) -> io::Result<Inherited> {
    let stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = vec![0u8; 64 * 1024];
    // u64 words keep the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; cmsg_space(MAX_FDS).div_ceil(8)];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len() * 8;
    // SAFETY: recvmsg writes only within the buffers msg points to.
    let len = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if len < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut sockets = Vec::new();
    // SAFETY: the CMSG_* walk stays within msg_controllen, as the kernel
    // filled it; each SCM_RIGHTS descriptor is new to this process and owned
    // at once, so none leaks whatever comes next.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..n {
                    sockets.push(std::net::TcpListener::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let names: Vec<(String, u16)> =
        serde_json::from_slice(&buf[..len as usize]).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if msg.msg_flags & (libc::MSG_CTRUNC | libc::MSG_TRUNC) != 0 || names.len() != sockets.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{} names for {} sockets", names.len(), sockets.len())));
    }
    Ok(names.into_iter().zip(sockets).collect())
}

fn cmsg_space(fds: usize) -> usize {
    // SAFETY: CMSG_SPACE only computes a size.
    unsafe { libc::CMSG_SPACE((fds * std::mem::size_of::<RawFd>()) as u32) as usize }
}

/// Sends the listening sockets held now (host, port and descriptor each)
/// to a load balancer that asked, on `stream`. The caller keeps the
/// descriptors open until this returns.
pub fn send(stream: &impl AsRawFd, held: &[(String, u16, RawFd)]) -> io::Result<usize> {
    let held = &held[..held.len().min(MAX_FDS)];
    let names: Vec<(&str, u16)> = held.iter().map(|(h, p, _)| (h.as_str(), *p)).collect();
    let fds: Vec<RawFd> = held.iter().map(|(_, _, fd)| *fd).collect();
    let mut payload = serde_json::to_vec(&names).map_err(io::Error::other)?;
    let mut control = vec![0u64; cmsg_space(fds.len().max(1)).div_ceil(8)];
    let mut iov = libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() };
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the
    // call, and the one cmsghdr written fits the control buffer (CMSG_SPACE).
    let sent = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = cmsg_space(fds.len());
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN((fds.len() * std::mem::size_of::<RawFd>()) as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
        }
        libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fds.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_sockets_cross_a_unix_socket() {
        let dir = std::env::temp_dir().join(format!("shinyctl-handover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("handover.sock");
        let _ = std::fs::remove_file(&path);
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = tcp.local_addr().unwrap().port();
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let p = path.clone();
        let client = std::thread::spawn(move || receive(&p));
        let (stream, _) = listener.accept().unwrap();
        assert_eq!(send(&stream, &[("127.0.0.1".to_string(), port, tcp.as_raw_fd())]).unwrap(), 1);
        let inherited = client.join().unwrap().unwrap();
        let got = inherited.get(&("127.0.0.1".to_string(), port)).expect("the socket came over");
        assert_eq!(got.local_addr().unwrap().port(), port);
        // The same socket: a connection made now is accepted on the copy.
        drop(tcp);
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        got.set_nonblocking(false).unwrap();
        assert!(got.accept().is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
