//! A copy's answer body as it comes off its connection ([`AnswerBody`]):
//! framed by its head (RFC 9112, 6.3: none, a length, chunked, or until the
//! copy closes), handed on in the pieces it was read in, with no copy, and
//! the connection given back for another request once the answer was read
//! whole and the copy keeps it open.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{self, HeaderMap};
use hyper::StatusCode;
use tokio::net::TcpStream;

use crate::proxy::copies::copy_conn::{has_token, invalid, CopyConn, Head};

/// The answer whose head was just read from `conn`, its body to be read
/// from it; an error when the head does not say how, or switches protocols
/// unasked.
pub fn response(head: Head, conn: CopyConn) -> io::Result<hyper::Response<AnswerBody>> {
    let framing = Framing::of(&head).map_err(invalid)?;
    if framing == Framing::Upgrade && !head.upgrade_asked {
        return Err(invalid("the copy switched protocols unasked"));
    }
    let keep_alive = head.version == hyper::Version::HTTP_11 && !has_token(&head.headers, header::CONNECTION, "close");
    let mut resp = hyper::Response::new(AnswerBody::new(conn, framing, keep_alive));
    *resp.status_mut() = head.status;
    *resp.version_mut() = head.version;
    *resp.headers_mut() = head.headers;
    Ok(resp)
}

/// The longest answer body read whole before its visitor gets any of it,
/// when its request would be sent again if lost (README, "Staying up": every
/// request is answered). httpuv writes an answer's head and body apart, so
/// a copy killed between the two left a visitor a page cut short; held
/// until whole, that answer is a lost request, sent to another copy. A
/// Shiny page is a few KiB and its largest script (`shiny.min.js`) 191 KiB;
/// larger answers (downloads) are streamed as they come.
pub const HOLD_MAX: u64 = 256 * 1024;

/// The longest chunk-size line or trailer line read.
const LINE_MAX: usize = 8 * 1024;

/// How an answer's body is delimited, and how far it has been read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Read to its end, or there is none (an answer to a HEAD, a 204, a 304).
    Done,
    /// A switch of protocols: the connection is the WebSocket's.
    Upgrade,
    /// This many bytes are still to come.
    Length(u64),
    /// Chunked, at this point of it.
    Chunked(Chunk),
    /// Until the copy closes the connection, which then serves no other.
    UntilClose,
}

/// Where a chunked body's reading is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    /// At a chunk's size line.
    Size,
    /// In a chunk's data, this many bytes still to come.
    Data(u64),
    /// At the line end after a chunk's data.
    DataEnd,
    /// Past the last chunk, at the trailers (passed over) and the end.
    Trailers,
}

impl Framing {
    /// The framing of the answer with `head`. An error names what does not
    /// read.
    pub fn of(head: &Head) -> Result<Framing, &'static str> {
        if head.status == StatusCode::SWITCHING_PROTOCOLS {
            return Ok(Framing::Upgrade);
        }
        if head.to_head || head.status == StatusCode::NO_CONTENT || head.status == StatusCode::NOT_MODIFIED {
            return Ok(Framing::Done);
        }
        if let Some(last) = last_token(&head.headers, header::TRANSFER_ENCODING) {
            return Ok(if last.eq_ignore_ascii_case("chunked") { Framing::Chunked(Chunk::Size) } else { Framing::UntilClose });
        }
        let mut length = None;
        for v in head.headers.get_all(header::CONTENT_LENGTH) {
            // Digits only (RFC 9110, 8.6): `parse` would also take a sign.
            let n = std::str::from_utf8(v.as_bytes())
                .ok()
                .map(str::trim)
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or("a Content-Length that does not read")?;
            if length.is_some_and(|l| l != n) {
                return Err("two Content-Lengths that differ");
            }
            length = Some(n);
        }
        Ok(match length {
            Some(0) => Framing::Done,
            Some(n) => Framing::Length(n),
            None => Framing::UntilClose,
        })
    }
}

/// The last token of the header `name` (over all its lines), if any.
fn last_token(h: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    let last = h.get_all(name).iter().next_back()?;
    Some(last.to_str().unwrap_or("").rsplit(',').next().unwrap_or("").trim())
}

/// A copy's answer body, read from its connection as the visitor takes it.
#[derive(Debug)]
pub struct AnswerBody {
    /// The connection, until it is given back or closed.
    conn: Option<CopyConn>,
    /// How the body is delimited and how far it was read.
    framing: Framing,
    /// The copy keeps the connection open after the answer.
    keep_alive: bool,
}

impl AnswerBody {
    /// The body of an answer whose head was just read from `conn`.
    pub fn new(conn: CopyConn, framing: Framing, keep_alive: bool) -> AnswerBody {
        AnswerBody { conn: Some(conn), framing, keep_alive }
    }

