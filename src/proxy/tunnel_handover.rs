//! Open WebSocket sessions outlive an upgrade of the load balancer. As it
//! stops, a load balancer that finds a newer one serving
//! `proxy/handover.sock` takes its tunnels out of the pump (each stops
//! reading first, so no byte is lost or sent twice) and sends them there;
//! the new one adopts them into its pump and counts them as sessions of
//! their copies.
//!
//! On the handover socket, the old one announces them (the handover
//! message of kind `tunnels`, answered by `ack`); then come frames, each `u32` (little-endian) header length, the
//! header (JSON: `{"kind": "tunnels", "version": 1, "tunnels": [{"app",
//! "copy", "up", "down", "up_eof", "down_eof"}, …]}`), then each tunnel's
//! pending bytes, visitor-to-copy (`up` bytes) then copy-to-visitor
//! (`down`); each frame carries, by SCM_RIGHTS, each tunnel's visitor and
//! copy sockets in that order, at most [`PER_FRAME`] tunnels so within
//! SCM_MAX_FD (253). The sender closes the stream after its last frame.
//!
//! A load balancer of a build without this ends its sessions when it stops,
//! as before; one that receives a kind or version it does not know closes
//! what came with it.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};
use tokio::io::Interest;
use tokio::net::UnixStream;

use crate::proxy::copies::copy_state::CopyState;
use crate::proxy::shared::BalancerState;
use crate::proxy::tunnels::pump::Session;
use crate::proxy::tunnels::pump::{Direction, Tunnel};
use crate::wire::handover::{self, Message, Received};

/// The message's kind.
pub const KIND: &str = "tunnels";
/// The message's version.
pub const VERSION: u32 = 1;
/// Tunnels per frame: two descriptors each, within SCM_MAX_FD (253).
pub const PER_FRAME: usize = 126;
const _: () = assert!(PER_FRAME * 2 <= 253);
/// How long tunnels may take to stop at their next wait.
const TAKE_WAIT: Duration = Duration::from_secs(1);
/// How long a tunnel handed over waits for a table that names its copy.
const TABLE_WAIT: Duration = Duration::from_secs(10);
/// The longest wait for the next piece of a message.
const READ_WAIT: Duration = Duration::from_secs(10);
/// The largest header and the largest pending bytes of one direction
/// accepted (the pump keeps at most one read's worth, 16 KiB).
const MAX_PART: usize = 1 << 20;

/// One frame's header.
#[derive(Serialize, Deserialize)]
struct Header {
    kind: String,
    version: u32,
    tunnels: Vec<Entry>,
}

/// One tunnel in a frame.
#[derive(Serialize, Deserialize)]
struct Entry {
    app: String,
    copy: u32,
    /// Pending bytes from the visitor to the copy.
    up: usize,
    /// Pending bytes from the copy to the visitor.
    down: usize,
    /// The visitor has closed its sending half.
    up_eof: bool,
    /// The copy has closed its sending half.
    down_eof: bool,
}

/// What one load balancer handed to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handed {
    /// Open WebSocket tunnels.
    pub tunnels: usize,
    /// Bytes they had read and not yet written, both ways.
    pub pending_bytes: usize,
}

impl Handed {
    /// The count of `tunnels`.
    pub fn of(tunnels: &[Tunnel]) -> Handed {
        Handed { tunnels: tunnels.len(), pending_bytes: tunnels.iter().map(|t| t.up.pending.len() + t.down.pending.len()).sum() }
    }
}

