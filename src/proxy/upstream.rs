//! Sending one request to one copy: on an idle pooled connection when there
//! is one, else on a new connection; and what a failed send leaves, so the
//! caller can send the request again, to the same copy or another.

use std::io;
use std::net::Ipv4Addr;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::http::request;
use hyper::{Method, Request, Response, Uri, Version};
use hyper_util::rt::TokioIo;

use super::body::Lease;
use super::quickack::QuickAck;
use super::pool::UpBody;
use super::shared::ErrorSource;
use super::table::LiveCopy;

/// A connection to a copy that is refused or times out within this marks
/// the copy down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long an idle pooled connection may take to say it is ready again.
const READY_WAIT: Duration = Duration::from_millis(200);

/// What a failed send leaves.
pub enum Failure {
    /// The copy could not be reached; the request was not sent and comes back.
    Refused(Box<Request<UpBody>>, io::Error),
    /// The request was sent (maybe in part) and no answer came.
    Lost(hyper::Error),
}

/// A sent request's answer, with the lease it holds.
pub struct Sent {
    /// The copy's answer, its body not yet read.
    pub resp: Response<Incoming>,
    /// Counts the request against the copy until the body is read.
    pub lease: Lease,
}

/// The head of a request without a body, kept so it can be sent again.
pub struct Replay {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
}

impl Replay {
    /// The head of `parts`, kept.
    pub fn of(parts: &request::Parts) -> Replay {
        Replay { method: parts.method.clone(), uri: parts.uri.clone(), headers: parts.headers.clone() }
    }

    /// The request again, with no body.
    pub fn request(&self) -> Request<UpBody> {
        let mut req = Request::new(UpBody::Empty);
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.headers_mut() = self.headers.clone();
        *req.version_mut() = Version::HTTP_11;
        req
    }
}

/// Sends the request to a copy: on an idle pooled connection when there is
/// one (a WebSocket always gets a new one), else on a new connection.
pub async fn send(copy: &LiveCopy, mut req: Request<UpBody>, upgrade: bool) -> Result<Sent, Failure> {
    let mut lease = Lease::new(copy.state.clone());
    if !upgrade {
        while let Some(mut s) = copy.state.pool.take() {
            // Pooled as soon as its last answer was read, a connection may
            // not have said it is ready yet; a closed one says so at once.
            if !matches!(tokio::time::timeout(READY_WAIT, s.ready()).await, Ok(Ok(()))) {
                continue;
            }
            match s.try_send_request(req).await {
                Ok(resp) => {
                    lease.sender = Some(s);
                    return Ok(Sent { resp, lease });
                }
                Err(mut e) => match e.take_message() {
                    // Never written: the connection had closed. Try another.
                    Some(back) => req = back,
                    None => return Err(Failure::Lost(e.into_error())),
                },
            }
        }
    }
    let connect = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, copy.port));
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(Failure::Refused(Box::new(req), e)),
        Err(_) => return Err(Failure::Refused(Box::new(req), io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))),
    };
    let _ = stream.set_nodelay(true);
    // R writes a response's head and body apart: acknowledge at once, so
    // the body never waits for a delayed ACK (quickack.rs).
    let (mut s, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(QuickAck(stream))).await {
        Ok(pair) => pair,
        Err(e) => return Err(Failure::Refused(Box::new(req), io::Error::other(e))),
    };
    let port = copy.port;
    if upgrade {
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(source = %ErrorSource::Upstream, port, "connection: {e}");
            }
        });
    } else {
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(source = %ErrorSource::Upstream, port, "connection: {e}");
            }
        });
    }
    match s.try_send_request(req).await {
        Ok(resp) => {
            if !upgrade {
                lease.sender = Some(s);
            }
            Ok(Sent { resp, lease })
        }
        Err(mut e) => match e.take_message() {
            // Accepted, then closed before a byte was written: a copy on its
            // way out is as good as one that refuses.
            Some(back) => Err(Failure::Refused(Box::new(back), io::Error::other(e.into_error()))),
            None => Err(Failure::Lost(e.into_error())),
        },
    }
}
