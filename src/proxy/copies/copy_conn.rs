//! One HTTP/1.1 connection to a copy, spoken by the load balancer itself:
//! the request's head written from what hyper's server parsed of the
//! visitor's, the answer's head read with httparse, and the answer's body
//! handed on as it comes (`answer.rs`), after which the
//! connection serves the next request.
//!
//! Why not hyper's client: it is a second HTTP/1 state machine with a task
//! and channels per connection, whose only work here is what this file
//! does; without it the load balancer takes about 6% less CPU a request,
//! as much as HAProxy (README, "Benchmark").
//!
//! The socket acknowledges at once while an answer is under way: R's HTTP
//! server (httpuv) writes an answer's head and its body in two writes, and
//! once a connection has left the kernel's quick-ACK mode the body waits
//! (Nagle, on R's side) for our delayed ACK of the head, about 40 ms.
//! TCP_QUICKACK sends that ACK at once, but the kernel clears it again each
//! time we write, so it is set whenever a read has to wait in the middle of
//! an answer: bytes of it have come and more are due. An answer that comes
//! whole is never waited on, and its ACK rides on the next request.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::request;
use hyper::{Method, StatusCode, Version};
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::proxy::progress::{self, BoxError, Idle};

/// The longest answer head read; a longer one breaks the exchange.
const HEAD_MAX: usize = 64 * 1024;
/// Headers an answer may have.
const HEADERS_MAX: usize = 100;
/// Room made in the read buffer before a read.
const READ_SIZE: usize = 16 * 1024;

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

/// A connection to a copy.
#[derive(Debug)]
pub struct CopyConn {
    /// The socket.
    stream: TcpStream,
    /// Bytes read from the copy and not yet taken.
    buf: BytesMut,
}

/// Why a request got no answer's head.
pub enum Unanswered {
    /// Nothing of the request was written (the copy had closed the
    /// connection): its body comes back unread.
    Unsent(UpBody, io::Error),
    /// The request was written, maybe in part, and no whole head came.
    Broke(io::Error),
}

impl CopyConn {
    /// A new connection to a copy.
    pub fn new(stream: TcpStream) -> CopyConn {
        CopyConn { stream, buf: BytesMut::new() }
    }

    /// True while an idle connection can carry a request: the copy has
    /// neither closed it nor written to it since its last answer. Asks the
    /// socket's readiness as the runtime last heard it, with no system
    /// call: a read that drained the socket cleared it, and a close or
    /// stray bytes set it again.
    pub fn still_open(&self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match self.stream.poll_read_ready(&mut cx) {
            Poll::Pending => true,
            // Readable: a close, a reset, or bytes no request asked for;
            // one look tells a stale readiness from them.
            Poll::Ready(Ok(())) => matches!(self.stream.try_read(&mut [0; 1]), Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            Poll::Ready(Err(_)) => false,
        }
    }

    /// Sends `req` and reads its answer's head; the answer's body is what
    /// the connection reads next (`answer.rs`).
    pub async fn round_trip(mut self, parts: &request::Parts, body: UpBody) -> Result<(Head, CopyConn), Unanswered> {
        let chunked = !body.is_end_stream() && body.size_hint().exact().is_none();
        let mut head = Vec::with_capacity(512);
        request_head(parts, chunked, &mut head);
        if let Err(e) = self.stream.write_all(&head).await {
            // Nothing of a head this small is written when the write fails.
            return Err(Unanswered::Unsent(body, e));
        }
        if !body.is_end_stream() {
            self.write_body(body, chunked).await.map_err(Unanswered::Broke)?;
        }
        let mut head = self.read_head().await.map_err(Unanswered::Broke)?;
        head.to_head = parts.method == Method::HEAD;
        head.upgrade_asked = parts.headers.contains_key(header::UPGRADE);
        Ok((head, self))
    }

    /// Writes the visitor's request body as it comes, chunked when its
    /// length is not known.
    async fn write_body(&mut self, mut body: UpBody, chunked: bool) -> io::Result<()> {
        use http_body_util::BodyExt;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(io::Error::other)?;
            let Ok(data) = frame.into_data() else { continue };
            if data.is_empty() {
                continue;
            }
            if chunked {
                self.stream.write_all(format!("{:x}\r\n", data.len()).as_bytes()).await?;
                self.stream.write_all(&data).await?;
                self.stream.write_all(b"\r\n").await?;
            } else {
                self.stream.write_all(&data).await?;
            }
        }
        if chunked {
            self.stream.write_all(b"0\r\n\r\n").await?;
        }
        Ok(())
    }