/// As this load balancer stops: when a newer one serves `path` (not our
/// own socket, inode `own_ino`), takes every tunnel out of the pump and
/// sends them there. Without one, the tunnels stay and end with us.
pub async fn pass_on(path: &Path, own_ino: u64, shared: &BalancerState) {
    if std::fs::metadata(path).map_or(true, |m| m.ino() == own_ino) || shared.pump.live() == 0 {
        return;
    }
    let path = path.to_path_buf();
    let announced = tokio::task::spawn_blocking(move || announce(&path)).await.map_err(io::Error::other);
    let stream = match announced.and_then(|r| r).and_then(|s| s.set_nonblocking(true).and_then(|()| UnixStream::from_std(s))) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("the new load balancer does not take the open WebSocket sessions ({e}); they end");
            return;
        }
    };
    let tunnels = shared.pump.take_all(TAKE_WAIT).await;
    let Handed { tunnels: count, pending_bytes } = Handed::of(&tunnels);
    if let Err(e) = send(&stream, tunnels, PER_FRAME).await {
        tracing::warn!("cannot hand the open WebSocket sessions over: {e}; those not sent end");
        return;
    }
    // The new one closes its end once it has read everything: that is the
    // acknowledgement. Anything else it sends is read and closed.
    let mut reader = Reader { stream, bytes: Vec::new(), fds: VecDeque::new(), eof: false };
    let closed = async {
        tokio::io::AsyncWriteExt::shutdown(&mut reader.stream).await?;
        while !reader.eof {
            reader.bytes.clear();
            reader.fds.clear();
            reader.read_some().await?;
        }
        io::Result::Ok(())
    };
    match tokio::time::timeout(READ_WAIT, closed).await {
        Ok(Ok(())) => tracing::info!("handed {count} open WebSocket sessions to the new load balancer ({pending_bytes} bytes in flight)"),
        Ok(Err(e)) => tracing::warn!("sent {count} open WebSocket sessions to the new load balancer, unacknowledged: {e}"),
        Err(_) => tracing::warn!("sent {count} open WebSocket sessions to the new load balancer, unacknowledged within {READ_WAIT:?}"),
    }
}

/// Tells the load balancer serving `path` that tunnels follow
/// ([`Message::Tunnels`]) and waits for its `Ack`.
fn announce(path: &Path) -> io::Result<std::os::unix::net::UnixStream> {
    let stream = handover::connect(path)?;
    handover::send(&stream, &Message::Tunnels { version: VERSION }, &[])?;
    match handover::receive(&stream)? {
        Received::Message(Message::Ack { .. }, _) => Ok(stream),
        Received::Message(Message::Refused { reason }, _) => Err(io::Error::other(format!("refused: {reason}"))),
        _ => Err(invalid("an answer that is not an acknowledgement")),
    }
}

/// Reads the tunnels a load balancer sends on `stream` (accepted on our
/// handover socket) until it closes, and adopts them.
pub async fn take_in(stream: UnixStream, shared: Arc<BalancerState>) {
    let mut reader = Reader { stream, bytes: Vec::new(), fds: VecDeque::new(), eof: false };
    let mut adopted = 0;
    loop {
        match reader.frame().await {
            Ok(Some(tunnels)) => {
                for t in tunnels {
                    // Spread over the workers in turn (a tunnel is not one of
                    // the connections a worker counts).
                    tokio::spawn(adopt(shared.clone(), t, adopted));
                    adopted += 1;
                }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::warn!("a handover of open WebSocket sessions failed: {e}; those not read end");
                break;
            }
        }
    }
    if adopted > 0 {
        tracing::info!("adopted {adopted} open WebSocket sessions from the previous load balancer");
    }
}

/// Puts the `nth` tunnel handed over into the pump, on worker `nth` modulo
/// their number, counted as a session of its copy. A new daemon's first
/// table may not name the copies yet (it adopts them a moment later): the
/// tunnel waits for a table that does, up to [`TABLE_WAIT`], and is then
/// carried uncounted.
async fn adopt(shared: Arc<BalancerState>, tunnel: Tunnel, nth: usize) {
    let deadline = tokio::time::Instant::now() + TABLE_WAIT;
    let state = loop {
        let mut changes = shared.table.subscribe();
        let table = shared.table.load();
        let found = table.apps.iter().find(|a| a.name == tunnel.app).and_then(|a| a.copies.iter().find(|c| c.copy == tunnel.copy_number));
        if let Some(c) = found {
            break c.state.clone();
        }
        if tokio::time::timeout_at(deadline, changes.changed()).await.map_or(true, |r| r.is_err()) {
            tracing::info!(app = %tunnel.app, copy = tunnel.copy_number, "a WebSocket handed over for a copy not in the table; carried uncounted");
            break Arc::new(CopyState::default());
        }
    };
    let Some(worker) = shared.workers.get(nth % shared.workers.len().max(1)) else { return };
    let counters = shared.requests.of(&tunnel.app);
    shared.pump.adopt(tunnel, Session::new(state, Some(counters)), &worker.handle);
}

