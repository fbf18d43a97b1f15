//! A copy's socket that acknowledges at once. R's HTTP server (httpuv)
//! writes a response's head and its body in two writes; once a connection
//! has left the kernel's quick-ACK mode, the body waits for our delayed ACK
//! of the head (about 40 ms). TCP_QUICKACK ends that wait, but the kernel
//! clears it again by itself, so it is set before every read.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A connection to a copy that sets TCP_QUICKACK before each read.
#[derive(Debug)]
pub struct QuickAck(pub TcpStream);

impl QuickAck {
    fn quickack(&self) {
        // Best effort: a socket that refuses it only reads more slowly.
        let _ = socket2::SockRef::from(&self.0).set_tcp_quickack(true);
    }
}

impl AsyncRead for QuickAck {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.quickack();
        let poll = Pin::new(&mut self.0).poll_read(cx, buf);
        if poll.is_ready() {
            // What arrives after this read is acknowledged at once too.
            self.quickack();
        }
        poll
    }
}

impl AsyncWrite for QuickAck {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The flag the kernel reports for the socket.
    fn quickack_on(s: &TcpStream) -> bool {
        socket2::SockRef::from(s).tcp_quickack().unwrap()
    }

    #[tokio::test]
    async fn quickack_is_set_again_around_every_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            for _ in 0..3 {
                s.write_all(b"head").await.unwrap();
                s.write_all(b"body").await.unwrap();
                let mut b = [0; 1];
                s.read_exact(&mut b).await.unwrap();
            }
        });
        let mut c = QuickAck(TcpStream::connect(addr).await.unwrap());
        for _ in 0..3 {
            // The kernel may clear it at any time; after each read it is set.
            let _ = socket2::SockRef::from(&c.0).set_tcp_quickack(false);
            let mut got = [0; 8];
            c.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"headbody");
            assert!(quickack_on(&c.0), "set again around the read");
            c.write_all(b"k").await.unwrap();
        }
        server.await.unwrap();
    }
}
