//! Connections to copies: the request body they carry ([`UpBody`]) and the
//! idle keep-alive ones kept per copy ([`Pool`]), as pingora keeps its
//! connection pool apart from picking a copy and from the proxying itself.
//!
//! The body sent to a copy lives here rather than beside the visitor's
//! answer body (`body.rs`): a pooled connection's type names it, and the
//! answer body ends a lease that pools the connection, so one file holding
//! both would import and be imported by this one.

use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;

use crate::proxy::progress::{self, BoxError, Idle};
use crate::proxy::workers::{worker_index, WORKERS};

/// Idle connections kept per copy.
const POOL_MAX: usize = 256;
/// An idle connection to a copy unused this long is closed: it holds a
/// descriptor on both sides, and a copy may have forgotten it.
pub const POOL_IDLE: Duration = Duration::from_secs(30);

/// The body sent to a copy: the visitor's, streamed, or none (a retry or
/// a WebSocket upgrade).
pub enum UpBody {
    /// The visitor's request body, cut when it stops moving.
    VisitorConnection(Incoming, Idle),
    /// No body.
    Empty,
}

impl Body for UpBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            UpBody::VisitorConnection(b, idle) => {
                let polled = Pin::new(b).poll_frame(cx);
                progress::poll_watched(polled, idle, cx, "a visitor's request body")
            }
            UpBody::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpBody::VisitorConnection(b, _) => b.is_end_stream(),
            UpBody::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpBody::VisitorConnection(b, _) => b.size_hint(),
            UpBody::Empty => SizeHint::with_exact(0),
        }
    }
}

/// A request sender on one connection to a copy.
pub type Sender = SendRequest<UpBody>;

/// Idle keep-alive connections to one copy, one list per worker: a
/// connection is driven by the worker that opened it, so a request reuses
/// only its own worker's (the lock is then never contended).
#[derive(Default)]
pub struct Pool {
    /// Per worker, most recently used last, each with when it was put back.
    idle: [Mutex<Vec<(Sender, Instant)>>; WORKERS],
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, Vec<(Sender, Instant)>> {
        self.idle[worker_index() % WORKERS].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently used connection still open.
    pub fn take(&self) -> Option<Sender> {
        let mut idle = self.lock();
        while let Some((s, since)) = idle.pop() {
            if !s.is_closed() && since.elapsed() < POOL_IDLE {
                return Some(s);
            }
        }
        None
    }

    /// Keeps a connection whose last answer was read to the end.
    pub fn put(&self, s: Sender) {
        if s.is_closed() {
            return;
        }
        let mut idle = self.lock();
        if idle.len() < POOL_MAX {
            idle.push((s, Instant::now()));
        }
    }

    /// Closes the connections idle for [`POOL_IDLE`] or more, and those the
    /// copy closed; returns how many are left.
    pub fn expire(&self) -> usize {
        let mut left = 0;
        for idle in &self.idle {
            let mut idle = idle.lock().unwrap_or_else(|e| e.into_inner());
            // Oldest first: the expired ones are a prefix, but a closed one
            // may be anywhere.
            idle.retain(|(s, since)| !s.is_closed() && since.elapsed() < POOL_IDLE);
            left += idle.len();
        }
        left
    }

    /// Drops every idle connection (the copy just failed one: the others
    /// are likely dead too).
    pub fn clear(&self) {
        for idle in &self.idle {
            let dropped = std::mem::take(&mut *idle.lock().unwrap_or_else(|e| e.into_inner()));
            drop(dropped);
        }
    }
}
