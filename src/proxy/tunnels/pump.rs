//! The WebSocket pump: the raw sockets of open tunnels, moved by readiness.
//! An idle tunnel holds its two sockets and no buffer; when one side can be
//! read, its bytes go through the worker thread's one buffer straight to
//! the other side, and only what the other side cannot take at once is
//! kept with the tunnel until it can. So 1,000 idle Shiny sessions cost
//! the load balancer a few hundred bytes each instead of two copy buffers.
//!
//! A tunnel can be taken out whole ([`Pump::take_all`]): it stops at its
//! next wait, never between a read and the write that follows, and comes
//! out as a [`Tunnel`] (its sockets and the bytes read but not yet written
//! each way), which another load balancer adopts ([`Pump::adopt`]).

use std::cell::RefCell;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::proxy::copies::copy_state::CopyState;
use crate::proxy::counters::AppCounters;

/// One open WebSocket, counted on its copy (a connection and a session)
/// until dropped.
pub struct Session {
    /// The copy's counters.
    state: Arc<CopyState>,
    /// The app's counters, where the pump counts the session's bytes.
    pub app: Option<Arc<AppCounters>>,
}

impl Session {
    /// Counts a new session on the copy; its bytes go to `app`'s counters.
    pub fn new(state: Arc<CopyState>, app: Option<Arc<AppCounters>>) -> Session {
        state.session_opened();
        state.connections.fetch_add(1, Ordering::Relaxed);
        state.sessions.fetch_add(1, Ordering::Relaxed);
        Session { state, app }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.state.sessions.fetch_sub(1, Ordering::Relaxed);
        self.state.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Each worker thread's buffer: what one read moves at most.
const BUF_LEN: usize = 16 * 1024;
/// Reads and writes one tunnel makes before the worker's other tasks run.
const BUDGET: usize = 32;

thread_local! {
    /// The worker thread's buffer, borrowed only between a read and its
    /// write (never across a wait), so every tunnel of the thread shares it.
    static BUFFER: RefCell<Box<[u8]>> = RefCell::new(vec![0; BUF_LEN].into_boxed_slice());
}

/// One direction of a tunnel.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Direction {
    /// Bytes read from one side and not yet written to the other (empty,
    /// with nothing allocated, while the tunnel is idle).
    pub pending: Vec<u8>,
    /// The side it reads from has closed its sending half.
    pub eof: bool,
    /// That close has been passed on (the other side's sending half shut).
    shut: bool,
}

impl Direction {
    /// A direction with `pending` bytes still to write and the reading
    /// side closed or not.
    pub fn new(pending: Vec<u8>, eof: bool) -> Direction {
        Direction { pending, eof, shut: false }
    }
}

/// An open tunnel outside the pump, as it is handed over.
#[derive(Debug)]
pub struct Tunnel {
    /// The visitor's connection.
    pub visitor: std::net::TcpStream,
    /// The connection to the copy.
    pub copy: std::net::TcpStream,
    /// From the visitor to the copy.
    pub up: Direction,
    /// From the copy to the visitor.
    pub down: Direction,
    /// The app the session belongs to.
    pub app: String,
    /// The copy that holds the session.
    pub copy_number: u32,
}

/// The tunnels of one load balancer.
pub struct Pump {
    /// Turns true when every tunnel is to be taken out; stays true (a load
    /// balancer hands its tunnels over once, as it stops).
    take: watch::Sender<bool>,
    /// Tunnels taken out, until collected.
    taken: Mutex<Vec<Tunnel>>,
    /// Tunnels being pumped, or about to be (an upgrade under way).
    live: AtomicUsize,
}

impl Default for Pump {
    fn default() -> Self {
        Pump { take: watch::Sender::new(false), taken: Mutex::new(Vec::new()), live: AtomicUsize::new(0) }
    }
}

/// A tunnel counted as live before its sockets are in the pump, so a take
/// waits for it; uncounted when dropped unused.
pub struct Slot(Arc<Pump>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Slot {
    /// Pumps the tunnel until it ends or is taken out.
    pub async fn run(self, mut live: Live, app: String, copy: u32, session: Session) {
        let mut take = self.0.take.subscribe();
        let end = loop {
            if *take.borrow_and_update() {
                break End::Taken;
            }
            let (visitor, copy_side) = match live.step(session.app.as_deref()) {
                Err(e) => break End::Failed(e),
                Ok(None) => break End::Closed,
                Ok(Some(wants)) => wants,
            };
            if visitor.is_none() && copy_side.is_none() {
                // Out of budget with more to move: let the worker's other
                // tasks run first.
                tokio::task::yield_now().await;
                continue;
            }
            tokio::select! {
                r = ready(&live.visitor, visitor) => if let Err(e) = r { break End::Failed(e) },
                r = ready(&live.copy, copy_side) => if let Err(e) = r { break End::Failed(e) },
                _ = changed(&mut take) => {}
            }
        };
        match end {
            End::Taken => match live.into_tunnel(app, copy) {
                Ok(t) => self.0.taken.lock().unwrap_or_else(|e| e.into_inner()).push(t),
                Err(e) => tracing::warn!("a WebSocket could not be taken out of the pump: {e}"),
            },
            // Either side may go away without a close handshake; that is
            // the end of a session, not a fault of ours.
            End::Failed(e) => tracing::debug!(app, copy, "WebSocket closed: {e}"),
            End::Closed => {}
        }
        drop(session);
    }
}

/// Why a tunnel left the pump.
enum End {
    /// Both sides closed.
    Closed,
    /// A read or write failed (a reset, a dead peer).
    Failed(io::Error),
    /// Taken out to be handed over.
    Taken,
}

impl Pump {
    /// Counts a tunnel about to come (its upgrade under way).
    pub fn slot(self: &Arc<Self>) -> Slot {
        self.live.fetch_add(1, Ordering::AcqRel);
        Slot(self.clone())
    }

    /// Tunnels being pumped (or about to be).
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Pumps a tunnel handed over by another load balancer, on the runtime
    /// `on` (a worker), counted as `session`.
    pub fn adopt(self: &Arc<Self>, tunnel: Tunnel, session: Session, on: &tokio::runtime::Handle) {
        let slot = self.slot();
        on.spawn(async move {
            let Tunnel { visitor, copy, up, down, app, copy_number } = tunnel;
            let sockets = visitor.set_nonblocking(true).and_then(|()| copy.set_nonblocking(true));
            match sockets.and_then(|()| Ok((TcpStream::from_std(visitor)?, TcpStream::from_std(copy)?))) {
                Ok((visitor, copy)) => slot.run(Live { visitor, copy, up, down }, app, copy_number, session).await,
                Err(e) => tracing::warn!(app, copy = copy_number, "cannot carry a WebSocket handed over: {e}"),
            }
        });
    }

    /// Takes every tunnel out: each stops at its next wait and comes back
    /// with what it had read and not yet written. Waits up to `within` for
    /// the tunnels still being set up or moving bytes.
    pub async fn take_all(&self, within: Duration) -> Vec<Tunnel> {
        self.take.send_replace(true);
        let deadline = tokio::time::Instant::now() + within;
        while self.live() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        std::mem::take(&mut *self.taken.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Waits until `s` is ready for `interest`; forever when there is none.
async fn ready(s: &TcpStream, interest: Option<Interest>) -> io::Result<()> {
    match interest {
        Some(i) => s.ready(i).await.map(drop),
        None => std::future::pending().await,
    }
}

/// Waits for the take signal to change; forever once it cannot.
async fn changed(take: &mut watch::Receiver<bool>) {
    if take.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A tunnel in the pump.
pub struct Live {
    /// The visitor's connection.
    pub visitor: TcpStream,
    /// The connection to the copy (acknowledged at once, see copies/copy_conn.rs).
    pub copy: TcpStream,
    /// From the visitor to the copy.
    pub up: Direction,
    /// From the copy to the visitor.
    pub down: Direction,
}

/// Where one direction stopped.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Flow {
    /// Its source has nothing to read now.
    Read,
    /// Its destination takes nothing more now.
    Write,
    /// Closed and passed on.
    Done,
    /// Out of budget with more to move.
    Budget,
}

impl Live {
    /// Moves what can be moved now, both ways. `None` once both ways are
    /// closed; else what to wait for on the visitor's and the copy's
    /// socket (neither: out of budget, go on after a yield). The bytes
    /// read from either side are counted into `counters`: the visitor's as
    /// bytes in, the copy's as bytes out.
    fn step(&mut self, counters: Option<&AppCounters>) -> io::Result<Option<(Option<Interest>, Option<Interest>)>> {
        let (up, down) = BUFFER.with_borrow_mut(|buf| -> io::Result<(Flow, Flow)> {
            let up = move_bytes(&self.visitor, &self.copy, &mut self.up, buf, false, counters.map(|c| (c, false)))?;
            let down = move_bytes(&self.copy, &self.visitor, &mut self.down, buf, true, counters.map(|c| (c, true)))?;
            Ok((up, down))
        })?;
        if up == Flow::Done && down == Flow::Done {
            return Ok(None);
        }
        if up == Flow::Budget || down == Flow::Budget {
            return Ok(Some((None, None)));
        }
        let visitor = join(up == Flow::Read, down == Flow::Write);
        let copy = join(down == Flow::Read, up == Flow::Write);
        Ok(Some((visitor, copy)))
    }

    /// The tunnel out of this runtime, as it is handed over.
    fn into_tunnel(self, app: String, copy_number: u32) -> io::Result<Tunnel> {
        Ok(Tunnel { visitor: self.visitor.into_std()?, copy: self.copy.into_std()?, up: self.up, down: self.down, app, copy_number })
    }
}

/// The interest of a socket that is waited on for reading, writing, both
/// or neither.
fn join(read: bool, write: bool) -> Option<Interest> {
    match (read, write) {
        (true, true) => Some(Interest::READABLE | Interest::WRITABLE),
        (true, false) => Some(Interest::READABLE),
        (false, true) => Some(Interest::WRITABLE),
        (false, false) => None,
    }
}

/// Moves bytes from `src` to `dst` until one of them would block, the
/// source is closed (and that is passed on), or the budget is spent.
/// `quickack`: the source is a copy, whose reads are acknowledged at once.
/// What is read is counted in `read` (one add per read, not per byte), as
/// bytes written to the visitor when its flag is set, else as read from it.
fn move_bytes(
    src: &TcpStream,
    dst: &TcpStream,
    way: &mut Direction,
    buf: &mut [u8],
    quickack: bool,
    read: Option<(&AppCounters, bool)>,
) -> io::Result<Flow> {
    for _ in 0..BUDGET {
        if !way.pending.is_empty() {
            match dst.try_write(&way.pending) {
                Ok(n) if n == way.pending.len() => way.pending = Vec::new(),
                Ok(n) => drop(way.pending.drain(..n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Flow::Write),
                Err(e) => return Err(e),
            }
            continue;
        }
        if way.eof {
            if !way.shut {
                // Best effort: a side already gone shows in its next read.
                let _ = socket2::SockRef::from(dst).shutdown(Shutdown::Write);
                way.shut = true;
            }
            return Ok(Flow::Done);
        }
        if quickack {
            // R writes a frame's parts apart; the kernel clears the flag by
            // itself, so it is set again around every read (copies/copy_conn.rs).
            let _ = socket2::SockRef::from(src).set_tcp_quickack(true);
        }
        match src.try_read(buf) {
            Ok(0) => way.eof = true,
            Ok(n) => {
                if let Some((counters, to_visitor)) = read {
                    counters.add_bytes(to_visitor, n as u64);
                }
                let written = match dst.try_write(&buf[..n]) {
                    Ok(w) => w,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                    Err(e) => return Err(e),
                };
                if written < n {
                    way.pending = buf[written..n].to_vec();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Flow::Read),
            Err(e) => return Err(e),
        }
    }
    Ok(Flow::Budget)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Two ends of a loopback connection.
    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let far = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        (l.accept().await.unwrap().0, far)
    }

    #[tokio::test]
    async fn the_bytes_a_tunnel_moves_are_counted_each_way() {
        let ((visitor, mut browser), (copy, mut r)) = (pair().await, pair().await);
        let mut live = Live { visitor, copy, up: Direction::default(), down: Direction::default() };
        let counters = AppCounters::default();
        browser.write_all(b"hello").await.unwrap();
        r.write_all(b"world!").await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let counted = || counters.bytes();
        while counted() != (5, 6) {
            assert!(std::time::Instant::now() < deadline, "counted {:?}", counted());
            live.step(Some(&counters)).unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (mut up, mut down) = ([0u8; 5], [0u8; 6]);
        r.read_exact(&mut up).await.unwrap();
        browser.read_exact(&mut down).await.unwrap();
        assert_eq!((&up, &down), (b"hello", b"world!"), "and moved");
    }
}
