//! Sending one request to one copy: on an idle pooled connection when there
//! is one, else on a new connection; and what a failed send leaves, so the
//! caller can send the request again, to the same copy or another.

use std::io;
use std::net::Ipv4Addr;
use std::time::Duration;

use hyper::http::request;
use hyper::Response;

use crate::proxy::copies::answer::{self, AnswerBody};
use crate::proxy::copies::copy_conn::{self, CopyConn, UpBody};
use crate::proxy::copies::copy_state::CopyState;
use crate::proxy::copies::lease::Lease;
use crate::proxy::copies::table::LiveCopy;
use crate::proxy::visitors::caps;
use crate::sys::clock::mono_ms;

/// A connection to a copy that is refused or times out within this marks
/// the copy down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// What a failed send leaves.
pub enum Failure {
    /// The copy refused the connection, reset it or did not accept it in
    /// time; the request was not sent, and its body comes back.
    Refused(UpBody, io::Error),
    /// The load balancer itself could not open a connection (out of
    /// descriptors, buffers, memory, local ports): no copy is at fault.
    Local(io::Error),
    /// The request was sent (maybe in part) and no answer came.
    Lost(io::Error),
    /// The request was sent and the copy's process began to exit before
    /// answering (`liveness.rs`): lost to a copy that died, known before
    /// its sockets close.
    Ending,
}

/// Why [`exchange`] got no answer.
enum Unanswered {
    /// The request was never written (the connection had closed): its body
    /// comes back.
    Unsent(UpBody, io::Error),
    /// The request was sent (maybe in part) and the connection broke.
    Broke(io::Error),
    /// The copy's process began to exit while the request waited.
    Ending,
}

/// What kind of request a send carries, for how its answer is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A WebSocket handshake: always on a new connection, whose socket the
    /// copy's 101 hands over.
    Upgrade,
    /// A request sent again to another copy when it is lost (`retry.rs`):
    /// its answer, when short (`answer::HOLD_MAX`), is read whole before the
    /// visitor gets any of it, so a copy that dies mid-answer loses the
    /// request rather than cutting its answer short.
    Resendable,
    /// Any other request: its answer streams as it comes.
    Once,
}

/// A sent request's answer, with the lease it holds.
pub struct Sent {
    /// The copy's answer, its body not yet read.
    pub resp: Response<AnswerBody>,
    /// Counts the request against the copy until the body is read.
    pub lease: Lease,
}

/// Sends the request (`parts`, kept by the caller for another send, and
/// `body`) to a copy: on an idle pooled connection when there is one (a
/// WebSocket always gets a new one), else on a new connection.
pub async fn send(copy: &LiveCopy, parts: &request::Parts, mut body: UpBody, kind: Kind) -> Result<Sent, Failure> {
    let lease = Lease::new(copy.state.clone());
    if kind != Kind::Upgrade {
        while let Some(conn) = copy.state.pool.take() {
            match exchange(&copy.state, conn, parts, body, kind).await {
                Ok(resp) => return Ok(Sent { resp, lease }),
                // Never written: the connection had closed. Try another.
                Err(Unanswered::Unsent(back, _)) => body = back,
                Err(Unanswered::Broke(e)) => return Err(Failure::Lost(e)),
                Err(Unanswered::Ending) => return Err(Failure::Ending),
            }
        }
    }
    let connect = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, copy.port));
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) if blames_copy(&e) => return Err(Failure::Refused(body, e)),
        Ok(Err(e)) => return Err(Failure::Local(e)),
        Err(_) => return Err(Failure::Refused(body, io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))),
    };
    let _ = stream.set_nodelay(true);
    // A copy that dies without a word (its machine side, a frozen process
    // under a WebSocket) is found by keepalive, never by a quiet spell.
    caps::watch_socket(&stream);
    match exchange(&copy.state, CopyConn::new(stream), parts, body, kind).await {
        Ok(resp) => Ok(Sent { resp, lease }),
        // Accepted, then closed before a byte was written: a copy on its
        // way out is as good as one that refuses.
        Err(Unanswered::Unsent(back, e)) => Err(Failure::Refused(back, e)),
        Err(Unanswered::Broke(e)) => Err(Failure::Lost(e)),
        Err(Unanswered::Ending) => Err(Failure::Ending),
    }
}

