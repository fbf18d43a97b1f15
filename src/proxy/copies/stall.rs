//! A stalled copy: its kernel still accepts connections, but the R process
//! does not answer (a long computation, SIGSTOP, a deadlock), so only the
//! time to a first byte shows it. After `copy_state::STALL_AFTER_MS` without an
//! answer while a request waits, it gets no new visitors (`balance.rs`)
//! and one probe at a time asks it for a page until it answers; then it
//! gets visitors again.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::proxy::copies::copy_state::CopyState;
use crate::proxy::error_source::ErrorSource;
use crate::sys::clock::mono_ms;

/// How long one probe waits for the copy's answer before asking again on
/// a new connection.
const PROBE_WAIT: Duration = Duration::from_secs(30);
/// Between probes that failed at once (a refused connection).
const PROBE_PAUSE: Duration = Duration::from_secs(1);

/// Starts the probe of a copy seen stalled, unless one runs.
pub fn probe(state: &Arc<CopyState>, port: u16) {
    if state.probing.swap(true, Ordering::Relaxed) {
        return;
    }
    tracing::warn!(source = %ErrorSource::Upstream, port, "the copy on port {port} has not answered for {}s; it gets no new visitors until it does",
        state.silent_ms(mono_ms()) / 1000);
    tokio::spawn(run(Arc::downgrade(state), port));
}

/// Asks the copy for `/` until it answers, it is no longer stalled, or it
/// left the table (its state is gone).
async fn run(state: Weak<CopyState>, port: u16) {
    loop {
        let answered = matches!(tokio::time::timeout(PROBE_WAIT, answers(port)).await, Ok(true));
        let Some(s) = state.upgrade() else { return };
        if answered {
            s.heard(mono_ms(), s.pending.load(Ordering::Relaxed));
            tracing::info!(source = %ErrorSource::Upstream, port, "the copy on port {port} answers again");
        }
        if answered || s.silent_ms(mono_ms()) == 0 {
            s.probing.store(false, Ordering::Relaxed);
            return;
        }
        drop(s);
        tokio::time::sleep(PROBE_PAUSE).await;
    }
}

/// True once the copy on `port` sends the start of an HTTP answer to a
/// plain request for `/`.
async fn answers(port: u16) -> bool {
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        s.write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\nUser-Agent: shinyctl-probe\r\n\r\n").await.ok()?;
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).await.ok()?;
        Some(&buf == b"HTTP/")
    };
    attempt.await.unwrap_or(false)
}