    /// Reads the answer's head, passing over interim answers (1xx but a
    /// switch of protocols).
    async fn read_head(&mut self) -> io::Result<Head> {
        // Bytes of the answer have come: a wait now is for the rest of it.
        let mut begun = false;
        loop {
            if let Some(head) = parse_head(&mut self.buf)? {
                if head.status.is_informational() && head.status != StatusCode::SWITCHING_PROTOCOLS {
                    continue;
                }
                return Ok(head);
            }
            if self.buf.len() > HEAD_MAX {
                return Err(invalid("the copy's answer head is too long"));
            }
            if std::future::poll_fn(|cx| self.poll_fill(cx, begun)).await? == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the copy closed the connection before answering"));
            }
            begun = true;
        }
    }

    /// Reads what the copy sent into the buffer: the bytes read, 0 at its
    /// close. `mid_answer`: bytes of an answer have come and more are due,
    /// so a wait acknowledges at once.
    pub(super) fn poll_fill(&mut self, cx: &mut Context<'_>, mid_answer: bool) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < READ_SIZE / 4 {
            self.buf.reserve(READ_SIZE);
        }
        let spare = self.buf.spare_capacity_mut();
        let start = spare.as_ptr();
        let mut read = ReadBuf::uninit(spare);
        match Pin::new(&mut self.stream).poll_read(cx, &mut read) {
            Poll::Pending => {
                if mid_answer {
                    // Best effort: a socket that refuses it only reads more slowly.
                    let _ = socket2::SockRef::from(&self.stream).set_tcp_quickack(true);
                }
                Poll::Pending
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) => {
                let n = read.filled().len();
                if start.cast::<u8>() != read.filled().as_ptr() {
                    // A stream that swapped the buffer it was given: what it
                    // read is not where it is counted; never so for a socket.
                    return Poll::Ready(Err(io::Error::other("a read went to another buffer")));
                }
                // SAFETY: ReadBuf vouches that its first n bytes, which
                // are the buffer's spare capacity, are initialised.
                unsafe { self.buf.set_len(self.buf.len() + n) };
                Poll::Ready(Ok(n))
            }
        }
    }

    /// True when nothing read is left over (an answer ended where its
    /// framing said).
    pub(super) fn is_clear(&self) -> bool {
        self.buf.is_empty()
    }

    /// The bytes read and not yet taken.
    pub(super) fn buffered(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// The socket and the bytes read past the answer's head: a WebSocket's
    /// tunnel carries them on.
    pub fn into_parts(self) -> (TcpStream, Bytes) {
        (self.stream, self.buf.freeze())
    }
}

/// An answer's head, with what of its request decides how its body is
/// read.
#[derive(Debug)]
pub struct Head {
    /// Its status.
    pub status: StatusCode,
    /// Its HTTP version.
    pub version: Version,
    /// Its headers.
    pub headers: HeaderMap,
    /// The request was a HEAD: the answer has no body, whatever it says.
    pub to_head: bool,
    /// The request asked to switch protocols.
    pub upgrade_asked: bool,
}