/// Sends `req` on `conn`, counted as waiting for the copy's answer until
/// its head comes (with a [`Kind::Resendable`] request's short body, read
/// whole), so a copy that answers nothing shows (`stall.rs`). A
/// request never written is not counted; one lost, or abandoned by its
/// visitor, counts as unanswered. Given up on the moment the copy's process
/// begins to exit, which is tens of milliseconds before its sockets close;
/// an answer that came first is taken.
async fn exchange(
    state: &CopyState,
    conn: CopyConn,
    parts: &request::Parts,
    body: UpBody,
    kind: Kind,
) -> Result<Response<AnswerBody>, Unanswered> {
    let started = state.sent(mono_ms());
    let mut waiting = Waiting { state, done: false };
    let sent = tokio::select! {
        biased;
        sent = async {
            let (head, conn) = conn.round_trip(parts, body).await?;
            let mut resp = answer::response(head, conn).map_err(copy_conn::Unanswered::Broke)?;
            if kind == Kind::Resendable {
                resp.body_mut().read_whole().await.map_err(copy_conn::Unanswered::Broke)?;
            }
            Ok(resp)
        } => Some(sent),
        () = state.gone_now() => None,
    };
    waiting.done = true;
    match sent {
        Some(Ok(resp)) => {
            state.done(true, mono_ms());
            Ok(resp)
        }
        Some(Err(copy_conn::Unanswered::Unsent(back, e))) => {
            state.unsent(started);
            Err(Unanswered::Unsent(back, e))
        }
        Some(Err(copy_conn::Unanswered::Broke(e))) => {
            state.done(false, mono_ms());
            Err(Unanswered::Broke(e))
        }
        None => {
            state.done(false, mono_ms());
            Err(Unanswered::Ending)
        }
    }
}

/// A request handed to a copy's connection, until [`exchange`] knows what
/// became of it; dropped before that, the visitor gave up unanswered.
struct Waiting<'a> {
    /// The copy's state.
    state: &'a CopyState,
    /// Counted as done already.
    done: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.state.done(false, mono_ms());
        }
    }
}

/// True when the copy's process `pid` is gone (or a zombie) within a
/// moment: a connection that broke mid-request and a process that ended
/// with it make a copy death. The process closes its sockets on its way
/// out, before it has exited, so it is given a little time to finish
/// dying: waited for on a pidfd, which is readable the moment it has (a
/// poll of `/proc` every 20 ms cost up to 20 ms of a failover), else
/// `/proc` is polled.
pub async fn died(pid: u32) -> bool {
    if !running(pid) {
        return true;
    }
    if let Ok(fd) = crate::sys::pidfd::Pidfd::open(pid, None) {
        // SAFETY: the AsyncFd owns the OwnedFd, which stays open and the
        // same until the AsyncFd drops (as in liveness.rs).
        if let Ok(afd) = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd.fd, tokio::io::Interest::READABLE) } {
            return tokio::time::timeout(DYING_WAIT, afd.readable()).await.is_ok() || !running(pid);
        }
    }
    let deadline = tokio::time::Instant::now() + DYING_WAIT;
    loop {
        if !running(pid) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How long a copy whose connection broke mid-request may take to exit
/// for the break to count as its death.
const DYING_WAIT: Duration = Duration::from_millis(250);

/// True while `/proc/<pid>` is a process that has not exited.
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command, which is in parentheses and may
        // hold anything: read after the last ')'.
        Ok(stat) => stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()).is_some_and(|s| s != 'Z' && s != 'X'),
        Err(_) => false,
    }
}

/// True when a failed connect is the copy's doing (refused, reset, timed
/// out, aborted): only that marks a copy down. Anything else, such as
/// EMFILE or ENOBUFS, is the load balancer's own trouble.
fn blames_copy(e: &io::Error) -> bool {
    !caps::is_local(e)
        && matches!(
            e.kind(),
            io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::TimedOut
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_is_told_from_a_gone_one() {
        assert!(running(std::process::id()));
        assert!(!running(u32::MAX - 1));
    }

    #[test]
    fn only_a_refusal_reset_or_timeout_blames_the_copy() {
        for errno in [libc::ECONNREFUSED, libc::ECONNRESET, libc::ETIMEDOUT, libc::ECONNABORTED] {
            assert!(blames_copy(&io::Error::from_raw_os_error(errno)), "errno {errno}");
        }
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM, libc::EADDRNOTAVAIL, libc::EACCES] {
            assert!(!blames_copy(&io::Error::from_raw_os_error(errno)), "errno {errno}");
        }
    }
}
