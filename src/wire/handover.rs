//! Passing open sockets between shinyctl's processes over
//! `proxy/handover.sock`, which every load balancer serves: SCM_RIGHTS
//! (through nix) with a versioned JSON message beside the descriptors.
//!
//! The daemon holds every app's listening socket (it binds them at
//! `apply`) and gives the whole set to each load balancer it starts
//! ([`Message::Listeners`], answered by [`Message::Ack`]); a daemon that
//! restarts asks the running load balancer for them ([`Message::Ask`],
//! answered by `Listeners`). A load balancer of an older build answers any
//! connection with a bare JSON array of `[host, port]` and its sockets
//! (version 0), which [`ask`] also reads.
//!
//! One message is one line of JSON, `{"v":1,"kind":…,…}`, sent with its
//! descriptors in one `sendmsg`; at most [`MAX_FDS`] (SCM_MAX_FD) ride one
//! message, so a longer list goes in several (`more: true` on all but the
//! last). New kinds (such as open tunnels at an upgrade) are new variants;
//! a kind a peer does not know is answered with [`Message::Refused`].

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};

use crate::home::Home;

/// The version of the messages this build writes.
pub const VERSION: u32 = 1;

/// The most descriptors one message carries (SCM_MAX_FD on Linux).
pub const MAX_FDS: usize = 253;

/// The longest message accepted, in bytes.
const MAX_MESSAGE: usize = 1 << 20;

/// How long one exchange may wait on the other side.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// Listening sockets by the host and port the table names them with.
pub type Sockets = HashMap<(String, u16), std::net::TcpListener>;

/// One message on `handover.sock`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Message {
    /// "Send me your listening sockets" (a daemon that restarted).
    Ask,
    /// Listening sockets, one descriptor per name, in order. From the
    /// daemon it is the whole set the load balancer is to listen on: a
    /// socket it had and is not in it is closed.
    Listeners {
        /// `(host, port)` of each descriptor.
        sockets: Vec<(String, u16)>,
        /// More `Listeners` messages follow (the set is longer than
        /// [`MAX_FDS`]).
        #[serde(default)]
        more: bool,
    },
    /// "I am stopping: my open WebSocket tunnels follow" (a load balancer
    /// to the newer one that bound `handover.sock` after it); answered by
    /// `Ack`, then the tunnels come in frames of their own
    /// (`tunnel_handover.rs`).
    Tunnels {
        /// The version of those frames.
        version: u32,
    },
    /// The sockets were taken in, by the process with this PID.
    Ack {
        /// The load balancer's PID, so the daemon knows who took them.
        pid: u32,
    },
    /// The message was not understood or not allowed.
    Refused {
        /// Why.
        reason: String,
    },
}

/// A message with its version, as written on the wire.
#[derive(Serialize, Deserialize)]
struct Envelope {
    /// [`VERSION`] of the writer.
    v: u32,
    /// The message itself.
    #[serde(flatten)]
    message: Message,
}

/// `proxy/handover.sock`.
pub fn path(home: &Home) -> PathBuf {
    home.proxy_dir().join("handover.sock")
}

/// Sends one message with its descriptors (at most [`MAX_FDS`]).
pub fn send(stream: &impl AsRawFd, message: &Message, fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} descriptors in one message", fds.len())));
    }
    let mut payload = serde_json::to_vec(&Envelope { v: VERSION, message: message.clone() }).map_err(io::Error::other)?;
    payload.push(b'\n');
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    let mut sent = sendmsg::<()>(stream.as_raw_fd(), &[IoSlice::new(&payload)], cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    // The descriptors went with the first bytes; the rest of a long
    // message follows plainly.
    while sent < payload.len() {
        sent += sendmsg::<()>(stream.as_raw_fd(), &[IoSlice::new(&payload[sent..])], &[], MsgFlags::MSG_NOSIGNAL, None)?;
    }
    Ok(())
}

/// What [`receive`] read: a message of this version or a load balancer's
/// version-0 list, with the descriptors that came with it.
pub enum Received {
    /// A versioned message.
    Message(Message, Vec<OwnedFd>),
    /// A bare `[[host, port], …]` from a load balancer of an older build.
    Legacy(Vec<(String, u16)>, Vec<OwnedFd>),
}

/// Reads one message (up to its newline, or to the end for version 0)
/// and every descriptor sent with it. The descriptors are CLOEXEC.
pub fn receive(stream: &UnixStream) -> io::Result<Received> {
    let mut text = Vec::new();
    let mut fds = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let mut control = nix::cmsg_space!([RawFd; MAX_FDS]);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut control), MsgFlags::MSG_CMSG_CLOEXEC)?;
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(got) = c {
                // SAFETY: each SCM_RIGHTS descriptor is new to this process
                // and owned here at once, so none leaks whatever comes next.
                fds.extend(got.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "descriptors were cut off"));
        }
        let n = msg.bytes;
        text.extend_from_slice(&buf[..n]);
        if n == 0 || text.contains(&b'\n') {
            break;
        }
        if text.len() > MAX_MESSAGE {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "message too long"));
        }
    }
    let line = text.split(|b| *b == b'\n').next().unwrap_or_default();
    let bad = |e: serde_json::Error| io::Error::new(io::ErrorKind::InvalidData, e);
    if line.first() == Some(&b'[') {
        return Ok(Received::Legacy(serde_json::from_slice(line).map_err(bad)?, fds));
    }
    let env: Envelope = serde_json::from_slice(line).map_err(bad)?;
    Ok(Received::Message(env.message, fds))
}