/// Sends `tunnels` on `stream`, `per_frame` in each frame, and closes them
/// here (the descriptors in flight keep the sockets open).
pub async fn send(stream: &UnixStream, tunnels: Vec<Tunnel>, per_frame: usize) -> io::Result<()> {
    let mut rest = tunnels.into_iter().peekable();
    while rest.peek().is_some() {
        let frame: Vec<Tunnel> = rest.by_ref().take(per_frame.clamp(1, PER_FRAME)).collect();
        let (bytes, fds) = encode(&frame)?;
        send_frame(stream, &bytes, &fds).await?;
    }
    Ok(())
}

/// A frame's bytes and descriptors.
fn encode(frame: &[Tunnel]) -> io::Result<(Vec<u8>, Vec<RawFd>)> {
    let tunnels = frame
        .iter()
        .map(|t| Entry {
            app: t.app.clone(),
            copy: t.copy_number,
            up: t.up.pending.len(),
            down: t.down.pending.len(),
            up_eof: t.up.eof,
            down_eof: t.down.eof,
        })
        .collect();
    let header = serde_json::to_vec(&Header { kind: KIND.into(), version: VERSION, tunnels }).map_err(io::Error::other)?;
    let mut bytes = Vec::with_capacity(4 + header.len());
    bytes.extend_from_slice(&(header.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&header);
    for t in frame {
        bytes.extend_from_slice(&t.up.pending);
        bytes.extend_from_slice(&t.down.pending);
    }
    let fds = frame.iter().flat_map(|t| [t.visitor.as_raw_fd(), t.copy.as_raw_fd()]).collect();
    Ok((bytes, fds))
}

/// Writes one frame, its descriptors with its first bytes.
async fn send_frame(stream: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut sent = 0;
    while sent < bytes.len() {
        stream.writable().await?;
        let rights = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if sent == 0 && !fds.is_empty() { &rights } else { &[] };
        let part = [IoSlice::new(&bytes[sent..])];
        match stream.try_io(Interest::WRITABLE, || {
            sendmsg::<()>(stream.as_raw_fd(), &part, cmsgs, MsgFlags::MSG_NOSIGNAL, None).map_err(io::Error::from)
        }) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The receiving end: bytes and descriptors as they come, in order.
struct Reader {
    stream: UnixStream,
    /// Bytes read and not yet taken.
    bytes: Vec<u8>,
    /// Descriptors received and not yet given to a tunnel.
    fds: VecDeque<OwnedFd>,
    /// The sender has closed.
    eof: bool,
}

impl Reader {
    /// The next frame's tunnels; `None` when the sender closed between frames.
    async fn frame(&mut self) -> io::Result<Option<Vec<Tunnel>>> {
        if !self.fill_to(4).await? {
            return if self.bytes.is_empty() { Ok(None) } else { Err(invalid("a frame cut short")) };
        }
        let len = u32::from_le_bytes([self.bytes[0], self.bytes[1], self.bytes[2], self.bytes[3]]) as usize;
        if len > MAX_PART {
            return Err(invalid("a frame header too large"));
        }
        self.take(4).await?;
        let header: Header = serde_json::from_slice(&self.take(len).await?).map_err(|e| invalid(&format!("a frame header: {e}")))?;
        if header.kind != KIND || header.version != VERSION {
            return Err(invalid(&format!(
                "a message of kind {:?} version {} (this build reads {KIND:?} version {VERSION})",
                header.kind, header.version
            )));
        }
        let mut tunnels = Vec::with_capacity(header.tunnels.len());
        for e in header.tunnels {
            if e.up > MAX_PART || e.down > MAX_PART {
                return Err(invalid("pending bytes too large"));
            }
            let up = self.take(e.up).await?;
            let down = self.take(e.down).await?;
            let (Some(visitor), Some(copy)) = (self.fds.pop_front(), self.fds.pop_front()) else {
                return Err(invalid("fewer sockets than tunnels"));
            };
            let visitor = std::net::TcpStream::from(visitor);
            let copy = std::net::TcpStream::from(copy);
            tunnels.push(Tunnel {
                visitor,
                copy,
                up: Direction::new(up, e.up_eof),
                down: Direction::new(down, e.down_eof),
                app: e.app,
                copy_number: e.copy,
            });
        }
        Ok(Some(tunnels))
    }

    /// The next `n` bytes.
    async fn take(&mut self, n: usize) -> io::Result<Vec<u8>> {
        if !self.fill_to(n).await? {
            return Err(invalid("a frame cut short"));
        }
        let rest = self.bytes.split_off(n);
        Ok(std::mem::replace(&mut self.bytes, rest))
    }

    /// Reads until `n` bytes are held; false when the sender closed first.
    async fn fill_to(&mut self, n: usize) -> io::Result<bool> {
        while self.bytes.len() < n && !self.eof {
            tokio::time::timeout(READ_WAIT, self.read_some()).await.map_err(|_| invalid("the sender stalled"))??;
        }
        Ok(self.bytes.len() >= n)
    }

    /// One recvmsg: the bytes it brings, and its descriptors.
    async fn read_some(&mut self) -> io::Result<()> {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            self.stream.readable().await?;
            let fd = self.stream.as_raw_fd();
            let got = self.stream.try_io(Interest::READABLE, || {
                let mut control = nix::cmsg_space!([RawFd; 253]);
                let mut iov = [IoSliceMut::new(&mut chunk)];
                let msg = recvmsg::<()>(fd, &mut iov, Some(&mut control), MsgFlags::MSG_CMSG_CLOEXEC).map_err(io::Error::from)?;
                let mut fds = Vec::new();
                for c in msg.cmsgs().map_err(io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(received) = c {
                        // SAFETY: each SCM_RIGHTS descriptor is new to this
                        // process and owned here at once.
                        fds.extend(received.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                    }
                }
                Ok((msg.bytes, fds, msg.flags.contains(MsgFlags::MSG_CTRUNC)))
            });
            match got {
                Ok((n, fds, truncated)) => {
                    self.fds.extend(fds);
                    if truncated {
                        return Err(invalid("descriptors were cut off"));
                    }
                    self.eof = n == 0;
                    self.bytes.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A connected pair of TCP sockets: (ours, the peer's).
    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (ours, l.accept().unwrap().0)
    }

    #[tokio::test]
    async fn tunnels_cross_in_frames_with_their_sockets_and_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut peers = Vec::new();
        let mut tunnels = Vec::new();
        for i in 0..5u8 {
            let (visitor, visitor_peer) = pair();
            let (copy, copy_peer) = pair();
            peers.push((visitor_peer, copy_peer));
            let up = Direction::new(vec![i; i as usize * 1000], false);
            let down = Direction::new(vec![i + 100; 7], i == 3);
            tunnels.push(Tunnel { visitor, copy, up, down, app: format!("app{i}"), copy_number: u32::from(i) });
        }
        let sender = tokio::spawn(async move {
            send(&a, tunnels, 2).await.unwrap();
        });
        let mut reader = Reader { stream: b, bytes: Vec::new(), fds: VecDeque::new(), eof: false };
        let mut got = Vec::new();
        let mut frames = 0;
        while let Some(batch) = reader.frame().await.unwrap() {
            assert!(batch.len() <= 2, "two tunnels a frame");
            frames += 1;
            got.extend(batch);
        }
        sender.await.unwrap();
        assert_eq!(frames, 3);
        assert_eq!(got.len(), 5);
        for (i, (t, (visitor_peer, copy_peer))) in got.into_iter().zip(peers.iter_mut()).enumerate() {
            let i = i as u8;
            assert_eq!((t.app.as_str(), t.copy_number), (format!("app{i}").as_str(), u32::from(i)));
            assert_eq!(t.up, Direction::new(vec![i; i as usize * 1000], false));
            assert_eq!(t.down, Direction::new(vec![i + 100; 7], i == 3));
            // The very sockets: what is written on them reaches their peers.
            (&t.visitor).write_all(&[i]).unwrap();
            (&t.copy).write_all(&[i + 1]).unwrap();
            let mut one = [0u8; 1];
            visitor_peer.read_exact(&mut one).unwrap();
            assert_eq!(one[0], i);
            copy_peer.read_exact(&mut one).unwrap();
            assert_eq!(one[0], i + 1);
        }
    }

    #[tokio::test]
    async fn a_message_of_another_version_is_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        let header = br#"{"kind":"tunnels","version":2,"tunnels":[]}"#;
        let mut bytes = (header.len() as u32).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        send_frame(&a, &bytes, &[]).await.unwrap();
        drop(a);
        let mut reader = Reader { stream: b, bytes: Vec::new(), fds: VecDeque::new(), eof: false };
        let e = reader.frame().await.unwrap_err();
        assert!(e.to_string().contains("version 2"), "{e}");
    }
}
