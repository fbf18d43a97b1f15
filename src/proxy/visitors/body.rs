//! The answer's body as the visitor gets it ([`DownBody`]): a copy's,
//! streamed (holding its [`Lease`] until read to the end), or a page of our
//! own.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use crate::proxy::copies::answer::AnswerBody;
use crate::proxy::copies::lease::Lease;
use crate::proxy::error_source::ErrorSource;
use crate::proxy::progress::{self, BoxError, Idle};

/// The body sent to the visitor: a copy's, streamed, or a page of our own.
pub enum DownBody {
    /// A copy's answer; the lease ends with it.
    Upstream {
        /// The copy's body.
        body: AnswerBody,
        /// Ends (and pools the connection) once the body is read.
        lease: Option<Lease>,
        /// Cuts the answer when the copy stops sending it.
        idle: Idle,
    },
    /// A whole body (our pages), taken on first poll.
    Full(Option<Bytes>),
}

impl DownBody {
    /// No body at all.
    pub fn empty() -> DownBody {
        DownBody::Full(None)
    }
}

impl Body for DownBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            DownBody::Upstream { body, lease, idle } => {
                let polled = progress::poll_watched(Pin::new(&mut *body).poll_frame(cx), idle, cx, "a copy's answer");
                match &polled {
                    Poll::Ready(None) => finish(lease, body),
                    Poll::Ready(Some(Ok(_))) if body.is_end_stream() => finish(lease, body),
                    Poll::Ready(Some(Err(e))) => {
                        tracing::warn!(source = %ErrorSource::Upstream, "a copy's answer broke off: {e}");
                        // Not pooled: the connection is in no state to reuse.
                        *lease = None;
                    }
                    _ => {}
                }
                polled
            }
            DownBody::Full(b) => Poll::Ready(b.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            DownBody::Upstream { body, .. } => body.is_end_stream(),
            DownBody::Full(b) => b.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            DownBody::Upstream { body, .. } => body.size_hint(),
            DownBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}

fn finish(lease: &mut Option<Lease>, body: &mut AnswerBody) {
    if let Some(l) = lease.take() {
        l.finish(body.reusable());
    }
}
