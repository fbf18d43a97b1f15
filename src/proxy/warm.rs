//! Warming a spare: a warm copy gets a few `GET /` from the load balancer
//! once, when a table first names its process as warm, so the R code behind
//! its page has run (and R's byte-code compiler has compiled it) before a
//! visitor fails over to it. Measured with the hello app under load: the
//! readiness probe is a copy's first request, its second took 100–160 ms
//! where the ones after took 40–80 ms, and that second request was a
//! failover's worst. Active copies are not warmed: they have visitors, and
//! a woken copy's first visitor must not wait behind a warm-up.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::table::Table;
use crate::model::Role;

/// Requests a spare gets: its second request is the slow one, a third
/// covers code that compiles on its second run.
const REQUESTS: usize = 3;
/// How long one warm-up request may take before the warm-up gives up.
const WAIT: Duration = Duration::from_secs(10);

/// Warms each warm copy of `table` not warmed yet.
pub fn warm(table: &Table) {
    for app in table.apps.iter().filter(|a| !a.asleep && !a.stopped) {
        for c in app.copies.iter().filter(|c| c.role == Role::Warm && c.pid != 0) {
            if !c.state.warmed.swap(true, Ordering::Relaxed) {
                tokio::spawn(run(app.name.clone(), c.copy, c.port));
            }
        }
    }
}

/// Sends the warm-up requests one after the other; stops at the first that
/// gets no answer (the copy is going, or busy: it is not ours to push).
async fn run(app: String, copy: u32, port: u16) {
    let started = std::time::Instant::now();
    for _ in 0..REQUESTS {
        if !matches!(tokio::time::timeout(WAIT, get(port)).await, Ok(true)) {
            tracing::debug!(app, copy, port, "warm-up of copy {copy} stopped: no answer");
            return;
        }
    }
    tracing::debug!(app, copy, port, "copy {copy} warmed in {:?}", started.elapsed());
}

/// True once `GET /` on the copy's port got a whole answer (read to the
/// end of the connection, HTTP/1.0 without keep-alive, and dropped).
async fn get(port: u16) -> bool {
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        s.write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\nUser-Agent: shinyctl-warm\r\n\r\n").await.ok()?;
        let mut buf = [0u8; 16 * 1024];
        let mut head = Vec::with_capacity(5);
        loop {
            let n = s.read(&mut buf).await.ok()?;
            if n == 0 {
                break;
            }
            let want = 5 - head.len();
            head.extend_from_slice(&buf[..n.min(want)]);
        }
        Some(head == b"HTTP/")
    };
    attempt.await.unwrap_or(false)
}
