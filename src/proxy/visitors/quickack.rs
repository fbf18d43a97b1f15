//! A copy's socket that acknowledges at once while an answer is under way.
//! R's HTTP server (httpuv) writes a response's head and its body in two
//! writes; once a connection has left the kernel's quick-ACK mode, the body
//! waits (Nagle, on R's side) for our delayed ACK of the head, about 40 ms.
//! Setting TCP_QUICKACK sends that ACK at once, but the kernel clears it
//! again by itself each time we write, so it is set again for every answer.
//!
//! It is set when a read has to wait in the middle of an answer: bytes of
//! it have come and, by its head, more are due (or its length cannot be
//! told). That is the moment the copy may be waiting for our ACK. An answer
//! that came whole (a head with its `Content-Length` body, all read) needs
//! no ACK at once: its ACK rides on the next request, as without
//! TCP_QUICKACK. Setting it around every read instead cost 7 `setsockopt`
//! calls a request in `bench/proxy.sh` and, worse, a pure ACK packet for
//! every answer (a read after TCP_QUICKACK acknowledges at once).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The longest answer head looked at for its length; past it the length
/// is not known, and every wait acknowledges at once.
const HEAD_MAX: usize = 16 * 1024;

/// A connection to a copy that sets TCP_QUICKACK whenever it waits in the
/// middle of an answer.
#[derive(Debug)]
pub struct QuickAck {
    /// The socket.
    stream: TcpStream,
    /// What has come of the answer to the request last written.
    answer: Answer,
}

/// The answer to the request last written, as far as it has been read.
#[derive(Debug, Default)]
struct Answer {
    /// Bytes read since the request was written.
    read: usize,
    /// The answer's head so far, until it is whole (then emptied).
    head: Vec<u8>,
    /// The whole answer's length in bytes, once its head has told it.
    length: Length,
    /// The request was a HEAD: its answer has no body, whatever it says.
    to_head: bool,
}

/// What an answer's head says of its length.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Length {
    /// The head is not whole yet.
    #[default]
    Pending,
    /// Head and body together are this many bytes.
    Exact(usize),
    /// Chunked, until the close, an interim 1xx, a switch of protocols or a
    /// head that does not read: every wait acknowledges at once.
    Unknown,
}

impl Answer {
    /// A request is being written: the next bytes read are its answer.
    fn new(request: &[u8]) -> Answer {
        Answer { to_head: request.starts_with(b"HEAD "), ..Answer::default() }
    }

    /// Takes in `bytes` read from the copy.
    fn took(&mut self, bytes: &[u8]) {
        self.read += bytes.len();
        if self.length != Length::Pending {
            return;
        }
        // A head nearly always comes in one read: read where it lies, with
        // no copy (hyper reads it again; this is the second look).
        if self.head.is_empty() {
            if let Some(length) = whole_length(bytes, self.to_head) {
                self.length = length;
                return;
            }
        }
        let room = (HEAD_MAX + 4).saturating_sub(self.head.len());
        self.head.extend_from_slice(&bytes[..bytes.len().min(room)]);
        if let Some(length) = whole_length(&self.head, self.to_head) {
            self.length = length;
            self.head = Vec::new();
        } else if self.head.len() > HEAD_MAX {
            self.length = Length::Unknown;
            self.head = Vec::new();
        }
    }

    /// True unless the answer has begun and more of it is due by what its
    /// head said (or its head is not whole yet).
    fn may_restart(&self) -> bool {
        match self.length {
            _ if self.read == 0 => true,
            Length::Exact(total) => self.read >= total,
            Length::Unknown => true,
            Length::Pending => false,
        }
    }

    /// True while bytes of the answer have come and more are due.
    fn under_way(&self) -> bool {
        self.read > 0
            && match self.length {
                Length::Exact(total) => self.read < total,
                Length::Pending | Length::Unknown => true,
            }
    }
}

/// Headers an answer's head is read with; one with more is of unknown
/// length (every wait acknowledges at once).
const HEADERS_MAX: usize = 64;