    /// The connection, when the answer was read whole and the copy keeps it
    /// open with nothing more on it: it may carry another request.
    pub fn reusable(&mut self) -> Option<CopyConn> {
        if self.framing != Framing::Done || !self.keep_alive {
            return None;
        }
        self.conn.take().filter(|c| c.is_clear())
    }

    /// The socket of a switch of protocols and the bytes the copy sent past
    /// its head.
    pub fn upgraded(&mut self) -> Option<(TcpStream, Bytes)> {
        if self.framing != Framing::Upgrade {
            return None;
        }
        self.conn.take().map(CopyConn::into_parts)
    }

    /// Reads the rest of a body of known length up to [`HOLD_MAX`] before it
    /// is handed on, so that a copy that breaks off mid-answer leaves the
    /// request unanswered rather than its visitor with part of an answer.
    /// Any other body is left to stream.
    pub async fn read_whole(&mut self) -> io::Result<()> {
        let (Framing::Length(left), Some(conn)) = (self.framing, self.conn.as_mut()) else { return Ok(()) };
        if left > HOLD_MAX {
            return Ok(());
        }
        // At most HOLD_MAX, so the cast holds.
        let left = left as usize;
        let buffered = conn.buffered().len();
        conn.buffered().reserve(left.saturating_sub(buffered));
        while conn.buffered().len() < left {
            if std::future::poll_fn(|cx| conn.poll_fill(cx, true)).await? == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the copy closed the connection mid-answer"));
            }
        }
        Ok(())
    }

    /// The next piece of the body, or its end, or what broke it.
    fn poll_piece(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
        loop {
            let Some(conn) = self.conn.as_mut() else { return Poll::Ready(None) };
            let buf = conn.buffered();
            match self.framing {
                Framing::Done | Framing::Upgrade => return Poll::Ready(None),
                Framing::Length(left) if !buf.is_empty() => {
                    let n = left.min(buf.len() as u64);
                    let piece = buf.split_to(n as usize).freeze();
                    self.framing = if n == left { Framing::Done } else { Framing::Length(left - n) };
                    return Poll::Ready(Some(Ok(piece)));
                }
                Framing::UntilClose if !buf.is_empty() => {
                    let piece = buf.split().freeze();
                    return Poll::Ready(Some(Ok(piece)));
                }
                Framing::Chunked(at) => match chunked(buf, at) {
                    Ok(Step::Piece(piece, next)) => {
                        self.framing = Framing::Chunked(next);
                        return Poll::Ready(Some(Ok(piece)));
                    }
                    Ok(Step::Next(next)) => {
                        self.framing = Framing::Chunked(next);
                        continue;
                    }
                    Ok(Step::End) => {
                        self.framing = Framing::Done;
                        return Poll::Ready(None);
                    }
                    Ok(Step::More) => {}
                    Err(why) => return Poll::Ready(Some(Err(io::Error::new(io::ErrorKind::InvalidData, why)))),
                },
                Framing::Length(_) | Framing::UntilClose => {}
            }
            // Its head has come and the rest is due: a wait acknowledges at once.
            match ready!(conn.poll_fill(cx, true)) {
                Ok(0) if self.framing == Framing::UntilClose => {
                    // The close is the end; the connection serves no other.
                    self.framing = Framing::Done;
                    self.keep_alive = false;
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    return Poll::Ready(Some(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the copy closed the connection mid-answer",
                    ))))
                }
                Ok(_) => {}
                Err(e) => return Poll::Ready(Some(Err(e))),
            }
        }
    }
}

/// What a look at a chunked body's buffered bytes gave.
enum Step {
    /// A piece of data, and where the reading is after it.
    Piece(Bytes, Chunk),
    /// A line was taken; the reading is here now.
    Next(Chunk),
    /// The body's end (the last chunk and the trailers taken).
    End,
    /// More bytes must be read first.
    More,
}

