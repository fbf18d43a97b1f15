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
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

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
    let mut control = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut control), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut sockets = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            // SAFETY: each SCM_RIGHTS descriptor is new to this process and
            // owned here at once, so none leaks whatever comes next.
            sockets.extend(fds.into_iter().map(|fd| unsafe { std::net::TcpListener::from_raw_fd(fd) }));
        }
    }
    let (len, truncated) = (msg.bytes, msg.flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC));
    let names: Vec<(String, u16)> = serde_json::from_slice(&buf[..len]).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if truncated || names.len() != sockets.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{} names for {} sockets", names.len(), sockets.len())));
    }
    Ok(names.into_iter().zip(sockets).collect())
}

/// Sends the listening sockets held now (host, port and descriptor each)
/// to a load balancer that asked, on `stream`. The caller keeps the
/// descriptors open until this returns.
pub fn send(stream: &impl AsRawFd, held: &[(String, u16, RawFd)]) -> io::Result<usize> {
    let held = &held[..held.len().min(MAX_FDS)];
    let names: Vec<(&str, u16)> = held.iter().map(|(h, p, _)| (h.as_str(), *p)).collect();
    let fds: Vec<RawFd> = held.iter().map(|(_, _, fd)| *fd).collect();
    let payload = serde_json::to_vec(&names).map_err(io::Error::other)?;
    let rights = [ControlMessage::ScmRights(&fds)];
    // No control message at all when there is nothing to hand over.
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    sendmsg::<()>(stream.as_raw_fd(), &[IoSlice::new(&payload)], cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
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