/// What `head` (an answer's first bytes) says of the whole answer's length
/// (head and body): none while the head is not whole yet.
fn whole_length(head: &[u8], to_head: bool) -> Option<Length> {
    let mut headers = [const { std::mem::MaybeUninit::uninit() }; HEADERS_MAX];
    let mut resp = httparse::Response::new(&mut []);
    match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut resp, head, &mut headers) {
        Ok(httparse::Status::Partial) => None,
        Ok(httparse::Status::Complete(head_len)) => Some(match body_length(resp.code?, resp.headers, to_head) {
            Some(body) => Length::Exact(head_len + body),
            None => Length::Unknown,
        }),
        Err(_) => Some(Length::Unknown),
    }
}

/// The body's length by an answer's `status` and `headers`, when it can be
/// told: none for a 1xx, a chunked or close-delimited body, or a length
/// that does not read.
fn body_length(status: u16, headers: &[httparse::Header], to_head: bool) -> Option<usize> {
    if status < 200 {
        return None;
    }
    if to_head || status == 204 || status == 304 {
        return Some(0);
    }
    let mut length = None;
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return None;
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            // Two lengths that differ: hyper refuses the answer; not ours to read.
            let n: usize = std::str::from_utf8(h.value).ok()?.trim().parse().ok()?;
            if length.is_some_and(|l| l != n) {
                return None;
            }
            length = Some(n);
        }
    }
    length
}

impl QuickAck {
    /// A connection to a copy, no request written yet.
    pub fn new(stream: TcpStream) -> QuickAck {
        QuickAck { stream, answer: Answer::default() }
    }

    /// The socket (a WebSocket's tunnel takes it).
    pub fn into_inner(self) -> TcpStream {
        self.stream
    }

    fn quickack(&self) {
        // Best effort: a socket that refuses it only reads more slowly.
        let _ = socket2::SockRef::from(&self.stream).set_tcp_quickack(true);
    }

    /// After a write of `first` (the start of what was written): a new
    /// request, unless an answer is under way whose length is known (then
    /// this is more of the request's body, as the copy answered early).
    fn wrote(&mut self, poll: &Poll<io::Result<usize>>, first: &[u8]) {
        if matches!(poll, Poll::Ready(Ok(n)) if *n > 0) && self.answer.may_restart() {
            self.answer = Answer::new(first);
        }
    }
}

impl AsyncRead for QuickAck {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.stream).poll_read(cx, buf);
        match &poll {
            Poll::Ready(Ok(())) => {
                let got = &buf.filled()[before..];
                if !got.is_empty() {
                    self.answer.took(got);
                }
            }
            // Waiting in the middle of an answer: the copy may be waiting
            // for our ACK of what came (its head) before it sends the rest.
            Poll::Pending if self.answer.under_way() => self.quickack(),
            _ => {}
        }
        poll
    }
}