/// The answer's head at the start of `buf`, taken out of it, once it is
/// whole; none while it is not. Header values are slices of the bytes read,
/// not copies.
fn parse_head(buf: &mut BytesMut) -> io::Result<Option<Head>> {
    if buf.is_empty() {
        return Ok(None);
    }
    let mut headers = [const { std::mem::MaybeUninit::uninit() }; HEADERS_MAX];
    let mut resp = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut resp, buf, &mut headers) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(invalid(&format!("the copy's answer head does not read: {e}"))),
    };
    let status = resp.code.and_then(|c| StatusCode::from_u16(c).ok()).ok_or_else(|| invalid("the copy's answer has no valid status"))?;
    let version = if resp.version == Some(1) { Version::HTTP_11 } else { Version::HTTP_10 };
    // Where each name and value lies in the head, so they can be sliced
    // from it once it is frozen.
    let base = buf.as_ptr() as usize;
    let offset = |part: &[u8]| (part.as_ptr() as usize - base) as u32;
    let mut spans = [(0u32, 0u32, 0u32, 0u32); HEADERS_MAX];
    let count = resp.headers.len();
    for (span, h) in spans.iter_mut().zip(resp.headers.iter()) {
        *span = (offset(h.name.as_bytes()), h.name.len() as u32, offset(h.value), h.value.len() as u32);
    }
    let bytes = buf.split_to(len).freeze();
    let mut map = HeaderMap::with_capacity(count);
    for &(name_at, name_len, value_at, value_len) in &spans[..count] {
        let (name_at, name_len, value_at, value_len) = (name_at as usize, name_len as usize, value_at as usize, value_len as usize);
        let name = HeaderName::from_bytes(&bytes[name_at..name_at + name_len])
            .map_err(|_| invalid("a header name of the copy's answer does not read"))?;
        let value = HeaderValue::from_maybe_shared(bytes.slice(value_at..value_at + value_len))
            .map_err(|_| invalid("a header value of the copy's answer does not read"))?;
        map.append(name, value);
    }
    Ok(Some(Head { status, version, headers: map, to_head: false, upgrade_asked: false }))
}

/// The request's head as the copy gets it: its line, its headers, and
/// `Transfer-Encoding: chunked` when its body is sent chunked.
fn request_head(parts: &request::Parts, chunked: bool, out: &mut Vec<u8>) {
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(parts.uri.path_and_query().map_or("/", |pq| pq.as_str()).as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &parts.headers {
        if chunked && name == header::CONTENT_LENGTH {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// True when the header `name`, on any of its lines, lists `token` (in any
/// case): `Connection: close`, `Upgrade: websocket`.
pub fn has_token(h: &HeaderMap, name: HeaderName, token: &str) -> bool {
    h.get_all(name).iter().any(|v| v.to_str().unwrap_or("").split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

pub(super) fn invalid(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A listener and a connection to it.
    pub(in crate::proxy::copies) async fn pair() -> (tokio::net::TcpListener, CopyConn) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let conn = CopyConn::new(TcpStream::connect(listener.local_addr().unwrap()).await.unwrap());
        (listener, conn)
    }

    #[test]
    fn a_request_head_is_written_as_parsed_and_a_body_of_unknown_length_is_chunked() {
        let req =
            hyper::Request::builder().method("POST").uri("/up?x=1").header("host", "a").header("content-length", "3").body(()).unwrap();
        let (parts, ()) = req.into_parts();
        let mut out = Vec::new();
        request_head(&parts, false, &mut out);
        assert_eq!(out, b"POST /up?x=1 HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\n\r\n");
        out.clear();
        request_head(&parts, true, &mut out);
        assert_eq!(out, b"POST /up?x=1 HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n");
    }

    #[tokio::test]
    async fn an_idle_connection_the_copy_closed_is_not_used_again() {
        let (listener, conn) = pair().await;
        let (mut s, _) = listener.accept().await.unwrap();
        assert!(conn.still_open(), "open and quiet");
        assert!(conn.still_open(), "asking again reads nothing");
        s.write_all(b"x").await.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while conn.still_open() {
            assert!(std::time::Instant::now() < deadline, "bytes no request asked for went unseen");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let (listener, conn) = pair().await;
        drop(listener.accept().await.unwrap());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while conn.still_open() {
            assert!(std::time::Instant::now() < deadline, "a close went unseen");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}