/// Sends listening sockets (host, port, descriptor), in as many messages
/// as [`MAX_FDS`] needs. The caller keeps the descriptors open until this
/// returns.
pub fn send_listeners(stream: &impl AsRawFd, held: &[(String, u16, RawFd)]) -> io::Result<()> {
    let mut chunks: Vec<&[(String, u16, RawFd)]> = held.chunks(MAX_FDS).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let sockets = chunk.iter().map(|(h, p, _)| (h.clone(), *p)).collect();
        let fds: Vec<RawFd> = chunk.iter().map(|(_, _, fd)| *fd).collect();
        send(stream, &Message::Listeners { sockets, more: i != last }, &fds)?;
    }
    Ok(())
}

/// Reads a whole set of listening sockets, the first `Listeners` message
/// already in hand.
pub fn receive_listeners(stream: &UnixStream, first: Received) -> io::Result<Sockets> {
    let mut out = Sockets::new();
    let mut next = Some(first);
    while let Some(received) = next.take() {
        let (names, fds, more) = match received {
            Received::Legacy(names, fds) => (names, fds, false),
            Received::Message(Message::Listeners { sockets, more }, fds) => (sockets, fds, more),
            Received::Message(Message::Refused { reason }, _) => return Err(io::Error::other(format!("refused: {reason}"))),
            Received::Message(other, _) => {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("expected listeners, got {other:?}")))
            }
        };
        if names.len() != fds.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{} names for {} sockets", names.len(), fds.len())));
        }
        out.extend(names.into_iter().zip(fds.into_iter().map(std::net::TcpListener::from)));
        if more {
            next = Some(receive(stream)?);
        }
    }
    Ok(out)
}

/// Connects to a load balancer's `handover.sock`, with [`TIMEOUT`] on
/// every read and write.
pub fn connect(path: &Path) -> io::Result<UnixStream> {
    let stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    Ok(stream)
}

/// Asks the load balancer serving `path` for its listening sockets (this
/// build's or an older one's).
pub fn ask(path: &Path) -> io::Result<Sockets> {
    let stream = connect(path)?;
    // An older load balancer sends without reading; it closes the
    // connection after, so this write may find it gone.
    let _ = send(&stream, &Message::Ask, &[]);
    let first = receive(&stream)?;
    receive_listeners(&stream, first)
}

/// Gives the load balancer serving `path` the whole set of listening
/// sockets it is to listen on; returns its PID from its answer.
pub fn give(path: &Path, held: &[(String, u16, RawFd)]) -> io::Result<u32> {
    let stream = connect(path)?;
    send_listeners(&stream, held)?;
    match receive(&stream)? {
        Received::Message(Message::Ack { pid }, _) => Ok(pid),
        Received::Message(Message::Refused { reason }, _) => Err(io::Error::other(format!("refused: {reason}"))),
        _ => Err(io::Error::new(io::ErrorKind::InvalidData, "no acknowledgement")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_sockets_cross_a_unix_socket_both_ways() {
        let (a, b) = UnixStream::pair().unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = tcp.local_addr().unwrap().port();
        send_listeners(&a, &[("127.0.0.1".to_string(), port, tcp.as_raw_fd())]).unwrap();
        let first = receive(&b).unwrap();
        let got = receive_listeners(&b, first).unwrap();
        let got = got.get(&("127.0.0.1".to_string(), port)).expect("the socket came over");
        assert_eq!(got.local_addr().unwrap().port(), port);
        // The same socket: a connection made now is accepted on the copy.
        drop(tcp);
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        assert!(got.accept().is_ok());
    }

    #[test]
    fn a_long_set_goes_in_batches_and_an_older_list_is_read() {
        let (a, b) = UnixStream::pair().unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let held: Vec<(String, u16, RawFd)> = (0..300u16).map(|i| (format!("h{i}"), i, tcp.as_raw_fd())).collect();
        let writer = std::thread::spawn(move || send_listeners(&a, &held).map(|()| a));
        let first = receive(&b).unwrap();
        let got = receive_listeners(&b, first).unwrap();
        assert_eq!(got.len(), 300);
        let a = writer.join().unwrap().unwrap();
        // Version 0: a bare list, no newline, then the end.
        let payload = serde_json::to_vec(&[("127.0.0.1", 8080u16)]).unwrap();
        let fds = [tcp.as_raw_fd()];
        sendmsg::<()>(a.as_raw_fd(), &[IoSlice::new(&payload)], &[ControlMessage::ScmRights(&fds)], MsgFlags::empty(), None).unwrap();
        drop(a);
        let old = receive_listeners(&b, receive(&b).unwrap()).unwrap();
        assert!(old.contains_key(&("127.0.0.1".to_string(), 8080)));
    }

    #[test]
    fn messages_carry_their_version_and_kind() {
        let text = serde_json::to_string(&Envelope { v: VERSION, message: Message::Ack { pid: 7 } }).unwrap();
        assert_eq!(text, r#"{"v":1,"kind":"ack","pid":7}"#);
        let unknown = serde_json::from_str::<Envelope>(r#"{"v":2,"kind":"tunnels","x":1}"#);
        assert!(unknown.is_err(), "an unknown kind is an error the receiver answers with Refused");
    }
}