impl AsyncWrite for QuickAck {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.wrote(&poll, buf);
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| &b[..]);
        self.wrote(&poll, first);
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The same socket, for its flag while a read borrows the connection.
    fn probe(c: &QuickAck) -> socket2::Socket {
        use std::os::fd::AsFd;
        socket2::Socket::from(c.stream.as_fd().try_clone_to_owned().unwrap())
    }

    #[tokio::test]
    async fn a_wait_in_the_middle_of_an_answer_acknowledges_at_once_and_a_whole_answer_does_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (go_on, mut told) = tokio::sync::mpsc::unbounded_channel::<()>();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut b = [0; 1];
            for _ in 0..3 {
                s.read_exact(&mut b).await.unwrap();
                // As httpuv does: the head, then the body in a write of its own.
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n").await.unwrap();
                told.recv().await.unwrap();
                s.write_all(b"body").await.unwrap();
                s.read_exact(&mut b).await.unwrap();
                s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.unwrap();
            }
            // Open until the client is done, so its last wait is a wait.
            let _ = s.read(&mut b).await;
        });
        let mut c = QuickAck::new(TcpStream::connect(addr).await.unwrap());
        let flag = probe(&c);
        // The kernel clears it by itself (we clear it by hand): is it set again?
        let clear = || flag.set_tcp_quickack(false).unwrap();
        let quickack_on = || flag.tcp_quickack().unwrap();
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n";
        for _ in 0..3 {
            c.write_all(b"g").await.unwrap();
            let mut got = vec![0; head.len()];
            c.read_exact(&mut got).await.unwrap();
            clear();
            let mut body = [0; 4];
            let read = c.read_exact(&mut body);
            tokio::pin!(read);
            assert!(futures_poll(read.as_mut()).await.is_none(), "the body is not there yet");
            assert!(quickack_on(), "set while the body is due");
            go_on.send(()).unwrap();
            read.await.unwrap();
            assert_eq!(&body, b"body");
            c.write_all(b"g").await.unwrap();
            let mut whole = [0; 40];
            let n = c.read(&mut whole).await.unwrap();
            assert!(whole[..n].ends_with(b"ok"), "{:?}", String::from_utf8_lossy(&whole[..n]));
            clear();
            let mut more = [0; 1];
            let wait = c.read(&mut more);
            tokio::pin!(wait);
            assert!(futures_poll(wait.as_mut()).await.is_none());
            assert!(!quickack_on(), "a whole answer is acknowledged with the next request");
        }
        // The probe is the same socket: closed with it, or the server waits.
        drop(flag);
        drop(c);
        server.await.unwrap();
    }

    /// Polls `f` once: its output if it is ready.
    async fn futures_poll<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
        let mut f = f;
        std::future::poll_fn(|cx| {
            Poll::Ready(match Pin::new(&mut f).poll(cx) {
                Poll::Ready(v) => Some(v),
                Poll::Pending => None,
            })
        })
        .await
    }

    #[test]
    fn an_answers_length_is_read_from_its_head_only_when_it_can_be() {
        let len = |head: &str, to_head: bool| match whole_length(head.as_bytes(), to_head) {
            Some(Length::Exact(total)) => Some(total - head.len()),
            Some(Length::Unknown) => None,
            other => panic!("{head:?}: {other:?}"),
        };
        assert_eq!(len("HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", false), Some(12));
        assert_eq!(len("HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", true), Some(0), "the answer to a HEAD");
        assert_eq!(len("HTTP/1.1 304 Not Modified\r\nContent-Length: 12\r\n\r\n", false), Some(0));
        assert_eq!(len("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", false), None);
        assert_eq!(len("HTTP/1.1 200 OK\r\n\r\n", false), None, "until the close");
        assert_eq!(len("HTTP/1.1 101 Switching Protocols\r\n\r\n", false), None);
        assert_eq!(len("HTTP/1.1 103 Early Hints\r\nContent-Length: 0\r\n\r\n", false), None);
        assert_eq!(len("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", false), None);
        assert_eq!(len("garbage\r\n\r\n", false), None);
        assert_eq!(whole_length(b"HTTP/1.1 200 OK\r\nContent-Le", false), None, "not whole yet");
    }

    #[test]
    fn a_head_in_pieces_is_put_together() {
        let mut a = Answer::new(b"GET / HTTP/1.1\r\n");
        a.took(b"HTTP/1.1 200 OK\r\nConte");
        assert!(a.under_way());
        a.took(b"nt-Length: 3\r\n\r");
        assert_eq!(a.length, Length::Pending);
        a.took(b"\nab");
        assert!(a.under_way(), "one byte of the body is due");
        a.took(b"c");
        assert!(!a.under_way(), "whole");
        let mut big = Answer::new(b"GET / HTTP/1.1\r\n");
        big.took(&vec![b'x'; HEAD_MAX + 10]);
        assert_eq!(big.length, Length::Unknown, "a head too long to read: every wait acknowledges");
        assert!(big.under_way());
    }
}