/// Takes what it can of a chunked body at `at` from `buf`.
fn chunked(buf: &mut bytes::BytesMut, at: Chunk) -> Result<Step, &'static str> {
    Ok(match at {
        Chunk::Size => match httparse::parse_chunk_size(buf) {
            Ok(httparse::Status::Complete((used, size))) => {
                buf.advance(used);
                Step::Next(if size == 0 { Chunk::Trailers } else { Chunk::Data(size) })
            }
            Ok(httparse::Status::Partial) if buf.len() > LINE_MAX => return Err("a chunk size line too long"),
            Ok(httparse::Status::Partial) => Step::More,
            Err(_) => return Err("a chunk size that does not read"),
        },
        Chunk::Data(_) if buf.is_empty() => Step::More,
        Chunk::Data(left) => {
            let n = left.min(buf.len() as u64);
            let piece = buf.split_to(n as usize).freeze();
            Step::Piece(piece, if n == left { Chunk::DataEnd } else { Chunk::Data(left - n) })
        }
        Chunk::DataEnd if buf.len() < 2 => Step::More,
        Chunk::DataEnd if &buf[..2] == b"\r\n" => {
            buf.advance(2);
            Step::Next(Chunk::Size)
        }
        Chunk::DataEnd => return Err("a chunk longer than its size"),
        Chunk::Trailers => match buf.windows(2).position(|w| w == b"\r\n") {
            Some(0) => {
                buf.advance(2);
                Step::End
            }
            // A trailer: passed over (hyper's server sends the visitor none).
            Some(i) => {
                buf.advance(i + 2);
                Step::Next(Chunk::Trailers)
            }
            None if buf.len() > LINE_MAX => return Err("a trailer line too long"),
            None => Step::More,
        },
    })
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.get_mut().poll_piece(cx).map(|p| p.map(|r| r.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.framing, Framing::Done | Framing::Upgrade)
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Done | Framing::Upgrade => SizeHint::with_exact(0),
            Framing::Length(n) => SizeHint::with_exact(n),
            Framing::Chunked(_) | Framing::UntilClose => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::copies::copy_conn::tests::pair;
    use crate::proxy::copies::copy_conn::UpBody;
    use http_body_util::BodyExt;
    use hyper::http::request;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn get(path: &str) -> request::Parts {
        hyper::Request::builder().uri(path).header("host", "localhost").body(()).unwrap().into_parts().0
    }

    /// Reads one request head (to its blank line) from `s`.
    async fn read_request(s: &mut TcpStream) -> Vec<u8> {
        let mut got = Vec::new();
        let mut b = [0; 1];
        while !got.ends_with(b"\r\n\r\n") {
            assert_eq!(s.read(&mut b).await.unwrap(), 1, "the request ended early: {:?}", String::from_utf8_lossy(&got));
            got.push(b[0]);
        }
        got
    }

    #[tokio::test]
    async fn answers_of_each_framing_are_read_whole_and_only_a_kept_open_connection_serves_again() {
        let (listener, conn) = pair().await;
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            read_request(&mut s).await;
            // The head and its body apart, as httpuv writes them.
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n").await.unwrap();
            s.write_all(b"hello").await.unwrap();
            read_request(&mut s).await;
            s.write_all(
                b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
            )
            .await
            .unwrap();
            s.write_all(b"7\r\n, world\r\n0\r\n\r\n").await.unwrap();
            read_request(&mut s).await;
            s.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nbye").await.unwrap();
        });
        let mut conn = Some(conn);
        for (path, want, again) in [("/a", "hello", true), ("/b", "hello, world", true), ("/c", "bye", false)] {
            let (head, c) =
                conn.take().unwrap().round_trip(&get(path), UpBody::Empty).await.unwrap_or_else(|_| panic!("{path}: no answer"));
            let mut body = response(head, c).unwrap().into_body();
            let mut got = Vec::new();
            while let Some(frame) = body.frame().await {
                got.extend_from_slice(&frame.unwrap().into_data().unwrap());
            }
            assert_eq!(String::from_utf8_lossy(&got), want, "{path}");
            conn = body.reusable();
            assert_eq!(conn.is_some(), again, "{path}: serves again");
        }
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_wait_in_the_middle_of_an_answer_acknowledges_at_once_and_a_whole_answer_does_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        // The same socket, for its flag while the answer borrows the connection.
        let flag = {
            use std::os::fd::AsFd;
            socket2::Socket::from(stream.as_fd().try_clone_to_owned().unwrap())
        };
        let conn = CopyConn::new(stream);
        let (go_on, mut told) = tokio::sync::mpsc::unbounded_channel::<()>();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            for _ in 0..3 {
                read_request(&mut s).await;
                // Nothing of the answer until told, then its head and its
                // body apart, as httpuv writes them.
                told.recv().await.unwrap();
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n").await.unwrap();
                told.recv().await.unwrap();
                s.write_all(b"body").await.unwrap();
                read_request(&mut s).await;
                s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.unwrap();
            }
        });
        let mut conn = Some(conn);
        for _ in 0..3 {
            // The kernel clears it by itself (we clear it by hand): is it set?
            flag.set_tcp_quickack(false).unwrap();
            let parts = get("/");
            let sent = conn.take().unwrap().round_trip(&parts, UpBody::Empty);
            tokio::pin!(sent);
            let waiting = std::future::poll_fn(|cx| Poll::Ready(std::future::Future::poll(sent.as_mut(), cx).is_pending())).await;
            assert!(waiting, "no byte of the answer yet");
            assert!(!flag.tcp_quickack().unwrap(), "a wait before any byte of an answer (after a whole one) acknowledges with the request");
            go_on.send(()).unwrap();
            let (head, c) = sent.await.ok().unwrap();
            let mut body = response(head, c).unwrap().into_body();
            flag.set_tcp_quickack(false).unwrap();
            let first = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx).is_pending())).await;
            assert!(first, "the body is not there yet");
            assert!(flag.tcp_quickack().unwrap(), "set while the body is due");
            go_on.send(()).unwrap();
            assert_eq!(&body.frame().await.unwrap().unwrap().into_data().unwrap()[..], b"body");
            let (head, c) = body.reusable().unwrap().round_trip(&get("/"), UpBody::Empty).await.ok().unwrap();
            let mut whole = response(head, c).unwrap().into_body();
            assert_eq!(&whole.frame().await.unwrap().unwrap().into_data().unwrap()[..], b"ok");
            conn = Some(whole.reusable().unwrap());
        }
        // The probe is the same socket: closed with it, or the server waits.
        drop((flag, conn));
        server.await.unwrap();
    }

    /// A chunked body read from `wire` in pieces of `step` bytes: its data.
    fn dechunk(wire: &[u8], step: usize) -> Result<Vec<u8>, &'static str> {
        let mut buf = bytes::BytesMut::new();
        let (mut at, mut out, mut fed) = (Chunk::Size, Vec::new(), 0);
        loop {
            match chunked(&mut buf, at)? {
                Step::Piece(p, next) => {
                    out.extend_from_slice(&p);
                    at = next;
                }
                Step::Next(next) => at = next,
                Step::End => return Ok(out),
                Step::More if fed >= wire.len() => return Err("ran out"),
                Step::More => {
                    let end = (fed + step).min(wire.len());
                    buf.extend_from_slice(&wire[fed..end]);
                    fed = end;
                }
            }
        }
    }

    #[test]
    fn a_chunked_body_is_read_whole_in_any_pieces() {
        let wire = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\n";
        for step in [1, 2, 3, 7, 100] {
            assert_eq!(dechunk(wire, step).unwrap(), b"hello, world", "pieces of {step}");
        }
        assert!(dechunk(b"5\r\nhelloXX\r\n0\r\n\r\n", 100).is_err(), "data longer than its size");
        assert!(dechunk(b"zz\r\n", 100).is_err(), "a size that does not read");
        assert!(dechunk(b"5\r\nhel", 100).is_err(), "cut short");
    }

    fn head(status: u16, headers: &[(&str, &str)]) -> Head {
        Head {
            status: StatusCode::from_u16(status).unwrap(),
            version: hyper::Version::HTTP_11,
            headers: headers.iter().map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap())).collect(),
            to_head: false,
            upgrade_asked: false,
        }
    }

    #[test]
    fn the_framing_is_read_from_the_head_as_the_rfc_says() {
        assert_eq!(Framing::of(&head(200, &[("content-length", "12")])), Ok(Framing::Length(12)));
        assert_eq!(
            Framing::of(&Head { to_head: true, ..head(200, &[("content-length", "12")]) }),
            Ok(Framing::Done),
            "the answer to a HEAD"
        );
        assert_eq!(Framing::of(&head(304, &[("content-length", "12")])), Ok(Framing::Done));
        assert_eq!(Framing::of(&head(204, &[])), Ok(Framing::Done));
        assert_eq!(Framing::of(&head(200, &[("content-length", "0")])), Ok(Framing::Done));
        assert_eq!(Framing::of(&head(200, &[("transfer-encoding", "gzip, chunked")])), Ok(Framing::Chunked(Chunk::Size)));
        assert_eq!(
            Framing::of(&head(200, &[("transfer-encoding", "chunked"), ("content-length", "3")])),
            Ok(Framing::Chunked(Chunk::Size))
        );
        assert_eq!(Framing::of(&head(200, &[("transfer-encoding", "gzip")])), Ok(Framing::UntilClose));
        assert_eq!(Framing::of(&head(200, &[])), Ok(Framing::UntilClose));
        assert_eq!(Framing::of(&head(101, &[])), Ok(Framing::Upgrade));
        assert!(Framing::of(&head(200, &[("content-length", "1"), ("content-length", "2")])).is_err());
        assert!(Framing::of(&head(200, &[("content-length", "x")])).is_err());
        assert!(Framing::of(&head(200, &[("content-length", "+5")])).is_err(), "digits only");
    }
}
