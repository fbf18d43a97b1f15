//! A visitor's socket that counts the bytes it reads and writes into its
//! app's counters (`counters.rs`): one relaxed atomic add per read or write
//! call, which already moves a whole buffer. The bytes of an open
//! WebSocket are counted by the pump instead (`tunnels/pump.rs`), once the socket
//! is taken out of this wrapper.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::proxy::counters::AppCounters;

/// A visitor's connection and the counters of the app its port serves
/// (none for a port no app has).
pub struct Counted {
    /// The socket.
    stream: TcpStream,
    /// Where its bytes are counted.
    counters: Option<Arc<AppCounters>>,
}

impl Counted {
    /// Counts `stream`'s bytes into `counters`.
    pub fn new(stream: TcpStream, counters: Option<Arc<AppCounters>>) -> Counted {
        Counted { stream, counters }
    }

    /// The socket and the counters, for the pump.
    pub fn into_parts(self) -> (TcpStream, Option<Arc<AppCounters>>) {
        (self.stream, self.counters)
    }

    fn add(&self, written: bool, n: usize) {
        if let Some(c) = &self.counters {
            if n > 0 {
                c.add_bytes(written, n as u64);
            }
        }
    }
}

impl AsyncRead for Counted {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.add(false, buf.filled().len() - before);
        }
        polled
    }
}

impl AsyncWrite for Counted {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = polled {
            this.add(true, n);
        }
        polled
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            this.add(true, n);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_read_and_written_are_counted() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let counters = Arc::new(AppCounters::default());
        let mut counted = Counted::new(stream, Some(counters.clone()));
        peer.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 64];
        let n = counted.read(&mut buf).await.unwrap();
        counted.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        let mut back = [0u8; 19];
        peer.read_exact(&mut back).await.unwrap();
        assert_eq!(n, 18);
        assert_eq!(counters.bytes(), (18, 19));
    }
}
